//! The manager's calls over any number of KV cache groups: vLLM 0.33's
//! `KVCacheManager` over its `HybridKVCacheCoordinator` (or the unitary one
//! for one group), each group's single-type behaviour given by its
//! [`GroupRule`].
//!
//! - hits: [`coordinator::longest_hit`] over the pool, one lookup per spec
//!   set; the anchor group's run is probed once, and the blocks of every
//!   group under the hashes it covers are read from its blocks' sibling rows
//!   ([`super::siblings`]); other blocks are probed under their group's key;
//! - allocation: the full-sequence gate, `remove_skipped_blocks`, the count,
//!   hits touched for every group before any group takes external blocks
//!   (two phases, as vLLM), then new blocks group by group (a running
//!   request's step and a new request's first call take one request lookup,
//!   [`super::decode`]); a
//!   cross-attention group counts and takes blocks for the encoder tokens
//!   only, adopts no hit and no external tokens and keeps no cached count
//!   (vLLM's `CrossAttentionManager`);
//! - caching: each prefix-cacheable group's cacheable tokens (rounded to the
//!   scheduler block on hybrids, one block more where the group drops the
//!   EAGLE block), its full blocks from its cached count, less null blocks
//!   and the blocks its rule never serves (sliding-window segment heads); a
//!   group that is not prefix-cacheable (bounded-replay sliding-window MLA)
//!   never hits and is never cached, its cached count left where adopting
//!   its (empty) hit set it; a circular buffer counts and takes one block
//!   per request, once (on its first allocation or external tokens); a
//!   block whose hash is a prompt tail's partial
//!   hash is promoted (all its keys dropped first); after the runs, each
//!   full-attention group larger than the hash block registers its prompt
//!   tail ([`super::partial`]).
//!
//! # Invariants (checked by [`VllmManager::check_invariants`])
//! - the pool's invariants hold;
//! - a block in a request's tables is in the tables of one group only and
//!   is referenced at most its ref count times;
//! - a cached block's recorded group is the group its key belongs to, a
//!   prefix-cacheable group;
//! - the sibling rows agree with the pool ([`super::siblings`]);
//! - the extra keys of partial entries are consistent ([`super::partial`]).
//!
//! Costs: a hit is one probe per block of the anchor's run plus O(blocks
//! looked up) row reads or probes per spec set and round of the fixed
//! point; allocation and caching O(blocks touched) per group.

use std::cell::RefCell;
use std::num::NonZeroU32;

use rustc_hash::FxHashMap;

use super::partial;
use super::pool_lookup::PoolLookup;
use super::table_ops::null_skipped;
use super::{cdiv, group_key, owner_word, Req, SlotRequest, VllmManager};
use crate::core::error::{ErrorKind, InvariantViolation, KvError, KvResult};
use crate::core::groups::coordinator::{self, coarse_hash_index, HybridHit};
use crate::core::groups::rule::GroupRule;
use crate::core::groups::spec::{GroupKind, GroupLayout, GroupSpec};
use crate::core::ids::{BlockHash, BlockId};
use crate::ensure_inv;

/// Rejects what the manager does not implement, naming it.
pub(crate) fn check_supported(layout: &GroupLayout) -> KvResult<()> {
    if layout.len() > 64 {
        return Err(KvError::invalid("at most 64 KV cache groups are supported"));
    }
    Ok(())
}

/// A hit over all groups.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupHit {
    /// Tokens reused and vLLM's uncached common prefix.
    pub hit: HybridHit,
    /// Per group: the hit's blocks, [`BlockId::NULL`] for skipped ones.
    pub blocks: Vec<Vec<BlockId>>,
}

pub use super::runs::{CachedRun, Stored, StoredIter};

/// The runs [`VllmManager::cache_plan`] returns, `(group, start, end)` in
/// group order (a slice by deref); up to four inline, without an allocation.
#[derive(Clone, Debug)]
pub struct CachePlan {
    len: usize,
    inline: [(usize, usize, usize); 4],
    more: Vec<(usize, usize, usize)>,
}

impl CachePlan {
    pub(crate) fn new() -> Self {
        CachePlan { len: 0, inline: [(0, 0, 0); 4], more: Vec::new() }
    }

    pub(crate) fn push(&mut self, run: (usize, usize, usize)) {
        if self.more.is_empty() && self.len < self.inline.len() {
            self.inline[self.len] = run;
            self.len += 1;
            return;
        }
        if self.more.is_empty() {
            self.more.extend_from_slice(&self.inline[..self.len]);
        }
        self.more.push(run);
    }
}

impl std::ops::Deref for CachePlan {
    type Target = [(usize, usize, usize)];
    fn deref(&self) -> &Self::Target {
        if self.more.is_empty() {
            &self.inline[..self.len]
        } else {
            &self.more
        }
    }
}

