//! Hybrid components of the radix tree: sliding-window (SWA) KV with
//! tombstones and Mamba (recurrent) state, beside the full-attention KV every
//! node holds, with the semantics of SGLang's unified radix cache (one tree,
//! components per node, cascade eviction, a lock count per component).
//!
//! # Data model
//! A node's full KV is its `value` (one page id per page). Its SWA KV is the
//! sliding-window pair of each of those pages (the page id names both, as
//! SGLang pairs each full slot with an SWA slot): either live for the whole
//! node or a *tombstone* (freed; the full KV stays). Its Mamba state is an
//! optional caller-chosen state id (the recurrent state after the node's last
//! token). All of it lives in a side table indexed like the arena, so a tree
//! without components pays one `None` check per operation.
//!
//! # Rules
//! - **Match**: the walk and its splits are the full-attention ones; the hit
//!   ends at the deepest walked node where every component accepts:
//!   SWA accepts a node when no tombstone lies on the path to it, or when the
//!   live SWA tokens since the last tombstone (the node's own included)
//!   reach the window; Mamba accepts a node holding a state. Values are
//!   returned up to that node, and only the nodes up to it (and both halves
//!   of an edge the match split) get the match's tick: nodes walked past the
//!   hit keep their recency. A match touches each component's LRU: SWA
//!   moves the hit node and the live ancestors within `window + page_size`
//!   tokens of it to the most recent end (the node most recent), Mamba the
//!   hit node's state.
//! - **Insert** takes `swa_evicted` (tokens of the sequence whose SWA KV the
//!   caller already freed, page-aligned) and the Mamba state of its last
//!   token. A new leaf's SWA is live from `swa_evicted` on (the leaf is split
//!   there; the part before is a tombstone), and a live new leaf longer than
//!   the window rounded up to pages is split so that its lower part is
//!   exactly that long (a lock then pins one window). A tombstone on the
//!   insert path that ends past `swa_evicted` (and is not the caller's own
//!   matched prefix) is revived from the caller's pages: split at
//!   `swa_evicted`, its lower part takes the caller's pages (the tree's old
//!   ones are handed back as *full-only* frees, their SWA being gone), or,
//!   when the node is locked, keeps its pages and hands the caller's back as
//!   full-only frees (their SWA moves to the node). The Mamba state goes to
//!   the new leaf, or to the node the insert ends on when it has none;
//!   otherwise the caller keeps (frees) it (`mamba_exist`).
//! - **Locks**: a lock takes the full path lock, an SWA lock on every node
//!   from the locked node up until the window is covered (tombstones
//!   included; the last node is stamped with a boundary id, which a split
//!   moves to the upper half, and the unlock walks up to it), and a Mamba
//!   lock on the node itself. Unlocking a node releases its most recent lock
//!   (receipts are last in, first out).
//! - **Eviction** (cascade by priority; a leaf is deleted whole):
//!   full eviction deletes unlocked leaves with all their components;
//!   SWA eviction takes the least recent SWA-unlocked live node: a deletable
//!   leaf is deleted, an inner node becomes a tombstone and loses its Mamba
//!   state too; Mamba eviction takes the least recent unlocked state: a
//!   deletable leaf is deleted, an inner node only loses the state.
//!
//! # Invariants (checked by `check_invariants`)
//! - the SWA LRU holds exactly the live-SWA nodes, the Mamba LRU exactly the
//!   nodes with a state; no state id is held twice;
//! - SWA sizes: `swa_evictable + swa_protected` = tokens of live-SWA nodes,
//!   split by `swa_lock == 0`; Mamba sizes likewise in states;
//! - `swa_lock <= lock_ref`, `mamba_lock == own_locks` and one SWA receipt
//!   per own lock (component locks sit on fully locked paths, so the
//!   evictable-leaf set stays the full-attention one).
//!
//! # Costs
//! Match: O(walked nodes) validators + O(window nodes) LRU moves. Lock and
//! unlock: O(depth) + O(window nodes). SWA / Mamba eviction: O(skipped
//! locked nodes + removed nodes). Memory: 56 bytes per node (+ 8 per extra own lock).

use rustc_hash::FxHashSet;

use super::{NodeId, RadixTree};
use crate::core::error::{InvariantViolation, KvError, KvResult};
use crate::core::ids::PageId;
use crate::ensure_inv;

/// Which components a tree holds beside full attention.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Components {
    /// Sliding-window attention with this window in tokens (`None`: no SWA).
    pub swa_window: Option<usize>,
    /// Mamba / linear-attention state per node.
    pub mamba: bool,
}

