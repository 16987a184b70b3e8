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
//! The readers here therefore view the array's buffer directly. That is sound
//! under one rule: **no Python code runs while a view is alive** — nothing is
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
//!
//! # The rule holds by construction: [`with_views`]
//! The in-place readers are private to this module. A method takes views in
//! two phases:
//! 1. it converts every argument whose conversion may run Python code (ints
//!    through `__index__`, key arguments, lists copied by [`TokensOrList::new`])
//!    into plain Rust values, and names its array arguments with the view
//!    specs ([`Tokens`], [`Int64`], [`Ids`], [`TokensOrList`], `Option`s and
//!    tuples of them), which hold the objects but no view;
//! 2. it calls [`with_views`] with the specs and a closure. The views are
//!    taken (reading only the arrays' C fields: no Python code runs on
//!    success) and handed to the closure, which must be `Send`: it cannot
//!    capture a `Bound`, a `Python` token or a `PyRef` (none is `Send`), so it
//!    cannot call into Python or make a Python object; the higher-ranked
//!    signature keeps the views from leaving it. The closure gets plain
//!    Rust values and the core (pure Rust) and returns plain Rust values;
//!    Python objects are made after it returns.
//!
//! (A `Py<T>` is `Send`: a closure may reach one through a captured struct,
//! but using it needs a `Python` token, and none drops one, whose decref
//! could run a finalizer.) The one way around it is `Python::attach` inside
//! the closure; the binding
//! reaches it there only through its error constructors ([`super::errors`]),
//! which make a lazy exception (an incref of its class) and run no Python
//! code. The readers are private to this module, so no other module can take
//! a view outside the guard.
#![allow(unsafe_code)]

use std::mem::MaybeUninit;

use std::os::raw::c_int;

