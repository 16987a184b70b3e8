//! The single-type rules of vLLM 0.33 (`single_type_kv_cache_manager.py`),
//! one implementation of [`GroupRule`] per group kind, over a caller's
//! [`BlockLookup`] so the manager, the cluster index and `kvindex explain`
//! answer with the same rules and their own notion of "cached".
//!
//! A hit of one group is always `first_real` null blocks followed by real
//! (cached) blocks up to the hit's block count: full attention has no nulls,
//! a sliding window nulls what lies before its last `ceil((W-1)/B)` blocks,
//! chunked local nulls the chunks before the current one, Mamba keeps only
//! its latest state block.
//!
//! # Invariants
//! - a rule never asks its lookup for a block at or past `max_tokens / B`;
//! - the hit length returned is a multiple of the query's alignment (except
//!   chunked local, whose vLLM rule asserts `alignment == B`) and equals the
//!   number of blocks written times `B`.
//!
//! Costs: full attention and chunked local O(hit blocks) lookups; sliding
//! window and Mamba scan right to left, O(blocks scanned) lookups, stopping
//! at the first window (state) found. No allocation beyond `out`.

use crate::core::groups::spec::{GroupKind, GroupSpec};

/// Which blocks a caller holds: block `i` of a spec set's block size (the
/// tokens `i * B .. (i + 1) * B`), cached in every member group.
pub trait BlockLookup {
    /// What a hit holds per block (a block id, a set of ids, a worker mask...).
    type Block: Copy;
    /// Block `i`, if cached.
    fn get(&mut self, i: usize) -> Option<Self::Block>;
}

/// Any `FnMut(block index) -> Option<B>` is a lookup.
impl<B: Copy, F: FnMut(usize) -> Option<B>> BlockLookup for F {
    type Block = B;
    fn get(&mut self, i: usize) -> Option<B> {
        self(i)
    }
}

/// One lookup's bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HitQuery {
    /// The hit may cover at most this many tokens.
    pub max_tokens: usize,
    /// The hit length must be a multiple of this (vLLM's `alignment_tokens`).
    pub alignment: usize,
    /// Drop the last matched block (EAGLE / MTP).
    pub drop_eagle: bool,
}

/// A group kind's vLLM single-type semantics.
pub trait GroupRule {
    /// vLLM's `find_longest_cache_hit` for one spec set: writes the hit's
    /// blocks (`None`: the null block) into `out` (cleared first) and
    /// returns the hit length in tokens.
    fn longest_hit<L: BlockLookup>(
        &self,
        lookup: &mut L,
        q: &HitQuery,
        out: &mut Vec<Option<L::Block>>,
    ) -> usize;

    /// vLLM's `get_num_skipped_tokens`: tokens before the attention window
    /// of the next token after `num_computed` (their blocks can be nulled).
    fn skipped_tokens(&self, num_computed: usize) -> usize;

    /// Whether `cache_blocks` registers block `i` (vLLM's
    /// `reachable_block_mask` under dense retention): sliding windows cache
    /// only the blocks a hit at an `alignment` boundary can use.
    fn caches_block(&self, i: usize, alignment: usize, use_eagle: bool) -> bool;

    /// vLLM's recycling-aware per-request admission cap, in blocks (sliding
    /// window and chunked local only).
    fn admission_cap(&self, max_in_flight_tokens: usize, max_model_len: usize) -> Option<usize>;
}

fn cdiv(a: usize, b: usize) -> usize {
    a.div_ceil(b)
}

/// Blocks a sliding-window hit needs (vLLM's `_contiguous_blocks_for_hit`).
#[must_use]
pub fn window_blocks(window: usize, block_size: usize, use_eagle: bool) -> usize {
    cdiv(window.saturating_sub(1), block_size) + usize::from(use_eagle)
}

fn full_hit<L: BlockLookup>(
    bs: usize,
    lookup: &mut L,
    q: &HitQuery,
    out: &mut Vec<Option<L::Block>>,
) -> usize {
    out.clear();
    for i in 0..q.max_tokens / bs {
        match lookup.get(i) {
            Some(b) => out.push(Some(b)),
            None => break,
        }
    }
    let mut hit = out.len() * bs;
    if q.drop_eagle && hit > 0 {
        hit -= q.alignment.min(bs);
    }
    hit -= hit % q.alignment;
    out.truncate(cdiv(hit, bs));
    hit
}

