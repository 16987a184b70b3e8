//! `PrefixCache`: the one request-level binding class over both designs.
//!
//! The Python base class `kvindex.PrefixCache` (a `#[pyclass(subclass)]`)
//! holds an [`AnyCache`], an enum of the two core caches; `HashChainCache`
//! and `RadixPrefixCache` (`super::hash_chain`, `super::radix`) extend it and
//! add only their constructors and design-only methods. The shared methods
//! are plain `#[pymethods]` of the base class, split by concern:
//! - [`calls`]: the one-chunk calls (`admit`, `lookup`, `append`, `free` and
//!   their batches), block tables and slot mappings, counters and checks;
//! - [`lifecycle`]: the engine-lifecycle calls (`admit_chunk`, `resume`,
//!   `schedule`, `commit_tokens`, `preempt`, `finish`, ... and batches);
//! - [`events`]: the KV-event calls.
//!
//! (Several `#[pymethods]` blocks for one class need PyO3's
//! `multiple-pymethods` feature: the blocks are collected into the class's
//! method table when the type is first built; calls are unchanged.)
//!
//! A method shared by both caches is written once, in one of those files,
//! and declared once, under `class PrefixCache` in `python/kvindex/_core.pyi`.
//! It reaches the core through [`each!`] (one match, the body compiled once
//! per design) or, where the designs answer differently, through one of
//! [`AnyCache`]'s methods below (the only place that names both designs).
//!
//! # Arguments before borrows
//! Every method converts all of its arguments first (request ids and ints
//! through [`super::args`], whose `__index__` may run Python code and release
//! the GIL; key arguments, whose `mm_items` may be a generator), and only then
//! borrows the cache, for the core work alone. So a call whose argument
//! releases the GIL never holds the cache borrowed, and concurrent calls from
//! other threads are serialised by the GIL instead of failing with
//! "Already borrowed". Arrays are read in place inside
//! [`super::arrays::with_views`], which runs no Python code while the views
//! live. Output objects that may run Python code (dicts, lists) are built
//! after the borrow ends.
//!
//! Threading: a cache is owned by one scheduler thread. Methods never
//! release the GIL while they hold the cache (they run for microseconds); on
//! a free-threaded build a second concurrent caller gets `RuntimeError`
//! (already borrowed), never corruption.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use super::arrays::TokenArray;
use super::errors::invalid;
use crate::core::error::{InvariantViolation, KvResult};
use crate::core::hash::KeySpec;
use crate::core::hash_chain::HashChainCache;
use crate::core::ids::{RequestId, TableEntry};
use crate::core::radix_cache::{narrow_tokens, RadixPrefixCache};
use crate::core::request::{Scheduled, StepOpts};

mod calls;
mod events;
mod lifecycle;

/// One of the two request-level core caches.
pub enum AnyCache {
    /// Chained block hashes over a ref-counted block pool (vLLM).
    Chain(HashChainCache),
    /// A radix tree over a page pool (SGLang).
    Radix(RadixPrefixCache),
}

/// Runs `$body` with `$c` bound to the core cache inside `$cache` (an
/// `AnyCache`, `&AnyCache` or `&mut AnyCache`): one match; the body is
/// compiled once per design, so each arm is that design's own code.
macro_rules! each {
    ($cache:expr, $c:ident => $body:expr) => {
        match $cache {
            $crate::py::cache::AnyCache::Chain($c) => $body,
            $crate::py::cache::AnyCache::Radix($c) => $body,
        }
    };
}
pub(crate) use each;

/// Runs `$body` with `$c` bound to the core cache and `$s` to the tokens in
/// a type that design reads: the hash chain reads int32 and int64 in place,
/// the radix cache int32 (int64 is narrowed, range-checked; the enclosing
/// function returns a `KvResult`).
macro_rules! each_tokens {
    ($cache:expr, $toks:expr, $c:ident, $s:ident => $body:expr) => {
        match $cache {
            AnyCache::Chain($c) => match $toks {
                TokenArray::I32($s) => $body,
                TokenArray::I64($s) => $body,
            },
            AnyCache::Radix($c) => match $toks {
                TokenArray::I32($s) => $body,
                TokenArray::I64(wide) => {
                    let narrow = narrow_tokens(wide)?;
                    let $s: &[i32] = &narrow;
                    $body
                }
            },
        }
    };
}

