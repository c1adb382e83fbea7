"""Workloads: the query/key/value tensors a selection policy is judged on.

A :class:`Workload` is one causal, decode-style evaluation problem: per head,
the queries, keys and values of a context of ``tokens`` positions, the
positions of the queries to evaluate (a query at position ``i`` sees keys
``0..=i``), and an *approximate* indexer (``index_q`` / ``index_k``, one index
head per KV head) from which a learned top-k is drawn. Every policy is
compared at an identical token budget on the same workload, so the workload
fixes everything but the policy.

Three sources:

- :func:`synthetic`: a deterministic long-context workload with the head
  types real models show (attention sinks, local heads, retrieval heads whose
  needles sit far back, diffuse heads), generated in a second or two for the
  32K-token default, no download.
- :func:`example`: real Q/K/V of a trained transformer (all-MiniLM-L6-v2 on
  the GPL-2 licence text), shipped with the package (``kvselect/data``).
- :func:`load_npz`: your own dumps (see :mod:`kvselect.dump_hf` for a
  Hugging Face model), in the format below.

The ``.npz`` format read by :func:`load_npz`
--------------------------------------------

The one dump format of ``kvselect check`` and ``kvselect eval``
(``docs/dump-format.md`` tables every kind's keys; :mod:`kvselect.checking`
holds the loader), of the kind ``"workload"``: a NumPy ``.npz`` archive
(``np.savez``, or :func:`kvselect.checking.save_dump` ``(path,
"workload", ...)``, whose uncompressed members are memory-mapped, so only the
layers used are read; ``np.savez_compressed`` archives load too, read whole)
with ``kind = "workload"`` — or no ``kind`` at all when ``q``, ``k`` and
``v`` are present (a plain ``np.savez(path, q=..., k=..., v=...)`` is a
workload) — and:

- ``q``: ``[layers, n_heads, tokens, d]`` (required): the query heads;
- ``k``: ``[layers, n_kv_heads, tokens, d]`` (required);
- ``v``: ``[layers, n_kv_heads, tokens, d_v]`` (required);
- ``index_q``, ``index_k``: ``[layers, n_kv_heads, tokens, d_idx]``
  (optional, both or neither): your indexer's query and key, one index head
  per KV head (MiniMax-M3's form; the learned top-k ranks by ``index_q ·
  index_k`` and block selection scores it);
- or the **DSA form** (DeepSeek-V3.2/V4, GLM-5's lightning indexer), told
  apart by ``weights``: ``index_q`` ``[layers, tokens, H, d_idx]``
  (``H`` index heads per token), ``weights`` ``[layers, tokens, H]``
  (the per-query head weights, softmax scale and ``H^-1/2`` folded in, as
  the model computes them), ``index_k`` ``[layers, tokens, d_idx]`` (one
  index key per token, shared by the index heads), and optionally
  ``key_scale`` ``[layers, tokens]`` (the fp8 cache's per-key scale,
  with ``index_k`` its dequantised-by-``1/scale`` values; raw fp8 bits with
  ``index_k_format = "float8_e4m3fn"``). The names are
  :func:`kvselect.indexer_topk`'s. The learned
  top-k is then :func:`kvselect.indexer_topk` of it — one row per query,
  shared by every KV head of the layer, as DSA shares it — and block
  selection scores the derived indexer (:func:`derive_indexer`);
- ``scale``: a scalar (optional): the softmax scale, default ``1/sqrt(d)``;
- ``layer_ids``: ``[layers]`` integers (optional): the model's layer numbers;
- ``kv_head_ids``: ``[layers, n_kv_heads]`` integers (optional): the model's
  KV head numbers (the ids only name heads).

Rules (each broken one is a :class:`WorkloadError` naming the key):

- Arrays are float16, float32 or float64, or the raw bits of bfloat16 /
  float16 / float8_e4m3fn with an ``X_format`` key beside them (read as
  float32, exactly), and finite.
- ``n_heads`` is a multiple of ``n_kv_heads`` (grouped-query attention):
  query head ``h`` of a layer reads KV head ``h // (n_heads // n_kv_heads)``
  of the same layer. Multi-head attention is ``n_heads == n_kv_heads``.
- ``layers``, ``tokens`` and ``d`` agree across ``q``/``k``/``v``;
  ``tokens >= 2``. Positions are token order: row ``t`` is token ``t``, and
  the evaluation applies a causal mask (query ``i`` sees keys ``0..=i``),
  whether or not the model was causal.
- ``q`` and ``k`` are what the attention scores are computed from: after
  any rotary embedding or query/key norm (``q[l, h, i] · k[l, g, j] * scale``
  is the model's logit).
- ``index_q``/``index_k`` (both or neither) are your indexer's query and key
  (e.g. DeepSeek-V3.2's lightning indexer); without them the indexer is
  derived by :func:`derive_indexer`.
- Axis 1 is heads and axis 2 tokens: a ``q`` with fewer tokens than query
  heads loads with a :class:`WorkloadWarning` (it was probably saved as
  ``[layers, tokens, heads, d]``, a common torch layout).
- Any other key is refused (it is most likely a typo, such as ``Q`` or
  ``index_keys``, or an old name such as ``index_weights``, that would
  otherwise be silently ignored); the error names the closest known key and
  lists them all.

Layers are flattened into heads: the workload has ``layers * n_heads`` query
heads and ``layers * n_kv_heads`` KV heads, named ``"L{layer}/H{kv_head}"``
in :attr:`Workload.head_kinds`; flattening keeps every query head with the
KV heads of its own layer.
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

__all__ = [
    "HEAD_KINDS",
    "Indexer",
    "fp8_e4m3fn",
    "fp8_e4m3fn_bytes",
    "quantize_fp8",
    "Workload",
    "WorkloadError",
    "WorkloadWarning",
    "derive_indexer",
    "example",
    "load_npz",
    "quantize_rows",
    "query_positions",
    "synthetic",
    "synthetic_needles",
]

#: The head types :func:`synthetic` cycles through, in order, over KV heads.
HEAD_KINDS: Tuple[str, ...] = ("sink", "local", "retrieval", "diffuse")

PathLike = Union[str, os.PathLike]  # type: ignore[type-arg]


class WorkloadWarning(UserWarning):
    """A workload that loads but is probably not what was meant (a dump
    whose heads and tokens look swapped, say)."""


class WorkloadError(ValueError):
    """A workload (or a workload file) that breaks the documented contract.

    The message names the offending field or ``.npz`` key, and what was
    expected against what was found."""


# --------------------------------------------------------------------------
# The workload
# --------------------------------------------------------------------------


def fp8_e4m3fn(x: np.ndarray) -> np.ndarray:
    """``x`` rounded to the nearest float8 e4m3fn value (ties to even),
    saturating at ``±448``, as float32 — what ``x.astype(float8_e4m3fn)``
    gives, without ``ml_dtypes``. e4m3fn has 3 mantissa bits, exponents
    ``-6..8`` and subnormals of ``2^-9``."""
    x = np.asarray(x, dtype=np.float32)
    a = np.minimum(np.abs(x), np.float32(448.0))
    with np.errstate(divide="ignore"):
        e = np.floor(np.log2(a, where=a > 0, out=np.full_like(a, -7.0)))
    quantum = np.exp2(np.maximum(e, -6.0) - 3.0).astype(np.float32)
    r = np.rint(a / quantum) * quantum
    return np.copysign(np.minimum(r, np.float32(448.0)), x).astype(np.float32)


def fp8_e4m3fn_bytes(grid: np.ndarray) -> np.ndarray:
    """The float8 e4m3fn bytes of values already on its grid (as
    :func:`fp8_e4m3fn` returns them): sign, 4 exponent bits (bias 7), 3
    mantissa bits; ``uint8`` of the same shape."""
    v = np.asarray(grid, dtype=np.float32)
    a = np.abs(v).astype(np.float64)
    e = np.floor(np.log2(np.where(a > 0, a, 1.0)))
    normal = a >= 2.0**-6
    exp = np.where(normal, e + 7, 0)
    mant = np.where(normal, a / np.exp2(np.where(normal, e, 0)) * 8 - 8, a / 2.0**-9)
    out = (np.signbit(v).astype(np.uint16) << 7) | (exp.astype(np.uint16) << 3) | np.rint(mant).astype(np.uint16)
    return np.ascontiguousarray(out.astype(np.uint8))


def quantize_fp8(x: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Per-row fp8 quantisation as vLLM writes its DSA index-K cache
    (``indexer_k_quant_and_cache``): ``scale = max(amax, 1e-4) / 448`` per row
    and ``x / scale`` in float8 e4m3fn. Returns the ``uint8`` bytes and the
    float32 scales (``[..., d]`` and ``[...]``)."""
    x = np.asarray(x, dtype=np.float32)
    scale = (np.maximum(np.abs(x).max(axis=-1), np.float32(1e-4)) / np.float32(448.0)).astype(np.float32)
    return fp8_e4m3fn_bytes(fp8_e4m3fn(x / scale[..., None])), scale