impl PartialEq for CachePlan {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for CachePlan {}

impl PartialEq<Vec<(usize, usize, usize)>> for CachePlan {
    fn eq(&self, other: &Vec<(usize, usize, usize)>) -> bool {
        **self == **other
    }
}

/// One request in a [`ManagerSnapshot`]: its id, one table per group, one
/// cached count per group.
pub type RequestSnapshot = (String, Vec<Vec<BlockId>>, Vec<Option<usize>>);

/// What [`VllmManager::state_snapshot`] returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManagerSnapshot {
    /// Per request, sorted by id.
    pub requests: Vec<RequestSnapshot>,
    /// The pool's free queue, front first.
    pub free_queue: Vec<BlockId>,
}

impl VllmManager {
    /// Number of KV cache groups.
    #[must_use]
    pub fn num_groups(&self) -> usize {
        self.layout.len()
    }

    /// Group `g`'s table of the request (empty if unknown).
    #[must_use]
    pub fn group_blocks(&self, rid: &str, g: usize) -> &[BlockId] {
        match self.reqs.get(rid) {
            Some(r) if g < self.layout.len() => r.g(g).blocks.as_slice(),
            _ => &[],
        }
    }

    /// Group `g`'s `num_cached_block` entry of the request.
    #[must_use]
    pub fn group_num_cached(&self, rid: &str, g: usize) -> Option<usize> {
        self.reqs.get(rid).filter(|_| g < self.layout.len()).and_then(|r| r.g(g).num_cached)
    }

    /// Every request's per-group tables and cached counts (requests sorted by
    /// id) and the free queue: what a refused call must leave unchanged.
    /// O(blocks held + pool); for tests and fuzzing, not the hot path.
    #[must_use]
    pub fn state_snapshot(&self) -> ManagerSnapshot {
        let mut ids: Vec<&str> = self.request_ids(false);
        ids.sort_unstable();
        let requests = ids
            .into_iter()
            .map(|r| {
                let tables = (0..self.num_groups()).map(|g| self.group_blocks(r, g).to_vec()).collect();
                let cached = (0..self.num_groups()).map(|g| self.group_num_cached(r, g)).collect();
                (r.to_owned(), tables, cached)
            })
            .collect();
        ManagerSnapshot { requests, free_queue: self.pool().free_queue().collect() }
    }

