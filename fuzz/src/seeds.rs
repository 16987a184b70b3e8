//! The seed corpus: the scenarios of the property tests and worked examples
//! (`tests/hash_chain/hash_chain_prop.rs`, `rust/core/radix/tests.rs`) written as
//! operation bytes. `cargo run --example seed_corpus` writes them to
//! `corpus/<target>/seed-*`; `tests/corpus.rs` checks the committed files are
//! current and run clean.
//!
//! Tokens: suffix bytes 0-3 are tokens 0-3; the shared prefixes `P0`-`P2` are
//! the property test's (24 tokens, the first 4 shared); see `common::token_of`.

use crate::{hash_chain, lifecycle, radix_cache, radix_tree};

/// One seed: file name (without the `seed-NN-` prefix) and bytes.
pub type Seed = (&'static str, Vec<u8>);

/// A prompt: `prefix` 0-2 (3 = none), its first `cut` tokens, then `suffix` token bytes.
#[derive(Clone, Copy)]
pub struct P<'a>(pub u8, pub u8, pub &'a [u8]);

/// No prefix, just these token bytes.
#[must_use]
pub fn raw(suffix: &[u8]) -> P<'_> {
    P(3, 0, suffix)
}

fn len_u8(n: usize) -> u8 {
    u8::try_from(n).expect("seed lists are short")
}

/// Byte builder for one seed.
#[derive(Default)]
pub struct B(pub Vec<u8>);

impl B {
    fn with_header(h: [u8; 3]) -> Self {
        B(h.to_vec())
    }

    fn push(&mut self, bytes: &[u8]) -> &mut Self {
        self.0.extend_from_slice(bytes);
        self
    }

    fn prompt(&mut self, p: P<'_>) -> &mut Self {
        self.push(&[p.0, p.1, len_u8(p.2.len())]).push(p.2)
    }

    fn list(&mut self, v: &[u8]) -> &mut Self {
        self.push(&[len_u8(v.len())]).push(v)
    }

    fn done(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.0)
    }
}

// ------------------------------------------------------------------ hash chain

/// Hash-chain header: `nb` blocks (< 40, or 254/255 for huge), `bs` (byte),
/// algorithm index into `ALGO_NAMES`, events.
fn hc(nb: u8, bs: u8, algo: u8, events: bool) -> B {
    B::with_header([nb, bs, algo | if events { 8 } else { 0 } | 2 << 4])
}

impl B {
    fn admit(&mut self, id: u8, p: P<'_>, spec: u8, flags: u8) -> &mut Self {
        self.push(&[hash_chain::op::ADMIT, id]).prompt(p).push(&[spec, flags])
    }
    /// Admit with two multimodal items from four bytes (spec 6).
    fn admit_mm(&mut self, id: u8, p: P<'_>, mm: [u8; 4], flags: u8) -> &mut Self {
        self.push(&[hash_chain::op::ADMIT, id]).prompt(p).push(&[6]).push(&mm).push(&[flags])
    }
    fn a(&mut self, id: u8, prefix: u8, cut: u8) -> &mut Self {
        self.admit(id, P(prefix, cut, &[]), 0, 0)
    }
    fn append(&mut self, id: u8, tokens: &[u8]) -> &mut Self {
        self.push(&[hash_chain::op::APPEND, id]).list(tokens).push(&[0])
    }
    /// `append_batch`: one byte per id for ids and lengths, then `mode`
    /// (and `corruption` for mode 3), then the token bytes.
    fn append_batch(&mut self, op: u8, ids: &[u8], lens: &[u8], mode: &[u8], tokens: &[u8]) -> &mut Self {
        self.push(&[op]).list(ids).push(lens).push(mode).push(tokens)
    }
    fn free(&mut self, op: u8, id: u8) -> &mut Self {
        self.push(&[op, id])
    }
    fn free_batch(&mut self, op: u8, ids: &[u8]) -> &mut Self {
        self.push(&[op]).list(ids)
    }
    fn evict_blocks(&mut self, ids: &[u8]) -> &mut Self {
        self.push(&[hash_chain::op::EVICT_BLOCKS]).list(ids)
    }
    fn lookup(&mut self, op: u8, p: P<'_>, spec: u8) -> &mut Self {
        self.push(&[op]).prompt(p).push(&[spec])
    }
    fn tables(&mut self, op: u8, ids: &[u8], width: u8, delta: u8) -> &mut Self {
        self.push(&[op]).list(ids).push(&[width, delta])
    }
    fn slots(&mut self, op: u8, ids: &[u8], q: &[u8], flags: u8) -> &mut Self {
        self.push(&[op]).list(ids).push(q).push(&[flags])
    }
}

