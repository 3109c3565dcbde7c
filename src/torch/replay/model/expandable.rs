//! Expandable segments (`expandable_segments:True`): one reserved address range per pool and
//! stream, mapped and unmapped in pages (2 MiB small, 20 MiB large), as
//! `DeviceCachingAllocator`'s `try_allocate_expandable_block`, `map_block`, `unmap_block` and
//! `release_expandable_segment` do.

use super::{Blk, Device, ES_DEFAULT_SPAN, Model, SegKind, St};
use crate::torch::replay::settings::{LARGE_BUFFER, SMALL_BUFFER};

impl Model {
    pub(super) fn try_allocate_expandable_block(
        &mut self,
        small: bool,
        stream: u64,
        size: u64,
        dev: &mut dyn Device,
        attempt: u8,
    ) -> Option<u64> {
        let mut cand = self.find_expandable_block(small, stream, size, dev);
        if self.blocks.get(cand)?.state == St::Unmapped {
            let want = self.blocks.get(cand)?.size.min(size);
            cand = self.map_block(cand, want, dev, attempt)?;
        }
        loop {
            let b = *self.blocks.get(cand)?;
            if b.size >= size {
                break;
            }
            let (n, nb) = self.next_of(cand)?;
            if nb.state != St::Unmapped {
                return None;
            }
            let want = (size - b.size).min(nb.size);
            cand = self.map_block(n, want, dev, attempt)?;
        }
        self.remove_free(cand);
        Some(cand)
    }

    /// `find_expandable_block`: the lowest-address place with enough free + unmapped room.
    pub(super) fn find_expandable_block(
        &mut self,
        small: bool,
        stream: u64,
        size: u64,
        dev: &mut dyn Device,
    ) -> u64 {
        let candidates: Vec<u64> = self
            .unmapped
            .range((small, stream, 0)..)
            .take_while(|k| k.0 == small && k.1 == stream)
            .map(|k| k.2)
            .collect();
        for u in candidates {
            self.visit(1);
            let mut c = u;
            if let Some((p, pb)) = self.prev_of(u)
                && pb.state == St::Free
            {
                c = p;
            }
            let mut bytes = 0u64;
            let mut at = Some(c);
            while bytes < size {
                let Some(a) = at else { break };
                let Some(b) = self.blocks.get(a) else { break };
                if !matches!(b.state, St::Free | St::Unmapped) {
                    break;
                }
                self.visit(1);
                bytes = bytes.saturating_add(b.size);
                at = self.next_of(a).map(|(n, _)| n);
            }
            if bytes >= size {
                return c;
            }
        }
        let page = if small { SMALL_BUFFER } else { LARGE_BUFFER };
        let wanted = dev.segment_address(page, true);
        let addr = self.fresh_address(page, wanted);
        let span = self.span_below_next(addr, ES_DEFAULT_SPAN, small);
        let i = self.add_expandable(addr, span, stream, small);
        self.segs[i as usize].alive = true;
        addr
    }

    /// An expandable range at `addr` must not run into the next known block.
    pub fn span_below_next(&self, addr: u64, span: u64, small: bool) -> u64 {
        let page = if small { SMALL_BUFFER } else { LARGE_BUFFER };
        let limit = self.next_block_start_above(addr);
        let span = span.min(limit.saturating_sub(addr));
        (span / page * page).max(page.min(span))
    }

    /// The lowest block start above `addr`: the next live segment's, or one inside the segment
    /// that holds `addr`.
    pub(super) fn next_block_start_above(&self, addr: u64) -> u64 {
        if let Some(first) = self.blocks.first_from(addr.saturating_add(1)) {
            return first.unwrap_or(u64::MAX);
        }
        let mut limit = self
            .seg_at
            .range(addr.saturating_add(1)..)
            .next()
            .map_or(u64::MAX, |(&a, _)| a);
        if let Some((&p, &i)) = self.seg_at.range(..=addr).next_back()
            && let Some(s) = self.segs.get(i as usize)
            && p.saturating_add(s.size) > addr
        {
            let mut at = p;
            while let Some(b) = self.blocks.get(at) {
                self.visit(1);
                if at > addr {
                    limit = limit.min(at);
                    break;
                }
                let next = at.saturating_add(b.size);
                if next == at || b.seg != i {
                    break;
                }
                at = next;
            }
        }
        limit
    }

