//! `ClusterIndex`: the Python face of [`core::ClusterIndex`].
//!
//! Threading: the index sits behind a read-write lock, the query hasher
//! behind its own mutex, and methods take `&self`, so a receive thread
//! applying batches and scheduler threads querying never see a half-applied
//! batch and never get "already borrowed". Large payloads are applied with
//! the GIL released (bytes objects are immutable, so the borrowed buffer
//! stays valid).

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use numpy::{PyArray1, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};

use super::arrays::{self, with_tokens, with_views, TokensOrList};
use super::errors::{dtype, inv_to_py, invalid, IntoPyResult};
use super::keys;
use crate::core::cluster::groups::{Basis, ScoreScratch};
use crate::core::cluster::layout::ClusterLayout;
use crate::core::cluster::query::QueryHasher;
use crate::core::cluster::{self as core, route, Outcome, WorkerId};

/// Payloads at least this long are applied with the GIL released.
const DETACH_MIN_BYTES: usize = 64 * 1024;

struct Scratch {
    hasher: QueryHasher,
    hashes: Vec<u64>,
    overlaps: Vec<u32>,
    score: ScoreScratch,
    basis: Vec<Basis>,
    /// Full blocks of the last prompt given to `overlaps_of_tokens`.
    blocks: usize,
}

/// Prefix index of a cluster of workers (one per engine and data-parallel rank),
/// fed by their KV-event batches. Thread-safe: one thread may apply batches while
/// others query. Per-worker answers are int32 arrays of length :attr:`slots`.
///
/// Queries by tokens hash the prompt as the workers' events do: ``algo`` names a
/// hash-chain algorithm (``HashChainCache`` workers; ``seed`` is its chain seed) or
/// ``"radix_xxh3_64"`` for ``RadixPrefixCache`` workers (the tree's page hashes,
/// namespaced by ``lora`` and ``cache_salt``; no ``seed``; ``mm_items`` and ids
/// outside int32 raise ``InvalidArgumentError`` as that cache does).
///
/// ``apply`` outcomes: ``"applied"``; ``"duplicate"`` (sequence number already
/// applied with the same payload, ignored); ``"gap"`` (not applied; the second
/// element is the first missing sequence number: replay from it, or ``give_up``);
/// ``"restarted"`` (sequence went back: the worker's blocks were dropped and this
/// batch, sequence 0, applied); ``"malformed: <why>"`` (undecodable, another
/// block size or data-parallel rank: counted, worker degraded, nothing applied);
/// ``"unknown_worker"`` (counted in
/// :attr:`unknown_worker_batches`).
#[pyclass(module = "kvindex._core", name = "ClusterIndex")]
pub struct PyClusterIndex {
    inner: RwLock<core::ClusterIndex>,
    scratch: Mutex<Scratch>,
    algo: &'static str,
    seed: Option<String>,
}

impl PyClusterIndex {
    fn read(&self) -> RwLockReadGuard<'_, core::ClusterIndex> {
        self.inner.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, core::ClusterIndex> {
        self.inner.write().unwrap_or_else(PoisonError::into_inner)
    }

    fn scratch(&self) -> MutexGuard<'_, Scratch> {
        self.scratch.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn bs(&self) -> usize {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let bs = self.read().block_size() as usize;
        bs
    }

    /// Fills the scratch's overlaps (and `blocks`) for `tokens`, hashing as it walks.
    fn overlaps_of_tokens(
        &self,
        tokens: &Bound<'_, PyAny>,
        cache_salt: Option<String>,
        lora: Option<&Bound<'_, PyAny>>,
        mm_items: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<MutexGuard<'_, Scratch>> {
        let spec = keys::spec(cache_salt, lora, mm_items)?;
        let bs = self.bs();
        let mut s = self.scratch();
        let arg = TokensOrList::new(tokens, "tokens")?;
        let ix = self.read();
        let (sc, index) = (&mut *s, &*ix);
        sc.blocks = with_views(arg, |t| {
            with_tokens!(t, t => sc.hasher.overlaps(index, t, bs, &spec, &mut sc.hashes, &mut sc.overlaps))
        })?
        .py()?;
        drop(ix);
        Ok(s)
    }

