//! Request-level prefix cache over the radix tree, driven like
//! [`crate::core::hash_chain::HashChainCache`] (admit / append / free, block
//! tables, slot mappings, statistics), with SGLang's request lifecycle.
//!
//! # Flow
//! - [`RadixPrefixCache::admit`]: match the prompt (cut to `num_tokens - 1`,
//!   page-aligned: as SGLang's scheduler, which matches at most
//!   `input_len - 1` tokens, the last prompt token is always computed), lock
//!   the matched node, and allocate pages for the rest from the
//!   [`SlotPool`], evicting unlocked tree leaves for the shortfall.
//!   All-or-nothing: `None`, with nothing changed (not even recency), when
//!   free pages plus evictable ones cannot cover the request.
//! - [`RadixPrefixCache::append`] / [`RadixPrefixCache::append_batch`]:
//!   decode tokens (already computed) extend the request; pages are
//!   allocated (evicting if short) as they fill up. Nothing enters the tree.
//! - [`RadixPrefixCache::checkpoint`] (optional; SGLang
//!   `cache_unfinished_req`): insert the request's full pages now, so other
//!   requests can hit them while it runs; its duplicates switch to the
//!   tree's pages and its lock moves down to the new node.
//! - [`RadixPrefixCache::free`] (finish; SGLang `cache_finished_req`):
//!   insert the whole sequence's full pages, unlock, and drop the request's
//!   references: duplicates of pages the tree already had and the partial
//!   last page return to the pool, pages the tree adopted stay cached.
//!
//! # Pages, block ids and the null page
//! The pool holds `num_blocks` pages of `page_size` slots. A request's table
//! lists page ids (block ids), so a paged-attention kernel consumes it like a
//! hash-chain block table; with `page_size == 1` tables are token-level
//! (page id == slot). Page 0 is never handed out: tables are padded with 0.
//!
//! # Ownership (checked by [`RadixPrefixCache::check_invariants`])
//! Every holder takes one pool reference: the tree for each page it stores,
//! each running request for each page of its table (its hit prefix included).
//! - `ref_count(p) == [p in tree] + #(tables holding p)`; free iff 0;
//! - so each page is exactly one of: free, in the tree, or held only by
//!   running requests;
//! - a request's table starts with the values of its locked tree path
//!   (`cached` tokens) and has `ceil(num_tokens / page_size)` pages;
//! - the tree's own locks are exactly the requests' locks.
//!
//! Every unlocked tree page is held by the tree alone (requests hold only
//! their locked path), so evicting `k` evictable tokens frees `k / page_size`
//! pages: that is what admission counts on.
//!
//! # Namespaces
//! `lora` and `cache_salt` form the tree namespace (an empty salt is no
//! salt, as in the hash chain); multimodal extra keys are not supported by a
//! token-keyed tree (SGLang replaces image placeholders with content-derived
//! pad ids instead).
//!
//! # Costs
//! `admit`: O(prompt) matching + O(hit pages) references + O(new pages).
//! `append`: O(tokens) + O(1) per new page. `free`: the tree insert
//! (O(sequence)) + O(pages). Evictions: O(log L) per tree leaf.

use rustc_hash::FxHashMap;

use crate::core::error::{ErrorKind, InvariantViolation, KvError, KvResult};
use crate::core::events::KvEvent;
use crate::core::hash::KeySpec;
use crate::core::hash_chain::Stats;
use crate::core::ids::{BlockId, RequestId};
use crate::core::radix::{NodeId, Policy, RadixTree};
use crate::core::slot_pool::SlotPool;
use crate::core::tables::{batch_ranges, TableSource};
use crate::ensure_inv;

/// A running request.
#[derive(Clone, Debug)]
struct Request {
    tokens: Vec<i32>,
    ns: Option<Box<str>>,
    pages: Vec<BlockId>,
    /// The locked tree node (root: nothing locked).
    node: NodeId,
    /// Leading tokens whose pages are the tree's (the path to `node`).
    cached: usize,
    epoch: u64,
}

