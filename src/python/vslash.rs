//! MInference's vertical-slash estimate: its selection, its scores, each
//! query's positions and the engines' per-block layout (all raise
//! `SelectionError`).

use numpy::{PyArrayDyn, PyUntypedArray};
use pyo3::prelude::*;

use super::args::{
    detach, ndarrays, AsFormatArg, EncodedIn, KeyFormat, Named, Obj, Opt, Out, VslashVariantName,
    I32, I32_MAX, S,
};
use super::errors::refuse;
use crate::vslash::{self, Shape, Variant};

type F32<'py> = Bound<'py, PyArrayDyn<f32>>;

/// The checked estimate inputs: queries, keys in place, scales, shape.
struct Est<'py> {
    q: super::args::In<'py, f32, 3>,
    keys: EncodedIn<'py>,
    scale: Option<super::args::In<'py, f32, 1>>,
    shape: Shape,
    variant: Variant,
}

impl<'py> Est<'py> {
    fn new(
        q: &Obj<'py>,
        keys: &Obj<'py>,
        key_scale: Opt<'_, 'py>,
        key_format: Option<Named<KeyFormat>>,
        variant: Option<Named<VslashVariantName>>,
    ) -> PyResult<Est<'py>> {
        let variant = match variant {
            Some(v) => v.get()?.0,
            None => Variant::Kernel,
        };
        let layout = "[seq_len, n_kv_heads, d]";
        let (k, [l, hk, d]) =
            EncodedIn::new_3d(S, keys, "keys", layout, key_format.format_arg())?;
        let qa = S.input::<f32, 3>(q, "q", "[n_heads, min(64, seq_len), d]")?;
        let [h, n, dq] = qa.shape;
        if dq != d || n != vslash::last_queries(l) {
            let msg = format!(
                "q must be [n_heads, min(64, seq_len)={}, d={d}] (the last queries), got {:?}",
                vslash::last_queries(l),
                qa.shape
            );
            return Err(refuse(S, "q", msg));
        }
        let scale = match key_scale {
            Some(o) => Some(S.input::<f32, 1>(o, "key_scale", "[seq_len]")?),
            None => None,
        };
        Ok(Est {
            q: qa,
            keys: k,
            scale,
            shape: Shape {
                n_heads: h,
                n_kv_heads: hk,
                d,
                seq_len: l,
            },
            variant,
        })
    }

    fn inputs(&self) -> Vec<&Bound<'py, PyUntypedArray>> {
        let mut v = vec![self.q.untyped(), self.keys.untyped()];
        v.extend(self.scale.as_ref().map(|s| s.untyped()));
        v
    }

    fn work(&self) -> usize {
        self.shape.n_heads * self.shape.d * self.shape.seq_len
    }
}

