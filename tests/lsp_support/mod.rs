//! A small LSP client for transcript tests: spawns the real `memlsp` binary and speaks JSON-RPC
//! with Content-Length framing over its stdin/stdout.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

#[path = "../support/shared.rs"]
mod shared_data;
#[allow(unused_imports)]
pub use shared_data::{required, shared, shared_dir, skip};

pub struct Lsp {
    child: Child,
    stdin: ChildStdin,
    rx: mpsc::Receiver<Value>,
    next_id: i64,
    /// Every notification and server request seen, in order.
    pub seen: Vec<Value>,
    /// Answer to `workspace/configuration`.
    pub settings: Value,
}

pub fn uri(p: &Path) -> String {
    format!("file://{}", p.display())
}

/// Client capabilities like Neovim 0.11's, minus UTF-8 (so positions are UTF-16).
pub fn client_caps() -> Value {
    json!({
        "general": {"positionEncodings": ["utf-16"]},
        "window": {"workDoneProgress": true},
        "workspace": {
            "configuration": true,
            "inlayHint": {"refreshSupport": true},
            "didChangeWatchedFiles": {"dynamicRegistration": false}
        },
        "textDocument": {
            "publishDiagnostics": {"relatedInformation": true, "dataSupport": true},
            "codeAction": {"disabledSupport": true, "dataSupport": true},
            "diagnostic": {"dynamicRegistration": false}
        }
    })
}

impl Lsp {
    /// Start the server on `root` and complete the `initialize` handshake.
    pub fn start(root: &Path, settings: Value) -> Lsp {
        Lsp::start_full(root, settings, client_caps(), &[])
    }

    /// `start` with the given client capabilities.
    pub fn start_with(root: &Path, settings: Value, caps: Value) -> Lsp {
        Lsp::start_full(root, settings, caps, &[])
    }

    /// [`Lsp::start`] with extra environment variables for the server process.
    pub fn start_with_env(root: &Path, settings: Value, env: &[(&str, &str)]) -> Lsp {
        Lsp::start_full(root, settings, client_caps(), env)
    }