/// The tree namespace of a key spec: `None` without LoRA and salt, else a
/// length-prefixed encoding of both parts, so distinct `(lora, salt)` pairs
/// always give distinct namespaces (no separator a value could contain):
/// `L<len>:<name><len>:<path>` or `-` (no LoRA), then `S<len>:<salt>` or `-`
/// (no salt), lengths in bytes.
///
/// # Errors
/// `InvalidArgument` if the spec has multimodal items.
pub fn namespace(spec: &KeySpec) -> KvResult<Option<String>> {
    if !spec.mm_items.is_empty() {
        return Err(KvError::invalid(
            "the radix cache keys on token ids only: mm_items are not supported \
             (give multimodal placeholders content-derived token ids instead)",
        ));
    }
    Ok(match (&spec.lora, &spec.cache_salt) {
        (None, None) => None,
        (lora, salt) => {
            use std::fmt::Write;
            let mut ns = String::new();
            let part = |ns: &mut String, tag: &str, s: &str| {
                let _ = write!(ns, "{tag}{}:{s}", s.len());
            };
            match lora {
                Some((n, p)) => {
                    part(&mut ns, "L", n);
                    part(&mut ns, "", p);
                }
                None => ns.push('-'),
            }
            match salt {
                Some(s) => part(&mut ns, "S", s),
                None => ns.push('-'),
            }
            Some(ns)
        }
    })
}

/// Narrows int64 token ids to the tree's int32.
///
/// # Errors
/// `InvalidArgument` for a token outside the int32 range.
pub fn narrow_tokens(tokens: &[i64]) -> KvResult<Vec<i32>> {
    tokens
        .iter()
        .map(|&t| {
            i32::try_from(t).map_err(|_| KvError::invalid(format!("token id {t} does not fit in int32")))
        })
        .collect()
}

/// The radix-tree request cache.
#[derive(Clone, Debug)]
pub struct RadixPrefixCache {
    tree: RadixTree,
    pool: SlotPool,
    page_size: usize,
    reqs: FxHashMap<RequestId, Request>,
    stats: Stats,
    epoch: u64,
    scratch: Vec<BlockId>,
}

#[cold]
fn unknown(id: RequestId) -> KvError {
    KvError::new(
        ErrorKind::UnknownRequest,
        format!("unknown request id {} (never admitted, or already freed)", id.0),
    )
}

impl RadixPrefixCache {
    /// A cache of `num_blocks` pages (page 0 is the null page) of `page_size`
    /// tokens, evicting tree leaves by `policy`.
    ///
    /// # Errors
    /// `InvalidArgument` for `page_size` outside `1..=2^20` or `num_blocks < 2`.
    pub fn new(num_blocks: usize, page_size: usize, policy: Policy, enable_events: bool) -> KvResult<Self> {
        let tree = RadixTree::new(page_size, policy, enable_events)?;
        let pool = SlotPool::new(num_blocks)?;
        Ok(RadixPrefixCache {
            tree,
            pool,
            page_size,
            reqs: FxHashMap::default(),
            stats: Stats::default(),
            epoch: 0,
            scratch: Vec::new(),
        })
    }

    /// The tree (read-only introspection).
    #[must_use]
    pub fn tree(&self) -> &RadixTree {
        &self.tree
    }

    /// The pool (read-only introspection).
    #[must_use]
    pub fn pool(&self) -> &SlotPool {
        &self.pool
    }

    /// Tokens per page (= block size). O(1).
    #[must_use]
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// Running requests. O(1).
    #[must_use]
    pub fn num_requests(&self) -> usize {
        self.reqs.len()
    }

    /// Pages available to new work: free ones plus those evictable from the
    /// tree (held by no running request). O(1).
    #[must_use]
    pub fn num_free_blocks(&self) -> usize {
        self.pool.num_free() + self.tree.evictable_size() / self.page_size
    }

    /// Fraction of usable pages held by running requests. O(1).
    #[must_use]
    pub fn usage(&self) -> f64 {
        #[allow(clippy::cast_precision_loss)]
        let u = 1.0 - self.num_free_blocks() as f64 / (self.pool.num_pages() - 1) as f64;
        u
    }

    /// Statistics since construction (or the last `take_stats`). O(1).
    #[must_use]
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Returns the statistics and zeroes them. O(1).
    pub fn take_stats(&mut self) -> Stats {
        std::mem::take(&mut self.stats)
    }

    /// The page-aligned query a prompt of `n` tokens may hit.
    fn hit_cap(&self, n: usize) -> usize {
        n.saturating_sub(1) / self.page_size * self.page_size
    }

    /// Tokens a prompt would hit now; no side effects. O(prompt).
    ///
    /// # Errors
    /// `InvalidArgument` for multimodal items.
    pub fn lookup(&mut self, tokens: &[i32], spec: &KeySpec) -> KvResult<usize> {
        let ns = namespace(spec)?;
        let cap = self.hit_cap(tokens.len());
        Ok(self.tree.probe(&tokens[..cap], ns.as_deref()).len)
    }

