//! A `KVEventBatch` payload as the block operations the index applies.
//!
//! [`batch_ops`] reads a payload with the wire module's msgpack [`Reader`]
//! and keeps only what the index needs — each event's kind, KV cache group
//! (`group_idx`, absent = group 0) and block hashes — into reused buffers:
//! no allocation per event, each value parsed once. Each `BlockStored` must
//! have its group's block size ([`GroupSizes`]: a worker's declared layout,
//! else the index's block size for every group) and `block_size` tokens per
//! hash; `group_idx` must be in `0..MAX_GROUPS` (in the layout when declared).
//! It accepts exactly what [`decode_batch`] accepts for the shapes engines
//! send (map-tagged events whose first key is `"type"`, extra keys absent or
//! nil per block, opaque fields nil or absent), checking every field the
//! decoder checks; for anything else (array-tagged events, fields before the
//! tag, repeated keys, extra keys or opaque values, and every malformed
//! payload) it defers to [`decode_batch`] and checks the groups' block sizes
//! on its events, so acceptance, errors and results are the decoder's plus
//! that check. A property test holds the two to the same operations.
//!
//! Costs: O(payload bytes), one pass; token ids are range-checked in place.
//!
//! Invariant: for every payload, the operations (or the error) are those of
//! [`decode_batch`] (a property test).

// Every field name of vLLM 0.33's events (a bit each in the repeated-key check).
use crate::core::wire::batch::decode_batch;
use crate::core::wire::batch::STORED_ORDER as FIELDS;
use crate::core::wire::event::WireEvent;
use crate::core::wire::msgpack::{ReadError, Reader};

/// Most KV cache groups an event may name (`group_idx < MAX_GROUPS`).
pub const MAX_GROUPS: u32 = 64;

/// The block size `BlockStored` events of each group must have.
#[derive(Clone, Copy, Debug)]
pub struct GroupSizes<'a> {
    /// The index's block size: every group's when `per_group` is empty.
    pub default: i64,
    /// A declared layout's block size per group (`group_idx` beyond it is malformed).
    pub per_group: &'a [i64],
}

impl GroupSizes<'_> {
    /// The block size of group `g`'s events, or why `g` is out of range.
    fn of(&self, g: i64) -> Result<i64, String> {
        let n = if self.per_group.is_empty() { i64::from(MAX_GROUPS) } else { self.per_group.len() as i64 };
        if !(0..n).contains(&g) {
            let what = if self.per_group.is_empty() {
                "at most 64 groups".to_owned()
            } else {
                format!("a layout of {n} groups")
            };
            return Err(format!("event of group_idx {g}, outside {what}"));
        }
        #[allow(clippy::cast_sign_loss, clippy::cast_possible_truncation)]
        Ok(self.per_group.get(g as usize).copied().unwrap_or(self.default))
    }

    /// Whether a `BlockStored` of group `g` with `block_size`, `hashes` block
    /// hashes and `tokens` token ids has the group's shape: `block_size`
    /// tokens per hash, or one hash block (the index's block size) with one
    /// hash in a group whose block is larger (vLLM's partial-block prefix
    /// entry for a prompt ending inside a block, kept under that hash as
    /// the engine's pool keeps it).
    fn stored_fits(&self, g: i64, block_size: i64, hashes: usize, tokens: usize) -> Result<(), String> {
        let bs = self.of(g)?;
        let per = |b: i64| usize::try_from(b).unwrap_or(0);
        let whole = block_size == bs && tokens == per(bs).saturating_mul(hashes);
        let partial =
            block_size == self.default && bs > self.default && hashes == 1 && tokens == per(self.default);
        if whole || partial {
            return Ok(());
        }
        Err(format!(
            "BlockStored with block_size {block_size} ({tokens} tokens for {hashes} hashes), expected block_size {bs} \
             for group {g}"
        ))
    }
}

