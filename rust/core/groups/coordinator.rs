//! The longest hit over all groups: vLLM 0.33's
//! `HybridKVCacheCoordinator.find_longest_cache_hit` (a fixed point over the
//! spec sets, full attention first and bounding it) and the unitary
//! coordinator's one-group case, plus the cacheable-token rule of
//! `get_num_cacheable_tokens`.
//!
//! The caller supplies one [`BlockLookup`] per spec set (in
//! [`GroupLayout::spec_sets`] order) that answers block indices at that
//! set's block size: with request hashes at `hash_block_size`, block `i` of
//! a set with block size `k * hash_block_size` is fine hash `(i + 1) * k - 1`
//! (vLLM's `BlockHashListWithBlockSize`: a chained hash fingerprints its
//! whole prefix), see [`coarse_hash_index`].
//!
//! # Invariants
//! - the result length is a multiple of the layout's alignment (one group:
//!   its block size) and no larger than `max_tokens`;
//! - every spec set's hit is consistent with that length: full attention
//!   holds exactly `ceil(len / B)` blocks; other kinds hold what their rule
//!   returned at the final candidate length;
//! - only a set flagged EAGLE drops the EAGLE block, at most once per
//!   candidate length (vLLM's `eagle_verified`); groups in no spec set (not
//!   prefix-cacheable) take no part and hit nothing.
//!
//! Costs: one lookup pass per spec set per round, none when a set meets the
//! query it already answered; a round repeats only when some set shortened
//! the candidate (at most a few for real layouts: simple hybrids stop after one).

use crate::core::groups::rule::{BlockLookup, GroupRule, HitQuery};
use crate::core::groups::spec::{GroupKind, GroupLayout};

/// The fine hash index that fingerprints block `i` of a group whose block
/// size is `scale` hash blocks.
#[must_use]
pub fn coarse_hash_index(i: usize, scale: usize) -> usize {
    (i + 1) * scale - 1
}

/// The result of [`longest_hit`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HybridHit {
    /// Tokens every group can reuse.
    pub tokens: usize,
    /// vLLM's `num_uncached_common_prefix_tokens`: how much longer the
    /// longest single-set candidate was.
    pub uncached_common_prefix: usize,
}

/// Longest hit for `max_tokens` with `num_hashes` request hashes (at the
/// layout's hash block size). `lookups[s]` and `out[s]` belong to spec set
/// `s`; `out[s]` receives its hit blocks (`None`: null block).
///
/// # Panics
/// If `lookups` or `out` is shorter than the layout's spec sets (a
/// programming error).
pub fn longest_hit<L: BlockLookup>(
    layout: &GroupLayout,
    lookups: &mut [L],
    max_tokens: usize,
    num_hashes: usize,
    out: &mut [Vec<Option<L::Block>>],
) -> HybridHit {
    let sets = layout.spec_sets();
    assert!(lookups.len() >= sets.len() && out.len() >= sets.len(), "one lookup and output per spec set");
    for o in out.iter_mut() {
        o.clear();
    }
    if !layout.enable_caching() {
        return HybridHit::default();
    }
    if layout.len() == 1 {
        let spec = sets[0].spec;
        let q = HitQuery { max_tokens, alignment: spec.block_size, drop_eagle: sets[0].use_eagle };
        let tokens = spec.longest_hit(&mut lookups[0], &q, &mut out[0]);
        return HybridHit { tokens, uncached_common_prefix: 0 };
    }
    let alignment = layout.alignment();
    let hash_bs = layout.hash_block_size();
    let mut hit_length = max_tokens;
    let mut longest = 0usize;
    // Per spec set (one allocation): looked up yet, its last hit length, EAGLE-verified,
    // its last query.
    #[derive(Clone, Copy, Default)]
    struct SetState {
        looked: bool,
        len: usize,
        verified: bool,
        last_q: Option<HitQuery>,
    }
    // Real layouts have a few spec sets: their states on the stack.
    let mut on_stack = [SetState::default(); 4];
    let mut on_heap = Vec::new();
    let st: &mut [SetState] = if sets.len() <= on_stack.len() {
        &mut on_stack[..sets.len()]
    } else {
        on_heap.resize(sets.len(), SetState::default());
        &mut on_heap
    };
    loop {
        let mut curr = hit_length;
        for (idx, set) in sets.iter().enumerate() {
            let spec = set.spec;
            if spec.kind.is_full() && st[idx].looked {
                curr = curr.min(st[idx].len);
                continue;
            }
            let drop = set.use_eagle && !st[idx].verified;
            let mut max_len = curr;
            if drop && !matches!(spec.kind, GroupKind::Mamba { .. }) {
                max_len = (curr + eagle_margin(layout, spec)).min(num_hashes.saturating_mul(hash_bs));
            }
            let q = HitQuery { max_tokens: max_len, alignment, drop_eagle: drop };
            // A rule is a pure function of its query: a later round asking the same
            // question reuses the answer (and its blocks, still in `out`).
            let new_len = if st[idx].last_q == Some(q) {
                st[idx].len
            } else {
                st[idx].last_q = Some(q);
                spec.longest_hit(&mut lookups[idx], &q, &mut out[idx])
            };
            if drop {
                st[idx].verified = true;
            } else if new_len < curr {
                st.iter_mut().for_each(|v| v.verified = false);
            }
            curr = new_len;
            st[idx].looked = true;
            st[idx].len = new_len;
            longest = longest.max(curr);
        }
        if curr >= hit_length {
            break;
        }
        hit_length = curr;
        if layout.is_simple_hybrid() {
            break;
        }
    }
    for (idx, set) in sets.iter().enumerate() {
        if set.spec.kind.is_full() {
            out[idx].truncate(hit_length.div_ceil(set.spec.block_size));
        }
    }
    HybridHit { tokens: hit_length, uncached_common_prefix: longest - hit_length }
}