/// MInference's vertical-slash selection: the key columns and diagonals a prefill's
/// queries read, from the last queries' attention.
///
/// For each query head: the causal softmax of the last ``n = min(64, L)`` queries'
/// scores ``q . k / sqrt(d)``; the column sums ("vertical") and the sums along each
/// diagonal at offset ``o = query - key >= 0`` ("slash"); the first 30 columns and the
/// 100 nearest diagonals forced; the top ``min(L, max(vertical_size, 30))`` columns and
/// ``min(L, max(slash_size, 50))`` diagonals, ties to the lower index (with fewer than
/// 100 diagonals taken, the nearest forced ones). microsoft/MInference
/// ``vertical_and_slash_kernel``; see docs/vertical-slash.md.
///
/// Parameters
/// ----------
/// q : array_like of float32, [n_heads, min(64, L), d]
///     Each head's last queries (query ``i`` at position ``L - n + i``).
/// keys : array_like, [L, n_kv_heads, d]
///     The sequence's keys, read in place: float32, float16, ml_dtypes bfloat16 /
///     float8_e4m3fn, or a raw uint16 / uint8 view with ``key_format``. Head ``h`` reads
///     KV head ``h // (n_heads // n_kv_heads)``.
/// vertical_size, slash_size : int
///     ``v`` and ``s``: columns and diagonals asked for (at least 30 and 50 are taken).
/// variant : {'kernel', 'search'}, optional
///     ``'search'``: ``search_pattern_v2``'s copy (unscaled scores, 30 diagonals forced).
/// key_scale : array_like of float32, [L], optional
///     A per-key scale (fp8 keys): a key's value is ``k * scale`` rounded to float32.
/// key_format : str, optional
///     The format of a raw uint16 / uint8 ``keys``.
/// out : tuple of two ndarrays of int32, optional
///     ``(vertical, slash)`` to write and return: C-contiguous, writeable, aligned, not
///     overlapping any input or each other (else refused, nothing written).
///
/// Returns
/// -------
/// vertical : ndarray of int32, [n_heads, nv]
///     The columns, ascending.
/// slash : ndarray of int32, [n_heads, ns]
///     The diagonal offsets ``query - key``, ascending (0 is the main diagonal).
///
/// Raises
/// ------
/// SelectionError
///     (a ValueError; ``.argument`` names it) when ``keys`` is not 3-D or has a zero
///     axis (``keys``, ``seq_len``, ``n_kv_heads``, ``d``), ``q`` is not the last
///     queries of that ``d`` or not finite (``q``), the heads do not divide
///     (``n_kv_heads``), ``key_scale`` is not one per key, a score is not finite
///     (``keys``), or an option is unknown.
///     Also when ``out`` is refused (its shapes, layout, read-only, or overlapping).
/// TypeError
///     when ``out`` is not a tuple of two int32 ndarrays.
///
/// See Also
/// --------
/// vslash_scores : the sums the selection ranks.
/// vslash_rows : each query's positions.
/// vslash_layout : the engines' per-block layout.
///
/// Examples
/// --------
/// >>> import numpy as np, kvselect
/// >>> rng = np.random.default_rng(0)
/// >>> keys = rng.standard_normal((200, 1, 16)).astype(np.float32)
/// >>> q = rng.standard_normal((2, 64, 16)).astype(np.float32)
/// >>> vertical, slash = kvselect.vslash_select(q, keys, 40, 60)
/// >>> vertical.shape, slash.shape, vertical[0, :30].tolist() == list(range(30))
/// ((2, 40), (2, 100), True)
#[pyfunction]
#[pyo3(
    signature = (q, keys, vertical_size, slash_size, *, variant=None, key_scale=None, key_format=None,
                 out=None),
    text_signature = "(q, keys, vertical_size, slash_size, *, variant='kernel', key_scale=None, \
                      key_format=None, out=None)"
)]
#[allow(clippy::too_many_arguments)]
pub(super) fn vslash_select<'py>(
    py: Python<'py>,
    q: &Obj<'py>,
    keys: &Obj<'py>,
    vertical_size: &Obj<'py>,
    slash_size: &Obj<'py>,
    variant: Option<Named<VslashVariantName>>,
    key_scale: Opt<'_, 'py>,
    key_format: Option<Named<KeyFormat>>,
    out: Opt<'_, 'py>,
) -> PyResult<(I32<'py>, I32<'py>)> {
    let v = S.count(vertical_size, "vertical_size", I32_MAX)?;
    let s = S.count(slash_size, "slash_size", I32_MAX)?;
    let e = Est::new(q, keys, key_scale, key_format, variant)?;
    let (nv, ns) = vslash::sizes(e.shape.seq_len, v, s);
    let h = e.shape.n_heads;
    let inputs = e.inputs();
    let [mut vo, mut so] = S.outputs(py, out, (SETS, [&[h, nv], &[h, ns]]), &inputs)?;
    let (qs, ks) = (e.q.slice()?, e.keys.encoded()?);
    let sc = e.scale.as_ref().map(|x| x.slice()).transpose()?;
    let (vs, ss) = (vo.slice()?, so.slice()?);
    detach(py, e.work(), || {
        vslash::select_into(qs, ks, sc, e.shape, e.variant, v, s, vs, ss)
    })?;
    Ok((vo.finish(), so.finish()))
}

