//! The KV-eviction baselines' selection (`kvselect eval --boundary`'s
//! SnapKV, PyramidKV, TOVA, H2O and ObservedAttention): their scores, H2O's
//! greedy eviction and the order that keeps the top (all raise
//! `SelectionError`).

use numpy::{PyArrayDyn, PyUntypedArray};
use pyo3::prelude::*;

use super::args::{detach, Obj, Opt, S};
use crate::attention::softmax_scale;
use crate::eviction::{self, Prefix};

type F64s<'py> = Bound<'py, PyArrayDyn<f64>>;
type I64s<'py> = Bound<'py, PyArrayDyn<i64>>;

/// The largest count a call takes (kept positions are `int64`).
const BUDGET_MAX: u64 = i64::MAX as u64;

/// The checked prefix arrays: queries `[P, group, d]`, keys `[P, d]`.
struct Arrays<'py> {
    q: super::args::In<'py, f32, 3>,
    k: super::args::In<'py, f32, 2>,
}

impl<'py> Arrays<'py> {
    /// The arrays, for `out=`'s overlap check.
    fn untyped(&self) -> [&Bound<'py, PyUntypedArray>; 2] {
        [self.q.untyped(), self.k.untyped()]
    }

    fn new(q: &Obj<'py>, k: &Obj<'py>) -> PyResult<Self> {
        let q = S.input::<f32, 3>(q, "q", "[P, group, d]")?;
        let k = S.input::<f32, 2>(k, "k", "[P, d]")?;
        let [p, _, d] = q.shape;
        S.axes("k", &k.shape, &[("P", p), ("d", d)])?;
        Ok(Arrays { q, k })
    }

    fn prefix(&self, scale: Option<f64>) -> PyResult<Prefix<'_>> {
        let [p_len, group, d] = self.q.shape;
        Ok(Prefix {
            q: self.q.slice()?,
            k: self.k.slice()?,
            p_len,
            group,
            d,
            scale: scale.unwrap_or_else(|| softmax_scale(d) as f64),
        })
    }
}

/// SnapKV's score of every prefix position (kvpress ``SnapKVPress.score``), float64.
///
/// The last ``window`` queries' causal attention over the keys before the window, summed
/// over those queries in order and divided by ``window``; average-pooled (``kernel``
/// taps, zero padding of ``kernel // 2``, divided by ``kernel``); summed over the group's
/// heads and divided by ``group``; the window's positions one padded score, the maximum
/// plus 1. The softmax is :func:`attention_probabilities`' float64 arithmetic, so the
/// scores equal :func:`kvselect.reference.snapkv_scores` bit for bit.
///
/// Parameters
/// ----------
/// q : array_like of float32, [P, group, d]
///     The prefix's queries, the query heads of one KV head.
/// k : array_like of float32, [P, d]
///     That KV head's keys.
/// window : int, optional
///     The observation window, ``1 <= window < P`` (default 64).
/// kernel : int, optional
///     The pooling's taps, at least 1 (default 5).
/// scale : float, optional
///     The softmax scale (default ``1 / sqrt(d)``).
/// out : ndarray of float64, [P], optional
///     ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
///     aligned, native byte order, not overlapping any input (else refused, nothing written).
///
/// Returns
/// -------
/// ndarray of float64, [P]
///     Each position's score.
///
/// Raises
/// ------
/// SelectionError
///     (a ValueError; ``.argument`` names it) when ``q`` is not 3-D, holds no query head
///     or a non-finite value (``q``); ``k`` is not ``[P, d]`` or not finite (``k``);
///     ``scale`` is not finite or could overflow a score (``scale``); ``window`` is not
///     in ``1..P-1`` (``window``); ``kernel`` is 0 (``kernel``).
///     Also when ``out`` is refused (its shape, layout, read-only, or overlapping an input).
/// TypeError
///     when ``out`` is not a float64 ndarray.
///
/// See Also
/// --------
/// keep_top : the kept positions of these scores.
/// kvselect.reference.snapkv_scores : the NumPy twin.
///
/// Examples
/// --------
/// >>> import numpy as np, kvselect
/// >>> rng = np.random.default_rng(0)
/// >>> q = rng.standard_normal((12, 2, 8)).astype(np.float32)
/// >>> k = rng.standard_normal((12, 8)).astype(np.float32)
/// >>> s = kvselect.snapkv_scores(q, k, window=4)
/// >>> s.shape, bool((s[8:] == s.max()).all())
/// ((12,), True)
#[pyfunction]
#[pyo3(
    signature = (q, k, *, window=None, kernel=None, scale=None, out=None),
    text_signature = "(q, k, *, window=64, kernel=5, scale=None, out=None)"
)]
pub(super) fn snapkv_scores<'py>(
    py: Python<'py>,
    q: &Obj<'py>,
    k: &Obj<'py>,
    window: Opt<'_, 'py>,
    kernel: Opt<'_, 'py>,
    scale: Option<f64>,
    out: Opt<'_, 'py>,
) -> PyResult<F64s<'py>> {
    let window = S.count_or(window, "window", BUDGET_MAX, 64)?;
    let kernel = S.count_or(kernel, "kernel", BUDGET_MAX, 5)?;
    let a = Arrays::new(q, k)?;
    let pre = a.prefix(scale)?;
    let out = S.output(py, out, &[pre.p_len], &a.untyped())?;
    let work = window.saturating_mul(pre.p_len).saturating_mul(pre.group);
    let v = detach(py, work, || eviction::snapkv_scores(&pre, window, kernel))?;
    out.deliver(v.into_iter())
}

