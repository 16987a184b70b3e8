//! The block events vLLM's KV cache metrics collector hears
//! (`KVCacheMetricsCollector`: `on_block_allocated` for each block
//! `get_new_blocks` hands out, after `on_block_evicted` with prefix caching
//! on; `on_block_accessed` for each non-null block `touch` adopts), logged in
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

impl VllmManager {
    /// Starts (or stops, dropping what was logged) the metrics hooks' log.
    pub fn log_metrics(&mut self, on: bool) {
        self.metrics = on.then(Vec::new);
    }

    /// Drains the metrics hooks' log: `(block, accessed)` in call order
    /// (`accessed` false: allocated).
    pub fn take_metrics(&mut self) -> Vec<(BlockId, bool)> {
        let Some(log) = self.metrics.as_mut() else { return Vec::new() };
        log.drain(..).map(|x| (BlockId(x & !ACCESSED), x & ACCESSED != 0)).collect()
    }
}
