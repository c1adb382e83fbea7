"""``kvselect eval``: selection policies compared at an identical token budget
(the harness is :mod:`kvselect.evaluate`)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable, Dict, List, Optional

from kvselect import rules
from kvselect.cli._types import (
    HelpFormatter,
    add_cluster_flags,
    check_output,
    non_negative,
    non_negative_float,
    positive,
    token_budget,
)

#: The workloads made in this process rather than read from a dump.
BUILTINS = ("synthetic", "example")


def _builtins(args: argparse.Namespace) -> Dict[str, Callable[[], Any]]:
    from kvselect import workloads

    return {
        "synthetic": lambda: workloads.synthetic(
            context=args.context,
            queries=args.queries,
            seed=args.seed,
            index_heads=args.index_heads,
            index_noise=args.index_noise,
        ),
        "example": lambda: workloads.example(queries=args.queries, seed=args.seed),
    }


def _sources(args: argparse.Namespace) -> List[str]:
    """The workloads named by ``--workload``: each built-in name, file, folder
    (its ``*.npz`` files in name order) or glob, local or an fsspec URL."""
    from kvselect.checking.files import expand

    out: List[str] = []
    for name in args.workload:
        out += [name] if name in BUILTINS else expand([name])
    return out


#: The command-line flag of each policy setting (every rule's knobs), for
#: messages that say which to change.
_FLAGS = {k.field: k.flag for k in rules.knobs()}


def _derived_line(derived: Dict[int, Dict[str, int]]) -> Optional[str]:
    """One line on what was derived from the budget, or None if nothing was."""
    parts = []
    for budget, fields in derived.items():
        if fields:
            said = ", ".join(f"{_FLAGS[f]} {v}" for f, v in fields.items())
            parts.append(f"k = {budget}: {said}")
    if not parts:
        return None
    return "derived from the budget (not given; set them to override): " + "; ".join(parts)


def run(args: argparse.Namespace) -> int:
    from kvselect import evaluate

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
                **{field: getattr(args, field) for field in _FLAGS},
                boundary=getattr(args, "boundary", None),
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

    from kvselect import corpus
    from kvselect.cli._types import executor_of, progress_bar

    try:
        sources = _sources(args)
    except (OSError, ValueError) as e:
        return fail(str(e))
    line = _derived_line(derived)
    shown: List[str] = []

    def show(report: "evaluate.Report") -> None:
        if line and not shown:
            print(line)
        shown.append(report.workload)
        print(evaluate.format_table(report))
        if len(sources) > 1:
            print()

    def failed_one(f: "corpus.Failure") -> None:
        # Reported now, by name; the good dumps still make the pooled table.
        print(f"kvselect eval: cannot load workload {f.name!r}: {f.error}", file=sys.stderr)

    def warn(name: str, message: str) -> None:
        print(f"kvselect eval: warning: {message}", file=sys.stderr)

    try:
        executor = executor_of(args)
        result = corpus.evaluate_corpus(
            sources,
            runs,
            queries=args.queries,
            seed=args.seed,
            executor=executor,
            threads=args.threads,
            builtins=_builtins(args),
            progress=progress_bar(sys.stderr.isatty() and not args.quiet),
            on_report=show,
            on_failure=failed_one,
            on_warning=warn,
        )
    except BrokenPipeError:
        raise  # the reader left: main() says so once
    except (ImportError, ValueError, OSError) as e:  # no Dask; built-ins on Dask; no scheduler
        return fail(str(e))
    reports, pooled = result.reports, result.pooled
    failed = [f.name for f in result.failures]
    if not reports:  # no workload evaluated: each failure is already said
        return 1
    assert pooled is not None
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
        return fail(
            f"{len(failed)} of {len(sources)} workloads could not be loaded: "
            + ", ".join(map(repr, failed))
            + " (the tables above leave them out)"
        )
    return 0


def run_demo(args: argparse.Namespace) -> int:
    """The old witness demo, now a tiny eval: the synthetic workload at 8K."""
    given = dict(
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
        boundary=None,
        index_heads=4,
        index_noise=2.0,
        threads=None,
        workers=None,
        scheduler=None,
        json=None,
        plot=None,
        quiet=True,
    )
    # Every other policy setting derived from the budget, as on the command line.
    ns = argparse.Namespace(**{**{k.field: None for k in rules.knobs()}, **given})
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
            "recall, output error against dense attention, slots used, selection time. With "
            "--boundary, the KV-eviction baselines (SnapKV, PyramidKV, TOVA, H2O, "
            "ObservedAttention) join them at equal budgets: the boundary experiment."
        ),
    )
    ev.add_argument(
        "--workload",
        nargs="+",
        default=["synthetic"],
        metavar="WORKLOAD",
        help="'synthetic' (built in), 'example' (real MiniLM Q/K/V shipped with "
        "the package), or your own .npz dumps: files, folders (their *.npz) or globs, local "
        "paths or fsspec URLs (file://, s3:// with s3fs, ...); read one (layer, KV head) at a "
        "time, each dump reported, then pooled (default: synthetic)",
    )
    ev.add_argument(
        "--budget",
        type=token_budget,
        nargs="+",
        default=[2048],
        metavar="K",
        help="token budget k per query; several values make a sweep (default: 2048)",
    )
    for knob in rules.knobs():  # every policy's settings, in the rules' order
        ev.add_argument(
            knob.flag,
            dest=knob.field,
            type=positive if knob.minimum > 0 else non_negative,
            default=None,
            help=knob.help,
        )
    ev.add_argument(
        "--boundary",
        type=non_negative,
        nargs="?",
        const=0,
        default=None,
        metavar="P",
        help="the boundary experiment: the eviction policies (SnapKV, PyramidKV, TOVA, H2O, "
        "ObservedAttention) keep k of the prefix 0..P-1 once; every policy's query at p >= P reads k "
        "prefix positions plus the p - P + 1 arrivals P..p; only queries at or after P are scored. "
        "Without P (or P = 0): each workload's first evaluated query position, which leaves every "
        "evaluated query after it (default: off, the per-query experiment)",
    )
    ev.add_argument(
        "--context",
        type=positive,
        default=32768,
        help="synthetic workload: context length in tokens (default: 32768)",
    )
    ev.add_argument(
        "--index-heads",
        type=positive,
        default=4,
        help="synthetic workload: the lightning indexer's index heads per KV head (default: 4)",
    )
    ev.add_argument(
        "--index-noise",
        type=non_negative_float,
        default=2.0,
        help="synthetic workload: the indexer's approximation error, its index queries' noise "
        "in units of their RMS; a modelling choice, not a measurement: at 2.0 the learned "
        "top-k sits a few hundredths of recall below the oracle, at 0.25 within 0.01 "
        "(default: 2.0)",
    )
    ev.add_argument(
        "--queries",
        type=positive,
        default=64,
        help="query positions evaluated per head (default: 64)",
    )
    ev.add_argument(
        "--seed",
        type=non_negative,
        default=0,
        help="seed of the workload, the query positions and the random null (default: 0)",
    )
    add_cluster_flags(ev, "(layer, KV head) of a dump")
    ev.add_argument(
        "--json",
        metavar="FILE",
        help="also write the results as JSON (default: none)",
    )
    ev.add_argument(
        "--plot",
        metavar="FILE.png",
        help="plot recall and output error against budget, needs matplotlib (default: none)",
    )
    ev.add_argument(
        "--quiet",
        action="store_true",
        help="no progress bar (default: a progress bar on a terminal)",
    )
    ev.set_defaults(run=run)
