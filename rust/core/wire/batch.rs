//! `KVEventBatch` payloads: encoding (byte-exact with vLLM 0.33's msgspec
//! encoder) and decoding (lenient in what it accepts, strict in what it
//! returns).
//!
//! # Encoding (vLLM 0.33, `msgspec.msgpack.Encoder()`)
//! A batch is the array `[ts, events, data_parallel_rank]`: `ts` a float64
//! (`cb` + 8 bytes), `dp_rank` an int or nil. Each event is, by default
//! ([`Tagging::Map`]), a map tagged `"type"` whose fields follow in
//! declaration order; required fields are always present (nil when None),
//! optional ones (default None) only when set. The map head has msgspec's
//! width: fixmap for a struct with fewer than 16 possible entries (tag
//! included: `BlockRemoved`, `AllBlocksCleared`), map16 otherwise
//! (`BlockStored`). Integers, strings and arrays take their shortest heads.
//! [`Tagging::Array`] gives the older array-tagged form: `[tag, field, ...]`
//! with every field present, as msgspec encodes `array_like` structs.
//!
//! # Decoding
//! Both tagging forms; hashes as unsigned or signed ints (the 64-bit pattern
//! is kept) or bytes (low 64 bits, big-endian); unknown map keys and extra
//! trailing array fields are ignored, missing optional ones default to None.
//! An event of an unknown type is skipped and its tag reported in
//! [`Batch::skipped`]; any other malformation fails the whole batch with the
//! byte offset and what was expected.
//!
//! # Costs
//! Encoding: O(encoded bytes), one growing `Vec<u8>`, no allocation per
//! event. Decoding: O(payload bytes) plus the returned vectors.
//!
//! # Invariants
//! Encoding then decoding returns the events (round-trip tests); a
//! malformed payload is an error, never a panic (fuzzed by property tests).

use crate::core::events::{EventKey, KvEvent};
use crate::core::wire::event::{CacheMeta, Removed, Stored, WireEvent};
use crate::core::wire::msgpack::{
    write_array_len, write_f64, write_int, write_nil, write_str, write_struct_map_len, write_uint, Int,
    ReadError, ReadResult, Reader, Value,
};

/// How events are tagged on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Tagging {
    /// A map with a `"type"` entry (vLLM from mid-2026, 0.33 included).
    #[default]
    Map,
    /// An array whose first element is the type (older vLLM).
    Array,
}

/// `BlockStored` possible fields, the tag included.
const STORED_FIELDS: usize = 16;
/// `BlockRemoved` possible fields, the tag included.
const REMOVED_FIELDS: usize = 6;

/// Borrowed extra keys: a cache's own, or decoded ones.
#[derive(Clone, Copy)]
enum Extra<'a> {
    Cache(&'a [Option<Vec<EventKey>>]),
    Wire(Option<&'a [Option<Vec<Value>>]>),
}

struct StoredRef<'a> {
    block_hashes: &'a [u64],
    parent_block_hash: Option<u64>,
    token_ids: &'a [i64],
    block_size: i64,
    lora_id: Option<i64>,
    medium: Option<&'a str>,
    lora_name: Option<&'a str>,
    extra_keys: Extra<'a>,
    group_idx: Option<i64>,
    kv_cache_spec_kind: Option<&'a str>,
    kv_cache_spec_sliding_window: Option<i64>,
    locality: Option<&'a Value>,
    ownership: Option<&'a Value>,
    session_id: Option<&'a Value>,
    lookahead_token_ids: Option<&'a [i64]>,
}

struct RemovedRef<'a> {
    block_hashes: &'a [u64],
    medium: Option<&'a str>,
    group_idx: Option<i64>,
    locality: Option<&'a Value>,
    ownership: Option<&'a Value>,
}

fn w_opt_int(out: &mut Vec<u8>, v: Option<i64>) {
    match v {
        Some(v) => write_int(out, v),
        None => write_nil(out),
    }
}

