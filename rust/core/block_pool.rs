//! Ref-counted block pool with a hash -> block map and lazy eviction
//! (vLLM 0.33 `BlockPool` semantics for one full-attention group).
//!
//! # Invariants (checked by [`BlockPool::check_invariants`])
//! 1. Block 0 is the null block: never queued, never hashed, ref count 0.
//! 2. For every other block: `ref_cnt == 0` iff it is in the free queue.
//! 3. `num_free + #(ref_cnt > 0) + 1 == num_blocks`.
//! 4. Map <-> blocks: every block listed under a key in the map carries that
//!    key as its hash, every hashed block is listed under its hash exactly
//!    once, and no key maps to an empty list.
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
//! Lookup, touch, allocation and free are O(1) per block (hash map + linked
//! list); memory is about 50 bytes per block plus the map.

use rustc_hash::FxHashMap;

use crate::core::error::{ErrorKind, InvariantViolation, KvError, KvResult};
use crate::core::events::KvEvent;
use crate::core::free_queue::FreeQueue;
use crate::core::ids::{BlockHash, BlockId};
use crate::ensure_inv;

/// Blocks cached under one hash, first inserted first (vLLM allows duplicate
/// physical copies of a hash; lookups return the first).
#[derive(Clone, Debug)]
enum Copies {
    One(BlockId),
    Many(Vec<BlockId>),
}

impl Copies {
    fn first(&self) -> BlockId {
        match self {
            Copies::One(b) => *b,
            Copies::Many(v) => v[0],
        }
    }
}

/// The block pool.
#[derive(Clone, Debug)]
pub struct BlockPool {
    ref_cnt: Vec<u32>,
    hash: Vec<Option<BlockHash>>,
    queue: FreeQueue,
    map: FxHashMap<BlockHash, Copies>,
    events: Option<Vec<KvEvent>>,
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
    /// `InvalidArgument` if `num_blocks < 2` or it does not fit in `u32`.
    pub fn new(num_blocks: usize, enable_events: bool) -> KvResult<Self> {
        if num_blocks < 2 {
            return Err(KvError::invalid(format!(
                "num_blocks must be >= 2 (block 0 is the null block), got {num_blocks}"
            )));
        }
        let n = u32::try_from(num_blocks)
            .ok()
            .filter(|&n| n <= i32::MAX as u32) // block ids travel as int32
            .ok_or_else(|| KvError::invalid(format!("num_blocks too large: {num_blocks}")))?;
        let mut queue = FreeQueue::new(n);
        for i in 1..n {
            queue.push_back(BlockId(i));
        }
        Ok(BlockPool {
            ref_cnt: vec![0; num_blocks],
            hash: vec![None; num_blocks],
            queue,
            map: FxHashMap::default(),
            events: enable_events.then(Vec::new),
            evicted: Vec::new(),
            log_evictions: false,
        })
    }

    /// Total number of blocks, the null block included. O(1).
    #[must_use]
    pub fn num_blocks(&self) -> usize {
        self.ref_cnt.len()
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
        self.ref_cnt[b.idx()]
    }

    /// The hash a block is cached under, if any. O(1).
    #[must_use]
    pub fn block_hash(&self, b: BlockId) -> Option<BlockHash> {
        self.hash[b.idx()]
    }

    /// Whether `b` is in the free queue. O(1).
    #[must_use]
    pub fn is_free(&self, b: BlockId) -> bool {
        self.queue.contains(b)
    }

    /// The free queue from head (next victim) to tail. O(n).
    pub fn free_queue(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.queue.iter()
    }

    /// Number of distinct cached hashes. O(1).
    #[must_use]
    pub fn num_cached_hashes(&self) -> usize {
        self.map.len()
    }

    /// The first-inserted block cached under `h`; no side effects. O(1).
    #[must_use]
    pub fn get_cached(&self, h: &BlockHash) -> Option<BlockId> {
        self.map.get(h).map(Copies::first)
    }

    /// Takes a reference on each block, removing free ones from the queue. O(k).
    pub fn touch(&mut self, blocks: &[BlockId]) {
        for &b in blocks {
            debug_assert!(b != BlockId::NULL);
            if self.ref_cnt[b.idx()] == 0 {
                self.queue.remove(b);
            }
            self.ref_cnt[b.idx()] += 1;
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
            debug_assert_eq!(self.ref_cnt[b.idx()], 0);
            self.ref_cnt[b.idx()] = 1;
            out.push(b);
        }
    }