    /// vLLM's `find_longest_cache_hit` over all groups for request hashes
    /// `hashes` (at the hash block size), at most `max_tokens`. No side effects.
    #[must_use]
    pub fn find_hit_groups(&self, hashes: &[BlockHash], max_tokens: usize) -> GroupHit {
        let ng = self.layout.len();
        let hbs = self.layout.hash_block_size();
        let sets = self.layout.spec_sets();
        let scratch = RefCell::new((Vec::new(), Vec::new()));
        let anchor = self.anchor_run(hashes, max_tokens);
        // Set `si`'s lookup; past the last set an unused one (no groups, no allocation).
        let make = |si: usize| {
            let Some(s) = sets.get(si) else {
                let (side, groups) = (Vec::new(), &[][..]);
                return PoolLookup {
                    m: self,
                    hashes,
                    scale: 1,
                    groups,
                    side,
                    scratch: &scratch,
                    anchor: &anchor,
                };
            };
            let scale = s.spec.block_size / hbs;
            let side = if s.group_ids.len() > 1 {
                Vec::with_capacity((hashes.len() / scale + 1) * s.group_ids.len())
            } else {
                Vec::new()
            };
            PoolLookup {
                m: self,
                hashes,
                scale,
                groups: &s.group_ids,
                side,
                scratch: &scratch,
                anchor: &anchor,
            }
        };
        // Up to four sets' lookups on the stack.
        let mut few: [PoolLookup<'_>; 4];
        let mut many: Vec<PoolLookup<'_>>;
        let looks: &mut [PoolLookup<'_>] = if sets.len() <= 4 {
            few = std::array::from_fn(make);
            &mut few[..sets.len()]
        } else {
            many = (0..sets.len()).map(make).collect();
            &mut many
        };
        let mut outs: Vec<Vec<Option<NonZeroU32>>> =
            sets.iter().map(|s| Vec::with_capacity(hashes.len() / (s.spec.block_size / hbs) + 1)).collect();
        let hit = coordinator::longest_hit(&self.layout, looks, max_tokens, hashes.len(), &mut outs);
        let one = |o: Vec<Option<NonZeroU32>>| -> Vec<BlockId> {
            // A one-group set answers block ids (None: the null block, id 0): the
            // list converts in place.
            o.into_iter().map(|o| BlockId(o.map_or(0, NonZeroU32::get))).collect()
        };
        if sets.len() == ng && sets.iter().enumerate().all(|(si, s)| *s.group_ids == [si]) {
            // Set `i` is group `i` alone (most layouts): the lists convert in place.
            return GroupHit { hit, blocks: outs.into_iter().map(one).collect() };
        }
        let mut blocks = vec![Vec::new(); ng];
        for (si, s) in sets.iter().enumerate() {
            if let [g] = *s.group_ids {
                blocks[g] = one(std::mem::take(&mut outs[si]));
                continue;
            }
            for (m, &g) in s.group_ids.iter().enumerate() {
                let side = &looks[si].side;
                blocks[g] = outs[si]
                    .iter()
                    .map(|o| o.map_or(BlockId::NULL, |off| side[off.get() as usize - 1 + m]))
                    .collect();
            }
        }
        GroupHit { hit, blocks }
    }

    /// vLLM's `estimate_cached_tokens`: over the prefix-cacheable groups (not
    /// cross-attention), the fewest tokens any group's table holds a cached
    /// block for (the most tokens a block's hash covers in that table); 0 for
    /// an unknown request. O(the request's blocks).
    #[must_use]
    pub fn estimate_cached_tokens(&self, rid: &str) -> usize {
        let Some(req) = self.reqs.get(rid) else { return 0 };
        let mut cached: Option<usize> = None;
        for (g, c) in self.consts.iter().enumerate() {
            if !c.cacheable || c.cross {
                continue;
            }
            let n = req
                .g(g)
                .blocks
                .iter()
                .filter(|&&b| b != BlockId::NULL && self.pool.is_cached(b))
                .map(|&b| self.hash_tokens[b.idx()] as usize)
                .max()
                .unwrap_or(0);
            cached = Some(cached.map_or(n, |m| m.min(n)));
        }
        cached.unwrap_or(0)
    }

    /// vLLM's `find_longest_cache_hit_per_group`: each group's blocks and
    /// hit length with every spec set looked up on its own (groups in no
    /// spec set: none, 0). No side effects.
    #[must_use]
    pub fn find_hit_per_group(
        &self,
        hashes: &[BlockHash],
        max_tokens: usize,
    ) -> (Vec<Vec<BlockId>>, Vec<usize>) {
        let ng = self.layout.len();
        let hbs = self.layout.hash_block_size();
        let sets = self.layout.spec_sets();
        let scratch = RefCell::new((Vec::new(), Vec::new()));
        let anchor = self.anchor_run(hashes, max_tokens);
        let mut looks: Vec<PoolLookup<'_>> = sets
            .iter()
            .map(|s| PoolLookup {
                m: self,
                hashes,
                scale: s.spec.block_size / hbs,
                groups: &s.group_ids,
                side: Vec::new(),
                scratch: &scratch,
                anchor: &anchor,
            })
            .collect();
        let mut outs: Vec<Vec<Option<NonZeroU32>>> = vec![Vec::new(); sets.len()];
        let hits = coordinator::per_set_hits(&self.layout, &mut looks, max_tokens, hashes.len(), &mut outs);
        let mut blocks = vec![Vec::new(); ng];
        let mut lens = vec![0; ng];
        for (si, s) in sets.iter().enumerate() {
            // A one-group set answers block ids, a larger one offsets (plus one) into its side list.
            for (m, &g) in s.group_ids.iter().enumerate() {
                lens[g] = hits[si];
                blocks[g] = outs[si]
                    .iter()
                    .map(|o| match (o, s.group_ids.len()) {
                        (None, _) => BlockId::NULL,
                        (Some(b), 1) => BlockId(b.get()),
                        (Some(off), _) => looks[si].side[off.get() as usize - 1 + m],
                    })
                    .collect();
            }
        }
        (blocks, lens)
    }

    /// The anchor group's first copies of the request hashes a lookup of
    /// `max_tokens` can ask for (and one block past them under EAGLE: its
    /// peek), up to the first uncached one; empty without sibling rows.
    pub(super) fn anchor_run(&self, hashes: &[BlockHash], max_tokens: usize) -> Vec<BlockId> {
        let mut out = Vec::new();
        let Some(a) = self.siblings.anchor() else { return out };
        let peek = usize::from(self.layout.use_eagle());
        let hs = &hashes[..(max_tokens / self.layout.hash_block_size() + peek).min(hashes.len())];
        out.reserve(hs.len());
        if a == 0 {
            self.pool.lookup_run(hs, &mut out);
        } else {
            let keys: Vec<BlockHash> = hs.iter().map(|h| group_key(h, a)).collect();
            self.pool.lookup_run(&keys, &mut out);
        }
        out
    }

    /// vLLM's single-type `get_num_blocks_to_allocate` for group `g` (a
    /// cross-attention group: `num_tokens` are encoder tokens).
    #[must_use]
    pub fn num_blocks_to_allocate_group(
        &self,
        rid: &str,
        g: usize,
        num_tokens: usize,
        new_computed: &[BlockId],
        total_computed: usize,
        apply_cap: bool,
    ) -> usize {
        self.blocks_to_allocate(
            self.reqs.get(rid),
            g,
            num_tokens,
            new_computed,
            total_computed,
            total_computed,
            apply_cap,
        )
    }

    /// Whether group `g` is a cross-attention group.
    fn is_cross(&self, g: usize) -> bool {
        self.consts.get(g).is_some_and(|c| c.cross)
    }

    /// Whether group `g` is a circular buffer (one block per request).
    pub(super) fn is_ring(&self, g: usize) -> bool {
        self.layout.groups().get(g).is_some_and(|s| s.kind == GroupKind::CircularBuffer)
    }

    /// A circular buffer's block for `rid` in group `g`, taken when its
    /// table is empty (vLLM's `_claim_ring_block`).
    fn claim_ring(&mut self, rid: &str, g: usize, record: bool) -> Vec<BlockId> {
        self.take_upto(rid, g, 1, record)
    }

    /// [`Self::num_blocks_to_allocate_group`] for the request's tables `req`
    /// (`None`: it has none), looked up by the caller.
    #[allow(clippy::too_many_arguments)]
    fn blocks_to_allocate(
        &self,
        req: Option<&Req>,
        g: usize,
        num_tokens: usize,
        new_computed: &[BlockId],
        total_computed: usize,
        local: usize,
        apply_cap: bool,
    ) -> usize {
        let spec = self.layout.groups()[g];
        let bs = spec.block_size;
        let mut required = cdiv(num_tokens, bs);
        if apply_cap {
            if let Some(cap) = self.caps[g] {
                required = required.min(cap);
            }
        }
        let (held, running) = req.map_or((0, false), |r| (r.g(g).blocks.len(), r.g(g).num_cached.is_some()));
        if running {
            return required.saturating_sub(held);
        }
        let skipped = spec.skipped_tokens(total_computed) / bs;
        let local_blocks = new_computed.len() + held;
        let new = required.saturating_sub(skipped.max(local_blocks));
        let skip_new = skipped.saturating_sub(held).min(new_computed.len());
        let evictable = new_computed[skip_new..].iter().filter(|&&b| self.pool.is_free(b)).count();
        // A hit ending inside a block reserves its copy ([`super::cow`]).
        new + evictable + usize::from(self.partial_local_hit(new_computed, local, bs))
    }

    /// vLLM's coordinator `get_num_blocks_to_allocate`: the sum over groups
    /// (0 when negative; see [`Self::num_blocks_to_allocate_signed`]).
    #[must_use]
    pub fn num_blocks_to_allocate_groups(
        &self,
        rid: &str,
        num_tokens: usize,
        new_computed: &[Vec<BlockId>],
        total_computed: usize,
        apply_cap: bool,
    ) -> usize {
        let n = self.num_blocks_to_allocate_signed(
            rid,
            num_tokens,
            num_tokens,
            new_computed,
            total_computed,
            apply_cap,
        );
        usize::try_from(n).unwrap_or(0)
    }

    /// vLLM's coordinator `get_num_blocks_to_allocate` with its
    /// `num_tokens_main_model` (`main_tokens`, what align-mode Mamba groups
    /// count): the sum over groups, negative when a Mamba table holds more
    /// blocks than needed, as in vLLM.
    #[must_use]
    pub fn num_blocks_to_allocate_signed(
        &self,
        rid: &str,
        num_tokens: usize,
        main_tokens: usize,
        new_computed: &[Vec<BlockId>],
        total_computed: usize,
        apply_cap: bool,
    ) -> isize {
        self.num_blocks_to_allocate_encoder(
            rid,
            num_tokens,
            main_tokens,
            0,
            new_computed,
            (total_computed, total_computed),
            apply_cap,
        )
    }

    /// [`Self::num_blocks_to_allocate_signed`] with vLLM's
    /// `num_encoder_tokens`, what cross-attention groups count (no hit, no
    /// computed tokens), and `computed`: vLLM's `(total_computed_tokens,
    /// num_local_computed_tokens)` (a local hit ending inside a block counts
    /// its copy).
    #[must_use]
    #[allow(clippy::too_many_arguments)]
    pub fn num_blocks_to_allocate_encoder(
        &self,
        rid: &str,
        num_tokens: usize,
        main_tokens: usize,
        encoder_tokens: usize,
        new_computed: &[Vec<BlockId>],
        computed: (usize, usize),
        apply_cap: bool,
    ) -> isize {
        self.blocks_needed(
            self.reqs.get(rid),
            rid,
            num_tokens,
            main_tokens,
            encoder_tokens,
            new_computed,
            computed,
            apply_cap,
        )
    }

    /// [`Self::num_blocks_to_allocate_encoder`] for the request's tables
    /// `req` (`None`: it has none), looked up by the caller.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn blocks_needed(
        &self,
        req: Option<&Req>,
        rid: &str,
        num_tokens: usize,
        main_tokens: usize,
        encoder_tokens: usize,
        new_computed: &[Vec<BlockId>],
        (total_computed, local): (usize, usize),
        apply_cap: bool,
    ) -> isize {
        (0..self.layout.len())
            .map(|g| {
                let nc = new_computed.get(g).map_or(&[][..], Vec::as_slice);
                if self.mamba.is_align(g) {
                    return self.mamba_blocks_needed(rid, g, main_tokens, nc, (total_computed, local));
                }
                if self.is_cross(g) {
                    let n = self.blocks_to_allocate(req, g, encoder_tokens, &[], 0, 0, apply_cap);
                    return isize::try_from(n).unwrap_or(isize::MAX);
                }
                if self.is_ring(g) {
                    // A circular buffer: its one block, once.
                    return isize::from(req.is_none_or(|r| r.g(g).blocks.is_empty()));
                }
                let tokens = num_tokens + self.mamba_extra_tokens(g);
                let n = self.blocks_to_allocate(req, g, tokens, nc, total_computed, local, apply_cap);
                isize::try_from(n).unwrap_or(isize::MAX)
            })
            .fold(0isize, isize::saturating_add)
    }

