//! Memory attributed to a source line, as both engines report it: the rows of "top sites", the
//! inlay hints in the editor, the `sites` of the JSON contract.

use serde::Serialize;
use serde::ser::SerializeMap;

use crate::findings::{Label, Location, Stack};

/// What a site's memory is for (inferred from stacks and name stacks, or read from the plan's
/// allocation category for JAX buffers outside the heap).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SiteRole {
    Parameter,
    OptimizerState,
    Activation,
    /// PyTorch: gradients and autograd's backward buffers.
    Gradient,
    CommunicationBuffer,
    /// A line whose allocations a pattern found growing like a Python container's.
    UserContainer,
    /// A line whose allocations the trace shows freed again almost every time.
    Temporary,
    /// JAX: forward activations kept for the backward pass.
    Forward,
    /// JAX: forward values stacked by a scan.
    ScanStack,
    /// JAX: forward values recomputed by `jax.checkpoint`.
    Recomputed,
    /// JAX: the backward pass.
    Backward,
    /// JAX: library (GEMM/conv) workspace.
    Workspace,
    /// JAX: outputs of the step.
    Output,
    ThreadLocal,
    Constant,
    Other,
    Unknown,
}

impl SiteRole {
    pub fn as_str(self) -> &'static str {
        match self {
            SiteRole::Parameter => "parameter",
            SiteRole::OptimizerState => "optimizer state",
            SiteRole::Activation => "activation",
            SiteRole::Gradient => "gradient / backward buffer",
            SiteRole::CommunicationBuffer => "communication buffer",
            SiteRole::UserContainer => "user container",
            SiteRole::Temporary => "temporary",
            SiteRole::Forward => "forward, kept for the backward pass",
            SiteRole::ScanStack => "forward, stacked by a scan (while/body)",
            SiteRole::Recomputed => "forward, recomputed by jax.checkpoint",
            SiteRole::Backward => "backward",
            SiteRole::Workspace => "workspace",
            SiteRole::Output => "output",
            SiteRole::ThreadLocal => "thread-local",
            SiteRole::Constant => "constant",
            SiteRole::Other => "other",
            SiteRole::Unknown => "unknown",
        }
    }
}

/// What a site's percent is a share of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PercentOf {
    /// PyTorch: of the allocated (live) bytes at dump time.
    LiveMemory,
    /// JAX: of the heap-simulator peak.
    HeapPeak,
    /// JAX: of the total peak (parameters, outputs and the heap).
    Peak,
}

impl PercentOf {
    pub fn as_str(self) -> &'static str {
        match self {
            PercentOf::LiveMemory => "live memory",
            PercentOf::HeapPeak => "heap peak",
            PercentOf::Peak => "peak",
        }
    }
}

/// How the first frame of a site was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SiteFrame {
    /// The innermost user frame.
    User,
    /// No user frame in the stack: the first Python frame.
    PythonFallback,
    /// No Python frame at all (`<no stack>`).
    None,
}

/// Memory attributed to one source line (PyTorch: active blocks grouped by first user frame;
/// JAX: buffers live at the heap peak grouped by their Python line).
#[derive(Clone, Debug, PartialEq)]
pub struct Site {
    /// The culprit frame; `None` for the merged `<no stack>` site.
    pub location: Option<Location>,
    pub bytes: u64,
    /// PyTorch: Σ requested_size of the blocks.
    pub requested_bytes: Option<u64>,
    /// Number of blocks / buffers.
    pub blocks: u64,
    /// Share of [`Site::percent_of`].
    pub percent: f64,
    pub percent_of: PercentOf,
    /// Where the number comes from: `measured` (allocator state), `read` (xprof's own mapping
    /// of buffers to lines) or `inferred` (an attribution of ours).
    pub label: Label,
    /// The representative stack, innermost first, including framework frames.
    pub stack: Stack,
    /// The user's frames that called the culprit (outermost last), at most two.
    pub callers: Vec<Location>,
    pub frame: SiteFrame,
    pub role: Option<SiteRole>,
    /// Rank / device / module the site belongs to.
    pub scope: Option<String>,
    /// For an inferred site: the line the reference tool (xprof) shows for these buffers, when
    /// it shows one (library code).
    pub reference_line: Option<Location>,
    /// For an inferred site: the loop (`while` of a scan) that carries these buffers.
    pub carried_by: Option<String>,
}

impl Serialize for Site {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        crate::findings::serialize_place(&mut m, self.location.as_ref())?;
        m.serialize_entry("bytes", &self.bytes)?;
        m.serialize_entry("blocks", &self.blocks)?;
        m.serialize_entry("percent", &self.percent)?;
        m.serialize_entry("percent_of", self.percent_of.as_str())?;
        m.serialize_entry("label", &self.label)?;
        if let Some(req) = self.requested_bytes {
            m.serialize_entry("requested_bytes", &req)?;
        }
        if let Some(role) = self.role {
            m.serialize_entry("role", role.as_str())?;
        }
        if let Some(scope) = &self.scope {
            m.serialize_entry("scope", scope)?;
        }
        if let Some(l) = &self.reference_line {
            m.serialize_entry("reference_line", l)?;
        }
        if let Some(w) = &self.carried_by {
            m.serialize_entry("carried_by", w)?;
        }
        m.serialize_entry("stack", &self.stack)?;
        m.end()
    }
}
