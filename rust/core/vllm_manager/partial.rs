//! Partial-block prefix entries: vLLM 0.33's `BlockPool.cache_partial_block`
//! as `FullAttentionManager` uses it for a prompt that ends inside a block
//! of a full-attention group whose block is larger than the hash block
//! (`_cache_partial_tail_block`).
//!
//! After each caching call such a group registers the request's last hash
//! boundary inside its prompt (`num_prompt - 1` tokens, `num_prompt` under
//! EAGLE, rounded down to the hash block and capped at the request's
//! hashes) when it lies inside a block (not on a block edge), at most the
//! group's cacheable tokens, in a block the table holds (not a null). The
//! entry's key is the request hash at that boundary under the group's key.
//! - a block with no hash takes it as its own hash (a *partial* hash:
//!   [`VllmManager::hash_tokens`] is the boundary, not a block edge);
//! - a block whose hash covers fewer tokens loses every key it has (each
//!   logged as removed) and takes it as its own hash;
//! - a block whose hash covers more tokens keeps it, and the entry is an
//!   *extra key* of the block, kept here beside the pool.
//!
//! A block whose partial hash is followed by a full caching of that block
//! (the request computed past its edge) loses all its keys first (vLLM's
//! partial-to-full promotion). Any loss of a block's hash (an eviction on
//! reuse, `evict_blocks`, a reset, a promotion) drops its extra keys too,
//! logged after its own hash; a [`VllmManager::pop_cached_key`] drops one
//! key silently.
//!
//! Under partial hash hits ([`GroupLayout::partial_hits`]) lookups read
//! these keys at hash boundaries inside blocks ([`super::cow`] copies such a
//! hit's last block); otherwise hits are block-aligned and the keys are what
//! vLLM's pool holds and reports (`BlockStored` / `BlockRemoved` of block
//! size `hash_block_size`, `get_cached_block`). Align-mode Mamba groups
//! larger than the hash block register the prompt's last hash boundary too
//! ([`super::cow`] has their rule).
//!
//! Within one block the boundary fixes the key: a block holds the same
//! prefix for every request that holds it, so a registered boundary is
//! known without the request's hashes ([`VllmManager::tail_plan`] reads none
//! on the steps after the first).
//!
//! A key held by several blocks answers the first registered still holding
//! it, as vLLM's map does: each registration (own or extra) takes a sequence
//! number.
//!
//! # Invariants (checked by [`PartialEntries::check`])
//! - `holders[k]` lists exactly the blocks whose extra keys include `k`,
//!   each once, in registration order; no key is listed twice on a block,
//!   and none is the block's own hash;
//! - only groups that register prompt tails (full attention or align-mode
//!   Mamba, block larger than the hash block, prefix-cacheable) own extra
//!   keys;
//! - an extra key's sequence number is below the registration counter.
//!
//! # Costs
//! Nothing on layouts without such a group. With one: per caching call
//! O(such groups) arithmetic; a registration reads one request hash; an
//! eviction of a block with extra keys O(its keys); evictions of other
//! blocks one emptiness check.

use rustc_hash::FxHashMap;

use super::runs::{CachedRun, Stored};
use super::{group_key, owner_word, unkey_owned, VllmManager};
use crate::core::block_pool::BlockPool;
use crate::core::error::{ErrorKind, InvariantViolation, KvError, KvResult};
use crate::core::groups::coordinator;
use crate::core::groups::spec::GroupLayout;
use crate::core::ids::{BlockHash, BlockId};
use crate::ensure_inv;

/// One extra key: the pool key, its owner word, the tokens it covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ExtraKey {
    pub(crate) key: BlockHash,
    pub(crate) owner: u32,
    pub(crate) tokens: u32,
    /// When it was registered ([`PartialEntries::next_seq`]).
    pub(crate) seq: u64,
}

