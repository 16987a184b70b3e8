//! Unit tests of the hybrid components: SGLang scenarios (tombstones inside
//! and outside the window, revival, cascade, window locks, Mamba states) and
//! a randomised operation sequence keeping every invariant and conserving
//! pages and states.

use rustc_hash::FxHashSet;

use super::*;

fn hy(ps: usize, window: Option<usize>, mamba: bool) -> RadixTree {
    RadixTree::with_components(ps, Policy::Lru, false, Components { swa_window: window, mamba })
        .expect("valid components")
}

fn ins(t: &mut RadixTree, toks: &[i32], base: u32, hi: InsertOpts) -> (usize, Vec<PageId>, HybridFreed) {
    let pages = u32::try_from(toks.len() / t.page_size()).expect("small");
    let vals: Vec<PageId> = (base..base + pages).map(PageId).collect();
    let mut dups = Vec::new();
    let p = t.insert_hybrid(toks, &vals, None, 0, &[], &mut dups, &hi).expect("valid insert");
    let mut f = HybridFreed::default();
    t.take_hybrid_freed(&mut f);
    t.check_invariants().expect("invariants");
    (p, dups, f)
}

fn hit(t: &mut RadixTree, toks: &[i32]) -> (usize, Vec<PageId>, NodeId) {
    let mut out = Vec::new();
    let probe = t.probe(toks, None).len;
    let m = t.match_prefix(toks, None, &mut out);
    assert_eq!(probe, m.len, "probe agrees with match");
    t.check_invariants().expect("invariants");
    (m.len, out, m.node)
}

#[test]
fn swa_leaf_is_capped_to_a_window_and_tombstones_gate_matches() {
    let mut t = hy(1, Some(2), false);
    let s: Vec<i32> = (1..=8).collect();
    ins(&mut t, &s, 10, InsertOpts::default());
    // [1..6] live, [7 8] live: the lower part is one window.
    assert_eq!(t.num_nodes(), 2);
    assert_eq!(t.swa_sizes(), (8, 0));
    let mut freed = Vec::new();
    // The older (upper) node is SWA-evicted first: inner, so a tombstone.
    assert_eq!(t.evict_swa(1, &mut freed), 6);
    assert!(freed.is_empty());
    let mut f = HybridFreed::default();
    t.take_hybrid_freed(&mut f);
    assert_eq!(f.swa, (10..16).map(PageId).collect::<Vec<_>>());
    assert_eq!(t.swa_sizes(), (2, 0));
    t.check_invariants().expect("invariants");
    // The whole sequence hits: the last window is live.
    assert_eq!(hit(&mut t, &s).0, 8);
    // Ending inside the live window: only 1 live token after the tombstone.
    assert_eq!(hit(&mut t, &s[..7]).0, 0);
    // Ending on the tombstone: no.
    assert_eq!(hit(&mut t, &s[..6]).0, 0);
}

#[test]
fn swa_insert_past_the_evicted_prefix_revives_a_tombstone() {
    let mut t = hy(1, Some(2), false);
    let s: Vec<i32> = (1..=4).collect();
    // The caller freed the SWA of its first 4 tokens: all tombstone.
    ins(&mut t, &s, 10, InsertOpts { swa_evicted: 4, mamba: None, inserted_len: 0 });
    assert_eq!(t.swa_sizes(), (0, 0));
    assert_eq!(hit(&mut t, &s).0, 0);
    // Another request with live SWA from 2 on revives [3 4] with its pages.
    let (p, dups, f) = ins(&mut t, &s, 20, InsertOpts { swa_evicted: 2, mamba: None, inserted_len: 0 });
    assert_eq!(p, 4);
    assert_eq!(dups, vec![PageId(20), PageId(21)]);
    assert_eq!(f.full_only, vec![PageId(12), PageId(13)]);
    assert_eq!(t.swa_sizes(), (2, 0));
    let (len, vals, _) = hit(&mut t, &s);
    assert_eq!((len, vals), (4, vec![PageId(10), PageId(11), PageId(22), PageId(23)]));
}

