//! The witnesses of a row, and their merge into the learned rows (copied,
//! or in place in the serving buffer).

use super::scan::{copy_occupancy, occupancy, Row};
use super::{WitnessError, MAX_TOPOLOGY_SEGMENTS};
use crate::pool;
use crate::simd::Isa;

fn check_rows(learned_len: usize, topk: usize, rows: usize) -> Result<(), WitnessError> {
    if topk.checked_mul(rows) != Some(learned_len) {
        return Err(WitnessError::RowsMismatch {
            learned_len,
            topk,
            rows,
        });
    }
    Ok(())
}

/// `out` holds `rows` rows of `width` slots.
fn check_out(out_len: usize, rows: usize, width: usize) -> Result<(), WitnessError> {
    if rows.checked_mul(width) != Some(out_len) {
        return Err(WitnessError::OutMismatch {
            out_len,
            rows,
            width,
        });
    }
    Ok(())
}

/// Writes row `row`'s witnesses into `out` (`num_segments` slots, slot `s`
/// holding `e_s` for a missing segment `s < S_eff` and `-1` otherwise).
fn witness_row(row: &[i32], context_len: i32, num_segments: usize, out: &mut [i32], isa: Isa) {
    out.fill(-1);
    let Some(g) = Row::new(context_len, num_segments) else {
        return;
    };
    if num_segments <= MAX_TOPOLOGY_SEGMENTS {
        let mut missing = !occupancy(row, &g, isa) & g.partition_mask();
        while missing != 0 {
            let s = missing.trailing_zeros() as u64;
            out[s as usize] = g.edge(s);
            missing &= missing - 1;
        }
    } else {
        let mut occupied = vec![false; g.s_eff as usize];
        for &x in row {
            if x >= 0 {
                if let Some(o) = occupied.get_mut(g.segment_exact(x) as usize) {
                    *o = true;
                }
            }
        }
        for (s, o) in occupied.iter().enumerate() {
            if !o {
                out[s] = g.edge(s as u64);
            }
        }
    }
}

/// The witnesses of every learned row: row-major `[rows, num_segments]`,
/// slot `s` holding the left edge `e_s` of segment `s` when the row does not
/// occupy it, `-1` when it does or when `s >= S_eff`. A row of length `<= 0`
/// gets none.
///
/// Accepts any positive segment count (above 64 it takes an exact integer
/// path); refuses 0 and a `learned` that is not `topk × context_lens.len()`.
pub fn topology_witness_indices(
    learned: &[i32],
    topk: usize,
    context_lens: &[i32],
    num_segments: usize,
) -> Result<Vec<i32>, WitnessError> {
    // The original's order of refusals: rows, then the segment count.
    check_rows(learned.len(), topk, context_lens.len())?;
    if num_segments == 0 {
        return Err(WitnessError::SegmentsOutOfRange { num_segments });
    }
    let len = context_lens
        .len()
        .checked_mul(num_segments)
        .ok_or(WitnessError::SegmentsOutOfRange { num_segments })?;
    let mut out = vec![-1; len];
    topology_witness_indices_into(learned, topk, context_lens, num_segments, &mut out)?;
    Ok(out)
}

/// [`topology_witness_indices`] into a caller's `[rows, num_segments]`
/// buffer (a serving loop reuses it). `out.len()` must be
/// `rows * num_segments` (else `OutMismatch`, argument `out`).
pub fn topology_witness_indices_into(
    learned: &[i32],
    topk: usize,
    context_lens: &[i32],
    num_segments: usize,
    out: &mut [i32],
) -> Result<(), WitnessError> {
    // The original's order of refusals: rows, then the segment count.
    let rows = context_lens.len();
    check_rows(learned.len(), topk, rows)?;
    if num_segments == 0 {
        return Err(WitnessError::SegmentsOutOfRange { num_segments });
    }
    check_out(out.len(), rows, num_segments)?;
    let isa = Isa::best();
    pool::for_each_row_mut(out, num_segments, pool::min_rows(topk), |r, out_row| {
        let row = &learned[r * topk..(r + 1) * topk];
        witness_row(row, context_lens[r], num_segments, out_row, isa);
    });
    Ok(())
}

/// Merges witnesses into one row: occupancy from the whole learned row,
/// witnesses in ascending segment order into slots `keep..keep + budget`
/// of `dst`. The learned row is `src`, copied into `dst` in the same pass
/// as its occupancy scan (apply), or `dst` itself when `src` is `None`
/// (scatter, in place). Requires `1 <= num_segments <= 64`,
/// `keep + budget <= dst.len()` and, with `src`, `src.len() == dst.len()`.
#[allow(clippy::too_many_arguments)]
fn merge_row(
    src: Option<&[i32]>,
    dst: &mut [i32],
    context_len: i32,
    num_segments: usize,
    keep: usize,
    budget: usize,
    isa: Isa,
) {
    let Some(g) = Row::new(context_len, num_segments) else {
        if let Some(src) = src {
            dst.copy_from_slice(src);
        }
        return;
    };
    let occupied = match src {
        Some(src) => copy_occupancy(src, dst, &g, isa),
        None => occupancy(dst, &g, isa),
    };
    let missing = !occupied & g.partition_mask();
    write_witnesses(&mut dst[keep..keep + budget], missing, &g);
}

