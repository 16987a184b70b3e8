//! KV cache group specs and a cache's group layout, as vLLM 0.33's
//! `KVCacheConfig` / `resolve_kv_cache_block_sizes` / hybrid coordinator
//! checks define them.
//!
//! A *group* is a set of layers that share one block table per request: its
//! [`GroupKind`] (full attention, MLA, sliding window, sliding-window MLA,
//! chunked local, Mamba, cross-attention; see [`super::kind`]) and its block
//! size. A [`GroupLayout`] is the ordered list of a cache's groups (the index of a group is vLLM's `kv_cache_group_id`, the
//! `group_idx` of its KV events) with the two derived sizes:
//! - `hash_block_size`: the granularity of a request's block hashes, the gcd
//!   of the group block sizes (the scheduler block size when caching is off
//!   or a Mamba group is not in "align" mode, as vLLM backs off);
//! - `scheduler_block_size`: the lcm, to which every hybrid hit is aligned.
//!
//! Groups with the same spec (kind and block size) form one *spec set*,
//! looked up jointly (vLLM's `SpecGroup`); full-attention sets come first.
//! A group that is not prefix-cacheable (sliding-window MLA with bounded
//! replay, cross-attention) is in no spec set: it never hits and is never
//! cached, and its block size takes no part in the hash block size. A
//! cross-attention group needs prefix caching off (vLLM's
//! `CrossAttentionManager` neither looks up nor caches). Each set carries its
//! EAGLE drop flag: set when any member group drops the EAGLE block (vLLM's
//! `drop_eagle_group_ids`: the groups flagged `is_eagle_group`, or all of
//! them when EAGLE is on and none is flagged).
//!
//! # Invariants (established by [`GroupLayout::new`], the EAGLE flags by
//! [`GroupLayout::with_eagle_groups`]; never changed after)
//! - at least one group, at least one of them prefix-cacheable; every block
//!   size > 0; every prefix-cacheable group's a multiple of
//!   `hash_block_size`; `scheduler_block_size` a multiple of each;
//! - the per-group EAGLE flags are their spec set's flag (false outside
//!   the sets), all false when EAGLE is off;
//! - what vLLM 0.33 rejects on a hybrid config is rejected here, and what
//!   kvindex does not implement is rejected with an error naming it.
//!
//! Costs: construction O(groups²); every accessor O(1).

use crate::core::error::{KvError, KvResult};
pub use crate::core::groups::kind::{GroupKind, MambaMode};

/// One group: its kind and block size (tokens per block).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GroupSpec {
    /// The single-type rule the group follows.
    pub kind: GroupKind,
    /// Tokens per block of this group.
    pub block_size: usize,
}

impl GroupSpec {
    /// A full-attention group of `block_size`.
    #[must_use]
    pub fn full(block_size: usize) -> Self {
        GroupSpec { kind: GroupKind::FullAttention, block_size }
    }
}

/// Options of a layout that change its rules (vLLM's coordinator arguments).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LayoutOptions {
    /// Whether prefix caching is on.
    pub enable_caching: bool,
    /// vLLM's `prefix_match_unit`: the hash block size, instead of the gcd.
    pub hash_block_size: Option<usize>,
    /// The scheduler block size, instead of the lcm (a common multiple).
    pub scheduler_block_size: Option<usize>,
    /// EAGLE / MTP drops the last matched block of every group (vLLM's
    /// `use_eagle` with no group flagged: all groups are EAGLE groups).
    pub use_eagle: bool,
    /// vLLM's `allow_partial_hash_hits`: a layout with an align-mode Mamba
    /// group larger than the hash block then hits at hash-block boundaries
    /// inside blocks ([`GroupLayout::partial_hits`]).
    pub allow_partial_hash_hits: bool,
}

/// Groups sharing one spec, looked up together (vLLM's `SpecGroup`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecSet {
    /// The shared spec.
    pub spec: GroupSpec,
    /// Member group indices, ascending.
    pub group_ids: Vec<usize>,
    /// Whether the set's hits drop the EAGLE block (some member does).
    pub use_eagle: bool,
}

