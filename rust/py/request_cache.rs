//! One binding for both request-level caches (`HashChainCache`,
//! `RadixPrefixCache`): [`Design`] adapts each core cache to the methods the
//! Python classes share, and [`request_cache_class!`] writes those methods
//! once for any class holding a `Design` in its `inner` field.
//!
//! # Arguments before borrows
//! Every method converts all of its arguments first (request ids and ints
//! through [`super::args`], whose `__index__` may run Python code and release
//! the GIL; key arguments, whose `mm_items` may be a generator), and only then
//! borrows the cache, for the core work alone. So a call whose argument
//! releases the GIL never holds the cache borrowed, and concurrent calls from
//! other threads are serialised by the GIL instead of failing with
//! "Already borrowed". Output objects that may run Python code (dicts, lists)
//! are built after the borrow ends.

use crate::core::error::{InvariantViolation, KvResult};
use crate::core::events::KvEvent;
use crate::core::hash::KeySpec;
use crate::core::hash_chain::HashChainCache;
use crate::core::ids::{RequestId, TableEntry};
use crate::core::radix_cache::{narrow_tokens, RadixPrefixCache};
use crate::core::request::{Scheduled, Stats, StepOpts};
use crate::core::tables::TableSource;

use super::arrays::{with_tokens, TokenArray};

