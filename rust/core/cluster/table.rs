//! The block table: block hash -> holder value, a hashbrown `HashTable` of
//! 12-byte entries, and prefetching its lines ahead of a batch's updates.
//!
//! An entry is the hash as two `u32` halves plus the `u32` value (12 bytes,
//! 4-byte alignment), found through hashbrown's control bytes (one per
//! bucket). Looking a hash up reads two lines that are random in memory:
//! the control group at `h1 & mask` and the entry's bucket. Once the table
//! outgrows the caches each is a cache miss and (with 4 KiB pages) a TLB
//! miss, ~100 ns per update when they are taken one after the other.
//!
//! [`Ahead`] hides them in a batch: it issues prefetches for the hash `D`
//! updates ahead of the one being applied, so up to `D` updates' lines are
//! in flight at once (memory-level parallelism) while updates still apply
//! strictly in order. The control group is at a known address; the entry is
//! not known before the group is read, but it is the first free bucket at or
//! after `h1 & mask` when inserted, so the lines of the first three buckets
//! from there hold it in most cases (a miss only costs the wait that would
//! have happened anyway). The addresses come from hashbrown's layout
//! (buckets below the control bytes, in reverse order; a test checks it).
//! A prefetch is a hint: a wrong address (another layout, a table
//! reallocated under it) costs time, never correctness.
//!
//! Prefetching is used at every table size: it also beat probing a chunk
//! ahead with loads on tables that fit the caches (10^4 to 10^5 entries,
//! 5-10% faster per event on this project's Zen 4 machine).
//!
//! Costs: lookup/insert/remove O(1) expected (hashbrown); [`Ahead::fetch`]
//! O(1), no loads. Memory: 13 bytes per bucket (entry + control byte), the
//! table between 7/16 and 7/8 full.
//!
//! Invariant: a prefetch never changes what a lookup finds (a hint only).

use std::hash::BuildHasher;

use hashbrown::hash_table::{Entry, HashTable, OccupiedEntry};
use rustc_hash::FxBuildHasher;

use super::huge::{self, TableAlloc};

/// A block hash as two `u32` halves: an entry (key, value) is then 12 bytes
/// with 4-byte alignment instead of 16.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Key([u32; 2]);

impl Key {
    /// The key of block hash `h`.
    #[inline]
    #[must_use]
    #[allow(clippy::cast_possible_truncation)]
    pub fn of(h: u64) -> Self {
        Key([h as u32, (h >> 32) as u32])
    }

    /// The block hash.
    #[inline]
    #[must_use]
    pub fn get(self) -> u64 {
        u64::from(self.0[0]) | u64::from(self.0[1]) << 32
    }
}

/// One table entry: block hash and holder value.
pub type Slot = (Key, u32);

/// The table's hash of a block hash (block hashes from streams need not be
/// spread: tests and some publishers send small integers).
#[inline]
fn fx(h: u64) -> u64 {
    FxBuildHasher.hash_one(h)
}

/// A table with no free bucket left is rebuilt in place (not doubled)
/// while fewer than `.0 / .1` of its buckets hold entries: doubling it then
/// would leave it under 13/32 full, over 32 bytes per entry.
const REBUILD_BELOW: (usize, usize) = (13, 16);

/// Block hash -> `u32`, see the module header.
#[derive(Debug, Default)]
pub struct BlockTable {
    map: HashTable<Slot, TableAlloc>,
    /// The prefetcher of the current allocation, once made. The allocation
    /// changes only when the table grows (removals and `retain` keep it), so
    /// a bucket count other than the cached one means it is stale.
    ahead: Option<Ahead>,
}

impl Clone for BlockTable {
    fn clone(&self) -> Self {
        // A clone has its own allocation: its prefetcher is made anew.
        BlockTable { map: self.map.clone(), ahead: None }
    }
}

impl BlockTable {
    /// Entries.
    #[must_use]
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the table is empty.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Buckets allocated (a power of two, or 0).
    #[must_use]
    pub fn buckets(&self) -> usize {
        self.map.num_buckets()
    }

    /// Bytes of the allocation (entries, control bytes, padding, rounding
    /// to huge pages).
    #[must_use]
    pub fn memory_bytes(&self) -> usize {
        huge::held(self.map.allocation_size())
    }

