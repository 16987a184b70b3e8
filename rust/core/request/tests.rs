//! The request layer on its own, over a third, minimal design: a plain block
//! pool that never caches (every prompt misses). It shows that a design is
//! one `impl PrefixDesign` + `impl Reads`, and checks the lifecycle rules
//! every design inherits: id checks, all-or-nothing batches, the reset
//! guard, statistics, tables and the ref-count tally.

use std::borrow::Cow;

use super::{Admitted, PrefixCache, PrefixDesign, Reads, RecordOf, Stats};
use crate::core::error::{ErrorKind, InvariantViolation, KvResult};
use crate::core::event_buffer::Events;
use crate::core::hash::KeySpec;
use crate::core::ids::{BlockId, RequestId};
use crate::core::tables::TableSource;
use crate::ensure_inv;

/// Blocks from a LIFO free list, one holder each; nothing is ever cached.
#[derive(Clone, Debug)]
struct PlainPool {
    block_size: usize,
    refs: Vec<u32>,
    free: Vec<BlockId>,
    /// Off: the design records no events.
    events: Events,
}

impl PlainPool {
    fn cache(num_blocks: u32, block_size: usize) -> PrefixCache<PlainPool> {
        let free = (1..num_blocks).rev().map(BlockId).collect();
        PrefixCache::with_design(PlainPool {
            block_size,
            refs: vec![0; num_blocks as usize],
            free,
            events: Events::default(),
        })
    }
}

impl Reads<i64> for PlainPool {
    fn extend_tokens(dst: &mut Vec<i64>, src: &[i64]) {
        dst.extend_from_slice(src);
    }

    fn lookup(&mut self, _tokens: &[i64], _spec: &KeySpec) -> KvResult<usize> {
        Ok(0)
    }

    fn plan_admit(
        &mut self,
        _id: RequestId,
        tokens: &[i64],
        _spec: Cow<'_, KeySpec>,
        _skip_reading: bool,
    ) -> KvResult<Vec<i64>> {
        Ok(tokens.to_vec())
    }
}

impl Reads<i32> for PlainPool {
    fn extend_tokens(dst: &mut Vec<i64>, src: &[i32]) {
        dst.extend(src.iter().map(|&t| i64::from(t)));
    }

    fn lookup(&mut self, _tokens: &[i32], _spec: &KeySpec) -> KvResult<usize> {
        Ok(0)
    }

    fn plan_admit(
        &mut self,
        _id: RequestId,
        tokens: &[i32],
        _spec: Cow<'_, KeySpec>,
        _skip_reading: bool,
    ) -> KvResult<Vec<i64>> {
        Ok(tokens.iter().map(|&t| i64::from(t)).collect())
    }
}

impl PrefixDesign for PlainPool {
    type Tok = i64;
    type Entry = BlockId;
    type Ext = ();
    type Plan = Vec<i64>;

    const UNIT: &'static str = "blocks";

    fn block_size(&self) -> usize {
        self.block_size
    }

    fn num_blocks(&self) -> usize {
        self.refs.len()
    }

    fn num_available(&self) -> usize {
        self.free.len()
    }

    fn plan_hit(&self, _plan: &Vec<i64>) -> usize {
        0
    }

    fn available_after(&self, _plan: &Vec<i64>) -> usize {
        self.free.len()
    }

    fn plan_resume(&mut self, req: &RecordOf<Self>) -> Vec<i64> {
        req.tokens.clone()
    }

    fn commit(&mut self, tokens: Vec<i64>, new_blocks: usize) -> Admitted<i64, BlockId, ()> {
        let mut blocks = Vec::new();
        self.allocate(new_blocks, &mut blocks);
        Admitted { tokens, blocks, ext: (), hit_tokens: 0 }
    }

    fn allocate(&mut self, n: usize, table: &mut Vec<BlockId>) {
        for _ in 0..n {
            let b = self.free.pop().expect("the layer checked num_available");
            self.refs[b.idx()] += 1;
            table.push(b);
        }
    }

    fn appended(&mut self, _req: &mut RecordOf<Self>, _had_full: usize) {}

    fn tokens_added(&mut self, _req: &mut RecordOf<Self>) {}

