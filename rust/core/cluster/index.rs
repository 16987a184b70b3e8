//! [`ClusterIndex`]: block hash -> holder workers (membership, reference
//! counts), queries; each worker's stream protocol (sequence numbers,
//! duplicates, gaps, restarts) is [`super::stream`]'s.
//!
//! Invariants and costs: the module header of [`crate::core::cluster`]
//! (checked by [`ClusterIndex::check_invariants`]).

use hashbrown::hash_table::Entry;
use hashbrown::HashMap;
use rustc_hash::FxBuildHasher;
use xxhash_rust::xxh3::xxh3_64;

use super::holders::{bit_ids, Set, SET_TAG};
use super::layout::group_key;
use super::ops::{batch_ops, GroupSizes, Op, Ops};
use super::stream::{Outcome, Worker};
use super::table::{Ahead, BlockTable, Key};
use crate::core::error::{InvariantViolation, KvError, KvResult};
use crate::core::hash::{BlockHasher, KeySpec, Token};
use crate::core::ids::BlockHash;

/// A worker slot: one (engine, data-parallel rank) stream. Slots of removed
/// workers are reused by later ones (lowest free slot first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkerId(pub u32);

/// Most worker slots (ids must stay below the block map's set tag).
pub const MAX_WORKERS: usize = 1 << 20;

/// Block-map value meaning "not in the map" in query scratch (never a
/// worker id, never a slab index: the slab stays below `u32::MAX & !SET_TAG`).
const MISSING: u32 = u32::MAX;

/// Blocks looked up ahead of the query walk.
const LOOKAHEAD: usize = 32;

/// Updates between a hash's prefetch and its update: far enough ahead to
/// cover a memory access (~100-150 ns) at ~30 ns per update, near enough that
/// the lines are still in L1 when used (measured flat from 8 to 24).
const PREFETCH_DISTANCE: usize = 12;

/// The prefix index of a cluster: which of its workers holds which blocks.
/// See the module header for layout and costs.
#[derive(Clone, Debug, Default)]
pub struct ClusterIndex {
    block_size: i64,
    /// hash -> worker id (< [`SET_TAG`]) or `SET_TAG | slab index`.
    blocks: BlockTable,
    sets: Vec<Set>,
    free_sets: Vec<u32>,
    /// Announcements beyond the first of (hash, worker).
    extra: HashMap<(u64, u32), u32, FxBuildHasher>,
    workers: Vec<Option<Worker>>,
    /// Batches for worker slots that hold no worker.
    unknown_worker_batches: u64,
    /// Bumped by every worker added or removed.
    membership: u64,
    /// Reused decoding buffers.
    scratch: Ops,
}

impl ClusterIndex {
    /// An empty index for blocks of `block_size` tokens.
    ///
    /// # Errors
    /// `InvalidArgument` unless `1 <= block_size <= 2**20`.
    pub fn new(block_size: i64) -> KvResult<Self> {
        if !(1..=1 << 20).contains(&block_size) {
            return Err(KvError::invalid(format!("block_size must be in 1..=2**20, got {block_size}")));
        }
        Ok(ClusterIndex { block_size, ..ClusterIndex::default() })
    }

    /// Tokens per block.
    #[must_use]
    pub fn block_size(&self) -> i64 {
        self.block_size
    }

    /// Number of worker slots (present or free): the length of query answers.
    #[must_use]
    pub fn slots(&self) -> usize {
        self.workers.len()
    }

    /// The worker in slot `w`, if any.
    #[must_use]
    pub fn worker(&self, w: WorkerId) -> Option<&Worker> {
        self.workers.get(w.0 as usize).and_then(Option::as_ref)
    }

    /// Present workers.
    pub fn workers(&self) -> impl Iterator<Item = (WorkerId, &Worker)> {
        #[allow(clippy::cast_possible_truncation)]
        self.workers.iter().enumerate().filter_map(|(i, w)| w.as_ref().map(|w| (WorkerId(i as u32), w)))
    }

