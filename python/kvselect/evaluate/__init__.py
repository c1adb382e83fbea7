"""The experiment the witness spec's metrics exist for: selection policies
compared at one identical token budget.

For every KV head of a workload and every evaluated query position ``i``
(context ``L = i + 1``), each policy picks at most ``k`` key positions; the
harness then measures, per query head:

- **segment coverage** of the selection (``S`` segments of ``[0, L)``);
- **attention-mass recall**: the share of the dense attention row's mass the
  selection keeps (mean, and the 5th percentile over heads and queries);
- **output relative error** ``‖o_sparse − o_dense‖ / ‖o_dense‖`` of sparse
  attention over the selection against dense attention: its mean, median and
  95th percentile over heads and queries (a ratio: rows whose dense output is
  near zero can dominate the mean, so the median says what is typical);
- **slots used**: distinct valid positions selected (a policy may use fewer
  than ``k``, never more), and the time its selection took.

The policies (``k`` slots each), every rule's (:mod:`kvselect.rules`), in
the table's order:

{policies}

Each policy's budget is charged in tokens: a policy that selects whole
blocks or pages of ``size`` tokens gets ``k // size`` of them, its forced
ones included (:class:`kvselect.rules.BudgetUnit`). A policy that cannot run
at a budget (block-sparse when the budget holds no whole block, or not its
forced blocks) is reported with NaN numbers and that reason, the others run. A
budget at which every policy sees every key of every query (the budget holds
the context) is listed in :attr:`Report.every_key_budgets`, and the table
says so once instead of printing trivially perfect numbers.
:func:`derive_settings` gives the settings at a budget, scaling what must
scale with ``k`` (segments, block geometry, sinks) when it is not given.

Every number comes from kvselect's own functions: this module only slices
arrays, calls them and averages what they return.
"""

from __future__ import annotations

import textwrap
import time
from dataclasses import asdict, dataclass, field, replace  # noqa: F401
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

import kvselect as ks
from kvselect import rules
from kvselect.evaluate.report import PolicyResult, Report, check_plot, figure, format_table, plot
from kvselect.evaluate.settings import (
    AUTO_BOUNDARY,
    DERIVED_FIELDS,
    EVICTION_POLICIES,
    POLICIES,
    Settings,
    SettingsError,
    derive_settings,
)
from kvselect.rules import EvalContext, Selection
from kvselect.workloads import HeadInputs, Workload, WorkloadDump

__doc__ = (__doc__ or "").replace(
    "{policies}",
    "\n".join(
        f"``{p.name}``\n" + textwrap.fill(p.doc, 76, initial_indent="    ", subsequent_indent="    ")
        for p in rules.policies()
    ),
)

__all__ = [
    "POLICIES",
    "EVICTION_POLICIES",
    "DERIVED_FIELDS",
    "Settings",
    "SettingsError",
    "derive_settings",
    "AUTO_BOUNDARY",
    "resolve_boundary",
    "prefix_length",
    "PolicyResult",
    "Report",
    "evaluate",
    "evaluate_many",
    "check_runs",
    "head_rows",
    "Tally",
    "report_header",
    "pooled_header",
    "format_table",
    "check_plot",
    "figure",
    "plot",
]


