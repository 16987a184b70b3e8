//! Per-token KV slots <-> page ids.
//!
//! The radix tree stores one value per page; callers pass and receive one
//! slot per token. With `page_size > 1` a page's slots must be the aligned
//! run `page * page_size + 0, 1, ...` (the partial tail too), so pages and
//! slots convert both ways without a table. Both directions are single
//! passes, written with SSE2 (baseline on x86-64) for the usual power-of-two
//! page sizes: the compiler's own vectorisation of these loops mixes scalar
//! and misaligned stores (expansion) and gathers across pages (checks).
//! [`scalar`] holds the plain reference both are tested against (property
//! tests here, the `pages` fuzz target).
//!
//! # Contract
//! - [`slots_to_pages`] accepts exactly the slot lists the reference
//!   accepts, returns the same pages and tail page, and on error leaves its
//!   output as it was;
//! - [`pages_to_slots`] writes exactly `pages.len() * page_size` slots, the
//!   reference's.
//!
//! # Costs
//! O(slots) either way, one pass; no allocation beyond the output.
//!
//! This module's `unsafe` (every use in the core is listed in
//! [`crate::core`]'s header): SSE2 intrinsics (unaligned loads and stores
//! through pointers into the slices at hand); each block says why it is in
//! bounds.
#![allow(unsafe_code)]

use std::mem::MaybeUninit;

use crate::core::error::{KvError, KvResult};
use crate::core::ids::PageId;

#[cold]
fn negative(slots: &[i32]) -> KvError {
    let x = slots.iter().find(|&&x| x < 0).copied().unwrap_or_default();
    KvError::invalid(format!("slots must be non-negative, got {x}"))
}

#[cold]
fn misaligned(slots: &[i32], ps: usize) -> KvError {
    let j = slots.chunks(ps).position(|run| !is_run(run, ps)).unwrap_or(0);
    KvError::invalid(format!(
        "with page_size {ps} the slots of each page must be a page-aligned run \
         (first slot % page_size == 0, then consecutive); page {j} starts at slot {}",
        slots[j * ps]
    ))
}

#[allow(clippy::cast_sign_loss)]
fn is_run(run: &[i32], ps: usize) -> bool {
    let base = run[0];
    (base as usize).is_multiple_of(ps) && run.iter().zip(0i32..).all(|(&x, k)| x == base.wrapping_add(k))
}

/// Caller slots -> pages of the full pages, appended to `out`, and the page
/// of the partial tail. Slots must be non-negative; with `page_size > 1` each
/// page's slots (the tail's too) must be a page-aligned run. On error `out` is
/// as it was. O(slots), one branch-free pass in the common case (unrolled for
/// the usual power-of-two page sizes).
///
/// # Errors
/// `InvalidArgument` naming the first negative slot, or the first page
/// whose slots are not a page-aligned run.
#[inline] // one caller per binding method: inlined there, as when it lived in the binding
#[allow(clippy::cast_sign_loss, clippy::cast_possible_truncation)]
pub fn slots_to_pages(slots: &[i32], pm: PageMath, out: &mut Vec<PageId>) -> KvResult<Option<PageId>> {
    let ps = pm.ps;
    let start = out.len();
    if ps == 1 {
        let mut sign = 0i32;
        out.extend(slots.iter().map(|&s| {
            sign |= s;
            PageId(s as u32)
        }));
        if sign < 0 {
            out.truncate(start);
            return Err(negative(slots));
        }
        return Ok(None);
    }
    let (body, tail) = slots.split_at(slots.len() / ps * ps);
    let mut bad = match ps {
        4 => runs_fixed::<4>(body, out),
        8 => runs_fixed::<8>(body, out),
        16 => runs_fixed::<16>(body, out),
        32 => runs_fixed::<32>(body, out),
        64 => runs_fixed::<64>(body, out),
        _ => {
            let mut bad = 0;
            out.extend(body.chunks_exact(ps).map(|run| {
                bad |= run_error(run, pm);
                PageId(pm.div(run[0] as usize) as u32)
            }));
            bad
        }
    };
    let tail_page = tail.first().map(|&base| {
        bad |= run_error(tail, pm);
        PageId(pm.div(base as usize) as u32)
    });
    if bad != 0 {
        out.truncate(start);
        return Err(if slots.iter().any(|&x| x < 0) { negative(slots) } else { misaligned(slots, ps) });
    }
    Ok(tail_page)
}

