//! Keeps one malformed client message from ending the session.
//!
//! `tower-lsp-server` reads stdin through a `FramedRead`, which stops for good after the first
//! frame it cannot decode: one stray non-JSON body left the server running but deaf. This filter
//! sits in front of it, re-frames every message and replaces a body that is not a JSON-RPC message
//! with a harmless one: a request (it had an id) becomes the unknown method `memlsp/invalidRequest`, so the client
//! still gets an error answer for that id; anything else becomes an ignored notification. Header
//! lines and body sizes are bounded, so a hostile `Content-Length` allocates nothing.

use std::io::{BufRead, Read};
use std::pin::Pin;
use std::task::{Context, Poll};

use serde_json::{Value, json};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::mpsc;

/// Bodies above this are skipped without being buffered.
const MAX_BODY: u64 = 64 << 20;
/// Longest header line kept.
const MAX_HEADER_LINE: u64 = 8 << 10;

/// Stdin's framed messages, sanitised, as an async reader (a thread does the blocking reads).
pub fn stdin() -> Filtered {
    let (tx, rx) = mpsc::channel(16);
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        pump(stdin.lock(), &tx);
        // Dropping `tx` ends the stream: the server sees EOF.
    });
    Filtered {
        rx,
        buf: Vec::new(),
        pos: 0,
    }
}

/// Re-frame `input` into `tx` until it ends or the receiver is gone.
fn pump(mut r: impl BufRead, tx: &mpsc::Sender<Vec<u8>>) {
    loop {
        let mut len: Option<u64> = None;
        let mut headers = 0usize;
        loop {
            let mut line = Vec::new();
            match (&mut r).take(MAX_HEADER_LINE).read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let text = String::from_utf8_lossy(&line);
            let text = text.trim();
            if text.is_empty() {
                if headers > 0 {
                    break;
                }
                continue;
            }
            headers += 1;
            if let Some((k, v)) = text.split_once(':') {
                if k.trim().eq_ignore_ascii_case("content-length") {
                    len = v.trim().parse().ok();
                }
            }
        }
        let Some(n) = len else { continue };
        let body = if n > MAX_BODY {
            match std::io::copy(&mut (&mut r).take(n), &mut std::io::sink()) {
                Ok(s) if s == n => ignored(),
                _ => return,
            }
        } else {
            let mut body = vec![0u8; n as usize];
            if r.read_exact(&mut body).is_err() {
                return;
            }
            sanitize(body)
        };
        let mut framed = format!("Content-Length: {}\r\n\r\n", body.len()).into_bytes();
        framed.extend_from_slice(&body);
        if tx.blocking_send(framed).is_err() {
            return;
        }
    }
}

/// The reader handed to the server.
pub struct Filtered {
    rx: mpsc::Receiver<Vec<u8>>,
    buf: Vec<u8>,
    pos: usize,
}

impl AsyncRead for Filtered {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        loop {
            if self.pos < self.buf.len() {
                let n = out.remaining().min(self.buf.len() - self.pos);
                let pos = self.pos;
                out.put_slice(&self.buf[pos..pos + n]);
                self.pos += n;
                return Poll::Ready(Ok(()));
            }
            match self.rx.poll_recv(cx) {
                Poll::Ready(Some(b)) => {
                    self.buf = b;
                    self.pos = 0;
                }
                Poll::Ready(None) => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

fn ignored() -> Vec<u8> {
    br#"{"jsonrpc":"2.0","method":"$/memlsp/ignoredMessage"}"#.to_vec()
}

/// The body unchanged if it is a JSON-RPC 2.0 request, notification or response.
fn sanitize(body: Vec<u8>) -> Vec<u8> {
    let Ok(Value::Object(m)) = serde_json::from_slice::<Value>(&body) else {
        return ignored();
    };
    let id_ok = |v: Option<&Value>| {
        matches!(
            v,
            None | Some(Value::Null | Value::String(_) | Value::Number(_))
        )
    };
    let valid = m.get("jsonrpc").and_then(Value::as_str) == Some("2.0")
        && id_ok(m.get("id"))
        && (m.get("method").is_some_and(Value::is_string)
            || (m.contains_key("id") && (m.contains_key("result") || m.contains_key("error"))));
    if valid {
        return body;
    }
    match m.get("id") {
        Some(id @ (Value::String(_) | Value::Number(_))) if !m.contains_key("result") => {
            json!({"jsonrpc": "2.0", "id": id, "method": "memlsp/invalidRequest"})
                .to_string()
                .into_bytes()
        }
        _ => ignored(),
    }
}

#[cfg(test)]
mod tests {
    use super::{pump, sanitize};

    #[test]
    fn only_json_rpc_messages_pass() {
        let ok = br#"{"jsonrpc":"2.0","id":1,"method":"x","params":{}}"#.to_vec();
        assert_eq!(sanitize(ok.clone()), ok);
        let resp = br#"{"jsonrpc":"2.0","id":1,"result":null}"#.to_vec();
        assert_eq!(sanitize(resp.clone()), resp);
        for bad in [
            &b"{ not json"[..],
            b"[1,2]",
            b"{\"jsonrpc\":\"2.0\",\"id\":{},\"method\":\"x\"}",
        ] {
            let out = String::from_utf8(sanitize(bad.to_vec())).unwrap();
            assert!(out.contains("memlsp/"), "{out}");
        }
        // Anything that carries an id gets an error answer for that id.
        for (bad, id) in [(&br#"{"id": 7, "method": 5}"#[..], 7), (br#"{"id": 3}"#, 3)] {
            let out = String::from_utf8(sanitize(bad.to_vec())).unwrap();
            assert!(
                out.contains(&format!("\"id\":{id}")) && out.contains("invalidRequest"),
                "{out}"
            );
        }
    }

    #[test]
    fn framing_survives_garbage_headers_and_huge_lengths() {
        let input = b"garbage line\r\n\r\nContent-Length: 2\r\n\r\n{}Content-Length: 99999999999\r\n\r\nshort";
        let (tx, mut rx) = tokio::sync::mpsc::channel(16);
        pump(&input[..], &tx);
        drop(tx);
        let first = String::from_utf8(rx.try_recv().unwrap()).unwrap();
        assert!(first.contains("$/memlsp/ignoredMessage"), "{first}");
        assert!(
            rx.try_recv().is_err(),
            "a huge body is skipped unread; here it ends the stream"
        );
    }
}
