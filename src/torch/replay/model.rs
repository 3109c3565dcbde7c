//! A model of PyTorch's `DeviceCachingAllocator` (c10/cuda/CUDACachingAllocator.cpp) for one
//! device: segments cut into blocks, best-fit free lists per pool ordered by
//! (stream, size, address), splitting, merging, the OOM release path and expandable segments.
//!
//! Whether the device grants a new segment (cudaMalloc) or page mapping is not the model's to
//! know: a [`Device`] answers, either from what the recorded trace shows or from a capacity.

use std::collections::{BTreeMap, BTreeSet};

mod blocks;
mod expandable;

pub(crate) use blocks::{Blocks, Gap, NIL};

use super::free::{FreeKey, FreeLists, Release};
use super::settings::{
    LARGE_BUFFER, SMALL_BUFFER, SMALL_SIZE, Settings, allocation_size, round_up,
};

/// What happened to device memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SegKind {
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
}

impl SegKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SegKind::SegmentAlloc => "segment_alloc",
            SegKind::SegmentFree => "segment_free",
            SegKind::SegmentMap => "segment_map",
            SegKind::SegmentUnmap => "segment_unmap",
        }
    }
}

/// One segment event, recorded or predicted; `step` ties it to the trace position that caused it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegEvent {
    pub kind: SegKind,
    pub addr: u64,
    pub size: u64,
    pub step: usize,
}

/// Answers whether the device gives more memory.
pub trait Device {
    /// May `bytes` more be reserved on top of `reserved`? `attempt`: 0 first try, 1 after the
    /// oversize blocks were released (max_split_size), 2 after every cached segment was released.
    /// `released`: segments the model released so far in this malloc.
    fn grant(&mut self, reserved: u64, bytes: u64, attempt: u8, released: u64) -> bool;
    /// An address for a new segment of `size` bytes (`expandable`: the base of a new expandable
    /// range), or `None` to let the model pick a fresh one.
    fn segment_address(&mut self, size: u64, expandable: bool) -> Option<u64>;
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum St {
    Free,
    Alloc,
    /// Freed by the program, not yet reusable (`free_requested` without `free_completed`).
    Pending,
    /// Expandable-segment address space without memory behind it.
    Unmapped,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Blk {
    pub size: u64,
    pub seg: u32,
    pub state: St,
}

#[derive(Clone, Debug)]
pub(crate) struct Seg {
    pub addr: u64,
    /// Bytes (expandable: the whole reserved address range).
    pub size: u64,
    pub stream: u64,
    pub small: bool,
    pub expandable: bool,
    pub alive: bool,
}

impl Seg {
    fn page(&self) -> u64 {
        if self.small {
            SMALL_BUFFER
        } else {
            LARGE_BUFFER
        }
    }
}

/// What a release would do with a free block of `size` bytes at `addr` of segment `s`.
fn release_for(s: &Seg, addr: u64, size: u64) -> Release {
    if !s.expandable {
        return if s.addr == addr && s.size == size {
            Release::Segment
        } else {
            Release::Keep
        };
    }
    let page = s.page();
    let off = addr.saturating_sub(s.addr);
    if off.div_ceil(page) < off.saturating_add(size) / page {
        Release::Pages
    } else {
        Release::Keep
    }
}

/// Where fresh model-made addresses start (far above any real 47-bit address).
const SYNTHETIC_BASE: u64 = 1 << 56;
/// Address space reserved for an expandable segment whose end is not known.
pub(crate) const ES_DEFAULT_SPAN: u64 = 1 << 40;

/// Result of one allocation request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Malloc {
    Ok { addr: u64, block: u64 },
    Oom,
}

#[derive(Clone, Debug)]
pub(crate) struct Model {
    pub settings: Settings,
    pub blocks: Blocks,
    /// Live segments by base address (their blocks tile them).
    seg_at: BTreeMap<u64, u32>,
    /// The initial state is irregular (see [`Blocks`]): keep the blocks ordered.
    irregular: bool,
    free: FreeLists,
    /// Unmapped expandable blocks: (small, stream, address).
    unmapped: BTreeSet<(bool, u64, u64)>,
    pub segs: Vec<Seg>,
    pub reserved: u64,
    pub allocated: u64,
    pub peak_reserved: u64,
    pub peak_allocated: u64,
    /// Mallocs that took the OOM path: the device refused their first segment.
    pub retries: u64,
    /// Of those, the ones the path did not serve (an OOM).
    pub retries_failed: u64,
    pub events: Vec<SegEvent>,
    /// The step new events are tagged with.
    pub step: usize,
    next_synthetic: u64,
    /// The slot of the block the last successful malloc handed out (a hint for its frees).
    pub handed: u32,
    /// Releases (`segment_free`, `segment_unmap`) made so far, and when the current malloc began.
    released: u64,
    call_start: u64,
    /// Blocks visited by the model's walks (free lists, releases, neighbours, segments): the
    /// operation count that shows the replay's cost per trace entry bounded whatever the input.
    pub visits: std::cell::Cell<u64>,
}

impl Model {
    pub fn new(settings: Settings) -> Model {
        Model {
            settings,
            blocks: Blocks {
                ordered: Some(BTreeSet::new()),
                ..Blocks::default()
            },
            seg_at: BTreeMap::new(),
            irregular: false,
            free: FreeLists::default(),
            unmapped: BTreeSet::new(),
            segs: Vec::new(),
            reserved: 0,
            allocated: 0,
            peak_reserved: 0,
            peak_allocated: 0,
            retries: 0,
            retries_failed: 0,
            events: Vec::new(),
            step: 0,
            next_synthetic: SYNTHETIC_BASE,
            handed: NIL,
            released: 0,
            call_start: 0,
            visits: std::cell::Cell::new(0),
        }
    }

