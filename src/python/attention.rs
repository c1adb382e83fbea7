//! The attention module: baseline selectors, the oracle top-k, the dense
//! and sparse causal passes, dense probabilities and output error (every
//! one raises `SelectionError`); and the thread and SIMD controls.

use numpy::{PyArray1, PyArrayDyn, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;

use super::args::{
    convert, detach, ndarray, query_positions, Args, In, Obj, Opt, Out, StridedRows, F64, I32,
};
use super::errors::{refuse, Domain};
use crate::attention::{self, AttentionShape, OracleTopK, Selector};
use crate::{metrics, pool, simd};

const S: Args = Args(Domain::Selection);
const I32_MAX: u64 = i32::MAX as u64;

/// A score-free baseline selector: which keys each query row of a causal sequence may see.
///
/// Query row ``i`` of a causal sequence sees keys ``0..=i``. Build one with
/// ``Selector.dense()``, ``Selector.local(window)``, ``Selector.random(budget, seed)`` or
/// ``Selector.sink_window(sinks, window)``; rows are distinct, ascending and causal.
/// Immutable, compares by value, hashable.
#[pyclass(name = "Selector", module = "kvselect", frozen, eq, hash)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct PySelector(Selector);

#[pymethods]
impl PySelector {
    /// Every causal key.
    ///
    /// Row ``i`` is keys ``0..=i``.
    ///
    /// Returns
    /// -------
    /// Selector
    ///     The dense selector.
    #[staticmethod]
    fn dense() -> Self {
        PySelector(Selector::Dense)
    }

    /// The ``window`` most recent keys, the query's own included.
    ///
    /// Parameters
    /// ----------
    /// window : int
    ///     How many keys a row holds at most: a non-negative integer, at most 2**31 - 1.
    ///
    /// Returns
    /// -------
    /// Selector
    ///     The local-window selector.
    ///
    /// Raises
    /// ------
    /// SelectionError
    ///     (a ValueError; ``.argument`` is ``window``) when ``window`` is negative or past
    ///     2**31 - 1.
    /// TypeError
    ///     when ``window`` is not an integer.
    #[staticmethod]
    fn local(window: &Obj) -> PyResult<Self> {
        let window = S.count(window, "window", I32_MAX)?;
        Ok(PySelector(Selector::Local { window }))
    }

    /// ``budget`` distinct keys drawn uniformly from the causal set.
    ///
    /// ChaCha8 keyed by ``seed`` on stream ``i`` (the row): deterministic per seed and row.
    ///
    /// Parameters
    /// ----------
    /// budget : int
    ///     Keys per row (all of them when the row has fewer): a non-negative integer, at most
    ///     2**31 - 1.
    /// seed : int
    ///     The generator's key, in ``0 .. 2**64 - 1``.
    ///
    /// Returns
    /// -------
    /// Selector
    ///     The random selector.
    ///
    /// Raises
    /// ------
    /// SelectionError
    ///     (a ValueError; ``.argument`` names the argument) when ``budget`` or ``seed`` is
    ///     negative or too large.
    /// TypeError
    ///     when ``budget`` or ``seed`` is not an integer.
    #[staticmethod]
    fn random(budget: &Obj, seed: &Obj) -> PyResult<Self> {
        let budget = S.count(budget, "budget", I32_MAX)?;
        let seed = S.count(seed, "seed", u64::MAX)? as u64;
        Ok(PySelector(Selector::Random { budget, seed }))
    }

    /// StreamingLLM: the first ``sinks`` keys plus the ``window`` most recent.
    ///
    /// Parameters
    /// ----------
    /// sinks : int
    ///     Keys at the start of the sequence every row keeps: non-negative, at most 2**31 - 1.
    /// window : int
    ///     The most recent keys, the query's own included: non-negative, at most 2**31 - 1.
    ///
    /// Returns
    /// -------
    /// Selector
    ///     The sink-plus-window selector.
    ///
    /// Raises
    /// ------
    /// SelectionError
    ///     (a ValueError; ``.argument`` names the argument) when ``sinks`` or ``window`` is
    ///     negative or past 2**31 - 1.
    /// TypeError
    ///     when ``sinks`` or ``window`` is not an integer.
    #[staticmethod]
    fn sink_window(sinks: &Obj, window: &Obj) -> PyResult<Self> {
        let sinks = S.count(sinks, "sinks", I32_MAX)?;
        let window = S.count(window, "window", I32_MAX)?;
        Ok(PySelector(Selector::SinkWindow { sinks, window }))
    }

    /// The candidates of query row ``row`` (keys ``0..=row``), ascending.
    ///
    /// Parameters
    /// ----------
    /// row : int
    ///     The query's position: a non-negative integer, at most 2**31 - 2.
    ///
    /// Returns
    /// -------
    /// ndarray of int32, [n_candidates]
    ///     The row's keys, distinct and ascending.
    ///
    /// Raises
    /// ------
    /// SelectionError
    ///     (a ValueError; ``.argument`` is ``row``) when ``row`` is negative or past 2**31 - 2.
    /// TypeError
    ///     when ``row`` is not an integer.
    fn row<'py>(&self, py: Python<'py>, row: &Obj<'py>) -> PyResult<Bound<'py, PyArray1<i32>>> {
        let row = S.count(row, "row", I32_MAX - 1)?;
        let sel = self.0;
        Ok(PyArray1::from_vec(
            py,
            detach(py, sel.row_len(row), || sel.row(row)),
        ))
    }

    /// The candidates of every query position in ``query_pos``, as fixed-width rows.
    ///
    /// Row ``r`` holds the candidates of position ``query_pos[r]`` (as :meth:`row`), ascending,
    /// then -1 up to ``width``.
    ///
    /// Parameters
    /// ----------
    /// query_pos : int or array_like of int, [n]
    ///     The query positions, each >= 0 (one integer for ``n = 1``).
    /// width : int, optional
    ///     The row width, at least the widest row's candidates; defaults to the widest row.
    /// out : ndarray of int32, [n, width], optional
    ///     Filled in place and returned: exactly ``[n, width]``, C-contiguous, writeable,
    ///     aligned, native byte order, sharing no input's memory (else refused: a refused call
    ///     leaves it untouched).
    ///
    /// Returns
    /// -------
    /// ndarray of int32, [n, width]
    ///     Each position's candidates, ascending, then -1.
    ///
    /// Raises
    /// ------
    /// SelectionError
    ///     (a ValueError; ``.argument`` names the argument) when ``query_pos`` is negative or
    ///     not 1-D; ``width`` is negative, past 2**31 - 1 or cannot hold a row's candidates;
    ///     ``out`` is refused (its shape, layout, read-only, or sharing an input's memory).
    /// TypeError
    ///     when ``query_pos`` or ``width`` is not integers, or ``out`` is not an int32 ndarray.
    /// MemoryError
    ///     when the output is too large to allocate.
    #[pyo3(signature = (query_pos, width=None, *, out=None))]
    fn rows<'py>(
        &self,
        py: Python<'py>,
        query_pos: &Obj<'py>,
        width: Opt<'_, 'py>,
        out: Opt<'_, 'py>,
    ) -> PyResult<I32<'py>> {
        let (sel, pos) = (self.0, query_positions(S, query_pos)?);
        let widest = || pos.iter().map(|&p| sel.row_len(p)).max().unwrap_or(0);
        let width = width_arg(width, widest)?;
        let raw = ndarray(query_pos);
        let inputs: Vec<_> = raw.iter().collect();
        let out = S.output::<i32>(py, out, &[pos.len(), width], &inputs)?;
        out.run(pos.len() * width, |os| sel.rows_into(&pos, width, os))
    }

    fn __repr__(&self) -> String {
        match self.0 {
            Selector::Dense => "Selector.dense()".into(),
            Selector::Local { window } => format!("Selector.local(window={window})"),
            Selector::Random { budget, seed } => {
                format!("Selector.random(budget={budget}, seed={seed})")
            }
            Selector::SinkWindow { sinks, window } => {
                format!("Selector.sink_window(sinks={sinks}, window={window})")
            }
        }
    }
}

