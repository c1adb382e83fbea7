"""The ``kvselect`` command line.

``kvselect eval`` compares selection policies at an identical token budget
on a workload — the built-in synthetic long-context one by default, the real
example shipped with the package, or your own Q/K/V dumps (``.npz``, the
one dump format of ``kvselect check`` and ``eval``, kind ``"workload"``:
``docs/dump-format.md``, ``kvselect.workloads``) — and prints one table per
budget. Every budget
>= 1 runs on the defaults: what must scale with k and was not given is
derived (``kvselect.evaluate.derive_settings``) and one line says what.
Exit codes: 0 on success, 2 on a usage error (argparse's; a flag that is
not a number is named with what it expects), 1 when a workload cannot be
loaded, a given setting cannot work (the message names its flag), or an
output (--json, --plot) cannot be written — the last two checked before the
evaluation. Of several dumps (or a folder), one that cannot be loaded is
reported by name when its turn comes and the others are still evaluated and
pooled; the exit status is then 1.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence

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


def _check_output(flag: str, path: str) -> Optional[str]:
    """Why ``path`` cannot be written (None if it can), checked before the run."""
    import os

    target = os.path.abspath(path)
    folder = os.path.dirname(target)
    if os.path.isdir(target):
        return f"{flag} {path!r} is a directory; give a file name"
    if not os.path.isdir(folder):
        return f"{flag} {path!r}: the folder {folder!r} does not exist"
    if not os.access(folder, os.W_OK):
        return f"{flag} {path!r}: the folder {folder!r} is not writable"
    return None


def _eval(args: argparse.Namespace) -> int:
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
            problem = _check_output(flag, path)
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


def _demo(args: argparse.Namespace) -> int:
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
    return _eval(ns)


def _integer(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        # argparse would say "invalid _positive value": the function's name.
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None


def _positive(text: str) -> int:
    v = _integer(text, "a positive integer")
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {v}")
    return v


def _non_negative_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative number, got {text!r}") from None
    if not (v >= 0 and v != float("inf")):
        raise argparse.ArgumentTypeError(f"must be finite and non-negative, got {text}")
    return v


def _non_negative(text: str) -> int:
    v = _integer(text, "a non-negative integer")
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be non-negative, got {v}")
    return v


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, except that a flag is never broken at its hyphen."""

    def _split_lines(self, text: str, width: int) -> List[str]:
        import textwrap

        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvselect",
        description="kvselect: which KV positions a query may attend to in sparse attention.",
    )
    parser.add_argument("--version", action="version", version=f"kvselect {ks.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    ev = sub.add_parser(
        "eval",
        formatter_class=_HelpFormatter,
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
        type=_positive,
        nargs="+",
        default=[2048],
        metavar="K",
        help="token budget k per query; several values make a sweep (default: 2048)",
    )
    ev.add_argument(
        "--segments",
        type=_positive,
        default=None,
        help="witness segments S, 1-64 (default: 64, or k // 8 (at least 1) when the budget k is below 512)",
    )
    ev.add_argument(
        "--block-size",
        type=_positive,
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
        type=_non_negative,
        default=None,
        help="block-sparse: forced first blocks (default: 1, fewer if the budget cannot "
        "hold them)",
    )
    ev.add_argument(
        "--local-blocks",
        type=_non_negative,
        default=None,
        help="block-sparse: forced newest blocks (default: 2, fewer if the budget cannot "
        "hold them)",
    )
    ev.add_argument(
        "--sinks",
        type=_non_negative,
        default=None,
        help="sink + window: sink tokens (default: 4, or k - 1 when the budget is below 5)",
    )
    ev.add_argument(
        "--context", type=_positive, default=32768,
        help="synthetic workload: context length in tokens (default: 32768)",
    )
    ev.add_argument(
        "--index-heads", type=_positive, default=4,
        help="synthetic workload: the lightning indexer's index heads per KV head (default: 4)",
    )
    ev.add_argument(
        "--index-noise", type=_non_negative_float, default=2.0,
        help="synthetic workload: the indexer's approximation error, its index queries' noise "
        "in units of their RMS; a modelling choice, not a measurement: at 2.0 the learned "
        "top-k sits a few hundredths of recall below the oracle, at 0.25 within 0.01 "
        "(default: 2.0)",
    )
    ev.add_argument(
        "--queries", type=_positive, default=64,
        help="query positions evaluated per head (default: 64)",
    )
    ev.add_argument(
        "--seed", type=_non_negative, default=0,
        help="seed of the workload, the query positions and the random null (default: 0)",
    )
    ev.add_argument(
        "--threads", type=_non_negative,
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
    ev.set_defaults(run=_eval)

    from kvselect import checking

    checking.add_parser(sub)

    demo = sub.add_parser("demo", help="a quick witness demo (a small eval)")
    demo.set_defaults(run=_demo)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except BrokenPipeError:  # `kvselect check dump.npz | head`: the reader left early
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second traceback when Python flushes stdout
        return 141  # what a shell reports for a process ended by SIGPIPE (128 + 13)


if __name__ == "__main__":
    sys.exit(main())