    // ---- building the initial state ----

    /// Add a segment (non-expandable) whose blocks are all free; returns its index.
    pub fn add_segment(&mut self, addr: u64, size: u64, stream: u64, small: bool) -> u32 {
        self.note_irregular(addr, size);
        let i = self.segs.len() as u32;
        self.segs.push(Seg {
            addr,
            size,
            stream,
            small,
            expandable: false,
            alive: true,
        });
        self.seg_at.insert(addr, i);
        self.blocks.insert(
            addr,
            Blk {
                size,
                seg: i,
                state: St::Free,
            },
        );
        self.free
            .insert((small, stream, size, addr), Release::Segment);
        self.reserved = self.reserved.saturating_add(size);
        self.bump_peaks();
        i
    }

    /// Add an expandable segment spanning `[addr, addr+span)`, all unmapped; returns its index.
    pub fn add_expandable(&mut self, addr: u64, span: u64, stream: u64, small: bool) -> u32 {
        self.note_irregular(addr, span);
        let i = self.segs.len() as u32;
        self.segs.push(Seg {
            addr,
            size: span,
            stream,
            small,
            expandable: true,
            alive: true,
        });
        self.seg_at.insert(addr, i);
        self.blocks.insert(
            addr,
            Blk {
                size: span,
                seg: i,
                state: St::Unmapped,
            },
        );
        self.unmapped.insert((small, stream, addr));
        i
    }

    /// Answer every question from the ordered block starts, as for an irregular state (tests
    /// compare both ways of answering).
    #[cfg(test)]
    pub fn keep_ordered(&mut self) {
        self.irregular = true;
        self.blocks.keep_ordered();
    }

    /// A segment about to be added collides with what is there, or is empty.
    fn note_irregular(&mut self, addr: u64, size: u64) {
        if size == 0 || self.collides(addr, size) {
            self.irregular = true;
        }
    }

