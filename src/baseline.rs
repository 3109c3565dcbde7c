//! CI memory baselines: the deterministic numbers of a set of captures, stored once
//! (`memlsp baseline PATH… -o memlsp-baseline.json`), and a check that a later run did not grow
//! them past a threshold (`memlsp --check PATH… --baseline FILE`): a BL001 finding per grown
//! number, on the line it belongs to.
//!
//! What is recorded, per capture key:
//! - JAX (key `jax/<hlo module name>`, the program id dropped: `jit_train_step(36)` →
//!   `jax/jit_train_step`): the plan's total peak and heap peak (*read*, compile-time, exact)
//!   and the bytes at the peak per Python line (the report's sites, with their label); the
//!   runtime allocator's peak in use (*measured*, timing-dependent).
//! - PyTorch (key `torch/rank<N>` for a rank of a directory or a file named `…rank<N>…`, else
//!   `torch` when the run has one snapshot, else `torch/<file name>`): per device the peak of
//!   live bytes over the trace and the live bytes at the snapshot, the live bytes per site
//!   (*measured*); reserved bytes (timing-dependent: the caching allocator's frees race the
//!   streams).
//!
//! Totals gate (the plan's total peak; per device the trace peak and the live bytes at the
//! snapshot; with `timing`, the runtime peak and reserved bytes). Once a total grew, the parts
//! say where: the plan's heap peak and every line that grew or is new get their own BL001 on
//! their line; parts that grew while no total did are memory moving within the run, not more of
//! it, and pass. Lines are matched by the last two components of the recorded path, the
//! function and the line; a line that moved (code added above it) is matched by path and
//! function when that is unique. Timing-dependent numbers are compared only when asked
//! (`timing`), and say so. Growth counts when it is above `max_growth` (a fraction) and above
//! 1 MiB.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::findings::{Code, Evidence, Finding, Label, Location, Refine, Severity, fmt_bytes};
use crate::report::{CaptureReport, Engine};

/// The file format version written and read.
pub const VERSION: u32 = 1;

/// Growth below this many bytes is noise, whatever its share.
const MIN_GROWTH: u64 = 1 << 20;

/// A stored baseline.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Baseline {
    pub memlsp_baseline: u32,
    /// The memlsp version that wrote it.
    pub written_by: String,
    pub captures: BTreeMap<String, Entry>,
}

/// One capture's numbers.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// The capture path as it was given.
    pub source: String,
    pub numbers: Vec<Number>,
}

/// One recorded number.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Number {
    /// `plan total peak`, `plan heap peak`, `runtime peak in use`, `trace peak (device 0)`,
    /// `live at the snapshot (device 0)`, `reserved (device 0)`, or `line` for a Python line.
    pub what: String,
    pub bytes: u64,
    pub label: Label,
    /// Depends on timing (runtime events): compared only when asked.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub timing: bool,
    /// For a line: the last two components of the recorded path, the line and the function.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<String>,
}

/// How the check compares.
#[derive(Clone, Debug, PartialEq)]
pub struct CompareOptions {
    /// Allowed growth as a fraction (0.05 = 5 %).
    pub max_growth: f64,
    /// Also compare timing-dependent numbers.
    pub timing: bool,
}

impl Default for CompareOptions {
    fn default() -> Self {
        CompareOptions {
            max_growth: 0.05,
            timing: false,
        }
    }
}

/// What a comparison found besides the grown numbers.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    /// Numbers compared.
    pub compared: usize,
    /// Captures of this run whose key the baseline does not have.
    pub new_keys: Vec<String>,
    /// Keys of the baseline this run has no capture for.
    pub missing_keys: Vec<String>,
    /// Timing-dependent numbers left out (not asked for).
    pub timing_skipped: usize,
}

/// Parse a `--max-growth` value: `5%`, `5`, `0.05` (a bare number ≥ 1 is a percentage).
pub fn parse_growth(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let (num, pct) = match t.strip_suffix('%') {
        Some(n) => (n.trim(), true),
        None => (t, false),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("--max-growth {s:?}: expected a percentage such as 5%"))?;
    if !v.is_finite() || v < 0.0 {
        return Err(format!("--max-growth {s:?}: must be 0 or more"));
    }
    Ok(if pct || v >= 1.0 { v / 100.0 } else { v })
}

