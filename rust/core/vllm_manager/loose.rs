//! Blocks held by no request: vLLM 0.33's `block_pool.get_new_blocks` and
//! `block_pool.cache_full_blocks` called directly (KV connectors and vLLM's
//! own tests do), over any number of groups.
//!
//! [`VllmManager::take_loose`] pops blocks off the free queue's head (evicting
//! their cached hashes, logged as removed) with one reference each and puts
//! them in no table and no zeroing log (vLLM's pool records nothing); the
//! caller frees them through [`VllmManager::free_blocks`].
//! [`VllmManager::cache_loose`] caches a caller's list of blocks for one group
//! under a request's hashes, as the group's own caching step would.
//!
//! Costs: O(blocks taken / cached).

use super::{group_key, owner_word, VllmManager};
use crate::core::error::{ErrorKind, KvError, KvResult};
use crate::core::groups::coordinator::coarse_hash_index;
use crate::core::ids::{BlockHash, BlockId};

impl VllmManager {
    /// Takes `n` free blocks, held by no request.
    ///
    /// # Errors
    /// `Capacity` when fewer than `n` blocks are free (nothing changed).
    pub fn take_loose(&mut self, n: usize) -> KvResult<Vec<BlockId>> {
        if n > self.pool.num_free() {
            return Err(KvError::new(
                ErrorKind::Capacity,
                format!("Cannot get {n} free blocks from the pool ({} free)", self.pool.num_free()),
            ));
        }
        if self.log_removed || !self.partial.is_empty() {
            let removed = if self.log_removed { Some(&mut self.removed) } else { None };
            let mut removed = removed;
            for b in self.pool.free_queue().take(n) {
                if let (Some(h), Some(r)) = (self.pool.block_hash(b), removed.as_deref_mut()) {
                    r.push((h, self.owner[b.idx()]));
                }
                self.partial.take_block(b, removed.as_deref_mut());
            }
        }
        self.siblings.note_victims(&self.pool, &self.owner, n);
        let mut out = Vec::with_capacity(n);
        self.pool.allocate(n, &mut out);
        self.siblings.sync_victims(&self.pool);
        for &b in &out {
            self.hash_tokens[b.idx()] = 0;
        }
        if let Some(log) = self.metrics.as_mut() {
            log.extend(out.iter().map(|b| b.0));
        }
        Ok(out)
    }

    /// vLLM's `cache_full_blocks` for group `g` over the caller's `blocks`:
    /// table indices `start..end` get the request hash at group `g`'s block
    /// size (`hashes` start at request hash index `first`), null blocks
    /// skipped. Returns the indices cached.
    ///
    /// # Errors
    /// `InvalidArgument`, nothing changed: an unknown group, a range outside
    /// `blocks`, hashes that do not cover it, a block out of range, free, or
    /// already cached.
    pub fn cache_loose(
        &mut self,
        blocks: &[BlockId],
        g: usize,
        start: usize,
        end: usize,
        first: usize,
        hashes: &[BlockHash],
    ) -> KvResult<Vec<usize>> {
        if g >= self.layout.len() {
            return Err(KvError::invalid(format!("KV cache group {g} out of range")));
        }
        if !self.layout.prefix_cacheable(g) {
            return Err(KvError::invalid(format!("KV cache group {g} is not prefix-cacheable")));
        }
        if start >= end {
            return Ok(Vec::new());
        }
        if end > blocks.len() {
            return Err(KvError::invalid(format!("cache range {start}..{end} past {} blocks", blocks.len())));
        }
        let bs = self.layout.groups()[g].block_size;
        let scale = bs / self.layout.hash_block_size();
        let (lo, hi) = (coarse_hash_index(start, scale), coarse_hash_index(end - 1, scale) + 1);
        if lo < first || hi > first + hashes.len() {
            return Err(KvError::invalid("the hashes given do not cover the blocks to cache"));
        }
        for &b in &blocks[start..end] {
            if b == BlockId::NULL {
                continue;
            }
            if b.idx() >= self.pool.num_blocks() {
                return Err(KvError::invalid(format!("block id {} out of range", b.0)));
            }
            if self.pool.ref_count(b) == 0 || self.pool.block_hash(b).is_some() {
                return Err(KvError::invalid(format!("block {} is free or already cached", b.0)));
            }
        }
        let mut stored = Vec::new();
        for (i, &b) in blocks.iter().enumerate().take(end).skip(start) {
            if b == BlockId::NULL || self.pool.block_hash(b).is_some() {
                continue;
            }
            let h = hashes[coarse_hash_index(i, scale) - first];
            let first = self.pool.cache_block(b, group_key(&h, g));
            #[allow(clippy::cast_possible_truncation)]
            let t = ((i + 1) * bs).min(u32::MAX as usize) as u32;
            self.hash_tokens[b.idx()] = t;
            self.owner[b.idx()] = owner_word(g, h.as_bytes().len());
            self.siblings.cached(&self.pool, &h, g, b, first);
            stored.push(i);
        }
        Ok(stored)
    }
}