    /// Mark `[addr, addr+size)` of an expandable segment as mapped and free (initial state).
    pub fn init_map(&mut self, seg: u32, addr: u64, size: u64) -> bool {
        let ok = self.init_map_inner(seg, addr, size);
        if !ok || size == 0 {
            self.irregular = true;
        }
        ok
    }

    fn init_map_inner(&mut self, seg: u32, addr: u64, size: u64) -> bool {
        let Some((start, b)) = self.blocks.floor(addr) else {
            return false;
        };
        if b.seg != seg
            || b.state != St::Unmapped
            || start.saturating_add(b.size) < addr.saturating_add(size)
        {
            return false;
        }
        let s = &self.segs[seg as usize];
        let key = (s.small, s.stream);
        self.unmapped.remove(&(key.0, key.1, start));
        self.blocks.remove(start);
        // Carved while the block starts are ordered: no list to place the pieces in.
        if addr > start {
            self.put_unmapped(&mut Gap::none(), start, addr - start, seg);
        }
        let end = addr.saturating_add(size);
        let bend = start.saturating_add(b.size);
        if bend > end {
            self.put_unmapped(&mut Gap::none(), end, bend - end, seg);
        }
        self.blocks.insert(
            addr,
            Blk {
                size,
                seg,
                state: St::Free,
            },
        );
        let merged = self.merge_free(addr);
        self.insert_free(merged);
        self.reserved = self.reserved.saturating_add(size);
        self.bump_peaks();
        true
    }

    /// Carve an allocated (or pending) block out of a free block (initial state).
    pub fn init_alloc(&mut self, addr: u64, size: u64, pending: bool) -> bool {
        let ok = self.init_alloc_inner(addr, size, pending);
        if !ok {
            self.irregular = true;
        }
        ok
    }

    fn init_alloc_inner(&mut self, addr: u64, size: u64, pending: bool) -> bool {
        let Some((start, b)) = self.blocks.floor(addr) else {
            return false;
        };
        if b.state != St::Free
            || start.saturating_add(b.size) < addr.saturating_add(size)
            || size == 0
        {
            return false;
        }
        self.remove_free(start);
        self.blocks.remove(start);
        if addr > start {
            self.blocks.insert(
                start,
                Blk {
                    size: addr - start,
                    seg: b.seg,
                    state: St::Free,
                },
            );
            self.insert_free(start);
        }
        let end = addr.saturating_add(size);
        let bend = start.saturating_add(b.size);
        if bend > end {
            self.blocks.insert(
                end,
                Blk {
                    size: bend - end,
                    seg: b.seg,
                    state: St::Free,
                },
            );
            self.insert_free(end);
        }
        self.blocks.insert(
            addr,
            Blk {
                size,
                seg: b.seg,
                state: if pending { St::Pending } else { St::Alloc },
            },
        );
        if !pending {
            self.allocated = self.allocated.saturating_add(size);
        }
        self.bump_peaks();
        true
    }

    /// After the initial state is built: new synthetic addresses start above all known ones.
    pub fn finish_init(&mut self) {
        if !self.irregular {
            self.blocks.unorder();
        }
        self.peak_allocated = self.allocated;
        self.peak_reserved = self.reserved;
        self.events.clear();
    }

    // ---- small helpers ----

    fn bump_peaks(&mut self) {
        self.peak_reserved = self.peak_reserved.max(self.reserved);
        self.peak_allocated = self.peak_allocated.max(self.allocated);
    }

    /// The free-list key of the block at `addr` and what a release would do with it, from one
    /// lookup of the block and its segment.
    fn free_entry(&self, addr: u64) -> Option<(FreeKey, Release)> {
        self.free_entry_of(addr, *self.blocks.get(addr)?)
    }

    /// [`Model::free_entry`] of the block `b` at `addr`, its record already at hand.
    fn free_entry_of(&self, addr: u64, b: Blk) -> Option<(FreeKey, Release)> {
        let s = self.segs.get(b.seg as usize)?;
        Some((
            (s.small, s.stream, b.size, addr),
            release_for(s, addr, b.size),
        ))
    }

