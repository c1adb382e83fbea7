"""DeepSeek's lightning indexer and the token top-k it selects.

The rule (``kvselect.indexer_topk``, docs/indexer.md): a key's score is
``Σ_h w_h · relu(q_h · k)``, a row selects the ``topk`` best of the keys its
query sees under one total order (score, then the smaller position). Its
``topk`` dump (any engine's token rows, against given scores or the
indexer's inputs) is checked tie-aware; its eval policies are the learned
top-k and the learned top-k with segment witnesses, reserved or as served.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

import kvselect as ks
from kvselect.checking._common import (
    DumpError,
    _check_packing,
    _context_lens,
    _finite,
    _floats,
    _formats,
    _given,
    _int,
    _ints,
    _layout,
    _merge,
    _need,
    _paged_keys,
    _same_rows,
    _text,
    _vacuous,
)
from kvselect.checking.engine_scores import engine_score_checks
from kvselect.checking.exact import indexer_check
from kvselect.checking.family import check_indexer_family, judge_family
from kvselect.rules._rule import DumpKind, EvalContext, Knob, Policy, Rule, Selection, timed

TABLE = {
    "kind": ("str", "", "required", '"topk"'),
    "rows": (
        "int",
        "[n_rows, topk]; with dcp_size: [n_rows, dcp_size * topk]",
        "required",
        "the engine's output, any order, -1 padded (with DCP: every rank's rows side by side)",
    ),
    "scores": ("float", "[n_rows, n_positions]", "scores or the indexer inputs", "the exact scores"),
    "context_lens": ("int", "[n_rows]", "with scores", "each row's positions"),
    "magnitudes": (
        "float",
        "[n_rows, n_positions]",
        "optional, with scores",
        "each score's error scale (for a relative tolerance)",
    ),
    "index_q": ("float", "[n_rows, H, d]", "the indexer inputs or scores", "the indexer's queries"),
    "weights": (
        "float",
        "[n_rows, H]",
        "with index_q, unless the indexer has none",
        "per-row head weights, scales folded in; absent with index_q: no weights, every head's "
        "weight 1 (Qwen's QSA, MiniMax's MSA; indexer_topk's weights=None)",
    ),
    "index_k": ("float", "[n_keys, d]", "with index_q", "the indexer's keys"),
    "key_scale": (
        "float",
        "[n_keys], or 0-d (one scale for every key)",
        "optional, with index_k",
        "per-key scales, or a per-tensor scale",
    ),
    "query_pos": ("int", "[n_rows]", "with index_q", "each row's query position (within its sequence)"),
    "cu_seqlens": (
        "int",
        "[n_seqs + 1]",
        "optional, with index_q",
        "packed sequences' key offsets (as indexer_topk_packed takes them)",
    ),
    "seq_ids": ("int", "[n_rows]", "with cu_seqlens or kv_cache", "each row's sequence"),
    "kv_cache": (
        "cache",
        "[num_blocks, block_size, d]; fp8_scaled: uint8 [num_blocks, block_size, (1,) d + 4]",
        "optional, with index_q (instead of index_k)",
        "the indexer's paged key cache, as indexer_topk_paged takes it",
    ),
    "seq_lens": ("int", "[n_seqs]", "with kv_cache", "each sequence's keys in the cache"),
    "compress_ratio": (
        "int scalar",
        "",
        "optional, with index_q",
        "tokens per key: rows select compressed entries (DeepSeek-V4 CSA: 4), a row's context "
        "is (query_pos + 1) // compress_ratio entries (default 1)",
    ),
    "page_layout": (
        "str",
        "",
        "optional, with kv_cache",
        '"dense" (default) or "fp8_scaled" (vLLM\'s DSA index-K pages)',
    ),
    "activation": (
        "str",
        "",
        "optional, with index_q",
        '"relu" (default) or "none" (MiniMax\'s MSA: the heads\' dot products themselves)',
    ),
    "score_pool": (
        "int scalar",
        "",
        "optional, with index_q",
        "entries per block scored as one, by their max (MiniMax's MSA: 128); rows hold block ids, "
        "the last block partial (default 1)",
    ),
    "score_type": (
        "str",
        "",
        "optional, with score_pool",
        '"max" (default) or "lse" (SGLang\'s MiniMax-M3 selector: a block scored ln sum exp(sm_scale * s_t))',
    ),
    "sm_scale": ("number", "", "optional, with score_type lse", "the lse pool's scale (default 1 / sqrt(d))"),
    "force_first": (
        "int scalar",
        "",
        "optional",
        "the first visible entries (blocks, with score_pool) a row short of its context must hold, "
        "inside topk (default 0)",
    ),
    "force_last": ("int scalar", "", "optional", "the last visible entries likewise (default 0)"),
    "row_layout": (
        "str",
        "",
        "optional",
        '"rank" (default: any order) or "ascending" (cuDNN\'s: the entries ascending, compact, then -1)',
    ),
    "topk_length": ("int", "[n_rows]", "optional", "each row's count of entries (cuDNN's second output)"),
    "topk": ("int scalar", "", "optional", "k (default: the rows' width; with DCP: width / dcp_size)"),
    "engine_scores": (
        "float",
        "[n_rows, n_positions]",
        "optional",
        "the engine's own scores, whose exact top-k the rows must also be",
    ),
    "precision": ("str", "", "optional", "the engine's coarsest rounding (default float32)"),
    "filler": (
        "str",
        "",
        "optional",
        'the engine\'s filler: "-1" (default), "past_context" or "repeat" (check_topk\'s filler=)',
    ),
    "block_table": (
        "int",
        "[n_requests, max_blocks]; with dcp_size: [dcp_size, n_requests, max_blocks]",
        "optional; with kv_cache required",
        "rows are global slot ids through it (GlobalSlots); with kv_cache, the cache's "
        "block table [n_seqs, max_blocks], shared: rows are global slot ids only with req_ids",
    ),
    "req_ids": ("int", "[n_rows]", "with block_table (with kv_cache: optional, = seq_ids)", "each row's request"),
    "block_size": ("int scalar", "", "with block_table (with kv_cache: kv_cache's page size)", "tokens per page"),
    "block_stride_rows": ("int scalar", "", "optional", "slots per page (default block_size)"),
    "prefill_req_ids": ("int", "[n_rows]", "optional", "a prefill row's request, -1 for decode"),
    "workspace_starts": ("int", "[n_prefill_requests]", "optional", "prefill workspace offsets"),
    "dcp_size": ("int scalar", "", "optional", "decode context parallel ranks (default 1)"),
    "dcp_interleave": ("int scalar", "", "optional", "tokens dealt to a rank at a time (default 1)"),
}


def check(
    d: Mapping[str, np.ndarray], atol: float, rtol: float, precision: str, filler: str
) -> Sequence[Tuple[str, Mapping[str, Any]]]:
    """A ``topk`` dump against the exact scores (given, or computed from the
    indexer's inputs) and, with ``engine_scores``, against the engine's own
    scores exactly."""
    _need(d, "rows")
    engine_rows = d["rows"]
    if engine_rows.dtype.kind not in "iu":
        raise DumpError(f"rows must hold integers (int32 or int64), got {engine_rows.dtype}")
    ranks = _int(d, "dcp_size", 1)
    if engine_rows.ndim == 3 and ranks > 1:
        raise DumpError(
            f"rows: a DCP dump's rows are the ranks' rows side by side, 2-D [n_rows, "
            f"dcp_size * topk] (what check_topk takes with slots=GlobalSlots(dcp_size="
            f"{ranks})), got 3-D {engine_rows.shape}: write "
            f"np.concatenate(list(rows), axis=1) (3-D rows only ever mean [n_queries, "
            f"n_heads, width], a blocks dump's)"
        )
    if engine_rows.ndim != 2:
        raise DumpError(
            f"rows must be [n_rows, {'dcp_size * ' if ranks > 1 else ''}topk], got shape {engine_rows.shape}"
        )
    width = engine_rows.shape[1]
    if ranks > 1:
        if width % ranks:
            raise DumpError(
                f"rows: a DCP dump's rows are [n_rows, dcp_size * topk], the "
                f"dcp_size = {ranks} ranks' rows side by side, got width {width}, "
                f"not a multiple of {ranks}"
            )
        width //= ranks
    n = len(engine_rows)
    topk = _int(d, "topk", width)
    _same_rows(
        n,
        d,
        "scores",
        "context_lens",
        "magnitudes",
        "engine_scores",
        "index_q",
        "weights",
        "query_pos",
        "seq_ids",
        "req_ids",
        "prefill_req_ids",
        "topk_length",
    )
    family = _family(d, topk, filler)
    if family is not None:
        return _family_check(d, engine_rows, topk, family, atol, rtol)
    fmt: Dict[str, Any] = _formats(d)
    parts: List[Tuple[np.ndarray, dict]] = []
    vacuous = 0
    inputs: Optional[Dict[str, Any]] = None  # the indexer's inputs, for the engine scores' accuracy
    if "scores" in d:
        _need(d, "context_lens")
        scores, mags = _given(d, "scores"), _given(d, "magnitudes")
        assert scores is not None
        if rtol != 0 and mags is None:
            raise DumpError(
                "rtol > 0 needs each score's magnitude: add 'magnitudes' to the "
                "dump, pass --rtol 0 (and an --atol), or dump the indexer's inputs"
            )
        lens = _ints(d, "context_lens")
        if "kv_cache" in d:
            raise DumpError(
                "kv_cache beside scores: the exact scores are either given or computed "
                "from the indexer's inputs, not both"
            )
        parts.append(
            (
                np.arange(n),
                ks.check_topk(
                    scores,
                    engine_rows,
                    lens,
                    topk=topk,
                    atol=atol,
                    rtol=rtol,
                    magnitudes=mags,
                    slots=_layout(d, np.arange(n)),
                    filler=filler,
                ),
            )
        )
        vacuous = _vacuous(scores, mags, lens, topk, atol, rtol)
    else:
        paged = "kv_cache" in d
        _need(d, "index_q", "weights", "query_pos", *(() if paged else ("index_k",)))
        _finite(d, "index_q", "weights", "index_k", "key_scale")
        q, pos = d["index_q"], _ints(d, "query_pos")
        key_format = fmt["key_format"]
        cu = seq = None
        if paged:  # each sequence's pages, read into the packed batch's keys
            k, scale, cu, key_format = _paged_keys(d)
            seq = _ints(d, "seq_ids")
            _check_packing(cu, seq, len(k))
        else:
            k, scale = d["index_k"], _floats(d, "key_scale")
            if "cu_seqlens" in d:
                _need(d, "seq_ids")
                cu, seq = _ints(d, "cu_seqlens"), _ints(d, "seq_ids")
                _check_packing(cu, seq, len(k))
        ratio = _int(d, "compress_ratio", 1)
        if ratio < 1:
            raise DumpError(f"compress_ratio = {ratio}: a key stands for at least one token")
        report = indexer_check(
            engine_rows,
            q,
            _floats(d, "weights"),
            k,
            pos,
            topk,
            scale,
            key_format,
            fmt["query_format"],
            cu,
            seq,
            atol,
            rtol,
            lambda rows: _layout(d, rows),
            filler=filler,
            compress_ratio=ratio,
        )
        parts.append((np.arange(n), report))
        vacuous = report["vacuous"]
        lens = _context_lens(pos, ratio, len(k), cu, seq)
        if not paged:
            inputs = dict(
                query_pos=pos,
                index_q=q,
                weights=_floats(d, "weights"),
                index_k=k,
                key_scale=scale,
                key_format=key_format,
                query_format=fmt["query_format"],
                cu_seqlens=cu,
                seq_ids=seq,
                compress_ratio=ratio,
            )
    exact = _merge(parts)
    exact["vacuous"] = vacuous
    checks = [("against the exact scores", exact)]
    engine_scores = _given(d, "engine_scores")
    if engine_scores is not None:
        more, _ = engine_score_checks(
            engine_scores,
            engine_rows,
            topk,
            _layout(d, np.arange(n)),
            filler,
            lens=lens,
            paged="kv_cache" in d,
            atol=atol,
            rtol=rtol,
            **({} if inputs is None else inputs),
        )
        checks += more
    return checks


#: The family's keys (issue 43): a dump with any of them (or indexer inputs
#: without weights) is judged by :func:`kvselect.checking.family.judge_family`.
FAMILY_KEYS = (
    "activation",
    "force_first",
    "force_last",
    "score_pool",
    "score_type",
    "sm_scale",
    "row_layout",
    "topk_length",
)


def _family(d: Mapping[str, np.ndarray], topk: int, filler: str) -> Optional[Dict[str, Any]]:
    """The indexer family's options a ``topk`` dump carries (None when it
    carries none and has its weights): each read and judged, every
    inconsistency refused naming the key."""
    given = [key for key in FAMILY_KEYS if key in d]
    no_weights = "index_q" in d and "weights" not in d
    if not given and not no_weights:
        return None
    which = given[0] if given else "no weights"
    activation, layout = _text(d, "activation", "relu"), _text(d, "row_layout", "rank")
    if activation not in ("relu", "none"):
        raise DumpError(f"activation must be 'relu' or 'none', got {activation!r}")
    if layout not in ("rank", "ascending"):
        raise DumpError(f"row_layout must be 'rank' or 'ascending', got {layout!r}")
    f0, f1, pool = _int(d, "force_first", 0), _int(d, "force_last", 0), _int(d, "score_pool", 1)
    for key, v in (("force_first", f0), ("force_last", f1)):
        if v < 0:
            raise DumpError(f"{key} = {v}: a count of forced entries, at least 0")
    if f0 + f1 > topk:
        raise DumpError(
            f"force_first + force_last = {f0} + {f1} > topk = {topk}: forced entries count inside the budget"
        )
    if pool < 1:
        raise DumpError(f"score_pool = {pool}: a block holds at least one entry")
    score_type = _text(d, "score_type", "max")
    if score_type not in ("max", "lse"):
        raise DumpError(f"score_type must be 'max' or 'lse', got {score_type!r}")
    if score_type == "lse" and pool < 2:
        raise DumpError(f"score_type 'lse' with score_pool = {pool}: the log-sum-exp scores a block (score_pool >= 2)")
    sm_scale = None
    if "sm_scale" in d:
        if score_type != "lse":
            raise DumpError("sm_scale without score_type 'lse': it scales the lse pool only")
        sm_scale = float(d["sm_scale"])
        if not (np.isfinite(np.float32(sm_scale)) and sm_scale > 0):
            raise DumpError(f"sm_scale = {sm_scale}: must be finite and above 0")
    if "scores" in d:
        for key in ("activation", "score_pool", "score_type", "sm_scale"):
            if key in d:
                raise DumpError(
                    f"{key} beside scores: it shapes the scores computed from the indexer's inputs, "
                    f"and given scores are already scored (drop {key}, or dump the inputs)"
                )
    elif "index_q" not in d:
        _need(d, "index_q")
    why = {
        "block_table": "rows of global slot ids are",
        "dcp_size": "decode context parallelism is",
        "engine_scores": "the engine's own scores are",
    }
    for key, what in why.items():
        if key in d and not (key == "block_table" and "kv_cache" in d and "req_ids" not in d):
            raise DumpError(f"{key} with {which}: {what} not judged with the indexer family's options")
    if filler != "-1":
        raise DumpError(f"filler {filler!r} with {which}: the indexer family's rows are -1 padded")
    return {
        "activation": activation,
        "force_first": f0,
        "force_last": f1,
        "row_layout": layout,
        "score_pool": pool,
        "score_type": score_type,
        "sm_scale": sm_scale,
        "topk_length": _ints(d, "topk_length") if "topk_length" in d else None,
    }


def _family_check(
    d: Mapping[str, np.ndarray], rows: np.ndarray, topk: int, options: Dict[str, Any], atol: float, rtol: float
) -> Sequence[Tuple[str, Mapping[str, Any]]]:
    """A ``topk`` dump with the family's options, judged as
    :func:`kvselect.checking.check_indexer_family` judges it (given scores
    by its judge, :func:`kvselect.checking.family.judge_family`)."""
    rows = np.asarray(rows)
    if "scores" in d:
        _need(d, "context_lens")
        scores, mags = _given(d, "scores"), _given(d, "magnitudes")
        assert scores is not None
        if rtol != 0 and mags is None:
            raise DumpError(
                "rtol > 0 needs each score's magnitude: add 'magnitudes' to the "
                "dump, pass --rtol 0 (and an --atol), or dump the indexer's inputs"
            )
        lengths = options["topk_length"]
        report = judge_family(
            rows,
            scores,
            mags,
            _ints(d, "context_lens"),
            topk,
            options["force_first"],
            options["force_last"],
            options["row_layout"] == "ascending",
            lengths,
            atol,
            rtol,
        )
        return [("against the exact scores (the indexer family's options)", report)]
    paged = "kv_cache" in d
    _need(d, "index_q", "query_pos", *(() if paged else ("index_k",)))
    _finite(d, "index_q", "weights", "index_k", "key_scale")
    fmt = _formats(d)
    key_format, cu, seq = fmt["key_format"], None, None
    if paged:  # each sequence's pages, read into the packed batch's keys
        k, scale, cu, key_format = _paged_keys(d)
        seq = _ints(d, "seq_ids")
        _check_packing(cu, seq, len(k))
    else:
        k, scale = d["index_k"], _floats(d, "key_scale")
        if "cu_seqlens" in d:
            _need(d, "seq_ids")
            cu, seq = _ints(d, "cu_seqlens"), _ints(d, "seq_ids")
            _check_packing(cu, seq, len(k))
    ratio = _int(d, "compress_ratio", 1)
    if ratio < 1:
        raise DumpError(f"compress_ratio = {ratio}: a key stands for at least one token")
    weights = _floats(d, "weights")
    report = check_indexer_family(
        rows,
        d["index_q"],
        weights,
        k,
        _ints(d, "query_pos"),
        topk,
        key_scale=scale,
        key_format=key_format,
        query_format=fmt["query_format"],
        cu_seqlens=cu,
        seq_ids=seq,
        compress_ratio=ratio,
        atol=atol,
        rtol=rtol,
        **options,
    )
    name = "against the exact scores (the indexer family's options"
    return [(name + (", no weights: every head's weight 1)" if weights is None else ")"), report)]


def given_scores_without_magnitudes(d: Mapping[str, np.ndarray]) -> Optional[str]:
    """Why a ``topk`` dump gets no relative tolerance: its scores are given
    without their magnitudes (None when it has them, or the indexer's inputs)."""
    if "scores" in d and "magnitudes" not in d:
        return (
            "the dump's scores carry no magnitudes, so no relative tolerance applies "
            "(rtol 0): add 'magnitudes', or dump the indexer's inputs"
        )
    return None


def learned(ctx: EvalContext) -> Selection:
    """The top ``k`` of the indexer's scores: kvselect's native lightning
    indexer, charged (the first call of a head, untimed, pays its cold caches)."""

    def rows() -> np.ndarray:
        return ks.indexer_topk(**ctx.head.learned, query_pos=ctx.pos, topk=ctx.units)

    rows()
    return timed(rows)


def reserved(ctx: EvalContext) -> Selection:
    """The top ``k − S`` in rank order, then ``S`` witnesses: the indexer's fused pass."""
    return timed(
        lambda: ks.indexer_topk(
            **ctx.head.learned, query_pos=ctx.pos, topk=ctx.units, num_segments=ctx.settings.segments
        )
    )


def _served(ctx: EvalContext, rows: np.ndarray) -> Selection:
    """The scatter on ``rows`` (a copy of the learned top-k), charged with
    the learned top-k it starts from."""
    t0 = time.perf_counter()
    ks.scatter_topology_witnesses(rows, ctx.lens, ctx.settings.segments)
    return Selection(rows, ctx.done["learned top-k"].seconds + time.perf_counter() - t0)


def as_served(ctx: EvalContext) -> Selection:
    """The learned row in rank order, whose last ``S`` slots (the lowest
    ranked) the scatter overwrites."""
    return _served(ctx, ctx.done["learned top-k"].rows.copy())


def served_unordered(ctx: EvalContext) -> Selection:
    """The learned row in an engine's arbitrary order (vLLM's top-k kernels
    return rows unordered), then the scatter: the slots it overwrites are
    arbitrary members of the row. The shuffle stands for the engine's
    order, so it is not charged."""
    top = ctx.done["learned top-k"].rows
    keys = np.random.default_rng(ctx.settings.seed).random(top.shape)
    keys[top < 0] = 2.0  # padding stays last
    unordered = np.ascontiguousarray(np.take_along_axis(top, np.argsort(keys, axis=1), axis=1))
    return _served(ctx, unordered)


SEGMENTS = Knob(
    "segments",
    "--segments",
    "witness segments S, 1-64 (default: 64, or k // 8 (at least 1) when the budget k is below 512)",
)


def assert_case(case: Any, rows: Any) -> Any:
    """A ``topk`` case's check of a kernel's rows
    (:meth:`kvselect.testing.cases.Case.assert_rows`): the indexer family's
    cases by :func:`kvselect.testing.cases.family.assert_family_rows`, a
    case of given non-finite scores against those scores, the rest by
    :func:`kvselect.testing.assert_topk`."""
    from kvselect import testing

    if case.meta.get("family"):
        from kvselect.testing.cases.family import assert_family_rows

        return assert_family_rows(rows, case.inputs, **case.check)
    if case.meta.get("non_finite"):
        assert case.scores is not None and case.context_lens is not None
        return testing._assert_scores(rows, case.scores, case.context_lens, int(case.inputs["topk"]), **case.check)
    return testing.assert_topk(rows, **case.inputs, **case.check)


RULE = Rule(
    name="indexer",
    title="The lightning indexer (DeepSeek)",
    api=("indexer_topk", "indexer_topk_packed", "indexer_topk_paged"),
    reference="kvselect.reference.indexer",
    twins=("indexer_topk", "indexer_topk_pooled", "indexer_topk_packed", "indexer_topk_paged", "indexer_scores"),
    assertions=("kvselect.testing.assert_topk",),
    cases="kvselect.testing.cases.all_topk_cases",
    case_functions=(
        "kvselect.testing.cases.low_contrast",
        "kvselect.testing.cases.ties_at_threshold",
        "kvselect.testing.cases.signed_zeros",
        "kvselect.testing.cases.all_zero",
        "kvselect.testing.cases.short_contexts",
        "kvselect.testing.cases.fp8_extremes",
        "kvselect.testing.cases.bf16_rounded_ties",
        "kvselect.testing.cases.paged",
        "kvselect.testing.cases.ik_tail_truncation",
        "kvselect.testing.cases.ik_absolute_early_out",
        "kvselect.testing.cases.relu_negative_dots",
        "kvselect.testing.cases.fp8_per_key_scales",
        "kvselect.testing.cases.non_finite",
    ),
    dumps=(
        DumpKind(
            "topk",
            TABLE,
            "A token top-k (the lightning indexer's, or any), checked by `kvselect check`. "
            "The exact scores are either given (`scores` + `context_lens`) or computed from "
            "the indexer's inputs (`index_q`, `weights`, `index_k`, `query_pos`).",
            check,
            fillers=True,
            no_rtol=given_scores_without_magnitudes,
            assert_case=assert_case,
            row_keys=(
                "rows",
                "scores",
                "context_lens",
                "magnitudes",
                "engine_scores",
                "index_q",
                "weights",
                "query_pos",
                "seq_ids",
                "req_ids",
                "prefill_req_ids",
                "topk_length",
            ),
        ),
    ),
    policies=(
        Policy(
            "learned top-k",
            learned,
            "the top ``k`` positions of the *indexer's* scores (the workload's ``index_q · index_k``, an "
            "approximation of the true scores, as DeepSeek's lightning indexer is).",
        ),
        Policy(
            "witnesses (reserved tail)",
            reserved,
            "the top ``k − S`` learned positions, ``S`` padding slots, then "
            ":func:`kvselect.scatter_topology_witnesses`: every segment is covered.",
            knobs=(SEGMENTS,),
        ),
        Policy(
            "witnesses (as served)",
            as_served,
            "the full top-``k`` row in score order, whose last ``S`` slots the scatter overwrites (the "
            "spec's caveat: a segment can end up uncovered).",
        ),
        Policy(
            "witnesses (served, unordered)",
            served_unordered,
            "the full top-``k`` row in an engine's arbitrary order, whose last ``S`` slots the scatter overwrites.",
        ),
    ),
    guide="docs/indexer.md",
)