/// vLLM's `eagle_proof_margin`: how far past a candidate an EAGLE group
/// looks before dropping — one hash block where it looks up interior hash
/// boundaries (partial hash hits, a block larger than the hash block), else
/// one of its blocks.
fn eagle_margin(layout: &GroupLayout, spec: crate::core::groups::spec::GroupSpec) -> usize {
    let hbs = layout.hash_block_size();
    if layout.partial_hits() && spec.kind.fine_grained_lookup() && spec.block_size > hbs {
        hbs
    } else {
        spec.block_size
    }
}

/// vLLM's `find_longest_cache_hit_per_group` (what a KV connector that
/// accepts diverging hybrid hits asks): each spec set's own longest hit for
/// `max_tokens`, no fixed point; a set that drops the EAGLE block (not
/// Mamba) looks one block further first. `out[s]` receives set `s`'s blocks;
/// returns each set's hit length.
///
/// # Panics
/// If `lookups` or `out` is shorter than the layout's spec sets (a
/// programming error).
pub fn per_set_hits<L: BlockLookup>(
    layout: &GroupLayout,
    lookups: &mut [L],
    max_tokens: usize,
    num_hashes: usize,
    out: &mut [Vec<Option<L::Block>>],
) -> Vec<usize> {
    let sets = layout.spec_sets();
    assert!(lookups.len() >= sets.len() && out.len() >= sets.len(), "one lookup and output per spec set");
    let mut hits = vec![0; sets.len()];
    if !layout.enable_caching() {
        out.iter_mut().for_each(Vec::clear);
        return hits;
    }
    let alignment = layout.alignment();
    let cap = num_hashes.saturating_mul(layout.hash_block_size());
    for (idx, set) in sets.iter().enumerate() {
        out[idx].clear();
        let spec = set.spec;
        let mut max_len = max_tokens;
        if set.use_eagle && !matches!(spec.kind, GroupKind::Mamba { .. }) {
            max_len = (max_tokens + eagle_margin(layout, spec)).min(cap);
        }
        let q = HitQuery { max_tokens: max_len, alignment, drop_eagle: set.use_eagle };
        hits[idx] = spec.longest_hit(&mut lookups[idx], &q, &mut out[idx]);
    }
    hits
}

