//! Per-stack facts computed once per snapshot: which frame a stack is attributed to (ORACLE.md §5)
//! and what role the memory plays, guessed from the frames.
//!
//! Stacks are interned by the loader, so everything here is indexed by `StackId` and every
//! analysis pass over blocks or trace entries looks these up instead of walking frames again.

use rustc_hash::FxHashMap;

use crate::findings::Location;
use crate::frames::{FrameFilter, FrameKind};
use crate::torch::model::{FrameId, Snapshot, StackId};

/// How a stack was attributed (ORACLE.md §5 `kind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SiteKind {
    /// First user frame.
    User,
    /// No user frame; first Python frame.
    PythonFallback,
    /// Only native frames: merged into `<no stack>`.
    NativeOnly,
    /// No frames at all: merged into `<no stack>`.
    Empty,
}

impl SiteKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SiteKind::User => "user",
            SiteKind::PythonFallback => "python_fallback",
            SiteKind::NativeOnly => "native_only",
            SiteKind::Empty => "empty",
        }
    }
}

/// What the memory is for, guessed from the stack's frames (always an inference).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    Parameter,
    OptimizerState,
    Activation,
    /// Allocated by autograd's backward pass (gradients and backward temporaries).
    Backward,
    CommunicationBuffer,
    #[default]
    Unknown,
}

impl Role {
    /// Every role, in slot order ([`Role::slot`]): per-role tallies are arrays indexed by it.
    pub const ALL: [Role; 6] = [
        Role::Parameter,
        Role::OptimizerState,
        Role::Activation,
        Role::Backward,
        Role::CommunicationBuffer,
        Role::Unknown,
    ];

    /// This role's index in [`Role::ALL`].
    pub fn slot(self) -> usize {
        match self {
            Role::Parameter => 0,
            Role::OptimizerState => 1,
            Role::Activation => 2,
            Role::Backward => 3,
            Role::CommunicationBuffer => 4,
            Role::Unknown => 5,
        }
    }

    /// The shared site role this stack role is.
    pub fn site_role(self) -> crate::site::SiteRole {
        use crate::site::SiteRole;
        match self {
            Role::Parameter => SiteRole::Parameter,
            Role::OptimizerState => SiteRole::OptimizerState,
            Role::Activation => SiteRole::Activation,
            Role::Backward => SiteRole::Gradient,
            Role::CommunicationBuffer => SiteRole::CommunicationBuffer,
            Role::Unknown => SiteRole::Unknown,
        }
    }
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Parameter => "parameter",
            Role::OptimizerState => "optimizer state",
            Role::Activation => "activation",
            Role::Backward => "gradient / backward buffer",
            Role::CommunicationBuffer => "communication buffer",
            Role::Unknown => "unknown",
        }
    }
}

/// A site key: the canonical frame a stack is attributed to, or `None` for `<no stack>`.
pub type SiteKey = Option<FrameId>;

/// Attribution and role of every stack of one snapshot.
pub struct StackIndex {
    /// Indexed by `StackId`.
    picks: Vec<(SiteKey, SiteKind)>,
    roles: Vec<Role>,
    /// Stacks that contain a frame of Python's garbage collector (for PT007).
    gc: Vec<bool>,
}

impl StackIndex {
    pub fn new(snap: &Snapshot, filter: &FrameFilter) -> StackIndex {
        // Classify each frame once; stacks share frames heavily.
        let kinds: Vec<FrameKind> = snap
            .frames
            .iter()
            .map(|f| filter.classify(&f.filename))
            .collect();
        let frame_roles: Vec<FrameRole> = snap.frames.iter().map(frame_role).collect();
        // Frames with equal content must give one site even if the loader kept two ids.
        let mut canonical: FxHashMap<(&str, u64, &str), FrameId> = FxHashMap::default();
        let mut picks = Vec::with_capacity(snap.stacks.len());
        let mut roles = Vec::with_capacity(snap.stacks.len());
        let mut gc = Vec::with_capacity(snap.stacks.len());
        for stack in &snap.stacks {
            let mut user = None;
            let mut fallback = None;
            let mut any = false;
            let mut flags = FrameRole::default();
            for &fid in stack {
                let Some(kind) = kinds.get(fid as usize) else {
                    continue;
                };
                any = true;
                match kind {
                    FrameKind::User if user.is_none() => user = Some(fid),
                    FrameKind::Framework if fallback.is_none() => fallback = Some(fid),
                    _ => {}
                }
                if let Some(r) = frame_roles.get(fid as usize) {
                    flags.merge(*r);
                }
            }
            let (fid, kind) = match (user, fallback) {
                (Some(f), _) => (Some(f), SiteKind::User),
                (None, Some(f)) => (Some(f), SiteKind::PythonFallback),
                (None, None) if any => (None, SiteKind::NativeOnly),
                (None, None) => (None, SiteKind::Empty),
            };
            let key = fid.and_then(|f| {
                let fr = snap.frames.get(f as usize)?;
                Some(
                    *canonical
                        .entry((fr.filename.as_str(), fr.line, fr.name.as_str()))
                        .or_insert(f),
                )
            });
            picks.push((key, kind));
            roles.push(flags.role());
            gc.push(flags.gc);
        }
        StackIndex { picks, roles, gc }
    }

