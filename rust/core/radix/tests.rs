//! Unit tests (seed examples, SGLang scenarios) and a proptest of random
//! operation sequences against a naive oracle.

use proptest::prelude::*;

use super::*;

fn b(v: &[u32]) -> Vec<PageId> {
    v.iter().map(|&x| PageId(x)).collect()
}

fn tree(ps: usize) -> RadixTree {
    RadixTree::new(ps, Policy::Lru, false).expect("valid page size")
}

/// Inserts with values `base..base + pages`; returns the prefix length.
fn ins(t: &mut RadixTree, toks: &[i32], ns: Option<&str>, base: u32) -> usize {
    let pages = u32::try_from(toks.len() / t.page_size()).expect("small");
    let vals: Vec<PageId> = (base..base + pages).map(PageId).collect();
    let mut dups = Vec::new();
    t.insert(toks, &vals, ns, 0, &[], &mut dups).expect("valid insert")
}

fn hit(t: &mut RadixTree, toks: &[i32], ns: Option<&str>) -> (usize, Vec<PageId>, NodeId) {
    let mut out = Vec::new();
    let m = t.match_prefix(toks, ns, &mut out);
    (m.len, out, m.node)
}

#[test]
fn seed_split_example() {
    let mut t = tree(1);
    assert_eq!(ins(&mut t, &[1, 2, 3, 4, 5, 6], None, 10), 0);
    assert_eq!(ins(&mut t, &[1, 2, 3, 7, 8, 9], None, 20), 3);
    t.check_invariants().expect("invariants");
    assert_eq!(t.num_nodes(), 3);
    let root_kids = t.children_of(NodeId::ROOT);
    assert_eq!(root_kids.len(), 1);
    let abc = root_kids[0];
    assert_eq!(t.nodes[abc.idx()].key, vec![1, 2, 3]);
    let mut kids: Vec<Vec<i32>> = t.children_of(abc).iter().map(|c| t.nodes[c.idx()].key.clone()).collect();
    kids.sort();
    assert_eq!(kids, vec![vec![4, 5, 6], vec![7, 8, 9]]);
    // The shared prefix keeps the first insert's values.
    assert_eq!(hit(&mut t, &[1, 2, 3, 7, 8, 9], None).1, b(&[10, 11, 12, 23, 24, 25]));
    assert_eq!(t.total_size(), 9);
}

#[test]
fn match_nodes_lists_the_matched_values_across_a_split() {
    let mut t = tree(4);
    let a: Vec<i32> = (0..16).collect();
    ins(&mut t, &a, None, 100); // one edge, pages 100..104
    let mut q: Vec<i32> = (0..8).collect(); // ends inside the edge: splits it
    q.extend([-1, -2, -3, -4, -5]);
    let nodes_before = t.num_nodes();
    let m = t.match_nodes(&q, None);
    let (len, node) = (m.len, m.node);
    let vals: Vec<PageId> = m.values().flatten().copied().collect();
    assert_eq!((len, vals), (8, b(&[100, 101])));
    assert_eq!(t.num_nodes(), nodes_before + 1, "the match split the edge");
    assert_eq!(t.nodes[node.idx()].key, (0..8).collect::<Vec<i32>>());
    // Same answers as match_prefix on the split tree; a miss lists nothing.
    assert_eq!(hit(&mut t, &q, None).1, b(&[100, 101]));
    assert_eq!(t.match_nodes(&[7, 7, 7, 7], None).values().count(), 0);
    assert_eq!(t.match_nodes(&q, Some("other")).values().count(), 0);
    assert_eq!(t.match_nodes(&q[..3], None).values().count(), 0, "shorter than a page");
    t.check_invariants().expect("invariants");
}

#[test]
fn shared_100_tokens_page_sizes() {
    for (ps, want) in [(1, 100), (16, 96)] {
        let mut t = tree(ps);
        let mut a: Vec<i32> = (0..100).collect();
        let mut c = a.clone();
        a.extend([1000, 1001, 1002, 1003, 1004, 1005, 1006, 1007, 1008, 1009, 1010, 1011]);
        c.extend([2000, 2001, 2002, 2003, 2004, 2005, 2006, 2007, 2008, 2009, 2010, 2011]);
        let a = &a[..a.len() / ps * ps];
        ins(&mut t, a, None, 0);
        assert_eq!(hit(&mut t, &c, None).0, want, "page_size {ps}");
        t.check_invariants().expect("invariants");
    }
}

#[test]
fn lru_order_and_locked_path_survives() {
    let mut t = tree(1);
    ins(&mut t, &[1, 2, 3], None, 0);
    ins(&mut t, &[4, 5, 6], None, 10);
    ins(&mut t, &[7, 8, 9], None, 20);
    hit(&mut t, &[1, 2, 3], None); // [1 2 3] is now the most recent
    let mut freed = Vec::new();
    assert_eq!(t.evict(1, &mut freed), 3);
    assert_eq!(freed, b(&[10, 11, 12]));
    freed.clear();
    assert_eq!(t.evict(1, &mut freed), 3);
    assert_eq!(freed, b(&[20, 21, 22]));
    // A locked path survives; its unlocked parent chain stays matchable.
    ins(&mut t, &[1, 2, 3, 4, 5], None, 30);
    let (_, _, leaf) = hit(&mut t, &[1, 2, 3, 4, 5], None);
    t.lock(leaf);
    assert_eq!(t.protected_size(), 5);
    freed.clear();
    assert_eq!(t.evict(100, &mut freed), 0);
    assert_eq!(hit(&mut t, &[1, 2, 3, 4, 5], None).0, 5);
    t.unlock(leaf).expect("locked");
    assert_eq!(t.evict(100, &mut freed), 5, "cascade: leaf then parent in one call");
    assert_eq!(t.total_size(), 0);
    t.check_invariants().expect("invariants");
}

#[test]
fn match_mid_edge_splits_and_keeps_lock() {
    let mut t = tree(1);
    ins(&mut t, &[1, 2, 3, 4, 5, 6, 7, 8], None, 0);
    let (_, _, n) = hit(&mut t, &[1, 2, 3, 4, 5, 6, 7, 8], None);
    t.lock(n);
    let (len, vals, upper) = hit(&mut t, &[1, 2, 3, 4, 999], None);
    assert_eq!((len, vals), (4, b(&[0, 1, 2, 3])));
    assert_eq!(t.lock_ref(upper), 1, "split node keeps the lock count");
    assert_eq!((t.total_size(), t.protected_size(), t.evictable_size()), (8, 8, 0));
    t.check_invariants().expect("invariants");
    t.unlock(n).expect("locked");
    assert!(t.unlock(n).is_err(), "double unlock is refused");
    assert_eq!(t.evictable_size(), 8);
    t.check_invariants().expect("invariants");
}

#[test]
fn insert_strict_prefix_splits_and_reinsert_is_noop() {
    let mut t = tree(1);
    ins(&mut t, &[1, 2, 3], None, 0);
    assert_eq!(ins(&mut t, &[1, 2], None, 10), 2);
    assert_eq!(t.num_nodes(), 2);
    assert_eq!(ins(&mut t, &[1, 2, 3], None, 20), 3);
    assert_eq!(t.num_nodes(), 2);
    assert_eq!(t.total_size(), 3);
    t.check_invariants().expect("invariants");
}

