//! Metrics for judging a selection, batched over many rows.
//!
//! # What is measured
//!
//! - [`attention_probabilities`]: the dense causal attention rows
//!   `softmax(q·kᵀ · scale)` (usually `scale = 1/√d_k`), in f64 from the f32
//!   inputs. Row `(i, h)` has `n_keys` entries, the keys after query `i`'s
//!   position holding exactly 0, so a row is a valid `attention_row` for
//!   [`crate::witness::attention_mass_recall`] whatever its position.
//! - [`segment_coverage_rows`] and [`attention_mass_recall_rows`]: the
//!   witness spec's two metrics, one value per row. Each row is exactly
//!   [`crate::witness::segment_coverage`] /
//!   [`crate::witness::attention_mass_recall`] of that row (called, not
//!   reimplemented, so the batched and single-row forms cannot drift);
//!   padding, duplicates and out-of-range entries count for nothing.
//! - [`output_relative_error`]: `‖o_sparse − o_dense‖₂ / ‖o_dense‖₂` over
//!   whole outputs (or per row, [`output_relative_error_rows`]), in f64.
//!
//! # Why f64
//!
//! The probabilities are a reference, not a fast path: summed in f64 their
//! rounding (about `d · 2⁻⁵³` relative) sits far below anything a
//! selection changes, so a recall difference between two policies is the
//! policies', not the arithmetic's. What would break that: computing them
//! with the f32 attention kernels, whose `exp` and f32 sums are accurate to
//! about `1e-6` -- enough for outputs, too coarse to rank near-ties.
//!
//! # GQA
//!
//! A KV head's selection serves its whole query-head group, so a selection
//! `[n_queries, n_kv_heads, width]` is scored against probabilities
//! `[n_queries, n_q_heads, n_keys]` with `group = n_q_heads / n_kv_heads`:
//! attention row `r` is read against candidate row `r / group` (query heads
//! are grouped contiguously).
//!
//! Every function checks all its arguments before writing anything and runs
//! rows in parallel on the crate's pool; each row is computed the same way
//! on any thread, so results never depend on the thread count.

use crate::attention::AttentionShape;
use crate::error::ArgumentError;
use crate::error::{check_len, checked_size};
use crate::pool;
use crate::witness;

/// Dense causal attention probabilities, f64: `out` is
/// `[n_queries, n_q_heads, n_keys]`, row `(i, h)` the softmax of
/// `(q_ih · k_j) · scale` over `j <= min(query_pos[i], n_keys - 1)` (query
/// head `h` reading KV head `h / (n_q_heads / n_kv_heads)`), 0 after it.
/// `q` is `[n_queries, n_q_heads, d_k]`, `k` `[n_keys, n_kv_heads, d_k]`
/// (`shape.d_v` is not used). Dot products, max, `exp` and sums are f64.
///
/// Refuses a length mismatch, a bad head count and a non-finite `scale`.
pub fn attention_probabilities(
    q: &[f32],
    k: &[f32],
    shape: &AttentionShape,
    query_pos: &[usize],
    scale: f64,
    out: &mut [f64],
) -> Result<(), ArgumentError> {
    shape.check_qk(q, k)?;
    check_len("query_pos", query_pos.len(), shape.n_queries, || {
        format!("one position per query, n_queries={}", shape.n_queries)
    })?;
    if !scale.is_finite() {
        return Err(ArgumentError::Invalid {
            argument: "scale",
            message: format!("scale={scale} is not finite"),
        });
    }
    let n = checked_size("out", &[shape.n_queries, shape.n_q_heads, shape.n_keys])?;
    check_len("out", out.len(), n, || {
        format!(
            "[n_queries={}, n_q_heads={}, n_keys={}]",
            shape.n_queries, shape.n_q_heads, shape.n_keys
        )
    })?;
    let (n_q_heads, n_kv, d_k, g) = (shape.n_q_heads, shape.n_kv_heads, shape.d_k, shape.group());
    let min_rows = (1 << 16) / (shape.n_keys * d_k.max(1)).max(1);
    pool::for_each_row_mut(out, shape.n_keys, min_rows.max(1), |r, row| {
        let (i, h) = (r / n_q_heads, r % n_q_heads);
        let qr = &q[r * d_k..(r + 1) * d_k];
        let kv = h / g;
        let visible = shape.visible(query_pos[i]);
        let mut m = f64::NEG_INFINITY;
        for (j, a) in row[..visible].iter_mut().enumerate() {
            let kr = &k[(j * n_kv + kv) * d_k..(j * n_kv + kv + 1) * d_k];
            let dot: f64 = qr.iter().zip(kr).map(|(&x, &y)| x as f64 * y as f64).sum();
            *a = dot * scale;
            m = m.max(*a);
        }
        let mut total = 0.0;
        for a in row[..visible].iter_mut() {
            *a = (*a - m).exp();
            total += *a;
        }
        for a in row[..visible].iter_mut() {
            *a /= total;
        }
        row[visible..].fill(0.0);
    });
    Ok(())
}

/// `candidates` is `[rows, width]` with one context length per row.
fn check_candidate_rows(
    candidates: &[i32],
    width: usize,
    context_lens: &[usize],
    rows: usize,
) -> Result<(), ArgumentError> {
    let n = checked_size("candidates", &[rows, width])?;
    check_len("candidates", candidates.len(), n, || {
        format!("[rows={rows} (out's length), width={width}]")
    })?;
    check_len("context_lens", context_lens.len(), rows, || {
        format!("one per row, rows={rows} (out's length)")
    })
}

