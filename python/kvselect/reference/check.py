"""Is an engine's selection right? The token top-k, block and witness rules
applied to an engine's rows (row-relative or ``GlobalSlots`` global slot
ids), with the native checkers' reports; the twin of ``src/check/``.

Part of ``kvselect.reference``; see that package's docstring.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

from ._args import (
    _I64_MAX,
    _SELECTION,
    _WITNESS,
    ReferenceSelectionError,
    _count,
    _float_array,
    _index_array,
    _refuse,
    _takes_out,
)
from .block_sparse import config_fields, flag_argument
from .witness import MAX_TOPOLOGY_SEGMENTS, merge_witnesses, witness_table

# ==========================================================================
# check: is an engine's selection right?
# --------------------------------------------------------------------------
# Written from the module docs of ``src/check/`` (the rule, its tolerance and
# the report), independently of the code there.
#
# Token top-k (``check_topk``). A row for context L and budget topk is
# correct iff its valid (non-negative) entries come first, then only
# padding; they are distinct and causal (0 <= x < L); there are exactly
# min(topk, L') of them, L' the candidates whose score is not -inf (-inf is
# not selectable: it does not count toward the size; which entries is
# decided by the order below, NaN selectable) (so rows may be narrower than
# topk when every row's min(topk, L) fits them: a row that could hold more
# is refused); and every selected position scores at least every
# unselected one up to e_t = atol + rtol*|m_t| on each side: with
# lo_t = s_t - e_t and hi_t = s_t + e_t, the row is right iff max over
# unselected b of lo_b <= min over selected a of hi_a (NaN ranks below every
# number and no tolerance makes it tie with one; two infinities of one sign
# tie; -0.0 is +0.0). Structure is judged in slot order (one padding hole
# reported, the first), the selection only when the structure is sound. A
# wrong selection names its threshold T (the exact min(topk, L)-th best
# score among the candidates) and lists the dropped (unselected b not below
# T that beat the worst selected beyond the tolerance) and the intruders
# (selected a strictly below T that the best unselected beats), by how far
# past the line, then by position, the first 16 of each (either list, when
# that leaves it empty: every position past the line, whatever T).
#
# Blocks (``check_blocks``, MiniMax-M3). A row for a query that sees n
# blocks owes the same structure (0 <= b < n); the forced blocks
# [0, min(init, n)) and [max(n - local, min(init, n)), n) must all be
# present (``missing_forced``: the first 16, and how many); it holds exactly
# min(max(top, #forced), n) blocks; and the chosen free blocks score at
# least the rejected free ones, by the token rule with the free blocks as
# the candidates (the forced ones never enter the comparison).
#
# Global slot ids (``GlobalSlots``, vLLM's index converter inverted): an
# entry g >= 0 of a decode row names page g // stride at offset g % stride;
# the page is looked up among the non-negative entries of the row's request
# in the block table (the first logical block holding it wins) and, with
# offset < block_size, is position b * block_size + offset; a prefill row
# (prefill_req_ids[row] >= 0) holds t = g - workspace_starts[that] instead.
# An entry naming no page of the table, an offset past the page, or a
# prefill t < 0 names no position: ``not_in_table``, with the engine's value
# (negative entries stay padding).
#
# Witnesses (``check_witnesses``): the rule is integer-exact, so a row is
# correct iff it equals scatter_topology_witnesses of the buffer before the
# call. A row that differs is told apart by the contracts: slots before
# keep = topk - S (``prefix_changed``), the witness run (``wrong_witness``,
# with the witness the rule writes there and why the engine's entry is
# wrong), the slots after it (``tail_changed``); each names its first
# differing slot and how many differ.
# ==========================================================================

_CHECK_REASONS = ("padding_hole", "duplicate", "not_causal", "not_in_table", "wrong_count", "wrong_selection")
_BLOCK_REASONS = (
    "padding_hole",
    "duplicate",
    "not_causal",
    "not_in_table",
    "missing_forced",
    "wrong_count",
    "wrong_selection",
)
_WITNESS_REASONS = ("prefix_changed", "wrong_witness", "tail_changed")
_MAX_LISTED = 16
#: A row-relative id standing for an engine entry that names no position of
#: its row (as the native checker reads it back): reported ``not_in_table``.
_UNMAPPED = _I64_MAX


def _excess(b: tuple, a: tuple) -> float:
    """How far unselected ``b = (nan, lo, hi)`` sits above selected ``a``."""
    if b[0]:
        return -math.inf
    if a[0]:
        return math.inf
    d = b[1] - a[2]
    return 0.0 if math.isnan(d) else d


def _kth_best(scores: np.ndarray, k: int) -> float:
    """The k-th best score in the rule's order (NaN lowest, -0.0 is +0.0)."""
    numbers = np.sort(scores[~np.isnan(scores)].astype(np.float64))[::-1] + 0.0
    return float(numbers[k - 1]) if k <= len(numbers) else math.nan


