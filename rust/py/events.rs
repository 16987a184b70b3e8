//! KV events as Python objects (frozen classes with vLLM 0.33's field names),
//! shared by every cache, and their conversions to and from the wire events
//! of [`crate::core::wire`]. The msgpack codec over them (`EventEncoder`,
//! `decode_event_batch`) is [`super::event_codec`]'s; this file names no
//! cache class, so the caches and the codec both depend on it and on nothing
//! that depends on them.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyList, PyString, PyTuple};

use super::args::named;
use super::errors::{dtype, invalid};
use crate::core::events::KvEvent;
use crate::core::wire::event::{CacheMeta, Removed, Stored, WireEvent};
use crate::core::wire::msgpack::{Value, MAX_DEPTH};

fn value_to_py<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::Nil => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Int(i) => i.into_pyobject(py)?.into_any(),
        Value::UInt(u) => u.into_pyobject(py)?.into_any(),
        Value::Float(f) => PyFloat::new(py, *f).into_any(),
        Value::Str(s) => PyString::new(py, s).into_any(),
        Value::Bin(b) => PyBytes::new(py, b).into_any(),
        Value::Array(a) => {
            PyTuple::new(py, a.iter().map(|x| value_to_py(py, x)).collect::<PyResult<Vec<_>>>()?)?.into_any()
        }
        Value::Map(m) => {
            let d = PyDict::new(py);
            for (k, x) in m {
                d.set_item(value_to_py(py, k)?, value_to_py(py, x)?)?;
            }
            d.into_any()
        }
    })
}

fn value_from_py(obj: &Bound<'_, PyAny>, depth: usize) -> PyResult<Value> {
    if depth > MAX_DEPTH {
        return Err(invalid(format!("event field nested deeper than {MAX_DEPTH}")));
    }
    if obj.is_none() {
        return Ok(Value::Nil);
    }
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if let Ok(i) = obj.extract::<i64>() {
        return Ok(Value::Int(i));
    }
    if let Ok(u) = obj.extract::<u64>() {
        return Ok(Value::UInt(u));
    }
    if let Ok(f) = obj.cast::<PyFloat>() {
        return Ok(Value::Float(f.value()));
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(Value::Str(
            s.to_str()
                .map_err(|_| invalid("event field strings must be valid Unicode (no lone surrogates)"))?
                .to_owned(),
        ));
    }
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(Value::Bin(b.as_bytes().to_vec()));
    }
    if let Ok(d) = obj.cast::<PyDict>() {
        let mut m = Vec::with_capacity(d.len());
        for (k, x) in d.iter() {
            m.push((value_from_py(&k, depth + 1)?, value_from_py(&x, depth + 1)?));
        }
        return Ok(Value::Map(m));
    }
    if obj.cast::<PyTuple>().is_ok() || obj.cast::<PyList>().is_ok() {
        let mut a = Vec::new();
        for x in obj.try_iter()? {
            a.push(value_from_py(&x?, depth + 1)?);
        }
        return Ok(Value::Array(a));
    }
    Err(dtype(format!(
        "event field values must be None, bool, int, float, str, bytes, tuple, list or dict, not {}",
        obj.get_type().name()?
    )))
}

fn hash_from_py(obj: &Bound<'_, PyAny>) -> PyResult<u64> {
    if !super::args::is_int_like(obj) {
        return Err(dtype(format!("a block hash must be an int, got {}", obj.get_type().name()?)));
    }
    if let Ok(u) = obj.extract::<u64>() {
        return Ok(u);
    }
    if let Ok(i) = obj.extract::<i64>() {
        #[allow(clippy::cast_sign_loss)]
        return Ok(i as u64);
    }
    Err(invalid("a block hash must be an int in [-2**63, 2**64)"))
}

fn hashes_from_py(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u64>> {
    let it = obj.try_iter().map_err(|_| dtype("block_hashes must be a sequence of ints"))?;
    it.map(|x| hash_from_py(&x?)).collect()
}

fn extra_from_py(obj: &Bound<'_, PyAny>) -> PyResult<Vec<Option<Vec<Value>>>> {
    let mut out = Vec::new();
    for block in obj.try_iter()? {
        let block = block?;
        if block.is_none() {
            out.push(None);
        } else {
            let mut keys = Vec::new();
            for k in block.try_iter()? {
                keys.push(value_from_py(&k?, 1)?);
            }
            out.push(Some(keys));
        }
    }
    Ok(out)
}

fn extra_to_py<'py>(py: Python<'py>, e: Option<&[Option<Vec<Value>>]>) -> PyResult<Bound<'py, PyAny>> {
    let Some(blocks) = e else { return Ok(py.None().into_bound(py)) };
    let out = PyList::empty(py);
    for b in blocks {
        match b {
            None => out.append(py.None())?,
            Some(keys) => out.append(PyTuple::new(
                py,
                keys.iter().map(|k| value_to_py(py, k)).collect::<PyResult<Vec<_>>>()?,
            )?)?,
        }
    }
    Ok(out.into_any())
}

