//! `_VllmFront`: the calls vLLM's scheduler makes on every running request
//! every step — `allocate_slots`, `cache_blocks`, `estimate_cached_tokens` —
//! answered without a Python frame.
//!
//! `kvindex.integrations.vllm.KVCacheManager` installs these bound methods on
//! its instance in place of its own (its class keeps the general Python
//! methods, with vLLM's signatures). Each call reads the request's table from
//! the Rust manager (no mirror to keep in step) and decides, for a request
//! that holds a table and a step with no hit to adopt, no connector tokens,
//! no full-sequence check and no reserved blocks:
//!
//! - **no-op**: the held slots cover the step (lookahead included) and no
//!   held block becomes cacheable: vLLM's empty `KVCacheBlocks`, nothing
//!   changed, nothing logged;
//! - **cache only**: the held slots cover the step but a block filled: the
//!   Rust `cache` call, then the empty result;
//! - **new blocks**: the held slots do not cover the step: the Rust
//!   allocation and its caching step in one call, then vLLM's
//!   `KVCacheBlocks` of the new blocks (or None: out of blocks).
//!
//! The last two need caching on and nothing else watching the allocation
//! (no KV events, no metrics collector: the manager's `cache_only`), and no
//! delayed caching or watermark to apply. Anything else (an admission, a hit,
//! a connector's tokens, an argument this path does not read) goes to the
//! Python method with the caller's arguments as given.
//!
//! The no-op tests are sufficient conditions: each count they compare is at
//! most what the general path computes, so a call answered as a no-op is one
//! the general path answers with the same result and no state change; the
//! other two make the general path's own Rust calls with its arguments.
//! Arithmetic on the caller's integers saturates (an absurd count is never
//! answered as a no-op by wrapping around; the general path rejects it).
//! Costs: one attribute read per request field used, one map probe by the
//! request id; no allocation on the no-op path; one `KVCacheBlock` reference
//! per new block.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyInt, PyList, PyString, PyTuple};
use pyo3::{intern, PyTraverseError, PyVisit};

use super::errors::invalid;
use super::vllm_manager::PyVllmManager;
use crate::core::vllm_manager::SlotRequest;

/// The Python objects the front calls, reads or returns.
struct Refs {
    /// The manager's general `allocate_slots` (bound).
    allocate: Py<PyAny>,
    /// The manager's general `cache_blocks` (bound).
    cache: Py<PyAny>,
    /// vLLM's empty `KVCacheBlocks` (the manager's `empty_kv_cache_blocks`).
    empty: Py<PyAny>,
    /// vLLM's `KVCacheBlocks` class.
    blocks_cls: Py<PyAny>,
    /// The pool's `KVCacheBlock` objects, by block id.
    blocks: Py<PyList>,
    /// The manager's `get_blocks` results per request id, dropped when a
    /// request's table changes.
    tables: Py<PyDict>,
    /// `RequestStatus.WAITING` / `.PREEMPTED`: the statuses the watermark gates.
    admitting: [Py<PyAny>; 2],
}

/// The native per-step calls of one `KVCacheManager` (module doc).
#[pyclass(module = "kvindex._core", name = "_VllmFront")]
pub struct PyVllmFront {
    core: Py<PyVllmManager>,
    /// None once the garbage collector cleared the cycle through the manager.
    refs: Option<Refs>,
    block_size: i64,
    /// Tokens at the end of a request's computed tokens that are prefilled
    /// again (multi-module MTP) and never cached.
    reprefill: i64,
    max_model_len: i64,
    caching: bool,
    /// Whether `allocate_slots` may cache and allocate here (caching on, no KV
    /// events, no metrics collector: nothing else watches it).
    cache_only: bool,
    /// Whether caching emits KV events (then `cache_blocks` that caches goes
    /// to the Python method, which builds them).
    events: bool,
    /// Whether the manager has a watermark (admissions then go to Python).
    watermark: bool,
}

/// An optional argument as the caller gave it: absent, or any object (None
/// included, which the general path may reject: it is passed on as given).
pub enum Given<'py> {
    Absent,
    Obj(Bound<'py, PyAny>),
}

impl<'a, 'py> FromPyObject<'a, 'py> for Given<'py> {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        Ok(Given::Obj(obj.to_owned()))
    }
}

