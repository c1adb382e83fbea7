"""Token top-k cases for the parts of the rule a kernel can silently drop: the
indexer's ReLU, the compressed entries a query sees (``(p + 1) // m``), fp8
keys' per-key scales. Each is exact by construction, as every token top-k
case is (:mod:`kvselect.testing.cases`)."""

from __future__ import annotations

import numpy as np

from kvselect.testing.cases._case import (
    Case,
    _topk_case,
    _value_operands,
    tail_lengths,
)


def relu_negative_dots(seed: int = 0, *, n_keys: int = 1021, topk: int = 64, dim: int = 16, scale_exp: int = 0) -> Case:
    """Heads whose dots are negative where the ReLU decides the row: four
    heads of weights ``1, -1, 2, 1`` (head ``h`` reads component ``h``);
    ``topk * 3 // 8`` **trap** keys with a small score whose dot on the
    negatively weighted head is ``-512 .. -768`` (``w * dot = +512 ..
    +768`` without the ReLU, 0 with it), and ``topk // 4`` winners whose dot
    on the weight-2 head is ``-256`` (``-512`` without the ReLU, 0 with
    it). Exact: integer operands, weights ``±1, 2`` times ``2^scale_exp``,
    every score and partial sum an integer below ``2^11`` (times
    ``2^scale_exp``).

    The bug: a kernel that forgets the indexer's ReLU. The score is
    ``Σ_h w_h ReLU(q_h · k_t)`` (DeepSeek-V3.2's lightning indexer, eq. 1
    of deepseek-ai/DeepSeek-V3.2-Exp ``DeepSeek_V3_2.pdf``: "We choose ReLU
    as the activation function for throughput consideration"), and
    ``Σ_h w_h (q_h · k_t)`` is
    ``(Σ_h w_h q_h) · k_t``, one dot instead of ``H``: folding the head
    weights into the query, or a weighted GEMM with no per-head epilogue,
    drops the ReLU. Head weights are signed (a learned projection), so
    without the ReLU the traps win and the masked winners lose; a case
    whose negative dots lose either way (``fp8_extremes``' ``-448`` keys
    under a positive weight) cannot tell.

    Parameters
    ----------
    seed : int
        The NumPy Generator's seed.
    n_keys : int
        The keys (the longest context).
    topk : int
        The ``k`` of the top-k (at least 8).
    dim : int
        The index dimension ``d`` (at least 4).
    scale_exp : int
        The scores are multiplied by ``2^scale_exp`` (through the weights or queries).

    Returns
    -------
    Case
        A ``topk`` case, ``expected`` from the exact rule.
    """
    rng = np.random.default_rng(seed)
    heads = 4
    n_traps, n_masked = topk * 3 // 8, topk // 4
    w = np.array([1.0, -1.0, 2.0, 1.0])
    q = np.zeros((heads, dim))
    q[np.arange(heads), np.arange(heads)] = 1.0
    k = np.zeros((n_keys, dim))
    k[:, 0] = rng.integers(0, 100, n_keys)  # the score, mostly
    k[:, 1:4] = rng.integers(-3, 4, (n_keys, 3))  # small: a penalty (weight -1) or a bonus, or ReLU'd away
    k[:, 4:] = rng.integers(-4, 5, (n_keys, dim - 4))  # never read (q is 0 there)
    lens = tail_lengths(n_keys, 3)
    where = rng.permutation(int(lens.min()))  # inside every row
    traps, masked = where[:n_traps], where[n_traps : n_traps + n_masked]
    k[traps, 0] = rng.integers(0, 10, n_traps)
    k[traps, 1] = -512 - rng.integers(0, 257, n_traps)  # weight -1: +512.. without the ReLU
    k[masked, 0] = rng.integers(200, 300, n_masked)
    k[masked, 2] = -256  # weight 2: -512 without the ReLU
    return _topk_case(
        "relu_negative_dots",
        relu_negative_dots.__doc__ or "",
        rng,
        q,
        w,
        k,
        lens,
        topk,
        scale_exp,
        meta={"traps": sorted(int(x) for x in traps), "masked_winners": sorted(int(x) for x in masked)},
    )


