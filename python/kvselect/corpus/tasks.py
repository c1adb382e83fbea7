"""The units of work of a corpus run: plain functions of plain arguments, so
that a Dask worker (or this process) can run any of them, in any order, any
number of times, and return the same value.

Each task opens its dump itself (a worker reads the dump; the client never
does) and returns a :class:`Done`: its value, how long it took and how many
bytes of the dump it read.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

import kvselect as ks
from kvselect import evaluate
from kvselect.checking import DumpError, check_dump, load_dump, read_archive, validate
from kvselect.checking.dumps import CHECK_KINDS
from kvselect.checking.report import Report, dump_report
from kvselect.rules import dump_kinds
from kvselect.workloads import WorkloadDump, open_workload


@dataclass
class Done:
    """A task's value, its seconds and the bytes of the dump it read."""

    value: Any
    seconds: float
    bytes_read: int


#: Native threads of a task: a count, or per host the task threads that
#: share its cores (each task then takes ``cores // task threads``).
Threads = Union[None, int, Dict[str, int]]


def use_threads(threads: Threads) -> None:
    """kvselect's native threads for the tasks of this process.

    An int is used as it is; a ``{host: task threads}`` map shares the
    cores of the worker's host among the task threads of every worker on
    that host (``workers × task threads × native threads <= cores``: no
    oversubscription); None leaves this process's setting as it is.
    """
    if isinstance(threads, dict):
        try:
            from distributed import get_worker

            worker = get_worker()
        except (ImportError, ValueError):
            return  # not in a worker: this process's setting stands
        host = worker.address.split("://")[-1].rsplit(":", 1)[0]
        sharing = threads.get(host, worker.state.nthreads)
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        threads = max(1, cores // max(1, sharing))
    if threads is not None:
        ks.set_num_threads(threads)


@functools.lru_cache(maxsize=1)
def _workload(name: str, queries: int, seed: int) -> "WorkloadDump":
    """The dump a task reads, kept open for the next task of the same dump
    in this process (a compressed dump is then decompressed once per
    process, not once per head). A dump must not change during a run."""
    return open_workload(name, queries=queries, seed=seed)


# --- eval: (dump, layer, KV head) ------------------------------------------


@dataclass
class WorkloadPlan:
    """A workload dump's report header and its units."""

    header: "evaluate.Report"
    units: List[Tuple[int, int]]
    warning: Optional[str]


def plan_workload(name: str, runs: Sequence["evaluate.Settings"], queries: int, seed: int) -> Done:
    """Open a workload dump and make every refusal that needs no values:
    its report header and its ``(layer, kv_head)`` units."""
    t0 = time.perf_counter()
    dump = open_workload(name, queries=queries, seed=seed)
    plan = WorkloadPlan(evaluate.report_header(dump, runs), dump.units(), dump.warning)
    return Done(plan, time.perf_counter() - t0, 0)


def evaluate_head(
    name: str, layer: int, kv_head: int, runs: Sequence["evaluate.Settings"], queries: int, seed: int, threads: Threads
) -> Done:
    """One KV head of one layer of a dump: :func:`kvselect.evaluate.head_rows`."""
    use_threads(threads)
    t0 = time.perf_counter()
    dump = _workload(name, queries, seed)
    pos = dump.query_positions
    prefix = evaluate.prefix_length(runs, pos)
    observe = dump.head_queries(layer, kv_head, np.arange(prefix)) if prefix else None
    rows = evaluate.head_rows(dump.head(layer, kv_head), pos, runs, dump.scale, observe, dump.n_layers, layer)
    return Done(rows, time.perf_counter() - t0, dump.bytes_per_head())


# --- check: (dump, row chunk) -----------------------------------------------


@dataclass
class CheckPlan:
    """A check dump's row chunks ``[start, stop)``, and its KV heads."""

    chunks: List[Tuple[int, int]]
    heads: int = 1  # a blocks dump's KV heads: its report rows are query * heads + head


def _open_check(name: str) -> Any:
    """The dump, validated, its large members unread (memory-mapped, or byte
    ranges behind a URL)."""
    return validate(read_archive(name, lazy=True), source=name, expect=CHECK_KINDS)


def plan_check(name: str, chunk_rows: int) -> Done:
    """Open a check dump: its row chunks (``chunk_rows`` each; one chunk for
    a ``v4_combined`` dump)."""
    t0 = time.perf_counter()
    d = _open_check(name)
    kind = dump_kinds()[d.kind]  # the kind's rows, row keys and heads (kvselect.rules)
    n = kind.rows(d)
    if not kind.row_keys or n == 0 or not _rows_agree(d, kind, n):
        # One piece: a dump whose per-row keys disagree on the rows is refused
        # by the whole dump's check, naming them (chunks cut to the same rows
        # would each look whole, and a key's extra rows would go unread).
        chunks = [(0, n)]
    else:
        chunks = [(a, min(n, a + chunk_rows)) for a in range(0, n, chunk_rows)]
    return Done(CheckPlan(chunks, kind.heads(d)), time.perf_counter() - t0, 0)


def _rows_agree(d: Any, kind: Any, n: int) -> bool:
    """Whether every per-row key the dump holds runs over its ``n`` rows (read
    from the members' shapes: nothing is loaded)."""
    for key in kind.row_keys:
        if key not in d:
            continue
        shape = np.shape(d[key])
        axis = kind.row_axis(d, key)
        if len(shape) <= axis or shape[axis] != n:
            return False
    return True


def check_rows(
    name: str,
    start: int,
    stop: int,
    atol: Optional[float],
    rtol: Optional[float],
    filler: Optional[str],
    threads: Threads,
) -> Done:
    """Rows ``[start, stop)`` of a check dump, checked: :func:`check_dump` of
    the dump with its per-row keys cut to those rows."""
    use_threads(threads)
    t0 = time.perf_counter()
    d = _open_check(name)
    kind = dump_kinds()[d.kind]
    whole = (start, stop) == (0, kind.rows(d))
    sub = {}
    read = 0
    for key, a in d.items():
        if not whole and key in kind.row_keys and np.ndim(a) >= 1:
            axis = kind.row_axis(d, key)  # sliced, so a lazy member reads only these rows
            part = np.asarray(a[start:stop] if axis == 0 else a[(slice(None),) * axis + (slice(start, stop),)])
        else:
            part = np.asarray(a)
        sub[key] = part
        read += part.nbytes
    for key, fmt in d.formats.items():
        sub[f"{key}_format"] = np.asarray(fmt)
    sub["kind"] = np.asarray(d.kind)
    try:
        result = check_dump(validate(sub, source=name, expect=CHECK_KINDS), atol=atol, rtol=rtol, filler=filler)
    except DumpError:
        if whole:
            raise
        # A chunk's refusal would name indices within the chunk: the whole
        # dump's own refusal (the same rule) names them in the dump.
        check_dump(load_dump(name, expect=CHECK_KINDS), atol=atol, rtol=rtol, filler=filler)
        raise
    return Done(result, time.perf_counter() - t0, read)


def merge_checks(parts: Sequence[Tuple[int, dict]], heads: int = 1) -> Report:
    """The result of :func:`check_dump` on a whole dump, from its chunks'
    results ``(start row, result)`` in row order: each check's counts
    summed, reasons summed, each wrong row renumbered in the dump's rows (a
    blocks dump's report rows are ``query * heads + head``); the report's
    own counts, reasons and details computed from the merged checks, as
    :func:`check_dump` computes them."""
    first = parts[0][1]
    checks = []
    for i, check in enumerate(first["checks"]):
        merged: dict = {}
        for start, r in parts:
            rep = r["checks"][i]["report"]
            for key, val in rep.items():
                if key == "details":
                    shift = start * heads
                    moved = []
                    for x in val:
                        y = dict(x, row=x["row"] + shift)
                        if "query" in y:
                            y["query"] = y["query"] + start
                        moved.append(y)
                    merged.setdefault("details", []).extend(moved)
                elif key == "by_reason":
                    into = merged.setdefault("by_reason", {})
                    for reason, n in val.items():
                        into[reason] = into.get(reason, 0) + n
                elif isinstance(val, (int, np.integer)) and not isinstance(val, bool):
                    merged[key] = merged.get(key, 0) + int(val)
                elif key not in merged:
                    merged[key] = val
                elif merged[key] != val:
                    raise ValueError(f"chunks disagree on {key!r}: {merged[key]!r} and {val!r}")
        merged.get("details", []).sort(key=lambda x: x["row"])
        checks.append((check["name"], merged))
    return dump_report(first["kind"], first["tolerance"], checks, first.get("filler"))
