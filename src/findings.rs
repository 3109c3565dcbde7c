//! One `Finding` type shared by the PyTorch and JAX engines and every presenter.
//!
//! Findings are plain data: a stable code, a severity, a message in the user's terms, the evidence
//! (each line labelled measured / read / inferred), the culprit location with its stack, and the
//! fixes. A fix names *what* to change (`FixKind`); `crate::source` turns it into a text edit
//! against the real file when that file exists.

use std::path::PathBuf;

use serde::Serialize;
use serde::ser::SerializeMap;

/// How a number was obtained. Every number shown to a user carries one of these.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Label {
    /// Counted from events or state in the capture (allocator blocks, trace entries, BFC events).
    Measured,
    /// Read verbatim from a field of the capture, or the reference tool's own mapping (a compiled
    /// plan's byte counts, xprof's line for a buffer).
    Read,
    /// Derived by reasoning (a role guess, a bound on a saving, an attribution of ours).
    Inferred,
    /// The recorded events replayed with a change through an allocator model that reproduces
    /// the recorded events of the same capture.
    Simulated,
}

impl Label {
    pub fn as_str(self) -> &'static str {
        match self {
            Label::Measured => "measured",
            Label::Read => "read",
            Label::Inferred => "inferred",
            Label::Simulated => "simulated",
        }
    }
}

/// What a finding is for: an attribution (where memory is, inlay-hint material) or a diagnosis
/// (a pattern, a cause, something to act on).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Attribution,
    Diagnosis,
}

/// Which engine emits a code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    Torch,
    Jax,
    Both,
}

/// Every finding code memlsp emits. The one place that spells a code: its pattern name, default
/// severity, kind and documentation page live here; everything else matches on the enum.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Code {
    PT001,
    PT002,
    PT003,
    PT004,
    PT005,
    PT006,
    PT007,
    PT008,
    PT009,
    PT010,
    PT011,
    PT012,
    PT013,
    PT014,
    PT015,
    PT016,
    PT017,
    PT018,
    PT019,
    PT020,
    JX001,
    JX002,
    JX003,
    JX004,
    JX005,
    JX006,
    JX007,
    JX008,
    JX009,
    JX010,
    BL001,
}

impl Code {
    /// Every code, in documentation order.
    pub const ALL: [Code; 31] = [
        Code::PT001,
        Code::PT002,
        Code::PT003,
        Code::PT004,
        Code::PT005,
        Code::PT006,
        Code::PT007,
        Code::PT008,
        Code::PT009,
        Code::PT010,
        Code::PT011,
        Code::PT012,
        Code::PT013,
        Code::PT014,
        Code::PT015,
        Code::PT016,
        Code::PT017,
        Code::PT018,
        Code::PT019,
        Code::PT020,
        Code::JX001,
        Code::JX002,
        Code::JX003,
        Code::JX004,
        Code::JX005,
        Code::JX006,
        Code::JX007,
        Code::JX008,
        Code::JX009,
        Code::JX010,
        Code::BL001,
    ];

