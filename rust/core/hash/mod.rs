//! Chained block hashing.
//!
//! # The chain rule
//! A prompt `t[0..N)` with block size `B` has `n = N / B` full blocks; only
//! those are hashed (a partial tail block never is):
//! ```text
//! parent_0 = NONE_HASH = H(serialize(seed))
//! h_i      = H(serialize(parent_i, t[i*B..(i+1)*B], extra_keys_i))
//! parent_{i+1} = h_i
//! ```
//! so `h_i` commits to every token of blocks `0..=i` and their extra keys
//! ([`keys`]). Equal hashes mean equal prefixes (up to collisions of `H`).
//!
//! # Algorithms ([`HashAlgo`])
//! | name | serialisation | digest | use |
//! |---|---|---|---|
//! | `xxh3_128` | kvindex compact | XXH3-128, 16 B big-endian | fastest (default) |
//! | `sha256` | kvindex compact | SHA-256, 32 B | collision resistant |
//! | `vllm_sha256_cbor` | canonical CBOR | SHA-256 | bit-exact vLLM `sha256_cbor` |
//! | `vllm_xxhash_cbor` | canonical CBOR | XXH3-128 | bit-exact vLLM `xxhash_cbor` |
//! | `vllm_sha256` | pickle protocol 5 | SHA-256 | bit-exact vLLM `sha256` (its default) |
//! | `vllm_xxhash` | pickle protocol 5 | XXH3-128 | bit-exact vLLM `xxhash` |
//!
//! # kvindex compact encoding (`xxh3_128`, `sha256`); pinned by golden tests
//! ```text
//! NONE_HASH payload = b"kvindex-none-hash\0" ++ utf8(seed)        (seed default "kvindex")
//! block payload     = parent digest
//!                  ++ u32le(number of tokens) ++ u8 width (4 or 8)
//!                  ++ tokens, each as i32le (width 4: every token of the block fits
//!                     in i32) or i64le (width 8)
//!                  ++ u32le(number of keys) ++ keys
//! key               = 0x01 str(name) str(path)        LoRA
//!                   | 0x02 str(identifier) i64le(off) multimodal
//!                   | 0x03 str(salt)                  cache salt
//! str(s)            = u32le(len utf8) ++ utf8
//! ```
//! The width depends on token values, not on the caller's array dtype, so an
//! int32 and an int64 array with equal values hash alike.
//!
//! Costs: one block costs one serialisation (O(B + keys)) and one digest;
//! [`BlockHasher::extend_chain`] allocates nothing after warm-up.

pub mod cbor;
pub mod keys;
pub mod pickle;
pub mod vllm_request;

use sha2::{Digest, Sha256};
use xxhash_rust::xxh3::xxh3_128;

use crate::core::error::{KvError, KvResult};
use crate::core::ids::BlockHash;
pub use keys::{ExtraKey, KeySpec, MmItem};

/// A hash algorithm (serialisation + digest).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HashAlgo {
    /// kvindex compact encoding, XXH3-128.
    Xxh3_128,
    /// kvindex compact encoding, SHA-256.
    Sha256,
    /// vLLM `sha256_cbor`.
    VllmSha256Cbor,
    /// vLLM `xxhash_cbor`.
    VllmXxhashCbor,
    /// vLLM `sha256` (pickle protocol 5).
    VllmSha256,
    /// vLLM `xxhash` (pickle protocol 5).
    VllmXxhash,
}

/// Every algorithm name accepted by [`HashAlgo::parse`].
pub const ALGO_NAMES: [&str; 6] =
    ["xxh3_128", "sha256", "vllm_sha256_cbor", "vllm_xxhash_cbor", "vllm_sha256", "vllm_xxhash"];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Serial {
    Compact,
    Cbor,
    Pickle,
}

