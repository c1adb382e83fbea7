"""The workload's data: :class:`Workload` (one causal evaluation problem:
per-head Q/K/V, the query positions, the approximate indexer), :class:`Indexer`,
the errors and warnings, the query positions every source draws."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Optional, Tuple, Union

import numpy as np

#: The head types :func:`synthetic` cycles through, in order, over KV heads.
HEAD_KINDS: Tuple[str, ...] = ("sink", "local", "retrieval", "diffuse")


PathLike = Union[str, os.PathLike]  # type: ignore[type-arg]


class WorkloadWarning(UserWarning):
    """A workload that loads but is probably not what was meant.

    A :class:`UserWarning`, issued by :func:`load_npz` for a dump whose heads
    and tokens look swapped, say: filter it with :mod:`warnings` by this
    class.
    """


class WorkloadError(ValueError):
    """A workload (or a workload file) that breaks the documented contract.

    A :class:`ValueError`. The message names the offending field or ``.npz``
    key, and what was expected against what was found.
    """


# --------------------------------------------------------------------------
# The workload
# --------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Indexer:
    """A DSA-style lightning indexer (DeepSeek-V3.2/V4, GLM-5).

    The learned top-k a workload's "learned" policy ranks by, scored natively
    by :func:`kvselect.indexer_topk` as ``c_t · Σ_h w_h · max(q_h · k_t, 0)``.
    Building one whose arrays disagree in shape or dtype raises
    :class:`WorkloadError`.

    Attributes
    ----------
    q : numpy.ndarray
        float32 ``[n_indexers, tokens, H, d_idx]``: each query's ``H`` index
        heads.
    weights : numpy.ndarray
        float32 ``[n_indexers, tokens, H]``: per-query head weights (scales
        folded in).
    k : numpy.ndarray
        ``[n_indexers, tokens, d_idx]``: the index keys, float32 or the raw
        ``uint8`` bytes of float8 e4m3fn (``key_format``).
    key_scale : numpy.ndarray or None
        float32 ``[n_indexers, tokens]`` per-key scales, or None.
    key_format : str
        ``"float32"`` or ``"float8_e4m3fn"``.
    of_kv_head : numpy.ndarray
        int64 ``[n_kv_heads]``: the indexer that serves each KV head (one per
        KV head, or one per layer shared by its KV heads: DSA's one learned
        row per query, shared by every head).
    description : str
        One line on what it models.
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
                f"index_q: expected float32 [n_indexers, tokens, H, d_idx], got {self.q.dtype} {self.q.shape}"
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
            raise WorkloadError(f"key_scale: expected [{n}, {t}], got {self.key_scale.shape}")
        if self.of_kv_head.ndim != 1 or not np.all((0 <= self.of_kv_head) & (self.of_kv_head < n)):
            raise WorkloadError("of_kv_head: expected one indexer index per KV head")

    @property
    def heads(self) -> int:
        """Index heads ``H``."""
        return int(self.q.shape[2])

    def inputs(self, kv_head: int, pos: np.ndarray) -> dict:
        """The keyword arguments of :func:`kvselect.indexer_topk` for KV head
        ``kv_head``'s queries at ``pos``.

        Parameters
        ----------
        kv_head : int
            The KV head (its indexer head group ``of_kv_head[kv_head]``).
        pos : ndarray of int, [n]
            The query positions.

        Returns
        -------
        dict
            ``index_q`` ``[n, H, d]``, ``weights`` ``[n, H]``, ``index_k``,
            ``key_scale`` (or None) and ``key_format``.

        Raises
        ------
        IndexError
            When ``kv_head`` or a position is out of range.
        """
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

    ``index_q``/``index_k`` (one index head per KV head) are also what block
    selection scores, as MiniMax-M3's indexer does. ``n_heads`` is a
    multiple of ``n_kv_heads`` (grouped-query attention; ``group = n_heads //
    n_kv_heads`` query heads share each KV head). All arrays are
    C-contiguous; building a workload that breaks any of this raises
    :class:`WorkloadError`. The arrays are not copied.

    Attributes
    ----------
    name : str
        Short name (``"synthetic"``, ``"minilm-example"``, a file stem).
    q : numpy.ndarray
        float32 ``[n_heads, tokens, d]``, the query heads.
    k : numpy.ndarray
        float32 ``[n_kv_heads, tokens, d]``.
    v : numpy.ndarray
        float32 ``[n_kv_heads, tokens, d_v]``.
    index_q : numpy.ndarray
        float32 ``[n_kv_heads, tokens, d_idx]``, the approximate indexer's
        query: one index head per KV head.
    index_k : numpy.ndarray
        float32 ``[n_kv_heads, tokens, d_idx]``, its key.
    head_kinds : tuple of str
        One label per KV head (``"sink"``, ``"local"``, ``"retrieval"``,
        ``"diffuse"``; ``"L3/H5"`` for dumps).
    query_positions : numpy.ndarray
        int64, 1-D, strictly increasing positions in ``[0, tokens)``; the
        query at position ``i`` sees keys ``0..=i``.
    scale : float
        The softmax scale (``1/sqrt(d)`` unless the model says otherwise):
        the logit of query head ``h`` at ``i`` on key ``j`` is
        ``q[h, i] · k[h // group, j] * scale``.
    source : str
        One line on where the workload came from.
    indexer : Indexer or None
        The DSA-style lightning indexer the learned top-k ranks by, or None:
        then the learned top-k ranks by ``index_q · index_k``
        (:meth:`learned_inputs`).
    n_layers : int
        The layers its KV heads come from, layer-major (``n_kv_heads //
        n_layers`` each; 1 for the built-in workloads): PyramidKV's
        per-layer budgets read a head's layer.
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
    n_layers: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise WorkloadError(f"name: expected a non-empty str, got {self.name!r}")
        if not isinstance(self.source, str) or "\n" in self.source:
            raise WorkloadError(f"source: expected a one-line str, got {self.source!r}")
        n_kv = self.k.shape[0] if isinstance(self.k, np.ndarray) and self.k.ndim else 0
        if not isinstance(self.n_layers, int) or self.n_layers < 1 or (n_kv and n_kv % self.n_layers):
            raise WorkloadError(f"n_layers: expected an int >= 1 dividing the {n_kv} KV heads, got {self.n_layers!r}")
        for field in ("q", "k", "v", "index_q", "index_k"):
            arr = getattr(self, field)
            if not isinstance(arr, np.ndarray):
                raise WorkloadError(f"{field}: expected a numpy.ndarray, got {type(arr).__name__}")
            if arr.dtype != np.float32:
                raise WorkloadError(f"{field}: expected dtype float32, got {arr.dtype}")
            if arr.ndim != 3:
                raise WorkloadError(f"{field}: expected 3 dimensions [heads, tokens, dim], got shape {arr.shape}")
            if not arr.flags.c_contiguous:
                raise WorkloadError(f"{field}: expected a C-contiguous array")
            if 0 in arr.shape:
                raise WorkloadError(f"{field}: expected no empty axis, got shape {arr.shape}")
        n_heads, tokens, d = self.q.shape
        n_kv = self.k.shape[0]
        if tokens < 2:
            raise WorkloadError(f"q: expected at least 2 tokens, got {tokens}")
        if self.k.shape[1:] != (tokens, d):
            raise WorkloadError(f"k: expected shape [n_kv_heads, {tokens}, {d}] to match q, got {self.k.shape}")
        if self.v.shape[:2] != (n_kv, tokens):
            raise WorkloadError(f"v: expected shape [{n_kv}, {tokens}, d_v] to match k, got {self.v.shape}")
        if n_heads % n_kv:
            raise WorkloadError(f"q: n_heads = {n_heads} is not a multiple of n_kv_heads = {n_kv}")
        if self.index_q.shape[:2] != (n_kv, tokens):
            raise WorkloadError(
                f"index_q: expected shape [{n_kv}, {tokens}, d_idx] (one index head per "
                f"KV head), got {self.index_q.shape}"
            )
        if self.index_k.shape != self.index_q.shape:
            raise WorkloadError(
                f"index_k: expected shape {self.index_q.shape} to match index_q, got {self.index_k.shape}"
            )
        kinds = self.head_kinds
        if not isinstance(kinds, tuple) or not all(isinstance(s, str) for s in kinds):
            raise WorkloadError("head_kinds: expected a tuple of str")
        if len(kinds) != n_kv:
            raise WorkloadError(f"head_kinds: expected one label per KV head ({n_kv}), got {len(kinds)}")
        pos = self.query_positions
        if not isinstance(pos, np.ndarray) or pos.dtype != np.int64 or pos.ndim != 1:
            raise WorkloadError(
                "query_positions: expected a 1-D int64 numpy.ndarray, got "
                + (f"{pos.dtype} shape {pos.shape}" if isinstance(pos, np.ndarray) else type(pos).__name__)
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
        kernel's float32 dot product ``q · k`` (one of the two terms is 0).

        Parameters
        ----------
        kv_head : int
            The KV head.
        pos : ndarray of int, [n]
            The query positions.

        Returns
        -------
        dict
            ``index_q``, ``weights``, ``index_k``, ``key_scale`` and
            ``key_format``, as :func:`kvselect.indexer_topk` takes them.

        Raises
        ------
        IndexError
            When ``kv_head`` or a position is out of range.
        """
        if self.indexer is not None:
            return self.indexer.inputs(kv_head, pos)
        return one_head_inputs(self.index_q[kv_head][pos], self.index_k[kv_head])

    @property
    def indexer_description(self) -> str:
        """What the learned top-k ranks by, in one line."""
        if self.indexer is not None:
            return self.indexer.description
        return ONE_HEAD_INDEXER

    def head_queries(self, kv_head: int, pos: np.ndarray) -> np.ndarray:
        """KV head ``kv_head``'s query heads at ``pos``, ``[n, group, d]``
        float32: what the boundary experiment's eviction policies observe.

        Parameters
        ----------
        kv_head : int
            The KV head.
        pos : ndarray of int, [n]
            The positions.

        Returns
        -------
        numpy.ndarray
            ``[n, group, d]``, C-contiguous (:meth:`head_inputs`' ``q``).

        Raises
        ------
        IndexError
            When ``kv_head`` or a position is out of range.
        """
        g = self.group
        q = self.q[kv_head * g : (kv_head + 1) * g][:, pos]
        return np.ascontiguousarray(q.transpose(1, 0, 2))

    def head_inputs(self, kv_head: int, pos: np.ndarray) -> "HeadInputs":
        """Everything the evaluation of KV head ``kv_head`` at ``pos`` reads.

        Parameters
        ----------
        kv_head : int
            The KV head.
        pos : ndarray of int, [n]
            The query positions.

        Returns
        -------
        HeadInputs
            Its query heads at ``pos``, keys, values, index rows and the
            learned top-k's inputs.

        Raises
        ------
        IndexError
            When ``kv_head`` or a position is out of range.
        """
        g = self.group
        q = self.q[kv_head * g : (kv_head + 1) * g][:, pos]
        return HeadInputs(
            q=np.ascontiguousarray(q.transpose(1, 0, 2)),
            k=self.k[kv_head],
            v=self.v[kv_head],
            index_q=np.ascontiguousarray(self.index_q[kv_head][pos]),
            index_k=self.index_k[kv_head],
            learned=self.learned_inputs(kv_head, pos),
        )

    def __repr__(self) -> str:
        return (
            f"Workload(name={self.name!r}, n_heads={self.n_heads}, "
            f"n_kv_heads={self.n_kv_heads}, tokens={self.tokens}, d={self.d}, "
            f"d_v={self.d_v}, d_index={self.d_index}, "
            f"queries={self.query_positions.size}, source={self.source!r})"
        )


#: What a workload without a DSA indexer ranks its learned top-k by.
ONE_HEAD_INDEXER = "index_q · index_k (one index head per KV head)"


def one_head_inputs(index_q: np.ndarray, index_k: np.ndarray) -> dict:
    """:func:`kvselect.indexer_topk`'s inputs for the one-head indexer
    ``index_q · index_k`` (see :meth:`Workload.learned_inputs`): ``index_q``
    ``[n, d_idx]`` at the query positions, ``index_k`` ``[tokens, d_idx]``."""
    return {
        "index_q": np.ascontiguousarray(np.stack([index_q, -index_q], axis=1)),
        "weights": np.tile(np.array([1.0, -1.0], dtype=np.float32), (len(index_q), 1)),
        "index_k": index_k,
        "key_scale": None,
        "key_format": "float32",
    }


@dataclass(frozen=True, eq=False)
class HeadInputs:
    """One KV head's tensors at the evaluated query positions ``pos`` (``n``
    of them): all that evaluating the head reads, float32.

    Attributes
    ----------
    q : numpy.ndarray
        ``[n, group, d]``: the head's query heads at ``pos``.
    k, v : numpy.ndarray
        ``[tokens, d]`` and ``[tokens, d_v]``.
    index_q : numpy.ndarray
        ``[n, d_idx]``: the one-head indexer's queries at ``pos``.
    index_k : numpy.ndarray
        ``[tokens, d_idx]``: its keys.
    learned : dict
        :func:`kvselect.indexer_topk`'s inputs for the learned top-k at ``pos``
        (:meth:`Workload.learned_inputs`).
    """

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    index_q: np.ndarray
    index_k: np.ndarray
    learned: dict


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
    than ``queries`` positions, all of them are returned.

    Parameters
    ----------
    tokens : int
        The context length (at least 1).
    queries : int
        How many positions to draw (at least 1).
    seed : int
        The draw's seed.

    Returns
    -------
    numpy.ndarray
        int64, strictly increasing, C-contiguous.

    Raises
    ------
    WorkloadError
        ``tokens`` or ``queries`` is not an int of at least 1.
    """
    tokens = as_count("tokens", tokens, minimum=1)
    queries = as_count("queries", queries, minimum=1)
    lo = tokens // 8
    span = tokens - lo
    if span <= queries:
        return np.arange(lo, tokens, dtype=np.int64)
    rng = np.random.default_rng(seed)
    edges = lo + (np.arange(queries + 1, dtype=np.int64) * span) // queries
    picks = edges[:-1] + rng.integers(0, edges[1:] - edges[:-1])
    picks[-1] = tokens - 1
    return np.ascontiguousarray(picks, dtype=np.int64)


def as_count(name: str, value: object, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise WorkloadError(f"{name}: expected an int, got {type(value).__name__}")
    if value < minimum:
        raise WorkloadError(f"{name}: expected an int >= {minimum}, got {value}")
    return int(value)


# --------------------------------------------------------------------------
# The synthetic workload
# --------------------------------------------------------------------------
