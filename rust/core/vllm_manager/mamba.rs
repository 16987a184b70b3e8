//! vLLM 0.33's `MambaManager` for Mamba / linear-attention state groups in
//! `mamba_cache_mode="align"` (what prefix caching of such models uses).
//!
//! A Mamba group keeps one state per request, not one block per token block:
//! - allocation (`allocate_new_blocks`): when the request needs a block past
//!   its table, the table is padded with null blocks up to the last block
//!   position and one new block holds the running state there; the block
//!   that held the state before becomes the request's *last state block*;
//! - the count (`get_num_blocks_to_allocate`): at most one new block per
//!   call, plus the hit's evictable blocks; a hit whose state block was
//!   cached in the current scheduler step refuses the allocation (the
//!   state is only written by that step's forward), by asking for more
//!   blocks than the pool has;
//! - `remove_skipped_blocks`: the blocks before the last computed token's
//!   block are freed (from the retired count on, nulls skipped), and the
//!   last state block once the request moved two blocks past it;
//! - caching: the generic full-block caching (null blocks skipped); every
//!   state block cached is remembered for the step (see the count).
//!
//! "none" mode (no Mamba prefix caching) is the generic single-type rule
//! with the Mamba skipped-token count, handled by [`super::groups`].
//!
//! Under partial hash hits (a Mamba block larger than the hash block) the
//! prompt's last hash boundary is registered inside a block and hits there
//! are copied on write ([`super::cow`]).
//!
//! Speculative state blocks (`num_speculative_blocks`) follow the state;
//! prefill checkpoints are [`super::mamba_checkpoint`]'s, sparse state
//! retention [`super::retention`]'s.
//!
//! # Invariants (checked by [`VllmManager::check_invariants`])
//! - per-request state exists only for align-mode Mamba groups;
//! - the retired prefix of a request's Mamba table holds null blocks only;
//! - a last state block index lies inside the table.
//!
//! Costs: O(1) per call and group plus the blocks freed; the step set is
//! O(blocks cached this step).

use rustc_hash::{FxHashMap, FxHashSet};

use super::{cdiv, Req, VllmManager};
use crate::core::error::{InvariantViolation, KvError, KvResult};
use crate::core::groups::spec::{GroupKind, GroupLayout, MambaMode};
use crate::core::ids::{BlockHash, BlockId};
use crate::ensure_inv;

/// One request's align-mode bookkeeping in one Mamba group.
#[derive(Clone, Debug, Default)]
pub(crate) struct MambaReq {
    /// vLLM's `last_state_block_idx`.
    last_state: Option<usize>,
    /// vLLM's `_num_retired_blocks`.
    retired: usize,
    /// Whether the request is in vLLM's `_allocated_block_reqs`.
    allocated: bool,
    /// vLLM's `_checkpoints` entry: the prefill checkpoint position and the
    /// table index of its reserved block ([`super::mamba_checkpoint`]).
    pub(super) checkpoint: Option<(usize, usize)>,
}

impl MambaReq {
    /// Whether the request is in vLLM's `_allocated_block_reqs`.
    pub(super) fn allocated(&self) -> bool {
        self.allocated
    }
}

/// One align-mode Mamba group's bookkeeping.
#[derive(Clone, Debug, Default)]
pub(crate) struct MambaGroup {
    reqs: FxHashMap<String, MambaReq>,
    /// Keys of the state blocks cached in this scheduler step
    /// (`cached_blocks_this_step`).
    this_step: FxHashSet<BlockHash>,
}

/// Per group: `Some` for align-mode Mamba groups.
#[derive(Clone, Debug, Default)]
pub(crate) struct MambaState {
    groups: Vec<Option<MambaGroup>>,
    /// Per Mamba group: vLLM's `num_speculative_blocks` (empty: none anywhere).
    spec: Vec<usize>,
    /// Per group: the `prefill_checkpoint_alignment` of an align-mode Mamba
    /// group with prefill checkpoint blocks (empty: none anywhere).
    pub(super) ckpt: Vec<Option<usize>>,
}

impl MambaState {
    /// The state for `layout` (empty when it has no align-mode Mamba group).
    pub(crate) fn new(layout: &GroupLayout) -> Self {
        let any = layout.groups().iter().any(|g| is_align(g.kind));
        if !any {
            return MambaState::default();
        }
        MambaState {
            groups: layout.groups().iter().map(|g| is_align(g.kind).then(MambaGroup::default)).collect(),
            spec: Vec::new(),
            ckpt: Vec::new(),
        }
    }