/// TOVA's score of every prefix position (kvpress ``TOVAPress.score``), float64.
///
/// The last query's attention (position ``P - 1``, its ``group`` heads) over the keys
/// before it, summed over the heads and divided by ``group``; the last position padded
/// with the maximum plus 1. Equal to :func:`kvselect.reference.tova_scores` bit for bit.
///
/// Parameters
/// ----------
/// q_last : array_like of float32, [group, d]
///     The last prefix query's heads.
/// k : array_like of float32, [P, d]
///     The KV head's keys, ``P >= 1``.
/// scale : float, optional
///     The softmax scale (default ``1 / sqrt(d)``).
/// out : ndarray of float64, [P], optional
///     ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
///     aligned, native byte order, not overlapping any input (else refused, nothing written).
///
/// Returns
/// -------
/// ndarray of float64, [P]
///     Each position's score.
///
/// Raises
/// ------
/// SelectionError
///     (a ValueError; ``.argument`` names it) when ``q_last`` is not 2-D, holds no head
///     or a non-finite value (``q_last``); ``k`` is not ``[P, d]``, empty or not finite
///     (``k``); ``scale`` is not finite or could overflow a score (``scale``).
///     Also when ``out`` is refused (its shape, layout, read-only, or overlapping an input).
/// TypeError
///     when ``out`` is not a float64 ndarray.
///
/// See Also
/// --------
/// keep_top : the kept positions of these scores.
/// kvselect.reference.tova_scores : the NumPy twin.
///
/// Examples
/// --------
/// >>> import numpy as np, kvselect
/// >>> k = np.eye(4, dtype=np.float32)
/// >>> q_last = np.zeros((1, 4), dtype=np.float32)
/// >>> kvselect.tova_scores(q_last, k).tolist()
/// [0.25, 0.25, 0.25, 1.25]
#[pyfunction]
#[pyo3(signature = (q_last, k, *, scale=None, out=None))]
pub(super) fn tova_scores<'py>(
    py: Python<'py>,
    q_last: &Obj<'py>,
    k: &Obj<'py>,
    scale: Option<f64>,
    out: Opt<'_, 'py>,
) -> PyResult<F64s<'py>> {
    let q = S.input::<f32, 2>(q_last, "q_last", "[group, d]")?;
    let ka = S.input::<f32, 2>(k, "k", "[P, d]")?;
    let [group, d] = q.shape;
    let p_len = ka.shape[0];
    S.axes("k", &ka.shape, &[("P", p_len), ("d", d)])?;
    let scale = scale.unwrap_or_else(|| softmax_scale(d) as f64);
    let out = S.output(py, out, &[p_len], &[q.untyped(), ka.untyped()])?;
    let (qs, ks) = (q.slice()?, ka.slice()?);
    let work = p_len.saturating_mul(group).saturating_mul(d);
    let v = detach(py, work, || {
        eviction::tova_scores(qs, ks, p_len, group, d, scale)
    })?;
    out.deliver(v.into_iter())
}