    fn cache_to(&mut self, _req: &mut RecordOf<Self>, _upto: usize) {}

    fn release(&mut self, req: &mut RecordOf<Self>, _insert: bool) {
        for b in req.blocks.drain(..) {
            self.refs[b.idx()] -= 1;
            self.free.push(b);
        }
    }

    fn reset(&mut self) -> KvResult<()> {
        Ok(())
    }

    fn events(&self) -> &Events {
        &self.events
    }

    fn events_mut(&mut self) -> &mut Events {
        &mut self.events
    }

    fn evictions(&self) -> u64 {
        0
    }

    fn clear_evictions(&mut self) {}

    fn ref_count(&self, b: BlockId) -> u32 {
        self.refs[b.idx()]
    }

    fn holds(&self, _req: &RecordOf<Self>, _i: usize) -> bool {
        false
    }

    fn check_invariants(
        &self,
        _reqs: &[&RecordOf<Self>],
        _refs: &mut [u32],
    ) -> Result<(), InvariantViolation> {
        for b in &self.free {
            ensure_inv!(self.refs[b.idx()] == 0, "free block {} is held", b.0);
        }
        Ok(())
    }
}

fn toks(n: usize) -> Vec<i64> {
    (0..n as i64).collect()
}

#[test]
fn lifecycle_tables_and_stats() {
    let mut c = PlainPool::cache(10, 4);
    assert_eq!(c.admit(RequestId(1), &toks(5), KeySpec::default(), false), Ok(Some(0)));
    let spec = KeySpec::default(); // a spec may be given borrowed too
    assert_eq!(c.admit(RequestId(2), &toks(3), &spec, false), Ok(Some(0)));
    assert_eq!(c.blocks(RequestId(1)), Ok(&[BlockId(1), BlockId(2)][..]));
    assert_eq!(c.blocks(RequestId(2)), Ok(&[BlockId(3)][..]));
    // Request 1 grows into a third block; request 2 fills its first.
    assert_eq!(c.append_batch(&[1, 2], &[7i64, 8, 9, 10, 11], Some(&[0, 4, 5])), Ok(true));
    assert_eq!(c.num_tokens(RequestId(1)), Ok(9));
    assert_eq!(c.blocks(RequestId(1)), Ok(&[BlockId(1), BlockId(2), BlockId(4)][..]));
    assert_eq!(c.slot_mapping(&[1, 2], &[2, 1]), Ok(vec![2 * 4 + 3, 4 * 4, 3 * 4 + 3]));
    let mut tables = vec![-1; 6];
    c.fill_block_tables(&[2, 1], 3, &mut tables).expect("fits");
    assert_eq!(tables, [3, 0, 0, 1, 2, 4]);
    assert_eq!(c.num_common_prefix_blocks(), 0);
    c.check_invariants().expect("consistent");
    assert_eq!(c.stats(), Stats { requests: 2, queries: 8, hits: 0, evictions: 0 });
    assert_eq!(c.take_stats().requests, 2);
    assert_eq!(c.stats(), Stats::default());
    c.free_batch(&[2, 1]).expect("both run");
    assert_eq!(c.num_requests(), 0);
    assert_eq!(c.design().free.len(), 9, "every block is back");
    c.check_invariants().expect("consistent");
}

