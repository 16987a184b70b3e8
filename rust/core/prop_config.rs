//! The unit property tests' configuration, one rule for every module:
//! deterministic by default (a fixed seed per test module and a fixed case
//! count, so CI runs the same cases every time); `PROPTEST_CASES` and
//! `PROPTEST_RNG_SEED` in the environment override them for a longer
//! randomised run (`make soak`). Failures are not persisted to files.

use proptest::test_runner::{Config, RngSeed};

/// `cases` cases from `seed`, unless the environment says otherwise.
#[must_use]
pub fn deterministic(cases: u32, seed: u64) -> Config {
    let env = Config::default(); // reads PROPTEST_* from the environment
    Config {
        cases: if std::env::var_os("PROPTEST_CASES").is_some() { env.cases } else { cases },
        rng_seed: if std::env::var_os("PROPTEST_RNG_SEED").is_some() {
            env.rng_seed
        } else {
            RngSeed::Fixed(seed)
        },
        failure_persistence: None,
        ..env
    }
}
