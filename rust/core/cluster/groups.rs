//! Scoring a worker by the hit its engine would give over its KV cache groups
//! (the group layout and per-group membership are in [`super::layout`]).
//!
//! A worker with a declared layout is scored by the core groups' fixed point
//! ([`crate::core::groups::coordinator::longest_hit`]) over a lookup into its
//! own per-group membership (hash boundaries inside blocks too, where the
//! layout has partial hash hits as its engine's does); one without is scored
//! on its full-attention group, and [`Basis`] says which.
//!
//! # Costs
//! O(groups × prompt blocks) per scored worker; workers that cannot beat the
//! best cost found so far are skipped.

use std::cell::Cell;

use super::index::{ClusterIndex, WorkerId};
use super::layout::group_key;
use crate::core::groups::coordinator::{coarse_hash_index, longest_hit};
use crate::core::groups::rule::BlockLookup;
use crate::core::groups::spec::GroupLayout;

/// How a worker's score was computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Basis {
    /// No worker in the slot (score 0).
    Empty,
    /// Its declared layout: the hybrid hit its engine would give.
    Layout,
    /// No layout declared: the leading blocks it holds in `group` (the group
    /// its events named full attention, else 0); `hybrid_events` when its
    /// events named other kinds too, so the score ignores groups that would
    /// shorten the engine's hit.
    FullOnly {
        /// The group read.
        group: u32,
        /// Whether events named non-full groups.
        hybrid_events: bool,
    },
}

impl Basis {
    /// A short name: `""`, `"layout"`, `"full_only"` or `"full_only_hybrid_events"`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Basis::Empty => "",
            Basis::Layout => "layout",
            Basis::FullOnly { hybrid_events: false, .. } => "full_only",
            Basis::FullOnly { hybrid_events: true, .. } => "full_only_hybrid_events",
        }
    }
}

/// Reused buffers of [`ClusterIndex::scores`].
#[derive(Debug, Default)]
pub struct ScoreScratch {
    /// Per (group, fine block): the block-map value, looked up once per query
    /// and shared by every worker.
    probes: Vec<Cell<Option<u32>>>,
    outs: Vec<Vec<Option<()>>>,
    walk: Vec<u32>,
    /// Shared walks of full-attention sets: (group, scale, per-slot run in the
    /// set's blocks).
    runs: Vec<(usize, usize, Vec<u32>)>,
    keys: Vec<u64>,
}

/// One worker's lookup into one spec set of its layout.
struct SetLookup<'a> {
    ix: &'a ClusterIndex,
    hashes: &'a [u64],
    probes: &'a [Cell<Option<u32>>],
    groups: &'a [usize],
    scale: usize,
    w: u32,
    /// The worker's leading run of this set's blocks, when a shared walk
    /// computed it (sets of one group): blocks below it are held and the
    /// block at it is not; blocks past it are probed.
    run: Option<usize>,
}

impl SetLookup<'_> {
    fn value(&self, g: usize, fine: usize) -> u32 {
        let cell = &self.probes[g * self.hashes.len() + fine];
        if let Some(v) = cell.get() {
            return v;
        }
        #[allow(clippy::cast_possible_truncation)]
        let v = self.ix.value(group_key(self.hashes[fine], g as u32));
        cell.set(Some(v));
        v
    }
}

impl BlockLookup for SetLookup<'_> {
    type Block = ();
    fn get(&mut self, i: usize) -> Option<()> {
        let fine = coarse_hash_index(i, self.scale);
        if fine >= self.hashes.len() {
            return None;
        }
        match self.run {
            Some(r) if i < r => return Some(()),
            Some(r) if i == r => return None,
            _ => {}
        }
        self.groups.iter().all(|&g| self.ix.value_holds(self.value(g, fine), self.w)).then_some(())
    }

    fn get_fine(&mut self, k: usize) -> Option<()> {
        // A hash boundary inside a block (a prompt tail's entry) or at its end.
        if k >= self.hashes.len() {
            return None;
        }
        self.groups.iter().all(|&g| self.ix.value_holds(self.value(g, k), self.w)).then_some(())
    }
}

