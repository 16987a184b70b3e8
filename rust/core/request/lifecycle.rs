//! [`PrefixCache`]: the request lifecycle over any [`PrefixDesign`].
//!
//! Requests live in a slab (`Vec<Option<Record>>`, freed entries reused)
//! found through an id index, so a batch touches each record once by slot.
//! Batches are validated in a first pass (ids known, none repeated: a batch
//! epoch stamped on each record) and applied in a second, so a refused or
//! failing batch changes nothing. The per-step calls of the engine lifecycle
//! remember the slots of the last batch they resolved
//! ([`PrefixCache::resolve_batch`]); a batch whose records still carry its
//! ids at those slots needs neither the index nor the repeat check.
//!
//! # Invariants
//! The request layer's (module header of [`crate::core::request`], checked
//! by [`PrefixCache::check_invariants`]). Epoch stamps and the remembered
//! batch slots are hints: a stale one only costs the checked path.
//!
//! # Costs
//! One-chunk calls: O(1) probes per id plus the design's work;
//! [`PrefixCache::validate_batch`] O(ids), one probe per id.

use rustc_hash::FxHashMap;

use super::opts::StepOpts;
use super::{Admitted, Life, PrefixDesign, Reads, Record, RecordOf, SpecArg, Stats, Status};
use crate::core::error::{ErrorKind, InvariantViolation, KvError, KvResult};
use crate::core::events::KvEvent;
use crate::core::hash::KeySpec;
use crate::core::ids::{RequestId, TableEntry};
use crate::core::tables::{batch_ranges, TableSource};
use crate::ensure_inv;

/// A request-level prefix cache: the lifecycle of running requests over
/// design `D` (see the module header of [`crate::core::request`]).
#[derive(Clone, Debug)]
pub struct PrefixCache<D: PrefixDesign> {
    pub(super) design: D,
    /// Request id -> slot in `reqs`.
    pub(super) index: FxHashMap<RequestId, u32>,
    pub(super) reqs: Vec<Option<RecordOf<D>>>,
    pub(super) free_slots: Vec<u32>,
    /// Admission statistics (evictions are the design's tally).
    pub(super) stats: Stats,
    /// Admission statistics of preempted requests resuming.
    pub(super) resumed: Stats,
    pub(super) epoch: u64,
    pub(super) scratch_slots: Vec<u32>,
    pub(super) scratch_samples: Vec<usize>,
    /// Slots of the last batch [`PrefixCache::resolve_batch`] resolved
    /// (distinct, every id known): the next batch reuses them where each
    /// still holds the id at its position (a scheduler sends the same
    /// running set to every per-step call).
    pub(super) batch_slots: Vec<u32>,
}

#[cold]
pub(super) fn unknown(id: RequestId) -> KvError {
    KvError::new(
        ErrorKind::UnknownRequest,
        format!("unknown request id {} (never admitted, or already freed)", id.0),
    )
}

/// Today's `append` needs a running request whose known ids are all
/// computed (no drafts, no placeholder beyond the sampled one).
#[inline]
fn appendable<T, B, X>(req: &Record<T, B, X>) -> KvResult<()> {
    let l = &req.life;
    if l.status == Status::Running
        && l.drafts.is_empty()
        && l.pending <= 1
        && l.num_computed == req.tokens.len()
    {
        return Ok(());
    }
    Err(not_appendable(req.id, l))
}

#[cold]
fn not_appendable(id: RequestId, l: &Life) -> KvError {
    KvError::invalid(format!(
        "append needs a running request with every known id computed: request {} is {:?} with {} computed, \
         {} drafts, {} placeholders (use schedule / commit_tokens)",
        id.0,
        l.status,
        l.num_computed,
        l.drafts.len(),
        l.pending
    ))
}

#[cold]
pub(super) fn repeated(id: u64) -> KvError {
    KvError::invalid(format!("request {id} appears twice in one batch"))
}

impl<D: PrefixDesign> PrefixCache<D> {
    /// A cache with no running request over `design`.
    pub fn with_design(design: D) -> Self {
        PrefixCache {
            design,
            index: FxHashMap::default(),
            reqs: Vec::new(),
            free_slots: Vec::new(),
            stats: Stats::default(),
            resumed: Stats::default(),
            epoch: 0,
            scratch_slots: Vec::new(),
            scratch_samples: Vec::new(),
            batch_slots: Vec::new(),
        }
    }