/// A cache's groups and their derived sizes (module header, invariants).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupLayout {
    groups: Vec<GroupSpec>,
    hash_block_size: usize,
    scheduler_block_size: usize,
    enable_caching: bool,
    use_eagle: bool,
    /// vLLM's `enable_partial_hash_hits`: hits may end at any hash-block
    /// boundary (inside a block), with copy-on-write of the shared tail.
    partial_hits: bool,
    /// Per group: whether its hits and caching drop the EAGLE block.
    eagle: Vec<bool>,
    /// Spec sets of the prefix-cacheable groups, full attention first, then
    /// first-seen order.
    sets: Vec<SpecSet>,
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Least common multiple, `None` on overflow.
fn lcm(a: usize, b: usize) -> Option<usize> {
    (a / gcd(a, b)).checked_mul(b)
}

impl GroupLayout {
    /// The one-group layout of a full-attention cache (today's single group).
    ///
    /// # Errors
    /// `InvalidArgument` for `block_size == 0`.
    pub fn single_full(block_size: usize, enable_caching: bool) -> KvResult<Self> {
        Self::new(
            vec![GroupSpec::full(block_size)],
            LayoutOptions { enable_caching, ..LayoutOptions::default() },
        )
    }

    /// Validates `groups` as vLLM 0.33 does for a (hybrid) `KVCacheConfig`
    /// and derives the hash and scheduler block sizes.
    ///
    /// # Errors
    /// `InvalidArgument` naming the first problem: no groups, a zero block
    /// size, a hash block size that does not divide every group's, a
    /// scheduler block size that is not a common multiple, Mamba caching
    /// outside "align" mode, chunked local attention with differing block
    /// sizes or EAGLE.
    pub fn new(groups: Vec<GroupSpec>, opt: LayoutOptions) -> KvResult<Self> {
        if groups.is_empty() {
            return Err(KvError::invalid("a KV cache needs at least one group"));
        }
        if groups.len() > u32::MAX as usize {
            return Err(KvError::invalid("too many KV cache groups"));
        }
        if !groups.iter().any(|s| s.kind.prefix_cacheable()) {
            return Err(KvError::invalid(
                "a KV cache needs at least one prefix-cacheable group (every group here is a \
                 sliding-window MLA group with bounded replay or cross-attention)",
            ));
        }
        if opt.enable_caching && groups.iter().any(|s| s.kind == GroupKind::CrossAttention) {
            return Err(KvError::invalid(
                "a cross-attention group needs prefix caching off (vLLM's CrossAttentionManager \
                 neither looks up nor caches blocks)",
            ));
        }
        let mut l = 1usize;
        let mut g = 0usize;
        for (i, s) in groups.iter().enumerate() {
            if s.block_size == 0 {
                return Err(KvError::invalid(format!("group {i}: block_size must be positive")));
            }
            if s.block_size > u32::MAX as usize {
                return Err(KvError::invalid(format!("group {i}: block_size {} is too large", s.block_size)));
            }
            l = lcm(l, s.block_size)
                .ok_or_else(|| KvError::invalid("the groups' block sizes overflow their lcm"))?;
            if s.kind.prefix_cacheable() {
                g = gcd(g, s.block_size);
            }
        }
        // Only the prefix-cacheable groups are hashed (vLLM's `hashing_sizes`).
        let hashed = || groups.iter().filter(|s| s.kind.prefix_cacheable());
        let scheduler = match opt.scheduler_block_size {
            Some(sb) => {
                if sb == 0 || groups.iter().any(|s| sb % s.block_size != 0) {
                    return Err(KvError::invalid(format!(
                        "scheduler_block_size {sb} must be a positive multiple of every group's block size"
                    )));
                }
                sb
            }
            None => l,
        };
        let mamba_not_align =
            groups.iter().any(|s| matches!(s.kind, GroupKind::Mamba { mode: MambaMode::None }));
        if opt.enable_caching && mamba_not_align {
            return Err(KvError::invalid("Mamba prefix caching requires mamba_cache_mode='align'"));
        }
        let hash = if groups.len() == 1 {
            groups[0].block_size
        } else if !opt.enable_caching {
            scheduler
        } else {
            opt.hash_block_size.unwrap_or(g)
        };
        if hash == 0 || hashed().any(|s| s.block_size % hash != 0) || scheduler % hash != 0 {
            return Err(KvError::invalid(format!(
                "hash_block_size {hash} must divide every prefix-cacheable group's block size ({:?})",
                hashed().map(|s| s.block_size).collect::<Vec<_>>()
            )));
        }
        let mut partial = false;
        if opt.enable_caching && groups.len() > 1 {
            for (i, s) in groups.iter().enumerate() {
                if let GroupKind::ChunkedLocal { .. } = s.kind {
                    if s.block_size != scheduler {
                        return Err(KvError::invalid(format!(
                            "group {i}: KV cache groups with different block sizes are not compatible \
                             with chunked local attention"
                        )));
                    }
                    if opt.use_eagle {
                        return Err(KvError::invalid(
                            "hybrid KV cache is not supported for EAGLE + chunked local attention",
                        ));
                    }
                }
            }
            // vLLM's `partial_hash_hits_enabled`: an align-mode Mamba group larger than the
            // hash block, and every prefix-cacheable group able to look up interior hash
            // boundaries (or as small as the hash block).
            partial = groups.iter().any(|s| {
                matches!(s.kind, GroupKind::Mamba { mode: MambaMode::Align }) && s.block_size > hash
            }) && hashed().all(|s| s.kind.fine_grained_lookup() || s.block_size == hash);
            partial &= opt.allow_partial_hash_hits;
        }
        let mut sets: Vec<SpecSet> = Vec::new();
        for (i, s) in groups.iter().enumerate() {
            if !s.kind.prefix_cacheable() {
                continue;
            }
            match sets.iter_mut().find(|x| x.spec == *s) {
                Some(x) => x.group_ids.push(i),
                None => sets.push(SpecSet { spec: *s, group_ids: vec![i], use_eagle: opt.use_eagle }),
            }
        }
        sets.sort_by_key(|x| !x.spec.kind.is_full());
        let mut layout = GroupLayout {
            eagle: vec![false; groups.len()],
            groups,
            hash_block_size: hash,
            scheduler_block_size: scheduler,
            enable_caching: opt.enable_caching,
            use_eagle: opt.use_eagle,
            partial_hits: partial,
            sets,
        };
        layout.spread_eagle();
        Ok(layout)
    }