impl ClusterIndex {
    /// Per worker slot, the prompt blocks (of the index's block size) its
    /// engine would reuse, into `out`, and how each was computed into `basis`
    /// (both resized to [`Self::slots`]). `hashes` are the prompt's block
    /// hashes at the index's block size (as [`super::query::QueryHasher::hashes`]
    /// computes them) and `prompt_tokens` its length.
    ///
    /// A worker with a declared layout gets the core's hybrid fixed point
    /// ([`longest_hit`]) over its groups, each spec set looking up that
    /// worker's membership in every member group, bounded by
    /// `prompt_tokens - 1` as vLLM bounds a hit; any other worker the leading
    /// blocks it holds in its full-attention group ([`Basis::FullOnly`]).
    ///
    /// Costs: a full-only worker of group 0 shares one walk
    /// ([`Self::overlaps`]); every other worker O(spec sets × blocks its
    /// rules visit) membership checks, each block-map probe made once per
    /// (group, block) and shared by all workers.
    ///
    /// With `prune = Some((load, overlap_weight))` (routing), a layout worker
    /// whose cost `overlap_weight * (blocks - score) + load` cannot beat the
    /// best one found (its score is at most its full-attention run) is not
    /// computed and scores 0, so [`super::route::pick_min_cost`] picks as it
    /// would with every score; a worker with a NaN load is not computed.
    pub fn scores(
        &self,
        hashes: &[u64],
        prompt_tokens: usize,
        prune: Option<(&[f64], f64)>,
        scratch: &mut ScoreScratch,
        out: &mut Vec<u32>,
        basis: &mut Vec<Basis>,
    ) {
        let n = self.slots();
        basis.clear();
        basis.resize(n, Basis::Empty);
        let mut groups = 0usize;
        let mut walk0 = false;
        for (w, wk) in self.workers() {
            let b = match wk.groups.layout() {
                Some(l) => {
                    groups = groups.max(l.layout().len());
                    Basis::Layout
                }
                None => {
                    let g = wk.groups.full_group();
                    walk0 |= g == 0;
                    groups = groups.max(g as usize + 1);
                    Basis::FullOnly { group: g, hybrid_events: wk.groups.seen_other != 0 }
                }
            };
            basis[w.0 as usize] = b;
        }
        if walk0 {
            self.overlaps(hashes, &mut scratch.walk);
        }
        out.clear();
        out.resize(n, 0);
        scratch.probes.clear();
        scratch.probes.resize(groups * hashes.len(), Cell::new(None));
        #[allow(clippy::cast_sign_loss, clippy::cast_possible_truncation)]
        let bs = self.block_size() as usize;
        // One walk per distinct one-group set (all workers at once, stopping where
        // none holds the next block): the leading runs answer most lookups of every
        // rule (full attention's all of them) without a per-worker probe.
        scratch.runs.clear();
        for (_, wk) in self.workers() {
            let Some(cl) = wk.groups.layout() else { continue };
            for set in cl.layout().spec_sets() {
                if set.group_ids.len() != 1 {
                    continue;
                }
                let (g, scale) = (set.group_ids[0], set.spec.block_size / bs);
                if scratch.runs.iter().any(|r| r.0 == g && r.1 == scale) {
                    continue;
                }
                scratch.keys.clear();
                #[allow(clippy::cast_possible_truncation)]
                scratch.keys.extend(
                    (0..hashes.len() / scale)
                        .map(|i| group_key(hashes[coarse_hash_index(i, scale)], g as u32)),
                );
                let mut run = Vec::new();
                self.overlaps(&scratch.keys, &mut run);
                scratch.runs.push((g, scale, run));
            }
        }
        // Full-only workers exactly (cheap); layout workers in order of the lowest
        // cost they could have (`prune`), each computed unless it cannot beat the
        // best cost so far (its hit is at most its full-attention run).
        let nb = hashes.len() as f64;
        let cost = |id: u32, blocks: u32| {
            prune.map_or(0.0, |(load, weight)| {
                weight * (nb - f64::from(blocks)) + load.get(id as usize).copied().unwrap_or(f64::NAN)
            })
        };
        let mut best = f64::INFINITY;
        let mut order: Vec<(f64, u32)> = Vec::new();
        for (w, wk) in self.workers() {
            let id = w.0;
            let held = match (basis[id as usize], wk.groups.layout()) {
                (Basis::FullOnly { group: 0, .. }, _) => scratch.walk[id as usize],
                (Basis::FullOnly { group, .. }, _) => {
                    let gs = [group as usize];
                    let mut l = SetLookup {
                        ix: self,
                        hashes,
                        probes: &scratch.probes,
                        groups: &gs,
                        scale: 1,
                        w: id,
                        run: None,
                    };
                    #[allow(clippy::cast_possible_truncation)]
                    let held = (0..hashes.len()).take_while(|&i| l.get(i).is_some()).count() as u32;
                    held
                }
                (_, Some(cl)) => {
                    let lb = cost(
                        id,
                        upper_bound(cl.layout(), &scratch.runs, id, bs, prompt_tokens, hashes.len()),
                    );
                    if prune.is_none() || !lb.is_nan() {
                        order.push((lb, id));
                    }
                    continue;
                }
                (_, None) => 0,
            };
            out[id as usize] = held;
            let c = cost(id, held);
            if !c.is_nan() {
                best = best.min(c);
            }
        }
        order.sort_by(|a, b| a.0.total_cmp(&b.0));
        for (lb, id) in order {
            if prune.is_some() && lb > best {
                break; // this and every later worker cost more than the best
            }
            let Some(wk) = self.worker(WorkerId(id)) else { continue };
            let Some(cl) = wk.groups.layout() else { continue };
            let blocks = layout_hit(self, cl.layout(), id, hashes, prompt_tokens, bs, scratch);
            out[id as usize] = blocks;
            best = best.min(cost(id, blocks));
        }
    }
}

