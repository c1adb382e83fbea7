"""A dump of one kernel call, checked: :func:`check_dump` picks the kind's
checker (token top-k, blocks, witness rows) and merges the reports."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Optional, Set, Tuple

import numpy as np

import kvselect as ks
from kvselect.checking._common import (
    FILLERS,
    Dump,
    DumpError,
    _check_packing,
    _finite,
    _floats,
    _formats,
    _given,
    _in_dump_terms,
    _int,
    _ints,
    _layout,
    _merge,
    _need,
    _paged_keys,
    _same_rows,
    _text,
    _tolerance,
    _vacuous,
)
from kvselect.checking.dumps import CHECK_KINDS, load_dump, validate
from kvselect.checking.exact import indexer_check
from kvselect.checking.v4 import check_v4_combined_indices


def _check_topk(d: Mapping[str, np.ndarray], atol: float, rtol: float, filler: str = "-1") -> List[Tuple[str, dict]]:
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
    )
    fmt: Dict[str, Any] = _formats(d)
    parts: List[Tuple[np.ndarray, dict]] = []
    vacuous = 0
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
        lens = np.minimum((pos + 1) // ratio, len(k) if cu is None else np.diff(cu)[seq])
    exact = _merge(parts)
    exact["vacuous"] = vacuous
    checks = [("against the exact scores", exact)]
    engine_scores = _given(d, "engine_scores")
    if engine_scores is not None:
        own = ks.check_topk(engine_scores, engine_rows, lens, topk=topk, slots=_layout(d, np.arange(n)), filler=filler)
        own["vacuous"] = _vacuous(engine_scores, None, lens, topk, 0.0, 0.0)
        checks.append(("against the engine's own scores, exactly", own))
    return checks


def _check_blocks(d: Mapping[str, np.ndarray], atol: float, rtol: float) -> List[Tuple[str, dict]]:
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
    report = ks.check_blocks(
        scores,
        np.ascontiguousarray(rows).reshape(n * h, -1),
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


def _check_witnesses(d: Mapping[str, np.ndarray]) -> List[Tuple[str, dict]]:
    _need(d, "before", "after", "context_lens", "num_segments")
    report = ks.check_witnesses(d["before"], d["after"], d["context_lens"], _int(d, "num_segments"))
    return [("against the witness rule (exact)", report)]


def _check_v4(d: Mapping[str, np.ndarray], precision: str, atol: float, rtol: float) -> List[Tuple[str, dict]]:
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


def check_dump(
    dump: Any, *, atol: Optional[float] = None, rtol: Optional[float] = None, filler: Optional[str] = None
) -> dict:
    """Check a dump of one kernel call: the kind's checker, its reports merged.

    A ``topk`` dump is checked against the exact scores (given, or computed
    from the indexer's inputs) and, with ``engine_scores``, against the
    engine's own scores exactly; a ``blocks`` dump against the exact block
    scores; a ``v4_combined`` dump by :func:`check_v4_combined_indices`; a
    ``witnesses`` dump against the witness rule (exact). Given ``scores``
    without ``magnitudes`` and no ``rtol`` get ``rtol = 0`` and a note.

    Parameters
    ----------
    dump : str, os.PathLike, Dump or Mapping of str to array_like
        A path (read with :func:`load_dump`), the :class:`Dump` it returns,
        or a dict of the dump's arrays (checked with :func:`validate`); its
        kind one of :data:`CHECK_KINDS`.
    atol : float, optional
        The absolute tolerance; None (the default) is 0.
    rtol : float, optional
        The relative tolerance; None (the default) is the default of
        the dump's ``precision`` (:data:`DEFAULT_RTOL`).
    filler : str, optional
        One of :data:`FILLERS`, overriding a ``topk`` dump's ``filler``
        (``kvselect check --filler``); None (the default) reads the dump's
        (default ``"-1"``).

    Returns
    -------
    dict
        ``kind``; ``tolerance`` (``precision``, ``atol``, ``rtol`` and a
        ``note`` or None; ``"exact"``, 0, 0 for witnesses); ``filler``
        (topk dumps only); ``rows``; ``wrong``, the number of rows some check
        found wrong; and one entry per check in ``checks`` (``name`` and the
        checker's ``report``, with ``vacuous`` for a topk check).

    Raises
    ------
    DumpError
        When the dump cannot be read or checked: every refusal of
        :func:`load_dump` / :func:`validate`; a kind not in
        :data:`CHECK_KINDS`; an unknown ``precision``; ``filler`` given for a
        dump that is not ``topk``, or not one of :data:`FILLERS`; a missing
        key, a wrong shape, arrays that do not fit together, a non-finite
        operand (the native refusals, and any ``TypeError``, ``ValueError``,
        ``IndexError`` or ``KeyError`` on the way, re-raised as a
        ``DumpError`` in the dump's terms: never a traceback).
    OSError
        When a path cannot be opened for reading (from :func:`load_dump`).
    """
    if isinstance(dump, (str, os.PathLike)):
        d = load_dump(dump, expect=CHECK_KINDS)
    elif isinstance(dump, Dump):
        d = dump
        if d.kind not in CHECK_KINDS:
            raise DumpError(f"a {d.kind} dump, not {' or '.join(CHECK_KINDS)}")
    else:
        d = validate(dump, expect=CHECK_KINDS)
    kind = d.kind
    precision, atol_, rtol_ = _tolerance(d, atol, rtol)
    if filler is not None and kind != "topk":
        raise DumpError(f"--filler applies to topk dumps (token rows), not a {kind} dump")
    fill = filler if filler is not None else _text(d, "filler", "-1")
    if fill not in FILLERS:
        where = "--filler" if filler is not None else "the dump's filler"
        raise DumpError(f"{where} must be one of {', '.join(map(repr, FILLERS))}, got {fill!r}")
    assert fill is not None
    note = None
    if kind == "topk" and "scores" in d and "magnitudes" not in d and rtol is None:
        rtol_ = 0.0  # given scores without magnitudes: only atol applies
        note = (
            "the dump's scores carry no magnitudes, so no relative tolerance applies "
            "(rtol 0): add 'magnitudes', or dump the indexer's inputs"
        )
    try:
        if kind == "topk":
            checks = _check_topk(d, atol_, rtol_, fill)
        elif kind == "blocks":
            checks = _check_blocks(d, atol_, rtol_)
        elif kind == "v4_combined":
            checks = _check_v4(d, precision, atol_, rtol_)
        else:
            checks = _check_witnesses(d)
            precision, atol_, rtol_ = "exact", 0.0, 0.0
    except ks.KvselectError as e:
        raise DumpError(f"the dump's arrays do not fit together: {_in_dump_terms(str(e))}") from e
    except KeyError as e:
        raise DumpError(f"the dump has no {e}") from e
    except (TypeError, ValueError, IndexError) as e:  # never a traceback: name what is off
        raise DumpError(f"the dump cannot be checked: {_in_dump_terms(str(e))}") from e
    wrong: Set[int] = set()
    for _, r in checks:
        wrong.update(x["row"] for x in r["details"])
    return {
        "kind": kind,
        "tolerance": {"precision": precision, "atol": atol_, "rtol": rtol_, "note": note},
        **({"filler": fill} if kind == "topk" else {}),
        "rows": checks[0][1]["rows"],
        "wrong": len(wrong),
        "checks": [{"name": name, "report": r} for name, r in checks],
    }


# The API's argument names that are not the dump's keys, and the dump's.