@dataclass
class _Head:
    """One KV head's tensors, shaped the way the attention functions take
    them: queries ``[n, group, d]``, keys ``[T, 1, d]``, values ``[T, 1, d_v]``."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    index_q: np.ndarray
    index_k: np.ndarray
    learned: dict  # kvselect.indexer_topk's inputs for the learned top-k
    probs: np.ndarray  # [n, group, T] dense attention probabilities (f64)
    dense: np.ndarray  # [n, group, d_v] dense attention output
    scale: float = 1.0
    layers: int = 1  # the workload's layers (PyramidKV's budgets)
    layer: int = 0  # this head's layer
    observe: Optional[np.ndarray] = None  # the boundary experiment's prefix queries [P, group, d]


def _prepare_head(x: HeadInputs, pos: np.ndarray, scale: float, layers: int = 1, layer: int = 0) -> _Head:
    tokens = len(x.k)
    k = x.k.reshape(tokens, 1, -1)
    v = x.v.reshape(tokens, 1, -1)
    probs = ks.attention_probabilities(x.q, k, pos, scale=scale)
    dense, _ = ks.dense_attention(x.q, k, v, pos, scale=scale)
    return _Head(x.q, k, v, x.index_q, x.index_k, x.learned, probs, dense, scale, layers, layer)


def resolve_boundary(s: Settings, pos: np.ndarray) -> Optional[int]:
    """The boundary ``P`` of the run ``s`` on a workload evaluated at ``pos``.

    Parameters
    ----------
    s : Settings
        The run (its ``boundary``).
    pos : ndarray of int, [n]
        The workload's evaluated query positions, ascending.

    Returns
    -------
    int or None
        None for the per-query experiment; else ``P``: ``s.boundary``, or
        the first evaluated position when it is :data:`AUTO_BOUNDARY`.

    Raises
    ------
    ValueError
        A boundary that leaves no evaluated query at or after it, or an
        automatic one at position 0 (an empty prefix), naming ``boundary``.
    """
    if s.boundary is None:
        return None
    p = int(pos[0]) if s.boundary == AUTO_BOUNDARY else int(s.boundary)
    if p < 1:
        raise ValueError("boundary: the first evaluated query is at position 0, which leaves an empty prefix")
    if p > int(pos[-1]):
        raise ValueError(f"boundary: {p} leaves no evaluated query after it (the last is at {int(pos[-1])})")
    return p


def prefix_length(runs: Sequence[Settings], pos: np.ndarray) -> int:
    """The prefix queries the runs' boundary experiments read: the largest
    ``P`` of :func:`resolve_boundary` (0 when no run has a boundary).

    Parameters
    ----------
    runs : sequence of Settings
        The runs.
    pos : ndarray of int, [n]
        The evaluated query positions.

    Returns
    -------
    int
        ``P``, or 0.

    Raises
    ------
    ValueError
        As :func:`resolve_boundary`.
    """
    return max([resolve_boundary(s, pos) or 0 for s in runs], default=0)


def _arrivals(pos: np.ndarray, p: int) -> np.ndarray:
    """``[n, max arrivals]``: query ``i``'s arrivals ``P..pos[i]``, -1 padded."""
    width = int(pos.max()) - p + 1
    cols = p + np.arange(width)[None, :]
    return np.where(cols <= pos[:, None], cols, -1).astype(np.int32)


def _select(head: _Head, pos: np.ndarray, s: Settings) -> Dict[str, Any]:
    """Every policy's selection ``[n, width]`` (int32, -1 padded) and the
    seconds it was charged, in the table's order, or why it cannot run (a
    ``str``); a policy that cannot run at ``s`` (its budget unit's note) is
    missing. Each policy is given its budget in its own unit, charged
    against the token budget ``k`` (:class:`kvselect.rules.BudgetUnit`), and
    may read the selections made before it (the witness policies start from
    the learned top-k and are charged it).

    The boundary experiment (``s.boundary``, ``pos`` all at or after ``P``):
    an eviction policy keeps ``k`` of the prefix ``0..P-1`` once; a
    per-query policy is asked at ``P - 1`` with its own query (its ``k``
    spent on the prefix); every row then gets the arrivals ``P..pos`` free,
    ``width = k + max arrivals``. The per-query experiment skips the
    eviction policies (their ``n/a`` note)."""
    p = resolve_boundary(s, pos)
    ask = pos if p is None else np.full(len(pos), p - 1, dtype=np.int64)
    done: Dict[str, Selection] = {}
    notes: Dict[str, str] = {}
    for policy in rules.policies():
        if policy.unit.note(s) is not None:
            continue
        if policy.eviction and p is None:
            continue  # not a row of the per-query experiment
        ctx = EvalContext(head, ask, s, policy.unit.units(s), done)
        sel = policy.select(ctx)
        if isinstance(sel, str):
            notes[policy.name] = sel
            continue
        # A row holds at most k positions (an eviction policy's per-layer
        # budget, PyramidKV's, may hold more on a layer, k on average; a
        # rule's dense layer, Quest's first ones, every visible position).
        if sel.rows.shape[0] != len(pos) or (sel.rows.shape[1] != s.budget and not (policy.eviction or sel.dense)):
            raise RuntimeError(f"policy {policy.name!r} returned rows {sel.rows.shape}, not [n, k = {s.budget}]")
        done[policy.name] = sel
    out: Dict[str, Any] = {}
    arrivals = None if p is None else _arrivals(pos, p)
    for policy in rules.policies():
        name = policy.name
        if name in notes:
            out[name] = notes[name]
        elif name in done:
            rows = done[name].rows
            if arrivals is not None:
                rows = np.concatenate([np.where(rows < p, rows, -1).astype(np.int32), arrivals], axis=1)
            out[name] = (rows, done[name].seconds)
    return out


