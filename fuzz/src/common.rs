//! Byte decoding shared by the fuzz targets (see `fuzz/README.md` for the format)
//! and checks shared by both request-level caches (block tables, slot mappings,
//! KV events, CSR batches).

use std::collections::HashMap;

use kvindex::core::error::{ErrorKind, KvResult};
use kvindex::core::events::KvEvent;
use kvindex::core::hash::{KeySpec, MmItem};
use kvindex::core::ids::{RequestId, TableEntry};
use kvindex::core::tables::TableSource;

/// Most operations decoded from one input (keeps every execution short).
pub const MAX_OPS: usize = 256;

/// Request ids are drawn from `0..NUM_IDS`, so ids collide (duplicates,
/// double frees, unknown ids).
pub const NUM_IDS: u64 = 8;

/// Shared prompt prefixes (as in `tests/hash_chain/hash_chain_prop.rs`).
pub const NUM_PREFIXES: usize = 3;
/// Tokens per shared prefix.
pub const PREFIX_LEN: usize = 24;
/// Longest suffix a prompt adds after its prefix cut.
pub const MAX_SUFFIX: usize = 16;

/// A cursor over the fuzzer's bytes. Reading past the end yields zeros, so
/// every input decodes to something; [`Input::is_empty`] ends the op loop.
pub struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Input<'a> {
    /// A cursor at the start of `data`.
    #[must_use]
    pub fn new(data: &'a [u8]) -> Self {
        Input { data, pos: 0 }
    }

    /// Whether every byte has been consumed.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.pos >= self.data.len()
    }

    /// The next byte without consuming it (0 past the end).
    #[must_use]
    pub fn peek(&self) -> u8 {
        self.data.get(self.pos).copied().unwrap_or(0)
    }

    /// The next byte (0 past the end).
    pub fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    /// The next 8 bytes, little-endian (zeros past the end).
    pub fn u64(&mut self) -> u64 {
        let mut v = 0u64;
        for i in 0..8 {
            v |= u64::from(self.u8()) << (8 * i);
        }
        v
    }

    /// A count in `0..=max` (`byte % (max + 1)`).
    pub fn count(&mut self, max: usize) -> usize {
        usize::from(self.u8()) % (max + 1)
    }

    /// A request id (`byte % NUM_IDS`).
    pub fn id(&mut self) -> u64 {
        u64::from(self.u8()) % NUM_IDS
    }

    /// `count` request ids (`count = byte % (max + 1)`).
    pub fn ids(&mut self, max: usize) -> Vec<u64> {
        let k = self.count(max);
        (0..k).map(|_| self.id()).collect()
    }

    /// One token from one byte: a small alphabet (`byte % 4`) so that
    /// prefixes are shared, plus a few extreme values.
    pub fn token(&mut self) -> i64 {
        token_of(self.u8())
    }

    /// `byte % (max + 1)` tokens.
    pub fn tokens(&mut self, max: usize) -> Vec<i64> {
        let n = self.count(max);
        (0..n).map(|_| self.token()).collect()
    }

    /// A prompt: `[prefix selector][cut][suffix len][suffix tokens...]`:
    /// the first `cut % 25` tokens of shared prefix `selector % 4` (3 = none),
    /// then `len % 17` tokens.
    pub fn prompt(&mut self) -> Vec<i64> {
        let p = usize::from(self.u8()) % (NUM_PREFIXES + 1);
        let cut = self.count(PREFIX_LEN);
        let mut t = if p < NUM_PREFIXES { prefix_tokens(p)[..cut].to_vec() } else { Vec::new() };
        t.extend(self.tokens(MAX_SUFFIX));
        t
    }

    /// A key spec (extra keys / namespace); `Err` when the decoded spec is
    /// invalid (`KeySpec::new` must reject it; checked here).
    pub fn spec(&mut self) -> KvResult<KeySpec> {
        let s = self.u8() % 8;
        let lora = |n: &str| Some((n.to_owned(), format!("/adapters/{n}")));
        match s {
            0 => Ok(KeySpec::default()),
            1 => KeySpec::new(None, Some("tenant-a".into()), vec![]),
            2 => KeySpec::new(lora("lora-x"), None, vec![]),
            3 => {
                // an empty salt is no salt
                let k = KeySpec::new(None, Some(String::new()), vec![]);
                assert_eq!(k, Ok(KeySpec::default()), "an empty salt must equal no salt");
                k
            }
            4 => KeySpec::new(lora("lora-x"), Some("tenant-a".into()), vec![]),
            5 => KeySpec::new(None, None, vec![mm("img", 2, 3)]),
            6 => {
                // two multimodal items from four bytes; often invalid
                let mut items = Vec::new();
                for name in ["a", "b"] {
                    let off = match self.u8() {
                        255 => i64::MAX,
                        254 => -1,
                        b => i64::from(b % 32),
                    };
                    let len = i64::from(self.u8() % 8) - 1;
                    items.push(mm(name, off, len));
                }
                let valid = items.iter().all(|it| it.offset >= 0 && it.length >= 1)
                    && items[0].offset.checked_add(items[0].length).is_some_and(|end| items[1].offset >= end)
                    && items[1].offset.checked_add(items[1].length).is_some();
                let k = KeySpec::new(None, None, items);
                assert_eq!(k.is_ok(), valid, "KeySpec::new validity: {k:?}");
                if let Err(e) = &k {
                    assert_eq!(e.kind, ErrorKind::InvalidArgument);
                }
                k
            }
            _ => KeySpec::new(lora("lora-y"), None, vec![]),
        }
    }
}

