//! Request-level prefix cache over the radix tree, with SGLang's request
//! lifecycle: [`RadixDesign`], the radix design of the request layer
//! ([`crate::core::request`], which holds the requests, their tables, the id
//! checks and statistics, as for [`crate::core::hash_chain::HashChainCache`]),
//! and [`RadixPrefixCache`], the request-level cache over it.
//!
//! # Flow
//! - [`RadixPrefixCache::admit`]: match the prompt (cut to `num_tokens - 1`,
//!   page-aligned: as SGLang's scheduler, which matches at most
//!   `input_len - 1` tokens, the last prompt token is always computed), lock
//!   the matched node, and allocate pages for the rest from the
//!   [`PagePool`], evicting unlocked tree leaves for the shortfall.
//!   All-or-nothing: `None`, with nothing changed (not even recency), when
//!   free pages plus evictable ones cannot cover the request.
//! - [`RadixPrefixCache::append`] / [`RadixPrefixCache::append_batch`]:
//!   decode tokens (already computed) extend the request; pages are
//!   allocated (evicting if short) as they fill up. Nothing enters the tree.
//! - [`RadixPrefixCache::checkpoint`] (optional; SGLang
//!   `cache_unfinished_req`): insert the request's full pages now, so other
//!   requests can hit them while it runs; its duplicates switch to the
//!   tree's pages and its lock moves down to the new node.
//! - The engine lifecycle (`admit_chunk`, `schedule`, `commit_tokens`, ...,
//!   see [`crate::core::request`]): a chunk's full pages enter the tree as
//!   SGLang's per-chunk `cache_unfinished_req` inserts them, at the moment
//!   the hash chain caches the same blocks (the step that schedules them),
//!   so both designs see the same cacheable tokens at the same moments;
//!   `finish` inserts nothing more.
//! - [`RadixPrefixCache::free`] (finish; SGLang `cache_finished_req`):
//!   insert the whole sequence's full pages, unlock, and drop the request's
//!   references: duplicates of pages the tree already had and the partial
//!   last page return to the pool, pages the tree adopted stay cached.
//!
//! # Hybrid components ([`RadixPrefixCache::with_components`])
//! A tree with sliding-window and Mamba components (SGLang's unified tree,
//! [`crate::core::radix`]'s hybrid module) sits over a full pool and its
//! component pools ([`crate::core::radix::pools`]), as SGLang's SWA
//! allocator and `MambaPool`:
//! - every page handed out takes an SWA page (the page id names both); a
//!   page left without holders frees both; admission and appends need full
//!   *and* SWA pages (free plus evictable: full eviction deletes leaves, SWA
//!   eviction turns the least recent unlocked live nodes into tombstones);
//! - a decoding request frees the SWA pages of its own pages that left its
//!   window (SGLang's `free_swa_out_of_window_slots`: before the last
//!   `max(window, page)` tokens rounded up to pages of the sequence before
//!   the step, never the tree's prefix), and inserts with that boundary, so
//!   the tree keeps the part before it as a tombstone;
//! - each running request holds one Mamba state slot (copied from the hit's
//!   state by the engine); a checkpoint forks it for the tree, a finished
//!   request donates it (freed when the node already has a state); an
//!   admission with no state to be had (free or evictable) waits.
//!
//! # Pages and the null page
//! The pool holds `num_blocks` pages of `page_size` slots. A request's table
//! lists page ids ([`PageId`]), so a paged-attention kernel consumes it like a
//! hash-chain block table; with `page_size == 1` tables are token-level
//! (page id == slot). Page 0 is never handed out: tables are padded with 0.
//!
//! # Ownership (checked by [`RadixPrefixCache::check_invariants`], with the
//! request layer's invariants)
//! Every holder takes one pool reference: the tree for each page it stores,
//! each running request for each page of its table (its hit prefix included).
//! - `ref_count(p) == [p in tree] + #(tables holding p)`; free iff 0;
//! - so each page is exactly one of: free, in the tree, or held only by
//!   running requests;
//! - a request's table starts with the values of its locked tree path
//!   (`cached` tokens);
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

use std::borrow::Cow;

use crate::core::error::{try_reserve, InvariantViolation, KvError, KvResult};
use crate::core::event_buffer::Events;
use crate::core::hash::{KeySpec, Token};
use crate::core::ids::{PageId, RequestId};
use crate::core::page_pool::PagePool;
use crate::core::radix::pools::{ComponentPool, MambaPool, SwaPool};
use crate::core::radix::{Components, HybridFreed, InsertOpts, NodeId, Policy, RadixTree};
use crate::core::request::{Admitted, PrefixCache, PrefixDesign, Reads, RecordOf};
use crate::ensure_inv;

/// The radix state of a running request.
#[derive(Clone, Debug)]
pub struct RadixState {
    ns: Option<Box<str>>,
    /// The locked tree node (root: nothing locked).
    node: NodeId,
    /// Leading tokens whose pages are the tree's (the path to `node`).
    cached: usize,
    /// Leading tokens the request has made cacheable: its known ids up to
    /// the positions of its last step (admission, `schedule`, today's
    /// `append`), as the hash chain caches them. A commit does not move it
    /// (the hash chain caches the blocks a commit completes at the next
    /// step), nor does an admission waiting for its external KV.
    visible: usize,
    /// Leading tokens whose SWA KV is freed (the tree's tombstones or the
    /// request's own out-of-window pages; SGLang's `swa_evicted_seqlen`).
    swa_evicted: usize,
    /// The request's Mamba state slot (hybrid caches with Mamba).
    mamba: Option<u32>,
}