def _measure(head: _Head, pos: np.ndarray, sel: np.ndarray, s: Settings, scale: float) -> Dict[str, np.ndarray]:
    """Per query head and query: coverage, recall, output error, slots used."""
    n, group, tokens = head.probs.shape
    lens = pos + 1
    coverage = ks.segment_coverage_rows(sel, lens, s.segments)
    recall = ks.attention_mass_recall_rows(sel, head.probs.reshape(n * group, tokens))
    sparse, _, _ = ks.sparse_attention(head.q, head.k, head.v, pos, sel[:, None, :], scale=scale)
    error = ks.output_relative_error_rows(sparse, head.dense)
    used = ks.slots_used_rows(sel, lens)
    return {
        "coverage": coverage,
        "recall": recall.reshape(n, group),
        "error": error.reshape(n, group),
        "used": used,
        "every_key": used == lens,
    }


def check_runs(budgets: Sequence[int], settings: Union[None, Settings, Sequence[Settings]]) -> List[Settings]:
    """One checked :class:`Settings` per distinct budget.

    Parameters
    ----------
    budgets : sequence of int
        The token budgets (a budget named twice is one run, its first settings).
    settings : Settings, sequence of Settings, or None
        As :func:`evaluate` takes them.

    Returns
    -------
    list of Settings
        One per distinct budget, in order, each checked.

    Raises
    ------
    ValueError
        A settings sequence whose length is not the budgets', or settings
        that :meth:`Settings.check` refuses.
    """
    budgets = [int(b) for b in budgets]
    if settings is None or isinstance(settings, Settings):
        per = [settings or Settings()] * len(budgets)
    else:
        per = list(settings)
        if len(per) != len(budgets):
            raise ValueError(f"settings: expected one Settings per budget ({len(budgets)}), got {len(per)}")
    # A budget named twice is one experiment, reported once (its first settings).
    chosen: Dict[int, Settings] = {}
    for b, s in zip(budgets, per):
        chosen.setdefault(b, replace(s, budget=b))
    runs = list(chosen.values())
    for r in runs:
        r.check()
    return runs


#: One head's numbers: per (budget, policy), each metric's per-row values,
#: the seconds its selection took and the queries it was spent on.
HeadRows = Dict[Tuple[int, str], Dict[str, np.ndarray]]

#: Per (budget, policy): the per-row arrays of every head so far, in order.
_Acc = Dict[tuple, Dict[str, list]]


