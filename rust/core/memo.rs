//! The hash chain's prompt hasher ([`PromptHasher`]): the block hasher and
//! the prefix memo in one place, so hashing a prompt is one call that walks
//! one way (memo probes, then a digest only where the memo has no block).
//!
//! # Prefix memo
//! Cached blocks by `(parent hash, tokens)`, so hashing a prompt whose
//! prefix is cached costs a table probe and an exact comparison per block
//! instead of a serialisation and a SHA-256 digest. Used with the SHA-256
//! algorithms only: a cold probe costs about an XXH3 digest.
//!
//! # Layout
//! A hash table of 4-byte block ids keyed by the block's *prefix key*, a
//! fingerprint of all tokens from the start of the sequence to the end of
//! the block ([`extend_prefix_keys`]), plus per block one record holding
//! everything a probe reads: the key, the full parent hash, the block's own
//! hash (`H(parent, tokens, None)`, a copy of the pool's while the record is
//! live) and its tokens as `i32` (inline up to [`INLINE`] tokens, in a side
//! array for larger blocks; blocks with a token outside `i32` are not
//! memoised). Keys only select buckets: a hit needs the full parent hash and
//! every token to compare equal, so a crafted fingerprint collision cannot
//! produce a wrong hash.
//!
//! Prefix keys depend on tokens alone, so a prompt's probes are independent
//! of each other: [`Memo::candidates`] issues them all (their cache misses
//! overlap) and the caller then verifies the chain of parent hashes, which
//! by then sits in cache. Keying by the parent hash instead would make the
//! walk a chain of dependent misses, as slow as hashing.
//!
//! # Invariants (checked by [`PromptHasher::check_memo`])
//! - the table lists exactly the blocks whose record is live, once each;
//! - a live record's key is `parent.key64() ^ fingerprint(tokens)`, and its
//!   block is cached under `H(parent, tokens, None)`.
//!
//! # Costs
//! Probe, insert and forget are O(block_size); a probe touches the table and
//! one record (~2 adjacent cache lines). Hashing a prompt: O(tokens), a
//! memoised block costing a fingerprint, a probe and a comparison instead
//! of a digest. Memory: 144 bytes per block of the pool (plus
//! `4 * block_size` above 16 tokens per block); none with the memo off.

use hashbrown::HashTable;

use crate::core::error::{try_filled, try_reserve, InvariantViolation, KvResult};
use crate::core::hash::{BlockHasher, ExtraKey, HashAlgo, KeySpec, Token};
use crate::core::ids::{BlockHash, BlockId};
use crate::ensure_inv;

/// The hash chain's prompt hasher: the block hasher, the block size and the
/// prefix memo (module header).
#[derive(Clone, Debug)]
pub struct PromptHasher {
    hasher: BlockHasher,
    block_size: usize,
    memo: Memo,
    /// Whether hashing consults the memo (SHA-256 algorithms).
    use_memo: bool,
    scratch_cand: Vec<Option<BlockId>>,
}

impl PromptHasher {
    /// A hasher of blocks of `block_size` tokens with `algo` from the
    /// NONE_HASH of `seed`, with a memo for a pool of `num_blocks` blocks
    /// when `algo` is a SHA-256 one (a disabled memo holds no per-block
    /// state at all).
    ///
    /// # Errors
    /// `Capacity` if the memo cannot be allocated.
    pub fn new(algo: HashAlgo, seed: Option<&str>, num_blocks: usize, block_size: usize) -> KvResult<Self> {
        let use_memo = algo.is_sha();
        Ok(PromptHasher {
            hasher: BlockHasher::new(algo, seed),
            block_size,
            memo: if use_memo { Memo::new(num_blocks, block_size)? } else { Memo::new(0, 0)? },
            use_memo,
            scratch_cand: Vec::new(),
        })
    }

    /// The block hasher.
    #[must_use]
    pub fn block_hasher(&self) -> &BlockHasher {
        &self.hasher
    }

    /// Whether hashing consults the memo (and requests keep memo prefix keys).
    #[inline]
    #[must_use]
    pub fn uses_memo(&self) -> bool {
        self.use_memo
    }

    /// Number of memoised blocks (at most the number of cached blocks). O(1).
    #[must_use]
    pub fn memo_len(&self) -> usize {
        self.memo.len()
    }

