//! A worker's state as a snapshot: its block references and the sequence
//! number its stream resumes from, exported and restored.
//!
//! A snapshot lists every block a worker holds once per announcement (a
//! block stored twice and not yet removed appears twice), so restoring it
//! gives the same reference counts as applying the stream that built it.
//! Used to bootstrap a worker from its publisher's snapshot (the publisher
//! keeps its stream's state in a one-worker index) and to warm a router
//! replica from a peer's index.
//!
//! Costs: export O(blocks in the index); restore O(blocks in the index) to
//! drop the old state + O(1) expected per hash.

use super::index::{ClusterIndex, WorkerId};
use crate::core::error::KvResult;

impl ClusterIndex {
    /// Every block `w` holds, once per announcement, sorted; and its next
    /// expected sequence number.
    ///
    /// # Errors
    /// `InvalidArgument` for an empty slot.
    pub fn snapshot_worker(&self, w: WorkerId) -> KvResult<(Vec<u64>, u64)> {
        self.require(w)?;
        let mut out = Vec::new();
        for h in self.worker_blocks(w) {
            for _ in 0..self.refs(h, w) {
                out.push(h);
            }
        }
        out.sort_unstable();
        let next = self.worker(w).map_or(0, |x| x.next_seq);
        Ok((out, next))
    }

    /// Replaces `w`'s state by a snapshot: its blocks become `hashes` (a
    /// repeated hash is one more reference), its stream continues at
    /// `next_seq`, and it is live (known exactly). Its counters are kept;
    /// the recent-batch ring is emptied (the snapshot says nothing about the
    /// payloads before `next_seq`, so callers drop batches below it).
    ///
    /// # Errors
    /// `InvalidArgument` for an empty slot (nothing changed).
    pub fn restore_worker(&mut self, w: WorkerId, hashes: &[u64], next_seq: u64) -> KvResult<()> {
        self.require(w)?;
        self.clear_worker(w);
        self.store_hashes(w, hashes)?;
        self.wk(w).restored(next_seq);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::core::cluster::{ClusterIndex, Outcome, Status, WorkerId};
    use crate::core::wire::batch::{encode_batch, Tagging};
    use crate::core::wire::event::{Removed, Stored, WireEvent};

    fn stored(h: &[u64]) -> WireEvent {
        WireEvent::Stored(Box::new(Stored {
            block_hashes: h.to_vec(),
            token_ids: vec![1; h.len() * 2],
            block_size: 2,
            ..Stored::default()
        }))
    }

    fn payload(events: &[WireEvent]) -> Vec<u8> {
        let mut p = Vec::new();
        encode_batch(&mut p, 1.0, events, None, Tagging::Map);
        p
    }

    #[test]
    fn snapshot_then_restore_gives_the_same_worker() {
        let mut a = ClusterIndex::new(2).expect("valid");
        let w = a.add_worker("a", 0).expect("room");
        let rm = WireEvent::Removed(Removed { block_hashes: vec![5], ..Removed::default() });
        for (seq, ev) in
            [vec![stored(&[5, 6, 7])], vec![stored(&[5])], vec![rm.clone(), rm]].iter().enumerate()
        {
            assert_eq!(a.apply(w, Some(seq as u64), &payload(ev)).expect("present"), Outcome::Applied);
        }
        let (snap, next) = a.snapshot_worker(w).expect("present");
        assert_eq!((snap.clone(), next), (vec![6, 7], 3));

        let mut b = ClusterIndex::new(2).expect("valid");
        let v = b.add_worker("b", 0).expect("room");
        b.store_hashes(v, &[1, 2, 6]).expect("present");
        b.restore_worker(v, &[6, 7, 7], next).expect("present");
        assert_eq!(b.worker(v).expect("present").status, Status::Live);
        assert_eq!(b.snapshot_worker(v).expect("present"), (vec![6, 7, 7], 3));
        b.check_invariants().expect("present");
        // The stream continues at the snapshot's sequence number.
        assert_eq!(b.apply(v, Some(3), &payload(&[stored(&[8])])).expect("present"), Outcome::Applied);
        assert_eq!(
            b.apply(v, Some(5), &payload(&[stored(&[9])])).expect("present"),
            Outcome::Gap { expected: 4 }
        );
        assert!(b.snapshot_worker(WorkerId(7)).is_err());
        assert!(b.restore_worker(WorkerId(7), &[1], 0).is_err());
    }
}
