//! Operations on one group's block table of one request, shared by the
//! general group calls ([`super::groups`]) and their one-lookup paths
//! ([`super::decode`]): adopting a hit and nulling the blocks a window
//! skipped. Each keeps the pool's reference counts in step with the table.
//!
//! Costs: O(blocks touched, freed or appended).

use super::GroupReq;
use crate::core::block_pool::BlockPool;
use crate::core::groups::rule::GroupRule;
use crate::core::groups::spec::GroupSpec;
use crate::core::ids::BlockId;

/// vLLM's `remove_skipped_blocks` on one table: the real blocks that end at
/// block `n` (at most the table's length) are freed, last first, stopping at
/// a null, and become nulls.
pub(super) fn null_skipped(
    pool: &mut BlockPool,
    scratch: &mut Vec<BlockId>,
    blocks: &mut [BlockId],
    n: usize,
) {
    let n = n.min(blocks.len());
    let lo = blocks[..n].iter().rposition(|&b| b == BlockId::NULL).map_or(0, |i| i + 1);
    if lo < n {
        pool.free(blocks[lo..n].iter().rev().copied(), scratch);
        blocks[lo..n].fill(BlockId::NULL);
    }
}

/// vLLM's `add_local_computed_blocks` on one group's table `t`: the hit
/// blocks before the window of `total` computed tokens become nulls, the
/// rest are touched and appended; the cached count is the table's length.
pub(super) fn adopt_hits(
    pool: &mut BlockPool,
    spec: GroupSpec,
    t: &mut GroupReq,
    hits: &[BlockId],
    total: usize,
    metrics: &mut Option<Vec<u32>>,
) {
    let skipped = spec.skipped_tokens(total) / spec.block_size;
    let rest = &hits[skipped.min(hits.len())..];
    for b in rest.iter().filter(|&&b| b != BlockId::NULL) {
        pool.touch(std::slice::from_ref(b));
        if let Some(log) = metrics.as_mut() {
            log.push(b.0 | super::metrics::ACCESSED);
        }
    }
    t.blocks.extend(std::iter::repeat_n(BlockId::NULL, skipped));
    t.blocks.extend_from_slice(rest);
    t.num_cached = Some(t.blocks.len());
}
