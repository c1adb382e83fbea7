"""The command line's argument types and checks, shared by its subcommands:
argparse types that name what they expect, the one check that an output
path can be written before a run starts, and the flags that say where a
corpus runs (in this process, or on Dask)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Callable, List, Optional


def integer(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        # argparse would say "invalid positive value": the function's name.
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None


def positive(text: str) -> int:
    v = integer(text, "a positive integer")
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {v}")
    return v


def non_negative_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative number, got {text!r}") from None
    if not (v >= 0 and v != float("inf")):
        raise argparse.ArgumentTypeError(f"must be finite and non-negative, got {text}")
    return v


def non_negative(text: str) -> int:
    v = integer(text, "a non-negative integer")
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be non-negative, got {v}")
    return v


#: ``kvselect.set_num_threads``' bound.
MAX_THREADS = 65536


def thread_count(text: str) -> int:
    """A ``--threads`` value: 0 (every core) ..= 65536, refused as the flag."""
    v = non_negative(text)
    if v > MAX_THREADS:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_THREADS}, got {v}")
    return v


def token_budget(text: str) -> int:
    """A token budget: 1 ..= 2**31 - 1 (an int32 position count), refused as the flag."""
    v = positive(text)
    if v > 2**31 - 1:
        raise argparse.ArgumentTypeError(f"must be at most {2**31 - 1} (an int32 position count), got {v}")
    return v


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, except that a flag is never broken at its hyphen."""

    def _split_lines(self, text: str, width: int) -> List[str]:
        import textwrap

        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's defaults formatter, except that a help text that already
    says its default (``"absolute tolerance (default 0)"``) is not given a
    second one (``"(default: None)"``): each default shown once."""

    def _get_help_string(self, action: argparse.Action) -> Optional[str]:
        text = action.help
        if text is not None and "default" in text.lower():
            return text
        return super()._get_help_string(action)


def check_output(flag: str, path: str) -> Optional[str]:
    """Why ``path`` cannot be written (None if it can), checked before the run."""
    target = os.path.abspath(path)
    folder = os.path.dirname(target)
    if os.path.isdir(target):
        return f"{flag} {path!r} is a directory; give a file name"
    if not os.path.isdir(folder):
        return f"{flag} {path!r}: the folder {folder!r} does not exist"
    if not os.access(folder, os.W_OK):
        return f"{flag} {path!r}: the folder {folder!r} is not writable"
    return None


def add_cluster_flags(parser: argparse.ArgumentParser, unit: str) -> None:
    """``--workers`` / ``--scheduler`` (one or neither) and ``--threads``."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--workers",
        type=positive,
        metavar="N",
        help=f"run on a local Dask cluster of N worker processes, one task per worker, a task "
        f"per {unit}; needs 'kvselect[distributed]'; the numbers are the serial run's, timing "
        f"excepted (default: serial, in this process)",
    )
    where.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        help="run on the existing Dask cluster at ADDRESS (tcp://host:8786); its workers read "
        "the dumps themselves, so give paths or URLs they can open (default: serial)",
    )
    parser.add_argument(
        "--threads",
        type=thread_count,
        help="kvselect threads per task, 0 = all cores (default: all cores serially; on Dask, "
        "each worker's share of its machine's cores)",
    )


def executor_of(args: argparse.Namespace) -> Any:
    """Where the run's tasks go: ``--workers`` / ``--scheduler``, else serial."""
    from kvselect.corpus import Dask, Serial

    if args.workers is not None:
        return Dask(workers=args.workers)
    if args.scheduler is not None:
        return Dask(scheduler=args.scheduler)
    return Serial()


def progress_bar(enabled: bool) -> Optional[Callable[[int], Any]]:
    """A progress bar over a run's tasks on a terminal (tqdm), or None."""
    if not enabled:
        return None
    from tqdm import tqdm

    return lambda total: tqdm(total=total, desc="tasks", unit="task", leave=False, file=sys.stderr)