    /// Evicts tree leaves until `need` pages are free. The caller checked
    /// that free + evictable pages cover `need`. O(log L) per leaf.
    fn ensure_free(&mut self, need: usize) {
        let free = self.pool.num_free();
        if free >= need {
            return;
        }
        let mut freed = std::mem::take(&mut self.scratch);
        freed.clear();
        self.tree.evict((need - free) * self.page_size, &mut freed);
        self.stats.evictions += freed.len() as u64;
        self.pool.decref(&freed);
        self.scratch = freed;
        assert!(self.pool.num_free() >= need, "evictable tree pages are held by the tree alone");
    }

    /// Admits request `id` with prompt `tokens`: returns the number of cached
    /// (hit) tokens, or `None` — with nothing changed — when free plus
    /// evictable pages do not cover it. With `skip_reading` the tree is not
    /// read (hit 0), but the sequence is still inserted when it finishes.
    ///
    /// # Errors
    /// `DuplicateRequest` if `id` is running; `InvalidArgument` for an empty
    /// prompt or multimodal items.
    pub fn admit(
        &mut self,
        id: RequestId,
        tokens: &[i32],
        spec: &KeySpec,
        skip_reading: bool,
    ) -> KvResult<Option<usize>> {
        if self.reqs.contains_key(&id) {
            return Err(KvError::new(
                ErrorKind::DuplicateRequest,
                format!("request {} is already running", id.0),
            ));
        }
        if tokens.is_empty() {
            return Err(KvError::invalid("a prompt needs at least one token"));
        }
        let ns = namespace(spec)?;
        let ps = self.page_size;
        let n = tokens.len();
        let cap = if skip_reading { 0 } else { self.hit_cap(n) };
        let probe = self.tree.probe(&tokens[..cap], ns.as_deref());
        let need = n.div_ceil(ps) - probe.len / ps;
        if need > self.pool.num_free() + (self.tree.evictable_size() - probe.lockable) / ps {
            return Ok(None);
        }
        let mut pages = Vec::with_capacity(n.div_ceil(ps) + 1);
        let m = self.tree.match_prefix(&tokens[..cap], ns.as_deref(), &mut pages);
        assert_eq!(m.len, probe.len, "match hits what the probe saw");
        self.tree.lock(m.node);
        self.pool.incref(&pages);
        self.ensure_free(need);
        self.pool.alloc(need, &mut pages);
        self.stats.requests += 1;
        self.stats.queries += n as u64;
        self.stats.hits += m.len as u64;
        let req = Request {
            tokens: tokens.to_vec(),
            ns: ns.map(Into::into),
            pages,
            node: m.node,
            cached: m.len,
            epoch: 0,
        };
        self.reqs.insert(id, req);
        Ok(Some(m.len))
    }

    fn get(&self, id: RequestId) -> KvResult<&Request> {
        self.reqs.get(&id).ok_or_else(|| unknown(id))
    }

    fn pages_needed(&self, req: &Request, extra: usize) -> usize {
        (req.tokens.len() + extra).div_ceil(self.page_size) - req.pages.len()
    }

    /// Appends computed decode tokens to request `id`. Returns `false`, with
    /// nothing changed, when free plus evictable pages cannot cover them.
    /// O(tokens + new pages).
    ///
    /// # Errors
    /// `UnknownRequest` if `id` is not running.
    pub fn append(&mut self, id: RequestId, tokens: &[i32]) -> KvResult<bool> {
        let need = self.pages_needed(self.get(id)?, tokens.len());
        if need > self.num_free_blocks() {
            return Ok(false);
        }
        self.apply_append(id, tokens, need);
        Ok(true)
    }

    fn apply_append(&mut self, id: RequestId, tokens: &[i32], need: usize) {
        self.ensure_free(need);
        let req = self.reqs.get_mut(&id).expect("request checked by caller");
        req.tokens.extend_from_slice(tokens);
        self.pool.alloc(need, &mut req.pages);
    }

    /// Appends `tokens[offsets[i]..offsets[i+1]]` to request `ids[i]` for
    /// every i, all or nothing (see `HashChainCache::append_batch`; `None`
    /// offsets mean one token per request). O(tokens + new pages).
    ///
    /// # Errors
    /// `UnknownRequest`, or `InvalidArgument` for a repeated id or bad
    /// offsets; checked before anything changes.
    pub fn append_batch(&mut self, ids: &[u64], tokens: &[i32], offsets: Option<&[i64]>) -> KvResult<bool> {
        let ranges = batch_ranges(ids.len(), tokens.len(), offsets)?;
        self.epoch += 1;
        let epoch = self.epoch;
        let mut need = 0usize;
        for (i, &id) in ids.iter().enumerate() {
            let (a, b) = ranges.get(i);
            let req = self.reqs.get_mut(&RequestId(id)).ok_or_else(|| unknown(RequestId(id)))?;
            if req.epoch == epoch {
                return Err(KvError::invalid(format!("request {id} appears twice in one batch")));
            }
            req.epoch = epoch;
            need += (req.tokens.len() + b - a).div_ceil(self.page_size) - req.pages.len();
        }
        if need > self.num_free_blocks() {
            return Ok(false);
        }
        for (i, &id) in ids.iter().enumerate() {
            let (a, b) = ranges.get(i);
            let need = self.pages_needed(self.get(RequestId(id))?, b - a);
            self.apply_append(RequestId(id), &tokens[a..b], need);
        }
        Ok(true)
    }

