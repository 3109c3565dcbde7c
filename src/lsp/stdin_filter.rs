//! Keeps one malformed client message from ending the session, and answers it.
//!
//! `tower-lsp-server` reads stdin through a `FramedRead`, which stops for good after the first
//! frame it cannot decode: one stray non-JSON body left the server running but deaf. This filter
//! sits in front of it, re-frames every message and replaces a body that is not a JSON-RPC 2.0
//! message (judged by `present::jsonrpc`) with a request for one of the server's own methods,
//! `memlsp/parseError` (not JSON: `-32700`) or `memlsp/invalidRequest` (too deep, too large, not
//! a JSON-RPC message: `-32600`), carrying the message's id when it can be read (else `null`) and
//! the reason; the server answers it with that error, as JSON-RPC 2.0 says. Header lines and body
//! sizes are bounded, so a hostile `Content-Length` allocates nothing: an oversized body is
//! skipped after its first 64 KiB were looked at for its id.

use std::io::{BufRead, Read};
use std::pin::Pin;
use std::task::{Context, Poll};

use serde_json::json;

use crate::present::jsonrpc::{self, PARSE_ERROR, Rejected};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::mpsc;
use tower_lsp_server::jsonrpc::{Error as RpcError, ErrorCode, Result as RpcResult};

/// Bodies above this are skipped without being buffered (answered `-32600`).
pub const MAX_BODY: u64 = 64 << 20;
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
fn pump(r: impl BufRead, tx: &mpsc::Sender<Vec<u8>>) {
    pump_max(r, tx, MAX_BODY);
}

/// [`pump`] with bodies over `max` bytes skipped and answered.
fn pump_max(mut r: impl BufRead, tx: &mpsc::Sender<Vec<u8>>, max: u64) {
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
        let body = if n > max {
            let mut head = Vec::new();
            let scan = (jsonrpc::ID_SCAN as u64).min(n);
            if (&mut r).take(scan).read_to_end(&mut head).is_err() || head.len() as u64 != scan {
                return;
            }
            match std::io::copy(&mut (&mut r).take(n - scan), &mut std::io::sink()) {
                Ok(s) if s == n - scan => answer(&jsonrpc::too_large(&head, n, max)),
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

/// The body unchanged if it is a JSON-RPC 2.0 request, notification or response; else a request
/// the server answers with the error JSON-RPC 2.0 asks for.
fn sanitize(body: Vec<u8>) -> Vec<u8> {
    match jsonrpc::judge(&body) {
        Ok(_) => body,
        Err(rejected) => answer(&rejected),
    }
}

/// The request for the server's own method that answers `r` (`server.rs`).
fn answer(r: &Rejected) -> Vec<u8> {
    let method = if r.code == PARSE_ERROR {
        PARSE_ERROR_METHOD
    } else {
        INVALID_REQUEST_METHOD
    };
    json!({"jsonrpc": "2.0", "id": r.id, "method": method, "params": {"message": r.message}})
        .to_string()
        .into_bytes()
}

/// The answers to the requests [`answer`] makes (registered in `run_stdio`).
impl super::server::Backend {
    pub(super) async fn parse_error(&self, params: serde_json::Value) -> RpcResult<()> {
        Err(rpc_error(ErrorCode::ParseError, &params))
    }

    pub(super) async fn invalid_request(&self, params: serde_json::Value) -> RpcResult<()> {
        Err(rpc_error(ErrorCode::InvalidRequest, &params))
    }
}

fn rpc_error(code: ErrorCode, params: &serde_json::Value) -> RpcError {
    RpcError {
        code,
        message: params["message"]
            .as_str()
            .unwrap_or("invalid request")
            .to_string()
            .into(),
        data: None,
    }
}

/// The method a body that is not JSON becomes; answered `-32700`.
pub const PARSE_ERROR_METHOD: &str = "memlsp/parseError";
/// The method a too-deep, too-large or not-JSON-RPC body becomes; answered `-32600`.
pub const INVALID_REQUEST_METHOD: &str = "memlsp/invalidRequest";

#[cfg(test)]
mod tests {
    use super::{pump, pump_max, sanitize};

    #[test]
    fn only_json_rpc_messages_pass_the_rest_become_answered_requests() {
        let ok = br#"{"jsonrpc":"2.0","id":1,"method":"x","params":{}}"#.to_vec();
        assert_eq!(sanitize(ok.clone()), ok);
        let resp = br#"{"jsonrpc":"2.0","id":1,"result":null}"#.to_vec();
        assert_eq!(sanitize(resp.clone()), resp);
        for (bad, method, id) in [
            (&b"{ not json"[..], "memlsp/parseError", "null"),
            (
                br#"{"id": 4, "method": "x", "par"#,
                "memlsp/parseError",
                "4",
            ),
            (b"[1,2]", "memlsp/invalidRequest", "null"),
            (br#"{"id": 7, "method": 5}"#, "memlsp/invalidRequest", "7"),
            (br#"{"id": 3}"#, "memlsp/invalidRequest", "3"),
        ] {
            let out = String::from_utf8(sanitize(bad.to_vec())).unwrap();
            assert!(
                out.contains(&format!("\"id\":{id}")) && out.contains(method),
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
        assert!(first.contains("memlsp/invalidRequest"), "{first}");
        assert!(
            rx.try_recv().is_err(),
            "a huge body is skipped unread; here it ends the stream"
        );
    }

    #[test]
    fn an_oversized_body_is_answered_with_its_id() {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":77,"method":"x","params":"{}"}}"#,
            "a".repeat(100_000)
        );
        let mut input = format!("Content-Length: {}\r\n\r\n", body.len()).into_bytes();
        input.extend_from_slice(body.as_bytes());
        let (tx, mut rx) = tokio::sync::mpsc::channel(16);
        pump_max(&input[..], &tx, 1000);
        drop(tx);
        let first = String::from_utf8(rx.try_recv().unwrap()).unwrap();
        assert!(
            first.contains("\"id\":77") && first.contains("over the limit"),
            "{first}"
        );
    }
}
