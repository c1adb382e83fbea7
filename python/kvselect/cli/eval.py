"""``kvselect eval``: selection policies compared at an identical token budget
(the harness is :mod:`kvselect.evaluate`)."""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from typing import Any, Dict, Iterable, Iterator, List, Optional

import kvselect as ks
from kvselect.cli._types import (
    HelpFormatter,
    check_output,
    non_negative,
    non_negative_float,
    positive,
)


def _progress(enabled: bool):
    """A progress bar over KV heads on a terminal (tqdm), nothing otherwise."""
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return None

    def wrap(it: Iterable) -> Iterable:
        seq = list(it)
        return tqdm(seq, desc="KV heads", unit="head", leave=False, file=sys.stderr)

    return wrap


def _sources(args: argparse.Namespace) -> List[str]:
    """The workloads named by ``--workload``: each name, a directory read as
    its ``*.npz`` files in name order."""
    out: List[str] = []
    for name in args.workload:
        if os.path.isdir(name):
            found = sorted(glob.glob(os.path.join(name, "*.npz")))
            if not found:
                raise FileNotFoundError(f"{name!r} is a directory with no .npz file")
            out += found
        else:
            out.append(name)
    return out


def _load(args: argparse.Namespace, name: str):
    from kvselect import workloads

    if name == "synthetic":
        return workloads.synthetic(
            context=args.context, queries=args.queries, seed=args.seed,
            index_heads=args.index_heads, index_noise=args.index_noise,
        )
    if name == "example":
        return workloads.example(queries=args.queries, seed=args.seed)
    return workloads.load_npz(name, queries=args.queries, seed=args.seed)


#: The command-line flag of each setting, for messages that say which to change.
_FLAGS = {
    "segments": "--segments",
    "block_size": "--block-size",
    "init_blocks": "--init-blocks",
    "local_blocks": "--local-blocks",
    "sinks": "--sinks",
}


def _derived_line(derived: Dict[int, Dict[str, int]]) -> Optional[str]:
    """One line on what was derived from the budget, or None if nothing was."""
    parts = []
    for budget, fields in derived.items():
        if fields:
            said = ", ".join(f"{_FLAGS[f]} {v}" for f, v in fields.items())
            parts.append(f"k = {budget}: {said}")
    if not parts:
        return None
    return (
        "derived from the budget (not given; set them to override): " + "; ".join(parts)
    )


def run(args: argparse.Namespace) -> int:
    import warnings

    from kvselect import evaluate
    from kvselect.workloads import WorkloadError

    def fail(message: str) -> int:
        print(f"kvselect eval: {message}", file=sys.stderr)
        return 1

    # Everything that can fail cheaply fails before the workload is built.
    runs: List[evaluate.Settings] = []
    derived: Dict[int, Dict[str, int]] = {}
    for budget in dict.fromkeys(args.budget):
        try:
            s, d = evaluate.derive_settings(
                budget,
                segments=args.segments,
                block_size=args.block_size,
                init_blocks=args.init_blocks,
                local_blocks=args.local_blocks,
                sinks=args.sinks,
                seed=args.seed,
                names=_FLAGS,
            )
        except ValueError as e:
            return fail(f"at --budget {budget}: {e}")
        runs.append(s)
        derived[budget] = d
    for flag, path in (("--json", args.json), ("--plot", args.plot)):
        if path:
            problem = check_output(flag, path)
            if problem:
                return fail(problem)
    if args.plot:
        try:
            evaluate.check_plot()
        except ImportError as e:
            return fail(str(e))

    if args.threads is not None:
        ks.set_num_threads(args.threads)
    try:
        sources = _sources(args)
    except OSError as e:
        return fail(str(e))
    line = _derived_line(derived)
    failed: List[str] = []
    shown: List[str] = []

    def workloads_() -> Iterator[Any]:
        # One at a time: each dump is loaded when the last one is done.
        for name in sources:
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    w = _load(args, name)
            except (OSError, WorkloadError, ValueError) as e:
                # Reported now, by name; the good dumps still make the pooled table.
                failed.append(name)
                print(f"kvselect eval: cannot load workload {name!r}: {e}", file=sys.stderr)
                continue
            for c in caught:
                print(f"kvselect eval: warning: {c.message}", file=sys.stderr)
            yield w
            del w  # released before the next dump loads

    def show(report: "evaluate.Report") -> None:
        if line and not shown:
            print(line)
        shown.append(report.workload)
        print(evaluate.format_table(report))
        if len(sources) > 1:
            print()

    try:
        reports, pooled = evaluate.evaluate_many(
            workloads_(),
            [s.budget for s in runs],
            runs,
            progress=_progress(sys.stderr.isatty() and not args.quiet),
            on_report=show,
        )
    except ValueError as e:
        if failed and not shown:  # no workload loaded: each failure is already said
            return 1
        return fail(str(e))
    if len(reports) > 1:
        print(evaluate.format_table(pooled))
    try:
        if args.json:
            with open(args.json, "w") as f:
                if len(reports) == 1:
                    json.dump(reports[0].to_dict(), f, indent=2)
                else:
                    doc = {"workloads": [r.to_dict() for r in reports], "pooled": pooled.to_dict()}
                    json.dump(doc, f, indent=2)
        if args.plot:
            evaluate.plot(pooled if len(reports) > 1 else reports[0], args.plot)
    except (OSError, ImportError) as e:
        return fail(str(e))
    if failed:
        return fail(f"{len(failed)} of {len(sources)} workloads could not be loaded: "
                    + ", ".join(map(repr, failed)) + " (the tables above leave them out)")
    return 0


