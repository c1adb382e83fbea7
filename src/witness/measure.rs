//! The spec's null models (rows of the baseline selectors) and its two
//! metrics of one candidate row.

use super::segment_of;
use crate::attention::Selector;

/// The random null: `min(budget, L)` tokens drawn uniformly without
/// replacement from `[0, L)`, ascending; row `L - 1` of
/// [`Selector::Random`]. Empty for `L = 0`.
pub fn random_null(context_len: usize, budget: usize, seed: u64) -> Vec<i32> {
    match context_len.checked_sub(1) {
        Some(last) => Selector::Random { budget, seed }.row(last),
        None => Vec::new(),
    }
}

/// The locality null: the `min(budget, L)` most recent tokens,
/// `[L - k, L)`; row `L - 1` of [`Selector::Local`]. Empty for `L = 0`.
pub fn locality_null(context_len: usize, budget: usize) -> Vec<i32> {
    match context_len.checked_sub(1) {
        Some(last) => Selector::Local { window: budget }.row(last),
        None => Vec::new(),
    }
}

/// The share of the `S_eff` segments of `[0, L)` that `candidates` meets:
/// `|{σ(x) : x ∈ C ∩ [0, L)}| / S_eff`. Padding, duplicates and out-of-range
/// entries count for nothing. 1 when there are no segments (`L = 0` or
/// `num_segments = 0`).
pub fn segment_coverage(candidates: &[i32], context_len: usize, num_segments: usize) -> f64 {
    let s_eff = num_segments.min(context_len);
    if s_eff == 0 {
        return 1.0;
    }
    let segments = candidates
        .iter()
        .filter(|&&x| x >= 0 && (x as usize) < context_len)
        .map(|&x| segment_of(x as usize, context_len, num_segments));
    // Memory follows the candidates, never the segment count alone (which
    // may be huge): a flag per segment when there are few segments for the
    // candidates, else sort and count the distinct ones.
    let hit = if s_eff <= 64 + 8 * candidates.len() {
        let mut seen = vec![false; s_eff];
        segments
            .filter(|&s| !std::mem::replace(&mut seen[s], true))
            .count()
    } else {
        let mut hit: Vec<usize> = segments.collect();
        hit.sort_unstable();
        hit.dedup();
        hit.len()
    };
    hit as f64 / s_eff as f64
}

/// The share of a dense attention row's mass that `candidates` keeps:
/// `Σ_{x ∈ C ∩ [0, L)} a_x / Σ_{x < L} a_x`, with `L = attention_row.len()`.
/// Padding, duplicates and out-of-range entries count for nothing. The
/// quotient is taken as it is, as in the original: NaN for a row with no
/// mass and nothing kept (0/0), `±inf` when something is kept from a row
/// whose weights sum to 0 (`[0]` against `[1.0, -1.0]` is `+inf`).
pub fn attention_mass_recall(candidates: &[i32], attention_row: &[f64]) -> f64 {
    let len = attention_row.len();
    let mut seen = vec![false; len];
    let mut kept = 0.0;
    for &x in candidates {
        if x >= 0 && (x as usize) < len && !seen[x as usize] {
            seen[x as usize] = true;
            kept += attention_row[x as usize];
        }
    }
    kept / attention_row.iter().sum::<f64>()
}
