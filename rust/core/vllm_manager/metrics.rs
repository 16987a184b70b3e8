//! The block events vLLM's KV cache metrics collector hears
//! (`KVCacheMetricsCollector`: `on_block_allocated` for each block
//! `get_new_blocks` hands out, after `on_block_evicted` with prefix caching
//! on; `on_block_accessed` for each non-null block `touch` adopts;
//! `on_block_evicted` alone for a block whose hashes are dropped in place),
//! logged in
//! the order the manager's calls make them so the caller can replay them to
//! the collector, which samples blocks with its own random draws.
//!
//! # Invariants
//! - when on, the log holds every block handed out by an allocation and
//!   every non-null block a hit adopted since the last drain, in order;
//!   when off, nothing is kept.
//!
//! # Costs
//! One branch per allocation and adopted hit when off; 4 bytes per logged
//! block when on.

use super::VllmManager;
use crate::core::ids::BlockId;

/// Bit set on a logged block id adopted by a hit (`on_block_accessed`);
/// clear: handed out by an allocation (`on_block_allocated`).
pub const ACCESSED: u32 = 1 << 31;

/// Bit set on a logged block id whose hashes a transient Mamba prefill
/// checkpoint drops (`on_block_evicted` alone).
pub const EVICTED: u32 = 1 << 30;

/// What the metrics collector hears of one logged block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricEvent {
    /// Handed out by an allocation: `on_block_evicted` (with prefix caching
    /// on) then `on_block_allocated`.
    Allocated,
    /// Adopted by a hit: `on_block_accessed`.
    Accessed,
    /// Its hashes dropped in place: `on_block_evicted`.
    Evicted,
}

impl VllmManager {
    /// Starts (or stops, dropping what was logged) the metrics hooks' log.
    pub fn log_metrics(&mut self, on: bool) {
        self.metrics = on.then(Vec::new);
    }

    /// Drains the metrics hooks' log: `(block, event)` in call order.
    pub fn take_metrics(&mut self) -> Vec<(BlockId, MetricEvent)> {
        let Some(log) = self.metrics.as_mut() else { return Vec::new() };
        log.drain(..)
            .map(|x| {
                let e = if x & ACCESSED != 0 {
                    MetricEvent::Accessed
                } else if x & EVICTED != 0 {
                    MetricEvent::Evicted
                } else {
                    MetricEvent::Allocated
                };
                (BlockId(x & !(ACCESSED | EVICTED)), e)
            })
            .collect()
    }

    /// Logs `on_block_evicted` of block `b`, when the log is on.
    pub(super) fn log_evicted(&mut self, b: BlockId) {
        if let Some(log) = self.metrics.as_mut() {
            log.push(b.0 | EVICTED);
        }
    }
}