    /// Distinct blocks in the index.
    #[must_use]
    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// (block, worker) pairs in the index.
    #[must_use]
    pub fn num_pairs(&self) -> u64 {
        self.workers().map(|(_, w)| w.blocks).sum()
    }

    /// A counter bumped by every worker added or removed (callers caching
    /// per-slot data compare it).
    #[must_use]
    pub fn membership(&self) -> u64 {
        self.membership
    }

    /// Batches addressed to a slot without a worker.
    #[must_use]
    pub fn unknown_worker_batches(&self) -> u64 {
        self.unknown_worker_batches
    }

    /// Adds a worker (empty, [`Status::Resyncing`](super::Status::Resyncing) until its first batch).
    /// O(1) amortised.
    ///
    /// # Errors
    /// `Capacity` beyond [`MAX_WORKERS`].
    pub fn add_worker(&mut self, name: &str, dp_rank: i64) -> KvResult<WorkerId> {
        let w = Worker::new(name, dp_rank, self.membership + 1);
        let slot = match self.workers.iter().position(Option::is_none) {
            Some(i) => i,
            None if self.workers.len() < MAX_WORKERS => {
                self.workers.push(None);
                self.workers.len() - 1
            }
            None => {
                return Err(KvError::new(
                    crate::core::error::ErrorKind::Capacity,
                    format!("at most {MAX_WORKERS} workers"),
                ))
            }
        };
        self.workers[slot] = Some(w);
        self.membership += 1;
        #[allow(clippy::cast_possible_truncation)]
        Ok(WorkerId(slot as u32))
    }

    /// Removes a worker and every block it holds. O(blocks in the index).
    ///
    /// # Errors
    /// `InvalidArgument` for an empty slot.
    pub fn remove_worker(&mut self, w: WorkerId) -> KvResult<()> {
        self.require(w)?;
        self.clear_worker(w);
        self.workers[w.0 as usize] = None;
        self.membership += 1;
        while self.workers.last().is_some_and(Option::is_none) {
            self.workers.pop();
        }
        Ok(())
    }

    pub(super) fn require(&self, w: WorkerId) -> KvResult<()> {
        if self.worker(w).is_none() {
            return Err(KvError::invalid(format!("no worker in slot {}", w.0)));
        }
        Ok(())
    }

    pub(super) fn wk(&mut self, w: WorkerId) -> &mut Worker {
        match self.workers.get_mut(w.0 as usize) {
            Some(Some(x)) => x,
            // Callers check presence first.
            _ => unreachable!("worker slot checked by the caller"),
        }
    }

    /// Applies one received `KVEventBatch` payload of worker `w` with
    /// sequence number `seq` (None: no sequence tracking, applied as is).
    /// The payload is decoded in full before anything is applied, so a
    /// malformed batch changes no block. O(payload bytes + blocks).
    ///
    /// # Errors
    /// `InvalidArgument` for an empty slot (counted in
    /// [`Self::unknown_worker_batches`]).
    pub fn apply(&mut self, w: WorkerId, seq: Option<u64>, payload: &[u8]) -> KvResult<Outcome> {
        if self.worker(w).is_none() {
            self.unknown_worker_batches += 1;
            return Err(KvError::invalid(format!("batch for slot {}, which holds no worker", w.0)));
        }
        let digest = xxh3_64(payload);
        let mut restarted = false;
        if let Some(seq) = seq {
            let (restart, early) = self.wk(w).order(seq, digest);
            if restart {
                self.clear_worker(w);
                restarted = true;
            }
            if let Some(outcome) = early {
                return Ok(outcome);
            }
        }
        let mut ops = std::mem::take(&mut self.scratch);
        let sizes = GroupSizes {
            default: self.block_size,
            per_group: self.worker(w).map_or(&[][..], |x| x.groups.block_sizes()),
        };
        let mut read = batch_ops(payload, sizes, &mut ops).map_err(|e| e.to_string());
        let dp = self.wk(w).dp_rank;
        if let (Ok(()), Some(r)) = (&read, ops.dp_rank) {
            if r != dp {
                read = Err(format!("batch of data-parallel rank {r} on the stream of rank {dp}"));
            }
        }
        if let Err(e) = read {
            self.scratch = ops;
            self.wk(w).malformed(seq);
            return Ok(Outcome::Malformed(e));
        }
        key_groups(&mut ops);
        let (stored, removed, unknown, cleared_now) = self.apply_ops(w, &ops);
        let skipped = ops.skipped as u64;
        let (full, other) = (ops.full_groups, ops.other_groups);
        self.scratch = ops;
        let wk = self.wk(w);
        wk.groups.saw(full, other);
        wk.stats.batches += 1;
        wk.stats.stored += stored;
        wk.stats.removed += removed;
        wk.stats.unknown_removals += unknown;
        wk.stats.skipped_events += skipped;
        wk.applied(seq, digest, cleared_now);
        Ok(if restarted { Outcome::Restarted } else { Outcome::Applied })
    }

