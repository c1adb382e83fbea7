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
crowd out real ones), or forced entries past the budget (refused). With
cuDNN's ``topk_length`` (each row's count of entries, its second output), a
row whose count differs is ``wrong_length``.

One judge: :func:`judge_family` is the verdict of :func:`check_indexer_family`,
of :func:`kvselect.checking.check_indexer_topk` (and
``kvselect.testing.assert_topk``) given the options, and of ``kvselect
check`` on a ``topk`` dump that carries them (``activation``, no
``weights``, ``force_first`` / ``force_last``, ``score_pool``,
``row_layout``, ``topk_length``); without the options those keep their own
faster path (``kvselect.checking.exact``), whose rows and verdicts the
options at their defaults would give too.

The scores are exact up to float64 rounding (every product of two decoded
float32 operands exact): two entries within ``2 γ_{d+H+3}`` of the magnitude
``|c_t| Σ_h |w_h| Σ_i |q_hi k_ti|`` of each other are a tie, as
:func:`check_indexer_topk` judges them, so kvselect's own rows always pass.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

import numpy as np

import kvselect as ks
from kvselect.checking._common import _refused, _vacuous_rows
from kvselect.checking.report import Report
from kvselect.reference.indexer import head_sum_scores, pool_scores, visible
from kvselect.reference.keys import decode

#: float64's unit roundoff.
_U64 = 2.0**-53

#: The native ``lse`` pool's tie width beyond the float64 terms
#: (``src/indexer/lse.rs``): its bound's half-width is at most ``EXP_REL_ERR``
#: (``crate::exp``, 8.5e-8) with room, plus its log's ``2^-40`` and a float64
#: log-sum-exp's own rounding here; each block adds ``8 u (max |λ s_t| + |max
#: λ s_t| + |ℓ_b|)`` for the roundings that scale with the values.
_LSE_TIE = 1.5 * 8.5e-8 + 2.0**-39


REASONS = ("forced_dropped", "not_ascending", "wrong_length")
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
    score_type: str = "max",
    sm_scale: Optional[float] = None,
    topk_length: Any = None,
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
    score_type, sm_scale : optional
        As :func:`kvselect.indexer_topk` takes them: with ``"lse"``, rows of block ids against
        the blocks' log-sum-exp of ``sm_scale`` times their entries' exact scores (float64), two
        blocks within the native selection's bound of each other a tie (see the module docs).
    topk_length : array_like of int, optional
        ``[n_rows]``: the engine's count of entries in each row (cuDNN's second
        output); a row whose count of entries differs is wrong, ``wrong_length``.
    atol, rtol : float, optional
        Extra tolerance on each score (``rtol`` times its magnitude).

    Returns
    -------
    Report
        :func:`kvselect.check_topk`'s report, its ``by_reason`` and
        ``details`` with ``forced_dropped`` (the forced entries missing from
        a row that had to hold them), ``not_ascending`` and ``wrong_length``;
        and ``vacuous``, the rows no choice among their unforced entries
        could fail at this tolerance.

    Raises
    ------
    SelectionError
        On an option the indexer refuses (naming it), or rows (or
        ``topk_length``) that do not fit the inputs.

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
            score_type=score_type,
            sm_scale=sm_scale,
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
            score_type=score_type,
            sm_scale=sm_scale,
        )
    if len(engine) != np.asarray(index_q).shape[0]:
        raise _refused("rows", f"rows has {len(engine)} rows for {np.asarray(index_q).shape[0]} queries")
    lengths = _topk_lengths(topk_length, len(engine))
    scores, mags, lens, slack, extra = family_scores(
        index_q,
        weights,
        index_k,
        query_pos,
        key_scale,
        key_format,
        query_format,
        cu_seqlens,
        seq_ids,
        compress_ratio,
        activation,
        (score_pool, score_type, sm_scale),
    )
    return judge_family(
        engine,
        scores,
        mags,
        lens,
        k_width,
        force_first,
        force_last,
        row_layout == "ascending",
        lengths,
        atol,
        rtol + slack,
        extra,
    )