/// What the shared binding needs from a request-level cache.
pub trait Design: TableSource {
    /// Admits a request (see the core cache).
    ///
    /// # Errors
    /// As the core cache's `admit`.
    fn admit(
        &mut self,
        id: RequestId,
        toks: TokenArray<'_>,
        spec: KeySpec,
        skip: bool,
    ) -> KvResult<Option<usize>>;
    /// Tokens a prompt would hit now.
    ///
    /// # Errors
    /// As the core cache's `lookup`.
    fn lookup(&mut self, toks: TokenArray<'_>, spec: &KeySpec) -> KvResult<usize>;
    /// Appends computed tokens.
    ///
    /// # Errors
    /// As the core cache's `append`.
    fn append(&mut self, id: RequestId, toks: TokenArray<'_>) -> KvResult<bool>;
    /// Appends a CSR batch, all or nothing.
    ///
    /// # Errors
    /// As the core cache's `append_batch`.
    fn append_batch(&mut self, ids: &[u64], toks: TokenArray<'_>, offsets: Option<&[i64]>) -> KvResult<bool>;
    /// Admits a request's first chunk (see the core's `admit_chunk`).
    ///
    /// # Errors
    /// As the core cache's `admit_chunk`.
    fn admit_chunk(
        &mut self,
        id: RequestId,
        toks: TokenArray<'_>,
        spec: KeySpec,
        skip: bool,
        opts: &StepOpts,
    ) -> KvResult<Option<Scheduled>>;
    /// Commits sampled ids (see the core's `commit_tokens`).
    ///
    /// # Errors
    /// As the core cache's `commit_tokens`.
    fn commit_tokens(&mut self, id: RequestId, toks: TokenArray<'_>, num_rejected: usize) -> KvResult<()>;
    /// Commits a CSR batch of sampled ids, all or nothing.
    ///
    /// # Errors
    /// As the core cache's `commit_batch`.
    fn commit_batch(
        &mut self,
        ids: &[u64],
        toks: TokenArray<'_>,
        offsets: Option<&[i64]>,
        num_rejected: Option<&[i64]>,
    ) -> KvResult<()>;
    /// Makes the request's full blocks hittable now.
    ///
    /// # Errors
    /// `UnknownRequest`.
    fn checkpoint(&mut self, id: RequestId) -> KvResult<()>;
    /// Finishes a request.
    ///
    /// # Errors
    /// `UnknownRequest`.
    fn free(&mut self, id: RequestId) -> KvResult<()>;
    /// Finishes several requests.
    ///
    /// # Errors
    /// As the core cache's `free_batch`.
    fn free_batch(&mut self, ids: &[u64]) -> KvResult<()>;
    /// Drops every cached block.
    ///
    /// # Errors
    /// `BlockInUse` while requests run.
    fn reset(&mut self) -> KvResult<()>;
    /// Drains buffered KV events.
    fn take_events(&mut self) -> Vec<KvEvent>;
    /// Events the full buffer dropped since the last take.
    fn events_dropped(&self) -> u64;
    /// Returns [`Design::events_dropped`] and zeroes it.
    fn take_events_dropped(&mut self) -> u64;
    /// Counters.
    fn stats(&self) -> Stats;
    /// Counters, zeroed.
    fn take_stats(&mut self) -> Stats;
    /// Pool size, the null block included.
    fn num_blocks(&self) -> usize;
    /// Blocks new work can get now.
    fn num_free_blocks(&self) -> usize;
    /// Fraction of usable blocks held by running requests.
    fn usage(&self) -> f64;
    /// Running requests.
    fn num_requests(&self) -> usize;
    /// Blocks shared by every running request, from block 0.
    fn num_common_prefix_blocks(&self) -> usize;
    /// Cached blocks.
    fn num_cached_blocks(&self) -> usize;
    /// References on block `b` (checked to be in range).
    fn ref_count(&self, b: Self::Entry) -> u32;
    /// Blocks with no holder, in the order the pool hands them out.
    fn free_blocks(&self) -> Vec<Self::Entry>;
    /// Checks every internal invariant.
    ///
    /// # Errors
    /// The first broken invariant.
    fn check_invariants(&self) -> Result<(), InvariantViolation>;
}

/// Implements [`Design`] methods by calling the core cache's inherent method
/// of the same name and signature (`ref` methods take `&self`, `mut` ones
/// `&mut self`).
macro_rules! forward {
    ($core:ident;
     ref { $( $name:ident($($a:ident: $t:ty),*) -> $r:ty; )* }
     mut { $( $mname:ident($($ma:ident: $mt:ty),*) -> $mr:ty; )* }) => {
        $( fn $name(&self $(, $a: $t)*) -> $r { $core::$name(self $(, $a)*) } )*
        $( fn $mname(&mut self $(, $ma: $mt)*) -> $mr { $core::$mname(self $(, $ma)*) } )*
    };
}

impl Design for HashChainCache {
    forward!(HashChainCache;
        ref {
            events_dropped() -> u64;
            stats() -> Stats;
            num_requests() -> usize;
            num_common_prefix_blocks() -> usize;
            check_invariants() -> Result<(), InvariantViolation>;
        }
        mut {
            free(id: RequestId) -> KvResult<()>;
            free_batch(ids: &[u64]) -> KvResult<()>;
            reset() -> KvResult<()>;
            take_events() -> Vec<KvEvent>;
            take_events_dropped() -> u64;
            take_stats() -> Stats;
        }
    );
    fn admit(
        &mut self,
        id: RequestId,
        toks: TokenArray<'_>,
        spec: KeySpec,
        skip: bool,
    ) -> KvResult<Option<usize>> {
        with_tokens!(toks, s => HashChainCache::admit(self, id, s, spec, skip))
    }
    fn lookup(&mut self, toks: TokenArray<'_>, spec: &KeySpec) -> KvResult<usize> {
        with_tokens!(toks, s => HashChainCache::lookup(self, s, spec))
    }
    fn append(&mut self, id: RequestId, toks: TokenArray<'_>) -> KvResult<bool> {
        with_tokens!(toks, s => HashChainCache::append(self, id, s))
    }
    fn append_batch(&mut self, ids: &[u64], toks: TokenArray<'_>, offsets: Option<&[i64]>) -> KvResult<bool> {
        with_tokens!(toks, s => HashChainCache::append_batch(self, ids, s, offsets))
    }
    fn admit_chunk(
        &mut self,
        id: RequestId,
        toks: TokenArray<'_>,
        spec: KeySpec,
        skip: bool,
        opts: &StepOpts,
    ) -> KvResult<Option<Scheduled>> {
        with_tokens!(toks, s => HashChainCache::admit_chunk(self, id, s, spec, skip, opts))
    }
    fn commit_tokens(&mut self, id: RequestId, toks: TokenArray<'_>, num_rejected: usize) -> KvResult<()> {
        with_tokens!(toks, s => HashChainCache::commit_tokens(self, id, s, num_rejected))
    }
    fn commit_batch(
        &mut self,
        ids: &[u64],
        toks: TokenArray<'_>,
        offsets: Option<&[i64]>,
        num_rejected: Option<&[i64]>,
    ) -> KvResult<()> {
        with_tokens!(toks, s => HashChainCache::commit_batch(self, ids, s, offsets, num_rejected))
    }
    fn checkpoint(&mut self, id: RequestId) -> KvResult<()> {
        // Full blocks are cached as they fill: only the id is checked.
        self.num_tokens(id).map(|_| ())
    }
    fn num_blocks(&self) -> usize {
        self.pool().num_blocks()
    }
    fn num_free_blocks(&self) -> usize {
        self.pool().num_free()
    }
    fn usage(&self) -> f64 {
        self.pool().usage()
    }
    fn num_cached_blocks(&self) -> usize {
        self.pool().num_cached_hashes()
    }
    fn ref_count(&self, b: Self::Entry) -> u32 {
        self.pool().ref_count(b)
    }
    fn free_blocks(&self) -> Vec<Self::Entry> {
        self.pool().free_queue().collect()
    }
}

/// Runs `f` on the tokens as int32 (int64 input is narrowed, range-checked).
fn as_i32<R>(toks: TokenArray<'_>, f: impl FnOnce(&[i32]) -> KvResult<R>) -> KvResult<R> {
    match toks {
        TokenArray::I32(s) => f(s),
        TokenArray::I64(s) => f(&narrow_tokens(s)?),
    }
}

impl Design for RadixPrefixCache {
    forward!(RadixPrefixCache;
        ref {
            events_dropped() -> u64;
            stats() -> Stats;
            num_requests() -> usize;
            num_common_prefix_blocks() -> usize;
            check_invariants() -> Result<(), InvariantViolation>;
            num_free_blocks() -> usize;
            usage() -> f64;
        }
        mut {
            free(id: RequestId) -> KvResult<()>;
            free_batch(ids: &[u64]) -> KvResult<()>;
            reset() -> KvResult<()>;
            take_events() -> Vec<KvEvent>;
            take_events_dropped() -> u64;
            take_stats() -> Stats;
            checkpoint(id: RequestId) -> KvResult<()>;
        }
    );
    fn admit(
        &mut self,
        id: RequestId,
        toks: TokenArray<'_>,
        spec: KeySpec,
        skip: bool,
    ) -> KvResult<Option<usize>> {
        as_i32(toks, |s| RadixPrefixCache::admit(self, id, s, &spec, skip))
    }
    /// An int64 prompt is compared in place (no narrowed copy).
    fn lookup(&mut self, toks: TokenArray<'_>, spec: &KeySpec) -> KvResult<usize> {
        with_tokens!(toks, s => RadixPrefixCache::lookup_tokens(self, s, spec))
    }
    fn admit_chunk(
        &mut self,
        id: RequestId,
        toks: TokenArray<'_>,
        spec: KeySpec,
        skip: bool,
        opts: &StepOpts,
    ) -> KvResult<Option<Scheduled>> {
        as_i32(toks, |s| RadixPrefixCache::admit_chunk(self, id, s, &spec, skip, opts))
    }
    fn commit_tokens(&mut self, id: RequestId, toks: TokenArray<'_>, num_rejected: usize) -> KvResult<()> {
        as_i32(toks, |s| RadixPrefixCache::commit_tokens(self, id, s, num_rejected))
    }
    fn commit_batch(
        &mut self,
        ids: &[u64],
        toks: TokenArray<'_>,
        offsets: Option<&[i64]>,
        num_rejected: Option<&[i64]>,
    ) -> KvResult<()> {
        as_i32(toks, |s| RadixPrefixCache::commit_batch(self, ids, s, offsets, num_rejected))
    }
    fn append(&mut self, id: RequestId, toks: TokenArray<'_>) -> KvResult<bool> {
        as_i32(toks, |s| RadixPrefixCache::append(self, id, s))
    }
    fn append_batch(&mut self, ids: &[u64], toks: TokenArray<'_>, offsets: Option<&[i64]>) -> KvResult<bool> {
        as_i32(toks, |s| RadixPrefixCache::append_batch(self, ids, s, offsets))
    }
    fn num_blocks(&self) -> usize {
        self.pool().num_pages()
    }
    fn num_cached_blocks(&self) -> usize {
        self.tree().total_size() / self.page_size()
    }
    fn ref_count(&self, b: Self::Entry) -> u32 {
        self.pool().ref_count(b)
    }
    fn free_blocks(&self) -> Vec<Self::Entry> {
        self.pool().free_pages().collect()
    }
}

/// Writes the `#[pymethods]` block of a request-level cache class: the
/// methods every such class shares, the engine-lifecycle methods
/// ([`super::lifecycle::lifecycle_methods!`], passed back to the `@emit` arm
/// so that one `#[pymethods]` block sees them all), then the class's own
/// (`$own`).
macro_rules! request_cache_class {
    ($cls:ident { $($own:tt)* }) => {
        $crate::py::lifecycle::lifecycle_methods!($cls { $($own)* });
    };
    (@emit $cls:ident { $($own:tt)* }) => {
        #[pymethods]
        impl $cls {
            /// Blocks in the pool, the null block 0 included.
            #[getter]
            fn num_blocks(&self) -> usize {
                $crate::py::request_cache::Design::num_blocks(&self.inner)
            }

            /// Tokens per block (the radix cache's page size).
            #[getter]
            fn block_size(&self) -> usize {
                $crate::core::tables::TableSource::table_block_size(&self.inner)
            }

            /// Blocks new work can get now: free blocks plus idle cached ones (the hash chain's
            /// cached blocks in the free queue, the radix tree's evictable pages).
            #[getter]
            fn num_free_blocks(&self) -> usize {
                $crate::py::request_cache::Design::num_free_blocks(&self.inner)
            }

            /// Fraction of usable blocks held by running requests:
            /// ``1 - num_free_blocks / (num_blocks - 1)``.
            #[getter]
            fn usage(&self) -> f64 {
                $crate::py::request_cache::Design::usage(&self.inner)
            }

            /// Running (admitted, not freed) requests.
            #[getter]
            fn num_requests(&self) -> usize {
                $crate::py::request_cache::Design::num_requests(&self.inner)
            }

            /// Cached blocks (distinct block hashes; tree pages for the radix cache).
            #[getter]
            fn num_cached_blocks(&self) -> usize {
                $crate::py::request_cache::Design::num_cached_blocks(&self.inner)
            }

            /// Blocks shared by every running request, counted from block 0 (what cascade
            /// attention can share); 0 when no request runs. O(shared blocks).
            #[getter]
            fn num_common_prefix_blocks(&self) -> usize {
                $crate::py::request_cache::Design::num_common_prefix_blocks(&self.inner)
            }

            /// ``requests``, ``queries`` (prompt tokens), ``hits`` (cached tokens), ``evictions``
            /// (cached blocks that lost their hash; pages for the radix cache), ``hit_rate``,
            /// ``events_dropped`` (KV events the full buffer dropped, oldest first).
            #[getter]
            fn stats<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
                let (s, d) = {
                    let me = slf.try_borrow()?;
                    (
                        $crate::py::request_cache::Design::stats(&me.inner),
                        $crate::py::request_cache::Design::events_dropped(&me.inner),
                    )
                };
                $crate::py::common::stats_dict(slf.py(), s, d)
            }

            /// Returns :attr:`stats` and zeroes the counters.
            fn take_stats<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
                let (s, d) = {
                    let mut me = slf.try_borrow_mut()?;
                    (
                        $crate::py::request_cache::Design::take_stats(&mut me.inner),
                        $crate::py::request_cache::Design::take_events_dropped(&mut me.inner),
                    )
                };
                $crate::py::common::stats_dict(slf.py(), s, d)
            }

            fn __contains__(slf: &Bound<'_, Self>, request_id: &Bound<'_, PyAny>) -> PyResult<bool> {
                let id = $crate::core::ids::RequestId($crate::py::args::u64_arg(request_id, "request_id")?);
                let me = slf.try_borrow()?;
                Ok($crate::core::tables::TableSource::num_tokens(&me.inner, id).is_ok())
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
            #[allow(clippy::too_many_arguments)]
            fn admit<'py>(
                slf: &Bound<'py, Self>,
                request_id: &Bound<'py, PyAny>,
                tokens: &Bound<'py, PyAny>,
                #[pyo3(from_py_with = $crate::py::args::named::cache_salt)] cache_salt: Option<String>,
                lora: Option<&Bound<'py, PyAny>>,
                mm_items: Option<&Bound<'py, PyAny>>,
                #[pyo3(from_py_with = $crate::py::args::named::skip_reading)] skip_reading: bool,
            ) -> PyResult<Option<$crate::py::common::Admission>> {
                use $crate::py::errors::IntoPyResult;
                let id = $crate::core::ids::RequestId($crate::py::args::u64_arg(request_id, "request_id")?);
                let spec = $crate::py::keys::spec(cache_salt, lora, mm_items)?;
                // The block-table output is allocated before anything changes (an
                // admission holds ceil(tokens / block_size) blocks), so running out
                // of memory for it is a CapacityError with the cache unchanged.
                let ntok = {
                    // SAFETY: only Rust runs while this view lives (it is dropped here).
                    let arr = unsafe { $crate::py::arrays::tokens(tokens, "tokens") }?;
                    $crate::py::arrays::with_tokens!(arr, s => s.len())
                };
                let bs = $crate::core::tables::TableSource::table_block_size(&slf.try_borrow()?.inner);
                let out = $crate::py::arrays::UnfilledI32::new(slf.py(), ntok.div_ceil(bs))?;
                let (hit, ids) = {
                    // SAFETY: read after every argument that may run Python code and
                    // after the output's allocation; only Rust runs while the view lives.
                    let arr = unsafe { $crate::py::arrays::tokens(tokens, "tokens") }?;
                    let mut me = slf.try_borrow_mut()?;
                    let hit = $crate::py::request_cache::Design::admit(&mut me.inner, id, arr, spec, skip_reading).py()?;
                    let Some(hit) = hit else { return Ok(None) };
                    let blocks = $crate::core::tables::TableSource::blocks(&me.inner, id).py()?;
                    let ids = out.fill(blocks.iter().map(|b| {
                        i32::try_from($crate::core::ids::TableEntry::raw(*b)).expect("block ids fit i32")
                    }));
                    (hit, ids)
                };
                Ok(Some($crate::py::common::Admission::from_array(hit, ids)))
            }

            /// Tokens a prompt would hit now (as ``admit`` counts them). No side effects.
            #[pyo3(signature = (tokens, *, cache_salt = None, lora = None, mm_items = None))]
            fn lookup<'py>(
                slf: &Bound<'py, Self>,
                tokens: &Bound<'py, PyAny>,
                #[pyo3(from_py_with = $crate::py::args::named::cache_salt)] cache_salt: Option<String>,
                lora: Option<&Bound<'py, PyAny>>,
                mm_items: Option<&Bound<'py, PyAny>>,
            ) -> PyResult<usize> {
                use $crate::py::errors::IntoPyResult;
                let spec = $crate::py::keys::spec(cache_salt, lora, mm_items)?;
                // SAFETY: read after every argument that may run Python code; only
                // Rust runs while the view lives.
                let arr = unsafe { $crate::py::arrays::tokens(tokens, "tokens") }?;
                let mut me = slf.try_borrow_mut()?;
                $crate::py::request_cache::Design::lookup(&mut me.inner, arr, &spec).py()
            }

            /// Appends computed decode tokens; allocates a block when one fills (the hash chain
            /// caches every newly full block). ``False`` (nothing changed) when a needed block is
            /// not free.
            fn append(slf: &Bound<'_, Self>, request_id: &Bound<'_, PyAny>, tokens: &Bound<'_, PyAny>) -> PyResult<bool> {
                use $crate::py::errors::IntoPyResult;
                let id = $crate::core::ids::RequestId($crate::py::args::u64_arg(request_id, "request_id")?);
                // SAFETY: read after every argument that may run Python code; only
                // Rust runs while the view lives.
                let arr = unsafe { $crate::py::arrays::tokens(tokens, "tokens") }?;
                let mut me = slf.try_borrow_mut()?;
                $crate::py::request_cache::Design::append(&mut me.inner, id, arr).py()
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
                use $crate::py::errors::IntoPyResult;
                let ids = $crate::py::arrays::ids(request_ids, "request_ids")?;
                let off = offsets
                    .filter(|o| !o.is_none())
                    .map(|o| $crate::py::arrays::int64(o, "offsets"))
                    .transpose()?;
                let off_slice = match &off {
                    Some(o) => Some(o.as_slice().map_err(|_| $crate::py::errors::dtype("offsets must be C-contiguous"))?),
                    None => None,
                };
                // SAFETY: read after the other arguments; only Rust runs while the
                // view lives.
                let arr = unsafe { $crate::py::arrays::tokens(tokens, "tokens") }?;
                let mut me = slf.try_borrow_mut()?;
                $crate::py::request_cache::Design::append_batch(&mut me.inner, &ids, arr, off_slice).py()
            }

            /// Makes the running request's full blocks hittable by other requests now
            /// (the radix cache inserts them, as SGLang ``cache_unfinished_req``; the
            /// hash chain caches full blocks as they fill, so only the id is checked).
            /// With the lifecycle calls both designs make the same blocks hittable: those
            /// of known ids up to the last step (a block a commit completes, from the next
            /// ``schedule``), none of a ``delay_cache`` admission before ``finish_transfer``.
            fn checkpoint(slf: &Bound<'_, Self>, request_id: &Bound<'_, PyAny>) -> PyResult<()> {
                use $crate::py::errors::IntoPyResult;
                let id = $crate::core::ids::RequestId($crate::py::args::u64_arg(request_id, "request_id")?);
                let mut me = slf.try_borrow_mut()?;
                $crate::py::request_cache::Design::checkpoint(&mut me.inner, id).py()
            }

            /// Finishes a request. The hash chain returns its blocks to the free queue in reverse
            /// order (cached ones stay hittable); the radix cache inserts its full pages into the
            /// tree and returns the rest to the pool.
            fn free(slf: &Bound<'_, Self>, request_id: &Bound<'_, PyAny>) -> PyResult<()> {
                use $crate::py::errors::IntoPyResult;
                let id = $crate::core::ids::RequestId($crate::py::args::u64_arg(request_id, "request_id")?);
                let mut me = slf.try_borrow_mut()?;
                $crate::py::request_cache::Design::free(&mut me.inner, id).py()
            }

            /// Finishes many requests, in order; all ids are checked first.
            fn free_batch(slf: &Bound<'_, Self>, request_ids: &Bound<'_, PyAny>) -> PyResult<()> {
                use $crate::py::errors::IntoPyResult;
                let ids = $crate::py::arrays::ids(request_ids, "request_ids")?;
                let mut me = slf.try_borrow_mut()?;
                $crate::py::request_cache::Design::free_batch(&mut me.inner, &ids).py()
            }

            /// Drops every cached block and the refused prompts kept for a retry.
            /// Raises ``BlockInUseError`` while requests run.
            fn reset(slf: &Bound<'_, Self>) -> PyResult<()> {
                use $crate::py::errors::IntoPyResult;
                let mut me = slf.try_borrow_mut()?;
                $crate::py::request_cache::Design::reset(&mut me.inner).py()
            }

            /// Drains buffered KV events (empty unless ``enable_events``).
            fn take_events<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, pyo3::types::PyList>> {
                let ev = {
                    let mut me = slf.try_borrow_mut()?;
                    $crate::py::request_cache::Design::take_events(&mut me.inner)
                };
                $crate::py::events::to_list(slf.py(), ev)
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
            ) -> PyResult<Bound<'py, numpy::PyArray2<i32>>> {
                let a = $crate::py::common::TableArgs::new(request_ids, max_blocks, out)?;
                let me = slf.try_borrow()?;
                let nb = $crate::py::request_cache::Design::num_blocks(&me.inner);
                a.run(slf.py(), &me.inner, nb)
            }

            /// ``block * block_size + offset`` of each request's last ``query_lens[i]`` tokens,
            /// concatenated. An output this machine cannot allocate raises ``CapacityError``.
            fn slot_mapping<'py>(
                slf: &Bound<'py, Self>,
                request_ids: &Bound<'py, PyAny>,
                query_lens: &Bound<'py, PyAny>,
            ) -> PyResult<Bound<'py, numpy::PyArray1<i64>>> {
                let a = $crate::py::common::SlotArgs::new(request_ids, query_lens)?;
                let me = slf.try_borrow()?;
                a.run(slf.py(), &me.inner)
            }

