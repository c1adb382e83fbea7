"""MoBA's block-selection cases: the bugs the rule invites, one input each.

Every case is small-integer data over blocks of a power of two (every block mean
and gate exact in float32 in any summation order), checked at ``rtol = atol = 0``
through :func:`kvselect.testing.assert_moba`; ``case.expected`` is the NumPy twin's
answer (:mod:`kvselect.reference.moba`, written from MoonshotAI/MoBA @61e456bc).
``case.meta["faulty"]`` names the faulty kernel the case is built to catch.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import numpy as np

from kvselect.testing.cases._case import Case

_H, _G, _D, _B = 1, 2, 8, 8


def _moba_case(id_: str, bug: str, q: np.ndarray, keys: np.ndarray, topk: int, meta: Dict[str, Any], **kw: Any) -> Case:
    from kvselect import reference

    inputs: Dict[str, Any] = {
        "q": q.astype(np.float32),
        "keys": keys.astype(np.float32),
        "topk": topk,
        "block_size": _B,
        **kw,
    }
    expected = reference.moba_select(inputs["q"], inputs["keys"], topk, _B, variant=kw.get("variant", "efficient"))
    return Case(id_, "moba", bug, inputs, expected.astype(np.int64), {"rtol": 0.0, "atol": 0.0}, meta=meta)


def moba_partial_block_gated(seed: int = 0) -> Case:
    """The query's own block holds keys aligned with the query (its partial mean
    gates high) while the past blocks do not. The bug: the current block gated on
    its partial mean like a completed block (a block counted before it is
    complete, e.g. ``gate_chunk_end_mask`` taken as ``<=`` the chunk's start): it
    wins a gated slot, and the row holds one past block too few.

    Parameters
    ----------
    seed : int
        The NumPy Generator's seed.

    Returns
    -------
    Case
        A ``moba`` case (5 blocks of 8 and 3 tokens, topk 3, 2 query heads).
    """
    rng = np.random.default_rng(seed)
    n = 5 * _B + 3
    keys = rng.integers(-2, 3, (n, _H, _D)).astype(np.float32)
    q = np.ones((n, _H * _G, _D), np.float32)
    keys[5 * _B :] = 3.0
    return _moba_case(
        "moba_partial_block_gated", moba_partial_block_gated.__doc__ or "", q, keys, 3, {"faulty": "partial"}
    )


def moba_current_block_forced(seed: int = 0) -> Case:
    """The query's own block is the worst by gate (its keys oppose the query).
    The bug: the current block gated instead of forced (one top-k over blocks
    ``0..c`` without MoBA's ``+inf``, or ``topk`` spent on past blocks alone): the
    query loses its own block.

    Parameters
    ----------
    seed : int
        The NumPy Generator's seed.

    Returns
    -------
    Case
        A ``moba`` case (6 blocks of 8, topk 2).
    """
    rng = np.random.default_rng(seed)
    n = 6 * _B
    keys = rng.integers(0, 3, (n, _H, _D)).astype(np.float32)
    keys[5 * _B :] = -3.0
    q = np.ones((n, _H * _G, _D), np.float32)
    return _moba_case(
        "moba_current_block_forced", moba_current_block_forced.__doc__ or "", q, keys, 2, {"faulty": "gated"}
    )


def moba_ties(seed: int = 0) -> Case:
    """Past blocks copied from one another: equal gates, bit for bit, more of
    them than the free slots. Any choice among the tied blocks is right (the
    check compares gates); kvselect's twin takes the lower block ids. The bug it
    catches: a kernel that drops a tied block for a worse one, or fills a slot
    twice.

    Parameters
    ----------
    seed : int
        The NumPy Generator's seed.

    Returns
    -------
    Case
        A ``moba`` case (7 blocks of 8 and 1 token, topk 3; blocks 1, 3, 4 equal).
    """
    rng = np.random.default_rng(seed)
    n = 7 * _B + 1
    keys = rng.integers(-1, 2, (n, _H, _D)).astype(np.float32)
    best = np.full((_B, _H, _D), 2.0, np.float32)
    for b in (1, 3, 4):
        keys[b * _B : (b + 1) * _B] = best
    q = np.ones((n, _H * _G, _D), np.float32)
    return _moba_case("moba_ties", moba_ties.__doc__ or "", q, keys, 3, {"faulty": "ties"})


def all_moba_cases(*, seed: int = 0) -> List[Tuple[str, Case]]:
    """Every MoBA case, as ``(id, case)`` pairs: a block gated before it is
    complete (:func:`moba_partial_block_gated`), the current block gated instead
    of forced (:func:`moba_current_block_forced`), ties at the threshold
    (:func:`moba_ties`).

    Parameters
    ----------
    seed : int, optional
        Every generator's seed (default 0).

    Returns
    -------
    list of (str, Case)
        ``(case.id, case)`` for each ``moba`` case, each with ``meta["faulty"]``.
    """
    return [(c.id, c) for c in (moba_partial_block_gated(seed), moba_current_block_forced(seed), moba_ties(seed))]
