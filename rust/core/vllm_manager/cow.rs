//! Copy-on-write of blocks a hit reuses only in part, on layouts with an
//! align-mode Mamba group larger than the hash block (where hits may end
//! inside a block under [`GroupLayout::partial_hits`]): vLLM 0.33's `_partial_hit_reqs`,
//! `_apply_cow` and `_pending_cow_copies`, and align-mode Mamba's producer
//! tails (`_producer_partial_tail_reqs`, `BlockPool.move_block_hashes`).
//!
//! - A new request whose local hit ends inside a block of group `g`
//!   (`num_local_computed % B != 0`) counts one block more, adopts the hit,
//!   remembers `(index, source)` of that last block and keeps its cached
//!   count before it. Its next allocation in `g` takes the copy first: the
//!   table's entry becomes the copy, `(source, copy)` is queued, and the
//!   copy takes a second reference (the queue's) while the source keeps the
//!   hit's: both endpoints stay held until the engine ran the copy and
//!   frees them ([`VllmManager::take_cow_copies`] hands them over).
//! - An align-mode Mamba group larger than the hash block registers, when a
//!   caching call ends exactly at the prompt's last hash boundary
//!   (`num_prompt - 1` rounded down to the hash block), the state block
//!   there under that boundary's hash ([`super::partial`]), counted as
//!   cached in this step. Inside a block, the request becomes that tail's
//!   *producer*: its next allocation keeps writing into the source (a
//!   running table only grows), so the entry's keys move silently to the
//!   copy, the source takes the queue's reference, the copy is offered to a
//!   KV connector as the boundary state and its key counts as cached in
//!   this step (no hit takes it before the copy ran).
//!
//! # Invariants (checked by [`VllmManager::check_invariants`])
//! - there is state only on layouts with a Mamba group larger than the hash
//!   block (which registers prompt tails with or without partial hits);
//! - a pending partial hit names a request whose table in that group holds
//!   the source at the index; a producer's source is in its table;
//! - a queued copy's endpoints are distinct real blocks, each held.
//!
//! Costs: nothing on other layouts; O(1) per allocation and group besides
//! the blocks taken; a key move O(the block's keys).

use rustc_hash::FxHashMap;

use super::{cdiv, Req, VllmManager};
use crate::core::error::InvariantViolation;
use crate::core::groups::spec::{GroupKind, GroupLayout, GroupSpec, MambaMode};
use crate::core::ids::BlockId;
use crate::ensure_inv;

/// Whether `layout` has an align-mode Mamba group larger than the hash
/// block with prefix caching on: it registers prompt tails inside blocks
/// (with or without partial hash hits), and copies them on write.
pub(crate) fn has_mamba_tails(layout: &GroupLayout) -> bool {
    !mamba_tail_groups(layout).is_empty()
}

/// The groups [`has_mamba_tails`] looks for, ascending.
pub(crate) fn mamba_tail_groups(layout: &GroupLayout) -> Vec<usize> {
    if !layout.enable_caching() {
        return Vec::new();
    }
    let hbs = layout.hash_block_size();
    let align = |s: &GroupSpec| matches!(s.kind, GroupKind::Mamba { mode: MambaMode::Align });
    (0..layout.len()).filter(|&g| align(&layout.groups()[g]) && layout.groups()[g].block_size > hbs).collect()
}

/// The copy-on-write bookkeeping of a manager (empty without Mamba tails).
#[derive(Clone, Debug, Default)]
pub(crate) struct CowState {
    /// Per group: request → (table index, source block) copied at its next
    /// allocation.
    partial: Vec<FxHashMap<String, (usize, BlockId)>>,
    /// Per group: queued copies `(source, copy)`, oldest first.
    pending: Vec<Vec<(BlockId, BlockId)>>,
    /// Per group: producer request → (source block, boundary tokens).
    producer: Vec<FxHashMap<String, (BlockId, usize)>>,
    /// Producers' copies offered as boundary states: `(request, group,
    /// copy, boundary tokens)`, oldest first.
    offers: Vec<(String, usize, BlockId, usize)>,
}

impl CowState {
    /// The state for `layout`: per-group tables under partial hash hits.
    pub(crate) fn new(layout: &GroupLayout) -> Self {
        if !has_mamba_tails(layout) {
            return CowState::default();
        }
        let n = layout.len();
        CowState {
            partial: vec![FxHashMap::default(); n],
            pending: vec![Vec::new(); n],
            producer: vec![FxHashMap::default(); n],
            offers: Vec::new(),
        }
    }

    /// Whether the layout registers Mamba prompt tails (and copies blocks).
    #[inline]
    pub(crate) fn on(&self) -> bool {
        !self.partial.is_empty()
    }

