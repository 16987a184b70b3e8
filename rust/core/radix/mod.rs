//! Radix-tree prefix cache with SGLang `RadixCache` semantics: token-run
//! edges, node splitting on partial matches, lock refs that walk to the root,
//! and policy-ordered eviction of whole unlocked leaves.
//!
//! ```text
//!  insert [A B C D E F], then [A B C X Y Z]:       root
//!                                                    |
//!                                                 [A B C]        <- split off, keeps
//!                                                 /     \           lock/hit/priority
//!                                           [D E F]     [X Y Z]     of [A B C D E F]
//! ```
//!
//! # Layout (one concern per module, each with its invariants and costs)
//! | module | concern |
//! |---|---|
//! | `mod.rs` | the tree's types, sizes, path reads, locks, reset, events buffer |
//! | `arena` | node arena, node handles, child keys |
//! | `namespace` | namespace interning |
//! | `values` | the value bitmap (each value stored once) |
//! | `walk` | match and insert (walks, splits, new leaves) |
//! | `event_hash` | chained page hashes, `BlockStored` of new leaves, the hash listing |
//! | `evict` | the evictable set and eviction policies |
//! | `hybrid` | the SWA / Mamba components (tombstones, window locks, cascade eviction) |
//! | `dump` | debug dump and cached sequences |
//! | `check` | `check_invariants` |
//!
//! # Data model
//! Nodes live in an arena (`Vec<Node>`) addressed by [`NodeId`]; freed arena
//! slots are reused, and a per-slot generation makes a caller's
//! [`NodeHandle`] to an evicted node detectably stale. Each non-root node
//! holds an edge: `key` (token ids, a multiple of `page_size` long) and
//! `value` (one [`PageId`] per page: the KV slot when `page_size == 1`, the
//! page id `slot / page_size` otherwise). Children are keyed by
//! `(namespace, first page)`: exactly (`ns << 32 | token`) when
//! `page_size == 1`, by a hash of the page otherwise (a lookup compares the
//! page; the rare colliding siblings share a list). A namespace (LoRA
//! id, cache salt; interned as [`Ns`]) isolates sequences completely: the
//! same tokens under two namespaces never share a node.
//!
//! # Invariants (checked by [`RadixTree::check_invariants`]; numbered as in
//! the SGLang radix-cache behaviour reference)
//! 1. The root is node 0: no parent, empty key and value, `lock_ref == 1`
//!    forever, never evictable.
//! 2. Every live non-root node: `key` non-empty and a multiple of
//!    `page_size`, `value.len() == key.len() / page_size`.
//! 3. Parent/child links agree; a child is filed under
//!    `(its namespace, its first page)`; siblings differ in their first page;
//!    the namespace is constant along a path; every live node is reachable.
//! 4. `lock_ref == own locks + Σ children's lock_ref` (so `lock_ref >=` every
//!    child's).
//! 5. `evictable_size == Σ len(key) [lock_ref == 0]`,
//!    `protected_size == Σ len(key) [lock_ref > 0]`.
//! 6. The evictable set is exactly the unlocked childless non-root nodes, each
//!    under its current policy key.
//! 7. No value appears twice in the tree; the value bitmap is exactly the set
//!    of tree values (so a value the caller is told to free is never the
//!    tree's).
//!
//!  Invariants 8-13 are behavioural (hits are longest page-aligned common
//!  prefixes, match never changes sizes, insert grows the tree by
//!  `aligned - prefix`, eviction frees whole unlocked leaves, locks restore
//!  sizes, namespaces isolate); property tests check them against models.
//!
//! # Recency
//! A logical clock ticks once per `match_prefix` / `insert`; every node a walk
//! visits is stamped with the tick (root included; a match on a tree with SWA
//! or Mamba components stamps the hit's nodes only), so eviction order is
//! deterministic. Both halves of a split get the tick; the new upper half is
//! "created" then (under FIFO/FILO a split parent looks new, as in SGLang).
//!
//! Owed counts: [`RadixTree::extend_locked`] (a running request's pages
//! entering the tree one leaf at a time below its own lock) would count an
//! insert on, and stamp, every node of a path that grows one node per page.
//! It records both once instead, on the extended node (`owed_hits` +1,
//! `owed_tick` = the tick), owed to that node and its ancestors. Those nodes
//! are all locked (the lock moved down to the new leaf), so no eviction key
//! reads them; [`RadixTree::unlock`] settles the owed counts of its walk
//! (adding each node's subtree sum on the way up, taking the largest stamp)
//! before any of those nodes can become evictable, and the readers of a
//! locked node's counts ([`RadixTree::dump`], [`RadixTree::evict_key`])
//! add what is still owed. So every observable count and stamp is the one
//! the per-node walk would have written; a split copies the stored count,
//! and the owed part below still reaches both halves.
//!
//! # Who frees what
//! The tree owns the values of its nodes. [`RadixTree::insert`] returns the
//! length of the prefix that was already present; the caller's values for
//! that prefix that differ from the tree's are duplicates, returned in
//! `to_free` (the caller frees exactly those). Values equal to the tree's (the
//! caller got them from a match) are not duplicates. A value already in the
//! tree elsewhere, or passed twice, is rejected before anything changes, so a
//! value is never both the tree's and the caller's to free.
//!
//! # KV events (when enabled)
//! Page-granular and chained: for a namespace `ns` the chain starts at
//! `seed = xxh3_64(b"kvindex-radix\x00")` (no namespace) or
//! `xxh3_64(b"kvindex-radix\x01" ++ utf8(ns))`, and page `i` of a path hashes
//! as `h_i = xxh3_64_with_seed(le_bytes_i32(page tokens), h_{i-1})` with
//! `h_{-1} = seed`. Equal hashes mean equal (namespace, prefix). A new leaf
//! emits one `BlockStored` covering its pages (parent = the last page hash
//! of its parent node, `None` under the root; each page's `extra_keys` is
//! `[namespace]` when namespaced); an evicted leaf emits one `BlockRemoved`
//! with all its page hashes; `reset` emits `AllBlocksCleared`. Events wait
//! for the caller in a bounded [`crate::core::event_buffer::EventBuffer`]
//! (drop-oldest, counted).
//!
//! # Costs
//! `n` = query tokens, `d` = depth of the walk, `L` = evictable leaves.
//! `match_prefix`: O(n) token compares (galloping memcmp), O(d) hash lookups
//! plus O(hit pages) to copy values; a split copies the shorter half of the
//! edge (the longer keeps its buffer).
//! `insert`: the same walk, O(new pages) and O(prefix pages) to find
//! duplicates. `extend_locked`: O(new tokens), whatever the depth.
//! `lock`/`unlock`: O(d + log L). `evict`: O(log L) per removed
//! node plus O(its pages). Memory: 4 bytes per token, 4 per page, 256 bytes
//! per node (arena slot), and a bitmap of one bit per value up to the largest value ever
//! stored (256 MiB at most for int32 slots; a refused insert does not grow it).