    /// Hashes of the full blocks of `tokens` into `out`, and (memo on) their
    /// memo prefix keys into `prefix_keys` (both cleared first), using the
    /// memo for blocks without extra keys. O(tokens).
    ///
    /// # Errors
    /// `Capacity` when the prompt's buffers cannot be allocated (a prompt
    /// too large for this machine's memory is an error, not an abort).
    pub fn hash<T: Token>(
        &mut self,
        tokens: &[T],
        spec: &KeySpec,
        out: &mut Vec<BlockHash>,
        prefix_keys: &mut Vec<u64>,
    ) -> KvResult<()> {
        out.clear();
        prefix_keys.clear();
        let bs = self.block_size;
        let nfull = tokens.len() / bs;
        try_reserve(out, nfull, "the prompt's block hashes")?;
        if !self.use_memo {
            self.hasher.extend_chain(tokens, bs, spec, out);
            return Ok(());
        }
        try_reserve(prefix_keys, nfull, "the prompt's memo keys")?;
        try_reserve(&mut self.scratch_cand, nfull, "the prompt's memo candidates")?;
        extend_prefix_keys(tokens, bs, prefix_keys);
        let mut cand = std::mem::take(&mut self.scratch_cand);
        self.memo.candidates(tokens, prefix_keys, &mut cand);
        let mut keys: Vec<ExtraKey<'_>> = Vec::new();
        let mut parent = self.hasher.none_hash();
        for (i, blk) in tokens.chunks_exact(bs).enumerate() {
            if !spec.is_empty() {
                #[allow(clippy::cast_possible_wrap)]
                spec.block_keys((i * bs) as i64, bs as i64, &mut keys);
            }
            let memoised = match cand[i] {
                Some(b) if keys.is_empty() => self
                    .memo
                    .check(b, &parent)
                    // Another memoised block with these tokens and key but a
                    // different parent (e.g. another cache salt): look it up.
                    .or_else(|| self.memo.probe(prefix_keys[i], &parent, blk)),
                _ => None,
            };
            let h = memoised.unwrap_or_else(|| self.hasher.hash_block(Some(&parent), blk, &keys));
            out.push(h);
            parent = h;
        }
        self.scratch_cand = cand;
        Ok(())
    }

    /// The memo prefix keys of the full blocks of `tokens` into
    /// `prefix_keys` (left empty with the memo off), for a prompt whose
    /// hashes are known.
    ///
    /// # Errors
    /// `Capacity` when the keys cannot be allocated.
    pub fn prefix_keys<T: Token>(&self, tokens: &[T], prefix_keys: &mut Vec<u64>) -> KvResult<()> {
        if self.use_memo {
            try_reserve(prefix_keys, tokens.len() / self.block_size, "the prompt's memo keys")?;
            extend_prefix_keys(tokens, self.block_size, prefix_keys);
        }
        Ok(())
    }

    /// Hashes of the full blocks of `tokens` appended to `out` (no memo: a
    /// pure function of the tokens). O(tokens).
    #[inline]
    pub fn chain<T: Token>(&mut self, tokens: &[T], spec: &KeySpec, out: &mut Vec<BlockHash>) {
        self.hasher.extend_chain(tokens, self.block_size, spec, out);
    }

    /// Grows a request's chain `hashes` and (memo on) its prefix `keys` to
    /// the full blocks of its `tokens`. O(new blocks).
    #[inline]
    pub fn extend(
        &mut self,
        tokens: &[i64],
        spec: &KeySpec,
        hashes: &mut Vec<BlockHash>,
        keys: &mut Vec<u64>,
    ) {
        self.hasher.extend_chain(tokens, self.block_size, spec, hashes);
        if self.use_memo {
            extend_prefix_keys(tokens, self.block_size, keys);
        }
    }

    /// Memoises cached block `b` = `(parent, tokens)` (`None`: block 0) with
    /// prefix key `key` and hash `own`; nothing with the memo off.
    /// O(block_size).
    #[inline]
    pub fn memoise(
        &mut self,
        b: BlockId,
        key: u64,
        own: BlockHash,
        parent: Option<BlockHash>,
        tokens: &[i64],
    ) {
        if self.use_memo {
            let parent = parent.unwrap_or(self.hasher.none_hash());
            self.memo.insert(b, key, own, &parent, tokens);
        }
    }

    /// Drops `b`'s memo entry, if any (its block lost its hash). O(1).
    #[inline]
    pub fn forget(&mut self, b: BlockId) {
        self.memo.forget(b);
    }

    /// Drops every memo entry. O(num_blocks).
    pub fn clear(&mut self) {
        self.memo.clear();
    }

