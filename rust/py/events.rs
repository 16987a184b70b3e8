//! KV events as Python objects (frozen classes), shared by both caches.

use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use crate::core::events::{EventKey, KvEvent};

/// A run of consecutive blocks became cached.
#[pyclass(module = "kvindex._core", frozen, get_all)]
pub struct BlockStored {
    block_hashes: Vec<u64>,
    parent_block_hash: Option<u64>,
    token_ids: Vec<i64>,
    block_size: usize,
    lora_name: Option<String>,
    extra_keys: Py<PyList>,
}

/// Blocks stopped being cached.
#[pyclass(module = "kvindex._core", frozen, get_all)]
pub struct BlockRemoved {
    block_hashes: Vec<u64>,
}

/// Every cached block was dropped.
#[pyclass(module = "kvindex._core", frozen)]
pub struct AllBlocksCleared;

#[pymethods]
impl BlockStored {
    fn __repr__(&self) -> String {
        format!(
            "BlockStored(block_hashes={:?}, parent_block_hash={}, num_tokens={}, block_size={}, lora_name={})",
            self.block_hashes,
            self.parent_block_hash.map_or_else(|| "None".to_owned(), |h| h.to_string()),
            self.token_ids.len(),
            self.block_size,
            self.lora_name.as_ref().map_or_else(|| "None".to_owned(), |n| format!("{n:?}"))
        )
    }
}

#[pymethods]
impl BlockRemoved {
    fn __repr__(&self) -> String {
        format!("BlockRemoved(block_hashes={:?})", self.block_hashes)
    }
}

#[pymethods]
impl AllBlocksCleared {
    fn __repr__(&self) -> &'static str {
        "AllBlocksCleared()"
    }
}

fn key_obj<'py>(py: Python<'py>, k: &EventKey) -> PyResult<Bound<'py, PyAny>> {
    Ok(match k {
        EventKey::Str(s) => s.into_pyobject(py)?.into_any(),
        EventKey::Mm(id, off) => {
            PyTuple::new(py, [id.into_pyobject(py)?.into_any(), off.into_pyobject(py)?.into_any()])?
                .into_any()
        }
    })
}

/// Converts drained core events into a Python list.
pub fn to_list(py: Python<'_>, events: Vec<KvEvent>) -> PyResult<Bound<'_, PyList>> {
    let out = PyList::empty(py);
    for e in events {
        match e {
            KvEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
                lora_name,
                extra_keys,
            } => {
                let ek = PyList::empty(py);
                for keys in &extra_keys {
                    match keys {
                        None => ek.append(py.None())?,
                        Some(ks) => {
                            let items = ks.iter().map(|k| key_obj(py, k)).collect::<PyResult<Vec<_>>>()?;
                            ek.append(PyTuple::new(py, items)?)?;
                        }
                    }
                }
                let obj = BlockStored {
                    block_hashes,
                    parent_block_hash,
                    token_ids,
                    block_size,
                    lora_name,
                    extra_keys: ek.unbind(),
                };
                out.append(Py::new(py, obj)?)?;
            }
            KvEvent::BlockRemoved { block_hashes } => {
                out.append(Py::new(py, BlockRemoved { block_hashes })?)?
            }
            KvEvent::AllBlocksCleared => out.append(Py::new(py, AllBlocksCleared)?)?,
        }
    }
    Ok(out)
}