_FILLERS = ("-1", "past_context", "repeat")


def _filler(filler: Any) -> str:
    """The ``filler=`` rule, checked (see :func:`check_topk`)."""
    if not isinstance(filler, str):
        raise TypeError(f"filler must be a string, got {type(filler).__name__}")
    if filler not in _FILLERS:
        names = ", ".join(f'"{f}"' for f in _FILLERS)
        raise ReferenceSelectionError("filler", f"filler must be one of {names}, got {filler!r}")
    return filler


def _scan(
    raw: np.ndarray, row: list, n: int, problems: list, holes: bool = False, mapped: bool = True, filler: str = "-1"
) -> dict:
    """The structural half of the rule, shared by tokens and blocks: the
    distinct in-range ids of ``row`` (row-relative, ``_UNMAPPED`` where the
    engine's entry in ``raw`` named no position) as ``{id: slot}`` in slot
    order; what is wrong with the structure appended to ``problems`` (a
    row's not-causal entries one problem with their count, its duplicates
    alike). With ``holes`` (DCP ranks' rows), padding may sit anywhere; the
    entries ``filler`` names (``"past_context"``: at or past ``n``;
    ``"repeat"``: a repeat of an earlier valid entry) are ignored."""
    chosen: dict = {}
    padding, hole = False, holes or filler == "past_context"
    causal: Optional[dict] = None
    dup: Optional[dict] = None
    for slot, x in enumerate(row):
        if x < 0:
            padding = True
            continue
        unmapped = mapped and x == _UNMAPPED
        if filler == "past_context" and not unmapped and x >= n:
            continue
        if filler == "repeat" and x in chosen:
            continue
        if padding and not hole:
            hole = True
            problems.append({"reason": "padding_hole", "slot": slot, "position": int(raw[slot]) if unmapped else x})
        if unmapped:
            problems.append({"reason": "not_in_table", "slot": slot, "value": int(raw[slot])})
            continue
        if x >= n:
            if causal is None:
                causal = {
                    "reason": "not_causal",
                    "slot": slot,
                    "position": x,
                    **({"value": int(raw[slot])} if mapped else {}),
                    "n_slots": 0,
                    "context": n,
                }
                problems.append(causal)
            causal["n_slots"] += 1
            continue
        if x in chosen:
            if dup is None:
                dup = {"reason": "duplicate", "position": x, "first": chosen[x], "slot": slot, "n_slots": 0}
                problems.append(dup)
            dup["n_slots"] += 1
            continue
        chosen[x] = slot
    return chosen