    /// The design (read-only introspection).
    #[must_use]
    pub fn design(&self) -> &D {
        &self.design
    }

    /// The design, for the design's own operations (`pub(crate)`: the
    /// lifecycle's invariants must not be bypassed from outside).
    pub(crate) fn design_mut(&mut self) -> &mut D {
        &mut self.design
    }

    /// Statistics since construction (or the last [`PrefixCache::take_stats`]). O(1).
    #[must_use]
    pub fn stats(&self) -> Stats {
        Stats { evictions: self.design.evictions(), ..self.stats }
    }

    /// Returns the statistics and zeroes them. O(1).
    pub fn take_stats(&mut self) -> Stats {
        let s = self.stats();
        self.stats = Stats::default();
        self.resumed = Stats::default();
        self.design.clear_evictions();
        s
    }

    /// Number of running requests. O(1).
    #[must_use]
    pub fn num_requests(&self) -> usize {
        self.index.len()
    }

    /// Statistics of admissions that resumed a preempted request (vLLM's
    /// `preempted_*` prefix-cache stats; counted apart from [`PrefixCache::stats`],
    /// `evictions` unused), zeroed by [`PrefixCache::take_stats`] too. O(1).
    #[must_use]
    pub fn resumed_stats(&self) -> Stats {
        self.resumed
    }

    pub(super) fn slot(&self, id: RequestId) -> KvResult<u32> {
        self.index.get(&id).copied().ok_or_else(|| unknown(id))
    }

    /// The batch-validation pass every batch call runs first: resolves
    /// `ids` to their slots (into `slots`, cleared first), every id known
    /// and none repeated (the batch epoch stamped on each record), and runs
    /// the call's own `check(position, record)` on each record before its
    /// repeat check. Stops at the first error, which is the one reported;
    /// nothing changes but epoch stamps. O(ids), one index probe per id.
    #[inline]
    pub(super) fn validate_batch(
        &mut self,
        ids: &[u64],
        slots: &mut Vec<u32>,
        mut check: impl FnMut(usize, &RecordOf<D>) -> KvResult<()>,
    ) -> KvResult<()> {
        self.epoch += 1;
        let epoch = self.epoch;
        slots.clear();
        for (i, &id) in ids.iter().enumerate() {
            let Some(&slot) = self.index.get(&RequestId(id)) else {
                return Err(unknown(RequestId(id)));
            };
            let req = self.reqs[slot as usize].as_mut().expect("indexed slot holds a request");
            check(i, req)?;
            if req.epoch == epoch {
                return Err(repeated(id));
            }
            req.epoch = epoch;
            slots.push(slot);
        }
        Ok(())
    }

    /// Resolves a batch of distinct known ids to their slots, left in
    /// `batch_slots`. The last batch's slots are reused when every one still
    /// holds the id at its position: the slab and the index agree, and
    /// distinct slots holding the given ids mean the ids are distinct, so no
    /// probe and no repeat check are needed. Otherwise
    /// [`PrefixCache::validate_batch`]. `false` for an unknown or repeated
    /// id (nothing changed but epoch stamps; the caller's checked path then
    /// reports the first error in its own order). O(ids).
    pub(super) fn resolve_batch(&mut self, ids: &[u64]) -> bool {
        let reqs = &self.reqs;
        if self.batch_slots.len() == ids.len()
            && ids
                .iter()
                .zip(&self.batch_slots)
                .all(|(&id, &s)| reqs.get(s as usize).and_then(Option::as_ref).is_some_and(|r| r.id.0 == id))
        {
            return true;
        }
        let mut slots = std::mem::take(&mut self.batch_slots);
        let ok = self.validate_batch(ids, &mut slots, |_, _| Ok(())).is_ok();
        if !ok {
            slots.clear();
        }
        self.batch_slots = slots;
        ok
    }

    pub(super) fn req(&self, slot: u32) -> &RecordOf<D> {
        self.reqs[slot as usize].as_ref().expect("indexed slot holds a request")
    }

    /// Request `id`'s record.
    pub(crate) fn get(&self, id: RequestId) -> KvResult<&RecordOf<D>> {
        Ok(self.req(self.slot(id)?))
    }

    /// Request `id`'s record and the design, borrowed together (for a
    /// design operation on one running request).
    pub(crate) fn get_mut(&mut self, id: RequestId) -> KvResult<(&mut D, &mut RecordOf<D>)> {
        let slot = self.slot(id)?;
        let req = self.reqs[slot as usize].as_mut().expect("indexed slot holds a request");
        Ok((&mut self.design, req))
    }

