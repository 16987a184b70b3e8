//! `RadixCache` (the tree) and `RadixPrefixCache` (the request-level cache):
//! the Python faces of [`crate::core::radix::RadixTree`] and
//! [`crate::core::radix_cache::RadixPrefixCache`].
//!
//! Threading: both classes are owned by one scheduler thread. Methods take
//! `&mut self` and never release the GIL (they run for microseconds); on a
//! free-threaded build a concurrent second caller gets `RuntimeError`
//! (already borrowed), never corruption.
//!
//! Slots and pages: the core tree stores one value per page (the slot when
//! `page_size == 1`, else the page id `slot // page_size`). This layer turns
//! the caller's per-token slots into pages (with `page_size > 1` each page's
//! slots must be a page-aligned run: `slot % page_size == 0` for the first,
//! then consecutive) and pages back into per-token slots.
// `unsafe` here only reads token arrays in place (`arrays::tokens`); each
// use states why no Python code runs while the view lives.
#![allow(unsafe_code)]

use std::borrow::Cow;

use numpy::{PyArray1, PyArray2};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use super::arrays::{self, TokenArray};
use super::common;
use super::errors::{inv_to_py, invalid, IntoPyResult};
use super::{events, keys};
use crate::core::ids::{PageId, RequestId};
use crate::core::pages::{pages_to_slots, slots_to_pages, PageMath};
use crate::core::radix::{NodeHandle, Policy, RadixTree};
use crate::core::radix_cache::{narrow_tokens, RadixPrefixCache};
use crate::core::tables::TableSource;

/// Reads a token array as int32 (int64 input is narrowed, with a range check).
///
/// # Safety
/// As [`arrays::tokens`]: no Python code may run while the result is alive.
unsafe fn tokens_i32<'a>(obj: &'a Bound<'_, PyAny>, what: &str) -> PyResult<Cow<'a, [i32]>> {
    // SAFETY: forwarded to our caller.
    match unsafe { arrays::tokens(obj, what) }? {
        TokenArray::I32(a) => Ok(Cow::Borrowed(a)),
        TokenArray::I64(a) => Ok(Cow::Owned(narrow_tokens(a).py()?)),
    }
}

/// Reads caller slots as int32 values (signs are checked with the page runs,
/// by [`slots_to_pages`]).
///
/// # Safety
/// As [`arrays::tokens`].
unsafe fn slots_i32<'a>(obj: &'a Bound<'_, PyAny>) -> PyResult<Cow<'a, [i32]>> {
    // SAFETY: forwarded to our caller.
    match unsafe { arrays::tokens(obj, "slots") }? {
        TokenArray::I32(a) => Ok(Cow::Borrowed(a)),
        TokenArray::I64(a) => {
            narrow_tokens(a).map(Cow::Owned).map_err(|_| invalid("slots must fit in int32"))
        }
    }
}

/// The per-token slots of `pages` as a new int32 array.
fn slot_array<'py>(py: Python<'py>, pages: &[PageId], ps: usize) -> Bound<'py, PyArray1<i32>> {
    arrays::filled_i32(py, pages.len() * ps, |dst| pages_to_slots(pages, ps, dst))
}

fn parse_policy(policy: &str, slru_threshold: i64) -> PyResult<Policy> {
    let th = u64::try_from(slru_threshold)
        .map_err(|_| invalid(format!("slru_threshold must be >= 0, got {slru_threshold}")))?;
    Policy::parse(policy, th).py()
}

fn page_size_arg(page_size: i64, what: &str) -> PyResult<usize> {
    usize::try_from(page_size).map_err(|_| invalid(format!("{what} must be >= 1, got {page_size}")))
}

/// Result of `RadixCache.match_prefix`: iterable as `(hit_len, slots, node)`.
#[pyclass(module = "kvindex._core", frozen, get_all)]
pub struct MatchResult {
    /// Matched tokens (a multiple of the page size).
    hit_len: usize,
    /// KV slots of the matched tokens (int32, one per token).
    slots: Py<PyArray1<i32>>,
    /// Handle of the last matched node (0, the root, on a miss): lock it.
    node: u64,
}