use numpy::ndarray::Dimension;
use numpy::npyffi::{get_type_object, npy_intp, NpyTypes, PY_ARRAY_API};
use numpy::{
    Element, PyArray, PyArray1, PyArray2, PyArrayDescrMethods, PyArrayMethods, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use super::errors::{capacity, dtype, invalid};

/// A token (or slot) array: an int32 or int64 view of a numpy buffer.
pub enum TokenArray<'a> {
    /// int32 tokens.
    I32(&'a [i32]),
    /// int64 tokens.
    I64(&'a [i64]),
}

/// Calls `$body` with `$s` bound to the token slice, whatever its dtype (the
/// body is compiled once per dtype).
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
/// Python, create Python objects or release the GIL until its last use; and
/// `'a` must end before `obj` may be dropped.
unsafe fn tokens<'a>(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<TokenArray<'a>> {
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

/// A new, uninitialised numpy array of shape `dims`.
///
/// # Errors
/// `CapacityError` (a `MemoryError`) when numpy cannot allocate it (a size
/// past `isize::MAX` bytes, or the machine is out of memory); nothing leaks.
///
/// # Safety
/// The caller must initialise every element before the array is exposed.
unsafe fn try_uninit<'py, T: Element, D: Dimension, const N: usize>(
    py: Python<'py>,
    dims: [usize; N],
    zeroed: bool,
) -> PyResult<Bound<'py, PyArray<T, D>>> {
    let mut d = [0 as npy_intp; N];
    for (o, &n) in d.iter_mut().zip(&dims) {
        *o = npy_intp::try_from(n).map_err(|_| too_big(&dims))?;
    }
    #[allow(clippy::cast_possible_wrap, clippy::cast_possible_truncation)]
    let nd = N as c_int;
    // SAFETY: `d` holds `N` dimensions; the dtype reference is stolen by the
    // call, as numpy documents; NULL (with an exception set) on failure.
    let ptr = unsafe {
        let descr = T::get_dtype(py).into_dtype_ptr();
        if zeroed {
            PY_ARRAY_API.PyArray_Zeros(py, nd, d.as_mut_ptr(), descr, 0)
        } else {
            PY_ARRAY_API.PyArray_NewFromDescr(
                py,
                get_type_object(py, NpyTypes::PyArray_Type),
                descr,
                nd,
                d.as_mut_ptr(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
                std::ptr::null_mut(),
            )
        }
    };
    if ptr.is_null() {
        // numpy's own MemoryError / ValueError ("array is too big") is
        // replaced by kvindex's CapacityError.
        drop(PyErr::take(py));
        return Err(too_big(&dims));
    }
    // SAFETY: a new reference to an ndarray of element type `T` and rank `N`.
    Ok(unsafe { Bound::from_owned_ptr(py, ptr).cast_into_unchecked() })
}

#[cold]
fn too_big(dims: &[usize]) -> PyErr {
    capacity(format!("cannot allocate an output array of shape {dims:?} on this machine"))
}

/// A new zero-filled C-contiguous int32 array `[rows, cols]`.
///
/// # Errors
/// `CapacityError` when it cannot be allocated (see [`try_uninit`]).
pub fn zeros_i32_2d(py: Python<'_>, rows: usize, cols: usize) -> PyResult<Bound<'_, PyArray2<i32>>> {
    rows.checked_mul(cols).and_then(|n| n.checked_mul(4)).ok_or_else(|| too_big(&[rows, cols]))?;
    // SAFETY: numpy zero-fills the array.
    unsafe { try_uninit(py, [rows, cols], true) }
}

/// A new int32 array of `len` elements written by `fill`, which gets the
/// uninitialised buffer and returns how many leading elements it wrote.
/// No zeroing pass and no intermediate `Vec`: numpy owns the buffer.
///
/// # Errors
/// `CapacityError` when the array cannot be allocated (nothing is called).
///
/// # Panics
/// If `fill` does not write exactly `len` elements (the array is then dropped
/// unexposed).
pub fn filled_i32<'py>(
    py: Python<'py>,
    len: usize,
    fill: impl FnOnce(&mut [MaybeUninit<i32>]) -> usize,
) -> PyResult<Bound<'py, PyArray1<i32>>> {
    // SAFETY: the array is exposed only after every element is written (checked).
    let arr: Bound<'py, PyArray1<i32>> = unsafe { try_uninit(py, [len], false) }?;
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
    Ok(arr)
}

/// [`filled_i32`] for an int64 array (the dtype of SGLang's device-index tensors).
///
/// # Errors
/// `CapacityError` when the array cannot be allocated (nothing is called).
///
/// # Panics
/// If `fill` does not write exactly `len` elements (the array is then dropped
/// unexposed).
pub fn filled_i64<'py>(
    py: Python<'py>,
    len: usize,
    fill: impl FnOnce(&mut [MaybeUninit<i64>]) -> usize,
) -> PyResult<Bound<'py, PyArray1<i64>>> {
    // SAFETY: the array is exposed only after every element is written (checked).
    let arr: Bound<'py, PyArray1<i64>> = unsafe { try_uninit(py, [len], false) }?;
    let buf: &mut [MaybeUninit<i64>] = if len == 0 {
        &mut []
    } else {
        // SAFETY: as in `filled_i32`, for `len` aligned i64 slots.
        unsafe { std::slice::from_raw_parts_mut(arr.data().cast::<MaybeUninit<i64>>(), len) }
    };
    let written = fill(buf);
    assert_eq!(written, len, "filled_i64: fill wrote {written} of {len} elements");
    Ok(arr)
}

/// An int32 output array allocated before the call that fills it, so that a
/// failed allocation (`CapacityError`) happens before any state changes. It
/// is never exposed until [`UnfilledI32::fill`] has written every element;
/// dropped unfilled, it is freed unseen.
pub struct UnfilledI32<'py> {
    arr: Bound<'py, PyArray1<i32>>,
    len: usize,
}

impl<'py> UnfilledI32<'py> {
    /// Allocates `len` uninitialised elements.
    ///
    /// # Errors
    /// `CapacityError` when the array cannot be allocated.
    pub fn new(py: Python<'py>, len: usize) -> PyResult<Self> {
        // SAFETY: the array is exposed only by `fill`, after every element is
        // written (checked there).
        let arr = unsafe { try_uninit(py, [len], false) }?;
        Ok(UnfilledI32 { arr, len })
    }

