//! The engine lifecycle of [`PrefixCache`]: the calls a vLLM-style scheduler
//! makes every step, with vLLM 0.33's `KVCacheManager.allocate_slots`
//! semantics, written once for every design.
//!
//! - [`PrefixCache::admit_chunk`] / [`PrefixCache::resume`]: a waiting (or
//!   preempted) request: look up, then external tokens beyond the hit, then
//!   the first chunk; `None` with nothing changed when the admission gate
//!   (`must_fit`: the whole sequence must fit; `reserved_blocks`; the
//!   watermark) refuses.
//! - [`PrefixCache::schedule`] / [`PrefixCache::schedule_batch`]: a running
//!   request's next prefill chunk or decode step (drafts are its last
//!   positions), plus lookahead slots.
//! - [`PrefixCache::commit_tokens`] / [`PrefixCache::commit_batch`]: the ids
//!   sampled for the step in flight (accepted drafts first), rejected drafts
//!   rolled back (their slots stay in the table; the next step reuses them).
//! - [`PrefixCache::preempt`], [`PrefixCache::finish`],
//!   [`PrefixCache::finish_transfer`].
//!
//! # When a block becomes visible
//! Exactly when vLLM caches it: at the step that schedules its tokens,
//! `num_tokens_to_cache = min(num_computed + num_new_tokens, num_tokens)`,
//! where `num_tokens` counts known ids only. Lookahead slots, drafts not yet
//! verified and placeholders whose id is unknown are never cached; a block
//! completed by a commit is cached at the request's next `schedule`.
//!
//! # Positions
//! `num_computed` counts positions computed or scheduled (drafts of the step
//! in flight included); positions `>= tokens.len()` are placeholders (a
//! sampled id not committed yet: `pending`) or drafts. Scheduling beyond
//! `tokens.len() + pending` is a caller error.
//!
//! # Costs
//! `admit_chunk`: the design's lookup (O(prompt)) + O(blocks allocated or
//! cached). `schedule` / `commit_tokens`: O(1) per request plus O(new
//! blocks) and the design's work per block cached. Batches validate every
//! request (O(ids)) before changing any. The decode step's plain case (no
//! drafts, no rejections) runs one validation pass and one apply pass over
//! the batch's remembered slots; every other case, and every error, takes
//! the checked path (`*_checked`), which reports the first error in request
//! order.
//!
//! # Invariants
//! The request layer's (module header of [`crate::core::request`]); the
//! fast paths answer exactly as the checked ones (unit tests compare them).

use super::opts::{Scheduled, StepOpts};
use super::{Admitted, Life, PrefixCache, PrefixDesign, Reads, RecordOf, SpecArg, Status};
use crate::core::error::{ErrorKind, KvError, KvResult};
use crate::core::hash::Token;
use crate::core::ids::RequestId;
use crate::core::tables::{batch_ranges, Ranges};

/// An admission that passed the gate.
pub(super) struct Placed<T, B, X> {
    pub(super) admitted: Admitted<T, B, X>,
    pub(super) sched: Scheduled,
    delay: bool,
}

#[cold]
fn bad(msg: String) -> KvError {
    KvError::invalid(msg)
}

/// Validates a step for a running request; returns 1 if it samples (its
/// last non-draft position is the sequence's last position).
fn check_schedule(l: &Life, known: usize, num_new: usize, num_drafts: usize) -> KvResult<usize> {
    if !l.drafts.is_empty() {
        return Err(bad("commit the drafts of the previous step first".into()));
    }
    if num_new < 1 {
        return Err(bad("num_new_tokens must be >= 1".into()));
    }
    if num_drafts >= num_new {
        return Err(bad(format!("{num_drafts} drafts must leave a non-draft token of {num_new}")));
    }
    let end = l.num_computed.saturating_add(num_new) - num_drafts;
    let last = known + l.pending;
    if end > last {
        return Err(bad(format!(
            "schedules position {} but the sequence (known ids + placeholders) ends at {}",
            end - 1,
            last as i64 - 1
        )));
    }
    if num_drafts > 0 && (end != last || l.pending > 0) {
        return Err(bad("drafts must follow the last committed token".into()));
    }
    Ok(usize::from(end == last))
}

