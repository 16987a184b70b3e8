//! KV cache groups: cost per request of the vLLM manager core with one, two and four
//! groups, and the one-group fast calls (the A/B against a tree without groups runs
//! `single` only, which uses nothing but the one-group calls).
//!
//! Each request: a 2,048-token prompt (block 16) behind one of 8 shared 1,024-token
//! prefixes; the prefix-cache lookup, `allocate_slots` adopting the hit, caching the new
//! full blocks, 16 decode steps (one token each, a new block every 16), then `free`; the
//! 512 requests run twice and the second pass is timed (the first touches the pool's pages).
//! Prints µs per request (the fastest of 7 runs of 512 requests) and, for the group calls,
//! µs per lookup (`find_hit_groups` on the warm cache, fastest of 5 passes per run).
//!
//! ```sh
//! cargo bench --bench groups            # all variants
//! cargo bench --bench groups -- single  # the one-group fast calls only
//! ```

#![allow(clippy::print_stdout)] // a bench prints its figures

use std::hint::black_box;
use std::time::Instant;

use kvindex::core::groups::spec::{GroupKind, GroupLayout, GroupSpec, LayoutOptions};
use kvindex::core::ids::BlockHash;
use kvindex::core::vllm_manager::{SlotRequest, VllmManager};

const BS: usize = 16;
const PROMPT: usize = 2048;
const PREFIX: usize = 1024;
const REQUESTS: usize = 512;
const STEPS: usize = 16;
const RUNS: usize = 7;

fn digest(a: u64, b: u64) -> BlockHash {
    let mut d = [0u8; 32];
    let mut x = a.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ b.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    for c in d.chunks_mut(8) {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        c.copy_from_slice(&(z ^ (z >> 31)).to_be_bytes());
    }
    BlockHash::from_digest(&d)
}

/// Request `r`'s block hashes (prefix family `r % 8`, then its own blocks), decode included.
fn request_hashes(r: usize) -> Vec<BlockHash> {
    let fam = (r % 8) as u64;
    (0..(PROMPT + STEPS) / BS)
        .map(|i| if i < PREFIX / BS { digest(fam, i as u64) } else { digest(1000 + r as u64, i as u64) })
        .collect()
}

/// The fastest run: on a shared, loaded machine the least disturbed one.
fn best(v: Vec<f64>) -> f64 {
    v.into_iter().fold(f64::INFINITY, f64::min)
}

fn num_blocks() -> usize {
    REQUESTS * (PROMPT / BS + 4) + 16
}

/// The one-group fast calls (`find_hit`, `allocate_slots`, `cache_range` / `cache_run`, `free`).
fn single(all: &[Vec<BlockHash>]) -> f64 {
    let mut m = VllmManager::new(num_blocks(), BS, true, false, false).expect("manager");
    let mut t = Instant::now();
    for (r, hs) in all.iter().chain(all.iter()).enumerate() {
        if r == all.len() {
            // The first pass touched every page of the pool's tables (warm-up).
            t = Instant::now();
        }
        let rid = format!("r{r}");
        let hit = m.find_hit(&hs[..PROMPT / BS], (PROMPT - 1) / BS, false);
        let local = hit.len() * BS;
        let s = SlotRequest {
            num_tokens_need_slot: PROMPT,
            num_local_computed: local,
            adopt: true,
            ..SlotRequest::default()
        };
        m.allocate_slots(&rid, &hit, &s).expect("valid").expect("fits");
        if let Some((a, b)) = m.cache_range(&rid, PROMPT, PROMPT / BS) {
            m.cache_run(&rid, a, &hs[a..b]).expect("fits");
        }
        for k in 0..STEPS {
            let total = PROMPT + k;
            let s = SlotRequest {
                num_tokens_need_slot: total + 1,
                num_local_computed: total,
                ..SlotRequest::default()
            };
            m.allocate_slots(&rid, &[], &s).expect("valid").expect("fits");
            let nh = (total + 1) / BS;
            if let Some((a, b)) = m.cache_range(&rid, total + 1, nh) {
                m.cache_run(&rid, a, &hs[a..b]).expect("fits");
            }
        }
        black_box(m.blocks(&rid).len());
        m.free(&rid);
    }
    t.elapsed().as_secs_f64() * 1e6 / REQUESTS as f64
}

