//! vLLM 0.33's `KVCacheManager` (its coordinator and single-type managers)
//! over the same [`BlockPool`] the hash-chain cache uses: the calls vLLM's
//! scheduler makes on its manager, with the block hashes vLLM computed for
//! each request (`request.block_hashes`) instead of hashing tokens here.
//!
//! The Python drop-in (`kvindex.integrations.vllm.KVCacheManager`) maps each
//! scheduler call to one call below; every decision (hits, how many blocks,
//! which blocks, evictions, ref counts, the free-queue order) is made here.
//!
//! A manager holds one or more KV cache groups ([`GroupLayout`]); all share
//! the pool, as in vLLM. The one-group calls in this file are the fast path
//! of a single full-attention group; [`groups`] holds the calls over any
//! number of groups (one request layer: a group's kind only changes which
//! [`GroupRule`](crate::core::groups::rule::GroupRule) answers).
//!
//! Per request and group the manager keeps vLLM's `req_to_blocks` table and
//! its `num_cached_block` count (present once the request adopted a hit or
//! cached a block, exactly when vLLM's dict has it). Every entry point
//! validates before it changes anything; none panics on caller input.
//!
//! # Keys
//! vLLM keys its cache by `hash ++ group_id` (`BlockHashWithGroupId`).
//! Group 0's key is the hash itself (so a one-group cache is unchanged);
//! group `g > 0`'s key is the hash zero-padded to 32 bytes (its length in
//! the last byte when shorter) XORed with a 32-byte pseudo-random mask of
//! `g`. The two keyings agree unless two hashes differ by exactly two
//! groups' masks (no structured or random hashes do). Each cached block
//! records its group and hash length, which recover vLLM's hash for events.
//!
//! # Costs
//! Per block O(1) as in the pool; per request one table per group (the
//! first two inline: no allocation beyond the tables on one or two groups;
//! a new request's tables are sized for its first call). Two groups or
//! more keep sibling rows (4 bytes per block and group, [`siblings`]), so a
//! lookup probes the pool once per block, not once per group and block.

use rustc_hash::FxHashMap;

use crate::core::block_pool::BlockPool;
use crate::core::error::{ErrorKind, KvError, KvResult};
use crate::core::groups::spec::GroupLayout;
use crate::core::ids::{BlockHash, BlockId};

mod cow;
mod decode;
pub mod groups;
mod loose;
mod mamba;
mod mamba_checkpoint;
pub mod metrics;
mod partial;
mod pool_lookup;
pub mod retention;
mod runs;
mod siblings;
mod table_ops;
mod zeroing;

/// One group's table of one request.
#[derive(Clone, Debug, Default)]
pub(crate) struct GroupReq {
    pub(crate) blocks: Vec<BlockId>,
    /// vLLM's `num_cached_block[request_id]` (None: no entry).
    pub(crate) num_cached: Option<usize>,
}

/// One request's tables: groups 0 and 1 inline (two groups need no
/// allocation beyond the tables), the others in `rest`.
#[derive(Clone, Debug, Default)]
pub(crate) struct Req {
    first: GroupReq,
    /// Group 1 (None on one group).
    second: Option<GroupReq>,
    /// Groups 2 and up.
    rest: Vec<GroupReq>,
}

impl Req {
    fn with_groups(n: usize) -> Self {
        Req {
            first: GroupReq::default(),
            second: (n > 1).then(GroupReq::default),
            rest: vec![GroupReq::default(); n.saturating_sub(2)],
        }
    }

    pub(crate) fn g(&self, i: usize) -> &GroupReq {
        match i {
            0 => &self.first,
            1 => self.second.as_ref().expect("a request has a table per group"),
            _ => &self.rest[i - 2],
        }
    }

    pub(crate) fn g_mut(&mut self, i: usize) -> &mut GroupReq {
        match i {
            0 => &mut self.first,
            1 => self.second.as_mut().expect("a request has a table per group"),
            _ => &mut self.rest[i - 2],
        }
    }

    /// Whether any group has a cached count (vLLM: the request is running).
    pub(crate) fn running(&self) -> bool {
        self.first.num_cached.is_some()
            || self.second.as_ref().is_some_and(|g| g.num_cached.is_some())
            || self.rest.iter().any(|g| g.num_cached.is_some())
    }

    /// Whether every group has a cached count.
    pub(crate) fn all_running(&self) -> bool {
        self.first.num_cached.is_some()
            && self.second.as_ref().is_none_or(|g| g.num_cached.is_some())
            && self.rest.iter().all(|g| g.num_cached.is_some())
    }

