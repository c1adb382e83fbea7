"""MiniMax-M3 block selection over dense, packed and paged keys in every
key format, query- or head-major, and the positions a selection covers
(one row or batched); the twin of ``src/block_sparse/``.

Part of ``kvselect.reference``; see that package's docstring.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from ._args import (
    _SELECTION,
    ReferenceSelectionError,
    _along,
    _axes,
    _count,
    _deliver,
    _index_array,
    _native_pages,
    _output,
    _query_positions,
    _readable_pages,
)
from .keys import decode

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
# ``key_format`` / ``query_format``: decoded exactly by ``keys.decode``
# (called, not reimplemented). A paged cache is read in
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
# Dot products are taken in float64 from the decoded values (every product
# exact). The selection ranks them as they are: the real-arithmetic block
# scores up to float64 rounding, as kvselect's exact selection does (the
# spec ranks float32 sums; README, "deviations"). block_scores reports each
# rounded once to float32, the spec's score type: the correctly rounded
# float32 dot product. On integer-valued data of small magnitude every dot
# product is exact in any summation order, so everything must agree
# exactly; on other data the selections agree up to ties within float64
# rounding, the scores up to float32 rounding.
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
        raise ReferenceSelectionError("top_blocks", "top_blocks is 0 and no block is forced: nothing could be selected")
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


def config_fields(config: Any):
    """``(block_size, top_blocks, init_blocks, local_blocks)`` of ``config``:
    None for the default, or a config (this module's or the native one)."""
    if config is None:
        config = BlockSparseConfig()
    try:
        fields = (config.block_size, config.top_blocks, config.init_blocks, config.local_blocks)
    except AttributeError:
        raise TypeError(f"config must be a BlockSparseConfig or None, got {type(config).__name__}") from None
    return _block_config(*fields)


def _block_scores(q: np.ndarray, keys: np.ndarray, query_pos: int, bs: int, rounded: bool = True) -> np.ndarray:
    """float64 ``[n_kv_heads, n_blocks]``: each visible block's score for
    each head (``q`` float64 ``[n_kv_heads, d]``, ``keys`` float64
    ``[n_positions, d]``), each dot product rounded to float32 (``rounded``,
    the spec's scores) or not (the real-arithmetic scores the selection
    ranks). ``n_blocks`` is 0 when there are no keys."""
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
        if rounded:
            scores = (q @ keys[:n_visible].T).astype(np.float32).astype(np.float64)
        else:
            # Elementwise products summed per key in one order, not BLAS (a
            # BLAS product may round equal operands differently in different
            # columns and split the exact ties the rule orders by id).
            scores = np.empty((n_heads, n_visible))
            step = max(1, (1 << 21) // max(1, n_heads * keys.shape[1]))
            for a in range(0, n_visible, step):
                scores[:, a : a + step] = (q[:, None, :] * keys[None, a : min(a + step, n_visible), :]).sum(axis=2)
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


def _block_values(
    index_q: Any,
    index_k: Any,
    query_pos: Any,
    config: Any,
    key_format: Optional[str],
    query_format: Optional[str],
    out: Any,
    magnitudes: bool,
) -> np.ndarray:
    bs = config_fields(config)[0]
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

    block_score = _block_scores(q, keys, query_pos, bs, rounded=False)
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


def flag_argument(name: str, value: Any) -> bool:
    """A keyword flag (``head_major``, ``physical``): a bool, as natively."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return bool(value)


def _decoded(name: str, value: Any, format: Optional[str], ndim: Optional[int] = None) -> np.ndarray:
    """Keys or queries decoded exactly to float64 by :func:`decode` (a bad
    dtype or format is a ``TypeError``), refused unless ``ndim``-D (when given)."""
    a = decode(value, format, "query_format" if name == "index_q" else "key_format", name=name)
    if ndim is not None and a.ndim != ndim:
        raise ReferenceSelectionError(name, f"{name} must be {ndim}-D, got shape {a.shape}")
    return a


def _same_d(q: np.ndarray, keys: np.ndarray) -> None:
    if q.shape[-1] != keys.shape[-1]:
        raise ReferenceSelectionError("index_q", f"index_q has d={q.shape[-1]} but the keys have d={keys.shape[-1]}")


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
    bs, top, init, local = config_fields(config)
    width = max(top, init + local)
    head_major = flag_argument("head_major", head_major)
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
    out = _output(
        out, _batch_shape(q.shape[0], q.shape[1], width, head_major), _SELECTION, inputs=(index_q, index_k, query_pos)
    )
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
    bs, top, init, local = config_fields(config)
    width = max(top, init + local)
    head_major = flag_argument("head_major", head_major)
    keys = _decoded("index_k", index_k, key_format, 2)
    q = _decoded("index_q", index_q, query_format, 3)
    _same_d(q, keys)
    cu = _index_array("cu_seqlens", cu_seqlens, 1, _SELECTION, positions=True)
    sid = _along("seq_ids", seq_ids, ("n_queries", q.shape[0]))
    pos = _query_positions(query_pos, q.shape[0])
    out = _output(
        out,
        _batch_shape(q.shape[0], q.shape[1], width, head_major),
        _SELECTION,
        inputs=(index_q, index_k, cu_seqlens, seq_ids, query_pos),
    )
    if len(cu) == 0 or cu[0] != 0 or cu[-1] != keys.shape[0] or np.any(np.diff(cu) < 0):
        raise ReferenceSelectionError("cu_seqlens", "cu_seqlens must rise from 0 to n_positions without decreasing")
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
    in place) is a ``TypeError`` (:func:`_readable_pages`)."""
    _readable_pages(_native_pages(kv_cache))
    pages = _decoded("kv_cache", kv_cache, key_format, 3)
    if pages.shape[1] != bs:
        raise ReferenceSelectionError(
            "kv_cache",
            f"kv_cache pages hold {pages.shape[1]} tokens, but config.block_size is {bs}: the page must be the block",
        )
    return pages


def _check_block_table(table: np.ndarray, lens: np.ndarray, n_pages: int, bs: int) -> None:
    """Every entry that will be read, the first ``ceil(seq_lens[s] / bs)`` of
    each row, must exist and name a page of the cache."""
    if table.shape[0] != len(lens):
        raise ReferenceSelectionError("block_table", f"block_table has {table.shape[0]} rows for {len(lens)} sequences")
    for s, length in enumerate(lens):
        need = -(-int(length) // bs)
        if need > table.shape[1]:
            raise ReferenceSelectionError(
                "block_table",
                f"seq_lens[{s}] = {int(length)} needs {need} blocks, but block_table rows have {table.shape[1]}",
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
    bs, top, init, local = config_fields(config)
    width = max(top, init + local)
    head_major = flag_argument("head_major", head_major)
    physical = flag_argument("physical", physical)
    pages = _paged_cache(kv_cache, key_format, bs)
    q = _decoded("index_q", index_q, query_format, 3)
    _same_d(q, pages)
    table = _index_array("block_table", block_table, 2, _SELECTION)
    lens = _index_array("seq_lens", seq_lens, 1, _SELECTION, positions=True)
    _axes("block_table", table.shape, [("n_seqs", len(lens)), ("max_blocks", table.shape[1])])
    n_queries, n_heads, d = q.shape
    sid = _along("seq_ids", seq_ids, ("n_queries", n_queries))
    pos = _query_positions(query_pos, n_queries)
    out = _output(
        out,
        _batch_shape(n_queries, n_heads, width, head_major),
        _SELECTION,
        inputs=(index_q, kv_cache, block_table, seq_lens, seq_ids, query_pos),
    )
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
    bs = config_fields(config)[0]
    head_major = flag_argument("head_major", head_major)
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
