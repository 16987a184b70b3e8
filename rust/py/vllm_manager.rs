//! `_VllmManager`: the Python face of [`core::vllm_manager::VllmManager`],
//! the state behind `kvindex.integrations.vllm.KVCacheManager` (private: that
//! class is the public API). Request ids are vLLM's strings; block hashes
//! are read from the request's own `block_hashes` list (``bytes`` items),
//! only the ones a call needs.
//!
//! A manager built with ``groups`` holds several KV cache groups: the
//! ``*_groups`` calls answer for all of them (per-group block ids come back
//! as one int32 numpy array per group, 0 being the null block); the
//! one-group calls (``find_hit``, ``allocate_slots``, ``cache``,
//! ``num_blocks_to_allocate``) then raise.

use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use super::arrays::i32_array;
use super::errors::{invalid, IntoPyResult};
use crate::core::groups::spec::{GroupLayout, LayoutOptions};
use crate::core::ids::{BlockHash, BlockId, MAX_DIGEST_LEN};
use crate::core::vllm_manager::groups::CachedRun;
use crate::core::vllm_manager::{self as core, SlotRequest};

/// Per-group block ids as int32 arrays.
pub(super) fn group_arrays<'py>(
    py: Python<'py>,
    groups: &[Vec<BlockId>],
) -> PyResult<Vec<Bound<'py, PyArray1<i32>>>> {
    #[allow(clippy::cast_possible_wrap)]
    groups.iter().map(|g| i32_array(py, g.iter().map(|b| b.0 as i32))).collect()
}

/// A cached run as Python gets it.
pub(super) type RunOut<'py> = (usize, usize, usize, Bound<'py, PyArray1<i32>>, usize, usize, usize);

pub(super) fn runs_out<'py>(py: Python<'py>, runs: &[CachedRun]) -> PyResult<Vec<RunOut<'py>>> {
    #[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
    runs.iter()
        .map(|r| {
            let stored = i32_array(py, r.stored.iter().map(|i| i as i32))?;
            Ok((r.group, r.start, r.end, stored, r.block_size, r.removed.0, r.removed.1))
        })
        .collect()
}

/// A non-negative count, or `InvalidArgumentError`.
pub(super) fn count(v: i64, what: &str) -> PyResult<usize> {
    usize::try_from(v).map_err(|_| invalid(format!("{what} must be >= 0, got {v}")))
}

/// Block ids (ints) as the core's ids, range-checked.
fn block_ids(m: &core::VllmManager, ids: &[i64]) -> PyResult<Vec<BlockId>> {
    ids.iter().map(|&i| m.check_block(i).py()).collect()
}

/// Items `start..end` of a sequence of ``bytes`` hashes.
pub(super) fn read_hashes(seq: &Bound<'_, PyAny>, start: usize, end: usize) -> PyResult<Vec<BlockHash>> {
    let mut out = Vec::with_capacity(end.saturating_sub(start));
    let list = seq.cast::<PyList>().ok();
    for i in start..end {
        let item = match &list {
            Some(l) => l.get_item(i)?,
            None => seq.get_item(i)?,
        };
        let Ok(b) = item.cast::<PyBytes>() else {
            return Err(invalid(format!("block hash {i} is not bytes")));
        };
        let d = b.as_bytes();
        if d.len() > MAX_DIGEST_LEN {
            return Err(invalid(format!("block hash {i} is {} bytes, more than {MAX_DIGEST_LEN}", d.len())));
        }
        out.push(BlockHash::from_digest(d));
    }
    Ok(out)
}

fn ids_out(v: &[BlockId]) -> Vec<u32> {
    v.iter().map(|b| b.0).collect()
}

/// vLLM 0.33's block manager (one or several KV cache groups) over kvindex's block pool.
#[pyclass(module = "kvindex._core", name = "_VllmManager")]
pub struct PyVllmManager {
    pub(super) inner: core::VllmManager,
    last_run: Option<(usize, usize)>,
    pub(super) last_runs: Vec<CachedRun>,
}

