//! The model's free lists: per pool the cached blocks in PyTorch's best-fit order, and beside
//! them the cached blocks a release would give back, so that the OOM path and `empty_cache()`
//! visit only what they release (a walk over every cached block per release made a trace that
//! does not fit its segments quadratic: each malloc of it went through the OOM path).

use std::collections::BTreeSet;

use rustc_hash::FxHashMap;

/// Free-list key: (pool is small, stream, size, address) — PyTorch's `BlockComparatorSize`
/// within one pool.
pub(crate) type FreeKey = (bool, u64, u64, u64);

/// What `release_cached_blocks` does with a cached block, decided when the block enters the
/// free list (its address, size and segment do not change while it is there).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Release {
    /// Nothing: part of a segment, or an expandable block without a whole page.
    Keep,
    /// A whole (non-expandable) segment: cudaFree'd.
    Segment,
    /// An expandable block holding at least one whole page: its whole pages are unmapped.
    Pages,
}

/// The free lists: per pool (small or large, and stream) the cached blocks in (size, address)
/// order, PyTorch's `BlockComparatorSize`; a [`FreeKey`] names pool, size and address.
///
/// Within a pool a block is one `u128`, size above address: the same order as the pair, and
/// compared without branches in the B-tree's node scans (the replay's hottest loop).
///
/// `segments` and `pages` hold the same blocks' keys for the two kinds of [`Release`], in the
/// free lists' (pool, stream, size, address) order: a release walks them and takes every block
/// it visits out, so each cached block is visited by releases at most once.
#[derive(Clone, Debug, Default)]
pub(crate) struct FreeLists {
    pools: Vec<Pool>,
    /// Pool index by (small, stream).
    pool_of: FxHashMap<(bool, u64), u32>,
    /// The pool last looked up, and its index: a trace runs on one stream at a time, so most
    /// lookups are answered without hashing.
    last: std::cell::Cell<Option<((bool, u64), u32)>>,
    segments: BTreeSet<FreeKey>,
    pages: BTreeSet<FreeKey>,
}

/// A block of a pool as one ordered key: (size, address).
fn size_addr(size: u64, addr: u64) -> u128 {
    (u128::from(size) << 64) | u128::from(addr)
}

impl FreeLists {
    /// The index of the pool of (small, stream), if it has one.
    #[inline]
    fn pool_index(&self, key: (bool, u64)) -> Option<usize> {
        if let Some((k, i)) = self.last.get()
            && k == key
        {
            return Some(i as usize);
        }
        let i = *self.pool_of.get(&key)?;
        self.last.set(Some((key, i)));
        Some(i as usize)
    }

    #[inline]
    fn pool(&self, key: (bool, u64)) -> Option<&Pool> {
        self.pool_index(key).map(|i| &self.pools[i])
    }

    #[inline]
    fn pool_mut(&mut self, key: (bool, u64)) -> &mut Pool {
        let i = match self.pool_index(key) {
            Some(i) => i,
            None => {
                let i = self.pools.len();
                self.pools.push(Pool::default());
                // More pools than `u32` counts cannot be: each holds a block of a segment.
                self.pool_of.insert(key, i as u32);
                self.last.set(Some((key, i as u32)));
                i
            }
        };
        &mut self.pools[i]
    }

    pub fn insert(&mut self, k: FreeKey, release: Release) {
        self.pool_mut((k.0, k.1)).insert(size_addr(k.2, k.3));
        match release {
            Release::Keep => {}
            Release::Segment => {
                self.segments.insert(k);
            }
            Release::Pages => {
                self.pages.insert(k);
            }
        }
    }

    pub fn remove(&mut self, k: &FreeKey, release: Release) {
        if let Some(i) = self.pool_index((k.0, k.1)) {
            self.pools[i].remove(&size_addr(k.2, k.3));
        }
        match release {
            Release::Keep => {}
            Release::Segment => {
                self.segments.remove(k);
            }
            Release::Pages => {
                self.pages.remove(k);
            }
        }
    }

    /// Take a key out of the release index only (it no longer names a releasable block).
    pub fn forget(&mut self, k: &FreeKey, release: Release) {
        match release {
            Release::Keep => {}
            Release::Segment => {
                self.segments.remove(k);
            }
            Release::Pages => {
                self.pages.remove(k);
            }
        }
    }

