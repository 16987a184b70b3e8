//! Eviction: policies and the incrementally maintained evictable-leaf set.
//!
//! The set is a `BTreeSet<(EvictKey, NodeId)>` holding exactly the unlocked
//! childless non-root nodes; a node remembers its key so it can be removed or
//! re-keyed when its recency, hit count or priority changes. The smallest
//! entry is evicted first. Ties are rare (one tick stamps one root path; the
//! only siblings stamped together are the lower half of an edge an insert
//! split and the leaf that insert adds) and go to the node created first
//! (a creation sequence number, never reused), so the order is deterministic.
//!
//! | policy | key (smaller evicts first; SGLang `evict_policy.py`) |
//! |---|---|
//! | `lru` (default) | `last_access` |
//! | `lfu` | `(hit_count, last_access)` |
//! | `fifo` | `created` |
//! | `mru` | `-last_access` |
//! | `filo` | `-created` |
//! | `priority` | `(priority, last_access)`; priority = max over inserts along the path |
//! | `slru` | `(hit_count >= threshold, last_access)`: probationary before protected |
//!
//! Costs: set membership changes are O(log L) (L = evictable leaves); one
//! eviction is O(log L + pages of the leaf); no per-call rebuild.
//!
//! Invariant: the set holds exactly the unlocked childless non-root nodes,
//! each under its current key (invariant 6 of [`crate::core::radix`],
//! checked by `check_invariants`).

use crate::core::error::{KvError, KvResult};
use crate::core::events::KvEvent;
use crate::core::ids::PageId;

use super::{child_key, Kids, Node, NodeId, RadixTree};

/// An eviction policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Least recently used first.
    Lru,
    /// Fewest inserts through the node first, then least recently used.
    Lfu,
    /// Earliest created first.
    Fifo,
    /// Most recently used first.
    Mru,
    /// Latest created first.
    Filo,
    /// Lowest priority first, then least recently used.
    Priority,
    /// Segmented LRU: nodes with fewer than `threshold` hits first, LRU within.
    Slru {
        /// Hit count from which a node is "protected" (SGLang default 2).
        threshold: u64,
    },
}

/// A node's position in the eviction order: the policy's two words, then the
/// node's creation sequence number, compared lexicographically.
pub type EvictKey = (u64, u64, u64);

/// The policy names [`Policy::parse`] accepts.
pub const POLICY_NAMES: [&str; 7] = ["lru", "lfu", "fifo", "mru", "filo", "priority", "slru"];

impl Policy {
    /// Parses a policy name; `slru_threshold` is used by `slru`.
    ///
    /// # Errors
    /// `InvalidArgument` for an unknown name.
    pub fn parse(name: &str, slru_threshold: u64) -> KvResult<Policy> {
        Ok(match name {
            "lru" => Policy::Lru,
            "lfu" => Policy::Lfu,
            "fifo" => Policy::Fifo,
            "mru" => Policy::Mru,
            "filo" => Policy::Filo,
            "priority" => Policy::Priority,
            "slru" => Policy::Slru { threshold: slru_threshold },
            _ => {
                return Err(KvError::invalid(format!(
                    "unknown eviction policy {name:?}; expected one of {}",
                    POLICY_NAMES.join(", ")
                )))
            }
        })
    }

    /// The policy's name.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Policy::Lru => "lru",
            Policy::Lfu => "lfu",
            Policy::Fifo => "fifo",
            Policy::Mru => "mru",
            Policy::Filo => "filo",
            Policy::Priority => "priority",
            Policy::Slru { .. } => "slru",
        }
    }

    /// The key of a node whose stored counts are its true ones (an unlocked
    /// node owes nothing: see the recency section of the module header).
    fn key(self, n: &Node) -> EvictKey {
        self.key_with(n, n.hit_count, n.last_access)
    }

    /// The key of `n` with hit count `hits` and last access `last`.
    fn key_with(self, n: &Node, hits: u64, last: u64) -> EvictKey {
        let (a, b) = match self {
            Policy::Lru => (last, 0),
            Policy::Lfu => (hits, last),
            Policy::Fifo => (n.created, 0),
            Policy::Mru => (u64::MAX - last, 0),
            Policy::Filo => (u64::MAX - n.created, 0),
            #[allow(clippy::cast_sign_loss)]
            Policy::Priority => ((n.priority as u64) ^ (1 << 63), last),
            Policy::Slru { threshold } => (u64::from(hits >= threshold), last),
        };
        (a, b, n.seq)
    }
}

