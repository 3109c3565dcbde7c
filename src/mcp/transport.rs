//! The stdio transport of the MCP server: newline-delimited JSON-RPC 2.0, every message answered.
//!
//! `rmcp`'s own stdio transport drops a line that is not JSON and a line over its length limit
//! without a word, and answers a JSON line of the wrong shape with an error whose id is `null`; a
//! client that sent a request that way waits forever. Here a reader thread takes stdin line by
//! line (at most [`MAX_LINE`] bytes buffered) and judges each line with `present::jsonrpc`: what is
//! not JSON is answered `-32700`, what is too deep, too long or not a JSON-RPC 2.0 message
//! `-32600`, with the message's id when it can be read. Writes go through `rmcp`'s non-blocking
//! pipe writer, never the blocking pool the analyses run on.

use std::io::BufRead;
use std::sync::Arc;

use rmcp::RoleServer;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::{StdioWriter, Transport};
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::sync::{Mutex, mpsc};

use crate::present::jsonrpc::{self, INVALID_REQUEST, Rejected};

/// Longest line taken (rmcp's own default); a longer one is answered `-32600` and skipped.
pub const MAX_LINE: usize = 16 << 20;

/// What the reader thread hands over: a message for the server, or an answer to write.
type Line = Result<ClientJsonRpcMessage, Rejected>;

pub struct Stdio {
    rx: mpsc::Receiver<Line>,
    out: Arc<Mutex<StdioWriter>>,
}

impl Stdio {
    /// Read `input` on a thread of its own; write to `out`.
    pub fn new(input: impl BufRead + Send + 'static, out: StdioWriter) -> Stdio {
        let (tx, rx) = mpsc::channel(16);
        std::thread::spawn(move || read_lines(input, MAX_LINE, &tx));
        Stdio {
            rx,
            out: Arc::new(Mutex::new(out)),
        }
    }
}

async fn write_line(
    out: &Mutex<StdioWriter>,
    value: &impl serde::Serialize,
) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    line.push(b'\n');
    let mut w = out.lock().await;
    w.write_all(&line).await?;
    w.flush().await
}

impl Transport<RoleServer> for Stdio {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: ServerJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let out = self.out.clone();
        async move { write_line(&out, &item).await }
    }

    async fn receive(&mut self) -> Option<ClientJsonRpcMessage> {
        loop {
            match self.rx.recv().await? {
                Ok(msg) => return Some(msg),
                Err(rejected) => write_line(&self.out, &rejected.response()).await.ok()?,
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.rx.close();
        Ok(())
    }
}

/// Hand every line of `input` to `tx`, judged, until the input ends or nobody listens.
fn read_lines(mut input: impl BufRead, max: usize, tx: &mpsc::Sender<Line>) {
    loop {
        let mut line = Vec::new();
        let mut len: u64 = 0;
        let mut over = false;
        // Read to the newline; past `max`, keep the start (for the id) and count the rest.
        loop {
            let buf = match input.fill_buf() {
                Ok(b) => b,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => return,
            };
            if buf.is_empty() {
                if len == 0 {
                    return;
                }
                // The last line, without its newline.
                break;
            }
            let (take, done) = match buf.iter().position(|&b| b == b'\n') {
                Some(i) => (i + 1, true),
                None => (buf.len(), false),
            };
            len += take as u64;
            if !over && line.len() + take > max {
                over = true;
                line.truncate(jsonrpc::ID_SCAN);
            }
            let room = if over {
                jsonrpc::ID_SCAN.saturating_sub(line.len())
            } else {
                take
            };
            line.extend_from_slice(&buf[..take.min(room)]);
            input.consume(take);
            if done {
                break;
            }
        }
        let item = if over {
            Some(Err(jsonrpc::too_large(&line, len, max as u64)))
        } else {
            judge_line(&line)
        };
        if let Some(item) = item
            && tx.blocking_send(item).is_err()
        {
            return;
        }
    }
}

/// A line's message, its answer, or nothing (a blank line; a notification rmcp does not know,
/// which JSON-RPC never answers).
fn judge_line(line: &[u8]) -> Option<Line> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
    if line.iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    let value = match jsonrpc::judge(line) {
        Ok(v) => v,
        Err(r) => return Some(Err(r)),
    };
    let id = value.get("id").cloned();
    match serde_json::from_value::<ClientJsonRpcMessage>(value) {
        Ok(msg) => Some(Ok(msg)),
        Err(_) if id.is_none() => None,
        Err(e) => Some(Err(Rejected {
            code: INVALID_REQUEST,
            id: id.unwrap_or(Value::Null),
            message: format!("invalid request: {e}"),
        })),
    }
}

/// The bytes a reader thread would hand over for `input` (tests).
#[cfg(test)]
fn judged(input: &[u8], max: usize) -> Vec<Result<String, Value>> {
    let (tx, mut rx) = mpsc::channel(64);
    read_lines(input, max, &tx);
    drop(tx);
    let mut out = Vec::new();
    while let Ok(item) = rx.try_recv() {
        out.push(match item {
            Ok(m) => Ok(serde_json::to_string(&m).unwrap()),
            Err(r) => Err(r.response()),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::judged;
    use serde_json::json;

    #[test]
    fn every_line_is_passed_on_or_answered() {
        let deep = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"ping\",\"params\":{}{}}}\n",
            "[".repeat(300),
            "]".repeat(300)
        );
        let long = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":\"big\",\"method\":\"ping\",\"params\":{{\"x\":\"{}\"}}}}\n",
            "a".repeat(5000)
        );
        let input = [
            "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n",
            "\n",
            "{ not json\n",
            "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\",\"par\n",
            &deep,
            &long,
            "[1,2]\r\n",
            "{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"ping\"}",
        ]
        .concat();
        let out = judged(input.as_bytes(), 4096);
        let codes: Vec<(i64, serde_json::Value)> = out
            .iter()
            .filter_map(|r| r.as_ref().err())
            .map(|e| (e["error"]["code"].as_i64().unwrap(), e["id"].clone()))
            .collect();
        assert_eq!(
            codes,
            vec![
                (-32700, json!(null)),
                (-32700, json!(2)),
                (-32600, json!(9)),
                (-32600, json!("big")),
                (-32600, json!(null)),
            ]
        );
        assert_eq!(out.iter().filter(|r| r.is_ok()).count(), 2, "{out:?}");
    }
}
