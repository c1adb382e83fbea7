"""The indexer family's rows checked: activation, no weights, forced first /
last entries, and cuDNN's ascending compact layout (issue 43).

The rule (NVIDIA/cudnn-frontend#838, ``cudnn.sparse_attention.indexer_topk``;
``kvselect.indexer_topk``'s options): a row that cannot hold every visible
entry (``L > topk``) holds the first ``force_first`` and last ``force_last``
visible entries and, for the rest of its budget, the best of the entries
between them; a row with ``L <= topk`` holds every visible entry once.

Why the check is the plain top-k check: giving every forced entry the score
``+inf`` (and no error scale) makes "the forced entries, then the best of the
rest" exactly "the ``topk`` best" — the forced entries fit the budget, so
they are all above the threshold and the rest is decided by the real scores
as before. A dropped forced entry is then a dropped ``+inf``, named
``forced_dropped``; one counted twice is the top-k check's ``duplicate``
(a second slot of one position), and with ``row_layout="ascending"`` an entry
not above the one before it is ``not_ascending`` (a ``-1`` before an entry is
the top-k check's ``padding_hole``). What would break it: a row rule where a
forced entry does not count inside the budget (the ``+inf`` entries would then
crowd out real ones), or forced entries past the budget (refused).

The scores are exact up to float64 rounding (every product of two decoded
float32 operands exact): two entries within ``2 γ_{d+H+3}`` of the magnitude
``|c_t| Σ_h |w_h| Σ_i |q_hi k_ti|`` of each other are a tie, as
:func:`check_indexer_topk` judges them, so kvselect's own rows always pass.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

import kvselect as ks
from kvselect.checking._common import _refused
from kvselect.checking.report import Report
from kvselect.reference.indexer import head_sum_scores, visible
from kvselect.reference.keys import decode

#: float64's unit roundoff.
_U64 = 2.0**-53


REASONS = ("forced_dropped", "not_ascending")
"""The reasons this check adds to :func:`kvselect.check_topk`'s."""


