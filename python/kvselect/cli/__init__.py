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
import os
import sys
from typing import Optional, Sequence

import kvselect as ks
from kvselect.cli import check as check_cli
from kvselect.cli import eval as eval_cli

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvselect",
        description="kvselect: which KV positions a query may attend to in sparse attention.",
    )
    parser.add_argument("--version", action="version", version=f"kvselect {ks.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    eval_cli.add_parser(sub)

    check_cli.add_parser(sub)

    demo = sub.add_parser("demo", help="a quick witness demo (a small eval)")
    demo.set_defaults(run=eval_cli.run_demo)
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