    /// Checks the memo's invariants against the pool: `cached(b)` is the
    /// hash block `b` is cached under. O(entries × block_size).
    ///
    /// # Errors
    /// The first violation found.
    pub fn check_memo(
        &self,
        cached: impl Fn(BlockId) -> Option<BlockHash>,
    ) -> Result<(), InvariantViolation> {
        let mut hasher = self.hasher.clone();
        let entries = self.memo.entries().map_err(InvariantViolation)?;
        for (b, own, parent, toks) in entries {
            ensure_inv!(cached(b) == Some(own), "memo block {} is not cached under its hash", b.0);
            ensure_inv!(
                own == hasher.hash_block(Some(&parent), toks, &[]),
                "memo block {} hash mismatch",
                b.0
            );
        }
        Ok(())
    }
}

/// Tokens per block kept inside the record.
pub const INLINE: usize = 16;

/// A block's record; live iff `own` is non-empty. Field order is fixed:
/// the key and tokens a probe compares first lead.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
struct Rec {
    key: u64,
    inline: [i32; INLINE],
    parent: BlockHash,
    own: BlockHash,
}

impl Rec {
    fn live(&self) -> bool {
        !self.own.as_bytes().is_empty()
    }
}

/// Bucket selector (FxHash-style, four independent lanes so the multiply
/// chains overlap); equality is always checked exactly.
fn fingerprint<T: Token>(tokens: &[T]) -> u64 {
    const K: u64 = 0x51_7c_c1_b7_27_22_0a_95;
    #[allow(clippy::cast_sign_loss)]
    let step = |h: u64, t: &T| (h.rotate_left(5) ^ t.get() as u64).wrapping_mul(K);
    let mut lanes = [0u64, 1, 2, 3];
    let mut chunks = tokens.chunks_exact(4);
    for c in &mut chunks {
        lanes[0] = step(lanes[0], &c[0]);
        lanes[1] = step(lanes[1], &c[1]);
        lanes[2] = step(lanes[2], &c[2]);
        lanes[3] = step(lanes[3], &c[3]);
    }
    let mut h = chunks.remainder().iter().fold(lanes[0], step);
    for l in &lanes[1..] {
        h = (h.rotate_left(5) ^ l).wrapping_mul(K);
    }
    h
}

/// First prefix key's predecessor.
const KEY_SEED: u64 = 0x9e37_79b9_7f4a_7c15;

/// Chains a block fingerprint onto the previous prefix key (murmur3's
/// finaliser, so high and low bits are both mixed for the hash table).
fn chain(prev: u64, fp: u64) -> u64 {
    let mut x = prev.rotate_left(29) ^ fp;
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// Appends to `out` the prefix keys of the full blocks of `tokens` (blocks
/// of `bs`) from block `out.len()` onwards. Pure arithmetic on the tokens:
/// ~5 ns per 16-token block.
pub fn extend_prefix_keys<T: Token>(tokens: &[T], bs: usize, out: &mut Vec<u64>) {
    let nfull = tokens.len() / bs;
    let mut prev = out.last().copied().unwrap_or(KEY_SEED);
    for blk in tokens[out.len() * bs..nfull * bs].chunks_exact(bs) {
        prev = chain(prev, fingerprint(blk));
        out.push(prev);
    }
}

/// One memo entry as the owner's invariant check sees it: the block, its
/// hash, its parent's hash and its tokens.
pub type Entry<'a> = (BlockId, BlockHash, BlockHash, &'a [i32]);

/// The prefix memo (module header), owned by the [`PromptHasher`].
#[derive(Clone, Debug)]
pub struct Memo {
    table: HashTable<BlockId>,
    recs: Vec<Rec>,
    /// Tokens of blocks larger than [`INLINE`] (`block_size` per block).
    spill: Vec<i32>,
    block_size: usize,
}

impl Memo {
    /// A memo for a pool of `num_blocks` blocks of `block_size` tokens
    /// (`Memo::new(0, 0)` is a disabled memo holding nothing).
    ///
    /// # Errors
    /// `Capacity` if its records cannot be allocated.
    pub fn new(num_blocks: usize, block_size: usize) -> KvResult<Self> {
        let empty = BlockHash::from_digest(&[]);
        let none = Rec { key: 0, parent: empty, own: empty, inline: [0; INLINE] };
        let spill = if block_size > INLINE { num_blocks.saturating_mul(block_size) } else { 0 };
        Ok(Memo {
            table: HashTable::new(),
            recs: try_filled(num_blocks, none, "the prefix memo")?,
            spill: try_filled(spill, 0, "the prefix memo")?,
            block_size,
        })
    }

    /// Number of memoised blocks. O(1).
    #[must_use]
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether nothing is memoised. O(1).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    fn block_tokens(&self, b: BlockId) -> &[i32] {
        let bs = self.block_size;
        if bs <= INLINE {
            &self.recs[b.idx()].inline[..bs]
        } else {
            &self.spill[b.idx() * bs..(b.idx() + 1) * bs]
        }
    }