    fn insert_free(&mut self, addr: u64) {
        if let Some((k, r)) = self.free_entry(addr) {
            self.free.insert(k, r);
        }
    }

    fn remove_free(&mut self, addr: u64) {
        if let Some((k, r)) = self.free_entry(addr) {
            self.free.remove(&k, r);
        }
    }

    /// Count `n` block visits.
    pub(crate) fn visit(&self, n: u64) {
        self.visits.set(self.visits.get().saturating_add(n));
    }

    fn put_unmapped(&mut self, gap: &mut Gap, addr: u64, size: u64, seg: u32) {
        self.blocks.insert_in(
            gap,
            addr,
            Blk {
                size,
                seg,
                state: St::Unmapped,
            },
        );
        let s = &self.segs[seg as usize];
        self.unmapped.insert((s.small, s.stream, addr));
    }

    fn prev_of(&self, addr: u64) -> Option<(u64, Blk)> {
        self.prev_of_block(addr, *self.blocks.get(addr)?)
    }

    /// [`Model::prev_of`] of the block `b` at `addr`, its record already at hand.
    fn prev_of_block(&self, addr: u64, b: Blk) -> Option<(u64, Blk)> {
        let (p, pb) = self.blocks.below(addr)?;
        (pb.seg == b.seg && p.saturating_add(pb.size) == addr).then_some((p, pb))
    }

    fn next_of(&self, addr: u64) -> Option<(u64, Blk)> {
        self.next_of_block(addr, *self.blocks.get(addr)?)
    }

    /// [`Model::next_of`] of the block `b` at `addr`, its record already at hand.
    fn next_of_block(&self, addr: u64, b: Blk) -> Option<(u64, Blk)> {
        let end = addr.saturating_add(b.size);
        let nb = self.blocks.get(end)?;
        (nb.seg == b.seg && end != addr).then_some((end, *nb))
    }

    /// Is this block the whole of its segment (`!prev && !next`)?
    fn is_whole_segment(&self, addr: u64) -> bool {
        self.blocks.get(addr).is_some_and(|b| {
            self.segs
                .get(b.seg as usize)
                .is_some_and(|s| s.addr == addr && s.size == b.size)
        })
    }

    /// Merge a free (mapped) block at `addr` with free neighbours; returns the merged address.
    /// The merged block is not in the free list.
    fn merge_free(&mut self, addr: u64) -> u64 {
        self.merge_same(addr, St::Free)
    }

    fn merge_same(&mut self, addr: u64, state: St) -> u64 {
        match self.blocks.slot(addr) {
            Some(s) => {
                let m = self.merge_slot(s, state);
                self.blocks.node(m).addr
            }
            None => addr,
        }
    }

    /// [`Model::merge_same`] of the block in slot `s`: the merged block's slot.
    fn merge_slot(&mut self, s: u32, state: St) -> u32 {
        let mut s = s;
        let (addr, mut b) = {
            let n = self.blocks.node(s);
            (n.addr, n.blk)
        };
        let end = addr.saturating_add(b.size);
        // The block after, grown into this one.
        if let Some(n) = self.blocks.next_slot(s) {
            let nn = *self.blocks.node(n);
            if nn.addr == end && nn.blk.seg == b.seg && end != addr && nn.blk.state == state {
                self.unlist(nn.addr, nn.blk);
                self.blocks.remove_slot(n);
                b.size = b.size.saturating_add(nn.blk.size);
                self.blocks.update_slot(s, b.size, b.state);
            }
        }
        // The block before grows over this one, in place.
        if let Some(p) = self.blocks.prev_slot(s) {
            let pn = *self.blocks.node(p);
            if pn.blk.seg == b.seg
                && pn.addr.saturating_add(pn.blk.size) == addr
                && pn.blk.state == state
            {
                self.blocks.remove_slot(s);
                self.unlist(pn.addr, pn.blk);
                self.blocks
                    .update_slot(p, pn.blk.size.saturating_add(b.size), state);
                s = p;
            }
        }
        s
    }