impl Components {
    /// The components that serve a group layout, with the tree's page size:
    /// full attention and MLA groups are the full KV every node holds, one
    /// sliding-window group is the SWA component (its window is SGLang's
    /// retained window), a Mamba group the Mamba component. SGLang's tree has
    /// one page size, and one component per kind: vLLM's several groups of
    /// one kind (its layers split for page sizes: sliding windows of one
    /// size, Mamba groups) are that one component, as SGLang's SWA pool and
    /// `MambaPool` hold every such layer per slot.
    ///
    /// # Errors
    /// `InvalidArgument` naming the layout for what the radix design cannot
    /// serve: no full-attention group, groups of different block sizes,
    /// chunked local attention, sliding windows of different sizes, or
    /// caching turned off.
    pub fn from_layout(layout: &crate::core::groups::spec::GroupLayout) -> KvResult<(usize, Components)> {
        use crate::core::groups::spec::GroupKind;
        let groups = layout.groups();
        let names: Vec<String> = groups
            .iter()
            .map(|g| match g.kind.sliding_window() {
                Some(w) => format!("{}(window={w}, block_size={})", g.kind.kind_name(), g.block_size),
                None => format!("{}(block_size={})", g.kind.kind_name(), g.block_size),
            })
            .collect();
        let refuse = |why: &str| {
            KvError::invalid(format!(
                "the radix design cannot serve the layout [{}]: {why}",
                names.join(", ")
            ))
        };
        if !layout.enable_caching() {
            return Err(refuse("prefix caching is off (the radix tree is a prefix cache)"));
        }
        let Some(first) = groups.first() else { return Err(refuse("it has no groups")) };
        if groups.iter().any(|g| g.block_size != first.block_size) {
            return Err(refuse("its groups have different block sizes (the radix tree has one page size)"));
        }
        if !groups.iter().any(|g| g.kind.is_full()) {
            return Err(refuse("it has no full-attention group (every radix node holds full KV)"));
        }
        let mut comps = Components::default();
        for g in groups {
            match g.kind {
                GroupKind::FullAttention | GroupKind::Mla => {}
                GroupKind::SlidingWindow { window } => {
                    if comps.swa_window.is_some_and(|w| w != window) {
                        return Err(refuse("it has sliding windows of different sizes (one SWA component)"));
                    }
                    comps.swa_window = Some(window);
                }
                GroupKind::ChunkedLocal { .. } => {
                    return Err(refuse("chunked local attention has no radix component (SGLang has none)"));
                }
                GroupKind::Mamba { .. } => comps.mamba = true,
                GroupKind::SlidingWindowMla { .. } => {
                    return Err(refuse("sliding-window MLA has no radix component"));
                }
                GroupKind::CrossAttention => {
                    return Err(refuse("cross-attention is never cached (encoder states of one request)"));
                }
                GroupKind::CircularBuffer => {
                    return Err(refuse("a circular buffer has no radix component (one request's ring)"));
                }
            }
        }
        if comps.swa_window == Some(0) {
            return Err(refuse("its sliding window is 0"));
        }
        Ok((first.block_size, comps))
    }

    /// A layout as error messages name it: `[kind(window=.., block_size=..), ...]`.
    #[must_use]
    pub fn describe(layout: &crate::core::groups::spec::GroupLayout) -> String {
        let names: Vec<String> = layout
            .groups()
            .iter()
            .map(|g| match g.kind {
                crate::core::groups::spec::GroupKind::SlidingWindow { window }
                | crate::core::groups::spec::GroupKind::SlidingWindowMla { window, .. } => {
                    format!("{}(window={window}, block_size={})", g.kind.kind_name(), g.block_size)
                }
                crate::core::groups::spec::GroupKind::ChunkedLocal { chunk } => {
                    format!("{}(chunk={chunk}, block_size={})", g.kind.kind_name(), g.block_size)
                }
                _ => format!("{}(block_size={})", g.kind.kind_name(), g.block_size),
            })
            .collect();
        format!("[{}]", names.join(", "))
    }

    /// Whether there is any component beside full attention.
    #[must_use]
    pub fn any(self) -> bool {
        self.swa_window.is_some() || self.mamba
    }
}

/// What an insert brings beside its tokens and values: the components' arguments
/// and the tokens the caller inserted before.
#[derive(Clone, Copy, Debug, Default)]
pub struct InsertOpts {
    /// Leading tokens whose SWA KV the caller already freed (page-aligned).
    pub swa_evicted: usize,
    /// The Mamba state after the last inserted token (required with Mamba).
    pub mamba: Option<u32>,
    /// Tokens this caller inserted before (SGLang's `cache_inserted_len`):
    /// a node counts a hit only when the path through it reaches past them.
    pub inserted_len: usize,
}

/// Values handed back by hybrid operations, by component.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HybridFreed {
    /// Pages whose SWA KV was freed (their full KV stays unless also listed
    /// as a full free).
    pub swa: Vec<PageId>,
    /// Pages to free without their SWA KV (a tombstone's old pages, or the
    /// caller's pages whose SWA a locked tombstone adopted).
    pub full_only: Vec<PageId>,
    /// Mamba states freed.
    pub mamba: Vec<u32>,
    /// Caller's pages an unlocked tombstone took in place of its own (listed
    /// in `full_only`): the tree now holds them.
    pub adopted: Vec<PageId>,
    /// `(caller's page, node's page)`: a locked tombstone kept its page and
    /// took the caller's SWA KV for it (the caller's page is in `full_only`).
    pub swa_moved: Vec<(PageId, PageId)>,
    /// The insert ended on a node that already had a Mamba state (the
    /// caller keeps, and frees, its own).
    pub mamba_exist: bool,
}

impl HybridFreed {
    /// Empties every list.
    pub fn clear(&mut self) {
        self.swa.clear();
        self.full_only.clear();
        self.mamba.clear();
        self.adopted.clear();
        self.swa_moved.clear();
        self.mamba_exist = false;
    }
}

const NONE: u32 = u32::MAX;

