"""``kvselect check``: a dump of one kernel call checked against the exact
rule; exit 0 (every row right), 1 (a row wrong), 2 (cannot check). The
library is :mod:`kvselect.checking`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from kvselect.checking import (
    DEFAULT_RTOL,
    FILLERS,
    DumpError,
    check_dump,
    format_report,
    strict_json,
)
from kvselect.cli._types import check_output, non_negative_float


def run(args: argparse.Namespace) -> int:
    def fail(message: str) -> int:
        print(f"kvselect check: {message}", file=sys.stderr)
        return 2

    to_file = args.json is not None and args.json != "-"
    if to_file:  # refused before the check runs, as eval does
        problem = check_output("--json", args.json)
        if problem:
            return fail(problem)
        if os.path.exists(args.json) and os.path.exists(args.dump) and os.path.samefile(args.json, args.dump):
            return fail(f"--json {args.json!r} is the dump itself: give another file name")
    try:
        result = check_dump(args.dump, atol=args.atol, rtol=args.rtol, filler=args.filler)
    except DumpError as e:
        return fail(str(e))
    if args.json == "-":
        json.dump(strict_json(result), sys.stdout, indent=2, allow_nan=False)
        print()
    else:
        if to_file:
            try:
                with open(args.json, "w") as f:
                    json.dump(strict_json(result), f, indent=2, allow_nan=False)
                    f.write("\n")
            except OSError as e:
                return fail(f"--json {args.json!r}: {e}")
        print(format_report(result, show=args.show, source=args.dump))
    return 1 if result["wrong"] else 0


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
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("dump", help="the .npz dump (the format: docs/dump-format.md, or kvselect.checking.dump_format_markdown())")
    p.add_argument("--rtol", type=non_negative_float, default=None,
                   help="relative tolerance (default: by the dump's precision: "
                   + ", ".join(f"{k} {v:.3g}" for k, v in DEFAULT_RTOL.items()) + ")")
    p.add_argument("--atol", type=non_negative_float, default=None,
                   help="absolute tolerance (default 0)")
    p.add_argument("--show", type=int, default=5, help="wrong rows shown in detail per check")
    p.add_argument("--json", metavar="FILE", default=None,
                   help="also write the full report as JSON to FILE (the text report is still "
                   "printed); '-' prints the JSON to stdout instead of the text")
    p.add_argument("--filler", choices=FILLERS, default=None,
                   help="how the engine fills a row that sees fewer than topk positions (overrides "
                   "the dump's filler; default \"-1\"): \"past_context\" ignores entries at or past "
                   "the context, \"repeat\" ignores repeats of an earlier entry")
    p.set_defaults(run=run)
