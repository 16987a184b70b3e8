//! Query hashing: a prompt's tokens into the block hashes the workers' KV
//! events carry, so that the index can be asked by tokens.
//!
//! Two schemes, each the one implementation its cache uses:
//! - the hash chain's ([`BlockHasher`], any [`HashAlgo`] name): block `i`'s
//!   digest chains blocks `0..=i` and their extra keys (LoRA, cache salt,
//!   multimodal items); events carry its low 64 bits;
//! - the radix tree's (`"radix_xxh3_64"`, [`RADIX_XXH3_64`]): page `i` is
//!   `xxh3_64_with_seed(le_bytes_i32(page), h_{i-1})` from the namespace's
//!   seed ([`crate::core::radix::namespace_seed`]), the namespace built from
//!   LoRA and cache salt as a `RadixPrefixCache` builds it
//!   ([`crate::core::radix_cache::namespace`]); multimodal items and ids
//!   outside int32 are rejected, as that cache rejects them.
//!
//! # Costs
//! Hash chain: one serialisation and digest per block, computed as the
//! query walks (a walk that stops early hashes only up to where it stopped
//! plus one chunk). Radix: one XXH3-64 per page over the whole prompt, then
//! the walk. Nothing is allocated after warm-up.
//!
//! Invariant: a query's hashes equal the ones the workers' events carry for
//! the same prompt (the tests compare them).

use super::ClusterIndex;
use crate::core::error::{KvError, KvResult};
use crate::core::hash::{BlockHasher, HashAlgo, KeySpec, Token, ALGO_NAMES};
use crate::core::ids::BlockHash;
use crate::core::radix::{chain_page_hashes, namespace_seed};
use crate::core::radix_cache::namespace;

/// The radix tree's page-hash scheme as a query algorithm name.
pub const RADIX_XXH3_64: &str = "radix_xxh3_64";

/// Every query algorithm name: the hash chain's then the radix tree's.
pub const QUERY_ALGO_NAMES: [&str; ALGO_NAMES.len() + 1] = {
    let mut out = [RADIX_XXH3_64; ALGO_NAMES.len() + 1];
    let mut i = 0;
    while i < ALGO_NAMES.len() {
        out[i] = ALGO_NAMES[i];
        i += 1;
    }
    out
};

/// A prompt hasher for one scheme, with its reused buffers.
#[derive(Clone, Debug)]
pub enum QueryHasher {
    /// The hash chain's blocks.
    Chain {
        /// The chain hasher (algorithm and root seed).
        hasher: BlockHasher,
        /// Scratch: full digests.
        chain: Vec<BlockHash>,
    },
    /// The radix tree's pages.
    Radix {
        /// Scratch: one page's bytes.
        buf: Vec<u8>,
    },
}

impl QueryHasher {
    /// The hasher of algorithm `algo` ([`QUERY_ALGO_NAMES`]); `seed` is the
    /// hash chain's root seed (`None`: the algorithm's default).
    ///
    /// # Errors
    /// `InvalidArgument` for an unknown name, or a `seed` with
    /// `radix_xxh3_64` (its chains start at the namespace's seed).
    pub fn new(algo: &str, seed: Option<&str>) -> KvResult<Self> {
        if algo == RADIX_XXH3_64 {
            if seed.is_some() {
                return Err(KvError::invalid(
                    "seed does not apply to radix_xxh3_64 (its chains start at the namespace's seed)",
                ));
            }
            return Ok(QueryHasher::Radix { buf: Vec::new() });
        }
        let algo = HashAlgo::parse(algo).map_err(|_| {
            KvError::invalid(format!(
                "unknown algo {algo:?}; expected one of {}",
                QUERY_ALGO_NAMES.join(", ")
            ))
        })?;
        Ok(QueryHasher::Chain { hasher: BlockHasher::new(algo, seed), chain: Vec::new() })
    }

