//! Both servers answer a message they cannot take, as JSON-RPC 2.0 says (issue 31, item 6): not
//! JSON → `-32700`; nested too deep, too large, or not a JSON-RPC message → `-32600`; with the
//! message's id when it can be read, `null` otherwise; and they keep serving. Transcripts against
//! the real binary: `memlsp lsp` (Content-Length framing) and `memlsp mcp` (one message a line).

mod lsp_support;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

use serde_json::{Value, json};

/// A request nested `levels` deep in its params.
fn deep(id: u64, levels: usize) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"ping","params":{{"x":{}{}}}}}"#,
        "[".repeat(levels),
        "]".repeat(levels)
    )
}

fn code_and_id(msg: &Value) -> (i64, Value) {
    (
        msg["error"]["code"].as_i64().unwrap_or(0),
        msg["id"].clone(),
    )
}

#[test]
fn the_language_server_answers_what_it_cannot_parse() {
    let (_tmp, ws) = lsp_support::tempdir();
    let mut lsp = lsp_support::Lsp::start(&ws, json!({}));
    let wait = Duration::from_secs(10);
    // Not JSON, its id readable: -32700 with that id.
    lsp.send_raw(br#"{"jsonrpc":"2.0","id":501,"method":"textDocument/hover","params":{"#);
    let r = lsp
        .response(json!(501), wait)
        .expect("no answer to a cut message");
    assert_eq!(code_and_id(&r), (-32700, json!(501)), "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("parse error: the message is not JSON"),
        "{r}"
    );
    // Not JSON, no id to read: -32700 with id null.
    lsp.send_raw(b"\x00\x01 garbage");
    let r = lsp
        .response(Value::Null, wait)
        .expect("no answer to garbage");
    assert_eq!(code_and_id(&r).0, -32700, "{r}");
    // Too deep: -32600 with the id.
    lsp.send_raw(deep(502, 1000).as_bytes());
    let r = lsp
        .response(json!(502), wait)
        .expect("no answer to a deep message");
    assert_eq!(code_and_id(&r), (-32600, json!(502)), "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("deeper than 128"),
        "{r}"
    );
    // Not a JSON-RPC message: -32600 with the id.
    lsp.send_raw(br#"{"id": "s-503", "method": 12}"#);
    let r = lsp
        .response(json!("s-503"), wait)
        .expect("no answer to a bad shape");
    assert_eq!(code_and_id(&r), (-32600, json!("s-503")), "{r}");
    // Over the 64 MiB limit: skipped unread, -32600 with the id of its start.
    let mut big =
        br#"{"jsonrpc":"2.0","id":504,"method":"textDocument/hover","params":{"x":""#.to_vec();
    big.resize((64 << 20) + 100, b'a');
    big.extend_from_slice(br#""}}"#);
    lsp.send_raw(&big);
    drop(big);
    let r = lsp
        .response(json!(504), Duration::from_secs(60))
        .expect("no answer to a huge message");
    assert_eq!(code_and_id(&r), (-32600, json!(504)), "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("over the limit"),
        "{r}"
    );
    // Still serving.
    let r = lsp.request_full("memlsp/noSuchMethod", json!({}));
    assert!(r.is_some_and(|r| r["error"]["code"] == -32601));
    lsp.shutdown();
}

struct Mcp {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    lines: Receiver<String>,
}

impl Mcp {
    fn start() -> Mcp {
        let tmp = std::env::temp_dir();
        let mut child = Command::new(env!("CARGO_BIN_EXE_memlsp"))
            .arg("mcp")
            .current_dir(tmp)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn memlsp mcp");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Mcp {
            child,
            stdin,
            lines,
        }
    }

    fn raw(&mut self, line: &[u8]) {
        self.stdin.write_all(line).unwrap();
        self.stdin.write_all(b"\n").unwrap();
        self.stdin.flush().unwrap();
    }

    /// The next message whose id is `id`.
    fn answer(&mut self, id: Value) -> Value {
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|e| panic!("no answer for id {id} ({e})"));
            let msg: Value = serde_json::from_str(&line).expect("stdout line is JSON");
            if msg.get("method").is_none() && msg["id"] == id {
                return msg;
            }
        }
    }
}

impl Drop for Mcp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn the_mcp_server_answers_what_it_cannot_parse() {
    let mut mcp = Mcp::start();
    mcp.raw(
        br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}"#,
    );
    assert!(mcp.answer(json!(1))["result"].is_object());
    mcp.raw(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    // Not JSON, its id readable.
    mcp.raw(br#"{"jsonrpc":"2.0","id":601,"method":"tools/call","params":{"name":"#);
    let r = mcp.answer(json!(601));
    assert_eq!(code_and_id(&r), (-32700, json!(601)), "{r}");
    // Not JSON at all: id null.
    mcp.raw(b"this is not json");
    let r = mcp.answer(Value::Null);
    assert_eq!(code_and_id(&r).0, -32700, "{r}");
    // Too deep.
    mcp.raw(deep(602, 1000).as_bytes());
    let r = mcp.answer(json!(602));
    assert_eq!(code_and_id(&r), (-32600, json!(602)), "{r}");
    // Not a JSON-RPC message (a batch; a request without jsonrpc).
    mcp.raw(br#"[{"jsonrpc":"2.0","id":603,"method":"ping"}]"#);
    let r = mcp.answer(Value::Null);
    assert_eq!(code_and_id(&r).0, -32600, "{r}");
    mcp.raw(br#"{"id":"s-604","method":"ping"}"#);
    let r = mcp.answer(json!("s-604"));
    assert_eq!(code_and_id(&r), (-32600, json!("s-604")), "{r}");
    // Over the 16 MiB line limit.
    let mut big = br#"{"jsonrpc":"2.0","id":605,"method":"ping","params":{"x":""#.to_vec();
    big.resize((16 << 20) + 100, b'a');
    big.extend_from_slice(br#""}}"#);
    mcp.raw(&big);
    drop(big);
    let r = mcp.answer(json!(605));
    assert_eq!(code_and_id(&r), (-32600, json!(605)), "{r}");
    // Still serving.
    mcp.raw(br#"{"jsonrpc":"2.0","id":606,"method":"ping"}"#);
    let r = mcp.answer(json!(606));
    assert!(r.get("result").is_some(), "{r}");
}
