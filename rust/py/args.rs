//! Scalar arguments: one conversion rule for every integer parameter.
//!
//! Every integer parameter (sizes, counts, block ids, request ids, node
//! handles, priorities) is read the same way:
//! - `bool` is refused (`DTypeError`): `True` is never a size or an id;
//! - any other object is converted with `operator.index` (so numpy integer
//!   scalars and objects with `__index__` work); an exception raised by the
//!   object's own `__index__` reaches the caller unchanged; an object without
//!   `__index__` (a float, a string, a 1-D array) raises `DTypeError`;
//! - an int outside the parameter's range raises `InvalidArgumentError` (a
//!   `ValueError`), never a bare `OverflowError`.
//!
//! Methods convert every argument this way *before* they borrow the cache, so
//! an `__index__` (or an `mm_items` generator) that releases the GIL never
//! meets a borrowed cache.
// `unsafe` here only calls `PyNumber_Index` through the C API.
#![allow(unsafe_code)]

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt};

use super::errors::{dtype, invalid};

fn describe(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "object".into())
}

/// `operator.index(obj)` under the rule above.
///
/// # Errors
/// As the module documentation says.
pub fn int<'py>(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<Bound<'py, PyInt>> {
    index(obj, what)
}

fn index<'py>(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<Bound<'py, PyInt>> {
    if obj.is_instance_of::<PyBool>() {
        return Err(dtype(format!("{what} must be an int, got bool")));
    }
    if let Ok(i) = obj.cast::<PyInt>() {
        return Ok(i.clone());
    }
    // An ndarray with dimensions has an `__index__` that refuses it with a
    // numpy TypeError; refuse it here, as kvindex refuses it everywhere.
    if let Ok(arr) = obj.cast::<numpy::PyUntypedArray>() {
        use numpy::PyUntypedArrayMethods;
        if arr.ndim() != 0 {
            return Err(dtype(format!("{what} must be an int, got a {}-D array", arr.ndim())));
        }
    }
    match obj.get_type().hasattr("__index__") {
        Ok(true) => {}
        _ => return Err(dtype(format!("{what} must be an int, got {}", describe(obj)))),
    }
    // SAFETY: `obj` is a live object; `PyNumber_Index` returns a new
    // reference or NULL with an exception set, which `from_owned_ptr_or_err`
    // turns into the exception the object raised.
    let r = unsafe { Bound::from_owned_ptr_or_err(obj.py(), ffi::PyNumber_Index(obj.as_ptr())) }?;
    Ok(r.cast_into::<PyInt>()?)
}

/// Whether `obj` is an int under the rule above (not a bool; an int, or a
/// non-array object whose type has `__index__`, or a 0-D array). Calls no
/// `__index__`.
#[must_use]
pub fn is_int_like(obj: &Bound<'_, PyAny>) -> bool {
    if obj.is_instance_of::<PyBool>() {
        return false;
    }
    if obj.is_instance_of::<PyInt>() {
        return true;
    }
    if let Ok(arr) = obj.cast::<numpy::PyUntypedArray>() {
        use numpy::PyUntypedArrayMethods;
        return arr.ndim() == 0;
    }
    matches!(obj.get_type().hasattr("__index__"), Ok(true))
}

#[cold]
fn out_of_range(what: &str, v: &Bound<'_, PyInt>, range: &str) -> PyErr {
    invalid(format!("{what} must be an int in {range}, got {v}"))
}

/// An int64 parameter.
///
/// # Errors
/// As the module documentation says.
pub fn i64_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<i64> {
    let v = index(obj, what)?;
    v.extract::<i64>().map_err(|_| out_of_range(what, &v, "-2**63..2**63"))
}

/// A non-negative size or count, at most `max`.
///
/// # Errors
/// As the module documentation says; `InvalidArgumentError` above `max`.
pub fn usize_arg(obj: &Bound<'_, PyAny>, what: &str, max: usize) -> PyResult<usize> {
    let v = index(obj, what)?;
    v.extract::<u64>()
        .ok()
        .and_then(|x| usize::try_from(x).ok())
        .filter(|&x| x <= max)
        .ok_or_else(|| out_of_range(what, &v, &format!("0..={max}")))
}

/// A non-negative 64-bit id (a request id).
///
/// # Errors
/// As the module documentation says.
pub fn u64_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<u64> {
    let v = index(obj, what)?;
    v.extract::<u64>().map_err(|_| out_of_range(what, &v, "0..2**64"))
}

/// An optional [`usize_arg`] (`None` passes through).
///
/// # Errors
/// As [`usize_arg`].
pub fn opt_usize_arg(obj: Option<&Bound<'_, PyAny>>, what: &str, max: usize) -> PyResult<Option<usize>> {
    obj.filter(|o| !o.is_none()).map(|o| usize_arg(o, what, max)).transpose()
}

/// Named converters for `#[pyo3(from_py_with = ...)]` constructor parameters
/// (so the runtime signature keeps its literal defaults).
pub mod named {
    use pyo3::prelude::*;

    use super::usize_arg;

    /// `num_blocks`.
    ///
    /// # Errors
    /// As [`usize_arg`].
    pub fn num_blocks(o: &Bound<'_, PyAny>) -> PyResult<usize> {
        usize_arg(o, "num_blocks", usize::MAX)
    }

    /// `block_size`.
    ///
    /// # Errors
    /// As [`usize_arg`].
    pub fn block_size(o: &Bound<'_, PyAny>) -> PyResult<usize> {
        usize_arg(o, "block_size", usize::MAX)
    }

    /// `page_size`.
    ///
    /// # Errors
    /// As [`usize_arg`].
    pub fn page_size(o: &Bound<'_, PyAny>) -> PyResult<usize> {
        usize_arg(o, "page_size", usize::MAX)
    }

    /// `slru_threshold`.
    ///
    /// # Errors
    /// As [`usize_arg`].
    pub fn slru_threshold(o: &Bound<'_, PyAny>) -> PyResult<usize> {
        usize_arg(o, "slru_threshold", usize::MAX)
    }

    /// `max_events` (at least 1).
    ///
    /// # Errors
    /// As [`usize_arg`]; `InvalidArgumentError` for 0.
    pub fn max_events(o: &Bound<'_, PyAny>) -> PyResult<usize> {
        let n = usize_arg(o, "max_events", usize::MAX)?;
        if n == 0 {
            return Err(super::invalid("max_events must be >= 1"));
        }
        Ok(n)
    }

    /// `priority`.
    ///
    /// # Errors
    /// As [`super::i64_arg`].
    pub fn priority(o: &Bound<'_, PyAny>) -> PyResult<i64> {
        super::i64_arg(o, "priority")
    }
}
