//! Fuzz harness for `RadixTree` on its own: match, insert (valid and invalid
//! values), lock/unlock by handle (stale, unknown, root, double unlock),
//! evict, reset, probe, namespaces, page sizes and policies.
//!
//! Input: `[page size][policy][flags]` then operations; see `fuzz/README.md`.
//! The harness keeps its own model of the values the tree owns and of the
//! locks taken per handle, and checks both after every operation together
//! with `check_invariants()`.

use std::collections::{BTreeSet, HashMap};

use kvindex::core::error::ErrorKind;
use kvindex::core::ids::PageId;
use kvindex::core::radix::{NodeHandle, NodeId, Policy, RadixTree, POLICY_NAMES};
use kvindex::core::radix_cache::narrow_tokens;

use crate::common::{assert_err, check_events, trace, Input, MAX_OPS};

/// Operation codes (`opcode byte % NUM_OPS`).
pub mod op {
    /// `[prompt][ns]`; a hit's node handle joins the handle list.
    pub const MATCH: u8 = 0;
    /// `[prompt][ns][priority][value mode][mode arg][extra]` (README).
    pub const INSERT: u8 = 1;
    /// `[handle index]`.
    pub const LOCK: u8 = 2;
    /// `[handle index]`.
    pub const UNLOCK: u8 = 3;
    /// `[tokens]`: 255 = usize::MAX, else `byte % 48`.
    pub const EVICT: u8 = 4;
    /// No argument.
    pub const RESET: u8 = 5;
    /// `[prompt][ns]`.
    pub const PROBE: u8 = 6;
    /// `[kind][8 bytes]`: push a raw handle (kind even) or a known handle with
    /// its generation bumped (kind odd).
    pub const RAW_HANDLE: u8 = 7;
    /// No argument.
    pub const TAKE_EVENTS: u8 = 8;
    /// No argument: paths of every handle, all values, sequences.
    pub const INTROSPECT: u8 = 9;
    /// Operation names, by code (for `KVINDEX_FUZZ_TRACE`).
    pub const NAMES: [&str; NUM_OPS as usize] = [
        "match",
        "insert",
        "lock",
        "unlock",
        "evict",
        "reset",
        "probe",
        "raw_handle",
        "take_events",
        "introspect",
    ];
    /// Number of operation codes.
    pub const NUM_OPS: u8 = 10;
}

/// Page size from its header byte (`% 8`): 1, 2, 4, 16, 0 (invalid), 3,
/// 2^20 + 1 (invalid), 1.
#[must_use]
pub fn page_size_of(b: u8) -> usize {
    [1, 2, 4, 16, 0, 3, (1 << 20) + 1, 1][usize::from(b % 8)]
}

/// Policy from its byte: `% 8` indexes `POLICY_NAMES` (7 = an unknown name,
/// which must be refused; LRU is used then); the SLRU threshold is
/// `(byte >> 3) % 4`.
#[must_use]
pub fn policy_of(b: u8) -> Policy {
    let i = usize::from(b % 8);
    let threshold = u64::from((b >> 3) % 4);
    match POLICY_NAMES.get(i) {
        Some(name) => {
            let p = Policy::parse(name, threshold).expect("known policy");
            assert_eq!(p.name(), *name);
            p
        }
        None => {
            let e = Policy::parse("lru ", threshold).expect_err("unknown policy name");
            assert_eq!(e.kind, ErrorKind::InvalidArgument);
            Policy::Lru
        }
    }
}

/// Namespace from its byte (`% 4`): none, "a", "b", "" (a namespace of its own).
#[must_use]
pub fn ns_of(b: u8) -> Option<&'static str> {
    [None, Some("a"), Some("b"), Some("")][usize::from(b % 4)]
}

/// Values the harness hands out are below this (the tree's value bitmap is
/// sized by the largest value), except [`BIG_VALUE`].
const VALUE_SPACE: u32 = 1 << 12;
/// One large value, to exercise the bitmap's growth.
const BIG_VALUE: u32 = 1 << 20;

/// Everything observable about the tree: dump, sequences, sorted values, locks.
type TreeState = (String, Vec<(Option<String>, Vec<i32>)>, Vec<PageId>, u64);

struct Harness {
    t: RadixTree,
    ps: usize,
    events: bool,
    /// Values the tree owns (model).
    owned: BTreeSet<u32>,
    /// Handles to lock/unlock: the root's, hits, raw ones.
    handles: Vec<NodeHandle>,
    /// Locks taken and not released, per handle (root excluded).
    locks: HashMap<u64, u32>,
    /// Next fresh value candidate.
    next: u32,
}