    /// The algorithm's name.
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            QueryHasher::Chain { hasher, .. } => hasher.algo().name(),
            QueryHasher::Radix { .. } => RADIX_XXH3_64,
        }
    }

    /// The block hashes of `tokens`' full blocks of `block_size` (as events
    /// carry them) into `out` (cleared first). O(tokens).
    ///
    /// # Errors
    /// Radix only: `InvalidArgument` for multimodal items or an id outside
    /// int32 (nothing written).
    pub fn hashes<T: Token>(
        &mut self,
        tokens: &[T],
        block_size: usize,
        spec: &KeySpec,
        out: &mut Vec<u64>,
    ) -> KvResult<()> {
        out.clear();
        match self {
            QueryHasher::Chain { hasher, chain } => {
                chain.clear();
                hasher.extend_chain(tokens, block_size, spec, chain);
                out.extend(chain.iter().map(BlockHash::low_u64));
            }
            QueryHasher::Radix { buf } => {
                let ns = namespace(spec)?;
                T::check_ids(tokens)?;
                chain_page_hashes(tokens, block_size, namespace_seed(ns.as_deref()), buf, out);
            }
        }
        Ok(())
    }

    /// Per worker slot of `index`: the leading blocks of `tokens` it holds,
    /// into `out`; `hashes` is scratch (left holding the hashes computed).
    /// Returns the prompt's full blocks.
    ///
    /// # Errors
    /// As [`QueryHasher::hashes`].
    #[allow(clippy::too_many_arguments)]
    pub fn overlaps<T: Token>(
        &mut self,
        index: &ClusterIndex,
        tokens: &[T],
        block_size: usize,
        spec: &KeySpec,
        hashes: &mut Vec<u64>,
        out: &mut Vec<u32>,
    ) -> KvResult<usize> {
        match self {
            QueryHasher::Chain { hasher, chain } => {
                Ok(index.overlaps_tokens(hasher, tokens, block_size, spec, chain, hashes, out))
            }
            QueryHasher::Radix { .. } => {
                self.hashes(tokens, block_size, spec, hashes)?;
                index.overlaps(hashes, out);
                Ok(hashes.len())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{namespace, QueryHasher, QUERY_ALGO_NAMES, RADIX_XXH3_64};
    use crate::core::cluster::ClusterIndex;
    use crate::core::events::KvEvent;
    use crate::core::hash::KeySpec;
    use crate::core::ids::PageId;
    use crate::core::radix::{Policy, RadixTree};

    #[test]
    fn names() {
        assert_eq!(QUERY_ALGO_NAMES.last(), Some(&RADIX_XXH3_64));
        assert_eq!(QUERY_ALGO_NAMES[0], "xxh3_128");
        for name in QUERY_ALGO_NAMES {
            assert_eq!(QueryHasher::new(name, None).expect("test setup").name(), name);
        }
        assert!(QueryHasher::new("nope", None).is_err());
        assert!(QueryHasher::new(RADIX_XXH3_64, Some("s")).is_err());
    }

    #[test]
    fn radix_hashes_are_the_tree_event_hashes() {
        // The tree's BlockStored hashes for a sequence equal the query hashes,
        // with and without a namespace (LoRA + salt as the request cache builds it).
        let salted = KeySpec { cache_salt: Some("s".to_owned()), ..KeySpec::default() };
        for (ps, spec) in [(1usize, KeySpec::default()), (4, KeySpec::default()), (4, salted)] {
            let ns = namespace(&spec).expect("test setup");
            let mut tree = RadixTree::new(ps, Policy::Lru, true).expect("test setup");
            let toks: Vec<i32> = (0..12).collect();
            #[allow(clippy::cast_possible_truncation)]
            let vals: Vec<PageId> = (1..=(12 / ps) as u32).map(PageId).collect();
            tree.insert(&toks, &vals, ns.as_deref(), 0, &[], &mut Vec::new()).expect("test setup");
            let mut stored = Vec::new();
            for ev in tree.events_mut().take() {
                if let KvEvent::BlockStored { block_hashes, .. } = ev {
                    stored.extend(block_hashes);
                }
            }
            let mut q = QueryHasher::new(RADIX_XXH3_64, None).expect("test setup");
            let mut out = Vec::new();
            q.hashes(&toks, ps, &spec, &mut out).expect("test setup");
            assert_eq!(out, stored);
            q.hashes(
                &toks,
                ps,
                &KeySpec { cache_salt: Some("t".to_owned()), ..KeySpec::default() },
                &mut out,
            )
            .expect("test setup");
            assert_ne!(out, stored);
            let mut ix = ClusterIndex::new(i64::try_from(ps).expect("test setup")).expect("test setup");
            let w = ix.add_worker("a", 0).expect("test setup");
            ix.store_hashes(w, &stored).expect("test setup");
            let (mut h, mut ov) = (Vec::new(), Vec::new());
            let mut longer = toks.clone();
            longer.extend([99; 8]);
            let n = q.overlaps(&ix, &longer, ps, &spec, &mut h, &mut ov).expect("test setup");
            assert_eq!(n, 20 / ps);
            assert_eq!(ov[w.0 as usize] as usize, 12 / ps);
            assert!(q.hashes(&[1i64 << 40], 1, &KeySpec::default(), &mut out).is_err());
        }
    }
}