@dataclass(frozen=True, eq=False)
class Indexer:
    """A DSA-style lightning indexer (DeepSeek-V3.2/V4, GLM-5): the learned
    top-k a workload's "learned" policy ranks by, scored natively by
    :func:`kvselect.indexer_topk` as ``c_t · Σ_h w_h · max(q_h · k_t, 0)``.

    Attributes:
        q: float32 ``[n_indexers, tokens, H, d_idx]``: each query's ``H``
            index heads.
        weights: float32 ``[n_indexers, tokens, H]``: per-query head weights
            (scales folded in).
        k: ``[n_indexers, tokens, d_idx]``: the index keys, float32 or the raw
            ``uint8`` bytes of float8 e4m3fn (``key_format``).
        key_scale: float32 ``[n_indexers, tokens]`` per-key scales, or None.
        key_format: ``"float32"`` or ``"float8_e4m3fn"``.
        of_kv_head: int64 ``[n_kv_heads]``: the indexer that serves each KV
            head (one per KV head, or one per layer shared by its KV heads:
            DSA's one learned row per query, shared by every head).
        description: one line on what it models.
    """

    q: np.ndarray
    weights: np.ndarray
    k: np.ndarray
    key_scale: Optional[np.ndarray]
    key_format: str
    of_kv_head: np.ndarray
    description: str

    def __post_init__(self) -> None:
        if self.q.ndim != 4 or self.q.dtype != np.float32:
            raise WorkloadError(
                f"index_q: expected float32 [n_indexers, tokens, H, d_idx], got "
                f"{self.q.dtype} {self.q.shape}"
            )
        n, t, h, d = self.q.shape
        if self.weights.shape != (n, t, h) or self.weights.dtype != np.float32:
            raise WorkloadError(
                f"weights: expected float32 [{n}, {t}, {h}] (one weight per index head "
                f"and token), got {self.weights.dtype} {self.weights.shape}"
            )
        fmt = {"float32": np.float32, "float8_e4m3fn": np.uint8}.get(self.key_format)
        if fmt is None or self.k.dtype != fmt or self.k.shape != (n, t, d):
            raise WorkloadError(
                f"index_k: expected [{n}, {t}, {d}] (one key per token, shared by the index "
                f"heads) in {self.key_format}, got {self.k.dtype} {self.k.shape}"
            )
        if self.key_scale is not None and self.key_scale.shape != (n, t):
            raise WorkloadError(
                f"key_scale: expected [{n}, {t}], got {self.key_scale.shape}"
            )
        if self.of_kv_head.ndim != 1 or not np.all((0 <= self.of_kv_head) & (self.of_kv_head < n)):
            raise WorkloadError("of_kv_head: expected one indexer index per KV head")

    @property
    def heads(self) -> int:
        """Index heads ``H``."""
        return int(self.q.shape[2])

    def inputs(self, kv_head: int, pos: np.ndarray) -> dict:
        """The keyword arguments of :func:`kvselect.indexer_topk` for KV head
        ``kv_head``'s queries at ``pos``."""
        i = int(self.of_kv_head[kv_head])
        return {
            "index_q": np.ascontiguousarray(self.q[i][pos]),
            "weights": np.ascontiguousarray(self.weights[i][pos]),
            "index_k": self.k[i],
            "key_scale": None if self.key_scale is None else self.key_scale[i],
            "key_format": self.key_format,
        }


