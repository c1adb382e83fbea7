"""Token top-k cases: the inputs that broke indexer top-k kernels, each with its exact answer."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Sequence, Tuple

import numpy as np

from kvselect.testing.cases._case import (
    Case,
    _as,
    _exact_scores,
    _offset_operands,
    _rank,
    _topk_case,
    _value_operands,
    tail_lengths,
)
from kvselect.testing.cases.semantics import compressed_entry_boundary, fp8_per_key_scales, relu_negative_dots


def low_contrast(
    seed: int = 0,
    *,
    n_keys: int = 1029,
    topk: int = 64,
    spread: int = 8,
    heads: int = 4,
    dim: int = 16,
    key_dtype: str = "float32",
    scale_exp: int = 0,
) -> Case:
    """A long low-contrast row: every score within ``spread`` ULPs of
    ``1.3125 * 2^23`` (so of the threshold), all in one coarse radix bucket, far more
    of them than ``topk``.

    The bug: a radix / histogram select that gathers the threshold bucket's
    candidates into a fixed-size buffer and silently truncates it drops
    candidates — vllm-project/vllm#51782 (``persistent_topk``, every value
    in one coarse bin, k = 2048, kv_len > 16384) and sgl-project/sglang#36807
    (``fast_topk_v2``, the threshold bucket over its 4096-entry buffer). The
    dropped winners differ from the kept losers by a few ULPs: a ``1e-4``
    tolerance misses them. ``n_keys = 262149, topk = 2048`` is the
    engines' regime (``long=True`` in :func:`all_topk_cases`).

    Parameters
    ----------
    seed : int
        The NumPy Generator's seed.
    n_keys : int
        The keys (the longest context).
    topk : int
        The ``k`` of the top-k.
    spread : int
        The largest offset from the base score, in ULPs.
    heads : int
        Index heads ``H`` (a power of two); KV heads for blocks.
    dim : int
        The index dimension ``d``.
    key_dtype : str
        ``"float32"``, ``"bfloat16"`` or ``"float8_e4m3fn"`` (ml_dtypes arrays).
    scale_exp : int
        The scores are multiplied by ``2^scale_exp`` (through the weights or queries).

    Returns
    -------
    Case
        A ``topk`` case, ``expected`` from the exact rule.
    """
    rng = np.random.default_rng(seed)
    offsets = rng.integers(-spread, spread + 1, n_keys).astype(np.float64)
    q, w, k = _offset_operands(rng, offsets, heads, dim, key_dtype)
    return _topk_case(
        f"low_contrast-{n_keys}-{key_dtype}",
        low_contrast.__doc__ or "",
        rng,
        q,
        w,
        k,
        tail_lengths(n_keys),
        topk,
        scale_exp,
        key_dtype,
        meta={"ulps": spread, "threshold_ulp": 1.0 * 2.0**scale_exp},
    )


def ties_at_threshold(
    seed: int = 0,
    *,
    n_keys: int = 997,
    topk: int = 64,
    n_above: int = 16,
    n_tied: int = 200,
    heads: int = 4,
    dim: int = 16,
    key_dtype: str = "float32",
    scale_exp: int = 0,
) -> Case:
    """More exact ties at the threshold than ``topk``: ``n_above`` distinct
    winners, then ``n_tied > topk`` keys of exactly the same score, spread
    over the row (the rest lower).

    The bug: a kernel that takes "everything at the threshold" (``>=``)
    returns too many; one that breaks ties by arrival order in a fixed
    buffer loses count (``wrong_count``, duplicates); a radix select whose
    threshold bucket is all ties overflows its candidate buffer
    (vllm-project/vllm#51782, sgl-project/sglang#36807). Any ``topk -
    n_above`` of the tied keys is right.

    Parameters
    ----------
    seed : int
        The NumPy Generator's seed.
    n_keys : int
        The keys (the longest context).
    topk : int
        The ``k`` of the top-k.
    n_above : int
        Distinct winners above the tied threshold.
    n_tied : int
        Keys tied at the threshold (more than ``topk``).
    heads : int
        Index heads ``H`` (a power of two); KV heads for blocks.
    dim : int
        The index dimension ``d``.
    key_dtype : str
        ``"float32"``, ``"bfloat16"`` or ``"float8_e4m3fn"`` (ml_dtypes arrays).
    scale_exp : int
        The scores are multiplied by ``2^scale_exp`` (through the weights or queries).

    Returns
    -------
    Case
        A ``topk`` case, ``expected`` from the exact rule.
    """
    rng = np.random.default_rng(seed)
    assert n_tied > topk > n_above
    offsets = rng.integers(-200, -1, n_keys).astype(np.float64)  # the rest: below
    where = rng.permutation(n_keys)
    offsets[where[:n_above]] = 10 + rng.permutation(200)[:n_above]
    offsets[where[n_above : n_above + n_tied]] = 0.0
    q, w, k = _offset_operands(rng, offsets, heads, dim, key_dtype)
    lens = np.array([n_keys if n_keys % 8 else n_keys - 1], dtype=np.int64)
    return _topk_case(
        f"ties_at_threshold-{key_dtype}",
        ties_at_threshold.__doc__ or "",
        rng,
        q,
        w,
        k,
        lens,
        topk,
        scale_exp,
        key_dtype,
        meta={"n_above": n_above, "ties": n_tied},
    )


def signed_zeros(
    seed: int = 0,
    *,
    n_keys: int = 515,
    topk: int = 64,
    n_positive: int = 20,
    heads: int = 4,
    dim: int = 16,
    scale_exp: int = 0,
) -> Case:
    """Fewer positive scores than ``topk``, then ``+0.0`` and ``-0.0`` (a
    negative per-key scale times the ReLU's zero), then negative scores:
    the threshold is zero, its ties split between ``+0`` and ``-0``.

    The bug: ``-0.0 == +0.0`` in the rule, but their bits differ (``0x80000000``
    vs ``0``) — a radix select on order-mapped bits puts them in different
    top-byte buckets and miscounts the threshold's; a kernel that masks
    "score > 0" (taking the ReLU's zeros for masked keys) returns fewer than
    ``min(topk, L)`` (``wrong_count``).

    Parameters
    ----------
    seed : int
        The NumPy Generator's seed.
    n_keys : int
        The keys (the longest context).
    topk : int
        The ``k`` of the top-k.
    n_positive : int
        Positive scores (fewer than ``topk``).
    heads : int
        Index heads ``H`` (a power of two); KV heads for blocks.
    dim : int
        The index dimension ``d``.
    scale_exp : int
        The scores are multiplied by ``2^scale_exp`` (through the weights or queries).

    Returns
    -------
    Case
        A ``topk`` case, ``expected`` from the exact rule.
    """
    rng = np.random.default_rng(seed)
    values = np.zeros(n_keys)
    where = rng.permutation(n_keys)
    values[where[:n_positive]] = rng.integers(1, 100, n_positive)
    neg = where[n_positive : n_positive + 40]
    values[neg] = rng.integers(1, 100, len(neg))
    scale = np.where(rng.random(n_keys) < 0.5, -1.0, 1.0)
    scale[where[:n_positive]] = 1.0
    scale[neg] = -1.0  # strictly negative scores
    q, w, k = _value_operands(rng, values, heads, dim)
    lens = np.array([n_keys if n_keys % 8 else n_keys - 1], dtype=np.int64)
    return _topk_case(
        "signed_zeros",
        signed_zeros.__doc__ or "",
        rng,
        q,
        w,
        k,
        lens,
        topk,
        scale_exp,
        key_scale=scale,
        meta={"n_positive": n_positive},
    )


def all_zero(
    seed: int = 0, *, n_keys: int = 301, topk: int = 64, heads: int = 4, dim: int = 16, scale_exp: int = 0
) -> Case:
    """Every score zero after the ReLU (every ``q_h . k_t <= 0``): any
    ``min(topk, L)`` distinct positions are right, so the rows are
    **vacuous** — ``case.check`` has ``fail_vacuous=False`` and the report
    counts them; only structural faults can fail.

    The bug: a kernel that treats a zero score as a masked key returns
    ``-1`` rows (``wrong_count``), or one whose threshold search never
    leaves the zero bucket repeats a position (``duplicate``).

    Parameters
    ----------
    seed : int
        The NumPy Generator's seed.
    n_keys : int
        The keys (the longest context).
    topk : int
        The ``k`` of the top-k.
    heads : int
        Index heads ``H`` (a power of two); KV heads for blocks.
    dim : int
        The index dimension ``d``.
    scale_exp : int
        The scores are multiplied by ``2^scale_exp`` (through the weights or queries).

    Returns
    -------
    Case
        A ``topk`` case, ``expected`` from the exact rule.
    """
    rng = np.random.default_rng(seed)
    values = rng.integers(0, 50, n_keys).astype(np.float64)
    q, w, k = _value_operands(rng, values, heads, dim, sign=-1.0)
    return _topk_case(
        "all_zero",
        all_zero.__doc__ or "",
        rng,
        q,
        w,
        k,
        tail_lengths(n_keys, 3),
        topk,
        scale_exp,
        check={"rtol": 0.0, "atol": 0.0, "fail_vacuous": False},
    )


def short_contexts(
    seed: int = 0, *, topk: int = 64, heads: int = 4, dim: int = 16, packed: bool = False, scale_exp: int = 0
) -> Case:
    """Ragged and short contexts: ``L = 1``, ``L < topk``, ``L = topk``,
    ``L = topk + 1``, ``L`` long (and with ``packed=True``, a batch of
    sequences of those lengths, one of them empty, ``L = 0``).

    The bug: a kernel that always writes ``topk`` entries writes positions
    at or past ``L`` (``not_causal``) or garbage; one that pads in the
    middle leaves a ``padding_hole``; at ``L = topk + 1`` an off-by-one
    keeps the last key; an empty sequence reads its neighbour's keys.

    Parameters
    ----------
    seed : int
        The NumPy Generator's seed.
    topk : int
        The ``k`` of the top-k.
    heads : int
        Index heads ``H`` (a power of two); KV heads for blocks.
    dim : int
        The index dimension ``d``.
    packed : bool
        A packed batch (``cu_seqlens``, ``seq_ids``) with an empty sequence.
    scale_exp : int
        The scores are multiplied by ``2^scale_exp`` (through the weights or queries).

    Returns
    -------
    Case
        A ``topk`` case, ``expected`` from the exact rule.
    """
    rng = np.random.default_rng(seed)
    lengths = np.array([1, topk - 3, topk, topk + 1, 2 * topk + 5], dtype=np.int64)
    if not packed:
        T = int(lengths.max())
        offsets = rng.integers(-200, 201, T).astype(np.float64)
        q, w, k = _offset_operands(rng, offsets, heads, dim, "float32")
        return _topk_case(
            "short_contexts",
            short_contexts.__doc__ or "",
            rng,
            q,
            w,
            k,
            lengths,
            topk,
            scale_exp,
            meta={"lengths": lengths.tolist()},
        )
    seqs = np.array([topk - 3, 0, topk, topk + 1, 2 * topk + 5], dtype=np.int64)
    cu = np.concatenate([[0], np.cumsum(seqs)]).astype(np.int64)
    offsets = rng.integers(-200, 201, int(cu[-1])).astype(np.float64)
    q1, w1, k = _offset_operands(rng, offsets, heads, dim, "float32")
    seq_ids = np.repeat(np.arange(len(seqs)), 2)
    pos = np.array([[max(L - 1, 0), max(L // 2, 0)] for L in seqs]).reshape(-1).astype(np.int64)
    lens = np.minimum(pos + 1, seqs[seq_ids])
    n = len(pos)
    q = np.broadcast_to(q1, (n,) + q1.shape).copy()
    w = np.broadcast_to(w1 * 2.0**scale_exp, (n, heads)).copy()
    T = int(seqs.max())
    scores = np.full((n, T), np.nan)
    for i in range(n):
        lo = int(cu[seq_ids[i]])
        scores[i, : seqs[seq_ids[i]]] = _exact_scores(
            q[i : i + 1], w[i : i + 1], k[lo : cu[seq_ids[i] + 1]], None, np.array([seqs[seq_ids[i]]])
        )[0]
        scores[i, lens[i] :] = np.nan
    inputs = {
        "index_q": q.astype(np.float32),
        "weights": w.astype(np.float32),
        "index_k": k.astype(np.float32),
        "query_pos": pos,
        "topk": topk,
        "cu_seqlens": cu,
        "seq_ids": seq_ids.astype(np.int64),
    }
    return Case(
        f"short_contexts-packed-x2^{scale_exp}",
        "topk",
        short_contexts.__doc__ or "",
        inputs,
        _rank(scores, lens, topk),
        {"rtol": 0.0, "atol": 0.0},
        scores,
        lens,
        {"form": "packed", "scale_exp": scale_exp, "lengths": lens.tolist()},
    )


def fp8_extremes(
    seed: int = 0, *, n_keys: int = 613, topk: int = 64, heads: int = 4, dim: int = 16, scale_exp: int = 0
) -> Case:
    """float8_e4m3fn keys at the format's extremes: a few winners at 256..448
    (448 the largest finite value), ``-448`` (ReLU'd to zero), and the
    threshold among **subnormals** (``j * 2^-9``, ``j = 1..7``) and the
    smallest normals, many tied; a per-tensor ``key_scale``.

    The bug: a decode that flushes subnormals to zero, or mis-decodes the
    top codes (``0x7e`` = 448; ``0x7f`` is NaN in e4m3fn, not inf —
    :func:`non_finite` has it), ranks the threshold's keys wrongly.

    Parameters
    ----------
    seed : int
        The NumPy Generator's seed.
    n_keys : int
        The keys (the longest context).
    topk : int
        The ``k`` of the top-k.
    heads : int
        Index heads ``H`` (a power of two); KV heads for blocks.
    dim : int
        The index dimension ``d``.
    scale_exp : int
        The scores are multiplied by ``2^scale_exp`` (through the weights or queries).

    Returns
    -------
    Case
        A ``topk`` case, ``expected`` from the exact rule.
    """
    rng = np.random.default_rng(seed)
    n_large = topk // 4
    values = np.zeros(n_keys)
    where = rng.permutation(n_keys)
    values[where[:n_large]] = 256.0 + 32.0 * rng.integers(0, 7, n_large)
    values[where[n_large]] = 448.0
    values[where[n_large + 1 : n_large + 20]] = -448.0
    rest = where[n_large + 20 :]
    tiny = np.concatenate([np.arange(1, 8) * 2.0**-9, 2.0**-6 * (1 + np.arange(8) / 8)])
    values[rest] = tiny[rng.integers(0, 7, len(rest))]  # subnormals, but for a few normals
    values[rest[: topk // 4]] = tiny[rng.integers(7, len(tiny), topk // 4)]
    q, w, k = _value_operands(rng, values, heads, dim)
    k[:, 1:] = 0.0  # every byte of the key row an fp8 value (the rest unread)
    lens = np.array([n_keys if n_keys % 8 else n_keys - 1], dtype=np.int64)
    return _topk_case(
        "fp8_extremes",
        fp8_extremes.__doc__ or "",
        rng,
        q,
        w,
        k,
        lens,
        topk,
        scale_exp,
        "float8_e4m3fn",
        key_scale=np.float32(2.0**-4),
        meta={"subnormal_threshold": True},
    )


def bf16_rounded_ties(
    seed: int = 0, *, n_keys: int = 1021, topk: int = 64, heads: int = 4, dim: int = 16, scale_exp: int = 0
) -> Case:
    """bfloat16 keys made by rounding distinct float32 values in ``[1, 2)``:
    only 128 values survive, so about 8 keys share each score and the
    threshold falls inside a group of exact ties.

    The bug: many equal values share one radix bucket (the mechanism of
    vllm-project/vllm#51782 and sgl-project/sglang#36807), and tie handling
    that assumes distinct scores (a ``>=`` pass, an arrival-order buffer)
    returns duplicates or too many.

    Parameters
    ----------
    seed : int
        The NumPy Generator's seed.
    n_keys : int
        The keys (the longest context).
    topk : int
        The ``k`` of the top-k.
    heads : int
        Index heads ``H`` (a power of two); KV heads for blocks.
    dim : int
        The index dimension ``d``.
    scale_exp : int
        The scores are multiplied by ``2^scale_exp`` (through the weights or queries).

    Returns
    -------
    Case
        A ``topk`` case, ``expected`` from the exact rule.
    """
    rng = np.random.default_rng(seed)
    import ml_dtypes

    x = rng.uniform(1.0, 2.0, n_keys).astype(np.float32)
    values = x.astype(ml_dtypes.bfloat16).astype(np.float64)
    q, w, k = _value_operands(rng, values, heads, dim)
    lens = tail_lengths(n_keys, 3)
    _, counts = np.unique(values, return_counts=True)
    return _topk_case(
        "bf16_rounded_ties",
        bf16_rounded_ties.__doc__ or "",
        rng,
        q,
        w,
        k,
        lens,
        topk,
        scale_exp,
        "bfloat16",
        meta={"distinct": int(len(counts)), "originals_distinct": int(len(np.unique(x)))},
    )


def paged(
    seed: int = 0,
    *,
    topk: int = 64,
    page_layout: str = "dense",
    block_size: int = 16,
    heads: int = 4,
    dim: int = 16,
    scale_exp: int = 0,
) -> Case:
    """A paged cache (as :func:`kvselect.indexer_topk_paged` reads it) with
    shuffled pages, spare pages of garbage keys, and block tables padded
    past each sequence's used entries with garbage (valid-looking page ids,
    ``-1``, ``2^31 - 1``); sequence lengths not multiples of the page size;
    low-contrast scores. ``page_layout="fp8_scaled"``: vLLM's DSA index-K
    pages (each page's fp8 bytes, then its float32 scales).

    The bug: a kernel that reads the table past ``ceil(L / block_size)``
    entries (garbage pages), assumes pages in order, or reads a page's
    scales at the wrong offset.

    Parameters
    ----------
    seed : int
        The NumPy Generator's seed.
    topk : int
        The ``k`` of the top-k.
    page_layout : str
        ``"dense"`` or ``"fp8_scaled"``.
    block_size : int
        Tokens per page.
    heads : int
        Index heads ``H`` (a power of two); KV heads for blocks.
    dim : int
        The index dimension ``d``.
    scale_exp : int
        The scores are multiplied by ``2^scale_exp`` (through the weights or queries).

    Returns
    -------
    Case
        A ``topk`` case, ``expected`` from the exact rule.
    """
    rng = np.random.default_rng(seed)
    seqs = np.array([3 * block_size + 5, 7 * block_size + 3, 5 * block_size + 7], dtype=np.int64)
    offsets = rng.integers(-12, 13, int(seqs.sum())).astype(np.float64)
    q1, w1, k = _offset_operands(rng, offsets, heads, dim, "float8_e4m3fn")
    need = -(-seqs // block_size)
    spare = 4
    n_pages = int(need.sum()) + spare
    page_ids = rng.permutation(n_pages)
    max_blocks = int(need.max()) + 3
    table = np.empty((len(seqs), max_blocks), dtype=np.int32)
    pages = np.zeros((n_pages, block_size, dim))
    pages[:] = rng.integers(-16, 17, pages.shape)  # spare pages: garbage keys
    start, used = 0, 0
    for s, L in enumerate(int(x) for x in seqs):
        ids = page_ids[used : used + need[s]]
        used += int(need[s])
        keys = np.zeros((need[s] * block_size, dim))
        keys[:] = rng.integers(-16, 17, keys.shape)  # past L in the last page: garbage too
        keys[:L] = k[start : start + L]
        pages[ids] = keys.reshape(-1, block_size, dim)
        table[s, : need[s]] = ids
        garbage = rng.choice([-1, 2**31 - 1, int(page_ids[-1])], max_blocks - need[s])
        table[s, need[s] :] = garbage
        start += L
    seq_ids = np.repeat(np.arange(len(seqs)), 2).astype(np.int64)
    pos = np.array([[L - 1, L // 2 + 2] for L in seqs]).reshape(-1).astype(np.int64)
    lens = np.minimum(pos + 1, seqs[seq_ids])
    n = len(pos)
    q = np.broadcast_to(q1, (n,) + q1.shape).copy()
    w = np.broadcast_to(w1 * 2.0**scale_exp, (n, heads)).copy()
    scale = 2.0**-4
    cu = np.concatenate([[0], np.cumsum(seqs)])
    scores = np.full((n, int(seqs.max())), np.nan)
    for i in range(n):
        s = seq_ids[i]
        scores[i, : seqs[s]] = _exact_scores(
            q[i : i + 1], w[i : i + 1], k[cu[s] : cu[s + 1]], scale, np.array([seqs[s]])
        )[0]
        scores[i, lens[i] :] = np.nan
    fp8 = _as(pages, "float8_e4m3fn")
    if page_layout == "fp8_scaled":
        raw = np.empty((n_pages, block_size * (dim + 4)), dtype=np.uint8)
        raw[:, : block_size * dim] = fp8.view(np.uint8).reshape(n_pages, -1)
        raw[:, block_size * dim :] = np.full((n_pages, block_size), scale, np.float32).view(np.uint8)
        cache: np.ndarray = raw.reshape(n_pages, block_size, dim + 4)
        extra: Dict[str, Any] = {"page_layout": "fp8_scaled"}
    elif page_layout == "dense":
        cache = fp8
        extra = {}
        w = w * scale  # the dense layout has no scales: fold the per-tensor one into the weights
    else:
        raise ValueError(f"page_layout must be 'dense' or 'fp8_scaled', got {page_layout!r}")
    inputs = {
        "index_q": q.astype(np.float32),
        "weights": w.astype(np.float32),
        "kv_cache": cache,
        "block_table": table,
        "seq_lens": seqs,
        "seq_ids": seq_ids,
        "query_pos": pos,
        "topk": topk,
        "index_k": None,
        **extra,
    }
    return Case(
        f"paged-{page_layout}-x2^{scale_exp}",
        "topk",
        paged.__doc__ or "",
        inputs,
        _rank(scores, lens, topk),
        {"rtol": 0.0, "atol": 0.0},
        scores,
        lens,
        {"form": "paged", "scale_exp": scale_exp, "used_pages": need.tolist()},
    )


def ik_tail_truncation(seed: int = 0, *, heads: int = 4, dim: int = 16, scale_exp: int = 0) -> Case:
    """ik_llama.cpp ``iqk_bucket_topk`` fault (a), the exact numbers of the
    report: T 4096, query position 4092 (``L = 4093``, ``L % 8 = 5``), topk
    256; 255 keys score 1.0, key 100 scores 1014/1024, tail key 4090 scores
    1010/1024, the rest below 1000/1024. The exact top-k is the 255 and key
    100.

    The bug: the last ``L % 8`` scores are bucketed by truncation while the
    rest are rounded, so the tail key just below a bucket boundary lands in
    key 100's bucket (or above it) and displaces it: key 100 dropped, 4090
    kept.

    Parameters
    ----------
    seed : int
        The NumPy Generator's seed.
    heads : int
        Index heads ``H`` (a power of two); KV heads for blocks.
    dim : int
        The index dimension ``d``.
    scale_exp : int
        The scores are multiplied by ``2^scale_exp`` (through the weights or queries).

    Returns
    -------
    Case
        A ``topk`` case, ``expected`` from the exact rule.
    """
    rng = np.random.default_rng(seed)
    T, L, topk = 4096, 4093, 256
    j = rng.integers(0, 1000, T).astype(np.float64)
    free = np.setdiff1d(np.arange(L), [100, 4090])
    ones = rng.choice(free, 255, replace=False)
    j[ones] = 1024.0
    j[100], j[4090] = 1014.0, 1010.0
    q, w, k = _value_operands(rng, j / 1024.0, heads, dim)
    return _topk_case(
        "ik_tail_truncation",
        ik_tail_truncation.__doc__ or "",
        rng,
        q,
        w,
        k,
        np.array([L], dtype=np.int64),
        topk,
        scale_exp,
        meta={"winner": 100, "tail_loser": 4090},
    )


def ik_absolute_early_out(
    seed: int = 0, *, n_keys: int = 1021, topk: int = 64, heads: int = 4, dim: int = 16, scale_exp: int = -30
) -> Case:
    """ik_llama.cpp ``iqk_bucket_topk`` fault (b): integer scores 0..999
    times ``2^scale_exp`` (default ``2^-30``: exact, ranking unchanged, but
    ``max - min < 1e-6``), the best keys away from the row's start.

    The bug: an absolute early-out ``max - min < 1e-6`` takes the row for
    flat and returns positions ``0..topk-1``.

    Parameters
    ----------
    seed : int
        The NumPy Generator's seed.
    n_keys : int
        The keys (the longest context).
    topk : int
        The ``k`` of the top-k.
    heads : int
        Index heads ``H`` (a power of two); KV heads for blocks.
    dim : int
        The index dimension ``d``.
    scale_exp : int
        The scores are multiplied by ``2^scale_exp`` (through the weights or queries).

    Returns
    -------
    Case
        A ``topk`` case, ``expected`` from the exact rule.
    """
    rng = np.random.default_rng(seed)
    j = rng.integers(0, 1000, n_keys).astype(np.float64)
    j[:topk] = rng.integers(0, 100, topk)  # the first positions lose
    q, w, k = _value_operands(rng, j, heads, dim)
    lens = tail_lengths(n_keys, 3)
    return _topk_case("ik_absolute_early_out", ik_absolute_early_out.__doc__ or "", rng, q, w, k, lens, topk, scale_exp)


def non_finite(
    seed: int = 0,
    *,
    where: str = "index_k",
    value: float = float("nan"),
    n_keys: int = 301,
    topk: int = 32,
    heads: int = 4,
    dim: int = 16,
    scale_exp: int = 0,
) -> Case:
    """A NaN or infinite operand where the rule defines the answer
    (``NaN`` scores rank last, ``+inf`` first, ``-inf`` ReLU'd to zero):
    ``where`` is ``"index_k"`` (one key component), ``"key_scale"``,
    ``"index_q"`` (one component of one head: keys with a zero there score
    NaN, ``inf * 0``), ``"weights"`` (one head) or ``"fp8_nan"`` (the
    e4m3fn NaN bytes ``0x7f`` / ``0xff`` in the keys).

    The exact scores are undefined for :func:`kvselect.testing.assert_topk`
    (it refuses non-finite operands), so ``case.assert_rows`` checks the
    rows against the case's own ``scores`` (the rule's float32 scores,
    exactly). The bug: a kernel whose max / compare treats NaN as the
    largest value (``fmax`` order, raw-bits radix) selects NaN keys, or one
    that propagates an inf into its threshold computation selects garbage.

    Parameters
    ----------
    seed : int
        The NumPy Generator's seed.
    where : str
        The non-finite operand.
    value : float
        Its value (NaN, ``inf`` or ``-inf``).
    n_keys : int
        The keys (the longest context).
    topk : int
        The ``k`` of the top-k.
    heads : int
        Index heads ``H`` (a power of two); KV heads for blocks.
    dim : int
        The index dimension ``d``.
    scale_exp : int
        The scores are multiplied by ``2^scale_exp`` (through the weights or queries).

    Returns
    -------
    Case
        A ``topk`` case, ``expected`` from the exact rule.
    """
    rng = np.random.default_rng(seed)
    values = rng.integers(1, 200, n_keys).astype(np.float64)
    q, w, k = _value_operands(rng, values, heads, dim)
    q[:, 1] = 1.0  # component 1 is read too, so non-finite keys there matter
    k[:, 1] = rng.integers(0, 3, n_keys)
    c: Any = None
    key_dtype = "float32"
    bad = rng.choice(n_keys, 5, replace=False)
    if where == "index_k":
        k[bad, 1] = value
    elif where == "key_scale":
        c = np.ones(n_keys)
        c[bad] = value
    elif where == "index_q":
        q[1, 1] = value
    elif where == "weights":  # head 2 reads component 2, non-zero on the bad keys only
        w = w.copy()
        w[2] = value
        q[2] = 0.0
        q[2, 2] = 1.0
        k[:, 2] = 0.0
        k[bad, 2] = 1.0
        topk = 4  # inf * 0 is NaN elsewhere: the answer is 4 of the 5 bad keys
    elif where == "fp8_nan":
        key_dtype = "float8_e4m3fn"
        k[:, 1:] = np.clip(k[:, 1:], -16, 16)
        k[bad, 1] = np.nan
        import ml_dtypes

        k[:, 0] = k[:, 0].astype(np.float32).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
    else:
        raise ValueError(f"where must be index_k, key_scale, index_q, weights or fp8_nan, got {where!r}")
    lens = np.array([n_keys if n_keys % 8 else n_keys - 1], dtype=np.int64)
    case = _topk_case(
        f"non_finite-{where}-{value}",
        non_finite.__doc__ or "",
        rng,
        q,
        w,
        k,
        lens,
        topk,
        scale_exp,
        key_dtype,
        key_scale=c,
        check={"fail_vacuous": True},
        meta={"non_finite": True, "bad_keys": sorted(int(x) for x in bad)},
    )
    if where == "fp8_nan":  # both NaN codes: 0x7f and 0xff
        kb = case.inputs["index_k"].view(np.uint8)
        kb[bad[::2], 1] = 0xFF
        kb[bad[1::2], 1] = 0x7F
    return case


def all_topk_cases(
    *,
    long: bool = False,
    scales: Sequence[int] = (0, 30, -30),
    forms: Sequence[str] = ("dense", "packed", "paged", "compressed"),
    non_finite_cases: bool = True,
    seed: int = 0,
) -> List[Tuple[str, Case]]:
    """Every token top-k case, as ``(id, case)`` pairs (see :func:`pytest_params`).

    Each generator at each ``scale_exp`` of ``scales``, then the non-finite
    cases; the ids are unique.

    Parameters
    ----------
    long : bool, optional
        Adds the 256K-key low-contrast rows (``topk = 2048``); default False.
    scales : sequence of int, optional
        The ``scale_exp`` values (scores times ``2^scale_exp``); default
        ``(0, 30, -30)``.
    forms : sequence of str, optional
        The forms a kernel takes (``"dense"``: ``index_k``; ``"packed"``:
        ``cu_seqlens``; ``"paged"``: ``kv_cache``; ``"compressed"``:
        ``index_k`` of compressed entries, ``compress_ratio``); default all four.
    non_finite_cases : bool, optional
        Adds the NaN / inf cases (dense); default True.
    seed : int, optional
        Every generator's seed (default 0).

    Returns
    -------
    list of (str, Case)
        ``(case.id, case)`` for each case.
    """
    makers: List[Callable[[int], Case]] = []
    if "dense" in forms:
        makers += [
            lambda e: low_contrast(seed, scale_exp=e),
            lambda e: low_contrast(seed, key_dtype="float8_e4m3fn", scale_exp=e),
            lambda e: low_contrast(seed, key_dtype="bfloat16", n_keys=2043, topk=128, scale_exp=e),
            lambda e: ties_at_threshold(seed, scale_exp=e),
            lambda e: signed_zeros(seed, scale_exp=e),
            lambda e: all_zero(seed, scale_exp=e),
            lambda e: short_contexts(seed, scale_exp=e),
            lambda e: fp8_extremes(seed, scale_exp=e),
            lambda e: bf16_rounded_ties(seed, scale_exp=e),
            lambda e: ik_tail_truncation(seed, scale_exp=e),
            lambda e: ik_absolute_early_out(seed, scale_exp=e - 30),
            lambda e: relu_negative_dots(seed, scale_exp=e),
            lambda e: fp8_per_key_scales(seed, scale_exp=e),
        ]
        if long:
            makers.append(lambda e: low_contrast(seed, n_keys=262149, topk=2048, heads=4, scale_exp=e))
    if "packed" in forms:
        makers.append(lambda e: short_contexts(seed, packed=True, scale_exp=e))
    if "compressed" in forms:
        makers.append(lambda e: compressed_entry_boundary(seed, scale_exp=e))
    if "paged" in forms:
        makers += [lambda e: paged(seed, scale_exp=e), lambda e: paged(seed, page_layout="fp8_scaled", scale_exp=e)]
    out = [(c.id, c) for c in (m(e) for m in makers for e in scales)]
    if non_finite_cases and "dense" in forms:
        nan, inf = float("nan"), float("inf")
        for where, v in (
            ("index_k", nan),
            ("index_k", inf),
            ("key_scale", nan),
            ("key_scale", inf),
            ("index_q", inf),
            ("weights", inf),
            ("fp8_nan", nan),
        ):
            c = non_finite(seed, where=where, value=v)
            out.append((c.id, c))
    ids = [i for i, _ in out]
    assert len(set(ids)) == len(ids), "case ids must be unique"
    return out


# ---- block selection (MiniMax-M3) ---------------------------------------------
