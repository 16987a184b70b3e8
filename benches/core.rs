//! Criterion benchmarks of the pure-Rust core (no Python in the loop):
//! chained hashing of a 128K-token prompt per algorithm, hash-chain
//! admission + free of a 2,705-token prompt with a shared system prompt, and a
//! 16-request decode step.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use kvindex::core::hash::{BlockHasher, HashAlgo, KeySpec};
use kvindex::core::hash_chain::HashChainCache;
use kvindex::core::ids::RequestId;

fn tokens(n: usize, seed: u64) -> Vec<i32> {
    let mut x = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            i32::try_from((x >> 33) % 128_000).expect("fits")
        })
        .collect()
}

fn hashing(c: &mut Criterion) {
    let toks = tokens(128 * 1024, 1);
    let mut g = c.benchmark_group("hash_128k");
    g.throughput(Throughput::Bytes((toks.len() * 4) as u64));
    for algo in ["xxh3_128", "sha256", "vllm_sha256_cbor", "vllm_sha256"] {
        let mut h = BlockHasher::new(HashAlgo::parse(algo).expect("known"), None);
        let spec = KeySpec::default();
        let mut out = Vec::with_capacity(toks.len() / 16);
        g.bench_function(algo, |b| {
            b.iter(|| {
                out.clear();
                h.extend_chain(&toks, 16, &spec, &mut out);
            });
        });
    }
    g.finish();
}

fn admission(c: &mut Criterion) {
    let system = tokens(2_400, 2);
    let mut prompt = system.clone();
    prompt.extend(tokens(305, 3));
    let mut cache = HashChainCache::new(4096, 16, HashAlgo::Xxh3_128, None, false).expect("valid");
    cache.admit(RequestId(0), &prompt, KeySpec::default(), false).expect("ok");
    cache.free(RequestId(0)).expect("ok");
    c.bench_function("admit_free_2705_tokens_xxh3", |b| {
        b.iter(|| {
            cache.admit(RequestId(1), &prompt, KeySpec::default(), false).expect("ok");
            cache.free(RequestId(1)).expect("ok");
        });
    });
}

fn decode(c: &mut Criterion) {
    c.bench_function("append_batch_16x1", |b| {
        b.iter_batched_ref(
            || {
                let mut cache =
                    HashChainCache::new(4096, 16, HashAlgo::Xxh3_128, None, false).expect("valid");
                for i in 0..16u64 {
                    cache.admit(RequestId(i), &tokens(100, i), KeySpec::default(), false).expect("ok");
                }
                cache
            },
            |cache| {
                let ids: Vec<u64> = (0..16).collect();
                let toks = [7i32; 16];
                for _ in 0..64 {
                    assert!(cache.append_batch(&ids, &toks, None).expect("ok"));
                }
            },
            BatchSize::LargeInput,
        );
    });
}

criterion_group!(benches, hashing, admission, decode);
criterion_main!(benches);