@dataclass(frozen=True, eq=False)
class Workload:
    """One causal decode-style evaluation problem.

    Attributes:
        name: short name (``"synthetic"``, ``"minilm-example"``, a file stem).
        q: float32 ``[n_heads, tokens, d]``, the query heads.
        k: float32 ``[n_kv_heads, tokens, d]``.
        v: float32 ``[n_kv_heads, tokens, d_v]``.
        index_q: float32 ``[n_kv_heads, tokens, d_idx]``, the approximate
            indexer's query: one index head per KV head.
        index_k: float32 ``[n_kv_heads, tokens, d_idx]``, its key.
        head_kinds: one label per KV head (``"sink"``, ``"local"``,
            ``"retrieval"``, ``"diffuse"``; ``"L3/H5"`` for dumps).
        query_positions: int64, 1-D, strictly increasing positions in
            ``[0, tokens)``; the query at position ``i`` sees keys ``0..=i``.
        scale: the softmax scale (``1/sqrt(d)`` unless the model says
            otherwise): the logit of query head ``h`` at ``i`` on key ``j`` is
            ``q[h, i] · k[h // group, j] * scale``.
        source: one line on where the workload came from.
        indexer: the DSA-style lightning indexer the learned top-k ranks by
            (:class:`Indexer`), or None: then the learned top-k ranks by
            ``index_q · index_k`` (:meth:`learned_inputs`).

    ``index_q``/``index_k`` (one index head per KV head) are also what block
    selection scores, as MiniMax-M3's indexer does. ``n_heads`` is a multiple of ``n_kv_heads`` (grouped-query attention;
    ``group = n_heads // n_kv_heads`` query heads share each KV head). All
    arrays are C-contiguous; building a workload that breaks any of this
    raises :class:`WorkloadError`. The arrays are not copied.
    """

    name: str
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    index_q: np.ndarray
    index_k: np.ndarray
    head_kinds: Tuple[str, ...]
    query_positions: np.ndarray
    scale: float
    source: str
    indexer: Optional[Indexer] = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise WorkloadError(f"name: expected a non-empty str, got {self.name!r}")
        if not isinstance(self.source, str) or "\n" in self.source:
            raise WorkloadError(f"source: expected a one-line str, got {self.source!r}")
        for field in ("q", "k", "v", "index_q", "index_k"):
            arr = getattr(self, field)
            if not isinstance(arr, np.ndarray):
                raise WorkloadError(
                    f"{field}: expected a numpy.ndarray, got {type(arr).__name__}"
                )
            if arr.dtype != np.float32:
                raise WorkloadError(f"{field}: expected dtype float32, got {arr.dtype}")
            if arr.ndim != 3:
                raise WorkloadError(
                    f"{field}: expected 3 dimensions [heads, tokens, dim], "
                    f"got shape {arr.shape}"
                )
            if not arr.flags.c_contiguous:
                raise WorkloadError(f"{field}: expected a C-contiguous array")
            if 0 in arr.shape:
                raise WorkloadError(f"{field}: expected no empty axis, got shape {arr.shape}")
        n_heads, tokens, d = self.q.shape
        n_kv = self.k.shape[0]
        if tokens < 2:
            raise WorkloadError(f"q: expected at least 2 tokens, got {tokens}")
        if self.k.shape[1:] != (tokens, d):
            raise WorkloadError(
                f"k: expected shape [n_kv_heads, {tokens}, {d}] to match q, got {self.k.shape}"
            )
        if self.v.shape[:2] != (n_kv, tokens):
            raise WorkloadError(
                f"v: expected shape [{n_kv}, {tokens}, d_v] to match k, got {self.v.shape}"
            )
        if n_heads % n_kv:
            raise WorkloadError(
                f"q: n_heads = {n_heads} is not a multiple of n_kv_heads = {n_kv}"
            )
        if self.index_q.shape[:2] != (n_kv, tokens):
            raise WorkloadError(
                f"index_q: expected shape [{n_kv}, {tokens}, d_idx] (one index head per "
                f"KV head), got {self.index_q.shape}"
            )
        if self.index_k.shape != self.index_q.shape:
            raise WorkloadError(
                f"index_k: expected shape {self.index_q.shape} to match index_q, "
                f"got {self.index_k.shape}"
            )
        kinds = self.head_kinds
        if not isinstance(kinds, tuple) or not all(isinstance(s, str) for s in kinds):
            raise WorkloadError("head_kinds: expected a tuple of str")
        if len(kinds) != n_kv:
            raise WorkloadError(
                f"head_kinds: expected one label per KV head ({n_kv}), got {len(kinds)}"
            )
        pos = self.query_positions
        if not isinstance(pos, np.ndarray) or pos.dtype != np.int64 or pos.ndim != 1:
            raise WorkloadError(
                "query_positions: expected a 1-D int64 numpy.ndarray, got "
                + (f"{pos.dtype} shape {pos.shape}" if isinstance(pos, np.ndarray)
                   else type(pos).__name__)
            )
        if pos.size == 0:
            raise WorkloadError("query_positions: expected at least one position")
        if not pos.flags.c_contiguous:
            raise WorkloadError("query_positions: expected a C-contiguous array")
        if pos[0] < 0 or pos[-1] >= tokens or np.any(np.diff(pos) <= 0):
            raise WorkloadError(
                f"query_positions: expected strictly increasing positions in [0, {tokens}), "
                f"got {pos.tolist() if pos.size <= 8 else str(pos)}"
            )
        if isinstance(self.scale, bool) or not isinstance(self.scale, (float, int, np.floating)):
            raise WorkloadError(f"scale: expected a float, got {type(self.scale).__name__}")
        if not (math.isfinite(float(self.scale)) and float(self.scale) > 0):
            raise WorkloadError(f"scale: expected a finite positive float, got {self.scale}")
        object.__setattr__(self, "scale", float(self.scale))

    # Derived sizes -----------------------------------------------------------

    @property
    def n_heads(self) -> int:
        """Query heads."""
        return int(self.q.shape[0])

    @property
    def n_kv_heads(self) -> int:
        """KV heads (= index heads)."""
        return int(self.k.shape[0])

    @property
    def group(self) -> int:
        """Query heads per KV head: query head ``h`` reads KV head ``h // group``."""
        return self.n_heads // self.n_kv_heads

    @property
    def tokens(self) -> int:
        """Context length (positions ``0..tokens``)."""
        return int(self.q.shape[1])

    @property
    def d(self) -> int:
        return int(self.q.shape[2])

    @property
    def d_v(self) -> int:
        return int(self.v.shape[2])

    @property
    def d_index(self) -> int:
        return int(self.index_q.shape[2])

    def learned_inputs(self, kv_head: int, pos: np.ndarray) -> dict:
        """The keyword arguments of :func:`kvselect.indexer_topk` that give KV
        head ``kv_head``'s learned top-k at ``pos``: the DSA indexer's, or
        without one the one-head indexer ``index_q · index_k`` run as a
        lightning indexer with the two heads ``(q, -q)`` and weights ``(1,
        -1)``, whose score ``max(s, 0) - max(-s, 0)`` is exactly ``s``, the
        kernel's float32 dot product ``q · k`` (one of the two terms is 0)."""
        if self.indexer is not None:
            return self.indexer.inputs(kv_head, pos)
        q = self.index_q[kv_head][pos]
        return {
            "index_q": np.ascontiguousarray(np.stack([q, -q], axis=1)),
            "weights": np.tile(np.array([1.0, -1.0], dtype=np.float32), (len(pos), 1)),
            "index_k": self.index_k[kv_head],
            "key_scale": None,
            "key_format": "float32",
        }

    def __repr__(self) -> str:
        return (
            f"Workload(name={self.name!r}, n_heads={self.n_heads}, "
            f"n_kv_heads={self.n_kv_heads}, tokens={self.tokens}, d={self.d}, "
            f"d_v={self.d_v}, d_index={self.d_index}, "
            f"queries={self.query_positions.size}, source={self.source!r})"
        )


# --------------------------------------------------------------------------
# Shared rules: query positions, quantisation, the derived indexer
# --------------------------------------------------------------------------


def query_positions(tokens: int, queries: int, seed: int = 0) -> np.ndarray:
    """The evaluated query positions: ``queries`` of them over
    ``[tokens // 8, tokens)``, always including ``tokens - 1``.

    The range is cut into ``queries`` equal strata and one position is drawn
    uniformly from each (``numpy.random.default_rng(seed)``); the last stratum
    contributes ``tokens - 1`` (the longest context). Stratifying spreads the
    queries over short and long contexts; skipping the first eighth skips
    queries whose whole context fits any budget. If the range holds no more
    than ``queries`` positions, all of them are returned. int64, strictly
    increasing.
    """
    tokens = _as_count("tokens", tokens, minimum=1)
    queries = _as_count("queries", queries, minimum=1)
    lo = tokens // 8
    span = tokens - lo
    if span <= queries:
        return np.arange(lo, tokens, dtype=np.int64)
    rng = np.random.default_rng(seed)
    edges = lo + (np.arange(queries + 1, dtype=np.int64) * span) // queries
    picks = edges[:-1] + rng.integers(0, edges[1:] - edges[:-1])
    picks[-1] = tokens - 1
    return np.ascontiguousarray(picks, dtype=np.int64)


