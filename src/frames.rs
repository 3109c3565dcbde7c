//! Which frames are the user's: the rule that picks the culprit line out of a stack.
//!
//! A *Python frame* has a file name ending in `.py` or starting with `<`. A *user frame* is a Python
//! frame that is not `<frozen …>`, not under `site-packages`/`dist-packages`, not part of a
//! framework (`torch/`, `jax/`, `jaxlib/`, `flax/`, `optax/`, plus configured excludes) and not
//! generated code: Inductor's output (`torchinductor_<user>/` cache folders), FX graph modules
//! (`<eval_with_key>.N`) and Triton's launchers (`.triton/` caches), which the user cannot edit —
//! the site is the user's frame that called them. Everything else (`??`, `""`, `*.cpp`, `*.h`,
//! …) is native. Apart from generated code this is `torch_snapshots/ORACLE.md` §5's rule.

/// What kind of frame a file name denotes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    User,
    /// Python, but framework or library code.
    Framework,
    /// Python written by a compiler (Inductor, FX, Triton): never the user's line.
    Generated,
    Native,
}

/// The user-frame rule, with the user's extra excludes (`userFrameExcludes`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FrameFilter {
    /// Substrings of a normalised (`/`-separated) path that mark a frame as not the user's.
    pub extra_excludes: Vec<String>,
}

const FRAMEWORK_DIRS: [&str; 5] = ["torch", "jax", "jaxlib", "flax", "optax"];

/// Python's standard library (`/usr/lib/python3.10/…`, `C:/Python311/Lib/…`) and the editor's
/// debugger (`.vscode-server/extensions/…`): Python, but never the user's line.
fn is_stdlib_or_tool(norm: &str) -> bool {
    let stdlib = norm.match_indices("/lib/python").any(|(i, m)| {
        let rest = &norm[i + m.len()..];
        let digits = rest.trim_start_matches(|c: char| c.is_ascii_digit() || c == '.');
        digits.len() < rest.len() && digits.starts_with('/')
    });
    let windows = norm.to_ascii_lowercase().contains("/python3") && norm.contains("/Lib/");
    stdlib
        || windows
        || norm.contains("/.vscode-server/extensions/")
        || norm.contains("/_vendored/")
}

/// Code a compiler wrote: Inductor's cache folders (`/tmp/torchinductor_<user>/ab/c….py`), FX
/// graph modules (`<eval_with_key>.3`), Triton's launcher cache (`~/.triton/cache/…`).
fn is_generated(norm: &str) -> bool {
    norm.contains("/torchinductor_")
        || norm.starts_with("torchinductor_")
        || norm.starts_with("<eval_with_key>")
        || norm.contains("/.triton/")
}

impl FrameFilter {
    pub fn new(extra_excludes: Vec<String>) -> Self {
        FrameFilter { extra_excludes }
    }

    pub fn classify(&self, filename: &str) -> FrameKind {
        if !(filename.ends_with(".py") || filename.starts_with('<')) {
            return FrameKind::Native;
        }
        let norm = filename.replace('\\', "/");
        if is_generated(&norm) {
            return FrameKind::Generated;
        }
        if filename.starts_with("<frozen")
            || filename.contains("site-packages")
            || filename.contains("dist-packages")
        {
            return FrameKind::Framework;
        }
        if is_stdlib_or_tool(&norm) {
            return FrameKind::Framework;
        }
        for dir in FRAMEWORK_DIRS {
            if norm.starts_with(&format!("{dir}/")) || norm.contains(&format!("/{dir}/")) {
                return FrameKind::Framework;
            }
        }
        if self
            .extra_excludes
            .iter()
            .any(|ex| !ex.is_empty() && norm.contains(ex.as_str()))
        {
            return FrameKind::Framework;
        }
        FrameKind::User
    }

    pub fn is_user(&self, filename: &str) -> bool {
        self.classify(filename) == FrameKind::User
    }