def _selection(
    s: np.ndarray, m: Optional[np.ndarray], atol: float, rtol: float, selected: list, unselected: list, want: int
) -> Optional[dict]:
    """The selection half: None when ``selected`` score at least every one
    of ``unselected`` up to the tolerance, else the ``wrong_selection``
    problem (``want``: how many of the candidates the rule selects)."""

    def bound(t: int) -> tuple:
        rel = rtol * abs(float(m[t])) if (m is not None and rtol != 0) else 0.0
        e = atol if math.isnan(rel) else atol + rel
        v = float(s[t]) + 0.0
        nan = math.isnan(v)
        lo, hi = v - e, v + e  # an infinite score with an infinite bound spans every number
        return (nan, -math.inf if math.isnan(lo) and not nan else lo, math.inf if math.isnan(hi) and not nan else hi)

    if not selected or not unselected:
        return None
    worst = min((bound(a) for a in selected), key=lambda x: (not x[0], x[2]))
    best = max((bound(b) for b in unselected), key=lambda x: (not x[0], x[1]))
    margin = _excess(best, worst)
    if margin <= 0.0:
        return None
    threshold = _kth_best(s[np.array(selected + unselected)], want)

    def rank(v: float) -> tuple:
        return (not math.isnan(v), 0.0 if math.isnan(v) else v + 0.0)

    over = {b: _excess(bound(b), worst) for b in unselected}
    under = {a: _excess(best, bound(a)) for a in selected}
    dropped = [(b, x) for b, x in over.items() if rank(float(s[b])) >= rank(threshold) and x > 0]
    if not dropped:  # tolerances that differ by position: name whoever is past the line
        dropped = list(over.items())
    intruders = [(a, x) for a, x in under.items() if rank(float(s[a])) < rank(threshold) and x > 0]
    if not intruders:
        intruders = list(under.items())
    listed = {}
    for name, v in (("dropped", dropped), ("intruders", intruders)):
        v = sorted((p for p in v if p[1] > 0.0), key=lambda p: (-p[1], p[0]))
        listed[name] = ([(t, float(s[t])) for t, _ in v[:_MAX_LISTED]], len(v))
    return {
        "reason": "wrong_selection",
        "dropped": listed["dropped"][0],
        "intruders": listed["intruders"][0],
        "n_dropped": listed["dropped"][1],
        "n_intruders": listed["intruders"][1],
        "threshold": threshold,
        "margin": margin,
    }


def _check_row(
    s: np.ndarray,
    m: Optional[np.ndarray],
    atol: float,
    rtol: float,
    raw: np.ndarray,
    row: list,
    L: int,
    topk: int,
    holes: bool = False,
    mapped: bool = False,
    filler: str = "-1",
) -> list:
    """One token top-k row (``row`` read back from the engine's ``raw``)."""
    problems: list = []
    chosen = _scan(raw, row, L, problems, holes, mapped, filler)
    expected = min(
        topk, L - int(np.count_nonzero(np.asarray(s[:L], dtype=np.float64) == -np.inf))
    )  # -inf: not selectable
    if len(chosen) != expected:
        problems.append({"reason": "wrong_count", "valid": len(chosen), "expected": expected})
    if not problems:
        unselected = [t for t in range(L) if t not in chosen]
        p = _selection(s, m, atol, rtol, list(chosen), unselected, expected)
        if p is not None:
            problems.append(p)
    return problems


def _check_block_row(
    s: np.ndarray,
    m: Optional[np.ndarray],
    atol: float,
    rtol: float,
    raw: np.ndarray,
    row: list,
    n: int,
    cfg: tuple,
    mapped: bool = False,
) -> list:
    """One block row for a query that sees ``n`` blocks; ``cfg`` is
    ``(block_size, top_blocks, init_blocks, local_blocks)``."""
    _, top, init, local = cfg
    problems: list = []
    chosen = _scan(raw, row, n, problems, False, mapped)
    init_end = min(init, n)
    local_start = max(n - min(local, n), init_end)
    forced = list(range(init_end)) + list(range(local_start, n))
    missing = [b for b in forced if b not in chosen]
    if missing:
        problems.append({"reason": "missing_forced", "blocks": missing[:_MAX_LISTED], "n_missing": len(missing)})
    expected = min(max(top, len(forced)), n)
    if len(chosen) != expected:
        problems.append({"reason": "wrong_count", "valid": len(chosen), "expected": expected})
    if not problems:
        free = range(init_end, local_start)
        p = _selection(
            s,
            m,
            atol,
            rtol,
            [b for b in free if b in chosen],
            [b for b in free if b not in chosen],
            expected - len(forced),
        )
        if p is not None:
            problems.append(p)
    return problems


def _int64_array(name: str, value: Any, ndim: int) -> np.ndarray:
    """An integer array whose values fit int64 (negative ones allowed)."""
    a = np.asarray(value)
    if a.size == 0 and a.dtype.kind not in "iu":
        a = a.astype(np.int64)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got dtype {a.dtype}")
    if a.ndim != ndim:
        raise ReferenceSelectionError(name, f"{name} must be {ndim}-D, got shape {a.shape}")
    if a.size and int(a.max()) > _I64_MAX:
        raise ReferenceSelectionError(name, f"{name} holds values outside int64")
    return a.astype(np.int64)


def _selection_count(name: str, value: Any) -> int:
    """A count argument: a ``TypeError`` if not an integer, refused naming
    ``name`` if negative."""
    try:
        return _count(name, value)
    except ValueError as e:
        raise ReferenceSelectionError(name, str(e)) from None