/// The hash-chain seeds: `fixed_sequences_match_model` of
/// `tests/hash_chain/hash_chain_prop.rs` over several algorithms, then scenarios for the
/// operations the property test does not drive.
#[must_use]
#[allow(clippy::too_many_lines)]
pub fn hash_chain() -> Vec<Seed> {
    use hash_chain::op::{
        APPEND_BATCH, BLOCK_TABLES, FREE, FREE_BATCH, INTROSPECT, LOOKUP, RESET, SLOT_MAPPING, TAKE_EVENTS,
    };
    let mut out = Vec::new();
    // fixed sequence 1: shared prefix hits, then a full hit capped at n - 1
    let shared = |algo| {
        hc(16, 4, algo, false)
            .a(0, 0, 24)
            .a(1, 0, 24)
            .free(FREE, 0)
            .a(2, 0, 13)
            .free(FREE, 1)
            .free(FREE, 2)
            .a(3, 0, 24)
            .done()
    };
    out.push(("prop-shared-prefix-xxh3_128", shared(0)));
    out.push(("prop-shared-prefix-vllm_sha256", shared(4)));
    // fixed sequence 2: pressure, lazy eviction of cached free blocks from the head
    let pressure = |algo| {
        hc(8, 4, algo, false)
            .a(0, 0, 24)
            .free(FREE, 0)
            .a(1, 1, 20)
            .a(2, 0, 24)
            .free(FREE, 1)
            .a(2, 0, 24)
            .done()
    };
    out.push(("prop-pressure-xxh3_128", pressure(0)));
    out.push(("prop-pressure-vllm_sha256_cbor", pressure(2)));
    // fixed sequence 3: decode growth registers new full blocks; a second turn hits them
    let growth = |algo| {
        hc(16, 4, algo, false)
            .a(0, 0, 6)
            .append(0, &[1, 2, 3, 4, 5, 6, 7])
            .free(FREE, 0)
            .admit(1, P(0, 6, &[1, 2, 3, 4, 5, 6, 7, 9]), 0, 0)
            .done()
    };
    out.push(("prop-decode-growth-xxh3_128", growth(0)));
    out.push(("prop-decode-growth-sha256", growth(1)));
    // fixed sequence 4: errors (duplicate, unknown, evict in use / out of range, reset in use, empty prompt)
    let errors = |algo| {
        hc(8, 2, algo, false)
            .a(0, 0, 5)
            .a(0, 1, 5)
            .free(FREE, 4)
            .append(4, &[1])
            .evict_blocks(&[1])
            .evict_blocks(&[0])
            .evict_blocks(&[8])
            .push(&[RESET])
            .a(1, 0, 0)
            .free(FREE, 0)
            .free(FREE, 0)
            .evict_blocks(&[1, 2, 3, 3])
            .push(&[RESET])
            .done()
    };
    out.push(("prop-errors-xxh3_128", errors(0)));
    out.push(("prop-errors-vllm_xxhash", errors(5)));
    // fixed sequence 5: smallest pool
    let smallest =
        |algo| hc(2, 1, algo, false).a(0, 0, 1).a(1, 0, 1).free(FREE, 0).a(1, 0, 1).a(2, 0, 2).done();
    out.push(("prop-smallest-pool-xxh3_128", smallest(0)));
    out.push(("prop-smallest-pool-vllm_xxhash_cbor", smallest(3)));
    // property-test mix: the three extra-key specs, lookups, skip_reading
    out.push((
        "prop-specs-and-lookups",
        hc(27, 3, 2, false)
            .admit(0, P(0, 24, &[1, 2]), 1, 0)
            .admit(1, P(0, 24, &[1, 2]), 2, 0)
            .admit(2, P(0, 24, &[1, 2]), 0, 1)
            .lookup(LOOKUP, P(0, 24, &[3]), 1)
            .lookup(LOOKUP, P(1, 10, &[]), 2)
            .free(FREE, 1)
            .admit(3, P(0, 24, &[1, 2, 0]), 2, 0)
            .push(&[INTROSPECT])
            .done(),
    ));
    // decode steps through append_batch (no offsets, CSR offsets, bad offsets, duplicates)
    out.push((
        "append-batch-decode",
        hc(24, 4, 0, true)
            .a(0, 0, 10)
            .a(1, 1, 9)
            .append_batch(APPEND_BATCH, &[0, 1], &[0, 0], &[0], &[1, 2])
            .append_batch(APPEND_BATCH, &[0, 1], &[3, 1], &[2], &[1, 2, 3, 0])
            .append_batch(APPEND_BATCH, &[0, 1], &[1, 1], &[1], &[1, 2, 3])
            .append_batch(APPEND_BATCH, &[0, 1], &[2, 2], &[3, 5], &[1, 2, 3, 0])
            .append_batch(APPEND_BATCH, &[0, 0], &[1, 1], &[2], &[1, 2])
            .append_batch(APPEND_BATCH, &[0, 5], &[1, 1], &[2], &[1, 2])
            .push(&[TAKE_EVENTS])
            .free_batch(FREE_BATCH, &[0, 1])
            .a(2, 0, 14)
            .push(&[TAKE_EVENTS])
            .done(),
    ));
    // block tables and slot mappings (valid, narrow, wrong length, unknown id, long query)
    out.push((
        "tables-and-slots",
        hc(20, 3, 0, false)
            .a(0, 0, 7)
            .a(1, 0, 11)
            .tables(BLOCK_TABLES, &[0, 1], 4, 0)
            .tables(BLOCK_TABLES, &[0, 1], 3, 0)
            .tables(BLOCK_TABLES, &[0, 1], 4, 1)
            .tables(BLOCK_TABLES, &[0, 6], 4, 0)
            .tables(BLOCK_TABLES, &[], 0, 0)
            .slots(SLOT_MAPPING, &[0, 1], &[1, 11], 0)
            .slots(SLOT_MAPPING, &[0, 1], &[255, 1], 0)
            .slots(SLOT_MAPPING, &[0, 1], &[1, 1], 1)
            .slots(SLOT_MAPPING, &[1, 7], &[1, 254], 0)
            .done(),
    ));
    // a refused admission is retried (pending hashes), then fits after a free
    out.push((
        "pending-retry",
        hc(7, 4, 4, true)
            .a(0, 1, 20)
            .a(1, 0, 24)
            .a(1, 0, 24)
            .free(FREE, 0)
            .a(1, 0, 24)
            .push(&[TAKE_EVENTS, INTROSPECT])
            .done(),
    ));
    // extreme token values (wide encodings), narrow i32 tokens, multimodal and invalid specs
    out.push((
        "extreme-tokens-and-specs",
        hc(30, 2, 3, true)
            .admit(0, raw(&[248, 249, 250, 251, 252, 253, 254, 255]), 0, 0)
            .admit(1, raw(&[0, 1, 2, 3, 0, 1]), 0, 2)
            .admit(2, raw(&[0, 1, 2, 3, 0, 1, 2]), 5, 0)
            .admit_mm(3, raw(&[0, 1, 2, 3]), [2, 3, 8, 2], 0)
            .admit_mm(3, raw(&[0, 1, 2, 3]), [5, 3, 4, 2], 0)
            .admit_mm(4, raw(&[0, 1, 2, 3]), [255, 2, 40, 2], 0)
            .admit(4, raw(&[0, 1, 2, 3]), 3, 0)
            .admit(5, raw(&[0, 1, 2, 3]), 4, 0)
            .admit(6, raw(&[0, 1, 2, 3]), 7, 0)
            .push(&[INTROSPECT, TAKE_EVENTS])
            .done(),
    ));
    // invalid evict_blocks ids and a reset with and without running requests
    out.push((
        "evict-and-reset",
        hc(12, 2, 0, true)
            .a(0, 2, 9)
            .free(FREE, 0)
            .evict_blocks(&[255, 254, 253])
            .evict_blocks(&[1, 2, 13, 12])
            .evict_blocks(&[2, 3, 4, 5, 2])
            .a(1, 2, 9)
            .push(&[RESET])
            .free(FREE, 1)
            .push(&[RESET, TAKE_EVENTS])
            .done(),
    ));
    // invalid sizes: num_blocks 0 / 1 / huge, block_size 0 / above 2^20
    out.push(("bad-sizes-nb0", hc(0, 4, 0, false).a(0, 0, 3).done()));
    out.push(("bad-sizes-nb1", hc(1, 4, 0, false).a(0, 0, 3).done()));
    out.push(("bad-sizes-nb-huge", hc(254, 4, 0, false).done()));
    out.push(("bad-sizes-bs0", hc(9, 0, 0, false).done()));
    out.push(("bad-sizes-bs-huge", hc(9, 255, 0, false).done()));
    out
}