fn mm(id: &str, offset: i64, length: i64) -> MmItem {
    MmItem { identifier: id.into(), offset, length }
}

/// The token a byte decodes to.
#[must_use]
pub fn token_of(b: u8) -> i64 {
    match b {
        0..=247 => i64::from(b % 4),
        248 => -1,
        249 => i64::from(i32::MAX),
        250 => i64::from(i32::MIN),
        251 => i64::from(i32::MAX) + 1,
        252 => i64::MAX,
        253 => i64::MIN,
        254 => 1000,
        255 => 7,
    }
}

/// Shared prefix `p`: 24 tokens; all prefixes share their first 4 tokens, so
/// they diverge mid-block for block sizes above 4 (as in the property test).
#[must_use]
pub fn prefix_tokens(p: usize) -> Vec<i64> {
    #[allow(clippy::cast_possible_wrap)]
    let p = p as i64;
    (0..PREFIX_LEN as i64).map(|i| if i < 4 { 1000 + i } else { 1000 * (p + 2) + i }).collect()
}

/// The tokens as `i32` when every one fits.
#[must_use]
pub fn narrow(tokens: &[i64]) -> Option<Vec<i32>> {
    tokens.iter().map(|&t| i32::try_from(t).ok()).collect()
}

/// A CSR batch for `append_batch`: ids, tokens, offsets, and the result a
/// correct implementation gives for the offsets alone (`None` = valid).
pub struct Batch {
    /// Request ids (may repeat or be unknown).
    pub ids: Vec<u64>,
    /// All tokens, concatenated.
    pub tokens: Vec<i64>,
    /// CSR offsets, or `None` (one token per request).
    pub offsets: Option<Vec<i64>>,
    /// Whether `offsets`/`tokens` are consistent.
    pub shape_ok: bool,
}

