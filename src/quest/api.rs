//! The entry points over whole sequences: scores and page sets, one
//! sequence or a packed batch.

use super::score::{check_shapes, group_mean, grouped, per_head};
use super::select::{reads_all, select_row};
use super::{pages_of, width, Layout, Variant};
use crate::error::{check_len, checked_size, ArgumentError};
use crate::keys::Encoded;
use crate::simd::Isa;

/// The queries decoded to float32 (`[.., n_q_heads, d]`, any key format).
fn decoded(q: Encoded<'_>) -> Vec<f32> {
    let mut v = vec![0.0f32; q.len()];
    q.decode(0, &mut v);
    v
}

/// The per-query-head scores of one sequence's pages (Quest's kernel path
/// and evaluation script score alike): `out` `[n_q_heads, n_pages]` for `q`
/// `[n_q_heads, d]` and bounds `[n_pages, n_kv_heads, d]`; query head `j`
/// reads KV head `j / (n_q_heads / n_kv_heads)`.
///
/// # Errors
/// A zero in the layout, `q` heads not a positive multiple of the KV heads
/// or not `n_q_heads × d` (`q`), bounds not whole pages or of different
/// sizes (`kmin`), `out` of another size (`out`).
pub fn scores_into(
    q: Encoded<'_>,
    n_q_heads: usize,
    kmin: &[f32],
    kmax: &[f32],
    layout: Layout,
    out: &mut [f32],
) -> Result<(), ArgumentError> {
    let n_pages = check_shapes(q.len(), n_q_heads, kmin, kmax, layout)?;
    let want = checked_size("out", &[n_q_heads, n_pages])?;
    check_out(out.len(), want, || {
        format!("[n_q_heads={n_q_heads}, n_pages={n_pages}]")
    })?;
    per_head(Isa::best(), &decoded(q), n_q_heads, kmin, kmax, layout, out);
    Ok(())
}

/// SGLang's scores of one sequence's pages: the query heads of each KV
/// head's group averaged (`score`'s `group_mean`, rounded to
/// `q`'s own format), each page scored against every KV head's bounds and
/// the heads summed: `out` `[n_pages]`.
///
/// # Errors
/// As [`scores_into`].
pub fn grouped_scores_into(
    q: Encoded<'_>,
    n_q_heads: usize,
    kmin: &[f32],
    kmax: &[f32],
    layout: Layout,
    out: &mut [f32],
) -> Result<(), ArgumentError> {
    let n_pages = check_shapes(q.len(), n_q_heads, kmin, kmax, layout)?;
    check_out(out.len(), n_pages, || format!("[n_pages={n_pages}]"))?;
    let m = group_mean(&decoded(q), n_q_heads, layout, q.format());
    grouped(Isa::best(), &m, kmin, kmax, layout, out);
    Ok(())
}

fn check_out(got: usize, want: usize, shape: impl FnOnce() -> String) -> Result<(), ArgumentError> {
    if got != want {
        return Err(ArgumentError::OutputSize {
            argument: "out",
            expected: want,
            actual: got,
            shape: shape(),
        });
    }
    Ok(())
}

/// `page_budget` at least 1 page: [`select_into`]'s first check, which the
/// binding makes before it sizes an output by the budget, so that a refused
/// budget is named as itself, not as the output's shape.
pub fn check_budget(budget: usize) -> Result<(), ArgumentError> {
    if budget == 0 {
        return Err(ArgumentError::Invalid {
            argument: "page_budget",
            message: "page_budget must be at least 1 page".into(),
        });
    }
    Ok(())
}

/// The page sets of a packed batch of sequences, each decoding one query.
///
/// `q` is `[n_seqs, n_q_heads, d]`, sequence `s` holds `seq_lens[s]`
/// tokens and its `⌈seq_lens[s] / page_size⌉` pages' bounds follow the
/// previous sequence's in `kmin` / `kmax` (`[Σ n_pages, n_kv_heads, d]`, as
/// [`super::bounds_into`] writes them). `out` is `[n_seqs, rows, width]`,
/// `rows = n_q_heads` for the per-head variants and 1 for SGLang's, `width
/// =` [`width`]`(variant, budget)`: each row's pages ascending, then `-1`.
/// A sequence whose every page is read is not scored.
///
/// # Errors
/// `budget` 0 (`page_budget`), a sequence with no token (`seq_lens`), bounds
/// that are not the sequences' pages (`kmin`), and as [`scores_into`].
/// Nothing is written before every check has passed.
#[allow(clippy::too_many_arguments)]
pub fn select_into(
    q: Encoded<'_>,
    n_q_heads: usize,
    kmin: &[f32],
    kmax: &[f32],
    seq_lens: &[usize],
    layout: Layout,
    budget: usize,
    variant: Variant,
    out: &mut [i32],
) -> Result<(), ArgumentError> {
    check_budget(budget)?;
    let n_seqs = seq_lens.len();
    let per_seq = checked_size("q", &[n_q_heads, layout.d])?;
    check_len("q", q.len(), checked_size("q", &[n_seqs, per_seq])?, || {
        format!("[n_seqs={n_seqs}, n_q_heads={n_q_heads}, d={}]", layout.d)
    })?;
    if let Some(s) = seq_lens.iter().position(|&l| l == 0) {
        return Err(ArgumentError::OutOfRange {
            argument: "seq_lens",
            index: s,
            message: format!("seq_lens[{s}] = 0: a decoding query has at least its own token"),
        });
    }
    let n_pages: usize = seq_lens
        .iter()
        .map(|&l| pages_of(l, layout.page_size))
        .sum();
    let total = check_shapes(per_seq, n_q_heads, kmin, kmax, layout)?;
    if total != n_pages {
        return Err(ArgumentError::Invalid {
            argument: "kmin",
            message: format!(
                "the bounds hold {total} pages, but the sequences (seq_lens) have {n_pages} pages \
                 of {}",
                layout.page_size
            ),
        });
    }
    let rows = match variant {
        Variant::Sglang { .. } => 1,
        _ => n_q_heads,
    };
    let w = width(variant, budget);
    let want = checked_size("out", &[n_seqs, rows, w])?;
    check_out(out.len(), want, || {
        format!("[n_seqs={n_seqs}, rows={rows}, width={w}]")
    })?;
    let fmt = q.format();
    let q = decoded(q);
    let (isa, row) = (Isa::best(), layout.row());
    let mut at = 0;
    let mut scores = Vec::new();
    for (s, &len) in seq_lens.iter().enumerate() {
        let np = pages_of(len, layout.page_size);
        let (lo, hi) = (
            &kmin[at * row..(at + np) * row],
            &kmax[at * row..(at + np) * row],
        );
        let qs = &q[s * per_seq..(s + 1) * per_seq];
        let dest = &mut out[s * rows * w..(s + 1) * rows * w];
        let all = reads_all(variant, budget, np, len, layout.page_size);
        scores.clear();
        scores.resize(rows * np, 0.0f32);
        if !all {
            match variant {
                Variant::Sglang { .. } => {
                    let m = group_mean(qs, n_q_heads, layout, fmt);
                    grouped(isa, &m, lo, hi, layout, &mut scores);
                }
                _ => per_head(isa, qs, n_q_heads, lo, hi, layout, &mut scores),
            }
        }
        for r in 0..rows {
            let sc = &scores[r * np..(r + 1) * np];
            select_row(
                sc,
                np,
                len,
                layout.page_size,
                budget,
                variant,
                &mut dest[r * w..(r + 1) * w],
            );
        }
        at += np;
    }
    Ok(())
}
