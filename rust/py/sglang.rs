//! `RadixTree`'s methods for a cache behind SGLang's `BasePrefixCache` seam
//! (`kvindex.integrations.sglang`): each takes and returns what one SGLang
//! call needs, so that call is one Rust call with nothing to convert in
//! Python.
//!
//! - [`PyRadixTree::match_node`]: a match's hit length and node, without the
//!   slot array (SGLang reads the slots later, through
//!   `path_device_indices`);
//! - [`PyRadixTree::path_slots_i64`]: the path's slots as int64, the dtype of
//!   SGLang's device-index tensors (`torch.from_numpy` wraps it as is);
//! - [`PyRadixTree::insert_len`]: an insert that cuts the key to whole pages
//!   itself, reads only the slots those pages need from a longer slot array,
//!   and returns the present prefix alone (SGLang's caller frees the
//!   duplicates by position);
//! - [`PyRadixTree::evict_leaves`]: whole leaves in policy order, one int64
//!   array per leaf (slots, or page ids for a paged allocator's
//!   `free_page_ids`), so the caller frees leaf by leaf as SGLang's own cache
//!   does, after one Rust call.
//!
//! Semantics are those of the general methods in [`super::radix`]
//! (`match_prefix`, `path_slots`, `insert`, `evict`): the same core calls,
//! the same errors, the same stamps and events.
use std::borrow::Cow;
use std::mem::MaybeUninit;

use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::PyList;

use super::arrays::{self, with_views, Tokens};
use super::errors::{capacity, invalid, IntoPyResult};
use super::radix::{encode_handle, PyRadixTree};
use super::{args, args::named};
use crate::core::ids::PageId;
use crate::core::pages::{slots_to_pages, PageMath};
use crate::core::radix::InsertOpts;
use crate::core::radix_cache::narrow_tokens;

/// The per-token slots of `pages` (page `p` holds slots `p * ps .. (p + 1) * ps`) as a
/// new int64 array, written in place.
///
/// # Errors
/// `CapacityError` when the array cannot be allocated.
fn slot_array_i64<'py>(py: Python<'py>, pages: &[PageId], ps: usize) -> PyResult<Bound<'py, PyArray1<i64>>> {
    let n = pages.len().checked_mul(ps).ok_or_else(|| capacity("slot array too large"))?;
    arrays::filled_i64(py, n, |dst| {
        match ps {
            1 => {
                for (d, p) in dst.iter_mut().zip(pages) {
                    d.write(i64::from(p.0));
                }
            }
            4 => expand::<4>(pages, dst),
            8 => expand::<8>(pages, dst),
            16 => expand::<16>(pages, dst),
            32 => expand::<32>(pages, dst),
            64 => expand::<64>(pages, dst),
            _ => {
                #[allow(clippy::cast_possible_wrap)]
                let ps64 = ps as i64;
                for (run, p) in dst.chunks_exact_mut(ps).zip(pages) {
                    let base = i64::from(p.0) * ps64;
                    for (k, d) in (0..).zip(run.iter_mut()) {
                        d.write(base + k);
                    }
                }
            }
        }
        n
    })
}

/// [`slot_array_i64`]'s fill for a page size known at compile time (the loop
/// over a page's slots unrolls and vectorises).
fn expand<const P: usize>(pages: &[PageId], dst: &mut [MaybeUninit<i64>]) {
    #[allow(clippy::cast_possible_wrap)]
    let p64 = P as i64;
    for (run, p) in dst.chunks_exact_mut(P).zip(pages) {
        let base = i64::from(p.0) * p64;
        let run: &mut [MaybeUninit<i64>; P] = run.try_into().expect("a page of slots");
        for (k, d) in (0..).zip(run.iter_mut()) {
            d.write(base + k);
        }
    }
}

/// int64 values narrowed to int32, or `None` if one does not fit: a range
/// check over the whole slice, then the casts (both passes vectorise; the
/// general `narrow_tokens` checks and collects element by element).
#[allow(clippy::cast_possible_truncation)]
fn narrow(a: &[i64]) -> Option<Vec<i32>> {
    let fits = a.iter().fold(true, |ok, &x| ok & (i64::from(x as i32) == x));
    fits.then(|| a.iter().map(|&x| x as i32).collect())
}

fn opt_namespace<'a>(ns: Option<&'a Bound<'_, PyAny>>) -> PyResult<Option<&'a str>> {
    ns.filter(|o| !o.is_none()).map(|o| args::text(o, "namespace")).transpose()
}

