"""The ``kvselect`` command line.

``kvselect eval`` compares selection policies at an identical token budget
on a workload — the built-in synthetic long-context one by default, the real
example shipped with the package, or your own Q/K/V dump (``.npz``, see
``kvselect.workloads``) — and prints one table per budget. Exit codes: 0 on
success, 2 on a usage error (argparse's), 1 when the workload cannot be
loaded or the settings are inconsistent.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Iterable, Optional, Sequence

import kvselect as ks


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


def _load(args: argparse.Namespace):
    from kvselect import workloads

    if args.workload == "synthetic":
        return workloads.synthetic(context=args.context, queries=args.queries, seed=args.seed)
    if args.workload == "example":
        return workloads.example(queries=args.queries, seed=args.seed)
    return workloads.load_npz(args.workload, queries=args.queries, seed=args.seed)


def _eval(args: argparse.Namespace) -> int:
    from kvselect import evaluate
    from kvselect.workloads import WorkloadError

    if args.threads is not None:
        ks.set_num_threads(args.threads)
    try:
        workload = _load(args)
    except (OSError, WorkloadError, ValueError) as e:
        print(f"kvselect eval: cannot load workload {args.workload!r}: {e}", file=sys.stderr)
        return 1
    budgets = args.budget
    # A budget above the context is every key (the harness pads its rows).
    settings = evaluate.Settings(
        budget=budgets[0],
        segments=args.segments,
        block_size=args.block_size,
        init_blocks=args.init_blocks,
        local_blocks=args.local_blocks,
        sinks=args.sinks,
        seed=args.seed,
    )
    try:
        report = evaluate.evaluate(
            workload,
            budgets,
            settings,
            progress=_progress(sys.stderr.isatty() and not args.quiet),
        )
    except ValueError as e:
        print(f"kvselect eval: {e}", file=sys.stderr)
        return 1
    print(evaluate.format_table(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report.to_dict(), f, indent=2)
    if args.plot:
        try:
            evaluate.plot(report, args.plot)
        except ImportError as e:
            print(f"kvselect eval: {e}", file=sys.stderr)
            return 1
    return 0


def _demo(args: argparse.Namespace) -> int:
    """The old witness demo, now a tiny eval: the synthetic workload at 8K."""
    ns = argparse.Namespace(
        workload="synthetic",
        context=8192,
        queries=8,
        seed=0,
        budget=[512],
        segments=32,
        block_size=64,
        init_blocks=1,
        local_blocks=2,
        sinks=4,
        threads=None,
        json=None,
        plot=None,
        quiet=True,
    )
    return _eval(ns)


def _positive(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {v}")
    return v


def _non_negative(text: str) -> int:
    v = int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be non-negative, got {v}")
    return v


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvselect",
        description="kvselect: which KV positions a query may attend to in sparse attention.",
    )
    parser.add_argument("--version", action="version", version=f"kvselect {ks.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    ev = sub.add_parser(
        "eval",
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
        default="synthetic",
        help="'synthetic' (built in, default), 'example' (real MiniLM Q/K/V shipped with "
        "the package), or the path of your own .npz dump",
    )
    ev.add_argument(
        "--budget",
        type=_positive,
        nargs="+",
        default=[2048],
        metavar="K",
        help="token budget k per query; several values make a sweep (default 2048)",
    )
    ev.add_argument("--segments", type=_positive, default=64, help="witness segments S (1-64)")
    ev.add_argument("--block-size", type=_positive, default=64, help="block-sparse block size")
    ev.add_argument("--init-blocks", type=_non_negative, default=1, help="forced first blocks")
    ev.add_argument("--local-blocks", type=_non_negative, default=2, help="forced newest blocks")
    ev.add_argument("--sinks", type=_non_negative, default=4, help="sink + window: sink tokens")
    ev.add_argument("--context", type=_positive, default=32768, help="synthetic context length")
    ev.add_argument("--queries", type=_positive, default=64, help="query positions per head")
    ev.add_argument("--seed", type=_non_negative, default=0, help="workload and null seed")
    ev.add_argument("--threads", type=_non_negative, help="kvselect threads (0 = all cores)")
    ev.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    ev.add_argument("--plot", metavar="FILE.png", help="plot recall against budget (matplotlib)")
    ev.add_argument("--quiet", action="store_true", help="no progress bar")
    ev.set_defaults(run=_eval)

    demo = sub.add_parser("demo", help="a quick witness demo (a small eval)")
    demo.set_defaults(run=_demo)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