fn opt_value_to_py<'py>(py: Python<'py>, v: Option<&Value>) -> PyResult<Bound<'py, PyAny>> {
    v.map_or_else(|| Ok(py.None().into_bound(py)), |v| value_to_py(py, v))
}

fn opt_value_from_py(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Value>> {
    match obj {
        None => Ok(None),
        Some(o) if o.is_none() => Ok(None),
        Some(o) => value_from_py(o, 0).map(Some),
    }
}

/// `name=repr(value)` pairs, comma-separated, for `__repr__`.
/// Pickling support: the class and its constructor arguments, which are the
/// `to_dict()` values in field order without `type`.
fn reduce_from_dict<'py>(
    cls: Bound<'py, PyAny>,
    d: &Bound<'py, PyDict>,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
    let args: Vec<Bound<'py, PyAny>> =
        d.iter().filter(|(k, _)| k.extract::<String>().is_ok_and(|k| k != "type")).map(|(_, v)| v).collect();
    Ok((cls, PyTuple::new(d.py(), args)?))
}

fn repr_fields(d: &Bound<'_, PyDict>, skip_type: bool) -> PyResult<String> {
    let mut parts = Vec::with_capacity(d.len());
    for (k, v) in d.iter() {
        let k: String = k.extract()?;
        if skip_type && k == "type" {
            continue;
        }
        parts.push(format!("{k}={}", v.repr()?));
    }
    Ok(parts.join(", "))
}

/// A run of consecutive blocks became cached (vLLM ``BlockStored``; hashes: low 64 bits
/// of the digest, big-endian). Fields in vLLM 0.33's order; equal when all fields are;
/// picklable.
#[pyclass(module = "kvindex._core", frozen)]
pub struct BlockStored {
    inner: Stored,
}

/// Blocks stopped being cached (vLLM ``BlockRemoved``; one event per evicted physical
/// block from the hash-chain cache, one per evicted leaf from the radix cache).
#[pyclass(module = "kvindex._core", frozen)]
pub struct BlockRemoved {
    inner: Removed,
}

/// Every cached block was dropped (reset).
#[pyclass(module = "kvindex._core", frozen)]
pub struct AllBlocksCleared;