impl Harness {
    /// `n` values not in the tree and distinct.
    fn fresh(&mut self, n: usize) -> Vec<PageId> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            self.next = self.next % (VALUE_SPACE - 1) + 1;
            let v = PageId(self.next);
            if !self.owned.contains(&v.0) && !out.contains(&v) {
                out.push(v);
            }
        }
        out
    }

    fn sizes(&self) -> (usize, usize, usize, usize) {
        (self.t.total_size(), self.t.evictable_size(), self.t.protected_size(), self.t.num_nodes())
    }

    fn state(&self) -> TreeState {
        let mut vals = Vec::new();
        self.t.all_values(&mut vals);
        vals.sort_unstable();
        (self.t.dump(), self.t.sequences(), vals, self.t.num_own_locks())
    }

    fn check(&self) {
        if let Err(e) = self.t.check_invariants() {
            panic!("RadixTree::check_invariants: {e}\n{}", self.t.dump());
        }
        let (total, ev, prot, _) = self.sizes();
        assert_eq!(total, ev + prot, "total == evictable + protected");
        let mut vals = Vec::new();
        self.t.all_values(&mut vals);
        assert_eq!(vals.len() * self.ps, total, "one value per page");
        let vals: BTreeSet<u32> = vals.iter().map(|v| v.0).collect();
        assert_eq!(vals, self.owned, "the tree's values are those inserted and not freed");
        for v in self.owned.iter().take(8) {
            assert!(self.t.contains_value(PageId(*v)), "contains_value({v})");
        }
        let held: u64 = self.locks.values().map(|&n| u64::from(n)).sum();
        assert_eq!(self.t.num_own_locks(), held, "locks taken and not released");
        for (&h, &n) in &self.locks {
            if n > 0 {
                let id = self.t.resolve(NodeHandle(h)).expect("a locked node stays live");
                assert!(self.t.lock_ref(id) >= n, "lock_ref below own locks");
            }
        }
        assert_eq!(self.t.lock_ref(NodeId::ROOT), 1, "root lock_ref");
    }

    fn push_handle(&mut self, h: NodeHandle) {
        if self.handles.len() < 16 {
            self.handles.push(h);
        } else {
            #[allow(clippy::cast_possible_truncation)]
            let i = 1 + (h.0 as usize ^ (h.0 >> 32) as usize) % 15;
            self.handles[i] = h;
        }
    }

    /// Tokens for the tree: `None` (after checking `narrow_tokens` refuses
    /// them) when a token does not fit in `i32`.
    fn tokens(inp: &mut Input<'_>) -> Option<Vec<i32>> {
        let t = inp.prompt();
        match narrow_tokens(&t) {
            Ok(v) => Some(v),
            Err(e) => {
                assert!(t.iter().any(|&x| i32::try_from(x).is_err()), "narrow_tokens refused {t:?}");
                assert_eq!(e.kind, ErrorKind::InvalidArgument);
                None
            }
        }
    }
}

/// Runs one fuzz input.
pub fn run(data: &[u8]) {
    let mut inp = Input::new(data);
    let ps = page_size_of(inp.u8());
    let policy = policy_of(inp.u8());
    let flags = inp.u8();
    let events = flags & 1 != 0;
    if flags & 2 != 0 && (1..=1 << 20).contains(&ps) {
        // Hybrid components (SWA / Mamba): their own harness.
        crate::radix_hybrid::run(ps, policy, flags, &mut inp);
        return;
    }
    let t = match RadixTree::new(ps, policy, events) {
        Ok(t) => {
            assert!((1..=1 << 20).contains(&ps), "RadixTree::new accepted page size {ps}");
            t
        }
        Err(e) => {
            assert!(!(1..=1 << 20).contains(&ps), "RadixTree::new refused page size {ps}: {e:?}");
            assert_eq!(e.kind, ErrorKind::InvalidArgument);
            return;
        }
    };
    assert_eq!((t.page_size(), t.policy(), t.events().enabled()), (ps, policy, events));
    let root = t.handle(NodeId::ROOT);
    assert_eq!(root, NodeHandle(0), "the root's handle is 0");
    let mut h = Harness {
        t,
        ps,
        events,
        owned: BTreeSet::new(),
        handles: vec![root, NodeHandle(1), NodeHandle(u64::MAX)],
        locks: HashMap::new(),
        next: 0,
    };
    if trace() {
        eprintln!("RadixTree::new({ps}, {}, events={events})", policy.name());
    }
    h.check();
    for _ in 0..MAX_OPS {
        if inp.is_empty() {
            break;
        }
        let code = inp.peek() % op::NUM_OPS;
        step(&mut h, &mut inp);
        if trace() {
            eprintln!(
                "{:<12} sizes {:?} locks {:?} handles {:?}\n{}",
                op::NAMES[usize::from(code)],
                h.sizes(),
                h.locks,
                h.handles,
                h.t.dump()
            );
        }
        h.check();
    }
    // Wind down: release every lock, evict everything, reset.
    let locked: Vec<(u64, u32)> = h.locks.drain().collect();
    for (hd, n) in locked {
        for _ in 0..n {
            h.t.unlock_handle(NodeHandle(hd)).expect("unlock of a held lock");
        }
    }
    let total = h.t.total_size();
    let mut freed = Vec::new();
    assert_eq!(h.t.evict(usize::MAX, &mut freed), total, "with no lock everything is evictable");
    for v in &freed {
        assert!(h.owned.remove(&v.0), "evict freed value {} the tree did not own", v.0);
    }
    assert_eq!(h.t.num_nodes(), 0);
    h.check();
    h.t.reset(&mut freed);
    h.check();
}

