//! Hand-worked vLLM 0.33 examples of prompt-tail entries (full block 8,
//! hash block 4, a sliding window of one block beside it).

use super::super::SlotRequest;
use super::*;
use crate::core::groups::spec::{GroupKind, GroupSpec, LayoutOptions};

fn h(i: u8) -> BlockHash {
    BlockHash::from_digest(&[i; 16])
}

fn hashes(n: u8) -> Vec<BlockHash> {
    (1..=n).map(h).collect()
}

fn manager(eagle: bool) -> VllmManager {
    let opt = LayoutOptions { enable_caching: true, use_eagle: eagle, ..LayoutOptions::default() };
    let swa = GroupSpec { kind: GroupKind::SlidingWindow { window: 4 }, block_size: 4 };
    let l = GroupLayout::new(vec![GroupSpec::full(8), swa], opt).expect("layout");
    VllmManager::with_layout(40, l, true, false, None).expect("manager")
}

/// One caching call as the binding makes it: the runs, then the tails.
fn cache(m: &mut VllmManager, rid: &str, hs: &[BlockHash], n: usize) -> Vec<CachedRun> {
    let plan = m.cache_plan(rid, n, hs.len(), 0);
    let mut runs = m.cache_apply(rid, &plan, 0, hs).expect("cache");
    let tails = m.tail_plan(rid, n, hs.len(), 0);
    runs.extend(m.cache_tails(rid, &tails, 0, hs).expect("tails"));
    runs.sort_by_key(|r| r.group);
    m.check_invariants().expect("invariants");
    runs
}

fn step(m: &mut VllmManager, rid: &str, need: usize, local: usize) {
    let s = SlotRequest {
        num_tokens_need_slot: need,
        num_local_computed: local,
        adopt: local == 0,
        ..SlotRequest::default()
    };
    m.allocate_slots_groups(rid, &[], &s).expect("ok").expect("fits");
}

#[test]
fn prompt_tail_goes_beside_a_full_hash_and_leaves_with_its_block() {
    let mut m = manager(false);
    let hs = hashes(4);
    m.set_cache_context(14, 0);
    step(&mut m, "a", 14, 0);
    // 14 computed: the scheduler block (8) bounds caching; the tail (12 tokens) is past it.
    let runs = cache(&mut m, "a", &hs[..3], 14);
    assert!(runs.iter().all(|r| r.block_size != 4 || r.group == 1));
    assert_eq!(m.num_cached_keys(), 2);
    // 16 computed: block 1 gets its full hash (hash 4), then the tail's entry (hash 3) beside it.
    step(&mut m, "a", 16, 14);
    let runs = cache(&mut m, "a", &hs, 16);
    let b1 = m.group_blocks("a", 0)[1];
    let shape: Vec<_> = runs.iter().map(|r| (r.group, r.start, r.end, r.block_size)).collect();
    assert_eq!(shape, vec![(0, 1, 2, 8), (0, 2, 3, 4), (1, 2, 4, 4)]);
    assert_eq!(m.vllm_hash(b1), Some(hs[3]));
    assert_eq!(m.hash_tokens(b1), 16);
    assert!(m.holds_key(&hs[2], 0, b1) && !m.holds_key(&hs[2], 1, b1));
    assert_eq!(m.cached_block_of(&hs[2], 0), Some(b1));
    assert_eq!(m.extra_keys(), vec![(hs[2], 0, b1)]);
    assert_eq!(m.num_cached_keys(), 5);
    // Registered once: the next call finds it without reading a hash.
    assert!(m.tail_plan("a", 16, 4, 0).is_empty());
    let _ = m.take_removed_groups();
    // The request ends; taking every free block evicts its hashes, extra key after own hash.
    m.free("a");
    let n = m.pool().num_free();
    m.take_loose(n).expect("all free");
    let removed = m.take_removed_groups();
    let at = removed.iter().position(|&(x, g)| x == hs[3] && g == 0).expect("own hash");
    assert_eq!(removed[at + 1], (hs[2], 0));
    assert_eq!(removed.len(), 5);
    assert!(m.extra_keys().is_empty() && m.num_cached_keys() == 0);
    m.check_invariants().expect("invariants");
}

#[test]
fn eagle_tail_is_promoted_then_registered_beside_the_full_hash() {
    let mut m = manager(true);
    let hs = hashes(4);
    m.set_cache_context(14, 0);
    step(&mut m, "a", 14, 0);
    // EAGLE: 14 cacheable tokens, the tail at 12 goes on block 1, not yet full.
    let runs = cache(&mut m, "a", &hs[..3], 14);
    let b1 = m.group_blocks("a", 0)[1];
    assert_eq!(m.vllm_hash(b1), Some(hs[2]));
    assert_eq!(m.hash_tokens(b1), 12);
    assert!(runs.iter().any(|r| (r.group, r.start, r.block_size, r.removed) == (0, 2, 4, (0, 0))));
    let _ = m.take_removed_groups();
    // Block 1 fills: its partial hash is dropped (logged with the run), the full hash
    // taken, and the tail registered again beside it.
    step(&mut m, "a", 16, 14);
    let runs = cache(&mut m, "a", &hs, 16);
    assert_eq!((runs[0].group, runs[0].start, runs[0].end, runs[0].removed), (0, 1, 2, (0, 1)));
    assert_eq!((runs[1].group, runs[1].start, runs[1].block_size, runs[1].removed), (0, 2, 4, (1, 1)));
    assert_eq!(m.take_removed_groups(), vec![(hs[2], 0)]);
    assert_eq!(m.vllm_hash(b1), Some(hs[3]));
    assert_eq!(m.extra_keys(), vec![(hs[2], 0, b1)]);
    // evict_blocks drops both keys; the tail then comes back as the block's own hash.
    assert_eq!(m.evict_blocks(&[i64::from(b1.0)]).expect("evict"), 1);
    assert_eq!(m.take_removed_groups(), vec![(hs[3], 0), (hs[2], 0)]);
    let runs = cache(&mut m, "a", &hs, 16);
    assert_eq!(runs.len(), 1);
    assert_eq!((m.vllm_hash(b1), m.hash_tokens(b1)), (Some(hs[2]), 12));
    // A silent pop drops one key, nothing logged.
    assert!(m.pop_cached_key(&hs[2], 0, b1));
    assert!(!m.pop_cached_key(&hs[2], 0, b1));
    assert!(m.take_removed_groups().is_empty());
    m.check_invariants().expect("invariants");
}

#[test]
fn mamba_tail_boundaries_follow_vllms_checkpoint_position() {
    use super::mamba_tail_boundary;
    // Below the prompt's last token, rounded down to the hash block.
    assert_eq!(mamba_tail_boundary(7, 2, false, 0), 6);
    assert_eq!(mamba_tail_boundary(8, 2, false, 0), 6);
    assert_eq!(mamba_tail_boundary(1, 2, false, 0), 0);
    // Under EAGLE: one hash block below the prompt's end, rounded down.
    assert_eq!(mamba_tail_boundary(2600, 32, true, 0), 2560);
    assert_eq!(mamba_tail_boundary(2592, 32, true, 0), 2560);
    assert_eq!(mamba_tail_boundary(31, 32, true, 0), 0);
    // With hash lookahead: the lookahead tokens stay for recomputation.
    assert_eq!(mamba_tail_boundary(1089, 64, false, 2), 1024);
    assert_eq!(mamba_tail_boundary(1090, 64, false, 2), 1088);
}
