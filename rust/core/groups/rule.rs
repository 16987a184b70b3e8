//! The single-type rules of vLLM 0.33 (`single_type_kv_cache_manager.py`),
//! one implementation of [`GroupRule`] per group kind, over a caller's
//! [`BlockLookup`] so the manager, the cluster index and `kvindex explain`
//! answer with the same rules and their own notion of "cached".
//!
//! A hit of one group is always `first_real` null blocks followed by real
//! (cached) blocks up to the hit's block count: full attention (and MLA) has
//! no nulls, a sliding window (plain or MLA, one rule) nulls what lies before
//! its last `ceil((W-1)/B)` blocks,
//! chunked local nulls the chunks before the current one, Mamba keeps only
//! its latest state block; cross-attention never hits (its blocks hold one
//! request's encoder states), nor does a circular buffer (one request's ring).
//!
//! Under partial hash hits the query's alignment is the hash block, smaller
//! than a full-attention or Mamba block: full attention then extends its run
//! into the next block at its interior hash boundaries, and Mamba takes the
//! latest state at any hash boundary ([`BlockLookup::get_fine`]); the last
//! block of such a hit is only partly reused.
//!
//! # Invariants
//! - a rule never asks its lookup for a block at or past `max_tokens / B`,
//!   nor for a fine index at or past `max_tokens / alignment`;
//! - the hit length returned is a multiple of the query's alignment (except
//!   chunked local, whose vLLM rule asserts `alignment == B`) and needs
//!   exactly the blocks written: `ceil(hit / B)` of them.
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

    /// Appends blocks `lo, lo + 1, ..` to `out` while cached, up to (not
    /// including) `hi`; returns how many. The answers of [`Self::get`] one
    /// by one (an implementation may look the run up in one batch).
    fn get_run(&mut self, lo: usize, hi: usize, out: &mut Vec<Option<Self::Block>>) -> usize {
        let start = out.len();
        for i in lo..hi {
            match self.get(i) {
                Some(b) => out.push(Some(b)),
                None => break,
            }
        }
        out.len() - start
    }

    /// The block cached under fine hash index `k` (the prefix of `k + 1`
    /// hash blocks) in every member group: a block's own hash or a
    /// partial-block entry inside it. Asked only when hits may end inside a
    /// block (the query's alignment below the block size); a lookup without
    /// partial-block entries answers none.
    fn get_fine(&mut self, _k: usize) -> Option<Self::Block> {
        None
    }
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

    /// Whether [`Self::caches_block`] holds for every block index.
    fn caches_every_block(&self, alignment: usize, use_eagle: bool) -> bool;

    /// vLLM's recycling-aware per-request admission cap, in blocks (sliding
    /// window and chunked local only).
    fn admission_cap(&self, max_in_flight_tokens: usize, max_model_len: usize) -> Option<usize>;
}

fn cdiv(a: usize, b: usize) -> usize {
    a.div_ceil(b)
}

/// Windows of at most this many blocks are looked up as one run.
const SHORT_WINDOW: usize = 16;

/// Blocks a sliding-window hit needs (vLLM's `_contiguous_blocks_for_hit`).
#[must_use]
pub fn window_blocks(window: usize, block_size: usize, use_eagle: bool) -> usize {
    cdiv(window.saturating_sub(1), block_size) + usize::from(use_eagle)
}

/// Whether a group of block size `bs` looks up hash boundaries inside its
/// blocks for `q` (vLLM's fine-grained mode: the alignment, the hash block
/// under partial hash hits, divides the block and is smaller).
fn fine_grained(bs: usize, q: &HitQuery) -> bool {
    q.alignment < bs && bs.is_multiple_of(q.alignment)
}

fn full_hit<L: BlockLookup>(
    bs: usize,
    lookup: &mut L,
    q: &HitQuery,
    out: &mut Vec<Option<L::Block>>,
) -> usize {
    out.clear();
    lookup.get_run(0, q.max_tokens / bs, out);
    let mut hit = out.len() * bs;
    if fine_grained(bs, q) {
        // vLLM's phase 2: the first block not wholly cached, probed at its interior
        // hash boundaries from the longest down.
        let scale = bs / q.alignment;
        let first = out.len() * scale;
        let end = (first + scale - 1).min(q.max_tokens / q.alignment);
        for k in (first..end).rev() {
            if let Some(b) = lookup.get_fine(k) {
                out.push(Some(b));
                hit = (k + 1) * q.alignment;
                break;
            }
        }
    }
    if q.drop_eagle && hit > 0 {
        hit -= q.alignment.min(bs);
    }
    hit -= hit % q.alignment;
    out.truncate(cdiv(hit, bs));
    hit
}

/// vLLM's right-to-left sliding-window scan (with its alignment skips): the
/// trailing run length and whether a full window was found (`out` truncated to it).
fn window_scan<L: BlockLookup>(
    need: usize,
    bs: usize,
    lookup: &mut L,
    q: &HitQuery,
    out: &mut Vec<Option<L::Block>>,
) -> (usize, bool) {
    let mut run = 0usize;
    for i in (0..out.len()).rev() {
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
                return (run, true);
            }
        } else {
            run = 0;
        }
    }
    (run, false)
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
    if bs == q.alignment {
        // vLLM's right-to-left scan without its alignment skips finds the rightmost run
        // of `need` cached blocks (`need` 0 acts as 1). A candidate window is looked up
        // as one run (a long one checks its leftmost block alone first, so a miss there
        // costs one lookup): a miss at `j` rules out every window ending after `j` (each
        // contains `j`), so the scan skips to the windows ending at `j`, with the same
        // answer. `out` is `None` from the candidate window on.
        let need1 = need.max(1);
        let mut end = max_blocks;
        while end >= need1 {
            let left = end - need1;
            out.truncate(left);
            if need1 > SHORT_WINDOW {
                let Some(b) = lookup.get(left) else {
                    out.resize(max_blocks, None);
                    end = left;
                    continue;
                };
                out.push(Some(b));
            }
            let got = out.len() - left + lookup.get_run(out.len(), end, out);
            if got == need1 {
                found = true;
                break;
            }
            out.truncate(left);
            out.resize(max_blocks, None);
            end = left + got;
        }
        if !found {
            out.clear();
            run = lookup.get_run(0, need1.min(max_blocks), out);
        }
    } else {
        (run, found) = window_scan(need, bs, lookup, q, out);
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
    lookup.get_run(start_block, max_blocks, out);
    out.len() * bs
}

