//! Property test: random KV cache group layouts (full attention, MLA, sliding windows,
//! sliding-window MLA with and without bounded replay, chunked local, align-mode Mamba
//! state, block sizes whose lcm exceeds their gcd; EAGLE off, on every group or on random
//! groups) and random scheduler call sequences on the multi-group vLLM manager. After
//! every call:
//! - `check_invariants()` passes (pool invariants, no block in two groups' tables, cached
//!   blocks keyed for their group);
//! - blocks are conserved: every held block's ref count equals its references in the live
//!   tables (no call here pins blocks outside a table);
//! - sliding-window and chunked-local tables are nulls then real blocks, and right after an
//!   allocation they keep no real block before their rule's window;
//! - right after an allocation an align-mode Mamba table holds at most two real blocks
//!   (the state it resumes from and the new one);
//! - a refused call (caller error) changes nothing: tables, cached counts and free queue;
//! - a group that is not prefix-cacheable hits nothing and caches nothing.
//!
//! A second property runs one full-attention group through the multi-group calls and the
//! one-group fast calls side by side: every answer and the free queue must agree. The exact
//! answers are checked against vLLM itself by `tests/vllm_manager/test_hybrid_golden.py`.
//!
//! Deterministic by default (fixed RNG seed, 96 cases); `PROPTEST_CASES` and
//! `PROPTEST_RNG_SEED` override.

use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, RngSeed};

use kvindex::core::groups::rule::GroupRule;
use kvindex::core::groups::spec::{GroupKind, GroupLayout, GroupSpec, LayoutOptions, MambaMode};
use kvindex::core::ids::{BlockHash, BlockId};
use kvindex::core::vllm_manager::{SlotRequest, VllmManager};

#[derive(Clone, Debug)]
enum Op {
    Admit { rid: u8, family: u8, len: usize, chunk: usize },
    Step { rid: u8, n: usize, lookahead: usize },
    Free { rid: u8 },
    BadHit { rid: u8, block: u32 },
    Evict { block: u32 },
    NewStep,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u8..6, 0u8..3, 1usize..120, 1usize..80).prop_map(|(rid, family, len, chunk)| Op::Admit { rid, family, len, chunk }),
        5 => (0u8..6, 1usize..40, 0usize..3).prop_map(|(rid, n, lookahead)| Op::Step { rid, n, lookahead }),
        2 => (0u8..6).prop_map(|rid| Op::Free { rid }),
        1 => (0u8..6, 0u32..80).prop_map(|(rid, block)| Op::BadHit { rid, block }),
        1 => (0u32..80).prop_map(|block| Op::Evict { block }),
        2 => Just(Op::NewStep),
    ]
}

/// A layout: hash block `h`; each group full (block `h`), MLA, a sliding window, plain
/// or MLA (block `h` or `2h`; an MLA one possibly with bounded replay), chunked local
/// (only when every block is `h`) or align-mode Mamba (block `h`).
fn layout() -> impl Strategy<Value = Vec<GroupSpec>> {
    (prop_oneof![Just(2usize), Just(4)], prop::collection::vec((0u8..7, 1usize..20, any::<bool>()), 1..5))
        .prop_map(|(h, gs)| {
            let mut out = vec![GroupSpec::full(h)];
            for (k, size, wide) in gs {
                if k == 4 {
                    out.push(GroupSpec { kind: GroupKind::Mamba { mode: MambaMode::Align }, block_size: h });
                    continue;
                }
                let bs = if wide { 2 * h } else { h };
                out.push(match k {
                    // A wide full-attention group keeps prompt-tail entries.
                    0 => GroupSpec::full(bs),
                    1 => GroupSpec { kind: GroupKind::Mla, block_size: h },
                    2 => GroupSpec { kind: GroupKind::SlidingWindow { window: size }, block_size: bs },
                    5 | 6 => GroupSpec {
                        kind: GroupKind::SlidingWindowMla { window: size, bounded_replay: k == 6 },
                        block_size: bs,
                    },
                    _ => {
                        GroupSpec { kind: GroupKind::ChunkedLocal { chunk: size * h / 2 + 1 }, block_size: h }
                    }
                });
            }
            out
        })
}

