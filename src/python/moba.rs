//! MoBA's gates and block selection: dense, packed and paged (all raise
//! `SelectionError`).

use numpy::{PyArrayDyn, PyUntypedArray};
use pyo3::prelude::*;

use super::args::{
    detach, ndarrays, positions, AsFormatArg, EncodedIn, KeyFormat, MobaVariantName, Named, Obj,
    Opt, Out, PageLayoutName, QueryFormat, I32, I32_MAX, S,
};
use super::cache::PagedDecode;
use super::errors::refuse;
use crate::moba::{self, Heads, Shape, Variant};

type F32<'py> = Bound<'py, PyArrayDyn<f32>>;

fn variant(name: Option<Named<MobaVariantName>>) -> PyResult<Variant> {
    Ok(
        match name
            .unwrap_or(Named::known(MobaVariantName::Efficient))
            .get()?
        {
            MobaVariantName::Efficient => Variant::Efficient,
            MobaVariantName::Naive => Variant::Naive,
        },
    )
}

/// `q` `[n, n_q_heads, d]` and `k` `[m, n_kv_heads, d]`: the shape.
fn qk_shape(qs: &[usize], ks: &[usize], block_size: usize) -> PyResult<Shape> {
    let [_, h, d] = ks[..] else {
        let msg = format!("k must be 3-D [n_keys, n_kv_heads, d], got {}-D {:?}", ks.len(), ks);
        return Err(refuse(S, "k", msg));
    };
    let [_, hq, dq] = qs[..] else {
        let msg = format!(
            "q must be 3-D [n_queries, n_q_heads, d], got {}-D {:?}",
            qs.len(),
            qs
        );
        return Err(refuse(S, "q", msg));
    };
    if dq != d {
        return Err(refuse(S, "q", format!("q has d={dq} but k d={d}")));
    }
    Ok(Shape {
        heads: Heads {
            n_q_heads: hq,
            n_kv_heads: h,
            d,
        },
        block_size,
    })
}

/// The gate of every past block of each query: MoBA's ``q · mean(K of the block)``.
///
/// One sequence: query ``i`` of ``n_queries`` sits at position ``n_keys - n_queries + i``,
/// its current block is ``pos // block_size``, and each block ``b`` before it (all
/// complete) is gated by the query head against its KV head's block mean (``n_q_heads /
/// n_kv_heads`` query heads a KV head). The mean is the float32 sum in token order times
/// ``float32(1 / block_size)``; the gate the 8-lane fused dot product of docs/moba.md,
/// the same bits at every SIMD level.
///
/// Parameters
/// ----------
/// q : array_like, [n_queries, n_q_heads, d]
///     The queries (float32, float16, ml_dtypes bfloat16, or raw with ``query_format``).
/// k : array_like, [n_keys, n_kv_heads, d]
///     The keys: float32, float16, ml_dtypes bfloat16 / float8_e4m3fn, or a raw uint16 /
///     uint8 view with ``key_format``; read in place.
/// block_size : int
///     Tokens per block (MoBA's ``moba_chunk_size``), >= 1.
/// key_scale : array_like of float32, [n_keys], optional
///     Each key's scale (fp8 keys): its value is ``k * scale`` rounded to float32.
/// key_format, query_format : str, optional
///     The formats of raw ``k`` and ``q``.
/// out : ndarray of float32, [n_queries, n_q_heads, n_blocks], optional
///     ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
///     aligned, native byte order, not overlapping any input (else refused, nothing written).
///
/// Returns
/// -------
/// ndarray of float32, [n_queries, n_q_heads, n_blocks]
///     ``n_blocks = ceil(n_keys / block_size)``; NaN at the current and future blocks
///     (never gated).
///
/// Raises
/// ------
/// SelectionError
///     when ``q`` or ``k`` is not 3-D, their ``d`` differ, the query heads are not a
///     multiple of the KV heads or the queries outnumber the keys (``q``, ``k``),
///     ``block_size`` is 0 (``block_size``) or ``key_scale`` is not one per key.
///     Also when ``out`` is refused (its shape, layout, read-only, or overlapping an input).
/// TypeError
///     when ``out`` is not a float32 ndarray.
///
/// See Also
/// --------
/// moba_select : the blocks these gates choose.
///
/// Examples
/// --------
/// >>> import numpy as np, kvselect
/// >>> k = np.array([0, 2, 4, 6, -3, -1], np.float32).reshape(6, 1, 1)
/// >>> kvselect.moba_gates(np.ones((1, 1, 1), np.float32), k, 2)[0, 0].tolist()
/// [1.0, 5.0, nan]
#[pyfunction]
#[pyo3(
    signature = (q, k, block_size, *, key_scale=None, key_format=None, query_format=None, out=None),
    text_signature = "(q, k, block_size, *, key_scale=None, key_format=None, query_format=None, \
                      out=None)"
)]
pub(super) fn moba_gates<'py>(
    py: Python<'py>,
    q: &Obj<'py>,
    k: &Obj<'py>,
    block_size: &Obj<'py>,
    key_scale: Opt<'_, 'py>,
    key_format: Option<Named<KeyFormat>>,
    query_format: Option<Named<QueryFormat>>,
    out: Opt<'_, 'py>,
) -> PyResult<F32<'py>> {
    let bs = S.count(block_size, "block_size", I32_MAX)?;
    let (ke, kshape) = EncodedIn::new(S, k, "k", key_format.format_arg())?;
    let (qe, qshape) = EncodedIn::new(S, q, "q", query_format.format_arg())?;
    let shape = qk_shape(&qshape, &kshape, bs)?;
    let scale = match key_scale {
        Some(o) => Some(S.input::<f32, 1>(o, "key_scale", "[n_keys]")?),
        None => None,
    };
    moba::check_settings(shape, None)?;
    let nb = kshape[0].div_ceil(bs);
    let mut inputs = vec![qe.untyped(), ke.untyped()];
    inputs.extend(scale.as_ref().map(|s| s.untyped()));
    let mut out: Out<'py, f32> = S.output(py, out, &[qshape[0], qshape[1], nb], &inputs)?;
    let (qs, ks) = (qe.encoded()?, ke.encoded()?);
    let sc = scale.as_ref().map(|s| s.slice()).transpose()?;
    let o = out.slice()?;
    detach(py, o.len().max(ks.len()), || {
        moba::gates_into(qs, ks, sc, shape, o)
    })?;
    Ok(out.finish())
}