    /// Sets each group's EAGLE flag from its spec set's (false outside the sets).
    fn spread_eagle(&mut self) {
        self.eagle.iter_mut().for_each(|e| *e = false);
        for set in &self.sets {
            for &g in &set.group_ids {
                self.eagle[g] = set.use_eagle;
            }
        }
    }

    /// The layout with vLLM's per-group EAGLE flags (`is_eagle_group`, one
    /// per group): with EAGLE on, the flagged groups drop the EAGLE block, or
    /// every group when none is flagged; a spec set drops it when any member
    /// does, and so do all its members. With EAGLE off nothing drops.
    ///
    /// # Errors
    /// `InvalidArgument` when `flagged` does not have one entry per group.
    pub fn with_eagle_groups(mut self, flagged: &[bool]) -> KvResult<Self> {
        if flagged.len() != self.groups.len() {
            return Err(KvError::invalid(format!(
                "{} EAGLE group flags for {} KV cache groups",
                flagged.len(),
                self.groups.len()
            )));
        }
        let none = !flagged.iter().any(|&f| f);
        let drops = |g: usize| self.use_eagle && (none || flagged[g]);
        let per_set: Vec<bool> = self.sets.iter().map(|s| s.group_ids.iter().any(|&g| drops(g))).collect();
        for (set, e) in self.sets.iter_mut().zip(per_set) {
            set.use_eagle = e;
        }
        self.spread_eagle();
        Ok(self)
    }

