"""NSA's block-selection cases (fla's computation): the bugs the rule invites, one input
each.

Each case is checked through :func:`kvselect.testing.assert_nsa` at the float32 bound of
the core (``rtol = atol = 0`` given: the checker's own floor is the bound of
src/nsa/mod.rs); ``case.expected`` is the NumPy twin's answer (:mod:`kvselect.reference.nsa`,
written from fla-org/flash-linear-attention @bc3b101d ``fla/ops/nsa/parallel.py``).
``case.meta["faulty"]`` names the faulty kernel the case is built to catch; the block
scores are far apart wherever the answer depends on them. The keys are constant over
each block, so each block's mean is its tokens' key.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from kvselect.testing.cases._case import Case


def _keys(blocks: Sequence[Sequence[float]], bs: int, tail: Sequence[Sequence[float]] = ()) -> np.ndarray:
    """Keys ``[seq_len, 1, d]``: each block's key repeated over its ``bs`` tokens, then the
    tokens of an incomplete tail."""
    rows = [b for b in blocks for _ in range(bs)] + list(tail)
    return np.asarray(rows, np.float32)[:, None, :]


def _nsa_case(
    id_: str, bug: str, q: np.ndarray, k: np.ndarray, block_counts: int, meta: Dict[str, Any], **kw: Any
) -> Case:
    from kvselect.reference import nsa

    inputs: Dict[str, Any] = {"q": q, "k": k, "block_counts": block_counts, **kw}
    expected = nsa.nsa_select(q, k, block_counts, **kw)
    return Case(id_, "nsa", bug, inputs, expected.astype(np.int64), {"rtol": 0.0, "atol": 0.0}, meta=meta)


def nsa_incomplete_block_compressed(seed: int = 0) -> Case:
    """The query's own block is incomplete (2 of its 4 tokens) and its keys stand out for
    one head. fla's softmax runs over the complete blocks only (``NC = (p + 1) // BS``).
    The bug: the incomplete block's mean compressed and put in that head's softmax. This
    shrinks the head's probabilities, so the other head's favourite block wins.

    Parameters
    ----------
    seed : int
        Unused (the case is fixed); kept for the cases' common signature.

    Returns
    -------
    Case
        An ``nsa`` case (22 tokens in blocks of 4, one query, 2 heads in one group,
        3 forced blocks + 1 free).
    """
    k = _keys([[0, 0], [3, 0], [0, 2.9], [0, 0], [0, 0]], 4, tail=[[10, 0], [10, 0]])
    q = np.array([[[1, 0], [0, 1]]], np.float32)
    return _nsa_case(
        "nsa_incomplete_block_compressed",
        nsa_incomplete_block_compressed.__doc__ or "",
        q,
        k,
        4,
        {"faulty": "incomplete"},
        block_size=4,
        scale=1.0,
    )


def nsa_group_sum_before_softmax(seed: int = 0) -> Case:
    """Two heads of one group disagree. Head A prefers block 1 strongly, head B prefers
    block 2 mildly, and block 1 is far below for B. The rule normalises each head, then
    sums (``tl.sum(b_p, 0)``), so block 1 wins. The bug: the logits summed over the group
    before one softmax, so block 2 wins.

    Parameters
    ----------
    seed : int
        Unused (the case is fixed); kept for the cases' common signature.

    Returns
    -------
    Case
        An ``nsa`` case (20 tokens in blocks of 4, one query, 3 forced blocks + 1 free).
    """
    k = _keys([[0, 0], [5, -5], [0, 1], [0, 0], [0, 0]], 4)
    q = np.array([[[1, 0], [0, 1]]], np.float32)
    return _nsa_case(
        "nsa_group_sum_before_softmax",
        nsa_group_sum_before_softmax.__doc__ or "",
        q,
        k,
        4,
        {"faulty": "group_first"},
        block_size=4,
        scale=1.0,
    )


def nsa_tq_offsets(seed: int = 0) -> Case:
    """A prefill chunk: 2 queries at the end of 40 tokens (``Tq != Tkv``). The parallel
    kernel places query ``i`` at ``i + TK - TQ``. The bug: fla's naive code's ``p = i``,
    which sees no complete block and returns block 0 alone.

    Parameters
    ----------
    seed : int
        The NumPy Generator's seed.

    Returns
    -------
    Case
        An ``nsa`` case (40 tokens in blocks of 4, 2 queries, 4 heads in one group).
    """
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((40, 1, 8)).astype(np.float32)
    k[8:12] += 3.0
    q = np.abs(rng.standard_normal((2, 4, 8))).astype(np.float32)
    return _nsa_case("nsa_tq_offsets", nsa_tq_offsets.__doc__ or "", q, k, 5, {"faulty": "offsets"}, block_size=4)


def nsa_eq9_overlap_window(seed: int = 0) -> Case:
    """The NSA paper's Eq. 9 (``window="eq9"``): block ``j`` sums compressed keys ``4j - 4
    .. 4j`` (weighted 1, 2, 2, 2, 1; keys of 32 tokens every 16, blocks of 64). The keys
    that overlap block ``j`` are ``4j - 1 .. 4j + 3`` (InfLLM-v2's pooling window). The
    bug: a kernel that scores Eq. 9's blocks over the overlap window. Tokens 144 .. 175
    stand out: compressed key 9 (tokens 144 .. 175) peaks, keys 8 and 10 half. Eq. 9 picks
    block 3 (keys 8 .. 12 hold 8 once, 9 and 10 twice); the overlap window, like fla's
    block means, picks block 2 (tokens 128 .. 191, keys 7 .. 11).

    Parameters
    ----------
    seed : int
        Unused (the case is fixed); kept for the cases' common signature.

    Returns
    -------
    Case
        An ``nsa`` case with ``window="eq9"`` (512 tokens of ``d = 1``, one query, one
        head, 3 forced blocks + 1 free).
    """
    k = np.zeros((512, 1, 1), np.float32)
    k[144:176] = 4.0
    q = np.ones((1, 1, 1), np.float32)
    return _nsa_case(
        "nsa_eq9_overlap_window",
        nsa_eq9_overlap_window.__doc__ or "",
        q,
        k,
        4,
        {"faulty": "overlap_window"},
        block_size=64,
        scale=1.0,
        window="eq9",
        kernel_size=32,
        kernel_stride=16,
    )


def all_nsa_cases(*, seed: int = 0) -> List[Tuple[str, Case]]:
    """Every NSA case, as ``(id, case)`` pairs.

    :func:`nsa_incomplete_block_compressed`, :func:`nsa_group_sum_before_softmax`,
    :func:`nsa_tq_offsets` and :func:`nsa_eq9_overlap_window`.

    Parameters
    ----------
    seed : int, optional
        Every generator's seed (default 0).

    Returns
    -------
    list of (str, Case)
        ``(case.id, case)`` for each case.
    """
    makers = [nsa_incomplete_block_compressed, nsa_group_sum_before_softmax, nsa_tq_offsets, nsa_eq9_overlap_window]
    return [(c.id, c) for c in (m(seed) for m in makers)]
