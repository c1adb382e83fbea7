//! The baseline selectors (`Selector`) and the oracle top-k: which keys
//! each query row may see, with no scores or from the exact ones.
//!
//! Reads the selectors' counts (`window`, `budget`, `sinks`, `width`),
//! `query_pos` (as many queries as it holds: [`Broadcast::Refuse`]) and the
//! oracle's queries and keys. The rule: every count fits int32, and a row
//! is distinct, ascending and causal.

use numpy::PyArray1;
use pyo3::prelude::*;

use crate::attention::{OracleTopK, Selector};
use crate::python::args::{
    detach, ndarray, query_positions, Broadcast, Obj, Opt, Queries, I32, I32_MAX, S,
};
use crate::python::errors::refuse;

/// A score-free baseline selector: which keys each query row of a causal sequence may see.
///
/// Query row ``i`` of a causal sequence sees keys ``0..=i``. Build one with
/// ``Selector.dense()``, ``Selector.local(window)``, ``Selector.random(budget, seed)`` or
/// ``Selector.sink_window(sinks, window)``; rows are distinct, ascending and causal.
/// Immutable, compares by value, hashable.
#[pyclass(name = "Selector", module = "kvselect", frozen, eq, hash)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct PySelector(Selector);

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
        let (sel, pos) = (
            self.0,
            query_positions(
                S,
                query_pos,
                "query_pos",
                Queries::AsMany,
                Broadcast::Refuse,
            )?,
        );
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
pub(super) fn oracle_topk<'py>(
    py: Python<'py>,
    attention: &Obj<'py>,
    query_pos: &Obj<'py>,
    budget: &Obj<'py>,
    width: Opt<'_, 'py>,
    out: Opt<'_, 'py>,
) -> PyResult<I32<'py>> {
    let a = S.input::<f64, 2>(attention, "attention", "[n_rows, row_len]")?;
    let pos = query_positions(
        S,
        query_pos,
        "query_pos",
        Queries::AsMany,
        Broadcast::Refuse,
    )?;
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
        return Err(refuse(S, "query_pos", msg));
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
