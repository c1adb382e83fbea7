//! The attention pass: dense and sparse causal attention over the selected
//! keys, and the dense probabilities.
//!
//! Reads `q`, `k`, `v` (values in place when their rows are strided, MLA's
//! `kv[..., :d_v]`), the selected rows and `query_pos`. The rule: queries
//! and keys share `d`, values are read in place or copied once, and the
//! outputs are float32 (the log-sum-exp float64).

use numpy::{PyArrayDyn, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;

use crate::attention::{self, AttentionShape, Repeats};
use crate::metrics;
use crate::python::args::{
    convert, detach, ndarray, query_positions, Broadcast, In, Named, Obj, Opt, Out, Queries,
    StridedRows, F64, S,
};
use crate::python::errors::refuse;

/// `q` `[n_queries, n_q_heads, d_k]` and `k` `[n_keys, n_kv_heads, d_k]`,
/// float32, and the pass's shape (`d_v` to be filled in).
fn queries_and_keys<'py>(
    q: &Obj<'py>,
    k: &Obj<'py>,
) -> PyResult<(In<'py, f32, 3>, In<'py, f32, 3>, AttentionShape)> {
    let qa = S.input::<f32, 3>(q, "q", "[n_queries, n_q_heads, d_k]")?;
    let ka = S.input::<f32, 3>(k, "k", "[n_keys, n_kv_heads, d_k]")?;
    let ([n, hq, d], [nk, hkv, dk]) = (qa.shape, ka.shape);
    if d != dk {
        return Err(refuse(S, "q", format!("q has d_k={d} but k has d_k={dk}")));
    }
    let shape = AttentionShape {
        n_queries: n,
        n_q_heads: hq,
        n_kv_heads: hkv,
        d_k: d,
        d_v: 0,
        n_keys: nk,
    };
    Ok((qa, ka, shape))
}

/// The values argument `[n_keys, n_kv_heads, d_v]`, read in place when it
/// is float32 rows of `d_v` with a uniform row stride over (key, head) — a
/// C-order array, or MLA's `kv[..., :d_v]` view of the keys — else
/// converted once.
fn values<'py>(v: &Obj<'py>, shape: &AttentionShape) -> PyResult<StridedRows<'py, f32>> {
    let v = &S.arg(v, "v")?;
    let in_place = match v.cast::<PyArrayDyn<f32>>() {
        Ok(a) if a.ndim() == 3 => StridedRows::new(a, 2)?,
        _ => None,
    };
    let rows = match in_place {
        Some(r) => r,
        None => {
            let a = convert::<f32>(v, "v", S)?;
            S.dims::<3>(a.as_untyped(), "v", "[n_keys, n_kv_heads, d_v]")?;
            let bad_layout = || refuse(S, "v", "v has an unusable memory layout");
            StridedRows::new(&a, 2)?.ok_or_else(bad_layout)?
        }
    };
    if rows.shape[..2] != [shape.n_keys, shape.n_kv_heads] {
        let msg = format!(
            "v must be [n_keys={}, n_kv_heads={}, d_v], got {:?}",
            shape.n_keys, shape.n_kv_heads, rows.shape
        );
        return Err(refuse(S, "v", msg));
    }
    Ok(rows)
}

