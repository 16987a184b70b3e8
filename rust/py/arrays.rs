//! Reading numpy arrays (zero-copy, strict dtypes) and Python ints.
//!
//! Arrays must be 1-D, C-contiguous and of the exact dtype asked for; anything
//! else raises `DTypeError` (a `TypeError`) instead of being copied silently.

use numpy::{PyArray1, PyArrayMethods, PyReadonlyArray1, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;

use super::errors::{dtype, invalid};

/// A token array: int32 or int64, borrowed in place or (when small) copied.
pub enum TokenArray<'py> {
    /// int32 tokens.
    I32(PyReadonlyArray1<'py, i32>),
    /// int64 tokens.
    I64(PyReadonlyArray1<'py, i64>),
    /// A small int32 array, copied.
    SmallI32(Vec<i32>),
    /// A small int64 array, copied.
    SmallI64(Vec<i64>),
}

/// Arrays up to this many elements are copied instead of borrowed: a copy
/// of a decode step's tokens costs less than numpy's borrow registration.
const COPY_MAX: usize = 512;

/// Calls `$body` with `$s` bound to the token slice, whatever its dtype.
macro_rules! with_tokens {
    ($arr:expr, $s:ident => $body:expr) => {
        match &$arr {
            $crate::py::arrays::TokenArray::I32(a) => {
                let $s: &[i32] = a.as_slice().expect("contiguity checked");
                $body
            }
            $crate::py::arrays::TokenArray::I64(a) => {
                let $s: &[i64] = a.as_slice().expect("contiguity checked");
                $body
            }
            $crate::py::arrays::TokenArray::SmallI32(v) => {
                let $s: &[i32] = v.as_slice();
                $body
            }
            $crate::py::arrays::TokenArray::SmallI64(v) => {
                let $s: &[i64] = v.as_slice();
                $body
            }
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

/// Reads a 1-D contiguous int32 or int64 array.
pub fn tokens<'py>(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<TokenArray<'py>> {
    let arr = untyped(obj, what)?;
    let small = arr.len() <= COPY_MAX;
    if let Ok(a) = arr.cast::<PyArray1<i32>>() {
        if small {
            return a.to_vec().map(TokenArray::SmallI32).map_err(|_| busy(what));
        }
        return Ok(TokenArray::I32(a.try_readonly().map_err(|_| busy(what))?));
    }
    if let Ok(a) = arr.cast::<PyArray1<i64>>() {
        if small {
            return a.to_vec().map(TokenArray::SmallI64).map_err(|_| busy(what));
        }
        return Ok(TokenArray::I64(a.try_readonly().map_err(|_| busy(what))?));
    }
    Err(dtype(format!("{what} must have dtype int32 or int64, got {}", dtype_name(&arr))))
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