/// Non-zero unless `run` (at most a page) is `base, base + 1, ...` with
/// every slot non-negative and `base` page-aligned. With a page size that
/// is not a power of two an aligned run can pass `i32::MAX` and wrap: the
/// last slot's sign catches that.
#[allow(clippy::cast_sign_loss)]
fn run_error(run: &[i32], pm: PageMath) -> i32 {
    let base = run[0];
    let last = run[run.len() - 1];
    let gaps = run.iter().zip(0i32..).fold(0i32, |acc, (&x, k)| acc | (x ^ base.wrapping_add(k)));
    gaps | ((base | last) & i32::MIN) | i32::from(pm.rem(base as usize) != 0)
}

/// [`slots_to_pages`] for a page size known at compile time (a power of two
/// from 4 up): appends one page per `N` slots (one reservation, no per-page
/// capacity check) and returns non-zero if some page is not a non-negative
/// aligned run. A run whose base is non-negative and aligned cannot
/// overflow, so checking the base's sign covers every slot of the page.
/// SSE2 (baseline on x86-64): per four slots one load, add, xor and or; the
/// compiler's own vectorisation gathers across pages and spills.
#[inline(never)]
#[allow(clippy::cast_sign_loss, clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
fn runs_fixed<const N: usize>(slots: &[i32], out: &mut Vec<PageId>) -> i32 {
    const { assert!(N.is_power_of_two() && N >= 4) };
    let mut head = 0i32;
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{
            __m128i, _mm_add_epi32, _mm_cmpeq_epi32, _mm_loadu_si128, _mm_movemask_epi8, _mm_or_si128,
            _mm_set1_epi32, _mm_setzero_si128, _mm_xor_si128,
        };
        // SAFETY (all blocks below): SSE2 is part of the x86-64 baseline;
        // each load reads four i32 of one `N`-slot chunk of `slots` (inside
        // the slice); unaligned loads need no alignment.
        let steps = iota_quads::<N>();
        let mut acc = unsafe { _mm_setzero_si128() };
        out.extend(slots.chunks_exact(N).map(|run| {
            let base = run[0];
            head |= (base & (N as i32 - 1)) | (base & i32::MIN);
            unsafe {
                let b = _mm_set1_epi32(base);
                let p = run.as_ptr().cast::<__m128i>();
                for (q, &step) in steps[..N / 4].iter().enumerate() {
                    let want = _mm_add_epi32(b, step);
                    acc = _mm_or_si128(acc, _mm_xor_si128(_mm_loadu_si128(p.add(q)), want));
                }
            }
            PageId((base as u32) >> N.trailing_zeros())
        }));
        let clean = unsafe { _mm_movemask_epi8(_mm_cmpeq_epi32(acc, _mm_setzero_si128())) } == 0xFFFF;
        head | i32::from(!clean)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let mut gaps = 0i32;
        out.extend(slots.chunks_exact(N).map(|run| {
            let base = run[0];
            head |= (base & (N as i32 - 1)) | (base & i32::MIN);
            for (k, &x) in run.iter().enumerate() {
                gaps |= x ^ base.wrapping_add(k as i32);
            }
            PageId((base as u32) >> N.trailing_zeros())
        }));
        head | gaps
    }
}

/// Division by the page size, by shifting when it is a power of two.
#[derive(Clone, Copy, Debug)]
pub struct PageMath {
    ps: usize,
    shift: Option<u32>,
}

impl PageMath {
    /// Division by `ps` (at least 1).
    #[must_use]
    pub fn new(ps: usize) -> Self {
        PageMath { ps, shift: ps.is_power_of_two().then(|| ps.trailing_zeros()) }
    }

    #[inline]
    fn div(self, x: usize) -> usize {
        match self.shift {
            Some(s) => x >> s,
            None => x / self.ps,
        }
    }

    #[inline]
    fn rem(self, x: usize) -> usize {
        match self.shift {
            Some(_) => x & (self.ps - 1),
            None => x % self.ps,
        }
    }
}

/// Pages -> per-token slots (int32), written to the front of `dst`; returns
/// how many were written (`pages.len() * ps`). Values come from int32 slots
/// or from a pool smaller than 2^31 pages, so the casts are lossless.
///
/// # Panics
/// If `dst` is shorter than `pages.len() * ps`.
#[allow(clippy::cast_possible_wrap, clippy::cast_possible_truncation)]
pub fn pages_to_slots(pages: &[PageId], ps: usize, dst: &mut [MaybeUninit<i32>]) -> usize {
    let n = pages.len() * ps;
    let dst = &mut dst[..n];
    match ps {
        1 => {
            for (d, p) in dst.iter_mut().zip(pages) {
                d.write(p.0 as i32);
            }
        }
        4 => expand_fixed::<4>(pages, dst),
        8 => expand_fixed::<8>(pages, dst),
        16 => expand_fixed::<16>(pages, dst),
        32 => expand_fixed::<32>(pages, dst),
        64 => expand_fixed::<64>(pages, dst),
        _ => {
            let ps32 = ps as i32;
            for (run, &p) in dst.chunks_exact_mut(ps).zip(pages) {
                let base = p.0 as i32 * ps32;
                for (d, k) in run.iter_mut().zip(0..) {
                    d.write(base + k);
                }
            }
        }
    }
    n
}

