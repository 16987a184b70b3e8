//! The value bitmap: one bit per value (slot or page id) the tree holds,
//! so that a value is stored at most once and a value handed back to the
//! caller to free is never the tree's.
//!
//! # Invariants
//! - bit `v` is set iff value `v` is in a live node (invariant 7 of the
//!   module header); bits past the bitmap's end are clear;
//! - a refused insert leaves the bitmap exactly as it was, length included.
//!
//! # Costs
//! Marking or clearing `k` values: O(k), 64 at a time for runs of
//! consecutive values (the usual case). Memory: one bit per value up to the
//! largest value ever stored (256 MiB at most for int32 values).

use super::RadixTree;
use crate::core::error::{KvError, KvResult};
use crate::core::ids::PageId;

/// When `chunk` (at most 64 values) is a run of consecutive values,
/// ascending or descending (allocators hand slots out in runs; stack-based
/// ones in descending order), its bits `[lo, lo + len)` as at most two word
/// masks `(w0, m0, w1, m1)` (`m1 == 0` when `w1 == w0`). One branch-free
/// pass over the chunk.
#[inline]
fn run_masks(chunk: &[PageId]) -> Option<(usize, u64, usize, u64)> {
    let base = chunk[0].0;
    let (up, down) = chunk.iter().zip(0u32..).fold((0u32, 0u32), |(u, d), (v, k)| {
        (u | (v.0 ^ base.wrapping_add(k)), d | (v.0 ^ base.wrapping_sub(k)))
    });
    let lo =
        if up == 0 { Some(base) } else { (down == 0).then(|| base.wrapping_sub(chunk.len() as u32 - 1)) };
    let (Some(lo), true) = (lo, chunk.len() > 1 && (up == 0 || base as usize + 1 >= chunk.len())) else {
        return None;
    };
    let (lo, hi) = (lo as usize, lo as usize + chunk.len());
    let (w0, w1) = (lo / 64, (hi - 1) / 64);
    let m0 = range_mask(lo % 64, if w0 == w1 { (hi - 1) % 64 + 1 } else { 64 });
    let m1 = if w0 == w1 { 0 } else { range_mask(0, (hi - 1) % 64 + 1) };
    Some((w0, m0, w1, m1))
}

/// Sets the bits of `vals` in `bits` (sized for them), 64 values at a time:
/// a chunk of consecutive values, ascending or descending (the usual case:
/// slots are handed out in runs), becomes one or two word masks; other chunks collect consecutive
/// values of one word in a register and write each word once. Fails, with
/// `Err(i)`, at the first chunk or word-run holding a value already set (or
/// repeated): `vals[..i]` are then marked by this call and nothing else is.
pub(super) fn mark_all(bits: &mut [u64], vals: &[PageId]) -> Result<(), usize> {
    for (c, chunk) in vals.chunks(64).enumerate() {
        let start = c * 64;
        if let Some((w0, m0, w1, m1)) = run_masks(chunk) {
            if bits[w0] & m0 != 0 || (w1 != w0 && bits[w1] & m1 != 0) {
                return Err(start);
            }
            bits[w0] |= m0;
            if w1 != w0 {
                bits[w1] |= m1;
            }
            continue;
        }
        let mut cur = usize::MAX;
        let mut mask = 0u64;
        let mut run_start = start;
        for (i, v) in chunk.iter().enumerate() {
            let (w, b) = (v.idx() / 64, 1u64 << (v.idx() % 64));
            if w != cur {
                if cur != usize::MAX {
                    if bits[cur] & mask != 0 {
                        return Err(run_start);
                    }
                    bits[cur] |= mask;
                }
                cur = w;
                mask = 0;
                run_start = start + i;
            }
            if mask & b != 0 {
                return Err(run_start);
            }
            mask |= b;
        }
        if bits[cur] & mask != 0 {
            return Err(run_start);
        }
        bits[cur] |= mask;
    }
    Ok(())
}

/// Bits `lo..hi` of a word (`0 <= lo < hi <= 64`).
pub(super) fn range_mask(lo: usize, hi: usize) -> u64 {
    let upper = if hi == 64 { u64::MAX } else { (1u64 << hi) - 1 };
    upper & !((1u64 << lo) - 1)
}

