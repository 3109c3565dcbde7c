//! The one error type for captures that cannot be read: what happened, where, what to do.

use std::fmt;
use std::path::{Path, PathBuf};

/// Why a capture could not be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The file ends early (may still be being written: the server retries on the next change).
    Truncated,
    /// The bytes are not a valid capture of the expected format.
    Invalid,
    /// A valid file of a shape memlsp does not support (a pickle global, an unknown variant).
    Unsupported,
    /// Input exceeds a resource limit (size, depth, memo, length).
    Limit,
    /// The file could not be opened or read.
    Io,
    /// Nothing to analyse (empty file, directory without captures).
    Empty,
    /// Whoever asked stopped the analysis (`DecodeOptions::cancel`): not a property of the file.
    Cancelled,
}

/// A capture that could not be read. `Display` is one line: file, byte offset, what, what to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaptureError {
    pub path: PathBuf,
    pub offset: Option<u64>,
    pub kind: ErrorKind,
    pub message: String,
    pub hint: String,
}

impl CaptureError {
    /// A mapped capture lost pages under its mapping while it was read (`sigbus::Watch::lost`):
    /// they read as zeros, so nothing read from it holds.
    pub fn truncated_while_read(path: &Path) -> CaptureError {
        CaptureError::new(
            path,
            ErrorKind::Truncated,
            None,
            "the file was truncated while it was being read",
            "it is being rewritten (a new dump or profile?); read it again once the write is done",
        )
    }

    pub fn new(
        path: &Path,
        kind: ErrorKind,
        offset: Option<u64>,
        message: impl Into<String>,
        hint: impl Into<String>,
    ) -> Self {
        CaptureError {
            path: path.to_path_buf(),
            offset,
            kind,
            message: message.into(),
            hint: hint.into(),
        }
    }

    pub fn io(path: &Path, err: &std::io::Error) -> Self {
        CaptureError::new(
            path,
            ErrorKind::Io,
            None,
            format!("cannot read: {err}"),
            "check the path and its permissions",
        )
    }

    /// The analysis was stopped by its caller.
    pub fn cancelled(path: &Path) -> Self {
        CaptureError::new(
            path,
            ErrorKind::Cancelled,
            None,
            "the analysis was cancelled",
            "",
        )
    }

    /// True when the file may simply not be finished yet (a snapshot still being dumped).
    pub fn is_incomplete(&self) -> bool {
        self.kind == ErrorKind::Truncated
    }
}

impl fmt::Display for CaptureError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.path.display())?;
        if let Some(off) = self.offset {
            write!(f, ": at byte {off}")?;
        }
        write!(f, ": {}", self.message)?;
        if !self.hint.is_empty() {
            write!(f, " ({})", self.hint)?;
        }
        Ok(())
    }
}

impl std::error::Error for CaptureError {}

/// The byte offset in `bytes` of a JSON parse error (serde reports 1-based line and column).
pub fn json_error_offset(bytes: &[u8], e: &serde_json::Error) -> u64 {
    let mut line = 1;
    for (i, &b) in bytes.iter().enumerate() {
        if line == e.line() {
            return (i + e.column().saturating_sub(1)) as u64;
        }
        if b == b'\n' {
            line += 1;
        }
    }
    bytes.len() as u64
}
