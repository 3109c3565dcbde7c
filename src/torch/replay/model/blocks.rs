//! The model's blocks: records in a slab, found by start address, linked to their neighbours.

use std::collections::BTreeSet;

use rustc_hash::FxHashMap;

use super::{Blk, St};

/// No block (an end of a segment's list; no slot).
pub(crate) const NIL: u32 = u32::MAX;
/// The address of a vacant slot's record (which no hint then matches).
const VACANT: u64 = u64::MAX;

/// One block's record in the slab.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Node {
    pub blk: Blk,
    pub addr: u64,
    /// The blocks below and above in the same segment (linked mode), or [`NIL`].
    prev: u32,
    next: u32,
}

/// Where in a segment's list a block goes: between `prev` and `next` (slots, or [`NIL`]).
/// [`Blocks::remove_slot`] leaves the gap it made; [`Blocks::gap_after`] opens one after a
/// block; inserting into a gap moves it past the new block, so that a run of pieces inserted in
/// address order links up.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Gap {
    prev: u32,
    next: u32,
}

impl Gap {
    /// A block with no neighbours (a whole new segment, or any block while the starts are
    /// ordered).
    pub const fn none() -> Gap {
        Gap {
            prev: NIL,
            next: NIL,
        }
    }
}

/// The blocks of the live segments. PyTorch links a segment's blocks in a list; so does this
/// (`prev`, `next` of each [`Node`]): the neighbours of a block that is being freed or split
/// are its links, not lookups. The records live in a slab (slots reused); a hash map finds a
/// block's slot by its start address (the requests name blocks by address).
///
/// `ordered`, the block starts in order, is kept while the initial state is carved (by
/// address), and for good when that state is irregular (segments that overlap or are empty, or
/// blocks that do not fit: a corrupt snapshot): then the blocks need not tile disjoint
/// segments, the links are not kept, and every neighbour and ordered question is answered from
/// the ordered starts exactly as an ordered map of blocks answers it. Otherwise (linked mode)
/// the blocks tile their segments and the links are made when the order is dropped
/// ([`Blocks::unorder`]) and kept by every change after it.
#[derive(Clone, Debug, Default)]
pub(crate) struct Blocks {
    pub(super) index: FxHashMap<u64, u32>,
    pub(super) nodes: Vec<Node>,
    pub(super) vacant: Vec<u32>,
    pub(super) ordered: Option<BTreeSet<u64>>,
}

impl Blocks {
    /// The slot of the block starting at `addr`.
    #[inline]
    pub fn slot(&self, addr: u64) -> Option<u32> {
        self.index.get(&addr).copied()
    }

    /// [`Blocks::slot`], tried first at `hint` (where the block was handed out: a block keeps
    /// its slot while it is allocated), without a lookup when the hint holds.
    #[inline]
    pub fn slot_hinted(&self, addr: u64, hint: u32) -> Option<u32> {
        match self.nodes.get(hint as usize) {
            Some(n) if n.addr == addr && addr != VACANT => Some(hint),
            _ => self.slot(addr),
        }
    }

    #[inline]
    pub fn node(&self, s: u32) -> &Node {
        &self.nodes[s as usize]
    }

    #[inline]
    pub(super) fn blk_mut(&mut self, s: u32) -> &mut Blk {
        &mut self.nodes[s as usize].blk
    }

    #[inline]
    pub fn get(&self, addr: u64) -> Option<&Blk> {
        self.slot(addr).map(|s| &self.nodes[s as usize].blk)
    }

    fn linked(&self) -> bool {
        self.ordered.is_none()
    }

    /// Insert a block with no neighbours in its list (a new segment, or any block while the
    /// starts are ordered).
    #[inline]
    pub(super) fn insert(&mut self, addr: u64, b: Blk) -> u32 {
        self.insert_in(&mut Gap::none(), addr, b)
    }

