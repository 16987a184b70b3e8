//! Hand-worked vLLM 0.33 `MambaManager` ("align" mode) examples.

use super::super::groups::check_supported;
use super::super::SlotRequest;
use super::*;
use crate::core::groups::spec::{GroupSpec, LayoutOptions};

fn h(i: u8) -> BlockHash {
    BlockHash::from_digest(&[i; 16])
}

fn mamba(bs: usize) -> GroupSpec {
    GroupSpec { kind: GroupKind::Mamba { mode: MambaMode::Align }, block_size: bs }
}

fn manager(groups: Vec<GroupSpec>, num_blocks: usize) -> VllmManager {
    let opt = LayoutOptions { enable_caching: true, ..LayoutOptions::default() };
    let l = GroupLayout::new(groups, opt).expect("layout");
    VllmManager::with_layout(num_blocks, l, true, true, None).expect("manager")
}

fn slots(need: usize, local: usize, processed: usize) -> SlotRequest {
    SlotRequest {
        num_tokens_need_slot: need,
        num_local_computed: local,
        adopt: true,
        processed_tokens: Some(processed),
        num_tokens_main_model: Some(need),
        ..SlotRequest::default()
    }
}

fn step(
    m: &mut VllmManager,
    rid: &str,
    hits: &[Vec<BlockId>],
    s: &SlotRequest,
    hs: &[BlockHash],
) -> Option<Vec<Vec<BlockId>>> {
    let new = m.allocate_slots_groups(rid, hits, s).expect("valid")?;
    let plan = m.cache_plan(rid, s.num_tokens_need_slot, hs.len(), 0);
    m.cache_apply(rid, &plan, 0, hs).expect("cache");
    m.check_invariants().expect("invariants");
    Some(new)
}

const N: BlockId = BlockId::NULL;

#[test]
fn align_mode_keeps_one_state_block_and_defers_same_step_hits() {
    let mut m = manager(vec![GroupSpec::full(4), mamba(4)], 20);
    let hs = vec![h(1), h(2)];
    // Request a: 11 tokens, a first chunk of 8.
    let new = step(&mut m, "a", &[], &slots(8, 0, 0), &hs).expect("fits");
    assert_eq!(new[0].len(), 2);
    assert_eq!(new[1].len(), 2);
    assert_eq!(new[1][0], N);
    let m1 = new[1][1];
    assert_eq!(m.group_blocks("a", 1), &[N, m1]);
    assert_eq!(m.cached_block_of(&h(2), 1), Some(m1));
    assert_eq!(m.cached_block_of(&h(1), 1), None);
    // Request b hits 8 tokens in the same step: the state is not written yet.
    let hit = m.find_hit_groups(&hs, 9);
    assert_eq!(hit.hit.tokens, 8);
    assert_eq!(hit.blocks[1], vec![N, m1]);
    let sb = slots(10, 8, 0);
    let before = m.state_snapshot();
    assert!(m.num_blocks_to_allocate_signed("b", 10, 10, &hit.blocks, 8, false) > 20);
    assert_eq!(m.allocate_slots_groups("b", &hit.blocks, &sb).expect("valid"), None);
    assert_eq!(m.state_snapshot(), before);
    // Next step: it is taken.
    m.new_step_starts();
    assert_eq!(m.num_blocks_to_allocate_signed("b", 10, 10, &hit.blocks, 8, false), 2);
    let new_b = step(&mut m, "b", &hit.blocks, &sb, &hs).expect("fits");
    let m2 = new_b[1][0];
    assert_eq!(new_b[1].len(), 1);
    assert_eq!(m.group_blocks("b", 1), &[N, m1, m2]);
    assert_eq!(m.pool().ref_count(m1), 2);
    // b's next step frees the hit state it resumed from.
    assert_eq!(m.num_blocks_to_allocate_signed("b", 11, 11, &[], 10, false), 0);
    step(&mut m, "b", &[], &slots(11, 10, 10), &hs).expect("fits");
    assert_eq!(m.group_blocks("b", 1), &[N, N, m2]);
    assert_eq!(m.pool().ref_count(m1), 1);
    // a's second chunk: a new state block, the old one kept for the copy.
    let new = step(&mut m, "a", &[], &slots(11, 8, 8), &hs).expect("fits");
    let m3 = new[1][0];
    assert_eq!(m.group_blocks("a", 1), &[N, m1, m3]);
    // Decode: the table covers the tokens; the count may be negative.
    assert_eq!(m.num_blocks_to_allocate_signed("a", 4, 4, &[], 11, false), -2);
    let new = step(&mut m, "a", &[], &slots(12, 11, 11), &hs).expect("fits");
    assert!(new.is_empty(), "no group took a block");
    assert_eq!(m.group_blocks("a", 1), &[N, N, m3]);
    assert!(m.pool().is_free(m1));
    assert_eq!(m.cached_block_of(&h(2), 1), Some(m1));
    // Freed with interior nulls; the cached state stays reusable.
    m.free("a");
    m.free("b");
    m.check_invariants().expect("invariants");
    assert_eq!(m.pool().num_free(), 19);
    m.new_step_starts();
    let hit = m.find_hit_groups(&hs, 9);
    assert_eq!(hit.hit.tokens, 8);
}