    /// The stable code as users see it, e.g. `PT002`.
    pub fn as_str(self) -> &'static str {
        match self {
            Code::PT001 => "PT001",
            Code::PT002 => "PT002",
            Code::PT003 => "PT003",
            Code::PT004 => "PT004",
            Code::PT005 => "PT005",
            Code::PT006 => "PT006",
            Code::PT007 => "PT007",
            Code::PT008 => "PT008",
            Code::PT009 => "PT009",
            Code::PT010 => "PT010",
            Code::PT011 => "PT011",
            Code::PT012 => "PT012",
            Code::PT013 => "PT013",
            Code::PT014 => "PT014",
            Code::PT015 => "PT015",
            Code::PT016 => "PT016",
            Code::PT017 => "PT017",
            Code::PT018 => "PT018",
            Code::PT019 => "PT019",
            Code::PT020 => "PT020",
            Code::JX001 => "JX001",
            Code::JX002 => "JX002",
            Code::JX003 => "JX003",
            Code::JX004 => "JX004",
            Code::JX005 => "JX005",
            Code::JX006 => "JX006",
            Code::JX007 => "JX007",
            Code::JX008 => "JX008",
            Code::JX009 => "JX009",
            Code::JX010 => "JX010",
            Code::BL001 => "BL001",
        }
    }

    /// The code a string names (`PT002`), if any.
    pub fn parse(s: &str) -> Option<Code> {
        Code::ALL.into_iter().find(|c| c.as_str() == s)
    }

    /// Short pattern name, e.g. `retained autograd graph`.
    pub fn pattern(self) -> &'static str {
        match self {
            Code::PT001 => "top live-memory site",
            Code::PT002 => "retained autograd graph",
            Code::PT003 => "growing Python container",
            Code::PT004 => "first-step optimizer state",
            Code::PT005 => "activation pressure",
            Code::PT006 => "replicated gradients/params under DDP",
            Code::PT007 => "reference cycle",
            Code::PT008 => "fragmentation OOM",
            Code::PT009 => "OOM event",
            Code::PT010 => "delayed free",
            Code::PT011 => "growth between snapshots",
            Code::PT012 => "rank skew",
            Code::PT013 => "near-OOM (allocator retry)",
            Code::PT014 => "device skew in one process",
            Code::PT015 => "capture cannot attribute memory",
            Code::PT016 => "autocast weight cache",
            Code::PT017 => "OOM on the configured capacity",
            Code::PT018 => "materialised attention scores",
            Code::PT019 => "logits and loss over a large vocabulary",
            Code::PT020 => "model states dominate the peak",
            Code::JX001 => "plan exceeds capacity",
            Code::JX002 => "forward activations kept for backward",
            Code::JX003 => "backward dominates",
            Code::JX004 => "growth per execution",
            Code::JX005 => "no parameter donated",
            Code::JX006 => "other live arrays",
            Code::JX007 => "allocator retry / OOM",
            Code::JX008 => "XLA already rematerialized",
            Code::JX009 => "top buffer at peak",
            Code::JX010 => "oversized eval outputs",
            Code::BL001 => "grew past the baseline",
        }
    }

    /// The severity a finding of this code has unless the evidence says otherwise (DESIGN.md:
    /// error for an OOM cause, warning for a leak or waste with a fix, information for expected
    /// retention, hint for attribution).
    pub fn default_severity(self) -> Severity {
        match self {
            // A baseline breach fails the check whatever `--fail-on` says: the user asked for it.
            Code::PT008 | Code::PT009 | Code::PT017 | Code::JX001 | Code::JX007 | Code::BL001 => {
                Severity::Error
            }
            Code::PT002
            | Code::PT003
            | Code::PT006
            | Code::PT007
            | Code::PT011
            | Code::PT012
            | Code::PT013
            | Code::PT014
            | Code::PT016
            | Code::PT018
            | Code::PT019
            | Code::JX004
            | Code::JX005
            | Code::JX006
            | Code::JX010 => Severity::Warning,
            Code::PT004
            | Code::PT005
            | Code::PT010
            | Code::PT015
            | Code::PT020
            | Code::JX002
            | Code::JX003
            | Code::JX008 => Severity::Information,
            Code::PT001 | Code::JX009 => Severity::Hint,
        }
    }

    pub fn kind(self) -> Kind {
        match self {
            Code::PT001 | Code::JX009 => Kind::Attribution,
            _ => Kind::Diagnosis,
        }
    }

    pub fn family(self) -> Family {
        match self {
            Code::PT001
            | Code::PT002
            | Code::PT003
            | Code::PT004
            | Code::PT005
            | Code::PT006
            | Code::PT007
            | Code::PT008
            | Code::PT009
            | Code::PT010
            | Code::PT011
            | Code::PT012
            | Code::PT013
            | Code::PT014
            | Code::PT015
            | Code::PT016
            | Code::PT017
            | Code::PT018
            | Code::PT019
            | Code::PT020 => Family::Torch,
            Code::JX001
            | Code::JX002
            | Code::JX003
            | Code::JX004
            | Code::JX005
            | Code::JX006
            | Code::JX007
            | Code::JX008
            | Code::JX009
            | Code::JX010 => Family::Jax,
            Code::BL001 => Family::Both,
        }
    }

    /// What a message of this code is: our reading of the evidence (inferred), except PT009,
    /// whose message restates the recorded `oom` entry (its size, `device_free` and stack).
    pub fn message_label(self) -> Label {
        match self {
            Code::PT009 => Label::Read,
            _ => Label::Inferred,
        }
    }

    /// A pattern of memory kept across steps (a leak to confirm with a second snapshot).
    pub fn is_leak(self) -> bool {
        matches!(self, Code::PT002 | Code::PT003 | Code::PT007)
    }

    /// Path of the documentation page, relative to the repository root.
    pub fn docs_path(self) -> String {
        format!("docs/findings/{}.md", self.as_str())
    }

    /// Documentation page (the `codeDescription` link in editors, SARIF `helpUri`).
    pub fn docs_url(self) -> String {
        format!(
            "https://github.com/memlsp/memlsp/blob/main/{}",
            self.docs_path()
        )
    }
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Code {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// One line of evidence supporting a finding.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Evidence {
    pub label: Label,
    pub text: String,
}