mod arena;
#[cfg(test)]
mod cache_hybrid_tests;
mod check;
mod dump;
mod event_hash;
mod evict;
mod hybrid;
#[cfg(test)]
mod hybrid_tests;
mod namespace;
pub mod pools;
#[cfg(test)]
mod tests;
mod values;
mod walk;

pub use event_hash::{chain_page_hashes, namespace_seed};

use std::collections::BTreeSet;

use rustc_hash::FxHashMap;

use crate::core::error::{ErrorKind, KvError, KvResult};
use crate::core::event_buffer::Events;
use crate::core::events::KvEvent;
use crate::core::ids::PageId;

#[cfg(test)]
use arena::FORCE_COLLISIONS;
use arena::{child_key, Kids, Node};
pub use evict::{EvictKey, Policy, POLICY_NAMES};
use hybrid::Hybrid;
pub use hybrid::{Components, HybridFreed, InsertOpts};
use namespace::Namespaces;
pub use namespace::Ns;
#[cfg(test)]
use values::mark_all;
use values::unmark_all;
pub use walk::{common_prefix, common_prefix_of};

/// Index of a node in the tree's arena. The root is [`NodeId::ROOT`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u32);

impl NodeId {
    /// The root node (never evicted; a miss returns it).
    pub const ROOT: NodeId = NodeId(0);

