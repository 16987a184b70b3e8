//! Hand-worked vLLM 0.33 examples for the multi-group manager calls.

use super::*;
use crate::core::groups::spec::{GroupKind, GroupSpec, LayoutOptions};

fn h(i: u8) -> BlockHash {
    BlockHash::from_digest(&[i; 16])
}

fn hashes(n: u8) -> Vec<BlockHash> {
    (1..=n).map(h).collect()
}

fn manager(groups: Vec<GroupSpec>, num_blocks: usize) -> VllmManager {
    let opt = LayoutOptions { enable_caching: true, ..LayoutOptions::default() };
    let l = GroupLayout::new(groups, opt).expect("layout");
    VllmManager::with_layout(num_blocks, l, true, true, None).expect("manager")
}

fn swa(window: usize, bs: usize) -> GroupSpec {
    GroupSpec { kind: GroupKind::SlidingWindow { window }, block_size: bs }
}

fn slots(need: usize, local: usize) -> SlotRequest {
    SlotRequest {
        num_tokens_need_slot: need,
        num_local_computed: local,
        adopt: true,
        ..SlotRequest::default()
    }
}

/// Runs a request of `n` tokens through allocate + cache (prefill in one step).
fn prefill(m: &mut VllmManager, rid: &str, hs: &[BlockHash], n: usize) -> Vec<Vec<BlockId>> {
    let new = m.allocate_slots_groups(rid, &[], &slots(n, 0)).expect("ok").expect("fits");
    let plan = m.cache_plan(rid, n, hs.len(), 0);
    m.cache_apply(rid, &plan, 0, hs).expect("cache");
    m.check_invariants().expect("invariants");
    new
}

#[test]
fn one_full_group_matches_the_single_group_calls() {
    let mut a = manager(vec![GroupSpec::full(4)], 12);
    let mut b = VllmManager::new(12, 4, true, true, true).expect("single");
    let hs = hashes(3);
    prefill(&mut a, "r", &hs, 13);
    let new = b.allocate_slots("r", &[], &slots(13, 0)).expect("ok").expect("fits");
    assert_eq!(new, a.group_blocks("r", 0));
    let (s, e) = b.cache_range("r", 13, 3).expect("range");
    b.cache_run("r", s, &hs[s..e]).expect("cache");
    a.free("r");
    b.free("r");
    assert_eq!(a.pool().free_queue().collect::<Vec<_>>(), b.pool().free_queue().collect::<Vec<_>>());
    let ha = a.find_hit_groups(&hs, 12);
    assert_eq!(ha.hit.tokens, 12);
    assert_eq!(ha.blocks[0], b.find_hit(&hs, 3, false));
    assert_eq!(a.take_removed_groups().len(), b.take_removed().len());
}

/// Full (block 4) + SWA window 8 (block 4): a second request over the same
/// prompt hits 12 tokens; SWA's table is [null, b, b] and its skipped block
/// is not touched.
#[test]
fn full_plus_sliding_window_hit_and_nulls() {
    let mut m = manager(vec![GroupSpec::full(4), swa(8, 4)], 20);
    let hs = hashes(4);
    let first = prefill(&mut m, "a", &hs, 16);
    assert_eq!(first[0].len(), 4);
    assert_eq!(first[1].len(), 4);
    m.free("a");
    let hit = m.find_hit_groups(&hs, 15);
    assert_eq!(hit.hit.tokens, 12);
    assert_eq!(hit.blocks[0], first[0][..3].to_vec());
    assert_eq!(hit.blocks[1], vec![BlockId::NULL, first[1][1], first[1][2]]);
    let s = slots(16, 12);
    let new = m.allocate_slots_groups("b", &hit.blocks, &s).expect("ok").expect("fits");
    assert_eq!(new[0].len(), 1);
    assert_eq!(new[1].len(), 1);
    // skipped_tokens(12) = 12 - 8 + 1 = 5 -> one null block, not touched.
    assert_eq!(m.group_blocks("b", 1)[0], BlockId::NULL);
    assert_eq!(m.pool().ref_count(first[1][0]), 0);
    assert_eq!(m.pool().ref_count(first[1][1]), 1);
    m.check_invariants().expect("invariants");
    // Decode to 17 tokens: the window of token 17 starts at 10 -> block 1 (4..8) is freed.
    m.remove_skipped_blocks("b", 17);
    assert_eq!(&m.group_blocks("b", 1)[..2], &[BlockId::NULL, BlockId::NULL]);
    assert_eq!(m.pool().ref_count(first[1][1]), 0);
    m.check_invariants().expect("invariants");
}

