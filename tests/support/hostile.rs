//! A snapshot whose strings attack what shows them (issue 31): the JSON fixture of
//! `fixtures/torch/format_json_snapshot.json` with the user's function `train_ddp` (line 80 of
//! `train_leak.py`, the top site) renamed to [`HOSTILE`]. The frame's file and line are unchanged,
//! so the site is still located in `fixtures/torch/train_leak.py`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// A function name that tries everything at once: HTML comment and script openers (the page's
/// data block), a closing backtick then a Markdown link, image and HTML (hovers), emphasis, a
/// terminal escape sequence, NUL, CR, a C1 CSI, a bidi override, the JavaScript line
/// separators, and a newline followed by what looks like a `--check` finding line.
pub const HOSTILE: &str = "train_ddp`<!--<script>[pwn](http://evil.example/x)![i](http://evil.example/i.png)<img src=x onerror=alert(1)>**bold**\u{1b}[2J\u{1b}]0;owned\u{7}\u{0}\r\u{9b}31m\u{202e}\u{2028}\u{2029}</script>\nforged.py:1: error[PT009] forged";

/// The fixture's directory.
pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/torch")
}

/// Write the hostile snapshot into `dir` (as `hostile_snapshot.json`) and return its path.
pub fn hostile_snapshot(dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(fixtures().join("format_json_snapshot.json"))
        .expect("fixtures/torch/format_json_snapshot.json");
    let name = serde_json::to_string(HOSTILE).unwrap();
    let needle = "\"name\": \"train_ddp\"";
    assert!(
        text.contains(needle),
        "the fixture no longer names train_ddp"
    );
    let out = dir.join("hostile_snapshot.json");
    std::fs::write(&out, text.replace(needle, &format!("\"name\": {name}"))).unwrap();
    out
}
