//! The msgpack subset KV-event batches use: a writer that picks the shortest
//! head for every value (as msgspec does) and a bounds-checked reader.
//!
//! # Invariants
//! - The writer appends to a caller-owned `Vec<u8>`; it never fails.
//! - The reader never reads past its slice, never allocates more than the
//!   input could describe (a length is capped by the bytes left), and never
//!   recurses deeper than [`MAX_DEPTH`]; every malformed input is an `Err`.
//!
//! # Costs
//! Writing a value is O(its encoded size); reading is O(bytes read).

/// Deepest nesting the generic reader accepts.
pub const MAX_DEPTH: usize = 32;

/// Appends `nil`.
#[inline]
pub fn write_nil(out: &mut Vec<u8>) {
    out.push(0xc0);
}

/// Appends a bool.
#[inline]
pub fn write_bool(out: &mut Vec<u8>, v: bool) {
    out.push(if v { 0xc3 } else { 0xc2 });
}

/// Appends an unsigned integer in its shortest form.
#[inline]
pub fn write_uint(out: &mut Vec<u8>, v: u64) {
    if v < 0x80 {
        #[allow(clippy::cast_possible_truncation)]
        out.push(v as u8);
    } else if v <= 0xff {
        #[allow(clippy::cast_possible_truncation)]
        out.extend_from_slice(&[0xcc, v as u8]);
    } else if v <= 0xffff {
        out.push(0xcd);
        #[allow(clippy::cast_possible_truncation)]
        out.extend_from_slice(&(v as u16).to_be_bytes());
    } else if v <= 0xffff_ffff {
        out.push(0xce);
        #[allow(clippy::cast_possible_truncation)]
        out.extend_from_slice(&(v as u32).to_be_bytes());
    } else {
        out.push(0xcf);
        out.extend_from_slice(&v.to_be_bytes());
    }
}

/// Appends a signed integer in its shortest form (non-negative values use
/// the unsigned forms, as msgspec does).
#[inline]
pub fn write_int(out: &mut Vec<u8>, v: i64) {
    if v >= 0 {
        #[allow(clippy::cast_sign_loss)]
        write_uint(out, v as u64);
    } else if v >= -32 {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        out.push(v as i8 as u8);
    } else if v >= i64::from(i8::MIN) {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        out.extend_from_slice(&[0xd0, v as i8 as u8]);
    } else if v >= i64::from(i16::MIN) {
        out.push(0xd1);
        #[allow(clippy::cast_possible_truncation)]
        out.extend_from_slice(&(v as i16).to_be_bytes());
    } else if v >= i64::from(i32::MIN) {
        out.push(0xd2);
        #[allow(clippy::cast_possible_truncation)]
        out.extend_from_slice(&(v as i32).to_be_bytes());
    } else {
        out.push(0xd3);
        out.extend_from_slice(&v.to_be_bytes());
    }
}

/// Appends a float64 (`cb` + 8 bytes big-endian).
#[inline]
pub fn write_f64(out: &mut Vec<u8>, v: f64) {
    out.push(0xcb);
    out.extend_from_slice(&v.to_bits().to_be_bytes());
}

#[inline]
fn write_head(out: &mut Vec<u8>, n: usize, fix: u8, fix_max: usize, m8: Option<u8>, m16: u8, m32: u8) {
    #[allow(clippy::cast_possible_truncation)]
    if n <= fix_max {
        out.push(fix | n as u8);
    } else if let (Some(m8), true) = (m8, n <= 0xff) {
        out.extend_from_slice(&[m8, n as u8]);
    } else if n <= 0xffff {
        out.push(m16);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(m32);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    }
}

/// Appends a UTF-8 string.
#[inline]
pub fn write_str(out: &mut Vec<u8>, s: &str) {
    write_head(out, s.len(), 0xa0, 31, Some(0xd9), 0xda, 0xdb);
    out.extend_from_slice(s.as_bytes());
}

/// Appends a byte string.
#[inline]
pub fn write_bin(out: &mut Vec<u8>, b: &[u8]) {
    let n = b.len();
    #[allow(clippy::cast_possible_truncation)]
    if n <= 0xff {
        out.extend_from_slice(&[0xc4, n as u8]);
    } else if n <= 0xffff {
        out.push(0xc5);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(0xc6);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    }
    out.extend_from_slice(b);
}

