//! Request-level prefix cache over chained block hashes, with the semantics of
//! vLLM 0.33's single-group full-attention `KVCacheManager` + `BlockPool`:
//! [`HashChainDesign`], the hash-chain design of the request layer
//! ([`crate::core::request`]), and [`HashChainCache`], the request-level
//! cache over it (the lifecycle itself is the request layer's).
//!
//! # Flow
//! - [`HashChainCache::admit`]: hash the prompt's full blocks, find the
//!   longest run of cached hashes from block 0 (capped at `num_tokens - 1`,
//!   block-aligned: the last prompt token is always recomputed), pin the hit
//!   blocks, allocate the rest from the free-queue head, and register every
//!   full prompt block. All-or-nothing: `None` and no change when blocks run
//!   short (hit blocks sitting in the free queue count as available, as in vLLM).
//! - [`HashChainCache::append`] / [`HashChainCache::append_batch`]: decode
//!   tokens (already computed) extend the request; a block is allocated when
//!   one fills up and every newly full block is registered under its chained
//!   hash, so the next turn of a conversation hits its own generated text.
//! - [`HashChainCache::free`]: release the request's blocks in reverse table
//!   order (tails leave the cache first).
//! - The engine lifecycle (`admit_chunk`, `schedule`, `commit_tokens`, ...,
//!   see [`crate::core::request`]): the same pool operations in vLLM 0.33's
//!   order; a block is cached when the step that schedules its tokens is
//!   (`min(num_computed + num_new, num_tokens)`), so block ids, hits,
//!   free-queue order and cached hashes equal vLLM's for every chunking.
//!
//! # Prefix memo (no re-hashing of cached prefixes)
//! A scheduler sees the same system prompt in thousands of requests; vLLM
//! re-hashes it every time. kvindex's prompt hasher
//! ([`crate::core::memo::PromptHasher`], the block hasher and the memo in
//! one object) keeps, for each cached block without extra
//! keys, a memo entry ([`crate::core::memo`]) holding its parent hash, its
//! tokens and its hash, found by a fingerprint of the token prefix. Hashing a
//! prompt first probes the memo for all its blocks at once and, where the
//! parent hash and tokens compare *exactly* equal, reuses the cached block's
//! hash (which is `H(parent, tokens, None)` by construction) instead of
//! serialising and digesting again; a crafted fingerprint collision cannot
//! produce a wrong hash. Entries leave when their block loses its hash, so the
//! memo never outgrows the cache. A cold probe costs a few overlapped cache
//! misses: less than a SHA-256 block (~150-300 ns with serialisation), about
//! an XXH3 block (~30-40 ns), so the memo is used with the SHA-256 algorithms
//! only.
//!
//! A refused admission (out of blocks) keeps its prompt's hashes, for up to
//! 32 prompts (oldest dropped first), so the scheduler's retry of the same
//! request id and prompt is not hashed again; `reset` releases them.
//!
//! # Invariants (checked by [`HashChainCache::check_invariants`])
//! The request layer's and the pool's (see [`crate::core::block_pool`]), plus:
//! - the design holds no reference: `ref_cnt(b) == number of request tables
//!   holding b` for every block;
//! - for every request, `hashes == chain of the request's known tokens`
//!   (`num_tokens / block_size` entries);
//! - table entries `0..num_cached` (at most the hashed blocks and the table)
//!   are cached under the request's hash for that index; the rest (blocks
//!   of scheduled-but-uncached tokens, lookahead slots) are unhashed;
//! - every memo entry names a cached block whose key is that entry's key and
//!   whose hash is `H(parent, its stored tokens, None)`.
//!
//! # Costs
//! `admit`: O(prompt tokens) hashing + O(blocks) map work. `append`: O(1)
//! per token plus one block hash per `block_size` tokens. `free`: O(blocks).

use std::borrow::Cow;

use crate::core::block_pool::BlockPool;
use crate::core::error::{try_reserve, InvariantViolation, KvError, KvResult};
use crate::core::event_buffer::Events;
use crate::core::events::{EventKey, KvEvent};
use crate::core::hash::{ExtraKey, HashAlgo, KeySpec, Token};
use crate::core::ids::{BlockHash, BlockId, RequestId};
use crate::core::memo::{extend_prefix_keys, PromptHasher};
use crate::core::request::{Admitted, PrefixCache, PrefixDesign, Reads, RecordOf};
use crate::ensure_inv;

