//! Property test: random operation sequences on `HashChainCache` against a tiny
//! reference model of vLLM 0.33's block pool.
//!
//! The model keys a cached block by (extra-key spec, every token of the prefix up
//! to the block's end) instead of by a hash, so it is independent of the hashing
//! code. It tracks ref counts, the free queue order (head = next victim, lazy hash
//! eviction on reallocation, freed unhashed blocks to the front, hashed ones to the
//! tail, in reverse table order) and the hash -> blocks map (first inserted first).
//! After every operation the cache must agree with it on results, hit lengths, the
//! free queue, block tables and which blocks are cached under which prefix; an
//! operation that fails must change nothing; `check_invariants()` must pass.
//!
//! Deterministic by default (fixed RNG seed, 256 cases); `PROPTEST_CASES` and
//! `PROPTEST_RNG_SEED` override.

use std::collections::{HashMap, VecDeque};

use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, RngSeed};

use kvindex::core::error::ErrorKind;
use kvindex::core::hash::{BlockHasher, HashAlgo, KeySpec, ALGO_NAMES};
use kvindex::core::hash_chain::{HashChainCache, Stats};
use kvindex::core::ids::{BlockHash, BlockId, RequestId};
use kvindex::core::tables::TableSource;

// ---------------------------------------------------------------------------------------
// Operations
// ---------------------------------------------------------------------------------------

/// Prompts are a cut of one of a few shared prefixes plus a private suffix.
const NUM_PREFIXES: usize = 3;
const PREFIX_LEN: usize = 24;
const NUM_SPECS: u8 = 3;
const MAX_ID: u64 = 6;

#[derive(Clone, Debug)]
enum Op {
    Admit { id: u64, prefix: usize, cut: usize, suffix: Vec<i64>, spec: u8, skip_reading: bool },
    Append { id: u64, tokens: Vec<i64> },
    Free { id: u64 },
    Evict { ids: Vec<i64> },
    Reset,
    Lookup { prefix: usize, cut: usize, suffix: Vec<i64>, spec: u8 },
}

fn op_strategy(num_blocks: usize) -> impl Strategy<Value = Op> {
    let nb = num_blocks as i64;
    prop_oneof![
        6 => (0..MAX_ID, 0..NUM_PREFIXES, 0..=PREFIX_LEN, prop::collection::vec(0i64..4, 0..10), 0..NUM_SPECS, prop::bool::weighted(0.1))
            .prop_map(|(id, prefix, cut, suffix, spec, skip_reading)| Op::Admit { id, prefix, cut, suffix, spec, skip_reading }),
        4 => (0..MAX_ID, prop::collection::vec(0i64..3, 0..7)).prop_map(|(id, tokens)| Op::Append { id, tokens }),
        3 => (0..MAX_ID).prop_map(|id| Op::Free { id }),
        1 => prop::collection::vec(-1i64..=nb, 0..4).prop_map(|ids| Op::Evict { ids }),
        1 => Just(Op::Reset),
        1 => (0..NUM_PREFIXES, 0..=PREFIX_LEN, prop::collection::vec(0i64..4, 0..6), 0..NUM_SPECS)
            .prop_map(|(prefix, cut, suffix, spec)| Op::Lookup { prefix, cut, suffix, spec }),
    ]
}

fn prefix_tokens(p: usize) -> Vec<i64> {
    // distinct prefixes that share their first 4 tokens (so they diverge mid-block)
    (0..PREFIX_LEN as i64).map(|i| if i < 4 { 1000 + i } else { 1000 * (p as i64 + 2) + i }).collect()
}

fn prompt(prefix: usize, cut: usize, suffix: &[i64]) -> Vec<i64> {
    let mut t = prefix_tokens(prefix)[..cut].to_vec();
    t.extend_from_slice(suffix);
    t
}

fn key_spec(spec: u8) -> KeySpec {
    match spec {
        0 => KeySpec::default(),
        1 => KeySpec::new(None, Some("tenant-a".into()), vec![]).expect("valid spec"),
        _ => KeySpec::new(Some(("lora-x".into(), "/p/x".into())), None, vec![]).expect("valid spec"),
    }
}

// ---------------------------------------------------------------------------------------
// Reference model
// ---------------------------------------------------------------------------------------

/// A cached block's identity: the request's spec and the whole prefix it ends.
type Key = (u8, Vec<i64>);

#[derive(Clone, Debug, PartialEq)]
struct MReq {
    tokens: Vec<i64>,
    spec: u8,
    blocks: Vec<usize>,
    num_cached: usize,
}