fn mamba_hit<L: BlockLookup>(
    bs: usize,
    lookup: &mut L,
    q: &HitQuery,
    out: &mut Vec<Option<L::Block>>,
) -> usize {
    out.clear();
    if fine_grained(bs, q) {
        // The latest state at any hash boundary: block `k / scale` holds it.
        let scale = bs / q.alignment;
        for k in (0..q.max_tokens / q.alignment).rev() {
            if let Some(b) = lookup.get_fine(k) {
                out.resize(k / scale, None);
                out.push(Some(b));
                return (k + 1) * q.alignment;
            }
        }
        return 0;
    }
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
            GroupKind::SlidingWindow { window } | GroupKind::SlidingWindowMla { window, .. } => {
                window_hit(window, bs, lookup, q, out)
            }
            GroupKind::ChunkedLocal { chunk } => chunked_hit(chunk, bs, lookup, q, out),
            GroupKind::Mamba { .. } => mamba_hit(bs, lookup, q, out),
            GroupKind::CrossAttention | GroupKind::CircularBuffer => {
                out.clear();
                0
            }
        }
    }

    fn skipped_tokens(&self, n: usize) -> usize {
        match self.kind {
            GroupKind::FullAttention
            | GroupKind::Mla
            | GroupKind::CrossAttention
            | GroupKind::CircularBuffer => 0,
            GroupKind::SlidingWindow { window } | GroupKind::SlidingWindowMla { window, .. } => {
                (n + 1).saturating_sub(window)
            }
            GroupKind::ChunkedLocal { chunk } => n / chunk * chunk,
            GroupKind::Mamba { .. } => n.saturating_sub(1),
        }
    }

    fn caches_block(&self, i: usize, alignment: usize, use_eagle: bool) -> bool {
        let Some(window) = self.kind.sliding_window() else { return true };
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

    fn caches_every_block(&self, alignment: usize, use_eagle: bool) -> bool {
        let Some(window) = self.kind.sliding_window() else { return true };
        let bs = self.block_size;
        !alignment.is_multiple_of(bs) || window_blocks(window, bs, use_eagle) >= alignment / bs
    }

    fn admission_cap(&self, max_in_flight_tokens: usize, max_model_len: usize) -> Option<usize> {
        match self.kind {
            GroupKind::SlidingWindow { window } | GroupKind::SlidingWindowMla { window, .. } => {
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
        for (spec, alignment, eagle) in [(s, 8, false), (s, 4, true), (wide, 16, false), (wide, 16, true)] {
            let all = (0..64).all(|i| spec.caches_block(i, alignment, eagle));
            assert_eq!(spec.caches_every_block(alignment, eagle), all, "{spec:?} {alignment} {eagle}");
        }
        assert!(GroupSpec::full(4).caches_every_block(16, false));
    }

    /// The window scan that skips a window per miss answers as vLLM's block-by-block scan.
    #[test]
    fn window_skip_scan_matches_the_plain_scan() {
        for window in 1..14 {
            for set in 0u32..1024 {
                for drop_eagle in [false, true] {
                    let s = GroupSpec { kind: GroupKind::SlidingWindow { window }, block_size: 4 };
                    let q = HitQuery { max_tokens: 40, alignment: 4, drop_eagle };
                    let mut look = |i: usize| (set >> i & 1 == 1).then_some(i);
                    let mut fast = Vec::new();
                    let got = s.longest_hit(&mut look, &q, &mut fast);
                    let need = window_blocks(window, 4, drop_eagle);
                    let mut slow = vec![None; 10];
                    let (run, found) = window_scan(need, 4, &mut look, &q, &mut slow);
                    if !found {
                        slow.truncate(run);
                    }
                    if drop_eagle {
                        slow.pop();
                    }
                    assert_eq!((got, &fast), (slow.len() * 4, &slow), "window {window} set {set:b}");
                }
            }
        }
    }

    /// Long windows (their leftmost block checked alone first) agree too.
    #[test]
    fn long_window_scan_matches_the_plain_scan() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for window in 15..24 {
            for _ in 0..400 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Mostly cached blocks, so that long windows are found.
                let set = x | (x >> 7) | (x >> 19);
                let s = GroupSpec { kind: GroupKind::SlidingWindow { window }, block_size: 1 };
                let q = HitQuery { max_tokens: 40, alignment: 1, drop_eagle: false };
                let mut look = |i: usize| (set >> i & 1 == 1).then_some(i);
                let mut fast = Vec::new();
                let got = s.longest_hit(&mut look, &q, &mut fast);
                let need = window_blocks(window, 1, false);
                let mut slow = vec![None; 40];
                let (run, found) = window_scan(need, 1, &mut look, &q, &mut slow);
                if !found {
                    slow.truncate(run);
                }
                assert_eq!((got, &fast), (slow.len(), &slow), "window {window} set {set:b}");
            }
        }
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