// ------------------------------------------------------------------ radix tree

/// Radix-tree header: page size byte (0 -> 1, 1 -> 2, 2 -> 4, 3 -> 16, ...),
/// policy byte, events.
fn rt(ps: u8, policy: u8, events: bool) -> B {
    B::with_header([ps, policy, u8::from(events)])
}

impl B {
    fn rmatch(&mut self, p: P<'_>, ns: u8) -> &mut Self {
        self.push(&[radix_tree::op::MATCH]).prompt(p).push(&[ns])
    }
    fn rprobe(&mut self, p: P<'_>, ns: u8) -> &mut Self {
        self.push(&[radix_tree::op::PROBE]).prompt(p).push(&[ns])
    }
    /// Insert with fresh ascending values.
    fn ins(&mut self, p: P<'_>, ns: u8) -> &mut Self {
        self.insert(p, ns, 0, 0, 0, 0, &[])
    }
    #[allow(clippy::too_many_arguments)]
    fn insert(&mut self, p: P<'_>, ns: u8, prio: u8, mode: u8, arg: u8, extra: u8, vals: &[u8]) -> &mut Self {
        self.push(&[radix_tree::op::INSERT]).prompt(p).push(&[ns, prio, mode, arg, extra]).push(vals)
    }
    fn lock(&mut self, i: u8) -> &mut Self {
        self.push(&[radix_tree::op::LOCK, i])
    }
    fn unlock(&mut self, i: u8) -> &mut Self {
        self.push(&[radix_tree::op::UNLOCK, i])
    }
    fn revict(&mut self, k: u8) -> &mut Self {
        self.push(&[radix_tree::op::EVICT, k])
    }
}