/// The partial entries' state (module header).
#[derive(Clone, Debug, Default)]
pub(crate) struct PartialEntries {
    /// Full-attention groups that register prompt tails, ascending.
    groups: Vec<usize>,
    /// Align-mode Mamba groups that register prompt tails (under partial
    /// hash hits), ascending.
    mamba: Vec<usize>,
    /// vLLM's `shared_prefix_checkpoint`: Mamba tails register at the
    /// shared-prefix junction too.
    shared_checkpoint: bool,
    /// Per block: its extra keys, oldest first.
    by_block: FxHashMap<BlockId, Vec<ExtraKey>>,
    /// Per key: the blocks holding it as an extra key, oldest first.
    holders: FxHashMap<BlockHash, Vec<BlockId>>,
    /// Registrations so far: orders the holders of one key across own hashes
    /// and extra keys, as vLLM's map answers the first registered.
    counter: u64,
    /// Per block whose own hash is a prompt tail's entry: when it was
    /// registered (stale once the block's hash changed; read only for keys
    /// that also have extra holders, which only prompt tails can be).
    own_seq: FxHashMap<BlockId, u64>,
}

impl PartialEntries {
    /// The groups of `layout` that register prompt tails.
    pub(crate) fn new(layout: &GroupLayout) -> Self {
        let hbs = layout.hash_block_size();
        let groups = if layout.enable_caching() {
            (0..layout.len())
                .filter(|&g| {
                    let s = layout.groups()[g];
                    s.kind.is_full() && s.kind.prefix_cacheable() && s.block_size > hbs
                })
                .collect()
        } else {
            Vec::new()
        };
        let mamba = super::cow::mamba_tail_groups(layout);
        PartialEntries { groups, mamba, ..PartialEntries::default() }
    }

    /// Whether any group registers prompt tails.
    pub(crate) fn active(&self) -> bool {
        !self.groups.is_empty() || !self.mamba.is_empty()
    }

    /// Makes align-mode Mamba groups `groups` register prompt tails and
    /// checkpoints too.
    pub(crate) fn add_mamba_groups(&mut self, groups: &[usize]) {
        for &g in groups {
            if !self.mamba.contains(&g) {
                self.mamba.push(g);
            }
        }
        self.mamba.sort_unstable();
    }

    /// Whether group `g` registers prompt tails.
    fn registers(&self, g: usize) -> bool {
        self.groups.contains(&g) || self.mamba.contains(&g)
    }

    /// Whether no block holds an extra key.
    pub(crate) fn is_empty(&self) -> bool {
        self.by_block.is_empty()
    }

    /// Extra keys no block holds as its own hash (vLLM counts a key once).
    fn distinct_extra_keys(&self, pool: &BlockPool) -> usize {
        self.holders.keys().filter(|k| pool.get_cached(k).is_none()).count()
    }

    /// Whether block `b` holds `key` as an extra key.
    pub(crate) fn holds(&self, key: &BlockHash, b: BlockId) -> bool {
        self.by_block.get(&b).is_some_and(|v| v.iter().any(|e| e.key == *key))
    }

    /// The next registration's sequence number.
    fn next_seq(&mut self) -> u64 {
        self.counter += 1;
        self.counter
    }

    /// Notes that block `b` took a prompt tail's entry as its own hash now.
    fn own_registered(&mut self, b: BlockId) {
        let s = self.next_seq();
        self.own_seq.insert(b, s);
    }

    /// The block vLLM's map answers for `key`, given `own`, the pool's first
    /// block holding it as its own hash: the earlier registered of `own` and
    /// the first extra holder.
    pub(crate) fn resolve(&self, key: &BlockHash, own: Option<BlockId>) -> Option<BlockId> {
        let Some(&extra) = self.holders.get(key).and_then(|v| v.first()) else { return own };
        let Some(own) = own else { return Some(extra) };
        let extra_seq =
            self.by_block.get(&extra).and_then(|v| v.iter().find(|e| e.key == *key)).map_or(0, |e| e.seq);
        let own_seq = self.own_seq.get(&own).copied().unwrap_or(0);
        Some(if extra_seq < own_seq { extra } else { own })
    }

