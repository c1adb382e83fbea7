"""MInference's vertical-slash estimate in plain NumPy (float64), written from
the source: microsoft/MInference @fb56c917
``minference/modules/minference_forward.py`` ``vertical_and_slash_kernel``
(and ``search_pattern_v2``'s copy, ``variant="search"``) for the selection,
``csrc/vertical_slash_index.cu`` ``convert_vertical_slash_indexes_kernel``
for the engines' per-block layout.

For one query head over ``L`` keys: the last ``n = min(64, L)`` queries'
scores ``q . k / sqrt(d)`` (``"search"``: unscaled), query ``L - n + i``
seeing keys ``0 ..= L - n + i``; each row's softmax; ``vertical[c]`` the
column sums, ``slash[o]`` the sums along ``query - key = o``; columns
``< 30`` and offsets ``< 100`` (``"search"``: 30) forced; the top
``min(L, max(v, 30))`` columns and ``min(L, max(s, 50))`` offsets, score
descending, ties to the lower id (so of the forced offsets the nearest).

The native core computes in float32; :func:`vslash_error_bounds` gives, per
candidate, a rigorous bound on the distance between the core's float32 sum
and the exact one (module docs of ``src/vslash/``), so a comparison can
treat candidates within it as tied. The bound on the core's ``exp`` is an
argument (``kvselect._core._exp_bound()``): this module imports nothing
native.
"""

from __future__ import annotations

import math
from typing import Any, List, Optional, Tuple

import numpy as np

from ._args import ReferenceSelectionError, _index_array, _scales, _takes_out
from .keys import decode

LAST_Q = 64
FORCED_COLUMNS = 30
MIN_SLASHES = 50
LAYOUT_BLOCK = 64
_U = 2.0**-24


def forced_slashes(variant: str) -> int:
    """Offsets forced: 100 (``"kernel"``), 30 (``"search"``)."""
    if variant not in ("kernel", "search"):
        raise ReferenceSelectionError("variant", f"variant must be 'kernel' or 'search', got {variant!r}")
    return 100 if variant == "kernel" else 30


def vslash_sizes(seq_len: int, vertical_size: int, slash_size: int) -> Tuple[int, int]:
    """``(min(L, max(v, 30)), min(L, max(s, 50)))``."""
    return min(seq_len, max(vertical_size, FORCED_COLUMNS)), min(seq_len, max(slash_size, MIN_SLASHES))


def _inputs(q: Any, keys: Any, key_scale: Optional[Any], key_format: Optional[str]) -> Tuple[np.ndarray, np.ndarray]:
    k = decode(keys, key_format, "key_format", name="keys")
    if k.ndim != 3:
        raise ReferenceSelectionError("keys", f"keys must be 3-D [seq_len, n_kv_heads, d], got {k.ndim}-D")
    qa = np.asarray(q)
    if qa.dtype.kind != "f":
        raise TypeError(f"q must hold floats, got dtype {qa.dtype}")
    qa = qa.astype(np.float32).astype(np.float64)
    n = min(LAST_Q, k.shape[0])
    if qa.ndim != 3 or qa.shape[1:] != (n, k.shape[2]):
        raise ReferenceSelectionError("q", f"q must be [n_heads, {n}, {k.shape[2]}], got {qa.shape}")
    if key_scale is not None:  # (after q, which the keys' shape is checked against first, as natively)
        s = _scales("key_scale", key_scale)
        if len(s) != k.shape[0]:
            raise ReferenceSelectionError("key_scale", f"key_scale must be [seq_len={k.shape[0]}], got [{len(s)}]")
        k = (k.astype(np.float32) * s[:, None, None]).astype(np.float64)  # fl32(k * scale)
    return qa, k


def _head_scores(qh: np.ndarray, kh: np.ndarray, scale: float) -> np.ndarray:
    """``[n, L]`` scores, ``-inf`` past each query."""
    L, n = kh.shape[0], qh.shape[0]
    s = (qh @ kh.T) * scale
    cols = np.arange(L)[None, :]
    return np.where(cols <= (L - n + np.arange(n))[:, None], s, -np.inf)