/// A checked admission: the prompt, its namespace and what the probe saw.
#[derive(Debug)]
pub struct RadixPlan {
    tokens: Vec<i32>,
    ns: Option<String>,
    /// Tokens the tree is read for (0 with `skip_reading`).
    cap: usize,
    /// Tokens the probe hit.
    hit: usize,
    /// Evictable tokens the hit would lock.
    lockable: usize,
    /// Evictable live SWA tokens the hit would SWA-lock.
    swa_lockable: usize,
    /// Whether the hit would lock an evictable Mamba state.
    mamba_lockable: bool,
    /// The table under construction (reserved fallibly for a new prompt).
    pages: Vec<PageId>,
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
    tokens.iter().map(|&t| i32::try_from(t).map_err(|_| crate::core::hash::token_out_of_range(t))).collect()
}

/// The radix design: the tree, the page pool behind it, and the eviction tally.
#[derive(Clone, Debug)]
pub struct RadixDesign {
    tree: RadixTree,
    pool: PagePool,
    page_size: usize,
    evictions: u64,
    scratch: Vec<PageId>,
    /// The component pools of a hybrid cache (`None`: full attention only).
    hy: Option<Box<HyPools>>,
}

/// The component pools of a hybrid radix cache and the frees in flight.
#[derive(Clone, Debug)]
struct HyPools {
    swa: Option<SwaPool>,
    mamba: Option<MambaPool>,
    freed: HybridFreed,
}

/// Sizes of a hybrid radix cache's component pools.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolSizes {
    /// SWA pages (`None`: as many as full pages, the null page excluded).
    pub swa_blocks: Option<usize>,
    /// Mamba state slots (`None`: as many as full pages).
    pub mamba_states: Option<usize>,
}

/// The radix-tree request cache: the request layer over [`RadixDesign`].
pub type RadixPrefixCache = PrefixCache<RadixDesign>;

impl RadixDesign {
    /// A design of `num_blocks` pages (page 0 is the null page) of
    /// `page_size` tokens, evicting tree leaves by `policy`.
    ///
    /// # Errors
    /// `InvalidArgument` for `page_size` outside `1..=2**20` or `num_blocks < 2`.
    pub fn new(num_blocks: usize, page_size: usize, policy: Policy, enable_events: bool) -> KvResult<Self> {
        let tree = RadixTree::new(page_size, policy, enable_events)?;
        let pool = PagePool::new(num_blocks)?;
        Ok(RadixDesign { tree, pool, page_size, evictions: 0, scratch: Vec::new(), hy: None })
    }

    /// A design whose tree holds `comps` beside full attention, over a full
    /// pool of `num_blocks` pages, an SWA pool and a Mamba state pool sized
    /// by `sizes` (module docs of [`crate::core::radix::pools`]).
    ///
    /// # Errors
    /// As [`RadixDesign::new`]; `InvalidArgument` for an SWA window of 0 or
    /// an empty component pool.
    pub fn with_components(
        num_blocks: usize,
        page_size: usize,
        policy: Policy,
        enable_events: bool,
        comps: Components,
        sizes: PoolSizes,
    ) -> KvResult<Self> {
        let mut d = Self::new(num_blocks, page_size, policy, enable_events)?;
        if !comps.any() {
            return Ok(d);
        }
        if sizes.swa_blocks.is_some_and(|n| n == 0 || n > num_blocks - 1) {
            return Err(KvError::invalid(format!(
                "swa_blocks must be in 1..=num_blocks - 1 ({}): every SWA page pairs with a full page",
                num_blocks - 1
            )));
        }
        d.tree = RadixTree::with_components(page_size, policy, enable_events, comps)?;
        let swa = match comps.swa_window {
            Some(w) => Some(SwaPool::new(w, sizes.swa_blocks.unwrap_or(num_blocks - 1), num_blocks)?),
            None => None,
        };
        let mamba =
            if comps.mamba { Some(MambaPool::new(sizes.mamba_states.unwrap_or(num_blocks))?) } else { None };
        d.hy = Some(Box::new(HyPools { swa, mamba, freed: HybridFreed::default() }));
        Ok(d)
    }

    /// The SWA pool, if the cache has one.
    #[must_use]
    pub fn swa_pool(&self) -> Option<&SwaPool> {
        self.hy.as_ref().and_then(|h| h.swa.as_ref())
    }

    /// The Mamba state pool, if the cache has one.
    #[must_use]
    pub fn mamba_pool(&self) -> Option<&MambaPool> {
        self.hy.as_ref().and_then(|h| h.mamba.as_ref())
    }

    /// Drops one holder from each page; a page left without holders frees
    /// its SWA page too.
    fn decref(&mut self, pages: &[PageId]) {
        self.pool.decref(pages);
        if let Some(swa) = self.hy.as_mut().and_then(|h| h.swa.as_mut()) {
            for &p in pages {
                if self.pool.ref_count(p) == 0 && swa.is_live(p) {
                    swa.release(&[p]);
                }
            }
        }
    }