    /// Whether block `b` holds an extra key covering `tokens`.
    fn holds_tokens(&self, b: BlockId, tokens: u32) -> bool {
        self.by_block.get(&b).is_some_and(|v| v.iter().any(|e| e.tokens == tokens))
    }

    fn add(&mut self, b: BlockId, e: ExtraKey) {
        self.by_block.entry(b).or_default().push(e);
        self.holders.entry(e.key).or_default().push(b);
    }

    fn unlist(&mut self, key: &BlockHash, b: BlockId) {
        if let Some(v) = self.holders.get_mut(key) {
            v.retain(|&x| x != b);
            if v.is_empty() {
                self.holders.remove(key);
            }
        }
    }

    /// Drops block `b`'s extra keys, appending them (oldest first) to `out`.
    pub(crate) fn take_block(&mut self, b: BlockId, out: Option<&mut Vec<(BlockHash, u32)>>) {
        if self.by_block.is_empty() {
            return;
        }
        let Some(keys) = self.by_block.remove(&b) else { return };
        for e in &keys {
            self.unlist(&e.key, b);
        }
        if let Some(out) = out {
            out.extend(keys.iter().map(|e| (e.key, e.owner)));
        }
    }

    /// Drops one extra key of block `b`; whether it held it.
    fn remove_one(&mut self, key: &BlockHash, b: BlockId) -> bool {
        let Some(v) = self.by_block.get_mut(&b) else { return false };
        let Some(i) = v.iter().position(|e| e.key == *key) else { return false };
        v.remove(i);
        if v.is_empty() {
            self.by_block.remove(&b);
        }
        self.unlist(key, b);
        true
    }

    /// Drops every extra key.
    pub(crate) fn clear(&mut self) {
        self.by_block.clear();
        self.holders.clear();
        self.own_seq.clear();
    }

    /// Checks the module header's invariants against the pool.
    pub(crate) fn check(&self, pool: &BlockPool) -> Result<(), InvariantViolation> {
        let mut listed = 0;
        for (&b, keys) in &self.by_block {
            ensure_inv!(!keys.is_empty(), "block {} has an empty extra-key list", b.0);
            for (i, e) in keys.iter().enumerate() {
                let g = (e.owner & 0xffff) as usize;
                ensure_inv!(self.registers(g), "block {} holds an extra key of group {g}", b.0);
                ensure_inv!(e.seq <= self.counter, "block {}'s extra key was registered in the future", b.0);
                ensure_inv!(
                    !keys[..i].iter().any(|x| x.key == e.key),
                    "block {} holds one extra key twice",
                    b.0
                );
                ensure_inv!(pool.block_hash(b) != Some(e.key), "block {}'s extra key is its own hash", b.0);
                ensure_inv!(
                    self.holders.get(&e.key).is_some_and(|v| v.iter().filter(|&&x| x == b).count() == 1),
                    "block {}'s extra key is not listed once under the key",
                    b.0
                );
                listed += 1;
            }
        }
        let total: usize = self.holders.values().map(Vec::len).sum();
        ensure_inv!(total == listed, "{total} extra-key holders for {listed} extra keys");
        Ok(())
    }
}

/// The manager's fields a loss of a block's hashes touches.
pub(super) struct HashDrop<'a> {
    pub(super) pool: &'a mut BlockPool,
    pub(super) partial: &'a mut PartialEntries,
    pub(super) removed: Option<&'a mut Vec<(BlockHash, u32)>>,
    pub(super) owner: &'a [u32],
    pub(super) siblings: &'a mut super::siblings::Siblings,
    pub(super) hash_tokens: &'a mut [u32],
}