def family_scores(
    index_q: Any,
    weights: Any,
    index_k: Any,
    query_pos: Any,
    key_scale: Any,
    key_format: Optional[str],
    query_format: Optional[str],
    cu_seqlens: Any,
    seq_ids: Any,
    compress_ratio: int,
    activation: str,
    pool_options: Tuple[int, str, Optional[float]],
) -> Tuple[np.ndarray, np.ndarray, np.ndarray, float, Optional[np.ndarray]]:
    """Each row's exact scores (float64, NaN past its context), their
    magnitudes, its context (entries, or blocks with ``score_pool``), the
    float64 tie slack ``2 γ_{d+H+3}`` and, for the ``lse`` pool, each block's
    absolute tie width (else None): the arguments as
    :func:`check_indexer_family` takes them (``pool_options`` its
    ``score_pool``, ``score_type``, ``sm_scale``), already vetted."""
    q = decode(index_q, query_format, "query_format")
    k = decode(index_k, key_format, "key_format")
    n, h, d = q.shape
    w = np.ones((n, h)) if weights is None else np.asarray(weights, dtype=np.float32).astype(np.float64)
    c = np.ones(len(k)) if key_scale is None else np.asarray(key_scale, dtype=np.float32).astype(np.float64)
    c = np.broadcast_to(c, (len(k),))
    pos = np.asarray(query_pos, dtype=np.int64).reshape(-1)
    pos = np.broadcast_to(pos, (n,))
    relu, m = activation == "relu", int(compress_ratio)
    if cu_seqlens is None:
        bounds, seq = np.array([0, len(k)]), np.zeros(n, dtype=np.int64)
    else:
        bounds = np.asarray(cu_seqlens, dtype=np.int64).reshape(-1)
        seq = np.asarray(seq_ids, dtype=np.int64).reshape(-1)
    pool, lse = int(pool_options[0]), pool_options[1] == "lse"
    lam = float(np.float32(d**-0.5 if pool_options[2] is None else pool_options[2]))  # as natively read
    width = -(-int(np.diff(bounds).max()) // pool) if len(bounds) > 1 else 0
    scores = np.full((n, width), np.nan)
    mags = np.full((n, width), np.nan)
    extra = np.zeros((n, width)) if lse else None
    lens = np.zeros(n, dtype=np.int64)
    qa, ka = np.abs(q), np.abs(k)
    for i in range(n):
        lo, hi = int(bounds[seq[i]]), int(bounds[seq[i] + 1])
        entries = visible(int(pos[i]), m, hi - lo)
        with np.errstate(invalid="ignore", over="ignore"):
            s_i = head_sum_scores(q[i], w[i], k[lo : lo + entries], relu) * c[lo : lo + entries]
            m_i = head_sum_scores(qa[i], np.abs(w[i]), ka[lo : lo + entries]) * np.abs(c[lo : lo + entries])
        if lse and extra is not None:  # the log-sum-exp pool: 1-Lipschitz in each entry
            x = lam * s_i
            blocks = pool_scores(s_i, pool, "lse", lam)
            big, top = _pooled(np.nan_to_num(np.abs(x), nan=np.inf), pool), _pooled(x, pool)
            with np.errstate(invalid="ignore"):
                tie = _LSE_TIE + 8 * _U64 * (big + np.abs(top) + np.abs(blocks))
            extra[i, : len(blocks)] = np.nan_to_num(tie, nan=np.inf)
            s_i, m_i = blocks, lam * _pooled(np.nan_to_num(m_i, nan=np.inf), pool)
        elif pool > 1:  # the blocks' max-pool (NaN absent), each scaled by its largest magnitude
            s_i, m_i = _pooled(s_i, pool), _pooled(np.nan_to_num(m_i, nan=np.inf), pool)
        lens[i] = len(s_i)
        scores[i, : len(s_i)], mags[i, : len(s_i)] = s_i, m_i
    # Twice γ_{d+H+3} in float64: two float64 sums of one real score, in any
    # order, differ by less than this times its magnitude (check_indexer_topk's tie).
    nu = d + h + 3
    return scores, mags, lens, 2 * nu * _U64 / (1 - nu * _U64), extra


def _topk_lengths(topk_length: Any, n: int) -> Optional[np.ndarray]:
    """``topk_length`` checked: None, or integers, one per row."""
    if topk_length is None:
        return None
    a = np.asarray(topk_length)
    if a.dtype.kind not in "iu":
        raise _refused("topk_length", f"topk_length must hold integers, got {a.dtype}")
    if a.shape != (n,):
        raise _refused("topk_length", f"topk_length must be [n_rows={n}], got {list(a.shape)}")
    return a.astype(np.int64)


def judge_family(
    rows: np.ndarray,
    scores: np.ndarray,
    mags: Optional[np.ndarray],
    lens: np.ndarray,
    topk: int,
    force_first: int,
    force_last: int,
    ascending: bool,
    topk_length: Optional[np.ndarray],
    atol: float,
    rtol: float,
    extra: Optional[np.ndarray] = None,
) -> Report:
    """The family's verdict on ``rows`` against ``scores`` (one row each,
    ``lens[i]`` entries of row ``i`` visible; ``mags`` their error scales or
    None): a row with ``lens[i] > topk`` must hold its first
    ``force_first`` and last ``force_last`` entries, each given the score
    ``+inf`` (and no error scale), and the best of the rest;
    :func:`kvselect.check_topk`'s reasons, ``forced_dropped``,
    ``not_ascending`` (with ``ascending``) and ``wrong_length`` (a row whose
    ``topk_length`` is not its count of entries). ``extra`` (one per score,
    or None) widens each score's tolerance by that much more, absolute
    (``e = atol + rtol m + extra``: folded into the magnitudes as ``m +
    extra / rtol``, ``rtol > 0``). Also ``vacuous``: the rows no selection of
    the unforced entries could fail at this tolerance.

    The one judge of the family's options: :func:`check_indexer_family`,
    :func:`kvselect.checking.check_indexer_topk` with the options and
    ``kvselect check`` on a ``topk`` dump that carries them all call it."""
    scores = np.array(scores, dtype=np.float64)
    mags_ = np.zeros_like(scores) if mags is None else np.nan_to_num(np.array(mags, dtype=np.float64), nan=0.0)
    if extra is not None:  # e = atol + rtol (m + extra / rtol) = atol + rtol m + extra
        mags_ = mags_ + np.asarray(extra, dtype=np.float64) / rtol
    lens = np.asarray(lens, dtype=np.int64)
    f0, f1 = int(force_first), int(force_last)
    forced: List[np.ndarray] = []
    free_s, free_m = np.full_like(scores, np.nan), np.zeros_like(scores)
    free_lens = np.zeros(len(lens), dtype=np.int64)
    for i, L in enumerate(lens.tolist()):
        mine = np.zeros(0, dtype=np.int64)
        if L > topk and (f0 or f1):  # a row short of its context: its forced entries are members
            mine = np.concatenate([np.arange(f0), np.arange(L - f1, L)]).astype(np.int64)
        keep = np.ones(L, dtype=bool)
        keep[mine] = False
        free_lens[i] = int(keep.sum())
        free_s[i, : free_lens[i]], free_m[i, : free_lens[i]] = scores[i, :L][keep], mags_[i, :L][keep]
        scores[i, mine], mags_[i, mine] = np.inf, 0.0
        forced.append(mine)
    report = ks.check_topk(scores, rows, lens, topk=topk, atol=atol, rtol=rtol, magnitudes=mags_)
    out = _with_family_reasons(Report(report), rows, forced, ascending, topk_length)
    # Vacuous over the unforced entries (a +inf entry would make every row with one not vacuous).
    vac = _vacuous_rows(free_s, free_m if mags is not None else None, free_lens, -1, atol, rtol)
    out["vacuous"] = int((vac & (lens > topk)).sum())
    return out


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


def _with_family_reasons(
    report: Report, rows: np.ndarray, forced: list, ascending: bool, topk_length: Optional[np.ndarray] = None
) -> Report:
    """``report`` with ``forced_dropped`` (each row missing a forced entry),
    ``not_ascending`` (with ``ascending``) and ``wrong_length`` (with
    ``topk_length``) added, and its counts redone."""
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
        if topk_length is not None and int(topk_length[i]) != int((row >= 0).sum()):
            details.setdefault(i, []).append(
                {"reason": "wrong_length", "topk_length": int(topk_length[i]), "entries": int((row >= 0).sum())}
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


#: The family's options at their defaults: a call with these (and weights) is today's indexer.
DEFAULTS = {
    "activation": "relu",
    "force_first": 0,
    "force_last": 0,
    "row_layout": "rank",
    "score_pool": 1,
    "score_type": "max",
    "sm_scale": None,
    "topk_length": None,
}


def family_options(weights: Any, slots: Any, filler: str, **options: Any) -> Optional[dict]:
    """The family options a checker was given: None when every one is at
    its default and ``weights`` is given (the checker's own path), else the
    options, after refusing what the family's judge does not take (global
    ``slots``, a ``filler`` other than ``"-1"``), naming the argument."""
    given = [k for k, v in options.items() if ((v is not None) if DEFAULTS[k] is None else (v != DEFAULTS[k]))]
    if weights is not None and not given:
        return None
    which = "weights=None" if weights is None else given[0]
    if slots is not None:
        raise _refused("slots", f"slots with {which}: the indexer family's rows are positions, not global slots")
    if filler != "-1":
        raise _refused("filler", f"filler={filler!r} with {which}: the indexer family's rows are -1 padded")
    return options
