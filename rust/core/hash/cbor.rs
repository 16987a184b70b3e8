//! Canonical CBOR (RFC 8949 deterministic encoding) of a block payload, byte
//! for byte as `cbor2.dumps((parent, tuple(tokens), extra_keys), canonical=True)`
//! produces it for vLLM's `sha256_cbor` / `xxhash_cbor` modes.
//!
//! Payload: `83` (array of 3), byte string parent, array of token ints,
//! then `f6` (None) or an array of key arrays.
//!
//! Invariant: the bytes are exactly `cbor2`'s canonical encoding (golden
//! tests). Costs: O(tokens + keys) bytes into the caller's buffer.

use super::keys::ExtraKey;

#[inline]
fn head(buf: &mut Vec<u8>, major: u8, n: u64) {
    let m = major << 5;
    if n < 24 {
        #[allow(clippy::cast_possible_truncation)]
        buf.push(m | n as u8);
    } else if n < 1 << 8 {
        #[allow(clippy::cast_possible_truncation)]
        buf.extend_from_slice(&[m | 24, n as u8]);
    } else if n < 1 << 16 {
        buf.push(m | 25);
        #[allow(clippy::cast_possible_truncation)]
        buf.extend_from_slice(&(n as u16).to_be_bytes());
    } else if n < 1 << 32 {
        buf.push(m | 26);
        #[allow(clippy::cast_possible_truncation)]
        buf.extend_from_slice(&(n as u32).to_be_bytes());
    } else {
        buf.push(m | 27);
        buf.extend_from_slice(&n.to_be_bytes());
    }
}

/// Appends a CBOR integer (major 0 for x >= 0, major 1 with n = -1 - x otherwise).
#[inline]
pub fn int(buf: &mut Vec<u8>, x: i64) {
    let k = buf.len();
    buf.resize(k + 9, 0);
    let n = put_int(buf, k, x);
    buf.truncate(k + n);
}

/// Appends a CBOR text string.
pub fn text(buf: &mut Vec<u8>, s: &str) {
    head(buf, 3, s.len() as u64);
    buf.extend_from_slice(s.as_bytes());
}

/// Appends a CBOR byte string.
pub fn bytes(buf: &mut Vec<u8>, b: &[u8]) {
    head(buf, 2, b.len() as u64);
    buf.extend_from_slice(b);
}

/// Appends an array head of `n` elements.
pub fn array(buf: &mut Vec<u8>, n: usize) {
    head(buf, 4, n as u64);
}

/// Payload bytes of a CBOR integer argument by its bit length (0..=64).
const PAYLOAD_LEN: [u8; 65] = {
    let mut t = [8u8; 65];
    let mut i = 0;
    while i <= 64 {
        t[i] = if i <= 8 {
            1
        } else if i <= 16 {
            2
        } else if i <= 32 {
            4
        } else {
            8
        };
        i += 1;
    }
    t
};

/// Writes the CBOR integer `x` at `out[k..]` and returns its length (1 to 9).
/// Always writes 9 bytes (the tail is scratch the next item overwrites), so
/// there is one bounds check and no branch on the length per integer.
#[inline(always)]
fn put_int(out: &mut [u8], k: usize, x: i64) -> usize {
    // Major type 0 for x >= 0, major type 1 with n = -1 - x (== !x) otherwise.
    #[allow(clippy::cast_sign_loss)]
    let (major, n) = if x >= 0 { (0u8, x as u64) } else { (0x20u8, !(x as u64)) };
    let dst = &mut out[k..k + 9];
    if n < 24 {
        #[allow(clippy::cast_possible_truncation)]
        let b = major | n as u8;
        dst[0] = b;
        return 1;
    }
    // Payload bytes from the bit length, without a data-dependent branch
    // (token sizes are random, so branches here mispredict).
    let len = usize::from(PAYLOAD_LEN[(64 - n.leading_zeros()) as usize]);
    #[allow(clippy::cast_possible_truncation)]
    let info = 24 + len.trailing_zeros() as u8;
    dst[0] = major | info;
    // The value's big-endian bytes, shifted to the front of the 8-byte field.
    let v = n << (64 - 8 * len);
    dst[1..9].copy_from_slice(&v.to_be_bytes());
    1 + len
}

/// Encodes `(parent, tuple(tokens), extra_keys or None)`.
pub fn block_payload(
    buf: &mut Vec<u8>,
    parent: &[u8],
    tokens: impl ExactSizeIterator<Item = i64>,
    keys: &[ExtraKey<'_>],
) {
    buf.push(0x83);
    bytes(buf, parent);
    array(buf, tokens.len());
    let start = buf.len();
    buf.resize(start + 9 * tokens.len() + 9, 0);
    let mut k = start;
    for t in tokens {
        k += put_int(buf, k, t);
    }
    buf.truncate(k);
    if keys.is_empty() {
        buf.push(0xf6);
        return;
    }
    array(buf, keys.len());
    for k in keys {
        match *k {
            ExtraKey::Lora(name, path) => {
                buf.push(0x83);
                text(buf, "lora");
                text(buf, name);
                text(buf, path);
            }
            ExtraKey::Mm(id, off) => {
                buf.push(0x83);
                text(buf, "mm");
                text(buf, id);
                int(buf, off);
            }
            ExtraKey::Salt(s) => {
                buf.push(0x82);
                text(buf, "cache_salt");
                text(buf, s);
            }
        }
    }
}