    /// Inserts the full pages of `req` into the tree; the tree takes a
    /// reference on the pages it adopts. Returns the full-page token count.
    fn insert_request(&mut self, req: &Request) -> usize {
        let ps = self.page_size;
        let full = req.tokens.len() / ps;
        let mut dups = std::mem::take(&mut self.scratch);
        dups.clear();
        let prefix = self
            .tree
            .insert(&req.tokens[..full * ps], &req.pages[..full], req.ns.as_deref(), 0, &[], &mut dups)
            .expect("a request's pages are its own or the tree's at the same positions");
        self.scratch = dups;
        self.pool.incref(&req.pages[prefix / ps..full]);
        full * ps
    }

    /// Inserts request `id`'s full pages into the tree now (SGLang
    /// `cache_unfinished_req`): later requests can hit them while it runs.
    /// The request's pages that duplicate the tree's are swapped for the
    /// tree's (and freed), and its lock moves to the new last node.
    /// O(sequence + pages).
    ///
    /// # Errors
    /// `UnknownRequest`.
    pub fn checkpoint(&mut self, id: RequestId) -> KvResult<()> {
        let mut req = self.reqs.remove(&id).ok_or_else(|| unknown(id))?;
        let full_tokens = self.insert_request(&req);
        if full_tokens > req.cached {
            let mut tree_pages = std::mem::take(&mut self.scratch);
            tree_pages.clear();
            let m = self.tree.match_prefix(&req.tokens[..full_tokens], req.ns.as_deref(), &mut tree_pages);
            assert_eq!(m.len, full_tokens, "the request's full pages were just inserted");
            for (mine, &theirs) in req.pages.iter_mut().zip(&tree_pages) {
                if *mine != theirs {
                    self.pool.incref(&[theirs]);
                    self.pool.decref(&[*mine]);
                    *mine = theirs;
                }
            }
            self.scratch = tree_pages;
            self.tree.lock(m.node);
            self.tree.unlock(req.node).expect("a request holds its lock");
            req.node = m.node;
            req.cached = full_tokens;
        }
        self.reqs.insert(id, req);
        Ok(())
    }

    /// Finishes request `id`: inserts its full pages into the tree, unlocks
    /// its path and drops its page references (duplicates and the partial
    /// last page return to the pool). O(sequence + pages).
    ///
    /// # Errors
    /// `UnknownRequest` if `id` is not running (including a double free).
    pub fn free(&mut self, id: RequestId) -> KvResult<()> {
        let req = self.reqs.remove(&id).ok_or_else(|| unknown(id))?;
        self.insert_request(&req);
        self.tree.unlock(req.node).expect("a request holds its lock");
        self.pool.decref(&req.pages);
        Ok(())
    }