    /// Insert a block into `gap` (which then lies after it). A block already at `addr` is
    /// given the new record and keeps its place.
    #[inline]
    pub(super) fn insert_in(&mut self, gap: &mut Gap, addr: u64, b: Blk) -> u32 {
        // One probe of the index: the block already there, or the place for the new slot.
        let place = match self.index.entry(addr) {
            std::collections::hash_map::Entry::Occupied(o) => {
                let s = *o.get();
                self.nodes[s as usize].blk = b;
                return s;
            }
            std::collections::hash_map::Entry::Vacant(v) => v,
        };
        let (prev, next) = if self.ordered.is_none() {
            (gap.prev, gap.next)
        } else {
            (NIL, NIL)
        };
        let node = Node {
            blk: b,
            addr,
            prev,
            next,
        };
        let s = match self.vacant.pop() {
            Some(s) => {
                self.nodes[s as usize] = node;
                s
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        if prev != NIL {
            self.nodes[prev as usize].next = s;
        }
        if next != NIL {
            self.nodes[next as usize].prev = s;
        }
        gap.prev = s;
        place.insert(s);
        if let Some(o) = self.ordered.as_mut() {
            o.insert(addr);
        }
        s
    }

    /// The gap right after the block in slot `s`.
    #[inline]
    pub(super) fn gap_after(&self, s: u32) -> Gap {
        if !self.linked() {
            return Gap::none();
        }
        Gap {
            prev: s,
            next: self.nodes[s as usize].next,
        }
    }

    /// Give the block in slot `s` a new size and state in place (its neighbours stay).
    #[inline]
    pub(super) fn update_slot(&mut self, s: u32, size: u64, state: St) {
        let b = &mut self.nodes[s as usize].blk;
        b.size = size;
        b.state = state;
    }

    #[inline]
    pub(super) fn remove(&mut self, addr: u64) -> Option<Blk> {
        let s = self.slot(addr)?;
        Some(self.remove_slot(s).0)
    }

    /// Take the block in slot `s` out; its neighbours are linked to each other, and the gap
    /// between them is returned.
    #[inline]
    pub(super) fn remove_slot(&mut self, s: u32) -> (Blk, Gap) {
        let Node {
            blk,
            addr,
            prev,
            next,
        } = self.nodes[s as usize];
        if prev != NIL {
            self.nodes[prev as usize].next = next;
        }
        if next != NIL {
            self.nodes[next as usize].prev = prev;
        }
        self.index.remove(&addr);
        self.nodes[s as usize].addr = VACANT;
        self.vacant.push(s);
        if let Some(o) = self.ordered.as_mut() {
            o.remove(&addr);
        }
        (blk, Gap { prev, next })
    }

    /// The block below the one in slot `s`: its link (with `ordered`: the block with the
    /// highest start below it, wherever it ends).
    #[inline]
    pub(super) fn prev_slot(&self, s: u32) -> Option<u32> {
        match &self.ordered {
            Some(o) => {
                let addr = self.nodes[s as usize].addr;
                self.slot(*o.range(..addr).next_back()?)
            }
            None => Some(self.nodes[s as usize].prev).filter(|&p| p != NIL),
        }
    }

    /// The block above the one in slot `s`: its link (with `ordered`: the block starting where
    /// it ends).
    #[inline]
    pub(super) fn next_slot(&self, s: u32) -> Option<u32> {
        match &self.ordered {
            Some(_) => {
                let n = &self.nodes[s as usize];
                self.slot(n.addr.saturating_add(n.blk.size))
            }
            None => Some(self.nodes[s as usize].next).filter(|&n| n != NIL),
        }
    }

    /// The block just below the block at `addr` (see [`Blocks::prev_slot`]; with `ordered`,
    /// `addr` need not start a block).
    #[inline]
    pub(super) fn below(&self, addr: u64) -> Option<(u64, Blk)> {
        let p = match &self.ordered {
            Some(o) => self.slot(*o.range(..addr).next_back()?)?,
            None => self.prev_slot(self.slot(addr)?)?,
        };
        let n = &self.nodes[p as usize];
        Some((n.addr, n.blk))
    }

    /// The block starting at or below `addr` with the highest start (ordered index).
    pub(super) fn floor(&mut self, addr: u64) -> Option<(u64, Blk)> {
        let index = &self.index;
        let o = self
            .ordered
            .get_or_insert_with(|| index.keys().copied().collect());
        let &a = o.range(..=addr).next_back()?;
        self.get(a).map(|b| (a, *b))
    }

    /// Stop keeping block starts in order: link each block to the one that starts where it
    /// ends in its segment (the blocks tile their segments).
    pub(super) fn unorder(&mut self) {
        let Some(o) = self.ordered.take() else {
            return;
        };
        for n in &mut self.nodes {
            n.prev = NIL;
            n.next = NIL;
        }
        let mut last: Option<u32> = None;
        for a in o {
            let Some(s) = self.slot(a) else { continue };
            if let Some(p) = last {
                let pn = self.nodes[p as usize];
                if pn.blk.seg == self.nodes[s as usize].blk.seg
                    && pn.addr.saturating_add(pn.blk.size) == a
                {
                    self.nodes[p as usize].next = s;
                    self.nodes[s as usize].prev = p;
                }
            }
            last = Some(s);
        }
    }

    /// Keep the block starts in order from now on (tests compare both ways of answering).
    #[cfg(test)]
    pub(super) fn keep_ordered(&mut self) {
        if self.ordered.is_none() {
            self.ordered = Some(self.index.keys().copied().collect());
        }
    }

    /// The block with the highest start (`ordered` only).
    pub(super) fn last(&self) -> Option<Option<(u64, Blk)>> {
        let o = self.ordered.as_ref()?;
        Some(o.last().and_then(|&a| self.get(a).map(|b| (a, *b))))
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
        let mut v: Vec<(u64, Blk)> = self.iter().map(|(a, &b)| (a, b)).collect();
        v.sort_unstable_by_key(|x| x.0);
        v
    }

    /// Every block, in no order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &Blk)> {
        self.index
            .iter()
            .map(|(&a, &s)| (a, &self.nodes[s as usize].blk))
    }
}