    /// Writes `vals` (exactly `len` of them) and exposes the array.
    ///
    /// # Panics
    /// If `vals` does not hold exactly `len` elements (a broken invariant of
    /// the caller; the array is then dropped unexposed).
    pub fn fill(self, vals: impl ExactSizeIterator<Item = i32>) -> Bound<'py, PyArray1<i32>> {
        assert_eq!(vals.len(), self.len, "UnfilledI32: {} values for {} elements", vals.len(), self.len);
        if self.len > 0 {
            // SAFETY: the fresh array's buffer holds `len` aligned i32 slots
            // that no other reference touches (the array was never exposed).
            let buf = unsafe {
                std::slice::from_raw_parts_mut(self.arr.data().cast::<MaybeUninit<i32>>(), self.len)
            };
            for (d, v) in buf.iter_mut().zip(vals) {
                d.write(v);
            }
        }
        self.arr
    }
}

/// Copies `vals` into a new int32 array.
///
/// # Errors
/// `CapacityError` when the array cannot be allocated.
pub fn i32_array<'py>(
    py: Python<'py>,
    vals: impl ExactSizeIterator<Item = i32>,
) -> PyResult<Bound<'py, PyArray1<i32>>> {
    let len = vals.len();
    filled_i32(py, len, |dst| {
        let mut n = 0;
        for (d, v) in dst.iter_mut().zip(vals) {
            d.write(v);
            n += 1;
        }
        n
    })
}

/// A 1-D C-contiguous int64 array read in place (the per-request id and count
/// arrays of the batch calls); anything else raises `DTypeError`.
///
/// # Safety
/// As [`tokens`].
unsafe fn int64_view<'a>(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<&'a [i64]> {
    // SAFETY: our caller's contract. One check in the common case; the checks
    // below only name what is wrong.
    if let Ok(TokenArray::I64(src)) = unsafe { tokens(obj, what) } {
        return Ok(src);
    }
    let arr = untyped(obj, what)?;
    if arr.cast::<PyArray1<i64>>().is_err() {
        return Err(dtype(format!("{what} must have dtype int64, got {}", dtype_name(&arr))));
    }
    // SAFETY: our caller's contract.
    match unsafe { tokens(obj, what) }? {
        TokenArray::I64(src) => Ok(src),
        TokenArray::I32(_) => Err(dtype(format!("{what} must have dtype int64"))),
    }
}

/// Non-negative request ids read in place as `u64`s, from an array
/// [`int64_view`] accepts; a negative id raises `InvalidArgumentError`
/// naming the first. One branch-free pass in the common case.
///
/// # Safety
/// As [`tokens`].
unsafe fn ids_view<'a>(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<&'a [u64]> {
    // SAFETY: our caller's contract.
    let src = unsafe { int64_view(obj, what) }?;
    if src.iter().fold(0, |acc, &x| acc | x) < 0 {
        let x = src.iter().copied().find(|&x| x < 0).unwrap_or_default();
        return Err(invalid(format!("{what} must be non-negative, got {x}")));
    }
    // SAFETY: `i64` and `u64` have one size and alignment, every bit pattern is
    // valid for both, and these values are non-negative, so each reads as the
    // same number; the slice borrows the same buffer for the same lifetime.
    Ok(unsafe { std::slice::from_raw_parts(src.as_ptr().cast::<u64>(), src.len()) })
}

/// A copy of `src` that raises `CapacityError` when it cannot be allocated.
fn copied<T: Copy>(src: &[T]) -> PyResult<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(src.len()).map_err(|_| too_big(&[src.len()]))?;
    v.extend_from_slice(src);
    Ok(v)
}

mod sealed {
    /// Only this module's view specs are [`super::ViewArgs`].
    pub trait Sealed {}
}

/// Array arguments [`with_views`] reads in place: a view spec, an `Option`
/// of one (`None` gives `None`), or a tuple of them (viewed in order).
pub trait ViewArgs: sealed::Sealed {
    /// What the closure of [`with_views`] gets.
    type Views<'v>;
    /// Takes the views, running no Python code unless it fails.
    ///
    /// # Safety
    /// No Python code may run while the views are alive, and `'v` must end
    /// before `self` is dropped ([`with_views`] keeps both).
    #[doc(hidden)]
    unsafe fn views<'v>(&self) -> PyResult<Self::Views<'v>>;
}