    pub(crate) fn into_groups(self) -> impl Iterator<Item = GroupReq> {
        std::iter::once(self.first).chain(self.second).chain(self.rest)
    }
}

/// The sizes `allocate_slots` checks and allocates for (see
/// [`VllmManager::allocate_slots`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct SlotRequest {
    /// Tokens the request's table must hold slots for after the call.
    pub num_tokens_need_slot: usize,
    /// Local computed tokens (computed so far plus the new hit).
    pub num_local_computed: usize,
    /// Tokens computed elsewhere (a KV connector) beyond the local ones.
    pub num_external_computed: usize,
    /// `Some(n)`: the whole sequence of `n` tokens must fit in the free blocks.
    pub full_sequence_tokens: Option<usize>,
    /// Free blocks that must stay free.
    pub reserved_blocks: usize,
    /// Free blocks the admission gate counts as used.
    pub watermark_blocks: usize,
    /// Whether the hit blocks / external tokens are adopted by this call.
    pub adopt: bool,
    /// Groups: computed tokens the full-sequence gate counts (vLLM's
    /// `total_computed_tokens`, capped at `max_model_len`); None: local plus
    /// external.
    pub full_sequence_computed: Option<usize>,
    /// Groups: `Some(n)` runs `remove_skipped_blocks(n)` after the gate, before
    /// the free-block check (vLLM: `total_computed - num_in_flight`).
    pub processed_tokens: Option<usize>,
    /// Groups: bit `g` set: group `g`'s external-token blocks are not logged
    /// as new (vLLM's `skip_zeroing_group_ids`).
    pub skip_zeroing: u64,
    /// Groups: vLLM's `num_tokens_main_model` (computed plus new tokens,
    /// without lookahead), what align-mode Mamba groups allocate for; None:
    /// `num_tokens_need_slot`.
    pub num_tokens_main_model: Option<usize>,
    /// Groups: the encoder tokens cross-attention groups hold slots for
    /// (vLLM's `num_encoder_tokens`: nonzero on the step that schedules the
    /// request's encoder inputs).
    pub num_encoder_tokens: usize,
}

impl SlotRequest {
    /// The tokens a group holds slots for after the call: the encoder tokens
    /// for a cross-attention group (`cross`), `num_tokens_need_slot` otherwise.
    #[must_use]
    pub(crate) fn slot_tokens(&self, cross: bool) -> usize {
        if cross {
            self.num_encoder_tokens
        } else {
            self.num_tokens_need_slot
        }
    }
}

/// vLLM's manager state over a block pool.
#[derive(Clone, Debug)]
pub struct VllmManager {
    pool: BlockPool,
    block_size: usize,
    enable_caching: bool,
    layout: GroupLayout,
    /// Per group: the admission cap in blocks (sliding window, chunked local).
    caps: Vec<Option<usize>>,
    /// Per group: the constants a step reads ([`decode::GroupConst`]).
    consts: Vec<decode::GroupConst>,
    /// Per request id (hashbrown's map: a lookup by `&str` that inserts copies the id only then).
    reqs: decode::ReqMap,
    /// Per block: tokens its cached hash covers (0: no hash).
    hash_tokens: Vec<u32>,
    /// Per block: the group its cached hash belongs to and the hash's length.
    owner: Vec<u32>,
    /// Keys dropped since the last drain, in order, with their owner word (kept when `log_removed`).
    removed: Vec<(BlockHash, u32)>,
    log_removed: bool,
    /// Newly allocated block ids since the last drain, per group (kept when `log_new`).
    new_ids: Vec<Vec<BlockId>>,
    log_new: bool,
    /// Bit `g`: group `g` logs its new blocks when `log_new` ([`zeroing`]).
    zero_mask: u64,
    /// Sparse caching of sliding-window groups ([`retention`]).
    retention: retention::Retention,
    scratch: Vec<BlockId>,
    /// Every group's block per anchor block, on two groups or more ([`siblings`]).
    siblings: siblings::Siblings,
    /// Align-mode Mamba groups' bookkeeping.
    mamba: mamba::MambaState,
    /// Partial-block prefix entries of full-attention groups ([`partial`]).
    partial: partial::PartialEntries,
    /// Copy-on-write of partly reused blocks under partial hash hits ([`cow`]).
    cow: cow::CowState,
    /// Whether a group is a circular buffer (the one-lookup step paths serve none).
    has_ring: bool,
    /// The metrics hooks' log, when a KV cache metrics collector listens ([`metrics`]).
    metrics: Option<Vec<u32>>,
}

