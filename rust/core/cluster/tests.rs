//! Unit tests (streams, encodings) and a property test of random batches
//! against a brute-force model (per worker: hash -> announcement count).

use std::collections::HashMap;

use proptest::prelude::*;
use proptest::test_runner::Config as ProptestConfig;

use super::holders::LIST_MAX;
use super::{ClusterIndex, Outcome, Status, WorkerId};
use crate::core::wire::batch::{encode_batch, Tagging};
use crate::core::wire::event::{Removed, Stored, WireEvent};
use crate::core::wire::msgpack::{
    write_array_len, write_bin, write_f64, write_int, write_nil, write_str, write_struct_map_len,
};

const BS: i64 = 4;

fn stored(hashes: &[u64]) -> WireEvent {
    WireEvent::Stored(Box::new(Stored {
        block_hashes: hashes.to_vec(),
        parent_block_hash: None,
        token_ids: vec![1; hashes.len() * 4],
        block_size: BS,
        ..Stored::default()
    }))
}

fn removed(hashes: &[u64]) -> WireEvent {
    WireEvent::Removed(Removed { block_hashes: hashes.to_vec(), ..Removed::default() })
}

fn payload(events: &[WireEvent], tagging: Tagging) -> Vec<u8> {
    let mut out = Vec::new();
    encode_batch(&mut out, 1.5, events, None, tagging);
    out
}

fn ov(ix: &ClusterIndex, hashes: &[u64]) -> Vec<u32> {
    let mut out = Vec::new();
    ix.overlaps(hashes, &mut out);
    out
}

#[test]
fn stores_removes_and_counts_repeats() {
    let mut ix = ClusterIndex::new(BS).expect("valid");
    let a = ix.add_worker("a", 0).expect("room");
    let b = ix.add_worker("b", 0).expect("room");
    let p = payload(&[stored(&[1, 2, 3]), stored(&[2])], Tagging::Map);
    assert_eq!(ix.apply(a, Some(0), &p).expect("known"), Outcome::Applied);
    assert_eq!(
        ix.apply(b, Some(0), &payload(&[stored(&[1, 2])], Tagging::Array)).expect("known"),
        Outcome::Applied
    );
    ix.check_invariants().expect("ok");
    assert_eq!(ov(&ix, &[1, 2, 3, 4]), vec![3, 2]);
    assert_eq!(ix.refs(2, a), 2);
    // One removal of block 2 leaves a's second announcement.
    ix.apply(a, Some(1), &payload(&[removed(&[2])], Tagging::Map)).expect("known");
    assert_eq!(ov(&ix, &[1, 2, 3]), vec![3, 2]);
    ix.apply(a, Some(2), &payload(&[removed(&[2, 9])], Tagging::Map)).expect("known");
    assert_eq!(ov(&ix, &[1, 2, 3]), vec![1, 2]);
    assert_eq!(ix.worker(a).expect("present").stats.unknown_removals, 1);
    ix.apply(b, Some(1), &payload(&[WireEvent::Cleared], Tagging::Map)).expect("known");
    assert_eq!(ov(&ix, &[1]), vec![1, 0]);
    ix.check_invariants().expect("ok");
    assert_eq!(ix.num_pairs(), 2);
}

#[test]
fn signed_and_bytes_hashes_match_unsigned() {
    let h: u64 = 0xfedc_ba98_7654_3210;
    let mut ix = ClusterIndex::new(BS).expect("valid");
    let a = ix.add_worker("a", 0).expect("room");
    for form in 0..2 {
        let mut p = Vec::new();
        write_array_len(&mut p, 3);
        write_f64(&mut p, 0.0);
        write_array_len(&mut p, 1);
        write_struct_map_len(&mut p, 4, 16);
        write_str(&mut p, "type");
        write_str(&mut p, "BlockStored");
        write_str(&mut p, "block_hashes");
        write_array_len(&mut p, 1);
        if form == 0 {
            #[allow(clippy::cast_possible_wrap)]
            write_int(&mut p, h as i64);
        } else {
            let mut b = vec![0xaa; 24];
            b.extend_from_slice(&h.to_be_bytes());
            write_bin(&mut p, &b);
        }
        write_str(&mut p, "token_ids");
        write_array_len(&mut p, 4);
        for _ in 0..4 {
            write_int(&mut p, 7);
        }
        write_str(&mut p, "block_size");
        write_int(&mut p, BS);
        write_nil(&mut p);
        ix.apply(a, None, &p).expect("known");
        assert_eq!(ix.refs(h, a), form + 1);
    }
}