impl PyVllmManager {
    /// `allocate_slots` for one group, then (with `caching`: the request's hashes and
    /// the tokens to cache up to) its caching step: the new blocks and the table's
    /// `(length, cached blocks)` after both, or None (nothing changed).
    pub(super) fn allocate_then_cache(
        &mut self,
        request_id: &str,
        new_computed: &[BlockId],
        s: &SlotRequest,
        caching: Option<(&Bound<'_, PyAny>, i64)>,
    ) -> PyResult<Option<(Vec<BlockId>, usize, usize)>> {
        self.one_group("allocate_slots")?;
        self.last_run = None;
        let Some(new) = self.inner.allocate_slots(request_id, new_computed, s).py()? else {
            return Ok(None);
        };
        if let Some((h, n)) = caching {
            self.cache(request_id, h, n)?;
        }
        let (held, cached) = self.table_state(request_id).unwrap_or((0, 0));
        Ok(Some((new, held, cached)))
    }

    /// Refuses a one-group call on a manager with several groups.
    fn one_group(&self, call: &str) -> PyResult<()> {
        if self.inner.num_groups() == 1 {
            Ok(())
        } else {
            Err(invalid(format!(
                "{call} is a one-group call; this manager has several groups: use {call}_groups"
            )))
        }
    }
}

#[pymethods]
impl PyVllmManager {
    #[new]
    #[pyo3(signature = (num_blocks, block_size, *, enable_caching = true, log_removed = false, log_new = false, groups = None, hash_block_size = None, use_eagle = false, max_in_flight_tokens = None, max_model_len = None, allow_partial_hash_hits = false, eagle_groups = None, spec_classes = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        num_blocks: i64,
        block_size: i64,
        enable_caching: bool,
        log_removed: bool,
        log_new: bool,
        groups: Option<&Bound<'_, PyAny>>,
        hash_block_size: Option<i64>,
        use_eagle: bool,
        max_in_flight_tokens: Option<i64>,
        max_model_len: Option<i64>,
        allow_partial_hash_hits: bool,
        eagle_groups: Option<Vec<bool>>,
        spec_classes: Option<Vec<u32>>,
    ) -> PyResult<Self> {
        let num_blocks = count(num_blocks, "num_blocks")?;
        let block_size = count(block_size, "block_size")?;
        let Some(groups) = groups else {
            if hash_block_size.is_some()
                || use_eagle
                || max_in_flight_tokens.is_some()
                || max_model_len.is_some()
                || eagle_groups.is_some()
                || spec_classes.is_some()
            {
                return Err(invalid(
                    "hash_block_size, use_eagle, eagle_groups, spec_classes and the admission sizes need groups".to_owned(),
                ));
            }
            let inner =
                core::VllmManager::new(num_blocks, block_size, enable_caching, log_removed, log_new).py()?;
            return Ok(PyVllmManager { inner, last_run: None, last_runs: Vec::new() });
        };
        let specs = super::groups::group_specs(groups)?;
        let opt = LayoutOptions {
            enable_caching,
            hash_block_size: hash_block_size.map(|h| count(h, "hash_block_size")).transpose()?,
            scheduler_block_size: Some(block_size),
            use_eagle,
            allow_partial_hash_hits,
        };
        let mut layout = GroupLayout::new(specs, opt).py()?;
        if let Some(classes) = spec_classes {
            layout = layout.with_spec_classes(&classes).py()?;
        }
        if let Some(flags) = eagle_groups {
            layout = layout.with_eagle_groups(&flags).py()?;
        }
        let admission = match (max_in_flight_tokens, max_model_len) {
            (Some(f), Some(m)) => Some((count(f, "max_in_flight_tokens")?, count(m, "max_model_len")?)),
            (None, None) => None,
            _ => return Err(invalid("max_in_flight_tokens and max_model_len go together".to_owned())),
        };
        let inner =
            core::VllmManager::with_layout(num_blocks, layout, log_removed, log_new, admission).py()?;
        Ok(PyVllmManager { inner, last_run: None, last_runs: Vec::new() })
    }

    /// Blocks in the pool, the null block 0 included.
    #[getter]
    fn num_blocks(&self) -> usize {
        self.inner.pool().num_blocks()
    }

