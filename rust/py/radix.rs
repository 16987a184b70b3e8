//! `RadixTree` (the tree; `RadixCache` is its alias) and `RadixPrefixCache`
//! (the request-level cache):
//! the Python faces of [`crate::core::radix::RadixTree`] and
//! [`crate::core::radix_cache::RadixPrefixCache`]. `RadixPrefixCache`
//! extends `PrefixCache` ([`super::cache`]), which holds the core cache and
//! every method the two request-level caches share; this file holds its
//! constructor and its radix-only methods.
//!
//! Threading: both classes are owned by one scheduler thread. Methods convert
//! their arguments before borrowing the object and never release the GIL
//! while they hold it (they run for microseconds); on a free-threaded build a
//! concurrent second caller gets `RuntimeError` (already borrowed), never
//! corruption.
//!
//! Names: `block_size` is the request-level cache's one size name (tokens
//! per block, which is the tree's page size); its counts of blocks end in
//! `_blocks` (`num_unused_blocks`: blocks no request and no tree node holds),
//! its token counts keep SGLang's names (`cached_tokens`, `evictable_size`,
//! `protected_size`). `page_size` names the size on the tree alone.
//!
//! Node handles: `tag << 64 | generation << 32 | index`, where `tag` names
//! the tree that issued the handle (the root is always 0), so a handle from
//! another tree raises `StaleHandleError` instead of naming an unrelated node.
//!
//! Slots and pages: the core tree stores one value per page (the slot when
//! `page_size == 1`, else the page id `slot // page_size`). This layer turns
//! the caller's per-token slots into pages (with `page_size > 1` each page's
//! slots must be a page-aligned run: `slot % page_size == 0` for the first,
//! then consecutive) and pages back into per-token slots.
// `unsafe` here only builds and reads node handles through the C API.
#![allow(unsafe_code)]

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};

use numpy::PyArray1;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyInt, PyList};

use super::args::named;
use super::arrays::{self, with_views, TokenArray, Tokens};
use super::cache::{AnyCache, PyPrefixCache};
use super::errors::{capacity, inv_to_py, invalid, stale, IntoPyResult};
use super::{args, common, events};
use crate::core::ids::{PageId, RequestId};
use crate::core::pages::{pages_to_slots, slots_to_pages, PageMath};
use crate::core::radix::pools::ComponentPool;
use crate::core::radix::{Components, InsertOpts, NodeHandle, Policy, RadixTree};
use crate::core::radix_cache::{narrow_tokens, PoolSizes, RadixPrefixCache};

/// A token array as int32 (int64 input is narrowed, with a range check).
fn tokens_i32(t: TokenArray<'_>) -> PyResult<Cow<'_, [i32]>> {
    match t {
        TokenArray::I32(a) => Ok(Cow::Borrowed(a)),
        TokenArray::I64(a) => Ok(Cow::Owned(narrow_tokens(a).py()?)),
    }
}

/// Caller slots as int32 values (signs are checked with the page runs, by
/// [`slots_to_pages`]).
fn slots_i32(t: TokenArray<'_>) -> PyResult<Cow<'_, [i32]>> {
    match t {
        TokenArray::I32(a) => Ok(Cow::Borrowed(a)),
        TokenArray::I64(a) => {
            narrow_tokens(a).map(Cow::Owned).map_err(|_| invalid("slots must fit in int32"))
        }
    }
}

/// The per-token slots of `pages` as a new int32 array.
///
/// # Errors
/// `CapacityError` when the array cannot be allocated.
pub(super) fn slot_array<'py>(
    py: Python<'py>,
    pages: &[PageId],
    ps: usize,
) -> PyResult<Bound<'py, PyArray1<i32>>> {
    let len = pages.len().checked_mul(ps).ok_or_else(|| capacity("slot array too large"))?;
    arrays::filled_i32(py, len, |dst| pages_to_slots(pages, ps, dst))
}