def quantize_rows(x: np.ndarray) -> np.ndarray:
    """Per-row symmetric 8-bit quantisation, dequantised back to float32.

    Each row (last axis) is scaled by ``s = max|row| / 127`` and rounded:
    ``round(row / s) * s``, so a row takes at most 255 distinct values
    (``-127 s .. 127 s``); an all-zero row stays zero. This is the precision
    loss of an int8/fp8 indexer cache, kept in float32 so every consumer
    reads it as a plain score input.
    """
    x = np.asarray(x, dtype=np.float32)
    amax = np.max(np.abs(x), axis=-1, keepdims=True)
    step = amax / np.float32(127.0)
    safe = np.where(step > 0, step, np.float32(1.0))
    out = np.rint(x / safe) * safe
    return np.ascontiguousarray(out, dtype=np.float32)


def _projection(d: int, d_index: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x6B76_7365]))
    p = rng.standard_normal((d, d_index)) / math.sqrt(d_index)
    return p.astype(np.float32)


def _group_mean(q: np.ndarray, n_kv_heads: int) -> np.ndarray:
    n_heads = q.shape[0]
    g = n_heads // n_kv_heads
    out: np.ndarray = q.reshape(n_kv_heads, g, *q.shape[1:]).mean(axis=1, dtype=np.float32)
    return out


