//! The per-worker stream protocol of the cluster index: each worker's KV
//! event batches carry sequence numbers, and this module decides what a
//! batch is in its stream (in order, a duplicate, a gap, a publisher
//! restart) and how far the worker's state can be trusted ([`Status`]).
//! Block membership (which worker holds which block) is
//! [`super::index`]'s; on a restart the index drops the worker's blocks.
//!
//! # Invariants
//! - `next_seq` is the sequence number after the last batch applied (or
//!   given up); `recent[s % RECENT]` holds `(s, digest)` of the last batch
//!   applied at `s`, or `(u64::MAX, 0)`;
//! - a [`Status::Live`] worker applied every batch from 0 (or since a clear).
//!
//! # Costs
//! O(1) per batch; memory: 4 KiB of recent `(seq, digest)` pairs per worker.

/// Sequence numbers remembered per worker to tell a duplicate from a restart.
const RECENT: usize = 256;

/// How far a worker's state can be trusted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Every batch from sequence 0 (or since the last clear) was applied in order.
    Live,
    /// Waiting for its stream to start (new worker) or restart from 0
    /// (after a publisher restart or a gap being repaired).
    Resyncing,
    /// Batches were lost for good (or malformed): answers may be wrong until
    /// the worker clears its cache or its publisher restarts.
    Degraded,
}

impl Status {
    /// Lower-case name.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Status::Live => "live",
            Status::Resyncing => "resyncing",
            Status::Degraded => "degraded",
        }
    }
}

/// Per-worker counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkerStats {
    /// Batches applied.
    pub batches: u64,
    /// Block hashes announced stored (repeats included).
    pub stored: u64,
    /// Block hashes announced removed.
    pub removed: u64,
    /// Removals of blocks the worker did not hold (ignored).
    pub unknown_removals: u64,
    /// `AllBlocksCleared` events.
    pub cleared: u64,
    /// Events of unknown types skipped.
    pub skipped_events: u64,
    /// Batches seen twice (ignored).
    pub duplicates: u64,
    /// Gaps detected (sequence jumped forward).
    pub gaps: u64,
    /// Batches given up as lost.
    pub lost: u64,
    /// Publisher restarts (sequence went back).
    pub restarts: u64,
    /// Undecodable payloads or wrong block sizes.
    pub malformed: u64,
}

/// One worker's stream and bookkeeping.
#[derive(Clone, Debug)]
pub struct Worker {
    /// Engine name (caller's).
    pub name: String,
    /// Data-parallel rank.
    pub dp_rank: i64,
    /// Trust in the state.
    pub status: Status,
    /// Distinct blocks held.
    pub blocks: u64,
    /// Next expected sequence number.
    pub next_seq: u64,
    /// [`ClusterIndex::membership`](super::ClusterIndex::membership) right after this worker was added: tells
    /// a worker from a later one in the same slot.
    pub incarnation: u64,
    /// Counters.
    pub stats: WorkerStats,
    /// Its KV cache groups: the declared layout and the kinds its events named.
    pub groups: super::layout::WorkerGroups,
    /// `(seq, payload digest)` of recent batches, by `seq % RECENT`.
    recent: Vec<(u64, u64)>,
}

/// What [`ClusterIndex::apply`](super::ClusterIndex::apply) did with a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Applied in order.
    Applied,
    /// Already applied (same sequence number and payload): ignored.
    Duplicate,
    /// Sequence jumped forward: not applied. Fetch `expected..seq` through
    /// replay and apply those first, or call [`ClusterIndex::give_up`](super::ClusterIndex::give_up).
    Gap {
        /// The first missing sequence number.
        expected: u64,
    },
    /// The publisher restarted (sequence went back): the worker's state was
    /// dropped and this batch (sequence 0) applied.
    Restarted,
    /// Undecodable, a wrong block size, or another data-parallel rank than
    /// the worker's: counted, the worker degraded, nothing applied.
    Malformed(String),
}

impl Worker {
    /// A new worker's stream: nothing applied, [`Status::Resyncing`] until
    /// its first batch.
    pub(super) fn new(name: &str, dp_rank: i64, incarnation: u64) -> Self {
        Worker {
            name: name.to_owned(),
            dp_rank,
            status: Status::Resyncing,
            blocks: 0,
            next_seq: 0,
            incarnation,
            stats: WorkerStats::default(),
            groups: super::layout::WorkerGroups::default(),
            recent: vec![(u64::MAX, 0); RECENT],
        }
    }

    /// Heap bytes the worker holds (recent pairs, name).
    pub(super) fn heap_bytes(&self) -> usize {
        self.recent.capacity() * 16 + self.name.capacity() + self.groups.heap_bytes()
    }

    /// Places batch `seq` (payload digest `digest`) in the stream: whether
    /// the publisher restarted (the stream state is reset; the caller drops
    /// the worker's blocks), and the outcome when the batch is not to be
    /// applied (a duplicate, or a gap).
    pub(super) fn order(&mut self, seq: u64, digest: u64) -> (bool, Option<Outcome>) {
        let mut restarted = false;
        if seq < self.next_seq {
            #[allow(clippy::cast_possible_truncation)]
            let slot = (seq % RECENT as u64) as usize;
            if self.recent[slot] == (seq, digest) {
                self.stats.duplicates += 1;
                return (false, Some(Outcome::Duplicate));
            }
            self.stats.restarts += 1;
            self.next_seq = 0;
            self.status = Status::Resyncing;
            self.recent.fill((u64::MAX, 0));
            restarted = true;
        }
        if seq > self.next_seq {
            self.stats.gaps += 1;
            if self.status == Status::Live {
                self.status = Status::Resyncing;
            }
            return (restarted, Some(Outcome::Gap { expected: self.next_seq }));
        }
        (restarted, None)
    }

    /// A malformed batch (`seq`, if tracked): counted, the worker degraded,
    /// its stream continues after it.
    pub(super) fn malformed(&mut self, seq: Option<u64>) {
        self.stats.malformed += 1;
        self.status = Status::Degraded;
        if let Some(seq) = seq {
            self.next_seq = seq.saturating_add(1);
        }
    }

    /// Batch `seq` (if tracked; payload digest `digest`) was applied;
    /// `cleared` when it emptied the worker's cache (known exactly again).
    pub(super) fn applied(&mut self, seq: Option<u64>, digest: u64, cleared: bool) {
        if let Some(seq) = seq {
            #[allow(clippy::cast_possible_truncation)]
            let slot = (seq % RECENT as u64) as usize;
            self.recent[slot] = (seq, digest);
            self.next_seq = seq.saturating_add(1);
            if self.status == Status::Resyncing {
                self.status = Status::Live;
            }
        }
        if cleared {
            // An emptied cache is known exactly again.
            self.status = Status::Live;
        }
    }

    /// Gives up on the missing batches before `seq`: degraded, the stream
    /// continues from `seq`.
    pub(super) fn give_up(&mut self, seq: u64) {
        if seq > self.next_seq {
            // Saturates: a sequence number near 2**64 must not overflow the counter.
            self.stats.lost = self.stats.lost.saturating_add(seq - self.next_seq);
            self.status = Status::Degraded;
            self.next_seq = seq;
        }
    }

    /// The worker's state was replaced by a snapshot: its stream continues
    /// at `next_seq` and it is known exactly. The recent-batch ring is
    /// emptied (the snapshot says nothing about the payloads before
    /// `next_seq`); the counters are kept.
    pub(super) fn restored(&mut self, next_seq: u64) {
        self.next_seq = next_seq;
        self.status = Status::Live;
        self.recent.fill((u64::MAX, 0));
    }
}