/// An intrusive doubly linked recency list over arena indices.
#[derive(Clone, Debug, Default)]
pub(super) struct Lru {
    /// `(newer, older)` per arena index; `on` marks membership.
    links: Vec<(u32, u32, bool)>,
    /// Most recent end.
    mru: u32,
    /// Least recent end.
    lru: u32,
    len: usize,
}

impl Lru {
    fn new() -> Self {
        Lru { links: Vec::new(), mru: NONE, lru: NONE, len: 0 }
    }

    fn grow(&mut self, n: usize) {
        if self.links.len() < n {
            self.links.resize(n, (NONE, NONE, false));
        }
    }

    pub(super) fn contains(&self, x: NodeId) -> bool {
        self.links.get(x.idx()).is_some_and(|l| l.2)
    }

    fn push_mru(&mut self, x: NodeId) {
        debug_assert!(!self.contains(x));
        let old = self.mru;
        self.links[x.idx()] = (NONE, old, true);
        if old == NONE {
            self.lru = x.0;
        } else {
            self.links[old as usize].0 = x.0;
        }
        self.mru = x.0;
        self.len += 1;
    }

    /// Puts `x` just older than `a` (which is in the list).
    fn insert_older_than(&mut self, a: NodeId, x: NodeId) {
        debug_assert!(self.contains(a) && !self.contains(x));
        let older = self.links[a.idx()].1;
        self.links[x.idx()] = (a.0, older, true);
        self.links[a.idx()].1 = x.0;
        if older == NONE {
            self.lru = x.0;
        } else {
            self.links[older as usize].0 = x.0;
        }
        self.len += 1;
    }

    fn remove(&mut self, x: NodeId) {
        debug_assert!(self.contains(x));
        let (newer, older, _) = self.links[x.idx()];
        if newer == NONE {
            self.mru = older;
        } else {
            self.links[newer as usize].1 = older;
        }
        if older == NONE {
            self.lru = newer;
        } else {
            self.links[older as usize].0 = newer;
        }
        self.links[x.idx()] = (NONE, NONE, false);
        self.len -= 1;
    }

    fn touch(&mut self, x: NodeId) {
        self.remove(x);
        self.push_mru(x);
    }

    /// Moves `x` (a member other than `a`) to just older than `a`.
    fn move_older_than(&mut self, a: NodeId, x: NodeId) {
        self.remove(x);
        self.insert_older_than(a, x);
    }

    /// The least recent member for which `skip` is false.
    fn oldest_where(&self, mut skip: impl FnMut(NodeId) -> bool) -> Option<NodeId> {
        let mut cur = self.lru;
        while cur != NONE {
            if !skip(NodeId(cur)) {
                return Some(NodeId(cur));
            }
            cur = self.links[cur as usize].0;
        }
        None
    }

    /// Members, least recent first.
    pub(super) fn order(&self) -> Vec<NodeId> {
        let mut out = Vec::with_capacity(self.len);
        let mut cur = self.lru;
        while cur != NONE {
            out.push(NodeId(cur));
            cur = self.links[cur as usize].0;
        }
        out
    }

    fn clear(&mut self) {
        self.links.iter_mut().for_each(|l| *l = (NONE, NONE, false));
        self.mru = NONE;
        self.lru = NONE;
        self.len = 0;
    }
}

/// The SWA boundary of each own lock of a node (0: the lock reached the
/// root), last in first out: the latest inline (a node rarely holds two own
/// locks), earlier ones in a vector allocated only then.
#[derive(Clone, Debug, Default)]
pub(super) struct Receipts {
    len: u32,
    last: u64,
    earlier: Vec<u64>,
}

impl Receipts {
    fn push(&mut self, r: u64) {
        if self.len > 0 {
            self.earlier.push(self.last);
        }
        self.last = r;
        self.len += 1;
    }

    fn pop(&mut self) -> Option<u64> {
        if self.len == 0 {
            return None;
        }
        self.len -= 1;
        let r = self.last;
        self.last = if self.len > 0 { self.earlier.pop().expect("earlier receipts") } else { 0 };
        Some(r)
    }

    pub(super) fn len(&self) -> usize {
        self.len as usize
    }
}

/// The components of one node.
#[derive(Clone, Debug, Default)]
pub(super) struct Comp {
    pub(super) swa_live: bool,
    pub(super) swa_lock: u32,
    /// Boundary id of the SWA lock segments that end here (0: none).
    pub(super) swa_uuid: u64,
    /// The SWA boundary of each own lock of this node (0: reached the root).
    pub(super) receipts: Receipts,
    pub(super) mamba: Option<u32>,
    pub(super) mamba_lock: u32,
}

/// The component state of a hybrid tree.
#[derive(Clone, Debug)]
pub(super) struct Hybrid {
    pub(super) spec: Components,
    /// SWA window in tokens (0 without SWA).
    pub(super) window: usize,
    pub(super) comps: Vec<Comp>,
    pub(super) swa_lru: Lru,
    pub(super) mamba_lru: Lru,
    pub(super) swa_evictable: usize,
    pub(super) swa_protected: usize,
    pub(super) mamba_evictable: usize,
    pub(super) mamba_protected: usize,
    pub(super) states: FxHashSet<u32>,
    next_uuid: u64,
    /// Frees of the current operation, drained by the caller.
    pub(super) freed: HybridFreed,
}

