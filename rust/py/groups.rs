//! KV cache group layouts from Python, and `explain_layout` (the figures of
//! `kvindex explain`, computed by [`crate::core::explain`]).
//!
//! A layout argument is a sequence of `(kind, block_size, size, mamba_mode)`
//! tuples in group order: `kind` as vLLM's `kv_cache_spec_kind` spells it,
//! `size` the sliding window or the attention chunk (0 otherwise),
//! `mamba_mode` `"none"` / `"align"` for Mamba, `"bounded_replay"` /
//! `"none"` for sliding-window MLA (`""` otherwise).

use std::sync::Mutex;

use numpy::{PyArray1, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use super::args;
use super::errors::{dtype, IntoPyResult};
use crate::core::explain::{min_cacheable_prompt, repeated_prompt, Replay};
use crate::core::groups::rule::window_blocks;
use crate::core::groups::spec::{GroupKind, GroupLayout, GroupSpec, LayoutOptions};
use crate::core::radix::Components;

/// Most groups a layout argument may hold.
const MAX_GROUPS: usize = 64;

/// The group specs of a layout argument (module header); an empty
/// `mamba_mode` stands for `"none"`.
///
/// # Errors
/// `DTypeError` for a non-sequence or a malformed tuple; `InvalidArgumentError`
/// for more than 64 groups or a kind [`GroupKind::parse`] rejects.
pub fn group_specs(groups: &Bound<'_, PyAny>) -> PyResult<Vec<GroupSpec>> {
    if !(groups.is_instance_of::<PyList>() || groups.is_instance_of::<PyTuple>()) {
        return Err(dtype("groups must be a list or tuple of (kind, block_size, size, mamba_mode) tuples"));
    }
    let n = groups.len()?;
    if n > MAX_GROUPS {
        return Err(super::errors::invalid(format!("at most {MAX_GROUPS} groups, got {n}")));
    }
    let mut specs = Vec::with_capacity(n);
    for (i, g) in groups.try_iter()?.enumerate() {
        let g = g?;
        let t = g.cast::<PyTuple>().map_err(|_| {
            dtype(format!("groups[{i}] must be a (kind, block_size, size, mamba_mode) tuple"))
        })?;
        if t.len() != 4 {
            return Err(dtype(format!("groups[{i}] must have 4 fields, got {}", t.len())));
        }
        let kind = t.get_item(0)?;
        let kind = args::text(&kind, "kind")?.to_owned();
        let bs = args::usize_arg(&t.get_item(1)?, "block_size", 1 << 30)?;
        let size = args::usize_arg(&t.get_item(2)?, "size", 1 << 40)?;
        let mode = t.get_item(3)?;
        let mode = args::text(&mode, "mamba_mode")?;
        let mode = if mode.is_empty() { "none" } else { mode };
        let kind = GroupKind::parse(&kind, size, mode)
            .map_err(|e| super::errors::invalid(format!("groups[{i}]: {e}")))?;
        specs.push(GroupSpec { kind, block_size: bs });
    }
    Ok(specs)
}

/// A [`GroupLayout`] from a layout argument (module header).
///
/// # Errors
/// As [`group_specs`]; also what [`GroupLayout::new`] rejects.
pub fn layout_arg(groups: &Bound<'_, PyAny>, enable_caching: bool, use_eagle: bool) -> PyResult<GroupLayout> {
    let specs = group_specs(groups)?;
    GroupLayout::new(specs, LayoutOptions { enable_caching, use_eagle, ..LayoutOptions::default() }).py()
}

/// [`layout_arg`] as a vLLM engine runs it: partial hash hits on where the
/// layout allows them (vLLM's default `allow_partial_hash_hits`).
///
/// # Errors
/// As [`layout_arg`].
pub fn engine_layout_arg(groups: &Bound<'_, PyAny>, use_eagle: bool) -> PyResult<GroupLayout> {
    let specs = group_specs(groups)?;
    let opt = LayoutOptions {
        enable_caching: true,
        use_eagle,
        allow_partial_hash_hits: true,
        ..LayoutOptions::default()
    };
    GroupLayout::new(specs, opt).py()
}

/// The radix tree's page size and components for a layout argument, and the
/// layout described in words.
///
/// # Errors
/// As [`layout_arg`] and [`Components::from_layout`].
pub fn radix_components(groups: &Bound<'_, PyAny>) -> PyResult<(usize, Components, String)> {
    let layout = layout_arg(groups, true, false)?;
    let (bs, comps) = Components::from_layout(&layout).py()?;
    Ok((bs, comps, Components::describe(&layout)))
}

/// The figures of `kvindex explain` for `groups` (`(kind, block_size, size,
/// mamba_mode)` tuples in group order) and a prompt of `prompt_tokens` tokens
/// seen twice (the first time prefilled in chunks of `chunk` tokens; None: at
/// once). Keys: `hash_block_size`, `scheduler_block_size`, `alignment`, `sets`
/// (per spec set: `kind`, `block_size`, `group_ids`, `window_blocks` for a
/// sliding window, `hit` (its rule alone), `cached`, `nulls`, `reused`
/// (blocks)), `hit` (tokens the repeat reuses) and `min_prompt` (the shortest
/// prompt whose repeat hits, up to `limit` tokens (default 2**17), or None).
#[pyfunction]
#[pyo3(signature = (groups, prompt_tokens, *, chunk = None, use_eagle = None, limit = None))]
pub fn explain_layout<'py>(
    py: Python<'py>,
    groups: &Bound<'py, PyAny>,
    prompt_tokens: &Bound<'py, PyAny>,
    chunk: Option<&Bound<'py, PyAny>>,
    use_eagle: Option<&Bound<'py, PyAny>>,
    limit: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyDict>> {
    let n = args::usize_arg(prompt_tokens, "prompt_tokens", 1 << 26)?;
    let chunk = args::opt_usize_arg(chunk, "chunk", 1 << 26)?;
    if chunk == Some(0) {
        return Err(super::errors::invalid("chunk must be positive"));
    }
    let eagle = use_eagle.map(|o| args::flag(o, "use_eagle")).transpose()?.unwrap_or(false);
    let limit = args::opt_usize_arg(limit, "limit", 1 << 20)?.unwrap_or(1 << 17);
    let layout = layout_arg(groups, true, eagle)?;
    let (r, min) =
        py.detach(|| (repeated_prompt(&layout, n, chunk), min_cacheable_prompt(&layout, chunk, limit)));
    let d = PyDict::new(py);
    d.set_item("hash_block_size", layout.hash_block_size())?;
    d.set_item("scheduler_block_size", layout.scheduler_block_size())?;
    d.set_item("alignment", layout.alignment())?;
    let sets = PyList::empty(py);
    for (k, s) in layout.spec_sets().iter().enumerate() {
        let e = PyDict::new(py);
        e.set_item("kind", s.spec.kind.kind_name())?;
        e.set_item("block_size", s.spec.block_size)?;
        e.set_item("group_ids", s.group_ids.clone())?;
        if let Some(window) = s.spec.kind.sliding_window() {
            e.set_item("window_blocks", window_blocks(window, s.spec.block_size, eagle))?;
        }
        e.set_item("hit", r.set_hits[k])?;
        e.set_item("cached", r.set_cached[k])?;
        e.set_item("nulls", r.set_nulls[k])?;
        e.set_item("reused", r.set_reused[k])?;
        sets.append(e)?;
    }
    d.set_item("sets", sets)?;
    d.set_item("hit", r.hit)?;
    d.set_item("min_prompt", min)?;
    Ok(d)
}

/// A stream of requests through one engine's cache under a group layout, nothing
/// evicted (``kvindex simulate --model``): each request hits what earlier ones left
/// cached, by the core's hybrid fixed point, then leaves its own blocks cached.
/// ``groups`` as ``explain_layout`` takes them; with ``enable_caching=False`` (what a
/// Mamba group in ``"none"`` mode leaves) nothing hits.
#[pyclass(module = "kvindex._core", name = "_GroupReplay")]
pub struct PyGroupReplay {
    inner: Mutex<Replay>,
}

#[pymethods]
impl PyGroupReplay {
    #[new]
    #[pyo3(signature = (groups, *, enable_caching = None))]
    fn new(groups: &Bound<'_, PyAny>, enable_caching: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let on = enable_caching.map(|o| args::flag(o, "enable_caching")).transpose()?.unwrap_or(true);
        Ok(PyGroupReplay { inner: Mutex::new(Replay::new(layout_arg(groups, on, false)?)) })
    }

    /// Tokens per block hash (the gcd of the block sizes).
    #[getter]
    fn hash_block_size(&self) -> usize {
        self.lock().layout().hash_block_size()
    }

    /// Per spec set: `(kind, block_size, group_ids)`.
    #[getter]
    fn sets(&self) -> Vec<(&'static str, usize, Vec<usize>)> {
        let r = self.lock();
        r.layout()
            .spec_sets()
            .iter()
            .map(|s| (s.spec.kind.kind_name(), s.spec.block_size, s.group_ids.clone()))
            .collect()
    }

    /// Per spec set: blocks cached.
    #[getter]
    fn cached_blocks(&self) -> Vec<usize> {
        self.lock().cached_blocks()
    }

    /// Runs one request: a prompt of `prompt_tokens` tokens ending with `total_tokens`
    /// (prompt and output); `hashes` (uint64) are the block hashes of all its tokens at
    /// the hash block size; the prompt is prefilled in chunks of `chunk` tokens (None:
    /// at once). Returns `(hit tokens, per spec set: the tokens its rule alone reuses)`.
    #[pyo3(signature = (hashes, prompt_tokens, total_tokens, chunk = None))]
    fn request(
        &self,
        hashes: &Bound<'_, PyAny>,
        prompt_tokens: &Bound<'_, PyAny>,
        total_tokens: &Bound<'_, PyAny>,
        chunk: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<(usize, Vec<usize>)> {
        let n = args::usize_arg(prompt_tokens, "prompt_tokens", 1 << 30)?;
        let total = args::usize_arg(total_tokens, "total_tokens", 1 << 30)?;
        if total < n {
            return Err(super::errors::invalid(format!("total_tokens {total} < prompt_tokens {n}")));
        }
        let chunk = args::opt_usize_arg(chunk, "chunk", 1 << 30)?;
        if chunk == Some(0) {
            return Err(super::errors::invalid("chunk must be positive"));
        }
        let arr = hashes
            .cast::<PyArray1<u64>>()
            .map_err(|_| dtype("hashes must be a 1-D numpy array of dtype uint64"))?
            .try_readonly()
            .map_err(|_| super::errors::invalid("hashes is being written elsewhere"))?;
        let h = arr.as_slice().map_err(|_| dtype("hashes must be C-contiguous"))?;
        let hb = self.lock().layout().hash_block_size();
        if h.len() != total / hb {
            return Err(super::errors::invalid(format!(
                "{} hashes for {total} tokens in blocks of {hb}",
                h.len()
            )));
        }
        let r = self.lock().request(h, n, total, chunk);
        Ok((r.hit, r.set_hits))
    }
}

impl PyGroupReplay {
    fn lock(&self) -> std::sync::MutexGuard<'_, Replay> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