    /// Validates per-group hit blocks: one list per group (or none), each
    /// block the null block or a cached block of that group.
    fn check_hits(&self, new_computed: &[Vec<BlockId>]) -> KvResult<()> {
        if !new_computed.is_empty() && new_computed.len() != self.layout.len() {
            return Err(KvError::invalid(format!(
                "{} hit block lists for {} KV cache groups",
                new_computed.len(),
                self.layout.len()
            )));
        }
        for (g, blocks) in new_computed.iter().enumerate() {
            if !self.layout.prefix_cacheable(g) && !blocks.is_empty() {
                return Err(KvError::invalid(format!(
                    "group {g} is not prefix-cacheable: its hit list must be empty, got {} blocks",
                    blocks.len()
                )));
            }
            for &b in blocks {
                if b == BlockId::NULL {
                    continue;
                }
                if b.idx() >= self.pool.num_blocks() {
                    return Err(KvError::invalid(format!("block id {} out of range", b.0)));
                }
                if self.pool.block_hash(b).is_none() || self.block_group(b) != g {
                    return Err(KvError::invalid(format!(
                        "block {} is not cached for group {g}: not a cache hit",
                        b.0
                    )));
                }
            }
        }
        Ok(())
    }

    /// vLLM's `KVCacheManager.allocate_slots` over all groups, up to (not
    /// including) caching: the full-sequence gate, `remove_skipped_blocks`
    /// (`s.processed_tokens`), the free-block check, adopting every group's
    /// hit and then external tokens, then new blocks up to
    /// `num_tokens_need_slot`. Returns each group's new blocks (in group
    /// order; an empty list, with no allocation, when no group took a block),
    /// or `None` (as in vLLM, skipped blocks may have been freed before a refusal).
    ///
    /// # Errors
    /// `InvalidArgument` for hit lists that are not this manager's hits, or a
    /// hit for a running request (nothing changed).
    pub fn allocate_slots_groups(
        &mut self,
        rid: &str,
        new_computed: &[Vec<BlockId>],
        s: &SlotRequest,
    ) -> KvResult<Option<Vec<Vec<BlockId>>>> {
        self.check_hits(new_computed)?;
        let any_hit = new_computed.iter().any(|v| !v.is_empty());
        // Most decode steps, and a new request's prompt: one request lookup
        // ([`super::decode`]); hits with caching off are refused below.
        if !any_hit {
            if let Some(step) = self.running_step(rid, s) {
                return Ok(step);
            }
        }
        if self.enable_caching || !any_hit {
            if let Some(step) = self.new_request_step(rid, new_computed, s) {
                return Ok(step);
            }
        }
        self.allocate_general(rid, new_computed, s, any_hit)
    }