/// Dense causal attention probabilities: the rows recall is measured against.
///
/// Query ``i`` attends over keys ``0..=query_pos[i]`` with ``softmax(scale * q . k)``;
/// entries after its position are zero. A KV head serves its group of query heads (GQA).
///
/// Parameters
/// ----------
/// q : array_like of float32, [n_queries, n_q_heads, d_k]
///     The queries (other float dtypes converted once). Any CPU DLPack tensor too.
/// k : array_like of float32, [n_keys, n_kv_heads, d_k]
///     The keys; ``n_q_heads`` must be a multiple of ``n_kv_heads``.
/// query_pos : int or array_like of int, [n_queries]
///     Each query's position, >= 0. One integer is ``[query_pos]`` (``q`` keeps its query
///     axis, of length 1): never broadcast over many queries.
/// scale : float, optional
///     The softmax scale, finite; defaults to ``1 / sqrt(d_k)``.
/// out : ndarray of float64, [n_queries, n_q_heads, n_keys], optional
///     Filled in place and returned: exactly that shape, C-contiguous, writeable, aligned,
///     native byte order, sharing no input's memory (else refused: a refused call leaves it
///     untouched).
///
/// Returns
/// -------
/// ndarray of float64, [n_queries, n_q_heads, n_keys]
///     The probabilities, zeros after each query's position.
///
/// Raises
/// ------
/// SelectionError
///     (a ValueError; ``.argument`` names the argument) when ``q`` or ``k`` is not 3-D, or
///     their ``d_k`` differ (``q``); ``n_kv_heads`` is 0 or does not divide ``n_q_heads``
///     (``n_kv_heads`` / ``n_q_heads``); ``query_pos`` is negative or not ``[n_queries]``;
///     ``scale`` is not finite; ``out`` is refused (its shape, layout, read-only, or
///     sharing an input's memory).
/// TypeError
///     when ``q`` or ``k`` is not floats, ``query_pos`` is not integers, ``scale`` is not a
///     number, or ``out`` is not a float64 ndarray.
#[pyfunction]
#[pyo3(signature = (q, k, query_pos, *, scale=None, out=None))]
pub(super) fn attention_probabilities<'py>(
    py: Python<'py>,
    q: &Obj<'py>,
    k: &Obj<'py>,
    query_pos: &Obj<'py>,
    scale: Option<f64>,
    out: Opt<'_, 'py>,
) -> PyResult<F64<'py>> {
    let (qa, ka, shape) = queries_and_keys(q, k)?;
    let pos = query_positions(
        S,
        query_pos,
        "query_pos",
        Queries::AsMany,
        Broadcast::Refuse,
    )?;
    let scale = scale.unwrap_or_else(|| attention::softmax_scale(shape.d_k) as f64);
    shape.validate()?;
    let dims = [shape.n_queries, shape.n_q_heads, shape.n_keys];
    let mut inputs = vec![qa.untyped(), ka.untyped()];
    let raw = ndarray(query_pos);
    inputs.extend(raw.as_ref());
    let out = S.output::<f64>(py, out, &dims, &inputs)?;
    let (qs, ks) = (qa.slice()?, ka.slice()?);
    let work = dims
        .iter()
        .product::<usize>()
        .saturating_mul(shape.d_k.max(1));
    out.run(work, |os| {
        metrics::attention_probabilities(qs, ks, &shape, &pos, scale, os)
    })
}

/// A float32 output array.
type F32<'py> = Bound<'py, PyArrayDyn<f32>>;
/// `(out, lse, empty_rows)` of an attention pass.
type Pass<'py> = (F32<'py>, F32<'py>, usize);

/// The dense pass (`selection` None) or the sparse pass over `selection`.
fn attention_pass<'py>(
    py: Python<'py>,
    (q, k, v): (&Obj<'py>, &Obj<'py>, &Obj<'py>),
    query_pos: &Obj<'py>,
    selection: Opt<'_, 'py>,
    (scale, repeats): (Option<f64>, Repeats),
    (out, lse_out): (Opt<'_, 'py>, Opt<'_, 'py>),
) -> PyResult<Pass<'py>> {
    let (qa, ka, mut shape) = queries_and_keys(q, k)?;
    let va = values(v, &shape)?;
    let stride = va.stride;
    shape.d_v = va.row_len;
    let pos = query_positions(
        S,
        query_pos,
        "query_pos",
        Queries::AsMany,
        Broadcast::Refuse,
    )?;
    shape.validate()?;
    let what = "[n_queries, n_kv_heads, width]";
    let sel = selection
        .map(|s| S.input::<i32, 3>(s, "selection", what))
        .transpose()?;
    if let Some(s) = &sel {
        let want = [
            ("n_queries", shape.n_queries),
            ("n_kv_heads", shape.n_kv_heads),
            ("width", s.shape[2]),
        ];
        S.axes("selection", &s.shape, &want)?;
    }
    let scale = scale.map_or_else(|| attention::softmax_scale(shape.d_k), |s| s as f32);
    let (n, hq) = (shape.n_queries, shape.n_q_heads);
    let mut inputs = vec![qa.untyped(), ka.untyped(), va.untyped()];
    inputs.extend(sel.as_ref().map(|s| s.untyped()));
    let raw = ndarray(query_pos);
    inputs.extend(raw.as_ref());
    let mut out = S.output::<f32>(py, out, &[n, hq, shape.d_v], &inputs)?;
    inputs.push(out.untyped());
    let mut lse = match lse_out {
        Some(l) => S.buffer::<f32>(l, "lse_out", &[n, hq], &inputs)?,
        None => Out::<f32>::zeros(py, &[n, hq])?,
    };
    let (qs, ks, vs) = (qa.slice()?, ka.slice()?, va.slice());
    let (os, ls) = (out.slice()?, lse.slice()?);
    let per_key = (shape.d_k + shape.d_v).saturating_mul(shape.group().max(1));
    let empty = match &sel {
        Some(s) => {
            let (ss, width) = (s.slice()?, s.shape[2]);
            detach(py, ss.len().saturating_mul(per_key), || {
                attention::sparse_attention_counting(
                    qs, ks, vs, stride, &shape, &pos, ss, width, scale, repeats, os, ls,
                )
            })
        }
        None => detach(
            py,
            (n * shape.n_kv_heads)
                .saturating_mul(shape.n_keys)
                .saturating_mul(per_key),
            || attention::dense_attention(qs, ks, vs, stride, &shape, &pos, scale, os, ls),
        ),
    }?;
    Ok((out.finish(), lse.finish(), empty))
}