def derive_indexer(
    q: np.ndarray,
    k: np.ndarray,
    n_kv_heads: int,
    d_index: Optional[int] = None,
    seed: int = 0,
) -> Tuple[np.ndarray, np.ndarray]:
    """The indexer used when a dump has no ``index_q``/``index_k``.

    Rule (fixed, so that results on a dump are reproducible everywhere):

    1. Average the query heads within each GQA group: ``q_bar[g] =
       mean(q[g * group : (g + 1) * group])`` with ``group = n_heads //
       n_kv_heads`` (one index head per KV head, as in DeepSeek-V3.2 and
       MiniMax-M3 where the indexer is shared by a KV head's queries).
    2. Project ``q_bar`` and ``k`` with the same random matrix ``P`` of shape
       ``[d, d_index]``, entries i.i.d. ``N(0, 1/d_index)``, drawn by
       ``numpy.random.default_rng(SeedSequence([seed, 0x6b767365]))``
       (``standard_normal((d, d_index)) / sqrt(d_index)``); ``d_index``
       defaults to ``max(4, d // 4)``. By Johnson–Lindenstrauss,
       ``(q P)·(k P)`` is an unbiased estimate of ``q·k`` whose error shrinks
       as ``d_index`` grows.
    3. Quantise every row of ``q_bar P`` and ``k P`` to 8 bits with
       :func:`quantize_rows` (per-row symmetric: ``s = max|row| / 127``,
       ``round(row / s) * s``).

    So the derived indexer is what a lightning indexer is: fewer heads, lower
    dimension, coarser numbers than the attention it predicts — an
    approximation whose top-k agrees with the true top-k partially. It is not
    a trained indexer; when you have one, dump ``index_q``/``index_k``.

    Args:
        q: ``[n_heads, tokens, d]``; k: ``[n_kv_heads, tokens, d]`` (any float
            dtype; computed in float32).
        n_kv_heads: KV heads; ``n_heads`` must be a multiple of it.
        d_index: index dimension (default ``max(4, d // 4)``).
        seed: the projection's seed (0 by default and in :func:`load_npz`).

    Returns:
        ``(index_q, index_k)``, both float32 C-contiguous
        ``[n_kv_heads, tokens, d_index]``.
    """
    q = np.asarray(q, dtype=np.float32)
    k = np.asarray(k, dtype=np.float32)
    n_kv_heads = _as_count("n_kv_heads", n_kv_heads, minimum=1)
    if q.ndim != 3 or k.ndim != 3:
        raise WorkloadError(
            f"derive_indexer: expected q [n_heads, tokens, d] and k [n_kv_heads, tokens, d], "
            f"got q {q.shape} and k {k.shape}"
        )
    if k.shape[0] != n_kv_heads:
        raise WorkloadError(
            f"k: expected {n_kv_heads} KV heads (n_kv_heads), got shape {k.shape}"
        )
    if q.shape[0] % n_kv_heads:
        raise WorkloadError(
            f"q: n_heads = {q.shape[0]} is not a multiple of n_kv_heads = {n_kv_heads}"
        )
    if q.shape[1:] != k.shape[1:]:
        raise WorkloadError(
            f"k: expected [n_kv_heads, tokens, d] = [{n_kv_heads}, {q.shape[1]}, {q.shape[2]}] "
            f"to match q, got {k.shape}"
        )
    d = q.shape[2]
    d_index = max(4, d // 4) if d_index is None else _as_count("d_index", d_index, minimum=1)
    p = _projection(d, d_index, seed)
    index_q = quantize_rows(_group_mean(q, n_kv_heads) @ p)
    index_k = quantize_rows(k @ p)
    return index_q, index_k


def _as_count(name: str, value: object, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise WorkloadError(f"{name}: expected an int, got {type(value).__name__}")
    if value < minimum:
        raise WorkloadError(f"{name}: expected an int >= {minimum}, got {value}")
    return int(value)


# --------------------------------------------------------------------------
# The synthetic workload
# --------------------------------------------------------------------------

# Logit targets (units of q·k·scale) of the structured parts; the noise part
# of every logit has standard deviation about 1 (sink/local/retrieval) or 0.5
# (diffuse), whatever d is.
_SINK_COUNT = 4
_SINK_LOGITS = (13.0, 11.5, 11.0, 10.5)
_LOCAL_PEAK = 16.0
_LOCAL_PERIODS = (32.0, 2048.0)
_NEEDLES = 8
_NEEDLE_LOGIT = 13.0
_NEEDLE_SPAN = 0.75
_DIFFUSE_Q = 0.4
_CONTENT_RANK = 4
_CONTENT_LOGIT = 0.9
_ISO_NOISE = 0.3
_INDEX_NOISE = 2.0


def synthetic(
    context: int = 32768,
    n_heads: int = 8,
    d: int = 64,
    d_v: int = 64,
    d_index: int = 16,
    queries: int = 24,
    seed: int = 0,
    n_kv_heads: int = 4,
    index_heads: int = 4,
    index_noise: float = _INDEX_NOISE,
) -> Workload:
    """A deterministic synthetic long-context workload (no download).

    KV head ``g`` has kind ``HEAD_KINDS[g % 4]``, and its ``group`` query
    heads share that kind (each with its own strength, 0.9–1.1, and noise).
    Logits below are ``q·k * scale`` with ``scale = 1/sqrt(d)``.

    Every head starts from a background: each query and key is a Gaussian
    point in a rank-4 "content" subspace of the head (logit standard
    deviation ~0.9: which tokens match is low-rank, as in real heads) plus
    isotropic noise (0.3 per coordinate). On top of it:

    - ``"sink"``: the first 4 keys carry a direction (orthogonal to the
      content) that every query looks for, at logits about 13, 11.5, 11 and
      10.5, so they take much of the mass at every length — attention sinks;
      their values are scaled by 0.1, as real sinks' values are small.
    - ``"local"``: rotary positional encoding of one shared vector in queries
      and keys (pair ``f`` turns by ``t * w_f``, periods ``2 pi / w_f``
      geometric from 32 to 2048 positions), so ``q_i · k_j`` is a sum of
      cosines of ``(i - j) w_f``: logit 16 at ``j = i``, falling over some
      tens of positions, incoherent (standard deviation ~2) far away — a
      sliding-window head.
    - ``"retrieval"``: 8 needle keys, one drawn in each of 8 equal strata of
      ``[4, 0.75 * context)`` (:func:`synthetic_needles`; the first lies
      before ``context // 8``, so every evaluated query sees one), carry a
      direction every query looks for (logit 13 times a per-needle strength
      in 0.8–1): the mass sits on needles far back. A needle after the query
      is invisible to it (causal).
    - ``"diffuse"``: the background alone, queries scaled by 0.4 (logit
      standard deviation ~0.4): near-uniform attention.

    Values are standard normal.

    **The learned top-k's indexer** is DeepSeek's lightning indexer (DSA,
    :class:`Indexer`), one per KV head: ``index_heads`` index heads, index
    head ``h`` of KV head ``g`` being query head ``h % group`` of its group
    projected to ``d_index`` dimensions by the random matrix ``P`` of
    :func:`derive_indexer` (same ``seed``), plus Gaussian noise of
    ``index_noise`` times the row's RMS; per-query head weights uniform in
    ``[0.5, 1.5] / index_heads``; keys ``k @ P`` stored in float8 e4m3fn with
    a per-key scale (:func:`quantize_fp8`, vLLM's cache format). Scores are
    ``c_t · Σ_h w_h · max(q_h · k_t, 0)``: the ReLU turns every negative
    match into an exact zero, so rows reach into a plateau of ties when few
    keys match, as a real indexer's do. What the approximation models: fewer
    and smaller heads than the attention (a projection), low precision (fp8
    keys), and an index query that is not the attention's query (the noise).
    **``index_noise`` is the knob**, and its default (2.0) is a modelling
    choice, not a measurement — no published number says how far a real
    indexer sits from the oracle. At the default the learned top-k's recall
    sits 0.03–0.06 below the oracle's at budgets of 512–2048 on this
    workload (``kvselect eval`` prints the gap); at 0.25 it is within 0.01.

    Block selection scores MiniMax-M3's kind of indexer, one index head per
    KV head: ``index_q = quantize_rows(q_bar @ P + e)`` and ``index_k =
    quantize_rows(k @ P)``, with ``q_bar`` the GQA-group mean of the queries
    and ``e`` Gaussian noise of ``index_noise`` times the row's RMS (8-bit:
    :func:`quantize_rows`).

    Why one indexer per KV head: DSA computes one learned row per query,
    shared by every head, because its models use MLA (one latent KV head).
    This workload has several KV heads of different kinds (sink, local,
    retrieval, diffuse); one row shared across them would judge each kind by
    the others' matches. An MLA-like run is ``n_kv_heads=1``. A dump in the
    DSA form (:func:`load_npz`) shares one indexer across its layer's KV
    heads, as the model does.

    ``query_positions`` follow :func:`query_positions` (``queries`` over
    ``[context // 8, context)`` including ``context - 1``). Same arguments,
    same arrays, on any machine with the same NumPy random streams.

    Raises:
        WorkloadError: a size out of range (``context >= 64``, ``d`` even and
        ``>= 8``, ``n_heads`` a multiple of ``n_kv_heads``, counts ``>= 1``).
    """
    context = _as_count("context", context, minimum=64)
    n_heads = _as_count("n_heads", n_heads, minimum=1)
    n_kv_heads = _as_count("n_kv_heads", n_kv_heads, minimum=1)
    d = _as_count("d", d, minimum=8)
    d_v = _as_count("d_v", d_v, minimum=1)
    d_index = _as_count("d_index", d_index, minimum=1)
    queries = _as_count("queries", queries, minimum=1)
    seed = _as_count("seed", seed, minimum=0)
    index_heads = _as_count("index_heads", index_heads, minimum=1)
    if isinstance(index_noise, bool) or not isinstance(index_noise, (int, float, np.floating)) \
            or not (math.isfinite(index_noise) and index_noise >= 0):
        raise WorkloadError(f"index_noise: expected a finite float >= 0, got {index_noise!r}")
    if d % 2:
        raise WorkloadError(f"d: expected an even head dimension (rotary pairs), got {d}")
    if n_heads % n_kv_heads:
        raise WorkloadError(
            f"n_heads: {n_heads} is not a multiple of n_kv_heads = {n_kv_heads}"
        )
    group = n_heads // n_kv_heads
    scale = 1.0 / math.sqrt(d)
    root = np.random.SeedSequence([seed, 0x73796E74])
    head_seeds = root.spawn(n_kv_heads + 1)
    f32 = np.float32

    q = np.empty((n_heads, context, d), dtype=f32)
    k = np.empty((n_kv_heads, context, d), dtype=f32)
    v = np.empty((n_kv_heads, context, d_v), dtype=f32)
    kinds = []
    for g in range(n_kv_heads):
        kind = HEAD_KINDS[g % len(HEAD_KINDS)]
        kinds.append(kind)
        rng = np.random.default_rng(head_seeds[g])
        # An orthonormal basis: column 0 is the head's "look-for" direction
        # (sink, needle); the next _CONTENT_RANK columns span its content
        # subspace (token content varies there: a low-rank background).
        basis, _ = np.linalg.qr(rng.standard_normal((d, d)))
        u = basis[:, 0].astype(f32)
        rank = min(_CONTENT_RANK, d - 1)
        sigma_c = math.sqrt(_CONTENT_LOGIT / (math.sqrt(rank) * scale))
        content = (basis[:, 1 : 1 + rank].T * sigma_c).astype(f32)
        heads = [k[g]] + [q[h] for h in range(g * group, (g + 1) * group)]
        for out in heads:  # background: content + isotropic noise, in place
            rng.standard_normal(out=out, dtype=f32)
            out *= f32(_ISO_NOISE)
            out += rng.standard_normal((context, rank), dtype=f32) @ content
        kg, qs = heads[0], heads[1:]
        rng.standard_normal(out=v[g], dtype=f32)
        strengths = rng.uniform(0.9, 1.1, group)
        if kind == "sink":
            amp = math.sqrt(_SINK_LOGITS[0] / scale)
            rel = np.asarray(_SINK_LOGITS[:_SINK_COUNT]) / _SINK_LOGITS[0]
            kg[:_SINK_COUNT] += (amp * rel[:, None] * u[None, :]).astype(f32)
            v[g, :_SINK_COUNT] *= f32(0.1)
            for j in range(group):
                qs[j] += f32(amp * strengths[j]) * u
        elif kind == "local":
            half = d // 2
            omega = 2 * math.pi / np.geomspace(*_LOCAL_PERIODS, half)
            amp = math.sqrt(_LOCAL_PEAK / (scale * half))
            phase = rng.uniform(0, 2 * math.pi, half)
            # One shared vector, pair f = amp * (cos phase_f, sin phase_f),
            # rotated by t * w_f: q_i . k_j = amp^2 * sum_f cos((i - j) w_f).
            ang = (np.arange(context, dtype=np.float64)[:, None] * omega + phase).astype(f32)
            rot = np.empty((context, d), dtype=f32)
            np.cos(ang, out=rot[:, 0::2])
            np.sin(ang, out=rot[:, 1::2])
            rot *= f32(amp)
            kg += rot
            for j in range(group):
                qs[j] += f32(strengths[j]) * rot
        elif kind == "retrieval":
            amp = math.sqrt(_NEEDLE_LOGIT / scale)
            needles = synthetic_needles(context, seed, g)
            w = rng.uniform(0.8, 1.0, _NEEDLES)
            kg[needles] += (amp * w[:, None] * u[None, :]).astype(f32)
            for j in range(group):
                qs[j] += f32(amp * strengths[j]) * u
        else:  # diffuse
            for j in range(group):
                qs[j] *= f32(_DIFFUSE_Q * strengths[j])

    index_rng = np.random.default_rng(head_seeds[n_kv_heads])
    p = _projection(d, d_index, seed)
    q_p = q @ p  # [n_heads, tokens, d_index]
    q_proj = _group_mean(q_p, n_kv_heads)
    rms = np.sqrt(np.mean(q_proj * q_proj, axis=-1, keepdims=True))
    noise = index_rng.standard_normal(q_proj.shape, dtype=f32)
    noise *= f32(index_noise) * rms
    index_q = quantize_rows(q_proj + noise)
    k_p = k @ p
    index_k = quantize_rows(k_p)
    indexer = _synthetic_indexer(q_p, k_p, n_kv_heads, index_heads, index_noise, index_rng)
    return Workload(
        name="synthetic",
        q=q,
        k=k,
        v=v,
        index_q=index_q,
        index_k=index_k,
        head_kinds=tuple(kinds),
        query_positions=query_positions(context, queries, seed),
        scale=scale,
        source=(
            f"kvselect.workloads.synthetic(context={context}, n_heads={n_heads}, d={d}, "
            f"d_v={d_v}, d_index={d_index}, queries={queries}, seed={seed}, "
            f"n_kv_heads={n_kv_heads}, index_heads={index_heads}, index_noise={index_noise})"
        ),
        indexer=indexer,
    )


def _synthetic_indexer(
    q_p: np.ndarray,
    k_p: np.ndarray,
    n_kv_heads: int,
    heads: int,
    noise: float,
    rng: np.random.Generator,
) -> Indexer:
    """The synthetic workload's DSA indexer (see :func:`synthetic`): KV head
    ``g``'s index head ``h`` is query head ``h % group`` of its group,
    projected (``q_p``), plus Gaussian noise of ``noise`` times the row's RMS;
    weights uniform in ``[0.5, 1.5] / H``; keys ``k_p`` in fp8 with a per-key
    scale."""
    n_heads, tokens, d_index = q_p.shape
    group = n_heads // n_kv_heads
    f32 = np.float32
    iq = np.empty((n_kv_heads, tokens, heads, d_index), dtype=f32)
    for g in range(n_kv_heads):
        for h in range(heads):
            src = q_p[g * group + h % group]
            rms = np.sqrt(np.mean(src * src, axis=-1, keepdims=True))
            iq[g, :, h] = src + rng.standard_normal(src.shape, dtype=f32) * (f32(noise) * rms)
    weights = (rng.uniform(0.5, 1.5, (n_kv_heads, tokens, heads)) / heads).astype(f32)
    k8, scale = quantize_fp8(k_p)
    return Indexer(
        q=iq,
        weights=weights,
        k=k8,
        key_scale=scale,
        key_format="float8_e4m3fn",
        of_kv_head=np.arange(n_kv_heads, dtype=np.int64),
        description=(
            f"synthetic DSA indexer per KV head: {heads} index heads of dim {d_index}, "
            f"noise {noise}, fp8 keys with per-key scales"
        ),
    )


def _unit(rng: np.random.Generator, d: int) -> np.ndarray:
    u = rng.standard_normal(d)
    return u / np.linalg.norm(u)


def synthetic_needles(context: int, seed: int, kv_head: int) -> np.ndarray:
    """The needle positions of retrieval KV head ``kv_head`` in
    ``synthetic(context=context, seed=seed, ...)`` (int64, ascending, 8).

    Needle ``m`` is drawn uniformly from stratum ``m`` of 8 equal strata of
    ``[4, 0.75 * context)``, by its own stream
    (``SeedSequence([seed, 0x6e656564, kv_head])``), so the positions depend on
    the context, the seed and the head only. Useful to score a policy on
    needle recall; meaningful only for heads whose kind is ``"retrieval"``.
    """
    context = _as_count("context", context, minimum=64)
    seed = _as_count("seed", seed, minimum=0)
    kv_head = _as_count("kv_head", kv_head, minimum=0)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x6E656564, kv_head]))
    edges = np.linspace(_SINK_COUNT, _NEEDLE_SPAN * context, _NEEDLES + 1)
    pos = np.floor(edges[:-1] + rng.uniform(0.0, 1.0, _NEEDLES) * np.diff(edges))
    return np.ascontiguousarray(pos, dtype=np.int64)


