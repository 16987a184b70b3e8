//! vLLM 0.33's per-request block hasher (`get_request_block_hasher`'s
//! `request_block_hasher`), bit for bit, as one call per request.
//!
//! vLLM keeps `request.block_hashes` append-only: each call hashes the blocks
//! that became full since the last one, chaining from the last hash (or from
//! the module's `NONE_HASH` for block 0):
//! ```text
//! start  = len(block_hashes) * B          (first token not yet hashed)
//! h_i    = hash_fn((parent, tuple(t[i*B:(i+1)*B]), extra_keys_i))   for each new full block i
//! extra_keys_i = lora + mm + cache_salt   (None when empty; see [`super::keys`])
//! ```
//! [`VllmRequestHasher::hash_new_blocks`] does that for the tokens from
//! `start` on, with the extra keys of the request's [`KeySpec`] at absolute
//! token positions. Multimodal items are walked with a cursor, as vLLM's
//! `start_mm_idx` does, so a long prompt with many items costs
//! O(blocks + items), not O(blocks * items).
//!
//! Not covered here (the binding hands these requests to vLLM's own hasher):
//! prompt-embedding keys, EAGLE lookahead hashing, and inputs whose pickle
//! bytes depend on Python object identity.
//!
//! Cost: one serialisation and one digest per new full block; the scratch
//! buffer is reused, and nothing is allocated once `out` has capacity.

use super::keys::{ExtraKey, KeySpec};
use super::{BlockHasher, HashAlgo, Token};
use crate::core::error::{KvError, KvResult};
use crate::core::ids::BlockHash;

/// The vLLM algorithm (`--prefix-caching-hash-algo`) for a kvindex name.
///
/// # Errors
/// `InvalidArgument` for a name that is not one of vLLM's four.
pub fn vllm_algo(name: &str) -> KvResult<HashAlgo> {
    Ok(match name {
        "sha256" | "vllm_sha256" => HashAlgo::VllmSha256,
        "sha256_cbor" | "vllm_sha256_cbor" => HashAlgo::VllmSha256Cbor,
        "xxhash" | "vllm_xxhash" => HashAlgo::VllmXxhash,
        "xxhash_cbor" | "vllm_xxhash_cbor" => HashAlgo::VllmXxhashCbor,
        _ => {
            return Err(KvError::invalid(format!(
            "unknown vLLM hash algorithm {name:?}; expected one of sha256, sha256_cbor, xxhash, xxhash_cbor"
        )))
        }
    })
}

/// Hashes the new full blocks of vLLM requests for one algorithm and block size.
#[derive(Clone, Debug)]
pub struct VllmRequestHasher {
    inner: BlockHasher,
    block_size: usize,
}

impl VllmRequestHasher {
    /// A hasher for one of vLLM's algorithms and hash block size.
    ///
    /// # Errors
    /// `InvalidArgument` for a compact (non-vLLM) algorithm or a block size of 0.
    pub fn new(algo: HashAlgo, block_size: usize) -> KvResult<Self> {
        if !matches!(
            algo,
            HashAlgo::VllmSha256 | HashAlgo::VllmSha256Cbor | HashAlgo::VllmXxhash | HashAlgo::VllmXxhashCbor
        ) {
            return Err(KvError::invalid(format!("{} is not one of vLLM's hash algorithms", algo.name())));
        }
        if block_size == 0 {
            return Err(KvError::invalid("block_size must be at least 1"));
        }
        // The chain root is always passed in (vLLM's NONE_HASH of the
        // running process), so the hasher's own seed is never used.
        let inner =
            BlockHasher { algo, none_hash: BlockHash::from_digest(&[]), buf: Vec::with_capacity(256) };
        Ok(VllmRequestHasher { inner, block_size })
    }

    /// The algorithm.
    #[must_use]
    pub fn algo(&self) -> HashAlgo {
        self.inner.algo
    }

