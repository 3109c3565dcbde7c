//! `memlsp mcp` spoken to by hand: the real binary, newline-delimited JSON-RPC on stdio, the MCP
//! lifecycle (initialize, notifications/initialized), then the tools and resources on real JAX
//! captures (`b_mlp_nodonate`, and `c_mlp_donate` as its baseline) and the bundled fixtures. `tests/mcp/sdk_client.py` drives the same server with the official Python SDK.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

use serde_json::{Value, json};

struct Mcp {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    next_id: u64,
}

impl Mcp {
    /// `memlsp mcp` in `cwd` with these roots (none: the server's default, `cwd`).
    fn start(cwd: &Path, roots: &[&Path]) -> Mcp {
        Mcp::start_with(
            cwd,
            &roots
                .iter()
                .flat_map(|r| ["--root".to_string(), r.display().to_string()])
                .collect::<Vec<_>>(),
        )
    }

    fn start_with(cwd: &Path, args: &[String]) -> Mcp {
        let mut child = Command::new(env!("CARGO_BIN_EXE_memlsp"))
            .arg("mcp")
            .args(args)
            .current_dir(cwd)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
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
            stdin: Some(stdin),
            lines,
            next_id: 1,
        }
    }

    fn send(&mut self, msg: &Value) {
        let mut s = serde_json::to_string(msg).unwrap();
        s.push('\n');
        let stdin = self.stdin.as_mut().expect("stdin is open");
        stdin.write_all(s.as_bytes()).unwrap();
        stdin.flush().unwrap();
    }

    fn notify(&mut self, method: &str, params: Value) {
        self.send(&json!({"jsonrpc": "2.0", "method": method, "params": params}));
    }

    /// Send a request and wait for its response (the whole message: `result` or `error`).
    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(120))
                .unwrap_or_else(|e| panic!("no answer to {method} ({e})"));
            let msg: Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {line}"));
            if msg["id"] == json!(id) {
                return msg;
            }
        }
    }

    /// Close stdin (the client is gone) and wait for the server to exit.
    fn close(&mut self) -> Option<i32> {
        self.stdin = None;
        for _ in 0..100 {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        None
    }

    fn call(&mut self, tool: &str, args: Value) -> Value {
        let msg = self.request("tools/call", json!({"name": tool, "arguments": args}));
        assert!(msg.get("error").is_none(), "{tool}: protocol error {msg}");
        msg["result"].clone()
    }
}

impl Drop for Mcp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn findings(doc: &Value) -> Vec<Value> {
    doc["captures"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|c| c["findings"].as_array().cloned().unwrap_or_default())
        .collect()
}