/// An optional `width` count, else `default()`.
fn width_arg(width: Opt, default: impl FnOnce() -> usize) -> PyResult<usize> {
    width.map_or_else(|| Ok(default()), |w| S.count(w, "width", I32_MAX))
}

/// The oracle top-k: each row's ``budget`` heaviest causal keys of the dense attention.
///
/// For each row ``i`` of ``attention`` (the dense attention row of query position
/// ``query_pos[i]``), the ``budget`` keys with the largest weight among
/// ``0..=query_pos[i]``, ties to the lower key (NaN ranks as -inf), ascending then -1.
///
/// Parameters
/// ----------
/// attention : array_like of float64, [n, row_len]
///     Dense attention rows (other float dtypes converted once). Any CPU DLPack tensor too.
/// query_pos : int or array_like of int, [n]
///     Each row's query position, >= 0. One integer is ``[query_pos]`` (``attention`` keeps
///     its row axis, of length 1).
/// budget : int
///     Keys per row: non-negative, at most 2**31 - 1.
/// width : int, optional
///     The row width, at least every row's key count; defaults to the widest row.
/// out : ndarray of int32, [n, width], optional
///     Filled in place and returned: exactly ``[n, width]``, C-contiguous, writeable,
///     aligned, native byte order, sharing no input's memory (else refused: a refused call
///     leaves it untouched).
///
/// Returns
/// -------
/// ndarray of int32, [n, width]
///     Each row's selected keys, ascending, then -1.
///
/// Raises
/// ------
/// SelectionError
///     (a ValueError; ``.argument`` names the argument) when ``attention`` is not 2-D (or
///     its rows do not fit int32 offsets); ``query_pos`` is negative or has not one
///     position per attention row; ``budget`` or ``width`` is negative or past 2**31 - 1,
///     or ``width`` cannot hold a row; ``out`` is refused (its shape, layout, read-only, or
///     sharing an input's memory).
/// TypeError
///     when ``attention`` is not floats, ``query_pos``, ``budget`` or ``width`` is not
///     integers, or ``out`` is not an int32 ndarray.
#[pyfunction]
#[pyo3(signature = (attention, query_pos, budget, *, width=None, out=None))]
fn oracle_topk<'py>(
    py: Python<'py>,
    attention: &Obj<'py>,
    query_pos: &Obj<'py>,
    budget: &Obj<'py>,
    width: Opt<'_, 'py>,
    out: Opt<'_, 'py>,
) -> PyResult<I32<'py>> {
    let a = S.input::<f64, 2>(attention, "attention", "[n_rows, row_len]")?;
    let pos = query_positions(S, query_pos)?;
    let oracle = OracleTopK {
        budget: S.count(budget, "budget", I32_MAX)?,
    };
    let [n, row_len] = a.shape;
    let widest = || {
        pos.iter()
            .map(|&p| oracle.row_len(p, row_len))
            .max()
            .unwrap_or(0)
    };
    let width = width_arg(width, widest)?;
    if pos.len() != n {
        let msg = format!(
            "query_pos has {} positions for {n} attention rows",
            pos.len()
        );
        return Err(refuse(Domain::Selection, "query_pos", msg));
    }
    let mut inputs = vec![a.untyped()];
    let raw = ndarray(query_pos);
    inputs.extend(raw.as_ref());
    let out = S.output::<i32>(py, out, &[n, width], &inputs)?;
    let asl = a.slice()?;
    out.run(asl.len(), |os| {
        oracle.rows_into(asl, row_len, &pos, width, os)
    })
}

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
        return Err(refuse(
            Domain::Selection,
            "q",
            format!("q has d_k={d} but k has d_k={dk}"),
        ));
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
            let a = convert::<f32>(v, "v", Domain::Selection)?;
            S.dims::<3>(a.as_untyped(), "v", "[n_keys, n_kv_heads, d_v]")?;
            let bad_layout = || refuse(Domain::Selection, "v", "v has an unusable memory layout");
            StridedRows::new(&a, 2)?.ok_or_else(bad_layout)?
        }
    };
    if rows.shape[..2] != [shape.n_keys, shape.n_kv_heads] {
        let msg = format!(
            "v must be [n_keys={}, n_kv_heads={}, d_v], got {:?}",
            shape.n_keys, shape.n_kv_heads, rows.shape
        );
        return Err(refuse(Domain::Selection, "v", msg));
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
fn attention_probabilities<'py>(
    py: Python<'py>,
    q: &Obj<'py>,
    k: &Obj<'py>,
    query_pos: &Obj<'py>,
    scale: Option<f64>,
    out: Opt<'_, 'py>,
) -> PyResult<F64<'py>> {
    let (qa, ka, shape) = queries_and_keys(q, k)?;
    let pos = query_positions(S, query_pos)?;
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
    scale: Option<f64>,
    (out, lse_out): (Opt<'_, 'py>, Opt<'_, 'py>),
) -> PyResult<Pass<'py>> {
    let (qa, ka, mut shape) = queries_and_keys(q, k)?;
    let va = values(v, &shape)?;
    let stride = va.stride;
    shape.d_v = va.row_len;
    let pos = query_positions(S, query_pos)?;
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
                attention::sparse_attention(
                    qs, ks, vs, stride, &shape, &pos, ss, width, scale, os, ls,
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
fn dense_attention<'py>(
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
    let (out, lse, _) = attention_pass(py, (q, k, v), query_pos, None, scale, bufs)?;
    Ok((out, lse))
}

