"""DeepSeek-V4's attention sets: the CSA top-k over compressed entries, then the window.

The rule (``kvselect.combine_topk_swa_indices``, docs/compressed-keys.md):
a query attends to the ``topk`` best compressed entries it sees (the
lightning indexer over entries of ``compress_ratio`` tokens) and the last
``window_size`` tokens, combined into one row of workspace slots as vLLM's
sparse prefill takes it. Its ``v4_combined`` dump is checked by
:func:`kvselect.checking.check_v4_combined_indices`: the CSA part against
the exact entry scores, the window exactly.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence, Tuple

import numpy as np

from kvselect.checking._common import _finite, _floats, _formats, _int, _ints
from kvselect.checking.v4 import check_v4_combined_indices
from kvselect.rules._rule import DumpKind, Rule

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
    guide="docs/compressed-keys.md",
)
