//! `block_hashes(...)`: a pure function; releases the GIL for large prompts.

use numpy::{PyArray1, PyArrayMethods};
use pyo3::prelude::*;

use super::arrays::{with_tokens, with_views, TokenArray, TokensOrList};
use super::errors::{capacity, invalid, IntoPyResult};
use super::keys;
use crate::core::hash::{BlockHasher, HashAlgo, KeySpec, Token};
use crate::core::ids::BlockHash;

/// Prompts with at least this many tokens are hashed with the GIL released.
const DETACH_MIN_TOKENS: usize = 4096;

/// The hash and byte buffers of `n` blocks, reserved up front so that an
/// output this machine cannot hold raises `CapacityError` before any work.
fn buffers(n: usize, d: usize) -> PyResult<(Vec<BlockHash>, Vec<u8>)> {
    let fail = || capacity(format!("cannot allocate the hashes of {n} blocks on this machine"));
    let mut out = Vec::new();
    out.try_reserve_exact(n).map_err(|_| fail())?;
    let mut bytes = Vec::new();
    bytes.try_reserve_exact(n.checked_mul(d).ok_or_else(fail)?).map_err(|_| fail())?;
    Ok((out, bytes))
}

/// A private copy of a large prompt's tokens, with its reserved buffers.
enum Owned {
    I32(Vec<i32>, (Vec<BlockHash>, Vec<u8>)),
    I64(Vec<i64>, (Vec<BlockHash>, Vec<u8>)),
}

impl Owned {
    /// Copies `t`.
    fn from(t: TokenArray<'_>, bufs: (Vec<BlockHash>, Vec<u8>)) -> PyResult<Self> {
        fn copy<T: Copy>(s: &[T]) -> PyResult<Vec<T>> {
            let mut own = Vec::new();
            own.try_reserve_exact(s.len()).map_err(|_| capacity("cannot copy the tokens on this machine"))?;
            own.extend_from_slice(s);
            Ok(own)
        }
        Ok(match t {
            TokenArray::I32(s) => Owned::I32(copy(s)?, bufs),
            TokenArray::I64(s) => Owned::I64(copy(s)?, bufs),
        })
    }
}

/// Hashes into the reserved buffers (no allocation).
fn chain<T: Token>(
    algo: HashAlgo,
    seed: Option<&str>,
    tokens: &[T],
    bs: usize,
    spec: &KeySpec,
    (mut out, mut bytes): (Vec<BlockHash>, Vec<u8>),
) -> Vec<u8> {
    let mut h = BlockHasher::new(algo, seed);
    h.extend_chain(tokens, bs, spec, &mut out);
    for x in &out {
        bytes.extend_from_slice(x.as_bytes());
    }
    bytes
}

/// Chained hashes of the full blocks of ``tokens``, shape ``[len(tokens) // block_size, d]``.
///
/// ``h_i = H(serialize(h_{i-1} or NONE_HASH, tokens of block i, extra keys of block i))``
/// with ``NONE_HASH = H(serialize(seed))``. ``algo`` is one of :data:`HASH_ALGOS`:
/// ``xxh3_128`` (default, fastest) and ``sha256`` use kvindex's compact encoding;
/// ``vllm_sha256_cbor``, ``vllm_xxhash_cbor``, ``vllm_sha256`` (pickle, vLLM's default)
/// and ``vllm_xxhash`` are bit-exact with vLLM 0.33. Extra keys as vLLM tags them:
/// ``("lora", name, path)`` on every block, ``("mm", identifier, offset - block_start)``
/// per overlapping multimodal item ``(identifier, offset, length)``, and
/// ``("cache_salt", salt)`` on block 0 for a non-empty salt. ``seed`` defaults to
/// ``"kvindex"`` (compact modes) or ``"vllm-none-hash"`` (vLLM modes).
/// Releases the GIL for 4096 tokens or more.
#[pyfunction]
#[pyo3(
    signature = (tokens, block_size, *, algo = "xxh3_128".to_owned(), seed = None, cache_salt = None, lora = None, mm_items = None),
    text_signature = "(tokens, block_size, *, algo='xxh3_128', seed=None, cache_salt=None, lora=None, mm_items=None)"
)]
#[allow(clippy::too_many_arguments)]
pub fn block_hashes<'py>(
    py: Python<'py>,
    tokens: &Bound<'py, PyAny>,
    #[pyo3(from_py_with = super::args::named::block_size)] block_size: usize,
    #[pyo3(from_py_with = super::args::named::algo)] algo: String,
    #[pyo3(from_py_with = super::args::named::seed)] seed: Option<String>,
    #[pyo3(from_py_with = super::args::named::cache_salt)] cache_salt: Option<String>,
    lora: Option<&Bound<'py, PyAny>>,
    mm_items: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let algo = HashAlgo::parse(&algo).py()?;
    if !(1..=1 << 20).contains(&block_size) {
        return Err(invalid(format!("block_size must be in 1..=2**20, got {block_size}")));
    }
    let bs = block_size;
    let spec = keys::spec(cache_salt, lora, mm_items)?;
    let arg = TokensOrList::new(tokens, "tokens")?;
    let seed = seed.as_deref();
    let d = algo.digest_len();
    // Small prompts are hashed on the view; a large one is copied out of it,
    // then hashed with the GIL released (other threads run meanwhile).
    let done = with_views(arg, |t| -> PyResult<Result<Vec<u8>, Owned>> {
        with_tokens!(t, s => {
            let bufs = buffers(s.len() / bs, d)?;
            if s.len() >= DETACH_MIN_TOKENS {
                Ok(Err(Owned::from(t, bufs)?))
            } else {
                Ok(Ok(chain(algo, seed, s, bs, &spec, bufs)))
            }
        })
    })??;
    let bytes = match done {
        Ok(bytes) => bytes,
        Err(own) => py.detach(|| match own {
            Owned::I32(v, bufs) => chain(algo, seed, &v, bs, &spec, bufs),
            Owned::I64(v, bufs) => chain(algo, seed, &v, bs, &spec, bufs),
        }),
    };
    let n = bytes.len() / d;
    let a = PyArray1::from_vec(py, bytes);
    Ok(a.reshape([n, d])?.into_any())
}

/// The chain's root parent ``H(serialize(seed))`` for ``algo``.
#[pyfunction]
#[pyo3(signature = (*, algo = "xxh3_128".to_owned(), seed = None), text_signature = "(*, algo='xxh3_128', seed=None)")]
pub fn none_hash(
    #[pyo3(from_py_with = super::args::named::algo)] algo: String,
    #[pyo3(from_py_with = super::args::named::seed)] seed: Option<String>,
) -> PyResult<Vec<u8>> {
    let algo = HashAlgo::parse(&algo).py()?;
    Ok(BlockHasher::new(algo, seed.as_deref()).none_hash().as_bytes().to_vec())
}