/// Keys of `reports` (see the module docs), in order.
pub fn keys(reports: &[CaptureReport]) -> Vec<String> {
    let plain_torch = reports
        .iter()
        .filter(|r| matches!(&r.engine, Engine::Torch(t) if rank_of(r, t).is_none()))
        .count();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    reports
        .iter()
        .map(|r| {
            let k = match &r.engine {
                Engine::Xla(x) => match &x.module {
                    Some(m) => format!("jax/{}", hlo_name(m)),
                    None => format!("jax/{}", file_name(&r.path)),
                },
                Engine::Torch(t) => match rank_of(r, t) {
                    Some(n) => format!("torch/rank{n}"),
                    None if plain_torch == 1 => "torch".to_string(),
                    None => format!("torch/{}", file_name(&r.path)),
                },
            };
            // The same key twice in one run (two hosts' captures of one module): keep both.
            let n = seen.entry(k.clone()).or_default();
            *n += 1;
            if *n > 1 { format!("{k}#{n}") } else { k }
        })
        .collect()
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// `jit_train_step(36)` → `jit_train_step`.
fn hlo_name(module: &str) -> &str {
    match module.rfind('(') {
        Some(i) if module.ends_with(')') => &module[..i],
        _ => module,
    }
}

/// A rank from the directory analysis, else from a file named `…rank<N>…` / `…rank_<N>…`.
fn rank_of(r: &CaptureReport, t: &crate::torch::summary::Summary) -> Option<usize> {
    t.rank
        .or_else(|| crate::torch::ranks::rank_in_name(&r.path))
}

/// The last two components of a recorded path (`proj/model.py`): stable across checkouts.
fn short_path(file: &str) -> String {
    let parts: Vec<&str> = file.split(['/', '\\']).filter(|p| !p.is_empty()).collect();
    parts[parts.len().saturating_sub(2)..].join("/")
}

/// The numbers of one report.
fn numbers(r: &CaptureReport) -> Vec<Number> {
    let total = |what: String, bytes: u64, label: Label, timing: bool| Number {
        what,
        bytes,
        label,
        timing,
        file: None,
        line: None,
        function: None,
    };
    let mut out = Vec::new();
    match &r.engine {
        Engine::Xla(x) => {
            if let Some(p) = &x.plan {
                out.push(total(
                    "plan total peak".into(),
                    p.total_peak_bytes,
                    Label::Read,
                    false,
                ));
                out.push(total(
                    "plan heap peak".into(),
                    p.heap_peak_bytes,
                    Label::Read,
                    false,
                ));
            }
            if let Some(b) = x.runtime.peak_bytes_in_use {
                out.push(total(
                    "runtime peak in use".into(),
                    b,
                    Label::Measured,
                    true,
                ));
            }
        }
        Engine::Torch(t) => {
            for d in &t.timeline {
                let peak = d.live_bytes_reconstructed.peak.max(0) as u64;
                if d.entries > 0 {
                    out.push(total(
                        format!("trace peak (device {})", d.device),
                        peak,
                        Label::Measured,
                        false,
                    ));
                }
            }
            for d in &t.devices {
                out.push(total(
                    format!("live at the snapshot (device {})", d.device),
                    d.memory.allocated_bytes,
                    Label::Measured,
                    false,
                ));
                out.push(total(
                    format!("reserved (device {})", d.device),
                    d.memory.reserved_bytes,
                    Label::Measured,
                    true,
                ));
            }
        }
    }
    for s in &r.sites {
        let Some(l) = &s.location else { continue };
        out.push(Number {
            what: "line".into(),
            bytes: s.bytes,
            label: s.label,
            timing: false,
            file: Some(short_path(&l.file)),
            line: Some(l.line),
            function: Some(l.function.clone()),
        });
    }
    out
}

/// Record the numbers of `reports` (analysed, not yet located: recorded paths are kept).
pub fn record(reports: &[CaptureReport]) -> Baseline {
    let mut b = Baseline {
        memlsp_baseline: VERSION,
        written_by: format!("memlsp {}", env!("CARGO_PKG_VERSION")),
        captures: BTreeMap::new(),
    };
    for (k, r) in keys(reports).into_iter().zip(reports) {
        b.captures.insert(
            k,
            Entry {
                source: r.path.display().to_string(),
                numbers: numbers(r),
            },
        );
    }
    b
}

/// Read a baseline file's text (`path` names it in errors).
pub fn parse(path: &Path, text: &str) -> Result<Baseline, String> {
    let b: Baseline = serde_json::from_str(text).map_err(|e| {
        format!(
            "{}: at byte {}: not a memlsp baseline ({e}); write one with `memlsp baseline PATH… -o {}`",
            path.display(),
            crate::error::json_error_offset(text.as_bytes(), &e),
            path.display()
        )
    })?;
    if b.memlsp_baseline != VERSION {
        return Err(format!(
            "{}: baseline format {} is not the {VERSION} this memlsp reads; record it again with `memlsp baseline`",
            path.display(),
            b.memlsp_baseline
        ));
    }
    Ok(b)
}

/// The baseline as the file's text.
pub fn to_json(b: &Baseline) -> String {
    serde_json::to_string_pretty(b).unwrap_or_default() + "\n"
}

/// Compare `reports` with `base`; append a BL001 finding to the report for every number that
/// grew past the threshold.
pub fn compare(reports: &mut [CaptureReport], base: &Baseline, opts: &CompareOptions) -> Outcome {
    let mut out = Outcome::default();
    let ks = keys(reports);
    let found_keys: Vec<Option<&String>> = ks
        .iter()
        .zip(reports.iter())
        .map(|(k, r)| baseline_key(base, k, r))
        .collect();
    for k in base.captures.keys() {
        if !found_keys.contains(&Some(k)) {
            out.missing_keys.push(k.clone());
        }
    }
    for ((k, found), r) in ks.iter().zip(found_keys).zip(reports.iter_mut()) {
        let Some(entry) = found.and_then(|f| base.captures.get(f)) else {
            out.new_keys.push(k.clone());
            continue;
        };
        let now = numbers(r);
        let mut found = Vec::new();
        // Totals gate; the plan's heap peak and the lines say where, once a total grew (a line
        // that grew while the totals did not is memory moving within the run, not more of it).
        let mut gate_grew = false;
        let mut components: Vec<(Option<&Number>, &Number)> = Vec::new();
        for old in &entry.numbers {
            if old.timing && !opts.timing {
                out.timing_skipped += 1;
                continue;
            }
            let Some(cur) = counterpart(old, &now, &entry.numbers) else {
                continue;
            };
            out.compared += 1;
            if is_component(old) {
                components.push((Some(old), cur));
            } else if grew(old.bytes, cur.bytes, opts) {
                gate_grew = true;
                found.push(finding(k, entry, old, cur, r, opts));
            }
        }
        // Lines of this run the baseline did not have.
        for cur in now.iter().filter(|n| n.what == "line") {
            if counterpart(cur, &entry.numbers, &now).is_none() {
                components.push((None, cur));
            }
        }
        if gate_grew {
            for (old, cur) in components {
                let zero = Number {
                    bytes: 0,
                    ..cur.clone()
                };
                let old = old.unwrap_or(&zero);
                if grew(old.bytes, cur.bytes, opts) {
                    found.push(finding(k, entry, old, cur, r, opts));
                }
            }
        }
        r.findings.extend(found);
        crate::findings::sort(&mut r.findings);
    }
    out
}

/// The plan's heap peak and the lines: they explain a grown total, they do not gate.
fn is_component(n: &Number) -> bool {
    n.what == "line" || n.what == "plan heap peak"
}

/// Growth past the threshold: more than `max_growth` of the old value and more than 1 MiB.
fn grew(old: u64, cur: u64, opts: &CompareOptions) -> bool {
    let g = cur.saturating_sub(old);
    g > MIN_GROWTH && (g as f64) > opts.max_growth * old as f64
}

/// The baseline number a line of this run is about (the reverse of [`counterpart`]).
/// The baseline's key for the report keyed `k` in this run. A lone snapshot is keyed `torch`
/// and one of several `torch/<file name>`, so a key depends on the rest of the run: each finds
/// the other when the baseline recorded the same file name, so a baseline recorded from several
/// snapshots checks one of them alone, and the other way round.
fn baseline_key<'b>(base: &'b Baseline, k: &str, r: &CaptureReport) -> Option<&'b String> {
    if let Some((key, _)) = base.captures.get_key_value(k) {
        return Some(key);
    }
    let name = file_name(&r.path);
    let same_file = |e: &Entry| file_name(Path::new(&e.source)) == name;
    if k == "torch" {
        base.captures
            .get_key_value(&format!("torch/{name}"))
            .map(|(key, _)| key)
    } else if k.strip_prefix("torch/") == Some(name.as_str()) {
        base.captures
            .get_key_value("torch")
            .filter(|(_, e)| same_file(e))
            .map(|(key, _)| key)
    } else {
        None
    }
}

