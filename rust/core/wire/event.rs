//! KV events with vLLM 0.33's full field set, as they travel on the wire.
//!
//! The caches buffer the lean [`KvEvent`]; [`WireEvent::from_cache`] adds
//! what a single-group cache knows about itself ([`CacheMeta`]: storage
//! medium, KV group, spec kind). kvindex keys LoRA adapters by name, so a
//! cache's events carry `lora_name` and send `lora_id` as None. Decoded batches produce
//! [`WireEvent`]s directly, whatever the producer filled in.
//!
//! Hashes are `u64`: the low 64 bits of the digest read big-endian (vLLM's
//! default int form). Signed and raw-bytes hashes are normalised to that on
//! decoding.
//!
//! Plain values: no invariants beyond the field docs. Costs:
//! [`WireEvent::from_cache`] moves the cache event's vectors.

use crate::core::events::{EventKey, KvEvent};
use crate::core::wire::msgpack::Value;

/// What a cache adds to its own events on the wire (per cache, not per event).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheMeta {
    /// `medium` (vLLM: `"GPU"`).
    pub medium: Option<String>,
    /// `group_idx` (vLLM: the KV-cache group, 0 for one full-attention group).
    pub group_idx: Option<i64>,
    /// `kv_cache_spec_kind` on `BlockStored` (vLLM: `"full_attention"`).
    pub kv_cache_spec_kind: Option<String>,
}

impl Default for CacheMeta {
    fn default() -> Self {
        CacheMeta {
            medium: Some("GPU".to_owned()),
            group_idx: Some(0),
            kv_cache_spec_kind: Some("full_attention".to_owned()),
        }
    }
}

/// `BlockStored` with every vLLM 0.33 field, in declaration order.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Stored {
    /// Hashes of the new blocks, in chain order.
    pub block_hashes: Vec<u64>,
    /// Hash of the block before the run (None at block 0).
    pub parent_block_hash: Option<u64>,
    /// All tokens of the run.
    pub token_ids: Vec<i64>,
    /// Tokens per block.
    pub block_size: i64,
    /// LoRA adapter id.
    pub lora_id: Option<i64>,
    /// Storage medium.
    pub medium: Option<String>,
    /// LoRA adapter name.
    pub lora_name: Option<String>,
    /// Per block: its untagged extra keys (None for a block without keys).
    pub extra_keys: Option<Vec<Option<Vec<Value>>>>,
    /// KV-cache group.
    pub group_idx: Option<i64>,
    /// KV-cache spec kind (`"full_attention"`, `"sliding_window"`, ...).
    pub kv_cache_spec_kind: Option<String>,
    /// Sliding window of that spec.
    pub kv_cache_spec_sliding_window: Option<i64>,
    /// Locality (opaque).
    pub locality: Option<Value>,
    /// Ownership (opaque).
    pub ownership: Option<Value>,
    /// Session id (opaque).
    pub session_id: Option<Value>,
    /// Lookahead token ids.
    pub lookahead_token_ids: Option<Vec<i64>>,
}

/// `BlockRemoved` with every vLLM 0.33 field.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Removed {
    /// Hashes of the removed blocks.
    pub block_hashes: Vec<u64>,
    /// Storage medium.
    pub medium: Option<String>,
    /// KV-cache group.
    pub group_idx: Option<i64>,
    /// Locality (opaque).
    pub locality: Option<Value>,
    /// Ownership (opaque).
    pub ownership: Option<Value>,
}

/// One event as vLLM sends it.
#[derive(Clone, Debug, PartialEq)]
pub enum WireEvent {
    /// Blocks became cached (boxed: it is the large variant).
    Stored(Box<Stored>),
    /// Blocks stopped being cached.
    Removed(Removed),
    /// Every cached block was dropped.
    Cleared,
}

/// An extra key as events carry it: a string, or `[identifier, offset]`.
#[must_use]
pub fn key_value(k: EventKey) -> Value {
    match k {
        EventKey::Str(s) => Value::Str(s),
        EventKey::Mm(id, off) => Value::Array(vec![Value::Str(id), Value::Int(off)]),
    }
}

impl WireEvent {
    /// A cache event with the cache's `meta` filled in.
    #[must_use]
    pub fn from_cache(e: KvEvent, meta: &CacheMeta) -> Self {
        match e {
            KvEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
                lora_name,
                extra_keys,
            } => WireEvent::Stored(Box::new(Stored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size: i64::try_from(block_size).unwrap_or(i64::MAX),
                lora_id: None,
                medium: meta.medium.clone(),
                lora_name,
                extra_keys: Some(
                    extra_keys
                        .into_iter()
                        .map(|ks| ks.map(|ks| ks.into_iter().map(key_value).collect()))
                        .collect(),
                ),
                group_idx: meta.group_idx,
                kv_cache_spec_kind: meta.kv_cache_spec_kind.clone(),
                ..Stored::default()
            })),
            KvEvent::BlockRemoved { block_hashes } => WireEvent::Removed(Removed {
                block_hashes,
                medium: meta.medium.clone(),
                group_idx: meta.group_idx,
                ..Removed::default()
            }),
            KvEvent::AllBlocksCleared => WireEvent::Cleared,
        }
    }

    /// The event's type tag.
    #[must_use]
    pub fn tag(&self) -> &'static str {
        match self {
            WireEvent::Stored(_) => "BlockStored",
            WireEvent::Removed(_) => "BlockRemoved",
            WireEvent::Cleared => "AllBlocksCleared",
        }
    }
}
