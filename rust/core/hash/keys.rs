//! Extra keys: what besides tokens goes into a block's hash.
//!
//! A request may carry a LoRA adapter `(name, path)`, a cache salt and
//! multimodal items `(identifier, offset, length)` in token positions. For a
//! block covering tokens `[s, s + B)` the keys are, in this order (vLLM 0.33):
//! 1. `("lora", name, path)` on every block;
//! 2. `("mm", identifier, offset - s)` for each item with
//!    `offset < s + B && offset + length > s`, in item order;
//! 3. `("cache_salt", salt)` on block 0 only, and only for a non-empty salt.
//!
//! Invariants (checked by [`KeySpec::new`]): items have offsets >= 0,
//! lengths >= 1, and do not overlap, in offset order. Costs: a block's
//! keys O(items up to the block's end) (the scan stops at the first item
//! past it).

use crate::core::error::{KvError, KvResult};

/// A multimodal placeholder in prompt-token positions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MmItem {
    /// Content identifier (e.g. the image hash).
    pub identifier: String,
    /// First token position of the item.
    pub offset: i64,
    /// Number of token positions the item covers (>= 1).
    pub length: i64,
}

/// One extra key of one block, borrowing its strings from a [`KeySpec`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExtraKey<'a> {
    /// `("lora", name, path)`.
    Lora(&'a str, &'a str),
    /// `("mm", identifier, offset relative to the block start)`.
    Mm(&'a str, i64),
    /// `("cache_salt", salt)`.
    Salt(&'a str),
}

/// Everything of a request that feeds extra keys. Immutable once built.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeySpec {
    /// LoRA adapter `(name, path)`.
    pub lora: Option<(String, String)>,
    /// Cache salt (an empty salt adds no key, as in vLLM).
    pub cache_salt: Option<String>,
    /// Multimodal items, sorted by offset and non-overlapping.
    pub mm_items: Vec<MmItem>,
}

impl KeySpec {
    /// Validates and builds a spec.
    ///
    /// # Errors
    /// `InvalidArgument` if mm items are unsorted, overlapping, have a
    /// negative offset or a length below 1.
    pub fn new(
        lora: Option<(String, String)>,
        cache_salt: Option<String>,
        mm_items: Vec<MmItem>,
    ) -> KvResult<Self> {
        let mut end = 0i64;
        for (i, it) in mm_items.iter().enumerate() {
            if it.offset < 0 || it.length < 1 {
                return Err(KvError::invalid(format!(
                    "mm_items[{i}]: offset must be >= 0 and length >= 1 (got offset {}, length {})",
                    it.offset, it.length
                )));
            }
            if i > 0 && it.offset < end {
                return Err(KvError::invalid(format!(
                    "mm_items[{i}]: items must be sorted by offset and must not overlap"
                )));
            }
            end = it
                .offset
                .checked_add(it.length)
                .ok_or_else(|| KvError::invalid(format!("mm_items[{i}]: offset + length overflows")))?;
        }
        let cache_salt = cache_salt.filter(|s| !s.is_empty());
        Ok(KeySpec { lora, cache_salt, mm_items })
    }

    /// True when no block of this request gets extra keys.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.lora.is_none() && self.cache_salt.is_none() && self.mm_items.is_empty()
    }

    /// Writes the keys of the block starting at token `start` with `block_size`
    /// tokens into `out` (cleared first). O(number of mm items).
    pub fn block_keys<'a>(&'a self, start: i64, block_size: i64, out: &mut Vec<ExtraKey<'a>>) {
        out.clear();
        if let Some((name, path)) = &self.lora {
            out.push(ExtraKey::Lora(name, path));
        }
        let end = start + block_size;
        for it in &self.mm_items {
            if it.offset >= end {
                break;
            }
            if it.offset + it.length > start {
                out.push(ExtraKey::Mm(&it.identifier, it.offset - start));
            }
        }
        if start == 0 {
            if let Some(salt) = &self.cache_salt {
                out.push(ExtraKey::Salt(salt));
            }
        }
    }
}