class GlobalSlots:
    """``kvselect.GlobalSlots``: how an engine wrote its rows as global
    cache slots (vLLM's ``triton_convert_req_index_to_global_index``):
    position ``t`` of request ``r`` is ``block_table[r, t // block_size] *
    block_stride_rows + t % block_size``; a prefill row (``prefill_req_ids
    [row] >= 0``) holds ``workspace_starts[prefill_req_ids[row]] + t``;
    ``req_ids`` names each checked row's request. A page of no tokens or
    overlapping pages are refused here; the rest is judged against the rows
    when a check uses them, as natively."""

    def __init__(
        self,
        block_table: Any,
        req_ids: Any,
        block_size: Any,
        *,
        block_stride_rows: Any = None,
        prefill_req_ids: Any = None,
        workspace_starts: Any = None,
        dcp_size: Any = None,
        dcp_interleave: Any = None,
    ) -> None:
        self.dcp_size = 1 if dcp_size is None else _selection_count("dcp_size", dcp_size)
        self.dcp_interleave = 1 if dcp_interleave is None else _selection_count("dcp_interleave", dcp_interleave)
        if self.dcp_size == 0 or self.dcp_interleave == 0:
            arg = "dcp_size" if self.dcp_size == 0 else "dcp_interleave"
            raise ReferenceSelectionError(arg, f"{arg} must be at least 1")
        table = np.asarray(block_table)
        ndim = 2 if self.dcp_size == 1 else 3
        if table.ndim != ndim or (ndim == 3 and table.shape[0] != self.dcp_size):
            raise ReferenceSelectionError("block_table", f"block_table must be {ndim}-D (one table per DCP rank)")
        # One table per rank: [dcp_size, n_requests, max_blocks].
        n_req, max_blocks = table.shape[-2:]
        flat = table.reshape(self.dcp_size * n_req, max_blocks)
        self.tables = _index_array("block_table", flat, 2, _SELECTION).reshape(self.dcp_size, n_req, max_blocks)
        self.block_table = self.tables[0]
        self.block_size = _selection_count("block_size", block_size)
        self.stride = (
            self.block_size if block_stride_rows is None else _selection_count("block_stride_rows", block_stride_rows)
        )
        self.prefill_req_ids = None if prefill_req_ids is None else _int64_array("prefill_req_ids", prefill_req_ids, 1)
        starts = None if workspace_starts is None else _int64_array("workspace_starts", workspace_starts, 1)
        if (self.prefill_req_ids is None) != (starts is None):
            raise ReferenceSelectionError(
                "workspace_starts", "prefill_req_ids and workspace_starts go together: pass both or neither"
            )
        self.workspace_starts = np.zeros(0, np.int64) if starts is None else starts
        self.req_ids = _index_array("req_ids", req_ids, 1, _SELECTION, positions=True)
        # What no rows can make right is refused at once.
        if self.block_size == 0:
            raise ReferenceSelectionError("block_size", "block_size must be at least 1")
        if self.stride < self.block_size:
            raise ReferenceSelectionError("block_stride_rows", "block_stride_rows is below block_size")

    def _check(self, n_rows: int) -> None:
        """Refuses parameters that do not describe ``n_rows`` rows."""
        n_req, max_blocks = self.block_table.shape
        if self.block_size == 0:
            raise ReferenceSelectionError("block_size", "block_size must be at least 1")
        if self.stride < self.block_size:
            raise ReferenceSelectionError("block_stride_rows", "block_stride_rows is below block_size")
        if max_blocks == 0:
            raise ReferenceSelectionError("block_table", "block_table must have max_blocks >= 1")
        if len(self.req_ids) != n_rows:
            raise ReferenceSelectionError("req_ids", f"req_ids needs one entry per row ({n_rows})")
        if len(self.req_ids) and int(self.req_ids.max()) >= n_req:
            raise ReferenceSelectionError("req_ids", "req_ids names a request past the block table")
        if self.prefill_req_ids is not None:
            p = self.prefill_req_ids
            if len(p) != n_rows:
                raise ReferenceSelectionError("prefill_req_ids", f"prefill_req_ids needs one entry per row ({n_rows})")
            if len(p) and int(p.max()) >= len(self.workspace_starts):
                raise ReferenceSelectionError("prefill_req_ids", "prefill_req_ids names a start past workspace_starts")

    def _relative(self, i: int, raw: np.ndarray) -> list:
        """Row ``i``'s entries as row-relative ids (``_UNMAPPED``: none); with
        DCP, slot ``j`` is rank ``j // (width / dcp_size)``'s, its local
        position mapped back to the request's token."""
        start = None
        if self.prefill_req_ids is not None and self.prefill_req_ids[i] >= 0:
            start = int(self.workspace_starts[self.prefill_req_ids[i]])
        size, il = self.dcp_size, self.dcp_interleave
        share = len(raw) // size
        pages: list = []
        for rank in range(size):
            p: dict = {}
            for b, page in enumerate(int(x) for x in self.tables[rank][self.req_ids[i]]):
                if page >= 0:
                    p.setdefault(page, b)  # the first logical block holding the page
            pages.append(p)
        out = []
        for j, g in enumerate(int(v) for v in raw):
            if g < 0:  # padding stays padding
                out.append(g)
            elif start is not None:  # a prefill row: offset by its workspace start
                t = g - start
                out.append(t if 0 <= t < _UNMAPPED else _UNMAPPED)
            else:
                rank = j // share if share else 0
                page, off = divmod(g, self.stride)
                b = pages[rank].get(page)
                if b is None or off >= self.block_size:
                    out.append(_UNMAPPED)
                    continue
                local = b * self.block_size + off
                t = (local // il) * (size * il) + rank * il + local % il
                out.append(t if t < _UNMAPPED else _UNMAPPED)
        return out

    @_takes_out(np.int64)
    def positions(self, rows: Any, *, out: Any = None) -> np.ndarray:
        """``kvselect.GlobalSlots.positions``: the engine's rows read back
        through the map, int64 row-relative positions, ``-1`` padding,
        ``2**63 - 1`` for an entry naming no position of its request."""
        r = _engine_rows(rows)
        self._check(r.shape[0])
        if self.dcp_size > 1 and r.shape[1] % self.dcp_size:
            raise ReferenceSelectionError("rows", "the rows' width must be a multiple of dcp_size")
        rel = np.array([self._relative(i, r[i]) for i in range(r.shape[0])], dtype=np.int64)
        return np.maximum(rel.reshape(r.shape), -1)

    def __repr__(self) -> str:
        return (
            f"GlobalSlots(<{self.block_table.shape[0]} requests x {self.block_table.shape[1]} blocks>, "
            f"<{len(self.req_ids)} rows>, block_size={self.block_size}, block_stride_rows={self.stride}, "
            f"prefill={self.prefill_req_ids is not None})"
        )


def _check_batch(
    s: np.ndarray,
    r: np.ndarray,
    lens: list,
    m: Optional[np.ndarray],
    atol: float,
    rtol: float,
    layout: Any,
    names: dict,
    need: tuple,
    judge: Any,
    reasons: tuple,
) -> dict:
    """The shared body of the score checks: refusals, then each row judged
    by ``judge(s_i, m_i, raw_i, row_i, len_i, mapped)``. ``names`` maps ``scores``
    and ``lens`` to the caller's argument names; ``need`` is (argument, the
    most ids a row must hold): rows narrower than that are refused, except
    token rows (``"topk"``) where every row's ``min(topk, L)`` fits them."""
    n, t = s.shape
    counts = (n, r.shape[0], len(lens))
    if len(set(counts)) > 1:  # the one that disagrees with the other two is named
        culprit = {(True, False): names["lens"], (False, True): "rows"}.get(
            (counts[0] == counts[1], counts[0] == counts[2]), names["scores"] if counts[1] == counts[2] else "rows"
        )
        raise ReferenceSelectionError(culprit, f"{names['scores']}, rows and {names['lens']} must count the same rows")
    if m is not None and m.shape != s.shape:
        raise ReferenceSelectionError("magnitudes", f"magnitudes must have the shape of {names['scores']}")
    if r.shape[0] != n:
        raise ReferenceSelectionError("rows", f"rows must have one row per {names['lens']} entry")
    if need[1] > r.shape[1]:
        message = f"the rule selects up to {need[1]} but rows hold {r.shape[1]} slots"
        if need[0] != "topk":  # a block row needs the config's width whatever it sees
            raise ReferenceSelectionError(need[0], message)
        for i, L in enumerate(lens):  # a token row selects min(topk, L): that must fit
            if min(need[1], L) > r.shape[1]:
                raise ReferenceSelectionError(
                    need[0], f"{message}: row {i} selects min(topk, {names['lens']}[{i}] = {L}) = {min(need[1], L)}"
                )
    for i, L in enumerate(lens):
        if L > t:
            raise ReferenceSelectionError(names["lens"], f"{names['lens']}[{i}] = {L} is past the scores")
    for name, v in (("atol", atol), ("rtol", rtol)):
        if not (math.isfinite(v) and v >= 0):
            raise ReferenceSelectionError(name, f"{name} must be finite and non-negative")
    if rtol != 0 and m is None:
        raise ReferenceSelectionError("rtol", "rtol > 0 needs magnitudes")
    if m is not None and any((np.isnan(m[i, :L]) | (m[i, :L] < 0)).any() for i, L in enumerate(lens)):
        raise ReferenceSelectionError("magnitudes", "magnitudes must be numbers >= 0 within each row")
    if layout is not None:
        if not isinstance(layout, GlobalSlots):
            raise TypeError(f"slots must be a GlobalSlots or None, got {type(layout).__name__}")
        layout._check(n)
        if layout.dcp_size > 1 and (need[0] == "config" or r.shape[1] % layout.dcp_size):
            raise ReferenceSelectionError(
                "slots",
                "a DCP layout reads token rows of dcp_size ranks side by side: the rows' "
                "width must be a multiple of it (and blocks have no DCP form)",
            )
    details, by_reason = [], dict.fromkeys(reasons, 0)
    for i in range(n):
        row = [int(x) for x in r[i]] if layout is None else layout._relative(i, r[i])
        problems = judge(s[i], None if m is None else m[i], r[i], row, lens[i], layout is not None)
        if problems:
            for reason in {p["reason"] for p in problems}:
                by_reason[reason] += 1
            details.append({"row": i, "problems": problems})
    return {"rows": n, "correct": n - len(details), "wrong": len(details), "by_reason": by_reason, "details": details}


def _engine_rows(rows: Any) -> np.ndarray:
    """An engine's rows: a 2-D integer array (values within int64), int64."""
    r = np.asarray(rows)
    if r.dtype.kind not in "iu":
        raise TypeError(f"rows must hold integers, got dtype {r.dtype}")
    return _int64_array("rows", r, 2)


def check_topk(
    scores: Any,
    rows: Any,
    context_lens: Any = None,
    *,
    topk: Any = None,
    atol: float = 0.0,
    rtol: float = 0.0,
    magnitudes: Any = None,
    slots: Any = None,
    filler: str = "-1",
) -> dict:
    """``kvselect.check_topk``: whether each engine row is a correct top-k of
    its exact scores (see the section's rule), as the native report; with
    ``slots``, the rows are global slot ids read back through it; ``filler``
    the engine's rule for the slots it has no position for (``"-1"``:
    negative entries, after the valid ones; ``"past_context"``: entries at or
    past ``L`` or negative, anywhere; ``"repeat"``: repeats of an earlier
    valid entry, anywhere)."""
    fill = _filler(filler)
    r = _engine_rows(rows)
    ranks = slots.dcp_size if isinstance(slots, GlobalSlots) else 1
    k = r.shape[1] // ranks if topk is None else _selection_count("topk", topk)
    raw_s = np.asarray(scores)
    native = raw_s.dtype.newbyteorder("=")  # byte order is storage, not precision (as natively)
    if raw_s.size and native not in (np.float32, np.float64):  # as natively: compared as given
        raise TypeError(f"scores must be float32 or float64, got dtype {raw_s.dtype}")
    wide = np.float64 if native == np.float64 else np.float32
    s = _float_array("scores", scores, 2, _SELECTION, dtype=wide)
    n, t = s.shape
    lens = (
        [t] * n
        if context_lens is None
        else [int(x) for x in _index_array("context_lens", context_lens, 1, _SELECTION, positions=True)]
    )
    m_wide = np.float64 if np.asarray(magnitudes).dtype == np.float64 else np.float32
    m = None if magnitudes is None else _float_array("magnitudes", magnitudes, 2, _SELECTION, dtype=m_wide)
    a, rt = float(atol), float(rtol)
    return _check_batch(
        s,
        r,
        lens,
        m,
        a,
        rt,
        slots,
        {"scores": "scores", "lens": "context_lens"},
        ("topk", k),
        lambda si, mi, raw, row, L, mp: _check_row(si, mi, a, rt, raw, row, L, k, ranks > 1, mp, fill),
        _CHECK_REASONS,
    )


def check_blocks(
    block_scores: Any,
    rows: Any,
    visible_blocks: Any,
    config: Any = None,
    *,
    atol: float = 0.0,
    rtol: float = 0.0,
    magnitudes: Any = None,
    slots: Any = None,
    head_major: Any = False,
) -> dict:
    """``kvselect.check_blocks``: whether each engine row of block ids (one
    row per (query, head), any order) is a correct block selection under
    ``config`` for a query that sees ``visible_blocks[row]`` blocks, judged
    against ``block_scores [n_rows, n_blocks]`` (see the section's rule).

    Or 3-D, as :func:`block_scores` / :func:`block_sparse_select` give them:
    ``block_scores [n_queries, n_kv_heads, n_blocks]``, ``rows [n_queries,
    n_kv_heads, width]`` (``[n_kv_heads, n_queries, width]`` with
    ``head_major=True``) and ``visible_blocks [n_queries]``: the same check
    of the rows flattened query-major (row ``i * n_kv_heads + h``)."""
    cfg = config_fields(config)
    head_major = flag_argument("head_major", head_major)
    raw = np.asarray(rows)
    if raw.dtype.kind not in "iu":
        raise TypeError(f"rows must hold integers, got dtype {raw.dtype}")
    if raw.ndim not in (2, 3):
        raise ReferenceSelectionError("rows", f"rows must be 2-D or 3-D, got shape {raw.shape}")
    r = _int64_array("rows", raw, raw.ndim)
    # As natively: float64 scores judged as given, any other float as float32.
    wide = np.float64 if np.asarray(block_scores).dtype == np.float64 else np.float32
    s = _float_array("block_scores", block_scores, None, _SELECTION, dtype=wide)
    vis = _index_array("visible_blocks", visible_blocks, 1, _SELECTION, positions=True)
    if s.ndim != r.ndim:  # the forms do not mix: the 3-D one of the pair is named
        raise ReferenceSelectionError(
            "rows" if r.ndim == 3 and s.ndim == 2 else "block_scores",
            f"block_scores must be {r.ndim}-D like rows, got {s.shape}",
        )
    if r.ndim == 2 and head_major:
        raise ReferenceSelectionError("head_major", "head_major=True describes 3-D rows")
    m = None if magnitudes is None else _float_array("magnitudes", magnitudes, None, _SELECTION).astype(np.float32)
    if r.ndim == 3:
        nq, h, t = s.shape
        want = (h, nq, r.shape[2]) if head_major else (nq, h, r.shape[2])
        if r.shape != want:
            raise ReferenceSelectionError("rows", f"rows must be {list(want)}, got {list(r.shape)}")
        if vis.shape != (nq,):
            raise ReferenceSelectionError(
                "visible_blocks", f"visible_blocks must be [n_queries={nq}], got {list(vis.shape)}"
            )
        if m is not None and m.shape != s.shape:
            raise ReferenceSelectionError("magnitudes", "magnitudes must have the shape of block_scores")
        if head_major:
            r = r.transpose(1, 0, 2)
        r = r.reshape(nq * h, r.shape[2])
        s = s.reshape(nq * h, t)
        m = None if m is None else m.reshape(nq * h, t)
        vis = np.repeat(vis, h)
    elif m is not None and m.ndim != 2:
        raise ReferenceSelectionError("magnitudes", "magnitudes must have the shape of block_scores")
    lens = [int(x) for x in vis]
    a, rt = float(atol), float(rtol)
    width = max(cfg[1], cfg[2] + cfg[3])
    return _check_batch(
        s,
        r,
        lens,
        m,
        a,
        rt,
        slots,
        {"scores": "block_scores", "lens": "visible_blocks"},
        ("config", width),
        lambda si, mi, raw, row, nb, mp: _check_block_row(si, mi, a, rt, raw, row, nb, cfg, mp),
        _BLOCK_REASONS,
    )


def _why_wrong(got: int, learned: np.ndarray, L: int, S: int, run: list, slot: int) -> str:
    """Which contract the entry ``got`` in witness slot ``slot`` breaks."""
    if got == int(learned[slot]):
        return "not written: the learned entry is still there"
    if got < 0:
        return "padding where a witness belongs"
    length = max(L, 1)
    if got >= length:
        return "past the context"
    s_eff = min(S, length)
    seg = got * s_eff // length
    if -(-seg * length // s_eff) != got:
        return "not a segment's left edge"
    if any(min(int(x) * s_eff // length, S - 1) == seg for x in learned if x >= 0):
        return "the edge of a segment the learned row already covers"
    if got in run:
        return "a witness in the wrong slot (the run must ascend by segment)"
    return "a witness past the budget, or one the learned row's tail already holds"


def _first_diff(a: np.ndarray, e: np.ndarray, lo: int, hi: int):
    diff = [t for t in range(lo, hi) if a[t] != e[t]]
    return (diff[0], len(diff)) if diff else None


def check_witnesses(before: Any, after: Any, context_lens: Any, num_segments: Any) -> dict:
    """``kvselect.check_witnesses``: whether an engine's in-place witness
    call turned ``before`` into exactly what the rule writes (``after``),
    and if not, which contract each wrong row breaks. The serving layout
    (``keep = topk - S``, at most ``S`` witnesses); refusals are witness
    errors (``ReferenceWitnessError`` naming the argument)."""
    b = _index_array("before", before, 2, _WITNESS)
    a = _index_array("after", after, 2, _WITNESS)
    lens = _index_array("context_lens", context_lens, 1, _WITNESS)
    try:
        S = _count("num_segments", num_segments)
    except ValueError as e:
        raise _refuse(_WITNESS, "num_segments", str(e)) from None
    if a.shape != b.shape:
        raise _refuse(
            _WITNESS, "after", f"after has shape {a.shape} but before {b.shape}: the in-place call keeps the shape"
        )
    rows, topk = len(lens), b.shape[1]
    if lens.shape != (b.shape[0],):
        raise _refuse(_WITNESS, "context_lens", f"context_lens must be [rows={b.shape[0]}], got {list(lens.shape)}")
    if S > MAX_TOPOLOGY_SEGMENTS:
        raise _refuse(_WITNESS, "num_segments", f"num_segments={S} must be at most {MAX_TOPOLOGY_SEGMENTS}")
    b = b.reshape(rows, topk)
    a = a.reshape(rows, topk)
    expected = b.copy()
    keep = topk if S == 0 else max(topk - S, 0)
    table = None
    if S > 0 and topk > 0:
        merge_witnesses(expected, b, lens, keep, S, min(S, topk - keep))
        table = witness_table(b, lens, S)
    details, by_reason = [], dict.fromkeys(_WITNESS_REASONS, 0)
    for i in range(rows):
        if np.array_equal(a[i], expected[i]):
            continue
        present = [] if table is None else [int(w) for w in table[i] if w >= 0]
        written = min(len(present), topk - keep)
        problems = []
        d = _first_diff(a[i], expected[i], 0, keep)
        if d:
            problems.append(
                {
                    "reason": "prefix_changed",
                    "slot": d[0],
                    "learned": int(b[i, d[0]]),
                    "got": int(a[i, d[0]]),
                    "n_changed": d[1],
                }
            )
        d = _first_diff(a[i], expected[i], keep, keep + written)
        if d:
            why = _why_wrong(int(a[i, d[0]]), b[i], int(lens[i]), S, present[:written], d[0])
            problems.append(
                {
                    "reason": "wrong_witness",
                    "slot": d[0],
                    "expected": int(expected[i, d[0]]),
                    "got": int(a[i, d[0]]),
                    "why": why,
                    "n_wrong": d[1],
                }
            )
        d = _first_diff(a[i], expected[i], keep + written, topk)
        if d:
            problems.append(
                {
                    "reason": "tail_changed",
                    "slot": d[0],
                    "learned": int(b[i, d[0]]),
                    "got": int(a[i, d[0]]),
                    "n_changed": d[1],
                }
            )
        for reason in {p["reason"] for p in problems}:
            by_reason[reason] += 1
        details.append({"row": i, "problems": problems})
    return {
        "rows": rows,
        "correct": rows - len(details),
        "wrong": len(details),
        "by_reason": by_reason,
        "details": details,
    }