    /// Remove a block from the address map and its free/unmapped set; the gap it leaves.
    fn detach(&mut self, addr: u64, b: Blk) -> Gap {
        self.unlist(addr, b);
        match self.blocks.slot(addr) {
            Some(s) => self.blocks.remove_slot(s).1,
            None => Gap::none(),
        }
    }

    /// Take a block out of its free/unmapped set (it stays in the address map).
    fn unlist(&mut self, addr: u64, b: Blk) {
        match b.state {
            St::Free => {
                if let Some((k, r)) = self.free_entry_of(addr, b) {
                    self.free.remove(&k, r);
                }
            }
            St::Unmapped => {
                let s = &self.segs[b.seg as usize];
                self.unmapped.remove(&(s.small, s.stream, addr));
            }
            _ => {}
        }
    }

    fn released_in_call(&self) -> u64 {
        self.released - self.call_start
    }

    fn emit(&mut self, kind: SegKind, addr: u64, size: u64) {
        if matches!(kind, SegKind::SegmentFree | SegKind::SegmentUnmap) {
            self.released += 1;
        }
        self.events.push(SegEvent {
            kind,
            addr,
            size,
            step: self.step,
        });
    }

    /// A free address range of `size` bytes that overlaps nothing known: `wanted` when free,
    /// else a fresh one above every known block.
    fn fresh_address(&mut self, size: u64, wanted: Option<u64>) -> u64 {
        if let Some(a) = wanted
            && a != 0
            && !self.overlaps(a, size)
        {
            return a;
        }
        // The blocks tile the live segments: the last one ends where the last segment does.
        let top = match self.blocks.last() {
            Some(last) => last.map_or(0, |(a, b)| a.saturating_add(b.size)),
            None => self
                .seg_at
                .last_key_value()
                .and_then(|(&a, &i)| self.segs.get(i as usize).map(|s| a.saturating_add(s.size)))
                .unwrap_or(0),
        };
        let a = round_up(self.next_synthetic.max(top), SMALL_BUFFER);
        self.next_synthetic = a.saturating_add(size.max(1));
        a
    }

    /// Does `[addr, addr+size)` meet a block (that is, a live segment, which its blocks tile)?
    fn overlaps(&self, addr: u64, size: u64) -> bool {
        let end = addr.saturating_add(size);
        if let Some(first) = self.blocks.first_in(addr, end) {
            // Ordered blocks: exactly the ordered-map question.
            if let Some((p, pb)) = self.blocks.below(addr.saturating_add(1))
                && p.saturating_add(pb.size) > addr
            {
                return true;
            }
            return first.is_some();
        }
        if let Some((&p, &i)) = self.seg_at.range(..=addr).next_back()
            && self
                .segs
                .get(i as usize)
                .is_some_and(|s| p.saturating_add(s.size) > addr)
        {
            return true;
        }
        self.seg_at.range(addr..end).next().is_some()
    }

    // ---- the allocator ----

    /// `malloc` of `req` bytes on `stream`: the model's block address, or OOM.
    pub fn malloc(&mut self, req: u64, stream: u64, dev: &mut dyn Device) -> Malloc {
        let size = self.settings.round_size(req);
        self.malloc_rounded(size, stream, dev)
    }

