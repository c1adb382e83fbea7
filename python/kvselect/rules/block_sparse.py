"""MiniMax-M3's block selection: which blocks of keys each KV head may read.

The rule (``kvselect.block_sparse_select``, docs/block-sparse.md): a block
scores the max of ``index_q · index_k`` over its visible positions, each KV
head selects for itself, the first ``init_blocks`` and newest
``local_blocks`` blocks are forced and the best ``top_blocks`` are taken.
Its ``blocks`` dump is checked against the exact block scores; its eval
policy spends the token budget ``k`` as ``k // block_size`` whole blocks.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence, Tuple

import numpy as np

import kvselect as ks
from kvselect.checking._common import DumpError, _check_packing, _finite, _formats, _int, _ints, _need, _same_rows
from kvselect.rules._rule import BudgetUnit, DumpKind, EvalContext, Knob, Policy, Rule, Selection, timed

TABLE = {
    "kind": ("str", "", "required", '"blocks"'),
    "index_q": ("float", "[n_queries, n_kv_heads, d]", "required", "the block indexer's queries"),
    "index_k": ("float", "[n_keys, d]", "required", "its keys"),
    "query_pos": ("int", "[n_queries]", "required", "each query's position (within its sequence)"),
    "block_size": ("int scalar", "", "required", "BlockSparseConfig.block_size"),
    "top_blocks": ("int scalar", "", "required", "BlockSparseConfig.top_blocks"),
    "init_blocks": ("int scalar", "", "required", "BlockSparseConfig.init_blocks"),
    "local_blocks": ("int scalar", "", "required", "BlockSparseConfig.local_blocks"),
    "rows": (
        "int",
        "[n_queries, n_kv_heads, width] (head_major: [n_kv_heads, n_queries, width])",
        "required",
        "block ids, any order, -1 padded",
    ),
    "head_major": ("int scalar", "", "optional", "1: rows are head-major"),
    "block_table": ("int", "[n_seqs, max_blocks]", "optional", "rows are physical page ids through it"),
    "cu_seqlens": ("int", "[n_seqs + 1]", "optional", "packed sequences' key offsets"),
    "seq_ids": ("int", "[n_queries]", "optional (default all 0)", "each query's sequence"),
    "precision": ("str", "", "optional", "the engine's coarsest rounding (default float32)"),
}


def check(
    d: Mapping[str, np.ndarray], atol: float, rtol: float, precision: str, filler: str
) -> Sequence[Tuple[str, Mapping[str, Any]]]:
    """A ``blocks`` dump against the exact block scores of each query's own sequence."""
    _need(d, "index_q", "index_k", "query_pos", "rows")
    cfg = ks.BlockSparseConfig(
        _int(d, "block_size"), _int(d, "top_blocks"), _int(d, "init_blocks"), _int(d, "local_blocks")
    )
    fmt = _formats(d)
    _finite(d, "index_q", "index_k")
    q, k, pos = d["index_q"], d["index_k"], _ints(d, "query_pos")
    rows = d["rows"]
    if rows.ndim != 3 or rows.dtype.kind not in "iu":
        raise DumpError(
            f"rows must be integer [n_queries, n_kv_heads, width] (or head-major), got {rows.dtype} {rows.shape}"
        )
    if _int(d, "head_major", 0):
        rows = rows.transpose(1, 0, 2)
    if q.ndim != 3:
        raise DumpError(f"index_q must be [n_queries, n_kv_heads, d], got shape {q.shape}")
    n, h = q.shape[0], q.shape[1]
    if rows.shape[:2] != (n, h):
        raise DumpError(f"rows has shape {d['rows'].shape} for {n} queries of {h} KV heads")
    _same_rows(n, d, "query_pos", "seq_ids")
    seq = _ints(d, "seq_ids") if "seq_ids" in d else np.zeros(n, dtype=np.int64)
    # Several sequences packed: each query scored over its own sequence's keys.
    cu = _ints(d, "cu_seqlens") if "cu_seqlens" in d else np.array([0, len(k)])
    _check_packing(cu, seq, len(k))
    width_b = -(-int(np.diff(cu).max()) // cfg.block_size)
    scores: np.ndarray = np.full((n, h, width_b), np.nan, dtype=np.float32)
    mags: Optional[np.ndarray] = np.full_like(scores, np.nan) if rtol else None
    nb: np.ndarray = np.zeros((n, h), dtype=np.int64)
    for s in np.unique(seq):
        idx = np.flatnonzero(seq == s)
        keys = k[int(cu[s]) : int(cu[s + 1])]
        got = ks.block_scores(q[idx], keys, pos[idx], cfg, **fmt)
        scores[idx, :, : got.shape[2]] = got
        if mags is not None:
            mags[idx, :, : got.shape[2]] = ks.block_magnitudes(q[idx], keys, pos[idx], cfg, **fmt)
        nb[idx] = (-(-np.minimum(pos[idx] + 1, len(keys)) // cfg.block_size))[:, None]
    scores = scores.reshape(n * h, -1)
    mags = None if mags is None else mags.reshape(n * h, -1)
    nb = nb.reshape(-1)
    layout = None
    if "block_table" in d:
        layout = ks.GlobalSlots(d["block_table"], np.repeat(seq, h), 1)
    flat_rows = np.ascontiguousarray(rows).reshape(n * h, -1)
    exact = _exact_scores(q, k, pos, seq, cu, cfg, fmt, scores, nb, flat_rows, layout)
    report = ks.check_blocks(
        exact,
        flat_rows,
        nb,
        cfg,
        atol=atol,
        rtol=rtol,
        magnitudes=mags,
        slots=layout,
    )
    for x in report["details"]:  # name rows in the user's terms
        x["query"], x["kv_head"] = divmod(x["row"], h)
    return [("against the exact block scores", report)]


def _exact_scores(
    q: np.ndarray,
    k: np.ndarray,
    pos: np.ndarray,
    seq: np.ndarray,
    cu: np.ndarray,
    cfg: ks.BlockSparseConfig,
    fmt: Mapping[str, Any],
    scores: np.ndarray,
    nb: np.ndarray,
    rows: np.ndarray,
    layout: Optional[ks.GlobalSlots],
) -> np.ndarray:
    """The block scores the check judges by, float64 ``[n * h, n_blocks]``,
    so that its verdict is the real-arithmetic one (up to float64 rounding).

    kvselect's own selection is the real-arithmetic top (its float32 screen,
    the near ties re-scored in float64: ``src/block_sparse/exact.rs``). A row
    whose free blocks are that set is exactly right: it gets equal scores
    (the check then reports only its structural faults). Another row is
    right only if every block it swapped ties exactly with the one it
    swapped out: the swapped blocks are re-scored in float64 (every product
    exact; a NaN sum absent) into its float32 scores, which then decide
    exactly, and report the row's line."""
    from kvselect import reference

    n, h = q.shape[0], q.shape[1]
    out = scores.astype(np.float64)
    own = np.full(rows.shape[:1] + (cfg.width,), -1, dtype=np.int64)
    for s in np.unique(seq):
        idx = np.flatnonzero(seq == s)
        keys = k[int(cu[s]) : int(cu[s + 1])]
        got = ks.block_sparse_select(q[idx], keys, pos[idx], cfg, **fmt)
        for j, i in enumerate(idx):
            own[i * h : (i + 1) * h, : got.shape[2]] = got[j]
    logical = layout.positions(rows) if layout is not None else rows.astype(np.int64)
    for r in range(n * h):
        nbr = int(nb[r])
        init_end = min(cfg.init_blocks, nbr)
        local_start = max(nbr - min(cfg.local_blocks, nbr), init_end)
        mine, theirs = ({int(b) for b in x if init_end <= b < local_start} for x in (own[r], logical[r]))
        if mine == theirs:
            out[r] = 0.0
            continue
        i, head, s = r // h, r % h, int(seq[r // h])
        q64 = reference.decode(q[i, head], fmt.get("query_format"), "query_format").astype(np.float64)
        vis = min(int(pos[i]) + 1, int(cu[s + 1] - cu[s]))
        for b in sorted(mine ^ theirs):
            lo, hi = int(cu[s]) + b * cfg.block_size, int(cu[s]) + min((b + 1) * cfg.block_size, vis)
            kb = reference.decode(k[lo:hi], fmt.get("key_format"), "key_format").astype(np.float64)
            with np.errstate(invalid="ignore", over="ignore"):
                dots = (kb * q64[None, :]).sum(axis=1)
            dots = dots[~np.isnan(dots)]
            out[r, b] = dots.max() if len(dots) else -np.inf
    return out


def _rows_axis(d: Mapping[str, np.ndarray], key: str) -> int:
    """The queries' axis of ``key``: 1 for head-major ``rows``
    (``[n_kv_heads, n_queries, width]``), else 0."""
    head_major = "head_major" in d and int(np.asarray(d["head_major"])) != 0
    return 1 if key == "rows" and head_major and np.ndim(d["rows"]) == 3 else 0


def select(ctx: EvalContext) -> Selection:
    """``ctx.units`` blocks of the head's index keys (forced ones included),
    expanded to their positions in one ``[n, k]`` row each."""
    s, pos, k = ctx.settings, ctx.pos, ctx.settings.budget

    def rows() -> np.ndarray:
        cfg = ks.BlockSparseConfig(s.block_size, ctx.units, s.init_blocks, s.local_blocks)
        chosen = ks.block_sparse_select(ctx.head.index_q[:, None, :], ctx.head.index_k, pos, cfg)
        # [n, width * block_size], ascending then -1; width = k // block_size
        # blocks fit in k slots, the rest is padding.
        covered = ks.positions_of_blocks(chosen[:, 0], pos, len(ctx.head.index_k), cfg)
        out = np.full((len(pos), k), -1, dtype=np.int32)
        out[:, : covered.shape[1]] = covered
        return out

    return timed(rows)


#: Whole blocks of ``block_size`` tokens; the init and local blocks forced.
BLOCKS = BudgetUnit(
    "block",
    size=lambda s: s.block_size,
    forced=lambda s: s.init_blocks + s.local_blocks,
)

RULE = Rule(
    name="block_sparse",
    title="Block-sparse selection (MiniMax-M3)",
    api=(
        "BlockSparseConfig",
        "MINIMAX_BLOCK_SIZE",
        "block_sparse_select",
        "block_sparse_select_packed",
        "block_sparse_select_paged",
        "positions_of_blocks",
    ),
    reference="kvselect.reference.block_sparse",
    twins=(
        "MINIMAX_BLOCK_SIZE",
        "BlockSparseConfig",
        "block_scores",
        "block_sparse_select",
        "block_sparse_select_packed",
        "block_sparse_select_paged",
        "positions_of_blocks",
    ),
    assertions=("kvselect.testing.assert_blocks",),
    cases="kvselect.testing.cases.all_block_cases",
    case_functions=(
        "kvselect.testing.cases.block_ties",
        "kvselect.testing.cases.block_partial_tail",
        "kvselect.testing.cases.block_short",
    ),
    dumps=(
        DumpKind(
            "blocks",
            TABLE,
            "MiniMax-M3 block selection, checked by `kvselect check`.",
            check,
            row_keys=("rows", "index_q", "query_pos", "seq_ids"),
            rows=lambda d: int(d["rows"].shape[_rows_axis(d, "rows")]),
            row_axis=_rows_axis,
            heads=lambda d: int(d["index_q"].shape[1]) if d["index_q"].ndim == 3 else 1,
        ),
    ),
    policies=(
        Policy(
            "block-sparse",
            select,
            "MiniMax-M3 block selection on the same indexer, ``k / block_size`` blocks (forced init "
            "and local blocks included), expanded to positions.",
            unit=BLOCKS,
            knobs=(
                Knob(
                    "block_size",
                    "--block-size",
                    "block-sparse block size in tokens (default: 64, halved until the forced "
                    "blocks fit the budget, i.e. below k = 192). kvselect.BlockSparseConfig's "
                    "default is 128, MiniMax-M3's block and KV page size; 64 here gives the default "
                    "k = 2048 on the 32K synthetic context 32 blocks to choose, not 16. "
                    "--block-size 128 --init-blocks 0 --local-blocks 1 --budget 2048 is the released "
                    "MiniMax-M3 checkpoint's geometry",
                ),
                Knob(
                    "init_blocks",
                    "--init-blocks",
                    "block-sparse: forced first blocks (default: 1, fewer if the budget cannot hold them)",
                    minimum=0,
                ),
                Knob(
                    "local_blocks",
                    "--local-blocks",
                    "block-sparse: forced newest blocks (default: 2, fewer if the budget cannot hold them)",
                    minimum=0,
                ),
            ),
        ),
    ),
    guide="docs/block-sparse.md",
)
