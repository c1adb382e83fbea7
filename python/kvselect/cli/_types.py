"""The command line's argument types and checks, shared by its subcommands:
argparse types that name what they expect, and the one check that an
output path can be written before a run starts."""

from __future__ import annotations

import argparse
import os
from typing import List, Optional


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


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, except that a flag is never broken at its hyphen."""

    def _split_lines(self, text: str, width: int) -> List[str]:
        import textwrap

        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


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
