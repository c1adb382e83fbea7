"""The report a kernel author acts on: :func:`format_report`'s text (what
``kvselect check`` prints) from a :func:`check_dump` result."""

from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np


def _digits(x: Any) -> str:
    """A score with every digit it needs to be told apart from any other:
    the shortest repr that round-trips, float32's when the value is a
    float32 (``1.0000001``, not ``1``)."""
    x = float(x)
    if not np.isfinite(x):
        return repr(x)
    with np.errstate(over="ignore"):
        f = np.float32(x)
    return str(f) if float(f) == x else repr(x)


def _describe(p: dict, filler: Optional[str] = None) -> str:
    """One problem in a sentence; ``filler`` (a topk check's rule) adds the
    rule that would take the entries as the engine's filler, when one would."""
    r = p["reason"]
    if r == "not_causal" and "n_slots" in p:
        holds = f"slot {p['slot']} holds {p['value'] if 'value' in p else p['position']}"
        if "value" in p:
            holds += f" (position {p['position']})"
        n = p["n_slots"]
        text = (
            f"not causal: {n} {'entry' if n == 1 else 'entries'} at or past the context {p['context']} (first: {holds})"
        )
        if filler is not None and filler != "past_context":
            text += ' — if that is the engine\'s filler, check with filler="past_context" (--filler past_context)'
        return text
    if r == "duplicate" and "n_slots" in p:
        n = p["n_slots"]
        text = (
            f"duplicate: {n} {'entry repeats' if n == 1 else 'entries repeat'} an earlier one "
            f"(first: slot {p['slot']} repeats position {p['position']} of slot {p['first']})"
        )
        if filler is not None and filler != "repeat":
            text += ' — if that is the engine\'s filler, check with filler="repeat" (--filler repeat)'
        return text
    if r == "wrong_selection":

        def few(pairs):
            return ", ".join(f"{t} ({_digits(s)})" for t, s in pairs)

        return (
            f"wrong selection: dropped {p['n_dropped']} [{few(p['dropped'])}], "
            f"intruders {p['n_intruders']} [{few(p['intruders'])}]; "
            f"threshold {_digits(p['threshold'])}, margin {p['margin']:.3g}"
        )
    if r == "wrong_witness":
        return (
            f"wrong witness in slot {p['slot']}: {p['got']} where the rule writes "
            f"{p['expected']} — {p['why']} ({p['n_wrong']} slot(s))"
        )
    fields = ", ".join(f"{k} {v}" for k, v in p.items() if k != "reason")
    return f"{r.replace('_', ' ')}: {fields}"


def _severity(row: dict) -> Tuple[int, float]:
    """Structural faults first, then selections by margin."""
    m = [p.get("margin", 0.0) for p in row["problems"] if p["reason"] == "wrong_selection"]
    structural = any(p["reason"] != "wrong_selection" for p in row["problems"])
    return (0 if structural else 1, -(m[0] if m else 0.0))


def format_report(result: dict, *, show: int = 5, source: str = "") -> str:
    """The report as text: a summary table, then the worst ``show`` rows of each check in detail.

    What ``kvselect check`` prints: a header (kind, rows, tolerance, a
    non-default filler), the tolerance's note, one line per check and per
    reason, the worst rows (structural faults first, then selections by
    margin), a warning for each check with vacuous rows, and the verdict.

    Parameters
    ----------
    result : dict
        What :func:`check_dump` returns.
    show : int, optional
        How many of each check's wrong rows to describe (default 5); the
        rest are counted.
    source : str, optional
        The dump's name for the header (default ``""``: none).

    Returns
    -------
    str
        The report, lines joined by ``"\\n"`` (no trailing newline).
    """
    t = result["tolerance"]
    tol = (
        "exact"
        if t["precision"] == "exact"
        else (f"precision {t['precision']}: rtol {t['rtol']:.3g}, atol {t['atol']:.3g}")
    )
    fill = result.get("filler")
    fill_text = f", filler {fill!r}" if fill not in (None, "-1") else ""
    lines = [
        f"kvselect check{' ' + source if source else ''}: {result['kind']}, {result['rows']} rows, {tol}{fill_text}"
    ]
    if t.get("note"):
        lines.append(f"note: {t['note']}")
    lines.append("")
    name_w = max(len(c["name"]) for c in result["checks"])
    lines.append(f"{'':{name_w}}  {'rows':>7} {'correct':>8} {'wrong':>7}")
    for c in result["checks"]:
        r = c["report"]
        lines.append(f"{c['name']:{name_w}}  {r['rows']:>7} {r['correct']:>8} {r['wrong']:>7}")
        for reason, n in r["by_reason"].items():
            if n:
                lines.append(f"{'  ' + reason:{name_w}}  {'':>7} {'':>8} {n:>7}")
    for c in result["checks"]:
        details = sorted(c["report"]["details"], key=_severity)
        if not details:
            continue
        lines += ["", f"worst rows {c['name']}:"]
        for row in details[:show]:
            where = f"row {row['row']}"
            if "query" in row:
                where += f" (query {row['query']}, KV head {row['kv_head']})"
            for i, p in enumerate(row["problems"]):
                lines.append(f"  {where if i == 0 else ' ' * len(where)}: {_describe(p, result.get('filler'))}")
        if len(details) > show:
            lines.append(f"  ... and {len(details) - show} more (--show N, or --json FILE)")
    for c in result["checks"]:
        v = c["report"].get("vacuous", 0)
        if not v:
            continue
        exact = t["atol"] == 0 and t["rtol"] == 0 or "own scores" in c["name"]
        if exact:  # no tolerance: every score of those rows is the same number
            lines += [
                "",
                f"warning: {v} of {c['report']['rows']} rows {c['name']} are vacuous — every "
                f"position of such a row has the same score, so any selection of the right "
                f"size is correct there: to test them, dump a case whose scores differ "
                f"(distinct keys, or distinct queries)",
            ]
        else:
            lines += [
                "",
                f"warning: {v} of {c['report']['rows']} rows {c['name']} are vacuous at this "
                f"tolerance — every position's interval meets every other's, so no "
                f"selection could fail them: lower --rtol / --atol to test them",
            ]
    lines += ["", "all rows correct" if result["wrong"] == 0 else f"{result['wrong']} wrong row(s)"]
    return "\n".join(lines)


def strict_json(x: Any) -> Any:
    """The report as strict JSON data.

    A non-finite number (a NaN score, an infinite margin) becomes the string
    ``"nan"``, ``"inf"`` or ``"-inf"``; dicts, lists and tuples are copied
    through (a tuple becomes a list); anything else is returned as it is.

    Parameters
    ----------
    x : Any
        A :func:`check_dump` result, or any part of one.

    Returns
    -------
    Any
        ``x`` with every non-finite ``float`` replaced by its string.
    """
    if isinstance(x, float) and not np.isfinite(x):
        return "nan" if np.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {k: strict_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [strict_json(v) for v in x]
    return x