    /// Whether the layout has an align-mode Mamba group, or a Mamba group
    /// with speculative state blocks (the one-lookup step paths serve
    /// neither).
    #[inline]
    pub(crate) fn any(&self) -> bool {
        !self.groups.is_empty() || !self.spec.is_empty()
    }

    /// Group `g`'s speculative state blocks (0 outside Mamba groups).
    #[inline]
    pub(crate) fn spec(&self, g: usize) -> usize {
        self.spec.get(g).copied().unwrap_or(0)
    }

    /// Whether group `g` is an align-mode Mamba group.
    #[inline]
    pub(crate) fn is_align(&self, g: usize) -> bool {
        matches!(self.groups.get(g), Some(Some(_)))
    }

    /// Drops a request's bookkeeping (vLLM's `pop_blocks_for_free`).
    pub(crate) fn forget(&mut self, rid: &str) {
        for m in self.groups.iter_mut().flatten() {
            m.reqs.remove(rid);
        }
    }

    /// Request `rid`'s bookkeeping in align-mode group `g`, if any.
    pub(super) fn req(&self, g: usize, rid: &str) -> Option<&MambaReq> {
        self.groups.get(g)?.as_ref()?.reqs.get(rid)
    }

    /// Every request's bookkeeping in align-mode group `g`.
    pub(super) fn reqs_of(&self, g: usize) -> impl Iterator<Item = (&String, &MambaReq)> {
        self.groups.get(g).and_then(Option::as_ref).into_iter().flat_map(|m| m.reqs.iter())
    }

    /// Request `rid`'s bookkeeping in align-mode group `g`, made if absent.
    pub(super) fn req_mut(&mut self, g: usize, rid: &str) -> &mut MambaReq {
        self.group_mut(g).reqs.entry(rid.to_owned()).or_default()
    }

    fn group_mut(&mut self, g: usize) -> &mut MambaGroup {
        self.groups[g].as_mut().expect("align-mode Mamba group")
    }

    fn group(&self, g: usize) -> &MambaGroup {
        self.groups[g].as_ref().expect("align-mode Mamba group")
    }
}

fn is_align(k: GroupKind) -> bool {
    matches!(k, GroupKind::Mamba { mode: MambaMode::Align })
}

impl VllmManager {
    /// Sets vLLM's `num_speculative_blocks` of each group (MTP / EAGLE with
    /// Mamba: state blocks for the draft tokens): one entry per group, 0
    /// outside Mamba groups.
    ///
    /// # Errors
    /// `InvalidArgument` (nothing changed) for a list of another length, a
    /// count on a group that is not Mamba, or a change once requests exist.
    pub fn set_mamba_speculative_blocks(&mut self, counts: &[usize]) -> KvResult<()> {
        if counts.len() != self.layout.len() {
            return Err(KvError::invalid(format!(
                "{} speculative block counts for {} KV cache groups",
                counts.len(),
                self.layout.len()
            )));
        }
        for (g, &n) in counts.iter().enumerate() {
            if n > 0 && !matches!(self.layout.groups()[g].kind, GroupKind::Mamba { .. }) {
                return Err(KvError::invalid(format!(
                    "group {g} is not a Mamba group: it has no speculative blocks"
                )));
            }
        }
        if !self.reqs.is_empty() {
            return Err(KvError::invalid("speculative block counts are set before any request"));
        }
        self.mamba.spec = if counts.iter().any(|&n| n > 0) { counts.to_vec() } else { Vec::new() };
        Ok(())
    }

    /// Tokens a Mamba group in "none" mode counts past the request's for its
    /// speculative blocks (vLLM adds `block_size * num_speculative_blocks`).
    #[inline]
    pub(crate) fn mamba_extra_tokens(&self, g: usize) -> usize {
        let n = self.mamba.spec(g);
        if n == 0 || self.mamba.is_align(g) {
            return 0;
        }
        n * self.layout.groups()[g].block_size
    }

    /// vLLM's scheduler `new_step_starts`: forgets which Mamba state blocks
    /// were cached in the step that ended.
    pub fn new_step_starts(&mut self) {
        for m in self.mamba.groups.iter_mut().flatten() {
            m.this_step.clear();
        }
    }