#[derive(Clone, Debug, PartialEq)]
struct Model {
    bs: usize,
    refs: Vec<u32>,
    keys: Vec<Option<Key>>,
    queue: VecDeque<usize>,
    map: HashMap<Key, Vec<usize>>,
    reqs: HashMap<u64, MReq>,
    stats: (u64, u64, u64),
}

impl Model {
    fn new(num_blocks: usize, bs: usize) -> Self {
        Model {
            bs,
            refs: vec![0; num_blocks],
            keys: vec![None; num_blocks],
            queue: (1..num_blocks).collect(),
            map: HashMap::new(),
            reqs: HashMap::new(),
            stats: (0, 0, 0),
        }
    }

    fn key(&self, spec: u8, tokens: &[i64], i: usize) -> Key {
        (spec, tokens[..(i + 1) * self.bs].to_vec())
    }

    /// Longest run of cached full blocks from block 0, capped at `(n - 1) / bs`.
    fn hit_blocks(&self, spec: u8, tokens: &[i64]) -> usize {
        let cap = tokens.len().saturating_sub(1) / self.bs;
        (0..cap).take_while(|&i| self.map.contains_key(&self.key(spec, tokens, i))).count()
    }

    fn lookup(&self, spec: u8, tokens: &[i64]) -> usize {
        self.hit_blocks(spec, tokens) * self.bs
    }

    fn allocate(&mut self, n: usize, out: &mut Vec<usize>) {
        for _ in 0..n {
            let b = self.queue.pop_front().expect("caller checked");
            if let Some(k) = self.keys[b].take() {
                let list = self.map.get_mut(&k).expect("hashed block is mapped");
                list.retain(|&x| x != b);
                if list.is_empty() {
                    self.map.remove(&k);
                }
            }
            assert_eq!(self.refs[b], 0);
            self.refs[b] = 1;
            out.push(b);
        }
    }

    fn cache_full(&mut self, r: &mut MReq) {
        for i in r.num_cached..r.tokens.len() / self.bs {
            let k = self.key(r.spec, &r.tokens, i);
            let b = r.blocks[i];
            assert!(self.keys[b].is_none());
            self.keys[b] = Some(k.clone());
            self.map.entry(k).or_default().push(b);
        }
        r.num_cached = r.tokens.len() / self.bs;
    }

    fn admit(&mut self, id: u64, tokens: &[i64], spec: u8, skip: bool) -> Result<Option<usize>, ErrorKind> {
        if self.reqs.contains_key(&id) {
            return Err(ErrorKind::DuplicateRequest);
        }
        if tokens.is_empty() {
            return Err(ErrorKind::InvalidArgument);
        }
        if tokens.len().div_ceil(self.bs) > self.refs.len() - 1 {
            return Err(ErrorKind::RequestTooLarge); // more blocks than the pool's usable ones
        }
        let k = if skip { 0 } else { self.hit_blocks(spec, tokens) };
        let mut blocks: Vec<usize> = (0..k).map(|i| self.map[&self.key(spec, tokens, i)][0]).collect();
        let new = tokens.len().div_ceil(self.bs) - k;
        let free_hits = blocks.iter().filter(|&&b| self.refs[b] == 0).count();
        if new + free_hits > self.queue.len() {
            return Ok(None);
        }
        for &b in &blocks {
            if self.refs[b] == 0 {
                self.queue.retain(|&x| x != b);
            }
            self.refs[b] += 1;
        }
        self.allocate(new, &mut blocks);
        let mut r = MReq { tokens: tokens.to_vec(), spec, blocks, num_cached: k };
        self.cache_full(&mut r);
        self.reqs.insert(id, r);
        self.stats.0 += 1;
        self.stats.1 += tokens.len() as u64;
        self.stats.2 += (k * self.bs) as u64;
        Ok(Some(k * self.bs))
    }

    fn append(&mut self, id: u64, tokens: &[i64]) -> Result<bool, ErrorKind> {
        let mut r = self.reqs.get(&id).ok_or(ErrorKind::UnknownRequest)?.clone();
        let need = (r.tokens.len() + tokens.len()).div_ceil(self.bs) - r.blocks.len();
        if need > self.queue.len() {
            return Ok(false);
        }
        r.tokens.extend_from_slice(tokens);
        let mut blocks = std::mem::take(&mut r.blocks);
        self.allocate(need, &mut blocks);
        r.blocks = blocks;
        self.cache_full(&mut r);
        self.reqs.insert(id, r);
        Ok(true)
    }

