//! Usage errors: exit 2, one line on stderr, nothing on stdout; help and version on stdout.

mod common;

use common::memlsp;

fn usage_error(args: &[&str], needle: &str) {
    let dir = tempfile::tempdir().unwrap();
    let run = memlsp(args, dir.path());
    run.assert_one_line_error(needle);
    assert_eq!(run.stdout, "", "nothing on stdout for {args:?}");
}

#[test]
fn unknown_flag() {
    usage_error(&["--bogus"], "--bogus");
}

#[test]
fn bad_format_and_severity_values() {
    usage_error(&["--check", "--format", "xml"], "xml");
    usage_error(&["--check", "--fail-on", "fatal"], "fatal");
    usage_error(&["report", "x.pickle", "--format", "sarif"], "sarif");
    usage_error(&["--check", "--path-map", "/no-equals-sign"], "FROM=TO");
    usage_error(&["--check", "--max-file-bytes", "lots"], "lots");
}

#[test]
fn report_needs_a_file() {
    usage_error(&["report"], "<FILE>");
}

#[test]
fn check_options_without_check() {
    usage_error(&["--format", "json"], "need --check");
    usage_error(&["snap.pickle"], "need --check");
}

#[test]
fn workspace_must_be_a_directory() {
    usage_error(
        &["--check", "--workspace", "/definitely/not/here"],
        "/definitely/not/here",
    );
}

#[test]
fn check_and_a_subcommand_do_not_mix() {
    usage_error(&["--check", "report", "x.pickle"], "--check");
}

#[test]
fn help_and_version_go_to_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let help = memlsp(&["--help"], dir.path());
    assert_eq!(help.code, 0);
    assert!(help.stdout.contains("--check"), "{}", help.stdout);
    assert!(help.stdout.contains("report"), "{}", help.stdout);
    assert_eq!(help.stderr, "");
    let report_help = memlsp(&["report", "--help"], dir.path());
    assert_eq!(report_help.code, 0);
    for flag in [
        "--diff",
        "--module",
        "--top",
        "--max-trace-events",
        "--format",
    ] {
        assert!(
            report_help.stdout.contains(flag),
            "report --help lacks {flag}"
        );
    }
    let version = memlsp(&["--version"], dir.path());
    assert_eq!(version.code, 0);
    assert_eq!(
        version.stdout,
        format!("memlsp {}\n", env!("CARGO_PKG_VERSION"))
    );
}

/// `memlsp` and `memlsp lsp` speak LSP on stdio: an `initialize` gets the server's capabilities.
#[test]
fn no_arguments_and_lsp_start_the_language_server() {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::process::{Command, Stdio};
    let frame = |body: &str| format!("Content-Length: {}\r\n\r\n{body}", body.len());
    let dir = tempfile::tempdir().unwrap();
    for args in [&[][..], &["lsp"][..], &["lsp", "--stdio"][..]] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_memlsp"))
            .args(args)
            .current_dir(dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        stdin
            .write_all(
                frame(r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"capabilities":{}}}"#)
                    .as_bytes(),
            )
            .unwrap();
        // One response: headers, a blank line, then Content-Length bytes of JSON.
        let mut length = 0;
        loop {
            let mut header = String::new();
            stdout.read_line(&mut header).unwrap();
            if header.trim().is_empty() {
                break;
            }
            if let Some(n) = header.strip_prefix("Content-Length: ") {
                length = n.trim().parse().unwrap();
            }
        }
        let mut body = vec![0; length];
        stdout.read_exact(&mut body).unwrap();
        let reply: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(reply["id"], 1, "{args:?}: {reply}");
        assert!(
            reply["result"]["capabilities"].is_object(),
            "{args:?}: {reply}"
        );
        for msg in [
            r#"{"jsonrpc":"2.0","method":"initialized","params":{}}"#,
            r#"{"jsonrpc":"2.0","id":2,"method":"shutdown"}"#,
            r#"{"jsonrpc":"2.0","method":"exit"}"#,
        ] {
            stdin.write_all(frame(msg).as_bytes()).unwrap();
        }
        drop(stdin);
        assert_eq!(child.wait().unwrap().code(), Some(0), "{args:?}");
    }
}
