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
//! # Data model
//! Nodes live in an arena (`Vec<Node>`) addressed by [`NodeId`]; freed arena
//! slots are reused, and a per-slot generation makes a caller's
//! [`NodeHandle`] to an evicted node detectably stale. Each non-root node
//! holds an edge: `key` (token ids, a multiple of `page_size` long) and
//! `value` (one [`BlockId`] per page: the KV slot when `page_size == 1`, the
//! page id `slot / page_size` otherwise). Children are keyed by
//! `(namespace, first page)`: exactly (`ns << 32 | token`) when
//! `page_size == 1`, by a hash of the page otherwise (a lookup compares the
//! page; the rare colliding siblings share a list). A namespace (LoRA
//! id, cache salt; interned as [`Ns`]) isolates sequences completely: the
//! same tokens under two namespaces never share a node.
//!
//! # Invariants (checked by [`RadixTree::check_invariants`]; numbering of
//! the SGLang reference, §10)
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
//! visits is stamped with the tick (root included), so eviction order is
//! deterministic. Both halves of a split get the tick; the new upper half is
//! "created" then (under FIFO/FILO a split parent looks new, as in SGLang).
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
//! plus O(hit pages) to copy values; a split moves O(edge) tokens.
//! `insert`: the same walk, O(new pages) and O(prefix pages) to find
//! duplicates. `lock`/`unlock`: O(d + log L). `evict`: O(log L) per removed
//! node plus O(its pages). Memory: 4 bytes per token, 4 per page, ~200 bytes
//! per node, and a bitmap of one bit per value up to the largest value ever
//! stored (256 MiB at most for int32 slots; a refused insert does not grow it).

mod check;
mod evict;
#[cfg(test)]
mod tests;

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::hash::Hasher as _;

use rustc_hash::FxHashMap;
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use crate::core::error::{ErrorKind, KvError, KvResult};
use crate::core::event_buffer::{self, EventBuffer};
use crate::core::events::{EventKey, KvEvent};
use crate::core::ids::BlockId;

pub use evict::{EvictKey, Policy, POLICY_NAMES};

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

/// An interned namespace. [`Ns::NONE`] is "no namespace".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ns(pub u32);

impl Ns {
    /// No namespace.
    pub const NONE: Ns = Ns(0);
}

/// Children sharing one map key: with `page_size > 1` two first pages may
/// hash alike (they are told apart by comparing the page).
#[derive(Clone, Debug)]
enum Kids {
    One(NodeId),
    Many(Vec<NodeId>),
}

/// A tree node. Laid out by hand, cache-line aligned, so that a walk touches
/// one line per node (the edge's tokens and the child map, plus the recency
/// stamp) and reading the matched values one more (values, eviction entry,
/// lock count); the rest is cold bookkeeping.
#[derive(Clone, Debug)]
#[repr(C, align(64))]
struct Node {
    // line 0: what a walk reads
    key: Vec<i32>,
    children: FxHashMap<u64, Kids>,
    last_access: u64,
    // line 1: what a match's output and locks read
    value: Vec<BlockId>,
    /// The node's entry in the evictable set, if it is in it.
    evict_key: Option<EvictKey>,
    /// Own locks + Σ children's `lock_ref` (root: 1 forever).
    lock_ref: u32,
    parent: NodeId,
    // cold
    /// Locks taken on this very node (what `unlock` may release).
    own_locks: u32,
    ns: Ns,
    generation: u32,
    live: bool,
    created: u64,
    /// Creation sequence number (never reused): the eviction tie-breaker.
    seq: u64,
    hit_count: u64,
    priority: i64,
    /// Chained page hashes (only when events are enabled).
    hashes: Vec<u64>,
}

impl Node {
    fn empty(generation: u32) -> Self {
        Node {
            key: Vec::new(),
            value: Vec::new(),
            parent: NodeId::ROOT,
            children: FxHashMap::default(),
            ns: Ns::NONE,
            lock_ref: 0,
            own_locks: 0,
            last_access: 0,
            created: 0,
            seq: 0,
            hit_count: 0,
            priority: 0,
            evict_key: None,
            generation,
            live: false,
            hashes: Vec::new(),
        }
    }
}

/// Interned namespace strings. A namespace's id lives while the root has a
/// child in it; ids are recycled afterwards, so memory tracks tree content.
#[derive(Clone, Debug, Default)]
struct Namespaces {
    ids: FxHashMap<Box<str>, u32>,
    /// `names[id]` (index 0 = no namespace, always `None`).
    names: Vec<Option<Box<str>>>,
    /// Root children per namespace id.
    roots: Vec<u32>,
    free: Vec<u32>,
}

