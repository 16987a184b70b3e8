//! Pure-Rust core of kvindex. Nothing under this module imports pyo3 or numpy.
//!
//! | module | what it holds |
//! |---|---|
//! | [`ids`] | identity newtypes (`BlockId`, `PageId`, `RequestId`, `BlockHash`) |
//! | [`error`] | caller errors (`KvError`) and invariant violations |
//! | [`hash`] | chained block hashing: kvindex's own encodings and bit-exact vLLM modes |
//! | [`free_queue`] | intrusive doubly linked free list over block ids (vLLM's LRU order) |
//! | [`event_buffer`] | bounded drop-oldest KV event buffer (counts what it drops) |
//! | [`block_pool`] | ref-counted blocks, hash -> block map, lazy eviction, KV events |
//! | [`memo`] | prefix memo: cached blocks by (parent hash, tokens), skips re-hashing |
//! | [`request`] | the request lifecycle (admit/append/free, tables, stats), generic over a design |
//! | [`hash_chain`] | the hash-chain design: vLLM `KVCacheManager` semantics under the request layer |
//! | [`radix`] | radix tree with SGLang `RadixCache` semantics (split, locks, leaf eviction) |
//! | [`pages`] | per-token slots <-> page ids (SSE2 fast paths, scalar reference) |
//! | [`wide_tokens`] | int64 token ids read in place against int32 ones (run-time AVX2 / AVX-512 dispatch, scalar reference) |
//! | [`page_pool`] | ref-counted pool of KV pages (`PageId`) behind the radix request cache |
//! | [`tables`] | block tables and slot mappings for kernels, shared by both caches |
//! | [`radix_cache`] | the radix design: SGLang's request lifecycle over the tree, under the request layer |
//! | [`vllm_manager`] | vLLM 0.33's single-group `KVCacheManager` calls over the block pool, on the request's own block hashes |
//! | [`wire`] | KV events as vLLM 0.33 msgpack batches (encode, decode) |

pub mod block_pool;
pub mod cluster;
pub mod error;
pub mod event_buffer;
pub mod events;
pub mod free_queue;
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
