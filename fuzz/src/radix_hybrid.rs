//! Fuzz harness for `RadixTree` with hybrid components (SWA KV with
//! tombstones, Mamba state per node): the `radix_tree` target runs it when
//! bit 1 of its flags byte is set.
//!
//! Input after the `radix_tree` header (`[page size][policy][flags]`):
//! operations `[op % 7]` then arguments: match `[prompt]`, insert
//! `[prompt][swa evicted]`, lock / unlock `[handle index]`, evict
//! `[kind % 3 (full, SWA, Mamba)][count]`, reset, probe `[prompt]`. Flags:
//! bit 0 events, bit 1 hybrid, bits 2-4 the SWA window (0: no SWA, else
//! `1 + 3 * (bits - 1)`), bit 5 Mamba (a hybrid without either gets SWA 2).
//!
//! The harness keeps its own model of the pages and states the tree holds
//! and checks it, conservation (nothing handed back is the tree's, nothing
//! freed twice) and `check_invariants()` after every operation; the wind-down
//! unlocks everything and evicts all, leaving every size at 0.

use std::collections::BTreeSet;

use kvindex::core::ids::PageId;
use kvindex::core::radix::{Components, HybridFreed, InsertOpts, NodeId, Policy, RadixTree};

use crate::common::{Input, MAX_OPS};

struct Harness {
    t: RadixTree,
    ps: usize,
    /// Pages the tree holds (model).
    owned: BTreeSet<u32>,
    /// Mamba states the tree holds (model).
    states: BTreeSet<u32>,
    /// Locks held (node ids; nodes stay live while locked).
    locks: Vec<NodeId>,
    /// Handles seen (node ids of hits, possibly stale).
    hits: Vec<NodeId>,
    next_page: u32,
    next_state: u32,
}

impl Harness {
    fn tree_values(&self) -> BTreeSet<u32> {
        let mut v = Vec::new();
        self.t.all_values(&mut v);
        v.iter().map(|p| p.0).collect()
    }

    fn check(&self) {
        if let Err(e) = self.t.check_invariants() {
            panic!("check_invariants: {e}\n{}", self.t.dump());
        }
        assert_eq!(self.tree_values(), self.owned, "the tree's pages are those the model says");
        let (me, mp) = self.t.mamba_sizes();
        assert_eq!(me + mp, self.states.len(), "the tree's states are those the model says");
        assert_eq!(self.t.num_own_locks(), self.locks.len() as u64, "locks taken and not released");
    }

    fn frees(&mut self) -> HybridFreed {
        let mut f = HybridFreed::default();
        self.t.take_hybrid_freed(&mut f);
        for s in &f.mamba {
            assert!(self.states.remove(s), "state {s} freed but not the tree's");
        }
        f
    }

    fn tokens(inp: &mut Input<'_>) -> Vec<i32> {
        inp.prompt().iter().map(|&t| i32::try_from(t.rem_euclid(1 << 20)).expect("small")).collect()
    }
}

/// Runs the hybrid harness on a tree of `ps` / `policy` (valid) with `flags`.
pub fn run(ps: usize, policy: Policy, flags: u8, inp: &mut Input<'_>) {
    let bits = (flags >> 2) & 7;
    let mut comps =
        Components { swa_window: (bits > 0).then(|| 1 + 3 * usize::from(bits - 1)), mamba: flags & 32 != 0 };
    if !comps.any() {
        comps.swa_window = Some(2);
    }
    let t = RadixTree::with_components(ps, policy, flags & 1 != 0, comps).expect("valid components");
    assert_eq!(t.components(), comps);
    let mut h = Harness {
        t,
        ps,
        owned: BTreeSet::new(),
        states: BTreeSet::new(),
        locks: Vec::new(),
        hits: Vec::new(),
        next_page: 1,
        next_state: 1,
    };
    h.check();
    for _ in 0..MAX_OPS {
        if inp.is_empty() {
            break;
        }
        step(&mut h, inp);
        h.check();
    }
    while let Some(id) = h.locks.pop() {
        h.t.unlock(id).expect("a held lock");
    }
    let mut freed = Vec::new();
    let total = h.t.total_size();
    assert_eq!(h.t.evict(usize::MAX, &mut freed), total, "with no lock everything is evictable");
    h.frees();
    for v in &freed {
        assert!(h.owned.remove(&v.0), "evict freed page {} the tree did not hold", v.0);
    }
    h.check();
    assert_eq!((h.t.num_nodes(), h.t.swa_sizes(), h.t.mamba_sizes()), (0, (0, 0), (0, 0)));
}