fn cdiv(a: usize, b: usize) -> usize {
    a.div_ceil(b)
}

/// The masks of the first 64 groups' keys, computed at compile time.
static MASKS: [[u8; 32]; 64] = {
    let mut out = [[0u8; 32]; 64];
    let mut g = 0;
    while g < 64 {
        out[g] = make_mask(g);
        g += 1;
    }
    out
};

/// The 32-byte mask of group `g`'s keys.
fn group_mask(g: usize) -> [u8; 32] {
    if g < 64 {
        MASKS[g]
    } else {
        make_mask(g)
    }
}

/// Group `g`'s mask: four splitmix64 outputs seeded by `g`.
const fn make_mask(g: usize) -> [u8; 32] {
    let mut x = g as u64;
    let mut out = [0u8; 32];
    let mut c = 0;
    while c < 4 {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        let w = (z ^ (z >> 31)).to_be_bytes();
        let mut k = 0;
        while k < 8 {
            out[c * 8 + k] = w[k];
            k += 1;
        }
        c += 1;
    }
    out
}

/// Group `g`'s pool key for vLLM hash `h` (module header, Keys).
#[must_use]
pub fn group_key(h: &BlockHash, g: usize) -> BlockHash {
    if g == 0 {
        return *h;
    }
    let p = h.padded_bytes();
    let mask = group_mask(g);
    let mut bytes = [0u8; 32];
    // Eight bytes at a time (a digest shorter than 32 bytes is zero-padded).
    for i in (0..32).step_by(8) {
        let word = |b: &[u8]| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_ne_bytes(w)
        };
        bytes[i..i + 8].copy_from_slice(&(word(p) ^ word(&mask)).to_ne_bytes());
    }
    let len = h.as_bytes().len();
    if len < 32 {
        // The length goes in the last (zero) byte before the mask.
        #[allow(clippy::cast_possible_truncation)]
        let l = len as u8;
        bytes[31] ^= l;
    }
    BlockHash::from_digest(&bytes)
}

/// vLLM's hash back from group `g`'s key of a `len`-byte digest.
#[must_use]
pub fn group_unkey(k: &BlockHash, g: usize, len: usize) -> BlockHash {
    if g == 0 {
        return *k;
    }
    let mut bytes = [0u8; 32];
    bytes[..k.as_bytes().len()].copy_from_slice(k.as_bytes());
    for (b, m) in bytes.iter_mut().zip(group_mask(g)) {
        *b ^= m;
    }
    BlockHash::from_digest(&bytes[..len.min(32)])
}

/// A block's owner word: its group (low 16 bits) and its digest length (bits 16..24).
fn owner_word(g: usize, len: usize) -> u32 {
    #[allow(clippy::cast_possible_truncation)]
    let w = (g as u32 & 0xffff) | ((len as u32 & 0xff) << 16);
    w
}

/// vLLM's hash and group of a logged `(key, owner word)`.
fn unkey_owned(k: &BlockHash, w: u32) -> (BlockHash, usize) {
    let g = (w & 0xffff) as usize;
    (group_unkey(k, g, ((w >> 16) & 0xff) as usize), g)
}

impl VllmManager {
    /// A manager over `num_blocks` blocks (block 0 is the null block).
    ///
    /// # Errors
    /// `InvalidArgument` for `num_blocks < 2` or `block_size == 0`;
    /// `Capacity` if the tables cannot be allocated.
    pub fn new(
        num_blocks: usize,
        block_size: usize,
        enable_caching: bool,
        log_removed: bool,
        log_new: bool,
    ) -> KvResult<Self> {
        if block_size == 0 {
            return Err(KvError::invalid("block_size must be positive".to_owned()));
        }
        let layout = GroupLayout::single_full(block_size, enable_caching)?;
        Self::with_layout(num_blocks, layout, log_removed, log_new, None)
    }

