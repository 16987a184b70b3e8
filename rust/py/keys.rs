//! Python extra-key arguments (`cache_salt`, `lora`, `mm_items`) -> [`KeySpec`].

use pyo3::prelude::*;

use super::args;
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
                let bad =
                    || invalid("each mm item must be an (identifier: str, offset: int, length: int) tuple");
                let it = it?;
                let (identifier, offset, length) =
                    it.extract::<(String, Bound<'_, PyAny>, Bound<'_, PyAny>)>().map_err(|_| bad())?;
                // Offsets and lengths follow the rule of every int parameter, except
                // that a non-int (bool included) is a malformed item.
                if !args::is_int_like(&offset) || !args::is_int_like(&length) {
                    return Err(bad());
                }
                let offset = args::i64_arg(&offset, "mm item offset")?;
                let length = args::i64_arg(&length, "mm item length")?;
                items.push(MmItem { identifier, offset, length });
            }
        }
    }
    KeySpec::new(lora, cache_salt, items).py()
}
