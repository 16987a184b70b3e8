//! Pickle protocol 5 of a block payload, byte for byte as CPython's C pickler
//! writes `pickle.dumps((parent, tuple(tokens), extra_keys), protocol=5)` for
//! the shapes vLLM hashes in its default `sha256` mode (and `xxhash`).
//!
//! Layout: `80 05`, then frames (`95 <u64 le length>`) holding the opcodes,
//! `2e` (STOP) last. Ints: BININT1 / BININT2 / BININT / LONG1; strings
//! SHORT_BINUNICODE / BINUNICODE; the parent SHORT_BINBYTES; tuples of 1-3
//! elements TUPLE1/2/3, longer ones MARK ... TUPLE; every bytes, str and
//! tuple is memoised (`94`). vLLM's tag strings (`"lora"`, `"mm"`,
//! `"cache_salt"`) are module constants, so a repeated tag in one payload is a
//! BINGET of its first memo slot. User strings reach vLLM as separately
//! deserialised objects and are written in full, except the ones CPython
//! shares: `""` and every one-character string with a code point below 256
//! are singletons there, so a repeat of one of those in the same payload
//! (e.g. `lora=("a", "a")`) is a BINGET too.
//! A frame is committed at an opcode boundary once it holds 64 KiB; a string
//! of 64 KiB or more is written outside any frame, as CPython does.
//!
//! Invariant: the bytes are exactly CPython's pickler output for these
//! shapes (golden tests). Costs: O(tokens + keys) bytes into the caller's
//! buffer.

use super::keys::ExtraKey;

const FRAME_TARGET: usize = 64 * 1024;
const FRAME_HEADER: usize = 9;

struct Pickler<'b> {
    out: &'b mut Vec<u8>,
    /// Start of the open frame's 9-byte header placeholder, if a frame is open.
    frame_start: Option<usize>,
    framing: bool,
    memo: u32,
    mm_tag: Option<u32>,
    /// Memo slots of CPython's shared string singletons seen so far:
    /// (key from [`shared_key`], memo index).
    shared: Vec<(u32, u32)>,
}

/// CPython shares `""` and the one-character strings of code points
/// 0..=255 (one object each), so pickle memoises their repeats. Returns a key
/// for such a string (`256` for `""`, else the code point), `None` otherwise.
fn shared_key(s: &str) -> Option<u32> {
    let mut chars = s.chars();
    match (chars.next(), chars.next()) {
        (None, _) => Some(256),
        (Some(c), None) if (c as u32) < 256 => Some(c as u32),
        _ => None,
    }
}

impl Pickler<'_> {
    fn write(&mut self, b: &[u8]) {
        if self.framing && self.frame_start.is_none() {
            self.frame_start = Some(self.out.len());
            self.out.extend_from_slice(&[0u8; FRAME_HEADER]);
        }
        self.out.extend_from_slice(b);
    }

    fn commit_frame(&mut self) {
        if let Some(start) = self.frame_start.take() {
            let len = self.out.len() - start - FRAME_HEADER;
            if len >= 4 {
                self.out[start] = 0x95;
                self.out[start + 1..start + FRAME_HEADER].copy_from_slice(&(len as u64).to_le_bytes());
            } else {
                self.out.drain(start..start + FRAME_HEADER);
            }
        }
    }

    /// Called where CPython's pickler reaches an opcode boundary (each save).
    fn boundary(&mut self) {
        if let Some(start) = self.frame_start {
            if self.out.len() - start - FRAME_HEADER >= FRAME_TARGET {
                self.commit_frame();
            }
        }
    }

    fn memoize(&mut self) -> u32 {
        self.write(&[0x94]);
        self.memo += 1;
        self.memo - 1
    }

    fn int(&mut self, x: i64) {
        self.boundary();
        if (0..256).contains(&x) {
            #[allow(clippy::cast_sign_loss, clippy::cast_possible_truncation)]
            self.write(&[0x4b, x as u8]);
        } else if (0..65536).contains(&x) {
            #[allow(clippy::cast_sign_loss, clippy::cast_possible_truncation)]
            let v = (x as u16).to_le_bytes();
            self.write(&[0x4d, v[0], v[1]]);
        } else if i64::from(i32::MIN) <= x && x <= i64::from(i32::MAX) {
            #[allow(clippy::cast_possible_truncation)]
            let v = (x as i32).to_le_bytes();
            self.write(&[0x4a, v[0], v[1], v[2], v[3]]);
        } else {
            // Smallest n with -2^(8n-1) <= x < 2^(8n-1); here 5 <= n <= 8.
            let mut n = 5usize;
            while n < 8 {
                let lim = 1i64 << (8 * n - 1);
                if -lim <= x && x < lim {
                    break;
                }
                n += 1;
            }
            let le = x.to_le_bytes();
            #[allow(clippy::cast_possible_truncation)]
            let mut op = vec![0x8a, n as u8];
            op.extend_from_slice(&le[..n]);
            self.write(&op);
        }
    }

    /// Writes a str or bytes object: `small_op` + u8 length below 256 bytes,
    /// else `large_op` + u32 length; 64 KiB or more goes outside any frame.
    fn blob(&mut self, small_op: u8, large_op: u8, data: &[u8]) {
        self.boundary();
        let mut headbuf = Vec::with_capacity(5);
        if data.len() < 256 {
            #[allow(clippy::cast_possible_truncation)]
            headbuf.extend_from_slice(&[small_op, data.len() as u8]);
        } else {
            headbuf.push(large_op);
            #[allow(clippy::cast_possible_truncation)]
            headbuf.extend_from_slice(&(data.len() as u32).to_le_bytes());
        }
        if data.len() >= FRAME_TARGET {
            self.commit_frame();
            self.framing = false;
            self.write(&headbuf);
            self.write(data);
            self.framing = true;
        } else {
            self.write(&headbuf);
            self.write(data);
        }
    }

    fn str_obj(&mut self, s: &str) -> u32 {
        self.blob(0x8c, 0x58, s.as_bytes());
        self.memoize()
    }

    /// BINGET / LONG_BINGET of memo slot `idx` (a repeat of a memoised object).
    fn get(&mut self, idx: u32) {
        self.boundary();
        if idx < 256 {
            #[allow(clippy::cast_possible_truncation)]
            self.write(&[0x68, idx as u8]);
        } else {
            let v = idx.to_le_bytes();
            self.write(&[0x6a, v[0], v[1], v[2], v[3]]);
        }
    }

    /// A user string: written in full unless it is a repeat of one of
    /// CPython's shared singletons ([`shared_key`]).
    fn user_str(&mut self, s: &str) {
        match shared_key(s) {
            None => {
                self.str_obj(s);
            }
            Some(key) => {
                if let Some(&(_, idx)) = self.shared.iter().find(|(k, _)| *k == key) {
                    self.get(idx);
                } else {
                    let idx = self.str_obj(s);
                    self.shared.push((key, idx));
                }
            }
        }
    }

    fn tag(&mut self, s: &str, is_mm: bool) {
        if is_mm {
            if let Some(idx) = self.mm_tag {
                self.get(idx);
                return;
            }
            self.mm_tag = Some(self.str_obj(s));
        } else {
            self.str_obj(s);
        }
    }

    fn tuple_open(&mut self, n: usize) {
        self.boundary();
        if n > 3 {
            self.write(&[0x28]);
        }
    }

    fn tuple_close(&mut self, n: usize) {
        match n {
            1 => self.write(&[0x85]),
            2 => self.write(&[0x86]),
            3 => self.write(&[0x87]),
            _ => self.write(&[0x74]),
        }
        self.memoize();
    }
}