impl Hybrid {
    pub(super) fn new(spec: Components) -> Self {
        Hybrid {
            spec,
            window: spec.swa_window.unwrap_or(0),
            comps: vec![Comp::default()],
            swa_lru: Lru::new(),
            mamba_lru: Lru::new(),
            swa_evictable: 0,
            swa_protected: 0,
            mamba_evictable: 0,
            mamba_protected: 0,
            states: FxHashSet::default(),
            next_uuid: 1,
            freed: HybridFreed::default(),
        }
    }

    fn swa(&self) -> bool {
        self.window > 0
    }

    fn grow(&mut self, n: usize) {
        if self.comps.len() < n {
            self.comps.resize(n, Comp::default());
        }
        self.swa_lru.grow(n);
        self.mamba_lru.grow(n);
    }
}

/// The SWA match validator: live SWA tokens since the last tombstone
/// (starting unbounded: no tombstone yet).
#[derive(Clone, Copy)]
struct SwaRun(usize);

impl SwaRun {
    fn step(&mut self, live: bool, len: usize, window: usize) -> bool {
        if live {
            self.0 = self.0.saturating_add(len);
            self.0 >= window
        } else {
            self.0 = 0;
            false
        }
    }
}

impl RadixTree {
    /// An empty tree with hybrid components (see [`Components`]); with none
    /// it is [`RadixTree::new`].
    ///
    /// # Errors
    /// `InvalidArgument` for a bad page size or an SWA window of 0.
    pub fn with_components(
        page_size: usize,
        policy: super::Policy,
        enable_events: bool,
        comps: Components,
    ) -> KvResult<Self> {
        let mut t = RadixTree::new(page_size, policy, enable_events)?;
        if comps.swa_window == Some(0) {
            return Err(KvError::invalid("the sliding window must be at least 1 token"));
        }
        if comps.any() {
            t.hy = Some(Box::new(Hybrid::new(comps)));
        }
        Ok(t)
    }

    /// The tree's components beside full attention. O(1).
    #[must_use]
    pub fn components(&self) -> Components {
        self.hy.as_ref().map(|h| h.spec).unwrap_or_default()
    }

    /// `(evictable, protected)` tokens of live SWA KV. O(1).
    #[must_use]
    pub fn swa_sizes(&self) -> (usize, usize) {
        self.hy.as_ref().map_or((0, 0), |h| (h.swa_evictable, h.swa_protected))
    }

    /// `(evictable, protected)` Mamba states. O(1).
    #[must_use]
    pub fn mamba_sizes(&self) -> (usize, usize) {
        self.hy.as_ref().map_or((0, 0), |h| (h.mamba_evictable, h.mamba_protected))
    }

    /// `(swa_live, swa_lock, mamba state, mamba_lock)` of a live node. O(1).
    #[must_use]
    pub fn node_components(&self, id: NodeId) -> (bool, u32, Option<u32>, u32) {
        match &self.hy {
            Some(h) => {
                let c = &h.comps[id.idx()];
                (c.swa_live, c.swa_lock, c.mamba, c.mamba_lock)
            }
            None => (false, 0, None, 0),
        }
    }

    /// Takes the frees the last hybrid operation recorded.
    pub fn take_hybrid_freed(&mut self, out: &mut HybridFreed) {
        if let Some(h) = &mut self.hy {
            out.swa.append(&mut h.freed.swa);
            out.full_only.append(&mut h.freed.full_only);
            out.mamba.append(&mut h.freed.mamba);
            out.adopted.append(&mut h.freed.adopted);
            out.swa_moved.append(&mut h.freed.swa_moved);
            out.mamba_exist |= std::mem::take(&mut h.freed.mamba_exist);
        }
    }

    /// Appends the pages of every SWA-live node to `out`. O(nodes + pages).
    pub fn swa_live_values(&self, out: &mut Vec<PageId>) {
        let Some(h) = &self.hy else { return };
        for (i, n) in self.nodes.iter().enumerate().skip(1) {
            if n.live && h.comps.get(i).is_some_and(|c| c.swa_live) {
                out.extend_from_slice(&n.value);
            }
        }
    }

    /// Appends every Mamba state the tree holds to `out`. O(states).
    pub fn mamba_states(&self, out: &mut Vec<u32>) {
        if let Some(h) = &self.hy {
            out.extend(h.states.iter().copied());
        }
    }

    /// Nodes of the SWA / Mamba LRU, least recent first (tests, dumps).
    #[must_use]
    pub fn component_lru(&self, mamba: bool) -> Vec<NodeId> {
        self.hy
            .as_ref()
            .map(|h| if mamba { h.mamba_lru.order() } else { h.swa_lru.order() })
            .unwrap_or_default()
    }

    pub(super) fn hy_grow(&mut self) {
        let n = self.nodes.len();
        if let Some(h) = &mut self.hy {
            h.grow(n);
        }
    }

    /// The last index of `path` (walk entries `(node, matched tokens)`) that
    /// every component accepts, with the hit length there; `partial` says the
    /// last entry ends inside its edge (its upper half would hold no state).
    pub(super) fn hy_best(&self, path: &[(NodeId, usize)], partial_last: bool) -> (usize, usize) {
        let Some(h) = &self.hy else {
            return (path.len(), path.iter().map(|p| p.1).sum());
        };
        let mut run = SwaRun(usize::MAX);
        let (mut best, mut best_len, mut len) = (0, 0, 0);
        for (i, &(c, l)) in path.iter().enumerate() {
            let comp = &h.comps[c.idx()];
            len += l;
            let swa_ok = !h.swa() || run.step(comp.swa_live, l, h.window);
            let partial = partial_last && i + 1 == path.len();
            let mamba_ok = !h.spec.mamba || (comp.mamba.is_some() && !partial);
            if swa_ok && mamba_ok {
                best = i + 1;
                best_len = len;
            }
        }
        (best, best_len)
    }

