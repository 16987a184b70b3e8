//! Matching and inserting: walks from the root along token-run edges,
//! splitting an edge where a match or insert ends inside it.
//!
//! # Invariants kept
//! - a walk never changes the tree; `match_prefix` and `insert` change only
//!   recency stamps, hit counts, priorities and (by splitting) the shape,
//!   never the sizes, except that `insert` adds its new suffix as one leaf;
//! - a split keeps the lower node's id (handles and locks stay valid) and
//!   gives the new upper node the lower node's lock count, hit count and
//!   priority, so invariants 3-5 of the module header hold across it;
//! - `insert` validates every value (the value bitmap) before changing
//!   anything, so a refused insert leaves no trace.
//!
//! # Costs
//! `n` = query tokens, `d` = depth of the walk. A walk: O(n) token compares
//! (galloping memcmp) and O(d) child-map probes. `match_prefix`: the walk
//! plus O(hit pages) to copy values; a split copies the shorter half of the
//! edge (the longer keeps its buffer).
//! `insert`: the walk, O(prefix pages) to find duplicates and O(new pages).

use std::collections::hash_map::Entry;

use super::arena::{child_key, child_key_of, Kids};
use super::values::same_values;
use super::{InsertOpts, Match, Matched, NodeId, Ns, Probe, RadixTree};
use crate::core::error::{KvError, KvResult};
use crate::core::hash::Token;
use crate::core::ids::PageId;
use crate::core::wide_tokens;

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

/// Splits `v` after its first `at` items (`0 < at < len`): returns the
/// front, `v` keeps the back. The longer part keeps the buffer and only the
/// shorter one is copied (a front longer than the back takes `v`'s buffer,
/// cut to its length and shrunk in place), so a split costs O(shorter part)
/// copies rather than O(len), and neither buffer is more than twice its
/// contents (the back may keep the front's room).
fn split_front<T: Copy>(v: &mut Vec<T>, at: usize) -> Vec<T> {
    debug_assert!(at > 0 && at < v.len());
    if at > v.len() - at {
        let back = v[at..].to_vec();
        let mut front = std::mem::replace(v, back);
        front.truncate(at);
        front.shrink_to_fit();
        front
    } else {
        v.drain(..at).collect()
    }
}

/// [`common_prefix`] of a key and a query of any token type, without a copy:
/// an i32 query is compared with memcmp, an i64 one in place by
/// [`crate::core::wide_tokens::common_prefix`] (AVX2 / AVX-512 when the CPU
/// has it). A query token that does not fit in i32 equals no key token.
/// O(common prefix).
#[inline]
#[must_use]
pub fn common_prefix_of<T: Token>(a: &[i32], b: &[T]) -> usize {
    if let Some(b) = T::as_i32(b) {
        return common_prefix(a, b);
    }
    if let Some(b) = T::as_i64(b) {
        return wide_tokens::common_prefix(a, b);
    }
    let n = a.len().min(b.len());
    (0..n).find(|&i| i64::from(a[i]) != b[i].get()).unwrap_or(n)
}

impl RadixTree {
    /// Finds the child of `node` in namespace `ns` whose edge shares at least
    /// one page with `q` (non-empty, page-aligned); returns it and the
    /// page-aligned common prefix length. O(common prefix).
    pub(super) fn find_child<T: Token>(&self, node: NodeId, ns: Ns, q: &[T]) -> Option<(NodeId, usize)> {
        let ps = self.page_size;
        let try_one = |c: NodeId| {
            let l = common_prefix_of(&self.nodes[c.idx()].key, q) / ps * ps;
            (l > 0).then_some((c, l))
        };
        let n = &self.nodes[node.idx()];
        if n.children.is_empty() {
            // An only child (same namespace: not under the root): its edge
            // decides, no page hash.
            return if n.only == NodeId::ROOT { None } else { try_one(n.only) };
        }
        let kids = n.children.get(&child_key_of(ns, &q[..ps])?)?;
        match kids {
            Kids::One(c) => try_one(*c),
            Kids::Many(v) => v.iter().find_map(|&c| try_one(c)),
        }
    }

