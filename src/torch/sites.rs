//! Where live memory was allocated: `active_allocated` blocks grouped by first user frame
//! (ORACLE.md §5), largest first, with a role guess from the stack.

use rustc_hash::FxHashMap;

use crate::torch::model::{BlockState, Segment, Snapshot, StackId};
use crate::torch::stacks::{Role, SiteKey, SiteKind, StackIndex, site_string};

/// Live memory attributed to one site.
#[derive(Clone, Debug, PartialEq)]
pub struct SiteStat {
    pub key: SiteKey,
    /// `<filename>:<line>:<name>` or `<no stack>`.
    pub site: String,
    /// `User` / `PythonFallback`, or `Empty` for the merged `<no stack>` site.
    pub kind: SiteKind,
    pub bytes: u64,
    pub requested_bytes: u64,
    pub blocks: u64,
    /// Stack of the site's largest block (the representative stack).
    pub stack: Option<StackId>,
    largest_block: u64,
    /// Bytes per guessed role; the site's role is the one holding most bytes.
    role_bytes: [u64; Role::ALL.len()],
}

impl SiteStat {
    pub fn role(&self) -> Role {
        let mut best = (0u64, Role::Unknown);
        for (i, b) in self.role_bytes.iter().enumerate() {
            if *b > best.0 {
                best = (*b, Role::ALL[i]);
            }
        }
        best.1
    }

    /// Share of `allocated` as the oracle computes it (one correctly rounded division).
    pub fn percent_of(&self, allocated: u64) -> Option<f64> {
        percent(self.bytes, allocated)
    }
}

/// `part * 100 / whole` as an IEEE double; `None` when `whole` is 0.
pub fn percent(part: u64, whole: u64) -> Option<f64> {
    if whole == 0 {
        return None;
    }
    Some(part as f64 * 100.0 / whole as f64)
}

/// All sites, sorted by bytes desc, blocks desc, site asc.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sites {
    pub sites: Vec<SiteStat>,
    pub active_blocks: u64,
    /// Blocks and bytes per attribution kind (`user`, `python_fallback`, `native_only`, `empty`).
    pub by_kind: [(u64, u64); 4],
    /// Live bytes per role over all blocks.
    pub role_bytes: FxHashMap<Role, u64>,
}

fn kind_slot(k: SiteKind) -> usize {
    match k {
        SiteKind::User => 0,
        SiteKind::PythonFallback => 1,
        SiteKind::NativeOnly => 2,
        SiteKind::Empty => 3,
    }
}

/// Group `active_allocated` blocks of the given device (all devices when `None`).
pub fn compute(snap: &Snapshot, stacks: &StackIndex, device: Option<i64>) -> Sites {
    let mut map: FxHashMap<SiteKey, SiteStat> = FxHashMap::default();
    let mut out = Sites::default();
    let segments: Box<dyn Iterator<Item = &Segment>> = match device {
        Some(d) => Box::new(snap.segments_of(d)),
        None => Box::new(snap.segments.iter()),
    };
    for seg in segments {
        for b in &seg.blocks {
            if b.state != BlockState::ActiveAllocated {
                continue;
            }
            out.active_blocks += 1;
            let (key, kind) = stacks.site(b.stack);
            let slot = &mut out.by_kind[kind_slot(kind)];
            slot.0 += 1;
            slot.1 = slot.1.saturating_add(b.size);
            let role = stacks.role(b.stack);
            let r = out.role_bytes.entry(role).or_default();
            *r = r.saturating_add(b.size);
            let s = map.entry(key).or_insert_with(|| SiteStat {
                key,
                site: String::new(),
                kind: if key.is_some() { kind } else { SiteKind::Empty },
                bytes: 0,
                requested_bytes: 0,
                blocks: 0,
                stack: b.stack,
                largest_block: 0,
                role_bytes: [0; Role::ALL.len()],
            });
            s.bytes = s.bytes.saturating_add(b.size);
            s.requested_bytes = s.requested_bytes.saturating_add(b.requested_size);
            s.blocks += 1;
            s.role_bytes[role.slot()] = s.role_bytes[role.slot()].saturating_add(b.size);
            if b.size > s.largest_block {
                s.largest_block = b.size;
                s.stack = b.stack;
            }
        }
    }
    let mut sites: Vec<SiteStat> = map
        .into_values()
        .map(|mut s| {
            s.site = site_string(snap, s.key);
            s
        })
        .collect();
    sites.sort_by(|a, b| {
        b.bytes
            .cmp(&a.bytes)
            .then(b.blocks.cmp(&a.blocks))
            .then_with(|| a.site.cmp(&b.site))
    });
    out.sites = sites;
    out
}

impl Sites {
    pub fn role_total(&self, r: Role) -> u64 {
        self.role_bytes.get(&r).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frames::FrameFilter;
    use crate::torch::stacks::tests::intern;
    use crate::torch::totals::tests::{block, segment};

    #[test]
    fn groups_by_first_user_frame_and_sorts_like_the_oracle() {
        let mut snap = Snapshot::default();
        let a = intern(
            &mut snap,
            &[("??", 0, "alloc"), ("/home/u/train.py", 10, "step")],
        );
        // Same user frame through a different framework path: same site.
        let a2 = intern(
            &mut snap,
            &[
                ("/v/site-packages/torch/nn/functional.py", 1, "linear"),
                ("/home/u/train.py", 10, "step"),
            ],
        );
        let b = intern(&mut snap, &[("/home/u/model.py", 5, "forward")]);
        let native = intern(&mut snap, &[("??", 0, "autograd")]);
        let mk = |size: u64, st: Option<StackId>| {
            let mut x = block(size, size - 1, BlockState::ActiveAllocated);
            x.stack = st;
            x
        };
        snap.segments = vec![segment(
            0,
            1 << 20,
            vec![
                mk(1024, Some(a)),
                mk(2048, Some(a2)),
                mk(3072, Some(b)),
                mk(512, Some(native)),
                mk(512, None),
                block(4096, 7, BlockState::Inactive),
            ],
        )];
        let idx = StackIndex::new(&snap, &FrameFilter::default());
        let s = compute(&snap, &idx, None);
        let names: Vec<(&str, u64, u64)> = s
            .sites
            .iter()
            .map(|x| (x.site.as_str(), x.bytes, x.blocks))
            .collect();
        assert_eq!(
            names,
            vec![
                ("/home/u/train.py:10:step", 3072, 2),
                ("/home/u/model.py:5:forward", 3072, 1),
                ("<no stack>", 1024, 2),
            ],
            "ties broken by blocks descending, native-only and empty merged"
        );
        assert_eq!(s.sites[0].requested_bytes, 3070);
        assert_eq!(s.sites[0].stack, Some(a2), "representative = largest block");
        assert_eq!(s.by_kind[2], (1, 512));
        assert_eq!(s.by_kind[3], (1, 512));
        assert_eq!(s.sites[1].role(), Role::Activation);
        let j = crate::torch::summary::sites(&s, &snap, 7168, 10);
        assert_eq!(j.top[2].frame.kind, "no_stack");
        assert_eq!(j.top[1].percent_of_allocated, Some(3072.0 * 100.0 / 7168.0));
        assert_eq!(j.distinct_sites, 3);
    }
}