    /// Site key and attribution kind of a stack (`None` → `<no stack>`, kind `Empty`).
    pub fn site(&self, stack: Option<StackId>) -> (SiteKey, SiteKind) {
        stack
            .and_then(|s| self.picks.get(s as usize).copied())
            .unwrap_or((None, SiteKind::Empty))
    }

    /// The site keys some stack is attributed to, each once (in stack order).
    pub fn site_keys(&self) -> impl Iterator<Item = FrameId> + '_ {
        let mut seen = rustc_hash::FxHashSet::default();
        self.picks
            .iter()
            .filter_map(|p| p.0)
            .filter(move |&k| seen.insert(k))
    }

    /// By `StackId`: is the stack attributed to one of `keys`?
    pub fn stacks_at(&self, keys: &rustc_hash::FxHashSet<FrameId>) -> Vec<bool> {
        self.picks
            .iter()
            .map(|p| p.0.is_some_and(|k| keys.contains(&k)))
            .collect()
    }

    pub fn role(&self, stack: Option<StackId>) -> Role {
        stack
            .and_then(|s| self.roles.get(s as usize).copied())
            .unwrap_or(Role::Unknown)
    }

    /// Some stack has role `r`.
    pub fn has_role(&self, r: Role) -> bool {
        self.roles.contains(&r)
    }

    pub fn has_gc_frame(&self, stack: Option<StackId>) -> bool {
        stack
            .and_then(|s| self.gc.get(s as usize).copied())
            .unwrap_or(false)
    }
}

/// What one frame says about the role of its stack.
#[derive(Clone, Copy, Debug, Default)]
struct FrameRole {
    optim: bool,
    comm: bool,
    backward: bool,
    forward: bool,
    param: bool,
    gc: bool,
}

impl FrameRole {
    fn merge(&mut self, o: FrameRole) {
        self.optim |= o.optim;
        self.comm |= o.comm;
        self.backward |= o.backward;
        self.forward |= o.forward;
        self.param |= o.param;
        self.gc |= o.gc;
    }
    /// Most specific first: an optimizer step or a DDP bucket may run inside a forward.
    fn role(self) -> Role {
        if self.optim {
            Role::OptimizerState
        } else if self.comm {
            Role::CommunicationBuffer
        } else if self.backward {
            Role::Backward
        } else if self.param {
            Role::Parameter
        } else if self.forward {
            Role::Activation
        } else {
            Role::Unknown
        }
    }
}

fn frame_role(f: &crate::torch::model::Frame) -> FrameRole {
    let file = f.filename.replace('\\', "/");
    let name = f.name.as_str();
    let in_torch = file.starts_with("torch/") || file.contains("/torch/");
    let modules = file.contains("torch/nn/modules/");
    FrameRole {
        optim: file.contains("torch/optim/"),
        comm: file.contains("torch/distributed/")
            || file.ends_with("torch/nn/parallel/distributed.py") && name != "forward"
            || name.contains("c10d::")
            || name.contains("Reducer")
            || name.contains("nccl")
            || name.contains("NCCL"),
        backward: (in_torch && file.contains("torch/autograd/") && name.contains("backward"))
            || name.contains("torch::autograd::Engine")
            || name.contains("_engine_run_backward"),
        forward: (modules && matches!(name, "forward" | "_call_impl" | "_wrapped_call_impl"))
            || (!in_torch && file.ends_with(".py") && name == "forward"),
        param: (modules && matches!(name, "_apply" | "convert" | "to" | "cuda" | "__init__"))
            || file.ends_with("torch/nn/parameter.py")
            || name == "reset_parameters",
        gc: name.contains("gc_collect")
            || name.contains("_PyGC_")
            || name.contains("collect_generations"),
    }
}

/// Culprit location and stack (starting at the culprit) for a site.
pub fn culprit(
    snap: &Snapshot,
    key: SiteKey,
    stack: Option<StackId>,
) -> (Option<Location>, Vec<Location>) {
    let loc = key.and_then(|k| location(snap, k));
    (loc, stack_locations(snap, stack, key))
}