#[pymethods]
impl PyRadixTree {
    /// ``match_prefix`` returning ``(hit_len, node)`` only: the same stamps and
    /// splits, no slot array (read it with :meth:`path_slots_i64` when needed).
    #[pyo3(signature = (tokens, namespace = None))]
    fn match_node<'py>(
        &mut self,
        py: Python<'py>,
        tokens: &Bound<'py, PyAny>,
        namespace: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<(usize, Bound<'py, PyAny>)> {
        let namespace = opt_namespace(namespace)?;
        let tree = &mut self.inner;
        let (len, node) = with_views(Tokens(tokens, "tokens"), |t| {
            arrays::with_tokens!(t, s => {
                let m = tree.match_nodes(s, namespace);
                (m.len, m.node)
            })
        })?;
        let h = self.inner.handle(node);
        Ok((len, encode_handle(py, &self.base, h)?))
    }

    /// Slots of the path root..node as int64 (``path_slots`` in SGLang's index dtype).
    fn path_slots_i64<'py>(
        slf: &Bound<'py, Self>,
        node: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let v = args::int(node, "node")?;
        let me = slf.try_borrow()?;
        let id = me.inner.resolve(me.decode(&v)?).py()?;
        let mut pages = Vec::new();
        me.inner.path_values(id, &mut pages);
        slot_array_i64(slf.py(), &pages, me.inner.page_size())
    }

    /// Inserts ``tokens`` cut to whole pages with the first slots of ``slots`` (one per
    /// kept token; extra slots are ignored, not freed); returns the tokens already present.
    /// The caller frees its slots for ``[its hit, prefix)`` itself. Errors as ``insert``.
    #[pyo3(signature = (tokens, slots, namespace = None, *, priority = 0, inserted_len = 0))]
    fn insert_len(
        slf: &Bound<'_, Self>,
        tokens: &Bound<'_, PyAny>,
        slots: &Bound<'_, PyAny>,
        namespace: Option<&Bound<'_, PyAny>>,
        #[pyo3(from_py_with = named::priority)] priority: i64,
        #[pyo3(from_py_with = named::inserted_len)] inserted_len: usize,
    ) -> PyResult<usize> {
        let namespace = opt_namespace(namespace)?;
        let opts = InsertOpts { inserted_len, ..InsertOpts::default() };
        let mut guard = slf.try_borrow_mut()?;
        let me = &mut *guard;
        let ps = me.inner.page_size();
        let tree = &mut me.inner;
        with_views((Tokens(tokens, "tokens"), Tokens(slots, "slots")), |(toks, slots)| {
            let toks = match toks {
                arrays::TokenArray::I32(a) => Cow::Borrowed(a),
                arrays::TokenArray::I64(a) => match narrow(a) {
                    Some(v) => Cow::Owned(v),
                    None => return Err(narrow_tokens(a).py().expect_err("a token out of range")),
                },
            };
            let full = toks.len() / ps * ps;
            let slots = match slots {
                arrays::TokenArray::I32(a) if a.len() >= full => Cow::Borrowed(&a[..full]),
                arrays::TokenArray::I64(a) if a.len() >= full => {
                    Cow::Owned(narrow(&a[..full]).ok_or_else(|| invalid("slots must fit in int32"))?)
                }
                arrays::TokenArray::I32(a) => return Err(too_few(a.len(), full)),
                arrays::TokenArray::I64(a) => return Err(too_few(a.len(), full)),
            };
            let mut pages = Vec::with_capacity(full / ps);
            slots_to_pages(&slots, PageMath::new(ps), &mut pages).py()?;
            let mut dup = Vec::new();
            tree.insert_hybrid(&toks[..full], &pages, namespace, priority, &[], &mut dup, &opts).py()
        })?
    }

    /// Evicts whole unlocked leaves in policy order until ``num_tokens`` are freed (may
    /// free more); returns one int64 array per leaf, in eviction order: its slots, or
    /// with ``pages=True`` its page ids (``slot // page_size`` of each page's first slot).
    #[pyo3(signature = (num_tokens, *, pages = false))]
    fn evict_leaves<'py>(
        slf: &Bound<'py, Self>,
        num_tokens: &Bound<'py, PyAny>,
        pages: bool,
    ) -> PyResult<Bound<'py, PyList>> {
        let n = args::usize_arg(num_tokens, "num_tokens", usize::MAX)?;
        let py = slf.py();
        let mut guard = slf.try_borrow_mut()?;
        let me = &mut *guard;
        let ps = me.inner.page_size();
        let out = PyList::empty(py);
        let mut freed = Vec::new();
        let mut done = 0;
        while done < n {
            freed.clear();
            let got = me.inner.evict(1, &mut freed);
            if got == 0 {
                break;
            }
            done += got;
            let arr = slot_array_i64(py, &freed, if pages { 1 } else { ps })?;
            out.append(arr)?;
        }
        Ok(out)
    }
}

#[cold]
fn too_few(got: usize, need: usize) -> PyErr {
    invalid(format!("slots ({got}) must cover the key's whole pages ({need} tokens)"))
}