#[test]
fn duplicates_are_returned_and_tree_values_refused() {
    let mut t = tree(1);
    ins(&mut t, &[1, 2, 3], None, 0);
    let mut dups = Vec::new();
    // Prefix values equal to the tree's are not duplicates; differing ones are.
    let p = t.insert(&[1, 2, 3, 4], &b(&[0, 50, 2, 51]), None, 0, &[], &mut dups).expect("valid");
    assert_eq!((p, dups.clone()), (3, b(&[50])));
    // A value the tree holds elsewhere, or one passed twice, is refused.
    let before = t.dump();
    dups.clear();
    assert!(t.insert(&[9, 9], &b(&[1, 60]), None, 0, &[], &mut dups).is_err());
    assert!(t.insert(&[9, 9], &b(&[60, 60]), None, 0, &[], &mut dups).is_err());
    assert!(t.insert(&[1, 2, 3, 4, 5], &b(&[70, 2, 1, 51, 71]), None, 0, &[], &mut dups).is_err());
    assert!(dups.is_empty());
    assert_eq!(t.dump(), before, "state unchanged on error");
    t.check_invariants().expect("invariants");
}

#[test]
fn namespaces_isolate() {
    let mut t = tree(1);
    ins(&mut t, &[1, 2, 3], Some("key1"), 0);
    ins(&mut t, &[1, 2, 3], Some("key2"), 10);
    ins(&mut t, &[1, 2, 3], None, 20);
    assert_eq!(hit(&mut t, &[1, 2, 3], Some("key1")).1, b(&[0, 1, 2]));
    assert_eq!(hit(&mut t, &[1, 2, 3], Some("key2")).1, b(&[10, 11, 12]));
    assert_eq!(hit(&mut t, &[1, 2, 3], None).1, b(&[20, 21, 22]));
    assert_eq!(hit(&mut t, &[1, 2, 3], Some("nope")).0, 0);
    assert_eq!(hit(&mut t, &[1, 2, 3], Some("")).0, 0, "\"\" is its own namespace");
    t.check_invariants().expect("invariants");
    let mut freed = Vec::new();
    t.evict(usize::MAX, &mut freed);
    assert_eq!(t.ns.ids.len(), 0, "namespace ids are recycled once empty");
    t.check_invariants().expect("invariants");
}

#[test]
fn page_alignment() {
    for (ps, len) in [(1, 5), (2, 5), (4, 6)] {
        let mut t = tree(ps);
        let toks: Vec<i32> = (1..=len).collect();
        let al = &toks[..toks.len() / ps * ps];
        ins(&mut t, al, None, 0);
        let (h, _, _) = hit(&mut t, &toks, None);
        assert_eq!(h % ps, 0);
        assert_eq!(h, al.len());
    }
    // Shorter than a page: 0 and nothing touched.
    let mut t = tree(4);
    ins(&mut t, &[1, 2, 3, 4], None, 0);
    let clock = t.clock();
    assert_eq!(hit(&mut t, &[1, 2, 3], None).0, 0);
    assert_eq!(t.clock(), clock);
    let mut dups = Vec::new();
    assert!(t.insert(&[1, 2, 3], &b(&[0]), None, 0, &[], &mut dups).is_err(), "unaligned key");
    assert!(t.insert(&[1, 2, 3, 4], &b(&[0, 1]), None, 0, &[], &mut dups).is_err(), "wrong value count");
}

#[test]
fn sglang_split_scenarios() {
    for ps in [1usize, 2] {
        let mut t = tree(ps);
        let a: Vec<i32> = (1..=8).collect();
        ins(&mut t, &a, None, 100);
        ins(&mut t, &[1, 2, 9, 10], None, 200);
        assert_eq!(t.total_size(), 10);
        let (h, v, _) = hit(&mut t, &[1, 2, 3, 4, 999, 1000], None);
        assert_eq!(h, 4);
        let want: Vec<u32> = (100..100 + u32::try_from(4 / ps).expect("small")).collect();
        assert_eq!(v, b(&want));
        assert_eq!(t.total_size(), 10);
        assert_eq!(hit(&mut t, &a, None).0, 8);
        assert_eq!(hit(&mut t, &[1, 2, 3, 4, 5, 6, 777, 888], None).0, 6);
        assert_eq!(hit(&mut t, &[1, 2, 9, 10], None).0, 4);
        t.check_invariants().expect("invariants");
    }
}

#[test]
fn policies_order() {
    // Three leaves under the root with different access patterns.
    let run = |p: Policy| {
        let mut t = RadixTree::new(1, p, false).expect("ok");
        ins(&mut t, &[1, 1], None, 0); // created 1
        ins(&mut t, &[2, 2], None, 10); // created 2
        ins(&mut t, &[3, 3], None, 20); // created 3
        ins(&mut t, &[2, 2], None, 30); // [2 2] hit twice
        hit(&mut t, &[1, 1], None); // [1 1] most recent
        let mut order = Vec::new();
        for _ in 0..3 {
            let mut f = Vec::new();
            t.evict(1, &mut f);
            order.push(f[0].0 / 10);
        }
        order
    };
    assert_eq!(run(Policy::Lru), vec![2, 1, 0]);
    assert_eq!(run(Policy::Mru), vec![0, 1, 2]);
    assert_eq!(run(Policy::Fifo), vec![0, 1, 2]);
    assert_eq!(run(Policy::Filo), vec![2, 1, 0]);
    assert_eq!(run(Policy::Lfu), vec![2, 0, 1]);
    assert_eq!(run(Policy::Slru { threshold: 2 }), vec![2, 0, 1]);
    // Priority: lower first, then LRU.
    let mut t = RadixTree::new(1, Policy::Priority, false).expect("ok");
    let mut d = Vec::new();
    t.insert(&[1], &b(&[1]), None, 5, &[], &mut d).expect("ok");
    t.insert(&[2], &b(&[2]), None, -1, &[], &mut d).expect("ok");
    t.insert(&[3], &b(&[3]), None, 5, &[], &mut d).expect("ok");
    let mut f = Vec::new();
    t.evict(3, &mut f);
    assert_eq!(f, b(&[2, 1, 3]));
}

#[test]
fn reset_sorted_hands_back_the_reset_values_in_ascending_order() {
    for ps in [1, 4] {
        let (mut a, mut b) = (tree(ps), tree(ps));
        // Values out of order across nodes (and above one bitmap word).
        for base in [300, 5, 70] {
            let toks: Vec<i32> = (0..8).map(|k| base + k).collect();
            let v = u32::try_from(base).expect("small");
            ins(&mut a, &toks, None, v);
            ins(&mut b, &toks, None, v);
        }
        let (mut plain, mut sorted) = (Vec::new(), Vec::new());
        a.reset(&mut plain);
        b.reset_sorted(&mut sorted);
        plain.sort_unstable();
        assert_eq!(sorted, plain);
        assert_eq!(sorted.len(), 3 * 8 / ps);
        assert_eq!(a.total_size(), b.total_size());
        assert_eq!(b.num_nodes(), 0);
        b.check_invariants().expect("invariants");
    }
}

#[test]
fn handles_go_stale() {
    let mut t = tree(1);
    ins(&mut t, &[1, 2], None, 0);
    let (_, _, n) = hit(&mut t, &[1, 2], None);
    let h = t.handle(n);
    assert_eq!(t.resolve(h), Ok(n));
    assert_eq!(t.handle(NodeId::ROOT), NodeHandle(0));
    let mut f = Vec::new();
    t.evict(1, &mut f);
    assert_eq!(t.resolve(h).map_err(|e| e.kind), Err(ErrorKind::StaleHandle));
    ins(&mut t, &[3, 4], None, 10); // reuses the arena slot
    assert!(t.resolve(h).is_err(), "a reused slot has a new generation");
    let (_, _, n2) = hit(&mut t, &[3, 4], None);
    let h2 = t.handle(n2);
    t.reset(&mut f);
    assert!(t.resolve(h2).is_err());
    assert_eq!(t.resolve(NodeHandle(0)), Ok(NodeId::ROOT));
    t.check_invariants().expect("invariants");
}

