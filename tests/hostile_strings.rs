//! Capture strings that attack what shows them (issue 31, items 1 and 10): a frame's function
//! name holding `<!--<script>`, `</script>`, a Markdown link and image, HTML, a closing backtick,
//! ESC sequences, NUL, CR, a C1 CSI, a bidi override and U+2028/2029 (`support/hostile.rs`). Each
//! front end must show the string as text: the page's data block stays one JSON block (what
//! Chromium does with that page is checked by `tests/e2e/html.sh`), the text outputs carry no
//! control character, and the hover makes no link, image or HTML of it.

mod common;
#[path = "support/hostile.rs"]
mod hostile;
mod lsp_support;

use hostile::{HOSTILE, hostile_snapshot};
use serde_json::{Value, json};

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
    let r = common::memlsp(
        &[
            "report",
            common::arg(&snap),
            "--format",
            "html",
            "-o",
            common::arg(&out),
        ],
        tmp.path(),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
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
    let report = common::memlsp(&["report", common::arg(&snap)], tmp.path());
    assert_eq!(report.code, 0, "{}", report.stderr);
    assert!(
        report.stdout.contains("train_ddp`<!--<script>"),
        "{}",
        report.stdout
    );
    let check = common::memlsp(
        &["--check", common::arg(&snap), "--fail-on", "error"],
        tmp.path(),
    );
    let github = common::memlsp(
        &[
            "--check",
            common::arg(&snap),
            "--format",
            "github",
            "--fail-on",
            "error",
        ],
        tmp.path(),
    );
    for (what, out) in [
        ("report", &report.stdout),
        ("--check", &check.stdout),
        ("--format github", &github.stdout),
    ] {
        assert!(!out.is_empty(), "{what}: no output");
        if let Some(c) = out.chars().find(|&c| obeyed(c)) {
            panic!("{what}: {c:?} printed raw:\n{out}");
        }
    }
    // Shown, in a visible form.
    assert!(
        report
            .stdout
            .contains(r"\x1b[2J\x1b]0;owned\x07\x00\x0d\u{9b}31m\u{202e}"),
        "{}",
        report.stdout
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
            .replace(['\r', '\u{2028}', '\u{2029}'], " ")
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
    assert!(!md.chars().any(|c| obeyed(c)), "{md:?}");
}