    /// Hands out `n` pages (and their SWA pages) appended to `out`.
    fn alloc(&mut self, n: usize, out: &mut Vec<PageId>) {
        let start = out.len();
        self.pool.alloc(n, out);
        if let Some(swa) = self.hy.as_mut().and_then(|h| h.swa.as_mut()) {
            swa.take(&out[start..]);
        }
    }

    /// Applies the component frees the tree recorded (SWA pages, pages the
    /// tree gave back or took, Mamba states). Returns whether an insert
    /// ended on a node that already had a Mamba state.
    fn absorb(&mut self) -> bool {
        let Some(hy) = self.hy.as_mut() else { return false };
        let mut f = std::mem::take(&mut hy.freed);
        self.tree.take_hybrid_freed(&mut f);
        if let Some(swa) = hy.swa.as_mut() {
            swa.release(&f.swa);
            for &(m, t) in &f.swa_moved {
                swa.transfer(m, t);
            }
        }
        if let Some(mp) = hy.mamba.as_mut() {
            for &s in &f.mamba {
                mp.free(s);
            }
        }
        let exist = f.mamba_exist;
        // Pages the tree took from the caller get the tree's reference; the
        // pages it gave back (not the caller's, whose SWA it moved) lose it.
        self.pool.incref(&f.adopted);
        let given_back: Vec<PageId> =
            f.full_only.iter().copied().filter(|p| !f.swa_moved.iter().any(|&(m, _)| m == *p)).collect();
        self.decref(&given_back);
        f.clear();
        if let Some(hy) = self.hy.as_mut() {
            hy.freed = f;
        }
        exist
    }

    /// SWA pages free plus those the tree can free (`None` without SWA).
    fn swa_available(&self) -> Option<usize> {
        let swa = self.swa_pool()?;
        Some(swa.num_free() + self.tree.swa_sizes().0 / self.page_size)
    }

    /// Frees the SWA KV of `req`'s own pages that left its window (SGLang's
    /// `free_swa_out_of_window_slots` for a prefix-sharing cache): of a
    /// sequence of `pre_len` tokens, everything before the last
    /// `max(window, page)` tokens rounded up to pages, never the tree's
    /// prefix. O(1) unless pages leave the window.
    fn swa_trim(&mut self, req: &mut RecordOf<Self>, pre_len: usize) {
        let Some(swa) = self.hy.as_mut().and_then(|h| h.swa.as_mut()) else { return };
        let (w, ps) = (swa.window(), self.page_size);
        let ev = req.ext.swa_evicted;
        if pre_len < w.saturating_add(ev).saturating_add(1) {
            return;
        }
        let ev = ev.max(req.ext.cached);
        req.ext.swa_evicted = ev;
        let keep = w.max(ps).div_ceil(ps) * ps;
        let new = ev.max(pre_len.saturating_sub(keep)) / ps * ps;
        if new > ev {
            let hi = (new / ps).min(req.blocks.len());
            let lo = (ev / ps).min(hi);
            swa.release(&req.blocks[lo..hi]);
            req.ext.swa_evicted = new;
        }
    }

    /// A Mamba state for a running request: a free one, else one evicted
    /// from the tree; `None` when every state is held (or no Mamba).
    fn mamba_slot(&mut self) -> Option<u32> {
        let hy = self.hy.as_mut()?;
        let mp = hy.mamba.as_mut()?;
        if let Some(s) = mp.alloc() {
            return Some(s);
        }
        let mut freed = std::mem::take(&mut self.scratch);
        freed.clear();
        self.tree.evict_mamba(1, &mut freed);
        self.evictions += freed.len() as u64;
        self.decref(&freed);
        self.scratch = freed;
        self.absorb();
        self.hy.as_mut()?.mamba.as_mut()?.alloc()
    }

    /// Returns a request's Mamba state to the pool.
    fn free_mamba(&mut self, s: Option<u32>) {
        if let (Some(s), Some(mp)) = (s, self.hy.as_mut().and_then(|h| h.mamba.as_mut())) {
            mp.free(s);
        }
    }

    /// The page-aligned query a prompt of `n` tokens may hit.
    fn hit_cap(&self, n: usize) -> usize {
        n.saturating_sub(1) / self.page_size * self.page_size
    }

    /// Pages available to new work: free ones plus those evictable from the
    /// tree (held by no running request). O(1).
    fn num_free_blocks(&self) -> usize {
        let full = self.pool.num_free() + self.tree.evictable_size() / self.page_size;
        match self.swa_available() {
            Some(swa) => full.min(swa),
            None => full,
        }
    }

    /// Evicts tree leaves until `need` pages are free. The caller checked
    /// that free + evictable pages cover `need`. O(log L) per leaf.
    fn ensure_free(&mut self, need: usize) {
        if self.hy.is_some() {
            self.ensure_full(need);
            self.ensure_swa(need);
            return;
        }
        self.ensure_full(need);
    }