#[test]
fn an_agent_analyses_a_capture_asks_about_a_line_and_reads_a_finding_page() {
    let Some(dir) = common::shared("jax_cpu_captures/b_mlp_nodonate") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path();
    for f in ["b_mlp_nodonate.py", "b_mlp_nodonate.xplane.pb"] {
        std::fs::copy(dir.join(f), ws.join(f)).unwrap();
    }
    let capture = dir.join("b_mlp_nodonate.xplane.pb");
    // The workspace, the real captures and the temporary directory the baseline is written to.
    let shared_root = dir.parent().and_then(Path::parent).unwrap();
    let mut mcp = Mcp::start(ws, &[ws, shared_root, &std::env::temp_dir()]);

    let init = mcp.request(
        "initialize",
        json!({
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "memlsp-test", "version": "0"}
        }),
    );
    let info = &init["result"];
    assert_eq!(info["protocolVersion"], "2025-06-18", "{init}");
    assert_eq!(info["serverInfo"]["name"], "memlsp");
    assert!(info["capabilities"]["tools"].is_object(), "{init}");
    assert!(info["capabilities"]["resources"].is_object(), "{init}");
    mcp.notify("notifications/initialized", json!({}));

    let list = mcp.request("tools/list", json!({}));
    let names: Vec<&str> = list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "analyze",
            "explain_line",
            "diff",
            "compare_ranks",
            "check_baseline",
            "fit",
            "trend"
        ]
    );
    let analyze_schema = &list["result"]["tools"][0]["inputSchema"];
    assert_eq!(analyze_schema["type"], "object");
    assert_eq!(
        analyze_schema["required"],
        json!(["path"]),
        "{analyze_schema}"
    );

    // analyze: the capture by its absolute path, located against the workspace (the server's
    // directory), so JX005 lands on the jax.jit line of the program.
    let r = mcp.call("analyze", json!({"path": capture}));
    assert_eq!(r["isError"], false, "{r}");
    let doc = &r["structuredContent"];
    assert_eq!(doc["memlsp"], env!("CARGO_PKG_VERSION"));
    let jx005: Vec<Value> = findings(doc)
        .into_iter()
        .filter(|f| f["code"] == "JX005")
        .collect();
    assert_eq!(jx005.len(), 1, "{doc}");
    let f = &jx005[0];
    assert_eq!(
        (&f["file"], &f["line"]),
        (&json!("b_mlp_nodonate.py"), &json!(57))
    );
    let labels: Vec<&str> = f["evidence"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["label"].as_str().unwrap())
        .collect();
    assert!(
        labels.contains(&"read") && labels.contains(&"inferred"),
        "{labels:?}"
    );
    assert!(
        f["fixes"].to_string().contains("donate_argnums=(0, 1)"),
        "{f}"
    );
    let summary = r["content"][0]["text"].as_str().unwrap();
    assert!(
        summary.lines().next().unwrap().contains("[JX005]"),
        "{summary}"
    );
    // The same document as the CLI's.
    let cli = common::memlsp(&["report", common::arg(&capture), "--format", "json"], ws);
    assert_eq!(cli.json(), *doc);
    // The same words as the CLI's: each finding of the summary is the line `--check` prints.
    let check = common::memlsp(&["--check", common::arg(&capture)], ws);
    let said: Vec<&str> = summary
        .lines()
        .skip(1)
        .map(str::trim_start)
        .filter(|l| !l.starts_with('…'))
        .collect();
    assert!(
        said[0].starts_with("b_mlp_nodonate.py:57: warning[JX005] "),
        "{summary}"
    );
    for l in &said {
        assert!(
            check.stdout.lines().any(|c| c == *l),
            "{l}\nnot in\n{}",
            check.stdout
        );
    }

    // explain_line: the workspace holds the program and its capture.
    let r = mcp.call(
        "explain_line",
        json!({"file": "b_mlp_nodonate.py", "line": 57}),
    );
    assert_eq!(r["isError"], false, "{r}");
    let ex = &r["structuredContent"];
    assert_eq!(ex["captures_scanned"], 1, "{ex}");
    let hit = &ex["captures"][0];
    assert_eq!(hit["path"], "b_mlp_nodonate.xplane.pb", "{ex}");
    let codes: Vec<&str> = hit["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["code"].as_str().unwrap())
        .collect();
    assert!(codes.contains(&"JX005"), "{ex}");
    assert!(
        hit["findings"]
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f["line"] == 57 && f["file"] == "b_mlp_nodonate.py"),
        "{ex}"
    );

    // check_baseline: against the baseline of the donating version, the jax.jit line grew.
    let Some(c) = common::shared("jax_cpu_captures/c_mlp_donate/c_mlp_donate.xplane.pb") else {
        return;
    };
    let base_dir = tempfile::tempdir().unwrap();
    let base = base_dir.path().join("memlsp-baseline.json");
    let rec = common::memlsp(&["baseline", common::arg(&c), "-o", common::arg(&base)], ws);
    assert_eq!(rec.code, 0, "{}", rec.stderr);
    let r = mcp.call(
        "check_baseline",
        json!({"paths": ["b_mlp_nodonate.xplane.pb"], "baseline": base}),
    );
    let cb = &r["structuredContent"];
    assert_eq!(cb["passed"], false, "{r}");
    assert_eq!(cb["verdict"], "findings", "{cb}");
    assert!(
        cb["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["code"] == "BL001" && f["line"] == 57 && f["file"] == "b_mlp_nodonate.py"),
        "{cb}"
    );
    let r = mcp.call("check_baseline", json!({"paths": [c], "baseline": base}));
    assert_eq!(r["structuredContent"]["passed"], true, "{r}");

    // A bad path is a tool error with the one-line message, and the server keeps serving.
    let r = mcp.call("analyze", json!({"path": "missing.pickle"}));
    assert_eq!(r["isError"], true, "{r}");
    let msg = r["content"][0]["text"].as_str().unwrap();
    assert!(
        msg.contains("missing.pickle") && msg.contains("cannot read") && !msg.contains('\n'),
        "{msg}"
    );
    let r = mcp.call("analyze", json!({"path": "b_mlp_nodonate.py"}));
    assert_eq!(r["isError"], true, "a Python file is not a capture: {r}");
    let r = mcp.call("analyze", json!({"paht": "x"}));
    assert_eq!(r["isError"], true, "{r}");
    assert!(r["content"][0]["text"].as_str().unwrap().contains("paht"));
    let unknown = mcp.request("tools/call", json!({"name": "nope", "arguments": {}}));
    assert!(unknown["error"].is_object(), "{unknown}");
    let r = mcp.call("analyze", json!({"path": "b_mlp_nodonate.xplane.pb"}));
    assert_eq!(r["isError"], false, "still serving: {r}");

    // Resources: every finding page, JX005 readable.
    let res = mcp.request("resources/list", json!({}));
    let uris: Vec<&str> = res["result"]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["uri"].as_str().unwrap())
        .collect();
    assert_eq!(uris.len(), memlsp::findings::Code::ALL.len(), "{uris:?}");
    assert!(uris.contains(&"memlsp://findings/JX005"), "{uris:?}");
    let page = mcp.request("resources/read", json!({"uri": "memlsp://findings/JX005"}));
    let c = &page["result"]["contents"][0];
    assert_eq!(c["mimeType"], "text/markdown");
    assert_eq!(
        c["text"].as_str().unwrap(),
        std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/findings/JX005.md")
        )
        .unwrap()
    );
    let missing = mcp.request("resources/read", json!({"uri": "memlsp://findings/XX001"}));
    assert!(missing["error"].is_object(), "{missing}");

    // Closing stdin ends the server.
    assert_eq!(mcp.close(), Some(0));
}