#[test]
fn stream_gap_duplicate_restart_malformed() {
    let mut ix = ClusterIndex::new(BS).expect("valid");
    let a = ix.add_worker("a", 0).expect("room");
    let b = ix.add_worker("b", 0).expect("room");
    assert_eq!(ix.worker(a).expect("present").status, Status::Resyncing);
    let p0 = payload(&[stored(&[1])], Tagging::Map);
    let p1 = payload(&[stored(&[2])], Tagging::Map);
    let p2 = payload(&[stored(&[3])], Tagging::Map);
    ix.apply(b, Some(0), &p0).expect("known");
    assert_eq!(ix.apply(a, Some(0), &p0).expect("known"), Outcome::Applied);
    assert_eq!(ix.worker(a).expect("present").status, Status::Live);
    assert_eq!(ix.apply(a, Some(2), &p2).expect("known"), Outcome::Gap { expected: 1 });
    assert_eq!(ix.apply(a, Some(1), &p1).expect("known"), Outcome::Applied);
    assert_eq!(ix.apply(a, Some(2), &p2).expect("known"), Outcome::Applied);
    assert_eq!(ix.apply(a, Some(1), &p1).expect("known"), Outcome::Duplicate);
    assert_eq!(ov(&ix, &[1, 2, 3]), vec![3, 1]);
    // Restart: a different batch at sequence 0.
    let q0 = payload(&[stored(&[5])], Tagging::Map);
    assert_eq!(ix.apply(a, Some(0), &q0).expect("known"), Outcome::Restarted);
    assert_eq!(ov(&ix, &[1]), vec![0, 1]);
    assert_eq!(ov(&ix, &[5]), vec![1, 0]);
    // Restart seen mid-stream: state dropped, replay from 0 asked for.
    let mut ix2 = ix.clone();
    assert_eq!(ix2.apply(a, Some(0), &p2).expect("known"), Outcome::Restarted);
    // Gap given up: degraded until a clear.
    assert_eq!(ix.apply(a, Some(4), &p2).expect("known"), Outcome::Gap { expected: 1 });
    ix.give_up(a, 4).expect("known");
    assert_eq!(ix.worker(a).expect("present").status, Status::Degraded);
    assert_eq!(ix.apply(a, Some(4), &p2).expect("known"), Outcome::Applied);
    assert_eq!(ix.worker(a).expect("present").status, Status::Degraded);
    ix.apply(a, Some(5), &payload(&[WireEvent::Cleared, stored(&[8])], Tagging::Map)).expect("known");
    assert_eq!(ix.worker(a).expect("present").status, Status::Live);
    // Malformed: counted, degraded, nothing applied, b untouched.
    let before = ov(&ix, &[1, 8]);
    for bad in [&b"\x93\xcb"[..], b"", b"\xc1", &p2[..p2.len() - 1]] {
        assert!(matches!(ix.apply(a, None, bad).expect("known"), Outcome::Malformed(_)));
    }
    let wrong_bs = {
        let mut e = stored(&[9]);
        if let WireEvent::Stored(s) = &mut e {
            s.block_size = 8;
        }
        payload(&[e], Tagging::Map)
    };
    assert!(matches!(ix.apply(a, None, &wrong_bs).expect("known"), Outcome::Malformed(_)));
    assert_eq!(ix.worker(a).expect("present").stats.malformed, 5);
    assert_eq!(ov(&ix, &[1, 8]), before);
    // Unknown worker slot: an error, counted.
    assert!(ix.apply(WorkerId(7), Some(0), &p0).is_err());
    assert_eq!(ix.unknown_worker_batches(), 1);
    ix.check_invariants().expect("ok");
}

#[test]
fn remove_worker_and_slot_reuse() {
    let mut ix = ClusterIndex::new(BS).expect("valid");
    let ids: Vec<WorkerId> = (0..3).map(|i| ix.add_worker(&format!("w{i}"), 0).expect("room")).collect();
    for &w in &ids {
        ix.store_hashes(w, &[1, 2, 3]).expect("known");
    }
    ix.remove_worker(ids[1]).expect("known");
    ix.check_invariants().expect("ok");
    assert_eq!(ov(&ix, &[1, 2, 3]), vec![3, 0, 3]);
    let again = ix.add_worker("w1", 0).expect("room");
    assert_eq!(again, ids[1]);
    assert_eq!(ov(&ix, &[1, 2, 3]), vec![3, 0, 3]);
    ix.remove_worker(ids[2]).expect("known");
    assert_eq!(ix.slots(), 2);
    assert!(ix.remove_worker(ids[2]).is_err());
}

