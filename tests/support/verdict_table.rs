//! The verdict tables' subset of TOML (`tests/real_verdicts.toml`, `tests/real_verdicts_jax.toml`):
//! `[[SECTION]]`, `[[SECTION.finding]]`, `key = "str"` or `key = int`, comments. Each table's test
//! turns the keys into its own rows and fails on a key it does not know.

use std::collections::{BTreeMap, BTreeSet};

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

/// A key's value, taken out of a row's keys ("" when absent), so that what is left over is what
/// the table should not have.
pub fn take(keys: &mut BTreeMap<String, String>, key: &str) -> String {
    keys.remove(key).unwrap_or_default()
}

/// Every file on disk has a row in the table (`table` names it in the message).
pub fn assert_all_judged<'a>(
    on_disk: &BTreeSet<String>,
    judged: impl IntoIterator<Item = &'a String>,
    table: &str,
) {
    let judged: BTreeSet<&String> = judged.into_iter().collect();
    let unjudged: Vec<_> = on_disk.iter().filter(|f| !judged.contains(f)).collect();
    assert!(unjudged.is_empty(), "not in {table}: {unjudged:?}");
}
