"""Block-selection and witness-row cases, each with its exact answer."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Sequence, Tuple

import numpy as np

import kvselect as ks
from kvselect.testing.cases._case import Case, tail_lengths

_BLOCK_CONFIG = ks.BlockSparseConfig(16, 4, 1, 1)


_FREE_CONFIG = ks.BlockSparseConfig(16, 4, 0, 0)


def _block_case(
    id_: str,
    bug: str,
    q: np.ndarray,
    k: np.ndarray,
    pos: np.ndarray,
    config: ks.BlockSparseConfig,
    scale_exp: int,
    meta: Dict[str, Any],
) -> Case:
    qs = (q * 2.0**scale_exp).astype(np.float32)
    kf = k.astype(np.float32)
    expected = ks.block_sparse_select(qs, kf, pos, config)
    inputs = {"index_q": qs, "index_k": kf, "query_pos": pos.astype(np.int64), "config": config}
    return Case(
        f"{id_}-x2^{scale_exp}",
        "blocks",
        bug,
        inputs,
        expected.astype(np.int64),
        {"rtol": 0.0, "atol": 0.0},
        meta={"scale_exp": scale_exp, **meta},
    )


def block_ties(
    seed: int = 0,
    *,
    n_keys: int = 16 * 24 + 5,
    heads: int = 2,
    dim: int = 8,
    config: ks.BlockSparseConfig = _BLOCK_CONFIG,
    scale_exp: int = 0,
) -> Case:
    """Block scores tied at the threshold: one block higher, then many
    blocks of exactly the same maximum (a repeated key in each), the rest
    lower; ``L mod block_size != 0``.

    The bug: a block top-k that takes ``>=`` the threshold selects too many
    blocks, or one that breaks ties by arrival drops a forced block for a
    tied free one (``missing_forced``).

    Parameters
    ----------
    seed : int
        The NumPy Generator's seed.
    n_keys : int
        The keys (the longest context).
    heads : int
        Index heads ``H`` (a power of two); KV heads for blocks.
    dim : int
        The index dimension ``d``.
    config : ks.BlockSparseConfig
        The block-selection config.
    scale_exp : int
        The scores are multiplied by ``2^scale_exp`` (through the weights or queries).

    Returns
    -------
    Case
        A ``blocks`` case, ``expected`` from the exact rule.
    """
    rng = np.random.default_rng(seed)
    q = rng.integers(-3, 4, (1, heads, dim)).astype(np.float64)
    q[..., 0] = 4.0
    k = rng.integers(-3, 4, (n_keys, dim)).astype(np.float64)
    k[:, 0] = -8.0  # low everywhere ...
    n_blocks = -(-n_keys // config.block_size)
    tied = rng.choice(np.arange(1, n_blocks - 1), n_blocks // 2, replace=False)
    best = rng.integers(0, 8, len(tied) + 1)
    for j, b in enumerate(tied):  # ... but one key of each tied block: the same vector
        k[b * config.block_size + best[j]] = np.concatenate([[8.0], np.zeros(dim - 1)])
    pos = tail_lengths(n_keys, 3) - 1
    q = np.repeat(q, len(pos), axis=0)
    return _block_case("block_ties", block_ties.__doc__ or "", q, k, pos, config, scale_exp, {"tied_blocks": len(tied)})


def block_partial_tail(
    seed: int = 0,
    *,
    n_keys: int = 16 * 20,
    heads: int = 2,
    dim: int = 8,
    config: ks.BlockSparseConfig = _FREE_CONFIG,
    scale_exp: int = 0,
) -> Case:
    """Queries whose last visible block is partial (``L mod block_size !=
    0``) with **future** keys in that block scoring far above every visible
    one, under a config with no forced blocks.

    The bug: a block score taken as the max over the whole block, future
    keys included (no causal mask in the last block), selects that block.

    Parameters
    ----------
    seed : int
        The NumPy Generator's seed.
    n_keys : int
        The keys (the longest context).
    heads : int
        Index heads ``H`` (a power of two); KV heads for blocks.
    dim : int
        The index dimension ``d``.
    config : ks.BlockSparseConfig
        The block-selection config.
    scale_exp : int
        The scores are multiplied by ``2^scale_exp`` (through the weights or queries).

    Returns
    -------
    Case
        A ``blocks`` case, ``expected`` from the exact rule.
    """
    rng = np.random.default_rng(seed)
    bs = config.block_size
    q = rng.integers(-3, 4, (1, heads, dim)).astype(np.float64)
    q[..., 0] = 4.0
    k = rng.integers(-3, 4, (n_keys, dim)).astype(np.float64)
    pos = np.array([bs * 12 + 4, bs * 15 + 9, bs * 18 + 1], dtype=np.int64)
    for p in pos:
        k[p // bs * bs : p + 1, 0] = -100.0  # the visible keys of the query's own block lose ...
        k[p + 1 : (p // bs + 1) * bs, 0] = 100.0  # ... its future keys would win
    q = np.repeat(q, len(pos), axis=0)
    return _block_case(
        "block_partial_tail",
        block_partial_tail.__doc__ or "",
        q,
        k,
        pos,
        config,
        scale_exp,
        {"lengths": (pos + 1).tolist()},
    )


def block_short(
    seed: int = 0, *, heads: int = 2, dim: int = 8, config: ks.BlockSparseConfig = _BLOCK_CONFIG, scale_exp: int = 0
) -> Case:
    """Short contexts: ``L`` of 1 key, within the first block, and fewer
    visible blocks than ``top_blocks`` plus the forced ones (every visible
    block selected, the rest ``-1``), and just one block more.

    The bug: a kernel that always writes ``top_blocks`` ids writes blocks
    past the visible ones, or selects a forced block twice (init and local
    overlapping: ``duplicate``).

    Parameters
    ----------
    seed : int
        The NumPy Generator's seed.
    heads : int
        Index heads ``H`` (a power of two); KV heads for blocks.
    dim : int
        The index dimension ``d``.
    config : ks.BlockSparseConfig
        The block-selection config.
    scale_exp : int
        The scores are multiplied by ``2^scale_exp`` (through the weights or queries).

    Returns
    -------
    Case
        A ``blocks`` case, ``expected`` from the exact rule.
    """
    rng = np.random.default_rng(seed)
    bs = config.block_size
    k = rng.integers(-4, 5, (bs * 9, dim)).astype(np.float64)
    pos = np.array(
        [0, 5, bs + 3, bs * 3 + 6, bs * config.top_blocks + 2, bs * (config.top_blocks + 2) + 3], dtype=np.int64
    )
    q = rng.integers(-3, 4, (len(pos), heads, dim)).astype(np.float64)
    return _block_case(
        "block_short", block_short.__doc__ or "", q, k, pos, config, scale_exp, {"lengths": (pos + 1).tolist()}
    )


def all_block_cases(*, scales: Sequence[int] = (0, 30, -30), seed: int = 0) -> List[Tuple[str, Case]]:
    """Every block-selection case, as ``(id, case)`` pairs, at each ``scale_exp``.

    :func:`block_ties`, :func:`block_partial_tail` and :func:`block_short`,
    each at every ``scale_exp`` of ``scales``.

    Parameters
    ----------
    scales : sequence of int, optional
        The ``scale_exp`` values (the queries times ``2^scale_exp``); default
        ``(0, 30, -30)``.
    seed : int, optional
        Every generator's seed (default 0).

    Returns
    -------
    list of (str, Case)
        ``(case.id, case)`` for each case.
    """
    makers: List[Callable[[int], Case]] = [
        lambda e: block_ties(seed, scale_exp=e),
        lambda e: block_partial_tail(seed, scale_exp=e),
        lambda e: block_short(seed, scale_exp=e),
    ]
    return [(c.id, c) for c in (m(e) for m in makers for e in scales)]


# ---- witness rows ---------------------------------------------------------------


def witness_rows(seed: int = 0, *, topk: int = 64, num_segments: int = 8) -> Case:
    """Serving buffers for ``scatter_topology_witnesses_``: contexts ``L``
    of 0, 1, below ``num_segments``, below ``topk``, ``topk``, ``topk + 1``
    and long (``L mod 8 != 0``); rows ``-1`` padded, rows that already hold
    some segments' left edges, rows whose reserved tail holds stale ids.

    The bug: a kernel that computes the segment edges in floating point
    (``s * L / S``) is off by one at some ``L``; one that skips a witness
    already present elsewhere in the row, or writes past ``keep = topk -
    S``, or touches the kept prefix (``prefix_changed``).

    Parameters
    ----------
    seed : int
        The NumPy Generator's seed.
    topk : int
        The ``k`` of the top-k.
    num_segments : int
        The call's ``num_segments``.

    Returns
    -------
    Case
        The ``witnesses`` case, ``expected`` from the exact rule.
    """
    rng = np.random.default_rng(seed)
    lens = np.array([0, 1, max(num_segments - 3, 3), topk - 5, topk, topk + 1, 1003, 4099, 65537], dtype=np.int64)
    rows = []
    for L in lens:
        r = np.full(topk, -1, dtype=np.int32)
        m = int(min(L, topk - 3))
        if m > 0:  # learned rows cluster on recent tokens (the middle segments empty) ...
            recent = np.arange(max(0, int(L) - 2 * m), int(L))
            r[:m] = rng.choice(recent, m, replace=False)
            edges = -(-np.arange(num_segments) * int(L) // max(1, min(num_segments, int(L))))
            r[: min(2, m)] = edges[: min(2, m)]  # ... and some segments' left edges are present
        if L > 2:
            r[-2:] = rng.integers(0, int(L), 2)  # stale ids in the reserved tail
        rows.append(r)
    before = np.stack(rows)
    after = before.copy()
    ks.scatter_topology_witnesses(after, lens, num_segments)
    inputs = {"topk_indices": before, "context_lens": lens, "num_segments": num_segments}
    return Case(
        f"witness_rows-S{num_segments}-topk{topk}",
        "witnesses",
        witness_rows.__doc__ or "",
        inputs,
        after,
        meta={"lengths": lens.tolist()},
    )


def all_witness_cases(*, seed: int = 0) -> List[Tuple[str, Case]]:
    """Every witness case, as ``(id, case)`` pairs.

    :func:`witness_rows` at several ``num_segments`` (1, 7, 8, 64 — one
    above some rows' ``L``) and widths. (No scores here: the witness rule is
    integer arithmetic, so there is no scale to vary.)

    Parameters
    ----------
    seed : int, optional
        :func:`witness_rows`'s seed (default 0).

    Returns
    -------
    list of (str, Case)
        ``(case.id, case)`` for each case.
    """
    cases = [witness_rows(seed, num_segments=s, topk=t) for s, t in ((1, 16), (7, 64), (8, 64), (64, 128))]
    return [(c.id, c) for c in cases]
