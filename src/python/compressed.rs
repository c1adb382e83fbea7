//! DeepSeek-V4's attention sets, vLLM's combined index rows, the entry →
//! tokens map and GLM-5-Next's pool expansion (all raise `SelectionError`).

use numpy::PyUntypedArray;
use pyo3::prelude::*;

use super::args::{ndarrays, positions, positions_along, query_positions, Broadcast, Queries};
use super::args::{Obj, Opt, Out, I32, I32_MAX, S};
use super::errors::refuse;
use crate::compressed::{self, CombineInputs};

/// A row width past int32 (`what` computes it), refused naming `argument`.
fn too_wide(argument: &str, what: &str) -> PyErr {
    refuse(
        S,
        argument,
        format!("{what} is too large: the rows would be wider than {I32_MAX}"),
    )
}

/// Runs `core` into `out` (int32 `shape`, checked against `inputs`).
fn run<'py>(
    py: Python<'py>,
    out: Opt<'_, 'py>,
    shape: &[usize],
    inputs: &[&Bound<'py, PyUntypedArray>],
    core: impl FnOnce(&mut [i32]) -> Result<(), crate::ArgumentError> + Send,
) -> PyResult<I32<'py>> {
    let work = shape.iter().product();
    S.output::<i32>(py, out, shape, inputs)?.run(work, core)
}

/// Each query's sliding window: DeepSeek-V4's raw-token part of the attention set.
///
/// The positions ``[max(0, p - W + 1), p]`` (the query included) ascending, then -1, as
/// transformers' sliding-window mask (``kv_idx > q_idx - sliding_window``) admits them.
///
/// Parameters
/// ----------
/// query_pos : array_like of int, [n_queries], or int
///     Each query's token position ``p``; one integer for one query.
/// window_size : int
///     ``W``, the window's tokens (128 in DeepSeek-V4's configs).
/// out : ndarray of int32, optional
///     Written and returned (the shape of the result): C-contiguous, writeable, aligned, native
///     byte order, not overlapping any input (else refused, nothing written).
///
/// Returns
/// -------
/// ndarray of int32, [n_queries, window_size]
///     Each query's window, ascending, then -1.
///
/// Raises
/// ------
/// SelectionError
///     (a ValueError; ``.argument`` names the argument) on a negative position or count, or a row
///     width past int32.
///     Nothing is written.
/// TypeError
///     On an argument of the wrong type or dtype (a float position, say).
#[pyfunction]
#[pyo3(signature = (query_pos, window_size, *, out=None))]
fn window_positions<'py>(
    py: Python<'py>,
    query_pos: &Obj<'py>,
    window_size: &Obj<'py>,
    out: Opt<'_, 'py>,
) -> PyResult<I32<'py>> {
    let pos = query_positions(
        S,
        query_pos,
        "query_pos",
        Queries::AsMany,
        Broadcast::Refuse,
    )?;
    let w = S.count(window_size, "window_size", I32_MAX)?;
    let raw = ndarrays(&[query_pos]);
    run(
        py,
        out,
        &[pos.len(), w],
        &raw.iter().collect::<Vec<_>>(),
        |o| compressed::window_positions_into(&pos, w, o),
    )
}