/// ObservedAttention's score of every prefix position (kvpress
/// ``ObservedAttentionPress``), float64.
///
/// Every prefix query's causal attention summed per key in query order, divided by the
/// ``P - j`` queries that see key ``j``, summed over the group's heads and divided by
/// ``group``. Equal to :func:`kvselect.reference.observed_attention_scores` bit for bit.
///
/// Parameters
/// ----------
/// q : array_like of float32, [P, group, d]
///     The prefix's queries, the query heads of one KV head.
/// k : array_like of float32, [P, d]
///     That KV head's keys.
/// scale : float, optional
///     The softmax scale (default ``1 / sqrt(d)``).
/// out : ndarray of float64, [P], optional
///     ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
///     aligned, native byte order, not overlapping any input (else refused, nothing written).
///
/// Returns
/// -------
/// ndarray of float64, [P]
///     Each position's score.
///
/// Raises
/// ------
/// SelectionError
///     (a ValueError; ``.argument`` names it) when ``q`` is not 3-D, holds no query head
///     or a non-finite value (``q``); ``k`` is not ``[P, d]`` or not finite (``k``);
///     ``scale`` is not finite or could overflow a score (``scale``).
///     Also when ``out`` is refused (its shape, layout, read-only, or overlapping an input).
/// TypeError
///     when ``out`` is not a float64 ndarray.
///
/// See Also
/// --------
/// keep_top : the kept positions of these scores.
/// kvselect.reference.observed_attention_scores : the NumPy twin.
///
/// Examples
/// --------
/// >>> import numpy as np, kvselect
/// >>> q = np.zeros((3, 1, 2), dtype=np.float32)
/// >>> k = np.ones((3, 2), dtype=np.float32)
/// >>> [round(x, 4) for x in kvselect.observed_attention_scores(q, k).tolist()]
/// [0.6111, 0.4167, 0.3333]
#[pyfunction]
#[pyo3(signature = (q, k, *, scale=None, out=None))]
pub(super) fn observed_attention_scores<'py>(
    py: Python<'py>,
    q: &Obj<'py>,
    k: &Obj<'py>,
    scale: Option<f64>,
    out: Opt<'_, 'py>,
) -> PyResult<F64s<'py>> {
    let a = Arrays::new(q, k)?;
    let pre = a.prefix(scale)?;
    let out = S.output(py, out, &[pre.p_len], &a.untyped())?;
    let work = pre
        .p_len
        .saturating_mul(pre.p_len)
        .saturating_mul(pre.group);
    let v = detach(py, work, || eviction::observed_attention_scores(&pre))?;
    out.deliver(v.into_iter())
}