def head_rows(
    inputs: HeadInputs,
    pos: np.ndarray,
    runs: Sequence[Settings],
    scale: float,
    observe: Optional[np.ndarray] = None,
    layers: int = 1,
    layer: int = 0,
) -> HeadRows:
    """Every policy at every run's budget on one KV head: its per-row numbers.

    The unit of an evaluation: a head's numbers depend on that head's
    tensors and the settings only, so heads can be evaluated anywhere, in
    any order, and pooled in a fixed order (:class:`Tally`).

    Parameters
    ----------
    inputs : HeadInputs
        The head (:meth:`Workload.head_inputs`, or
        :meth:`kvselect.workloads.WorkloadDump.head`).
    pos : ndarray of int, [n]
        The query positions ``inputs`` holds the rows of.
    runs : sequence of Settings
        One checked :class:`Settings` per budget.
    scale : float
        The softmax scale.
    observe : ndarray of float32, [P, group, d], optional
        The head's queries at the prefix positions ``0..P-1``, ``P`` at
        least :func:`prefix_length` (needed when a run has a boundary; the
        eviction policies read them).
    layers, layer : int
        The workload's layers and this head's (PyramidKV's per-layer budgets).

    Returns
    -------
    dict
        ``(budget, policy) -> {metric: per-row values}``: ``coverage``,
        ``recall``, ``error``, ``used``, ``every_key``, ``secs`` (one value)
        and ``selections`` (the queries, one value); a policy that cannot
        run on this head: ``{"note": [why]}``. In the boundary experiment
        only the queries at or after ``P`` are measured.

    Raises
    ------
    ValueError
        The native functions' refusals (``kvselect.KvselectError``): inputs
        that do not fit together.
    """
    pos = np.asarray(pos, dtype=np.int64)
    full = _prepare_head(inputs, pos, scale, layers, layer)
    out: HeadRows = {}
    for s in runs:
        p = resolve_boundary(s, pos)
        head, at = full, pos
        if p is not None:
            if observe is None or len(observe) < p:
                raise ValueError(f"observe: the boundary experiment at P = {p} needs the prefix's {p} queries")
            keep = pos >= p
            at = pos[keep]
            head = replace(
                full,
                q=full.q[keep],
                index_q=full.index_q[keep],
                learned=_rows_of(full.learned, keep),
                probs=full.probs[keep],
                dense=full.dense[keep],
                observe=np.ascontiguousarray(observe[:p]),
            )
        for name, sel in _select(head, at, s).items():
            if isinstance(sel, str):
                out[(s.budget, name)] = {"note": np.array([sel], dtype=object)}
                continue
            rows, secs = sel
            m = _measure(head, at, rows, s, scale)
            row = {key: val.ravel() for key, val in m.items()}
            row["secs"] = np.array([secs])
            row["selections"] = np.array([len(at)])
            out[(s.budget, name)] = row
    return out


def _rows_of(learned: dict, keep: np.ndarray) -> dict:
    """The learned top-k's inputs at the kept queries (the per-query arrays
    cut, the keys' shared)."""
    return {
        key: (np.ascontiguousarray(val[keep]) if key in ("index_q", "weights") and val is not None else val)
        for key, val in learned.items()
    }


class Tally:
    """Heads' per-row numbers, kept in the order they are added; reports
    computed from them.

    The order of :meth:`add` is the order of the rows every statistic is
    computed over (a mean or a percentile of the same values in the same
    order is the same number), so heads evaluated anywhere and added in a
    fixed order give the same report.
    """

    def __init__(self) -> None:
        self._acc: _Acc = {}

    def add(self, rows: HeadRows) -> None:
        """Append one head's numbers (:func:`head_rows`).

        Parameters
        ----------
        rows : dict
            What :func:`head_rows` returns.

        Returns
        -------
        None
        """
        for key, metrics in rows.items():
            slot = self._acc.setdefault(key, {k: [] for k in metrics})
            for k, v in metrics.items():
                slot[k].append(v)

    def extend(self, other: "Tally") -> None:
        """Append every head of ``other``, in its order.

        Parameters
        ----------
        other : Tally
            Another tally (a workload's, into the pooled one).

        Returns
        -------
        None
        """
        for key, val in other._acc.items():
            slot = self._acc.setdefault(key, {k: [] for k in val})
            for k, v in val.items():
                slot[k] += v

    def report(self, header: Report, runs: Sequence[Settings]) -> Report:
        """``header`` with its results filled in from the numbers so far.

        Parameters
        ----------
        header : Report
            The report's description (:func:`report_header`); its
            ``results`` and ``every_key_budgets`` are filled in.
        runs : sequence of Settings
            The settings the numbers were computed at.

        Returns
        -------
        Report
            ``header``.
        """
        _results(header, runs, self._acc)
        return header