/// Every compressed entry each query sees: an HCA query's attention set.
///
/// The entries ``0 .. min((query_pos + 1) // compress_ratio, n_entries)`` ascending, then -1.
/// An HCA query attends to all of them; a CSA query's entries are its :func:`indexer_topk` row
/// with ``compress_ratio``.
///
/// Parameters
/// ----------
/// query_pos : array_like of int, [n_queries], or int
///     Each query's token position; one integer for one query.
/// compress_ratio : int
///     Tokens per entry, at least 1 (DeepSeek-V4's HCA: 128).
/// n_entries : int
///     The entries that exist (the row width).
/// out : ndarray of int32, optional
///     Written and returned (the shape of the result): C-contiguous, writeable, aligned, native
///     byte order, not overlapping any input (else refused, nothing written).
///
/// Returns
/// -------
/// ndarray of int32, [n_queries, n_entries]
///     Each query's visible entries, ascending, then -1.
///
/// Raises
/// ------
/// SelectionError
///     (a ValueError; ``.argument`` names the argument) on a negative position or count,
///     ``compress_ratio < 1``, or a
///     row width past int32. Nothing is written.
/// TypeError
///     On an argument of the wrong type or dtype (a float position, say).
#[pyfunction]
#[pyo3(signature = (query_pos, compress_ratio, n_entries, *, out=None))]
fn visible_entries<'py>(
    py: Python<'py>,
    query_pos: &Obj<'py>,
    compress_ratio: &Obj<'py>,
    n_entries: &Obj<'py>,
    out: Opt<'_, 'py>,
) -> PyResult<I32<'py>> {
    let pos = query_positions(
        S,
        query_pos,
        "query_pos",
        Queries::AsMany,
        Broadcast::Refuse,
    )?;
    let m = S.count(compress_ratio, "compress_ratio", u32::MAX as u64)?;
    let t = S.count(n_entries, "n_entries", I32_MAX)?;
    let raw = ndarrays(&[query_pos]);
    run(
        py,
        out,
        &[pos.len(), t],
        &raw.iter().collect::<Vec<_>>(),
        |o| compressed::visible_entries_into(&pos, m, t, o),
    )
}

/// The tokens each compressed entry covers, ``[start, end)`` (end exclusive).
///
/// With ``overlap=True`` DeepSeek-V4's CSA entry ``w`` is ``[max(0, m(w - 1)), m(w + 1))``
/// (window ``w - 1``'s Ca half and window ``w``'s Cb half); with ``overlap=False`` an HCA
/// entry (or a GLM-5-Next pool) is ``[m w, m(w + 1))``; a -1 entry is ``(-1, -1)``.
///
/// Parameters
/// ----------
/// entries : array_like of int, any shape
///     Entry ids, -1 for padding.
/// compress_ratio : int
///     ``m``, tokens per entry, at least 1.
/// overlap : bool
///     True for CSA's overlapping entries, False for HCA's (no default: say which).
/// out : ndarray of int32, optional
///     Written and returned (the shape of the result): C-contiguous, writeable, aligned, native
///     byte order, not overlapping any input (else refused, nothing written).
///
/// Returns
/// -------
/// ndarray of int32, entries.shape + (2,)
///     Each entry's first token and one past its last.
///
/// Raises
/// ------
/// SelectionError
///     (a ValueError; ``.argument`` names the argument) on an entry below -1, ``compress_ratio <
///     1``, or an end past
///     int32. Nothing is written.
/// TypeError
///     On an argument of the wrong type or dtype (a float position, say).
#[pyfunction]
#[pyo3(signature = (entries, compress_ratio, *, overlap, out=None))]
fn compressed_entry_tokens<'py>(
    py: Python<'py>,
    entries: &Obj<'py>,
    compress_ratio: &Obj<'py>,
    overlap: bool,
    out: Opt<'_, 'py>,
) -> PyResult<I32<'py>> {
    let (e, mut shape) = S.input_dyn::<i32>(entries, "entries")?;
    let m = S.count(compress_ratio, "compress_ratio", u32::MAX as u64)?;
    shape.push(2);
    let e_slice = e.slice()?;
    run(py, out, &shape, &[e.untyped()], |o| {
        compressed::compressed_entry_tokens_into(e_slice, m, overlap, o)
    })
}

