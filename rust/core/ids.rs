//! Identity newtypes. Every identity in the core has its own `Copy` type so
//! that a block id can never be passed where a page or request id is
//! expected: [`BlockId`] (hash-chain blocks), [`PageId`] (radix pages),
//! [`RequestId`], [`BlockHash`].
//!
//! Invariants: `BlockId(0)` / `PageId(0)` is the null entry, never handed to
//! a request; a `BlockHash` holds its digest inline (unused bytes zero, so
//! equality is byte equality). Costs:
//! every type is `Copy`, comparisons are O(1) (a hash compares its bytes).

use std::fmt;
use std::hash::{Hash, Hasher};

/// Index of a physical KV block in the hash chain's block pool
/// (`0..num_blocks`). Block 0 is the null block of the hash-chain cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId(pub u32);

impl BlockId {
    /// The null block: never allocated, freed or hashed; pads block tables.
    pub const NULL: BlockId = BlockId(0);

    /// The id as a `usize` index.
    #[inline]
    #[must_use]
    pub fn idx(self) -> usize {
        self.0 as usize
    }
}

/// Index of a KV page in a page pool (`0..num_pages`): the `page_size`
/// consecutive KV slots `p * page_size ..`, so with `page_size == 1` a page
/// is one slot. Page 0 is the null page of the radix request cache. Slots
/// themselves never get an id type: they travel as the `int32` / `int64`
/// arrays kernels read (`core::pages` converts between the two).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PageId(pub u32);

impl PageId {
    /// The null page: never handed out; pads block tables.
    pub const NULL: PageId = PageId(0);

    /// The id as a `usize` index.
    #[inline]
    #[must_use]
    pub fn idx(self) -> usize {
        self.0 as usize
    }
}

/// An entry of a request's table, as kernels read it: a block id (hash
/// chain) or a page id (radix cache), 0 being the null entry that pads tables.
pub trait TableEntry: Copy + Eq + Ord + fmt::Debug {
    /// The null entry.
    const NULL: Self;
    /// The entry from its raw id.
    fn from_raw(raw: u32) -> Self;
    /// The raw id (what a table array holds).
    fn raw(self) -> u32;
    /// The raw id as a `usize` index.
    #[inline]
    fn index(self) -> usize {
        self.raw() as usize
    }
}

impl TableEntry for BlockId {
    const NULL: Self = BlockId::NULL;
    #[inline]
    fn from_raw(raw: u32) -> Self {
        BlockId(raw)
    }
    #[inline]
    fn raw(self) -> u32 {
        self.0
    }
}

impl TableEntry for PageId {
    const NULL: Self = PageId::NULL;
    #[inline]
    fn from_raw(raw: u32) -> Self {
        PageId(raw)
    }
    #[inline]
    fn raw(self) -> u32 {
        self.0
    }
}

/// A scheduler's request identifier (an integer chosen by the caller).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

/// Maximum digest length of any supported hash algorithm (SHA-256).
pub const MAX_DIGEST_LEN: usize = 32;

/// The digest of one full block: `H(parent digest, block tokens, extra keys)`.
///
/// It commits to the whole prefix up to and including its block (the chain
/// rule, see [`crate::core::hash`]). 16 bytes for XXH3-128 modes, 32 for
/// SHA-256 modes; unused bytes are zero so equality is byte equality.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct BlockHash {
    bytes: [u8; MAX_DIGEST_LEN],
    len: u8,
}

impl BlockHash {
    /// Builds a hash from a digest of at most [`MAX_DIGEST_LEN`] bytes.
    ///
    /// # Panics
    /// If `digest` is longer than [`MAX_DIGEST_LEN`] (a programming error).
    #[must_use]
    pub fn from_digest(digest: &[u8]) -> Self {
        assert!(digest.len() <= MAX_DIGEST_LEN, "digest too long");
        let mut bytes = [0u8; MAX_DIGEST_LEN];
        bytes[..digest.len()].copy_from_slice(digest);
        // Length fits in u8 by the assertion above.
        #[allow(clippy::cast_possible_truncation)]
        let len = digest.len() as u8;
        BlockHash { bytes, len }
    }

    /// The digest bytes.
    #[inline]
    #[must_use]
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }

    /// All [`MAX_DIGEST_LEN`] bytes: the digest, then zeros.
    #[inline]
    #[must_use]
    pub fn padded_bytes(&self) -> &[u8; MAX_DIGEST_LEN] {
        &self.bytes
    }

    /// The low 64 bits of the digest read big-endian, as vLLM's KV events
    /// report hashes (`int.from_bytes(h, "big") & (2**64 - 1)`).
    #[must_use]
    pub fn low_u64(&self) -> u64 {
        let b = self.as_bytes();
        let mut v = 0u64;
        for &x in &b[b.len().saturating_sub(8)..] {
            v = (v << 8) | u64::from(x);
        }
        v
    }
}

impl BlockHash {
    /// The first 8 digest bytes as a little-endian integer: digests are
    /// uniformly distributed, so this is a ready-made hash-table key (not
    /// unique: tables compare the whole digest).
    #[inline]
    #[must_use]
    pub fn key64(&self) -> u64 {
        let mut w = [0u8; 8];
        w.copy_from_slice(&self.bytes[..8]);
        u64::from_le_bytes(w)
    }
}

impl Hash for BlockHash {
    #[inline]
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.key64());
    }
}

impl fmt::Debug for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.as_bytes() {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}