pub use crate::core::request::Stats;

/// The hash-chain state of a running request. `repr(C)`: `num_cached`, read
/// when a decode step fills a block, comes first (it follows the record's
/// shared fields in the first cache line); the key spec is boxed to keep
/// the record small.
#[derive(Clone, Debug)]
#[repr(C)]
pub struct ChainState {
    /// Table entries `0..num_cached` are registered in the map.
    num_cached: usize,
    hashes: Vec<BlockHash>,
    spec: Box<KeySpec>,
    /// Memo prefix keys of the full blocks (empty when the memo is off).
    keys: Vec<u64>,
}

/// A checked admission: the prompt, its hashes and its hit blocks.
#[derive(Debug)]
pub struct ChainPlan {
    tokens: Vec<i64>,
    spec: KeySpec,
    hashes: Vec<BlockHash>,
    prefix_keys: Vec<u64>,
    /// The hit blocks (the table's first entries), with room for the rest.
    blocks: Vec<BlockId>,
    /// Hit blocks sitting in the free queue (pinning them consumes them).
    free_hits: usize,
    /// The plan resumes a preempted request (a refusal keeps nothing).
    resume: bool,
    id: RequestId,
}

/// A prompt whose admission ran short of blocks, kept (with its hashes) so the
/// scheduler's retry of the same request id does not hash it again.
#[derive(Clone, Debug)]
struct Pending {
    id: RequestId,
    tokens: Vec<i64>,
    spec: KeySpec,
    hashes: Vec<BlockHash>,
}

/// How many refused prompts keep their hashes (oldest dropped first).
const MAX_PENDING: usize = 32;

/// The hash-chain design: the block pool (hash map, free queue, events)
/// and the prompt hasher (block hasher and prefix memo).
#[derive(Clone, Debug)]
pub struct HashChainDesign {
    pool: BlockPool,
    block_size: usize,
    /// The block hasher and the prefix memo.
    prompt: PromptHasher,
    pending: std::collections::VecDeque<Pending>,
    evictions: u64,
    scratch_hashes: Vec<BlockHash>,
    scratch_keys: Vec<u64>,
    scratch_blocks: Vec<BlockId>,
}

/// The hash-chain prefix cache: the request layer over [`HashChainDesign`].
pub type HashChainCache = PrefixCache<HashChainDesign>;

impl HashChainDesign {
    /// Number of full blocks a lookup may hit for a prompt of `n` tokens.
    fn hit_cap(&self, n: usize) -> usize {
        n.saturating_sub(1) / self.block_size
    }

    /// Refused prompts kept (with their hashes) for the scheduler's retry:
    /// at most 32, oldest dropped first; `reset` releases them.
    #[must_use]
    pub fn num_pending_prompts(&self) -> usize {
        self.pending.len()
    }

    /// Hashes of the full blocks of `tokens` (no memo: a pure function). O(tokens).
    pub fn hash_prompt<T: Token>(&mut self, tokens: &[T], spec: &KeySpec) -> Vec<BlockHash> {
        let mut out = Vec::with_capacity(tokens.len() / self.block_size);
        self.prompt.chain(tokens, spec, &mut out);
        out
    }

    /// Cached blocks of the longest run of `hashes` from block 0, at most `cap`. O(k).
    fn hit_blocks(&self, hashes: &[BlockHash], cap: usize, out: &mut Vec<BlockId>) {
        self.pool.lookup_run(&hashes[..cap.min(hashes.len())], out);
    }

    /// Removes request `id`'s pending entry; returns it if its prompt and keys
    /// equal `tokens` and `spec` (its hashes are then still the prompt's chain).
    fn take_pending<T: Token>(&mut self, id: RequestId, tokens: &[T], spec: &KeySpec) -> Option<Pending> {
        let pos = self.pending.iter().position(|p| p.id == id)?;
        let p = self.pending.remove(pos)?;
        let same = p.tokens.len() == tokens.len()
            && p.tokens.iter().zip(tokens).all(|(a, b)| *a == b.get())
            && p.spec == *spec;
        same.then_some(p)
    }

