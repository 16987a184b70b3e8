//! Runs inputs through a harness without libFuzzer, e.g. to read a crash:
//! `KVINDEX_FUZZ_TRACE=1 cargo run --manifest-path fuzz/Cargo.toml --example replay -- <target> <file>...`
//! (`KVINDEX_FUZZ_TRACE` prints every decoded operation and the state after it).

fn main() {
    let mut args = std::env::args().skip(1);
    let names: Vec<&str> = kvindex_fuzz::TARGETS.iter().map(|t| t.0).collect();
    let Some(target) = args.next() else {
        eprintln!("usage: replay <{}> <file>...", names.join("|"));
        std::process::exit(2);
    };
    let Some((_, run)) = kvindex_fuzz::TARGETS.iter().find(|t| t.0 == target) else {
        eprintln!("unknown target {target:?}; expected one of {names:?}");
        std::process::exit(2);
    };
    for path in args {
        let data = std::fs::read(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
        eprintln!("== {path} ({} bytes)", data.len());
        run(&data);
    }
}
