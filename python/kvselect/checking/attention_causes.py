"""The likeliest cause of a wrong sparse-attention row, when one is recognisable.

A wrong row is tried against the faults that have shipped in the engines'
kernels (issue 40's list; docs/checking-sparse-attention.md cites each): the
row is recomputed exactly **as the faulty kernel would compute it** (a
padding slot read as a key, a repeat counted the other way, a neighbouring
row's entries counted, the causal bound moved by one, the running max's
rescale dropped, ``lse`` in the other base, the sink counted in ``lse``),
and of the hypotheses under which every wrong value of the row falls within
its bound (the model applied to the hypothesis' own result), the one that
fits best (the smallest worst error over bound) names the cause. A NaN is named by the row's
structure: an empty row, or a row whose first slots read are all masked
(the running max starts at ``-inf`` and ``exp(-inf - -inf)`` is NaN).

Why it holds: a hypothesis is only ever reported when it explains the
engine's numbers to within the same bound the exact result was held to,
and the exact result did not; a fault nobody has named gets no cause (the
row is still reported wrong, with its error and bound). What would break
it: two hypotheses that explain the same row within the bound (a fault
whose effect is below the rounding, a row whose neighbour holds the same
keys): the closer fit is named, which may be the other. Only the worst
``diagnose`` rows are tried (``check_sparse_attention``'s argument).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from kvselect.reference.sparse_attn import Exact, Layout, exact, head_row, read_mask, scores, terms

CAUSES: Dict[str, str] = {
    "nan_empty_row": "NaN on an empty row (every entry padding or masked): the sum is 0 and 0/0 or "
    "exp(-inf - -inf) is NaN; the conventions owe out = 0",
    "nan_masked_first_chunk": "NaN on a row whose first slots read are all masked (padding, out of range "
    "or in the future): a running max started at -inf stays -inf and exp(-inf - -inf) is NaN",
    "padding_read": "a padding slot read as a key",
    "read_past_length": "slots past the row's declared read length read",
    "duplicates_other_way": "a repeated entry counted the other way",
    "neighbour_entries": "another row's entries counted",
    "causal_off_by_one": "the causal bound off by one",
    "lost_rescale": "a lost max-rescale: the accumulator or the sum not rescaled when the running max grew",
    "wrong_lse_base": "lse in the other base",
    "sink_in_lse": "the sink counted in lse (it belongs in the denominator only)",
}
"""The causes the report recognises, each with its sentence."""

#: A hypothesis' result: the queries' exact result under it (its bound computed like the row's).
Alt = Exact


def subset(lay: Layout, sel: np.ndarray, **changes: Any) -> Layout:
    """``lay`` restricted to queries ``sel`` (per-query arrays cut), with ``changes``."""
    cut: Dict[str, Any] = dict(
        q=lay.q[sel],
        idx=lay.idx[sel],
        pos=None if lay.pos is None else lay.pos[sel],
        seq=lay.seq[sel],
        read_len=lay.read_len[sel],
    )
    cut.update(changes)
    return replace(lay, **cut)


def _alt(lay: Layout) -> Alt:
    return exact(lay)


def _read_slots(lay: Layout, sel: np.ndarray) -> np.ndarray:
    """Queries ``sel``'s index rows with every slot the conventions do not read (or padding) set to -1."""
    idx = lay.idx[sel]
    return np.where(read_mask(lay)[sel] & (idx >= 0), idx, -1)


def _entries(lay: Layout, sel: np.ndarray) -> np.ndarray:
    """Each query's number of index entries in its sequence."""
    bs = lay.conv.block_size
    return (lay.seq_len[lay.seq[sel]] + bs - 1) // bs


