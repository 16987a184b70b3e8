//! Fuzz harness for the vLLM manager over several KV cache groups: a
//! decoded layout (full attention, MLA, sliding windows, chunked local,
//! Mamba state in align / none mode, circular buffers, two block sizes), then admissions with prefix-cache hits, prefill / decode
//! steps, frees, `remove_skipped_blocks`, evictions, resets, pops, blocks
//! taken and cached for no request, and calls with hit blocks that are not
//! hits (caller errors); optionally under a retention interval, with KV
//! cache zeroing logs, partial hash hits (copies drained and freed before
//! each step), Mamba speculative blocks, prefill checkpoints, hash
//! lookahead and the shared-prefix checkpoint.
//!
//! Input: `[num_blocks][hash block][num groups][(kind, param) per group][flags][more flags]`
//! then operations; see `fuzz/README.md`. After every operation:
//! `check_invariants()`; every held block's ref count equals its references
//! in the live tables and queued copies (blocks are conserved); sliding-window and
//! chunked-local tables are nulls then real blocks; a step starts a new
//! scheduler step (`new_step_starts`); after a caller error,
//! tables, cached counts and the free queue are unchanged.

use kvindex::core::groups::spec::{GroupKind, GroupLayout, GroupSpec, LayoutOptions, MambaMode};
use kvindex::core::ids::{BlockHash, BlockId};
use kvindex::core::vllm_manager::{SlotRequest, VllmManager};

use crate::common::{Input, MAX_OPS, NUM_IDS};

/// Operation codes (`opcode byte % NUM_OPS`).
pub mod op {
    /// `[id][family][len][chunk]`.
    pub const ADMIT: u8 = 0;
    /// `[id][n][lookahead]`.
    pub const STEP: u8 = 1;
    /// `[id]`.
    pub const FREE: u8 = 2;
    /// `[id][group][block]`: a hit block that is not a hit.
    pub const BAD_HIT: u8 = 3;
    /// `[block]`.
    pub const EVICT: u8 = 4;
    /// `[id][tokens]`.
    pub const REMOVE_SKIPPED: u8 = 5;
    /// No argument.
    pub const RESET: u8 = 6;
    /// `[id]`: pops the tables, then releases them in reverse.
    pub const POP: u8 = 7;
    /// `[n][group][family]`: takes `n` blocks for no request, caches them for one
    /// group, then frees them.
    pub const LOOSE: u8 = 8;
    /// Number of operation codes.
    pub const NUM_OPS: u8 = 9;
}

fn hashes(family: u8, len: usize, h: usize) -> Vec<BlockHash> {
    (0..len / h)
        .map(|i| {
            let mut d = [0u8; 16];
            d[0] = family;
            d[8..16].copy_from_slice(&(i as u64).to_be_bytes());
            BlockHash::from_digest(&d)
        })
        .collect()
}

/// Decodes the layout; `None` when the manager refuses it (a valid outcome).
fn manager(inp: &mut Input<'_>) -> Option<VllmManager> {
    let nb = 2 + inp.count(60);
    let h = 1 + inp.count(3);
    let n = 1 + inp.count(3);
    let mut groups = Vec::with_capacity(n);
    for _ in 0..n {
        let kind = inp.u8() % 6;
        let p = inp.u8();
        let size = 1 + usize::from(p % 24);
        let bs = if p & 0x80 != 0 { 2 * h } else { h };
        groups.push(match kind {
            0 => GroupSpec::full(bs),
            1 => GroupSpec { kind: GroupKind::Mla, block_size: h },
            2 => GroupSpec { kind: GroupKind::SlidingWindow { window: size }, block_size: bs },
            3 => GroupSpec { kind: GroupKind::ChunkedLocal { chunk: size }, block_size: bs },
            5 => GroupSpec { kind: GroupKind::CircularBuffer, block_size: bs },
            _ => {
                let mode = if p & 1 == 0 { MambaMode::Align } else { MambaMode::None };
                GroupSpec { kind: GroupKind::Mamba { mode }, block_size: bs }
            }
        });
    }
    let flags = inp.u8();
    let more = inp.u8();
    let opt = LayoutOptions {
        enable_caching: flags & 2 == 0,
        use_eagle: flags & 1 != 0,
        allow_partial_hash_hits: more & 1 != 0,
        ..LayoutOptions::default()
    };
    let layout = GroupLayout::new(groups, opt).ok()?;
    let mut m = VllmManager::with_layout(nb, layout, flags & 4 != 0, flags & 8 != 0, None).ok()?;
    let ng = m.num_groups();
    let mamba: Vec<bool> =
        (0..ng).map(|g| matches!(m.layout().groups()[g].kind, GroupKind::Mamba { .. })).collect();
    let align: Vec<bool> = (0..ng)
        .map(|g| matches!(m.layout().groups()[g].kind, GroupKind::Mamba { mode: MambaMode::Align }))
        .collect();
    if more & 2 != 0 {
        // MTP beside Mamba: one or two speculative state blocks.
        let n = 1 + usize::from((more >> 5) & 1);
        let counts: Vec<usize> = mamba.iter().map(|&x| if x { n } else { 0 }).collect();
        m.set_mamba_speculative_blocks(&counts).expect("Mamba groups, no request yet");
    }
    if more & 4 != 0 {
        // Prefill checkpoints at the hash block.
        let a: Vec<Option<usize>> = align.iter().map(|&x| x.then_some(h)).collect();
        m.set_mamba_prefill_checkpoints(&a).expect("align-mode groups, no request yet");
    }
    if more & 8 != 0 {
        m.set_hash_lookahead(1 + usize::from((more >> 6) & 1));
    }
    m.set_mamba_shared_prefix_checkpoint(more & 16 != 0);
    if flags & 16 != 0 {
        // Latest only, or one tail per 1-3 scheduler blocks; a refusal changes nothing.
        let before = m.state_snapshot();
        let every = usize::from((flags >> 5) & 3) * m.layout().scheduler_block_size();
        if m.set_retention_interval(Some(every)).is_err() {
            assert!(m.retention_interval().is_none() && m.state_snapshot() == before);
        }
    }
    if flags & 128 != 0 {
        let all = if m.num_groups() >= 64 { u64::MAX } else { (1u64 << m.num_groups()) - 1 };
        m.set_zeroing_groups(all).expect("a mask within the groups");
    }
    Some(m)
}