/// The blocks each query reads: MoBA's block selection.
///
/// ``variant='efficient'`` (``moba/moba_efficient.py``, the rule): each query reads its
/// current block (``pos // block_size``, forced, attended causally) and the ``topk - 1``
/// past blocks with the greatest gate (:func:`moba_gates`), all of them when there are
/// fewer; at ``topk = 1`` every block up to its own (MoBA's fallback to full causal
/// attention). ``'naive'`` (``moba/moba_naive.py``): the same for ``topk >= 2``, its
/// own block alone at ``topk = 1``. Only completed past blocks are gated; ties go to the
/// lower block id. A packed batch (``cu_seqlens``) numbers each sequence's blocks from 0.
///
/// Parameters
/// ----------
/// q : array_like, [n_queries, n_q_heads, d]
///     The queries, formats as :func:`moba_gates`.
/// k : array_like, [n_keys, n_kv_heads, d]
///     The keys, read in place.
/// topk : int
///     Blocks per query, the forced current block counted (MoBA's ``moba_topk``), >= 1.
/// block_size : int
///     Tokens per block (``moba_chunk_size``), >= 1.
/// key_scale : array_like of float32, [n_keys], optional
///     Each key's scale (fp8 keys).
/// key_format, query_format : str, optional
///     The formats of raw ``k`` and ``q``.
/// cu_seqlens : array_like of int, [n_seqs + 1], optional
///     A packed batch: sequence ``s`` is keys ``cu_seqlens[s] .. cu_seqlens[s + 1]``.
///     None: one sequence.
/// cu_seqlens_q : array_like of int, [n_seqs + 1], optional
///     Its queries, the last positions of its keys (default ``cu_seqlens``; without
///     ``cu_seqlens``, the queries are the last ``n_queries`` of the keys).
/// variant : {'efficient', 'naive'}, optional
///     Whose selection (default ``'efficient'``).
/// out : ndarray of int32, [n_queries, n_q_heads, width], optional
///     ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
///     aligned, native byte order, not overlapping any input (else refused, nothing written).
///
/// Returns
/// -------
/// ndarray of int32, [n_queries, n_q_heads, width]
///     Each row's block ids ascending, then -1. ``width`` is ``topk``, or, for
///     ``'efficient'`` at ``topk = 1``, the most blocks a query of the batch sees.
///
/// Raises
/// ------
/// SelectionError
///     when ``topk`` or ``block_size`` is 0 (named), ``q`` does not fit ``k`` (``q``, ``k``),
///     ``key_scale`` is not one per key, ``cu_seqlens`` does not rise from 0 to
///     ``n_keys`` (``cu_seqlens``), ``cu_seqlens_q`` does not rise from 0 to
///     ``n_queries`` or gives a sequence more queries than keys (``cu_seqlens_q``).
///     Also when ``out`` is refused (its shape, layout, read-only, or overlapping an input).
/// TypeError
///     when ``out`` is not an int32 ndarray.
///
/// See Also
/// --------
/// moba_gates : the gates ranked.
/// moba_select_paged : the same selection at decode over a paged cache.
///
/// Examples
/// --------
/// >>> import numpy as np, kvselect
/// >>> k = np.array([0, 2, 4, 6, -3, -1, 3, 3], np.float32).reshape(8, 1, 1)
/// >>> kvselect.moba_select(np.ones((1, 1, 1), np.float32), k, 2, 2)
/// array([[[1, 3]]], dtype=int32)
#[pyfunction]
#[pyo3(
    signature = (q, k, topk, block_size, *, key_scale=None, key_format=None, query_format=None,
                 cu_seqlens=None, cu_seqlens_q=None, variant=None, out=None),
    text_signature = "(q, k, topk, block_size, *, key_scale=None, key_format=None, \
                      query_format=None, cu_seqlens=None, cu_seqlens_q=None, variant='efficient', \
                      out=None)"
)]
#[allow(clippy::too_many_arguments)]
pub(super) fn moba_select<'py>(
    py: Python<'py>,
    q: &Obj<'py>,
    k: &Obj<'py>,
    topk: &Obj<'py>,
    block_size: &Obj<'py>,
    key_scale: Opt<'_, 'py>,
    key_format: Option<Named<KeyFormat>>,
    query_format: Option<Named<QueryFormat>>,
    cu_seqlens: Opt<'_, 'py>,
    cu_seqlens_q: Opt<'_, 'py>,
    variant: Option<Named<MobaVariantName>>,
    out: Opt<'_, 'py>,
) -> PyResult<I32<'py>> {
    let topk = S.count(topk, "topk", I32_MAX)?;
    let bs = S.count(block_size, "block_size", I32_MAX)?;
    let v = self::variant(variant)?;
    let (ke, kshape) = EncodedIn::new(S, k, "k", key_format.format_arg())?;
    let (qe, qshape) = EncodedIn::new(S, q, "q", query_format.format_arg())?;
    let shape = qk_shape(&qshape, &kshape, bs)?;
    moba::check_settings(shape, Some(topk))?;
    let scale = match key_scale {
        Some(o) => Some(S.input::<f32, 1>(o, "key_scale", "[n_keys]")?),
        None => None,
    };
    let (n_k, n_q) = (kshape[0], qshape[0]);
    let cu = match cu_seqlens {
        Some(o) => positions(S, o, "cu_seqlens")?,
        None => vec![0, n_k],
    };
    let cq = match cu_seqlens_q {
        Some(o) => Some(positions(S, o, "cu_seqlens_q")?),
        None if cu_seqlens.is_none() => Some(vec![0, n_q]),
        None => None,
    };
    let max_blocks = cu
        .windows(2)
        .map(|w| w[1].saturating_sub(w[0]).div_ceil(bs))
        .max()
        .unwrap_or(0);
    let w = moba::width(v, topk, max_blocks);
    let raw = ndarrays(&[cu_seqlens.unwrap_or(q), cu_seqlens_q.unwrap_or(q)]);
    let mut inputs: Vec<&Bound<'py, PyUntypedArray>> = vec![qe.untyped(), ke.untyped()];
    inputs.extend(scale.as_ref().map(|s| s.untyped()));
    inputs.extend(&raw);
    // SAFETY: moba::select_into writes every slot of `out` when it succeeds
    // (each query row whole: its blocks, then -1) and checks everything
    // before writing: a new array it refuses is never handed back, and a
    // caller's `out` it refuses is left as it was.
    let mut out =
        unsafe { S.output_filled_by_core(py, out, &[n_q, shape.heads.n_q_heads, w], &inputs)? };
    let (qs, ks) = (qe.encoded()?, ke.encoded()?);
    let sc = scale.as_ref().map(|s| s.slice()).transpose()?;
    let o = out.slice()?;
    detach(py, ks.len().max(o.len()), || {
        moba::select_into(qs, ks, sc, &cu, cq.as_deref(), shape, topk, v, o)
    })?;
    Ok(out.finish())
}