/// Dense causal attention: every query over the keys up to its position.
///
/// Query ``i`` attends over keys ``0..=query_pos[i]``; a KV head serves its group of query
/// heads (GQA). ``v`` may be MLA's strided ``kv[..., :d_v]`` view, read in place.
///
/// Parameters
/// ----------
/// q : array_like of float32, [n_queries, n_q_heads, d_k]
///     The queries (other float dtypes converted once). Any CPU DLPack tensor too.
/// k : array_like of float32, [n_keys, n_kv_heads, d_k]
///     The keys; ``n_q_heads`` must be a multiple of ``n_kv_heads``.
/// v : array_like of float32, [n_keys, n_kv_heads, d_v]
///     The values: read in place when float32 rows of ``d_v`` with a uniform row stride (a
///     C-order array, or MLA's ``kv[..., :d_v]`` view of the keys), else converted once.
/// query_pos : int or array_like of int, [n_queries]
///     Each query's position, >= 0. One integer is ``[query_pos]`` (``q`` keeps its query
///     axis, of length 1).
/// scale : float, optional
///     The softmax scale, finite; defaults to ``1 / sqrt(d_k)``.
/// out : ndarray of float32, [n_queries, n_q_heads, d_v], optional
///     Filled in place and returned: exactly that shape, C-contiguous, writeable, aligned,
///     native byte order, sharing no input's memory nor ``lse_out``'s (else refused: a
///     refused call leaves both untouched).
/// lse_out : ndarray of float32, [n_queries, n_q_heads], optional
///     The same for ``lse``.
///
/// Returns
/// -------
/// out : ndarray of float32, [n_queries, n_q_heads, d_v]
///     The attention output.
/// lse : ndarray of float32, [n_queries, n_q_heads]
///     Each row's log-sum-exp of its scaled scores (natural log).
///
/// Raises
/// ------
/// SelectionError
///     (a ValueError; ``.argument`` names the argument) when ``q``, ``k`` or ``v`` is not
///     3-D, ``q`` and ``k`` differ in ``d_k`` (``q``), or ``v`` is not ``[n_keys,
///     n_kv_heads, d_v]``; ``n_kv_heads`` is 0 or does not divide ``n_q_heads``;
///     ``query_pos`` is negative or not ``[n_queries]``; ``scale`` is not finite; ``out`` or
///     ``lse_out`` is refused (its shape, layout, read-only, or sharing memory).
/// TypeError
///     when an array is not of its dtype kind (int32 ``q``), ``query_pos`` is not integers,
///     ``scale`` is not a number, or ``out`` / ``lse_out`` is not a float32 ndarray.
#[pyfunction]
#[pyo3(signature = (q, k, v, query_pos, *, scale=None, out=None, lse_out=None))]
#[allow(clippy::too_many_arguments)]
pub(super) fn dense_attention<'py>(
    py: Python<'py>,
    q: &Obj<'py>,
    k: &Obj<'py>,
    v: &Obj<'py>,
    query_pos: &Obj<'py>,
    scale: Option<f64>,
    out: Opt<'_, 'py>,
    lse_out: Opt<'_, 'py>,
) -> PyResult<(F32<'py>, F32<'py>)> {
    let bufs = (out, lse_out);
    let (out, lse, _) =
        attention_pass(py, (q, k, v), query_pos, None, (scale, Repeats::Once), bufs)?;
    Ok((out, lse))
}

