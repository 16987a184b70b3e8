//! libFuzzer entry point: see `kvindex_fuzz::hash_chain` and `fuzz/README.md`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kvindex_fuzz::hash_chain::run(data));
