//! What a hybrid layout can hit, and why not: the figures `kvindex explain`
//! reports, computed with the core's group rules ([`crate::core::groups`]).
//!
//! The one model of a cache here: a request of `n` tokens is prefilled (in chunks of `chunk` tokens, the last one shorter)
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
//! [`repeated_prompt`] runs one request and its repeat; [`Replay`] a stream
//! of requests, each prefilled from its own hit (`kvindex simulate --model`).
//!
//! The second request's hit is the hybrid fixed point
//! ([`longest_hit`]) over those blocks, bounded at `n - 1` tokens as vLLM
//! bounds a hit; each spec set's own hit (its rule alone, same bound and
//! alignment) says which group's rule cost what.
//!
//! Invariants: every figure is a function of the layout and the arguments;
//! a hit is a multiple of the layout's alignment and at most `n - 1`.
//!
//! Costs: O(n / hash block size) per repeated prompt or replayed request (one pass per spec set
//! per fixed-point round); [`min_cacheable_prompt`] at most `limit /
//! alignment` of them.

use std::collections::HashSet;

use crate::core::groups::coordinator::{cacheable_tokens, coarse_hash_index, longest_hit};
use crate::core::groups::rule::{GroupRule, HitQuery};
use crate::core::groups::spec::{GroupKind, GroupLayout, MambaMode, SpecSet};

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
fn cached_blocks(layout: &GroupLayout, set: &SpecSet, n: usize, chunk: usize) -> Vec<bool> {
    let spec = set.spec;
    let g = set.group_ids[0];
    let bs = spec.block_size;
    let cacheable = cacheable_tokens(layout, g, n, 0);
    let blocks = cacheable / bs;
    let alignment = layout.alignment();
    match spec.kind {
        GroupKind::Mamba { mode: MambaMode::None } => vec![false; blocks],
        GroupKind::Mamba { mode: MambaMode::Align } => {
            let mut v = vec![false; blocks];
            let mut end = 0usize;
            while end < n {
                end = (end + chunk.max(1)).min(n);
                let at = cacheable_tokens(layout, g, end, 0) / bs;
                if at > 0 {
                    v[at - 1] = true;
                }
            }
            v
        }
        _ => (0..blocks).map(|i| spec.caches_block(i, alignment, set.use_eagle)).collect(),
    }
}

