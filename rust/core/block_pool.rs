//! Ref-counted block pool with a hash -> block index and lazy eviction
//! (vLLM 0.33 `BlockPool` semantics for one full-attention group).
//!
//! # Invariants (checked by [`BlockPool::check_invariants`])
//! 1. Block 0 is the null block: never queued, never hashed, ref count 0.
//! 2. For every other block: `ref_cnt == 0` iff it is in the free queue.
//! 3. `num_free + #(ref_cnt > 0) + 1 == num_blocks`.
//! 4. Index <-> blocks: every hashed block is listed exactly once under its
//!    hash: as the index entry (the first copy) or in `dups` (later copies,
//!    oldest first); the index holds one entry per distinct hash, every
//!    `dups` list is non-empty and its hash has an index entry.
//!
//! # Eviction order
//! The free queue is the LRU: new blocks come from its head. A cached block
//! whose ref count drops to 0 stays cached (still hittable) and goes to the
//! tail; it loses its hash only when it is handed out again (lazy eviction).
//! Blocks freed without a hash go to the head (they hold nothing worth
//! keeping). A hit on a free cached block removes it from the queue wherever
//! it is.
//!
//! # Costs
//! Lookup, touch, allocation and free are O(1) per block (hash table + linked
//! list). The index stores only 4-byte block ids, keyed by the digest's first
//! 8 bytes and compared in full against the block's own hash, so it stays
//! small enough to live in cache: memory is about 50 bytes per block, plus
//! ~5 bytes per cached hash. KV events (when enabled) are held in a bounded
//! [`crate::core::event_buffer::Events`] between drains (drop-oldest, counted).

use hashbrown::HashTable;
use rustc_hash::FxHashMap;

use crate::core::error::{pool_size, try_filled, ErrorKind, InvariantViolation, KvError, KvResult};
use crate::core::event_buffer::Events;
use crate::core::events::KvEvent;
use crate::core::free_queue::FreeQueue;
use crate::core::ids::{BlockHash, BlockId};
use crate::ensure_inv;

/// The index key of block `b`'s hash (it must have one).
fn key_of(meta: &[Meta], b: BlockId) -> u64 {
    meta[b.idx()].hash.as_ref().expect("indexed blocks are hashed").key64()
}

/// A block's ref count and hash.
#[derive(Clone, Copy, Debug)]
struct Meta {
    hash: Option<BlockHash>,
    ref_cnt: u32,
}

/// The block pool.
#[derive(Clone, Debug)]
pub struct BlockPool {
    /// Per block: ref count and hash side by side (one cache line per
    /// block for lookups, pins, frees and evictions).
    meta: Vec<Meta>,
    queue: FreeQueue,
    /// First copy of each cached hash (module header, invariant 4).
    index: HashTable<BlockId>,
    /// Later copies of a hash, oldest first (vLLM allows duplicate physical
    /// copies; lookups return the first). Rare: empty in most workloads.
    dups: FxHashMap<BlockHash, Vec<BlockId>>,
    events: Events,
    /// Blocks that lost their hash since the owner last drained this log
    /// (kept only when `log_evictions` is on).
    evicted: Vec<BlockId>,
    log_evictions: bool,
}

impl BlockPool {
    /// A pool of `num_blocks` blocks (block 0 is the null block), all free,
    /// queued in id order.
    ///
    /// # Errors
    /// `InvalidArgument` if `num_blocks < 2` or it does not fit in `u32`;
    /// `Capacity` if its tables cannot be allocated.
    pub fn new(num_blocks: usize, enable_events: bool) -> KvResult<Self> {
        let n = pool_size(num_blocks, "block")?;
        // Largest table first: a size the allocator refuses fails before
        // anything else is touched.
        let meta = try_filled(num_blocks, Meta { hash: None, ref_cnt: 0 }, "block records")?;
        let queue = FreeQueue::new_full(n)?;
        Ok(BlockPool {
            meta,
            queue,
            index: HashTable::new(),
            dups: FxHashMap::default(),
            events: Events::new(enable_events),
            evicted: Vec::new(),
            log_evictions: false,
        })
    }