fn w_opt_hash(out: &mut Vec<u8>, v: Option<u64>) {
    match v {
        Some(v) => write_uint(out, v),
        None => write_nil(out),
    }
}

fn w_opt_str(out: &mut Vec<u8>, v: Option<&str>) {
    match v {
        Some(v) => write_str(out, v),
        None => write_nil(out),
    }
}

fn w_opt_value(out: &mut Vec<u8>, v: Option<&Value>) {
    match v {
        Some(v) => v.write(out),
        None => write_nil(out),
    }
}

fn w_hashes(out: &mut Vec<u8>, hs: &[u64]) {
    write_array_len(out, hs.len());
    for &h in hs {
        write_uint(out, h);
    }
}

fn w_ints(out: &mut Vec<u8>, xs: &[i64]) {
    write_array_len(out, xs.len());
    for &x in xs {
        write_int(out, x);
    }
}

fn w_extra(out: &mut Vec<u8>, e: Extra<'_>) {
    match e {
        Extra::Cache(blocks) => {
            write_array_len(out, blocks.len());
            for b in blocks {
                match b {
                    None => write_nil(out),
                    Some(keys) => {
                        write_array_len(out, keys.len());
                        for k in keys {
                            match k {
                                EventKey::Str(s) => write_str(out, s),
                                EventKey::Mm(id, off) => {
                                    write_array_len(out, 2);
                                    write_str(out, id);
                                    write_int(out, *off);
                                }
                            }
                        }
                    }
                }
            }
        }
        Extra::Wire(None) => write_nil(out),
        Extra::Wire(Some(blocks)) => {
            write_array_len(out, blocks.len());
            for b in blocks {
                match b {
                    None => write_nil(out),
                    Some(keys) => {
                        write_array_len(out, keys.len());
                        for k in keys {
                            k.write(out);
                        }
                    }
                }
            }
        }
    }
}

fn extra_is_none(e: Extra<'_>) -> bool {
    matches!(e, Extra::Wire(None))
}

fn encode_stored(out: &mut Vec<u8>, s: &StoredRef<'_>, tagging: Tagging) {
    match tagging {
        Tagging::Map => {
            let n = 8
                + usize::from(!extra_is_none(s.extra_keys))
                + usize::from(s.group_idx.is_some())
                + usize::from(s.kv_cache_spec_kind.is_some())
                + usize::from(s.kv_cache_spec_sliding_window.is_some())
                + usize::from(s.locality.is_some())
                + usize::from(s.ownership.is_some())
                + usize::from(s.session_id.is_some())
                + usize::from(s.lookahead_token_ids.is_some());
            write_struct_map_len(out, n, STORED_FIELDS);
            write_str(out, "type");
            write_str(out, "BlockStored");
            write_str(out, "block_hashes");
            w_hashes(out, s.block_hashes);
            write_str(out, "parent_block_hash");
            w_opt_hash(out, s.parent_block_hash);
            write_str(out, "token_ids");
            w_ints(out, s.token_ids);
            write_str(out, "block_size");
            write_int(out, s.block_size);
            write_str(out, "lora_id");
            w_opt_int(out, s.lora_id);
            write_str(out, "medium");
            w_opt_str(out, s.medium);
            write_str(out, "lora_name");
            w_opt_str(out, s.lora_name);
            if !extra_is_none(s.extra_keys) {
                write_str(out, "extra_keys");
                w_extra(out, s.extra_keys);
            }
            if let Some(g) = s.group_idx {
                write_str(out, "group_idx");
                write_int(out, g);
            }
            if let Some(k) = s.kv_cache_spec_kind {
                write_str(out, "kv_cache_spec_kind");
                write_str(out, k);
            }
            if let Some(w) = s.kv_cache_spec_sliding_window {
                write_str(out, "kv_cache_spec_sliding_window");
                write_int(out, w);
            }
            for (name, v) in
                [("locality", s.locality), ("ownership", s.ownership), ("session_id", s.session_id)]
            {
                if let Some(v) = v {
                    write_str(out, name);
                    v.write(out);
                }
            }
            if let Some(l) = s.lookahead_token_ids {
                write_str(out, "lookahead_token_ids");
                w_ints(out, l);
            }
        }
        Tagging::Array => {
            write_array_len(out, STORED_FIELDS);
            write_str(out, "BlockStored");
            w_hashes(out, s.block_hashes);
            w_opt_hash(out, s.parent_block_hash);
            w_ints(out, s.token_ids);
            write_int(out, s.block_size);
            w_opt_int(out, s.lora_id);
            w_opt_str(out, s.medium);
            w_opt_str(out, s.lora_name);
            w_extra(out, s.extra_keys);
            w_opt_int(out, s.group_idx);
            w_opt_str(out, s.kv_cache_spec_kind);
            w_opt_int(out, s.kv_cache_spec_sliding_window);
            w_opt_value(out, s.locality);
            w_opt_value(out, s.ownership);
            w_opt_value(out, s.session_id);
            match s.lookahead_token_ids {
                Some(l) => w_ints(out, l),
                None => write_nil(out),
            }
        }
    }
}