def _hypotheses(lay: Layout, sel: np.ndarray) -> List[Tuple[str, str, Callable[[], Optional[Alt]]]]:
    """The hypotheses for queries ``sel``, in the order they are tried."""
    conv = lay.conv
    idx = lay.idx[sel]
    pad = (idx < 0) & read_mask(lay)[sel]
    out: List[Tuple[str, str, Callable[[], Optional[Alt]]]] = []

    def pad_as(value: np.ndarray) -> Callable[[], Optional[Alt]]:
        def run() -> Optional[Alt]:
            if not pad.any():
                return None
            local = np.broadcast_to(value[:, None, None], idx.shape)
            if conv.global_indices:
                local = local + lay.base[lay.seq[sel]][:, None, None]
            return _alt(subset(lay, sel, idx=np.where(pad, local, idx)))

        return run

    out.append(("padding_read", "as entry 0 (a clamped -1)", pad_as(np.zeros(len(sel), dtype=np.int64))))
    out.append(("padding_read", "as the sequence's last entry (a wrapped -1)", pad_as(_entries(lay, sel) - 1)))
    if lay.table is not None:

        def table_last() -> Optional[Alt]:
            # A -1 block read through block_table[b][-1]: that page's tokens at
            # positions -page..-1, past every mask (the page prepended as block 0).
            if not pad.any():
                return None
            P = lay.page
            assert lay.table is not None
            table = np.concatenate([lay.table[:, -1:], lay.table], axis=1)
            shifted = np.where(pad, P // conv.block_size - 1, np.where(idx >= 0, idx + P // conv.block_size, idx))
            return _alt(
                subset(
                    lay,
                    sel,
                    idx=shifted,
                    table=table,
                    seq_len=lay.seq_len + P,
                    pos=None if lay.pos is None else lay.pos[sel] + P,
                    read_len=lay.read_len[sel],
                )
            )

        if lay.page % conv.block_size == 0:
            out.append(("padding_read", "as the page block_table[seq][-1]", table_last))
    if conv.read != "row":
        out.append(
            ("read_past_length", "the whole row read", lambda: _alt(subset(lay, sel, conv=replace(conv, read="row"))))
        )
    if conv.duplicates != "unique":
        other = "once" if conv.duplicates == "each" else "each"
        out.append(
            (
                "duplicates_other_way",
                f"counted {other} (declared: {conv.duplicates})",
                lambda: _alt(subset(lay, sel, conv=replace(conv, duplicates=other))),
            )
        )
    pos = lay.pos
    if conv.causal and pos is not None:

        def shifted_pos(d: int) -> Callable[[], Optional[Alt]]:
            return lambda: _alt(subset(lay, sel, pos=pos[sel] + d))

        for d in (1, -1):
            out.append(("causal_off_by_one", f"keys up to query_pos {'+' if d > 0 else '-'} 1 counted", shifted_pos(d)))

    def neighbour(step: int, mode: str) -> Callable[[], Optional[Alt]]:
        return lambda: _neighbour(lay, sel, step, mode)

    for step in (-1, 1):
        for mode in ("sum", "max", "union"):
            out.append(("neighbour_entries", f"{mode}:{step}", neighbour(step, mode)))
    return out


def _neighbour(lay: Layout, sel: np.ndarray, step: int, mode: str) -> Optional[Alt]:
    """Queries ``sel`` with the entries of query ``i + step`` (same sequence) also counted:
    ``sum``: both rows' entries; ``union``: each key once; ``max``: the row's own keys,
    each as often as the row that repeats it more (a union that keeps a neighbour's repeat)."""
    n = len(lay.q)
    nb = sel + step
    ok = (nb >= 0) & (nb < n)
    ok[ok] &= lay.seq[nb[ok]] == lay.seq[sel[ok]]
    if not ok.any():
        return None
    own = _read_slots(lay, sel)
    other = np.where(ok[:, None, None], _read_slots(lay, np.clip(nb, 0, n - 1)), -1)
    conv = replace(lay.conv, read="row")
    if mode in ("sum", "union"):
        idx = np.concatenate([own, other], axis=2)
        if mode == "union":
            conv = replace(conv, duplicates="once")
        return _alt(subset(lay, sel, idx=idx, conv=conv))
    rows = np.full(own.shape[:2] + (2 * own.shape[2],), -1, dtype=np.int64)
    for i in range(own.shape[0]):
        for g in range(own.shape[1]):
            mine = own[i, g][own[i, g] >= 0]
            theirs = other[i, g][other[i, g] >= 0]
            extra = [x for x in np.unique(mine) for _ in range(max(0, int((theirs == x).sum() - (mine == x).sum())))]
            r = np.concatenate([mine, np.asarray(extra, dtype=np.int64)])
            rows[i, g, : len(r)] = r
    return _alt(subset(lay, sel, idx=rows, conv=conv))


def _slot_scores(lay: Layout, sel: np.ndarray) -> Tuple[Any, np.ndarray]:
    """Queries ``sel``'s counted tokens in slot order and their logits ``[n, H, L]``."""
    sub = subset(lay, sel)
    t = terms(sub)
    return t, scores(sub, t, np.arange(len(sel)))


def _lost_rescale(lay: Layout, ts: Tuple[Any, np.ndarray], chunk: int, lose: str, base: Exact) -> Alt:
    """The queries of ``ts`` (:func:`_slot_scores`) computed by an online softmax
    over chunks of ``chunk`` tokens in slot order that forgets to rescale
    ``lose`` (``"acc"`` or ``"sum"``) when the running max grows; ``base``
    (their exact result) gives the logit scales, the weights' sums are the
    faulty kernel's own."""
    t, s = ts
    n, H, L = s.shape
    dv = lay.v.shape[-1]
    out = np.zeros((n, H, dv))
    lse = np.full((n, H), -np.inf)
    abs_pv = np.zeros((n, H, dv))
    dev_pv = np.zeros((n, H, dv))
    for h in range(H):
        g, kvh = head_row(lay, h)
        w = t.weight[:, g]
        vv = lay.v[t.flat[:, g], kvh]
        m = np.full(n, -np.inf)
        acc = np.zeros((n, dv))
        acc_abs = np.zeros((n, dv))
        wsum = np.zeros(n)
        lsum = np.zeros(n)
        for c0 in range(0, L, chunk):
            sc = s[:, h, c0 : c0 + chunk]
            mn = np.maximum(m, sc.max(axis=1))
            fin = np.isfinite(mn)
            safe = np.where(fin, mn, 0.0)
            p = np.where(np.isfinite(sc), w[:, c0 : c0 + chunk] * np.exp(sc - safe[:, None]), 0.0)
            r = np.where(np.isfinite(m), np.exp(m - safe), 0.0)
            ra = np.ones_like(r) if lose == "acc" else r
            acc = acc * ra[:, None] + np.einsum("nl,nlc->nc", p, vv[:, c0 : c0 + chunk])
            acc_abs = acc_abs * ra[:, None] + np.einsum("nl,nlc->nc", p, np.abs(vv[:, c0 : c0 + chunk]))
            wsum = wsum * ra + p.sum(axis=1)
            lsum = (lsum if lose == "sum" else lsum * r) + p.sum(axis=1)
            m = np.where(fin, mn, m)
        live = lsum > 0
        den = np.where(live, lsum, 1.0)[:, None]
        out[:, h] = np.where(live[:, None], acc / den, 0.0)
        abs_pv[:, h] = np.where(live[:, None], acc_abs / den, 0.0)
        dev_pv[:, h] = abs_pv[:, h] + np.abs(out[:, h]) * (wsum[:, None] / den)  # triangle inequality
        with np.errstate(divide="ignore"):
            lse[:, h] = np.where(live, m + np.log(np.where(live, lsum, 1.0)), -np.inf)
    return replace(base, out=out, lse=lse, abs_pv=abs_pv, dev_pv=dev_pv)


def diagnose_rows(
    lay: Layout,
    ex: Exact,
    got: np.ndarray,
    got_lse: Optional[np.ndarray],
    problems: Dict[int, List[Dict[str, Any]]],
    rows: Sequence[int],
    bound_of: Callable[[Exact], Tuple[np.ndarray, np.ndarray]],
) -> None:
    """Name the cause of each of ``rows`` (report row numbers) where one is
    recognisable: each problem of a recognised row gains ``cause`` (a key of
    :data:`CAUSES`) and ``why`` (its sentence, with the detail). A
    hypothesis' result is held to its own bound (``bound_of``, the check's
    model applied to it)."""
    H = lay.q.shape[1]
    conv = lay.conv
    ln_b = np.log(2.0) if conv.lse_base == "2" else 1.0
    pending: List[int] = []
    qs = np.array(sorted({r // H for r in rows}), dtype=np.int64)
    at = {int(q): i for i, q in enumerate(qs)}
    t = terms(lay, qs)
    for row in rows:
        i, h = divmod(row, H)
        ps = problems[row]
        if any(p["reason"] == "non_finite" and np.isnan(p["got"]) for p in ps):
            g, _ = head_row(lay, h)
            if ex.empty[i, h]:
                _name(ps, "nan_empty_row", "")
            else:
                masked = t.masked[at[i], g]
                live = t.weight[at[i], g] > 0
                first = int(np.argmax(masked | live)) if (masked | live).any() else 0
                if masked.any() and masked[first]:
                    n_masked = int(np.argmax(~masked[first:])) if (~masked[first:]).any() else len(masked) - first
                    _name(ps, "nan_masked_first_chunk", f"the first {n_masked} token(s) read are masked")
            continue
        pending.append(row)
    if not pending:
        return
    qs = np.array(sorted({r // H for r in pending}), dtype=np.int64)
    at = {int(q): i for i, q in enumerate(qs)}

    def fit(row: int, alt: Exact, alt_lse_b: np.ndarray) -> Optional[float]:
        """The row's worst error over its bound under ``alt`` (None above 1)."""
        i, h = divmod(row, H)
        j = at[i]
        same_lse = alt_lse_b[j, h] == ex.lse[i, h] / ln_b or (np.isnan(alt_lse_b[j, h]) and np.isnan(ex.lse[i, h]))
        if same_lse and np.array_equal(alt.out[j, h], ex.out[i, h]):
            return None  # the hypothesis changes nothing on this row: it explains nothing
        bo, bl = bound_of(Exact(*(getattr(alt, f)[j : j + 1] for f in Exact.__dataclass_fields__)))
        worst = 0.0
        for p in problems[row]:
            if p["of"] == "out":
                with np.errstate(invalid="ignore"):
                    r = np.abs(got[i, h] - alt.out[j, h]) / bo[0, h]
                if not (r <= 1).all():
                    return None
                worst = max(worst, float(r.max()))
            elif got_lse is not None:
                g, a = got_lse[i, h], alt_lse_b[j, h]
                if g != a:
                    if not abs(g - a) <= bl[0, h]:
                        return None
                    worst = max(worst, float(abs(g - a) / bl[0, h]))
        return worst

    sub_ex = Exact(*(getattr(ex, f)[qs] for f in Exact.__dataclass_fields__))
    hyps: List[Tuple[str, str, Callable[[], Optional[Alt]]]] = list(_hypotheses(lay, qs))

    slot_scores: List[Tuple[Any, np.ndarray]] = []  # computed once, for every chunking

    def lost(chunk: int, lose: str) -> Callable[[], Optional[Alt]]:
        def run() -> Alt:
            if not slot_scores:
                slot_scores.append(_slot_scores(lay, qs))
            return _lost_rescale(lay, slot_scores[0], chunk, lose, sub_ex)

        return run

    for chunk in sorted({16, 32, 64, 128} | ({conv.block_size} if conv.block_size > 1 else set())):
        for lose in ("acc", "sum"):
            hyps.append(("lost_rescale", f"chunks of {chunk} tokens, the {lose} not rescaled", lost(chunk, lose)))
    best: Dict[int, Tuple[float, str, str]] = {}

    def consider(cause: str, detail: str, alt: Exact, alt_lse_b: np.ndarray, rows_: Sequence[int]) -> None:
        for r in rows_:
            score = fit(r, alt, alt_lse_b)
            if score is not None and (r not in best or score < best[r][0]):
                best[r] = (score, cause, detail)

    for cause, detail, run in hyps:
        try:
            alt = run()
        except ValueError:  # a hypothesis the inputs cannot express (a refused layout)
            continue
        if alt is not None:
            consider(cause, detail, alt, alt.lse / ln_b, pending)
    if got_lse is not None:
        other = 1.0 if conv.lse_base == "2" else np.log(2.0)
        lse_only = [r for r in pending if all(p["of"] == "lse" for p in problems[r])]
        base = f"base {'e' if conv.lse_base == '2' else '2'} (declared: base {conv.lse_base})"
        consider("wrong_lse_base", base, sub_ex, sub_ex.lse / other, lse_only)
        if lay.sink is not None:
            consider("sink_in_lse", "", sub_ex, _with_sink(lay, sub_ex.lse) / ln_b, lse_only)
    for r, (_, cause, detail) in best.items():
        _name(problems[r], cause, _detail(cause, detail, r // H, lay))


def _with_sink(lay: Layout, lse: np.ndarray) -> np.ndarray:
    if lay.sink is None:
        return np.full_like(lse, np.nan)
    return np.logaddexp(lse, lay.sink[None, :])


def _detail(cause: str, detail: str, query: int, lay: Layout) -> str:
    if cause != "neighbour_entries":
        return detail
    mode, step = detail.split(":")
    how = {
        "sum": "its entries counted with this row's",
        "max": "a key this row holds counted as often as that row repeats it",
        "union": "the union of both rows' keys counted",
    }[mode]
    return f"query {query + int(step)}'s row: {how}"


def _name(ps: List[Dict[str, Any]], cause: str, detail: str) -> None:
    for p in ps:
        p["cause"] = cause
        p["why"] = CAUSES[cause] + (f" ({detail})" if detail else "")