    /// Evicts tree leaves until `need` full pages are free.
    fn ensure_full(&mut self, need: usize) {
        let free = self.pool.num_free();
        if free >= need {
            return;
        }
        self.evict_with((need - free) * self.page_size, RadixTree::evict);
        assert!(self.pool.num_free() >= need, "evictable tree pages are held by the tree alone");
    }

    /// Evicts tree SWA KV until `need` SWA pages are free (the caller
    /// checked [`RadixDesign::swa_available`]). O(1) without SWA.
    fn ensure_swa(&mut self, need: usize) {
        let Some(free) = self.swa_pool().map(ComponentPool::num_free) else { return };
        if free >= need {
            return;
        }
        self.evict_with((need - free) * self.page_size, RadixTree::evict_swa);
    }

    /// Runs one of the tree's evictions for `tokens` tokens and returns the
    /// pages it freed to the pools.
    fn evict_with(
        &mut self,
        tokens: usize,
        evict: impl FnOnce(&mut RadixTree, usize, &mut Vec<PageId>) -> usize,
    ) {
        let mut freed = std::mem::take(&mut self.scratch);
        freed.clear();
        evict(&mut self.tree, tokens, &mut freed);
        self.evictions += freed.len() as u64;
        self.decref(&freed);
        self.scratch = freed;
        self.absorb();
    }

    /// Inserts the full pages of a request (of its first `upto` tokens, at
    /// most its table) into the tree; the tree takes a reference on the
    /// pages it adopts. Returns the full-page token count.
    fn insert_request(&mut self, tokens: &[i32], pages: &[PageId], ns: Option<&str>, upto: usize) -> usize {
        let ps = self.page_size;
        let full = (upto.min(tokens.len()) / ps).min(pages.len());
        let mut dups = std::mem::take(&mut self.scratch);
        dups.clear();
        let prefix = self
            .tree
            .insert(&tokens[..full * ps], &pages[..full], ns, 0, &[], &mut dups)
            .expect("a request's pages are its own or the tree's at the same positions");
        self.scratch = dups;
        self.pool.incref(&pages[prefix / ps..full]);
        full * ps
    }

    /// Inserts a running request's full pages (of its first `upto` tokens)
    /// now; see [`RadixPrefixCache::checkpoint`].
    #[inline]
    fn checkpoint(&mut self, req: &mut RecordOf<Self>, upto: usize) {
        let upto = upto.min(req.ext.visible);
        // Most steps complete no page: no call, no division then.
        if upto.min(req.tokens.len()) >= req.ext.cached + self.page_size {
            self.checkpoint_pages(req, upto);
        }
    }

    /// Inserts the first `n` tokens' pages of `req` (page-aligned, at most
    /// its table) into a hybrid tree with the request's SWA boundary and
    /// Mamba state `mamba`; the tree takes a reference on the pages it
    /// adopts, and `mamba` when it keeps it (else it returns to the pool).
    /// `None` (nothing changed, `mamba` freed) when the tree refuses.
    fn insert_hybrid_request(&mut self, req: &RecordOf<Self>, n: usize, mamba: Option<u32>) -> Option<usize> {
        let ps = self.page_size;
        let needs_state = self.tree.components().mamba;
        if needs_state && mamba.is_none() {
            return None;
        }
        let opts = InsertOpts { swa_evicted: req.ext.swa_evicted.min(n) / ps * ps, mamba, inserted_len: 0 };
        let mut dups = std::mem::take(&mut self.scratch);
        dups.clear();
        let r = self.tree.insert_hybrid(
            &req.tokens[..n],
            &req.blocks[..n / ps],
            req.ext.ns.as_deref(),
            0,
            &[],
            &mut dups,
            &opts,
        );
        self.scratch = dups;
        let Ok(prefix) = r else {
            self.free_mamba(mamba);
            return None;
        };
        self.pool.incref(&req.blocks[prefix / ps..n / ps]);
        if self.absorb() {
            self.free_mamba(mamba);
        }
        Some(prefix)
    }

    /// [`RadixDesign::checkpoint_pages`] on a hybrid tree: the request's
    /// Mamba state is forked for the tree (a checkpoint waits when no state
    /// can be had).
    fn checkpoint_hybrid(&mut self, req: &mut RecordOf<Self>, n: usize) {
        let fork = if self.tree.components().mamba {
            match self.mamba_slot() {
                Some(s) => Some(s),
                None => return,
            }
        } else {
            None
        };
        if self.insert_hybrid_request(req, n, fork).is_none() {
            return;
        }
        self.adopt_tree_pages(req, n);
    }

    /// After an insert of `req`'s first `n` tokens: its pages that duplicate
    /// the tree's become the tree's, its lock moves to the matched node.
    fn adopt_tree_pages(&mut self, req: &mut RecordOf<Self>, n: usize) {
        let mut tree_pages = std::mem::take(&mut self.scratch);
        tree_pages.clear();
        let m = self.tree.match_prefix(&req.tokens[..n], req.ext.ns.as_deref(), &mut tree_pages);
        for (mine, &theirs) in req.blocks.iter_mut().zip(&tree_pages) {
            if *mine != theirs {
                self.pool.incref(&[theirs]);
                let old = std::mem::replace(mine, theirs);
                self.scratch.clear();
                self.scratch.push(old);
                let one = std::mem::take(&mut self.scratch);
                self.decref(&one);
                self.scratch = one;
            }
        }
        self.scratch = tree_pages;
        if m.len > req.ext.cached || self.hy.is_none() {
            self.tree.lock(m.node);
            self.tree.unlock(req.ext.node).expect("a request holds its lock");
            req.ext.node = m.node;
            req.ext.cached = m.len;
        }
        req.ext.swa_evicted = req.ext.swa_evicted.max(req.ext.cached);
    }

