//! Fuzz harness for `RadixPrefixCache` (radix tree + `PagePool`): admit,
//! append, append_batch, checkpoint, free, free_batch, evict, reset, lookup,
//! block tables, slot mappings and events.
//!
//! Input: `[num_blocks][page size][flags]` then operations; see
//! `fuzz/README.md`. After every operation: `check_invariants()`, the pool's
//! accounting, the harness's record of the running requests, and — after a
//! caller error, a refusal or a read — that the observable state is unchanged.

use kvindex::core::error::ErrorKind;
use kvindex::core::ids::{PageId, RequestId};
use kvindex::core::radix::pools::ComponentPool;
use kvindex::core::radix::Components;
use kvindex::core::radix_cache::{namespace, narrow_tokens, PoolSizes, RadixPrefixCache};
use kvindex::core::request::Stats;
use kvindex::core::tables::TableSource;

use crate::common::{
    assert_err, check_append, check_append_batch, check_block_tables, check_events, check_free_batch,
    check_mirror, check_slot_mapping, trace, Batch, Input, Mirror, MAX_OPS, NUM_IDS,
};
use crate::hash_chain::num_blocks_of;
use crate::radix_tree::{page_size_of, policy_of};

/// Operation codes (`opcode byte % NUM_OPS`).
pub mod op {
    /// `[id][prompt][spec][flags]`: flags bit 0 `skip_reading`.
    pub const ADMIT: u8 = 0;
    /// `[id][len % 13][tokens...]`.
    pub const APPEND: u8 = 1;
    /// A CSR batch (`common::Batch`).
    pub const APPEND_BATCH: u8 = 2;
    /// `[id]`.
    pub const CHECKPOINT: u8 = 3;
    /// `[id]`.
    pub const FREE: u8 = 4;
    /// `[k % 5][ids...]`.
    pub const FREE_BATCH: u8 = 5;
    /// `[tokens]`: 255 = usize::MAX, else `byte % 48`.
    pub const EVICT: u8 = 6;
    /// No argument.
    pub const RESET: u8 = 7;
    /// `[prompt][spec]`.
    pub const LOOKUP: u8 = 8;
    /// `common::check_block_tables`.
    pub const BLOCK_TABLES: u8 = 9;
    /// `common::check_slot_mapping`.
    pub const SLOT_MAPPING: u8 = 10;
    /// No argument: events, stats, common prefix, cached tokens.
    pub const INTROSPECT: u8 = 11;
    /// Operation names, by code (for `KVINDEX_FUZZ_TRACE`).
    pub const NAMES: [&str; NUM_OPS as usize] = [
        "admit",
        "append",
        "append_batch",
        "checkpoint",
        "free",
        "free_batch",
        "evict",
        "reset",
        "lookup",
        "block_tables",
        "slot_mapping",
        "introspect",
    ];
    /// Number of operation codes.
    pub const NUM_OPS: u8 = 12;
}

/// Everything observable, for "an error / refusal / read changes nothing".
#[derive(Debug, PartialEq)]
struct Snapshot {
    dump: String,
    seqs: Vec<(Option<String>, Vec<i32>)>,
    free: Vec<PageId>,
    refs: Vec<u32>,
    reqs: Vec<Option<(usize, Vec<PageId>, usize)>>,
    stats: Stats,
    locks: u64,
    components: Components4,
}

/// Free SWA pages, free Mamba states, the tree's SWA sizes and Mamba sizes.
type Components4 = (Option<usize>, Option<usize>, (usize, usize), (usize, usize));

fn snapshot(c: &RadixPrefixCache) -> Snapshot {
    let pool = c.pool();
    #[allow(clippy::cast_possible_truncation)]
    let refs = (0..pool.num_pages()).map(|p| pool.ref_count(PageId(p as u32))).collect();
    Snapshot {
        dump: c.tree().dump(),
        seqs: c.tree().sequences(),
        free: pool.free_pages().collect(),
        refs,
        reqs: (0..NUM_IDS)
            .map(|id| {
                let id = RequestId(id);
                c.table(id).ok().map(|(b, n)| (n, b.to_vec(), c.num_cached_tokens(id).expect("running")))
            })
            .collect(),
        stats: c.stats(),
        locks: c.tree().num_own_locks(),
        components: (
            c.swa_pool().map(ComponentPool::num_free),
            c.mamba_pool().map(ComponentPool::num_free),
            c.tree().swa_sizes(),
            c.tree().mamba_sizes(),
        ),
    }
}

