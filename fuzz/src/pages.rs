//! Harness for the page/slot conversions (`kvindex::core::pages`): the fast
//! paths (SSE2, unrolled per page size) against the scalar reference.
//!
//! Input: `[page size selector]`, then items until the bytes run out, each
//! `[kind]` and its payload:
//! - kind % 4 == 0: `[page lo][page hi]`: one valid page run;
//! - kind % 4 == 1: `[b0][b1][b2][b3]`: one raw slot (little-endian i32,
//!   anything: negative, misaligned, near `i32::MAX`);
//! - kind % 4 == 2: `[page lo][page hi][k]`: a run of `k % page_size`
//!   slots from that page's first slot (a tail, valid only last);
//! - kind % 4 == 3: `[page lo][page hi][k]`: a run with slot `k % page_size`
//!   off by one.
//!
//! Checked: `slots_to_pages` agrees with `scalar::slots_to_pages` (result,
//! pages, tail page; the output untouched on error), `pages_to_slots` with
//! `scalar::pages_to_slots`, and a valid list converts back to itself.

use std::mem::MaybeUninit;

use kvindex::core::ids::PageId;
use kvindex::core::pages::{pages_to_slots, scalar, slots_to_pages, PageMath};

use crate::common::{Input, MAX_OPS};

/// Page sizes: every unrolled size and odd ones that take the generic path.
pub const SIZES: [usize; 12] = [1, 2, 3, 4, 5, 7, 8, 16, 32, 64, 96, 128];

/// Runs one input (panics on a disagreement).
pub fn run(data: &[u8]) {
    let mut inp = Input::new(data);
    let ps = SIZES[usize::from(inp.u8()) % SIZES.len()];
    let ps32 = i32::try_from(ps).expect("small page sizes");
    let mut slots: Vec<i32> = Vec::new();
    let mut pages: Vec<PageId> = Vec::new();
    let mut items = 0;
    while !inp.is_empty() && items < MAX_OPS {
        items += 1;
        let kind = inp.u8() % 4;
        if kind == 1 {
            let b = [inp.u8(), inp.u8(), inp.u8(), inp.u8()];
            slots.push(i32::from_le_bytes(b));
            continue;
        }
        let page = u32::from(inp.u8()) | u32::from(inp.u8()) << 8;
        pages.push(PageId(page));
        let base = i32::try_from(page).expect("16-bit page") * ps32;
        let k = if kind == 0 { 0 } else { usize::from(inp.u8()) % ps };
        let len = if kind == 2 { k } else { ps };
        #[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
        slots.extend((0..len).map(|j| base + j as i32 + i32::from(kind == 3 && j == k)));
    }
    let mut out = vec![PageId(7)];
    let got = slots_to_pages(&slots, PageMath::new(ps), &mut out);
    match scalar::slots_to_pages(&slots, ps) {
        Some((want, tail)) => {
            assert_eq!(got, Ok(tail), "ps {ps}: slots {slots:?}");
            assert_eq!(&out[1..], &want[..], "ps {ps}: pages of {slots:?}");
        }
        None => {
            assert!(got.is_err(), "ps {ps}: accepted invalid slots {slots:?}");
            assert_eq!(out, vec![PageId(7)], "a refused conversion leaves the output as it was");
        }
    }
    let mut dst = vec![MaybeUninit::new(-1i32); pages.len() * ps + 5];
    let n = pages_to_slots(&pages, ps, &mut dst);
    assert_eq!(n, pages.len() * ps);
    // SAFETY: every element was initialised when the vector was built.
    let expanded: Vec<i32> = dst[..n].iter().map(|x| unsafe { x.assume_init() }).collect();
    assert_eq!(expanded, scalar::pages_to_slots(&pages, ps), "ps {ps}: slots of {pages:?}");
    let mut back = Vec::new();
    assert_eq!(slots_to_pages(&expanded, PageMath::new(ps), &mut back), Ok(None));
    assert_eq!(back, pages, "ps {ps}: round trip");
}