/// The hit of a prompt of `n` tokens seen a second time, the first time
/// prefilled in chunks of `chunk` tokens (`None`: at once).
#[must_use]
pub fn repeated_prompt(layout: &GroupLayout, n: usize, chunk: Option<usize>) -> RepeatedPrompt {
    let sets = layout.spec_sets();
    let chunk = chunk.unwrap_or(n).max(1);
    let cached: Vec<Vec<bool>> = sets.iter().map(|s| cached_blocks(layout, s, n, chunk)).collect();
    let mut looks: Vec<_> =
        cached.iter().map(|c| move |i: usize| c.get(i).copied().unwrap_or(false).then_some(())).collect();
    let mut outs = vec![Vec::new(); sets.len()];
    let max = n.saturating_sub(1);
    let hashes = n / layout.hash_block_size();
    let h = longest_hit(layout, &mut looks, max, hashes, &mut outs);
    let q = HitQuery { max_tokens: max, alignment: layout.alignment(), drop_eagle: layout.use_eagle() };
    let mut scratch = Vec::new();
    let set_hits = if layout.enable_caching() {
        sets.iter()
            .zip(looks.iter_mut())
            .map(|(s, l)| s.spec.longest_hit(l, &HitQuery { drop_eagle: s.use_eagle, ..q }, &mut scratch))
            .collect()
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

/// One request's figures in a [`Replay`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplayHit {
    /// Tokens the layout reuses.
    pub hit: usize,
    /// Per spec set: the tokens its rule alone would reuse.
    pub set_hits: Vec<usize>,
}

/// A stream of requests through one engine's cache under a layout, with
/// nothing evicted: each request hits what earlier ones left cached (the
/// hybrid fixed point), then leaves its own blocks cached as
/// [`repeated_prompt`]'s first request does, its prefill starting at its hit
/// and chunked from there. Requests are identified by their block hashes at
/// the layout's hash block size (the caller's hashing).
///
/// Costs: O(prompt blocks × spec sets) per request; memory one hash per
/// cached block per spec set.
#[derive(Clone, Debug)]
pub struct Replay {
    layout: GroupLayout,
    /// Per spec set: the hashes (of its blocks) cached.
    cached: Vec<HashSet<u64>>,
}

impl Replay {
    /// An empty cache under `layout`.
    #[must_use]
    pub fn new(layout: GroupLayout) -> Self {
        let n = layout.spec_sets().len();
        Replay { layout, cached: vec![HashSet::new(); n] }
    }

    /// The layout.
    #[must_use]
    pub fn layout(&self) -> &GroupLayout {
        &self.layout
    }

    /// Blocks cached per spec set.
    #[must_use]
    pub fn cached_blocks(&self) -> Vec<usize> {
        self.cached.iter().map(HashSet::len).collect()
    }

    /// Runs one request of an `n`-token prompt that ends with `total` tokens
    /// (prompt and output) whose block hashes (at the hash block size) are
    /// `hashes` (of all `total` tokens' full blocks), the prompt prefilled in
    /// chunks of `chunk` tokens (None: at once). Its hit is bounded by the
    /// prompt; it leaves cached what its whole sequence filled (decode steps
    /// end on every block boundary, so a Mamba group keeps a state at each).
    pub fn request(&mut self, hashes: &[u64], n: usize, total: usize, chunk: Option<usize>) -> ReplayHit {
        let hb = self.layout.hash_block_size();
        let sets = self.layout.spec_sets();
        let scales: Vec<usize> = sets.iter().map(|s| s.spec.block_size / hb).collect();
        let total = total.max(n);
        let cached = &self.cached;
        let prompt = &hashes[..(n / hb).min(hashes.len())];
        let mut looks: Vec<_> = (0..sets.len())
            .map(|k| {
                let scale = scales[k];
                let set = &cached[k];
                move |i: usize| {
                    let f = coarse_hash_index(i, scale);
                    (f < prompt.len() && set.contains(&prompt[f])).then_some(())
                }
            })
            .collect();
        let mut outs = vec![Vec::new(); sets.len()];
        let max = n.saturating_sub(1);
        let h = longest_hit(&self.layout, &mut looks, max, prompt.len(), &mut outs);
        let q = HitQuery {
            max_tokens: max,
            alignment: self.layout.alignment(),
            drop_eagle: self.layout.use_eagle(),
        };
        let mut scratch = Vec::new();
        let set_hits = if self.layout.enable_caching() {
            sets.iter()
                .zip(looks.iter_mut())
                .map(|(s, l)| s.spec.longest_hit(l, &HitQuery { drop_eagle: s.use_eagle, ..q }, &mut scratch))
                .collect()
        } else {
            vec![0; sets.len()]
        };
        // What this request leaves cached: chunks from its hit on.
        let chunk = chunk.unwrap_or(n).max(1);
        for (k, s) in sets.iter().enumerate() {
            let bs = s.spec.block_size;
            let g = s.group_ids[0];
            let keep = match s.spec.kind {
                GroupKind::Mamba { mode: MambaMode::Align } => {
                    let mut v = Vec::new();
                    let mut end = h.tokens;
                    while end < n {
                        end = (end + chunk).min(n);
                        let at = cacheable_tokens(&self.layout, g, end, 0) / bs;
                        if at > 0 {
                            v.push(at - 1);
                        }
                    }
                    let first = cacheable_tokens(&self.layout, g, n, 0) / bs;
                    v.extend(first..cacheable_tokens(&self.layout, g, total, 0) / bs);
                    v
                }
                GroupKind::Mamba { mode: MambaMode::None } => Vec::new(),
                _ => {
                    let blocks = cacheable_tokens(&self.layout, g, total, 0) / bs;
                    (0..blocks)
                        .filter(|&i| s.spec.caches_block(i, self.layout.alignment(), s.use_eagle))
                        .collect()
                }
            };
            for i in keep {
                let f = coarse_hash_index(i, scales[k]);
                if f < hashes.len() {
                    self.cached[k].insert(hashes[f]);
                }
            }
        }
        ReplayHit { hit: h.tokens, set_hits }
    }
}

#[cfg(test)]
mod tests {
    use super::{min_cacheable_prompt, repeated_prompt, Replay};
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

    #[test]
    fn replay_matches_the_repeated_prompt_and_shares_prefixes() {
        let m = GroupSpec { kind: GroupKind::Mamba { mode: MambaMode::Align }, block_size: 16 };
        let l = layout(vec![GroupSpec::full(16), m]);
        let mut r = Replay::new(l.clone());
        let a: Vec<u64> = (0..6).collect();
        assert_eq!(r.request(&a, 100, 100, None).hit, 0);
        assert_eq!(r.request(&a, 100, 100, None).hit, repeated_prompt(&l, 100, None).hit);
        // A prompt sharing 4 blocks: full attention could reuse 64 tokens, but the only
        // Mamba state is at 96.
        let b: Vec<u64> = vec![0, 1, 2, 3, 50, 51, 52, 53];
        let h = r.request(&b, 100, 130, None);
        assert_eq!((h.hit, h.set_hits[0]), (0, 64));
        // b's decode filled blocks 6 and 7 (a state at each of their ends too).
        assert_eq!(r.cached_blocks(), vec![10, 4]);
        // Its follow-up reuses the state at 128.
        let c: Vec<u64> = vec![0, 1, 2, 3, 50, 51, 52, 53, 60];
        assert_eq!(r.request(&c, 150, 150, None).hit, 128);
    }
}
