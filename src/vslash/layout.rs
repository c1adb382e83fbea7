//! A selection's rows of positions, and the per-block layout the engines'
//! sparse kernels take.
//!
//! **The engines' layout** (microsoft/MInference @fb56c917
//! `csrc/vertical_slash_index.cu`, `convert_vertical_slash_indexes_kernel`,
//! run with 64-query blocks and 64-key blocks: MInference's own form, the
//! one `vertical_slash_sparse_attention` calls without its `_opt`
//! extension; vLLM's `_custom_ops` and SGLang's `sgl_kernel` carry a later
//! form, [`layout_batch_into`], below). For each head and each block of 64
//! queries
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

//!
//! **The later form** ([`layout_batch_into`]; vllm-project/vllm @161944b3
//! `csrc/attention/vertical_slash_index.cu`, sgl-project/sglang @7f1f5bc1
//! `sgl-kernel/csrc/attention/vertical_slash_index.cu`: the same kernel,
//! also what MInference's `_opt` path calls). Per sequence, with `base =
//! kv − q` (causal: the queries end at the last key) or `kv` (not causal:
//! all after the keys), the rule above with `end` replaced by `base + end`,
//! and: the skip stops at the last offset (none reaching the block reads
//! one 64-key range after its queries instead of reading past the list);
//! not causal, an offset below the block's start ends the list and the
//! last column left is listed if it lies inside the keys; every range's
//! blocks are clipped to the keys; blocks at or past `q` are not written
//! (0). Why it holds: a transcription of the kernel's state machine, one
//! turn per column or offset; the refusals cover every input on which the
//! kernel reads or writes out of bounds or loops (an empty list, too
//! few rows, a column past the keys — not causal, one 64 past them with
//! more after it never advances —, a negative offset), so on the rest the
//! loop ends within `2 (nv + ns) + 8` turns. What would break it: a merge
//! in another order than the kernel's (the tests compare it with the NumPy
//! twin on random batches and with [`layout_into`] where the two agree: one
//! sequence, `q = kv`, causal — equal up to the block starts `>= L` the
//! later form clips).

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

/// The shape of a batch for [`layout_batch_into`]: `n_seqs` sequences of
/// `n_heads` heads, `nv` columns and `ns` offsets a head, `ceil(context_size
/// / 64)` query blocks a head (the rows of the outputs), and whether the
/// queries are causal over the keys (vLLM's "intra" stage) or all after them
/// ("succ" / "inter").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayoutBatch {
    /// Sequences.
    pub n_seqs: usize,
    /// Heads a sequence.
    pub n_heads: usize,
    /// Columns a head.
    pub nv: usize,
    /// Diagonal offsets a head.
    pub ns: usize,
    /// The rows of the outputs are `ceil(context_size / 64)` query blocks.
    pub context_size: usize,
    /// Queries aligned to the end of the keys and masked causally (`true`),
    /// or all placed after the keys (`false`).
    pub causal: bool,
}

impl LayoutBatch {
    /// Query blocks a head: the rows of the outputs.
    pub fn rows(&self) -> usize {
        self.context_size.div_ceil(LAYOUT_BLOCK)
    }
}