    /// Applies a decoded batch in order: (stored, removed, unknown removals,
    /// whether it cleared). Before each update, the table lines of the hash
    /// [`PREFETCH_DISTANCE`] updates ahead are prefetched, so that many
    /// updates' cache misses are in flight at once (see [`super::table`]).
    fn apply_ops(&mut self, w: WorkerId, ops: &Ops) -> (u64, u64, u64, bool) {
        let (mut stored, mut removed, mut unknown, mut cleared_now) = (0u64, 0u64, 0u64, false);
        let hashes = &ops.hashes[..];
        let mut ahead = self.blocks.ahead();
        fetch_first(ahead, hashes);
        for op in &ops.ops {
            match *op {
                Op::Store(a, b, _) => {
                    for k in a..b {
                        fetch_at(ahead, hashes, k + PREFETCH_DISTANCE);
                        self.add(hashes[k], w);
                    }
                    stored += (b - a) as u64;
                }
                Op::Remove(a, b, _) => {
                    for k in a..b {
                        fetch_at(ahead, hashes, k + PREFETCH_DISTANCE);
                        if !self.remove(hashes[k], w) {
                            unknown += 1;
                        }
                    }
                    removed += (b - a) as u64;
                }
                Op::Clear => {
                    self.clear_worker(w);
                    self.wk(w).stats.cleared += 1;
                    cleared_now = true;
                }
            }
            if ahead.map_or(0, |a| a.buckets()) != self.blocks.buckets() {
                // The table grew (or was empty): prefetch into its allocation now.
                ahead = self.blocks.ahead();
            }
        }
        (stored, removed, unknown, cleared_now)
    }

    /// Whether a query must score by groups ([`Self::scores`]) rather than by
    /// group 0's leading blocks ([`Self::overlaps`]): some worker declared a
    /// layout, or its events named another group full attention. O(workers).
    #[must_use]
    pub fn needs_group_scores(&self) -> bool {
        self.workers().any(|(_, w)| w.groups.layout().is_some() || w.groups.full_group() != 0)
    }

    /// Declares worker `w`'s KV cache group layout (None: forgets it). From
    /// then on its `BlockStored` events must have their group's block size,
    /// and it is scored by the hit its engine would give over those groups.
    /// The blocks it holds stay (they are keyed by group index).
    ///
    /// # Errors
    /// `InvalidArgument` for an empty slot.
    pub fn set_worker_layout(
        &mut self,
        w: WorkerId,
        layout: Option<std::sync::Arc<super::layout::ClusterLayout>>,
    ) -> KvResult<()> {
        self.require(w)?;
        self.wk(w).groups.set_layout(layout);
        Ok(())
    }

