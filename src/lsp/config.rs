//! Server settings: the `memlsp` section of `workspace/configuration` (or `initializationOptions`).
//!
//! Unknown keys are ignored and a wrong type falls back to the default for that key, with a note
//! the server logs once; a bad setting never stops the server.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::frames::FrameFilter;
use crate::options::Options;

/// Default capture globs (DESIGN.md): PyTorch pickles and JSON snapshots, JAX/XLA captures.
pub const DEFAULT_GLOBS: [&str; 4] = [
    "**/*.pickle",
    "**/*.pkl",
    "**/*snapshot*.json",
    "**/*.xplane.pb",
];

/// What [`Settings::options_key`] compares.
pub type OptionsKey<'a> = (
    usize,
    u64,
    Option<u64>,
    &'a [String],
    Option<u64>,
    &'a [crate::options::Category],
);

/// Everything the user can set.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    pub capture_globs: Vec<String>,
    /// `(recorded prefix, local prefix)`, longest recorded prefix first.
    pub path_mappings: Vec<(String, String)>,
    pub user_frame_excludes: Vec<String>,
    pub inlay_hints: bool,
    /// Sites below this share (percent) get no inlay hint: a `0% live memory` hint is noise.
    pub inlay_min_percent: f64,
    /// Sites smaller than this get no inlay hint (a share of a tiny heap says little).
    pub inlay_min_bytes: u64,
    pub max_file_bytes: u64,
    /// `maxModelBytes`: snapshots whose model would hold more are refused (`None`: 8 × the
    /// file's size, at least 64 MiB).
    pub max_model_bytes: Option<u64>,
    pub top_sites: usize,
    /// `scan.maxCaptures` / `scan.maxBytes`: what the start-up scan hands to the analyses.
    pub scan: crate::lsp::workspace::ScanBudget,
    /// `scan.maxReportBytes`: estimated memory of the cached reports (`lsp::cache`).
    pub max_report_bytes: u64,
    /// A "Show memory timeline" code lens on every finding's line.
    pub code_lens: bool,
    /// `baseline.file`: a baseline (`memlsp baseline`) to compare every capture with (BL001);
    /// relative paths are taken from the first workspace folder.
    pub baseline_file: Option<String>,
    /// `baseline.maxGrowth`: allowed growth in percent.
    pub baseline_max_growth: f64,
    /// `baseline.timing`: also compare timing-dependent numbers.
    pub baseline_timing: bool,
    /// `capacity`: the device to replay each capture on (bytes, `24GiB` or a GPU name less
    /// `capacityReserve`); the first request that fails there is a PT017 diagnostic.
    pub capacity: Option<u64>,
    /// `categories`: `["NAME=REGEX", …]`, as `report --category` (the page's and the hovers'
    /// breakdown at the peak).
    pub categories: Vec<crate::options::Category>,
}

impl Default for Settings {
    fn default() -> Self {
        let opts = Options::default();
        Settings {
            capture_globs: DEFAULT_GLOBS.iter().map(|s| s.to_string()).collect(),
            path_mappings: Vec::new(),
            user_frame_excludes: Vec::new(),
            inlay_hints: true,
            inlay_min_percent: 1.0,
            inlay_min_bytes: 1 << 20,
            max_file_bytes: opts.decode.max_file_bytes,
            max_model_bytes: opts.decode.max_model_bytes,
            top_sites: opts.analysis.top,
            scan: Default::default(),
            max_report_bytes: crate::lsp::cache::DEFAULT_MAX_REPORT_BYTES,
            code_lens: true,
            baseline_file: None,
            baseline_max_growth: 5.0,
            baseline_timing: false,
            capacity: None,
            categories: Vec::new(),
        }
    }
}