def compressed_entry_boundary(
    seed: int = 0,
    *,
    n_entries: int = 301,
    topk: int = 32,
    compress_ratio: int = 4,
    heads: int = 4,
    dim: int = 16,
    scale_exp: int = 0,
) -> Case:
    """Compressed keys (DeepSeek-V4's CSA: ``compress_ratio = 4``), queries
    at the entry boundaries: for each ``L`` of :func:`tail_lengths` (``L mod
    8 != 0``), a query at ``p = m L - 1``, the last token of entry ``L - 1``
    (it sees ``(p + 1) // m = L`` entries, entry ``L - 1`` just complete),
    and one at ``p = m L + m - 2``, the token before entry ``L`` completes
    (still ``L`` entries). Entries ``L - 1`` and ``L`` score ``1000 +``
    (every other entry below 500), so each row's newest visible entry wins it
    and the first entry not yet visible would. Exact: integer scores below
    ``2^11`` (times ``2^scale_exp``).

    The bug: a kernel that counts a query's visible entries as ``p // m``
    (the entry holding ``p``, taken as not yet complete) instead of ``(p +
    1) // m`` drops entry ``L - 1`` at ``p = m L - 1``, exactly when ``p``
    is the entry's last token; the other rows agree, so cases at random
    positions miss it (three in four rows are right). vLLM's DeepSeek-V4
    path gives token ``pos`` ``min((pos + 1) // compress_ratio, topk)``
    top-k entries (``combine_topk_swa_indices`` in
    ``vllm/v1/attention/ops/deepseek_v4_ops/cache_utils.py``). A kernel
    that rounds up (``ceil((p + 1) / m)``) selects entry ``L`` at ``p = m L
    + m - 2`` (``not_causal``).

    Parameters
    ----------
    seed : int
        The NumPy Generator's seed.
    n_entries : int
        The compressed entries (the longest context, in entries).
    topk : int
        The ``k`` of the top-k (more than the entries scored ``1000 +``, at most 14).
    compress_ratio : int
        ``m``, tokens per entry (at least 2).
    heads : int
        Index heads ``H`` (a power of two).
    dim : int
        The index dimension ``d``.
    scale_exp : int
        The scores are multiplied by ``2^scale_exp`` (through the weights or queries).

    Returns
    -------
    Case
        A ``topk`` case (form ``"compressed"``, ``compress_ratio`` among its
        inputs), ``expected`` from the exact rule.
    """
    rng = np.random.default_rng(seed)
    m = compress_ratio
    assert m >= 2
    L = tail_lengths(n_entries, 7)
    values = rng.integers(0, 500, n_entries).astype(np.float64)
    newest = np.concatenate([L - 1, L[L < n_entries]])
    values[newest] = 1000.0 + rng.permutation(len(newest))
    assert len(newest) < topk
    q, w, k = _value_operands(rng, values, heads, dim)
    before = L[L < n_entries]
    pos = np.concatenate([m * L - 1, m * before + m - 2])
    lens = np.concatenate([L, before])
    return _topk_case(
        f"compressed_entry_boundary-m{m}",
        compressed_entry_boundary.__doc__ or "",
        rng,
        q,
        w,
        k,
        lens,
        topk,
        scale_exp,
        meta={"compress_ratio": m, "boundary_rows": int(len(L))},
        query_pos=pos,
        compress_ratio=m,
    )


def fp8_per_key_scales(
    seed: int = 0, *, n_keys: int = 613, topk: int = 64, heads: int = 4, dim: int = 16, scale_exp: int = 0
) -> Case:
    """float8_e4m3fn keys with a **per-key** ``key_scale`` that decides the
    ranking: raw values ``j 2^e`` (``j = 1..16``, ``e = 0..4``, exact in
    e4m3fn), scales ``2^-8 .. 2^2`` (powers of two, as vLLM's
    ``indexer_k_quant_and_cache`` writes them when it rounds each scale up
    to a power of two), and ``topk // 2`` keys at the largest raw value, 448, under the
    smallest scale (score 1.75, losers). The raw values' top-k and the
    scores' top-k differ in every row. Exact: every score and partial sum a
    multiple of ``2^-10`` at most ``2^10`` (times ``2^scale_exp``).

    The bug: fp8 keys decoded without their per-key scale (the raw e4m3fn
    value taken for the key, or one scale for the whole tensor). An fp8
    index-K cache carries one float32 scale per token: vLLM's DSA page
    holds the ``block_size × d`` fp8 bytes, then ``block_size`` float32
    scales (``page_layout="fp8_scaled"``), and the score is
    ``key_scale[t] · Σ_h w_h ReLU(q_h · k_t)``. Cases with one scale for
    every key (``fp8_extremes``, the paged cases) rank the same with or
    without it.

    Parameters
    ----------
    seed : int
        The NumPy Generator's seed.
    n_keys : int
        The keys (the longest context).
    topk : int
        The ``k`` of the top-k.
    heads : int
        Index heads ``H`` (a power of two).
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
    raw = rng.integers(1, 17, n_keys) * 2.0 ** rng.integers(0, 5, n_keys)
    scale = 2.0 ** rng.integers(-8, 3, n_keys)
    lens = tail_lengths(n_keys, 3)
    giants = rng.permutation(int(lens.min()))[: topk // 2]
    raw[giants], scale[giants] = 448.0, 2.0**-8
    q, w, k = _value_operands(rng, raw, heads, dim)
    return _topk_case(
        "fp8_per_key_scales",
        fp8_per_key_scales.__doc__ or "",
        rng,
        q,
        w,
        k,
        lens,
        topk,
        scale_exp,
        "float8_e4m3fn",
        key_scale=scale,
        meta={"giants": sorted(int(x) for x in giants)},
    )