    /// `malloc` of an already rounded size (an `oom` entry records the rounded size).
    pub fn malloc_rounded(&mut self, size: u64, stream: u64, dev: &mut dyn Device) -> Malloc {
        let small = size <= SMALL_SIZE;
        let alloc_size = allocation_size(size);
        self.call_start = self.released;
        // A cached block comes with its record (no second lookup); a new one is looked up.
        let mut found = self.get_free_block(small, stream, size);
        if found.is_none() {
            let mut block = self.alloc_block(small, stream, size, alloc_size, dev, 0);
            self.retries += u64::from(block.is_none());
            if block.is_none() && self.release_available_cached_blocks(small, stream, size) {
                block = self.alloc_block(small, stream, size, alloc_size, dev, 1);
            }
            if block.is_none() {
                self.release_cached_blocks();
                block = self.alloc_block(small, stream, size, alloc_size, dev, 2);
                self.retries_failed += u64::from(block.is_none());
            }
            found = block.map(|a| (a, self.blocks.slot(a)));
        }
        match found {
            Some((addr, Some(s))) => {
                let b = self.alloc_found_block(s, size);
                self.handed = s;
                Malloc::Ok { addr, block: b }
            }
            Some((addr, None)) => {
                self.handed = NIL;
                Malloc::Ok { addr, block: 0 }
            }
            None => Malloc::Oom,
        }
    }

    /// Would `get_free_block` find a cached block for a request of `size` (rounded) bytes?
    pub fn would_find(&self, size: u64, stream: u64) -> bool {
        self.pick_free_block(size <= SMALL_SIZE, stream, size)
            .is_some()
    }

    /// `get_free_block`: take the best-fitting cached block out of its free list.
    /// The block's address and slot (`None`: a free-list key without a block, which only a
    /// corrupt initial state leaves).
    fn get_free_block(
        &mut self,
        small: bool,
        stream: u64,
        size: u64,
    ) -> Option<(u64, Option<u32>)> {
        let (key, s) = self.pick_free_block(small, stream, size)?;
        if let Some((k, r)) = s.and_then(|s| self.free_entry_of(key.3, self.blocks.node(s).blk)) {
            self.free.remove(&k, r);
        }
        Some((key.3, s))
    }

    /// The best-fitting cached block's key, and its slot (`None`: a key without a block).
    fn pick_free_block(
        &self,
        small: bool,
        stream: u64,
        size: u64,
    ) -> Option<(FreeKey, Option<u32>)> {
        let (key, blk) = {
            // The best fit is the first block unless it is expandable (the common case: one
            // lookup, no walk).
            let mut cur = self.free.first_from(small, stream, size)?;
            self.visit(1);
            let first = self.blocks.slot(cur.3);
            if !first.is_some_and(|s| self.in_expandable(self.blocks.node(s).blk)) {
                (cur, first)
            } else {
                let mut it = self
                    .free
                    .from(small, stream, size)
                    .skip(1)
                    .inspect(|_| self.visit(1));
                if self.settings.expandable_segments {
                    // Best fit counts an expandable block with the unmapped space after it.
                    for next in it {
                        if !self.is_expandable(cur.3)
                            || self.expandable_size(next.3) >= self.expandable_size(cur.3)
                        {
                            break;
                        }
                        cur = next;
                    }
                } else {
                    cur = it.find(|k| !self.is_expandable(k.3))?;
                }
                (cur, self.blocks.slot(cur.3))
            }
        };
        let s = &self.settings;
        if size < s.max_split_size && key.2 >= s.max_split_size {
            return None;
        }
        if size >= s.max_split_size && key.2 >= size.saturating_add(s.max_non_split_rounding) {
            return None;
        }
        Some((key, blk))
    }

    fn is_expandable(&self, addr: u64) -> bool {
        self.blocks
            .get(addr)
            .is_some_and(|&b| self.in_expandable(b))
    }

    /// Is the block `b` part of an expandable segment?
    fn in_expandable(&self, b: Blk) -> bool {
        self.segs.get(b.seg as usize).is_some_and(|s| s.expandable)
    }