/// The sums :func:`vslash_select` ranks: each column's and each diagonal's share of
/// the last queries' attention, before anything is forced.
///
/// Parameters
/// ----------
/// q, keys, variant, key_scale, key_format
///     As :func:`vslash_select`.
/// out : tuple of two ndarrays of float32, optional
///     ``(vertical, slash)`` to write and return: C-contiguous, writeable, aligned, not
///     overlapping any input or each other (else refused, nothing written).
///
/// Returns
/// -------
/// vertical : ndarray of float32, [n_heads, L]
///     Column ``c``'s sum of probabilities over the last queries.
/// slash : ndarray of float32, [n_heads, L]
///     Entry ``o``: the sum along the diagonal ``query - key = o``.
///
/// Raises
/// ------
/// SelectionError
///     As :func:`vslash_select`.
///     Also when ``out`` is refused (its shapes, layout, read-only, or overlapping).
/// TypeError
///     when ``out`` is not a tuple of two float32 ndarrays.
///
/// See Also
/// --------
/// vslash_select : the columns and diagonals these rank.
///
/// Examples
/// --------
/// >>> import numpy as np, kvselect
/// >>> keys = np.zeros((3, 1, 4), np.float32)  # equal scores: uniform rows
/// >>> vertical, slash = kvselect.vslash_scores(np.ones((1, 3, 4), np.float32), keys)
/// >>> np.round(vertical[0], 4).tolist(), np.round(slash[0], 4).tolist()
/// ([1.8333, 0.8333, 0.3333], [1.8333, 0.8333, 0.3333])
#[pyfunction]
#[pyo3(
    signature = (q, keys, *, variant=None, key_scale=None, key_format=None, out=None),
    text_signature = "(q, keys, *, variant='kernel', key_scale=None, key_format=None, out=None)"
)]
pub(super) fn vslash_scores<'py>(
    py: Python<'py>,
    q: &Obj<'py>,
    keys: &Obj<'py>,
    variant: Option<Named<VslashVariantName>>,
    key_scale: Opt<'_, 'py>,
    key_format: Option<Named<KeyFormat>>,
    out: Opt<'_, 'py>,
) -> PyResult<(F32<'py>, F32<'py>)> {
    let e = Est::new(q, keys, key_scale, key_format, variant)?;
    let shape = [e.shape.n_heads, e.shape.seq_len];
    let inputs = e.inputs();
    let [mut vo, mut so] = S.outputs(py, out, (SETS, [&shape, &shape]), &inputs)?;
    let (qs, ks) = (e.q.slice()?, e.keys.encoded()?);
    let sc = e.scale.as_ref().map(|x| x.slice()).transpose()?;
    let (vs, ss) = (vo.slice()?, so.slice()?);
    detach(py, e.work(), || {
        vslash::scores_into(qs, ks, sc, e.shape, e.variant, vs, ss)
    })?;
    Ok((vo.finish(), so.finish()))
}

/// The names of `out=`'s buffers: the two sets (or their scores), and the
/// engines' layout.
const SETS: &str = "(vertical, slash)";
const LAYOUT: &str = "(block_count, block_offset, column_count, column_index)";

/// The two index sets, `[n_heads, nv]` and `[n_heads, ns]` int32.
fn sets<'py>(
    vertical: &Obj<'py>,
    slash: &Obj<'py>,
) -> PyResult<(super::args::In<'py, i32, 2>, super::args::In<'py, i32, 2>)> {
    let v = S.input::<i32, 2>(vertical, "vertical", "[n_heads, nv]")?;
    let s = S.input::<i32, 2>(slash, "slash", "[n_heads, ns]")?;
    if s.shape[0] != v.shape[0] {
        let msg = format!(
            "slash must be [n_heads={}, ns], got {:?}",
            v.shape[0], s.shape
        );
        return Err(refuse(S, "slash", msg));
    }
    Ok((v, s))
}

