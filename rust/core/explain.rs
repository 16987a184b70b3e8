//! What a hybrid layout can hit, and why not: the figures `kvindex explain`
//! reports, computed with the core's group rules ([`crate::core::groups`]).
//!
//! The one model of a cache here is [`RepeatedPrompt`]: a request of `n`
//! tokens is prefilled (in chunks of `chunk` tokens, the last one shorter)
//! and finishes with nothing evicted, then the same prompt comes again. What
//! the first request left cached, per group of block size `B`:
//! - the blocks below its cacheable tokens
//!   ([`cacheable_tokens`]: `n` rounded down to the scheduler block size on a
//!   hybrid layout) — all of them for full attention, MLA and chunked local
//!   (blocks that fell out of a chunk or window are freed to the prefix cache,
//!   still hashed), those [`GroupRule::caches_block`] keeps for a sliding
//!   window;
//! - for Mamba in `"align"` mode, one state per scheduled chunk: the block
//!   ending at the chunk's last cacheable block boundary (vLLM 0.33 ends each
//!   prefill chunk of an align-mode request on a block boundary and caches
//!   the state there); in `"none"` mode nothing (and vLLM's layout check
//!   rejects caching then).
//!
//! The second request's hit is the hybrid fixed point
//! ([`longest_hit`]) over those blocks, bounded at `n - 1` tokens as vLLM
//! bounds a hit; each spec set's own hit (its rule alone, same bound and
//! alignment) says which group's rule cost what.
//!
//! Invariants: every figure is a function of the layout and the arguments;
//! a hit is a multiple of the layout's alignment and at most `n - 1`.
//!
//! Costs: O(n / hash block size) per repeated prompt (one pass per spec set
//! per fixed-point round); [`min_cacheable_prompt`] at most `limit /
//! alignment` of them.

use crate::core::groups::coordinator::{cacheable_tokens, longest_hit};
use crate::core::groups::rule::{GroupRule, HitQuery};
use crate::core::groups::spec::{GroupKind, GroupLayout, GroupSpec, MambaMode};

/// The second request's hit for a repeated prompt.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RepeatedPrompt {
    /// Tokens the whole layout reuses.
    pub hit: usize,
    /// Per spec set ([`GroupLayout::spec_sets`] order): the tokens its rule
    /// alone would reuse.
    pub set_hits: Vec<usize>,
    /// Per spec set: blocks the first request left cached in it.
    pub set_cached: Vec<usize>,
    /// Per spec set: blocks of the final hit that are null (skipped).
    pub set_nulls: Vec<usize>,
    /// Per spec set: blocks of the final hit that are reused.
    pub set_reused: Vec<usize>,
}

/// Which blocks of `spec` the first request left cached (see the module header).
fn cached_blocks(layout: &GroupLayout, spec: GroupSpec, n: usize, chunk: usize) -> Vec<bool> {
    let bs = spec.block_size;
    let cacheable = cacheable_tokens(layout, bs, n, 0);
    let blocks = cacheable / bs;
    let alignment = layout.alignment();
    match spec.kind {
        GroupKind::Mamba { mode: MambaMode::None } => vec![false; blocks],
        GroupKind::Mamba { mode: MambaMode::Align } => {
            let mut v = vec![false; blocks];
            let mut end = 0usize;
            while end < n {
                end = (end + chunk.max(1)).min(n);
                let at = cacheable_tokens(layout, bs, end, 0) / bs;
                if at > 0 {
                    v[at - 1] = true;
                }
            }
            v
        }
        _ => (0..blocks).map(|i| spec.caches_block(i, alignment, layout.use_eagle())).collect(),
    }
}

