"""Check a kernel from its own test suite: assertions in the style of
``torch.testing.assert_close``.

:func:`assert_topk`, :func:`assert_blocks`, :func:`assert_quest`, :func:`assert_moba`, :func:`assert_infllm`, :func:`assert_nsa`, :func:`assert_vslash`,
:func:`assert_witnesses` and
:func:`assert_sparse_attention` apply the rules and tolerance defaults of ``kvselect check`` (the checks of
:mod:`kvselect.checking`, called here: nothing is re-derived) to the tensors
a test already holds. Each returns the report (a
:class:`kvselect.checking.Report`, as :func:`kvselect.checking.check_dump`
returns it) when every row is right; otherwise it raises
:class:`CheckFailure`, an ``AssertionError`` whose message is the ``kvselect
check`` text (rows by reason, the worst rows with their dropped and
intruding positions and margins) and whose ``report`` attribute is the
report.

A row no selection could fail at the tolerance (**vacuous**: every
position's interval meets every other's) is never counted as passing
silently: the report counts it and, with ``fail_vacuous=True`` (the
default), the assertion fails, since the test proves nothing about it.

Arrays: NumPy arrays, or any object exporting DLPack (``__dlpack__`` /
``__dlpack_device__``: torch, JAX, CuPy). A tensor on another device (a GPU)
is copied to the host **once** per argument (torch ``.cpu()``, CuPy
``.get()``, JAX ``jax.device_get``; anything else through
``numpy.from_dlpack(x, device="cpu", copy=True)``): that is what a test
wants, and the only copy made. CPU tensors are read in place.

The hard inputs to run these on are in :mod:`kvselect.testing.cases`; the
guide is docs/testing-a-kernel.md.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np

import kvselect as ks
from kvselect._exports import RuleExports
from kvselect.checking import Report, check_dump, check_indexer_topk
from kvselect.checking._common import _precision, _refused, _tolerance_values, _vacuous
from kvselect.checking.engine_scores import engine_score_checks
from kvselect.checking.family import family_options
from kvselect.checking.report import dump_report

# The hard inputs, reachable as ``kvselect.testing.cases`` after ``import
# kvselect.testing`` (a subpackage is an attribute of its parent only once
# imported). Nothing in the cases imports this module at import time (their
# assert_rows reaches it when called), so importing them here is no cycle.
from kvselect.testing import cases
from kvselect.testing._assert import CheckFailure, _as_dump_array, _conclude, _host

# ``__all__``: every rule's assertions, then CheckFailure, as its record lists
# them (kvselect.rules: ``Rule.assertions``), read from the registry on first
# use, as is an assertion written in its rule's own module (``__getattr__`` at
# the end of this module; kvselect._exports).
SHARED = ("CheckFailure",)


def assert_topk(
    rows: Any,
    index_q: Any,
    weights: Any,
    index_k: Any,
    query_pos: Any,
    topk: Optional[int] = None,
    *,
    key_scale: Any = None,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    precision: str = "float32",
    rtol: Optional[float] = None,
    atol: Optional[float] = None,
    engine_scores: Any = None,
    cu_seqlens: Any = None,
    seq_ids: Any = None,
    kv_cache: Any = None,
    block_table: Any = None,
    seq_lens: Any = None,
    page_layout: str = "dense",
    slots: Optional[ks.GlobalSlots] = None,
    filler: str = "-1",
    fail_vacuous: bool = True,
    compress_ratio: int = 1,
    activation: str = "relu",
    force_first: int = 0,
    force_last: int = 0,
    row_layout: str = "rank",
    score_pool: int = 1,
    score_type: str = "max",
    sm_scale: Optional[float] = None,
    topk_length: Any = None,
) -> Report:
    """Assert that ``rows`` is a correct lightning-indexer top-k of the
    indexer's inputs, as ``kvselect check`` judges it.

    Parameters
    ----------
    rows : array_like or DLPack tensor
        The kernel's output ``[n_rows, width]``: positions (within each
        sequence), any order, padded as ``filler`` says.
    index_q, weights, index_k, query_pos, topk, key_scale, key_format, query_format
        The indexer's inputs, as :func:`kvselect.indexer_topk` takes them
        (``topk`` defaults to the width).
    precision : str
        The kernel's coarsest rounding beyond these operands; sets the default
        ``rtol`` (:data:`kvselect.checking.DEFAULT_RTOL`; ``"float32"``:
        ``2^-16``). ``atol`` defaults to 0. ``rtol = atol = 0`` is the exact
        check (right up to float64 rounding).
    rtol, atol : float, optional
        Override the tolerance: entry ``t`` may be off by ``atol + rtol m_t``,
        ``m_t`` its magnitude.
    engine_scores : array_like, optional
        The kernel's own scores ``[n_rows, n_positions]`` (positions within
        the sequence). Two more findings, each its own entry of
        ``report["checks"]``: the rows must be an **exact** top-k of these
        scores (self-consistency, as a dump's ``engine_scores``: it catches a
        threshold shift no tolerance can, vllm-project/vllm#51782); and the
        scores must match the exact ones under the tolerance (reported
        ``score_off`` only where certainly outside it; not for ``kv_cache``).
    cu_seqlens, seq_ids : array_like, optional
        A packed batch, as :func:`kvselect.indexer_topk_packed` takes it.
    kv_cache, block_table, seq_lens, page_layout : optional
        A paged cache (instead of ``index_k``), as
        :func:`kvselect.indexer_topk_paged` takes it, with ``seq_ids``.
    slots : GlobalSlots, optional
        The rows are global slot ids through this map.
    filler : str
        How the kernel fills a row with fewer than ``topk`` positions
        (:func:`kvselect.check_topk`'s ``filler``).
    fail_vacuous : bool
        Fail when some row is vacuous (no selection could fail it at this
        tolerance). With False such rows are still counted in the report.
    compress_ratio : int
        Tokens per key (DeepSeek-V4's CSA: 4): the rows select compressed
        entries and a row's context is ``(query_pos + 1) // compress_ratio``
        entries, as :func:`kvselect.indexer_topk` takes it.
    activation, force_first, force_last, row_layout, score_pool, score_type, sm_scale, topk_length : optional
        The indexer family's options (``weights`` may then be None), as
        :func:`kvselect.checking.check_indexer_family` judges them (not with
        ``engine_scores``, ``slots`` or a ``filler`` other than ``"-1"``).

    Returns
    -------
    Report
        The report (``rows``, ``correct``, ``wrong``, ``by_reason``,
        ``details``; ``kind``, ``tolerance``, ``filler``, ``vacuous``,
        ``checks``), as :func:`kvselect.checking.check_dump` returns it.

    Raises
    ------
    CheckFailure
        (an ``AssertionError``) when some row is wrong, or vacuous with
        ``fail_vacuous``; the message is the ``kvselect check`` text, the
        report is ``err.report``.
    SelectionError, TypeError
        Arguments that do not fit together, or a non-finite operand (its
        exact scores are undefined), as :func:`kvselect.checking.check_indexer_topk`.
    """
    p = _precision(precision, ValueError)
    rows = _host(rows, "rows")
    index_q, weights, index_k = _host(index_q, "index_q"), _host(weights, "weights"), _host(index_k, "index_k")
    query_pos, key_scale = _host(query_pos, "query_pos"), _host(key_scale, "key_scale")
    cu_seqlens, seq_ids = _host(cu_seqlens, "cu_seqlens"), _host(seq_ids, "seq_ids")
    kv_cache, block_table = _host(kv_cache, "kv_cache"), _host(block_table, "block_table")
    seq_lens, engine_scores = _host(seq_lens, "seq_lens"), _host(engine_scores, "engine_scores")
    family = dict(
        activation=activation,
        force_first=force_first,
        force_last=force_last,
        row_layout=row_layout,
        score_pool=score_pool,
        score_type=score_type,
        sm_scale=sm_scale,
        topk_length=_host(topk_length, "topk_length"),
    )
    if engine_scores is not None and family_options(weights, None, "-1", **family) is not None:
        raise _refused(
            "engine_scores",
            "engine_scores with the indexer family's options: the engine's own scores are not checked with "
            "them (forced entries and pools change which scores a row must top); drop engine_scores",
        )
    exact = check_indexer_topk(
        rows,
        index_q,
        weights,
        index_k,
        query_pos,
        topk,
        key_scale=key_scale,
        key_format=key_format,
        query_format=query_format,
        cu_seqlens=cu_seqlens,
        seq_ids=seq_ids,
        precision=p,
        atol=atol,
        rtol=rtol,
        slots=slots,
        filler=filler,
        kv_cache=kv_cache,
        block_table=block_table,
        seq_lens=seq_lens,
        page_layout=page_layout,
        compress_ratio=compress_ratio,
        **family,
    )
    atol_, rtol_ = (float(x) for x in _tolerance_values(p, atol, rtol))
    checks: List[Tuple[str, Report]] = [("against the exact scores", exact)]
    note = None
    if engine_scores is not None:
        more, note = engine_score_checks(
            engine_scores,
            rows,
            topk,
            slots,
            filler,
            query_pos=query_pos,
            index_q=index_q,
            weights=weights,
            index_k=index_k,
            key_scale=key_scale,
            key_format=key_format,
            query_format=query_format,
            cu_seqlens=cu_seqlens,
            seq_ids=seq_ids,
            seq_lens=seq_lens,
            paged=kv_cache is not None,
            atol=atol_,
            rtol=rtol_,
            compress_ratio=compress_ratio,
        )
        checks += more
    tolerance = {"precision": p, "atol": atol_, "rtol": rtol_, "note": note}
    return _conclude(dump_report("topk", tolerance, checks, filler), fail_vacuous, "assert_topk")


def _assert_scores(
    rows: Any,
    scores: Any,
    context_lens: Any,
    topk: int,
    *,
    rtol: float = 0.0,
    atol: float = 0.0,
    fail_vacuous: bool = True,
    filler: str = "-1",
) -> Report:
    """:func:`assert_topk` against given exact scores (the
    :mod:`kvselect.testing.cases` whose operands are not finite, which
    :func:`assert_topk` refuses): :func:`kvselect.check_topk` at ``atol``
    (``rtol`` needs magnitudes: only 0 here), the report as a dump's of
    given scores (vacuous rows as :func:`kvselect.checking.check_dump`
    counts them)."""
    if rtol:
        raise ValueError("given scores carry no magnitudes here: rtol must be 0")
    r, s = np.asarray(_host(rows, "rows")), np.asarray(scores)
    lens = np.asarray(context_lens, dtype=np.int64)
    report = ks.check_topk(s, r, lens, topk=topk, atol=atol, filler=filler)
    report["vacuous"] = _vacuous(s, None, lens, topk, atol, 0.0)
    tolerance = {
        "precision": "float32",
        "atol": float(atol),
        "rtol": 0.0,
        "note": "checked against the case's exact scores",
    }
    return _conclude(
        dump_report("topk", tolerance, [("against the exact scores", report)], filler), fail_vacuous, "assert_topk"
    )


def assert_blocks(
    rows: Any,
    index_q: Any,
    index_k: Any,
    query_pos: Any,
    config: ks.BlockSparseConfig,
    *,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    precision: str = "float32",
    rtol: Optional[float] = None,
    atol: Optional[float] = None,
    cu_seqlens: Any = None,
    seq_ids: Any = None,
    block_table: Any = None,
    head_major: bool = False,
) -> Report:
    """Assert that ``rows`` is a correct MiniMax-M3 block selection, as
    ``kvselect check`` judges a ``blocks`` dump.

    Parameters
    ----------
    rows : array_like or DLPack tensor
        Block ids ``[n_queries, n_kv_heads, width]`` (``[n_kv_heads,
        n_queries, width]`` with ``head_major``), any order, ``-1`` padded;
        physical page ids with ``block_table``.
    index_q, index_k, query_pos, config, key_format, query_format
        As :func:`kvselect.block_sparse_select` takes them.
    precision, rtol, atol
        The tolerance, as :func:`assert_topk`. At ``rtol = atol = 0`` the
        verdict is exact (real arithmetic, up to float64 rounding): a row
        is right if its free blocks are kvselect's exact selection, or
        differ from it only by blocks whose float64 scores tie; otherwise
        it is judged against kvselect's float32 :func:`kvselect.block_scores`
        with the blocks it swapped re-scored in float64, as in a dump.
    cu_seqlens, seq_ids : array_like, optional
        A packed batch (each query scored over its own sequence's keys).
    block_table : array_like, optional
        ``[n_seqs, max_blocks]``: the rows are physical page ids through it.
    head_major : bool
        The rows are head-major.

    Returns
    -------
    Report
        The report, as :func:`kvselect.checking.check_dump` returns it.

    Raises
    ------
    CheckFailure
        When some row is wrong (message: the ``kvselect check`` text;
        ``err.report``).
    kvselect.checking.DumpError
        Arguments that do not fit together (named by their dump keys).
    """
    p = _precision(precision, ValueError)
    d: Dict[str, Any] = {"kind": np.asarray("blocks"), "precision": np.asarray(p)}
    _as_dump_array(_host(index_q, "index_q"), "index_q", d, query_format)
    _as_dump_array(_host(index_k, "index_k"), "index_k", d, key_format)
    d["query_pos"] = np.asarray(_host(query_pos, "query_pos")).reshape(-1)
    d["rows"] = np.asarray(_host(rows, "rows"))
    for name in ("block_size", "top_blocks", "init_blocks", "local_blocks"):
        d[name] = np.asarray(getattr(config, name))
    if head_major:
        d["head_major"] = np.asarray(1)
    for name, v in (("cu_seqlens", cu_seqlens), ("seq_ids", seq_ids), ("block_table", block_table)):
        if v is not None:
            d[name] = np.asarray(_host(v, name))
    result = check_dump(d, atol=atol, rtol=rtol)
    return _conclude(result, False, "assert_blocks")


def assert_quest(
    rows: Any,
    q: Any,
    keys: Any,
    seq_lens: Any,
    page_budget: int,
    page_size: int = 16,
    *,
    variant: str = "kernel",
    num_recent_pages: int = 4,
    key_scale: Any = None,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    layers: Any = None,
    dense_layers: Optional[int] = None,
    precision: str = "float32",
    rtol: Optional[float] = None,
    atol: Optional[float] = None,
) -> Report:
    """Assert that ``rows`` are Quest's page sets, as ``kvselect check`` judges
    a ``quest`` dump (exact page bounds from ``keys``; each row decided
    exactly, ties at the threshold either way).

    Parameters
    ----------
    rows : array_like or DLPack tensor
        Page ids ``[n_seqs, n_q_heads, width]`` (``variant='sglang'``: ``[n_seqs,
        1, width]``), any order, ``-1`` padded.
    q, keys, seq_lens, page_budget, page_size, variant, num_recent_pages
        As :func:`kvselect.quest_select` takes them, with ``q`` ``[n_seqs,
        n_q_heads, d]`` and ``keys`` the sequences' keys ``[n_tokens, n_kv_heads,
        d]`` one after another (the bounds are built from them).
    key_scale, key_format, query_format
        As :func:`kvselect.quest_bounds` and :func:`kvselect.quest_select`.
    layers : array_like of int, [n_seqs], optional
        Each row's layer: rows of a layer below ``dense_layers`` (default 2,
        Quest's) must read every page.
    dense_layers : int, optional
        See ``layers``.
    precision, rtol, atol
        The tolerance, as :func:`assert_topk` (the magnitude of a page score
        is ``sum_i |q_i| |bound_i|``).

    Returns
    -------
    Report
        The report, as :func:`kvselect.checking.check_dump` returns it.

    Raises
    ------
    CheckFailure
        When some row is wrong (message: the ``kvselect check`` text;
        ``err.report``).
    kvselect.checking.DumpError
        Arguments that do not fit together (named by their dump keys).
    """
    p = _precision(precision, ValueError)
    d: Dict[str, Any] = {"kind": np.asarray("quest"), "precision": np.asarray(p)}
    _as_dump_array(_host(q, "q"), "q", d, query_format)
    _as_dump_array(_host(keys, "keys"), "keys", d, key_format)
    d["seq_lens"] = np.asarray(_host(seq_lens, "seq_lens")).reshape(-1)
    d["rows"] = np.asarray(_host(rows, "rows"))
    d["page_budget"], d["page_size"] = np.asarray(int(page_budget)), np.asarray(int(page_size))
    d["variant"], d["num_recent_pages"] = np.asarray(variant), np.asarray(int(num_recent_pages))
    if key_scale is not None:
        d["key_scale"] = np.asarray(_host(key_scale, "key_scale"), dtype=np.float32)
    if layers is not None:
        d["layers"] = np.asarray(_host(layers, "layers")).reshape(-1)
    if dense_layers is not None:
        d["dense_layers"] = np.asarray(int(dense_layers))
    return _conclude(check_dump(d, atol=atol, rtol=rtol), False, "assert_quest")


def assert_infllm(
    rows: Any,
    q: Any,
    ck: Any,
    seq_len: int,
    topk: Optional[int] = None,
    *,
    init_blocks: int = 1,
    local_blocks: int = 32,
    pooling: str = "cuda",
    keep: str = "through_current",
    scale: Optional[float] = None,
    ck_scale: Any = None,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    precision: str = "float32",
    rtol: Optional[float] = None,
    atol: Optional[float] = None,
) -> Report:
    """Assert that ``rows`` are InfLLM-v2's blocks, as ``kvselect check`` judges an
    ``infllm`` dump (the exact block scores of ``q`` and ``ck``; each row decided in
    real arithmetic, ties within the engine's rounding either way).

    Parameters
    ----------
    rows : array_like or DLPack tensor
        Block ids ``[n_q, n_kv_heads, width]``, any order, ``-1`` padded.
    q, ck, seq_len, topk, init_blocks, local_blocks, pooling, keep, scale, ck_scale
        As :func:`kvselect.infllm_select` takes them (``topk`` defaults to the rows'
        width).
    key_format, query_format
        The formats of raw uint16 / uint8 ``ck`` and ``q``.
    precision, rtol, atol
        The tolerance, as :func:`assert_topk` (the magnitude of a block score is the
        score).

    Returns
    -------
    Report
        The report, as :func:`kvselect.checking.check_dump` returns it.

    Raises
    ------
    CheckFailure
        When some row is wrong (message: the ``kvselect check`` text; ``err.report``).
    kvselect.checking.DumpError
        Arguments that do not fit together (named by their dump keys).
    """
    p = _precision(precision, ValueError)
    d: Dict[str, Any] = {"kind": np.asarray("infllm"), "precision": np.asarray(p)}
    _as_dump_array(_host(q, "q"), "q", d, query_format)
    _as_dump_array(_host(ck, "ck"), "ck", d, key_format)
    d["seq_len"] = np.asarray(int(seq_len))
    d["rows"] = np.asarray(_host(rows, "rows"))
    if topk is not None:
        d["topk"] = np.asarray(int(topk))
    d["init_blocks"], d["local_blocks"] = np.asarray(int(init_blocks)), np.asarray(int(local_blocks))
    d["pooling"], d["keep"] = np.asarray(pooling), np.asarray(keep)
    if scale is not None:
        d["scale"] = np.asarray(float(scale))
    if ck_scale is not None:
        d["ck_scale"] = np.asarray(_host(ck_scale, "ck_scale"), dtype=np.float32)
    return _conclude(check_dump(d, atol=atol, rtol=rtol), False, "assert_infllm")


def assert_vslash(
    rows: Any,
    q: Any,
    keys: Any,
    vertical_size: int,
    slash_size: int,
    *,
    variant: str = "kernel",
    key_scale: Any = None,
    key_format: Optional[str] = None,
    precision: str = "float32",
    rtol: Optional[float] = None,
    atol: Optional[float] = None,
) -> Report:
    """Assert that ``rows = (vertical, slash)`` are MInference's vertical-slash
    selection, as ``kvselect check`` judges a ``vslash`` dump (each a top-k of
    the exact column / diagonal sums, the forced ones first; ties either way).

    Parameters
    ----------
    rows : tuple of two array_like or DLPack tensors
        The kernel's columns ``[n_heads, nv]`` and diagonal offsets ``query - key``
        ``[n_heads, ns]``, any order.
    q, keys, vertical_size, slash_size, variant, key_scale, key_format
        As :func:`kvselect.vslash_select` takes them.
    precision, rtol, atol
        The tolerance, as :func:`assert_topk` (a sum's magnitude is itself).

    Returns
    -------
    Report
        The report, as :func:`kvselect.checking.check_dump` returns it.

    Raises
    ------
    CheckFailure
        When some row is wrong (message: the ``kvselect check`` text;
        ``err.report``).
    kvselect.checking.DumpError
        Arguments that do not fit together (named by their dump keys).
    """
    vertical, slash = rows
    p = _precision(precision, ValueError)
    d: Dict[str, Any] = {"kind": np.asarray("vslash"), "precision": np.asarray(p)}
    d["q"] = np.asarray(_host(q, "q"), dtype=np.float32)
    _as_dump_array(_host(keys, "keys"), "keys", d, key_format)
    d["vertical"] = np.asarray(_host(vertical, "vertical"))
    d["slash"] = np.asarray(_host(slash, "slash"))
    d["vertical_size"], d["slash_size"] = np.asarray(int(vertical_size)), np.asarray(int(slash_size))
    d["variant"] = np.asarray(variant)
    if key_scale is not None:
        d["key_scale"] = np.asarray(_host(key_scale, "key_scale"), dtype=np.float32)
    return _conclude(check_dump(d, atol=atol, rtol=rtol), False, "assert_vslash")


def assert_moba(
    rows: Any,
    q: Any,
    keys: Any,
    topk: int,
    block_size: int,
    *,
    cu_seqlens: Any = None,
    cu_seqlens_q: Any = None,
    variant: str = "efficient",
    key_scale: Any = None,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    precision: str = "float32",
    rtol: Optional[float] = None,
    atol: Optional[float] = None,
) -> Report:
    """Assert that ``rows`` are MoBA's block sets, as ``kvselect check`` judges a
    ``moba`` dump (each row decided in real arithmetic, ties at the threshold
    either way).

    Parameters
    ----------
    rows : array_like or DLPack tensor
        Block ids ``[n_queries, n_q_heads, width]``, any order, ``-1`` padded.
    q, keys, topk, block_size, cu_seqlens, cu_seqlens_q, variant
        As :func:`kvselect.moba_select` takes them (``keys`` its ``k``).
    key_scale, key_format, query_format
        As :func:`kvselect.moba_select`.
    precision, rtol, atol
        The tolerance, as :func:`assert_topk` (the magnitude of a gate is
        ``sum_i |q_i| mean_t |k_ti|``).

    Returns
    -------
    Report
        The report, as :func:`kvselect.checking.check_dump` returns it.

    Raises
    ------
    CheckFailure
        When some row is wrong (message: the ``kvselect check`` text;
        ``err.report``).
    kvselect.checking.DumpError
        Arguments that do not fit together (named by their dump keys).

    See Also
    --------
    assert_quest : the same for Quest's page sets.

    Examples
    --------
    >>> import numpy as np, kvselect
    >>> from kvselect.testing import assert_moba
    >>> k = np.array([0, 2, 4, 6, -3, -1, 3, 3], np.float32).reshape(8, 1, 1)
    >>> q = np.ones((1, 1, 1), np.float32)
    >>> assert_moba(np.array([[[3, 1]]]), q, k, 2, 2)["wrong"]
    0
    """
    p = _precision(precision, ValueError)
    d: Dict[str, Any] = {"kind": np.asarray("moba"), "precision": np.asarray(p)}
    _as_dump_array(_host(q, "q"), "q", d, query_format)
    _as_dump_array(_host(keys, "keys"), "keys", d, key_format)
    d["rows"] = np.asarray(_host(rows, "rows"))
    d["topk"], d["block_size"] = np.asarray(int(topk)), np.asarray(int(block_size))
    d["variant"] = np.asarray(variant)
    for name, v in (("cu_seqlens", cu_seqlens), ("cu_seqlens_q", cu_seqlens_q)):
        if v is not None:
            d[name] = np.asarray(_host(v, name)).reshape(-1)
    if key_scale is not None:
        d["key_scale"] = np.asarray(_host(key_scale, "key_scale"), dtype=np.float32)
    return _conclude(check_dump(d, atol=atol, rtol=rtol), False, "assert_moba")


def assert_nsa(
    rows: Any,
    q: Any,
    k: Any,
    block_counts: Optional[int] = None,
    *,
    block_size: int = 64,
    init_blocks: int = 1,
    local_blocks: int = 2,
    scale: Optional[float] = None,
    k_scale: Any = None,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    window: str = "fla",
    kernel_size: int = 32,
    kernel_stride: int = 16,
    precision: str = "float32",
    rtol: Optional[float] = None,
    atol: Optional[float] = None,
) -> Report:
    """Assert that ``rows`` are NSA's blocks as fla selects them, as ``kvselect check``
    judges an ``nsa`` dump (the exact block scores of ``q`` and ``k``; each row decided in
    real arithmetic, ties within the engine's rounding either way).

    Parameters
    ----------
    rows : array_like or DLPack tensor
        Block ids ``[n_q, n_kv_heads, width]``, any order, ``-1`` padded.
    q, k, block_counts, block_size, init_blocks, local_blocks, scale, k_scale
        As :func:`kvselect.nsa_select` takes them (``block_counts`` defaults to the
        rows' width).
    key_format, query_format
        The formats of raw uint16 / uint8 ``k`` and ``q``.
    window, kernel_size, kernel_stride
        The block scores' window, as :func:`kvselect.nsa_select` takes it: ``"fla"``
        (default) or ``"eq9"``, the NSA paper's Eq. 9 over compressed keys of
        ``kernel_size`` tokens every ``kernel_stride`` (judged against the exact Eq. 9
        scores, within their bound).
    precision, rtol, atol
        The tolerance, as :func:`assert_topk` (the magnitude of a block score is the
        score).

    Returns
    -------
    Report
        The report, as :func:`kvselect.checking.check_dump` returns it.

    Raises
    ------
    CheckFailure
        When some row is wrong (message: the ``kvselect check`` text; ``err.report``).
    kvselect.checking.DumpError
        Arguments that do not fit together (named by their dump keys).

    See Also
    --------
    kvselect.nsa_select : the rule.

    Examples
    --------
    >>> import numpy as np, kvselect
    >>> from kvselect import testing
    >>> q = np.ones((1, 2, 4), np.float32)
    >>> k = np.zeros((20, 1, 4), np.float32); k[8:12] = 1.0
    >>> testing.assert_nsa(np.array([[[0, 2, 3, 4]]]), q, k, block_size=4)["correct"]
    1
    """
    p = _precision(precision, ValueError)
    d: Dict[str, Any] = {"kind": np.asarray("nsa"), "precision": np.asarray(p)}
    _as_dump_array(_host(q, "q"), "q", d, query_format)
    _as_dump_array(_host(k, "k"), "k", d, key_format)
    d["rows"] = np.asarray(_host(rows, "rows"))
    if block_counts is not None:
        d["block_counts"] = np.asarray(int(block_counts))
    d["block_size"] = np.asarray(int(block_size))
    d["init_blocks"], d["local_blocks"] = np.asarray(int(init_blocks)), np.asarray(int(local_blocks))
    if scale is not None:
        d["scale"] = np.asarray(float(scale))
    if k_scale is not None:
        d["k_scale"] = np.asarray(_host(k_scale, "k_scale"), dtype=np.float32)
    d["window"] = np.asarray(str(window))
    if window != "fla":
        d["kernel_size"], d["kernel_stride"] = np.asarray(int(kernel_size)), np.asarray(int(kernel_stride))
    return _conclude(check_dump(d, atol=atol, rtol=rtol), False, "assert_nsa")


def assert_witnesses(before: Any, after: Any, context_lens: Any, num_segments: int) -> Report:
    """Assert that an in-place witness call (``scatter_topology_witnesses_``)
    wrote exactly what the rule writes, as ``kvselect check`` judges a
    ``witnesses`` dump.

    Parameters
    ----------
    before, after : array_like or DLPack tensor
        The ``[rows, topk]`` buffer before and after the kernel's call.
    context_lens : array_like
        Each row's positions ``L``.
    num_segments : int
        The call's ``num_segments``.

    Returns
    -------
    Report
        The report, as :func:`kvselect.checking.check_dump` returns it.

    Raises
    ------
    CheckFailure
        When some row is not what the rule writes.
    """
    d = {
        "kind": np.asarray("witnesses"),
        "before": np.asarray(_host(before, "before")),
        "after": np.asarray(_host(after, "after")),
        "context_lens": np.asarray(_host(context_lens, "context_lens")),
        "num_segments": np.asarray(int(num_segments)),
    }
    return _conclude(check_dump(d), False, "assert_witnesses")


def assert_sparse_attention(
    out: Any,
    q: Any,
    k: Any,
    v: Any,
    indices: Any,
    *,
    lse: Any = None,
    preset: Optional[str] = None,
    conventions: Any = None,
    model: Optional[str] = None,
    precision: Optional[str] = None,
    atol: Optional[float] = None,
    rtol: Optional[float] = None,
    query_pos: Any = None,
    scale: Optional[float] = None,
    d_v: Optional[int] = None,
    sink: Any = None,
    read_len: Any = None,
    cu_seqlens: Any = None,
    seq_ids: Any = None,
    block_table: Any = None,
    seq_lens: Any = None,
) -> Report:
    """Assert that a sparse attention / sparse MLA kernel's ``out`` (and
    ``lse``) is exact attention over its index rows, read by its declared
    conventions, within its arithmetic model's bound — as ``kvselect check``
    judges a ``sparse_attention`` dump.

    Parameters
    ----------
    out : array_like or DLPack tensor, [n_queries, H_q, d_v]
        The kernel's output; its dtype (bfloat16 included) is its last rounding.
    q, k, v, indices : array_like or DLPack tensor
        The kernel's inputs (``v`` None: MLA's latent, ``v = k[..., :d_v]``),
        as :func:`kvselect.checking.check_sparse_attention` takes them.
    lse : array_like, optional
        The kernel's ``lse``, in its declared base and layout.
    preset : str, optional
        The engine's conventions and default model by name
        (``"flashmla_sparse_prefill"``, ``"cudnn_793"``, ``"minimax_m3"``, ...).
    conventions : kvselect.reference.Conventions, optional
        The conventions, each stored in the dump by name (wins over the preset's).
    model, precision, atol, rtol : optional
        The bound: a model's name, or every intermediate rounded to
        ``precision`` (a :data:`kvselect.checking.DEFAULT_RTOL` name), or
        ``atol + rtol |exact|`` (either nonzero).
    query_pos, scale, d_v, sink, read_len, cu_seqlens, seq_ids, block_table, seq_lens : optional
        As :func:`kvselect.reference.sparse_attention_exact`.

    Returns
    -------
    Report
        The report, as :func:`kvselect.checking.check_dump` returns it; its
        check's report holds ``model``, ``worst``, ``by_cause``.

    Raises
    ------
    CheckFailure
        When some (query, head) row is wrong: the message names the rows,
        their worst error against its bound and the likeliest cause.
    kvselect.checking.DumpError
        Arguments that do not fit together (named by their dump keys).

    See Also
    --------
    kvselect.checking.check_sparse_attention : the check, returning the report.
    kvselect.testing.cases.all_sparse_attention_cases : the inputs that broke such kernels.
    """
    d: Dict[str, Any] = {"kind": np.asarray("sparse_attention")}
    for key, a in (("out", out), ("q", q), ("k", k), ("v", v), ("lse", lse), ("sink", sink)):
        if a is not None:
            _as_dump_array(_host(a, key), key, d)
    d["indices"] = np.asarray(_host(indices, "indices"))
    for key, a in (
        ("query_pos", query_pos),
        ("read_len", read_len),
        ("cu_seqlens", cu_seqlens),
        ("seq_ids", seq_ids),
        ("block_table", block_table),
        ("seq_lens", seq_lens),
    ):
        if a is not None:
            d[key] = np.asarray(_host(a, key))
    for key, x in (("preset", preset), ("model", model), ("precision", precision), ("scale", scale), ("d_v", d_v)):
        if x is not None:
            d[key] = np.asarray(x)
    if conventions is not None:
        c = conventions
        for key in ("read", "duplicates", "out_of_range", "lse_base"):
            d[key] = np.asarray(getattr(c, key))
        for key in ("causal", "global_indices", "head_major", "lse_head_major", "block_size"):
            d[key] = np.asarray(int(getattr(c, key)))
        lo, hi = c.empty_lse_range()
        d["empty_lse"] = np.asarray(lo)
        if hi != lo:
            d["empty_lse_high"] = np.asarray(hi)
    return _conclude(check_dump(d, atol=atol, rtol=rtol), False, "assert_sparse_attention")


# Last, once every name above is bound: a lookup the module cannot answer
# reads the registry (kvselect._exports).
_EXPORTS = RuleExports(__name__, lambda: SHARED, lambda rule: rule.assertions, shared_first=False)


def __getattr__(name: str) -> Any:
    return _EXPORTS.getattr(name)


def __dir__() -> List[str]:
    return _EXPORTS.dir()