/// Appends an array head for `n` elements (fixarray, array16 or array32).
#[inline]
pub fn write_array_len(out: &mut Vec<u8>, n: usize) {
    write_head(out, n, 0x90, 15, None, 0xdc, 0xdd);
}

/// Appends a map head for `n` entries in the form a struct of `max_fields`
/// fields gets from msgspec: fixmap below 16 possible fields, map16 from 16.
#[inline]
pub fn write_struct_map_len(out: &mut Vec<u8>, n: usize, max_fields: usize) {
    if max_fields < 16 {
        #[allow(clippy::cast_possible_truncation)]
        out.push(0x80 | n as u8);
    } else {
        out.push(0xde);
        #[allow(clippy::cast_possible_truncation)]
        out.extend_from_slice(&(n as u16).to_be_bytes());
    }
}

/// Appends a map head for `n` entries in its shortest form.
#[inline]
pub fn write_map_len(out: &mut Vec<u8>, n: usize) {
    write_head(out, n, 0x80, 15, None, 0xde, 0xdf);
}

/// A decoded msgpack value (for fields whose shape vLLM leaves open).
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `nil`.
    Nil,
    /// A bool.
    Bool(bool),
    /// A signed integer (every negative value, and non-negative ones that fit).
    Int(i64),
    /// An unsigned integer above `i64::MAX`.
    UInt(u64),
    /// A float.
    Float(f64),
    /// A UTF-8 string.
    Str(String),
    /// A byte string.
    Bin(Vec<u8>),
    /// An array.
    Array(Vec<Value>),
    /// A map, entries in wire order.
    Map(Vec<(Value, Value)>),
}

impl Value {
    /// Appends the value in its shortest form.
    pub fn write(&self, out: &mut Vec<u8>) {
        match self {
            Value::Nil => write_nil(out),
            Value::Bool(b) => write_bool(out, *b),
            Value::Int(i) => write_int(out, *i),
            Value::UInt(u) => write_uint(out, *u),
            Value::Float(f) => write_f64(out, *f),
            Value::Str(s) => write_str(out, s),
            Value::Bin(b) => write_bin(out, b),
            Value::Array(a) => {
                write_array_len(out, a.len());
                for v in a {
                    v.write(out);
                }
            }
            Value::Map(m) => {
                write_map_len(out, m.len());
                for (k, v) in m {
                    k.write(out);
                    v.write(out);
                }
            }
        }
    }
}

/// What the reader found where it expected something else.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadError {
    /// Byte offset of the offending value.
    pub pos: usize,
    /// What was wrong.
    pub msg: String,
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at byte {}", self.msg, self.pos)
    }
}

/// Shorthand for reader results.
pub type ReadResult<T> = Result<T, ReadError>;

/// An integer as read: msgpack keeps the signed and unsigned forms apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Int {
    /// A negative value (or one sent in a signed form).
    I(i64),
    /// A non-negative value.
    U(u64),
}