    /// [`Self::allocate_slots_groups`] for any call (the hits checked).
    pub(super) fn allocate_general(
        &mut self,
        rid: &str,
        new_computed: &[Vec<BlockId>],
        s: &SlotRequest,
        any_hit: bool,
    ) -> KvResult<Option<Vec<Vec<BlockId>>>> {
        let req = self.reqs.get(rid);
        let (running, all_running) = req.map_or((false, false), |r| (r.running(), r.all_running()));
        if running && any_hit {
            return Err(KvError::invalid(format!(
                "request {rid:?} is running: it cannot adopt new prefix-cache hits"
            )));
        }
        if !self.enable_caching && new_computed.iter().flatten().any(|&b| b != BlockId::NULL) {
            return Err(KvError::invalid("prefix caching is off: there are no hit blocks".to_owned()));
        }
        let local = s.num_local_computed;
        let total = local + s.num_external_computed;
        let sig = |n: usize| isize::try_from(n).unwrap_or(isize::MAX);
        if let Some(full) = s.full_sequence_tokens {
            let gate_total = s.full_sequence_computed.unwrap_or(total);
            let enc = s.num_encoder_tokens;
            let computed = (gate_total, local);
            let n = self.num_blocks_to_allocate_encoder(rid, full, full, enc, new_computed, computed, true);
            if n.saturating_add(sig(s.watermark_blocks)) > sig(self.pool.num_free()) {
                return Ok(None);
            }
        }
        let main = s.num_tokens_main_model.unwrap_or(s.num_tokens_need_slot);
        let (need_slot, enc, hits) = (s.num_tokens_need_slot, s.num_encoder_tokens, new_computed);
        // Most decode steps: `remove_skipped_blocks` has nothing to free, and the
        // count reads the tables already looked up.
        let need = match (s.processed_tokens, req) {
            (Some(p), Some(r)) if !self.skipped_noop(r, p) => {
                self.remove_skipped_blocks(rid, p);
                self.num_blocks_to_allocate_encoder(rid, need_slot, main, enc, hits, (total, local), false)
            }
            (Some(p), None) => {
                self.remove_skipped_blocks(rid, p);
                self.num_blocks_to_allocate_encoder(rid, need_slot, main, enc, hits, (total, local), false)
            }
            _ => self.blocks_needed(req, rid, need_slot, main, enc, hits, (total, local), false),
        };
        if !self.mamba.ckpt.is_empty() {
            // vLLM's count remembers each chunk's prefill checkpoint, even when refused.
            self.mamba_note_checkpoints(rid, new_computed, total, main);
        }
        if need.saturating_add(sig(s.watermark_blocks)) > sig(self.pool.num_free()) - sig(s.reserved_blocks) {
            return Ok(None);
        }
        let ng = self.layout.len();
        if s.adopt && !running {
            // Cross-attention groups adopt neither hits nor external tokens.
            for g in 0..ng {
                if self.is_cross(g) {
                    continue;
                }
                let nc = new_computed.get(g).map_or(&[][..], Vec::as_slice);
                self.add_local_computed(rid, g, nc, total);
                if self.cow.on() {
                    let spec = self.layout.groups()[g];
                    let skipped = spec.skipped_tokens(total) / spec.block_size;
                    self.note_partial_hit(rid, g, &nc[skipped.min(nc.len())..], local);
                }
            }
            if s.num_external_computed > 0 {
                for g in 0..ng {
                    if self.is_cross(g) {
                        continue;
                    }
                    let record = self.records_new(g) && (g >= 64 || s.skip_zeroing & (1 << g) == 0);
                    self.allocate_external(rid, g, s.num_external_computed, total, record);
                }
            }
        }
        // Bit `g`: group `g` already holds the blocks it needs (most decode steps);
        // it takes none. When every group has a cached count and none is Mamba, the
        // count is `needed - held` per group: a count of 0 needs no lookup for that.
        let want = |g: usize, spec: GroupSpec| {
            cdiv(s.slot_tokens(self.is_cross(g)) + self.mamba_extra_tokens(g), spec.block_size)
        };
        let all_held = all_running && need == 0 && !self.mamba.any();
        let enough = if self.cow.any_partial(rid) {
            // A pending partial hit takes its copy even when the table is long enough.
            0
        } else if all_held {
            u64::MAX
        } else {
            self.reqs.get(rid).map_or(0u64, |r| {
                let groups = self.layout.groups().iter().enumerate();
                groups
                    .filter(|&(g, &spec)| !self.mamba.is_align(g) && r.g(g).blocks.len() >= want(g, spec))
                    .fold(0, |m, (g, _)| m | 1 << g)
            })
        };
        // Allocated when a group takes a block (not on most decode steps).
        let mut out = Vec::new();
        for g in 0..ng {
            let new = if enough & (1 << g) != 0 {
                continue;
            } else if self.mamba.is_align(g) {
                self.mamba_allocate(rid, g, main)
            } else if self.is_ring(g) {
                let record = self.records_new(g);
                self.claim_ring(rid, g, record)
            } else {
                let record = self.records_new(g);
                let tokens = s.slot_tokens(self.is_cross(g)) + self.mamba_extra_tokens(g);
                let n = cdiv(tokens, self.layout.groups()[g].block_size);
                match self.cow_take(rid, g) {
                    Some(copy) => {
                        let mut v = vec![copy];
                        v.extend(self.take_upto(rid, g, n, record));
                        v
                    }
                    None => self.take_upto(rid, g, n, record),
                }
            };
            if !new.is_empty() {
                out.resize(ng, Vec::new());
                out[g] = new;
            }
        }
        Ok(Some(out))
    }