    /// Fills the scratch's overlaps (blocks each worker's engine would reuse),
    /// basis and `blocks` for `tokens` by [`core::ClusterIndex::scores`].
    fn scores_of_tokens(
        &self,
        tokens: &Bound<'_, PyAny>,
        cache_salt: Option<String>,
        lora: Option<&Bound<'_, PyAny>>,
        mm_items: Option<&Bound<'_, PyAny>>,
        prune: Option<(&[f64], f64)>,
    ) -> PyResult<MutexGuard<'_, Scratch>> {
        let spec = keys::spec(cache_salt, lora, mm_items)?;
        let bs = self.bs();
        let mut s = self.scratch();
        let arg = TokensOrList::new(tokens, "tokens")?;
        let sc = &mut *s;
        let n = with_views(
            arg,
            |t| with_tokens!(t, t => sc.hasher.hashes(t, bs, &spec, &mut sc.hashes).map(|()| t.len())),
        )?
        .py()?;
        let ix = self.read();
        // A load of another length than the slots is refused by the caller afterwards.
        let prune = prune.filter(|(l, _)| l.len() == ix.slots());
        ix.scores(&sc.hashes, n, prune, &mut sc.score, &mut sc.overlaps, &mut sc.basis);
        sc.blocks = sc.hashes.len();
        drop(ix);
        Ok(s)
    }
}

/// Converters of the scalar arguments, under the binding's one rule
/// ([`super::args`]): `bool` and floats are `DTypeError`, an int outside int64
/// (an 8-byte sequence number >= 2**63 included) `InvalidArgumentError`.
mod param {
    use pyo3::prelude::*;

    use super::super::args;
    use super::super::errors::invalid;

    pub fn worker(o: &Bound<'_, PyAny>) -> PyResult<i64> {
        args::i64_arg(o, "worker")
    }
    pub fn seq(o: &Bound<'_, PyAny>) -> PyResult<i64> {
        args::i64_arg(o, "seq")
    }
    pub fn opt_seq(o: &Bound<'_, PyAny>) -> PyResult<Option<i64>> {
        args::opt_i64_arg(Some(o), "seq")
    }
    pub fn dp_rank(o: &Bound<'_, PyAny>) -> PyResult<i64> {
        args::i64_arg(o, "dp_rank")
    }
    pub fn name(o: &Bound<'_, PyAny>) -> PyResult<String> {
        args::text(o, "name").map(str::to_owned)
    }
    pub fn start(o: &Bound<'_, PyAny>) -> PyResult<usize> {
        args::usize_arg(o, "start", usize::MAX)
    }
    /// A finite weight >= 0.
    pub fn overlap_weight(o: &Bound<'_, PyAny>) -> PyResult<f64> {
        let w = args::f64_arg(o, "overlap_weight")?;
        if !(w.is_finite() && w >= 0.0) {
            return Err(invalid(format!("overlap_weight must be finite and >= 0, got {w}")));
        }
        Ok(w)
    }
}

fn worker_id(worker: i64) -> PyResult<WorkerId> {
    u32::try_from(worker)
        .map(WorkerId)
        .map_err(|_| invalid(format!("worker must be a slot number, got {worker}")))
}

fn seq_number(seq: i64) -> PyResult<u64> {
    u64::try_from(seq).map_err(|_| invalid(format!("sequence numbers are >= 0, got {seq}")))
}

/// Reads block hashes: a 1-D C-contiguous uint64 array, or a list / tuple of
/// ints in `0..2**64` (copied either way).
fn u64_array(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u64>> {
    if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
        return obj.try_iter()?.map(|x| super::args::u64_arg(&x?, what)).collect();
    }
    let a = obj
        .cast::<PyArray1<u64>>()
        .map_err(|_| dtype(format!("{what} must be a 1-D numpy array of dtype uint64")))?;
    if !a.is_contiguous() {
        return Err(dtype(format!("{what} must be C-contiguous")));
    }
    a.to_vec().map_err(|_| dtype(format!("{what} must be C-contiguous")))
}

fn overlaps_array<'py>(py: Python<'py>, v: &[u32]) -> PyResult<Bound<'py, PyArray1<i32>>> {
    arrays::filled_i32(py, v.len(), |buf| {
        for (d, &x) in buf.iter_mut().zip(v) {
            #[allow(clippy::cast_possible_wrap)]
            d.write(x as i32);
        }
        v.len()
    })
}

