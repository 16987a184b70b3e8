//! Sparse caching of sliding-window groups: vLLM 0.33's
//! `prefix_cache_retention_interval` and its `reachable_block_mask`.
//!
//! A sliding-window hit at a boundary needs only the window's blocks that
//! end there, so `cache_blocks` registers only blocks some hit can use:
//! - no interval (dense): the tail of every scheduler-block segment (the
//!   rule's own [`GroupRule::caches_block`]);
//! - interval 0 (latest only): no segment tails;
//! - interval `n > 0`: the tail of every `n`-token segment;
//!
//! and, whenever an interval is set, the tail ending at every position a
//! later request can resume at: the replay boundaries of the request's prompt
//! (`num_prompt - 1`; under EAGLE one scheduler block below the resend and the
//! extension positions) and the shared-prefix junction the scheduler found
//! (also one block lower under EAGLE). A tail is the `ceil((W-1)/B)` blocks
//! (plus the EAGLE peek) ending at the aligned boundary. A Mamba group keeps
//! one state per segment (its last block) and the state ending at each of
//! those boundaries ([`VllmManager::mamba_retains`]); its prefill
//! checkpoints follow the segments, and under interval 0 only the chunk
//! reaching the prefill end reserves one. Other group kinds cache densely
//! and ignore the interval.
//!
//! Costs: O(boundaries) per block considered, at most three boundaries.

use super::VllmManager;
use crate::core::error::{KvError, KvResult};
use crate::core::groups::rule::{window_blocks, GroupRule};
use crate::core::groups::spec::GroupKind;

/// The manager's retention setting and the caching call's request context.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Retention {
    /// None: dense; Some(0): latest only; Some(n): one tail per n tokens.
    pub(crate) interval: Option<usize>,
    /// The prompt length of the request being cached.
    pub(crate) num_prompt: usize,
    /// The scheduler's shared-prefix junction of that request (0: none).
    pub(crate) shared_boundary: usize,
    /// That request's computed tokens before the step being cached.
    pub(crate) num_computed: usize,
    /// That request's tokens (prompt and output so far): its prefill ends at
    /// `max(num_prompt, num_tokens - 1)`.
    pub(crate) num_tokens: usize,
    /// vLLM's `num_hash_lookahead_tokens` (Mamba checkpoint positions leave them).
    pub(crate) hash_lookahead: usize,
}

/// vLLM's `replay_boundaries`: positions a later request replaying a prompt
/// of `num_prompt` tokens can resume at (at most two).
#[must_use]
pub fn replay_boundaries(num_prompt: usize, scheduler_block: usize, use_eagle: bool) -> ([usize; 2], usize) {
    if !use_eagle {
        return ([num_prompt.saturating_sub(1), 0], 1);
    }
    let b = scheduler_block.max(1);
    let resend = num_prompt.saturating_sub(1) / b * b;
    let extension = num_prompt / b * b;
    let (lo, hi) = (resend.saturating_sub(b), extension.saturating_sub(b));
    if lo == hi {
        ([lo, 0], 1)
    } else {
        ([lo.min(hi), lo.max(hi)], 2)
    }
}

impl VllmManager {
    /// Sets vLLM's `prefix_cache_retention_interval` (None: dense caching).
    ///
    /// # Errors
    /// `InvalidArgument`, nothing changed: a positive interval on a layout
    /// without sliding-window or Mamba group, or one that is not a multiple
    /// of the scheduler block size (vLLM's messages); any interval beside a
    /// Mamba group (sparse state retention is not implemented).
    pub fn set_retention_interval(&mut self, interval: Option<usize>) -> KvResult<()> {
        let Some(n) = interval else {
            self.retention.interval = None;
            return Ok(());
        };
        let windowed = self
            .layout
            .groups()
            .iter()
            .any(|g| g.kind.sliding_window().is_some() || matches!(g.kind, GroupKind::Mamba { .. }));
        if !windowed && n != 0 {
            return Err(KvError::invalid(
                "prefix_cache_retention_interval is set but this model has no sliding-window or \
                 Mamba KV cache group, so retention has no effect. Set it to 0 (it only applies \
                 to sliding-window and Mamba attention).",
            ));
        }
        let sbs = self.layout.scheduler_block_size();
        if windowed && !n.is_multiple_of(sbs) {
            return Err(KvError::invalid(format!(
                "prefix_cache_retention_interval ({n}) must be non-negative and a multiple of \
                 scheduler_block_size ({sbs})."
            )));
        }
        self.retention.interval = Some(n);
        Ok(())
    }