    /// Total number of blocks, the null block included. O(1).
    #[must_use]
    pub fn num_blocks(&self) -> usize {
        self.meta.len()
    }

    /// Free blocks (cached-but-idle ones included). O(1).
    #[must_use]
    pub fn num_free(&self) -> usize {
        self.queue.len()
    }

    /// `1 - free / (num_blocks - 1)`. O(1).
    #[must_use]
    pub fn usage(&self) -> f64 {
        #[allow(clippy::cast_precision_loss)]
        let u = 1.0 - self.queue.len() as f64 / (self.num_blocks() - 1) as f64;
        u
    }

    /// Ref count of a block. O(1).
    #[must_use]
    pub fn ref_count(&self, b: BlockId) -> u32 {
        self.meta[b.idx()].ref_cnt
    }

    /// The hash a block is cached under, if any. O(1).
    #[must_use]
    pub fn block_hash(&self, b: BlockId) -> Option<BlockHash> {
        self.meta[b.idx()].hash
    }

    /// Whether `b` has a cached hash. O(1).
    #[inline]
    #[must_use]
    pub fn is_cached(&self, b: BlockId) -> bool {
        self.meta[b.idx()].hash.is_some()
    }

    /// Whether `b` is in the free queue. O(1). Reads the ref count
    /// (invariant 2), the field `touch` reads next, not the queue links.
    #[must_use]
    pub fn is_free(&self, b: BlockId) -> bool {
        b != BlockId::NULL && self.meta[b.idx()].ref_cnt == 0
    }

    /// The free queue from head (next victim) to tail. O(n).
    pub fn free_queue(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.queue.iter()
    }

    /// Number of distinct cached hashes. O(1).
    #[must_use]
    pub fn num_cached_hashes(&self) -> usize {
        self.index.len()
    }

    /// The first-inserted block cached under `h`; no side effects. O(1).
    #[must_use]
    pub fn get_cached(&self, h: &BlockHash) -> Option<BlockId> {
        let meta = &self.meta;
        self.index.find(h.key64(), |&b| meta[b.idx()].hash == Some(*h)).copied()
    }

    /// Appends to `out` the first cached copy of each hash of `hashes`, in
    /// order, stopping at the first hash that is not cached. O(k).
    ///
    /// Lookups run in passes so that their cache misses overlap: bucket ids
    /// first (no block record read), then one touch of each candidate's
    /// record, then the exact comparisons from cache. A scheduler's prompt
    /// lookups are otherwise a series of cold, one-at-a-time misses.
    pub fn lookup_run(&self, hashes: &[BlockHash], out: &mut Vec<BlockId>) {
        let start = out.len();
        out.extend(
            hashes.iter().map(|h| self.index.find(h.key64(), |_| true).copied().unwrap_or(BlockId::NULL)),
        );
        let mut sink = 0u32;
        for b in &out[start..] {
            sink ^= self.meta[b.idx()].ref_cnt;
        }
        std::hint::black_box(sink);
        let mut k = start;
        for h in hashes {
            let c = out[k];
            let hit = if c != BlockId::NULL && self.meta[c.idx()].hash == Some(*h) {
                Some(c)
            } else {
                self.get_cached(h)
            };
            match hit {
                Some(b) => {
                    out[k] = b;
                    k += 1;
                }
                None => break,
            }
        }
        out.truncate(k);
    }

    /// Takes a reference on each block, removing free ones from the queue. O(k).
    pub fn touch(&mut self, blocks: &[BlockId]) {
        for &b in blocks {
            debug_assert!(b != BlockId::NULL);
            if self.meta[b.idx()].ref_cnt == 0 {
                self.queue.remove(b);
            }
            self.meta[b.idx()].ref_cnt += 1;
        }
    }

    /// Pops `n` blocks from the queue head, evicting their hashes, and gives
    /// each a ref count of 1. Appends them to `out`. O(n).
    ///
    /// # Panics
    /// If fewer than `n` blocks are free (callers check first).
    pub fn allocate(&mut self, n: usize, out: &mut Vec<BlockId>) {
        assert!(n <= self.queue.len(), "allocate({n}) with {} free", self.queue.len());
        for _ in 0..n {
            let b = self.queue.pop_front().expect("length checked above");
            self.evict_hash(b);
            debug_assert_eq!(self.meta[b.idx()].ref_cnt, 0);
            self.meta[b.idx()].ref_cnt = 1;
            out.push(b);
        }
    }

