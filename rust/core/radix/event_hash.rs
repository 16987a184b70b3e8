//! KV-event hashing: the chained page hashes a namespaced path reports in
//! `BlockStored` / `BlockRemoved` events (the scheme is in the module
//! header), the `BlockStored` of a new leaf, and the listing of the hashes
//! the tree holds ([`RadixTree::cached_page_hashes`]). [`namespace_seed`] and
//! [`chain_page_hashes`] are the one implementation of the scheme: the
//! cluster index hashes query prompts with them too.
//!
//! # Invariants
//! - with events on, every live non-root node holds one hash per page, the
//!   chain continuing from its parent's last hash (or the namespace seed
//!   under the root); with events off no node holds any;
//! - equal hashes mean equal (namespace, token prefix), up to 64-bit
//!   collisions.
//!
//! # Costs
//! O(page tokens) per hashed page (one XXH3-64 over its little-endian
//! bytes); nothing when events are off. Memory: 8 bytes per page. The
//! listing: O(pages log pages) (a copy and a sort; nothing is rehashed).

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use super::{NodeId, Ns, RadixTree};
use crate::core::error::{KvError, KvResult};
use crate::core::events::{EventKey, KvEvent};
use crate::core::hash::Token;

/// The chain seed of a namespace (`None`: no namespace): the hash "before"
/// a path's first page. O(name).
#[must_use]
pub fn namespace_seed(name: Option<&str>) -> u64 {
    match name {
        None => xxh3_64(b"kvindex-radix\x00"),
        Some(s) => {
            let mut b = b"kvindex-radix\x01".to_vec();
            b.extend_from_slice(s.as_bytes());
            xxh3_64(&b)
        }
    }
}

/// Appends to `out` the chained hashes of the full pages of `tokens`
/// (`page_size` tokens each; a partial tail page is not hashed), chaining
/// from `seed` ([`namespace_seed`] for a path from the root). `buf` is
/// scratch. Tokens are hashed as int32: callers check the caches' token rule
/// first ([`Token::check_ids`]); an out-of-range id is truncated here.
/// O(tokens).
pub fn chain_page_hashes<T: Token>(
    tokens: &[T],
    page_size: usize,
    mut seed: u64,
    buf: &mut Vec<u8>,
    out: &mut Vec<u64>,
) {
    for page in tokens.chunks_exact(page_size.max(1)) {
        buf.clear();
        #[allow(clippy::cast_possible_truncation)]
        buf.extend(page.iter().flat_map(|t| (t.get() as i32).to_le_bytes()));
        seed = xxh3_64_with_seed(buf, seed);
        out.push(seed);
    }
}

impl RadixTree {
    /// The page hashes the tree holds (with events on, one per cached
    /// page), ascending and each once: the set a subscriber holds
    /// after applying every `BlockStored` / `BlockRemoved` /
    /// `AllBlocksCleared` the tree has emitted (as long as the bounded buffer
    /// dropped none). Read-only: no recency, no events.
    /// O(pages log pages).
    ///
    /// # Errors
    /// `InvalidArgument` when events are off (the tree hashes no page then).
    pub fn cached_page_hashes(&self) -> KvResult<Vec<u64>> {
        if !self.events.enabled() {
            return Err(KvError::invalid(
                "the tree lists page hashes only with enable_events=True (it hashes no page otherwise)",
            ));
        }
        let mut mine: Vec<u64> = Vec::new();
        for n in self.nodes[1..].iter().filter(|n| n.live) {
            mine.extend_from_slice(&n.hashes);
        }
        mine.sort_unstable();
        // Equal hashes are equal (namespace, prefix) up to 64-bit collisions,
        // and the tree holds a prefix once; a colliding hash is listed once,
        // as a subscriber's set holds it.
        mine.dedup();
        Ok(mine)
    }

    pub(super) fn ns_seed(&self, ns: Ns) -> u64 {
        namespace_seed(self.ns.name(ns))
    }

    /// Chained page hashes of `key` starting from `seed` (module docs).
    pub(super) fn page_hashes(&mut self, key: &[i32], seed: u64) -> Vec<u64> {
        let mut out = Vec::with_capacity(key.len() / self.page_size);
        chain_page_hashes(key, self.page_size, seed, &mut self.scratch_bytes, &mut out);
        out
    }

    pub(super) fn parent_hash(&self, parent: NodeId, ns: Ns) -> (u64, Option<u64>) {
        if parent == NodeId::ROOT {
            (self.ns_seed(ns), None)
        } else {
            let h = *self.nodes[parent.idx()].hashes.last().expect("events on: every node has page hashes");
            (h, Some(h))
        }
    }

    /// The page hashes of a new leaf's `key` under `parent` in namespace
    /// `ns`, after buffering its `BlockStored`; empty when events are off.
    /// O(key).
    pub(super) fn leaf_stored(&mut self, parent: NodeId, ns: Ns, key: &[i32]) -> Vec<u64> {
        if !self.events.enabled() {
            return Vec::new();
        }
        let (seed, parent_hash) = self.parent_hash(parent, ns);
        let hashes = self.page_hashes(key, seed);
        let name = self.ns.name(ns).map(|s| vec![EventKey::Str(s.to_owned())]);
        let ev = KvEvent::BlockStored {
            block_hashes: hashes.clone(),
            parent_block_hash: parent_hash,
            token_ids: key.iter().map(|&t| i64::from(t)).collect(),
            block_size: self.page_size,
            lora_name: None,
            extra_keys: vec![name; hashes.len()],
        };
        self.events.record(|| ev);
        hashes
    }
}
