//! Reading numpy arrays (zero-copy, strict dtypes) and Python ints, and
//! making the int32 arrays the hot calls return.
//!
//! Arrays must be 1-D, C-contiguous and of the exact dtype asked for; anything
//! else raises `DTypeError` (a `TypeError`) instead of being copied silently.
//!
//! # Token arrays are read without numpy's borrow registry
//! rust-numpy's `try_readonly` records every Rust borrow of an array in a
//! process-wide table (so that two Rust borrows cannot conflict) and removes
//! it on drop; in a scheduler-like loop on this project's machine that was
//! 5–10% of a radix match or insert per array, and copying small arrays
//! instead was no cheaper.
//! [`tokens`] therefore views the array's buffer directly. This is sound under
//! the rule its callers keep (each call site says so in a `SAFETY` comment):
//! **no Python code runs while a [`TokenArray`] is alive** — nothing is
//! called, no Python object is made (allocating one may run a collection and
//! so arbitrary finalizers), and the GIL is never released. Then nothing can
//! resize, free or write the buffer while the slice exists: kvindex methods
//! never hold an array across calls, and the only mutable borrows kvindex
//! takes (`out=` tables) are taken after its inputs are copied. What the
//! registry would still catch and this does not: another extension holding
//! a *mutable Rust* borrow of the same array while calling back into kvindex
//! with it — an exotic misuse, traded for the hot path's cost. (On a
//! free-threaded interpreter other threads run during a call; one writing an
//! array while kvindex reads it races as it would against rust-numpy's own
//! borrows, which do not track writes from Python either. The abi3 wheels
//! kvindex ships only load on GIL builds.)
#![allow(unsafe_code)]

use std::mem::MaybeUninit;

use numpy::{
    PyArray1, PyArrayDescrMethods, PyArrayMethods, PyReadonlyArray1, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::prelude::*;

use super::errors::{dtype, invalid};

/// A token (or slot) array: an int32 or int64 view of a numpy buffer.
pub enum TokenArray<'a> {
    /// int32 tokens.
    I32(&'a [i32]),
    /// int64 tokens.
    I64(&'a [i64]),
}

/// Calls `$body` with `$s` bound to the token slice, whatever its dtype.
macro_rules! with_tokens {
    ($arr:expr, $s:ident => $body:expr) => {
        match $arr {
            $crate::py::arrays::TokenArray::I32($s) => $body,
            $crate::py::arrays::TokenArray::I64($s) => $body,
        }
    };
}
pub(crate) use with_tokens;

fn describe(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "object".into())
}

#[cold]
fn busy(what: &str) -> PyErr {
    invalid(format!("{what} is being written by another borrower (is it also the out= array?)"))
}

/// The dtype's name, for error messages (a cold path: it calls into Python).
#[cold]
fn dtype_name(arr: &Bound<'_, PyUntypedArray>) -> String {
    arr.dtype().str().map(|s| s.to_string()).unwrap_or_default()
}

/// Checks rank and layout.
fn untyped<'py>(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<Bound<'py, PyUntypedArray>> {
    let arr = obj
        .cast::<PyUntypedArray>()
        .map_err(|_| dtype(format!("{what} must be a numpy array, got {}", describe(obj))))?
        .clone();
    if arr.ndim() != 1 {
        return Err(dtype(format!("{what} must be 1-D, got {} dimensions", arr.ndim())));
    }
    if !arr.is_c_contiguous() {
        return Err(dtype(format!(
            "{what} must be C-contiguous (pass np.ascontiguousarray({what}); kvindex does not copy silently)"
        )));
    }
    Ok(arr)
}

/// Reads a 1-D contiguous int32 or int64 array in place (no copy, no borrow
/// registration; see the module documentation).
///
/// # Safety
/// No Python code may run while the returned view is alive: do not call into
/// Python, create Python objects or release the GIL until its last use.
pub unsafe fn tokens<'a>(obj: &'a Bound<'_, PyAny>, what: &str) -> PyResult<TokenArray<'a>> {
    let arr = untyped(obj, what)?;
    let descr = arr.dtype();
    let native_int = descr.kind() == b'i' && descr.is_native_byteorder() != Some(false);
    // SAFETY: `arr` is a live ndarray (checked by `untyped`); reading its
    // data pointer field has no side effects.
    let ptr: *const u8 = unsafe { (*arr.as_array_ptr()).fields.data }.cast_const().cast();
    let len = arr.len();
    let item = descr.itemsize();
    if !native_int || (item != 4 && item != 8) {
        return Err(dtype(format!("{what} must have dtype int32 or int64, got {}", dtype_name(&arr))));
    }
    if len > 0 && !(ptr as usize).is_multiple_of(item) {
        return Err(dtype(format!(
            "{what} must be aligned for its dtype (pass np.ascontiguousarray({what}) or a copy; \
             kvindex does not copy silently)"
        )));
    }
    // SAFETY: the array is 1-D and C-contiguous with `len` elements of the
    // item size and integer kind chosen here, at an address aligned for it
    // (all checked above), so the buffer is one live allocation that `obj`
    // keeps alive for `'a`; every bit pattern is a valid integer; our
    // caller's contract keeps it unchanged while the view lives.
    Ok(unsafe {
        if item == 4 {
            TokenArray::I32(raw_slice(ptr.cast(), len))
        } else {
            TokenArray::I64(raw_slice(ptr.cast(), len))
        }
    })
}

/// The `len` elements at `ptr` as a slice (empty arrays may carry a
/// dangling pointer, so `len == 0` never reads it).
///
/// # Safety
/// `ptr..ptr + len` must be aligned, initialised, and neither written nor
/// freed during `'a`.
unsafe fn raw_slice<'a, T>(ptr: *const T, len: usize) -> &'a [T] {
    if len == 0 {
        return &[];
    }
    // SAFETY: forwarded to our caller.
    unsafe { std::slice::from_raw_parts(ptr, len) }
}

/// A new int32 array of `len` elements written by `fill`, which gets the
/// uninitialised buffer and returns how many leading elements it wrote.
/// No zeroing pass and no intermediate `Vec`: numpy owns the buffer.
///
/// # Panics
/// If `fill` does not write exactly `len` elements (the array is then dropped
/// unexposed).
pub fn filled_i32<'py>(
    py: Python<'py>,
    len: usize,
    fill: impl FnOnce(&mut [MaybeUninit<i32>]) -> usize,
) -> Bound<'py, PyArray1<i32>> {
    // SAFETY: `new` allocates an uninitialised array that nothing else can
    // see yet; it is exposed only after every element is written (checked).
    let arr = unsafe { PyArray1::<i32>::new(py, len, false) };
    let buf: &mut [MaybeUninit<i32>] = if len == 0 {
        &mut []
    } else {
        // SAFETY: the fresh array's buffer holds `len` aligned i32 slots that
        // no other reference touches until `arr` is returned; `MaybeUninit`
        // makes writing them before they are initialised sound.
        unsafe { std::slice::from_raw_parts_mut(arr.data().cast::<MaybeUninit<i32>>(), len) }
    };
    let written = fill(buf);
    assert_eq!(written, len, "filled_i32: fill wrote {written} of {len} elements");
    arr
}