/// With block sizes 4 (SWA) and 8 (full), the scheduler block is 8: SWA
/// caches only the tail of each 8-token segment it can serve a hit from.
#[test]
fn sliding_window_caches_only_reachable_blocks() {
    // A full block (8) larger than the hash block (4) keeps partial entries.
    let opt = LayoutOptions { enable_caching: true, ..LayoutOptions::default() };
    let l = GroupLayout::new(vec![swa(4, 4), GroupSpec::full(8)], opt).expect("layout");
    assert!(VllmManager::with_layout(30, l, false, false, None).expect("accepted").registers_prompt_tails());
    let mut m = manager(vec![GroupSpec::full(4), swa(4, 8)], 30);
    let hs = hashes(8);
    prefill(&mut m, "a", &hs, 32);
    let plan_blocks = m.group_blocks("a", 1).to_vec();
    // window 4, block 8: need ceil(3/8) = 1 block; per segment 1 -> every block cached.
    assert!(plan_blocks.iter().all(|&b| m.pool().block_hash(b).is_some()));
    assert_eq!(m.vllm_hash(plan_blocks[0]), Some(hs[1]));
    assert_eq!(m.block_group(plan_blocks[0]), 1);
    // Window 5 on block 4 beside a block-16 group: the scheduler block is 16,
    // one block per 16-token segment serves a hit (blocks 3 and 7).
    let mut m = manager(vec![GroupSpec::full(4), swa(5, 4), swa(8, 16)], 40);
    prefill(&mut m, "a", &hs, 32);
    let t = m.group_blocks("a", 1).to_vec();
    let cached: Vec<usize> = (0..t.len()).filter(|&i| m.pool().block_hash(t[i]).is_some()).collect();
    assert_eq!(cached, vec![3, 7]);
    m.free("a");
    let hit = m.find_hit_groups(&hs, 31);
    assert_eq!(hit.hit.tokens, 16);
    assert_eq!(hit.blocks[1], vec![BlockId::NULL, BlockId::NULL, BlockId::NULL, t[3]]);
}

#[test]
fn chunked_local_skips_whole_chunks() {
    let cl = GroupSpec { kind: GroupKind::ChunkedLocal { chunk: 8 }, block_size: 4 };
    let mut m = manager(vec![GroupSpec::full(4), cl], 30);
    let hs = hashes(5);
    let first = prefill(&mut m, "a", &hs, 20);
    m.free("a");
    let hit = m.find_hit_groups(&hs, 19);
    // Full: 16 tokens. Chunked local at 16: chunk starts at 16 -> 4 nulls, hit 16.
    assert_eq!(hit.hit.tokens, 16);
    assert_eq!(hit.blocks[1], vec![BlockId::NULL; 4]);
    assert_eq!(hit.blocks[0], first[0][..4].to_vec());
    let new = m.allocate_slots_groups("b", &hit.blocks, &slots(20, 16)).expect("ok").expect("fits");
    assert_eq!(new[1].len(), 1);
    assert_eq!(m.group_blocks("b", 1).len(), 5);
    m.check_invariants().expect("invariants");
}

#[test]
fn errors_change_nothing() {
    let mut m = manager(vec![GroupSpec::full(4), swa(8, 4)], 6);
    let q: Vec<BlockId> = m.pool().free_queue().collect();
    assert!(m.allocate_slots_groups("a", &[vec![BlockId(1)], vec![]], &slots(4, 0)).is_err());
    assert!(m.allocate_slots_groups("a", &[vec![]], &slots(4, 0)).is_err());
    assert!(m.allocate_slots_groups("a", &[], &slots(40, 0)).expect("ok").is_none());
    assert_eq!(m.pool().free_queue().collect::<Vec<_>>(), q);
    assert!(!m.has_request("a"));
    assert!(m.cache_apply("zz", &[(0, 0, 1)], 0, &hashes(1)).is_err());
}

#[test]
fn group_keys_invert_and_stay_apart() {
    for len in [1usize, 8, 16, 31, 32] {
        let d: Vec<u8> = (0..len).map(|i| i as u8).collect();
        let h = BlockHash::from_digest(&d);
        assert_eq!(group_key(&h, 0), h);
        for g in 1..5 {
            let k = group_key(&h, g);
            assert_ne!(k, h);
            assert_ne!(k, group_key(&h, g + 1));
            assert_eq!(group_unkey(&k, g, len), h);
        }
    }
    // Hashes differing in their last bytes by a group id do not collide across groups.
    let a = BlockHash::from_digest(&[0, 0, 0, 0, 0, 0, 0, 0]);
    let b = BlockHash::from_digest(&[0, 0, 0, 0, 0, 0, 0, 1]);
    assert_ne!(group_key(&a, 1), group_key(&b, 0));
    assert_ne!(group_key(&a, 1), group_key(&b, 2));
}