    /// Align-mode `get_num_blocks_to_allocate` of Mamba group `g` for
    /// `main_tokens` main-model tokens (may be negative, as in vLLM, when
    /// the table holds more blocks than needed).
    pub(crate) fn mamba_blocks_needed(
        &self,
        rid: &str,
        g: usize,
        main_tokens: usize,
        new_computed: &[BlockId],
        (total, local): (usize, usize),
    ) -> isize {
        let m = self.mamba.group(g);
        if new_computed.last().is_some_and(|&b| self.mamba_cached_this_step(g, b)) {
            return isize::try_from(self.pool.num_blocks() + 1).unwrap_or(isize::MAX);
        }
        let bs = self.layout.groups()[g].block_size;
        let spec = self.mamba.spec(g);
        let held = self.reqs.get(rid).map_or(0, |r| r.g(g).blocks.len());
        let sig = |n: usize| isize::try_from(n).unwrap_or(isize::MAX);
        let mut new = sig(cdiv(main_tokens, bs) + spec) - sig(new_computed.len()) - sig(held);
        // A hit ending inside a block, or a producer's tail, takes its copy too.
        let partial =
            self.partial_local_hit(new_computed, local, bs) || self.cow.partial_of(g, rid).is_some();
        if partial {
            new = new.max(0) + 1;
        }
        let ckpt = usize::from(self.mamba_checkpoint_for(rid, g, total, main_tokens).is_some());
        if new > 0 {
            // One state block per call, the copy and the checkpoint; a first allocation its
            // speculative blocks.
            let allocated = m.reqs.get(rid).is_some_and(|st| st.allocated);
            let cap = 1 + usize::from(partial) + ckpt + if allocated { 0 } else { spec };
            new = new.min(sig(cap));
        }
        let evictable = new_computed.iter().filter(|&&b| b != BlockId::NULL && self.pool.is_free(b)).count();
        new + sig(evictable)
    }

    /// Whether hit block `b`'s hash was cached in this step in group `g`
    /// (vLLM's `cached_blocks_this_step`: such a hit waits for the next step).
    pub(crate) fn mamba_cached_this_step(&self, g: usize, b: BlockId) -> bool {
        b != BlockId::NULL
            && self.pool.block_hash(b).is_some_and(|k| self.mamba.group(g).this_step.contains(&k))
    }

    /// Align-mode `allocate_new_blocks` of Mamba group `g`: the table's new
    /// entries (null padding, then the new state block), empty when the
    /// table already covers `main_tokens`.
    pub(crate) fn mamba_allocate(&mut self, rid: &str, g: usize, main_tokens: usize) -> Vec<BlockId> {
        let bs = self.layout.groups()[g].block_size;
        let ng = self.layout.len();
        let spec = self.mamba.spec(g);
        let required = cdiv(main_tokens, bs) + spec;
        let prev = self.reqs.entry(rid.to_owned()).or_insert_with(|| Req::with_groups(ng)).g(g).blocks.len();
        let partial = self.cow.partial_of(g, rid);
        let st = self.mamba.group_mut(g).reqs.entry(rid.to_owned()).or_default();
        // A prefill checkpoint keeps one block before the state ([`super::mamba_checkpoint`]).
        let ckpt = usize::from(st.checkpoint.is_some());
        if required <= prev && partial.is_none() && ckpt == 0 {
            st.allocated = true;
            return Vec::new();
        }
        let producer = st.allocated;
        if producer {
            // The running state sits before the speculative blocks.
            st.last_state = prev.checked_sub(1 + spec);
        } else if prev > 0 {
            st.last_state = Some(prev - 1);
        }
        st.allocated = true;
        let skipped = required.saturating_sub(spec + 1).saturating_sub(ckpt);
        let table = &mut self.reqs.get_mut(rid).expect("inserted above").g_mut(g).blocks;
        if prev < skipped {
            table.resize(skipped, BlockId::NULL);
        }
        if producer {
            // The last step's speculative blocks this step leaves behind move to the
            // table's end (vLLM's `_relocate_speculative_block`).
            for idx in prev.saturating_sub(spec)..prev {
                if idx >= skipped {
                    break;
                }
                let b = table[idx];
                table.push(b);
                table[idx] = BlockId::NULL;
            }
        }
        let n = required.saturating_sub(table.len());
        let Some(hit) = partial else {
            self.take_new(rid, g, n, false);
            return self.reqs[rid].g(g).blocks[prev..].to_vec();
        };
        let mut out = self.reqs[rid].g(g).blocks[prev..].to_vec();
        let (new, copy) = self.mamba_cow(rid, g, n + 1, hit, producer);
        if let Some(c) = copy {
            out.insert(0, c);
        }
        if let Some(r) = self.reqs.get_mut(rid) {
            r.g_mut(g).blocks.extend_from_slice(&new);
        }
        out.extend(new);
        out
    }