    fn expandable_size(&self, addr: u64) -> u64 {
        let Some(b) = self.blocks.get(addr) else {
            return 0;
        };
        let next = match self.next_of(addr) {
            Some((_, nb)) if nb.state == St::Unmapped => nb.size,
            _ => 0,
        };
        b.size.saturating_add(next)
    }

    /// `alloc_found_block`: hand out the block at `addr` (already out of the free list), split
    /// when the rest is worth keeping; returns the block's size.
    fn alloc_found_block(&mut self, s: u32, size: u64) -> u64 {
        let (addr, b) = {
            let n = self.blocks.node(s);
            (n.addr, n.blk)
        };
        let small = self.segs[b.seg as usize].small;
        let split = self.settings.should_split(small, b.size, size) && size < b.size;
        let bsize = if split { size } else { b.size };
        self.blocks.update_slot(s, bsize, St::Alloc);
        if split {
            // Saturating, as every end here: a block ending past 2^64 is not from a CUDA device
            // (a corrupt or hostile snapshot), and must not bring the replay down.
            let rest = addr.saturating_add(size);
            let rb = Blk {
                size: b.size - size,
                seg: b.seg,
                state: St::Free,
            };
            let mut gap = self.blocks.gap_after(s);
            self.blocks.insert_in(&mut gap, rest, rb);
            if let Some((k, r)) = self.free_entry_of(rest, rb) {
                self.free.insert(k, r);
            }
        }
        self.allocated = self.allocated.saturating_add(bsize);
        self.bump_peaks();
        bsize
    }

    /// `alloc_block`: a new segment (or mapped pages) for the request; the block is not in the
    /// free list.
    fn alloc_block(
        &mut self,
        small: bool,
        stream: u64,
        size: u64,
        alloc_size: u64,
        dev: &mut dyn Device,
        attempt: u8,
    ) -> Option<u64> {
        if self.settings.expandable_segments {
            return self.try_allocate_expandable_block(small, stream, size, dev, attempt);
        }
        if !dev.grant(self.reserved, alloc_size, attempt, self.released_in_call()) {
            return None;
        }
        let wanted = dev.segment_address(alloc_size, false);
        let addr = self.fresh_address(alloc_size, wanted);
        let i = self.segs.len() as u32;
        self.segs.push(Seg {
            addr,
            size: alloc_size,
            stream,
            small,
            expandable: false,
            alive: true,
        });
        self.seg_at.insert(addr, i);
        self.blocks.insert(
            addr,
            Blk {
                size: alloc_size,
                seg: i,
                state: St::Free,
            },
        );
        self.reserved = self.reserved.saturating_add(alloc_size);
        self.bump_peaks();
        self.emit(SegKind::SegmentAlloc, addr, alloc_size);
        Some(addr)
    }

    /// The program frees a block (`free_requested`): no longer allocated, not yet reusable.
    pub fn free_requested(&mut self, addr: u64) -> bool {
        self.free_requested_at(addr, NIL)
    }

    /// [`Model::free_requested`] of the block handed out in slot `hint` ([`Model::handed`]).
    #[inline]
    pub fn free_requested_at(&mut self, addr: u64, hint: u32) -> bool {
        let Some(s) = self.blocks.slot_hinted(addr, hint) else {
            return false;
        };
        let b = self.blocks.blk_mut(s);
        if b.state != St::Alloc {
            return false;
        }
        b.state = St::Pending;
        self.allocated = self.allocated.saturating_sub(b.size);
        true
    }

    /// `free_block` (`free_completed`): the block returns to the cache, merged with neighbours.
    pub fn free_completed(&mut self, addr: u64) -> bool {
        self.free_completed_at(addr, NIL)
    }

