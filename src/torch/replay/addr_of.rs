//! The model's address of each live allocation reference, for the replay loop.

use rustc_hash::FxHashMap;

use super::model::NIL;

/// No allocation reference.
pub(crate) const NONE: u32 = u32::MAX;

/// The model's address of each live allocation reference: only the live ones are kept (a
/// few thousand, where a trace makes millions), beside one bit per reference (1 MiB for 8 M
/// of them), so the replays running at once stay small.
///
/// A reference lives in its slot of a direct-mapped table (`aref` modulo its size: references
/// are numbered in allocation order and most die young) or in a spill map: a lookup is one load
/// and a compare in the common case instead of a hash probe (three or four of them per
/// allocation, the replay loop's own largest cost).
///
/// A new reference takes its slot, and the one it finds there moves to the spill map. The
/// one found is most often long-lived (a parameter, an optimizer state: a trace of millions of
/// allocations keeps tens of thousands of them live, in most slots of the table), and is looked
/// up once more, at its free; the new one is looked up twice soon (its free is requested, then
/// completed). Kept the other way round, every young reference whose slot a long-lived one held
/// cost four hash operations. A bit per reference says whether it is in the spill map, so that
/// a reference not there never probes it.
#[derive(Clone, Debug)]
pub(crate) struct AddrOf {
    /// (aref, the model's slot of its block as a hint, address); `NONE`: an empty slot.
    slots: Vec<(u32, u32, u64)>,
    spill: FxHashMap<u32, (u64, u32)>,
    /// Bit `aref`: `aref` is in `spill`.
    spilled: Vec<u64>,
    /// Allocation references are below this.
    arefs: u32,
}

impl Default for AddrOf {
    fn default() -> AddrOf {
        AddrOf::new(0)
    }
}

impl AddrOf {
    /// At most this many slots (1 MiB).
    const SLOTS: usize = 1 << 16;

    pub(crate) fn new(arefs: usize) -> AddrOf {
        let n = arefs.clamp(1, Self::SLOTS).next_power_of_two();
        let arefs = u32::try_from(arefs).unwrap_or(u32::MAX);
        AddrOf {
            slots: vec![(NONE, NIL, 0); n],
            spill: FxHashMap::default(),
            spilled: vec![0; (arefs as usize).div_ceil(64)],
            arefs,
        }
    }

    #[inline]
    fn slot(&self, aref: u32) -> usize {
        aref as usize & (self.slots.len() - 1)
    }

    #[inline(always)]
    fn is_spilled(&self, aref: u32) -> bool {
        self.spilled[aref as usize / 64] & (1 << (aref % 64)) != 0
    }

    #[inline(always)]
    fn mark_spilled(&mut self, aref: u32, on: bool) {
        let (w, bit) = (aref as usize / 64, 1u64 << (aref % 64));
        if on {
            self.spilled[w] |= bit;
        } else {
            self.spilled[w] &= !bit;
        }
    }

    /// Take `aref` out of the spill map, if it is there.
    #[inline(always)]
    fn unspill(&mut self, aref: u32) {
        if self.is_spilled(aref) {
            self.spill.remove(&aref);
            self.mark_spilled(aref, false);
        }
    }

    /// The address of `aref`'s block while it is live.
    #[inline(always)]
    pub fn get(&self, aref: u32) -> Option<u64> {
        self.get_hinted(aref).map(|(a, _)| a)
    }

    /// The address of `aref`'s block while it is live, and the model's slot it was handed out
    /// in ([`NIL`]: not known), a hint for its frees.
    #[inline(always)]
    pub fn get_hinted(&self, aref: u32) -> Option<(u64, u32)> {
        if aref >= self.arefs {
            return None;
        }
        let (r, h, a) = self.slots[self.slot(aref)];
        if r == aref {
            Some((a, h))
        } else if self.is_spilled(aref) {
            self.spill.get(&aref).copied()
        } else {
            None
        }
    }

    #[inline(always)]
    pub(crate) fn set(&mut self, aref: u32, addr: u64) {
        self.set_hinted(aref, addr, NIL);
    }

    #[inline(always)]
    pub(crate) fn set_hinted(&mut self, aref: u32, addr: u64, hint: u32) {
        // `u64::MAX` is the "not live" of the replay's bookkeeping.
        if aref >= self.arefs || addr == u64::MAX {
            self.clear(aref);
            return;
        }
        let i = self.slot(aref);
        let (r, h, a) = self.slots[i];
        if r != aref && r != NONE {
            // The one found there moves to the spill map.
            self.spill.insert(r, (a, h));
            self.mark_spilled(r, true);
        }
        self.slots[i] = (aref, hint, addr);
        if r != aref {
            self.unspill(aref);
        }
    }

    #[inline(always)]
    pub(crate) fn clear(&mut self, aref: u32) {
        if aref >= self.arefs {
            return;
        }
        let i = self.slot(aref);
        if self.slots[i].0 == aref {
            self.slots[i] = (NONE, NIL, 0);
        } else {
            self.unspill(aref);
        }
    }

    /// Every live reference with its address, by reference.
    pub fn sorted(&self) -> Vec<(u32, u64)> {
        let mut v: Vec<(u32, u64)> = self
            .slots
            .iter()
            .filter(|s| s.0 != NONE)
            .map(|&(r, _, a)| (r, a))
            .chain(self.spill.iter().map(|(&r, &(a, _))| (r, a)))
            .collect();
        v.sort_unstable();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::AddrOf;
    use rustc_hash::FxHashMap;

    /// References that share a slot (a long-lived one holding it) answer as a map would.
    #[test]
    fn addr_of_answers_as_a_map_when_references_share_slots() {
        let mut a = AddrOf::new(1 << 20);
        let mut m: FxHashMap<u32, u64> = FxHashMap::default();
        let slots = a.slots.len() as u32;
        let mut rng = crate::test_rng::XorShift::new(0x2545_f491_4f6c_dd1d);
        for step in 0..200_000u32 {
            let x = rng.next_u64();
            // References whole tables apart share a slot.
            let r = (x % 8) as u32 * slots + (x >> 40) as u32 % 4 + (step % 3) * 7;
            match x % 5 {
                0 | 1 => {
                    a.set(r, x >> 8);
                    m.insert(r, x >> 8);
                }
                2 => {
                    a.set(r, u64::MAX);
                    m.remove(&r);
                }
                _ => {
                    a.clear(r);
                    m.remove(&r);
                }
            }
            assert_eq!(a.get(r), m.get(&r).copied(), "step {step}, aref {r}");
        }
        let mut want: Vec<(u32, u64)> = m.into_iter().collect();
        want.sort_unstable();
        assert_eq!(a.sorted(), want);
        assert!(!a.spill.is_empty(), "the test made references share slots");
        assert_eq!(a.get(super::NONE), None);
    }
}