/// Most blocks (of the index's size) worker `id` could reuse under `layout`:
/// its leading run in each one-group full-attention set, and the bound vLLM puts
/// on a hit (`prompt_tokens - 1`, down to the alignment).
fn upper_bound(
    layout: &GroupLayout,
    runs: &[(usize, usize, Vec<u32>)],
    id: u32,
    bs: usize,
    prompt_tokens: usize,
    hashes: usize,
) -> u32 {
    let a = layout.alignment();
    let mut ub = (prompt_tokens.saturating_sub(1) / a * a / bs).min(hashes);
    for s in layout.spec_sets() {
        if !s.spec.kind.is_full() {
            continue;
        }
        let scale = s.spec.block_size / bs;
        // Under partial hash hits the hit may reach into the block after the run.
        let inside = if layout.partial_hits() { scale - 1 } else { 0 };
        if let Some(r) = runs.iter().find(|r| s.group_ids == [r.0] && r.1 == scale) {
            ub = ub.min(r.2[id as usize] as usize * scale + inside);
        }
    }
    #[allow(clippy::cast_possible_truncation)]
    let ub = ub as u32;
    ub
}

/// Worker `id`'s hit under `layout` in blocks of the index's size: the core's
/// fixed point over its per-group membership.
fn layout_hit(
    ix: &ClusterIndex,
    layout: &GroupLayout,
    id: u32,
    hashes: &[u64],
    prompt_tokens: usize,
    bs: usize,
    scratch: &mut ScoreScratch,
) -> u32 {
    let sets = layout.spec_sets();
    let runs = &scratch.runs;
    let mut looks: Vec<SetLookup<'_>> = sets
        .iter()
        .map(|s| {
            let scale = s.spec.block_size / bs;
            let run =
                runs.iter().find(|r| s.group_ids == [r.0] && r.1 == scale).map(|r| r.2[id as usize] as usize);
            SetLookup { ix, hashes, probes: &scratch.probes, groups: &s.group_ids, scale, w: id, run }
        })
        .collect();
    scratch.outs.resize_with(sets.len().max(scratch.outs.len()), Vec::new);
    let hit = longest_hit(
        layout,
        &mut looks,
        prompt_tokens.saturating_sub(1),
        hashes.len(),
        &mut scratch.outs[..sets.len()],
    );
    #[allow(clippy::cast_possible_truncation)]
    let blocks = (hit.tokens / bs) as u32;
    blocks
}

