"""MoBA's block selection: each query's gate on the mean key of every completed
past block, the top ``topk - 1`` blocks and its own block, forced.

The rule (``kvselect.moba_select``, docs/moba.md) is MoonshotAI/MoBA's efficient
code (``moba/moba_efficient.py``); its naive code (``moba/moba_naive.py``) is the
``variant='naive'``, which differs at ``topk = 1`` only. Its assertion is
``kvselect.testing.assert_moba``, its cases ``kvselect.testing.cases.all_moba_cases``.

Its ``moba`` dump is checked exactly (:func:`check`): every gated block of a row
is a complete block of ``B`` keys, so ranking by the gate ``q . S_b / B`` is
ranking by ``T_b = q . S_b = sum_i sum_t q_i k_ti``, whose ``d * B`` products of
two float32 values are exact in float64. Each row's ``T_b`` are screened in
float64 with a rigorous bound, and the blocks the bound leaves undecided at the
row's threshold are re-scored from their exact products, summed correctly rounded
(``math.fsum``). The current block scores ``+inf`` (forced) and the future blocks
are not candidates; the row must hold ``min(topk - 1, c)`` past blocks and its
own (every block ``0..c`` for the efficient code at ``topk = 1``).

Its eval policy (:func:`select`) spends the token budget ``k`` as ``k // B`` blocks of
``B`` tokens, the query's current block forced and counted (``topk = k // B``): ``B`` is
MoonshotAI/MoBA's example chunk of 4,096 tokens (``examples/llama.py``, with its ``topk``
of 12), halved while fewer than 12 blocks fit ``k`` (:func:`geometry`), down to 1 token.
A KV head's group of query heads shares one row in the eval, so the group's gates are
averaged (the gate of the group's mean query; MoBA itself gates per query head). Where
the budget holds one block alone (``k = 1``) the row is the current block alone, the
naive code's ``topk = 1``: the efficient code would read every block, past the budget.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Sequence, Tuple

import numpy as np

import kvselect as ks
from kvselect.checking._common import DumpError, _finite, _int, _ints, _merge, _need
from kvselect.rules._rule import BudgetUnit, DumpKind, EvalContext, Policy, Rule, Selection, timed

TABLE = {
    "kind": ("str", "", "required", '"moba"'),
    "q": ("float", "[n_queries, n_q_heads, d]", "required", "the queries, the last positions of their sequence"),
    "keys": ("float", "[n_keys, n_kv_heads, d]", "required", "the sequences' keys, one after another"),
    "topk": ("int scalar", "", "required", "blocks per query, the forced current block counted"),
    "block_size": ("int scalar", "", "required", "tokens per block (moba_chunk_size)"),
    "rows": (
        "int",
        "[n_queries, n_q_heads, width]",
        "required",
        "block ids of the query's sequence, any order, -1 padded",
    ),
    "cu_seqlens": ("int", "[n_seqs + 1]", "optional", "the sequences' keys (default: one sequence)"),
    "cu_seqlens_q": ("int", "[n_seqs + 1]", "optional", "the sequences' queries (default: cu_seqlens)"),
    "key_scale": ("float", "[n_keys]", "optional", "each key's scale (fp8 keys: the key is k * scale)"),
    "variant": ("str", "", 'optional (default "efficient")', '"efficient" or "naive" (docs/moba.md)'),
    "precision": ("str", "", "optional", "the engine's coarsest rounding (default float32)"),
}

_VARIANTS = ("efficient", "naive")
_U64 = 2.0**-53


def _text(d: Mapping[str, np.ndarray], key: str, default: str) -> str:
    return str(np.asarray(d[key])) if key in d else default


def _sequence_scores(
    q: np.ndarray, k: np.ndarray, bs: int, topk: int, variant: str, tolerance: Tuple[float, float]
) -> List[Tuple[np.ndarray, np.ndarray, int]]:
    """``(scores, magnitudes, count)`` of every row (query-major, then head) of one
    sequence: the gated blocks' block-sum gates ``T_b`` (exact where decisive), the
    current block ``+inf``; ``count`` the blocks the row must hold."""
    n_k, h, d = k.shape
    n_q, hq, _ = q.shape
    group = hq // h
    n_means = (n_k - 1) // bs if n_k else 0
    blocks = k[: n_means * bs].reshape(n_means, bs, h, d)
    sums = blocks.sum(axis=1)  # float64 sums of float32 values
    abs_sums = np.abs(blocks).sum(axis=1)
    out = []
    for i in range(n_q):
        c = (n_k - n_q + i) // bs
        n_past = c if (variant == "efficient" and topk == 1) else min(topk - 1, c)
        for j in range(hq):
            kv = j // group
            qv = q[i, j]
            t64 = sums[:c, kv] @ qv
            mag = abs_sums[:c, kv] @ np.abs(qv)
            # float64 sums of d * B exact products err by at most (d + B) u64 of mag.
            err = 2 * (d + bs + 2) * _U64 * mag + 1e-300
            tol = tolerance[0] + tolerance[1] * float(mag.max(initial=0.0)) / bs
            scores = t64.copy()
            if 0 < n_past < c:
                low = t64 - err
                kth = np.partition(low, c - n_past)[c - n_past]  # the n_past-th best lower end
                for b in np.flatnonzero(t64 + err + 2 * tol * bs >= kth - 2 * tol * bs):
                    prods = blocks[b, :, kv] * qv[None]
                    scores[b] = math.fsum(prods.ravel().tolist())
            out.append((np.r_[scores / bs, np.inf], np.r_[mag / bs, 0.0], n_past + 1))
    return out


def check(
    d: Mapping[str, np.ndarray], atol: float, rtol: float, precision: str, filler: str
) -> Sequence[Tuple[str, Mapping[str, Any]]]:
    """A ``moba`` dump against the exact gates of each sequence's own keys."""
    _need(d, "q", "keys", "topk", "block_size", "rows")
    formats = getattr(d, "formats", {})
    _finite(d, "q", "keys", "key_scale")
    variant = _text(d, "variant", "efficient")
    if variant not in _VARIANTS:
        raise DumpError(f"variant must be one of {', '.join(map(repr, _VARIANTS))}, got {variant!r}")
    topk, bs = _int(d, "topk"), _int(d, "block_size")
    if topk < 1 or bs < 1:
        raise DumpError(f"topk and block_size must be at least 1, got {topk} and {bs}")
    q, keys, rows = d["q"], d["keys"], np.asarray(d["rows"])
    if q.ndim != 3 or keys.ndim != 3 or rows.ndim != 3 or rows.dtype.kind not in "iu":
        raise DumpError(
            f"q must be [n_queries, n_q_heads, d], keys [n_keys, n_kv_heads, d] and rows integer "
            f"[n_queries, n_q_heads, width], got {q.shape}, {keys.shape}, {rows.shape}"
        )
    n_q, hq, dq = q.shape
    n_k, h, dk = keys.shape
    if dq != dk or hq % h or rows.shape[:2] != (n_q, hq):
        raise DumpError(f"q {q.shape}, keys {keys.shape} and rows {rows.shape} do not fit together")
    cu = _ints(d, "cu_seqlens") if "cu_seqlens" in d else np.array([0, n_k])
    cq = _ints(d, "cu_seqlens_q") if "cu_seqlens_q" in d else (cu if "cu_seqlens" in d else np.array([0, n_q]))
    if (
        len(cu) != len(cq)
        or cu[0] != 0
        or cq[0] != 0
        or cu[-1] != n_k
        or cq[-1] != n_q
        or np.any(np.diff(cu) < 0)
        or np.any(np.diff(cq) < 0)
        or np.any(np.diff(cq) > np.diff(cu))
    ):
        raise DumpError(
            "cu_seqlens / cu_seqlens_q must rise from 0 to the keys / queries, no sequence more queries than keys"
        )
    kv = ks.reference.decode(keys, formats.get("keys"), "key_format")
    if "key_scale" in d:
        scale = np.asarray(d["key_scale"], np.float32).reshape(-1)
        if len(scale) != n_k:
            raise DumpError(f"key_scale must hold one scale per key ({n_k}), got {len(scale)}")
        kv = (kv.astype(np.float32) * scale[:, None, None]).astype(np.float64)
    qv = ks.reference.decode(q, formats.get("q"), "query_format").astype(np.float32).astype(np.float64)
    width = max(1, max((-(-int(b - a) // bs) for a, b in zip(cu, cu[1:])), default=1))
    groups: Dict[int, List[Tuple[int, np.ndarray, np.ndarray]]] = {}
    for s in range(len(cu) - 1):
        per = _sequence_scores(qv[cq[s] : cq[s + 1]], kv[cu[s] : cu[s + 1]], bs, topk, variant, (atol, rtol))
        for r, (scores, mag, count) in enumerate(per):
            groups.setdefault(count, []).append((int(cq[s]) * hq + r, scores, mag))
    flat = rows.reshape(n_q * hq, -1)
    parts: List[Tuple[np.ndarray, dict]] = []
    for count, members in groups.items():
        idx = np.array([m[0] for m in members])
        sc = np.full((len(members), width), np.nan)
        mg = np.zeros((len(members), width))
        for i, (_, scores, mag) in enumerate(members):
            sc[i, : len(scores)], mg[i, : len(mag)] = scores, mag
        report = ks.check_topk(
            sc,
            np.ascontiguousarray(flat[idx]),
            np.array([len(m[1]) for m in members]),
            topk=count,
            atol=atol,
            rtol=rtol,
            magnitudes=mg if rtol else None,
        )
        parts.append((idx, dict(report)))
    out = _merge(parts)
    for x in out["details"]:  # name rows in the user's terms
        x["query"], x["q_head"] = divmod(x["row"], hq)
    return [("against the exact block gates", out)]


#: MoonshotAI/MoBA @61e456bc ``examples/llama.py``: ``--moba-chunk-size 4096 --moba-topk 12``.
CHUNK, TOPK = 4096, 12


def geometry(s: Any) -> int:
    """The eval policy's block size at the settings' budget ``k``: MoBA's example chunk
    (:data:`CHUNK`), halved while fewer than :data:`TOPK` blocks fit ``k``, down to 1."""
    b = CHUNK
    while s.budget // b < TOPK and b > 1:
        b //= 2
    return b


def _group_mean(q: np.ndarray) -> np.ndarray:
    """``[n, group, d]`` queries' float32 mean over the group, summed in head order (as the
    Quest policy forms it, SGLang's alignment of a GQA group to its KV head)."""
    acc = np.zeros((q.shape[0], q.shape[2]), np.float32)
    for g in range(q.shape[1]):
        acc = acc + q[:, g].astype(np.float32)
    return acc / np.float32(q.shape[1])


def select(ctx: EvalContext) -> Selection:
    """MoBA (its efficient code) on one KV head: ``ctx.units`` blocks of :func:`geometry`'s
    size, the query's current block forced and counted, the past blocks gated by the
    group's mean query (summed in head order, as Quest's policy forms it), expanded to
    positions (at one block, the current block alone)."""
    pos, k = ctx.pos, ctx.settings.budget
    b, topk = geometry(ctx.settings), ctx.units
    variant = "efficient" if topk > 1 else "naive"

    def rows() -> np.ndarray:
        keys = np.ascontiguousarray(ctx.head.k, np.float32).reshape(len(ctx.head.k), 1, -1)
        qm = _group_mean(ctx.head.q)
        out = np.full((len(pos), k), -1, dtype=np.int32)
        for i, p in enumerate(pos):
            n = int(p) + 1
            blocks = ks.moba_select(qm[i][None, None], keys[:n], topk, b, variant=variant)[0, 0]
            blocks = blocks[blocks >= 0]
            tok = (blocks[:, None] * b + np.arange(b)[None]).ravel()
            tok = tok[tok < n]
            out[i, : len(tok)] = tok
        return out

    return timed(rows)


#: Whole blocks (MoBA's chunk of 4,096 where 12 fit, :func:`geometry`); forced: the
#: query's current block.
BLOCKS = BudgetUnit("block", size=geometry, forced=lambda s: 1)

RULE = Rule(
    name="moba",
    title="MoBA block selection",
    api=("moba_gates", "moba_select", "moba_select_paged"),
    reference="kvselect.reference.moba",
    twins=("moba_gates", "moba_select", "moba_select_paged"),
    assertions=("kvselect.testing.assert_moba",),
    cases="kvselect.testing.cases.all_moba_cases",
    case_functions=(
        "kvselect.testing.cases.moba_partial_block_gated",
        "kvselect.testing.cases.moba_current_block_forced",
        "kvselect.testing.cases.moba_ties",
    ),
    dumps=(
        DumpKind(
            "moba",
            TABLE,
            "MoBA block selection (its efficient code or its naive one), checked by `kvselect check`.",
            check,
            heads=lambda d: int(d["rows"].shape[1]) if d["rows"].ndim == 3 else 1,
        ),
    ),
    policies=(
        Policy(
            "moba",
            select,
            "MoBA's block selection (its efficient code): ``k / B`` blocks, the query's current block "
            "forced and counted, the rest the completed past blocks with the greatest gate ``q . mean(K)`` "
            "(the group's mean query), expanded to positions; ``B`` MoBA's chunk of 4,096, halved until "
            "12 blocks fit the budget.",
            unit=BLOCKS,
        ),
    ),
    guide="docs/moba.md",
)