impl Evidence {
    pub fn new(label: Label, text: impl Into<String>) -> Self {
        Evidence {
            label,
            text: text.into(),
        }
    }
    pub fn measured(text: impl Into<String>) -> Self {
        Evidence {
            label: Label::Measured,
            text: text.into(),
        }
    }
    pub fn read(text: impl Into<String>) -> Self {
        Evidence {
            label: Label::Read,
            text: text.into(),
        }
    }
    pub fn inferred(text: impl Into<String>) -> Self {
        Evidence {
            label: Label::Inferred,
            text: text.into(),
        }
    }
}

/// Severity as DESIGN.md defines it: error for an OOM cause, warning for a leak or waste with a
/// fix, information for expected retention, hint for attribution.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Hint,
    Information,
    Warning,
    Error,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Hint => "hint",
            Severity::Information => "information",
            Severity::Warning => "warning",
            Severity::Error => "error",
        }
    }
    pub fn parse(s: &str) -> Option<Severity> {
        match s.to_ascii_lowercase().as_str() {
            "hint" => Some(Severity::Hint),
            "info" | "information" | "note" => Some(Severity::Information),
            "warning" | "warn" => Some(Severity::Warning),
            "error" => Some(Severity::Error),
            _ => None,
        }
    }
}

/// A stack of source positions, innermost first. Shared rather than copied: across the ranks of
/// a job one stack is every rank's (`report DIR` keeps each distinct stack once, see
/// `analyze::analyze_ranks`).
pub type Stack = std::sync::Arc<[Location]>;

/// One copy of each distinct [`Stack`] among the stacks it is shown.
#[derive(Default)]
pub struct StackSet(std::collections::HashSet<Stack>);

impl StackSet {
    /// Make each of `stacks` the copy already kept when there is one (equal frames, resolution
    /// included), else keep it.
    pub fn share<'a>(&mut self, stacks: impl Iterator<Item = &'a mut Stack>) {
        for s in stacks.filter(|s| !s.is_empty()) {
            match self.0.get(&*s) {
                Some(kept) => *s = kept.clone(),
                None => {
                    self.0.insert(s.clone());
                }
            }
        }
    }
}

/// A source position as recorded in the capture (path as the capture wrote it, 1-based line),
/// and, once the locate step ran, the workspace file it is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Location {
    pub file: String,
    pub line: u32,
    pub function: String,
    /// Set by `crate::source::locate` when the recorded path is a workspace file.
    pub resolved: Option<Resolved>,
}

