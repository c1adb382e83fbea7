//! The lightning indexer's score matrix and its error scales: what
//! `check_topk` judges an engine's rows against.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::python::args::{
    refuse_extra_keywords, AsFormatArg, KeyFormat, Named, Obj, Opt, QueryFormat,
};

use crate::indexer::Activation;

use super::call::{ratio, Call};
use crate::python::args::{positions as positions_of, S};

/// The arguments every entry point of this file reads alike (the operands,
/// then the keys' scale and formats and the compress ratio), read once.
fn score_call<'py>(
    common: (&Obj<'py>, &Obj<'py>, &Obj<'py>, &Obj<'py>),
    (key_scale, key_format, query_format, compress_ratio): (
        Opt<'_, 'py>,
        Option<Named<KeyFormat>>,
        Option<Named<QueryFormat>>,
        Opt<'_, 'py>,
    ),
) -> PyResult<Call<'py>> {
    let mut call = Call::inputs(
        common,
        (
            key_scale,
            key_format.format_arg(),
            query_format.format_arg(),
        ),
    )?;
    call.ratio = ratio(compress_ratio)?;
    Ok(call)
}

/// Every query's exact score of every key it sees.
///
/// The scores :func:`indexer_topk` ranks, bit for bit — what :func:`check_topk` judges an
/// engine's rows against. Builds the whole ``[n_queries, n_keys]`` matrix: a checking tool, not
/// a serving path. Their error scales are :func:`indexer_magnitudes`.
///
/// Parameters
/// ----------
/// index_q, weights, index_k, query_pos, key_scale, key_format, query_format, compress_ratio
///     As :func:`indexer_topk` takes them (``weights=None``: no weights, every head's 1).
/// activation : str, optional
///     "relu" (default) or "none", as :func:`indexer_topk` takes it.
/// out : ndarray of float32, [n_queries, n_keys], optional
///     Written and returned: C-contiguous, writeable, aligned, native byte order, not
///     overlapping any input.
///
/// Returns
/// -------
/// ndarray of float32, [n_queries, n_keys]
///     Each query's scores, NaN past its context (``L`` keys, as :func:`indexer_topk` counts
///     them).
///
/// Raises
/// ------
/// SelectionError
///     (a ValueError; ``.argument`` names the argument) as :func:`indexer_topk`. Nothing is
///     written.
/// TypeError
///     On an argument of the wrong type or dtype.
#[pyfunction]
#[pyo3(
    signature = (index_q, weights, index_k, query_pos, *, key_scale=None, key_format=None,
                 query_format=None, compress_ratio=None, activation=None, out=None, **renamed),
    text_signature = "(index_q, weights, index_k, query_pos, *, key_scale=None, key_format=None, \
                      query_format=None, compress_ratio=1, activation='relu', out=None)"
)]
pub(super) fn indexer_scores<'py>(
    py: Python<'py>,
    index_q: &Obj<'py>,
    weights: &Obj<'py>,
    index_k: &Obj<'py>,
    query_pos: &Obj<'py>,
    key_scale: Opt<'_, 'py>,
    key_format: Option<Named<KeyFormat>>,
    query_format: Option<Named<QueryFormat>>,
    compress_ratio: Opt<'_, 'py>,
    activation: Option<Named<Activation>>,
    out: Opt<'_, 'py>,
    renamed: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, numpy::PyArrayDyn<f32>>> {
    let was = [(
        "magnitudes",
        "magnitudes=True is now its own function, indexer_magnitudes",
    )];
    refuse_extra_keywords("indexer_scores", renamed, &was)?;
    let common = (index_q, weights, index_k, query_pos);
    let call = score_call(common, (key_scale, key_format, query_format, compress_ratio))?;
    let activation = activation.map(|a| a.get()).transpose()?.unwrap_or_default();
    call.score_matrix(py, out, activation, false)
}