impl Settings {
    /// Parse the `memlsp` section. Accepts the section itself or an object holding a `memlsp` key
    /// (what `didChangeConfiguration` sends in the push model). Returns the settings and the
    /// problems found (wrong types), to be logged.
    pub fn from_json(value: &Value) -> (Settings, Vec<String>) {
        let mut s = Settings::default();
        let mut problems = Vec::new();
        let v = match value.get("memlsp") {
            Some(inner) if inner.is_object() => inner,
            _ => value,
        };
        let Some(obj) = v.as_object() else {
            return (s, problems);
        };
        if let Some(g) = obj.get("captureGlobs") {
            match string_list(g) {
                Some(list) if !list.is_empty() => s.capture_globs = list,
                Some(_) => {}
                None => problems.push("captureGlobs must be a list of strings".into()),
            }
        }
        if let Some(m) = obj.get("pathMappings") {
            match m.as_object() {
                Some(map) => {
                    for (k, v) in map {
                        match v.as_str() {
                            Some(local) => s.path_mappings.push((k.clone(), local.to_string())),
                            None => problems.push(format!("pathMappings[{k:?}] must be a string")),
                        }
                    }
                    // Longest recorded prefix first, so `/a/b` wins over `/a`.
                    s.path_mappings
                        .sort_by_key(|m| std::cmp::Reverse(m.0.len()));
                }
                None => problems.push(
                    "pathMappings must be an object {\"recorded prefix\": \"local path\"}".into(),
                ),
            }
        }
        if let Some(e) = obj.get("userFrameExcludes") {
            match string_list(e) {
                Some(list) => s.user_frame_excludes = list,
                None => problems.push("userFrameExcludes must be a list of strings".into()),
            }
        }
        let inlay = obj
            .get("inlayHints")
            .and_then(|h| h.get("enable"))
            .or_else(|| obj.get("inlayHints.enable"));
        if let Some(b) = inlay {
            match b.as_bool() {
                Some(b) => s.inlay_hints = b,
                None => problems.push("inlayHints.enable must be true or false".into()),
            }
        }
        if let Some(p) = obj.get("inlayHints").and_then(|h| h.get("minPercent")) {
            match p.as_f64() {
                Some(p) if p >= 0.0 => s.inlay_min_percent = p,
                _ => problems.push("inlayHints.minPercent must be a number >= 0".into()),
            }
        }
        if let Some(b) = obj.get("inlayHints").and_then(|h| h.get("minBytes")) {
            match b.as_u64() {
                Some(b) => s.inlay_min_bytes = b,
                None => problems.push("inlayHints.minBytes must be a non-negative integer".into()),
            }
        }
        let lens = obj
            .get("codeLens")
            .and_then(|h| h.get("enable"))
            .or_else(|| obj.get("codeLens.enable"));
        if let Some(b) = lens {
            match b.as_bool() {
                Some(b) => s.code_lens = b,
                None => problems.push("codeLens.enable must be true or false".into()),
            }
        }
        if let Some(b) = obj.get("baseline") {
            match b {
                Value::Null => {}
                Value::String(f) if !f.is_empty() => s.baseline_file = Some(f.clone()),
                Value::Object(o) => {
                    match o.get("file") {
                        Some(Value::String(f)) if !f.is_empty() => {
                            s.baseline_file = Some(f.clone())
                        }
                        None | Some(Value::Null) => {}
                        Some(_) => problems.push("baseline.file must be a path".into()),
                    }
                    if let Some(g) = o.get("maxGrowth") {
                        match g.as_f64() {
                            Some(g) if g >= 0.0 => s.baseline_max_growth = g,
                            _ => {
                                problems.push("baseline.maxGrowth must be a percentage >= 0".into())
                            }
                        }
                    }
                    if let Some(t) = o.get("timing") {
                        match t.as_bool() {
                            Some(t) => s.baseline_timing = t,
                            None => problems.push("baseline.timing must be true or false".into()),
                        }
                    }
                }
                _ => problems.push(
                    "baseline must be a path or {\"file\", \"maxGrowth\", \"timing\"}".into(),
                ),
            }
        }
        if let Some(n) = obj.get("maxFileBytes") {
            match n.as_u64() {
                Some(n) => s.max_file_bytes = n,
                None => problems.push("maxFileBytes must be a positive integer".into()),
            }
        }
        if let Some(scan) = obj.get("scan").and_then(Value::as_object) {
            match scan.get("maxCaptures").map(Value::as_u64) {
                None => {}
                Some(Some(n)) if n > 0 => s.scan.max_captures = n as usize,
                Some(_) => problems.push("scan.maxCaptures must be a positive integer".into()),
            }
            match scan.get("maxEntries").map(Value::as_u64) {
                None => {}
                Some(Some(n)) if n > 0 => s.scan.max_entries = n as usize,
                Some(_) => problems.push("scan.maxEntries must be a positive integer".into()),
            }
            match scan.get("maxBytes").map(Value::as_u64) {
                None => {}
                Some(Some(n)) if n > 0 => s.scan.max_bytes = n,
                Some(_) => problems.push("scan.maxBytes must be a positive integer".into()),
            }
            match scan.get("maxReportBytes").map(Value::as_u64) {
                None => {}
                Some(Some(n)) if n > 0 => s.max_report_bytes = n,
                Some(_) => problems.push("scan.maxReportBytes must be a positive integer".into()),
            }
        }
        if let Some(n) = obj.get("maxModelBytes") {
            match n.as_u64() {
                Some(n) if n > 0 => s.max_model_bytes = Some(n),
                _ => problems.push("maxModelBytes must be a positive integer".into()),
            }
        }
        let reserve = match obj.get("capacityReserve") {
            None => crate::present::capacity::DEFAULT_CONTEXT_RESERVE,
            Some(r) => match r
                .as_u64()
                .or_else(|| r.as_str().and_then(crate::present::capacity::parse_size))
            {
                Some(r) => r,
                None => {
                    problems.push("capacityReserve must be a size (512MiB or bytes)".into());
                    crate::present::capacity::DEFAULT_CONTEXT_RESERVE
                }
            },
        };
        match obj.get("capacity") {
            None | Some(Value::Null) => {}
            Some(Value::Number(n)) => match n.as_u64() {
                Some(b) => s.capacity = Some(b),
                None => problems.push("capacity must be a size, bytes or a GPU name".into()),
            },
            Some(Value::String(c)) if c.trim().is_empty() => {}
            Some(Value::String(c)) => match crate::present::capacity::parse(c, reserve) {
                Ok(c) => s.capacity = Some(c.bytes),
                Err(e) => problems.push(format!("capacity: {e}")),
            },
            Some(_) => problems.push("capacity must be a size, bytes or a GPU name".into()),
        }
        if let Some(c) = obj.get("categories") {
            match c
                .as_array()
                .map(|l| l.iter().map(Value::as_str).collect::<Option<Vec<_>>>())
            {
                Some(Some(list)) => {
                    s.categories.clear();
                    for item in list {
                        match crate::options::Category::parse(item) {
                            Ok(cat) => s.categories.push(cat),
                            Err(e) => problems.push(format!("categories: {e}")),
                        }
                    }
                }
                _ => problems.push("categories must be a list of \"NAME=REGEX\" strings".into()),
            }
        }
        if let Some(n) = obj.get("topSites") {
            match n.as_u64() {
                Some(n) if n > 0 => s.top_sites = n as usize,
                _ => problems.push("topSites must be a positive integer".into()),
            }
        }
        (s, problems)
    }