    /// A manager over `num_blocks` blocks for the groups of `layout`;
    /// `admission` = `(max_in_flight_tokens, max_model_len)` turns on vLLM's
    /// admission cap of sliding-window and chunked-local groups in the
    /// full-sequence gate.
    ///
    /// # Errors
    /// `InvalidArgument` for `num_blocks < 2` or a group kind the manager
    /// does not implement (named); `Capacity` if the tables cannot be allocated.
    pub fn with_layout(
        num_blocks: usize,
        layout: GroupLayout,
        log_removed: bool,
        log_new: bool,
        admission: Option<(usize, usize)>,
    ) -> KvResult<Self> {
        groups::check_supported(&layout)?;
        let pool = BlockPool::new(num_blocks, false)?;
        let caps = layout
            .groups()
            .iter()
            .map(|g| {
                use crate::core::groups::rule::GroupRule;
                admission.and_then(|(f, m)| g.admission_cap(f, m))
            })
            .collect();
        let hash_tokens = crate::core::error::try_filled(num_blocks, 0u32, "block records")?;
        let owner = crate::core::error::try_filled(num_blocks, 0u32, "block records")?;
        let mamba = mamba::MambaState::new(&layout);
        let siblings = siblings::Siblings::new(&layout, num_blocks)?;
        let partial = partial::PartialEntries::new(&layout);
        let cow = cow::CowState::new(&layout);
        let layout_has_ring =
            layout.groups().iter().any(|g| g.kind == crate::core::groups::spec::GroupKind::CircularBuffer);
        Ok(VllmManager {
            pool,
            block_size: layout.scheduler_block_size(),
            enable_caching: layout.enable_caching(),
            new_ids: vec![Vec::new(); layout.len()],
            caps,
            consts: decode::GroupConst::of(&layout),
            layout,
            reqs: hashbrown::HashMap::default(),
            hash_tokens,
            owner,
            removed: Vec::new(),
            log_removed,
            log_new,
            zero_mask: u64::MAX,
            retention: retention::Retention::default(),
            scratch: Vec::new(),
            siblings,
            mamba,
            partial,
            cow,
            has_ring: layout_has_ring,
            metrics: None,
        })
    }

    /// The group layout.
    #[must_use]
    pub fn layout(&self) -> &GroupLayout {
        &self.layout
    }

    /// The group whose hash block `b` is cached under (0 if none).
    #[must_use]
    pub fn block_group(&self, b: BlockId) -> usize {
        self.owner.get(b.idx()).map_or(0, |&w| (w & 0xffff) as usize)
    }

    /// vLLM's hash of block `b` (its key without the group), if cached.
    #[must_use]
    pub fn vllm_hash(&self, b: BlockId) -> Option<BlockHash> {
        self.pool.block_hash(b).map(|k| unkey_owned(&k, self.owner[b.idx()]).0)
    }

