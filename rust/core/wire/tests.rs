//! Round trips and malformed input for the batch codec.

use crate::core::events::{EventKey, KvEvent};
use crate::core::wire::batch::{decode_batch, encode_batch, encode_cache_batch, Tagging};
use crate::core::wire::event::{CacheMeta, Removed, WireEvent};
use crate::core::wire::msgpack::{
    write_array_len, write_bin, write_f64, write_int, write_str, write_struct_map_len,
};

fn cache_events() -> Vec<KvEvent> {
    vec![
        KvEvent::BlockStored {
            block_hashes: vec![1, u64::MAX, 1 << 40],
            parent_block_hash: Some(7),
            token_ids: (0..6).map(|t| t * 1000 - 2).collect(),
            block_size: 2,
            lora_name: Some("sql".into()),
            extra_keys: vec![
                None,
                Some(vec![EventKey::Str("salt".into())]),
                Some(vec![EventKey::Mm("img".into(), -3)]),
            ],
        },
        KvEvent::BlockRemoved { block_hashes: vec![9] },
        KvEvent::AllBlocksCleared,
    ]
}

#[test]
fn cache_batch_round_trips_in_both_taggings() {
    let meta = CacheMeta { group_idx: Some(3), ..CacheMeta::default() };
    let want: Vec<WireEvent> = cache_events().into_iter().map(|e| WireEvent::from_cache(e, &meta)).collect();
    for tagging in [Tagging::Map, Tagging::Array] {
        let mut out = Vec::new();
        encode_cache_batch(&mut out, 12.5, &cache_events(), Some(2), &meta, tagging);
        let b = decode_batch(&out, Some(2)).expect("decodes");
        assert_eq!((b.ts, b.dp_rank), (12.5, Some(2)));
        assert_eq!(b.events, want);
        assert!(b.skipped.is_empty());
        // The generic encoder writes the same bytes from the decoded events.
        let mut again = Vec::new();
        encode_batch(&mut again, 12.5, &b.events, Some(2), tagging);
        assert_eq!(again, out);
    }
}

#[test]
fn signed_and_bytes_hashes_normalise_to_the_low_64_bits() {
    let mut out = Vec::new();
    write_array_len(&mut out, 2);
    write_f64(&mut out, 1.0);
    write_array_len(&mut out, 1);
    write_struct_map_len(&mut out, 2, 6);
    write_str(&mut out, "type");
    write_str(&mut out, "BlockRemoved");
    write_str(&mut out, "block_hashes");
    write_array_len(&mut out, 2);
    write_int(&mut out, -1);
    let mut digest = [0u8; 32];
    digest[24..].copy_from_slice(&0x0102_0304_0506_0708u64.to_be_bytes());
    write_bin(&mut out, &digest);
    let b = decode_batch(&out, None).expect("decodes");
    assert_eq!(b.dp_rank, None);
    assert_eq!(
        b.events,
        vec![WireEvent::Removed(Removed {
            block_hashes: vec![u64::MAX, 0x0102_0304_0506_0708],
            ..Removed::default()
        })]
    );
}

#[test]
fn unknown_event_types_are_skipped_and_reported() {
    let mut out = Vec::new();
    write_array_len(&mut out, 3);
    write_f64(&mut out, 1.0);
    write_array_len(&mut out, 2);
    write_struct_map_len(&mut out, 2, 2);
    write_str(&mut out, "type");
    write_str(&mut out, "BlockMoved");
    write_str(&mut out, "to");
    write_array_len(&mut out, 1);
    write_int(&mut out, 5);
    write_array_len(&mut out, 1);
    write_str(&mut out, "AllBlocksCleared");
    write_int(&mut out, 0);
    let b = decode_batch(&out, None).expect("decodes");
    assert_eq!(b.events, vec![WireEvent::Cleared]);
    assert_eq!(b.skipped, vec!["BlockMoved".to_owned()]);
}

#[test]
fn malformed_batches_are_errors_never_panics() {
    let mut good = Vec::new();
    encode_cache_batch(&mut good, 3.0, &cache_events(), Some(0), &CacheMeta::default(), Tagging::Map);
    // Every truncation, and every single-byte corruption, is an Err or a valid batch.
    for n in 0..good.len() {
        assert!(decode_batch(&good[..n], None).is_err(), "truncated at {n} decoded");
    }
    for i in 0..good.len() {
        for x in [0x00u8, 0xc1, 0xdd, 0xff, 0x9f, 0xdf] {
            let mut bad = good.clone();
            bad[i] = x;
            let _ = decode_batch(&bad, None);
        }
    }
    let mut trailing = good.clone();
    trailing.push(0);
    assert!(decode_batch(&trailing, None).expect_err("trailing byte").msg.contains("trailing"));
    let e = decode_batch(&good, Some(16)).expect_err("block size 16");
    assert!(e.msg.contains("expected block_size 16"), "{e}");
    assert!(decode_batch(&[0x91, 0xc0], None).is_err());
    assert!(decode_batch(&[0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x80, 0xc0], None)
        .expect_err("map without a type")
        .msg
        .contains("without a \"type\""));
}

mod prop {
    use proptest::prelude::*;

    use crate::core::wire::batch::{decode_batch, encode_cache_batch, Tagging};
    use crate::core::wire::event::CacheMeta;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        /// Arbitrary bytes decode to a batch or an error, never a panic.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode_batch(&bytes, None);
            let _ = decode_batch(&bytes, Some(4));
        }

        /// A valid payload with a few bytes overwritten or cut never panics either.
        #[test]
        fn mutated_payloads_never_panic(
            edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
            cut in any::<usize>(),
            array in any::<bool>(),
        ) {
            let mut out = Vec::new();
            let tagging = if array { Tagging::Array } else { Tagging::Map };
            encode_cache_batch(&mut out, 1.0, &super::cache_events(), Some(1), &CacheMeta::default(), tagging);
            for (i, b) in edits {
                let n = out.len();
                out[i % n] = b;
            }
            let n = out.len();
            out.truncate(cut % (n + 1));
            let _ = decode_batch(&out, None);
        }
    }
}
