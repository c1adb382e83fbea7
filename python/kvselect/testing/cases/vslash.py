"""MInference's vertical-slash cases: the bugs the estimate invites, one input
each.

Each case is checked through :func:`kvselect.testing.assert_vslash` at the
float32 tolerance; ``case.expected`` is the NumPy twin's selection
(:mod:`kvselect.reference.vslash`, written from microsoft/MInference @fb56c917
``minference/modules/minference_forward.py``), the columns and the offsets
concatenated per head (``meta["nv"]`` columns first). ``case.meta["faulty"]``
names the faulty estimate the case is built to catch.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import numpy as np

from kvselect.testing.cases._case import Case

_D = 16


def _vslash_case(
    id_: str, bug: str, q: np.ndarray, keys: np.ndarray, v: int, s: int, meta: Dict[str, Any], **kw: Any
) -> Case:
    from kvselect import reference

    inputs: Dict[str, Any] = {"q": q.astype(np.float32), "keys": keys, "vertical_size": v, "slash_size": s, **kw}
    ev, es = reference.vslash_select(inputs["q"], keys, v, s, **kw)
    meta = {"nv": ev.shape[1], **meta}
    return Case(id_, "vslash", bug, inputs, np.concatenate([ev, es], axis=1).astype(np.int64), {}, meta=meta)


def vslash_causal_mask(seed: int = 0) -> Case:
    """The last ten keys score high for every query, and two earlier keys
    (``meta["heavy"]``) moderately. Among the last 64 queries a query sees only
    the keys up to itself (``LAST_Q_MASK``), so the late keys reach few
    queries and the two earlier columns, seen by all 64, win the free column
    slots. The bug: the estimate without the causal mask among the last
    queries (every query reading the whole sequence), which ranks the late
    keys first.

    Parameters
    ----------
    seed : int
        The NumPy Generator's seed.

    Returns
    -------
    Case
        A ``vslash`` case: 1 head, 400 keys, ``v = 32`` (2 free columns).
    """
    rng = np.random.default_rng(seed)
    L = 400
    keys = (rng.standard_normal((L, 1, _D)) * 0.1).astype(np.float32)
    q = (rng.standard_normal((1, 64, _D)) * 0.1).astype(np.float32)
    q[..., 0] = 1.0
    keys[L - 10 :, 0, 0] = 12.0
    heavy = [150, 260]
    keys[heavy, 0, 0] = 9.0
    return _vslash_case(
        "vslash_causal_mask", vslash_causal_mask.__doc__ or "", q, keys, 32, 50, {"faulty": "unmasked", "heavy": heavy}
    )


def vslash_offset_sign(seed: int = 0) -> Case:
    """Random queries and keys. The diagonals are offsets ``query - key >= 0``:
    the source turns ``topk`` indices into ``(L - 1) - index``. The bug: the
    sign flipped (``index - (L - 1)``), naming offsets ``<= 0`` — keys after
    the query.

    Parameters
    ----------
    seed : int
        The NumPy Generator's seed.

    Returns
    -------
    Case
        A ``vslash`` case: 2 heads over 1 KV head, 300 keys.
    """
    rng = np.random.default_rng(seed)
    keys = rng.standard_normal((300, 1, _D)).astype(np.float32)
    q = rng.standard_normal((2, 64, _D)).astype(np.float32)
    return _vslash_case("vslash_offset_sign", vslash_offset_sign.__doc__ or "", q, keys, 40, 120, {"faulty": "sign"})


def vslash_forced(seed: int = 0) -> Case:
    """The first 30 columns score lowest of all (every query points away from
    them). The source forces them (``vertical[..., :30] = inf``) and the 100
    nearest diagonals. The bug: the forced parts left out, ranking them with
    the others.

    Parameters
    ----------
    seed : int
        The NumPy Generator's seed.

    Returns
    -------
    Case
        A ``vslash`` case: 1 head, 500 keys.
    """
    rng = np.random.default_rng(seed)
    keys = rng.standard_normal((500, 1, _D)).astype(np.float32)
    keys[:30, 0, 0] = -6.0
    q = rng.standard_normal((1, 64, _D)).astype(np.float32)
    q[..., 0] = 2.0
    return _vslash_case("vslash_forced", vslash_forced.__doc__ or "", q, keys, 40, 120, {"faulty": "unforced"})


def vslash_short(seed: int = 0) -> Case:
    """A sequence of 40 keys, shorter than the 64 last queries: the estimate
    reads all 40 (``last_q = min(64, q_len)``), takes ``min(L, 30)`` columns and
    every diagonal. The bug: a fixed 64 (``search_pattern_v2``'s copy, and
    ``LAST_Q_MASK`` without its ``[-last_q:, -last_q:]`` cut), which fails or
    masks the wrong keys.

    Parameters
    ----------
    seed : int
        The NumPy Generator's seed.

    Returns
    -------
    Case
        A ``vslash`` case: 1 head, 40 keys, ``v = 35``.
    """
    rng = np.random.default_rng(seed)
    keys = rng.standard_normal((40, 1, _D)).astype(np.float32)
    q = rng.standard_normal((1, 40, _D)).astype(np.float32)
    return _vslash_case("vslash_short", vslash_short.__doc__ or "", q, keys, 35, 50, {"faulty": None})


def vslash_fp8_scales(seed: int = 0) -> Case:
    """fp8 e4m3fn keys with one float32 scale per key: a key's value is ``k *
    scale``, and a few keys (``meta["heavy"]``) are small codes with large
    scales. The bug: the scales ignored (scores over the codes).

    Parameters
    ----------
    seed : int
        The NumPy Generator's seed.

    Returns
    -------
    Case
        A ``vslash`` case: 1 head, 300 keys, raw uint8 keys with ``key_format``.
    """
    import ml_dtypes

    rng = np.random.default_rng(seed)
    L = 300
    codes = (rng.standard_normal((L, 1, _D)) * 2).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    scale = np.full(L, 0.25, np.float32)
    heavy = [77, 140, 201]
    codes[heavy, 0, 0] = 0x38  # 1.0
    scale[heavy] = 16.0
    q = (rng.standard_normal((1, 64, _D)) * 0.3).astype(np.float32)
    q[..., 0] = 1.0
    return _vslash_case(
        "vslash_fp8_scales",
        vslash_fp8_scales.__doc__ or "",
        q,
        codes,
        33,
        50,
        {"faulty": "unscaled", "heavy": heavy},
        key_format="float8_e4m3fn",
        key_scale=scale,
    )


def all_vslash_cases(*, seed: int = 0) -> List[Tuple[str, Case]]:
    """Every vertical-slash case, as ``(id, case)`` pairs.

    :func:`vslash_causal_mask`, :func:`vslash_offset_sign`, :func:`vslash_forced`,
    :func:`vslash_short` and :func:`vslash_fp8_scales`.

    Parameters
    ----------
    seed : int, optional
        Every generator's seed (default 0).

    Returns
    -------
    list of (str, Case)
        ``(case.id, case)`` for each case.
    """
    makers = [vslash_causal_mask, vslash_offset_sign, vslash_forced, vslash_short, vslash_fp8_scales]
    return [(c.id, c) for c in (m(seed) for m in makers)]
