//! What the pipeline hands to every presenter: one `CaptureReport` per capture (per rank, per
//! host), holding the engine's typed summary, the top sites and the findings. Nothing in it needs
//! the capture any more: a gigabyte snapshot is dropped once its report exists.
//!
//! The headline is derived here, once, from the findings (`crate::findings::lead`) or, when
//! nothing is wrong, from the engine's numbers; every presenter shows the same sentence.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::ser::SerializeMap;

use crate::findings::{Finding, fmt_bytes, lead};
pub use crate::site::{PercentOf, Site, SiteFrame, SiteRole};

/// The two kinds of evidence memlsp reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum CaptureKind {
    #[serde(rename = "torch-snapshot")]
    TorchSnapshot,
    #[serde(rename = "xla-capture")]
    XlaCapture,
}

impl CaptureKind {
    pub fn as_str(self) -> &'static str {
        match self {
            CaptureKind::TorchSnapshot => "torch-snapshot",
            CaptureKind::XlaCapture => "xla-capture",
        }
    }
}

/// The engine-specific part of a report.
#[derive(Clone, Debug)]
pub enum Engine {
    Torch(Box<crate::torch::summary::Summary>),
    Xla(Box<crate::xla::summary::Summary>),
}

/// Everything known about one capture, ready to present.
#[derive(Clone, Debug)]
pub struct CaptureReport {
    pub path: PathBuf,
    pub engine: Engine,
    /// Top sites, largest first.
    pub sites: Vec<Site>,
    /// Findings, most severe first (`crate::findings::sort`).
    pub findings: Vec<Finding>,
    /// The capture's path as shown to the user (workspace-relative when inside it); set by the
    /// locate step.
    pub shown_path: Option<String>,
}

impl CaptureReport {
    pub fn kind(&self) -> CaptureKind {
        match self.engine {
            Engine::Torch(_) => CaptureKind::TorchSnapshot,
            Engine::Xla(_) => CaptureKind::XlaCapture,
        }
    }

    /// The capture's path as shown to the user.
    pub fn display_path(&self) -> String {
        self.shown_path
            .clone()
            .unwrap_or_else(|| self.path.display().to_string())
    }

    /// One sentence, the main finding first: `[subject: ]message [CODE] (file:line)`, or what is
    /// live where when nothing is wrong.
    pub fn headline(&self) -> String {
        let subject = self.subject();
        let prefix = subject.map(|s| format!("{s}: ")).unwrap_or_default();
        let sentence = match lead(&self.findings) {
            Some(f) => {
                let at = f
                    .location
                    .as_ref()
                    .map(|l| {
                        let base = base_name(&l.file);
                        // Messages that already name the line are not repeated.
                        if f.message.contains(&format!("{}:{}", l.file, l.line)) {
                            String::new()
                        } else {
                            format!(" ({base}:{})", l.line)
                        }
                    })
                    .unwrap_or_default();
                format!(
                    "{prefix}{} [{}]{at}",
                    f.message.trim_end_matches('.'),
                    f.code
                )
            }
            None => format!("{prefix}{}", self.all_clear()),
        };
        let sentence = self.with_stage_at_peak(sentence);
        match &self.engine {
            Engine::Torch(t) => match &t.rank_comparison {
                Some(c) if c.imbalance.is_some_and(|x| x > 1.2) => format!(
                    "{} (rank {} of {}; ranks imbalanced: {:.2}× live memory between fullest and emptiest, measured)",
                    sentence.trim_end_matches('.'),
                    t.rank.unwrap_or(0),
                    c.rows.len(),
                    c.imbalance.unwrap_or(0.0)
                ),
                _ => sentence,
            },
            Engine::Xla(_) => sentence,
        }
    }

    /// A snapshot that recorded `external_annotations` names the stage holding its peak (the
    /// peak device's): "…; peak in `Optimizer.step#AdamW.step` of step 3".
    fn with_stage_at_peak(&self, sentence: String) -> String {
        let Engine::Torch(t) = &self.engine else {
            return sentence;
        };
        if !t.annotations_recorded {
            return sentence;
        }
        let Some(s) = self.stage_at_peak() else {
            return sentence;
        };
        let end = if sentence.ends_with('.') { "." } else { "" };
        format!("{}; {}{end}", sentence.trim_end_matches('.'), s.phrase())
    }

    /// The stage (recorded or inferred) holding the peak of the peak device (the first device
    /// with a stage at its peak when the peak's device is not known); `None` for captures
    /// without a trace or a JAX capture.
    pub fn stage_at_peak(&self) -> Option<&crate::torch::stages::summary::StageAtPeak> {
        let Engine::Torch(t) = &self.engine else {
            return None;
        };
        let device = t.totals.peak_active_bytes_trace_relative.map(|p| p.device);
        t.stage_at_peak
            .iter()
            .find(|s| Some(s.device) == device)
            .or(t.stage_at_peak.first())
    }