#[pymethods]
impl MatchResult {
    fn __iter__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let me = slf.get();
        let t = (me.hit_len, me.slots.clone_ref(py), me.node).into_pyobject(py)?;
        Ok(t.into_any().try_iter()?.into_any())
    }

    fn __len__(&self) -> usize {
        3
    }

    fn __repr__(&self) -> String {
        format!("MatchResult(hit_len={}, node={})", self.hit_len, self.node)
    }
}

/// Result of `RadixCache.insert`: iterable as `(prefix_len, to_free)`.
#[pyclass(module = "kvindex._core", frozen, get_all)]
pub struct InsertResult {
    /// Leading tokens that were already in the tree (a multiple of the page size).
    prefix_len: usize,
    /// Slots passed in that the tree did not take (duplicates of its prefix,
    /// and the unaligned tail when page_size > 1): the caller frees exactly these.
    to_free: Py<PyArray1<i32>>,
}

#[pymethods]
impl InsertResult {
    fn __iter__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let me = slf.get();
        let t = (me.prefix_len, me.to_free.clone_ref(py)).into_pyobject(py)?;
        Ok(t.into_any().try_iter()?.into_any())
    }

    fn __len__(&self) -> usize {
        2
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!("InsertResult(prefix_len={}, to_free={})", self.prefix_len, self.to_free.bind(py).repr()?))
    }
}

/// Radix tree over token ids with SGLang `RadixCache` semantics.
#[pyclass(module = "kvindex._core", name = "RadixCache")]
pub struct PyRadixCache {
    inner: RadixTree,
    /// Scratch: pages out of the core (matches, duplicates, evictions).
    pages: Vec<PageId>,
    /// Scratch: the caller's slots as pages.
    in_pages: Vec<PageId>,
}

#[pymethods]
impl PyRadixCache {
    #[new]
    #[pyo3(signature = (page_size = 1, *, policy = "lru", slru_threshold = 2, enable_events = false))]
    fn new(page_size: i64, policy: &str, slru_threshold: i64, enable_events: bool) -> PyResult<Self> {
        let ps = page_size_arg(page_size, "page_size")?;
        let policy = parse_policy(policy, slru_threshold)?;
        Ok(PyRadixCache {
            inner: RadixTree::new(ps, policy, enable_events).py()?,
            pages: Vec::new(),
            in_pages: Vec::new(),
        })
    }

    #[getter]
    fn page_size(&self) -> usize {
        self.inner.page_size()
    }