/// Clears the bits of `vals` (like [`mark_all`]: a chunk of 64 consecutive
/// values, ascending or descending, is one or two word masks; other chunks
/// are word-run batched). Values beyond the bitmap are ignored.
pub(super) fn unmark_all(bits: &mut [u64], vals: &[PageId]) {
    for chunk in vals.chunks(64) {
        if let Some((w0, m0, w1, m1)) = run_masks(chunk) {
            for (w, m) in [(w0, m0), (w1, m1)] {
                if let Some(x) = bits.get_mut(w) {
                    *x &= !m;
                }
            }
            continue;
        }
        unmark_each(bits, chunk);
    }
}

/// Clears `vals` one word-run at a time.
fn unmark_each(bits: &mut [u64], vals: &[PageId]) {
    let mut cur = usize::MAX;
    let mut mask = 0u64;
    for v in vals {
        let (w, b) = (v.idx() / 64, 1u64 << (v.idx() % 64));
        if w != cur {
            if let Some(x) = bits.get_mut(cur) {
                *x &= !mask;
            }
            cur = w;
            mask = 0;
        }
        mask |= b;
    }
    if let Some(x) = bits.get_mut(cur) {
        *x &= !mask;
    }
}

#[cold]
pub(super) fn first_repeat(vals: &[PageId]) -> Option<PageId> {
    let mut seen = rustc_hash::FxHashSet::default();
    vals.iter().find(|v| !seen.insert(**v)).copied()
}

/// `a == b` for equal-length value slices, branch-free so it vectorises
/// (derived `PartialEq` on a newtype does not compile to memcmp). O(len).
pub(super) fn same_values(a: &[PageId], b: &[PageId]) -> bool {
    debug_assert_eq!(a.len(), b.len());
    a.iter().zip(b).fold(0u32, |acc, (x, y)| acc | (x.0 ^ y.0)) == 0
}

impl RadixTree {
    /// Appends every value in the tree to `out` in ascending order, read
    /// from the value bitmap. O(bitmap words + values).
    #[allow(clippy::cast_possible_truncation)]
    pub fn sorted_values(&self, out: &mut Vec<PageId>) {
        for (w, &word) in self.in_tree.iter().enumerate() {
            let mut bits = word;
            while bits != 0 {
                out.push(PageId((w * 64) as u32 + bits.trailing_zeros()));
                bits &= bits - 1;
            }
        }
    }

    /// Whether `v` is one of the tree's values. O(1).
    #[must_use]
    pub fn contains_value(&self, v: PageId) -> bool {
        let i = v.idx();
        self.in_tree.get(i / 64).is_some_and(|w| w >> (i % 64) & 1 == 1)
    }

    /// Checks that the values of `lists` (duplicates to hand back, values to
    /// store, values the caller keeps) are pairwise distinct and none is in
    /// the tree, using the value bitmap as scratch. On success the values to
    /// store (`lists[1]`) are left marked (they are about to enter the tree);
    /// on error the bitmap is as it was. O(values).
    pub(super) fn check_values(&mut self, lists: [&[PageId]; 3]) -> KvResult<()> {
        let words_before = self.in_tree.len();
        let max = lists.iter().filter_map(|l| l.iter().map(|v| v.0).max()).max();
        if let Some(m) = max {
            let words = m as usize / 64 + 1;
            if words > self.in_tree.len() {
                self.in_tree.resize(words, 0);
            }
        }
        let bits = &mut self.in_tree;
        for (li, l) in lists.iter().enumerate() {
            if let Err(vi) = mark_all(bits, l) {
                // Name the culprit, then undo exactly what this call marked:
                // lists before `li`, and the runs of `l` flushed before it.
                let v = l[vi..].iter().find(|v| bits[v.idx() / 64] >> (v.idx() % 64) & 1 == 1).copied();
                let v = v.or_else(|| first_repeat(&l[vi..])).unwrap_or(l[vi]);
                for done in &lists[..li] {
                    unmark_all(bits, done);
                }
                unmark_all(bits, &l[..vi]);
                // A refused call leaves no trace, not even a grown bitmap.
                bits.truncate(words_before);
                bits.shrink_to(words_before);
                return Err(KvError::invalid(format!(
                    "value {} is already in the tree or passed twice (a slot/page may be stored once)",
                    v.0
                )));
            }
        }
        unmark_all(bits, lists[0]);
        unmark_all(bits, lists[2]);
        Ok(())
    }
}
