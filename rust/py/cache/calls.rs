//! The one-chunk calls of [`PyPrefixCache`] (`admit`, `lookup`, `append`,
//! `checkpoint`, `free` and their batches, `reset`), its block tables and
//! slot mappings, and its counters and checks.

use numpy::{PyArray1, PyArray2};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use super::{each, PyPrefixCache};
use crate::core::ids::{RequestId, TableEntry};
use crate::core::tables::TableSource;
use crate::py::arrays::{self, with_views, Ids, Int64, Tokens, UnfilledI32};
use crate::py::common::{self, Admission, SlotArgs, TableArgs};
use crate::py::errors::{inv_to_py, invalid, IntoPyResult};
use crate::py::{args, keys};

/// The request id argument.
fn rid(request_id: &Bound<'_, PyAny>) -> PyResult<RequestId> {
    args::u64_arg(request_id, "request_id").map(RequestId)
}

#[pymethods]
impl PyPrefixCache {
    /// Not constructible: raises ``InvalidArgumentError`` (build a subclass).
    #[new]
    #[pyo3(signature = (*_args, **_kwargs))]
    fn py_new(_args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        Err(invalid(
            "PrefixCache is the base class of HashChainCache and RadixPrefixCache: build one of \
             those (or kvindex.make_cache)",
        ))
    }

    /// Blocks in the pool, the null block 0 included.
    #[getter]
    fn num_blocks(&self) -> usize {
        self.inner.num_blocks()
    }

    /// Tokens per block (the radix cache's page size).
    #[getter]
    fn block_size(&self) -> usize {
        each!(&self.inner, c => c.table_block_size())
    }

    /// Blocks new work can get now: free blocks plus idle cached ones (the hash chain's
    /// cached blocks in the free queue, the radix tree's evictable pages).
    #[getter]
    fn num_free_blocks(&self) -> usize {
        self.inner.num_free_blocks()
    }

    /// Fraction of usable blocks held by running requests:
    /// ``1 - num_free_blocks / (num_blocks - 1)``.
    #[getter]
    fn usage(&self) -> f64 {
        self.inner.usage()
    }

    /// Running (admitted, not freed) requests.
    #[getter]
    fn num_requests(&self) -> usize {
        each!(&self.inner, c => c.num_requests())
    }

    /// Cached blocks (distinct block hashes; tree pages for the radix cache).
    #[getter]
    fn num_cached_blocks(&self) -> usize {
        self.inner.num_cached_blocks()
    }

    /// Blocks shared by every running request, counted from block 0 (what cascade
    /// attention can share); 0 when no request runs. O(shared blocks).
    #[getter]
    fn num_common_prefix_blocks(&self) -> usize {
        each!(&self.inner, c => c.num_common_prefix_blocks())
    }

    /// ``requests``, ``queries`` (prompt tokens), ``hits`` (cached tokens), ``evictions``
    /// (cached blocks that lost their hash; pages for the radix cache), ``hit_rate``,
    /// ``events_dropped`` (KV events the full buffer dropped, oldest first).
    #[getter]
    fn stats<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyDict>> {
        let (s, d) = each!(&slf.try_borrow()?.inner, c => (c.stats(), c.events_dropped()));
        common::stats_dict(slf.py(), s, d)
    }

    /// Returns :attr:`stats` and zeroes the counters.
    fn take_stats<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyDict>> {
        let (s, d) = each!(&mut slf.try_borrow_mut()?.inner, c => (c.take_stats(), c.take_events_dropped()));
        common::stats_dict(slf.py(), s, d)
    }

    fn __contains__(slf: &Bound<'_, Self>, request_id: &Bound<'_, PyAny>) -> PyResult<bool> {
        let id = rid(request_id)?;
        Ok(each!(&slf.try_borrow()?.inner, c => c.num_tokens(id).is_ok()))
    }