    /// Drops memo entries of blocks that lost their hash in the pool.
    fn forget_evicted(&mut self) {
        let mut ev = std::mem::take(&mut self.scratch_blocks);
        self.pool.take_evicted(&mut ev);
        self.evictions += ev.len() as u64;
        for &b in &ev {
            self.prompt.forget(b);
        }
        ev.clear();
        self.scratch_blocks = ev;
    }

    fn lookup_tokens<T: Token>(&mut self, tokens: &[T], spec: &KeySpec) -> KvResult<usize> {
        let mut hashes = std::mem::take(&mut self.scratch_hashes);
        let mut keys = std::mem::take(&mut self.scratch_keys);
        let hashed = self.prompt.hash(tokens, spec, &mut hashes, &mut keys);
        if let Err(e) = hashed {
            self.scratch_hashes = hashes;
            self.scratch_keys = keys;
            return Err(e);
        }
        let mut blocks = std::mem::take(&mut self.scratch_blocks);
        blocks.clear();
        self.hit_blocks(&hashes, self.hit_cap(tokens.len()), &mut blocks);
        let k = blocks.len();
        self.scratch_hashes = hashes;
        self.scratch_keys = keys;
        self.scratch_blocks = blocks;
        Ok(k * self.block_size)
    }
}

impl<T: Token> Reads<T> for HashChainDesign {
    #[inline]
    fn extend_tokens(dst: &mut Vec<i64>, src: &[T]) {
        dst.extend(src.iter().map(|t| t.get()));
    }

    #[inline]
    fn check_tokens(tokens: &[T]) -> KvResult<()> {
        T::check_ids(tokens)
    }

    fn lookup(&mut self, tokens: &[T], spec: &KeySpec) -> KvResult<usize> {
        self.lookup_tokens(tokens, spec)
    }

    /// Hashes the prompt (or reuses the hashes a refused admission of the
    /// same id and prompt kept) and finds its hit blocks. Short of blocks
    /// (hit blocks sitting in the free queue count as available, as in vLLM),
    /// the hashes are kept for the retry.
    fn plan_admit(
        &mut self,
        id: RequestId,
        tokens: &[T],
        spec: Cow<'_, KeySpec>,
        skip_reading: bool,
    ) -> KvResult<ChainPlan> {
        let spec = spec.into_owned();
        let bs = self.block_size;
        let n = tokens.len();
        let mut prefix_keys = Vec::new();
        let (owned, hashes) = match self.take_pending(id, tokens, &spec) {
            Some(p) => {
                self.prompt.prefix_keys(tokens, &mut prefix_keys)?;
                (p.tokens, p.hashes)
            }
            None => {
                let mut hashes = Vec::new();
                self.prompt.hash(tokens, &spec, &mut hashes, &mut prefix_keys)?;
                let mut owned = Vec::new();
                try_reserve(&mut owned, n, "a copy of the prompt")?;
                owned.extend(tokens.iter().map(|t| t.get()));
                (owned, hashes)
            }
        };
        let mut blocks: Vec<BlockId> = Vec::new();
        try_reserve(&mut blocks, n.div_ceil(bs) + 1, "the prompt's block table")?;
        if !skip_reading {
            self.hit_blocks(&hashes, self.hit_cap(n), &mut blocks);
        }
        let free_hits = blocks.iter().filter(|&&b| self.pool.is_free(b)).count();
        Ok(ChainPlan { tokens: owned, spec, hashes, prefix_keys, blocks, free_hits, resume: false, id })
    }
}

impl PrefixDesign for HashChainDesign {
    type Tok = i64;
    type Entry = BlockId;
    type Ext = ChainState;
    type Plan = ChainPlan;

    const UNIT: &'static str = "blocks";

    #[inline]
    fn block_size(&self) -> usize {
        self.block_size
    }

    fn num_blocks(&self) -> usize {
        self.pool.num_blocks()
    }

    #[inline]
    fn num_available(&self) -> usize {
        self.pool.num_free()
    }

    fn plan_hit(&self, plan: &ChainPlan) -> usize {
        plan.blocks.len() * self.block_size
    }

    fn available_after(&self, plan: &ChainPlan) -> usize {
        self.pool.num_free() - plan.free_hits
    }