/// Sparse causal attention over ``selection``: each row attends to its selected keys only.
///
/// A KV head's row of ``selection`` serves its query-head group. A row attends to its
/// entries ``x`` with ``0 <= x <= min(query_pos[i], n_keys - 1)`` (negative entries are
/// padding, later ones are masked as future keys, duplicates count once); a row that
/// selects nothing gets zeros and ``lse = -inf`` and is counted in ``empty_rows``.
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
///     (a ValueError; ``.argument`` names the argument) as :func:`dense_attention`, and when
///     ``selection`` is not ``[n_queries, n_kv_heads, width]``.
/// TypeError
///     as :func:`dense_attention`, and when ``selection`` is not integers.
#[pyfunction]
#[pyo3(signature = (q, k, v, query_pos, selection, *, scale=None, out=None, lse_out=None))]
#[allow(clippy::too_many_arguments)]
fn sparse_attention<'py>(
    py: Python<'py>,
    q: &Obj<'py>,
    k: &Obj<'py>,
    v: &Obj<'py>,
    query_pos: &Obj<'py>,
    selection: &Obj<'py>,
    scale: Option<f64>,
    out: Opt<'_, 'py>,
    lse_out: Opt<'_, 'py>,
) -> PyResult<Pass<'py>> {
    let bufs = (out, lse_out);
    attention_pass(py, (q, k, v), query_pos, Some(selection), scale, bufs)
}

