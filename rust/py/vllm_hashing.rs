//! `VllmRequestHasher`: vLLM 0.33's `request_block_hasher` as one native call
//! per request (the algorithm is [`crate::core::hash::vllm_request`]).
//!
//! The call reads what vLLM's hasher reads from a `vllm.v1.request.Request`
//! (`block_hashes`, `_all_token_ids`, `lora_request`, `cache_salt`,
//! `mm_features`, `prompt_embeds`) and hashes the blocks that became full
//! since the last call. A request whose hash bytes this path cannot
//! reproduce exactly goes to the `fallback` callable (vLLM's own hasher)
//! instead, so the result is always vLLM's: prompt embeddings, token ids that
//! are not exact ints in int64, keys that are not exact strs, multimodal
//! items that are unsorted, overlapping, empty or at negative offsets, a
//! parent hash that is not bytes of at most 32, and, for the pickle
//! algorithms, two keys that are one string object or a user string equal
//! to one of vLLM's tag strings (pickle memoises by identity).
// `unsafe` here only reads the token list in place: each use states why no
// Python code runs while borrowed items are held.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString};

use super::errors::{invalid, IntoPyResult};
use crate::core::hash::vllm_request::{vllm_algo, VllmRequestHasher};
use crate::core::hash::{HashAlgo, KeySpec, MmItem};
use crate::core::ids::BlockHash;

/// Requests with at least this many new tokens are hashed with the GIL released.
const DETACH_MIN_TOKENS: usize = 4096;

/// The largest digest a parent hash may have (SHA-256).
const MAX_PARENT: usize = 32;

/// vLLM 0.33's ``request_block_hasher`` as one native call per request (see
/// :mod:`kvindex.integrations.vllm.hashing`).
#[pyclass(module = "kvindex._core", name = "VllmRequestHasher", frozen)]
pub struct PyVllmRequestHasher {
    algo: HashAlgo,
    block_size: usize,
    /// vLLM's own hasher, called for requests this path does not reproduce.
    fallback: Py<PyAny>,
    /// The chain root: bytes, or an object whose `NONE_HASH` is read when a
    /// request has no hashes yet (vLLM's `kv_cache_utils` module).
    root: Py<PyAny>,
    /// Reused scratch (token copy, hashes); a concurrent call makes its own.
    scratch: Mutex<Scratch>,
    fallbacks: AtomicU64,
}

#[derive(Default)]
struct Scratch {
    tokens: Vec<i64>,
    out: Vec<BlockHash>,
    hasher: Option<VllmRequestHasher>,
}

/// Why a request goes to the fallback (not an error: vLLM's hasher decides).
struct Unsupported;

type Fast<T> = Result<T, Unsupported>;

fn exact_str(obj: &Bound<'_, PyAny>) -> Fast<String> {
    if !obj.is_exact_instance_of::<PyString>() {
        return Err(Unsupported);
    }
    let s = obj.cast::<PyString>().map_err(|_| Unsupported)?;
    s.to_str().map(str::to_owned).map_err(|_| Unsupported)
}

fn exact_int(obj: &Bound<'_, PyAny>) -> Fast<i64> {
    // SAFETY: `obj` is a live object; the exact-int check means
    // `PyLong_AsLongLong` runs no Python code.
    unsafe {
        let p = obj.as_ptr();
        if ffi::PyLong_CheckExact(p) == 0 {
            return Err(Unsupported);
        }
        let v = ffi::PyLong_AsLongLong(p);
        if v == -1 && !ffi::PyErr_Occurred().is_null() {
            ffi::PyErr_Clear();
            return Err(Unsupported);
        }
        Ok(v)
    }
}