impl Given<'_> {
    /// The argument's truth value (absent: false), as Python's `not x`.
    fn truthy(&self) -> PyResult<bool> {
        match self {
            Given::Absent => Ok(false),
            Given::Obj(o) => o.is_truthy(),
        }
    }

    /// Whether it is absent or None.
    fn is_none(&self) -> bool {
        match self {
            Given::Absent => true,
            Given::Obj(o) => o.is_none(),
        }
    }
}

/// `allocate_slots`' optional arguments, in vLLM's order.
struct StepArgs<'py> {
    num_new_computed_tokens: Given<'py>,
    new_computed_blocks: Given<'py>,
    num_lookahead_tokens: Given<'py>,
    num_external_computed_tokens: Given<'py>,
    delay_cache_blocks: Given<'py>,
    num_encoder_tokens: Given<'py>,
    full_sequence_must_fit: Given<'py>,
    reserved_blocks: Given<'py>,
    has_scheduled_reqs: Given<'py>,
    skip_zeroing_group_ids: Given<'py>,
}

impl<'py> StepArgs<'py> {
    /// The arguments the caller gave, by name (for the general path).
    fn kwargs(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let kwargs = PyDict::new(py);
        for (name, v) in [
            (intern!(py, "num_new_computed_tokens"), &self.num_new_computed_tokens),
            (intern!(py, "new_computed_blocks"), &self.new_computed_blocks),
            (intern!(py, "num_lookahead_tokens"), &self.num_lookahead_tokens),
            (intern!(py, "num_external_computed_tokens"), &self.num_external_computed_tokens),
            (intern!(py, "delay_cache_blocks"), &self.delay_cache_blocks),
            (intern!(py, "num_encoder_tokens"), &self.num_encoder_tokens),
            (intern!(py, "full_sequence_must_fit"), &self.full_sequence_must_fit),
            (intern!(py, "reserved_blocks"), &self.reserved_blocks),
            (intern!(py, "has_scheduled_reqs"), &self.has_scheduled_reqs),
            (intern!(py, "skip_zeroing_group_ids"), &self.skip_zeroing_group_ids),
        ] {
            if let Given::Obj(v) = v {
                kwargs.set_item(name, v)?;
            }
        }
        Ok(kwargs)
    }

    /// The lookahead slots when this is a running request's plain step (no
    /// hit, connector tokens, full-sequence check or reserved blocks), else
    /// None.
    fn plain_step(&self) -> PyResult<Option<i64>> {
        let lookahead = match &self.num_lookahead_tokens {
            Given::Absent => 0,
            Given::Obj(v) => match exact_int(v) {
                Some(k) if k >= 0 => k,
                _ => return Ok(None),
            },
        };
        if !self.new_computed_blocks.is_none()
            || self.num_new_computed_tokens.truthy()?
            || self.num_external_computed_tokens.truthy()?
            || self.full_sequence_must_fit.truthy()?
            || self.reserved_blocks.truthy()?
        {
            return Ok(None);
        }
        Ok(Some(lookahead))
    }
}

/// An exact `int` that fits `i64`, else None (the caller then takes the
/// general path, which handles or rejects anything else).
fn exact_int(obj: &Bound<'_, PyAny>) -> Option<i64> {
    if obj.is_exact_instance_of::<PyInt>() {
        obj.extract::<i64>().ok()
    } else {
        None
    }
}

/// A non-negative `i64` as a count.
fn size(v: i64) -> usize {
    usize::try_from(v.max(0)).unwrap_or(usize::MAX)
}

/// The manager is inside another call (a callback re-entered it).
fn busy() -> PyErr {
    invalid("the KVCacheManager is busy with another call on this thread".to_owned())
}

/// The request's id as a `str`, or None (the general path then answers).
fn request_id<'py>(request: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyString>>> {
    let rid = request.getattr(intern!(request.py(), "request_id"))?;
    Ok(rid.cast_into::<PyString>().ok())
}

impl PyVllmFront {
    fn refs(&self) -> PyResult<&Refs> {
        self.refs.as_ref().ok_or_else(|| invalid("this KVCacheManager was cleared".to_owned()))
    }