fn check(c: &RadixPrefixCache, mirror: &Mirror<Option<String>>) {
    if let Err(e) = c.check_invariants() {
        panic!("RadixPrefixCache::check_invariants: {e}\n{}", c.tree().dump());
    }
    let pool = c.pool();
    let ps = c.page_size();
    let n = pool.num_pages();
    #[allow(clippy::cast_possible_truncation)]
    let held = (1..n).filter(|&p| pool.ref_count(PageId(p as u32)) > 0).count();
    assert_eq!(pool.num_free() + held + 1, n, "free + held + null page == num_pages");
    assert_eq!(pool.free_pages().count(), pool.num_free());
    assert_eq!(pool.ref_count(PageId::NULL), 0, "null page");
    let t = c.tree();
    assert!(t.total_size().is_multiple_of(ps) && t.evictable_size().is_multiple_of(ps));
    let full = pool.num_free() + t.evictable_size() / ps;
    match c.swa_pool() {
        Some(swa) => {
            assert_eq!(c.num_free_blocks(), full.min(swa.num_free() + t.swa_sizes().0 / ps));
            assert!(
                swa.num_used() <= pool.num_pages() - 1 - pool.num_free(),
                "an SWA page pairs with a full one"
            );
        }
        None => assert_eq!(c.num_free_blocks(), full),
    }
    if let Some(m) = c.mamba_pool() {
        let (e, p) = t.mamba_sizes();
        assert!(e + p <= m.num_used(), "the tree's states are the pool's");
    }
    assert!(c.num_free_blocks() < n, "available pages <= usable pages");
    let usage = c.usage();
    assert!((0.0..=1.0).contains(&usage), "usage {usage}");
    assert_eq!(c.num_requests(), mirror.len());
    if mirror.is_empty() {
        assert_eq!(pool.num_free() + t.total_size() / ps + 1, n, "idle: every page is free or the tree's");
        assert_eq!(t.protected_size(), 0, "idle: nothing locked");
    }
    check_mirror(c, mirror);
}

fn tokens32(tokens: &[i64]) -> Option<Vec<i32>> {
    match narrow_tokens(tokens) {
        Ok(v) => Some(v),
        Err(e) => {
            assert!(tokens.iter().any(|&x| i32::try_from(x).is_err()), "narrow_tokens refused {tokens:?}");
            assert_eq!(e.kind, ErrorKind::InvalidArgument);
            None
        }
    }
}

/// Pages one request may hold: the full pool's usable pages or the SWA pool's.
fn usable_pages(c: &RadixPrefixCache) -> usize {
    let full = c.pool().num_pages() - 1;
    c.swa_pool().map_or(full, |s| full.min(s.capacity()))
}

/// Runs one fuzz input.
pub fn run(data: &[u8]) {
    let mut inp = Input::new(data);
    let nb = num_blocks_of(inp.u8());
    let ps = page_size_of(inp.u8());
    let flags = inp.u8();
    let policy = policy_of(flags);
    let events = flags & 0x40 != 0;
    let valid = (2..i32::MAX as usize).contains(&nb) && (1..=1 << 20).contains(&ps);
    // Flags bit 7: a hybrid tree, `[hy]` follows: window `hy % 8` (0: none),
    // bit 3 Mamba, `hy >> 4` sizes the SWA pool and the Mamba states.
    let (comps, sizes) = if flags & 0x80 != 0 {
        let hy = inp.u8();
        let w = usize::from(hy % 8);
        let k = usize::from(hy >> 4);
        let comps = Components { swa_window: (w > 0).then_some(w), mamba: hy & 8 != 0 };
        let swa_blocks = (w > 0 && valid).then(|| 1 + k % (nb - 1));
        let mamba_states = (hy & 8 != 0).then_some(1 + k % 4);
        (comps, PoolSizes { swa_blocks, mamba_states })
    } else {
        (Components::default(), PoolSizes::default())
    };
    let mut c = match RadixPrefixCache::with_components(nb, ps, policy, events, comps, sizes) {
        Ok(c) => {
            assert!(valid, "RadixPrefixCache::new({nb}, {ps}) accepted invalid sizes");
            c
        }
        Err(e) => {
            assert!(!valid, "RadixPrefixCache::new({nb}, {ps}) refused valid sizes: {e:?}");
            assert_eq!(e.kind, ErrorKind::InvalidArgument);
            return;
        }
    };
    let usable = sizes.swa_blocks.unwrap_or(nb - 1);
    assert_eq!((c.page_size(), c.pool().num_free(), c.num_free_blocks()), (ps, nb - 1, usable));
    let mut mirror: Mirror<Option<String>> = Mirror::new();
    if trace() {
        eprintln!("RadixPrefixCache::new({nb}, {ps}, {}, events={events})", policy.name());
    }
    check(&c, &mirror);
    for _ in 0..MAX_OPS {
        if inp.is_empty() {
            break;
        }
        let code = inp.peek() % op::NUM_OPS;
        step(&mut c, &mut mirror, &mut inp, events);
        if trace() {
            eprintln!(
                "{:<13} running {:?} free {} available {} stats {:?}\n{}",
                op::NAMES[usize::from(code)],
                (0..NUM_IDS).filter(|id| mirror.contains_key(id)).collect::<Vec<_>>(),
                c.pool().num_free(),
                c.num_free_blocks(),
                c.stats(),
                c.tree().dump()
            );
        }
        check(&c, &mirror);
    }
    // Wind down: free everything; then every page is free or the tree's.
    let ids: Vec<u64> = mirror.keys().copied().collect();
    c.free_batch(&ids).expect("freeing every running request");
    mirror.clear();
    check(&c, &mirror);
    let total = c.tree().total_size();
    assert_eq!(c.evict(usize::MAX), total, "with nothing running the whole tree is evictable");
    assert_eq!(c.pool().num_free(), nb - 1);
    c.reset().expect("reset when idle");
    check(&c, &mirror);
}

