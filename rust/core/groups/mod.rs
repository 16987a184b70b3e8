//! KV cache groups: several block tables per request over one block pool,
//! each group following its kind's vLLM 0.33 rule.
//!
//! | module | what it holds |
//! |---|---|
//! | [`spec`] | group kinds, specs and a cache's validated layout (hash / scheduler block sizes, spec sets) |
//! | [`rule`] | the per-kind rule trait (`GroupRule`) over a caller's `BlockLookup` |
//! | [`coordinator`] | the hybrid fixed point over groups and the cacheable-token rule |

pub mod coordinator;
pub mod rule;
pub mod spec;
