//! Fuzz harness for the request layer's engine lifecycle, generic over the
//! design: one driver ([`drive`]) runs over `PrefixCache<D>` for any
//! `D: PrefixDesign`, and the input's first byte picks the hash chain or
//! the radix tree. It drives chunked prefill (`admit_chunk` with a chunk,
//! lookahead, `must_fit`, reservations and the watermark), `schedule` and
//! `schedule_batch` (lookahead, drafts), `commit_tokens` and `commit_batch`
//! (drafts accepted and rejected through `num_rejected`, async
//! placeholders), `preempt` / `resume`, external hits (`external_prefix`,
//! `delay_cache`, `finish_transfer`), `finish`, `free`, `free_batch`, the
//! one-chunk `admit` / `append`, events and `reset`.
//!
//! Input: `[design][num_blocks][size][flags]` then operations; see
//! `fuzz/README.md`. Arguments are mostly derived from the request's own
//! counters (a valid next step), sometimes raw (caller errors). After every
//! operation: `check_invariants()`; after a caller error or a refusal, that
//! nothing observable changed (every request's counters and table, every
//! block's reference count, availability, statistics); after a success,
//! what the call promises (positions computed, tokens known, status).

use kvindex::core::error::{ErrorKind, KvResult};
use kvindex::core::hash::{HashAlgo, ALGO_NAMES};
use kvindex::core::hash_chain::HashChainCache;
use kvindex::core::ids::{RequestId, TableEntry};
use kvindex::core::radix_cache::RadixPrefixCache;
use kvindex::core::request::{PrefixCache, PrefixDesign, Reads, Stats, Status, StepOpts};
use kvindex::core::tables::TableSource;

use crate::common::{check_events, trace, Input, MAX_OPS, NUM_IDS};
use crate::radix_tree::policy_of;

/// Operation codes (`opcode byte % NUM_OPS`).
pub mod op {
    /// `[id][prompt][spec][skip][opts]`.
    pub const ADMIT_CHUNK: u8 = 0;
    /// `[id][opts]`.
    pub const RESUME: u8 = 1;
    /// `[id][mode][args]`.
    pub const SCHEDULE: u8 = 2;
    /// `[mode][ids][args]`.
    pub const SCHEDULE_BATCH: u8 = 3;
    /// `[id][mode][args]`.
    pub const COMMIT: u8 = 4;
    /// `[mode][ids][args]`.
    pub const COMMIT_BATCH: u8 = 5;
    /// `[id]`.
    pub const PREEMPT: u8 = 6;
    /// `[id]`.
    pub const FINISH: u8 = 7;
    /// `[id]`.
    pub const FINISH_TRANSFER: u8 = 8;
    /// `[id]`.
    pub const FREE: u8 = 9;
    /// `[k % 5][ids...]`.
    pub const FREE_BATCH: u8 = 10;
    /// `[id][prompt][spec][skip]`: the one-chunk admission.
    pub const ADMIT: u8 = 11;
    /// `[id][len % 5][tokens...]`: the one-chunk decode append.
    pub const APPEND: u8 = 12;
    /// No argument.
    pub const RESET: u8 = 13;
    /// No argument: events, statistics, the common prefix.
    pub const INTROSPECT: u8 = 14;
    /// Operation names, by code (for `KVINDEX_FUZZ_TRACE`).
    pub const NAMES: [&str; NUM_OPS as usize] = [
        "admit_chunk",
        "resume",
        "schedule",
        "schedule_batch",
        "commit_tokens",
        "commit_batch",
        "preempt",
        "finish",
        "finish_transfer",
        "free",
        "free_batch",
        "admit",
        "append",
        "reset",
        "introspect",
    ];
    /// Number of operation codes.
    pub const NUM_OPS: u8 = 15;
}

/// A running request as the snapshot sees it: status, positions computed,
/// placeholders, drafts, preemptions, known tokens, table (raw ids).
type ReqView = (Status, usize, usize, Vec<i64>, u32, usize, Vec<u32>);

/// Everything observable through the request layer, for "an error or a
/// refusal changes nothing".
#[derive(Debug, PartialEq)]
struct Snapshot {
    reqs: Vec<Option<ReqView>>,
    refs: Vec<u32>,
    available: usize,
    stats: Stats,
    resumed: Stats,
}