/// Each query's positions under a vertical-slash selection: the selected columns up to
/// it and the keys ``p - o`` of the selected diagonals.
///
/// Parameters
/// ----------
/// vertical : array_like of int32, [n_heads, nv]
///     Columns (any order, repeats allowed).
/// slash : array_like of int32, [n_heads, ns]
///     Diagonal offsets ``query - key``.
/// seq_len : int
///     ``L``: every id and position lies in ``[0, L)``.
/// positions : array_like of int, [n_positions]
///     The query positions to give rows for.
/// out : ndarray of int32, [n_heads, n_positions, nv + ns], optional
///     ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
///     aligned, native byte order, not overlapping any input (else refused, nothing written).
///
/// Returns
/// -------
/// ndarray of int32, [n_heads, n_positions, nv + ns]
///     Ascending, distinct, ``-1`` padded.
///
/// Raises
/// ------
/// SelectionError
///     when a set is not 2-D of ``n_heads`` non-empty rows or holds an id outside
///     ``[0, L)`` (``vertical``, ``slash``), or a position is outside it
///     (``positions``).
///     Also when ``out`` is refused (its shape, layout, read-only, or overlapping an input).
/// TypeError
///     when ``out`` is not an int32 ndarray.
///
/// See Also
/// --------
/// vslash_select : the sets.
/// vslash_layout : the same selection as the engines' kernels read it.
///
/// Examples
/// --------
/// >>> import numpy as np, kvselect
/// >>> kvselect.vslash_rows(np.array([[0, 4]]), np.array([[0, 3]]), 10, [3, 9]).tolist()
/// [[[0, 3, -1, -1], [0, 4, 6, 9]]]
#[pyfunction]
#[pyo3(signature = (vertical, slash, seq_len, positions, *, out=None))]
pub(super) fn vslash_rows<'py>(
    py: Python<'py>,
    vertical: &Obj<'py>,
    slash: &Obj<'py>,
    seq_len: &Obj<'py>,
    positions: &Obj<'py>,
    out: Opt<'_, 'py>,
) -> PyResult<I32<'py>> {
    let l = S.count(seq_len, "seq_len", I32_MAX)?;
    let (v, s) = sets(vertical, slash)?;
    let p = S.input::<i64, 1>(positions, "positions", "[n_positions]")?;
    let (h, width) = (v.shape[0], v.shape[1] + s.shape[1]);
    let raw = ndarrays(&[positions]);
    let inputs: Vec<&Bound<'py, PyUntypedArray>> =
        [v.untyped(), s.untyped()].into_iter().chain(&raw).collect();
    let mut out: Out<'py, i32> = S.output(py, out, &[h, p.shape[0], width], &inputs)?;
    let (vs, ss, ps) = (v.slice()?, s.slice()?, p.slice()?);
    let o = out.slice()?;
    detach(py, o.len(), || vslash::rows_into(vs, ss, h, l, ps, o))?;
    Ok(out.finish())
}

/// The engines' layout of a vertical-slash selection: per block of 64 queries, the
/// 64-key blocks its diagonals cover and the columns outside them, as MInference's
/// ``convert_vertical_slash_indexes`` writes them for the sparse kernel.
///
/// Parameters
/// ----------
/// vertical : array_like of int32, [n_heads, nv]
///     Columns (any order: sorted here, as the engines sort them).
/// slash : array_like of int32, [n_heads, ns]
///     Diagonal offsets; each head needs one below 64 (the source reads past its list
///     otherwise).
/// seq_len : int
///     ``L``; there are ``ceil(L / 64)`` query blocks.
/// out : tuple of four ndarrays of int32, optional
///     ``(block_count, block_offset, column_count, column_index)`` to write and
///     return: C-contiguous, writeable, aligned, not overlapping any input or each
///     other (else refused, nothing written).
///
/// Returns
/// -------
/// block_count : ndarray of int32, [n_heads, n_blocks]
/// block_offset : ndarray of int32, [n_heads, n_blocks, ns]
///     The first key of each 64-key block read, ascending; unused slots 0.
/// column_count : ndarray of int32, [n_heads, n_blocks]
/// column_index : ndarray of int32, [n_heads, n_blocks, nv]
///     The columns read outside those blocks; unused slots 0.
///
/// Raises
/// ------
/// SelectionError
///     As :func:`vslash_rows`, and when a head has no offset below 64 (``slash``).
///     Also when ``out`` is refused (its shapes, layout, read-only, or overlapping).
/// TypeError
///     when ``out`` is not a tuple of four int32 ndarrays.
///
/// See Also
/// --------
/// vslash_rows : the positions each query reads.
/// vslash_layout_batch : the later form vLLM and SGLang carry.
///
/// Examples
/// --------
/// >>> import numpy as np, kvselect
/// >>> bc, bo, cc, ci = kvselect.vslash_layout(np.array([[3, 40, 150]]), np.array([[0, 1, 130]]), 256)
/// >>> bc.tolist(), bo[0, 3].tolist(), cc.tolist(), ci[0, 3].tolist()
/// ([[1, 2, 3, 3]], [62, 191, 255], [[0, 2, 0, 3]], [3, 40, 150])
#[pyfunction]
#[pyo3(signature = (vertical, slash, seq_len, *, out=None))]
pub(super) fn vslash_layout<'py>(
    py: Python<'py>,
    vertical: &Obj<'py>,
    slash: &Obj<'py>,
    seq_len: &Obj<'py>,
    out: Opt<'_, 'py>,
) -> PyResult<(I32<'py>, I32<'py>, I32<'py>, I32<'py>)> {
    let l = S.count(seq_len, "seq_len", I32_MAX)?;
    let (v, s) = sets(vertical, slash)?;
    let (h, nv, ns) = (v.shape[0], v.shape[1], s.shape[1]);
    let nb = l.div_ceil(vslash::LAYOUT_BLOCK);
    let inputs = [v.untyped(), s.untyped()];
    let shapes: [&[usize]; 4] = [&[h, nb], &[h, nb, ns], &[h, nb], &[h, nb, nv]];
    let [mut bc, mut bo, mut cc, mut ci] = S.outputs(py, out, (LAYOUT, shapes), &inputs)?;
    let (vs, ss) = (v.slice()?, s.slice()?);
    let (a, b, c, d) = (bc.slice()?, bo.slice()?, cc.slice()?, ci.slice()?);
    detach(py, b.len() + d.len(), || {
        vslash::layout_into(vs, ss, h, l, a, b, c, d)
    })?;
    Ok((bc.finish(), bo.finish(), cc.finish(), ci.finish()))
}