/// One event as a block operation; ranges index [`Ops::hashes`], the last
/// field is the KV cache group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// `BlockStored` of `hashes[start..end]` in group `g`.
    Store(usize, usize, u32),
    /// `BlockRemoved` of `hashes[start..end]` in group `g`.
    Remove(usize, usize, u32),
    /// `AllBlocksCleared`.
    Clear,
}

/// A batch's operations (buffers reused across batches).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ops {
    /// The events, in order.
    pub ops: Vec<Op>,
    /// Every event's hashes, concatenated.
    pub hashes: Vec<u64>,
    /// Events of unknown types skipped.
    pub skipped: usize,
    /// The batch's data-parallel rank.
    pub dp_rank: Option<i64>,
    /// Groups whose `BlockStored` events said `kv_cache_spec_kind` full or MLA
    /// attention (bit `g`).
    pub full_groups: u64,
    /// Groups whose `BlockStored` events said another spec kind (bit `g`).
    pub other_groups: u64,
}

impl Ops {
    fn clear(&mut self) {
        self.ops.clear();
        self.hashes.clear();
        self.skipped = 0;
        self.dp_rank = None;
        self.full_groups = 0;
        self.other_groups = 0;
    }

    /// Records group `g`'s spec kind as an event named it.
    fn kind(&mut self, g: u32, kind: Option<&str>) {
        match kind {
            None => {}
            Some("full_attention" | "mla_attention") => self.full_groups |= 1 << g,
            Some(_) => self.other_groups |= 1 << g,
        }
    }
}

/// Fills `out` with the operations of `payload`, whose `BlockStored` events
/// must have their group's block size (`sizes`) and that many tokens per block.
///
/// # Errors
/// When [`decode_batch`] rejects the payload, with its error; a `group_idx`
/// out of range or a block size not its group's.
pub fn batch_ops(payload: &[u8], sizes: GroupSizes<'_>, out: &mut Ops) -> Result<(), ReadError> {
    out.clear();
    if fast(payload, sizes, out).is_some() {
        return Ok(());
    }
    out.clear();
    let batch = decode_batch(payload, None)?;
    let bad = |msg: String| ReadError { pos: 0, msg };
    for e in &batch.events {
        match e {
            WireEvent::Stored(s) => {
                let g = s.group_idx.unwrap_or(0);
                sizes.stored_fits(g, s.block_size, s.block_hashes.len(), s.token_ids.len()).map_err(bad)?;
                let start = out.hashes.len();
                out.hashes.extend_from_slice(&s.block_hashes);
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                out.ops.push(Op::Store(start, out.hashes.len(), g as u32));
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                out.kind(g as u32, s.kv_cache_spec_kind.as_deref());
            }
            WireEvent::Removed(r) => {
                let g = r.group_idx.unwrap_or(0);
                sizes.of(g).map_err(bad)?;
                let start = out.hashes.len();
                out.hashes.extend_from_slice(&r.block_hashes);
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                out.ops.push(Op::Remove(start, out.hashes.len(), g as u32));
            }
            WireEvent::Cleared => out.ops.push(Op::Clear),
        }
    }
    out.skipped = batch.skipped.len();
    out.dp_rank = batch.dp_rank;
    Ok(())
}

/// The fast path; None defers to the decoder (not necessarily an error).
fn fast(payload: &[u8], bs: GroupSizes<'_>, out: &mut Ops) -> Option<()> {
    let mut c = Cur { payload, base: 0, r: Reader::new(payload) };
    let r = &mut c.r;
    let n = r.array_len().ok()?;
    if !(2..=3).contains(&n) {
        return None;
    }
    r.f64().ok()?;
    let ne = r.array_len().ok()?;
    for _ in 0..ne {
        event(&mut c, bs, out)?;
    }
    let r = &mut c.r;
    if n == 3 && !r.try_nil().ok()? {
        out.dp_rank = Some(r.i64().ok()?);
    }
    (r.remaining() == 0).then_some(())
}