def _sums(p: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Column and diagonal sums of ``[n, L]`` row values (0 past each query)."""
    n, L = p.shape
    v = p.sum(axis=0)
    s = np.zeros(L)
    for i in range(n):
        pos = L - n + i
        s[: pos + 1] += p[i, pos::-1]  # offset o = pos - c
    return v, s


def vslash_scores(
    q: Any,
    keys: Any,
    *,
    variant: str = "kernel",
    key_scale: Optional[Any] = None,
    key_format: Optional[str] = None,
) -> Tuple[np.ndarray, np.ndarray]:
    """The exact column sums ``[n_heads, L]`` and diagonal sums by offset
    ``[n_heads, L]`` (float64), before anything is forced."""
    forced_slashes(variant)
    qa, k = _inputs(q, keys, key_scale, key_format)
    h, d = qa.shape[0], qa.shape[2]
    hk = k.shape[1]
    scale = 1.0 / math.sqrt(d) if variant == "kernel" else 1.0
    v_out, s_out = np.zeros((h, k.shape[0])), np.zeros((h, k.shape[0]))
    for j in range(h):
        s = _head_scores(qa[j], k[:, j // (h // hk)], scale)
        e = np.exp(s - s.max(axis=1, keepdims=True))
        v_out[j], s_out[j] = _sums(e / e.sum(axis=1, keepdims=True))
    return v_out, s_out


def _gamma(m: float) -> float:
    return m * _U / (1 - m * _U)


def vslash_error_bounds(
    q: Any,
    keys: Any,
    exp_bound: Tuple[float, float],
    *,
    variant: str = "kernel",
    key_scale: Optional[Any] = None,
    key_format: Optional[str] = None,
) -> Tuple[np.ndarray, np.ndarray]:
    """Per candidate, a bound on ``|core's float32 sum - exact sum|``: ``(err_vertical,
    err_slash)``, each ``[n_heads, L]``. ``exp_bound`` is the core's ``exp``
    bound ``(rel_err, lo)`` (``kvselect._core._exp_bound()``).

    Each score ``s`` is within ``E = A (gamma_d (1 + u)^2 + 2u + u^2)`` of the
    computed one (``A = sum |q_k k_k| / sqrt(d)``; unscaled: ``A gamma_d``); each
    ``e`` within a factor ``exp(+-delta)`` of ``exp(s - max)``, ``delta = E + E_max +
    u (|s - max| + 2 E_max) - ln(1 - rel_err)`` (a term whose argument may fall
    below ``lo`` is anywhere in ``[0, exp(s - max + delta)]``); the row sum within
    ``gamma_{ceil(len/8)+3}`` of the sum of those; ``1/Z`` and ``e * w`` one
    rounding each; the sums of at most 64 rows ``gamma_64``."""
    rel, lo = exp_bound
    forced_slashes(variant)
    qa, k = _inputs(q, keys, key_scale, key_format)
    h, n, d = qa.shape
    L, hk = k.shape[0], k.shape[1]
    scaled = variant == "kernel"
    scale = 1.0 / math.sqrt(d) if scaled else 1.0
    g = _gamma(d) + d * 2.0**-52  # the float32 chain, and this module's own float64 dot
    eta = g * (1 + _U) ** 2 + 2 * _U + _U**2 if scaled else g
    lam = -math.log1p(-rel)
    errs_v, errs_s = np.zeros((h, L)), np.zeros((h, L))
    for j in range(h):
        kh = k[:, j // (h // hk)]
        s = _head_scores(qa[j], kh, scale)
        a = (np.abs(qa[j]) @ np.abs(kh).T) * scale
        valid = np.isfinite(s)
        big_e = np.where(valid, a * eta, 0.0)
        m = s.max(axis=1, keepdims=True)
        e_max = big_e.max(axis=1, keepdims=True)
        gap = np.where(valid, s - m, 0.0)
        delta = big_e + e_max + _U * (np.abs(gap) + 2 * e_max) + lam
        e = np.where(valid, np.exp(gap), 0.0)
        z = e.sum(axis=1, keepdims=True)
        p = e / z
        may_flush = gap - (delta - lam) < lo
        f_hi = np.exp(delta)
        f_lo = np.where(may_flush, 0.0, np.exp(-delta))
        lens = L - n + np.arange(n) + 1
        gz = np.array([_gamma(-(-int(x) // 8) + 3) for x in lens])[:, None]
        z_hi = (1 + gz) * (p * f_hi).sum(axis=1, keepdims=True)
        z_lo = (1 - gz) * (p * f_lo).sum(axis=1, keepdims=True)
        p_hi = np.where(valid, p * f_hi * (1 + _U) ** 2 / z_lo, 0.0)
        p_lo = np.where(valid, p * f_lo * (1 - _U) ** 2 / z_hi, 0.0)
        g64 = _gamma(64)
        # Float32 sums of products that may be subnormal: an absolute 2^-140
        # a term per operation covers their rounding (and this module's own).
        tiny = 2.0**-130
        for which, out in ((0, errs_v), (1, errs_s)):
            exact = _sums(p)[which]
            hi_sum = _sums(p_hi)[which] * (1 + g64) + tiny
            lo_sum = _sums(p_lo)[which] * (1 - g64) - tiny
            out[j] = np.maximum(hi_sum - exact, exact - lo_sum) + 1e-13 * exact
    return errs_v, errs_s


def _top(scores: np.ndarray, k: int) -> np.ndarray:
    order = np.lexsort((np.arange(len(scores)), -scores))
    return np.sort(order[:k]).astype(np.int32)


def vslash_select(
    q: Any,
    keys: Any,
    vertical_size: int,
    slash_size: int,
    *,
    variant: str = "kernel",
    key_scale: Optional[Any] = None,
    key_format: Optional[str] = None,
) -> Tuple[np.ndarray, np.ndarray]:
    """The exact selection: columns ``[n_heads, nv]`` and offsets ``[n_heads, ns]``,
    each ascending (the native :func:`kvselect.vslash_select`'s signature)."""
    fs = forced_slashes(variant)
    v, s = vslash_scores(q, keys, variant=variant, key_scale=key_scale, key_format=key_format)
    L = v.shape[1]
    nv, ns = vslash_sizes(L, vertical_size, slash_size)
    v[:, :FORCED_COLUMNS] = np.inf
    s[:, :fs] = np.inf
    return (
        np.array([_top(r, nv) for r in v], np.int32).reshape(len(v), nv),
        np.array([_top(r, ns) for r in s], np.int32).reshape(len(s), ns),
    )


def _pair(vertical: Any, slash: Any) -> Tuple[np.ndarray, np.ndarray]:
    """``vertical`` ``[n_heads, nv]`` and ``slash`` ``[n_heads, ns]`` integers, as int64,
    checked as natively (vertical first; a slash of other heads is the one named)."""
    v = _index_array("vertical", vertical, 2, "selection")
    s = _index_array("slash", slash, 2, "selection")
    if s.shape[0] != v.shape[0]:
        raise ReferenceSelectionError("slash", f"slash must be [n_heads={v.shape[0]}, ns], got {list(s.shape)}")
    return v, s


@_takes_out(np.int32)
def vslash_rows(vertical: Any, slash: Any, seq_len: int, positions: Any, *, out: Any = None) -> np.ndarray:
    """Each query position's positions: the columns ``<= p`` and the keys ``p - o
    >= 0``, ascending, distinct, -1 padded: ``[n_heads, n_positions, nv + ns]``."""
    v, s = _pair(vertical, slash)
    pos = _index_array("positions", positions, 1, "selection")
    rows = np.full((v.shape[0], len(pos), v.shape[1] + s.shape[1]), -1, np.int32)
    for h in range(v.shape[0]):
        for j, p in enumerate(pos):
            row = np.union1d(v[h][v[h] <= p], p - s[h][s[h] <= p])
            rows[h, j, : len(row)] = row
    return rows


def vslash_layout(vertical: Any, slash: Any, seq_len: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``convert_vertical_slash_indexes``' layout (64-query blocks, 64-key blocks):
    ``(block_count [H, nb], block_offset [H, nb, ns], column_count [H, nb],
    column_index [H, nb, nv])``, unused slots 0, read from the CUDA kernel: per
    query block ``[start, end)``, columns ascending and offsets descending, the
    offsets ``>= end`` skipped; each offset's key range ``[end - o - 64, end - o)``
    (its end at least 64), merged in order (an end within 64 past the current
    range extends it by 64, a farther one closes it); a column below the current
    range listed, one inside it dropped."""
    v, s = _pair(vertical, slash)
    v = np.sort(v, axis=1)
    s = -np.sort(-s, axis=1)
    h, nv = v.shape
    ns = s.shape[1]
    if np.any(s.min(axis=1) >= LAYOUT_BLOCK):
        raise ReferenceSelectionError("slash", "each head needs an offset below 64")
    nb = -(-seq_len // LAYOUT_BLOCK)
    bc, cc = np.zeros((h, nb), np.int32), np.zeros((h, nb), np.int32)
    bo, ci = np.zeros((h, nb, ns), np.int32), np.zeros((h, nb, nv), np.int32)
    B = LAYOUT_BLOCK
    for j in range(h):
        for m in range(nb):
            end = (m + 1) * B
            blocks: List[int] = []
            cols: List[int] = []
            offs = [int(o) for o in s[j] if o < end]
            hi = max(end - offs[0], B)
            lo = hi - B
            rest = offs[1:]
            for c in v[j]:
                while c >= hi and rest:
                    e = max(end - rest.pop(0), B)
                    if e > hi + B:
                        blocks += range(lo, hi, B)
                        lo, hi = e - B, e
                    elif e > hi:
                        hi += B
                if c >= hi:
                    break
                if c < lo:
                    cols.append(int(c))
            while rest:  # the offsets left after the last column
                e = max(end - rest.pop(0), B)
                if e > hi + B:
                    blocks += range(lo, hi, B)
                    lo, hi = e - B, e
                elif e > hi:
                    hi += B
            blocks += range(lo, hi, B)
            bc[j, m], cc[j, m] = len(blocks), len(cols)
            bo[j, m, : len(blocks)] = blocks
            ci[j, m, : len(cols)] = cols
    return bc, bo, cc, ci


def _batch_block(v: List[int], s: List[int], q: int, kv: int, causal: bool, start: int) -> Tuple[List[int], List[int]]:
    """One query block of the later ``convert_vertical_slash_indexes_kernel``
    (vLLM ``csrc/attention/vertical_slash_index.cu``, SGLang
    ``sgl-kernel/csrc/attention/vertical_slash_index.cu``): the blocks and the
    columns it lists, ``v`` ascending, ``s`` descending."""
    B = LAYOUT_BLOCK
    end = start + B
    shift = (kv - q) if causal else kv  # where the block's queries sit among the keys
    blocks: List[int] = []
    cols: List[int] = []

    def save(lo: int, hi: int) -> None:
        if lo < kv:
            blocks.extend(range(lo, min(hi, kv), B))

    # the skip loop: offsets at or past the block's reach, stopping at the last
    k = 0
    while True:
        first = s[k]
        k += 1
        if first < shift + end or k == len(s):
            break
    if first > shift + end:  # nothing reaches the block: one range after it
        lo = shift + end if causal else kv
        hi = lo + B
    else:
        hi = max(shift + end - first, B)
        lo = hi - B
    spent = shift + end + B  # the column value once the list is used up
    col, taken = v[0], 1
    done = False
    while True:
        if col < hi:
            if col < lo:
                cols.append(col)
            if taken < len(v):
                col, taken = v[taken], taken + 1
            else:
                col = spent
            continue
        more = k < len(s) and (causal or s[k] >= start)
        if more:
            e = max(shift + end - s[k], B)
            k += 1
            if not done:
                if e > hi + B:
                    save(lo, hi)
                    lo, hi = e - B, e
                elif e > hi:
                    hi += B
            continue
        if taken == len(v) or (causal and col > lo):
            if not causal and taken == len(v) and col < kv:
                cols.append(col)
            save(lo, hi)
            return blocks, cols
        if causal:
            lo, hi = shift + end, shift + end + B
        else:
            save(lo, hi)
            lo, hi = kv, kv + B
        done = True


def vslash_layout_batch(
    vertical: Any,
    slash: Any,
    q_seqlens: Any,
    kv_seqlens: Any,
    *,
    context_size: Optional[int] = None,
    causal: bool = True,
) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The later ``convert_vertical_slash_indexes`` (vLLM ``_custom_ops``, SGLang
    ``sgl_kernel``): ``vertical`` ``[B, H, nv]``, ``slash`` ``[B, H, ns]`` (sorted
    here: columns ascending, offsets descending, as vLLM's caller sorts them),
    per-sequence ``q_seqlens`` / ``kv_seqlens``; outputs ``[B, H, rows]``,
    ``[B, H, rows, ns]``, ``[B, H, rows]``, ``[B, H, rows, nv]`` with ``rows =
    ceil(context_size / 64)`` (default ``max(q_seqlens)``), zeros where the source
    writes nothing. Refuses what the native entry point refuses (no CUDA
    undefined behaviour is imitated): a column outside its sequence's keys, a
    negative offset, a length out of range, too few rows."""
    v = _index_array("vertical", vertical, np.ndim(vertical), "selection")
    s = _index_array("slash", slash, np.ndim(slash), "selection")
    ql = _index_array("q_seqlens", q_seqlens, np.ndim(q_seqlens), "selection")
    kl = _index_array("kv_seqlens", kv_seqlens, np.ndim(kv_seqlens), "selection")
    if v.ndim != 3 or min(v.shape) < 1:
        raise ReferenceSelectionError("vertical", "vertical must be [n_seqs, n_heads, nv], every axis >= 1")
    if s.ndim != 3 or s.shape[:2] != v.shape[:2] or s.shape[2] < 1:
        raise ReferenceSelectionError("slash", "slash must be [n_seqs, n_heads, ns] beside vertical")
    v, s = np.sort(v, axis=2), -np.sort(-s, axis=2)
    n, h, nv = v.shape
    ns = s.shape[2]
    for name, a, least in (("q_seqlens", ql, 0), ("kv_seqlens", kl, 1)):
        if a.shape != (n,) or np.any(a < least) or np.any(a > 2**31 - 1):
            raise ReferenceSelectionError(name, f"{name} must be {n} lengths >= {least}")
    ctx = int(ql.max()) if context_size is None else int(context_size)
    rows = -(-ctx // LAYOUT_BLOCK)
    if ctx < 0 or ctx > 2**31 - 1 or np.any(-(-ql // LAYOUT_BLOCK) > rows):
        raise ReferenceSelectionError("context_size", "fewer query blocks than a sequence's")
    if np.any(v < 0) or np.any(v >= kl[:, None, None]):
        raise ReferenceSelectionError("vertical", "a column outside its sequence's keys")
    if np.any(s < 0):
        raise ReferenceSelectionError("slash", "a negative offset")
    bc, cc = np.zeros((n, h, rows), np.int32), np.zeros((n, h, rows), np.int32)
    bo, ci = np.zeros((n, h, rows, ns), np.int32), np.zeros((n, h, rows, nv), np.int32)
    for b in range(n):
        for j in range(h):
            vl, sl = v[b, j].tolist(), s[b, j].tolist()
            for m in range(rows):
                if m * LAYOUT_BLOCK >= ql[b]:
                    break  # the source returns before writing these rows
                blocks, cols = _batch_block(vl, sl, int(ql[b]), int(kl[b]), causal, m * LAYOUT_BLOCK)
                bc[b, j, m], cc[b, j, m] = len(blocks), len(cols)
                bo[b, j, m, : len(blocks)] = blocks
                ci[b, j, m, : len(cols)] = cols
    return bc, bo, cc, ci