/// A cursor over a msgpack buffer.
#[derive(Clone, Debug)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// A reader at the start of `buf`.
    #[must_use]
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    /// Current byte offset.
    #[must_use]
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Bytes not read yet.
    #[must_use]
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// An error at the current position.
    #[cold]
    pub fn err(&self, msg: impl Into<String>) -> ReadError {
        ReadError { pos: self.pos, msg: msg.into() }
    }

    fn take(&mut self, n: usize) -> ReadResult<&'a [u8]> {
        if self.remaining() < n {
            return Err(self.err(format!("truncated: {n} bytes needed, {} left", self.remaining())));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn be(&mut self, n: usize) -> ReadResult<u64> {
        Ok(self.take(n)?.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
    }

    /// The next marker byte, not consumed.
    ///
    /// # Errors
    /// At the end of the buffer.
    pub fn peek(&self) -> ReadResult<u8> {
        self.buf.get(self.pos).copied().ok_or_else(|| self.err("truncated: value expected"))
    }

    /// Consumes a `nil` if one is next; returns whether it did.
    ///
    /// # Errors
    /// At the end of the buffer.
    pub fn try_nil(&mut self) -> ReadResult<bool> {
        if self.peek()? == 0xc0 {
            self.pos += 1;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    fn len_or_count(&mut self, n: u64, min_item: usize, what: &str) -> ReadResult<usize> {
        // Each item takes at least `min_item` bytes: a longer count is malformed.
        let max = self.remaining() / min_item.max(1);
        match usize::try_from(n) {
            Ok(n) if n <= max => Ok(n),
            _ => Err(self.err(format!("{what} of {n} items cannot fit in {} bytes", self.remaining()))),
        }
    }

    /// Reads an array head.
    ///
    /// # Errors
    /// Another type, or a length the buffer cannot hold.
    pub fn array_len(&mut self) -> ReadResult<usize> {
        let at = self.pos;
        let m = self.peek()?;
        self.pos += 1;
        let n = match m {
            0x90..=0x9f => u64::from(m & 0x0f),
            0xdc => self.be(2)?,
            0xdd => self.be(4)?,
            _ => {
                self.pos = at;
                return Err(self.err(format!("expected an array, found {}", marker_name(m))));
            }
        };
        self.len_or_count(n, 1, "array")
    }

    /// Reads a map head.
    ///
    /// # Errors
    /// Another type, or a length the buffer cannot hold.
    pub fn map_len(&mut self) -> ReadResult<usize> {
        let at = self.pos;
        let m = self.peek()?;
        self.pos += 1;
        let n = match m {
            0x80..=0x8f => u64::from(m & 0x0f),
            0xde => self.be(2)?,
            0xdf => self.be(4)?,
            _ => {
                self.pos = at;
                return Err(self.err(format!("expected a map, found {}", marker_name(m))));
            }
        };
        self.len_or_count(n, 2, "map")
    }

    /// Reads a string.
    ///
    /// # Errors
    /// Another type, truncation, or invalid UTF-8.
    pub fn str(&mut self) -> ReadResult<&'a str> {
        let at = self.pos;
        let m = self.peek()?;
        self.pos += 1;
        let n = match m {
            0xa0..=0xbf => u64::from(m & 0x1f),
            0xd9 => self.be(1)?,
            0xda => self.be(2)?,
            0xdb => self.be(4)?,
            _ => {
                self.pos = at;
                return Err(self.err(format!("expected a string, found {}", marker_name(m))));
            }
        };
        let n = self.len_or_count(n, 1, "string")?;
        let bytes = self.take(n)?;
        std::str::from_utf8(bytes).map_err(|_| ReadError { pos: at, msg: "string is not UTF-8".into() })
    }

    /// Reads a byte string.
    ///
    /// # Errors
    /// Another type or truncation.
    pub fn bin(&mut self) -> ReadResult<&'a [u8]> {
        let at = self.pos;
        let m = self.peek()?;
        self.pos += 1;
        let n = match m {
            0xc4 => self.be(1)?,
            0xc5 => self.be(2)?,
            0xc6 => self.be(4)?,
            _ => {
                self.pos = at;
                return Err(self.err(format!("expected bytes, found {}", marker_name(m))));
            }
        };
        let n = self.len_or_count(n, 1, "byte string")?;
        self.take(n)
    }

    /// Reads an integer in any of its forms.
    ///
    /// # Errors
    /// Another type or truncation.
    pub fn int(&mut self) -> ReadResult<Int> {
        let at = self.pos;
        let m = self.peek()?;
        self.pos += 1;
        #[allow(clippy::cast_possible_wrap, clippy::cast_possible_truncation)]
        Ok(match m {
            0x00..=0x7f => Int::U(u64::from(m)),
            0xe0..=0xff => Int::I(i64::from(m as i8)),
            0xcc => Int::U(self.be(1)?),
            0xcd => Int::U(self.be(2)?),
            0xce => Int::U(self.be(4)?),
            0xcf => Int::U(self.be(8)?),
            0xd0 => Int::I(i64::from(self.be(1)? as u8 as i8)),
            0xd1 => Int::I(i64::from(self.be(2)? as u16 as i16)),
            0xd2 => Int::I(i64::from(self.be(4)? as u32 as i32)),
            0xd3 => Int::I(self.be(8)? as i64),
            _ => {
                self.pos = at;
                return Err(self.err(format!("expected an integer, found {}", marker_name(m))));
            }
        })
    }

    /// Reads an integer that must fit in `i64`.
    ///
    /// # Errors
    /// Another type, truncation, or a value above `i64::MAX`.
    pub fn i64(&mut self) -> ReadResult<i64> {
        let at = self.pos;
        match self.int()? {
            Int::I(v) => Ok(v),
            Int::U(v) => {
                i64::try_from(v).map_err(|_| ReadError { pos: at, msg: format!("{v} exceeds int64") })
            }
        }
    }

    /// Reads a float (float32, float64, or an integer).
    ///
    /// # Errors
    /// Another type or truncation.
    pub fn f64(&mut self) -> ReadResult<f64> {
        let m = self.peek()?;
        match m {
            0xcb => {
                self.pos += 1;
                Ok(f64::from_bits(self.be(8)?))
            }
            0xca => {
                self.pos += 1;
                #[allow(clippy::cast_possible_truncation)]
                Ok(f64::from(f32::from_bits(self.be(4)? as u32)))
            }
            #[allow(clippy::cast_precision_loss)]
            _ => match self.int()? {
                Int::I(v) => Ok(v as f64),
                Int::U(v) => Ok(v as f64),
            },
        }
    }

    /// Reads any value (depth-limited).
    ///
    /// # Errors
    /// Malformed or truncated input, or nesting deeper than [`MAX_DEPTH`].
    pub fn value(&mut self) -> ReadResult<Value> {
        self.value_at(0)
    }

    fn value_at(&mut self, depth: usize) -> ReadResult<Value> {
        if depth > MAX_DEPTH {
            return Err(self.err(format!("nesting deeper than {MAX_DEPTH}")));
        }
        let m = self.peek()?;
        Ok(match m {
            0xc0 => {
                self.pos += 1;
                Value::Nil
            }
            0xc2 | 0xc3 => {
                self.pos += 1;
                Value::Bool(m == 0xc3)
            }
            0xca | 0xcb => Value::Float(self.f64()?),
            0x00..=0x7f | 0xe0..=0xff | 0xcc..=0xd3 => match self.int()? {
                Int::I(v) => Value::Int(v),
                Int::U(v) => i64::try_from(v).map_or(Value::UInt(v), Value::Int),
            },
            0xa0..=0xbf | 0xd9..=0xdb => Value::Str(self.str()?.to_owned()),
            0xc4..=0xc6 => Value::Bin(self.bin()?.to_vec()),
            0x90..=0x9f | 0xdc | 0xdd => {
                let n = self.array_len()?;
                let mut a = Vec::with_capacity(n);
                for _ in 0..n {
                    a.push(self.value_at(depth + 1)?);
                }
                Value::Array(a)
            }
            0x80..=0x8f | 0xde | 0xdf => {
                let n = self.map_len()?;
                let mut kv = Vec::with_capacity(n);
                for _ in 0..n {
                    let k = self.value_at(depth + 1)?;
                    let v = self.value_at(depth + 1)?;
                    kv.push((k, v));
                }
                Value::Map(kv)
            }
            _ => return Err(self.err(format!("unsupported msgpack type {}", marker_name(m)))),
        })
    }

    /// Skips one value of any type.
    ///
    /// # Errors
    /// As [`Reader::value`].
    pub fn skip(&mut self) -> ReadResult<()> {
        // Iterative: nesting costs a counter, not stack.
        let mut pending: usize = 1;
        while pending > 0 {
            pending -= 1;
            let m = self.peek()?;
            match m {
                0xc0 | 0xc2 | 0xc3 => self.pos += 1,
                0xca | 0xcb => drop(self.f64()?),
                0x00..=0x7f | 0xe0..=0xff | 0xcc..=0xd3 => drop(self.int()?),
                0xa0..=0xbf | 0xd9..=0xdb => drop(self.str()?),
                0xc4..=0xc6 => drop(self.bin()?),
                0x90..=0x9f | 0xdc | 0xdd => pending += self.array_len()?,
                0x80..=0x8f | 0xde | 0xdf => pending += 2 * self.map_len()?,
                _ => return Err(self.err(format!("unsupported msgpack type {}", marker_name(m)))),
            }
        }
        Ok(())
    }
}

/// A readable name for a marker byte, for error messages.
#[must_use]
pub fn marker_name(m: u8) -> String {
    let kind = match m {
        0x00..=0x7f | 0xe0..=0xff | 0xcc..=0xd3 => "integer",
        0x80..=0x8f | 0xde | 0xdf => "map",
        0x90..=0x9f | 0xdc | 0xdd => "array",
        0xa0..=0xbf | 0xd9..=0xdb => "string",
        0xc0 => "nil",
        0xc2 | 0xc3 => "bool",
        0xc4..=0xc6 => "bytes",
        0xca | 0xcb => "float",
        0xc7..=0xc9 | 0xd4..=0xd8 => "extension",
        _ => "reserved byte",
    };
    format!("{kind} (0x{m:02x})")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(f: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let mut v = Vec::new();
        f(&mut v);
        v
    }

    #[test]
    fn shortest_integer_forms() {
        assert_eq!(enc(|o| write_int(o, 0)), [0x00]);
        assert_eq!(enc(|o| write_int(o, 127)), [0x7f]);
        assert_eq!(enc(|o| write_int(o, 128)), [0xcc, 0x80]);
        assert_eq!(enc(|o| write_int(o, 256)), [0xcd, 0x01, 0x00]);
        assert_eq!(enc(|o| write_int(o, 65536)), [0xce, 0, 1, 0, 0]);
        assert_eq!(enc(|o| write_uint(o, 1 << 32)), [0xcf, 0, 0, 0, 1, 0, 0, 0, 0]);
        assert_eq!(enc(|o| write_int(o, -1)), [0xff]);
        assert_eq!(enc(|o| write_int(o, -32)), [0xe0]);
        assert_eq!(enc(|o| write_int(o, -33)), [0xd0, 0xdf]);
        assert_eq!(enc(|o| write_int(o, -129)), [0xd1, 0xff, 0x7f]);
        assert_eq!(enc(|o| write_int(o, -32769)), [0xd2, 0xff, 0xff, 0x7f, 0xff]);
        assert_eq!(enc(|o| write_int(o, i64::MIN))[0], 0xd3);
    }

    #[test]
    fn round_trips_through_the_reader() {
        for v in [0i64, 1, 127, 128, 255, 256, 65535, 65536, -1, -32, -33, -128, -129, i64::MIN, i64::MAX] {
            let b = enc(|o| write_int(o, v));
            let mut r = Reader::new(&b);
            assert_eq!(r.i64(), Ok(v));
            assert_eq!(r.remaining(), 0);
        }
        for n in [0usize, 15, 16, 65535, 65536] {
            let b = enc(|o| write_array_len(o, n));
            let mut padded = b.clone();
            padded.resize(b.len() + n, 0);
            assert_eq!(Reader::new(&padded).array_len(), Ok(n));
        }
        for s in ["", "x", &"y".repeat(31), &"z".repeat(32), &"w".repeat(300)] {
            let b = enc(|o| write_str(o, s));
            assert_eq!(Reader::new(&b).str(), Ok(s));
        }
    }

    #[test]
    fn malformed_input_is_an_error() {
        assert!(Reader::new(&[]).value().is_err());
        assert!(Reader::new(&[0xcd, 0x01]).int().is_err());
        assert!(Reader::new(&[0xdd, 0xff, 0xff, 0xff, 0xff]).array_len().is_err());
        assert!(Reader::new(&[0xa3, b'a']).str().is_err());
        assert!(Reader::new(&[0xa1, 0xff]).str().is_err());
        assert!(Reader::new(&[0xc1]).value().is_err());
        let deep = vec![0x91u8; 100];
        assert!(Reader::new(&deep).value().is_err());
        assert!(Reader::new(&[0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]).i64().is_err());
    }
}
