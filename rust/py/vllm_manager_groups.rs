//! `_VllmManager`'s calls over several KV cache groups (see
//! [`crate::core::vllm_manager::groups`]): hits, allocation, caching and
//! tables per group, each group's block ids as one int32 numpy array.

use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::arrays::block_ids as read_ids;
use super::errors::{invalid, IntoPyResult};
use super::vllm_manager::{count, group_arrays, read_hashes, runs_out, PyVllmManager, RunOut};
use crate::core::ids::{BlockHash, BlockId};
use crate::core::vllm_manager::SlotRequest;

type Arrays<'py> = Vec<Bound<'py, PyArray1<i32>>>;

impl PyVllmManager {
    /// Per-group hit block lists from Python (None or one sequence per group).
    fn hit_lists(&self, new_computed: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<Vec<BlockId>>> {
        let Some(obj) = new_computed else { return Ok(Vec::new()) };
        let mut out = Vec::new();
        for item in obj.try_iter()? {
            let ids = read_ids(&item?, "new_computed")?;
            out.push(ids.iter().map(|&i| self.inner.check_block(i)).collect::<Result<Vec<_>, _>>().py()?);
        }
        Ok(out)
    }

    /// A lookup's bound and the request hashes it can read: enough for the bound
    /// plus one block of the largest group (the EAGLE margin reads that far; the core
    /// bounds it by the hashes it gets).
    fn lookup_hashes(&self, hashes: &Bound<'_, PyAny>, max_tokens: i64) -> PyResult<(usize, Vec<BlockHash>)> {
        let max_tokens = count(max_tokens, "max_tokens")?;
        let l = self.inner.layout();
        let hbs = l.hash_block_size();
        let max_bs = l.groups().iter().map(|g| g.block_size).max().unwrap_or(hbs);
        let n = hashes.len()?.min(max_tokens.div_ceil(hbs).saturating_add(max_bs / hbs + 1));
        Ok((max_tokens, read_hashes(hashes, 0, n)?))
    }

    /// Caches as [`Self::cache_groups`] and keeps the runs.
    fn cache_into(
        &mut self,
        rid: &str,
        hashes: &Bound<'_, PyAny>,
        num_tokens: usize,
        reprefillable: usize,
    ) -> PyResult<()> {
        self.last_runs.clear();
        let num_hashes = hashes.len()?;
        let plan = self.inner.cache_plan(rid, num_tokens, num_hashes, reprefillable);
        if !plan.is_empty() {
            let (lo, hi) = self.inner.plan_hash_range(&plan);
            let hs = read_hashes(hashes, lo, hi)?;
            self.last_runs = self.inner.cache_apply(rid, &plan, lo, &hs).py()?;
        }
        // After the runs: a run that promoted a block's partial hash lets its tail
        // register again, as vLLM's group does right after its run.
        // Transient Mamba prefill checkpoints lose their keys before any tail registers.
        let evicted = self.inner.mamba_checkpoint_evictions(rid);
        let any_evicted = !evicted.is_empty();
        self.last_runs.extend(evicted);
        let tails = self.inner.tail_plan(rid, num_tokens, num_hashes, reprefillable);
        if !tails.is_empty() {
            let hbs = self.inner.layout().hash_block_size();
            let lo = tails.iter().map(|&(_, t)| t / hbs - 1).min().unwrap_or(0);
            let hi = tails.iter().map(|&(_, t)| t / hbs).max().unwrap_or(0);
            let hs = read_hashes(hashes, lo, hi)?;
            let more = self.inner.cache_tails(rid, &tails, lo, &hs).py()?;
            self.last_runs.extend(more);
        }
        if any_evicted || !tails.is_empty() {
            // vLLM caches group by group: a group's prompt tail right after its run.
            self.last_runs.sort_by_key(|r| r.group);
        }
        Ok(())
    }
}

#[pymethods]
impl PyVllmManager {
    /// Number of KV cache groups.
    #[getter]
    fn num_groups(&self) -> usize {
        self.inner.num_groups()
    }

    /// Tokens per request block hash (the gcd of the group block sizes).
    #[getter]
    fn hash_block_size(&self) -> usize {
        self.inner.layout().hash_block_size()
    }

    /// The scheduler block size (hybrid hits are multiples of it).
    #[getter]
    fn scheduler_block_size(&self) -> usize {
        self.inner.layout().scheduler_block_size()
    }

