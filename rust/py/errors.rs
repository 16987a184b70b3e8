//! Core errors -> Python exceptions, in one place.
//!
//! The exception classes are defined once, in `kvindex/exceptions.py` (each
//! derives from both `KvIndexError` and the closest builtin, which
//! `create_exception!` cannot express). They are imported once, when the
//! native module initialises, and kept in a [`PyOnceLock`]: raising one is a
//! table lookup, never a module attribute lookup.

use pyo3::exceptions::{PyAssertionError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

use crate::core::error::{ErrorKind, InvariantViolation, KvError};

/// Every [`ErrorKind`], in the order of [`CLASS_NAMES`].
const KINDS: [ErrorKind; 9] = [
    ErrorKind::InvalidArgument,
    ErrorKind::DType,
    ErrorKind::UnknownRequest,
    ErrorKind::DuplicateRequest,
    ErrorKind::BlockInUse,
    ErrorKind::StaleHandle,
    ErrorKind::Lock,
    ErrorKind::Capacity,
    ErrorKind::RequestTooLarge,
];

/// The Python class of each kind in [`KINDS`].
const CLASS_NAMES: [&str; 9] = [
    "InvalidArgumentError",
    "DTypeError",
    "UnknownRequestError",
    "DuplicateRequestError",
    "BlockInUseError",
    "StaleHandleError",
    "LockError",
    "CapacityError",
    "RequestTooLargeError",
];

/// The imported exception classes.
struct Classes {
    /// One class per [`KINDS`] entry.
    kinds: Vec<Py<PyType>>,
    /// `InvariantViolation`.
    invariant: Py<PyType>,
}

static CLASSES: PyOnceLock<Classes> = PyOnceLock::new();

fn import(py: Python<'_>) -> PyResult<Classes> {
    let m = py.import("kvindex.exceptions")?;
    let get = |name: &str| -> PyResult<Py<PyType>> { Ok(m.getattr(name)?.cast_into::<PyType>()?.unbind()) };
    let kinds = CLASS_NAMES.iter().map(|n| get(n)).collect::<PyResult<Vec<_>>>()?;
    Ok(Classes { kinds, invariant: get("InvariantViolation")? })
}

/// Imports and caches the exception classes (called once, at module init).
///
/// # Errors
/// If `kvindex.exceptions` cannot be imported.
pub fn init(py: Python<'_>) -> PyResult<()> {
    CLASSES.get_or_try_init(py, || import(py)).map(|_| ())
}

fn classes(py: Python<'_>) -> Option<&Classes> {
    CLASSES.get_or_try_init(py, || import(py)).ok()
}

/// Converts a caller error into its `KvIndexError` subclass.
#[cold]
pub fn to_py(e: KvError) -> PyErr {
    Python::attach(|py| {
        let i = KINDS.iter().position(|&k| k == e.kind);
        match (classes(py), i) {
            (Some(c), Some(i)) => PyErr::from_type(c.kinds[i].bind(py).clone(), e.msg),
            _ => PyValueError::new_err(e.msg),
        }
    })
}

/// Converts an invariant violation into `kvindex.exceptions.InvariantViolation`.
#[cold]
pub fn inv_to_py(e: InvariantViolation) -> PyErr {
    let msg = e.to_string();
    Python::attach(|py| match classes(py) {
        Some(c) => PyErr::from_type(c.invariant.bind(py).clone(), msg),
        None => PyAssertionError::new_err(msg),
    })
}

/// `Result<T, KvError>` -> `PyResult<T>`.
pub trait IntoPyResult<T> {
    /// Maps the error with [`to_py`].
    fn py(self) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for Result<T, KvError> {
    fn py(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}

/// Shorthand: an `InvalidArgumentError`.
#[cold]
pub fn invalid(msg: impl Into<String>) -> PyErr {
    to_py(KvError::invalid(msg))
}

/// Shorthand: a `DTypeError` (a `TypeError`).
#[cold]
pub fn dtype(msg: impl Into<String>) -> PyErr {
    to_py(KvError::new(ErrorKind::DType, msg))
}

/// Shorthand: a `CapacityError` (a `MemoryError`).
#[cold]
pub fn capacity(msg: impl Into<String>) -> PyErr {
    to_py(KvError::new(ErrorKind::Capacity, msg))
}

/// Shorthand: a `StaleHandleError` (a `KeyError`).
#[cold]
pub fn stale(msg: impl Into<String>) -> PyErr {
    to_py(KvError::new(ErrorKind::StaleHandle, msg))
}