/// `[0 1 2 3], [4 5 6 7], ...` up to `N` (a multiple of 4, at most 64), as
/// SSE2 vectors; the unused tail of the array is zero.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::cast_possible_wrap, clippy::cast_possible_truncation)]
fn iota_quads<const N: usize>() -> [core::arch::x86_64::__m128i; 16] {
    const { assert!(N.is_multiple_of(4) && N <= 64) };
    // SAFETY: SSE2 is part of the x86-64 baseline.
    std::array::from_fn(|q| unsafe {
        let k = (4 * q) as i32;
        if q < N / 4 {
            core::arch::x86_64::_mm_setr_epi32(k, k + 1, k + 2, k + 3)
        } else {
            core::arch::x86_64::_mm_setzero_si128()
        }
    })
}

/// [`pages_to_slots`] for a page size known at compile time (a multiple of
/// 4): one broadcast per page, then one vector add and one 16-byte store per
/// four slots. Written with SSE2 (baseline on x86-64) because the compiler
/// splits whole-page stores into a mix of scalar and misaligned vector
/// stores, which doubles the store count.
#[allow(clippy::cast_possible_wrap, clippy::cast_possible_truncation)]
fn expand_fixed<const N: usize>(pages: &[PageId], dst: &mut [MaybeUninit<i32>]) {
    const { assert!(N.is_multiple_of(4)) };
    let dst = &mut dst[..pages.len() * N];
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{__m128i, _mm_add_epi32, _mm_set1_epi32, _mm_storeu_si128};
        let steps = iota_quads::<N>();
        let out = dst.as_mut_ptr().cast::<__m128i>();
        // SAFETY: SSE2 is part of the x86-64 baseline. `dst` holds exactly
        // `pages.len() * N` i32 slots, so quad `i * N / 4 + q` (q < N / 4)
        // lies inside it; unaligned stores need no alignment; writing
        // initialises `MaybeUninit` slots, which is always allowed.
        unsafe {
            for (i, &p) in pages.iter().enumerate() {
                let base = _mm_set1_epi32((p.0 as i32).wrapping_mul(N as i32));
                for (q, &step) in steps[..N / 4].iter().enumerate() {
                    _mm_storeu_si128(out.add(i * (N / 4) + q), _mm_add_epi32(base, step));
                }
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    for (run, &p) in dst.chunks_exact_mut(N).zip(pages) {
        let base = (p.0 as i32).wrapping_mul(N as i32);
        for (d, k) in run.iter_mut().zip(0..) {
            d.write(base + k);
        }
    }
}

/// The plain references: what [`slots_to_pages`] and [`pages_to_slots`]
/// must compute, written for clarity (one slot at a time, no unrolling).
pub mod scalar {
    use crate::core::ids::PageId;

    /// Reference [`super::slots_to_pages`]: the full pages' ids and the
    /// tail's page, or `None` when a slot is negative or a page (the tail
    /// included) is not a page-aligned run. O(slots).
    #[must_use]
    pub fn slots_to_pages(slots: &[i32], ps: usize) -> Option<(Vec<PageId>, Option<PageId>)> {
        let mut pages = Vec::new();
        let mut tail = None;
        for run in slots.chunks(ps) {
            let base = i64::from(run[0]);
            let aligned = base >= 0 && base % ps as i64 == 0;
            let consecutive = run.iter().enumerate().all(|(k, &x)| i64::from(x) == base + k as i64);
            if !aligned || !consecutive {
                return None;
            }
            let page = PageId(u32::try_from(base / ps as i64).ok()?);
            if run.len() == ps {
                pages.push(page);
            } else {
                tail = Some(page);
            }
        }
        Some((pages, tail))
    }

    /// Reference [`super::pages_to_slots`]: `page * ps + k` for every page
    /// and `k < ps`, wrapping in i32 as the fast version does. O(slots).
    #[must_use]
    pub fn pages_to_slots(pages: &[PageId], ps: usize) -> Vec<i32> {
        let ps32 = i32::try_from(ps).expect("page sizes fit i32");
        pages
            .iter()
            .flat_map(|p| {
                #[allow(clippy::cast_possible_wrap)]
                let base = (p.0 as i32).wrapping_mul(ps32);
                (0..ps32).map(move |k| base.wrapping_add(k))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::mem::MaybeUninit;

    use proptest::prelude::*;

    use super::*;

    /// Deterministic by default (fixed seed, 512 cases); `PROPTEST_CASES`
    /// and `PROPTEST_RNG_SEED` override for a longer randomised run.
    fn config() -> ProptestConfig {
        crate::core::prop_config::deterministic(512, 0x6b76_7061_6765_7301)
    }

    /// Page sizes: every unrolled size, and odd ones that take the generic path.
    const SIZES: [usize; 10] = [1, 2, 3, 4, 5, 8, 16, 32, 64, 96];

    fn expand(pages: &[PageId], ps: usize) -> Vec<i32> {
        let mut dst = vec![MaybeUninit::new(-7i32); pages.len() * ps + 3];
        let n = pages_to_slots(pages, ps, &mut dst);
        assert_eq!(n, pages.len() * ps);
        // SAFETY: every element was initialised when the vector was built.
        dst[..n].iter().map(|x| unsafe { x.assume_init() }).collect()
    }

    /// Slot lists that are valid for `ps` (page runs, maybe a tail), then
    /// perhaps corrupted at one position.
    fn slot_lists() -> impl Strategy<Value = (usize, Vec<i32>)> {
        (0..SIZES.len(), prop::collection::vec(0u32..1 << 20, 0..12), 0..200usize, any::<i32>(), 0..3u8)
            .prop_map(|(si, pages, tail, junk, mode)| {
                let ps = SIZES[si];
                let mut slots: Vec<i32> = pages
                    .iter()
                    .flat_map(|&p| {
                        let base = i64::from(p) * ps as i64;
                        (0..ps as i64).map(move |k| i32::try_from(base + k).unwrap_or(i32::MAX))
                    })
                    .collect();
                let t = tail % ps;
                if t > 0 {
                    #[allow(clippy::cast_possible_wrap, clippy::cast_possible_truncation)]
                    slots.extend((0..t as i32).map(|k| 4096 * ps as i32 + k));
                }
                if mode > 0 && !slots.is_empty() {
                    let i = tail % slots.len();
                    slots[i] = if mode == 1 { junk } else { slots[i].wrapping_add(1) };
                }
                (ps, slots)
            })
    }

    proptest! {
        #![proptest_config(config())]

        #[test]
        fn slots_to_pages_matches_scalar((ps, slots) in slot_lists()) {
            let mut out = vec![PageId(9)];
            let got = slots_to_pages(&slots, PageMath::new(ps), &mut out);
            match scalar::slots_to_pages(&slots, ps) {
                Some((pages, tail)) => {
                    prop_assert_eq!(got, Ok(tail));
                    prop_assert_eq!(&out[1..], &pages[..]);
                }
                None => {
                    prop_assert!(got.is_err());
                    prop_assert_eq!(out, vec![PageId(9)], "a refused conversion leaves the output as it was");
                }
            }
        }

        #[test]
        fn pages_to_slots_matches_scalar(si in 0..SIZES.len(), pages in prop::collection::vec(0u32..1 << 24, 0..40)) {
            let ps = SIZES[si];
            let pages: Vec<PageId> = pages.into_iter().map(PageId).collect();
            prop_assert_eq!(expand(&pages, ps), scalar::pages_to_slots(&pages, ps));
        }

        #[test]
        fn round_trip(si in 0..SIZES.len(), pages in prop::collection::vec(0u32..1 << 20, 0..40)) {
            let ps = SIZES[si];
            let pages: Vec<PageId> = pages.into_iter().map(PageId).collect();
            let slots = expand(&pages, ps);
            let mut back = Vec::new();
            prop_assert_eq!(slots_to_pages(&slots, PageMath::new(ps), &mut back), Ok(None));
            prop_assert_eq!(back, pages);
        }
    }

    #[test]
    fn a_run_wrapping_past_i32_max_is_refused() {
        // 2147483646 is a multiple of 3; the run's third slot would be 2^31.
        let slots = [2_147_483_646, i32::MAX, i32::MIN];
        assert_eq!(scalar::slots_to_pages(&slots, 3), None);
        let mut out = Vec::new();
        assert!(slots_to_pages(&slots, PageMath::new(3), &mut out).is_err());
        assert!(out.is_empty());
    }

    #[test]
    fn errors_name_the_culprit() {
        let mut out = Vec::new();
        let e = slots_to_pages(&[0, 1, -5, 3], PageMath::new(2), &mut out).expect_err("negative");
        assert!(e.msg.contains("-5"), "{}", e.msg);
        let e =
            slots_to_pages(&[4, 5, 6, 7, 9, 10, 11, 12], PageMath::new(4), &mut out).expect_err("misaligned");
        assert!(e.msg.contains("page 1 starts at slot 9"), "{}", e.msg);
        assert!(out.is_empty());
    }
}