/// Hashes of a prompt of `len` tokens from `family` at hash block `h`: chained, so
/// prompts of one family share their prefix's hashes.
fn prompt_hashes(family: u8, len: usize, h: usize) -> Vec<BlockHash> {
    (0..len / h)
        .map(|i| {
            let mut d = [0u8; 16];
            d[0] = family;
            d[8..16].copy_from_slice(&(i as u64).to_be_bytes());
            BlockHash::from_digest(&d)
        })
        .collect()
}

struct Live {
    hashes: Vec<BlockHash>,
    num_tokens: usize,
    num_computed: usize,
    /// The prompt length and shared-prefix boundary given before each caching call.
    context: (usize, usize),
}

/// Caches `n` computed tokens as the binding does: the prompt context, each group's
/// run, then the prompt tails of full-attention groups larger than the hash block.
fn cache_all(m: &mut VllmManager, name: &str, context: (usize, usize), n: usize, hashes: &[BlockHash]) {
    m.set_cache_context(context.0, context.1);
    let plan = m.cache_plan(name, n, hashes.len(), 0);
    let (lo, hi) = m.plan_hash_range(&plan);
    m.cache_apply(name, &plan, lo, &hashes[lo..hi]).expect("plan fits");
    let tails = m.tail_plan(name, n, hashes.len(), 0);
    m.cache_tails(name, &tails, 0, hashes).expect("tails fit");
}

fn check_conservation(m: &VllmManager) -> Result<(), TestCaseError> {
    let mut refs = vec![0u32; m.pool().num_blocks()];
    for r in m.request_ids(false) {
        for g in 0..m.num_groups() {
            for &b in m.group_blocks(r, g) {
                if b != BlockId::NULL {
                    refs[b.idx()] += 1;
                }
            }
        }
    }
    for (i, &n) in refs.iter().enumerate().skip(1) {
        #[allow(clippy::cast_possible_truncation)]
        let rc = m.pool().ref_count(BlockId(i as u32));
        prop_assert_eq!(n, rc, "block {} referenced {} times, ref count {}", i, n, rc);
    }
    Ok(())
}

/// Tables of windowed groups: a null prefix, then real blocks; after an allocation at
/// `total` computed tokens, no real block before the window.
fn check_windows(m: &VllmManager, rid: &str, total: Option<usize>) -> Result<(), TestCaseError> {
    for (g, spec) in m.layout().groups().iter().enumerate() {
        if spec.kind.is_full() {
            continue;
        }
        let t = m.group_blocks(rid, g);
        if let GroupKind::Mamba { .. } = spec.kind {
            let real = t.iter().filter(|&&b| b != BlockId::NULL).count();
            prop_assert!(total.is_none() || real <= 2, "group {}: Mamba table {:?}", g, t);
            continue;
        }
        let nulls = t.iter().take_while(|&&b| b == BlockId::NULL).count();
        prop_assert!(
            t[nulls..].iter().all(|&b| b != BlockId::NULL),
            "group {}: nulls after real blocks {:?}",
            g,
            t
        );
        if let Some(total) = total {
            let skip = (spec.skipped_tokens(total) / spec.block_size).min(t.len());
            prop_assert!(
                nulls >= skip,
                "group {}: {} nulls, window skips {} blocks: {:?}",
                g,
                nulls,
                skip,
                t
            );
        }
    }
    Ok(())
}