    fn free(&mut self, id: u64) -> Result<(), ErrorKind> {
        let r = self.reqs.remove(&id).ok_or(ErrorKind::UnknownRequest)?;
        let mut front = Vec::new();
        for &b in r.blocks.iter().rev() {
            self.refs[b] -= 1;
            if self.refs[b] == 0 {
                if self.keys[b].is_some() {
                    self.queue.push_back(b);
                } else {
                    front.push(b);
                }
            }
        }
        for &b in front.iter().rev() {
            self.queue.push_front(b);
        }
        Ok(())
    }

    fn evict(&mut self, ids: &[i64]) -> Result<usize, ErrorKind> {
        for &id in ids {
            if id < 1 || id >= self.refs.len() as i64 {
                return Err(ErrorKind::InvalidArgument);
            }
            if self.refs[id as usize] > 0 {
                return Err(ErrorKind::BlockInUse);
            }
        }
        let mut n = 0;
        for &id in ids {
            let b = id as usize;
            if let Some(k) = self.keys[b].take() {
                let list = self.map.get_mut(&k).expect("mapped");
                list.retain(|&x| x != b);
                if list.is_empty() {
                    self.map.remove(&k);
                }
                n += 1;
            }
        }
        Ok(n)
    }

    fn reset(&mut self) -> Result<(), ErrorKind> {
        if !self.reqs.is_empty() {
            return Err(ErrorKind::BlockInUse);
        }
        self.map.clear();
        self.keys.iter_mut().for_each(|k| *k = None);
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// Comparing the cache with the model
// ---------------------------------------------------------------------------------------

type ReqPrint = Option<(usize, Vec<BlockId>, Vec<BlockHash>)>;

/// Everything observable about the cache's state.
#[derive(Debug, PartialEq)]
struct Fingerprint {
    queue: Vec<BlockId>,
    num_free: usize,
    stats: Stats,
    blocks: Vec<(u32, Option<BlockHash>)>,
    reqs: Vec<ReqPrint>,
}

fn fingerprint(c: &HashChainCache) -> Fingerprint {
    let pool = c.pool();
    Fingerprint {
        queue: pool.free_queue().collect(),
        num_free: pool.num_free(),
        stats: c.stats(),
        blocks: (0..pool.num_blocks() as u32)
            .map(|b| (pool.ref_count(BlockId(b)), pool.block_hash(BlockId(b))))
            .collect(),
        reqs: (0..MAX_ID)
            .map(|id| {
                let id = RequestId(id);
                c.num_tokens(id).ok().map(|n| {
                    (n, c.blocks(id).expect("known").to_vec(), c.request_hashes(id).expect("known").to_vec())
                })
            })
            .collect(),
    }
}

fn chain_hash(hasher: &mut BlockHasher, bs: usize, key: &Key) -> BlockHash {
    let mut out = Vec::new();
    hasher.extend_chain(&key.1, bs, &key_spec(key.0), &mut out);
    *out.last().expect("a key covers at least one block")
}

fn check_agrees(c: &HashChainCache, m: &Model, hasher: &mut BlockHasher) -> Result<(), TestCaseError> {
    if let Err(e) = c.check_invariants() {
        return Err(TestCaseError::fail(format!("{e}")));
    }
    let pool = c.pool();
    let nb = pool.num_blocks();
    // free + held + null == num_blocks
    let held = (1..nb).filter(|&b| pool.ref_count(BlockId(b as u32)) > 0).count();
    prop_assert_eq!(pool.num_free() + held, nb - 1);
    prop_assert_eq!(pool.num_free(), m.queue.len());
    let q: Vec<usize> = pool.free_queue().map(BlockId::idx).collect();
    prop_assert_eq!(&q, &m.queue.iter().copied().collect::<Vec<_>>(), "free queue order");
    prop_assert_eq!(c.num_requests(), m.reqs.len());
    let s = c.stats();
    prop_assert_eq!((s.requests, s.queries, s.hits), m.stats);
    for b in 0..nb {
        prop_assert_eq!(pool.ref_count(BlockId(b as u32)), m.refs[b], "ref count of block {}", b);
        match (&m.keys[b], pool.block_hash(BlockId(b as u32))) {
            (None, None) => {}
            (Some(k), Some(h)) => prop_assert_eq!(h, chain_hash(hasher, m.bs, k), "hash of block {}", b),
            (k, h) => prop_assert!(false, "block {}: model key {:?}, cache hash {:?}", b, k, h),
        }
    }
    for (id, r) in &m.reqs {
        let rid = RequestId(*id);
        let blocks: Vec<usize> = c.blocks(rid).expect("running").iter().map(|b| b.idx()).collect();
        prop_assert_eq!(&blocks, &r.blocks, "block table of request {}", id);
        prop_assert_eq!(c.num_tokens(rid).expect("running"), r.tokens.len());
    }
    Ok(())
}

fn run_ops(num_blocks: usize, bs: usize, algo: &str, ops: &[Op]) -> Result<(), TestCaseError> {
    let algo = HashAlgo::parse(algo).expect("known algo");
    let mut c = HashChainCache::new(num_blocks, bs, algo, Some("prop"), false).expect("valid sizes");
    let mut m = Model::new(num_blocks, bs);
    let mut hasher = BlockHasher::new(algo, Some("prop"));
    check_agrees(&c, &m, &mut hasher)?;
    for (step, op) in ops.iter().enumerate() {
        let before = fingerprint(&c);
        let model_before = m.clone();
        // Some(kind) when the op failed with a caller error
        let failed: Option<ErrorKind> = match op {
            Op::Admit { id, prefix, cut, suffix, spec, skip_reading } => {
                let t = prompt(*prefix, *cut, suffix);
                let want = m.lookup(*spec, &t);
                prop_assert_eq!(
                    c.lookup(&t, &key_spec(*spec)),
                    Ok(want),
                    "step {}: lookup before admit",
                    step
                );
                let got = c.admit(RequestId(*id), &t, key_spec(*spec), *skip_reading).map_err(|e| e.kind);
                let exp = m.admit(*id, &t, *spec, *skip_reading);
                prop_assert_eq!(got, exp, "step {}: {:?}", step, op);
                if got == Ok(None) {
                    prop_assert_eq!(
                        &fingerprint(&c),
                        &before,
                        "step {}: a refused admission changed state",
                        step
                    );
                }
                got.err()
            }
            Op::Append { id, tokens } => {
                let got = c.append(RequestId(*id), tokens).map_err(|e| e.kind);
                prop_assert_eq!(got, m.append(*id, tokens), "step {}: {:?}", step, op);
                if got == Ok(false) {
                    prop_assert_eq!(
                        &fingerprint(&c),
                        &before,
                        "step {}: a refused append changed state",
                        step
                    );
                }
                got.err()
            }
            Op::Free { id } => {
                let got = c.free(RequestId(*id)).map_err(|e| e.kind);
                prop_assert_eq!(got, m.free(*id), "step {}: {:?}", step, op);
                got.err()
            }
            Op::Evict { ids } => {
                let got = c.evict_blocks(ids).map_err(|e| e.kind);
                prop_assert_eq!(got, m.evict(ids), "step {}: {:?}", step, op);
                got.err()
            }
            Op::Reset => {
                let got = c.reset().map_err(|e| e.kind);
                prop_assert_eq!(got, m.reset(), "step {}: {:?}", step, op);
                got.err()
            }
            Op::Lookup { prefix, cut, suffix, spec } => {
                let t = prompt(*prefix, *cut, suffix);
                prop_assert_eq!(
                    c.lookup(&t, &key_spec(*spec)).expect("a hash-chain lookup cannot fail"),
                    m.lookup(*spec, &t),
                    "step {}: {:?}",
                    step,
                    op
                );
                prop_assert_eq!(&fingerprint(&c), &before, "step {}: lookup changed state", step);
                None
            }
        };
        if failed.is_some() {
            prop_assert_eq!(&fingerprint(&c), &before, "step {}: failed op {:?} changed state", step, op);
            prop_assert_eq!(&m, &model_before);
        }
        check_agrees(&c, &m, &mut hasher)
            .map_err(|e| TestCaseError::fail(format!("step {step} after {op:?}: {e}")))?;
    }
    // wind down: free everything, then reset must succeed and leave every block free
    let ids: Vec<u64> = m.reqs.keys().copied().collect();
    for id in ids {
        c.free(RequestId(id)).map_err(|e| TestCaseError::fail(e.msg))?;
        m.free(id).expect("model knows it");
    }
    check_agrees(&c, &m, &mut hasher)?;
    prop_assert_eq!(c.pool().num_free(), num_blocks - 1);
    c.reset().map_err(|e| TestCaseError::fail(e.msg))?;
    m.reset().expect("idle");
    check_agrees(&c, &m, &mut hasher)?;
    prop_assert_eq!(c.pool().num_cached_hashes(), 0);
    Ok(())
}

fn config() -> ProptestConfig {
    let env = ProptestConfig::default(); // reads PROPTEST_* from the environment
    ProptestConfig {
        cases: if std::env::var_os("PROPTEST_CASES").is_some() { env.cases } else { 256 },
        rng_seed: if std::env::var_os("PROPTEST_RNG_SEED").is_some() {
            env.rng_seed
        } else {
            RngSeed::Fixed(0x6b76_696e_6465_7802)
        },
        failure_persistence: None,
        ..env
    }
}

fn case_strategy() -> impl Strategy<Value = (usize, usize, &'static str, Vec<Op>)> {
    (2usize..28, prop::sample::select(vec![1usize, 2, 3, 4]), prop::sample::select(ALGO_NAMES.to_vec()))
        .prop_flat_map(|(nb, bs, algo)| {
            (Just(nb), Just(bs), Just(algo), prop::collection::vec(op_strategy(nb), 1..60))
        })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn hash_chain_cache_matches_model((num_blocks, bs, algo, ops) in case_strategy()) {
        run_ops(num_blocks, bs, algo, &ops)?;
    }
}

// ---------------------------------------------------------------------------------------
// A few fixed sequences (the model's own sanity, and regressions)
// ---------------------------------------------------------------------------------------

#[test]
fn fixed_sequences_match_model() {
    let a = |id, prefix, cut| Op::Admit { id, prefix, cut, suffix: vec![], spec: 0, skip_reading: false };
    let seqs: Vec<(usize, usize, Vec<Op>)> = vec![
        // shared prefix hits, then a full hit capped at n-1
        (
            16,
            4,
            vec![
                a(0, 0, 24),
                a(1, 0, 24),
                Op::Free { id: 0 },
                a(2, 0, 13),
                Op::Free { id: 1 },
                Op::Free { id: 2 },
                a(3, 0, 24),
            ],
        ),
        // pressure: lazy eviction of cached free blocks from the head
        (
            8,
            4,
            vec![a(0, 0, 24), Op::Free { id: 0 }, a(1, 1, 20), a(2, 0, 24), Op::Free { id: 1 }, a(2, 0, 24)],
        ),
        // decode growth registers new full blocks; a second turn hits them
        (
            16,
            4,
            vec![
                a(0, 0, 6),
                Op::Append { id: 0, tokens: vec![1, 2, 3, 4, 5, 6, 7] },
                Op::Free { id: 0 },
                Op::Admit {
                    id: 1,
                    prefix: 0,
                    cut: 6,
                    suffix: vec![1, 2, 3, 4, 5, 6, 7, 9],
                    spec: 0,
                    skip_reading: false,
                },
            ],
        ),
        // errors: duplicate, unknown, evict in use / out of range, reset in use, empty prompt
        (
            8,
            2,
            vec![
                a(0, 0, 5),
                a(0, 1, 5),
                Op::Free { id: 4 },
                Op::Append { id: 4, tokens: vec![1] },
                Op::Evict { ids: vec![1] },
                Op::Evict { ids: vec![0] },
                Op::Evict { ids: vec![8] },
                Op::Reset,
                a(1, 0, 0),
                Op::Free { id: 0 },
                Op::Free { id: 0 },
                Op::Evict { ids: vec![1, 2, 3, 3] },
                Op::Reset,
            ],
        ),
        // smallest pool
        (2, 1, vec![a(0, 0, 1), a(1, 0, 1), Op::Free { id: 0 }, a(1, 0, 1), a(2, 0, 2)]),
    ];
    for (nb, bs, ops) in seqs {
        for algo in ALGO_NAMES {
            if let Err(e) = run_ops(nb, bs, algo, &ops) {
                panic!("{nb} blocks, bs {bs}, {algo}: {e}");
            }
        }
    }
}

/// A refused admission keeps its prompt for the retry (at most 32); `reset`
/// releases every kept prompt.
#[test]
fn reset_releases_refused_prompts() {
    let mut c =
        HashChainCache::new(4, 4, HashAlgo::parse("sha256").expect("known"), None, false).expect("valid");
    let spec = KeySpec::new(None, None, Vec::new()).expect("valid");
    // Request 100 holds 2 of the 3 usable blocks: 3-block prompts fit the pool, not now.
    assert!(matches!(c.admit(RequestId(100), &[7; 8], spec.clone(), false), Ok(Some(_))));
    for id in 0..40u64 {
        let p: Vec<i64> = (0..12).map(|t| t + 1000 * i64::try_from(id).expect("small")).collect();
        assert_eq!(c.admit(RequestId(id), &p, spec.clone(), false), Ok(None));
    }
    assert_eq!(c.num_pending_prompts(), 32);
    c.free(RequestId(100)).expect("running");
    c.reset().expect("no request runs");
    assert_eq!(c.num_pending_prompts(), 0);
    c.check_invariants().expect("consistent");
}