    /// Whether the watermark gates this call (then it goes to Python).
    fn gated(&self, request: &Bound<'_, PyAny>, has_scheduled_reqs: &Given<'_>) -> PyResult<bool> {
        if !self.watermark {
            return Ok(false);
        }
        if let Given::Obj(h) = has_scheduled_reqs {
            if !h.is_truthy()? {
                return Ok(false);
            }
        }
        let py = request.py();
        let status = request.getattr(intern!(py, "status"))?;
        let [waiting, preempted] = &self.refs()?.admitting;
        Ok(status.eq(waiting.bind(py))? || status.eq(preempted.bind(py))?)
    }

    /// The request's `(table length, cached blocks)`, or None without a table.
    fn state(&self, py: Python<'_>, rid: &str) -> PyResult<Option<(i64, i64)>> {
        let core = self.core.try_borrow(py).map_err(|_| busy())?;
        Ok(core.inner.table_state(rid).map(|(held, cached)| {
            (i64::try_from(held).unwrap_or(i64::MAX), i64::try_from(cached.unwrap_or(0)).unwrap_or(i64::MAX))
        }))
    }

    /// Caches the request's full blocks up to `upto` tokens (the Rust call
    /// the general path makes).
    fn cache(&self, py: Python<'_>, rid: &str, hashes: &Bound<'_, PyAny>, upto: i64) -> PyResult<()> {
        let mut core = self.core.try_borrow_mut(py).map_err(|_| busy())?;
        core.cache(rid, hashes, upto)?;
        Ok(())
    }

    /// Whether a step from `done` to `end` computed tokens (plus
    /// `lookahead` slots) is a no-op for a request holding `held` blocks,
    /// `cached` of them cached, decided without reading its hashes.
    fn quick_noop(&self, done: i64, end: i64, lookahead: i64, held: i64, cached: i64, delay: bool) -> bool {
        if done < 0 || end.saturating_add(lookahead) > held.saturating_mul(self.block_size) {
            return false;
        }
        !self.caching
            || delay
            || held <= cached
            || end.saturating_sub(self.reprefill).div_euclid(self.block_size) <= cached
    }

    /// `KVCacheBlocks((blocks,))`.
    fn kv_blocks<'py>(&self, py: Python<'py>, blocks: Bound<'py, PyList>) -> PyResult<Bound<'py, PyAny>> {
        self.refs()?.blocks_cls.bind(py).call1((PyTuple::new(py, [blocks])?,))
    }