    /// vLLM's `add_local_computed_blocks` for group `g`: skipped blocks
    /// become nulls, the rest are touched and appended.
    fn add_local_computed(&mut self, rid: &str, g: usize, hits: &[BlockId], total: usize) {
        let spec = self.layout.groups()[g];
        let ng = self.layout.len();
        let req = self.reqs.entry_ref(rid).or_insert_with(|| Req::with_groups(ng));
        super::table_ops::adopt_hits(&mut self.pool, spec, req.g_mut(g), hits, total, &mut self.metrics);
    }

    /// vLLM's `allocate_external_computed_blocks` for group `g`.
    fn allocate_external(&mut self, rid: &str, g: usize, ext: usize, total: usize, record: bool) {
        if self.is_ring(g) {
            self.claim_ring(rid, g, record);
            return;
        }
        let spec = self.layout.groups()[g];
        let skipped = spec.skipped_tokens(total);
        let ext = if skipped > 0 { (total - skipped).min(ext) } else { ext };
        if ext == 0 {
            return;
        }
        let n = cdiv(total, spec.block_size).saturating_sub(self.group_blocks(rid, g).len());
        self.take_new(rid, g, n, record);
    }

    /// Whether `remove_skipped_blocks(processed)` would change nothing for the
    /// request's tables `r` (it exists; no Mamba group): in each group the
    /// last block before the window is a null (or there is none).
    fn skipped_noop(&self, r: &Req, processed: usize) -> bool {
        !self.mamba.any()
            && self.layout.groups().iter().enumerate().all(|(g, spec)| {
                let blocks = &r.g(g).blocks;
                let n = (spec.skipped_tokens(processed) / spec.block_size).min(blocks.len());
                n == 0 || blocks[n - 1] == BlockId::NULL
            })
    }

