//! KV events on the wire: vLLM 0.33's `KVEventBatch` msgpack payloads.
//!
//! | module | what it holds |
//! |---|---|
//! | [`msgpack`] | shortest-form msgpack writer, bounds-checked reader, generic [`msgpack::Value`] |
//! | [`event`] | [`event::WireEvent`]: events with vLLM's full field set, [`event::CacheMeta`] |
//! | [`batch`] | batch encoding (byte-exact with vLLM's msgspec encoder) and lenient decoding |
//!
//! The caches buffer [`crate::core::events::KvEvent`]s; one call
//! ([`batch::encode_cache_batch`]) turns a step's worth into payload bytes.
//!
//! Invariants and costs: see each module ([`batch`] states both for the
//! codec; [`msgpack`] reads are bounds-checked, never past the payload).

pub mod batch;
pub mod event;
pub mod msgpack;

#[cfg(test)]
mod tests;
