//! The verdict tables' subset of TOML (`tests/real_verdicts.toml`, `tests/real_verdicts_jax.toml`):
//! `[[SECTION]]`, `[[SECTION.finding]]`, `key = "str"` or `key = int`, comments. Each table's test
//! turns the keys into its own rows and fails on a key it does not know.

use std::collections::BTreeMap;

/// One `[[SECTION]]` with its keys and, in order, its `[[SECTION.finding]]`s' keys.
#[derive(Debug, Default)]
pub struct Entry {
    pub keys: BTreeMap<String, String>,
    pub findings: Vec<BTreeMap<String, String>>,
}

pub fn parse(text: &str, section: &str) -> Vec<Entry> {
    let (open, finding) = (format!("[[{section}]]"), format!("[[{section}.finding]]"));
    let mut out: Vec<Entry> = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if line == open {
            out.push(Entry::default());
            continue;
        }
        let e = out
            .last_mut()
            .unwrap_or_else(|| panic!("line {}: `{line}` before any {open}", n + 1));
        if line == finding {
            e.findings.push(BTreeMap::new());
            continue;
        }
        let (k, v) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("line {}: not `key = value`: {line}", n + 1));
        let keys = e.findings.last_mut().unwrap_or(&mut e.keys);
        let v = v.trim().trim_matches('"').to_string();
        if keys.insert(k.trim().to_string(), v).is_some() {
            panic!("line {}: `{}` given twice", n + 1, k.trim());
        }
    }
    out
}
