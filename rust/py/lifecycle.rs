//! Argument and result conversions of the engine-lifecycle calls (the
//! calls themselves are `PrefixCache`'s, in [`super::cache`]): counts and
//! step options checked, draft ids copied, and the tuples and dicts the calls
//! return.

use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use super::arrays::{with_tokens, with_views, Tokens};
use super::errors::invalid;
use crate::core::ids::TableEntry;
use crate::core::request::{Life, Status, StepOpts};

/// A non-negative count argument.
///
/// # Errors
/// `InvalidArgumentError` for a negative value.
pub fn count(v: i64, what: &str) -> PyResult<usize> {
    usize::try_from(v).map_err(|_| invalid(format!("{what} must be >= 0, got {v}")))
}

/// A count argument that must be at least 1.
///
/// # Errors
/// `InvalidArgumentError` below 1.
pub fn positive(v: i64, what: &str) -> PyResult<usize> {
    usize::try_from(v)
        .ok()
        .filter(|&n| n >= 1)
        .ok_or_else(|| invalid(format!("{what} must be >= 1, got {v}")))
}

/// The options of an admission step, checked.
///
/// # Errors
/// `InvalidArgumentError` for a chunk below 1 or a negative count.
#[allow(clippy::fn_params_excessive_bools)]
pub fn opts(
    chunk: Option<i64>,
    lookahead: i64,
    must_fit: bool,
    external_prefix: i64,
    delay_cache: bool,
    reserved_blocks: i64,
    watermark_blocks: i64,
) -> PyResult<StepOpts> {
    Ok(StepOpts {
        chunk: chunk.map(|c| positive(c, "chunk")).transpose()?,
        lookahead: count(lookahead, "lookahead")?,
        must_fit,
        external_prefix: count(external_prefix, "external_prefix")?,
        delay_cache,
        reserved_blocks: count(reserved_blocks, "reserved_blocks")?,
        watermark_blocks: count(watermark_blocks, "watermark_blocks")?,
    })
}

/// `(hit_tokens, scheduled_tokens, new_block_ids)` of an admission.
///
/// # Errors
/// `CapacityError` if the array cannot be allocated.
pub fn admitted<'py, B: TableEntry>(
    py: Python<'py>,
    hit: usize,
    scheduled: usize,
    new_blocks: &[B],
) -> PyResult<Bound<'py, PyTuple>> {
    let arr = super::common::block_ids_array(py, new_blocks)?;
    PyTuple::new(
        py,
        [hit.into_pyobject(py)?.into_any(), scheduled.into_pyobject(py)?.into_any(), arr.into_any()],
    )
}

/// Draft token ids (an int32 or int64 array, or `None`) copied out as int64.
///
/// # Errors
/// As [`Tokens`]; `InvalidArgumentError` for an id outside int32 (the
/// caches' token rule, as for committed ids).
pub fn drafts(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<i64>> {
    use super::errors::IntoPyResult;
    use crate::core::hash::Token;
    let Some(obj) = obj.filter(|o| !o.is_none()) else { return Ok(Vec::new()) };
    with_views(
        Tokens(obj, "draft_tokens"),
        |t| with_tokens!(t, s => Token::check_ids(s).map(|()| s.iter().map(|&t| t.get()).collect())),
    )?
    .py()
}

/// `(num_scheduled, block_ids, block_offsets)` of a batch step.
///
/// # Errors
/// `CapacityError` if an array cannot be allocated.
pub fn scheduled_batch<'py, B: TableEntry>(
    py: Python<'py>,
    done: usize,
    blocks: &[B],
    offsets: &[i64],
) -> PyResult<Bound<'py, PyTuple>> {
    let b = super::common::block_ids_array(py, blocks)?;
    // numpy-owned (a copy of a few entries), not a Vec kept alive by a capsule object
    let o = PyArray1::from_slice(py, offsets);
    PyTuple::new(py, [done.into_pyobject(py)?.into_any(), b.into_any(), o.into_any()])
}

/// A request's lifecycle counters as the dict `request_state` returns.
///
/// # Errors
/// A Python error building the dict.
pub fn state_dict<'py>(py: Python<'py>, l: &Life, num_tokens: usize) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item(
        "status",
        match l.status {
            Status::Running => "running",
            Status::Preempted => "preempted",
            Status::WaitingForRemoteKvs => "waiting_for_remote_kvs",
        },
    )?;
    d.set_item("num_computed", l.num_computed)?;
    d.set_item("num_tokens", num_tokens)?;
    d.set_item("pending", l.pending)?;
    d.set_item("drafts", l.drafts.clone())?;
    d.set_item("num_preemptions", l.preemptions)?;
    Ok(d)
}
