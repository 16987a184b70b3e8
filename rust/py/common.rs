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

/// A successful ``admit`` (either cache); unpacks as ``(num_cached_tokens, block_ids)``.
#[pyclass(module = "kvindex._core", frozen, get_all)]
pub struct Admission {
    /// Prompt tokens served from the cache (a multiple of the block size).
    num_cached_tokens: usize,
    /// The request's block table.
    block_ids: Py<PyArray1<i32>>,
}

impl Admission {
    /// An admission whose block-table array is already built.
    pub fn from_array(num_cached_tokens: usize, block_ids: Bound<'_, PyArray1<i32>>) -> Self {
        Admission { num_cached_tokens, block_ids: block_ids.unbind() }
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
///
/// # Errors
/// `CapacityError` if the array cannot be allocated.
pub fn block_ids_array<'py, B: TableEntry>(
    py: Python<'py>,
    blocks: &[B],
) -> PyResult<Bound<'py, PyArray1<i32>>> {
    arrays::i32_array(py, blocks.iter().map(|b| i32::try_from(b.raw()).expect("block ids fit i32")))
}

/// Raw block (or page) ids as a new int32 array.
///
/// # Errors
/// `CapacityError` if the array cannot be allocated.
pub fn raw_ids_array<'py>(py: Python<'py>, blocks: &[u32]) -> PyResult<Bound<'py, PyArray1<i32>>> {
    arrays::i32_array(py, blocks.iter().map(|&b| i32::try_from(b).expect("block ids fit i32")))
}

/// Statistics as the dict both caches' `stats` return; `events_dropped`
/// counts KV events the full buffer dropped (oldest first).
pub fn stats_dict(py: Python<'_>, s: Stats, events_dropped: u64) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("requests", s.requests)?;
    d.set_item("queries", s.queries)?;
    d.set_item("hits", s.hits)?;
    d.set_item("evictions", s.evictions)?;
    #[allow(clippy::cast_precision_loss)]
    d.set_item("hit_rate", if s.queries == 0 { 0.0 } else { s.hits as f64 / s.queries as f64 })?;
    d.set_item("events_dropped", events_dropped)?;
    Ok(d)
}

/// The converted arguments of `block_tables(request_ids, max_blocks=None, out=None)`.
pub struct TableArgs<'py> {
    ids: Vec<u64>,
    max_blocks: Option<usize>,
    out: Option<Bound<'py, PyArray2<i32>>>,
}

impl<'py> TableArgs<'py> {
    /// Converts the arguments (runs any `__index__`; call before borrowing the cache).
    ///
    /// # Errors
    /// `DTypeError` / `InvalidArgumentError` for bad arguments.
    pub fn new(
        request_ids: &Bound<'py, PyAny>,
        max_blocks: Option<&Bound<'py, PyAny>>,
        out: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Self> {
        let ids = arrays::ids(request_ids, "request_ids")?;
        let max_blocks = super::args::opt_usize_arg(max_blocks, "max_blocks", usize::MAX)?;
        let out = match out.filter(|o| !o.is_none()) {
            Some(o) => {
                let a = o
                    .cast::<PyArray2<i32>>()
                    .map_err(|_| dtype("out must be a 2-D int32 numpy array"))?
                    .clone();
                Some(a)
            }
            None => None,
        };
        Ok(TableArgs { ids, max_blocks, out })
    }

    /// Writes the tables of `src` (a pool of `num_blocks`): into `out` when
    /// given, else into a new array. `max_blocks` is capped by the pool size
    /// (no table can be wider).
    ///
    /// # Errors
    /// As the method documents; `CapacityError` if the output cannot be allocated.
    pub fn run<S: TableSource>(
        self,
        py: Python<'py>,
        src: &S,
        num_blocks: usize,
    ) -> PyResult<Bound<'py, PyArray2<i32>>> {
        let TableArgs { ids, max_blocks, out } = self;
        let width = match max_blocks {
            Some(w) if w <= num_blocks => w,
            Some(w) => {
                return Err(invalid(format!(
                    "max_blocks must be in 0..={num_blocks} (no table can hold more blocks than the pool), got {w}"
                )))
            }
            None => match &out {
                Some(o) => o.shape()[1],
                None => src.max_blocks(&ids).py()?,
            },
        };
        let arr = match out {
            Some(a) => {
                if a.shape() != [ids.len(), width] || !a.is_c_contiguous() {
                    return Err(invalid(format!(
                        "out must be C-contiguous with shape ({}, {width})",
                        ids.len()
                    )));
                }
                a
            }
            None => {
                // Unknown ids and too-narrow tables are refused before anything is allocated.
                let need = src.max_blocks(&ids).py()?;
                if need > width {
                    return Err(invalid(format!(
                        "a block table has {need} blocks, more than max_blocks={width}"
                    )));
                }
                arrays::zeros_i32_2d(py, ids.len(), width)?
            }
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
}

/// The converted arguments of `slot_mapping(request_ids, query_lens)`.
pub struct SlotArgs {
    ids: Vec<u64>,
    query_lens: Vec<i64>,
}

impl SlotArgs {
    /// Converts the arguments (call before borrowing the cache).
    ///
    /// # Errors
    /// `DTypeError` for bad arrays.
    pub fn new(request_ids: &Bound<'_, PyAny>, query_lens: &Bound<'_, PyAny>) -> PyResult<Self> {
        let ids = arrays::ids(request_ids, "request_ids")?;
        let query_lens = arrays::int64_vec(query_lens, "query_lens")?;
        Ok(SlotArgs { ids, query_lens })
    }

    /// The slot mapping over `src`.
    ///
    /// # Errors
    /// As the method documents; `CapacityError` if the output cannot be allocated.
    pub fn run<'py, S: TableSource>(self, py: Python<'py>, src: &S) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let v = src.slot_mapping(&self.ids, &self.query_lens).py()?;
        Ok(PyArray1::from_vec(py, v))
    }
}
