"""The kernels that consume a selection: sparse attention / sparse MLA.

The rule (docs/checking-sparse-attention.md): an engine's ``out`` (and
``lse``) over its index rows equals exact float64 attention over the keys
those rows select, read by the engine's declared conventions (which slots,
padding, repeats, causality, blocks, paging, the empty row, the ``lse``
base), to within the bound of the kernel's stated arithmetic model
(:mod:`kvselect.checking.attention`). Its ``sparse_attention`` dump is one
kernel call: inputs, index rows, outputs and the conventions by name. The
rule has no native entry point of its own (kvselect's ``sparse_attention``
is the baselines' attention pass, checked here as one more engine).
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

from kvselect.checking._common import DumpError, _int, _need, _text
from kvselect.rules._rule import DumpKind, Rule

TABLE = {
    "kind": ("str", "", "required", '"sparse_attention"'),
    "q": ("float", "[n_queries, H_q, d_qk]", "required", "the queries (rope part last)"),
    "k": (
        "float",
        "[n_keys, H_kv, d_qk]; paged: [n_pages, page_size, H_kv, d_qk]",
        "required",
        "the keys (MLA: the latent, rope part last)",
    ),
    "v": ("float", "k's shape with d_v last", "optional (absent: v = k[..., :d_v], MLA)", "the values"),
    "d_v": ("int scalar", "", "optional (MLA: default d_qk)", "the value width read from the latent"),
    "indices": (
        "int",
        "[n_queries, G, width] or [n_queries, width]; head_major: [G, n_queries, width]",
        "required",
        "the engine's index rows (G = 1, H_kv or H_q), padding negative",
    ),
    "out": ("float", "[n_queries, H_q, d_v]", "required", "the engine's output (its format is its rounding)"),
    "lse": ("float", "[n_queries, H_q]; lse_head_major: [H_q, n_queries]", "optional", "the engine's lse"),
    "preset": ("str", "", "optional", "the engine's conventions and model by name (docs/checking-sparse-attention.md)"),
    "model": ("str", "", "optional (default: the preset's, else float32)", "the arithmetic model"),
    "read": ("str", "", "optional", "which slots are read: row, prefix, suffix, last_valid"),
    "read_len": ("int", "[n_queries]", "optional", "slots read by prefix / suffix (default min(width, pos // bs + 1))"),
    "duplicates": ("str", "", "optional", "a repeated entry counts: each, once, unique (refused)"),
    "causal": ("int scalar", "", "optional", "1: tokens past query_pos are masked"),
    "block_size": ("int scalar", "", "optional (default 1)", "tokens per index entry"),
    "out_of_range": ("str", "", "optional", "an entry past its sequence: skip or refuse"),
    "global_indices": ("int scalar", "", "optional", "1: entries are flat ids into every key (packed)"),
    "head_major": ("int scalar", "", "optional", "1: indices are head-major"),
    "lse_head_major": ("int scalar", "", "optional", "1: lse is [H_q, n_queries]"),
    "empty_lse": ("number", "", "optional (default -inf)", "an empty row's lse (the low end with empty_lse_high)"),
    "empty_lse_high": ("number", "", "optional", "with empty_lse: a range of finite sentinels"),
    "lse_base": ("str", "", "optional (default e)", "e or 2"),
    "query_pos": ("int", "[n_queries]", "with causal or prefix / suffix reads", "each query's position"),
    "scale": ("number", "", "optional (default 1/sqrt(d_qk))", "the softmax scale"),
    "sink": ("float", "[H_q]", "optional", "per-head sink logits (in the denominator, not lse)"),
    "cu_seqlens": ("int", "[n_seqs + 1]", "optional", "packed sequences' key offsets"),
    "seq_ids": ("int", "[n_queries]", "optional (default all 0)", "each query's sequence"),
    "block_table": ("int", "[n_seqs, max_blocks]", "optional (paged k)", "each sequence's pages"),
    "seq_lens": ("int", "[n_seqs]", "with block_table", "each sequence's keys"),
    "precision": ("str", "", "optional", "instead of a model: every intermediate rounded to it"),
}

_FLAGS = ("causal", "global_indices", "head_major", "lse_head_major")


def conventions_of_dump(d: Mapping[str, np.ndarray]) -> Any:
    """The dump's conventions: its preset with every convention key it gives."""
    from kvselect.reference.sparse_attn import conventions_of

    over: Dict[str, Any] = {k: _text(d, k) for k in ("read", "duplicates", "out_of_range", "lse_base")}
    for k in _FLAGS:
        if k in d:
            over[k] = bool(_int(d, k))
    if "block_size" in d:
        over["block_size"] = _int(d, "block_size")
    if "empty_lse" in d:
        lo = float(np.asarray(d["empty_lse"]))
        over["empty_lse"] = (lo, float(np.asarray(d["empty_lse_high"]))) if "empty_lse_high" in d else lo
    elif "empty_lse_high" in d:
        raise DumpError("empty_lse_high needs empty_lse (the range's low end)")
    try:
        return conventions_of(_text(d, "preset"), **over)
    except ValueError as e:
        raise DumpError(f"the dump's conventions: {e}") from e