    /// Drops `b`'s hash from the index (and emits `BlockRemoved`) if it has one.
    fn evict_hash(&mut self, b: BlockId) {
        let Some(h) = self.meta[b.idx()].hash else { return };
        let meta = &self.meta;
        let Ok(entry) = self.index.find_entry(h.key64(), |&x| meta[x.idx()].hash == Some(h)) else {
            panic!("hashed block {} is not in the index", b.0);
        };
        if *entry.get() == b {
            // The first copy: the next one (if any) takes its place.
            match self.dups.get_mut(&h) {
                None => {
                    entry.remove();
                }
                Some(v) => {
                    *entry.into_mut() = v.remove(0);
                    if v.is_empty() {
                        self.dups.remove(&h);
                    }
                }
            }
        } else {
            let v = self.dups.get_mut(&h).expect("a later copy is listed in dups");
            let pos = v.iter().position(|&x| x == b).expect("hashed block listed under its hash");
            v.remove(pos);
            if v.is_empty() {
                self.dups.remove(&h);
            }
        }
        self.meta[b.idx()].hash = None;
        self.events.record(|| KvEvent::BlockRemoved { block_hashes: vec![h.low_u64()] });
        if self.log_evictions {
            self.evicted.push(b);
        }
    }

    /// Drops `b`'s cached hash whether or not it is in use (vLLM's
    /// `evict_blocks` on a failed KV load); the block keeps its ref count and
    /// queue position. Returns whether it had a hash. O(1).
    pub fn drop_hash(&mut self, b: BlockId) -> bool {
        if b == BlockId::NULL || self.meta[b.idx()].hash.is_none() {
            return false;
        }
        self.evict_hash(b);
        true
    }

    /// Turns on the log of blocks that lose their hash (see [`BlockPool::take_evicted`]).
    pub fn log_evictions(&mut self) {
        self.log_evictions = true;
    }

    /// Moves the blocks that lost their hash since the last call into `out`
    /// (`reset` is not logged: it drops every hash). O(k).
    pub fn take_evicted(&mut self, out: &mut Vec<BlockId>) {
        out.clear();
        std::mem::swap(out, &mut self.evicted);
    }

    /// Caches block `b` (in use, unhashed) under `h`, after any existing copies.
    /// Returns whether `b` is the first copy (what lookups of `h` now return).
    /// O(1) amortised. The caller emits the `BlockStored` event for the run.
    pub fn cache_block(&mut self, b: BlockId, h: BlockHash) -> bool {
        assert!(self.meta[b.idx()].hash.is_none(), "block {} already hashed", b.0);
        let meta = &self.meta;
        let first = self.index.find(h.key64(), |&x| meta[x.idx()].hash == Some(h)).is_some();
        if first {
            self.dups.entry(h).or_default().push(b);
        } else {
            self.index.insert_unique(h.key64(), b, |&x| key_of(meta, x));
        }
        self.meta[b.idx()].hash = Some(h);
        !first
    }

    /// Releases one reference on each block of `ordered` (already in release
    /// order). Blocks reaching 0 go to the queue: unhashed ones to the front
    /// (in the given order), hashed ones to the tail (in the given order). O(k).
    pub fn free(&mut self, ordered: impl Iterator<Item = BlockId>, scratch: &mut Vec<BlockId>) {
        scratch.clear();
        for b in ordered {
            if b == BlockId::NULL {
                continue;
            }
            let r = &mut self.meta[b.idx()].ref_cnt;
            assert!(*r > 0, "freeing block {} with ref count 0", b.0);
            *r -= 1;
            if *r == 0 {
                if self.meta[b.idx()].hash.is_some() {
                    self.queue.push_back(b);
                } else {
                    scratch.push(b);
                }
            }
        }
        self.queue.prepend(scratch);
    }