fn check_batch(
    vertical: &[i32],
    slash: &[i32],
    q_seqlens: &[i64],
    kv_seqlens: &[i64],
    batch: LayoutBatch,
) -> Result<(), ArgumentError> {
    let LayoutBatch {
        n_seqs,
        n_heads,
        nv,
        ns,
        context_size,
        ..
    } = batch;
    for (argument, k) in [("vertical", nv), ("slash", ns)] {
        if n_seqs == 0 || n_heads == 0 || k == 0 {
            return Err(ArgumentError::Invalid {
                argument,
                message: format!(
                    "{argument} must be [n_seqs, n_heads, k] with every axis at least 1 \
                     (the source reads each head's first entry), got [{n_seqs}, {n_heads}, {k}]"
                ),
            });
        }
    }
    check_len(
        "vertical",
        vertical.len(),
        checked_size("vertical", &[n_seqs, n_heads, nv])?,
        || format!("n_seqs={n_seqs}, n_heads={n_heads}, nv={nv}"),
    )?;
    check_len(
        "slash",
        slash.len(),
        checked_size("slash", &[n_seqs, n_heads, ns])?,
        || format!("n_seqs={n_seqs}, n_heads={n_heads}, ns={ns}"),
    )?;
    let max = i32::MAX as i64;
    for (argument, lens, least) in [("q_seqlens", q_seqlens, 0), ("kv_seqlens", kv_seqlens, 1)] {
        check_len(argument, lens.len(), n_seqs, || format!("n_seqs={n_seqs}"))?;
        if let Some(i) = lens.iter().position(|&x| x < least || x > max) {
            return Err(ArgumentError::OutOfRange {
                argument,
                index: i,
                message: format!("{argument}[{i}] = {} is outside [{least}, {max}]", lens[i]),
            });
        }
    }
    let rows = batch.rows();
    if context_size as u64 > max as u64 {
        return Err(ArgumentError::Invalid {
            argument: "context_size",
            message: format!("context_size = {context_size} is above {max}"),
        });
    }
    if let Some(i) = q_seqlens
        .iter()
        .position(|&q| (q as usize).div_ceil(LAYOUT_BLOCK) > rows)
    {
        return Err(ArgumentError::Invalid {
            argument: "context_size",
            message: format!(
                "context_size = {context_size} gives {rows} query blocks, but q_seqlens[{i}] = {} \
                 needs {} (the source writes past the rows otherwise)",
                q_seqlens[i],
                (q_seqlens[i] as usize).div_ceil(LAYOUT_BLOCK)
            ),
        });
    }
    for (i, &c) in vertical.iter().enumerate() {
        let kv = kv_seqlens[i / (n_heads * nv)];
        if c < 0 || c as i64 >= kv {
            return Err(ArgumentError::OutOfRange {
                argument: "vertical",
                index: i,
                message: format!(
                    "vertical[{i}] = {c} is outside [0, kv_seqlen = {kv}) of its sequence \
                     (the source can loop forever on a column past the keys)"
                ),
            });
        }
    }
    if let Some(i) = slash.iter().position(|&o| o < 0) {
        return Err(ArgumentError::OutOfRange {
            argument: "slash",
            index: i,
            message: format!("slash[{i}] = {} is negative", slash[i]),
        });
    }
    Ok(())
}

/// One query block `[start, start + 64)` of one head of one sequence, as the
/// later `convert_vertical_slash_indexes_kernel` runs it (see
/// [`layout_batch_into`]); `v` ascending, `s` descending. Returns the
/// blocks and columns written.
fn batch_row(
    v: &[i64],
    s: &[i64],
    (q, kv, causal): (i64, i64, bool),
    start: i64,
    offsets: &mut [i32],
    columns: &mut [i32],
) -> Result<(usize, usize), ArgumentError> {
    let b = LAYOUT_BLOCK as i64;
    // Causal: the block's last query sits at key `kv − q + end − 1`; not
    // causal: every query is after the keys, as if at `kv + i`.
    let reach = if causal { kv - q } else { kv } + start + b;
    let (mut n_blocks, mut n_cols) = (0usize, 0usize);
    // The source's `save_blocks`: a range's 64-key blocks by first key,
    // clipped to the keys (a range starting at or past them saves none).
    let mut save = |lo: i64, hi: i64, n: &mut usize| {
        let mut x = lo;
        while x < hi.min(kv) && lo < kv {
            offsets[*n] = x as i32;
            *n += 1;
            x += b;
        }
    };
    // The first offset below the reach, else the last one.
    let mut si = 1usize;
    let mut o = s[0];
    while o >= reach && si < s.len() {
        o = s[si];
        si += 1;
    }
    let (mut lo, mut hi) = if o > reach {
        // No offset reaches the block: one 64-key range past it.
        let first = if causal { reach } else { kv };
        (first, first + b)
    } else {
        let e = (reach - o).max(b);
        (e - b, e)
    };
    let past = reach + b; // the column read once the list is spent
    let (mut vi, mut col) = (1usize, v[0]);
    let mut finished = false;
    // Each turn takes a column or an offset, or ends the list: the loop
    // ends within this many turns on checked input (a bound, not a guess).
    for _ in 0..2 * (v.len() + s.len()) + 8 {
        if col < hi {
            if col < lo {
                columns[n_cols] = col as i32;
                n_cols += 1;
            }
            col = if vi < v.len() {
                vi += 1;
                v[vi - 1]
            } else {
                past
            };
            continue;
        }
        if si < s.len() && (causal || s[si] >= start) {
            let e = (reach - s[si]).max(b);
            si += 1;
            if !finished {
                if e > hi + b {
                    save(lo, hi, &mut n_blocks);
                    (lo, hi) = (e - b, e);
                } else if e > hi {
                    hi += b;
                }
            }
            continue;
        }
        if vi == v.len() || (causal && col > lo) {
            // Not causal: the last column, if one is left, is read too.
            if !causal && vi == v.len() && col < kv {
                columns[n_cols] = col as i32;
                n_cols += 1;
            }
            save(lo, hi, &mut n_blocks);
            return Ok((n_blocks, n_cols));
        }
        if causal {
            (lo, hi) = (reach, reach + b);
        } else {
            save(lo, hi, &mut n_blocks);
            (lo, hi) = (kv, kv + b);
        }
        finished = true;
    }
    Err(ArgumentError::Invalid {
        argument: "vertical",
        message: "convert_vertical_slash_indexes would not end on this input".into(),
    })
}