/// The request's extra-key inputs for blocks from token `start` on, plus the
/// string objects that reach the pickle payloads (for the identity check).
fn key_spec<'py>(
    req: &Bound<'py, PyAny>,
    start: usize,
    strings: &mut Vec<Bound<'py, PyAny>>,
) -> PyResult<Fast<KeySpec>> {
    let py = req.py();
    if !req.getattr(intern!(py, "prompt_embeds"))?.is_none() {
        return Ok(Err(Unsupported));
    }
    let mut lora = None;
    let lr = req.getattr(intern!(py, "lora_request"))?;
    if lr.is_truthy()? {
        let name = lr.getattr(intern!(py, "lora_name"))?;
        let path = lr.getattr(intern!(py, "lora_path"))?;
        let (Ok(n), Ok(p)) = (exact_str(&name), exact_str(&path)) else { return Ok(Err(Unsupported)) };
        lora = Some((n, p));
        strings.push(name);
        strings.push(path);
    }
    let mut cache_salt = None;
    if start == 0 {
        let salt = req.getattr(intern!(py, "cache_salt"))?;
        if salt.is_truthy()? {
            let Ok(s) = exact_str(&salt) else { return Ok(Err(Unsupported)) };
            cache_salt = Some(s);
            strings.push(salt);
        }
    }
    let mut mm_items = Vec::new();
    let feats = req.getattr(intern!(py, "mm_features"))?;
    if feats.is_truthy()? {
        let Ok(feats) = feats.cast::<PyList>() else { return Ok(Err(Unsupported)) };
        let pos = |f: &Bound<'py, PyAny>| -> PyResult<Fast<(i64, i64)>> {
            let p = f.getattr(intern!(py, "mm_position"))?;
            let off = p.getattr(intern!(py, "offset"))?;
            let len = p.getattr(intern!(py, "length"))?;
            Ok(match (exact_int(&off), exact_int(&len)) {
                (Ok(o), Ok(l)) => Ok((o, l)),
                _ => Err(Unsupported),
            })
        };
        // vLLM skips every item once the last one ends at or before `start`.
        let n = feats.len();
        if n == 0 {
            // A truthy empty list (a subclass): vLLM's own hasher decides.
            return Ok(Err(Unsupported));
        }
        let Ok((lo, ll)) = pos(&feats.get_item(n - 1)?)? else { return Ok(Err(Unsupported)) };
        #[allow(clippy::cast_possible_wrap)]
        if lo.checked_add(ll).is_none_or(|end| end > start as i64) {
            for f in feats.iter() {
                let Ok((offset, length)) = pos(&f)? else { return Ok(Err(Unsupported)) };
                let id = f.getattr(intern!(py, "identifier"))?;
                let Ok(identifier) = exact_str(&id) else { return Ok(Err(Unsupported)) };
                mm_items.push(MmItem { identifier, offset, length });
                strings.push(id);
            }
        }
    }
    Ok(KeySpec::new(lora, cache_salt, mm_items).map_err(|_| Unsupported))
}

/// Pickle memoises by object identity: a payload whose strings share an
/// object (other than CPython's shared one-character and empty strings,
/// which the encoder handles by value) or equal a tag is not reproduced here.
fn pickle_identity_ok(strings: &[Bound<'_, PyAny>], spec: &KeySpec) -> bool {
    let tag = |s: &str| matches!(s, "lora" | "mm" | "cache_salt");
    if spec.lora.as_ref().is_some_and(|(n, p)| tag(n) || tag(p))
        || spec.cache_salt.as_deref().is_some_and(tag)
        || spec.mm_items.iter().any(|m| tag(&m.identifier))
    {
        return false;
    }
    // CPython's shared strings: "" and one character below U+0100.
    let shared = |o: &Bound<'_, PyAny>| {
        o.cast::<PyString>().ok().and_then(|s| s.to_str().ok()).is_some_and(|s| {
            let mut c = s.chars();
            match (c.next(), c.next()) {
                (None, _) => true,
                (Some(ch), None) => (ch as u32) < 256,
                _ => false,
            }
        })
    };
    for (i, a) in strings.iter().enumerate() {
        if shared(a) {
            continue;
        }
        if strings[i + 1..].iter().any(|b| a.is(b)) {
            return false;
        }
    }
    true
}

/// Copies `list[start..end]` into `out` when every item is an exact int that
/// fits in int64.
fn read_tokens(list: &Bound<'_, PyList>, start: usize, end: usize, out: &mut Vec<i64>) -> Fast<()> {
    out.clear();
    out.reserve(end - start);
    let lp = list.as_ptr();
    for i in start..end {
        // SAFETY: `i < len(list)` (checked by the caller, and no Python code
        // runs in this loop, so the list cannot shrink); the item is a
        // borrowed reference kept alive by the list, and the exact-int check
        // means `PyLong_AsLongLong` runs no Python code.
        #[allow(clippy::cast_possible_wrap)]
        unsafe {
            let item = ffi::PyList_GetItem(lp, i as ffi::Py_ssize_t);
            if item.is_null() || ffi::PyLong_CheckExact(item) == 0 {
                ffi::PyErr_Clear();
                return Err(Unsupported);
            }
            let v = ffi::PyLong_AsLongLong(item);
            if v == -1 && !ffi::PyErr_Occurred().is_null() {
                ffi::PyErr_Clear();
                return Err(Unsupported);
            }
            out.push(v);
        }
    }
    Ok(())
}

impl PyVllmRequestHasher {
    fn chain_root(&self, py: Python<'_>) -> PyResult<Fast<BlockHash>> {
        let root = self.root.bind(py);
        let b = if root.is_instance_of::<PyBytes>() {
            root.clone()
        } else {
            root.getattr(intern!(py, "NONE_HASH"))?
        };
        Ok(parent_of(&b))
    }

