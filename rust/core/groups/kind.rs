//! The kind of a KV cache group: which of vLLM 0.33's single-type managers
//! it follows (full attention, MLA, sliding window, sliding-window MLA,
//! chunked local, Mamba, cross-attention), parsed from vLLM's
//! `KVCacheSpecKind` value, and what the kind decides on its own: its event
//! name and window, whether it is looked up and cached (`prefix_cacheable`),
//! whether it bounds the hybrid fixed point (`is_full`).
//!
//! # Invariants
//! - a parsed window or chunk is positive;
//! - a kind is a plain value (`Copy`): no state, every method O(1).

use crate::core::error::{KvError, KvResult};

/// vLLM's `mamba_cache_mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MambaMode {
    /// `"none"`: no prefix caching of Mamba state.
    None,
    /// `"align"`: the state at each scheduler-block boundary is cacheable.
    Align,
}

impl MambaMode {
    /// vLLM's spelling.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            MambaMode::None => "none",
            MambaMode::Align => "align",
        }
    }

    /// Parses vLLM's spelling.
    ///
    /// # Errors
    /// `InvalidArgument` for any other string.
    pub fn parse(s: &str) -> KvResult<Self> {
        match s {
            "none" => Ok(MambaMode::None),
            "align" => Ok(MambaMode::Align),
            _ => Err(KvError::invalid(format!("mamba_cache_mode must be 'none' or 'align', got {s:?}"))),
        }
    }
}

/// The attention (or state) type of a group: which single-type rule it follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GroupKind {
    /// Full attention (`FullAttentionSpec`): every block is needed.
    FullAttention,
    /// Multi-head latent attention (`MLAAttentionSpec`): full-attention rules,
    /// its own spec set and event kind.
    Mla,
    /// Sliding window of `window` tokens (`SlidingWindowSpec`).
    SlidingWindow {
        /// Tokens each query attends to, itself included.
        window: usize,
    },
    /// Sliding window in MLA's cache format (`SlidingWindowMLASpec`): the
    /// sliding-window rule, its own spec set and event kind.
    SlidingWindowMla {
        /// Tokens each query attends to, itself included.
        window: usize,
        /// vLLM's `bounded_replay`: the group is not prefix-cacheable (a hit
        /// rebuilds its window by recomputing the hit's last `window` tokens,
        /// which the scheduler schedules).
        bounded_replay: bool,
    },
    /// Chunked local attention with chunks of `chunk` tokens
    /// (`ChunkedLocalAttentionSpec`).
    ChunkedLocal {
        /// Tokens per attention chunk.
        chunk: usize,
    },
    /// Mamba / linear-attention state (`MambaSpec`).
    Mamba {
        /// vLLM's `mamba_cache_mode`.
        mode: MambaMode,
    },
    /// Cross-attention of an encoder-decoder model (`CrossAttentionSpec`):
    /// blocks for the request's encoder tokens, allocated when its encoder
    /// inputs are scheduled; never a hit, never cached, nothing skipped.
    CrossAttention,
    /// A circular buffer (`CircularBufferSpec`, e.g. a compressor's ring of
    /// keys still being compressed): one block per request for its whole
    /// life, whatever its length; never a hit, never cached.
    CircularBuffer,
}

impl GroupKind {
    /// vLLM's `KVCacheSpecKind` value, as KV events carry it.
    #[must_use]
    pub fn kind_name(self) -> &'static str {
        match self {
            GroupKind::FullAttention => "full_attention",
            GroupKind::Mla => "mla_attention",
            GroupKind::SlidingWindow { .. } => "sliding_window",
            GroupKind::SlidingWindowMla { .. } => "sliding_window_mla",
            GroupKind::ChunkedLocal { .. } => "chunked_local_attention",
            GroupKind::Mamba { .. } => "mamba",
            GroupKind::CrossAttention => "cross_attention",
            GroupKind::CircularBuffer => "circular_buffer",
        }
    }

    /// The window KV events carry (`kv_cache_spec_sliding_window`), and the
    /// window of the sliding-window rule (plain or MLA).
    #[must_use]
    pub fn sliding_window(self) -> Option<usize> {
        match self {
            GroupKind::SlidingWindow { window } | GroupKind::SlidingWindowMla { window, .. } => Some(window),
            _ => None,
        }
    }

    /// Whether the group's blocks are looked up and cached: false for
    /// sliding-window MLA with bounded replay (vLLM's `prefix_cacheable`),
    /// for cross-attention (vLLM's `CrossAttentionManager` does neither) and
    /// for circular buffers (scratch, per request).
    #[must_use]
    pub fn prefix_cacheable(self) -> bool {
        !matches!(
            self,
            GroupKind::SlidingWindowMla { bounded_replay: true, .. }
                | GroupKind::CrossAttention
                | GroupKind::CircularBuffer
        )
    }

    /// Whether the kind is a `FullAttentionSpec` in vLLM (full or MLA): it
    /// bounds the hybrid fixed point and is looked up first.
    #[must_use]
    pub fn is_full(self) -> bool {
        matches!(self, GroupKind::FullAttention | GroupKind::Mla)
    }

    /// Whether vLLM's manager for the kind supports fine-grained (sub-block)
    /// hash lookups (`supports_fine_grained_hash_lookup`).
    #[must_use]
    pub fn fine_grained_lookup(self) -> bool {
        matches!(self, GroupKind::FullAttention | GroupKind::Mla | GroupKind::Mamba { .. })
    }

    /// Parses a kind from vLLM's `KVCacheSpecKind` value and its parameters:
    /// `size`, the window (sliding window, plain or MLA) or the chunk
    /// (chunked local); `mode`, the `mamba_cache_mode` for Mamba, and for
    /// sliding-window MLA `"bounded_replay"` or `"none"` (other kinds ignore it).
    ///
    /// # Errors
    /// `InvalidArgument` for an unknown kind or mode, a zero window or chunk,
    /// or a kind kvindex does not implement (named in the message).
    pub fn parse(kind: &str, size: usize, mode: &str) -> KvResult<Self> {
        let k = match kind {
            "full_attention" => GroupKind::FullAttention,
            "mla_attention" => GroupKind::Mla,
            "sliding_window" => GroupKind::SlidingWindow { window: size },
            "sliding_window_mla" => {
                let bounded_replay = match mode {
                    "bounded_replay" => true,
                    "none" | "" => false,
                    _ => {
                        return Err(KvError::invalid(format!(
                            "sliding_window_mla mode must be 'bounded_replay' or 'none', got {mode:?}"
                        )))
                    }
                };
                GroupKind::SlidingWindowMla { window: size, bounded_replay }
            }
            "chunked_local_attention" => GroupKind::ChunkedLocal { chunk: size },
            "mamba" => GroupKind::Mamba { mode: MambaMode::parse(mode)? },
            "cross_attention" => GroupKind::CrossAttention,
            "circular_buffer" => GroupKind::CircularBuffer,
            "sink_full_attention" | "encoder_only_attention" => {
                return Err(KvError::invalid(format!(
                    "KV cache group kind {kind:?} is not supported by kvindex"
                )));
            }
            _ => return Err(KvError::invalid(format!("unknown KV cache group kind {kind:?}"))),
        };
        match k {
            GroupKind::SlidingWindow { window: 0 } | GroupKind::SlidingWindowMla { window: 0, .. } => {
                Err(KvError::invalid("sliding_window must be positive"))
            }
            GroupKind::ChunkedLocal { chunk: 0 } => {
                Err(KvError::invalid("attention_chunk_size must be positive"))
            }
            _ => Ok(k),
        }
    }
}
