"""An engine's own scores, checked: the rows an exact top-k of them
(:func:`own_scores_check`, a ``topk`` dump's ``engine_scores`` and
:func:`kvselect.testing.assert_topk`'s), and the scores themselves against
the exact ones under the tolerance (:func:`score_accuracy`)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import numpy as np

import kvselect as ks
from kvselect.checking._common import _U32, _gamma, _vacuous
from kvselect.checking.report import Report


def own_scores_check(
    engine_scores: np.ndarray,
    rows: np.ndarray,
    lens: np.ndarray,
    topk: int,
    slots: Optional[ks.GlobalSlots],
    filler: str,
) -> Report:
    """The rows against the engine's own scores, **exactly** (no
    tolerance): the self-consistency check that catches a threshold shift no
    tolerance can (vllm-project/vllm#51782). :func:`kvselect.check_topk`'s
    report plus ``vacuous``: the rows whose every position has the same
    score (any selection of the right size is right there)."""
    own = ks.check_topk(engine_scores, rows, lens, topk=topk, slots=slots, filler=filler)
    own["vacuous"] = _vacuous(engine_scores, None, lens, topk, 0.0, 0.0)
    return own


def score_accuracy(
    engine: np.ndarray,
    index_q: Any,
    weights: Any,
    index_k: Any,
    query_pos: np.ndarray,
    lens: np.ndarray,
    key_scale: Any,
    key_format: Optional[str],
    cu_seqlens: Any,
    seq_ids: Any,
    atol: float,
    rtol: float,
    compress_ratio: int,
) -> Report:
    """The engine's own scores against kvselect's (:func:`kvselect.indexer_scores`,
    :func:`kvselect.indexer_magnitudes`): a position is reported off only
    when it is off by more than ``atol + rtol m`` **whatever** the float32
    rounding of kvselect's own score (slack ``2 γ_{d+H+2} m``, the bound of
    :func:`kvselect.checking.check_indexer_topk`), so a right kernel is never
    reported. One problem per row (reason ``score_off``): the worst
    position, and how many are off."""
    q = np.asarray(index_q)
    h, d = q.shape[1], q.shape[2]
    u = _U32
    gamma = _gamma(d + h + 2)
    k_all = np.asarray(index_k)
    n = len(q)
    if cu_seqlens is None:
        groups = [(np.arange(n), 0, len(k_all))]
    else:
        cu = np.asarray(cu_seqlens, dtype=np.int64)
        seq = np.asarray(seq_ids, dtype=np.int64)
        groups = [(np.flatnonzero(seq == s), int(cu[s]), int(cu[s + 1])) for s in np.unique(seq)]
    c_all = None if key_scale is None else np.asarray(key_scale, dtype=np.float32)
    details: List[Dict[str, Any]] = []
    w = np.asarray(weights, dtype=np.float32)
    for idx, lo, hi in groups:
        keys = k_all[lo:hi]
        c = None if c_all is None else (c_all if c_all.ndim == 0 else c_all[lo:hi])
        S = ks.indexer_scores(
            q[idx], w[idx], keys, query_pos[idx], key_scale=c, key_format=key_format, compress_ratio=compress_ratio
        )
        M = ks.indexer_magnitudes(
            q[idx], w[idx], keys, query_pos[idx], key_scale=c, key_format=key_format, compress_ratio=compress_ratio
        )
        for j, i in enumerate(idx):
            L = int(lens[i])
            e = np.asarray(engine[i, :L], dtype=np.float64)
            s, m = S[j, :L].astype(np.float64), M[j, :L].astype(np.float64)
            allowed = (atol + (rtol + 2 * gamma) * m) * (1 + 4 * u) + 2.0**-140
            with np.errstate(invalid="ignore"):
                off = np.abs(e - s) > allowed
                off |= np.isnan(e) != np.isnan(s)
                off &= ~(np.isinf(e) & (e == s))
            if off.any():
                with np.errstate(invalid="ignore"):
                    excess = np.where(off, np.nan_to_num(np.abs(e - s) - allowed, nan=np.inf), -np.inf)
                t = int(np.argmax(excess))
                details.append(
                    {
                        "row": int(i),
                        "problems": [
                            {
                                "reason": "score_off",
                                "n_positions": int(off.sum()),
                                "position": t,
                                "engine": float(e[t]),
                                "kvselect": float(s[t]),
                                "allowed": float(allowed[t]),
                            }
                        ],
                    }
                )
    details.sort(key=lambda x: x["row"])
    return Report(
        rows=n,
        correct=n - len(details),
        wrong=len(details),
        by_reason={"score_off": len(details)},
        details=details,
        vacuous=0,
    )