    /// vLLM's `remove_skipped_blocks`: in each group, the blocks wholly before
    /// the attention window of the token after `processed` are freed (last
    /// first, stopping at a null) and replaced by nulls.
    pub fn remove_skipped_blocks(&mut self, rid: &str, processed: usize) {
        let ng = self.layout.len();
        let skipped = |spec: GroupSpec| spec.skipped_tokens(processed);
        if !self.mamba.any() {
            // One request lookup for all groups (vLLM's defaultdict makes the entry
            // for the first group with skipped tokens; a group without any frees nothing).
            if self.layout.groups().iter().all(|&spec| skipped(spec) == 0) {
                return;
            }
            let req = self.reqs.entry_ref(rid).or_insert_with(|| Req::with_groups(ng));
            for (g, &spec) in self.layout.groups().iter().enumerate() {
                let n = skipped(spec) / spec.block_size;
                null_skipped(&mut self.pool, &mut self.scratch, &mut req.g_mut(g).blocks, n);
            }
            return;
        }
        for g in 0..ng {
            if self.mamba.is_align(g) {
                self.mamba_remove_skipped(rid, g, processed);
                continue;
            }
            let spec = self.layout.groups()[g];
            if skipped(spec) == 0 {
                continue;
            }
            let req = self.reqs.entry_ref(rid).or_insert_with(|| Req::with_groups(ng));
            null_skipped(
                &mut self.pool,
                &mut self.scratch,
                &mut req.g_mut(g).blocks,
                skipped(spec) / spec.block_size,
            );
        }
    }

    /// The runs `cache_blocks` would cache now, per group: `(group, start,
    /// end)` for `num_tokens` computed tokens (less `reprefillable`) and
    /// `num_hashes` request hashes. Groups with nothing to cache are left out.
    #[must_use]
    pub fn cache_plan(
        &self,
        rid: &str,
        num_tokens: usize,
        num_hashes: usize,
        reprefillable: usize,
    ) -> CachePlan {
        let mut out = CachePlan::new();
        if !self.enable_caching {
            return out;
        }
        let Some(req) = self.reqs.get(rid) else { return out };
        let hashed = num_hashes.saturating_mul(self.layout.hash_block_size());
        for (g, c) in self.consts.iter().enumerate() {
            if !c.cacheable {
                continue;
            }
            let nt = coordinator::cacheable_tokens(&self.layout, g, num_tokens, reprefillable);
            let gr = req.g(g);
            let start = gr.num_cached.unwrap_or(0);
            let full = c.blocks(nt.min(hashed)).min(gr.blocks.len());
            if start < full {
                out.push((g, start, full));
            }
        }
        out
    }

    /// The range of request hash indices `plan` reads: `(first, end)`.
    #[must_use]
    pub fn plan_hash_range(&self, plan: &[(usize, usize, usize)]) -> (usize, usize) {
        let hbs = self.layout.hash_block_size();
        let mut lo = usize::MAX;
        let mut hi = 0;
        for &(g, start, end) in plan {
            // A group that is not prefix-cacheable may have a block size under the hash
            // block size: its runs are refused by `cache_apply`, not read here.
            let scale = (self.layout.groups().get(g).map_or(hbs, |s| s.block_size) / hbs).max(1);
            lo = lo.min(coarse_hash_index(start, scale));
            hi = hi.max(coarse_hash_index(end.saturating_sub(1), scale) + 1);
        }
        if lo == usize::MAX {
            (0, 0)
        } else {
            (lo, hi)
        }
    }

