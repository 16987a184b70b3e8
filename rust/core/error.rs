//! Errors a caller can cause. Each is reported before any state changes.
//!
//! Three kinds of failure exist in kvindex:
//! - an expected shortfall (not enough free blocks now) is a return value (`None`);
//!   a request that no state of the pool could hold is a caller error (`RequestTooLarge`);
//! - a caller error is a [`KvError`] (mapped to a `KvIndexError` subclass in Python);
//! - a broken internal invariant panics loudly (`expect`), or is reported by
//!   `check_invariants()` as an [`InvariantViolation`].
//!
//! Costs: an error owns its message, built on the error path only.

use std::fmt;

/// Which class of caller error occurred; the binding maps each to one Python
/// exception class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// A value is out of range or inconsistent (`ValueError`).
    InvalidArgument,
    /// An array has the wrong dtype, rank or layout (`TypeError`).
    DType,
    /// A request id that the cache does not hold (`KeyError`).
    UnknownRequest,
    /// A request id that the cache already holds (`ValueError`).
    DuplicateRequest,
    /// An operation that needs idle blocks met blocks in use (`RuntimeError`).
    BlockInUse,
    /// A node handle that no longer names a live node (`KeyError`).
    StaleHandle,
    /// Unlocking a node that holds no lock (`RuntimeError`).
    Lock,
    /// A size whose tables cannot be allocated on this machine (`MemoryError`).
    Capacity,
    /// A request that needs more blocks than the whole pool has: it can
    /// never be admitted (a `CapacityError`, hence a `MemoryError`).
    RequestTooLarge,
}

/// A caller error: its kind and a human-readable message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvError {
    /// The class of error.
    pub kind: ErrorKind,
    /// What went wrong, for the exception message.
    pub msg: String,
}

impl KvError {
    /// Builds an error of `kind` with message `msg`.
    #[cold]
    pub fn new(kind: ErrorKind, msg: impl Into<String>) -> Self {
        KvError { kind, msg: msg.into() }
    }

    /// Shorthand for [`ErrorKind::InvalidArgument`].
    #[cold]
    pub fn invalid(msg: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, msg)
    }
}

impl fmt::Display for KvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)
    }
}

impl std::error::Error for KvError {}

/// Result of a fallible core operation.
pub type KvResult<T> = Result<T, KvError>;

/// A broken internal invariant found by a `check_invariants()` method.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvariantViolation(pub String);

impl fmt::Display for InvariantViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invariant violated: {}", self.0)
    }
}

impl std::error::Error for InvariantViolation {}

/// Returns `Err(InvariantViolation)` with a formatted message when `cond` is false.
#[macro_export]
macro_rules! ensure_inv {
    ($cond:expr, $($arg:tt)+) => {
        if !$cond {
            return Err($crate::core::error::InvariantViolation(format!($($arg)+)));
        }
    };
}

/// Checks a pool size from a caller (`num_blocks`): at least 2 (entry 0 is
/// the null `unit`, "block" or "page"), and ids that travel as int32.
/// Returns the size as `u32`.
///
/// # Errors
/// `InvalidArgument` naming the problem.
pub fn pool_size(num: usize, unit: &str) -> KvResult<u32> {
    if num < 2 {
        return Err(KvError::invalid(format!(
            "num_blocks must be >= 2 ({unit} 0 is the null {unit}), got {num}"
        )));
    }
    u32::try_from(num)
        .ok()
        .filter(|&n| n <= i32::MAX as u32) // ids travel as int32
        .ok_or_else(|| KvError::invalid(format!("num_blocks too large: {num}")))
}

/// A vector of `n` copies of `v`, or a `Capacity` error (instead of an abort)
/// when the allocator refuses `n` elements. For tables sized by a caller's
/// argument (`num_blocks`, ...). O(n).
///
/// # Errors
/// `Capacity` naming `what` and the bytes asked for.
pub fn try_filled<T: Clone>(n: usize, v: T, what: &str) -> KvResult<Vec<T>> {
    let mut out = Vec::new();
    try_reserve(&mut out, n, what)?;
    out.resize(n, v);
    Ok(out)
}

/// Makes room for `n` more elements in `v`, or returns a `Capacity` error
/// (instead of an abort) when the allocator refuses. For buffers sized by a
/// caller's input (a prompt's hashes, ...). `v` is unchanged on error.
///
/// # Errors
/// `Capacity` naming `what` and the bytes asked for.
pub fn try_reserve<T>(v: &mut Vec<T>, n: usize, what: &str) -> KvResult<()> {
    if v.try_reserve(n).is_err() {
        let bytes = n.saturating_mul(std::mem::size_of::<T>());
        #[allow(clippy::cast_precision_loss)]
        let gib = bytes as f64 / f64::from(1u32 << 30);
        return Err(KvError::new(
            ErrorKind::Capacity,
            format!("cannot allocate {what}: {n} entries ({gib:.1} GiB) do not fit in this machine's memory"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn try_filled_refuses_impossible_sizes() {
        let e = try_filled(usize::MAX / 4, 0u64, "a table").expect_err("cannot fit");
        assert_eq!(e.kind, ErrorKind::Capacity);
        assert!(e.msg.contains("a table"), "{}", e.msg);
        assert_eq!(try_filled(3, 7u8, "x").expect("small"), vec![7, 7, 7]);
    }
}
