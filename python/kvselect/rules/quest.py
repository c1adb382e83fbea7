"""Quest's query-aware page selection: each page's key bounds, the score
bound they put on a decoding query, and the pages it reads.

The rule (``kvselect.quest_select``, docs/quest.md): per page of 16 tokens and
KV head, the element-wise min and max of its keys; a query's page score
``sum_i max(q_i * kmax_i, q_i * kmin_i)``; the last page forced and the top
``page_budget - 1`` of the others, every page when they fit (Quest's kernels),
with Quest's evaluation script's and SGLang's variants.

Its ``quest`` dump is checked exactly (:func:`check`): the page bounds are
exact (kvselect builds them from the dumped keys), each row's page scores are
screened in float32 (the native scores) with a rigorous error bound, and the
pages the bound leaves undecided at the row's threshold are re-scored from
their exact float64 products, summed correctly rounded (``math.fsum``). Its
eval policy spends the token budget ``k`` as ``k // page_size`` whole pages,
the forced last page counted.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Sequence, Tuple

import numpy as np

import kvselect as ks
from kvselect.checking._common import _ETA32, DumpError, _finite, _gamma, _int, _ints, _merge, _need
from kvselect.rules._rule import BudgetUnit, DumpKind, EvalContext, Knob, Policy, Rule, Selection, timed

TABLE = {
    "kind": ("str", "", "required", '"quest"'),
    "q": ("float", "[n_seqs, n_q_heads, d]", "required", "each sequence's decoding query"),
    "keys": ("float", "[n_tokens, n_kv_heads, d]", "required", "the sequences' keys, one after another"),
    "seq_lens": ("int", "[n_seqs]", "required", "each sequence's tokens (its query's own included)"),
    "page_budget": ("int scalar", "", "required", "pages per query, forced ones counted"),
    "rows": (
        "int",
        "[n_seqs, n_q_heads, width] (variant sglang: [n_seqs, 1, width])",
        "required",
        "page ids, any order, -1 padded",
    ),
    "key_scale": ("float", "[n_tokens]", "optional", "each key's scale (fp8 keys: the key is k * scale)"),
    "page_size": ("int scalar", "", "optional (default 16)", "tokens per page"),
    "variant": ("str", "", 'optional (default "kernel")', '"kernel", "eval" or "sglang" (docs/quest.md)'),
    "num_recent_pages": ("int scalar", "", "optional (default 4)", "SGLang's forced newest pages"),
    "layers": ("int", "[n_seqs]", "optional", "each row's layer"),
    "dense_layers": (
        "int scalar",
        "",
        "optional (default 2 with layers)",
        "rows of layers below it read every page (Quest's model keeps its first two layers dense)",
    ),
    "precision": ("str", "", "optional", "the engine's coarsest rounding (default float32)"),
}

_VARIANTS = ("kernel", "eval", "sglang")


def _text(d: Mapping[str, np.ndarray], key: str, default: str) -> str:
    return str(np.asarray(d[key])) if key in d else default


def _count(variant: str, budget: int, n_pages: int, n_tokens: int, page: int, recent: int) -> Tuple[int, List[int]]:
    """``(pages the row reads, its forced pages)`` for one query."""
    if variant == "kernel":
        return (n_pages, []) if n_pages <= budget else (budget, [n_pages - 1])
    if variant == "eval":
        return min(max(3, min(n_tokens, budget * page) // page), n_pages), []
    start = max(n_pages - recent, 0)
    free = min(max(budget - recent, 1), start) if start else 0
    return free + n_pages - start, list(range(start, n_pages))


def _exact_scores(
    s32: np.ndarray,
    qv: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    free: int,
    forced: List[int],
    tolerance: Tuple[float, float],
) -> Tuple[np.ndarray, np.ndarray]:
    """One row's page scores as the check ranks them, and their magnitudes.

    ``s32`` are the native float32 scores of the row's pages, ``qv`` its
    query ``[heads, d]`` (float32 values; one head per row of the per-head
    variants, every KV head's group mean for SGLang's) and ``lo``, ``hi`` the
    pages' bounds ``[n_pages, heads, d]``. The native sum of ``heads * d``
    fused multiply-adds in 8 lanes errs by at most ``gamma(n) M_p`` plus the
    underflow term (``M_p = sum |q_i| |b_i|``, ``n = heads (d + 4)``); a page
    whose interval cannot reach the ``free``-th best lower end (widened by
    the tolerance ``(atol, rtol)``) is out whatever the rounding, and every other
    page is re-scored from its exact float64 products, summed correctly
    rounded. Forced pages score ``+inf``. Two pages whose real scores are
    equal get equal values; distinct reals closer than a float64 rounding
    would read as a tie (a tolerance of 2^-53 relative, stated in docs/quest.md)."""
    n_pages, heads, d = lo.shape
    pick = np.where(qv[None] >= 0, hi, lo).astype(np.float64)  # [n_pages, heads, d]
    prods = qv.astype(np.float64)[None] * pick  # exact: two float32 values
    mag = np.abs(prods).sum(axis=(1, 2)) * (1 + 2.0**-40)
    n_ops = heads * (d + 4)
    err = _gamma(n_ops) * mag + n_ops * _ETA32
    tol = tolerance[0] + tolerance[1] * float(mag.max(initial=0.0))
    out = s32.astype(np.float64).copy()
    cand = np.ones(n_pages, bool)
    cand[forced] = False
    idx = np.flatnonzero(cand)
    if 0 < free < len(idx):
        low = out[idx] - err[idx]
        kth = np.partition(low, len(idx) - free)[len(idx) - free]  # the free-th best lower end
        decisive = idx[out[idx] + err[idx] + 2 * tol >= kth - 2 * tol]
        for p in decisive:
            out[p] = math.fsum(prods[p].ravel().tolist())
    out[forced] = np.inf
    return out, mag


def check(
    d: Mapping[str, np.ndarray], atol: float, rtol: float, precision: str, filler: str
) -> Sequence[Tuple[str, Mapping[str, Any]]]:
    """A ``quest`` dump against the exact page scores of each sequence's own keys."""
    from kvselect.reference.quest import group_mean

    _need(d, "q", "keys", "seq_lens", "page_budget", "rows")
    formats = getattr(d, "formats", {})
    _finite(d, "q", "keys", "key_scale")
    variant = _text(d, "variant", "kernel")
    if variant not in _VARIANTS:
        raise DumpError(f"variant must be one of {', '.join(map(repr, _VARIANTS))}, got {variant!r}")
    page, budget, recent = _int(d, "page_size", 16), _int(d, "page_budget"), _int(d, "num_recent_pages", 4)
    if page < 1 or budget < 1:
        raise DumpError(f"page_size and page_budget must be at least 1, got {page} and {budget}")
    lens = _ints(d, "seq_lens")
    q, keys, rows = d["q"], d["keys"], np.asarray(d["rows"])
    if q.ndim != 3 or keys.ndim != 3:
        raise DumpError(
            f"q must be [n_seqs, n_q_heads, d] and keys [n_tokens, n_kv_heads, d], got {q.shape}, {keys.shape}"
        )
    n_seqs, hq, dq = q.shape
    h = keys.shape[1]
    if len(lens) != n_seqs or rows.ndim != 3 or rows.dtype.kind not in "iu":
        raise DumpError(f"q holds {n_seqs} sequences, seq_lens {len(lens)}; rows must be integer 3-D, got {rows.shape}")
    n_rows = 1 if variant == "sglang" else hq
    if rows.shape[:2] != (n_seqs, n_rows):
        raise DumpError(f"rows has shape {rows.shape}, not [n_seqs={n_seqs}, {n_rows}, width]")
    if np.any(lens < 1) or int(lens.sum()) != len(keys):
        raise DumpError(f"seq_lens (each >= 1) must add up to the {len(keys)} keys, got {lens.tolist()}")
    cu = np.r_[0, np.cumsum(lens)]
    scale = d.get("key_scale")
    lo, hi = ks.quest_bounds(keys, page, key_scale=scale, key_format=formats.get("keys"), cu_seqlens=cu)
    dense = np.zeros(n_seqs, bool)
    if "layers" in d:
        layers = _ints(d, "layers")
        if len(layers) != n_seqs:
            raise DumpError(f"layers has {len(layers)} entries for {n_seqs} sequences")
        dense = layers < _int(d, "dense_layers", 2)
    qf = formats.get("q")
    qvals = np.asarray(ks.reference.decode(q, qf, "query_format"), np.float32)
    groups: Dict[int, List[Tuple[int, np.ndarray, np.ndarray, int]]] = {}
    width = -(-int(lens.max()) // page)
    at = 0
    for s, n in enumerate(lens):
        n_pages = -(-int(n) // page)
        blo, bhi = lo[at : at + n_pages], hi[at : at + n_pages]
        at += n_pages
        if dense[s]:
            for j in range(n_rows):
                groups.setdefault(n_pages, []).append((s * n_rows + j, np.zeros(n_pages), np.zeros(n_pages), n_pages))
            continue
        count, forced = _count(variant, budget, n_pages, int(n), page, recent)
        free = count - len(forced)
        s32 = np.atleast_2d(ks.quest_scores(q[s], blo, bhi, variant=variant, query_format=qf))
        for j in range(n_rows):
            if variant == "sglang":
                qv, rlo, rhi = group_mean(q[s], h, qf), blo, bhi
            else:
                kv = j // (hq // h)
                qv, rlo, rhi = qvals[s, j][None], blo[:, kv : kv + 1], bhi[:, kv : kv + 1]
            scores, mag = _exact_scores(s32[j], qv, rlo, rhi, free, forced, (atol, rtol))
            mag[forced] = 0.0
            groups.setdefault(count, []).append((s * n_rows + j, scores, mag, n_pages))
    flat = rows.reshape(n_seqs * n_rows, -1)
    parts: List[Tuple[np.ndarray, dict]] = []
    for count, members in groups.items():
        idx = np.array([m[0] for m in members])
        sc = np.full((len(members), width), np.nan)
        mg = np.zeros((len(members), width))
        for i, (_, scores, mag, n_pages) in enumerate(members):
            sc[i, :n_pages], mg[i, :n_pages] = scores, mag
        report = ks.check_topk(
            sc,
            np.ascontiguousarray(flat[idx]),
            np.array([m[3] for m in members]),
            topk=count,
            atol=atol,
            rtol=rtol,
            magnitudes=mg if rtol else None,
        )
        parts.append((idx, dict(report)))
    out = _merge(parts)
    for x in out["details"]:  # name rows in the user's terms
        x["seq"], x["q_head"] = divmod(x["row"], n_rows)
    return [("against the exact page scores", out)]


def _group_mean(q: np.ndarray) -> np.ndarray:
    """``[n, group, d]`` queries' float32 mean over the group, summed in head
    order (SGLang's alignment of a GQA group to its KV head)."""
    acc = np.zeros((q.shape[0], q.shape[2]), np.float32)
    for g in range(q.shape[1]):
        acc = acc + q[:, g].astype(np.float32)
    return acc / np.float32(q.shape[1])


def dense_layer(ctx: EvalContext) -> bool:
    """Whether Quest reads every position on this head: its layer is below
    ``quest_dense_layers`` on a workload of more than one layer. Quest's
    model code (mit-han-lab/Quest @ade6f7c4 ``quest/models/llama.py``:
    ``quest_init`` sets ``_quest_skip_layer = 2``, and ``forward`` gives the
    layers below it a page budget of ``1024 * 1024``) keeps its first two
    layers dense; a one-layer workload is taken as a layer of the sparse
    part, where the rule is being compared."""
    layers, layer = int(getattr(ctx.head, "layers", 1)), int(getattr(ctx.head, "layer", 0))
    return layers > 1 and layer < ctx.settings.quest_dense_layers


def select(ctx: EvalContext) -> Selection:
    """Quest's kernel path on one KV head, ``ctx.units`` pages of
    ``quest_page_size`` tokens (the last page forced and counted), expanded
    to positions; the group's query heads are averaged (SGLang's GQA
    alignment; Quest itself is multi-head, where the group is one head).
    On a dense layer (:func:`dense_layer`) every visible position."""
    s, pos, k = ctx.settings, ctx.pos, ctx.settings.budget
    page = s.quest_page_size
    if dense_layer(ctx):

        def every() -> np.ndarray:
            t = np.arange(int(pos.max()) + 1, dtype=np.int32)
            return np.where(t[None, :] <= pos[:, None], t[None, :], -1).astype(np.int32)

        sel = timed(every)
        return Selection(sel.rows, sel.seconds, dense=True)

    def rows() -> np.ndarray:
        keys = ctx.head.k.reshape(len(ctx.head.k), 1, -1)
        lo, hi = ks.quest_bounds(keys, page)
        qm = _group_mean(ctx.head.q)
        out = np.full((len(pos), k), -1, dtype=np.int32)
        for i, p in enumerate(pos):
            n = int(p) + 1
            n_pages = -(-n // page)
            pages = ks.quest_select(qm[i][None], lo[:n_pages], hi[:n_pages], n, ctx.units, page)[0]
            pages = pages[pages >= 0]
            tok = (pages[:, None] * page + np.arange(page)[None]).ravel()
            tok = tok[tok < n]
            out[i, : len(tok)] = tok
        return out

    return timed(rows)


#: Whole pages of ``quest_page_size`` tokens; the last page forced.
PAGES = BudgetUnit("page", size=lambda s: s.quest_page_size, forced=lambda s: 1)

RULE = Rule(
    name="quest",
    title="Quest page selection",
    api=("quest_bounds", "quest_bounds_paged", "quest_update", "quest_scores", "quest_select"),
    reference="kvselect.reference.quest",
    twins=("quest_bounds", "quest_bounds_paged", "quest_update", "quest_scores", "quest_select"),
    assertions=("kvselect.testing.assert_quest",),
    cases="kvselect.testing.cases.all_quest_cases",
    case_functions=(
        "kvselect.testing.cases.quest_minmax_swapped",
        "kvselect.testing.cases.quest_sign_ignored",
        "kvselect.testing.cases.quest_last_page_forced",
        "kvselect.testing.cases.quest_dense_fallback",
        "kvselect.testing.cases.quest_stale_slots",
        "kvselect.testing.cases.quest_ties",
        "kvselect.testing.cases.quest_fp8_scales",
    ),
    dumps=(
        DumpKind(
            "quest",
            TABLE,
            "Quest page selection (its kernels, its evaluation script or SGLang's), checked by `kvselect check`.",
            check,
            heads=lambda d: int(d["rows"].shape[1]) if d["rows"].ndim == 3 else 1,
        ),
    ),
    policies=(
        Policy(
            "quest",
            select,
            "Quest's page selection (its kernel path): ``k / page_size`` pages of the head's keys by the "
            "min/max page bound, the last page forced and counted, expanded to positions.",
            unit=PAGES,
            knobs=(
                Knob(
                    "quest_page_size",
                    "--quest-page-size",
                    "quest: tokens per page (default: 16, Quest's; halved until one page fits the budget, "
                    "i.e. below k = 16)",
                ),
                Knob(
                    "quest_dense_layers",
                    "--quest-dense-layers",
                    "quest: its first N layers read every position on a workload of more than one layer "
                    "(default: 2, Quest's model; their rows exceed k, and the table says so); 0: the "
                    "identical budget on every layer",
                    minimum=0,
                ),
            ),
        ),
    ),
    guide="docs/quest.md",
)
