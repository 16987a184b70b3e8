//! Sibling rows of a multi-group manager: for each block the anchor group
//! holds as the first copy of its hash, every group's first cached block
//! under the same vLLM hash. A prefix-cache lookup then probes the pool
//! once per block (the anchor group's run) and reads the other groups'
//! blocks from the anchor blocks' rows, where the pool alone needs one probe
//! and one block record per group and block.
//!
//! The anchor group is the first full-attention group whose block size is
//! the hash block size (its run covers a hit's whole prefix); none (the
//! rows are off) for one group, without caching, or without such a group:
//! then every lookup probes the pool per group.
//!
//! The manager reports each change of a first copy: a block cached
//! ([`Siblings::cached`]), a hash evicted ([`Siblings::note_victims`] before
//! a pool allocation, [`Siblings::sync_victims`] after it,
//! [`Siblings::dropped`] for one block). A reset needs nothing: no anchor
//! block is left, and only anchor blocks' rows are read.
//!
//! # Invariants (checked by [`Siblings::check`])
//! - for each block `b` that is the pool's first copy under the anchor
//!   group's key of a vLLM hash `h`, and each group `g`: `block(b, g)` is
//!   the pool's first copy under group `g`'s key of `h`, or the null block
//!   when there is none (`block(b, anchor)` is `b`).
//!
//! Rows of other blocks are stale and never read.
//!
//! # Costs
//! Memory: 4 bytes per block and group. A lookup reads one row per block
//! of the anchor's run; caching an anchor block probes the pool once per
//! group, caching another group's block twice; an evicted block costs one
//! or two probes (a row rebuilt when a later copy of an anchor block takes
//! its place).

use super::{group_key, unkey_owned};
use crate::core::block_pool::BlockPool;
use crate::core::error::{try_filled, InvariantViolation, KvResult};
use crate::core::groups::spec::GroupLayout;
use crate::core::ids::{BlockHash, BlockId};
use crate::ensure_inv;

/// The sibling rows (module header).
#[derive(Clone, Debug, Default)]
pub(crate) struct Siblings {
    /// The anchor group; None: off.
    anchor: Option<usize>,
    /// Groups per row.
    groups: usize,
    /// Per block, `groups` block ids (read only for the anchor's first copies).
    rows: Vec<BlockId>,
    /// Pool keys, owner words and blocks of the hashed blocks an allocation
    /// is about to evict (between `note_victims` and `sync_victims`).
    victims: Vec<(BlockHash, u32, BlockId)>,
}

impl Siblings {
    /// The rows of a pool of `num_blocks` blocks for `layout` (off for one group).
    ///
    /// # Errors
    /// `Capacity` if the rows cannot be allocated.
    pub(crate) fn new(layout: &GroupLayout, num_blocks: usize) -> KvResult<Self> {
        let hbs = layout.hash_block_size();
        let anchor = (layout.len() > 1 && layout.enable_caching())
            .then(|| layout.groups().iter().position(|g| g.kind.is_full() && g.block_size == hbs))
            .flatten();
        let Some(a) = anchor else { return Ok(Siblings::default()) };
        let groups = layout.len();
        let rows = try_filled(num_blocks.saturating_mul(groups), BlockId::NULL, "sibling rows")?;
        Ok(Siblings { anchor: Some(a), groups, rows, victims: Vec::new() })
    }

    /// The anchor group, if the rows are kept.
    pub(crate) fn anchor(&self) -> Option<usize> {
        self.anchor
    }

    /// Group `g`'s block under the hash of anchor block `b` (null: none);
    /// `b` must be the anchor's first copy of its hash.
    pub(crate) fn block(&self, b: BlockId, g: usize) -> BlockId {
        if Some(g) == self.anchor {
            return b;
        }
        self.rows[b.idx() * self.groups + g]
    }

    /// Rebuilds anchor block `b`'s row for vLLM hash `h` from the pool.
    fn rebuild(&mut self, pool: &BlockPool, h: &BlockHash, b: BlockId) {
        for g in 0..self.groups {
            let x = if Some(g) == self.anchor {
                b
            } else {
                pool.get_cached(&group_key(h, g)).unwrap_or(BlockId::NULL)
            };
            self.rows[b.idx() * self.groups + g] = x;
        }
    }

    /// Block `b` was cached under group `g`'s key of vLLM hash `h`, as the
    /// first copy when `first` (a later copy changes no first copy).
    pub(crate) fn cached(&mut self, pool: &BlockPool, h: &BlockHash, g: usize, b: BlockId, first: bool) {
        let Some(a) = self.anchor else { return };
        if !first {
            return;
        }
        if g == a {
            self.rebuild(pool, h, b);
        } else if let Some(ab) = pool.get_cached(&group_key(h, a)) {
            self.rows[ab.idx() * self.groups + g] = b;
        }
    }

    /// Block `b`, cached under pool key `k` with owner word `w`, lost its hash.
    pub(crate) fn dropped(&mut self, pool: &BlockPool, k: &BlockHash, w: u32, b: BlockId) {
        let Some(a) = self.anchor else { return };
        let (h, g) = unkey_owned(k, w);
        if g == a {
            // A later copy that took its place gets its row.
            if let Some(f) = pool.get_cached(k) {
                self.rebuild(pool, &h, f);
            }
        } else if g < self.groups {
            if let Some(ab) = pool.get_cached(&group_key(&h, a)) {
                let slot = &mut self.rows[ab.idx() * self.groups + g];
                if *slot == b {
                    *slot = pool.get_cached(k).unwrap_or(BlockId::NULL);
                }
            }
        }
    }

    /// Notes the hashed blocks among the first `n` of `pool`'s free queue
    /// (what an allocation of `n` evicts); `owner`: the manager's owner words.
    #[inline]
    pub(crate) fn note_victims(&mut self, pool: &BlockPool, owner: &[u32], n: usize) {
        if self.anchor.is_none() {
            return;
        }
        self.victims.clear();
        for b in pool.free_queue().take(n) {
            if let Some(k) = pool.block_hash(b) {
                self.victims.push((k, owner[b.idx()], b));
            }
        }
    }

    /// After the allocation [`Self::note_victims`] was called for.
    #[inline]
    pub(crate) fn sync_victims(&mut self, pool: &BlockPool) {
        if self.victims.is_empty() {
            return;
        }
        let victims = std::mem::take(&mut self.victims);
        for (k, w, b) in &victims {
            self.dropped(pool, k, *w, *b);
        }
        self.victims = victims;
    }

    /// Checks the module header's invariant against `pool` and the owner
    /// words. O(blocks x groups).
    pub(crate) fn check(&self, pool: &BlockPool, owner: &[u32]) -> Result<(), InvariantViolation> {
        let Some(a) = self.anchor else { return Ok(()) };
        ensure_inv!(self.rows.len() == pool.num_blocks() * self.groups, "sibling rows do not fit the pool");
        for (i, &w) in owner.iter().enumerate().take(pool.num_blocks()).skip(1) {
            #[allow(clippy::cast_possible_truncation)]
            let b = BlockId(i as u32);
            let Some(k) = pool.block_hash(b) else { continue };
            let (h, g) = unkey_owned(&k, w);
            if g != a || pool.get_cached(&k) != Some(b) {
                continue;
            }
            for x in 0..self.groups {
                let want =
                    if x == a { b } else { pool.get_cached(&group_key(&h, x)).unwrap_or(BlockId::NULL) };
                let got = self.block(b, x);
                ensure_inv!(
                    got == want,
                    "block {i}'s row: group {x} holds {} where the pool has {}",
                    got.0,
                    want.0
                );
            }
        }
        Ok(())
    }
}