#[test]
fn mamba_hits_land_on_the_scheduler_block() {
    // Blocks of 4, a scheduler block of 8: hits are multiples of 8.
    let opt =
        LayoutOptions { enable_caching: true, scheduler_block_size: Some(8), ..LayoutOptions::default() };
    let l = GroupLayout::new(vec![GroupSpec::full(4), mamba(4)], opt).expect("layout");
    let mut m = VllmManager::with_layout(30, l, true, true, None).expect("manager");
    let hs: Vec<BlockHash> = (1..=4).map(h).collect();
    // 12 tokens: caching stops at 8, where Mamba holds no state.
    step(&mut m, "a", &[], &slots(12, 0, 0), &hs).expect("fits");
    assert_eq!(m.group_blocks("a", 1).len(), 3);
    assert_eq!(m.group_num_cached("a", 1), Some(2));
    m.new_step_starts();
    assert_eq!(m.find_hit_groups(&hs, 15).hit.tokens, 0);
    step(&mut m, "a", &[], &slots(16, 12, 12), &hs).expect("fits");
    m.new_step_starts();
    let hit = m.find_hit_groups(&hs, 17);
    assert_eq!(hit.hit.tokens, 16);
    assert_eq!(hit.blocks[1].len(), 4);
    // At most 15 tokens: the state at 12 is not on the scheduler block.
    assert_eq!(m.find_hit_groups(&hs, 15).hit.tokens, 0);
}

#[test]
fn a_mamba_block_larger_than_the_hash_block_registers_its_prompt_tail_and_copies_it() {
    // Full attention of 2 tokens, Mamba of 4 (vLLM's partial hash hit example): a prompt
    // of 7 tokens computed to 6 registers the Mamba state there, inside block 1.
    let opt =
        LayoutOptions { enable_caching: true, allow_partial_hash_hits: true, ..LayoutOptions::default() };
    let l = GroupLayout::new(vec![GroupSpec::full(2), mamba(4)], opt).expect("layout");
    check_supported(&l).expect("supported");
    let mut m = VllmManager::with_layout(20, l, true, true, None).expect("manager");
    assert!(m.partial_hits());
    let hs: Vec<BlockHash> = (1..=4).map(h).collect();
    let cache = |m: &mut VllmManager, rid: &str, n: usize, prompt: usize| {
        m.set_cache_context(prompt, 0);
        let plan = m.cache_plan(rid, n, hs.len(), 0);
        let (lo, hi) = m.plan_hash_range(&plan);
        m.cache_apply(rid, &plan, lo, &hs[lo..hi]).expect("cache");
        let tails = m.tail_plan(rid, n, hs.len(), 0);
        m.cache_tails(rid, &tails, 0, &hs).expect("tails");
        m.check_invariants().expect("invariants");
    };
    let new = m.allocate_slots_groups("p", &[], &slots(6, 0, 0)).expect("ok").expect("fits");
    let s = new[1][1];
    cache(&mut m, "p", 6, 7);
    assert_eq!(m.cached_block_of(&h(3), 1), Some(s));
    assert_eq!(m.group_num_cached("p", 1), Some(1));
    // The producer continues: its state stays in `s`, the entry moves to a copy.
    let new = m.allocate_slots_groups("p", &[], &slots(7, 6, 6)).expect("ok").expect("fits");
    assert!(new.get(1).is_none_or(Vec::is_empty));
    let copies = m.take_cow_copies(1);
    assert_eq!(copies.len(), 1);
    let (src, copy) = copies[0];
    assert_eq!(src, s);
    assert_eq!(m.cached_block_of(&h(3), 1), Some(copy));
    assert_eq!(m.take_cow_offers(), vec![("p".to_owned(), 1, copy, 6)]);
    m.check_invariants().expect("invariants");
    // A hit there is deferred to the next step (the copy runs with this one).
    let hit = m.find_hit_groups(&hs, 7);
    assert_eq!(hit.hit.tokens, 6);
    assert!(m.num_blocks_to_allocate_encoder("c", 8, 8, 0, &hit.blocks, (6, 6), false) > 20);
    m.free("p");
    m.free_blocks(&[src, copy]).expect("the copy's references");
    m.new_step_starts();
    // A consumer hits 6 tokens: full attention's 3 blocks, Mamba's copy; its first
    // allocation copies that block again into its own table.
    let hit = m.find_hit_groups(&hs, 7);
    assert_eq!(hit.hit.tokens, 6);
    assert_eq!(hit.blocks[1], vec![N, copy]);
    let mut s8 = slots(8, 6, 6);
    s8.num_tokens_main_model = Some(8);
    let new = m.allocate_slots_groups("c", &hit.blocks, &s8).expect("ok").expect("fits");
    let mine = new[1][0];
    assert_eq!(m.group_blocks("c", 1), &[N, mine]);
    assert_eq!(m.take_cow_copies(1), vec![(copy, mine)]);
    m.check_invariants().expect("invariants");
    m.free("c");
    m.free_blocks(&[copy, mine]).expect("the copy's references");
    m.check_invariants().expect("invariants");
}

