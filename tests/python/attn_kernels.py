"""A sparse attention kernel in NumPy float32 arithmetic that follows a stated
model (chunked online softmax, logits and sums in float32, probabilities
optionally rounded before P·V, the output rounded to its dtype), and the same
kernel with each fault issue 40 lists planted.

Written from the kernels' structure (FlashMLA's and vLLM's Triton sparse MLA
loops: a running max, a rescale per chunk, P·V per chunk), independently of
kvselect.reference.sparse_attn: it is the engine the check judges.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

FAULTS = (
    "padding_read",
    "duplicates_other_way",
    "nan_empty_row",
    "nan_masked_first_chunk",
    "lost_rescale",
    "wrong_lse_base",
    "causal_off_by_one",
    "neighbour_entries",
)


def kernel(
    q: Any,
    k: Any,
    v: Any,
    indices: np.ndarray,
    *,
    query_pos: Optional[np.ndarray] = None,
    causal: bool = False,
    duplicates: str = "each",
    scale: Optional[float] = None,
    d_v: Optional[int] = None,
    chunk: int = 16,
    block_size: int = 1,
    p_dtype: Any = None,
    out_dtype: Any = np.float32,
    lse_base: str = "e",
    empty_lse: float = -np.inf,
    fault: Optional[str] = None,
):
    """``(out, lse)`` of sparse attention over ``indices`` ``[n, H_kv, W]``
    (query-major, one row per KV head), dense keys ``k`` ``[T, H_kv, d]``;
    ``v`` None reads ``k[..., :d_v]`` (MLA)."""
    assert fault is None or fault in FAULTS, fault
    q32 = np.asarray(q).astype(np.float32)
    k32 = np.asarray(k).astype(np.float32)
    v32 = k32[..., : (d_v or k32.shape[-1])] if v is None else np.asarray(v).astype(np.float32)
    n, H, d = q32.shape
    T, Hkv, _ = k32.shape
    dv = v32.shape[-1]
    group = H // Hkv
    sc = np.float32(1.0 / np.sqrt(d) if scale is None else scale)
    idx = np.asarray(indices).astype(np.int64)
    if fault == "neighbour_entries":  # each row also counts the previous query's entries
        prev = np.concatenate([np.full_like(idx[:1], -1), idx[:-1]])
        idx = np.concatenate([idx, prev], axis=2)
    entries = (T + block_size - 1) // block_size
    valid = (idx >= 0) & (idx < entries)
    if fault == "padding_read":  # a -1 read as an index: the last entry (a wrapped -1)
        idx = np.where(idx == -1, entries - 1, idx)
        valid = (idx >= 0) & (idx < entries)
    dup = duplicates
    if fault == "duplicates_other_way":
        dup = "once" if duplicates == "each" else "each"
    if dup == "once":
        for i in range(n):
            for g in range(Hkv):
                seen = set()
                for j in range(idx.shape[2]):
                    if valid[i, g, j]:
                        if idx[i, g, j] in seen:
                            valid[i, g, j] = False
                        seen.add(int(idx[i, g, j]))
    tok = idx[..., None] * block_size + np.arange(block_size)
    vis = valid[..., None] & (tok >= 0) & (tok < T)
    if causal:
        bound = np.asarray(query_pos)[:, None, None, None] + (1 if fault == "causal_off_by_one" else 0)
        vis &= tok <= bound
    W = tok.shape[2] * block_size
    tok = np.where(vis, tok, 0).reshape(n, Hkv, W)
    vis = vis.reshape(n, Hkv, W)
    step = block_size if block_size > 1 else chunk
    guard = fault not in ("nan_masked_first_chunk",)
    out = np.zeros((n, H, dv), dtype=np.float32)
    lse = np.zeros((n, H), dtype=np.float32)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        for h in range(H):
            g = h // group
            K = k32[tok[:, g], g]  # [n, W, d]
            V = v32[tok[:, g], g]
            s = np.einsum("nd,nld->nl", q32[:, h], K).astype(np.float32) * sc
            s = np.where(vis[:, g], s, np.float32(-np.inf))
            m = np.full(n, -np.inf, dtype=np.float32)
            acc = np.zeros((n, dv), dtype=np.float32)
            lsum = np.zeros(n, dtype=np.float32)
            for c0 in range(0, W, step):
                sc_ = s[:, c0 : c0 + step]
                mn = np.maximum(m, sc_.max(axis=1))
                if guard:
                    base = np.where(np.isfinite(mn), mn, np.float32(0))
                    alpha = np.where(np.isfinite(m), np.exp(m - base), np.float32(0)).astype(np.float32)
                    p = np.exp(sc_ - base[:, None]).astype(np.float32)
                else:  # the running max from -inf, unguarded: exp(-inf - -inf) is NaN
                    alpha = np.exp(m - mn).astype(np.float32)
                    p = np.exp(sc_ - mn[:, None]).astype(np.float32)
                pv = p if p_dtype is None else p.astype(p_dtype).astype(np.float32)
                if fault != "lost_rescale":
                    acc = acc * alpha[:, None]
                acc = acc + np.einsum("nl,nlc->nc", pv, V[:, c0 : c0 + step]).astype(np.float32)
                lsum = lsum * alpha + p.sum(axis=1, dtype=np.float32)
                m = mn
            empty = ~vis[:, g].any(axis=1)
            if fault in ("nan_empty_row", "nan_masked_first_chunk"):  # no guard: 0/0 and NaN pass through
                o = acc / lsum[:, None]
            else:
                o = np.where((lsum > 0)[:, None], acc / np.where(lsum > 0, lsum, 1)[:, None], np.float32(0))
            out[:, h] = o
            ln = (m + np.log(lsum)).astype(np.float32)
            if lse_base == "2" or fault == "wrong_lse_base":
                ln = (ln / np.float32(np.log(2.0))).astype(np.float32)
            lse[:, h] = np.where(empty, np.float32(empty_lse), ln)
    return out.astype(out_dtype), lse