    /// Start with client capabilities and extra environment variables.
    pub fn start_full(root: &Path, settings: Value, caps: Value, env: &[(&str, &str)]) -> Lsp {
        let mut child = Command::new(env!("CARGO_BIN_EXE_memlsp"))
            .arg("lsp")
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn memlsp");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            loop {
                let mut len = None;
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let line = line.trim_end();
                    if line.is_empty() {
                        break;
                    }
                    if let Some(v) = line.strip_prefix("Content-Length: ") {
                        len = v.parse::<usize>().ok();
                    }
                }
                let Some(n) = len else { return };
                let mut buf = vec![0; n];
                if r.read_exact(&mut buf).is_err() {
                    return;
                }
                match serde_json::from_slice::<Value>(&buf) {
                    Ok(v) => {
                        if tx.send(v).is_err() {
                            return;
                        }
                    }
                    Err(e) => panic!("server wrote invalid JSON on stdout: {e}"),
                }
            }
        });
        let mut lsp = Lsp {
            child,
            stdin,
            rx,
            next_id: 1,
            seen: Vec::new(),
            settings,
        };
        let init = lsp.request(
            "initialize",
            json!({
                "processId": null,
                "rootUri": uri(root),
                "workspaceFolders": [{"uri": uri(root), "name": "ws"}],
                "capabilities": caps,
            }),
        );
        assert!(init.get("capabilities").is_some(), "initialize: {init}");
        lsp.notify("initialized", json!({}));
        lsp
    }

    fn write(&mut self, msg: &Value) {
        let body = msg.to_string();
        let _ = write!(self.stdin, "Content-Length: {}\r\n\r\n{}", body.len(), body);
        let _ = self.stdin.flush();
    }

    /// Send raw bytes as one framed message body (for malformed-input tests).
    pub fn send_raw(&mut self, body: &[u8]) {
        let _ = write!(self.stdin, "Content-Length: {}\r\n\r\n", body.len());
        let _ = self.stdin.write_all(body);
        let _ = self.stdin.flush();
    }

    /// Send a request and return the whole response message (`result` or `error`), or `None`
    /// after 10 s.
    pub fn request_full(&mut self, method: &str, params: Value) -> Option<Value> {
        let id = self.next_id;
        self.next_id += 1;
        self.write(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        self.response(json!(id), Duration::from_secs(10))
    }

    /// Wait for the response with this `id` (which may be any JSON value, even null).
    pub fn response(&mut self, id: Value, timeout: Duration) -> Option<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            let msg = self.pump(left)?;
            if msg.get("method").is_none() && msg.get("id") == Some(&id) {
                return Some(msg);
            }
        }
    }

    /// Whether the server process is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn notify(&mut self, method: &str, params: Value) {
        self.write(&json!({"jsonrpc": "2.0", "method": method, "params": params}));
    }

    /// Answer a request the server sent us.
    fn answer(&mut self, msg: &Value) {
        let Some(id) = msg.get("id").cloned() else {
            return;
        };
        let method = msg["method"].as_str().unwrap_or("");
        let result = match method {
            "workspace/configuration" => {
                let n = msg["params"]["items"].as_array().map_or(1, |a| a.len());
                Value::Array(vec![self.settings.clone(); n])
            }
            _ => Value::Null,
        };
        self.write(&json!({"jsonrpc": "2.0", "id": id, "result": result}));
    }

    /// Take one message (answering server requests), or `None` after `timeout`.
    fn pump(&mut self, timeout: Duration) -> Option<Value> {
        let msg = self.rx.recv_timeout(timeout).ok()?;
        if msg.get("method").is_some() {
            if msg.get("id").is_some() {
                self.answer(&msg);
            }
            self.seen.push(msg.clone());
        }
        Some(msg)
    }

    /// Send a request and wait (up to 10 s) for its response's `result`.
    pub fn request(&mut self, method: &str, params: Value) -> Value {
        self.request_timed(method, params).0
    }

    /// Like `request`, also returning how long the answer took.
    pub fn request_timed(&mut self, method: &str, params: Value) -> (Value, Duration) {
        let id = self.next_id;
        self.next_id += 1;
        let t0 = Instant::now();
        self.write(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let deadline = t0 + Duration::from_secs(10);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let msg = self
                .pump(left)
                .unwrap_or_else(|| panic!("no answer to {method} within 10 s"));
            if msg.get("method").is_none() && msg.get("id") == Some(&json!(id)) {
                if let Some(e) = msg.get("error") {
                    panic!("{method} failed: {e}");
                }
                return (msg["result"].clone(), t0.elapsed());
            }
        }
    }

    /// Wait until a notification satisfying `pred` arrives (or was already seen since `from`).
    pub fn wait_for(
        &mut self,
        from: usize,
        timeout: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Option<Value> {
        if let Some(v) = self.seen[from.min(self.seen.len())..]
            .iter()
            .find(|m| pred(m))
        {
            return Some(v.clone());
        }
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            let msg = self.pump(left)?;
            if msg.get("method").is_some() && pred(&msg) {
                return Some(msg);
            }
        }
    }

    /// The diagnostics of the newest `publishDiagnostics` for `file` satisfying `pred`.
    pub fn diagnostics(
        &mut self,
        file: &Path,
        timeout: Duration,
        pred: impl Fn(&[Value]) -> bool,
    ) -> Option<Vec<Value>> {
        let u = uri(file);
        let is = |m: &Value| {
            m["method"] == "textDocument/publishDiagnostics" && m["params"]["uri"] == u.as_str()
        };
        // The latest publication so far decides, if it already satisfies `pred`.
        if let Some(last) = self.seen.iter().rev().find(|m| is(m)) {
            let d = last["params"]["diagnostics"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            if pred(&d) {
                return Some(d);
            }
        }
        let from = self.seen.len();
        let m = self.wait_for(from, timeout, |m| {
            is(m) && pred(m["params"]["diagnostics"].as_array().map_or(&[][..], |a| a))
        })?;
        m["params"]["diagnostics"].as_array().cloned()
    }

    /// Drain messages for `d` (keeps `seen` current).
    pub fn idle(&mut self, d: Duration) {
        let deadline = Instant::now() + d;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            if self.pump(left).is_none() {
                break;
            }
        }
    }

    /// Inlay hints for lines 0..`lines` of `file`.
    pub fn hints(&mut self, file: &Path, lines: u32) -> Vec<Value> {
        self.request(
            "textDocument/inlayHint",
            json!({"textDocument": {"uri": uri(file)},
                   "range": {"start": {"line": 0, "character": 0}, "end": {"line": lines, "character": 0}}}),
        )
        .as_array()
        .cloned()
        .unwrap_or_default()
    }

    /// Poll inlay hints until `pred` holds or 20 s pass (hints have no push channel; the server
    /// only asks the client to refresh).
    pub fn hints_until(
        &mut self,
        file: &Path,
        lines: u32,
        pred: impl Fn(&[Value]) -> bool,
    ) -> Vec<Value> {
        let t0 = Instant::now();
        loop {
            let h = self.hints(file, lines);
            if pred(&h) || t0.elapsed() > Duration::from_secs(20) {
                return h;
            }
            self.idle(Duration::from_millis(100));
        }
    }

    pub fn open(&mut self, file: &Path) -> String {
        let text = std::fs::read_to_string(file).expect("read file");
        self.notify(
            "textDocument/didOpen",
            json!({"textDocument": {"uri": uri(file), "languageId": "python", "version": 1, "text": text}}),
        );
        text
    }

    /// `window/showMessage` and `window/logMessage` of type Error (1) seen so far.
    pub fn errors(&self) -> Vec<String> {
        self.seen
            .iter()
            .filter(|m| {
                (m["method"] == "window/showMessage" || m["method"] == "window/logMessage")
                    && m["params"]["type"] == 1
            })
            .map(|m| m["params"]["message"].as_str().unwrap_or("").to_string())
            .collect()
    }

    /// All showMessage / logMessage texts seen so far.
    pub fn messages(&self) -> Vec<String> {
        self.seen
            .iter()
            .filter(|m| m["method"] == "window/showMessage" || m["method"] == "window/logMessage")
            .map(|m| m["params"]["message"].as_str().unwrap_or("").to_string())
            .collect()
    }

    pub fn shutdown(mut self) {
        self.request("shutdown", Value::Null);
        self.notify("exit", Value::Null);
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(3) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("server did not exit within 3 s of `exit`");
    }
}