impl Namespaces {
    fn new() -> Self {
        Namespaces { ids: FxHashMap::default(), names: vec![None], roots: vec![0], free: Vec::new() }
    }

    fn lookup(&self, ns: Option<&str>) -> Option<Ns> {
        match ns {
            None => Some(Ns::NONE),
            Some(s) => self.ids.get(s).map(|&i| Ns(i)),
        }
    }

    fn intern(&mut self, ns: Option<&str>) -> Ns {
        let Some(s) = ns else { return Ns::NONE };
        if let Some(&i) = self.ids.get(s) {
            return Ns(i);
        }
        let i = if let Some(i) = self.free.pop() {
            self.names[i as usize] = Some(s.into());
            i
        } else {
            self.names.push(Some(s.into()));
            self.roots.push(0);
            u32::try_from(self.names.len() - 1).expect("fewer than 2^32 namespaces")
        };
        self.ids.insert(s.into(), i);
        Ns(i)
    }

    fn name(&self, ns: Ns) -> Option<&str> {
        self.names[ns.0 as usize].as_deref()
    }

    fn add_root_child(&mut self, ns: Ns) {
        self.roots[ns.0 as usize] += 1;
    }

    fn remove_root_child(&mut self, ns: Ns) {
        let r = &mut self.roots[ns.0 as usize];
        *r = r.checked_sub(1).expect("namespace root count underflow");
        if *r == 0 && ns != Ns::NONE {
            let name = self.names[ns.0 as usize].take().expect("live namespace has a name");
            self.ids.remove(&name);
            self.free.push(ns.0);
        }
    }