/// The server needs nothing of `../shared` to start and to list: the lifecycle on the bundled
/// fixtures, with `diff` on the PT011 pair and `check_baseline` with an unreadable baseline.
#[test]
fn diff_and_a_bad_baseline_on_the_fixtures() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/torch");
    let tmp = tempfile::tempdir().unwrap();
    let mut mcp = Mcp::start(tmp.path(), &[tmp.path(), &fixtures]);
    let init = mcp.request(
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}),
    );
    assert_eq!(init["result"]["protocolVersion"], "2025-11-25", "{init}");
    mcp.notify("notifications/initialized", json!({}));
    let r = mcp.call(
        "diff",
        json!({
            "earlier": fixtures.join("pt011_step10.pickle"),
            "later": fixtures.join("pt011_step20.pickle"),
        }),
    );
    assert_eq!(r["isError"], false, "{r}");
    let doc = &r["structuredContent"];
    assert!(findings(doc).iter().any(|f| f["code"] == "PT011"), "{doc}");
    // The growth the CLI's `report step10 --diff step20` shows: the cache at line 124, +10 blocks.
    let d = &doc["captures"][0]["torch"]["diff"];
    assert_eq!(
        (&d["allocated_bytes_before"], &d["allocated_bytes_after"]),
        (&json!(50987008), &json!(51396608)),
        "{d}"
    );
    let grown = d["grown"].as_array().unwrap();
    assert_eq!(grown.len(), 1, "{d}");
    assert_eq!(
        grown[0]["site"],
        "/home/alice/project/train_leak.py:124:train_with_cache"
    );
    assert_eq!(
        (&grown[0]["blocks_delta"], &grown[0]["bytes_delta"]),
        (&json!(10), &json!(409600))
    );
    let r = mcp.call(
        "check_baseline",
        json!({"paths": [fixtures.join("pt011_step20.pickle")], "baseline": "nope.json"}),
    );
    assert_eq!(r["isError"], true, "{r}");
    assert!(
        r["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("cannot read the baseline"),
        "{r}"
    );
    let r = mcp.call("compare_ranks", json!({"dir": fixtures.join("ranks")}));
    assert_eq!(r["isError"], false, "{r}");
    // The comparison `report DIR` gives, rank by rank.
    let cli = common::memlsp(
        &[
            "report",
            common::arg(&fixtures.join("ranks")),
            "--format",
            "json",
        ],
        tmp.path(),
    );
    assert_eq!(cli.code, 0, "{}", cli.stderr);
    let want = &cli.json()["rank_comparisons"][0];
    let rows = |c: &Value| -> Vec<(Value, Value, Value)> {
        c["ranks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["rank"].clone(),
                    r["allocated_bytes"].clone(),
                    r["reserved_bytes"].clone(),
                )
            })
            .collect()
    };
    let got = &r["structuredContent"]["comparison"];
    assert_eq!(rows(got), rows(want), "{r}");
    assert_eq!(rows(got).len(), 2);
    assert_eq!(got["imbalance"], want["imbalance"]);
}

