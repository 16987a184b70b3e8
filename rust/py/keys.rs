//! Python extra-key arguments (`cache_salt`, `lora`, `mm_items`) -> [`KeySpec`].

use pyo3::prelude::*;

use super::errors::{invalid, IntoPyResult};
use crate::core::hash::{KeySpec, MmItem};

/// Builds a [`KeySpec`] from the keyword arguments shared by `block_hashes`
/// and the caches: `lora` is `(name, path)`, `mm_items` a sequence of
/// `(identifier, offset, length)`.
pub fn spec(
    cache_salt: Option<String>,
    lora: Option<&Bound<'_, PyAny>>,
    mm_items: Option<&Bound<'_, PyAny>>,
) -> PyResult<KeySpec> {
    let lora = match lora {
        None => None,
        Some(l) if l.is_none() => None,
        Some(l) => Some(
            l.extract::<(String, String)>()
                .map_err(|_| invalid("lora must be a (name, path) tuple of two strings"))?,
        ),
    };
    let mut items = Vec::new();
    if let Some(m) = mm_items {
        if !m.is_none() {
            for it in m.try_iter().map_err(|_| invalid("mm_items must be a sequence"))? {
                let (identifier, offset, length) = it?.extract::<(String, i64, i64)>().map_err(|_| {
                    invalid("each mm item must be an (identifier: str, offset: int, length: int) tuple")
                })?;
                items.push(MmItem { identifier, offset, length });
            }
        }
    }
    KeySpec::new(lora, cache_salt, items).py()
}
