//! KV-cache events, buffered in the core and drained by the caller, in the
//! shape vLLM's KV event publisher and SGLang's use (`BlockStored`,
//! `BlockRemoved`, `AllBlocksCleared`). Hashes are reported as vLLM reports
//! them by default: the low 64 bits of the digest, read big-endian.
//!
//! Plain values: no invariants beyond the field docs (a `BlockStored`
//! carries `block_size` tokens and one extra-key entry per hash). Costs:
//! an event owns its hash and token vectors; nothing else is allocated.

/// An untagged extra key as events carry it (vLLM `to_event_extra_keys`):
/// LoRA and cache-salt keys become their value, multimodal keys
/// `(identifier, offset)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventKey {
    /// A LoRA name or a cache salt.
    Str(String),
    /// A multimodal `(identifier, offset relative to the block)`.
    Mm(String, i64),
}

/// One event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvEvent {
    /// A run of consecutive blocks became cached.
    BlockStored {
        /// Hashes of the new blocks, in chain order.
        block_hashes: Vec<u64>,
        /// Hash of the block before the run (None when the run starts at block 0).
        parent_block_hash: Option<u64>,
        /// All tokens of the run (`block_size * block_hashes.len()`).
        token_ids: Vec<i64>,
        /// Tokens per block.
        block_size: usize,
        /// LoRA adapter name, if any.
        lora_name: Option<String>,
        /// Per block: its untagged extra keys, or None.
        extra_keys: Vec<Option<Vec<EventKey>>>,
    },
    /// Blocks stopped being cached (one event per evicted physical block).
    BlockRemoved {
        /// Hashes of the removed blocks.
        block_hashes: Vec<u64>,
    },
    /// Every cached block was dropped (reset).
    AllBlocksCleared,
}
