"""InfLLM-v2's block-selection cases: the bugs the rule invites, one input each.

Each case is checked through :func:`kvselect.testing.assert_infllm` at the float32
bound of the core (``rtol = atol = 0`` given: the checker's own floor is the bound of
src/infllm/mod.rs); ``case.expected`` is the NumPy twin's answer
(:mod:`kvselect.reference.infllm`, written from OpenBMB/infllmv2_cuda_impl @f908e731
and MiniCPM4.1's modelling code). ``case.meta["faulty"]`` names the faulty kernel the
case is built to catch; the block scores are far apart wherever the answer depends on
them.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import numpy as np

from kvselect.testing.cases._case import Case

_G, _D = 2, 8


def _infllm_case(
    id_: str, bug: str, q: np.ndarray, ck: np.ndarray, seq_len: int, topk: int, meta: Dict[str, Any], **kw: Any
) -> Case:
    from kvselect.reference import infllm

    inputs: Dict[str, Any] = {"q": q, "ck": ck, "seq_len": seq_len, "topk": topk, **kw}
    expected = infllm.infllm_select(q, ck, seq_len, topk, **kw)
    return Case(id_, "infllm", bug, inputs, expected.astype(np.int64), {"rtol": 0.0, "atol": 0.0}, meta=meta)


def _base(rng: np.random.Generator, seq_len: int) -> Tuple[np.ndarray, np.ndarray]:
    from kvselect.reference.infllm import compressed_len

    ck = (rng.standard_normal((compressed_len(seq_len), 1, _D)) * 0.05).astype(np.float32)
    q = np.zeros((1, _G, _D), np.float32)
    q[..., 0] = 1.0
    return q, ck


def infllm_window_off_by_one(seed: int = 0) -> Case:
    """One compressed key stands out: key ``4b - 1``, the first tap of block ``b`` and
    the last of block ``b - 1`` (the window is ``[4b - 1, 4b + 4)``: kernel 5, stride 4,
    padding 1, ``csrc/max_pooling_1d.cuh``). The bug: the padding dropped (``[4b, 4b +
    5)``), so block ``b`` misses it and another block takes its slot.

    Parameters
    ----------
    seed : int
        The NumPy Generator's seed.

    Returns
    -------
    Case
        An ``infllm`` case (768 tokens, one decoding query, 2 free blocks of 5).
    """
    rng = np.random.default_rng(seed)
    n = 12 * 64
    q, ck = _base(rng, n)
    ck[4 * 5 - 1, 0, 0] = 6.0
    return _infllm_case(
        "infllm_window_off_by_one",
        infllm_window_off_by_one.__doc__ or "",
        q,
        ck,
        n,
        5,
        {"faulty": "window"},
        init_blocks=1,
        local_blocks=1,
    )


def infllm_current_not_forced(seed: int = 0) -> Case:
    """A decoding query 5 tokens into its block: none of the block's compressed keys has
    ended, so it pools to 0 and would lose every comparison; the CUDA pooling forces it
    (``off_bq >= off_bk && off_bq <= off_bk + local_blocks``: ``local_blocks + 1``
    blocks, the current one included). The bug: the window ``[qb - local_blocks, qb)``.

    Parameters
    ----------
    seed : int
        The NumPy Generator's seed.

    Returns
    -------
    Case
        An ``infllm`` case (645 tokens, 4 blocks: init, the previous and the current
        forced).
    """
    rng = np.random.default_rng(seed)
    n = 10 * 64 + 6
    q, ck = _base(rng, n)
    ck[4 * 3 + 1, 0, 0] = 4.0
    ck[4 * 6 + 1, 0, 0] = 3.0
    return _infllm_case(
        "infllm_current_not_forced",
        infllm_current_not_forced.__doc__ or "",
        q,
        ck,
        n,
        4,
        {"faulty": "current"},
        init_blocks=1,
        local_blocks=1,
    )


def infllm_decode_drops_current(seed: int = 0) -> Case:
    """An earlier MiniCPM4 copy drops ids ``>= q_idx`` after the top-k (MiniCPM4.1: ``>
    q_idx``): at decode the current block goes (``keep="before_current"``). The bug: the
    wrong filter for the variant (the current block kept, or a future block).

    Parameters
    ----------
    seed : int
        The NumPy Generator's seed.

    Returns
    -------
    Case
        An ``infllm`` case (``keep="before_current"``, 700 tokens).
    """
    rng = np.random.default_rng(seed)
    n = 700
    q, ck = _base(rng, n)
    ck[9, 0, 0] = 5.0
    return _infllm_case(
        "infllm_decode_drops_current",
        infllm_decode_drops_current.__doc__ or "",
        q,
        ck,
        n,
        5,
        {"faulty": "filter"},
        init_blocks=1,
        local_blocks=1,
        keep="before_current",
    )


def infllm_ties(seed: int = 0) -> Case:
    """A zero query: every softmax is uniform, every block pools the same score, and the
    top-k is one tie (``torch.topk`` keeps any of them; kvselect the lowest ids). A right
    kernel may keep any, as many as ``topk`` holds; the bug: fewer, or a future block.

    Parameters
    ----------
    seed : int
        The NumPy Generator's seed.

    Returns
    -------
    Case
        An ``infllm`` case (640 tokens, the Triton pooling).
    """
    rng = np.random.default_rng(seed)
    n = 640
    _, ck = _base(rng, n)
    q = np.zeros((1, _G, _D), np.float32)
    return _infllm_case(
        "infllm_ties",
        infllm_ties.__doc__ or "",
        q,
        ck,
        n,
        6,
        {"faulty": "ties"},
        init_blocks=1,
        local_blocks=2,
        pooling="triton",
    )


def infllm_fp8_scales(seed: int = 0) -> Case:
    """fp8 compressed keys with a scale each: the largest stored key has a small scale,
    so its block is not the best. The bug: the scales ignored.

    Parameters
    ----------
    seed : int
        The NumPy Generator's seed.

    Returns
    -------
    Case
        An ``infllm`` case (fp8 ``ck`` with ``ck_scale``, 768 tokens).
    """
    import ml_dtypes

    rng = np.random.default_rng(seed)
    n = 12 * 64
    q, ck = _base(rng, n)
    ck[5, 0, 0], ck[25, 0, 0] = 6.0, 3.0
    scale = np.ones(len(ck), np.float32)
    scale[5] = 0.125
    return _infllm_case(
        "infllm_fp8_scales",
        infllm_fp8_scales.__doc__ or "",
        q,
        ck.astype(ml_dtypes.float8_e4m3fn),
        n,
        4,
        {"faulty": "scales"},
        init_blocks=1,
        local_blocks=1,
        ck_scale=scale,
    )


def all_infllm_cases(*, seed: int = 0) -> List[Tuple[str, Case]]:
    """Every InfLLM-v2 case, as ``(id, case)`` pairs.

    :func:`infllm_window_off_by_one`, :func:`infllm_current_not_forced`,
    :func:`infllm_decode_drops_current`, :func:`infllm_ties` and
    :func:`infllm_fp8_scales`.

    Parameters
    ----------
    seed : int, optional
        Every generator's seed (default 0).

    Returns
    -------
    list of (str, Case)
        ``(case.id, case)`` for each case.
    """
    makers = [
        infllm_window_off_by_one,
        infllm_current_not_forced,
        infllm_decode_drops_current,
        infllm_ties,
        infllm_fp8_scales,
    ]
    return [(c.id, c) for c in (m(seed) for m in makers)]