    /// Tokens per block.
    #[getter]
    fn block_size(&self) -> usize {
        self.inner.block_size()
    }

    /// Free blocks (idle cached ones included).
    #[getter]
    fn num_free_blocks(&self) -> usize {
        self.inner.pool().num_free()
    }

    /// ``1 - free / (num_blocks - 1)``.
    #[getter]
    fn usage(&self) -> f64 {
        self.inner.pool().usage()
    }

    /// Distinct cached hashes.
    #[getter]
    fn num_cached_hashes(&self) -> usize {
        self.inner.num_cached_keys()
    }

    /// The longest cached run of ``hashes[:max_blocks]``; its last block dropped with
    /// ``drop_last`` (EAGLE).
    fn find_hit(&self, hashes: &Bound<'_, PyAny>, max_blocks: i64, drop_last: bool) -> PyResult<Vec<u32>> {
        self.one_group("find_hit")?;
        let n = hashes.len()?.min(usize::try_from(max_blocks).unwrap_or(0));
        let hs = read_hashes(hashes, 0, n)?;
        Ok(ids_out(&self.inner.find_hit(&hs, n, drop_last)))
    }

    /// vLLM's ``get_num_blocks_to_allocate``.
    fn num_blocks_to_allocate(
        &self,
        request_id: &str,
        num_tokens: i64,
        new_computed: Vec<i64>,
    ) -> PyResult<usize> {
        self.one_group("num_blocks_to_allocate")?;
        let nc = block_ids(&self.inner, &new_computed)?;
        Ok(self.inner.num_blocks_to_allocate(request_id, count(num_tokens, "num_tokens")?, &nc))
    }

    /// vLLM's ``allocate_slots``: ``(new block ids, table length, cached blocks)``
    /// (the last two as :meth:`table_state` would give them next), or None (nothing
    /// changed).
    ///
    /// With ``hashes`` and ``cache_tokens``, the caching step follows in the same call
    /// (as :meth:`cache`; its run is :attr:`last_cached_run`).
    #[pyo3(signature = (request_id, new_computed, num_tokens_need_slot, num_local_computed, num_external_computed, full_sequence_tokens, reserved_blocks, watermark_blocks, adopt, hashes = None, cache_tokens = None))]
    #[allow(clippy::too_many_arguments)]
    fn allocate_slots(
        &mut self,
        request_id: &str,
        new_computed: Vec<i64>,
        num_tokens_need_slot: i64,
        num_local_computed: i64,
        num_external_computed: i64,
        full_sequence_tokens: Option<i64>,
        reserved_blocks: i64,
        watermark_blocks: i64,
        adopt: bool,
        hashes: Option<&Bound<'_, PyAny>>,
        cache_tokens: Option<i64>,
    ) -> PyResult<Option<(Vec<u32>, usize, usize)>> {
        self.one_group("allocate_slots")?;
        let nc = block_ids(&self.inner, &new_computed)?;
        let s = SlotRequest {
            num_tokens_need_slot: count(num_tokens_need_slot, "num_tokens_need_slot")?,
            num_local_computed: count(num_local_computed, "num_local_computed")?,
            num_external_computed: count(num_external_computed, "num_external_computed")?,
            full_sequence_tokens: full_sequence_tokens
                .map(|n| count(n, "full_sequence_tokens"))
                .transpose()?,
            reserved_blocks: count(reserved_blocks, "reserved_blocks")?,
            watermark_blocks: count(watermark_blocks, "watermark_blocks")?,
            adopt,
            ..SlotRequest::default()
        };
        let cache_tokens = cache_tokens.map(|n| count(n, "cache_tokens")).transpose()?;
        let caching = hashes.zip(cache_tokens.map(|n| i64::try_from(n).unwrap_or(i64::MAX)));
        Ok(self
            .allocate_then_cache(request_id, &nc, &s, caching)?
            .map(|(new, held, cached)| (ids_out(&new), held, cached)))
    }

    /// The run ``(start, end)`` the last ``allocate_slots`` / ``cache`` call cached,
    /// or None.
    #[getter]
    fn last_cached_run(&self) -> Option<(usize, usize)> {
        self.last_run
    }

