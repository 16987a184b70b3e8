//! The binding layer: the only code that knows about Python. No algorithm
//! lives here; each function converts arguments, calls the core, converts
//! the result, and maps errors once (see [`errors`]).

use pyo3::prelude::*;

pub mod args;
pub mod arrays;
pub mod cache;
pub mod cluster;
pub mod common;
pub mod errors;
pub mod event_codec;
pub mod events;
pub mod groups;
pub mod hash_chain;
pub mod hashing;
pub mod keys;
pub mod lifecycle;
pub mod radix;
pub mod radix_hybrid;
pub mod sglang;
pub mod vllm_cow;
pub mod vllm_front;
pub mod vllm_hashing;
pub mod vllm_manager;
pub mod vllm_manager_extra;
pub mod vllm_manager_groups;

/// Test hook: panics inside Rust (surfaces as ``pyo3_runtime.PanicException``).
#[pyfunction]
fn _force_panic_for_tests() {
    panic!("forced panic: kvindex test hook for the panic policy");
}

/// The native module `kvindex._core` (the crate is `kvindex`; the Python
/// extension module keeps its private `_core` name).
#[pymodule]
#[pyo3(name = "_core")]
fn kvindex_core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::init(m.py())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("HASH_ALGOS", crate::core::hash::ALGO_NAMES.to_vec())?;
    m.add_function(wrap_pyfunction!(hashing::block_hashes, m)?)?;
    m.add_function(wrap_pyfunction!(hashing::none_hash, m)?)?;
    m.add_function(wrap_pyfunction!(_force_panic_for_tests, m)?)?;
    m.add_class::<vllm_hashing::PyVllmRequestHasher>()?;
    m.add_class::<cache::PyPrefixCache>()?;
    m.add_class::<hash_chain::PyHashChainCache>()?;
    m.add_class::<common::Admission>()?;
    m.add_class::<events::BlockStored>()?;
    m.add_class::<events::BlockRemoved>()?;
    m.add_class::<events::AllBlocksCleared>()?;
    m.add_class::<event_codec::EventEncoder>()?;
    m.add_function(wrap_pyfunction!(event_codec::decode_event_batch, m)?)?;
    m.add_class::<cluster::PyClusterIndex>()?;
    m.add_function(wrap_pyfunction!(groups::explain_layout, m)?)?;
    m.add_class::<groups::PyGroupReplay>()?;
    m.add_class::<radix::PyRadixTree>()?;
    // The tree's former name, kept as an alias.
    m.add("RadixCache", m.getattr("RadixTree")?)?;
    m.add_class::<radix::MatchResult>()?;
    m.add_class::<radix::InsertResult>()?;
    m.add_class::<radix::PyRadixPrefixCache>()?;
    m.add_class::<vllm_manager::PyVllmManager>()?;
    m.add_class::<vllm_front::PyVllmFront>()?;
    m.add("RADIX_POLICIES", crate::core::radix::POLICY_NAMES.to_vec())?;
    Ok(())
}