    /// Gives up on worker `w`'s missing batches before `seq`: the worker is
    /// degraded and its stream continues from `seq`.
    ///
    /// # Errors
    /// `InvalidArgument` for an empty slot.
    pub fn give_up(&mut self, w: WorkerId, seq: u64) -> KvResult<()> {
        self.require(w)?;
        self.wk(w).give_up(seq);
        Ok(())
    }

    /// Records blocks as held by `w` without a stream (a router's own
    /// decisions in approximate mode, tests). Reference-counted like events.
    ///
    /// # Errors
    /// `InvalidArgument` for an empty slot.
    pub fn store_hashes(&mut self, w: WorkerId, hashes: &[u64]) -> KvResult<()> {
        self.require(w)?;
        let ahead = self.blocks.ahead();
        fetch_first(ahead, hashes);
        for k in 0..hashes.len() {
            fetch_at(ahead, hashes, k + PREFETCH_DISTANCE);
            self.add(hashes[k], w);
        }
        Ok(())
    }

    /// Drops one reference of `w` to each of `hashes`; returns how many were
    /// not held.
    ///
    /// # Errors
    /// `InvalidArgument` for an empty slot.
    pub fn remove_hashes(&mut self, w: WorkerId, hashes: &[u64]) -> KvResult<u64> {
        self.require(w)?;
        Ok(hashes.iter().map(|&h| u64::from(!self.remove(h, w))).sum())
    }

    fn add(&mut self, h: u64, w: WorkerId) {
        let id = w.0;
        let mut new_pair = true;
        match self.blocks.entry(h) {
            Entry::Vacant(v) => {
                v.insert((Key::of(h), id));
            }
            Entry::Occupied(mut o) => {
                let v = o.get().1;
                if v & SET_TAG == 0 {
                    if v == id {
                        new_pair = false;
                    } else {
                        let set = Set::List(if v < id { vec![v, id] } else { vec![id, v] });
                        let slot = match self.free_sets.pop() {
                            Some(s) => {
                                self.sets[s as usize] = set;
                                s
                            }
                            None => {
                                self.sets.push(set);
                                #[allow(clippy::cast_possible_truncation)]
                                let s = (self.sets.len() - 1) as u32;
                                s
                            }
                        };
                        o.get_mut().1 = SET_TAG | slot;
                    }
                } else {
                    new_pair = self.sets[(v & !SET_TAG) as usize].insert(id);
                }
            }
        }
        if new_pair {
            self.wk(w).blocks += 1;
        } else {
            *self.extra.entry((h, id)).or_insert(0) += 1;
        }
    }

    fn remove(&mut self, h: u64, w: WorkerId) -> bool {
        let id = w.0;
        if !self.extra.is_empty() {
            if let hashbrown::hash_map::Entry::Occupied(mut o) = self.extra.entry((h, id)) {
                *o.get_mut() -= 1;
                if *o.get() == 0 {
                    o.remove();
                }
                return true;
            }
        }
        let Some(mut o) = self.blocks.find(h) else {
            return false;
        };
        let v = o.get().1;
        if v & SET_TAG == 0 {
            if v != id {
                return false;
            }
            o.remove();
        } else {
            let slot = v & !SET_TAG;
            let set = &mut self.sets[slot as usize];
            if !set.remove(id) {
                return false;
            }
            if set.len() == 1 {
                o.get_mut().1 = set.ids()[0];
                *set = Set::Free;
                self.free_sets.push(slot);
            }
        }
        self.wk(w).blocks -= 1;
        true
    }

    /// Drops every block of `w`. O(blocks in the index + extra references).
    pub(super) fn clear_worker(&mut self, w: WorkerId) {
        let id = w.0;
        let ClusterIndex { blocks, sets, free_sets, extra, .. } = self;
        if self.workers[id as usize].as_ref().is_some_and(|x| x.blocks == 0) {
            return;
        }
        blocks.retain(|_, v| {
            if *v & SET_TAG == 0 {
                return *v != id;
            }
            let slot = *v & !SET_TAG;
            let set = &mut sets[slot as usize];
            if set.remove(id) && set.len() == 1 {
                *v = set.ids()[0];
                *set = Set::Free;
                free_sets.push(slot);
            }
            true
        });
        if !extra.is_empty() {
            extra.retain(|&(_, x), _| x != id);
        }
        self.wk(w).blocks = 0;
    }

