//! KV cache groups in the cluster index: membership per (worker, group) and
//! each worker's declared group layout.
//!
//! A hybrid engine (vLLM 0.33's `HybridKVCacheCoordinator`) caches each
//! block once per KV cache group, and its events say which (`group_idx`,
//! with `kv_cache_spec_kind` and the sliding window on `BlockStored`). The
//! index keeps every group apart in its one block table: group `g`'s hash
//! `h` is the key [`group_key`]`(h, g)` (group 0's key is `h` itself, so a
//! one-group engine's index is unchanged). A (worker, group) holds a block
//! when the worker holds that key.
//!
//! Group `g`'s blocks are `B_g` tokens, a multiple of the index's block size
//! `B` (the engine's hash block size, vLLM's `hash_block_size`); its block `j`
//! carries the hash of the prompt's `B`-token block `(j + 1) * B_g / B - 1`
//! (vLLM's `BlockHashListWithBlockSize`), so one hashing of the prompt at `B`
//! serves every group. A `BlockStored` of one `B`-token block with one hash
//! in a group whose blocks are larger is the engine's partial-block prefix
//! entry for a prompt ending inside a block (vLLM's `cache_partial_block`):
//! kept under that hash, as the engine's pool keeps it, never scored (hits
//! are whole blocks).
//!
//! # Invariants
//! - A worker's declared block sizes are multiples of the index's block size
//!   and at most [`MAX_GROUPS`] long.
//! - `seen_full & seen_other` may overlap only if the engine named one group
//!   by two kinds (reported, never trusted for scoring).
//!
//! # Costs
//! [`group_key`]: one multiply and xor. A layout is O(groups) bytes per worker.
//! Keys of different groups collide only if two hashes differ by exactly
//! `g * GROUP_MIX` (xor), probability 2^-64 per pair for hashes that are digests.

use std::sync::Arc;

use super::ops::MAX_GROUPS;
use crate::core::error::{KvError, KvResult};
use crate::core::groups::spec::GroupLayout;

/// The odd constant group indices are spread by (2^64 / golden ratio).
const GROUP_MIX: u64 = 0x9E37_79B9_7F4A_7C15;

/// The block-table key of hash `h` in group `g`.
#[inline]
#[must_use]
pub fn group_key(h: u64, g: u32) -> u64 {
    if g == 0 {
        h
    } else {
        h ^ u64::from(g).wrapping_mul(GROUP_MIX)
    }
}

/// A worker's declared KV cache groups (the core's [`GroupLayout`]) and
/// each group's block size as its events must carry it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterLayout {
    layout: GroupLayout,
    block_sizes: Vec<i64>,
}

impl ClusterLayout {
    /// The layout of an engine whose groups are `layout`, for an index of
    /// blocks of `index_block_size` tokens.
    ///
    /// # Errors
    /// `InvalidArgument` for more than [`MAX_GROUPS`] groups, or a layout whose
    /// hash block size is not `index_block_size` (the index would hash the
    /// prompt at another granularity than the engine's `hash_block_size`).
    pub fn new(layout: GroupLayout, index_block_size: i64) -> KvResult<Self> {
        if layout.len() > MAX_GROUPS as usize {
            return Err(KvError::invalid(format!(
                "a layout has at most {MAX_GROUPS} groups, got {}",
                layout.len()
            )));
        }
        if i64::try_from(layout.hash_block_size()).ok() != Some(index_block_size) {
            return Err(KvError::invalid(format!(
                "the layout's hash block size is {} tokens, but the index hashes blocks of {index_block_size}: \
                 make the index with block_size={}",
                layout.hash_block_size(),
                layout.hash_block_size()
            )));
        }
        let block_sizes =
            layout.groups().iter().map(|g| i64::try_from(g.block_size).unwrap_or(i64::MAX)).collect();
        Ok(ClusterLayout { layout, block_sizes })
    }

    /// The core layout.
    #[must_use]
    pub fn layout(&self) -> &GroupLayout {
        &self.layout
    }

    /// Each group's block size in tokens.
    #[must_use]
    pub fn block_sizes(&self) -> &[i64] {
        &self.block_sizes
    }
}

/// One worker's groups: its declared layout (if any) and the spec kinds its
/// events named.
#[derive(Clone, Debug, Default)]
pub struct WorkerGroups {
    layout: Option<Arc<ClusterLayout>>,
    /// Groups `BlockStored` events named full or MLA attention (bit `g`).
    pub seen_full: u64,
    /// Groups `BlockStored` events named another kind (bit `g`).
    pub seen_other: u64,
}

impl WorkerGroups {
    /// The declared layout.
    #[must_use]
    pub fn layout(&self) -> Option<&Arc<ClusterLayout>> {
        self.layout.as_ref()
    }

    /// Declares (or, with None, forgets) the layout.
    pub fn set_layout(&mut self, layout: Option<Arc<ClusterLayout>>) {
        self.layout = layout;
    }

    /// The declared block size per group (empty when none is declared).
    #[must_use]
    pub fn block_sizes(&self) -> &[i64] {
        self.layout.as_deref().map_or(&[], ClusterLayout::block_sizes)
    }

    /// Records the kinds a batch's events named.
    pub fn saw(&mut self, full: u64, other: u64) {
        self.seen_full |= full;
        self.seen_other |= other;
    }

    /// The group a full-attention-only score reads: the lowest group events
    /// named full (or MLA) attention, else group 0.
    #[must_use]
    pub fn full_group(&self) -> u32 {
        if self.seen_full == 0 {
            0
        } else {
            self.seen_full.trailing_zeros()
        }
    }

    /// Heap bytes held.
    #[must_use]
    pub fn heap_bytes(&self) -> usize {
        self.layout
            .as_ref()
            .map_or(0, |l| std::mem::size_of::<ClusterLayout>() + l.block_sizes.capacity() * 8)
    }
}