    fn blocks_needed(&self, req: &RecordOf<D>, extra: usize) -> usize {
        (req.tokens.len() + extra).div_ceil(self.design.block_size()).saturating_sub(req.blocks.len())
    }

    /// `RequestTooLarge` when a prompt of `len` tokens needs more blocks than
    /// the pool could ever give it (every block but the null block 0).
    pub(super) fn check_fits(&self, id: RequestId, len: usize) -> KvResult<()> {
        let need = len.div_ceil(self.design.block_size());
        let usable = self.design.usable_blocks();
        if need <= usable {
            return Ok(());
        }
        Err(KvError::new(
            ErrorKind::RequestTooLarge,
            format!(
                "request {}'s prompt of {len} tokens needs {need} {unit}; the pool has {usable} usable {unit} \
                 ({}), so it can never be admitted",
                id.0,
                self.design.usable_what(),
                unit = D::UNIT
            ),
        ))
    }

    /// Tokens a prompt would hit now; nothing cached changes. O(prompt tokens).
    ///
    /// # Errors
    /// A key spec the design cannot key on (the radix tree: multimodal items).
    pub fn lookup<T>(&mut self, tokens: &[T], spec: &KeySpec) -> KvResult<usize>
    where
        D: Reads<T>,
    {
        D::check_tokens(tokens)?;
        self.design.lookup(tokens, spec)
    }

