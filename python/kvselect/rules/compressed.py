"""DeepSeek-V4's attention sets: the CSA top-k over compressed entries, then the window.

The rule (``kvselect.combine_topk_swa_indices``, docs/compressed-keys.md):
a query attends to the ``topk`` best compressed entries it sees (the
lightning indexer over entries of ``compress_ratio`` tokens) and the last
``window_size`` tokens, combined into one row of workspace slots as vLLM's
sparse prefill takes it. Its ``v4_combined`` dump is checked by
:func:`kvselect.checking.check_v4_combined_indices`: the CSA part against
the exact entry scores, the window exactly.

Its eval policy is Qwen's QSA (huggingface/transformers
``src/transformers/models/qwen4_exp/modeling_qwen4_exp.py`` @ 009e78d,
``Qwen4ExpTextQSAIndexer``; the shapes of NVIDIA/cudnn-frontend#838's table:
4 index heads × 128, no weights, ratio 4, top-512): each complete block of 4
tokens is one entry, its key the float32 mean of the block's index keys; a
block's score is ``Σ_h relu(q_h · k̄_b)`` (no weights); a query keeps its
best complete blocks and, always, the ``(p + 1) mod 4`` tokens of its partial
block (the tail, never scored).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence, Tuple

import numpy as np

import kvselect as ks
from kvselect.checking._common import _finite, _floats, _formats, _int, _ints
from kvselect.checking.v4 import check_v4_combined_indices
from kvselect.rules._rule import DumpKind, EvalContext, Policy, Rule, Selection, timed

TABLE = {
    "kind": ("str", "", "required", '"v4_combined"'),
    "combined_indices": (
        "int",
        "[num_tokens, width]",
        "required",
        "the engine's combine_topk_swa_indices rows (DeepSeek-V4 sparse prefill)",
    ),
    "combined_lens": ("int", "[num_tokens]", "required", "the engine's row lengths"),
    "index_q": ("float", "[num_tokens, H, d]", "required", "the indexer's queries"),
    "weights": ("float", "[num_tokens, H]", "required", "its head weights, scales folded in"),
    "index_k": ("float", "[n_entries, d]", "required", "every request's compressed indexer keys"),
    "key_scale": ("float", "[n_entries]", "optional", "per-entry scales (fp8 cache)"),
    "cu_entries": ("int", "[num_reqs + 1]", "required", "request b's entries: index_k rows cu_entries[b] .."),
    "query_start_loc": ("int", "[num_reqs + 1]", "required", "as combine_topk_swa_indices takes it"),
    "seq_lens": ("int", "[num_reqs]", "required", "each request's tokens"),
    "gather_lens": ("int", "[num_reqs]", "required", "the tokens gathered into its workspace"),
    "window_size": ("int scalar", "", "required", "the sliding window W"),
    "compress_ratio": ("int scalar", "", "required", "tokens per compressed entry (CSA: 4)"),
    "topk": ("int scalar", "", "required", "the indexer's top-k"),
    "M": ("int scalar", "", "required", "the per-request workspace stride"),
    "N": ("int scalar", "", "required", "the window's offset in the workspace"),
    "precision": ("str", "", "optional", "the engine's coarsest rounding (default float32)"),
}


def check(
    d: Mapping[str, np.ndarray], atol: float, rtol: float, precision: str, filler: str
) -> Sequence[Tuple[str, Mapping[str, Any]]]:
    """A ``v4_combined`` dump: :func:`kvselect.checking.check_v4_combined_indices`."""
    _finite(d, "index_q", "weights", "index_k", "key_scale")
    fmt = _formats(d)
    scalars = [_int(d, name) for name in ("window_size", "compress_ratio", "topk", "M", "N")]
    report = check_v4_combined_indices(
        _ints(d, "combined_indices").reshape(np.shape(d["combined_indices"])),
        _ints(d, "combined_lens"),
        d["index_q"],
        _floats(d, "weights"),
        d["index_k"],
        _ints(d, "cu_entries"),
        _ints(d, "query_start_loc"),
        _ints(d, "seq_lens"),
        _ints(d, "gather_lens"),
        *scalars,
        key_scale=_floats(d, "key_scale"),
        key_format=fmt["key_format"],
        query_format=fmt["query_format"],
        precision=precision,
        atol=atol,
        rtol=rtol,
    )
    return [("the combined rows (the CSA top-k exactly scored, the window exact)", report)]


#: QSA's tokens per block (``indexer_compress_ratio``).
QSA_RATIO = 4


def qsa(ctx: EvalContext) -> Selection:
    """Qwen's QSA at the token budget ``k``: the best ``(k - 3) // 4``
    complete 4-token blocks of the workload's index (``index_q`` as QSA's
    heads, unweighted, ReLU; block keys the mean of their tokens' index keys:
    kvselect's indexer with ``weights=None, compress_ratio=4``), each as its
    4 tokens, then the tail tokens of the query's partial block. QSA's own
    buffer is ``budget + 3`` wide (2048 + 3); charged within ``k``, the tail
    comes out of the budget, so ``k = 2051`` is QSA's top-512. A budget
    below one block and a full tail (7 tokens) shrinks the block to ``(k +
    1) // 2`` tokens (as the block-sparse policy's block shrinks with ``k``)."""
    units = ctx.units
    r = QSA_RATIO if units >= 2 * QSA_RATIO - 1 else max(1, (units + 1) // 2)
    blocks = (units - (r - 1)) // r
    keys = np.asarray(ctx.head.index_k, dtype=np.float32)
    n_blocks = len(keys) // r
    pooled = keys[: n_blocks * r].reshape(n_blocks, r, keys.shape[1]).mean(axis=1, dtype=np.float32)
    q = np.ascontiguousarray(np.asarray(ctx.head.index_q, dtype=np.float32)[:, None, :])
    pos = np.asarray(ctx.pos, dtype=np.int64)

    def rows() -> np.ndarray:
        entries = ks.indexer_topk(q, None, pooled, pos, blocks, compress_ratio=r)
        tokens = entries[:, :, None] * r + np.arange(r, dtype=np.int32)
        tokens = np.where(entries[:, :, None] >= 0, tokens, -1).reshape(len(pos), -1)
        count = (pos + 1) % r  # the partial block's tokens, the query's own last
        tail = (pos + 1 - count)[:, None] + np.arange(r - 1)
        tail = np.where(np.arange(r - 1) < count[:, None], tail, -1)
        out = np.full((len(pos), units), -1, dtype=np.int32)
        row = np.concatenate([tokens, tail], axis=1)
        row = np.take_along_axis(row, np.argsort(row < 0, axis=1, kind="stable"), axis=1)
        out[:, : row.shape[1]] = row
        return out

    return timed(rows)


RULE = Rule(
    name="compressed",
    title="DeepSeek-V4 attention sets and GLM-5-Next pools",
    api=(
        "window_positions",
        "visible_entries",
        "compressed_entry_tokens",
        "expand_entries",
        "combine_topk_swa_indices",
    ),
    reference="kvselect.reference.compressed",
    twins=(
        "window_positions",
        "visible_entries",
        "compressed_entry_tokens",
        "expand_entries",
        "combine_topk_swa_indices",
    ),
    cases="kvselect.testing.cases.all_family_cases",
    case_functions=(
        "kvselect.testing.cases.forced_entry_dropped",
        "kvselect.testing.cases.forced_entry_counted_twice",
        "kvselect.testing.cases.pool_last_partial_block",
        "kvselect.testing.cases.score_pool_last_partial_block",
        "kvselect.testing.cases.compressed_entry_boundary",
    ),
    dumps=(
        DumpKind(
            "v4_combined",
            TABLE,
            "DeepSeek-V4's combined sparse-prefill index (vLLM's `combine_topk_swa_indices`: "
            "the CSA top-k over compressed entries, then the sliding window), checked by "
            "`kvselect check` (`kvselect.checking.check_v4_combined_indices`).",
            check,
            rows=lambda d: len(d["combined_indices"]),  # grouped by request: one piece
        ),
    ),
    policies=(
        Policy(
            "QSA (Qwen)",
            qsa,
            "Qwen's QSA: the best complete 4-token blocks by ``Σ_h relu(q_h · mean-pooled k)`` (no weights; "
            "kvselect's indexer with ``weights=None, compress_ratio=4``), plus the query's partial block.",
        ),
    ),
    guide="docs/compressed-keys.md",
)