# --------------------------------------------------------------------------
# Your own dumps, and the shipped example
# --------------------------------------------------------------------------


def load_npz(
    path: PathLike,
    *,
    layers: Union[None, int, Sequence[int]] = None,
    queries: int = 64,
    seed: int = 0,
) -> Workload:
    """Read a dump in the documented ``.npz`` format (see the module docstring).

    Args:
        path: the ``.npz`` file.
        layers: which layers of the file to use (indices into its first axis,
            in the order given); ``None`` for all. Each layer contributes its
            heads, named ``"L{layer}/H{kv_head}"`` (the file's ``layer_ids`` /
            ``kv_head_ids`` when present, else the indices).
        queries: how many query positions to evaluate, drawn by
            :func:`query_positions` over ``[tokens // 8, tokens)`` with
            ``tokens - 1`` always included (all of them if fewer).
        seed: the seed of those positions. (A derived indexer always uses
            :func:`derive_indexer`'s fixed projection seed, 0.)

    Returns:
        A :class:`Workload`: float32 arrays with layers flattened into heads,
        ``scale`` from the file or ``1/sqrt(d)``, and the file's indexer or,
        without one, :func:`derive_indexer`'s.

    Raises:
        FileNotFoundError: no such file.
        WorkloadError: not an ``.npz`` archive, or an array that breaks the
            format; the message names the key and what was expected, in
            layers, heads and tokens.

    Warns:
        WorkloadWarning: ``q`` has fewer tokens (axis 2) than query heads
            (axis 1): the dump was probably saved as ``[layers, tokens,
            heads, d]`` (a common torch layout) and would be evaluated as
            many heads of a few tokens.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such workload file: {str(path)!r}")
    from kvselect.checking import decode32

    arrays, formats = _read_npz(path)

    q, k, v = arrays["q"], arrays["k"], arrays["v"]
    n_layers, n_heads, tokens, d = q.shape
    n_kv = k.shape[1]
    hint = _transposed_hint(q.shape)
    if k.shape[0] != n_layers or v.shape[0] != n_layers:
        bad = "k" if k.shape[0] != n_layers else "v"
        raise WorkloadError(
            f"{bad}: expected {n_layers} layers (axis 0, as in q {q.shape}), "
            f"got {arrays[bad].shape}: {bad} has {arrays[bad].shape[0]} layers where q has "
            f"{n_layers}"
        )
    if k.shape[2:] != (tokens, d):
        what = (
            f"k has {k.shape[2]} tokens where q has {tokens}"
            if k.shape[2] != tokens
            else f"k's head dim is {k.shape[3]} where q's is {d}"
        )
        raise WorkloadError(
            f"k: expected shape [{n_layers}, n_kv_heads, {tokens}, {d}] (tokens and d as in "
            f"q {q.shape}), got {k.shape}: {what}" + hint
        )
    if v.shape[1:3] != (n_kv, tokens):
        what = (
            f"v has {v.shape[1]} KV heads where k has {n_kv}"
            if v.shape[1] != n_kv
            else f"v has {v.shape[2]} tokens where q and k have {tokens}"
        )
        raise WorkloadError(
            f"v: expected shape [{n_layers}, {n_kv}, {tokens}, d_v] (heads as in k, tokens "
            f"as in q), got {v.shape}: {what}" + hint
        )
    for key, arr in (("q", q), ("k", k), ("v", v)):
        if 0 in arr.shape:
            raise WorkloadError(
                f"{key}: expected no empty axis, got shape {arr.shape} "
                f"({_describe(key, arr.shape)})"
            )
    if tokens < 2:
        raise WorkloadError(
            f"q: expected at least 2 tokens (axis 2), got {tokens} "
            f"({_describe('q', q.shape)})" + hint
        )
    if n_heads % n_kv:
        raise WorkloadError(
            f"q: n_heads = {n_heads} (axis 1) is not a multiple of n_kv_heads = {n_kv} "
            f"(axis 1 of k): {n_heads} query heads cannot share {n_kv} KV heads evenly "
            f"(grouped-query attention)" + hint
        )
    has_index = "index_q" in arrays
    dsa = "weights" in arrays
    if dsa:
        iq, iw, ik = arrays["index_q"], arrays["weights"], arrays["index_k"]
        heads = iq.shape[2]
        if iq.shape[:2] != (n_layers, tokens) or 0 in iq.shape:
            raise WorkloadError(
                f"index_q: expected shape [{n_layers}, {tokens}, H, d_idx] (the DSA form: "
                f"layers, tokens, index heads, dim), got {iq.shape}"
            )
        if iw.shape != (n_layers, tokens, heads):
            raise WorkloadError(
                f"weights: expected shape [{n_layers}, {tokens}, {heads}] (one weight "
                f"per token and index head of index_q), got {iw.shape}"
            )
        if ik.shape != (n_layers, tokens, iq.shape[3]):
            raise WorkloadError(
                f"index_k: expected shape [{n_layers}, {tokens}, {iq.shape[3]}] (the DSA "
                f"form: one key per token, shared by the index heads), got {ik.shape}"
            )
        if "key_scale" in arrays and arrays["key_scale"].shape != (n_layers, tokens):
            raise WorkloadError(
                f"key_scale: expected shape [{n_layers}, {tokens}], got "
                f"{arrays['key_scale'].shape}"
            )
    elif has_index:
        iq, ik = arrays["index_q"], arrays["index_k"]
        if iq.shape[:3] != (n_layers, n_kv, tokens) or iq.shape[3] == 0:
            raise WorkloadError(
                f"index_q: expected shape [{n_layers}, {n_kv}, {tokens}, d_idx] (one index "
                f"head per KV head), got {iq.shape} ({_describe('index_q', iq.shape)}; "
                f"q and k have {n_layers} layers, {n_kv} KV heads, {tokens} tokens)"
            )
        if ik.shape != iq.shape:
            raise WorkloadError(
                f"index_k: expected shape {iq.shape} to match index_q, got {ik.shape} "
                f"({_describe('index_k', ik.shape)})"
            )
    if hint:
        warnings.warn(
            f"{path.name}: q reads as {n_heads} query heads (axis 1) of {tokens} tokens "
            f"(axis 2), fewer tokens than heads: probably saved as [layers, tokens, heads, "
            f"dim]; the format is [layers, heads, tokens, dim] (x.transpose(0, 2, 1, 3), "
            f"or x.permute(0, 2, 1, 3) in torch)",
            WorkloadWarning,
            stacklevel=2,
        )

    scale = 1.0 / math.sqrt(d)
    if "scale" in arrays:
        s = arrays["scale"]
        value = float(s.reshape(-1)[0]) if s.size == 1 else float("nan")
        if not (math.isfinite(value) and value > 0):
            raise WorkloadError(
                f"scale: expected one finite positive number, got {s.reshape(-1)[:4]} "
                f"(shape {s.shape})"
            )
        scale = value
    layer_ids = np.arange(n_layers)
    if "layer_ids" in arrays:
        layer_ids = arrays["layer_ids"]
        if layer_ids.shape != (n_layers,):
            raise WorkloadError(
                f"layer_ids: expected shape ({n_layers},), got {layer_ids.shape}"
            )
    kv_head_ids = np.broadcast_to(np.arange(n_kv), (n_layers, n_kv))
    if "kv_head_ids" in arrays:
        kv_head_ids = arrays["kv_head_ids"]
        if kv_head_ids.shape != (n_layers, n_kv):
            raise WorkloadError(
                f"kv_head_ids: expected shape ({n_layers}, {n_kv}), got {kv_head_ids.shape}"
            )

    chosen = _choose_layers(layers, n_layers)

    def read(key: str) -> np.ndarray:
        # Only the chosen layers' bytes are read (the members are memory-mapped).
        return decode32(arrays[key][chosen], formats.get(key))

    def flat(key: str) -> np.ndarray:
        arr = read(key)
        out = np.ascontiguousarray(arr.reshape(-1, *arr.shape[2:]), dtype=np.float32)
        if not np.isfinite(out).all():
            bad = np.argwhere(~np.isfinite(out))[0]
            raise WorkloadError(
                f"{key}: expected finite values (within float32 range), found "
                f"{arr.reshape(-1, *arr.shape[2:])[tuple(bad)]} at flattened head "
                f"{bad[0]}, token {bad[1]}"
            )
        return out

    fq, fk, fv = flat("q"), flat("k"), flat("v")
    indexer = None
    if has_index and not dsa:
        fiq, fik = flat("index_q"), flat("index_k")
    else:
        fiq, fik = derive_indexer(fq, fk, n_kv_heads=fk.shape[0])
    if dsa:
        def layer_major(key: str) -> np.ndarray:
            out = np.ascontiguousarray(read(key), dtype=np.float32)
            if not np.isfinite(out).all():
                raise WorkloadError(f"{key}: expected finite values (within float32 range)")
            return out

        scale_k = layer_major("key_scale") if "key_scale" in arrays else None
        indexer = Indexer(
            q=layer_major("index_q"),
            weights=layer_major("weights"),
            k=layer_major("index_k"),
            key_scale=scale_k,
            key_format="float32",
            of_kv_head=np.repeat(np.arange(len(chosen), dtype=np.int64), n_kv),
            description=(
                f"dumped DSA indexer: {arrays['index_q'].shape[2]} index heads of dim "
                f"{arrays['index_q'].shape[3]}, one per layer, shared by its {n_kv} KV heads"
            ),
        )
    kinds = tuple(
        f"L{int(layer_ids[l])}/H{int(kv_head_ids[l, h])}" for l in chosen for h in range(n_kv)
    )
    index_note = (
        "dumped DSA indexer (blocks: derived indexer)" if dsa
        else "dumped indexer" if has_index else "derived indexer (derive_indexer)"
    )
    return Workload(
        name=path.stem,
        q=fq,
        k=fk,
        v=fv,
        index_q=fiq,
        index_k=fik,
        head_kinds=kinds,
        query_positions=query_positions(tokens, queries, seed),
        scale=scale,
        source=(
            f"{path.name}: layers {[int(layer_ids[l]) for l in chosen]}, {n_heads} query / "
            f"{n_kv} KV heads each, {tokens} tokens, {formats.get('q', q.dtype)}; {index_note}"
        ),
        indexer=indexer,
    )


def _describe(key: str, shape: Tuple[int, ...]) -> str:
    """A 4-D dump array's shape in words: layers, heads, tokens, dims."""
    heads = "query heads" if key == "q" else ("index heads" if key.startswith("index")
                                              else "KV heads")
    if len(shape) != 4:
        return f"{len(shape)} dimensions"
    layers, h, t, dim = shape
    return f"{layers} layers x {h} {heads} x {t} tokens x dim {dim}"