fn snapshot<D: PrefixDesign>(c: &PrefixCache<D>) -> Snapshot {
    let d = c.design();
    #[allow(clippy::cast_possible_truncation)]
    let refs = (0..d.num_blocks()).map(|b| d.ref_count(D::Entry::from_raw(b as u32))).collect();
    Snapshot {
        reqs: (0..NUM_IDS)
            .map(|id| {
                let id = RequestId(id);
                let l = c.life(id).ok()?;
                let (blocks, _) = c.table(id).expect("running");
                let known = c.num_known_tokens(id).expect("running");
                let table = blocks.iter().map(|b| b.raw()).collect();
                Some((l.status, l.num_computed, l.pending, l.drafts.clone(), l.preemptions, known, table))
            })
            .collect(),
        refs,
        available: d.num_available(),
        stats: c.stats(),
        resumed: c.resumed_stats(),
    }
}

/// What an operation did: failed with a caller error, was refused (`None`
/// / `false`), or changed the state.
enum Done {
    Failed(ErrorKind),
    Refused,
    Changed,
}

fn done<T>(res: &KvResult<T>, refused: impl FnOnce(&T) -> bool) -> Done {
    match res {
        Err(e) => Done::Failed(e.kind),
        Ok(v) if refused(v) => Done::Refused,
        Ok(_) => Done::Changed,
    }
}

/// A token as the radix design reads it (`i32`), from one byte.
fn tok(inp: &mut Input<'_>) -> i32 {
    i32::try_from(inp.token()).unwrap_or(7)
}

fn toks(inp: &mut Input<'_>, n: usize) -> Vec<i32> {
    (0..n).map(|_| tok(inp)).collect()
}

/// `[chunk][lookahead][flags][external][reserved]`: chunk `byte % 9` (0 =
/// none, 8 = a chunk of 0, refused), lookahead `% 4` (255: huge), flags bit
/// 0 `must_fit`, bit 1 `delay_cache`, bits 2-3 the watermark; external
/// tokens `byte % (prompt + 2)`, reserved blocks `% 3`.
fn opts(inp: &mut Input<'_>, prompt_len: usize) -> StepOpts {
    let chunk = match inp.u8() % 9 {
        0 => None,
        8 => Some(0),
        c => Some(usize::from(c)),
    };
    let lookahead = match inp.u8() {
        255 => usize::MAX,
        b => usize::from(b % 4),
    };
    let flags = inp.u8();
    StepOpts {
        chunk,
        lookahead,
        must_fit: flags & 1 != 0,
        external_prefix: inp.count(prompt_len + 1),
        delay_cache: flags & 2 != 0,
        reserved_blocks: inp.count(2),
        watermark_blocks: usize::from((flags >> 2) & 3),
    }
}

/// A step for request `id`: `[n][k % 3][k draft tokens]`, always those
/// bytes. Derived from the request's counters (a valid next step): with
/// drafts, when the request may take them, the rest of its known positions
/// plus the drafts; otherwise `1 + n % remaining` positions. Raw mode
/// (`mode` bit 0): `n % 7` positions and the drafts as given (mostly
/// caller errors). Returns `(num_new, drafts)`.
fn step_args<D: PrefixDesign>(
    c: &PrefixCache<D>,
    id: u64,
    mode: u8,
    inp: &mut Input<'_>,
) -> (usize, Vec<i64>) {
    let n = usize::from(inp.u8());
    let k = inp.count(2);
    let drafts: Vec<i64> = toks(inp, k).into_iter().map(i64::from).collect();
    let id = RequestId(id);
    let (Ok(l), Ok(known)) = (c.life(id), c.num_known_tokens(id)) else {
        return (1 + n % 4, drafts);
    };
    if mode & 1 == 1 {
        return (n % 7, drafts);
    }
    let rem = (known + l.pending).saturating_sub(l.num_computed);
    if rem == 0 {
        return (1, Vec::new());
    }
    if !drafts.is_empty() && l.pending == 0 && l.drafts.is_empty() {
        return (rem + drafts.len(), drafts);
    }
    (1 + n % rem, Vec::new())
}