impl HashDrop<'_> {
    /// Drops every key of block `b` (its own hash, then its extra keys),
    /// logging each; whether it had its own hash.
    pub(super) fn drop_all(&mut self, b: BlockId) -> bool {
        let own = self.pool.block_hash(b);
        if let Some(h) = own {
            let w = self.owner.get(b.idx()).copied().unwrap_or(0);
            if let Some(r) = self.removed.as_deref_mut() {
                r.push((h, w));
            }
            self.pool.drop_hash(b);
            self.siblings.dropped(self.pool, &h, w, b);
            if let Some(t) = self.hash_tokens.get_mut(b.idx()) {
                *t = 0;
            }
        }
        self.partial.take_block(b, self.removed.as_deref_mut());
        own.is_some()
    }
}

#[allow(clippy::cast_possible_truncation)]
/// vLLM's `get_mamba_prefill_checkpoint_position` for `prompt` tokens at
/// `unit` tokens a hash boundary: the last boundary a resend can hit —
/// leaving the last token (or, with hash lookahead, the `lookahead` tokens
/// a hash covers past its block) for recomputation, or one unit below the
/// end under EAGLE.
#[must_use]
pub(crate) fn mamba_tail_boundary(prompt: usize, unit: usize, use_eagle: bool, lookahead: usize) -> usize {
    if use_eagle {
        (prompt / unit * unit).saturating_sub(unit)
    } else {
        prompt.saturating_sub(lookahead.max(1)) / unit * unit
    }
}

fn tokens_u32(n: usize) -> u32 {
    n.min(u32::MAX as usize) as u32
}

/// A [`HashDrop`] over a manager's fields (a macro, so that a caller that
/// holds a request's table borrowed keeps it: the fields are borrowed apart).
macro_rules! hash_drop {
    ($m:expr) => {
        super::partial::HashDrop {
            pool: &mut $m.pool,
            partial: &mut $m.partial,
            removed: if $m.log_removed { Some(&mut $m.removed) } else { None },
            owner: &$m.owner,
            siblings: &mut $m.siblings,
            hash_tokens: &mut $m.hash_tokens,
        }
    };
}
pub(super) use hash_drop;