fn check(m: &VllmManager) {
    if let Err(e) = m.check_invariants() {
        panic!("{e}");
    }
    let mut refs = vec![0u32; m.pool().num_blocks()];
    for r in m.request_ids(false) {
        for g in 0..m.num_groups() {
            let t = m.group_blocks(r, g);
            for &b in t {
                if b != BlockId::NULL {
                    refs[b.idx()] += 1;
                }
            }
            let kind = m.layout().groups()[g].kind;
            if !kind.is_full() && !matches!(kind, GroupKind::Mamba { .. }) {
                let nulls = t.iter().take_while(|&&b| b == BlockId::NULL).count();
                assert!(t[nulls..].iter().all(|&b| b != BlockId::NULL), "group {g}: nulls after real blocks");
            }
        }
    }
    // A queued copy holds one reference on each endpoint until the engine frees them.
    for (src, dst) in m.pending_cow_copies() {
        refs[src.idx()] += 1;
        refs[dst.idx()] += 1;
    }
    for (i, &n) in refs.iter().enumerate().skip(1) {
        #[allow(clippy::cast_possible_truncation)]
        let rc = m.pool().ref_count(BlockId(i as u32));
        assert_eq!(n, rc, "block {i}: {n} table references, ref count {rc}");
    }
}

/// Per request: its hashes, tokens known and computed.
type Live = Option<(Vec<BlockHash>, usize, usize)>;

fn cache(m: &mut VllmManager, name: &str, tokens: usize, hs: &[BlockHash]) {
    let plan = m.cache_plan(name, tokens, hs.len(), 0);
    let (lo, hi) = m.plan_hash_range(&plan);
    m.cache_apply(name, &plan, lo, &hs[lo..hi]).expect("a plan fits its request");
    // Prompt tails of wide full-attention groups (the prompt length last given).
    let tails = m.tail_plan(name, tokens, hs.len(), 0);
    m.cache_tails(name, &tails, 0, hs).expect("tails fit their request");
}