    /// Keeps a new prompt's hashes for the scheduler's retry of the same request.
    fn refuse(&mut self, plan: ChainPlan) {
        if plan.resume {
            return;
        }
        if self.pending.len() == MAX_PENDING {
            self.pending.pop_front();
        }
        let ChainPlan { id, tokens, spec, hashes, .. } = plan;
        self.pending.push_back(Pending { id, tokens, spec, hashes });
    }

    /// The request's hashes are its token chain already: only the hit run is looked up.
    fn plan_resume(&mut self, req: &RecordOf<Self>) -> ChainPlan {
        let st = &req.ext;
        let n = req.tokens.len();
        let mut blocks = Vec::with_capacity(n.div_ceil(self.block_size) + 1);
        if !req.life.skip_reading {
            self.hit_blocks(&st.hashes, self.hit_cap(n), &mut blocks);
        }
        let free_hits = blocks.iter().filter(|&&b| self.pool.is_free(b)).count();
        ChainPlan {
            tokens: req.tokens.clone(),
            spec: (*st.spec).clone(),
            hashes: st.hashes.clone(),
            prefix_keys: st.keys.clone(),
            blocks,
            free_hits,
            resume: true,
            id: req.id,
        }
    }

    /// Pins the hit blocks and allocates `new` blocks from the free-queue head.
    fn commit(&mut self, plan: ChainPlan, new: usize) -> Admitted<i64, BlockId, ChainState> {
        let ChainPlan { tokens, spec, hashes, prefix_keys, mut blocks, .. } = plan;
        let k = blocks.len();
        self.pool.touch(&blocks);
        self.pool.allocate(new, &mut blocks);
        self.forget_evicted();
        let ext = ChainState { num_cached: k, hashes, spec: Box::new(spec), keys: prefix_keys };
        Admitted { tokens, blocks, ext, hit_tokens: k * self.block_size }
    }

    #[inline]
    fn allocate(&mut self, n: usize, table: &mut Vec<BlockId>) {
        self.pool.allocate(n, table);
        // Before the new blocks are memoised under their new keys: forgetting
        // afterwards would drop the new entry and leave the stale one.
        self.forget_evicted();
    }

    /// Registers every newly full block under its chained hash, so the next
    /// turn of a conversation hits its own generated text.
    #[inline]
    fn appended(&mut self, req: &mut RecordOf<Self>, had_full: usize) {
        let bs = self.block_size;
        if req.tokens.len() / bs > had_full {
            let st = &mut req.ext;
            self.prompt.extend(&req.tokens, &st.spec, &mut st.hashes, &mut st.keys);
            let full = st.hashes.len().min(req.blocks.len());
            cache_new_full_blocks(&mut self.pool, &mut self.prompt, bs, &req.tokens, &req.blocks, st, full);
        }
    }

    /// Hashes the full blocks the committed ids complete (vLLM's request
    /// block hasher runs when output ids are appended).
    #[inline]
    fn tokens_added(&mut self, req: &mut RecordOf<Self>) {
        let bs = self.block_size;
        let st = &mut req.ext;
        if req.tokens.len() >= (st.hashes.len() + 1) * bs {
            self.prompt.extend(&req.tokens, &st.spec, &mut st.hashes, &mut st.keys);
        }
    }

    /// Caches table entries `num_cached..min(upto / block_size, hashed, table)`.
    #[inline]
    fn cache_to(&mut self, req: &mut RecordOf<Self>, upto: usize) {
        let bs = self.block_size;
        // Most steps complete no block: no division then.
        if upto < (req.ext.num_cached + 1) * bs {
            return;
        }
        let full = (upto / bs).min(req.ext.hashes.len()).min(req.blocks.len());
        if full > req.ext.num_cached {
            cache_new_full_blocks(
                &mut self.pool,
                &mut self.prompt,
                bs,
                &req.tokens,
                &req.blocks,
                &mut req.ext,
                full,
            );
        }
    }

    /// Releases the blocks in reverse table order (tails leave the cache
    /// first); their hashes stay cached.
    fn release(&mut self, req: &mut RecordOf<Self>, _insert: bool) {
        let mut scratch = std::mem::take(&mut self.scratch_blocks);
        self.pool.free(req.blocks.iter().rev().copied(), &mut scratch);
        self.scratch_blocks = scratch;
        req.blocks.clear();
        req.ext.num_cached = 0;
    }

