//! A selection's rows of positions, and the per-block layout the engines'
//! sparse kernels take.
//!
//! **The engines' layout** (microsoft/MInference @fb56c917
//! `csrc/vertical_slash_index.cu`, `convert_vertical_slash_indexes_kernel`,
//! run with 64-query blocks and 64-key blocks: MInference's own form, the
//! one `vertical_slash_sparse_attention` calls without its `_opt`
//! extension; vLLM's `_custom_ops` and SGLang's `sgl_kernel` carry a later
//! form, with per-sequence query / key lengths and a `causal` flag, which
//! clips the ranges to the keys and is not reproduced here). For each head
//! and each block of 64 queries
//! `[start, end)`, the columns ascending and the offsets descending:
//!
//! - offsets `o >= end` are skipped (no query of the block reaches them);
//! - each remaining offset covers the keys `[end − o − 64, end − o)`,
//!   clamped to `[0, 64)` when `end − o < 64`; the ranges, in order, are
//!   merged: an offset whose range end lies within 64 keys past the current
//!   range extends it by one 64-key block, a farther one closes it and
//!   opens its own; each closed range is listed as 64-key blocks by their
//!   first key (`block_offset`, `block_count` of them);
//! - a column below the current range's start is listed (`column_index`,
//!   `column_count`); one inside a range is dropped (the block reads it);
//!   columns at or past the last range's end are never reached.
//!
//! Unused slots are 0, as the source's `torch.zeros` leaves them. The
//! sparse kernel then reads, for query `p`, the listed blocks and columns
//! up to `p` (it is causal): a superset of the row's selection
//! ([`rows_into`]), exactly when the main diagonal (offset 0) is selected,
//! as the rule always does: with no offset below a block's end the kernel
//! reads past its list (refused here: `slash` must hold an offset below
//! 64), and with the nearest offset `o_min > 0` the columns in `[end −
//! o_min, end)` are dropped.
//!
//! Issue #42 cites microsoft/MInference#165 for this conversion breaking
//! before (the thread was not in the stored issue index; not read here);
//! the tests pin this layout on a hand-worked example, compare it with the
//! NumPy twin written from the CUDA source, and check the superset property
//! on random selections.

use crate::error::{check_len, checked_size, ArgumentError};

/// Queries and keys per block of the engines' layout (`BLOCK_SIZE_M =
/// BLOCK_SIZE_N = 64`, asserted by the source).
pub const LAYOUT_BLOCK: usize = 64;

fn check_ids(argument: &'static str, ids: &[i32], seq_len: usize) -> Result<(), ArgumentError> {
    if let Some(i) = ids.iter().position(|&x| x < 0 || x as usize >= seq_len) {
        return Err(ArgumentError::OutOfRange {
            argument,
            index: i,
            message: format!(
                "{argument}[{i}] = {} is outside [0, seq_len = {seq_len})",
                ids[i]
            ),
        });
    }
    Ok(())
}

fn check_sets(
    vertical: &[i32],
    slash: &[i32],
    n_heads: usize,
    seq_len: usize,
) -> Result<(usize, usize), ArgumentError> {
    if n_heads == 0 || seq_len == 0 {
        let argument = if n_heads == 0 { "n_heads" } else { "seq_len" };
        return Err(ArgumentError::Invalid {
            argument,
            message: format!("{argument} must be at least 1"),
        });
    }
    for (argument, a) in [("vertical", vertical), ("slash", slash)] {
        if a.is_empty() || a.len() % n_heads != 0 {
            return Err(ArgumentError::Invalid {
                argument,
                message: format!(
                    "{argument} must hold n_heads ({n_heads}) non-empty rows, has {} entries",
                    a.len()
                ),
            });
        }
        check_ids(argument, a, seq_len)?;
    }
    Ok((vertical.len() / n_heads, slash.len() / n_heads))
}

/// Every query position's selection: `out` `[n_heads, n_positions, nv +
/// ns]`, row `(h, j)` the positions query `positions[j]` reads — the
/// columns `c <= p` of `vertical[h]` and the keys `p − o >= 0` of the
/// offsets `slash[h]` — ascending, distinct, `-1` padded.
///
/// # Errors
/// Zero heads or length, `vertical` / `slash` not `n_heads` non-empty rows
/// or holding an id outside `[0, seq_len)`, a position outside it
/// (`positions`), `out` of another size (`out`).
pub fn rows_into(
    vertical: &[i32],
    slash: &[i32],
    n_heads: usize,
    seq_len: usize,
    positions: &[i64],
    out: &mut [i32],
) -> Result<(), ArgumentError> {
    let (nv, ns) = check_sets(vertical, slash, n_heads, seq_len)?;
    if let Some(i) = positions
        .iter()
        .position(|&p| p < 0 || p as u64 >= seq_len as u64)
    {
        return Err(ArgumentError::OutOfRange {
            argument: "positions",
            index: i,
            message: format!(
                "positions[{i}] = {} is outside [0, seq_len = {seq_len})",
                positions[i]
            ),
        });
    }
    let width = nv + ns;
    let want = checked_size("out", &[n_heads, positions.len(), width])?;
    if out.len() != want {
        return Err(ArgumentError::OutputSize {
            argument: "out",
            expected: want,
            actual: out.len(),
            shape: format!(
                "[n_heads={n_heads}, n_positions={}, nv + ns={width}]",
                positions.len()
            ),
        });
    }
    let mut row = Vec::with_capacity(width);
    for h in 0..n_heads {
        let (v, s) = (
            &vertical[h * nv..(h + 1) * nv],
            &slash[h * ns..(h + 1) * ns],
        );
        for (j, &p) in positions.iter().enumerate() {
            let p = p as i32;
            row.clear();
            row.extend(v.iter().copied().filter(|&c| c <= p));
            row.extend(s.iter().filter(|&&o| o <= p).map(|&o| p - o));
            row.sort_unstable();
            row.dedup();
            let dst = &mut out[(h * positions.len() + j) * width..][..width];
            dst[..row.len()].copy_from_slice(&row);
            dst[row.len()..].fill(-1);
        }
    }
    Ok(())
}

