//! Block tables and slot mappings, shared by both request-level caches.
//!
//! A cache exposes each running request's block table and token count
//! through [`TableSource`]; the provided methods turn a batch of request ids
//! into what paged-attention kernels consume: a row-major `int32` table padded
//! with the null block 0, and `int64` slots `block * block_size + offset`.
//! Every method validates the whole batch before writing anything.
//!
//! Invariant: a method either writes its whole output or, on a caller
//! error, nothing. Costs: O(ids + table entries or slots written).

use crate::core::error::{ErrorKind, KvError, KvResult};
use crate::core::ids::{RequestId, TableEntry};

/// A cache whose running requests have block tables.
pub trait TableSource {
    /// Table entry type (block or page ids).
    type Entry: TableEntry;

    /// Tokens per block (page).
    fn table_block_size(&self) -> usize;

    /// Request `id`'s block table and number of tokens.
    ///
    /// # Errors
    /// `UnknownRequest` if `id` is not running.
    fn table(&self, id: RequestId) -> KvResult<(&[Self::Entry], usize)>;

    /// Request `id`'s block table. O(1).
    ///
    /// # Errors
    /// `UnknownRequest`.
    fn blocks(&self, id: RequestId) -> KvResult<&[Self::Entry]> {
        Ok(self.table(id)?.0)
    }

    /// Number of tokens request `id` holds (prompt + appended). O(1).
    ///
    /// # Errors
    /// `UnknownRequest`.
    fn num_tokens(&self, id: RequestId) -> KvResult<usize> {
        Ok(self.table(id)?.1)
    }

    /// Largest table length among `ids`. O(ids).
    ///
    /// # Errors
    /// `UnknownRequest`.
    fn max_blocks(&self, ids: &[u64]) -> KvResult<usize> {
        let mut m = 0;
        for &id in ids {
            m = m.max(self.table(RequestId(id))?.0.len());
        }
        Ok(m)
    }

    /// Writes the block tables of `ids` into `out` (`ids.len() * width`,
    /// row-major), padded with the null block. O(ids * width).
    ///
    /// # Errors
    /// `UnknownRequest`; `InvalidArgument` if a table is wider than `width`
    /// or `out` has the wrong length. Nothing is written on error.
    fn fill_block_tables(&self, ids: &[u64], width: usize, out: &mut [i32]) -> KvResult<()> {
        if out.len() != ids.len() * width {
            return Err(KvError::invalid(format!(
                "out has {} entries, expected {}",
                out.len(),
                ids.len() * width
            )));
        }
        let need = self.max_blocks(ids)?;
        if need > width {
            return Err(KvError::invalid(format!(
                "a block table has {need} blocks, more than max_blocks={width}"
            )));
        }
        for (row, &id) in out.chunks_exact_mut(width.max(1)).zip(ids) {
            let blocks = self.table(RequestId(id))?.0;
            let vals = blocks
                .iter()
                .map(|b| i32::try_from(b.raw()).expect("block ids fit i32"))
                .chain(std::iter::repeat(0));
            for (o, v) in row.iter_mut().zip(vals) {
                *o = v;
            }
        }
        Ok(())
    }

    /// Slot mapping (`block * block_size + offset`) of each request's last
    /// `query_lens[i]` tokens, concatenated. O(ids + slots).
    ///
    /// # Errors
    /// `UnknownRequest`; `InvalidArgument` for mismatched lengths or a query
    /// longer than the request; `Capacity` when the output cannot be
    /// allocated (nothing changes).
    fn slot_mapping(&self, ids: &[u64], query_lens: &[i64]) -> KvResult<Vec<i64>> {
        if ids.len() != query_lens.len() {
            return Err(KvError::invalid("request_ids and query_lens differ in length"));
        }
        let mut total = 0usize;
        for (&id, &q) in ids.iter().zip(query_lens) {
            let n = self.table(RequestId(id))?.1;
            let q = usize::try_from(q).ok().filter(|&q| q <= n).ok_or_else(|| {
                KvError::invalid(format!("query length {q} for request {id} with {n} tokens"))
            })?;
            total = total.saturating_add(q);
        }
        let bs = self.table_block_size();
        let mut out = Vec::new();
        out.try_reserve_exact(total).map_err(|_| {
            KvError::new(ErrorKind::Capacity, format!("cannot allocate a slot mapping of {total} slots"))
        })?;
        for (&id, &q) in ids.iter().zip(query_lens) {
            let (blocks, n) = self.table(RequestId(id))?;
            #[allow(clippy::cast_sign_loss, clippy::cast_possible_truncation)]
            for pos in n - q as usize..n {
                #[allow(clippy::cast_possible_wrap)]
                out.push((blocks[pos / bs].index() * bs + pos % bs) as i64);
            }
        }
        Ok(out)
    }
}

/// The token range of each request in a CSR batch (`tokens[offsets[i]..offsets[i + 1]]`,
/// or one token per request without offsets), validated by [`batch_ranges`].
#[derive(Clone, Copy, Debug)]
pub struct Ranges<'a>(Option<&'a [i64]>);

impl Ranges<'_> {
    /// Request `i`'s token range.
    #[must_use]
    pub fn get(&self, i: usize) -> (usize, usize) {
        match self.0 {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            Some(o) => (o[i] as usize, o[i + 1] as usize),
            None => (i, i + 1),
        }
    }
}

/// Validates a batch of `n` requests over `total` tokens with optional CSR offsets.
///
/// # Errors
/// `InvalidArgument` for bad offsets, or a token count other than `n` without offsets.
pub fn batch_ranges(n: usize, total: usize, offsets: Option<&[i64]>) -> KvResult<Ranges<'_>> {
    match offsets {
        Some(o) => check_offsets(o, n, total)?,
        None if total != n => {
            return Err(KvError::invalid(format!(
                "without offsets, tokens ({total}) must hold one token per request ({n})"
            )))
        }
        None => {}
    }
    Ok(Ranges(offsets))
}

/// Validates CSR offsets: `n + 1` entries, 0 first, `total` last, non-decreasing.
///
/// # Errors
/// `InvalidArgument` describing the first problem.
pub fn check_offsets(o: &[i64], n: usize, total: usize) -> KvResult<()> {
    if o.len() != n + 1 {
        return Err(KvError::invalid(format!("offsets must have {} entries, got {}", n + 1, o.len())));
    }
    #[allow(clippy::cast_possible_wrap)]
    if o[0] != 0 || o[n] != total as i64 {
        return Err(KvError::invalid(format!("offsets must start at 0 and end at {total}")));
    }
    if o.windows(2).any(|w| w[1] < w[0]) {
        return Err(KvError::invalid("offsets must not decrease"));
    }
    Ok(())
}