    /// The blocks of a pool from `size` up, in order.
    pub fn from(&self, small: bool, stream: u64, size: u64) -> impl Iterator<Item = FreeKey> + '_ {
        self.pool((small, stream))
            .into_iter()
            .flat_map(move |p| p.from(size_addr(size, 0)))
            .map(move |k| (small, stream, (k >> 64) as u64, k as u64))
    }

    /// The first block of a pool from `size` up (`from(..).next()`).
    #[inline]
    pub fn first_from(&self, small: bool, stream: u64, size: u64) -> Option<FreeKey> {
        let k = self.pool((small, stream))?.first_from(size_addr(size, 0))?;
        Some((small, stream, (k >> 64) as u64, k as u64))
    }

    /// The whole cached segments of a pool below `size`, largest first.
    pub fn segments_below(
        &self,
        small: bool,
        stream: u64,
        size: u64,
    ) -> impl Iterator<Item = FreeKey> + '_ {
        self.segments
            .range((small, stream, 0, 0)..(small, stream, size, 0))
            .rev()
            .copied()
    }

    /// The cached blocks of the small or the large pools that a release gives back, whole
    /// segments and expandable blocks with whole pages, each in (stream, size, address) order.
    pub fn releasable(&self, small: bool) -> (Vec<FreeKey>, Vec<FreeKey>) {
        let of = |s: &BTreeSet<FreeKey>| -> Vec<FreeKey> {
            s.range((small, 0, 0, 0)..=(small, u64::MAX, u64::MAX, u64::MAX))
                .copied()
                .collect()
        };
        (of(&self.segments), of(&self.pages))
    }
}

/// One pool's free blocks in (size, address) order. A pool holds a few dozen blocks at a time
/// in most traces: up to [`Pool::SORTED_UP_TO`] they are a sorted vector (a binary search and
/// a move of at most 4 KiB per insert or remove, a slice for the best-fit walk), several times
/// cheaper than a B-tree's node walk; a pool that grows past it becomes a B-tree for good, so
/// no input costs more than a logarithm (plus that bounded move) per operation. (At 1,024 the
/// moves cost the bench's synthetic trace, whose pools hold ~1,000 blocks, 25 % more time
/// than the B-tree; at 96 or 256 the real-shaped bench file is as fast.)
#[derive(Clone, Debug)]
enum Pool {
    Sorted(Vec<u128>),
    Tree(BTreeSet<u128>),
}

impl Default for Pool {
    fn default() -> Pool {
        Pool::Sorted(Vec::new())
    }
}

impl Pool {
    const SORTED_UP_TO: usize = 256;

    fn insert(&mut self, k: u128) {
        match self {
            Pool::Sorted(v) => {
                if let Err(i) = v.binary_search(&k) {
                    if v.len() < Self::SORTED_UP_TO {
                        v.insert(i, k);
                    } else {
                        let mut t: BTreeSet<u128> = v.drain(..).collect();
                        t.insert(k);
                        *self = Pool::Tree(t);
                    }
                }
            }
            Pool::Tree(t) => {
                t.insert(k);
            }
        }
    }

    fn remove(&mut self, k: &u128) {
        match self {
            Pool::Sorted(v) => {
                if let Ok(i) = v.binary_search(k) {
                    v.remove(i);
                }
            }
            Pool::Tree(t) => {
                t.remove(k);
            }
        }
    }

    /// The keys from `from` up, in order.
    fn from(&self, from: u128) -> PoolIter<'_> {
        match self {
            Pool::Sorted(v) => PoolIter::Sorted(v[v.partition_point(|&x| x < from)..].iter()),
            Pool::Tree(t) => PoolIter::Tree(t.range(from..)),
        }
    }

    /// The first key from `from` up.
    fn first_from(&self, from: u128) -> Option<u128> {
        self.from(from).next()
    }
}

enum PoolIter<'a> {
    Sorted(std::slice::Iter<'a, u128>),
    Tree(std::collections::btree_set::Range<'a, u128>),
}

impl Iterator for PoolIter<'_> {
    type Item = u128;

    #[inline]
    fn next(&mut self) -> Option<u128> {
        match self {
            PoolIter::Sorted(i) => i.next().copied(),
            PoolIter::Tree(i) => i.next().copied(),
        }
    }
}

#[cfg(test)]
mod pool_tests {
    use super::Pool;
    use std::collections::BTreeSet;

    /// The pool answers as a B-tree does, below and past the switch to one.
    #[test]
    fn pool_orders_as_a_btree_across_the_switch() {
        let mut p = Pool::default();
        let mut t = BTreeSet::new();
        let mut rng = crate::test_rng::XorShift::new(0x9e37_79b9_7f4a_7c15);
        for i in 0..5000u64 {
            let x = rng.next_u64();
            let k = u128::from(x % 3000) << 64 | u128::from(x % 7);
            if i % 3 == 2 {
                p.remove(&k);
                t.remove(&k);
            } else {
                p.insert(k);
                t.insert(k);
            }
            let from = u128::from(x % 3000) << 64;
            assert_eq!(
                p.from(from).take(5).collect::<Vec<_>>(),
                t.range(from..).take(5).copied().collect::<Vec<_>>(),
                "after operation {i}"
            );
        }
        assert!(
            matches!(p, Pool::Tree(_)),
            "the pool grew past the sorted limit"
        );
        assert_eq!(
            p.from(0).collect::<Vec<_>>(),
            t.iter().copied().collect::<Vec<_>>()
        );
    }
}