fn encode_removed(out: &mut Vec<u8>, r: &RemovedRef<'_>, tagging: Tagging) {
    match tagging {
        Tagging::Map => {
            let n = 3
                + usize::from(r.group_idx.is_some())
                + usize::from(r.locality.is_some())
                + usize::from(r.ownership.is_some());
            write_struct_map_len(out, n, REMOVED_FIELDS);
            write_str(out, "type");
            write_str(out, "BlockRemoved");
            write_str(out, "block_hashes");
            w_hashes(out, r.block_hashes);
            write_str(out, "medium");
            w_opt_str(out, r.medium);
            if let Some(g) = r.group_idx {
                write_str(out, "group_idx");
                write_int(out, g);
            }
            for (name, v) in [("locality", r.locality), ("ownership", r.ownership)] {
                if let Some(v) = v {
                    write_str(out, name);
                    v.write(out);
                }
            }
        }
        Tagging::Array => {
            write_array_len(out, REMOVED_FIELDS);
            write_str(out, "BlockRemoved");
            w_hashes(out, r.block_hashes);
            w_opt_str(out, r.medium);
            w_opt_int(out, r.group_idx);
            w_opt_value(out, r.locality);
            w_opt_value(out, r.ownership);
        }
    }
}

fn encode_cleared(out: &mut Vec<u8>, tagging: Tagging) {
    match tagging {
        Tagging::Map => {
            write_struct_map_len(out, 1, 1);
            write_str(out, "type");
        }
        Tagging::Array => write_array_len(out, 1),
    }
    write_str(out, "AllBlocksCleared");
}

fn batch_head(out: &mut Vec<u8>, ts: f64, n: usize) {
    write_array_len(out, 3);
    write_f64(out, ts);
    write_array_len(out, n);
}

/// Appends the `KVEventBatch` of a cache's drained events to `out`, with
/// `meta` filled in. One pass, no allocation besides `out`'s growth.
pub fn encode_cache_batch(
    out: &mut Vec<u8>,
    ts: f64,
    events: &[KvEvent],
    dp_rank: Option<i64>,
    meta: &CacheMeta,
    tagging: Tagging,
) {
    batch_head(out, ts, events.len());
    for e in events {
        match e {
            KvEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
                lora_name,
                extra_keys,
            } => {
                let s = StoredRef {
                    block_hashes,
                    parent_block_hash: *parent_block_hash,
                    token_ids,
                    block_size: i64::try_from(*block_size).unwrap_or(i64::MAX),
                    lora_id: None,
                    medium: meta.medium.as_deref(),
                    lora_name: lora_name.as_deref(),
                    extra_keys: Extra::Cache(extra_keys),
                    group_idx: meta.group_idx,
                    kv_cache_spec_kind: meta.kv_cache_spec_kind.as_deref(),
                    kv_cache_spec_sliding_window: None,
                    locality: None,
                    ownership: None,
                    session_id: None,
                    lookahead_token_ids: None,
                };
                encode_stored(out, &s, tagging);
            }
            KvEvent::BlockRemoved { block_hashes } => {
                let r = RemovedRef {
                    block_hashes,
                    medium: meta.medium.as_deref(),
                    group_idx: meta.group_idx,
                    locality: None,
                    ownership: None,
                };
                encode_removed(out, &r, tagging);
            }
            KvEvent::AllBlocksCleared => encode_cleared(out, tagging),
        }
    }
    w_opt_int(out, dp_rank);
}