    /// `map_block`: back `size` bytes (rounded up to pages) at the start of an unmapped block;
    /// returns the address of the resulting free block (merged with free neighbours).
    pub(super) fn map_block(
        &mut self,
        addr: u64,
        size: u64,
        dev: &mut dyn Device,
        attempt: u8,
    ) -> Option<u64> {
        let b = *self.blocks.get(addr)?;
        if b.state != St::Unmapped {
            return None;
        }
        let seg = self.segs[b.seg as usize].clone();
        let page = seg.page();
        let off = addr.saturating_sub(seg.addr);
        let begin = off / page;
        let end = off.saturating_add(size).div_ceil(page);
        let mapped = end.saturating_sub(begin).saturating_mul(page).min(b.size);
        if mapped == 0 || !dev.grant(self.reserved, mapped, attempt, self.released_in_call()) {
            return None;
        }
        self.unmapped.remove(&(seg.small, seg.stream, addr));
        // The unmapped block's record becomes the mapped one's (its place in the list stays).
        let s = self.blocks.insert(
            addr,
            Blk {
                size: mapped,
                seg: b.seg,
                state: St::Free,
            },
        );
        if mapped < b.size {
            let mut gap = self.blocks.gap_after(s);
            self.put_unmapped(
                &mut gap,
                addr.saturating_add(mapped),
                b.size - mapped,
                b.seg,
            );
        }
        let merged = self.merge_free(addr);
        self.insert_free(merged);
        self.reserved = self.reserved.saturating_add(mapped);
        self.bump_peaks();
        self.emit(SegKind::SegmentMap, addr, mapped);
        Some(merged)
    }

    /// `unmap_block`: unmap the whole pages inside a free expandable block; returns the address
    /// of the (merged) unmapped block, or `None` when no whole page was free.
    pub(super) fn unmap_block(&mut self, addr: u64) -> Option<u64> {
        let b = *self.blocks.get(addr)?;
        if b.state != St::Free {
            return None;
        }
        let seg = self.segs[b.seg as usize].clone();
        let page = seg.page();
        let off = addr.saturating_sub(seg.addr);
        let begin = off.div_ceil(page);
        let end = off.saturating_add(b.size) / page;
        if begin >= end {
            return None;
        }
        let u_start = seg.addr.saturating_add(begin.saturating_mul(page));
        let u_size = (end - begin) * page;
        // The pieces go into the detached block's place in address order, each after the last.
        let mut gap = self.detach(addr, b);
        if u_start > addr {
            self.blocks.insert_in(
                &mut gap,
                addr,
                Blk {
                    size: u_start - addr,
                    seg: b.seg,
                    state: St::Free,
                },
            );
            self.insert_free(addr);
        }
        self.blocks.insert_in(
            &mut gap,
            u_start,
            Blk {
                size: u_size,
                seg: b.seg,
                state: St::Unmapped,
            },
        );
        let u_end = u_start.saturating_add(u_size);
        let after = addr.saturating_add(b.size).saturating_sub(u_end);
        if after > 0 {
            let a = u_end;
            self.blocks.insert_in(
                &mut gap,
                a,
                Blk {
                    size: after,
                    seg: b.seg,
                    state: St::Free,
                },
            );
            self.insert_free(a);
        }
        let merged = self.merge_same(u_start, St::Unmapped);
        self.unmapped.insert((seg.small, seg.stream, merged));
        self.reserved = self.reserved.saturating_sub(u_size);
        self.emit(SegKind::SegmentUnmap, u_start, u_size);
        Some(merged)
    }

    /// `release_expandable_segment`: an expandable segment that is all unmapped goes away.
    pub(super) fn maybe_release_expandable(&mut self, addr: u64) {
        let Some(b) = self.blocks.get(addr).copied() else {
            return;
        };
        if self.is_whole_segment(addr) && b.state == St::Unmapped {
            self.detach(addr, b);
            self.kill_segment(b.seg);
        }
    }
}