    fn fast<'py>(&self, req: &Bound<'py, PyAny>) -> PyResult<Fast<Bound<'py, PyList>>> {
        let py = req.py();
        let hashes = req.getattr(intern!(py, "block_hashes"))?;
        let Ok(hashes) = hashes.cast::<PyList>() else { return Ok(Err(Unsupported)) };
        let toks = req.getattr(intern!(py, "_all_token_ids"))?;
        let Ok(toks) = toks.cast::<PyList>() else { return Ok(Err(Unsupported)) };
        let bs = self.block_size;
        let done = hashes.len();
        let start = done * bs;
        let ntok = toks.len();
        if start + bs > ntok {
            return Ok(Ok(PyList::empty(py)));
        }
        let end = start + (ntok - start) / bs * bs;
        // vLLM: a falsy parent (no hashes yet, or b"") chains from NONE_HASH.
        let last = if done > 0 { Some(hashes.get_item(done - 1)?) } else { None };
        let parent = match last {
            Some(p) if p.is_truthy()? => parent_of(&p),
            _ => self.chain_root(py)?,
        };
        let Ok(parent) = parent else { return Ok(Err(Unsupported)) };
        let mut strings = Vec::new();
        let Ok(spec) = key_spec(req, start, &mut strings)? else { return Ok(Err(Unsupported)) };
        if matches!(self.algo, HashAlgo::VllmSha256 | HashAlgo::VllmXxhash)
            && !pickle_identity_ok(&strings, &spec)
        {
            return Ok(Err(Unsupported));
        }
        drop(strings);
        let mut guard = self.scratch.try_lock();
        let mut own = Scratch::default();
        let scratch = match guard.as_mut() {
            Ok(g) => &mut **g,
            Err(_) => &mut own,
        };
        let Scratch { tokens, out, hasher } = scratch;
        if read_tokens(toks, start, end, tokens).is_err() {
            return Ok(Err(Unsupported));
        }
        let h = match hasher {
            Some(h) => h,
            None => hasher.insert(VllmRequestHasher::new(self.algo, bs).py()?),
        };
        out.clear();
        if tokens.len() >= DETACH_MIN_TOKENS {
            // The tokens are a private copy, so other threads may run.
            py.detach(|| h.hash_new_blocks(&parent, done, tokens, &spec, out));
        } else {
            h.hash_new_blocks(&parent, done, tokens, &spec, out);
        }
        let list = PyList::new(py, out.iter().map(|x| PyBytes::new(py, x.as_bytes())))?;
        Ok(Ok(list))
    }
}

/// A parent hash vLLM would feed into the next block's payload, if this path
/// can reproduce it: exact bytes of 1 to 32 bytes.
fn parent_of(obj: &Bound<'_, PyAny>) -> Fast<BlockHash> {
    if !obj.is_exact_instance_of::<PyBytes>() {
        return Err(Unsupported);
    }
    let b = obj.cast::<PyBytes>().map_err(|_| Unsupported)?.as_bytes();
    if b.is_empty() || b.len() > MAX_PARENT {
        return Err(Unsupported);
    }
    Ok(BlockHash::from_digest(b))
}

#[pymethods]
impl PyVllmRequestHasher {
    /// A hasher for vLLM's ``algo`` (``sha256``, ``sha256_cbor``, ``xxhash``,
    /// ``xxhash_cbor``; the ``vllm_`` names too) at ``block_size`` tokens per
    /// hashed block. ``none_hash`` is the chain root: bytes, or an object whose
    /// ``NONE_HASH`` attribute is read when a request has no hashes yet.
    /// ``fallback`` (a ``Request -> list[bytes]`` callable, vLLM's own hasher)
    /// takes the requests whose bytes this path does not reproduce.
    #[new]
    #[pyo3(signature = (block_size, algo, *, none_hash, fallback))]
    fn new(
        block_size: &Bound<'_, PyAny>,
        algo: &str,
        none_hash: Py<PyAny>,
        fallback: Py<PyAny>,
    ) -> PyResult<Self> {
        let block_size = super::args::i64_arg(block_size, "block_size")?;
        if !(1..=1 << 20).contains(&block_size) {
            return Err(invalid(format!("block_size must be in 1..=2**20, got {block_size}")));
        }
        #[allow(clippy::cast_sign_loss, clippy::cast_possible_truncation)]
        let block_size = block_size as usize;
        let algo = vllm_algo(algo).py()?;
        Ok(PyVllmRequestHasher {
            algo,
            block_size,
            fallback,
            root: none_hash,
            scratch: Mutex::new(Scratch::default()),
            fallbacks: AtomicU64::new(0),
        })
    }

    /// The hashes of ``request``'s blocks that became full since its last
    /// ``block_hashes`` entry (vLLM's ``request_block_hasher(request)``).
    fn __call__<'py>(&self, request: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        if let Ok(list) = self.fast(request)? {
            return Ok(list.into_any());
        }
        self.fallbacks.fetch_add(1, Ordering::Relaxed);
        self.fallback.bind(request.py()).call1((request,))
    }

    /// The algorithm, as vLLM names it.
    #[getter]
    fn algo(&self) -> &'static str {
        match self.algo {
            HashAlgo::VllmSha256Cbor => "sha256_cbor",
            HashAlgo::VllmXxhash => "xxhash",
            HashAlgo::VllmXxhashCbor => "xxhash_cbor",
            _ => "sha256",
        }
    }

    /// Tokens per hashed block.
    #[getter]
    fn block_size(&self) -> usize {
        self.block_size
    }

    /// How many calls went to the fallback so far.
    #[getter]
    fn fallback_calls(&self) -> u64 {
        self.fallbacks.load(Ordering::Relaxed)
    }
}