    fn reset(&mut self) -> KvResult<()> {
        self.pool.reset()?;
        self.prompt.clear();
        // Refused prompts kept for a retry are released too.
        self.pending = std::collections::VecDeque::new();
        Ok(())
    }

    fn events(&self) -> &Events {
        self.pool.events()
    }

    fn events_mut(&mut self) -> &mut Events {
        self.pool.events_mut()
    }

    fn evictions(&self) -> u64 {
        self.evictions
    }

    fn clear_evictions(&mut self) {
        self.evictions = 0;
    }

    #[inline]
    fn ref_count(&self, b: BlockId) -> u32 {
        self.pool.ref_count(b)
    }

    fn holds(&self, _req: &RecordOf<Self>, _i: usize) -> bool {
        false
    }

    fn check_invariants(
        &self,
        reqs: &[&RecordOf<Self>],
        _refs: &mut [u32],
    ) -> Result<(), InvariantViolation> {
        self.pool.check_invariants()?;
        let bs = self.block_size;
        let mut hasher = self.prompt.block_hasher().clone();
        for r in reqs {
            let (id, st) = (r.id, &r.ext);
            ensure_inv!(
                st.num_cached <= st.hashes.len() && st.num_cached <= r.blocks.len(),
                "request {}: {} cached of {} hashed, {} held",
                id.0,
                st.num_cached,
                st.hashes.len(),
                r.blocks.len()
            );
            let mut chain = Vec::new();
            hasher.extend_chain(&r.tokens, bs, &st.spec, &mut chain);
            ensure_inv!(chain == st.hashes, "request {}: stored hashes differ from its token chain", id.0);
            let mut keys = Vec::new();
            if self.prompt.uses_memo() {
                extend_prefix_keys(&r.tokens, bs, &mut keys);
            }
            ensure_inv!(keys == st.keys, "request {}: stored memo keys differ from its tokens", id.0);
            for (i, b) in r.blocks.iter().enumerate() {
                let h = self.pool.block_hash(*b);
                if i < st.num_cached {
                    ensure_inv!(
                        h == Some(st.hashes[i]),
                        "request {} block {i} not cached under its hash",
                        id.0
                    );
                } else {
                    ensure_inv!(h.is_none(), "request {} partial block {i} is hashed", id.0);
                }
            }
        }
        for p in &self.pending {
            let mut chain = Vec::new();
            // A second copy of a huge refused prompt's hashes may not fit in
            // memory: then this prompt's re-hash is skipped (not an abort).
            if chain.try_reserve_exact(p.hashes.len()).is_err() {
                continue;
            }
            hasher.extend_chain(&p.tokens, bs, &p.spec, &mut chain);
            ensure_inv!(chain == p.hashes, "pending request {}: hashes differ from its prompt", p.id.0);
        }
        ensure_inv!(self.pending.len() <= MAX_PENDING, "{} pending prompts", self.pending.len());
        self.prompt.check_memo(|b| self.pool.block_hash(b))?;
        Ok(())
    }
}

impl HashChainCache {
    /// A cache of `num_blocks` blocks (block 0 is the null block) of
    /// `block_size` tokens, hashing with `algo` from the NONE_HASH of `seed`.
    ///
    /// # Errors
    /// `InvalidArgument` for `block_size < 1` or `num_blocks < 2`.
    pub fn new(
        num_blocks: usize,
        block_size: usize,
        algo: HashAlgo,
        seed: Option<&str>,
        enable_events: bool,
    ) -> KvResult<Self> {
        if !(1..=1 << 20).contains(&block_size) {
            return Err(KvError::invalid(format!("block_size must be in 1..=2**20, got {block_size}")));
        }
        let mut pool = BlockPool::new(num_blocks, enable_events)?;
        num_blocks
            .checked_mul(block_size)
            .filter(|&n| n <= isize::MAX as usize / 8)
            .ok_or_else(|| KvError::invalid("num_blocks * block_size is too large"))?;
        pool.log_evictions();
        Ok(PrefixCache::with_design(HashChainDesign {
            pool,
            block_size,
            prompt: PromptHasher::new(algo, seed, num_blocks, block_size)?,
            pending: std::collections::VecDeque::new(),
            evictions: 0,
            scratch_hashes: Vec::new(),
            scratch_keys: Vec::new(),
            scratch_blocks: Vec::new(),
        }))
    }

