"""Small rules shared by the checking modules: a refusal in the native
functions' shape, the dump's tolerance, merged reports, a dump's operands
read as the checkers take them."""

from __future__ import annotations

import re
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np

import kvselect as ks
from kvselect.checking.report import Report

DEFAULT_RTOL: Dict[str, float] = {
    "float32": 2.0**-16,
    "float16": 2.0**-11,
    "bfloat16": 2.0**-8,
    "float8_e4m3fn": 2.0**-4,
}
"""The default ``rtol`` for each ``precision`` (see the module docs)."""


# Other names the dump's precision may use.
_ALIASES = {
    "fp32": "float32",
    "fp16": "float16",
    "bf16": "bfloat16",
    "fp8": "float8_e4m3fn",
    "float8": "float8_e4m3fn",
    "fp8_e4m3": "float8_e4m3fn",
}


# Scores of at most this many bytes are held at once (a chunk of rows).
_CHUNK_BYTES = 256 << 20


class DumpError(ValueError):
    """A dump that cannot be read or checked: the message names the key.

    A ``ValueError``. Raised by :func:`read_archive`, :func:`validate`,
    :func:`load_dump`, :func:`save_dump` and :func:`check_dump` for an
    archive, a key, a dtype or a shape they refuse, and for arrays that do
    not fit together; ``kvselect check`` exits 2 on it ("cannot check", never
    "the engine is wrong").
    """


class Dump(Dict[str, np.ndarray]):
    """A dump's arrays, key by key (uncompressed members memory-mapped).

    A ``dict`` of ``str`` to ``numpy.ndarray``, as :func:`validate` and
    :func:`load_dump` return it, with the ``X_format`` pairs decoded:
    ``formats[X]`` is X's format and the ``X_format`` keys are gone.

    Attributes
    ----------
    kind : str
        The dump's kind, one of :data:`KINDS`.
    source : str
        The file name, or ``""``.
    formats : dict of str to str
        ``key -> "bfloat16" | "float16" | "float8_e4m3fn"`` for each key
        held as raw bits.
    """

    kind: str
    source: str
    formats: Dict[str, str]

    def floats(self, key: str) -> Optional[np.ndarray]:
        """Array ``key`` as float32 (raw bits decoded exactly), or None.

        Parameters
        ----------
        key : str
            A key of the dump; its ``<key>_format`` (if any) says how to decode raw bits.

        Returns
        -------
        ndarray of float32 or None
            The array decoded exactly (bfloat16 / float16 / fp8 bits widen without
            rounding; see :func:`decode32`), or None when the dump has no ``key``.
        """
        if key not in self:
            return None
        return decode32(self[key], self.formats.get(key))


# The 16- and 8-bit key formats, read on their bits: the unsigned view, the
# bits below the sign (|x| rises with them, NaN codes the highest) and the
# least non-finite code among those (inf / NaN in bfloat16 and float16, NaN
# in float8_e4m3fn).
_CODES = {
    "bfloat16": (np.uint16, 0x7FFF, 0x7F80),
    "float16": (np.uint16, 0x7FFF, 0x7C00),
    "float8_e4m3fn": (np.uint8, 0x7F, 0x7F),
}


def _codes(a: np.ndarray, fmt: Optional[str]) -> Optional[Tuple[np.ndarray, int, int]]:
    """``a``'s bfloat16 / float16 / float8_e4m3fn codes as unsigned bits,
    with :data:`_CODES`' sign-less mask and least non-finite code: raw bits
    that ``fmt`` names, or typed codes (float16, ml_dtypes'), in native byte
    order; None for any other array (read it decoded)."""
    if a.dtype.kind in "ui":
        name = fmt  # raw bits: the format names them
    elif a.dtype.char in "fd":
        return None  # (float32 / float64; dtype.name is a Python property)
    else:
        name = a.dtype.name
    spec = _CODES.get(name) if name is not None else None
    if spec is None or not a.dtype.isnative or a.dtype.itemsize != np.dtype(spec[0]).itemsize:
        return None  # (a byte-swapped array's bits are not its codes)
    return a.view(spec[0]), spec[1], spec[2]