    /// Counts key `k` as cached in this step in Mamba group `g` (a moved or
    /// registered prompt tail).
    pub(crate) fn mamba_note_key(&mut self, g: usize, k: BlockHash) {
        if let Some(Some(m)) = self.mamba.groups.get_mut(g) {
            m.this_step.insert(k);
        }
    }

    /// Align-mode `remove_skipped_blocks` of Mamba group `g` at `processed`
    /// computed tokens (module header).
    pub(crate) fn mamba_remove_skipped(&mut self, rid: &str, g: usize, processed: usize) {
        let bs = self.layout.groups()[g].block_size;
        let ng = self.layout.len();
        let mut freed = Vec::new();
        let skipped = processed.saturating_sub(1);
        if skipped > 0 {
            // vLLM's base `remove_skipped_blocks` (it creates the table entry).
            let table =
                &mut self.reqs.entry(rid.to_owned()).or_insert_with(|| Req::with_groups(ng)).g_mut(g).blocks;
            let last = (skipped / bs).min(table.len());
            let first = self.mamba.group(g).reqs.get(rid).map_or(0, |s| s.retired);
            if first < last {
                for i in (first..last).rev() {
                    if table[i] != BlockId::NULL {
                        freed.push(table[i]);
                        table[i] = BlockId::NULL;
                    }
                }
                self.mamba.group_mut(g).reqs.entry(rid.to_owned()).or_default().retired = last;
            }
        }
        if !freed.is_empty() {
            self.free_now(&freed);
            freed.clear();
        }
        let Some(lsi) = self.mamba.group(g).reqs.get(rid).and_then(|s| s.last_state) else { return };
        if lsi + 1 < cdiv(processed, bs) {
            let table =
                &mut self.reqs.entry(rid.to_owned()).or_insert_with(|| Req::with_groups(ng)).g_mut(g).blocks;
            if let Some(b) = table.get_mut(lsi) {
                if *b != BlockId::NULL {
                    freed.push(*b);
                    *b = BlockId::NULL;
                }
            }
        }
        if !freed.is_empty() {
            self.free_now(&freed);
        }
    }

    /// Releases one reference on each of `blocks`, in order.
    fn free_now(&mut self, blocks: &[BlockId]) {
        let mut scratch = std::mem::take(&mut self.scratch);
        self.pool.free(blocks.iter().copied(), &mut scratch);
        self.scratch = scratch;
    }

    /// Remembers the state blocks of table indices `start..end` of group `g`
    /// that hold a hash (cached this step).
    pub(crate) fn mamba_note_cached(&mut self, rid: &str, g: usize, start: usize, end: usize) {
        let Some(r) = self.reqs.get(rid) else { return };
        let blocks = &r.g(g).blocks;
        let m = self.mamba.groups[g].as_mut().expect("align-mode Mamba group");
        for &b in &blocks[start.min(blocks.len())..end.min(blocks.len())] {
            if b == BlockId::NULL {
                continue;
            }
            if let Some(k) = self.pool.block_hash(b) {
                m.this_step.insert(k);
            }
        }
    }

    /// The Mamba part of [`VllmManager::check_invariants`].
    pub(crate) fn check_mamba_invariants(&self) -> Result<(), InvariantViolation> {
        for (g, m) in self.mamba.groups.iter().enumerate() {
            let Some(m) = m else { continue };
            for (rid, st) in &m.reqs {
                let table = self.reqs.get(rid.as_str()).map_or(&[][..], |r| r.g(g).blocks.as_slice());
                ensure_inv!(
                    table[..st.retired.min(table.len())].iter().all(|&b| b == BlockId::NULL),
                    "request {rid:?} group {g}: a retired Mamba block is not null"
                );
                if let Some(l) = st.last_state {
                    ensure_inv!(
                        l < table.len(),
                        "request {rid:?} group {g}: last state block {l} outside the table"
                    );
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "mamba_tests.rs"]
mod mamba_tests;