#[test]
fn many_holders_switch_to_bitset_and_back() {
    let mut ix = ClusterIndex::new(BS).expect("valid");
    let n = LIST_MAX * 3;
    let ids: Vec<WorkerId> = (0..n).map(|i| ix.add_worker(&format!("w{i}"), 0).expect("room")).collect();
    for (i, &w) in ids.iter().enumerate() {
        let hs: Vec<u64> = (0..=(i as u64 % 7)).collect();
        ix.store_hashes(w, &hs).expect("known");
        ix.check_invariants().expect("ok");
    }
    let got = ov(&ix, &[0, 1, 2, 3, 4, 5, 6, 7]);
    for (i, g) in got.iter().enumerate() {
        assert_eq!(*g as usize, i % 7 + 1);
    }
    for &w in &ids[..n - 2] {
        ix.remove_hashes(w, &[0]).expect("known");
        ix.check_invariants().expect("ok");
    }
    assert_eq!(ov(&ix, &[0]).iter().filter(|&&x| x == 1).count(), 2);
}

// ---------------------------------------------------------------- proptest

#[derive(Clone, Debug)]
enum Op {
    Batch(usize, Vec<(u8, Vec<u64>)>, bool),
    Add,
    Remove(usize),
    Query(Vec<u64>),
}

fn op() -> impl Strategy<Value = Op> {
    let hashes = proptest::collection::vec(0u64..24, 0..6);
    let ev = (0u8..10, hashes.clone());
    prop_oneof![
        6 => (0usize..8, proptest::collection::vec(ev, 0..5), any::<bool>()).prop_map(|(w, e, t)| Op::Batch(w, e, t)),
        1 => Just(Op::Add),
        1 => (0usize..8).prop_map(Op::Remove),
        2 => hashes.prop_map(Op::Query),
    ]
}

#[derive(Default)]
struct Model {
    workers: Vec<Option<HashMap<u64, u32>>>,
}

impl Model {
    fn overlaps(&self, hashes: &[u64]) -> Vec<u32> {
        self.workers
            .iter()
            .map(|w| match w {
                None => 0,
                #[allow(clippy::cast_possible_truncation)]
                Some(m) => hashes.iter().take_while(|h| m.contains_key(h)).count() as u32,
            })
            .collect()
    }
}

fn config() -> ProptestConfig {
    crate::core::prop_config::deterministic(256, 0x6b76_636c_7573_7465)
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn random_batches_match_model(ops in proptest::collection::vec(op(), 1..80)) {
        let mut ix = ClusterIndex::new(BS).expect("valid");
        let mut model = Model::default();
        let mut seqs: Vec<u64> = Vec::new();
        for _ in 0..3 {
            ix.add_worker("w", 0).expect("room");
            model.workers.push(Some(HashMap::new()));
            seqs.push(0);
        }
        for op in ops {
            match op {
                Op::Add => {
                    let w = ix.add_worker("w", 0).expect("room").0 as usize;
                    if w == model.workers.len() { model.workers.push(None); seqs.push(0); }
                    model.workers[w] = Some(HashMap::new());
                    seqs[w] = 0;
                }
                Op::Remove(w) => {
                    #[allow(clippy::cast_possible_truncation)]
                    let r = ix.remove_worker(WorkerId(w as u32));
                    prop_assert_eq!(r.is_ok(), model.workers.get(w).is_some_and(Option::is_some));
                    if r.is_ok() {
                        model.workers[w] = None;
                        while model.workers.last().is_some_and(Option::is_none) { model.workers.pop(); seqs.pop(); }
                    }
                }
                Op::Batch(w, evs, array) => {
                    let events: Vec<WireEvent> = evs.iter().map(|(k, hs)| match k {
                        0..=5 => stored(hs),
                        6..=8 => removed(hs),
                        _ => WireEvent::Cleared,
                    }).collect();
                    let p = payload(&events, if array { Tagging::Array } else { Tagging::Map });
                    #[allow(clippy::cast_possible_truncation)]
                    let wid = WorkerId(w as u32);
                    let Some(Some(m)) = model.workers.get_mut(w) else {
                        prop_assert!(ix.apply(wid, Some(0), &p).is_err());
                        continue;
                    };
                    prop_assert_eq!(ix.apply(wid, Some(seqs[w]), &p).expect("known"), Outcome::Applied);
                    seqs[w] += 1;
                    for e in &events {
                        match e {
                            WireEvent::Stored(s) => for h in &s.block_hashes { *m.entry(*h).or_insert(0) += 1; },
                            WireEvent::Removed(r) => for h in &r.block_hashes {
                                if let Some(c) = m.get_mut(h) { *c -= 1; if *c == 0 { m.remove(h); } }
                            },
                            WireEvent::Cleared => m.clear(),
                        }
                    }
                }
                Op::Query(hs) => prop_assert_eq!(ov(&ix, &hs), model.overlaps(&hs)),
            }
            ix.check_invariants().map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(ix.slots(), model.workers.len());
            for (w, m) in model.workers.iter().enumerate() {
                if let Some(m) = m {
                    for h in 0u64..24 {
                        #[allow(clippy::cast_possible_truncation)]
                        let got = ix.refs(h, WorkerId(w as u32));
                        prop_assert_eq!(got, m.get(&h).copied().unwrap_or(0));
                    }
                }
            }
        }
    }
}