/// The engines' layout of a selection (see the module docs): for `nb =
/// ⌈L / 64⌉` query blocks, `block_count` `[n_heads, nb]`, `block_offset`
/// `[n_heads, nb, ns]`, `column_count` `[n_heads, nb]`, `column_index`
/// `[n_heads, nb, nv]`, from `vertical` `[n_heads, nv]` and `slash`
/// `[n_heads, ns]` in any order (sorted here, as the engines sort them).
///
/// # Errors
/// As [`rows_into`]; a head whose offsets are all 64 or more (`slash`: the
/// source reads past its list); an output of another size (named).
#[allow(clippy::too_many_arguments)]
pub fn layout_into(
    vertical: &[i32],
    slash: &[i32],
    n_heads: usize,
    seq_len: usize,
    block_count: &mut [i32],
    block_offset: &mut [i32],
    column_count: &mut [i32],
    column_index: &mut [i32],
) -> Result<(), ArgumentError> {
    let (nv, ns) = check_sets(vertical, slash, n_heads, seq_len)?;
    for h in 0..n_heads {
        let nearest = slash[h * ns..(h + 1) * ns]
            .iter()
            .min()
            .copied()
            .unwrap_or(i32::MAX);
        if nearest as usize >= LAYOUT_BLOCK {
            return Err(ArgumentError::Invalid {
                argument: "slash",
                message: format!(
                    "head {h}'s nearest offset is {nearest}: convert_vertical_slash_indexes \
                     needs one below {LAYOUT_BLOCK} (it reads past the list otherwise)"
                ),
            });
        }
    }
    let nb = seq_len.div_ceil(LAYOUT_BLOCK);
    let counts = checked_size("block_count", &[n_heads, nb])?;
    let offs = checked_size("block_offset", &[n_heads, nb, ns])?;
    let cols = checked_size("column_index", &[n_heads, nb, nv])?;
    for (argument, got, want) in [
        ("block_count", block_count.len(), counts),
        ("block_offset", block_offset.len(), offs),
        ("column_count", column_count.len(), counts),
        ("column_index", column_index.len(), cols),
    ] {
        check_len(argument, got, want, || {
            format!("n_heads={n_heads}, blocks={nb}, nv={nv}, ns={ns}")
        })?;
    }
    let b = LAYOUT_BLOCK as i64;
    for h in 0..n_heads {
        let mut v: Vec<i64> = vertical[h * nv..(h + 1) * nv]
            .iter()
            .map(|&x| x as i64)
            .collect();
        let mut s: Vec<i64> = slash[h * ns..(h + 1) * ns]
            .iter()
            .map(|&x| x as i64)
            .collect();
        v.sort_unstable();
        s.sort_unstable_by(|a, b| b.cmp(a));
        for m in 0..nb {
            let end = (m as i64 + 1) * b;
            let row = h * nb + m;
            let offsets = &mut block_offset[row * ns..(row + 1) * ns];
            let columns = &mut column_index[row * nv..(row + 1) * nv];
            offsets.fill(0);
            columns.fill(0);
            let (mut n_blocks, mut n_cols) = (0usize, 0usize);
            let mut save = |lo: i64, hi: i64, n: &mut usize| {
                let mut x = lo;
                while x < hi {
                    offsets[*n] = x as i32;
                    *n += 1;
                    x += b;
                }
            };
            // The first offset below the block's end (one exists: checked).
            let mut si = s.iter().position(|&o| o < end).unwrap_or(ns);
            let first = (end - s[si]).max(b);
            si += 1;
            let (mut lo, mut hi) = (first - b, first);
            let mut vi = 0usize;
            let mut col = v[0];
            loop {
                if col < hi {
                    if col < lo {
                        columns[n_cols] = col as i32;
                        n_cols += 1;
                    }
                    vi += 1;
                    col = if vi < nv { v[vi] } else { end + b };
                } else {
                    if si >= ns {
                        save(lo, hi, &mut n_blocks);
                        break;
                    }
                    let e = (end - s[si]).max(b);
                    si += 1;
                    if e > hi + b {
                        save(lo, hi, &mut n_blocks);
                        lo = e - b;
                        hi = e;
                    } else if e > hi {
                        hi += b;
                    }
                }
            }
            block_count[row] = n_blocks as i32;
            column_count[row] = n_cols as i32;
        }
    }
    Ok(())
}