    /// Validates block ids for [`BlockPool::evict_blocks`]: in range, not
    /// the null block, not in use.
    ///
    /// # Errors
    /// `InvalidArgument` for a bad id, `BlockInUse` for a referenced block.
    pub fn check_evictable(&self, ids: &[i64]) -> KvResult<()> {
        for &id in ids {
            if id < 1 || id >= self.num_blocks() as i64 {
                return Err(KvError::invalid(format!(
                    "block id {id} out of range 1..{} (block 0 is the null block)",
                    self.num_blocks()
                )));
            }
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let r = self.meta[id as usize].ref_cnt;
            if r > 0 {
                return Err(KvError::new(
                    ErrorKind::BlockInUse,
                    format!("block {id} is in use (ref count {r}); only idle blocks can be evicted"),
                ));
            }
        }
        Ok(())
    }

    /// Drops the hashes of idle blocks `ids`; they keep their queue position.
    /// All ids are validated before anything changes. O(k).
    ///
    /// # Errors
    /// See [`BlockPool::check_evictable`].
    pub fn evict_blocks(&mut self, ids: &[i64]) -> KvResult<usize> {
        self.check_evictable(ids)?;
        // The check above read every block's record (those misses overlap);
        // touch each hashed block's index bucket the same way before removing.
        let mut sink = 0u32;
        for &id in ids {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            if let Some(h) = &self.meta[id as usize].hash {
                sink ^= self.index.find(h.key64(), |_| true).map_or(0, |b| b.0);
            }
        }
        std::hint::black_box(sink);
        let mut n = 0;
        for &id in ids {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let b = BlockId(id as u32);
            if self.meta[b.idx()].hash.is_some() {
                self.evict_hash(b);
                n += 1;
            }
        }
        Ok(n)
    }

    /// Drops every cached hash; the queue order is unchanged.
    ///
    /// # Errors
    /// `BlockInUse` if any block is referenced (nothing changes).
    pub fn reset(&mut self) -> KvResult<()> {
        let in_use = self.num_blocks() - 1 - self.queue.len();
        if in_use > 0 {
            return Err(KvError::new(
                ErrorKind::BlockInUse,
                format!("cannot reset the prefix cache while {in_use} blocks are in use"),
            ));
        }
        self.index.clear();
        self.dups.clear();
        self.meta.iter_mut().for_each(|m| m.hash = None);
        self.events.record(|| KvEvent::AllBlocksCleared);
        Ok(())
    }

    /// The KV events (drained, bounded and counted through the request layer).
    #[must_use]
    pub fn events(&self) -> &Events {
        &self.events
    }

    /// The KV events, to record into or drain.
    pub fn events_mut(&mut self) -> &mut Events {
        &mut self.events
    }

    /// Checks invariants 1-4 of the module header. O(n + map).
    ///
    /// # Errors
    /// The first violation found.
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        self.queue.check()?;
        ensure_inv!(!self.queue.contains(BlockId::NULL), "null block is in the free queue");
        ensure_inv!(self.meta[0].hash.is_none(), "null block is hashed");
        ensure_inv!(self.meta[0].ref_cnt == 0, "null block has a ref count");
        let mut used = 0;
        let mut hashed = 0;
        for i in 1..self.num_blocks() {
            #[allow(clippy::cast_possible_truncation)]
            let b = BlockId(i as u32);
            ensure_inv!(
                (self.meta[i].ref_cnt == 0) == self.queue.contains(b),
                "block {i}: ref count {} but queued={}",
                self.meta[i].ref_cnt,
                self.queue.contains(b)
            );
            used += usize::from(self.meta[i].ref_cnt > 0);
            if let Some(h) = self.meta[i].hash {
                hashed += 1;
                let listed = usize::from(self.get_cached(&h) == Some(b))
                    + self.dups.get(&h).map_or(0, |v| v.iter().filter(|&&x| x == b).count());
                ensure_inv!(listed == 1, "block {i} listed {listed} times under its hash");
            }
        }
        ensure_inv!(self.queue.len() + used + 1 == self.num_blocks(), "free + used + 1 != num_blocks");
        let mut entries = 0;
        for &b in &self.index {
            let Some(h) = self.meta[b.idx()].hash else {
                return Err(InvariantViolation(format!("index lists unhashed block {}", b.0)));
            };
            ensure_inv!(self.get_cached(&h) == Some(b), "index entry of block {} is unreachable", b.0);
            entries += 1;
        }
        for (h, v) in &self.dups {
            ensure_inv!(!v.is_empty(), "empty duplicate list");
            ensure_inv!(self.get_cached(h).is_some(), "duplicate copies of a hash with no first copy");
            for b in v {
                ensure_inv!(
                    self.meta[b.idx()].hash == Some(*h),
                    "dups lists block {} under a hash it lacks",
                    b.0
                );
            }
            entries += v.len();
        }
        ensure_inv!(entries == hashed, "index holds {entries} blocks, {hashed} blocks are hashed");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(x: u8) -> BlockHash {
        BlockHash::from_digest(&[x; 16])
    }

