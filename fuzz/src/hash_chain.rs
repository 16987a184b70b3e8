//! Fuzz harness for `HashChainCache` (and the `BlockPool` under it).
//!
//! Input: `[num_blocks][block_size][flags]` then operations until the bytes
//! run out (at most [`MAX_OPS`]); see `fuzz/README.md`. After every operation:
//! `check_invariants()`, the pool's accounting, the harness's own record of the
//! running requests, and — when the operation returned a caller error or
//! refused (`None` / `false`) — that the observable state did not change.

use kvindex::core::error::ErrorKind;
use kvindex::core::hash::{HashAlgo, KeySpec, ALGO_NAMES};
use kvindex::core::hash_chain::{HashChainCache, Stats};
use kvindex::core::ids::{BlockHash, BlockId, RequestId};
use kvindex::core::tables::TableSource;

use crate::common::{
    assert_err, check_append, check_append_batch, check_block_tables, check_events, check_free_batch,
    check_mirror, check_slot_mapping, narrow, trace, Batch, Input, Mirror, MAX_OPS, NUM_IDS,
};

/// Operation codes (`opcode byte % NUM_OPS`).
pub mod op {
    /// `[id][prompt][spec][flags]`: flags bit 0 `skip_reading`, bit 1 pass `i32` tokens.
    pub const ADMIT: u8 = 0;
    /// `[id][len % 13][tokens...][flags]`: flags bit 1 pass `i32` tokens.
    pub const APPEND: u8 = 1;
    /// A CSR batch (`common::Batch`).
    pub const APPEND_BATCH: u8 = 2;
    /// `[id]`.
    pub const FREE: u8 = 3;
    /// `[k % 5][ids...]`.
    pub const FREE_BATCH: u8 = 4;
    /// `[k % 5][block id bytes...]`: 255 = i64::MAX, 254 = i64::MIN, 253 = -1,
    /// else `byte % (num_blocks + 2)` (0 and >= num_blocks are invalid).
    pub const EVICT_BLOCKS: u8 = 5;
    /// No argument.
    pub const RESET: u8 = 6;
    /// `[prompt][spec]`.
    pub const LOOKUP: u8 = 7;
    /// No argument.
    pub const TAKE_EVENTS: u8 = 8;
    /// `common::check_block_tables`.
    pub const BLOCK_TABLES: u8 = 9;
    /// `common::check_slot_mapping`.
    pub const SLOT_MAPPING: u8 = 10;
    /// No argument: stats, common prefix, every request's hashes.
    pub const INTROSPECT: u8 = 11;
    /// Operation names, by code (for `KVINDEX_FUZZ_TRACE`).
    pub const NAMES: [&str; NUM_OPS as usize] = [
        "admit",
        "append",
        "append_batch",
        "free",
        "free_batch",
        "evict_blocks",
        "reset",
        "lookup",
        "take_events",
        "block_tables",
        "slot_mapping",
        "introspect",
    ];
    /// Number of operation codes.
    pub const NUM_OPS: u8 = 12;
}

/// `num_blocks` from its header byte.
#[must_use]
pub fn num_blocks_of(b: u8) -> usize {
    match b {
        255 => usize::MAX,
        254 => 1 << 31,
        b => usize::from(b) % 40,
    }
}

/// `block_size` from its header byte.
#[must_use]
pub fn block_size_of(b: u8) -> usize {
    match b {
        255 => (1 << 20) + 1,
        254 => usize::MAX,
        b => usize::from(b) % 9,
    }
}

/// A running request as observed: tokens, block table, hashes.
type ReqView = (usize, Vec<BlockId>, Vec<BlockHash>);

/// Everything observable about the cache, for "an error changes nothing".
#[derive(Debug, PartialEq)]
struct Snapshot {
    queue: Vec<BlockId>,
    blocks: Vec<(u32, Option<BlockHash>)>,
    reqs: Vec<Option<ReqView>>,
    num_requests: usize,
    stats: Stats,
    memo_len: usize,
    num_cached_hashes: usize,
}

