//! The component pools beside the page pool of a hybrid radix cache, as
//! SGLang sizes them: a sliding-window (SWA) pool paired with the full pool
//! (SGLang's `SWATokenToKVPoolAllocator`: every full page handed out takes an
//! SWA page too, the page id names both; the SWA page can be freed while the
//! full page stays, a *tombstone*) and a Mamba state pool (SGLang's
//! `MambaPool`: one state slot per running request, more held by the tree).
//!
//! Each pool is one implementation of [`ComponentPool`]: the request layer
//! asks every component the same questions (what it can serve now, what an
//! admission takes from it, its invariants); a new kind of state is a new
//! implementation, not a copy of the radix design.
//!
//! # Invariants (checked by `check_invariants`)
//! - SWA: `used == pages marked live <= capacity`; a live page is held (its
//!   full page has a holder).
//! - Mamba: every state id is free or held, never both; `free` holds no id
//!   twice.

use crate::core::error::{InvariantViolation, KvError, KvResult};
use crate::core::ids::PageId;
use crate::ensure_inv;

/// A component pool of a hybrid radix cache (module docs).
pub trait ComponentPool {
    /// The component's name in messages ("swa", "mamba").
    const NAME: &'static str;
    /// Units in the pool.
    fn capacity(&self) -> usize;
    /// Units free now.
    fn num_free(&self) -> usize;
    /// Units held now.
    fn num_used(&self) -> usize {
        self.capacity() - self.num_free()
    }
}

/// The SWA pool: one live bit per page id, a count of live pages.
#[derive(Clone, Debug)]
pub struct SwaPool {
    window: usize,
    live: Vec<bool>,
    used: usize,
    capacity: usize,
}

impl ComponentPool for SwaPool {
    const NAME: &'static str = "swa";

    fn capacity(&self) -> usize {
        self.capacity
    }

    fn num_free(&self) -> usize {
        self.capacity - self.used
    }
}

impl SwaPool {
    /// A pool of `capacity` SWA pages beside a full pool of `num_pages` page
    /// ids (the null page included), for a window of `window` tokens.
    ///
    /// # Errors
    /// `InvalidArgument` for a window of 0 or no SWA page.
    pub fn new(window: usize, capacity: usize, num_pages: usize) -> KvResult<Self> {
        if window == 0 {
            return Err(KvError::invalid("the sliding window must be at least 1 token"));
        }
        if capacity == 0 {
            return Err(KvError::invalid("swa_blocks must be at least 1"));
        }
        Ok(SwaPool { window, live: vec![false; num_pages], used: 0, capacity })
    }

    /// The window in tokens.
    #[must_use]
    pub fn window(&self) -> usize {
        self.window
    }

    /// Whether page `p` holds a live SWA page.
    #[must_use]
    pub fn is_live(&self, p: PageId) -> bool {
        self.live[p.idx()]
    }

    /// Pages newly handed out take an SWA page each; the caller checked
    /// `num_free`.
    pub fn take(&mut self, pages: &[PageId]) {
        for &p in pages {
            debug_assert!(!self.live[p.idx()]);
            self.live[p.idx()] = true;
        }
        self.used += pages.len();
        debug_assert!(self.used <= self.capacity);
    }

    /// Frees the SWA page of each of `pages` that still has one.
    pub fn release(&mut self, pages: &[PageId]) {
        for &p in pages {
            let l = &mut self.live[p.idx()];
            if *l {
                *l = false;
                self.used -= 1;
            }
        }
    }

    /// Moves the SWA page of `from` to `to` (which has none).
    pub fn transfer(&mut self, from: PageId, to: PageId) {
        if self.live[from.idx()] && !self.live[to.idx()] {
            self.live[from.idx()] = false;
            self.live[to.idx()] = true;
        }
    }

    /// Frees every SWA page.
    pub fn clear(&mut self) {
        self.live.iter_mut().for_each(|l| *l = false);
        self.used = 0;
    }

    /// The pool's invariants; `held(p)`: whether the full page `p` has a holder.
    ///
    /// # Errors
    /// The first violation.
    pub fn check_invariants(&self, held: impl Fn(PageId) -> bool) -> Result<(), InvariantViolation> {
        let mut n = 0;
        for (i, &l) in self.live.iter().enumerate() {
            if l {
                n += 1;
                let p = PageId(u32::try_from(i).expect("page ids fit u32"));
                ensure_inv!(p != PageId::NULL && held(p), "swa page {i} is live without a full page");
            }
        }
        ensure_inv!(n == self.used, "swa pool counts {} live pages, {n} marked", self.used);
        ensure_inv!(self.used <= self.capacity, "swa pool holds {} of {}", self.used, self.capacity);
        Ok(())
    }
}

/// The Mamba state pool: state ids `0..capacity`, a free list (lowest first).
#[derive(Clone, Debug)]
pub struct MambaPool {
    free: Vec<u32>,
    held: Vec<bool>,
}

impl ComponentPool for MambaPool {
    const NAME: &'static str = "mamba";

    fn capacity(&self) -> usize {
        self.held.len()
    }

    fn num_free(&self) -> usize {
        self.free.len()
    }
}

impl MambaPool {
    /// A pool of `capacity` states.
    ///
    /// # Errors
    /// `InvalidArgument` for no state or more than `2**31`.
    pub fn new(capacity: usize) -> KvResult<Self> {
        if capacity == 0 || capacity > 1 << 31 {
            return Err(KvError::invalid(format!("mamba_states must be in 1..=2**31, got {capacity}")));
        }
        let cap = u32::try_from(capacity).expect("checked");
        Ok(MambaPool { free: (0..cap).rev().collect(), held: vec![false; capacity] })
    }

    /// A free state, if any (lowest id first).
    pub fn alloc(&mut self) -> Option<u32> {
        let s = self.free.pop()?;
        self.held[s as usize] = true;
        Some(s)
    }

    /// Returns state `s` to the pool.
    pub fn free(&mut self, s: u32) {
        debug_assert!(self.held[s as usize]);
        self.held[s as usize] = false;
        self.free.push(s);
    }

    /// Whether state `s` is held.
    #[must_use]
    pub fn is_held(&self, s: u32) -> bool {
        self.held.get(s as usize).copied().unwrap_or(false)
    }

    /// The pool's invariants: `holders` lists every holder's state (tree and
    /// requests), each once.
    ///
    /// # Errors
    /// The first violation.
    pub fn check_invariants(&self, holders: &[u32]) -> Result<(), InvariantViolation> {
        let mut seen = vec![false; self.held.len()];
        for &s in holders {
            ensure_inv!((s as usize) < seen.len(), "mamba state {s} out of range");
            ensure_inv!(!seen[s as usize], "mamba state {s} held twice");
            ensure_inv!(self.held[s as usize], "mamba state {s} held but marked free");
            seen[s as usize] = true;
        }
        for &s in &self.free {
            ensure_inv!(!self.held[s as usize], "mamba state {s} free and held");
        }
        ensure_inv!(
            holders.len() + self.free.len() == self.held.len(),
            "mamba pool: {} held + {} free of {}",
            holders.len(),
            self.free.len(),
            self.held.len()
        );
        Ok(())
    }
}