#[cfg(test)]
mod tests {
    use crate::core::cluster::layout::{group_key, ClusterLayout, WorkerGroups};
    use crate::core::groups::spec::{GroupKind, GroupLayout, GroupSpec, LayoutOptions};

    fn layout(sizes: &[usize]) -> GroupLayout {
        let groups = sizes.iter().map(|&b| GroupSpec::full(b)).collect();
        GroupLayout::new(groups, LayoutOptions { enable_caching: true, ..LayoutOptions::default() })
            .expect("test setup")
    }

    #[test]
    fn keys_and_layouts() {
        assert_eq!(group_key(5, 0), 5);
        assert_ne!(group_key(5, 1), 5);
        assert_ne!(group_key(5, 1), group_key(5, 2));
        assert!(ClusterLayout::new(layout(&[16, 32]), 16).is_ok());
        assert!(ClusterLayout::new(layout(&[32, 64]), 16).is_err()); // hashes at 32
        assert_eq!(ClusterLayout::new(layout(&[16, 32]), 16).expect("valid").block_sizes(), &[16, 32]);
        let swa = GroupSpec { kind: GroupKind::SlidingWindow { window: 8 }, block_size: 16 };
        let many = GroupLayout::new(vec![swa; 65], LayoutOptions::default()).expect("test setup");
        assert!(ClusterLayout::new(many, 16).is_err());
        let mut w = WorkerGroups::default();
        assert_eq!(w.full_group(), 0);
        w.saw(0b100, 0b011);
        assert_eq!(w.full_group(), 2);
        assert!(w.block_sizes().is_empty());
    }

    /// Full attention + a sliding window of 8 tokens (blocks of 4): worker a
    /// holds more full-attention blocks, but not the window's blocks where
    /// its run ends; worker b holds fewer, with the window. Full-only scoring
    /// prefers a; the engine (the hybrid hit) would reuse more on b.
    #[test]
    fn hybrid_scores_follow_the_engine() {
        use super::{Basis, ScoreScratch};
        use crate::core::cluster::ClusterIndex;
        let swa = GroupSpec { kind: GroupKind::SlidingWindow { window: 8 }, block_size: 4 };
        let opt = LayoutOptions { enable_caching: true, ..LayoutOptions::default() };
        let l = GroupLayout::new(vec![GroupSpec::full(4), swa], opt).expect("test setup");
        let mut ix = ClusterIndex::new(4).expect("test setup");
        let (a, b, c) = (
            ix.add_worker("a", 0).expect("room"),
            ix.add_worker("b", 0).expect("room"),
            ix.add_worker("c", 0).expect("room"),
        );
        let hashes: Vec<u64> = (100..110).collect();
        let key = |i: usize, g: u32| group_key(hashes[i], g);
        ix.store_hashes(a, &(0..6).map(|i| key(i, 0)).collect::<Vec<_>>()).expect("present");
        ix.store_hashes(a, &[key(0, 1), key(1, 1)]).expect("present");
        ix.store_hashes(b, &(0..4).map(|i| key(i, 0)).collect::<Vec<_>>()).expect("present");
        ix.store_hashes(b, &[key(2, 1), key(3, 1)]).expect("present");
        ix.store_hashes(c, &(0..4).map(|i| key(i, 1)).collect::<Vec<_>>()).expect("present");
        let (mut sc, mut out, mut basis) = (ScoreScratch::default(), Vec::new(), Vec::new());
        ix.scores(&hashes, 40, None, &mut sc, &mut out, &mut basis);
        assert_eq!(out, vec![6, 4, 0]);
        assert_eq!(basis, vec![Basis::FullOnly { group: 0, hybrid_events: false }; 3]);
        for w in [a, b, c] {
            let cl = ClusterLayout::new(l.clone(), 4).expect("valid");
            ix.set_worker_layout(w, Some(std::sync::Arc::new(cl))).expect("present");
        }
        ix.scores(&hashes, 40, None, &mut sc, &mut out, &mut basis);
        // a: full run of 6 blocks; the window ending at 24 needs blocks 4, 5 of
        // group 1 (absent), ... down to the run from block 0: blocks 0, 1 -> 8 tokens.
        assert_eq!(out, vec![2, 4, 0]);
        assert_eq!(basis, vec![Basis::Layout; 3]);
        // Pruned for routing: a (cost at least 10 - 6 + 0) and c are not computed
        // once b costs 10 - 4 + 0; the pick is the same.
        let load = [0.0, 0.0, 0.0];
        let mut pruned = Vec::new();
        ix.scores(&hashes, 40, Some((&load, 1.0)), &mut sc, &mut pruned, &mut basis);
        assert_eq!(pruned[1], 4);
        let pick = |o: &[u32]| crate::core::cluster::route::pick_min_cost(o, 10, &load, 1.0, 0);
        assert_eq!(pick(&pruned), pick(&out));
        let far = [0.0, 9.0, f64::NAN];
        ix.scores(&hashes, 40, Some((&far, 1.0)), &mut sc, &mut pruned, &mut basis);
        assert_eq!(pruned[0], 2);
        let pick2 = |o: &[u32]| crate::core::cluster::route::pick_min_cost(o, 10, &far, 1.0, 0);
        assert_eq!(pick2(&pruned), Some(0));
        assert_eq!(Basis::Layout.name(), "layout");
        // Events that named group 1 full attention make it the full-only group.
        ix.set_worker_layout(c, None).expect("present");
        ix.wk(c).groups.saw(0b10, 0b01);
        ix.scores(&hashes, 40, None, &mut sc, &mut out, &mut basis);
        assert_eq!(out[2], 4);
        assert_eq!(basis[2], Basis::FullOnly { group: 1, hybrid_events: true });
        ix.check_invariants().expect("ok");
    }