    /// LRU refresh after a match or insert ending at `node`.
    pub(super) fn hy_touch(&mut self, node: NodeId, mamba_too: bool) {
        let ps = self.page_size;
        let Some(h) = &mut self.hy else { return };
        if node == NodeId::ROOT {
            return;
        }
        if h.swa() {
            // The node and its live ancestors within window + page tokens,
            // the node most recent, each ancestor just older than the live
            // node below it (the order touching them root side first gives,
            // without collecting the chain).
            let mut newer = None;
            let mut cur = node;
            let mut acc = 0usize;
            while cur != NodeId::ROOT && acc < h.window + ps {
                if h.comps[cur.idx()].swa_live {
                    match newer {
                        None => h.swa_lru.touch(cur),
                        Some(a) => h.swa_lru.move_older_than(a, cur),
                    }
                    newer = Some(cur);
                }
                acc += self.nodes[cur.idx()].key.len();
                cur = self.nodes[cur.idx()].parent;
            }
        }
        if mamba_too && h.comps[node.idx()].mamba.is_some() {
            h.mamba_lru.touch(node);
        }
    }

    /// Split hook: `u` is the new upper half of `c`.
    pub(super) fn hy_split(&mut self, c: NodeId, u: NodeId) {
        self.hy_grow();
        let Some(h) = &mut self.hy else { return };
        let cc = &mut h.comps[c.idx()];
        let (live, lock, uuid) = (cc.swa_live, cc.swa_lock, std::mem::take(&mut cc.swa_uuid));
        let uc = &mut h.comps[u.idx()];
        uc.swa_live = live;
        uc.swa_lock = lock;
        uc.swa_uuid = uuid;
        if live {
            h.swa_lru.insert_older_than(c, u);
        }
    }

    /// Marks `id` SWA-live (not yet), filing it most recent.
    fn hy_revive(&mut self, id: NodeId) {
        let len = self.nodes[id.idx()].key.len();
        let Some(h) = &mut self.hy else { return };
        let c = &mut h.comps[id.idx()];
        debug_assert!(!c.swa_live);
        c.swa_live = true;
        if c.swa_lock == 0 {
            h.swa_evictable += len;
        } else {
            h.swa_protected += len;
        }
        h.swa_lru.push_mru(id);
    }

    /// Makes `id` an SWA tombstone, recording its pages as SWA frees.
    fn hy_tombstone(&mut self, id: NodeId) {
        let n = &self.nodes[id.idx()];
        let Some(h) = &mut self.hy else { return };
        let c = &mut h.comps[id.idx()];
        debug_assert!(c.swa_live);
        c.swa_live = false;
        if c.swa_lock == 0 {
            h.swa_evictable -= n.key.len();
        } else {
            h.swa_protected -= n.key.len();
        }
        h.swa_lru.remove(id);
        h.freed.swa.extend_from_slice(&n.value);
    }

    fn hy_drop_state(&mut self, id: NodeId) {
        let Some(h) = &mut self.hy else { return };
        let c = &mut h.comps[id.idx()];
        if let Some(s) = c.mamba.take() {
            if c.mamba_lock == 0 {
                h.mamba_evictable -= 1;
            } else {
                h.mamba_protected -= 1;
            }
            h.mamba_lru.remove(id);
            h.states.remove(&s);
            h.freed.mamba.push(s);
        }
    }

    fn hy_set_state(&mut self, id: NodeId, s: u32) {
        let Some(h) = &mut self.hy else { return };
        let c = &mut h.comps[id.idx()];
        debug_assert!(c.mamba.is_none());
        c.mamba = Some(s);
        if c.mamba_lock == 0 {
            h.mamba_evictable += 1;
        } else {
            h.mamba_protected += 1;
        }
        h.states.insert(s);
        h.mamba_lru.push_mru(id);
    }

    /// Removal hook for a node being deleted (a leaf): frees its components.
    pub(super) fn hy_remove(&mut self, id: NodeId) {
        if self.hy.is_none() {
            return;
        }
        if self.hy.as_ref().is_some_and(|h| h.comps[id.idx()].swa_live) {
            self.hy_tombstone(id);
        }
        self.hy_drop_state(id);
        if let Some(h) = &mut self.hy {
            h.comps[id.idx()] = Comp::default();
        }
    }

