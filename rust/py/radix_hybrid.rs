//! The hybrid components of :class:`RadixTree` (SWA KV with tombstones,
//! Mamba state per node; see `crate::core::radix` and its `hybrid` module):
//! their sizes, evictions, frees and per-node views.

use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::PyList;

use super::args;
use super::errors::{invalid, IntoPyResult};
use super::radix::{encode_handle, slot_array, PyRadixTree};
use crate::core::radix::HybridFreed;

/// `(swa_slots, full_only_slots, mamba_states, mamba_exist)`.
type ComponentFrees<'py> = (Bound<'py, PyArray1<i32>>, Bound<'py, PyArray1<i32>>, Bound<'py, PyList>, bool);

#[pymethods]
impl PyRadixTree {
    /// The SWA window in tokens (``None``: no sliding-window component).
    #[getter]
    fn sliding_window(&self) -> Option<usize> {
        self.inner.components().swa_window
    }

    /// Whether the tree keeps a Mamba state per node.
    #[getter]
    fn mamba(&self) -> bool {
        self.inner.components().mamba
    }

    /// Tokens of live SWA KV held by no SWA lock.
    #[getter]
    fn swa_evictable_size(&self) -> usize {
        self.inner.swa_sizes().0
    }

    /// Tokens of live SWA KV under an SWA (window) lock.
    #[getter]
    fn swa_protected_size(&self) -> usize {
        self.inner.swa_sizes().1
    }

    /// Mamba states held by no lock.
    #[getter]
    fn mamba_evictable_size(&self) -> usize {
        self.inner.mamba_sizes().0
    }

    /// Mamba states under a lock.
    #[getter]
    fn mamba_protected_size(&self) -> usize {
        self.inner.mamba_sizes().1
    }

    /// Evicts SWA KV until ``num_tokens`` SWA tokens are freed: the least recent
    /// SWA-unlocked node; a deletable leaf is deleted (its slots are returned), an
    /// inner node becomes a tombstone (its SWA slots, and Mamba state, wait in
    /// :meth:`take_component_frees`).
    fn evict_swa<'py>(
        slf: &Bound<'py, Self>,
        num_tokens: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<i32>>> {
        let n = args::usize_arg(num_tokens, "num_tokens", usize::MAX)?;
        let mut guard = slf.try_borrow_mut()?;
        let me = &mut *guard;
        let mut freed = Vec::new();
        me.inner.evict_swa(n, &mut freed);
        slot_array(slf.py(), &freed, me.inner.page_size())
    }

    /// Evicts ``num_states`` Mamba states: the least recent unlocked one; a deletable
    /// leaf is deleted (its slots are returned), an inner node only loses its state.
    fn evict_mamba<'py>(
        slf: &Bound<'py, Self>,
        num_states: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<i32>>> {
        let n = args::usize_arg(num_states, "num_states", usize::MAX)?;
        let mut guard = slf.try_borrow_mut()?;
        let me = &mut *guard;
        let mut freed = Vec::new();
        me.inner.evict_mamba(n, &mut freed);
        slot_array(slf.py(), &freed, me.inner.page_size())
    }

    /// Drains the component frees of the operations since the last call:
    /// ``(swa_slots, full_only_slots, mamba_states, mamba_exist)``. ``swa_slots``: slots
    /// whose SWA KV was freed; ``full_only_slots``: slots to free without their SWA KV
    /// (a revived tombstone's old slots, or the caller's whose SWA a locked tombstone
    /// adopted); ``mamba_exist``: an insert ended on a node that already had a state
    /// (the caller frees its own).
    fn take_component_frees<'py>(slf: &Bound<'py, Self>) -> PyResult<ComponentFrees<'py>> {
        let py = slf.py();
        let mut guard = slf.try_borrow_mut()?;
        let me = &mut *guard;
        let mut f = HybridFreed::default();
        me.inner.take_hybrid_freed(&mut f);
        let ps = me.inner.page_size();
        Ok((
            slot_array(py, &f.swa, ps)?,
            slot_array(py, &f.full_only, ps)?,
            PyList::new(py, f.mamba)?,
            f.mamba_exist,
        ))
    }

    /// ``(swa_live, swa_lock_ref, mamba_state, mamba_lock_ref)`` of a node.
    fn node_components(
        slf: &Bound<'_, Self>,
        node: &Bound<'_, PyAny>,
    ) -> PyResult<(bool, u32, Option<u32>, u32)> {
        let v = args::int(node, "node")?;
        let me = slf.try_borrow()?;
        let id = me.inner.resolve(me.decode(&v)?).py()?;
        Ok(me.inner.node_components(id))
    }

    /// Node handles of a component's recency list (``"swa"`` or ``"mamba"``), least
    /// recent first.
    fn component_lru<'py>(
        slf: &Bound<'py, Self>,
        component: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let py = slf.py();
        let mamba = match args::text(component, "component")? {
            "swa" => false,
            "mamba" => true,
            other => return Err(invalid(format!("component must be 'swa' or 'mamba', got {other:?}"))),
        };
        let me = slf.try_borrow()?;
        let handles = me
            .inner
            .component_lru(mamba)
            .into_iter()
            .map(|id| encode_handle(py, &me.base, me.inner.handle(id)))
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, handles)
    }
}
