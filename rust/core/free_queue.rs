//! Intrusive doubly linked free list over block ids (vLLM's
//! `FreeKVCacheBlockQueue`), threaded through two `u32` arrays.
//!
//! # Invariants
//! - A block is in the queue iff its `prev` link is not [`NONE`]; the list
//!   from the head sentinel to the tail sentinel visits each queued block once
//!   and `next[prev[b]] == b` for every queued block.
//! - `len` equals the number of queued blocks.
//! - The head is the next block handed out (the LRU victim); the tail holds
//!   the most recently freed cached blocks.
//!
//! # Costs
//! Every operation is O(1) (`prepend`/`append` of k blocks: O(k)); no
//! allocation after construction. Memory: 8 bytes per block (both links of a block in one 8-byte record).

use crate::core::error::{try_filled, InvariantViolation, KvResult};
use crate::core::ids::BlockId;

/// Link value meaning "not in the queue".
pub const NONE: u32 = u32::MAX;

/// The free queue. Sentinels are ids `n` (head) and `n + 1` (tail).
#[derive(Clone, Debug)]
pub struct FreeQueue {
    /// `links[b] = [prev, next]`: both links of a block share a cache line.
    links: Vec<[u32; 2]>,
    len: usize,
    head: u32,
    tail: u32,
}

impl FreeQueue {
    /// An empty queue for block ids `0..n`.
    ///
    /// # Errors
    /// `Capacity` if the links cannot be allocated.
    ///
    /// # Panics
    /// If `n` does not leave room for the two sentinel ids in `u32`.
    pub fn new(n: u32) -> KvResult<Self> {
        assert!(n < u32::MAX - 2, "too many blocks");
        let size = n as usize + 2;
        let links = try_filled(size, [NONE; 2], "the free queue")?;
        let mut q = FreeQueue { links, len: 0, head: n, tail: n + 1 };
        q.links[q.head as usize][1] = q.tail;
        q.links[q.tail as usize][0] = q.head;
        Ok(q)
    }

    /// A queue for block ids `0..n` holding `1..n` in id order (block 0, the
    /// null block, is never queued): what `new` and `push_back` of each id
    /// give, with each link written once. O(n).
    ///
    /// # Errors
    /// `Capacity` if the links cannot be allocated.
    ///
    /// # Panics
    /// As [`FreeQueue::new`].
    pub fn new_full(n: u32) -> KvResult<Self> {
        let mut q = FreeQueue::new(n)?;
        let (head, tail) = (q.head, q.tail);
        if n > 1 {
            for b in 1..n {
                let prev = if b == 1 { head } else { b - 1 };
                let next = if b == n - 1 { tail } else { b + 1 };
                q.links[b as usize] = [prev, next];
            }
            q.links[head as usize][1] = 1;
            q.links[tail as usize][0] = n - 1;
            q.len = n as usize - 1;
        }
        Ok(q)
    }

    /// Number of queued blocks. O(1).
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no block is queued. O(1).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `b` is queued. O(1).
    #[must_use]
    pub fn contains(&self, b: BlockId) -> bool {
        self.links[b.idx()][0] != NONE
    }

    /// The head block (next victim), if any. O(1).
    #[must_use]
    pub fn front(&self) -> Option<BlockId> {
        let h = self.links[self.head as usize][1];
        (h != self.tail).then_some(BlockId(h))
    }

    fn link_after(&mut self, at: u32, b: BlockId) {
        debug_assert!(!self.contains(b), "block {} queued twice", b.0);
        let nxt = self.links[at as usize][1];
        self.links[b.idx()][0] = at;
        self.links[b.idx()][1] = nxt;
        self.links[at as usize][1] = b.0;
        self.links[nxt as usize][0] = b.0;
        self.len += 1;
    }

    /// Removes and returns the head block. O(1).
    pub fn pop_front(&mut self) -> Option<BlockId> {
        let b = self.front()?;
        self.remove(b);
        Some(b)
    }

    /// Unlinks `b` wherever it is. O(1).
    ///
    /// # Panics
    /// If `b` is not queued (a broken invariant of the caller).
    pub fn remove(&mut self, b: BlockId) {
        let (p, n) = (self.links[b.idx()][0], self.links[b.idx()][1]);
        assert!(p != NONE, "block {} is not in the free queue", b.0);
        self.links[p as usize][1] = n;
        self.links[n as usize][0] = p;
        self.links[b.idx()][0] = NONE;
        self.links[b.idx()][1] = NONE;
        self.len -= 1;
    }

    /// Appends `b` at the tail. O(1).
    pub fn push_back(&mut self, b: BlockId) {
        let last = self.links[self.tail as usize][0];
        self.link_after(last, b);
    }

    /// Puts `blocks` before the current head, keeping their order (so
    /// `blocks[0]` becomes the head). O(k).
    pub fn prepend(&mut self, blocks: &[BlockId]) {
        let mut at = self.head;
        for &b in blocks {
            self.link_after(at, b);
            at = b.0;
        }
    }

    /// Queued blocks from head to tail. O(len).
    pub fn iter(&self) -> impl Iterator<Item = BlockId> + '_ {
        let mut cur = self.links[self.head as usize][1];
        std::iter::from_fn(move || {
            if cur == self.tail {
                None
            } else {
                let b = cur;
                cur = self.links[cur as usize][1];
                Some(BlockId(b))
            }
        })
    }

    /// Checks the links and the length. O(n).
    ///
    /// # Errors
    /// The first broken invariant found.
    pub fn check(&self) -> Result<(), InvariantViolation> {
        let mut seen = 0usize;
        let mut cur = self.head;
        loop {
            let nxt = self.links[cur as usize][1];
            crate::ensure_inv!(nxt != NONE, "free queue broken after {cur}");
            crate::ensure_inv!(self.links[nxt as usize][0] == cur, "free queue: prev[next[{cur}]] != {cur}");
            if nxt == self.tail {
                break;
            }
            seen += 1;
            crate::ensure_inv!(seen <= self.len, "free queue longer than its length {} (cycle?)", self.len);
            cur = nxt;
        }
        crate::ensure_inv!(seen == self.len, "free queue has {seen} blocks, length says {}", self.len);
        let linked = self.links[..self.head as usize].iter().filter(|l| l[0] != NONE).count();
        crate::ensure_inv!(linked == self.len, "{linked} blocks carry links but {} are queued", self.len);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(q: &FreeQueue) -> Vec<u32> {
        q.iter().map(|b| b.0).collect()
    }

    #[test]
    fn new_full_equals_pushing_every_id() {
        for n in 1..8u32 {
            let mut pushed = FreeQueue::new(n).expect("small queue");
            for i in 1..n {
                pushed.push_back(BlockId(i));
            }
            let full = FreeQueue::new_full(n).expect("small queue");
            assert_eq!(full.links, pushed.links, "n = {n}");
            assert_eq!((full.len(), ids(&full)), (pushed.len(), ids(&pushed)));
        }
    }

    #[test]
    fn operations_keep_order() {
        let mut q = FreeQueue::new(6).expect("small queue");
        for i in 1..6 {
            q.push_back(BlockId(i));
        }
        assert_eq!(ids(&q), [1, 2, 3, 4, 5]);
        q.remove(BlockId(3));
        assert_eq!(q.pop_front(), Some(BlockId(1)));
        q.prepend(&[BlockId(1), BlockId(3)]);
        assert_eq!(ids(&q), [1, 3, 2, 4, 5]);
        q.check().expect("valid");
        while q.pop_front().is_some() {}
        assert!(q.is_empty());
        q.check().expect("valid");
    }
}