#[allow(clippy::too_many_lines)]
fn step(h: &mut Harness, inp: &mut Input<'_>) {
    let ps = h.ps;
    let sizes = h.sizes();
    match inp.u8() % op::NUM_OPS {
        op::MATCH => {
            let tokens = Harness::tokens(inp);
            let ns = ns_of(inp.u8());
            let Some(tokens) = tokens else { return };
            let probe = h.t.probe(&tokens, ns);
            let seqs = h.t.sequences();
            let mut out = vec![PageId(u32::MAX)]; // match appends after existing entries
            let m = h.t.match_prefix(&tokens, ns, &mut out);
            assert_eq!(out[0], PageId(u32::MAX), "match_prefix overwrote the caller's entries");
            assert_eq!(m.len, probe.len, "probe and match agree");
            assert!(m.len.is_multiple_of(ps) && m.len <= tokens.len(), "hit {} of {}", m.len, tokens.len());
            assert_eq!((out.len() - 1) * ps, m.len, "one value per matched page");
            assert_eq!(h.t.path_len(m.node), m.len, "path_len of the hit node");
            let mut path = Vec::new();
            h.t.path_values(m.node, &mut path);
            assert_eq!(path[..], out[1..], "path_values of the hit node");
            let after = h.sizes();
            assert_eq!((sizes.0, sizes.1, sizes.2), (after.0, after.1, after.2), "a match changes no size");
            assert!(after.3 == sizes.3 || after.3 == sizes.3 + 1, "a match splits at most one edge");
            assert_eq!(seqs, h.t.sequences(), "a match changes no sequence");
            if m.node == NodeId::ROOT {
                assert_eq!(m.len, 0);
            } else {
                let hd = h.t.handle(m.node);
                assert_eq!(h.t.resolve(hd), Ok(m.node));
                h.push_handle(hd);
            }
        }
        op::INSERT => insert(h, inp),
        op::LOCK => {
            let hd = h.handles[usize::from(inp.u8()) % h.handles.len()];
            let live = h.t.resolve(hd);
            let before = h.state();
            let res = h.t.lock_handle(hd);
            match live {
                Ok(id) => {
                    res.expect("lock of a live node");
                    if id != NodeId::ROOT {
                        *h.locks.entry(hd.0).or_default() += 1;
                        assert!(h.t.protected_size() >= h.t.path_len(id), "a locked path is protected");
                    } else {
                        assert_eq!(h.state(), before, "locking the root is a no-op");
                    }
                }
                Err(_) => {
                    assert_err(&res, ErrorKind::StaleHandle);
                    assert_eq!(h.state(), before, "a refused lock changed the tree");
                }
            }
        }
        op::UNLOCK => {
            let hd = h.handles[usize::from(inp.u8()) % h.handles.len()];
            let live = h.t.resolve(hd);
            let before = h.state();
            let res = h.t.unlock_handle(hd);
            let held = h.locks.get(&hd.0).copied().unwrap_or(0);
            match live {
                Ok(id) if id == NodeId::ROOT => {
                    res.expect("unlocking the root is a no-op");
                    assert_eq!(h.state(), before, "unlocking the root is a no-op");
                }
                Ok(_) if held > 0 => {
                    res.expect("unlock of a held lock");
                    h.locks.insert(hd.0, held - 1);
                }
                Ok(_) => {
                    assert_err(&res, ErrorKind::Lock);
                    assert_eq!(h.state(), before, "a refused unlock changed the tree");
                }
                Err(_) => {
                    assert_eq!(held, 0, "a locked node went stale");
                    assert_err(&res, ErrorKind::StaleHandle);
                    assert_eq!(h.state(), before, "a refused unlock changed the tree");
                }
            }
        }
        op::EVICT => {
            let k = match inp.u8() {
                255 => usize::MAX,
                b => usize::from(b) % 48,
            };
            let mut freed = vec![PageId(u32::MAX)];
            let got = h.t.evict(k, &mut freed);
            assert_eq!(freed[0], PageId(u32::MAX), "evict overwrote the caller's entries");
            assert_eq!((freed.len() - 1) * ps, got, "evict returns whole pages");
            assert!(got >= k.min(sizes.1), "evicted {got} of {k} wanted, {} evictable", sizes.1);
            assert_eq!(h.t.total_size(), sizes.0 - got);
            assert_eq!(h.t.protected_size(), sizes.2, "evict never touches locked nodes");
            for v in &freed[1..] {
                assert!(h.owned.remove(&v.0), "evict freed value {} the tree did not own", v.0);
                assert!(!h.t.contains_value(*v));
            }
        }
        op::RESET => {
            let mut freed = Vec::new();
            h.t.reset(&mut freed);
            assert_eq!(freed.len() * ps, sizes.0, "reset frees every value");
            let freed: BTreeSet<u32> = freed.iter().map(|v| v.0).collect();
            assert_eq!(freed, h.owned, "reset frees exactly the tree's values");
            h.owned.clear();
            h.locks.clear();
            assert_eq!((h.t.total_size(), h.t.num_nodes(), h.t.num_own_locks()), (0, 0, 0));
            // old handles stay in the list: they are stale now
        }
        op::PROBE => {
            let tokens = Harness::tokens(inp);
            let ns = ns_of(inp.u8());
            let Some(tokens) = tokens else { return };
            let before = h.state();
            let clock = h.t.clock();
            let p = h.t.probe(&tokens, ns);
            assert!(p.len.is_multiple_of(ps) && p.len <= tokens.len());
            assert!(p.lockable <= h.t.evictable_size() && p.lockable <= p.len, "probe {p:?}");
            assert_eq!((h.state(), h.t.clock()), (before, clock), "probe changed the tree");
            let mut copy = h.t.clone();
            let mut out = Vec::new();
            let m = copy.match_prefix(&tokens, ns, &mut out);
            assert_eq!(m.len, p.len, "probe agrees with a match");
            let locked_before = copy.protected_size();
            copy.lock(m.node);
            assert_eq!(copy.protected_size() - locked_before, p.lockable, "probe's lockable tokens");
        }
        op::RAW_HANDLE => {
            let kind = inp.u8();
            let raw = inp.u64();
            let hd = if kind & 1 == 0 {
                NodeHandle(raw)
            } else {
                #[allow(clippy::cast_possible_truncation)]
                let base = h.handles[raw as usize % h.handles.len()];
                NodeHandle(base.0.wrapping_add(1 << 32)) // next generation: stale
            };
            h.push_handle(hd);
        }
        op::TAKE_EVENTS => {
            let ev = h.t.events_mut().take();
            check_events(&ev, h.events, ps);
            assert!(h.t.events_mut().take().is_empty(), "events drained twice");
        }
        _ => {
            // INTROSPECT
            for &hd in &h.handles {
                if let Ok(id) = h.t.resolve(hd) {
                    assert_eq!(h.t.handle(id), hd, "resolve/handle round trip");
                    let mut vals = Vec::new();
                    h.t.path_values(id, &mut vals);
                    assert_eq!(vals.len() * ps, h.t.path_len(id));
                    assert!(vals.iter().all(|v| h.t.contains_value(*v)));
                }
            }
            let seqs = h.t.sequences();
            assert!(seqs.len() <= h.t.num_nodes() && seqs.len() >= usize::from(h.t.num_nodes() > 0));
            assert!(h.t.num_evictable_leaves() <= seqs.len());
            for (ns, s) in &seqs {
                assert!(!s.is_empty() && s.len() % ps == 0);
                assert_eq!(h.t.probe(s, ns.as_deref()).len, s.len(), "a cached sequence hits fully");
            }
        }
    }
}

