//! Routing scores over [`super::ClusterIndex::overlaps`] answers.
//!
//! Dynamo's KV router shape: the cost of sending a prompt of `n` blocks to
//! worker `w` is `overlap_weight * (n - overlap[w]) + load[w]` — blocks it
//! would still have to prefill, weighted, plus its decode load (active
//! blocks). The lowest cost wins; ties go to the first eligible worker at or
//! after `start` in slot order (a caller's rotating counter spreads ties).
//! Least-loaded routing is `overlap_weight = 0`. O(workers).
//!
//! No state, so no invariants: a pure function of the answers and loads.

/// The eligible worker of lowest cost, or None if none is eligible.
/// `load[w]` is NaN for a slot that must not be chosen (no worker, draining).
#[must_use]
pub fn pick_min_cost(
    overlaps: &[u32],
    n_blocks: usize,
    load: &[f64],
    overlap_weight: f64,
    start: usize,
) -> Option<usize> {
    let n = overlaps.len().min(load.len());
    if n == 0 {
        return None;
    }
    let mut best: Option<(usize, f64)> = None;
    #[allow(clippy::cast_precision_loss)]
    let total = n_blocks as f64;
    for k in 0..n {
        let w = (start + k) % n;
        let l = load[w];
        if l.is_nan() {
            continue;
        }
        let cost = overlap_weight * (total - f64::from(overlaps[w])) + l;
        if best.is_none_or(|(_, c)| cost < c) {
            best = Some((w, cost));
        }
    }
    best.map(|(w, _)| w)
}

#[cfg(test)]
mod tests {
    use super::pick_min_cost;

    #[test]
    fn overlap_against_load() {
        // 10 blocks; worker 1 holds 8 but carries 5 more blocks of load.
        let ov = [0, 8, 2];
        assert_eq!(pick_min_cost(&ov, 10, &[0.0, 5.0, 0.0], 1.0, 0), Some(1));
        assert_eq!(pick_min_cost(&ov, 10, &[0.0, 9.0, 0.0], 1.0, 0), Some(2));
        assert_eq!(pick_min_cost(&ov, 10, &[0.0, 9.0, 0.0], 0.0, 0), Some(0));
        assert_eq!(pick_min_cost(&ov, 10, &[f64::NAN, f64::NAN, f64::NAN], 1.0, 0), None);
        // ties rotate with start
        assert_eq!(pick_min_cost(&[0, 0, 0], 4, &[1.0, 1.0, 1.0], 1.0, 2), Some(2));
        assert_eq!(pick_min_cost(&[0, 0, 0], 4, &[1.0, f64::NAN, 1.0], 1.0, 1), Some(2));
    }
}
