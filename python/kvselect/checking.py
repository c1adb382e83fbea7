"""``kvselect check``: is an engine's selection right?

The checkers (:func:`kvselect.check_topk`, :func:`kvselect.check_blocks`,
:func:`kvselect.check_witnesses`) applied to a dump of one kernel call: the
tensors an engine author saves around it — inputs, output, lengths, config.
:func:`check_dump` runs the right checker and :func:`format_report` prints
what it found; ``kvselect check DUMP.npz`` does both, exits 1 when any row
is wrong (so it can gate a kernel's CI) and 2 when the dump cannot be read.

The dump format
---------------

A NumPy ``.npz`` archive (:func:`save_dump` writes one) with a ``kind`` and
the keys of that kind. ``.npz`` cannot carry ``ml_dtypes`` arrays (bfloat16
and float8 load back as raw ``void``), so a low-precision tensor ``X`` is
stored as its raw ``uint16`` / ``uint8`` bits with a string ``X_format``
beside it (``"bfloat16"``, ``"float16"`` or ``"float8_e4m3fn"``); from torch,
``t.view(torch.uint16).numpy()`` (bfloat16) or ``t.view(torch.uint8).numpy()``
(float8) is that view, zero-copy. Index arrays may be int32 or int64.

``kind = "topk"`` — a token top-k (the lightning indexer's, or any):

- ``rows`` ``[n_rows, topk]``: the engine's output, any order, ``-1`` padded;
- the exact scores, either given: ``scores`` ``[n_rows, n_positions]``
  float32 with ``context_lens`` ``[n_rows]`` (and, for a relative tolerance,
  ``magnitudes`` of the same shape; without them only ``atol`` applies); or computed natively from the
  indexer's inputs: ``index_q`` ``[n_rows, H, d]``, ``weights`` ``[n_rows,
  H]`` float32 (scales folded in), ``index_k`` ``[n_keys, d]``, optional
  ``key_scale`` ``[n_keys]`` float32, ``query_pos`` ``[n_rows]``; several
  sequences packed as :func:`kvselect.indexer_topk_packed` takes them add
  ``cu_seqlens`` ``[n_seqs + 1]`` and ``seq_ids`` ``[n_rows]``
  (``query_pos`` within the sequence);
- ``topk`` (default: the rows' width); ``engine_scores`` (optional,
  ``[n_rows, n_positions]`` float32): the engine's own scores, whose exact
  top-k the rows must also be — the self-consistency check that catches a
  threshold shift no tolerance can (vllm-project/vllm#51782).

``kind = "blocks"`` — MiniMax-M3 block selection:

- ``index_q`` ``[n_queries, n_kv_heads, d]``, ``index_k`` ``[n_keys, d]``,
  ``query_pos`` ``[n_queries]``; ``block_size``, ``top_blocks``,
  ``init_blocks``, ``local_blocks`` (the config);
- ``rows`` ``[n_queries, n_kv_heads, width]``, or the engines'
  ``[n_kv_heads, n_queries, width]`` with ``head_major = 1``: block ids, any
  order, ``-1`` padded; physical page ids when ``block_table`` (``[n_seqs,
  max_blocks]``) is given;
- several sequences packed: ``cu_seqlens`` ``[n_seqs + 1]`` and ``seq_ids``
  ``[n_queries]`` (default all 0), ``query_pos`` within the sequence.

``kind = "witnesses"`` — an in-place ``scatter_topology_witnesses_`` call:
``before`` and ``after`` (``[rows, topk]``, the buffer before and after the
call), ``context_lens`` ``[rows]``, ``num_segments``.

The engines' layouts (``topk`` rows): with ``block_table`` ``[n_requests,
max_blocks]`` int32, ``req_ids`` ``[n_rows]`` and ``block_size`` the rows are
global slot ids as vLLM's ``triton_convert_req_index_to_global_index``
writes them (optional ``block_stride_rows``; prefill rows through
``prefill_req_ids`` ``[n_rows]``, ``-1`` for a decode row, and
``workspace_starts``); see :class:`kvselect.GlobalSlots`. With decode
context parallelism add ``dcp_size`` and ``dcp_interleave``: ``rows`` is then
every rank's output, ``[dcp_size, n_rows, topk]`` (each rank keeps the tokens
it owns, ``-1`` or compacted elsewhere), and ``block_table`` every rank's,
``[dcp_size, n_requests, max_blocks]``: the ranks' rows together are the
selection.

The tolerance
-------------

The exact scores are computed from the dumped operands themselves, so an
engine is owed only the roundings it did *beyond* them. ``precision`` (a
string key; default ``"float32"``) names the coarsest of those: the
precision the engine accumulated or stored its scores in, or that it
rounded a dumped operand to on the fly (a bfloat16 query it quantised to
fp8, say). One rounding to it moves a score by at most ``u`` (its unit
roundoff) times its magnitude ``Σ_h |w_h| Σ_i |q_hi k_ti|``, so the default
``rtol`` is ``u``: ``2^-8`` for bfloat16, ``2^-11`` for float16, ``2^-4``
for float8_e4m3fn (also ``"fp8"``, ``"bf16"``, ``"fp16"``, ``"fp32"``);
float32 gets ``2^-16``, room for another summation order over a few hundred
terms. An fp8 kernel that accumulates in float32 (DeepGEMM's MQA logits)
is ``"float32"``: its fp8 operands are in the dump, exact. ``atol`` defaults
to 0. Both are overridable (``--rtol``, ``--atol``); ``0, 0`` is the exact
check. The engine's own scores are always checked exactly. The report counts
the rows the tolerance makes **vacuous** — every position's interval meets
every other's, so no selection could fail — and warns when there are any:
such a check proves nothing about those rows.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import zipfile
from typing import Any, Dict, List, Mapping, Optional, Set, Tuple, Union, cast

import numpy as np

import kvselect as ks

DEFAULT_RTOL: Dict[str, float] = {
    "float32": 2.0**-16,
    "float16": 2.0**-11,
    "bfloat16": 2.0**-8,
    "float8_e4m3fn": 2.0**-4,
}
"""The default ``rtol`` for each ``precision`` (see the module docs)."""

# Other names the dump's precision may use.
_ALIASES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "fp8": "float8_e4m3fn",
            "float8": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn"}

KINDS = ("topk", "blocks", "witnesses")
_RAW_FORMATS = {"bfloat16": np.uint16, "float16": np.uint16, "float8_e4m3fn": np.uint8}
# Scores of at most this many bytes are held at once (a chunk of rows).
_CHUNK_BYTES = 256 << 20


class DumpError(ValueError):
    """A dump that cannot be checked: the message names the key."""


def save_dump(path: str, kind: str, **arrays: Any) -> None:
    """Write a dump of ``kind`` (see the module docs). ``ml_dtypes`` arrays
    (bfloat16, float8_e4m3fn) are stored as their raw bits with a
    ``<name>_format`` key; strings and numbers as 0-d arrays."""
    if kind not in KINDS:
        raise DumpError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    out: Dict[str, np.ndarray] = {"kind": np.asarray(kind)}
    for name, value in arrays.items():
        a = np.asarray(value)
        fmt = a.dtype.name
        if fmt in _RAW_FORMATS:
            out[name] = np.ascontiguousarray(a).view(_RAW_FORMATS[fmt])
            out[f"{name}_format"] = np.asarray(fmt)
        else:
            out[name] = a
    np.savez_compressed(path, **cast(Dict[str, Any], out))  # NumPy's stub types **kwds as its flags


def load_dump(path: Union[str, "os.PathLike[str]"]) -> Dict[str, np.ndarray]:
    """The arrays of a dump, never unpickling anything."""
    if not os.path.exists(path):
        raise DumpError(f"{path}: no such file")
    if not zipfile.is_zipfile(path):
        raise DumpError(f"{path} is not an .npz archive (np.savez writes one)")
    try:
        with np.load(path, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
    except ValueError as e:  # an object array: refuse it, never unpickle
        raise DumpError(f"{path}: holds a Python object array, which a dump never needs ({e})")
    except (OSError, zipfile.BadZipFile) as e:
        raise DumpError(f"{path} cannot be read as an .npz archive: {e}")
    if "kind" not in data:
        raise DumpError(f"{path}: no 'kind' key (one of {', '.join(KINDS)})")
    return data


def _text(d: Mapping[str, np.ndarray], key: str, default: Optional[str] = None) -> Optional[str]:
    if key not in d:
        return default
    a = d[key]
    if a.ndim != 0 or a.dtype.kind not in "US":
        raise DumpError(f"{key} must be a string, got dtype {a.dtype} shape {a.shape}")
    v = a.item()
    return v.decode() if isinstance(v, bytes) else str(v)


def _int(d: Mapping[str, np.ndarray], key: str, default: Optional[int] = None) -> int:
    if key not in d:
        if default is None:
            raise DumpError(f"the dump has no {key!r}")
        return default
    a = d[key]
    if a.ndim != 0 or a.dtype.kind not in "iub":
        raise DumpError(f"{key} must be one integer, got dtype {a.dtype} shape {a.shape}")
    return int(a)


def _need(d: Mapping[str, np.ndarray], *keys: str) -> None:
    missing = [k for k in keys if k not in d]
    if missing:
        raise DumpError(f"the dump has no {', '.join(map(repr, missing))}")


def _tolerance(d: Mapping[str, np.ndarray], atol: Optional[float], rtol: Optional[float]):
    precision = _text(d, "precision", "float32")
    assert precision is not None
    precision = _ALIASES.get(precision, precision)
    if precision not in DEFAULT_RTOL:
        raise DumpError(f"precision must be one of {', '.join(DEFAULT_RTOL)}, got {precision!r}")
    return precision, (0.0 if atol is None else atol), (DEFAULT_RTOL[precision] if rtol is None else rtol)


def _merge(reports: List[Tuple[np.ndarray, dict]]) -> dict:
    """One report from the reports of row subsets (``rows[i]`` of each is the
    dump's row number of its row ``i``)."""
    out: dict = {"rows": 0, "correct": 0, "wrong": 0, "by_reason": {}, "details": []}
    for rows, r in reports:
        for k in ("rows", "correct", "wrong"):
            out[k] += r[k]
        for reason, n in r["by_reason"].items():
            out["by_reason"][reason] = out["by_reason"].get(reason, 0) + n
        out["details"] += [dict(x, row=int(rows[x["row"]])) for x in r["details"]]
    out["details"].sort(key=lambda x: x["row"])
    return out


def _layout(d: Mapping[str, np.ndarray], rows: np.ndarray) -> Optional[ks.GlobalSlots]:
    """The global-slot map of dump rows ``rows``, if the dump has one."""
    if "block_table" not in d:
        return None
    _need(d, "req_ids", "block_size")
    prefill = d.get("prefill_req_ids")
    return ks.GlobalSlots(
        d["block_table"],
        d["req_ids"][rows],
        _int(d, "block_size"),
        block_stride_rows=_int(d, "block_stride_rows", _int(d, "block_size")),
        prefill_req_ids=None if prefill is None else prefill[rows],
        workspace_starts=d.get("workspace_starts"),
        dcp_size=_int(d, "dcp_size", 1),
        dcp_interleave=_int(d, "dcp_interleave", 1),
    )


def _floats(d: Mapping[str, np.ndarray], key: str) -> Optional[np.ndarray]:
    """A float array of the dump as float32 (``None`` if absent), decoding
    raw low-precision bits named by ``<key>_format``."""
    if key not in d:
        return None
    a, fmt = d[key], _text(d, f"{key}_format")
    if fmt is None:
        if a.dtype.kind != "f":
            raise DumpError(f"{key} must hold floats (or raw bits with a {key}_format), got {a.dtype}")
        return a.astype(np.float32)
    raw = {"bfloat16": np.uint16, "float16": np.uint16, "float8_e4m3fn": np.uint8}.get(fmt)
    if raw is None or a.dtype != raw:
        raise DumpError(f"{key}_format {fmt!r} needs {key} as raw uint16 (bfloat16, float16) or "
                        f"uint8 (float8_e4m3fn) bits, got {a.dtype}")
    from kvselect.reference import decode  # the formats' exact decodes, in NumPy

    return decode(a, fmt).astype(np.float32)  # exact: every such value is a float32


def _check_packing(cu: np.ndarray, seq: np.ndarray, n_keys: int) -> None:
    """``cu_seqlens`` rises from 0 to the keys, and each ``seq_ids`` entry
    names one of its sequences."""
    if len(cu) < 2 or np.any(np.diff(cu) < 0) or cu[0] != 0 or cu[-1] != n_keys:
        raise DumpError(f"cu_seqlens must rise from 0 to the {n_keys} keys, got {cu[:8]}")
    if len(seq) and (seq.min() < 0 or seq.max() >= len(cu) - 1):
        raise DumpError(f"seq_ids must name one of the {len(cu) - 1} sequences")


def _same_rows(n: int, d: Mapping[str, np.ndarray], *keys: str) -> None:
    """Every per-row array of the dump has one entry per engine row: a
    truncated output (or input) is refused, never half checked."""
    for key in keys:
        if key in d and len(np.atleast_1d(d[key])) != n:
            raise DumpError(f"{key} has {len(np.atleast_1d(d[key]))} rows but the engine's rows have "
                            f"{n}: one each per row")


def _vacuous(scores: np.ndarray, mags: Optional[np.ndarray], lens: np.ndarray, topk: int,
             atol: float, rtol: float) -> int:
    """Rows no selection could fail at this tolerance: more positions than
    ``topk``, and every position's interval ``s ± e`` meets every other's."""
    count = 0
    for i, L in enumerate(lens):
        L = int(L)
        if L <= topk:
            continue
        s = scores[i, :L].astype(np.float64)
        e = atol + (0.0 if mags is None else rtol * np.abs(mags[i, :L].astype(np.float64)))
        ok = ~np.isnan(s)
        if ok.any() and ok.all() and np.max(s - e) <= np.min(s + e):
            count += 1
    return count


def _check_topk(d: Mapping[str, np.ndarray], atol: float, rtol: float) -> List[Tuple[str, dict]]:
    _need(d, "rows")
    engine_rows = d["rows"]
    if engine_rows.dtype.kind not in "iu":
        raise DumpError(f"rows must hold integers (int32 or int64), got {engine_rows.dtype}")
    ranks = _int(d, "dcp_size", 1)
    if ranks > 1:
        if engine_rows.ndim != 3 or engine_rows.shape[0] != ranks:
            raise DumpError(f"rows must be [dcp_size = {ranks}, n_rows, topk] (each DCP rank's "
                            f"rows), got shape {engine_rows.shape}")
        width = engine_rows.shape[2]
        engine_rows = np.concatenate(list(engine_rows), axis=1)  # the ranks side by side
    elif engine_rows.ndim != 2:
        raise DumpError(f"rows must be [n_rows, topk], got shape {engine_rows.shape}")
    else:
        width = engine_rows.shape[1]
    n = len(engine_rows)
    topk = _int(d, "topk", width)
    _same_rows(n, d, "scores", "context_lens", "magnitudes", "engine_scores", "index_q", "weights",
               "query_pos", "seq_ids", "req_ids", "prefill_req_ids")
    fmt: Dict[str, Any] = {"key_format": _text(d, "index_k_format"), "query_format": _text(d, "index_q_format")}
    parts: List[Tuple[np.ndarray, dict]] = []
    vacuous = 0
    if "scores" in d:
        _need(d, "context_lens")
        scores, mags = _floats(d, "scores"), _floats(d, "magnitudes")
        assert scores is not None
        if rtol != 0 and mags is None:
            raise DumpError("rtol > 0 needs each score's magnitude: add 'magnitudes' to the "
                            "dump, pass --rtol 0 (and an --atol), or dump the indexer's inputs")
        lens = _ints(d, "context_lens")
        parts.append((np.arange(n), ks.check_topk(
            scores, engine_rows, lens, topk=topk, atol=atol, rtol=rtol,
            magnitudes=mags, slots=_layout(d, np.arange(n)))))
        vacuous = _vacuous(scores, mags, lens, topk, atol, rtol)
    else:
        _need(d, "index_q", "weights", "index_k", "query_pos")
        q, k, pos = d["index_q"], d["index_k"], _ints(d, "query_pos")
        w, scale = _floats(d, "weights"), _floats(d, "key_scale")
        assert w is not None
        if "cu_seqlens" in d:
            _need(d, "seq_ids")
            cu, seq = _ints(d, "cu_seqlens"), _ints(d, "seq_ids")
            _check_packing(cu, seq, len(k))
        else:
            cu, seq = np.array([0, len(k)]), np.zeros(n, dtype=np.int64)
        lens = np.zeros(n, dtype=np.int64)
        for s in np.unique(seq):
            lo, hi = int(cu[s]), int(cu[s + 1])
            keys, ksc = k[lo:hi], None if scale is None else scale[lo:hi]
            idx = np.flatnonzero(seq == s)
            step = max(1, _CHUNK_BYTES // (8 * max(1, hi - lo)))
            for c in range(0, len(idx), step):
                rows = idx[c : c + step]
                args = (q[rows], w[rows], keys, pos[rows])
                scores = ks.indexer_scores(*args, key_scale=ksc, **fmt)
                mags = ks.indexer_magnitudes(*args, key_scale=ksc, **fmt) if rtol else None
                lens[rows] = np.minimum(pos[rows] + 1, hi - lo)
                parts.append((rows, ks.check_topk(
                    scores, engine_rows[rows], lens[rows], topk=topk, atol=atol, rtol=rtol,
                    magnitudes=mags, slots=_layout(d, rows))))
                vacuous += _vacuous(scores, mags, lens[rows], topk, atol, rtol)
    exact = _merge(parts)
    exact["vacuous"] = vacuous
    checks = [("against the exact scores", exact)]
    engine_scores = _floats(d, "engine_scores")
    if engine_scores is not None:
        own = ks.check_topk(engine_scores, engine_rows, lens, topk=topk,
                            slots=_layout(d, np.arange(n)))
        own["vacuous"] = _vacuous(engine_scores, None, lens, topk, 0.0, 0.0)
        checks.append(("against the engine's own scores, exactly", own))
    return checks


def _ints(d: Mapping[str, np.ndarray], key: str) -> np.ndarray:
    """An integer array of the dump, as int64."""
    a = np.asarray(d[key])
    if a.dtype.kind not in "iu":
        raise DumpError(f"{key} must hold integers, got {a.dtype}")
    return a.astype(np.int64).reshape(-1)


def _check_blocks(d: Mapping[str, np.ndarray], atol: float, rtol: float) -> List[Tuple[str, dict]]:
    _need(d, "index_q", "index_k", "query_pos", "rows")
    cfg = ks.BlockSparseConfig(
        _int(d, "block_size"), _int(d, "top_blocks"), _int(d, "init_blocks"), _int(d, "local_blocks"))
    fmt: Dict[str, Any] = {"key_format": _text(d, "index_k_format"), "query_format": _text(d, "index_q_format")}
    q, k, pos = d["index_q"], d["index_k"], _ints(d, "query_pos")
    rows = d["rows"]
    if rows.ndim != 3 or rows.dtype.kind not in "iu":
        raise DumpError(f"rows must be integer [n_queries, n_kv_heads, width] (or head-major), "
                        f"got {rows.dtype} {rows.shape}")
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
    report = ks.check_blocks(scores, np.ascontiguousarray(rows).reshape(n * h, -1), nb, cfg,
                             atol=atol, rtol=rtol, magnitudes=mags, slots=layout)
    for x in report["details"]:  # name rows in the user's terms
        x["query"], x["kv_head"] = divmod(x["row"], h)
    return [("against the exact block scores", report)]


def _check_witnesses(d: Mapping[str, np.ndarray]) -> List[Tuple[str, dict]]:
    _need(d, "before", "after", "context_lens", "num_segments")
    report = ks.check_witnesses(d["before"], d["after"], d["context_lens"], _int(d, "num_segments"))
    return [("against the witness rule (exact)", report)]


def check_dump(dump: Any, *, atol: Optional[float] = None, rtol: Optional[float] = None) -> dict:
    """Check a dump (a path, or the dict :func:`load_dump` returns): a dict
    with its ``kind``, the ``tolerance`` used and one entry per check in
    ``checks`` (``name`` and the checker's ``report``); ``wrong`` is the
    number of rows some check found wrong."""
    d = load_dump(dump) if isinstance(dump, (str, os.PathLike)) else dump
    kind = _text(d, "kind")
    if kind not in KINDS:
        raise DumpError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    precision, atol_, rtol_ = _tolerance(d, atol, rtol)
    note = None
    if kind == "topk" and "scores" in d and "magnitudes" not in d and rtol is None:
        rtol_ = 0.0  # given scores without magnitudes: only atol applies
        note = ("the dump's scores carry no magnitudes, so no relative tolerance applies "
                "(rtol 0): add 'magnitudes', or dump the indexer's inputs")
    try:
        if kind == "topk":
            checks = _check_topk(d, atol_, rtol_)
        elif kind == "blocks":
            checks = _check_blocks(d, atol_, rtol_)
        else:
            checks = _check_witnesses(d)
            precision, atol_, rtol_ = "exact", 0.0, 0.0
    except ks.KvselectError as e:
        raise DumpError(f"the dump's arrays do not fit together: {e}") from e
    except KeyError as e:
        raise DumpError(f"the dump has no {e}") from e
    except (TypeError, ValueError, IndexError) as e:  # never a traceback: name what is off
        raise DumpError(f"the dump cannot be checked: {e}") from e
    wrong: Set[int] = set()
    for _, r in checks:
        wrong.update(x["row"] for x in r["details"])
    return {
        "kind": kind,
        "tolerance": {"precision": precision, "atol": atol_, "rtol": rtol_, "note": note},
        "rows": checks[0][1]["rows"],
        "wrong": len(wrong),
        "checks": [{"name": name, "report": r} for name, r in checks],
    }


def _describe(p: dict) -> str:
    """One problem in a sentence."""
    r = p["reason"]
    if r == "wrong_selection":
        def few(pairs):
            return ", ".join(f"{t} ({s:.6g})" for t, s in pairs)
        return (f"wrong selection: dropped {p['n_dropped']} [{few(p['dropped'])}], "
                f"intruders {p['n_intruders']} [{few(p['intruders'])}]; "
                f"threshold {p['threshold']:.6g}, margin {p['margin']:.3g}")
    if r == "wrong_witness":
        return (f"wrong witness in slot {p['slot']}: {p['got']} where the rule writes "
                f"{p['expected']} — {p['why']} ({p['n_wrong']} slot(s))")
    fields = ", ".join(f"{k} {v}" for k, v in p.items() if k != "reason")
    return f"{r.replace('_', ' ')}: {fields}"


def _severity(row: dict) -> Tuple[int, float]:
    """Structural faults first, then selections by margin."""
    m = [p.get("margin", 0.0) for p in row["problems"] if p["reason"] == "wrong_selection"]
    structural = any(p["reason"] != "wrong_selection" for p in row["problems"])
    return (0 if structural else 1, -(m[0] if m else 0.0))


def format_report(result: dict, *, show: int = 5, source: str = "") -> str:
    """The report as text: a summary table, then the worst ``show`` rows of
    each check in detail."""
    t = result["tolerance"]
    tol = "exact" if t["precision"] == "exact" else (
        f"precision {t['precision']}: rtol {t['rtol']:.3g}, atol {t['atol']:.3g}")
    lines = [f"kvselect check{' ' + source if source else ''}: {result['kind']}, "
             f"{result['rows']} rows, {tol}"]
    if t.get("note"):
        lines.append(f"note: {t['note']}")
    lines.append("")
    name_w = max(len(c["name"]) for c in result["checks"])
    lines.append(f"{'':{name_w}}  {'rows':>7} {'correct':>8} {'wrong':>7}")
    for c in result["checks"]:
        r = c["report"]
        lines.append(f"{c['name']:{name_w}}  {r['rows']:>7} {r['correct']:>8} {r['wrong']:>7}")
        for reason, n in r["by_reason"].items():
            if n:
                lines.append(f"{'  ' + reason:{name_w}}  {'':>7} {'':>8} {n:>7}")
    for c in result["checks"]:
        details = sorted(c["report"]["details"], key=_severity)
        if not details:
            continue
        lines += ["", f"worst rows {c['name']}:"]
        for row in details[:show]:
            where = f"row {row['row']}"
            if "query" in row:
                where += f" (query {row['query']}, KV head {row['kv_head']})"
            for i, p in enumerate(row["problems"]):
                lines.append(f"  {where if i == 0 else ' ' * len(where)}: {_describe(p)}")
        if len(details) > show:
            lines.append(f"  ... and {len(details) - show} more (--show N, or --json)")
    for c in result["checks"]:
        v = c["report"].get("vacuous", 0)
        if v:
            lines += ["", f"warning: {v} of {c['report']['rows']} rows {c['name']} are vacuous at this "
                          f"tolerance — every position's interval meets every other's, so no "
                          f"selection could fail them: lower --rtol / --atol to test them"]
    lines += ["", "all rows correct" if result["wrong"] == 0 else f"{result['wrong']} wrong row(s)"]
    return "\n".join(lines)


def _strict(x: Any) -> Any:
    """The report as strict JSON data: a non-finite number (a NaN score, an
    infinite margin) becomes the string ``"nan"``, ``"inf"`` or ``"-inf"``."""
    if isinstance(x, float) and not np.isfinite(x):
        return "nan" if np.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {k: _strict(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_strict(v) for v in x]
    return x


def _run(args: argparse.Namespace) -> int:
    try:
        result = check_dump(args.dump, atol=args.atol, rtol=args.rtol)
    except DumpError as e:
        print(f"kvselect check: {e}", file=sys.stderr)
        return 2
    if args.json:
        json.dump(_strict(result), sys.stdout, indent=2, allow_nan=False)
        print()
    else:
        print(format_report(result, show=args.show, source=args.dump))
    return 1 if result["wrong"] else 0


def add_parser(sub: Any) -> None:
    """The ``check`` subcommand of ``kvselect``."""
    from kvselect.cli import _non_negative_float  # the CLI's one number parser

    p = sub.add_parser(
        "check",
        help="is an engine's selection right? (exit 1 if any row is wrong)",
        description="Check a dump of one selection kernel call against kvselect's exact rule: "
        "token top-k (the lightning indexer's), MiniMax-M3 blocks, or witness rows. Exit "
        "status 0: every row correct; 1: some row wrong; 2: the dump cannot be checked. "
        "The dump format: python -c 'import kvselect.checking as c; help(c)'.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("dump", help="the .npz dump (see help(kvselect.checking))")
    p.add_argument("--rtol", type=_non_negative_float, default=None,
                   help="relative tolerance (default: by the dump's precision: "
                   + ", ".join(f"{k} {v:.3g}" for k, v in DEFAULT_RTOL.items()) + ")")
    p.add_argument("--atol", type=_non_negative_float, default=None,
                   help="absolute tolerance (default 0)")
    p.add_argument("--show", type=int, default=5, help="wrong rows shown in detail per check")
    p.add_argument("--json", action="store_true", help="print the full report as JSON instead")
    p.set_defaults(run=_run)


def make_example(path: str, *, seed: int = 0) -> None:
    """The example dump shipped with the package: a lightning-indexer top-k of
    48 decode queries over 1,024 fp8 keys with per-key scales (64 heads of
    dim 32), scored by an emulated engine in bfloat16 and returned as vLLM
    does — rows unordered, ties by arrival order, int64 global slot ids
    through a shuffled block table of 64-token pages — with one row broken
    the way vllm-project/vllm#51782 broke rows: a winner dropped for the
    best loser."""
    import ml_dtypes

    rng = np.random.default_rng(seed)
    n_q, h, d, n_k, topk, bs = 48, 64, 32, 1024, 64, 64
    k = rng.standard_normal((n_k, d)).astype(np.float32)
    scale = (np.abs(k).max(axis=1) / 448).astype(np.float32)
    k8 = (k / scale[:, None]).astype(ml_dtypes.float8_e4m3fn)
    # Every cast to a low-precision dtype starts from float32: ml_dtypes
    # versions disagree on float64 -> bfloat16 (0.5 rounds through float32,
    # 0.7 rounds once), never on float32 -> bfloat16.
    q = rng.standard_normal((n_q, h, d)).astype(np.float32).astype(ml_dtypes.bfloat16)
    w = (rng.standard_normal((n_q, h)) / np.sqrt(h * d)).astype(np.float32)
    pos = np.sort(rng.integers(topk // 2, n_k, n_q))
    exact = ks.indexer_scores(q, w, k8, pos, key_scale=scale)
    # The engine: scores rounded to bfloat16, top-k by arrival order.
    engine = exact.astype(ml_dtypes.bfloat16).astype(np.float32)
    rows = np.full((n_q, topk), -1, dtype=np.int64)
    for i in range(n_q):
        L = int(pos[i]) + 1
        arrival = rng.permutation(L)
        s = engine[i, :L][arrival]
        best = arrival[np.argsort(-s, kind="stable")[: min(topk, L)]]
        rows[i, : len(best)] = rng.permutation(best)
    broken = n_q // 2
    L = int(pos[broken]) + 1
    order = np.argsort(-engine[broken, :L], kind="stable")
    slot = int(np.flatnonzero(rows[broken] == order[0])[0])
    rows[broken, slot] = order[topk]  # the best position dropped for the best loser
    pages = rng.permutation(4 * (n_k // bs))[: n_k // bs].astype(np.int32)
    table = pages[None, :]
    glob = np.where(rows < 0, -1, table[0][np.maximum(rows, 0) // bs].astype(np.int64) * bs + rows % bs)
    save_dump(path, "topk", rows=glob, index_q=q, weights=w, index_k=k8, key_scale=scale,
              query_pos=pos, topk=topk, engine_scores=engine, precision="bfloat16",
              block_table=table, req_ids=np.zeros(n_q, dtype=np.int64), block_size=bs)


def example_path() -> str:
    """The path of the example dump shipped with the package."""
    return os.path.join(os.path.dirname(__file__), "data", "check-example.npz")