/// The workspace file a recorded path resolved to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Resolved {
    /// Absolute local path.
    pub local: PathBuf,
    /// As users see it: relative to the workspace root.
    pub shown: String,
}

impl Location {
    pub fn new(file: impl Into<String>, line: u32, function: impl Into<String>) -> Location {
        Location {
            file: file.into(),
            line,
            function: function.into(),
            resolved: None,
        }
    }

    /// The path users see: workspace-relative when it resolved, else as recorded.
    pub fn shown(&self) -> &str {
        self.resolved
            .as_ref()
            .map_or(self.file.as_str(), |r| r.shown.as_str())
    }

    /// The local file, when the recorded path resolved to one.
    pub fn local(&self) -> Option<&std::path::Path> {
        self.resolved.as_ref().map(|r| r.local.as_path())
    }

    /// Same recorded place (ignores how it was resolved).
    pub fn same_place(&self, other: &Location) -> bool {
        self.file == other.file && self.line == other.line && self.function == other.function
    }
}

/// `file`, `line`, `function` of a place, `null`s when there is none (the JSON contract).
pub fn serialize_place<M: SerializeMap>(m: &mut M, loc: Option<&Location>) -> Result<(), M::Error> {
    m.serialize_entry("file", &loc.map(Location::shown))?;
    m.serialize_entry("line", &loc.map(|l| l.line))?;
    m.serialize_entry("function", &loc.map(|l| l.function.as_str()))
}

impl Serialize for Location {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(3))?;
        serialize_place(&mut m, Some(self))?;
        m.end()
    }
}

/// What a fix changes. The analysis names the change; `crate::source::edits` computes the text
/// edit against the current file text (or the editor's buffer).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FixKind {
    /// PT002: in the accumulating expression on the culprit line, `name` → `name.detach()`
    /// (or `.item()` when `item` is set).
    DetachAccumulated { item: bool },
    /// PT003: `.append(x)` → `.append(x.detach().cpu())` on the culprit line.
    DetachCpuAppend,
    /// JX005: add `donate_argnums=(…)` to the `jax.jit(...)` call or decorator on/near the line.
    /// `args` names each donated argument with its position as the plan's parameter order
    /// suggests; the locate step corrects positions from the function's signature.
    DonateArgnums {
        argnums: Vec<u32>,
        #[serde(skip)]
        args: Vec<(Option<String>, u32)>,
    },
    /// JX002: put `@jax.checkpoint` on the function that owns the line.
    JaxCheckpoint,
    /// JX004: `list.append(x)` of step outputs → `append(jax.device_get(x))`.
    DeviceGetAppend,
    /// PT008: set `PYTORCH_ALLOC_CONF` before `import torch` in the entry script.
    AllocConf { value: String },
    /// PT005 (forward with no backward): the loop that runs the forward (or the statement) put
    /// under `with torch.inference_mode():`.
    InferenceMode,
    /// PT005 (two graphs at the peak): drop the previous output before the forward that rebinds
    /// it (`out = None` inserted before `out = model(x)` in the loop).
    DropOutput,
    /// PT018: call `torch.nn.functional.scaled_dot_product_attention` instead of the hand-written
    /// attention `callee` on the line — a suggestion (arguments and mask convention to check).
    ScaledDotProductAttention { callee: String },
    /// Advice with no local edit (the presenter shows it; code actions offer an explanation).
    Advice,
}

/// A concrete text edit: replace `[start_col, end_col)` (0-based UTF-8 byte columns) on
/// `line` (1-based) of `file` with `new_text`. An insertion has `start_col == end_col`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TextEdit {
    /// The local file.
    pub file: String,
    pub line: u32,
    pub start_col: u32,
    pub end_col: u32,
    pub new_text: String,
    /// `file` as users see it (workspace-relative), set by the locate step.
    pub shown: Option<String>,
}

