//! `_VllmManager`'s copy-on-write hand-offs under partial hash hits (see
//! the core's `vllm_manager::cow` module): queued block copies, the boundary
//! states producers offer, and their tails when a request finishes.

use pyo3::prelude::*;

use super::vllm_manager::{count, PyVllmManager};

#[pymethods]
impl PyVllmManager {
    /// Whether hits may end at hash-block boundaries inside blocks (vLLM's
    /// ``enable_partial_hash_hits``): an align-mode Mamba group is larger than the
    /// hash block.
    #[getter]
    fn partial_hits(&self) -> bool {
        self.inner.partial_hits()
    }

    /// Drains group ``group``'s queued block copies ``(source, copy)``, oldest
    /// first. Each endpoint holds one reference for the copy; free both once it ran.
    fn take_cow_copies(&mut self, group: i64) -> PyResult<Vec<(u32, u32)>> {
        let g = count(group, "group")?;
        Ok(self.inner.take_cow_copies(g).iter().map(|(s, d)| (s.0, d.0)).collect())
    }

    /// Drains the copies producers of a prompt tail offered as boundary states:
    /// ``(request_id, group, block_id, boundary_tokens)``, oldest first.
    fn take_cow_offers(&mut self) -> Vec<(String, usize, u32, usize)> {
        self.inner.take_cow_offers().into_iter().map(|(r, g, b, t)| (r, g, b.0, t)).collect()
    }

    /// vLLM's ``finalize_partial_tail_offloads`` for a finishing request: each
    /// Mamba group's prompt tail it produced, ``(group, block_id, boundary_tokens)``,
    /// when nothing past the boundary was computed (``num_computed``) or is in
    /// flight; its tails are forgotten either way.
    fn finalize_partial_tails(
        &mut self,
        request_id: &str,
        num_computed: i64,
        num_in_flight: i64,
    ) -> PyResult<Vec<(usize, u32, usize)>> {
        let n = count(num_computed, "num_computed")?;
        let f = count(num_in_flight, "num_in_flight")?;
        Ok(self
            .inner
            .finalize_partial_tails(request_id, n, f)
            .into_iter()
            .map(|(g, b, t)| (g, b.0, t))
            .collect())
    }

    /// vLLM's ``mamba_shared_prefix_checkpoint`` as the manager narrows it: Mamba
    /// prompt tails register at the scheduler's shared-prefix junction too (off
    /// without an align-mode Mamba group larger than the hash block).
    #[getter]
    fn mamba_shared_prefix_checkpoint(&self) -> bool {
        self.inner.mamba_shared_prefix_checkpoint()
    }

    /// Sets vLLM's ``mamba_shared_prefix_checkpoint`` (as the manager narrows
    /// ``enable_mamba_shared_prefix_checkpoint``); ignored without an align-mode Mamba
    /// group larger than the hash block.
    fn set_mamba_shared_prefix_checkpoint(&mut self, on: bool) {
        self.inner.set_mamba_shared_prefix_checkpoint(on);
    }
}
