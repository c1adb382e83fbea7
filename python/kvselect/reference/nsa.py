"""NSA's block selection as fla computes it, in plain NumPy, written from the sources.

- fla-org/flash-linear-attention @bc3b101d ``fla/ops/nsa/parallel.py``
  (``parallel_nsa``: ``k_cmp = mean_pooling(k, block_size)``; ``parallel_nsa_kernel_topk``):
  query ``p = i_t + TK - TQ`` sees the ``NC = (p + 1) // BS`` complete blocks; each
  query head's lse over them; block ``c < IC = p // BS`` scores ``sum_h exp(s_hc -
  lse_h)``; blocks ``0``, ``IC - 1``, ``IC`` score 1.0 a head; ids past ``IC`` are
  padding; the top ``block_counts``.
- ``fla/ops/nsa/naive.py`` ``naive_nsa_topk``: the same with ``probs.mean`` over the
  group and ``p = i`` (query length equal to key length).

This is InfLLM-v2's stage 1 at kernel = stride = ``block_size``
(``kvselect.reference.infllm.group_scores``), reused, not restated. Scores are float64
(the keys' float32 values, the block means and the logits exact to about 1e-15), so
they decide in exact arithmetic; the core's float32 scores are within ``score_bound``
of them (src/nsa/mod.rs states the bound and why it holds), and ``rows_within_bound``
is the comparison the differential tests make. Blocks are ranked by score descending,
then id ascending (forced blocks are ``+inf``; non-candidates ``-inf``).
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

import numpy as np

from ._args import _I32_MAX, ReferenceSelectionError, _count, _int_list, _paged, _scales, _table_row, _takes_out
from .infllm import (
    compressed_len,
    gamma,
    gather_paged,
    group_ratio,
    group_scores,
    order,
    scores_near,
)
from .infllm import packed_sequences as _compressed_sequences
from .keys import decode

_U = 2.0**-24  # float32's unit roundoff
BLOCK_SIZE = 64
BLOCK_COUNTS = 16
INIT_BLOCKS = 1
LOCAL_BLOCKS = 2
PAPER_KERNEL_SIZE = 32  # the NSA paper's compression block length l (section 3.3.1)
PAPER_KERNEL_STRIDE = 16  # and its sliding stride d


@_takes_out(np.float32)
def nsa_compress_keys(
    k: Any,
    *,
    block_size: int = BLOCK_SIZE,
    k_scale: Any = None,
    key_format: Optional[str] = None,
    window: str = "fla",
    kernel_size: int = PAPER_KERNEL_SIZE,
    kernel_stride: int = PAPER_KERNEL_STRIDE,
    out: Any = None,
) -> np.ndarray:
    """The compressed keys (float64): fla's window ``[seq_len // block_size, n_kv_heads,
    d]``, each complete block's mean, every key's float32 value times its token's scale
    (the product rounded to float32), the trailing incomplete block not compressed; or
    Eq. 9's (``window="eq9"``, :func:`eq9_compress_keys`), keys of ``kernel_size``
    tokens every ``kernel_stride``."""
    # In the native binding's order: block_size, k, the window's settings and name,
    # k_scale's type, the window against block_size, then k_scale's length.
    bs = _block_size(block_size)
    ka = decode(k, key_format, "key_format", name="k")
    if ka.ndim != 3 or ka.shape[0] == 0:
        raise ReferenceSelectionError("k", f"k must be 3-D [seq_len >= 1, n_kv_heads, d], got shape {ka.shape}")
    kz, st = _count("kernel_size", kernel_size), _count("kernel_stride", kernel_stride)
    if window not in ("fla", "eq9"):
        raise ReferenceSelectionError("window", f"window must be 'fla' or 'eq9', got {window!r}")
    s = None if k_scale is None else _scales("k_scale", k_scale)
    geo = _window(window, bs, kz, st, None, None)
    if s is not None and s.shape != (ka.shape[0],):
        raise ReferenceSelectionError("k_scale", f"k_scale must be [seq_len={ka.shape[0]}]")
    if geo is not None:
        return eq9_compress_keys(k, geo[1], geo[2], k_scale=k_scale, key_format=key_format)[0]
    if s is not None:
        ka = (ka.astype(np.float32) * s[:, None, None]).astype(np.float64)
    n_c = ka.shape[0] // bs
    return ka[: n_c * bs].reshape(n_c, bs, *ka.shape[1:]).mean(axis=1)


def _block_size(block_size: Any) -> int:
    bs = _count("block_size", block_size)
    if bs == 0:
        raise ReferenceSelectionError("block_size", "block_size must be at least 1")
    return bs


def forced(b: int, ic: int, init_blocks: int = INIT_BLOCKS, local_blocks: int = LOCAL_BLOCKS) -> bool:
    """Block ``b`` is forced for the query in block ``ic``: ``b < init_blocks`` or one of
    the ``local_blocks`` blocks up to ``ic`` (fla: 0, ``ic - 1``, ``ic``)."""
    return b < init_blocks or (b <= ic < b + local_blocks)


@_takes_out(np.float32)
def nsa_block_scores(
    q: Any,
    k: Any,
    *,
    block_size: int = BLOCK_SIZE,
    init_blocks: int = INIT_BLOCKS,
    local_blocks: int = LOCAL_BLOCKS,
    scale: Optional[float] = None,
    k_scale: Any = None,
    query_format: Optional[str] = None,
    key_format: Optional[str] = None,
    cu_seqlens: Any = None,
    cu_seqlens_q: Any = None,
    window: str = "fla",
    kernel_size: int = PAPER_KERNEL_SIZE,
    kernel_stride: int = PAPER_KERNEL_STRIDE,
    out: Any = None,
) -> np.ndarray:
    """``kvselect.nsa_block_scores`` in float64 (packed: each sequence's dense rows, then
    NaN to the longest sequence's blocks; ``window="eq9"``: the paper's Eq. 9)."""
    geo = _window(window, _block_size(block_size), kernel_size, kernel_stride, cu_seqlens, cu_seqlens_q)
    if geo is not None:
        return _eq9_scores(q, k, geo, init_blocks, local_blocks, scale, k_scale, query_format, key_format)
    if cu_seqlens is not None or cu_seqlens_q is not None:
        kw = dict(block_size=block_size, init_blocks=init_blocks, local_blocks=local_blocks, scale=scale)
        return _packed(nsa_block_scores, np.nan, q, k, k_scale, query_format, key_format, cu_seqlens, cu_seqlens_q, kw)
    bs = _block_size(block_size)
    ck = nsa_compress_keys(k, block_size=bs, k_scale=k_scale, key_format=key_format)
    seq_len = decode(k, key_format, "key_format", name="k").shape[0]
    return _from_compressed(q, ck, seq_len, (bs, bs, bs), init_blocks, local_blocks, scale, query_format, "k")


def _from_compressed(
    q: Any,
    ck: np.ndarray,
    seq_len: int,
    geo: Tuple[int, int, int],
    init_blocks: Any,
    local_blocks: Any,
    scale: Any,
    qf: Any,
    key_arg: str,
) -> np.ndarray:
    """The block scores from the compressed keys ``ck`` (float64) of ``seq_len`` tokens:
    stage 1 (InfLLM-v2's ``group_scores``), the forced blocks ``+inf``, block ``b < IC``
    its window's score (fla's: its own key's group sum; Eq. 9's pooled sum), the rest
    ``-inf``. ``geo`` is ``(block_size, kernel_size, kernel_stride)``."""
    bs, kz, st = geo
    init, local = _count("init_blocks", init_blocks), _count("local_blocks", local_blocks)
    qa = decode(q, qf, "query_format", name="q")
    if qa.ndim == 3 and ck.ndim == 3 and qa.shape[2] != ck.shape[2]:
        raise ReferenceSelectionError(key_arg, f"{key_arg} has d={ck.shape[2]} but q has d={qa.shape[2]}")
    s = group_scores(q, ck, seq_len, scale=scale, query_format=qf, kernel_size=kz, kernel_stride=st)
    n_q, h, _ = s.shape
    nb = -(-seq_len // bs)
    out = np.full((n_q, h, nb), -np.inf)
    for i in range(n_q):
        ic = (seq_len - n_q + i) // bs
        for b in range(nb):
            if forced(b, ic, init, local):
                out[i, :, b] = np.inf
            elif b < ic and kz == st == bs:
                out[i, :, b] = s[i, :, b]
            elif b < ic:
                for g in range(h):
                    out[i, g, b] = eq9_pool(s[i, g], b, bs // st, kz // st)
    return out


@_takes_out(np.float32)
def nsa_block_scores_compressed(
    q: Any,
    ck: Any,
    seq_len: int,
    *,
    block_size: int = BLOCK_SIZE,
    init_blocks: int = INIT_BLOCKS,
    local_blocks: int = LOCAL_BLOCKS,
    scale: Optional[float] = None,
    ck_scale: Any = None,
    query_format: Optional[str] = None,
    key_format: Optional[str] = None,
    window: str = "fla",
    kernel_size: int = PAPER_KERNEL_SIZE,
    kernel_stride: int = PAPER_KERNEL_STRIDE,
    cu_seqlens_q: Any = None,
    cu_seqlens_k: Any = None,
    out: Any = None,
) -> np.ndarray:
    """``kvselect.nsa_block_scores_compressed`` in float64: the block scores from given
    compressed keys ``ck`` ``[n_c, n_kv_heads, d]`` (each row times its ``ck_scale``,
    the product rounded to float32), ``n_c`` exactly the window's compressed keys of
    ``seq_len`` tokens. Packed (``cu_seqlens_q`` and ``cu_seqlens_k``, ``seq_len`` one
    length per sequence): each sequence's dense rows, then NaN to the longest sequence's
    blocks (InfLLM-v2's packed batch, checked by ``reference.infllm.packed_sequences``)."""
    bs = _block_size(block_size)
    geo = _window(window, bs, kernel_size, kernel_stride, None, None) or (bs, bs, bs)
    if cu_seqlens_q is not None or cu_seqlens_k is not None:
        kw = dict(block_size=bs, init_blocks=init_blocks, local_blocks=local_blocks, scale=scale, window=window)
        kw.update(kernel_size=kernel_size, kernel_stride=kernel_stride)
        return _compressed_packed(
            q, ck, seq_len, ck_scale, query_format, key_format, (cu_seqlens_q, cu_seqlens_k), geo, kw
        )
    n = _count("seq_len", seq_len)
    if n == 0:
        raise ReferenceSelectionError("seq_len", "seq_len must be at least 1 (the query's own token)")
    if n > _I32_MAX:
        raise ReferenceSelectionError("seq_len", f"seq_len is too large: at most {_I32_MAX}")
    ca = decode(ck, key_format, "key_format", name="ck")
    n_c = compressed_len(n, geo[1], geo[2])
    if ca.ndim != 3 or ca.shape[0] != n_c:
        raise ReferenceSelectionError("ck", f"ck must be [n_c={n_c}, n_kv_heads, d] for seq_len {n}, got {ca.shape}")
    if ck_scale is not None:
        sc = _scales("ck_scale", ck_scale)
        if sc.shape != (n_c,):
            raise ReferenceSelectionError("ck_scale", f"ck_scale must be [n_c={n_c}]")
        ca = (ca.astype(np.float32) * sc[:, None, None]).astype(np.float64)
    qa = decode(q, query_format, "query_format", name="q")
    if qa.ndim == 3 and len(qa) > n:
        raise ReferenceSelectionError("q", f"{len(qa)} queries but seq_len = {n}")
    return _from_compressed(q, ca.astype(np.float64), n, geo, init_blocks, local_blocks, scale, query_format, "ck")


@_takes_out(np.int32)
def nsa_select_compressed(
    q: Any,
    ck: Any,
    seq_len: int,
    block_counts: int = BLOCK_COUNTS,
    *,
    out: Any = None,
    **kw: Any,
) -> np.ndarray:
    """``kvselect.nsa_select_compressed`` in exact arithmetic: the rows of
    :func:`nsa_block_scores_compressed`'s scores (keyword arguments as there)."""
    n = _count("block_counts", block_counts)
    if n == 0:
        raise ReferenceSelectionError("block_counts", "block_counts must be at least 1 block")
    scores = nsa_block_scores_compressed(q, ck, seq_len, **kw)
    if kw.get("cu_seqlens_q") is None and kw.get("cu_seqlens_k") is None:
        return _rows(scores, n)
    # Packed: each query ranks its own sequence's blocks only. The NaN past them is the
    # row's padding, not a score (a NaN score is a candidate, after every number).
    bs = _block_size(kw.get("block_size", BLOCK_SIZE))
    lens, cu_q = _int_list("seq_len", seq_len), _int_list("cu_seqlens_q", kw["cu_seqlens_q"])
    widths = [-(-lens[s] // bs) for s in range(len(lens)) for _ in range(cu_q[s], cu_q[s + 1])]
    return _rows(scores, n, widths)


def _compressed_packed(
    q: Any,
    ck: Any,
    seq_len: Any,
    ck_scale: Any,
    qf: Any,
    kf: Any,
    cu: Tuple[Any, Any],
    geo: Tuple[int, int, int],
    kw: dict,
) -> np.ndarray:
    """:func:`nsa_block_scores_compressed` on each sequence of a packed batch, rows
    concatenated and padded with NaN to the longest sequence's blocks."""
    qa = decode(q, qf, "query_format", name="q")
    ka = decode(ck, kf, "key_format", name="ck")
    if qa.ndim != 3 or ka.ndim != 3:
        raise ReferenceSelectionError("q" if qa.ndim != 3 else "ck", "q and ck must be 3-D")
    if qa.shape[2] != ka.shape[2]:
        raise ReferenceSelectionError("ck", f"ck has d={ka.shape[2]} but q has d={qa.shape[2]}")
    seqs = _compressed_sequences(qa, ka, seq_len, cu[0], cu[1], kernel_size=geo[1], kernel_stride=geo[2])
    sc = None if ck_scale is None else _scales("ck_scale", ck_scale)
    if sc is not None and sc.shape != (len(ka),):
        raise ReferenceSelectionError("ck_scale", f"ck_scale must be [n_c={len(ka)}]")
    width = max((-(-n // geo[0]) for *_, n in seqs), default=0)
    out = np.full((len(qa), ka.shape[1], width), np.nan)
    for _, q0, q1, c0, c1, n in seqs:
        if q1 > q0:
            part = nsa_block_scores_compressed(
                qa[q0:q1], ka[c0:c1], n, ck_scale=None if sc is None else sc[c0:c1], **kw
            )
            out[q0:q1, :, : part.shape[2]] = part
    return out


@_takes_out(np.float32)
def nsa_block_scores_paged(
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
    """``kvselect.nsa_block_scores_paged`` in float64: sequence ``s``'s compressed keys
    gathered through its block-table row (``kvselect.reference.infllm.gather_paged``:
    key ``j`` in row ``j % page`` of page ``block_table[s, j // page]``, fp8 keys times
    their scales rounded to float32), its one query at its last token,
    :func:`nsa_block_scores_compressed`'s row on them, then NaN to the longest
    sequence's blocks. Keyword arguments as there (``block_size``, the window, ...)."""
    h = _count("n_kv_heads", n_kv_heads)
    lens = _int_list("seq_lens", seq_lens)
    cache, table = _paged(kv_cache, block_table, len(lens), h, page_layout)
    bs = _block_size(kw.get("block_size", BLOCK_SIZE))
    geo = _window(
        kw.get("window", "fla"),
        bs,
        kw.get("kernel_size", PAPER_KERNEL_SIZE),
        kw.get("kernel_stride", PAPER_KERNEL_STRIDE),
        None,
        None,
    ) or (bs, bs, bs)
    qa = decode(q, query_format, "query_format", name="q")
    if (
        qa.ndim != 3
        or qa.shape[0] != len(lens)
        or qa.shape[2] * h != (cache.shape[2] - 4 * (page_layout == "fp8_scaled"))
    ):
        raise ReferenceSelectionError("q", f"q must be [n_seqs={len(lens)}, n_q_heads, d], got {qa.shape}")
    page, n_pages = cache.shape[1], cache.shape[0]
    for s, n in enumerate(lens):
        if not 1 <= n <= _I32_MAX:
            raise ReferenceSelectionError(
                "seq_lens", f"seq_lens[{s}] = {n}: a decoding query's sequence holds 1 ..= {_I32_MAX} tokens"
            )
    nb = max((-(-n // bs) for n in lens), default=0)
    out = np.full((len(lens), h, nb), np.nan)
    for s, n in enumerate(lens):
        n_c = compressed_len(n, geo[1], geo[2])
        _table_row(table, s, -(-n_c // page), n_pages, f"sequence {s}'s {n_c} compressed keys")
        ck = gather_paged(cache, table, s, n_c, h, page_layout, key_format)
        row = nsa_block_scores_compressed(qa[s : s + 1], ck, n, **kw)[0]
        out[s, :, : row.shape[1]] = row
    return out


@_takes_out(np.int32)
def nsa_select_paged(
    q: Any,
    kv_cache: Any,
    block_table: Any,
    seq_lens: Any,
    n_kv_heads: int,
    block_counts: int = BLOCK_COUNTS,
    *,
    out: Any = None,
    **kw: Any,
) -> np.ndarray:
    """``kvselect.nsa_select_paged`` in exact arithmetic: the rows of
    :func:`nsa_block_scores_paged`'s scores (each sequence's own blocks; keyword
    arguments as there)."""
    n = _count("block_counts", block_counts)
    if n == 0:
        raise ReferenceSelectionError("block_counts", "block_counts must be at least 1 block")
    scores = nsa_block_scores_paged(q, kv_cache, block_table, seq_lens, n_kv_heads, **kw)
    # Each sequence's own blocks only: the NaN past them is padding, not a score.
    bs = _block_size(kw.get("block_size", BLOCK_SIZE))
    return _rows(scores, n, [-(-length // bs) for length in _int_list("seq_lens", seq_lens)])


def _rows(b: np.ndarray, n: int, widths: Optional[List[int]] = None) -> np.ndarray:
    """Each row's top ``n`` (:func:`select_row`), ``-1`` padded; with ``widths``, row
    ``i`` ranks its first ``widths[i]`` blocks only (a packed or paged row's own)."""
    n_q, h, nb = b.shape
    out = np.full((n_q, h, n), -1, np.int32)
    for i in range(n_q):
        w = nb if widths is None else widths[i]
        for g in range(h):
            r = select_row(b[i, g, :w], n)
            out[i, g, : len(r)] = r
    return out


def select_row(scores: np.ndarray, block_counts: int) -> np.ndarray:
    """One row: the top ``block_counts`` candidates (scores above ``-inf``) in the order,
    ascending."""
    cand = order(scores)
    cand = cand[scores[cand] != -np.inf]
    return np.sort(cand[:block_counts])


@_takes_out(np.int32)
def nsa_select(
    q: Any,
    k: Any,
    block_counts: int = BLOCK_COUNTS,
    *,
    block_size: int = BLOCK_SIZE,
    init_blocks: int = INIT_BLOCKS,
    local_blocks: int = LOCAL_BLOCKS,
    scale: Optional[float] = None,
    k_scale: Any = None,
    query_format: Optional[str] = None,
    key_format: Optional[str] = None,
    cu_seqlens: Any = None,
    cu_seqlens_q: Any = None,
    window: str = "fla",
    kernel_size: int = PAPER_KERNEL_SIZE,
    kernel_stride: int = PAPER_KERNEL_STRIDE,
    out: Any = None,
) -> np.ndarray:
    """``kvselect.nsa_select`` in exact arithmetic (float64 scores); packed: each
    sequence's dense rows; ``window="eq9"``: the paper's Eq. 9 scores."""
    n = _count("block_counts", block_counts)
    if n == 0:
        raise ReferenceSelectionError("block_counts", "block_counts must be at least 1 block")
    _window(window, _block_size(block_size), kernel_size, kernel_stride, cu_seqlens, cu_seqlens_q)
    if cu_seqlens is not None or cu_seqlens_q is not None:
        kw = dict(block_size=block_size, init_blocks=init_blocks, local_blocks=local_blocks, scale=scale)
        kw["block_counts"] = n
        return _packed(nsa_select, -1, q, k, k_scale, query_format, key_format, cu_seqlens, cu_seqlens_q, kw)
    b = nsa_block_scores(
        q,
        k,
        block_size=block_size,
        init_blocks=init_blocks,
        local_blocks=local_blocks,
        scale=scale,
        k_scale=k_scale,
        query_format=query_format,
        key_format=key_format,
        window=window,
        kernel_size=kernel_size,
        kernel_stride=kernel_stride,
    )
    return _rows(b, n)


def nsa_score_bound(
    q: Any,
    k: Any,
    *,
    block_size: int = BLOCK_SIZE,
    scale: Optional[float] = None,
    k_scale: Any = None,
    query_format: Optional[str] = None,
    key_format: Optional[str] = None,
    exp_rel_err: Optional[float] = None,
) -> Tuple[np.ndarray, float]:
    """The core's error bound (src/nsa/mod.rs): ``(R [n_q, n_kv_heads], T)``, every float32
    block score within ``R * S + T`` of the exact ``S``.

    Per logit: ``e_c = |scale| (gamma_d + (1 + gamma_d)(gamma_bs (1 + u) + u)) (1 + u)
    sum_i |q_i| m_ci + u |s_c|``, ``m_c`` the mean of ``|k|`` over block ``c``; then
    InfLLM-v2's ``group_ratio`` (``exp_rel_err`` None: the project's ``exp`` bound,
    docs/kernels.md); ``T = 2 G 2^-123``."""
    bs = _block_size(block_size)
    ck = nsa_compress_keys(k, block_size=bs, k_scale=k_scale, key_format=key_format)
    kabs = np.abs(decode(k, key_format, "key_format", name="k"))
    if k_scale is not None:
        kabs = np.abs(kabs.astype(np.float32) * _scales("k_scale", k_scale)[:, None, None]).astype(np.float64)
    seq_len = kabs.shape[0]
    m = kabs[: ck.shape[0] * bs].reshape(ck.shape[0], bs, *kabs.shape[1:]).mean(axis=1)
    qa = decode(q, query_format, "query_format", name="q")
    if qa.ndim != 3 or qa.shape[2] != ck.shape[2] or qa.shape[1] % ck.shape[1]:
        raise ReferenceSelectionError("q", f"q of shape {qa.shape} does not fit k")
    n_q, hq, d = qa.shape
    h = ck.shape[1]
    gs = hq // h
    sc = float(np.float32(1.0 / np.sqrt(d))) if scale is None else float(np.float32(scale))
    widen = (gamma(d) + (1 + gamma(d)) * (gamma(bs) * (1 + _U) + _U)) * (1 + _U)
    out = np.zeros((n_q, h))
    for i in range(n_q):
        nv = (seq_len - n_q + i + 1) // bs
        if nv == 0:
            continue
        for g in range(h):
            qg = qa[i, g * gs : (g + 1) * gs]
            s = (qg @ ck[:nv, g].T) * sc
            e = abs(sc) * widen * (np.abs(qg) @ m[:nv, g].T) + _U * np.abs(s)
            out[i, g] = group_ratio(s, e) if exp_rel_err is None else group_ratio(s, e, exp_rel_err)
    return out, 2 * gs * 2.0**-123


def nsa_rows_within_bound(
    rows: np.ndarray, scores: np.ndarray, bound: Tuple[np.ndarray, float], block_counts: int
) -> np.ndarray:
    """Which of ``rows`` (``[n_q, h, block_counts]``, a kernel's) are right: distinct,
    ascending, ``-1`` padded, as many ids as the exact row, and equal to it but for swaps
    between blocks whose exact scores ``S`` lie within ``R (S_b + S_c) + 2T``. Returns
    ``[n_q, h]`` bool."""
    R, T = bound
    n_q, h, _ = scores.shape
    ok = np.zeros((n_q, h), bool)
    for i in range(n_q):
        for g in range(h):
            row = rows[i, g]
            ids = row[row >= 0]
            want = select_row(scores[i, g], block_counts)
            if len(ids) != len(want) or np.any(row[len(ids) :] != -1) or np.any(np.diff(ids) <= 0):
                continue
            s = scores[i, g]
            if np.any(ids >= len(s)) or np.any(s[ids] == -np.inf):
                continue
            extra, missing = np.setdiff1d(ids, want), np.setdiff1d(want, ids)
            ok[i, g] = all(scores_near(s[b], s[c], float(R[i, g]), T) for b in extra for c in missing)
    return ok


def packed_sequences(n_q: int, n_k: int, cu_seqlens: Any, cu_seqlens_q: Any) -> List[Tuple[int, int, int, int]]:
    """A packed batch's sequences as the core checks them: ``(q0, q1, k0, k1)`` each,
    sequence ``s`` keys ``cu_seqlens[s] ..`` (default one sequence of all ``n_k`` keys)
    and queries ``cu_seqlens_q[s] ..`` (default ``cu_seqlens``), the last of its keys."""

    def cu(argument: str, c: Any, n: int) -> List[int]:
        v = _int_list(argument, c)
        if not v or v[0] != 0 or v[-1] != n or any(b < a for a, b in zip(v, v[1:])):
            raise ReferenceSelectionError(argument, f"{argument} must rise from 0 to {n}, got {v}")
        return v

    ck = cu("cu_seqlens", cu_seqlens, n_k) if cu_seqlens is not None else [0, n_k]
    cq = cu("cu_seqlens_q", cu_seqlens_q, n_q) if cu_seqlens_q is not None else ck
    if len(cq) != len(ck) or any(b - a > d - c for a, b, c, d in zip(cq, cq[1:], ck, ck[1:])):
        raise ReferenceSelectionError("cu_seqlens_q", "cu_seqlens_q: each sequence's queries are the last of its keys")
    return [(cq[s], cq[s + 1], ck[s], ck[s + 1]) for s in range(len(ck) - 1)]


def _packed(
    fn: Any, pad: float, q: Any, k: Any, k_scale: Any, qf: Any, kf: Any, cu: Any, cq: Any, kw: dict
) -> np.ndarray:
    """``fn`` (the dense twin) on each sequence with queries, rows concatenated, padded
    with ``pad``."""
    qa, ka = decode(q, qf, "query_format", name="q"), decode(k, kf, "key_format", name="k")
    if qa.ndim != 3 or ka.ndim != 3:
        raise ReferenceSelectionError("q" if qa.ndim != 3 else "k", "q and k must be 3-D")
    sc = None if k_scale is None else _scales("k_scale", k_scale)
    if sc is not None and sc.shape != (len(ka),):
        raise ReferenceSelectionError("k_scale", f"k_scale must be [n_keys={len(ka)}]")
    seqs = packed_sequences(len(qa), len(ka), cu, cq)
    bs = _block_size(kw["block_size"])
    dtype: Any = np.int32 if fn is nsa_select else np.float64
    if fn is nsa_select:
        width = kw["block_counts"]
    else:
        width = max((-(-(k1 - k0) // bs) for _, _, k0, k1 in seqs), default=0)
    out = np.full((len(qa), ka.shape[1], width), pad, dtype)
    for q0, q1, k0, k1 in seqs:
        if q1 > q0:
            part = fn(qa[q0:q1], ka[k0:k1], k_scale=None if sc is None else sc[k0:k1], **kw)
            out[q0:q1, :, : part.shape[2]] = part
    return out


def _window(
    window: str, bs: int, kernel_size: Any, kernel_stride: Any, cu: Any, cq: Any
) -> Optional[Tuple[int, int, int]]:
    """``None`` for fla's window; Eq. 9's ``(block_size, kernel_size, kernel_stride)``,
    checked as the core checks them."""
    if window not in ("fla", "eq9"):
        raise ReferenceSelectionError("window", f"window must be 'fla' or 'eq9', got {window!r}")
    if window == "fla":
        return None
    if cu is not None or cq is not None:
        raise ReferenceSelectionError("window", "window='eq9' has no packed form")
    kz, st = _count("kernel_size", kernel_size), _count("kernel_stride", kernel_stride)
    if st == 0 or bs % st:
        raise ReferenceSelectionError("kernel_stride", f"kernel_stride ({st}) must divide block_size ({bs})")
    if kz == 0 or kz % st:
        raise ReferenceSelectionError("kernel_size", f"kernel_size ({kz}) must be a positive multiple of kernel_stride")
    return bs, kz, st


def eq9_compress_keys(
    k: Any, kernel_size: int, kernel_stride: int, *, k_scale: Any = None, key_format: Optional[str] = None
) -> Tuple[np.ndarray, np.ndarray]:
    """Eq. 9's compressed keys ``[(n - l) // d + 1, h, dim]`` (float64, exact): key ``c``
    the mean of tokens ``c d .. c d + l``, each key's float32 value times its token's
    scale; and the means of ``|k|`` over the same windows (the bound's ``m``)."""
    ka = decode(k, key_format, "key_format", name="k")
    if ka.ndim != 3 or ka.shape[0] == 0:
        raise ReferenceSelectionError("k", f"k must be 3-D [seq_len >= 1, n_kv_heads, d], got shape {ka.shape}")
    if k_scale is not None:
        sc = _scales("k_scale", k_scale)
        if sc.shape != (ka.shape[0],):
            raise ReferenceSelectionError("k_scale", f"k_scale must be [seq_len={ka.shape[0]}]")
        ka = (ka.astype(np.float32) * sc[:, None, None]).astype(np.float64)
    n_c = compressed_len(len(ka), kernel_size, kernel_stride)
    ck = np.zeros((n_c,) + ka.shape[1:])
    m = np.zeros_like(ck)
    for c in range(n_c):
        w = ka[c * kernel_stride : c * kernel_stride + kernel_size]
        ck[c], m[c] = w.mean(axis=0), np.abs(w).mean(axis=0)
    return ck, m


def eq9_pool(sums: np.ndarray, j: int, per_block: int, per_kernel: int) -> float:
    """Eq. 9: ``sum_{m < l'/d} sum_{n < l/d} p[(l'/d) j - m - n]`` over the group sums
    ``sums`` (0 where the query does not see the key; indices below 0 add nothing)."""
    return float(
        sum(
            sums[i]
            for m in range(per_block)
            for n in range(per_kernel)
            if 0 <= (i := per_block * j - m - n) < len(sums)
        )
    )


def _eq9_scores(
    q: Any,
    k: Any,
    geo: Tuple[int, int, int],
    init_blocks: Any,
    local_blocks: Any,
    scale: Any,
    k_scale: Any,
    qf: Any,
    kf: Any,
) -> np.ndarray:
    ck, _ = eq9_compress_keys(k, geo[1], geo[2], k_scale=k_scale, key_format=kf)
    seq_len = decode(k, kf, "key_format", name="k").shape[0]
    return _from_compressed(q, ck, seq_len, geo, init_blocks, local_blocks, scale, qf, "k")


def eq9_score_bound(
    q: Any,
    k: Any,
    *,
    block_size: int = BLOCK_SIZE,
    kernel_size: int = PAPER_KERNEL_SIZE,
    kernel_stride: int = PAPER_KERNEL_STRIDE,
    scale: Optional[float] = None,
    k_scale: Any = None,
    query_format: Optional[str] = None,
    key_format: Optional[str] = None,
    exp_rel_err: Optional[float] = None,
) -> Tuple[np.ndarray, float]:
    """The core's bound for Eq. 9's block scores (src/nsa/mod.rs): ``nsa_score_bound``'s
    with the compressed key a mean of ``kernel_size`` tokens (``gamma_l`` for
    ``gamma_bs``), then the float32 sum of ``A = (l'/d)(l/d)`` group sums: ``R' = (1 +
    R)(1 + gamma_A) - 1``, ``T' = A T (1 + gamma_A)``."""
    bs, kz, st = _window("eq9", _block_size(block_size), kernel_size, kernel_stride, None, None) or (0, 0, 0)
    ck, m = eq9_compress_keys(k, kz, st, k_scale=k_scale, key_format=key_format)
    seq_len = decode(k, key_format, "key_format", name="k").shape[0]
    qa = decode(q, query_format, "query_format", name="q")
    if qa.ndim != 3 or qa.shape[2] != ck.shape[2] or qa.shape[1] % ck.shape[1]:
        raise ReferenceSelectionError("q", f"q of shape {qa.shape} does not fit k")
    n_q, hq, d = qa.shape
    h = ck.shape[1]
    gs = hq // h
    sc = float(np.float32(1.0 / np.sqrt(d))) if scale is None else float(np.float32(scale))
    widen = (gamma(d) + (1 + gamma(d)) * (gamma(kz) * (1 + _U) + _U)) * (1 + _U)
    a = (bs // st) * (kz // st)
    out = np.zeros((n_q, h))
    for i in range(n_q):
        nv = compressed_len(seq_len - n_q + i + 1, kz, st)
        if nv == 0:
            continue
        for g in range(h):
            qg = qa[i, g * gs : (g + 1) * gs]
            s = (qg @ ck[:nv, g].T) * sc
            e = abs(sc) * widen * (np.abs(qg) @ m[:nv, g].T) + _U * np.abs(s)
            r = group_ratio(s, e) if exp_rel_err is None else group_ratio(s, e, exp_rel_err)
            out[i, g] = ((1 + r) * (1 + gamma(a)) - 1) * (1 + 1e-9)
    return out, a * 2 * gs * 2.0**-123 * (1 + gamma(a))
