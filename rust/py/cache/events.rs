//! The KV-event calls of [`PyPrefixCache`]: `take_events`, and the drain an
//! event encoder reads (`kvindex.EventEncoder.encode`).

use pyo3::prelude::*;
use pyo3::types::PyList;

use super::{each, PyPrefixCache};
use crate::core::events::KvEvent;
use crate::py::events;

impl PyPrefixCache {
    /// Drains the buffered core events.
    pub fn drain_events(&mut self) -> Vec<KvEvent> {
        each!(&mut self.inner, c => c.take_events())
    }
}

#[pymethods]
impl PyPrefixCache {
    /// Drains buffered KV events (empty unless ``enable_events``).
    fn take_events<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyList>> {
        let ev = slf.try_borrow_mut()?.drain_events();
        events::to_list(slf.py(), ev)
    }
}