fn window_hit<L: BlockLookup>(
    window: usize,
    bs: usize,
    lookup: &mut L,
    q: &HitQuery,
    out: &mut Vec<Option<L::Block>>,
) -> usize {
    let need = window_blocks(window, bs, q.drop_eagle);
    let max_blocks = q.max_tokens / bs;
    out.clear();
    out.resize(max_blocks, None);
    let mut run = 0usize;
    let mut found = false;
    for i in (0..max_blocks).rev() {
        if let Some(b) = lookup.get(i) {
            if run == 0 && bs != q.alignment {
                let post_pop = if q.drop_eagle { i } else { i + 1 };
                if !(post_pop * bs).is_multiple_of(q.alignment) {
                    continue;
                }
            }
            out[i] = Some(b);
            run += 1;
            if run >= need {
                out.truncate(i + run);
                found = true;
                break;
            }
        } else {
            run = 0;
        }
    }
    let realign = |out: &mut Vec<Option<L::Block>>| {
        while bs != q.alignment && !(out.len() * bs).is_multiple_of(q.alignment) {
            out.pop();
        }
    };
    if !found {
        out.truncate(run);
        realign(out);
    }
    if q.drop_eagle && !out.is_empty() {
        out.pop();
        realign(out);
    }
    out.len() * bs
}

fn chunked_hit<L: BlockLookup>(
    chunk: usize,
    bs: usize,
    lookup: &mut L,
    q: &HitQuery,
    out: &mut Vec<Option<L::Block>>,
) -> usize {
    out.clear();
    let max_blocks = q.max_tokens / bs;
    let start = if q.max_tokens > 0 { q.max_tokens / chunk * chunk } else { 0 };
    let start_block = start / bs;
    out.resize(start_block, None);
    for i in start_block..max_blocks {
        match lookup.get(i) {
            Some(b) => out.push(Some(b)),
            None => break,
        }
    }
    out.len() * bs
}

fn mamba_hit<L: BlockLookup>(
    bs: usize,
    lookup: &mut L,
    q: &HitQuery,
    out: &mut Vec<Option<L::Block>>,
) -> usize {
    out.clear();
    for i in (0..q.max_tokens / bs).rev() {
        if let Some(b) = lookup.get(i) {
            if bs != q.alignment && !((i + 1) * bs).is_multiple_of(q.alignment) {
                continue;
            }
            out.resize(i, None);
            out.push(Some(b));
            return (i + 1) * bs;
        }
    }
    0
}

impl GroupRule for GroupSpec {
    fn longest_hit<L: BlockLookup>(
        &self,
        lookup: &mut L,
        q: &HitQuery,
        out: &mut Vec<Option<L::Block>>,
    ) -> usize {
        let bs = self.block_size;
        match self.kind {
            GroupKind::FullAttention | GroupKind::Mla => full_hit(bs, lookup, q, out),
            GroupKind::SlidingWindow { window } => window_hit(window, bs, lookup, q, out),
            GroupKind::ChunkedLocal { chunk } => chunked_hit(chunk, bs, lookup, q, out),
            GroupKind::Mamba { .. } => mamba_hit(bs, lookup, q, out),
        }
    }

    fn skipped_tokens(&self, n: usize) -> usize {
        match self.kind {
            GroupKind::FullAttention | GroupKind::Mla => 0,
            GroupKind::SlidingWindow { window } => (n + 1).saturating_sub(window),
            GroupKind::ChunkedLocal { chunk } => n / chunk * chunk,
            GroupKind::Mamba { .. } => n.saturating_sub(1),
        }
    }

    fn caches_block(&self, i: usize, alignment: usize, use_eagle: bool) -> bool {
        let GroupKind::SlidingWindow { window } = self.kind else { return true };
        let bs = self.block_size;
        if !alignment.is_multiple_of(bs) {
            return true;
        }
        let need = window_blocks(window, bs, use_eagle);
        let per_segment = alignment / bs;
        if need >= per_segment {
            return true;
        }
        let shift = usize::from(use_eagle);
        i >= shift && (i - shift) % per_segment >= per_segment - need
    }