def _accumulate(
    workload: Workload,
    runs: Sequence[Settings],
    tally: Tally,
    progress: Optional[Callable[[Iterable], Iterable]] = None,
) -> None:
    """Every policy at every run's budget on every KV head of ``workload``,
    its per-row numbers added to ``tally``."""
    pos = np.asarray(workload.query_positions, dtype=np.int64)
    heads: Iterable[int] = range(workload.n_kv_heads)
    if progress is not None:
        heads = progress(heads)
    prefix = prefix_length(runs, pos)
    layers = workload.n_layers
    for h in heads:
        observe = workload.head_queries(h, np.arange(prefix)) if prefix else None
        layer = h // (workload.n_kv_heads // layers)
        tally.add(head_rows(workload.head_inputs(h, pos), pos, runs, workload.scale, observe, layers, layer))


def _results(report: Report, runs: Sequence[Settings], acc: _Acc) -> None:
    """The report's results (and every-key budgets) from accumulated rows."""
    nan = float("nan")
    for s in runs:
        every_key = True
        for policy in rules.policies():
            name = policy.name
            if policy.eviction and s.boundary is None:
                continue  # the eviction baselines are rows of the boundary experiment only
            if (s.budget, name) not in acc:
                note = policy.unit.note(s)
                report.results.append(
                    PolicyResult(
                        policy=name,
                        budget=s.budget,
                        coverage=nan,
                        recall_mean=nan,
                        recall_p5=nan,
                        output_error=nan,
                        slots_used=nan,
                        select_us_per_query=nan,
                        note=note or "cannot run at these settings",
                    )
                )
                every_key = False
                continue
            if "note" in acc[(s.budget, name)]:
                report.results.append(
                    PolicyResult(
                        policy=name,
                        budget=s.budget,
                        coverage=nan,
                        recall_mean=nan,
                        recall_p5=nan,
                        output_error=nan,
                        slots_used=nan,
                        select_us_per_query=nan,
                        note=str(acc[(s.budget, name)]["note"][0][0]),
                    )
                )
                every_key = False
                continue
            m = {key: np.concatenate(v) for key, v in acc[(s.budget, name)].items()}
            every_key = every_key and bool(np.all(m["every_key"]))
            report.results.append(
                PolicyResult(
                    policy=name,
                    budget=s.budget,
                    coverage=float(np.mean(m["coverage"])),
                    recall_mean=float(np.mean(m["recall"])),
                    recall_p5=float(np.percentile(m["recall"], 5)),
                    output_error=float(np.mean(m["error"])),
                    slots_used=float(np.mean(m["used"])),
                    select_us_per_query=float(np.sum(m["secs"]) / np.sum(m["selections"]) * 1e6),
                    output_error_median=float(np.median(m["error"])),
                    output_error_p95=float(np.percentile(m["error"], 95)),
                )
            )
        if every_key:
            report.every_key_budgets.append(s.budget)


def report_header(workload: Union[Workload, WorkloadDump], runs: Sequence[Settings]) -> Report:
    """A report on ``workload`` at ``runs``, without results yet.

    Parameters
    ----------
    workload : Workload or WorkloadDump
        What is evaluated (its name, source, heads, queries, tokens, indexer).
    runs : sequence of Settings
        The settings, one per budget.

    Returns
    -------
    Report
        With empty ``results``.
    """
    return Report(
        workload=workload.name,
        source=workload.source,
        settings=[asdict(r) for r in runs],
        n_kv_heads=workload.n_kv_heads,
        n_q_heads=workload.n_heads,
        queries=len(workload.query_positions),
        tokens=workload.tokens,
        indexer=workload.indexer_description,
        boundary=_header_boundary(runs, np.asarray(workload.query_positions, dtype=np.int64)),
        layers=int(getattr(workload, "n_layers", 1)),
    )


def _header_boundary(runs: Sequence[Settings], pos: np.ndarray) -> Optional[int]:
    """The header's ``P`` (None without one; a boundary the workload refuses
    is refused by the evaluation, named, not by the header)."""
    try:
        return prefix_length(runs, pos) or None
    except ValueError:
        return None


