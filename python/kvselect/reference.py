"""Plain NumPy reference implementations of kvselect's native functions.

This module is written from the specifications (``spec/segment-witnesses.md``,
``spec/block_sparse.rs.txt``, the module docs of ``src/attention/`` and
``src/metrics.rs``, and the Python API contract of ``design.md``),
independently of the Rust core. It is the oracle of the differential tests:
the native functions of ``kvselect`` must equal these exactly on integer
data (integer outputs, and float outputs computed from integer-valued
inputs), and within a stated tolerance on other float outputs. It favours
being obviously right over being fast, uses only NumPy, and never imports
the native module.

Its sections mirror ``src/``, in that order:

- **witness**: segment witnesses, the null models, the scalar metrics;
- **block_sparse**: MiniMax-M3 block selection over dense, packed and
  paged keys in every key format, query- or head-major, and the positions
  a selection covers (one row or batched);
- **attention**: the baseline selectors, the oracle top-k, the dense and
  sparse attention pass;
- **indexer**: DeepSeek's lightning indexer top-k, with the key formats
  (float16, bfloat16, float8 e4m3fn) decoded from their bits (``decode``,
  which block selection reads its keys and queries through too);
- **metrics**: attention probabilities, batched coverage and recall, the
  output relative error;
- **check**: is an engine's selection right? The token top-k, block and
  witness rules applied to an engine's rows (row-relative or global slot
  ids), with the native checkers' reports.

Each public function takes the signature of the native function of the same
name (``Selector.dense().rows(...)`` and its kin are ``dense_rows`` and its
kin; ``attention`` is the reference's own). Arguments
pass through one conversion layer, the native binding layer's rules:
counts are Python integers, index arrays hold integers whose values fit
int32 (floats are a ``TypeError``), position arrays hold non-negative
integers, float arrays hold floats and are converted to the kernel's type
(the keys and queries of block selection and the indexer are decoded
exactly from their format by ``decode``);
an out-of-range value is a ``ValueError`` (a ``ReferenceSelectionError``
naming the argument for the block-selection and attention functions).
``random_null`` and ``Selector.random`` have no reference: their draws are
ChaCha8's, not a specification's.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

__all__ = [
    # errors
    "ReferenceWitnessError",
    "ReferenceSelectionError",
    # witness
    "MAX_TOPOLOGY_SEGMENTS",
    "segment_of",
    "topology_witness_indices",
    "apply_topology_witnesses",
    "scatter_topology_witnesses",
    "locality_null",
    "segment_coverage",
    "attention_mass_recall",
    # block_sparse
    "MINIMAX_BLOCK_SIZE",
    "BlockSparseConfig",
    "block_scores",
    "block_sparse_select",
    "block_sparse_select_packed",
    "block_sparse_select_paged",
    "positions_of_blocks",
    # attention
    "dense_rows",
    "local_rows",
    "sink_window_rows",
    "oracle_topk",
    "attention",
    "dense_attention",
    "sparse_attention",
    # indexer
    "decode",
    "indexer_topk",
    "indexer_topk_packed",
    "indexer_topk_paged",
    "indexer_scores",
    # check
    "GlobalSlots",
    "check_topk",
    "check_blocks",
    "check_witnesses",
    # metrics
    "attention_probabilities",
    "segment_coverage_rows",
    "attention_mass_recall_rows",
    "output_relative_error",
    "output_relative_error_rows",
]


# ==========================================================================
# Errors
# ==========================================================================


class ReferenceWitnessError(ValueError):
    """A refused call, shaped like ``kvselect.WitnessError``.

    ``variant`` is ``"RowsMismatch"``, ``"SegmentsOutOfRange"`` or
    ``"LearnedKeepOutOfRange"``; the variant's fields are attributes.
    """

    def __init__(self, variant: Optional[str], message: str, *, argument: Optional[str] = None,
                 **fields: int) -> None:
        super().__init__(message)
        self.variant = variant
        self.argument = argument
        for name, value in fields.items():
            setattr(self, name, value)


class ReferenceSelectionError(ValueError):
    """A refused block-selection or attention call, shaped like
    ``kvselect.SelectionError``; ``argument`` names the argument."""

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(message)
        self.argument = argument


# ==========================================================================
# Input conversion: the one layer every public function reads through
# --------------------------------------------------------------------------
# As the native bindings do, a refusal belongs to a domain: a witness-domain
# argument that the bindings refuse (not one of the spec's variants) is a
# plain ``ValueError``; a selection-domain one (block selection, attention,
# the batched metrics) is a ``ReferenceSelectionError`` naming the argument.
# ==========================================================================

_WITNESS = "witness"
_SELECTION = "selection"

_I32_MIN = -(2**31)
_I32_MAX = 2**31 - 1
_I64_MAX = 2**63 - 1


def _refuse(domain: str, argument: str, message: str) -> ValueError:
    """The refusal of ``argument`` in ``domain`` (to be raised)."""
    if domain == _SELECTION:
        return ReferenceSelectionError(argument, message)
    return ReferenceWitnessError(None, message, argument=argument)


def _count(name: str, value: Any) -> int:
    """A count, length or position: a non-negative integer, as a Python int.
    Anything but an integer is a ``TypeError``; a negative one a ``ValueError``."""
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}") from None
    if v < 0:
        raise ValueError(f"{name} must be non-negative, got {v}")
    return v


def _index_array(
    name: str, value: Any, ndim: int, domain: str, *, positions: bool = False
) -> np.ndarray:
    """An integer array of ``ndim`` dimensions, as int64 for the arithmetic.

    Integers of any width are accepted (an empty array of any dtype too);
    floats are a ``TypeError``. An index array's values must fit int32 (the
    native ``int32_array``); a position array's (``positions=True``: query
    positions, offsets, ids, lengths) must be non-negative and fit int64 (the
    native ``int64_array``). A wrong ``ndim`` or value is refused in ``domain``.
    """
    a = np.asarray(value)
    if a.size == 0 and a.dtype.kind not in "iu":
        a = a.astype(np.int64)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got dtype {a.dtype}")
    if a.ndim != ndim:
        raise _refuse(domain, name, f"{name} must be {ndim}-D, got shape {a.shape}")
    if a.size:
        # Compare in the array's own dtype: a cast first could wrap uint64 values.
        lo, hi = int(a.min()), int(a.max())
        if positions and lo < 0:
            raise _refuse(domain, name, f"{name} holds a negative value")
        if positions and hi > _I64_MAX:
            raise _refuse(domain, name, f"{name} holds {hi}, past any position")
        if not positions and (lo < _I32_MIN or hi > _I32_MAX):
            raise _refuse(domain, name, f"{name} holds values outside int32")
    return a.astype(np.int64)


def _float_array(
    name: str, value: Any, ndim: Optional[int], domain: str, *, dtype: Any = np.float32
) -> np.ndarray:
    """A float array of ``ndim`` dimensions (any when None), converted to
    ``dtype`` (what the native kernel computes on: float32 for tensors and
    outputs, float64 for attention rows) and widened to float64 for the
    arithmetic. Non-float data is a ``TypeError`` unless the array is empty."""
    a = np.asarray(value)
    if a.dtype.kind != "f" and a.size > 0:
        raise TypeError(f"{name} must be a float array, got dtype {a.dtype}")
    if ndim is not None and a.ndim != ndim:
        raise _refuse(domain, name, f"{name} must be {ndim}-D, got shape {a.shape}")
    return a.astype(dtype).astype(np.float64)


def _axes(name: str, got: tuple, want: list) -> None:
    """Refuses ``name`` unless its shape is ``want`` (``[(axis, size), ...]``)
    axis by axis, naming both shapes, as the native ``Args::axes``."""
    if tuple(got) != tuple(n for _, n in want):
        axes = ", ".join(f"{a}={n}" for a, n in want)
        raise ReferenceSelectionError(name, f"{name} must be [{axes}], got {list(got)}")


def _query_batch(query_pos: Any) -> np.ndarray:
    """``query_pos`` as int64 ``[n_queries]``: one position per query, or one
    integer (a 0-D array too) for a batch of one query, read as ``[p]``."""
    if np.ndim(query_pos) == 0:
        try:
            return np.array([_count("query_pos", query_pos)], dtype=np.int64)
        except ValueError as e:
            raise ReferenceSelectionError("query_pos", str(e)) from None
    return _index_array("query_pos", query_pos, 1, _SELECTION, positions=True)


def _query_positions(value: Any, n: int) -> np.ndarray:
    """:func:`_query_batch` for a batch of ``n`` queries (fixed by ``index_q``):
    ``[n_queries=n]``, or one integer when ``n`` is 1."""
    if np.ndim(value) == 0:
        if n != 1:
            raise ReferenceSelectionError(
                "query_pos", f"query_pos is one integer (a batch of one query), but index_q has n_queries={n}"
            )
        return _query_batch(value)
    a = np.asarray(value)
    pos = _index_array("query_pos", a, a.ndim, _SELECTION, positions=True)
    _axes("query_pos", pos.shape, [("n_queries", n)])
    return pos


def _along(name: str, value: Any, axis: tuple) -> np.ndarray:
    """A position array (``seq_ids``) whose one axis another argument fixes."""
    a = np.asarray(value)
    out = _index_array(name, a, a.ndim, _SELECTION, positions=True)
    _axes(name, out.shape, [axis])
    return out


def _native_pages(kv_cache: Any) -> np.ndarray:
    """A paged cache as the native call reads it, in place: refused (naming
    ``kv_cache``) in non-native byte order, which is never converted."""
    cache = np.asarray(kv_cache)
    if cache.dtype.itemsize > 1 and not cache.dtype.isnative:
        raise ReferenceSelectionError(
            "kv_cache",
            f"kv_cache has non-native byte order ({cache.dtype.str}): pages are read in place, never "
            "converted; pass native byte order (kv_cache.astype(kv_cache.dtype.newbyteorder('=')))",
        )
    return cache


def _inplace_i32(name: str, value: Any, ndim: int, domain: str, dtype: Any = np.int32) -> np.ndarray:
    """A buffer written in place (``topk_indices``, ``out=``): a writeable
    ndarray of ``dtype`` (int32 unless said) and ``ndim`` dimensions, never
    converted. (The reference computes on copies, so it asks nothing of the
    buffer's memory layout.)"""
    if not isinstance(value, np.ndarray) or value.dtype != dtype:
        raise TypeError(f"{name} must be a {np.dtype(dtype).name} numpy array")
    if value.ndim != ndim:
        raise _refuse(domain, name, f"{name} must be {ndim}-D")
    if not value.flags.writeable:
        raise _refuse(domain, name, f"{name} must be writeable")
    return value


def _out_buffer(out: Any, name: str, shape: tuple, domain: str, dtype: Any, inputs: tuple = ()) -> Optional[np.ndarray]:
    """The caller's output buffer ``name`` (``out=``, ``lse_out=``): None, or
    a writeable ndarray of ``dtype`` and exactly ``shape`` that shares no
    memory with ``inputs`` (checked before anything is written, and before
    any of the spec's refusals, as natively)."""
    if out is None:
        return None
    out = _inplace_i32(name, out, len(shape), domain, dtype)
    if out.shape != tuple(shape):
        raise _refuse(domain, name, f"{name} must have shape {tuple(shape)}, got {out.shape}")
    if any(isinstance(a, np.ndarray) and np.may_share_memory(out, a) for a in inputs):
        raise _refuse(domain, name, f"{name} overlaps another argument's memory")
    return out


def _output(out: Any, shape: tuple, domain: str, dtype: Any = np.int32, inputs: tuple = ()) -> Optional[np.ndarray]:
    """:func:`_out_buffer` for ``out=``."""
    return _out_buffer(out, "out", shape, domain, dtype, inputs)


def _deliver(result: np.ndarray, out: Optional[np.ndarray]) -> np.ndarray:
    """``result`` (int32 unless float32), written into ``out`` and ``out``
    returned when given."""
    if out is None:
        return result if result.dtype == np.float32 else result.astype(np.int32)
    out[...] = result
    return out


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
            learned_len=int(learned.size),
            topk=int(topk),
            rows=int(rows),
        )