    fn clear(&mut self) {
        *self = Namespaces::new();
    }
}

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
    pub fn values(&self) -> impl Iterator<Item = &'a [BlockId]> + 'a {
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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probe {
    /// Tokens a match would hit now.
    pub len: usize,
    /// Tokens of currently unlocked nodes that locking the match would protect.
    pub lockable: usize,
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
    events: Option<EventBuffer>,
    /// Scratch: the path of the last walk, `(child, matched tokens)`.
    path: Vec<(NodeId, usize)>,
    scratch_bytes: Vec<u8>,
}

/// The key a child is filed under in its parent's map: from its namespace and
/// first page (`page` is the first `page_size` tokens). With `page_size == 1`
/// the key is exact (`ns << 32 | token`); with larger pages it is a hash of the
/// page (children of one parent often share a first token when pages straddle
/// a common prefix), and a lookup still compares the page itself.
#[inline]
fn child_key(ns: Ns, page: &[i32]) -> u64 {
    #[cfg(test)]
    if FORCE_COLLISIONS.with(std::cell::Cell::get) {
        return u64::from(ns.0);
    }
    if let [t] = page {
        #[allow(clippy::cast_sign_loss)]
        return (u64::from(ns.0) << 32) | u64::from(*t as u32);
    }
    let mut h = rustc_hash::FxHasher::default();
    h.write_u32(ns.0);
    for &t in page {
        h.write_i32(t);
    }
    h.finish()
}

#[cfg(test)]
thread_local! {
    /// Tests only: file every child of a parent under one key per namespace,
    /// to exercise the colliding-siblings path.
    static FORCE_COLLISIONS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Length of the common prefix of `a` and `b`. Galloping: compares windows of
/// 64, 128, 256, ... tokens with one memcmp each, then scans the first window
/// that differs in chunks of 16. O(common prefix).
#[must_use]
pub fn common_prefix(a: &[i32], b: &[i32]) -> usize {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut i = 0;
    let mut w = 64;
    while i < n {
        let e = (i + w).min(n);
        if a[i..e] == b[i..e] {
            i = e;
            w *= 2;
            continue;
        }
        while i + 16 <= e {
            let x: &[i32; 16] = a[i..i + 16].try_into().expect("16 tokens");
            let y: &[i32; 16] = b[i..i + 16].try_into().expect("16 tokens");
            if x != y {
                break;
            }
            i += 16;
        }
        while i < e && a[i] == b[i] {
            i += 1;
        }
        return i;
    }
    n
}

/// Sets the bits of `vals` in `bits` (sized for them), 64 values at a time:
/// a chunk of consecutive values, ascending or descending (the usual case:
/// slots are handed out in runs), becomes one or two word masks; other chunks collect consecutive
/// values of one word in a register and write each word once. Fails, with
/// `Err(i)`, at the first chunk or word-run holding a value already set (or
/// repeated): `vals[..i]` are then marked by this call and nothing else is.
fn mark_all(bits: &mut [u64], vals: &[BlockId]) -> Result<(), usize> {
    for (c, chunk) in vals.chunks(64).enumerate() {
        let start = c * 64;
        let base = chunk[0].0;
        let (up, down) = chunk.iter().zip(0u32..).fold((0u32, 0u32), |(u, d), (v, k)| {
            (u | (v.0 ^ base.wrapping_add(k)), d | (v.0 ^ base.wrapping_sub(k)))
        });
        // An ascending or descending run of consecutive values (allocators
        // hand slots out in runs; stack-based ones in descending order).
        let lo =
            if up == 0 { Some(base) } else { (down == 0).then(|| base.wrapping_sub(chunk.len() as u32 - 1)) };
        if let (Some(lo), true) = (lo, chunk.len() > 1 && (up == 0 || base as usize + 1 >= chunk.len())) {
            // bits [lo, lo + len): at most two words
            let (lo, hi) = (lo as usize, lo as usize + chunk.len());
            let (w0, w1) = (lo / 64, (hi - 1) / 64);
            let m0 = range_mask(lo % 64, if w0 == w1 { (hi - 1) % 64 + 1 } else { 64 });
            let m1 = if w0 == w1 { 0 } else { range_mask(0, (hi - 1) % 64 + 1) };
            if bits[w0] & m0 != 0 || (w1 != w0 && bits[w1] & m1 != 0) {
                return Err(start);
            }
            bits[w0] |= m0;
            if w1 != w0 {
                bits[w1] |= m1;
            }
            continue;
        }
        let mut cur = usize::MAX;
        let mut mask = 0u64;
        let mut run_start = start;
        for (i, v) in chunk.iter().enumerate() {
            let (w, b) = (v.idx() / 64, 1u64 << (v.idx() % 64));
            if w != cur {
                if cur != usize::MAX {
                    if bits[cur] & mask != 0 {
                        return Err(run_start);
                    }
                    bits[cur] |= mask;
                }
                cur = w;
                mask = 0;
                run_start = start + i;
            }
            if mask & b != 0 {
                return Err(run_start);
            }
            mask |= b;
        }
        if bits[cur] & mask != 0 {
            return Err(run_start);
        }
        bits[cur] |= mask;
    }
    Ok(())
}

/// Bits `lo..hi` of a word (`0 <= lo < hi <= 64`).
fn range_mask(lo: usize, hi: usize) -> u64 {
    let upper = if hi == 64 { u64::MAX } else { (1u64 << hi) - 1 };
    upper & !((1u64 << lo) - 1)
}

/// Clears the bits of `vals` (word-run batched like [`mark_all`]). Values
/// beyond the bitmap are ignored.
fn unmark_all(bits: &mut [u64], vals: &[BlockId]) {
    let mut cur = usize::MAX;
    let mut mask = 0u64;
    for v in vals {
        let (w, b) = (v.idx() / 64, 1u64 << (v.idx() % 64));
        if w != cur {
            if let Some(x) = bits.get_mut(cur) {
                *x &= !mask;
            }
            cur = w;
            mask = 0;
        }
        mask |= b;
    }
    if let Some(x) = bits.get_mut(cur) {
        *x &= !mask;
    }
}

#[cold]
fn first_repeat(vals: &[BlockId]) -> Option<BlockId> {
    let mut seen = rustc_hash::FxHashSet::default();
    vals.iter().find(|v| !seen.insert(**v)).copied()
}

/// `a == b` for equal-length value slices, branch-free so it vectorises
/// (derived `PartialEq` on a newtype does not compile to memcmp). O(len).
fn same_values(a: &[BlockId], b: &[BlockId]) -> bool {
    debug_assert_eq!(a.len(), b.len());
    a.iter().zip(b).fold(0u32, |acc, (x, y)| acc | (x.0 ^ y.0)) == 0
}

fn stale(h: NodeHandle) -> KvError {
    KvError::new(
        ErrorKind::StaleHandle,
        format!("node handle {} is stale or unknown (the node was evicted, or the tree was reset)", h.0),
    )
}

impl RadixTree {
    /// An empty tree with `page_size` tokens per page, evicting by `policy`,
    /// buffering KV events if `enable_events`.
    ///
    /// # Errors
    /// `InvalidArgument` if `page_size` is not in `1..=2^20`.
    pub fn new(page_size: usize, policy: Policy, enable_events: bool) -> KvResult<Self> {
        if !(1..=(1 << 20)).contains(&page_size) {
            return Err(KvError::invalid(format!("page_size must be in 1..=2^20, got {page_size}")));
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
            events: enable_events.then(EventBuffer::default),
            path: Vec::new(),
            scratch_bytes: Vec::new(),
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

    /// Whether `v` is one of the tree's values. O(1).
    #[must_use]
    pub fn contains_value(&self, v: BlockId) -> bool {
        let i = v.idx();
        self.in_tree.get(i / 64).is_some_and(|w| w >> (i % 64) & 1 == 1)
    }

    /// The caller-facing handle of a live node. O(1).
    #[must_use]
    pub fn handle(&self, id: NodeId) -> NodeHandle {
        NodeHandle(u64::from(self.nodes[id.idx()].generation) << 32 | u64::from(id.0))
    }

    /// Resolves a handle to a live node. O(1).
    ///
    /// # Errors
    /// `StaleHandle` if the handle names no live node (evicted, reset, never issued).
    pub fn resolve(&self, h: NodeHandle) -> KvResult<NodeId> {
        #[allow(clippy::cast_possible_truncation)]
        let (idx, generation) = (h.0 as u32, (h.0 >> 32) as u32);
        match self.nodes.get(idx as usize) {
            Some(n) if n.live && n.generation == generation => Ok(NodeId(idx)),
            _ => Err(stale(h)),
        }
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
    pub fn path_values(&self, id: NodeId, out: &mut Vec<BlockId>) {
        let start = out.len();
        let mut cur = id;
        while cur != NodeId::ROOT {
            out.extend(self.nodes[cur.idx()].value.iter().rev());
            cur = self.nodes[cur.idx()].parent;
        }
        out[start..].reverse();
    }

    /// Appends every value in the tree to `out` (DFS order). O(nodes + pages).
    pub fn all_values(&self, out: &mut Vec<BlockId>) {
        for n in &self.nodes[1..] {
            if n.live {
                out.extend_from_slice(&n.value);
            }
        }
    }

    /// Finds the child of `node` in namespace `ns` whose edge shares at least
    /// one page with `q` (non-empty, page-aligned); returns it and the
    /// page-aligned common prefix length. O(common prefix).
    fn find_child(&self, node: NodeId, ns: Ns, q: &[i32]) -> Option<(NodeId, usize)> {
        let ps = self.page_size;
        let kids = self.nodes[node.idx()].children.get(&child_key(ns, &q[..ps]))?;
        let try_one = |c: NodeId| {
            let l = common_prefix(&self.nodes[c.idx()].key, q) / ps * ps;
            (l > 0).then_some((c, l))
        };
        match kids {
            Kids::One(c) => try_one(*c),
            Kids::Many(v) => v.iter().find_map(|&c| try_one(c)),
        }
    }

    /// Walks `q` (page-aligned) from the root without changing anything,
    /// recording `(child, matched tokens)` per visited child in `self.path`
    /// (the last may be partial). Returns the hit length. O(hit + depth).
    fn walk(&mut self, q: &[i32], ns: Ns) -> usize {
        let mut path = std::mem::take(&mut self.path);
        path.clear();
        let mut node = NodeId::ROOT;
        let mut pos = 0;
        while pos < q.len() {
            let Some((c, l)) = self.find_child(node, ns, &q[pos..]) else { break };
            path.push((c, l));
            pos += l;
            if l < self.nodes[c.idx()].key.len() {
                break;
            }
            node = c;
        }
        self.path = path;
        pos
    }

    fn aligned<'a>(&self, tokens: &'a [i32]) -> &'a [i32] {
        &tokens[..tokens.len() / self.page_size * self.page_size]
    }

    /// What [`RadixTree::match_prefix`] would hit now, and how many tokens of
    /// currently unlocked nodes locking that match would protect; changes
    /// nothing. O(hit + depth).
    pub fn probe(&mut self, tokens: &[i32], ns: Option<&str>) -> Probe {
        let q = self.aligned(tokens);
        let Some(ns) = self.ns.lookup(ns) else { return Probe { len: 0, lockable: 0 } };
        if q.is_empty() {
            return Probe { len: 0, lockable: 0 };
        }
        let len = self.walk(q, ns);
        let lockable =
            self.path.iter().filter(|(c, _)| self.nodes[c.idx()].lock_ref == 0).map(|&(_, l)| l).sum();
        Probe { len, lockable }
    }

    fn stamp(&mut self, id: NodeId, tick: u64) {
        self.nodes[id.idx()].last_access = tick;
        self.rekey(id);
    }

    /// Longest cached page-aligned prefix of `tokens` in namespace `ns`. The
    /// query is first cut down to a page multiple; a query shorter than one
    /// page hits 0 and touches nothing. Stamps every visited node with a new
    /// tick; a match ending inside an edge splits it there (the tree's
    /// contents and sizes do not change). Appends the matched values to
    /// `out`. O(hit + depth + split edge).
    pub fn match_prefix(&mut self, tokens: &[i32], ns: Option<&str>, out: &mut Vec<BlockId>) -> Match {
        self.match_prefix_with(tokens, ns, |vals| out.extend_from_slice(vals))
    }

    /// [`RadixTree::match_prefix`] handing the matched values to `sink`, one
    /// node's run at a time, root side first (no intermediate buffer).
    pub fn match_prefix_with(
        &mut self,
        tokens: &[i32],
        ns: Option<&str>,
        mut sink: impl FnMut(&[BlockId]),
    ) -> Match {
        let m = self.match_nodes(tokens, ns);
        for vals in m.values() {
            sink(vals);
        }
        m.result()
    }

    /// [`RadixTree::match_prefix`] without copying values: the tree is
    /// stamped and split as there, and the returned view lists the matched
    /// nodes' values (their total is `len / page_size`), so a caller can size
    /// its output before filling it. O(hit + depth + split edge).
    pub fn match_nodes(&mut self, tokens: &[i32], ns: Option<&str>) -> Matched<'_> {
        self.path.clear();
        let q = self.aligned(tokens);
        if q.is_empty() {
            return Matched { tree: self, len: 0, node: NodeId::ROOT };
        }
        self.clock += 1;
        let tick = self.clock;
        self.nodes[0].last_access = tick;
        let Some(ns) = self.ns.lookup(ns) else { return Matched { tree: self, len: 0, node: NodeId::ROOT } };
        let len = self.walk(q, ns);
        let mut node = NodeId::ROOT;
        for i in 0..self.path.len() {
            let (c, l) = self.path[i];
            self.stamp(c, tick);
            node = if l < self.nodes[c.idx()].key.len() { self.split(c, l, tick) } else { c };
            // From here on `path` holds the matched nodes (after any split).
            self.path[i].0 = node;
        }
        Matched { tree: self, len, node }
    }

    /// Splits `c` after its first `l` tokens (a page multiple, `0 < l <
    /// len`): a new upper node takes `key[..l]` and sits between `c`'s parent
    /// and `c`, with `c`'s lock count, hit count and priority; `c` keeps its
    /// id (so handles and locks stay valid) and the rest of its edge.
    /// O(edge length).
    fn split(&mut self, c: NodeId, l: usize, tick: u64) -> NodeId {
        let ps = self.page_size;
        let cn = &mut self.nodes[c.idx()];
        debug_assert!(l > 0 && l < cn.key.len() && l.is_multiple_of(ps));
        let lp = l / ps;
        let upper_key: Vec<i32> = cn.key.drain(..l).collect();
        let upper_value: Vec<BlockId> = cn.value.drain(..lp).collect();
        let upper_hashes: Vec<u64> =
            if cn.hashes.is_empty() { Vec::new() } else { cn.hashes.drain(..lp).collect() };
        let (parent, ns, lock_ref, hit_count, priority) =
            (cn.parent, cn.ns, cn.lock_ref, cn.hit_count, cn.priority);
        let lower_key = child_key(ns, &cn.key[..ps]);
        let u = self.alloc_node();
        let un = &mut self.nodes[u.idx()];
        un.key = upper_key;
        un.value = upper_value;
        un.hashes = upper_hashes;
        un.parent = parent;
        un.ns = ns;
        un.lock_ref = lock_ref;
        un.hit_count = hit_count;
        un.priority = priority;
        un.created = tick;
        un.last_access = tick;
        un.children.insert(lower_key, Kids::One(c));
        let upper_key = child_key(ns, &un.key[..ps]);
        self.nodes[c.idx()].parent = u;
        let kids = self.nodes[parent.idx()]
            .children
            .get_mut(&upper_key)
            .expect("split child is filed under its first page");
        match kids {
            Kids::One(x) => {
                assert_eq!(*x, c, "parent files another node under the split child's key");
                *x = u;
            }
            Kids::Many(v) => {
                let slot = v.iter_mut().find(|x| **x == c).expect("split child listed under its key");
                *slot = u;
            }
        }
        u
    }

    fn alloc_node(&mut self) -> NodeId {
        self.num_nodes += 1;
        let seq = self.next_seq;
        self.next_seq += 1;
        if let Some(i) = self.free_nodes.pop() {
            let n = &mut self.nodes[i as usize];
            debug_assert!(!n.live);
            n.live = true;
            n.seq = seq;
            return NodeId(i);
        }
        let id = NodeId(u32::try_from(self.nodes.len()).expect("fewer than 2^32 nodes"));
        let mut n = Node::empty(0);
        n.live = true;
        n.seq = seq;
        self.nodes.push(n);
        id
    }

    /// Returns a removed node's arena slot: clears it and bumps its generation.
    fn release_node(&mut self, id: NodeId) {
        let n = &mut self.nodes[id.idx()];
        let generation = n.generation.wrapping_add(1);
        *n = Node::empty(generation);
        self.free_nodes.push(id.0);
        self.num_nodes -= 1;
    }

    /// Inserts `tokens` (a multiple of the page size) with `values` (one per
    /// page) in namespace `ns`. Returns the number of leading tokens that were
    /// already present; the caller's values for that prefix that differ from
    /// the tree's are appended to `to_free` (the caller releases exactly
    /// those). `extra` are further caller values that will not be stored (an
    /// unaligned tail page): they are validated like the others and are the
    /// caller's to free. Every visited node's priority becomes
    /// `max(its, priority)`. Inserting a strict prefix of an edge splits it;
    /// re-inserting a present sequence creates nothing.
    /// O(tokens + prefix pages + new pages + depth).
    ///
    /// # Errors
    /// `InvalidArgument`, with nothing changed, if `tokens` is not
    /// page-aligned, `values` has the wrong length, or a value that would be
    /// stored or handed back is already in the tree (elsewhere) or appears
    /// twice.
    pub fn insert(
        &mut self,
        tokens: &[i32],
        values: &[BlockId],
        ns: Option<&str>,
        priority: i64,
        extra: &[BlockId],
        to_free: &mut Vec<BlockId>,
    ) -> KvResult<usize> {
        let ps = self.page_size;
        if !tokens.len().is_multiple_of(ps) {
            return Err(KvError::invalid(format!(
                "tokens ({}) must be a multiple of page_size ({ps})",
                tokens.len()
            )));
        }
        if values.len() != tokens.len() / ps {
            return Err(KvError::invalid(format!(
                "expected {} values (one per page), got {}",
                tokens.len() / ps,
                values.len()
            )));
        }
        if tokens.is_empty() {
            self.check_values([&[], &[], extra])?;
            return Ok(0);
        }
        let ns_id = self.ns.lookup(ns);
        let prefix = match ns_id {
            Some(id) => self.walk(tokens, id),
            None => {
                self.path.clear();
                0
            }
        };
        // The caller's prefix values that differ from the tree's are
        // duplicates (usually none: the caller passes what it matched).
        let pp = prefix / ps;
        let dup_start = to_free.len();
        let mut off = 0;
        for &(c, l) in &self.path {
            let tree_vals = &self.nodes[c.idx()].value[..l / ps];
            let mine = &values[off..off + l / ps];
            if !same_values(mine, tree_vals) {
                to_free.extend(mine.iter().zip(tree_vals).filter(|(v, t)| v != t).map(|(v, _)| *v));
            }
            off += l / ps;
        }
        debug_assert_eq!(off, pp);
        if let Err(e) = self.check_values([&to_free[dup_start..], &values[pp..], extra]) {
            to_free.truncate(dup_start);
            return Err(e);
        }
        // Validated: now mutate.
        let ns = ns_id.unwrap_or_else(|| self.ns.intern(ns));
        self.clock += 1;
        let tick = self.clock;
        let root = &mut self.nodes[0];
        root.last_access = tick;
        root.priority = root.priority.max(priority);
        let mut node = NodeId::ROOT;
        for i in 0..self.path.len() {
            let (c, l) = self.path[i];
            self.nodes[c.idx()].last_access = tick;
            node = if l < self.nodes[c.idx()].key.len() { self.split(c, l, tick) } else { c };
            let n = &mut self.nodes[node.idx()];
            n.priority = n.priority.max(priority);
            n.hit_count += 1;
            self.rekey(c);
            self.rekey(node);
        }
        if prefix < tokens.len() {
            self.add_leaf(node, ns, &tokens[prefix..], &values[pp..], priority, tick);
        }
        Ok(prefix)
    }

    /// Checks that the values of `lists` (duplicates to hand back, values to
    /// store, values the caller keeps) are pairwise distinct and none is in
    /// the tree, using the value bitmap as scratch. On success the values to
    /// store (`lists[1]`) are left marked (they are about to enter the tree);
    /// on error the bitmap is as it was. O(values).
    fn check_values(&mut self, lists: [&[BlockId]; 3]) -> KvResult<()> {
        let words_before = self.in_tree.len();
        let max = lists.iter().filter_map(|l| l.iter().map(|v| v.0).max()).max();
        if let Some(m) = max {
            let words = m as usize / 64 + 1;
            if words > self.in_tree.len() {
                self.in_tree.resize(words, 0);
            }
        }
        let bits = &mut self.in_tree;
        for (li, l) in lists.iter().enumerate() {
            if let Err(vi) = mark_all(bits, l) {
                // Name the culprit, then undo exactly what this call marked:
                // lists before `li`, and the runs of `l` flushed before it.
                let v = l[vi..].iter().find(|v| bits[v.idx() / 64] >> (v.idx() % 64) & 1 == 1).copied();
                let v = v.or_else(|| first_repeat(&l[vi..])).unwrap_or(l[vi]);
                for done in &lists[..li] {
                    unmark_all(bits, done);
                }
                unmark_all(bits, &l[..vi]);
                // A refused call leaves no trace, not even a grown bitmap.
                bits.truncate(words_before);
                bits.shrink_to(words_before);
                return Err(KvError::invalid(format!(
                    "value {} is already in the tree or passed twice (a slot/page may be stored once)",
                    v.0
                )));
            }
        }
        unmark_all(bits, lists[0]);
        unmark_all(bits, lists[2]);
        Ok(())
    }

    fn ns_seed(&self, ns: Ns) -> u64 {
        match self.ns.name(ns) {
            None => xxh3_64(b"kvindex-radix\x00"),
            Some(s) => {
                let mut b = b"kvindex-radix\x01".to_vec();
                b.extend_from_slice(s.as_bytes());
                xxh3_64(&b)
            }
        }
    }

    /// Chained page hashes of `key` starting from `seed` (module docs).
    fn page_hashes(&mut self, key: &[i32], mut seed: u64) -> Vec<u64> {
        let mut out = Vec::with_capacity(key.len() / self.page_size);
        let buf = &mut self.scratch_bytes;
        for page in key.chunks_exact(self.page_size) {
            buf.clear();
            buf.extend(page.iter().flat_map(|t| t.to_le_bytes()));
            seed = xxh3_64_with_seed(buf, seed);
            out.push(seed);
        }
        out
    }

    fn parent_hash(&self, parent: NodeId, ns: Ns) -> (u64, Option<u64>) {
        if parent == NodeId::ROOT {
            (self.ns_seed(ns), None)
        } else {
            let h = *self.nodes[parent.idx()].hashes.last().expect("events on: every node has page hashes");
            (h, Some(h))
        }
    }

    fn add_leaf(&mut self, parent: NodeId, ns: Ns, key: &[i32], value: &[BlockId], priority: i64, tick: u64) {
        let leaf = self.alloc_node();
        let hashes = if self.events.is_some() {
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
            self.events.as_mut().expect("events on").push(ev);
            hashes
        } else {
            Vec::new()
        };
        debug_assert!(value.iter().all(|&v| self.contains_value(v)), "check_values marked the stored values");
        let n = &mut self.nodes[leaf.idx()];
        n.key = key.to_vec();
        n.value = value.to_vec();
        n.hashes = hashes;
        n.parent = parent;
        n.ns = ns;
        n.priority = priority;
        n.hit_count = 1;
        n.created = tick;
        n.last_access = tick;
        let k = child_key(ns, &key[..self.page_size]);
        let kids = &mut self.nodes[parent.idx()].children;
        match kids.get_mut(&k) {
            None => {
                kids.insert(k, Kids::One(leaf));
            }
            Some(Kids::One(x)) => {
                let x = *x;
                kids.insert(k, Kids::Many(vec![x, leaf]));
            }
            Some(Kids::Many(v)) => v.push(leaf),
        }
        if parent == NodeId::ROOT {
            self.ns.add_root_child(ns);
        }
        self.evictable_size += key.len();
        self.update_leaf_status(parent);
        self.update_leaf_status(leaf);
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
    }

    /// Releases a lock taken on `id` by [`RadixTree::lock`]; the reverse
    /// walk. Unlocking the root is a no-op. O(depth + log L).
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
        let mut cur = id;
        while cur != NodeId::ROOT {
            let n = &mut self.nodes[cur.idx()];
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
    pub fn reset(&mut self, freed: &mut Vec<BlockId>) {
        self.all_values(freed);
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
        if let Some(ev) = &mut self.events {
            ev.push(KvEvent::AllBlocksCleared);
        }
    }

    /// Whether events are buffered.
    #[must_use]
    pub fn events_enabled(&self) -> bool {
        self.events.is_some()
    }

    /// Bounds the event buffer (drop-oldest; see [`EventBuffer`]).
    ///
    /// # Errors
    /// `InvalidArgument` for 0.
    pub fn set_max_events(&mut self, max_events: usize) -> KvResult<()> {
        event_buffer::set_max_events(&mut self.events, max_events)
    }

    /// Events dropped from the full buffer since the last
    /// [`Self::take_events_dropped`].
    #[must_use]
    pub fn events_dropped(&self) -> u64 {
        event_buffer::events_dropped(self.events.as_ref())
    }

    /// Returns [`Self::events_dropped`] and zeroes it.
    pub fn take_events_dropped(&mut self) -> u64 {
        event_buffer::take_events_dropped(self.events.as_mut())
    }

    /// Drains buffered KV events (empty when disabled). O(events).
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        self.events.as_mut().map(EventBuffer::take).unwrap_or_default()
    }

    /// A human-readable dump: one line per node, depth-first, children in
    /// `(namespace, first token, id)` order. O(nodes log nodes).
    #[must_use]
    pub fn dump(&self) -> String {
        let mut s = format!(
            "RadixTree(page_size={}, policy={}, nodes={}, total={}, evictable={}, protected={}, clock={})\n",
            self.page_size,
            self.policy.name(),
            self.num_nodes,
            self.total_size(),
            self.evictable_size,
            self.protected_size,
            self.clock
        );
        let mut stack = vec![(NodeId::ROOT, 0usize)];
        while let Some((id, depth)) = stack.pop() {
            let n = &self.nodes[id.idx()];
            if id == NodeId::ROOT {
                s.push_str("root r=1\n");
            } else {
                let head: Vec<String> = n.key.iter().take(10).map(i32::to_string).collect();
                let more = if n.key.len() > 10 { " ..." } else { "" };
                let ns = self.ns.name(n.ns).map(|x| format!(" ns={x:?}")).unwrap_or_default();
                let _ = writeln!(
                    s,
                    "{:indent$}#{} len={}{ns} [{}{more}] r={} own={} t={} c={} hits={} prio={}",
                    "",
                    self.handle(id).0,
                    n.key.len(),
                    head.join(" "),
                    n.lock_ref,
                    n.own_locks,
                    n.last_access,
                    n.created,
                    n.hit_count,
                    n.priority,
                    indent = 2 * depth
                );
            }
            let mut kids = self.children_of(id);
            kids.sort_by_key(|&c| (self.nodes[c.idx()].ns, self.nodes[c.idx()].key.first().copied(), c));
            stack.extend(kids.into_iter().rev().map(|c| (c, depth + 1)));
        }
        s
    }

    fn children_of(&self, id: NodeId) -> Vec<NodeId> {
        let mut out = Vec::new();
        for k in self.nodes[id.idx()].children.values() {
            match k {
                Kids::One(c) => out.push(*c),
                Kids::Many(v) => out.extend_from_slice(v),
            }
        }
        out
    }

    /// Every cached sequence: the token path of each leaf with its namespace.
    /// For tests and debugging. O(total tokens × depth).
    #[must_use]
    pub fn sequences(&self) -> Vec<(Option<String>, Vec<i32>)> {
        let mut out = Vec::new();
        for (i, n) in self.nodes.iter().enumerate().skip(1) {
            if n.live && n.children.is_empty() {
                let mut toks = Vec::new();
                #[allow(clippy::cast_possible_truncation)]
                let mut cur = NodeId(i as u32);
                while cur != NodeId::ROOT {
                    toks.extend(self.nodes[cur.idx()].key.iter().rev());
                    cur = self.nodes[cur.idx()].parent;
                }
                toks.reverse();
                out.push((self.ns.name(n.ns).map(str::to_owned), toks));
            }
        }
        out.sort();
        out
    }
}