    /// Three physical copies of one hash: lookups return the oldest remaining
    /// copy as copies are evicted from the front, the middle and the back.
    #[test]
    fn duplicate_copies_keep_first_copy_order() {
        let mut p = BlockPool::new(8, true).expect("pool");
        let mut blocks = Vec::new();
        p.allocate(5, &mut blocks);
        assert_eq!(blocks, [1, 2, 3, 4, 5].map(BlockId));
        for &b in &blocks[..3] {
            p.cache_block(b, h(7));
        }
        p.cache_block(blocks[3], h(8));
        p.check_invariants().expect("invariants");
        assert_eq!(p.num_cached_hashes(), 2);
        assert_eq!(p.get_cached(&h(7)), Some(BlockId(1)));
        let mut scratch = Vec::new();
        p.free(blocks.iter().rev().copied(), &mut scratch);
        p.check_invariants().expect("invariants");
        // Middle copy first: the first copy still answers.
        assert_eq!(p.evict_blocks(&[2]).expect("idle"), 1);
        p.check_invariants().expect("invariants");
        assert_eq!(p.get_cached(&h(7)), Some(BlockId(1)));
        // First copy: the next-oldest takes over.
        assert_eq!(p.evict_blocks(&[1]).expect("idle"), 1);
        p.check_invariants().expect("invariants");
        assert_eq!(p.get_cached(&h(7)), Some(BlockId(3)));
        assert_eq!(p.num_cached_hashes(), 2);
        // Last copy: the hash is gone, the other hash stays.
        assert_eq!(p.evict_blocks(&[3, 3]).expect("idle"), 1);
        p.check_invariants().expect("invariants");
        assert_eq!(p.get_cached(&h(7)), None);
        assert_eq!(p.get_cached(&h(8)), Some(BlockId(4)));
        assert_eq!(p.num_cached_hashes(), 1);
        let removed = p.events_mut().take().len();
        assert_eq!(removed, 3, "one BlockRemoved per evicted copy");
    }

    /// Hashes that share the 8-byte index key but differ later are distinct.
    #[test]
    fn index_key_collisions_compare_full_digests() {
        let mut p = BlockPool::new(4, false).expect("pool");
        let mut blocks = Vec::new();
        p.allocate(2, &mut blocks);
        let mut a = [1u8; 16];
        let b = a;
        a[15] = 2;
        let (ha, hb) = (BlockHash::from_digest(&a), BlockHash::from_digest(&b));
        assert_eq!(ha.key64(), hb.key64());
        p.cache_block(blocks[0], ha);
        p.cache_block(blocks[1], hb);
        p.check_invariants().expect("invariants");
        assert_eq!(p.get_cached(&ha), Some(blocks[0]));
        assert_eq!(p.get_cached(&hb), Some(blocks[1]));
        assert_eq!(p.num_cached_hashes(), 2);
        let mut scratch = Vec::new();
        p.free(blocks.iter().copied(), &mut scratch);
        assert_eq!(p.evict_blocks(&[1]).expect("idle"), 1);
        p.check_invariants().expect("invariants");
        assert_eq!(p.get_cached(&ha), None);
        assert_eq!(p.get_cached(&hb), Some(blocks[1]));
    }
}