    /// The layout with spec sets split by the engine's own spec equality:
    /// `classes[g]` names group `g`'s spec as the engine compares specs
    /// (vLLM's `KVCacheSpec.__eq__` also compares the dtype and head shape,
    /// which [`GroupSpec`] does not carry), so two groups share a spec set
    /// only when their specs and classes are equal. Call before
    /// [`Self::with_eagle_groups`] (the sets start with the layout's EAGLE flag).
    ///
    /// # Errors
    /// `InvalidArgument` when `classes` does not have one entry per group.
    pub fn with_spec_classes(mut self, classes: &[u32]) -> KvResult<Self> {
        if classes.len() != self.groups.len() {
            return Err(KvError::invalid(format!(
                "{} spec classes for {} KV cache groups",
                classes.len(),
                self.groups.len()
            )));
        }
        let mut sets: Vec<SpecSet> = Vec::new();
        for (i, s) in self.groups.iter().enumerate() {
            if !s.kind.prefix_cacheable() {
                continue;
            }
            match sets.iter_mut().find(|x| x.spec == *s && classes[x.group_ids[0]] == classes[i]) {
                Some(x) => x.group_ids.push(i),
                None => sets.push(SpecSet { spec: *s, group_ids: vec![i], use_eagle: self.use_eagle }),
            }
        }
        sets.sort_by_key(|x| !x.spec.kind.is_full());
        self.sets = sets;
        self.spread_eagle();
        Ok(self)
    }

    /// The groups, in `kv_cache_group_id` order.
    #[must_use]
    pub fn groups(&self) -> &[GroupSpec] {
        &self.groups
    }

    /// Number of groups.
    #[must_use]
    pub fn len(&self) -> usize {
        self.groups.len()
    }

    /// Always false (a layout has at least one group).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Tokens per request block hash (gcd of the block sizes).
    #[must_use]
    pub fn hash_block_size(&self) -> usize {
        self.hash_block_size
    }

    /// The scheduler block size (lcm): hybrid hits are multiples of it.
    #[must_use]
    pub fn scheduler_block_size(&self) -> usize {
        self.scheduler_block_size
    }

    /// Alignment of every hit, in tokens (vLLM's `cache_hit_alignment_tokens`;
    /// the block size itself for one group).
    #[must_use]
    pub fn alignment(&self) -> usize {
        if self.partial_hits {
            self.hash_block_size
        } else if self.groups.len() == 1 {
            self.groups[0].block_size
        } else {
            self.scheduler_block_size
        }
    }

    /// vLLM's `enable_partial_hash_hits`: hits are aligned to the hash block
    /// ([`Self::alignment`]) and may end inside a block; a hit ending inside
    /// a block copies it on write, and align-mode Mamba groups register the
    /// prompt's last hash boundary.
    #[must_use]
    pub fn partial_hits(&self) -> bool {
        self.partial_hits
    }

    /// Whether prefix caching is on.
    #[must_use]
    pub fn enable_caching(&self) -> bool {
        self.enable_caching
    }

    /// Whether EAGLE is on (vLLM's `drop_eagle_group_ids` is not empty): the
    /// replay boundaries of sparse retention move one block down.
    #[must_use]
    pub fn use_eagle(&self) -> bool {
        self.use_eagle
    }

    /// Whether group `g`'s hits and caching drop the EAGLE block (its spec
    /// set's flag; false for a group out of range or in no set).
    #[must_use]
    pub fn group_eagle(&self, g: usize) -> bool {
        self.eagle.get(g).copied().unwrap_or(false)
    }

    /// The spec sets, full attention first (vLLM's `attention_groups`).
    #[must_use]
    pub fn spec_sets(&self) -> &[SpecSet] {
        &self.sets
    }

    /// Whether this is vLLM's "simple hybrid" (two spec sets, full first):
    /// one pass of the fixed point suffices.
    #[must_use]
    pub fn is_simple_hybrid(&self) -> bool {
        self.sets.len() == 2 && self.sets[0].spec.kind.is_full()
    }

    /// Whether group `g` is looked up and cached (false out of range).
    #[must_use]
    pub fn prefix_cacheable(&self, g: usize) -> bool {
        self.groups.get(g).is_some_and(|s| s.kind.prefix_cacheable())
    }