impl Serialize for TextEdit {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(5))?;
        m.serialize_entry("file", self.shown.as_deref().unwrap_or(&self.file))?;
        m.serialize_entry("line", &self.line)?;
        m.serialize_entry("start_col", &self.start_col)?;
        m.serialize_entry("end_col", &self.end_col)?;
        m.serialize_entry("new_text", &self.new_text)?;
        m.end()
    }
}

/// A fix replayed through the allocator model (label: simulated): the recorded events of the
/// same capture with the change, in a replay that reproduces the recorded ones.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Simulated {
    /// The device whose trace was replayed.
    pub device: i64,
    pub peak_allocated_before: u64,
    pub peak_allocated_after: u64,
    pub peak_reserved_before: u64,
    pub peak_reserved_after: u64,
    /// For a capture with an OOM: whether every recorded OOM's request would have been served.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oom_avoided: Option<bool>,
    /// Where the allocator's OOM path served a malloc (a cudaMalloc refused, the cache released,
    /// the malloc retried and served) before or after the change: how often, in the recorded run
    /// replayed and with the change (a malloc the path could not serve is an OOM, told by
    /// `oom_avoided`). A retry costs a device synchronisation and a refill of the cache.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oom_retries: Option<OomRetries>,
    /// What the change modelled, in words (`activations dropped in the forward, made again just
    /// before their backward use`).
    pub change: String,
}

/// How many mallocs the allocator's OOM path served, before and after a change (simulated).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct OomRetries {
    pub before: u64,
    pub after: u64,
}

impl Simulated {
    /// `peak 596.17 MiB → 88.11 MiB (simulated)`, or what became of the OOM: the words every
    /// presenter shows after a fix's title.
    pub fn summary(&self) -> String {
        format!("{} (simulated)", self.outcome())
    }

    /// [`Simulated::summary`] without its label, for presenters that label it their way.
    pub fn outcome(&self) -> String {
        match self.retries_words() {
            Some(r) => format!("{}; {r}", self.peak_words()),
            None => self.peak_words(),
        }
    }

    /// What became of the OOM and the peak: `the OOM would not happen; peak 78.29 GiB → 24.00
    /// GiB` ([`Simulated::outcome`] without the retries, for a presenter that adds the reserved
    /// peak before them).
    pub fn peak_words(&self) -> String {
        let peak = if self.peak_allocated_after == self.peak_allocated_before {
            format!(
                "peak unchanged at {}",
                fmt_bytes(self.peak_allocated_before)
            )
        } else {
            format!(
                "peak {} → {}",
                fmt_bytes(self.peak_allocated_before),
                fmt_bytes(self.peak_allocated_after)
            )
        };
        match self.oom_avoided {
            Some(true) => format!("the OOM would not happen; {peak}"),
            Some(false) => format!("the OOM would still happen; {peak}"),
            None => peak,
        }
    }

    /// `OOM-path retries 39 → 20`, where either run took the allocator's OOM path.
    pub fn retries_words(&self) -> Option<String> {
        let r = self.oom_retries?;
        Some(if r.before == r.after {
            format!("OOM-path retries unchanged at {}", r.before)
        } else {
            format!("OOM-path retries {} → {}", r.before, r.after)
        })
    }
}

/// Where a fix's edit goes: the culprit line, or for an allocator setting the entry script.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FixTarget {
    pub file: PathBuf,
    pub line: u32,
}

/// How a fix's estimated saving (always inferred) is stated after its title.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SavingNote {
    /// The title already says the amount: only the label is added.
    InTitle,
    /// `~1.00 GiB`, or a range `1.00–2.00 GiB` (a bound from the plan).
    Amount(String),
}