/// A decode step that takes no block returns no table (no allocation); one that
/// takes a block in some group returns every group's list. The window's blocks
/// freed by the step's `remove_skipped_blocks` become nulls either way.
#[test]
fn steps_without_new_blocks_return_no_tables() {
    let mut m = manager(vec![GroupSpec::full(4), swa(8, 4)], 40);
    prefill(&mut m, "a", &hashes(4), 16);
    let step = |total: usize| SlotRequest {
        num_tokens_need_slot: total + 1,
        num_local_computed: total,
        processed_tokens: Some(total),
        ..SlotRequest::default()
    };
    let new = m.allocate_slots_groups("a", &[], &step(16)).expect("ok").expect("fits");
    assert_eq!(new.len(), 2);
    assert_eq!((new[0].len(), new[1].len()), (1, 1));
    let new = m.allocate_slots_groups("a", &[], &step(17)).expect("ok").expect("fits");
    assert!(new.is_empty());
    // skipped_tokens(17) = 17 - 8 + 1 = 10: the window's first two blocks are nulls.
    assert_eq!(&m.group_blocks("a", 1)[..3], &[BlockId::NULL, BlockId::NULL, m.group_blocks("a", 1)[2]]);
    assert_ne!(m.group_blocks("a", 1)[2], BlockId::NULL);
    m.check_invariants().expect("invariants");
}

/// vLLM's bounded-replay example (`test_prefix_replay.py`): block 16, window 32, a
/// 100-token prompt seen twice. The full-attention hit (96 tokens) is shared; the
/// replayed sliding-window MLA group never hits: its blocks below the window of the
/// hit's next token are nulls, the rest are new, and none is ever cached.
#[test]
fn bounded_replay_group_never_hits_nor_caches() {
    let mla =
        GroupSpec { kind: GroupKind::SlidingWindowMla { window: 32, bounded_replay: true }, block_size: 16 };
    let mut m = manager(vec![GroupSpec::full(16), mla], 40);
    let hs = hashes(6);
    prefill(&mut m, "a", &hs, 100);
    assert_eq!(m.group_num_cached("a", 1), Some(0), "adopted an empty hit, never cached");
    assert!(m.cache_plan("a", 100, hs.len(), 0).is_empty());
    assert!(m.cache_apply("a", &[(1, 0, 1)], 0, &hs).is_err());
    assert!(m.cache_loose(&[BlockId(1)], 1, 0, 1, 0, &hs).is_err());
    let hit = m.find_hit_groups(&hs, 99);
    assert_eq!(hit.hit.tokens, 96);
    assert_eq!((hit.blocks[0].len(), hit.blocks[1].len()), (6, 0));
    let new = m.allocate_slots_groups("b", &hit.blocks, &slots(100, 96)).expect("ok").expect("fits");
    assert_eq!(m.group_blocks("b", 0)[..6], m.group_blocks("a", 0)[..6]);
    let t = m.group_blocks("b", 1);
    assert_eq!(t.len(), 7);
    assert!(t[..4].iter().all(|&b| b == BlockId::NULL) && t[4..].iter().all(|&b| b != BlockId::NULL));
    assert_eq!((new[0].len(), new[1].len()), (1, 3));
    assert_eq!(m.group_num_cached("b", 1), Some(4));
    let plan = m.cache_plan("b", 100, hs.len(), 0);
    assert!(plan.iter().all(|&(g, _, _)| g == 0));
    m.check_invariants().expect("invariants");
}

/// Per-group EAGLE: only the groups of a flagged spec set cache one block past the
/// scheduler block boundary (block sizes 4 and 8: scheduler block 8).
#[test]
fn eagle_groups_cache_their_own_tails() {
    let plan = |flags: [bool; 2]| {
        let opt = LayoutOptions { enable_caching: true, use_eagle: true, ..LayoutOptions::default() };
        let l = GroupLayout::new(vec![GroupSpec::full(4), swa(16, 8)], opt).expect("layout");
        let l = l.with_eagle_groups(&flags).expect("flags");
        let mut m = VllmManager::with_layout(40, l, false, false, None).expect("manager");
        m.allocate_slots_groups("a", &[], &slots(16, 0)).expect("ok").expect("fits");
        m.check_invariants().expect("invariants");
        m.cache_plan("a", 12, 3, 0)
    };
    assert_eq!(plan([true, false]), vec![(0, 0, 3), (1, 0, 1)]);
    assert_eq!(plan([false, true]), vec![(0, 0, 2), (1, 0, 1)]);
}

