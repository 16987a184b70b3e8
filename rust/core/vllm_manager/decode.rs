//! The two common calls of `allocate_slots_groups` on one request lookup,
//! with per-group constants ([`GroupConst`]: kind flags, block-size shifts,
//! and the EAGLE flag, hash scale and dense-retention rule `cache_apply`
//! reads) computed once from the layout instead of matched per call. Both apply
//! only on layouts without align-mode Mamba groups, without the
//! full-sequence gate; any other call takes the general path.
//!
//! - [`VllmManager::running_step`]: a request running in every group (each
//!   group holds a cached count, or is a cross-attention group, which never
//!   does), no hit lists (a decode step, a later prefill chunk). In order:
//!   `remove_skipped_blocks` (each group's blocks before its window freed,
//!   last first, group by group; nothing when the last block before the
//!   window is already a null), the count (`needed - held` per group, the
//!   encoder tokens for a cross-attention group), the free-block check, then
//!   new blocks group by group ([`VllmManager::take_lacking`], a second
//!   lookup only then). A step that takes no block allocates nothing.
//! - [`VllmManager::new_request_step`]: a request's first call (no tables),
//!   adopting its hits, no external tokens: the count, the free-block check
//!   (a refusal leaves the empty entry `remove_skipped_blocks` makes in vLLM),
//!   every group's hits adopted, then new blocks group by group; each table
//!   allocated once, with room for a quarter more blocks.
//!
//! # Invariants
//! - results, tables, cached counts, the free queue and the logs (removed
//!   keys, new blocks, sibling rows) equal the general path's for the same
//!   call (`decode_tests` runs both on copies of a manager, step by step).
//!
//! # Costs
//! One or two request lookups per call; O(groups) arithmetic; O(hit blocks
//! adopted + blocks freed or taken) pool work.

use super::siblings::Siblings;
use super::table_ops::{adopt_hits, null_skipped};
use super::{Req, SlotRequest, VllmManager};
use crate::core::block_pool::BlockPool;
use crate::core::groups::rule::GroupRule;
use crate::core::groups::spec::{GroupKind, GroupLayout, GroupSpec};
use crate::core::ids::{BlockHash, BlockId};

/// What a step reads of one group, computed once from the layout.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GroupConst {
    pub(crate) spec: GroupSpec,
    /// log2 of the block size when it is a power of two (else `u32::MAX`).
    shift: u32,
    /// A cross-attention group (counts and takes blocks for encoder tokens).
    pub(crate) cross: bool,
    /// Looked up and cached.
    pub(crate) cacheable: bool,
    /// Caching with dense retention registers every block (no sliding-window
    /// segment heads to leave out).
    pub(crate) caches_all: bool,
    /// The group's hits and caching drop the EAGLE block.
    pub(crate) eagle: bool,
    /// Hash blocks per block (1 for a group that is not prefix-cacheable).
    pub(crate) scale: usize,
}

impl GroupConst {
    /// Every group's constants, in group order.
    pub(crate) fn of(layout: &GroupLayout) -> Vec<GroupConst> {
        (0..layout.len())
            .map(|g| {
                let spec = layout.groups()[g];
                let bs = spec.block_size;
                let eagle = layout.group_eagle(g);
                GroupConst {
                    spec,
                    shift: if bs.is_power_of_two() { bs.trailing_zeros() } else { u32::MAX },
                    cross: spec.kind == GroupKind::CrossAttention,
                    cacheable: spec.kind.prefix_cacheable(),
                    caches_all: spec.caches_every_block(layout.scheduler_block_size(), eagle),
                    eagle,
                    scale: (bs / layout.hash_block_size()).max(1),
                }
            })
            .collect()
    }

    /// `n / block_size`.
    #[inline]
    pub(crate) fn blocks(self, n: usize) -> usize {
        if self.shift == u32::MAX {
            n / self.spec.block_size
        } else {
            n >> self.shift
        }
    }

    /// `ceil(n / block_size)`.
    #[inline]
    fn blocks_up(self, n: usize) -> usize {
        if self.shift == u32::MAX {
            n.div_ceil(self.spec.block_size)
        } else {
            (n >> self.shift) + usize::from(n & ((1 << self.shift) - 1) != 0)
        }
    }
}