    /// The value of `h`.
    #[inline]
    #[must_use]
    pub fn get(&self, h: u64) -> Option<u32> {
        let k = Key::of(h);
        self.map.find(fx(h), |e| e.0 == k).map(|e| e.1)
    }

    /// The entry of `h`, for inserting or updating.
    #[inline]
    pub fn entry(&mut self, h: u64) -> Entry<'_, Slot, TableAlloc> {
        if self.map.len() == self.map.capacity() {
            self.make_room();
        }
        let k = Key::of(h);
        self.map.entry(fx(h), |e| e.0 == k, |e| fx(e.0.get()))
    }

    /// Called when no free bucket is left (hashbrown would grow the table
    /// on the next `entry`): a table less than [`REBUILD_BELOW`] full, whose
    /// free buckets went to removal tombstones, is rebuilt at its size (or
    /// smaller) instead of doubled. A churning table then stays at least
    /// 13/32 full after any growth, within 32 bytes per entry. O(entries),
    /// once per as many inserts as the rebuild frees buckets for.
    #[cold]
    #[inline(never)]
    fn make_room(&mut self) {
        let (len, buckets) = (self.map.len(), self.map.num_buckets());
        if buckets == 0 || len * REBUILD_BELOW.1 >= buckets * REBUILD_BELOW.0 {
            return; // full enough: hashbrown doubles it
        }
        let mut fresh = HashTable::with_capacity_in(len + 1, TableAlloc);
        for e in self.map.drain() {
            fresh.insert_unique(fx(e.0.get()), e, |x| fx(x.0.get()));
        }
        self.map = fresh;
        self.ahead = None;
    }

    /// The entry of `h` if present, for updating or removing.
    #[inline]
    pub fn find(&mut self, h: u64) -> Option<OccupiedEntry<'_, Slot, TableAlloc>> {
        let k = Key::of(h);
        self.map.find_entry(fx(h), |e| e.0 == k).ok()
    }

    /// Keeps the entries for which `f(hash, &mut value)` is true.
    pub fn retain(&mut self, mut f: impl FnMut(u64, &mut u32) -> bool) {
        self.map.retain(|e| f(e.0.get(), &mut e.1));
    }

    /// Every (hash, value), unordered.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.map.iter().map(|e| (e.0.get(), e.1))
    }

    /// A prefetcher for this table's current allocation; None when empty.
    /// O(1) but after the table grew (it then finds a full bucket: a scan
    /// of a table that is at least 7/16 full).
    pub fn ahead(&mut self) -> Option<Ahead> {
        if let Some(a) = self.ahead.filter(|a| a.buckets() == self.map.num_buckets()) {
            return Some(a);
        }
        let i = self.map.iter_buckets().next()?;
        let at = std::ptr::from_ref(self.map.get_bucket(i)?) as usize;
        // Buckets sit below the control bytes in reverse order: bucket `i`
        // starts `(i + 1)` entries below the first control byte.
        let ctrl = at.wrapping_add((i + 1) * std::mem::size_of::<Slot>());
        self.ahead = Some(Ahead { ctrl, mask: self.map.num_buckets() - 1 });
        self.ahead
    }
}

/// Where a block hash's table lines are, for one allocation of the table
/// (see the module header).
#[derive(Clone, Copy, Debug)]
pub struct Ahead {
    /// Address of the first control byte (the end of bucket 0).
    ctrl: usize,
    /// Buckets - 1.
    mask: usize,
}

impl Ahead {
    /// Buckets of the allocation this was made for.
    #[must_use]
    pub fn buckets(&self) -> usize {
        self.mask + 1
    }

    /// Starts loading the lines a lookup of `h` reads: its control group
    /// and its first buckets.
    #[inline]
    pub fn fetch(&self, h: u64) {
        #[allow(clippy::cast_possible_truncation)]
        let pos = fx(h) as usize & self.mask;
        let size = std::mem::size_of::<Slot>();
        // The control group read at `pos` and the one before it (a removal
        // checks it): 32 bytes, at most two lines, fetched by their ends.
        prefetch(self.ctrl.wrapping_add(pos).wrapping_sub(16));
        prefetch(self.ctrl.wrapping_add(pos + 15));
        // Buckets `pos..pos + 3` (downwards in memory), likewise.
        prefetch(self.ctrl.wrapping_sub((pos + 3) * size));
        prefetch(self.ctrl.wrapping_sub(pos * size + 1));
    }
}