    fn same_tokens<T: Token>(&self, b: BlockId, tokens: &[T]) -> bool {
        self.block_tokens(b).iter().zip(tokens).all(|(&a, t)| i64::from(a) == t.get())
    }

    fn find<T: Token>(&self, key: u64, parent: &BlockHash, tokens: &[T]) -> Option<&Rec> {
        self.table
            .find(key, |&b| {
                let r = &self.recs[b.idx()];
                r.key == key && r.parent == *parent && self.same_tokens(b, tokens)
            })
            .map(|&b| &self.recs[b.idx()])
    }

    /// For each full block of `tokens` (with prefix keys `keys`), a memoised
    /// block with that key and those tokens, parent unchecked (`None` if
    /// there is none). The probes are independent, so their misses overlap.
    /// O(tokens).
    pub fn candidates<T: Token>(&self, tokens: &[T], keys: &[u64], out: &mut Vec<Option<BlockId>>) {
        out.clear();
        // Pass 1: bucket lookups only (the slot's id, no record read): short
        // independent iterations, so the CPU overlaps their cache misses.
        out.extend(keys.iter().map(|&key| self.table.find(key, |_| true).copied()));
        // Pass 2: touch each candidate record's cache lines, again overlapped.
        let mut sink = 0u64;
        for b in out.iter().flatten() {
            let r = &self.recs[b.idx()];
            sink ^= r.key ^ u64::from(r.parent.as_bytes().first().copied().unwrap_or(0));
            sink ^= u64::from(r.own.as_bytes().last().copied().unwrap_or(0));
        }
        std::hint::black_box(sink);
        // Pass 3: exact matches, now from cache (a first bucket hit with
        // another key or tokens falls back to a full probe of the bucket).
        for ((c, blk), &key) in out.iter_mut().zip(tokens.chunks_exact(self.block_size)).zip(keys) {
            let hit = |b: BlockId| self.recs[b.idx()].key == key && self.same_tokens(b, blk);
            if !c.is_some_and(hit) {
                *c = self.table.find(key, |&b| hit(b)).copied();
            }
        }
    }

    /// The hash of candidate `b` if its parent is `parent` (then it is
    /// exactly the block `(parent, its tokens)`). O(1).
    #[must_use]
    pub fn check(&self, b: BlockId, parent: &BlockHash) -> Option<BlockHash> {
        let r = &self.recs[b.idx()];
        (r.parent == *parent).then_some(r.own)
    }

    /// The hash of the block `(parent, tokens)` with prefix key `key`, if a
    /// memoised block holds exactly it. O(block_size).
    #[must_use]
    pub fn probe<T: Token>(&self, key: u64, parent: &BlockHash, tokens: &[T]) -> Option<BlockHash> {
        debug_assert_eq!(tokens.len(), self.block_size);
        Some(self.find(key, parent, tokens)?.own)
    }

    /// Memoises cached block `b` = `(parent, tokens)` with prefix key `key`,
    /// whose hash is `own`, unless an equal block is already memoised or a
    /// token does not fit in `i32`. O(block_size).
    pub fn insert(&mut self, b: BlockId, key: u64, own: BlockHash, parent: &BlockHash, tokens: &[i64]) {
        if tokens.iter().any(|&t| i32::try_from(t).is_err()) {
            return;
        }
        if self.find(key, parent, tokens).is_some() {
            return;
        }
        let bs = self.block_size;
        let r = &mut self.recs[b.idx()];
        r.key = key;
        r.parent = *parent;
        r.own = own;
        let dst = if bs <= INLINE {
            &mut r.inline[..bs]
        } else {
            &mut self.spill[b.idx() * bs..(b.idx() + 1) * bs]
        };
        for (d, &t) in dst.iter_mut().zip(tokens) {
            *d = i32::try_from(t).expect("range checked above");
        }
        let recs = &self.recs;
        self.table.insert_unique(key, b, |&x| recs[x.idx()].key);
    }

    /// Drops `b`'s entry, if any (its block lost its hash). O(1).
    pub fn forget(&mut self, b: BlockId) {
        let Some(r) = self.recs.get(b.idx()) else { return };
        if !r.live() {
            return;
        }
        let key = r.key;
        self.recs[b.idx()].own = BlockHash::from_digest(&[]);
        let Ok(entry) = self.table.find_entry(key, |&x| x == b) else {
            panic!("live memo record of block {} is not in the table", b.0);
        };
        entry.remove();
    }