/// The hit of a prompt of `n` tokens seen a second time, the first time
/// prefilled in chunks of `chunk` tokens (`None`: at once).
#[must_use]
pub fn repeated_prompt(layout: &GroupLayout, n: usize, chunk: Option<usize>) -> RepeatedPrompt {
    let sets = layout.spec_sets();
    let chunk = chunk.unwrap_or(n).max(1);
    let cached: Vec<Vec<bool>> = sets.iter().map(|s| cached_blocks(layout, s.spec, n, chunk)).collect();
    let mut looks: Vec<_> =
        cached.iter().map(|c| move |i: usize| c.get(i).copied().unwrap_or(false).then_some(())).collect();
    let mut outs = vec![Vec::new(); sets.len()];
    let max = n.saturating_sub(1);
    let hashes = n / layout.hash_block_size();
    let h = longest_hit(layout, &mut looks, max, hashes, &mut outs);
    let q = HitQuery { max_tokens: max, alignment: layout.alignment(), drop_eagle: layout.use_eagle() };
    let mut scratch = Vec::new();
    let set_hits = if layout.enable_caching() {
        sets.iter().zip(looks.iter_mut()).map(|(s, l)| s.spec.longest_hit(l, &q, &mut scratch)).collect()
    } else {
        vec![0; sets.len()]
    };
    RepeatedPrompt {
        hit: h.tokens,
        set_hits,
        set_cached: cached.iter().map(|c| c.iter().filter(|&&x| x).count()).collect(),
        set_nulls: outs.iter().map(|o| o.iter().filter(|b| b.is_none()).count()).collect(),
        set_reused: outs.iter().map(|o| o.iter().filter(|b| b.is_some()).count()).collect(),
    }
}

/// The shortest prompt (tokens) whose repetition hits at all, trying lengths
/// `k * alignment + 1` up to `limit`; None if none does.
#[must_use]
pub fn min_cacheable_prompt(layout: &GroupLayout, chunk: Option<usize>, limit: usize) -> Option<usize> {
    if !layout.enable_caching() {
        return None;
    }
    let a = layout.alignment();
    (1..=limit / a).map(|k| k * a + 1).find(|&n| repeated_prompt(layout, n, chunk).hit > 0)
}

#[cfg(test)]
mod tests {
    use super::{min_cacheable_prompt, repeated_prompt};
    use crate::core::groups::spec::{GroupKind, GroupLayout, GroupSpec, LayoutOptions, MambaMode};

    fn layout(groups: Vec<GroupSpec>) -> GroupLayout {
        GroupLayout::new(groups, LayoutOptions { enable_caching: true, ..LayoutOptions::default() })
            .expect("test setup")
    }

    #[test]
    fn full_attention_hits_all_but_the_last_partial_block() {
        let l = layout(vec![GroupSpec::full(16)]);
        assert_eq!(repeated_prompt(&l, 100, None).hit, 96);
        assert_eq!(repeated_prompt(&l, 96, None).hit, 80);
        assert_eq!(repeated_prompt(&l, 16, None).hit, 0);
        assert_eq!(min_cacheable_prompt(&l, None, 1000), Some(17));
    }

    #[test]
    fn a_coarser_group_aligns_the_hit_to_the_lcm() {
        let l = layout(vec![GroupSpec::full(16), GroupSpec::full(64)]);
        let r = repeated_prompt(&l, 100, None);
        assert_eq!(r.hit, 64);
        assert_eq!(min_cacheable_prompt(&l, None, 1000), Some(65));
    }

    #[test]
    fn sliding_window_keeps_its_blocks_and_mamba_its_states() {
        let swa = GroupSpec { kind: GroupKind::SlidingWindow { window: 32 }, block_size: 16 };
        let r = repeated_prompt(&layout(vec![GroupSpec::full(16), swa]), 100, None);
        assert_eq!(r.hit, 96);
        // The window's final blocks are reused, the earlier ones are nulls.
        assert_eq!(r.set_reused[1], 2);
        assert_eq!(r.set_nulls[1], 4);
        let m = GroupSpec { kind: GroupKind::Mamba { mode: MambaMode::Align }, block_size: 16 };
        let l = layout(vec![GroupSpec::full(16), m]);
        // Prefilled at once: one state at 96; the repeat is bounded at 99 and
        // reuses it.
        assert_eq!(repeated_prompt(&l, 100, None).hit, 96);
        // 96 tokens: the only state is at 96, past the bound of 95.
        assert_eq!(repeated_prompt(&l, 96, None).hit, 0);
        // Chunks of 32: states at 32, 64 and 96: the repeat reuses 64.
        assert_eq!(repeated_prompt(&l, 96, Some(32)).hit, 64);
    }
}
