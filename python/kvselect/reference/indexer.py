"""DeepSeek's lightning indexer top-k (dense, packed and paged) and its
scores and magnitudes; the twin of ``src/indexer/``.

Part of ``kvselect.reference``; see that package's docstring.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ._args import (
    _SELECTION,
    _along,
    _axes,
    _count,
    _deliver,
    _float_array,
    _index_array,
    _native_pages,
    _out_buffer,
    _output,
    _query_positions,
    _readable_pages,
    _refuse,
)
from .keys import decode, fp8_e4m3fn_table
from .witness import MAX_TOPOLOGY_SEGMENTS, scatter_topology_witnesses

# ==========================================================================
# indexer: the lightning indexer's top-k (DeepSeek-V3.2/V4, GLM-5)
# --------------------------------------------------------------------------
# Written from issue 11 and the module docs of src/indexer/:
#
# - score(t) = c_t * sum_h w_h * max(q_h . k_t, 0) over keys t < L,
#   L = min(query_pos + 1, T); the ReLU keeps NaN NaN; over compressed
#   keys (compress_ratio = m, issue 25) L = min((query_pos + 1) // m, T);
# - the row is the topk best positions in rank order (score descending,
#   ties to the lower position, -0.0 == +0.0, NaN below every number), then
#   -1; with num_segments = S the top max(topk - S, 0), widened with -1 and
#   merged by scatter_topology_witnesses with context_lens = L;
# - keys and queries are decoded exactly from their formats, then scored in
#   float64.
#
# The family's options (issue 43; NVIDIA/cudnn-frontend#838's
# cudnn.sparse_attention.indexer_topk contract, whose table lists
# DeepSeek-V4, GLM-5.x, Qwen's QSA and MiniMax's MSA as one call):
#
# - activation="none": sum_h w_h * (q_h . k_t), negative scores included;
# - weights=None: no weights, w_h = 1 (QSA: huggingface/transformers
#   src/transformers/models/qwen4_exp/modeling_qwen4_exp.py @ 009e78d,
#   Qwen4ExpTextQSAIndexer.forward: relu(q . k).sum over heads, then a
#   positive uniform 1/sqrt(d) that moves no top-k);
# - force_first / force_last = F0 / F1: a row that cannot hold every visible
#   entry (L > topk - S) holds entries 0..F0 and L-F1..L, and the rest of the
#   budget is the best of the entries between them; a row with L <= topk - S
#   holds every visible entry once (the cuDNN tests' "forced entries land
#   inside the budget ... short causal prefixes (prefix < k)",
#   NVIDIA/cudnn-frontend#832); F0 + F1 must fit topk - S;
# - row_layout="ascending": the members ascending, compact, then -1
#   (cuDNN's layout; its topk_length is the count of entries); "rank" lists
#   them in the total order of their scores, forced entries included.
# ==========================================================================


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
    compress_ratio: int = 1,
    activation: str = "relu",
    force_first: int = 0,
    force_last: int = 0,
    row_layout: str = "rank",
    score_pool: int = 1,
    score_type: str = "max",
    sm_scale: Optional[float] = None,
    out: Any = None,
    scores_out: Any = None,
) -> np.ndarray:
    """The lightning indexer's top-k of every query (see the section notes):
    int32 ``[n_queries, topk]``; ``scores_out`` (float32 ``[n_queries,
    topk]``) receives each entry's score, NaN where the row holds -1. With
    ``score_pool = P > 1`` the row holds block ids of the max-pool, or with
    ``score_type="lse"`` of the log-sum-exp pool of ``sm_scale`` times the
    scores (the score pool's section notes, :func:`indexer_topk_pooled`)."""
    q, w, k, c, pos = _indexer_inputs(index_q, weights, index_k, query_pos, key_scale, key_format, query_format)
    n, t = len(q), len(k)
    topk = _count("topk", topk)
    num_segments = _count("num_segments", num_segments)
    relu = _activation(activation)
    ascending = _row_layout(row_layout)
    # The buffers are checked before the rule's refusals, as natively: out
    # against every input, scores_out against them and out.
    out_buf, scores_buf = _topk_outputs(out, scores_out, (n, topk), (index_q, weights, index_k, query_pos, key_scale))
    if num_segments > MAX_TOPOLOGY_SEGMENTS:
        raise _refuse(_SELECTION, "num_segments", "num_segments must be 0 (off) or 1..=64")
    m = _ratio(compress_ratio)
    keep = max(topk - num_segments, 0)
    f0, f1 = _forced(force_first, force_last, keep)
    pool = _pool(score_pool, num_segments)
    lse_scale = _score_type(score_type, sm_scale, pool, q.shape[2])
    rows = np.full((n, topk), -1, dtype=np.int64)
    chosen_scores = np.full((n, topk), np.nan)
    for i in range(n):
        length = visible(int(pos[i]), m, t)
        scores = _indexer_row(q[i], w[i], k[:length], c[:length], relu)
        if pool > 1:
            scores = pool_scores(scores, pool, score_type, lse_scale)
        order = _members(scores, keep, f0, f1)
        rows[i, : len(order)] = order
        if num_segments:
            row = rows[i : i + 1].astype(np.int32)
            scatter_topology_witnesses(row, np.array([length], np.int32), num_segments)
            rows[i] = row[0]
        if ascending:
            members = np.sort(rows[i][rows[i] >= 0])
            rows[i] = -1
            rows[i, : len(members)] = members
        valid = rows[i] >= 0
        chosen_scores[i, valid] = scores[rows[i, valid]]
    if scores_buf is not None:
        scores_buf[...] = chosen_scores
    return _deliver(rows, out_buf)


def _members(scores: np.ndarray, keep: int, f0: int, f1: int) -> np.ndarray:
    """A row's members in rank order: every position when the ``keep``
    budget holds them all, else the ``f0`` first and ``f1`` last positions
    and the best ``keep - f0 - f1`` of the positions between them."""
    length = len(scores)
    if length <= keep or f0 + f1 == 0:
        return _rank_order(scores)[:keep]
    middle = np.arange(f0, length - f1)
    best = middle[_rank_order(scores[middle])[: keep - f0 - f1]]
    members = np.concatenate([np.arange(f0), best, np.arange(length - f1, length)])
    return members[_rank_order(scores[members])]


def _pool(score_pool: Any, num_segments: int) -> int:
    """``score_pool`` checked: at least 1, and 1 with witnesses."""
    pool = _count("score_pool", score_pool)
    if pool < 1:
        raise _refuse(_SELECTION, "score_pool", "score_pool=0: a block holds at least one entry")
    if pool > 1 and num_segments:
        raise _refuse(_SELECTION, "score_pool", "score_pool with num_segments: witnesses cover positions")
    return pool


def _score_type(score_type: Any, sm_scale: Any, pool: int, d: int) -> float:
    """``score_type`` and ``sm_scale`` checked: the lse pool's scale (the
    float32 value of ``sm_scale``, default ``1 / sqrt(d)``, as natively read),
    1.0 for the max pool (which takes no scale)."""
    if score_type not in ("max", "lse"):
        raise _refuse(_SELECTION, "score_type", f"score_type must be 'max' or 'lse', got {score_type!r}")
    if score_type == "max":
        if sm_scale is not None:
            raise _refuse(_SELECTION, "sm_scale", f"sm_scale={sm_scale} with score_type='max': lse only")
        return 1.0
    if pool < 2:
        raise _refuse(_SELECTION, "score_type", f"score_type='lse' with score_pool={pool}: needs a pool (>= 2)")
    with np.errstate(over="ignore"):  # a scale past float32's range is refused below, as natively
        scale = float(np.float32(1.0 / np.sqrt(d) if sm_scale is None else sm_scale))
    if not (np.isfinite(scale) and scale > 0):
        raise _refuse(_SELECTION, "sm_scale", f"sm_scale must be finite and above 0, got {sm_scale}")
    return scale


def _activation(activation: Any) -> bool:
    """``activation`` checked: True for "relu", False for "none"."""
    if activation not in ("relu", "none"):
        raise _refuse(_SELECTION, "activation", f"activation must be 'relu' or 'none', got {activation!r}")
    return activation == "relu"


def _row_layout(row_layout: Any) -> bool:
    """``row_layout`` checked: True for "ascending", False for "rank"."""
    if row_layout not in ("rank", "ascending"):
        raise _refuse(_SELECTION, "row_layout", f"row_layout must be 'rank' or 'ascending', got {row_layout!r}")
    return row_layout == "ascending"


def _forced(force_first: Any, force_last: Any, budget: int) -> tuple:
    """``(force_first, force_last)`` checked against the budget ``topk -
    num_segments``: their sum must fit it."""
    f0, f1 = _count("force_first", force_first), _count("force_last", force_last)
    if f0 + f1 > budget:
        arg = "force_first" if f0 > budget else "force_last"
        raise _refuse(_SELECTION, arg, f"force_first={f0} + force_last={f1} do not fit the budget {budget}")
    return f0, f1


def visible(pos: int, compress_ratio: int, n_keys: int) -> int:
    """Keys a query at token ``pos`` sees of ``n_keys``: the entries its
    tokens have completed, ``(pos + 1) // compress_ratio`` (entry ``w`` is
    written when token ``(w + 1) * m - 1`` arrives), clipped to the keys."""
    return min((pos + 1) // compress_ratio, n_keys)


def _ratio(compress_ratio: Any) -> int:
    """``compress_ratio`` checked: tokens per key, at least 1."""
    m = _count("compress_ratio", compress_ratio)
    if m < 1:
        raise _refuse(_SELECTION, "compress_ratio", "compress_ratio=0: a key stands for at least one token")
    return m


def _topk_outputs(out: Any, scores_out: Any, shape: tuple, inputs: tuple) -> tuple:
    """A top-k call's ``out`` (int32) and ``scores_out`` (float32) of
    ``shape``, checked against the ``inputs`` and each other, or None each."""
    out_buf = _output(out, shape, _SELECTION, inputs=inputs)
    scores_buf = _out_buffer(scores_out, "scores_out", shape, _SELECTION, np.float32, inputs + (out,))
    return out_buf, scores_buf


def _indexer_inputs(
    index_q: Any,
    weights: Any,
    index_k: Any,
    query_pos: Any,
    key_scale: Any,
    key_format: Optional[str],
    query_format: Optional[str],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(q, w, k, c, pos)`` decoded (float64) and checked: ``q [n, h, d]``,
    ``w [n, h]``, ``k [t, d]``, ``c [t]`` (ones when None), ``pos [n]``."""
    q = decode(index_q, query_format, "query_format", name="index_q")
    k = decode(index_k, key_format, "key_format", name="index_k")
    if q.ndim != 3:
        raise _refuse(_SELECTION, "index_q", f"index_q must be 3-D, got shape {q.shape}")
    if k.ndim != 2:
        raise _refuse(_SELECTION, "index_k", f"index_k must be 2-D, got shape {k.shape}")
    n, h, d = q.shape
    if k.shape[1] != d:
        raise _refuse(_SELECTION, "index_q", f"index_q has d={d} but index_k has d={k.shape[1]}")
    w = _weights(weights, n, h)
    t = k.shape[0]
    c = np.ones(t) if key_scale is None else _key_scale(key_scale, t)
    pos = _query_positions(query_pos, n)
    return q, w, k, c, pos


def _weights(weights: Any, n: int, h: int) -> np.ndarray:
    """``weights`` checked ``[n, h]``; None (no weights) is every head's 1."""
    if weights is None:
        return np.ones((n, h))
    w = _float_array("weights", weights, None, _SELECTION)
    _axes("weights", w.shape, [("n_queries", n), ("H", h)])
    return w


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
    q = decode(index_q, query_format, "query_format", name="index_q")
    if q.ndim != 3:
        raise _refuse(_SELECTION, "index_q", f"index_q must be 3-D, got shape {q.shape}")
    n, h, d = q.shape
    _weights(weights, n, h)
    return n, h, d


def head_sum_scores(q: np.ndarray, w: np.ndarray, k: np.ndarray, relu: bool = True) -> np.ndarray:
    """``sum_h w_h * relu(q_h . k_t)`` (``relu=False``: activation none,
    ``sum_h w_h * (q_h . k_t)``) in float64 for each key row of ``k``
    (``q [h, d]``, ``w [h]``, ``k [m, d]``, decoded), a NaN dot product kept
    NaN. Elementwise products and sums in one fixed order per key, not BLAS:
    a BLAS product may round equal operands differently in different columns
    (OpenBLAS's float64 kernels on an AVX-512 Xeon do), which would split the
    exact ties the rule orders by position. Shared with
    :func:`kvselect.checking.check_indexer_topk`'s float64 re-score."""
    h, d = q.shape
    step = max(1, (1 << 21) // max(1, h * d))
    out = np.empty(len(k))
    with np.errstate(invalid="ignore", over="ignore"):
        for a in range(0, len(k), step):
            dots = (q[:, None, :] * k[None, a : a + step, :]).sum(axis=2)  # [h, step]
            act = np.where(np.isnan(dots), np.nan, np.maximum(dots, 0.0)) if relu else dots
            out[a : a + step] = (w[:, None] * act).sum(axis=0)
    return out


def _indexer_row(q: np.ndarray, w: np.ndarray, k: np.ndarray, c: np.ndarray, relu: bool = True) -> np.ndarray:
    """One query's scores (float64) of the keys ``k``: ``c_t *``
    :func:`head_sum_scores`."""
    if not len(k):
        return np.zeros(0)
    with np.errstate(invalid="ignore", over="ignore"):
        return head_sum_scores(q, w, k, relu) * c


def indexer_scores(
    index_q: Any,
    weights: Any,
    index_k: Any,
    query_pos: Any,
    *,
    key_scale: Any = None,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    compress_ratio: int = 1,
    activation: str = "relu",
    out: Any = None,
) -> np.ndarray:
    """Every query's score of every key it sees, float32 ``[n_queries,
    n_keys]``, NaN past its context (computed in float64, rounded once)."""
    args = _indexer_inputs(index_q, weights, index_k, query_pos, key_scale, key_format, query_format)
    inputs = (index_q, weights, index_k, query_pos, key_scale)
    relu = _activation(activation)
    return _deliver(
        _indexer_matrix(*args, False, _ratio(compress_ratio), relu),
        _output(out, (len(args[0]), len(args[2])), _SELECTION, np.float32, inputs),
    )


def indexer_magnitudes(
    index_q: Any,
    weights: Any,
    index_k: Any,
    query_pos: Any,
    *,
    key_scale: Any = None,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    compress_ratio: int = 1,
    out: Any = None,
) -> np.ndarray:
    """Each :func:`indexer_scores` entry's error scale ``|c_t| * sum_h |w_h|
    * sum_i |q_hi * k_ti|``, float32, NaN past each context."""
    args = _indexer_inputs(index_q, weights, index_k, query_pos, key_scale, key_format, query_format)
    inputs = (index_q, weights, index_k, query_pos, key_scale)
    return _deliver(
        _indexer_matrix(*args, True, _ratio(compress_ratio)),
        _output(out, (len(args[0]), len(args[2])), _SELECTION, np.float32, inputs),
    )


def _indexer_matrix(
    q: np.ndarray,
    w: np.ndarray,
    k: np.ndarray,
    c: np.ndarray,
    pos: np.ndarray,
    magnitudes: bool,
    m: int,
    relu: bool = True,
) -> np.ndarray:
    if magnitudes:  # the ReLU is the identity on the absolute values
        q, w, k, c = np.abs(q), np.abs(w), np.abs(k), np.abs(c)
    out = np.full((len(q), len(k)), np.nan)
    for i in range(len(q)):
        length = visible(int(pos[i]), m, len(k))
        out[i, :length] = _indexer_row(q[i], w[i], k[:length], c[:length], relu)
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
    compress_ratio: int = 1,
    activation: str = "relu",
    force_first: int = 0,
    force_last: int = 0,
    row_layout: str = "rank",
    score_pool: int = 1,
    score_type: str = "max",
    sm_scale: Optional[float] = None,
    out: Any = None,
    scores_out: Any = None,
) -> np.ndarray:
    """:func:`indexer_topk` of each query over its own sequence's keys, rows
    ``cu_seqlens[s] .. cu_seqlens[s + 1]`` for ``s = seq_ids[i]``."""
    n = _indexer_queries(index_q, weights, query_format)[0]
    _ratio(compress_ratio)
    k = decode(index_k, key_format, "key_format", name="index_k")
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
    q = np.asarray(index_q)
    w = np.ones(q.shape[:2]) if weights is None else np.asarray(weights)
    _activation(activation), _row_layout(row_layout)
    _forced(force_first, force_last, max(_count("topk", topk) - _count("num_segments", num_segments), 0))
    _pool(score_pool, _count("num_segments", num_segments))
    _score_type(score_type, sm_scale, _count("score_pool", score_pool), q.shape[2])

    def one(i: int, s_row: np.ndarray) -> np.ndarray:
        k0, k1 = int(cu[sid[i]]), int(cu[sid[i] + 1])
        return indexer_topk(
            q[i : i + 1],
            w[i : i + 1],
            k[k0:k1],
            pos[i : i + 1],
            topk,
            key_scale=None if c is None else c[k0:k1],
            key_format=key_format,
            query_format=query_format,
            num_segments=num_segments,
            compress_ratio=compress_ratio,
            scores_out=s_row,
            activation=activation,
            force_first=force_first,
            force_last=force_last,
            row_layout=row_layout,
            score_pool=score_pool,
            score_type=score_type,
            sm_scale=sm_scale,
        )

    return _query_by_query(
        len(sid),
        _count("topk", topk),
        one,
        out,
        scores_out,
        (index_q, weights, index_k, cu_seqlens, seq_ids, query_pos, key_scale),
    )


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


def _gather_pages(
    kv_cache: Any, block_table: np.ndarray, s: int, length: int, page_layout: str, key_format: Optional[str]
):
    """Sequence ``s``'s first ``length`` keys (and scales) from its pages."""
    cache = np.asarray(kv_cache)
    if page_layout == "fp8_scaled":
        n_blocks, bs, width = cache.shape[0], cache.shape[1], cache.shape[-1]
        d = width - 4
        pages = np.ascontiguousarray(cache).reshape(n_blocks, bs * width)
        keys = fp8_e4m3fn_table()[pages[:, : bs * d].reshape(n_blocks, bs, d)]
        scales = pages[:, bs * d :].copy().view(np.float32).astype(np.float64).reshape(n_blocks, bs)
    else:
        bs = cache.shape[1]
        keys, scales = decode(cache, key_format, "key_format", name="kv_cache"), None
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
    compress_ratio: int = 1,
    activation: str = "relu",
    force_first: int = 0,
    force_last: int = 0,
    row_layout: str = "rank",
    score_pool: int = 1,
    score_type: str = "max",
    sm_scale: Optional[float] = None,
    out: Any = None,
    scores_out: Any = None,
) -> np.ndarray:
    """:func:`indexer_topk` of each query over its sequence's keys gathered
    from the pages its block-table row names (only the first
    ``ceil(seq_len / block_size)`` entries are read)."""
    n = _indexer_queries(index_q, weights, query_format)[0]
    _ratio(compress_ratio)
    if page_layout not in ("dense", "fp8_scaled"):
        raise _refuse(_SELECTION, "page_layout", f"page_layout must be 'dense' or 'fp8_scaled', got {page_layout!r}")
    _readable_pages(_native_pages(kv_cache))
    table = _index_array("block_table", block_table, 2, _SELECTION)
    lens = _index_array("seq_lens", seq_lens, 1, _SELECTION, positions=True)
    _axes("block_table", table.shape, [("n_seqs", len(lens)), ("max_blocks", table.shape[1])])
    sid = _along("seq_ids", seq_ids, ("n_queries", n))
    pos = _query_positions(query_pos, n)
    if (sid >= len(lens)).any():
        raise _refuse(_SELECTION, "seq_ids", "a sequence id past seq_lens")
    q = np.asarray(index_q)
    w = np.ones(q.shape[:2]) if weights is None else np.asarray(weights)
    _activation(activation), _row_layout(row_layout)
    _forced(force_first, force_last, max(_count("topk", topk) - _count("num_segments", num_segments), 0))
    _pool(score_pool, _count("num_segments", num_segments))
    _score_type(score_type, sm_scale, _count("score_pool", score_pool), q.shape[2])

    def one(i: int, s_row: np.ndarray) -> np.ndarray:
        s = int(sid[i])
        k, c = _gather_pages(kv_cache, table, s, int(lens[s]), page_layout, key_format)
        return indexer_topk(
            q[i : i + 1],
            w[i : i + 1],
            k,
            pos[i : i + 1],
            topk,
            key_scale=c,
            query_format=query_format,
            num_segments=num_segments,
            compress_ratio=compress_ratio,
            scores_out=s_row,
            activation=activation,
            force_first=force_first,
            force_last=force_last,
            row_layout=row_layout,
            score_pool=score_pool,
            score_type=score_type,
            sm_scale=sm_scale,
        )

    return _query_by_query(
        len(sid),
        _count("topk", topk),
        one,
        out,
        scores_out,
        (index_q, weights, kv_cache, block_table, seq_lens, seq_ids, query_pos),
    )


# ==========================================================================
# The score pool (issue 43, item 2): blocks of entries scored as one
# --------------------------------------------------------------------------
# Written from NVIDIA/cudnn-frontend#838's table (MiniMax's MSA: "score_pool
# 128 = the block max-pool, 16 per group, own block"), kvselect's MiniMax-M3
# block rule (src/block_sparse/mod.rs: a block's score is the max over its
# causally visible positions, NaN absent, a block of NaN -inf; the first
# init and last local blocks forced inside the budget; ties to the lower id)
# and SGLang 0.5.23's MiniMax-M3 selector (minimax_sparse/*/
# flash_with_topk_idx.py, flash_prefill_with_topk_index(score_type=...)):
# score_type="lse" scores a block by the log-sum-exp of its positions'
# scaled scores (base 2 there, sm_scale = d**-0.5 by default: the same order
# as the natural log here), a NaN making the block -inf.
#
# - The L visible entries form ceil(L / P) blocks, block b covering entries
#   b*P .. min((b + 1) * P, L): the last, partial block is scored over the
#   entries it holds (the query's own block, as MiniMax's).
# - The rows hold block ids; force_first / force_last count blocks.
# ==========================================================================


def pool_scores(scores: np.ndarray, score_pool: int, score_type: str = "max", sm_scale: float = 1.0) -> np.ndarray:
    """A row's entry scores (float64) pooled into block scores: ``max``
    (NaN absent, a block of NaN ``-inf``) or ``lse`` (``log sum exp(sm_scale
    * s)``, a NaN ``-inf``), over blocks of ``score_pool`` entries, the last
    one partial."""
    n = -(-len(scores) // score_pool)
    out = np.full(n, -np.inf)
    for b in range(n):
        block = scores[b * score_pool : (b + 1) * score_pool]
        if score_type == "max":
            finite = block[~np.isnan(block)]
            out[b] = finite.max() if len(finite) else -np.inf
        else:
            z = block * sm_scale
            if np.isnan(z).any():
                continue
            top = z.max()
            with np.errstate(invalid="ignore", over="ignore"):
                out[b] = top if np.isinf(top) else top + np.log(np.exp(z - top).sum())
            if np.isnan(out[b]):
                out[b] = -np.inf
    return out


def indexer_topk_pooled(
    index_q: Any,
    weights: Any,
    index_k: Any,
    query_pos: Any,
    topk: int,
    *,
    score_pool: int,
    score_type: str = "max",
    sm_scale: Optional[float] = None,
    key_scale: Any = None,
    compress_ratio: int = 1,
    activation: str = "relu",
    force_first: int = 0,
    force_last: int = 0,
    row_layout: str = "rank",
) -> np.ndarray:
    """The indexer with a score pool (see the section notes): each row the
    ``topk`` best blocks of ``score_pool`` visible entries, int32 block ids.
    ``sm_scale`` (``lse`` only) defaults to ``d**-0.5``."""
    q, w, k, c, pos = _indexer_inputs(index_q, weights, index_k, query_pos, key_scale, None, None)
    n, t = len(q), len(k)
    topk = _count("topk", topk)
    pool = _count("score_pool", score_pool)
    if pool < 1:
        raise _refuse(_SELECTION, "score_pool", "score_pool must be at least 1")
    if score_type not in ("max", "lse"):
        raise _refuse(_SELECTION, "score_type", f"score_type must be 'max' or 'lse', got {score_type!r}")
    relu, ascending = _activation(activation), _row_layout(row_layout)
    f0, f1 = _forced(force_first, force_last, topk)
    m = _ratio(compress_ratio)
    scale = q.shape[2] ** -0.5 if sm_scale is None else float(sm_scale)
    rows = np.full((n, topk), -1, dtype=np.int64)
    for i in range(n):
        length = visible(int(pos[i]), m, t)
        blocks = pool_scores(_indexer_row(q[i], w[i], k[:length], c[:length], relu), pool, score_type, scale)
        order = _members(blocks, topk, f0, f1)
        if ascending:
            order = np.sort(order)
        rows[i, : len(order)] = order
    return rows.astype(np.int32)