#[pymethods]
impl BlockStored {
    #[new]
    #[pyo3(signature = (
        block_hashes, parent_block_hash, token_ids, block_size, lora_id = None, medium = None,
        lora_name = None, extra_keys = None, group_idx = None, kv_cache_spec_kind = None,
        kv_cache_spec_sliding_window = None, locality = None, ownership = None, session_id = None,
        lookahead_token_ids = None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        block_hashes: &Bound<'_, PyAny>,
        parent_block_hash: Option<&Bound<'_, PyAny>>,
        #[pyo3(from_py_with = named::token_ids)] token_ids: Vec<i64>,
        #[pyo3(from_py_with = named::event_block_size)] block_size: i64,
        #[pyo3(from_py_with = named::lora_id)] lora_id: Option<i64>,
        #[pyo3(from_py_with = named::medium)] medium: Option<String>,
        #[pyo3(from_py_with = named::lora_name)] lora_name: Option<String>,
        extra_keys: Option<&Bound<'_, PyAny>>,
        #[pyo3(from_py_with = named::group_idx)] group_idx: Option<i64>,
        #[pyo3(from_py_with = named::kv_cache_spec_kind)] kv_cache_spec_kind: Option<String>,
        #[pyo3(from_py_with = named::kv_cache_spec_sliding_window)] kv_cache_spec_sliding_window: Option<i64>,
        locality: Option<&Bound<'_, PyAny>>,
        ownership: Option<&Bound<'_, PyAny>>,
        session_id: Option<&Bound<'_, PyAny>>,
        #[pyo3(from_py_with = named::lookahead_token_ids)] lookahead_token_ids: Option<Vec<i64>>,
    ) -> PyResult<Self> {
        let parent_block_hash = match parent_block_hash {
            Some(p) if !p.is_none() => Some(hash_from_py(p)?),
            _ => None,
        };
        let extra_keys = match extra_keys {
            Some(e) if !e.is_none() => Some(extra_from_py(e)?),
            _ => None,
        };
        Ok(BlockStored {
            inner: Stored {
                block_hashes: hashes_from_py(block_hashes)?,
                parent_block_hash,
                token_ids,
                block_size,
                lora_id,
                medium,
                lora_name,
                extra_keys,
                group_idx,
                kv_cache_spec_kind,
                kv_cache_spec_sliding_window,
                locality: opt_value_from_py(locality)?,
                ownership: opt_value_from_py(ownership)?,
                session_id: opt_value_from_py(session_id)?,
                lookahead_token_ids,
            },
        })
    }

    #[getter]
    fn block_hashes(&self) -> Vec<u64> {
        self.inner.block_hashes.clone()
    }
    #[getter]
    fn parent_block_hash(&self) -> Option<u64> {
        self.inner.parent_block_hash
    }
    #[getter]
    fn token_ids(&self) -> Vec<i64> {
        self.inner.token_ids.clone()
    }
    #[getter]
    fn block_size(&self) -> i64 {
        self.inner.block_size
    }
    #[getter]
    fn lora_id(&self) -> Option<i64> {
        self.inner.lora_id
    }
    #[getter]
    fn medium(&self) -> Option<&str> {
        self.inner.medium.as_deref()
    }
    #[getter]
    fn lora_name(&self) -> Option<&str> {
        self.inner.lora_name.as_deref()
    }
    #[getter]
    fn extra_keys<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        extra_to_py(py, self.inner.extra_keys.as_deref())
    }
    #[getter]
    fn group_idx(&self) -> Option<i64> {
        self.inner.group_idx
    }
    #[getter]
    fn kv_cache_spec_kind(&self) -> Option<&str> {
        self.inner.kv_cache_spec_kind.as_deref()
    }
    #[getter]
    fn kv_cache_spec_sliding_window(&self) -> Option<i64> {
        self.inner.kv_cache_spec_sliding_window
    }
    #[getter]
    fn locality<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        opt_value_to_py(py, self.inner.locality.as_ref())
    }
    #[getter]
    fn ownership<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        opt_value_to_py(py, self.inner.ownership.as_ref())
    }
    #[getter]
    fn session_id<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        opt_value_to_py(py, self.inner.session_id.as_ref())
    }
    #[getter]
    fn lookahead_token_ids(&self) -> Option<Vec<i64>> {
        self.inner.lookahead_token_ids.clone()
    }

    /// The event as a dict: ``type`` first, then every field in vLLM's order.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = &self.inner;
        let d = PyDict::new(py);
        d.set_item("type", "BlockStored")?;
        d.set_item("block_hashes", &s.block_hashes)?;
        d.set_item("parent_block_hash", s.parent_block_hash)?;
        d.set_item("token_ids", &s.token_ids)?;
        d.set_item("block_size", s.block_size)?;
        d.set_item("lora_id", s.lora_id)?;
        d.set_item("medium", s.medium.as_deref())?;
        d.set_item("lora_name", s.lora_name.as_deref())?;
        d.set_item("extra_keys", extra_to_py(py, s.extra_keys.as_deref())?)?;
        d.set_item("group_idx", s.group_idx)?;
        d.set_item("kv_cache_spec_kind", s.kv_cache_spec_kind.as_deref())?;
        d.set_item("kv_cache_spec_sliding_window", s.kv_cache_spec_sliding_window)?;
        d.set_item("locality", opt_value_to_py(py, s.locality.as_ref())?)?;
        d.set_item("ownership", opt_value_to_py(py, s.ownership.as_ref())?)?;
        d.set_item("session_id", opt_value_to_py(py, s.session_id.as_ref())?)?;
        d.set_item("lookahead_token_ids", s.lookahead_token_ids.as_ref())?;
        Ok(d)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!("BlockStored({})", repr_fields(&self.to_dict(py)?, true)?))
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other.cast::<BlockStored>().is_ok_and(|o| o.get().inner == self.inner)
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        reduce_from_dict(slf.get_type().into_any(), &slf.get().to_dict(slf.py())?)
    }
}