/// `block_hashes`, `token_ids`, `block_size`: the bits `BlockStored` needs.
const REQUIRED_STORED: u32 = 1 | 4 | 8;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Stored,
    Removed,
    Cleared,
    Unknown,
}

/// A reader over `payload[base..]` that can also jump over raw bytes.
struct Cur<'a> {
    payload: &'a [u8],
    base: usize,
    r: Reader<'a>,
}

impl Cur<'_> {
    /// Skips `n` integers that must fit in i64 (what [`Reader::i64`]
    /// accepts), scanning marker bytes only.
    fn skip_i64s(&mut self, n: usize) -> Option<()> {
        let at = self.base + self.r.pos();
        let buf = self.payload.get(at..)?;
        let mut i = 0usize;
        for _ in 0..n {
            let len = match *buf.get(i)? {
                0x00..=0x7f | 0xe0..=0xff => 1,
                0xcc | 0xd0 => 2,
                0xcd | 0xd1 => 3,
                0xce | 0xd2 => 5,
                0xd3 => 9,
                // uint64: only up to i64::MAX
                0xcf if *buf.get(i + 1)? < 0x80 => 9,
                _ => return None,
            };
            i += len;
        }
        if i > buf.len() {
            return None;
        }
        self.base = at + i;
        self.r = Reader::new(&self.payload[self.base..]);
        Some(())
    }
}

fn event(c: &mut Cur<'_>, sizes: GroupSizes<'_>, out: &mut Ops) -> Option<()> {
    if !matches!(c.r.peek().ok()?, 0x80..=0x8f | 0xde | 0xdf) {
        return None;
    }
    let n = c.r.map_len().ok()?;
    if n == 0 || c.r.str().ok()? != "type" {
        return None;
    }
    let kind = match c.r.str().ok()? {
        "BlockStored" => Kind::Stored,
        "BlockRemoved" => Kind::Removed,
        "AllBlocksCleared" => Kind::Cleared,
        _ => Kind::Unknown,
    };
    let start = out.hashes.len();
    let mut seen = 0u32;
    let mut tokens = 0usize;
    let mut size = None;
    let mut group = 0i64;
    let mut spec_kind: Option<&str> = None;
    for _ in 1..n {
        let key = c.r.str().ok()?;
        let known = match (kind, key) {
            (Kind::Stored | Kind::Removed, "block_hashes") => {
                let k = c.r.array_len().ok()?;
                for _ in 0..k {
                    out.hashes.push(hash(&mut c.r)?);
                }
                true
            }
            (Kind::Stored, "kv_cache_spec_kind") => {
                if !c.r.try_nil().ok()? {
                    spec_kind = Some(c.r.str().ok()?);
                }
                true
            }
            (Kind::Stored | Kind::Removed, "medium") | (Kind::Stored, "lora_name") => {
                if !c.r.try_nil().ok()? {
                    c.r.str().ok()?;
                }
                true
            }
            (Kind::Stored | Kind::Removed, "group_idx") => {
                if !c.r.try_nil().ok()? {
                    group = c.r.i64().ok()?;
                }
                true
            }
            (Kind::Stored, "lora_id" | "kv_cache_spec_sliding_window") => {
                if !c.r.try_nil().ok()? {
                    c.r.i64().ok()?;
                }
                true
            }
            (Kind::Stored, "parent_block_hash") => {
                if !c.r.try_nil().ok()? {
                    hash(&mut c.r)?;
                }
                true
            }
            (Kind::Stored, "token_ids") => {
                tokens = c.r.array_len().ok()?;
                c.skip_i64s(tokens)?;
                true
            }
            (Kind::Stored, "block_size") => {
                size = Some(c.r.i64().ok()?);
                true
            }
            (Kind::Stored, "extra_keys") => {
                if !c.r.try_nil().ok()? {
                    for _ in 0..c.r.array_len().ok()? {
                        if !c.r.try_nil().ok()? {
                            return None;
                        }
                    }
                }
                true
            }
            (Kind::Stored, "locality" | "ownership" | "session_id" | "lookahead_token_ids")
            | (Kind::Removed, "locality" | "ownership") => {
                if !c.r.try_nil().ok()? {
                    return None;
                }
                true
            }
            (_, "type") => return None,
            _ => {
                c.r.skip().ok()?;
                false
            }
        };
        if known {
            let bit = 1u32 << FIELDS.iter().position(|&f| f == key)?;
            if seen & bit != 0 {
                return None; // a repeated key: the decoder keeps the last one
            }
            seen |= bit;
        }
    }
    let nh = out.hashes.len() - start;
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let g = group as u32;
    match kind {
        Kind::Stored => {
            if seen & REQUIRED_STORED != REQUIRED_STORED
                || sizes.stored_fits(group, size?, nh, tokens).is_err()
            {
                return None;
            }
            out.ops.push(Op::Store(start, out.hashes.len(), g));
            out.kind(g, spec_kind);
        }
        Kind::Removed => {
            if seen & 1 == 0 {
                return None;
            }
            sizes.of(group).ok()?;
            out.ops.push(Op::Remove(start, out.hashes.len(), g));
        }
        Kind::Cleared => out.ops.push(Op::Clear),
        Kind::Unknown => out.skipped += 1,
    }
    Some(())
}