/// Asks the CPU to start loading the cache line holding `addr` (a hint:
/// any address is allowed, nothing is read into the program).
#[inline(always)]
#[allow(unsafe_code)]
fn prefetch(addr: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 never faults and has no architectural effect, whatever
    // the address (unmapped, freed or misaligned); the pointer is never read.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(addr as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}

#[cfg(test)]
mod tests {
    use super::BlockTable;
    use hashbrown::hash_table::Entry;

    #[test]
    fn ahead_points_at_the_buckets_of_the_allocation() {
        let mut t = BlockTable::default();
        assert!(t.ahead().is_none());
        for h in 0..1000u64 {
            if let Entry::Vacant(v) = t.entry(h.wrapping_mul(0x9E37_79B9_7F4A_7C15)) {
                v.insert((super::Key::of(h.wrapping_mul(0x9E37_79B9_7F4A_7C15)), 1));
            }
        }
        let a = t.ahead().expect("non-empty");
        assert_eq!(a.buckets(), t.buckets());
        // Every full bucket lies where the prefetcher assumes it does.
        let size = std::mem::size_of::<super::Slot>();
        for i in t.map.iter_buckets() {
            let at = std::ptr::from_ref(t.map.get_bucket(i).expect("full")) as usize;
            assert_eq!(at + (i + 1) * size, a.ctrl);
        }
    }

    /// Churn (random hashes removed and stored) at a size three quarters of
    /// its buckets: tombstones use up the free buckets, and the table is
    /// rebuilt at its size rather than doubled: within 32 bytes per entry,
    /// every entry kept.
    #[test]
    fn churn_does_not_double_the_table() {
        let mut x = 0x1234_5678_9abc_def0u64;
        let mut next = move || {
            // splitmix64
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        let insert = |t: &mut BlockTable, h: u64| match t.entry(h) {
            Entry::Vacant(v) => {
                v.insert((super::Key::of(h), 1));
            }
            Entry::Occupied(_) => panic!("hash present twice"),
        };
        let mut t = BlockTable::default();
        let mut live: Vec<u64> = (0..25_000).map(|_| next()).collect();
        for &h in &live {
            insert(&mut t, h);
        }
        let buckets = t.buckets();
        for i in 0..200_000 {
            let j = (next() % live.len() as u64) as usize;
            t.find(live[j]).expect("present").remove();
            live[j] = next();
            insert(&mut t, live[j]);
            if i % 1000 == 0 {
                assert!(t.memory_bytes() <= 32 * t.len(), "{} B for {}", t.memory_bytes(), t.len());
            }
        }
        assert_eq!(t.buckets(), buckets);
        assert_eq!(t.len(), live.len());
        for &h in &live {
            assert_eq!(t.get(h), Some(1));
        }
    }

    /// A table past the huge-page size: grows through it, answers every
    /// hash, removes and re-adds with prefetches into its allocation.
    #[test]
    fn a_huge_table_keeps_every_entry() {
        const N: u64 = 600_000; // > 7/8 of 2^19 buckets: 2^20 buckets, 13 MiB
        let key = |h: u64| h.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut t = BlockTable::default();
        for h in 0..N {
            if let Some(a) = t.ahead() {
                a.fetch(key(h + 8));
            }
            match t.entry(key(h)) {
                Entry::Vacant(v) => {
                    v.insert((super::Key::of(key(h)), u32::try_from(h % 7).expect("small")));
                }
                Entry::Occupied(_) => panic!("hash {h} present twice"),
            }
        }
        assert_eq!(t.len(), 600_000);
        assert!(t.buckets() * 13 >= super::huge::MIN_HUGE);
        assert_eq!(t.memory_bytes() % (2 << 20), 0);
        for h in (0..N).step_by(2) {
            let o = t.find(key(h)).expect("present");
            o.remove();
        }
        for h in 0..N {
            let want = (h % 2 == 1).then(|| u32::try_from(h % 7).expect("small"));
            assert_eq!(t.get(key(h)), want);
        }
        let c = t.clone();
        assert_eq!(c.len(), t.len());
        assert_eq!(
            c.iter().map(|(h, v)| h ^ u64::from(v)).fold(0, |a, x| a ^ x),
            t.iter().map(|(h, v)| h ^ u64::from(v)).fold(0, |a, x| a ^ x)
        );
    }
}
