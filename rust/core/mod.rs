//! Pure-Rust core of kvindex. Nothing under this module imports pyo3 or numpy.
//!
//! | module | what it holds |
//! |---|---|
//! | [`ids`] | identity newtypes (`BlockId`, `RequestId`, `BlockHash`) |
//! | [`error`] | caller errors (`KvError`) and invariant violations |
//! | [`hash`] | chained block hashing: kvindex's own encodings and bit-exact vLLM modes |
//! | [`free_queue`] | intrusive doubly linked free list over block ids (vLLM's LRU order) |
//! | [`block_pool`] | ref-counted blocks, hash -> block map, lazy eviction, KV events |
//! | [`memo`] | prefix memo: cached blocks by (parent hash, tokens), skips re-hashing |
//! | [`hash_chain`] | request-level prefix cache with vLLM `KVCacheManager` semantics |
//! | [`radix`] | radix tree with SGLang `RadixCache` semantics (split, locks, leaf eviction) |
//! | [`slot_pool`] | ref-counted KV slot/page pool behind the radix request cache |
//! | [`tables`] | block tables and slot mappings for kernels, shared by both caches |
//! | [`radix_cache`] | request-level prefix cache over the radix tree (hash-chain-like API) |
//! | [`wire`] | KV events as vLLM 0.33 msgpack batches (encode, decode) |

pub mod block_pool;
pub mod cluster;
pub mod error;
pub mod events;
pub mod free_queue;
pub mod hash;
pub mod hash_chain;
pub mod ids;
pub mod memo;
pub mod radix;
pub mod radix_cache;
pub mod slot_pool;
pub mod tables;
pub mod wire;