impl VllmManager {
    /// The fields [`HashDrop`] borrows.
    pub(super) fn hash_drop(&mut self) -> HashDrop<'_> {
        hash_drop!(self)
    }

    /// The prompt tails a caching call for `num_tokens` computed tokens (less
    /// `reprefillable`) with `num_hashes` request hashes registers: `(group,
    /// boundary tokens)` per group whose block holds no entry at its
    /// boundary yet, in group order. The prompt length is the one given to
    /// [`Self::set_cache_context`].
    #[must_use]
    pub fn tail_plan(
        &self,
        rid: &str,
        num_tokens: usize,
        num_hashes: usize,
        reprefillable: usize,
    ) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        if !self.partial.active() {
            return out;
        }
        let Some(req) = self.reqs.get(rid) else { return out };
        let hbs = self.layout.hash_block_size();
        let prompt = self.retention.num_prompt;
        for &g in &self.partial.groups {
            let bs = self.layout.groups()[g].block_size;
            let limit = if self.layout.group_eagle(g) { prompt } else { prompt.saturating_sub(1) };
            let boundary = (limit / hbs).min(num_hashes) * hbs;
            let nt = coordinator::cacheable_tokens(&self.layout, g, num_tokens, reprefillable);
            if boundary == 0 || boundary > nt || boundary.is_multiple_of(bs) {
                continue;
            }
            let Some(&b) = req.g(g).blocks.get(boundary / bs) else { continue };
            if b == BlockId::NULL {
                continue;
            }
            let t = tokens_u32(boundary);
            let own = self.pool.block_hash(b).is_some() && self.hash_tokens[b.idx()] == t;
            if own || self.partial.holds_tokens(b, t) {
                continue;
            }
            out.push((g, boundary));
        }
        for &g in &self.partial.mamba {
            if let Some(registers) = self.checkpoint_registration(rid, g) {
                // A prefill checkpoint replaces the prompt-tail rule ([`super::mamba_checkpoint`]).
                out.extend(registers.map(|pos| (g, pos)));
                continue;
            }
            // Align-mode Mamba's `_cache_partial_tail_block`: only a call ending exactly at
            // the prompt's last hash boundary, whose state block holds no hash there yet.
            let bs = self.layout.groups()[g].block_size;
            let boundary =
                mamba_tail_boundary(prompt, hbs, self.layout.use_eagle(), self.retention.hash_lookahead);
            let nt = coordinator::cacheable_tokens(&self.layout, g, num_tokens, reprefillable);
            // ... or at the scheduler's shared-prefix junction, inside this step's chunk.
            let r = &self.retention;
            let junction = self.partial.shared_checkpoint
                && nt == r.shared_boundary
                && r.num_computed < nt
                && nt <= prompt;
            if nt == 0 || !nt.is_multiple_of(hbs) || (nt != boundary && !junction) || nt / hbs > num_hashes {
                continue;
            }
            let Some(&b) = req.g(g).blocks.get(nt.div_ceil(bs) - 1) else { continue };
            if b == BlockId::NULL || self.hash_tokens[b.idx()] as usize == nt {
                continue;
            }
            out.push((g, nt));
        }
        out.sort_by_key(|&(g, _)| g);
        out
    }

    /// Registers the prompt tails of `tails` (from [`Self::tail_plan`]) with
    /// request hashes `hashes`, which start at request hash index `first`.
    /// Returns one run per registration (block size: the hash block).
    ///
    /// # Errors
    /// `UnknownRequest` / `InvalidArgument` when a tail or the hashes do not
    /// fit the request (nothing changed).
    pub fn cache_tails(
        &mut self,
        rid: &str,
        tails: &[(usize, usize)],
        first: usize,
        hashes: &[BlockHash],
    ) -> KvResult<Vec<CachedRun>> {
        let Some(req) = self.reqs.get(rid) else {
            return Err(KvError::new(ErrorKind::UnknownRequest, format!("unknown request {rid:?}")));
        };
        let hbs = self.layout.hash_block_size();
        let mut targets = Vec::with_capacity(tails.len());
        for &(g, boundary) in tails {
            let Some(spec) = self.layout.groups().get(g).filter(|_| self.partial.registers(g)) else {
                return Err(KvError::invalid(format!("group {g} registers no prompt tails")));
            };
            // Full attention: the block the boundary lies in; Mamba: the state block ending
            // at or after it.
            let ckpt = self.mamba_checkpoint_of(g, rid).filter(|&(pos, _)| pos == boundary);
            let idx = if let Some((_, i)) = ckpt {
                i
            } else if self.partial.mamba.contains(&g) {
                boundary.div_ceil(spec.block_size).saturating_sub(1)
            } else {
                boundary / spec.block_size
            };
            let b = (boundary.is_multiple_of(hbs) && boundary > 0)
                .then(|| req.g(g).blocks.get(idx).copied())
                .flatten()
                .filter(|&b| b != BlockId::NULL);
            let j = boundary / hbs;
            let (Some(b), Some(h)) = (b, j.checked_sub(1 + first).and_then(|i| hashes.get(i))) else {
                return Err(KvError::invalid(format!(
                    "prompt tail ({g}, {boundary}) does not fit the request (block {idx} of {}, \
                     hash {j} of {first}..{})",
                    req.g(g).blocks.len(),
                    first + hashes.len()
                )));
            };
            targets.push((g, boundary, b, *h, idx, ckpt.is_some()));
        }
        let mut runs = Vec::with_capacity(targets.len());
        for (g, boundary, b, h, idx, ckpt) in targets {
            let key = group_key(&h, g);
            let t = tokens_u32(boundary);
            let mark = self.removed.len();
            let mut already = self.pool.block_hash(b) == Some(key) || self.partial.holds(&key, b);
            if ckpt {
                // A checkpoint's block holds new contents: every key it had goes first.
                self.hash_drop().drop_all(b);
                already = false;
                self.mamba_note_key(g, key);
            } else if self.partial.mamba.contains(&g) {
                // Mamba counts the key as cached this step and, inside a block, makes the
                // request the tail's producer, registered now or before.
                self.mamba_note_key(g, key);
                self.note_mamba_tail(rid, g, idx, b, boundary);
            }
            if already {
                continue;
            }
            let own_tokens = self.hash_tokens[b.idx()];
            if self.pool.block_hash(b).is_some() && own_tokens < t {
                self.hash_drop().drop_all(b);
            }
            let w = owner_word(g, h.as_bytes().len());
            if self.pool.block_hash(b).is_none() {
                let first_copy = self.pool.cache_block(b, key);
                self.hash_tokens[b.idx()] = t;
                self.owner[b.idx()] = w;
                self.siblings.cached(&self.pool, &h, g, b, first_copy);
                self.partial.own_registered(b);
            } else {
                let seq = self.partial.next_seq();
                self.partial.add(b, ExtraKey { key, owner: w, tokens: t, seq });
            }
            let removed = if self.log_removed { (mark, self.removed.len()) } else { (0, 0) };
            let j = boundary / hbs;
            runs.push(CachedRun {
                group: g,
                start: j - 1,
                end: j,
                stored: Stored::Range(j - 1, j),
                block_size: hbs,
                removed,
            });
        }
        Ok(runs)
    }

    /// Moves every key of block `src` (its own hash, then its extra keys)
    /// to `dst`, which holds none, without logging (vLLM's
    /// `move_block_hashes`): the entries stay live on the copy.
    pub(super) fn move_keys(&mut self, src: BlockId, dst: BlockId) {
        let Some(k) = self.pool.block_hash(src) else { return };
        if self.pool.block_hash(dst).is_some() {
            return;
        }
        let (w, t) = (self.owner[src.idx()], self.hash_tokens[src.idx()]);
        self.pool.drop_hash(src);
        self.siblings.dropped(&self.pool, &k, w, src);
        self.hash_tokens[src.idx()] = 0;
        let extras = self.partial.by_block.remove(&src).unwrap_or_default();
        for e in &extras {
            self.partial.unlist(&e.key, src);
        }
        let first = self.pool.cache_block(dst, k);
        self.hash_tokens[dst.idx()] = t;
        self.owner[dst.idx()] = w;
        let (h, g) = unkey_owned(&k, w);
        self.siblings.cached(&self.pool, &h, g, dst, first);
        self.partial.own_registered(dst);
        for e in extras {
            let seq = self.partial.next_seq();
            self.partial.add(dst, ExtraKey { seq, ..e });
        }
    }

    /// Drops `key` (a pool key, vLLM's hash under group `g`) from block `b`
    /// without logging it (vLLM's `cached_block_hash_to_block.pop(key,
    /// block_id)`): its own hash, or one extra key. Whether it held it.
    pub fn pop_cached_key(&mut self, h: &BlockHash, g: usize, b: BlockId) -> bool {
        let key = group_key(h, g);
        if b == BlockId::NULL || b.idx() >= self.pool.num_blocks() {
            return false;
        }
        if self.pool.block_hash(b) == Some(key) && (self.owner[b.idx()] & 0xffff) as usize == g {
            self.pool.drop_hash(b);
            self.siblings.dropped(&self.pool, &key, self.owner[b.idx()], b);
            self.hash_tokens[b.idx()] = 0;
            return true;
        }
        self.partial.remove_one(&key, b)
    }

    /// Gives block `b` back the key [`Self::pop_cached_key`] dropped (vLLM's
    /// `cached_block_hash_to_block._cache[key] = block`, re-inserting what a
    /// test popped): as its own hash covering `tokens` tokens (`own`), or as
    /// an extra key. Nothing is logged. Whether it was restored: refused
    /// (false, nothing changed) for the null block, a group that is not
    /// prefix-cacheable, an own hash on a hashed block, or an extra key a
    /// block of that group cannot hold (no own hash, not a prompt-tail group).
    pub fn restore_cached_key(
        &mut self,
        h: &BlockHash,
        g: usize,
        b: BlockId,
        own: bool,
        tokens: usize,
    ) -> bool {
        if b == BlockId::NULL || b.idx() >= self.pool.num_blocks() || !self.layout.prefix_cacheable(g) {
            return false;
        }
        let key = group_key(h, g);
        let w = owner_word(g, h.as_bytes().len());
        if own {
            if self.pool.block_hash(b).is_some() {
                return false;
            }
            let first = self.pool.cache_block(b, key);
            self.hash_tokens[b.idx()] = tokens_u32(tokens);
            self.owner[b.idx()] = w;
            self.siblings.cached(&self.pool, h, g, b, first);
            self.partial.own_registered(b);
            return true;
        }
        let fits = self.partial.registers(g)
            && self.pool.block_hash(b).is_some_and(|k| k != key)
            && !self.partial.holds(&key, b);
        if fits {
            let seq = self.partial.next_seq();
            self.partial.add(b, ExtraKey { key, owner: w, tokens: tokens_u32(tokens), seq });
        }
        fits
    }

    /// Whether block `b` is cached under vLLM hash `h` of group `g` (its own
    /// hash or an extra key).
    #[must_use]
    pub fn holds_key(&self, h: &BlockHash, g: usize, b: BlockId) -> bool {
        let key = group_key(h, g);
        b.idx() < self.pool.num_blocks()
            && (self.pool.block_hash(b) == Some(key) || self.partial.holds(&key, b))
    }

    /// vLLM's `enable_mamba_shared_prefix_checkpoint` as the manager narrows
    /// it (EAGLE groups, partial hash hits, no re-prefilled tokens): Mamba
    /// prompt tails register at the scheduler's shared-prefix junction too.
    /// The caller gives the request's computed tokens to
    /// [`Self::set_cache_computed`] before each caching call.
    pub fn set_mamba_shared_prefix_checkpoint(&mut self, on: bool) {
        self.partial.shared_checkpoint = on && !self.partial.mamba.is_empty();
    }

    /// Whether Mamba prompt tails register at the shared-prefix junction.
    #[must_use]
    pub fn mamba_shared_prefix_checkpoint(&self) -> bool {
        self.partial.shared_checkpoint
    }

    /// Whether some group registers prompt tails (callers then give the
    /// prompt length to [`Self::set_cache_context`] before caching).
    #[must_use]
    pub fn registers_prompt_tails(&self) -> bool {
        self.partial.active()
    }

    /// Every extra key as `(vLLM hash, group, block)`, by block id, each
    /// block's oldest first.
    #[must_use]
    pub fn extra_keys(&self) -> Vec<(BlockHash, usize, BlockId)> {
        let mut blocks: Vec<&BlockId> = self.partial.by_block.keys().collect();
        blocks.sort_unstable();
        blocks
            .into_iter()
            .flat_map(|b| {
                self.partial.by_block[b].iter().map(move |e| {
                    let (h, g) = unkey_owned(&e.key, e.owner);
                    (h, g, *b)
                })
            })
            .collect()
    }

    /// Distinct keys cached: the blocks' own hashes and their extra keys.
    #[must_use]
    pub fn num_cached_keys(&self) -> usize {
        self.pool.num_cached_hashes() + self.partial.distinct_extra_keys(&self.pool)
    }
}

#[cfg(test)]
#[path = "partial_tests.rs"]
mod partial_tests;
