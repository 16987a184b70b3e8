//! Prefill checkpoints of align-mode Mamba groups: vLLM 0.33's
//! `MambaSpec.num_prefill_checkpoint_blocks` (`_checkpoints`,
//! `_needs_internal_checkpoint`, the checkpoint branch of
//! `_cache_partial_tail_block`).
//!
//! A prefill chunk that crosses a reusable boundary (vLLM's
//! `get_mamba_prefill_checkpoint_position` of the chunk's end at the hit
//! alignment, one hash block lower under EAGLE) exports the Mamba state
//! there into a reserved block, the one before the chunk's state block:
//! - the count of a chunk (`query_start`..`query_end`) decides it when the
//!   worker can export it (`is_mamba_prefill_checkpoint_valid`: the chunk
//!   starts on a hash boundary, spans two state columns, the position lies
//!   inside it at least a hash block in, at the backend's alignment from
//!   its start) and the reserved index holds no block yet (or a null, or a
//!   speculative block of a running request); it then counts one block more
//!   and remembers `(position, index)` for the request, forgotten by the
//!   next count without one;
//! - the allocation pads the nulls one short, so the reserved index takes a
//!   new block;
//! - caching re-keys that block at the position (every key it had is
//!   dropped first, logged), counted as cached this step — unless the
//!   position is neither the prompt's reusable boundary, nor a retained
//!   block edge (every one densely, a segment's last under an interval),
//!   nor the shared-prefix junction: the transient state is then
//!   overwritten, so the block's keys are dropped and nothing is
//!   registered;
//! - under retention interval 0 only the chunk reaching the prefill end
//!   (`max(num_prompt, num_tokens - 1)`) reserves a checkpoint.
//!
//! # Invariants
//! - only align-mode Mamba groups with checkpoint blocks hold checkpoints
//!   (the setter refuses others).
//!
//! Costs: O(1) per count, allocation and caching call and group.

use super::partial::{hash_drop, mamba_tail_boundary};
use super::runs::{CachedRun, Stored};
use super::VllmManager;
use crate::core::error::{KvError, KvResult};
use crate::core::groups::spec::{GroupKind, MambaMode};
use crate::core::ids::BlockId;

/// What caching does with a request's prefill checkpoint in one group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CheckpointCache {
    /// Nothing (no block there, or it is keyed at the position already).
    Skip,
    /// A transient state: the block's keys are dropped.
    Evict(BlockId),
    /// Re-key the block at the position: `(position, index, block)`.
    Register(usize, usize, BlockId),
}

impl VllmManager {
    /// Sets each group's prefill checkpoints: the backend's
    /// `prefill_checkpoint_alignment` for an align-mode Mamba group with
    /// `num_prefill_checkpoint_blocks > 0`, else `None`; one entry per group.
    ///
    /// # Errors
    /// `InvalidArgument` (nothing changed) for a list of another length, an
    /// alignment on a group that is not align-mode Mamba or of 0, or a
    /// change once requests exist.
    pub fn set_mamba_prefill_checkpoints(&mut self, alignments: &[Option<usize>]) -> KvResult<()> {
        if alignments.len() != self.layout.len() {
            return Err(KvError::invalid(format!(
                "{} prefill checkpoint alignments for {} KV cache groups",
                alignments.len(),
                self.layout.len()
            )));
        }
        for (g, a) in alignments.iter().enumerate() {
            let Some(a) = *a else { continue };
            let align = matches!(self.layout.groups()[g].kind, GroupKind::Mamba { mode: MambaMode::Align });
            if !align || a == 0 {
                return Err(KvError::invalid(format!(
                    "group {g}: prefill checkpoints need an align-mode Mamba group and an alignment above 0"
                )));
            }
        }
        if !self.reqs.is_empty() {
            return Err(KvError::invalid("prefill checkpoints are set before any request"));
        }
        self.mamba.ckpt = if alignments.iter().any(Option::is_some) && self.enable_caching {
            alignments.to_vec()
        } else {
            Vec::new()
        };
        // A group with checkpoints registers them even when its block is the hash block.
        let groups: Vec<usize> =
            (0..self.mamba.ckpt.len()).filter(|&g| self.mamba.ckpt[g].is_some()).collect();
        self.partial.add_mamba_groups(&groups);
        Ok(())
    }

    /// vLLM's `_needs_internal_checkpoint` for a chunk of group `g` from
    /// `query_start` to `query_end` (main-model) tokens: the checkpoint's
    /// `(position, reserved index)`, or `None`.
    pub(super) fn mamba_checkpoint_for(
        &self,
        rid: &str,
        g: usize,
        query_start: usize,
        query_end: usize,
    ) -> Option<(usize, usize)> {
        let ckpt_align = self.mamba.ckpt.get(g).copied().flatten()?;
        let bs = self.layout.groups()[g].block_size;
        let hbs = self.layout.hash_block_size();
        let la = self.retention.hash_lookahead;
        let pos = mamba_tail_boundary(query_end, self.layout.alignment(), self.layout.use_eagle(), la);
        // `is_mamba_prefill_checkpoint_valid` (Python's floor division of -1 included).
        let initial_col = if query_start == 0 { -1 } else { isize::try_from((query_start - 1) / bs).ok()? };
        let ckpt_col = isize::try_from(query_end.div_ceil(bs)).ok()? - 2;
        let valid = query_start.is_multiple_of(hbs)
            && ckpt_col > initial_col
            && query_start + hbs <= pos
            && query_start < pos
            && pos < query_end
            && (pos - query_start).is_multiple_of(ckpt_align);
        if !valid || ckpt_col < 0 || pos == 0 {
            return None;
        }
        // Under interval 0 only the chunk reaching the prefill end keeps its checkpoint.
        let r = &self.retention;
        if r.interval == Some(0) && query_end < r.num_prompt.max(r.num_tokens.saturating_sub(1)) {
            return None;
        }
        let idx = usize::try_from(ckpt_col).ok()?;
        let table = self.reqs.get(rid).map_or(&[][..], |r| r.g(g).blocks.as_slice());
        let spec = self.mamba.spec(g);
        let allocated = self.mamba.req(g, rid).is_some_and(super::mamba::MambaReq::allocated);
        let free_slot =
            idx >= table.len() || table[idx] == BlockId::NULL || (allocated && idx + spec >= table.len());
        free_slot.then_some((pos, idx))
    }