def _model_name(d: Mapping[str, np.ndarray]) -> str:
    from kvselect.checking.attention import model_of

    try:
        return model_of(_text(d, "model"), _text(d, "preset"), _text(d, "precision") if "model" not in d else None).name
    except ValueError as e:
        raise DumpError(str(e)) from e


def _note(d: Mapping[str, np.ndarray]) -> Optional[str]:
    return (
        f"the bound is arithmetic model {_model_name(d)!r} (docs/checking-sparse-attention.md); "
        "--atol / --rtol (either nonzero) replace it"
    )


def check(
    d: Mapping[str, np.ndarray], atol: float, rtol: float, precision: str, filler: str
) -> Sequence[Tuple[str, Mapping[str, Any]]]:
    """A ``sparse_attention`` dump against exact attention under its conventions."""
    from kvselect.checking.attention import check_sparse_attention

    _need(d, "q", "k", "indices", "out")
    floats = getattr(d, "floats", None)

    def f(key: str) -> Any:
        if key not in d:
            return None
        return floats(key) if floats is not None else np.asarray(d[key])

    formats = getattr(d, "formats", {})
    conv = conventions_of_dump(d)
    given = atol or rtol
    report = check_sparse_attention(
        f("out"),
        f("q"),
        f("k"),
        f("v"),
        d["indices"],
        lse=f("lse"),
        preset=_text(d, "preset"),
        conventions=conv,
        model=_text(d, "model"),
        precision=_text(d, "precision") if "model" not in d and "precision" in d else None,
        atol=atol if given else None,
        rtol=rtol if given else None,
        query_pos=d.get("query_pos"),
        scale=float(np.asarray(d["scale"])) if "scale" in d else None,
        d_v=_int(d, "d_v") if "d_v" in d else None,
        sink=f("sink"),
        read_len=d.get("read_len"),
        cu_seqlens=d.get("cu_seqlens"),
        seq_ids=d.get("seq_ids"),
        block_table=d.get("block_table"),
        seq_lens=d.get("seq_lens"),
        out_dtype=formats.get("out", np.asarray(d["out"]).dtype.name),
    )
    return [(f"against exact attention (model {report['model']['name']})", report)]


def _rows(d: Mapping[str, np.ndarray]) -> int:
    q = np.asarray(d["q"])
    return int(q.shape[0] * q.shape[1]) if q.ndim == 3 else len(q)


def assert_case(case: Any, rows: Any) -> Any:
    """A sparse attention case's check of a kernel's ``out`` or ``(out, lse)``
    (:meth:`kvselect.testing.cases.Case.assert_rows`)."""
    from kvselect import testing

    out, lse = rows if isinstance(rows, tuple) else (rows, None)
    return testing.assert_sparse_attention(out, lse=lse, **case.inputs, **case.check)


RULE = Rule(
    name="sparse_attention",
    title="Sparse attention kernels",
    reference="kvselect.reference.sparse_attn",
    twins=("Conventions", "conventions_of", "sparse_attention_exact"),
    assertions=("kvselect.testing.assert_sparse_attention",),
    cases="kvselect.testing.cases.all_sparse_attention_cases",
    case_functions=(
        "kvselect.testing.cases.empty_rows",
        "kvselect.testing.cases.masked_first_chunk",
        "kvselect.testing.cases.repeated_entries",
        "kvselect.testing.cases.neighbour_repeats",
        "kvselect.testing.cases.rising_scores",
        "kvselect.testing.cases.causal_boundary",
        "kvselect.testing.cases.padding_reads",
        "kvselect.testing.cases.paged_blocks",
        "kvselect.testing.cases.packed_mla",
    ),
    dumps=(
        DumpKind(
            "sparse_attention",
            TABLE,
            "One sparse attention / sparse MLA call: its inputs, index rows and outputs, with the "
            "engine's conventions (a `preset`, or each by name) and arithmetic `model`, checked against "
            "exact float64 attention within the model's bound.",
            check,
            no_rtol=_note,
            rows=_rows,
            assert_case=assert_case,
        ),
    ),
    guide="docs/checking-sparse-attention.md",
)