/// Appends the `KVEventBatch` of `events` to `out`.
pub fn encode_batch(
    out: &mut Vec<u8>,
    ts: f64,
    events: &[WireEvent],
    dp_rank: Option<i64>,
    tagging: Tagging,
) {
    batch_head(out, ts, events.len());
    for e in events {
        match e {
            WireEvent::Stored(s) => {
                let s = StoredRef {
                    block_hashes: &s.block_hashes,
                    parent_block_hash: s.parent_block_hash,
                    token_ids: &s.token_ids,
                    block_size: s.block_size,
                    lora_id: s.lora_id,
                    medium: s.medium.as_deref(),
                    lora_name: s.lora_name.as_deref(),
                    extra_keys: Extra::Wire(s.extra_keys.as_deref()),
                    group_idx: s.group_idx,
                    kv_cache_spec_kind: s.kv_cache_spec_kind.as_deref(),
                    kv_cache_spec_sliding_window: s.kv_cache_spec_sliding_window,
                    locality: s.locality.as_ref(),
                    ownership: s.ownership.as_ref(),
                    session_id: s.session_id.as_ref(),
                    lookahead_token_ids: s.lookahead_token_ids.as_deref(),
                };
                encode_stored(out, &s, tagging);
            }
            WireEvent::Removed(r) => {
                let r = RemovedRef {
                    block_hashes: &r.block_hashes,
                    medium: r.medium.as_deref(),
                    group_idx: r.group_idx,
                    locality: r.locality.as_ref(),
                    ownership: r.ownership.as_ref(),
                };
                encode_removed(out, &r, tagging);
            }
            WireEvent::Cleared => encode_cleared(out, tagging),
        }
    }
    w_opt_int(out, dp_rank);
}

/// A decoded `KVEventBatch`.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    /// Producer timestamp (seconds).
    pub ts: f64,
    /// The events, in order.
    pub events: Vec<WireEvent>,
    /// The producer's data-parallel rank.
    pub dp_rank: Option<i64>,
    /// Type tags of events of unknown types that were skipped, in order.
    pub skipped: Vec<String>,
}

fn hash(r: &mut Reader<'_>) -> ReadResult<u64> {
    match r.peek()? {
        0xc4..=0xc6 => {
            let b = r.bin()?;
            Ok(b[b.len().saturating_sub(8)..].iter().fold(0u64, |acc, &x| (acc << 8) | u64::from(x)))
        }
        #[allow(clippy::cast_sign_loss)]
        _ => match r.int().map_err(|e| ReadError { msg: format!("block hash: {}", e.msg), ..e })? {
            Int::U(v) => Ok(v),
            Int::I(v) => Ok(v as u64),
        },
    }
}

fn hashes(r: &mut Reader<'_>) -> ReadResult<Vec<u64>> {
    let n = r.array_len()?;
    (0..n).map(|_| hash(r)).collect()
}

fn ints(r: &mut Reader<'_>) -> ReadResult<Vec<i64>> {
    let n = r.array_len()?;
    (0..n).map(|_| r.i64()).collect()
}

fn opt<'a, T>(r: &mut Reader<'a>, f: impl FnOnce(&mut Reader<'a>) -> ReadResult<T>) -> ReadResult<Option<T>> {
    if r.try_nil()? {
        Ok(None)
    } else {
        f(r).map(Some)
    }
}

fn string(r: &mut Reader<'_>) -> ReadResult<String> {
    r.str().map(str::to_owned)
}