/// `check_baseline` runs `--check`'s pipeline: on a folder of ranks, the ranks are compared and
/// the PT012 (rank skew) warnings fail it at `fail_on: warning`, as `memlsp --check` says.
#[test]
fn check_baseline_compares_the_ranks_of_a_folder_as_check_does() {
    let tmp = tempfile::tempdir().unwrap();
    let ranks = tmp.path().join("ranks");
    std::fs::create_dir_all(&ranks).unwrap();
    for (r, n) in ["ctx128_fullstep", "ctx256_forward", "snapshot"]
        .iter()
        .enumerate()
    {
        let Some(src) = common::shared(&format!(
            "torch_snapshots/real/kkaitlyn111__memory_{n}.pickle"
        )) else {
            return;
        };
        std::fs::copy(src, ranks.join(format!("rank{r}_snapshot.pickle"))).unwrap();
    }
    let base = tmp.path().join("memlsp-baseline.json");
    let rec = common::memlsp(
        &["baseline", common::arg(&ranks), "-o", common::arg(&base)],
        tmp.path(),
    );
    assert_eq!(rec.code, 0, "{}", rec.stderr);
    let cli = common::memlsp(
        &[
            "--check",
            common::arg(&ranks),
            "--baseline",
            common::arg(&base),
            "--format",
            "json",
        ],
        tmp.path(),
    );
    let pt012 = cli.stdout.matches("\"PT012\"").count();
    assert!(pt012 > 0, "{}", cli.stdout);

    let mut mcp = Mcp::start(tmp.path(), &[]);
    mcp.request(
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}),
    );
    mcp.notify("notifications/initialized", json!({}));
    let r = mcp.call(
        "check_baseline",
        json!({"paths": [ranks], "baseline": base, "fail_on": "warning"}),
    );
    assert_eq!(r["structuredContent"]["passed"], false, "{r}");
    let text = r["content"][0]["text"].as_str().unwrap();
    assert_eq!(text.matches("warning[PT012]").count(), pt012, "{text}");
}

impl Mcp {
    fn initialized(mut self) -> Mcp {
        self.request(
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}),
        );
        self.notify("notifications/initialized", json!({}));
        self
    }
}