def check_indexer_family(
    rows: Any,
    index_q: Any,
    weights: Any,
    index_k: Any,
    query_pos: Any,
    topk: Optional[int] = None,
    *,
    key_scale: Any = None,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    cu_seqlens: Any = None,
    seq_ids: Any = None,
    compress_ratio: int = 1,
    activation: str = "relu",
    force_first: int = 0,
    force_last: int = 0,
    row_layout: str = "rank",
    score_pool: int = 1,
    atol: float = 0.0,
    rtol: float = 0.0,
) -> Report:
    """Whether each row is a right indexer-family top-k of the inputs.

    The arguments are :func:`kvselect.indexer_topk`'s (a packed batch with
    ``cu_seqlens`` and ``seq_ids``, as :func:`kvselect.indexer_topk_packed`
    takes it), the options included. Judged against scores exact up to
    float64 rounding (see the module docs).

    Parameters
    ----------
    rows : array_like of int, [n_rows, topk]
        The engine's rows: row-relative entries, ``-1`` padded; with
        ``row_layout="ascending"``, ascending and compact.
    index_q, weights, index_k, query_pos, key_scale, key_format, query_format : array_like
        As :func:`kvselect.indexer_topk` takes them (``weights=None``: no weights).
    topk : int, optional
        The row width ``k`` (default: the rows' width).
    cu_seqlens, seq_ids : array_like of int, optional
        A packed batch's key offsets and each row's sequence.
    compress_ratio, activation, force_first, force_last, row_layout, score_pool : optional
        As :func:`kvselect.indexer_topk` takes them (with ``score_pool``, rows of block ids
        against the blocks' exact max-pool scores, each block's error scale its largest
        entry's).
    atol, rtol : float, optional
        Extra tolerance on each score (``rtol`` times its magnitude).

    Returns
    -------
    Report
        :func:`kvselect.check_topk`'s report, its ``by_reason`` and
        ``details`` with ``forced_dropped`` (the forced entries missing from
        a row that had to hold them) and ``not_ascending``.

    Raises
    ------
    SelectionError
        On an option the indexer refuses (naming it), or rows that do not fit the inputs.

    See Also
    --------
    kvselect.indexer_topk : The rule's implementation.
    check_indexer_topk : The check without the family's options.

    Examples
    --------
    >>> import numpy as np, kvselect as ks
    >>> from kvselect.checking import check_indexer_family
    >>> rng = np.random.default_rng(0)
    >>> q = rng.standard_normal((3, 4, 8)).astype(np.float32)
    >>> k = rng.standard_normal((40, 8)).astype(np.float32)
    >>> rows = ks.indexer_topk(q, None, k, [10, 25, 39], 6, force_last=1, row_layout="ascending")
    >>> check_indexer_family(rows, q, None, k, [10, 25, 39], force_last=1, row_layout="ascending")["wrong"]
    0
    """
    engine = np.asarray(rows)
    if engine.ndim != 2 or engine.dtype.kind not in "iu":
        raise _refused("rows", f"rows must be 2-D integers, got {engine.dtype} {engine.shape}")
    k_width = engine.shape[1] if topk is None else int(topk)
    # Every argument judged as the indexer judges it (refusals name the argument).
    if cu_seqlens is None:
        ks.indexer_topk(
            index_q,
            weights,
            index_k,
            query_pos,
            k_width,
            key_scale=key_scale,
            key_format=key_format,
            query_format=query_format,
            compress_ratio=compress_ratio,
            activation=activation,
            force_first=force_first,
            force_last=force_last,
            row_layout=row_layout,
            score_pool=score_pool,
        )
    else:
        ks.indexer_topk_packed(
            index_q,
            weights,
            index_k,
            cu_seqlens,
            seq_ids,
            query_pos,
            k_width,
            key_scale=key_scale,
            key_format=key_format,
            query_format=query_format,
            compress_ratio=compress_ratio,
            activation=activation,
            force_first=force_first,
            force_last=force_last,
            row_layout=row_layout,
            score_pool=score_pool,
        )
    q = decode(index_q, query_format, "query_format")
    k = decode(index_k, key_format, "key_format")
    n, h, d = q.shape
    w = np.ones((n, h)) if weights is None else np.asarray(weights, dtype=np.float32).astype(np.float64)
    c = np.ones(len(k)) if key_scale is None else np.asarray(key_scale, dtype=np.float32).astype(np.float64)
    c = np.broadcast_to(c, (len(k),))
    pos = np.asarray(query_pos, dtype=np.int64).reshape(-1)
    pos = np.broadcast_to(pos, (n,))
    relu, m = activation == "relu", int(compress_ratio)
    f0, f1 = int(force_first), int(force_last)
    if len(engine) != n:
        raise _refused("rows", f"rows has {len(engine)} rows for {n} queries")
    if cu_seqlens is None:
        bounds, seq = np.array([0, len(k)]), np.zeros(n, dtype=np.int64)
    else:
        bounds = np.asarray(cu_seqlens, dtype=np.int64).reshape(-1)
        seq = np.asarray(seq_ids, dtype=np.int64).reshape(-1)
    pool = int(score_pool)
    width = -(-int(np.diff(bounds).max()) // pool) if len(bounds) > 1 else 0
    scores = np.full((n, width), np.nan)
    mags = np.full((n, width), np.nan)
    lens = np.zeros(n, dtype=np.int64)
    forced = []
    qa, ka = np.abs(q), np.abs(k)
    for i in range(n):
        lo, hi = int(bounds[seq[i]]), int(bounds[seq[i] + 1])
        entries = visible(int(pos[i]), m, hi - lo)
        with np.errstate(invalid="ignore", over="ignore"):
            s_i = head_sum_scores(q[i], w[i], k[lo : lo + entries], relu) * c[lo : lo + entries]
            m_i = head_sum_scores(qa[i], np.abs(w[i]), ka[lo : lo + entries]) * np.abs(c[lo : lo + entries])
        if pool > 1:  # the blocks' max-pool (NaN absent), each scaled by its largest magnitude
            s_i, m_i = _pooled(s_i, pool), _pooled(np.nan_to_num(m_i, nan=np.inf), pool)
        L = len(s_i)
        lens[i] = L
        scores[i, :L], mags[i, :L] = s_i, m_i
        mine = np.zeros(0, dtype=np.int64)
        if L > k_width:  # a row short of its context: its forced entries are members
            mine = np.concatenate([np.arange(f0), np.arange(L - f1, L)]).astype(np.int64)
            scores[i, mine], mags[i, mine] = np.inf, 0.0
        forced.append(mine)
    # Twice γ_{d+H+3} in float64: two float64 sums of one real score, in any
    # order, differ by less than this times its magnitude (check_indexer_topk's tie).
    nu = d + h + 3
    slack = 2 * nu * _U64 / (1 - nu * _U64)
    report = ks.check_topk(
        scores, engine, lens, topk=k_width, atol=atol, rtol=rtol + slack, magnitudes=np.nan_to_num(mags, nan=0.0)
    )
    return _with_family_reasons(Report(report), engine, forced, row_layout == "ascending")


def _pooled(x: np.ndarray, pool: int) -> np.ndarray:
    """The max of each block of ``pool`` entries (the last partial), NaN
    absent, ``-inf`` for a block of NaN."""
    n = -(-len(x) // pool)
    padded = np.full(n * pool, np.nan)
    padded[: len(x)] = x
    blocks = padded.reshape(n, pool)
    with np.errstate(invalid="ignore"):
        out = np.where(
            np.isnan(blocks).all(axis=1), -np.inf, np.nanmax(np.where(np.isnan(blocks), -np.inf, blocks), axis=1)
        )
    return out + 0.0


def _with_family_reasons(report: Report, rows: np.ndarray, forced: list, ascending: bool) -> Report:
    """``report`` with ``forced_dropped`` (each row missing a forced entry)
    and ``not_ascending`` (with ``ascending``) added, and its counts redone."""
    details = {entry["row"]: list(entry["problems"]) for entry in report["details"]}
    for i, row in enumerate(rows):
        held = set(row[row >= 0].tolist())
        missing = [int(t) for t in forced[i] if int(t) not in held]
        if missing:
            details.setdefault(i, []).append({"reason": "forced_dropped", "positions": missing})
        if ascending:
            valid = row[row >= 0]
            bad = np.flatnonzero(np.diff(valid) <= 0)
            if len(bad):
                j = int(bad[0]) + 1
                details.setdefault(i, []).append(
                    {"reason": "not_ascending", "slot": j, "entry": int(valid[j]), "after": int(valid[j - 1])}
                )
    by_reason = {r: 0 for r in list(report["by_reason"]) + list(REASONS)}
    for problems in details.values():
        for reason in {p["reason"] for p in problems}:
            by_reason[reason] += 1
    out = Report(report)
    out["by_reason"] = by_reason
    out["details"] = [{"row": i, "problems": details[i]} for i in sorted(details)]
    out["wrong"] = len(details)
    out["correct"] = int(report["rows"]) - len(details)
    return out