    /// The pending partial hit of `rid` in group `g`.
    pub(crate) fn partial_of(&self, g: usize, rid: &str) -> Option<(usize, BlockId)> {
        self.partial.get(g)?.get(rid).copied()
    }

    /// Whether `rid` has a pending partial hit in any group.
    pub(crate) fn any_partial(&self, rid: &str) -> bool {
        self.partial.iter().any(|m| m.contains_key(rid))
    }

    /// Forgets a request's pending hits, producer tails and offers (vLLM's
    /// `pop_blocks_for_free`); queued copies stay (their references do).
    pub(crate) fn forget(&mut self, rid: &str) {
        if !self.on() {
            return;
        }
        for m in &mut self.partial {
            m.remove(rid);
        }
        for m in &mut self.producer {
            m.remove(rid);
        }
        self.offers.retain(|o| o.0 != rid);
    }
}

impl VllmManager {
    /// vLLM's `_has_partial_local_hit` under partial hash hits: a local hit
    /// of `local` tokens ending inside a block of `bs` tokens.
    #[inline]
    pub(super) fn partial_local_hit(&self, hits: &[BlockId], local: usize, bs: usize) -> bool {
        self.cow.on() && !hits.is_empty() && !local.is_multiple_of(bs)
    }

    /// After group `g` adopted `hits` (the blocks past its skipped ones) for
    /// a local hit of `local` tokens: a hit ending inside a block is noted
    /// for its copy, and the cached count stops before that block.
    pub(super) fn note_partial_hit(&mut self, rid: &str, g: usize, hits: &[BlockId], local: usize) {
        let bs = self.layout.groups()[g].block_size;
        let Some(&src) = hits.last() else { return };
        if !self.partial_local_hit(hits, local, bs) {
            return;
        }
        let idx = local / bs;
        if let Some(r) = self.reqs.get_mut(rid) {
            r.g_mut(g).num_cached = Some(idx);
        }
        self.cow.partial[g].insert(rid.to_owned(), (idx, src));
    }

    /// The copy of `rid`'s pending partial hit in group `g` (not Mamba),
    /// taken before its new blocks (vLLM's `_apply_cow`): the table's entry
    /// becomes the copy, the copy is queued and takes the queue's reference,
    /// and is logged as a new block. `None` without one.
    pub(super) fn cow_take(&mut self, rid: &str, g: usize) -> Option<BlockId> {
        let (idx, src) = self.cow.partial.get_mut(g)?.remove(rid)?;
        let held = self.reqs.get(rid).and_then(|r| r.g(g).blocks.get(idx).copied());
        if held != Some(src) || self.pool.num_free() == 0 {
            return None;
        }
        let cow = self.take_fresh(g, 1)[0];
        if let Some(r) = self.reqs.get_mut(rid) {
            r.g_mut(g).blocks[idx] = cow;
        }
        self.cow.pending[g].push((src, cow));
        self.pool.touch(&[cow]);
        self.new_ids[g].push(cow);
        Some(cow)
    }

    /// `n` new blocks for group `g` (at most the free ones), in no table
    /// yet (their hashes evicted).
    fn take_fresh(&mut self, g: usize, n: usize) -> Vec<BlockId> {
        let mut out = Vec::with_capacity(n);
        let (_, _, mut taker) = self.split_for_taking();
        taker.take(&mut out, g, n, false);
        out
    }

    /// Align-mode Mamba's `allocate_new_blocks` with a pending partial hit
    /// (`partial`) in group `g`: `n` new blocks, the first the copy. A new
    /// request's table takes the copy at the index (returned first); a
    /// producer keeps its source, whose keys move to the copy. Returns the
    /// blocks to append to the table and the copy when it is returned.
    pub(super) fn mamba_cow(
        &mut self,
        rid: &str,
        g: usize,
        n: usize,
        (idx, src): (usize, BlockId),
        producer: bool,
    ) -> (Vec<BlockId>, Option<BlockId>) {
        let mut new = self.take_fresh(g, n);
        self.cow.partial[g].remove(rid);
        if new.is_empty() {
            return (new, None);
        }
        let held = self.reqs.get(rid).and_then(|r| r.g(g).blocks.get(idx).copied());
        if held != Some(src) {
            // Not the block the hit adopted (vLLM asserts it is): the copy is a plain block.
            return (new, None);
        }
        let cow = new.remove(0);
        self.cow.pending[g].push((src, cow));
        if producer {
            self.move_keys(src, cow);
            self.pool.touch(&[src]);
            if let Some((_, tokens)) = self.cow.producer[g].remove(rid) {
                self.cow.offers.push((rid.to_owned(), g, cow, tokens));
            }
            if let Some(k) = self.pool.block_hash(cow) {
                self.mamba_note_key(g, k);
            }
            (new, None)
        } else {
            if let Some(r) = self.reqs.get_mut(rid) {
                r.g_mut(g).blocks[idx] = cow;
            }
            self.pool.touch(&[cow]);
            (new, Some(cow))
        }
    }