impl Batch {
    /// `[k][ids...][lens...][mode][corruption?][tokens...]`: `k % 5` ids,
    /// `k` lengths (`% 5`), `mode % 4`: 0 = no offsets, one token each;
    /// 1 = no offsets and one token too many (invalid); 2 = valid CSR
    /// offsets; 3 = corrupted offsets (kind from the next byte).
    pub fn decode(inp: &mut Input<'_>) -> Batch {
        let ids = inp.ids(4);
        let lens: Vec<usize> = ids.iter().map(|_| inp.count(4)).collect();
        let mode = inp.u8() % 4;
        let k = ids.len();
        let (offsets, total, shape_ok) = match mode {
            0 => (None, k, true),
            1 => (None, k + 1, false),
            _ => {
                let mut o = vec![0i64];
                for l in &lens {
                    #[allow(clippy::cast_possible_wrap)]
                    o.push(o[o.len() - 1] + *l as i64);
                }
                #[allow(clippy::cast_sign_loss, clippy::cast_possible_truncation)]
                let total = o[k] as usize;
                if mode == 2 {
                    (Some(o), total, true)
                } else {
                    match inp.u8() % 6 {
                        0 => {
                            o.pop(); // too few entries
                        }
                        1 => o.push(total as i64), // too many entries
                        2 => o[0] = 1,
                        3 => o[k] += 1,
                        4 => o[0] = -1,
                        _ => {
                            // a decreasing step (or, for k == 0, a bad end)
                            if k >= 2 {
                                o[1] = o[2] + 1;
                            } else {
                                o[k] = -1;
                            }
                        }
                    }
                    let ok = o.len() == k + 1
                        && o[0] == 0
                        && o[k] == total as i64
                        && o.windows(2).all(|w| w[0] <= w[1]);
                    (Some(o), total, ok)
                }
            }
        };
        let tokens = (0..total).map(|_| inp.token()).collect();
        Batch { ids, tokens, offsets, shape_ok }
    }

    /// Request `i`'s tokens (only for a batch with `shape_ok`).
    #[must_use]
    pub fn slice(&self, i: usize) -> &[i64] {
        match &self.offsets {
            #[allow(clippy::cast_sign_loss, clippy::cast_possible_truncation)]
            Some(o) => &self.tokens[o[i] as usize..o[i + 1] as usize],
            None => &self.tokens[i..=i],
        }
    }

    /// The error kind a correct `append_batch` / `free_batch` validation gives
    /// for this batch against the running requests `running` (`None`: valid).
    #[must_use]
    pub fn expected_error(&self, running: &dyn Fn(u64) -> bool) -> Option<ErrorKind> {
        if !self.shape_ok {
            return Some(ErrorKind::InvalidArgument);
        }
        ids_error(&self.ids, running)
    }
}

/// The error a batch of ids gives: the first unknown id (`UnknownRequest`) or
/// repeated id (`InvalidArgument`), in order.
#[must_use]
pub fn ids_error(ids: &[u64], running: &dyn Fn(u64) -> bool) -> Option<ErrorKind> {
    let mut seen = Vec::new();
    for &id in ids {
        if !running(id) {
            return Some(ErrorKind::UnknownRequest);
        }
        if seen.contains(&id) {
            return Some(ErrorKind::InvalidArgument);
        }
        seen.push(id);
    }
    None
}

/// Decodes and checks `fill_block_tables`: `[k][ids...][width][delta]`, `k % 4`
/// ids, `width % 12`, output length `k * width + {0, +1, -1}[delta % 3]`.
/// Checks the result against each request's table; on error nothing may be
/// written.
pub fn check_block_tables<T: TableSource>(src: &T, inp: &mut Input<'_>) {
    let ids = inp.ids(3);
    let width = inp.count(11);
    let exact = ids.len() * width;
    let len = match inp.u8() % 3 {
        0 => exact,
        1 => exact + 1,
        _ => exact.saturating_sub(1),
    };
    const SENTINEL: i32 = -7;
    let mut out = vec![SENTINEL; len];
    let res = src.fill_block_tables(&ids, width, &mut out);
    let tables: Vec<Option<&[T::Entry]>> = ids.iter().map(|&id| src.blocks(RequestId(id)).ok()).collect();
    let expect_ok = len == exact
        && tables.iter().all(Option::is_some)
        && tables.iter().flatten().all(|t| t.len() <= width);
    assert_eq!(res.is_ok(), expect_ok, "fill_block_tables({ids:?}, {width}, len {len}): {res:?}");
    match res {
        Ok(()) => {
            for (row, t) in out.chunks(width.max(1)).zip(&tables) {
                let t = t.expect("checked above");
                for (j, v) in row.iter().enumerate() {
                    let want = t.get(j).map_or(0, |b| i32::try_from(b.raw()).expect("block ids fit i32"));
                    assert_eq!(*v, want, "block table row of {ids:?}, column {j}");
                }
            }
        }
        Err(e) => {
            assert!(matches!(e.kind, ErrorKind::InvalidArgument | ErrorKind::UnknownRequest), "{e:?}");
            assert!(out.iter().all(|&v| v == SENTINEL), "fill_block_tables wrote on error");
        }
    }
}

