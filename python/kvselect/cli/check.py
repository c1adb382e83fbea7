"""``kvselect check``: dumps of kernel calls checked against the exact rule;
exit 0 (every row of every dump right), 1 (a row wrong, in any dump), 2
(no row wrong, but a dump cannot be checked). The library is
:mod:`kvselect.checking`; a corpus runs through :mod:`kvselect.corpus`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from kvselect.checking import (
    DEFAULT_RTOL,
    FILLERS,
    format_report,
    strict_json,
)
from kvselect.cli._types import (
    DefaultsHelpFormatter,
    add_cluster_flags,
    check_output,
    executor_of,
    non_negative,
    non_negative_float,
    positive,
    progress_bar,
)
from kvselect.corpus import CHUNK_ROWS


def run(args: argparse.Namespace) -> int:
    from kvselect import corpus
    from kvselect.checking.files import expand, is_url

    def fail(message: str) -> int:
        print(f"kvselect check: {message}", file=sys.stderr)
        return 2

    to_file = args.json is not None and args.json != "-"
    if to_file:  # refused before the check runs, as eval does
        problem = check_output("--json", args.json)
        if problem:
            return fail(problem)
    try:
        dumps = expand(args.dumps)
    except (OSError, ValueError) as e:
        return fail(str(e))
    if to_file and os.path.exists(args.json):
        for name in dumps:
            if not is_url(name) and os.path.exists(name) and os.path.samefile(args.json, name):
                return fail(f"--json {args.json!r} is the dump itself: give another file name")
    one = len(dumps) == 1
    text = args.json != "-"

    def show(name: str, result: dict) -> None:
        if text:
            print(format_report(result, show=args.show, source=name))
            if not one:
                print()

    def failed_one(f: "corpus.Failure") -> None:
        print(f"kvselect check: {f.error}" if one else f"kvselect check: {f.name}: {f.error}", file=sys.stderr)

    try:
        run_ = corpus.check_corpus(
            dumps,
            atol=args.atol,
            rtol=args.rtol,
            filler=args.filler,
            chunk_rows=args.chunk_rows,
            executor=executor_of(args),
            threads=args.threads,
            progress=progress_bar(sys.stderr.isatty() and not one),
            on_result=show,
            on_failure=failed_one,
        )
    except BrokenPipeError:
        raise  # the reader left: main() says so once
    except (ImportError, ValueError, OSError) as e:  # no Dask; a scheduler not reached
        return fail(str(e))
    wrong = [name for name, r in run_.results if r["wrong"]]
    if one:
        doc: Any = run_.results[0][1] if run_.results else None
    else:
        doc = {
            "dumps": [{"dump": name, "result": r} for name, r in run_.results],
            "cannot_check": [{"dump": f.name, "error": f.error} for f in run_.failures],
        }
    if doc is not None and args.json is not None:
        if args.json == "-":
            json.dump(strict_json(doc), sys.stdout, indent=2, allow_nan=False)
            print()
        else:
            try:
                with open(args.json, "w") as f:
                    json.dump(strict_json(doc), f, indent=2, allow_nan=False)
                    f.write("\n")
            except OSError as e:
                return fail(f"--json {args.json!r}: {e}")
    if not one and text:
        print(
            f"kvselect check: {len(dumps)} dumps: {len(run_.results) - len(wrong)} right, "
            f"{len(wrong)} with wrong rows"
            + (f" ({', '.join(wrong)})" if wrong else "")
            + f", {len(run_.failures)} could not be checked"
            + (f" ({', '.join(f.name for f in run_.failures)})" if run_.failures else "")
        )
    if wrong:
        return 1
    return 2 if run_.failures else 0


def add_parser(sub: Any) -> None:
    """The ``check`` subcommand of ``kvselect``."""
    p = sub.add_parser(
        "check",
        help="is an engine's selection right? (exit 1 if any row is wrong)",
        description="Check a dump of one selection kernel call against kvselect's exact rule: "
        "token top-k (the lightning indexer's), MiniMax-M3 blocks, or witness rows. Exit "
        "status 0: every row correct; 1: some row wrong; 2: the dump cannot be checked. "
        "The dump format: docs/dump-format.md, or python -c 'import kvselect.checking as c; "
        "help(c)'. A dump that cannot be checked (an unknown key, a non-finite operand) exits "
        "2, never 1.",
        formatter_class=DefaultsHelpFormatter,
    )
    p.add_argument(
        "dumps",
        nargs="+",
        metavar="DUMP",
        help="the .npz dump (the format: docs/dump-format.md, or "
        "kvselect.checking.dump_format_markdown()); several, a folder (its *.npz) or a "
        "glob are each checked and reported, then summed up; local paths or fsspec URLs",
    )
    p.add_argument(
        "--rtol",
        type=non_negative_float,
        default=None,
        help="relative tolerance (default: by the dump's precision: "
        + ", ".join(f"{k} {v:.3g}" for k, v in DEFAULT_RTOL.items())
        + ")",
    )
    p.add_argument("--atol", type=non_negative_float, default=None, help="absolute tolerance (default 0)")
    p.add_argument("--show", type=non_negative, default=5, help="wrong rows shown in detail per check")
    p.add_argument(
        "--json",
        metavar="FILE",
        default=None,
        help="also write the full report as JSON to FILE (the text report is still "
        "printed); '-' prints the JSON to stdout instead of the text",
    )
    p.add_argument(
        "--filler",
        choices=FILLERS,
        default=None,
        help="how the engine fills a row that sees fewer than topk positions (overrides "
        'the dump\'s filler; default "-1"): "past_context" ignores entries at or past '
        'the context, "repeat" ignores repeats of an earlier entry',
    )
    p.add_argument(
        "--chunk-rows",
        type=positive,
        default=CHUNK_ROWS,
        help="rows per task: a dump is checked in chunks of rows, each reading only "
        "its rows (a v4_combined dump is one task)",
    )
    add_cluster_flags(p, "chunk of rows of a dump")
    p.set_defaults(run=run)