    /// Admits request `id` with prompt `tokens`: returns the number of cached
    /// (hit) tokens, or `None` — with nothing changed — when the blocks the
    /// design can make available do not cover it. With `skip_reading` the
    /// cache is not read (hit 0), but the prompt's blocks are still cached
    /// as the design caches them. O(prompt tokens + blocks).
    ///
    /// # Errors
    /// `DuplicateRequest` if `id` is running; `InvalidArgument` for an empty
    /// prompt or a key spec the design cannot key on; `RequestTooLarge` for
    /// a prompt that needs more blocks than the pool's usable ones
    /// (`num_blocks - 1`): it could never be admitted, so `None` (not now)
    /// would make a scheduler wait forever. The spec is given owned or
    /// borrowed ([`SpecArg`]).
    pub fn admit<'s, T>(
        &mut self,
        id: RequestId,
        tokens: &[T],
        spec: impl SpecArg<'s>,
        skip_reading: bool,
    ) -> KvResult<Option<usize>>
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
            return Err(KvError::invalid("a prompt needs at least one token"));
        }
        self.check_fits(id, tokens.len())?;
        D::check_tokens(tokens)?;
        let plan = self.design.plan_admit(id, tokens, spec.into_cow(), skip_reading)?;
        let Some(placed) = self.place(plan, tokens.len(), &StepOpts::default()) else {
            return Ok(None);
        };
        let hit = placed.sched.hit;
        self.stats.requests += 1;
        self.stats.queries += tokens.len() as u64;
        self.stats.hits += hit as u64;
        let life = Life { skip_reading, ..Life::default() };
        let slot = self.insert_record(id, placed.admitted, life);
        let req = self.reqs[slot as usize].as_mut().expect("just inserted");
        self.design.appended(req, 0);
        Self::admitted_life(&mut req.life, &placed.sched, req.tokens.len(), false);
        Ok(Some(hit))
    }

    /// Stores a new request's record; returns its slot.
    pub(super) fn insert_record(
        &mut self,
        id: RequestId,
        a: Admitted<D::Tok, D::Entry, D::Ext>,
        life: Life,
    ) -> u32 {
        let req = Record { epoch: 0, tokens: a.tokens, blocks: a.blocks, ext: a.ext, id, life };
        let slot = match self.free_slots.pop() {
            Some(s) => {
                self.reqs[s as usize] = Some(req);
                s
            }
            None => {
                self.reqs.push(Some(req));
                u32::try_from(self.reqs.len() - 1).expect("fewer than 2^32 running requests")
            }
        };
        self.index.insert(id, slot);
        slot
    }

    /// Appends computed decode tokens to request `id`. Returns `false`, with
    /// nothing changed, when the blocks it needs are not available. O(tokens),
    /// plus the design's work per filled block.
    ///
    /// # Errors
    /// `UnknownRequest` if `id` is not running.
    pub fn append<T>(&mut self, id: RequestId, tokens: &[T]) -> KvResult<bool>
    where
        D: Reads<T>,
    {
        let slot = self.slot(id)?;
        appendable(self.req(slot))?;
        D::check_tokens(tokens)?;
        if self.blocks_needed(self.req(slot), tokens.len()) > self.design.num_available() {
            return Ok(false);
        }
        self.apply_append(slot, tokens);
        Ok(true)
    }

    /// Appends `tokens[offsets[i]..offsets[i+1]]` to request `ids[i]` for
    /// every i, all or nothing: returns `false`, with nothing changed, when
    /// the available blocks do not cover every request's growth. `offsets`
    /// has `ids.len() + 1` entries, starts at 0, ends at `tokens.len()` and
    /// never decreases; `None` means one token per request. O(ids + tokens).
    ///
    /// # Errors
    /// `UnknownRequest`, or `InvalidArgument` for a repeated id or bad offsets;
    /// checked before anything changes.
    pub fn append_batch<T>(&mut self, ids: &[u64], tokens: &[T], offsets: Option<&[i64]>) -> KvResult<bool>
    where
        D: Reads<T>,
    {
        let ranges = batch_ranges(ids.len(), tokens.len(), offsets)?;
        D::check_tokens(tokens)?;
        let bs = self.design.block_size();
        let mut need = 0usize;
        let mut slots = std::mem::take(&mut self.scratch_slots);
        let mut touched = 0i64;
        let checked = self.validate_batch(ids, &mut slots, |i, req| {
            appendable(req)?;
            let (a, b) = ranges.get(i);
            need += (req.tokens.len() + b - a).div_ceil(bs).saturating_sub(req.blocks.len());
            // Touch the end of the token list the append will write: these
            // independent loads overlap here instead of missing one by one below.
            touched ^= req.tokens.last().map_or(0, |&t| t.into());
            Ok(())
        });
        if let Err(e) = checked {
            self.scratch_slots = slots;
            return Err(e);
        }
        std::hint::black_box(touched);
        let ok = need <= self.design.num_available();
        if ok {
            for (i, &slot) in slots.iter().enumerate() {
                let (a, b) = ranges.get(i);
                self.apply_append(slot, &tokens[a..b]);
            }
        }
        self.scratch_slots = slots;
        Ok(ok)
    }

    fn apply_append<T>(&mut self, slot: u32, tokens: &[T])
    where
        D: Reads<T>,
    {
        let bs = self.design.block_size();
        let req = self.reqs[slot as usize].as_mut().expect("indexed slot holds a request");
        let had_full = req.tokens.len() / bs;
        D::extend_tokens(&mut req.tokens, tokens);
        let need = req.tokens.len().div_ceil(bs).saturating_sub(req.blocks.len());
        if need > 0 {
            self.design.allocate(need, &mut req.blocks);
        }
        self.design.appended(req, had_full);
        req.life.num_computed = req.tokens.len();
        req.life.pending = 1;
    }

    /// Finishes request `id`: the design unpins its hits and releases (or
    /// caches) its blocks. O(blocks), plus the design's caching work.
    ///
    /// # Errors
    /// `UnknownRequest` if `id` is not running (including a double free).
    pub fn free(&mut self, id: RequestId) -> KvResult<()> {
        let mut req = self.remove_record(id)?;
        let insert = req.life.status == Status::Running;
        self.design.release(&mut req, insert);
        Ok(())
    }

    /// Takes request `id`'s record out of the slab and the index.
    pub(super) fn remove_record(&mut self, id: RequestId) -> KvResult<RecordOf<D>> {
        let slot = self.index.remove(&id).ok_or_else(|| unknown(id))?;
        self.free_slots.push(slot);
        Ok(self.reqs[slot as usize].take().expect("indexed slot holds a request"))
    }

    /// Finishes every request of `ids`, in order, as [`PrefixCache::free`]
    /// does. All ids are checked (known, no repeats) before anything changes.
    ///
    /// # Errors
    /// `UnknownRequest`, or `InvalidArgument` for a repeated id.
    pub fn free_batch(&mut self, ids: &[u64]) -> KvResult<()> {
        let mut slots = std::mem::take(&mut self.scratch_slots);
        let checked = self.validate_batch(ids, &mut slots, |_, _| Ok(()));
        self.scratch_slots = slots;
        checked?;
        for &id in ids {
            self.free(RequestId(id))?;
        }
        Ok(())
    }

    /// Drops every cached block.
    ///
    /// # Errors
    /// `BlockInUse` while any request is running.
    pub fn reset(&mut self) -> KvResult<()> {
        if !self.index.is_empty() {
            return Err(KvError::new(
                ErrorKind::BlockInUse,
                format!("cannot reset the prefix cache while {} requests hold {}", self.index.len(), D::UNIT),
            ));
        }
        self.design.reset()
    }

    /// Drains buffered KV events.
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        self.design.events_mut().take()
    }

    /// Bounds the KV event buffer: at most `max_events` events wait for
    /// [`Self::take_events`]; when full, the oldest is dropped and counted
    /// (see [`crate::core::event_buffer`]).
    ///
    /// # Errors
    /// `InvalidArgument` for 0.
    pub fn set_max_events(&mut self, max_events: usize) -> KvResult<()> {
        self.design.events_mut().set_capacity(max_events)
    }

    /// Events dropped from the full buffer since the last
    /// [`Self::take_events_dropped`].
    #[must_use]
    pub fn events_dropped(&self) -> u64 {
        self.design.events().dropped()
    }

    /// Returns [`Self::events_dropped`] and zeroes it.
    pub fn take_events_dropped(&mut self) -> u64 {
        self.design.events_mut().take_dropped()
    }

    /// Blocks shared by every running request: counting from block 0 of any
    /// running request's table, the blocks every running request holds (the
    /// prefix cascade attention can share): their count is the number of
    /// running requests, plus one where the design holds the block too. 0
    /// when nothing runs. O(shared blocks).
    #[must_use]
    pub fn num_common_prefix_blocks(&self) -> usize {
        let n = self.index.len();
        let Some(&slot) = self.index.values().next() else { return 0 };
        let req = self.req(slot);
        req.blocks
            .iter()
            .enumerate()
            .take_while(|&(i, &b)| {
                self.design.ref_count(b) as usize == n + usize::from(self.design.holds(req, i))
            })
            .count()
    }

    /// Checks the design's, the lifecycle's and the ownership invariants
    /// (module header of [`crate::core::request`]). O(blocks + all tokens).
    ///
    /// # Errors
    /// The first violation found.
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        let bs = self.design.block_size();
        let mut refs = vec![0u32; self.design.num_blocks()];
        ensure_inv!(
            self.reqs.iter().flatten().count() == self.index.len(),
            "request slab and index disagree"
        );
        let mut running = Vec::with_capacity(self.index.len());
        for (id, &slot) in &self.index {
            let r = self.req(slot);
            ensure_inv!(r.id == *id, "slot {slot} holds request {} but is indexed as {}", r.id.0, id.0);
            running.push(r);
        }
        for r in &running {
            let n = r.life.num_computed;
            if r.life.status == Status::Preempted {
                ensure_inv!(r.blocks.is_empty() && n == 0, "preempted request {} holds {}", r.id.0, D::UNIT);
            }
            ensure_inv!(
                r.blocks.len() * bs >= n,
                "request {}: {} {} for {n} computed positions",
                r.id.0,
                r.blocks.len(),
                D::UNIT
            );
            ensure_inv!(
                n <= r.tokens.len() + r.life.pending + r.life.drafts.len(),
                "request {}: {n} computed positions beyond its {} tokens, {} placeholders, {} drafts",
                r.id.0,
                r.tokens.len(),
                r.life.pending,
                r.life.drafts.len()
            );
            for b in &r.blocks {
                ensure_inv!(
                    *b != D::Entry::NULL && b.index() < refs.len(),
                    "request {} holds block {} (null or out of range)",
                    r.id.0,
                    b.raw()
                );
                refs[b.index()] += 1;
            }
        }
        self.design.check_invariants(&running, &mut refs)?;
        for (i, &c) in refs.iter().enumerate() {
            #[allow(clippy::cast_possible_truncation)]
            let rc = self.design.ref_count(D::Entry::from_raw(i as u32));
            ensure_inv!(rc == c, "block {i}: ref count {rc}, held by {c} (cache + tables)");
        }
        Ok(())
    }
}

impl<D: PrefixDesign> TableSource for PrefixCache<D> {
    type Entry = D::Entry;

    fn table_block_size(&self) -> usize {
        self.design.block_size()
    }

    /// The table and the positions computed or scheduled (the known tokens
    /// for today's one-chunk calls).
    fn table(&self, id: RequestId) -> KvResult<(&[D::Entry], usize)> {
        let r = self.get(id)?;
        Ok((&r.blocks, r.life.num_computed))
    }
}