/// A request-level KV prefix cache over a pool of ``num_blocks`` blocks (block 0 is the
/// null block; tables are padded with 0): the base class of :class:`HashChainCache` and
/// :class:`RadixPrefixCache`, which share every method declared here.
///
/// Owned by one scheduler thread; every method runs without releasing the GIL. Caller
/// errors raise :class:`KvIndexError` subclasses and change nothing; running out of
/// blocks is a return value (``None`` / ``False``). Not constructible itself
/// (``InvalidArgumentError``).
#[pyclass(module = "kvindex._core", name = "PrefixCache", subclass)]
pub struct PyPrefixCache {
    pub(super) inner: AnyCache,
}

impl PyPrefixCache {
    /// The base of a new `HashChainCache` or `RadixPrefixCache`.
    pub(super) fn new(inner: AnyCache) -> Self {
        PyPrefixCache { inner }
    }
}

/// A design-only method called on the other design's object (which no
/// constructor makes).
#[cold]
fn wrong_design(expected: &str) -> PyErr {
    PyTypeError::new_err(format!("expected a {expected}"))
}

/// What the designs answer differently; everything else goes through [`each!`].
impl AnyCache {
    /// The hash chain, for its design-only methods.
    ///
    /// # Errors
    /// `TypeError` on a radix cache.
    pub fn chain(&self) -> PyResult<&HashChainCache> {
        match self {
            AnyCache::Chain(c) => Ok(c),
            AnyCache::Radix(_) => Err(wrong_design("HashChainCache")),
        }
    }

    /// [`AnyCache::chain`], mutably.
    ///
    /// # Errors
    /// `TypeError` on a radix cache.
    pub fn chain_mut(&mut self) -> PyResult<&mut HashChainCache> {
        match self {
            AnyCache::Chain(c) => Ok(c),
            AnyCache::Radix(_) => Err(wrong_design("HashChainCache")),
        }
    }

    /// The radix cache, for its design-only methods.
    ///
    /// # Errors
    /// `TypeError` on a hash chain.
    pub fn radix(&self) -> PyResult<&RadixPrefixCache> {
        match self {
            AnyCache::Radix(c) => Ok(c),
            AnyCache::Chain(_) => Err(wrong_design("RadixPrefixCache")),
        }
    }

    /// [`AnyCache::radix`], mutably.
    ///
    /// # Errors
    /// `TypeError` on a hash chain.
    pub fn radix_mut(&mut self) -> PyResult<&mut RadixPrefixCache> {
        match self {
            AnyCache::Radix(c) => Ok(c),
            AnyCache::Chain(_) => Err(wrong_design("RadixPrefixCache")),
        }
    }

    /// Admits a request (see the core's `admit`).
    ///
    /// # Errors
    /// As the core's `admit`.
    #[inline]
    pub fn admit(
        &mut self,
        id: RequestId,
        toks: TokenArray<'_>,
        spec: KeySpec,
        skip: bool,
    ) -> KvResult<Option<usize>> {
        each_tokens!(self, toks, c, s => c.admit(id, s, &spec, skip))
    }

    /// Tokens a prompt would hit now; the radix cache compares int64 tokens in
    /// place (no narrowed copy).
    ///
    /// # Errors
    /// As the core's `lookup`.
    #[inline]
    pub fn lookup(&mut self, toks: TokenArray<'_>, spec: &KeySpec) -> KvResult<usize> {
        match self {
            AnyCache::Chain(c) => super::arrays::with_tokens!(toks, s => c.lookup(s, spec)),
            AnyCache::Radix(c) => super::arrays::with_tokens!(toks, s => c.lookup_tokens(s, spec)),
        }
    }

    /// Appends computed tokens.
    ///
    /// # Errors
    /// As the core's `append`.
    #[inline]
    pub fn append(&mut self, id: RequestId, toks: TokenArray<'_>) -> KvResult<bool> {
        each_tokens!(self, toks, c, s => c.append(id, s))
    }

    /// Appends a CSR batch, all or nothing.
    ///
    /// # Errors
    /// As the core's `append_batch`.
    #[inline]
    pub fn append_batch(
        &mut self,
        ids: &[u64],
        toks: TokenArray<'_>,
        offsets: Option<&[i64]>,
    ) -> KvResult<bool> {
        each_tokens!(self, toks, c, s => c.append_batch(ids, s, offsets))
    }