    #[getter]
    fn policy(&self) -> &'static str {
        self.inner.policy().name()
    }

    #[getter]
    fn total_size(&self) -> usize {
        self.inner.total_size()
    }

    #[getter]
    fn evictable_size(&self) -> usize {
        self.inner.evictable_size()
    }

    #[getter]
    fn protected_size(&self) -> usize {
        self.inner.protected_size()
    }

    #[getter]
    fn num_nodes(&self) -> usize {
        self.inner.num_nodes()
    }

    #[getter]
    fn clock(&self) -> u64 {
        self.inner.clock()
    }

    #[pyo3(signature = (tokens, namespace = None))]
    fn match_prefix(
        &mut self,
        py: Python<'_>,
        tokens: &Bound<'_, PyAny>,
        namespace: Option<&str>,
    ) -> PyResult<MatchResult> {
        let ps = self.inner.page_size();
        let m = {
            // SAFETY: the view lives to the end of this block; only Rust runs there.
            let toks = unsafe { tokens_i32(tokens, "tokens") }?;
            self.inner.match_nodes(&toks, namespace)
        };
        // The output is sized by the match, then filled from the tree's
        // values in place (no intermediate buffer, no zeroing).
        let (hit_len, node) = (m.len, m.node);
        let slots = arrays::filled_i32(py, hit_len, |dst| {
            m.values().fold(0, |off, vals| off + pages_to_slots(vals, ps, &mut dst[off..]))
        });
        let node = self.inner.handle(node).0;
        Ok(MatchResult { hit_len, slots: slots.unbind(), node })
    }

    #[pyo3(signature = (tokens, namespace = None))]
    fn probe(&mut self, tokens: &Bound<'_, PyAny>, namespace: Option<&str>) -> PyResult<usize> {
        // SAFETY: the view is used by Rust code only and dropped on return.
        let toks = unsafe { tokens_i32(tokens, "tokens") }?;
        Ok(self.inner.probe(&toks, namespace).len)
    }

    #[pyo3(signature = (tokens, slots, namespace = None, *, priority = 0))]
    fn insert(
        &mut self,
        py: Python<'_>,
        tokens: &Bound<'_, PyAny>,
        slots: &Bound<'_, PyAny>,
        namespace: Option<&str>,
        priority: i64,
    ) -> PyResult<InsertResult> {
        let ps = self.inner.page_size();
        let (prefix, tail_page, tail_len) = {
            // SAFETY: the views live to the end of this block, where only
            // Rust code runs (errors are built lazily, running no Python).
            let toks = unsafe { tokens_i32(tokens, "tokens") }?;
            let slots = unsafe { slots_i32(slots) }?;
            if slots.len() != toks.len() {
                return Err(invalid(format!(
                    "slots ({}) must have one slot per token ({})",
                    slots.len(),
                    toks.len()
                )));
            }
            let full = toks.len() / ps * ps;
            let mut pages = std::mem::take(&mut self.in_pages);
            pages.clear();
            self.pages.clear();
            let res = slots_to_pages(&slots, PageMath::new(ps), &mut pages).py().and_then(|tail_page| {
                self.inner
                    .insert(&toks[..full], &pages, namespace, priority, tail_page.as_slice(), &mut self.pages)
                    .py()
                    .map(|prefix| (prefix, tail_page, toks.len() - full))
            });
            self.in_pages = pages;
            res?
        };
        // To free: the duplicates, then the unaligned tail, which was checked
        // to be the run from its page's first slot (so it is rebuilt here).
        let to_free = arrays::filled_i32(py, self.pages.len() * ps + tail_len, |dst| {
            let n = pages_to_slots(&self.pages, ps, dst);
            if let Some(p) = tail_page {
                #[allow(clippy::cast_possible_wrap, clippy::cast_possible_truncation)]
                let base = (p.0 as usize * ps) as i32;
                for (d, k) in dst[n..n + tail_len].iter_mut().zip(0..) {
                    d.write(base + k);
                }
            }
            n + tail_len
        });
        Ok(InsertResult { prefix_len: prefix, to_free: to_free.unbind() })
    }

    fn lock(&mut self, node: &Bound<'_, PyAny>) -> PyResult<()> {
        let h = NodeHandle(arrays::id(node, "node")?);
        self.inner.lock_handle(h).py()
    }

    fn unlock(&mut self, node: &Bound<'_, PyAny>) -> PyResult<()> {
        let h = NodeHandle(arrays::id(node, "node")?);
        self.inner.unlock_handle(h).py()
    }

    fn lock_ref(&self, node: &Bound<'_, PyAny>) -> PyResult<u32> {
        let id = self.inner.resolve(NodeHandle(arrays::id(node, "node")?)).py()?;
        Ok(self.inner.lock_ref(id))
    }

    fn path_slots<'py>(
        &self,
        py: Python<'py>,
        node: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<i32>>> {
        let id = self.inner.resolve(NodeHandle(arrays::id(node, "node")?)).py()?;
        let mut pages = Vec::new();
        self.inner.path_values(id, &mut pages);
        Ok(slot_array(py, &pages, self.inner.page_size()))
    }

    fn all_slots<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i32>> {
        let mut pages = Vec::new();
        self.inner.all_values(&mut pages);
        slot_array(py, &pages, self.inner.page_size())
    }

    fn evict<'py>(&mut self, py: Python<'py>, num_tokens: i64) -> PyResult<Bound<'py, PyArray1<i32>>> {
        let n = usize::try_from(num_tokens)
            .map_err(|_| invalid(format!("num_tokens must be >= 0, got {num_tokens}")))?;
        self.pages.clear();
        self.inner.evict(n, &mut self.pages);
        Ok(slot_array(py, &self.pages, self.inner.page_size()))
    }

    fn reset<'py>(&mut self, py: Python<'py>) -> Bound<'py, PyArray1<i32>> {
        self.pages.clear();
        self.inner.reset(&mut self.pages);
        slot_array(py, &self.pages, self.inner.page_size())
    }

    fn take_events<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        events::to_list(py, self.inner.take_events())
    }

    fn check_invariants(&self) -> PyResult<()> {
        self.inner.check_invariants().map_err(inv_to_py)
    }

    fn dump(&self) -> String {
        self.inner.dump()
    }

    fn __len__(&self) -> usize {
        self.inner.total_size()
    }

    fn __repr__(&self) -> String {
        format!(
            "RadixCache(page_size={}, policy={:?}, total_size={}, evictable_size={}, protected_size={}, nodes={})",
            self.inner.page_size(),
            self.inner.policy().name(),
            self.inner.total_size(),
            self.inner.evictable_size(),
            self.inner.protected_size(),
            self.inner.num_nodes()
        )
    }
}