    /// [`Model::free_completed`] of the block handed out in slot `hint` ([`Model::handed`]).
    #[inline]
    pub fn free_completed_at(&mut self, addr: u64, hint: u32) -> bool {
        let Some(s) = self.blocks.slot_hinted(addr, hint) else {
            return false;
        };
        let b = self.blocks.blk_mut(s);
        match b.state {
            St::Pending => {}
            St::Alloc => self.allocated = self.allocated.saturating_sub(b.size),
            _ => return false,
        }
        b.state = St::Free;
        let merged = self.merge_slot(s, St::Free);
        let n = *self.blocks.node(merged);
        if let Some((k, r)) = self.free_entry_of(n.addr, n.blk) {
            self.free.insert(k, r);
        }
        true
    }

    /// `release_cached_blocks` (OOM retry and `empty_cache()`): every cached block that is a
    /// whole segment is freed, large pool first, each pool in (stream, size, address) order;
    /// expandable segments give back their completely free pages.
    pub fn release_cached_blocks(&mut self) {
        for small in [false, true] {
            // Only the blocks a release gives back (a release takes each out of the lists).
            let (segments, pages) = self.free.releasable(small);
            self.visit((segments.len() + pages.len()) as u64);
            for k in segments {
                if self.is_whole_segment(k.3) && !self.is_expandable(k.3) {
                    self.release_block(k.3);
                }
                // A key the block at its address no longer fits (a corrupt initial state
                // whose segments collide) is not visited again.
                self.free.forget(&k, Release::Segment);
            }
            for k in pages {
                if self.is_expandable(k.3)
                    && let Some(u) = self.unmap_block(k.3)
                {
                    self.maybe_release_expandable(u);
                }
                self.free.forget(&k, Release::Pages);
            }
        }
    }

    /// `release_available_cached_blocks` (only with `max_split_size`): free just enough
    /// oversize cached segments for the request.
    fn release_available_cached_blocks(&mut self, small: bool, stream: u64, size: u64) -> bool {
        let max_split = self.settings.max_split_size;
        if max_split == u64::MAX {
            return false;
        }
        let key_size = size.max(max_split);
        let first = self.free.from(small, stream, key_size).next();
        match first {
            Some(k) => {
                if self.is_expandable(k.3) || !self.is_whole_segment(k.3) {
                    // cudaFree needs a segment's base address; PyTorch never gets here with
                    // a split or expandable block in practice.
                    return false;
                }
                self.release_block(k.3);
                true
            }
            None => {
                // Oversize whole segments, largest first, until enough is released (split
                // and expandable blocks are passed over: only whole segments are walked).
                let mut total = 0u64;
                while total < key_size {
                    let Some(k) = self
                        .free
                        .segments_below(small, stream, key_size)
                        .next()
                        .filter(|k| k.2 >= max_split)
                    else {
                        break;
                    };
                    self.visit(1);
                    self.free.forget(&k, Release::Segment);
                    if self.is_expandable(k.3) || !self.is_whole_segment(k.3) {
                        continue;
                    }
                    total = total.saturating_add(k.2);
                    self.release_block(k.3);
                }
                total >= key_size
            }
        }
    }

    /// `release_block`: cudaFree a cached whole segment.
    fn release_block(&mut self, addr: u64) {
        let Some(b) = self.blocks.get(addr).copied() else {
            return;
        };
        self.detach(addr, b);
        self.kill_segment(b.seg);
        self.reserved = self.reserved.saturating_sub(b.size);
        self.emit(SegKind::SegmentFree, addr, b.size);
    }

    /// A segment is gone (its blocks were detached).
    fn kill_segment(&mut self, seg: u32) {
        if let Some(s) = self.segs.get_mut(seg as usize) {
            s.alive = false;
            if self.seg_at.get(&s.addr) == Some(&seg) {
                self.seg_at.remove(&s.addr);
            }
        }
    }

    /// Does `[addr, addr+size)` collide with what the model holds (a block or segment starting
    /// at `addr`, or any overlap)?
    fn collides(&self, addr: u64, size: u64) -> bool {
        self.blocks.get(addr).is_some()
            || self.seg_at.contains_key(&addr)
            || self.overlaps(addr, size)
    }
}
