//! Pure-Rust core of kvindex. Nothing under this module imports pyo3 or numpy.
//!
//! One word per concept: a *design* is a way of answering prefix questions
//! (the [`request::PrefixDesign`] trait; the hash chain and the radix tree
//! are the two designs, [`hash_chain::HashChainDesign`] and
//! [`radix_cache::RadixDesign`]); the *request layer*
//! ([`request::PrefixCache`]) runs requests over any design.
//!
//! | module | what it holds |
//! |---|---|
//! | [`ids`] | identity newtypes (`BlockId`, `PageId`, `RequestId`, `BlockHash`) |
//! | [`error`] | caller errors (`KvError`) and invariant violations |
//! | [`hash`] | chained block hashing: kvindex's own encodings and bit-exact vLLM modes |
//! | [`free_queue`] | intrusive doubly linked free list over block ids (vLLM's LRU order) |
//! | [`groups`] | KV cache groups: kinds, layouts, vLLM's per-kind hit rules and the hybrid fixed point |
//! | [`events`] | the KV event values (`BlockStored`, `BlockRemoved`, `AllBlocksCleared`) |
//! | [`event_buffer`] | a design's KV events (`Events`): off, or a bounded drop-oldest buffer that counts what it drops |
//! | [`block_pool`] | ref-counted blocks, hash -> block map, lazy eviction, KV events |
//! | [`memo`] | the hash chain's prompt hasher: the block hasher and the prefix memo (cached blocks by (parent hash, tokens)) |
//! | [`request`] | the request lifecycle (admit/append/free, engine steps, tables, stats, events), generic over a design |
//! | [`hash_chain`] | the hash-chain design: vLLM `KVCacheManager` semantics under the request layer |
//! | [`radix`] | radix tree with SGLang `RadixCache` semantics (split, locks, leaf eviction) |
//! | [`pages`] | per-token slots <-> page ids (SSE2 fast paths, scalar reference) |
//! | [`wide_tokens`] | int64 token ids read in place against int32 ones (run-time AVX2 / AVX-512 dispatch, scalar reference) |
//! | [`page_pool`] | ref-counted pool of KV pages (`PageId`) behind the radix design |
//! | [`tables`] | block tables and slot mappings for kernels, shared by both designs |
//! | [`radix_cache`] | the radix design: SGLang's request lifecycle over the tree, under the request layer |
//! | [`vllm_manager`] | vLLM 0.33's single-group `KVCacheManager` calls over the block pool, on the request's own block hashes |
//! | [`wire`] | KV events as vLLM 0.33 msgpack batches (encode, decode) |
//! | [`cluster`] | the cluster prefix index: which workers hold which blocks, fed by their event streams |
//!
//! # Where `unsafe` lives, and why
//! The crate denies `unsafe_code`; four places allow it, each block with
//! its `SAFETY` reason:
//! - [`pages`]: SSE2 intrinsics (unaligned loads and stores through
//!   pointers into the slices at hand) for slot <-> page conversion, tested
//!   against its scalar reference;
//! - [`wide_tokens`]: x86 intrinsics (unaligned loads, in functions
//!   compiled for a feature the CPU was seen to have) for int64 token reads,
//!   tested against its scalar reference;
//! - [`cluster::huge`]: the allocator trait and a `madvise` call (the
//!   cluster block table's huge-page allocator);
//! - [`cluster::table`]: one `PREFETCHT0` hint (never faults, reads nothing).
//!
//! Nothing else in the core is `unsafe`; a new use is added to this list.

pub mod block_pool;
pub mod cluster;
pub mod error;
pub mod event_buffer;
pub mod events;
pub mod free_queue;
pub mod groups;
pub mod hash;
pub mod hash_chain;
pub mod ids;
pub mod memo;
pub mod page_pool;
pub mod pages;
#[cfg(test)]
pub(crate) mod prop_config;
pub mod radix;
pub mod radix_cache;
pub mod request;
pub mod tables;
pub mod vllm_manager;
pub mod wide_tokens;
pub mod wire;