impl Drop for Lsp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Apply LSP `TextEdit`s (UTF-16 positions, single file) to `text`.
pub fn apply_edits(text: &str, edits: &[Value]) -> String {
    let lines: Vec<&str> = text.split('\n').collect();
    let offset = |pos: &Value| -> usize {
        let line = pos["line"].as_u64().unwrap_or(0) as usize;
        let ch = pos["character"].as_u64().unwrap_or(0) as usize;
        let mut off: usize = lines[..line.min(lines.len())]
            .iter()
            .map(|l| l.len() + 1)
            .sum();
        let l = lines.get(line).copied().unwrap_or("");
        let mut units = 0;
        for c in l.chars() {
            if units >= ch {
                break;
            }
            units += c.len_utf16();
            off += c.len_utf8();
        }
        off
    };
    let mut spans: Vec<(usize, usize, String)> = edits
        .iter()
        .map(|e| {
            (
                offset(&e["range"]["start"]),
                offset(&e["range"]["end"]),
                e["newText"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    spans.sort_by_key(|s| std::cmp::Reverse(s.0));
    let mut out = text.to_string();
    for (s, e, t) in spans {
        out.replace_range(s..e, &t);
    }
    out
}

/// Copy `src` to `dst`, creating parent directories.
pub fn copy(src: &Path, dst: &Path) {
    if let Some(p) = dst.parent() {
        std::fs::create_dir_all(p).expect("mkdir");
    }
    std::fs::copy(src, dst).expect("copy");
    // ../shared is read-only; the copies are the user's files and must be editable.
    let mut perm = std::fs::metadata(dst).expect("stat copy").permissions();
    #[allow(clippy::permissions_set_readonly_false)]
    perm.set_readonly(false);
    std::fs::set_permissions(dst, perm).expect("chmod copy");
}

pub fn tempdir() -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().expect("tempdir");
    let ws = d.path().join("ws");
    std::fs::create_dir_all(&ws).expect("mkdir ws");
    let ws = std::fs::canonicalize(&ws).expect("canonicalize");
    (d, ws)
}

/// The code actions the server offers at the start of `line` (0-based) of `file`.
pub fn actions(lsp: &mut Lsp, file: &Path, line: u32) -> Vec<Value> {
    lsp.request(
        "textDocument/codeAction",
        json!({
            "textDocument": {"uri": uri(file)},
            "range": {"start": {"line": line, "character": 0}, "end": {"line": line, "character": 0}},
            "context": {"diagnostics": []}
        }),
    )
    .as_array()
    .cloned()
    .unwrap_or_default()
}

/// The action whose title contains `needle`.
pub fn titled<'a>(actions: &'a [Value], needle: &str) -> &'a Value {
    actions
        .iter()
        .find(|a| a["title"].as_str().is_some_and(|t| t.contains(needle)))
        .unwrap_or_else(|| panic!("no action titled {needle:?}: {actions:#?}"))
}

/// `text` after the action's edits to `file`.
pub fn applied(text: &str, action: &Value, file: &Path) -> String {
    let edits = action["edit"]["changes"][uri(file)]
        .as_array()
        .cloned()
        .unwrap_or_else(|| panic!("no edit for {}: {action}", file.display()));
    apply_edits(text, &edits)
}