    /// The block pool (read-only).
    #[must_use]
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// Tokens per block.
    #[must_use]
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Tokens block `b`'s hash covers (vLLM's `block_hash_num_tokens`), 0 if none.
    #[must_use]
    pub fn hash_tokens(&self, b: BlockId) -> usize {
        self.hash_tokens.get(b.idx()).map_or(0, |&t| t as usize)
    }

    /// Checks a block id is in range.
    ///
    /// # Errors
    /// `InvalidArgument` when it is not.
    pub fn check_block(&self, id: i64) -> KvResult<BlockId> {
        if id < 0 || id >= self.pool.num_blocks() as i64 {
            return Err(KvError::invalid(format!(
                "block id {id} out of range 0..{}",
                self.pool.num_blocks()
            )));
        }
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        Ok(BlockId(id as u32))
    }

    /// Longest run of cached blocks for `hashes` (at most `max_blocks`), the
    /// last one dropped when `drop_last` (EAGLE). No side effects.
    #[must_use]
    pub fn find_hit(&self, hashes: &[BlockHash], max_blocks: usize, drop_last: bool) -> Vec<BlockId> {
        let mut out = Vec::new();
        if !self.enable_caching {
            return out;
        }
        let k = hashes.len().min(max_blocks);
        self.pool.lookup_run(&hashes[..k], &mut out);
        if drop_last {
            out.pop();
        }
        out
    }

    /// Whether the request has a table (vLLM's `req_to_blocks` entry).
    #[must_use]
    pub fn has_request(&self, rid: &str) -> bool {
        self.reqs.contains_key(rid)
    }

    /// Ids of the requests holding a table, and of those with a cached count.
    #[must_use]
    pub fn request_ids(&self, cached_only: bool) -> Vec<&str> {
        self.reqs.iter().filter(|(_, r)| !cached_only || r.running()).map(|(k, _)| k.as_str()).collect()
    }

    /// Group 0's `(table length, num_cached_block entry)` of the request, in
    /// one lookup, or None when it holds no table.
    #[must_use]
    pub fn table_state(&self, rid: &str) -> Option<(usize, Option<usize>)> {
        self.reqs.get(rid).map(|r| (r.first.blocks.len(), r.first.num_cached))
    }

    /// vLLM's `num_cached_block` entry of the request.
    #[must_use]
    pub fn num_cached(&self, rid: &str) -> Option<usize> {
        self.reqs.get(rid).and_then(|r| r.first.num_cached)
    }

    /// The request's block table (empty if unknown).
    #[must_use]
    pub fn blocks(&self, rid: &str) -> &[BlockId] {
        self.reqs.get(rid).map_or(&[], |r| r.first.blocks.as_slice())
    }

    /// vLLM's `get_num_blocks_to_allocate` for one full-attention group.
    #[must_use]
    pub fn num_blocks_to_allocate(&self, rid: &str, num_tokens: usize, new_computed: &[BlockId]) -> usize {
        let required = cdiv(num_tokens, self.block_size);
        let (held, running) =
            self.reqs.get(rid).map_or((0, false), |r| (r.first.blocks.len(), r.first.num_cached.is_some()));
        if running {
            return required.saturating_sub(held);
        }
        let evictable = new_computed.iter().filter(|&&b| self.pool.is_free(b)).count();
        required.saturating_sub(new_computed.len() + held) + evictable
    }

    /// Validates hit block ids: in range, not null, cached (a hit).
    fn check_hit(&self, new_computed: &[BlockId]) -> KvResult<()> {
        for &b in new_computed {
            if b == BlockId::NULL || b.idx() >= self.pool.num_blocks() {
                return Err(KvError::invalid(format!("block {} is not a cache hit", b.0)));
            }
            if self.pool.block_hash(b).is_none() {
                return Err(KvError::invalid(format!("block {} is not cached: not a cache hit", b.0)));
            }
        }
        Ok(())
    }

    /// vLLM's `allocate_slots` up to (excluding) caching: the full-sequence
    /// gate, the free-block check, adopting the hit blocks and external
    /// tokens, then new blocks up to `num_tokens_need_slot`. Returns the new
    /// blocks, or `None` with nothing changed.
    ///
    /// # Errors
    /// `InvalidArgument` for hit blocks that are not cached, or a hit for a
    /// request that already adopted one (nothing changed).
    pub fn allocate_slots(
        &mut self,
        rid: &str,
        new_computed: &[BlockId],
        s: &SlotRequest,
    ) -> KvResult<Option<Vec<BlockId>>> {
        self.check_hit(new_computed)?;
        let running = self.num_cached(rid).is_some();
        if running && !new_computed.is_empty() {
            return Err(KvError::invalid(format!(
                "request {rid:?} is running: it cannot adopt new prefix-cache hits"
            )));
        }
        if !self.enable_caching && !new_computed.is_empty() {
            return Err(KvError::invalid("prefix caching is off: there are no hit blocks".to_owned()));
        }
        let free = self.pool.num_free();
        if let Some(full) = s.full_sequence_tokens {
            if self.num_blocks_to_allocate(rid, full, new_computed) + s.watermark_blocks > free {
                return Ok(None);
            }
        }
        let need = self.num_blocks_to_allocate(rid, s.num_tokens_need_slot, new_computed);
        if need + s.watermark_blocks + s.reserved_blocks > free {
            return Ok(None);
        }
        let log_new = self.log_new;
        if s.adopt && !running {
            self.pool.touch(new_computed);
            let req = &mut self.reqs.entry_ref(rid).or_default().first;
            req.blocks.extend_from_slice(new_computed);
            req.num_cached = Some(req.blocks.len());
            if s.num_external_computed > 0 {
                let total = s.num_local_computed + s.num_external_computed;
                let n = cdiv(total, self.block_size).saturating_sub(self.blocks(rid).len());
                self.take_new(rid, 0, n, log_new);
            }
        }
        let new = self.take_upto(rid, 0, cdiv(s.num_tokens_need_slot, self.block_size), log_new);
        Ok(Some(new))
    }

    /// Pops `n` blocks for group `g` of `rid` (the caller checked they are free).
    fn take_new(&mut self, rid: &str, g: usize, n: usize, log_new: bool) -> Vec<BlockId> {
        self.take_blocks(rid, g, |_| n, log_new)
    }

    /// Pops the blocks group `g` of `rid` lacks to hold `want` (the caller
    /// checked they are free): one request lookup.
    fn take_upto(&mut self, rid: &str, g: usize, want: usize, log_new: bool) -> Vec<BlockId> {
        self.take_blocks(rid, g, |held| want.saturating_sub(held), log_new)
    }

    /// Pops `count(held)` blocks for group `g` of `rid`, `held` its table's length.
    fn take_blocks(
        &mut self,
        rid: &str,
        g: usize,
        count: impl FnOnce(usize) -> usize,
        log_new: bool,
    ) -> Vec<BlockId> {
        let ng = self.layout.len();
        let (reqs, _, mut taker) = self.split_for_taking();
        let req = reqs.entry_ref(rid).or_insert_with(|| Req::with_groups(ng));
        let n = count(req.g(g).blocks.len());
        if n == 0 {
            return Vec::new();
        }
        taker.take(&mut req.g_mut(g).blocks, g, n, log_new)
    }

    /// The blocks `cache_blocks` would cache now: `(num_cached, num_full)` for
    /// `num_tokens` cacheable tokens and `num_hashes` known hashes; `None` when
    /// there is nothing to cache.
    #[must_use]
    pub fn cache_range(&self, rid: &str, num_tokens: usize, num_hashes: usize) -> Option<(usize, usize)> {
        if !self.enable_caching {
            return None;
        }
        let req = self.reqs.get(rid);
        let start = req.and_then(|r| r.first.num_cached).unwrap_or(0);
        let held = req.map_or(0, |r| r.first.blocks.len());
        let full = (num_tokens / self.block_size).min(num_hashes).min(held);
        (start < full).then_some((start, full))
    }

    /// Caches blocks `start..start + hashes.len()` of the request under
    /// `hashes` (from [`Self::cache_range`]); a block already hashed keeps
    /// its hash. Sets the request's cached count to the run's end.
    ///
    /// # Errors
    /// `UnknownRequest` / `InvalidArgument` when the run is not the request's.
    pub fn cache_run(&mut self, rid: &str, start: usize, hashes: &[BlockHash]) -> KvResult<()> {
        let Some(req) = self.reqs.get_mut(rid).map(|r| &mut r.first) else {
            return Err(KvError::new(ErrorKind::UnknownRequest, format!("unknown request {rid:?}")));
        };
        let end = start + hashes.len();
        if end > req.blocks.len() {
            return Err(KvError::invalid(format!(
                "request {rid:?} holds {} blocks, cannot cache blocks up to {end}",
                req.blocks.len()
            )));
        }
        for (i, h) in hashes.iter().enumerate() {
            let b = req.blocks[start + i];
            if b == BlockId::NULL || self.pool.block_hash(b).is_some() {
                continue;
            }
            let first = self.pool.cache_block(b, *h);
            #[allow(clippy::cast_possible_truncation)]
            let t = ((start + i + 1) * self.block_size).min(u32::MAX as usize) as u32;
            self.hash_tokens[b.idx()] = t;
            // The owner word is written only for the sibling rows (two groups or
            // more): on one group the group is 0, whatever a stale word holds
            // (group bits 0, its length unread for group 0).
            if self.siblings.anchor().is_some() {
                self.owner[b.idx()] = owner_word(0, h.as_bytes().len());
                self.siblings.cached(&self.pool, h, 0, b, first);
            }
        }
        req.num_cached = Some(end.max(req.num_cached.unwrap_or(0)));
        Ok(())
    }

    /// Pops the request's tables without freeing them (vLLM's
    /// `pop_blocks_for_free`): each group's table without its leading null
    /// blocks, in group order.
    pub fn pop_blocks(&mut self, rid: &str) -> Vec<BlockId> {
        self.mamba.forget(rid);
        self.cow.forget(rid);
        let Some(r) = self.reqs.remove(rid) else { return Vec::new() };
        if r.second.is_none() {
            let mut b = r.first.blocks;
            let lead = b.iter().take_while(|&&x| x == BlockId::NULL).count();
            b.drain(..lead);
            return b;
        }
        let mut out = Vec::new();
        for g in r.into_groups() {
            out.extend(g.blocks.iter().skip_while(|&&x| x == BlockId::NULL));
        }
        out
    }

    /// Frees the request's blocks, each group's table in reverse order, group
    /// 0 first (vLLM's coordinator `free`).
    pub fn free(&mut self, rid: &str) {
        self.mamba.forget(rid);
        self.cow.forget(rid);
        let Some(r) = self.reqs.remove(rid) else { return };
        let mut scratch = std::mem::take(&mut self.scratch);
        for g in r.into_groups() {
            self.pool.free(g.blocks.iter().rev().copied(), &mut scratch);
        }
        self.scratch = scratch;
    }

    /// Releases one reference on each block, in the given order (vLLM's
    /// `BlockPool.free_blocks`); null blocks are skipped.
    ///
    /// # Errors
    /// `InvalidArgument` if a block is out of range or would drop below a
    /// reference count of 0 (nothing changed).
    pub fn free_blocks(&mut self, ordered: &[BlockId]) -> KvResult<()> {
        let mut seen: FxHashMap<u32, u32> = FxHashMap::default();
        for &b in ordered {
            if b == BlockId::NULL {
                continue;
            }
            if b.idx() >= self.pool.num_blocks() {
                return Err(KvError::invalid(format!("block id {} out of range", b.0)));
            }
            let c = seen.entry(b.0).or_insert(0);
            *c += 1;
            if *c > self.pool.ref_count(b) {
                return Err(KvError::invalid(format!("block {} is freed more often than it is held", b.0)));
            }
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        self.pool.free(ordered.iter().copied(), &mut scratch);
        self.scratch = scratch;
        Ok(())
    }

    /// Takes one reference on each block (vLLM's `BlockPool.touch`, which KV
    /// connectors call to pin blocks they read); free ones leave the queue.
    /// Null blocks are skipped.
    ///
    /// # Errors
    /// `InvalidArgument` for an id out of range (nothing changed).
    pub fn touch(&mut self, ids: &[i64]) -> KvResult<()> {
        let blocks = ids.iter().map(|&id| self.check_block(id)).collect::<KvResult<Vec<_>>>()?;
        let blocks: Vec<BlockId> = blocks.into_iter().filter(|&b| b != BlockId::NULL).collect();
        self.pool.touch(&blocks);
        Ok(())
    }

    /// Drops the cached hashes of `ids` whether or not a request holds them
    /// (vLLM's `evict_blocks`, for KV a connector failed to load). The null
    /// block and unhashed blocks are skipped. Returns the blocks evicted.
    ///
    /// # Errors
    /// `InvalidArgument` for an id out of range (nothing changed).
    pub fn evict_blocks(&mut self, ids: &[i64]) -> KvResult<usize> {
        let blocks = ids.iter().map(|&id| self.check_block(id)).collect::<KvResult<Vec<_>>>()?;
        let mut n = 0;
        let mut drop = self.hash_drop();
        for b in blocks {
            if b != BlockId::NULL && drop.drop_all(b) {
                n += 1;
            }
        }
        Ok(n)
    }

    /// Drops every cached hash; `false` (nothing changed) while any block is held.
    pub fn reset(&mut self) -> bool {
        if self.pool.reset().is_err() {
            return false;
        }
        self.hash_tokens.iter_mut().for_each(|t| *t = 0);
        self.partial.clear();
        true
    }

    /// Drains vLLM's hashes dropped since the last call, in order.
    pub fn take_removed(&mut self) -> Vec<BlockHash> {
        self.removed.drain(..).map(|(h, w)| unkey_owned(&h, w).0).collect()
    }

    /// Drains vLLM's hashes dropped since the last call with their group, in order.
    pub fn take_removed_groups(&mut self) -> Vec<(BlockHash, usize)> {
        self.removed.drain(..).map(|(h, w)| unkey_owned(&h, w)).collect()
    }

    /// Drains the block ids allocated since the last call, group by group.
    pub fn take_new_ids(&mut self) -> Vec<BlockId> {
        if self.new_ids.len() == 1 {
            return std::mem::take(&mut self.new_ids[0]);
        }
        let mut out = Vec::new();
        for v in &mut self.new_ids {
            out.append(v);
        }
        out
    }

    /// Appends the request's group-0 blocks from table index `start` to the new-id log.
    pub fn record_for_zeroing(&mut self, rid: &str, start: usize) {
        if let Some(r) = self.reqs.get(rid) {
            self.new_ids[0].extend(r.first.blocks.iter().skip(start).copied());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(i: u8) -> BlockHash {
        BlockHash::from_digest(&[i; 8])
    }

    fn slots(n: usize) -> SlotRequest {
        SlotRequest { num_tokens_need_slot: n, adopt: true, ..SlotRequest::default() }
    }

    /// Group keys are the hash XOR splitmix64 masks (pinned: events unkey with them).
    #[test]
    fn group_keys_xor_their_masks_and_unkey() {
        let hex = |m: [u8; 32]| m.iter().map(|b| format!("{b:02x}")).collect::<String>();
        assert_eq!(hex(group_mask(1)), "910a2dec89025cc1beeb8da1658eec67f893a2eefb32555e71c18690ee42c90b");
        assert_eq!(hex(group_mask(70)), "6707e8333343cb0f32dcac7c9e946f08fd39dcb0d39afbbbb7e31f8cdf00907b");
        for len in [8, 16, 32] {
            let d: Vec<u8> = (1..=len).collect();
            let h = BlockHash::from_digest(&d);
            let k = group_key(&h, 3);
            let mut want = [0u8; 32];
            want[..d.len()].copy_from_slice(&d);
            if d.len() < 32 {
                want[31] = len;
            }
            want.iter_mut().zip(group_mask(3)).for_each(|(w, m)| *w ^= m);
            assert_eq!(k.as_bytes(), &want);
            assert_eq!(group_unkey(&k, 3, d.len()), h);
            assert_eq!(group_key(&h, 0), h);
        }
    }

    #[test]
    fn hit_after_cache_and_free() {
        let mut m = VllmManager::new(11, 4, true, true, false).expect("test");
        let new = m.allocate_slots("a", &[], &slots(10)).expect("test").expect("test");
        assert_eq!(new, vec![BlockId(1), BlockId(2), BlockId(3)]);
        let (s, e) = m.cache_range("a", 10, 2).expect("test");
        m.cache_run("a", s, &[h(1), h(2)][s..e]).expect("test");
        assert_eq!(m.hash_tokens(BlockId(2)), 8);
        m.free("a");
        // Unhashed block 3 goes to the head, cached 2 then 1 to the tail.
        let q: Vec<u32> = m.pool().free_queue().map(|b| b.0).collect();
        assert_eq!(&q[..1], &[3]);
        assert_eq!(&q[q.len() - 2..], &[2, 1]);
        let hit = m.find_hit(&[h(1), h(2), h(3)], 2, false);
        assert_eq!(hit, vec![BlockId(1), BlockId(2)]);
        assert_eq!(m.find_hit(&[h(1), h(2)], 2, true), vec![BlockId(1)]);
        let s = SlotRequest { num_tokens_need_slot: 12, num_local_computed: 8, ..slots(12) };
        let new = m.allocate_slots("b", &hit, &s).expect("test").expect("test");
        assert_eq!(new, vec![BlockId(3)]);
        assert_eq!(m.num_cached("b"), Some(2));
        assert_eq!(m.pool().ref_count(BlockId(1)), 1);
    }

    #[test]
    fn refusals_change_nothing_and_errors_are_errors() {
        let mut m = VllmManager::new(4, 4, true, false, false).expect("test");
        assert!(m.allocate_slots("a", &[], &slots(16)).expect("test").is_none());
        assert!(!m.has_request("a"));
        assert!(m.allocate_slots("a", &[BlockId(1)], &slots(4)).is_err());
        assert!(m.free_blocks(&[BlockId(1)]).is_err());
        assert!(m.evict_blocks(&[99]).is_err());
        let s = SlotRequest { reserved_blocks: 2, ..slots(8) };
        assert!(m.allocate_slots("a", &[], &s).expect("test").is_none());
        assert!(m.allocate_slots("a", &[], &slots(12)).expect("test").is_some());
        assert!(!m.reset());
        let blocks = m.pop_blocks("a");
        m.free_blocks(&blocks).expect("test");
        assert!(m.reset());
    }

    #[test]
    fn evict_blocks_in_use_logs_removed_hashes() {
        let mut m = VllmManager::new(6, 2, true, true, true).expect("test");
        m.allocate_slots("a", &[], &slots(4)).expect("test").expect("test");
        m.cache_run("a", 0, &[h(1), h(2)]).expect("test");
        assert_eq!(m.evict_blocks(&[2, 0]).expect("test"), 1);
        assert_eq!(m.take_removed(), vec![h(2)]);
        assert_eq!(m.take_new_ids(), vec![BlockId(1), BlockId(2)]);
        assert_eq!(m.find_hit(&[h(1), h(2)], 9, false), vec![BlockId(1)]);
    }
}

#[cfg(test)]
mod groups_tests;
