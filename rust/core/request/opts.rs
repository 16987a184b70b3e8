//! What an engine step is asked and what it answers: [`StepOpts`] (vLLM's
//! `allocate_slots` arguments) and [`Scheduled`]. Plain data, shared by the
//! one-chunk calls (which admit with the default options) and the engine
//! lifecycle.
//!
//! No invariants (any value is checked by the call that takes it); no costs.

/// Options of an admission step (vLLM's `allocate_slots` arguments).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepOpts {
    /// Most tokens scheduled now (`None`: the whole rest of the prompt).
    pub chunk: Option<usize>,
    /// Slots allocated beyond the scheduled tokens, never cached.
    pub lookahead: usize,
    /// vLLM's `full_sequence_must_fit`: the whole sequence must fit in the
    /// available blocks (watermark included, `reserved_blocks` not).
    pub must_fit: bool,
    /// Leading tokens another tier holds (offload tier, prefill worker); the
    /// tokens beyond the local hit are allocated without a hit.
    pub external_prefix: usize,
    /// The external tokens arrive later: nothing is scheduled or cached
    /// until [`PrefixCache::finish_transfer`](super::PrefixCache::finish_transfer).
    pub delay_cache: bool,
    /// Blocks that must stay free after this admission.
    pub reserved_blocks: usize,
    /// vLLM's watermark for waiting / preempted requests (0 when nothing
    /// else is scheduled).
    pub watermark_blocks: usize,
}

/// What an admission scheduled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scheduled {
    /// Local prefix-cache hit tokens.
    pub hit: usize,
    /// External tokens allocated beyond the hit.
    pub external: usize,
    /// Tokens scheduled for compute in this step.
    pub scheduled: usize,
    /// Table index of the first block this call allocated.
    pub first_new: usize,
}