/// The text of a tool error (panics on success).
fn tool_error(r: &Value) -> String {
    assert_eq!(r["isError"], true, "expected a tool error: {r}");
    r["content"][0]["text"].as_str().unwrap().to_string()
}

/// An agent cannot read out of the workspace: not by an absolute path, `../`, a symlinked file
/// or directory, a workspace argument, or a capture a directory scan finds behind a symlink;
/// each refusal is one line naming the roots. `--allow-outside` lifts it.
#[test]
fn tools_read_only_under_the_roots_symlinks_and_dotdot_included() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/torch");
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(ws.join("runs")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    for f in ["pt011_step10.pickle", "pt011_step20.pickle"] {
        std::fs::copy(fixtures.join(f), outside.join(f)).unwrap();
    }
    std::fs::copy(
        fixtures.join("pt011_step20.pickle"),
        ws.join("runs/mine.pickle"),
    )
    .unwrap();
    std::os::unix::fs::symlink(
        outside.join("pt011_step10.pickle"),
        ws.join("runs/link.pickle"),
    )
    .unwrap();
    std::os::unix::fs::symlink(&outside, ws.join("outdir")).unwrap();
    let roots = ws.canonicalize().unwrap().display().to_string();

    let rec = common::memlsp(&["baseline", "runs/mine.pickle", "-o", "b.json"], &ws);
    assert_eq!(rec.code, 0, "{}", rec.stderr);
    let mut mcp = Mcp::start(&ws, &[]).initialized();
    let ok = mcp.call("analyze", json!({"path": "runs/mine.pickle"}));
    assert_eq!(ok["isError"], false, "inside the root: {ok}");
    for (tool, args) in [
        (
            "analyze",
            json!({"path": outside.join("pt011_step10.pickle")}),
        ),
        ("analyze", json!({"path": "../outside/pt011_step10.pickle"})),
        (
            "analyze",
            json!({"path": "runs/../../outside/pt011_step10.pickle"}),
        ),
        ("analyze", json!({"path": "runs/link.pickle"})),
        ("analyze", json!({"path": "outdir/pt011_step10.pickle"})),
        ("analyze", json!({"path": "/"})),
        (
            "analyze",
            json!({"path": "mine.pickle", "workspace": "../outside"}),
        ),
        (
            "diff",
            json!({"earlier": "runs/link.pickle", "later": "runs/mine.pickle"}),
        ),
        ("compare_ranks", json!({"dir": "outdir"})),
        (
            "explain_line",
            json!({"file": "../outside/x.py", "line": 1}),
        ),
        (
            "check_baseline",
            json!({"paths": ["runs"], "baseline": "../outside/b.json"}),
        ),
        (
            "check_baseline",
            json!({"paths": ["/"], "baseline": "b.json"}),
        ),
    ] {
        let r = mcp.call(tool, args.clone());
        let msg = tool_error(&r);
        assert!(
            msg.contains(&format!("outside the workspace roots ({roots})")) && !msg.contains('\n'),
            "{tool} {args}: {msg}"
        );
    }
    // A scan of the workspace reads the capture inside, not the one behind the symlink (a
    // capture a scan finds outside the roots is listed in `budget.outside_roots`, unread).
    let r = mcp.call("explain_line", json!({"file": "runs/../b.json", "line": 1}));
    assert_eq!(r["isError"], false, "{r}");
    let sc = &r["structuredContent"];
    assert_eq!(sc["captures_scanned"], 1, "{sc}");
    drop(mcp);

    // --allow-outside: the same symlink is read.
    let mut open = Mcp::start_with(&ws, &["--allow-outside".to_string()]).initialized();
    let r = open.call("analyze", json!({"path": "runs/link.pickle"}));
    assert_eq!(r["isError"], false, "{r}");
    // A root that is not a directory stops the server with one line.
    let bad = Command::new(env!("CARGO_BIN_EXE_memlsp"))
        .args(["mcp", "--root", "no/such/dir"])
        .current_dir(&ws)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(bad.status.code(), Some(2), "{err}");
    assert!(
        err.starts_with("memlsp: --root no/such/dir: ") && err.lines().count() == 1,
        "{err}"
    );
}