    /// The hash block size (tokens per hashed block).
    #[must_use]
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Appends to `out` the hashes of every full block of `tokens`, where
    /// `tokens[0]` is the request's token at position `first_block * B`, the
    /// chain continuing from `parent` (the request's last block hash, or
    /// NONE_HASH when it has none). A partial tail is not hashed. Returns the
    /// number of hashes appended. O(new tokens + keys of the new blocks).
    pub fn hash_new_blocks<T: Token>(
        &mut self,
        parent: &BlockHash,
        first_block: usize,
        tokens: &[T],
        spec: &KeySpec,
        out: &mut Vec<BlockHash>,
    ) -> usize {
        let bs = self.block_size;
        let n = tokens.len() / bs;
        out.reserve(n);
        let mut parent = *parent;
        if spec.is_empty() {
            let pickle = matches!(self.inner.algo, HashAlgo::VllmSha256 | HashAlgo::VllmXxhash);
            if pickle && bs <= PICKLE_FAST_MAX_BLOCK {
                for blk in tokens.chunks_exact(bs) {
                    pickle_block_no_keys(&mut self.inner.buf, parent.as_bytes(), blk);
                    parent = self.inner.algo.digest(&self.inner.buf);
                    out.push(parent);
                }
                return n;
            }
            for blk in tokens.chunks_exact(bs) {
                parent = self.inner.hash_block(Some(&parent), blk, &[]);
                out.push(parent);
            }
            return n;
        }
        let mut keys: Vec<ExtraKey<'_>> = Vec::with_capacity(2 + spec.mm_items.len().min(4));
        let mut cursor = 0usize;
        for (i, blk) in tokens.chunks_exact(bs).enumerate() {
            #[allow(clippy::cast_possible_wrap)]
            let start = ((first_block + i) * bs) as i64;
            block_keys(spec, start, bs as i64, &mut cursor, &mut keys);
            parent = self.inner.hash_block(Some(&parent), blk, &keys);
            out.push(parent);
        }
        n
    }
}

/// Blocks up to this many tokens have a pickle payload under CPython's 64 KiB
/// frame target (at most 9 bytes per token plus a 32-byte parent and the
/// opcodes), so it is one frame and [`pickle_block_no_keys`] applies.
const PICKLE_FAST_MAX_BLOCK: usize = 7000;

/// `pickle.dumps((parent, tuple(tokens), None), protocol=5)` for a block
/// without extra keys, written straight into `buf` (replacing its contents):
/// the bytes of [`super::pickle::block_payload`] for this shape, without its
/// per-opcode frame bookkeeping. One frame; `94` memoises the parent, the
/// token tuple and the outer tuple; ints are BININT1 / BININT2 / BININT /
/// LONG1 as CPython picks them.
fn pickle_block_no_keys<T: Token>(buf: &mut Vec<u8>, parent: &[u8], tokens: &[T]) {
    buf.clear();
    buf.resize(2 + 9 + 3 + parent.len() + 1 + 1 + 10 * tokens.len() + 8, 0);
    buf[0] = 0x80;
    buf[1] = 0x05;
    buf[2] = 0x95;
    let mut k = 11;
    buf[k] = 0x43;
    #[allow(clippy::cast_possible_truncation)]
    let plen = parent.len() as u8;
    buf[k + 1] = plen;
    k += 2;
    buf[k..k + parent.len()].copy_from_slice(parent);
    k += parent.len();
    buf[k] = 0x94;
    k += 1;
    if tokens.len() > 3 {
        buf[k] = 0x28;
        k += 1;
    }
    for t in tokens {
        k += pickle_int(&mut buf[k..k + 10], t.get());
    }
    buf[k] = match tokens.len() {
        1 => 0x85,
        2 => 0x86,
        3 => 0x87,
        _ => 0x74,
    };
    // tuple memo, None, outer TUPLE3, its memo, STOP
    buf[k + 1..k + 6].copy_from_slice(&[0x94, 0x4e, 0x87, 0x94, 0x2e]);
    k += 6;
    buf.truncate(k);
    let frame_len = (k - 11) as u64;
    buf[3..11].copy_from_slice(&frame_len.to_le_bytes());
}

/// Writes one pickled int at `dst[0..]` (at most 10 bytes) and returns its length.
#[inline(always)]
fn pickle_int(dst: &mut [u8], x: i64) -> usize {
    #[allow(clippy::cast_sign_loss, clippy::cast_possible_truncation)]
    if (0..256).contains(&x) {
        dst[0] = 0x4b;
        dst[1] = x as u8;
        2
    } else if (0..65536).contains(&x) {
        dst[0] = 0x4d;
        dst[1..3].copy_from_slice(&(x as u16).to_le_bytes());
        3
    } else if i64::from(i32::MIN) <= x && x <= i64::from(i32::MAX) {
        dst[0] = 0x4a;
        dst[1..5].copy_from_slice(&(x as i32).to_le_bytes());
        5
    } else {
        // LONG1: the fewest bytes n (5..=8) of two's complement that hold x.
        let sig = if x < 0 { 64 - (!x).leading_zeros() } else { 64 - x.leading_zeros() } + 1;
        let n = (sig as usize).div_ceil(8).max(5);
        dst[0] = 0x8a;
        dst[1] = n as u8;
        dst[2..2 + n].copy_from_slice(&x.to_le_bytes()[..n]);
        2 + n
    }
}