/// Segment coverage of many rows: `out[r]` is
/// [`crate::witness::segment_coverage`] of candidate row `r`
/// (`candidates` is `[rows, width]`, `rows = out.len()`) with context length
/// `context_lens[r]`.
pub fn segment_coverage_rows(
    candidates: &[i32],
    width: usize,
    context_lens: &[usize],
    num_segments: usize,
    out: &mut [f64],
) -> Result<(), ArgumentError> {
    check_candidate_rows(candidates, width, context_lens, out.len())?;
    pool::for_each_row_mut(out, 1, min_rows(width), |r, o| {
        let row = &candidates[r * width..(r + 1) * width];
        o[0] = witness::segment_coverage(row, context_lens[r], num_segments);
    });
    Ok(())
}

/// Slots a selection really uses: `out[r]` is how many distinct entries of
/// candidate row `r` (`candidates` is `[rows, width]`, `rows = out.len()`)
/// lie in `0..context_lens[r]` — padding, duplicates and out-of-range
/// entries use no key. (A policy may use fewer than its budget, never more.)
pub fn slots_used_rows(
    candidates: &[i32],
    width: usize,
    context_lens: &[usize],
    out: &mut [i64],
) -> Result<(), ArgumentError> {
    check_candidate_rows(candidates, width, context_lens, out.len())?;
    pool::for_each_row_mut(out, 1, min_rows(width), |r, o| {
        let len = context_lens[r];
        let mut valid: Vec<i32> = candidates[r * width..(r + 1) * width]
            .iter()
            .copied()
            .filter(|&x| usize::try_from(x).is_ok_and(|x| x < len))
            .collect();
        valid.sort_unstable();
        valid.dedup();
        o[0] = valid.len() as i64;
    });
    Ok(())
}

/// Attention-mass recall of many rows: `out[r]` is
/// [`crate::witness::attention_mass_recall`] of candidate row `r / group`
/// against attention row `r` (`attention` is `[rows, row_len]`,
/// `rows = out.len()`; `candidates` is `[rows / group, width]`). `group = 1`
/// pairs rows one to one; with GQA probabilities and a per-KV-head
/// selection, `group = n_q_heads / n_kv_heads` (see the module docs). NaN
/// for a row with no mass.
pub fn attention_mass_recall_rows(
    candidates: &[i32],
    width: usize,
    attention: &[f64],
    row_len: usize,
    group: usize,
    out: &mut [f64],
) -> Result<(), ArgumentError> {
    let rows = out.len();
    if group == 0 || !rows.is_multiple_of(group) {
        return Err(ArgumentError::Invalid {
            argument: "group",
            message: format!(
                "group={group} must be at least 1 and divide the rows (out has {rows})"
            ),
        });
    }
    let na = checked_size("attention", &[rows, row_len])?;
    check_len("attention", attention.len(), na, || {
        format!("[rows={rows} (out's length), row_len={row_len}]")
    })?;
    let nc = checked_size("candidates", &[rows / group, width])?;
    check_len("candidates", candidates.len(), nc, || {
        format!("[rows / group={}, width={width}]", rows / group)
    })?;
    pool::for_each_row_mut(out, 1, min_rows(row_len + width), |r, o| {
        let c = r / group;
        o[0] = witness::attention_mass_recall(
            &candidates[c * width..(c + 1) * width],
            &attention[r * row_len..(r + 1) * row_len],
        );
    });
    Ok(())
}

/// `‖a − b‖₂ / ‖b‖₂` in f64 (`a` the sparse output, `b` the dense one).
/// 0 when both are zero (identical), `+inf` when only `b` is.
fn relative_error(a: &[f32], b: &[f32]) -> f64 {
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        let d = x as f64 - y as f64;
        diff += d * d;
        norm += y as f64 * y as f64;
    }
    if diff == 0.0 {
        0.0
    } else {
        (diff / norm).sqrt()
    }
}

/// The output relative error `‖o_sparse − o_dense‖₂ / ‖o_dense‖₂` over whole
/// outputs of equal length, in f64. 0 when they are equal (even both zero);
/// `+inf` when only the dense output is zero; NaN if either holds NaN.
pub fn output_relative_error(sparse: &[f32], dense: &[f32]) -> Result<f64, ArgumentError> {
    check_len("sparse", sparse.len(), dense.len(), || {
        "the same length as dense".into()
    })?;
    Ok(relative_error(sparse, dense))
}

/// [`output_relative_error`] per row: `sparse` and `dense` are
/// `[rows, width]` (`rows = out.len()`), `out[r]` the error of row `r`.
pub fn output_relative_error_rows(
    sparse: &[f32],
    dense: &[f32],
    width: usize,
    out: &mut [f64],
) -> Result<(), ArgumentError> {
    let rows = out.len();
    let n = checked_size("dense", &[rows, width])?;
    check_len("dense", dense.len(), n, || {
        format!("[rows={rows} (out's length), width={width}]")
    })?;
    check_len("sparse", sparse.len(), n, || {
        format!("[rows={rows} (out's length), width={width}]")
    })?;
    pool::for_each_row_mut(out, 1, min_rows(width), |r, o| {
        let span = r * width..(r + 1) * width;
        o[0] = relative_error(&sparse[span.clone()], &dense[span]);
    });
    Ok(())
}

/// Rows per parallel run for rows of `work` elements (about 64K elements
/// per hand-off).
fn min_rows(work: usize) -> usize {
    ((1 << 16) / work.max(1)).max(1)
}