/// One way to act on a finding, with what it is expected to save.
#[derive(Clone, Debug, PartialEq)]
pub struct Fix {
    pub title: String,
    /// Estimated bytes saved (inferred); with a `saving_range`, its lower end.
    pub saving_bytes: Option<u64>,
    /// What the fix costs (recompute, smaller batch, …), in words.
    pub cost: Option<String>,
    /// The fix replayed through the allocator model (PyTorch).
    pub simulated: Option<Simulated>,
    /// A bound on the saving, computed from the plan (JAX): `[low, high]` bytes, inferred; the
    /// real saving lies inside. Never wider than half its upper end (`saving_range_says`).
    pub saving_range: Option<(u64, u64)>,
    pub kind: FixKind,
    /// Set by the locate step: the file and line the fix edits, when it is a local edit and the
    /// file resolved.
    pub target: Option<FixTarget>,
    /// Set by the locate step: the edit against the file's text when the line still matches.
    pub edit: Option<Vec<TextEdit>>,
    /// Whether an editor should mark this fix as the preferred quick fix.
    pub preferred: bool,
}

impl Serialize for Fix {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("title", &self.title)?;
        if let Some(b) = self.saving_bytes {
            m.serialize_entry("saving_bytes", &b)?;
        }
        if let Some(c) = &self.cost {
            m.serialize_entry("cost", c)?;
        }
        if let Some(sim) = &self.simulated {
            m.serialize_entry("simulated", sim)?;
        }
        if let Some((lo, hi)) = self.saving_range {
            m.serialize_entry("saving_range", &[lo, hi])?;
        }
        if let Some(e) = &self.edit {
            m.serialize_entry("edit", e)?;
        }
        m.end()
    }
}

impl Fix {
    pub fn advice(title: impl Into<String>) -> Self {
        Fix {
            title: title.into(),
            saving_bytes: None,
            cost: None,
            simulated: None,
            saving_range: None,
            kind: FixKind::Advice,
            target: None,
            edit: None,
            preferred: false,
        }
    }
    pub fn new(title: impl Into<String>, kind: FixKind) -> Self {
        Fix {
            title: title.into(),
            saving_bytes: None,
            cost: None,
            simulated: None,
            saving_range: None,
            kind,
            target: None,
            edit: None,
            preferred: false,
        }
    }
    /// What a presenter says about the saving; none for a fix that saves nothing stated.
    pub fn saving_note(&self) -> Option<SavingNote> {
        let amount = match (self.saving_range, self.saving_bytes.filter(|b| *b > 0)) {
            (Some((lo, hi)), _) => fmt_range(lo, hi),
            (None, Some(b)) => fmt_bytes(b),
            (None, None) => return None,
        };
        Some(if self.title.contains(&amount) {
            SavingNote::InTitle
        } else if self.saving_range.is_some() {
            SavingNote::Amount(amount)
        } else {
            SavingNote::Amount(format!("~{amount}"))
        })
    }

    pub fn saving(mut self, bytes: u64) -> Self {
        self.saving_bytes = Some(bytes);
        self
    }
    /// The saving bounded to `[lo, hi]` bytes (inferred): the range, and its lower end as the
    /// one number.
    pub fn saving_range(mut self, lo: u64, hi: u64) -> Self {
        let (lo, hi) = (lo.min(hi), hi.max(lo));
        self.saving_range = Some((lo, hi));
        self.saving_bytes = Some(lo);
        self
    }
    pub fn cost(mut self, cost: impl Into<String>) -> Self {
        self.cost = Some(cost.into());
        self
    }
    pub fn preferred(mut self) -> Self {
        self.preferred = true;
        self
    }
}

/// A finding's location as the engine could give it, to be made exact by the locate step
/// from the program text (the engines never read source files).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refine {
    /// The location is the call site of a jitted function: move it to the `jax.jit(...)` call or
    /// decorator that compiled `function`.
    JitLine { function: String },
    /// The location is a function's `def` line: move it to the first line of its body that
    /// contains `needle`.
    InFunction { needle: &'static str },
}