/// The radix-tree seeds: the unit-test scenarios of `rust/core/radix/tests.rs`
/// (split example, shared prefix per page size, LRU with a locked path,
/// mid-edge split keeping a lock, strict-prefix insert, duplicates, namespaces,
/// page alignment, policies, stale handles, events) and its proptest's ops.
#[must_use]
#[allow(clippy::too_many_lines)]
pub fn radix_tree() -> Vec<Seed> {
    use radix_tree::op::{INTROSPECT, RAW_HANDLE, RESET, TAKE_EVENTS};
    let mut out = Vec::new();
    // handles: 0 = root, 1 and 2 = raw (unknown), matches append from 3
    out.push((
        "split-example",
        rt(0, 0, false)
            .ins(P(0, 6, &[]), 0)
            .ins(P(0, 3, &[1, 2, 3]), 0)
            .rmatch(P(0, 3, &[1, 2, 3]), 0)
            .push(&[INTROSPECT])
            .done(),
    ));
    for (name, ps) in [("shared-prefix-ps1", 0), ("shared-prefix-ps16", 3)] {
        out.push((
            name,
            rt(ps, 0, false)
                .ins(P(0, 24, &[0, 1, 2, 3, 0, 1, 2, 3]), 0)
                .rmatch(P(0, 24, &[1, 1, 1, 1]), 0)
                .rprobe(P(0, 20, &[]), 0)
                .push(&[INTROSPECT])
                .done(),
        ));
    }
    out.push((
        "lru-locked-path-survives",
        rt(0, 0, false)
            .ins(P(0, 8, &[]), 0)
            .ins(P(1, 8, &[]), 0)
            .ins(P(2, 8, &[]), 0)
            .rmatch(P(0, 8, &[]), 0)
            .lock(3)
            .revict(255)
            .rmatch(P(0, 8, &[]), 0)
            .unlock(3)
            .unlock(3)
            .revict(4)
            .done(),
    ));
    out.push((
        "mid-edge-split-keeps-lock",
        rt(1, 0, false)
            .ins(P(0, 12, &[]), 0)
            .rmatch(P(0, 12, &[]), 0)
            .lock(3)
            .rmatch(P(0, 6, &[]), 0)
            .lock(4)
            .revict(255)
            .unlock(3)
            .revict(255)
            .unlock(4)
            .revict(255)
            .done(),
    ));
    out.push((
        "strict-prefix-insert-and-reinsert",
        rt(0, 0, false)
            .ins(P(0, 10, &[]), 0)
            .ins(P(0, 5, &[]), 0)
            .ins(P(0, 10, &[]), 0)
            .insert(P(0, 10, &[]), 0, 0, 2, 0, 0, &[])
            .push(&[INTROSPECT])
            .done(),
    ));
    out.push((
        "duplicates-and-tree-values-refused",
        rt(0, 0, false)
            .ins(P(1, 6, &[]), 0)
            .ins(P(1, 6, &[2, 2]), 0)
            .insert(P(1, 6, &[3]), 0, 0, 3, 0, 0, &[1, 2, 3, 4, 5, 6, 7])
            .insert(P(1, 6, &[3]), 0, 0, 3, 0, 0, &[40, 41, 42, 43, 44, 45, 41])
            .insert(P(2, 3, &[]), 0, 0, 0, 0, 3, &[])
            .insert(P(2, 3, &[]), 0, 0, 0, 0, 2, &[])
            .insert(P(2, 5, &[]), 0, 0, 4, 0, 0, &[])
            .insert(P(2, 5, &[]), 0, 0, 5, 0, 0, &[])
            .done(),
    ));
    out.push((
        "namespaces-isolate",
        rt(0, 0, true)
            .ins(P(0, 8, &[]), 1)
            .rmatch(P(0, 8, &[]), 0)
            .rmatch(P(0, 8, &[]), 2)
            .rmatch(P(0, 8, &[]), 1)
            .ins(P(0, 8, &[]), 3)
            .rmatch(P(0, 8, &[]), 3)
            .revict(3)
            .push(&[TAKE_EVENTS, INTROSPECT])
            .done(),
    ));
    out.push((
        "page-alignment-ps4",
        rt(2, 0, false)
            .insert(P(0, 10, &[]), 0, 0, 8, 0, 0, &[])
            .ins(P(0, 10, &[]), 0)
            .rmatch(P(0, 3, &[]), 0)
            .rmatch(P(0, 7, &[]), 0)
            .ins(P(0, 4, &[1, 1, 1, 1]), 0)
            .push(&[INTROSPECT])
            .done(),
    ));
    let policies = [
        "policy-lru",
        "policy-lfu",
        "policy-fifo",
        "policy-mru",
        "policy-filo",
        "policy-priority",
        "policy-slru",
    ];
    for (i, name) in policies.into_iter().enumerate() {
        let policy = u8::try_from(i).expect("7 policies") | 8; // slru threshold 1
        let seed = rt(0, policy, false)
            .insert(P(0, 6, &[]), 0, 3, 0, 0, 0, &[])
            .insert(P(1, 6, &[]), 0, 1, 0, 0, 0, &[])
            .insert(P(2, 6, &[]), 0, 2, 0, 0, 0, &[])
            .rmatch(P(1, 6, &[]), 0)
            .rmatch(P(0, 6, &[]), 0)
            .revict(6)
            .revict(6)
            .revict(6)
            .done();
        out.push((name, seed));
    }
    out.push((
        "handles-go-stale",
        rt(0, 0, false)
            .ins(P(0, 5, &[]), 0)
            .rmatch(P(0, 5, &[]), 0)
            .revict(255)
            .lock(3)
            .unlock(3)
            .ins(P(0, 5, &[]), 0)
            .rmatch(P(0, 5, &[]), 0)
            .lock(4)
            .push(&[RAW_HANDLE, 1, 4, 0, 0, 0, 0, 0, 0, 0])
            .lock(5)
            .push(&[RAW_HANDLE, 0, 1, 0, 0, 0, 1, 0, 0, 0])
            .lock(6)
            .lock(0)
            .unlock(0)
            .push(&[RESET])
            .unlock(4)
            .done(),
    ));
    out.push((
        "events-chain-and-split",
        rt(1, 0, true)
            .ins(P(0, 8, &[]), 2)
            .ins(P(0, 4, &[1, 1, 1, 1]), 2)
            .push(&[TAKE_EVENTS])
            .revict(4)
            .push(&[TAKE_EVENTS, RESET, TAKE_EVENTS])
            .done(),
    ));
    // proptest-style mix with priorities and every op
    out.push((
        "prop-mix",
        rt(1, 5, true)
            .insert(raw(&[0, 1, 2, 0, 1, 2, 0, 1]), 1, 2, 0, 0, 0, &[])
            .rmatch(raw(&[0, 1, 2, 0, 1]), 1)
            .insert(raw(&[0, 1, 2, 1]), 1, 254, 1, 0, 0, &[])
            .lock(3)
            .revict(5)
            .rmatch(raw(&[0, 1, 2, 1, 0]), 1)
            .unlock(3)
            .insert(raw(&[2, 2, 2, 2]), 2, 127, 0, 0, 2, &[])
            .revict(255)
            .push(&[RESET, INTROSPECT])
            .done(),
    ));
    out.push(("bad-page-size-0", rt(4, 0, false).ins(P(0, 4, &[]), 0).done()));
    out.push(("bad-page-size-huge", rt(6, 0, false).done()));
    out.push(("unknown-policy", rt(5, 7, false).ins(P(0, 6, &[]), 0).revict(255).done()));
    // Hybrid components (flags bit 1; see `radix_hybrid`): SWA window 4
    // (bits 2-4 = 2), then SWA 4 + Mamba (bit 5), page sizes 1 and 2.
    // Ops: 0 match, 1 insert [prompt][swa evicted], 2 lock, 3 unlock,
    // 4 evict [kind][n], 5 reset, 6 probe.
    for (name, ps, flags) in
        [("hybrid-swa-ps1", 0u8, 0b0000_1010u8), ("hybrid-swa-mamba-ps2", 1, 0b0010_1010)]
    {
        let mut b = B::with_header([ps, 0, flags]);
        b.push(&[1]).prompt(P(0, 12, &[])).push(&[8]);
        b.push(&[1]).prompt(P(0, 12, &[1, 2])).push(&[0]);
        b.push(&[4, 1, 6]);
        b.push(&[0]).prompt(P(0, 12, &[1, 2]));
        b.push(&[2, 0]);
        b.push(&[4, 1, 24]).push(&[4, 2, 1]).push(&[4, 0, 24]);
        b.push(&[1]).prompt(P(0, 12, &[])).push(&[4]);
        b.push(&[6]).prompt(P(0, 12, &[1]));
        b.push(&[3, 0]).push(&[4, 0, 255]).push(&[5]);
        out.push((name, b.done()));
    }
    out
}