    /// Walks `q` (page-aligned) from the root without changing anything,
    /// recording `(child, matched tokens)` per visited child in `self.path`
    /// (the last may be partial). Returns the hit length. O(hit + depth).
    pub(super) fn walk<T: Token>(&mut self, q: &[T], ns: Ns) -> usize {
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

    pub(super) fn aligned<'a, T>(&self, tokens: &'a [T]) -> &'a [T] {
        &tokens[..tokens.len() / self.page_size * self.page_size]
    }

    /// What [`RadixTree::match_prefix`] would hit now, and how many tokens of
    /// currently unlocked nodes locking that match would protect; changes
    /// nothing. O(hit + depth).
    pub fn probe<T: Token>(&mut self, tokens: &[T], ns: Option<&str>) -> Probe {
        let q = self.aligned(tokens);
        let Some(ns) = self.ns.lookup(ns) else { return Probe::default() };
        if q.is_empty() {
            return Probe::default();
        }
        let mut len = self.walk(q, ns);
        let mut upto = self.path.len();
        if self.hy.is_some() {
            let partial = self.path.last().is_some_and(|&(c, l)| l < self.nodes[c.idx()].key.len());
            (upto, len) = self.hy_best(&self.path, partial);
        }
        let lockable = self.path[..upto]
            .iter()
            .filter(|(c, _)| self.nodes[c.idx()].lock_ref == 0)
            .map(|&(_, l)| l)
            .sum();
        let (swa_lockable, mamba_lockable) = self.hy_lockable(upto);
        Probe { len, lockable, swa_lockable, mamba_lockable }
    }

    pub(super) fn stamp(&mut self, id: NodeId, tick: u64) {
        self.nodes[id.idx()].last_access = tick;
        self.rekey(id);
    }

    /// Longest cached page-aligned prefix of `tokens` in namespace `ns`. The
    /// query is first cut down to a page multiple; a query shorter than one
    /// page hits 0 and touches nothing. Stamps every visited node with a new
    /// tick (a tree with SWA or Mamba components: the hit's nodes and a split
    /// edge's halves only); a match ending inside an edge splits it there (the tree's
    /// contents and sizes do not change). Appends the matched values to
    /// `out`. O(hit + depth + split edge).
    pub fn match_prefix<T: Token>(&mut self, tokens: &[T], ns: Option<&str>, out: &mut Vec<PageId>) -> Match {
        self.match_prefix_with(tokens, ns, |vals| out.extend_from_slice(vals))
    }

    /// [`RadixTree::match_prefix`] handing the matched values to `sink`, one
    /// node's run at a time, root side first (no intermediate buffer).
    pub fn match_prefix_with<T: Token>(
        &mut self,
        tokens: &[T],
        ns: Option<&str>,
        mut sink: impl FnMut(&[PageId]),
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
    pub fn match_nodes<T: Token>(&mut self, tokens: &[T], ns: Option<&str>) -> Matched<'_> {
        self.path.clear();
        let q = self.aligned(tokens);
        if q.is_empty() {
            return Matched { tree: self, len: 0, node: NodeId::ROOT };
        }
        self.clock += 1;
        let tick = self.clock;
        self.nodes[0].last_access = tick;
        let Some(ns) = self.ns.lookup(ns) else { return Matched { tree: self, len: 0, node: NodeId::ROOT } };
        let mut len = self.walk(q, ns);
        let mut node = NodeId::ROOT;
        let hybrid = self.hy.is_some();
        for i in 0..self.path.len() {
            let (c, l) = self.path[i];
            let partial = l < self.nodes[c.idx()].key.len();
            // A hybrid tree stamps the hit's path only (below); both halves of
            // a split edge are new either way.
            if !hybrid || partial {
                self.stamp(c, tick);
            }
            node = if partial { self.split(c, l, tick) } else { c };
            // From here on `path` holds the matched nodes (after any split).
            self.path[i].0 = node;
        }
        if hybrid {
            // The hit ends at the deepest node every component accepts; only
            // its path is refreshed (as SGLang's unified tree does), so the
            // nodes walked past it keep their recency.
            let (upto, hit) = self.hy_best(&self.path, false);
            self.path.truncate(upto);
            for i in 0..upto {
                let x = self.path[i].0;
                self.stamp(x, tick);
            }
            len = hit;
            node = self.path.last().map_or(NodeId::ROOT, |p| p.0);
            self.hy_touch(node, true);
        }
        Matched { tree: self, len, node }
    }

    /// Splits `c` after its first `l` tokens (a page multiple, `0 < l <
    /// len`): a new upper node takes `key[..l]` and sits between `c`'s parent
    /// and `c`, with `c`'s lock count, hit count and priority; `c` keeps its
    /// id (so handles and locks stay valid) and the rest of its edge.
    /// O(shorter half) copied ([`split_front`]): the window cap of a hybrid
    /// insert splits a long new leaf just above its last window, and moves
    /// only that window's tokens.
    pub(super) fn split(&mut self, c: NodeId, l: usize, tick: u64) -> NodeId {
        let ps = self.page_size;
        let cn = &mut self.nodes[c.idx()];
        debug_assert!(l > 0 && l < cn.key.len() && l.is_multiple_of(ps));
        let lp = l / ps;
        let upper_key = split_front(&mut cn.key, l);
        let upper_value = split_front(&mut cn.value, lp);
        let upper_hashes = if cn.hashes.is_empty() { Vec::new() } else { split_front(&mut cn.hashes, lp) };
        let (parent, ns, lock_ref, hit_count, priority) =
            (cn.parent, cn.ns, cn.lock_ref, cn.hit_count, cn.priority);
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
        un.only = c;
        self.nodes[c.idx()].parent = u;
        if self.hy.is_some() {
            self.hy_split(c, u);
        }
        if self.nodes[parent.idx()].only == c {
            self.nodes[parent.idx()].only = u;
            return u;
        }
        let upper_key = child_key(ns, &self.nodes[u.idx()].key[..ps]);
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
        values: &[PageId],
        ns: Option<&str>,
        priority: i64,
        extra: &[PageId],
        to_free: &mut Vec<PageId>,
    ) -> KvResult<usize> {
        self.insert_hybrid(tokens, values, ns, priority, extra, to_free, &InsertOpts::default())
    }

    /// [`RadixTree::insert`] with the components' arguments (see
    /// [`super::hybrid`]); their frees wait in [`RadixTree::take_hybrid_freed`].
    ///
    /// # Errors
    /// As [`RadixTree::insert`]; also `InvalidArgument`, with nothing
    /// changed, for a misaligned `swa_evicted`, a missing, foreign or
    /// repeated Mamba state.
    #[allow(clippy::too_many_arguments)]
    pub fn insert_hybrid(
        &mut self,
        tokens: &[i32],
        values: &[PageId],
        ns: Option<&str>,
        priority: i64,
        extra: &[PageId],
        to_free: &mut Vec<PageId>,
        hi: &InsertOpts,
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
        self.hy_check_insert(tokens.len(), hi)?;
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
        let mut reached = 0;
        for i in 0..self.path.len() {
            let (c, l) = self.path[i];
            self.nodes[c.idx()].last_access = tick;
            node = if l < self.nodes[c.idx()].key.len() { self.split(c, l, tick) } else { c };
            reached += l;
            let n = &mut self.nodes[node.idx()];
            n.priority = n.priority.max(priority);
            if reached > hi.inserted_len {
                n.hit_count += 1;
            }
            self.rekey(c);
            self.rekey(node);
            self.path[i].0 = node;
        }
        if self.hy.is_none() {
            if prefix < tokens.len() {
                let leaf = self.add_leaf(node, ns, &tokens[prefix..], &values[pp..], priority, tick, false);
                self.uncount_reinserted(leaf, tokens.len(), hi);
            }
            return Ok(prefix);
        }
        let mut node = self.path.last().map_or(NodeId::ROOT, |p| p.0);
        if self.hy_tombstone_past(hi.swa_evicted) {
            let mut matched: Vec<NodeId> = self.path.iter().map(|p| p.0).collect();
            self.hy_insert_prefix(&mut matched, values, hi.swa_evicted, to_free, dup_start, tick);
            node = matched.last().copied().unwrap_or(NodeId::ROOT);
        }
        if prefix < tokens.len() {
            let leaf = self.add_leaf(node, ns, &tokens[prefix..], &values[pp..], priority, tick, false);
            self.uncount_reinserted(leaf, tokens.len(), hi);
            self.hy_insert_end(leaf, true, prefix, hi, tick);
        } else {
            self.hy_insert_end(node, false, prefix, hi, tick);
        }
        Ok(prefix)
    }

    /// A new leaf ending within the tokens its caller inserted before
    /// (`opts.inserted_len`) counts no hit: the request re-inserting its own
    /// sequence counts each node once.
    fn uncount_reinserted(&mut self, leaf: NodeId, end: usize, opts: &InsertOpts) {
        if end <= opts.inserted_len {
            self.nodes[leaf.idx()].hit_count = 0;
            self.rekey(leaf);
        }
    }

    /// Appends a leaf holding `key` / `values` (page-aligned, one value per
    /// page, none in the tree) under `node`, the deepest node of a path the
    /// caller holds an own lock on (or the root, when it holds none; `ns` is
    /// then the leaf's namespace), and moves that lock down to the new leaf.
    /// The tree, its clock, stamps, counts, sizes and events end up exactly
    /// as after `insert` of the whole path + `key` (which would walk to
    /// `node` and add the same leaf), `match_prefix` of it, `lock(leaf)` and
    /// `unlock(node)`, without walking from the root or re-locking the path:
    /// the path's hit counts and stamps are owed on `node` and settled by the
    /// unlock that releases the lock (module docs, recency), so the cost is
    /// O(key), whatever the depth. Returns `None`, with nothing changed, when `node`
    /// holds no own lock, already has a child starting with `key`'s first
    /// page, `key` is empty or misaligned, `ns` is new to the tree, or a
    /// value is in the tree (the caller then takes the general path).
    pub fn extend_locked(
        &mut self,
        node: NodeId,
        ns: Option<&str>,
        key: &[i32],
        values: &[PageId],
    ) -> Option<NodeId> {
        let ps = self.page_size;
        if self.hy.is_some() {
            // Components change where a request's pages end up: the general path.
            return None;
        }
        let root = node == NodeId::ROOT;
        let n = &self.nodes[node.idx()];
        let ns = if root { self.ns.lookup(ns)? } else { n.ns };
        if (!root && n.own_locks == 0)
            || key.is_empty()
            || !key.len().is_multiple_of(ps)
            || values.len() != key.len() / ps
        {
            return None;
        }
        let clash = if n.children.is_empty() {
            n.only != NodeId::ROOT && self.nodes[n.only.idx()].key[..ps] == key[..ps]
        } else {
            n.children.contains_key(&child_key(ns, &key[..ps]))
        };
        if clash {
            return None;
        }
        self.check_values([&[], values, &[]]).ok()?;
        // insert: one tick, the leaf created at it; every path node counted
        // (owed: recorded once on `node`, for it and its ancestors).
        self.clock += 1;
        let leaf = self.add_leaf(node, ns, key, values, 0, self.clock, true);
        // lock(leaf) + unlock(node): only the leaf's count changes (the leaf
        // is created locked, so it never enters the evictable set).
        // The caller's match of the new path: a second tick on root, path
        // and leaf (the path's stamp owed on `node` as well). Every node of
        // the path stays locked (through the leaf) until an unlock settles it.
        self.clock += 1;
        let tick = self.clock;
        self.nodes[0].last_access = tick;
        self.nodes[leaf.idx()].last_access = tick;
        if !root {
            let n = &mut self.nodes[node.idx()];
            n.own_locks -= 1;
            n.owed_hits += 1;
            n.owed_tick = tick;
        }
        Some(leaf)
    }

    /// Adds a leaf under `parent` holding `key` / `value` (validated by the
    /// caller), unlocked, or with one own lock when `locked`. Returns it.
    /// A childless non-root parent holds it as its only child (no page
    /// hash); otherwise it is filed in the map (with the only child, if any).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn add_leaf(
        &mut self,
        parent: NodeId,
        ns: Ns,
        key: &[i32],
        value: &[PageId],
        priority: i64,
        tick: u64,
        locked: bool,
    ) -> NodeId {
        let leaf = self.alloc_node();
        let hashes = self.leaf_stored(parent, ns, key);
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
        n.own_locks = u32::from(locked);
        n.lock_ref = u32::from(locked);
        let ps = self.page_size;
        let p = &self.nodes[parent.idx()];
        if parent != NodeId::ROOT && !p.has_children() {
            self.nodes[parent.idx()].only = leaf;
        } else {
            let only = p.only;
            if only != NodeId::ROOT {
                // a second child: both go to the map
                self.nodes[parent.idx()].only = NodeId::ROOT;
                self.file_child(parent, child_key(ns, &self.nodes[only.idx()].key[..ps]), only);
            }
            self.file_child(parent, child_key(ns, &key[..ps]), leaf);
        }
        if parent == NodeId::ROOT {
            self.ns.add_root_child(ns);
        }
        if locked {
            self.protected_size += key.len();
        } else {
            self.evictable_size += key.len();
        }
        self.update_leaf_status(parent);
        self.update_leaf_status(leaf);
        leaf
    }

    /// Files `child` in `parent`'s map under `ck`.
    fn file_child(&mut self, parent: NodeId, ck: u64, child: NodeId) {
        match self.nodes[parent.idx()].children.entry(ck) {
            Entry::Vacant(e) => {
                e.insert(Kids::One(child));
            }
            Entry::Occupied(mut e) => match e.get_mut() {
                Kids::One(x) => {
                    let x = *x;
                    e.insert(Kids::Many(vec![x, child]));
                }
                Kids::Many(v) => v.push(child),
            },
        }
    }
}