def run_demo(args: argparse.Namespace) -> int:
    """The old witness demo, now a tiny eval: the synthetic workload at 8K."""
    ns = argparse.Namespace(
        workload=["synthetic"],
        context=8192,
        queries=8,
        seed=0,
        budget=[512],
        segments=32,
        block_size=64,
        init_blocks=1,
        local_blocks=2,
        sinks=4,
        index_heads=4,
        index_noise=2.0,
        threads=None,
        json=None,
        plot=None,
        quiet=True,
    )
    return run(ns)



def add_parser(sub: Any) -> None:
    """The ``eval`` subcommand of ``kvselect``."""
    ev = sub.add_parser(
        "eval",
        formatter_class=HelpFormatter,
        help="compare selection policies at an identical token budget",
        description=(
            "Compare learned top-k, segment witnesses (reserved tail and as served), "
            "block-sparse selection, the random and locality nulls, sink + window and the "
            "oracle top-k at one token budget per query: segment coverage, attention-mass "
            "recall, output error against dense attention, slots used, selection time."
        ),
    )
    ev.add_argument(
        "--workload",
        nargs="+",
        default=["synthetic"],
        metavar="WORKLOAD",
        help="'synthetic' (built in), 'example' (real MiniLM Q/K/V shipped with "
        "the package), or your own .npz dumps: several files, or a directory of them, are "
        "evaluated one at a time (memory bounded by one dump), each reported, then pooled "
        "(default: synthetic)",
    )
    ev.add_argument(
        "--budget",
        type=positive,
        nargs="+",
        default=[2048],
        metavar="K",
        help="token budget k per query; several values make a sweep (default: 2048)",
    )
    ev.add_argument(
        "--segments",
        type=positive,
        default=None,
        help="witness segments S, 1-64 (default: 64, or k // 8 (at least 1) when the budget k is below 512)",
    )
    ev.add_argument(
        "--block-size",
        type=positive,
        default=None,
        help="block-sparse block size in tokens (default: 64, halved until the forced "
        "blocks fit the budget, i.e. below k = 192). kvselect.BlockSparseConfig's "
        "default is 128, MiniMax-M3's block and KV page size; 64 here gives the default "
        "k = 2048 on the 32K synthetic context 32 blocks to choose, not 16. "
        "--block-size 128 --init-blocks 0 --local-blocks 1 --budget 2048 is the released "
        "MiniMax-M3 checkpoint's geometry",
    )
    ev.add_argument(
        "--init-blocks",
        type=non_negative,
        default=None,
        help="block-sparse: forced first blocks (default: 1, fewer if the budget cannot "
        "hold them)",
    )
    ev.add_argument(
        "--local-blocks",
        type=non_negative,
        default=None,
        help="block-sparse: forced newest blocks (default: 2, fewer if the budget cannot "
        "hold them)",
    )
    ev.add_argument(
        "--sinks",
        type=non_negative,
        default=None,
        help="sink + window: sink tokens (default: 4, or k - 1 when the budget is below 5)",
    )
    ev.add_argument(
        "--context", type=positive, default=32768,
        help="synthetic workload: context length in tokens (default: 32768)",
    )
    ev.add_argument(
        "--index-heads", type=positive, default=4,
        help="synthetic workload: the lightning indexer's index heads per KV head (default: 4)",
    )
    ev.add_argument(
        "--index-noise", type=non_negative_float, default=2.0,
        help="synthetic workload: the indexer's approximation error, its index queries' noise "
        "in units of their RMS; a modelling choice, not a measurement: at 2.0 the learned "
        "top-k sits a few hundredths of recall below the oracle, at 0.25 within 0.01 "
        "(default: 2.0)",
    )
    ev.add_argument(
        "--queries", type=positive, default=64,
        help="query positions evaluated per head (default: 64)",
    )
    ev.add_argument(
        "--seed", type=non_negative, default=0,
        help="seed of the workload, the query positions and the random null (default: 0)",
    )
    ev.add_argument(
        "--threads", type=non_negative,
        help="kvselect threads, 0 = all cores (default: all cores)",
    )
    ev.add_argument(
        "--json", metavar="FILE",
        help="also write the results as JSON (default: none)",
    )
    ev.add_argument(
        "--plot", metavar="FILE.png",
        help="plot recall and output error against budget, needs matplotlib (default: none)",
    )
    ev.add_argument(
        "--quiet", action="store_true",
        help="no progress bar (default: a progress bar on a terminal)",
    )
    ev.set_defaults(run=run)