/// ``‖sparse − dense‖ / ‖dense‖`` per row over the last axis.
///
/// Parameters
/// ----------
/// sparse : array_like of float32, [..., width]
///     At least 1-D (other float dtypes converted once). Any CPU DLPack tensor too.
/// dense : array_like of float32, [..., width]
///     Of ``sparse``'s shape, checked axis by axis.
/// out : ndarray of float64, [...], optional
///     Filled in place and returned: exactly the leading shape, C-contiguous, writeable,
///     aligned, native byte order, sharing no input's memory (else refused: a refused call
///     leaves it untouched).
///
/// Returns
/// -------
/// ndarray of float64, [...]
///     Each row's relative error, of the leading shape.
///
/// Raises
/// ------
/// SelectionError
///     (a ValueError; ``.argument`` names the argument) when ``sparse`` is 0-D, ``dense``
///     has another shape (``dense``), or ``out`` is refused (its shape, layout, read-only,
///     or sharing an input's memory).
/// TypeError
///     when an input is not floats, or ``out`` is not a float64 ndarray.
#[pyfunction]
#[pyo3(signature = (sparse, dense, *, out=None))]
fn output_relative_error_rows<'py>(
    py: Python<'py>,
    sparse: &Obj<'py>,
    dense: &Obj<'py>,
    out: Opt<'_, 'py>,
) -> PyResult<F64<'py>> {
    let (s, shape) = S.input_dyn::<f32>(sparse, "sparse")?;
    let (d, dense_shape) = S.input_dyn::<f32>(dense, "dense")?;
    let Some((&width, lead)) = shape.split_last() else {
        let msg = "sparse must be at least 1-D [..., width], got a 0-D array";
        return Err(refuse(Domain::Selection, "sparse", msg));
    };
    same_shape(&shape, &dense_shape)?;
    let out = S.output::<f64>(py, out, lead, &[s.untyped(), d.untyped()])?;
    let (ss, ds) = (s.slice()?, d.slice()?);
    out.run(ss.len(), |os| {
        metrics::output_relative_error_rows(ss, ds, width, os)
    })
}

