//! Binding pieces shared by both request-level caches: the `Admission`
//! result, statistics dicts, and the block-table / slot-mapping calls that
//! feed the kernels (one implementation over [`TableSource`]).

use numpy::{PyArray1, PyArray2, PyArrayMethods, PyReadwriteArray2, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::arrays;
use super::errors::{dtype, invalid, IntoPyResult};
use crate::core::ids::TableEntry;
use crate::core::request::Stats;
use crate::core::tables::TableSource;

/// Result of a successful admission (either cache).
#[pyclass(module = "kvindex._core", frozen, get_all)]
pub struct Admission {
    /// Prompt tokens served from the cache (a multiple of the block size).
    num_cached_tokens: usize,
    /// The request's block table (int32).
    block_ids: Py<PyArray1<i32>>,
}

impl Admission {
    /// An admission of `num_cached_tokens` hit tokens with table `blocks`.
    pub fn new<B: TableEntry>(py: Python<'_>, num_cached_tokens: usize, blocks: &[B]) -> Self {
        Admission { num_cached_tokens, block_ids: block_ids_array(py, blocks).unbind() }
    }
}

#[pymethods]
impl Admission {
    fn __iter__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let me = slf.get();
        let t = (me.num_cached_tokens, me.block_ids.clone_ref(py)).into_pyobject(py)?;
        Ok(t.into_any().try_iter()?.into_any())
    }

    fn __len__(&self) -> usize {
        2
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "Admission(num_cached_tokens={}, block_ids={})",
            self.num_cached_tokens,
            self.block_ids.bind(py).repr()?
        ))
    }
}

/// Block (or page) ids as a new int32 array.
pub fn block_ids_array<'py, B: TableEntry>(py: Python<'py>, blocks: &[B]) -> Bound<'py, PyArray1<i32>> {
    PyArray1::from_iter(py, blocks.iter().map(|b| i32::try_from(b.raw()).expect("block ids fit i32")))
}

/// Statistics as the dict both caches' `stats` return.
pub fn stats_dict(py: Python<'_>, s: Stats) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("requests", s.requests)?;
    d.set_item("queries", s.queries)?;
    d.set_item("hits", s.hits)?;
    d.set_item("evictions", s.evictions)?;
    #[allow(clippy::cast_precision_loss)]
    d.set_item("hit_rate", if s.queries == 0 { 0.0 } else { s.hits as f64 / s.queries as f64 })?;
    Ok(d)
}

/// `block_tables(request_ids, max_blocks=None, out=None)` over any cache.
/// `max_blocks` is capped by the pool size `num_blocks` (no table can be wider).
pub fn block_tables<'py, S: TableSource>(
    py: Python<'py>,
    src: &S,
    num_blocks: usize,
    request_ids: &Bound<'py, PyAny>,
    max_blocks: Option<i64>,
    out: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyArray2<i32>>> {
    let ids = arrays::ids(request_ids, "request_ids")?;
    let width = match max_blocks {
        Some(w) => usize::try_from(w).ok().filter(|&w| w <= num_blocks).ok_or_else(|| {
            invalid(format!(
                "max_blocks must be in 0..={num_blocks} (no table can hold more blocks than the pool), got {w}"
            ))
        })?,
        None => match out {
            Some(o) => o.cast::<PyArray2<i32>>().map(|a| a.shape()[1]).unwrap_or(0),
            None => src.max_blocks(&ids).py()?,
        },
    };
    let arr = match out {
        Some(o) => {
            let a =
                o.cast::<PyArray2<i32>>().map_err(|_| dtype("out must be a 2-D int32 numpy array"))?.clone();
            if a.shape() != [ids.len(), width] || !a.is_c_contiguous() {
                return Err(invalid(format!("out must be C-contiguous with shape ({}, {width})", ids.len())));
            }
            a
        }
        None => PyArray2::zeros(py, [ids.len(), width], false),
    };
    {
        let mut w: PyReadwriteArray2<'_, i32> = arr
            .try_readwrite()
            .map_err(|_| invalid("out must be a writeable array that nothing else borrows"))?;
        let s = w.as_slice_mut().map_err(|_| invalid("out must be C-contiguous"))?;
        src.fill_block_tables(&ids, width, s).py()?;
    }
    Ok(arr)
}

/// `slot_mapping(request_ids, query_lens)` over any cache.
pub fn slot_mapping<'py, S: TableSource>(
    py: Python<'py>,
    src: &S,
    request_ids: &Bound<'py, PyAny>,
    query_lens: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyArray1<i64>>> {
    let ids = arrays::ids(request_ids, "request_ids")?;
    let q = arrays::int64(query_lens, "query_lens")?;
    let v = src.slot_mapping(&ids, q.as_slice().expect("contiguity checked")).py()?;
    Ok(PyArray1::from_vec(py, v))
}
