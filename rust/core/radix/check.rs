//! [`RadixTree::check_invariants`]: invariants 1-7 of the module header,
//! plus arena, namespace, clock and page-hash bookkeeping.
//!
//! Costs: a full walk, O(nodes + pages), for tests and `check_invariants`.

use rustc_hash::{FxHashMap, FxHashSet};

use crate::core::error::InvariantViolation;
use crate::core::ids::PageId;
use crate::ensure_inv;

use super::{child_key, common_prefix, Kids, NodeId, Ns, RadixTree};

impl RadixTree {
    /// Checks every structural invariant. O(nodes + tokens).
    ///
    /// # Errors
    /// The first violation found.
    #[allow(clippy::too_many_lines)]
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        let ps = self.page_size;
        let root = &self.nodes[0];
        // 1. root
        ensure_inv!(root.live && root.generation == 0, "root is not live with generation 0");
        ensure_inv!(root.key.is_empty() && root.value.is_empty(), "root has a key or value");
        ensure_inv!(
            root.lock_ref == 1 && root.own_locks == 0,
            "root lock_ref {} (must stay 1)",
            root.lock_ref
        );
        ensure_inv!(root.evict_key.is_none(), "root is in the evictable set");
        ensure_inv!(root.owed_hits == 0 && root.owed_tick == 0, "root owes counts (it keeps none)");
        // Reachability from the root, with parent links and child keys (3).
        let mut seen = vec![false; self.nodes.len()];
        seen[0] = true;
        let mut stack = vec![NodeId::ROOT];
        let mut reached = 0usize;
        let mut root_kids: FxHashMap<Ns, u32> = FxHashMap::default();
        while let Some(id) = stack.pop() {
            let n = &self.nodes[id.idx()];
            let mut child_locks = 0u32;
            // An only child: as if filed under its own key (checked below).
            let only = if n.only == NodeId::ROOT {
                None
            } else {
                ensure_inv!(id != NodeId::ROOT, "the root holds an only child");
                ensure_inv!(n.children.is_empty(), "node {}: an only child and a child map", id.0);
                ensure_inv!(n.only.idx() < self.nodes.len(), "node {}: only child out of the arena", id.0);
                let cn = &self.nodes[n.only.idx()];
                ensure_inv!(cn.key.len() >= ps, "node {}: only child with a short key", id.0);
                Some((child_key(cn.ns, &cn.key[..ps]), Kids::One(n.only)))
            };
            for (k, kids) in n.children.iter().map(|(&k, v)| (k, v)).chain(only.iter().map(|(k, v)| (*k, v)))
            {
                let list: &[NodeId] = match kids {
                    Kids::One(c) => std::slice::from_ref(c),
                    Kids::Many(v) => {
                        ensure_inv!(
                            v.len() >= 2,
                            "node {}: multi-child entry with {} children",
                            id.0,
                            v.len()
                        );
                        v
                    }
                };
                // Children under one key (a page-hash collision) must still
                // differ in their first page.
                let mut firsts: Vec<&[i32]> = Vec::new();
                for &c in list {
                    ensure_inv!(c.idx() < self.nodes.len(), "node {}: child {} out of the arena", id.0, c.0);
                    let cn = &self.nodes[c.idx()];
                    ensure_inv!(cn.live, "node {}: child {} is not live", id.0, c.0);
                    ensure_inv!(!seen[c.idx()], "node {} reached twice", c.0);
                    seen[c.idx()] = true;
                    reached += 1;
                    ensure_inv!(
                        cn.parent == id,
                        "node {}: parent link {} but filed under {}",
                        c.0,
                        cn.parent.0,
                        id.0
                    );
                    ensure_inv!(!cn.key.is_empty(), "node {} has an empty key", c.0);
                    ensure_inv!(
                        cn.key.len() >= ps && k == child_key(cn.ns, &cn.key[..ps]),
                        "node {} filed under a key that is not (its namespace, its first page)",
                        c.0
                    );
                    if id == NodeId::ROOT {
                        *root_kids.entry(cn.ns).or_default() += 1;
                    } else {
                        ensure_inv!(cn.ns == n.ns, "node {}: namespace differs from its parent's", c.0);
                    }
                    let first = &cn.key[..ps.min(cn.key.len())];
                    ensure_inv!(
                        firsts.iter().all(|f| common_prefix(f, first) < ps),
                        "node {}: two children share a first page",
                        id.0
                    );
                    firsts.push(first);
                    child_locks += cn.lock_ref;
                    stack.push(c);
                }
            }
            if id != NodeId::ROOT {
                // 4. lock counts
                ensure_inv!(
                    n.lock_ref == n.own_locks + child_locks,
                    "node {}: lock_ref {} != own {} + children {}",
                    id.0,
                    n.lock_ref,
                    n.own_locks,
                    child_locks
                );
            }
        }
        ensure_inv!(reached == self.num_nodes, "{reached} nodes reachable, {} counted live", self.num_nodes);
        let mut evictable = 0usize;
        let mut protected = 0usize;
        let mut leaves = 0usize;
        let mut values: FxHashSet<PageId> = FxHashSet::default();
        let mut free_slots = 0usize;
        for (i, n) in self.nodes.iter().enumerate().skip(1) {
            #[allow(clippy::cast_possible_truncation)]
            let id = NodeId(i as u32);
            if !n.live {
                free_slots += 1;
                ensure_inv!(n.evict_key.is_none() && n.key.is_empty(), "free arena slot {i} holds data");
                continue;
            }
            ensure_inv!(seen[i], "live node {i} is unreachable");
            // 2. edge shape
            ensure_inv!(
                n.key.len().is_multiple_of(ps),
                "node {i}: key length {} not a multiple of {ps}",
                n.key.len()
            );
            ensure_inv!(
                n.value.len() * ps == n.key.len(),
                "node {i}: {} values for {} tokens",
                n.value.len(),
                n.key.len()
            );
            ensure_inv!(
                n.last_access <= self.clock && n.created <= self.clock && n.owed_tick <= self.clock,
                "node {i}: time beyond the clock"
            );
            // owed counts wait only on locked paths (an unlock settles them)
            ensure_inv!(
                n.lock_ref > 0 || (n.owed_hits == 0 && n.owed_tick == 0),
                "node {i}: unlocked but owes hits {} / stamp {}",
                n.owed_hits,
                n.owed_tick
            );
            // 5. sizes
            if n.lock_ref == 0 {
                evictable += n.key.len();
            } else {
                protected += n.key.len();
            }
            // 6. evictable set membership and keys
            let want = n.lock_ref == 0 && !n.has_children();
            ensure_inv!(
                want == n.evict_key.is_some(),
                "node {i}: evictable={} but in set={}",
                want,
                n.evict_key.is_some()
            );
            if let Some(k) = n.evict_key {
                leaves += 1;
                ensure_inv!(k == self.evict_key(id), "node {i}: stale eviction key");
                ensure_inv!(self.evictable.contains(&(k, id)), "node {i}: key not in the evictable set");
            }
            // 7. values unique and mirrored in the bitmap
            for &v in &n.value {
                ensure_inv!(values.insert(v), "value {} appears twice in the tree", v.0);
                ensure_inv!(self.contains_value(v), "value {} in the tree but not in the bitmap", v.0);
            }
            if self.events.enabled() {
                ensure_inv!(
                    n.hashes.len() == n.value.len(),
                    "node {i}: {} page hashes for {} pages",
                    n.hashes.len(),
                    n.value.len()
                );
            }
        }
        ensure_inv!(
            free_slots == self.free_nodes.len(),
            "{free_slots} free arena slots, {} listed",
            self.free_nodes.len()
        );
        ensure_inv!(
            evictable == self.evictable_size,
            "evictable_size {} but unlocked nodes hold {evictable}",
            self.evictable_size
        );
        ensure_inv!(
            protected == self.protected_size,
            "protected_size {} but locked nodes hold {protected}",
            self.protected_size
        );
        ensure_inv!(
            leaves == self.evictable.len(),
            "evictable set has {} entries, {leaves} nodes qualify",
            self.evictable.len()
        );
        let bits: usize = self.in_tree.iter().map(|w| w.count_ones() as usize).sum();
        ensure_inv!(bits == values.len(), "bitmap has {bits} values, the tree {}", values.len());
        // Namespaces: ids live iff the root has children in them.
        for (i, &r) in self.ns.roots.iter().enumerate() {
            #[allow(clippy::cast_possible_truncation)]
            let ns = Ns(i as u32);
            let actual = root_kids.get(&ns).copied().unwrap_or(0);
            ensure_inv!(r == actual, "namespace {i}: counted {r} root children, found {actual}");
            if i > 0 {
                ensure_inv!(
                    (r > 0) == self.ns.names[i].is_some(),
                    "namespace {i}: live={} with {r} root children",
                    self.ns.names[i].is_some()
                );
            }
        }
        ensure_inv!(
            self.ns.ids.len() + 1 + self.ns.free.len() == self.ns.names.len(),
            "namespace table sizes disagree"
        );
        // Page hashes chain (events on).
        if self.events.enabled() {
            let mut bytes = Vec::new();
            for (i, n) in self.nodes.iter().enumerate().skip(1) {
                if !n.live {
                    continue;
                }
                let mut h = if n.parent == NodeId::ROOT {
                    self.ns_seed(n.ns)
                } else {
                    *self.nodes[n.parent.idx()].hashes.last().expect("parent has page hashes")
                };
                for (page, &got) in n.key.chunks_exact(ps).zip(&n.hashes) {
                    bytes.clear();
                    bytes.extend(page.iter().flat_map(|t| t.to_le_bytes()));
                    h = xxhash_rust::xxh3::xxh3_64_with_seed(&bytes, h);
                    ensure_inv!(h == got, "node {i}: page hash does not follow the chain");
                }
            }
        }
        self.hy_check()
    }
}