#[allow(clippy::too_many_lines)]
fn step(c: &mut RadixPrefixCache, mirror: &mut Mirror<Option<String>>, inp: &mut Input<'_>, events: bool) {
    let ps = c.page_size();
    let before = snapshot(c);
    let avail = c.num_free_blocks();
    let unchanged = match inp.u8() % op::NUM_OPS {
        op::ADMIT => {
            let id = inp.id();
            let tokens = inp.prompt();
            let spec = inp.spec();
            let skip = inp.u8() & 1 != 0;
            let (Some(t32), Ok(spec)) = (tokens32(&tokens), spec) else { return };
            let ns = namespace(&spec);
            let look = c.lookup(&t32, &spec);
            assert_eq!(look.is_ok(), ns.is_ok(), "lookup and namespace agree on the spec");
            let res = c.admit(RequestId(id), &t32, &spec, skip);
            let n = t32.len();
            match res {
                Ok(Some(hit)) => {
                    assert!(!mirror.contains_key(&id) && n > 0, "admit accepted a bad request");
                    let look = look.expect("valid spec");
                    assert_eq!(hit, if skip { 0 } else { look }, "admit hit == lookup before");
                    assert!(hit < n && hit.is_multiple_of(ps), "hit {hit} of {n}");
                    assert!(n.div_ceil(ps) - hit / ps <= avail, "admitted beyond the available pages");
                    assert_eq!(c.num_cached_tokens(RequestId(id)), Ok(hit));
                    mirror.insert(id, (tokens, ns.expect("valid spec")));
                    false
                }
                Ok(None) => {
                    assert!(!mirror.contains_key(&id) && n > 0 && n.div_ceil(ps) <= usable_pages(c));
                    let look = look.expect("valid spec");
                    let need = n.div_ceil(ps) - if skip { 0 } else { look / ps };
                    // A hybrid cache may also wait for SWA pages or a Mamba state.
                    let hybrid = c.swa_pool().is_some() || c.mamba_pool().is_some();
                    assert!(hybrid || need > c.pool().num_free(), "admission refused with enough free pages");
                    true
                }
                Err(e) if mirror.contains_key(&id) => {
                    assert_eq!(e.kind, ErrorKind::DuplicateRequest, "{e:?}");
                    true
                }
                Err(e) if n > 0 && n.div_ceil(ps) > usable_pages(c) => {
                    assert_eq!(e.kind, ErrorKind::RequestTooLarge, "admit of {n} tokens: {e:?}");
                    true
                }
                Err(e) => {
                    assert!(n == 0 || ns.is_err(), "admit refused a valid request: {e:?}");
                    assert_eq!(e.kind, ErrorKind::InvalidArgument);
                    true
                }
            }
        }
        op::APPEND => {
            let id = inp.id();
            let tokens = inp.tokens(12);
            let Some(t32) = tokens32(&tokens) else { return };
            let res = c.append(RequestId(id), &t32);
            check_append(&res, mirror, id, &tokens, ps, avail)
        }
        op::APPEND_BATCH => {
            let b = Batch::decode(inp);
            let Some(t32) = tokens32(&b.tokens) else { return };
            let res = c.append_batch(&b.ids, &t32, b.offsets.as_deref());
            check_append_batch(&res, &b, mirror, ps, avail)
        }
        op::CHECKPOINT => {
            let id = inp.id();
            let res = c.checkpoint(RequestId(id));
            match mirror.get(&id) {
                None => {
                    assert_err(&res, ErrorKind::UnknownRequest);
                    true
                }
                Some((tokens, ns)) => {
                    res.expect("checkpoint of a running request");
                    let full = tokens.len() / ps * ps;
                    if c.swa_pool().is_some() || c.mamba_pool().is_some() {
                        // A hybrid checkpoint waits without a Mamba state to fork, and
                        // hits stop where the window's SWA KV is gone.
                        let cached = c.num_cached_tokens(RequestId(id)).expect("running");
                        assert!(
                            cached <= full && cached.is_multiple_of(ps),
                            "checkpoint cached {cached} of {full}"
                        );
                        return;
                    }
                    assert_eq!(
                        c.num_cached_tokens(RequestId(id)),
                        Ok(full),
                        "checkpoint caches the full pages"
                    );
                    assert_eq!(hit_after(c, tokens, ns), full, "a checkpointed sequence hits");
                    false
                }
            }
        }
        op::FREE => {
            let id = inp.id();
            let res = c.free(RequestId(id));
            match mirror.remove(&id) {
                None => {
                    assert_err(&res, ErrorKind::UnknownRequest);
                    true
                }
                Some((tokens, ns)) => {
                    res.expect("free of a running request");
                    assert_eq!(
                        hit_after(c, &tokens, &ns),
                        tokens.len() / ps * ps,
                        "a finished sequence hits"
                    );
                    false
                }
            }
        }
        op::FREE_BATCH => {
            let ids = inp.ids(4);
            let res = c.free_batch(&ids);
            check_free_batch(&res, &ids, mirror)
        }
        op::EVICT => {
            let k = match inp.u8() {
                255 => usize::MAX,
                b => usize::from(b) % 48,
            };
            let evictable = c.tree().evictable_size();
            let protected = c.tree().protected_size();
            let free = c.pool().num_free();
            let got = c.evict(k);
            assert!(
                got.is_multiple_of(ps) && got >= k.min(evictable) && got <= evictable,
                "evicted {got} of {k}"
            );
            assert_eq!(c.pool().num_free(), free + got / ps, "evicted pages return to the pool");
            assert_eq!(c.tree().protected_size(), protected, "evict never touches locked pages");
            got == 0
        }
        op::RESET => {
            let res = c.reset();
            if mirror.is_empty() {
                res.expect("reset when idle");
                assert_eq!(c.tree().total_size(), 0);
                assert_eq!(c.pool().num_free(), c.pool().num_pages() - 1, "reset frees every page");
                false
            } else {
                assert_err(&res, ErrorKind::BlockInUse);
                true
            }
        }
        op::LOOKUP => {
            let tokens = inp.prompt();
            let spec = inp.spec();
            let (Some(t32), Ok(spec)) = (tokens32(&tokens), spec) else { return };
            match c.lookup(&t32, &spec) {
                Ok(hit) => {
                    assert!(spec.mm_items.is_empty());
                    assert!(hit.is_multiple_of(ps) && hit <= t32.len().saturating_sub(1), "lookup {hit}");
                }
                Err(e) => assert!(!spec.mm_items.is_empty() && e.kind == ErrorKind::InvalidArgument, "{e:?}"),
            }
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
            let ev = c.take_events();
            check_events(&ev, events, ps);
            assert!(c.take_events().is_empty(), "events drained twice");
            let common = c.num_common_prefix_blocks();
            let shortest = mirror.keys().map(|&id| c.blocks(RequestId(id)).map_or(0, <[_]>::len)).min();
            assert!(common <= shortest.unwrap_or(0), "common prefix {common} > shortest table");
            for id in mirror.keys() {
                let cached = c.num_cached_tokens(RequestId(*id)).expect("running");
                assert!(
                    cached.is_multiple_of(ps) && cached <= c.num_tokens(RequestId(*id)).expect("running")
                );
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

/// What the tree hits for `tokens` in namespace `ns` now (read-only, on a copy).
fn hit_after(c: &RadixPrefixCache, tokens: &[i64], ns: &Option<String>) -> usize {
    let q = narrow_tokens(tokens).expect("running requests hold i32 tokens");
    c.tree().clone().probe(&q, ns.as_deref()).len
}
