//! The request layer: the lifecycle of running requests, written once and
//! generic over the cache design that answers prefix questions.
//!
//! A scheduler drives every design the same way. Today's one-chunk calls:
//! `admit` a prompt (hit tokens, or `None` when blocks run short), `append`
//! decode tokens (one request or a CSR batch), read block tables and slot
//! mappings, `free` the request (one or a batch). The engine lifecycle
//! (`steps`: vLLM 0.33's `allocate_slots` semantics): `admit_chunk` /
//! `resume` (chunked prefill, lookahead, external hits, delayed caching,
//! the admission gate), `schedule` / `schedule_batch` (next chunk or decode
//! step, drafts, async placeholders), `commit_tokens` / `commit_batch`,
//! `preempt`, `finish`, `finish_transfer`. Today's calls are its one-chunk
//! special case (`admit` = the whole prompt scheduled now).
//! [`PrefixCache`] implements both: id checks (unknown and duplicate ids,
//! ids repeated in one batch), the all-or-nothing block accounting, the
//! admission gate, the reset guard, statistics, tables and slot mappings
//! ([`TableSource`]), and the ref-count tally of `check_invariants`. A
//! design ([`PrefixDesign`]) answers only what differs: looking a prompt up,
//! pinning and unpinning hits, allocating (evicting if it must), caching
//! computed blocks up to a token count, and where its events are (an
//! [`crate::core::event_buffer::Events`]: the layer drains, bounds and
//! counts them, once for every design). The hash chain
//! ([`crate::core::hash_chain`]) and the radix tree
//! ([`crate::core::radix_cache`]) are two implementations; another design (a
//! hybrid of block groups, an offload tier) is a third `impl PrefixDesign`,
//! not a third copy of the lifecycle; the unit tests of this module drive
//! the lifecycle over such a third design (a plain pool that never caches,
//! about a hundred lines).
//!
//! Dispatch is static: `PrefixCache<D>` is monomorphised per design, so the
//! hot paths (`append_batch`, `admit`) compile to the design's own code.
//!
//! # Invariants (checked by [`PrefixCache::check_invariants`])
//! - the id index and the request slab agree (every indexed slot holds the
//!   request of that id, no other slot holds one);
//! - every request's table covers its `num_computed` positions (lookahead
//!   slots and rejected drafts' slots may follow; a preempted request holds
//!   none) and never holds the null block 0; `num_computed` is at most its
//!   known tokens plus placeholders plus drafts;
//! - `ref_count(b) == holders the design keeps for b + tables holding b`,
//!   for every block;
//! - plus the design's own invariants ([`PrefixDesign::check_invariants`]).
//!
//! # Costs
//! Id checks and slot lookups: O(1) hash-map probes per id; every batch
//! call validates the whole batch (O(ids), one routine:
//! `PrefixCache::validate_batch`) before changing anything. `schedule_batch` and `commit_batch` reuse the slots of the last
//! batch while each still holds the id at its position (one record read per
//! id, no probe): a scheduler sends the same running set to both calls of a
//! step and to the next step. Memory: one slab entry per running request plus its tokens and
//! table; freed slab entries are reused.

mod lifecycle;
mod opts;
mod steps;
#[cfg(test)]
mod tests;

use std::borrow::Cow;

pub use lifecycle::PrefixCache;
pub use opts::{Scheduled, StepOpts};

use crate::core::error::{InvariantViolation, KvResult};
use crate::core::event_buffer::Events;
use crate::core::hash::KeySpec;
use crate::core::ids::{RequestId, TableEntry};

pub use crate::core::tables::TableSource;

/// Prefix-cache statistics (vLLM `PrefixCacheStats`), the same for every design.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Requests admitted.
    pub requests: u64,
    /// Prompt tokens of admitted requests.
    pub queries: u64,
    /// Prompt tokens served from the cache.
    pub hits: u64,
    /// Cached blocks that lost their cache entry (reallocated, evicted).
    pub evictions: u64,
}

/// Where a request stands in the engine lifecycle.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Status {
    /// Scheduled steps run; the request holds its blocks.
    #[default]
    Running,
    /// Preempted: no blocks; its tokens (prompt + outputs so far) wait for a resume.
    Preempted,
    /// Admitted with external tokens whose transfer has not completed: holds
    /// its blocks, caches nothing until `finish_transfer`.
    WaitingForRemoteKvs,
}