impl HashAlgo {
    /// Parses an algorithm name.
    ///
    /// # Errors
    /// `InvalidArgument` for an unknown name.
    pub fn parse(name: &str) -> KvResult<Self> {
        Ok(match name {
            "xxh3_128" => HashAlgo::Xxh3_128,
            "sha256" => HashAlgo::Sha256,
            "vllm_sha256_cbor" => HashAlgo::VllmSha256Cbor,
            "vllm_xxhash_cbor" => HashAlgo::VllmXxhashCbor,
            "vllm_sha256" => HashAlgo::VllmSha256,
            "vllm_xxhash" => HashAlgo::VllmXxhash,
            _ => {
                return Err(KvError::invalid(format!(
                    "unknown hash algorithm {name:?}; expected one of {}",
                    ALGO_NAMES.join(", ")
                )))
            }
        })
    }

    /// The algorithm's name.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            HashAlgo::Xxh3_128 => "xxh3_128",
            HashAlgo::Sha256 => "sha256",
            HashAlgo::VllmSha256Cbor => "vllm_sha256_cbor",
            HashAlgo::VllmXxhashCbor => "vllm_xxhash_cbor",
            HashAlgo::VllmSha256 => "vllm_sha256",
            HashAlgo::VllmXxhash => "vllm_xxhash",
        }
    }

    /// Digest length in bytes (16 or 32).
    #[must_use]
    pub fn digest_len(self) -> usize {
        if self.is_sha() {
            32
        } else {
            16
        }
    }

    /// True for the SHA-256 algorithms (digest cost dominates serialisation).
    #[must_use]
    pub fn is_sha(self) -> bool {
        matches!(self, HashAlgo::Sha256 | HashAlgo::VllmSha256Cbor | HashAlgo::VllmSha256)
    }

    fn serial(self) -> Serial {
        match self {
            HashAlgo::Xxh3_128 | HashAlgo::Sha256 => Serial::Compact,
            HashAlgo::VllmSha256Cbor | HashAlgo::VllmXxhashCbor => Serial::Cbor,
            HashAlgo::VllmSha256 | HashAlgo::VllmXxhash => Serial::Pickle,
        }
    }

    /// The seed used when the caller gives none: `"kvindex"` for the compact
    /// encodings, vLLM's `"vllm-none-hash"` for the vLLM modes (vLLM itself
    /// draws a random seed for its xxhash modes unless `PYTHONHASHSEED` is
    /// set; kvindex stays deterministic).
    #[must_use]
    pub fn default_seed(self) -> &'static str {
        if self.serial() == Serial::Compact {
            "kvindex"
        } else {
            "vllm-none-hash"
        }
    }

    fn digest(self, payload: &[u8]) -> BlockHash {
        if self.is_sha() {
            BlockHash::from_digest(&Sha256::digest(payload))
        } else {
            BlockHash::from_digest(&xxh3_128(payload).to_be_bytes())
        }
    }
}

/// A token id as the hasher reads it; implemented for the dtypes the API takes.
pub trait Token: Copy + Send + Sync {
    /// Whether every value of the type fits in i32 (no range check needed).
    const ALWAYS_NARROW: bool = false;
    /// The token as i64.
    fn get(self) -> i64;
    /// The token as i32, `None` when out of range.
    #[inline]
    fn narrow(self) -> Option<i32> {
        i32::try_from(self.get()).ok()
    }
    /// The slice itself when the type is i32 (a free view), else `None`.
    #[inline]
    fn as_i32(_s: &[Self]) -> Option<&[i32]> {
        None
    }
    /// The slice itself when the type is i64 (a free view), else `None`.
    #[inline]
    fn as_i64(_s: &[Self]) -> Option<&[i64]> {
        None
    }