/// Runs `f` on the in-place views of `args` (see the module documentation):
/// `f` is `Send`, so it holds no Python handle and runs no Python code, and
/// the views cannot outlive it.
///
/// # Errors
/// `DTypeError` / `InvalidArgumentError` for an array the spec refuses (then
/// `f` does not run).
#[inline]
pub fn with_views<A: ViewArgs, R>(args: A, f: impl for<'v> FnOnce(A::Views<'v>) -> R + Send) -> PyResult<R> {
    // SAFETY: `f` cannot call into Python (it is `Send`, so it captures no
    // `Bound`, `Python` token or `PyRef`, and every Python call needs one), and
    // its higher-ranked signature keeps the views inside it, so they end
    // before `args` (which keeps their objects alive) is dropped here.
    let v = unsafe { args.views() }?;
    let r = f(v);
    drop(args);
    Ok(r)
}

/// A token (or slot) array, viewed as [`TokenArray`].
pub struct Tokens<'a, 'py>(pub &'a Bound<'py, PyAny>, pub &'static str);

/// A 1-D C-contiguous int64 array (per-request counts, offsets), viewed as `&[i64]`.
pub struct Int64<'a, 'py>(pub &'a Bound<'py, PyAny>, pub &'static str);

/// Non-negative request ids in an int64 array, viewed as `&[u64]` (a
/// negative id raises `InvalidArgumentError` naming the first).
pub struct Ids<'a, 'py>(pub &'a Bound<'py, PyAny>, pub &'static str);

impl<'a, 'py> Int64<'a, 'py> {
    /// An optional int64 array argument (`None` and Python `None` give `None`).
    pub fn opt(obj: Option<&'a Bound<'py, PyAny>>, what: &'static str) -> Option<Self> {
        obj.filter(|o| !o.is_none()).map(|o| Int64(o, what))
    }
}

impl sealed::Sealed for Tokens<'_, '_> {}
impl sealed::Sealed for Int64<'_, '_> {}
impl sealed::Sealed for Ids<'_, '_> {}
impl sealed::Sealed for TokensOrList<'_, '_> {}
impl<A: ViewArgs> sealed::Sealed for Option<A> {}
impl<A: ViewArgs> sealed::Sealed for (A,) {}
impl<A: ViewArgs, B: ViewArgs> sealed::Sealed for (A, B) {}
impl<A: ViewArgs, B: ViewArgs, C: ViewArgs> sealed::Sealed for (A, B, C) {}

impl ViewArgs for Tokens<'_, '_> {
    type Views<'v> = TokenArray<'v>;
    #[inline]
    unsafe fn views<'v>(&self) -> PyResult<TokenArray<'v>> {
        // SAFETY: our caller's contract.
        unsafe { tokens(self.0, self.1) }
    }
}

impl ViewArgs for Int64<'_, '_> {
    type Views<'v> = &'v [i64];
    #[inline]
    unsafe fn views<'v>(&self) -> PyResult<&'v [i64]> {
        // SAFETY: our caller's contract.
        unsafe { int64_view(self.0, self.1) }
    }
}

impl ViewArgs for Ids<'_, '_> {
    type Views<'v> = &'v [u64];
    #[inline]
    unsafe fn views<'v>(&self) -> PyResult<&'v [u64]> {
        // SAFETY: our caller's contract.
        unsafe { ids_view(self.0, self.1) }
    }
}

impl ViewArgs for TokensOrList<'_, '_> {
    type Views<'v> = TokenArray<'v>;
    #[inline]
    unsafe fn views<'v>(&self) -> PyResult<TokenArray<'v>> {
        match self {
            // SAFETY: our caller's contract.
            TokensOrList::Array(t) => unsafe { t.views() },
            // SAFETY: the copy lives in `self`, unchanged, for `'v` (our
            // caller's contract).
            TokensOrList::Copied(v) => Ok(TokenArray::I64(unsafe { raw_slice(v.as_ptr(), v.len()) })),
        }
    }
}

impl<A: ViewArgs> ViewArgs for Option<A> {
    type Views<'v> = Option<A::Views<'v>>;
    #[inline]
    unsafe fn views<'v>(&self) -> PyResult<Self::Views<'v>> {
        // SAFETY: our caller's contract.
        self.as_ref().map(|a| unsafe { a.views() }).transpose()
    }
}

impl<A: ViewArgs> ViewArgs for (A,) {
    type Views<'v> = (A::Views<'v>,);
    #[inline]
    unsafe fn views<'v>(&self) -> PyResult<Self::Views<'v>> {
        // SAFETY: our caller's contract.
        Ok((unsafe { self.0.views() }?,))
    }
}

impl<A: ViewArgs, B: ViewArgs> ViewArgs for (A, B) {
    type Views<'v> = (A::Views<'v>, B::Views<'v>);
    #[inline]
    unsafe fn views<'v>(&self) -> PyResult<Self::Views<'v>> {
        // SAFETY: our caller's contract.
        unsafe { Ok((self.0.views()?, self.1.views()?)) }
    }
}

impl<A: ViewArgs, B: ViewArgs, C: ViewArgs> ViewArgs for (A, B, C) {
    type Views<'v> = (A::Views<'v>, B::Views<'v>, C::Views<'v>);
    #[inline]
    unsafe fn views<'v>(&self) -> PyResult<Self::Views<'v>> {
        // SAFETY: our caller's contract.
        unsafe { Ok((self.0.views()?, self.1.views()?, self.2.views()?)) }
    }
}

/// Copies a 1-D contiguous int64 array out ([`Int64`]), without numpy's
/// borrow registry (see the module documentation): id and length arrays are
/// one entry per request, and the copy is cheaper than borrow tracking.
///
/// # Errors
/// As [`Int64`]; `CapacityError` when the copy cannot be allocated.
pub fn int64_vec(obj: &Bound<'_, PyAny>, what: &'static str) -> PyResult<Vec<i64>> {
    with_views(Int64(obj, what), copied)?
}

/// Reads a 1-D contiguous int64 array of non-negative request ids as `u64`s
/// ([`Ids`]), copied as [`int64_vec`] copies.
///
/// # Errors
/// As [`Ids`]; `CapacityError` when the copy cannot be allocated.
pub fn ids(obj: &Bound<'_, PyAny>, what: &'static str) -> PyResult<Vec<u64>> {
    with_views(Ids(obj, what), copied)?
}

/// Reads block ids: a 1-D C-contiguous int32 or int64 array (as token arrays
/// are read), or a list or tuple of ints (each read as every int parameter is,
/// see [`super::args`]). Anything else raises `DTypeError`. The ids are copied.
///
/// # Errors
/// As above; `CapacityError` when the copy cannot be allocated.
pub fn block_ids(obj: &Bound<'_, PyAny>, what: &'static str) -> PyResult<Vec<i64>> {
    match TokensOrList::new(obj, what)? {
        TokensOrList::Copied(v) => Ok(v),
        arr => with_views(arr, |t| {
            let mut v = Vec::new();
            with_tokens!(t, s => {
                v.try_reserve_exact(s.len()).map_err(|_| too_big(&[s.len()]))?;
                v.extend(s.iter().map(|&x| crate::core::hash::Token::get(x)));
            });
            Ok(v)
        })?,
    }
}

/// Tokens of a call off the hot path (hashing helpers, cluster routing),
/// where a copy costs nothing that matters: a 1-D C-contiguous int32 / int64
/// array, viewed as [`Tokens`], or a list or tuple of ints, copied by
/// [`TokensOrList::new`] (each read as [`block_ids`] reads them). The
/// scheduler's hot path takes arrays only ([`Tokens`]).
pub enum TokensOrList<'a, 'py> {
    /// A numpy array, viewed in place.
    Array(Tokens<'a, 'py>),
    /// A list or tuple of ints, copied.
    Copied(Vec<i64>),
}

impl<'a, 'py> TokensOrList<'a, 'py> {
    /// Copies a list or tuple (its items' `__index__` may run Python code, so
    /// this is the first phase); an array is only named.
    ///
    /// # Errors
    /// As [`block_ids`] for a list or tuple.
    pub fn new(obj: &'a Bound<'py, PyAny>, what: &'static str) -> PyResult<Self> {
        if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
            let n = obj.len()?;
            let mut v = Vec::new();
            v.try_reserve_exact(n).map_err(|_| too_big(&[n]))?;
            for x in obj.try_iter()? {
                v.push(super::args::i64_arg(&x?, what)?);
            }
            return Ok(TokensOrList::Copied(v));
        }
        Ok(TokensOrList::Array(Tokens(obj, what)))
    }
}