/// An optional namespace: a str (a lone surrogate raises `InvalidArgumentError`),
/// read in place.
fn opt_namespace<'a>(ns: Option<&'a Bound<'_, PyAny>>) -> PyResult<Option<&'a str>> {
    ns.filter(|o| !o.is_none()).map(|o| args::text(o, "namespace")).transpose()
}

fn mamba_flag(o: &Bound<'_, PyAny>) -> PyResult<bool> {
    args::flag(o, "mamba")
}

fn swa_evicted_arg(o: &Bound<'_, PyAny>) -> PyResult<usize> {
    args::usize_arg(o, "swa_evicted_len", usize::MAX)
}

fn parse_policy(policy: &str, slru_threshold: usize) -> PyResult<Policy> {
    Policy::parse(policy, slru_threshold as u64).py()
}

/// The Python handle of a core handle: `tag << 64 | handle` (the root is 0),
/// built with two C-API calls from the tree's cached `base = tag << 64`.
pub(super) fn encode_handle<'py>(
    py: Python<'py>,
    base: &Py<PyInt>,
    h: NodeHandle,
) -> PyResult<Bound<'py, PyAny>> {
    if h.0 == 0 {
        return Ok(0u64.into_pyobject(py)?.into_any());
    }
    // SAFETY: both calls return a new reference or NULL with an exception set.
    unsafe {
        let low = Bound::from_owned_ptr_or_err(py, ffi::PyLong_FromUnsignedLongLong(h.0))?;
        Bound::from_owned_ptr_or_err(py, ffi::PyNumber_Or(low.as_ptr(), base.as_ptr()))
    }
}

/// Result of :meth:`RadixTree.match_prefix`; unpacks as ``(hit_len, slots, node)``.
#[pyclass(module = "kvindex._core", frozen)]
pub struct MatchResult {
    hit_len: usize,
    slots: Py<PyArray1<i32>>,
    /// The core handle; the Python int is built when asked for.
    node: NodeHandle,
    /// The issuing tree's `tag << 64`.
    base: Py<PyInt>,
}

#[pymethods]
impl MatchResult {
    /// Matched tokens (a multiple of the page size).
    #[getter]
    fn hit_len(&self) -> usize {
        self.hit_len
    }

    /// KV slots of the matched tokens, one per token.
    #[getter]
    fn slots(&self, py: Python<'_>) -> Py<PyArray1<i32>> {
        self.slots.clone_ref(py)
    }

    /// Handle of the last matched node (0, the root, on a miss); lock it to protect the hit.
    #[getter]
    fn node<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        encode_handle(py, &self.base, self.node)
    }

    fn __iter__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let me = slf.get();
        let t = (me.hit_len, me.slots.clone_ref(py), me.node(py)?).into_pyobject(py)?;
        Ok(t.into_any().try_iter()?.into_any())
    }

    fn __len__(&self) -> usize {
        3
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!("MatchResult(hit_len={}, node={})", self.hit_len, self.node(py)?))
    }
}

/// Result of :meth:`RadixTree.insert`; unpacks as ``(prefix_len, to_free)``.
#[pyclass(module = "kvindex._core", frozen, get_all)]
pub struct InsertResult {
    /// Leading tokens that were already in the tree (a multiple of the page size).
    prefix_len: usize,
    /// Slots passed in that the tree did not take (duplicates of its prefix, and the
    /// unaligned tail when page_size > 1): the caller frees exactly these.
    to_free: Py<PyArray1<i32>>,
}

#[pymethods]
impl InsertResult {
    fn __iter__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let me = slf.get();
        let t = (me.prefix_len, me.to_free.clone_ref(py)).into_pyobject(py)?;
        Ok(t.into_any().try_iter()?.into_any())
    }

    fn __len__(&self) -> usize {
        2
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!("InsertResult(prefix_len={}, to_free={})", self.prefix_len, self.to_free.bind(py).repr()?))
    }
}

/// Source of per-instance handle tags (0 is never a tag: the root handle).
static NEXT_TAG: AtomicU64 = AtomicU64::new(1);