    /// The id as a `usize` index.
    #[inline]
    #[must_use]
    pub fn idx(self) -> usize {
        self.0 as usize
    }
}

/// A node handle as callers hold it: `generation << 32 | arena index`. The
/// generation of an arena slot changes whenever its node is freed (eviction,
/// reset), so a handle to a freed node is detected as stale (until the same
/// slot has been reused 2^32 times). The root's handle is always 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NodeHandle(pub u64);

/// Result of [`RadixTree::match_prefix`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Match {
    /// Matched tokens (a multiple of the page size).
    pub len: usize,
    /// The last matched node (the root on a miss); lock it to protect the hit.
    pub node: NodeId,
}

/// A match that has been applied to the tree ([`RadixTree::match_nodes`]),
/// with read access to the matched values until the tree is next changed.
#[derive(Clone, Copy, Debug)]
pub struct Matched<'a> {
    tree: &'a RadixTree,
    /// Matched tokens (a multiple of the page size).
    pub len: usize,
    /// The last matched node (the root on a miss).
    pub node: NodeId,
}

impl<'a> Matched<'a> {
    /// The matched nodes' values (one per page), root side first.
    pub fn values(&self) -> impl Iterator<Item = &'a [PageId]> + 'a {
        let tree = self.tree;
        tree.path.iter().map(move |&(n, _)| tree.nodes[n.idx()].value.as_slice())
    }

    /// The plain result.
    #[must_use]
    pub fn result(&self) -> Match {
        Match { len: self.len, node: self.node }
    }
}

/// Read-only result of [`RadixTree::probe`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Probe {
    /// Tokens a match would hit now.
    pub len: usize,
    /// Tokens of currently unlocked nodes that locking the match would protect.
    pub lockable: usize,
    /// Live SWA tokens, not SWA-locked now, that locking the match would
    /// SWA-lock (0 without SWA).
    pub swa_lockable: usize,
    /// Whether locking the match would lock a Mamba state evictable now.
    pub mamba_lockable: bool,
}

/// The radix tree. See the module documentation.
#[derive(Clone, Debug)]
pub struct RadixTree {
    nodes: Vec<Node>,
    free_nodes: Vec<u32>,
    page_size: usize,
    policy: Policy,
    clock: u64,
    /// Next node creation sequence number.
    next_seq: u64,
    evictable: BTreeSet<(EvictKey, NodeId)>,
    evictable_size: usize,
    protected_size: usize,
    num_nodes: usize,
    /// Bitmap over values: bit v set iff value v is in the tree.
    in_tree: Vec<u64>,
    ns: Namespaces,
    events: Events,
    /// Scratch: the path of the last walk, `(child, matched tokens)`.
    path: Vec<(NodeId, usize)>,
    scratch_bytes: Vec<u8>,
    /// SWA / Mamba components (`None`: full attention only).
    hy: Option<Box<Hybrid>>,
}

impl RadixTree {
    /// An empty tree with `page_size` tokens per page, evicting by `policy`,
    /// buffering KV events if `enable_events`.
    ///
    /// # Errors
    /// `InvalidArgument` if `page_size` is not in `1..=2**20`.
    pub fn new(page_size: usize, policy: Policy, enable_events: bool) -> KvResult<Self> {
        if !(1..=(1 << 20)).contains(&page_size) {
            return Err(KvError::invalid(format!("page_size must be in 1..=2**20, got {page_size}")));
        }
        let mut root = Node::empty(0);
        root.live = true;
        root.lock_ref = 1;
        root.priority = i64::MIN;
        Ok(RadixTree {
            nodes: vec![root],
            free_nodes: Vec::new(),
            page_size,
            policy,
            clock: 0,
            next_seq: 1,
            evictable: BTreeSet::new(),
            evictable_size: 0,
            protected_size: 0,
            num_nodes: 0,
            in_tree: Vec::new(),
            ns: Namespaces::new(),
            events: Events::new(enable_events),
            path: Vec::new(),
            scratch_bytes: Vec::new(),
            hy: None,
        })
    }