    /// Each group's block size, in group order.
    #[getter]
    fn group_block_sizes(&self) -> Vec<usize> {
        self.inner.layout().groups().iter().map(|g| g.block_size).collect()
    }

    /// Per group, whether its hits and caching drop the EAGLE block (vLLM's
    /// single-type ``use_eagle``: its spec set's flag), in group order.
    #[getter]
    fn group_eagle_flags(&self) -> Vec<bool> {
        let l = self.inner.layout();
        (0..l.len()).map(|g| l.group_eagle(g)).collect()
    }

    /// The spec sets the hit lookup walks (vLLM's coordinator ``attention_groups``),
    /// full attention first: ``(member group ids, drops the EAGLE block)`` each; groups
    /// that are not prefix-cacheable are in none.
    #[getter]
    fn spec_sets(&self) -> Vec<(Vec<usize>, bool)> {
        self.inner.layout().spec_sets().iter().map(|s| (s.group_ids.clone(), s.use_eagle)).collect()
    }

    /// vLLM's ``find_longest_cache_hit`` over all groups: ``(hit tokens, uncached
    /// common prefix tokens, per-group hit blocks)``; ``hashes`` are the request's
    /// ``block_hashes`` (at :attr:`hash_block_size`).
    fn find_hit_groups<'py>(
        &self,
        py: Python<'py>,
        hashes: &Bound<'py, PyAny>,
        max_tokens: i64,
    ) -> PyResult<(usize, usize, Arrays<'py>)> {
        let (max_tokens, hs) = self.lookup_hashes(hashes, max_tokens)?;
        let h = self.inner.find_hit_groups(&hs, max_tokens);
        Ok((h.hit.tokens, h.hit.uncached_common_prefix, group_arrays(py, &h.blocks)?))
    }