def _transposed_hint(q_shape: Tuple[int, ...]) -> str:
    """A suffix for shape errors when ``q`` has fewer tokens than heads (a
    dump probably saved as ``[layers, tokens, heads, d]``); '' otherwise."""
    _, heads, tokens, _ = q_shape
    if tokens >= heads:
        return ""
    return (
        f"; q reads as {heads} query heads of {tokens} tokens: were the arrays saved as "
        f"[layers, tokens, heads, dim]? The format is [layers, heads, tokens, dim] "
        f"(x.transpose(0, 2, 1, 3))"
    )


def _read_npz(path: Path) -> Tuple[Dict[str, np.ndarray], Dict[str, str]]:
    """The dump's arrays (memory-mapped, in their file dtype) and formats, read
    by the one dump loader (:func:`kvselect.checking.load_dump`: its shared
    refusals and the workload table), then the workload's own rules."""
    from kvselect.checking import DumpError, load_dump

    try:
        dump = load_dump(path, expect=("workload",))
    except DumpError as e:
        raise WorkloadError(str(e)) from None
    keys = set(dump)
    if ("index_q" in keys) != ("index_k" in keys):
        have, lack = ("index_q", "index_k") if "index_q" in keys else ("index_k", "index_q")
        raise WorkloadError(
            f"{lack}: missing; {have} is present, and the indexer needs both "
            f"(or neither, to derive one)"
        )
    dsa = "weights" in keys
    if dsa and "index_q" not in keys:
        raise WorkloadError("weights: the DSA form's head weights need index_q and index_k")
    if "key_scale" in keys and not dsa:
        raise WorkloadError("key_scale: only the DSA form (with weights) has per-key scales")
    # The DSA form: one shared index key per position, so fewer axes.
    dsa_dims = {"index_k": (3, "[layers, tokens, d_idx]"),
                "weights": (3, "[layers, tokens, H]"),
                "key_scale": (2, "[layers, tokens]")}
    for key in sorted(keys):
        arr = dump[key]
        if key in ("kind", "scale", "layer_ids", "kv_head_ids"):
            continue
        if dsa and key in dsa_dims:
            ndim, what = dsa_dims[key]
            if arr.ndim != ndim:
                raise WorkloadError(
                    f"{key}: expected {ndim} dimensions {what} (the DSA form: "
                    f"weights is present), got shape {arr.shape}"
                )
        elif arr.ndim != 4:
            dims = "d_idx" if key.startswith("index") else ("d_v" if key == "v" else "d")
            heads = "n_heads" if key == "q" else "n_kv_heads"
            words = "query heads" if key == "q" else "KV heads"
            one = "; a single layer still needs its axis: x[None]" if arr.ndim == 3 else ""
            raise WorkloadError(
                f"{key}: expected 4 dimensions [layers, {heads}, tokens, {dims}] "
                f"(layers, {words}, tokens, head dim), got shape {arr.shape}" + one
            )
    arrays = dict(dump)
    arrays.pop("kind", None)
    return arrays, dict(dump.formats)