    /// Tokens per page. O(1).
    #[must_use]
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// The eviction policy. O(1).
    #[must_use]
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// Tokens in unlocked nodes. O(1).
    #[must_use]
    pub fn evictable_size(&self) -> usize {
        self.evictable_size
    }

    /// Tokens in locked nodes. O(1).
    #[must_use]
    pub fn protected_size(&self) -> usize {
        self.protected_size
    }

    /// Tokens in the tree (`evictable + protected`). O(1).
    #[must_use]
    pub fn total_size(&self) -> usize {
        self.evictable_size + self.protected_size
    }

    /// Live non-root nodes. O(1).
    #[must_use]
    pub fn num_nodes(&self) -> usize {
        self.num_nodes
    }

    /// Evictable leaves. O(1).
    #[must_use]
    pub fn num_evictable_leaves(&self) -> usize {
        self.evictable.len()
    }

    /// The logical clock (ticks once per match or insert). O(1).
    #[must_use]
    pub fn clock(&self) -> u64 {
        self.clock
    }

    /// Total lock count of a live node (root: 1). O(1).
    #[must_use]
    pub fn lock_ref(&self, id: NodeId) -> u32 {
        self.nodes[id.idx()].lock_ref
    }

    /// Locks taken and not released, over all nodes. O(arena).
    #[must_use]
    pub fn num_own_locks(&self) -> u64 {
        self.nodes.iter().map(|n| u64::from(n.own_locks)).sum()
    }

    /// Number of tokens on the path root..=`id`. O(depth).
    #[must_use]
    pub fn path_len(&self, id: NodeId) -> usize {
        let mut n = 0;
        let mut cur = id;
        while cur != NodeId::ROOT {
            n += self.nodes[cur.idx()].key.len();
            cur = self.nodes[cur.idx()].parent;
        }
        n
    }

    /// Appends the values of the path root..=`id` to `out`, root side first
    /// (SGLang `path_device_indices`). O(depth + pages).
    pub fn path_values(&self, id: NodeId, out: &mut Vec<PageId>) {
        let start = out.len();
        let mut cur = id;
        while cur != NodeId::ROOT {
            out.extend(self.nodes[cur.idx()].value.iter().rev());
            cur = self.nodes[cur.idx()].parent;
        }
        out[start..].reverse();
    }

    /// Appends every value in the tree to `out` (DFS order). O(nodes + pages).
    pub fn all_values(&self, out: &mut Vec<PageId>) {
        for n in &self.nodes[1..] {
            if n.live {
                out.extend_from_slice(&n.value);
            }
        }
    }

    /// Takes a lock on `id`: the node and its ancestors (root excluded) get
    /// `lock_ref += 1`; nodes going from 0 to 1 move their size from
    /// evictable to protected and leave the evictable set. Locking the root
    /// (a miss) is a no-op. O(depth + log L).
    pub fn lock(&mut self, id: NodeId) {
        if id == NodeId::ROOT {
            return;
        }
        self.nodes[id.idx()].own_locks += 1;
        let mut cur = id;
        while cur != NodeId::ROOT {
            let n = &mut self.nodes[cur.idx()];
            if n.lock_ref == 0 {
                self.evictable_size -= n.key.len();
                self.protected_size += n.key.len();
            }
            n.lock_ref += 1;
            let parent = n.parent;
            self.update_leaf_status(cur);
            cur = parent;
        }
        if self.hy.is_some() {
            self.hy_lock(id);
        }
    }

