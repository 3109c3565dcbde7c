//! The model's blocks: by start address, and by end address for the neighbour below.

use std::collections::BTreeSet;

use rustc_hash::FxHashMap;

use super::{Blk, St};

/// The blocks of the live segments by start address, and by end address for the neighbour
/// below. PyTorch links a segment's blocks in a list; here the blocks of a segment tile it, so
/// the block before `a` is the one ending at `a` and the one after is the one starting at its
/// end: both are hash lookups instead of ordered-map walks, the replay's hottest operations.
/// Ordered questions are rare (a new segment's address, pictures): they go through the
/// model's segments (`Model::seg_at`) or a sort.
///
/// `ordered`, the block starts in order, is kept while the initial state is carved (by
/// address), and for good when that state is irregular (segments that overlap or are empty, or
/// blocks that do not fit: a corrupt snapshot): then the blocks need not tile disjoint
/// segments, and every neighbour and ordered question is answered from it exactly as an
/// ordered map of blocks answers it.
#[derive(Clone, Debug, Default)]
pub(crate) struct Blocks {
    pub(super) at: FxHashMap<u64, Blk>,
    pub(super) ends: FxHashMap<u64, u64>,
    pub(super) ordered: Option<BTreeSet<u64>>,
}

impl Blocks {
    #[inline]
    pub fn get(&self, addr: u64) -> Option<&Blk> {
        self.at.get(&addr)
    }

    #[inline]
    pub(super) fn insert(&mut self, addr: u64, b: Blk) {
        let end = addr.saturating_add(b.size);
        if let Some(old) = self.at.insert(addr, b) {
            self.forget_end(addr, &old);
        }
        self.ends.insert(end, addr);
        if let Some(o) = self.ordered.as_mut() {
            o.insert(addr);
        }
    }

    /// Give the block at `addr` a new size and state in place: what `insert` of the changed
    /// block (same segment) does, without taking it out and putting it back.
    #[inline]
    pub(super) fn update(&mut self, addr: u64, size: u64, state: St) {
        let Some(b) = self.at.get_mut(&addr) else {
            return;
        };
        let old_end = addr.saturating_add(b.size);
        b.size = size;
        b.state = state;
        let end = addr.saturating_add(size);
        // Unordered blocks tile their segments: each end already names its block.
        if old_end == end && self.ordered.is_none() {
            return;
        }
        if old_end != end {
            self.forget_end_at(old_end, addr);
        }
        self.ends.insert(end, addr);
    }

    #[inline]
    pub(super) fn remove(&mut self, addr: u64) -> Option<Blk> {
        let b = self.at.remove(&addr)?;
        self.forget_end(addr, &b);
        if let Some(o) = self.ordered.as_mut() {
            o.remove(&addr);
        }
        Some(b)
    }

    #[inline]
    pub(super) fn forget_end(&mut self, addr: u64, b: &Blk) {
        self.forget_end_at(addr.saturating_add(b.size), addr);
    }

    /// Drop `end` from the end index if it names the block at `addr`: one probe in the usual
    /// case (the entry is ours), an entry of another block put back otherwise.
    #[inline]
    fn forget_end_at(&mut self, end: u64, addr: u64) {
        if let Some(other) = self.ends.remove(&end)
            && other != addr
        {
            self.ends.insert(end, other);
        }
    }

    /// The block just below `addr`: the one ending at `addr` (with `ordered`: the one with the
    /// highest start below `addr`, wherever it ends).
    #[inline]
    pub(super) fn below(&self, addr: u64) -> Option<(u64, Blk)> {
        let p = match &self.ordered {
            Some(o) => *o.range(..addr).next_back()?,
            None => *self.ends.get(&addr).filter(|&&p| p != addr)?,
        };
        self.at.get(&p).map(|b| (p, *b))
    }

    /// The block starting at or below `addr` with the highest start (ordered index).
    pub(super) fn floor(&mut self, addr: u64) -> Option<(u64, Blk)> {
        let at = &self.at;
        let o = self
            .ordered
            .get_or_insert_with(|| at.keys().copied().collect());
        let &a = o.range(..=addr).next_back()?;
        self.at.get(&a).map(|b| (a, *b))
    }

    /// Stop keeping block starts in order.
    pub(super) fn unorder(&mut self) {
        self.ordered = None;
    }

    /// The block with the highest start (`ordered` only).
    pub(super) fn last(&self) -> Option<Option<(u64, Blk)>> {
        let o = self.ordered.as_ref()?;
        Some(o.last().and_then(|&a| self.at.get(&a).map(|b| (a, *b))))
    }

    /// The lowest block start at or above `from` and below `to` (`ordered` only).
    pub(super) fn first_in(&self, from: u64, to: u64) -> Option<Option<u64>> {
        let o = self.ordered.as_ref()?;
        Some(o.range(from..to).next().copied())
    }

    /// The lowest block start at or above `from` (`ordered` only).
    pub(super) fn first_from(&self, from: u64) -> Option<Option<u64>> {
        let o = self.ordered.as_ref()?;
        Some(o.range(from..).next().copied())
    }

    /// Every block, by address.
    pub fn sorted(&self) -> Vec<(u64, Blk)> {
        let mut v: Vec<(u64, Blk)> = self.at.iter().map(|(&a, &b)| (a, b)).collect();
        v.sort_unstable_by_key(|x| x.0);
        v
    }

    /// Every block, in no order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &Blk)> {
        self.at.iter().map(|(&a, b)| (a, b))
    }
}
