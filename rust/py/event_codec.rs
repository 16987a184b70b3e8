//! The KV-event wire format: [`EventEncoder`] drains a cache's buffer into
//! one vLLM 0.33 `KVEventBatch` msgpack payload per call, and
//! [`decode_event_batch`] turns a payload back into event objects
//! ([`super::events`]).

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use super::args::named;
use super::cache::PyPrefixCache;
use super::errors::{dtype, invalid};
use super::events::{wire_from_py, wire_to_py};
use super::radix::PyRadixTree;
use crate::core::events::KvEvent;
use crate::core::wire::batch::{decode_batch, encode_batch, encode_cache_batch, Tagging};
use crate::core::wire::event::CacheMeta;

/// Encodes KV events as vLLM 0.33 ``KVEventBatch`` msgpack payloads
/// (``[ts, events, data_parallel_rank]``, events map-tagged by ``"type"``, or with
/// ``array_tagged`` the older ``[type, field, ...]`` form). ``medium``, ``group_idx``,
/// ``kv_cache_spec_kind`` are written into a cache's own events (whose ``lora_id``
/// is None: kvindex keys LoRA adapters by name).
#[pyclass(module = "kvindex._core", frozen)]
pub struct EventEncoder {
    meta: CacheMeta,
    dp_rank: Option<i64>,
    tagging: Tagging,
}

fn drain(cache: &Bound<'_, PyAny>) -> PyResult<Vec<KvEvent>> {
    if let Ok(c) = cache.cast::<PyPrefixCache>() {
        return Ok(c.try_borrow_mut()?.drain_events());
    }
    if let Ok(c) = cache.cast::<PyRadixTree>() {
        return Ok(c.try_borrow_mut()?.drain_events());
    }
    Err(dtype(format!(
        "expected HashChainCache, RadixPrefixCache or RadixCache, not {}",
        cache.get_type().name()?
    )))
}

#[pymethods]
impl EventEncoder {
    #[new]
    #[pyo3(signature = (
        *, data_parallel_rank = Some(0), medium = Some("GPU".to_owned()), group_idx = Some(0),
        kv_cache_spec_kind = Some("full_attention".to_owned()), array_tagged = false
    ), text_signature = "(*, data_parallel_rank=0, medium='GPU', group_idx=0, kv_cache_spec_kind='full_attention', array_tagged=False)")]
    fn new(
        #[pyo3(from_py_with = named::data_parallel_rank)] data_parallel_rank: Option<i64>,
        #[pyo3(from_py_with = named::medium)] medium: Option<String>,
        #[pyo3(from_py_with = named::group_idx)] group_idx: Option<i64>,
        #[pyo3(from_py_with = named::kv_cache_spec_kind)] kv_cache_spec_kind: Option<String>,
        #[pyo3(from_py_with = named::array_tagged)] array_tagged: bool,
    ) -> Self {
        EventEncoder {
            meta: CacheMeta { medium, group_idx, kv_cache_spec_kind },
            dp_rank: data_parallel_rank,
            tagging: if array_tagged { Tagging::Array } else { Tagging::Map },
        }
    }

    #[getter]
    fn data_parallel_rank(&self) -> Option<i64> {
        self.dp_rank
    }
    #[getter]
    fn array_tagged(&self) -> bool {
        self.tagging == Tagging::Array
    }
    #[getter]
    fn medium(&self) -> Option<&str> {
        self.meta.medium.as_deref()
    }
    #[getter]
    fn group_idx(&self) -> Option<i64> {
        self.meta.group_idx
    }
    #[getter]
    fn kv_cache_spec_kind(&self) -> Option<&str> {
        self.meta.kv_cache_spec_kind.as_deref()
    }

    /// Drains ``cache``'s buffered events into one payload stamped ``ts``;
    /// with ``skip_empty``, ``None`` when there were none.
    #[pyo3(signature = (cache, ts, *, skip_empty = true))]
    fn encode<'py>(
        &self,
        cache: &Bound<'py, PyAny>,
        #[pyo3(from_py_with = named::ts)] ts: f64,
        #[pyo3(from_py_with = named::skip_empty)] skip_empty: bool,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let events = drain(cache)?;
        if skip_empty && events.is_empty() {
            return Ok(None);
        }
        let mut out = Vec::with_capacity(64 + events.len() * 256);
        encode_cache_batch(&mut out, ts, &events, self.dp_rank, &self.meta, self.tagging);
        Ok(Some(PyBytes::new(cache.py(), &out)))
    }

    /// Encodes event objects (as they are, ignoring this encoder's metadata)
    /// into one payload stamped ``ts``.
    fn encode_events<'py>(
        &self,
        events: &Bound<'py, PyAny>,
        #[pyo3(from_py_with = named::ts)] ts: f64,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let it = events.try_iter().map_err(|_| dtype("events must be an iterable of event objects"))?;
        let evs = it.map(|e| wire_from_py(&e?)).collect::<PyResult<Vec<_>>>()?;
        let mut out = Vec::with_capacity(64 + evs.len() * 256);
        encode_batch(&mut out, ts, &evs, self.dp_rank, self.tagging);
        Ok(PyBytes::new(events.py(), &out))
    }

    fn __repr__(&self) -> String {
        let s = |v: &Option<String>| v.as_ref().map_or_else(|| "None".to_owned(), |x| format!("{x:?}"));
        let i = |v: Option<i64>| v.map_or_else(|| "None".to_owned(), |x| x.to_string());
        format!(
            "EventEncoder(data_parallel_rank={}, medium={}, group_idx={}, kv_cache_spec_kind={}, array_tagged={})",
            i(self.dp_rank),
            s(&self.meta.medium),
            i(self.meta.group_idx),
            s(&self.meta.kv_cache_spec_kind),
            if self.tagging == Tagging::Array { "True" } else { "False" }
        )
    }
}

/// `(ts, events, data_parallel_rank, skipped_types)`.
type DecodedBatch<'py> = (f64, Bound<'py, PyList>, Option<i64>, Vec<String>);

/// Decodes a ``KVEventBatch`` payload (map- or array-tagged events; hashes as
/// unsigned or signed ints or bytes) into ``(ts, events, data_parallel_rank,
/// skipped_types)``. Raises ``InvalidArgumentError`` for malformed input.
#[pyfunction]
#[pyo3(signature = (payload, *, block_size = None))]
pub fn decode_event_batch<'py>(
    py: Python<'py>,
    payload: &Bound<'py, PyAny>,
    #[pyo3(from_py_with = named::block_size_opt)] block_size: Option<i64>,
) -> PyResult<DecodedBatch<'py>> {
    let Ok(payload) = payload.cast::<PyBytes>() else {
        return Err(dtype(format!("payload must be bytes, got {}", payload.get_type().name()?)));
    };
    let payload = payload.as_bytes();
    let b =
        decode_batch(payload, block_size).map_err(|e| invalid(format!("malformed KV event batch: {e}")))?;
    let out = PyList::empty(py);
    for e in b.events {
        out.append(wire_to_py(py, e)?)?;
    }
    Ok((b.ts, out, b.dp_rank, b.skipped))
}