/// A request's engine-lifecycle counters (vLLM's `Request` as the cache sees it).
#[derive(Clone, Debug, Default)]
pub struct Life {
    /// Positions whose KV is computed or scheduled in the step in flight
    /// (drafts of the step included).
    pub num_computed: usize,
    /// Sampled positions whose ids are not committed yet (async placeholders).
    pub pending: usize,
    /// Draft token ids of the step in flight (the last scheduled positions).
    pub drafts: Vec<i64>,
    /// Lifecycle state.
    pub status: Status,
    /// Times the request was preempted.
    pub preemptions: u32,
    /// The request never reads the cache (prompt logprobs).
    pub skip_reading: bool,
}

/// A request: the fields every design shares, then the design's own.
///
/// `repr(C)` keeps what a decode step touches (epoch, tokens, table, then
/// the first field of the design's state) together in the first cache line.
#[derive(Clone, Debug)]
#[repr(C)]
pub struct Record<T, B, X> {
    /// Batch epoch in which the request was last seen (detects an id
    /// repeated within one batch).
    pub epoch: u64,
    /// Every known token of the request: prompt, then committed outputs.
    pub tokens: Vec<T>,
    /// The table: block (or page) ids covering at least the `num_computed`
    /// positions (lookahead slots and rejected drafts' slots may follow).
    pub blocks: Vec<B>,
    /// The design's per-request state.
    pub ext: X,
    /// The request's id.
    pub id: RequestId,
    /// Lifecycle counters.
    pub life: Life,
}

/// The record type of design `D`.
pub type RecordOf<D> = Record<<D as PrefixDesign>::Tok, <D as PrefixDesign>::Entry, <D as PrefixDesign>::Ext>;

/// What an admission's pinning and allocation produced.
#[derive(Debug)]
pub struct Admitted<T, B, X> {
    /// The request's tokens (the prompt).
    pub tokens: Vec<T>,
    /// Its table: the hit blocks, then the newly allocated ones.
    pub blocks: Vec<B>,
    /// The design's per-request state.
    pub ext: X,
    /// Prompt tokens served from the cache.
    pub hit_tokens: usize,
}

/// A cache design: what the request layer asks of it. Implementations hold
/// the block pool and the prefix index; [`PrefixCache`] holds the requests.
///
/// Contract: every method that may fail checks before changing anything;
/// [`PrefixDesign::allocate`] and [`PrefixDesign::commit`] are called only
/// after the layer checked that the blocks are available
/// ([`PrefixDesign::num_available`], [`PrefixDesign::available_after`]).
pub trait PrefixDesign {
    /// Token type stored in request records.
    type Tok: Copy + Into<i64> + std::fmt::Debug;
    /// Table entry type: what the design's pool hands out ([`crate::core::ids::BlockId`],
    /// [`crate::core::ids::PageId`]).
    type Entry: TableEntry;
    /// Per-request design state (hashes, locked node, ...).
    type Ext: Clone + std::fmt::Debug;
    /// A looked-up admission, ready to pin and allocate ([`Reads::plan_admit`]).
    type Plan;

    /// Word for the units of a table in messages ("blocks", "pages").
    const UNIT: &'static str;

    /// Tokens per block.
    fn block_size(&self) -> usize;

    /// Blocks in the pool, the null block included.
    fn num_blocks(&self) -> usize;

    /// Blocks one request may ever hold (a prompt needing more is refused
    /// as too large): `num_blocks - 1` unless a design's other pools are
    /// smaller.
    fn usable_blocks(&self) -> usize {
        self.num_blocks().saturating_sub(1)
    }