/// A frame as a `Location` (line clamped into `u32`; a recorded −1 becomes 0).
pub fn location(snap: &Snapshot, fid: FrameId) -> Option<Location> {
    let f = snap.frames.get(fid as usize)?;
    Some(Location::new(
        f.filename.clone(),
        u32::try_from(f.line).unwrap_or(0),
        f.name.clone(),
    ))
}

/// The whole stack as locations, innermost first, starting at the attributed frame when given.
pub fn stack_locations(snap: &Snapshot, stack: Option<StackId>, from: SiteKey) -> Vec<Location> {
    let ids: &[FrameId] = stack
        .and_then(|s| snap.stacks.get(s as usize))
        .map(|v| v.as_slice())
        .unwrap_or(&[]);
    let start = from
        .and_then(|f| {
            let target = snap.frames.get(f as usize)?;
            ids.iter().position(|&i| {
                snap.frames
                    .get(i as usize)
                    .is_some_and(|fr| fr.filename == target.filename && fr.line == target.line)
            })
        })
        .unwrap_or(0);
    ids.iter()
        .skip(start)
        .filter_map(|&i| location(snap, i))
        .collect()
}

/// `<filename>:<line>:<name>` or `<no stack>` (ORACLE.md §5).
pub fn site_string(snap: &Snapshot, key: SiteKey) -> String {
    match key.and_then(|f| snap.frames.get(f as usize)) {
        Some(f) => format!("{}:{}:{}", f.filename, f.line, f.name),
        None => "<no stack>".to_string(),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::torch::model::Frame;

    #[test]
    fn every_role_has_its_own_slot_in_role_order() {
        for (i, r) in Role::ALL.iter().enumerate() {
            assert_eq!(r.slot(), i, "{r:?}");
        }
    }

    /// Build a snapshot's frame/stack tables from `(filename, line, name)` lists, innermost first.
    pub fn intern(snap: &mut Snapshot, frames: &[(&str, u64, &str)]) -> StackId {
        let mut ids = Vec::new();
        for (file, line, name) in frames {
            let f = Frame {
                name: name.to_string(),
                filename: file.to_string(),
                line: *line,
            };
            let id = match snap.frames.iter().position(|x| *x == f) {
                Some(i) => i as FrameId,
                None => {
                    snap.frames.push(f);
                    (snap.frames.len() - 1) as FrameId
                }
            };
            ids.push(id);
        }
        snap.stacks.push(ids);
        (snap.stacks.len() - 1) as StackId
    }

    #[test]
    fn attributes_to_first_user_frame_and_guesses_roles() {
        let mut s = Snapshot::default();
        let opt = intern(
            &mut s,
            &[
                ("??", 0, "c10::cuda::alloc"),
                (
                    "/venv/lib/python3.11/site-packages/torch/optim/adam.py",
                    90,
                    "_init_group",
                ),
                ("/home/u/train.py", 41, "main"),
            ],
        );
        let act = intern(
            &mut s,
            &[
                (
                    "/venv/site-packages/torch/nn/modules/linear.py",
                    125,
                    "forward",
                ),
                (
                    "/venv/site-packages/torch/nn/modules/module.py",
                    1747,
                    "_call_impl",
                ),
                ("/home/u/model.py", 12, "forward"),
            ],
        );
        let native = intern(&mut s, &[("??", 0, "torch::autograd::Engine::thread_main")]);
        let fallback = intern(&mut s, &[("/x/site-packages/torch/functional.py", 3, "f")]);
        let idx = StackIndex::new(&s, &FrameFilter::default());
        let (k, kind) = idx.site(Some(opt));
        assert_eq!(kind, SiteKind::User);
        assert_eq!(site_string(&s, k), "/home/u/train.py:41:main");
        assert_eq!(idx.role(Some(opt)), Role::OptimizerState);
        assert_eq!(idx.role(Some(act)), Role::Activation);
        assert_eq!(idx.role(Some(native)), Role::Backward);
        assert_eq!(idx.site(Some(native)), (None, SiteKind::NativeOnly));
        assert_eq!(idx.site(Some(fallback)).1, SiteKind::PythonFallback);
        assert_eq!(idx.site(None), (None, SiteKind::Empty));
        assert_eq!(site_string(&s, None), "<no stack>");
        let st = stack_locations(&s, Some(act), idx.site(Some(act)).0);
        assert_eq!(st.len(), 1);
        assert_eq!(st[0].line, 12);
    }
}
