//! A spec set's view of the pool for one prefix-cache lookup of the
//! manager's group calls ([`PoolLookup`]): blocks whose request hash the
//! anchor group's run covers are read from the sibling rows
//! ([`super::siblings`]), the others probed under each member group's key,
//! runs in one batch per member.
//!
//! # Invariants
//! - every answer is the pool's: block `i` is answered when every member
//!   group has a first cached copy under its key of the block's hash, with
//!   those copies (the sibling rows agree with the pool for the anchor's
//!   run, [`super::siblings`]).
//!
//! Under partial hash hits a fine index (a hash boundary, inside a block or
//! at its end) is probed per member under its own hash and its partial-block
//! entries ([`VllmManager::cached_block_of`]).
//!
//! Costs: a block of the anchor's run is one row read per member; another
//! block one probe per member (a run's probes batched); a fine index one or
//! two probes per member.

use std::cell::RefCell;
use std::num::NonZeroU32;

use super::{group_key, VllmManager};
use crate::core::groups::coordinator::coarse_hash_index;
use crate::core::groups::rule::BlockLookup;
use crate::core::ids::{BlockHash, BlockId};

/// A spec set's view of the pool: block `i` at the set's block size,
/// cached under every member group's key. A set of one group answers its
/// block id itself (never the null block 0: an answer is non-zero, so an
/// answer list holds 4 bytes per block and is a block list as it stands);
/// a set of several answers one more than an offset into `side`, where the
/// members' block ids of that block follow in member order.
///
/// Runs ([`BlockLookup::get_run`], full attention and chunked local) are
/// looked up in one [`BlockPool::lookup_run`] batch per member, whose
/// cache misses overlap. Blocks whose hash the anchor group's run covers
/// are read from the anchor blocks' sibling rows instead, without a probe
/// ([`super::siblings`]).
///
/// [`BlockPool::lookup_run`]: crate::core::block_pool::BlockPool::lookup_run
pub(super) struct PoolLookup<'a> {
    pub(super) m: &'a VllmManager,
    pub(super) hashes: &'a [BlockHash],
    pub(super) scale: usize,
    pub(super) groups: &'a [usize],
    pub(super) side: Vec<BlockId>,
    /// Scratch of [`BlockLookup::get_run`], shared by a call's sets: one
    /// member's keys and hits.
    pub(super) scratch: &'a RefCell<(Vec<BlockHash>, Vec<BlockId>)>,
    /// The anchor group's first copies of `hashes[..anchor.len()]` (empty
    /// without sibling rows).
    pub(super) anchor: &'a [BlockId],
}

impl PoolLookup<'_> {
    /// The block of request hash `k` (below `anchor.len()`), from its anchor
    /// block's sibling row.
    #[inline]
    fn via_anchor(&mut self, k: usize) -> Option<NonZeroU32> {
        let (rows, ab) = (&self.m.siblings, self.anchor[k]);
        if let [g] = *self.groups {
            return NonZeroU32::new(rows.block(ab, g).0);
        }
        let off = self.side.len();
        for &g in self.groups {
            let b = rows.block(ab, g);
            if b == BlockId::NULL {
                self.side.truncate(off);
                return None;
            }
            self.side.push(b);
        }
        side_answer(off)
    }

    /// [`BlockLookup::get_run`] from the pool (one batch per member).
    fn pool_run(&mut self, lo: usize, hi: usize, out: &mut Vec<Option<NonZeroU32>>) -> usize {
        if lo >= hi {
            return 0;
        }
        let pool = &self.m.pool;
        let mut n = hi - lo;
        let base = self.side.len();
        let mut scratch = self.scratch.borrow_mut();
        let (keys, ids) = &mut *scratch;
        for (j, &g) in self.groups.iter().enumerate() {
            ids.clear();
            if g == 0 && self.scale == 1 {
                pool.lookup_run(&self.hashes[lo..lo + n], ids);
            } else {
                keys.clear();
                let (hs, sc) = (self.hashes, self.scale);
                keys.extend((lo..lo + n).map(|i| group_key(&hs[coarse_hash_index(i, sc)], g)));
                pool.lookup_run(keys, ids);
            }
            n = ids.len();
            if self.groups.len() == 1 {
                out.extend(ids.iter().map(|b| NonZeroU32::new(b.0)));
                return n;
            }
            // Interleave: member j's block of block k goes to side[base + k * members + j].
            let members = self.groups.len();
            if j == 0 {
                self.side.resize(base + n * members, BlockId::NULL);
            }
            self.side.truncate(base + n * members);
            for (k, &b) in ids.iter().enumerate() {
                self.side[base + k * members + j] = b;
            }
        }
        let members = self.groups.len();
        out.extend((0..n).map(|k| side_answer(base + k * members)));
        n
    }
}

/// The answer of a set of several groups whose blocks start at `side[off]`.
#[inline]
fn side_answer(off: usize) -> Option<NonZeroU32> {
    u32::try_from(off + 1).ok().and_then(NonZeroU32::new)
}