    /// Releases a lock taken on `id` by [`RadixTree::lock`]; the reverse
    /// walk, which also settles the hit counts and stamps extensions owe to
    /// the path (module docs, recency). Unlocking the root is a no-op.
    /// O(depth + log L).
    ///
    /// # Errors
    /// `Lock` if `id` holds no lock of its own (a double unlock, or a node
    /// that is only locked through a descendant); nothing changes.
    pub fn unlock(&mut self, id: NodeId) -> KvResult<()> {
        if id == NodeId::ROOT {
            return Ok(());
        }
        let n = &mut self.nodes[id.idx()];
        if n.own_locks == 0 {
            return Err(KvError::new(
                ErrorKind::Lock,
                format!(
                    "unlock of node {} which holds no lock of its own (lock_ref {}): double unlock?",
                    id.0, n.lock_ref
                ),
            ));
        }
        n.own_locks -= 1;
        if self.hy.is_some() {
            self.hy_unlock(id);
        }
        // Settle what extensions below owe to this path (before any of its
        // nodes can become evictable): each node gets the owed hits of its
        // walked subtree part and the latest owed stamp.
        let (mut hits, mut tick) = (0, 0);
        let mut cur = id;
        while cur != NodeId::ROOT {
            let n = &mut self.nodes[cur.idx()];
            hits += std::mem::take(&mut n.owed_hits);
            tick = tick.max(std::mem::take(&mut n.owed_tick));
            n.hit_count += hits;
            n.last_access = n.last_access.max(tick);
            n.lock_ref = n.lock_ref.checked_sub(1).expect("lock_ref >= own locks along the path");
            if n.lock_ref == 0 {
                self.evictable_size += n.key.len();
                self.protected_size -= n.key.len();
            }
            let parent = n.parent;
            self.update_leaf_status(cur);
            cur = parent;
        }
        Ok(())
    }

    /// Resolves and locks a handle. O(depth + log L).
    ///
    /// # Errors
    /// `StaleHandle`.
    pub fn lock_handle(&mut self, h: NodeHandle) -> KvResult<()> {
        let id = self.resolve(h)?;
        self.lock(id);
        Ok(())
    }

    /// Resolves and unlocks a handle. O(depth + log L).
    ///
    /// # Errors
    /// `StaleHandle`, `Lock`.
    pub fn unlock_handle(&mut self, h: NodeHandle) -> KvResult<()> {
        let id = self.resolve(h)?;
        self.unlock(id)
    }

    /// Removes every node (handles become stale, locks are dropped) and
    /// appends all values the tree held to `freed` (the caller releases
    /// them). Emits `AllBlocksCleared`. O(nodes + pages).
    pub fn reset(&mut self, freed: &mut Vec<PageId>) {
        self.all_values(freed);
        self.clear();
    }

    /// [`RadixTree::reset`] handing the values back in ascending order (from
    /// the value bitmap, without a sort). O(nodes + pages + bitmap words).
    pub fn reset_sorted(&mut self, freed: &mut Vec<PageId>) {
        self.sorted_values(freed);
        self.clear();
    }

    /// The node-removing half of a reset: every node freed (handles go
    /// stale), sizes, bitmap and namespaces cleared, `AllBlocksCleared`.
    fn clear(&mut self) {
        self.hy_clear();
        for i in 1..self.nodes.len() {
            if self.nodes[i].live {
                #[allow(clippy::cast_possible_truncation)]
                self.release_node(NodeId(i as u32));
            }
        }
        let root = &mut self.nodes[0];
        root.children = FxHashMap::default();
        root.priority = i64::MIN;
        self.evictable.clear();
        self.evictable_size = 0;
        self.protected_size = 0;
        self.in_tree.clear();
        self.ns.clear();
        self.events.record(|| KvEvent::AllBlocksCleared);
    }

    /// The KV events (bounded, drop-oldest: see [`crate::core::event_buffer`]).
    #[must_use]
    pub fn events(&self) -> &Events {
        &self.events
    }

    /// The KV events, to drain or bound.
    pub fn events_mut(&mut self) -> &mut Events {
        &mut self.events
    }
}
