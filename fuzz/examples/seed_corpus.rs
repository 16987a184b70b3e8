//! Writes the seed corpus: `corpus/<target>/seed-NN-<name>` for every seed of
//! `kvindex_fuzz::seeds`, replacing older `seed-*` files (files the fuzzer
//! added are left alone). Run from anywhere: `cargo run --manifest-path
//! fuzz/Cargo.toml --example seed_corpus`.

use std::fs;
use std::path::Path;

fn main() -> std::io::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    for (target, seeds) in kvindex_fuzz::seeds::all() {
        let dir = root.join(target);
        fs::create_dir_all(&dir)?;
        for entry in fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("seed-")) {
                fs::remove_file(path)?;
            }
        }
        let n = seeds.len();
        let mut bytes = 0;
        for (i, (name, data)) in seeds.into_iter().enumerate() {
            bytes += data.len();
            fs::write(dir.join(kvindex_fuzz::seeds::file_name(i, name)), data)?;
        }
        eprintln!("{target}: {n} seeds, {bytes} bytes -> {}", dir.display());
    }
    Ok(())
}