/// Validates committing `ids` (accepted drafts first) and rejecting `num_rejected`.
fn check_commit<T: Token>(l: &Life, ids: &[T], num_rejected: usize) -> KvResult<()> {
    if num_rejected > l.drafts.len() {
        return Err(bad(format!("rejects {num_rejected} of {} drafts", l.drafts.len())));
    }
    let accepted = l.drafts.len() - num_rejected;
    if ids.len() < accepted || ids[..accepted].iter().zip(&l.drafts).any(|(a, &d)| a.get() != d) {
        return Err(bad("the accepted drafts must lead the committed ids".into()));
    }
    if ids.len() - accepted > l.pending {
        return Err(bad(format!(
            "{} sampled ids for {} reserved placeholders",
            ids.len() - accepted,
            l.pending
        )));
    }
    Ok(())
}

fn wrong_status(id: RequestId, s: Status) -> KvError {
    KvError::invalid(format!("request {} is {s:?}", id.0))
}

impl<D: PrefixDesign> PrefixCache<D> {
    /// The admission gate and allocation of vLLM's waiting loop for a looked-up
    /// plan of `n_tok` known tokens: `None` (the plan refused, nothing
    /// changed) or the pinned hits and allocated blocks.
    pub(super) fn place(
        &mut self,
        plan: D::Plan,
        n_tok: usize,
        o: &StepOpts,
    ) -> Option<Placed<D::Tok, D::Entry, D::Ext>> {
        let bs = self.design.block_size();
        let hit = self.design.plan_hit(&plan);
        let hit_blocks = hit / bs;
        let avail = self.design.available_after(&plan);
        let limit = if o.delay_cache { n_tok } else { n_tok - 1 };
        let external = o.external_prefix.min(limit).saturating_sub(hit);
        let delay = o.delay_cache && external > 0;
        let mut n = if delay { 0 } else { n_tok - hit - external };
        if let Some(c) = o.chunk {
            n = n.min(c);
        }
        let refused = (o.must_fit
            && n_tok.div_ceil(bs).saturating_sub(hit_blocks).saturating_add(o.watermark_blocks) > avail)
            || {
                // Saturating: a huge lookahead or reservation is refused, never wraps.
                let need = (hit + external + n).saturating_add(o.lookahead).div_ceil(bs) - hit_blocks;
                need.saturating_add(o.watermark_blocks).saturating_add(o.reserved_blocks) > avail
            };
        if refused {
            self.design.refuse(plan);
            return None;
        }
        let new = (hit + external + n + o.lookahead).div_ceil(bs) - hit_blocks; // fits: checked above
        let admitted = self.design.commit(plan, new);
        Some(Placed {
            admitted,
            sched: Scheduled { hit, external, scheduled: n, first_new: hit_blocks },
            delay,
        })
    }

    /// Counters of an admitted request (`delay`: waiting for its transfer).
    pub(super) fn admitted_life(l: &mut Life, s: &Scheduled, n_tok: usize, delay: bool) {
        l.num_computed = s.hit + s.external + s.scheduled;
        l.drafts.clear();
        if delay {
            l.status = Status::WaitingForRemoteKvs;
        } else {
            l.status = Status::Running;
            l.pending = usize::from(l.num_computed == n_tok);
        }
    }

    fn count_admission(&mut self, l: &Life, n_tok: usize, hit: usize) {
        if l.skip_reading {
            return;
        }
        let s = if l.preemptions > 0 { &mut self.resumed } else { &mut self.stats };
        s.requests += 1;
        s.queries += n_tok as u64;
        s.hits += hit as u64;
    }

    /// Caches what an admission or a step makes visible: full blocks up to
    /// `min(upto, known tokens)`.
    fn cache_step(design: &mut D, req: &mut RecordOf<D>, upto: usize) {
        let upto = upto.min(req.tokens.len());
        design.cache_to(req, upto);
    }

