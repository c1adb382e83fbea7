"""Segment witnesses, the null models and the scalar metrics, written from
``spec/segment-witnesses.md`` (the twin of ``src/witness/``).

Part of ``kvselect.reference``; see that package's docstring.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ._args import (
    _WITNESS,
    ReferenceWitnessError,
    _count,
    _deliver,
    _float_array,
    _index_array,
    _inplace_i32,
    _out_buffer,
    _overlaps,
    _refuse,
    _takes_out,
)

# ==========================================================================
# witness: segment witnesses, null models, scalar metrics
# --------------------------------------------------------------------------
# Written from spec/segment-witnesses.md.
#
# A row of context length ``L >= 1`` and a segment count ``S >= 1`` put
# ``S_eff = min(S, L)`` and cut ``[0, L)`` into ``S_eff`` segments with left
# edges ``e_s = ceil(s * L / S_eff)`` and segment map
# ``sigma(x) = floor(x * S_eff / L)``. A learned row occupies the segments of
# its non-negative entries (an entry ``x >= L`` marks
# ``min(floor(x * S_eff / L), S - 1)``, possibly outside the partition; any
# negative entry is padding and marks nothing). Its witnesses are the edges
# of the segments ``s < S_eff`` it does not occupy. A row with ``L <= 0``
# gets no witnesses. The merge keeps slots ``[0, keep)`` and writes the
# witnesses, in ascending segment order, into slots ``keep, keep + 1, ...``,
# at most ``B = min(max_replacements, topk - keep)`` of them; later slots are
# left as they were. Occupancy is read from the whole learned row, tail
# included.
#
# Arithmetic is done in int64 (or Python ints for scalars). Every product
# the rule forms is below 2**62 for int32 inputs: ``x * S_eff`` with
# ``x < 2**31`` and ``S_eff <= L < 2**31``, and ``s * L`` with
# ``s < S_eff <= L < 2**31``.
# ==========================================================================

#: The most segments the merge accepts (the fused kernel's 64-bit mask).
MAX_TOPOLOGY_SEGMENTS = 64


def _check_rows(learned: np.ndarray, context_lens: np.ndarray) -> None:
    rows = len(context_lens)
    topk = learned.shape[1]
    if learned.size != topk * rows:
        raise ReferenceWitnessError(
            "RowsMismatch",
            f"learned has {learned.size} entries, but topk={topk} x {rows} rows",
            argument="context_lens",
            learned_len=int(learned.size),
            topk=int(topk),
            rows=int(rows),
        )


def _check_merge_segments(num_segments: int) -> None:
    if num_segments == 0 or num_segments > MAX_TOPOLOGY_SEGMENTS:
        raise ReferenceWitnessError(
            "SegmentsOutOfRange",
            f"num_segments={num_segments} must be between 1 and {MAX_TOPOLOGY_SEGMENTS}",
            argument="num_segments",
            num_segments=num_segments,
        )


def _check_keep(learned_keep: int, topk: int) -> None:
    if learned_keep > topk:
        raise ReferenceWitnessError(
            "LearnedKeepOutOfRange",
            f"learned_keep={learned_keep} is wider than the row (topk={topk})",
            argument="learned_keep",
            learned_keep=learned_keep,
            topk=topk,
        )


def segment_of(token: int, context_len: int, num_segments: int) -> int:
    """The segment map itself, ``floor(token * S_eff / L')`` with
    ``L' = max(L, 1)`` and ``S_eff = min(S, L')``; not clamped (only the
    merge's occupancy pass clamps to ``S - 1``). Exact on Python ints."""
    token = _count("token", token)
    context_len = _count("context_len", context_len)
    num_segments = _count("num_segments", num_segments)
    length = max(context_len, 1)
    s_eff = min(num_segments, length)
    return token * s_eff // length


def witness_table(learned: np.ndarray, context_lens: np.ndarray, num_segments: int) -> np.ndarray:
    """int64 ``[rows, num_segments]``: slot ``s`` holds ``e_s`` when segment
    ``s < S_eff`` exists and the learned row does not occupy it, else -1.

    ``learned`` and ``context_lens`` are int64, shapes already checked, and
    ``num_segments >= 1``.
    """
    rows = len(context_lens)
    S = num_segments
    if rows == 0:
        return np.full((0, S), -1, dtype=np.int64)

    L = context_lens
    live = L > 0  # rows with L <= 0 get no witnesses
    L_safe = np.where(live, L, 1)
    S_eff = np.minimum(S, L_safe)

    # Occupancy, from every non-negative entry of the whole row.
    occupied = np.zeros((rows, S), dtype=bool)
    if learned.shape[1] > 0:
        marks = learned >= 0
        seg = np.minimum(learned * S_eff[:, None] // L_safe[:, None], S - 1)
        r, _ = np.nonzero(marks)
        occupied[r, seg[marks]] = True

    s = np.arange(S, dtype=np.int64)[None, :]
    edges = -((-s * L_safe[:, None]) // S_eff[:, None])  # ceil(s * L / S_eff)
    is_witness = live[:, None] & (s < S_eff[:, None]) & ~occupied
    return np.where(is_witness, edges, -1)


def topology_witness_indices(
    learned: Any, context_lens: Any, num_segments: int, *, out: Optional[np.ndarray] = None
) -> np.ndarray:
    """The witnesses of every learned row: int32 ``[rows, num_segments]``
    with ``rows = len(context_lens)`` (a new array, or ``out`` filled).

    Refuses ``num_segments = 0`` (any positive count is accepted, including
    more than 64) and a ``learned`` whose size is not ``topk * rows``.
    """
    raw = (learned, context_lens)
    learned = _index_array("learned", learned, 2, _WITNESS)
    context_lens = _index_array("context_lens", context_lens, 1, _WITNESS)
    num_segments = _count("num_segments", num_segments)
    if num_segments == 0:
        raise ReferenceWitnessError(
            "SegmentsOutOfRange", "num_segments must be positive", argument="num_segments", num_segments=0
        )
    _check_rows(learned, context_lens)
    out = _out_buffer(out, "out", (len(context_lens), num_segments), _WITNESS, np.int32, raw)
    learned = learned.reshape(len(context_lens), learned.shape[1])
    return _deliver(witness_table(learned, context_lens, num_segments), out)


def merge_witnesses(
    out: np.ndarray,
    learned: np.ndarray,
    context_lens: np.ndarray,
    keep: int,
    num_segments: int,
    budget: int,
) -> None:
    """Writes the witnesses of ``learned`` into ``out[:, keep:keep + budget]``
    in ascending segment order; slots past the last witness are untouched.
    (With ``budget > 0``, ``topk > 0``, so ``learned`` is ``[rows, topk]``.)"""
    if budget == 0 or len(context_lens) == 0:
        return
    table = witness_table(learned, context_lens, num_segments)
    is_witness = table >= 0
    rank = np.cumsum(is_witness, axis=1) - 1  # position among the row's witnesses
    written = is_witness & (rank < budget)  # witnesses past the budget are dropped
    r, s = np.nonzero(written)
    out[r, keep + rank[r, s]] = table[r, s]


def apply_topology_witnesses(
    learned: Any,
    context_lens: Any,
    learned_keep: int,
    num_segments: int,
    max_replacements: int,
    *,
    out: Optional[np.ndarray] = None,
) -> np.ndarray:
    """The learned rows with witnesses merged in, int32 ``[rows, topk]`` (a
    new array, or ``out`` filled).

    Slots ``[0, learned_keep)`` are kept, witnesses in ascending segment
    order overwrite slots ``learned_keep, ...``, at most
    ``B = min(max_replacements, topk - learned_keep)`` of them.
    """
    raw = (learned, context_lens)
    learned = _index_array("learned", learned, 2, _WITNESS)
    context_lens = _index_array("context_lens", context_lens, 1, _WITNESS)
    learned_keep = _count("learned_keep", learned_keep)
    num_segments = _count("num_segments", num_segments)
    max_replacements = _count("max_replacements", max_replacements)
    out = _out_buffer(out, "out", learned.shape, _WITNESS, np.int32, raw)
    _check_rows(learned, context_lens)
    _check_merge_segments(num_segments)
    topk = learned.shape[1]
    _check_keep(learned_keep, topk)

    budget = min(max_replacements, topk - learned_keep)
    merged = learned.copy()
    merge_witnesses(merged, learned, context_lens, learned_keep, num_segments, budget)
    return _deliver(merged, out)


def scatter_topology_witnesses(topk_indices: np.ndarray, context_lens: Any, num_segments: int) -> None:
    """The serving entry point: merges witnesses into the int32 array
    ``topk_indices`` in place with ``keep = max(topk - S, 0)`` and
    ``max_replacements = S``. ``num_segments = 0`` is the off switch."""
    # In the native binding's order: the lengths, the buffer (checked even with the
    # off switch, and sharing no memory with the lengths), then the count.
    lens = _index_array("context_lens", context_lens, 1, _WITNESS)
    _inplace_i32("topk_indices", topk_indices, 2, _WITNESS)
    if _overlaps(topk_indices, (context_lens,)):
        raise _refuse(_WITNESS, "topk_indices", "topk_indices overlaps another argument's memory")
    num_segments = _count("num_segments", num_segments)
    if num_segments == 0:
        return None
    context_lens = lens
    learned = topk_indices.astype(np.int64)
    _check_rows(learned, context_lens)
    _check_merge_segments(num_segments)
    topk = learned.shape[1]
    keep = max(topk - num_segments, 0)
    budget = min(num_segments, topk - keep)

    merged = learned.copy()
    merge_witnesses(merged, learned, context_lens, keep, num_segments, budget)
    _deliver(merged, topk_indices)
    return None


@_takes_out(np.int32, _WITNESS)
def locality_null(context_len: int, budget: int, *, out: Any = None) -> np.ndarray:
    """The ``k = min(budget, L)`` most recent tokens, ``[L - k, L)``, int32."""
    context_len = _count("context_len", context_len)
    budget = _count("budget", budget)
    k = min(budget, context_len)
    return np.arange(context_len - k, context_len, dtype=np.int64).astype(np.int32)


def _distinct_in_range(candidates: np.ndarray, context_len: int) -> np.ndarray:
    """The distinct entries ``0 <= x < L`` of an int64 candidate row."""
    return np.unique(candidates[(candidates >= 0) & (candidates < context_len)])


def segment_coverage(candidates: Any, context_len: int, num_segments: int) -> float:
    """``|{sigma(x) : x in C, 0 <= x < L}| / S_eff``; 1.0 when ``S_eff = 0``.
    Padding, duplicates and out-of-range entries count for nothing."""
    context_len = _count("context_len", context_len)
    num_segments = _count("num_segments", num_segments)
    s_eff = min(num_segments, context_len)
    if s_eff == 0:
        return 1.0
    c = _index_array("candidates", candidates, 1, _WITNESS)
    x = _distinct_in_range(c, context_len)
    segments = np.unique(x * s_eff // context_len)  # x < L, so no clamp is needed
    return len(segments) / s_eff


def attention_mass_recall(candidates: Any, attention_row: Any) -> float:
    """``sum(a_x for distinct x in C, 0 <= x < L) / sum(a)`` with
    ``L = len(attention_row)``, the plain quotient as in the original: NaN for
    0/0, ``±inf`` for something kept from a row summing to 0."""
    a = _float_array("attention_row", attention_row, 1, _WITNESS, dtype=np.float64)
    total = np.sum(a)
    c = _index_array("candidates", candidates, 1, _WITNESS)
    x = _distinct_in_range(c, len(a))
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.sum(a[x]) / total)
