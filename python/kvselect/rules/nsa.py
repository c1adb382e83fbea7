"""NSA's block selection as fla computes it: the complete blocks' mean keys, each query
head's softmax over them summed over its KV head's group (InfLLM-v2's stage 1), block 0
and the query's last two blocks forced, the top ``block_counts``.

The rule (``kvselect.nsa_select``, docs/nsa.md; fla-org/flash-linear-attention
@bc3b101d ``fla/ops/nsa/parallel.py`` ``parallel_nsa_kernel_topk``).

Its ``nsa`` dump is checked in real arithmetic (:func:`check`): the twin's float64 block
scores (:mod:`kvselect.reference.nsa`) are the exact ones to about 1e-15; each row's
candidates (the blocks up to the query's own) are judged by :func:`kvselect.check_topk`
with the engine's tolerance on each score (``rtol`` times the score, at least the
float32 bound of src/nsa/mod.rs). A forced block is a finite stand-in above every score,
so forced blocks tie only with each other (``block_counts < 3``: either is right).

Its eval policy spends the token budget ``k`` as ``k // 64`` whole blocks, fla's three
forced blocks (block 0 and the query's last two) counted; where fewer than 4 blocks fit,
the blocks halve (:func:`geometry`), down to 1 token, where a budget below 3 keeps the
lower forced ids as the rule's tie order does. ``nsa (Eq. 9)`` is the paper's Eq. 9
window at the same blocks and budget (:func:`eq9_geometry`: keys of half a block every
quarter block).

The dump's ``window`` (``"fla"`` or ``"eq9"``, with ``kernel_size`` / ``kernel_stride``)
is the native option: an Eq. 9 dump is judged against the twin's Eq. 9 scores within
:func:`kvselect.reference.nsa.eq9_score_bound`.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence, Tuple

import numpy as np

import kvselect as ks
from kvselect.checking._common import DumpError, _finite, _int, _merge, _need, _text
from kvselect.rules._rule import BudgetUnit, DumpKind, EvalContext, Policy, Rule, Selection, timed

TABLE = {
    "kind": ("str", "", "required", '"nsa"'),
    "q": ("float", "[n_q, n_q_heads, d]", "required", "the queries, the sequence's last n_q tokens"),
    "k": ("float", "[seq_len, n_kv_heads, d]", "required", "the sequence's keys"),
    "rows": ("int", "[n_q, n_kv_heads, width]", "required", "block ids, any order, -1 padded"),
    "block_counts": ("int scalar", "", "optional (default: the rows' width)", "blocks a row"),
    "block_size": ("int scalar", "", "optional (default 64)", "tokens a block"),
    "init_blocks": ("int scalar", "", "optional (default 1)", "blocks forced at the start"),
    "local_blocks": ("int scalar", "", "optional (default 2)", "blocks forced up to the query's own"),
    "scale": ("number", "", "optional (default 1/sqrt(d))", "the logits' scale"),
    "k_scale": ("float", "[seq_len]", "optional", "each token's key scale (fp8 keys: the key is k * scale)"),
    "window": (
        "str",
        "",
        'optional (default "fla")',
        '"fla" (each block\'s mean key) or "eq9" (the NSA paper\'s Eq. 9 over overlapping compressed keys)',
    ),
    "kernel_size": ("int scalar", "", "optional (default 32)", 'window "eq9": tokens a compressed key'),
    "kernel_stride": ("int scalar", "", "optional (default 16)", 'window "eq9": tokens between compressed keys'),
    "precision": ("str", "", "optional", "the engine's coarsest rounding (default float32)"),
}

_WINDOWS = ("fla", "eq9")

_HUGE = 1e300  # a forced block's +inf, ranked as a finite stand-in


def check(
    d: Mapping[str, np.ndarray], atol: float, rtol: float, precision: str, filler: str
) -> Sequence[Tuple[str, Mapping[str, Any]]]:
    """An ``nsa`` dump against the exact block scores of its queries and keys."""
    from kvselect.reference import nsa as RN

    _need(d, "q", "k", "rows")
    formats = getattr(d, "formats", {})
    _finite(d, "q", "k", "k_scale")
    rows = np.asarray(d["rows"])
    if rows.ndim != 3 or rows.dtype.kind not in "iu":
        raise DumpError(f"rows must be integer [n_q, n_kv_heads, width], got {rows.dtype} {rows.shape}")
    n_sel = _int(d, "block_counts", rows.shape[2])
    bs = _int(d, "block_size", RN.BLOCK_SIZE)
    init, local = _int(d, "init_blocks", RN.INIT_BLOCKS), _int(d, "local_blocks", RN.LOCAL_BLOCKS)
    if n_sel < 1 or bs < 1 or init < 0 or local < 0:
        raise DumpError(
            f"block_counts, block_size must be >= 1 and init_blocks, local_blocks >= 0, got {n_sel}, {bs}, "
            f"{init}, {local}"
        )
    scale = float(np.asarray(d["scale"])) if "scale" in d else None
    window = _text(d, "window", "fla")
    if window not in _WINDOWS:
        raise DumpError(f"window must be one of {', '.join(map(repr, _WINDOWS))}, got {window!r}")
    kz = _int(d, "kernel_size", RN.PAPER_KERNEL_SIZE)
    st = _int(d, "kernel_stride", RN.PAPER_KERNEL_STRIDE)
    kw: Dict[str, Any] = dict(
        scale=scale, k_scale=d.get("k_scale"), query_format=formats.get("q"), key_format=formats.get("k")
    )
    geo: Dict[str, Any] = dict(window=window, kernel_size=kz, kernel_stride=st)
    try:
        exact = RN.nsa_block_scores(d["q"], d["k"], block_size=bs, init_blocks=init, local_blocks=local, **geo, **kw)
        if window == "eq9":
            bound, tiny = RN.eq9_score_bound(d["q"], d["k"], block_size=bs, kernel_size=kz, kernel_stride=st, **kw)
        else:
            bound, tiny = RN.nsa_score_bound(d["q"], d["k"], block_size=bs, **kw)
    except ValueError as e:
        raise DumpError(str(e)) from None
    n_q, h, nb = exact.shape
    if rows.shape[:2] != (n_q, h):
        raise DumpError(f"rows has shape {rows.shape}, not [n_q={n_q}, n_kv_heads={h}, width]")
    rtol_eff = max(float(rtol), float(bound.max(initial=0.0)))
    atol_eff = float(atol) + tiny
    flat = rows.reshape(n_q * h, -1).astype(np.int64)
    seq_len = nb and int(np.asarray(d["k"]).shape[0])
    groups: Dict[int, List[Tuple[int, np.ndarray]]] = {}
    for i in range(n_q):
        ic = (seq_len - n_q + i) // bs
        span = ic + (1 if RN.forced(ic, ic, init, local) else 0)  # the candidates
        for g in range(h):
            s = np.clip(exact[i, g, :span], -_HUGE, _HUGE)
            groups.setdefault(min(n_sel, span), []).append((i * h + g, s))
    parts: List[Tuple[np.ndarray, dict]] = []
    width = max(nb, 1)
    for count, members in groups.items():
        idx = np.array([m[0] for m in members])
        sc = np.full((len(members), width), np.nan)
        mg = np.zeros((len(members), width))
        for j, (_, b) in enumerate(members):
            sc[j, : len(b)] = b
            mg[j, : len(b)] = np.where(np.abs(b) < _HUGE, np.abs(b), 0.0)
        report = ks.check_topk(
            sc,
            np.ascontiguousarray(flat[idx]),
            np.array([len(m[1]) for m in members]),
            topk=max(count, 1),
            atol=atol_eff,
            rtol=rtol_eff,
            magnitudes=mg,
        )
        parts.append((idx, dict(report)))
    out = _merge(parts)
    for x in out["details"]:  # name rows in the user's terms
        x["query"], x["kv_head"] = divmod(x["row"], h)
    return [("against the exact block scores", out)]


def geometry(s: Any) -> int:
    """The eval policy's block size at the settings' budget ``k``: fla's 64, halved while
    fewer than 4 blocks (the 3 forced ones and one chosen) fit ``k``, down to 1 token."""
    b = 64
    while s.budget // b < 4 and b > 1:
        b //= 2
    return b


def eq9_geometry(b: int) -> Tuple[int, int]:
    """Eq. 9's compressed keys at blocks of ``b`` tokens, the paper's proportions (blocks of
    64, keys of 32 every 16): ``(kernel_size, kernel_stride) = (b / 2, b / 4)``, at least 1
    token each (blocks of 2: keys of 1 every 1; of 1: the same)."""
    return max(b // 2, 1), max(b // 4, 1)


def select(ctx: EvalContext) -> Selection:
    """NSA as fla selects on one KV head: ``ctx.units`` blocks of :func:`geometry`'s size,
    block 0 and the query's last two forced and counted, expanded to positions."""
    return _select(ctx, "fla")