#[pymethods]
impl PyClusterIndex {
    #[new]
    #[pyo3(
        signature = (block_size, *, algo = "xxh3_128".to_owned(), seed = None),
        text_signature = "(block_size, *, algo='xxh3_128', seed=None)"
    )]
    fn new(
        #[pyo3(from_py_with = super::args::named::event_block_size)] block_size: i64,
        #[pyo3(from_py_with = super::args::named::algo)] algo: String,
        #[pyo3(from_py_with = super::args::named::seed)] seed: Option<String>,
    ) -> PyResult<Self> {
        let hasher = QueryHasher::new(&algo, seed.as_deref()).py()?;
        let inner = core::ClusterIndex::new(block_size).py()?;
        Ok(PyClusterIndex {
            inner: RwLock::new(inner),
            algo: hasher.name(),
            scratch: Mutex::new(Scratch {
                hasher,
                hashes: Vec::new(),
                overlaps: Vec::new(),
                score: ScoreScratch::default(),
                basis: Vec::new(),
                blocks: 0,
            }),
            seed,
        })
    }

    /// Tokens per block.
    #[getter]
    fn block_size(&self) -> i64 {
        self.read().block_size()
    }

    /// The workers' hash scheme (for queries by tokens): a hash-chain algorithm or
    /// ``"radix_xxh3_64"`` (the radix tree's page hashes).
    #[getter]
    fn algo(&self) -> &'static str {
        self.algo
    }

    /// The workers' chain seed (None: the algorithm's default).
    #[getter]
    fn seed(&self) -> Option<String> {
        self.seed.clone()
    }

    /// Number of worker slots: the length of every per-worker answer.
    #[getter]
    fn slots(&self) -> usize {
        self.read().slots()
    }

    /// Distinct blocks in the index.
    #[getter]
    fn num_blocks(&self) -> usize {
        self.read().num_blocks()
    }

    /// (block, worker) pairs in the index.
    #[getter]
    fn num_pairs(&self) -> u64 {
        self.read().num_pairs()
    }

    /// Bytes held by the index's tables.
    #[getter]
    fn memory_bytes(&self) -> usize {
        self.read().memory_bytes()
    }

    /// A counter bumped by every worker added or removed.
    #[getter]
    fn membership(&self) -> u64 {
        self.read().membership()
    }

    /// Batches addressed to a slot without a worker.
    #[getter]
    fn unknown_worker_batches(&self) -> u64 {
        self.read().unknown_worker_batches()
    }

    /// Adds a worker (one event stream); returns its slot. Resyncing until its first batch.
    #[pyo3(signature = (name, dp_rank = 0))]
    fn add_worker(
        &self,
        #[pyo3(from_py_with = param::name)] name: String,
        #[pyo3(from_py_with = param::dp_rank)] dp_rank: i64,
    ) -> PyResult<u32> {
        Ok(self.write().add_worker(&name, dp_rank).py()?.0)
    }

    /// Removes a worker and its blocks; its slot may be reused.
    fn remove_worker(&self, #[pyo3(from_py_with = param::worker)] worker: i64) -> PyResult<()> {
        self.write().remove_worker(worker_id(worker)?).py()
    }

    /// Applies one batch payload of `worker` with sequence number `seq`.
    /// Returns `(outcome, expected_seq)`; outcomes are listed in the class docstring.
    #[pyo3(signature = (worker, seq, payload))]
    fn apply(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = param::worker)] worker: i64,
        #[pyo3(from_py_with = param::opt_seq)] seq: Option<i64>,
        payload: &Bound<'_, PyAny>,
    ) -> PyResult<(String, i64)> {
        let Ok(payload) = payload.cast::<PyBytes>() else {
            return Err(dtype(format!("payload must be bytes, got {}", payload.get_type().name()?)));
        };
        let seq = seq.map(seq_number).transpose()?;
        let Ok(w) = worker_id(worker) else {
            return Ok(("unknown_worker".to_owned(), -1));
        };
        let bytes = payload.as_bytes();
        let run = || self.write().apply(w, seq, bytes);
        let r = if bytes.len() >= DETACH_MIN_BYTES { py.detach(run) } else { run() };
        Ok(match r {
            Err(_) => ("unknown_worker".to_owned(), -1),
            Ok(Outcome::Applied) => ("applied".to_owned(), -1),
            Ok(Outcome::Duplicate) => ("duplicate".to_owned(), -1),
            Ok(Outcome::Restarted) => ("restarted".to_owned(), -1),
            #[allow(clippy::cast_possible_wrap)]
            Ok(Outcome::Gap { expected }) => ("gap".to_owned(), expected as i64),
            Ok(Outcome::Malformed(msg)) => (format!("malformed: {msg}"), -1),
        })
    }

    /// Declares `worker`'s KV cache groups (None: forgets them): a list of
    /// `(kind, block_size, size, mamba_mode)` tuples in group order (`kind` as events
    /// spell `kv_cache_spec_kind`; `size` the window or chunk, else 0; `mamba_mode`
    /// "none"/"align" for Mamba, else ""). Its events must then carry each group's
    /// block size, and `scores`/`route` give it the hit its engine would give over
    /// those groups. The layout's hash block size (the gcd) must be the index's.
    #[pyo3(signature = (worker, groups, *, use_eagle = None))]
    fn set_worker_layout(
        &self,
        #[pyo3(from_py_with = param::worker)] worker: i64,
        groups: &Bound<'_, PyAny>,
        use_eagle: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let w = worker_id(worker)?;
        let eagle = use_eagle.map(|o| super::args::flag(o, "use_eagle")).transpose()?.unwrap_or(false);
        let layout = if groups.is_none() {
            None
        } else {
            let l = super::groups::engine_layout_arg(groups, eagle)?;
            Some(std::sync::Arc::new(ClusterLayout::new(l, self.read().block_size()).py()?))
        };
        self.write().set_worker_layout(w, layout).py()
    }

    /// Per worker slot: the prompt's blocks its engine would reuse (int32), and how
    /// each was scored: `"layout"` (its declared groups' hybrid hit, bounded at
    /// `len(tokens) - 1` as vLLM bounds a hit), `"full_only"` (no layout: the leading
    /// blocks of its full-attention group), `"full_only_hybrid_events"` (the same, but
    /// its events named other groups, whose rules the score ignores) or `""` (no worker).
    #[pyo3(signature = (tokens, *, cache_salt = None, lora = None, mm_items = None))]
    fn scores<'py>(
        &self,
        py: Python<'py>,
        tokens: &Bound<'py, PyAny>,
        #[pyo3(from_py_with = super::args::named::cache_salt)] cache_salt: Option<String>,
        lora: Option<&Bound<'py, PyAny>>,
        mm_items: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<(Bound<'py, PyArray1<i32>>, Vec<&'static str>)> {
        let s = self.scores_of_tokens(tokens, cache_salt, lora, mm_items, None)?;
        Ok((overlaps_array(py, &s.overlaps)?, s.basis.iter().map(|b| b.name()).collect()))
    }

    /// Gives up on `worker`'s batches before `seq`: degraded, stream continues at `seq`.
    fn give_up(
        &self,
        #[pyo3(from_py_with = param::worker)] worker: i64,
        #[pyo3(from_py_with = param::seq)] seq: i64,
    ) -> PyResult<()> {
        self.write().give_up(worker_id(worker)?, seq_number(seq)?).py()
    }

    /// Records `hashes` (uint64) as held by `worker`, without a stream.
    fn store_hashes(
        &self,
        #[pyo3(from_py_with = param::worker)] worker: i64,
        hashes: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let h = u64_array(hashes, "hashes")?;
        self.write().store_hashes(worker_id(worker)?, &h).py()
    }

    /// Drops one reference of `worker` to each of `hashes`; returns how many were not held.
    fn remove_hashes(
        &self,
        #[pyo3(from_py_with = param::worker)] worker: i64,
        hashes: &Bound<'_, PyAny>,
    ) -> PyResult<u64> {
        let h = u64_array(hashes, "hashes")?;
        self.write().remove_hashes(worker_id(worker)?, &h).py()
    }

    /// The prompt's block hashes as events carry them (uint64).
    #[pyo3(signature = (tokens, *, cache_salt = None, lora = None, mm_items = None))]
    fn hashes<'py>(
        &self,
        py: Python<'py>,
        tokens: &Bound<'py, PyAny>,
        #[pyo3(from_py_with = super::args::named::cache_salt)] cache_salt: Option<String>,
        lora: Option<&Bound<'py, PyAny>>,
        mm_items: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyArray1<u64>>> {
        let spec = keys::spec(cache_salt, lora, mm_items)?;
        let bs = self.bs();
        let mut s = self.scratch();
        let arg = TokensOrList::new(tokens, "tokens")?;
        let sc = &mut *s;
        with_views(arg, |t| with_tokens!(t, t => sc.hasher.hashes(t, bs, &spec, &mut sc.hashes)))?.py()?;
        Ok(PyArray1::from_slice(py, &sc.hashes))
    }

    /// Per worker slot: leading blocks of the prompt it holds (int32).
    #[pyo3(signature = (tokens, *, cache_salt = None, lora = None, mm_items = None))]
    fn overlaps<'py>(
        &self,
        py: Python<'py>,
        tokens: &Bound<'py, PyAny>,
        #[pyo3(from_py_with = super::args::named::cache_salt)] cache_salt: Option<String>,
        lora: Option<&Bound<'py, PyAny>>,
        mm_items: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyArray1<i32>>> {
        let s = self.overlaps_of_tokens(tokens, cache_salt, lora, mm_items)?;
        overlaps_array(py, &s.overlaps)
    }

    /// Per worker slot: leading `hashes` (uint64) it holds (int32).
    fn overlaps_for_hashes<'py>(
        &self,
        py: Python<'py>,
        hashes: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<i32>>> {
        let h = u64_array(hashes, "hashes")?;
        let mut out = Vec::new();
        self.read().overlaps(&h, &mut out);
        overlaps_array(py, &out)
    }

    /// Picks the worker of lowest `overlap_weight * (blocks - overlap) + load`
    /// (`load`: float64 per slot, NaN = not eligible). Returns `(slot or -1,
    /// its overlap in blocks, the prompt's full blocks)`.
    #[pyo3(signature = (tokens, load, *, overlap_weight = 1.0, start = 0, cache_salt = None, lora = None, mm_items = None))]
    #[allow(clippy::too_many_arguments)]
    fn route(
        &self,
        tokens: &Bound<'_, PyAny>,
        load: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = param::overlap_weight)] overlap_weight: f64,
        #[pyo3(from_py_with = param::start)] start: usize,
        #[pyo3(from_py_with = super::args::named::cache_salt)] cache_salt: Option<String>,
        lora: Option<&Bound<'_, PyAny>>,
        mm_items: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<(i64, u32, usize)> {
        let load_seq: Vec<f64>;
        let load_arr;
        let load: &[f64] = if load.is_instance_of::<PyList>() || load.is_instance_of::<PyTuple>() {
            load_seq = load
                .try_iter()?
                .map(|x| x?.extract::<f64>().map_err(|_| dtype("load must hold floats")))
                .collect::<PyResult<_>>()?;
            &load_seq
        } else {
            load_arr = load
                .cast::<PyArray1<f64>>()
                .map_err(|_| {
                    dtype("load must be a 1-D numpy array of dtype float64, or a list / tuple of floats")
                })?
                .try_readonly()
                .map_err(|_| invalid("load is being written elsewhere"))?;
            load_arr.as_slice().map_err(|_| dtype("load must be C-contiguous"))?
        };
        let s = if self.read().needs_group_scores() {
            self.scores_of_tokens(tokens, cache_salt, lora, mm_items, Some((load, overlap_weight)))?
        } else {
            self.overlaps_of_tokens(tokens, cache_salt, lora, mm_items)?
        };
        if load.len() != s.overlaps.len() {
            return Err(invalid(format!(
                "load has {} entries for {} worker slots",
                load.len(),
                s.overlaps.len()
            )));
        }
        let n = s.blocks;
        Ok(match route::pick_min_cost(&s.overlaps, n, load, overlap_weight, start) {
            #[allow(clippy::cast_possible_wrap)]
            Some(w) => (w as i64, s.overlaps[w], n),
            None => (-1, 0, n),
        })
    }

    /// Per slot: `"live"`, `"resyncing"`, `"degraded"` or `""` (no worker).
    fn statuses(&self) -> Vec<&'static str> {
        let ix = self.read();
        let mut out = vec![""; ix.slots()];
        for (w, wk) in ix.workers() {
            out[w.0 as usize] = wk.status.name();
        }
        out
    }

    /// One slot's status: `"live"`, `"resyncing"`, `"degraded"` or `""` (no worker).
    fn status(&self, #[pyo3(from_py_with = param::worker)] worker: i64) -> &'static str {
        let ix = self.read();
        worker_id(worker).ok().and_then(|w| ix.worker(w)).map_or("", |w| w.status.name())
    }

    /// Per slot: the worker's incarnation (a number no earlier worker of any slot had),
    /// 0 for an empty slot.
    fn incarnations(&self) -> Vec<u64> {
        let ix = self.read();
        let mut out = vec![0; ix.slots()];
        for (w, wk) in ix.workers() {
            out[w.0 as usize] = wk.incarnation;
        }
        out
    }

    /// One worker's name, dp rank, status, block count, next sequence number,
    /// incarnation and counters.
    fn worker_info<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = param::worker)] worker: i64,
    ) -> PyResult<Bound<'py, PyDict>> {
        let ix = self.read();
        let w =
            ix.worker(worker_id(worker)?).ok_or_else(|| invalid(format!("no worker in slot {worker}")))?;
        let d = PyDict::new(py);
        d.set_item("name", &w.name)?;
        d.set_item("dp_rank", w.dp_rank)?;
        d.set_item("status", w.status.name())?;
        d.set_item("blocks", w.blocks)?;
        d.set_item("next_seq", w.next_seq)?;
        d.set_item("incarnation", w.incarnation)?;
        d.set_item("layout", w.groups.layout().map(|l| l.block_sizes().to_vec()))?;
        let bits = |m: u64| (0..64u32).filter(|g| m >> g & 1 == 1).collect::<Vec<_>>();
        d.set_item("groups_full", bits(w.groups.seen_full))?;
        d.set_item("groups_other", bits(w.groups.seen_other))?;
        let s = w.stats;
        for (k, v) in [
            ("batches", s.batches),
            ("stored", s.stored),
            ("removed", s.removed),
            ("unknown_removals", s.unknown_removals),
            ("cleared", s.cleared),
            ("skipped_events", s.skipped_events),
            ("duplicates", s.duplicates),
            ("gaps", s.gaps),
            ("lost", s.lost),
            ("restarts", s.restarts),
            ("malformed", s.malformed),
        ] {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    /// Every block hash `worker` holds, sorted (uint64); a block of KV cache group
    /// `g > 0` appears as its group key (the hash xor `g * 0x9E3779B97F4A7C15`).
    /// O(blocks in the index).
    fn worker_blocks<'py>(
        &self,
        py: Python<'py>,
        #[pyo3(from_py_with = param::worker)] worker: i64,
    ) -> PyResult<Bound<'py, PyArray1<u64>>> {
        let mut v = self.read().worker_blocks(worker_id(worker)?);
        v.sort_unstable();
        Ok(PyArray1::from_vec(py, v))
    }

    /// One worker's state: every block hash it holds (group keys for groups > 0, as
    /// `worker_blocks` gives them), once per announcement, sorted (uint64), and the
    /// sequence number its stream continues from.
    fn snapshot_worker<'py>(
        &self,
        py: Python<'py>,
        worker: i64,
    ) -> PyResult<(Bound<'py, PyArray1<u64>>, u64)> {
        let (h, next) = self.read().snapshot_worker(worker_id(worker)?).py()?;
        Ok((PyArray1::from_vec(py, h), next))
    }

    /// Replaces a worker's state by a snapshot: it holds `hashes` (uint64; a repeat is
    /// one more reference), its stream continues at `next_seq`, status live.
    fn restore_worker(&self, worker: i64, hashes: &Bound<'_, PyAny>, next_seq: i64) -> PyResult<()> {
        let h = u64_array(hashes, "hashes")?;
        let w = worker_id(worker)?;
        let next = seq_number(next_seq)?;
        self.write().restore_worker(w, &h, next).py()
    }

    /// Raises `InvariantViolation` if the index is inconsistent.
    fn check_invariants(&self) -> PyResult<()> {
        self.read().check_invariants().map_err(inv_to_py)
    }

    fn __repr__(&self) -> String {
        let ix = self.read();
        format!(
            "ClusterIndex(block_size={}, workers={}, blocks={}, pairs={})",
            ix.block_size(),
            ix.workers().count(),
            ix.num_blocks(),
            ix.num_pairs()
        )
    }
}
