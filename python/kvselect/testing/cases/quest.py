"""Quest's page-selection cases: the bugs the rule invites, one input each.

Every case is integer-valued data (every page score exact in float32 in any
summation order), checked at ``rtol = atol = 0`` through
:func:`kvselect.testing.assert_quest`; ``case.expected`` is the NumPy twin's
answer (:mod:`kvselect.reference.quest`, written from mit-han-lab/Quest
@01c1623b and SGLang @00544d86). ``case.meta["faulty"]`` names the faulty
kernel the case is built to catch.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import numpy as np

from kvselect.testing.cases._case import Case

_H, _G, _D, _P = 2, 2, 8, 16


def _quest_case(
    id_: str, bug: str, q: np.ndarray, keys: np.ndarray, lens: Any, budget: int, meta: Dict[str, Any], **kw: Any
) -> Case:
    from kvselect import reference

    inputs: Dict[str, Any] = {
        "q": q.astype(np.float32),
        "keys": keys,
        "seq_lens": np.asarray(lens, np.int64),
        "page_budget": budget,
        **kw,
    }
    expected = reference.quest_select(
        inputs["q"],
        *reference.quest_bounds(
            keys,
            kw.get("page_size", _P),
            key_scale=kw.get("key_scale"),
            key_format=kw.get("key_format"),
            cu_seqlens=np.r_[0, np.cumsum(lens)],
        ),
        inputs["seq_lens"],
        budget,
        kw.get("page_size", _P),
        variant=kw.get("variant", "kernel"),
        num_recent_pages=kw.get("num_recent_pages", 4),
    )
    return Case(id_, "quest", bug, inputs, expected.astype(np.int64), {"rtol": 0.0, "atol": 0.0}, meta=meta)


def _base(rng: np.random.Generator, n: int) -> Tuple[np.ndarray, np.ndarray]:
    keys = rng.integers(-3, 4, (n, _H, _D)).astype(np.float32)
    q = rng.integers(-2, 3, (1, _H * _G, _D)).astype(np.float32)
    return q, keys


def quest_minmax_swapped(seed: int = 0) -> Case:
    """A page holds one large key along a dimension every query is positive
    on: its bound is ``q_i * kmax_i``, so it is chosen. The bug: ``kmin`` and
    ``kmax`` swapped (a metadata cache written in the other order, or
    ``where(q >= 0, q * kmin, q * kmax)``) scores it with its minimum and drops it.

    Parameters
    ----------
    seed : int
        The NumPy Generator's seed.

    Returns
    -------
    Case
        A ``quest`` case (the kernel path, 160 + 7 tokens, 4 pages of budget).
    """
    rng = np.random.default_rng(seed)
    n = 10 * _P + 7
    q, keys = _base(rng, n)
    q[..., 0] = 2.0
    keys[3 * _P + 5, :, 0] = 9.0
    return _quest_case(
        "quest_minmax_swapped", quest_minmax_swapped.__doc__ or "", q, keys, [n], 4, {"faulty": "swapped"}
    )


def quest_sign_ignored(seed: int = 0) -> Case:
    """A page holds one very negative key along a dimension every query is
    negative on: its bound is ``q_i * kmin_i > 0``, so it is chosen. The bug:
    the sign of ``q_i`` ignored (``sum_i |q_i| kmax_i``, or ``q_i * kmax_i``
    only) scores it low and drops it.

    Parameters
    ----------
    seed : int
        The NumPy Generator's seed.

    Returns
    -------
    Case
        A ``quest`` case (the kernel path).
    """
    rng = np.random.default_rng(seed)
    n = 10 * _P + 7
    q, keys = _base(rng, n)
    q[..., 0] = -2.0
    keys[5 * _P + 2, :, 0] = -9.0
    return _quest_case("quest_sign_ignored", quest_sign_ignored.__doc__ or "", q, keys, [n], 4, {"faulty": "abs"})


def quest_last_page_forced(seed: int = 0) -> Case:
    """The last page (partly filled: it holds the query's own token) scores
    lowest of all. The bug: a kernel that ranks it with the others instead of
    forcing it (Quest's controller scores ``n - 1`` pages and appends the
    last) drops the query's own page.

    Parameters
    ----------
    seed : int
        The NumPy Generator's seed.

    Returns
    -------
    Case
        A ``quest`` case (the kernel path).
    """
    rng = np.random.default_rng(seed)
    n = 8 * _P + 3
    q, keys = _base(rng, n)
    q[...] = 1.0
    keys[8 * _P :] = -3.0
    return _quest_case(
        "quest_last_page_forced", quest_last_page_forced.__doc__ or "", q, keys, [n], 3, {"faulty": "unforced"}
    )


def quest_dense_fallback(seed: int = 0) -> Case:
    """Fewer pages than the budget: every page is read (Quest's
    ``need_estimate`` is false and ``decode_sparse_attn`` reads every page).
    The bug: a kernel that hands the attention only the pages it would have
    estimated (``kv_indices_without_last``, the last page left to be added
    elsewhere) or nothing at all (SGLang's base ``retrieve_topk`` returns an
    empty selection when the pages do not exceed ``num_recent_pages``).

    Parameters
    ----------
    seed : int
        The NumPy Generator's seed.

    Returns
    -------
    Case
        A ``quest`` case: 3 sequences of 1, 4 and 5 pages at a budget of 6.
    """
    rng = np.random.default_rng(seed)
    lens = np.array([9, 4 * _P, 4 * _P + 1])
    q = rng.integers(-2, 3, (3, _H * _G, _D)).astype(np.float32)
    keys = rng.integers(-3, 4, (int(lens.sum()), _H, _D)).astype(np.float32)
    return _quest_case(
        "quest_dense_fallback", quest_dense_fallback.__doc__ or "", q, keys, lens, 6, {"faulty": "no_last"}
    )


def quest_stale_slots(seed: int = 0) -> Case:
    """The last page is partly filled and its written keys are low, while the
    slots after them still hold an earlier request's large keys
    (``meta["stale"]``, what a reused cache page holds). The bug: bounds taken
    over the whole page, or a decode update that folds a page's first key
    into the stale bounds instead of resetting them; the evaluation script's
    variant (no forced last page) then picks the stale page.

    Parameters
    ----------
    seed : int
        The NumPy Generator's seed.

    Returns
    -------
    Case
        A ``quest`` case (``variant='eval'``).
    """
    rng = np.random.default_rng(seed)
    n = 8 * _P + 5
    q, keys = _base(rng, n)
    q[...] = 1.0
    keys = np.minimum(keys, 2.0)  # every written key below the stale ones
    keys[8 * _P :] = -3.0
    stale = np.full((_P - 5, _H, _D), 3.0, np.float32)
    return _quest_case(
        "quest_stale_slots",
        quest_stale_slots.__doc__ or "",
        q,
        keys,
        [n],
        3,
        {"faulty": "stale", "stale": stale},
        variant="eval",
    )


def quest_ties(seed: int = 0) -> Case:
    """Every page but the last scores the same: any ``page_budget - 1`` of them
    is right (``case.expected`` holds the lowest ids, kvselect's order; a
    kernel that breaks the tie otherwise still passes, ``meta["tied"]``).
    The bug it guards against: a check or a kernel that wants one order at
    the threshold (``torch.topk`` promises none).

    Parameters
    ----------
    seed : int
        The NumPy Generator's seed.

    Returns
    -------
    Case
        A ``quest`` case (the kernel path).
    """
    rng = np.random.default_rng(seed)
    n = 9 * _P + 2
    q = rng.integers(-2, 3, (1, _H * _G, _D)).astype(np.float32)
    keys = np.tile(rng.integers(-3, 4, (_P, _H, _D)).astype(np.float32), (10, 1, 1))[:n]
    return _quest_case("quest_ties", quest_ties.__doc__ or "", q, keys, [n], 4, {"faulty": None, "tied": 8})


def quest_fp8_scales(seed: int = 0) -> Case:
    """fp8 e4m3fn keys with one float32 scale per key (an engine's fp8 cache):
    a page's bound is over ``k * scale``, and one page's keys are small codes
    with a large scale. The bug: the scales ignored (bounds over the codes).

    Parameters
    ----------
    seed : int
        The NumPy Generator's seed.

    Returns
    -------
    Case
        A ``quest`` case (the kernel path, raw uint8 keys with ``key_format``).
    """
    rng = np.random.default_rng(seed)
    n = 10 * _P + 7
    q = np.ones((1, _H * _G, _D), np.float32)
    # e4m3fn codes of 1.0 (0x38) and 2.0 (0x40); scales powers of two (exact).
    codes = np.where(rng.random((n, _H, _D)) < 0.5, 0x38, 0x40).astype(np.uint8)
    scale = np.full(n, 1.0, np.float32)
    codes[4 * _P : 5 * _P] = 0x38
    scale[4 * _P : 5 * _P] = 8.0
    return _quest_case(
        "quest_fp8_scales",
        quest_fp8_scales.__doc__ or "",
        q,
        codes,
        [n],
        3,
        {"faulty": "unscaled"},
        key_format="float8_e4m3fn",
        key_scale=scale,
    )


def all_quest_cases(*, seed: int = 0) -> List[Tuple[str, Case]]:
    """Every Quest case, as ``(id, case)`` pairs.

    :func:`quest_minmax_swapped`, :func:`quest_sign_ignored`,
    :func:`quest_last_page_forced`, :func:`quest_dense_fallback`,
    :func:`quest_stale_slots`, :func:`quest_ties` and :func:`quest_fp8_scales`.

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
        quest_minmax_swapped,
        quest_sign_ignored,
        quest_last_page_forced,
        quest_dense_fallback,
        quest_stale_slots,
        quest_ties,
        quest_fp8_scales,
    ]
    return [(c.id, c) for c in (m(seed) for m in makers)]