/// Each :func:`indexer_scores` entry's error scale.
///
/// ``|key_scale[t]| * sum_h |weights[h]| * sum_i |index_q[h, i] * index_k[t, i]|``: the
/// ``magnitudes`` of :func:`check_topk` (its ``rtol`` multiplies them). The same under either
/// activation (both pass ``|q . k|`` through; ``weights=None`` is weights of one).
///
/// Parameters
/// ----------
/// index_q, weights, index_k, query_pos, key_scale, key_format, query_format, compress_ratio
///     As :func:`indexer_topk` takes them.
/// out : ndarray of float32, [n_queries, n_keys], optional
///     As :func:`indexer_scores` takes it.
///
/// Returns
/// -------
/// ndarray of float32, [n_queries, n_keys]
///     The magnitudes, NaN past each query's context.
///
/// Raises
/// ------
/// SelectionError
///     (a ValueError; ``.argument`` names the argument) as :func:`indexer_topk`. Nothing is
///     written.
/// TypeError
///     On an argument of the wrong type or dtype.
#[pyfunction]
#[pyo3(
    signature = (index_q, weights, index_k, query_pos, *, key_scale=None, key_format=None,
                 query_format=None, compress_ratio=None, out=None),
    text_signature = "(index_q, weights, index_k, query_pos, *, key_scale=None, key_format=None, \
                      query_format=None, compress_ratio=1, out=None)"
)]
pub(super) fn indexer_magnitudes<'py>(
    py: Python<'py>,
    index_q: &Obj<'py>,
    weights: &Obj<'py>,
    index_k: &Obj<'py>,
    query_pos: &Obj<'py>,
    key_scale: Opt<'_, 'py>,
    key_format: Option<Named<KeyFormat>>,
    query_format: Option<Named<QueryFormat>>,
    compress_ratio: Opt<'_, 'py>,
    out: Opt<'_, 'py>,
) -> PyResult<Bound<'py, numpy::PyArrayDyn<f32>>> {
    let common = (index_q, weights, index_k, query_pos);
    let call = score_call(common, (key_scale, key_format, query_format, compress_ratio))?;
    call.score_matrix(py, out, Activation::Relu, true)
}

/// Chosen scores in float64 (private: the exact check's re-score).
///
/// Query ``rows[j]``'s score of key ``positions[j]``, for each ``j``, the other arguments as
/// :func:`indexer_scores` takes them (no ``out``): every product of two decoded operands
/// exact, the sums in float64 (the same bits at every SIMD level), so within ``γ_{d+H+2}``
/// (units of ``2^-53``) of ``|c_t| Σ_h |w_h| Σ_i |q_hi k_ti|`` of the real score. Pairs of
/// one row are best given together. A row past the queries or a position past its query's
/// context is refused.
#[pyfunction]
#[pyo3(
    signature = (index_q, weights, index_k, query_pos, rows, positions, *, key_scale=None,
                 key_format=None, query_format=None, compress_ratio=None),
    text_signature = "(index_q, weights, index_k, query_pos, rows, positions, *, key_scale=None, \
                      key_format=None, query_format=None, compress_ratio=1)"
)]
#[allow(clippy::too_many_arguments)]
pub(super) fn _indexer_rescore<'py>(
    py: Python<'py>,
    index_q: &Obj<'py>,
    weights: &Obj<'py>,
    index_k: &Obj<'py>,
    query_pos: &Obj<'py>,
    rows: &Obj<'py>,
    positions: &Obj<'py>,
    key_scale: Opt<'_, 'py>,
    key_format: Option<Named<KeyFormat>>,
    query_format: Option<Named<QueryFormat>>,
    compress_ratio: Opt<'_, 'py>,
) -> PyResult<Bound<'py, numpy::PyArrayDyn<f64>>> {
    let call = score_call(
        (index_q, weights, index_k, query_pos),
        (key_scale, key_format, query_format, compress_ratio),
    )?;
    let rows = positions_of(S, rows, "rows")?;
    let positions = positions_of(S, positions, "positions")?;
    call.rescore(py, &rows, &positions)
}