// ----------------------------------------------------------------- radix cache

/// Radix-cache header: pages (< 40), page size byte (as the tree's), policy
/// byte (low bits), events.
fn rc(nb: u8, ps: u8, policy: u8, events: bool) -> B {
    B::with_header([nb, ps, policy | if events { 0x40 } else { 0 }])
}

impl B {
    fn radmit(&mut self, id: u8, p: P<'_>, spec: u8, skip: bool) -> &mut Self {
        self.push(&[radix_cache::op::ADMIT, id]).prompt(p).push(&[spec, u8::from(skip)])
    }
    fn rappend(&mut self, id: u8, tokens: &[u8]) -> &mut Self {
        self.push(&[radix_cache::op::APPEND, id]).list(tokens)
    }
}

/// The radix-cache seeds: the request-cache unit tests of
/// `rust/core/radix/tests.rs` (lifecycle, eviction inside admit, checkpoint,
/// namespaces and errors) plus batches, tables, events and invalid sizes.
#[must_use]
#[allow(clippy::too_many_lines)]
pub fn radix_cache() -> Vec<Seed> {
    use radix_cache::op::{
        APPEND_BATCH, BLOCK_TABLES, CHECKPOINT, EVICT, FREE, FREE_BATCH, INTROSPECT, LOOKUP, RESET,
        SLOT_MAPPING,
    };
    let mut out = Vec::new();
    for (name, ps) in [("lifecycle-ps1", 0), ("lifecycle-ps4", 2)] {
        out.push((
            name,
            rc(39, ps, 0, true)
                .radmit(1, P(0, 20, &[]), 0, false)
                .rappend(1, &[0, 1, 2])
                .free(FREE, 1)
                .lookup(LOOKUP, P(0, 20, &[0, 1, 2, 3]), 0)
                .radmit(2, P(0, 20, &[0, 1, 2, 3]), 0, false)
                .radmit(3, P(0, 20, &[]), 0, false)
                .free_batch(FREE_BATCH, &[2, 3])
                .push(&[INTROSPECT])
                .done(),
        ));
    }
    out.push((
        "eviction-inside-admit",
        rc(11, 0, 0, false)
            .radmit(1, P(0, 6, &[]), 0, false)
            .free(FREE, 1)
            .radmit(2, P(1, 8, &[]), 0, false)
            .radmit(3, raw(&[1, 1, 1]), 0, false)
            .rappend(2, &[0, 1, 2])
            .rappend(2, &[0, 1])
            .done(),
    ));
    out.push((
        "checkpoint-shares-running-prompt",
        rc(32, 1, 0, false)
            .radmit(1, P(0, 9, &[]), 0, false)
            .lookup(LOOKUP, P(0, 9, &[]), 0)
            .push(&[CHECKPOINT, 1])
            .radmit(2, P(0, 9, &[]), 0, false)
            .radmit(3, P(0, 9, &[]), 0, true)
            .push(&[CHECKPOINT, 3])
            .tables(BLOCK_TABLES, &[1, 2, 3], 5, 0)
            .free_batch(FREE_BATCH, &[1, 2, 3])
            .done(),
    ));
    out.push((
        "namespaces-and-errors",
        rc(32, 0, 0, false)
            .radmit(1, P(0, 4, &[]), 1, false)
            .free(FREE, 1)
            .lookup(LOOKUP, P(0, 4, &[1]), 1)
            .lookup(LOOKUP, P(0, 4, &[1]), 0)
            .lookup(LOOKUP, P(0, 4, &[1]), 3)
            .radmit(5, raw(&[]), 0, false)
            .radmit(5, raw(&[1]), 0, false)
            .radmit(5, raw(&[1]), 0, false)
            .free(FREE, 6)
            .push(&[RESET])
            .free(FREE, 5)
            .free(FREE, 5)
            .push(&[RESET])
            .radmit(6, raw(&[1, 2]), 5, false)
            .radmit(6, raw(&[1, 2]), 2, false)
            .radmit(7, raw(&[1, 2]), 4, false)
            .done(),
    ));
    out.push((
        "batches-tables-slots",
        rc(30, 1, 1, true)
            .radmit(0, P(0, 10, &[]), 0, false)
            .radmit(1, P(0, 12, &[]), 0, false)
            .append_batch(APPEND_BATCH, &[0, 1], &[0, 0], &[0], &[1, 2])
            .append_batch(APPEND_BATCH, &[0, 1], &[3, 1], &[2], &[1, 2, 3, 0])
            .append_batch(APPEND_BATCH, &[1, 0], &[1, 1], &[3, 2], &[1, 2])
            .append_batch(APPEND_BATCH, &[1, 1], &[1, 1], &[2], &[1, 2])
            .tables(BLOCK_TABLES, &[0, 1], 8, 0)
            .tables(BLOCK_TABLES, &[0, 1], 8, 2)
            .slots(SLOT_MAPPING, &[0, 1], &[1, 5], 0)
            .slots(SLOT_MAPPING, &[0, 1], &[255, 1], 0)
            .push(&[CHECKPOINT, 0, INTROSPECT])
            .free_batch(FREE_BATCH, &[0, 1])
            .push(&[EVICT, 7, INTROSPECT])
            .done(),
    ));
    out.push((
        "pressure-and-policies",
        rc(9, 0, 3, false)
            .radmit(0, P(0, 5, &[]), 0, false)
            .radmit(1, P(1, 5, &[]), 0, false)
            .free(FREE, 0)
            .radmit(2, P(2, 6, &[]), 0, false)
            .push(&[EVICT, 255])
            .free(FREE, 1)
            .radmit(3, P(0, 5, &[]), 0, false)
            .rappend(3, &[1, 1, 1, 1, 1, 1, 1, 1])
            .push(&[RESET])
            .done(),
    ));
    out.push(("bad-sizes-nb1", rc(1, 0, 0, false).radmit(0, raw(&[1]), 0, false).done()));
    out.push(("bad-sizes-ps0", rc(9, 4, 0, false).done()));
    out.push(("bad-sizes-nb-huge", rc(255, 0, 0, false).done()));
    // Hybrid trees (flags bit 7, then `[hy]`: window `hy % 8`, bit 3 Mamba, `hy >> 4` pool sizes).
    out.push((
        "hybrid-swa-decode",
        B::with_header([32, 0, 0xc0])
            .push(&[0x63])
            .radmit(1, P(0, 5, &[]), 0, false)
            .rappend(1, &[1, 2, 3, 0, 1, 2])
            .rappend(1, &[3])
            .radmit(2, P(1, 6, &[]), 0, false)
            .free(FREE, 1)
            .lookup(LOOKUP, P(0, 5, &[1, 2, 3, 0, 1, 2, 3, 0]), 0)
            .radmit(3, P(0, 5, &[1, 2, 3, 0, 1, 2, 3, 0]), 0, false)
            .rappend(3, &[1, 1, 1, 1])
            .push(&[CHECKPOINT, 3, INTROSPECT])
            .free_batch(FREE_BATCH, &[2, 3])
            .push(&[EVICT, 3])
            .done(),
    ));
    out.push((
        "hybrid-mamba-checkpoint",
        B::with_header([24, 1, 0x80])
            .push(&[0x18])
            .radmit(1, P(0, 9, &[]), 0, false)
            .push(&[CHECKPOINT, 1])
            .radmit(2, P(0, 9, &[4]), 0, false)
            .radmit(3, P(2, 3, &[]), 0, false)
            .free(FREE, 1)
            .radmit(3, P(2, 3, &[]), 0, false)
            .free_batch(FREE_BATCH, &[2, 3])
            .push(&[RESET])
            .done(),
    ));
    out.push((
        "hybrid-swa-mamba-pressure",
        B::with_header([12, 0, 0xc3])
            .push(&[0x2a])
            .radmit(0, P(0, 5, &[]), 0, false)
            .rappend(0, &[1, 2, 3, 4])
            .radmit(1, P(1, 4, &[]), 0, false)
            .free(FREE, 0)
            .radmit(2, P(0, 5, &[1, 2, 3, 4, 5]), 0, false)
            .rappend(2, &[1, 1, 1, 1, 1, 1])
            .push(&[EVICT, 255])
            .free_batch(FREE_BATCH, &[1, 2])
            .done(),
    ));
    out
}