    /// The pool (read-only introspection).
    #[must_use]
    pub fn pool(&self) -> &BlockPool {
        &self.design().pool
    }

    /// Tokens per block.
    #[must_use]
    pub fn block_size(&self) -> usize {
        self.design().block_size
    }

    /// The hasher's algorithm.
    #[must_use]
    pub fn algo(&self) -> HashAlgo {
        self.design().prompt.block_hasher().algo()
    }

    /// Refused prompts kept for a retry ([`HashChainDesign::num_pending_prompts`]).
    #[must_use]
    pub fn num_pending_prompts(&self) -> usize {
        self.design().num_pending_prompts()
    }

    /// Number of memoised blocks (at most the number of cached blocks).
    #[must_use]
    pub fn memo_len(&self) -> usize {
        self.design().prompt.memo_len()
    }

    /// Hashes of the full blocks of `tokens` (no memo: a pure function). O(tokens).
    pub fn hash_prompt<T: Token>(&mut self, tokens: &[T], spec: &KeySpec) -> Vec<BlockHash> {
        self.design_mut().hash_prompt(tokens, spec)
    }

    /// Drops the cached hashes of idle blocks (they stay free, in place).
    /// Returns how many blocks lost a hash. O(ids).
    ///
    /// # Errors
    /// `InvalidArgument` for a bad id, `BlockInUse` for a block a request holds.
    pub fn evict_blocks(&mut self, ids: &[i64]) -> KvResult<usize> {
        let d = self.design_mut();
        let n = d.pool.evict_blocks(ids)?;
        d.forget_evicted();
        Ok(n)
    }

    /// The chained block hashes of request `id`'s full blocks.
    ///
    /// # Errors
    /// `UnknownRequest`.
    pub fn request_hashes(&self, id: RequestId) -> KvResult<&[BlockHash]> {
        Ok(&self.get(id)?.ext.hashes)
    }
}

fn event_key(k: &ExtraKey<'_>) -> EventKey {
    match *k {
        ExtraKey::Lora(name, _) => EventKey::Str(name.to_owned()),
        ExtraKey::Mm(id, off) => EventKey::Mm(id.to_owned(), off),
        ExtraKey::Salt(s) => EventKey::Str(s.to_owned()),
    }
}

/// Registers table entries `num_cached..full` of a request (`tokens`,
/// table `blocks`, state `req`; `full` at most its hashed blocks and its
/// table) under their hashes, memoises those without extra keys, and emits
/// one `BlockStored` for the run. O(new full blocks).
fn cache_new_full_blocks(
    pool: &mut BlockPool,
    prompt: &mut PromptHasher,
    bs: usize,
    tokens: &[i64],
    blocks: &[BlockId],
    req: &mut ChainState,
    full: usize,
) {
    let start = req.num_cached;
    if start >= full {
        return;
    }
    let mut keys: Vec<ExtraKey<'_>> = Vec::new();
    for i in start..full {
        let b = blocks[i];
        pool.cache_block(b, req.hashes[i]);
        if !req.spec.is_empty() {
            #[allow(clippy::cast_possible_wrap)]
            req.spec.block_keys((i * bs) as i64, bs as i64, &mut keys);
        }
        if keys.is_empty() && prompt.uses_memo() {
            let parent = if i == 0 { None } else { Some(req.hashes[i - 1]) };
            let toks = &tokens[i * bs..(i + 1) * bs];
            prompt.memoise(b, req.keys[i], req.hashes[i], parent, toks);
        }
    }
    req.num_cached = full;
    pool.events_mut().record(|| {
        let extra_keys = (start..full)
            .map(|i| {
                #[allow(clippy::cast_possible_wrap)]
                req.spec.block_keys((i * bs) as i64, bs as i64, &mut keys);
                (!keys.is_empty()).then(|| keys.iter().map(event_key).collect())
            })
            .collect();
        KvEvent::BlockStored {
            block_hashes: req.hashes[start..full].iter().map(BlockHash::low_u64).collect(),
            parent_block_hash: (start > 0).then(|| req.hashes[start - 1].low_u64()),
            token_ids: tokens[start * bs..full * bs].to_vec(),
            block_size: bs,
            lora_name: req.spec.lora.as_ref().map(|(name, _)| name.clone()),
            extra_keys,
        }
    });
}