/// Request-level prefix cache over the radix tree, driven like `HashChainCache`.
#[pyclass(module = "kvindex._core", name = "RadixPrefixCache")]
pub struct PyRadixPrefixCache {
    inner: RadixPrefixCache,
}

#[pymethods]
impl PyRadixPrefixCache {
    #[new]
    #[pyo3(signature = (num_blocks, block_size, *, policy = "lru", slru_threshold = 2, enable_events = false))]
    fn new(
        num_blocks: i64,
        block_size: i64,
        policy: &str,
        slru_threshold: i64,
        enable_events: bool,
    ) -> PyResult<Self> {
        let nb = usize::try_from(num_blocks)
            .map_err(|_| invalid(format!("num_blocks must be >= 2, got {num_blocks}")))?;
        let bs = page_size_arg(block_size, "block_size")?;
        let policy = parse_policy(policy, slru_threshold)?;
        Ok(PyRadixPrefixCache { inner: RadixPrefixCache::new(nb, bs, policy, enable_events).py()? })
    }

    #[getter]
    fn num_blocks(&self) -> usize {
        self.inner.pool().num_pages()
    }

    #[getter]
    fn block_size(&self) -> usize {
        self.inner.page_size()
    }

    #[getter]
    fn page_size(&self) -> usize {
        self.inner.page_size()
    }

