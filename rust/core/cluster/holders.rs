//! Holder sets: which workers hold one block.
//!
//! A block held by one worker stores that worker's id inline in the block
//! map's value (no allocation). Two or more holders move to a slab entry: a
//! sorted `Vec<u32>` of worker ids while it has at most [`LIST_MAX`] entries,
//! a bitset over worker ids above that (back to a list below
//! `LIST_MAX / 2`, so a set oscillating around the bound does not convert on
//! every event). Costs: insert/remove O(list length) or O(1) on a bitset;
//! intersecting with a query's active set O(list length) or O(words).
//!
//! Invariants (checked through `ClusterIndex::check_invariants`): a list is
//! sorted and distinct; a set holds at least two workers; a bitset's count
//! equals its bits.

/// Most holders kept as a sorted list (a 1,024-worker bitset is 128 bytes,
/// the size of a list of 32 ids). A list also becomes a bitset as soon as
/// it is larger than the bitset would be (more than twice as many ids as
/// the bitset has words), so small clusters walk one word per block.
pub const LIST_MAX: usize = 32;

/// Lists this short never become bitsets.
const LIST_MIN: usize = 4;

fn words_for(max_id: u32) -> usize {
    (max_id / 64) as usize + 1
}

/// High bit of a block-map value: the rest is a slab index, not a worker id.
pub const SET_TAG: u32 = 1 << 31;

/// The holders of a block with two or more.
#[derive(Clone, Debug)]
pub enum Set {
    /// Sorted, distinct worker ids.
    List(Vec<u32>),
    /// One bit per worker id, and the number of bits set.
    Bits(Vec<u64>, u32),
    /// A free slab slot.
    Free,
}

impl Set {
    /// Number of holders.
    #[must_use]
    pub fn len(&self) -> usize {
        match self {
            Set::List(v) => v.len(),
            Set::Bits(_, n) => *n as usize,
            Set::Free => 0,
        }
    }

    /// Whether the set is empty (or free).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `w` is in the set.
    #[must_use]
    pub fn contains(&self, w: u32) -> bool {
        match self {
            Set::List(v) => v.binary_search(&w).is_ok(),
            Set::Bits(b, _) => b.get((w / 64) as usize).is_some_and(|x| x >> (w % 64) & 1 == 1),
            Set::Free => false,
        }
    }

    /// Adds `w`; `false` if it was there.
    pub fn insert(&mut self, w: u32) -> bool {
        match self {
            Set::List(v) => match v.binary_search(&w) {
                Ok(_) => false,
                Err(i) => {
                    v.insert(i, w);
                    let words = words_for(*v.last().unwrap_or(&0));
                    if v.len() > LIST_MAX || (v.len() > LIST_MIN && v.len() > 2 * words) {
                        *self = Set::Bits(to_bits(v), u32::try_from(v.len()).unwrap_or(u32::MAX));
                    }
                    true
                }
            },
            Set::Bits(b, n) => {
                let i = (w / 64) as usize;
                if b.len() <= i {
                    b.resize(i + 1, 0);
                }
                let m = 1u64 << (w % 64);
                if b[i] & m != 0 {
                    return false;
                }
                b[i] |= m;
                *n += 1;
                true
            }
            Set::Free => {
                *self = Set::List(vec![w]);
                true
            }
        }
    }

    /// Removes `w`; `false` if it was not there.
    pub fn remove(&mut self, w: u32) -> bool {
        match self {
            Set::List(v) => match v.binary_search(&w) {
                Ok(i) => {
                    v.remove(i);
                    true
                }
                Err(_) => false,
            },
            Set::Bits(b, n) => {
                let i = (w / 64) as usize;
                let m = 1u64 << (w % 64);
                if b.get(i).is_none_or(|x| x & m == 0) {
                    return false;
                }
                b[i] &= !m;
                *n -= 1;
                let n = *n as usize;
                if n <= LIST_MIN / 2 || (n < LIST_MAX / 2 && 2 * n < b.len()) {
                    *self = Set::List(self.ids());
                }
                true
            }
            Set::Free => false,
        }
    }

    /// The holders in increasing order.
    #[must_use]
    pub fn ids(&self) -> Vec<u32> {
        match self {
            Set::List(v) => v.clone(),
            Set::Bits(b, _) => bit_ids(b).collect(),
            Set::Free => Vec::new(),
        }
    }

    /// `active[w] &= self[w]` for every word of `active`.
    pub fn intersect_into(&self, active: &[u64], next: &mut [u64]) {
        match self {
            Set::List(v) => {
                for &w in v {
                    let i = (w / 64) as usize;
                    let m = 1u64 << (w % 64);
                    if let (Some(a), Some(n)) = (active.get(i), next.get_mut(i)) {
                        *n |= a & m;
                    }
                }
            }
            Set::Bits(b, _) => {
                for ((n, a), x) in next.iter_mut().zip(active).zip(b) {
                    *n = a & x;
                }
            }
            Set::Free => {}
        }
    }

    /// Heap bytes owned by the set.
    #[must_use]
    pub fn heap_bytes(&self) -> usize {
        match self {
            Set::List(v) => v.capacity() * 4,
            Set::Bits(b, _) => b.capacity() * 8,
            Set::Free => 0,
        }
    }
}

fn to_bits(ids: &[u32]) -> Vec<u64> {
    let top = ids.iter().copied().max().unwrap_or(0);
    let mut b = vec![0u64; (top / 64) as usize + 1];
    for &w in ids {
        b[(w / 64) as usize] |= 1u64 << (w % 64);
    }
    b
}

/// The set bits of `words`, as worker ids in increasing order.
pub fn bit_ids(words: &[u64]) -> impl Iterator<Item = u32> + '_ {
    words.iter().enumerate().flat_map(|(i, &x)| {
        let mut x = x;
        std::iter::from_fn(move || {
            if x == 0 {
                return None;
            }
            let t = x.trailing_zeros();
            x &= x - 1;
            #[allow(clippy::cast_possible_truncation)]
            Some(i as u32 * 64 + t)
        })
    })
}
