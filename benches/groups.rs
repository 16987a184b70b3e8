//! KV cache groups: cost per request of the vLLM manager core with one, two and four
//! groups, and the one-group fast calls (the A/B against a tree without groups runs
//! `single` only, which uses nothing but the one-group calls).
//!
//! Each request: a 2,048-token prompt (block 16) behind one of 8 shared 1,024-token
//! prefixes; the prefix-cache lookup, `allocate_slots` adopting the hit, caching the new
//! full blocks, 16 decode steps (one token each, a new block every 16), then `free`; the
//! 512 requests run twice and the second pass is timed (the first touches the pool's pages).
//! The second pass repeats the first's prompts, so each hits 2,032 of its 2,048 tokens (its
//! own blocks, still cached: the pool holds every request's blocks, per group), and the
//! pool has as many blocks per group as the one-group pool.
//! Prints µs per request (the fastest of 7 runs of 512 requests) and µs per lookup on the
//! warm cache (`find_hit` / `find_hit_groups`, fastest of 5 passes per run).
//!
//! Each line gives the fastest run and the median run. `--split` adds where a request's
//! time goes (each phase's fastest run: lookup, prompt allocation, prompt caching, the 16
//! decode steps, free; the clock reads add ~0.1 µs per request). `RUNS=n` sets the runs.
//!
//! ```sh
//! cargo bench --bench groups            # all variants
//! cargo bench --bench groups -- single  # the one-group fast calls only
//! cargo bench --bench groups -- single,groups2  # the fast calls and two groups
//! cargo bench --bench groups -- --split # with the per-phase split
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

/// Runs per variant: `RUNS` from the environment, else 7.
fn runs() -> usize {
    std::env::var("RUNS").ok().and_then(|v| v.parse().ok()).filter(|&n| n > 0).unwrap_or(RUNS)
}

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

/// The median run.
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Phase names of a request (the `--split` report).
const PHASES: [&str; 5] = ["lookup", "alloc", "cache", "decode", "free"];

/// Per-phase time of one run, µs summed over its timed requests (all zero without `--split`).
#[derive(Clone, Copy, Default)]
struct Split {
    on: bool,
    t: [f64; 5],
    last: Option<Instant>,
}

impl Split {
    fn new(on: bool) -> Self {
        Split { on, ..Split::default() }
    }

    /// Starts a request's first phase.
    fn start(&mut self) {
        if self.on {
            self.last = Some(Instant::now());
        }
    }

    /// Ends phase `i` (and starts the next).
    fn lap(&mut self, i: usize, timed: bool) {
        if let (true, Some(l)) = (self.on, self.last) {
            let now = Instant::now();
            if timed {
                self.t[i] += (now - l).as_secs_f64() * 1e6;
            }
            self.last = Some(now);
        }
    }

    fn report(&self) -> String {
        let per = |x: f64| x / REQUESTS as f64;
        PHASES.iter().zip(self.t).map(|(n, t)| format!("{n} {:.2}", per(t))).collect::<Vec<_>>().join(", ")
    }
}

fn num_blocks() -> usize {
    REQUESTS * (PROMPT / BS + 4) + 16
}

/// The one-group fast calls (`find_hit`, `allocate_slots`, `cache_range` / `cache_run`,
/// `free`): µs per request and µs per warm lookup (`find_hit`).
fn single(all: &[Vec<BlockHash>], sp: &mut Split) -> (f64, f64) {
    let mut m = VllmManager::new(num_blocks(), BS, true, false, false).expect("manager");
    let mut t = Instant::now();
    for (r, hs) in all.iter().chain(all.iter()).enumerate() {
        if r == all.len() {
            // The first pass touched every page of the pool's tables (warm-up).
            t = Instant::now();
        }
        let timed = r >= all.len();
        let rid = format!("r{r}");
        sp.start();
        let hit = m.find_hit(&hs[..PROMPT / BS], (PROMPT - 1) / BS, false);
        sp.lap(0, timed);
        let local = hit.len() * BS;
        let s = SlotRequest {
            num_tokens_need_slot: PROMPT,
            num_local_computed: local,
            adopt: true,
            ..SlotRequest::default()
        };
        m.allocate_slots(&rid, &hit, &s).expect("valid").expect("fits");
        sp.lap(1, timed);
        if let Some((a, b)) = m.cache_range(&rid, PROMPT, PROMPT / BS) {
            m.cache_run(&rid, a, &hs[a..b]).expect("fits");
        }
        sp.lap(2, timed);
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
        sp.lap(3, timed);
        black_box(m.blocks(&rid).len());
        m.free(&rid);
        sp.lap(4, timed);
    }
    let per_request = t.elapsed().as_secs_f64() * 1e6 / REQUESTS as f64;
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t = Instant::now();
        for hs in all {
            black_box(m.find_hit(&hs[..PROMPT / BS], (PROMPT - 1) / BS, false).len());
        }
        best = best.min(t.elapsed().as_secs_f64() * 1e6 / REQUESTS as f64);
    }
    (per_request, best)
}