def pooled_header(reports: Sequence[Report], runs: Sequence[Settings]) -> Report:
    """The pooled report's description over ``reports`` (see
    :func:`evaluate_many`), without results yet.

    Parameters
    ----------
    reports : sequence of Report
        The workloads' reports, in order.
    runs : sequence of Settings
        The settings, one per budget.

    Returns
    -------
    Report
        With empty ``results``.
    """
    return Report(
        workload=f"pooled ({len(reports)} workloads)",
        source="; ".join(r.workload for r in reports),
        settings=[asdict(r) for r in runs],
        n_kv_heads=sum(r.n_kv_heads for r in reports),
        n_q_heads=sum(r.n_q_heads for r in reports),
        queries=sum(r.queries for r in reports),
        tokens=max(r.tokens for r in reports),
        indexer="; ".join(dict.fromkeys(r.indexer for r in reports)),
        boundary=_pooled_boundary([r.boundary for r in reports]),
        layers=max(r.layers for r in reports),
    )


def _pooled_boundary(each: List[Optional[int]]) -> Optional[int]:
    """The workloads' one ``P``, None without a boundary, -1 when they differ."""
    distinct = set(each)
    if distinct == {None}:
        return None
    return distinct.pop() if len(distinct) == 1 else -1


def evaluate(
    workload: Workload,
    budgets: Sequence[int] = (2048,),
    settings: Union[None, Settings, Sequence[Settings]] = None,
    progress: Optional[Callable[[Iterable], Iterable]] = None,
) -> Report:
    """Runs every policy at every budget on every KV head of ``workload``.

    A policy that cannot run at a budget (block-sparse when the budget holds
    no block) is reported with NaN numbers and a note.

    Parameters
    ----------
    workload : Workload
        The tensors to evaluate on.
    budgets : sequence of int
        The token budgets ``k`` (a budget named twice runs once).
    settings : Settings, sequence of Settings, or None
        Everything but the budget: one :class:`Settings` for every budget
        (its ``budget`` is replaced by each of ``budgets``), or one per
        budget, in the order of ``budgets`` (as :func:`derive_settings`
        gives them); ``None``: the defaults.
    progress : callable, optional
        Wraps the iteration over heads (a progress bar, say).

    Returns
    -------
    Report
        Every policy's results at every budget.

    Raises
    ------
    ValueError
        A settings sequence whose length is not the budgets', or settings
        that :meth:`Settings.check` refuses.
    """
    reports, _ = evaluate_many([workload], budgets, settings, progress)
    return reports[0]


def evaluate_many(
    workloads: Iterable[Workload],
    budgets: Sequence[int] = (2048,),
    settings: Union[None, Settings, Sequence[Settings]] = None,
    progress: Optional[Callable[[Iterable], Iterable]] = None,
    on_report: Optional[Callable[[Report], None]] = None,
) -> Tuple[List[Report], Report]:
    """:func:`evaluate` on each workload in turn, and the pooled report.

    Parameters
    ----------
    workloads : iterable of Workload
        Consumed one at a time (pass a generator that loads each dump when
        asked, and memory stays bounded by one dump: only the per-row
        numbers are kept).
    budgets, settings, progress : see :func:`evaluate`
    on_report : callable, optional
        Receives each workload's report as soon as it is done.

    Returns
    -------
    reports : list of Report
        One report per workload, in order.
    pooled : Report
        Numbers over every (query, head) row of every workload, as if they
        were one; its ``n_kv_heads`` and ``n_q_heads`` are the totals,
        ``queries`` the total query positions per head summed over
        workloads, ``tokens`` the longest context.

    Raises
    ------
    ValueError
        No workload at all, a settings sequence whose length is not the
        budgets', or settings that :meth:`Settings.check` refuses.
    """
    runs = check_runs(budgets, settings)
    t0 = time.perf_counter()
    pooled = Tally()
    reports: List[Report] = []
    for w in workloads:
        t1 = time.perf_counter()
        tally = Tally()
        _accumulate(w, runs, tally, progress)
        report = tally.report(report_header(w, runs), runs)
        report.seconds = time.perf_counter() - t1
        reports.append(report)
        del w  # the next workload loads with this one released: memory bounded by one
        if on_report is not None:
            on_report(report)
        pooled.extend(tally)
    if not reports:
        raise ValueError("workloads: expected at least one workload")
    total = pooled.report(pooled_header(reports, runs), runs)
    total.seconds = time.perf_counter() - t0
    return reports, total