    /// Checks the caches' token rule: every id fits in int32 (see
    /// [`token_out_of_range`]). O(tokens) for int64, free for int32.
    ///
    /// # Errors
    /// `InvalidArgument` naming the first id outside int32.
    #[inline]
    fn check_ids(tokens: &[Self]) -> KvResult<()> {
        if Self::ALWAYS_NARROW {
            return Ok(());
        }
        if let Some(wide) = Self::as_i64(tokens) {
            // Vectorised (AVX2 / AVX-512 when the CPU has it).
            return match crate::core::wide_tokens::first_wide(wide) {
                Some(i) => Err(token_out_of_range(wide[i])),
                None => Ok(()),
            };
        }
        match tokens.iter().find(|t| i32::try_from(t.get()).is_err()) {
            Some(t) => Err(token_out_of_range(t.get())),
            None => Ok(()),
        }
    }
}

/// The caches' error for a token id outside int32. Both caches (hash chain
/// and radix) take token ids in `-2**31..2**31`: ids index a model's
/// vocabulary, which engines hold as int32 (vLLM's and SGLang's input-id
/// tensors), so a wider id is a caller bug. The hash chain hashes every
/// int32 id as vLLM hashes the same Python int; [`crate::core::hash`]'s
/// standalone block hashing still takes any int64, as vLLM hashes any int.
#[cold]
pub fn token_out_of_range(t: i64) -> KvError {
    KvError::invalid(format!("token id {t} does not fit in int32 (token ids must be in -2**31..2**31)"))
}
impl Token for i32 {
    const ALWAYS_NARROW: bool = true;
    #[inline]
    fn get(self) -> i64 {
        i64::from(self)
    }
    #[inline]
    fn narrow(self) -> Option<i32> {
        Some(self)
    }
    #[inline]
    fn as_i32(s: &[Self]) -> Option<&[i32]> {
        Some(s)
    }
}
impl Token for i64 {
    #[inline]
    fn get(self) -> i64 {
        self
    }
    #[inline]
    fn as_i64(s: &[Self]) -> Option<&[i64]> {
        Some(s)
    }
}

/// Hashes blocks for one algorithm and seed. Holds a reusable scratch buffer.
#[derive(Clone, Debug)]
pub struct BlockHasher {
    algo: HashAlgo,
    none_hash: BlockHash,
    buf: Vec<u8>,
}

impl BlockHasher {
    /// A hasher for `algo` whose chain starts at the NONE_HASH of `seed`
    /// (the algorithm's [`HashAlgo::default_seed`] when `None`).
    #[must_use]
    pub fn new(algo: HashAlgo, seed: Option<&str>) -> Self {
        let seed = seed.unwrap_or_else(|| algo.default_seed());
        let mut buf = Vec::with_capacity(256);
        match algo.serial() {
            Serial::Compact => {
                buf.extend_from_slice(b"kvindex-none-hash\0");
                buf.extend_from_slice(seed.as_bytes());
            }
            Serial::Cbor => cbor::text(&mut buf, seed),
            Serial::Pickle => pickle::str_payload(&mut buf, seed),
        }
        let none_hash = algo.digest(&buf);
        BlockHasher { algo, none_hash, buf }
    }

    /// The algorithm.
    #[must_use]
    pub fn algo(&self) -> HashAlgo {
        self.algo
    }

    /// The chain's root parent, `H(serialize(seed))`.
    #[must_use]
    pub fn none_hash(&self) -> BlockHash {
        self.none_hash
    }

