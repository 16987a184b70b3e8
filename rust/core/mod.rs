//! Pure-Rust core of kvindex. Nothing under this module imports pyo3 or numpy.
//!
//! | module | what it holds |
//! |---|---|
//! | [`ids`] | identity newtypes (`BlockId`, `RequestId`, `BlockHash`) |
//! | [`error`] | caller errors (`KvError`) and invariant violations |
//! | [`hash`] | chained block hashing: kvindex's own encodings and bit-exact vLLM modes |
//! | [`free_queue`] | intrusive doubly linked free list over block ids (vLLM's LRU order) |
//! | [`block_pool`] | ref-counted blocks, hash -> block map, lazy eviction, KV events |
//! | [`hash_chain`] | request-level prefix cache with vLLM `KVCacheManager` semantics |

pub mod block_pool;
pub mod error;
pub mod events;
pub mod free_queue;
pub mod hash;
pub mod hash_chain;
pub mod ids;