    /// Admits a request's first chunk.
    ///
    /// # Errors
    /// As the core's `admit_chunk`.
    #[inline]
    pub fn admit_chunk(
        &mut self,
        id: RequestId,
        toks: TokenArray<'_>,
        spec: KeySpec,
        skip: bool,
        opts: &StepOpts,
    ) -> KvResult<Option<Scheduled>> {
        each_tokens!(self, toks, c, s => c.admit_chunk(id, s, &spec, skip, opts))
    }

    /// Commits sampled ids.
    ///
    /// # Errors
    /// As the core's `commit_tokens`.
    #[inline]
    pub fn commit_tokens(
        &mut self,
        id: RequestId,
        toks: TokenArray<'_>,
        num_rejected: usize,
    ) -> KvResult<()> {
        each_tokens!(self, toks, c, s => c.commit_tokens(id, s, num_rejected))
    }

    /// Commits a CSR batch of sampled ids, all or nothing.
    ///
    /// # Errors
    /// As the core's `commit_batch`.
    #[inline]
    pub fn commit_batch(
        &mut self,
        ids: &[u64],
        toks: TokenArray<'_>,
        offsets: Option<&[i64]>,
        num_rejected: Option<&[i64]>,
    ) -> KvResult<()> {
        each_tokens!(self, toks, c, s => c.commit_batch(ids, s, offsets, num_rejected))
    }

    /// Makes the request's full blocks hittable now (the hash chain caches
    /// them as they fill, so there only the id is checked).
    ///
    /// # Errors
    /// `UnknownRequest`.
    pub fn checkpoint(&mut self, id: RequestId) -> KvResult<()> {
        match self {
            AnyCache::Chain(c) => crate::core::tables::TableSource::num_tokens(c, id).map(|_| ()),
            AnyCache::Radix(c) => c.checkpoint(id),
        }
    }

    /// Pool size, the null block included.
    pub fn num_blocks(&self) -> usize {
        match self {
            AnyCache::Chain(c) => c.pool().num_blocks(),
            AnyCache::Radix(c) => c.pool().num_pages(),
        }
    }

    /// Blocks new work can get now.
    pub fn num_free_blocks(&self) -> usize {
        match self {
            AnyCache::Chain(c) => c.pool().num_free(),
            AnyCache::Radix(c) => c.num_free_blocks(),
        }
    }

    /// Fraction of usable blocks held by running requests.
    pub fn usage(&self) -> f64 {
        match self {
            AnyCache::Chain(c) => c.pool().usage(),
            AnyCache::Radix(c) => c.usage(),
        }
    }

    /// Cached blocks (distinct block hashes; tree pages).
    pub fn num_cached_blocks(&self) -> usize {
        match self {
            AnyCache::Chain(c) => c.pool().num_cached_hashes(),
            AnyCache::Radix(c) => c.tree().total_size() / c.page_size(),
        }
    }

    /// References on block `b`, checked to be in `0..num_blocks`.
    ///
    /// # Errors
    /// `InvalidArgumentError` outside the pool.
    pub fn ref_count(&self, b: i64) -> PyResult<u32> {
        let b = self.block_id(b)?;
        Ok(match self {
            AnyCache::Chain(c) => c.pool().ref_count(TableEntry::from_raw(b)),
            AnyCache::Radix(c) => c.pool().ref_count(TableEntry::from_raw(b)),
        })
    }

    /// Blocks with no holder, in the order the pool hands them out (raw ids).
    pub fn free_blocks(&self) -> Vec<u32> {
        match self {
            AnyCache::Chain(c) => c.pool().free_queue().map(TableEntry::raw).collect(),
            AnyCache::Radix(c) => c.pool().free_pages().map(TableEntry::raw).collect(),
        }
    }

    /// Checks every internal invariant.
    ///
    /// # Errors
    /// The first broken invariant.
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        each!(self, c => c.check_invariants())
    }

    /// A block id in range for the pool.
    ///
    /// # Errors
    /// `InvalidArgumentError` outside `0..num_blocks`.
    pub fn block_id(&self, block_id: i64) -> PyResult<u32> {
        let n = self.num_blocks();
        u32::try_from(block_id)
            .ok()
            .filter(|&b| (b as usize) < n)
            .ok_or_else(|| invalid(format!("block id {block_id} out of range 0..{n}")))
    }
}