def _check_merge_segments(num_segments: int) -> None:
    if num_segments == 0 or num_segments > MAX_TOPOLOGY_SEGMENTS:
        raise ReferenceWitnessError(
            "SegmentsOutOfRange",
            f"num_segments={num_segments} must be between 1 and {MAX_TOPOLOGY_SEGMENTS}",
            num_segments=num_segments,
        )


def _check_keep(learned_keep: int, topk: int) -> None:
    if learned_keep > topk:
        raise ReferenceWitnessError(
            "LearnedKeepOutOfRange",
            f"learned_keep={learned_keep} is wider than the row (topk={topk})",
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


def _witness_table(learned: np.ndarray, context_lens: np.ndarray, num_segments: int) -> np.ndarray:
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
            "SegmentsOutOfRange", "num_segments must be positive", num_segments=0
        )
    _check_rows(learned, context_lens)
    out = _out_buffer(out, "out", (len(context_lens), num_segments), _WITNESS, np.int32, raw)
    learned = learned.reshape(len(context_lens), learned.shape[1])
    return _deliver(_witness_table(learned, context_lens, num_segments), out)


def _merge(
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
    table = _witness_table(learned, context_lens, num_segments)
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
    _merge(merged, learned, context_lens, learned_keep, num_segments, budget)
    return _deliver(merged, out)


def scatter_topology_witnesses(topk_indices: np.ndarray, context_lens: Any, num_segments: int) -> None:
    """The serving entry point: merges witnesses into the int32 array
    ``topk_indices`` in place with ``keep = max(topk - S, 0)`` and
    ``max_replacements = S``. ``num_segments = 0`` is the off switch."""
    _inplace_i32("topk_indices", topk_indices, 2, _WITNESS)
    num_segments = _count("num_segments", num_segments)
    if num_segments == 0:
        return None
    context_lens = _index_array("context_lens", context_lens, 1, _WITNESS)
    learned = topk_indices.astype(np.int64)
    _check_rows(learned, context_lens)
    _check_merge_segments(num_segments)
    topk = learned.shape[1]
    keep = max(topk - num_segments, 0)
    budget = min(num_segments, topk - keep)

    merged = learned.copy()
    _merge(merged, learned, context_lens, keep, num_segments, budget)
    _deliver(merged, topk_indices)
    return None


def locality_null(context_len: int, budget: int) -> np.ndarray:
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


# ==========================================================================
# block_sparse: MiniMax-M3 block selection
# --------------------------------------------------------------------------
# Written from spec/block_sparse.rs.txt and the stubs of the native module
# (``kvselect._core.pyi``).
#
# For one query at ``query_pos`` over ``n_positions`` keys, with block size
# ``bs``:
#
# - the query sees positions ``[0, min(query_pos + 1, n_positions))`` and
#   ``n_blocks = min(query_pos // bs + 1, ceil(n_positions / bs))`` blocks
#   (a query beyond the keys is clipped to what exists; no keys, no blocks);
# - block ``b`` scores the MAX of the raw dot products ``q . k_p`` over its
#   visible positions ``[b*bs, min((b+1)*bs, n_positions, query_pos + 1))``:
#   no scale, one score per KV head (no cross-head reduction); a NaN dot
#   product is ignored (a block of only NaN scores -inf), and -0.0 is +0.0;
# - the first ``init_blocks`` and the newest ``local_blocks`` blocks are
#   forced in; the budget is ``max(top_blocks, #forced)``; the remaining
#   slots go to the other blocks by score descending, ties to the LOWER id;
# - a row is the chosen ids ascending, then -1 up to
#   ``width = max(top_blocks, init_blocks + local_blocks)``.
#
# The batched forms are that one-query rule, query by query:
#
# - dense (``block_sparse_select``, 3-D ``index_q``): every query over all
#   of ``index_k``; packed: query ``i`` over rows ``cu_seqlens[s] ..
#   cu_seqlens[s + 1]`` of ``index_k``, ``s = seq_ids[i]``;
# - paged (``block_sparse_select_paged``): query ``i`` over its sequence's
#   keys gathered from the cache, token ``t`` of sequence ``s`` being
#   ``kv_cache[block_table[s, t // bs], t % bs]`` for ``t < seq_lens[s]``.
#   The page is the block, so ``kv_cache.shape[1]`` must be ``bs``. Only
#   the first ``ceil(seq_lens[s] / bs)`` entries of row ``s`` are read, for
#   every sequence ``s`` (as the native paged indexer checks them): a row
#   shorter than that, or a read entry that is not a page of the cache, is
#   refused; unread entries may hold anything. Ids are the sequence's
#   logical blocks; ``physical=True`` replaces each id ``b >= 0`` of query
#   ``i``'s row by ``block_table[seq_ids[i], b]``, in the same slots;
# - a batched result is ``[n_queries, n_kv_heads, width]``, or with
#   ``head_major=True`` exactly its transpose ``[n_kv_heads, n_queries,
#   width]`` (C order); ``out=`` must have the shape returned. With a 2-D
#   ``index_q`` the flag changes nothing.
#
# Keys and queries may be float32, float16, float64 (rounded to float32),
# ml_dtypes bfloat16 / float8_e4m3fn, or raw uint16 / uint8 views with
# ``key_format`` / ``query_format``: decoded exactly by the indexer
# section's ``decode`` (called, not reimplemented). A paged cache is read in
# place natively, so a float64 one is a ``TypeError`` here too.
#
# ``positions_of_blocks``: block ``b`` covers ``[b*bs, min((b+1)*bs,
# n_positions, query_pos + 1))``; a selection covers the union of its
# non-negative entries' ranges, ascending. 1-D ``blocks`` (with int
# ``query_pos`` and ``n_positions``) give that union as it is; 2-D ``[rows,
# width]`` and 3-D ``[n_queries, n_kv_heads, width]`` (``[n_kv_heads,
# n_queries, width]`` with ``head_major=True``) give one such union per row
# of the last axis, padded with -1 to ``width * bs``; ``query_pos`` and
# ``n_positions`` are an int (every row) or 1-D with one entry per row (2-D)
# or per query (3-D, the query axis being 0, or 1 when head-major).
#
# Dot products are taken in float64 from the decoded values and each is
# rounded once to float32, the spec's score type: the correctly rounded
# float32 dot product. On integer-valued data of small magnitude every dot
# product is exact in any summation order, so the selections must agree
# exactly; on other data they agree up to ties within float32 rounding.
# ==========================================================================

#: MiniMax-M3's KV block (and KV page), in tokens.
MINIMAX_BLOCK_SIZE = 128


def _block_config(block_size: Any, top_blocks: Any, init_blocks: Any, local_blocks: Any):
    """The four counts, refused when they could select nothing."""
    bs = _count("block_size", block_size)
    top = _count("top_blocks", top_blocks)
    init = _count("init_blocks", init_blocks)
    local = _count("local_blocks", local_blocks)
    if bs == 0:
        raise ReferenceSelectionError("block_size", "block_size must be positive")
    if top == 0 and init == 0 and local == 0:
        raise ReferenceSelectionError(
            "top_blocks", "top_blocks is 0 and no block is forced: nothing could be selected"
        )
    return bs, top, init, local


@dataclass(frozen=True)
class BlockSparseConfig:
    """``kvselect.BlockSparseConfig``: how many blocks a query may see, and
    which are free. Building one refuses a config that can select nothing
    (``block_size`` 0, or ``top_blocks`` 0 with no forced block); a field
    given as None takes its default."""

    block_size: int = MINIMAX_BLOCK_SIZE
    top_blocks: int = 32
    init_blocks: int = 1
    local_blocks: int = 2

    def __post_init__(self) -> None:
        defaults = (MINIMAX_BLOCK_SIZE, 32, 1, 2)
        given = (self.block_size, self.top_blocks, self.init_blocks, self.local_blocks)
        fields = _block_config(*(d if v is None else v for v, d in zip(given, defaults)))
        for name, value in zip(("block_size", "top_blocks", "init_blocks", "local_blocks"), fields):
            object.__setattr__(self, name, value)

    @property
    def width(self) -> int:
        """The fixed width of an output row: ``max(top_blocks, init_blocks + local_blocks)``."""
        return max(self.top_blocks, self.init_blocks + self.local_blocks)


def _config(config: Any):
    """``(block_size, top_blocks, init_blocks, local_blocks)`` of ``config``:
    None for the default, or a config (this module's or the native one)."""
    if config is None:
        config = BlockSparseConfig()
    try:
        fields = (config.block_size, config.top_blocks, config.init_blocks, config.local_blocks)
    except AttributeError:
        raise TypeError(
            f"config must be a BlockSparseConfig or None, got {type(config).__name__}"
        ) from None
    return _block_config(*fields)


def _block_scores(q: np.ndarray, keys: np.ndarray, query_pos: int, bs: int) -> np.ndarray:
    """float64 ``[n_kv_heads, n_blocks]``: each visible block's score for
    each head (``q`` float64 ``[n_kv_heads, d]``, ``keys`` float64
    ``[n_positions, d]``). ``n_blocks`` is 0 when there are no keys."""
    n_heads = q.shape[0]
    n_positions = keys.shape[0]
    n_visible = min(query_pos + 1, n_positions)  # causal, and clipped to the keys
    n_blocks = min(query_pos // bs + 1, -(-n_positions // bs))
    assert n_blocks == -(-n_visible // bs)
    if n_blocks == 0:
        return np.zeros((n_heads, 0))

    # scores[h, p] = q_h . k_p for every visible position: raw, unscaled.
    # Exact products summed in float64, then rounded to float32, the type
    # the spec scores in (so a score past float32's range is +-inf there
    # too, and ties with any other such score).
    with np.errstate(over="ignore", invalid="ignore"):
        scores = (q @ keys[:n_visible].T).astype(np.float32).astype(np.float64)
    # A NaN dot product is absent from the max: it counts as -inf, so a
    # block of only NaNs scores -inf.
    scores = np.where(np.isnan(scores), -np.inf, scores)
    # Pad the last (partial) block with -inf and max-pool each block.
    padded = np.full((n_heads, n_blocks * bs), -np.inf)
    padded[:, :n_visible] = scores
    block_score = padded.reshape(n_heads, n_blocks, bs).max(axis=2)
    return block_score + 0.0  # -0.0 and +0.0 are one score


def block_scores(
    index_q: Any,
    index_k: Any,
    query_pos: Any,
    config: Any = None,
    *,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    out: Any = None,
) -> np.ndarray:
    """``kvselect.block_scores``: every row's block scores, the values the
    selection ranks, float32 ``[n_queries, n_kv_heads, n_blocks]`` with
    ``n_blocks = ceil(n_positions / block_size)`` (``index_q [n_queries,
    n_kv_heads, d]``, ``query_pos [n_queries]``): entry ``b`` the max raw
    dot product over block ``b``'s visible positions, NaN ignored (-inf for
    a block of only NaNs), -0.0 read as +0.0; NaN past the row's visible
    blocks."""
    return _block_values(index_q, index_k, query_pos, config, key_format, query_format, out, False)


def block_magnitudes(
    index_q: Any,
    index_k: Any,
    query_pos: Any,
    config: Any = None,
    *,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    out: Any = None,
) -> np.ndarray:
    """``kvselect.block_magnitudes``: :func:`block_scores`' maxima of
    ``sum_i |q_i * k_i|`` instead (the scores of ``|q|`` and ``|k|``),
    ``check_blocks``' magnitudes."""
    return _block_values(index_q, index_k, query_pos, config, key_format, query_format, out, True)


def _block_values(index_q: Any, index_k: Any, query_pos: Any, config: Any, key_format: Optional[str],
                  query_format: Optional[str], out: Any, magnitudes: bool) -> np.ndarray:
    bs = _config(config)[0]
    keys = _decoded("index_k", index_k, key_format, 2)
    q = _decoded("index_q", index_q, query_format, 3)
    _same_d(q, keys)
    positions = _query_positions(query_pos, q.shape[0])
    if magnitudes:
        q, keys = np.abs(q), np.abs(keys)
    n_blocks = -(-keys.shape[0] // bs)
    result = np.full((q.shape[0], q.shape[1], n_blocks), np.nan, np.float32)
    for i, p in enumerate(positions):
        visible = _block_scores(q[i], keys, int(p), bs)
        result[i, :, : visible.shape[1]] = visible
    return _deliver(result, _output(out, result.shape, _SELECTION, np.float32, (index_q, index_k, query_pos)))


def _select_one_query(
    q: np.ndarray, keys: np.ndarray, query_pos: int, bs: int, top: int, init: int, local: int
) -> np.ndarray:
    """int64 ``[n_kv_heads, width]`` for one query: ``q`` is float64
    ``[n_kv_heads, d]``, ``keys`` float64 ``[n_positions, d]``."""
    n_heads = q.shape[0]
    width = max(top, init + local)
    out = np.full((n_heads, width), -1, dtype=np.int64)

    block_score = _block_scores(q, keys, query_pos, bs)
    n_blocks = block_score.shape[1]
    if n_blocks == 0:
        return out  # no keys at all: nothing to select

    forced = np.zeros(n_blocks, dtype=bool)
    forced[: min(init, n_blocks)] = True
    forced[max(n_blocks - local, 0) :] = True
    n_forced = int(forced.sum())
    budget = max(top, n_forced)
    free_ids = np.flatnonzero(~forced)  # ascending

    for h in range(n_heads):
        chosen = list(np.flatnonzero(forced))
        room = min(budget, n_blocks) - n_forced
        if room > 0:
            # Score descending; a stable sort keeps equal scores in
            # ascending id order, so ties go to the lower block.
            order = np.argsort(-block_score[h, free_ids], kind="stable")
            chosen += list(free_ids[order[:room]])
        chosen.sort()
        out[h, : len(chosen)] = chosen
    return out


def _flag(name: str, value: Any) -> bool:
    """A keyword flag (``head_major``, ``physical``): a bool, as natively."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return bool(value)


def _decoded(name: str, value: Any, format: Optional[str], ndim: Optional[int] = None) -> np.ndarray:
    """Keys or queries decoded exactly to float64 by :func:`decode` (a bad
    dtype or format is a ``TypeError``), refused unless ``ndim``-D (when given)."""
    a = decode(value, format, "query_format" if name == "index_q" else "key_format")
    if ndim is not None and a.ndim != ndim:
        raise ReferenceSelectionError(name, f"{name} must be {ndim}-D, got shape {a.shape}")
    return a


def _same_d(q: np.ndarray, keys: np.ndarray) -> None:
    if q.shape[-1] != keys.shape[-1]:
        raise ReferenceSelectionError(
            "index_q", f"index_q has d={q.shape[-1]} but the keys have d={keys.shape[-1]}"
        )


def _batch_shape(n_queries: int, n_heads: int, width: int, head_major: bool) -> tuple:
    """The shape a batched selection is returned in."""
    return (n_heads, n_queries, width) if head_major else (n_queries, n_heads, width)


def _in_major(selected: np.ndarray, head_major: bool) -> np.ndarray:
    """A query-major ``[n_queries, n_kv_heads, width]`` selection in the
    requested layout: itself, or its C-order transpose when head-major."""
    return np.ascontiguousarray(selected.transpose(1, 0, 2)) if head_major else selected


def block_sparse_select(
    index_q: Any,
    index_k: Any,
    query_pos: Any,
    config: Any = None,
    *,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    head_major: bool = False,
    out: Optional[np.ndarray] = None,
) -> np.ndarray:
    """The blocks each KV head may read, int32 (a new array, or ``out`` filled).

    ``index_q [n_kv_heads, d]`` with an int ``query_pos`` gives
    ``[n_kv_heads, width]``; ``index_q [n_queries, n_kv_heads, d]`` with a
    1-D ``query_pos [n_queries]`` gives ``[n_queries, n_kv_heads, width]``,
    or its transpose ``[n_kv_heads, n_queries, width]`` with
    ``head_major=True``. ``index_k`` is ``[n_positions, d]``; keys and
    queries in any format :func:`decode` reads. Each row: ascending block
    ids, then -1.
    """
    bs, top, init, local = _config(config)
    width = max(top, init + local)
    head_major = _flag("head_major", head_major)
    keys = _decoded("index_k", index_k, key_format, 2)
    q = _decoded("index_q", index_q, query_format)
    if q.ndim == 2:
        _same_d(q, keys)
        pos = _count("query_pos", query_pos)
        out = _output(out, (q.shape[0], width), _SELECTION, inputs=(index_q, index_k))
        return _deliver(_select_one_query(q, keys, pos, bs, top, init, local), out)
    if q.ndim != 3:
        raise ReferenceSelectionError("index_q", f"index_q must be 2-D or 3-D, got shape {q.shape}")
    _same_d(q, keys)
    positions = _query_positions(query_pos, q.shape[0])
    out = _output(out, _batch_shape(q.shape[0], q.shape[1], width, head_major), _SELECTION,
                  inputs=(index_q, index_k, query_pos))
    selected = np.full((q.shape[0], q.shape[1], width), -1, dtype=np.int64)
    for i, p in enumerate(positions):
        selected[i] = _select_one_query(q[i], keys, int(p), bs, top, init, local)
    return _deliver(_in_major(selected, head_major), out)


def block_sparse_select_packed(
    index_q: Any,
    index_k: Any,
    cu_seqlens: Any,
    seq_ids: Any,
    query_pos: Any,
    config: Any = None,
    *,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    head_major: bool = False,
    out: Optional[np.ndarray] = None,
) -> np.ndarray:
    """A packed batch: sequence ``s`` owns key rows
    ``cu_seqlens[s] .. cu_seqlens[s + 1]``; query ``i`` (``index_q [n_queries,
    n_kv_heads, d]``) selects over sequence ``seq_ids[i]``'s keys alone at
    ``query_pos[i]`` within it, block ids counted from the sequence's start.
    int32 ``[n_queries, n_kv_heads, width]`` (``[n_kv_heads, n_queries,
    width]`` with ``head_major=True``; a new array, or ``out`` filled)."""
    bs, top, init, local = _config(config)
    width = max(top, init + local)
    head_major = _flag("head_major", head_major)
    keys = _decoded("index_k", index_k, key_format, 2)
    q = _decoded("index_q", index_q, query_format, 3)
    _same_d(q, keys)
    cu = _index_array("cu_seqlens", cu_seqlens, 1, _SELECTION, positions=True)
    sid = _along("seq_ids", seq_ids, ("n_queries", q.shape[0]))
    pos = _query_positions(query_pos, q.shape[0])
    out = _output(out, _batch_shape(q.shape[0], q.shape[1], width, head_major), _SELECTION,
                  inputs=(index_q, index_k, cu_seqlens, seq_ids, query_pos))
    if len(cu) == 0 or cu[0] != 0 or cu[-1] != keys.shape[0] or np.any(np.diff(cu) < 0):
        raise ReferenceSelectionError(
            "cu_seqlens", "cu_seqlens must rise from 0 to n_positions without decreasing"
        )
    n_seqs = len(cu) - 1
    if sid.shape != (q.shape[0],):
        raise ReferenceSelectionError("seq_ids", "seq_ids needs one id per query")
    if pos.shape != (q.shape[0],):
        raise ReferenceSelectionError("query_pos", "query_pos needs one position per query")
    selected = np.full((q.shape[0], q.shape[1], width), -1, dtype=np.int64)
    for i in range(q.shape[0]):
        s = int(sid[i])
        if s >= n_seqs:
            raise ReferenceSelectionError("seq_ids", f"seq_ids[{i}] = {s} is out of range")
        seq_keys = keys[int(cu[s]) : int(cu[s + 1])]
        selected[i] = _select_one_query(q[i], seq_keys, int(pos[i]), bs, top, init, local)
    return _deliver(_in_major(selected, head_major), out)


def _paged_cache(kv_cache: Any, key_format: Optional[str], bs: int) -> np.ndarray:
    """The cache's pages decoded, float64 ``[num_blocks, bs, d]``. The page
    must be the block; a float64 cache (which the native call cannot read
    in place) is a ``TypeError``."""
    if _native_pages(kv_cache).dtype == np.float64:
        raise TypeError(
            "kv_cache is read in place: float32, float16, bfloat16 or float8_e4m3fn "
            "(or a raw uint16 / uint8 view with key_format), got float64"
        )
    pages = _decoded("kv_cache", kv_cache, key_format, 3)
    if pages.shape[1] != bs:
        raise ReferenceSelectionError(
            "kv_cache",
            f"kv_cache pages hold {pages.shape[1]} tokens, but config.block_size is {bs}: "
            "the page must be the block",
        )
    return pages


def _check_block_table(table: np.ndarray, lens: np.ndarray, n_pages: int, bs: int) -> None:
    """Every entry that will be read, the first ``ceil(seq_lens[s] / bs)`` of
    each row, must exist and name a page of the cache."""
    if table.shape[0] != len(lens):
        raise ReferenceSelectionError(
            "block_table", f"block_table has {table.shape[0]} rows for {len(lens)} sequences"
        )
    for s, length in enumerate(lens):
        need = -(-int(length) // bs)
        if need > table.shape[1]:
            raise ReferenceSelectionError(
                "block_table",
                f"seq_lens[{s}] = {int(length)} needs {need} blocks, "
                f"but block_table rows have {table.shape[1]}",
            )
        read = table[s, :need]
        bad = np.flatnonzero((read < 0) | (read >= n_pages))
        if len(bad):
            b = int(bad[0])
            raise ReferenceSelectionError(
                "block_table",
                f"block_table[{s}, {b}] = {int(read[b])} is not a page of the cache (0..{n_pages})",
            )


def block_sparse_select_paged(
    index_q: Any,
    kv_cache: Any,
    block_table: Any,
    seq_lens: Any,
    seq_ids: Any,
    query_pos: Any,
    config: Any = None,
    *,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    head_major: bool = False,
    physical: bool = False,
    out: Optional[np.ndarray] = None,
) -> np.ndarray:
    """Block selection over a paged cache (see the section notes): query
    ``i`` (``index_q [n_queries, n_kv_heads, d]``) is :func:`block_sparse_select`
    of ``index_q[i]`` at ``query_pos[i]`` over the ``seq_lens[s]`` keys of
    sequence ``s = seq_ids[i]`` laid out contiguously, ``kv_cache[
    block_table[s, :nb]].reshape(-1, d)[:seq_lens[s]]``. int32 ``[n_queries,
    n_kv_heads, width]`` (``[n_kv_heads, n_queries, width]`` with
    ``head_major=True``) of logical block ids, or with ``physical=True`` the
    pages they live in."""
    bs, top, init, local = _config(config)
    width = max(top, init + local)
    head_major = _flag("head_major", head_major)
    physical = _flag("physical", physical)
    pages = _paged_cache(kv_cache, key_format, bs)
    q = _decoded("index_q", index_q, query_format, 3)
    _same_d(q, pages)
    table = _index_array("block_table", block_table, 2, _SELECTION)
    lens = _index_array("seq_lens", seq_lens, 1, _SELECTION, positions=True)
    _axes("block_table", table.shape, [("n_seqs", len(lens)), ("max_blocks", table.shape[1])])
    n_queries, n_heads, d = q.shape
    sid = _along("seq_ids", seq_ids, ("n_queries", n_queries))
    pos = _query_positions(query_pos, n_queries)
    out = _output(out, _batch_shape(n_queries, n_heads, width, head_major), _SELECTION,
                  inputs=(index_q, kv_cache, block_table, seq_lens, seq_ids, query_pos))
    _check_block_table(table, lens, pages.shape[0], bs)
    for i, s in enumerate(sid):
        if s >= len(lens):
            raise ReferenceSelectionError(
                "seq_ids", f"seq_ids[{i}] = {int(s)} is out of range: {len(lens)} sequence(s)"
            )
    selected = np.full((n_queries, n_heads, width), -1, dtype=np.int64)
    for i in range(n_queries):
        s, length = int(sid[i]), int(lens[sid[i]])
        ids = table[s, : -(-length // bs)]  # the pages of its logical blocks, in order
        keys = pages[ids].reshape(-1, d)[:length]
        row = _select_one_query(q[i], keys, int(pos[i]), bs, top, init, local)
        if physical:  # each chosen block's page, slot for slot; -1 stays -1
            chosen = row >= 0
            row[chosen] = table[s][row[chosen]]
        selected[i] = row
    return _deliver(_in_major(selected, head_major), out)


def _position(name: str, value: Any) -> int:
    """An int ``query_pos`` / ``n_positions``: a non-negative integer (a
    ``TypeError`` if not an integer, refused naming ``name`` if negative or
    if it is an array, which 1-D blocks do not take)."""
    if np.ndim(value) != 0:
        raise ReferenceSelectionError(name, f"{name} must be an int with 1-D blocks")
    try:
        return _count(name, value)
    except ValueError as e:
        raise ReferenceSelectionError(name, str(e)) from None


def _per_query(name: str, value: Any, n: int, n_axes: int) -> list:
    """``query_pos`` / ``n_positions`` of batched blocks as ``n`` Python
    ints: an int broadcast, or a 1-D array of ``n`` non-negative entries."""
    if np.ndim(value) == 0:
        return [_position(name, value)] * n
    arr = np.asarray(value)
    a = _index_array(name, arr, arr.ndim, _SELECTION, positions=True)
    if a.shape == (1,):  # every row's, as an int (natively too)
        return [int(a[0])] * n
    _axes(name, a.shape, [("rows" if n_axes == 2 else "n_queries", n)])
    return [int(v) for v in a]


def _covered(blocks: np.ndarray, query_pos: int, n_positions: int, bs: int) -> np.ndarray:
    """int64: the positions the non-negative entries of one row of
    ``blocks`` cover, ascending and distinct (each distinct block's range,
    the ranges disjoint and taken in ascending block order)."""
    limit = min(query_pos + 1, n_positions)
    pieces = [np.zeros(0, dtype=np.int64)]
    for block in np.unique(blocks[blocks >= 0]):
        start = int(block) * bs  # Python ints: no overflow
        if start < limit:
            pieces.append(np.arange(start, start + min(bs, limit - start), dtype=np.int64))
    return np.concatenate(pieces)


def positions_of_blocks(
    blocks: Any,
    query_pos: Any,
    n_positions: Any,
    config: Any = None,
    *,
    head_major: bool = False,
    out: Any = None,
) -> np.ndarray:
    """The positions a selection covers, ascending, deduplicated and causally
    clipped, int32: block ``b`` covers ``[b*bs, min((b+1)*bs, n_positions,
    query_pos + 1))`` with ``bs = config.block_size``; negative entries (-1
    padding) are skipped. 1-D ``blocks`` give a 1-D array of its own length;
    2-D ``[rows, width]`` and 3-D (a selection, query-major or with
    ``head_major=True`` head-major) give ``[..., width * bs]``, each row
    ascending then -1, with ``query_pos`` / ``n_positions`` an int or one
    entry per row (2-D) or per query (3-D). Batched, ``out=`` (int32, that
    shape) receives the rows and is returned; the 1-D form takes none."""
    bs = _config(config)[0]
    head_major = _flag("head_major", head_major)
    a = np.asarray(blocks)
    b = _index_array("blocks", a, a.ndim, _SELECTION)
    if b.ndim == 1 and out is not None:
        raise ReferenceSelectionError("out", "out= needs batched blocks (2-D or 3-D)")
    if b.ndim == 1:
        qp1 = _position("query_pos", query_pos)
        n_pos1 = _position("n_positions", n_positions)
        return _covered(b, qp1, n_pos1, bs).astype(np.int32)
    if b.ndim not in (2, 3):
        raise ReferenceSelectionError(
            "blocks", f"blocks must be 1-D, [rows, width] or a 3-D selection, got shape {b.shape}"
        )
    query_axis = 1 if (b.ndim == 3 and head_major) else 0
    n = b.shape[query_axis]
    lead = b.shape[:-1]
    out_buf = _output(out, lead + (b.shape[-1] * bs,), _SELECTION, inputs=(a, query_pos, n_positions))
    qp = _per_query("query_pos", query_pos, n, b.ndim)
    n_pos = _per_query("n_positions", n_positions, n, b.ndim)
    result = np.full(lead + (b.shape[-1] * bs,), -1, dtype=np.int64)
    for idx in np.ndindex(*lead):
        i = idx[query_axis]
        row = _covered(b[idx], qp[i], n_pos[i], bs)
        result[idx][: len(row)] = row
    return _deliver(result, out_buf)


# ==========================================================================
# attention: baseline selectors, the oracle top-k, the dense/sparse pass
# --------------------------------------------------------------------------
# Written from the module docs of src/attention/ and the stubs of the
# native module (``kvselect._core.pyi``):
#
# - a query at position ``p`` over ``n_keys`` keys sees keys
#   ``0 .. min(p, n_keys - 1)``; selector rows are built for a causal
#   sequence (row ``p`` has keys ``0..=p``) and are ascending, distinct;
# - layouts: ``q [n_queries, n_q_heads, d_k]``, ``k [n_keys, n_kv_heads,
#   d_k]``, ``v [n_keys, n_kv_heads, d_v]``, ``selection [n_queries,
#   n_kv_heads, width]``; GQA: query head ``h`` reads KV head ``h // group``
#   with ``group = n_q_heads // n_kv_heads``;
# - a selection row attends to the SET of its entries ``x`` with
#   ``0 <= x <= min(p, n_keys - 1)``: negatives are padding, later entries
#   are masked like future keys, duplicates count once; an empty set gives
#   zeros, ``lse = -inf``, and is counted (per ``(query, query head)`` row);
# - the oracle ranks a row's visible weights descending, ties to the lower
#   key, NaN read as ``-inf`` and ``-0.0`` as ``+0.0``; rows ascending, -1
#   padded.
#
# The arithmetic is float64 throughout, from inputs first converted to
# float32 (what the native module computes on). The default softmax scale is
# the native one, ``1/sqrt(d_k)`` rounded to float32 (1 for ``d_k = 0``); the
# attention pass takes its ``scale`` as float32 (an explicit scale is rounded
# to float32 there), the probabilities take an explicit scale as given.
# ==========================================================================




def _pad_rows(rows: list, width: Optional[int]) -> np.ndarray:
    """int32 ``[len(rows), width]``: each row, then -1. ``width`` defaults to
    the longest row; a row longer than ``width`` is refused."""
    need = max((len(r) for r in rows), default=0)
    if width is None:
        width = need
    width = _count("width", width)
    if need > width:
        raise ReferenceSelectionError("width", f"width={width} cannot hold a row of {need}")
    out = np.full((len(rows), width), -1, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out.astype(np.int32)


def dense_rows(query_pos: Any, width: Optional[int] = None) -> np.ndarray:
    """``Selector.dense().rows(query_pos, width=None)``: row ``p`` is ``0..=p``."""
    pos = _query_batch(query_pos)
    return _pad_rows([np.arange(p + 1) for p in pos], width)


def local_rows(query_pos: Any, window: int, width: Optional[int] = None) -> np.ndarray:
    """``Selector.local(window).rows(query_pos, width=None)``: the ``window``
    most recent keys of ``0..=p``, the query's own included."""
    pos = _query_batch(query_pos)
    window = _count("window", window)
    return _pad_rows([np.arange(max(p + 1 - window, 0), p + 1) for p in pos], width)


def sink_window_rows(
    query_pos: Any, sinks: int, window: int, width: Optional[int] = None
) -> np.ndarray:
    """``Selector.sink_window(sinks, window).rows(query_pos, width=None)``:
    the union of the first ``sinks`` keys and the ``window`` most recent of
    ``0..=p``."""
    pos = _query_batch(query_pos)
    sinks = _count("sinks", sinks)
    window = _count("window", window)
    rows = []
    for p in pos:
        head = np.arange(min(sinks, p + 1))
        tail = np.arange(max(p + 1 - window, 0), p + 1)
        rows.append(np.union1d(head, tail))  # sorted, distinct
    return _pad_rows(rows, width)


def _oracle_row(weights: np.ndarray, budget: int) -> np.ndarray:
    """The ``budget`` largest of ``weights`` (all visible), ascending."""
    key = np.where(np.isnan(weights), -np.inf, weights) + 0.0  # NaN -> -inf, -0 -> +0
    idx = np.arange(len(weights))
    # lexsort sorts by the LAST key first: weight descending, then index ascending.
    order = np.lexsort((idx, -key))
    return np.sort(order[: min(budget, len(weights))])


def oracle_topk(
    attention: Any, query_pos: Any, budget: int, *, width: Optional[int] = None,
    out: Optional[np.ndarray] = None,
) -> np.ndarray:
    """The oracle top-k of each attention row (float64 ``[n, row_len]``,
    row ``r`` belonging to ``query_pos[r]``; one integer is ``[query_pos]``):
    the ``budget`` heaviest keys among ``0..=min(query_pos[r], row_len - 1)``,
    ties to the lower key, NaN read as -inf; int32 ``[n, width]``, ascending
    then -1 (or ``out`` filled)."""
    raw = attention
    a = _float_array("attention", attention, 2, _SELECTION, dtype=np.float64)
    pos = _query_batch(query_pos)
    budget = _count("budget", budget)
    if len(pos) != a.shape[0]:
        raise ReferenceSelectionError("query_pos", "query_pos needs one position per row")
    rows = []
    for r, p in enumerate(pos):
        visible = min(p + 1, a.shape[1])
        rows.append(_oracle_row(a[r, :visible], budget))
    result = _pad_rows(rows, width)
    return _deliver(result, _out_buffer(out, "out", result.shape, _SELECTION, np.int32, (raw, query_pos)))


def _native_scale(d_k: int) -> float:
    """The default scale as the native module uses it: ``1/sqrt(d_k)``
    rounded to float32 (1 for ``d_k = 0``)."""
    return 1.0 if d_k == 0 else float(np.float32(1.0 / np.sqrt(d_k)))


def _qk(q: Any, k: Any, query_pos: Any):
    """``q``, ``k`` (float64 from float32), the query positions and the GQA
    group, the shapes checked against each other."""
    q = _float_array("q", q, 3, _SELECTION)
    k = _float_array("k", k, 3, _SELECTION)
    if q.shape[2] != k.shape[2]:
        raise ReferenceSelectionError("q", f"q has d_k={q.shape[2]} but k has d_k={k.shape[2]}")
    n_q_heads, n_kv_heads = q.shape[1], k.shape[1]
    if n_kv_heads == 0:
        raise ReferenceSelectionError("n_kv_heads", "n_kv_heads is 0")
    if n_q_heads % n_kv_heads != 0:
        raise ReferenceSelectionError("n_q_heads", "n_q_heads is not a multiple of n_kv_heads")
    pos = _query_batch(query_pos)
    if len(pos) != q.shape[0]:
        raise ReferenceSelectionError("query_pos", "query_pos needs one position per query")
    return q, k, pos, n_q_heads // n_kv_heads


def attention(
    q: Any,
    k: Any,
    v: Any,
    query_pos: Any,
    selection: Any = None,
    *,
    scale: Optional[float] = None,
    out: Optional[np.ndarray] = None,
    lse_out: Optional[np.ndarray] = None,
):
    """The attention pass that :func:`dense_attention` (``selection`` None:
    every visible key) and :func:`sparse_attention` share: ``(out float64
    [n_queries, n_q_heads, d_v], lse float64 [n_queries, n_q_heads],
    empty_rows)``.

    Row ``(i, h)`` attends to the set of entries ``x`` of
    ``selection[i, h // group]`` with ``0 <= x <= min(query_pos[i],
    n_keys - 1)``: ``out = sum_j softmax(s)_j v_j`` and ``lse = log sum_j
    exp(s_j)`` with ``s_j = (q_ih . k_j) * scale``. A row whose set is empty
    gets zeros and ``lse = -inf`` and is counted in ``empty_rows``. One
    integer ``query_pos`` is ``[query_pos]``. ``out`` / ``lse_out`` (float32
    of exactly those shapes, sharing no input's memory nor each other's) are
    filled with the results rounded to float32 and returned in their place."""
    raw = (q, k, v, selection, query_pos)
    q, k, pos, group = _qk(q, k, query_pos)
    n_queries, n_q_heads, d_k = q.shape
    n_keys, n_kv_heads = k.shape[0], k.shape[1]
    v = _float_array("v", v, 3, _SELECTION)
    if v.shape[:2] != (n_keys, n_kv_heads):
        raise ReferenceSelectionError("v", f"v must be [{n_keys}, {n_kv_heads}, d_v], got {v.shape}")
    d_v = v.shape[2]
    if selection is not None:
        sel = _index_array("selection", selection, 3, _SELECTION)
        if sel.shape[:2] != (n_queries, n_kv_heads):
            raise ReferenceSelectionError(
                "selection", f"selection must be [{n_queries}, {n_kv_heads}, width], got {sel.shape}"
            )
    out_buf = _out_buffer(out, "out", (n_queries, n_q_heads, d_v), _SELECTION, np.float32, raw)
    lse_buf = _out_buffer(lse_out, "lse_out", (n_queries, n_q_heads), _SELECTION, np.float32,
                          raw + (out_buf,))
    # The attention pass computes with a float32 scale, which must be finite.
    with np.errstate(over="ignore"):
        scale = float(np.float32(_native_scale(d_k) if scale is None else scale))
    if not math.isfinite(scale):
        raise ReferenceSelectionError("scale", f"scale={scale} is not finite")

    out = np.zeros((n_queries, n_q_heads, d_v))
    lse = np.full((n_queries, n_q_heads), -np.inf)
    empty_rows = 0
    for i, p in enumerate(pos):
        visible = min(p + 1, n_keys)
        for kv in range(n_kv_heads):
            if selection is None:
                keys = np.arange(visible)
            else:
                row = sel[i, kv]
                keys = np.unique(row[(row >= 0) & (row < visible)])
            heads = slice(kv * group, (kv + 1) * group)  # the query heads of KV head kv
            if len(keys) == 0:
                empty_rows += group
                continue
            s = (q[i, heads] @ k[keys, kv].T) * scale  # [group, len(keys)]
            m = s.max(axis=1, keepdims=True)
            e = np.exp(s - m)
            total = e.sum(axis=1, keepdims=True)
            out[i, heads] = (e @ v[keys, kv]) / total
            lse[i, heads] = (m + np.log(total))[:, 0]
    if out_buf is not None:
        out_buf[...] = out
        out = out_buf
    if lse_buf is not None:
        lse_buf[...] = lse
        lse = lse_buf
    return out, lse, empty_rows


def dense_attention(
    q: Any, k: Any, v: Any, query_pos: Any, *, scale: Optional[float] = None,
    out: Optional[np.ndarray] = None, lse_out: Optional[np.ndarray] = None,
):
    """Dense causal attention: ``(out float64 [n_queries, n_q_heads, d_v],
    lse float64 [n_queries, n_q_heads])``, every query over keys
    ``0..=query_pos``; ``out`` / ``lse_out`` as :func:`attention`."""
    o, lse, _ = attention(q, k, v, query_pos, None, scale=scale, out=out, lse_out=lse_out)
    return o, lse


def sparse_attention(
    q: Any, k: Any, v: Any, query_pos: Any, selection: Any, *, scale: Optional[float] = None,
    out: Optional[np.ndarray] = None, lse_out: Optional[np.ndarray] = None,
):
    """Sparse causal attention over ``selection [n_queries, n_kv_heads,
    width]``: ``(out, lse, empty_rows)`` as :func:`attention`."""
    return attention(q, k, v, query_pos, selection, scale=scale, out=out, lse_out=lse_out)


# ==========================================================================
# indexer: the lightning indexer's top-k (DeepSeek-V3.2/V4, GLM-5)
# --------------------------------------------------------------------------
# Written from issue 11 and the module docs of src/indexer/:
#
# - score(t) = c_t * sum_h w_h * max(q_h . k_t, 0) over keys t < L,
#   L = min(query_pos + 1, T); the ReLU keeps NaN NaN;
# - the row is the topk best positions in rank order (score descending,
#   ties to the lower position, -0.0 == +0.0, NaN below every number), then
#   -1; with num_segments = S the top max(topk - S, 0), widened with -1 and
#   merged by scatter_topology_witnesses with context_lens = L;
# - keys and queries are decoded exactly from their formats, then scored in
#   float64.
# ==========================================================================


def _fp8_e4m3fn_table() -> np.ndarray:
    """The 256 float8 e4m3fn values, from the format's definition (1 sign,
    4 exponent bits of bias 7, 3 mantissa bits; 0x7F / 0xFF are NaN)."""
    b = np.arange(256)
    sign = np.where(b & 0x80, -1.0, 1.0)
    exp = (b >> 3) & 0xF
    man = (b & 0x7).astype(np.float64)
    value = np.where(exp == 0, man / 8.0 * 2.0**-6, (1.0 + man / 8.0) * 2.0 ** (exp - 7.0))
    value = sign * value
    value[(b & 0x7F) == 0x7F] = np.nan
    return value


_FORMATS = ("float32", "float16", "bfloat16", "float8_e4m3fn")


def decode(values: Any, format: Optional[str] = None, argument: Optional[str] = None) -> np.ndarray:
    """``values`` decoded exactly to float64: float arrays as they are (float64
    rounded to float32 first, as natively), ml_dtypes bfloat16 / float8_e4m3fn
    arrays from their bits, and raw uint16 (``format`` "bfloat16" or
    "float16") / uint8 (``format`` "float8_e4m3fn") views. A format that is
    none of these is a ``TypeError``, or with ``argument`` (the format's
    parameter name) a refusal naming it, as natively."""
    a = np.asarray(values)
    if not a.dtype.isnative:  # '>f2', '>u2' bits: the same values in native order
        a = a.astype(a.dtype.newbyteorder("="))
    name = a.dtype.name
    if format is not None and format not in _FORMATS:
        if argument is not None:
            raise ReferenceSelectionError(argument, f"{argument} {format!r} is not one of {', '.join(_FORMATS)}")
        raise TypeError(f"unknown format {format!r}")
    if name in ("uint16", "uint8"):
        if format is None or (name == "uint16") != (format in ("bfloat16", "float16")):
            raise TypeError(f"a raw {name} array needs a matching format, got {format!r}")
        name = format
    elif format is not None and format != ("float32" if name == "float64" else name):
        raise TypeError(f"dtype {a.dtype} does not hold {format}")
    if name == "bfloat16":
        bits = np.ascontiguousarray(a).view(np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32).astype(np.float64)
    if name == "float16":
        return np.ascontiguousarray(a).view(np.float16).astype(np.float64)
    if name == "float8_e4m3fn":
        return _fp8_e4m3fn_table()[np.ascontiguousarray(a).view(np.uint8)]
    if a.dtype.kind != "f" and a.size:
        raise TypeError(f"values must hold floats, got dtype {a.dtype}")
    return a.astype(np.float32).astype(np.float64)


def _rank_order(scores: np.ndarray) -> np.ndarray:
    """Positions in the total order: score descending, ties to the lower
    position, -0.0 == +0.0, NaN last."""
    key = np.where(np.isnan(scores), np.inf, -(scores + 0.0))
    return np.lexsort((np.arange(len(scores)), key, np.isnan(scores)))


def indexer_topk(
    index_q: Any,
    weights: Any,
    index_k: Any,
    query_pos: Any,
    topk: int,
    *,
    key_scale: Any = None,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    num_segments: int = 0,
    out: Any = None,
    scores_out: Any = None,
) -> np.ndarray:
    """The lightning indexer's top-k of every query (see the section notes):
    int32 ``[n_queries, topk]``; ``scores_out`` (float32 ``[n_queries,
    topk]``) receives each entry's score, NaN where the row holds -1."""
    q, w, k, c, pos = _indexer_inputs(index_q, weights, index_k, query_pos, key_scale, key_format, query_format)
    n, t = len(q), len(k)
    topk = _count("topk", topk)
    num_segments = _count("num_segments", num_segments)
    # The buffers are checked before the rule's refusals, as natively: out
    # against every input, scores_out against them and out.
    out_buf, scores_buf = _topk_outputs(out, scores_out, (n, topk), (index_q, weights, index_k, query_pos, key_scale))
    if num_segments > MAX_TOPOLOGY_SEGMENTS:
        raise _refuse(_SELECTION, "num_segments", "num_segments must be 0 (off) or 1..=64")
    rows = np.full((n, topk), -1, dtype=np.int64)
    chosen_scores = np.full((n, topk), np.nan)
    keep = max(topk - num_segments, 0)
    for i in range(n):
        length = min(int(pos[i]) + 1, t)
        scores = _indexer_row(q[i], w[i], k[:length], c[:length])
        order = _rank_order(scores)[:keep]
        rows[i, : len(order)] = order
        if num_segments:
            row = rows[i : i + 1].astype(np.int32)
            scatter_topology_witnesses(row, np.array([length], np.int32), num_segments)
            rows[i] = row[0]
        valid = rows[i] >= 0
        chosen_scores[i, valid] = scores[rows[i, valid]]
    if scores_buf is not None:
        scores_buf[...] = chosen_scores
    return _deliver(rows, out_buf)


def _topk_outputs(out: Any, scores_out: Any, shape: tuple, inputs: tuple) -> tuple:
    """A top-k call's ``out`` (int32) and ``scores_out`` (float32) of
    ``shape``, checked against the ``inputs`` and each other, or None each."""
    out_buf = _output(out, shape, _SELECTION, inputs=inputs)
    scores_buf = _out_buffer(scores_out, "scores_out", shape, _SELECTION, np.float32, inputs + (out,))
    return out_buf, scores_buf


def _indexer_inputs(index_q: Any, weights: Any, index_k: Any, query_pos: Any, key_scale: Any,
                    key_format: Optional[str],
                    query_format: Optional[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(q, w, k, c, pos)`` decoded (float64) and checked: ``q [n, h, d]``,
    ``w [n, h]``, ``k [t, d]``, ``c [t]`` (ones when None), ``pos [n]``."""
    q = decode(index_q, query_format, "query_format")
    k = decode(index_k, key_format, "key_format")
    if q.ndim != 3:
        raise _refuse(_SELECTION, "index_q", f"index_q must be 3-D, got shape {q.shape}")
    if k.ndim != 2:
        raise _refuse(_SELECTION, "index_k", f"index_k must be 2-D, got shape {k.shape}")
    n, h, d = q.shape
    if k.shape[1] != d:
        raise _refuse(_SELECTION, "index_q", f"index_q has d={d} but index_k has d={k.shape[1]}")
    w = _float_array("weights", weights, None, _SELECTION)
    _axes("weights", w.shape, [("n_queries", n), ("H", h)])
    t = k.shape[0]
    c = np.ones(t) if key_scale is None else _key_scale(key_scale, t)
    pos = _query_positions(query_pos, n)
    return q, w, k, c, pos


def _key_scale(key_scale: Any, t: int) -> np.ndarray:
    """``key_scale`` as ``[t]`` scales: one number (0-D, a Python or NumPy
    float) is the scale of every key, else ``[n_keys]``."""
    c = _float_array("key_scale", key_scale, None, _SELECTION)
    if c.ndim == 0:
        return np.full(t, float(c))
    _axes("key_scale", c.shape, [("n_keys", t)])
    return c


def _indexer_queries(index_q: Any, weights: Any, query_format: Optional[str]) -> tuple:
    """``(n, h, d)`` of ``index_q [n, h, d]``, ``weights`` checked ``[n, h]``."""
    q = decode(index_q, query_format, "query_format")
    if q.ndim != 3:
        raise _refuse(_SELECTION, "index_q", f"index_q must be 3-D, got shape {q.shape}")
    n, h, d = q.shape
    _axes("weights", _float_array("weights", weights, None, _SELECTION).shape, [("n_queries", n), ("H", h)])
    return n, h, d


def _indexer_row(q: np.ndarray, w: np.ndarray, k: np.ndarray, c: np.ndarray) -> np.ndarray:
    """One query's scores (float64) of the keys ``k``: ``c_t * sum_h w_h *
    relu(q_h . k_t)``, a NaN dot product kept NaN."""
    if not len(k):
        return np.zeros(0)
    with np.errstate(invalid="ignore", over="ignore"):
        dots = q @ k.T  # [h, length]
        relu = np.where(np.isnan(dots), np.nan, np.maximum(dots, 0.0))
        return (w @ relu) * c


def indexer_scores(
    index_q: Any,
    weights: Any,
    index_k: Any,
    query_pos: Any,
    *,
    key_scale: Any = None,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    out: Any = None,
) -> np.ndarray:
    """Every query's score of every key it sees, float32 ``[n_queries,
    n_keys]``, NaN past its context (computed in float64, rounded once)."""
    args = _indexer_inputs(index_q, weights, index_k, query_pos, key_scale, key_format, query_format)
    inputs = (index_q, weights, index_k, query_pos, key_scale)
    return _deliver(_indexer_matrix(*args, False),
                    _output(out, (len(args[0]), len(args[2])), _SELECTION, np.float32, inputs))


def indexer_magnitudes(
    index_q: Any,
    weights: Any,
    index_k: Any,
    query_pos: Any,
    *,
    key_scale: Any = None,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    out: Any = None,
) -> np.ndarray:
    """Each :func:`indexer_scores` entry's error scale ``|c_t| * sum_h |w_h|
    * sum_i |q_hi * k_ti|``, float32, NaN past each context."""
    args = _indexer_inputs(index_q, weights, index_k, query_pos, key_scale, key_format, query_format)
    inputs = (index_q, weights, index_k, query_pos, key_scale)
    return _deliver(_indexer_matrix(*args, True),
                    _output(out, (len(args[0]), len(args[2])), _SELECTION, np.float32, inputs))


def _indexer_matrix(q: np.ndarray, w: np.ndarray, k: np.ndarray, c: np.ndarray, pos: np.ndarray,
                    magnitudes: bool) -> np.ndarray:
    if magnitudes:  # the ReLU is the identity on the absolute values
        q, w, k, c = np.abs(q), np.abs(w), np.abs(k), np.abs(c)
    out = np.full((len(q), len(k)), np.nan)
    for i in range(len(q)):
        length = min(int(pos[i]) + 1, len(k))
        out[i, :length] = _indexer_row(q[i], w[i], k[:length], c[:length])
    return (out.astype(np.float32) + np.float32(0.0)).astype(np.float32)


def indexer_topk_packed(
    index_q: Any,
    weights: Any,
    index_k: Any,
    cu_seqlens: Any,
    seq_ids: Any,
    query_pos: Any,
    topk: int,
    *,
    key_scale: Any = None,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    num_segments: int = 0,
    out: Any = None,
    scores_out: Any = None,
) -> np.ndarray:
    """:func:`indexer_topk` of each query over its own sequence's keys, rows
    ``cu_seqlens[s] .. cu_seqlens[s + 1]`` for ``s = seq_ids[i]``."""
    n = _indexer_queries(index_q, weights, query_format)[0]
    k = decode(index_k, key_format, "key_format")
    if k.ndim != 2:
        raise _refuse(_SELECTION, "index_k", f"index_k must be 2-D, got shape {k.shape}")
    c = None if key_scale is None else _key_scale(key_scale, len(k))
    k = np.asarray(index_k)
    cu = _index_array("cu_seqlens", cu_seqlens, 1, _SELECTION, positions=True)
    sid = _along("seq_ids", seq_ids, ("n_queries", n))
    pos = _query_positions(query_pos, n)
    if len(cu) == 0 or cu[0] != 0 or (np.diff(cu) < 0).any() or cu[-1] != len(k):
        raise _refuse(_SELECTION, "cu_seqlens", "cu_seqlens must run from 0 to n_keys, non-decreasing")
    if (sid >= len(cu) - 1).any():
        raise _refuse(_SELECTION, "seq_ids", "a sequence id past cu_seqlens")
    q, w = np.asarray(index_q), np.asarray(weights)

    def one(i: int, s_row: np.ndarray) -> np.ndarray:
        k0, k1 = int(cu[sid[i]]), int(cu[sid[i] + 1])
        return indexer_topk(q[i : i + 1], w[i : i + 1], k[k0:k1], pos[i : i + 1], topk,
                            key_scale=None if c is None else c[k0:k1], key_format=key_format,
                            query_format=query_format, num_segments=num_segments, scores_out=s_row)

    return _query_by_query(len(sid), _count("topk", topk), one, out, scores_out,
                           (index_q, weights, index_k, cu_seqlens, seq_ids, query_pos, key_scale))


def _query_by_query(n: int, topk: int, one: Any, out: Any, scores_out: Any, inputs: tuple) -> np.ndarray:
    """The rows ``one(i, scores_row)`` of queries ``0..n`` stacked, into
    ``out`` when given, their scores into ``scores_out`` when given (both
    checked against the ``inputs`` and each other before anything runs)."""
    out_buf, scores_buf = _topk_outputs(out, scores_out, (n, topk), inputs)
    rows, scores = [], []
    for i in range(n):
        s_row = np.zeros((1, topk), np.float32)
        rows.append(one(i, s_row))
        scores.append(s_row)
    result = np.concatenate(rows) if rows else np.zeros((0, topk), np.int32)
    if scores_buf is not None and scores:
        scores_buf[...] = np.concatenate(scores)
    return _deliver(result, out_buf)


def _gather_pages(kv_cache: Any, block_table: np.ndarray, s: int, length: int, page_layout: str,
                  key_format: Optional[str]):
    """Sequence ``s``'s first ``length`` keys (and scales) from its pages."""
    cache = np.asarray(kv_cache)
    if page_layout == "fp8_scaled":
        n_blocks, bs, width = cache.shape[0], cache.shape[1], cache.shape[-1]
        d = width - 4
        pages = np.ascontiguousarray(cache).reshape(n_blocks, bs * width)
        keys = _fp8_e4m3fn_table()[pages[:, : bs * d].reshape(n_blocks, bs, d)]
        scales = pages[:, bs * d :].copy().view(np.float32).astype(np.float64).reshape(n_blocks, bs)
    else:
        bs = cache.shape[1]
        keys, scales = decode(cache, key_format, "key_format"), None
    need = -(-length // bs)
    ids = block_table[s, :need]
    if (ids < 0).any() or (ids >= len(keys)).any():
        raise _refuse(_SELECTION, "block_table", "a block-table entry is not a page of the cache")
    k = keys[ids].reshape(-1, keys.shape[-1])[:length]
    c = None if scales is None else scales[ids].reshape(-1)[:length]
    return k, c


def indexer_topk_paged(
    index_q: Any,
    weights: Any,
    kv_cache: Any,
    block_table: Any,
    seq_lens: Any,
    seq_ids: Any,
    query_pos: Any,
    topk: int,
    *,
    page_layout: str = "dense",
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    num_segments: int = 0,
    out: Any = None,
    scores_out: Any = None,
) -> np.ndarray:
    """:func:`indexer_topk` of each query over its sequence's keys gathered
    from the pages its block-table row names (only the first
    ``ceil(seq_len / block_size)`` entries are read)."""
    n = _indexer_queries(index_q, weights, query_format)[0]
    if page_layout not in ("dense", "fp8_scaled"):
        raise _refuse(_SELECTION, "page_layout", f"page_layout must be 'dense' or 'fp8_scaled', got {page_layout!r}")
    _native_pages(kv_cache)
    table = _index_array("block_table", block_table, 2, _SELECTION)
    lens = _index_array("seq_lens", seq_lens, 1, _SELECTION, positions=True)
    _axes("block_table", table.shape, [("n_seqs", len(lens)), ("max_blocks", table.shape[1])])
    sid = _along("seq_ids", seq_ids, ("n_queries", n))
    pos = _query_positions(query_pos, n)
    if (sid >= len(lens)).any():
        raise _refuse(_SELECTION, "seq_ids", "a sequence id past seq_lens")
    q, w = np.asarray(index_q), np.asarray(weights)

    def one(i: int, s_row: np.ndarray) -> np.ndarray:
        s = int(sid[i])
        k, c = _gather_pages(kv_cache, table, s, int(lens[s]), page_layout, key_format)
        return indexer_topk(q[i : i + 1], w[i : i + 1], k, pos[i : i + 1], topk, key_scale=c,
                            query_format=query_format, num_segments=num_segments, scores_out=s_row)

    return _query_by_query(len(sid), _count("topk", topk), one, out, scores_out,
                           (index_q, weights, kv_cache, block_table, seq_lens, seq_ids, query_pos))


# ==========================================================================
# metrics: attention probabilities, batched coverage/recall, output error
# --------------------------------------------------------------------------
# Written from the module docs of src/metrics.rs. Each batched metric is the
# witness section's scalar metric of every row (called, not reimplemented);
# with GQA, attention row ``r`` is read against candidate row ``r // group``.
# ==========================================================================


def attention_probabilities(
    q: Any, k: Any, query_pos: Any, *, scale: Optional[float] = None,
    out: Optional[np.ndarray] = None,
) -> np.ndarray:
    """Dense causal softmax rows, float64 ``[n_queries, n_q_heads, n_keys]``:
    row ``(i, h)`` is ``softmax((q_ih . k_j) * scale)`` over the visible keys
    ``j <= min(query_pos[i], n_keys - 1)`` of KV head ``h // group``, 0 after
    (one integer ``query_pos`` is ``[query_pos]``; ``out`` filled when given)."""
    raw = (q, k, query_pos)
    q, k, pos, group = _qk(q, k, query_pos)
    n_queries, n_q_heads, d_k = q.shape
    n_keys = k.shape[0]
    scale = _native_scale(d_k) if scale is None else float(scale)
    if not math.isfinite(scale):
        raise ReferenceSelectionError("scale", f"scale={scale} is not finite")
    buf = _out_buffer(out, "out", (n_queries, n_q_heads, n_keys), _SELECTION, np.float64, raw)
    out = np.zeros((n_queries, n_q_heads, n_keys))
    for i, p in enumerate(pos):
        visible = min(p + 1, n_keys)
        if visible == 0:
            continue
        for h in range(n_q_heads):
            s = (k[:visible, h // group] @ q[i, h]) * scale
            e = np.exp(s - s.max())
            out[i, h, :visible] = e / e.sum()
    if buf is not None:
        buf[...] = out
        return buf
    return out


def _row_lens(context_lens: Any, rows: int) -> np.ndarray:
    """``context_lens`` as one length per candidate row, ``[rows]``."""
    lens = _index_array("context_lens", context_lens, 1, _WITNESS, positions=True)
    if lens.shape != (rows,):
        raise _refuse(_WITNESS, "context_lens", f"context_lens must be [rows={rows}], got {list(lens.shape)}")
    return lens


def segment_coverage_rows(candidates: Any, context_lens: Any, num_segments: int, *,
                          out: Optional[np.ndarray] = None) -> np.ndarray:
    """:func:`segment_coverage` of every row of ``candidates [rows, width]``
    with its own context length (``context_lens [rows]``); float64 ``[rows]``
    (or ``out`` filled)."""
    c = _index_array("candidates", candidates, 2, _WITNESS)
    lens = _row_lens(context_lens, c.shape[0])
    num_segments = _count("num_segments", num_segments)
    buf = _out_buffer(out, "out", (c.shape[0],), _WITNESS, np.float64, (candidates, context_lens))
    result = np.array(
        [segment_coverage(c[r], int(lens[r]), num_segments) for r in range(c.shape[0])],
        dtype=np.float64,
    )
    return result if buf is None else _deliver(result, buf)


def slots_used_rows(candidates: Any, context_lens: Any, *, out: Optional[np.ndarray] = None) -> np.ndarray:
    """How many distinct entries of each row of ``candidates [rows, width]``
    lie in ``[0, context_lens[r])``; int64 ``[rows]`` (or ``out`` filled)."""
    c = _index_array("candidates", candidates, 2, _WITNESS)
    lens = _row_lens(context_lens, c.shape[0])
    buf = _out_buffer(out, "out", (c.shape[0],), _WITNESS, np.int64, (candidates, context_lens))
    result = np.array([len({int(x) for x in row if 0 <= x < L}) for row, L in zip(c, lens)],
                      dtype=np.int64)
    return result if buf is None else _deliver(result, buf)


def attention_mass_recall_rows(candidates: Any, attention: Any, *,
                               out: Optional[np.ndarray] = None) -> np.ndarray:
    """:func:`attention_mass_recall` of every attention row ``r`` of
    ``attention [n_rows, row_len]`` against candidate row ``r // group``,
    ``group = n_rows // rows`` (a KV head's selection serves its query-head
    group); float64 ``[n_rows]``, NaN for a row with no mass. Or 3-D:
    ``candidates [n_queries, n_kv_heads, width]`` and ``attention
    [n_queries, n_q_heads, n_keys]``, the same rows flattened, float64
    ``[n_queries, n_q_heads]``. ``out`` filled when given."""
    c = _index_array("candidates", candidates, np.ndim(candidates) if np.ndim(candidates) == 3 else 2,
                     _WITNESS)
    if c.ndim == 3:
        a = _float_array("attention", attention, None, _WITNESS, dtype=np.float64)
        n, hkv = c.shape[0], c.shape[1]
        if a.ndim != 3 or a.shape[0] != n:
            raise _refuse(_WITNESS, "attention",
                          f"attention must be [n_queries={n}, n_q_heads, n_keys], got {list(a.shape)}")
        hq = a.shape[1]
        if hkv == 0 or hq % hkv:
            raise _refuse(_WITNESS, "attention", f"n_q_heads={hq} is not a positive multiple of {hkv}")
        shape: tuple = (n, hq)
        c = c.reshape(n * hkv, c.shape[2])
        a = a.reshape(n * hq, a.shape[2])
    else:
        a = _float_array("attention", attention, None, _WITNESS, dtype=np.float64)
        if a.ndim != 2:
            raise _refuse(_WITNESS, "attention", f"attention must be 2-D like candidates, got {list(a.shape)}")
        shape = (a.shape[0],)
    rows, n_rows = c.shape[0], a.shape[0]
    buf = _out_buffer(out, "out", shape, _WITNESS, np.float64, (candidates, attention))
    if rows == 0:
        if n_rows != 0:
            raise _refuse(_WITNESS, "attention", "attention rows without candidate rows")
        return np.zeros(shape) if buf is None else buf
    group = n_rows // rows
    if group == 0 or group * rows != n_rows:
        raise _refuse(_WITNESS, "attention", f"{n_rows} attention rows are not a positive multiple of {rows}")
    result = np.array(
        [attention_mass_recall(c[r // group], a[r]) for r in range(n_rows)], dtype=np.float64
    ).reshape(shape)
    return result if buf is None else _deliver(result, buf)


def _relative_error(sparse: np.ndarray, dense: np.ndarray) -> float:
    """``||sparse - dense|| / ||dense||`` in float64: 0 when they are equal
    (both zero included), +inf when only ``dense`` is zero, NaN with NaN."""
    diff = float(np.sum((sparse - dense) ** 2))
    if diff == 0.0:
        return 0.0
    norm = float(np.sum(dense**2))
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.sqrt(np.float64(diff) / np.float64(norm)))


def _outputs(sparse: Any, dense: Any):
    """``sparse`` and ``dense`` as the native metric reads them (float32,
    widened to float64), of one shape."""
    s = _float_array("sparse", sparse, None, _SELECTION)
    d = _float_array("dense", dense, None, _SELECTION)
    if s.shape != d.shape:
        raise ReferenceSelectionError("dense", f"dense must be {list(s.shape)}, got {list(d.shape)}")
    return s, d


def output_relative_error(sparse: Any, dense: Any) -> float:
    """``||sparse - dense||_2 / ||dense||_2`` over whole arrays, float64."""
    s, d = _outputs(sparse, dense)
    return _relative_error(s.ravel(), d.ravel())


def output_relative_error_rows(sparse: Any, dense: Any, *, out: Optional[np.ndarray] = None) -> np.ndarray:
    """:func:`output_relative_error` per row over the last axis: float64 of
    the leading shape (or ``out`` filled). ``dense`` must have ``sparse``'s
    shape axis by axis."""
    s = _float_array("sparse", sparse, None, _SELECTION)
    if s.ndim == 0:
        raise ReferenceSelectionError("sparse", "sparse must be at least 1-D")
    d = _float_array("dense", dense, None, _SELECTION)
    if s.shape != d.shape:
        raise ReferenceSelectionError("dense", f"dense must be {list(s.shape)}, got {list(d.shape)}")
    lead = s.shape[:-1]
    buf = _out_buffer(out, "out", lead, _SELECTION, np.float64, (sparse, dense))
    s2 = s.reshape(-1, s.shape[-1]) if s.size else s.reshape(int(np.prod(lead)), s.shape[-1])
    d2 = d.reshape(s2.shape)
    result = np.array([_relative_error(s2[r], d2[r]) for r in range(s2.shape[0])]).reshape(lead)
    return result if buf is None else _deliver(result, buf)


# ==========================================================================
# check: is an engine's selection right?
# --------------------------------------------------------------------------
# Written from the module docs of ``src/check/`` (the rule, its tolerance and
# the report), independently of the code there.
#
# Token top-k (``check_topk``). A row for context L and budget topk is
# correct iff its valid (non-negative) entries come first, then only
# padding; they are distinct and causal (0 <= x < L); there are exactly
# min(topk, L) of them; and every selected position scores at least every
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
_BLOCK_REASONS = ("padding_hole", "duplicate", "not_causal", "not_in_table", "missing_forced", "wrong_count",
                  "wrong_selection")
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


def _scan(raw: np.ndarray, row: list, n: int, problems: list, holes: bool = False,
          mapped: bool = True, filler: str = "-1") -> dict:
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
            problems.append({"reason": "padding_hole", "slot": slot,
                             "position": int(raw[slot]) if unmapped else x})
        if unmapped:
            problems.append({"reason": "not_in_table", "slot": slot, "value": int(raw[slot])})
            continue
        if x >= n:
            if causal is None:
                causal = {"reason": "not_causal", "slot": slot, "position": x,
                          **({"value": int(raw[slot])} if mapped else {}), "n_slots": 0, "context": n}
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


def _selection(s: np.ndarray, m: Optional[np.ndarray], atol: float, rtol: float,
               selected: list, unselected: list, want: int) -> Optional[dict]:
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


def _check_row(s: np.ndarray, m: Optional[np.ndarray], atol: float, rtol: float,
               raw: np.ndarray, row: list, L: int, topk: int, holes: bool = False,
               mapped: bool = False, filler: str = "-1") -> list:
    """One token top-k row (``row`` read back from the engine's ``raw``)."""
    problems: list = []
    chosen = _scan(raw, row, L, problems, holes, mapped, filler)
    expected = min(topk, L)
    if len(chosen) != expected:
        problems.append({"reason": "wrong_count", "valid": len(chosen), "expected": expected})
    if not problems:
        unselected = [t for t in range(L) if t not in chosen]
        p = _selection(s, m, atol, rtol, list(chosen), unselected, expected)
        if p is not None:
            problems.append(p)
    return problems


def _check_block_row(s: np.ndarray, m: Optional[np.ndarray], atol: float, rtol: float,
                     raw: np.ndarray, row: list, n: int, cfg: tuple, mapped: bool = False) -> list:
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
        p = _selection(s, m, atol, rtol, [b for b in free if b in chosen], [b for b in free if b not in chosen],
                       expected - len(forced))
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

    def __init__(self, block_table: Any, req_ids: Any, block_size: Any, *, block_stride_rows: Any = None,
                 prefill_req_ids: Any = None, workspace_starts: Any = None, dcp_size: Any = None,
                 dcp_interleave: Any = None) -> None:
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
        self.stride = (self.block_size if block_stride_rows is None
                       else _selection_count("block_stride_rows", block_stride_rows))
        self.prefill_req_ids = None if prefill_req_ids is None else _int64_array("prefill_req_ids", prefill_req_ids, 1)
        starts = None if workspace_starts is None else _int64_array("workspace_starts", workspace_starts, 1)
        if (self.prefill_req_ids is None) != (starts is None):
            raise ReferenceSelectionError(
                "workspace_starts", "prefill_req_ids and workspace_starts go together: pass both or neither")
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

    def positions(self, rows: Any) -> np.ndarray:
        """``kvselect.GlobalSlots.positions``: the engine's rows read back
        through the map, int64 row-relative positions, ``-1`` padding,
        ``2**63 - 1`` for an entry naming no position of its request."""
        r = _engine_rows(rows)
        self._check(r.shape[0])
        if self.dcp_size > 1 and r.shape[1] % self.dcp_size:
            raise ReferenceSelectionError("rows", "the rows' width must be a multiple of dcp_size")
        out = np.array([self._relative(i, r[i]) for i in range(r.shape[0])], dtype=np.int64)
        return np.maximum(out.reshape(r.shape), -1)

    def __repr__(self) -> str:
        return (f"GlobalSlots(<{self.block_table.shape[0]} requests x {self.block_table.shape[1]} blocks>, "
                f"<{len(self.req_ids)} rows>, block_size={self.block_size}, block_stride_rows={self.stride}, "
                f"prefill={self.prefill_req_ids is not None})")


def _check_batch(s: np.ndarray, r: np.ndarray, lens: list, m: Optional[np.ndarray], atol: float, rtol: float,
                layout: Any, names: dict, need: tuple, judge: Any, reasons: tuple) -> dict:
    """The shared body of the score checks: refusals, then each row judged
    by ``judge(s_i, m_i, raw_i, row_i, len_i, mapped)``. ``names`` maps ``scores``
    and ``lens`` to the caller's argument names; ``need`` is (argument, the
    most ids a row must hold)."""
    n, t = s.shape
    counts = (n, r.shape[0], len(lens))
    if len(set(counts)) > 1:  # the one that disagrees with the other two is named
        culprit = {(True, False): names["lens"], (False, True): "rows"}.get(
            (counts[0] == counts[1], counts[0] == counts[2]),
            names["scores"] if counts[1] == counts[2] else "rows")
        raise ReferenceSelectionError(culprit, f"{names['scores']}, rows and {names['lens']} must count "
                                      "the same rows")
    if m is not None and m.shape != s.shape:
        raise ReferenceSelectionError("magnitudes", f"magnitudes must have the shape of {names['scores']}")
    if r.shape[0] != n:
        raise ReferenceSelectionError("rows", f"rows must have one row per {names['lens']} entry")
    if need[1] > r.shape[1]:
        raise ReferenceSelectionError(need[0], f"the rule selects up to {need[1]} but rows hold {r.shape[1]} slots")
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
            raise TypeError(f"layout must be a GlobalSlots or None, got {type(layout).__name__}")
        layout._check(n)
        if layout.dcp_size > 1 and (need[0] == "config" or r.shape[1] % layout.dcp_size):
            raise ReferenceSelectionError(
                "layout", "a DCP layout reads token rows of dcp_size ranks side by side: the rows' "
                "width must be a multiple of it (and blocks have no DCP form)")
    details, by_reason = [], dict.fromkeys(reasons, 0)
    for i in range(n):
        row = [int(x) for x in r[i]] if layout is None else layout._relative(i, r[i])
        problems = judge(s[i], None if m is None else m[i], r[i], row, lens[i], layout is not None)
        if problems:
            for reason in {p["reason"] for p in problems}:
                by_reason[reason] += 1
            details.append({"row": i, "problems": problems})
    return {"rows": n, "correct": n - len(details), "wrong": len(details),
            "by_reason": by_reason, "details": details}


def _engine_rows(rows: Any) -> np.ndarray:
    """An engine's rows: a 2-D integer array (values within int64), int64."""
    r = np.asarray(rows)
    if r.dtype.kind not in "iu":
        raise TypeError(f"rows must hold integers, got dtype {r.dtype}")
    return _int64_array("rows", r, 2)


def check_topk(scores: Any, rows: Any, context_lens: Any = None, *, topk: Any = None,
               atol: float = 0.0, rtol: float = 0.0, magnitudes: Any = None, slots: Any = None,
               filler: str = "-1") -> dict:
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
    if raw_s.size and raw_s.dtype not in (np.float32, np.float64):  # as natively: compared as given
        raise TypeError(f"scores must be float32 or float64, got dtype {raw_s.dtype}")
    wide = np.float64 if raw_s.dtype == np.float64 else np.float32
    s = _float_array("scores", scores, 2, _SELECTION, dtype=wide)
    n, t = s.shape
    lens = [t] * n if context_lens is None else [int(x) for x in _index_array(
        "context_lens", context_lens, 1, _SELECTION, positions=True)]
    m_wide = np.float64 if np.asarray(magnitudes).dtype == np.float64 else np.float32
    m = None if magnitudes is None else _float_array("magnitudes", magnitudes, 2, _SELECTION, dtype=m_wide)
    a, rt = float(atol), float(rtol)
    return _check_batch(s, r, lens, m, a, rt, slots, {"scores": "scores", "lens": "context_lens"}, ("topk", k),
                       lambda si, mi, raw, row, L, mp: _check_row(si, mi, a, rt, raw, row, L, k, ranks > 1, mp,
                                                                 fill),
                       _CHECK_REASONS)


def check_blocks(block_scores: Any, rows: Any, visible_blocks: Any, config: Any = None, *, atol: float = 0.0,
                 rtol: float = 0.0, magnitudes: Any = None, slots: Any = None, head_major: Any = False) -> dict:
    """``kvselect.check_blocks``: whether each engine row of block ids (one
    row per (query, head), any order) is a correct block selection under
    ``config`` for a query that sees ``visible_blocks[row]`` blocks, judged
    against ``block_scores [n_rows, n_blocks]`` (see the section's rule).

    Or 3-D, as :func:`block_scores` / :func:`block_sparse_select` give them:
    ``block_scores [n_queries, n_kv_heads, n_blocks]``, ``rows [n_queries,
    n_kv_heads, width]`` (``[n_kv_heads, n_queries, width]`` with
    ``head_major=True``) and ``visible_blocks [n_queries]``: the same check
    of the rows flattened query-major (row ``i * n_kv_heads + h``)."""
    cfg = _config(config)
    head_major = _flag("head_major", head_major)
    raw = np.asarray(rows)
    if raw.dtype.kind not in "iu":
        raise TypeError(f"rows must hold integers, got dtype {raw.dtype}")
    if raw.ndim not in (2, 3):
        raise ReferenceSelectionError("rows", f"rows must be 2-D or 3-D, got shape {raw.shape}")
    r = _int64_array("rows", raw, raw.ndim)
    s = _float_array("block_scores", block_scores, None, _SELECTION).astype(np.float32)
    vis = _index_array("visible_blocks", visible_blocks, 1, _SELECTION, positions=True)
    if s.ndim != r.ndim:  # the forms do not mix: the 3-D one of the pair is named
        raise ReferenceSelectionError("rows" if r.ndim == 3 and s.ndim == 2 else "block_scores",
                                      f"block_scores must be {r.ndim}-D like rows, got {s.shape}")
    if r.ndim == 2 and head_major:
        raise ReferenceSelectionError("head_major", "head_major=True describes 3-D rows")
    m = None if magnitudes is None else _float_array("magnitudes", magnitudes, None, _SELECTION).astype(np.float32)
    if r.ndim == 3:
        nq, h, t = s.shape
        want = (h, nq, r.shape[2]) if head_major else (nq, h, r.shape[2])
        if r.shape != want:
            raise ReferenceSelectionError("rows", f"rows must be {list(want)}, got {list(r.shape)}")
        if vis.shape != (nq,):
            raise ReferenceSelectionError("visible_blocks", f"visible_blocks must be [n_queries={nq}], "
                                          f"got {list(vis.shape)}")
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
    return _check_batch(s, r, lens, m, a, rt, slots, {"scores": "block_scores", "lens": "visible_blocks"},
                       ("config", width),
                       lambda si, mi, raw, row, nb, mp: _check_block_row(si, mi, a, rt, raw, row, nb, cfg, mp),
                       _BLOCK_REASONS)


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
        raise _refuse(_WITNESS, "after", f"after has shape {a.shape} but before {b.shape}: "
                      "the in-place call keeps the shape")
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
        _merge(expected, b, lens, keep, S, min(S, topk - keep))
        table = _witness_table(b, lens, S)
    details, by_reason = [], dict.fromkeys(_WITNESS_REASONS, 0)
    for i in range(rows):
        if np.array_equal(a[i], expected[i]):
            continue
        present = [] if table is None else [int(w) for w in table[i] if w >= 0]
        written = min(len(present), topk - keep)
        problems = []
        d = _first_diff(a[i], expected[i], 0, keep)
        if d:
            problems.append({"reason": "prefix_changed", "slot": d[0], "learned": int(b[i, d[0]]),
                             "got": int(a[i, d[0]]), "n_changed": d[1]})
        d = _first_diff(a[i], expected[i], keep, keep + written)
        if d:
            why = _why_wrong(int(a[i, d[0]]), b[i], int(lens[i]), S, present[:written], d[0])
            problems.append({"reason": "wrong_witness", "slot": d[0], "expected": int(expected[i, d[0]]),
                             "got": int(a[i, d[0]]), "why": why, "n_wrong": d[1]})
        d = _first_diff(a[i], expected[i], keep + written, topk)
        if d:
            problems.append({"reason": "tail_changed", "slot": d[0], "learned": int(b[i, d[0]]),
                             "got": int(a[i, d[0]]), "n_changed": d[1]})
        for reason in {p["reason"] for p in problems}:
            by_reason[reason] += 1
        details.append({"row": i, "problems": problems})
    return {"rows": rows, "correct": rows - len(details), "wrong": len(details),
            "by_reason": by_reason, "details": details}