    /// vLLM's answer to a running request's step when this path gives it:
    /// `Some(result)` (the empty result, new blocks, or None: out of blocks),
    /// or None when the general path must answer.
    fn running_step<'py>(
        &self,
        request: &Bound<'py, PyAny>,
        num_new_tokens: &Bound<'py, PyAny>,
        args: &StepArgs<'py>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let py = request.py();
        let Some(n) = exact_int(num_new_tokens).filter(|&n| n > 0) else { return Ok(None) };
        let Some(lookahead) = args.plain_step()? else { return Ok(None) };
        let Some(rid_obj) = request_id(request)? else { return Ok(None) };
        let rid = rid_obj.to_str()?;
        let Some((held, cached)) = self.state(py, rid)? else { return Ok(None) };
        let Some(done) = exact_int(&request.getattr(intern!(py, "num_computed_tokens"))?) else {
            return Ok(None);
        };
        if done < 0 {
            return Ok(None);
        }
        let delay = args.delay_cache_blocks.truthy()?;
        let end = done.saturating_add(n);
        let empty = || Ok(Some(self.refs()?.empty.bind(py).clone()));
        if self.quick_noop(done, end, lookahead, held, cached, delay) {
            return if self.gated(request, &args.has_scheduled_reqs)? { Ok(None) } else { empty() };
        }
        // Past quick_noop, delayed caching means the slots do not suffice.
        let fits = end.saturating_add(lookahead) <= held.saturating_mul(self.block_size);
        if delay || !(fits || self.cache_only) {
            return Ok(None);
        }
        let hashes = request.getattr(intern!(py, "block_hashes"))?;
        if fits && i64::try_from(hashes.len()?).unwrap_or(i64::MAX) <= cached {
            // No held block can be cached without more hashes: a no-op.
            return if self.gated(request, &args.has_scheduled_reqs)? { Ok(None) } else { empty() };
        }
        if !self.cache_only
            || (fits && end > self.max_model_len)
            || self.gated(request, &args.has_scheduled_reqs)?
        {
            return Ok(None);
        }
        let Some(num_tokens) = exact_int(&request.getattr(intern!(py, "num_tokens"))?) else {
            return Ok(None);
        };
        if fits {
            self.cache(py, rid, &hashes, end.min(num_tokens).saturating_sub(self.reprefill).max(0))?;
            return empty();
        }
        // New blocks, then the caching step, in one call (the general path's).
        let max_len = self.max_model_len;
        let total = done.min(max_len);
        let slots = SlotRequest {
            num_tokens_need_slot: size(end.saturating_add(lookahead).min(max_len)),
            num_local_computed: size(total),
            ..SlotRequest::default()
        };
        let upto = total.saturating_add(n).min(num_tokens).saturating_sub(self.reprefill).max(0);
        let res = {
            let mut core = self.core.try_borrow_mut(py).map_err(|_| busy())?;
            core.allocate_then_cache(rid, &[], &slots, Some((&hashes, upto)))?
        };
        let Some((new, held_after, _)) = res else { return Ok(Some(py.None().into_bound(py))) };
        if new.is_empty() {
            return empty();
        }
        let refs = self.refs()?;
        let pool = refs.blocks.bind(py);
        let new_blocks = PyList::empty(py);
        for b in &new {
            new_blocks.append(pool.get_item(b.0 as usize)?)?;
        }
        let tables = refs.tables.bind(py);
        if held_after == new.len() {
            let copy = PyList::new(py, new_blocks.iter())?;
            tables.set_item(&rid_obj, self.kv_blocks(py, copy)?)?;
        } else if tables.contains(&rid_obj)? {
            tables.del_item(&rid_obj)?;
        }
        Ok(Some(self.kv_blocks(py, new_blocks)?))
    }
}

