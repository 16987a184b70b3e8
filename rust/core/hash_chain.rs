//! Request-level prefix cache over chained block hashes, with the semantics of
//! vLLM 0.33's single-group full-attention `KVCacheManager` + `BlockPool`.
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
//!
//! # Prefix memo (no re-hashing of cached prefixes)
//! A scheduler sees the same system prompt in thousands of requests; vLLM
//! re-hashes it every time. kvindex keeps, for each cached block without extra
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
//! The pool's (see [`crate::core::block_pool`]), plus, for every request:
//! - `ref_cnt(b) == number of request tables holding b` for every block;
//! - `blocks.len() == ceil(num_tokens / block_size)`;
//!   `hashes == chain of the request's tokens` (`num_tokens / block_size` entries);
//! - table entries `0..num_tokens / block_size` are cached under the
//!   request's hash for that index; the last, partial block is unhashed;
//! - every memo entry names a cached block whose key is that entry's key and
//!   whose hash is `H(parent, its stored tokens, None)`.
//!
//! # Costs
//! `admit`: O(prompt tokens) hashing + O(blocks) map work. `append`: O(1)
//! per token plus one block hash per `block_size` tokens. `free`: O(blocks).

use rustc_hash::FxHashMap;

use crate::core::block_pool::BlockPool;
use crate::core::error::{ErrorKind, InvariantViolation, KvError, KvResult};
use crate::core::events::{EventKey, KvEvent};
use crate::core::hash::{BlockHasher, ExtraKey, HashAlgo, KeySpec, Token};
use crate::core::ids::{BlockHash, BlockId, RequestId};
use crate::core::memo::{extend_prefix_keys, Memo};
use crate::core::tables::{batch_ranges, TableSource};
use crate::ensure_inv;

/// A running request's state. `repr(C)` keeps the fields a decode step
/// touches (epoch, tokens, blocks, num_cached) together at the front, in the
/// first cache line; the key spec is boxed to keep the record small.
#[derive(Clone, Debug)]
#[repr(C)]
struct Request {
    /// Batch epoch in which the request was last seen (duplicate detection).
    epoch: u64,
    tokens: Vec<i64>,
    blocks: Vec<BlockId>,
    /// Table entries `0..num_cached` are registered in the map.
    num_cached: usize,
    hashes: Vec<BlockHash>,
    id: RequestId,
    spec: Box<KeySpec>,
    /// Memo prefix keys of the full blocks (empty when the memo is off).
    keys: Vec<u64>,
}

/// Prefix-cache statistics (vLLM `PrefixCacheStats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Requests admitted.
    pub requests: u64,
    /// Prompt tokens of admitted requests.
    pub queries: u64,
    /// Prompt tokens served from the cache.
    pub hits: u64,
    /// Cached blocks that lost their hash (reallocated or `evict_blocks`).
    pub evictions: u64,
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