/// Each call has a budget of captures, bytes and seconds: a call about more than it is refused
/// naming the budget; a scan analyses what fits and says what it left out.
#[test]
fn a_call_stays_within_its_budget_and_says_when_it_cut_short() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/torch");
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path();
    for f in [
        "pt002_retained_graph.pickle",
        "pt003_growing_history.pickle",
        "pt011_step10.pickle",
    ] {
        std::fs::copy(fixtures.join(f), ws.join(f)).unwrap();
    }
    std::fs::copy(fixtures.join("train_leak.py"), ws.join("train_leak.py")).unwrap();
    let base = ws.join("base.json");
    assert_eq!(
        common::memlsp(&["baseline", ".", "-o", "base.json"], ws).code,
        0
    );
    let mut mcp = Mcp::start_with(ws, &["--budget-captures".into(), "2".into()]).initialized();
    // A directory of three captures is over a budget of two.
    let msg = tool_error(&mcp.call("analyze", json!({"path": "."})));
    assert!(
        msg.contains("3 captures, over the budget of 2 per call")
            && msg.contains("--budget-captures"),
        "{msg}"
    );
    // A scan analyses two and says it left one out; a check cut short has not passed.
    let r = mcp.call("check_baseline", json!({"baseline": base}));
    let sc = &r["structuredContent"];
    assert_eq!(sc["budget"]["captures_analysed"], 2, "{sc}");
    assert_eq!(sc["budget"]["limits"]["captures"], 2, "{sc}");
    assert!(
        sc["budget"]["cut"]
            .as_str()
            .unwrap()
            .contains("1 of 3 captures not analysed"),
        "{sc}"
    );
    assert_eq!(sc["passed"], false, "{sc}");
    assert!(
        r["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("cut short"),
        "{r}"
    );
    let r = mcp.call("explain_line", json!({"file": "train_leak.py", "line": 1}));
    assert!(r["structuredContent"]["budget"]["cut"].is_string(), "{r}");
    drop(mcp);

    // Bytes: a budget below one capture's size refuses it.
    let mut mcp = Mcp::start_with(ws, &["--budget-bytes".into(), "1K".into()]).initialized();
    let msg = tool_error(&mcp.call("analyze", json!({"path": "pt011_step10.pickle"})));
    assert!(
        msg.contains("over the budget of 1.00 KiB per call") && msg.contains("--budget-bytes"),
        "{msg}"
    );
    drop(mcp);

    // Seconds: with no time at all the call is stopped and says so.
    let mut mcp = Mcp::start_with(ws, &["--budget-seconds".into(), "0".into()]).initialized();
    let msg = tool_error(&mcp.call("analyze", json!({"path": "pt011_step10.pickle"})));
    assert!(
        msg.contains("time budget of 0 s") && msg.contains("--budget-seconds"),
        "{msg}"
    );
    let r = mcp.call("check_baseline", json!({"baseline": base}));
    let cut = r["structuredContent"]["budget"]["cut"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(cut.contains("time budget of 0 s"), "{r}");
}

/// `fit` answers with `memlsp fit --format json`'s document: on a capacity below what the
/// capture needs, the first failing request with its Python line; a GPU the table does not know
/// is a tool error naming the ones it does.
#[test]
fn fit_names_the_first_failing_request_on_a_capacity() {
    let Some(src) =
        common::shared("torch_snapshots/real/silmont2000__memory_forward_bf16_128.pickle")
    else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let mut mcp = Mcp::start(tmp.path(), &[tmp.path(), src.parent().unwrap()]);
    mcp.request(
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}),
    );
    mcp.notify("notifications/initialized", json!({}));
    let r = mcp.call("fit", json!({"path": src, "on": "700MiB"}));
    assert_eq!(r["isError"], false, "{r}");
    let d = &r["structuredContent"]["captures"][0]["torch"]["fit"][0];
    assert_eq!(d["validated"], true, "{d}");
    assert_eq!(d["needs_bytes"], 818u64 << 20, "{d}");
    assert_eq!(d["on"]["fits"], false, "{d}");
    assert_eq!(d["on"]["first_failure"]["entry"], 1704, "{d}");
    assert_eq!(d["on"]["first_failure"]["site"]["line"], 33, "{d}");
    let text = r["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("OOM — this run needs 818.00 MiB"), "{text}");
    let r = mcp.call("fit", json!({"path": src, "on": "A100"}));
    assert_eq!(r["isError"], true, "{r}");
}