/// `[prompt][ns][priority][mode][arg][extra]`. Value modes (`mode % 6`):
/// 0 fresh ascending, 1 fresh descending, 2 the tree's own values for the
/// prefix (from a match) then fresh, 3 one byte per value (`arg` ignored;
/// small values that often collide with the tree's), 4 fresh but one value
/// too many or too few (invalid), 5 an ascending run from `arg * 8` (may
/// overlap the tree's). Mode bit 3 (of the mode byte) keeps the tokens
/// unaligned (invalid unless they happen to be aligned). `extra % 4`: 0-1
/// none, 2 one fresh extra value, 3 one of the tree's values as extra
/// (invalid) or [`BIG_VALUE`] when the tree is empty.
fn insert(h: &mut Harness, inp: &mut Input<'_>) {
    let ps = h.ps;
    let tokens = Harness::tokens(inp);
    let ns = ns_of(inp.u8());
    let priority = match inp.u8() as i8 {
        127 => i64::MAX,
        -128 => i64::MIN,
        p => i64::from(p),
    };
    let mode = inp.u8();
    let arg = inp.u8();
    let extra_kind = inp.u8() % 4;
    let Some(mut tokens) = tokens else { return };
    if mode & 8 == 0 {
        tokens.truncate(tokens.len() / ps * ps);
    }
    let pages = tokens.len() / ps;
    // What the tree holds for this sequence now, without touching it.
    let mut copy = h.t.clone();
    let mut tree_vals = Vec::new();
    let aligned = tokens.len() % ps == 0;
    let prefix = if aligned { copy.match_prefix(&tokens, ns, &mut tree_vals).len } else { 0 };
    drop(copy);
    let values: Vec<PageId> = match mode % 6 {
        0 => h.fresh(pages),
        1 => {
            let mut v = h.fresh(pages);
            v.sort_unstable_by(|a, b| b.cmp(a));
            v
        }
        2 => {
            let mut v = tree_vals.clone();
            v.extend(h.fresh(pages.saturating_sub(v.len())));
            v.truncate(pages);
            v
        }
        3 => (0..pages).map(|_| PageId(u32::from(inp.u8()))).collect(),
        4 => h.fresh(if arg & 1 == 0 { pages + 1 } else { pages.saturating_sub(1) }),
        _ => (0..pages).map(|i| PageId(u32::from(arg) * 8 + u32::try_from(i).expect("few pages"))).collect(),
    };
    let extra: Vec<PageId> = match extra_kind {
        2 => {
            let mut e = h.fresh(1 + pages);
            e.retain(|v| !values.contains(v));
            e.truncate(1);
            e
        }
        3 => vec![h.owned.iter().next().map_or(PageId(BIG_VALUE), |&v| PageId(v))],
        _ => Vec::new(),
    };
    // The expected outcome.
    let mut expect_ok = aligned && values.len() == pages;
    let mut dups = Vec::new();
    if expect_ok {
        dups =
            values[..prefix / ps].iter().zip(&tree_vals).filter(|(v, t)| v != t).map(|(v, _)| *v).collect();
        let mut all: Vec<u32> =
            dups.iter().chain(&values[prefix / ps..]).chain(&extra).map(|v| v.0).collect();
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        expect_ok = all.len() == n && all.iter().all(|v| !h.owned.contains(v));
    }
    let before = h.state();
    let total_before = h.t.total_size();
    let mut to_free = vec![PageId(u32::MAX - 1)]; // entries already there must survive
    let res = h.t.insert(&tokens, &values, ns, priority, &extra, &mut to_free);
    assert_eq!(to_free[0], PageId(u32::MAX - 1), "insert dropped the caller's to_free entries");
    match res {
        Ok(p) => {
            assert!(expect_ok, "insert accepted {values:?} (extra {extra:?}) for {} tokens", tokens.len());
            assert_eq!(p, prefix, "insert's prefix == the hit before");
            assert_eq!(to_free[1..], dups[..], "duplicates handed back");
            assert_eq!(h.t.total_size(), total_before + tokens.len() - p, "insert grows by the new part");
            for v in &values[p / ps..] {
                assert!(h.owned.insert(v.0), "value {} stored twice", v.0);
            }
            for v in dups.iter().chain(&extra) {
                assert!(!h.t.contains_value(*v), "a value handed back is the tree's");
            }
            if !tokens.is_empty() {
                assert_eq!(h.t.probe(&tokens, ns).len, tokens.len(), "an inserted sequence hits fully");
            }
        }
        Err(e) => {
            assert!(!expect_ok, "insert refused a valid insert: {e:?}");
            assert_eq!(e.kind, ErrorKind::InvalidArgument);
            assert_eq!(to_free.len(), 1, "insert left duplicates in to_free on error");
            assert_eq!(h.state(), before, "a refused insert changed the tree");
        }
    }
}