/// A subscriber's view of one cache's event stream: each hash announced and
/// not yet removed, with its announcement count (as the cluster index counts
/// repeated announcements by one worker).
#[derive(Default)]
struct Folded(rustc_hash::FxHashMap<u64, u32>);

impl Folded {
    /// Applies drained events; an error names a removal of a hash not held.
    fn apply(&mut self, events: Vec<KvEvent>) -> Result<(), String> {
        for ev in events {
            match ev {
                KvEvent::BlockStored { block_hashes, .. } => {
                    for h in block_hashes {
                        *self.0.entry(h).or_default() += 1;
                    }
                }
                KvEvent::BlockRemoved { block_hashes } => {
                    for h in block_hashes {
                        let n = self.0.get_mut(&h).ok_or_else(|| format!("removal of {h:#x}, not held"))?;
                        *n -= 1;
                        if *n == 0 {
                            self.0.remove(&h);
                        }
                    }
                }
                KvEvent::AllBlocksCleared => self.0.clear(),
            }
        }
        Ok(())
    }

    /// The held hashes, ascending.
    fn sorted(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.0.keys().copied().collect();
        v.sort_unstable();
        v
    }
}

#[test]
fn cached_page_hashes_list_what_the_events_announced() {
    let mut t = RadixTree::new(2, Policy::Lru, true).expect("ok");
    assert_eq!(t.cached_page_hashes(), Ok(vec![]));
    ins(&mut t, &[1, 2, 3, 4, 5, 6], None, 0);
    ins(&mut t, &[1, 2, 3, 4, 7, 8], None, 10); // splits [1 2 3 4 | 5 6]
    ins(&mut t, &[1, 2], Some("n"), 20);
    let mut sub = Folded::default();
    sub.apply(t.events_mut().take()).expect("consistent stream");
    let listed = t.cached_page_hashes().expect("events on");
    assert_eq!(listed.len(), 5, "one hash per cached page");
    assert_eq!(listed, sub.sorted());
    // Read-only: no tick, no event.
    let clock = t.clock();
    assert_eq!(t.cached_page_hashes().expect("events on"), listed);
    assert_eq!((t.clock(), t.events_mut().take()), (clock, vec![]));
    let mut freed = Vec::new();
    t.evict(2, &mut freed);
    sub.apply(t.events_mut().take()).expect("consistent stream");
    assert_eq!(t.cached_page_hashes().expect("events on"), sub.sorted());
    assert_eq!(sub.sorted().len(), 4);
    t.reset(&mut freed);
    sub.apply(t.events_mut().take()).expect("consistent stream");
    assert_eq!(t.cached_page_hashes(), Ok(vec![]));
    // Events off: no hashes exist, so the listing is refused (nothing changes).
    let mut off = tree(2);
    ins(&mut off, &[1, 2], None, 0);
    let err = off.cached_page_hashes().expect_err("events off");
    assert_eq!(err.kind, ErrorKind::InvalidArgument);
    assert_eq!(off.total_size(), 2);
}

#[test]
fn events_chain_and_split() {
    let mut t = RadixTree::new(4, Policy::Lru, true).expect("ok");
    let toks = [1, 2, 3, 4, 1, 2, 3, 4];
    ins(&mut t, &toks, None, 0);
    let ev = t.events_mut().take();
    let KvEvent::BlockStored { block_hashes, parent_block_hash, token_ids, block_size, .. } = &ev[0] else {
        panic!("expected BlockStored")
    };
    assert_eq!(block_hashes.len(), 2);
    assert_ne!(block_hashes[0], block_hashes[1], "repeated pages hash differently");
    assert_eq!((*parent_block_hash, token_ids.len(), *block_size), (None, 8, 4));
    let first = block_hashes.clone();
    // Split at the page boundary, then a new branch: its parent is page 0.
    ins(&mut t, &[1, 2, 3, 4, 9, 9, 9, 9], None, 10);
    let ev = t.events_mut().take();
    let KvEvent::BlockStored { parent_block_hash, .. } = &ev[0] else { panic!("expected BlockStored") };
    assert_eq!(*parent_block_hash, Some(first[0]));
    t.check_invariants().expect("invariants");
    // Namespaces seed the chain differently.
    let mut u = RadixTree::new(4, Policy::Lru, true).expect("ok");
    ins(&mut u, &toks, Some("k"), 0);
    let ev = u.events_mut().take();
    let KvEvent::BlockStored { block_hashes, .. } = &ev[0] else { panic!("expected BlockStored") };
    assert_ne!(block_hashes[0], first[0]);
    let mut f = Vec::new();
    u.evict(1, &mut f);
    assert!(
        matches!(&u.events_mut().take()[0], KvEvent::BlockRemoved { block_hashes } if block_hashes.len() == 2)
    );
    u.reset(&mut f);
    assert_eq!(u.events_mut().take(), vec![KvEvent::AllBlocksCleared]);
}

#[test]
fn colliding_children_share_a_list() {
    FORCE_COLLISIONS.with(|c| c.set(true));
    for ps in [1usize, 2] {
        let mut t = tree(ps);
        ins(&mut t, &[1, 2, 5, 5], None, 0);
        ins(&mut t, &[3, 4, 6, 6], None, 10);
        ins(&mut t, &[7, 8, 7, 7], None, 20);
        assert_eq!(t.nodes[0].children.len(), 1, "one key, one list");
        assert_eq!(t.children_of(NodeId::ROOT).len(), 3);
        assert_eq!(hit(&mut t, &[3, 4, 6, 6], None).0, 4);
        assert_eq!(hit(&mut t, &[3, 4, 6, 9], None).0, if ps == 1 { 3 } else { 2 });
        t.check_invariants().expect("invariants");
        let mut f = Vec::new();
        t.evict(1, &mut f);
        t.evict(1, &mut f);
        t.check_invariants().expect("invariants");
        assert_eq!(t.children_of(NodeId::ROOT).len(), 1);
    }
    FORCE_COLLISIONS.with(|c| c.set(false));
}

#[test]
fn page_size_many_children_share_first_token() {
    let mut t = tree(2);
    ins(&mut t, &[1, 2, 5, 5], None, 0);
    ins(&mut t, &[1, 3, 6, 6], None, 10);
    ins(&mut t, &[1, 4, 7, 7], None, 20);
    assert_eq!(t.children_of(NodeId::ROOT).len(), 3);
    assert_eq!(hit(&mut t, &[1, 3, 6, 6], None).1, b(&[10, 11]));
    assert_eq!(hit(&mut t, &[1, 9, 6, 6], None).0, 0);
    t.check_invariants().expect("invariants");
    let mut f = Vec::new();
    t.evict(2, &mut f);
    t.check_invariants().expect("invariants");
    assert_eq!(t.children_of(NodeId::ROOT).len(), 2);
}

#[test]
fn common_prefix_lengths() {
    let a: Vec<i32> = (0..1000).collect();
    for cut in [0usize, 1, 15, 16, 17, 63, 64, 65, 200, 999] {
        let mut c = a.clone();
        c[cut] = -1;
        assert_eq!(common_prefix(&a, &c), cut);
    }
    assert_eq!(common_prefix(&a, &a), 1000);
    assert_eq!(common_prefix(&a[..10], &a), 10);
}