#[test]
fn block_map_entry_is_twelve_bytes() {
    let mut ix = ClusterIndex::new(BS).expect("valid");
    let w = ix.add_worker("w", 0).expect("room");
    let hs: Vec<u64> = (0..100_000u64).map(|x| x.wrapping_mul(0x9e37_79b9_7f4a_7c15)).collect();
    ix.store_hashes(w, &hs).expect("known");
    let per_pair = ix.memory_bytes() as f64 / 100_000.0;
    assert!(per_pair < 32.0, "{per_pair} bytes per pair");
    // A long prompt walk crosses several look-ahead chunks.
    let mut out = Vec::new();
    ix.overlaps(&hs[..1000], &mut out);
    assert_eq!(out, vec![1000]);
    ix.overlaps(&[hs[0], hs[1], 7, hs[2]], &mut out);
    assert_eq!(out, vec![2]);
}

#[test]
fn overlaps_of_tokens_hash_as_they_walk() {
    use crate::core::hash::{BlockHasher, HashAlgo, KeySpec};
    use crate::core::ids::BlockHash;
    let tokens: Vec<i32> = (0..16 * 40).map(|x| (x * 7919) % 1000).collect();
    let spec = KeySpec::default();
    let mut h = BlockHasher::new(HashAlgo::Xxh3_128, None);
    let mut chain = Vec::new();
    h.extend_chain(&tokens, 16, &spec, &mut chain);
    let full: Vec<u64> = chain.iter().map(BlockHash::low_u64).collect();
    let mut ix = ClusterIndex::new(16).expect("valid");
    for (i, k) in [0usize, 3, 8, 9, 17, 40, 40, 1].iter().enumerate() {
        let w = ix.add_worker(&format!("w{i}"), 0).expect("room");
        ix.store_hashes(w, &full[..*k]).expect("known");
    }
    for cut in [0usize, 5, 16 * 9 + 3, 16 * 40] {
        let (mut c, mut hs, mut a, mut b) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let n = ix.overlaps_tokens(&mut h, &tokens[..cut], 16, &spec, &mut c, &mut hs, &mut a);
        assert_eq!(n, cut / 16);
        ix.overlaps(&full[..cut / 16], &mut b);
        assert_eq!(a, b, "cut {cut}");
        assert_eq!(hs[..], full[..hs.len()]);
    }
    // No worker matches: hashing stops within the first chunks.
    let mut other = ClusterIndex::new(16).expect("valid");
    other.add_worker("x", 0).expect("room");
    let (mut c, mut hs, mut a) = (Vec::new(), Vec::new(), Vec::new());
    other.overlaps_tokens(&mut h, &tokens, 16, &spec, &mut c, &mut hs, &mut a);
    assert_eq!(a, vec![0]);
    assert!(hs.len() <= 16);
}

#[test]
fn a_batch_of_another_dp_rank_is_malformed() {
    let mut ix = ClusterIndex::new(BS).expect("valid");
    let w = ix.add_worker("w", 1).expect("room");
    let mut p = Vec::new();
    encode_batch(&mut p, 1.0, &[stored(&[1])], Some(0), Tagging::Map);
    match ix.apply(w, Some(0), &p).expect("known") {
        Outcome::Malformed(m) => assert!(m.contains("data-parallel rank 0"), "{m}"),
        o => panic!("{o:?}"),
    }
    assert_eq!(ix.num_blocks(), 0);
    p.clear();
    encode_batch(&mut p, 1.0, &[stored(&[1])], Some(1), Tagging::Array);
    assert_eq!(ix.apply(w, Some(1), &p).expect("known"), Outcome::Applied);
    assert_eq!(ix.refs(1, w), 1);
}