/// Every target's seeds.
#[must_use]
pub fn all() -> Vec<(&'static str, Vec<Seed>)> {
    vec![
        ("hash_chain", hash_chain()),
        ("radix_tree", radix_tree()),
        ("radix_cache", radix_cache()),
        ("pages", pages()),
        ("lifecycle", lifecycle()),
        ("groups", groups()),
    ]
}

// ------------------------------------------------------------------ groups

/// The multi-group manager: a shared prompt admitted twice (the second one
/// hits), prefill and decode steps, windows sliding, frees, pops, bad hits,
/// evictions and a reset, on full + sliding window, full + MLA + a wide
/// sliding window under EAGLE, full + chunked local, full + sliding
/// window + align-mode Mamba layouts, and full + a Mamba group on twice the
/// hash block with partial hash hits (speculative blocks and checkpoints;
/// EAGLE, lookahead and the shared-prefix checkpoint).
fn groups() -> Vec<Seed> {
    use crate::groups::op;
    let ops = |v: &mut Vec<u8>| {
        v.extend_from_slice(&[op::ADMIT, 0, 0, 39, 63, op::STEP, 0, 5, 0, op::STEP, 0, 0, 1, op::FREE, 0]);
        v.extend_from_slice(&[
            op::ADMIT,
            1,
            0,
            39,
            63,
            op::STEP,
            1,
            0,
            0,
            op::STEP,
            1,
            0,
            0,
            op::STEP,
            1,
            0,
            2,
        ]);
        v.extend_from_slice(&[
            op::REMOVE_SKIPPED,
            1,
            60,
            op::BAD_HIT,
            2,
            0,
            5,
            op::EVICT,
            3,
            op::ADMIT,
            2,
            1,
            80,
            20,
        ]);
        v.extend_from_slice(&[
            op::STEP,
            2,
            30,
            0,
            op::POP,
            1,
            op::FREE,
            2,
            op::RESET,
            op::ADMIT,
            3,
            0,
            39,
            10,
        ]);
    };
    let mut out = Vec::new();
    for (name, header) in [
        ("full-swa", vec![40u8, 1, 1, 0, 0, 2, 7, 0, 0]),
        ("full-mla-wide-swa-eagle", vec![50, 1, 2, 0, 0, 1, 0, 2, 0x89, 1, 0]),
        ("full-chunked-local", vec![50, 1, 1, 0, 0, 3, 15, 0, 0]),
        ("full-swa-mamba", vec![50, 1, 2, 0, 0, 2, 7, 4, 0, 0, 0]),
        // Full attention on the hash block beside align-mode Mamba on twice it: partial hash
        // hits (more-flags bit 0) with speculative blocks (bit 1) and prefill checkpoints
        // (bit 2); then under EAGLE with hash lookahead (bit 3) and the shared-prefix
        // checkpoint (bit 4).
        ("full-mamba-partial-spec-ckpt", vec![48, 1, 1, 0, 0, 4, 0x80, 0, 0b0000_0111]),
        ("full-mamba-partial-eagle-lookahead-shared", vec![48, 1, 1, 0, 0, 4, 0x80, 1, 0b0001_1001]),
    ] {
        let mut v = header;
        ops(&mut v);
        out.push((name, v));
    }
    // A two-token window on twice the block beside full attention (sparse tails), a retention
    // interval of two scheduler blocks (flags bit 4, bits 5-6 = 2), zeroing logs (bit 7),
    // and loose blocks taken, cached for each group and freed.
    let mut v = vec![50u8, 1, 1, 0, 0, 2, 0x91, 0b1101_0000, 0];
    ops(&mut v);
    v.extend_from_slice(&[op::LOOSE, 3, 0, 1, op::LOOSE, 2, 1, 2, op::LOOSE, 70, 0, 0]);
    ops(&mut v);
    out.push(("full-wide-swa-retention-zeroing-loose", v));
    out
}

