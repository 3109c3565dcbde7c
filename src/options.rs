//! What each layer is told, split by layer so that no layer sees another's settings: the decoder
//! (limits), the analyses (how many sites, which module, which frames are the user's) and the
//! locate step (where the workspace is, how recorded paths map to it).

use std::path::PathBuf;

use crate::frames::FrameFilter;

/// Limits of the decoders.
#[derive(Clone, Debug)]
pub struct DecodeOptions {
    /// Keep only the newest N trace events per device (None = no cap).
    pub max_trace_events: Option<usize>,
    /// Files larger than this are refused (bytes).
    pub max_file_bytes: u64,
}

impl Default for DecodeOptions {
    fn default() -> Self {
        DecodeOptions {
            max_trace_events: None,
            max_file_bytes: 4 << 30,
        }
    }
}

/// What the analyses need.
#[derive(Clone, Debug)]
pub struct AnalysisOptions {
    /// Number of top sites to list.
    pub top: usize,
    /// JAX: module to analyse (`jit_train_step(36)` or the bare HLO name).
    pub module: Option<String>,
    /// Which frames count as the user's.
    pub frames: FrameFilter,
    /// Also compute what pictures draw (memory over time, allocator state, the heap over the
    /// program order): the HTML page and the editor's timeline ask for it.
    pub pictures: bool,
}

impl Default for AnalysisOptions {
    fn default() -> Self {
        AnalysisOptions {
            top: 10,
            module: None,
            frames: FrameFilter::default(),
            pictures: false,
        }
    }
}

/// Where recorded source paths are looked for.
#[derive(Clone, Debug, Default)]
pub struct LocateOptions {
    /// Workspace roots (see `crate::source::paths::Resolver`).
    pub workspace: Vec<PathBuf>,
    /// `(recorded prefix, local prefix)` path mappings, longest prefix first.
    pub path_mappings: Vec<(String, PathBuf)>,
}

/// Everything one run of the pipeline is told (`report`, `--check`, the server).
#[derive(Clone, Debug, Default)]
pub struct Options {
    pub decode: DecodeOptions,
    pub analysis: AnalysisOptions,
    pub locate: LocateOptions,
}
