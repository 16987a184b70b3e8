//! The running step against the general path: the same calls on two copies
//! of a manager, one through [`VllmManager::allocate_slots_groups`] (which
//! takes the running step where it can), the other through the general path
//! only; results, tables, free queue and logs must agree after every call.

use super::super::groups::CachedRun;
use super::super::{SlotRequest, VllmManager};
use crate::core::groups::spec::{GroupKind, GroupLayout, GroupSpec, LayoutOptions};
use crate::core::ids::{BlockHash, BlockId};

fn spec(kind: GroupKind, block_size: usize) -> GroupSpec {
    GroupSpec { kind, block_size }
}

fn layouts() -> Vec<(Vec<GroupSpec>, bool)> {
    let swa = |w, bs| spec(GroupKind::SlidingWindow { window: w }, bs);
    vec![
        (vec![GroupSpec::full(4)], false),
        (vec![GroupSpec::full(4), swa(8, 4)], false),
        (vec![GroupSpec::full(4), swa(8, 4)], true),
        (vec![GroupSpec::full(2), swa(5, 2), spec(GroupKind::ChunkedLocal { chunk: 8 }, 4)], false),
        (vec![GroupSpec::full(3), swa(7, 3)], false),
        (vec![GroupSpec::full(4), spec(GroupKind::CrossAttention, 4)], false),
        (
            vec![
                GroupSpec::full(4),
                spec(GroupKind::SlidingWindowMla { window: 8, bounded_replay: true }, 4),
            ],
            false,
        ),
    ]
}

/// A small xorshift generator (deterministic).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

fn hash(r: usize, i: usize) -> BlockHash {
    let mut d = [0u8; 32];
    d[..8].copy_from_slice(&((r % 3) as u64).to_le_bytes());
    d[8..16].copy_from_slice(&(i as u64).to_le_bytes());
    if i > 3 {
        d[16..24].copy_from_slice(&(r as u64).to_le_bytes());
    }
    BlockHash::from_digest(&d)
}

type Step = Option<Vec<Vec<BlockId>>>;

/// Logs and state that must agree.
fn state(
    m: &mut VllmManager,
) -> (impl PartialEq + std::fmt::Debug, Vec<(BlockHash, usize)>, Vec<Vec<BlockId>>) {
    let ng = m.num_groups();
    let new = (0..ng).map(|g| m.take_new_ids_group(g)).collect();
    (m.state_snapshot(), m.take_removed_groups(), new)
}

fn cache(m: &mut VllmManager, rid: &str, tokens: usize, hs: &[BlockHash]) -> Vec<CachedRun> {
    let hbs = m.layout().hash_block_size();
    let plan = m.cache_plan(rid, tokens, (tokens / hbs).min(hs.len()), 0);
    if plan.is_empty() {
        return Vec::new();
    }
    let (a, b) = m.plan_hash_range(&plan);
    m.cache_apply(rid, &plan, a, &hs[a..b]).expect("fits")
}

#[test]
fn running_steps_agree_with_the_general_path() {
    for (li, (groups, eagle)) in layouts().into_iter().enumerate() {
        let opt = LayoutOptions { enable_caching: true, use_eagle: eagle, ..LayoutOptions::default() };
        let Ok(layout) = GroupLayout::new(groups, opt) else { continue };
        let mut fast = VllmManager::with_layout(48, layout, true, true, None).expect("manager");
        let mut slow = fast.clone();
        let mut rng = Rng(0x9e37_79b9 + li as u64);
        let mut live: Vec<(usize, usize)> = Vec::new();
        let hbs = fast.layout().hash_block_size();
        let (mut ran, mut news) = (0, 0);
        for step in 0..3000 {
            let pick = rng.below(10);
            if pick == 0 || live.is_empty() {
                // A new request: its prompt through the general path on both.
                let r = step;
                let n = 1 + rng.below(30);
                let hs: Vec<BlockHash> = (0..64).map(|i| hash(r, i)).collect();
                let hit = fast.find_hit_groups(&hs[..n / hbs], n - 1);
                let local = hit.hit.tokens;
                let s = SlotRequest {
                    num_tokens_need_slot: n,
                    num_local_computed: local,
                    adopt: true,
                    processed_tokens: if rng.below(4) == 0 { None } else { Some(local) },
                    reserved_blocks: rng.below(2),
                    num_encoder_tokens: if rng.below(2) == 0 { 0 } else { rng.below(12) },
                    ..SlotRequest::default()
                };
                let rid = format!("r{r}");
                news += usize::from(fast.clone().new_request_step(&rid, &hit.blocks, &s).is_some());
                let any = hit.blocks.iter().any(|b| !b.is_empty());
                let a = fast.allocate_slots_groups(&rid, &hit.blocks, &s).expect("valid");
                let b = slow.allocate_general(&rid, &hit.blocks, &s, any).expect("valid");
                assert_eq!(a, b, "layout {li} step {step} prompt");
                if a.is_some() {
                    assert_eq!(cache(&mut fast, &rid, n, &hs), cache(&mut slow, &rid, n, &hs));
                    live.push((r, n));
                }
            } else if pick == 1 {
                let (r, _) = live.swap_remove(rng.below(live.len()));
                fast.free(&format!("r{r}"));
                slow.free(&format!("r{r}"));
            } else {
                // A decode (or chunk) step of a live request.
                let k = rng.below(live.len());
                let (r, total) = live[k];
                let span = if rng.below(4) == 0 { 9 } else { 1 };
                let add = 1 + rng.below(span);
                let s = SlotRequest {
                    num_tokens_need_slot: total + add + rng.below(2) * hbs,
                    num_local_computed: total,
                    processed_tokens: if rng.below(5) == 0 { None } else { Some(total) },
                    reserved_blocks: rng.below(3),
                    watermark_blocks: rng.below(3),
                    num_encoder_tokens: rng.below(2) * rng.below(12),
                    ..SlotRequest::default()
                };
                let rid = format!("r{r}");
                ran += usize::from(fast.clone().running_step(&rid, &s).is_some());
                let a: Step = fast.allocate_slots_groups(&rid, &[], &s).expect("valid");
                let b: Step = slow.allocate_general(&rid, &[], &s, false).expect("valid");
                assert_eq!(a, b, "layout {li} step {step} decode");
                if a.is_some() {
                    let hs: Vec<BlockHash> = (0..128).map(|i| hash(r, i)).collect();
                    let t = total + add;
                    assert_eq!(cache(&mut fast, &rid, t, &hs), cache(&mut slow, &rid, t, &hs));
                    live[k].1 = t;
                }
            }
            let (sa, ra, na) = state(&mut fast);
            let (sb, rb, nb) = state(&mut slow);
            assert_eq!(sa, sb, "layout {li} step {step}: tables and free queue");
            assert_eq!((ra, na), (rb, nb), "layout {li} step {step}: logs");
            fast.check_invariants().expect("invariants");
        }
        assert!(ran > 1000 && news > 100, "layout {li}: {ran} running steps, {news} new requests");
    }
}