#[pymethods]
impl PyVllmFront {
    /// The front of ``core`` for one manager: ``allocate`` / ``cache`` are its general
    /// ``allocate_slots`` / ``cache_blocks`` (bound), ``empty`` its empty result,
    /// ``blocks_cls`` vLLM's ``KVCacheBlocks``, ``blocks`` its ``KVCacheBlock`` objects by
    /// id, ``tables`` its ``get_blocks`` results by request id, ``admitting`` the request
    /// statuses its watermark gates.
    #[new]
    #[pyo3(signature = (core, *, allocate, cache, empty, blocks_cls, blocks, tables, admitting, block_size, reprefill, max_model_len, caching, cache_only, events, watermark))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        core: Py<PyVllmManager>,
        allocate: Py<PyAny>,
        cache: Py<PyAny>,
        empty: Py<PyAny>,
        blocks_cls: Py<PyAny>,
        blocks: Py<PyList>,
        tables: Py<PyDict>,
        admitting: (Py<PyAny>, Py<PyAny>),
        block_size: i64,
        reprefill: i64,
        max_model_len: i64,
        caching: bool,
        cache_only: bool,
        events: bool,
        watermark: bool,
    ) -> PyResult<Self> {
        if block_size < 1 || reprefill < 0 || max_model_len < 0 {
            return Err(invalid(format!(
                "block_size must be >= 1 and reprefill, max_model_len >= 0 (got {block_size}, \
                 {reprefill}, {max_model_len})"
            )));
        }
        Ok(PyVllmFront {
            core,
            refs: Some(Refs {
                allocate,
                cache,
                empty,
                blocks_cls,
                blocks,
                tables,
                admitting: [admitting.0, admitting.1],
            }),
            block_size,
            reprefill,
            max_model_len,
            caching,
            cache_only: cache_only && caching,
            events,
            watermark,
        })
    }

    /// vLLM's ``allocate_slots`` (the manager's; a running request's plain step is
    /// answered here, module doc).
    #[pyo3(signature = (request, num_new_tokens, num_new_computed_tokens = Given::Absent, new_computed_blocks = Given::Absent, num_lookahead_tokens = Given::Absent, num_external_computed_tokens = Given::Absent, delay_cache_blocks = Given::Absent, num_encoder_tokens = Given::Absent, full_sequence_must_fit = Given::Absent, reserved_blocks = Given::Absent, has_scheduled_reqs = Given::Absent, skip_zeroing_group_ids = Given::Absent))]
    #[pyo3(
        text_signature = "(self, request, num_new_tokens, num_new_computed_tokens=0, new_computed_blocks=None, num_lookahead_tokens=0, num_external_computed_tokens=0, delay_cache_blocks=False, num_encoder_tokens=0, full_sequence_must_fit=False, reserved_blocks=0, has_scheduled_reqs=True, skip_zeroing_group_ids=())"
    )]
    #[allow(clippy::too_many_arguments)]
    fn allocate_slots<'py>(
        &self,
        request: &Bound<'py, PyAny>,
        num_new_tokens: &Bound<'py, PyAny>,
        num_new_computed_tokens: Given<'py>,
        new_computed_blocks: Given<'py>,
        num_lookahead_tokens: Given<'py>,
        num_external_computed_tokens: Given<'py>,
        delay_cache_blocks: Given<'py>,
        num_encoder_tokens: Given<'py>,
        full_sequence_must_fit: Given<'py>,
        reserved_blocks: Given<'py>,
        has_scheduled_reqs: Given<'py>,
        skip_zeroing_group_ids: Given<'py>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let args = StepArgs {
            num_new_computed_tokens,
            new_computed_blocks,
            num_lookahead_tokens,
            num_external_computed_tokens,
            delay_cache_blocks,
            num_encoder_tokens,
            full_sequence_must_fit,
            reserved_blocks,
            has_scheduled_reqs,
            skip_zeroing_group_ids,
        };
        if let Some(answer) = self.running_step(request, num_new_tokens, &args)? {
            return Ok(answer);
        }
        let py = request.py();
        self.refs()?.allocate.bind(py).call((request, num_new_tokens), Some(&args.kwargs(py)?))
    }

    /// vLLM's ``cache_blocks`` (the manager's, answered here when it caches nothing, or
    /// caches without KV events to build).
    fn cache_blocks(
        &self,
        request: &Bound<'_, PyAny>,
        num_computed_tokens: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        if !self.caching {
            return Ok(());
        }
        let py = request.py();
        let general = || self.refs()?.cache.bind(py).call1((request, num_computed_tokens)).map(|_| ());
        let Some(n) = exact_int(num_computed_tokens) else { return general() };
        let Some(rid_obj) = request_id(request)? else { return general() };
        let rid = rid_obj.to_str()?;
        let state = self.state(py, rid)?;
        if let Some((held, cached)) = state {
            if n.saturating_sub(self.reprefill).div_euclid(self.block_size) <= cached || held <= cached {
                return Ok(());
            }
        }
        let hashes = request.getattr(intern!(py, "block_hashes"))?;
        if let Some((_, cached)) = state {
            if i64::try_from(hashes.len()?).unwrap_or(i64::MAX) <= cached {
                return Ok(());
            }
        }
        if self.events {
            return general();
        }
        self.cache(py, rid, &hashes, n.saturating_sub(self.reprefill).max(0))
    }

    /// Tokens the request's table holds cached blocks for (vLLM's
    /// ``estimate_cached_tokens``).
    fn estimate_cached_tokens(&self, request: &Bound<'_, PyAny>) -> PyResult<i64> {
        let py = request.py();
        let rid = request_id(request)?.ok_or_else(|| invalid("request_id must be a str".to_owned()))?;
        let core = self.core.try_borrow(py).map_err(|_| busy())?;
        let n = core.inner.num_cached(rid.to_str()?).unwrap_or(0);
        Ok(i64::try_from(n).unwrap_or(i64::MAX).saturating_mul(self.block_size))
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.core)?;
        if let Some(r) = &self.refs {
            for obj in [&r.allocate, &r.cache, &r.empty, &r.blocks_cls, &r.admitting[0], &r.admitting[1]] {
                visit.call(obj)?;
            }
            visit.call(&r.blocks)?;
            visit.call(&r.tables)?;
        }
        Ok(())
    }

    fn __clear__(&mut self) {
        self.refs = None;
    }
}