    /// What locking the node ending `self.path[..upto]` would protect: live
    /// SWA tokens not SWA-locked now (the lock walks up until the window is
    /// covered, each walked entry as long as its matched part), and whether
    /// it would lock an evictable Mamba state. O(window nodes).
    pub(super) fn hy_lockable(&self, upto: usize) -> (usize, bool) {
        let Some(h) = &self.hy else { return (0, false) };
        let mut swa = 0;
        if h.window > 0 {
            let mut covered = 0usize;
            for &(c, l) in self.path[..upto].iter().rev() {
                if covered >= h.window {
                    break;
                }
                let cc = &h.comps[c.idx()];
                if cc.swa_lock == 0 && cc.swa_live {
                    swa += l;
                }
                covered += l;
            }
        }
        let mamba = upto > 0 && h.spec.mamba && {
            let (c, l) = self.path[upto - 1];
            let cc = &h.comps[c.idx()];
            // A match ending inside an edge splits it: the upper half holds no state.
            l == self.nodes[c.idx()].key.len() && cc.mamba.is_some() && cc.mamba_lock == 0
        };
        (swa, mamba)
    }

    /// Lock hook (after the full path lock of `id`, not the root).
    pub(super) fn hy_lock(&mut self, id: NodeId) {
        let Some(h) = &mut self.hy else { return };
        let mut receipt = 0;
        if h.window > 0 {
            let mut covered = 0usize;
            let mut cur = id;
            while cur != NodeId::ROOT && covered < h.window {
                let len = self.nodes[cur.idx()].key.len();
                let c = &mut h.comps[cur.idx()];
                if c.swa_lock == 0 && c.swa_live {
                    h.swa_evictable -= len;
                    h.swa_protected += len;
                }
                c.swa_lock += 1;
                covered += len;
                if covered >= h.window {
                    if c.swa_uuid == 0 {
                        c.swa_uuid = h.next_uuid;
                        h.next_uuid += 1;
                    }
                    receipt = c.swa_uuid;
                }
                cur = self.nodes[cur.idx()].parent;
            }
        }
        let c = &mut h.comps[id.idx()];
        c.receipts.push(receipt);
        if h.spec.mamba {
            if c.mamba_lock == 0 && c.mamba.is_some() {
                h.mamba_evictable -= 1;
                h.mamba_protected += 1;
            }
            c.mamba_lock += 1;
        }
    }

    /// Unlock hook (before the full path unlock of `id`, which holds an own lock).
    pub(super) fn hy_unlock(&mut self, id: NodeId) {
        let Some(h) = &mut self.hy else { return };
        let c = &mut h.comps[id.idx()];
        let receipt = c.receipts.pop().expect("one SWA receipt per own lock");
        if h.spec.mamba {
            c.mamba_lock -= 1;
            if c.mamba_lock == 0 && c.mamba.is_some() {
                h.mamba_evictable += 1;
                h.mamba_protected -= 1;
            }
        }
        if h.window > 0 {
            let mut cur = id;
            while cur != NodeId::ROOT {
                let len = self.nodes[cur.idx()].key.len();
                let c = &mut h.comps[cur.idx()];
                c.swa_lock = c.swa_lock.checked_sub(1).expect("the SWA segment mirrors its lock");
                if c.swa_lock == 0 && c.swa_live {
                    h.swa_evictable += len;
                    h.swa_protected -= len;
                }
                if receipt != 0 && c.swa_uuid == receipt {
                    break;
                }
                cur = self.nodes[cur.idx()].parent;
            }
        }
    }

    /// Checks an insert's component arguments before anything changes.
    pub(super) fn hy_check_insert(&self, tokens: usize, hi: &InsertOpts) -> KvResult<()> {
        let Some(h) = &self.hy else {
            if hi.mamba.is_some() {
                return Err(KvError::invalid("mamba_state given to a tree without a Mamba component"));
            }
            return Ok(());
        };
        if !hi.swa_evicted.is_multiple_of(self.page_size) {
            return Err(KvError::invalid(format!(
                "swa_evicted_len ({}) must be a multiple of page_size ({})",
                hi.swa_evicted, self.page_size
            )));
        }
        if h.spec.mamba {
            match hi.mamba {
                None if tokens > 0 => {
                    return Err(KvError::invalid(
                        "a tree with a Mamba component needs the mamba_state of an insert",
                    ))
                }
                Some(s) if h.states.contains(&s) => {
                    return Err(KvError::invalid(format!("mamba state {s} is already in the tree")))
                }
                _ => {}
            }
        } else if hi.mamba.is_some() {
            return Err(KvError::invalid("mamba_state given to a tree without a Mamba component"));
        }
        Ok(())
    }

    /// Whether the insert path (`self.path`, after its splits) holds an SWA
    /// tombstone ending past `swa_evicted` (else there is nothing to revive:
    /// the common case, O(depth)).
    pub(super) fn hy_tombstone_past(&self, swa_evicted: usize) -> bool {
        let Some(h) = self.hy.as_ref().filter(|h| h.swa()) else { return false };
        let mut end = 0;
        self.path.iter().any(|&(c, l)| {
            end += l;
            !h.comps[c.idx()].swa_live && end > swa_evicted
        })
    }