    /// Whether the layout is one full-attention (or MLA) group.
    #[must_use]
    pub fn is_single_full(&self) -> bool {
        self.groups.len() == 1 && self.groups[0].kind.is_full()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on() -> LayoutOptions {
        LayoutOptions { enable_caching: true, ..LayoutOptions::default() }
    }

    #[test]
    fn sizes_are_gcd_and_lcm_and_full_sets_come_first() {
        let g = vec![
            GroupSpec { kind: GroupKind::SlidingWindow { window: 128 }, block_size: 16 },
            GroupSpec::full(32),
            GroupSpec { kind: GroupKind::SlidingWindow { window: 128 }, block_size: 16 },
        ];
        let l = GroupLayout::new(g, on()).expect("valid");
        assert_eq!(l.hash_block_size(), 16);
        assert_eq!(l.scheduler_block_size(), 32);
        assert_eq!(l.spec_sets().len(), 2);
        assert_eq!(l.spec_sets()[0].group_ids, vec![1]);
        assert_eq!(l.spec_sets()[1].group_ids, vec![0, 2]);
        // Groups 0 and 2 whose engine specs differ (a dtype) are two sets.
        let split = l.clone().with_spec_classes(&[0, 1, 2]).expect("one class per group");
        assert_eq!(split.spec_sets().len(), 3);
        assert_eq!(split.spec_sets()[1].group_ids, vec![0]);
        assert!(l.clone().with_spec_classes(&[0, 1]).is_err());
        assert!(l.is_simple_hybrid());
    }

    #[test]
    fn vllm_checks_reject() {
        let mamba_none = GroupSpec { kind: GroupKind::Mamba { mode: MambaMode::None }, block_size: 16 };
        assert!(GroupLayout::new(vec![GroupSpec::full(16), mamba_none], on()).is_err());
        let off = LayoutOptions::default();
        let l = GroupLayout::new(vec![GroupSpec::full(16), mamba_none], off).expect("caching off");
        assert_eq!(l.hash_block_size(), 16);
        let cl = GroupSpec { kind: GroupKind::ChunkedLocal { chunk: 64 }, block_size: 16 };
        assert!(GroupLayout::new(vec![GroupSpec::full(32), cl], on()).is_err());
        let mamba = GroupSpec { kind: GroupKind::Mamba { mode: MambaMode::Align }, block_size: 64 };
        let partial = LayoutOptions { allow_partial_hash_hits: true, ..on() };
        // Partial hash hits: on when allowed (hits aligned to the hash block), with EAGLE too,
        // off beside a sliding window larger than the hash block.
        let l = GroupLayout::new(vec![GroupSpec::full(16), mamba], partial).expect("partial hits");
        assert!(l.partial_hits());
        assert_eq!((l.alignment(), l.scheduler_block_size()), (16, 64));
        let eagle = LayoutOptions { use_eagle: true, ..partial };
        assert!(GroupLayout::new(vec![GroupSpec::full(16), mamba], eagle).expect("eagle").partial_hits());
        let swa = GroupSpec { kind: GroupKind::SlidingWindow { window: 64 }, block_size: 32 };
        let l = GroupLayout::new(vec![GroupSpec::full(16), swa, mamba], partial).expect("no partial hits");
        assert!(!l.partial_hits());
        let l = GroupLayout::new(vec![GroupSpec::full(16), mamba], on()).expect("not allowed");
        assert!(!l.partial_hits());
        assert_eq!(l.alignment(), 64);
        assert!(GroupLayout::new(vec![], on()).is_err());
        assert!(GroupLayout::new(vec![GroupSpec::full(0)], on()).is_err());
        let bad_hash = LayoutOptions { hash_block_size: Some(3), ..on() };
        assert!(GroupLayout::new(vec![GroupSpec::full(16), GroupSpec::full(32)], bad_hash).is_err());
        assert!(GroupKind::parse("sliding_window", 0, "").is_err());
        assert!(GroupKind::parse("encoder_only_attention", 0, "").is_err());
        // Cross-attention: beside full attention with prefix caching off only.
        let cross =
            GroupSpec { kind: GroupKind::parse("cross_attention", 0, "").expect("ok"), block_size: 16 };
        assert!(GroupLayout::new(vec![GroupSpec::full(16), cross], on()).is_err());
        let l = GroupLayout::new(vec![GroupSpec::full(16), cross], LayoutOptions::default()).expect("off");
        assert!(!l.prefix_cacheable(1) && l.spec_sets().len() == 1);
        assert!(GroupLayout::new(vec![cross], LayoutOptions::default()).is_err());
        assert_eq!(
            GroupKind::parse("mamba", 0, "align").expect("ok"),
            GroupKind::Mamba { mode: MambaMode::Align }
        );
    }

    fn swa_mla(window: usize, bounded_replay: bool, block_size: usize) -> GroupSpec {
        GroupSpec { kind: GroupKind::SlidingWindowMla { window, bounded_replay }, block_size }
    }

    #[test]
    fn sliding_window_mla_parses_and_bounded_replay_is_not_cacheable() {
        let k = GroupKind::parse("sliding_window_mla", 32, "bounded_replay").expect("ok");
        assert_eq!(k, GroupKind::SlidingWindowMla { window: 32, bounded_replay: true });
        assert_eq!(
            (k.kind_name(), k.sliding_window(), k.prefix_cacheable()),
            ("sliding_window_mla", Some(32), false)
        );
        let plain = GroupKind::parse("sliding_window_mla", 32, "none").expect("ok");
        assert!(plain.prefix_cacheable() && !plain.is_full() && !plain.fine_grained_lookup());
        assert!(GroupKind::parse("sliding_window_mla", 0, "none").is_err());
        assert!(GroupKind::parse("sliding_window_mla", 8, "align").is_err());
        // The replayed group is in no spec set and takes no part in the hash block size.
        let l = GroupLayout::new(vec![GroupSpec::full(16), swa_mla(32, true, 8)], on()).expect("valid");
        assert_eq!((l.hash_block_size(), l.scheduler_block_size()), (16, 16));
        assert_eq!(l.spec_sets().len(), 1);
        assert!(l.prefix_cacheable(0) && !l.prefix_cacheable(1) && !l.prefix_cacheable(2));
        assert!(!l.is_simple_hybrid());
        // A plain sliding-window MLA group is its own spec set beside a plain window.
        let swa = GroupSpec { kind: GroupKind::SlidingWindow { window: 32 }, block_size: 16 };
        let l = GroupLayout::new(vec![GroupSpec::full(16), swa, swa_mla(32, false, 16)], on()).expect("ok");
        assert_eq!(l.spec_sets().len(), 3);
        // Nothing left to look up: refused, cached or not.
        assert!(GroupLayout::new(vec![swa_mla(32, true, 16)], on()).is_err());
        assert!(GroupLayout::new(vec![swa_mla(32, true, 16)], LayoutOptions::default()).is_err());
    }

    #[test]
    fn eagle_flags_apply_per_spec_set() {
        let swa = GroupSpec { kind: GroupKind::SlidingWindow { window: 32 }, block_size: 16 };
        let groups = vec![GroupSpec::full(16), swa, swa, swa_mla(32, true, 16)];
        let eagle = LayoutOptions { use_eagle: true, ..on() };
        // Group 1 flagged: its set (groups 1 and 2) drops, full attention does not.
        let l = GroupLayout::new(groups.clone(), eagle).expect("ok");
        let l = l.with_eagle_groups(&[false, true, false, false]).expect("ok");
        assert_eq!((0..4).map(|g| l.group_eagle(g)).collect::<Vec<_>>(), vec![false, true, true, false]);
        assert!(l.use_eagle() && !l.spec_sets()[0].use_eagle && l.spec_sets()[1].use_eagle);
        // None flagged: every set drops.
        let l =
            GroupLayout::new(groups.clone(), eagle).expect("ok").with_eagle_groups(&[false; 4]).expect("ok");
        assert!(l.spec_sets().iter().all(|s| s.use_eagle) && !l.group_eagle(3) && !l.group_eagle(9));
        // EAGLE off: flags drop nothing.
        let l =
            GroupLayout::new(groups.clone(), on()).expect("ok").with_eagle_groups(&[true; 4]).expect("ok");
        assert!((0..4).all(|g| !l.group_eagle(g)) && !l.use_eagle());
        assert!(GroupLayout::new(groups, eagle).expect("ok").with_eagle_groups(&[true]).is_err());
    }
}