/// The PyTorch views over MCP: `analyze` with `categories` and `range` answers what `report
/// --category … --range …` does (stages and categories are in its `torch` object), and `trend`
/// reads three snapshots of one run as `report --trend` does (the growing fixture's PT011 from
/// the whole series).
#[test]
fn analyze_takes_categories_and_a_range_and_trend_reads_a_series() {
    let Some(src) = common::shared(
        "torch_snapshots/real/NiuHuangxiaozi__16edf316_forward_and_backward_memory_snapshot_150.pickle",
    ) else {
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let fixtures = root.join("fixtures/torch/trend_growing");
    let tmp = tempfile::tempdir().unwrap();
    let mut mcp = Mcp::start(tmp.path(), &[tmp.path(), src.parent().unwrap(), &fixtures]);
    mcp.request(
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}),
    );
    mcp.notify("notifications/initialized", json!({}));
    let r = mcp.call(
        "analyze",
        json!({"path": src, "range": "3904..7691", "categories": ["optimizer=torch/optim/"]}),
    );
    assert_eq!(r["isError"], false, "{r}");
    let t = &r["structuredContent"]["captures"][0]["torch"];
    assert_eq!(t["totals"]["trace_entries"], 7691 - 3904);
    assert_eq!(t["range"][0]["start_index"], 3904);
    assert!(
        t["stages"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["name"] == "Optimizer.step#NIUAdam.step"),
        "the part's recorded stages: {}",
        t["stages"]
    );
    let custom = &t["categories"][0]["custom"];
    assert_eq!(custom[0]["name"], "optimizer", "{custom}");
    assert_eq!(custom[1]["name"], "uncategorized", "{custom}");
    assert_eq!(t["compile_contexts"]["recorded"], false);
    // What the command line says for the same arguments.
    let cli = common::memlsp(
        &[
            "report",
            common::arg(&src),
            "--range",
            "3904..7691",
            "--category",
            "optimizer=torch/optim/",
            "--format",
            "json",
        ],
        tmp.path(),
    )
    .json();
    assert_eq!(
        t["categories"], cli["captures"][0]["torch"]["categories"],
        "the same breakdown as report --category"
    );
    let r = mcp.call("analyze", json!({"path": src, "range": "abc"}));
    assert_eq!(r["isError"], true, "{r}");
    assert!(tool_error(&r).contains("is not A..B"), "{r}");

    let steps: Vec<_> = [5, 10, 15]
        .iter()
        .map(|k| fixtures.join(format!("snapshot_step{k}.pickle")))
        .collect();
    let r = mcp.call("trend", json!({"paths": steps}));
    assert_eq!(r["isError"], false, "{r}");
    let c = &r["structuredContent"]["captures"][0];
    assert_eq!(c["torch"]["trend"]["steps"], json!([5, 10, 15]));
    assert!(
        findings(&r["structuredContent"])
            .iter()
            .any(|f| f["code"] == "PT011"),
        "{c}"
    );
    let text = r["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("trend over 3 snapshots: 1 site(s) grew at every one"),
        "{text}"
    );
    let r = mcp.call("trend", json!({"paths": &steps[..2]}));
    assert_eq!(r["isError"], true, "{r}");
    assert!(tool_error(&r).contains("three or more"), "{r}");
}
