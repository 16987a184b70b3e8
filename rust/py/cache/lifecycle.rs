//! The engine-lifecycle calls of [`PyPrefixCache`]: `admit_chunk`, `resume`,
//! `schedule`, `schedule_batch`, `commit_tokens`, `commit_batch`, `preempt`,
//! `finish`, `finish_transfer`, `request_state`, `resumed_stats`. Their
//! argument and result conversions are [`crate::py::lifecycle`]'s; the core
//! ([`crate::core::request`]) does the work.

use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use super::{each, PyPrefixCache};
use crate::core::ids::RequestId;
use crate::core::tables::TableSource;
use crate::py::arrays::{with_views, Ids, Int64, Tokens};
use crate::py::errors::{capacity, IntoPyResult};
use crate::py::lifecycle as lc;
use crate::py::{args, common, keys};

/// The request id argument.
fn rid(request_id: &Bound<'_, PyAny>) -> PyResult<RequestId> {
    args::u64_arg(request_id, "request_id").map(RequestId)
}

#[pymethods]
impl PyPrefixCache {
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
        #[pyo3(from_py_with = args::named::chunk)] chunk: Option<i64>,
        #[pyo3(from_py_with = args::named::lookahead)] lookahead: i64,
        #[pyo3(from_py_with = args::named::must_fit)] must_fit: bool,
        #[pyo3(from_py_with = args::named::external_prefix)] external_prefix: i64,
        #[pyo3(from_py_with = args::named::delay_cache)] delay_cache: bool,
        #[pyo3(from_py_with = args::named::reserved_blocks)] reserved_blocks: i64,
        #[pyo3(from_py_with = args::named::watermark_blocks)] watermark_blocks: i64,
        #[pyo3(from_py_with = args::named::cache_salt)] cache_salt: Option<String>,
        lora: Option<&Bound<'py, PyAny>>,
        mm_items: Option<&Bound<'py, PyAny>>,
        #[pyo3(from_py_with = args::named::skip_reading)] skip_reading: bool,
    ) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let id = rid(request_id)?;
        let o = lc::opts(
            chunk,
            lookahead,
            must_fit,
            external_prefix,
            delay_cache,
            reserved_blocks,
            watermark_blocks,
        )?;
        let spec = keys::spec(cache_salt, lora, mm_items)?;
        let mut me = slf.try_borrow_mut()?;
        let inner = &mut me.inner;
        let Some(s) =
            with_views(Tokens(tokens, "tokens"), |t| inner.admit_chunk(id, t, spec, skip_reading, &o))?
                .py()?
        else {
            return Ok(None);
        };
        each!(&me.inner, c => {
            let new = c.blocks(id).py()?[s.first_new..].to_vec();
            drop(me);
            lc::admitted(slf.py(), s.hit, s.scheduled, &new).map(Some)
        })
    }

    /// Resumes a preempted request with its prompt and outputs so far, as ``admit_chunk``
    /// admits a new one (its hits count in :attr:`resumed_stats`). Same answer.
    #[pyo3(signature = (request_id, *, chunk = None, lookahead = 0, must_fit = false, external_prefix = 0, delay_cache = false, reserved_blocks = 0, watermark_blocks = 0))]
    #[allow(clippy::too_many_arguments, clippy::fn_params_excessive_bools)]
    fn resume<'py>(
        slf: &Bound<'py, Self>,
        request_id: &Bound<'py, PyAny>,
        #[pyo3(from_py_with = args::named::chunk)] chunk: Option<i64>,
        #[pyo3(from_py_with = args::named::lookahead)] lookahead: i64,
        #[pyo3(from_py_with = args::named::must_fit)] must_fit: bool,
        #[pyo3(from_py_with = args::named::external_prefix)] external_prefix: i64,
        #[pyo3(from_py_with = args::named::delay_cache)] delay_cache: bool,
        #[pyo3(from_py_with = args::named::reserved_blocks)] reserved_blocks: i64,
        #[pyo3(from_py_with = args::named::watermark_blocks)] watermark_blocks: i64,
    ) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let id = rid(request_id)?;
        let o = lc::opts(
            chunk,
            lookahead,
            must_fit,
            external_prefix,
            delay_cache,
            reserved_blocks,
            watermark_blocks,
        )?;
        let mut me = slf.try_borrow_mut()?;
        each!(&mut me.inner, c => {
            let Some(s) = c.resume(id, &o).py()? else { return Ok(None) };
            let new = c.blocks(id).py()?[s.first_new..].to_vec();
            drop(me);
            lc::admitted(slf.py(), s.hit, s.scheduled, &new).map(Some)
        })
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
        #[pyo3(from_py_with = args::named::num_new_tokens)] num_new_tokens: i64,
        #[pyo3(from_py_with = args::named::lookahead)] lookahead: i64,
        draft_tokens: Option<&Bound<'py, PyAny>>,
        #[pyo3(from_py_with = args::named::reserved_blocks)] reserved_blocks: i64,
    ) -> PyResult<Option<Bound<'py, PyArray1<i32>>>> {
        let id = rid(request_id)?;
        let n = lc::positive(num_new_tokens, "num_new_tokens")?;
        let la = lc::count(lookahead, "lookahead")?;
        let reserved = lc::count(reserved_blocks, "reserved_blocks")?;
        let drafts = lc::drafts(draft_tokens)?;
        let mut me = slf.try_borrow_mut()?;
        each!(&mut me.inner, c => {
            let Some(first) = c.schedule(id, n, &drafts, la, reserved).py()? else { return Ok(None) };
            let new = c.blocks(id).py()?[first..].to_vec();
            drop(me);
            common::block_ids_array(slf.py(), &new).map(Some)
        })
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
        #[pyo3(from_py_with = args::named::lookahead)] lookahead: i64,
        draft_tokens: Option<&Bound<'py, PyAny>>,
        draft_offsets: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let la = lc::count(lookahead, "lookahead")?;
        let drafts = lc::drafts(draft_tokens)?;
        let mut me = slf.try_borrow_mut()?;
        let views = (
            Int64::opt(draft_offsets, "draft_offsets"),
            Ids(request_ids, "request_ids"),
            Int64(num_new_tokens, "num_new_tokens"),
        );
        each!(&mut me.inner, c => {
            let (done, blocks, offsets) = with_views(views, |(off, ids, n)| {
                let mut blocks = Vec::new();
                let mut offsets = Vec::new();
                offsets
                    .try_reserve_exact(ids.len() + 1)
                    .map_err(|_| capacity(format!("cannot allocate {} block offsets", ids.len() + 1)))?;
                let done = c.schedule_batch(ids, n, &drafts, off, la, &mut blocks, &mut offsets).py()?;
                Ok::<_, PyErr>((done, blocks, offsets))
            })??;
            drop(me);
            lc::scheduled_batch(slf.py(), done, &blocks, &offsets)
        })
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
        #[pyo3(from_py_with = args::named::num_rejected)] num_rejected: i64,
    ) -> PyResult<()> {
        let id = rid(request_id)?;
        let rej = lc::count(num_rejected, "num_rejected")?;
        let inner = &mut slf.try_borrow_mut()?.inner;
        with_views(Tokens(tokens, "tokens"), |t| inner.commit_tokens(id, t, rej))?.py()
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
        let inner = &mut slf.try_borrow_mut()?.inner;
        let views = (
            (Int64::opt(offsets, "offsets"), Int64::opt(num_rejected, "num_rejected")),
            Ids(request_ids, "request_ids"),
            Tokens(tokens, "tokens"),
        );
        with_views(views, |((off, rej), ids, t)| inner.commit_batch(ids, t, off, rej))?.py()
    }

    /// Preempts a request (vLLM's ``_preempt_request``): its blocks return to the pool,
    /// its computed positions, drafts and placeholders are dropped; its tokens stay for
    /// ``resume``.
    fn preempt(slf: &Bound<'_, Self>, request_id: &Bound<'_, PyAny>) -> PyResult<()> {
        let id = rid(request_id)?;
        each!(&mut slf.try_borrow_mut()?.inner, c => c.preempt(id)).py()
    }

    /// Finishes (or aborts) a request in any state: its blocks return to the pool and
    /// nothing more is cached (``free`` lets the radix cache insert the whole sequence).
    fn finish(slf: &Bound<'_, Self>, request_id: &Bound<'_, PyAny>) -> PyResult<()> {
        let id = rid(request_id)?;
        each!(&mut slf.try_borrow_mut()?.inner, c => c.finish(id)).py()
    }

    /// The external KV of a ``delay_cache`` admission landed: its computed positions are
    /// capped at ``num_tokens - 1``, the blocks up to there are cached, and the request
    /// continues with ``schedule``.
    fn finish_transfer(slf: &Bound<'_, Self>, request_id: &Bound<'_, PyAny>) -> PyResult<()> {
        let id = rid(request_id)?;
        each!(&mut slf.try_borrow_mut()?.inner, c => c.finish_transfer(id)).py()
    }

    /// A request's lifecycle counters: ``status`` (``running``, ``preempted``,
    /// ``waiting_for_remote_kvs``), ``num_computed`` (positions computed or scheduled),
    /// ``num_tokens`` (known ids), ``pending`` (sampled placeholders), ``drafts`` (of the
    /// step in flight), ``num_preemptions``.
    fn request_state<'py>(
        slf: &Bound<'py, Self>,
        request_id: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let id = rid(request_id)?;
        let (life, n) =
            each!(&slf.try_borrow()?.inner, c => (c.life(id).py()?.clone(), c.num_known_tokens(id).py()?));
        lc::state_dict(slf.py(), &life, n)
    }

    /// :attr:`stats` of admissions that resumed a preempted request (vLLM's
    /// ``preempted_*`` prefix-cache stats), counted apart; ``take_stats`` zeroes them too.
    #[getter]
    fn resumed_stats<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyDict>> {
        let s = each!(&slf.try_borrow()?.inner, c => c.resumed_stats());
        common::stats_dict(slf.py(), s, 0)
    }
}