    /// Caches the request's full blocks up to ``num_tokens`` under ``hashes`` (its
    /// ``block_hashes``; only the new ones are read). Returns the cached run
    /// ``(start, end)`` in blocks, or None when nothing was cached.
    pub(super) fn cache(
        &mut self,
        request_id: &str,
        hashes: &Bound<'_, PyAny>,
        num_tokens: i64,
    ) -> PyResult<Option<(usize, usize)>> {
        self.one_group("cache")?;
        let n = count(num_tokens, "num_tokens")?;
        self.last_run = None;
        let Some((start, end)) = self.inner.cache_range(request_id, n, hashes.len()?) else {
            return Ok(None);
        };
        let hs = read_hashes(hashes, start, end)?;
        self.inner.cache_run(request_id, start, &hs).py()?;
        self.last_run = Some((start, end));
        Ok(Some((start, end)))
    }

    /// vLLM's ``num_cached_block`` entry (None: none).
    fn num_cached(&self, request_id: &str) -> Option<usize> {
        self.inner.num_cached(request_id)
    }

    /// Ids of the requests holding a table (``cached_only``: those with a cached count).
    #[pyo3(signature = (cached_only = false))]
    fn request_ids(&self, cached_only: bool) -> Vec<String> {
        self.inner.request_ids(cached_only).into_iter().map(str::to_owned).collect()
    }

    /// Whether the request holds a block table.
    fn has_request(&self, request_id: &str) -> bool {
        self.inner.has_request(request_id)
    }

    /// The request's block table.
    fn blocks(&self, request_id: &str) -> Vec<u32> {
        ids_out(self.inner.blocks(request_id))
    }

    /// The request's table length.
    fn num_request_blocks(&self, request_id: &str) -> usize {
        self.inner.blocks(request_id).len()
    }

    /// ``(table length, cached blocks)`` of the request (its ``num_cached_block`` entry,
    /// 0 when it has none), or None when it holds no table.
    fn table_state(&self, request_id: &str) -> Option<(usize, usize)> {
        self.inner.table_state(request_id).map(|(held, cached)| (held, cached.unwrap_or(0)))
    }

    /// Pops the request's tables without freeing them (each group's without its
    /// leading null blocks, in group order).
    fn pop_blocks(&mut self, request_id: &str) -> Vec<u32> {
        ids_out(&self.inner.pop_blocks(request_id))
    }

    /// Frees the request's blocks: each group's table in reverse order, group 0 first.
    fn free(&mut self, request_id: &str) {
        self.inner.free(request_id);
    }

    /// Releases one reference on each block, in order (null blocks skipped).
    fn free_blocks(&mut self, ordered: Vec<i64>) -> PyResult<()> {
        let ids = block_ids(&self.inner, &ordered)?;
        self.inner.free_blocks(&ids).py()
    }

    /// Takes one reference on each block (null blocks skipped).
    fn touch(&mut self, ids: Vec<i64>) -> PyResult<()> {
        self.inner.touch(&ids).py()
    }

    /// Drops the hashes of blocks (held or not); returns how many had one.
    fn evict_blocks(&mut self, ids: Vec<i64>) -> PyResult<usize> {
        self.inner.evict_blocks(&ids).py()
    }

    /// Drops every cached hash; False (nothing changed) while blocks are held.
    fn reset(&mut self) -> bool {
        self.inner.reset()
    }