/// The extra keys of the block `[start, start + bs)`, in vLLM's order (LoRA,
/// multimodal items, cache salt on block 0). `cursor` is the first item that
/// may still overlap this or a later block: the items are sorted and do not
/// overlap ([`KeySpec::new`]), so an item ending at or before `start` is done.
fn block_keys<'a>(spec: &'a KeySpec, start: i64, bs: i64, cursor: &mut usize, out: &mut Vec<ExtraKey<'a>>) {
    out.clear();
    if let Some((name, path)) = &spec.lora {
        out.push(ExtraKey::Lora(name, path));
    }
    let end = start + bs;
    let items = &spec.mm_items;
    while *cursor < items.len() && items[*cursor].offset + items[*cursor].length <= start {
        *cursor += 1;
    }
    for it in &items[*cursor..] {
        if it.offset >= end {
            break;
        }
        out.push(ExtraKey::Mm(&it.identifier, it.offset - start));
    }
    if start == 0 {
        if let Some(salt) = &spec.cache_salt {
            out.push(ExtraKey::Salt(salt));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::hash::MmItem;

    fn spec_with_mm() -> KeySpec {
        let mm = vec![
            MmItem { identifier: "img-a".into(), offset: 3, length: 20 },
            MmItem { identifier: "img-b".into(), offset: 23, length: 2 },
            MmItem { identifier: "img-c".into(), offset: 40, length: 30 },
        ];
        KeySpec::new(Some(("lo".into(), "/p".into())), Some("salt".into()), mm).expect("valid")
    }

    /// Incremental calls (as vLLM makes them, block by block or in runs)
    /// give the chain `BlockHasher::extend_chain` gives in one call.
    #[test]
    fn incremental_equals_whole_chain() {
        let toks: Vec<i64> = (0..200).map(|x| (x * 7919) % 151_936 - 5).collect();
        for spec in [KeySpec::default(), spec_with_mm()] {
            for name in ["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"] {
                let algo = vllm_algo(name).expect("known");
                let mut whole = Vec::new();
                let mut bh = BlockHasher::new(algo, None);
                bh.extend_chain(&toks, 8, &spec, &mut whole);
                let root = bh.none_hash();
                let mut h = VllmRequestHasher::new(algo, 8).expect("valid");
                let mut out = Vec::new();
                let mut done = 0usize;
                for cut in [5usize, 16, 17, 40, 41, 96, 150, 200] {
                    let parent = out.last().copied().unwrap_or(root);
                    h.hash_new_blocks(&parent, done, &toks[done * 8..cut], &spec, &mut out);
                    done = out.len();
                }
                assert_eq!(out, whole, "{name}");
                assert_eq!(out.len(), 25);
            }
        }
    }

    /// The keyless pickle fast path writes the generic encoder's bytes for
    /// every int encoding and tuple form.
    #[test]
    fn pickle_fast_path_matches_generic_encoder() {
        let edges: Vec<i64> = vec![
            0,
            1,
            255,
            256,
            65_535,
            65_536,
            -1,
            -256,
            i64::from(i32::MAX),
            i64::from(i32::MIN),
            1 << 31,
            -(1 << 31) - 1,
            1 << 39,
            -(1 << 39),
            (1 << 39) - 1,
            -(1 << 39) - 1,
            1 << 47,
            -(1 << 47) - 1,
            1 << 55,
            -(1 << 55) - 1,
            i64::MAX,
            i64::MIN,
            151_935,
        ];
        let parent = [0xabu8; 32];
        for bs in [1usize, 2, 3, 4, 5, 16, 23] {
            for start in 0..edges.len() {
                let blk: Vec<i64> = (0..bs).map(|i| edges[(start + i * 7) % edges.len()]).collect();
                let mut fast = Vec::new();
                pickle_block_no_keys(&mut fast, &parent[..if bs % 2 == 0 { 32 } else { 16 }], &blk);
                let mut slow = Vec::new();
                super::super::pickle::block_payload(
                    &mut slow,
                    &parent[..if bs % 2 == 0 { 32 } else { 16 }],
                    blk.iter().copied(),
                    &[],
                );
                assert_eq!(fast, slow, "bs {bs} start {start}");
            }
        }
    }

    #[test]
    fn rejects_compact_algorithms_and_zero_block_size() {
        assert!(VllmRequestHasher::new(HashAlgo::Xxh3_128, 16).is_err());
        assert!(VllmRequestHasher::new(HashAlgo::VllmSha256, 0).is_err());
        assert!(vllm_algo("md5").is_err());
        assert_eq!(vllm_algo("vllm_xxhash").expect("known"), HashAlgo::VllmXxhash);
    }
}
