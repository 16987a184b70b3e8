//! The node arena: tree nodes in a `Vec`, addressed by [`NodeId`], with
//! freed slots reused and a per-slot generation behind [`NodeHandle`]s.
//!
//! # Invariants
//! - slot 0 is the root, live forever, generation 0;
//! - a slot is in `free_nodes` iff its node is not live; a freed slot is
//!   reset to an empty node and its generation bumped, so every handle
//!   issued for the old node resolves as stale (until the slot has been
//!   reused 2^32 times);
//! - `num_nodes` counts live non-root nodes;
//! - a child is filed in its parent's map under [`child_key`] of its
//!   namespace and first page; siblings with one key share a [`Kids::Many`];
//!   except that a non-root node's first child is held in `only` (the map
//!   empty) until a second one arrives (both then go to the map);
//! - a node's `owed_hits` / `owed_tick` are zero unless it is locked
//!   (`lock_ref > 0`): the hit counts and stamps a request's page-by-page
//!   extension owes to its path wait there until that lock is released
//!   (see the recency section of the module header).
//!
//! # Costs
//! Allocating and releasing a node: O(1) (amortised; released nodes keep
//! no heap memory). Resolving a handle: O(1). Memory: one 64-byte-aligned
//! [`Node`] (256 bytes, four cache lines) per live or free slot.

use std::hash::Hasher as _;

use rustc_hash::FxHashMap;

use super::{EvictKey, NodeHandle, NodeId, Ns, RadixTree};
use crate::core::error::{ErrorKind, KvError, KvResult};
use crate::core::ids::PageId;

/// Children sharing one map key: with `page_size > 1` two first pages may
/// hash alike (they are told apart by comparing the page).
#[derive(Clone, Debug)]
pub(super) enum Kids {
    One(NodeId),
    Many(Vec<NodeId>),
}

/// A tree node. Laid out by hand, cache-line aligned, so that a walk touches
/// one line per node (the edge's tokens and the child map, plus the recency
/// stamp) and reading the matched values one more (values, eviction entry,
/// lock count); the rest is cold bookkeeping.
#[derive(Clone, Debug)]
#[repr(C, align(64))]
pub(super) struct Node {
    // line 0: what a walk reads
    pub(super) key: Vec<i32>,
    pub(super) children: FxHashMap<u64, Kids>,
    pub(super) last_access: u64,
    // line 1: what a match's output and locks read
    pub(super) value: Vec<PageId>,
    /// The node's entry in the evictable set, if it is in it.
    pub(super) evict_key: Option<EvictKey>,
    /// Own locks + Σ children's `lock_ref` (root: 1 forever).
    pub(super) lock_ref: u32,
    pub(super) parent: NodeId,
    // cold
    /// Locks taken on this very node (what `unlock` may release).
    pub(super) own_locks: u32,
    pub(super) ns: Ns,
    pub(super) generation: u32,
    pub(super) live: bool,
    pub(super) created: u64,
    /// Creation sequence number (never reused): the eviction tie-breaker.
    pub(super) seq: u64,
    pub(super) hit_count: u64,
    pub(super) priority: i64,
    /// Chained page hashes (only when events are enabled).
    pub(super) hashes: Vec<u64>,
    /// The node's child while it is its only one, kept out of `children`
    /// (then empty): no map allocation or page hash for the one-child nodes
    /// a split or a request's page-by-page growth makes. `NodeId::ROOT` when
    /// unused; never used by the root (whose children differ in namespace).
    pub(super) only: NodeId,
    /// Inserts still owed to this node and each of its ancestors (root
    /// excluded): their true `hit_count` adds the `owed_hits` of every node
    /// of their subtree. Non-zero only while the subtree holds a lock.
    pub(super) owed_hits: u64,
    /// A recency stamp still owed to this node and each of its ancestors:
    /// their true `last_access` is the largest `owed_tick` in their subtree
    /// when that is larger. Non-zero only while the subtree holds a lock.
    pub(super) owed_tick: u64,
}

// Four cache lines: a walk reads the first, a match's output and locks the second.
const _: () = assert!(std::mem::size_of::<Node>() == 256);

impl Node {
    pub(super) fn empty(generation: u32) -> Self {
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
            owed_hits: 0,
            owed_tick: 0,
            only: NodeId::ROOT,
        }
    }

    /// Whether the node has a child (in `only` or in `children`). O(1).
    #[inline]
    pub(super) fn has_children(&self) -> bool {
        self.only != NodeId::ROOT || !self.children.is_empty()
    }
}

/// [`child_key`] of a query page of any token type: `None` when a token does
/// not fit in i32 (no edge can start with it). No copy.
#[inline]
pub(super) fn child_key_of<T: crate::core::hash::Token>(ns: Ns, page: &[T]) -> Option<u64> {
    if let Some(p) = T::as_i32(page) {
        return Some(child_key(ns, p));
    }
    #[cfg(test)]
    if FORCE_COLLISIONS.with(std::cell::Cell::get) {
        return Some(u64::from(ns.0));
    }
    if let [t] = page {
        #[allow(clippy::cast_sign_loss)]
        return Some((u64::from(ns.0) << 32) | u64::from(t.narrow()? as u32));
    }
    let mut h = rustc_hash::FxHasher::default();
    h.write_u32(ns.0);
    for &t in page {
        h.write_i32(t.narrow()?);
    }
    Some(h.finish())
}

/// The key a child is filed under in its parent's map: from its namespace and
/// first page (`page` is the first `page_size` tokens). With `page_size == 1`
/// the key is exact (`ns << 32 | token`); with larger pages it is a hash of the
/// page (children of one parent often share a first token when pages straddle
/// a common prefix), and a lookup still compares the page itself.
#[inline]
pub(super) fn child_key(ns: Ns, page: &[i32]) -> u64 {
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
    pub(super) static FORCE_COLLISIONS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

pub(super) fn stale(h: NodeHandle) -> KvError {
    KvError::new(
        ErrorKind::StaleHandle,
        format!("node handle {} is stale or unknown (the node was evicted, or the tree was reset)", h.0),
    )
}

impl RadixTree {
    pub(super) fn alloc_node(&mut self) -> NodeId {
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
        if self.hy.is_some() {
            self.hy_grow();
        }
        id
    }

    /// Returns a removed node's arena slot: clears it and bumps its generation.
    pub(super) fn release_node(&mut self, id: NodeId) {
        let n = &mut self.nodes[id.idx()];
        let generation = n.generation.wrapping_add(1);
        *n = Node::empty(generation);
        self.free_nodes.push(id.0);
        self.num_nodes -= 1;
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

    pub(super) fn children_of(&self, id: NodeId) -> Vec<NodeId> {
        let mut out = Vec::new();
        let n = &self.nodes[id.idx()];
        if n.only != NodeId::ROOT {
            out.push(n.only);
        }
        for k in n.children.values() {
            match k {
                Kids::One(c) => out.push(*c),
                Kids::Many(v) => out.extend_from_slice(v),
            }
        }
        out
    }
}
