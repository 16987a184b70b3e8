//! `HashChainCache`: the Python face of [`core::hash_chain::HashChainCache`].
//! It extends `PrefixCache` ([`super::cache`]), which holds the core cache and
//! every method the two request-level caches share; this file holds the
//! constructor and the hash-chain-only methods.

use numpy::PyArrayMethods;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::args::named;
use super::cache::{AnyCache, PyPrefixCache};
use super::errors::IntoPyResult;
use super::{args, arrays, common};
use crate::core::hash::HashAlgo;
use crate::core::hash_chain as core;
use crate::core::ids::RequestId;

/// Prefix cache over chained block hashes and a ref-counted block pool (vLLM 0.33 semantics).
///
/// Block 0 is the null block (never allocated; pads block tables). Free blocks form
/// an LRU queue: new blocks come from its head; a finished request's blocks return in
/// reverse table order, unhashed ones to the head and cached ones to the tail; a
/// cached block keeps its hash until it is handed out again. A lookup hits the
/// longest run of cached block hashes from block 0, capped at ``num_tokens - 1``
/// (the last prompt token is always recomputed) and aligned to the block size.
#[pyclass(module = "kvindex._core", name = "HashChainCache", extends = PyPrefixCache)]
pub struct PyHashChainCache;

/// The hash chain under a `HashChainCache`.
fn chain<'a>(base: &'a PyRef<'_, PyPrefixCache>) -> PyResult<&'a core::HashChainCache> {
    base.inner.chain()
}

#[pymethods]
impl PyHashChainCache {
    #[new]
    #[pyo3(
        signature = (num_blocks, block_size, *, algo = "xxh3_128".to_owned(), seed = None, enable_events = false, max_events = 100000),
        text_signature = "(num_blocks, block_size, *, algo='xxh3_128', seed=None, enable_events=False, max_events=100000)"
    )]
    fn new(
        #[pyo3(from_py_with = named::num_blocks)] num_blocks: usize,
        #[pyo3(from_py_with = named::block_size)] block_size: usize,
        #[pyo3(from_py_with = named::algo)] algo: String,
        #[pyo3(from_py_with = named::seed)] seed: Option<String>,
        enable_events: bool,
        #[pyo3(from_py_with = named::max_events)] max_events: usize,
    ) -> PyResult<PyClassInitializer<Self>> {
        let algo = HashAlgo::parse(&algo).py()?;
        let mut inner =
            core::HashChainCache::new(num_blocks, block_size, algo, seed.as_deref(), enable_events).py()?;
        inner.set_max_events(max_events).py()?;
        Ok(PyClassInitializer::from(PyPrefixCache::new(AnyCache::Chain(inner)))
            .add_subclass(PyHashChainCache))
    }

    /// The hash algorithm (one of ``HASH_ALGOS``).
    #[getter]
    fn algo(slf: PyRef<'_, Self>) -> PyResult<&'static str> {
        Ok(chain(slf.as_super())?.algo().name())
    }

    /// Drops the cached hashes of idle blocks (they keep their queue position).
    /// ``block_ids``: a 1-D C-contiguous ``int32``/``int64`` array or a list / tuple of
    /// ints (anything else raises ``DTypeError``). Raises ``BlockInUseError`` for a block
    /// a request holds. Returns blocks evicted.
    fn evict_blocks(slf: &Bound<'_, Self>, block_ids: &Bound<'_, PyAny>) -> PyResult<usize> {
        let ids = arrays::block_ids(block_ids, "block_ids")?;
        let mut base = slf.as_super().try_borrow_mut()?;
        base.inner.chain_mut()?.evict_blocks(&ids).py()
    }

    /// The chained hashes of a running request's full blocks, ``[n, digest_len]`` uint8.
    fn request_block_hashes<'py>(
        slf: &Bound<'py, Self>,
        request_id: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let id = RequestId(args::u64_arg(request_id, "request_id")?);
        let (bytes, n, d) = {
            let base = slf.as_super().try_borrow()?;
            let c = chain(&base)?;
            let hs = c.request_hashes(id).py()?;
            let d = c.algo().digest_len();
            let mut bytes = Vec::new();
            bytes
                .try_reserve_exact(hs.len() * d)
                .map_err(|_| super::errors::capacity("cannot allocate the request's block hashes"))?;
            bytes.extend(hs.iter().flat_map(|h| h.as_bytes().iter().copied()));
            (bytes, hs.len(), d)
        };
        Ok(numpy::PyArray1::from_vec(slf.py(), bytes).reshape([n, d])?.into_any())
    }

    /// Alias of :meth:`free_blocks`.
    fn free_queue<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, numpy::PyArray1<i32>>> {
        let v = slf.as_super().try_borrow()?.inner.free_blocks();
        common::raw_ids_array(slf.py(), &v)
    }

    /// The block's cached hash, or None.
    fn block_hash<'py>(
        slf: &Bound<'py, Self>,
        block_id: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let b = args::i64_arg(block_id, "block_id")?;
        let h = {
            let base = slf.as_super().try_borrow()?;
            let b = base.inner.block_id(b)?;
            chain(&base)?.pool().block_hash(crate::core::ids::TableEntry::from_raw(b))
        };
        Ok(h.map(|h| PyBytes::new(slf.py(), h.as_bytes())))
    }

    fn __repr__(slf: PyRef<'_, Self>) -> PyResult<String> {
        let c = chain(slf.as_super())?;
        Ok(format!(
            "HashChainCache(num_blocks={}, block_size={}, algo={:?}, free={}, requests={})",
            c.pool().num_blocks(),
            c.block_size(),
            c.algo().name(),
            c.pool().num_free(),
            c.num_requests()
        ))
    }
}
