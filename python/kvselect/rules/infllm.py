"""InfLLM-v2's block selection (MiniCPM4 / 4.1): stage 1's softmax over the
compressed keys summed over each KV head's query group, max pooled onto 64-token
blocks, the init and local blocks forced, the top-k, the ids past the query's block
dropped.

The rule (``kvselect.infllm_select``, docs/infllm.md; the CUDA and the older Triton
pooling, MiniCPM4.1's ``> q_idx`` and an earlier copy's ``>= q_idx`` filter).

Its ``infllm`` dump is checked in real arithmetic (:func:`check`): the twin's float64
block scores (:mod:`kvselect.reference.infllm`) are the exact ones to about 1e-15, each
row's blocks are judged by :func:`kvselect.check_topk` over the blocks the filter keeps,
with the engine's tolerance on each score (``rtol`` times its magnitude, the block
score itself; at least the float32 bound of src/infllm/mod.rs). Its eval policy spends
the token budget ``k`` as ``k // 64`` whole blocks, the forced ones (1 init block, the
local window and the query's own block) counted; where those do not fit, the blocks
halve with MiniCPM4's ratios (:func:`geometry`).
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence, Tuple

import numpy as np

import kvselect as ks
from kvselect.checking._common import DumpError, _finite, _int, _merge, _need
from kvselect.rules._rule import BudgetUnit, DumpKind, EvalContext, Knob, Policy, Rule, Selection, timed

TABLE = {
    "kind": ("str", "", "required", '"infllm"'),
    "q": ("float", "[n_q, n_q_heads, d]", "required", "the queries, the sequence's last n_q tokens"),
    "ck": (
        "float",
        "[n_c, n_kv_heads, d]",
        "required",
        "the sequence's compressed keys (n_c = (seq_len - 32) // 16 + 1; key j the mean of tokens 16j .. 16j + 31)",
    ),
    "seq_len": ("int scalar", "", "required", "tokens in the sequence (the queries' own included)"),
    "rows": ("int", "[n_q, n_kv_heads, width]", "required", "block ids, any order, -1 padded"),
    "topk": ("int scalar", "", "optional (default: the rows' width)", "blocks per row before the filter"),
    "init_blocks": ("int scalar", "", "optional (default 1)", "blocks forced at the start"),
    "local_blocks": ("int scalar", "", "optional (default 32)", "the local window in blocks (docs/infllm.md)"),
    "pooling": ("str", "", 'optional (default "cuda")', '"cuda" or "triton" (docs/infllm.md)'),
    "keep": ("str", "", 'optional (default "through_current")', '"through_current" or "before_current"'),
    "scale": ("number", "", "optional (default 1/sqrt(d))", "the logits' scale"),
    "ck_scale": ("float", "[n_c]", "optional", "each compressed key's scale (fp8 keys: the key is ck * scale)"),
    "precision": ("str", "", "optional", "the engine's coarsest rounding (default float32)"),
}

_POOLINGS = ("cuda", "triton")
_HUGE = 1e300  # +-inf block scores, ranked as finite stand-ins
_KEEPS = ("through_current", "before_current")


def _text(d: Mapping[str, np.ndarray], key: str, default: str, allowed: Tuple[str, ...]) -> str:
    v = str(np.asarray(d[key])) if key in d else default
    if v not in allowed:
        raise DumpError(f"{key} must be one of {', '.join(map(repr, allowed))}, got {v!r}")
    return v


def check(
    d: Mapping[str, np.ndarray], atol: float, rtol: float, precision: str, filler: str
) -> Sequence[Tuple[str, Mapping[str, Any]]]:
    """An ``infllm`` dump against the exact block scores of its queries and keys."""
    from kvselect.reference import infllm as RI

    _need(d, "q", "ck", "seq_len", "rows")
    formats = getattr(d, "formats", {})
    _finite(d, "q", "ck", "ck_scale")
    pooling = _text(d, "pooling", "cuda", _POOLINGS)
    keep = _text(d, "keep", "through_current", _KEEPS)
    n = _int(d, "seq_len")
    rows = np.asarray(d["rows"])
    if rows.ndim != 3 or rows.dtype.kind not in "iu":
        raise DumpError(f"rows must be integer [n_q, n_kv_heads, width], got {rows.dtype} {rows.shape}")
    topk = _int(d, "topk", rows.shape[2])
    init, local = _int(d, "init_blocks", 1), _int(d, "local_blocks", 32)
    if topk < 1 or init < 0 or local < 0:
        raise DumpError(f"topk must be >= 1 and init_blocks, local_blocks >= 0, got {topk}, {init}, {local}")
    scale = float(np.asarray(d["scale"])) if "scale" in d else None
    kw: Dict[str, Any] = dict(
        scale=scale, ck_scale=d.get("ck_scale"), query_format=formats.get("q"), key_format=formats.get("ck")
    )
    try:
        exact = RI.infllm_block_scores(d["q"], d["ck"], n, init_blocks=init, local_blocks=local, pooling=pooling, **kw)
        bound, tiny = RI.score_bound(d["q"], d["ck"], n, **kw)
    except ValueError as e:
        raise DumpError(str(e)) from None
    n_q, h, nb = exact.shape
    if rows.shape[:2] != (n_q, h):
        raise DumpError(f"rows has shape {rows.shape}, not [n_q={n_q}, n_kv_heads={h}, width]")
    rtol_eff = max(float(rtol), float(bound.max(initial=0.0)))
    atol_eff = float(atol) + tiny
    flat = rows.reshape(n_q * h, -1).astype(np.int64)
    groups: Dict[int, List[Tuple[int, np.ndarray, int]]] = {}
    k_eff = min(topk, nb)
    for i in range(n_q):
        qb = (n - n_q + i) // RI.BLOCK_SIZE
        span = qb + 1 if keep == "through_current" else qb  # the blocks the filter keeps
        for g in range(h):
            r = i * h + g
            # +-inf (forced, excluded) as finite stand-ins, so check_topk ranks them as
            # the source's top-k does (an excluded block is still taken when topk
            # reaches it); their ties are exact.
            s_all = np.clip(exact[i, g], -_HUGE, _HUGE)
            tol = atol_eff + rtol_eff * np.where(np.isfinite(exact[i, g]), np.abs(exact[i, g]), 0.0)
            # How many of the source's top-k the filter keeps, as ties at the top-k's
            # threshold may fall (a forced block past topk's reach, a block scoring 0
            # against the future blocks' 0): any count in [lo, hi] is right.
            t = s_all[RI.order(s_all)[k_eff - 1]]
            kept = np.arange(nb) < span
            above = s_all - tol > t
            near = ~above & (np.abs(s_all - t) <= tol + np.maximum(tol, 0.0))
            a, m = int(np.sum(above & kept)), k_eff - int(np.sum(above))
            lo = a + max(0, m - int(np.sum(near & ~kept)))
            hi = a + min(m, int(np.sum(near & kept)))
            held = int(np.sum(flat[r] >= 0))
            count = held if lo <= held <= hi else lo
            groups.setdefault(count, []).append((r, s_all[:span], span))
    parts: List[Tuple[np.ndarray, dict]] = []
    width = max(nb, 1)
    for count, members in groups.items():
        idx = np.array([m_[0] for m_ in members])
        sc = np.full((len(members), width), np.nan)
        mg = np.zeros((len(members), width))
        for j_, (_, b, span) in enumerate(members):
            sc[j_, :span] = b
            mg[j_, :span] = np.where(np.abs(b) < _HUGE, np.abs(b), 0.0)
        report = ks.check_topk(
            sc,
            np.ascontiguousarray(flat[idx]),
            np.array([m_[2] for m_ in members]),
            topk=count,
            atol=atol_eff,
            rtol=rtol_eff,
            magnitudes=mg,
        )
        parts.append((idx, dict(report)))
    out = _merge(parts)
    for x in out["details"]:  # name rows in the user's terms
        x["query"], x["kv_head"] = divmod(x["row"], h)
    return [("against the exact block scores", out)]


def geometry(s: Any) -> Tuple[int, int, int]:
    """The eval policy's ``(block_size, init_blocks, local_blocks)`` at the settings'
    budget ``k``: MiniCPM4's blocks of 64, 1 init block and a local window of
    ``--infllm-local-blocks`` blocks, by default half the budget's blocks (MiniCPM4's
    ratio: a window of 32 of its 64). Where 1 init block, the window and the query's own
    block do not fit ``k // 64`` blocks, the block halves (compressed keys of half a
    block every quarter block: MiniCPM4's ratios), down to 1 token; at the last the
    default window, then the init block, are trimmed. A given window is kept (the
    policy is then ``n/a`` where it does not fit)."""
    k, given = s.budget, getattr(s, "infllm_local_blocks", None)
    b = 64
    while True:
        units = k // b
        local = int(given) if given is not None else units // 2
        if units >= 2 + local or b == 1:
            break
        b //= 2
    init = 1
    if given is None and units < 2 + local:
        local = max(units - 2, 0)
        init = 1 if units >= 2 else 0
    return b, init, local


def _kernel(b: int) -> Tuple[int, int]:
    """``(kernel_size, kernel_stride)`` for blocks of ``b``: MiniCPM4's 32, 16 at 64."""
    stride = max(1, b // 4)
    return 2 * stride, stride


def select(ctx: EvalContext) -> Selection:
    """InfLLM-v2 (the CUDA pooling, MiniCPM4.1's filter) on one KV head:
    ``ctx.units`` blocks, the init block, the local window and the query's own block
    forced, expanded to positions (:func:`geometry`); the compressed keys made from the
    head's keys as the source makes them (the mean of half a block every quarter)."""
    from kvselect.reference.infllm import compress_keys, compressed_len

    pos, k = ctx.pos, ctx.settings.budget
    b, init, local = geometry(ctx.settings)
    kz, st = _kernel(b)

    def rows() -> np.ndarray:
        keys = np.ascontiguousarray(ctx.head.k, np.float32).reshape(len(ctx.head.k), 1, -1)
        ck = compress_keys(keys, kz, st)
        q = np.ascontiguousarray(ctx.head.q, np.float32)
        out = np.full((len(pos), k), -1, dtype=np.int32)
        for i, p in enumerate(pos):
            n = int(p) + 1
            blocks = ks.infllm_select(
                q[i][None],
                ck[: compressed_len(n, kz, st)],
                n,
                ctx.units,
                init_blocks=init,
                local_blocks=local,
                block_size=b,
                kernel_size=kz,
                kernel_stride=st,
            )[0, 0]
            blocks = blocks[blocks >= 0]
            tok = (blocks[:, None] * b + np.arange(b)[None]).ravel()
            tok = tok[tok < n]
            out[i, : len(tok)] = tok
        return out

    return timed(rows)


def _forced(s: Any) -> int:
    _, init, local = geometry(s)
    return init + local + 1


#: Whole blocks (of 64 tokens where they fit, :func:`geometry`); forced: the init block,
#: the local window and the query's own block.
BLOCKS = BudgetUnit("block", size=lambda s: geometry(s)[0], forced=_forced)

RULE = Rule(
    name="infllm",
    title="InfLLM-v2 block selection",
    api=("infllm_block_scores", "infllm_select", "infllm_block_scores_paged", "infllm_select_paged"),
    reference="kvselect.reference.infllm",
    twins=(
        "compress_keys",
        "infllm_block_scores",
        "infllm_select",
        "infllm_block_scores_paged",
        "infllm_select_paged",
    ),
    assertions=("kvselect.testing.assert_infllm",),
    cases="kvselect.testing.cases.all_infllm_cases",
    case_functions=(
        "kvselect.testing.cases.infllm_window_off_by_one",
        "kvselect.testing.cases.infllm_current_not_forced",
        "kvselect.testing.cases.infllm_decode_drops_current",
        "kvselect.testing.cases.infllm_ties",
        "kvselect.testing.cases.infllm_fp8_scales",
    ),
    dumps=(
        DumpKind(
            "infllm",
            TABLE,
            "InfLLM-v2 block selection (MiniCPM4 / 4.1: the CUDA or Triton pooling, either top-k filter), "
            "checked by `kvselect check`.",
            check,
            heads=lambda d: int(d["rows"].shape[1]),
        ),
    ),
    policies=(
        Policy(
            "infllm",
            select,
            "InfLLM-v2's block selection (MiniCPM4.1: the CUDA pooling, ids past the query's block dropped): "
            "``k / 64`` blocks by the pooled group softmax over compressed keys, 1 init block, the local "
            "window and the query's own block forced and counted, expanded to positions (blocks halved "
            "where those do not fit the budget).",
            unit=BLOCKS,
            knobs=(
                Knob(
                    "infllm_local_blocks",
                    "--infllm-local-blocks",
                    "infllm: the local window in blocks (default: half the budget's blocks, MiniCPM4's 32 of 64)",
                    minimum=0,
                ),
            ),
        ),
    ),
    guide="docs/infllm.md",
)