/// Runs one input (panics on a violation).
pub fn run(data: &[u8]) {
    let mut inp = Input::new(data);
    let Some(mut m) = manager(&mut inp) else { return };
    let h = m.layout().hash_block_size();
    #[allow(clippy::cast_possible_truncation)]
    let mut live: Vec<Live> = (0..NUM_IDS).map(|_| None).collect();
    for _ in 0..MAX_OPS {
        if inp.is_empty() {
            break;
        }
        let code = inp.u8() % op::NUM_OPS;
        match code {
            op::ADMIT => {
                let id = inp.id();
                let family = inp.u8() % 3;
                let len = 1 + inp.count(150);
                let chunk = 1 + inp.count(90);
                #[allow(clippy::cast_possible_truncation)]
                let slot = &mut live[id as usize];
                if slot.is_some() {
                    continue;
                }
                let name = format!("r{id}");
                let hs = hashes(family, len, h);
                let hit = m.find_hit_groups(&hs, len - 1);
                let tokens = hit.hit.tokens;
                m.set_cache_context(len, hit.hit.tokens + hit.hit.uncached_common_prefix);
                m.set_cache_computed(0);
                m.set_request_tokens(len);
                assert!(tokens < len, "a hit leaves the last token");
                let n = chunk.min(len - tokens).max(1);
                let adopt = hit.blocks.iter().any(|b| !b.is_empty());
                let s = SlotRequest {
                    num_tokens_need_slot: tokens + n,
                    num_local_computed: tokens,
                    adopt,
                    processed_tokens: Some(tokens),
                    full_sequence_tokens: chunk.is_multiple_of(2).then_some(len),
                    ..SlotRequest::default()
                };
                let hits = if adopt { hit.blocks } else { Vec::new() };
                if m.allocate_slots_groups(&name, &hits, &s).expect("a valid call").is_some() {
                    cache(&mut m, &name, tokens + n, &hs);
                    *slot = Some((hs, len, tokens + n));
                } else {
                    m.free(&name);
                }
            }
            op::STEP => {
                let id = inp.id();
                let n = 1 + inp.count(40);
                let la = inp.count(2);
                let name = format!("r{id}");
                #[allow(clippy::cast_possible_truncation)]
                let Some((hs, known, done)) = live[id as usize].as_mut() else {
                    continue;
                };
                let remaining = *known - *done;
                let n = if remaining > 0 { n.min(remaining) } else { 1 };
                if remaining == 0 {
                    *known += 1;
                    #[allow(clippy::cast_possible_truncation)]
                    let fam = 200 + id as u8;
                    *hs = hashes(fam, *known, h);
                }
                let total = *done;
                let s = SlotRequest {
                    num_tokens_need_slot: total + n + la,
                    num_local_computed: total,
                    processed_tokens: Some(total),
                    num_tokens_main_model: Some(total + n),
                    ..SlotRequest::default()
                };
                // The last step's copies ran: the engine frees their endpoints.
                for g in 0..m.num_groups() {
                    for (src, dst) in m.take_cow_copies(g) {
                        m.free_blocks(&[src, dst]).expect("a copy's endpoints are held");
                    }
                }
                m.new_step_starts();
                m.set_cache_computed(total);
                m.set_request_tokens(*known);
                let hs2 = hs.clone();
                let known2 = *known;
                if m.allocate_slots_groups(&name, &[], &s).expect("a valid call").is_some() {
                    #[allow(clippy::cast_possible_truncation)]
                    if let Some(l) = live[id as usize].as_mut() {
                        l.2 += n;
                    }
                    cache(&mut m, &name, (total + n).min(known2), &hs2);
                }
            }
            op::FREE => {
                let id = inp.id();
                m.free(&format!("r{id}"));
                #[allow(clippy::cast_possible_truncation)]
                let slot = &mut live[id as usize];
                *slot = None;
            }
            op::BAD_HIT => {
                let id = inp.id();
                let g = inp.count(7);
                let block = u32::from(inp.u8());
                let before = m.state_snapshot();
                let mut hits = vec![Vec::new(); m.num_groups()];
                if g < hits.len() {
                    hits[g].push(BlockId(block));
                } else {
                    hits.push(vec![BlockId(block)]);
                }
                let s = SlotRequest { num_tokens_need_slot: 4, adopt: true, ..SlotRequest::default() };
                let name = format!("bad{id}");
                match m.allocate_slots_groups(&name, &hits, &s) {
                    Err(_) => assert!(m.state_snapshot() == before, "a refused call changed state"),
                    Ok(_) => m.free(&name),
                }
            }
            op::EVICT => {
                let b = i64::from(inp.u8());
                let before = m.state_snapshot();
                if m.evict_blocks(&[b]).is_err() {
                    assert!(m.state_snapshot() == before, "a refused eviction changed state");
                }
            }
            op::REMOVE_SKIPPED => {
                let id = inp.id();
                let p = inp.count(200);
                #[allow(clippy::cast_possible_truncation)]
                let done = live[id as usize].as_ref().map_or(p, |l| l.2.min(p));
                m.remove_skipped_blocks(&format!("r{id}"), done);
            }
            op::RESET => {
                let _ = m.reset();
            }
            op::LOOSE => {
                let n = inp.count(16);
                let g = inp.count(4) % m.num_groups();
                let family = inp.u8() % 3;
                let before = m.state_snapshot();
                match m.take_loose(n) {
                    Ok(loose) => {
                        assert_eq!(loose.len(), n);
                        let bs = m.layout().groups()[g].block_size;
                        let hs = hashes(family, n * bs, h);
                        let before_cache = m.state_snapshot();
                        if m.cache_loose(&loose, g, 0, n, 0, &hs).is_err() {
                            assert!(
                                m.state_snapshot() == before_cache,
                                "a refused cache_loose changed state"
                            );
                        }
                        m.check_invariants().unwrap_or_else(|e| panic!("{e}"));
                        m.free_blocks(&loose).expect("loose blocks are held");
                    }
                    Err(_) => assert!(m.state_snapshot() == before, "a refused take_loose changed state"),
                }
            }
            _ => {
                let id = inp.id();
                let popped = m.pop_blocks(&format!("r{id}"));
                let rev: Vec<BlockId> = popped.into_iter().rev().collect();
                m.free_blocks(&rev).expect("popped blocks are held");
                #[allow(clippy::cast_possible_truncation)]
                let slot = &mut live[id as usize];
                *slot = None;
            }
        }
        // Zeroing logs hold blocks some group allocated (the null block never).
        assert!(m.take_new_ids().iter().all(|&b| b != BlockId::NULL), "the null block logged as new");
        check(&m);
    }
}