/// A diagnosis pinned (when possible) to a source line.
#[derive(Clone, Debug, PartialEq)]
pub struct Finding {
    /// Stable code, e.g. `PT002`, `JX005`; its pattern name is `code.pattern()`.
    pub code: Code,
    pub severity: Severity,
    /// One sentence in the seed's terms.
    pub message: String,
    /// Culprit line (first user frame), if the capture names one.
    pub location: Option<Location>,
    /// The rest of the stack, innermost first (starting with the culprit frame).
    pub stack: Stack,
    pub bytes: Option<u64>,
    pub percent: Option<f64>,
    /// What kind of number `bytes` is (set with it).
    pub bytes_label: Option<Label>,
    pub evidence: Vec<Evidence>,
    pub fixes: Vec<Fix>,
    /// Which rank / device / module the finding is about, for merging and messages.
    pub scope: Option<String>,
    /// How the locate step can make `location` exact.
    pub refine: Option<Refine>,
}

impl Serialize for Finding {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("code", &self.code)?;
        m.serialize_entry("pattern", self.code.pattern())?;
        m.serialize_entry("severity", &self.severity)?;
        m.serialize_entry("message", &self.message)?;
        serialize_place(&mut m, self.location.as_ref())?;
        m.serialize_entry("bytes", &self.bytes)?;
        m.serialize_entry("percent", &self.percent)?;
        if let Some(l) = self.bytes_label {
            m.serialize_entry("bytes_label", &l)?;
        }
        if let Some(scope) = &self.scope {
            m.serialize_entry("scope", scope)?;
        }
        m.serialize_entry("evidence", &self.evidence)?;
        m.serialize_entry("fixes", &self.fixes)?;
        m.serialize_entry("stack", &self.stack)?;
        m.serialize_entry("docs", &self.code.docs_url())?;
        m.end()
    }
}

impl Finding {
    pub fn new(code: Code, severity: Severity, message: impl Into<String>) -> Self {
        Finding {
            code,
            severity,
            message: message.into(),
            location: None,
            stack: Stack::default(),
            bytes: None,
            percent: None,
            bytes_label: None,
            evidence: Vec::new(),
            fixes: Vec::new(),
            scope: None,
            refine: None,
        }
    }
    pub fn at(mut self, location: Option<Location>, stack: impl Into<Stack>) -> Self {
        self.location = location;
        self.stack = stack.into();
        self
    }
    /// The bytes the finding is about, their share, and what kind of number they are.
    pub fn bytes(mut self, bytes: u64, percent: Option<f64>, label: Label) -> Self {
        self.bytes = Some(bytes);
        self.percent = percent;
        self.bytes_label = Some(label);
        self
    }
    pub fn evidence(mut self, e: Evidence) -> Self {
        self.evidence.push(e);
        self
    }
    pub fn fix(mut self, f: Fix) -> Self {
        self.fixes.push(f);
        self
    }
}

/// Most severe first; within a severity, more bytes first; otherwise in the order found.
pub fn sort(findings: &mut [Finding]) {
    findings.sort_by(|a, b| {
        b.severity
            .cmp(&a.severity)
            .then(b.bytes.unwrap_or(0).cmp(&a.bytes.unwrap_or(0)))
    });
}

/// What a fix saves: the replayed saving where it was simulated (peak before − after), else
/// its stated estimate; `None` when it states none.
pub fn fix_saving(x: &Fix) -> Option<u64> {
    match &x.simulated {
        Some(s) => Some(
            s.peak_allocated_before
                .saturating_sub(s.peak_allocated_after),
        ),
        None => x.saving_bytes,
    }
}

/// What acting on a finding saves: the most any of its fixes saves (0 when none says).
pub fn finding_saving(f: &Finding) -> u64 {
    f.fixes.iter().filter_map(fix_saving).max().unwrap_or(0)
}

/// The finding a headline leads with: among the diagnoses at information or above, the one
/// whose fix saves the most; ties (findings that state no saving among them) go to the more
/// severe, then to the first in `findings`' order.
pub fn lead(findings: &[Finding]) -> Option<&Finding> {
    findings
        .iter()
        .enumerate()
        .filter(|(_, f)| f.code.kind() == Kind::Diagnosis && f.severity >= Severity::Information)
        .max_by_key(|(i, f)| (finding_saving(f), f.severity, std::cmp::Reverse(*i)))
        .map(|(_, f)| f)
}