#[test]
fn caller_errors_change_nothing() {
    let mut c = PlainPool::cache(6, 2);
    c.admit(RequestId(1), &toks(3), KeySpec::default(), false).expect("fits");
    let kind = |r: KvResult<bool>| r.expect_err("refused").kind;
    assert_eq!(
        c.admit(RequestId(1), &toks(1), KeySpec::default(), false).expect_err("running").kind,
        ErrorKind::DuplicateRequest
    );
    assert_eq!(
        c.admit(RequestId(2), &toks(0), KeySpec::default(), false).expect_err("empty").kind,
        ErrorKind::InvalidArgument
    );
    assert_eq!(kind(c.append(RequestId(9), &[1i64])), ErrorKind::UnknownRequest);
    assert_eq!(kind(c.append_batch(&[1, 1], &[1i64, 2], None)), ErrorKind::InvalidArgument);
    assert_eq!(kind(c.append_batch(&[1, 9], &[1i64, 2], None)), ErrorKind::UnknownRequest);
    assert_eq!(kind(c.append_batch(&[1], &[1i64, 2], Some(&[0, 3]))), ErrorKind::InvalidArgument);
    assert_eq!(c.free_batch(&[1, 1]).expect_err("repeated").kind, ErrorKind::InvalidArgument);
    assert_eq!(c.free_batch(&[1, 9]).expect_err("unknown").kind, ErrorKind::UnknownRequest);
    assert_eq!(c.reset().expect_err("running").kind, ErrorKind::BlockInUse);
    assert_eq!(c.num_tokens(RequestId(1)), Ok(3), "nothing appended");
    assert_eq!(c.num_requests(), 1, "nothing freed");
    assert_eq!(c.design().free.len(), 3);
    c.check_invariants().expect("consistent");
    c.free(RequestId(1)).expect("runs");
    assert_eq!(c.free(RequestId(1)).expect_err("double free").kind, ErrorKind::UnknownRequest);
    c.reset().expect("idle");
}

#[test]
fn shortfalls_are_all_or_nothing() {
    let mut c = PlainPool::cache(5, 2);
    assert_eq!(c.admit(RequestId(1), &toks(4), KeySpec::default(), false), Ok(Some(0)));
    assert_eq!(c.admit(RequestId(2), &toks(5), KeySpec::default(), false), Ok(None), "needs 3 of 2");
    assert_eq!(c.num_requests(), 1);
    assert_eq!(c.admit(RequestId(2), &toks(2), KeySpec::default(), false), Ok(Some(0)));
    // One block left: request 1 needs one, request 2 one more.
    assert_eq!(c.append_batch(&[1, 2], &[1i64, 2], None), Ok(false));
    assert_eq!((c.num_tokens(RequestId(1)), c.num_tokens(RequestId(2))), (Ok(4), Ok(2)));
    // The failed batch's epoch does not make a later batch see a repeat.
    assert_eq!(c.append_batch(&[1], &[1i64], None), Ok(true));
    assert_eq!(c.append(RequestId(2), &[1i64]), Ok(false));
    c.check_invariants().expect("consistent");
}

#[test]
fn engine_lifecycle_chunks_drafts_placeholders_preemption() {
    use super::{Status, StepOpts};
    let mut c = PlainPool::cache(12, 4);
    let chunk = StepOpts { chunk: Some(6), lookahead: 3, ..StepOpts::default() };
    let s = c.admit_chunk(RequestId(1), &toks(10), KeySpec::default(), false, &chunk).expect("valid");
    let s = s.expect("fits");
    assert_eq!((s.hit, s.scheduled, s.first_new), (0, 6, 0));
    assert_eq!(c.blocks(RequestId(1)).expect("runs").len(), 3, "6 tokens + 3 lookahead");
    // today's append needs every known id computed
    assert_eq!(c.append(RequestId(1), &[1i64]).expect_err("mid-prefill").kind, ErrorKind::InvalidArgument);
    assert_eq!(c.schedule(RequestId(1), 4, &[], 0, 0), Ok(Some(3)));
    assert_eq!(c.life(RequestId(1)).expect("runs").pending, 1, "the last prompt position samples");
    // positions beyond the known ids and the one placeholder: refused, nothing changed
    let before = c.life(RequestId(1)).expect("runs").clone();
    assert_eq!(c.schedule(RequestId(1), 3, &[], 0, 0).expect_err("beyond").kind, ErrorKind::InvalidArgument);
    assert_eq!(
        c.commit_tokens(RequestId(1), &[5i64, 6], 0).expect_err("one placeholder").kind,
        ErrorKind::InvalidArgument
    );
    assert_eq!(c.life(RequestId(1)).expect("runs").num_computed, before.num_computed);
    c.commit_tokens(RequestId(1), &[5i64], 0).expect("fills the placeholder");
    // a decode step with two drafts; one rejected
    assert_eq!(c.schedule(RequestId(1), 3, &[7, 8], 0, 0).map(|f| f.is_some()), Ok(true));
    assert_eq!(
        c.commit_tokens(RequestId(1), &[9i64, 1], 0).expect_err("not led by drafts").kind,
        ErrorKind::InvalidArgument
    );
    c.commit_tokens(RequestId(1), &[7i64, 2], 1).expect("draft 8 rejected");
    let l = c.life(RequestId(1)).expect("runs");
    assert_eq!((l.num_computed, c.num_known_tokens(RequestId(1)), l.pending), (12, Ok(13), 0));
    c.check_invariants().expect("consistent");
    c.preempt(RequestId(1)).expect("runs");
    assert!(c.blocks(RequestId(1)).expect("kept").is_empty());
    assert_eq!(c.life(RequestId(1)).expect("kept").status, Status::Preempted);
    assert_eq!(c.design().free.len(), 11);
    let s = c.resume(RequestId(1), &StepOpts::default()).expect("preempted").expect("fits");
    assert_eq!((s.hit, s.scheduled), (0, 13));
    assert_eq!(c.resumed_stats().requests, 1);
    assert_eq!(c.stats().requests, 1, "resumed admissions are counted apart");
    c.check_invariants().expect("consistent");
    c.finish(RequestId(1)).expect("runs");
    assert_eq!(c.design().free.len(), 11);
}