/// Decodes and checks `slot_mapping`: `[k][ids...][q per id...][flags]`;
/// `q` byte 255 asks one token more than the request holds, 254 asks -1,
/// others `q % (n + 1)`; flags bit 0 drops the last query length (mismatch).
pub fn check_slot_mapping<T: TableSource>(src: &T, inp: &mut Input<'_>) {
    let ids = inp.ids(3);
    let mut q: Vec<i64> = ids
        .iter()
        .map(|&id| {
            let n = src.num_tokens(RequestId(id)).unwrap_or(3);
            #[allow(clippy::cast_possible_wrap)]
            match inp.u8() {
                255 => n as i64 + 1,
                254 => -1,
                b => (usize::from(b) % (n + 1)) as i64,
            }
        })
        .collect();
    if inp.u8() & 1 == 1 {
        q.pop();
    }
    let res = src.slot_mapping(&ids, &q);
    let bs = src.table_block_size();
    let mut want = Vec::new();
    let mut ok = ids.len() == q.len();
    if ok {
        for (&id, &ql) in ids.iter().zip(&q) {
            let Ok((blocks, n)) = src.table(RequestId(id)) else {
                ok = false;
                break;
            };
            let Some(ql) = usize::try_from(ql).ok().filter(|&x| x <= n) else {
                ok = false;
                break;
            };
            for pos in n - ql..n {
                #[allow(clippy::cast_possible_wrap)]
                want.push((blocks[pos / bs].index() * bs + pos % bs) as i64);
            }
        }
    }
    match res {
        Ok(v) => {
            assert!(ok, "slot_mapping({ids:?}, {q:?}) accepted a bad batch");
            assert_eq!(v, want, "slot_mapping({ids:?}, {q:?})");
        }
        Err(e) => {
            assert!(!ok, "slot_mapping({ids:?}, {q:?}) refused a good batch: {e:?}");
            assert!(matches!(e.kind, ErrorKind::InvalidArgument | ErrorKind::UnknownRequest), "{e:?}");
        }
    }
}

/// Shape checks of drained KV events; `page` is the block/page size.
pub fn check_events(events: &[KvEvent], enabled: bool, page: usize) {
    if !enabled {
        assert!(events.is_empty(), "events buffered while disabled");
    }
    for ev in events {
        if let KvEvent::BlockStored { block_hashes, token_ids, block_size, extra_keys, .. } = ev {
            assert!(!block_hashes.is_empty(), "empty BlockStored");
            assert_eq!(*block_size, page, "BlockStored block size");
            assert_eq!(token_ids.len(), page * block_hashes.len(), "BlockStored tokens");
            assert_eq!(extra_keys.len(), block_hashes.len(), "BlockStored extra keys");
        }
    }
}

/// The running requests as the harness saw them: id -> tokens (and spec).
pub type Mirror<S> = HashMap<u64, (Vec<i64>, S)>;

/// Blocks needed to grow a sequence of `have` tokens by `add` (`unit` tokens per block).
fn blocks_to_grow(have: usize, add: usize, unit: usize) -> usize {
    (have + add).div_ceil(unit) - have.div_ceil(unit)
}