/// Writes the edges of the `missing` segments, ascending, into `slots`
/// until either runs out; slots past the last witness are left as they are.
fn write_witnesses(slots: &mut [i32], mut missing: u64, g: &Row) {
    for slot in slots {
        if missing == 0 {
            break;
        }
        let s = missing.trailing_zeros() as u64;
        *slot = g.edge(s);
        missing &= missing - 1;
    }
}

/// Checks a merge's arguments; returns the replacement budget `B`.
fn check_merge(
    learned_len: usize,
    topk: usize,
    rows: usize,
    learned_keep: usize,
    num_segments: usize,
    max_replacements: usize,
) -> Result<usize, WitnessError> {
    check_rows(learned_len, topk, rows)?;
    if num_segments == 0 || num_segments > MAX_TOPOLOGY_SEGMENTS {
        return Err(WitnessError::SegmentsOutOfRange { num_segments });
    }
    if learned_keep > topk {
        return Err(WitnessError::LearnedKeepOutOfRange { learned_keep, topk });
    }
    Ok(max_replacements.min(topk - learned_keep))
}

/// The learned rows with witnesses merged in: slots `[0, learned_keep)` kept
/// bit for bit, witnesses in ascending segment order written to slots
/// `learned_keep, learned_keep + 1, …` up to
/// `B = min(max_replacements, topk - learned_keep)`, the rest dropped.
///
/// Refuses 0 or more than 64 segments, `learned_keep > topk`, and a `learned`
/// that is not `topk × context_lens.len()`. `B = 0` or zero rows returns the
/// learned rows unchanged.
pub fn apply_topology_witnesses(
    learned: &[i32],
    topk: usize,
    context_lens: &[i32],
    learned_keep: usize,
    num_segments: usize,
    max_replacements: usize,
) -> Result<Vec<i32>, WitnessError> {
    check_merge(
        learned.len(),
        topk,
        context_lens.len(),
        learned_keep,
        num_segments,
        max_replacements,
    )?;
    let mut out = vec![0; learned.len()];
    apply_topology_witnesses_into(
        learned,
        topk,
        context_lens,
        learned_keep,
        num_segments,
        max_replacements,
        &mut out,
    )?;
    Ok(out)
}

/// [`apply_topology_witnesses`] into a caller's buffer of `learned.len()`
/// entries (a serving loop reuses it). Every check runs before `out` is
/// written, so a refused call leaves it untouched.
pub fn apply_topology_witnesses_into(
    learned: &[i32],
    topk: usize,
    context_lens: &[i32],
    learned_keep: usize,
    num_segments: usize,
    max_replacements: usize,
    out: &mut [i32],
) -> Result<(), WitnessError> {
    let budget = check_merge(
        learned.len(),
        topk,
        context_lens.len(),
        learned_keep,
        num_segments,
        max_replacements,
    )?;
    check_out(out.len(), context_lens.len(), topk)?;
    if budget == 0 {
        out.copy_from_slice(learned);
        return Ok(());
    }
    let isa = Isa::best();
    pool::for_each_row_mut(out, topk, pool::min_rows(2 * topk), |r, out_row| {
        let src = &learned[r * topk..(r + 1) * topk];
        let (len, keep) = (context_lens[r], learned_keep);
        merge_row(Some(src), out_row, len, num_segments, keep, budget, isa);
    });
    Ok(())
}

/// The serving entry point: merges witnesses into `topk_indices` in place,
/// with `keep = topk - S` (saturating) and `max_replacements = S`.
///
/// Reads each row's occupancy and writes only its witnesses into that row's
/// reserved tail; nothing else is written, and no copy of the buffer is made.
/// `num_segments = 0` is the off switch: it returns `Ok` before any other
/// check. Otherwise every check runs before anything is written, so a
/// refused call leaves the buffer untouched.
pub fn scatter_topology_witnesses(
    topk_indices: &mut [i32],
    topk: usize,
    context_lens: &[i32],
    num_segments: usize,
) -> Result<(), WitnessError> {
    if num_segments == 0 {
        return Ok(());
    }
    let keep = topk.saturating_sub(num_segments);
    let budget = check_merge(
        topk_indices.len(),
        topk,
        context_lens.len(),
        keep,
        num_segments,
        num_segments,
    )?;
    if budget == 0 {
        return Ok(());
    }
    let isa = Isa::best();
    pool::for_each_row_mut(topk_indices, topk, pool::min_rows(topk), |r, row| {
        merge_row(None, row, context_lens[r], num_segments, keep, budget, isa);
    });
    Ok(())
}

/// Runs `witness.scan` at `isa`, plain and fused with the copy: the reach
/// test's probe.
#[cfg(test)]
pub(super) fn probe(isa: Isa) {
    let row: Vec<i32> = (0..40).map(|i| i * 3).collect();
    let mut out = vec![0; 8];
    witness_row(&row, 240, 8, &mut out, isa);
    assert_eq!(out, [-1, -1, -1, -1, 120, 150, 180, 210]);
    let mut dst = vec![0; 40];
    merge_row(Some(&row), &mut dst, 240, 8, 36, 4, isa);
    assert_eq!(dst[..36], row[..36]);
    assert_eq!(dst[36..], [120, 150, 180, 210]);
}
