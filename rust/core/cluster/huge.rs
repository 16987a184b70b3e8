//! The block table's allocator: huge pages for large tables.
//!
//! A large block table is probed at random: with 4 KiB pages nearly every
//! probe also misses the TLB (a ~220 MB table spans 55,000 pages), and in a
//! virtual machine each TLB miss is a two-level page walk. Allocations of
//! [`MIN_HUGE`] bytes or more are therefore rounded up to whole 2 MiB pages,
//! aligned to 2 MiB and advised `MADV_HUGEPAGE` before anything touches them,
//! so that the kernel backs them with transparent huge pages where it allows
//! them (`/sys/kernel/mm/transparent_hugepage/enabled` set to `madvise` or
//! `always`); where it does not, the advice is ignored and nothing changes.
//! Smaller allocations go to the global allocator as they are.
//!
//! Costs: at most 2 MiB - 1 bytes of rounding per large allocation (< 1% of
//! it); one `madvise` call per allocation.
//!
//! This module's `unsafe`: the allocator trait (its contract: a block is
//! returned to the global allocator with the layout it was taken with) and
//! the `madvise` call, each with its reason.
//!
//! Invariant: a block goes back to the global allocator with the layout it
//! was taken with (the rounded layout, recomputed from the caller's).
#![allow(unsafe_code)]

use std::ptr::NonNull;

use allocator_api2::alloc::{AllocError, Allocator, Global, Layout};

/// A huge page.
const HUGE: usize = 2 << 20;

/// Allocations from this size on are made of huge pages.
pub const MIN_HUGE: usize = 8 << 20;

/// The layout an allocation of `layout` is really made with: whole, aligned
/// huge pages from [`MIN_HUGE`] on, else `layout` itself.
fn real(layout: Layout) -> Layout {
    if layout.size() < MIN_HUGE {
        return layout;
    }
    layout
        .size()
        .checked_add(HUGE - 1)
        .and_then(|s| Layout::from_size_align(s & !(HUGE - 1), layout.align().max(HUGE)).ok())
        .unwrap_or(layout)
}

/// Bytes really held for an allocation of `size` bytes (alignment below 2 MiB).
#[must_use]
pub fn held(size: usize) -> usize {
    Layout::from_size_align(size, 1).map_or(size, |l| real(l).size())
}

/// The block table's allocator (see the module header).
#[derive(Clone, Copy, Debug, Default)]
pub struct TableAlloc;

// SAFETY: every block comes from `Global` and goes back to it with the layout
// it was allocated with: `real` is a pure function of the caller's layout,
// which the `Allocator` contract makes the caller pass back unchanged. The
// block returned is at least `layout.size()` bytes and aligned to at least
// `layout.align()`.
unsafe impl Allocator for TableAlloc {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        let big = real(layout);
        let block = Global.allocate(big)?;
        if big.size() != layout.size() {
            advise_huge(block.cast::<u8>(), big.size());
        }
        Ok(block)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        // SAFETY: `ptr` was allocated by `Global` with `real(layout)` (above).
        unsafe { Global.deallocate(ptr, real(layout)) }
    }
}

/// Advises the kernel to back `len` bytes at `at` (2 MiB-aligned, owned by
/// the caller, not yet touched) with huge pages; a refusal is ignored.
fn advise_huge(at: NonNull<u8>, len: usize) {
    #[cfg(target_os = "linux")]
    // SAFETY: `madvise(MADV_HUGEPAGE)` changes only how the kernel backs this
    // range (memory we own, page-aligned); it never unmaps it or changes its
    // contents. Its result is deliberately ignored: without huge pages the
    // memory works the same, only slower.
    unsafe {
        libc::madvise(at.as_ptr().cast(), len, libc::MADV_HUGEPAGE);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (at, len);
}

#[cfg(test)]
mod tests {
    use super::{held, real, Layout, HUGE, MIN_HUGE};

    #[test]
    fn large_layouts_are_whole_aligned_huge_pages() {
        let small = Layout::from_size_align(1000, 16).expect("layout");
        assert_eq!(real(small), small);
        let big = Layout::from_size_align(MIN_HUGE + 1, 16).expect("layout");
        assert_eq!(real(big).size(), MIN_HUGE + HUGE);
        assert_eq!(real(big).align(), HUGE);
        assert_eq!(held(MIN_HUGE), MIN_HUGE);
        assert_eq!(held(100), 100);
    }
}
