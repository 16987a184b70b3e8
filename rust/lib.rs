//! kvindex: a KV-cache prefix index for LLM inference schedulers.
//!
//! The crate has two layers:
//! - [`core`]: pure Rust (no pyo3, no numpy). Block hashing, the ref-counted
//!   block pool with its free queue, the hash-chain prefix cache and the radix
//!   tree. `cargo test` exercises it without Python.
//! - `py` (feature `python`): the one thin binding layer that converts numpy
//!   arrays and Python values to core calls and core errors to Python exceptions.

pub mod core;

#[cfg(feature = "python")]
mod py;