    /// Starts a request: pins the longest cached prefix of the prompt (capped at
    /// ``num_tokens - 1`` and aligned to the block size, so the last prompt token is always
    /// computed) and allocates blocks for the rest. Returns ``None`` with nothing changed
    /// when free blocks run short (idle cached blocks count as available). The hash chain
    /// caches every full prompt block now; the radix cache inserts the sequence at ``free``
    /// or ``checkpoint``. With ``skip_reading`` (vLLM's prompt-logprobs requests) nothing is
    /// read from the cache but the prompt is still cached. The radix cache keys on
    /// ``cache_salt`` and ``lora`` and rejects ``mm_items``. Raises
    /// ``DuplicateRequestError`` for a running id and ``RequestTooLargeError`` (a
    /// ``CapacityError``) for a prompt that needs more blocks than the pool's usable
    /// ``num_blocks - 1``: ``None`` means "not now", the error "never". The hash chain
    /// keeps a refused prompt's hashes for the scheduler's retry of the same id (at most
    /// 32 prompts, oldest dropped first; ``reset()`` releases them).
    #[pyo3(signature = (request_id, tokens, *, cache_salt = None, lora = None, mm_items = None, skip_reading = false))]
    fn admit<'py>(
        slf: &Bound<'py, Self>,
        request_id: &Bound<'py, PyAny>,
        tokens: &Bound<'py, PyAny>,
        #[pyo3(from_py_with = args::named::cache_salt)] cache_salt: Option<String>,
        lora: Option<&Bound<'py, PyAny>>,
        mm_items: Option<&Bound<'py, PyAny>>,
        #[pyo3(from_py_with = args::named::skip_reading)] skip_reading: bool,
    ) -> PyResult<Option<Admission>> {
        let id = rid(request_id)?;
        let spec = keys::spec(cache_salt, lora, mm_items)?;
        // The block-table output is allocated before anything changes (an
        // admission holds ceil(tokens / block_size) blocks), so running out
        // of memory for it is a CapacityError with the cache unchanged.
        let ntok = with_views(Tokens(tokens, "tokens"), |t| arrays::with_tokens!(t, s => s.len()))?;
        let bs = each!(&slf.try_borrow()?.inner, c => c.table_block_size());
        let out = UnfilledI32::new(slf.py(), ntok.div_ceil(bs))?;
        let mut me = slf.try_borrow_mut()?;
        let inner = &mut me.inner;
        let Some(hit) =
            with_views(Tokens(tokens, "tokens"), |t| inner.admit(id, t, spec, skip_reading))?.py()?
        else {
            return Ok(None);
        };
        let ids = each!(&me.inner, c => {
            let blocks = c.blocks(id).py()?;
            out.fill(blocks.iter().map(|b| i32::try_from(b.raw()).expect("block ids fit i32")))
        });
        Ok(Some(Admission::from_array(hit, ids)))
    }

    /// Tokens a prompt would hit now (as ``admit`` counts them). No side effects.
    #[pyo3(signature = (tokens, *, cache_salt = None, lora = None, mm_items = None))]
    fn lookup<'py>(
        slf: &Bound<'py, Self>,
        tokens: &Bound<'py, PyAny>,
        #[pyo3(from_py_with = args::named::cache_salt)] cache_salt: Option<String>,
        lora: Option<&Bound<'py, PyAny>>,
        mm_items: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<usize> {
        let spec = keys::spec(cache_salt, lora, mm_items)?;
        let inner = &mut slf.try_borrow_mut()?.inner;
        with_views(Tokens(tokens, "tokens"), |t| inner.lookup(t, &spec))?.py()
    }

    /// Appends computed decode tokens; allocates a block when one fills (the hash chain
    /// caches every newly full block). ``False`` (nothing changed) when a needed block is
    /// not free.
    fn append(
        slf: &Bound<'_, Self>,
        request_id: &Bound<'_, PyAny>,
        tokens: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        let id = rid(request_id)?;
        let inner = &mut slf.try_borrow_mut()?.inner;
        with_views(Tokens(tokens, "tokens"), |t| inner.append(id, t))?.py()
    }

    /// One step's decode tokens for many requests, all or nothing: request ``i`` gets
    /// ``tokens[offsets[i]:offsets[i+1]]`` (one token each when ``offsets`` is None).
    /// Ids must be distinct. ``False`` (nothing changed) when blocks run short.
    #[pyo3(signature = (request_ids, tokens, offsets = None))]
    fn append_batch(
        slf: &Bound<'_, Self>,
        request_ids: &Bound<'_, PyAny>,
        tokens: &Bound<'_, PyAny>,
        offsets: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let inner = &mut slf.try_borrow_mut()?.inner;
        let views =
            (Ids(request_ids, "request_ids"), Int64::opt(offsets, "offsets"), Tokens(tokens, "tokens"));
        with_views(views, |(ids, off, t)| inner.append_batch(ids, t, off))?.py()
    }

    /// Makes the running request's full blocks hittable by other requests now
    /// (the radix cache inserts them, as SGLang ``cache_unfinished_req``; the
    /// hash chain caches full blocks as they fill, so only the id is checked).
    /// With the lifecycle calls both designs make the same blocks hittable: those
    /// of known ids up to the last step (a block a commit completes, from the next
    /// ``schedule``), none of a ``delay_cache`` admission before ``finish_transfer``.
    fn checkpoint(slf: &Bound<'_, Self>, request_id: &Bound<'_, PyAny>) -> PyResult<()> {
        let id = rid(request_id)?;
        slf.try_borrow_mut()?.inner.checkpoint(id).py()
    }

    /// Finishes a request. The hash chain returns its blocks to the free queue in reverse
    /// order (cached ones stay hittable); the radix cache inserts its full pages into the
    /// tree and returns the rest to the pool.
    fn free(slf: &Bound<'_, Self>, request_id: &Bound<'_, PyAny>) -> PyResult<()> {
        let id = rid(request_id)?;
        each!(&mut slf.try_borrow_mut()?.inner, c => c.free(id)).py()
    }

    /// Finishes many requests, in order; all ids are checked first.
    fn free_batch(slf: &Bound<'_, Self>, request_ids: &Bound<'_, PyAny>) -> PyResult<()> {
        let inner = &mut slf.try_borrow_mut()?.inner;
        with_views(Ids(request_ids, "request_ids"), |ids| each!(inner, c => c.free_batch(ids)))?.py()
    }

    /// Drops every cached block and the refused prompts kept for a retry.
    /// Raises ``BlockInUseError`` while requests run.
    fn reset(slf: &Bound<'_, Self>) -> PyResult<()> {
        each!(&mut slf.try_borrow_mut()?.inner, c => c.reset()).py()
    }

    /// Block tables ``[len(request_ids), max_blocks]`` padded with the null block 0,
    /// written into ``out`` when given (no allocation in the steady state). An output this
    /// machine cannot allocate raises ``CapacityError``.
    #[pyo3(signature = (request_ids, max_blocks = None, out = None))]
    fn block_tables<'py>(
        slf: &Bound<'py, Self>,
        request_ids: &Bound<'py, PyAny>,
        max_blocks: Option<&Bound<'py, PyAny>>,
        out: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyArray2<i32>>> {
        let a = TableArgs::new(request_ids, max_blocks, out)?;
        let me = slf.try_borrow()?;
        let nb = me.inner.num_blocks();
        each!(&me.inner, c => a.run(slf.py(), c, nb))
    }

    /// ``block * block_size + offset`` of each request's last ``query_lens[i]`` tokens,
    /// concatenated. An output this machine cannot allocate raises ``CapacityError``.
    fn slot_mapping<'py>(
        slf: &Bound<'py, Self>,
        request_ids: &Bound<'py, PyAny>,
        query_lens: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let a = SlotArgs::new(request_ids, query_lens)?;
        each!(&slf.try_borrow()?.inner, c => a.run(slf.py(), c))
    }

    /// Tokens a running request holds KV positions for (prompt + appended tokens; with
    /// the lifecycle calls, the positions computed or scheduled, drafts included).
    fn num_tokens(slf: &Bound<'_, Self>, request_id: &Bound<'_, PyAny>) -> PyResult<usize> {
        let id = rid(request_id)?;
        each!(&slf.try_borrow()?.inner, c => c.num_tokens(id)).py()
    }

    /// A running request's block table.
    fn request_blocks<'py>(
        slf: &Bound<'py, Self>,
        request_id: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<i32>>> {
        let id = rid(request_id)?;
        each!(&slf.try_borrow()?.inner, c => common::block_ids_array(slf.py(), c.blocks(id).py()?))
    }

    /// Blocks no request or cache entry holds, in the order the pool hands
    /// them out (the hash chain's free queue also holds idle cached blocks).
    fn free_blocks<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyArray1<i32>>> {
        let v = slf.try_borrow()?.inner.free_blocks();
        common::raw_ids_array(slf.py(), &v)
    }

    /// References on a block (requests holding it, plus the radix tree).
    fn ref_count(slf: &Bound<'_, Self>, block_id: &Bound<'_, PyAny>) -> PyResult<u32> {
        let b = args::i64_arg(block_id, "block_id")?;
        slf.try_borrow()?.inner.ref_count(b)
    }

    /// Raises ``InvariantViolation`` if any internal invariant is broken.
    fn check_invariants(&self) -> PyResult<()> {
        self.inner.check_invariants().map_err(inv_to_py)
    }
}