    /// Index of the frame to attribute a stack to: the first user frame, else the first Python
    /// frame that is not generated, else `None`. `filenames` is innermost first.
    pub fn pick<'a>(
        &self,
        filenames: impl IntoIterator<Item = &'a str>,
    ) -> Option<(usize, FrameKind)> {
        let mut fallback = None;
        for (i, f) in filenames.into_iter().enumerate() {
            match self.classify(f) {
                FrameKind::User => return Some((i, FrameKind::User)),
                FrameKind::Framework if fallback.is_none() => {
                    fallback = Some((i, FrameKind::Framework))
                }
                _ => {}
            }
        }
        fallback
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_real_snapshot_paths() {
        let f = FrameFilter::default();
        assert_eq!(f.classify("/home/u/proj/train.py"), FrameKind::User);
        assert_eq!(
            f.classify("/usr/lib/python3/dist-packages/torch/nn/modules/linear.py"),
            FrameKind::Framework
        );
        assert_eq!(
            f.classify("/opt/conda/lib/python3.10/site-packages/transformers/x.py"),
            FrameKind::Framework
        );
        assert_eq!(
            f.classify("/src/pytorch/torch/optim/adam.py"),
            FrameKind::Framework
        );
        assert_eq!(f.classify("torch/autograd/graph.py"), FrameKind::Framework);
        assert_eq!(
            f.classify(r"D:\Dev\venv\Lib\site-packages\torch\nn\x.py"),
            FrameKind::Framework
        );
        assert_eq!(f.classify("<frozen runpy>"), FrameKind::Framework);
        assert_eq!(
            f.classify("/usr/lib/python3.10/concurrent/futures/thread.py"),
            FrameKind::Framework
        );
        assert_eq!(
            f.classify(r"C:\Python311\Lib\threading.py"),
            FrameKind::Framework
        );
        assert_eq!(
            f.classify("/home/u/.vscode-server/extensions/ms-python.debugpy/bundled/libs/debugpy/_vendored/pydevd/pydevd_runpy.py"),
            FrameKind::Framework
        );
        assert_eq!(f.classify("/home/u/lib/python_utils/x.py"), FrameKind::User);
        assert_eq!(f.classify("<string>"), FrameKind::User);
        assert_eq!(f.classify("??"), FrameKind::Native);
        assert_eq!(f.classify(""), FrameKind::Native);
        assert_eq!(f.classify("CUDACachingAllocator.cpp"), FrameKind::Native);
        // A library vendored inside the project counts as user code.
        assert_eq!(
            f.classify("/mnt/mcx/select_n/lib/transformers/models/llama/modeling_llama.py"),
            FrameKind::User
        );
    }

    #[test]
    fn generated_code_is_never_the_users_line() {
        let f = FrameFilter::default();
        for g in [
            "/tmp/torchinductor_brian/bc/cbckygr3dxfwtsnv6crdu6nve333wkkwchw5hvnqs23tv2zhjiin.py",
            "<eval_with_key>.12",
            "/home/u/.triton/cache/3f/launcher.py",
        ] {
            assert_eq!(f.classify(g), FrameKind::Generated, "{g}");
        }
        // The compiled model's own line behind the generated kernel is the site.
        let stack = [
            "/tmp/torchinductor_brian/bc/cbck.py",
            "/home/brian/Desktop/assignment2-systems/cs336_basics/model.py",
        ];
        assert_eq!(f.pick(stack), Some((1, FrameKind::User)));
        assert_eq!(f.pick(["/tmp/torchinductor_u/ab/c.py", "??"]), None);
    }

    #[test]
    fn extra_excludes_demote_user_frames() {
        let f = FrameFilter::new(vec!["/lib/transformers/".into()]);
        assert_eq!(
            f.classify("/mnt/x/lib/transformers/m.py"),
            FrameKind::Framework
        );
    }

    #[test]
    fn picks_first_user_frame_then_falls_back_to_python() {
        let f = FrameFilter::default();
        let stack = [
            "??",
            "/x/site-packages/torch/nn/functional.py",
            "/home/u/model.py",
            "/home/u/train.py",
        ];
        assert_eq!(f.pick(stack), Some((2, FrameKind::User)));
        let only_torch = ["??", "/x/site-packages/torch/nn/functional.py"];
        assert_eq!(f.pick(only_torch), Some((1, FrameKind::Framework)));
        assert_eq!(f.pick(["??", "x.cpp"]), None);
    }
}