#[test]
fn window_lock_protects_only_the_window() {
    let mut t = hy(1, Some(2), false);
    let s: Vec<i32> = (1..=8).collect();
    ins(&mut t, &s, 10, InsertOpts::default());
    let (_, _, node) = hit(&mut t, &s);
    t.lock(node);
    t.check_invariants().expect("invariants");
    assert_eq!(t.swa_sizes(), (6, 2));
    let mut freed = Vec::new();
    // The full path is locked, the window's SWA too; the rest can be tombstoned.
    assert_eq!(t.evict_swa(100, &mut freed), 6);
    assert_eq!(t.evict(100, &mut freed), 0);
    t.unlock(node).expect("locked");
    t.check_invariants().expect("invariants");
    assert_eq!(t.swa_sizes(), (2, 0));
    assert_eq!(t.evict(100, &mut freed), 8);
    let mut f = HybridFreed::default();
    t.take_hybrid_freed(&mut f);
    assert_eq!(f.swa.len(), 8);
    assert_eq!(t.total_size(), 0);
    t.check_invariants().expect("invariants");
}

#[test]
fn a_split_moves_the_window_boundary_up() {
    let mut t = hy(1, Some(3), false);
    let s: Vec<i32> = (1..=4).collect();
    ins(&mut t, &s, 10, InsertOpts::default());
    // [1] live, [2 3 4] live (one window).
    let (_, _, node) = hit(&mut t, &s);
    t.lock(node);
    // Split the window node inside: the boundary goes to the upper half.
    let mut q: Vec<i32> = s[..3].to_vec();
    q.push(99);
    hit(&mut t, &q);
    t.unlock(node).expect("locked");
    t.check_invariants().expect("invariants");
    assert_eq!(t.swa_sizes(), (4, 0));
}

#[test]
fn mamba_hits_end_at_the_deepest_state_and_cascade() {
    let mut t = hy(1, None, true);
    let a = [1, 2, 3, 4];
    let b = [1, 2, 3, 4, 5, 6];
    ins(&mut t, &a, 10, InsertOpts { swa_evicted: 0, mamba: Some(7), inserted_len: 0 });
    let (_, _, f) = ins(&mut t, &b, 20, InsertOpts { swa_evicted: 0, mamba: Some(8), inserted_len: 0 });
    assert!(!f.mamba_exist);
    assert_eq!(t.mamba_sizes(), (2, 0));
    assert_eq!(hit(&mut t, &[1, 2, 3, 4, 5, 6, 7]).0, 6);
    assert_eq!(hit(&mut t, &[1, 2, 3, 4, 5]).0, 4);
    // Splitting [1..4] at 2 leaves no state on the upper half.
    assert_eq!(hit(&mut t, &[1, 2, 9]).0, 0);
    // Re-inserting a present sequence: the tree keeps its state.
    let (_, _, f) = ins(&mut t, &a, 10, InsertOpts { swa_evicted: 0, mamba: Some(9), inserted_len: 0 });
    assert!(f.mamba_exist);
    // Using the longer sequence makes its state the most recent.
    assert_eq!(hit(&mut t, &b).0, 6);
    // Mamba eviction: the least recent state is [1..4]'s (an inner node):
    // only the state goes.
    let mut freed = Vec::new();
    assert_eq!(t.evict_mamba(1, &mut freed), 1);
    assert!(freed.is_empty());
    t.take_hybrid_freed(&mut HybridFreed::default());
    t.check_invariants().expect("invariants");
    assert_eq!(hit(&mut t, &[1, 2, 3, 4, 5]).0, 0);
    // Next: the leaf, deleted whole.
    assert_eq!(t.evict_mamba(1, &mut freed), 1);
    // (the earlier match split [5 6]: the state sits on [6])
    assert_eq!(freed, vec![PageId(25)]);
    t.check_invariants().expect("invariants");
}