/// Selected compressed entries expanded to token rows (GLM-5-Next's pools).
///
/// ``entry_rows`` (an :func:`indexer_topk` row with ``compress_ratio=m``: entry ids, then -1)
/// becomes, at columns ``j*m .. (j+1)*m``, entry ``j``'s tokens ``m*w .. m*w + m - 1`` (a -1
/// entry: ``m`` times -1). With ``tail=True`` the next ``m - 1`` columns hold the visible
/// incomplete tail, ``(p + 1) % m`` tokens from ``(p + 1) - (p + 1) % m``, then -1; the row is
/// padded with -1 to ``width``.
///
/// Parameters
/// ----------
/// entry_rows : array_like of int32, [n_queries, k]
///     Each query's selected entries, then -1.
/// query_pos : array_like of int, [n_queries], or int
///     Each query's token position; one integer for one query.
/// compress_ratio : int
///     ``m``, tokens per entry, at least 1 (GLM-5-Next: ``index_kpool``, 16).
/// tail : bool, optional
///     Append the visible incomplete tail (GLM-5-Next's ``index_kpool_always_select_tail``).
/// width : int, optional
///     The row width, at least ``k*m`` (plus ``m - 1`` with the tail), which is the default
///     (GLM-5-Next: ``index_topk + kpool - 1``).
/// out : ndarray of int32, optional
///     Written and returned (the shape of the result): C-contiguous, writeable, aligned, native
///     byte order, not overlapping any input (else refused, nothing written).
///
/// Returns
/// -------
/// ndarray of int32, [n_queries, width]
///     The token rows.
///
/// Raises
/// ------
/// SelectionError
///     (a ValueError; ``.argument`` names the argument) on an entry not yet visible to its query
///     (``w >= (p + 1) // m``),
///     a negative entry other than -1, a ``width`` too small for the expansion, or a width
///     past int32. Nothing is written.
/// TypeError
///     On an argument of the wrong type or dtype (a float position, say).
#[pyfunction]
#[pyo3(
    signature = (entry_rows, query_pos, compress_ratio, *, tail=false, width=None, out=None),
    text_signature = "(entry_rows, query_pos, compress_ratio, *, tail=False, width=None, out=None)"
)]
fn expand_entries<'py>(
    py: Python<'py>,
    entry_rows: &Obj<'py>,
    query_pos: &Obj<'py>,
    compress_ratio: &Obj<'py>,
    tail: bool,
    width: Opt<'_, 'py>,
    out: Opt<'_, 'py>,
) -> PyResult<I32<'py>> {
    let rows = S.input::<i32, 2>(entry_rows, "entry_rows", "[n_queries, k]")?;
    let [n, k] = rows.shape;
    let pos = query_positions(
        S,
        query_pos,
        "query_pos",
        Queries::Along("n_queries", n),
        Broadcast::Refuse,
    )?;
    let m = S.count(compress_ratio, "compress_ratio", u32::MAX as u64)?;
    let least = compressed::expanded_width(k, m, tail).filter(|&c| c <= I32_MAX as usize);
    let least = least.ok_or_else(|| too_wide("compress_ratio", "k * compress_ratio"))?;
    let width = S.count_or(width, "width", I32_MAX, least)?;
    let raw = ndarrays(&[query_pos]);
    let inputs: Vec<_> = std::iter::once(rows.untyped()).chain(&raw).collect();
    let r = rows.slice()?;
    run(py, out, &[n, width], &inputs, |o| {
        compressed::expand_entries_into(r, k, &pos, m, tail, width, o)
    })
}

/// vLLM's ``combine_topk_swa_indices`` (DeepSeek-V4 sparse prefill), exactly.
///
/// From ``vllm/v1/attention/ops/deepseek_v4_ops/cache_utils.py``, same arguments in the same
/// order. Token ``i`` of request ``b`` at ``pos = seq_len - query_len + (i -
/// query_start_loc[b])`` gets ``topk_len = min((pos + 1) // compress_ratio, topk)`` top-k
/// entries ``topk_indices[i, :topk_len] + M*b`` (copied as vLLM does: a -1 becomes ``M*b -
/// 1``), then its window of ``swa_len = min(pos + 1, window_size)`` tokens ascending at ``M*b +
/// N + (pos - swa_len + 1 - gather_start) + j`` (``gather_start = seq_len - gather_len``), then
/// -1.
///
/// Parameters
/// ----------
/// topk_indices : array_like of int32, [num_tokens, >= topk]
///     The indexer's rows over compressed entries.
/// query_start_loc : array_like of int, [num_reqs + 1]
///     Each request's first token, rising from 0 to ``num_tokens``.
/// seq_lens, gather_lens : array_like of int, [num_reqs]
///     Each request's tokens, and the tokens gathered into its workspace window.
/// window_size, compress_ratio, topk : int
///     ``W``, ``m`` and the top-k width.
/// M, N : int
///     The per-request workspace stride and the window's offset in it.
/// out : ndarray of int32, [num_tokens, roundup(topk + window_size, 128)], optional
///     Written and returned: C-contiguous, writeable, aligned, native byte order, not
///     overlapping any input.
/// lens_out : ndarray of int32, [num_tokens], optional
///     The same rules.
///
/// Returns
/// -------
/// tuple of ndarray
///     ``(combined_indices, combined_lens)``: int32 ``[num_tokens, roundup(topk +
///     window_size, 128)]`` and int32 ``[num_tokens]`` (``topk_len + swa_len``).
///
/// Raises
/// ------
/// SelectionError
///     (a ValueError; ``.argument`` names the argument) on ``query_start_loc`` not rising from 0 to
///     ``num_tokens``, a
///     query longer than its sequence, a ``gather_len`` longer than it or a window starting
///     before the gathered tokens, a top-k entry ``>= N``, ``N + gather_len > M`` before the
///     last request (its window would run into the next request's workspace), or
///     ``topk_indices`` narrower than ``topk``. Nothing is written.
/// TypeError
///     On an argument of the wrong type or dtype (a float position, say).
#[pyfunction]
#[pyo3(signature = (topk_indices, query_start_loc, seq_lens, gather_lens, window_size,
                    compress_ratio, topk, M, N, *, out=None, lens_out=None))]