/// A block hash as the decoder reads it: an unsigned or signed int (its
/// 64-bit pattern) or bytes (the low 64 bits, big-endian).
fn hash(r: &mut Reader<'_>) -> Option<u64> {
    match r.peek().ok()? {
        0xc4..=0xc6 => {
            let b = r.bin().ok()?;
            Some(b[b.len().saturating_sub(8)..].iter().fold(0u64, |acc, &x| (acc << 8) | u64::from(x)))
        }
        #[allow(clippy::cast_sign_loss)]
        _ => match r.int().ok()? {
            crate::core::wire::msgpack::Int::U(v) => Some(v),
            crate::core::wire::msgpack::Int::I(v) => Some(v as u64),
        },
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use proptest::test_runner::Config as ProptestConfig;

    use super::{batch_ops, fast, GroupSizes, Op, Ops};
    use crate::core::wire::batch::{decode_batch, encode_batch, Tagging};
    use crate::core::wire::event::{Removed, Stored, WireEvent};
    use crate::core::wire::msgpack::Value;

    const BS: i64 = 2;
    const SIZES: GroupSizes<'static> = GroupSizes { default: BS, per_group: &[] };

    /// The decoder's operations, with the group range check `batch_ops` adds.
    fn decoded(p: &[u8]) -> Option<Ops> {
        let b = decode_batch(p, Some(BS)).ok()?;
        let mut o = Ops::default();
        let group = |g: Option<i64>| {
            let g = g.unwrap_or(0);
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            (0..64).contains(&g).then_some(g as u32)
        };
        for e in &b.events {
            let s = o.hashes.len();
            match e {
                WireEvent::Stored(x) => {
                    o.hashes.extend_from_slice(&x.block_hashes);
                    let g = group(x.group_idx)?;
                    o.ops.push(Op::Store(s, o.hashes.len(), g));
                    o.kind(g, x.kv_cache_spec_kind.as_deref());
                }
                WireEvent::Removed(x) => {
                    o.hashes.extend_from_slice(&x.block_hashes);
                    o.ops.push(Op::Remove(s, o.hashes.len(), group(x.group_idx)?));
                }
                WireEvent::Cleared => o.ops.push(Op::Clear),
            }
        }
        o.skipped = b.skipped.len();
        o.dp_rank = b.dp_rank;
        Some(o)
    }

    fn opt<T: std::fmt::Debug + Clone>(s: impl Strategy<Value = T>) -> impl Strategy<Value = Option<T>> {
        proptest::option::of(s)
    }

    fn event() -> impl Strategy<Value = WireEvent> {
        let hashes = proptest::collection::vec(any::<u64>(), 0..4);
        let stored = (
            hashes.clone(),
            opt(any::<u64>()),
            any::<bool>(),
            opt(-3i64..3),
            opt("[a-z]{0,3}"),
            opt(proptest::collection::vec(proptest::bool::weighted(0.8), 0..3)),
            opt(0i64..3),
            opt(Just(Value::Int(1))),
            opt(Just(vec![1i64, 2])),
        )
            .prop_map(|(h, parent, right_size, lora_id, medium, extra, group, locality, la)| {
                let n = h.len();
                WireEvent::Stored(Box::new(Stored {
                    block_hashes: h,
                    parent_block_hash: parent,
                    token_ids: (0..n * 2 + usize::from(!right_size))
                        .map(|i| [7, 200, 70_000, -5, -300, i64::MAX, i64::MIN, 1 << 40][i % 8])
                        .collect(),
                    block_size: BS,
                    lora_id,
                    medium: medium.clone(),
                    lora_name: medium,
                    extra_keys: extra.map(|v| {
                        v.into_iter()
                            .map(|nil| if nil { None } else { Some(vec![Value::Str("k".into())]) })
                            .collect()
                    }),
                    group_idx: group,
                    kv_cache_spec_kind: Some("full_attention".into()),
                    kv_cache_spec_sliding_window: group,
                    locality,
                    ownership: None,
                    session_id: None,
                    lookahead_token_ids: la,
                }))
            });
        let removed = (hashes, opt("[A-Z]{1,3}"), opt(0i64..3)).prop_map(|(h, medium, g)| {
            WireEvent::Removed(Removed { block_hashes: h, medium, group_idx: g, ..Removed::default() })
        });
        prop_oneof![4 => stored, 3 => removed, 1 => Just(WireEvent::Cleared)]
    }

    fn config() -> ProptestConfig {
        crate::core::prop_config::deterministic(512, 0x6b76_6f70_7331)
    }

    proptest! {
        #![proptest_config(config())]

        /// The fast path agrees with the decoder on every payload it takes,
        /// and `batch_ops` accepts exactly what the decoder accepts.
        #[test]
        fn fast_path_agrees_with_the_decoder(
            events in proptest::collection::vec(event(), 0..5),
            array in proptest::bool::weighted(0.2),
            dp in opt(0i64..4),
            edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..3),
            cut in proptest::option::weighted(0.1, any::<usize>()),
        ) {
            let mut p = Vec::new();
            encode_batch(&mut p, 1.0, &events, dp, if array { Tagging::Array } else { Tagging::Map });
            for (at, b) in edits {
                if !p.is_empty() {
                    let i = at % p.len();
                    p[i] = b;
                }
            }
            if let Some(c) = cut {
                p.truncate(c % (p.len() + 1));
            }
            let want = decoded(&p);
            let mut f = Ops::default();
            if fast(&p, SIZES, &mut f).is_some() {
                prop_assert_eq!(Some(&f), want.as_ref());
            }
            let mut got = Ops::default();
            let r = batch_ops(&p, SIZES, &mut got);
            prop_assert_eq!(r.is_ok(), want.is_some());
            if let Some(w) = want {
                prop_assert_eq!(got, w);
            }
        }
    }

    #[test]
    fn kvindex_and_vllm_shaped_batches_take_the_fast_path() {
        let e = WireEvent::Stored(Box::new(Stored {
            block_hashes: vec![1, 2],
            token_ids: vec![1; 4],
            block_size: BS,
            medium: Some("GPU".into()),
            extra_keys: Some(vec![None, None]),
            group_idx: Some(0),
            kv_cache_spec_kind: Some("full_attention".into()),
            ..Stored::default()
        }));
        let r = WireEvent::Removed(Removed {
            block_hashes: vec![1],
            medium: Some("GPU".into()),
            ..Removed::default()
        });
        let mut p = Vec::new();
        encode_batch(&mut p, 1.0, &[e, r, WireEvent::Cleared], Some(0), Tagging::Map);
        let mut f = Ops::default();
        assert!(fast(&p, SIZES, &mut f).is_some());
        assert_eq!(f.ops, vec![Op::Store(0, 2, 0), Op::Remove(2, 3, 0), Op::Clear]);
    }

    #[test]
    fn groups_have_their_block_sizes() {
        // Group 1 stores blocks of 4 tokens: malformed unless the layout says so.
        let ev = |g: i64, bs: i64| {
            WireEvent::Stored(Box::new(Stored {
                block_hashes: vec![7],
                token_ids: vec![1; usize::try_from(bs).expect("test setup")],
                block_size: bs,
                group_idx: Some(g),
                kv_cache_spec_kind: Some("sliding_window".into()),
                kv_cache_spec_sliding_window: Some(8),
                ..Stored::default()
            }))
        };
        let rm = |g: i64| {
            WireEvent::Removed(Removed { block_hashes: vec![7], group_idx: Some(g), ..Removed::default() })
        };
        for tagging in [Tagging::Map, Tagging::Array] {
            let mut p = Vec::new();
            encode_batch(&mut p, 1.0, &[ev(0, BS), ev(1, 4), rm(1)], None, tagging);
            let mut o = Ops::default();
            assert!(batch_ops(&p, SIZES, &mut o).is_err());
            let layout = GroupSizes { default: BS, per_group: &[BS, 4] };
            batch_ops(&p, layout, &mut o).expect("the layout's sizes");
            assert_eq!(o.ops, vec![Op::Store(0, 1, 0), Op::Store(1, 2, 1), Op::Remove(2, 3, 1)]);
            let mut p = Vec::new();
            encode_batch(&mut p, 1.0, &[rm(2)], None, tagging);
            let e = batch_ops(&p, layout, &mut o).expect_err("group 2 of 2");
            assert!(e.msg.contains("group_idx 2"), "{}", e.msg);
            assert!(batch_ops(&p, SIZES, &mut o).is_ok());
            let mut p = Vec::new();
            encode_batch(&mut p, 1.0, &[rm(-1)], None, tagging);
            assert!(batch_ops(&p, SIZES, &mut o).is_err());
        }
    }

    #[test]
    fn a_prompt_tail_entry_is_one_hash_block_of_a_larger_group() {
        // Group 0's blocks are 2 * BS tokens: vLLM also stores a prompt tail's entry
        // as one BS-token block with one hash (a partial-block prefix entry).
        let ev = |hashes: Vec<u64>, bs: i64| {
            WireEvent::Stored(Box::new(Stored {
                token_ids: vec![1; usize::try_from(bs).expect("test setup") * hashes.len()],
                block_hashes: hashes,
                block_size: bs,
                group_idx: Some(0),
                kv_cache_spec_kind: Some("full_attention".into()),
                ..Stored::default()
            }))
        };
        let layout = GroupSizes { default: BS, per_group: &[2 * BS, BS] };
        for tagging in [Tagging::Map, Tagging::Array] {
            let mut p = Vec::new();
            encode_batch(&mut p, 1.0, &[ev(vec![5, 6], 2 * BS), ev(vec![9], BS)], None, tagging);
            let mut o = Ops::default();
            batch_ops(&p, layout, &mut o).expect("a whole run and a tail entry");
            assert_eq!(o.ops, vec![Op::Store(0, 2, 0), Op::Store(2, 3, 0)]);
            let mut f = Ops::default();
            assert!(fast(&p, layout, &mut f).is_some() || tagging == Tagging::Array);
            // Two hashes of one hash block each are not a tail entry.
            let mut p = Vec::new();
            encode_batch(&mut p, 1.0, &[ev(vec![9, 10], BS)], None, tagging);
            assert!(batch_ops(&p, layout, &mut o).is_err());
        }
    }
}