/// The manager's fields a new block touches, borrowed beside a request's table.
pub(super) struct Taker<'a> {
    pub(super) pool: &'a mut BlockPool,
    pub(super) removed: Option<&'a mut Vec<(BlockHash, u32)>>,
    pub(super) owner: &'a [u32],
    pub(super) siblings: &'a mut Siblings,
    pub(super) hash_tokens: &'a mut [u32],
    pub(super) new_ids: &'a mut [Vec<BlockId>],
    pub(super) partial: &'a mut super::partial::PartialEntries,
    /// The metrics hooks' log ([`super::metrics`]), when kept.
    pub(super) metrics: &'a mut Option<Vec<u32>>,
}

impl Taker<'_> {
    /// Pops `n` blocks (at most the free ones) onto group `g`'s `table`,
    /// noting the hashes they drop and logging them when `log_new`.
    pub(super) fn take(
        &mut self,
        table: &mut Vec<BlockId>,
        g: usize,
        n: usize,
        log_new: bool,
    ) -> Vec<BlockId> {
        let n = n.min(self.pool.num_free());
        if self.removed.is_some() || !self.partial.is_empty() {
            // Each victim's own hash, then its extra keys (vLLM's eviction order).
            for b in self.pool.free_queue().take(n) {
                if let (Some(h), Some(removed)) = (self.pool.block_hash(b), self.removed.as_deref_mut()) {
                    removed.push((h, self.owner.get(b.idx()).copied().unwrap_or(0)));
                }
                self.partial.take_block(b, self.removed.as_deref_mut());
            }
        }
        self.siblings.note_victims(self.pool, self.owner, n);
        let mut out = Vec::with_capacity(n);
        self.pool.allocate(n, &mut out);
        self.siblings.sync_victims(self.pool);
        for &b in &out {
            if let Some(t) = self.hash_tokens.get_mut(b.idx()) {
                *t = 0;
            }
        }
        if log_new {
            if let Some(log) = self.new_ids.get_mut(g) {
                log.extend_from_slice(&out);
            }
        }
        if let Some(log) = self.metrics.as_mut() {
            log.extend(out.iter().map(|b| b.0));
        }
        table.extend_from_slice(&out);
        out
    }
}

/// A manager's request map, as its fields are borrowed apart.
pub(super) type ReqMap = hashbrown::HashMap<String, Req, rustc_hash::FxBuildHasher>;

impl VllmManager {
    /// The request map, the group constants and a [`Taker`] over the fields
    /// an allocation touches, borrowed apart (a table is then filled with
    /// one request lookup).
    pub(super) fn split_for_taking(&mut self) -> (&mut ReqMap, &[GroupConst], Taker<'_>) {
        let VllmManager {
            reqs,
            consts,
            pool,
            removed,
            log_removed,
            owner,
            siblings,
            hash_tokens,
            new_ids,
            partial,
            metrics,
            ..
        } = self;
        let taker = Taker {
            pool,
            removed: if *log_removed { Some(removed) } else { None },
            owner,
            siblings,
            hash_tokens,
            new_ids,
            partial,
            metrics,
        };
        (reqs, consts, taker)
    }

    /// `allocate_slots_groups` for a running request with no hit lists (see
    /// the module header); `None` when the call is not one (nothing changed).
    pub(super) fn running_step(&mut self, rid: &str, s: &SlotRequest) -> Option<Option<Vec<Vec<BlockId>>>> {
        if s.full_sequence_tokens.is_some() || self.mamba.any() || self.has_ring {
            return None;
        }
        let VllmManager { reqs, consts, pool, scratch, .. } = self;
        let req: &mut Req = reqs.get_mut(rid)?;
        let every = consts.iter().enumerate().all(|(g, c)| c.cross || req.g(g).num_cached.is_some());
        if !every || !req.running() {
            return None;
        }
        let sig = |n: usize| isize::try_from(n).unwrap_or(isize::MAX);
        let mut need = 0isize;
        let mut short = false;
        for (g, &c) in consts.iter().enumerate() {
            let table = &mut req.g_mut(g).blocks;
            // vLLM's `remove_skipped_blocks` (a no-op when the last block before the window is a null).
            if let Some(p) = s.processed_tokens {
                let skipped = c.spec.skipped_tokens(p);
                if skipped > 0 {
                    null_skipped(pool, scratch, table, c.blocks(skipped));
                }
            }
            let lack = c.blocks_up(s.slot_tokens(c.cross)).saturating_sub(table.len());
            need = need.saturating_add(sig(lack));
            short |= lack > 0;
        }
        if need.saturating_add(sig(s.watermark_blocks)) > sig(pool.num_free()) - sig(s.reserved_blocks) {
            return Some(None);
        }
        if !short {
            return Some(Some(Vec::new()));
        }
        Some(Some(self.take_lacking(rid, s)))
    }