    /// Drops `b`'s hash from the map (and emits `BlockRemoved`) if it has one.
    fn evict_hash(&mut self, b: BlockId) {
        let Some(h) = self.hash[b.idx()].take() else { return };
        let remove_key = match self.map.get_mut(&h).expect("hashed block is in the map") {
            Copies::One(x) => {
                assert_eq!(*x, b, "map lists another block under this hash");
                true
            }
            Copies::Many(v) => {
                let pos = v.iter().position(|&x| x == b).expect("hashed block listed under its hash");
                v.remove(pos);
                if v.len() == 1 {
                    let last = v[0];
                    self.map.insert(h, Copies::One(last));
                }
                false
            }
        };
        if remove_key {
            self.map.remove(&h);
        }
        if let Some(ev) = &mut self.events {
            ev.push(KvEvent::BlockRemoved { block_hashes: vec![h.low_u64()] });
        }
        if self.log_evictions {
            self.evicted.push(b);
        }
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
    /// O(1) amortised. The caller emits the `BlockStored` event for the run.
    pub fn cache_block(&mut self, b: BlockId, h: BlockHash) {
        assert!(self.hash[b.idx()].is_none(), "block {} already hashed", b.0);
        self.hash[b.idx()] = Some(h);
        match self.map.get_mut(&h) {
            None => {
                self.map.insert(h, Copies::One(b));
            }
            Some(Copies::One(first)) => {
                let first = *first;
                self.map.insert(h, Copies::Many(vec![first, b]));
            }
            Some(Copies::Many(v)) => v.push(b),
        }
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
            let r = &mut self.ref_cnt[b.idx()];
            assert!(*r > 0, "freeing block {} with ref count 0", b.0);
            *r -= 1;
            if *r == 0 {
                if self.hash[b.idx()].is_some() {
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
            let r = self.ref_cnt[id as usize];
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
        let mut n = 0;
        for &id in ids {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let b = BlockId(id as u32);
            if self.hash[b.idx()].is_some() {
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
        self.map.clear();
        self.hash.iter_mut().for_each(|h| *h = None);
        if let Some(ev) = &mut self.events {
            ev.push(KvEvent::AllBlocksCleared);
        }
        Ok(())
    }

    /// Records an event if events are enabled.
    pub fn emit(&mut self, make: impl FnOnce() -> KvEvent) {
        if let Some(ev) = &mut self.events {
            ev.push(make());
        }
    }

    /// Whether events are buffered.
    #[must_use]
    pub fn events_enabled(&self) -> bool {
        self.events.is_some()
    }

    /// Drains the buffered events (empty when disabled).
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        self.events.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Checks invariants 1-4 of the module header. O(n + map).
    ///
    /// # Errors
    /// The first violation found.
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        self.queue.check()?;
        ensure_inv!(!self.queue.contains(BlockId::NULL), "null block is in the free queue");
        ensure_inv!(self.hash[0].is_none(), "null block is hashed");
        ensure_inv!(self.ref_cnt[0] == 0, "null block has a ref count");
        let mut used = 0;
        let mut hashed = 0;
        for i in 1..self.num_blocks() {
            #[allow(clippy::cast_possible_truncation)]
            let b = BlockId(i as u32);
            ensure_inv!(
                (self.ref_cnt[i] == 0) == self.queue.contains(b),
                "block {i}: ref count {} but queued={}",
                self.ref_cnt[i],
                self.queue.contains(b)
            );
            used += usize::from(self.ref_cnt[i] > 0);
            if let Some(h) = self.hash[i] {
                hashed += 1;
                let listed = match self.map.get(&h) {
                    None => 0,
                    Some(Copies::One(x)) => usize::from(*x == b),
                    Some(Copies::Many(v)) => v.iter().filter(|&&x| x == b).count(),
                };
                ensure_inv!(listed == 1, "block {i} listed {listed} times under its hash");
            }
        }
        ensure_inv!(self.queue.len() + used + 1 == self.num_blocks(), "free + used + 1 != num_blocks");
        let mut entries = 0;
        for (h, c) in &self.map {
            let list: &[BlockId] = match c {
                Copies::One(b) => std::slice::from_ref(b),
                Copies::Many(v) => {
                    ensure_inv!(v.len() >= 2, "multi-copy entry with {} blocks", v.len());
                    v
                }
            };
            for b in list {
                ensure_inv!(self.hash[b.idx()] == Some(*h), "map lists block {} under a hash it lacks", b.0);
            }
            entries += list.len();
        }
        ensure_inv!(entries == hashed, "map holds {entries} blocks, {hashed} blocks are hashed");
        Ok(())
    }
}