// ------------------------------------------------------------------ lifecycle

/// Lifecycle header: `design` 0 (hash chain) or 1 (radix), `nb = 2 + byte % 38`
/// blocks, block/page size byte, flags (bit 0 events; the algorithm or the policy above).
fn lc(design: u8, nb: u8, size: u8, flags: u8) -> B {
    B(vec![design, nb, size, flags])
}

impl B {
    /// `admit_chunk` of `p`, no spec, reading the cache, with step options
    /// `[chunk, lookahead, flags, external, reserved]`.
    fn achunk(&mut self, id: u8, p: P<'_>, o: [u8; 5]) -> &mut Self {
        self.push(&[lifecycle::op::ADMIT_CHUNK, id]).prompt(p).push(&[0, 0]).push(&o)
    }
    /// A step derived from the request's counters: `1 + n % remaining`
    /// positions, or with `drafts` (token bytes) the rest plus the drafts.
    fn sched(&mut self, id: u8, n: u8, drafts: &[u8], lookahead: u8) -> &mut Self {
        self.push(&[lifecycle::op::SCHEDULE, id, 0, n]).list(drafts).push(&[lookahead, 0])
    }
    /// A commit derived from the request's counters: `r` picks the rejected
    /// drafts, `sampled` the ids filling its placeholders.
    fn commit(&mut self, id: u8, r: u8, sampled: &[u8]) -> &mut Self {
        self.push(&[lifecycle::op::COMMIT, id, 0, r]).list(sampled)
    }
    /// Every running request scheduled one step (no drafts), `lookahead` slots each.
    fn sched_all(&mut self, running: usize, lookahead: u8) -> &mut Self {
        self.push(&[lifecycle::op::SCHEDULE_BATCH, 0]);
        for _ in 0..running {
            self.push(&[0, 0]);
        }
        self.push(&[lookahead])
    }
    /// Every running request commits one sampled id (`mode` 0x40: no offsets).
    fn commit_all(&mut self, running: usize, mode: u8) -> &mut Self {
        self.push(&[lifecycle::op::COMMIT_BATCH, mode]);
        for i in 0..running {
            self.push(&[0, 1, len_u8(i % 4)]);
        }
        self
    }
}