    /// Hashes one block: `H(serialize(parent or NONE_HASH, tokens, keys))`.
    /// O(tokens + keys).
    pub fn hash_block<T: Token>(
        &mut self,
        parent: Option<&BlockHash>,
        tokens: &[T],
        keys: &[ExtraKey<'_>],
    ) -> BlockHash {
        let parent = parent.unwrap_or(&self.none_hash).as_bytes();
        let buf = &mut self.buf;
        buf.clear();
        buf.reserve(parent.len() + 9 * tokens.len() + 64);
        let toks = tokens.iter().map(|t| t.get());
        match self.algo.serial() {
            Serial::Compact => compact_block(buf, parent, tokens, keys),
            Serial::Cbor => cbor::block_payload(buf, parent, toks, keys),
            Serial::Pickle => pickle::block_payload(buf, parent, toks, keys),
        }
        self.algo.digest(buf)
    }

    /// Appends to `out` the hashes of the full blocks of `tokens` from block
    /// `out.len()` onwards, chaining from the last hash in `out` (NONE_HASH if
    /// empty). Tokens of blocks already hashed are not read again. O(new
    /// tokens + keys), no allocation once `out` has capacity.
    pub fn extend_chain<T: Token>(
        &mut self,
        tokens: &[T],
        block_size: usize,
        spec: &KeySpec,
        out: &mut Vec<BlockHash>,
    ) {
        let nfull = tokens.len() / block_size;
        // int64 ids that all fit in int32 (the usual case) serialise as int32
        // ones do: one branch-free range pass, then the same fast path.
        let narrow = || {
            tokens[out.len().min(nfull) * block_size..nfull * block_size]
                .iter()
                .fold(true, |acc, t| acc & (i64::from(t.get() as i32) == t.get()))
        };
        if self.algo.serial() == Serial::Compact && spec.is_empty() && (T::ALWAYS_NARROW || narrow()) {
            self.extend_compact_narrow(tokens, block_size, nfull, out);
            return;
        }
        let mut keys: Vec<ExtraKey<'_>> = Vec::new();
        let mut parent = out.last().copied();
        for i in out.len()..nfull {
            let start = i * block_size;
            #[allow(clippy::cast_possible_wrap)]
            spec.block_keys(start as i64, block_size as i64, &mut keys);
            let h = self.hash_block(parent.as_ref(), &tokens[start..start + block_size], &keys);
            out.push(h);
            parent = Some(h);
        }
    }
}

impl BlockHasher {
    /// The compact encoding's common case (no extra keys, int32 tokens): the
    /// payload layout is fixed, so the header and key count are written once
    /// and each block only overwrites the parent digest and the token bytes.
    /// Produces exactly the bytes of [`compact_block`].
    fn extend_compact_narrow<T: Token>(
        &mut self,
        tokens: &[T],
        bs: usize,
        nfull: usize,
        out: &mut Vec<BlockHash>,
    ) {
        let d = self.algo.digest_len();
        let buf = &mut self.buf;
        buf.clear();
        buf.resize(d, 0);
        #[allow(clippy::cast_possible_truncation)]
        buf.extend_from_slice(&(bs as u32).to_le_bytes());
        buf.push(4);
        let tok_start = buf.len();
        buf.resize(tok_start + 4 * bs, 0);
        buf.extend_from_slice(&0u32.to_le_bytes());
        let mut parent = out.last().copied().unwrap_or(self.none_hash);
        for blk in tokens[out.len() * bs..nfull * bs].chunks_exact(bs) {
            buf[..d].copy_from_slice(parent.as_bytes());
            for (dst, t) in buf[tok_start..tok_start + 4 * bs].chunks_exact_mut(4).zip(blk) {
                #[allow(clippy::cast_possible_truncation)]
                dst.copy_from_slice(&(t.get() as i32).to_le_bytes());
            }
            parent = self.algo.digest(buf);
            out.push(parent);
        }
    }
}

fn compact_str(buf: &mut Vec<u8>, s: &str) {
    #[allow(clippy::cast_possible_truncation)]
    buf.extend_from_slice(&(s.len() as u32).to_le_bytes());
    buf.extend_from_slice(s.as_bytes());
}

fn compact_block<T: Token>(buf: &mut Vec<u8>, parent: &[u8], tokens: &[T], keys: &[ExtraKey<'_>]) {
    buf.extend_from_slice(parent);
    #[allow(clippy::cast_possible_truncation)]
    buf.extend_from_slice(&(tokens.len() as u32).to_le_bytes());
    let narrow = T::ALWAYS_NARROW || tokens.iter().all(|t| i32::try_from(t.get()).is_ok());
    let width = if narrow { 4 } else { 8 };
    #[allow(clippy::cast_possible_truncation)]
    buf.push(width as u8);
    // Resize once, then fill fixed-size chunks: no per-token capacity checks.
    let start = buf.len();
    buf.resize(start + width * tokens.len(), 0);
    let dst = &mut buf[start..];
    if narrow {
        for (d, t) in dst.chunks_exact_mut(4).zip(tokens) {
            #[allow(clippy::cast_possible_truncation)]
            d.copy_from_slice(&(t.get() as i32).to_le_bytes());
        }
    } else {
        for (d, t) in dst.chunks_exact_mut(8).zip(tokens) {
            d.copy_from_slice(&t.get().to_le_bytes());
        }
    }
    #[allow(clippy::cast_possible_truncation)]
    buf.extend_from_slice(&(keys.len() as u32).to_le_bytes());
    for k in keys {
        match *k {
            ExtraKey::Lora(name, path) => {
                buf.push(1);
                compact_str(buf, name);
                compact_str(buf, path);
            }
            ExtraKey::Mm(id, off) => {
                buf.push(2);
                compact_str(buf, id);
                buf.extend_from_slice(&off.to_le_bytes());
            }
            ExtraKey::Salt(s) => {
                buf.push(3);
                compact_str(buf, s);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(h: &BlockHash) -> String {
        format!("{h:?}")
    }

    #[test]
    fn vllm_reference_vectors() {
        let toks: Vec<i64> = (0..48).collect();
        let spec = KeySpec::default();
        let mut h = BlockHasher::new(HashAlgo::VllmSha256Cbor, None);
        assert_eq!(hex(&h.none_hash()), "9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0");
        let mut out = Vec::new();
        h.extend_chain(&toks, 16, &spec, &mut out);
        assert_eq!(hex(&out[0]), "dc918a88b139e5afe60b88eda27508d4aee16c10fdc354791efea06206ac0749");
        assert_eq!(hex(&out[2]), "117dad852830e0103c12d7c7f8b7cf58434ea8751d1f42ee07b1c93711e4da6c");
        let mut h = BlockHasher::new(HashAlgo::VllmSha256, None);
        assert_eq!(hex(&h.none_hash()), "066b1e8987e027138e98701c46128929378935f9b6cd1549105ae6b4f0d71198");
        let mut out = Vec::new();
        h.extend_chain(&toks, 16, &spec, &mut out);
        assert_eq!(hex(&out[0]), "fe8fa5dda3210d0ca2031e37cbe3b001186773cd1c710beb2d45fcb51d434798");
        assert_eq!(hex(&out[2]), "9d537f74907f6ada2b6cccb46b9845df2ebdbaf60c73d8679cf1da81b15b302c");
        let salted = KeySpec::new(None, Some("s1".into()), vec![]).expect("valid");
        let mut out = Vec::new();
        h.extend_chain(&toks[..16], 16, &salted, &mut out);
        assert_eq!(hex(&out[0]), "b74b8848c4b44dc0baf43d1135dd783777a8016db0e723a361860f8df659b6e4");
    }

    #[test]
    fn chain_is_incremental_and_dtype_independent() {
        let t64: Vec<i64> = (0..100).map(|x| x * 7 - 3).collect();
        let t32: Vec<i32> = t64.iter().map(|&x| i32::try_from(x).expect("fits")).collect();
        for name in ALGO_NAMES {
            let algo = HashAlgo::parse(name).expect("known");
            let mut h = BlockHasher::new(algo, Some("x"));
            let (mut a, mut b) = (Vec::new(), Vec::new());
            h.extend_chain(&t64, 16, &KeySpec::default(), &mut a);
            h.extend_chain(&t32[..40], 16, &KeySpec::default(), &mut b);
            h.extend_chain(&t32, 16, &KeySpec::default(), &mut b);
            assert_eq!(a, b, "{name}");
            assert_eq!(a.len(), 6);
            assert_eq!(a[0].as_bytes().len(), algo.digest_len());
        }
    }
}
