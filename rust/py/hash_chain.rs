//! `HashChainCache`: the Python face of [`core::hash_chain::HashChainCache`].
//!
//! Threading: the class is owned by one scheduler thread. Methods take
//! `&mut self` and never release the GIL (they run for microseconds), so on a
//! GIL build concurrent callers are serialised; on a free-threaded build a
//! second concurrent caller gets `RuntimeError` (already borrowed), never
//! corruption.
// `unsafe` here only reads token arrays in place (`arrays::tokens`); each
// use states why no Python code runs while the view lives.
#![allow(unsafe_code)]

use numpy::{PyArray1, PyArray2, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use super::arrays::{self, with_tokens};
use super::common;
use super::errors::{inv_to_py, invalid, IntoPyResult};
use super::{events, keys};
use crate::core::hash::{HashAlgo, Token};
use crate::core::hash_chain as core;
use crate::core::ids::{BlockId, RequestId};
use crate::core::tables::TableSource;

fn check_block_id(inner: &core::HashChainCache, block_id: i64) -> PyResult<BlockId> {
    if block_id < 0 || block_id >= inner.pool().num_blocks() as i64 {
        return Err(invalid(format!("block id {block_id} out of range 0..{}", inner.pool().num_blocks())));
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(BlockId(block_id as u32))
}

/// Block-hash-chain prefix cache over a ref-counted block pool (vLLM semantics).
#[pyclass(module = "kvindex._core", name = "HashChainCache")]
pub struct PyHashChainCache {
    inner: core::HashChainCache,
}

#[pymethods]
impl PyHashChainCache {
    #[new]
    #[pyo3(signature = (num_blocks, block_size, *, algo = "xxh3_128", seed = None, enable_events = false))]
    fn new(
        num_blocks: i64,
        block_size: i64,
        algo: &str,
        seed: Option<String>,
        enable_events: bool,
    ) -> PyResult<Self> {
        let algo = HashAlgo::parse(algo).py()?;
        let nb = usize::try_from(num_blocks)
            .map_err(|_| invalid(format!("num_blocks must be >= 2, got {num_blocks}")))?;
        let bs = usize::try_from(block_size)
            .map_err(|_| invalid(format!("block_size must be >= 1, got {block_size}")))?;
        Ok(PyHashChainCache {
            inner: core::HashChainCache::new(nb, bs, algo, seed.as_deref(), enable_events).py()?,
        })
    }

    #[getter]
    fn num_blocks(&self) -> usize {
        self.inner.pool().num_blocks()
    }

    #[getter]
    fn block_size(&self) -> usize {
        self.inner.block_size()
    }

    #[getter]
    fn algo(&self) -> &'static str {
        self.inner.algo().name()
    }

    #[getter]
    fn num_free_blocks(&self) -> usize {
        self.inner.pool().num_free()
    }

    #[getter]
    fn usage(&self) -> f64 {
        self.inner.pool().usage()
    }

    #[getter]
    fn num_requests(&self) -> usize {
        self.inner.num_requests()
    }

    #[getter]
    fn num_cached_blocks(&self) -> usize {
        self.inner.pool().num_cached_hashes()
    }

    fn __contains__(&self, request_id: &Bound<'_, PyAny>) -> PyResult<bool> {
        let id = arrays::id(request_id, "request_id")?;
        Ok(self.inner.num_tokens(RequestId(id)).is_ok())
    }

    #[pyo3(signature = (request_id, tokens, *, cache_salt = None, lora = None, mm_items = None, skip_reading = false))]
    #[allow(clippy::too_many_arguments)]
    fn admit<'py>(
        &mut self,
        py: Python<'py>,
        request_id: &Bound<'py, PyAny>,
        tokens: &Bound<'py, PyAny>,
        cache_salt: Option<String>,
        lora: Option<&Bound<'py, PyAny>>,
        mm_items: Option<&Bound<'py, PyAny>>,
        skip_reading: bool,
    ) -> PyResult<Option<common::Admission>> {
        let id = RequestId(arrays::id(request_id, "request_id")?);
        let spec = keys::spec(cache_salt, lora, mm_items)?;
        // SAFETY: read after every argument that may run Python code; only
        // Rust runs while the view lives.
        let arr = unsafe { arrays::tokens(tokens, "tokens") }?;
        let hit = with_tokens!(arr, s => self.inner.admit(id, s, spec, skip_reading)).py()?;
        let Some(hit) = hit else { return Ok(None) };
        let blocks = self.inner.blocks(id).py()?;
        Ok(Some(common::Admission::new(py, hit, blocks)))
    }

    #[pyo3(signature = (tokens, *, cache_salt = None, lora = None, mm_items = None))]
    fn lookup<'py>(
        &mut self,
        tokens: &Bound<'py, PyAny>,
        cache_salt: Option<String>,
        lora: Option<&Bound<'py, PyAny>>,
        mm_items: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<usize> {
        let spec = keys::spec(cache_salt, lora, mm_items)?;
        // SAFETY: read after every argument that may run Python code; only
        // Rust runs while the view lives.
        let arr = unsafe { arrays::tokens(tokens, "tokens") }?;
        with_tokens!(arr, s => self.inner.lookup(s, &spec)).py()
    }

    fn append(&mut self, request_id: &Bound<'_, PyAny>, tokens: &Bound<'_, PyAny>) -> PyResult<bool> {
        let id = RequestId(arrays::id(request_id, "request_id")?);
        // SAFETY: read after every argument that may run Python code; only
        // Rust runs while the view lives.
        let arr = unsafe { arrays::tokens(tokens, "tokens") }?;
        with_tokens!(arr, s => self.inner.append(id, s)).py()
    }

    #[pyo3(signature = (request_ids, tokens, offsets = None))]
    fn append_batch(
        &mut self,
        request_ids: &Bound<'_, PyAny>,
        tokens: &Bound<'_, PyAny>,
        offsets: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let ids = arrays::ids(request_ids, "request_ids")?;
        let off = offsets.filter(|o| !o.is_none()).map(|o| arrays::int64(o, "offsets")).transpose()?;
        let off_slice = off.as_ref().map(|o| o.as_slice().expect("contiguity checked"));
        // SAFETY: read after every argument that may run Python code; only
        // Rust runs while the view lives.
        let arr = unsafe { arrays::tokens(tokens, "tokens") }?;
        with_tokens!(arr, s => self.inner.append_batch(&ids, s, off_slice)).py()
    }

    fn free(&mut self, request_id: &Bound<'_, PyAny>) -> PyResult<()> {
        let id = RequestId(arrays::id(request_id, "request_id")?);
        self.inner.free(id).py()
    }

    fn free_batch(&mut self, request_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        let ids = arrays::ids(request_ids, "request_ids")?;
        self.inner.free_batch(&ids).py()
    }

    fn evict_blocks(&mut self, block_ids: &Bound<'_, PyAny>) -> PyResult<usize> {
        // SAFETY: the view is copied out at once; the fallback runs Python
        // code only after the view is gone (the read failed).
        let ids: Vec<i64> = match unsafe { arrays::tokens(block_ids, "block_ids") } {
            Ok(arr) => with_tokens!(arr, s => s.iter().map(|&x| x.get()).collect()),
            Err(e) => block_ids.extract::<Vec<i64>>().map_err(|_| e)?,
        };
        self.inner.evict_blocks(&ids).py()
    }

    fn reset(&mut self) -> PyResult<()> {
        self.inner.reset().py()
    }

    fn take_events<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        events::to_list(py, self.inner.take_events())
    }

    #[getter]
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        common::stats_dict(py, self.inner.stats())
    }

    fn take_stats<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        common::stats_dict(py, self.inner.take_stats())
    }

    #[pyo3(signature = (request_ids, max_blocks = None, out = None))]
    fn block_tables<'py>(
        &self,
        py: Python<'py>,
        request_ids: &Bound<'py, PyAny>,
        max_blocks: Option<i64>,
        out: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyArray2<i32>>> {
        common::block_tables(py, &self.inner, self.inner.pool().num_blocks(), request_ids, max_blocks, out)
    }

    fn slot_mapping<'py>(
        &self,
        py: Python<'py>,
        request_ids: &Bound<'py, PyAny>,
        query_lens: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<i64>>> {
        common::slot_mapping(py, &self.inner, request_ids, query_lens)
    }

    fn num_tokens(&self, request_id: &Bound<'_, PyAny>) -> PyResult<usize> {
        self.inner.num_tokens(RequestId(arrays::id(request_id, "request_id")?)).py()
    }

    fn request_blocks<'py>(
        &self,
        py: Python<'py>,
        request_id: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<i32>>> {
        let blocks = self.inner.blocks(RequestId(arrays::id(request_id, "request_id")?)).py()?;
        Ok(common::block_ids_array(py, blocks))
    }

    fn request_block_hashes<'py>(
        &self,
        py: Python<'py>,
        request_id: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let hs = self.inner.request_hashes(RequestId(arrays::id(request_id, "request_id")?)).py()?;
        let d = self.inner.algo().digest_len();
        let bytes: Vec<u8> = hs.iter().flat_map(|h| h.as_bytes().iter().copied()).collect();
        Ok(PyArray1::from_vec(py, bytes).reshape([hs.len(), d])?.into_any())
    }

    fn free_queue<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i32>> {
        let v: Vec<BlockId> = self.inner.pool().free_queue().collect();
        common::block_ids_array(py, &v)
    }

    fn block_hash<'py>(&self, py: Python<'py>, block_id: i64) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let b = check_block_id(&self.inner, block_id)?;
        Ok(self.inner.pool().block_hash(b).map(|h| PyBytes::new(py, h.as_bytes())))
    }

    fn ref_count(&self, block_id: i64) -> PyResult<u32> {
        let b = check_block_id(&self.inner, block_id)?;
        Ok(self.inner.pool().ref_count(b))
    }

    #[getter]
    fn num_common_prefix_blocks(&self) -> usize {
        self.inner.num_common_prefix_blocks()
    }

    fn check_invariants(&self) -> PyResult<()> {
        self.inner.check_invariants().map_err(inv_to_py)
    }

    fn __repr__(&self) -> String {
        format!(
            "HashChainCache(num_blocks={}, block_size={}, algo={:?}, free={}, requests={})",
            self.inner.pool().num_blocks(),
            self.inner.block_size(),
            self.inner.algo().name(),
            self.inner.pool().num_free(),
            self.inner.num_requests()
        )
    }
}

impl events::EventSource for PyHashChainCache {
    fn drain_events(&mut self) -> Vec<crate::core::events::KvEvent> {
        self.inner.take_events()
    }
}