// ---------------------------------------------------------------- proptest

#[derive(Clone, Debug)]
enum Op {
    Match(Vec<i32>, u8),
    Insert(Vec<i32>, u8, i8),
    Lock(usize),
    Unlock(usize),
    Evict(usize),
    Reset,
}

fn op() -> impl Strategy<Value = Op> {
    let seq = proptest::collection::vec(0i32..3, 0..14);
    prop_oneof![
        4 => (seq.clone(), 0u8..3).prop_map(|(s, n)| Op::Match(s, n)),
        5 => (seq, 0u8..3, -2i8..3).prop_map(|(s, n, p)| Op::Insert(s, n, p)),
        2 => (0usize..8).prop_map(Op::Lock),
        2 => (0usize..8).prop_map(Op::Unlock),
        2 => (0usize..12).prop_map(Op::Evict),
        1 => Just(Op::Reset),
    ]
}

fn ns_of(n: u8) -> Option<&'static str> {
    [None, Some("a"), Some("b")][n as usize]
}

/// Longest page-aligned common prefix of `q` with any cached sequence of `ns`.
fn oracle_hit(seqs: &[(Option<String>, Vec<i32>)], q: &[i32], ns: Option<&str>, ps: usize) -> usize {
    let q = &q[..q.len() / ps * ps];
    seqs.iter()
        .filter(|(n, _)| n.as_deref() == ns)
        .map(|(_, s)| common_prefix(s, q) / ps * ps)
        .max()
        .unwrap_or(0)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn random_ops_keep_invariants(ps in prop_oneof![Just(1usize), Just(2), Just(4)],
                                  policy in 0usize..7,
                                  collide in proptest::bool::weighted(0.3),
                                  ops in proptest::collection::vec(op(), 1..60)) {
        FORCE_COLLISIONS.with(|c| c.set(collide));
        let policy = Policy::parse(evict::POLICY_NAMES[policy], 2).expect("known");
        let mut t = RadixTree::new(ps, policy, true).expect("ok");
        let mut next = 1u32;
        // Handles we matched: (handle, path tokens, namespace); locks we hold per handle.
        let mut handles: Vec<(NodeHandle, Vec<i32>, Option<&str>)> = Vec::new();
        let mut locks: rustc_hash::FxHashMap<NodeHandle, u32> = rustc_hash::FxHashMap::default();
        let mut sub = Folded::default();
        for op in ops {
            let seqs = t.sequences();
            let sizes = (t.total_size(), t.evictable_size(), t.protected_size());
            match op {
                Op::Match(q, n) => {
                    let ns = ns_of(n);
                    let want = oracle_hit(&seqs, &q, ns, ps);
                    let mut out = Vec::new();
                    let m = t.match_prefix(&q, ns, &mut out);
                    prop_assert_eq!(m.len, want);
                    prop_assert_eq!(out.len() * ps, m.len);
                    prop_assert_eq!(t.path_len(m.node), m.len);
                    prop_assert_eq!(sizes, (t.total_size(), t.evictable_size(), t.protected_size()));
                    prop_assert_eq!(&seqs, &t.sequences());
                    if m.node != NodeId::ROOT && handles.len() < 8 {
                        handles.push((t.handle(m.node), q[..m.len].to_vec(), ns));
                    }
                }
                Op::Insert(s, n, prio) => {
                    let ns = ns_of(n);
                    let al = &s[..s.len() / ps * ps];
                    let want = oracle_hit(&seqs, al, ns, ps);
                    let vals: Vec<PageId> = (0..al.len() / ps).map(|i| PageId(next + u32::try_from(i).expect("small"))).collect();
                    next += 100;
                    let mut dups = Vec::new();
                    let p = t.insert(al, &vals, ns, i64::from(prio), &[], &mut dups).expect("fresh values");
                    prop_assert_eq!(p, want);
                    prop_assert_eq!(&dups[..], &vals[..p / ps], "fresh values in the prefix are duplicates");
                    prop_assert_eq!(t.total_size(), sizes.0 + al.len() - p);
                    prop_assert_eq!(oracle_hit(&t.sequences(), al, ns, ps), al.len());
                }
                Op::Lock(i) => {
                    if let Some(h) = handles.get(i) {
                        if t.lock_handle(h.0).is_ok() {
                            *locks.entry(h.0).or_default() += 1;
                        }
                    }
                }
                Op::Unlock(i) => {
                    if let Some(h) = handles.get(i) {
                        let held = locks.entry(h.0).or_default();
                        match t.unlock_handle(h.0) {
                            Ok(()) => { prop_assert!(*held > 0); *held -= 1; }
                            Err(e) => prop_assert!(
                                *held == 0 && matches!(e.kind, ErrorKind::StaleHandle | ErrorKind::Lock)
                            ),
                        }
                    }
                }
                Op::Evict(k) => {
                    let ev = t.evictable_size();
                    let mut freed = Vec::new();
                    let got = t.evict(k, &mut freed);
                    prop_assert!(got >= k.min(ev));
                    prop_assert_eq!(freed.len() * ps, got);
                    prop_assert_eq!(t.total_size(), sizes.0 - got);
                    prop_assert_eq!(t.protected_size(), sizes.2);
                    for v in &freed {
                        prop_assert!(!t.contains_value(*v));
                    }
                }
                Op::Reset => {
                    let mut freed = Vec::new();
                    t.reset(&mut freed);
                    prop_assert_eq!(freed.len() * ps, sizes.0);
                    handles.clear();
                    locks.clear();
                }
            }
            t.check_invariants().map_err(|e| TestCaseError::fail(e.to_string()))?;
            // The listing is what a subscriber of the stream holds.
            sub.apply(t.events_mut().take()).map_err(TestCaseError::fail)?;
            prop_assert_eq!(t.cached_page_hashes().expect("events on"), sub.sorted());
            // Every locked path stays matchable (reference invariant 12).
            for (h, path, ns) in &handles {
                if locks.get(h).copied().unwrap_or(0) > 0 {
                    prop_assert!(t.resolve(*h).is_ok());
                    prop_assert_eq!(t.probe(path, *ns).len, path.len());
                }
            }
        }
    }
}

// ------------------------------------------------- request-level radix cache

mod request_cache {
    use proptest::prelude::*;

    use crate::core::hash::KeySpec;
    use crate::core::ids::{PageId, RequestId};
    use crate::core::radix::Policy;
    use crate::core::radix_cache::RadixPrefixCache;
    use crate::core::tables::TableSource;

    fn cache(pages: usize, ps: usize) -> RadixPrefixCache {
        RadixPrefixCache::new(pages, ps, Policy::Lru, true).expect("valid")
    }

    fn ok(c: &RadixPrefixCache) {
        c.check_invariants().expect("invariants");
    }

    #[test]
    fn lifecycle_hits_after_finish() {
        for ps in [1usize, 4] {
            let mut c = cache(64, ps);
            let spec = KeySpec::default();
            let p: Vec<i32> = (0..20).collect();
            assert_eq!(c.admit(RequestId(1), &p, &spec, false).expect("ok"), Some(0));
            assert!(c.append(RequestId(1), &[100, 101, 102]).expect("ok"));
            ok(&c);
            c.free(RequestId(1)).expect("ok");
            ok(&c);
            // Full pages of prompt + output are cached; the hit stops at n - 1.
            let mut q = p.clone();
            q.extend([100, 101, 102, 7]);
            let want = (q.len() - 1) / ps * ps;
            assert_eq!(c.lookup(&q, &spec).expect("ok"), want.min(23 / ps * ps));
            assert_eq!(c.admit(RequestId(2), &q, &spec, false).expect("ok"), Some(want.min(23 / ps * ps)));
            ok(&c);
            // Identical prompt: capped at n - 1.
            assert_eq!(c.admit(RequestId(3), &p, &spec, false).expect("ok"), Some(19 / ps * ps));
            ok(&c);
            c.free_batch(&[2, 3]).expect("ok");
            ok(&c);
            assert_eq!(c.num_requests(), 0);
        }
    }