    /// What bounds [`PrefixDesign::usable_blocks`], for messages.
    fn usable_what(&self) -> &'static str {
        "num_blocks - 1"
    }

    /// Blocks an append may allocate now: free ones, plus (for designs that
    /// evict on demand) those that can be evicted. O(1).
    fn num_available(&self) -> usize;

    /// Prompt tokens the plan hits (a multiple of the block size).
    fn plan_hit(&self, plan: &Self::Plan) -> usize;

    /// Blocks that stay available for allocation once the plan's hits are
    /// pinned (vLLM counts hit blocks sitting in the free queue as consumed).
    fn available_after(&self, plan: &Self::Plan) -> usize;

    /// A refused plan: dropped (a design may keep what it computed for the
    /// scheduler's retry).
    fn refuse(&mut self, plan: Self::Plan) {
        drop(plan);
    }

    /// Looks a preempted request's tokens (prompt + outputs so far) up again.
    fn plan_resume(&mut self, req: &RecordOf<Self>) -> Self::Plan;

    /// Pins the plan's hits and allocates `new_blocks` blocks after them.
    /// Caches nothing. O(hit + new blocks).
    fn commit(&mut self, plan: Self::Plan, new_blocks: usize) -> Admitted<Self::Tok, Self::Entry, Self::Ext>;

    /// Appends `n` newly allocated blocks to `table`, evicting first if the
    /// design must. The caller checked `n <= num_available()`. O(n).
    fn allocate(&mut self, n: usize, table: &mut Vec<Self::Entry>);

    /// Today's one-chunk calls: after `req` grew (tokens appended, blocks
    /// allocated) from `had_full` full blocks (0 after an admission), cache
    /// what the design caches while a request runs.
    fn appended(&mut self, req: &mut RecordOf<Self>, had_full: usize);

    /// Ids were committed to `req.tokens` (hash what they complete; cache nothing).
    fn tokens_added(&mut self, req: &mut RecordOf<Self>);

    /// Makes `req`'s full blocks up to `upto` tokens (and up to its known
    /// tokens and its table) visible to other requests' lookups.
    fn cache_to(&mut self, req: &mut RecordOf<Self>, upto: usize);

    /// Unpins `req`'s hits and releases its blocks (the table is emptied, the
    /// design state says nothing is cached). With `insert` the design first
    /// caches what it caches when a request finishes (today's `free`).
    fn release(&mut self, req: &mut RecordOf<Self>, insert: bool);

    /// Drops every cached block; called only while no request runs.
    ///
    /// # Errors
    /// The design's own refusal.
    fn reset(&mut self) -> KvResult<()>;

    /// The design's KV events (off for a design without events): the
    /// request layer drains, bounds and counts them
    /// ([`PrefixCache::take_events`] and the calls beside it).
    fn events(&self) -> &Events;

    /// The design's KV events, to drain or bound.
    fn events_mut(&mut self) -> &mut Events;

    /// Cached blocks that lost their cache entry since the last
    /// [`PrefixDesign::clear_evictions`].
    fn evictions(&self) -> u64;

    /// Zeroes the eviction tally.
    fn clear_evictions(&mut self);

    /// Holders of block `b` (the design's own plus every table's).
    fn ref_count(&self, b: Self::Entry) -> u32;

    /// Whether the design itself holds a reference on table entry `i` of
    /// `req` (beside the table's own): such a block is shared by every
    /// running request when its count is `requests + 1`.
    fn holds(&self, req: &RecordOf<Self>, i: usize) -> bool;

    /// Checks the design's invariants and each request's design state
    /// against its tokens and table (`reqs`, whose tables the layer
    /// checked), counting the design's own references into `refs` (one slot
    /// per block).
    ///
    /// # Errors
    /// The first violation found.
    fn check_invariants(&self, reqs: &[&RecordOf<Self>], refs: &mut [u32]) -> Result<(), InvariantViolation>;
}

/// A key spec argument, owned or borrowed: a design that stores the spec
/// takes an owned one without a copy, one that only reads it borrows.
pub trait SpecArg<'a> {
    /// The spec as a copy-on-write value.
    fn into_cow(self) -> Cow<'a, KeySpec>;
}

impl<'a> SpecArg<'a> for KeySpec {
    #[inline]
    fn into_cow(self) -> Cow<'a, KeySpec> {
        Cow::Owned(self)
    }
}

impl<'a> SpecArg<'a> for &'a KeySpec {
    #[inline]
    fn into_cow(self) -> Cow<'a, KeySpec> {
        Cow::Borrowed(self)
    }
}

/// The prompt side of a design, for token input type `T`.
pub trait Reads<T>: PrefixDesign {
    /// Appends `src` to a record's token list.
    fn extend_tokens(dst: &mut Vec<Self::Tok>, src: &[T]);

    /// Checks the token ids of an admission, lookup or append before
    /// anything changes (the caches' rule: every id fits in int32). The
    /// default accepts every value of `T`.
    ///
    /// # Errors
    /// `InvalidArgument` for an id outside the rule.
    #[inline]
    fn check_tokens(_tokens: &[T]) -> KvResult<()> {
        Ok(())
    }

    /// Tokens a prompt would hit now; no side effects on what is cached.
    ///
    /// # Errors
    /// A key spec the design cannot key on.
    fn lookup(&mut self, tokens: &[T], spec: &KeySpec) -> KvResult<usize>;

    /// Looks the (non-empty) prompt of request `id` up (nothing with
    /// `skip_reading`); nothing cached changes.
    ///
    /// # Errors
    /// A key spec the design cannot key on; nothing changes.
    fn plan_admit(
        &mut self,
        id: RequestId,
        tokens: &[T],
        spec: Cow<'_, KeySpec>,
        skip_reading: bool,
    ) -> KvResult<Self::Plan>;
}
