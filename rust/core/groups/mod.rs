//! KV cache groups: several block tables per request over one block pool,
//! each group following its kind's vLLM 0.33 rule.
//!
//! | module | what it holds |
//! |---|---|
//! | [`kind`] | group kinds (vLLM's spec kinds) and what a kind decides alone |
//! | [`spec`] | group specs and a cache's validated layout (hash / scheduler block sizes, spec sets, EAGLE flags) |
//! | [`rule`] | the per-kind rule trait (`GroupRule`) over a caller's `BlockLookup` |
//! | [`coordinator`] | the hybrid fixed point over groups and the cacheable-token rule |

pub mod coordinator;
pub mod kind;
pub mod rule;
pub mod spec;