    #[test]
    fn eviction_inside_admit_and_none_when_locked() {
        let mut c = cache(11, 1); // 10 usable slots
        let spec = KeySpec::default();
        assert_eq!(c.admit(RequestId(1), &[1, 2, 3, 4, 5, 6], &spec, false).expect("ok"), Some(0));
        c.free(RequestId(1)).expect("ok");
        assert_eq!(c.pool().num_free(), 4);
        assert_eq!(c.num_free_blocks(), 10);
        // Needs 8: evicts the cached leaf.
        assert_eq!(c.admit(RequestId(2), &[9, 9, 9, 9, 9, 9, 9, 9], &spec, false).expect("ok"), Some(0));
        ok(&c);
        assert_eq!(c.tree().total_size(), 0);
        // 2 free, none evictable: a 3-token prompt does not fit; nothing changes.
        let before = c.tree().dump();
        assert_eq!(c.admit(RequestId(3), &[5, 5, 5], &spec, false).expect("ok"), None);
        assert_eq!(c.tree().dump(), before);
        assert!(!c.append(RequestId(2), &[1, 2, 3]).expect("ok"));
        assert!(c.append(RequestId(2), &[1, 2]).expect("ok"));
        ok(&c);
    }

    #[test]
    fn checkpoint_inserts_only_what_the_hash_chain_has_cached() {
        use crate::core::request::StepOpts;
        let spec = KeySpec::default();
        let p: Vec<i32> = (0..9).collect();
        // A delay_cache admission: its external pages hold no KV until finish_transfer.
        let mut c = cache(32, 2);
        let wait = StepOpts { external_prefix: 8, delay_cache: true, ..StepOpts::default() };
        c.admit_chunk(RequestId(1), &p, &spec, false, &wait).expect("ok").expect("fits");
        c.checkpoint(RequestId(1)).expect("ok");
        ok(&c);
        assert_eq!(c.lookup(&p, &spec).expect("ok"), 0, "nothing hittable before the transfer");
        c.finish_transfer(RequestId(1)).expect("waiting");
        assert_eq!(c.lookup(&p, &spec).expect("ok"), 8);
        ok(&c);
        // A page a commit completes is cached at the next schedule (vLLM), not at once.
        let mut c = cache(32, 2);
        c.admit_chunk(RequestId(2), &p[..5], &spec, false, &StepOpts::default()).expect("ok").expect("fits");
        assert!(c.schedule(RequestId(2), 1, &[], 0, 0).expect("ok").is_some(), "ahead of its id");
        c.commit_tokens(RequestId(2), &[5i32], 0).expect("fills the placeholder");
        c.checkpoint(RequestId(2)).expect("ok");
        assert_eq!(c.lookup(&p[..7], &spec).expect("ok"), 4);
        c.schedule(RequestId(2), 1, &[], 0, 0).expect("ok");
        assert_eq!(c.lookup(&p[..7], &spec).expect("ok"), 6);
        ok(&c);
    }

    #[test]
    fn checkpoint_shares_running_prompt() {
        let mut c = cache(32, 2);
        let spec = KeySpec::default();
        let p: Vec<i32> = (0..9).collect();
        c.admit(RequestId(1), &p, &spec, false).expect("ok");
        assert_eq!(c.lookup(&p, &spec).expect("ok"), 0);
        c.checkpoint(RequestId(1)).expect("ok");
        ok(&c);
        assert_eq!(c.num_cached_tokens(RequestId(1)).expect("ok"), 8);
        assert_eq!(c.admit(RequestId(2), &p, &spec, false).expect("ok"), Some(8));
        assert_eq!(c.blocks(RequestId(2)).expect("ok")[..4], c.blocks(RequestId(1)).expect("ok")[..4]);
        ok(&c);
        // A duplicate computed meanwhile is swapped for the tree's page.
        c.admit(RequestId(3), &p, &spec, true).expect("ok");
        let own: Vec<PageId> = c.blocks(RequestId(3)).expect("ok").to_vec();
        c.checkpoint(RequestId(3)).expect("ok");
        ok(&c);
        assert_eq!(c.blocks(RequestId(3)).expect("ok")[..4], c.blocks(RequestId(1)).expect("ok")[..4]);
        assert!(own[..4].iter().all(|p| c.pool().ref_count(*p) == 0), "duplicates returned to the pool");
        c.free_batch(&[1, 2, 3]).expect("ok");
        ok(&c);
    }

    #[test]
    fn namespaces_and_errors() {
        let mut c = cache(32, 1);
        let salt = KeySpec::new(None, Some("s".into()), vec![]).expect("ok");
        let none = KeySpec::default();
        c.admit(RequestId(1), &[1, 2, 3, 4], &salt, false).expect("ok");
        c.free(RequestId(1)).expect("ok");
        assert_eq!(c.lookup(&[1, 2, 3, 4, 5], &salt).expect("ok"), 4);
        assert_eq!(c.lookup(&[1, 2, 3, 4, 5], &none).expect("ok"), 0);
        let empty_salt = KeySpec::new(None, Some(String::new()), vec![]).expect("ok");
        assert_eq!(c.lookup(&[1, 2, 3, 4, 5], &empty_salt).expect("ok"), 0, "empty salt == no salt");
        assert!(c.admit(RequestId(5), &[], &none, false).is_err());
        c.admit(RequestId(5), &[1], &none, false).expect("ok");
        assert!(c.admit(RequestId(5), &[1], &none, false).is_err());
        assert!(c.free(RequestId(6)).is_err());
        assert!(c.reset().is_err());
        c.free(RequestId(5)).expect("ok");
        assert!(c.free(RequestId(5)).is_err(), "double free");
        c.reset().expect("ok");
        ok(&c);
        assert_eq!(c.pool().num_free(), 31);
    }

    #[test]
    fn skip_reading_refusal_needs_every_page() {
        // The cached prefix [2, 0, 0, 0] would leave 1 page to allocate, but a
        // `skip_reading` admission hits nothing and needs all 5 of the 4 free pages.
        let mut c = cache(10, 1);
        let spec = KeySpec::default();
        c.admit(RequestId(0), &[2, 0], &spec, false).expect("ok");
        assert!(c.append(RequestId(0), &[0, 0, 0]).expect("ok"));
        c.checkpoint(RequestId(0)).expect("ok");
        let s = [2, 0, 0, 0, 0];
        assert_eq!(c.lookup(&s, &spec).expect("ok"), 4);
        assert_eq!(c.pool().num_free(), 4);
        assert_eq!(c.admit(RequestId(1), &s, &spec, true).expect("ok"), None);
        assert_eq!(c.pool().num_free(), 4, "nothing changed");
        assert_eq!(c.admit(RequestId(1), &s, &spec, false).expect("ok"), Some(4));
        ok(&c);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Admit(Vec<i32>, bool, bool),
        Append(usize, Vec<i32>),
        Checkpoint(usize),
        Free(usize),
        Evict(usize),
        Reset,
    }