/// A small deterministic generator (xorshift64*) for the batch differential test.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

/// Every running request (id order) with its counters, tokens, table and
/// design state, then the design's own fingerprint.
fn snapshot<D: PrefixDesign>(c: &PrefixCache<D>, design: &dyn Fn(&PrefixCache<D>) -> String) -> String {
    let mut ids: Vec<_> = c.index.keys().copied().collect();
    ids.sort_by_key(|id| id.0);
    let reqs: Vec<String> = ids
        .iter()
        .map(|&id| {
            let r = c.get(id).expect("indexed");
            format!("{} {:?} {:?} {:?} {:?}", id.0, r.life, r.tokens, r.blocks, r.ext)
        })
        .collect();
    format!("{reqs:?} | {}", design(c))
}

/// Random lifecycle traffic in which `schedule_batch` / `commit_batch` are
/// answered both by the public calls (fast path first, the remembered batch
/// slots reused across calls) and by the fully checked path on a copy: the
/// same results, the same errors, the same state after every batch call,
/// while requests are admitted, preempted, finished and re-admitted (into
/// other slots or the same ones) and batches repeat, reorder, repeat an id
/// or name an unknown one.
fn batch_paths_agree<D: PrefixDesign + Reads<i32> + Clone>(
    mut c: PrefixCache<D>,
    seed: u64,
    design: &dyn Fn(&PrefixCache<D>) -> String,
) -> usize {
    use super::StepOpts;
    let mut rng = Rng(seed);
    let mut batch: Vec<u64> = vec![0, 1, 2];
    let mut fast_ok = 0;
    for step in 0..6000 {
        match rng.below(14) {
            0 | 1 => {
                let id = rng.below(6);
                let len = 1 + rng.below(12) as usize;
                let k = 1 + rng.below(4) as i32;
                let p: Vec<i32> = (0..len as i32).map(|t| (t * k) % 5).collect();
                let chunk = [None, Some(1 + rng.below(8) as usize)][rng.below(2) as usize];
                let o = StepOpts { chunk, lookahead: rng.below(3) as usize, ..StepOpts::default() };
                let _ = c.admit_chunk(RequestId(id), &p, KeySpec::default(), false, &o);
            }
            2 => {
                let id = RequestId(rng.below(6));
                let _ = match rng.below(4) {
                    0 => c.preempt(id),
                    1 => c.finish(id),
                    2 => c.resume(id, &StepOpts::default()).map(|_| ()),
                    _ => c.free(id),
                };
            }
            3 => {
                // a single step with drafts, or a commit that accepts / rejects some
                let id = RequestId(rng.below(6));
                if rng.below(2) == 0 {
                    let drafts: Vec<i64> = (0..rng.below(3)).map(|_| rng.below(3) as i64).collect();
                    let n = 1 + rng.below(4) as usize + drafts.len();
                    let _ = c.schedule(id, n, &drafts, 0, 0);
                } else {
                    let toks: Vec<i32> = (0..rng.below(3)).map(|_| rng.below(3) as i32).collect();
                    let _ = c.commit_tokens(id, &toks, rng.below(2) as usize);
                }
            }
            4 => {
                // the batch changes: reordered, an id replaced (maybe repeated or unknown), resized
                match rng.below(6) {
                    4 | 5 => {
                        // the running set, as a scheduler sends it
                        batch = c.index.keys().map(|id| id.0).collect();
                        batch.sort_unstable();
                        batch.retain(|&id| c.life(RequestId(id)).is_ok_and(|l| l.drafts.is_empty()));
                    }
                    0 => batch.reverse(),
                    1 if !batch.is_empty() => {
                        let i = rng.below(batch.len() as u64) as usize;
                        batch[i] = rng.below(7);
                    }
                    2 => batch.push(rng.below(6)),
                    _ => {
                        batch.pop();
                    }
                }
            }
            op => {
                let (mut a, mut b) = (c.clone(), c.clone());
                if op % 2 == 0 {
                    let n: Vec<i64> = batch
                        .iter()
                        .map(|_| if rng.below(8) == 0 { rng.below(5) as i64 - 1 } else { 1 })
                        .collect();
                    let n = if rng.below(30) == 0 { n[..n.len().saturating_sub(1)].to_vec() } else { n };
                    let la = rng.below(3) as usize;
                    let (mut ba, mut oa, mut bb, mut ob) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
                    let ra = a.schedule_batch(&batch, &n, &[], None, la, &mut ba, &mut oa);
                    let rb = b.schedule_batch_checked(&batch, &n, &[], None, la, &mut bb, &mut ob);
                    assert_eq!(ra, rb, "step {step}: schedule_batch({batch:?}, {n:?})");
                    assert_eq!((&ba, &oa), (&bb, &ob), "step {step}: new blocks");
                    fast_ok += usize::from(ra.is_ok_and(|d| d > 0));
                } else {
                    // one id each, or CSR offsets (0-2 ids each)
                    let csr = rng.below(3) == 0;
                    let per: Vec<usize> =
                        batch.iter().map(|_| if csr { rng.below(3) as usize } else { 1 }).collect();
                    let toks: Vec<i32> = (0..per.iter().sum()).map(|_| rng.below(3) as i32).collect();
                    let off: Vec<i64> = std::iter::once(0)
                        .chain(per.iter().scan(0, |acc, &k| {
                            *acc += k as i64;
                            Some(*acc)
                        }))
                        .collect();
                    let off = csr.then_some(&off[..]);
                    let ra = a.commit_batch(&batch, &toks, off, None);
                    let rb = b.commit_batch_checked(&batch, &toks, off, None);
                    assert_eq!(ra, rb, "step {step}: commit_batch({batch:?})");
                    fast_ok += usize::from(ra.is_ok() && !batch.is_empty());
                }
                assert_eq!(snapshot(&a, design), snapshot(&b, design), "step {step}: states differ");
                a.check_invariants().expect("consistent");
                c = a;
            }
        }
    }
    fast_ok
}

