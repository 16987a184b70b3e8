//! The committed corpus is what `src/seeds.rs` generates, and every corpus
//! file runs clean through its harness (plain `cargo test`, no libFuzzer).

use std::fs;
use std::path::Path;

use kvindex_fuzz::seeds;

fn corpus_dir(target: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus").join(target)
}

#[test]
fn committed_seeds_are_current() {
    for (target, want) in seeds::all() {
        let mut have: Vec<(String, Vec<u8>)> = fs::read_dir(corpus_dir(target))
            .expect("corpus dir exists (run `cargo run --example seed_corpus`)")
            .map(|e| e.expect("readable entry").path())
            .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("seed-")))
            .map(|p| {
                let name = p.file_name().and_then(|n| n.to_str()).expect("utf-8 name").to_owned();
                (name, fs::read(&p).expect("readable seed"))
            })
            .collect();
        have.sort();
        let mut want: Vec<(String, Vec<u8>)> =
            want.into_iter().enumerate().map(|(i, (n, d))| (seeds::file_name(i, n), d)).collect();
        want.sort();
        assert!(
            have == want,
            "{target}: committed seeds differ from src/seeds.rs; run `cargo run --example seed_corpus`"
        );
    }
}

#[test]
fn corpus_runs_clean() {
    for (target, run) in kvindex_fuzz::TARGETS {
        let mut n = 0;
        for entry in fs::read_dir(corpus_dir(target)).expect("corpus dir exists") {
            let path = entry.expect("readable entry").path();
            run(&fs::read(&path).expect("readable corpus file"));
            n += 1;
        }
        assert!(n > 0, "{target}: empty corpus");
    }
}

#[test]
fn empty_and_short_inputs() {
    for (_, run) in kvindex_fuzz::TARGETS {
        for data in [&[][..], &[9], &[9, 1], &[9, 1, 0], &[255, 255, 255, 255]] {
            run(data);
        }
    }
}