    fn op() -> impl Strategy<Value = Op> {
        let seq = proptest::collection::vec(0i32..3, 1..16);
        prop_oneof![
            4 => (seq.clone(), any::<bool>(), proptest::bool::weighted(0.1)).prop_map(|(s, n, k)| Op::Admit(s, n, k)),
            3 => (0usize..6, proptest::collection::vec(0i32..3, 1..5)).prop_map(|(i, s)| Op::Append(i, s)),
            1 => (0usize..6).prop_map(Op::Checkpoint),
            3 => (0usize..6).prop_map(Op::Free),
            1 => (0usize..10).prop_map(Op::Evict),
            1 => Just(Op::Reset),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 150, ..ProptestConfig::default() })]

        #[test]
        fn random_requests_keep_ownership(ps in prop_oneof![Just(1usize), Just(2), Just(4)],
                                          pages in 3usize..24,
                                          ops in proptest::collection::vec(op(), 1..50)) {
            let mut c = RadixPrefixCache::new(pages, ps, Policy::Lru, true).expect("ok");
            let mut sub = super::Folded::default();
            let salt = KeySpec::new(None, Some("x".into()), vec![]).expect("ok");
            let none = KeySpec::default();
            let mut running: Vec<u64> = Vec::new();
            let mut next = 0u64;
            for op in ops {
                match op {
                    Op::Admit(s, ns, skip) => {
                        let spec = if ns { &salt } else { &none };
                        let look = c.lookup(&s, spec).expect("ok");
                        let free = c.num_free_blocks();
                        let res = c.admit(RequestId(next), &s, spec, skip);
                        if s.len().div_ceil(ps) >= pages {
                            // Larger than the whole pool: an error, never `None`.
                            let kind = res.err().map(|e| e.kind);
                            prop_assert_eq!(kind, Some(crate::core::error::ErrorKind::RequestTooLarge));
                            prop_assert_eq!(c.num_free_blocks(), free, "nothing changed");
                            next += 1;
                            continue;
                        }
                        match res.expect("ok") {
                            Some(h) => {
                                prop_assert_eq!(h, if skip { 0 } else { look });
                                prop_assert!(h < s.len() && h % ps == 0);
                                running.push(next);
                            }
                            None => {
                                // A `skip_reading` admission reads no hit, so it needs every page.
                                let hit = if skip { 0 } else { look };
                                prop_assert!(s.len().div_ceil(ps) - hit / ps > c.pool().num_free());
                                prop_assert_eq!(c.num_free_blocks(), free, "nothing changed");
                            }
                        }
                        next += 1;
                    }
                    Op::Append(i, s) => {
                        if let Some(&id) = running.get(i) {
                            let n = c.num_tokens(RequestId(id)).expect("ok");
                            if c.append(RequestId(id), &s).expect("ok") {
                                prop_assert_eq!(c.num_tokens(RequestId(id)).expect("ok"), n + s.len());
                            }
                        }
                    }
                    Op::Checkpoint(i) => {
                        if let Some(&id) = running.get(i) {
                            c.checkpoint(RequestId(id)).expect("ok");
                        }
                    }
                    Op::Free(i) => {
                        if i < running.len() {
                            let id = running.remove(i);
                            c.free(RequestId(id)).expect("ok");
                        }
                    }
                    Op::Evict(k) => {
                        c.evict(k);
                    }
                    Op::Reset => {
                        // Refused (nothing changes) while requests run.
                        let kind = c.reset().err().map(|e| e.kind);
                        let want = (!running.is_empty()).then_some(crate::core::error::ErrorKind::BlockInUse);
                        prop_assert_eq!(kind, want);
                    }
                }
                c.check_invariants().map_err(|e| TestCaseError::fail(e.to_string()))?;
                sub.apply(c.take_events()).map_err(TestCaseError::fail)?;
                prop_assert_eq!(c.tree().cached_page_hashes().expect("events on"), sub.sorted());
            }
            for id in running {
                c.free(RequestId(id)).expect("ok");
            }
            c.check_invariants().map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(c.pool().num_free() + c.tree().total_size() / ps + 1, pages);
        }
    }
}

#[test]
fn bitmap_mark_unmark_runs() {
    let mut bits = vec![0u64; 4];
    let v: Vec<PageId> = [1, 2, 3, 64, 65, 200].iter().map(|&x| PageId(x)).collect();
    assert_eq!(mark_all(&mut bits, &v), Ok(()));
    assert_eq!(bits[0], 0b1110);
    assert_eq!(mark_all(&mut bits, &b(&[10, 11, 65])), Err(2), "conflict in the second word-run");
    assert_eq!(bits[0], 0b1110 | 1 << 10 | 1 << 11, "the first run was flushed");
    unmark_all(&mut bits, &b(&[10, 11]));
    assert_eq!(mark_all(&mut bits, &b(&[30, 31, 30])), Err(0), "repeat inside one run");
    assert_eq!(bits[0], 0b1110, "nothing of the failed run is marked");
    unmark_all(&mut bits, &v);
    assert!(bits.iter().all(|&w| w == 0));
    unmark_all(&mut bits, &b(&[100_000])); // beyond the bitmap: ignored
                                           // The tree reports the culprit and leaves the bitmap unchanged.
    let mut t = tree(1);
    ins(&mut t, &[1, 2, 3], None, 64);
    let before = t.in_tree.clone();
    let mut d = Vec::new();
    let e =
        t.insert(&[5, 6, 7, 8], &b(&[10, 11, 65, 12]), None, 0, &[], &mut d).expect_err("65 is in the tree");
    assert!(e.msg.contains("65"), "{}", e.msg);
    let e = t.insert(&[5, 6, 7, 8], &b(&[10, 11, 12, 11]), None, 0, &[], &mut d).expect_err("11 twice");
    assert!(e.msg.contains("11"), "{}", e.msg);
    assert_eq!(t.in_tree, before);
    // A refused insert with a huge value does not leave a grown bitmap behind.
    let e = t
        .insert(&[5, 6, 7, 8], &b(&[10, 65, 1 << 30, 12]), None, 0, &[], &mut d)
        .expect_err("65 is in the tree");
    assert!(e.msg.contains("65"), "{}", e.msg);
    assert_eq!(t.in_tree, before);
    assert!(t.in_tree.capacity() < 1 << 20, "bitmap capacity {}", t.in_tree.capacity());
    t.check_invariants().expect("invariants");
}

proptest! {
    #[test]
    fn bitmap_matches_a_set(groups in proptest::collection::vec(
        prop_oneof![
            (0u32..300, 1usize..130).prop_map(|(b, n)| (b..b + u32::try_from(n).expect("small")).collect::<Vec<u32>>()),
            (0u32..300, 1usize..130).prop_map(|(b, n)| (b..b + u32::try_from(n).expect("small")).rev().collect::<Vec<u32>>()),
            proptest::collection::vec(0u32..400, 0..90),
            // short runs back to back: chunks that span the end of a run
            proptest::collection::vec((0u32..300, 1u32..40, proptest::bool::ANY), 1..6).prop_map(|rs| {
                rs.into_iter()
                    .flat_map(|(b, n, down)| {
                        let run: Vec<u32> = (b..b + n).collect();
                        if down { run.into_iter().rev().collect::<Vec<u32>>() } else { run }
                    })
                    .collect::<Vec<u32>>()
            }),
        ], 1..6)) {
        let mut bits = vec![0u64; 8];
        let mut set = std::collections::BTreeSet::new();
        for g in &groups {
            let vals: Vec<PageId> = g.iter().map(|&x| PageId(x)).collect();
            let before = bits.clone();
            let fresh = g.iter().all(|x| !set.contains(x))
                && g.iter().collect::<std::collections::BTreeSet<_>>().len() == g.len();
            match mark_all(&mut bits, &vals) {
                Ok(()) => {
                    prop_assert!(fresh);
                    set.extend(g.iter().copied());
                }
                Err(i) => {
                    prop_assert!(!fresh);
                    unmark_all(&mut bits, &vals[..i]);
                    prop_assert_eq!(&bits, &before);
                }
            }
            let want: Vec<u32> = set.iter().copied().collect();
            let got: Vec<u32> = (0..512u32).filter(|&x| bits[x as usize / 64] >> (x % 64) & 1 == 1).collect();
            prop_assert_eq!(got, want);
        }
    }
}

