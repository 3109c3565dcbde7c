//! Capture strings that attack what shows them (issue 31, items 1 and 10): a frame's function
//! name holding `<!--<script>`, `</script>`, a Markdown link and image, HTML, a closing backtick,
//! ESC sequences, NUL, CR, a C1 CSI, a bidi override and U+2028/2029 (`support/hostile.rs`). Each
//! front end must show the string as text: the page's data block stays one JSON block (what
//! Chromium does with that page is checked by `tests/e2e/html.sh`), the text outputs carry no
//! control character, and the hover makes no link, image or HTML of it.

#[path = "support/hostile.rs"]
mod hostile;
mod lsp_support;

use hostile::{HOSTILE, hostile_snapshot};
use serde_json::{Value, json};

/// `memlsp args…` in `cwd`: exit status, stdout and stderr.
fn memlsp(args: &[&std::ffi::OsStr], cwd: &std::path::Path) -> (i32, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_memlsp"))
        .args(args)
        .current_dir(cwd)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run memlsp");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Whether some string of `v` contains `needle`.
fn holds(v: &Value, needle: &str) -> bool {
    match v {
        Value::String(s) => s.contains(needle),
        Value::Array(a) => a.iter().any(|x| holds(x, needle)),
        Value::Object(m) => m.values().any(|x| holds(x, needle)),
        _ => false,
    }
}

/// A character a terminal or a CI log would obey rather than show.
fn obeyed(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t')
        || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[test]
fn the_page_data_block_stays_one_json_block_whatever_a_frame_is_called() {
    let tmp = tempfile::tempdir().unwrap();
    let snap = hostile_snapshot(tmp.path());
    let out = tmp.path().join("page.html");
    let (code, _, err) = memlsp(
        &[
            "report".as_ref(),
            snap.as_os_str(),
            "--format".as_ref(),
            "html".as_ref(),
            "-o".as_ref(),
            out.as_os_str(),
        ],
        tmp.path(),
    );
    assert_eq!(code, 0, "{err}");
    let html = std::fs::read_to_string(&out).unwrap();
    let open = r#"<script id="memlsp-data" type="application/json">"#;
    let start = html.find(open).expect("data block") + open.len();
    let end = start
        + html[start..]
            .find("</script>")
            .expect("end of the data block");
    let block = &html[start..end];
    // In a script block `<!--` followed by `<script` puts the tokenizer in its "double escaped"
    // state, where the block's own `</script>` no longer ends it: no `<` may be in the block.
    for bad in ['<', '>', '&', '\u{2028}', '\u{2029}'] {
        assert!(
            !block.contains(bad),
            "{bad:?} in the inlined JSON at byte {}",
            block.find(bad).unwrap()
        );
    }
    let data: Value = serde_json::from_str(block).expect("the data block is JSON");
    assert!(holds(&data, HOSTILE), "the name reaches the page intact");
    // The page's own script follows the data block, untouched.
    assert!(html[end..].contains("JSON.parse(document.getElementById(\"memlsp-data\")"));
}

#[test]
fn text_outputs_show_control_characters_instead_of_obeying_them() {
    let tmp = tempfile::tempdir().unwrap();
    let snap = hostile_snapshot(tmp.path());
    let s = snap.as_os_str();
    let (code, report, err) = memlsp(&["report".as_ref(), s], tmp.path());
    assert_eq!(code, 0, "{err}");
    assert!(report.contains("train_ddp`<!--<script>"), "{report}");
    let check = |more: &[&str]| {
        let mut args = vec![
            "--check".as_ref(),
            s,
            "--fail-on".as_ref(),
            "error".as_ref(),
        ];
        args.extend(more.iter().map(|a| std::ffi::OsStr::new(*a)));
        memlsp(&args, tmp.path()).1
    };
    let text = check(&[]);
    let github = check(&["--format", "github"]);
    for (what, out) in [
        ("report", &report),
        ("--check", &text),
        ("--format github", &github),
    ] {
        assert!(!out.is_empty(), "{what}: no output");
        if let Some(c) = out.chars().find(|&c| obeyed(c)) {
            panic!("{what}: {c:?} printed raw:\n{out}");
        }
    }
    // A newline in a capture string cannot forge a finding line of its own.
    for (what, out) in [
        ("report", &report),
        ("--check", &text),
        ("--format github", &github),
    ] {
        assert!(
            !out.lines().any(|l| l.starts_with("forged.py")),
            "{what}: a forged line:\n{out}"
        );
    }
    // Shown, in a visible form.
    assert!(
        report.contains(r"\x1b[2J\x1b]0;owned\x07\x00\x0d\u{9b}31m\u{202e}"),
        "{report}"
    );
}

#[test]
fn the_hover_makes_no_link_image_or_html_of_a_frame_name() {
    let (_tmp, ws) = lsp_support::tempdir();
    let src = ws.join("train_leak.py");
    lsp_support::copy(&hostile::fixtures().join("train_leak.py"), &src);
    std::fs::create_dir_all(ws.join("runs")).unwrap();
    hostile_snapshot(&ws.join("runs"));
    let mut lsp = lsp_support::Lsp::start(&ws, json!({}));
    lsp.open(&src);
    lsp.hints_until(&src, 200, |h| !h.is_empty());
    let hover = lsp.request(
        "textDocument/hover",
        json!({"textDocument": {"uri": lsp_support::uri(&src)}, "position": {"line": 79, "character": 4}}),
    );
    let md = hover["contents"]["value"]
        .as_str()
        .unwrap_or("")
        .to_string();
    lsp.shutdown();
    // The name is one code span (a fence longer than its backtick), controls shown, line
    // breaks as spaces.
    let span = format!(
        "``{}``",
        HOSTILE
            .replace('\u{1b}', r"\x1b")
            .replace('\u{7}', r"\x07")
            .replace('\u{0}', r"\x00")
            .replace(['\r', '\n', '\u{2028}', '\u{2029}'], " ")
            .replace('\u{9b}', r"\u{9b}")
            .replace('\u{202e}', r"\u{202e}")
    );
    let line = format!("#L80) {span}\n");
    assert!(md.contains(&line), "no {line:?} in\n{md}");
    // Outside that code span, nothing of the name is Markdown.
    let outside = md.replace(&span, "");
    for live in ["[pwn](", "![i](", "<img", "<script", "<!--", "**bold**"] {
        // Live unless backslash-escaped.
        let unescaped = outside
            .match_indices(live)
            .any(|(at, _)| !outside[..at].ends_with('\\'));
        assert!(!unescaped, "{live} is live in\n{md}");
    }
    assert!(!md.chars().any(obeyed), "{md:?}");
}