def decode32(a: np.ndarray, fmt: Optional[str]) -> np.ndarray:
    """Raw ``fmt`` bits (or a float array, when ``fmt`` is None) as float32, exactly.

    Every bfloat16 / float16 / float8_e4m3fn value is a float32, so the
    decode loses nothing.

    Parameters
    ----------
    a : numpy.ndarray
        Any shape: a float array (any float dtype, read as its values,
        whatever ``fmt`` says), or raw bits: ``uint16`` for ``"bfloat16"``
        and ``"float16"``, ``uint8`` for ``"float8_e4m3fn"``.
    fmt : str or None
        ``"bfloat16"``, ``"float16"`` or ``"float8_e4m3fn"`` (any other
        string is read as float8_e4m3fn bytes); None when ``a`` holds floats.

    Returns
    -------
    numpy.ndarray
        float32, ``a``'s shape: the decoded values (a float64 value too
        large for float32 becomes ``inf``).
    """
    if a.dtype == np.float32:
        return a
    if fmt is None or a.dtype.kind == "f":
        with np.errstate(over="ignore"):
            return np.asarray(a, dtype=np.float32)
    if fmt == "bfloat16":
        return (np.asarray(a, dtype=np.uint32) << 16).view(np.float32)
    if fmt == "float16":
        return np.ascontiguousarray(a).view(np.float16).astype(np.float32)
    from kvselect.reference import (
        fp8_e4m3fn_table,  # the exact decode of all 256 bytes
    )

    return fp8_e4m3fn_table().astype(np.float32)[np.asarray(a)]


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


def _refused(argument: str, message: str) -> ks.SelectionError:
    """A ``SelectionError`` as the native functions raise it: ``message``,
    ``argument`` naming the argument at fault, no core ``variant``."""
    e = ks.SelectionError(message)
    e.argument, e.variant = argument, None
    return e


def _precision(precision: str, refuse: Callable[[str], Exception]) -> str:
    """``precision`` (a name of :data:`DEFAULT_RTOL` or an alias) as its
    name there; an unknown one is refused with ``refuse(message)`` (a
    ``DumpError`` for a dump, a ``SelectionError`` naming ``precision`` for
    the API, a ``ValueError`` for :mod:`kvselect.testing`)."""
    p = _ALIASES.get(precision, precision)
    if p not in DEFAULT_RTOL:
        raise refuse(f"precision must be one of {', '.join(DEFAULT_RTOL)}, got {precision!r}")
    return p


def _tolerance(d: Mapping[str, np.ndarray], atol: Optional[float], rtol: Optional[float]):
    precision = _text(d, "precision", "float32")
    assert precision is not None
    precision = _precision(precision, DumpError)
    return (precision, *_tolerance_values(precision, atol, rtol))


def _tolerance_values(precision: str, atol: Optional[float], rtol: Optional[float]) -> Tuple[float, float]:
    """``(atol, rtol)`` with their defaults: 0, and ``precision``'s
    :data:`DEFAULT_RTOL` (``precision`` a name there)."""
    return (0.0 if atol is None else atol), (DEFAULT_RTOL[precision] if rtol is None else rtol)


def _merge(reports: List[Tuple[np.ndarray, dict]]) -> Report:
    """One report from the reports of row subsets (``rows[i]`` of each is the
    dump's row number of its row ``i``)."""
    out = Report(rows=0, correct=0, wrong=0, by_reason={}, details=[])
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
    if "block_table" not in d or ("kv_cache" in d and "req_ids" not in d):
        return None  # (a paged dump's table is its cache's: rows are positions without req_ids)
    page = int(d["kv_cache"].shape[1]) if "kv_cache" in d else None
    _need(d, "req_ids", *(() if page else ("block_size",)))
    bs = _int(d, "block_size", page)
    prefill = d.get("prefill_req_ids")
    return ks.GlobalSlots(
        d["block_table"],
        d["req_ids"][rows],
        bs,
        block_stride_rows=_int(d, "block_stride_rows", bs),
        prefill_req_ids=None if prefill is None else prefill[rows],
        workspace_starts=d.get("workspace_starts"),
        dcp_size=_int(d, "dcp_size", 1),
        dcp_interleave=_int(d, "dcp_interleave", 1),
    )


def _floats(d: Mapping[str, np.ndarray], key: str) -> Optional[np.ndarray]:
    """A float array of the dump as float32 (``None`` if absent), raw
    low-precision bits decoded (the loader read their ``<key>_format``)."""
    if key not in d:
        return None
    return decode32(d[key], getattr(d, "formats", {}).get(key))


def _given(d: Mapping[str, np.ndarray], key: str) -> Optional[np.ndarray]:
    """Given scores or magnitudes as they are: float64 kept float64 (the
    checkers read it as given), anything else as :func:`_floats`."""
    if key in d and d[key].dtype == np.float64:
        return d[key]
    return _floats(d, key)