    /// [`RadixDesign::checkpoint`] once a page may have filled.
    #[inline(never)]
    fn checkpoint_pages(&mut self, req: &mut RecordOf<Self>, upto: usize) {
        let ps = self.page_size;
        let cached = req.ext.cached;
        let n = (upto.min(req.tokens.len()) / ps).min(req.blocks.len()) * ps;
        if n <= cached {
            return;
        }
        if self.hy.is_some() {
            self.checkpoint_hybrid(req, n);
            return;
        }
        // The common case (a chunk or decode pages past the request's own
        // locked leaf): one new leaf under it, the lock moved down, O(new).
        let pages = &req.blocks[cached / ps..n / ps];
        let ns = req.ext.ns.as_deref();
        if let Some(leaf) = self.tree.extend_locked(req.ext.node, ns, &req.tokens[cached..n], pages) {
            self.pool.incref(pages);
            req.ext.node = leaf;
            req.ext.cached = n;
            return;
        }
        let full_tokens = self.insert_request(&req.tokens, &req.blocks, req.ext.ns.as_deref(), upto);
        if full_tokens > req.ext.cached {
            let mut tree_pages = std::mem::take(&mut self.scratch);
            tree_pages.clear();
            let m =
                self.tree.match_prefix(&req.tokens[..full_tokens], req.ext.ns.as_deref(), &mut tree_pages);
            assert_eq!(m.len, full_tokens, "the request's full pages were just inserted");
            for (mine, &theirs) in req.blocks.iter_mut().zip(&tree_pages) {
                if *mine != theirs {
                    self.pool.incref(&[theirs]);
                    self.pool.decref(&[*mine]);
                    *mine = theirs;
                }
            }
            self.scratch = tree_pages;
            self.tree.lock(m.node);
            self.tree.unlock(req.ext.node).expect("a request holds its lock");
            req.ext.node = m.node;
            req.ext.cached = full_tokens;
        }
    }

    /// Probes `tokens` (cut to `num_tokens - 1`, page-aligned; nothing with
    /// `skip_reading`). Changes nothing, not even recency.
    fn plan(&mut self, tokens: Vec<i32>, ns: Option<String>, skip_reading: bool) -> RadixPlan {
        let cap = if skip_reading { 0 } else { self.hit_cap(tokens.len()) };
        let probe = self.tree.probe(&tokens[..cap], ns.as_deref());
        RadixPlan {
            tokens,
            ns,
            cap,
            hit: probe.len,
            lockable: probe.lockable,
            swa_lockable: probe.swa_lockable,
            mamba_lockable: probe.mamba_lockable,
            pages: Vec::new(),
        }
    }

    /// Evicts unlocked tree leaves; see [`RadixPrefixCache::evict`].
    fn evict(&mut self, num_tokens: usize) -> usize {
        let mut freed = std::mem::take(&mut self.scratch);
        freed.clear();
        let n = self.tree.evict(num_tokens, &mut freed);
        self.evictions += freed.len() as u64;
        self.decref(&freed);
        self.scratch = freed;
        self.absorb();
        n
    }
}

impl RadixDesign {
    /// [`PrefixDesign::release`] on a hybrid tree: with `insert`, the
    /// sequence's full pages enter the tree with the request's SWA boundary
    /// and its Mamba state (donated: the tree keeps it unless the node
    /// already had one); the request's state returns to the pool otherwise.
    fn release_hybrid(&mut self, req: &mut RecordOf<Self>, insert: bool) {
        let mamba = req.ext.mamba.take();
        if insert {
            let ps = self.page_size;
            let n = (req.life.num_computed.min(req.tokens.len()) / ps).min(req.blocks.len()) * ps;
            if n > 0 {
                self.insert_hybrid_request(req, n, mamba);
            } else {
                self.free_mamba(mamba);
            }
        } else {
            self.free_mamba(mamba);
        }
        self.tree.unlock(req.ext.node).expect("a request holds its lock");
        let blocks = std::mem::take(&mut req.blocks);
        self.decref(&blocks);
        req.blocks = blocks;
        req.blocks.clear();
        req.ext.node = NodeId::ROOT;
        req.ext.cached = 0;
        req.ext.visible = 0;
        req.ext.swa_evicted = 0;
    }