    fn admission_cap(&self, max_in_flight_tokens: usize, max_model_len: usize) -> Option<usize> {
        match self.kind {
            GroupKind::SlidingWindow { window } => {
                let n = (window - 1).saturating_add(max_in_flight_tokens).min(max_model_len);
                Some(cdiv(n, self.block_size) + 1)
            }
            GroupKind::ChunkedLocal { chunk } => {
                let n = chunk.saturating_add(max_in_flight_tokens).min(max_model_len);
                Some(cdiv(n, self.block_size))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::groups::spec::MambaMode;

    /// A lookup over a set of cached block indices, answering the index.
    fn cached(set: &'static [usize]) -> impl FnMut(usize) -> Option<usize> {
        move |i| set.contains(&i).then_some(i)
    }

    fn q(max_tokens: usize, alignment: usize) -> HitQuery {
        HitQuery { max_tokens, alignment, drop_eagle: false }
    }

    #[test]
    fn full_attention_stops_at_first_miss_and_aligns() {
        let s = GroupSpec::full(4);
        let mut out = Vec::new();
        assert_eq!(s.longest_hit(&mut cached(&[0, 1, 2, 4]), &q(100, 4), &mut out), 12);
        assert_eq!(out, vec![Some(0), Some(1), Some(2)]);
        assert_eq!(s.longest_hit(&mut cached(&[0, 1, 2, 4]), &q(100, 8), &mut out), 8);
        assert_eq!(out.len(), 2);
        let e = HitQuery { drop_eagle: true, ..q(100, 4) };
        assert_eq!(s.longest_hit(&mut cached(&[0, 1, 2]), &e, &mut out), 8);
    }

    /// vLLM's docstring example: block size 4, window 8 -> `[NULL, NULL, 7, 8]`.
    #[test]
    fn sliding_window_keeps_its_window_and_nulls_the_rest() {
        let s = GroupSpec { kind: GroupKind::SlidingWindow { window: 8 }, block_size: 4 };
        let mut out = Vec::new();
        // Blocks 2, 3 cached (window needs ceil(7/4) = 2 blocks), 5 cached alone.
        assert_eq!(s.longest_hit(&mut cached(&[2, 3, 5]), &q(24, 4), &mut out), 16);
        assert_eq!(out, vec![None, None, Some(2), Some(3)]);
        // No full window: the run from block 0 is the hit.
        assert_eq!(s.longest_hit(&mut cached(&[0, 3]), &q(24, 4), &mut out), 4);
        assert_eq!(out, vec![Some(0)]);
        assert_eq!(s.skipped_tokens(7), 0);
        assert_eq!(s.skipped_tokens(9), 2);
        // Alignment 8 (lcm with a block-8 group): the window must end on a boundary.
        assert_eq!(s.longest_hit(&mut cached(&[1, 2, 4]), &q(24, 8), &mut out), 0);
        assert_eq!(s.longest_hit(&mut cached(&[1, 2, 3]), &q(24, 8), &mut out), 16);
        assert_eq!(out, vec![None, None, Some(2), Some(3)]);
        assert!(s.caches_block(3, 8, false) && s.caches_block(2, 8, false));
        let wide = GroupSpec { kind: GroupKind::SlidingWindow { window: 5 }, block_size: 4 };
        assert!(!wide.caches_block(2, 16, false) && wide.caches_block(3, 16, false));
    }

    #[test]
    fn chunked_local_nulls_earlier_chunks() {
        let s = GroupSpec { kind: GroupKind::ChunkedLocal { chunk: 8 }, block_size: 4 };
        let mut out = Vec::new();
        // vLLM's example 1: max 15 -> window starts at 8; block 2 hit.
        assert_eq!(s.longest_hit(&mut cached(&[2]), &q(15, 4), &mut out), 12);
        assert_eq!(out, vec![None, None, Some(2)]);
        assert_eq!(s.longest_hit(&mut cached(&[]), &q(15, 4), &mut out), 8);
        // Example 2: max 16 -> four nulls.
        assert_eq!(s.longest_hit(&mut cached(&[]), &q(16, 4), &mut out), 16);
        assert_eq!(out, vec![None; 4]);
        assert_eq!(s.skipped_tokens(13), 8);
        assert_eq!(s.skipped_tokens(7), 0);
    }

    #[test]
    fn mamba_takes_the_latest_aligned_state() {
        let s = GroupSpec { kind: GroupKind::Mamba { mode: MambaMode::Align }, block_size: 4 };
        let mut out = Vec::new();
        assert_eq!(s.longest_hit(&mut cached(&[0, 2]), &q(100, 4), &mut out), 12);
        assert_eq!(out, vec![None, None, Some(2)]);
        assert_eq!(s.longest_hit(&mut cached(&[0, 2]), &q(100, 8), &mut out), 0);
        assert_eq!(s.longest_hit(&mut cached(&[1, 2]), &q(100, 8), &mut out), 8);
        assert_eq!(s.skipped_tokens(9), 8);
        assert_eq!(s.skipped_tokens(0), 0);
    }
}