fn step(h: &mut Harness, inp: &mut Input<'_>) {
    let ps = h.ps;
    match inp.u8() % 7 {
        0 | 6 => {
            let toks = Harness::tokens(inp);
            let probe = h.t.probe(&toks, None);
            let mut out = Vec::new();
            let m = h.t.match_prefix(&toks, None, &mut out);
            assert_eq!(m.len, probe.len, "probe agrees with match");
            assert_eq!(out.len() * ps, m.len);
            assert_eq!(h.t.path_len(m.node), m.len);
            let f = h.frees();
            assert!(
                f.swa.is_empty() && f.full_only.is_empty() && f.mamba.is_empty(),
                "a match frees nothing"
            );
            if m.node != NodeId::ROOT {
                h.hits.push(m.node);
                if h.hits.len() > 16 {
                    h.hits.remove(0);
                }
            }
        }
        1 => {
            let mut toks = Harness::tokens(inp);
            let evicted = usize::from(inp.u8());
            toks.truncate(toks.len() / ps * ps);
            let mut vals = Vec::new();
            let m = h.t.clone().match_prefix(&toks, None, &mut vals).len;
            let _ = m;
            while vals.len() < toks.len() / ps {
                vals.push(PageId(h.next_page));
                h.next_page += 1;
            }
            let hi = InsertOpts {
                swa_evicted: evicted.min(toks.len()) / ps * ps,
                mamba: h.t.components().mamba.then(|| {
                    h.next_state += 1;
                    h.next_state
                }),
                inserted_len: 0,
            };
            let mut dups = Vec::new();
            h.t.insert_hybrid(&toks, &vals, None, 0, &[], &mut dups, &hi).expect("a valid insert");
            let f = h.frees();
            let after = h.tree_values();
            for v in dups.iter().chain(&f.full_only) {
                assert!(!after.contains(&v.0), "page {} handed back but still the tree's", v.0);
            }
            let gone: BTreeSet<u32> = f.full_only.iter().map(|p| p.0).collect();
            let back: BTreeSet<u32> = dups.iter().chain(&f.full_only).map(|p| p.0).collect();
            let mut want: BTreeSet<u32> = h.owned.difference(&gone).copied().collect();
            want.extend(vals.iter().map(|p| p.0).filter(|v| !back.contains(v)));
            assert_eq!(after, want, "insert keeps exactly the pages it did not hand back");
            h.owned = after;
            if let Some(s) = hi.mamba {
                if !toks.is_empty() && !f.mamba_exist {
                    h.states.insert(s);
                }
            }
        }
        2 => {
            if let Some(&id) = h.hits.get(usize::from(inp.u8()) % h.hits.len().max(1)) {
                if h.t.resolve(h.t.handle(id)).is_ok() && h.t.path_len(id) > 0 {
                    h.t.lock(id);
                    h.locks.push(id);
                }
            }
        }
        3 => {
            if !h.locks.is_empty() {
                let i = usize::from(inp.u8()) % h.locks.len();
                let id = h.locks.swap_remove(i);
                h.t.unlock(id).expect("a held lock");
            }
        }
        4 => {
            let kind = inp.u8() % 3;
            let n = usize::from(inp.u8() % 24) + 1;
            let mut freed = Vec::new();
            match kind {
                0 => h.t.evict(n, &mut freed),
                1 => h.t.evict_swa(n, &mut freed),
                _ => h.t.evict_mamba(n, &mut freed),
            };
            let f = h.frees();
            for v in &freed {
                assert!(h.owned.remove(&v.0), "evict freed page {} the tree did not hold", v.0);
            }
            for v in &f.swa {
                assert!(
                    h.owned.contains(&v.0) || freed.contains(v),
                    "SWA of page {} freed, not the tree's",
                    v.0
                );
            }
            assert!(f.full_only.is_empty(), "eviction frees no full-only pages");
        }
        _ => {
            if h.locks.is_empty() {
                let mut freed = Vec::new();
                h.t.reset(&mut freed);
                let f = h.frees();
                let _ = f;
                let freed: BTreeSet<u32> = freed.iter().map(|p| p.0).collect();
                assert_eq!(freed, h.owned, "reset frees exactly the tree's pages");
                h.owned.clear();
                h.hits.clear();
                assert!(h.states.is_empty(), "reset frees every state");
            }
        }
    }
}