    /// The component pools' invariants: the SWA pool's own, every live tree
    /// page holding its SWA page, each request's freed positions of its own
    /// pages holding none; every Mamba state held once (tree or request).
    fn check_components(&self, reqs: &[&RecordOf<Self>]) -> Result<(), InvariantViolation> {
        let Some(hy) = &self.hy else { return Ok(()) };
        let ps = self.page_size;
        if let Some(swa) = &hy.swa {
            swa.check_invariants(|p| self.pool.ref_count(p) > 0)?;
            let mut live = Vec::new();
            self.tree.swa_live_values(&mut live);
            for p in &live {
                ensure_inv!(swa.is_live(*p), "page {} of a live SWA node has no SWA page", p.0);
            }
            let mut in_tree = Vec::new();
            self.tree.all_values(&mut in_tree);
            let in_tree: rustc_hash::FxHashSet<PageId> = in_tree.into_iter().collect();
            for r in reqs {
                let hi = (r.ext.swa_evicted / ps).min(r.blocks.len());
                let lo = (r.ext.cached / ps).min(hi);
                for p in &r.blocks[lo..hi] {
                    ensure_inv!(
                        in_tree.contains(p) || !swa.is_live(*p),
                        "request {}: page {} left its window but holds its SWA page",
                        r.id.0,
                        p.0
                    );
                }
            }
        }
        if let Some(mp) = &hy.mamba {
            let mut holders = Vec::new();
            self.tree.mamba_states(&mut holders);
            holders.extend(reqs.iter().filter_map(|r| r.ext.mamba));
            mp.check_invariants(&holders)?;
        }
        Ok(())
    }
}

impl Reads<i32> for RadixDesign {
    #[inline]
    fn extend_tokens(dst: &mut Vec<i32>, src: &[i32]) {
        dst.extend_from_slice(src);
    }

    fn lookup(&mut self, tokens: &[i32], spec: &KeySpec) -> KvResult<usize> {
        let ns = namespace(spec)?;
        let cap = self.hit_cap(tokens.len());
        Ok(self.tree.probe(&tokens[..cap], ns.as_deref()).len)
    }

    /// Probes the prompt (cut to `num_tokens - 1`, page-aligned; nothing with
    /// `skip_reading`) and checks that free plus evictable pages, less the
    /// evictable pages the hit would lock, cover the rest. Changes nothing,
    /// not even recency.
    fn plan_admit(
        &mut self,
        _id: RequestId,
        tokens: &[i32],
        spec: Cow<'_, KeySpec>,
        skip_reading: bool,
    ) -> KvResult<RadixPlan> {
        let ns = namespace(&spec)?;
        // Buffers sized by the caller's prompt are reserved fallibly (a prompt
        // too large for memory is a `Capacity` error, not an abort).
        let mut owned = Vec::new();
        try_reserve(&mut owned, tokens.len(), "a copy of the prompt")?;
        owned.extend_from_slice(tokens);
        let mut pages = Vec::new();
        try_reserve(&mut pages, tokens.len().div_ceil(self.page_size) + 1, "the prompt's page table")?;
        let mut plan = self.plan(owned, ns, skip_reading);
        plan.pages = pages;
        Ok(plan)
    }
}

impl PrefixDesign for RadixDesign {
    type Tok = i32;
    type Entry = PageId;
    type Ext = RadixState;
    type Plan = RadixPlan;

    const UNIT: &'static str = "pages";

    #[inline]
    fn block_size(&self) -> usize {
        self.page_size
    }

    fn num_blocks(&self) -> usize {
        self.pool.num_pages()
    }

    /// The full pool's usable pages, or the SWA pool's when smaller (every
    /// page of a prompt takes an SWA page until it leaves the window).
    fn usable_blocks(&self) -> usize {
        let full = self.pool.num_pages() - 1;
        self.swa_pool().map_or(full, |s| full.min(s.capacity()))
    }