    /// For each worker slot, the number of leading `hashes` it holds (0 for
    /// empty slots), written to `out` (resized to [`Self::slots`]).
    /// O(blocks until no worker matches × (words of the worker bitset + holders)).
    pub fn overlaps(&self, hashes: &[u64], out: &mut Vec<u32>) {
        let mut walk = Walk::new(self, out);
        // Look a chunk of blocks up first: independent probes overlap their
        // cache misses, which matters once the table outgrows the caches.
        let mut vals = [MISSING; LOOKAHEAD];
        for chunk in hashes.chunks(LOOKAHEAD) {
            self.lookup(chunk, &mut vals);
            if !walk.step(self, &vals[..chunk.len()], out) {
                return;
            }
        }
        walk.finish(out);
    }

    /// [`Self::overlaps`] of a prompt's tokens, hashed with `hasher` (the
    /// workers' algorithm and seed), `block_size` and `spec` on the way:
    /// hashing a chunk of blocks overlaps the table probes of the chunk
    /// before, and hashing stops once no worker matches. `chain` and `hashes`
    /// are scratch (the hashes computed, as events carry them); returns the
    /// prompt's number of full blocks.
    #[allow(clippy::too_many_arguments)]
    pub fn overlaps_tokens<T: Token>(
        &self,
        hasher: &mut BlockHasher,
        tokens: &[T],
        block_size: usize,
        spec: &KeySpec,
        chain: &mut Vec<BlockHash>,
        hashes: &mut Vec<u64>,
        out: &mut Vec<u32>,
    ) -> usize {
        const CHUNK: usize = 8;
        let n = tokens.len() / block_size.max(1);
        chain.clear();
        hashes.clear();
        let mut walk = Walk::new(self, out);
        let mut vals = [[MISSING; CHUNK]; 2];
        let mut pending: Option<(usize, usize)> = None; // (buffer, len) looked up, not walked
        let mut k = 0;
        while k < n {
            let end = (k + CHUNK).min(n);
            hasher.extend_chain(&tokens[..end * block_size], block_size, spec, chain);
            hashes.extend(chain[k..end].iter().map(BlockHash::low_u64));
            let buf = (k / CHUNK) % 2;
            self.lookup(&hashes[k..end], &mut vals[buf]);
            if let Some((pb, len)) = pending {
                if !walk.step(self, &vals[pb][..len], out) {
                    return n;
                }
            }
            pending = Some((buf, end - k));
            k = end;
        }
        if let Some((pb, len)) = pending {
            if !walk.step(self, &vals[pb][..len], out) {
                return n;
            }
        }
        walk.finish(out);
        n
    }

    /// The block-map values of `hashes` ([`MISSING`] when absent) into `vals`.
    #[inline]
    fn lookup(&self, hashes: &[u64], vals: &mut [u32]) {
        for (v, h) in vals.iter_mut().zip(hashes) {
            *v = self.blocks.get(*h).unwrap_or(MISSING);
        }
    }

    /// The block-map value of key `h` ([`MISSING`] when absent): the holder,
    /// or a holder set's tag and slot.
    #[inline]
    pub(super) fn value(&self, h: u64) -> u32 {
        self.blocks.get(h).unwrap_or(MISSING)
    }

    /// Whether the block-map value `v` ([`Self::value`]) names worker `w`.
    #[inline]
    pub(super) fn value_holds(&self, v: u32, w: u32) -> bool {
        if v == MISSING {
            false
        } else if v & SET_TAG == 0 {
            v == w
        } else {
            self.sets[(v & !SET_TAG) as usize].contains(w)
        }
    }