    /// After Mamba group `g` registered `rid`'s prompt tail at `boundary`
    /// tokens in table index `idx` (block `b`): inside a block, the request
    /// becomes the tail's producer (its next allocation copies the block)
    /// and its cached count stops at the index.
    pub(super) fn note_mamba_tail(&mut self, rid: &str, g: usize, idx: usize, b: BlockId, boundary: usize) {
        let bs = self.layout.groups()[g].block_size;
        if boundary.is_multiple_of(bs) || !self.cow.on() {
            return;
        }
        self.cow.partial[g].insert(rid.to_owned(), (idx, b));
        self.cow.producer[g].insert(rid.to_owned(), (b, boundary));
        if let Some(r) = self.reqs.get_mut(rid) {
            r.g_mut(g).num_cached = Some(idx);
        }
    }

    /// Drains group `g`'s queued copies `(source, copy)` (vLLM's
    /// `take_pending_cow_copies`). Each endpoint holds one reference for
    /// the copy; the caller frees both once the copy ran.
    pub fn take_cow_copies(&mut self, g: usize) -> Vec<(BlockId, BlockId)> {
        self.cow.pending.get_mut(g).map(std::mem::take).unwrap_or_default()
    }

    /// The queued copies not yet drained, group by group: `(source, copy)`
    /// (each endpoint holds one reference for its copy).
    #[must_use]
    pub fn pending_cow_copies(&self) -> Vec<(BlockId, BlockId)> {
        self.cow.pending.iter().flatten().copied().collect()
    }

    /// Drains the producers' copies offered as boundary states since the
    /// last call: `(request, group, copy, boundary tokens)`.
    pub fn take_cow_offers(&mut self) -> Vec<(String, usize, BlockId, usize)> {
        std::mem::take(&mut self.cow.offers)
    }

    /// vLLM's `finalize_partial_tail_offloads` for a finishing request: each
    /// Mamba group's producer tail it still holds, as `(group, source,
    /// boundary tokens)` when nothing past the boundary was computed or is
    /// in flight; the tails are forgotten either way.
    pub fn finalize_partial_tails(
        &mut self,
        rid: &str,
        num_computed: usize,
        in_flight: usize,
    ) -> Vec<(usize, BlockId, usize)> {
        let mut out = Vec::new();
        for (g, m) in self.cow.producer.iter_mut().enumerate() {
            if let Some((b, tokens)) = m.remove(rid) {
                if in_flight == 0 && num_computed == tokens {
                    out.push((g, b, tokens));
                }
            }
        }
        out
    }

    /// Whether partial hash hits are on (hits at hash-block boundaries
    /// inside blocks, copied on write).
    #[must_use]
    pub fn partial_hits(&self) -> bool {
        self.layout.partial_hits()
    }

    /// The module header's invariants.
    pub(super) fn check_cow_invariants(&self) -> Result<(), InvariantViolation> {
        if !self.cow.on() {
            return Ok(());
        }
        let table = |rid: &str, g: usize| -> &[BlockId] {
            self.reqs.get(rid).map_or(&[][..], |r: &Req| r.g(g).blocks.as_slice())
        };
        for (g, m) in self.cow.partial.iter().enumerate() {
            for (rid, &(idx, src)) in m {
                ensure_inv!(
                    table(rid, g).get(idx) == Some(&src),
                    "request {rid:?} group {g}: the partial hit's source is not at index {idx}"
                );
            }
        }
        for (g, m) in self.cow.producer.iter().enumerate() {
            for (rid, &(src, tokens)) in m {
                let bs = self.layout.groups()[g].block_size;
                ensure_inv!(
                    table(rid, g).get(cdiv(tokens, bs).saturating_sub(1)) == Some(&src),
                    "request {rid:?} group {g}: the producer tail's source is not in its table"
                );
            }
        }
        for (g, v) in self.cow.pending.iter().enumerate() {
            for &(s, d) in v {
                ensure_inv!(
                    s != d && s != BlockId::NULL && d != BlockId::NULL,
                    "group {g}: a queued copy ({}, {}) is not between two real blocks",
                    s.0,
                    d.0
                );
                ensure_inv!(
                    self.pool.ref_count(s) > 0 && self.pool.ref_count(d) > 0,
                    "group {g}: a queued copy's endpoint is not held"
                );
            }
        }
        Ok(())
    }
}