#[test]
fn bad_component_arguments_change_nothing() {
    let mut t = hy(2, Some(4), true);
    let mut dups = Vec::new();
    let v = [PageId(1), PageId(2)];
    let toks = [1, 2, 3, 4];
    let bad = [
        InsertOpts { swa_evicted: 1, mamba: Some(1), inserted_len: 0 },
        InsertOpts { swa_evicted: 0, mamba: None, inserted_len: 0 },
    ];
    for hi in bad {
        assert!(t.insert_hybrid(&toks, &v, None, 0, &[], &mut dups, &hi).is_err());
        assert_eq!(t.total_size(), 0);
    }
    t.insert_hybrid(
        &toks,
        &v,
        None,
        0,
        &[],
        &mut dups,
        &InsertOpts { swa_evicted: 0, mamba: Some(1), inserted_len: 0 },
    )
    .expect("valid");
    let again = InsertOpts { swa_evicted: 0, mamba: Some(1), inserted_len: 0 };
    assert!(t.insert_hybrid(&[9, 9], &[PageId(5)], None, 0, &[], &mut dups, &again).is_err());
    let mut plain = RadixTree::new(1, Policy::Lru, false).expect("tree");
    assert!(plain.insert_hybrid(&[1], &[PageId(1)], None, 0, &[], &mut dups, &again).is_err());
    t.check_invariants().expect("invariants");
}

/// A tiny deterministic generator (no dependency on a seed crate).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[test]
#[allow(clippy::cast_possible_truncation)]
fn random_operations_keep_invariants_and_conserve() {
    for (seed, ps, window, mamba) in [
        (1u64, 1usize, Some(3usize), false),
        (2, 1, None, true),
        (3, 2, Some(3), true),
        (4, 2, Some(8), false),
        (5, 1, Some(1), true),
    ] {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mut t = hy(ps, window, mamba);
        let mut next_page = 1u32;
        let mut next_state = 1u32;
        // Caller-side accounting: pages the tree holds (full), their SWA.
        let mut locks: Vec<NodeId> = Vec::new();
        let mut freed_full: FxHashSet<PageId> = FxHashSet::default();
        let mut issued_full: FxHashSet<PageId> = FxHashSet::default();
        for _ in 0..600 {
            match rng.below(10) {
                0..=3 => {
                    let n = (rng.below(5) + 1) as usize * ps * 2;
                    let toks: Vec<i32> = (0..n).map(|_| rng.below(3) as i32).collect();
                    let mut vals = Vec::new();
                    let m = t.match_prefix(&toks, None, &mut vals);
                    let pages = toks.len() / ps;
                    for _ in vals.len()..pages {
                        vals.push(PageId(next_page));
                        issued_full.insert(PageId(next_page));
                        next_page += 1;
                    }
                    let e = (rng.below(n as u64 + 1) as usize) / ps * ps;
                    let hi = InsertOpts {
                        swa_evicted: e.max(m.len.min(e)),
                        mamba: mamba.then(|| {
                            next_state += 1;
                            next_state
                        }),
                        inserted_len: 0,
                    };
                    let mut dups = Vec::new();
                    t.insert_hybrid(&toks, &vals, None, 0, &[], &mut dups, &hi).expect("valid insert");
                    let mut f = HybridFreed::default();
                    t.take_hybrid_freed(&mut f);
                    for p in dups.iter().chain(&f.full_only) {
                        assert!(freed_full.insert(*p), "page {p:?} freed twice");
                    }
                }
                4 | 5 => {
                    let n = (rng.below(6) + 1) as usize * ps;
                    let toks: Vec<i32> = (0..n).map(|_| rng.below(3) as i32).collect();
                    let mut vals = Vec::new();
                    let m = t.match_prefix(&toks, None, &mut vals);
                    if rng.below(2) == 0 && m.node != NodeId::ROOT {
                        t.lock(m.node);
                        locks.push(m.node);
                    }
                }
                6 if !locks.is_empty() => {
                    let i = rng.below(locks.len() as u64) as usize;
                    let id = locks.swap_remove(i);
                    t.unlock(id).expect("held lock");
                }
                7 => {
                    let mut freed = Vec::new();
                    match rng.below(3) {
                        0 => t.evict(rng.below(6) as usize + 1, &mut freed),
                        1 => t.evict_swa(rng.below(6) as usize + 1, &mut freed),
                        _ => t.evict_mamba(rng.below(2) as usize + 1, &mut freed),
                    };
                    for p in freed {
                        assert!(freed_full.insert(p), "page {p:?} freed twice");
                    }
                    t.take_hybrid_freed(&mut HybridFreed::default());
                }
                8 if locks.is_empty() && rng.below(8) == 0 => {
                    let mut freed = Vec::new();
                    t.reset(&mut freed);
                    freed_full.extend(freed);
                    t.take_hybrid_freed(&mut HybridFreed::default());
                }
                _ => {}
            }
            t.check_invariants().unwrap_or_else(|e| panic!("seed {seed}: {e}\n{}", t.dump()));
            // Conservation: every issued page is in the tree or freed, not both.
            let mut in_tree = Vec::new();
            t.all_values(&mut in_tree);
            for p in &in_tree {
                assert!(!freed_full.contains(p), "seed {seed}: page {p:?} freed but in the tree");
            }
            assert_eq!(in_tree.len() + freed_full.len(), issued_full.len(), "seed {seed}: pages lost");
        }
    }
}

