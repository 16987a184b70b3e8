//! The engine-lifecycle methods of both request-level cache classes
//! (`admit_chunk`, `resume`, `schedule`, `schedule_batch`, `commit_tokens`,
//! `commit_batch`, `preempt`, `finish`, `finish_transfer`, `request_state`,
//! `resumed_stats`), written once: [`lifecycle_methods!`] hands them to
//! [`super::request_cache::request_cache_class!`] with the class's own, so
//! one `#[pymethods]` block holds them all. The helpers here convert
//! arguments and results; the core ([`crate::core::request`]) does the work.
//!
//! As in the rest of the binding, every argument is converted before the
//! cache is borrowed, and output objects are built after the borrow ends.

use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

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
/// As [`super::arrays::tokens`]; `InvalidArgumentError` for an id outside
/// int32 (the caches' token rule, as for committed ids).
pub fn drafts(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<i64>> {
    use super::errors::IntoPyResult;
    use crate::core::hash::Token;
    let Some(obj) = obj.filter(|o| !o.is_none()) else { return Ok(Vec::new()) };
    // SAFETY: the view is copied out at once; no Python code runs meanwhile.
    #[allow(unsafe_code)]
    let arr = unsafe { super::arrays::tokens(obj, "draft_tokens") }?;
    super::arrays::with_tokens!(arr, s => Token::check_ids(s)).py()?;
    Ok(super::arrays::with_tokens!(arr, s => s.iter().map(|&t| t.get()).collect()))
}

/// An optional int64 array argument, copied out.
///
/// # Errors
/// As [`super::arrays::int64_vec`].
pub fn opt_int64(obj: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Option<Vec<i64>>> {
    obj.filter(|o| !o.is_none()).map(|o| super::arrays::int64_vec(o, what)).transpose()
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

/// Passes the lifecycle methods, then the class's own, to
/// `request_cache_class!`'s emitting arm (see the module documentation).
macro_rules! lifecycle_methods {
    ($cls:ident { $($own:tt)* }) => {
        $crate::py::request_cache::request_cache_class!(@emit $cls {
            /// Admits a new request the way vLLM's scheduler admits a waiting one: looks the
            /// prompt up (hit capped at ``num_tokens - 1``, block aligned), takes the
            /// ``external_prefix`` tokens beyond the hit as computed elsewhere (an offload tier,
            /// a prefill worker), then allocates ``min(rest, chunk)`` tokens plus ``lookahead``
            /// slots and caches the full blocks of the scheduled tokens now (other requests hit
            /// them from this step on). With ``delay_cache`` and external tokens nothing is
            /// scheduled or cached until ``finish_transfer``. ``must_fit``: the whole sequence
            /// must fit in the free blocks; ``reserved_blocks`` must stay free;
            /// ``watermark_blocks`` (vLLM's watermark, 0 when nothing else is scheduled) counts
            /// as used. Returns ``(hit_tokens, scheduled_tokens, new_block_ids)``, or ``None``
            /// with nothing changed. ``admit(rid, prompt)`` is ``admit_chunk`` without a chunk.
            #[pyo3(signature = (request_id, tokens, *, chunk = None, lookahead = 0, must_fit = false, external_prefix = 0, delay_cache = false, reserved_blocks = 0, watermark_blocks = 0, cache_salt = None, lora = None, mm_items = None, skip_reading = false))]
            #[allow(clippy::too_many_arguments, clippy::fn_params_excessive_bools)]
            fn admit_chunk<'py>(
                slf: &Bound<'py, Self>,
                request_id: &Bound<'py, PyAny>,
                tokens: &Bound<'py, PyAny>,
                #[pyo3(from_py_with = $crate::py::args::named::chunk)] chunk: Option<i64>,
                #[pyo3(from_py_with = $crate::py::args::named::lookahead)] lookahead: i64,
                #[pyo3(from_py_with = $crate::py::args::named::must_fit)] must_fit: bool,
                #[pyo3(from_py_with = $crate::py::args::named::external_prefix)] external_prefix: i64,
                #[pyo3(from_py_with = $crate::py::args::named::delay_cache)] delay_cache: bool,
                #[pyo3(from_py_with = $crate::py::args::named::reserved_blocks)] reserved_blocks: i64,
                #[pyo3(from_py_with = $crate::py::args::named::watermark_blocks)] watermark_blocks: i64,
                #[pyo3(from_py_with = $crate::py::args::named::cache_salt)] cache_salt: Option<String>,
                lora: Option<&Bound<'py, PyAny>>,
                mm_items: Option<&Bound<'py, PyAny>>,
                #[pyo3(from_py_with = $crate::py::args::named::skip_reading)] skip_reading: bool,
            ) -> PyResult<Option<Bound<'py, pyo3::types::PyTuple>>> {
                use $crate::py::errors::IntoPyResult;
                let id = $crate::core::ids::RequestId($crate::py::args::u64_arg(request_id, "request_id")?);
                let o = $crate::py::lifecycle::opts(chunk, lookahead, must_fit, external_prefix, delay_cache, reserved_blocks, watermark_blocks)?;
                let spec = $crate::py::keys::spec(cache_salt, lora, mm_items)?;
                let (s, new) = {
                    // SAFETY: read after every argument that may run Python code; only
                    // Rust runs while the view lives.
                    let arr = unsafe { $crate::py::arrays::tokens(tokens, "tokens") }?;
                    let mut me = slf.try_borrow_mut()?;
                    let s = $crate::py::request_cache::Design::admit_chunk(&mut me.inner, id, arr, spec, skip_reading, &o).py()?;
                    let Some(s) = s else { return Ok(None) };
                    (s, $crate::core::tables::TableSource::blocks(&me.inner, id).py()?[s.first_new..].to_vec())
                };
                $crate::py::lifecycle::admitted(slf.py(), s.hit, s.scheduled, &new).map(Some)
            }

            /// Resumes a preempted request with its prompt and outputs so far, as ``admit_chunk``
            /// admits a new one (its hits count in :attr:`resumed_stats`). Same answer.
            #[pyo3(signature = (request_id, *, chunk = None, lookahead = 0, must_fit = false, external_prefix = 0, delay_cache = false, reserved_blocks = 0, watermark_blocks = 0))]
            #[allow(clippy::too_many_arguments, clippy::fn_params_excessive_bools)]
            fn resume<'py>(
                slf: &Bound<'py, Self>,
                request_id: &Bound<'py, PyAny>,
                #[pyo3(from_py_with = $crate::py::args::named::chunk)] chunk: Option<i64>,
                #[pyo3(from_py_with = $crate::py::args::named::lookahead)] lookahead: i64,
                #[pyo3(from_py_with = $crate::py::args::named::must_fit)] must_fit: bool,
                #[pyo3(from_py_with = $crate::py::args::named::external_prefix)] external_prefix: i64,
                #[pyo3(from_py_with = $crate::py::args::named::delay_cache)] delay_cache: bool,
                #[pyo3(from_py_with = $crate::py::args::named::reserved_blocks)] reserved_blocks: i64,
                #[pyo3(from_py_with = $crate::py::args::named::watermark_blocks)] watermark_blocks: i64,
            ) -> PyResult<Option<Bound<'py, pyo3::types::PyTuple>>> {
                use $crate::py::errors::IntoPyResult;
                let id = $crate::core::ids::RequestId($crate::py::args::u64_arg(request_id, "request_id")?);
                let o = $crate::py::lifecycle::opts(chunk, lookahead, must_fit, external_prefix, delay_cache, reserved_blocks, watermark_blocks)?;
                let (s, new) = {
                    let mut me = slf.try_borrow_mut()?;
                    let Some(s) = me.inner.resume(id, &o).py()? else { return Ok(None) };
                    (s, $crate::core::tables::TableSource::blocks(&me.inner, id).py()?[s.first_new..].to_vec())
                };
                $crate::py::lifecycle::admitted(slf.py(), s.hit, s.scheduled, &new).map(Some)
            }

            /// Schedules a running request's next prefill chunk or decode step:
            /// ``num_new_tokens`` positions (the last ``len(draft_tokens)`` of them speculative
            /// drafts) plus ``lookahead`` slots that are never cached. Positions may run ahead of
            /// the known ids by the sampled placeholders (async scheduling); full blocks of known
            /// ids up to the scheduled positions are cached now. Returns the new block ids, or
            /// ``None`` (nothing changed) when blocks, less ``reserved_blocks``, run short.
            #[pyo3(signature = (request_id, num_new_tokens, *, lookahead = 0, draft_tokens = None, reserved_blocks = 0))]
            fn schedule<'py>(
                slf: &Bound<'py, Self>,
                request_id: &Bound<'py, PyAny>,
                #[pyo3(from_py_with = $crate::py::args::named::num_new_tokens)] num_new_tokens: i64,
                #[pyo3(from_py_with = $crate::py::args::named::lookahead)] lookahead: i64,
                draft_tokens: Option<&Bound<'py, PyAny>>,
                #[pyo3(from_py_with = $crate::py::args::named::reserved_blocks)] reserved_blocks: i64,
            ) -> PyResult<Option<Bound<'py, numpy::PyArray1<i32>>>> {
                use $crate::py::errors::IntoPyResult;
                let id = $crate::core::ids::RequestId($crate::py::args::u64_arg(request_id, "request_id")?);
                let n = $crate::py::lifecycle::positive(num_new_tokens, "num_new_tokens")?;
                let la = $crate::py::lifecycle::count(lookahead, "lookahead")?;
                let reserved = $crate::py::lifecycle::count(reserved_blocks, "reserved_blocks")?;
                let drafts = $crate::py::lifecycle::drafts(draft_tokens)?;
                let new = {
                    let mut me = slf.try_borrow_mut()?;
                    let Some(first) = me.inner.schedule(id, n, &drafts, la, reserved).py()? else { return Ok(None) };
                    $crate::core::tables::TableSource::blocks(&me.inner, id).py()?[first..].to_vec()
                };
                $crate::py::common::block_ids_array(slf.py(), &new).map(Some)
            }

            /// ``schedule`` for many running requests in order, one call per step: request ``i``
            /// gets ``num_new_tokens[i]`` positions and the drafts
            /// ``draft_tokens[draft_offsets[i]:draft_offsets[i+1]]``. Stops at the first request
            /// the blocks do not cover (preempt and call again with the rest). Returns
            /// ``(num_scheduled, block_ids, block_offsets)``: request ``i``'s new blocks are
            /// ``block_ids[block_offsets[i]:block_offsets[i+1]]``. Caller errors are checked for
            /// every request before any is scheduled.
            #[pyo3(signature = (request_ids, num_new_tokens, *, lookahead = 0, draft_tokens = None, draft_offsets = None))]
            fn schedule_batch<'py>(
                slf: &Bound<'py, Self>,
                request_ids: &Bound<'py, PyAny>,
                num_new_tokens: &Bound<'py, PyAny>,
                #[pyo3(from_py_with = $crate::py::args::named::lookahead)] lookahead: i64,
                draft_tokens: Option<&Bound<'py, PyAny>>,
                draft_offsets: Option<&Bound<'py, PyAny>>,
            ) -> PyResult<Bound<'py, pyo3::types::PyTuple>> {
                use $crate::py::errors::IntoPyResult;
                let (done, blocks, offsets) = {
                    // The arguments whose conversion may run Python code (`__index__`,
                    // sequences) first; then the in-place views, so that only Rust runs
                    // while they live.
                    let la = $crate::py::lifecycle::count(lookahead, "lookahead")?;
                    let drafts = $crate::py::lifecycle::drafts(draft_tokens)?;
                    let off = $crate::py::lifecycle::opt_int64(draft_offsets, "draft_offsets")?;
                    // SAFETY: nothing below runs Python code while the views live (the
                    // readers copy or view; the cache is Rust).
                    let ids = unsafe { $crate::py::arrays::ids_view(request_ids, "request_ids") }?;
                    let n = unsafe { $crate::py::arrays::int64_view(num_new_tokens, "num_new_tokens") }?;
                    let mut me = slf.try_borrow_mut()?;
                    let mut blocks = Vec::new();
                    let mut offsets = Vec::new();
                    offsets.try_reserve_exact(ids.len() + 1).map_err(|_| {
                        $crate::py::errors::capacity(format!("cannot allocate {} block offsets", ids.len() + 1))
                    })?;
                    let done = me.inner.schedule_batch(ids, n, &drafts, off.as_deref(), la, &mut blocks, &mut offsets).py()?;
                    (done, blocks, offsets)
                };
                $crate::py::lifecycle::scheduled_batch(slf.py(), done, &blocks, &offsets)
            }

            /// Commits the ids sampled for a running request's step in flight: the accepted
            /// drafts first, then sampled ids filling the placeholders ``schedule`` reserved;
            /// ``num_rejected`` trailing drafts are rolled back (their slots stay in the table,
            /// the next step reuses them). A block whose last id is now known is cached at the
            /// request's next ``schedule``. Raises ``KvIndexError`` (nothing changed) for ids
            /// that do not fit the reserved placeholders.
            #[pyo3(signature = (request_id, tokens, num_rejected = 0))]
            fn commit_tokens(
                slf: &Bound<'_, Self>,
                request_id: &Bound<'_, PyAny>,
                tokens: &Bound<'_, PyAny>,
                #[pyo3(from_py_with = $crate::py::args::named::num_rejected)] num_rejected: i64,
            ) -> PyResult<()> {
                use $crate::py::errors::IntoPyResult;
                let id = $crate::core::ids::RequestId($crate::py::args::u64_arg(request_id, "request_id")?);
                let rej = $crate::py::lifecycle::count(num_rejected, "num_rejected")?;
                // SAFETY: read after every argument that may run Python code; only
                // Rust runs while the view lives.
                let arr = unsafe { $crate::py::arrays::tokens(tokens, "tokens") }?;
                let mut me = slf.try_borrow_mut()?;
                $crate::py::request_cache::Design::commit_tokens(&mut me.inner, id, arr, rej).py()
            }

            /// ``commit_tokens`` for many requests, all or nothing: request ``i`` gets
            /// ``tokens[offsets[i]:offsets[i+1]]`` (one id each when ``offsets`` is None) and
            /// ``num_rejected[i]`` rejected drafts (none when None).
            #[pyo3(signature = (request_ids, tokens, offsets = None, num_rejected = None))]
            fn commit_batch(
                slf: &Bound<'_, Self>,
                request_ids: &Bound<'_, PyAny>,
                tokens: &Bound<'_, PyAny>,
                offsets: Option<&Bound<'_, PyAny>>,
                num_rejected: Option<&Bound<'_, PyAny>>,
            ) -> PyResult<()> {
                use $crate::py::errors::IntoPyResult;
                // The arguments whose conversion may run Python code first; then the
                // in-place views.
                let off = $crate::py::lifecycle::opt_int64(offsets, "offsets")?;
                let rej = $crate::py::lifecycle::opt_int64(num_rejected, "num_rejected")?;
                // SAFETY: nothing below runs Python code while the views live (the
                // readers copy or view; the cache is Rust).
                let ids = unsafe { $crate::py::arrays::ids_view(request_ids, "request_ids") }?;
                let arr = unsafe { $crate::py::arrays::tokens(tokens, "tokens") }?;
                let mut me = slf.try_borrow_mut()?;
                $crate::py::request_cache::Design::commit_batch(&mut me.inner, ids, arr, off.as_deref(), rej.as_deref()).py()
            }

            /// Preempts a request (vLLM's ``_preempt_request``): its blocks return to the pool,
            /// its computed positions, drafts and placeholders are dropped; its tokens stay for
            /// ``resume``.
            fn preempt(slf: &Bound<'_, Self>, request_id: &Bound<'_, PyAny>) -> PyResult<()> {
                use $crate::py::errors::IntoPyResult;
                let id = $crate::core::ids::RequestId($crate::py::args::u64_arg(request_id, "request_id")?);
                let mut me = slf.try_borrow_mut()?;
                me.inner.preempt(id).py()
            }

            /// Finishes (or aborts) a request in any state: its blocks return to the pool and
            /// nothing more is cached (``free`` lets the radix cache insert the whole sequence).
            fn finish(slf: &Bound<'_, Self>, request_id: &Bound<'_, PyAny>) -> PyResult<()> {
                use $crate::py::errors::IntoPyResult;
                let id = $crate::core::ids::RequestId($crate::py::args::u64_arg(request_id, "request_id")?);
                let mut me = slf.try_borrow_mut()?;
                me.inner.finish(id).py()
            }

            /// The external KV of a ``delay_cache`` admission landed: its computed positions are
            /// capped at ``num_tokens - 1``, the blocks up to there are cached, and the request
            /// continues with ``schedule``.
            fn finish_transfer(slf: &Bound<'_, Self>, request_id: &Bound<'_, PyAny>) -> PyResult<()> {
                use $crate::py::errors::IntoPyResult;
                let id = $crate::core::ids::RequestId($crate::py::args::u64_arg(request_id, "request_id")?);
                let mut me = slf.try_borrow_mut()?;
                me.inner.finish_transfer(id).py()
            }

            /// A request's lifecycle counters: ``status`` (``running``, ``preempted``,
            /// ``waiting_for_remote_kvs``), ``num_computed`` (positions computed or scheduled),
            /// ``num_tokens`` (known ids), ``pending`` (sampled placeholders), ``drafts`` (of the
            /// step in flight), ``num_preemptions``.
            fn request_state<'py>(
                slf: &Bound<'py, Self>,
                request_id: &Bound<'py, PyAny>,
            ) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
                use $crate::py::errors::IntoPyResult;
                let id = $crate::core::ids::RequestId($crate::py::args::u64_arg(request_id, "request_id")?);
                let (life, n) = {
                    let me = slf.try_borrow()?;
                    (me.inner.life(id).py()?.clone(), me.inner.num_known_tokens(id).py()?)
                };
                $crate::py::lifecycle::state_dict(slf.py(), &life, n)
            }

            /// :attr:`stats` of admissions that resumed a preempted request (vLLM's
            /// ``preempted_*`` prefix-cache stats), counted apart; ``take_stats`` zeroes them too.
            #[getter]
            fn resumed_stats<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
                let s = slf.try_borrow()?.inner.resumed_stats();
                $crate::py::common::stats_dict(slf.py(), s, 0)
            }

            $($own)*
        });
    };
}
pub(crate) use lifecycle_methods;