    /// Drains the hashes dropped since the last call, in order.
    fn take_removed<'py>(&mut self, py: Python<'py>) -> Vec<Bound<'py, PyBytes>> {
        self.inner.take_removed().iter().map(|h| PyBytes::new(py, h.as_bytes())).collect()
    }

    /// Drains the block ids allocated since the last call.
    fn take_new_ids(&mut self) -> Vec<u32> {
        ids_out(&self.inner.take_new_ids())
    }

    /// Logs the request's blocks from table index ``start`` as new (for zeroing).
    fn record_for_zeroing(&mut self, request_id: &str, start: i64) -> PyResult<()> {
        let s = count(start, "start")?;
        self.inner.record_for_zeroing(request_id, s);
        Ok(())
    }

    /// The free queue, head (next handed out) first.
    fn free_queue(&self) -> Vec<u32> {
        self.inner.pool().free_queue().map(|b| b.0).collect()
    }

    /// References on a block.
    fn ref_count(&self, block_id: i64) -> PyResult<u32> {
        let b = self.inner.check_block(block_id).py()?;
        Ok(self.inner.pool().ref_count(b))
    }

    /// The block's cached hash (vLLM's, without its group), or None.
    fn block_hash<'py>(&self, py: Python<'py>, block_id: i64) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let b = self.inner.check_block(block_id).py()?;
        Ok(self.inner.vllm_hash(b).map(|h| PyBytes::new(py, h.as_bytes())))
    }

    /// The group the block's cached hash belongs to, or None without a hash.
    fn block_group(&self, block_id: i64) -> PyResult<Option<usize>> {
        let b = self.inner.check_block(block_id).py()?;
        Ok(self.inner.pool().block_hash(b).map(|_| self.inner.block_group(b)))
    }

    /// Tokens the block's hash covers (None without a hash).
    fn hash_tokens(&self, block_id: i64) -> PyResult<Option<usize>> {
        let b = self.inner.check_block(block_id).py()?;
        Ok(self.inner.pool().block_hash(b).map(|_| self.inner.hash_tokens(b)))
    }

    /// The first block cached for ``group`` under ``block_hash``, or None.
    #[pyo3(signature = (block_hash, group = 0))]
    fn cached_block(&self, block_hash: &Bound<'_, PyBytes>, group: usize) -> PyResult<Option<u32>> {
        let d = block_hash.as_bytes();
        if d.len() > MAX_DIGEST_LEN || group >= self.inner.num_groups() {
            return Ok(None);
        }
        Ok(self.inner.cached_block_of(&BlockHash::from_digest(d), group).map(|b| b.0))
    }

    /// Whether the block is cached for ``group`` under ``block_hash`` (its own hash or a
    /// partial-block prefix entry).
    fn holds_key(&self, block_hash: &Bound<'_, PyBytes>, group: usize, block_id: i64) -> PyResult<bool> {
        let b = self.inner.check_block(block_id).py()?;
        let d = block_hash.as_bytes();
        if d.len() > MAX_DIGEST_LEN || group >= self.inner.num_groups() {
            return Ok(false);
        }
        Ok(self.inner.holds_key(&BlockHash::from_digest(d), group, b))
    }

    /// Gives the block back an entry :meth:`pop_cached_key` dropped, without reporting
    /// it: its own hash covering ``tokens`` tokens (``own``) or a partial-block prefix
    /// entry; False (nothing changed) where the block cannot hold it.
    fn restore_cached_key(
        &mut self,
        block_hash: &Bound<'_, PyBytes>,
        group: usize,
        block_id: i64,
        own: bool,
        tokens: i64,
    ) -> PyResult<bool> {
        let b = self.inner.check_block(block_id).py()?;
        let t = count(tokens, "tokens")?;
        let d = block_hash.as_bytes();
        if d.len() > MAX_DIGEST_LEN || group >= self.inner.num_groups() {
            return Ok(false);
        }
        Ok(self.inner.restore_cached_key(&BlockHash::from_digest(d), group, b, own, t))
    }

    /// Drops the block's entry for ``group`` under ``block_hash`` without reporting it
    /// (vLLM's ``cached_block_hash_to_block.pop(key, block_id)``); whether it had one.
    fn pop_cached_key(
        &mut self,
        block_hash: &Bound<'_, PyBytes>,
        group: usize,
        block_id: i64,
    ) -> PyResult<bool> {
        let b = self.inner.check_block(block_id).py()?;
        let d = block_hash.as_bytes();
        if d.len() > MAX_DIGEST_LEN || group >= self.inner.num_groups() {
            return Ok(false);
        }
        Ok(self.inner.pop_cached_key(&BlockHash::from_digest(d), group, b))
    }

    /// Raises ``InvariantViolation`` if the pool's or the tables' invariants are broken.
    fn check_invariants(&self) -> PyResult<()> {
        self.inner.check_invariants().map_err(super::errors::inv_to_py)
    }
}
