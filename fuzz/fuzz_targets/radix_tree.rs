//! libFuzzer entry point: see `kvindex_fuzz::radix_tree` and `fuzz/README.md`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kvindex_fuzz::radix_tree::run(data));