    /// The count's side effect in vLLM: each checkpointing group remembers
    /// the chunk's checkpoint, or forgets the last one — unless its count
    /// stopped first at a hit on a state cached this step (`new_computed`:
    /// the hit blocks per group).
    pub(super) fn mamba_note_checkpoints(
        &mut self,
        rid: &str,
        new_computed: &[Vec<BlockId>],
        query_start: usize,
        main_tokens: usize,
    ) {
        for g in 0..self.mamba.ckpt.len() {
            if self.mamba.ckpt[g].is_none() {
                continue;
            }
            let last = new_computed.get(g).and_then(|v| v.last().copied());
            if last.is_some_and(|b| self.mamba_cached_this_step(g, b)) {
                continue;
            }
            let c = self.mamba_checkpoint_for(rid, g, query_start, main_tokens);
            if c.is_some() || self.mamba.req(g, rid).is_some() {
                // No entry is made to forget nothing (a refused new request is never freed).
                self.mamba.req_mut(g, rid).checkpoint = c;
            }
        }
    }

    /// Group `g`'s checkpoints: `(request, position, reserved index)`, by request.
    #[must_use]
    pub fn mamba_checkpoints(&self, g: usize) -> Vec<(String, usize, usize)> {
        let mut out: Vec<_> = self
            .mamba
            .reqs_of(g)
            .filter_map(|(rid, st)| st.checkpoint.map(|(p, i)| (rid.clone(), p, i)))
            .collect();
        out.sort();
        out
    }

    /// The request's checkpoint in group `g`, if it has one.
    pub(super) fn mamba_checkpoint_of(&self, g: usize, rid: &str) -> Option<(usize, usize)> {
        self.mamba.req(g, rid).and_then(|st| st.checkpoint)
    }

    /// What the next caching call does with the request's checkpoint in
    /// group `g` (`None`: it has none, the prompt-tail rule applies).
    pub(super) fn checkpoint_cache(&self, rid: &str, g: usize) -> Option<CheckpointCache> {
        let (pos, idx) = self.mamba_checkpoint_of(g, rid)?;
        let bs = self.layout.groups()[g].block_size;
        let b = self.reqs.get(rid).and_then(|r| r.g(g).blocks.get(idx).copied()).unwrap_or(BlockId::NULL);
        if b == BlockId::NULL {
            return Some(CheckpointCache::Skip);
        }
        let r = &self.retention;
        let prompt_boundary = mamba_tail_boundary(
            r.num_prompt,
            self.layout.alignment(),
            self.layout.use_eagle(),
            r.hash_lookahead,
        );
        // A block-edge state is kept densely, or where a segment ends.
        let retained = pos.is_multiple_of(bs)
            && r.interval.is_none_or(|n| pos >= bs && self.mamba_retains(g, pos / bs - 1, n, false));
        if pos != prompt_boundary && !retained && pos != r.shared_boundary {
            return Some(CheckpointCache::Evict(b));
        }
        let own = self.pool.block_hash(b).is_some() && self.hash_tokens[b.idx()] as usize == pos;
        Some(if own { CheckpointCache::Skip } else { CheckpointCache::Register(pos, idx, b) })
    }

    /// Whether the request holds a prefill checkpoint in group `g` (`None`:
    /// the prompt-tail rule applies), and the position caching registers for
    /// it (`Some(None)`: nothing to register).
    pub(super) fn checkpoint_registration(&self, rid: &str, g: usize) -> Option<Option<usize>> {
        Some(match self.checkpoint_cache(rid, g)? {
            CheckpointCache::Register(pos, _, _) => Some(pos),
            CheckpointCache::Skip | CheckpointCache::Evict(_) => None,
        })
    }

    /// Drops the keys of the request's transient checkpoint blocks (caching
    /// runs this before the prompt tails): one run per group that dropped
    /// any, carrying the removals.
    pub fn mamba_checkpoint_evictions(&mut self, rid: &str) -> Vec<CachedRun> {
        let mut runs = Vec::new();
        for g in 0..self.mamba.ckpt.len() {
            let Some(CheckpointCache::Evict(b)) = self.checkpoint_cache(rid, g) else { continue };
            // vLLM's collector hears the eviction whether or not the block had a hash.
            self.log_evicted(b);
            let mark = self.removed.len();
            if !hash_drop!(self).drop_all(b) {
                continue;
            }
            let removed = if self.log_removed { (mark, self.removed.len()) } else { (0, 0) };
            let bs = self.layout.groups()[g].block_size;
            runs.push(CachedRun {
                group: g,
                start: 0,
                end: 0,
                stored: Stored::default(),
                block_size: bs,
                removed,
            });
        }
        runs
    }
}