    /// Finishes every request of `ids`, in order. All ids are checked (known,
    /// no repeats) before anything changes.
    ///
    /// # Errors
    /// `UnknownRequest`, or `InvalidArgument` for a repeated id.
    pub fn free_batch(&mut self, ids: &[u64]) -> KvResult<()> {
        self.epoch += 1;
        let epoch = self.epoch;
        for &id in ids {
            let req = self.reqs.get_mut(&RequestId(id)).ok_or_else(|| unknown(RequestId(id)))?;
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

    /// Evicts unlocked tree leaves (policy order) until `num_tokens` tokens
    /// are freed or nothing is evictable; their pages return to the pool.
    /// Returns the tokens evicted. O(log L + pages) per leaf.
    pub fn evict(&mut self, num_tokens: usize) -> usize {
        let mut freed = std::mem::take(&mut self.scratch);
        freed.clear();
        let n = self.tree.evict(num_tokens, &mut freed);
        self.stats.evictions += freed.len() as u64;
        self.pool.decref(&freed);
        self.scratch = freed;
        n
    }

    /// Drops the whole tree (its pages return to the pool).
    ///
    /// # Errors
    /// `BlockInUse` while any request is running.
    pub fn reset(&mut self) -> KvResult<()> {
        if !self.reqs.is_empty() {
            return Err(KvError::new(
                ErrorKind::BlockInUse,
                format!("cannot reset the prefix cache while {} requests hold pages", self.reqs.len()),
            ));
        }
        let mut freed = Vec::new();
        self.tree.reset(&mut freed);
        freed.sort_unstable(); // pages return to the pool in id order
        self.pool.decref(&freed);
        Ok(())
    }

    /// Drains buffered KV events.
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        self.tree.take_events()
    }

    /// Bounds the KV event buffer (drop-oldest, see
    /// [`crate::core::event_buffer`]).
    ///
    /// # Errors
    /// `InvalidArgument` for 0.
    pub fn set_max_events(&mut self, max_events: usize) -> KvResult<()> {
        self.tree.set_max_events(max_events)
    }

    /// Events dropped from the full buffer since the last take.
    #[must_use]
    pub fn events_dropped(&self) -> u64 {
        self.tree.events_dropped()
    }

    /// Returns [`Self::events_dropped`] and zeroes it.
    pub fn take_events_dropped(&mut self) -> u64 {
        self.tree.take_events_dropped()
    }

    /// Leading tokens of request `id` served by (locked) tree pages.
    ///
    /// # Errors
    /// `UnknownRequest`.
    pub fn num_cached_tokens(&self, id: RequestId) -> KvResult<usize> {
        Ok(self.get(id)?.cached)
    }

    /// Pages shared by every running request: from page 0 of any running
    /// request's table, the pages that every running request holds — the part
    /// of the tree path that every request has locked (each holder takes one
    /// page reference, the tree one more for the pages it stores). 0 when
    /// nothing runs. O(shared pages).
    #[must_use]
    pub fn num_common_prefix_blocks(&self) -> usize {
        let n = self.reqs.len();
        let Some(r) = self.reqs.values().next() else { return 0 };
        let tree_pages = r.cached / self.page_size;
        r.pages
            .iter()
            .enumerate()
            .take_while(|&(i, &p)| self.pool.ref_count(p) as usize == n + usize::from(i < tree_pages))
            .count()
    }

    /// Checks the tree's, the pool's and the ownership invariants (module
    /// header). O(pages + tokens + nodes).
    ///
    /// # Errors
    /// The first violation found.
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        self.tree.check_invariants()?;
        self.pool.check_invariants()?;
        let ps = self.page_size;
        let mut refs = vec![0u32; self.pool.num_pages()];
        let mut tree_pages = Vec::new();
        self.tree.all_values(&mut tree_pages);
        for p in &tree_pages {
            ensure_inv!(
                *p != BlockId::NULL && p.idx() < refs.len(),
                "tree holds page {} (null or out of range)",
                p.0
            );
            refs[p.idx()] += 1;
        }
        let mut locks = 0u64;
        let mut path = Vec::new();
        for (id, r) in &self.reqs {
            let n = r.tokens.len();
            ensure_inv!(
                r.pages.len() == n.div_ceil(ps),
                "request {}: {} pages for {n} tokens",
                id.0,
                r.pages.len()
            );
            ensure_inv!(
                r.cached.is_multiple_of(ps) && r.cached <= n,
                "request {}: cached {} of {n}",
                id.0,
                r.cached
            );
            ensure_inv!(
                self.tree.path_len(r.node) == r.cached,
                "request {}: locked path is not its cached prefix",
                id.0
            );
            path.clear();
            self.tree.path_values(r.node, &mut path);
            ensure_inv!(
                path[..] == r.pages[..r.cached / ps],
                "request {}: hit pages differ from the tree's",
                id.0
            );
            locks += u64::from(r.node != NodeId::ROOT);
            for p in &r.pages {
                ensure_inv!(*p != BlockId::NULL, "request {} holds the null page", id.0);
                refs[p.idx()] += 1;
            }
        }
        ensure_inv!(
            self.tree.num_own_locks() == locks,
            "tree holds {} locks, requests {locks}",
            self.tree.num_own_locks()
        );
        for (i, &c) in refs.iter().enumerate() {
            #[allow(clippy::cast_possible_truncation)]
            let rc = self.pool.ref_count(BlockId(i as u32));
            ensure_inv!(rc == c, "page {i}: ref count {rc}, held by {c} (tree + tables)");
        }
        Ok(())
    }
}

impl TableSource for RadixPrefixCache {
    fn table_block_size(&self) -> usize {
        self.page_size
    }

    fn table(&self, id: RequestId) -> KvResult<(&[BlockId], usize)> {
        let r = self.get(id)?;
        Ok((&r.pages, r.tokens.len()))
    }
}