    /// The decode and analysis options these settings imply (the workspace is the server's).
    pub fn options(&self) -> Options {
        let mut opts = Options::default();
        opts.analysis.top = self.top_sites;
        opts.decode.max_file_bytes = self.max_file_bytes;
        opts.decode.max_model_bytes = self.max_model_bytes;
        opts.analysis.frames = FrameFilter::new(self.user_frame_excludes.clone());
        opts.analysis.capacity = self.capacity;
        opts.analysis.categories = self.categories.clone();
        opts
    }

    /// The settings that change engine results (a change invalidates the cache). Path mappings
    /// only change the locate step, which runs again on every publish.
    pub fn options_key(&self) -> OptionsKey<'_> {
        (
            self.top_sites,
            self.max_file_bytes,
            self.max_model_bytes,
            &self.user_frame_excludes,
            self.capacity,
            &self.categories,
        )
    }

    /// The baseline file, absolute (relative paths from the first root).
    pub fn baseline_path(&self, roots: &[PathBuf]) -> Option<PathBuf> {
        Some(workspace_path(self.baseline_file.as_ref()?, roots))
    }

    /// `pathMappings` with `${workspaceFolder}` expanded and relative local paths joined to the
    /// first root.
    pub fn mappings(&self, roots: &[PathBuf]) -> Vec<(String, PathBuf)> {
        self.path_mappings
            .iter()
            .map(|(recorded, local)| (recorded.clone(), workspace_path(local, roots)))
            .collect()
    }
}

fn string_list(v: &Value) -> Option<Vec<String>> {
    v.as_array()?
        .iter()
        .map(|x| x.as_str().map(str::to_string))
        .collect()
}

/// A setting's path with `${workspaceFolder}` expanded, relative paths joined to the first root.
fn workspace_path(setting: &str, roots: &[PathBuf]) -> PathBuf {
    let first = roots
        .first()
        .map(PathBuf::as_path)
        .unwrap_or(Path::new("."));
    let p = PathBuf::from(setting.replace("${workspaceFolder}", &first.to_string_lossy()));
    if p.is_absolute() { p } else { first.join(p) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_every_key_and_keeps_defaults_for_missing_ones() {
        let (s, problems) = Settings::from_json(&json!({
            "captureGlobs": ["runs/**/*.pickle"],
            "pathMappings": {"/srv": "${workspaceFolder}/x", "/srv/jaxdemo": "jax"},
            "inlayHints": {"enable": false},
            "topSites": 3
        }));
        assert!(problems.is_empty());
        assert_eq!(s.capture_globs, vec!["runs/**/*.pickle"]);
        assert!(!s.inlay_hints);
        assert_eq!(s.top_sites, 3);
        assert_eq!(s.max_file_bytes, Options::default().decode.max_file_bytes);
        let m = s.mappings(&[PathBuf::from("/ws")]);
        assert_eq!(m[0], ("/srv/jaxdemo".into(), PathBuf::from("/ws/jax")));
        assert_eq!(m[1], ("/srv".into(), PathBuf::from("/ws/x")));
    }

    #[test]
    fn wrong_types_are_reported_not_fatal() {
        let (s, problems) =
            Settings::from_json(&json!({"memlsp": {"topSites": "ten", "captureGlobs": 3}}));
        assert_eq!(problems.len(), 2);
        assert_eq!(s, Settings::default());
    }
}