/// The later form of the engines' layout, as vLLM's ``_custom_ops`` and SGLang's
/// ``sgl_kernel`` write it: a batch of sequences, each with its own query and key
/// lengths, the queries aligned to the end of the keys (``causal``) or after them,
/// the ranges clipped to the keys.
///
/// The same kernel in both engines (``convert_vertical_slash_indexes``, 64-query and
/// 64-key blocks, as their callers pass). For query block ``[start, end)`` of
/// sequence ``b``, with ``base = kv_seqlens[b] - q_seqlens[b]`` (``causal``) or
/// ``kv_seqlens[b]`` (not): offsets ``o >= base + end`` skipped, each other one
/// covering the keys ``[base + end - o - 64, base + end - o)`` (its end at least 64),
/// merged as :func:`vslash_layout` merges them; not causal, the offsets below
/// ``start`` end the list. The ranges' blocks are clipped to the keys; a block with
/// no offset reaching it reads one 64-key range past its queries. See
/// docs/vertical-slash.md, "The engines' layout".
///
/// Parameters
/// ----------
/// vertical : array_like of int32, [n_seqs, n_heads, nv]
///     Columns, each in ``[0, kv_seqlen)`` of its sequence (any order: sorted here, as
///     vLLM's caller sorts them).
/// slash : array_like of int32, [n_seqs, n_heads, ns]
///     Diagonal offsets ``>= 0`` (any order: sorted here, descending); offsets past
///     the keys are taken as the source takes them.
/// q_seqlens, kv_seqlens : array_like of int, [n_seqs]
///     Each sequence's queries (``>= 0``) and keys (``>= 1``).
/// context_size : int, optional
///     The outputs have ``ceil(context_size / 64)`` query blocks a head; at least
///     each sequence's; default ``max(q_seqlens)``.
/// causal : bool, default True
///     Queries aligned to the end of the keys, masked causally (vLLM's "intra"
///     stage); ``False``: every query after the keys ("succ", "inter").
/// out : tuple of four ndarrays of int32, optional
///     ``(block_count, block_offset, column_count, column_index)`` to write and
///     return: C-contiguous, writeable, aligned, not overlapping any input or each
///     other (else refused, nothing written).
///
/// Returns
/// -------
/// block_count : ndarray of int32, [n_seqs, n_heads, n_rows]
/// block_offset : ndarray of int32, [n_seqs, n_heads, n_rows, ns]
///     The first key of each 64-key block read; unused slots 0.
/// column_count : ndarray of int32, [n_seqs, n_heads, n_rows]
/// column_index : ndarray of int32, [n_seqs, n_heads, n_rows, nv]
///     The columns read outside those blocks; unused slots 0. Query blocks at or
///     past a sequence's ``q_seqlen`` are all 0 (the source does not write them).
///
/// Raises
/// ------
/// SelectionError
///     when a set is not 3-D with every axis at least 1 or the two disagree on
///     ``[n_seqs, n_heads]`` (``vertical``, ``slash``), a length is not one per
///     sequence or is out of range (``q_seqlens``, ``kv_seqlens``), ``context_size``
///     holds fewer query blocks than a sequence (``context_size``), a column is
///     outside its sequence's keys (``vertical``) or an offset negative (``slash``).
///     Also when ``out`` is refused (its shapes, layout, read-only, or overlapping).
/// TypeError
///     when ``out`` is not a tuple of four int32 ndarrays.
///
/// See Also
/// --------
/// vslash_layout : MInference's own form (one sequence, causal).
///
/// Examples
/// --------
/// >>> import numpy as np, kvselect
/// >>> v, s = np.array([[[5, 150, 290]]]), np.array([[[0, 10, 120]]])
/// >>> bc, bo, cc, ci = kvselect.vslash_layout_batch(v, s, [100], [300])
/// >>> bc.tolist(), bo[0, 0, 0].tolist(), cc.tolist(), ci[0, 0, 0].tolist()
/// ([[[3, 2]]], [80, 190, 254], [[[2, 1]]], [5, 150, 0])
#[pyfunction]
#[pyo3(
    signature = (vertical, slash, q_seqlens, kv_seqlens, *, context_size=None, causal=true,
                 out=None),
    text_signature = "(vertical, slash, q_seqlens, kv_seqlens, *, context_size=None, causal=True, \
                      out=None)"
)]
#[allow(clippy::too_many_arguments)]
pub(super) fn vslash_layout_batch<'py>(
    py: Python<'py>,
    vertical: &Obj<'py>,
    slash: &Obj<'py>,
    q_seqlens: &Obj<'py>,
    kv_seqlens: &Obj<'py>,
    context_size: Opt<'_, 'py>,
    causal: bool,
    out: Opt<'_, 'py>,
) -> PyResult<(I32<'py>, I32<'py>, I32<'py>, I32<'py>)> {
    let v = S.input::<i32, 3>(vertical, "vertical", "[n_seqs, n_heads, nv]")?;
    let s = S.input::<i32, 3>(slash, "slash", "[n_seqs, n_heads, ns]")?;
    if s.shape[..2] != v.shape[..2] {
        let msg = format!(
            "slash must be [n_seqs={}, n_heads={}, ns], got {:?}",
            v.shape[0], v.shape[1], s.shape
        );
        return Err(refuse(S, "slash", msg));
    }
    let q = S.input::<i64, 1>(q_seqlens, "q_seqlens", "[n_seqs]")?;
    let kv = S.input::<i64, 1>(kv_seqlens, "kv_seqlens", "[n_seqs]")?;
    let longest = q.slice()?.iter().copied().max().unwrap_or(0).max(0) as usize;
    let context = S.count_or(context_size, "context_size", I32_MAX, longest)?;
    let [n_seqs, n_heads, nv] = v.shape;
    let batch = vslash::LayoutBatch {
        n_seqs,
        n_heads,
        nv,
        ns: s.shape[2],
        context_size: context,
        causal,
    };
    let (rows, ns) = (batch.rows(), batch.ns);
    let raw = ndarrays(&[q_seqlens, kv_seqlens]);
    let inputs: Vec<&Bound<'py, PyUntypedArray>> =
        [v.untyped(), s.untyped()].into_iter().chain(&raw).collect();
    let (count, per) = ([n_seqs, n_heads, rows], [n_seqs, n_heads, rows]);
    let (offset, index) = ([n_seqs, n_heads, rows, ns], [n_seqs, n_heads, rows, nv]);
    let shapes: [&[usize]; 4] = [&count, &offset, &per, &index];
    let [mut bc, mut bo, mut cc, mut ci] = S.outputs(py, out, (LAYOUT, shapes), &inputs)?;
    let (vs, ss, qs, ks) = (v.slice()?, s.slice()?, q.slice()?, kv.slice()?);
    let (a, b, c, d) = (bc.slice()?, bo.slice()?, cc.slice()?, ci.slice()?);
    detach(py, b.len() + d.len(), || {
        vslash::layout_batch_into(vs, ss, qs, ks, batch, a, b, c, d)
    })?;
    Ok((bc.finish(), bo.finish(), cc.finish(), ci.finish()))
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(vslash_select, m)?)?;
    m.add_function(wrap_pyfunction!(vslash_scores, m)?)?;
    m.add_function(wrap_pyfunction!(vslash_rows, m)?)?;
    m.add_function(wrap_pyfunction!(vslash_layout, m)?)?;
    m.add_function(wrap_pyfunction!(vslash_layout_batch, m)?)?;
    Ok(())
}