    /// What the report is about, when a capture holds several things (the JAX module).
    fn subject(&self) -> Option<&str> {
        match &self.engine {
            Engine::Xla(x) => x.module.as_deref(),
            Engine::Torch(_) => None,
        }
    }

    /// The headline when no finding leads.
    fn all_clear(&self) -> String {
        match &self.engine {
            Engine::Torch(t) => {
                let o = &t.totals.memory;
                if o.allocated_bytes == 0 {
                    return format!(
                        "No live tensor memory in this snapshot ({} reserved, {} segments, measured).",
                        fmt_bytes(o.reserved_bytes),
                        o.segment_count
                    );
                }
                let tail = match t.allocation_sites.top.first() {
                    Some(s) if s.frame.filename.is_some() => format!(
                        "; the largest site is {}:{} with {} of it",
                        s.frame.filename.as_deref().unwrap_or(""),
                        s.frame.line.unwrap_or(0),
                        pct(s.percent_of_allocated)
                    ),
                    Some(s) => format!(
                        "; {} of it has no recorded stack",
                        pct(s.percent_of_allocated)
                    ),
                    None => String::new(),
                };
                format!(
                    "{} live in {} reserved on {} device(s){} (measured), no problem pattern found.",
                    fmt_bytes(o.allocated_bytes),
                    fmt_bytes(o.reserved_bytes),
                    t.devices
                        .iter()
                        .filter(|d| d.memory.segment_count > 0)
                        .count()
                        .max(1),
                    tail
                )
            }
            Engine::Xla(x) => match &x.plan {
                Some(p) => format!(
                    "plan peaks at {} (heap {} + parameters/outputs {}, read); no memory problem found{}",
                    fmt_bytes(p.total_peak_bytes),
                    fmt_bytes(p.heap_peak_bytes),
                    fmt_bytes(p.indefinite_in_peak),
                    self.findings
                        .iter()
                        .find(|f| f.code == crate::findings::Code::JX009)
                        .map(|f| format!(
                            "; largest: {}{}",
                            f.message.split(" live at").next().unwrap_or(""),
                            f.location
                                .as_ref()
                                .map(|l| format!(" ({}:{})", base_name(&l.file), l.line))
                                .unwrap_or_default()
                        ))
                        .unwrap_or_default()
                ),
                None => match &x.runtime.allocator {
                    Some(a) => format!(
                        "no HLO plan in this capture; allocator {} peaked at {} of {} (measured)",
                        a,
                        fmt_bytes(x.runtime.peak_bytes_in_use.unwrap_or(0)),
                        fmt_bytes(x.runtime.capacity_bytes.unwrap_or(0))
                    ),
                    None => {
                        "no HLO plan and no allocator events in this capture: nothing to analyse"
                            .into()
                    }
                },
            },
        }
    }
}

/// `12.3%`, `<0.1%`, or `–` when unknown.
pub fn pct(p: Option<f64>) -> String {
    match p {
        Some(p) if p > 0.0 && p < 0.05 => "<0.1%".into(),
        Some(p) => format!("{p:.1}%"),
        None => "–".into(),
    }
}

/// The file name of a recorded path (`/srv/x/train.py` → `train.py`; Windows paths too).
pub fn base_name(path: &str) -> &str {
    path.rsplit(['/', '\\']).next().unwrap_or(path)
}

impl Serialize for CaptureReport {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("path", &self.display_path())?;
        m.serialize_entry("kind", self.kind().as_str())?;
        m.serialize_entry("headline", &self.headline())?;
        match &self.engine {
            Engine::Torch(t) => m.serialize_entry("torch", t)?,
            Engine::Xla(x) => m.serialize_entry("xla", x)?,
        }
        m.serialize_entry("sites", &self.sites)?;
        m.serialize_entry("findings", &self.findings)?;
        m.end()
    }
}

/// A capture's file name, as messages show it.
pub fn capture_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.to_string_lossy().into_owned())
}

/// The rank comparisons of `reports`, each once (every rank's report shares its group's), and
/// for each report the index of its group: presenters write a comparison once, not once per
/// rank (1,024 ranks would otherwise repeat 1,024 rows 1,024 times).
pub fn rank_groups(
    reports: &[CaptureReport],
) -> (
    Vec<&std::sync::Arc<crate::torch::ranks::RankComparison>>,
    Vec<Option<usize>>,
) {
    let mut groups: Vec<&std::sync::Arc<crate::torch::ranks::RankComparison>> = Vec::new();
    let index = reports
        .iter()
        .map(|r| match &r.engine {
            Engine::Torch(t) => t.rank_comparison.as_ref().map(|c| {
                groups
                    .iter()
                    .position(|g| std::sync::Arc::ptr_eq(g, c))
                    .unwrap_or_else(|| {
                        groups.push(c);
                        groups.len() - 1
                    })
            }),
            Engine::Xla(_) => None,
        })
        .collect();
    (groups, index)
}