fn snapshot(c: &HashChainCache) -> Snapshot {
    let pool = c.pool();
    #[allow(clippy::cast_possible_truncation)]
    let blocks = (0..pool.num_blocks())
        .map(|b| BlockId(b as u32))
        .map(|b| (pool.ref_count(b), pool.block_hash(b)))
        .collect();
    Snapshot {
        queue: pool.free_queue().collect(),
        blocks,
        reqs: (0..NUM_IDS)
            .map(|id| {
                let id = RequestId(id);
                c.table(id).ok().map(|(b, n)| {
                    (n, b.to_vec(), c.request_hashes(id).expect("running request has hashes").to_vec())
                })
            })
            .collect(),
        num_requests: c.num_requests(),
        stats: c.stats(),
        memo_len: c.memo_len(),
        num_cached_hashes: pool.num_cached_hashes(),
    }
}

/// Invariants and pool accounting, after every operation.
fn check(c: &HashChainCache, mirror: &Mirror<KeySpec>) {
    if let Err(e) = c.check_invariants() {
        panic!("HashChainCache::check_invariants: {e}");
    }
    let pool = c.pool();
    let nb = pool.num_blocks();
    #[allow(clippy::cast_possible_truncation)]
    let ids = || (1..nb).map(|b| BlockId(b as u32));
    let in_use = ids().filter(|&b| pool.ref_count(b) > 0).count();
    let cached = ids().filter(|&b| pool.block_hash(b).is_some()).count();
    let cached_free = ids().filter(|&b| pool.block_hash(b).is_some() && pool.ref_count(b) == 0).count();
    assert_eq!(pool.num_free() + in_use + 1, nb, "free + in use + null block == num_blocks");
    assert_eq!(pool.free_queue().count(), pool.num_free(), "free queue length");
    assert!(ids().filter(|&b| pool.is_free(b)).count() == pool.num_free(), "is_free agrees with the queue");
    assert!(cached_free <= pool.num_free(), "cached idle blocks are free");
    assert!(pool.num_cached_hashes() <= cached, "distinct hashes <= cached blocks");
    assert!(c.memo_len() <= cached, "memo entries <= cached blocks");
    assert!(!pool.is_free(BlockId::NULL) && pool.ref_count(BlockId::NULL) == 0, "null block");
    let usage = pool.usage();
    assert!((0.0..=1.0).contains(&usage), "usage {usage}");
    assert_eq!(c.num_requests(), mirror.len(), "running requests");
    check_mirror(c, mirror);
}

/// Runs one fuzz input.
pub fn run(data: &[u8]) {
    let mut inp = Input::new(data);
    let nb = num_blocks_of(inp.u8());
    let bs = block_size_of(inp.u8());
    let flags = inp.u8();
    let algo =
        HashAlgo::parse(ALGO_NAMES[usize::from(flags & 7) % ALGO_NAMES.len()]).expect("known algorithm");
    let events = flags & 8 != 0;
    let seed = [None, Some(""), Some("fuzz")][usize::from(flags >> 4) % 3];
    let valid = (2..=i32::MAX as usize).contains(&nb) && (1..=1 << 20).contains(&bs);
    let mut c = match HashChainCache::new(nb, bs, algo, seed, events) {
        Ok(c) => {
            assert!(valid, "HashChainCache::new({nb}, {bs}) accepted invalid sizes");
            c
        }
        Err(e) => {
            assert!(!valid, "HashChainCache::new({nb}, {bs}) refused valid sizes: {e:?}");
            assert_eq!(e.kind, ErrorKind::InvalidArgument);
            return;
        }
    };
    assert_eq!((c.block_size(), c.algo(), c.pool().num_free()), (bs, algo, nb - 1));
    let mut mirror: Mirror<KeySpec> = Mirror::new();
    if trace() {
        eprintln!("HashChainCache::new({nb}, {bs}, {}, {seed:?}, events={events})", algo.name());
    }
    check(&c, &mirror);
    for _ in 0..MAX_OPS {
        if inp.is_empty() {
            break;
        }
        let code = inp.peek() % op::NUM_OPS;
        step(&mut c, &mut mirror, &mut inp, events);
        if trace() {
            let p = c.pool();
            eprintln!(
                "{:<13} running {:?} free {} cached {} stats {:?}",
                op::NAMES[usize::from(code)],
                (0..NUM_IDS).filter(|id| mirror.contains_key(id)).collect::<Vec<_>>(),
                p.num_free(),
                p.num_cached_hashes(),
                c.stats()
            );
        }
        check(&c, &mirror);
    }
    // Wind down: every request frees, then reset leaves nothing cached.
    let ids: Vec<u64> = mirror.keys().copied().collect();
    c.free_batch(&ids).expect("freeing every running request");
    mirror.clear();
    check(&c, &mirror);
    assert_eq!(c.pool().num_free(), nb - 1, "every block is free when nothing runs");
    c.reset().expect("reset when idle");
    assert_eq!((c.pool().num_cached_hashes(), c.memo_len()), (0, 0), "reset drops every hash");
    check(&c, &mirror);
}