fn extra_keys(r: &mut Reader<'_>) -> ReadResult<Vec<Option<Vec<Value>>>> {
    let n = r.array_len()?;
    (0..n)
        .map(|_| {
            opt(r, |r| {
                let k = r.array_len()?;
                (0..k).map(|_| r.value()).collect()
            })
        })
        .collect()
}

/// Reads the field `name` of a `BlockStored` into `s`; `false` if the field is unknown.
fn stored_field(r: &mut Reader<'_>, s: &mut Stored, name: &str) -> ReadResult<bool> {
    match name {
        "block_hashes" => s.block_hashes = hashes(r)?,
        "parent_block_hash" => s.parent_block_hash = opt(r, hash)?,
        "token_ids" => s.token_ids = ints(r)?,
        "block_size" => s.block_size = r.i64()?,
        "lora_id" => s.lora_id = opt(r, Reader::i64)?,
        "medium" => s.medium = opt(r, string)?,
        "lora_name" => s.lora_name = opt(r, string)?,
        "extra_keys" => s.extra_keys = opt(r, extra_keys)?,
        "group_idx" => s.group_idx = opt(r, Reader::i64)?,
        "kv_cache_spec_kind" => s.kv_cache_spec_kind = opt(r, string)?,
        "kv_cache_spec_sliding_window" => s.kv_cache_spec_sliding_window = opt(r, Reader::i64)?,
        "locality" => s.locality = opt(r, Reader::value)?,
        "ownership" => s.ownership = opt(r, Reader::value)?,
        "session_id" => s.session_id = opt(r, Reader::value)?,
        "lookahead_token_ids" => s.lookahead_token_ids = opt(r, ints)?,
        _ => return Ok(false),
    }
    Ok(true)
}

fn removed_field(r: &mut Reader<'_>, e: &mut Removed, name: &str) -> ReadResult<bool> {
    match name {
        "block_hashes" => e.block_hashes = hashes(r)?,
        "medium" => e.medium = opt(r, string)?,
        "group_idx" => e.group_idx = opt(r, Reader::i64)?,
        "locality" => e.locality = opt(r, Reader::value)?,
        "ownership" => e.ownership = opt(r, Reader::value)?,
        _ => return Ok(false),
    }
    Ok(true)
}

/// `BlockStored`'s fields in vLLM 0.33's declaration order (every event field:
/// `BlockRemoved`'s are a subset).
pub(crate) const STORED_ORDER: [&str; 15] = [
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
    "locality",
    "ownership",
    "session_id",
    "lookahead_token_ids",
];
const REMOVED_ORDER: [&str; 5] = ["block_hashes", "medium", "group_idx", "locality", "ownership"];
const STORED_REQUIRED: [&str; 3] = ["block_hashes", "token_ids", "block_size"];