/// The hash-chain prefix cache.
#[derive(Clone, Debug)]
pub struct HashChainCache {
    pool: BlockPool,
    block_size: usize,
    hasher: BlockHasher,
    /// Request id -> slot in `reqs`.
    index: FxHashMap<RequestId, u32>,
    reqs: Vec<Option<Request>>,
    free_slots: Vec<u32>,
    memo: Memo,
    /// Whether prompt hashing consults the memo (SHA-256 algorithms).
    use_memo: bool,
    pending: std::collections::VecDeque<Pending>,
    stats: Stats,
    epoch: u64,
    scratch_hashes: Vec<BlockHash>,
    scratch_keys: Vec<u64>,
    scratch_cand: Vec<Option<BlockId>>,
    scratch_blocks: Vec<BlockId>,
    scratch_slots: Vec<u32>,
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
            return Err(KvError::invalid(format!("block_size must be in 1..=2^20, got {block_size}")));
        }
        let mut pool = BlockPool::new(num_blocks, enable_events)?;
        num_blocks
            .checked_mul(block_size)
            .filter(|&n| n <= isize::MAX as usize / 8)
            .ok_or_else(|| KvError::invalid("num_blocks * block_size is too large"))?;
        pool.log_evictions();
        Ok(HashChainCache {
            pool,
            block_size,
            hasher: BlockHasher::new(algo, seed),
            index: FxHashMap::default(),
            reqs: Vec::new(),
            free_slots: Vec::new(),
            // A disabled memo holds no per-block state at all.
            memo: if algo.is_sha() { Memo::new(num_blocks, block_size)? } else { Memo::new(0, 0)? },
            use_memo: algo.is_sha(),
            pending: std::collections::VecDeque::new(),
            stats: Stats::default(),
            epoch: 0,
            scratch_hashes: Vec::new(),
            scratch_keys: Vec::new(),
            scratch_cand: Vec::new(),
            scratch_blocks: Vec::new(),
            scratch_slots: Vec::new(),
        })
    }

    /// The pool (read-only introspection).
    #[must_use]
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// Tokens per block.
    #[must_use]
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The hasher's algorithm.
    #[must_use]
    pub fn algo(&self) -> HashAlgo {
        self.hasher.algo()
    }

    /// Statistics since construction (or the last [`HashChainCache::take_stats`]).
    #[must_use]
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Returns the statistics and zeroes them.
    pub fn take_stats(&mut self) -> Stats {
        std::mem::take(&mut self.stats)
    }

    /// Number of running requests.
    #[must_use]
    pub fn num_requests(&self) -> usize {
        self.index.len()
    }

    /// Number of memoised blocks (at most the number of cached blocks).
    #[must_use]
    pub fn memo_len(&self) -> usize {
        self.memo.len()
    }

    /// Number of full blocks a lookup may hit for a prompt of `n` tokens.
    fn hit_cap(&self, n: usize) -> usize {
        n.saturating_sub(1) / self.block_size
    }

    /// Hashes of the full blocks of `tokens` into `out`, and (memo on) their
    /// memo prefix keys into `prefix_keys` (both cleared first), using the
    /// prefix memo for blocks without extra keys. O(tokens); a memoised block
    /// costs a fingerprint, a probe and a comparison instead of a digest.
    fn hash_with_memo<T: Token>(
        &mut self,
        tokens: &[T],
        spec: &KeySpec,
        out: &mut Vec<BlockHash>,
        prefix_keys: &mut Vec<u64>,
    ) {
        out.clear();
        prefix_keys.clear();
        let bs = self.block_size;
        if !self.use_memo {
            self.hasher.extend_chain(tokens, bs, spec, out);
            return;
        }
        extend_prefix_keys(tokens, bs, prefix_keys);
        let mut cand = std::mem::take(&mut self.scratch_cand);
        self.memo.candidates(tokens, prefix_keys, &mut cand);
        let mut keys: Vec<ExtraKey<'_>> = Vec::new();
        let mut parent = self.hasher.none_hash();
        for (i, blk) in tokens.chunks_exact(bs).enumerate() {
            if !spec.is_empty() {
                #[allow(clippy::cast_possible_wrap)]
                spec.block_keys((i * bs) as i64, bs as i64, &mut keys);
            }
            let memoised = match cand[i] {
                Some(b) if keys.is_empty() => self
                    .memo
                    .check(b, &parent)
                    // Another memoised block with these tokens and key but a
                    // different parent (e.g. another cache salt): look it up.
                    .or_else(|| self.memo.probe(prefix_keys[i], &parent, blk)),
                _ => None,
            };
            let h = memoised.unwrap_or_else(|| self.hasher.hash_block(Some(&parent), blk, &keys));
            out.push(h);
            parent = h;
        }
        self.scratch_cand = cand;
    }

    /// Hashes of the full blocks of `tokens` (no memo: a pure function). O(tokens).
    pub fn hash_prompt<T: Token>(&mut self, tokens: &[T], spec: &KeySpec) -> Vec<BlockHash> {
        let mut out = Vec::with_capacity(tokens.len() / self.block_size);
        self.hasher.extend_chain(tokens, self.block_size, spec, &mut out);
        out
    }

    /// Cached blocks of the longest run of `hashes` from block 0, at most `cap`. O(k).
    fn hit_blocks(&self, hashes: &[BlockHash], cap: usize, out: &mut Vec<BlockId>) {
        self.pool.lookup_run(&hashes[..cap.min(hashes.len())], out);
    }

    /// Tokens a prompt would hit now; no side effects. O(prompt tokens).
    pub fn lookup<T: Token>(&mut self, tokens: &[T], spec: &KeySpec) -> usize {
        let mut hashes = std::mem::take(&mut self.scratch_hashes);
        let mut keys = std::mem::take(&mut self.scratch_keys);
        self.hash_with_memo(tokens, spec, &mut hashes, &mut keys);
        let mut blocks = std::mem::take(&mut self.scratch_blocks);
        blocks.clear();
        self.hit_blocks(&hashes, self.hit_cap(tokens.len()), &mut blocks);
        let k = blocks.len();
        self.scratch_hashes = hashes;
        self.scratch_keys = keys;
        self.scratch_blocks = blocks;
        k * self.block_size
    }

    /// Admits request `id` with prompt `tokens`: returns the number of cached
    /// (hit) tokens, or `None` — with nothing changed — when the free blocks
    /// do not cover it. With `skip_reading` the cache is not read (vLLM's
    /// prompt-logprobs requests) but the prompt's blocks are still cached.
    /// O(prompt tokens + blocks).
    ///
    /// # Errors
    /// `DuplicateRequest` if `id` is running; `InvalidArgument` for an empty prompt.
    pub fn admit<T: Token>(
        &mut self,
        id: RequestId,
        tokens: &[T],
        spec: KeySpec,
        skip_reading: bool,
    ) -> KvResult<Option<usize>> {
        if self.index.contains_key(&id) {
            return Err(KvError::new(
                ErrorKind::DuplicateRequest,
                format!("request {} is already running", id.0),
            ));
        }
        if tokens.is_empty() {
            return Err(KvError::invalid("a prompt needs at least one token"));
        }
        let bs = self.block_size;
        let n = tokens.len();
        let mut prefix_keys = Vec::new();
        let (owned, hashes) = match self.take_pending(id, tokens, &spec) {
            Some(p) => {
                if self.use_memo {
                    extend_prefix_keys(tokens, bs, &mut prefix_keys);
                }
                (p.tokens, p.hashes)
            }
            None => {
                let mut hashes = Vec::with_capacity(n / bs + 1);
                self.hash_with_memo(tokens, &spec, &mut hashes, &mut prefix_keys);
                (tokens.iter().map(|t| t.get()).collect(), hashes)
            }
        };
        let mut blocks: Vec<BlockId> = Vec::with_capacity(n.div_ceil(bs) + 1);
        if !skip_reading {
            self.hit_blocks(&hashes, self.hit_cap(n), &mut blocks);
        }
        let k = blocks.len();
        let new = n.div_ceil(bs) - k;
        let free_hits = blocks.iter().filter(|&&b| self.pool.is_free(b)).count();
        if new + free_hits > self.pool.num_free() {
            // Keep the hashes for the scheduler's retry of the same request.
            if self.pending.len() == MAX_PENDING {
                self.pending.pop_front();
            }
            self.pending.push_back(Pending { id, tokens: owned, spec, hashes });
            return Ok(None);
        }
        self.pool.touch(&blocks);
        self.pool.allocate(new, &mut blocks);
        self.forget_evicted();
        let mut req = Request {
            id,
            tokens: owned,
            spec: Box::new(spec),
            hashes,
            blocks,
            num_cached: k,
            epoch: 0,
            keys: prefix_keys,
        };
        let memo = self.use_memo.then_some(&mut self.memo);
        cache_new_full_blocks(&mut self.pool, memo, self.hasher.none_hash(), bs, &mut req);
        self.stats.requests += 1;
        self.stats.queries += n as u64;
        self.stats.hits += (k * bs) as u64;
        let slot = match self.free_slots.pop() {
            Some(s) => {
                self.reqs[s as usize] = Some(req);
                s
            }
            None => {
                self.reqs.push(Some(req));
                u32::try_from(self.reqs.len() - 1).expect("fewer than 2^32 running requests")
            }
        };
        self.index.insert(id, slot);
        Ok(Some(k * bs))
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
        self.stats.evictions += ev.len() as u64;
        for &b in &ev {
            self.memo.forget(b);
        }
        ev.clear();
        self.scratch_blocks = ev;
    }

    fn slot(&self, id: RequestId) -> KvResult<u32> {
        self.index.get(&id).copied().ok_or_else(|| unknown(id))
    }

    fn req(&self, slot: u32) -> &Request {
        self.reqs[slot as usize].as_ref().expect("indexed slot holds a request")
    }

    fn get(&self, id: RequestId) -> KvResult<&Request> {
        Ok(self.req(self.slot(id)?))
    }

    fn blocks_needed(&self, req: &Request, extra: usize) -> usize {
        (req.tokens.len() + extra).div_ceil(self.block_size) - req.blocks.len()
    }

    /// Appends computed decode tokens to request `id`. Returns `false`, with
    /// nothing changed, when a needed block is not free. O(tokens), plus one
    /// block hash per filled block.
    ///
    /// # Errors
    /// `UnknownRequest` if `id` is not running.
    pub fn append<T: Token>(&mut self, id: RequestId, tokens: &[T]) -> KvResult<bool> {
        let slot = self.slot(id)?;
        if self.blocks_needed(self.req(slot), tokens.len()) > self.pool.num_free() {
            return Ok(false);
        }
        self.apply_append(slot, tokens);
        Ok(true)
    }

    /// Appends `tokens[offsets[i]..offsets[i+1]]` to request `ids[i]` for
    /// every i, all or nothing: returns `false`, with nothing changed, when
    /// the free blocks do not cover every request's growth. `offsets` has
    /// `ids.len() + 1` entries, starts at 0, ends at `tokens.len()` and never
    /// decreases; `None` means one token per request. O(ids + tokens).
    ///
    /// # Errors
    /// `UnknownRequest`, or `InvalidArgument` for a repeated id or bad offsets;
    /// checked before anything changes.
    pub fn append_batch<T: Token>(
        &mut self,
        ids: &[u64],
        tokens: &[T],
        offsets: Option<&[i64]>,
    ) -> KvResult<bool> {
        let ranges = batch_ranges(ids.len(), tokens.len(), offsets)?;
        self.epoch += 1;
        let epoch = self.epoch;
        let mut need = 0usize;
        let mut slots = std::mem::take(&mut self.scratch_slots);
        slots.clear();
        let mut touched = 0i64;
        for (i, &id) in ids.iter().enumerate() {
            let (a, b) = ranges.get(i);
            let Some(&slot) = self.index.get(&RequestId(id)) else {
                self.scratch_slots = slots;
                return Err(unknown(RequestId(id)));
            };
            let req = self.reqs[slot as usize].as_mut().expect("indexed slot holds a request");
            if req.epoch == epoch {
                self.scratch_slots = slots;
                return Err(KvError::invalid(format!("request {id} appears twice in one batch")));
            }
            req.epoch = epoch;
            need += (req.tokens.len() + b - a).div_ceil(self.block_size) - req.blocks.len();
            // Touch the end of the token list the append will write: these
            // independent loads overlap here instead of missing one by one below.
            touched ^= req.tokens.last().copied().unwrap_or(0);
            slots.push(slot);
        }
        std::hint::black_box(touched);
        let ok = need <= self.pool.num_free();
        if ok {
            for (i, &slot) in slots.iter().enumerate() {
                let (a, b) = ranges.get(i);
                self.apply_append(slot, &tokens[a..b]);
            }
        }
        self.scratch_slots = slots;
        Ok(ok)
    }

    fn apply_append<T: Token>(&mut self, slot: u32, tokens: &[T]) {
        let bs = self.block_size;
        let req = self.reqs[slot as usize].as_mut().expect("indexed slot holds a request");
        let had_full = req.tokens.len() / bs;
        req.tokens.extend(tokens.iter().map(|t| t.get()));
        let need = req.tokens.len().div_ceil(bs) - req.blocks.len();
        if need > 0 {
            self.pool.allocate(need, &mut req.blocks);
            // Before the new blocks are memoised under their new keys: forgetting
            // afterwards would drop the new entry and leave the stale one.
            self.forget_evicted();
        }
        let req = self.reqs[slot as usize].as_mut().expect("indexed slot holds a request");
        if req.tokens.len() / bs > had_full {
            self.hasher.extend_chain(&req.tokens, bs, &req.spec, &mut req.hashes);
            if self.use_memo {
                extend_prefix_keys(&req.tokens, bs, &mut req.keys);
            }
            let nh = self.hasher.none_hash();
            let memo = self.use_memo.then_some(&mut self.memo);
            cache_new_full_blocks(&mut self.pool, memo, nh, bs, req);
        }
    }

    /// Finishes request `id`, releasing its blocks in reverse table order. O(blocks).
    ///
    /// # Errors
    /// `UnknownRequest` if `id` is not running (including a double free).
    pub fn free(&mut self, id: RequestId) -> KvResult<()> {
        let slot = self.index.remove(&id).ok_or_else(|| unknown(id))?;
        let req = self.reqs[slot as usize].take().expect("indexed slot holds a request");
        self.free_slots.push(slot);
        let mut scratch = std::mem::take(&mut self.scratch_blocks);
        self.pool.free(req.blocks.iter().rev().copied(), &mut scratch);
        self.scratch_blocks = scratch;
        Ok(())
    }

    /// Finishes every request of `ids`, in order, as [`HashChainCache::free`]
    /// does. All ids are checked (known, no repeats) before anything changes.
    ///
    /// # Errors
    /// `UnknownRequest`, or `InvalidArgument` for a repeated id.
    pub fn free_batch(&mut self, ids: &[u64]) -> KvResult<()> {
        self.epoch += 1;
        let epoch = self.epoch;
        for &id in ids {
            let slot = self.slot(RequestId(id))?;
            let req = self.reqs[slot as usize].as_mut().expect("indexed slot holds a request");
            if req.epoch == epoch {
                return Err(KvError::invalid(format!("request {id} appears twice in one batch")));
            }
            req.epoch = epoch;
        }
        for &id in ids {
            self.free(RequestId(id))?;
        }
        Ok(())
    }

    /// Drops the cached hashes of idle blocks (they stay free, in place).
    /// Returns how many blocks lost a hash. O(ids).
    ///
    /// # Errors
    /// `InvalidArgument` for a bad id, `BlockInUse` for a block a request holds.
    pub fn evict_blocks(&mut self, ids: &[i64]) -> KvResult<usize> {
        let n = self.pool.evict_blocks(ids)?;
        self.forget_evicted();
        Ok(n)
    }

    /// Drops every cached hash. O(blocks).
    ///
    /// # Errors
    /// `BlockInUse` while any request is running.
    pub fn reset(&mut self) -> KvResult<()> {
        if !self.index.is_empty() {
            return Err(KvError::new(
                ErrorKind::BlockInUse,
                format!("cannot reset the prefix cache while {} requests hold blocks", self.index.len()),
            ));
        }
        self.pool.reset()?;
        self.memo.clear();
        // Refused prompts kept for a retry are released too.
        self.pending = std::collections::VecDeque::new();
        Ok(())
    }

    /// Drains buffered KV events.
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        self.pool.take_events()
    }

    /// Refused prompts kept (with their hashes) for the scheduler's retry:
    /// at most 32, oldest dropped first; `reset` releases them.
    #[must_use]
    pub fn num_pending_prompts(&self) -> usize {
        self.pending.len()
    }

    /// Bounds the KV event buffer (drop-oldest, see
    /// [`crate::core::event_buffer`]).
    ///
    /// # Errors
    /// `InvalidArgument` for 0.
    pub fn set_max_events(&mut self, max_events: usize) -> KvResult<()> {
        self.pool.set_max_events(max_events)
    }

    /// Events dropped from the full buffer since the last take.
    #[must_use]
    pub fn events_dropped(&self) -> u64 {
        self.pool.events_dropped()
    }

    /// Returns [`Self::events_dropped`] and zeroes it.
    pub fn take_events_dropped(&mut self) -> u64 {
        self.pool.take_events_dropped()
    }

    /// The chained block hashes of request `id`'s full blocks.
    ///
    /// # Errors
    /// `UnknownRequest`.
    pub fn request_hashes(&self, id: RequestId) -> KvResult<&[BlockHash]> {
        Ok(&self.get(id)?.hashes)
    }

    /// Blocks shared by every running request: counting from block 0 of any
    /// running request's table, the blocks whose ref count equals the number
    /// of running requests (the prefix cascade attention can share). 0 when
    /// nothing runs. O(shared blocks).
    #[must_use]
    pub fn num_common_prefix_blocks(&self) -> usize {
        let n = self.index.len();
        let Some(&slot) = self.index.values().next() else { return 0 };
        let req = self.req(slot);
        #[allow(clippy::cast_possible_truncation)]
        req.blocks.iter().take_while(|&&b| self.pool.ref_count(b) as usize == n).count()
    }

    /// Checks the pool's and every request's invariants (module header). O(all tokens).
    ///
    /// # Errors
    /// The first violation found.
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        self.pool.check_invariants()?;
        let bs = self.block_size;
        let mut refs = vec![0u32; self.pool.num_blocks()];
        let mut hasher = self.hasher.clone();
        ensure_inv!(
            self.reqs.iter().flatten().count() == self.index.len(),
            "request slab and index disagree"
        );
        for (id, &slot) in &self.index {
            let r = self.req(slot);
            ensure_inv!(r.id == *id, "slot {slot} holds request {} but is indexed as {}", r.id.0, id.0);
            let n = r.tokens.len();
            ensure_inv!(
                r.blocks.len() == n.div_ceil(bs),
                "request {}: {} blocks for {n} tokens",
                id.0,
                r.blocks.len()
            );
            ensure_inv!(
                r.num_cached == n / bs,
                "request {}: {} cached of {} full",
                id.0,
                r.num_cached,
                n / bs
            );
            let mut chain = Vec::new();
            hasher.extend_chain(&r.tokens, bs, &r.spec, &mut chain);
            ensure_inv!(chain == r.hashes, "request {}: stored hashes differ from its token chain", id.0);
            let mut keys = Vec::new();
            if self.use_memo {
                extend_prefix_keys(&r.tokens, bs, &mut keys);
            }
            ensure_inv!(keys == r.keys, "request {}: stored memo keys differ from its tokens", id.0);
            for (i, b) in r.blocks.iter().enumerate() {
                ensure_inv!(*b != BlockId::NULL, "request {} holds the null block", id.0);
                refs[b.idx()] += 1;
                let h = self.pool.block_hash(*b);
                if i < r.num_cached {
                    ensure_inv!(
                        h == Some(r.hashes[i]),
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
            hasher.extend_chain(&p.tokens, bs, &p.spec, &mut chain);
            ensure_inv!(chain == p.hashes, "pending request {}: hashes differ from its prompt", p.id.0);
        }
        ensure_inv!(self.pending.len() <= MAX_PENDING, "{} pending prompts", self.pending.len());
        let entries = self.memo.entries().map_err(InvariantViolation)?;
        for (b, own, parent, toks) in entries {
            ensure_inv!(
                self.pool.block_hash(b) == Some(own),
                "memo block {} is not cached under its hash",
                b.0
            );
            ensure_inv!(
                own == hasher.hash_block(Some(&parent), toks, &[]),
                "memo block {} hash mismatch",
                b.0
            );
        }
        for (i, &c) in refs.iter().enumerate() {
            #[allow(clippy::cast_possible_truncation)]
            let rc = self.pool.ref_count(BlockId(i as u32));
            ensure_inv!(rc == c, "block {i}: ref count {rc}, held by {c} tables");
        }
        Ok(())
    }
}

impl TableSource for HashChainCache {
    fn table_block_size(&self) -> usize {
        self.block_size
    }

    fn table(&self, id: RequestId) -> KvResult<(&[BlockId], usize)> {
        let r = self.get(id)?;
        Ok((&r.blocks, r.tokens.len()))
    }
}

fn event_key(k: &ExtraKey<'_>) -> EventKey {
    match *k {
        ExtraKey::Lora(name, _) => EventKey::Str(name.to_owned()),
        ExtraKey::Mm(id, off) => EventKey::Mm(id.to_owned(), off),
        ExtraKey::Salt(s) => EventKey::Str(s.to_owned()),
    }
}

#[cold]
fn unknown(id: RequestId) -> KvError {
    KvError::new(
        ErrorKind::UnknownRequest,
        format!("unknown request id {} (never admitted, or already freed)", id.0),
    )
}

/// Registers table entries `num_cached..num_full` of `req` under their
/// hashes, memoises those without extra keys, and emits one `BlockStored`
/// for the run. O(new full blocks).
fn cache_new_full_blocks(
    pool: &mut BlockPool,
    mut memo: Option<&mut Memo>,
    none_hash: BlockHash,
    bs: usize,
    req: &mut Request,
) {
    let full = req.tokens.len() / bs;
    let start = req.num_cached;
    if start >= full {
        return;
    }
    let mut keys: Vec<ExtraKey<'_>> = Vec::new();
    for i in start..full {
        let b = req.blocks[i];
        pool.cache_block(b, req.hashes[i]);
        if !req.spec.is_empty() {
            #[allow(clippy::cast_possible_wrap)]
            req.spec.block_keys((i * bs) as i64, bs as i64, &mut keys);
        }
        if let (true, Some(memo)) = (keys.is_empty(), memo.as_deref_mut()) {
            let parent = if i == 0 { None } else { Some(req.hashes[i - 1]) };
            let toks = &req.tokens[i * bs..(i + 1) * bs];
            memo.insert(b, req.keys[i], req.hashes[i], &parent.unwrap_or(none_hash), toks);
        }
    }
    req.num_cached = full;
    if pool.events_enabled() {
        let extra_keys = (start..full)
            .map(|i| {
                #[allow(clippy::cast_possible_wrap)]
                req.spec.block_keys((i * bs) as i64, bs as i64, &mut keys);
                (!keys.is_empty()).then(|| keys.iter().map(event_key).collect())
            })
            .collect();
        let ev = KvEvent::BlockStored {
            block_hashes: req.hashes[start..full].iter().map(BlockHash::low_u64).collect(),
            parent_block_hash: (start > 0).then(|| req.hashes[start - 1].low_u64()),
            token_ids: req.tokens[start * bs..full * bs].to_vec(),
            block_size: bs,
            lora_name: req.spec.lora.as_ref().map(|(name, _)| name.clone()),
            extra_keys,
        };
        pool.emit(|| ev);
    }
}