#[allow(non_snake_case)]
fn combine_topk_swa_indices<'py>(
    py: Python<'py>,
    topk_indices: &Obj<'py>,
    query_start_loc: &Obj<'py>,
    seq_lens: &Obj<'py>,
    gather_lens: &Obj<'py>,
    window_size: &Obj<'py>,
    compress_ratio: &Obj<'py>,
    topk: &Obj<'py>,
    M: &Obj<'py>,
    N: &Obj<'py>,
    out: Opt<'_, 'py>,
    lens_out: Opt<'_, 'py>,
) -> PyResult<(I32<'py>, I32<'py>)> {
    let t = S.input::<i32, 2>(topk_indices, "topk_indices", "[num_tokens, topk]")?;
    let qsl = positions(S, query_start_loc, "query_start_loc")?;
    let reqs = qsl.len().saturating_sub(1);
    let seq = positions_along(S, seq_lens, "seq_lens", ("num_reqs", reqs))?;
    let gather = positions_along(S, gather_lens, "gather_lens", ("num_reqs", reqs))?;
    let count = |o, name| S.count(o, name, I32_MAX);
    let (w, m, k) = (
        count(window_size, "window_size")?,
        count(compress_ratio, "compress_ratio")?,
        count(topk, "topk")?,
    );
    let (big_m, big_n) = (count(M, "M")?, count(N, "N")?);
    let width = compressed::combined_width(k, w).filter(|&c| c <= I32_MAX as usize);
    let width = width.ok_or_else(|| too_wide("window_size", "topk + window_size"))?;
    let raw = ndarrays(&[query_start_loc, seq_lens, gather_lens]);
    let inputs: Vec<_> = std::iter::once(t.untyped()).chain(&raw).collect();
    let mut idx = S.output::<i32>(py, out, &[t.shape[0], width], &inputs)?;
    let inputs = [&inputs[..], &[idx.untyped()]].concat();
    let mut lens: Out<'py, i32> = match lens_out {
        Some(o) => S.buffer(o, "lens_out", &[t.shape[0]], &inputs)?,
        None => Out::zeros(py, &[t.shape[0]])?,
    };
    let core = CombineInputs {
        topk_indices: t.slice()?,
        num_tokens: t.shape[0],
        topk_width: t.shape[1],
        query_start_loc: &qsl,
        seq_lens: &seq,
        gather_lens: &gather,
        window_size: w,
        compress_ratio: m,
        topk: k,
        m: big_m,
        n: big_n,
    };
    let (o, l) = (idx.slice()?, lens.slice()?);
    super::args::detach(py, o.len(), || {
        compressed::combine_topk_swa_indices_into(&core, o, l)
    })?;
    Ok((idx.finish(), lens.finish()))
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(window_positions, m)?)?;
    m.add_function(wrap_pyfunction!(visible_entries, m)?)?;
    m.add_function(wrap_pyfunction!(compressed_entry_tokens, m)?)?;
    m.add_function(wrap_pyfunction!(expand_entries, m)?)?;
    m.add_function(wrap_pyfunction!(combine_topk_swa_indices, m)?)?;
    Ok(())
}
