"""A dump of one kernel call, checked: :func:`check_dump` picks the kind's
checker (token top-k, blocks, witness rows) and merges the reports."""

from __future__ import annotations

import os
from typing import Any, Optional

import kvselect as ks
from kvselect.checking._common import (
    FILLERS,
    Dump,
    DumpError,
    _in_dump_terms,
    _text,
    _tolerance,
)
from kvselect.checking.dumps import load_dump, validate
from kvselect.checking.report import Report, dump_report


def check_dump(
    dump: Any, *, atol: Optional[float] = None, rtol: Optional[float] = None, filler: Optional[str] = None
) -> Report:
    """Check a dump of one kernel call: the kind's checker, its reports merged.

    A ``topk`` dump is checked against the exact scores (given, or computed
    from the indexer's inputs) and, with ``engine_scores``, against the
    engine's own scores exactly; a ``blocks`` dump against the exact block
    scores; a ``v4_combined`` dump by :func:`check_v4_combined_indices`; a
    ``witnesses`` dump against the witness rule (exact). Given ``scores``
    without ``magnitudes`` and no ``rtol`` get ``rtol = 0`` and a note.

    Parameters
    ----------
    dump : str, os.PathLike, Dump or Mapping of str to array_like
        A path (read with :func:`load_dump`), the :class:`Dump` it returns,
        or a dict of the dump's arrays (checked with :func:`validate`); its
        kind one of :data:`CHECK_KINDS`.
    atol : float, optional
        The absolute tolerance; None (the default) is 0.
    rtol : float, optional
        The relative tolerance; None (the default) is the default of
        the dump's ``precision`` (:data:`DEFAULT_RTOL`).
    filler : str, optional
        One of :data:`FILLERS`, overriding a ``topk`` dump's ``filler``
        (``kvselect check --filler``); None (the default) reads the dump's
        (default ``"-1"``).

    Returns
    -------
    Report
        ``kind``; ``tolerance`` (``precision``, ``atol``, ``rtol`` and a
        ``note`` or None; ``"exact"``, 0, 0 for witnesses); ``filler``
        (topk dumps only); ``rows``; ``correct`` and ``wrong``, the number
        of rows every check found right and some check found wrong;
        ``by_reason``, the rows with each reason in any check; ``details``,
        each wrong row once with the problems of every check (each naming
        its ``check``); and one entry per check in ``checks`` (``name`` and
        the checker's ``report``, with ``vacuous`` for a topk check). See
        :class:`Report`.

    Raises
    ------
    DumpError
        When the dump cannot be read or checked: every refusal of
        :func:`load_dump` / :func:`validate`; a kind not in
        :data:`CHECK_KINDS`; an unknown ``precision``; ``filler`` given for a
        dump that is not ``topk``, or not one of :data:`FILLERS`; a missing
        key, a wrong shape, arrays that do not fit together, a non-finite
        operand (the native refusals, and any ``TypeError``, ``ValueError``,
        ``IndexError`` or ``KeyError`` on the way, re-raised as a
        ``DumpError`` in the dump's terms: never a traceback).
    OSError
        When a path cannot be opened for reading (from :func:`load_dump`).
    """
    from kvselect.rules import dump_kinds  # not at import: the rules import checking

    kinds = dump_kinds()
    check_kinds = tuple(kinds)
    if isinstance(dump, (str, os.PathLike)):
        d = load_dump(dump, expect=check_kinds)
    elif isinstance(dump, Dump):
        d = dump
        if d.kind not in check_kinds:
            raise DumpError(f"a {d.kind} dump, not {' or '.join(check_kinds)}")
    else:
        d = validate(dump, expect=check_kinds)
    kind = d.kind
    rule = kinds[kind]
    precision, atol_, rtol_ = _tolerance(d, atol, rtol)
    if filler is not None and not rule.fillers:
        raise DumpError(f"--filler applies to topk dumps (token rows), not a {kind} dump")
    fill = filler if filler is not None else _text(d, "filler", "-1")
    if fill not in FILLERS:
        where = "--filler" if filler is not None else "the dump's filler"
        raise DumpError(f"{where} must be one of {', '.join(map(repr, FILLERS))}, got {fill!r}")
    assert fill is not None
    note = None
    if rtol is None and rule.no_rtol is not None:
        note = rule.no_rtol(d)
        if note is not None:
            rtol_ = 0.0  # no error scale for the scores: only atol applies
    if rule.exact:
        precision, atol_, rtol_ = "exact", 0.0, 0.0
    try:
        checks = rule.check(d, atol_, rtol_, precision, fill)
    except ks.KvselectError as e:
        raise DumpError(f"the dump's arrays do not fit together: {_in_dump_terms(str(e))}") from e
    except KeyError as e:
        raise DumpError(f"the dump has no {e}") from e
    except (TypeError, ValueError, IndexError) as e:  # never a traceback: name what is off
        raise DumpError(f"the dump cannot be checked: {_in_dump_terms(str(e))}") from e
    tolerance = {"precision": precision, "atol": atol_, "rtol": rtol_, "note": note}
    return dump_report(kind, tolerance, checks, fill if rule.fillers else None)


# The API's argument names that are not the dump's keys, and the dump's.