/// Human-readable byte count: `1.50 GiB`, `512 B`.
pub fn fmt_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.2} {}", UNITS[unit])
}

/// Whether `[lo, hi]` says something about a saving: no wider than half its upper end
/// (`[0, everything]` does not).
pub fn saving_range_says(lo: u64, hi: u64) -> bool {
    lo <= hi && hi - lo <= hi / 2
}

/// `76.07–116.07 MiB` (one unit when both ends share it), `512.00 KiB–1.50 MiB`, `0 B` for an
/// empty range.
pub fn fmt_range(lo: u64, hi: u64) -> String {
    let (a, b) = (fmt_bytes(lo), fmt_bytes(hi));
    if a == b {
        return a;
    }
    match (a.rsplit_once(' '), b.rsplit_once(' ')) {
        (Some((x, u)), Some((y, v))) if u == v => format!("{x}–{y} {u}"),
        _ => format!("{a}–{b}"),
    }
}

/// Signed variant of [`fmt_bytes`] for deltas.
pub fn fmt_signed_bytes(bytes: i128) -> String {
    let mag = bytes.unsigned_abs().min(u64::MAX as u128) as u64;
    if bytes < 0 {
        format!("-{}", fmt_bytes(mag))
    } else {
        format!("+{}", fmt_bytes(mag))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saving_is_stated_once_with_its_amount_or_left_to_the_title() {
        let fix = |title: &str| Fix::new(title, FixKind::Advice);
        assert_eq!(
            fix("detach it").saving(1 << 30).saving_note(),
            Some(SavingNote::Amount("~1.00 GiB".into()))
        );
        assert_eq!(
            fix("donate it: saves 1.00 GiB")
                .saving(1 << 30)
                .saving_note(),
            Some(SavingNote::InTitle)
        );
        assert_eq!(
            fix("checkpoint")
                .saving_range(1 << 30, 3 << 29)
                .saving_note(),
            Some(SavingNote::Amount("1.00–1.50 GiB".into()))
        );
        assert_eq!(fix("a smaller pool").saving(0).saving_note(), None);
        assert_eq!(fix("look").saving_note(), None);
    }

    #[test]
    fn bytes_are_formatted_in_binary_units() {
        assert_eq!(fmt_bytes(0), "0 B");
        assert_eq!(fmt_bytes(1023), "1023 B");
        assert_eq!(fmt_bytes(1536), "1.50 KiB");
        assert_eq!(fmt_bytes(11_844_714_496), "11.03 GiB");
        assert_eq!(fmt_signed_bytes(-2048), "-2.00 KiB");
    }

    #[test]
    fn saving_ranges_are_formatted_and_must_say_something() {
        assert_eq!(fmt_range(76 << 20, 116 << 20), "76.00–116.00 MiB");
        assert_eq!(fmt_range(512 << 10, 3 << 19), "512.00 KiB–1.50 MiB");
        assert_eq!(fmt_range(0, 0), "0 B");
        assert!(saving_range_says(0, 0));
        assert!(saving_range_says(50, 100));
        assert!(!saving_range_says(49, 100));
        assert!(!saving_range_says(0, 1 << 30));
        let f = Fix::advice("x").saving_range(10, 5);
        assert_eq!((f.saving_range, f.saving_bytes), (Some((5, 10)), Some(5)));
    }

    #[test]
    fn severity_orders_from_hint_to_error() {
        assert!(Severity::Error > Severity::Warning);
        assert!(Severity::Warning > Severity::Information);
        assert!(Severity::Information > Severity::Hint);
        assert_eq!(Severity::parse("info"), Some(Severity::Information));
        assert_eq!(Severity::parse("bogus"), None);
    }
}