def _finite(d: Mapping[str, np.ndarray], *keys: str) -> None:
    """The indexer's operands are finite: the exact score of a NaN or
    infinite operand is undefined, so such a dump cannot be checked (and the
    checkers would name the derived magnitudes, not the key)."""
    for key in keys:
        a = _floats(d, key)
        if a is None:
            continue
        bad = ~np.isfinite(a)
        if bad.any():
            at = tuple(int(i) for i in np.argwhere(bad)[0])
            name = f"{key}[{', '.join(map(str, at))}]" if at else key
            raise DumpError(
                f"{name} is {a[at]}: the exact scores of a "
                f"non-finite {key} are undefined, so the dump cannot be checked"
            )


def _formats(d: Mapping[str, np.ndarray]) -> Dict[str, Any]:
    """The native functions' format arguments from the dump's formats."""
    f = getattr(d, "formats", {})
    return {"key_format": f.get("index_k"), "query_format": f.get("index_q")}


def _packing_problem(
    cu: np.ndarray, seq: np.ndarray, n_keys: int, n_rows: Optional[int] = None
) -> Optional[Tuple[str, str]]:
    """The first mistake of a packed batch as ``(argument, message)``, or
    None: ``seq_ids`` one entry per row (when ``n_rows`` is given),
    ``cu_seqlens`` rising from 0 to the keys, each ``seq_ids`` entry naming
    one of its sequences. The one rule of the dump's check and the API's
    (:func:`_check_packing`)."""
    if n_rows is not None and len(seq) != n_rows:
        return "seq_ids", f"seq_ids has {len(seq)} entries for {n_rows} rows"
    if len(cu) < 2 or cu[0] != 0 or np.any(np.diff(cu) < 0) or cu[-1] != n_keys:
        return "cu_seqlens", f"cu_seqlens must rise from 0 to the {n_keys} keys, got {cu[:8]}"
    if len(seq) and (seq.min() < 0 or seq.max() >= len(cu) - 1):
        return "seq_ids", f"seq_ids must name one of the {len(cu) - 1} sequences"
    return None


def _dump_refusal(argument: str, message: str) -> DumpError:
    """A dump's refusal: the message names the key."""
    return DumpError(message)


def _check_packing(
    cu: np.ndarray,
    seq: np.ndarray,
    n_keys: int,
    refuse: Callable[[str, str], Exception] = _dump_refusal,
    n_rows: Optional[int] = None,
) -> None:
    """Refuses a packed batch's first mistake (:func:`_packing_problem`)
    with ``refuse(argument, message)``: a :class:`DumpError` by default (a
    dump's), :func:`_refused` for the API (a ``SelectionError`` naming the
    argument)."""
    problem = _packing_problem(cu, seq, n_keys, n_rows)
    if problem is not None:
        raise refuse(*problem)


