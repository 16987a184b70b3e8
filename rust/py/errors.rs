//! Core errors -> Python exceptions, in one place.
//!
//! The exception classes live in `kvindex/exceptions.py` (they derive from
//! both `KvIndexError` and the closest builtin, which `create_exception!`
//! cannot express); they are looked up when an error is raised (a cold path).

use pyo3::exceptions::{PyAssertionError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyType;

use crate::core::error::{ErrorKind, InvariantViolation, KvError};

fn class_name(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::InvalidArgument => "InvalidArgumentError",
        ErrorKind::DType => "DTypeError",
        ErrorKind::UnknownRequest => "UnknownRequestError",
        ErrorKind::DuplicateRequest => "DuplicateRequestError",
        ErrorKind::BlockInUse => "BlockInUseError",
        ErrorKind::StaleHandle => "StaleHandleError",
        ErrorKind::Lock => "LockError",
        ErrorKind::Capacity => "CapacityError",
    }
}

fn lookup<'py>(py: Python<'py>, name: &str) -> Option<Bound<'py, PyType>> {
    let m = py.import("kvindex.exceptions").ok()?;
    m.getattr(name).ok()?.cast_into::<PyType>().ok()
}

/// Converts a caller error into its `KvIndexError` subclass.
#[cold]
pub fn to_py(e: KvError) -> PyErr {
    Python::attach(|py| match lookup(py, class_name(e.kind)) {
        Some(cls) => PyErr::from_type(cls, e.msg),
        None => PyValueError::new_err(e.msg),
    })
}

/// Converts an invariant violation into `kvindex.exceptions.InvariantViolation`.
#[cold]
pub fn inv_to_py(e: InvariantViolation) -> PyErr {
    let msg = e.to_string();
    Python::attach(|py| match lookup(py, "InvariantViolation") {
        Some(cls) => PyErr::from_type(cls, msg),
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