/// `eagle`: None, EAGLE off; a mask, EAGLE on with the groups of its bits flagged
/// `is_eagle_group` (none: every group drops).
fn run(groups: Vec<GroupSpec>, eagle: Option<u8>, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let opt = LayoutOptions { enable_caching: true, use_eagle: eagle.is_some(), ..LayoutOptions::default() };
    let flags: Vec<bool> = (0..groups.len()).map(|g| eagle.is_some_and(|m| m >> g & 1 == 1)).collect();
    let Ok(layout) = GroupLayout::new(groups, opt) else { return Ok(()) };
    let layout = layout.with_eagle_groups(&flags).expect("one flag per group");
    for (g, _) in layout.groups().iter().enumerate() {
        let set = layout.spec_sets().iter().find(|s| s.group_ids.contains(&g));
        prop_assert_eq!(set.is_some(), layout.prefix_cacheable(g));
        prop_assert_eq!(layout.group_eagle(g), set.is_some_and(|s| s.use_eagle));
        let mine = eagle.is_some() && (flags[g] || !flags.iter().any(|&f| f));
        prop_assert!(!mine || !layout.prefix_cacheable(g) || layout.group_eagle(g));
    }
    let h = layout.hash_block_size();
    let Ok(mut m) = VllmManager::with_layout(60, layout, true, true, None) else { return Ok(()) };
    let mut live: Vec<Option<Live>> = (0..6).map(|_| None).collect();
    for op in ops {
        let mut total_after = None;
        let mut rid_checked = None;
        match op {
            Op::Admit { rid, family, len, chunk } => {
                if live[rid as usize].is_some() {
                    continue;
                }
                let name = format!("r{rid}");
                let hashes = prompt_hashes(family, len, h);
                let hit = m.find_hit_groups(&hashes, len - 1);
                let tokens = hit.hit.tokens;
                prop_assert!(tokens < len && tokens % m.layout().alignment() == 0);
                for (g, b) in hit.blocks.iter().enumerate() {
                    prop_assert!(m.layout().prefix_cacheable(g) || b.is_empty(), "group {} hit {:?}", g, b);
                }
                let n = chunk.min(len - tokens).max(1);
                let adopt = hit.blocks.iter().any(|b| !b.is_empty());
                let s = SlotRequest {
                    num_tokens_need_slot: tokens + n,
                    num_local_computed: tokens,
                    adopt,
                    processed_tokens: Some(tokens),
                    num_tokens_main_model: Some(tokens + n),
                    ..SlotRequest::default()
                };
                let hits = if adopt { hit.blocks } else { Vec::new() };
                if let Some(_new) = m.allocate_slots_groups(&name, &hits, &s).expect("valid call") {
                    cache_all(&mut m, &name, (len, 0), tokens + n, &hashes);
                    live[rid as usize] =
                        Some(Live { hashes, num_tokens: len, num_computed: tokens + n, context: (len, 0) });
                    total_after = Some(tokens);
                    rid_checked = Some(name);
                } else {
                    m.free(&name);
                }
            }
            Op::Step { rid, n, lookahead } => {
                let Some(l) = live[rid as usize].as_mut() else { continue };
                let name = format!("r{rid}");
                let remaining = l.num_tokens - l.num_computed;
                let n = if remaining > 0 { n.min(remaining) } else { 1 };
                if remaining == 0 {
                    l.num_tokens += 1;
                    l.hashes = prompt_hashes(255 - rid, l.num_tokens, h);
                }
                let total = l.num_computed;
                let s = SlotRequest {
                    num_tokens_need_slot: total + n + lookahead,
                    num_local_computed: total,
                    processed_tokens: Some(total),
                    num_tokens_main_model: Some(total + n),
                    ..SlotRequest::default()
                };
                if m.allocate_slots_groups(&name, &[], &s).expect("valid call").is_some() {
                    l.num_computed += n;
                    cache_all(&mut m, &name, l.context, l.num_computed.min(l.num_tokens), &l.hashes);
                    total_after = Some(total);
                    rid_checked = Some(name);
                }
            }
            Op::Free { rid } => {
                m.free(&format!("r{rid}"));
                live[rid as usize] = None;
            }
            Op::BadHit { rid, block } => {
                let before = m.state_snapshot();
                let mut hits = vec![Vec::new(); m.num_groups()];
                hits[0].push(BlockId(block));
                let s = SlotRequest { num_tokens_need_slot: 8, adopt: true, ..SlotRequest::default() };
                let name = format!("bad{rid}");
                if m.allocate_slots_groups(&name, &hits, &s).is_err() {
                    prop_assert_eq!(m.state_snapshot(), before);
                } else {
                    m.free(&name);
                }
            }
            Op::Evict { block } => {
                let before = m.state_snapshot();
                if m.evict_blocks(&[i64::from(block)]).is_err() {
                    prop_assert_eq!(m.state_snapshot(), before);
                }
            }
            Op::NewStep => m.new_step_starts(),
        }
        m.check_invariants().map_err(|e| TestCaseError::fail(e.to_string()))?;
        check_conservation(&m)?;
        if let Some(r) = rid_checked {
            check_windows(&m, &r, total_after)?;
        }
        for rid in 0..6u8 {
            check_windows(&m, &format!("r{rid}"), None)?;
        }
    }
    Ok(())
}