    fn usable_what(&self) -> &'static str {
        match self.swa_pool() {
            Some(s) if s.capacity() < self.pool.num_pages() - 1 => "swa_blocks",
            _ => "num_blocks - 1",
        }
    }

    #[inline]
    fn num_available(&self) -> usize {
        self.num_free_blocks()
    }

    fn plan_hit(&self, plan: &RadixPlan) -> usize {
        plan.hit
    }

    /// Free plus evictable pages, less the evictable pages the hit would lock.
    fn available_after(&self, plan: &RadixPlan) -> usize {
        let full = self.pool.num_free() + (self.tree.evictable_size() - plan.lockable) / self.page_size;
        if self.hy.is_none() {
            return full;
        }
        let mut avail = full;
        if let Some(swa) = self.swa_pool() {
            let tree = self.tree.swa_sizes().0.saturating_sub(plan.swa_lockable);
            avail = avail.min(swa.num_free() + tree / self.page_size);
        }
        if let Some(mp) = self.mamba_pool() {
            // The request takes one state: none obtainable refuses it.
            let tree = self.tree.mamba_sizes().0 - usize::from(plan.mamba_lockable);
            if mp.num_free() + tree == 0 {
                return 0;
            }
        }
        avail
    }

    fn plan_resume(&mut self, req: &RecordOf<Self>) -> RadixPlan {
        self.plan(req.tokens.clone(), req.ext.ns.as_deref().map(String::from), req.life.skip_reading)
    }

    /// Matches and locks the hit path, references its pages and allocates
    /// `need` more (evicting unlocked leaves for the shortfall).
    fn commit(&mut self, plan: RadixPlan, need: usize) -> Admitted<i32, PageId, RadixState> {
        let RadixPlan { tokens, ns, cap, hit, mut pages, .. } = plan;
        pages.reserve(tokens.len().div_ceil(self.page_size) + 1);
        let m = self.tree.match_prefix(&tokens[..cap], ns.as_deref(), &mut pages);
        assert_eq!(m.len, hit, "match hits what the probe saw");
        self.tree.lock(m.node);
        self.pool.incref(&pages);
        self.ensure_free(need);
        self.alloc(need, &mut pages);
        let mamba = if self.hy.is_some() { self.mamba_slot() } else { None };
        let ext = RadixState {
            ns: ns.map(Into::into),
            node: m.node,
            cached: m.len,
            visible: m.len,
            swa_evicted: 0,
            mamba,
        };
        Admitted { tokens, blocks: pages, ext, hit_tokens: m.len }
    }

    #[inline]
    fn allocate(&mut self, n: usize, table: &mut Vec<PageId>) {
        self.ensure_free(n);
        self.alloc(n, table);
    }

    /// Today's calls: nothing enters the tree while a request runs (unless
    /// checkpointed); every known id is computed, so all of them may be.
    #[inline]
    fn appended(&mut self, req: &mut RecordOf<Self>, _had_full: usize) {
        // SGLang frees out-of-window SWA pages at each decode step, from the
        // sequence length before the step (an admission frees none).
        let pre = std::mem::replace(&mut req.ext.visible, req.tokens.len());
        if self.hy.is_some() {
            self.swa_trim(req, pre);
        }
    }

    #[inline]
    fn tokens_added(&mut self, _req: &mut RecordOf<Self>) {}

    /// SGLang's per-chunk `cache_unfinished_req`, at the moment vLLM caches:
    /// the full pages of the first `upto` tokens enter the tree, the
    /// request's duplicates switch to the tree's pages, its lock moves down.
    #[inline]
    fn cache_to(&mut self, req: &mut RecordOf<Self>, upto: usize) {
        let pre = req.ext.visible;
        req.ext.visible = req.ext.visible.max(upto);
        self.checkpoint(req, upto);
        if self.hy.is_some() {
            self.swa_trim(req, pre);
        }
    }

    /// With `insert` (today's `free`), inserts the sequence's full pages
    /// first; then unlocks the request's path and drops its page
    /// references: duplicates of pages the tree already had and pages it
    /// never adopted return to the pool.
    fn release(&mut self, req: &mut RecordOf<Self>, insert: bool) {
        if self.hy.is_some() {
            self.release_hybrid(req, insert);
            return;
        }
        if insert {
            let upto = req.life.num_computed;
            self.insert_request(&req.tokens, &req.blocks, req.ext.ns.as_deref(), upto);
        }
        self.tree.unlock(req.ext.node).expect("a request holds its lock");
        self.pool.decref(&req.blocks);
        req.blocks.clear();
        req.ext.node = NodeId::ROOT;
        req.ext.cached = 0;
        req.ext.visible = 0;
    }

    /// Drops the whole tree (its pages return to the pool, in id order).
    fn reset(&mut self) -> KvResult<()> {
        let mut freed = Vec::new();
        self.tree.reset_sorted(&mut freed); // pages return to the pool in id order
        self.decref(&freed);
        self.absorb();
        Ok(())
    }

    fn events(&self) -> &Events {
        self.tree.events()
    }

    fn events_mut(&mut self) -> &mut Events {
        self.tree.events_mut()
    }

    fn evictions(&self) -> u64 {
        self.evictions
    }

    fn clear_evictions(&mut self) {
        self.evictions = 0;
    }

    #[inline]
    fn ref_count(&self, b: PageId) -> u32 {
        self.pool.ref_count(b)
    }

    /// The tree holds the pages of a request's locked path.
    fn holds(&self, req: &RecordOf<Self>, i: usize) -> bool {
        i < req.ext.cached / self.page_size
    }

    fn check_invariants(&self, reqs: &[&RecordOf<Self>], refs: &mut [u32]) -> Result<(), InvariantViolation> {
        self.tree.check_invariants()?;
        self.pool.check_invariants()?;
        let ps = self.page_size;
        let mut tree_pages = Vec::new();
        self.tree.all_values(&mut tree_pages);
        for p in &tree_pages {
            ensure_inv!(
                *p != PageId::NULL && p.idx() < refs.len(),
                "tree holds page {} (null or out of range)",
                p.0
            );
            refs[p.idx()] += 1;
        }
        let mut locks = 0u64;
        let mut path = Vec::new();
        for r in reqs {
            let (id, st, n) = (r.id, &r.ext, r.tokens.len());
            ensure_inv!(
                st.cached.is_multiple_of(ps) && st.cached <= n,
                "request {}: cached {} of {n}",
                id.0,
                st.cached
            );
            ensure_inv!(
                self.tree.path_len(st.node) == st.cached,
                "request {}: locked path is not its cached prefix",
                id.0
            );
            path.clear();
            self.tree.path_values(st.node, &mut path);
            ensure_inv!(
                path[..] == r.blocks[..st.cached / ps],
                "request {}: hit pages differ from the tree's",
                id.0
            );
            locks += u64::from(st.node != NodeId::ROOT);
        }
        ensure_inv!(
            self.tree.num_own_locks() == locks,
            "tree holds {} locks, requests {locks}",
            self.tree.num_own_locks()
        );
        self.check_components(reqs)
    }
}