/// The engine lifecycle over both designs: chunked prefill, async decode
/// steps, drafts accepted and rejected, preempt / resume, a delayed external
/// transfer, batches of the running set (good and bad), and the reset guard.
#[must_use]
pub fn lifecycle() -> Vec<Seed> {
    use lifecycle::op::{
        ADMIT, APPEND, COMMIT_BATCH, FINISH, FINISH_TRANSFER, FREE, FREE_BATCH, INTROSPECT, PREEMPT, RESET,
        RESUME, SCHEDULE_BATCH,
    };
    let mut out = Vec::new();
    // design, size byte, flags (events on; sha256 for the chain, lru for the tree), seed names
    let chain = ["prefill-decode-chain", "drafts-chain", "preempt-chain", "external-chain", "errors-chain"];
    let radix = ["prefill-decode-radix", "drafts-radix", "preempt-radix", "external-radix", "errors-radix"];
    for (design, size, flags, names) in [(0u8, 3u8, 3u8, chain), (1, 2, 1, radix)] {
        // A 22-token prompt in chunks of 4, 8 and 10, then decode steps,
        // the second one async (scheduled before the first's id is committed).
        out.push((
            names[0],
            lc(design, 30, size, flags)
                .achunk(1, P(0, 20, &[1, 2]), [4, 1, 0, 0, 0])
                .sched(1, 7, &[], 1)
                .sched(1, 9, &[], 0)
                .commit(1, 0, &[1])
                .sched(1, 0, &[], 0)
                .sched(1, 0, &[], 0)
                .commit(1, 0, &[2, 3])
                .achunk(2, P(0, 20, &[1, 2]), [0, 0, 0, 0, 0])
                .push(&[INTROSPECT])
                .sched_all(2, 1)
                .commit_all(2, 0)
                .sched_all(2, 0)
                .commit_all(2, 0x40)
                .push(&[FINISH, 1, FREE, 2, INTROSPECT])
                .done(),
        ));
        // Drafts: two proposed, one rejected; then three, all accepted; a
        // batch with drafts through draft offsets.
        out.push((
            names[1],
            lc(design, 30, size, flags)
                .achunk(3, P(1, 12, &[]), [0, 2, 0, 0, 0])
                .commit(3, 0, &[1])
                .sched(3, 0, &[2, 1], 1)
                .commit(3, 1, &[2])
                .sched(3, 0, &[1, 3], 0)
                .commit(3, 0, &[0])
                .push(&[SCHEDULE_BATCH, 0, 0, 1, 2, 0])
                .push(&[COMMIT_BATCH, 0, 1, 1, 3])
                .push(&[FREE, 3])
                .done(),
        ));
        // A small pool: the second admission refused (must_fit), the first
        // preempted, the second admitted, both resumed in turn.
        out.push((
            names[2],
            lc(design, 6, size, flags)
                .achunk(1, P(2, 24, &[]), [0, 0, 0, 0, 0])
                .achunk(2, P(2, 24, &[0, 1]), [0, 0, 1, 0, 0])
                .push(&[PREEMPT, 1])
                .achunk(2, P(2, 24, &[0, 1]), [0, 0, 0, 0, 0])
                .push(&[RESUME, 1, 0, 0, 0, 0, 0])
                .push(&[PREEMPT, 2, PREEMPT, 2, RESUME, 1, 3, 0, 1, 0, 0])
                .push(&[RESUME, 2, 0, 0, 0, 0, 0, FINISH, 1, FINISH, 2])
                .done(),
        ));
        // External tokens: a delayed transfer (nothing scheduled until it
        // lands, a second finish_transfer refused), then one loaded at once.
        out.push((
            names[3],
            lc(design, 30, size, flags)
                .achunk(4, P(0, 16, &[3]), [0, 1, 2, 12, 0])
                .sched(4, 0, &[], 0)
                .push(&[FINISH_TRANSFER, 4, FINISH_TRANSFER, 4])
                .sched(4, 0, &[], 0)
                .achunk(5, P(0, 16, &[3]), [2, 0, 1, 9, 1])
                .push(&[INTROSPECT, FREE_BATCH, 2, 4, 5])
                .done(),
        ));
        // The one-chunk calls beside the engine ones, bad batches (unknown
        // and repeated ids, a count short, corrupt offsets), the reset
        // guard, a chunk of 0 and a huge lookahead.
        out.push((
            names[4],
            lc(design, 12, size, flags)
                .push(&[ADMIT, 1])
                .prompt(P(0, 8, &[]))
                .push(&[0, 0, APPEND, 1, 2, 0, 1])
                .push(&[SCHEDULE_BATCH, 0x22, 3, 1, 1, 7, 0, 0, 0, 0, 0, 0, 0, 0])
                .push(&[COMMIT_BATCH, 0x22, 2, 1, 1, 0, 0, 0, 0])
                .push(&[RESET, FREE_BATCH, 2, 1, 1, FREE, 1, FREE, 1, RESET])
                .achunk(6, raw(&[0, 1, 2, 3, 0, 1, 2, 3, 0]), [8, 255, 1, 0, 0])
                .achunk(6, raw(&[0, 1, 2, 3, 0, 1, 2, 3, 0]), [1, 0, 1, 0, 2])
                .done(),
        ));
    }
    out
}

/// Page/slot conversions (byte format in `pages.rs`): valid runs for an
/// unrolled and a generic page size, a tail, an off-by-one run, a negative
/// slot, and a run that would wrap past `i32::MAX`.
#[must_use]
pub fn pages() -> Vec<Seed> {
    // page size selectors: 0 -> 1, 2 -> 3, 7 -> 16 (see `pages::SIZES`)
    vec![
        ("runs-ps16", vec![7, 0, 3, 0, 0, 1, 0, 0, 9, 1, 2, 2, 0, 5]),
        ("runs-ps3", vec![2, 0, 4, 0, 0, 0, 0, 2, 1, 0, 2]),
        ("off-by-one-ps16", vec![7, 0, 1, 0, 3, 2, 0, 7]),
        ("negative-ps1", vec![0, 0, 5, 0, 1, 255, 255, 255, 255]),
        ("wraps-ps3", vec![2, 1, 254, 255, 255, 127, 1, 255, 255, 255, 127, 1, 0, 0, 0, 128]),
    ]
}

/// The file name of seed `i`.
#[must_use]
pub fn file_name(i: usize, name: &str) -> String {
    format!("seed-{i:02}-{name}")
}