/// Sparse causal attention over ``selection``: each row attends to its selected keys only.
///
/// A KV head's row of ``selection`` serves its query-head group. A row attends to its
/// entries ``x`` with ``0 <= x <= min(query_pos[i], n_keys - 1)`` (negative entries are
/// padding, later ones are masked as future keys, duplicates count once unless
/// ``duplicates="each"``); a row that selects nothing gets zeros and ``lse = -inf`` and is
/// counted in ``empty_rows``.
/// ``query_pos``, ``out=`` and ``lse_out=`` as in :func:`dense_attention`.
///
/// Parameters
/// ----------
/// q : array_like of float32, [n_queries, n_q_heads, d_k]
///     The queries (other float dtypes converted once). Any CPU DLPack tensor too.
/// k : array_like of float32, [n_keys, n_kv_heads, d_k]
///     The keys; ``n_q_heads`` must be a multiple of ``n_kv_heads``.
/// v : array_like of float32, [n_keys, n_kv_heads, d_v]
///     The values, read in place as in :func:`dense_attention` (MLA's ``kv[..., :d_v]``).
/// query_pos : int or array_like of int, [n_queries]
///     Each query's position, >= 0 (one integer is ``[query_pos]``).
/// selection : array_like of int32, [n_queries, n_kv_heads, width]
///     Key indices per (query, KV head) row, e.g. :func:`positions_of_blocks`' rows.
/// scale : float, optional
///     The softmax scale, finite; defaults to ``1 / sqrt(d_k)``.
/// duplicates : str, optional
///     How a row counts an entry it repeats: ``"once"`` (the default: a selection is a
///     set) or ``"each"`` time it appears (the engines' sparse MLA kernels, which gather
///     every slot they read; docs/checking-sparse-attention.md).
/// out : ndarray of float32, [n_queries, n_q_heads, d_v], optional
///     Filled in place and returned: exactly that shape, C-contiguous, writeable, aligned,
///     native byte order, sharing no input's memory nor ``lse_out``'s (else refused: a
///     refused call leaves both untouched).
/// lse_out : ndarray of float32, [n_queries, n_q_heads], optional
///     The same for ``lse``.
///
/// Returns
/// -------
/// out : ndarray of float32, [n_queries, n_q_heads, d_v]
///     The attention output (zeros for an empty row).
/// lse : ndarray of float32, [n_queries, n_q_heads]
///     Each row's log-sum-exp of its scaled scores (``-inf`` for an empty row).
/// empty_rows : int
///     How many (query, query head) rows selected nothing.
///
/// Raises
/// ------
/// SelectionError
///     (a ValueError; ``.argument`` names the argument) as :func:`dense_attention`, when
///     ``selection`` is not ``[n_queries, n_kv_heads, width]``, and when ``duplicates`` is
///     not ``"once"`` or ``"each"``.
/// TypeError
///     as :func:`dense_attention`, and when ``selection`` is not integers or ``duplicates``
///     not a string.
#[pyfunction]
#[pyo3(
    signature = (q, k, v, query_pos, selection, *, scale=None,
                 duplicates=Named::known(Repeats::Once), out=None, lse_out=None),
    text_signature = "(q, k, v, query_pos, selection, *, scale=None, duplicates=\"once\", \
                      out=None, lse_out=None)"
)]
#[allow(clippy::too_many_arguments)]
pub(super) fn sparse_attention<'py>(
    py: Python<'py>,
    q: &Obj<'py>,
    k: &Obj<'py>,
    v: &Obj<'py>,
    query_pos: &Obj<'py>,
    selection: &Obj<'py>,
    scale: Option<f64>,
    duplicates: Named<Repeats>,
    out: Opt<'_, 'py>,
    lse_out: Opt<'_, 'py>,
) -> PyResult<Pass<'py>> {
    let repeats = duplicates.get()?;
    let bufs = (out, lse_out);
    attention_pass(
        py,
        (q, k, v),
        query_pos,
        Some(selection),
        (scale, repeats),
        bufs,
    )
}