/// Refuses a `dense` whose shape is not `sparse`'s, axis by axis (the
/// refusal names `dense` and both shapes).
fn same_shape(sparse: &[usize], dense: &[usize]) -> PyResult<()> {
    let names: Vec<String> = (0..sparse.len()).map(|i| format!("axis{i}")).collect();
    let want: Vec<(&str, usize)> = names
        .iter()
        .map(String::as_str)
        .zip(sparse.iter().copied())
        .collect();
    S.axes("dense", dense, &want)
}

/// ``‖sparse − dense‖ / ‖dense‖`` over whole arrays of one shape.
///
/// Parameters
/// ----------
/// sparse : array_like of float32
///     Any shape (other float dtypes converted once). Any CPU DLPack tensor too.
/// dense : array_like of float32
///     Of ``sparse``'s shape, checked axis by axis.
///
/// Returns
/// -------
/// float
///     The relative error, computed in float64.
///
/// Raises
/// ------
/// SelectionError
///     (a ValueError; ``.argument`` is ``dense``) when ``dense`` has another shape.
/// TypeError
///     when an input is not floats.
#[pyfunction]
fn output_relative_error(sparse: &Obj, dense: &Obj) -> PyResult<f64> {
    let (s, shape) = S.input_dyn::<f32>(sparse, "sparse")?;
    let (d, dense_shape) = S.input_dyn::<f32>(dense, "dense")?;
    same_shape(&shape, &dense_shape)?;
    Ok(metrics::output_relative_error(s.slice()?, d.slice()?)?)
}

/// Sets the number of threads kvselect's parallel paths use.
///
/// Parameters
/// ----------
/// n : int
///     The thread count, at most 65536; 0 restores the default (``RAYON_NUM_THREADS``, else
///     every core).
///
/// Returns
/// -------
/// None
///
/// Raises
/// ------
/// KvselectError
///     (a ValueError; ``.argument`` is ``n``) when ``n`` is negative or past 65536.
/// TypeError
///     when ``n`` is not an integer.
#[pyfunction]
fn set_num_threads(n: &Obj) -> PyResult<()> {
    pool::set_num_threads(Args(Domain::Base).count(n, "n", 1 << 16)?);
    Ok(())
}

/// The number of threads kvselect's parallel paths use.
///
/// Returns
/// -------
/// int
///     The thread count (:func:`set_num_threads` sets it).
#[pyfunction]
fn get_num_threads() -> usize {
    pool::num_threads()
}

/// The best instruction-set level the SIMD kernels dispatched to on this CPU.
///
/// "avx512" (block selection, the indexer and attention; the other kernels run AVX2),
/// "avx2" or "scalar". ``KVSELECT_SIMD=avx2`` or ``=scalar`` in the environment caps it.
///
/// Returns
/// -------
/// str
///     "avx512", "avx2" or "scalar".
#[pyfunction]
fn simd_level() -> &'static str {
    simd::level().name()
}

/// Benchmarks' floor (private): ``iters`` steps of a register-resident FMA
/// loop on every pool thread at the best SIMD level; returns ``(flops,
/// checksum)``, the caller times the call.
#[pyfunction]
fn _fma_floor(py: Python<'_>, iters: &Obj) -> PyResult<(u64, f32)> {
    let iters = Args(Domain::Base).count(iters, "iters", 1 << 40)?;
    Ok(py.detach(|| simd::fma_floor(iters)))
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySelector>()?;
    m.add_function(wrap_pyfunction!(_fma_floor, m)?)?;
    m.add_function(wrap_pyfunction!(oracle_topk, m)?)?;
    m.add_function(wrap_pyfunction!(attention_probabilities, m)?)?;
    m.add_function(wrap_pyfunction!(dense_attention, m)?)?;
    m.add_function(wrap_pyfunction!(sparse_attention, m)?)?;
    m.add_function(wrap_pyfunction!(output_relative_error, m)?)?;
    m.add_function(wrap_pyfunction!(output_relative_error_rows, m)?)?;
    m.add_function(wrap_pyfunction!(set_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(get_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(simd_level, m)?)?;
    Ok(())
}
