//! KV cache zeroing over several groups: vLLM 0.33's `new_block_ids` per
//! single-type manager (`needs_kv_cache_zeroing`).
//!
//! When zeroing is on, a group whose spec the worker zeroes (every attention
//! kind kvindex's manager takes) logs the ids of the blocks it allocates:
//! new blocks, and external-token blocks unless the call skips that group.
//! [`VllmManager::take_new_ids`] drains the logs group by group (vLLM's
//! `take_new_block_ids` concatenates its managers' lists in group order);
//! [`VllmManager::record_for_zeroing_groups`] re-logs a request's blocks from
//! a token position (vLLM's `record_blocks_for_zeroing`, null blocks
//! included as vLLM lists them).
//!
//! Costs: O(1) per allocated block; re-logging O(blocks after the position).

use super::VllmManager;
use crate::core::error::{KvError, KvResult};

impl VllmManager {
    /// Turns zeroing logs on for the groups whose bit is set in `mask`
    /// (bit `g`: group `g`), off for the others.
    ///
    /// # Errors
    /// `InvalidArgument` for a bit past the last group (nothing changed).
    pub fn set_zeroing_groups(&mut self, mask: u64) -> KvResult<()> {
        let ng = self.layout.len();
        if ng < 64 && mask >> ng != 0 {
            return Err(KvError::invalid(format!(
                "zeroing mask {mask:#x} names a group past the {ng} groups"
            )));
        }
        self.zero_mask = mask;
        self.log_new = mask != 0;
        Ok(())
    }

    /// Whether group `g` logs the blocks it allocates.
    #[must_use]
    pub fn records_new(&self, g: usize) -> bool {
        self.log_new && (g >= 64 || self.zero_mask & (1 << g) != 0)
    }

    /// vLLM's `record_blocks_for_zeroing`: every logging group appends the
    /// request's blocks from token `start_token` on to its log.
    ///
    /// # Errors
    /// `InvalidArgument` when `start_token` is not a multiple of a logging
    /// group's block size (nothing changed).
    pub fn record_for_zeroing_groups(&mut self, rid: &str, start_token: usize) -> KvResult<()> {
        let ng = self.layout.len();
        for g in 0..ng {
            let bs = self.layout.groups()[g].block_size;
            if self.records_new(g) && !start_token.is_multiple_of(bs) {
                return Err(KvError::invalid(format!(
                    "start_token {start_token} is not a multiple of group {g}'s block size {bs}"
                )));
            }
        }
        let Some(r) = self.reqs.get(rid) else { return Ok(()) };
        for g in 0..ng {
            if !self.records_new(g) {
                continue;
            }
            let bs = self.layout.groups()[g].block_size;
            let blocks = &r.g(g).blocks;
            let from = (start_token / bs).min(blocks.len());
            self.new_ids[g].extend_from_slice(&blocks[from..]);
        }
        Ok(())
    }
}

impl VllmManager {
    /// Drains group `g`'s log alone (vLLM's single-type `take_new_block_ids`).
    pub fn take_new_ids_group(&mut self, g: usize) -> Vec<crate::core::ids::BlockId> {
        self.new_ids.get_mut(g).map(std::mem::take).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use crate::core::groups::spec::{GroupKind, GroupLayout, GroupSpec, LayoutOptions};
    use crate::core::ids::BlockId;
    use crate::core::vllm_manager::{SlotRequest, VllmManager};

    fn two_groups() -> VllmManager {
        let groups = vec![
            GroupSpec::full(4),
            GroupSpec { kind: GroupKind::SlidingWindow { window: 4 }, block_size: 4 },
        ];
        let opt = LayoutOptions { enable_caching: true, ..LayoutOptions::default() };
        VllmManager::with_layout(20, GroupLayout::new(groups, opt).expect("layout"), false, false, None)
            .expect("manager")
    }

    #[test]
    fn only_zeroing_groups_log_and_re_logging_needs_aligned_tokens() {
        let mut m = two_groups();
        m.set_zeroing_groups(0b10).expect("mask");
        assert!(m.set_zeroing_groups(0b100).is_err());
        let s = SlotRequest { num_tokens_need_slot: 8, ..SlotRequest::default() };
        let new = m.allocate_slots_groups("r", &[], &s).expect("valid").expect("fits");
        assert_eq!(m.take_new_ids(), new[1]);
        assert!(m.take_new_ids().is_empty());
        assert!(m.record_for_zeroing_groups("r", 2).is_err());
        m.record_for_zeroing_groups("r", 4).expect("aligned");
        assert_eq!(m.take_new_ids_group(1), new[1][1..].to_vec());
        assert_eq!(m.take_new_ids_group(0), Vec::<BlockId>::new());
    }

    #[test]
    fn loose_blocks_are_not_logged() {
        let mut m = two_groups();
        m.set_zeroing_groups(0b11).expect("mask");
        let loose = m.take_loose(3).expect("free blocks");
        assert_eq!(loose.len(), 3);
        assert!(m.take_new_ids().is_empty());
        assert!(m.take_loose(100).is_err());
        m.free_blocks(&loose).expect("held");
        m.check_invariants().expect("invariants");
    }
}