    #[getter]
    fn policy(&self) -> &'static str {
        self.inner.tree().policy().name()
    }

    #[getter]
    fn num_free_blocks(&self) -> usize {
        self.inner.num_free_blocks()
    }

    #[getter]
    fn num_unused_blocks(&self) -> usize {
        self.inner.pool().num_free()
    }

    #[getter]
    fn usage(&self) -> f64 {
        self.inner.usage()
    }

    #[getter]
    fn num_requests(&self) -> usize {
        self.inner.num_requests()
    }

    #[getter]
    fn num_common_prefix_blocks(&self) -> usize {
        self.inner.num_common_prefix_blocks()
    }

    #[getter]
    fn num_cached_blocks(&self) -> usize {
        self.inner.tree().total_size() / self.inner.page_size()
    }

    #[getter]
    fn cached_tokens(&self) -> usize {
        self.inner.tree().total_size()
    }

    #[getter]
    fn evictable_size(&self) -> usize {
        self.inner.tree().evictable_size()
    }

    #[getter]
    fn protected_size(&self) -> usize {
        self.inner.tree().protected_size()
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
        let hit = {
            // SAFETY: read after every argument that may run Python code; only
            // Rust runs while the view lives.
            let toks = unsafe { tokens_i32(tokens, "tokens") }?;
            self.inner.admit(id, &toks, &spec, skip_reading).py()?
        };
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
        let toks = unsafe { tokens_i32(tokens, "tokens") }?;
        self.inner.lookup(&toks, &spec).py()
    }

    fn append(&mut self, request_id: &Bound<'_, PyAny>, tokens: &Bound<'_, PyAny>) -> PyResult<bool> {
        let id = RequestId(arrays::id(request_id, "request_id")?);
        // SAFETY: read after the id (whose `__index__` may run Python code);
        // only Rust runs while the view lives.
        let toks = unsafe { tokens_i32(tokens, "tokens") }?;
        self.inner.append(id, &toks).py()
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
        // SAFETY: read after the other arguments; only Rust runs while the
        // view lives.
        let toks = unsafe { tokens_i32(tokens, "tokens") }?;
        self.inner.append_batch(&ids, &toks, off_slice).py()
    }

    fn checkpoint(&mut self, request_id: &Bound<'_, PyAny>) -> PyResult<()> {
        let id = RequestId(arrays::id(request_id, "request_id")?);
        self.inner.checkpoint(id).py()
    }

    fn free(&mut self, request_id: &Bound<'_, PyAny>) -> PyResult<()> {
        let id = RequestId(arrays::id(request_id, "request_id")?);
        self.inner.free(id).py()
    }

    fn free_batch(&mut self, request_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        let ids = arrays::ids(request_ids, "request_ids")?;
        self.inner.free_batch(&ids).py()
    }

    fn evict(&mut self, num_tokens: i64) -> PyResult<usize> {
        let n = usize::try_from(num_tokens)
            .map_err(|_| invalid(format!("num_tokens must be >= 0, got {num_tokens}")))?;
        Ok(self.inner.evict(n))
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
        common::block_tables(py, &self.inner, self.inner.pool().num_pages(), request_ids, max_blocks, out)
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

    fn num_cached_tokens(&self, request_id: &Bound<'_, PyAny>) -> PyResult<usize> {
        self.inner.num_cached_tokens(RequestId(arrays::id(request_id, "request_id")?)).py()
    }

    fn request_blocks<'py>(
        &self,
        py: Python<'py>,
        request_id: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<i32>>> {
        let blocks = self.inner.blocks(RequestId(arrays::id(request_id, "request_id")?)).py()?;
        Ok(common::block_ids_array(py, blocks))
    }

    fn free_blocks<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i32>> {
        let v: Vec<PageId> = self.inner.pool().free_pages().collect();
        common::block_ids_array(py, &v)
    }

    fn cached_blocks<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i32>> {
        let mut v = Vec::new();
        self.inner.tree().all_values(&mut v);
        common::block_ids_array(py, &v)
    }

    fn ref_count(&self, block_id: i64) -> PyResult<u32> {
        let n = self.inner.pool().num_pages();
        let b = u32::try_from(block_id)
            .ok()
            .filter(|&b| (b as usize) < n)
            .ok_or_else(|| invalid(format!("block id {block_id} out of range 0..{n}")))?;
        Ok(self.inner.pool().ref_count(PageId(b)))
    }

    fn check_invariants(&self) -> PyResult<()> {
        self.inner.check_invariants().map_err(inv_to_py)
    }

    fn dump(&self) -> String {
        self.inner.tree().dump()
    }

    fn __repr__(&self) -> String {
        format!(
            "RadixPrefixCache(num_blocks={}, block_size={}, policy={:?}, free={}, cached_tokens={}, requests={})",
            self.inner.pool().num_pages(),
            self.inner.page_size(),
            self.inner.tree().policy().name(),
            self.inner.num_free_blocks(),
            self.inner.tree().total_size(),
            self.inner.num_requests()
        )
    }
}

impl events::EventSource for PyRadixCache {
    fn drain_events(&mut self) -> Vec<crate::core::events::KvEvent> {
        self.inner.take_events()
    }
}

impl events::EventSource for PyRadixPrefixCache {
    fn drain_events(&mut self) -> Vec<crate::core::events::KvEvent> {
        self.inner.take_events()
    }
}