/// Radix tree over token ids with SGLang ``RadixCache`` semantics (the tree alone:
/// the caller owns the slots; :class:`RadixPrefixCache` is the request-level cache).
///
/// Edges hold token runs (a multiple of ``page_size``); values are KV slots. With
/// ``page_size > 1`` queries are cut to a page multiple and each page's slots must be
/// a page-aligned run. A match ending inside an edge splits it. Recency is a logical
/// clock (one tick per match/insert). Node handles are ints naming the tree that
/// issued them (``tag << 64 | generation << 32 | index``; the root is 0); a handle to
/// an evicted node, any handle after ``reset()``, or a handle from another tree
/// raises ``StaleHandleError``. Policies: ``RADIX_POLICIES``.
#[pyclass(module = "kvindex._core", name = "RadixTree")]
pub struct PyRadixTree {
    pub(super) inner: RadixTree,
    /// `tag << 64`, where `tag` is this tree's identity: the top bits of
    /// every non-root handle.
    pub(super) base: Py<PyInt>,
    /// `(tag + 1) << 64`: the end of this tree's handle range.
    next: Py<PyInt>,
    /// Scratch: pages out of the core (matches, duplicates, evictions).
    pages: Vec<PageId>,
    /// Scratch: the caller's slots as pages.
    in_pages: Vec<PageId>,
}

impl PyRadixTree {
    /// Drains the tree's buffered core events.
    pub fn drain_events(&mut self) -> Vec<crate::core::events::KvEvent> {
        self.inner.events_mut().take()
    }

    /// The core handle of a Python handle. A handle of another tree (or one
    /// never issued) raises `StaleHandleError`; a negative one
    /// `InvalidArgumentError`.
    pub(super) fn decode(&self, v: &Bound<'_, PyInt>) -> PyResult<NodeHandle> {
        // SAFETY: `v` is an int, for which the mask conversion cannot fail.
        let low = unsafe { ffi::PyLong_AsUnsignedLongLongMask(v.as_ptr()) };
        if low == 0 {
            // Only the root handle, 0, has no low bits.
            return match v.extract::<u64>() {
                Ok(0) => Ok(NodeHandle(0)),
                _ => Err(foreign(v)),
            };
        }
        // An issued handle lies in `tag << 64 .. (tag + 1) << 64`; its low 64
        // bits are the core handle. Two comparisons, no new object.
        // SAFETY: both are ints; the call returns 1, 0, or -1 with an exception set.
        let (ge, lt) = unsafe {
            (
                ffi::PyObject_RichCompareBool(v.as_ptr(), self.base.as_ptr(), ffi::Py_GE),
                ffi::PyObject_RichCompareBool(v.as_ptr(), self.next.as_ptr(), ffi::Py_LT),
            )
        };
        match (ge, lt) {
            (1, 1) => Ok(NodeHandle(low)),
            (-1, _) | (_, -1) => Err(PyErr::fetch(v.py())),
            _ => Err(foreign(v)),
        }
    }
}

#[cold]
fn foreign(v: &Bound<'_, PyInt>) -> PyErr {
    if v.lt(0).unwrap_or(false) {
        return invalid(format!("node must be an int in 0..2**128, got {v}"));
    }
    stale(format!("node handle {v} belongs to another RadixTree (or was never issued)"))
}