impl RadixTree {
    /// Whether `id` belongs in the evictable set: an unlocked childless
    /// live non-root node. O(1).
    fn wants_evictable(&self, id: NodeId) -> bool {
        let n = &self.nodes[id.idx()];
        id != NodeId::ROOT && n.live && n.lock_ref == 0 && !n.has_children()
    }

    /// Puts `id` in the evictable set iff it is an unlocked childless
    /// non-root node, and takes it out otherwise. O(log L).
    pub(super) fn update_leaf_status(&mut self, id: NodeId) {
        let want = self.wants_evictable(id);
        let n = &self.nodes[id.idx()];
        match (want, n.evict_key) {
            (true, None) => {
                let k = self.policy.key(n);
                self.nodes[id.idx()].evict_key = Some(k);
                self.evictable.insert((k, id));
            }
            (false, Some(k)) => {
                self.nodes[id.idx()].evict_key = None;
                self.evictable.remove(&(k, id));
            }
            _ => {}
        }
    }

    /// Re-files `id` under its current key if it is in the evictable set. O(log L).
    pub(super) fn rekey(&mut self, id: NodeId) {
        let n = &self.nodes[id.idx()];
        if let Some(old) = n.evict_key {
            let k = self.policy.key(n);
            if k != old {
                self.evictable.remove(&(old, id));
                self.evictable.insert((k, id));
                self.nodes[id.idx()].evict_key = Some(k);
            }
        }
    }

    /// The policy key of a live node (its hit count and recency including
    /// what extensions below still owe it). O(1) for an unlocked node,
    /// O(subtree) for a locked one.
    #[must_use]
    pub fn evict_key(&self, id: NodeId) -> EvictKey {
        let (hits, last) = self.settled(id);
        self.policy.key_with(&self.nodes[id.idx()], hits, last)
    }

    /// `(hit_count, last_access)` of a live node as the per-node walk would
    /// have left them: the stored ones plus what extensions in its subtree
    /// still owe (nothing when it is unlocked or the root). O(1) for an
    /// unlocked node, O(subtree) for a locked one.
    pub(super) fn settled(&self, id: NodeId) -> (u64, u64) {
        let n = &self.nodes[id.idx()];
        let (mut hits, mut last) = (n.hit_count, n.last_access);
        if id == NodeId::ROOT || n.lock_ref == 0 {
            return (hits, last);
        }
        let mut stack = vec![id];
        while let Some(x) = stack.pop() {
            let m = &self.nodes[x.idx()];
            hits += m.owed_hits;
            last = last.max(m.owed_tick);
            if m.only != NodeId::ROOT {
                stack.push(m.only);
            }
            for k in m.children.values() {
                match k {
                    Kids::One(c) => stack.push(*c),
                    Kids::Many(v) => stack.extend_from_slice(v),
                }
            }
        }
        (hits, last)
    }