    /// Whether worker `w` holds block `h` (and how many announcements).
    #[must_use]
    pub fn refs(&self, h: u64, w: WorkerId) -> u32 {
        let held = match self.blocks.get(h) {
            None => false,
            Some(v) if v & SET_TAG == 0 => v == w.0,
            Some(v) => self.sets[(v & !SET_TAG) as usize].contains(w.0),
        };
        if held {
            1 + self.extra.get(&(h, w.0)).copied().unwrap_or(0)
        } else {
            0
        }
    }

    /// Every block `w` holds, unordered. O(blocks in the index).
    #[must_use]
    pub fn worker_blocks(&self, w: WorkerId) -> Vec<u64> {
        self.blocks
            .iter()
            .filter(|&(_, v)| {
                if v & SET_TAG == 0 {
                    v == w.0
                } else {
                    self.sets[(v & !SET_TAG) as usize].contains(w.0)
                }
            })
            .map(|(h, _)| h)
            .collect()
    }

    /// Bytes the index holds (tables at capacity, holder sets, workers).
    #[must_use]
    pub fn memory_bytes(&self) -> usize {
        // hashbrown keeps at most 7/8 of its (power-of-two) buckets full;
        // each bucket is one entry plus one control byte.
        let map = |cap: usize, entry: usize| {
            let buckets =
                if cap < 8 { cap + usize::from(cap > 0) } else { (cap * 8 / 7).next_power_of_two() };
            buckets * (entry + 1)
        };
        self.blocks.memory_bytes()
            + map(self.extra.capacity(), 16)
            + self.sets.capacity() * std::mem::size_of::<Set>()
            + self.sets.iter().map(Set::heap_bytes).sum::<usize>()
            + self.free_sets.capacity() * 4
            + self.workers.capacity() * std::mem::size_of::<Option<Worker>>()
            + self.workers().map(|(_, w)| w.heap_bytes()).sum::<usize>()
    }

    /// Checks every structural invariant. O(blocks + pairs).
    ///
    /// # Errors
    /// The first violation found.
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        use crate::ensure_inv;
        let mut pairs = vec![0u64; self.workers.len()];
        let mut referenced = vec![false; self.sets.len()];
        let present = |id: u32| self.workers.get(id as usize).is_some_and(Option::is_some);
        for (h, v) in self.blocks.iter() {
            if v & SET_TAG == 0 {
                ensure_inv!(present(v), "block {h:#x} held by absent worker {v}");
                pairs[v as usize] += 1;
                continue;
            }
            let slot = (v & !SET_TAG) as usize;
            ensure_inv!(slot < self.sets.len(), "block {h:#x}: set slot {slot} out of range");
            ensure_inv!(!referenced[slot], "set slot {slot} referenced twice");
            referenced[slot] = true;
            let set = &self.sets[slot];
            ensure_inv!(set.len() >= 2, "block {h:#x}: set of {} holders", set.len());
            if let Set::Bits(b, n) = set {
                ensure_inv!(
                    b.iter().map(|x| x.count_ones()).sum::<u32>() == *n,
                    "block {h:#x}: bitset count {n} wrong"
                );
            }
            let ids = set.ids();
            ensure_inv!(ids.windows(2).all(|p| p[0] < p[1]), "block {h:#x}: holders not sorted/distinct");
            for id in ids {
                ensure_inv!(present(id), "block {h:#x} held by absent worker {id}");
                pairs[id as usize] += 1;
            }
        }
        for (slot, s) in self.sets.iter().enumerate() {
            let free = matches!(s, Set::Free);
            ensure_inv!(
                free != referenced[slot],
                "set slot {slot}: free={free} but referenced={}",
                referenced[slot]
            );
        }
        #[allow(clippy::cast_possible_truncation)]
        let nfree = self.free_sets.len();
        ensure_inv!(
            nfree == self.sets.iter().filter(|s| matches!(s, Set::Free)).count(),
            "free set list of {nfree} does not match free slots"
        );
        for (&(h, id), &c) in &self.extra {
            ensure_inv!(c >= 1, "extra reference count 0 for ({h:#x}, {id})");
            ensure_inv!(self.refs(h, WorkerId(id)) == c + 1, "extra references for unheld ({h:#x}, {id})");
        }
        for (i, w) in self.workers.iter().enumerate() {
            if let Some(w) = w {
                ensure_inv!(
                    w.blocks == pairs[i],
                    "worker {i}: {} blocks counted, {} held",
                    w.blocks,
                    pairs[i]
                );
            }
        }
        ensure_inv!(self.workers.last().is_none_or(Option::is_some), "trailing empty worker slot");
        Ok(())
    }
}