fn layout(groups: Vec<GroupSpec>) -> GroupLayout {
    GroupLayout::new(groups, LayoutOptions { enable_caching: true, ..LayoutOptions::default() })
        .expect("layout")
}

/// The group calls on `groups`: µs per request and µs per warm lookup.
fn grouped(all: &[Vec<BlockHash>], groups: &[GroupSpec]) -> (f64, f64) {
    let mut m =
        VllmManager::with_layout(num_blocks() * groups.len(), layout(groups.to_vec()), false, false, None)
            .expect("manager");
    let mut t = Instant::now();
    for (r, hs) in all.iter().chain(all.iter()).enumerate() {
        if r == all.len() {
            // The first pass touched every page of the pool's tables (warm-up).
            t = Instant::now();
        }
        let rid = format!("r{r}");
        let hit = m.find_hit_groups(&hs[..PROMPT / BS], PROMPT - 1);
        let local = hit.hit.tokens;
        let adopt = hit.blocks.iter().any(|b| !b.is_empty());
        let s = SlotRequest {
            num_tokens_need_slot: PROMPT,
            num_local_computed: local,
            adopt,
            processed_tokens: Some(local),
            ..SlotRequest::default()
        };
        m.allocate_slots_groups(&rid, &hit.blocks, &s).expect("valid").expect("fits");
        let plan = m.cache_plan(&rid, PROMPT, PROMPT / BS, 0);
        let (a, b) = m.plan_hash_range(&plan);
        m.cache_apply(&rid, &plan, a, &hs[a..b]).expect("fits");
        for k in 0..STEPS {
            let total = PROMPT + k;
            let s = SlotRequest {
                num_tokens_need_slot: total + 1,
                num_local_computed: total,
                processed_tokens: Some(total),
                ..SlotRequest::default()
            };
            m.allocate_slots_groups(&rid, &[], &s).expect("valid").expect("fits");
            let plan = m.cache_plan(&rid, total + 1, (total + 1) / BS, 0);
            if !plan.is_empty() {
                let (a, b) = m.plan_hash_range(&plan);
                m.cache_apply(&rid, &plan, a, &hs[a..b]).expect("fits");
            }
        }
        black_box(m.group_blocks(&rid, 0).len());
        m.free(&rid);
    }
    let per_request = t.elapsed().as_secs_f64() * 1e6 / REQUESTS as f64;
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t = Instant::now();
        for hs in all {
            black_box(m.find_hit_groups(&hs[..PROMPT / BS], PROMPT - 1).hit.tokens);
        }
        best = best.min(t.elapsed().as_secs_f64() * 1e6 / REQUESTS as f64);
    }
    (per_request, best)
}

fn main() {
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let all: Vec<Vec<BlockHash>> = (0..REQUESTS).map(request_hashes).collect();
    let want = |name: &str| filter.as_deref().is_none_or(|f| name.contains(f));
    if want("single") {
        let v: Vec<f64> = (0..RUNS).map(|_| single(&all)).collect();
        println!("single (one-group fast calls): {:.2} us/request", best(v));
    }
    let swa = |w| GroupSpec { kind: GroupKind::SlidingWindow { window: w }, block_size: BS };
    let cl = GroupSpec { kind: GroupKind::ChunkedLocal { chunk: 512 }, block_size: BS };
    let variants: Vec<(&str, Vec<GroupSpec>)> = vec![
        ("groups1 (full)", vec![GroupSpec::full(BS)]),
        ("groups2 (full + swa128)", vec![GroupSpec::full(BS), swa(128)]),
        (
            "groups4 (full + swa128 + swa1024 + chunked512)",
            vec![GroupSpec::full(BS), swa(128), swa(1024), cl],
        ),
    ];
    for (name, groups) in variants {
        if !want(name) {
            continue;
        }
        let runs: Vec<(f64, f64)> = (0..RUNS).map(|_| grouped(&all, &groups)).collect();
        let req = best(runs.iter().map(|r| r.0).collect());
        let look = best(runs.iter().map(|r| r.1).collect());
        println!("{name}: {req:.2} us/request, {look:.2} us/lookup");
    }
}