def _choose_layers(layers: Union[None, int, Sequence[int]], n_layers: int) -> List[int]:
    if layers is None:
        return list(range(n_layers))
    if isinstance(layers, (int, np.integer)) and not isinstance(layers, bool):
        layers = [int(layers)]
    try:
        chosen = list(layers)  # type: ignore[arg-type]
    except TypeError:
        raise WorkloadError(
            f"layers: expected None, an int or a sequence of ints, got {type(layers).__name__}"
        ) from None
    if not chosen:
        raise WorkloadError("layers: expected at least one layer, got none")
    for layer in chosen:
        if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)):
            raise WorkloadError(f"layers: expected ints, got {layer!r}")
        if not 0 <= layer < n_layers:
            raise WorkloadError(f"layers: layer {layer} is out of range [0, {n_layers})")
    if len(set(int(x) for x in chosen)) != len(chosen):
        raise WorkloadError(f"layers: expected distinct layers, got {chosen}")
    return [int(x) for x in chosen]


#: The file name of the shipped example inside the package's ``data`` folder.
EXAMPLE_FILE = "minilm_example.npz"


def example(*, queries: int = 64, seed: int = 0) -> Workload:
    """The shipped real workload: all-MiniLM-L6-v2 on the GPL-2 licence text.

    Query, key and value projections of 3 layers x 3 heads (multi-head: each
    head is its own KV head), all 512 tokens of one text, stored float16 in
    ``kvselect/data/minilm_example.npz`` in the documented format (see
    ``kvselect/data/README.md`` for provenance and which heads). The model is
    bidirectional; the evaluation applies a causal mask. Context is short:
    use small blocks (8-32) with it. The indexer is derived
    (:func:`derive_indexer`).
    """
    from importlib import resources

    ref = resources.files("kvselect").joinpath("data").joinpath(EXAMPLE_FILE)
    with resources.as_file(ref) as path:
        workload = load_npz(path, queries=queries, seed=seed)
    return replace(
        workload,
        name="minilm-example",
        source="all-MiniLM-L6-v2 on the GPL-2 licence text, " + workload.source,
    )