/// MoBA's block selection at decode, over an engine's paged key cache.
///
/// Sequence ``s`` decodes one query at position ``seq_lens[s] - 1``; its keys are its
/// first ``seq_lens[s]`` tokens through its ``block_table`` row (the cache's pages need
/// not be MoBA's blocks). Equal, row for row, to :func:`moba_select` on the same keys
/// laid out densely (fp8 keys times their scales).
///
/// Parameters
/// ----------
/// q : array_like, [n_seqs, n_q_heads, d]
///     Each sequence's decoding query.
/// kv_cache : array_like, [num_blocks, page_size, n_kv_heads * d]
///     The pages read in place (any block stride), or uint8 pages of fp8 keys then one
///     float32 scale per token (``[num_blocks, page_size, n_kv_heads * d + 4]``,
///     ``page_layout='fp8_scaled'``).
/// block_table : array_like of int32, [n_seqs, max_blocks]
///     Logical page -> cache block, per sequence.
/// seq_lens : array_like of int, [n_seqs]
///     Tokens per sequence (the query's own included), each >= 1.
/// n_kv_heads : int
///     KV heads per token.
/// topk : int
///     Blocks per query, the forced current block counted, >= 1.
/// block_size : int
///     MoBA's block, in tokens.
/// page_layout : {'dense', 'fp8_scaled'}, optional
///     How a page holds its keys.
/// key_format, query_format : str, optional
///     The formats of a raw cache and ``q``.
/// variant : {'efficient', 'naive'}, optional
///     Whose selection (default ``'efficient'``).
/// out : ndarray of int32, [n_seqs, n_q_heads, width], optional
///     ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
///     aligned, native byte order, not overlapping any input (else refused, nothing written).
///
/// Returns
/// -------
/// ndarray of int32, [n_seqs, n_q_heads, width]
///     As :func:`moba_select`.
///
/// Raises
/// ------
/// SelectionError
///     when the cache, table or lengths are refused (``kv_cache``, ``block_table``,
///     ``seq_lens``), ``n_kv_heads`` does not divide a row, ``q`` does not fit, or
///     ``topk`` / ``block_size`` is 0.
///     Also when ``out`` is refused (its shape, layout, read-only, or overlapping an input).
/// TypeError
///     when ``out`` is not an int32 ndarray.
///
/// See Also
/// --------
/// moba_select : the dense and packed forms.
///
/// Examples
/// --------
/// >>> import numpy as np, kvselect
/// >>> cache = np.array([0, 2, 4, 6, -3, -1, 3, 3], np.float32).reshape(4, 2, 1)[::-1]
/// >>> table = np.array([[3, 2, 1, 0]], np.int32)
/// >>> kvselect.moba_select_paged(np.ones((1, 1, 1), np.float32), cache, table, [8], 1, 2, 2)
/// array([[[1, 3]]], dtype=int32)
#[pyfunction]
#[pyo3(
    signature = (q, kv_cache, block_table, seq_lens, n_kv_heads, topk, block_size, *,
                 page_layout=None, key_format=None, query_format=None, variant=None, out=None),
    text_signature = "(q, kv_cache, block_table, seq_lens, n_kv_heads, topk, block_size, *, \
                      page_layout='dense', key_format=None, query_format=None, \
                      variant='efficient', out=None)"
)]
#[allow(clippy::too_many_arguments)]
pub(super) fn moba_select_paged<'py>(
    py: Python<'py>,
    q: &Obj<'py>,
    kv_cache: &Obj<'py>,
    block_table: &Obj<'py>,
    seq_lens: &Obj<'py>,
    n_kv_heads: &Obj<'py>,
    topk: &Obj<'py>,
    block_size: &Obj<'py>,
    page_layout: Option<Named<PageLayoutName>>,
    key_format: Option<Named<KeyFormat>>,
    query_format: Option<Named<QueryFormat>>,
    variant: Option<Named<MobaVariantName>>,
    out: Opt<'_, 'py>,
) -> PyResult<I32<'py>> {
    let h = S.count(n_kv_heads, "n_kv_heads", I32_MAX)?;
    let topk = S.count(topk, "topk", I32_MAX)?;
    let bs = S.count(block_size, "block_size", I32_MAX)?;
    let v = self::variant(variant)?;
    let formats = (page_layout, key_format, query_format);
    let c = PagedDecode::read(py, (q, kv_cache, block_table, seq_lens), h, formats)?;
    let shape = Shape {
        heads: c.heads(),
        block_size: bs,
    };
    moba::check_settings(shape, Some(topk))?;
    let max_blocks = c.widest(|l| l.div_ceil(bs))?;
    let w = moba::width(v, topk, max_blocks);
    let out_shape = [c.lens.len(), c.n_q_heads, w];
    let work = out_shape.iter().product();
    c.run(py, out, &out_shape, work, |qs, cache, table, o| {
        moba::select_paged_into(qs, cache, table, shape, topk, v, o)
    })
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(moba_gates, m)?)?;
    m.add_function(wrap_pyfunction!(moba_select, m)?)?;
    m.add_function(wrap_pyfunction!(moba_select_paged, m)?)?;
    Ok(())
}