#[test]
fn batch_fast_paths_answer_as_the_checked_paths() {
    for seed in 1..=4u64 {
        let c = PlainPool::cache(24, 2);
        let ok = batch_paths_agree(c, seed, &|c| format!("{:?}", c.design().free));
        assert!(ok > 40, "seed {seed}: only {ok} batch calls succeeded");
        let c = crate::core::hash_chain::HashChainCache::new(
            20,
            2,
            crate::core::hash::HashAlgo::parse("xxh3_128").expect("known"),
            None,
            true,
        )
        .expect("valid");
        let ok = batch_paths_agree(c, seed, &|c| {
            let q: Vec<_> = c.pool().free_queue().collect();
            let h: Vec<_> = (0..20).map(|b| c.pool().block_hash(BlockId(b))).collect();
            format!("{q:?} {h:?} {:?}", c.pool().num_cached_hashes())
        });
        assert!(ok > 40, "seed {seed}: only {ok} batch calls succeeded");
        let c = crate::core::radix_cache::RadixPrefixCache::new(20, 2, crate::core::radix::Policy::Lru, true)
            .expect("valid");
        let ok = batch_paths_agree(c, seed, &|c| format!("{} {}", c.tree().dump(), c.pool().num_free()));
        assert!(ok > 40, "seed {seed}: only {ok} batch calls succeeded");
    }
}