    /// Admits a new request (vLLM's waiting loop): looks `tokens` up, adds
    /// the external tokens beyond the hit, allocates the first chunk (plus
    /// lookahead) and caches the full blocks it schedules. `None`, with
    /// nothing changed, when the gate refuses. O(prompt + blocks).
    ///
    /// # Errors
    /// `DuplicateRequest`; `InvalidArgument` for an empty prompt, a chunk of
    /// 0 or a key spec the design cannot key on. Nothing changes.
    pub fn admit_chunk<'s, T>(
        &mut self,
        id: RequestId,
        tokens: &[T],
        spec: impl SpecArg<'s>,
        skip_reading: bool,
        opts: &StepOpts,
    ) -> KvResult<Option<Scheduled>>
    where
        D: Reads<T>,
    {
        if self.index.contains_key(&id) {
            return Err(KvError::new(
                ErrorKind::DuplicateRequest,
                format!("request {} is already running", id.0),
            ));
        }
        if tokens.is_empty() {
            return Err(bad("a prompt needs at least one token".into()));
        }
        if opts.chunk == Some(0) {
            return Err(bad("chunk must be >= 1".into()));
        }
        self.check_fits(id, tokens.len())?;
        D::check_tokens(tokens)?;
        let plan = self.design.plan_admit(id, tokens, spec.into_cow(), skip_reading)?;
        let Some(p) = self.place(plan, tokens.len(), opts) else { return Ok(None) };
        let life = Life { skip_reading, ..Life::default() };
        self.count_admission(&life, tokens.len(), p.sched.hit);
        let slot = self.insert_record(id, p.admitted, life);
        let req = self.reqs[slot as usize].as_mut().expect("just inserted");
        let n_tok = req.tokens.len();
        Self::admitted_life(&mut req.life, &p.sched, n_tok, p.delay);
        if !p.delay {
            Self::cache_step(&mut self.design, req, p.sched.hit + p.sched.external + p.sched.scheduled);
        }
        Ok(Some(p.sched))
    }

    /// Resumes a preempted request with its prompt and outputs so far, as
    /// [`PrefixCache::admit_chunk`] admits a new one; its admission counts in
    /// [`PrefixCache::resumed_stats`].
    ///
    /// # Errors
    /// `UnknownRequest`; `InvalidArgument` if the request is not preempted or
    /// for a chunk of 0. Nothing changes.
    pub fn resume(&mut self, id: RequestId, opts: &StepOpts) -> KvResult<Option<Scheduled>> {
        let slot = self.slot(id)?;
        let req = self.req(slot);
        if req.life.status != Status::Preempted {
            return Err(wrong_status(id, req.life.status));
        }
        if opts.chunk == Some(0) {
            return Err(bad("chunk must be >= 1".into()));
        }
        let n_tok = req.tokens.len();
        let req = self.reqs[slot as usize].as_ref().expect("indexed slot holds a request");
        let plan = self.design.plan_resume(req);
        let Some(p) = self.place(plan, n_tok, opts) else { return Ok(None) };
        let life = self.req(slot).life.clone();
        self.count_admission(&life, n_tok, p.sched.hit);
        let req = self.reqs[slot as usize].as_mut().expect("indexed slot holds a request");
        let Admitted { tokens, blocks, ext, .. } = p.admitted;
        req.tokens = tokens;
        req.blocks = blocks;
        req.ext = ext;
        Self::admitted_life(&mut req.life, &p.sched, n_tok, p.delay);
        if !p.delay {
            Self::cache_step(&mut self.design, req, p.sched.hit + p.sched.external + p.sched.scheduled);
        }
        Ok(Some(p.sched))
    }

    /// Schedules a running request's next prefill chunk or decode step:
    /// `num_new` positions from `num_computed`, the last `drafts.len()` of
    /// them draft tokens, plus `lookahead` slots. Returns the table index of
    /// the first block it allocated, or `None` (nothing changed) when the
    /// blocks, less `reserved_blocks`, do not cover it. O(new blocks).
    ///
    /// # Errors
    /// `UnknownRequest`; `InvalidArgument` for a request not running, drafts
    /// of the previous step not committed, `num_new` of 0, drafts not leaving
    /// a non-draft position or not following the last committed token, or
    /// positions beyond the known ids and placeholders. Nothing changes.
    pub fn schedule(
        &mut self,
        id: RequestId,
        num_new: usize,
        drafts: &[i64],
        lookahead: usize,
        reserved_blocks: usize,
    ) -> KvResult<Option<usize>> {
        let slot = self.slot(id)?;
        let samples = Self::check_step(self.req(slot), num_new, drafts.len())?;
        Ok(self.apply_step(slot, num_new, drafts, lookahead, reserved_blocks, samples))
    }

    fn check_step(req: &RecordOf<D>, num_new: usize, num_drafts: usize) -> KvResult<usize> {
        if req.life.status != Status::Running {
            return Err(wrong_status(req.id, req.life.status));
        }
        check_schedule(&req.life, req.tokens.len(), num_new, num_drafts)
    }

    fn apply_step(
        &mut self,
        slot: u32,
        num_new: usize,
        drafts: &[i64],
        lookahead: usize,
        reserved: usize,
        samples: usize,
    ) -> Option<usize> {
        let bs = self.design.block_size();
        let req = self.reqs[slot as usize].as_mut().expect("indexed slot holds a request");
        let held = req.blocks.len();
        let slots = (req.life.num_computed + num_new).saturating_add(lookahead);
        // A decode step usually fits the table it has: no division then.
        let need = if slots <= held * bs { 0 } else { slots.div_ceil(bs) - held };
        if need.saturating_add(reserved) > self.design.num_available() {
            return None;
        }
        if need > 0 {
            self.design.allocate(need, &mut req.blocks);
        }
        let upto = req.life.num_computed + num_new;
        Self::cache_step(&mut self.design, req, upto);
        req.life.num_computed += num_new;
        req.life.drafts.clear();
        req.life.drafts.extend_from_slice(drafts);
        req.life.pending += samples;
        Some(held)
    }

    /// [`PrefixCache::schedule`] for every request of `ids` in order:
    /// `num_new[i]` positions, drafts `drafts[draft_offsets[i]..draft_offsets[i+1]]`
    /// (`None`: no drafts), `lookahead` slots each. Stops at the first
    /// refusal (the caller preempts and calls again with the rest); returns
    /// how many were scheduled. The blocks each scheduled request got are
    /// appended to `new_blocks` (cleared first), request `i`'s being
    /// `new_blocks[offsets[i]..offsets[i+1]]` (`offsets` cleared, then
    /// `scheduled + 1` entries). Caller errors are checked for every request
    /// before any is scheduled. O(ids + new blocks).
    ///
    /// # Errors
    /// As [`PrefixCache::schedule`], plus a repeated id or bad offsets.
    #[allow(clippy::too_many_arguments)]
    pub fn schedule_batch(
        &mut self,
        ids: &[u64],
        num_new: &[i64],
        drafts: &[i64],
        draft_offsets: Option<&[i64]>,
        lookahead: usize,
        new_blocks: &mut Vec<D::Entry>,
        offsets: &mut Vec<i64>,
    ) -> KvResult<usize> {
        new_blocks.clear();
        offsets.clear();
        if num_new.len() == ids.len() && draft_offsets.is_none() && drafts.is_empty() {
            if let Some(done) = self.schedule_plain(ids, num_new, lookahead, new_blocks, offsets) {
                return Ok(done);
            }
        }
        self.schedule_batch_checked(ids, num_new, drafts, draft_offsets, lookahead, new_blocks, offsets)
    }

    /// [`PrefixCache::schedule_batch`] in full generality: every request
    /// checked in order (the first error found is the one reported), then
    /// scheduled. The fast path ([`PrefixCache::schedule_plain`]) answers the
    /// same wherever it applies (the unit tests compare the two).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn schedule_batch_checked(
        &mut self,
        ids: &[u64],
        num_new: &[i64],
        drafts: &[i64],
        draft_offsets: Option<&[i64]>,
        lookahead: usize,
        new_blocks: &mut Vec<D::Entry>,
        offsets: &mut Vec<i64>,
    ) -> KvResult<usize> {
        new_blocks.clear();
        offsets.clear();
        if num_new.len() != ids.len() {
            return Err(bad(format!("{} counts for {} requests", num_new.len(), ids.len())));
        }
        let ranges = match draft_offsets {
            Some(off) => Some(batch_ranges(ids.len(), drafts.len(), Some(off))?),
            None if drafts.is_empty() => None,
            None => return Err(bad("drafts need draft_offsets".into())),
        };
        let mut slots = std::mem::take(&mut self.scratch_slots);
        let mut samples = std::mem::take(&mut self.scratch_samples);
        samples.clear();
        let checked = self.validate_batch(ids, &mut slots, |i, req| {
            let n = usize::try_from(num_new[i])
                .map_err(|_| bad(format!("num_new_tokens must be >= 1, got {}", num_new[i])))?;
            let nd = ranges.as_ref().map_or(0, |r| r.get(i).1 - r.get(i).0);
            samples.push(Self::check_step(req, n, nd)?);
            Ok(())
        });
        if let Err(e) = checked {
            self.scratch_slots = slots;
            self.scratch_samples = samples;
            return Err(e);
        }
        let mut done = 0;
        offsets.push(0);
        for (i, &slot) in slots.iter().enumerate() {
            let d = ranges.as_ref().map_or(&[][..], |r| {
                let (a, b) = r.get(i);
                &drafts[a..b]
            });
            #[allow(clippy::cast_sign_loss)]
            let n = num_new[i] as usize;
            let Some(f) = self.apply_step(slot, n, d, lookahead, 0, samples[i]) else { break };
            new_blocks.extend_from_slice(&self.req(slot).blocks[f..]);
            offsets.push(new_blocks.len() as i64);
            done += 1;
        }
        self.scratch_slots = slots;
        self.scratch_samples = samples;
        Ok(done)
    }

    /// [`PrefixCache::schedule_batch`] without drafts, the decode step's
    /// common case: slots resolved once per batch ([`PrefixCache::resolve_batch`]),
    /// one validation pass, one apply pass. `None`, with nothing changed, when
    /// any request fails a check; the caller's checked path then reports the
    /// first error in its order (the conditions here are exactly its
    /// conditions without drafts).
    fn schedule_plain(
        &mut self,
        ids: &[u64],
        num_new: &[i64],
        lookahead: usize,
        new_blocks: &mut Vec<D::Entry>,
        offsets: &mut Vec<i64>,
    ) -> Option<usize> {
        if !self.resolve_batch(ids) {
            return None;
        }
        let slots = std::mem::take(&mut self.batch_slots);
        let valid = slots.iter().zip(num_new).all(|(&slot, &n)| {
            let req = self.req(slot);
            let l = &req.life;
            // n >= 1 fits usize; `end` saturates as `check_schedule`'s does.
            #[allow(clippy::cast_sign_loss)]
            let end = l.num_computed.saturating_add(n as usize);
            n >= 1
                && l.status == Status::Running
                && l.drafts.is_empty()
                && end <= req.tokens.len() + l.pending
        });
        if !valid {
            self.batch_slots = slots;
            return None;
        }
        // `apply_step` without drafts or reservation, one record borrow per request.
        let bs = self.design.block_size();
        let mut done = 0;
        offsets.push(0);
        for (&slot, &n) in slots.iter().zip(num_new) {
            #[allow(clippy::cast_sign_loss)]
            let n = n as usize;
            let req = self.reqs[slot as usize].as_mut().expect("indexed slot holds a request");
            let held = req.blocks.len();
            let upto = req.life.num_computed + n;
            let samples = usize::from(upto == req.tokens.len() + req.life.pending);
            let slots_end = upto.saturating_add(lookahead);
            // A decode step usually fits the table it has: no division then.
            let need = if slots_end <= held * bs { 0 } else { slots_end.div_ceil(bs) - held };
            if need > self.design.num_available() {
                break;
            }
            if need > 0 {
                self.design.allocate(need, &mut req.blocks);
                new_blocks.extend_from_slice(&req.blocks[held..]);
            }
            Self::cache_step(&mut self.design, req, upto);
            req.life.num_computed = upto;
            req.life.pending += samples;
            offsets.push(new_blocks.len() as i64);
            done += 1;
        }
        self.batch_slots = slots;
        Some(done)
    }

    /// Commits the ids sampled for request `id`'s step in flight: the
    /// accepted drafts first, then sampled ids filling reserved
    /// placeholders; `num_rejected` trailing drafts are rolled back (their
    /// slots stay in the table). Hashes the blocks the ids complete; they are
    /// cached at the request's next `schedule`. O(ids).
    ///
    /// # Errors
    /// `InvalidArgument` for an id outside the design's token rule (checked
    /// first); `UnknownRequest`; `InvalidArgument` for a request not running,
    /// more rejections than drafts, ids not led by the accepted drafts, or
    /// more sampled ids than reserved placeholders. Nothing changes.
    pub fn commit_tokens<T: Token>(&mut self, id: RequestId, ids: &[T], num_rejected: usize) -> KvResult<()>
    where
        D: Reads<T>,
    {
        // The caches' token rule, checked first as admission checks it.
        D::check_tokens(ids)?;
        let slot = self.slot(id)?;
        Self::check_commit_at(self.req(slot), ids, num_rejected)?;
        self.apply_commit(slot, ids, num_rejected);
        Ok(())
    }

    fn check_commit_at<T: Token>(req: &RecordOf<D>, ids: &[T], num_rejected: usize) -> KvResult<()> {
        if req.life.status != Status::Running {
            return Err(wrong_status(req.id, req.life.status));
        }
        check_commit(&req.life, ids, num_rejected)
    }

    fn apply_commit<T: Token>(&mut self, slot: u32, ids: &[T], num_rejected: usize)
    where
        D: Reads<T>,
    {
        let req = self.reqs[slot as usize].as_mut().expect("indexed slot holds a request");
        let accepted = req.life.drafts.len() - num_rejected;
        req.life.num_computed -= num_rejected;
        req.life.pending -= ids.len() - accepted;
        req.life.drafts.clear();
        if !ids.is_empty() {
            D::extend_tokens(&mut req.tokens, ids);
            self.design.tokens_added(req);
        }
    }

    /// [`PrefixCache::commit_tokens`] for every request of `ids`:
    /// `tokens[offsets[i]..offsets[i+1]]` and `num_rejected[i]` (`None`: 0).
    /// All or nothing: every request is validated before any changes.
    /// O(ids + tokens).
    ///
    /// # Errors
    /// As [`PrefixCache::commit_tokens`], plus a repeated id or bad offsets.
    pub fn commit_batch<T: Token>(
        &mut self,
        ids: &[u64],
        tokens: &[T],
        offsets: Option<&[i64]>,
        num_rejected: Option<&[i64]>,
    ) -> KvResult<()>
    where
        D: Reads<T>,
    {
        D::check_tokens(tokens)?;
        if num_rejected.is_none() {
            if let Ok(ranges) = batch_ranges(ids.len(), tokens.len(), offsets) {
                if self.commit_plain(ids, tokens, ranges) {
                    return Ok(());
                }
            }
        }
        self.commit_batch_checked(ids, tokens, offsets, num_rejected)
    }

    /// [`PrefixCache::commit_batch`] in full generality: every request
    /// checked in order (the first error found is the one reported), then
    /// committed. The fast path ([`PrefixCache::commit_plain`]) answers the
    /// same wherever it applies (the unit tests compare the two).
    pub(super) fn commit_batch_checked<T: Token>(
        &mut self,
        ids: &[u64],
        tokens: &[T],
        offsets: Option<&[i64]>,
        num_rejected: Option<&[i64]>,
    ) -> KvResult<()>
    where
        D: Reads<T>,
    {
        let ranges = batch_ranges(ids.len(), tokens.len(), offsets)?;
        if num_rejected.is_some_and(|r| r.len() != ids.len()) {
            return Err(bad("one num_rejected per request".into()));
        }
        let rej = |i: usize| -> KvResult<usize> {
            let r = num_rejected.map_or(0, |r| r[i]);
            usize::try_from(r).map_err(|_| bad(format!("num_rejected must be >= 0, got {r}")))
        };
        let mut slots = std::mem::take(&mut self.scratch_slots);
        let checked = self.validate_batch(ids, &mut slots, |i, req| {
            let (a, b) = ranges.get(i);
            Self::check_commit_at(req, &tokens[a..b], rej(i)?)
        });
        if let Err(e) = checked {
            self.scratch_slots = slots;
            return Err(e);
        }
        for (i, &slot) in slots.iter().enumerate() {
            let (a, b) = ranges.get(i);
            let r = rej(i).expect("checked above");
            self.apply_commit(slot, &tokens[a..b], r);
        }
        self.scratch_slots = slots;
        Ok(())
    }

    /// [`PrefixCache::commit_batch`] without rejections, for requests without
    /// drafts in flight (the async decode step): slots resolved once per batch
    /// ([`PrefixCache::resolve_batch`]), one validation pass, one apply pass.
    /// `false`, with nothing changed, when any request is not that case or
    /// fails a check (then the caller's checked path decides, exactly).
    fn commit_plain<T: Token>(&mut self, ids: &[u64], tokens: &[T], ranges: Ranges<'_>) -> bool
    where
        D: Reads<T>,
    {
        if !self.resolve_batch(ids) {
            return false;
        }
        let slots = std::mem::take(&mut self.batch_slots);
        let mut touched = 0i64;
        let valid = slots.iter().enumerate().all(|(i, &slot)| {
            let req = self.req(slot);
            let l = &req.life;
            let (a, b) = ranges.get(i);
            // Touch the end of the token list the commit will write: these
            // independent loads overlap here instead of missing one by one below.
            touched ^= req.tokens.last().map_or(0, |&t| t.into());
            l.status == Status::Running && l.drafts.is_empty() && b - a <= l.pending
        });
        std::hint::black_box(touched);
        if valid {
            for (i, &slot) in slots.iter().enumerate() {
                let (a, b) = ranges.get(i);
                self.apply_commit(slot, &tokens[a..b], 0);
            }
        }
        self.batch_slots = slots;
        valid
    }

    /// Preempts request `id` (vLLM's `_preempt_request`): its blocks return
    /// to the pool (tail first), `num_computed` drops to 0, drafts and
    /// placeholders in flight are discarded; its tokens stay for
    /// [`PrefixCache::resume`]. O(blocks).
    ///
    /// # Errors
    /// `UnknownRequest`; `InvalidArgument` if already preempted.
    pub fn preempt(&mut self, id: RequestId) -> KvResult<()> {
        let slot = self.slot(id)?;
        let req = self.reqs[slot as usize].as_mut().expect("indexed slot holds a request");
        if req.life.status == Status::Preempted {
            return Err(wrong_status(id, req.life.status));
        }
        self.design.release(req, false);
        let l = &mut req.life;
        l.status = Status::Preempted;
        l.num_computed = 0;
        l.pending = 0;
        l.drafts.clear();
        l.preemptions += 1;
        Ok(())
    }

    /// Finishes (or aborts) request `id` in any state: its blocks return to
    /// the pool; nothing more is cached (unlike today's `free`, which lets
    /// the radix design insert the request's whole sequence). O(blocks).
    ///
    /// # Errors
    /// `UnknownRequest`.
    pub fn finish(&mut self, id: RequestId) -> KvResult<()> {
        let mut req = self.remove_record(id)?;
        self.design.release(&mut req, false);
        Ok(())
    }

    /// The external KV of a `delay_cache` admission landed: `num_computed` is
    /// capped at `num_tokens - 1` (the last token is recomputed for its
    /// logits), the blocks up to it are cached, and the request runs
    /// (continue with `schedule`). O(blocks cached).
    ///
    /// # Errors
    /// `UnknownRequest`; `InvalidArgument` if it is not waiting for a transfer.
    pub fn finish_transfer(&mut self, id: RequestId) -> KvResult<()> {
        let slot = self.slot(id)?;
        let req = self.reqs[slot as usize].as_mut().expect("indexed slot holds a request");
        if req.life.status != Status::WaitingForRemoteKvs {
            return Err(wrong_status(id, req.life.status));
        }
        req.life.num_computed = req.life.num_computed.min(req.tokens.len() - 1);
        let upto = req.life.num_computed;
        Self::cache_step(&mut self.design, req, upto);
        req.life.status = Status::Running;
        Ok(())
    }

    /// Request `id`'s lifecycle counters.
    ///
    /// # Errors
    /// `UnknownRequest`.
    pub fn life(&self, id: RequestId) -> KvResult<&Life> {
        Ok(&self.get(id)?.life)
    }

    /// Known token ids of request `id` (prompt + committed outputs). O(1).
    ///
    /// # Errors
    /// `UnknownRequest`.
    pub fn num_known_tokens(&self, id: RequestId) -> KvResult<usize> {
        Ok(self.get(id)?.tokens.len())
    }
}