            /// Tokens a running request holds KV positions for (prompt + appended tokens; with
            /// the lifecycle calls, the positions computed or scheduled, drafts included).
            fn num_tokens(slf: &Bound<'_, Self>, request_id: &Bound<'_, PyAny>) -> PyResult<usize> {
                use $crate::py::errors::IntoPyResult;
                let id = $crate::core::ids::RequestId($crate::py::args::u64_arg(request_id, "request_id")?);
                let me = slf.try_borrow()?;
                $crate::core::tables::TableSource::num_tokens(&me.inner, id).py()
            }

            /// A running request's block table.
            fn request_blocks<'py>(
                slf: &Bound<'py, Self>,
                request_id: &Bound<'py, PyAny>,
            ) -> PyResult<Bound<'py, numpy::PyArray1<i32>>> {
                use $crate::py::errors::IntoPyResult;
                let id = $crate::core::ids::RequestId($crate::py::args::u64_arg(request_id, "request_id")?);
                let me = slf.try_borrow()?;
                let blocks = $crate::core::tables::TableSource::blocks(&me.inner, id).py()?;
                $crate::py::common::block_ids_array(slf.py(), blocks)
            }

            /// Blocks no request or cache entry holds, in the order the pool hands
            /// them out (the hash chain's free queue also holds idle cached blocks).
            fn free_blocks<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, numpy::PyArray1<i32>>> {
                let v = {
                    let me = slf.try_borrow()?;
                    $crate::py::request_cache::Design::free_blocks(&me.inner)
                };
                $crate::py::common::block_ids_array(slf.py(), &v)
            }

            /// References on a block (requests holding it, plus the radix tree).
            fn ref_count(slf: &Bound<'_, Self>, block_id: &Bound<'_, PyAny>) -> PyResult<u32> {
                let b = $crate::py::args::i64_arg(block_id, "block_id")?;
                let me = slf.try_borrow()?;
                let b = $crate::py::request_cache::check_block_id(&me.inner, b)?;
                Ok($crate::py::request_cache::Design::ref_count(&me.inner, b))
            }

            /// Raises ``InvariantViolation`` if any internal invariant is broken.
            fn check_invariants(&self) -> PyResult<()> {
                $crate::py::request_cache::Design::check_invariants(&self.inner).map_err($crate::py::errors::inv_to_py)
            }

            $($own)*
        }
    };
}
pub(crate) use request_cache_class;

/// A block id in range for `d`'s pool.
///
/// # Errors
/// `InvalidArgumentError` outside `0..num_blocks`.
pub fn check_block_id<D: Design>(d: &D, block_id: i64) -> pyo3::PyResult<D::Entry> {
    let n = d.num_blocks();
    u32::try_from(block_id)
        .ok()
        .filter(|&b| (b as usize) < n)
        .map(D::Entry::from_raw)
        .ok_or_else(|| super::errors::invalid(format!("block id {block_id} out of range 0..{n}")))
}
