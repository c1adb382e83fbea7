"""The report a kernel author acts on: :class:`Report`, the one type every
checker returns, and :func:`format_report`'s text (what ``kvselect check``
prints) from a :func:`check_dump` result."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np


class Report(Dict[str, Any]):
    """What every checker returns: one report type, a ``dict``.

    Index it (``report["correct"]``), iterate it, ``json.dumps`` it, pickle
    it: it is a ``dict`` of plain Python data. Every checker returns it —
    :func:`kvselect.check_topk`, :func:`kvselect.check_blocks`,
    :func:`kvselect.check_witnesses`, :func:`check_indexer_topk`,
    :func:`check_v4_combined_indices`, :func:`check_dump` and the
    assertions of :mod:`kvselect.testing` — with the same core keys on every
    path, so a harness written against one reads any other:

    - ``rows``, ``correct``, ``wrong`` (int): the rows checked, the rows
      every check found right, the rows some check found wrong;
    - ``by_reason`` (dict of str to int): for each reason, how many rows
      have it (a row counted once per reason; every reason of the check,
      0 when none);
    - ``details`` (list): one entry per wrong row, in row order: its
      ``row``, its ``problems`` (each a dict with its ``reason`` and what
      was found), and for a block check the row's ``query`` and ``kv_head``.

    A token top-k check adds ``vacuous`` (int): the rows no selection could
    fail at the tolerance. A dump's report (:func:`check_dump`, the
    assertions) adds ``kind``; ``tolerance`` (``precision``, ``atol``,
    ``rtol``, ``note``); ``filler`` (``topk`` dumps); and ``checks``, one
    entry per check (``name`` and its own ``report``, a :class:`Report`).
    There the core keys are computed from the checks: ``wrong`` counts the
    rows some check found wrong, ``by_reason`` the rows with each reason in
    any check, and ``details`` holds each wrong row once with the problems
    of every check (each problem naming its ``check``).

    The JSON schema of the report is in ``docs/report-schema.md``
    (``kvselect check --json`` writes it, a non-finite number as the string
    ``"nan"``, ``"inf"`` or ``"-inf"``: :func:`strict_json`).
    """

    CORE_KEYS = ("rows", "correct", "wrong", "by_reason", "details")
    """The keys of every report."""

    DUMP_KEYS = ("kind", "tolerance", "checks")
    """The keys a dump's report adds (and ``filler`` for a ``topk`` dump)."""


def dump_report(
    kind: str,
    tolerance: Dict[str, Any],
    checks: Sequence[Tuple[str, Mapping[str, Any]]],
    filler: Optional[str] = None,
) -> Report:
    """A dump's report from its checks' reports (``(name, report)`` in
    order, each over the same rows): the dump keys, and the core keys
    computed from the checks (see :class:`Report`)."""
    merged: Dict[int, Dict[str, Any]] = {}
    by_reason: Dict[str, int] = {}
    for name, r in checks:
        by_reason.update((reason, 0) for reason in r["by_reason"] if reason not in by_reason)
        for x in r["details"]:
            row = merged.setdefault(x["row"], {k: v for k, v in x.items() if k != "problems"})
            row.setdefault("problems", []).extend(dict(p, check=name) for p in x["problems"])
    details: List[Dict[str, Any]] = [merged[i] for i in sorted(merged)]
    for x in details:
        for reason in dict.fromkeys(p["reason"] for p in x["problems"]):
            by_reason[reason] = by_reason.get(reason, 0) + 1
    n = int(checks[0][1]["rows"])
    out = Report(kind=kind, tolerance=tolerance)
    if filler is not None:
        out["filler"] = filler
    out.update(rows=n, correct=n - len(details), wrong=len(details), by_reason=by_reason, details=details)
    out["checks"] = [{"name": name, "report": r if isinstance(r, Report) else Report(r)} for name, r in checks]
    return out


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


def _labels(values: Sequence[Any]) -> Dict[Any, str]:
    """Each of ``values``' text, told apart from every other listed value:
    :func:`_digits`' form, except that values whose forms collide (a float32
    ``1.0000001`` and a float64 that also prints ``1.0000001``) print the
    shortest repr that round-trips their float64 value
    (``1.0000001192092896``), which two different values never share."""
    keys = list(dict.fromkeys(_key(v) for v in values))
    text = {k: _digits(k[1]) for k in keys}
    seen: Dict[str, int] = {}
    for k in keys:
        seen[text[k]] = seen.get(text[k], 0) + 1
    for k in keys:
        if seen[text[k]] > 1:
            text[k] = repr(k[1])
    # a switched value's float64 repr cannot be another value's form (a float32's
    # str parses back to that float32; a float64's repr to that float64): a guard
    if len(set(text.values())) < len(keys):
        text = {k: repr(k[1]) for k in keys}
    return text


def _key(x: Any) -> Tuple[str, float]:
    """A dict key for a score: its float64 value's repr (so ``-0.0`` and
    ``0.0`` differ, and a NaN equals a NaN) with the value itself."""
    v = float(x)
    return (repr(v), v)


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
        scores = [s for _, s in p["dropped"]] + [s for _, s in p["intruders"]] + [p["threshold"]]
        label = _labels(scores)

        def few(pairs):
            return ", ".join(f"{t} ({label[_key(s)]})" for t, s in pairs)

        return (
            f"wrong selection: dropped {p['n_dropped']} [{few(p['dropped'])}], "
            f"intruders {p['n_intruders']} [{few(p['intruders'])}]; "
            f"threshold {label[_key(p['threshold'])]}, margin {p['margin']:.3g}"
        )
    if r == "wrong_witness":
        return (
            f"wrong witness in slot {p['slot']}: {p['got']} where the rule writes "
            f"{p['expected']} — {p['why']} ({p['n_wrong']} slot(s))"
        )
    if "of" in p and "ratio" in p:  # a sparse attention row (kvselect.checking.attention)
        at = f"[{p['element']}]" if "element" in p else ""
        text = f"{r.replace('_', ' ')}: {p['of']}{at} {_digits(p['got'])}, exact {_digits(p['expected'])}"
        if np.isfinite(p["error"]):
            text += f", error {p['error']:.3g} > bound {p['bound']:.3g}"
        if p.get("note"):
            text += f" — {p['note']}"
        if p.get("why"):
            text += f"; likely cause: {p['why']}"
        return text
    fields = ", ".join(f"{k} {v}" for k, v in p.items() if k != "reason")
    return f"{r.replace('_', ' ')}: {fields}"


def _severity(row: dict) -> Tuple[int, float]:
    """Structural faults first, then selections by margin; sparse attention
    rows with a named cause first, then by their worst error over bound."""
    if any("ratio" in p for p in row["problems"]):
        named = any("cause" in p for p in row["problems"])
        return (0 if named else 1, -max(p.get("ratio", 0.0) for p in row["problems"]))
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
    models = [c["report"]["model"] for c in result["checks"] if isinstance(c["report"].get("model"), dict)]
    if models and models[0]["name"] != "tolerance":  # a sparse attention check: its bound is the model's
        tol = f"arithmetic model {models[0]['name']}"
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
            if "kv_head" in row:
                where += f" (query {row['query']}, KV head {row['kv_head']})"
            elif "head" in row:
                where += f" (query {row['query']}, head {row['head']})"
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