    /// A new request's first `allocate_slots_groups` (see the module header);
    /// `None` when the call is not one (nothing changed).
    pub(super) fn new_request_step(
        &mut self,
        rid: &str,
        new_computed: &[Vec<BlockId>],
        s: &SlotRequest,
    ) -> Option<Option<Vec<Vec<BlockId>>>> {
        if self.mamba.any()
            || self.has_ring
            || s.full_sequence_tokens.is_some()
            || s.num_external_computed > 0
            || !s.adopt
        {
            return None;
        }
        if self.reqs.contains_key(rid) {
            return None;
        }
        let (total, main) = (s.num_local_computed, s.num_tokens_main_model.unwrap_or(s.num_tokens_need_slot));
        let (need_slot, enc) = (s.num_tokens_need_slot, s.num_encoder_tokens);
        let need = self.blocks_needed(None, rid, need_slot, main, enc, new_computed, (total, total), false);
        let sig = |n: usize| isize::try_from(n).unwrap_or(isize::MAX);
        let ng = self.consts.len();
        if need.saturating_add(sig(s.watermark_blocks)) > sig(self.pool.num_free()) - sig(s.reserved_blocks) {
            // `remove_skipped_blocks` made the (empty) entry before the check.
            let skips = |p: usize| self.consts.iter().any(|c| c.spec.skipped_tokens(p) > 0);
            if s.processed_tokens.is_some_and(skips) {
                self.reqs.entry_ref(rid).or_insert_with(|| Req::with_groups(ng));
            }
            return Some(None);
        }
        let VllmManager { reqs, consts, pool, metrics, .. } = self;
        let req = reqs.entry_ref(rid).or_insert_with(|| Req::with_groups(ng));
        for (g, c) in consts.iter().enumerate() {
            let hits = if c.cross { &[][..] } else { new_computed.get(g).map_or(&[][..], Vec::as_slice) };
            // One allocation per table: its hit and new blocks, and room for the
            // blocks of a quarter more tokens (decode steps) before it grows.
            let want = c.blocks_up(s.slot_tokens(c.cross)).max(hits.len());
            req.g_mut(g).blocks.reserve_exact(want.saturating_add(want / 4 + 1));
            if !c.cross {
                adopt_hits(pool, c.spec, req.g_mut(g), hits, total, metrics);
            }
        }
        Some(Some(self.take_lacking(rid, s)))
    }

    /// Each group's blocks up to its slot tokens, group by group (the
    /// request exists; no align-mode Mamba group): one request lookup.
    fn take_lacking(&mut self, rid: &str, s: &SlotRequest) -> Vec<Vec<BlockId>> {
        let (log_new, zero_mask) = (self.log_new, self.zero_mask);
        let (reqs, consts, mut taker) = self.split_for_taking();
        let mut out = Vec::new();
        let Some(req) = reqs.get_mut(rid) else { return out };
        let ng = consts.len();
        for (g, &c) in consts.iter().enumerate() {
            let table = &mut req.g_mut(g).blocks;
            let n = c.blocks_up(s.slot_tokens(c.cross)).saturating_sub(table.len());
            if n == 0 {
                continue;
            }
            let record = log_new && (g >= 64 || zero_mask & (1 << g) != 0);
            let new = taker.take(table, g, n, record);
            if !new.is_empty() {
                out.resize(ng, Vec::new());
                out[g] = new;
            }
        }
        out
    }
}

#[cfg(test)]
#[path = "decode_tests.rs"]
mod decode_tests;
