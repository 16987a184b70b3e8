//! Fuzz harnesses for kvindex's core.
//!
//! Each harness decodes arbitrary bytes into a cache configuration and a
//! sequence of operations — invalid ones included — runs them, and checks
//! `check_invariants()` plus the harness's own expectations after every
//! operation; any violation panics (a crash for libFuzzer). The byte format is
//! documented in `fuzz/README.md`; the libFuzzer entry points in
//! `fuzz_targets/` only call [`hash_chain::run`], [`radix_tree::run`],
//! [`radix_cache::run`], [`pages::run`], [`lifecycle::run`] and [`groups::run`], so the same harnesses run under `cargo test` on the
//! committed corpus.

pub mod common;
pub mod groups;
pub mod hash_chain;
pub mod lifecycle;
pub mod pages;
pub mod radix_cache;
pub mod radix_hybrid;
pub mod radix_tree;
pub mod seeds;

/// A harness: runs one input, panicking on any violation.
pub type Harness = fn(&[u8]);

/// The fuzz targets, by name, with their harness.
pub const TARGETS: [(&str, Harness); 6] = [
    ("hash_chain", hash_chain::run),
    ("radix_tree", radix_tree::run),
    ("radix_cache", radix_cache::run),
    ("pages", pages::run),
    ("lifecycle", lifecycle::run),
    ("groups", groups::run),
];