    /// The retention interval (None: dense).
    #[must_use]
    pub fn retention_interval(&self) -> Option<usize> {
        self.retention.interval
    }

    /// The request context the next caching steps use (a retention interval,
    /// prompt tails): its prompt length and the shared-prefix junction (0:
    /// none).
    pub fn set_cache_context(&mut self, num_prompt: usize, shared_boundary: usize) {
        self.retention.num_prompt = num_prompt;
        self.retention.shared_boundary = shared_boundary;
    }

    /// vLLM's `num_hash_lookahead_tokens`: tokens each hash covers past its
    /// block; Mamba prompt tails and prefill checkpoints stop that many
    /// tokens short of the end (at least one).
    pub fn set_hash_lookahead(&mut self, tokens: usize) {
        self.retention.hash_lookahead = tokens;
    }

    /// The request's computed tokens before the step the next caching calls
    /// cache (vLLM's `request.num_computed_tokens` there): a Mamba prompt
    /// tail at the shared-prefix junction registers only within the step's
    /// chunk.
    pub fn set_cache_computed(&mut self, num_computed: usize) {
        self.retention.num_computed = num_computed;
    }

    /// The request's tokens so far (prompt and output): under retention
    /// interval 0 only the chunk reaching its prefill end reserves a Mamba
    /// prefill checkpoint.
    pub fn set_request_tokens(&mut self, num_tokens: usize) {
        self.retention.num_tokens = num_tokens;
    }

    /// Whether caching registers group `g`'s table index `i` (vLLM's
    /// `reachable_block_mask` with the manager's retention).
    pub(crate) fn caches_block_at(&self, g: usize, i: usize, alignment: usize, eagle: bool) -> bool {
        let spec = &self.layout.groups()[g];
        let Some(interval) = self.retention.interval else {
            return spec.caches_block(i, alignment, eagle);
        };
        if let GroupKind::Mamba { .. } = spec.kind {
            return self.mamba_retains(g, i, interval, true);
        }
        let Some(window) = spec.kind.sliding_window() else { return true };
        let bs = spec.block_size;
        if alignment == 0 || !alignment.is_multiple_of(bs) {
            return true;
        }
        let need = window_blocks(window, bs, eagle);
        let shift = usize::from(eagle);
        if interval > 0 {
            let per_segment = interval / bs;
            if need >= per_segment {
                return true;
            }
            if i >= shift && (i - shift) % per_segment >= per_segment - need {
                return true;
            }
        }
        let (replay, n) = replay_boundaries(self.retention.num_prompt, alignment, self.layout.use_eagle());
        let shared = self.retention.shared_boundary;
        let junction = [shared, if eagle && shared >= bs { shared - bs } else { usize::MAX }];
        let boundaries = replay[..n].iter().chain(if shared > 0 { &junction[..] } else { &[][..] });
        boundaries.filter(|&&b| b != usize::MAX).any(|&b| {
            let end = b / alignment * alignment / bs + shift;
            i < end && i + need >= end
        })
    }
}