    /// vLLM's ``find_longest_cache_hit_per_group`` (for KV connectors that accept
    /// diverging hybrid hits): ``(per-group hit blocks, per-group hit tokens)`` with each
    /// spec set looked up on its own; a group in no spec set hits nothing.
    fn find_hit_per_group<'py>(
        &self,
        py: Python<'py>,
        hashes: &Bound<'py, PyAny>,
        max_tokens: i64,
    ) -> PyResult<(Arrays<'py>, Vec<usize>)> {
        let (max_tokens, hs) = self.lookup_hashes(hashes, max_tokens)?;
        let (blocks, lens) = self.inner.find_hit_per_group(&hs, max_tokens);
        Ok((group_arrays(py, &blocks)?, lens))
    }

    /// vLLM's coordinator ``get_num_blocks_to_allocate`` (the sum over groups).
    /// ``num_tokens_main_model`` (default ``num_tokens``) is what align-mode Mamba
    /// groups count, ``num_encoder_tokens`` what cross-attention groups count; the
    /// sum may be negative, as in vLLM. ``num_local_computed`` (default
    /// ``total_computed``) is the local hit's length: one ending inside a block
    /// counts the block's copy.
    #[pyo3(signature = (request_id, num_tokens, new_computed, total_computed, apply_admission_cap = false, num_tokens_main_model = None, num_encoder_tokens = 0, num_local_computed = None))]
    #[allow(clippy::too_many_arguments)]
    fn num_blocks_to_allocate_groups(
        &self,
        request_id: &str,
        num_tokens: i64,
        new_computed: Option<&Bound<'_, PyAny>>,
        total_computed: i64,
        apply_admission_cap: bool,
        num_tokens_main_model: Option<i64>,
        num_encoder_tokens: i64,
        num_local_computed: Option<i64>,
    ) -> PyResult<isize> {
        let total = count(total_computed, "total_computed")?;
        let local = num_local_computed.map(|l| count(l, "num_local_computed")).transpose()?.unwrap_or(total);
        let hits = self.hit_lists(new_computed)?;
        let n = count(num_tokens, "num_tokens")?;
        let main = num_tokens_main_model.map(|m| count(m, "num_tokens_main_model")).transpose()?.unwrap_or(n);
        Ok(self.inner.num_blocks_to_allocate_encoder(
            request_id,
            n,
            main,
            count(num_encoder_tokens, "num_encoder_tokens")?,
            &hits,
            (total, local),
            apply_admission_cap,
        ))
    }

    /// vLLM's ``new_step_starts``: forgets the Mamba state blocks cached in the
    /// step that ended.
    fn new_step_starts(&mut self) {
        self.inner.new_step_starts();
    }

    /// vLLM's ``allocate_slots`` over all groups: each group's new block ids, or
    /// None. ``full_sequence_computed`` is the gate's (capped) computed count,
    /// ``processed_tokens`` the position ``remove_skipped_blocks`` runs at first,
    /// ``skip_zeroing`` the groups whose external blocks are not logged as new,
    /// ``num_encoder_tokens`` the slots cross-attention groups hold.
    /// With ``hashes`` and ``cache_tokens`` the caching step follows (as
    /// :meth:`cache_groups`; runs in :attr:`last_cached_runs`).
    #[pyo3(signature = (request_id, new_computed, num_tokens_need_slot, num_local_computed, num_external_computed, full_sequence_tokens, full_sequence_computed, processed_tokens, reserved_blocks, watermark_blocks, adopt, skip_zeroing = Vec::new(), hashes = None, cache_tokens = None, reprefillable = 0, num_tokens_main_model = None, num_encoder_tokens = 0))]
    #[allow(clippy::too_many_arguments)]
    fn allocate_slots_groups<'py>(
        &mut self,
        py: Python<'py>,
        request_id: &str,
        new_computed: Option<&Bound<'py, PyAny>>,
        num_tokens_need_slot: i64,
        num_local_computed: i64,
        num_external_computed: i64,
        full_sequence_tokens: Option<i64>,
        full_sequence_computed: Option<i64>,
        processed_tokens: Option<i64>,
        reserved_blocks: i64,
        watermark_blocks: i64,
        adopt: bool,
        skip_zeroing: Vec<i64>,
        hashes: Option<&Bound<'py, PyAny>>,
        cache_tokens: Option<i64>,
        reprefillable: i64,
        num_tokens_main_model: Option<i64>,
        num_encoder_tokens: i64,
    ) -> PyResult<Option<Arrays<'py>>> {
        let hits = self.hit_lists(new_computed)?;
        let mut mask = 0u64;
        for g in skip_zeroing {
            match u32::try_from(g) {
                Ok(g) if g < 64 => mask |= 1 << g,
                _ => return Err(invalid(format!("skip_zeroing group {g} out of range"))),
            }
        }
        let opt = |v: Option<i64>, what| v.map(|n| count(n, what)).transpose();
        let s = SlotRequest {
            num_tokens_need_slot: count(num_tokens_need_slot, "num_tokens_need_slot")?,
            num_local_computed: count(num_local_computed, "num_local_computed")?,
            num_external_computed: count(num_external_computed, "num_external_computed")?,
            full_sequence_tokens: opt(full_sequence_tokens, "full_sequence_tokens")?,
            reserved_blocks: count(reserved_blocks, "reserved_blocks")?,
            watermark_blocks: count(watermark_blocks, "watermark_blocks")?,
            adopt,
            full_sequence_computed: opt(full_sequence_computed, "full_sequence_computed")?,
            processed_tokens: opt(processed_tokens, "processed_tokens")?,
            skip_zeroing: mask,
            num_tokens_main_model: opt(num_tokens_main_model, "num_tokens_main_model")?,
            num_encoder_tokens: count(num_encoder_tokens, "num_encoder_tokens")?,
        };
        let cache_tokens = opt(cache_tokens, "cache_tokens")?;
        let reprefillable = count(reprefillable, "reprefillable")?;
        self.last_runs.clear();
        let Some(new) = self.inner.allocate_slots_groups(request_id, &hits, &s).py()? else {
            return Ok(None);
        };
        if let (Some(h), Some(n)) = (hashes, cache_tokens) {
            self.cache_into(request_id, h, n, reprefillable)?;
        }
        // No group took a block: one empty array per group.
        let new = if new.is_empty() { vec![Vec::new(); self.inner.num_groups()] } else { new };
        Ok(Some(group_arrays(py, &new)?))
    }

    /// Caches every group's full blocks for ``num_tokens`` computed tokens (less
    /// ``reprefillable``) under the request's ``hashes``, and the prompt tails of
    /// full-attention groups larger than the hash block. Returns the runs ``(group_idx,
    /// start, end, stored table indices, block_size, removed_start, removed_end)``, one
    /// per vLLM ``BlockStored`` event, in vLLM's order; a prompt tail's entry counts in
    /// hash blocks. ``removed_start:removed_end`` are the keys (in the next
    /// :meth:`take_removed_groups`) vLLM reports just before the run's event.
    #[pyo3(signature = (request_id, hashes, num_tokens, reprefillable = 0))]
    fn cache_groups<'py>(
        &mut self,
        py: Python<'py>,
        request_id: &str,
        hashes: &Bound<'py, PyAny>,
        num_tokens: i64,
        reprefillable: i64,
    ) -> PyResult<Vec<RunOut<'py>>> {
        let n = count(num_tokens, "num_tokens")?;
        self.cache_into(request_id, hashes, n, count(reprefillable, "reprefillable")?)?;
        runs_out(py, &self.last_runs)
    }

    /// The runs the last ``allocate_slots_groups`` / ``cache_groups`` call cached.
    #[getter]
    fn last_cached_runs<'py>(&self, py: Python<'py>) -> PyResult<Vec<RunOut<'py>>> {
        runs_out(py, &self.last_runs)
    }

    /// vLLM's ``remove_skipped_blocks``: frees and nulls each group's blocks that
    /// fell out of its window for ``processed_tokens`` computed tokens.
    fn remove_skipped_blocks(&mut self, request_id: &str, processed_tokens: i64) -> PyResult<()> {
        let p = count(processed_tokens, "processed_tokens")?;
        self.inner.remove_skipped_blocks(request_id, p);
        Ok(())
    }

    /// Each group's table of the request.
    fn group_blocks<'py>(&self, py: Python<'py>, request_id: &str) -> PyResult<Arrays<'py>> {
        let tables: Vec<Vec<BlockId>> =
            (0..self.inner.num_groups()).map(|g| self.inner.group_blocks(request_id, g).to_vec()).collect();
        group_arrays(py, &tables)
    }

    /// vLLM's ``estimate_cached_tokens``: the fewest tokens any prefix-cacheable
    /// group's table (cross-attention aside) holds a cached block for; 0 for an
    /// unknown request.
    fn estimate_cached_tokens(&self, request_id: &str) -> usize {
        self.inner.estimate_cached_tokens(request_id)
    }

    /// Each group's ``num_cached_block`` entry of the request.
    fn num_cached_groups(&self, request_id: &str) -> Vec<Option<usize>> {
        (0..self.inner.num_groups()).map(|g| self.inner.group_num_cached(request_id, g)).collect()
    }

    /// Whether some group registers partial-block prefix entries for prompt tails
    /// (a full-attention group larger than the hash block, or an align-mode Mamba
    /// group under partial hash hits): the caller then gives the prompt length to
    /// :meth:`set_cache_context` before each caching call.
    #[getter]
    fn registers_prompt_tails(&self) -> bool {
        self.inner.registers_prompt_tails()
    }

    /// The partial-block prefix entries blocks hold beside their own hash:
    /// ``(hash, group, block id)``, by block id.
    fn extra_keys<'py>(&self, py: Python<'py>) -> Vec<(Bound<'py, PyBytes>, usize, u32)> {
        self.inner.extra_keys().iter().map(|(h, g, b)| (PyBytes::new(py, h.as_bytes()), *g, b.0)).collect()
    }

    /// Starts (``True``) or stops the log of what vLLM's KV cache metrics collector
    /// hears (see :meth:`take_metrics`).
    fn log_metrics(&mut self, on: bool) {
        self.inner.log_metrics(on);
    }

    /// Drains the metrics log: ``(block id, event)`` in call order; event 0: an
    /// allocation handed it out (``on_block_allocated``, after ``on_block_evicted`` with
    /// prefix caching), 1: a hit adopted it (``on_block_accessed``), 2: its hashes were
    /// dropped in place (``on_block_evicted``).
    fn take_metrics(&mut self) -> Vec<(u32, u8)> {
        use crate::core::vllm_manager::metrics::MetricEvent;
        let code = |e: MetricEvent| match e {
            MetricEvent::Allocated => 0,
            MetricEvent::Accessed => 1,
            MetricEvent::Evicted => 2,
        };
        self.inner.take_metrics().into_iter().map(|(b, e)| (b.0, code(e))).collect()
    }

    /// Drains the hashes dropped since the last call with their group, in order.
    fn take_removed_groups<'py>(&mut self, py: Python<'py>) -> Vec<(Bound<'py, PyBytes>, usize)> {
        self.inner.take_removed_groups().iter().map(|(h, g)| (PyBytes::new(py, h.as_bytes()), *g)).collect()
    }
}
