//! The request-level radix cache over hybrid components
//! ([`crate::core::radix_cache::RadixPrefixCache::with_components`]): SWA
//! pages leaving a request's window, tombstones limiting later hits, the SWA
//! pool as the admission bound, Mamba states forked, donated and evicted.

use crate::core::hash::KeySpec;
use crate::core::ids::RequestId;
use crate::core::radix::pools::ComponentPool;
use crate::core::radix::{Components, Policy};
use crate::core::radix_cache::{PoolSizes, RadixPrefixCache};

fn cache(nb: usize, ps: usize, comps: Components, sizes: PoolSizes) -> RadixPrefixCache {
    RadixPrefixCache::with_components(nb, ps, Policy::Lru, true, comps, sizes).expect("valid")
}

fn swa(w: usize) -> Components {
    Components { swa_window: Some(w), mamba: false }
}

fn admit(c: &mut RadixPrefixCache, id: u64, toks: &[i32]) -> Option<usize> {
    let r = c.admit(RequestId(id), toks, KeySpec::default(), false).expect("valid admission");
    c.check_invariants().expect("invariants after admit");
    r
}

fn decode(c: &mut RadixPrefixCache, id: u64, toks: &[i32]) {
    for t in toks {
        assert!(c.append(RequestId(id), &[*t]).expect("known request"), "pages available");
        c.check_invariants().expect("invariants after append");
    }
}

fn free(c: &mut RadixPrefixCache, id: u64) {
    c.free(RequestId(id)).expect("known request");
    c.check_invariants().expect("invariants after free");
}

#[test]
fn swa_pages_leave_the_window_as_a_request_decodes() {
    let mut c = cache(64, 1, swa(4), PoolSizes::default());
    let prompt: Vec<i32> = (0..10).collect();
    assert_eq!(admit(&mut c, 1, &prompt), Some(0));
    // Ten prompt pages, each with its SWA page.
    assert_eq!(c.swa_pool().expect("swa").num_used(), 10);
    decode(&mut c, 1, &(10..30).collect::<Vec<_>>());
    // The last step saw 29 tokens: only their last max(window, page) = 4
    // and the new token keep their SWA pages.
    assert_eq!(c.swa_pool().expect("swa").num_used(), 5);
    free(&mut c, 1);
    // The tree holds the 30 tokens: the last 5 live, the rest a tombstone.
    assert_eq!(c.tree().total_size(), 30);
    assert_eq!(c.tree().swa_sizes(), (5, 0));
    // A prompt ending inside the tombstone hits nothing; the whole sequence hits.
    assert_eq!(c.lookup(&(0..20).collect::<Vec<i32>>(), &KeySpec::default()).expect("ok"), 0);
    let again: Vec<i32> = (0..31).collect();
    assert_eq!(admit(&mut c, 2, &again), Some(30));
    free(&mut c, 2);
}

#[test]
fn the_swa_pool_bounds_admission_and_evicts_tombstones() {
    // 63 full pages but 12 SWA pages: the SWA pool is the bound.
    let mut c = cache(64, 1, swa(4), PoolSizes { swa_blocks: Some(12), mamba_states: None });
    assert!(c.admit(RequestId(9), &[0i32; 13], KeySpec::default(), false).is_err(), "too large");
    let a: Vec<i32> = (0..10).collect();
    assert_eq!(admit(&mut c, 1, &a), Some(0));
    // 2 SWA pages left: a 3-token prompt waits.
    assert_eq!(admit(&mut c, 2, &[100, 101, 102]), None);
    decode(&mut c, 1, &[10, 11]);
    // Request 1 freed the SWA pages outside its window: 12 tokens, 5 live.
    assert_eq!(c.swa_pool().expect("swa").num_used(), 5);
    assert_eq!(admit(&mut c, 2, &[100, 101, 102]), Some(0));
    free(&mut c, 1);
    free(&mut c, 2);
    // Full pages are plenty, SWA pages short: the tree's live SWA is evicted.
    let b: Vec<i32> = (200..211).collect();
    assert_eq!(admit(&mut c, 3, &b), Some(0));
    assert!(c.tree().swa_sizes().0 < 7);
    free(&mut c, 3);
}

#[test]
fn mamba_states_are_forked_donated_and_evicted() {
    let comps = Components { swa_window: None, mamba: true };
    let mut c = cache(64, 2, comps, PoolSizes { swa_blocks: None, mamba_states: Some(2) });
    let a: Vec<i32> = (0..9).collect();
    assert_eq!(admit(&mut c, 1, &a), Some(0));
    assert_eq!(c.mamba_pool().expect("mamba").num_free(), 1);
    free(&mut c, 1);
    // The request's state went to the tree with its 8 full-page tokens.
    assert_eq!(c.tree().mamba_sizes(), (1, 0));
    assert_eq!(c.mamba_pool().expect("mamba").num_free(), 1);
    assert_eq!(admit(&mut c, 2, &a), Some(8));
    assert_eq!(c.mamba_pool().expect("mamba").num_free(), 0);
    // No state free and the tree's is locked: a third request waits.
    assert_eq!(admit(&mut c, 3, &[50, 51, 52]), None);
    free(&mut c, 2);
    // The tree already had a state there: request 2's returns to the pool.
    assert_eq!(c.tree().mamba_sizes(), (1, 0));
    assert_eq!(admit(&mut c, 3, &[50, 51, 52]), Some(0));
    assert_eq!(admit(&mut c, 4, &[60, 61, 62]), Some(0));
    // Request 4 took the tree's state: the node lost it, so nothing hits there.
    assert_eq!(c.tree().mamba_sizes(), (0, 0));
    assert_eq!(c.lookup(&a, &KeySpec::default()).expect("ok"), 0);
    free(&mut c, 3);
    free(&mut c, 4);
}

#[test]
fn checkpoints_fork_the_state_and_keep_the_window() {
    let comps = Components { swa_window: Some(3), mamba: true };
    let mut c = cache(64, 1, comps, PoolSizes { swa_blocks: None, mamba_states: Some(4) });
    let a: Vec<i32> = (0..8).collect();
    assert_eq!(admit(&mut c, 1, &a), Some(0));
    decode(&mut c, 1, &[8, 9, 10, 11]);
    c.checkpoint(RequestId(1)).expect("known");
    c.check_invariants().expect("invariants after checkpoint");
    // The tree got a forked state; the request keeps its own.
    assert_eq!(c.tree().mamba_sizes(), (0, 1));
    assert_eq!(c.mamba_pool().expect("mamba").num_free(), 2);
    assert_eq!(c.num_cached_tokens(RequestId(1)).expect("known"), 12);
    let b: Vec<i32> = (0..13).collect();
    assert_eq!(admit(&mut c, 2, &b), Some(12));
    decode(&mut c, 1, &[12, 13]);
    free(&mut c, 1);
    free(&mut c, 2);
    c.reset().expect("no request runs");
    c.check_invariants().expect("invariants after reset");
    assert_eq!(c.mamba_pool().expect("mamba").num_free(), 4);
    assert_eq!(c.swa_pool().expect("swa").num_used(), 0);
}