/// The number of this run that `old` is about.
fn counterpart<'a>(old: &Number, now: &'a [Number], before: &[Number]) -> Option<&'a Number> {
    if old.what != "line" {
        return now.iter().find(|n| n.what == old.what);
    }
    if let Some(n) = now.iter().find(|n| {
        n.what == "line" && n.file == old.file && n.line == old.line && n.function == old.function
    }) {
        return Some(n);
    }
    // The line moved: the same file and function, when that pair is unique on both sides.
    let same = |n: &&Number| n.what == "line" && n.file == old.file && n.function == old.function;
    let then: Vec<&Number> = before.iter().filter(same).collect();
    let cands: Vec<&Number> = now.iter().filter(same).collect();
    (then.len() == 1 && cands.len() == 1).then(|| cands[0])
}

fn finding(
    key: &str,
    entry: &Entry,
    old: &Number,
    cur: &Number,
    r: &CaptureReport,
    opts: &CompareOptions,
) -> Finding {
    let pct = 100.0 * (cur.bytes as f64 - old.bytes as f64) / (old.bytes.max(1) as f64);
    let what = match (&cur.file, cur.line) {
        (Some(f), Some(l)) => format!(
            "bytes of {f}:{l} ({})",
            cur.function.as_deref().unwrap_or("")
        ),
        _ => cur.what.clone(),
    };
    let change = if old.bytes == 0 {
        "not among the baseline's top lines".to_string()
    } else {
        format!("+{pct:.0}% vs baseline")
    };
    let timing = if cur.timing {
        " (timing-dependent: compared because --timing was given)"
    } else {
        ""
    };
    let mut f = Finding::new(
        Code::BL001,
        Severity::Error,
        format!(
            "{change}: {} → {} ({what} of {key}; allowed +{:.0}%){timing}",
            fmt_bytes(old.bytes),
            fmt_bytes(cur.bytes),
            opts.max_growth * 100.0
        ),
    )
    .bytes(
        cur.bytes.saturating_sub(old.bytes),
        (old.bytes > 0).then_some(pct),
        cur.label,
    )
    .evidence(if old.bytes == 0 {
        Evidence::inferred(format!(
            "the baseline ({}) records its top lines only; this one was not among them",
            entry.source
        ))
    } else {
        Evidence::new(
            old.label,
            format!("baseline ({}): {}", entry.source, fmt_bytes(old.bytes)),
        )
    })
    .evidence(Evidence::new(
        cur.label,
        format!("this run ({}): {}", r.path.display(), fmt_bytes(cur.bytes)),
    ));
    f.scope = Some(key.to_string());
    match (&cur.file, cur.line) {
        (Some(_), Some(_)) => {
            // The site's own recorded location and stack: the locate step maps it.
            if let Some(s) = r.sites.iter().find(|s| {
                s.location.as_ref().is_some_and(|l| {
                    Some(short_path(&l.file)) == cur.file
                        && Some(l.line) == cur.line
                        && Some(&l.function) == cur.function.as_ref()
                })
            }) {
                f = f.at(s.location.clone(), s.stack.clone());
            }
        }
        _ => {
            if let Engine::Xla(x) = &r.engine {
                // A plan number belongs to the `jax.jit` that compiled the module.
                let loc: Option<Location> = x.call_site.first().cloned();
                f = f.at(loc, x.call_site.clone());
                if let Some(m) = &x.module {
                    let name = hlo_name(m);
                    f.refine = Some(Refine::JitLine {
                        function: name.strip_prefix("jit_").unwrap_or(name).to_string(),
                    });
                }
            }
        }
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growth_thresholds_parse_as_percentages() {
        assert_eq!(parse_growth("5%"), Ok(0.05));
        assert_eq!(parse_growth("5"), Ok(0.05));
        assert_eq!(parse_growth("0.05"), Ok(0.05));
        assert_eq!(parse_growth(" 12.5 % "), Ok(0.125));
        assert!(parse_growth("-1%").is_err());
        assert!(parse_growth("lots").is_err());
    }

    #[test]
    fn module_names_lose_their_program_id_and_paths_keep_two_parts() {
        assert_eq!(hlo_name("jit_train_step(36)"), "jit_train_step");
        assert_eq!(hlo_name("jit_f"), "jit_f");
        assert_eq!(short_path("/home/a/proj/model/net.py"), "model/net.py");
        assert_eq!(short_path("net.py"), "net.py");
    }
}