/// H2O's cache after the prefix (FMInference/H2O ``H2OKVCache_LayerWise``): the greedy
/// per-step eviction, frozen at the boundary.
///
/// Token ``t`` joins the cache; its query heads' attention over the cache (softmax over
/// the cached keys only) is added to each cached position's score, head by head; when the
/// cache exceeds ``budget``, the position last in the order (score descending, ties to the
/// lower position) among all but the ``recent`` newest is evicted with its score. Equal
/// to :func:`kvselect.reference.h2o_keep`.
///
/// Parameters
/// ----------
/// q : array_like of float32, [P, group, d]
///     The prefix's queries, the query heads of one KV head.
/// k : array_like of float32, [P, d]
///     That KV head's keys.
/// budget : int
///     Positions kept.
/// recent : int
///     The newest positions always kept, ``0 <= recent <= budget``.
/// scale : float, optional
///     The softmax scale (default ``1 / sqrt(d)``).
/// out : ndarray of int64, [min(budget, P)], optional
///     ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
///     aligned, native byte order, not overlapping any input (else refused, nothing written).
///
/// Returns
/// -------
/// ndarray of int64, [min(budget, P)]
///     The kept positions, ascending.
///
/// Raises
/// ------
/// SelectionError
///     (a ValueError; ``.argument`` names it) when ``q`` is not 3-D, holds no query head
///     or a non-finite value (``q``); ``k`` is not ``[P, d]`` or not finite (``k``);
///     ``scale`` is not finite or could overflow a score (``scale``); ``budget`` or
///     ``recent`` is negative, or ``recent`` exceeds ``budget`` (``recent``).
///     Also when ``out`` is refused (its shape, layout, read-only, or overlapping an input).
/// TypeError
///     when ``out`` is not an int64 ndarray.
///
/// See Also
/// --------
/// kvselect.reference.h2o_keep : the NumPy twin.
///
/// Examples
/// --------
/// >>> import numpy as np, kvselect
/// >>> q = np.zeros((4, 1, 2), dtype=np.float32)
/// >>> k = np.ones((4, 2), dtype=np.float32)
/// >>> kvselect.h2o_keep(q, k, 2, recent=1).tolist()
/// [0, 3]
#[pyfunction]
#[pyo3(signature = (q, k, budget, *, recent, scale=None, out=None))]
pub(super) fn h2o_keep<'py>(
    py: Python<'py>,
    q: &Obj<'py>,
    k: &Obj<'py>,
    budget: &Obj<'py>,
    recent: &Obj<'py>,
    scale: Option<f64>,
    out: Opt<'_, 'py>,
) -> PyResult<I64s<'py>> {
    let budget = S.count(budget, "budget", BUDGET_MAX)?;
    let recent = S.count(recent, "recent", BUDGET_MAX)?;
    let a = Arrays::new(q, k)?;
    let pre = a.prefix(scale)?;
    let out = S.output(py, out, &[budget.min(pre.p_len)], &a.untyped())?;
    let work = pre
        .p_len
        .saturating_mul(budget.min(pre.p_len))
        .saturating_mul(pre.group);
    let v = detach(py, work, || eviction::h2o_keep(&pre, budget, recent))?;
    out.deliver(v.into_iter().map(|x| x as i64))
}

/// The first ``budget`` positions by score descending, ties to the lower position, in
/// ascending order: the one total order the eviction policies keep by.
///
/// Parameters
/// ----------
/// scores : array_like of float64, [n]
///     One score per position (``-0.0`` and ``0.0`` are equal).
/// budget : int
///     Positions kept (all of them when ``budget >= n``).
/// out : ndarray of int64, [min(budget, n)], optional
///     ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
///     aligned, native byte order, not overlapping any input (else refused, nothing written).
///
/// Returns
/// -------
/// ndarray of int64, [min(budget, n)]
///     The kept positions, ascending.
///
/// Raises
/// ------
/// SelectionError
///     (a ValueError; ``.argument`` names it) when ``scores`` is not 1-D or holds a NaN
///     (``scores``), or ``budget`` is negative (``budget``).
///     Also when ``out`` is refused (its shape, layout, read-only, or overlapping an input).
/// TypeError
///     when ``out`` is not an int64 ndarray.
///
/// See Also
/// --------
/// snapkv_scores, tova_scores, observed_attention_scores : the scores it ranks.
/// kvselect.reference.keep_top : the NumPy twin.
///
/// Examples
/// --------
/// >>> import kvselect
/// >>> kvselect.keep_top([0.5, 2.0, 0.5, 2.0, 0.5, 1.0], 4).tolist()
/// [0, 1, 3, 5]
#[pyfunction]
#[pyo3(signature = (scores, budget, *, out=None))]
pub(super) fn keep_top<'py>(
    py: Python<'py>,
    scores: &Obj<'py>,
    budget: &Obj<'py>,
    out: Opt<'_, 'py>,
) -> PyResult<I64s<'py>> {
    let budget = S.count(budget, "budget", BUDGET_MAX)?;
    let s = S.input::<f64, 1>(scores, "scores", "[n]")?;
    let out = S.output(py, out, &[budget.min(s.shape[0])], &[s.untyped()])?;
    let sl = s.slice()?;
    let v = detach(py, sl.len(), || eviction::keep_top(sl, budget))?;
    out.deliver(v.into_iter().map(|x| x as i64))
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(snapkv_scores, m)?)?;
    m.add_function(wrap_pyfunction!(tova_scores, m)?)?;
    m.add_function(wrap_pyfunction!(observed_attention_scores, m)?)?;
    m.add_function(wrap_pyfunction!(h2o_keep, m)?)?;
    m.add_function(wrap_pyfunction!(keep_top, m)?)?;
    Ok(())
}
