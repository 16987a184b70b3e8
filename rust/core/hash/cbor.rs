//! Canonical CBOR (RFC 8949 deterministic encoding) of a block payload, byte
//! for byte as `cbor2.dumps((parent, tuple(tokens), extra_keys), canonical=True)`
//! produces it for vLLM's `sha256_cbor` / `xxhash_cbor` modes.
//!
//! Payload: `83` (array of 3), byte string parent, array of token ints,
//! then `f6` (None) or an array of key arrays.

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
    if x >= 0 {
        #[allow(clippy::cast_sign_loss)]
        head(buf, 0, x as u64);
    } else {
        #[allow(clippy::cast_sign_loss)]
        head(buf, 1, (-1 - x) as u64);
    }
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
    for t in tokens {
        int(buf, t);
    }
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