#[test]
fn wide_queries_match_as_their_narrow_copies() {
    use super::common_prefix_of;
    for ps in [1usize, 4] {
        let mut t = RadixTree::new(ps, Policy::Lru, false).expect("valid");
        let key: Vec<i32> = (0..200).map(|i| i * 7 - 100).collect();
        let vals: Vec<PageId> = (1..=200 / ps as u32).map(PageId).collect();
        t.insert(&key, &vals, None, 0, &[], &mut Vec::new()).expect("fresh");
        let wide: Vec<i64> = key.iter().map(|&x| i64::from(x)).collect();
        for cut in [0, 1, 5, 17, 40, 63, 64, 71, 100, 128, 135, 199, 200] {
            let mut q = wide.clone();
            if cut < q.len() {
                q[cut] += 1 << 40; // out of i32 range: equals no key token
            }
            assert_eq!(t.probe(&q, None).len, cut / ps * ps);
            assert_eq!(common_prefix_of(&key, &q), cut);
            let mut out = Vec::new();
            assert_eq!(t.match_prefix(&q, None, &mut out).len, cut / ps * ps);
            assert_eq!(out, vals[..cut / ps]);
        }
    }
}

/// `extend_locked` leaves the tree (dump: clock, stamps, counts, locks, sizes),
/// its events and its invariants exactly as the general path does: insert the
/// whole path, match it, lock the new node, unlock the old one.
#[test]
fn extend_locked_is_insert_match_relock() {
    for ps in [1usize, 4] {
        let mut a = RadixTree::new(ps, Policy::Lru, true).expect("valid");
        let toks: Vec<i32> = (0..12 * ps as i32).collect();
        let pages: Vec<PageId> = (1..=12).map(PageId).collect();
        a.insert(&toks[..4 * ps], &pages[..4], None, 0, &[], &mut Vec::new()).expect("fresh");
        // a sibling branch another request left behind
        let other: Vec<i32> = toks[..4 * ps].iter().copied().chain(std::iter::repeat_n(-7, 2 * ps)).collect();
        let other_pages: Vec<PageId> = pages[..4].iter().copied().chain([PageId(40), PageId(41)]).collect();
        a.insert(&other, &other_pages, None, 0, &[], &mut Vec::new()).expect("a branch");
        let mut out = Vec::new();
        let node = a.match_prefix(&toks[..4 * ps], None, &mut out).node;
        a.lock(node);
        a.events_mut().take();
        let mut b = a.clone();
        let leaf =
            a.extend_locked(node, None, &toks[4 * ps..9 * ps], &pages[4..9]).expect("fast path applies");
        b.insert(&toks[..9 * ps], &pages[..9], None, 0, &[], &mut Vec::new()).expect("general path");
        let m = b.match_prefix(&toks[..9 * ps], None, &mut Vec::new());
        b.lock(m.node);
        b.unlock(node).expect("held");
        assert_eq!(m.node, leaf);
        assert_eq!(a.dump(), b.dump());
        assert_eq!(a.events_mut().take(), b.events_mut().take());
        a.check_invariants().expect("consistent");
        // refused (nothing changed): an existing child with that first page, the root, no lock
        let before = a.dump();
        assert!(a.extend_locked(node, None, &toks[4 * ps..5 * ps], &pages[9..10]).is_none());
        assert!(a.extend_locked(NodeId::ROOT, None, &toks[..ps], &pages[9..10]).is_none(), "a root child");
        assert!(a.extend_locked(NodeId::ROOT, Some("new"), &toks[..ps], &pages[9..10]).is_none());
        assert!(a.extend_locked(node, None, &[99; 1].repeat(ps), &pages[9..10]).is_none(), "lock moved away");
        assert!(
            a.extend_locked(leaf, None, &toks[9 * ps..10 * ps], &pages[0..1]).is_none(),
            "value in the tree"
        );
        assert_eq!(a.dump(), before);
    }
}

/// At the root (a request that holds no lock yet) `extend_locked` is insert + match + lock.
#[test]
fn extend_locked_at_the_root_is_insert_match_lock() {
    for (ps, ns) in [(1usize, None), (4, Some("salt"))] {
        let mut a = RadixTree::new(ps, Policy::Lru, true).expect("valid");
        a.insert(&[5; 8], &(1..=8 / ps as u32).map(PageId).collect::<Vec<_>>(), ns, 0, &[], &mut Vec::new())
            .expect("ns interned");
        a.events_mut().take();
        let mut b = a.clone();
        let toks: Vec<i32> = (0..8).collect();
        let pages: Vec<PageId> = (20..20 + 8 / ps as u32).map(PageId).collect();
        let leaf = a.extend_locked(NodeId::ROOT, ns, &toks, &pages).expect("fast path applies");
        b.insert(&toks, &pages, ns, 0, &[], &mut Vec::new()).expect("general path");
        let m = b.match_prefix(&toks, ns, &mut Vec::new());
        b.lock(m.node);
        assert_eq!(m.node, leaf);
        assert_eq!(a.dump(), b.dump());
        assert_eq!(a.events_mut().take(), b.events_mut().take());
        a.check_invariants().expect("consistent");
    }
}