    /// Full attention on the hash block beside align-mode Mamba on twice it,
    /// partial hash hits on (as a vLLM engine's): a worker whose Mamba state
    /// is registered at a hash boundary inside its block scores that far.
    #[test]
    fn partial_hash_hits_score_mamba_tails_inside_blocks() {
        use super::ScoreScratch;
        use crate::core::cluster::ClusterIndex;
        use crate::core::groups::spec::MambaMode;
        let mamba = GroupSpec { kind: GroupKind::Mamba { mode: MambaMode::Align }, block_size: 4 };
        let opt =
            LayoutOptions { enable_caching: true, allow_partial_hash_hits: true, ..LayoutOptions::default() };
        let l = GroupLayout::new(vec![GroupSpec::full(2), mamba], opt).expect("test setup");
        assert!(l.partial_hits());
        let mut ix = ClusterIndex::new(2).expect("test setup");
        let (a, b) = (ix.add_worker("a", 0).expect("room"), ix.add_worker("b", 0).expect("room"));
        let hashes: Vec<u64> = (200..206).collect();
        let key = |i: usize, g: u32| group_key(hashes[i], g);
        // a: full attention to 10 tokens, the Mamba state at 6 (a prompt tail, inside block 1);
        // b: the same full attention, the Mamba state at 4 (a block end).
        for w in [a, b] {
            ix.store_hashes(w, &(0..5).map(|i| key(i, 0)).collect::<Vec<_>>()).expect("present");
            let cl = ClusterLayout::new(l.clone(), 2).expect("valid");
            ix.set_worker_layout(w, Some(std::sync::Arc::new(cl))).expect("present");
        }
        ix.store_hashes(a, &[key(2, 1)]).expect("present");
        ix.store_hashes(b, &[key(1, 1)]).expect("present");
        let (mut sc, mut out, mut basis) = (ScoreScratch::default(), Vec::new(), Vec::new());
        ix.scores(&hashes, 12, None, &mut sc, &mut out, &mut basis);
        assert_eq!(out, vec![3, 2]);
        // Pruned for routing, the pick is the same.
        let load = [0.0, 0.0];
        let mut pruned = Vec::new();
        ix.scores(&hashes, 12, Some((&load, 1.0)), &mut sc, &mut pruned, &mut basis);
        let pick = |o: &[u32]| crate::core::cluster::route::pick_min_cost(o, 6, &load, 1.0, 0);
        assert_eq!(pick(&pruned), pick(&out));
        ix.check_invariants().expect("ok");
    }
}
