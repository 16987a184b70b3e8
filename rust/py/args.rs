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
use pyo3::types::{PyBool, PyInt, PyString};

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

/// A `str` parameter as UTF-8: a str with a lone surrogate (which has no
/// UTF-8 form) raises `InvalidArgumentError` instead of a bare
/// `UnicodeEncodeError`; a non-str raises `DTypeError`.
///
/// # Errors
/// As above.
pub fn text<'a>(obj: &'a Bound<'_, PyAny>, what: &str) -> PyResult<&'a str> {
    let s =
        obj.cast::<PyString>().map_err(|_| dtype(format!("{what} must be a str, got {}", describe(obj))))?;
    s.to_str().map_err(|_| invalid(format!("{what} must be valid Unicode (no lone surrogates)")))
}

/// An optional [`text`] parameter (`None` passes through), copied out.
///
/// # Errors
/// As [`text`].
pub fn opt_text(obj: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Option<String>> {
    obj.filter(|o| !o.is_none()).map(|o| text(o, what).map(str::to_owned)).transpose()
}

/// An optional [`i64_arg`] (`None` passes through).
///
/// # Errors
/// As [`i64_arg`].
pub fn opt_i64_arg(obj: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Option<i64>> {
    obj.filter(|o| !o.is_none()).map(|o| i64_arg(o, what)).transpose()
}

/// A sequence of int64 values (any iterable but a str or bytes), each read
/// as [`i64_arg`] reads one.
///
/// # Errors
/// `DTypeError` for a non-iterable, a str or bytes, or a non-int element;
/// `InvalidArgumentError` for an element out of range.
pub fn i64_list(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<i64>> {
    if obj.is_instance_of::<PyString>() || obj.is_instance_of::<pyo3::types::PyBytes>() {
        return Err(dtype(format!("{what} must be a sequence of ints, got {}", describe(obj))));
    }
    let it = obj
        .try_iter()
        .map_err(|_| dtype(format!("{what} must be a sequence of ints, got {}", describe(obj))))?;
    it.map(|x| i64_arg(&x?, what)).collect()
}

/// A float parameter: any real number; an int too large for a float raises
/// `InvalidArgumentError` instead of a bare `OverflowError`.
///
/// # Errors
/// As above; a non-number raises `DTypeError`.
pub fn f64_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<f64> {
    if obj.is_instance_of::<PyBool>() {
        return Err(dtype(format!("{what} must be a number, got bool")));
    }
    match obj.extract::<f64>() {
        Ok(v) => Ok(v),
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(obj.py()) => {
            Err(invalid(format!("{what} is too large for a float")))
        }
        Err(_) => Err(dtype(format!("{what} must be a number, got {}", describe(obj)))),
    }
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

    /// Defines optional-str converters named for their parameter.
    macro_rules! opt_text_params {
        ($($name:ident),*) => {$(
            #[doc = concat!("`", stringify!($name), "` (an optional str).")]
            ///
            /// # Errors
            /// As [`super::text`].
            pub fn $name(o: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
                super::opt_text(Some(o), stringify!($name))
            }
        )*};
    }
    opt_text_params!(cache_salt, seed, medium, lora_name, kv_cache_spec_kind);

    /// Defines optional-int64 converters named for their parameter.
    macro_rules! opt_i64_params {
        ($($name:ident),*) => {$(
            #[doc = concat!("`", stringify!($name), "` (an optional int64).")]
            ///
            /// # Errors
            /// As [`super::i64_arg`].
            pub fn $name(o: &Bound<'_, PyAny>) -> PyResult<Option<i64>> {
                super::opt_i64_arg(Some(o), stringify!($name))
            }
        )*};
    }
    opt_i64_params!(lora_id, group_idx, kv_cache_spec_sliding_window, data_parallel_rank, block_size_opt);

    /// `algo` (a str).
    ///
    /// # Errors
    /// As [`super::text`].
    pub fn algo(o: &Bound<'_, PyAny>) -> PyResult<String> {
        super::text(o, "algo").map(str::to_owned)
    }

    /// `policy` (a str).
    ///
    /// # Errors
    /// As [`super::text`].
    pub fn policy(o: &Bound<'_, PyAny>) -> PyResult<String> {
        super::text(o, "policy").map(str::to_owned)
    }

    /// `block_size` of an event (an int64).
    ///
    /// # Errors
    /// As [`super::i64_arg`].
    pub fn event_block_size(o: &Bound<'_, PyAny>) -> PyResult<i64> {
        super::i64_arg(o, "block_size")
    }

    /// `token_ids` (a sequence of int64).
    ///
    /// # Errors
    /// As [`super::i64_list`].
    pub fn token_ids(o: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
        super::i64_list(o, "token_ids")
    }

    /// `lookahead_token_ids` (an optional sequence of int64).
    ///
    /// # Errors
    /// As [`super::i64_list`].
    pub fn lookahead_token_ids(o: &Bound<'_, PyAny>) -> PyResult<Option<Vec<i64>>> {
        if o.is_none() {
            return Ok(None);
        }
        super::i64_list(o, "lookahead_token_ids").map(Some)
    }

    /// `ts` (a float).
    ///
    /// # Errors
    /// As [`super::f64_arg`].
    pub fn ts(o: &Bound<'_, PyAny>) -> PyResult<f64> {
        super::f64_arg(o, "ts")
    }

    /// `priority`.
    ///
    /// # Errors
    /// As [`super::i64_arg`].
    pub fn priority(o: &Bound<'_, PyAny>) -> PyResult<i64> {
        super::i64_arg(o, "priority")
    }

    /// `inserted_len` (a token count, `0..=usize::MAX`).
    ///
    /// # Errors
    /// As [`super::usize_arg`].
    pub fn inserted_len(o: &Bound<'_, PyAny>) -> PyResult<usize> {
        super::usize_arg(o, "inserted_len", usize::MAX)
    }

    /// Defines int64 converters named for their parameter (the engine
    /// lifecycle's counts; their range is checked where they are used).
    macro_rules! i64_params {
        ($($name:ident),*) => {$(
            #[doc = concat!("`", stringify!($name), "` (an int64).")]
            ///
            /// # Errors
            /// As [`super::i64_arg`].
            pub fn $name(o: &Bound<'_, PyAny>) -> PyResult<i64> {
                super::i64_arg(o, stringify!($name))
            }
        )*};
    }
    i64_params!(lookahead, external_prefix, reserved_blocks, watermark_blocks, num_new_tokens, num_rejected);
    opt_i64_params!(chunk);

    /// Defines bool converters named for their parameter.
    macro_rules! flag_params {
        ($($name:ident),*) => {$(
            #[doc = concat!("`", stringify!($name), "` (a bool).")]
            ///
            /// # Errors
            /// As [`super::flag`].
            pub fn $name(o: &Bound<'_, PyAny>) -> PyResult<bool> {
                super::flag(o, stringify!($name))
            }
        )*};
    }
    flag_params!(must_fit, delay_cache, skip_reading, array_tagged, skip_empty);
}

/// A bool flag: a `bool` (or numpy bool); anything else, an int or a str
/// included, raises `DTypeError` (`"no"` is not false).
///
/// # Errors
/// As above.
pub fn flag(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<bool> {
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(b.is_true());
    }
    if describe(obj) == "bool" {
        // numpy.bool_ (its type is named `bool` too)
        if let Ok(v) = obj.is_truthy() {
            return Ok(v);
        }
    }
    Err(dtype(format!("{what} must be a bool, got {}", describe(obj))))
}