fn finish(p: &mut Pickler<'_>) {
    p.write(&[0x2e]);
    p.commit_frame();
}

/// Encodes `pickle.dumps(s, protocol=5)` for a str (the NONE_HASH seed).
pub fn str_payload(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&[0x80, 0x05]);
    let mut p =
        Pickler { out: buf, frame_start: None, framing: true, memo: 0, mm_tag: None, shared: Vec::new() };
    p.str_obj(s);
    finish(&mut p);
}

/// Encodes `pickle.dumps((parent, tuple(tokens), extra_keys or None), protocol=5)`.
pub fn block_payload(
    buf: &mut Vec<u8>,
    parent: &[u8],
    tokens: impl ExactSizeIterator<Item = i64>,
    keys: &[ExtraKey<'_>],
) {
    buf.extend_from_slice(&[0x80, 0x05]);
    let mut p =
        Pickler { out: buf, frame_start: None, framing: true, memo: 0, mm_tag: None, shared: Vec::new() };
    p.tuple_open(3);
    p.blob(0x43, 0x42, parent);
    p.memoize();
    let n = tokens.len();
    p.tuple_open(n);
    for t in tokens {
        p.int(t);
    }
    p.tuple_close(n);
    if keys.is_empty() {
        p.boundary();
        p.write(&[0x4e]);
    } else {
        p.tuple_open(keys.len());
        for k in keys {
            match *k {
                ExtraKey::Lora(name, path) => {
                    p.tuple_open(3);
                    p.tag("lora", false);
                    p.user_str(name);
                    p.user_str(path);
                    p.tuple_close(3);
                }
                ExtraKey::Mm(id, off) => {
                    p.tuple_open(3);
                    p.tag("mm", true);
                    p.user_str(id);
                    p.int(off);
                    p.tuple_close(3);
                }
                ExtraKey::Salt(s) => {
                    p.tuple_open(2);
                    p.tag("cache_salt", false);
                    p.user_str(s);
                    p.tuple_close(2);
                }
            }
        }
        p.tuple_close(keys.len());
    }
    p.tuple_close(3);
    finish(&mut p);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    /// CPython shares `""` and one-character latin-1 strings, so their repeats
    /// are BINGETs (bytes from `pickle.dumps(..., protocol=5)` on CPython 3.11,
    /// with the tags one object each and user strings built fresh).
    #[test]
    fn shared_short_strings_are_memoised() {
        let keys = [
            ExtraKey::Lora("a", "a"),
            ExtraKey::Mm("a", 0),
            ExtraKey::Mm("", -1),
            ExtraKey::Mm("", 1),
            ExtraKey::Salt("a"),
        ];
        let mut buf = Vec::new();
        block_payload(&mut buf, &[0x11; 16], [1i64, 2].into_iter(), &keys);
        assert_eq!(
            hex(&buf),
            "8005955e00000000000000431011111111111111111111111111111111944b014b028694288c046c6f72\
             61948c016194680387948c026d6d9468034b00879468058c00944affffffff8794680568074b018794\
             8c0a63616368655f73616c749468038694749487942e"
        );
    }
}