/// Checks `append(id, tokens)`'s answer against the mirror: an unknown id is
/// `UnknownRequest`; a running one answers whether the blocks it needs fit in
/// the `avail` free ones (`unit` tokens per block), and on `true` the tokens
/// join the mirror. Returns whether the state must be unchanged.
pub fn check_append<S>(
    res: &KvResult<bool>,
    mirror: &mut Mirror<S>,
    id: u64,
    tokens: &[i64],
    unit: usize,
    avail: usize,
) -> bool {
    let Some((have, _)) = mirror.get_mut(&id) else {
        assert_err(res, ErrorKind::UnknownRequest);
        return true;
    };
    let need = blocks_to_grow(have.len(), tokens.len(), unit);
    let ok = *res.as_ref().expect("append to a running request");
    assert_eq!(ok, need <= avail, "append needing {need} blocks, {avail} available");
    if ok {
        have.extend_from_slice(tokens);
    }
    !ok
}

/// [`check_append`] for a whole `append_batch`: a bad batch gets the error
/// [`Batch::expected_error`] names; a valid one is all-or-nothing.
pub fn check_append_batch<S>(
    res: &KvResult<bool>,
    b: &Batch,
    mirror: &mut Mirror<S>,
    unit: usize,
    avail: usize,
) -> bool {
    if let Some(kind) = b.expected_error(&|id| mirror.contains_key(&id)) {
        assert_err(res, kind);
        return true;
    }
    let ok = match res {
        Ok(ok) => *ok,
        Err(e) => panic!("append_batch refused a valid batch {:?}: {e:?}", b.ids),
    };
    let need: usize = b
        .ids
        .iter()
        .enumerate()
        .map(|(i, id)| blocks_to_grow(mirror[id].0.len(), b.slice(i).len(), unit))
        .sum();
    assert_eq!(ok, need <= avail, "append_batch needing {need} blocks, {avail} available");
    if ok {
        for (i, id) in b.ids.iter().enumerate() {
            mirror.get_mut(id).expect("running").0.extend_from_slice(b.slice(i));
        }
    }
    !ok
}

/// Checks `free_batch(ids)`: a bad id list gets [`ids_error`]'s error and
/// frees nothing; a valid one frees every request. Returns whether the state
/// must be unchanged.
pub fn check_free_batch<S>(res: &KvResult<()>, ids: &[u64], mirror: &mut Mirror<S>) -> bool {
    if let Some(kind) = ids_error(ids, &|id| mirror.contains_key(&id)) {
        assert_err(res, kind);
        return true;
    }
    res.as_ref().expect("free_batch of running requests");
    for id in ids {
        mirror.remove(id);
    }
    false
}

/// Checks each id's token count and table length against the mirror.
pub fn check_mirror<T: TableSource, S>(src: &T, mirror: &Mirror<S>) {
    let page = src.table_block_size();
    for id in 0..NUM_IDS {
        match (mirror.get(&id), src.table(RequestId(id))) {
            (Some((t, _)), Ok((blocks, n))) => {
                assert_eq!(n, t.len(), "request {id}: token count");
                assert_eq!(blocks.len(), n.div_ceil(page), "request {id}: table length");
            }
            (None, Err(e)) => assert_eq!(e.kind, ErrorKind::UnknownRequest),
            (m, r) => panic!("request {id}: harness has {:?}, cache {:?}", m.map(|x| &x.0), r.map(|x| x.1)),
        }
    }
}

/// Asserts a result is an error of `kind`.
#[track_caller]
pub fn assert_err<T: std::fmt::Debug>(res: &KvResult<T>, kind: ErrorKind) {
    match res {
        Err(e) => assert_eq!(e.kind, kind, "error kind: {e:?}"),
        Ok(v) => panic!("expected {kind:?}, got Ok({v:?})"),
    }
}

/// Whether `KVINDEX_FUZZ_TRACE` is set: the harnesses then print each decoded
/// operation and the state after it to stderr (to read a crash input).
#[must_use]
pub fn trace() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("KVINDEX_FUZZ_TRACE").is_some())
}
