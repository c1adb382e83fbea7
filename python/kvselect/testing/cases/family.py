"""The indexer family's cases (issue 43): forced first / last entries and the
compressed pool's and the score pool's last partial blocks, each with its
exact answer.

The rule is ``kvselect.indexer_topk``'s with the family's options
(NVIDIA/cudnn-frontend#838's ``indexer_topk`` contract: forced entries count
inside the budget; NVIDIA/cudnn-frontend#832 lists "force_first/force_last
land inside the budget, interaction with short causal prefixes (prefix < k)"
among the contract's tests). Every score is a small integer (exact in float32
in any summation order), so the cases ask for ``rtol = atol = 0``; the
answers come from the NumPy twin (``kvselect.reference``), written from the
sources, and are checked by
:func:`kvselect.checking.check_indexer_family`.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Tuple

import numpy as np

from kvselect.testing.cases._case import Case


def _case(id_: str, bug: str, inputs: Dict[str, Any], meta: Dict[str, Any]) -> Case:
    """A family case: the exact rows of ``inputs`` (the twin's), checked by
    :func:`kvselect.checking.check_indexer_family` at ``rtol = 0``."""
    from kvselect import reference

    rule = reference.indexer_topk_packed if "cu_seqlens" in inputs else reference.indexer_topk
    expected = rule(**inputs)
    return Case(id_, "topk", bug, inputs, expected, {"rtol": 0.0, "atol": 0.0}, None, None, {"family": True, **meta})


def assert_family_rows(rows: Any, inputs: Mapping[str, Any], atol: float = 0.0, rtol: float = 0.0) -> Dict[str, Any]:
    """``rows`` checked against a family case's ``inputs`` by
    :func:`kvselect.checking.check_indexer_family`: the report when every
    row is right, else :class:`kvselect.testing.CheckFailure` naming the
    faults (``forced_dropped``, ``duplicate``, ``not_ascending``, ...)."""
    from kvselect.checking import check_indexer_family, format_report
    from kvselect.checking.report import dump_report
    from kvselect.testing import CheckFailure

    report = check_indexer_family(rows, **inputs, atol=atol, rtol=rtol)
    tolerance = {"precision": "float32", "atol": atol, "rtol": rtol, "note": "exact up to float64 rounding"}
    result = dump_report("topk", tolerance, [("indexer_family", report)])
    if result["wrong"]:
        raise CheckFailure(format_report(result, source="(indexer family)"), result)
    return result


def _values_keys(values: np.ndarray, dim: int) -> Tuple[np.ndarray, np.ndarray]:
    """One query (one head) and keys whose dot products are ``values``."""
    k = np.zeros((len(values), dim), np.float32)
    k[:, 0] = values
    q = np.zeros((1, 1, dim), np.float32)
    q[0, 0, 0] = 1.0
    return q, k


def forced_entry_dropped(seed: int = 0, *, n_keys: int = 203, topk: int = 16, dim: int = 8) -> Case:
    """Rows whose forced entries score below every other visible entry.

    The bug: a selection that ranks every visible entry and never forces the
    first / last ones (or forces them outside the budget, writing ``topk +
    F`` entries) drops the forced entries or overruns the row. The contract
    (NVIDIA/cudnn-frontend#838) puts ``force_first`` / ``force_last`` inside
    the budget: the rest of the row is the best of the entries between them.
    Activation none, so the forced entries' negative scores stay negative.

    Parameters
    ----------
    seed : int
        The NumPy Generator's seed.
    n_keys : int
        The keys (the longest context).
    topk : int
        The row width.
    dim : int
        The index dimension.

    Returns
    -------
    Case
        A ``topk`` case of the family (``meta["family"]``).
    """
    rng = np.random.default_rng(seed)
    values = rng.integers(1, 60, n_keys).astype(np.float32)
    q, k = _values_keys(values, dim)
    lens = np.array([topk - 3, topk, topk + 1, 40, 121, n_keys])
    k_rows = []
    for L in lens:  # each row its own keys: the forced ends of its context score lowest
        v = values.copy()
        v[:2] = -7
        v[max(L - 3, 0) : L] = -9
        k_rows.append(_values_keys(v, dim)[1])
    n = len(lens)
    inputs = {
        "index_q": np.repeat(q, n, axis=0),
        "weights": None,
        "index_k": np.concatenate(k_rows),
        "cu_seqlens": np.arange(n + 1) * n_keys,
        "seq_ids": np.arange(n),
        "query_pos": (lens - 1).astype(np.int64),
        "topk": topk,
        "activation": "none",
        "force_first": 2,
        "force_last": 3,
    }
    return _case(f"forced_entry_dropped-{n_keys}", forced_entry_dropped.__doc__ or "", inputs, {"form": "packed"})


def forced_entry_counted_twice(seed: int = 0, *, topk: int = 8, dim: int = 4) -> Case:
    """Short causal prefixes where the forced prefix and suffix overlap.

    The bug: a kernel that writes the ``force_first`` first and the
    ``force_last`` last entries one after the other writes an entry twice
    when the visible count ``L`` is below ``force_first + force_last`` (and
    pads the row short), or counts the overlap twice against the budget. A
    row with ``L <= topk`` holds each visible entry once; a row with ``L >
    topk`` holds the forced ones once each (the interaction with "short
    causal prefixes (prefix < k)" NVIDIA/cudnn-frontend#832 names). Rows
    ``L = 0 .. topk + 3``.

    Parameters
    ----------
    seed : int
        The NumPy Generator's seed.
    topk : int
        The row width (``force_first = force_last = topk // 2``).
    dim : int
        The index dimension.

    Returns
    -------
    Case
        A ``topk`` case of the family (``meta["family"]``).
    """
    rng = np.random.default_rng(seed)
    t = topk + 4
    values = rng.integers(0, 9, t).astype(np.float32)
    q, k = _values_keys(values, dim)
    lens = np.arange(0, t)
    inputs = {
        "index_q": np.repeat(q, len(lens), axis=0),
        "weights": None,
        "index_k": k,
        # Entries of 2 tokens: a query at 2L - 1 sees L of them, one at 0 none.
        "query_pos": np.where(lens == 0, 0, 2 * lens - 1).astype(np.int64),
        "topk": topk,
        "compress_ratio": 2,
        "force_first": topk // 2,
        "force_last": topk - topk // 2,
        "row_layout": "ascending",
    }
    return _case(
        f"forced_entry_counted_twice-{topk}", forced_entry_counted_twice.__doc__ or "", inputs, {"form": "compressed"}
    )


def pool_last_partial_block(seed: int = 0, *, ratio: int = 4, n_entries: int = 37, topk: int = 8, dim: int = 8) -> Case:
    """Queries inside a compressed pool's last, partial block.

    The bug: counting a query's entries as ``ceil((p + 1) / r)`` (or ``p // r
    + 1``) instead of ``(p + 1) // r`` lets it select the entry of the block
    its own token is still filling — future tokens. Qwen's QSA keeps that
    block's ``(p + 1) % r`` tokens apart, unscored (huggingface/transformers
    ``models/qwen4_exp/modeling_qwen4_exp.py``, ``Qwen4ExpTextQSAIndexer``:
    ``num_complete_blocks = len(visible) // compress_ratio``, the tail
    concatenated after the top-k). Here the partial block's entry scores
    highest of all, and every query sits at ``p = r·w + j``, ``j < r − 1``
    (``p < r − 1`` included: no entry yet, a row of ``-1``). QSA's shape: no
    weights, ``force_last=1``.

    Parameters
    ----------
    seed : int
        The NumPy Generator's seed.
    ratio : int
        Tokens per entry (QSA: 4).
    n_entries : int
        Entries in the cache (the partial block's entry among them).
    topk : int
        The row width.
    dim : int
        The index dimension.

    Returns
    -------
    Case
        A ``topk`` case of the family (``meta["family"]``).
    """
    rng = np.random.default_rng(seed)
    values = rng.integers(1, 30, n_entries).astype(np.float32)
    q, k = _values_keys(values, dim)
    blocks = np.array([0, 1, 3, 9, 20, n_entries - 1])
    pos = []
    for w in blocks:
        for j in range(ratio - 1):  # token j of block w: block w is partial
            pos.append(ratio * w + j)
    pos_arr = np.array(pos, dtype=np.int64)
    k_rows = []
    for p in pos_arr:
        v = values.copy()
        v[p // ratio] = 1000  # the partial block's entry: the best score, not visible
        k_rows.append(_values_keys(v, dim)[1])
    n = len(pos_arr)
    inputs = {
        "index_q": np.repeat(q, n, axis=0),
        "weights": None,
        "index_k": np.concatenate(k_rows),
        "cu_seqlens": np.arange(n + 1) * n_entries,
        "seq_ids": np.arange(n),
        "query_pos": pos_arr,
        "topk": topk,
        "compress_ratio": ratio,
        "force_last": 1,
    }
    return _case(f"pool_last_partial_block-r{ratio}", pool_last_partial_block.__doc__ or "", inputs, {"form": "packed"})


def score_pool_last_partial_block(
    seed: int = 0, *, pool: int = 8, n_keys: int = 200, topk: int = 3, dim: int = 4
) -> Case:
    """Queries whose score pool's last block is partial and holds the best score.

    The bug: a kernel that max-pools only complete blocks (``(p + 1) // P``
    of them) drops the block the query's own token is filling, although that
    block's visible positions count: with ``score_pool = P`` a query at ``p``
    has ``ceil((p + 1) / P)`` blocks (MiniMax-M3's block max-pool, the
    ``score_pool`` of NVIDIA/cudnn-frontend#838's ``indexer_topk``). Here
    the query's own token scores highest and the rest of its block lowest, so
    the partial block is the best one and must be in every row; no query
    sits at a block's end. Activation none, cuDNN's ascending row layout.

    Parameters
    ----------
    seed : int
        The NumPy Generator's seed.
    pool : int
        Positions per block (the score pool).
    n_keys : int
        The keys (each row its own context of this length).
    topk : int
        The row width, in blocks.
    dim : int
        The index dimension.

    Returns
    -------
    Case
        A ``topk`` case of the family (``meta["family"]``).
    """
    rng = np.random.default_rng(seed)
    values = rng.integers(1, 40, n_keys).astype(np.float32)
    q, _ = _values_keys(values, dim)
    n = 12
    pos = (pool * np.arange(4, 4 + n) + np.arange(n) % (pool - 1)).astype(np.int64)  # never a block's end
    k_rows = []
    for p in pos:
        v = values.copy()
        v[p - p % pool : p + 1] = -5
        v[p] = 100  # the query's own token: its partial block is the best
        k_rows.append(_values_keys(v, dim)[1])
    inputs = {
        "index_q": np.repeat(q, n, axis=0),
        "weights": None,
        "index_k": np.concatenate(k_rows),
        "cu_seqlens": np.arange(n + 1) * n_keys,
        "seq_ids": np.arange(n),
        "query_pos": pos,
        "topk": topk,
        "activation": "none",
        "score_pool": pool,
        "row_layout": "ascending",
    }
    return _case(
        f"score_pool_last_partial_block-p{pool}",
        score_pool_last_partial_block.__doc__ or "",
        inputs,
        {"form": "packed"},
    )


def all_family_cases(seed: int = 0) -> List[Tuple[str, Case]]:
    """Every family case, as ``(id, case)`` pairs.

    Parameters
    ----------
    seed : int
        The NumPy Generator's seed.

    Returns
    -------
    list of (str, Case)
        ``forced_entry_dropped``, ``forced_entry_counted_twice``,
        ``pool_last_partial_block`` and ``score_pool_last_partial_block``; run the kernel as
        ``kvselect.indexer_topk_packed`` (packed cases: ``cu_seqlens`` among
        the inputs) or ``kvselect.indexer_topk`` takes ``case.inputs``.
    """
    made = [
        forced_entry_dropped(seed),
        forced_entry_counted_twice(seed),
        pool_last_partial_block(seed),
        score_pool_last_partial_block(seed),
    ]
    return [(c.id, c) for c in made]