impl VllmManager {
    /// vLLM's Mamba `reachable_block_mask` for state block `i` of group `g`
    /// under `interval`: a segment's last block (every block when a segment
    /// is at most one block), and with `boundaries` the block ending at each
    /// position a later request resumes at (the replay boundaries and the
    /// shared-prefix junction, one block lower too under EAGLE), rounded
    /// down to the hit alignment.
    pub(crate) fn mamba_retains(&self, g: usize, i: usize, interval: usize, boundaries: bool) -> bool {
        let bs = self.layout.groups()[g].block_size;
        if interval > 0 {
            let per_segment = interval / bs;
            if per_segment <= 1 || (i + 1).is_multiple_of(per_segment) {
                return true;
            }
        }
        if !boundaries {
            return false;
        }
        let unit = self.layout.alignment();
        let r = &self.retention;
        let (replay, n) =
            replay_boundaries(r.num_prompt, self.layout.scheduler_block_size(), self.layout.use_eagle());
        let shared = r.shared_boundary;
        let junction = [shared, if self.layout.group_eagle(g) { shared.saturating_sub(bs) } else { 0 }];
        let extra = if shared > 0 { &junction[..] } else { &[][..] };
        replay[..n].iter().chain(extra).any(|&b| {
            let blocks = b / unit * unit / bs;
            blocks >= 1 && blocks - 1 == i
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::groups::spec::{GroupLayout, GroupSpec, LayoutOptions};
    use crate::core::ids::BlockHash;
    use crate::core::vllm_manager::SlotRequest;

    /// One 16-token sliding window of 16 tokens, a 256-token prompt cached at once: the
    /// table indices that end up cached under `interval`.
    fn cached_under(interval: Option<usize>) -> Vec<usize> {
        let g = GroupSpec { kind: GroupKind::SlidingWindow { window: 16 }, block_size: 16 };
        let opt = LayoutOptions { enable_caching: true, ..LayoutOptions::default() };
        let layout = GroupLayout::new(vec![g], opt).expect("layout");
        let mut m = VllmManager::with_layout(40, layout, false, false, None).expect("manager");
        m.set_retention_interval(interval).expect("valid interval");
        let hashes: Vec<BlockHash> = (0..16u8).map(|i| BlockHash::from_digest(&[i + 1; 8])).collect();
        m.set_cache_context(256, 0);
        let s = SlotRequest { num_tokens_need_slot: 256, ..SlotRequest::default() };
        m.allocate_slots_groups("r", &[], &s).expect("valid").expect("fits");
        let plan = m.cache_plan("r", 256, hashes.len(), 0);
        let runs = m.cache_apply("r", &plan, 0, &hashes).expect("fits");
        runs.iter().flat_map(|r| r.stored.iter()).collect::<Vec<usize>>()
    }

    #[test]
    fn intervals_keep_segment_tails_and_the_replay_tail() {
        assert_eq!(cached_under(None), (0..16).collect::<Vec<_>>());
        assert_eq!(cached_under(Some(64)), vec![3, 7, 11, 14, 15]);
        assert_eq!(cached_under(Some(0)), vec![14]);
    }

    #[test]
    fn eagle_replay_boundaries_are_one_block_below_resend_and_extension() {
        assert_eq!(replay_boundaries(41, 8, false), ([40, 0], 1));
        assert_eq!(replay_boundaries(40, 8, true), ([24, 32], 2));
        assert_eq!(replay_boundaries(41, 8, true), ([32, 0], 1));
    }

    #[test]
    fn a_bad_interval_changes_nothing() {
        let g = GroupSpec { kind: GroupKind::SlidingWindow { window: 16 }, block_size: 16 };
        let opt = LayoutOptions { enable_caching: true, ..LayoutOptions::default() };
        let mut m =
            VllmManager::with_layout(8, GroupLayout::new(vec![g], opt).expect("layout"), false, false, None)
                .expect("manager");
        assert!(m.set_retention_interval(Some(24)).is_err());
        assert_eq!(m.retention_interval(), None);
        let full = GroupLayout::single_full(16, true).expect("layout");
        let mut f = VllmManager::with_layout(8, full, false, false, None).expect("manager");
        assert!(f.set_retention_interval(Some(16)).is_err());
        assert!(f.set_retention_interval(Some(0)).is_ok());
    }
}