fn layout(groups: Vec<GroupSpec>) -> GroupLayout {
    GroupLayout::new(groups, LayoutOptions { enable_caching: true, ..LayoutOptions::default() })
        .expect("layout")
}

/// The group calls on `groups`: µs per request and µs per warm lookup.
fn grouped(all: &[Vec<BlockHash>], groups: &[GroupSpec], sp: &mut Split) -> (f64, f64) {
    let mut m =
        VllmManager::with_layout(num_blocks() * groups.len(), layout(groups.to_vec()), false, false, None)
            .expect("manager");
    let mut t = Instant::now();
    for (r, hs) in all.iter().chain(all.iter()).enumerate() {
        if r == all.len() {
            // The first pass touched every page of the pool's tables (warm-up).
            t = Instant::now();
        }
        let timed = r >= all.len();
        let rid = format!("r{r}");
        sp.start();
        let hit = m.find_hit_groups(&hs[..PROMPT / BS], PROMPT - 1);
        sp.lap(0, timed);
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
        sp.lap(1, timed);
        let plan = m.cache_plan(&rid, PROMPT, PROMPT / BS, 0);
        let (a, b) = m.plan_hash_range(&plan);
        m.cache_apply(&rid, &plan, a, &hs[a..b]).expect("fits");
        sp.lap(2, timed);
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
        sp.lap(3, timed);
        black_box(m.group_blocks(&rid, 0).len());
        m.free(&rid);
        sp.lap(4, timed);
    }
    let per_request = t.elapsed().as_secs_f64() * 1e6 / REQUESTS as f64;
    let mut best = f64::INFINITY;
    let mut hit = 0;
    for _ in 0..5 {
        hit = 0;
        let t = Instant::now();
        for hs in all {
            hit += black_box(m.find_hit_groups(&hs[..PROMPT / BS], PROMPT - 1).hit.tokens);
        }
        best = best.min(t.elapsed().as_secs_f64() * 1e6 / REQUESTS as f64);
    }
    // The timed pass repeats the first: each prompt hits all its full blocks but the last token's.
    assert_eq!(hit, REQUESTS * (PROMPT - BS), "every warm lookup hits its own cached prompt");
    (per_request, best)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let filter = args.iter().find(|a| !a.starts_with('-'));
    let split = args.iter().any(|a| a == "--split");
    let all: Vec<Vec<BlockHash>> = (0..REQUESTS).map(request_hashes).collect();
    // A filter of comma-separated parts runs each variant whose name contains one.
    let want = |name: &str| filter.is_none_or(|f| f.split(',').any(|p| name.contains(p)));
    // Each phase's fastest run (a phase disturbed in one run is clean in another).
    let fastest_split = |runs: &[(f64, f64, Split)]| {
        let mut m = Split::new(true);
        m.t = [f64::INFINITY; 5];
        for r in runs {
            for (a, b) in m.t.iter_mut().zip(r.2.t) {
                *a = a.min(b);
            }
        }
        m.report()
    };
    if want("single") {
        let runs: Vec<(f64, f64, Split)> = (0..runs())
            .map(|_| {
                let mut sp = Split::new(split);
                let (a, b) = single(&all, &mut sp);
                (a, b, sp)
            })
            .collect();
        let req: Vec<f64> = runs.iter().map(|r| r.0).collect();
        let look: Vec<f64> = runs.iter().map(|r| r.1).collect();
        println!(
            "single (one-group fast calls): {:.2} us/request (median {:.2}), {:.2} us/lookup (median {:.2})",
            best(req.clone()),
            median(req),
            best(look.clone()),
            median(look)
        );
        if split {
            println!("  split us/request: {}", fastest_split(&runs));
        }
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
        let runs: Vec<(f64, f64, Split)> = (0..runs())
            .map(|_| {
                let mut sp = Split::new(split);
                let (a, b) = grouped(&all, &groups, &mut sp);
                (a, b, sp)
            })
            .collect();
        let req: Vec<f64> = runs.iter().map(|r| r.0).collect();
        let look: Vec<f64> = runs.iter().map(|r| r.1).collect();
        println!(
            "{name}: {:.2} us/request (median {:.2}), {:.2} us/lookup (median {:.2})",
            best(req.clone()),
            median(req),
            best(look.clone()),
            median(look)
        );
        if split {
            println!("  split us/request: {}", fastest_split(&runs));
        }
    }
}