impl RadixPrefixCache {
    /// A cache of `num_blocks` pages (page 0 is the null page) of `page_size`
    /// tokens, evicting tree leaves by `policy`.
    ///
    /// # Errors
    /// `InvalidArgument` for `page_size` outside `1..=2**20` or `num_blocks < 2`.
    pub fn new(num_blocks: usize, page_size: usize, policy: Policy, enable_events: bool) -> KvResult<Self> {
        Ok(PrefixCache::with_design(RadixDesign::new(num_blocks, page_size, policy, enable_events)?))
    }

    /// A cache whose tree holds `comps` (sliding-window and Mamba
    /// components, SGLang's unified tree) over a full pool of `num_blocks`
    /// pages, an SWA pool and a Mamba state pool sized by `sizes`; with no
    /// component it is [`RadixPrefixCache::new`].
    ///
    /// # Errors
    /// As [`RadixPrefixCache::new`]; `InvalidArgument` for an SWA window of
    /// 0 or an empty component pool.
    pub fn with_components(
        num_blocks: usize,
        page_size: usize,
        policy: Policy,
        enable_events: bool,
        comps: Components,
        sizes: PoolSizes,
    ) -> KvResult<Self> {
        Ok(PrefixCache::with_design(RadixDesign::with_components(
            num_blocks,
            page_size,
            policy,
            enable_events,
            comps,
            sizes,
        )?))
    }

    /// The SWA pool, if the cache has one (read-only introspection).
    #[must_use]
    pub fn swa_pool(&self) -> Option<&SwaPool> {
        self.design().swa_pool()
    }

    /// The Mamba state pool, if the cache has one (read-only introspection).
    #[must_use]
    pub fn mamba_pool(&self) -> Option<&MambaPool> {
        self.design().mamba_pool()
    }

    /// The tree (read-only introspection).
    #[must_use]
    pub fn tree(&self) -> &RadixTree {
        &self.design().tree
    }

    /// The pool (read-only introspection).
    #[must_use]
    pub fn pool(&self) -> &PagePool {
        &self.design().pool
    }

    /// Tokens per page (= block size). O(1).
    #[must_use]
    pub fn page_size(&self) -> usize {
        self.design().page_size
    }

    /// Pages available to new work: free ones plus those evictable from the
    /// tree (held by no running request). O(1).
    #[must_use]
    pub fn num_free_blocks(&self) -> usize {
        self.design().num_free_blocks()
    }

    /// Fraction of usable pages held by running requests. O(1).
    #[must_use]
    pub fn usage(&self) -> f64 {
        #[allow(clippy::cast_precision_loss)]
        let u = 1.0 - self.num_free_blocks() as f64 / (self.pool().num_pages() - 1) as f64;
        u
    }

    /// Inserts request `id`'s full pages into the tree now (SGLang
    /// `cache_unfinished_req`): later requests can hit them while it runs.
    /// The request's pages that duplicate the tree's are swapped for the
    /// tree's (and freed), and its lock moves to the new last node.
    /// Only the pages the hash chain would have cached by now are inserted:
    /// of the positions up to the request's last step, those whose ids were
    /// known then (a page a commit completes waits for the next `schedule`,
    /// as vLLM caches it), and nothing of a `delay_cache` admission before
    /// `finish_transfer` (its external pages hold no KV yet).
    /// O(sequence + pages).
    ///
    /// # Errors
    /// `UnknownRequest`.
    pub fn checkpoint(&mut self, id: RequestId) -> KvResult<()> {
        let (design, req) = self.get_mut(id)?;
        let upto = req.life.num_computed;
        design.checkpoint(req, upto);
        Ok(())
    }

    /// Evicts unlocked tree leaves (policy order) until `num_tokens` tokens
    /// are freed or nothing is evictable; their pages return to the pool.
    /// Returns the tokens evicted. O(log L + pages) per leaf.
    pub fn evict(&mut self, num_tokens: usize) -> usize {
        self.design_mut().evict(num_tokens)
    }

    /// Tokens a prompt would hit now, for int32 or int64 token arrays (an
    /// int64 query is compared in place, no narrowed copy). O(prompt tokens).
    ///
    /// # Errors
    /// `InvalidArgument` for a token id outside int32 (the caches' token
    /// rule) or a key spec with multimodal items.
    pub fn lookup_tokens<T: Token>(&mut self, tokens: &[T], spec: &KeySpec) -> KvResult<usize> {
        let ns = namespace(spec);
        let d = self.design_mut();
        let cap = d.hit_cap(tokens.len());
        let hit = match &ns {
            Ok(ns) => d.tree.probe(&tokens[..cap], ns.as_deref()).len,
            Err(_) => 0,
        };
        // The caches' token rule (every id fits in int32), as admission
        // applies it, and checked first as there. The hit's ids equal the
        // tree's int32 keys, so only the rest needs the range check (one
        // pass over the prompt in all).
        T::check_ids(&tokens[hit..])?;
        ns?;
        Ok(hit)
    }

    /// Leading tokens of request `id` served by (locked) tree pages.
    ///
    /// # Errors
    /// `UnknownRequest`.
    pub fn num_cached_tokens(&self, id: RequestId) -> KvResult<usize> {
        Ok(self.get(id)?.ext.cached)
    }
}