def select_eq9(ctx: EvalContext) -> Selection:
    """NSA with the paper's Eq. 9 block scores (``window="eq9"``, compressed keys of
    :func:`eq9_geometry`), otherwise as :func:`select`: the same blocks counted at the same
    budget."""
    return _select(ctx, "eq9")


def _select(ctx: EvalContext, window: str) -> Selection:
    pos, k = ctx.pos, ctx.settings.budget
    b = geometry(ctx.settings)
    kz, st = eq9_geometry(b)

    def rows() -> np.ndarray:
        keys = np.ascontiguousarray(ctx.head.k, np.float32).reshape(len(ctx.head.k), 1, -1)
        q = np.ascontiguousarray(ctx.head.q, np.float32)
        out = np.full((len(pos), k), -1, dtype=np.int32)
        for i, p in enumerate(pos):
            n = int(p) + 1
            blocks = ks.nsa_select(
                q[i][None], keys[:n], ctx.units, block_size=b, window=window, kernel_size=kz, kernel_stride=st
            )[0, 0]
            blocks = blocks[blocks >= 0]
            tok = (blocks[:, None] * b + np.arange(b)[None]).ravel()
            tok = tok[tok < n]
            out[i, : len(tok)] = tok
        return out

    return timed(rows)


#: Whole blocks (of 64 tokens where 4 fit, :func:`geometry`); forced: block 0 and the
#: query's last two, as many of them as the budget holds (below 3 blocks the rule's tie
#: order keeps the lower ids: block 0, then the previous block).
BLOCKS = BudgetUnit("block", size=geometry, forced=lambda s: min(3, s.budget // geometry(s)))

RULE = Rule(
    name="nsa",
    title="NSA block selection (fla)",
    api=(
        "nsa_block_scores",
        "nsa_select",
        "nsa_compress_keys",
        "nsa_block_scores_compressed",
        "nsa_select_compressed",
        "nsa_block_scores_paged",
        "nsa_select_paged",
    ),
    reference="kvselect.reference.nsa",
    twins=(
        "nsa_compress_keys",
        "nsa_block_scores",
        "nsa_select",
        "nsa_block_scores_compressed",
        "nsa_select_compressed",
        "nsa_block_scores_paged",
        "nsa_select_paged",
    ),
    assertions=("kvselect.testing.assert_nsa",),
    cases="kvselect.testing.cases.all_nsa_cases",
    case_functions=(
        "kvselect.testing.cases.nsa_incomplete_block_compressed",
        "kvselect.testing.cases.nsa_group_sum_before_softmax",
        "kvselect.testing.cases.nsa_tq_offsets",
        "kvselect.testing.cases.nsa_eq9_overlap_window",
    ),
    dumps=(
        DumpKind(
            "nsa",
            TABLE,
            "NSA's block selection as fla computes it (complete blocks' means, the group's softmax sum, "
            "block 0 and the query's last two forced), checked by `kvselect check`.",
            check,
            heads=lambda d: int(d["rows"].shape[1]),
        ),
    ),
    policies=(
        Policy(
            "nsa",
            select,
            "NSA's block selection as fla computes it: ``k / 64`` blocks by the group's summed softmax "
            "over the complete blocks' mean keys, block 0 and the query's last two forced and counted, "
            "expanded to positions (blocks halved where fewer than 4 fit the budget).",
            unit=BLOCKS,
        ),
        Policy(
            "nsa (Eq. 9)",
            select_eq9,
            "NSA with the paper's Eq. 9 block scores (compressed keys of half a block every quarter block, "
            "block ``j`` summing keys ``4j - 4 .. 4j`` weighted 1, 2, 2, 2, 1), at the same budget as ``nsa``: "
            "``k / 64`` blocks, block 0 and the query's last two forced and counted.",
            unit=BLOCKS,
        ),
    ),
    guide="docs/nsa.md",
)