#[test]
fn layouts_map_onto_components_or_are_refused_by_name() {
    use crate::core::groups::spec::{GroupKind, GroupLayout, GroupSpec, LayoutOptions, MambaMode};
    let opt = LayoutOptions { enable_caching: true, ..LayoutOptions::default() };
    let g = |kind, block_size| GroupSpec { kind, block_size };
    let lay = |v: Vec<GroupSpec>| GroupLayout::new(v, opt).expect("valid layout");
    let full = GroupKind::FullAttention;
    let swa = GroupKind::SlidingWindow { window: 128 };
    let mamba = GroupKind::Mamba { mode: MambaMode::Align };
    assert_eq!(Components::from_layout(&lay(vec![g(full, 16)])).expect("full"), (16, Components::default()));
    assert_eq!(
        Components::from_layout(&lay(vec![g(full, 16), g(swa, 16)])).expect("gpt-oss"),
        (16, Components { swa_window: Some(128), mamba: false })
    );
    assert_eq!(
        Components::from_layout(&lay(vec![g(full, 16), g(mamba, 16)])).expect("qwen3-next"),
        (16, Components { swa_window: None, mamba: true })
    );
    // vLLM's several groups of one kind (layers split for page sizes) are one component.
    assert_eq!(
        Components::from_layout(&lay(vec![g(mamba, 16), g(mamba, 16), g(full, 16), g(swa, 16), g(swa, 16)]))
            .expect("one component per kind"),
        (16, Components { swa_window: Some(128), mamba: true })
    );
    for (v, why) in [
        (vec![g(full, 16), g(swa, 32)], "different block sizes"),
        (vec![g(swa, 16)], "no full-attention group"),
        (vec![g(full, 16), g(GroupKind::ChunkedLocal { chunk: 64 }, 16)], "chunked local"),
        (vec![g(full, 16), g(swa, 16), g(GroupKind::SlidingWindow { window: 64 }, 16)], "sliding windows"),
    ] {
        let e = Components::from_layout(&lay(v)).expect_err("refused");
        assert!(e.msg.contains(why) && e.msg.contains("block_size=16"), "{}", e.msg);
    }
}

#[test]
fn a_match_refreshes_only_the_hit_nodes() {
    // As SGLang's unified tree: the nodes a match walks past its hit keep
    // their recency, so they stay first in the full eviction order.
    let mut t = hy(1, Some(4), false);
    let s: Vec<i32> = (1..=8).collect();
    ins(&mut t, &s, 10, InsertOpts { swa_evicted: 6, ..InsertOpts::default() });
    let x: Vec<i32> = (20..28).collect();
    ins(&mut t, &x, 100, InsertOpts::default());
    // [1..6] is a tombstone and [7 8] one live window short: the walk passes both, hits 0.
    assert_eq!(hit(&mut t, &s).0, 0);
    let mut freed = Vec::new();
    assert_eq!(t.evict(1, &mut freed), 2);
    assert_eq!(freed, vec![PageId(16), PageId(17)]);
    t.check_invariants().expect("invariants");
}
