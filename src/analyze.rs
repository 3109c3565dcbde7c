//! The one entry point every front end uses: path → `CaptureReport`s.
//!
//! Detects the capture kind, runs the engine (decode → model → analyse), then `crate::source`
//! resolves fix edits when the caller gives a workspace. The CLI and the language server both call
//! this; batch mode is not a second implementation.

use std::path::{Path, PathBuf};

use crate::error::{CaptureError, ErrorKind};
use crate::report::{CaptureKind, CaptureReport};
use crate::source::frames::FrameFilter;

/// Options shared by `report`, `--check` and the server.
#[derive(Clone, Debug)]
pub struct Options {
    /// Number of top sites to list.
    pub top: usize,
    /// Keep only the newest N trace events per device (None = no cap).
    pub max_trace_events: Option<usize>,
    /// JAX: module to analyse (`jit_train_step(36)` or the bare HLO name).
    pub module: Option<String>,
    /// Which frames count as the user's.
    pub frames: FrameFilter,
    /// Files larger than this are refused (bytes).
    pub max_file_bytes: u64,
    /// Workspace roots, where an engine that needs program text (the JAX engine, to find the
    /// `jax.jit` line) looks for recorded files; see `crate::source::paths::Resolver`.
    pub workspace: Vec<PathBuf>,
    /// `(recorded prefix, local prefix)` path mappings for the same lookup.
    pub path_mappings: Vec<(String, PathBuf)>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            top: 10,
            max_trace_events: None,
            module: None,
            frames: FrameFilter::default(),
            max_file_bytes: 4 << 30,
            workspace: Vec::new(),
            path_mappings: Vec::new(),
        }
    }
}

/// What kind of capture a file name denotes, if any.
pub fn detect_kind(path: &Path) -> Option<CaptureKind> {
    let name = path.file_name()?.to_str()?.to_ascii_lowercase();
    if name.ends_with(".xplane.pb") {
        Some(CaptureKind::XlaCapture)
    } else if name.ends_with(".pickle")
        || name.ends_with(".pkl")
        || (name.ends_with(".json") && name.contains("snapshot"))
    {
        Some(CaptureKind::TorchSnapshot)
    } else {
        None
    }
}

/// Analyse one file or one capture directory (per-rank snapshots, `plugins/profile/<run>/`).
pub fn analyze_path(path: &Path, opts: &Options) -> Result<Vec<CaptureReport>, CaptureError> {
    let meta = std::fs::metadata(path).map_err(|e| CaptureError::io(path, &e))?;
    if meta.is_dir() {
        let files = captures_in_dir(path);
        if files.is_empty() {
            return Err(CaptureError::new(
                path,
                ErrorKind::Empty,
                None,
                "directory holds no capture (*.pickle, *.pkl, *snapshot*.json, *.xplane.pb)",
                "pass a snapshot file or a directory of per-rank snapshots",
            ));
        }
        let torch: Vec<&PathBuf> = files
            .iter()
            .filter(|p| detect_kind(p) == Some(CaptureKind::TorchSnapshot))
            .collect();
        let mut out = Vec::new();
        if torch.len() > 1 {
            out.extend(crate::torch::analyze_ranks(
                &torch.iter().map(|p| p.as_path()).collect::<Vec<_>>(),
                opts,
            )?);
        } else if let Some(p) = torch.first() {
            out.push(analyze_file(p, opts)?);
        }
        for p in files
            .iter()
            .filter(|p| detect_kind(p) == Some(CaptureKind::XlaCapture))
        {
            out.push(analyze_file(p, opts)?);
        }
        return Ok(out);
    }
    Ok(vec![analyze_file(path, opts)?])
}

/// Analyse one capture file.
pub fn analyze_file(path: &Path, opts: &Options) -> Result<CaptureReport, CaptureError> {
    check_size(path, opts)?;
    match detect_kind(path) {
        Some(CaptureKind::XlaCapture) => crate::xla::analyze_file(path, opts),
        Some(CaptureKind::TorchSnapshot) => crate::torch::analyze_file(path, opts),
        None => sniff(path, opts),
    }
}

/// `report --diff`: two snapshots of the same run, earlier first.
pub fn analyze_diff(
    earlier: &Path,
    later: &Path,
    opts: &Options,
) -> Result<CaptureReport, CaptureError> {
    check_size(earlier, opts)?;
    check_size(later, opts)?;
    crate::torch::analyze_diff(earlier, later, opts)
}

fn check_size(path: &Path, opts: &Options) -> Result<(), CaptureError> {
    let meta = std::fs::metadata(path).map_err(|e| CaptureError::io(path, &e))?;
    if !meta.is_file() {
        // Opening a FIFO would block until some writer appears: refuse it instead of hanging.
        return Err(CaptureError::new(
            path,
            ErrorKind::Unsupported,
            None,
            "not a regular file (a pipe, socket or device)",
            "pass the capture file itself",
        ));
    }
    if meta.len() > opts.max_file_bytes {
        return Err(CaptureError::new(
            path,
            ErrorKind::Limit,
            None,
            format!(
                "file is {} bytes, above the limit of {} bytes",
                meta.len(),
                opts.max_file_bytes
            ),
            "raise maxFileBytes / --max-file-bytes if this really is a capture",
        ));
    }
    Ok(())
}

/// Unknown extension: decide by content (pickle PROTO byte, JSON brace).
fn sniff(path: &Path, opts: &Options) -> Result<CaptureReport, CaptureError> {
    use std::io::Read;
    let mut head = [0u8; 2];
    let n = std::fs::File::open(path)
        .and_then(|mut f| f.read(&mut head))
        .map_err(|e| CaptureError::io(path, &e))?;
    match &head[..n] {
        [0x80, ..] | [b'{', ..] | [b'[', ..] => crate::torch::analyze_file(path, opts),
        _ => Err(CaptureError::new(
            path,
            ErrorKind::Unsupported,
            Some(0),
            "not a PyTorch snapshot or an .xplane.pb capture",
            "memlsp reads *.pickle/*.pkl/*snapshot*.json and *.xplane.pb",
        )),
    }
}

/// Capture files directly in `dir` or in `plugins/profile/<run>/` below it, sorted by name.
pub fn captures_in_dir(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![(dir.to_path_buf(), 0usize)];
    while let Some((d, depth)) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() && depth < 3 {
                stack.push((p, depth + 1));
            } else if ft.is_file() && detect_kind(&p).is_some() {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}