/// The ids a commit of request `id` sends: `[r][k % 4][k tokens]`, always
/// those bytes. Derived from the request's counters: `r % (drafts + 1)`
/// drafts rejected, the accepted ones first, then up to its placeholders'
/// count of the tokens. Raw mode (`mode` bit 0): the tokens as given,
/// `r % 3` rejected. Returns `(ids, num_rejected)`.
fn commit_args<D: PrefixDesign>(
    c: &PrefixCache<D>,
    id: u64,
    mode: u8,
    inp: &mut Input<'_>,
) -> (Vec<i32>, usize) {
    let r = usize::from(inp.u8());
    let k = inp.count(3);
    let sampled = toks(inp, k);
    let Ok(l) = c.life(RequestId(id)) else {
        return (sampled, 0);
    };
    if mode & 1 == 1 {
        return (sampled, r % 3);
    }
    let d = l.drafts.len();
    let rejected = r % (d + 1);
    let mut ids: Vec<i32> =
        l.drafts[..d - rejected].iter().map(|&t| i32::try_from(t).expect("drafts are i32 here")).collect();
    ids.extend(sampled.iter().take(l.pending));
    (ids, rejected)
}

/// The ids of a batch: `mode` bit 1 clear, every request that is running
/// (in id order); set, `[k % 5][k ids]` (unknown and repeated ids).
fn batch_ids<D: PrefixDesign>(c: &PrefixCache<D>, mode: u8, inp: &mut Input<'_>) -> Vec<u64> {
    if mode & 2 == 0 {
        (0..NUM_IDS).filter(|&id| c.life(RequestId(id)).is_ok_and(|l| l.status == Status::Running)).collect()
    } else {
        inp.ids(4)
    }
}

fn csr(lens: impl Iterator<Item = usize>) -> Vec<i64> {
    let mut o = vec![0i64];
    for n in lens {
        #[allow(clippy::cast_possible_wrap)]
        o.push(o[o.len() - 1] + n as i64);
    }
    o
}