    /// Caches the runs of `plan` (from [`Self::cache_plan`]) with request
    /// hashes `hashes`, which start at request hash index `first`; sets
    /// each group's cached count to its run's end. Returns the runs.
    ///
    /// # Errors
    /// `UnknownRequest` / `InvalidArgument` when the plan or the hashes do
    /// not fit the request (nothing changed).
    pub fn cache_apply(
        &mut self,
        rid: &str,
        plan: &[(usize, usize, usize)],
        first: usize,
        hashes: &[BlockHash],
    ) -> KvResult<Vec<CachedRun>> {
        let Some(req) = self.reqs.get(rid) else {
            return Err(KvError::new(ErrorKind::UnknownRequest, format!("unknown request {rid:?}")));
        };
        let (lo, hi) = self.plan_hash_range(plan);
        for &(g, start, end) in plan {
            if !self.layout.prefix_cacheable(g) || start >= end || end > req.g(g).blocks.len() {
                return Err(KvError::invalid(format!(
                    "cache run ({g}, {start}, {end}) does not fit the request"
                )));
            }
        }
        if !plan.is_empty() && (lo < first || hi > first + hashes.len()) {
            return Err(KvError::invalid("the hashes given do not cover the cache runs"));
        }
        let alignment = self.layout.scheduler_block_size();
        let dense = self.retention.interval.is_none();
        let mut runs = Vec::with_capacity(plan.len());
        for &(g, start, end) in plan {
            let c = self.consts[g];
            let (spec, eagle, scale) = (c.spec, c.eagle, c.scale);
            let mut stored = Stored::default();
            let mark = self.removed.len();
            let blocks = &req.g(g).blocks;
            for i in start..end {
                let b = blocks[i];
                if b == BlockId::NULL
                    || !(dense && c.caches_all || self.caches_block_at(g, i, alignment, eagle))
                {
                    continue;
                }
                if self.pool.is_cached(b) {
                    // A partial hash (a prompt tail) is promoted: every key of the
                    // block goes first. A full one stays.
                    if self.hash_tokens[b.idx()] as usize >= (i + 1) * spec.block_size {
                        continue;
                    }
                    partial::hash_drop!(self).drop_all(b);
                }
                let h = hashes[coarse_hash_index(i, scale) - first];
                let first = self.pool.cache_block(b, group_key(&h, g));
                #[allow(clippy::cast_possible_truncation)]
                let t = ((i + 1) * spec.block_size).min(u32::MAX as usize) as u32;
                self.hash_tokens[b.idx()] = t;
                self.owner[b.idx()] = owner_word(g, h.as_bytes().len());
                self.siblings.cached(&self.pool, &h, g, b, first);
                stored.push(i);
            }
            let removed = if self.log_removed { (mark, self.removed.len()) } else { (0, 0) };
            runs.push(CachedRun { group: g, start, end, stored, block_size: spec.block_size, removed });
        }
        // The cached counts after every run's caching (nothing above reads them):
        // one request lookup for all groups.
        if let Some(r) = self.reqs.get_mut(rid) {
            for &(g, _, end) in plan {
                let gr = r.g_mut(g);
                gr.num_cached = Some(end.max(gr.num_cached.unwrap_or(0)));
            }
        }
        for &(g, start, end) in plan {
            if self.mamba.is_align(g) {
                self.mamba_note_cached(rid, g, start, end);
            }
        }
        Ok(runs)
    }

    /// The first cached block of group `g` under vLLM hash `h`.
    #[must_use]
    pub fn cached_block_of(&self, h: &BlockHash, g: usize) -> Option<BlockId> {
        let key = group_key(h, g);
        self.partial.resolve(&key, self.pool.get_cached(&key))
    }

    /// Checks the module header's invariants (and the pool's). O(blocks + tables).
    ///
    /// # Errors
    /// The first violation found.
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        self.pool.check_invariants()?;
        let mut refs: FxHashMap<u32, (usize, u32)> = FxHashMap::default();
        for r in self.reqs.values() {
            for g in 0..self.layout.len() {
                for &b in &r.g(g).blocks {
                    if b == BlockId::NULL {
                        continue;
                    }
                    ensure_inv!(b.idx() < self.pool.num_blocks(), "table holds block {} out of range", b.0);
                    #[allow(clippy::cast_possible_truncation)]
                    let e = refs.entry(b.0).or_insert((g, 0));
                    ensure_inv!(e.0 == g, "block {} is in the tables of groups {} and {g}", b.0, e.0);
                    e.1 += 1;
                }
            }
        }
        for (&b, &(_, n)) in &refs {
            let rc = self.pool.ref_count(BlockId(b));
            ensure_inv!(n <= rc, "block {b} is in {n} tables but has ref count {rc}");
        }
        for i in 1..self.pool.num_blocks() {
            #[allow(clippy::cast_possible_truncation)]
            let b = BlockId(i as u32);
            if let Some(k) = self.pool.block_hash(b) {
                let g = self.block_group(b);
                ensure_inv!(g < self.layout.len(), "block {i} cached for unknown group {g}");
                ensure_inv!(
                    self.layout.prefix_cacheable(g),
                    "block {i} cached for group {g}, not prefix-cacheable"
                );
                ensure_inv!(self.pool.get_cached(&k).is_some(), "block {i}'s key is not in the index");
            }
        }
        self.siblings.check(&self.pool, &self.owner)?;
        self.partial.check(&self.pool)?;
        self.check_cow_invariants()?;
        self.check_mamba_invariants()
    }
}