#[pymethods]
impl PyRadixTree {
    #[new]
    #[pyo3(
        signature = (page_size = 1, *, policy = "lru".to_owned(), slru_threshold = 2, enable_events = false, max_events = 100000, sliding_window = None, mamba = false, groups = None),
        text_signature = "(page_size=1, *, policy='lru', slru_threshold=2, enable_events=False, max_events=100000, sliding_window=None, mamba=False, groups=None)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        #[pyo3(from_py_with = named::page_size)] page_size: usize,
        #[pyo3(from_py_with = named::policy)] policy: String,
        #[pyo3(from_py_with = named::slru_threshold)] slru_threshold: usize,
        enable_events: bool,
        #[pyo3(from_py_with = named::max_events)] max_events: usize,
        sliding_window: Option<&Bound<'_, PyAny>>,
        #[pyo3(from_py_with = mamba_flag)] mamba: bool,
        groups: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let policy = parse_policy(&policy, slru_threshold)?;
        let mut comps =
            Components { swa_window: args::opt_usize_arg(sliding_window, "sliding_window", 1 << 40)?, mamba };
        if let Some(g) = groups.filter(|g| !g.is_none()) {
            let (bs, from_layout, _) = super::groups::radix_components(g)?;
            if comps.any() {
                return Err(invalid("give either groups or sliding_window / mamba, not both"));
            }
            if bs != page_size {
                return Err(invalid(format!(
                    "page_size ({page_size}) must be the groups' block size ({bs})"
                )));
            }
            comps = from_layout;
        }
        let mut inner = RadixTree::with_components(page_size, policy, enable_events, comps).py()?;
        inner.events_mut().set_capacity(max_events).py()?;
        let tag = NEXT_TAG.fetch_add(1, Ordering::Relaxed);
        let int =
            |x: u128| -> PyResult<Py<PyInt>> { Ok(x.into_pyobject(py)?.cast_into::<PyInt>()?.unbind()) };
        let (base, next) = (int(u128::from(tag) << 64)?, int((u128::from(tag) + 1) << 64)?);
        Ok(PyRadixTree { inner, base, next, pages: Vec::new(), in_pages: Vec::new() })
    }

    /// Tokens per page (edges and hits are multiples of it).
    #[getter]
    fn page_size(&self) -> usize {
        self.inner.page_size()
    }

    /// The eviction policy (one of ``RADIX_POLICIES``).
    #[getter]
    fn policy(&self) -> &'static str {
        self.inner.policy().name()
    }

    /// Tokens in the tree (``evictable_size + protected_size``).
    #[getter]
    fn total_size(&self) -> usize {
        self.inner.total_size()
    }

    /// Tokens in unlocked nodes.
    #[getter]
    fn evictable_size(&self) -> usize {
        self.inner.evictable_size()
    }

    /// Tokens in locked nodes.
    #[getter]
    fn protected_size(&self) -> usize {
        self.inner.protected_size()
    }

    /// Live nodes, the root included.
    #[getter]
    fn num_nodes(&self) -> usize {
        self.inner.num_nodes()
    }

    /// The logical clock (one tick per match/insert).
    #[getter]
    fn clock(&self) -> u64 {
        self.inner.clock()
    }

    /// Longest cached page-aligned prefix; stamps the path, may split an edge. int64 tokens
    /// are read in place (a token outside the int32 range matches nothing).
    #[pyo3(signature = (tokens, namespace = None))]
    fn match_prefix(
        &mut self,
        py: Python<'_>,
        tokens: &Bound<'_, PyAny>,
        namespace: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<MatchResult> {
        let namespace = opt_namespace(namespace)?;
        let ps = self.inner.page_size();
        // int64 tokens are compared in place (no narrowed copy).
        let tree = &mut self.inner;
        let m = with_views(
            Tokens(tokens, "tokens"),
            |t| arrays::with_tokens!(t, s => tree.match_nodes(s, namespace)),
        )?;
        // The output is sized by the match, then filled from the tree's
        // values in place (no intermediate buffer, no zeroing).
        let (hit_len, node) = (m.len, m.node);
        let slots = arrays::filled_i32(py, hit_len, |dst| {
            m.values().fold(0, |off, vals| off + pages_to_slots(vals, ps, &mut dst[off..]))
        })?;
        let node = self.inner.handle(node);
        Ok(MatchResult { hit_len, slots: slots.unbind(), node, base: self.base.clone_ref(py) })
    }

    /// Hit length a match would report now; changes nothing.
    #[pyo3(signature = (tokens, namespace = None))]
    fn probe(&mut self, tokens: &Bound<'_, PyAny>, namespace: Option<&Bound<'_, PyAny>>) -> PyResult<usize> {
        let namespace = opt_namespace(namespace)?;
        let tree = &mut self.inner;
        with_views(Tokens(tokens, "tokens"), |t| arrays::with_tokens!(t, s => tree.probe(s, namespace).len))
    }

    /// Inserts a sequence with one slot per token; returns the present prefix and the
    /// slots the caller must free. Rejects (unchanged) a slot the tree holds elsewhere
    /// or one passed twice.
    ///
    /// ``inserted_len``: tokens this caller inserted before (SGLang's
    /// ``cache_inserted_len``); only nodes the path reaches past it count a hit.
    #[pyo3(signature = (tokens, slots, namespace = None, *, priority = 0, swa_evicted_len = 0, mamba_state = None, inserted_len = 0))]
    #[allow(clippy::too_many_arguments)]
    fn insert(
        slf: &Bound<'_, Self>,
        tokens: &Bound<'_, PyAny>,
        slots: &Bound<'_, PyAny>,
        namespace: Option<&Bound<'_, PyAny>>,
        #[pyo3(from_py_with = named::priority)] priority: i64,
        #[pyo3(from_py_with = swa_evicted_arg)] swa_evicted_len: usize,
        mamba_state: Option<&Bound<'_, PyAny>>,
        #[pyo3(from_py_with = named::inserted_len)] inserted_len: usize,
    ) -> PyResult<InsertResult> {
        let namespace = opt_namespace(namespace)?;
        let hi = InsertOpts {
            swa_evicted: swa_evicted_len,
            mamba: args::opt_usize_arg(mamba_state, "mamba_state", u32::MAX as usize - 1)?
                .map(|s| u32::try_from(s).expect("bounded")),
            inserted_len,
        };
        let py = slf.py();
        let mut guard = slf.try_borrow_mut()?;
        let me = &mut *guard;
        let ps = me.inner.page_size();
        let views = (Tokens(tokens, "tokens"), Tokens(slots, "slots"));
        let (prefix, tail_page, tail_len) = with_views(views, |(toks, slots)| {
            let (toks, slots) = (tokens_i32(toks)?, slots_i32(slots)?);
            if slots.len() != toks.len() {
                return Err(invalid(format!(
                    "slots ({}) must have one slot per token ({})",
                    slots.len(),
                    toks.len()
                )));
            }
            let full = toks.len() / ps * ps;
            let mut pages = std::mem::take(&mut me.in_pages);
            pages.clear();
            me.pages.clear();
            let res = slots_to_pages(&slots, PageMath::new(ps), &mut pages).py().and_then(|tail_page| {
                me.inner
                    .insert_hybrid(
                        &toks[..full],
                        &pages,
                        namespace,
                        priority,
                        tail_page.as_slice(),
                        &mut me.pages,
                        &hi,
                    )
                    .py()
                    .map(|prefix| (prefix, tail_page, toks.len() - full))
            });
            me.in_pages = pages;
            res
        })??;
        // To free: the duplicates, then the unaligned tail, which was checked
        // to be the run from its page's first slot (so it is rebuilt here).
        let pages = &me.pages;
        let to_free = arrays::filled_i32(py, pages.len() * ps + tail_len, |dst| {
            let n = pages_to_slots(pages, ps, dst);
            if let Some(p) = tail_page {
                #[allow(clippy::cast_possible_wrap, clippy::cast_possible_truncation)]
                let base = (p.0 as usize * ps) as i32;
                for (d, k) in dst[n..n + tail_len].iter_mut().zip(0..) {
                    d.write(base + k);
                }
            }
            n + tail_len
        })?;
        Ok(InsertResult { prefix_len: prefix, to_free: to_free.unbind() })
    }

    /// Protects the path root..node from eviction (the root: no-op).
    fn lock(slf: &Bound<'_, Self>, node: &Bound<'_, PyAny>) -> PyResult<()> {
        let v = args::int(node, "node")?;
        let mut me = slf.try_borrow_mut()?;
        let h = me.decode(&v)?;
        me.inner.lock_handle(h).py()
    }

    /// Releases a lock taken on this node; ``LockError`` if it holds none of its own.
    fn unlock(slf: &Bound<'_, Self>, node: &Bound<'_, PyAny>) -> PyResult<()> {
        let v = args::int(node, "node")?;
        let mut me = slf.try_borrow_mut()?;
        let h = me.decode(&v)?;
        me.inner.unlock_handle(h).py()
    }

    /// Locks held on the node itself.
    fn lock_ref(slf: &Bound<'_, Self>, node: &Bound<'_, PyAny>) -> PyResult<u32> {
        let v = args::int(node, "node")?;
        let me = slf.try_borrow()?;
        let id = me.inner.resolve(me.decode(&v)?).py()?;
        Ok(me.inner.lock_ref(id))
    }

    /// Slots of the path root..node, in order.
    fn path_slots<'py>(
        slf: &Bound<'py, Self>,
        node: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<i32>>> {
        let v = args::int(node, "node")?;
        let me = slf.try_borrow()?;
        let id = me.inner.resolve(me.decode(&v)?).py()?;
        let mut pages = Vec::new();
        me.inner.path_values(id, &mut pages);
        slot_array(slf.py(), &pages, me.inner.page_size())
    }

    /// The KV-event page hashes the tree holds (uint64, ascending, each once): the set a
    /// subscriber holds after applying every event the tree emitted (if the bounded
    /// event buffer dropped none). Read-only. ``InvalidArgumentError`` unless
    /// ``enable_events`` (the tree hashes no page then).
    fn cached_page_hashes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<u64>>> {
        Ok(PyArray1::from_vec(py, self.inner.cached_page_hashes().py()?))
    }

    /// Every slot the tree holds.
    fn all_slots<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<i32>>> {
        let mut pages = Vec::new();
        self.inner.all_values(&mut pages);
        slot_array(py, &pages, self.inner.page_size())
    }

    /// Evicts whole unlocked leaves in policy order until ``num_tokens`` are freed (may
    /// free more); returns the freed slots (the caller owns the slots, so the tree hands
    /// them back).
    fn evict<'py>(
        slf: &Bound<'py, Self>,
        num_tokens: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<i32>>> {
        let n = args::usize_arg(num_tokens, "num_tokens", usize::MAX)?;
        let mut guard = slf.try_borrow_mut()?;
        let me = &mut *guard;
        me.pages.clear();
        me.inner.evict(n, &mut me.pages);
        slot_array(slf.py(), &me.pages, me.inner.page_size())
    }

    /// Drops every node (handles go stale); returns the slots the tree held.
    fn reset<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<i32>>> {
        self.pages.clear();
        self.inner.reset(&mut self.pages);
        slot_array(py, &self.pages, self.inner.page_size())
    }

    /// Drains buffered KV events (empty unless ``enable_events``).
    fn take_events<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyList>> {
        let ev = slf.try_borrow_mut()?.inner.events_mut().take();
        events::to_list(slf.py(), ev)
    }

    /// KV events the full buffer dropped (oldest first) since the tree was built.
    #[getter]
    fn events_dropped(&self) -> u64 {
        self.inner.events().dropped()
    }

    /// Raises ``InvariantViolation`` if any internal invariant is broken.
    fn check_invariants(&self) -> PyResult<()> {
        self.inner.check_invariants().map_err(inv_to_py)
    }

    /// A human-readable dump, one line per node.
    fn dump(&self) -> String {
        self.inner.dump()
    }

    fn __len__(&self) -> usize {
        self.inner.total_size()
    }

    fn __repr__(&self) -> String {
        format!(
            "RadixTree(page_size={}, policy={:?}, total_size={}, evictable_size={}, protected_size={}, nodes={})",
            self.inner.page_size(),
            self.inner.policy().name(),
            self.inner.total_size(),
            self.inner.evictable_size(),
            self.inner.protected_size(),
            self.inner.num_nodes()
        )
    }
}

