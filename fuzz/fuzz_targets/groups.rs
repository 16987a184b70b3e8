//! libFuzzer entry point: see `kvindex_fuzz::groups` and `fuzz/README.md`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kvindex_fuzz::groups::run(data));