    /// [`Self::settled`] of every arena slot (free and root slots: their
    /// stored values). O(arena + owing nodes × depth).
    pub(super) fn settled_all(&self) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = self.nodes.iter().map(|n| (n.hit_count, n.last_access)).collect();
        for (i, n) in self.nodes.iter().enumerate().skip(1) {
            if !n.live || (n.owed_hits == 0 && n.owed_tick == 0) {
                continue;
            }
            #[allow(clippy::cast_possible_truncation)]
            let mut cur = NodeId(i as u32);
            while cur != NodeId::ROOT {
                let o = &mut out[cur.idx()];
                o.0 += n.owed_hits;
                o.1 = o.1.max(n.owed_tick);
                cur = self.nodes[cur.idx()].parent;
            }
        }
        out
    }

    /// Evicts whole unlocked leaves, lowest key first, until at least
    /// `num_tokens` tokens are freed or nothing is evictable; a parent that
    /// becomes an unlocked leaf joins the order in the same call (cascade).
    /// May free more than asked (whole leaves). Appends the freed values to
    /// `freed` (the caller releases them) and returns the tokens freed.
    /// Never touches a locked node or an ancestor of one; never leaves an
    /// unreachable node. O(log L + pages) per removed node.
    ///
    /// The cascade parent is held aside rather than filed: it is evicted
    /// next, without entering the set, when its key is below the set's
    /// smallest (a request's leaf that a window split or a later branch
    /// divided goes in one pass), and filed otherwise (or when the call
    /// ends). The order is the one filing it first would give (keys are
    /// unique: they end in the creation sequence number).
    pub fn evict(&mut self, num_tokens: usize, freed: &mut Vec<PageId>) -> usize {
        let mut done = 0;
        let mut held: Option<(EvictKey, NodeId)> = None;
        while done < num_tokens {
            let next = match held.take() {
                Some(h) if self.evictable.first().is_none_or(|f| h < *f) => h,
                Some(h) => {
                    self.file_evictable(h);
                    match self.evictable.pop_first() {
                        Some(f) => f,
                        None => break,
                    }
                }
                None => match self.evictable.pop_first() {
                    Some(f) => f,
                    None => break,
                },
            };
            let x = next.1;
            self.nodes[x.idx()].evict_key = None;
            let (n, parent) = self.delete_leaf(x, freed);
            done += n;
            if self.wants_evictable(parent) && self.nodes[parent.idx()].evict_key.is_none() {
                held = Some((self.policy.key(&self.nodes[parent.idx()]), parent));
            }
        }
        if let Some(h) = held {
            self.file_evictable(h);
        }
        done
    }

    /// Files `id` in the evictable set under `k` (its current key; it is an
    /// unlocked leaf not in the set). O(log L).
    fn file_evictable(&mut self, (k, id): (EvictKey, NodeId)) {
        debug_assert!(
            self.nodes[id.idx()].evict_key.is_none() && k == self.policy.key(&self.nodes[id.idx()])
        );
        self.nodes[id.idx()].evict_key = Some(k);
        self.evictable.insert((k, id));
    }

    /// Deletes the evictable leaf `x` (with its components): its values go
    /// to `freed`, a `BlockRemoved` is recorded, the parent may become an
    /// evictable leaf. Returns its tokens. O(log L + pages).
    pub(super) fn remove_leaf(&mut self, x: NodeId, freed: &mut Vec<PageId>) -> usize {
        let k = self.nodes[x.idx()].evict_key.take().expect("an evictable leaf");
        self.evictable.remove(&(k, x));
        let (n, parent) = self.delete_leaf(x, freed);
        self.update_leaf_status(parent);
        n
    }

    /// Deletes the leaf `x`, already out of the evictable set (its
    /// `evict_key` cleared), with its components: its values go to `freed`,
    /// a `BlockRemoved` is recorded. The caller files the parent if it
    /// became an evictable leaf. Returns its tokens and its parent.
    /// O(pages).
    fn delete_leaf(&mut self, x: NodeId, freed: &mut Vec<PageId>) -> (usize, NodeId) {
        if self.hy.is_some() {
            self.hy_remove(x);
        }
        let n = &mut self.nodes[x.idx()];
        let (key, value, hashes) =
            (std::mem::take(&mut n.key), std::mem::take(&mut n.value), std::mem::take(&mut n.hashes));
        let (parent, ns) = (n.parent, n.ns);
        freed.extend_from_slice(&value);
        super::unmark_all(&mut self.in_tree, &value);
        self.events.record(|| KvEvent::BlockRemoved { block_hashes: hashes });
        if self.nodes[parent.idx()].only == x {
            self.nodes[parent.idx()].only = NodeId::ROOT;
        } else {
            let ck = child_key(ns, &key[..self.page_size]);
            let kids = &mut self.nodes[parent.idx()].children;
            let remove_entry = match kids.get_mut(&ck).expect("evicted leaf is filed under its key") {
                Kids::One(c) => {
                    assert_eq!(*c, x, "parent files another node under the evicted leaf's key");
                    true
                }
                Kids::Many(v) => {
                    let pos = v.iter().position(|&c| c == x).expect("evicted leaf listed under its key");
                    v.remove(pos);
                    if v.len() == 1 {
                        let last = v[0];
                        kids.insert(ck, Kids::One(last));
                    }
                    false
                }
            };
            if remove_entry {
                kids.remove(&ck);
            }
        }
        if parent == NodeId::ROOT {
            self.ns.remove_root_child(ns);
        }
        self.evictable_size -= key.len();
        self.release_node(x);
        (key.len(), parent)
    }
}