#[test]
fn none_mode_without_caching_allocates_like_a_window_of_one_token() {
    let g = GroupSpec { kind: GroupKind::Mamba { mode: MambaMode::None }, block_size: 4 };
    let l = GroupLayout::new(vec![GroupSpec::full(4), g], LayoutOptions::default()).expect("layout");
    let mut m = VllmManager::with_layout(20, l, false, false, None).expect("manager");
    let new = m.allocate_slots_groups("a", &[], &slots(9, 0, 0)).expect("ok").expect("fits");
    assert_eq!(new[1].len(), 3);
    m.allocate_slots_groups("a", &[], &slots(10, 9, 9)).expect("ok").expect("fits");
    let t = m.group_blocks("a", 1);
    assert_eq!(&t[..2], &[N, N]);
    assert_ne!(t[2], N);
    m.check_invariants().expect("invariants");
}

#[test]
fn speculative_blocks_follow_the_state_and_move_behind_it() {
    // Full 8 + Mamba 8 with two speculative state blocks (MTP beside Mamba).
    let mut m = manager(vec![GroupSpec::full(8), mamba(8)], 30);
    assert!(m.set_mamba_speculative_blocks(&[1, 0]).is_err(), "not a Mamba group");
    m.set_mamba_speculative_blocks(&[0, 2]).expect("set");
    let hs: Vec<BlockHash> = (1..=4).map(h).collect();
    let new = step(&mut m, "a", &[], &slots(8, 0, 0), &hs).expect("fits");
    assert_eq!(new[1].len(), 3, "the state and its two speculative blocks");
    let (s, s1, s2) = (new[1][0], new[1][1], new[1][2]);
    // Two blocks further: the first speculative block falls behind the new state and
    // moves to the table's end; one new block.
    let new = step(&mut m, "a", &[], &slots(24, 8, 8), &hs).expect("fits");
    let t = m.group_blocks("a", 1).to_vec();
    assert_eq!(&t[..4], &[s, N, s2, s1]);
    assert_eq!(t.len(), 5);
    assert_eq!(new[1], vec![s1, t[4]]);
    assert!(m.set_mamba_speculative_blocks(&[0, 1]).is_err(), "requests exist");
    m.free("a");
    m.check_invariants().expect("invariants");
}

#[test]
fn a_prefill_checkpoint_reserves_the_block_before_the_state_and_rekeys_it() {
    // vLLM's internal checkpoint example: full 16 + Mamba 32, hash 16, partial hits on,
    // a 120-token prompt in one chunk exports the state at 112 into table index 2.
    let opt =
        LayoutOptions { enable_caching: true, allow_partial_hash_hits: true, ..LayoutOptions::default() };
    let l = GroupLayout::new(vec![GroupSpec::full(16), mamba(32)], opt).expect("layout");
    let mut m = VllmManager::with_layout(30, l, true, true, None).expect("manager");
    assert!(m.set_mamba_prefill_checkpoints(&[Some(16), None]).is_err(), "not Mamba");
    m.set_mamba_prefill_checkpoints(&[None, Some(16)]).expect("set");
    let hs: Vec<BlockHash> = (1..=7).map(h).collect();
    let new = m.allocate_slots_groups("p", &[], &slots(120, 0, 0)).expect("ok").expect("fits");
    assert_eq!(m.mamba_checkpoints(1), vec![("p".to_owned(), 112, 2)]);
    let t = m.group_blocks("p", 1).to_vec();
    assert_eq!((t[0], t[1]), (N, N));
    assert!(t[2] != N && t[3] != N && t[2] != t[3]);
    assert_eq!(new[1][2..], t[2..]);
    m.set_cache_context(120, 0);
    let plan = m.cache_plan("p", 120, hs.len(), 0);
    let (lo, hi) = m.plan_hash_range(&plan);
    m.cache_apply("p", &plan, lo, &hs[lo..hi]).expect("cache");
    assert_eq!(m.cached_block_of(&h(6), 1), Some(t[2]), "the full block's key at 96 first");
    assert!(m.mamba_checkpoint_evictions("p").is_empty(), "the prompt's checkpoint is kept");
    let tails = m.tail_plan("p", 120, hs.len(), 0);
    assert_eq!(tails, vec![(1, 112)]);
    m.cache_tails("p", &tails, 0, &hs).expect("tails");
    assert_eq!(m.cached_block_of(&h(7), 1), Some(t[2]), "re-keyed at 112");
    assert_eq!(m.cached_block_of(&h(6), 1), None);
    m.check_invariants().expect("invariants");
}