/// Runs one operation and checks it.
#[allow(clippy::too_many_lines)]
fn step<D>(c: &mut PrefixCache<D>, inp: &mut Input<'_>, events: bool)
where
    D: PrefixDesign + Reads<i32>,
{
    let code = inp.u8() % op::NUM_OPS;
    let before = snapshot(c);
    let bs = c.design().block_size();
    let outcome = match code {
        op::ADMIT_CHUNK | op::ADMIT => {
            let id = inp.id();
            let prompt: Vec<i32> = inp.prompt().into_iter().map(|t| i32::try_from(t).unwrap_or(7)).collect();
            let spec = inp.spec().unwrap_or_default();
            let skip = inp.u8() & 1 == 1;
            if code == op::ADMIT {
                let res = c.admit(RequestId(id), &prompt, &spec, skip);
                if let Ok(Some(hit)) = res {
                    assert!(hit % bs == 0 && hit < prompt.len(), "admit hit {hit} of {}", prompt.len());
                    let l = c.life(RequestId(id)).expect("admitted");
                    assert_eq!((l.status, l.num_computed, l.pending), (Status::Running, prompt.len(), 1));
                }
                done(&res, Option::is_none)
            } else {
                let o = opts(inp, prompt.len());
                let res = c.admit_chunk(RequestId(id), &prompt, &spec, skip, &o);
                if let Ok(Some(s)) = res {
                    assert!(s.hit % bs == 0 && s.hit < prompt.len(), "admit_chunk {s:?} of {}", prompt.len());
                    assert!(o.chunk.is_none_or(|k| s.scheduled <= k), "{s:?} beyond chunk {:?}", o.chunk);
                    let l = c.life(RequestId(id)).expect("admitted");
                    assert_eq!(l.num_computed, s.hit + s.external + s.scheduled, "{s:?}");
                    let waiting = o.delay_cache && s.external > 0;
                    assert_eq!(l.status == Status::WaitingForRemoteKvs, waiting, "{s:?} {o:?}");
                }
                done(&res, Option::is_none)
            }
        }
        op::RESUME => {
            let id = inp.id();
            let n = c.num_known_tokens(RequestId(id)).unwrap_or(1);
            let o = opts(inp, n);
            let res = c.resume(RequestId(id), &o);
            if let Ok(Some(s)) = res {
                let l = c.life(RequestId(id)).expect("resumed");
                assert_eq!(l.num_computed, s.hit + s.external + s.scheduled, "{s:?}");
                assert_ne!(l.status, Status::Preempted);
            }
            done(&res, Option::is_none)
        }
        op::SCHEDULE => {
            let id = inp.id();
            let mode = inp.u8();
            let (num_new, drafts) = step_args(c, id, mode, inp);
            let lookahead = inp.count(3);
            let reserved = inp.count(2);
            let res = c.schedule(RequestId(id), num_new, &drafts, lookahead, reserved);
            if let Ok(Some(_)) = res {
                let l = c.life(RequestId(id)).expect("running");
                let was = before.reqs[usize::try_from(id).expect("small id")].as_ref().expect("was running");
                assert_eq!(l.num_computed, was.1 + num_new, "schedule({num_new})");
                assert_eq!(l.drafts, drafts);
            }
            done(&res, Option::is_none)
        }
        op::SCHEDULE_BATCH => {
            let mode = inp.u8();
            let ids = batch_ids(c, mode, inp);
            let args: Vec<(usize, Vec<i64>)> =
                ids.iter().map(|&id| step_args(c, id, mode >> 2, inp)).collect();
            #[allow(clippy::cast_possible_wrap)]
            let mut num_new: Vec<i64> = args.iter().map(|a| a.0 as i64).collect();
            if mode & 0x20 != 0 {
                num_new.pop(); // one count short
            }
            let with_drafts = args.iter().any(|a| !a.1.is_empty()) || mode & 0x40 != 0;
            let drafts: Vec<i64> = args.iter().flat_map(|a| a.1.iter().copied()).collect();
            let off = with_drafts.then(|| csr(args.iter().map(|a| a.1.len())));
            let lookahead = inp.count(3);
            let (mut blocks, mut offsets) = (Vec::new(), Vec::new());
            let res = c.schedule_batch(
                &ids,
                &num_new,
                &drafts,
                off.as_deref(),
                lookahead,
                &mut blocks,
                &mut offsets,
            );
            if let Ok(k) = res {
                assert!(
                    k <= ids.len() && offsets.len() == k + 1,
                    "schedule_batch {k} of {ids:?}: {offsets:?}"
                );
                #[allow(clippy::cast_possible_wrap)]
                let total = blocks.len() as i64;
                assert_eq!(offsets.last().copied(), Some(total));
            }
            done(&res, |&k| k == 0 && !ids.is_empty())
        }
        op::COMMIT => {
            let id = inp.id();
            let mode = inp.u8();
            let (ids, rejected) = commit_args(c, id, mode, inp);
            let res = c.commit_tokens(RequestId(id), &ids, rejected);
            if res.is_ok() {
                let was = before.reqs[usize::try_from(id).expect("small id")].as_ref().expect("was running");
                let l = c.life(RequestId(id)).expect("running");
                assert_eq!(c.num_known_tokens(RequestId(id)).expect("running"), was.5 + ids.len());
                assert_eq!(l.num_computed, was.1 - rejected);
                assert!(l.drafts.is_empty());
            }
            done(&res, |()| false)
        }
        op::COMMIT_BATCH => {
            let mode = inp.u8();
            let ids = batch_ids(c, mode, inp);
            let args: Vec<(Vec<i32>, usize)> =
                ids.iter().map(|&id| commit_args(c, id, mode >> 2, inp)).collect();
            let tokens: Vec<i32> = args.iter().flat_map(|a| a.0.iter().copied()).collect();
            let mut off = csr(args.iter().map(|a| a.0.len()));
            if mode & 0x20 != 0 {
                off[0] = 1; // corrupt
            }
            let one_each = args.iter().all(|a| a.0.len() == 1) && mode & 0x40 != 0;
            #[allow(clippy::cast_possible_wrap)]
            let rej: Vec<i64> = args.iter().map(|a| a.1 as i64).collect();
            let with_rej = args.iter().any(|a| a.1 > 0) || mode & 0x80 != 0;
            let res =
                c.commit_batch(&ids, &tokens, (!one_each).then_some(&off[..]), with_rej.then_some(&rej[..]));
            done(&res, |()| false)
        }
        op::PREEMPT => {
            let id = RequestId(inp.id());
            let res = c.preempt(id);
            if res.is_ok() {
                let l = c.life(id).expect("preempted");
                assert_eq!((l.status, l.num_computed), (Status::Preempted, 0));
                assert!(c.table(id).expect("known").0.is_empty());
            }
            done(&res, |()| false)
        }
        op::FINISH | op::FREE => {
            let id = RequestId(inp.id());
            let res = if code == op::FINISH { c.finish(id) } else { c.free(id) };
            if res.is_ok() {
                assert!(c.life(id).is_err(), "request {} still known", id.0);
            }
            done(&res, |()| false)
        }
        op::FINISH_TRANSFER => {
            let id = RequestId(inp.id());
            let res = c.finish_transfer(id);
            if res.is_ok() {
                assert_eq!(c.life(id).expect("running").status, Status::Running);
            }
            done(&res, |()| false)
        }
        op::FREE_BATCH => {
            let ids = inp.ids(4);
            let res = c.free_batch(&ids);
            done(&res, |()| false)
        }
        op::APPEND => {
            let id = RequestId(inp.id());
            let n = inp.count(4);
            let t = toks(inp, n);
            let res = c.append(id, &t);
            done(&res, |ok| !ok)
        }
        op::RESET => {
            let running = c.num_requests();
            let res = c.reset();
            assert_eq!(res.is_ok(), running == 0, "reset with {running} requests: {res:?}");
            done(&res, |()| false)
        }
        _ => {
            check_events(&c.take_events(), events, bs);
            assert!(c.take_events().is_empty(), "events drained twice");
            let shared = c.num_common_prefix_blocks();
            if c.num_requests() == 0 {
                assert_eq!(shared, 0);
            }
            let s = c.stats();
            assert!(s.hits <= s.queries, "{s:?}");
            Done::Changed
        }
    };
    if trace() {
        eprintln!("{:<15} {:?}", op::NAMES[usize::from(code)], snapshot(c).reqs);
    }
    match outcome {
        Done::Failed(kind) => {
            assert!(
                matches!(
                    kind,
                    ErrorKind::InvalidArgument
                        | ErrorKind::UnknownRequest
                        | ErrorKind::DuplicateRequest
                        | ErrorKind::RequestTooLarge
                        | ErrorKind::BlockInUse
                ),
                "{} failed with {kind:?}",
                op::NAMES[usize::from(code)]
            );
            assert_eq!(
                snapshot(c),
                before,
                "{} failed ({kind:?}) but changed the state",
                op::NAMES[usize::from(code)]
            );
        }
        Done::Refused => {
            assert_eq!(snapshot(c), before, "{} refused but changed the state", op::NAMES[usize::from(code)]);
        }
        Done::Changed => {}
    }
    if let Err(e) = c.check_invariants() {
        panic!("check_invariants after {}: {e}", op::NAMES[usize::from(code)]);
    }
}

/// Drives the engine lifecycle over any design: the operations of the input,
/// then every request finished, `reset`, and no block held by anyone.
pub fn drive<D>(c: &mut PrefixCache<D>, inp: &mut Input<'_>, events: bool)
where
    D: PrefixDesign + Reads<i32>,
{
    c.check_invariants().expect("a new cache is consistent");
    for _ in 0..MAX_OPS {
        if inp.is_empty() {
            break;
        }
        step(c, inp, events);
    }
    for id in 0..NUM_IDS {
        let _ = c.finish(RequestId(id));
    }
    assert_eq!(c.num_requests(), 0);
    c.reset().expect("reset of an idle cache");
    c.check_invariants().expect("consistent after reset");
    let d = c.design();
    assert_eq!(
        d.num_available(),
        d.num_blocks() - 1,
        "every block but the null block is available after reset"
    );
}

/// Runs one input: `[design][num_blocks][size][flags]`, then operations.
/// `design` bit 0: the hash chain (block size `1 + size % 8`, algorithm
/// `(flags >> 1) % 6`) or the radix tree (page size `[1, 2, 4, 16][size % 4]`,
/// policy `flags >> 2`); `num_blocks = 2 + byte % 38`; flags bit 0 enables
/// events.
pub fn run(data: &[u8]) {
    let mut inp = Input::new(data);
    let design = inp.u8();
    let nb = 2 + usize::from(inp.u8()) % 38;
    let size = inp.u8();
    let flags = inp.u8();
    let events = flags & 1 != 0;
    if design & 1 == 0 {
        let bs = 1 + usize::from(size % 8);
        let name = ALGO_NAMES[usize::from(flags >> 1) % ALGO_NAMES.len()];
        let algo = HashAlgo::parse(name).expect("known algorithm");
        if trace() {
            eprintln!("HashChainCache::new({nb}, {bs}, {name}, events={events})");
        }
        let mut c: HashChainCache = HashChainCache::new(nb, bs, algo, None, events).expect("valid sizes");
        drive(&mut c, &mut inp, events);
    } else {
        let ps = [1, 2, 4, 16][usize::from(size % 4)];
        let policy = policy_of(flags >> 2);
        if trace() {
            eprintln!("RadixPrefixCache::new({nb}, {ps}, {}, events={events})", policy.name());
        }
        let mut c: RadixPrefixCache = RadixPrefixCache::new(nb, ps, policy, events).expect("valid sizes");
        drive(&mut c, &mut inp, events);
    }
}