/// Reads a 1-D contiguous int64 array.
pub fn int64<'py>(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<PyReadonlyArray1<'py, i64>> {
    let arr = untyped(obj, what)?;
    let a = arr
        .cast::<PyArray1<i64>>()
        .map_err(|_| dtype(format!("{what} must have dtype int64, got {}", dtype_name(&arr))))?;
    a.try_readonly().map_err(|_| busy(what))
}

/// Reads a 1-D contiguous int64 array of non-negative ids as `u64`s.
///
/// The ids are copied out (`to_vec`, no borrow registration): id arrays are
/// one entry per request, and the copy is cheaper than numpy borrow tracking.
pub fn ids(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u64>> {
    let arr = untyped(obj, what)?;
    let a = arr
        .cast::<PyArray1<i64>>()
        .map_err(|_| dtype(format!("{what} must have dtype int64, got {}", dtype_name(&arr))))?;
    let v = a.to_vec().map_err(|_| dtype(format!("{what} must be C-contiguous")))?;
    v.into_iter()
        .map(|x| u64::try_from(x).map_err(|_| invalid(format!("{what} must be non-negative, got {x}"))))
        .collect()
}

/// Reads one non-negative int (a request id).
pub fn id(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<u64> {
    if obj.is_instance_of::<pyo3::types::PyBool>() {
        return Err(dtype(format!("{what} must be an int, got bool")));
    }
    if !obj.is_instance_of::<pyo3::types::PyInt>() && obj.cast::<PyUntypedArray>().is_err() {
        if let Err(_) | Ok(false) = obj.hasattr("__index__") {
            return Err(dtype(format!("{what} must be an int, got {}", describe(obj))));
        }
    }
    obj.extract::<u64>().map_err(|_| {
        invalid(format!(
            "{what} must be an int in 0..2**64, got {}",
            obj.repr().map(|r| r.to_string()).unwrap_or_default()
        ))
    })
}