/// Replaces the hashes of groups other than 0 by their group keys
/// ([`group_key`]), so that one block table holds every group apart.
fn key_groups(ops: &mut Ops) {
    for op in &ops.ops {
        if let Op::Store(a, b, g) | Op::Remove(a, b, g) = *op {
            if g != 0 {
                for h in &mut ops.hashes[a..b] {
                    *h = group_key(*h, g);
                }
            }
        }
    }
}

/// Prefetches the table lines of the first [`PREFETCH_DISTANCE`] `hashes`.
#[inline]
fn fetch_first(ahead: Option<Ahead>, hashes: &[u64]) {
    if let Some(a) = ahead {
        for &h in hashes.iter().take(PREFETCH_DISTANCE) {
            a.fetch(h);
        }
    }
}

/// Prefetches the table lines of `hashes[k]`, if any.
#[inline]
fn fetch_at(ahead: Option<Ahead>, hashes: &[u64], k: usize) {
    if let (Some(a), Some(&h)) = (ahead, hashes.get(k)) {
        a.fetch(h);
    }
}

/// A leading-block walk: the workers still matching, as a bitset, and how
/// many blocks were walked. Workers drop out with their count in `out`.
struct Walk {
    active: Vec<u64>,
    next: Vec<u64>,
    i: usize,
}

impl Walk {
    fn new(ix: &ClusterIndex, out: &mut Vec<u32>) -> Self {
        let n = ix.workers.len();
        out.clear();
        out.resize(n, 0);
        let words = n.div_ceil(64);
        let mut active = vec![0u64; words];
        for (i, w) in ix.workers.iter().enumerate() {
            if w.is_some() {
                active[i / 64] |= 1 << (i % 64);
            }
        }
        Walk { active, next: vec![0u64; words], i: 0 }
    }

    /// Walks the next blocks (their map values); false once no worker matches.
    fn step(&mut self, ix: &ClusterIndex, vals: &[u32], out: &mut [u32]) -> bool {
        for &v in vals {
            let (active, next) = (&mut self.active, &mut self.next);
            next.fill(0);
            if v == MISSING {
                // no holder
            } else if v & SET_TAG == 0 {
                let (k, m) = ((v / 64) as usize, 1u64 << (v % 64));
                next[k] = active[k] & m;
            } else {
                ix.sets[(v & !SET_TAG) as usize].intersect_into(active, next);
            }
            let mut any = 0u64;
            for (k, (a, x)) in active.iter().zip(next.iter()).enumerate() {
                let dropped = a & !x;
                if dropped != 0 {
                    for b in bit_ids(&[dropped]) {
                        #[allow(clippy::cast_possible_truncation)]
                        {
                            out[k * 64 + b as usize] = self.i as u32;
                        }
                    }
                }
                any |= x;
            }
            std::mem::swap(&mut self.active, &mut self.next);
            self.i += 1;
            if any == 0 {
                return false;
            }
        }
        true
    }

    /// Workers still matching hold every block walked.
    fn finish(&self, out: &mut [u32]) {
        #[allow(clippy::cast_possible_truncation)]
        for b in bit_ids(&self.active) {
            out[b as usize] = self.i as u32;
        }
    }
}