/// The later form of the engines' layout — vLLM's
/// `_custom_ops.convert_vertical_slash_indexes` and SGLang's
/// `sgl_kernel.sparse_flash_attn.convert_vertical_slash_indexes` (the same
/// kernel; see the module docs of the Python binding and
/// docs/vertical-slash.md): a batch of sequences, each with its own query
/// and key lengths, queries aligned to the end of the keys (`causal`) or
/// after them, ranges clipped to the keys.
///
/// `vertical` `[n_seqs, n_heads, nv]` (columns, any order: sorted here
/// ascending) and `slash` `[n_seqs, n_heads, ns]` (offsets, sorted here
/// descending, as vLLM's caller sorts both); outputs `block_count`
/// `[n_seqs, n_heads, rows]`, `block_offset` `[.., rows, ns]`,
/// `column_count` `[.., rows]`, `column_index` `[.., rows, nv]` with `rows =
/// ceil(context_size / 64)`. A query block at or past its sequence's
/// `q_seqlen` is not written by the source: its row is all 0 here, as the
/// callers' `torch.zeros` leaves it; so are unused slots.
///
/// # Errors
/// An axis of 0 (`vertical`, `slash`); a buffer of another length (named);
/// a length outside `[0, 2³¹)` (`q_seqlens`; `kv_seqlens` at least 1); fewer
/// rows than a sequence's query blocks (`context_size`: the source writes
/// past them); a column outside `[0, kv_seqlen)` of its sequence
/// (`vertical`: one past the keys can make the source loop forever); a
/// negative offset (`slash`). Everything is checked before anything is
/// written: `batch_row`'s own refusal, its turn bound, is a guard that
/// checked input never reaches (the module docs), so no refusal comes after
/// a row is written into a caller's `out=`.
#[allow(clippy::too_many_arguments)]
pub fn layout_batch_into(
    vertical: &[i32],
    slash: &[i32],
    q_seqlens: &[i64],
    kv_seqlens: &[i64],
    batch: LayoutBatch,
    block_count: &mut [i32],
    block_offset: &mut [i32],
    column_count: &mut [i32],
    column_index: &mut [i32],
) -> Result<(), ArgumentError> {
    check_batch(vertical, slash, q_seqlens, kv_seqlens, batch)?;
    let LayoutBatch {
        n_seqs,
        n_heads,
        nv,
        ns,
        causal,
        ..
    } = batch;
    let rows = batch.rows();
    let counts = checked_size("block_count", &[n_seqs, n_heads, rows])?;
    let offs = checked_size("block_offset", &[n_seqs, n_heads, rows, ns])?;
    let cols = checked_size("column_index", &[n_seqs, n_heads, rows, nv])?;
    for (argument, got, want) in [
        ("block_count", block_count.len(), counts),
        ("block_offset", block_offset.len(), offs),
        ("column_count", column_count.len(), counts),
        ("column_index", column_index.len(), cols),
    ] {
        check_len(argument, got, want, || {
            format!("n_seqs={n_seqs}, n_heads={n_heads}, rows={rows}, nv={nv}, ns={ns}")
        })?;
    }
    let (mut v, mut s) = (Vec::with_capacity(nv), Vec::with_capacity(ns));
    for head in 0..n_seqs * n_heads {
        let seq = head / n_heads;
        let (q, kv) = (q_seqlens[seq], kv_seqlens[seq]);
        v.clear();
        v.extend(vertical[head * nv..][..nv].iter().map(|&x| x as i64));
        v.sort_unstable();
        s.clear();
        s.extend(slash[head * ns..][..ns].iter().map(|&x| x as i64));
        s.sort_unstable_by(|a, b| b.cmp(a));
        for m in 0..rows {
            let row = head * rows + m;
            let offsets = &mut block_offset[row * ns..][..ns];
            let columns = &mut column_index[row * nv..][..nv];
            offsets.fill(0);
            columns.fill(0);
            let start = (m * LAYOUT_BLOCK) as i64;
            let (nb, nc) = if start < q {
                batch_row(&v, &s, (q, kv, causal), start, offsets, columns)?
            } else {
                (0, 0)
            };
            block_count[row] = nb as i32;
            column_count[row] = nc as i32;
        }
    }
    Ok(())
}