/// One full group: the multi-group calls and the one-group calls agree.
fn run_single(bs: usize, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let layout = GroupLayout::single_full(bs, true).expect("valid");
    let mut a = VllmManager::with_layout(40, layout, true, true, None).expect("manager");
    let mut b = VllmManager::new(40, bs, true, true, true).expect("manager");
    let mut live: Vec<Option<(Vec<BlockHash>, usize)>> = (0..6).map(|_| None).collect();
    for op in ops {
        match op {
            Op::Admit { rid, family, len, chunk } => {
                if live[rid as usize].is_some() {
                    continue;
                }
                let name = format!("r{rid}");
                let hashes = prompt_hashes(family, len, bs);
                let ha = a.find_hit_groups(&hashes, len - 1);
                let hb = b.find_hit(&hashes, (len - 1) / bs, false);
                prop_assert_eq!(&ha.blocks[0], &hb);
                let tokens = hb.len() * bs;
                let n = chunk.min(len - tokens).max(1);
                let s = SlotRequest {
                    num_tokens_need_slot: tokens + n,
                    num_local_computed: tokens,
                    adopt: !hb.is_empty(),
                    ..SlotRequest::default()
                };
                let hits = if hb.is_empty() { Vec::new() } else { ha.blocks };
                let na = a.allocate_slots_groups(&name, &hits, &s).expect("valid");
                let nb = b.allocate_slots(&name, &hb, &s).expect("valid");
                prop_assert_eq!(na.as_ref().map(|v| v.first().cloned().unwrap_or_default()), nb.clone());
                if nb.is_some() {
                    let plan = a.cache_plan(&name, tokens + n, hashes.len(), 0);
                    let (lo, hi) = a.plan_hash_range(&plan);
                    a.cache_apply(&name, &plan, lo, &hashes[lo..hi]).expect("fits");
                    if let Some((s0, e0)) = b.cache_range(&name, tokens + n, hashes.len()) {
                        b.cache_run(&name, s0, &hashes[s0..e0]).expect("fits");
                    }
                    live[rid as usize] = Some((hashes, tokens + n));
                } else {
                    a.free(&name);
                    b.free(&name);
                }
            }
            Op::Free { rid } => {
                a.free(&format!("r{rid}"));
                b.free(&format!("r{rid}"));
                live[rid as usize] = None;
            }
            _ => {}
        }
        prop_assert_eq!(a.pool().free_queue().collect::<Vec<_>>(), b.pool().free_queue().collect::<Vec<_>>());
        prop_assert_eq!(a.take_removed(), b.take_removed());
        prop_assert_eq!(a.take_new_ids(), b.take_new_ids());
    }
    Ok(())
}

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(96);
    let seed = std::env::var("PROPTEST_RNG_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(0x6b76_6772);
    ProptestConfig {
        cases,
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn groups_keep_their_rules_and_conserve_blocks(
        groups in layout(),
        eagle in prop::option::of(any::<u8>()),
        ops in prop::collection::vec(op(), 1..60),
    ) {
        run(groups, eagle, ops)?;
    }

    #[test]
    fn one_full_group_agrees_with_the_fast_calls(bs in 1usize..6, ops in prop::collection::vec(op(), 1..60)) {
        run_single(bs, ops)?;
    }
}

// ---------------------------------------------------------------------------------------
// Retention intervals, KV cache zeroing and blocks held by no request.
//
// Random layouts as above with a random retention interval (dense, latest only, or a
// multiple of the scheduler block) and random zeroing groups, and call sequences that mix
// requests with loose blocks (taken, cached for a group, freed). After every call:
// - the invariants hold and blocks are conserved counting loose holdings;
// - every cached sliding-window block is one the dense rule would cache too (sparse
//   retention only drops tails, never adds one);
// - the zeroing log drained after an allocation is exactly the new blocks of the logging
//   groups, in group order; loose blocks are never logged;
// - a refused call (too many loose blocks, a bad cache range) changes nothing.

#[derive(Clone, Debug)]
enum ExtraOp {
    Req(Op),
    TakeLoose { n: usize },
    CacheLoose { group: usize, family: u8 },
    FreeLoose,
}

fn extra_op() -> impl Strategy<Value = ExtraOp> {
    prop_oneof![
        8 => op().prop_map(ExtraOp::Req),
        1 => (0usize..70).prop_map(|n| ExtraOp::TakeLoose { n }),
        1 => (0usize..6, 0u8..3).prop_map(|(group, family)| ExtraOp::CacheLoose { group, family }),
        1 => Just(ExtraOp::FreeLoose),
    ]
}

/// Layouts where sparse retention matters: one sliding window alone (its block is the
/// scheduler block), or full attention beside narrow windows, or any layout above.
fn extra_layout() -> impl Strategy<Value = Vec<GroupSpec>> {
    prop_oneof![
        (prop_oneof![Just(2usize), Just(4)], 1usize..10).prop_map(|(bs, window)| vec![GroupSpec {
            kind: GroupKind::SlidingWindow { window },
            block_size: bs
        }]),
        (prop_oneof![Just(2usize), Just(4)], 1usize..6, any::<bool>()).prop_map(|(h, window, wide)| vec![
            GroupSpec::full(h),
            GroupSpec { kind: GroupKind::SlidingWindow { window }, block_size: if wide { 2 * h } else { h } },
        ]),
        layout(),
    ]
}

fn check_conservation_with(m: &VllmManager, loose: &[BlockId]) -> Result<(), TestCaseError> {
    let mut refs = vec![0u32; m.pool().num_blocks()];
    for r in m.request_ids(false) {
        for g in 0..m.num_groups() {
            for &b in m.group_blocks(r, g) {
                if b != BlockId::NULL {
                    refs[b.idx()] += 1;
                }
            }
        }
    }
    for &b in loose {
        refs[b.idx()] += 1;
    }
    for (i, &n) in refs.iter().enumerate().skip(1) {
        #[allow(clippy::cast_possible_truncation)]
        let rc = m.pool().ref_count(BlockId(i as u32));
        prop_assert_eq!(n, rc, "block {} referenced {} times, ref count {}", i, n, rc);
    }
    Ok(())
}

/// Every sliding-window block a request cached sits where dense caching would put one
/// (`by_loose[b]`: the key a loose caching call gave block `b`, which no rule masks).
fn check_sparse_subset(m: &VllmManager, by_loose: &[Option<BlockHash>]) -> Result<(), TestCaseError> {
    let l = m.layout();
    for (i, loose_key) in by_loose.iter().enumerate().skip(1) {
        #[allow(clippy::cast_possible_truncation)]
        let b = BlockId(i as u32);
        let key = m.pool().block_hash(b);
        if key.is_none() || key == *loose_key {
            continue;
        }
        let g = m.block_group(b);
        let spec = l.groups()[g];
        if !matches!(spec.kind, GroupKind::SlidingWindow { .. }) {
            continue;
        }
        let idx = m.hash_tokens(b) / spec.block_size - 1;
        prop_assert!(
            spec.caches_block(idx, l.scheduler_block_size(), l.use_eagle()),
            "group {} caches block index {} that dense caching skips",
            g,
            idx
        );
    }
    Ok(())
}

fn run_extra(
    groups: Vec<GroupSpec>,
    interval: u8,
    zero_mask: u64,
    ops: Vec<ExtraOp>,
) -> Result<(), TestCaseError> {
    let opt = LayoutOptions { enable_caching: true, ..LayoutOptions::default() };
    let Ok(layout) = GroupLayout::new(groups, opt) else { return Ok(()) };
    let h = layout.hash_block_size();
    let sbs = layout.scheduler_block_size();
    let Ok(mut m) = VllmManager::with_layout(60, layout, true, false, None) else { return Ok(()) };
    let ng = m.num_groups();
    let retention = match interval {
        0 => None,
        1 => Some(0),
        k => Some(usize::from(k - 1) * sbs),
    };
    let is_mamba = |g: &GroupSpec| matches!(g.kind, GroupKind::Mamba { .. });
    let mamba = m.layout().groups().iter().any(is_mamba);
    if m.set_retention_interval(retention).is_err() {
        // Only a layout without windowed groups refuses a positive interval (and any
        // interval is refused beside a Mamba group).
        let windowed = m.layout().groups().iter().any(|g| matches!(g.kind, GroupKind::SlidingWindow { .. }));
        prop_assert!(!windowed || mamba, "a layout with a sliding window refused interval {:?}", retention);
        return Ok(());
    }
    // vLLM zeroes attention groups' blocks only, never a Mamba group's.
    let mamba_bits: u64 =
        m.layout().groups().iter().enumerate().filter(|(_, g)| is_mamba(g)).map(|(i, _)| 1u64 << i).sum();
    let mask = zero_mask & ((1u64 << ng) - 1) & !mamba_bits;
    m.set_zeroing_groups(mask).expect("mask within the groups");
    let mut live: Vec<Option<Live>> = (0..6).map(|_| None).collect();
    let mut loose: Vec<BlockId> = Vec::new();
    let mut by_loose: Vec<Option<BlockHash>> = vec![None; m.pool().num_blocks()];
    for op in ops {
        match op {
            ExtraOp::TakeLoose { n } => {
                let before = m.state_snapshot();
                match m.take_loose(n) {
                    Ok(v) => {
                        prop_assert_eq!(v.len(), n);
                        loose.extend(v);
                    }
                    Err(_) => {
                        prop_assert!(n > m.pool().num_free());
                        prop_assert_eq!(m.state_snapshot(), before);
                    }
                }
                prop_assert!(m.take_new_ids().is_empty(), "loose blocks are not logged for zeroing");
            }
            ExtraOp::CacheLoose { group, family } => {
                let g = group % ng;
                let bs = m.layout().groups()[g].block_size;
                let hashes = prompt_hashes(family, loose.len() * bs, h);
                let before = m.state_snapshot();
                let end = loose.len() + usize::from(family == 2);
                match m.cache_loose(&loose, g, 0, end, 0, &hashes) {
                    Ok(stored) => {
                        for i in stored {
                            by_loose[loose[i].idx()] = m.pool().block_hash(loose[i]);
                        }
                    }
                    Err(_) => prop_assert_eq!(m.state_snapshot(), before),
                }
            }
            ExtraOp::FreeLoose => {
                m.free_blocks(&loose).expect("loose blocks are held");
                loose.clear();
            }
            ExtraOp::Req(op) => match op {
                Op::Admit { rid, family, len, chunk } => {
                    if live[rid as usize].is_some() {
                        continue;
                    }
                    let name = format!("r{rid}");
                    let hashes = prompt_hashes(family, len, h);
                    let hit = m.find_hit_groups(&hashes, len - 1);
                    let tokens = hit.hit.tokens;
                    let n = chunk.min(len - tokens).max(1);
                    let adopt = hit.blocks.iter().any(|b| !b.is_empty());
                    let s = SlotRequest {
                        num_tokens_need_slot: tokens + n,
                        num_local_computed: tokens,
                        adopt,
                        processed_tokens: Some(tokens),
                        ..SlotRequest::default()
                    };
                    let hits = if adopt { hit.blocks } else { Vec::new() };
                    m.set_cache_context(len, usize::from(family) * sbs);
                    match m.allocate_slots_groups(&name, &hits, &s).expect("valid call") {
                        Some(new) => {
                            let logged: Vec<BlockId> = (0..ng)
                                .filter(|&g| mask & (1 << g) != 0)
                                .flat_map(|g| new[g].clone())
                                .collect();
                            prop_assert_eq!(m.take_new_ids(), logged);
                            let context = (len, usize::from(family) * sbs);
                            cache_all(&mut m, &name, context, tokens + n, &hashes);
                            live[rid as usize] =
                                Some(Live { hashes, num_tokens: len, num_computed: tokens + n, context });
                        }
                        None => {
                            m.free(&name);
                            m.take_new_ids();
                        }
                    }
                }
                Op::Step { rid, n, lookahead } => {
                    let Some(l) = live[rid as usize].as_mut() else { continue };
                    let name = format!("r{rid}");
                    let remaining = l.num_tokens - l.num_computed;
                    let n = if remaining > 0 { n.min(remaining) } else { 1 };
                    if remaining == 0 {
                        l.num_tokens += 1;
                        l.hashes = prompt_hashes(255 - rid, l.num_tokens, h);
                    }
                    let total = l.num_computed;
                    let s = SlotRequest {
                        num_tokens_need_slot: total + n + lookahead,
                        num_local_computed: total,
                        processed_tokens: Some(total),
                        ..SlotRequest::default()
                    };
                    if let Some(new) = m.allocate_slots_groups(&name, &[], &s).expect("valid call") {
                        let logged: Vec<BlockId> = (0..ng)
                            .filter(|&g| mask & (1 << g) != 0)
                            .flat_map(|g| new.get(g).cloned().unwrap_or_default())
                            .collect();
                        prop_assert_eq!(m.take_new_ids(), logged);
                        l.num_computed += n;
                        cache_all(&mut m, &name, l.context, l.num_computed.min(l.num_tokens), &l.hashes);
                    }
                }
                Op::Free { rid } => {
                    m.free(&format!("r{rid}"));
                    live[rid as usize] = None;
                }
                Op::NewStep => m.new_step_starts(),
                Op::BadHit { .. } | Op::Evict { .. } => {
                    let name = format!("r{}", ng % 6);
                    let before = m.state_snapshot();
                    if m.record_for_zeroing_groups(&name, 1).is_err() {
                        prop_assert_eq!(m.state_snapshot(), before);
                    }
                    m.take_new_ids();
                }
            },
        }
        m.check_invariants().map_err(|e| TestCaseError::fail(e.to_string()))?;
        check_conservation_with(&m, &loose)?;
        check_sparse_subset(&m, &by_loose)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn retention_zeroing_and_loose_blocks_keep_the_rules(
        groups in extra_layout(),
        interval in 0u8..7,
        zero_mask in any::<u64>(),
        ops in prop::collection::vec(extra_op(), 1..60),
    ) {
        run_extra(groups, interval, zero_mask, ops)?;
    }
}