#[allow(clippy::too_many_lines)]
fn step(c: &mut HashChainCache, mirror: &mut Mirror<KeySpec>, inp: &mut Input<'_>, events: bool) {
    let bs = c.block_size();
    let before = snapshot(c);
    // Whether the operation must have left the state as it was.
    let unchanged = match inp.u8() % op::NUM_OPS {
        op::ADMIT => {
            let id = inp.id();
            let tokens = inp.prompt();
            let spec = inp.spec();
            let flags = inp.u8();
            let Ok(spec) = spec else { return };
            let skip = flags & 1 != 0;
            // Token ids outside int32 are refused by every call that takes tokens.
            let fits = narrow(&tokens).is_some();
            let look = match c.lookup(&tokens, &spec) {
                Ok(look) => look,
                Err(e) => {
                    assert!(!fits && e.kind == ErrorKind::InvalidArgument, "lookup: {e:?}");
                    0
                }
            };
            let free = c.pool().num_free();
            let too_large = tokens.len().div_ceil(bs) >= c.pool().num_blocks();
            let res = match narrow(&tokens).filter(|_| flags & 2 != 0) {
                Some(t32) => c.admit(RequestId(id), &t32, spec.clone(), skip),
                None => c.admit(RequestId(id), &tokens, spec.clone(), skip),
            };
            let n = tokens.len();
            match res {
                Ok(Some(hit)) => {
                    assert!(!mirror.contains_key(&id) && n > 0 && fits, "admit accepted a bad request");
                    assert_eq!(hit, if skip { 0 } else { look }, "admit hit == lookup before");
                    assert!(hit < n && hit.is_multiple_of(bs), "hit {hit} of {n}");
                    assert!(n.div_ceil(bs) - hit / bs <= free, "admitted beyond the free blocks");
                    let s = c.stats();
                    assert!(
                        s.requests == before.stats.requests + 1 && s.hits == before.stats.hits + hit as u64
                    );
                    mirror.insert(id, (tokens, spec));
                    false
                }
                Ok(None) => {
                    assert!(!mirror.contains_key(&id) && n > 0 && fits && !too_large);
                    assert!(n.div_ceil(bs) > free, "admission of {n} tokens refused with {free} free blocks");
                    true
                }
                Err(e) if mirror.contains_key(&id) => {
                    assert_eq!(e.kind, ErrorKind::DuplicateRequest, "{e:?}");
                    true
                }
                Err(e) if n > 0 && too_large => {
                    assert_eq!(e.kind, ErrorKind::RequestTooLarge, "admit of {n} tokens: {e:?}");
                    true
                }
                Err(e) => {
                    assert!(
                        (n == 0 || !fits) && e.kind == ErrorKind::InvalidArgument,
                        "admit of {n} tokens: {e:?}"
                    );
                    true
                }
            }
        }
        op::APPEND => {
            let id = inp.id();
            let tokens = inp.tokens(12);
            let flags = inp.u8();
            let res = match narrow(&tokens).filter(|_| flags & 2 != 0) {
                Some(t32) => c.append(RequestId(id), &t32),
                None => c.append(RequestId(id), &tokens),
            };
            if narrow(&tokens).is_none() && mirror.contains_key(&id) {
                assert_err(&res, ErrorKind::InvalidArgument);
                true
            } else {
                check_append(&res, mirror, id, &tokens, bs, before.queue.len())
            }
        }
        op::APPEND_BATCH => {
            let b = Batch::decode(inp);
            let res = c.append_batch(&b.ids, &b.tokens, b.offsets.as_deref());
            if b.shape_ok && narrow(&b.tokens).is_none() {
                // Token ids are checked after the offsets, before the ids.
                assert_err(&res, ErrorKind::InvalidArgument);
                true
            } else {
                check_append_batch(&res, &b, mirror, bs, before.queue.len())
            }
        }
        op::FREE => {
            let id = inp.id();
            let res = c.free(RequestId(id));
            if mirror.remove(&id).is_some() {
                res.expect("free of a running request");
                false
            } else {
                assert_err(&res, ErrorKind::UnknownRequest);
                true
            }
        }
        op::FREE_BATCH => {
            let ids = inp.ids(4);
            let res = c.free_batch(&ids);
            check_free_batch(&res, &ids, mirror)
        }
        op::EVICT_BLOCKS => {
            let nb = c.pool().num_blocks();
            let k = inp.count(4);
            #[allow(clippy::cast_possible_wrap)]
            let ids: Vec<i64> = (0..k)
                .map(|_| match inp.u8() {
                    255 => i64::MAX,
                    254 => i64::MIN,
                    253 => -1,
                    b => (usize::from(b) % (nb + 2)) as i64,
                })
                .collect();
            let res = c.evict_blocks(&ids);
            #[allow(clippy::cast_possible_wrap, clippy::cast_sign_loss)]
            let expected = ids.iter().find_map(|&id| {
                if id < 1 || id >= nb as i64 {
                    Some(ErrorKind::InvalidArgument)
                } else if before.blocks[id as usize].0 > 0 {
                    Some(ErrorKind::BlockInUse)
                } else {
                    None
                }
            });
            match expected {
                Some(kind) => {
                    assert_err(&res, kind);
                    true
                }
                None => {
                    let n = res.expect("evicting idle blocks");
                    let mut distinct: Vec<usize> =
                        ids.iter().map(|&id| usize::try_from(id).expect("valid")).collect();
                    distinct.sort_unstable();
                    distinct.dedup();
                    let had = distinct.iter().filter(|&&b| before.blocks[b].1.is_some()).count();
                    assert_eq!(n, had, "evict_blocks({ids:?}) count");
                    #[allow(clippy::cast_possible_truncation)]
                    for &b in &distinct {
                        assert!(
                            c.pool().block_hash(BlockId(b as u32)).is_none(),
                            "evicted block {b} keeps its hash"
                        );
                    }
                    assert_eq!(
                        c.pool().free_queue().collect::<Vec<_>>(),
                        before.queue,
                        "eviction moved blocks"
                    );
                    n == 0
                }
            }
        }
        op::RESET => {
            let res = c.reset();
            if mirror.is_empty() {
                res.expect("reset when idle");
                assert_eq!((c.pool().num_cached_hashes(), c.memo_len()), (0, 0), "reset drops every hash");
                assert_eq!(
                    c.pool().free_queue().collect::<Vec<_>>(),
                    before.queue,
                    "reset keeps the queue order"
                );
                false
            } else {
                assert_err(&res, ErrorKind::BlockInUse);
                true
            }
        }
        op::LOOKUP => {
            let tokens = inp.prompt();
            let Ok(spec) = inp.spec() else { return };
            let Some(t32) = narrow(&tokens) else {
                assert_err(&c.lookup(&tokens, &spec), ErrorKind::InvalidArgument);
                return;
            };
            let hit = c.lookup(&tokens, &spec).expect("a lookup of int32 token ids cannot fail");
            assert!(
                hit.is_multiple_of(bs) && hit <= tokens.len().saturating_sub(1) / bs * bs,
                "lookup {hit}"
            );
            assert_eq!(c.lookup(&t32, &spec), Ok(hit), "i32 and i64 tokens hash alike");
            let hashes = c.hash_prompt(&tokens, &spec);
            assert_eq!(hashes.len(), tokens.len() / bs);
            true
        }
        op::TAKE_EVENTS => {
            let ev = c.take_events();
            check_events(&ev, events, bs);
            assert!(c.take_events().is_empty(), "events drained twice");
            true
        }
        op::BLOCK_TABLES => {
            check_block_tables(&*c, inp);
            true
        }
        op::SLOT_MAPPING => {
            check_slot_mapping(&*c, inp);
            true
        }
        _ => {
            // INTROSPECT
            let common = c.num_common_prefix_blocks();
            let shortest = mirror.keys().map(|&id| c.blocks(RequestId(id)).map_or(0, <[_]>::len)).min();
            assert!(common <= shortest.unwrap_or(0), "common prefix {common} > shortest table");
            for (id, (tokens, spec)) in mirror.iter() {
                let want = c.hash_prompt(tokens, spec);
                let got = c.request_hashes(RequestId(*id)).expect("running");
                assert_eq!(got, &want[..], "request {id}: hashes of its tokens");
            }
            let s = c.take_stats();
            assert_eq!(s, before.stats);
            assert_eq!(c.stats(), Stats::default(), "take_stats zeroes");
            return;
        }
    };
    if unchanged {
        assert_eq!(snapshot(c), before, "an error, refusal or read changed state");
    }
}