/// Request-level prefix cache over the radix tree, driven like :class:`HashChainCache`.
///
/// ``num_blocks`` pages of ``block_size`` slots (page 0 is the null page; tables pad
/// with 0); block ids are page ids, so ``block_size=1`` gives token-level tables.
/// Hits are capped at ``num_tokens - 1``. Sequences enter the tree at ``free`` (or
/// ``checkpoint``); unlocked leaves are evicted inside ``admit``/``append`` when the
/// pool runs short.
///
/// Names: ``block_size`` is the one size (the tree's page size, which only
/// :class:`RadixTree` calls ``page_size``); counts of blocks end in ``_blocks``; the
/// tree's token counts keep SGLang's names (``cached_tokens``, ``evictable_size``,
/// ``protected_size``).
#[pyclass(module = "kvindex._core", name = "RadixPrefixCache", extends = PyPrefixCache)]
pub struct PyRadixPrefixCache;

/// The radix cache under a `RadixPrefixCache`.
fn radix<'a>(base: &'a PyRef<'_, PyPrefixCache>) -> PyResult<&'a RadixPrefixCache> {
    base.inner.radix()
}

#[pymethods]
impl PyRadixPrefixCache {
    #[new]
    #[pyo3(
        signature = (num_blocks, block_size, *, policy = "lru".to_owned(), slru_threshold = 2, enable_events = false, max_events = 100000, groups = None, swa_blocks = None, mamba_states = None),
        text_signature = "(num_blocks, block_size, *, policy='lru', slru_threshold=2, enable_events=False, max_events=100000, groups=None, swa_blocks=None, mamba_states=None)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn new(
        #[pyo3(from_py_with = named::num_blocks)] num_blocks: usize,
        #[pyo3(from_py_with = named::block_size)] block_size: usize,
        #[pyo3(from_py_with = named::policy)] policy: String,
        #[pyo3(from_py_with = named::slru_threshold)] slru_threshold: usize,
        enable_events: bool,
        #[pyo3(from_py_with = named::max_events)] max_events: usize,
        groups: Option<&Bound<'_, PyAny>>,
        swa_blocks: Option<&Bound<'_, PyAny>>,
        mamba_states: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let policy = parse_policy(&policy, slru_threshold)?;
        let sizes = PoolSizes {
            swa_blocks: args::opt_usize_arg(swa_blocks, "swa_blocks", usize::MAX)?,
            mamba_states: args::opt_usize_arg(mamba_states, "mamba_states", usize::MAX)?,
        };
        let mut comps = Components::default();
        if let Some(g) = groups.filter(|g| !g.is_none()) {
            let (bs, from_layout, _) = super::groups::radix_components(g)?;
            if bs != block_size {
                return Err(invalid(format!(
                    "block_size ({block_size}) must be the groups' block size ({bs})"
                )));
            }
            comps = from_layout;
        }
        if sizes.swa_blocks.is_some() && comps.swa_window.is_none() {
            return Err(invalid("swa_blocks needs a sliding-window group in groups"));
        }
        if sizes.mamba_states.is_some() && !comps.mamba {
            return Err(invalid("mamba_states needs a Mamba group in groups"));
        }
        let mut inner =
            RadixPrefixCache::with_components(num_blocks, block_size, policy, enable_events, comps, sizes)
                .py()?;
        inner.set_max_events(max_events).py()?;
        Ok(PyClassInitializer::from(PyPrefixCache::new(AnyCache::Radix(inner)))
            .add_subclass(PyRadixPrefixCache))
    }

    /// The tree's eviction policy (one of ``RADIX_POLICIES``).
    #[getter]
    fn policy(slf: PyRef<'_, Self>) -> PyResult<&'static str> {
        Ok(radix(slf.as_super())?.tree().policy().name())
    }

    /// Blocks no request and no tree node holds (``num_free_blocks`` also counts the
    /// tree's evictable pages).
    #[getter]
    fn num_unused_blocks(slf: PyRef<'_, Self>) -> PyResult<usize> {
        Ok(radix(slf.as_super())?.pool().num_free())
    }

    /// Pages of the sliding-window pool: ``(free, used, capacity)``, or None without a
    /// sliding-window group. A page's SWA KV is freed once it leaves every window
    /// (a tombstone in the tree keeps its full KV).
    #[getter]
    fn swa_blocks(slf: PyRef<'_, Self>) -> PyResult<Option<(usize, usize, usize)>> {
        Ok(radix(slf.as_super())?.swa_pool().map(|p| (p.num_free(), p.num_used(), p.capacity())))
    }

    /// Mamba state slots: ``(free, used, capacity)``, or None without a Mamba group.
    /// Each running request holds one; the tree holds the others.
    #[getter]
    fn mamba_states(slf: PyRef<'_, Self>) -> PyResult<Option<(usize, usize, usize)>> {
        Ok(radix(slf.as_super())?.mamba_pool().map(|p| (p.num_free(), p.num_used(), p.capacity())))
    }

    /// ``(evictable, protected)`` tokens of live sliding-window KV in the tree.
    #[getter]
    fn swa_sizes(slf: PyRef<'_, Self>) -> PyResult<(usize, usize)> {
        Ok(radix(slf.as_super())?.tree().swa_sizes())
    }

    /// ``(evictable, protected)`` Mamba states in the tree.
    #[getter]
    fn mamba_sizes(slf: PyRef<'_, Self>) -> PyResult<(usize, usize)> {
        Ok(radix(slf.as_super())?.tree().mamba_sizes())
    }

    /// Tokens in the tree.
    #[getter]
    fn cached_tokens(slf: PyRef<'_, Self>) -> PyResult<usize> {
        Ok(radix(slf.as_super())?.tree().total_size())
    }

    /// Tokens in unlocked tree nodes.
    #[getter]
    fn evictable_size(slf: PyRef<'_, Self>) -> PyResult<usize> {
        Ok(radix(slf.as_super())?.tree().evictable_size())
    }

    /// Tokens in locked tree nodes.
    #[getter]
    fn protected_size(slf: PyRef<'_, Self>) -> PyResult<usize> {
        Ok(radix(slf.as_super())?.tree().protected_size())
    }

    /// Evicts unlocked tree leaves until ``num_tokens`` are freed (may free more);
    /// returns the tokens evicted (their pages return to the cache's own pool).
    fn evict(slf: &Bound<'_, Self>, num_tokens: &Bound<'_, PyAny>) -> PyResult<usize> {
        let n = args::usize_arg(num_tokens, "num_tokens", usize::MAX)?;
        Ok(slf.as_super().try_borrow_mut()?.inner.radix_mut()?.evict(n))
    }

    /// Leading tokens of a running request served by cached tree pages.
    fn num_cached_tokens(slf: &Bound<'_, Self>, request_id: &Bound<'_, PyAny>) -> PyResult<usize> {
        let id = RequestId(args::u64_arg(request_id, "request_id")?);
        radix(&slf.as_super().try_borrow()?)?.num_cached_tokens(id).py()
    }

    /// The KV-event page hashes the tree holds (uint64, ascending, each once): the set a
    /// subscriber holds after applying every event the cache emitted (if the bounded
    /// event buffer dropped none). Read-only. ``InvalidArgumentError`` unless
    /// ``enable_events`` (the tree hashes no page then).
    fn cached_page_hashes<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyArray1<u64>>> {
        let v = radix(&slf.as_super().try_borrow()?)?.tree().cached_page_hashes().py()?;
        Ok(PyArray1::from_vec(slf.py(), v))
    }

    /// The pages the tree holds.
    fn cached_blocks<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyArray1<i32>>> {
        let mut v = Vec::new();
        radix(&slf.as_super().try_borrow()?)?.tree().all_values(&mut v);
        common::block_ids_array(slf.py(), &v)
    }

    /// A human-readable dump of the tree, one line per node.
    fn dump(slf: PyRef<'_, Self>) -> PyResult<String> {
        Ok(radix(slf.as_super())?.tree().dump())
    }

    fn __repr__(slf: PyRef<'_, Self>) -> PyResult<String> {
        let c = radix(slf.as_super())?;
        Ok(format!(
            "RadixPrefixCache(num_blocks={}, block_size={}, policy={:?}, free={}, cached_tokens={}, requests={})",
            c.pool().num_pages(),
            c.page_size(),
            c.tree().policy().name(),
            c.num_free_blocks(),
            c.tree().total_size(),
            c.num_requests()
        ))
    }
}