/// vLLM's `CrossAttentionManager` beside full attention (prefix caching off): the
/// cross-attention group holds `ceil(encoder tokens / B)` blocks, allocated on the step
/// that schedules the encoder inputs, never more on later steps, and adopts nothing.
#[test]
fn cross_attention_holds_blocks_for_the_encoder_tokens() {
    let cross = GroupSpec { kind: GroupKind::CrossAttention, block_size: 16 };
    let l =
        GroupLayout::new(vec![GroupSpec::full(16), cross], LayoutOptions::default()).expect("caching off");
    let mut m = VllmManager::with_layout(60, l, false, true, None).expect("manager");
    assert_eq!(m.num_blocks_to_allocate_encoder("a", 100, 100, 200, &[], (0, 0), false), 7 + 13);
    let s = SlotRequest {
        num_tokens_need_slot: 100,
        num_encoder_tokens: 200,
        adopt: true,
        ..SlotRequest::default()
    };
    let new = m.allocate_slots_groups("a", &[], &s).expect("ok").expect("fits");
    assert_eq!((new[0].len(), new[1].len()), (7, 13));
    assert_eq!(m.group_num_cached("a", 1), None, "cross-attention keeps no cached count");
    // A later step schedules no encoder input: the cross-attention table stays.
    let s = SlotRequest { num_tokens_need_slot: 101, num_local_computed: 100, ..SlotRequest::default() };
    let new = m.allocate_slots_groups("a", &[], &s).expect("ok").expect("fits");
    assert!(new.is_empty(), "no group took a block");
    assert_eq!(m.group_blocks("a", 1).len(), 13);
    // No hit list for it, and a request without encoder input holds none.
    assert!(m.allocate_slots_groups("b", &[vec![], vec![BlockId::NULL]], &slots(16, 0)).is_err());
    m.allocate_slots_groups("b", &[], &slots(16, 0)).expect("ok").expect("fits");
    assert!(m.group_blocks("b", 1).is_empty());
    m.check_invariants().expect("invariants");
    m.free("a");
    m.free("b");
    assert_eq!(m.pool().num_free(), 59);
}

/// A run's stored indices keep one form per index list (a range while
/// contiguous), and a plan of more runs than it holds inline keeps them all.
#[test]
fn stored_indices_and_plans_keep_their_order() {
    use crate::core::vllm_manager::groups::{CachePlan, Stored};
    let build = |v: &[usize]| {
        let mut s = Stored::default();
        v.iter().for_each(|&i| s.push(i));
        s
    };
    for v in [&[][..], &[3], &[3, 4, 5], &[3, 5], &[0, 1, 7, 8], &[2, 3, 4, 9]] {
        let s = build(v);
        assert_eq!(s.to_vec(), v);
        assert_eq!((s.len(), s.iter().len()), (v.len(), v.len()));
        let contiguous = v.windows(2).all(|w| w[1] == w[0] + 1);
        assert_eq!(matches!(s, Stored::Range(..)), contiguous, "{v:?}");
    }
    assert_eq!(build(&[]), build(&[]));
    assert_ne!(build(&[3]), build(&[4]));
    let mut p = CachePlan::new();
    let runs: Vec<(usize, usize, usize)> = (0..7).map(|g| (g, g, g + 1)).collect();
    for (i, &r) in runs.iter().enumerate() {
        p.push(r);
        assert_eq!(p, runs[..=i].to_vec());
    }
}

#[test]
fn a_circular_buffer_holds_one_block_per_request_and_never_hits() {
    let ring = GroupSpec { kind: GroupKind::CircularBuffer, block_size: 4 };
    let opt = LayoutOptions { enable_caching: true, ..LayoutOptions::default() };
    let l = GroupLayout::new(vec![GroupSpec::full(4), ring], opt).expect("layout");
    assert!(!l.prefix_cacheable(1));
    let mut m = VllmManager::with_layout(20, l, false, false, None).expect("manager");
    let hs = hashes(4);
    // Its one block on the first allocation (however many tokens), none after.
    assert_eq!(m.num_blocks_to_allocate_groups("a", 16, &[], 0, false), 4 + 1);
    let new = prefill(&mut m, "a", &hs, 16);
    assert_eq!((new[0].len(), new[1].len()), (4, 1));
    let r = new[1][0];
    assert_eq!(m.num_blocks_to_allocate_groups("a", 40, &[], 16, false), 6);
    let more = m.allocate_slots_groups("a", &[], &slots(40, 16)).expect("ok").expect("fits");
    assert!(more.get(1).is_none_or(Vec::is_empty));
    assert_eq!(m.group_blocks("a", 1), &[r]);
    // The prompt hits full attention only; the ring's hit list stays empty.
    let hit = m.find_hit_groups(&hs, 15);
    assert_eq!(hit.hit.tokens, 12);
    assert!(hit.blocks[1].is_empty());
    m.check_invariants().expect("invariants");
    m.free("a");
    assert_eq!(m.pool().ref_count(r), 0);
    m.check_invariants().expect("invariants");
}
