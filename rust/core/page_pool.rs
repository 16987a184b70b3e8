//! Ref-counted pool of KV pages (a page is `page_size` consecutive slots;
//! with `page_size == 1` a page is one slot), behind the radix request cache.
//!
//! The radix request cache's tables list page ids where the hash chain's
//! list block ids: page `p` holds slots `p * page_size .. (p + 1) *
//! page_size`. Page 0 is the null page: never handed out, so tables can be
//! padded with 0 safely (as the hash chain's null block).
//!
//! # Invariants (checked by [`PagePool::check_invariants`])
//! 1. The null page has ref count 0 and is never free-listed.
//! 2. A page is in the free list iff its ref count is 0; it is listed once.
//! 3. `num_free + #(ref > 0) + 1 == num_pages`.
//!
//! Holders take one reference each (the radix tree for the pages it stores,
//! every running request for every page of its table), so "free" means no
//! holder at all and a page can never be freed twice: a release below zero
//! panics.
//!
//! # Order
//! Pages are handed out from the front of a FIFO and released pages join the
//! back (the oldest released page is reused first). Costs: O(1) per page for
//! every operation; memory 4 bytes per page plus the queue.

use std::collections::VecDeque;

use crate::core::error::{pool_size, try_filled, ErrorKind, InvariantViolation, KvError, KvResult};
use crate::core::ids::PageId;
use crate::ensure_inv;

/// The page pool.
#[derive(Clone, Debug)]
pub struct PagePool {
    ref_cnt: Vec<u32>,
    free: VecDeque<PageId>,
}

impl PagePool {
    /// A pool of `num_pages` pages (page 0 is the null page), all free.
    ///
    /// # Errors
    /// `InvalidArgument` if `num_pages < 2` or too large for `u32` ids;
    /// `Capacity` if its tables cannot be allocated.
    pub fn new(num_pages: usize) -> KvResult<Self> {
        let n = pool_size(num_pages, "page")?;
        let mut free = VecDeque::new();
        free.try_reserve_exact(num_pages).map_err(|_| {
            KvError::new(ErrorKind::Capacity, format!("cannot allocate the free list of {num_pages} pages"))
        })?;
        free.extend((1..n).map(PageId));
        Ok(PagePool { ref_cnt: try_filled(num_pages, 0, "page ref counts")?, free })
    }

    /// Pages, the null page included. O(1).
    #[must_use]
    pub fn num_pages(&self) -> usize {
        self.ref_cnt.len()
    }

    /// Pages with no holder. O(1).
    #[must_use]
    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    /// Holders of page `p`. O(1).
    #[must_use]
    pub fn ref_count(&self, p: PageId) -> u32 {
        self.ref_cnt[p.idx()]
    }

    /// Hands out `n` free pages with one reference each, appending them to
    /// `out`. O(n).
    ///
    /// # Panics
    /// If fewer than `n` pages are free (callers check first).
    pub fn alloc(&mut self, n: usize, out: &mut Vec<PageId>) {
        assert!(n <= self.free.len(), "alloc({n}) with {} free pages", self.free.len());
        for _ in 0..n {
            let p = self.free.pop_front().expect("length checked above");
            debug_assert_eq!(self.ref_cnt[p.idx()], 0);
            self.ref_cnt[p.idx()] = 1;
            out.push(p);
        }
    }

    /// Adds a holder to each page (all must be held already). O(k).
    ///
    /// # Panics
    /// If a page is free or the null page (a holder must already exist).
    pub fn incref(&mut self, pages: &[PageId]) {
        for &p in pages {
            assert!(p != PageId::NULL, "incref of the null page");
            let r = &mut self.ref_cnt[p.idx()];
            assert!(*r > 0, "incref of free page {}", p.0);
            *r += 1;
        }
    }

    /// Drops one holder from each page; pages left without holders join the
    /// free list in the given order. O(k).
    ///
    /// # Panics
    /// If a page has no holder (a double free).
    pub fn decref(&mut self, pages: &[PageId]) {
        for &p in pages {
            let r = &mut self.ref_cnt[p.idx()];
            assert!(*r > 0 && p != PageId::NULL, "double free of page {}", p.0);
            *r -= 1;
            if *r == 0 {
                self.free.push_back(p);
            }
        }
    }

    /// The free list, next page handed out first. O(n).
    pub fn free_pages(&self) -> impl Iterator<Item = PageId> + '_ {
        self.free.iter().copied()
    }

    /// Checks invariants 1-3. O(pages).
    ///
    /// # Errors
    /// The first violation found.
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        ensure_inv!(self.ref_cnt[0] == 0, "null page has ref count {}", self.ref_cnt[0]);
        let mut listed = vec![false; self.ref_cnt.len()];
        for &p in &self.free {
            ensure_inv!(p != PageId::NULL, "null page is free-listed");
            ensure_inv!(!listed[p.idx()], "page {} free-listed twice", p.0);
            listed[p.idx()] = true;
            ensure_inv!(
                self.ref_cnt[p.idx()] == 0,
                "free page {} has ref count {}",
                p.0,
                self.ref_cnt[p.idx()]
            );
        }
        let used = self.ref_cnt.iter().filter(|&&r| r > 0).count();
        ensure_inv!(self.free.len() + used + 1 == self.ref_cnt.len(), "free + used + 1 != num_pages");
        Ok(())
    }
}