    /// Insert hook for the walked prefix (after its splits): revives the SWA
    /// tombstones the caller's pages cover past `swa_evicted`. `path` holds
    /// the matched nodes; `values` the caller's pages; `to_free` (from
    /// `dup_start`) the duplicates found, from which adopted pages are
    /// removed. Returns the possibly split path.
    pub(super) fn hy_insert_prefix(
        &mut self,
        path: &mut Vec<NodeId>,
        values: &[super::PageId],
        swa_evicted: usize,
        to_free: &mut Vec<PageId>,
        dup_start: usize,
        tick: u64,
    ) {
        let ps = self.page_size;
        if !self.hy.as_ref().is_some_and(|h| h.swa()) {
            return;
        }
        // The caller's own prefix: leading pages equal to the tree's.
        let mut protected_pages = 0usize;
        'outer: for &c in path.iter() {
            for (a, b) in self.nodes[c.idx()].value.iter().zip(&values[protected_pages..]) {
                if a != b {
                    break 'outer;
                }
                protected_pages += 1;
            }
        }
        let mut out: Vec<NodeId> = Vec::with_capacity(path.len());
        let mut start = 0usize;
        for &c in path.iter() {
            let end = start + self.nodes[c.idx()].key.len();
            let live = self.hy.as_ref().is_some_and(|h| h.comps[c.idx()].swa_live);
            if live || end <= protected_pages * ps || end <= swa_evicted {
                out.push(c);
                start = end;
                continue;
            }
            let live_start = start.max(swa_evicted);
            if live_start > start {
                let u = self.split(c, live_start - start, tick);
                out.push(u);
            }
            out.push(c);
            // Adopt the caller's pages for [live_start, end).
            let (p0, p1) = (live_start / ps, end / ps);
            let mine = &values[p0..p1];
            let locked = self.nodes[c.idx()].lock_ref > 0;
            let hy = self.hy.as_mut().expect("hybrid");
            if locked {
                // The node keeps its pages; the caller's go back full-only.
                for (&m, &t) in mine.iter().zip(&self.nodes[c.idx()].value) {
                    if m != t {
                        hy.freed.full_only.push(m);
                        hy.freed.swa_moved.push((m, t));
                        if let Some(pos) = to_free[dup_start..].iter().position(|&x| x == m) {
                            to_free.remove(dup_start + pos);
                        }
                    }
                }
            } else {
                let old = std::mem::replace(&mut self.nodes[c.idx()].value, mine.to_vec());
                for (&m, &t) in mine.iter().zip(&old) {
                    if m != t {
                        hy.freed.full_only.push(t);
                        hy.freed.adopted.push(m);
                        if let Some(pos) = to_free[dup_start..].iter().position(|&x| x == m) {
                            to_free.remove(dup_start + pos);
                        }
                    }
                }
                let (gone, came): (Vec<PageId>, Vec<PageId>) =
                    old.iter().zip(mine).filter(|(t, m)| t != m).map(|(t, m)| (*t, *m)).unzip();
                super::unmark_all(&mut self.in_tree, &gone);
                super::values::mark_all(&mut self.in_tree, &came)
                    .expect("validated duplicates are not in the tree");
            }
            self.hy_revive(c);
            start = end;
        }
        *path = out;
    }

    /// Insert hook for a new leaf (its SWA from `swa_evicted` on, capped to
    /// a window; `leaf_start` its first position) and the Mamba state of the
    /// node the insert ends on (`target`, a new leaf when `new_leaf`).
    pub(super) fn hy_insert_end(
        &mut self,
        target: NodeId,
        new_leaf: bool,
        leaf_start: usize,
        hi: &InsertOpts,
        tick: u64,
    ) {
        let ps = self.page_size;
        let Some(h) = &self.hy else { return };
        let (window, mamba) = (h.window, h.spec.mamba);
        if new_leaf && window > 0 {
            let end = leaf_start + self.nodes[target.idx()].key.len();
            if hi.swa_evicted < end {
                let live_start = leaf_start.max(hi.swa_evicted);
                if live_start > leaf_start {
                    self.split(target, live_start - leaf_start, tick);
                }
                let tail = window.div_ceil(ps) * ps;
                let len = end - live_start;
                if len > tail {
                    let u = self.split(target, len - tail, tick);
                    self.hy_revive(u);
                }
                self.hy_revive(target);
            }
        }
        if mamba && target != NodeId::ROOT {
            let s = hi.mamba.expect("checked: a Mamba insert brings its state");
            let has = self.hy.as_ref().is_some_and(|h| h.comps[target.idx()].mamba.is_some());
            if has {
                let h = self.hy.as_mut().expect("hybrid");
                h.freed.mamba_exist = true;
                h.mamba_lru.touch(target);
            } else {
                self.hy_set_state(target, s);
            }
        }
        self.hy_touch(target, false);
    }

    /// Evicts SWA KV until `num_tokens` SWA tokens are freed or no live SWA is
    /// unlocked: the least recent unlocked live node; a deletable leaf is
    /// deleted (its full pages appended to `freed`), an inner node becomes a
    /// tombstone and loses its Mamba state. Returns the SWA tokens freed; the
    /// component frees wait in [`RadixTree::take_hybrid_freed`].
    /// O(skipped locked nodes + removed nodes).
    pub fn evict_swa(&mut self, num_tokens: usize, freed: &mut Vec<PageId>) -> usize {
        let mut done = 0;
        while done < num_tokens {
            let Some(h) = &self.hy else { break };
            let Some(x) = h.swa_lru.oldest_where(|n| h.comps[n.idx()].swa_lock > 0) else { break };
            done += self.nodes[x.idx()].key.len();
            if self.nodes[x.idx()].evict_key.is_some() {
                self.remove_leaf(x, freed);
            } else {
                self.hy_tombstone(x);
                let unlocked = self.hy.as_ref().is_some_and(|h| h.comps[x.idx()].mamba_lock == 0);
                if unlocked {
                    self.hy_drop_state(x);
                }
            }
        }
        done
    }

    /// Evicts Mamba states until `num_states` are freed or none is unlocked:
    /// the least recent unlocked state; a deletable leaf is deleted (its full
    /// pages appended to `freed`), an inner node only loses its state.
    /// Returns the states freed. O(skipped locked nodes + removed nodes).
    pub fn evict_mamba(&mut self, num_states: usize, freed: &mut Vec<PageId>) -> usize {
        let mut done = 0;
        while done < num_states {
            let Some(h) = &self.hy else { break };
            let Some(x) = h.mamba_lru.oldest_where(|n| h.comps[n.idx()].mamba_lock > 0) else { break };
            done += 1;
            if self.nodes[x.idx()].evict_key.is_some() {
                self.remove_leaf(x, freed);
            } else {
                self.hy_drop_state(x);
            }
        }
        done
    }

    /// Reset hook: every component freed.
    pub(super) fn hy_clear(&mut self) {
        let Some(h) = &mut self.hy else { return };
        for (i, c) in h.comps.iter().enumerate() {
            if c.swa_live {
                h.freed.swa.extend_from_slice(&self.nodes[i].value);
            }
            if let Some(s) = c.mamba {
                h.freed.mamba.push(s);
            }
        }
        h.comps.iter_mut().for_each(|c| *c = Comp::default());
        h.swa_lru.clear();
        h.mamba_lru.clear();
        h.states.clear();
        h.swa_evictable = 0;
        h.swa_protected = 0;
        h.mamba_evictable = 0;
        h.mamba_protected = 0;
    }

    /// The component invariants (module docs).
    pub(super) fn hy_check(&self) -> Result<(), InvariantViolation> {
        let Some(h) = &self.hy else { return Ok(()) };
        let (mut se, mut sp, mut me, mut mp) = (0usize, 0usize, 0usize, 0usize);
        let mut states = FxHashSet::default();
        let (mut swa_n, mut mamba_n) = (0usize, 0usize);
        ensure_inv!(h.comps.len() >= self.nodes.len(), "component table shorter than the arena");
        let root = &h.comps[0];
        ensure_inv!(
            !root.swa_live && root.mamba.is_none() && root.swa_lock == 0 && root.receipts.len() == 0,
            "the root holds component data"
        );
        for (i, n) in self.nodes.iter().enumerate().skip(1) {
            let c = &h.comps[i];
            #[allow(clippy::cast_possible_truncation)]
            let id = NodeId(i as u32);
            if !n.live {
                ensure_inv!(
                    !c.swa_live && c.mamba.is_none() && c.swa_lock == 0 && c.mamba_lock == 0,
                    "free arena slot {i} holds component data"
                );
                continue;
            }
            ensure_inv!(h.window > 0 || (!c.swa_live && c.swa_lock == 0), "node {i}: SWA data without SWA");
            ensure_inv!(
                h.spec.mamba || (c.mamba.is_none() && c.mamba_lock == 0),
                "node {i}: Mamba data without Mamba"
            );
            ensure_inv!(c.swa_live == h.swa_lru.contains(id), "node {i}: SWA LRU membership");
            ensure_inv!(c.mamba.is_some() == h.mamba_lru.contains(id), "node {i}: Mamba LRU membership");
            ensure_inv!(
                c.swa_lock <= n.lock_ref,
                "node {i}: swa_lock {} > lock_ref {}",
                c.swa_lock,
                n.lock_ref
            );
            ensure_inv!(
                c.receipts.len() == n.own_locks as usize,
                "node {i}: {} SWA receipts for {} own locks",
                c.receipts.len(),
                n.own_locks
            );
            if h.spec.mamba {
                ensure_inv!(
                    c.mamba_lock == n.own_locks,
                    "node {i}: mamba_lock {} != own locks",
                    c.mamba_lock
                );
            }
            if c.swa_live {
                swa_n += 1;
                if c.swa_lock == 0 {
                    se += n.key.len();
                } else {
                    sp += n.key.len();
                }
            }
            if let Some(s) = c.mamba {
                mamba_n += 1;
                ensure_inv!(states.insert(s), "mamba state {s} held twice");
                if c.mamba_lock == 0 {
                    me += 1;
                } else {
                    mp += 1;
                }
            }
        }
        ensure_inv!(h.swa_lru.len == swa_n, "SWA LRU holds {} nodes, {swa_n} live", h.swa_lru.len);
        ensure_inv!(
            h.mamba_lru.len == mamba_n,
            "Mamba LRU holds {} nodes, {mamba_n} states",
            h.mamba_lru.len
        );
        ensure_inv!(h.swa_lru.order().len() == swa_n, "SWA LRU links broken");
        ensure_inv!(h.mamba_lru.order().len() == mamba_n, "Mamba LRU links broken");
        ensure_inv!(
            (se, sp) == (h.swa_evictable, h.swa_protected),
            "SWA sizes ({}, {}) but nodes hold ({se}, {sp})",
            h.swa_evictable,
            h.swa_protected
        );
        ensure_inv!(
            (me, mp) == (h.mamba_evictable, h.mamba_protected),
            "Mamba sizes ({}, {}) but nodes hold ({me}, {mp})",
            h.mamba_evictable,
            h.mamba_protected
        );
        ensure_inv!(states == h.states, "the state set differs from the nodes' states");
        Ok(())
    }
}