/// Requests growing their paths page by page through `extend_locked` (the
/// path's counts and stamps owed, settled at unlock) leave every observable
/// as the general path does (insert the whole path, match it, lock the new
/// node, unlock the old one), under every policy, with other requests
/// matching into (and splitting) those paths, locking and unlocking them,
/// finishing, branching off and evicting in between: the dump (stamps, hit
/// counts), each live node's eviction key, the evicted values in order, the
/// events and the invariants.
#[test]
fn extend_locked_chains_match_the_general_path_under_every_policy() {
    struct Req {
        toks: Vec<i32>,
        node: NodeId,
    }
    let policies = [
        Policy::Lru,
        Policy::Lfu,
        Policy::Fifo,
        Policy::Mru,
        Policy::Filo,
        Policy::Priority,
        Policy::Slru { threshold: 2 },
        Policy::Slru { threshold: 5 },
    ];
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        usize::try_from(seed % n as u64).expect("small")
    };
    for ps in [1usize, 4] {
        for policy in policies {
            let mut a = RadixTree::new(ps, policy, true).expect("valid");
            let mut b = a.clone();
            let mut next_tok = 1000i32;
            let mut next_page = 1u32;
            let mut reqs: Vec<Req> = Vec::new();
            let mut readers: Vec<NodeId> = Vec::new();
            for step in 0..400 {
                match rnd(10) {
                    // a new request: hits a prefix of a running one (or nothing)
                    0 | 1 if reqs.len() < 6 => {
                        let toks = match reqs.len() {
                            0 => Vec::new(),
                            n => {
                                let t = &reqs[rnd(n)].toks;
                                t[..rnd(t.len() / ps + 1) * ps].to_vec()
                            }
                        };
                        let ma = a.match_prefix(&toks, None, &mut Vec::new());
                        let mb = b.match_prefix(&toks, None, &mut Vec::new());
                        assert_eq!(ma, mb);
                        a.lock(ma.node);
                        b.lock(mb.node);
                        reqs.push(Req { toks: toks[..ma.len].to_vec(), node: ma.node });
                    }
                    // a request's next pages enter the tree
                    2..=5 if !reqs.is_empty() => {
                        let i = rnd(reqs.len());
                        let pages = 1 + rnd(3) * rnd(2);
                        let r = &mut reqs[i];
                        let key: Vec<i32> = (0..pages * ps)
                            .map(|_| {
                                next_tok += 1;
                                next_tok
                            })
                            .collect();
                        let vals: Vec<PageId> = (0..pages)
                            .map(|_| {
                                next_page += 1;
                                PageId(next_page)
                            })
                            .collect();
                        let leaf = a.extend_locked(r.node, None, &key, &vals).expect("fast path applies");
                        r.toks.extend_from_slice(&key);
                        b.insert(&r.toks, &b.path_values_of(r.node, &vals), None, 0, &[], &mut Vec::new())
                            .expect("general path");
                        let m = b.match_prefix(&r.toks, None, &mut Vec::new());
                        assert_eq!(m.node, leaf);
                        b.lock(m.node);
                        b.unlock(r.node).expect("held");
                        r.node = leaf;
                    }
                    // a reader matches into a running path (splitting it), locks it
                    6 if !reqs.is_empty() => {
                        let t = reqs[rnd(reqs.len())].toks.clone();
                        let q = &t[..rnd(t.len() / ps + 1) * ps];
                        let ma = a.match_prefix(q, None, &mut Vec::new());
                        assert_eq!(ma, b.match_prefix(q, None, &mut Vec::new()));
                        a.lock(ma.node);
                        b.lock(ma.node);
                        readers.push(ma.node);
                    }
                    // a request or a reader finishes
                    7 => {
                        let node = if rnd(2) == 0 && !reqs.is_empty() {
                            let i = rnd(reqs.len());
                            reqs.swap_remove(i).node
                        } else if !readers.is_empty() {
                            let i = rnd(readers.len());
                            readers.swap_remove(i)
                        } else {
                            continue;
                        };
                        a.unlock(node).expect("held");
                        b.unlock(node).expect("held");
                    }
                    // a branch off a running path (the general insert)
                    8 if !reqs.is_empty() => {
                        let t = &reqs[rnd(reqs.len())].toks;
                        let mut q = t[..rnd(t.len() / ps + 1) * ps].to_vec();
                        q.extend(std::iter::repeat_n(-1 - step, ps));
                        let vals: Vec<PageId> = (0..q.len() / ps)
                            .map(|_| {
                                next_page += 1;
                                PageId(next_page)
                            })
                            .collect();
                        let (mut da, mut db) = (Vec::new(), Vec::new());
                        let pa = a.insert(&q, &vals, None, 0, &[], &mut da).expect("insert");
                        assert_eq!(pa, b.insert(&q, &vals, None, 0, &[], &mut db).expect("insert"));
                        assert_eq!(da, db);
                    }
                    _ => {
                        let n = rnd(6) * ps;
                        let (mut fa, mut fb) = (Vec::new(), Vec::new());
                        assert_eq!(a.evict(n, &mut fa), b.evict(n, &mut fb));
                        assert_eq!(fa, fb, "eviction order");
                    }
                }
                assert_eq!(a.dump(), b.dump(), "step {step} ({policy:?}, page {ps})");
                for i in 1..a.nodes.len() {
                    if a.nodes[i].live {
                        let id = NodeId(u32::try_from(i).expect("small"));
                        assert_eq!(a.evict_key(id), b.evict_key(id), "node {i} at step {step}");
                    }
                }
                assert_eq!(a.events_mut().take(), b.events_mut().take());
                a.check_invariants().expect("consistent");
                b.check_invariants().expect("consistent");
            }
            // everything released: nothing owed, the same full eviction order
            for r in reqs {
                a.unlock(r.node).expect("held");
                b.unlock(r.node).expect("held");
            }
            for n in readers {
                a.unlock(n).expect("held");
                b.unlock(n).expect("held");
            }
            assert!(a.nodes.iter().all(|n| n.owed_hits == 0 && n.owed_tick == 0));
            assert_eq!(a.dump(), b.dump());
            let (mut fa, mut fb) = (Vec::new(), Vec::new());
            a.evict(usize::MAX, &mut fa);
            b.evict(usize::MAX, &mut fb);
            assert_eq!(fa, fb, "full eviction order");
        }
    }
}

impl RadixTree {
    /// Tests: the values of the path root..=`id`, then `more`.
    fn path_values_of(&self, id: NodeId, more: &[PageId]) -> Vec<PageId> {
        let mut out = Vec::new();
        self.path_values(id, &mut out);
        out.extend_from_slice(more);
        out
    }
}

#[test]
fn insert_counting_from_skips_what_the_caller_inserted_before() {
    // SGLang's `cache_inserted_len`: a request re-inserting its growing sequence counts
    // each node once; with 0 it is plain `insert` (every node on the path counts).
    let mut t = tree(1);
    let mut dups = Vec::new();
    let a = [1, 2, 3, 4];
    t.insert_hybrid(
        &a,
        &b(&[10, 11, 12, 13]),
        None,
        0,
        &[],
        &mut dups,
        &InsertOpts { inserted_len: 0, ..InsertOpts::default() },
    )
    .expect("insert");
    let leaf = t.children_of(NodeId::ROOT)[0];
    assert_eq!(t.nodes[leaf.idx()].hit_count, 1);
    // The same request again, then with two more tokens: neither counts the first node.
    t.insert_hybrid(
        &a,
        &b(&[10, 11, 12, 13]),
        None,
        0,
        &[],
        &mut dups,
        &InsertOpts { inserted_len: 4, ..InsertOpts::default() },
    )
    .expect("insert");
    assert_eq!(t.nodes[leaf.idx()].hit_count, 1);
    let ab = [1, 2, 3, 4, 5, 6];
    t.insert_hybrid(
        &ab,
        &b(&[10, 11, 12, 13, 14, 15]),
        None,
        0,
        &[],
        &mut dups,
        &InsertOpts { inserted_len: 4, ..InsertOpts::default() },
    )
    .expect("insert");
    assert_eq!(t.nodes[leaf.idx()].hit_count, 1);
    let tail = t.children_of(leaf)[0];
    assert_eq!(t.nodes[tail.idx()].hit_count, 1);
    // A prefix insert fully inside what was inserted adds no new counts, even on a split.
    t.insert_hybrid(
        &[1, 2],
        &b(&[10, 11]),
        None,
        0,
        &[],
        &mut dups,
        &InsertOpts { inserted_len: 2, ..InsertOpts::default() },
    )
    .expect("insert");
    let top = t.children_of(NodeId::ROOT)[0];
    assert_eq!(t.nodes[top.idx()].key, vec![1, 2]);
    assert_eq!(t.nodes[top.idx()].hit_count, 1);
    // Another request (inserted_len 0) counts every node it passes.
    ins(&mut t, &ab, None, 10);
    assert_eq!(t.nodes[top.idx()].hit_count, 2);
    assert_eq!(t.nodes[tail.idx()].hit_count, 2);
    assert!(dups.is_empty());
    t.check_invariants().expect("invariants");
}
