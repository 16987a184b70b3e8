//! What a caching call did, per run (vLLM's `BlockStored` events): the
//! group, the table range, the stored indices, the entry size and the
//! removed keys vLLM reports just before the event.
//!
//! # Invariants
//! - a [`Stored`] holds increasing indices, as a range exactly when they
//!   are contiguous (equal index lists compare equal).
//!
//! Costs: a contiguous run stores two integers; others one index each.

/// One group's caching step (what vLLM's `BlockStored` event describes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedRun {
    /// The group (`group_idx`).
    pub group: usize,
    /// First table index of the run (the cached count before).
    pub start: usize,
    /// End of the run (the cached count after).
    pub end: usize,
    /// Table indices that got a hash, in order (null and unreachable blocks
    /// left out; may be empty, vLLM still emits the event).
    pub stored: Stored,
    /// Tokens per entry: the group's block size, or the hash block size for
    /// a prompt tail's partial entry ([`super::partial`]; `start..end` then
    /// count hash blocks).
    pub block_size: usize,
    /// The range of the removed-key log this run appended (keys a promotion
    /// or a replaced partial hash dropped, which vLLM reports just before
    /// this run's `BlockStored`); empty when the log is off.
    pub removed: (usize, usize),
}

/// Increasing table indices (a [`CachedRun`]'s stored blocks): a range while
/// they are contiguous (most runs; no allocation), else a list. The form is
/// a function of the indices (a contiguous list is always a range), so
/// equal index lists compare equal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stored {
    /// `start..end`, in order.
    Range(usize, usize),
    /// Indices that are not contiguous, in order.
    List(Vec<usize>),
}

impl Default for Stored {
    fn default() -> Self {
        Stored::Range(0, 0)
    }
}

impl Stored {
    /// Appends index `i` (larger than the last).
    pub fn push(&mut self, i: usize) {
        match self {
            Stored::Range(a, b) if *a == *b => *self = Stored::Range(i, i + 1),
            Stored::Range(_, b) if i == *b => *b += 1,
            Stored::Range(a, b) => {
                let mut v: Vec<usize> = (*a..*b).collect();
                v.push(i);
                *self = Stored::List(v);
            }
            Stored::List(v) => v.push(i),
        }
    }

    /// The indices, in order.
    #[must_use]
    pub fn iter(&self) -> StoredIter<'_> {
        match self {
            Stored::Range(a, b) => StoredIter::Range(*a..*b),
            Stored::List(v) => StoredIter::List(v.iter()),
        }
    }

    /// How many indices.
    #[must_use]
    pub fn len(&self) -> usize {
        match self {
            Stored::Range(a, b) => b - a,
            Stored::List(v) => v.len(),
        }
    }

    /// Whether there is none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The indices as a list.
    #[must_use]
    pub fn to_vec(&self) -> Vec<usize> {
        self.iter().collect()
    }
}

/// The indices of a [`Stored`], in order.
#[derive(Clone, Debug)]
pub enum StoredIter<'a> {
    /// Of a range.
    Range(std::ops::Range<usize>),
    /// Of a list.
    List(std::slice::Iter<'a, usize>),
}

impl Iterator for StoredIter<'_> {
    type Item = usize;
    fn next(&mut self) -> Option<usize> {
        match self {
            StoredIter::Range(r) => r.next(),
            StoredIter::List(l) => l.next().copied(),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match self {
            StoredIter::Range(r) => r.size_hint(),
            StoredIter::List(l) => l.size_hint(),
        }
    }
}

impl ExactSizeIterator for StoredIter<'_> {}
