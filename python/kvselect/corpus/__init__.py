"""A corpus of dumps, evaluated or checked task by task: in this process, or
on a Dask cluster, with the same numbers.

The rule
--------

A run is cut into **units** whose values depend on their inputs only:

- ``kvselect eval``: one ``(dump, layer, KV head)``
  (:func:`kvselect.evaluate.head_rows` of
  :meth:`kvselect.workloads.WorkloadDump.head`);
- ``kvselect check``: one ``(dump, row chunk)``
  (:func:`kvselect.checking.check_dump` of the dump with its per-row keys
  cut to the chunk).

A unit opens its dump itself and reads only its bytes (a local file is
memory-mapped; a URL is read in byte ranges), so the client never loads a
dump. Units run wherever and in whatever order the executor likes; the
results are then put back in one fixed order — dumps in name order, then
layers, then KV heads (rows, for check) — and every statistic is computed
from the same per-row values in that order (:class:`kvselect.evaluate.Tally`).
So a distributed run's tables and JSON equal the serial run's exactly,
whatever the number of workers or the order tasks finish in; only the timing
columns (``select µs/query`` and the report's ``seconds``) are measured
where the units ran and differ.

Why it holds: a head's numbers come from kvselect's native functions, which
give the same bits at every thread count and SIMD level, and from NumPy
elementwise arithmetic; the one matrix product on the way (the derived
indexer's projection) is summed in a fixed order (:func:`kvselect.workloads.
indexer.project`), never by BLAS, whose sums depend on the CPU and the
thread count. What would break it: a unit that read another unit's result,
an unordered reduction (a ``set``, a sum in completion order), or a BLAS
call on the values.

Faults: a unit that raises fails its dump (reported by name with the error;
every other dump is still evaluated and pooled; the exit status is then
non-zero); a worker that dies has its tasks rerun by the scheduler (a
unit's value does not depend on where it ran); Ctrl-C shuts the cluster
down.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from kvselect import evaluate
from kvselect.corpus import tasks
from kvselect.corpus.executors import Dask, Serial
from kvselect.workloads import Workload

__all__ = [
    "CHUNK_ROWS",
    "Dask",
    "Serial",
    "Failure",
    "TaskStats",
    "EvalRun",
    "CheckRun",
    "evaluate_corpus",
    "check_corpus",
]


@dataclass
class Failure:
    """A dump that could not be evaluated or checked.

    Attributes
    ----------
    name : str
        The dump, as named on the command line (or found in its folder).
    error : str
        What went wrong (its first failing unit's error, in unit order).
    """

    name: str
    error: str


@dataclass
class TaskStats:
    """What the units cost, measured where they ran.

    Attributes
    ----------
    seconds : list of float
        Each unit's run time (opening its dump included).
    bytes_read : list of int
        Each unit's bytes read from its dump.
    """

    seconds: List[float] = field(default_factory=list)
    bytes_read: List[int] = field(default_factory=list)


@dataclass
class EvalRun:
    """An evaluation over a corpus.

    Attributes
    ----------
    reports : list of Report
        One per evaluated dump, in source order.
    pooled : Report or None
        Over every row of every report (None: no dump could be evaluated).
    failures : list of Failure
        The dumps that could not be evaluated, in source order.
    stats : TaskStats
        The units' costs.
    """

    reports: List["evaluate.Report"]
    pooled: Optional["evaluate.Report"]
    failures: List[Failure]
    stats: TaskStats


@dataclass
class CheckRun:
    """A check over a corpus.

    Attributes
    ----------
    results : list of (str, dict)
        Each checked dump's name and :func:`kvselect.checking.check_dump`
        result, in source order.
    failures : list of Failure
        The dumps that could not be checked, in source order.
    stats : TaskStats
        The units' costs.
    """

    results: List[Tuple[str, dict]]
    failures: List[Failure]
    stats: TaskStats


def _describe(e: BaseException) -> str:
    if isinstance(e, (OSError, ValueError)):
        return str(e)
    return f"{type(e).__name__}: {e}"


class _Item:
    """One source of a run: its plan, its units' values, its error."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.plan: Any = None
        self.units = -1  # unknown until planned
        self.values: Dict[int, Any] = {}
        self.seconds = 0.0  # the units' run times, summed
        self.errors: Dict[int, str] = {}
        self.error: Optional[str] = None

    @property
    def complete(self) -> bool:
        return self.error is not None or len(self.values) + len(self.errors) == self.units

    @property
    def failure(self) -> Optional[str]:
        if self.error is not None:
            return self.error
        return self.errors[min(self.errors)] if self.errors else None


def _threads(threads: Optional[int], executor: Any) -> "tasks.Threads":
    """A unit's native threads: as given, else the executor's share per host."""
    return threads if threads is not None else getattr(executor, "host_threads", None)


def _run(
    executor: Any,
    items: List[_Item],
    plan: Callable[[_Item], Tuple[Callable[..., Any], tuple]],
    units: Callable[[_Item], List[Tuple[Callable[..., Any], tuple]]],
    finish: Callable[[_Item], None],
    stats: TaskStats,
    progress: Optional[Callable[[int], Any]],
    on_failure: Optional[Callable[[Failure], None]],
) -> List[Failure]:
    """Plans, then units, on ``executor``; each item, in source order as soon
    as it and every item before it are complete, passed to ``finish`` or, if
    a task of it failed, to ``on_failure`` (and returned among the failures)."""
    failures: List[Failure] = []
    bar = progress(0) if progress is not None else None
    tags: Dict[Any, Tuple[int, Optional[int]]] = {}
    try:
        with executor:
            first = []
            for i, item in enumerate(items):
                fn, args = plan(item)
                h = executor.submit(fn, *args)
                tags[h] = (i, None)
                first.append(h)
            pending = executor.completed(first)
            cursor = 0
            for h in pending:
                i, u = tags.pop(h)
                ok, done = executor.outcome(h)
                item = items[i]
                if u is None:
                    if not ok:
                        item.error = _describe(done)
                    else:
                        item.plan = done.value
                        calls = units(item)
                        item.units = len(calls)
                        if bar is not None:
                            bar.total += len(calls)
                            bar.refresh()
                        for j, (fn, args) in enumerate(calls):
                            hu = executor.submit(fn, *args)
                            tags[hu] = (i, j)
                            pending.add(hu)
                else:
                    if bar is not None:
                        bar.update(1)
                    if ok:
                        item.values[u] = done.value
                        item.seconds += done.seconds
                        stats.seconds.append(done.seconds)
                        stats.bytes_read.append(done.bytes_read)
                    else:
                        item.errors[u] = _describe(done)
                while cursor < len(items) and items[cursor].complete:
                    done_item = items[cursor]
                    error = done_item.failure
                    if error is None:
                        finish(done_item)
                    else:
                        failures.append(Failure(done_item.name, error))
                        if on_failure is not None:
                            on_failure(failures[-1])
                    done_item.values = {}
                    cursor += 1
    finally:
        if bar is not None:
            bar.close()
    return failures


def _builtin_plan(workload: Workload, runs: Sequence["evaluate.Settings"]) -> tasks.Done:
    units = [(0, h) for h in range(workload.n_kv_heads)]
    plan = tasks.WorkloadPlan(evaluate.report_header(workload, runs), units, None)
    return tasks.Done((plan, workload), 0.0, 0)


def _builtin_head(
    workload: Workload, h: int, runs: Sequence["evaluate.Settings"], threads: Optional[int]
) -> tasks.Done:
    tasks.use_threads(threads)
    t0 = time.perf_counter()
    pos = workload.query_positions
    prefix = evaluate.prefix_length(runs, pos)
    observe = workload.head_queries(h, np.arange(prefix)) if prefix else None
    layers = workload.n_layers
    layer = h // (workload.n_kv_heads // layers)
    rows = evaluate.head_rows(workload.head_inputs(h, pos), pos, runs, workload.scale, observe, layers, layer)
    return tasks.Done(rows, time.perf_counter() - t0, 0)


def evaluate_corpus(
    sources: Sequence[str],
    runs: Sequence["evaluate.Settings"],
    *,
    queries: int = 64,
    seed: int = 0,
    executor: Any = None,
    threads: Optional[int] = None,
    builtins: Optional[Mapping[str, Callable[[], Workload]]] = None,
    progress: Optional[Callable[[int], Any]] = None,
    on_report: Optional[Callable[["evaluate.Report"], None]] = None,
    on_failure: Optional[Callable[[Failure], None]] = None,
    on_warning: Optional[Callable[[str, str], None]] = None,
) -> EvalRun:
    """Every policy at every run's budget on every head of every dump.

    Parameters
    ----------
    sources : sequence of str
        Dumps (local paths or fsspec URLs; :func:`kvselect.checking.files.expand`
        turns folders and globs into them), or names in ``builtins``.
    runs : sequence of Settings
        One checked :class:`kvselect.evaluate.Settings` per budget
        (:func:`kvselect.evaluate.check_runs`).
    queries, seed : int
        The query positions of every dump (as :func:`kvselect.workloads.load_npz`).
    executor : Serial or Dask, optional
        Where the units run (default: :class:`Serial`, this process).
    threads : int, optional
        kvselect's native threads per unit, 0 = all cores (default: on
        Dask, the cores of a worker's host shared among the task threads of
        every worker on it; serially, the process's setting).
    builtins : mapping of str to callable, optional
        Names evaluated in this process (``"synthetic"``: its workload's
        factory); only with the serial executor.
    progress : callable, optional
        ``progress(total)`` gives a bar (tqdm's interface: ``total``,
        ``update``, ``refresh``, ``close``) over the units.
    on_report, on_failure, on_warning : callable, optional
        Called in source order as each dump completes: its report; its
        :class:`Failure`; ``(name, warning)`` of a dump that loads but is
        probably not what was meant.

    Returns
    -------
    EvalRun
        The reports, the pooled report, the failures and the units' costs.

    Raises
    ------
    ValueError
        A built-in name with a distributed executor.
    ImportError
        The Dask executor without ``dask[distributed]``.
    """
    executor = executor if executor is not None else Serial()
    builtins = builtins or {}
    if not isinstance(executor, Serial) and any(s in builtins for s in sources):
        named = [s for s in sources if s in builtins]
        raise ValueError(
            f"--workers and --scheduler evaluate dumps; {', '.join(map(repr, named))} "
            f"is built in this process: drop the flag, or dump it "
            f"(kvselect.checking.save_dump)"
        )
    items = [_Item(s) for s in sources]
    reports: List["evaluate.Report"] = []
    stats = TaskStats()
    pooled = evaluate.Tally()

    def plan(item: _Item) -> Tuple[Callable[..., Any], tuple]:
        if item.name in builtins:
            return (lambda name: _builtin_plan(builtins[name](), runs)), (item.name,)
        return tasks.plan_workload, (item.name, runs, queries, seed)

    def units(item: _Item) -> List[Tuple[Callable[..., Any], tuple]]:
        if item.name in builtins:
            p, w = item.plan
            item.plan = p
            return [(_builtin_head, (w, h, runs, threads)) for _, h in p.units]
        if item.plan.warning and on_warning is not None:
            on_warning(item.name, item.plan.warning)
        share = _threads(threads, executor)
        return [
            (tasks.evaluate_head, (item.name, layer, h, runs, queries, seed, share)) for layer, h in item.plan.units
        ]

    def finish(item: _Item) -> None:
        tally = evaluate.Tally()
        for u in range(item.units):
            tally.add(item.values[u])
        report = tally.report(item.plan.header, runs)
        report.seconds = item.seconds  # its tasks' run times, wherever they ran
        reports.append(report)
        pooled.extend(tally)
        if on_report is not None:
            on_report(report)

    t0 = time.perf_counter()
    failures = _run(executor, items, plan, units, finish, stats, progress, on_failure)
    total = None
    if reports:
        total = pooled.report(evaluate.pooled_header(reports, runs), runs)
        total.seconds = time.perf_counter() - t0
    return EvalRun(reports, total, failures, stats)


#: Rows per check unit by default.
CHUNK_ROWS = 4096


def check_corpus(
    sources: Sequence[str],
    *,
    atol: Optional[float] = None,
    rtol: Optional[float] = None,
    filler: Optional[str] = None,
    chunk_rows: int = CHUNK_ROWS,
    executor: Any = None,
    threads: Optional[int] = None,
    progress: Optional[Callable[[int], Any]] = None,
    on_result: Optional[Callable[[str, dict], None]] = None,
    on_failure: Optional[Callable[[Failure], None]] = None,
) -> CheckRun:
    """Every dump checked, ``chunk_rows`` rows per unit, each result as
    :func:`kvselect.checking.check_dump` gives it for the whole dump.

    Parameters
    ----------
    sources : sequence of str
        Dumps (local paths or fsspec URLs).
    atol, rtol, filler : optional
        As :func:`kvselect.checking.check_dump` takes them.
    chunk_rows : int
        Rows per unit (a ``v4_combined`` dump is one unit: its rows are
        grouped by request).
    executor : Serial or Dask, optional
        Where the units run (default: :class:`Serial`, this process).
    threads : int, optional
        kvselect's native threads per unit (as :func:`evaluate_corpus`).
    progress : callable, optional
        ``progress(total)`` gives a bar over the units.
    on_result, on_failure : callable, optional
        Called in source order as each dump completes: ``(name, result)``;
        its :class:`Failure`.

    Returns
    -------
    CheckRun
        The results, the failures and the units' costs.

    Raises
    ------
    ValueError
        ``chunk_rows`` below 1.
    """
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows: expected at least 1, got {chunk_rows}")
    executor = executor if executor is not None else Serial()
    items = [_Item(s) for s in sources]
    results: List[Tuple[str, dict]] = []
    stats = TaskStats()

    def plan(item: _Item) -> Tuple[Callable[..., Any], tuple]:
        return tasks.plan_check, (item.name, chunk_rows)

    def units(item: _Item) -> List[Tuple[Callable[..., Any], tuple]]:
        share = _threads(threads, executor)
        return [(tasks.check_rows, (item.name, a, b, atol, rtol, filler, share)) for a, b in item.plan.chunks]

    def finish(item: _Item) -> None:
        p = item.plan
        parts = [(a, item.values[j]) for j, (a, _) in enumerate(p.chunks)]
        result = tasks.merge_checks(parts, p.heads)
        results.append((item.name, result))
        if on_result is not None:
            on_result(item.name, result)

    failures = _run(executor, items, plan, units, finish, stats, progress, on_failure)
    return CheckRun(results, failures, stats)