impl BlockLookup for PoolLookup<'_> {
    type Block = NonZeroU32;
    fn get(&mut self, i: usize) -> Option<NonZeroU32> {
        let k = coarse_hash_index(i, self.scale);
        let h = self.hashes.get(k)?;
        if k < self.anchor.len() {
            return self.via_anchor(k);
        }
        if let [g] = *self.groups {
            return self.m.pool.get_cached(&group_key(h, g)).and_then(|b| NonZeroU32::new(b.0));
        }
        let off = self.side.len();
        for &g in self.groups {
            match self.m.pool.get_cached(&group_key(h, g)) {
                Some(b) => self.side.push(b),
                None => {
                    self.side.truncate(off);
                    return None;
                }
            }
        }
        side_answer(off)
    }

    fn get_fine(&mut self, k: usize) -> Option<NonZeroU32> {
        // Own hashes and partial-block entries alike, probed per member (no sibling rows:
        // they follow block ends only).
        let h = self.hashes.get(k)?;
        if let [g] = *self.groups {
            return self.m.cached_block_of(h, g).and_then(|b| NonZeroU32::new(b.0));
        }
        let off = self.side.len();
        for &g in self.groups {
            match self.m.cached_block_of(h, g) {
                Some(b) => self.side.push(b),
                None => {
                    self.side.truncate(off);
                    return None;
                }
            }
        }
        side_answer(off)
    }

    fn get_run(&mut self, lo: usize, hi: usize, out: &mut Vec<Option<NonZeroU32>>) -> usize {
        let hi = hi.min(self.hashes.len() / self.scale);
        let mut i = lo;
        let (rows, sc) = (&self.m.siblings, self.scale);
        if let (&[g], 1) = (self.groups, sc) {
            if lo < self.anchor.len() {
                // One group, a block per request hash: its blocks in one pass.
                let end = hi.min(self.anchor.len());
                let start = out.len();
                if Some(g) == rows.anchor() {
                    out.extend(self.anchor[lo..end].iter().map(|b| NonZeroU32::new(b.0)));
                } else {
                    let run = self.anchor[lo..end].iter().map(|&ab| NonZeroU32::new(rows.block(ab, g).0));
                    out.extend(run.take_while(Option::is_some));
                }
                if out.len() - start < end - lo {
                    return out.len() - start;
                }
                i = end;
            }
        }
        while i < hi {
            let k = coarse_hash_index(i, self.scale);
            if k >= self.anchor.len() {
                break;
            }
            match self.via_anchor(k) {
                Some(x) => out.push(Some(x)),
                None => return i - lo,
            }
            i += 1;
        }
        i - lo + self.pool_run(i, hi, out)
    }
}

#[cfg(test)]
mod lookup_tests {
    use super::*;
    use crate::core::groups::spec::{GroupKind, GroupLayout, GroupSpec, LayoutOptions};
    use crate::core::vllm_manager::SlotRequest;

    /// A set's answers as member block ids.
    fn ids(l: &PoolLookup<'_>, a: &[Option<NonZeroU32>]) -> Vec<Option<Vec<BlockId>>> {
        let n = l.groups.len();
        a.iter()
            .map(|o| {
                o.map(|x| {
                    let x = x.get();
                    if n == 1 {
                        vec![BlockId(x)]
                    } else {
                        l.side[x as usize - 1..x as usize - 1 + n].to_vec()
                    }
                })
            })
            .collect()
    }

    /// The batched run lookup, with and without the anchor's sibling rows
    /// (whole, or cut short), answers as the pool probed block by block, on
    /// tables with holes, for sets of one and of two groups, block sizes of
    /// one and two hash blocks.
    #[test]
    fn batched_and_sibling_runs_match_block_by_block_lookups() {
        let swa = |window, block_size| GroupSpec { kind: GroupKind::SlidingWindow { window }, block_size };
        let groups = vec![GroupSpec::full(4), swa(9, 4), GroupSpec::full(4), swa(6, 8)];
        let opt = LayoutOptions { enable_caching: true, ..LayoutOptions::default() };
        let layout = GroupLayout::new(groups, opt).expect("layout");
        let mut m = VllmManager::with_layout(400, layout, false, false, None).expect("manager");
        let hs: Vec<BlockHash> = (0..24u8).map(|i| BlockHash::from_digest(&[i; 16])).collect();
        let s = SlotRequest { num_tokens_need_slot: 96, adopt: true, ..SlotRequest::default() };
        m.allocate_slots_groups("a", &[], &s).expect("valid").expect("fits");
        let plan = m.cache_plan("a", 96, hs.len(), 0);
        m.cache_apply("a", &plan, 0, &hs).expect("fits");
        // Holes: every group loses a different block.
        let holes: Vec<i64> = (0..4).map(|g| i64::from(m.group_blocks("a", g)[3 + 2 * g % 5].0)).collect();
        m.evict_blocks(&holes).expect("in range");
        m.check_invariants().expect("invariants");
        let whole = m.anchor_run(&hs, usize::MAX);
        assert_eq!(whole.len(), 3, "the anchor's run stops at its hole");
        for anchor in [&[][..], &whole[..], &whole[..2]] {
            for (si, set) in m.layout().spec_sets().iter().enumerate() {
                let scale = set.spec.block_size / m.layout().hash_block_size();
                for lo in 0..14 {
                    for hi in lo..26 {
                        let scratch = RefCell::new((Vec::new(), Vec::new()));
                        let mk = |anchor| PoolLookup {
                            m: &m,
                            hashes: &hs,
                            scale,
                            groups: &set.group_ids,
                            side: Vec::new(),
                            scratch: &scratch,
                            anchor,
                        };
                        let (mut a, mut b) = (mk(anchor), mk(&[]));
                        let mut ra = vec![None];
                        let n = a.get_run(lo, hi, &mut ra);
                        let mut rb = vec![None];
                        for i in lo..hi {
                            match b.get(i) {
                                Some(x) => rb.push(Some(x)),
                                None => break,
                            }
                        }
                        assert_eq!(n, rb.len() - 1, "set {si} {lo}..{hi}");
                        assert_eq!(ids(&a, &ra), ids(&b, &rb), "set {si} {lo}..{hi}");
                        let mut c = mk(anchor);
                        for i in lo..hi {
                            let one = c.get(i);
                            let want = b.get(i);
                            assert_eq!(ids(&c, &[one]), ids(&b, &[want]), "set {si} block {i}");
                        }
                    }
                }
            }
        }
    }
}