/// One event; `Ok(Err(tag))` for an event of unknown type (skipped).
fn event(r: &mut Reader<'_>) -> ReadResult<Result<WireEvent, String>> {
    let at = r.pos();
    let m = r.peek()?;
    let mut seen: Vec<&'static str> = Vec::new();
    let mut stored = Stored::default();
    let mut removed = Removed::default();
    let tag: String;
    if matches!(m, 0x90..=0x9f | 0xdc | 0xdd) {
        let n = r.array_len()?;
        if n == 0 {
            return Err(ReadError { pos: at, msg: "empty array where an event was expected".into() });
        }
        tag = string(r)?;
        let order: &[&'static str] = match tag.as_str() {
            "BlockStored" => &STORED_ORDER,
            "BlockRemoved" => &REMOVED_ORDER,
            _ => &[],
        };
        for i in 1..n {
            match order.get(i - 1) {
                Some(&name) => {
                    if tag == "BlockStored" {
                        stored_field(r, &mut stored, name)?;
                    } else {
                        removed_field(r, &mut removed, name)?;
                    }
                    seen.push(name);
                }
                None => r.skip()?,
            }
        }
    } else {
        let n = r.map_len().map_err(|e| ReadError { msg: format!("event: {}", e.msg), ..e })?;
        // Fields may come before the tag: remember where each value starts.
        let mut fields: Vec<(&str, Reader<'_>)> = Vec::with_capacity(n);
        let mut found = None;
        for _ in 0..n {
            let key = r.str()?;
            if key == "type" {
                found = Some(string(r)?);
            } else {
                fields.push((key, r.clone()));
                r.skip()?;
            }
        }
        tag = found.ok_or_else(|| ReadError { pos: at, msg: "event map without a \"type\" entry".into() })?;
        for (key, mut fr) in fields {
            let known = match tag.as_str() {
                "BlockStored" => stored_field(&mut fr, &mut stored, key)?,
                "BlockRemoved" => removed_field(&mut fr, &mut removed, key)?,
                _ => false,
            };
            if known {
                if let Some(&name) = STORED_ORDER.iter().find(|&&f| f == key) {
                    seen.push(name);
                }
            }
        }
    }
    let missing = |req: &[&str]| req.iter().find(|f| !seen.contains(f)).map(|f| (*f).to_owned());
    match tag.as_str() {
        "BlockStored" => match missing(&STORED_REQUIRED) {
            Some(f) => Err(ReadError { pos: at, msg: format!("BlockStored without {f}") }),
            None => Ok(Ok(WireEvent::Stored(Box::new(stored)))),
        },
        "BlockRemoved" => match missing(&["block_hashes"]) {
            Some(f) => Err(ReadError { pos: at, msg: format!("BlockRemoved without {f}") }),
            None => Ok(Ok(WireEvent::Removed(removed))),
        },
        "AllBlocksCleared" => Ok(Ok(WireEvent::Cleared)),
        _ => Ok(Err(tag)),
    }
}

/// Decodes a `KVEventBatch` payload. With `expected_block_size`, every
/// `BlockStored` must have that block size and `block_size` tokens per hash.
///
/// # Errors
/// Malformed msgpack, a batch or event of the wrong shape, trailing bytes,
/// or a block-size mismatch: the byte offset and what was wrong.
pub fn decode_batch(buf: &[u8], expected_block_size: Option<i64>) -> ReadResult<Batch> {
    let mut r = Reader::new(buf);
    let n = r.array_len().map_err(|e| ReadError { msg: format!("batch: {}", e.msg), ..e })?;
    if !(2..=3).contains(&n) {
        return Err(ReadError {
            pos: 0,
            msg: format!("batch array of {n} elements, expected [ts, events, dp_rank]"),
        });
    }
    let ts = r.f64().map_err(|e| ReadError { msg: format!("batch ts: {}", e.msg), ..e })?;
    let ne = r.array_len().map_err(|e| ReadError { msg: format!("batch events: {}", e.msg), ..e })?;
    let mut events = Vec::with_capacity(ne);
    let mut skipped = Vec::new();
    for _ in 0..ne {
        let at = r.pos();
        match event(&mut r)? {
            Ok(e) => {
                if let (Some(bs), WireEvent::Stored(s)) = (expected_block_size, &e) {
                    let want = usize::try_from(bs).unwrap_or(0).saturating_mul(s.block_hashes.len());
                    if s.block_size != bs || s.token_ids.len() != want {
                        return Err(ReadError {
                            pos: at,
                            msg: format!(
                                "BlockStored with block_size {} ({} tokens for {} hashes), expected block_size {bs}",
                                s.block_size,
                                s.token_ids.len(),
                                s.block_hashes.len()
                            ),
                        });
                    }
                }
                events.push(e);
            }
            Err(tag) => skipped.push(tag),
        }
    }
    let dp_rank = if n == 3 { opt(&mut r, Reader::i64)? } else { None };
    if r.remaining() != 0 {
        return Err(r.err(format!("{} trailing bytes after the batch", r.remaining())));
    }
    Ok(Batch { ts, events, dp_rank, skipped })
}