def _context_lens(
    query_pos: np.ndarray, compress_ratio: int, n_keys: int, cu: Optional[np.ndarray], seq: Optional[np.ndarray]
) -> np.ndarray:
    """Each indexer row's context ``min((query_pos + 1) // compress_ratio,
    its sequence's keys)``: ``n_keys`` keys when ``cu`` (a packed batch's
    ``cu_seqlens``, ``seq`` its ``seq_ids``) is None."""
    total = n_keys if cu is None else np.diff(np.asarray(cu, dtype=np.int64))[np.asarray(seq, dtype=np.int64)]
    return np.minimum((np.asarray(query_pos, dtype=np.int64) + 1) // compress_ratio, total)


def _topk_of(rows: np.ndarray, topk: Optional[int], layout: Any) -> int:
    """``topk``, or the rows' width (a rank's width with DCP ``layout``)."""
    if topk is not None:
        return int(topk)
    ranks = 1 if layout is None else int(getattr(layout, "dcp_size", 1) or 1)
    return rows.shape[1] // ranks


# The float32 unit roundoff.
_U32 = 2.0**-24
# The absolute error of one rounding into float32's subnormal range (half
# its smallest step).
_ETA32 = 2.0**-150


def _gamma(n: int) -> float:
    """Higham's ``γ_n = n u / (1 - n u)``, ``u = 2^-24``."""
    return n * _U32 / (1.0 - n * _U32)


def _same_rows(n: int, d: Mapping[str, np.ndarray], *keys: str) -> None:
    """Every per-row array of the dump has one entry per engine row: a
    truncated output (or input) is refused, never half checked."""
    for key in keys:
        if key in d and len(np.atleast_1d(d[key])) != n:
            raise DumpError(
                f"{key} has {len(np.atleast_1d(d[key]))} rows but the engine's rows have {n}: one each per row"
            )


_DUMP_TERMS = {"key_format": "index_k_format", "query_format": "index_q_format"}


def _in_dump_terms(message: str) -> str:
    """A native refusal's message with its argument names the dump's keys."""
    for api, key in _DUMP_TERMS.items():
        message = re.sub(rf"\b{api}\b", key, message)
    return message


def _vacuous_rows(
    scores: np.ndarray, mags: Optional[np.ndarray], lens: np.ndarray, topk: int, atol: float, rtol: float
) -> np.ndarray:
    """Which rows no selection could fail at this tolerance: more positions
    than ``topk``, no NaN score, and every position's interval ``s ± e``
    meets every other's (``max (s - e) <= min (s + e)`` over the row's
    positions), ``e = atol + rtol |m|`` as :func:`kvselect.check_topk` takes
    it (no relative term at ``rtol = 0`` or a NaN magnitude). Vectorised
    over chunks of rows, in float64."""
    n, t = scores.shape
    lens = np.asarray(lens, dtype=np.int64)
    out = np.zeros(n, dtype=bool)
    step = max(1, _CHUNK_BYTES // (40 * max(1, t)))
    for r0 in range(0, n, step):
        s = scores[r0 : r0 + step].astype(np.float64)
        L = lens[r0 : r0 + step]
        inside = np.arange(t)[None, :] < L[:, None]
        with np.errstate(invalid="ignore", over="ignore"):
            e: Any = np.float64(atol)
            if mags is not None and rtol:
                rel = rtol * np.abs(mags[r0 : r0 + step].astype(np.float64))
                e = atol + np.where(np.isnan(rel), 0.0, rel)
            nan = (np.isnan(s) & inside).any(axis=1)
            top = np.where(inside, s - e, -np.inf).max(axis=1, initial=-np.inf)
            bottom = np.where(inside, s + e, np.inf).min(axis=1, initial=np.inf)
            out[r0 : r0 + step] = (L > topk) & ~nan & (top <= bottom)
    return out


def _vacuous(
    scores: np.ndarray, mags: Optional[np.ndarray], lens: np.ndarray, topk: int, atol: float, rtol: float
) -> int:
    """How many rows no selection could fail at this tolerance (see
    :func:`_vacuous_rows`)."""
    return int(_vacuous_rows(scores, mags, lens, topk, atol, rtol).sum())


FILLERS = ("-1", "past_context", "repeat")
"""The ``filler`` rules of a topk dump (:func:`kvselect.check_topk`'s ``filler=``)."""


def _paged_keys(d: Mapping[str, np.ndarray]) -> Tuple[np.ndarray, Optional[np.ndarray], np.ndarray, Optional[str]]:
    """A paged dump's keys as a packed batch: ``(index_k, key_scale,
    cu_seqlens, key_format)``, each sequence's first ``seq_lens[s]`` keys
    read from the pages its ``block_table`` row names (as
    :func:`kvselect.indexer_topk_paged` reads them), in the cache's own
    format: raw bits stay raw bits with their format; ``fp8_scaled`` pages
    give their e4m3fn bytes and float32 scales."""
    ambiguous = [k for k in ("index_k", "cu_seqlens", "key_scale") if k in d]
    if ambiguous:
        raise DumpError(
            f"{ambiguous[0]} beside kv_cache: the keys are either packed (index_k, "
            f"cu_seqlens, key_scale) or paged (kv_cache, block_table, seq_lens), not both"
        )
    if "req_ids" not in d:
        stray = [
            k
            for k in (
                "block_size",
                "block_stride_rows",
                "prefill_req_ids",
                "workspace_starts",
                "dcp_size",
                "dcp_interleave",
            )
            if k in d
        ]
        if stray:
            raise DumpError(
                f"{stray[0]} in a paged dump without req_ids is ambiguous: the page size is "
                f"kv_cache's axis 1 and rows are positions within their sequence; add "
                f"req_ids (= seq_ids) if the rows are global slot ids through block_table"
            )
    else:
        if _int(d, "dcp_size", 1) > 1:
            raise DumpError(
                "dcp_size in a paged dump: a paged cache has one block table, DCP one per "
                "rank; dump the ranks' rows with index_k (or scores) instead"
            )
        if not np.array_equal(_ints(d, "req_ids"), _ints(d, "seq_ids")):
            raise DumpError(
                "req_ids must equal seq_ids in a paged dump: the indexer's cache and the "
                "attention share one block table, whose row s is sequence s"
            )
        if "block_size" in d and _int(d, "block_size") != d["kv_cache"].shape[1]:
            raise DumpError(
                f"block_size {_int(d, 'block_size')} is not kv_cache's page size "
                f"{d['kv_cache'].shape[1]}: the paged dump's one block table has one page size"
            )
    _need(d, "block_table", "seq_lens", "seq_ids")
    layout = _text(d, "page_layout", "dense")
    cache = d["kv_cache"]
    fmt = getattr(d, "formats", {}).get("kv_cache")
    table = np.asarray(d["block_table"])
    lens = _ints(d, "seq_lens")
    if table.ndim != 2 or table.dtype.kind not in "iu" or len(table) != len(lens):
        raise DumpError(
            f"block_table must be integer [n_seqs={len(lens)}, max_blocks] in a paged dump, "
            f"got {table.dtype} {table.shape}"
        )
    if layout == "fp8_scaled":
        if cache.dtype != np.uint8 or cache.ndim not in (3, 4) or (cache.ndim == 4 and cache.shape[2] != 1):
            raise DumpError(
                f"kv_cache: fp8_scaled pages are uint8 [num_blocks, block_size, (1,) d + 4], "
                f"got {cache.dtype} {cache.shape}"
            )
        if fmt is not None:
            raise DumpError(
                "kv_cache_format with page_layout fp8_scaled: the pages' layout says their "
                "format (e4m3fn bytes, then float32 scales)"
            )
        nb, bs, width = cache.shape[0], cache.shape[1], cache.shape[-1]
        dim = width - 4
        if dim < 1:
            raise DumpError(f"kv_cache: fp8_scaled pages need d + 4 bytes per key, got {width}")
        pages = np.ascontiguousarray(cache).reshape(nb, bs * width)
        keys = pages[:, : bs * dim].reshape(nb, bs, dim)
        scales: Optional[np.ndarray] = pages[:, bs * dim :].copy().view(np.float32).reshape(nb, bs)
        fmt = "float8_e4m3fn"
    elif layout == "dense":
        if cache.ndim != 3:
            raise DumpError(f"kv_cache: dense pages are [num_blocks, block_size, d], got {cache.shape}")
        if fmt is None and cache.dtype.kind != "f":
            raise DumpError(
                f"kv_cache: raw {cache.dtype} pages need kv_cache_format, or "
                f'page_layout="fp8_scaled" for vLLM\'s DSA pages'
            )
        keys, scales, bs = cache, None, cache.shape[1]
    else:
        raise DumpError(f'page_layout must be "dense" or "fp8_scaled", got {layout!r}')
    if bs < 1:
        raise DumpError("kv_cache: pages of no tokens")
    ks_, cs = [], []
    for s, L in enumerate(int(x) for x in lens):
        need = -(-L // bs)
        if need > table.shape[1]:
            raise DumpError(f"seq_lens[{s}] = {L} needs {need} pages but block_table has {table.shape[1]}")
        ids = table[s, :need].astype(np.int64)
        if len(ids) and (ids.min() < 0 or ids.max() >= len(keys)):
            raise DumpError(f"block_table[{s}] names a page outside kv_cache's {len(keys)}")
        ks_.append(keys[ids].reshape(-1, keys.shape[-1])[:L])
        if scales is not None:
            cs.append(scales[ids].reshape(-1)[:L])
    k = np.concatenate(ks_) if ks_ else keys[:0].reshape(0, keys.shape[-1])
    c = None if scales is None else (np.concatenate(cs) if cs else np.zeros(0, np.float32))
    if c is not None and not np.isfinite(c).all():
        t = int(np.flatnonzero(~np.isfinite(c))[0])
        raise DumpError(
            f"kv_cache: key {t}'s fp8_scaled scale is {c[t]}: the exact scores of a "
            f"non-finite scale are undefined, so the dump cannot be checked"
        )
    bad = ~np.isfinite(decode32(k, fmt))
    if bad.any():
        t, i = (int(x) for x in np.argwhere(bad)[0])
        raise DumpError(
            f"kv_cache: key {t} (in its sequence's pages, packed) element {i} is not finite: "
            f"the exact scores of a non-finite key are undefined, so the dump cannot be checked"
        )
    return np.ascontiguousarray(k), c, np.concatenate([[0], np.cumsum(lens)]).astype(np.int64), fmt


def _ints(d: Mapping[str, np.ndarray], key: str) -> np.ndarray:
    """An integer array of the dump, as int64."""
    a = np.asarray(d[key])
    if a.dtype.kind not in "iu":
        raise DumpError(f"{key} must hold integers, got {a.dtype}")
    return a.astype(np.int64).reshape(-1)
