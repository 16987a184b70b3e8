//! `_VllmManager`'s zeroing logs, retention interval and blocks held by no
//! request (see [`crate::core::vllm_manager::retention`] and the core's
//! `zeroing` and `loose` modules).

use pyo3::prelude::*;

use super::errors::{invalid, IntoPyResult};
use super::vllm_manager::{count, read_hashes, PyVllmManager};
use crate::core::ids::BlockId;

#[pymethods]
impl PyVllmManager {
    /// Logs the blocks the listed groups allocate (KV cache zeroing); the other
    /// groups log nothing.
    fn set_zeroing_groups(&mut self, groups: Vec<i64>) -> PyResult<()> {
        let mut mask = 0u64;
        for g in groups {
            match u32::try_from(g) {
                Ok(g) if g < 64 => mask |= 1 << g,
                _ => return Err(invalid(format!("zeroing group {g} out of range"))),
            }
        }
        self.inner.set_zeroing_groups(mask).py()
    }

    /// Whether group ``group`` logs its new blocks for zeroing.
    fn records_new_ids(&self, group: i64) -> PyResult<bool> {
        Ok(self.inner.records_new(count(group, "group")?))
    }

    /// Drains group ``group``'s zeroing log alone.
    fn take_new_ids_group(&mut self, group: i64) -> PyResult<Vec<u32>> {
        let g = count(group, "group")?;
        Ok(self.inner.take_new_ids_group(g).iter().map(|b| b.0).collect())
    }

    /// vLLM's ``record_blocks_for_zeroing``: each logging group logs the request's
    /// blocks from token ``start_token`` on (a multiple of its block size).
    fn record_for_zeroing_groups(&mut self, request_id: &str, start_token: i64) -> PyResult<()> {
        let s = count(start_token, "start_token")?;
        self.inner.record_for_zeroing_groups(request_id, s).py()
    }

    /// Sets each group's ``num_speculative_blocks`` (MTP / EAGLE beside Mamba: state
    /// blocks for the draft tokens), one count per group, 0 outside Mamba groups;
    /// before any request.
    fn set_mamba_speculative_blocks(&mut self, counts: Vec<i64>) -> PyResult<()> {
        let counts =
            counts.into_iter().map(|n| count(n, "num_speculative_blocks")).collect::<PyResult<Vec<_>>>()?;
        self.inner.set_mamba_speculative_blocks(&counts).py()
    }

    /// Sets each group's prefill checkpoints: the ``prefill_checkpoint_alignment`` of an
    /// align-mode Mamba group with ``num_prefill_checkpoint_blocks > 0``, else None; one
    /// entry per group, before any request.
    fn set_mamba_prefill_checkpoints(&mut self, alignments: Vec<Option<i64>>) -> PyResult<()> {
        let a = alignments
            .into_iter()
            .map(|x| x.map(|n| count(n, "prefill_checkpoint_alignment")).transpose())
            .collect::<PyResult<Vec<_>>>()?;
        self.inner.set_mamba_prefill_checkpoints(&a).py()
    }

    /// Group ``group``'s prefill checkpoints: ``{request_id: (position, reserved index)}``
    /// (vLLM's ``MambaManager._checkpoints``).
    fn mamba_checkpoints(&self, group: i64) -> PyResult<Vec<(String, usize, usize)>> {
        let g = count(group, "group")?;
        Ok(self.inner.mamba_checkpoints(g))
    }

    /// Sets vLLM's ``num_hash_lookahead_tokens`` (tokens each hash covers past its
    /// block): Mamba prompt tails and prefill checkpoints stop that many tokens short of
    /// the end.
    fn set_hash_lookahead(&mut self, tokens: i64) -> PyResult<()> {
        let n = count(tokens, "num_hash_lookahead_tokens")?;
        self.inner.set_hash_lookahead(n);
        Ok(())
    }

    /// Sets vLLM's ``prefix_cache_retention_interval`` (None: dense caching).
    fn set_retention_interval(&mut self, interval: Option<i64>) -> PyResult<()> {
        let n = match interval {
            None => None,
            Some(v) if v < 0 => {
                let sbs = self.inner.layout().scheduler_block_size();
                return Err(invalid(format!(
                    "prefix_cache_retention_interval ({v}) must be non-negative and a multiple \
                     of scheduler_block_size ({sbs})."
                )));
            }
            Some(v) => Some(count(v, "interval")?),
        };
        self.inner.set_retention_interval(n).py()
    }

    /// The retention interval (None: dense).
    #[getter]
    fn retention_interval(&self) -> Option<usize> {
        self.inner.retention_interval()
    }

    /// The prompt length and shared-prefix junction the next caching steps use
    /// (a retention interval, prompt tails), the request's computed tokens before the
    /// step being cached (a Mamba tail at the junction needs it) and its tokens so far
    /// (under retention interval 0 a Mamba prefill checkpoint needs its prefill end).
    #[pyo3(signature = (num_prompt_tokens, shared_prefix_boundary, num_computed_tokens = 0, num_tokens = 0))]
    fn set_cache_context(
        &mut self,
        num_prompt_tokens: i64,
        shared_prefix_boundary: i64,
        num_computed_tokens: i64,
        num_tokens: i64,
    ) -> PyResult<()> {
        let p = count(num_prompt_tokens, "num_prompt_tokens")?;
        let s = count(shared_prefix_boundary, "shared_prefix_boundary")?;
        let c = count(num_computed_tokens, "num_computed_tokens")?;
        let n = count(num_tokens, "num_tokens")?;
        self.inner.set_cache_context(p, s);
        self.inner.set_cache_computed(c);
        self.inner.set_request_tokens(n);
        Ok(())
    }

    /// Takes ``num_blocks`` free blocks held by no request (``free_blocks`` them).
    fn take_loose(&mut self, num_blocks: i64) -> PyResult<Vec<u32>> {
        let n = count(num_blocks, "num_blocks")?;
        Ok(self.inner.take_loose(n).py()?.iter().map(|b| b.0).collect())
    }

    /// vLLM's ``block_pool.cache_full_blocks`` for group ``group`` over the
    /// caller's ``blocks`` (indices ``start..end``) under the request's
    /// ``hashes``; returns the indices cached.
    fn cache_loose(
        &mut self,
        blocks: Vec<i64>,
        group: i64,
        start: i64,
        end: i64,
        hashes: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<usize>> {
        let ids: Vec<BlockId> =
            blocks.iter().map(|&i| self.inner.check_block(i)).collect::<Result<_, _>>().py()?;
        let (g, s, e) = (count(group, "group")?, count(start, "start")?, count(end, "end")?);
        if s >= e {
            return Ok(Vec::new());
        }
        let l = self.inner.layout();
        if g >= l.len() {
            return Err(invalid(format!("KV cache group {g} out of range")));
        }
        let scale = l.groups()[g].block_size / l.hash_block_size();
        let hi = e.saturating_mul(scale).min(hashes.len()?);
        let hs = read_hashes(hashes, 0, hi)?;
        self.inner.cache_loose(&ids, g, s, e, 0, &hs).py()
    }
}