    /// Drops every entry. O(num_blocks).
    pub fn clear(&mut self) {
        self.table.clear();
        let empty = BlockHash::from_digest(&[]);
        self.recs.iter_mut().for_each(|r| r.own = empty);
    }

    /// Every entry as `(block, its hash, parent hash, tokens)`, after
    /// checking that table and live records agree and every entry is found
    /// under its key. For the owner's invariant check. O(entries).
    ///
    /// # Errors
    /// A message naming the first disagreement.
    pub fn entries(&self) -> Result<Vec<Entry<'_>>, String> {
        let live = self.recs.iter().filter(|r| r.live()).count();
        if live != self.table.len() {
            return Err(format!("{live} live memo records, table holds {}", self.table.len()));
        }
        let mut out = Vec::with_capacity(self.table.len());
        for &b in &self.table {
            let r = &self.recs[b.idx()];
            if !r.live() {
                return Err(format!("memo table lists block {} without a live record", b.0));
            }
            let toks = self.block_tokens(b);
            if self.find(r.key, &r.parent, toks).is_none() {
                return Err(format!("memo entry of block {} is not found under its key", b.0));
            }
            out.push((b, r.own, r.parent, toks));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(x: u8, last: u8) -> BlockHash {
        let mut d = [x; 32];
        d[31] = last;
        BlockHash::from_digest(&d)
    }

    #[test]
    fn probes_compare_parent_and_tokens_exactly() {
        for bs in [4usize, 16, 20] {
            let mut m = Memo::new(8, bs).expect("memo");
            let toks: Vec<i64> = (0..bs as i64).collect();
            let mut keys = Vec::new();
            extend_prefix_keys(&toks, bs, &mut keys);
            let k = keys[0];
            let (parent, own) = (h(1, 0), h(9, 9));
            m.insert(BlockId(3), k, own, &parent, &toks);
            assert_eq!(m.len(), 1);
            assert_eq!(m.probe(k, &parent, &toks), Some(own));
            let mut cand = Vec::new();
            m.candidates(&toks, &keys, &mut cand);
            assert_eq!(cand, [Some(BlockId(3))]);
            assert_eq!(m.check(BlockId(3), &parent), Some(own));
            // Another parent digest (even with the same 8-byte prefix): no hit.
            let twin = h(1, 1);
            assert_eq!(twin.key64(), parent.key64());
            assert_eq!(m.probe(k, &twin, &toks), None);
            assert_eq!(m.check(BlockId(3), &twin), None);
            let mut other = toks.clone();
            other[bs - 1] += 1;
            assert_eq!(m.probe(k, &parent, &other), None);
            m.candidates(&other, &keys, &mut cand);
            assert_eq!(cand, [None]);
            // An equal block is not memoised twice; another parent is.
            m.insert(BlockId(4), k, h(9, 8), &parent, &toks);
            assert_eq!(m.len(), 1);
            m.insert(BlockId(5), k, h(9, 7), &twin, &toks);
            assert_eq!(m.len(), 2);
            assert_eq!(m.probe(k, &twin, &toks), Some(h(9, 7)));
            assert_eq!(m.entries().expect("consistent").len(), 2);
            m.forget(BlockId(4));
            assert_eq!(m.len(), 2);
            m.forget(BlockId(3));
            m.forget(BlockId(5));
            assert_eq!(m.probe(k, &parent, &toks), None);
            assert!(m.is_empty());
            // Tokens outside i32 are never memoised.
            let wide: Vec<i64> = (0..bs as i64).map(|t| t + (1 << 40)).collect();
            m.insert(BlockId(5), k, own, &parent, &wide);
            assert!(m.is_empty());
            m.insert(BlockId(5), k, own, &parent, &toks);
            m.clear();
            assert!(m.is_empty());
            assert!(m.entries().expect("consistent").is_empty());
        }
    }

    #[test]
    fn prefix_keys_extend_incrementally_and_depend_on_the_whole_prefix() {
        let toks: Vec<i32> = (0..64).collect();
        let mut all = Vec::new();
        extend_prefix_keys(&toks, 16, &mut all);
        assert_eq!(all.len(), 4);
        let mut part = Vec::new();
        extend_prefix_keys(&toks[..40], 16, &mut part);
        assert_eq!(part, all[..2]);
        extend_prefix_keys(&toks, 16, &mut part);
        assert_eq!(part, all);
        let mut changed = toks.clone();
        changed[0] = 99;
        let mut other = Vec::new();
        extend_prefix_keys(&changed, 16, &mut other);
        assert!(other.iter().zip(&all).all(|(a, b)| a != b), "block 0 changes every prefix key");
    }
}