#[pymethods]
impl BlockRemoved {
    #[new]
    #[pyo3(signature = (block_hashes, medium = None, group_idx = None, locality = None, ownership = None))]
    fn new(
        block_hashes: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = named::medium)] medium: Option<String>,
        #[pyo3(from_py_with = named::group_idx)] group_idx: Option<i64>,
        locality: Option<&Bound<'_, PyAny>>,
        ownership: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        Ok(BlockRemoved {
            inner: Removed {
                block_hashes: hashes_from_py(block_hashes)?,
                medium,
                group_idx,
                locality: opt_value_from_py(locality)?,
                ownership: opt_value_from_py(ownership)?,
            },
        })
    }

    #[getter]
    fn block_hashes(&self) -> Vec<u64> {
        self.inner.block_hashes.clone()
    }
    #[getter]
    fn medium(&self) -> Option<&str> {
        self.inner.medium.as_deref()
    }
    #[getter]
    fn group_idx(&self) -> Option<i64> {
        self.inner.group_idx
    }
    #[getter]
    fn locality<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        opt_value_to_py(py, self.inner.locality.as_ref())
    }
    #[getter]
    fn ownership<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        opt_value_to_py(py, self.inner.ownership.as_ref())
    }

    /// The event as a dict: ``type`` first, then every field in vLLM's order.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let r = &self.inner;
        let d = PyDict::new(py);
        d.set_item("type", "BlockRemoved")?;
        d.set_item("block_hashes", &r.block_hashes)?;
        d.set_item("medium", r.medium.as_deref())?;
        d.set_item("group_idx", r.group_idx)?;
        d.set_item("locality", opt_value_to_py(py, r.locality.as_ref())?)?;
        d.set_item("ownership", opt_value_to_py(py, r.ownership.as_ref())?)?;
        Ok(d)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!("BlockRemoved({})", repr_fields(&self.to_dict(py)?, true)?))
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other.cast::<BlockRemoved>().is_ok_and(|o| o.get().inner == self.inner)
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        reduce_from_dict(slf.get_type().into_any(), &slf.get().to_dict(slf.py())?)
    }
}

#[pymethods]
impl AllBlocksCleared {
    #[new]
    fn new() -> Self {
        AllBlocksCleared
    }

    /// The event as a dict (``{"type": "AllBlocksCleared"}``).
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("type", "AllBlocksCleared")?;
        Ok(d)
    }

    fn __repr__(&self) -> &'static str {
        "AllBlocksCleared()"
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other.cast::<AllBlocksCleared>().is_ok()
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        Ok((slf.get_type().into_any(), PyTuple::empty(slf.py())))
    }
}

/// A wire event as its Python object.
///
/// # Errors
/// A Python error making the object.
pub fn wire_to_py(py: Python<'_>, e: WireEvent) -> PyResult<Bound<'_, PyAny>> {
    Ok(match e {
        WireEvent::Stored(inner) => Bound::new(py, BlockStored { inner: *inner })?.into_any(),
        WireEvent::Removed(inner) => Bound::new(py, BlockRemoved { inner })?.into_any(),
        WireEvent::Cleared => Bound::new(py, AllBlocksCleared)?.into_any(),
    })
}

/// An event object as its wire event.
///
/// # Errors
/// `TypeError` for anything but the three event classes.
pub fn wire_from_py(obj: &Bound<'_, PyAny>) -> PyResult<WireEvent> {
    if let Ok(s) = obj.cast::<BlockStored>() {
        return Ok(WireEvent::Stored(Box::new(s.get().inner.clone())));
    }
    if let Ok(r) = obj.cast::<BlockRemoved>() {
        return Ok(WireEvent::Removed(r.get().inner.clone()));
    }
    if obj.cast::<AllBlocksCleared>().is_ok() {
        return Ok(WireEvent::Cleared);
    }
    Err(dtype(format!(
        "expected BlockStored, BlockRemoved or AllBlocksCleared, not {}",
        obj.get_type().name()?
    )))
}

/// Converts drained core events into a Python list (a single-group cache's
/// events: medium ``"GPU"``, group 0, ``full_attention``).
pub fn to_list(py: Python<'_>, events: Vec<KvEvent>) -> PyResult<Bound<'_, PyList>> {
    let meta = CacheMeta::default();
    let out = PyList::empty(py);
    for e in events {
        out.append(wire_to_py(py, WireEvent::from_cache(e, &meta))?)?;
    }
    Ok(out)
}