/// vLLM's `get_num_cacheable_tokens` for group `g`: `num_computed` less
/// the re-prefillable tail, rounded down to the scheduler block size on
/// hybrid layouts (a group that drops the EAGLE block keeps one block more);
/// unrounded under partial hash hits.
#[must_use]
pub fn cacheable_tokens(layout: &GroupLayout, g: usize, num_computed: usize, reprefillable: usize) -> usize {
    if layout.len() == 1 {
        return num_computed.saturating_sub(reprefillable);
    }
    if layout.partial_hits() {
        // vLLM's `_align_cacheable` rounds nothing then: rounding even to the hash block
        // would register a copied Mamba tail again. A group that drops the EAGLE block
        // keeps its finalized tokens.
        if layout.group_eagle(g) && num_computed > 0 {
            return num_computed.saturating_sub(reprefillable);
        }
        return num_computed;
    }
    let block_size = layout.groups().get(g).map_or(1, |s| s.block_size);
    let sb = layout.scheduler_block_size();
    // `num_computed / sb * sb` (a mask for the usual power-of-two block size).
    let cached = if sb.is_power_of_two() { num_computed & !(sb - 1) } else { num_computed / sb * sb };
    if layout.group_eagle(g) && cached > 0 {
        let finalized = num_computed.saturating_sub(reprefillable);
        return finalized.min(finalized / sb * sb + block_size);
    }
    cached
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::groups::spec::{GroupSpec, LayoutOptions};

    fn layout(groups: Vec<GroupSpec>, eagle: bool) -> GroupLayout {
        let opt = LayoutOptions { enable_caching: true, use_eagle: eagle, ..LayoutOptions::default() };
        GroupLayout::new(groups, opt).expect("valid")
    }

    type Look = Box<dyn FnMut(usize) -> Option<usize>>;

    fn set(v: Vec<usize>) -> Look {
        Box::new(move |i| v.contains(&i).then_some(i))
    }

    /// Full attention (block 4) + sliding window 8 (block 4): the window's
    /// last two blocks must be cached where full attention's run ends.
    #[test]
    fn full_bounds_sliding_window() {
        let swa = GroupSpec { kind: GroupKind::SlidingWindow { window: 8 }, block_size: 4 };
        let l = layout(vec![GroupSpec::full(4), swa], false);
        let mut look = vec![set(vec![0, 1, 2, 3, 4]), set(vec![1, 2, 4])];
        let mut out = vec![Vec::new(), Vec::new()];
        let h = longest_hit(&l, &mut look, 100, 25, &mut out);
        // Full covers 20 tokens; the window ending at 20 needs blocks 3, 4:
        // 3 is missing, so SWA falls back to the window ending at 12 (1, 2).
        assert_eq!(h.tokens, 12);
        assert_eq!(h.uncached_common_prefix, 8);
        assert_eq!(out[0], vec![Some(0), Some(1), Some(2)]);
        assert_eq!(out[1], vec![None, Some(1), Some(2)]);
    }

    /// Three spec sets: the fixed point needs a second round.
    #[test]
    fn fixed_point_repeats_until_stable() {
        let swa = GroupSpec { kind: GroupKind::SlidingWindow { window: 5 }, block_size: 4 };
        let mamba = GroupSpec {
            kind: GroupKind::Mamba { mode: crate::core::groups::spec::MambaMode::Align },
            block_size: 4,
        };
        let l = layout(vec![GroupSpec::full(4), swa, mamba], false);
        let mut look = vec![set((0..10).collect()), set(vec![5, 7]), set(vec![4, 6])];
        let mut out = vec![Vec::new(), Vec::new(), Vec::new()];
        let h = longest_hit(&l, &mut look, 40, 10, &mut out);
        // SWA: 32 (block 7); Mamba at 32 -> block 6 -> 28; SWA at 28 -> block 5 ->
        // 24; Mamba at 24 -> block 4 -> 20; SWA at 20 -> nothing -> 0.
        assert_eq!(h.tokens, 0);
        assert!(out[0].is_empty());
    }

    /// EAGLE on the sliding-window set only: full attention keeps its last block, the
    /// window looks one block past the candidate and drops it.
    #[test]
    fn eagle_drops_only_in_flagged_sets() {
        let swa = GroupSpec { kind: GroupKind::SlidingWindow { window: 8 }, block_size: 4 };
        let hit = |flags: Option<[bool; 2]>| {
            let mut l = layout(vec![GroupSpec::full(4), swa], flags.is_some());
            if let Some(f) = flags {
                l = l.with_eagle_groups(&f).expect("two flags");
            }
            let mut look = vec![set((0..5).collect()), set((0..10).collect())];
            let mut out = vec![Vec::new(), Vec::new()];
            longest_hit(&l, &mut look, 100, 25, &mut out).tokens
        };
        assert_eq!(hit(None), 20);
        assert_eq!(hit(Some([false, false])), 16, "no group flagged: every group drops");
        assert_eq!(hit(Some([true, true])), 16);
        assert_eq!(hit(Some([false, true])), 20, "full attention does not drop");
        assert_eq!(hit(Some([true, false])), 16, "full attention drops");
        let l = layout(vec![GroupSpec::full(4), swa], true).with_eagle_groups(&[false, true]).expect("ok");
        assert_eq!(cacheable_tokens(&l, 0, 13, 0), 12);
        assert_eq!(cacheable_tokens(&l, 1, 13, 0), 13);
    }

    /// A group that is not prefix-cacheable takes no part: its output stays empty.
    #[test]
    fn bounded_replay_group_takes_no_part() {
        let mla = GroupSpec {
            kind: GroupKind::SlidingWindowMla { window: 8, bounded_replay: true },
            block_size: 4,
        };
        let l = layout(vec![GroupSpec::full(4), mla], false);
        assert_eq!(l.spec_sets().len(), 1);
        let mut look = vec![set((0..5).collect())];
        let mut out = vec![Vec::new()];
        assert_eq!(longest_hit(&l, &mut look, 100, 25, &mut out).tokens, 20);
    }

    #[test]
    fn cacheable_tokens_round_to_the_scheduler_block() {
        let l = layout(vec![GroupSpec::full(4), GroupSpec::full(8)], false);
        assert_eq!(cacheable_tokens(&l, 0, 13, 0), 8);
        assert_eq!(coarse_hash_index(1, 2), 3);
    }
}
