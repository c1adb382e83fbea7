"""InfLLM-v2's block selection (MiniCPM4 / 4.1) in plain NumPy, written from the sources.

- OpenBMB/infllmv2_cuda_impl @f908e731: stage 1 is each query head's softmax over
  the compressed keys, ``(q @ k.T) * (1 / sqrt(d))``, causally masked to the keys whose
  32 tokens end at or before the query, summed over the query group
  (``tests/stage1/naive_softmax.py`` ``torch_naive_softmax``; ``tests/test_stage1.py``
  ``naive_attention``; NaN rows, a query that sees no key, become 0); compressed key
  ``j`` is the mean of the keys at tokens ``16 j .. 16 j + 31``
  (``tests/test_stage1_compressed_lse.py`` ``compress_tensor``).
- ``csrc/max_pooling_1d.cuh`` (``pooling="cuda"``): block ``b`` takes the maximum over
  compressed keys ``[4b - 1, 4b + 4)`` clamped to the keys (``-inf`` when none);
  ``b < init_blocks`` and ``qb - local_blocks <= b <= qb`` are ``+inf``.
- ``tests/test_pooling_comparison.py`` ``_transform_score_kernel`` (``pooling="triton"``):
  out-of-range taps read 0; ``qb - local_blocks < b <= qb`` is ``-inf``; then
  ``b < init_blocks`` is ``+inf``.
- MiniCPM4.1's modelling code (``compressed_attention``; a copy at
  ProudAurora/SparseMiniCpm @294ead4d ``finetune/models/minicpm4/modeling_minicpm.py``):
  ``block_score.topk(topk)``, sorted, ids ``> q_idx`` set to -1
  (``keep="through_current"``); an earlier copy drops ``>= q_idx``
  (``keep="before_current"``).

Scores here are float64 (the queries and keys are float32 values, the scale the float32
``1/sqrt(d)`` the core uses), so they are the exact scores to about 1e-15. The core's
float32 scores are within ``score_bound`` of them (src/infllm/mod.rs states the bound
and why it holds); ``rows_within_bound`` is the comparison the differential tests and
the checker make. Blocks are ranked by score descending, then id ascending, NaN last.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

import numpy as np

from ._args import _I32_MAX, ReferenceSelectionError, _count, _int_list, _paged, _scales, _table_row, _takes_out
from .keys import decode

BLOCK_SIZE = 64
KERNEL_SIZE = 32
KERNEL_STRIDE = 16
_U = 2.0**-24
_EXP_REL_ERR = 8.5e-8  # crate::exp::EXP_REL_ERR (docs/kernels.md); the tests read the native one


def compressed_len(n_tokens: int, kernel_size: int = KERNEL_SIZE, kernel_stride: int = KERNEL_STRIDE) -> int:
    """Compressed keys of ``n_tokens`` tokens: ``(n - kernel_size) // kernel_stride + 1``
    (``(n - 32) // 16 + 1``), 0 below ``kernel_size``."""
    return 0 if n_tokens < kernel_size else (n_tokens - kernel_size) // kernel_stride + 1


def visible(p: int, kernel_size: int = KERNEL_SIZE, kernel_stride: int = KERNEL_STRIDE) -> int:
    """Compressed keys the query at position ``p`` sees (its last token at or before ``p``)."""
    return compressed_len(p + 1, kernel_size, kernel_stride)


def n_blocks(n_tokens: int, block_size: int = BLOCK_SIZE) -> int:
    return -(-n_tokens // block_size)


def compress_keys(keys: Any, kernel_size: int = KERNEL_SIZE, kernel_stride: int = KERNEL_STRIDE) -> np.ndarray:
    """``[n, h, d]`` keys -> their compressed keys ``[(n - 32) // 16 + 1, h, d]``: the
    mean of each ``kernel_size``-token window every ``kernel_stride`` tokens
    (``compress_tensor``), in float64, rounded to float32."""
    k = decode(keys)
    n_c = compressed_len(len(k), kernel_size, kernel_stride)
    out = np.zeros((n_c,) + k.shape[1:], np.float64)
    for j in range(n_c):
        out[j] = k[j * kernel_stride : j * kernel_stride + kernel_size].mean(axis=0)
    return out.astype(np.float32)


def _geometry(block_size: Any, kernel_size: Any, kernel_stride: Any) -> Tuple[int, int, int]:
    b, c, s = (
        _count("block_size", block_size),
        _count("kernel_size", kernel_size),
        _count("kernel_stride", kernel_stride),
    )
    for name, v in (("block_size", b), ("kernel_size", c), ("kernel_stride", s)):
        if v == 0:
            raise ReferenceSelectionError(name, f"{name} must be at least 1")
    if b % s:
        raise ReferenceSelectionError("block_size", f"block_size ({b}) must be a multiple of kernel_stride ({s})")
    return b, c, s


def _inputs(
    q: Any,
    ck: Any,
    seq_len: int,
    scale: Optional[float],
    ck_scale: Any,
    query_format: Any,
    key_format: Any,
    geometry: Tuple[int, int, int] = (BLOCK_SIZE, KERNEL_SIZE, KERNEL_STRIDE),
) -> Tuple[np.ndarray, np.ndarray, int, float]:
    n = _count("seq_len", seq_len)
    if n == 0:
        raise ReferenceSelectionError("seq_len", "seq_len must be at least 1 (the query's own token)")
    if n > _I32_MAX:
        raise ReferenceSelectionError("seq_len", f"seq_len is too large: at most {_I32_MAX}")
    qa = decode(q, query_format, "query_format", name="q")
    ka = decode(ck, key_format, "key_format", name="ck")
    if qa.ndim != 3:
        raise ReferenceSelectionError("q", f"q must be 3-D [n_q, n_q_heads, d], got {qa.ndim}-D")
    if ka.ndim != 3:
        raise ReferenceSelectionError("ck", f"ck must be 3-D [n_c, n_kv_heads, d], got {ka.ndim}-D")
    n_q, hq, d = qa.shape
    n_c, h, dk = ka.shape
    if dk != d:
        raise ReferenceSelectionError("ck", f"ck has d={dk} but q has d={d}")
    if h == 0 or hq == 0 or hq % h:
        raise ReferenceSelectionError("q", f"q's {hq} heads are not a positive multiple of the {h} KV heads")
    if n_q == 0 or n_q > n:
        raise ReferenceSelectionError("q", f"{n_q} queries for seq_len = {n}")
    want = compressed_len(n, geometry[1], geometry[2])
    if n_c != want:
        raise ReferenceSelectionError("ck", f"ck holds {n_c} compressed keys, {n} tokens have {want}")
    if ck_scale is not None:
        s = _scales("ck_scale", ck_scale)
        if s.shape != (n_c,):
            raise ReferenceSelectionError("ck_scale", f"ck_scale must be [n_c={n_c}]")
        ka = (ka.astype(np.float32) * s[:, None, None]).astype(np.float64)
    sc = float(np.float32(1.0 / np.sqrt(d))) if scale is None else float(np.float32(scale))
    if not np.isfinite(sc):
        raise ReferenceSelectionError("scale", f"scale must be finite, got {scale}")
    return qa, ka, n, sc


def _logits(qa: np.ndarray, ka: np.ndarray, i: int, g: int, n_vis: int, sc: float) -> Tuple[np.ndarray, np.ndarray]:
    """Query ``i``'s group of KV head ``g``: exact logits ``[G, n_vis]`` and ``sum |q k|``."""
    hq, h = qa.shape[1], ka.shape[1]
    gs = hq // h
    qg = qa[i, g * gs : (g + 1) * gs]
    kg = ka[:n_vis, g]
    return (qg @ kg.T) * sc, np.abs(qg) @ np.abs(kg).T


def group_scores(
    q: Any,
    ck: Any,
    seq_len: int,
    *,
    scale: Optional[float] = None,
    ck_scale: Any = None,
    query_format: Optional[str] = None,
    key_format: Optional[str] = None,
    kernel_size: int = KERNEL_SIZE,
    kernel_stride: int = KERNEL_STRIDE,
) -> np.ndarray:
    """Stage 1: ``[n_q, n_kv_heads, n_c]`` float64, each head's softmax over the keys its
    query sees summed over the group (0 for the keys it does not see)."""
    geo = (kernel_stride, kernel_size, kernel_stride)
    qa, ka, n, sc = _inputs(q, ck, seq_len, scale, ck_scale, query_format, key_format, geo)
    n_q, n_c, h = qa.shape[0], ka.shape[0], ka.shape[1]
    out = np.zeros((n_q, h, n_c))
    for i in range(n_q):
        nv = visible(n - n_q + i, kernel_size, kernel_stride)
        if nv == 0:
            continue
        for g in range(h):
            s, _ = _logits(qa, ka, i, g, nv, sc)
            e = np.exp(s - s.max(axis=1, keepdims=True))
            out[i, g, :nv] = (e / e.sum(axis=1, keepdims=True)).sum(axis=0)
    return out


def pool(
    sums: np.ndarray,
    p: int,
    n_blocks_: int,
    init_blocks: int,
    local_blocks: int,
    pooling: str,
    block_size: int = BLOCK_SIZE,
    kernel_stride: int = KERNEL_STRIDE,
) -> np.ndarray:
    """One row's block scores from its group sums ``[n_c]`` (0 where unseen)."""
    n_c = len(sums)
    qb = p // block_size
    kpb = block_size // kernel_stride
    out = np.empty(n_blocks_)
    for b in range(n_blocks_):
        taps = sums[max(kpb * b - 1, 0) : min(kpb * b + kpb, n_c)]
        if pooling == "cuda":
            if b < init_blocks or (b <= qb <= b + local_blocks):
                out[b] = np.inf
            else:
                out[b] = taps.max() if len(taps) else -np.inf
        else:
            if b < init_blocks:
                out[b] = np.inf
            elif b <= qb < b + local_blocks:
                out[b] = -np.inf
            else:
                out[b] = max(0.0, taps.max()) if len(taps) else 0.0
    return out


def _pooling(pooling: str) -> str:
    if pooling not in ("cuda", "triton"):
        raise ReferenceSelectionError("pooling", f"pooling must be 'cuda' or 'triton', got {pooling!r}")
    return pooling


@_takes_out(np.float32)
def infllm_block_scores(
    q: Any,
    ck: Any,
    seq_len: int,
    *,
    init_blocks: int = 1,
    local_blocks: int = 32,
    pooling: str = "cuda",
    scale: Optional[float] = None,
    ck_scale: Any = None,
    query_format: Optional[str] = None,
    key_format: Optional[str] = None,
    block_size: int = BLOCK_SIZE,
    kernel_size: int = KERNEL_SIZE,
    kernel_stride: int = KERNEL_STRIDE,
    cu_seqlens_q: Any = None,
    cu_seqlens_k: Any = None,
    out: Any = None,
) -> np.ndarray:
    """``kvselect.infllm_block_scores`` in float64 (packed: each sequence's dense rows,
    then NaN to the longest sequence's blocks)."""
    kw = dict(init_blocks=init_blocks, local_blocks=local_blocks, pooling=pooling, scale=scale)
    kw.update(query_format=query_format, key_format=key_format, block_size=block_size)
    kw.update(kernel_size=kernel_size, kernel_stride=kernel_stride)
    if cu_seqlens_q is not None or cu_seqlens_k is not None:
        return _packed(infllm_block_scores, np.nan, q, ck, seq_len, ck_scale, cu_seqlens_q, cu_seqlens_k, kw)
    pl = _pooling(pooling)
    init, local = _count("init_blocks", init_blocks), _count("local_blocks", local_blocks)
    bs, kz, st = _geometry(block_size, kernel_size, kernel_stride)
    s = group_scores(
        q,
        ck,
        seq_len,
        scale=scale,
        ck_scale=ck_scale,
        query_format=query_format,
        key_format=key_format,
        kernel_size=kz,
        kernel_stride=st,
    )
    n_q, h, _ = s.shape
    nb = n_blocks(seq_len, bs)
    out = np.empty((n_q, h, nb))
    for i in range(n_q):
        for g in range(h):
            out[i, g] = pool(s[i, g], seq_len - n_q + i, nb, init, local, pl, bs, st)
    return out


def order(scores: np.ndarray) -> np.ndarray:
    """Block ids by score descending, then id ascending, NaN last."""
    key = np.where(np.isnan(scores), -np.inf, scores)
    return np.lexsort((np.arange(len(scores)), np.isnan(scores), -key))


def select_row(scores: np.ndarray, topk: int, keep: str, p: int, block_size: int = BLOCK_SIZE) -> np.ndarray:
    """One row: the top ``min(topk, n)`` in the order, filtered, ascending."""
    top = order(scores)[: min(topk, len(scores))]
    qb = p // block_size
    top = top[top <= qb] if keep == "through_current" else top[top < qb]
    return np.sort(top)


@_takes_out(np.int32)
def infllm_select(
    q: Any,
    ck: Any,
    seq_len: int,
    topk: int = 64,
    *,
    init_blocks: int = 1,
    local_blocks: int = 32,
    pooling: str = "cuda",
    keep: str = "through_current",
    scale: Optional[float] = None,
    ck_scale: Any = None,
    query_format: Optional[str] = None,
    key_format: Optional[str] = None,
    block_size: int = BLOCK_SIZE,
    kernel_size: int = KERNEL_SIZE,
    kernel_stride: int = KERNEL_STRIDE,
    cu_seqlens_q: Any = None,
    cu_seqlens_k: Any = None,
    out: Any = None,
) -> np.ndarray:
    """``kvselect.infllm_select`` in exact arithmetic (float64 scores); packed: each
    sequence's dense rows."""
    if cu_seqlens_q is not None or cu_seqlens_k is not None:
        kw = dict(init_blocks=init_blocks, local_blocks=local_blocks, pooling=pooling, keep=keep, scale=scale)
        kw.update(query_format=query_format, key_format=key_format, block_size=block_size)
        kw.update(kernel_size=kernel_size, kernel_stride=kernel_stride, topk=topk)
        return _packed(infllm_select, -1, q, ck, seq_len, ck_scale, cu_seqlens_q, cu_seqlens_k, kw)
    k = _count("topk", topk)
    if k == 0:
        raise ReferenceSelectionError("topk", "topk must be at least 1 block")
    if keep not in ("through_current", "before_current"):
        raise ReferenceSelectionError("keep", f"keep must be 'through_current' or 'before_current', got {keep!r}")
    b = infllm_block_scores(
        q,
        ck,
        seq_len,
        init_blocks=init_blocks,
        local_blocks=local_blocks,
        pooling=pooling,
        scale=scale,
        ck_scale=ck_scale,
        query_format=query_format,
        key_format=key_format,
        block_size=block_size,
        kernel_size=kernel_size,
        kernel_stride=kernel_stride,
    )
    n_q, h, _ = b.shape
    out = np.full((n_q, h, k), -1, np.int32)
    for i in range(n_q):
        for g in range(h):
            r = select_row(b[i, g], k, keep, seq_len - n_q + i, block_size)
            out[i, g, : len(r)] = r
    return out


def score_bound(
    q: Any,
    ck: Any,
    seq_len: int,
    *,
    scale: Optional[float] = None,
    ck_scale: Any = None,
    query_format: Optional[str] = None,
    key_format: Optional[str] = None,
    exp_rel_err: float = _EXP_REL_ERR,
    kernel_size: int = KERNEL_SIZE,
    kernel_stride: int = KERNEL_STRIDE,
) -> Tuple[np.ndarray, float]:
    """The core's error bound (src/infllm/mod.rs): ``(R [n_q, n_kv_heads], T)``, every
    float32 block score within ``R * B + T`` of the exact ``B``.

    Per head: ``e_j = |scale| gamma_d sum|q ck_j| (1 + u) + u |s_j|``, ``a_j = e_j + u
    (|s_j - m| + max e + e_j)``, ``A = max a_j``, ``r = e^(2A) (1 + eps)(1 + u) / ((1 -
    eps)(1 - gamma_n)) - 1``; ``R = (1 + max r)(1 + gamma_G) - 1``, ``T = G 2^-123``
    (doubled here: this bound is itself computed in float64)."""
    geo = (kernel_stride, kernel_size, kernel_stride)
    qa, ka, n, sc = _inputs(q, ck, seq_len, scale, ck_scale, query_format, key_format, geo)
    n_q, hq, d = qa.shape
    h = ka.shape[1]
    gs = hq // h
    out = np.zeros((n_q, h))
    for i in range(n_q):
        nv = visible(n - n_q + i, kernel_size, kernel_stride)
        if nv == 0:
            continue
        for g in range(h):
            s, a = _logits(qa, ka, i, g, nv, sc)
            e = abs(sc) * gamma(d) * a * (1 + _U) + _U * np.abs(s)
            out[i, g] = group_ratio(s, e, exp_rel_err)
    return out, 2 * gs * 2.0**-123


def gamma(k: int) -> float:
    """``gamma_k = k u / (1 - k u)``: the relative error of ``k`` float32 roundings."""
    return k * _U / (1 - k * _U)


def group_ratio(s: np.ndarray, e: np.ndarray, exp_rel_err: float = _EXP_REL_ERR) -> float:
    """``R`` of the bound for one group's exact logits ``s`` (``[G, n]``) whose float32
    logits are within ``e`` (``[G, n]``) of them: the shift, ``exp``, the sum, the
    division, then the group sum (src/infllm/mod.rs, "The bound"; NSA's bound reuses it
    with its wider ``e``)."""
    n, gs = s.shape[1], s.shape[0]
    m = s.max(axis=1, keepdims=True)
    big_a = (e + _U * (np.abs(s - m) + e.max(axis=1, keepdims=True) + e)).max(axis=1)
    eps = exp_rel_err
    r = np.exp(2 * big_a) * (1 + eps) * (1 + _U) / ((1 - eps) * (1 - gamma(n))) - 1
    return float(((1 + r.max()) * (1 + gamma(gs)) - 1) * (1 + 1e-9))


def rows_within_bound(
    rows: np.ndarray,
    scores: np.ndarray,
    bound: Tuple[np.ndarray, float],
    seq_len: int,
    topk: int,
    keep: str,
    block_size: int = BLOCK_SIZE,
) -> np.ndarray:
    """Which of ``rows`` (``[n_q, h, topk]``, a kernel's) are right: a row passes when its
    ids are distinct, ascending, ``-1`` padded, kept by ``keep``, and equal to the exact
    selection but for swaps between blocks whose exact scores ``B`` lie within ``R (B_b +
    B_c) + 2T`` of each other. Returns ``[n_q, h]`` bool."""
    R, T = bound
    n_q, h, _ = scores.shape
    ok = np.zeros((n_q, h), bool)
    for i in range(n_q):
        p = seq_len - n_q + i
        for g in range(h):
            row = rows[i, g]
            ids = row[row >= 0]
            want = select_row(scores[i, g], topk, keep, p, block_size)
            if len(ids) != len(want) or np.any(row[len(ids) :] != -1) or np.any(np.diff(ids) <= 0):
                continue
            extra, missing = np.setdiff1d(ids, want), np.setdiff1d(want, ids)
            s, r = scores[i, g], float(R[i, g])
            ok[i, g] = all(scores_near(s[b], s[c], r, T) for b in extra for c in missing)
    return ok


def scores_near(x: float, y: float, r: float, t: float) -> bool:
    """Two exact block scores the core may order either way: equal, or within ``r (|x|
    + |y|) + 2t``."""
    if x == y:
        return True
    both = abs(x) + abs(y)
    return bool(np.isfinite(both) and abs(x - y) <= r * both + 2 * t)


def _cu(argument: str, cu: Any, n: int) -> List[int]:
    c = _int_list(argument, cu)
    if not c or c[0] != 0 or c[-1] != n or any(b < a for a, b in zip(c, c[1:])):
        raise ReferenceSelectionError(argument, f"{argument} must rise from 0 to {n}, got {c}")
    return c


def packed_sequences(q: Any, ck: Any, seq_len: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, **geo: int) -> List[Tuple]:
    """A packed batch's sequences, checked as the core checks them: ``(s, q rows, ck rows,
    tokens)`` each (``q0:q1``, ``c0:c1`` slices). ``geo`` holds ``kernel_size`` and
    ``kernel_stride``."""
    if cu_seqlens_q is None:
        raise ReferenceSelectionError("cu_seqlens_q", "a packed batch takes cu_seqlens_q with cu_seqlens_k")
    if cu_seqlens_k is None:
        raise ReferenceSelectionError("cu_seqlens_k", "a packed batch takes cu_seqlens_k with cu_seqlens_q")
    n_c = np.asarray(ck).shape[0]
    cu_k = _cu("cu_seqlens_k", cu_seqlens_k, n_c)
    lens = _int_list("seq_len", seq_len)
    if len(lens) != len(cu_k) - 1 or any(x < 1 for x in lens):
        raise ReferenceSelectionError("seq_len", f"seq_len must hold one positive length per sequence, got {lens}")
    if any(x > _I32_MAX for x in lens):
        raise ReferenceSelectionError("seq_len", f"seq_len holds a length past an int32 position: {lens}")
    kz, st = geo.get("kernel_size", KERNEL_SIZE), geo.get("kernel_stride", KERNEL_STRIDE)
    for s, n in enumerate(lens):
        if cu_k[s + 1] - cu_k[s] != compressed_len(n, kz, st):
            raise ReferenceSelectionError(
                "cu_seqlens_k", f"cu_seqlens_k: sequence {s} has not its {n} tokens' compressed keys"
            )
    cu_q = _int_list("cu_seqlens_q", cu_seqlens_q)
    n_q = np.asarray(q).shape[0]
    if (
        len(cu_q) != len(cu_k)
        or cu_q[0] != 0
        or cu_q[-1] != n_q
        or any(not 0 <= b - a <= n for a, b, n in zip(cu_q, cu_q[1:], lens))
    ):
        raise ReferenceSelectionError(
            "cu_seqlens_q", "cu_seqlens_q: each sequence's queries are the last of its tokens"
        )
    return [(s, cu_q[s], cu_q[s + 1], cu_k[s], cu_k[s + 1], lens[s]) for s in range(len(lens))]


def _packed(
    fn: Any, pad: float, q: Any, ck: Any, seq_len: Any, ck_scale: Any, cu_q: Any, cu_k: Any, kw: dict
) -> np.ndarray:
    """``fn`` (the dense twin) on each sequence of a packed batch, rows concatenated and
    padded with ``pad``."""
    geo = {k: kw[k] for k in ("kernel_size", "kernel_stride")}
    qa = decode(q, kw.get("query_format"), "query_format", name="q")
    ka = decode(ck, kw.get("key_format"), "key_format", name="ck")
    if qa.ndim != 3 or ka.ndim != 3:
        raise ReferenceSelectionError("q" if qa.ndim != 3 else "ck", "q and ck must be 3-D")
    seqs = packed_sequences(qa, ka, seq_len, cu_q, cu_k, **geo)
    sc = None if ck_scale is None else _scales("ck_scale", ck_scale)
    if sc is not None and sc.shape != (len(ka),):
        raise ReferenceSelectionError("ck_scale", f"ck_scale must be [n_c={len(ka)}]")
    kw = {k: v for k, v in kw.items() if k not in ("query_format", "key_format")}
    parts = []
    for _, q0, q1, c0, c1, n in seqs:
        if q1 > q0:
            part = fn(qa[q0:q1], ka[c0:c1], n, ck_scale=None if sc is None else sc[c0:c1], **kw)
            parts.append((q0, part))
    if fn is infllm_select:
        width = _count("topk", kw["topk"])
    else:
        width = max((n_blocks(n, kw["block_size"]) for *_, n in seqs), default=0)
    dtype = np.dtype(np.int32) if fn is infllm_select else np.dtype(np.float64)
    out = np.full((len(qa), ka.shape[1], width), pad, dtype)
    for q0, part in parts:
        out[q0 : q0 + len(part), :, : part.shape[2]] = part
    return out


def gather_paged(
    kv_cache: Any, block_table: Any, s: int, n_rows: int, h: int, page_layout: str, key_format: Any
) -> np.ndarray:
    """Rows ``0 .. n_rows`` of sequence ``s`` of a paged cache (row ``j`` in row ``j %
    page`` of page ``block_table[s, j // page]``) as float32 ``[n_rows, h, d]``, fp8 keys
    times their scales (vLLM's scaled page: the keys' bytes, then one float32 scale a row)."""
    cache, table = np.asarray(kv_cache), np.asarray(block_table)
    page = cache.shape[1]
    if page_layout == "fp8_scaled":
        row = cache.shape[2] - 4
        out = np.zeros((n_rows, row), np.float32)
        for j in range(n_rows):
            pg = np.ascontiguousarray(cache[table[s, j // page]]).view(np.uint8).reshape(-1)
            r = j % page
            keys = decode(pg[r * row : (r + 1) * row], "float8_e4m3fn").astype(np.float32)
            out[j] = keys * pg[page * row :].view("<f4")[r]
        return out.reshape(n_rows, h, row // h)
    rows = [cache[table[s, j // page], j % page] for j in range(n_rows)]
    if not rows:
        return np.zeros((0, h, cache.shape[2] // h), np.float32)
    return decode(np.stack(rows), key_format, "key_format", name="kv_cache").astype(np.float32).reshape(n_rows, h, -1)


def _paged_sequences(
    q: Any,
    kv_cache: Any,
    block_table: Any,
    seq_lens: Any,
    n_kv_heads: int,
    page_layout: str,
    key_format: Optional[str],
    query_format: Optional[str],
    kw: dict,
) -> list:
    """A paged decode's arguments checked as the binding checks them (the cache and table,
    ``q`` one ``[n_q_heads, d]`` query a sequence, each length at least 1, each table row
    long enough and inside the cache), then each sequence's ``(seq_len, query [1, n_q_heads,
    d], compressed keys)``, the keys gathered through its block-table row
    (:func:`gather_paged`, fp8 keys times their scales rounded to float32)."""
    h = _count("n_kv_heads", n_kv_heads)
    lens = _int_list("seq_lens", seq_lens)
    kv_cache, block_table = _paged(kv_cache, block_table, len(lens), h, page_layout)
    qa = decode(q, query_format, "query_format", name="q")
    kz, st = kw.get("kernel_size", KERNEL_SIZE), kw.get("kernel_stride", KERNEL_STRIDE)
    row_width = kv_cache.shape[2] - 4 * (page_layout == "fp8_scaled")
    if qa.ndim != 3 or qa.shape[0] != len(lens) or qa.shape[2] * h != row_width:
        raise ReferenceSelectionError("q", f"q must be [n_seqs={len(lens)}, n_q_heads, d], got {qa.shape}")
    page, n_pages = kv_cache.shape[1], kv_cache.shape[0]
    seqs = []
    for s, n in enumerate(lens):
        if not 1 <= n <= _I32_MAX:
            raise ReferenceSelectionError(
                "seq_lens", f"seq_lens[{s}] = {n}: a decoding query's sequence holds 1 ..= {_I32_MAX} tokens"
            )
        n_c = compressed_len(n, kz, st)
        _table_row(block_table, s, -(-n_c // page), n_pages, f"sequence {s}'s {n_c} compressed keys")
        seqs.append((n, qa[s : s + 1], gather_paged(kv_cache, block_table, s, n_c, h, page_layout, key_format)))
    return seqs


@_takes_out(np.int32)
def infllm_select_paged(
    q: Any,
    kv_cache: Any,
    block_table: Any,
    seq_lens: Any,
    n_kv_heads: int,
    topk: int = 64,
    *,
    page_layout: str = "dense",
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    out: Any = None,
    **kw: Any,
) -> np.ndarray:
    """``kvselect.infllm_select_paged``: each sequence's compressed keys gathered through
    its block-table row, its one query at its last token, the dense twin's row."""
    h = _count("n_kv_heads", n_kv_heads)
    width = _count("topk", topk)
    seqs = _paged_sequences(q, kv_cache, block_table, seq_lens, h, page_layout, key_format, query_format, kw)
    rows = np.full((len(seqs), h, width), -1, np.int32)
    for s, (n, qs, ck) in enumerate(seqs):
        rows[s] = infllm_select(qs, ck, n, topk, **kw)[0]
    return rows


@_takes_out(np.float32)
def infllm_block_scores_paged(
    q: Any,
    kv_cache: Any,
    block_table: Any,
    seq_lens: Any,
    n_kv_heads: int,
    *,
    page_layout: str = "dense",
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    out: Any = None,
    **kw: Any,
) -> np.ndarray:
    """``kvselect.infllm_block_scores_paged`` in float64: each sequence's compressed keys
    gathered through its block-table row (:func:`gather_paged`, fp8 keys times their
    scales rounded to float32), its one query at its last token, the dense twin's row
    (:func:`infllm_block_scores`), then NaN to the longest sequence's blocks. Keyword
    arguments as there."""
    h = _count("n_kv_heads", n_kv_heads)
    kz, st = kw.get("kernel_size", KERNEL_SIZE), kw.get("kernel_stride", KERNEL_STRIDE)
    bs, _, _ = _geometry(kw.get("block_size", BLOCK_SIZE), kz, st)
    seqs = _paged_sequences(q, kv_cache, block_table, seq_lens, h, page_layout, key_format, query_format, kw)
    out = np.full((len(seqs), h, max((n_blocks(n, bs) for n, _, _ in seqs), default=0)), np.nan)
    for s, (n, qs, ck) in enumerate(seqs):
        row = infllm_block_scores(qs, ck, n, **kw)[0]
        out[s, :, : row.shape[1]] = row
    return out