/// Every score and its magnitude in float64 (private: the exact check's dense re-score).
///
/// ``[n_queries, 2, n_keys]``: ``[:, 0]`` each query's score of every key it sees,
/// :func:`_indexer_rescore`'s score of each pair, bit for bit (each key decoded once per
/// group of queries); ``[:, 1]`` its magnitude ``|c_t| Σ_h |w_h| Σ_i |q_hi k_ti|``; NaN
/// past the query's context (``L`` keys, as :func:`indexer_topk` counts them). The arguments as
/// :func:`indexer_scores` takes them (no ``out``). What the exact check computes where its
/// float32 screen would leave every position in the band (low-contrast rows).
#[pyfunction]
#[pyo3(
    signature = (index_q, weights, index_k, query_pos, *, key_scale=None, key_format=None,
                 query_format=None, compress_ratio=None),
    text_signature = "(index_q, weights, index_k, query_pos, *, key_scale=None, key_format=None, \
                      query_format=None, compress_ratio=1)"
)]
#[allow(clippy::too_many_arguments)]
pub(super) fn _indexer_rescore_all<'py>(
    py: Python<'py>,
    index_q: &Obj<'py>,
    weights: &Obj<'py>,
    index_k: &Obj<'py>,
    query_pos: &Obj<'py>,
    key_scale: Opt<'_, 'py>,
    key_format: Option<Named<KeyFormat>>,
    query_format: Option<Named<QueryFormat>>,
    compress_ratio: Opt<'_, 'py>,
) -> PyResult<Bound<'py, numpy::PyArrayDyn<f64>>> {
    let call = score_call(
        (index_q, weights, index_k, query_pos),
        (key_scale, key_format, query_format, compress_ratio),
    )?;
    call.rescore_all(py)
}

/// The exact check's verdict of each row from every float64 score (private: the dense check).
///
/// From :func:`_indexer_rescore_all`'s scores ``s`` and magnitudes ``m`` of every key a row
/// sees, no score kept: with ``e = atol + rtol m``, ``[n_queries, 5]``: the highest ``s - e``
/// of an unselected key, the lowest ``s + e`` of a selected one, the highest ``s - e`` and the
/// lowest ``s + e`` of any key (``-inf`` / ``inf`` when there is none), and how many distinct
/// keys the row selects. ``positions`` (integer ``[n_queries, width]``) is each row's
/// selection; entries outside the row's context (``-1`` among them) select nothing. The other
/// arguments as :func:`indexer_scores` takes them (no ``out``).
#[pyfunction]
#[pyo3(
    signature = (index_q, weights, index_k, query_pos, positions, *, atol, rtol, key_scale=None,
                 key_format=None, query_format=None, compress_ratio=None),
    text_signature = "(index_q, weights, index_k, query_pos, positions, *, atol, rtol, \
                      key_scale=None, key_format=None, query_format=None, compress_ratio=1)"
)]
#[allow(clippy::too_many_arguments)]
pub(super) fn _indexer_rescore_verdict<'py>(
    py: Python<'py>,
    index_q: &Obj<'py>,
    weights: &Obj<'py>,
    index_k: &Obj<'py>,
    query_pos: &Obj<'py>,
    positions: &Obj<'py>,
    atol: f64,
    rtol: f64,
    key_scale: Opt<'_, 'py>,
    key_format: Option<Named<KeyFormat>>,
    query_format: Option<Named<QueryFormat>>,
    compress_ratio: Opt<'_, 'py>,
) -> PyResult<Bound<'py, numpy::PyArrayDyn<f64>>> {
    let call = score_call(
        (index_q, weights, index_k, query_pos),
        (key_scale, key_format, query_format, compress_ratio),
    )?;
    let p = S.input::<i64, 2>(positions, "positions", "[n_queries, width]")?;
    let width = p.shape[1];
    let want = [("n_queries", call.shape.n_queries), ("width", width)];
    S.axes("positions", &p.shape, &want)?;
    call.rescore_verdict(py, p.slice()?, width, atol, rtol)
}
