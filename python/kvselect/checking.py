"""``kvselect check``: is an engine's selection right?

The checkers (:func:`kvselect.check_topk`, :func:`kvselect.check_blocks`,
:func:`kvselect.check_witnesses`) applied to a dump of one kernel call: the
tensors an engine author saves around it — inputs, output, lengths, config.
:func:`check_dump` runs the right checker and :func:`format_report` prints
what it found; ``kvselect check DUMP.npz`` does both, exits 1 when any row
is wrong (so it can gate a kernel's CI) and 2 when the dump cannot be read
or checked — "cannot check" is never reported as "the engine is wrong".

The dump format
---------------

One format for every dump, ``kvselect check``'s and ``kvselect eval``'s
(the kind ``"workload"``, see :mod:`kvselect.workloads`); every key of every
kind is tabled in ``docs/dump-format.md`` (and :data:`TABLES`). A NumPy
``.npz`` archive (:func:`save_dump` writes one, uncompressed, so
:func:`load_dump` memory-maps each array and reads only the bytes used)
with a ``kind`` and the keys of that kind; a key not in the kind's table is
refused, naming the closest known key (an unknown key is never ignored).
The names are the API's: ``index_q``, ``index_k``, ``weights``,
``key_scale``, as :func:`kvselect.indexer_topk` takes them. ``.npz`` cannot
carry ``ml_dtypes`` arrays (bfloat16 and float8 load back as raw ``void``),
so a low-precision tensor ``X`` is stored as its raw ``uint16`` / ``uint8``
bits with a string ``X_format`` beside it (``"bfloat16"``, ``"float16"`` or
``"float8_e4m3fn"``; float16 may also be a real float16 array); from torch,
``t.view(torch.uint16).numpy()`` (bfloat16) or ``t.view(torch.uint8).numpy()``
(float8) is that view, zero-copy. An archive ``np.savez`` wrote from
``ml_dtypes`` arrays holds raw ``void`` bytes (``|V2``, ``|V1``): it is read
when the key's ``X_format`` is given (the bytes viewed as ``uint16`` /
``uint8`` raw bits), and refused otherwise, naming the key and the fix
(``|V2`` may be bfloat16 or float16, ``|V1`` any fp8: never guessed). Index
arrays may be int32 or int64.

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
  (``query_pos`` within the sequence); ``key_scale`` may be 0-d, one
  per-tensor scale for every key; a paged cache as
  :func:`kvselect.indexer_topk_paged` takes it: ``kv_cache`` (instead of
  ``index_k``), ``block_table`` ``[n_seqs, max_blocks]``, ``seq_lens``
  ``[n_seqs]``, ``seq_ids`` ``[n_rows]``, ``page_layout`` (``"dense"``, the
  default: pages of raw bits with ``kv_cache_format`` or floats;
  ``"fp8_scaled"``: vLLM's uint8 DSA pages, the keys' e4m3fn bytes then
  their float32 scales). Each sequence's pages are read into its keys (and
  scales) in the cache's own format, never converted, and scored as a
  packed batch is;
- ``filler`` (default ``"-1"``; ``kvselect check --filler`` overrides it):
  how the engine fills a row that sees fewer than ``topk`` positions, as
  :func:`kvselect.check_topk`'s ``filler=`` (``"past_context"``: entries at
  or past the context, transformers' DSA modules; ``"repeat"``: a repeated
  position);
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
every rank's output side by side, 2-D ``[n_rows, dcp_size * topk]`` (rank
``r``'s rows are columns ``r * topk`` to ``(r + 1) * topk``; each rank keeps
the tokens it owns, ``-1`` or compacted elsewhere) — exactly what
:func:`kvselect.check_topk` takes with ``slots=GlobalSlots(dcp_size=...)``
— and ``block_table`` every rank's, ``[dcp_size, n_requests, max_blocks]``:
the ranks' rows together are the selection. In a paged dump
(``kv_cache``) ``block_table`` is the cache's, and, as in vLLM, where the
indexer's cache and the attention share one block table, it is also the
table rows are read back through: the rows are positions within their
sequence (what :func:`kvselect.indexer_topk_paged` returns) unless
``req_ids`` is given, which makes them global slot ids through that same
table (``req_ids`` must then equal ``seq_ids``, row ``s`` of the table
being sequence ``s``; ``block_size``, if given, must be the cache's page
size; no DCP). Anything else — ``block_size`` or ``block_stride_rows``
without ``req_ids``, ``index_k`` or ``cu_seqlens`` beside ``kv_cache`` — is
ambiguous and refused. 3-D rows only ever mean
``[n_queries, n_heads, width]`` (a blocks dump's); a DCP topk dump with 3-D
rows is refused.

The indexer's operands (``index_q``, ``weights``, ``index_k``,
``key_scale``) must be finite: a NaN or infinite one is refused, naming the
key and its index, since its exact scores are undefined.

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
check. Which check compares against what:

- the exact check (a dump of the indexer's inputs, or
  :func:`check_indexer_topk`): scores exact up to float64 rounding — the
  float32 scores screen, the candidates near each row's line are re-scored
  in float64 — so ``rtol = 0`` means "right up to float64 rounding", never
  "ranked like kvselect's float32 sum";
- a dump's given ``scores``: those values, as given (float32 or float64);
- the engine's own scores (``engine_scores``): exactly, as given. The report counts
the rows the tolerance makes **vacuous** — every position's interval meets
every other's, so no selection could fail — and warns when there are any:
such a check proves nothing about those rows.
"""

from __future__ import annotations

import argparse
import json
import os
import difflib
import re
import struct
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

KINDS = ("topk", "blocks", "witnesses", "workload")
"""The dump kinds: the three ``kvselect check`` reads and ``kvselect eval``'s workload."""
CHECK_KINDS = ("topk", "blocks", "witnesses")
FORMATS: Dict[str, Any] = {"bfloat16": np.uint16, "float16": np.uint16, "float8_e4m3fn": np.uint8}
"""The ``X_format`` strings and the raw-bits dtype each needs beside it."""
_RAW_FORMATS = FORMATS
# Scores of at most this many bytes are held at once (a chunk of rows).
_CHUNK_BYTES = 256 << 20

# One row per key: (dtype class, shape, when required, meaning). The dtype
# classes: "float" (float16/32/64, or raw bits with an X_format), "int"
# (any integer dtype), "int scalar", "number", "str".
_T = Tuple[str, str, str, str]
TABLES: Dict[str, Dict[str, _T]] = {
    "topk": {
        "kind": ("str", "", "required", '"topk"'),
        "rows": ("int", "[n_rows, topk]; with dcp_size: [n_rows, dcp_size * topk]", "required",
                 "the engine's output, any order, -1 padded (with DCP: every rank's rows side by side)"),
        "scores": ("float", "[n_rows, n_positions]", "scores or the indexer inputs",
                   "the exact scores"),
        "context_lens": ("int", "[n_rows]", "with scores", "each row's positions"),
        "magnitudes": ("float", "[n_rows, n_positions]", "optional, with scores",
                       "each score's error scale (for a relative tolerance)"),
        "index_q": ("float", "[n_rows, H, d]", "the indexer inputs or scores",
                    "the indexer's queries"),
        "weights": ("float", "[n_rows, H]", "with index_q", "per-row head weights, scales folded in"),
        "index_k": ("float", "[n_keys, d]", "with index_q", "the indexer's keys"),
        "key_scale": ("float", "[n_keys], or 0-d (one scale for every key)", "optional, with index_k",
                      "per-key scales, or a per-tensor scale"),
        "query_pos": ("int", "[n_rows]", "with index_q", "each row's query position (within its sequence)"),
        "cu_seqlens": ("int", "[n_seqs + 1]", "optional, with index_q",
                       "packed sequences' key offsets (as indexer_topk_packed takes them)"),
        "seq_ids": ("int", "[n_rows]", "with cu_seqlens or kv_cache", "each row's sequence"),
        "kv_cache": ("cache", "[num_blocks, block_size, d]; fp8_scaled: uint8 [num_blocks, block_size, "
                     "(1,) d + 4]", "optional, with index_q (instead of index_k)",
                     "the indexer's paged key cache, as indexer_topk_paged takes it"),
        "seq_lens": ("int", "[n_seqs]", "with kv_cache", "each sequence's keys in the cache"),
        "page_layout": ("str", "", "optional, with kv_cache",
                        '"dense" (default) or "fp8_scaled" (vLLM\'s DSA index-K pages)'),
        "topk": ("int scalar", "", "optional", "k (default: the rows' width; with DCP: width / dcp_size)"),
        "engine_scores": ("float", "[n_rows, n_positions]", "optional",
                          "the engine's own scores, whose exact top-k the rows must also be"),
        "precision": ("str", "", "optional", "the engine's coarsest rounding (default float32)"),
        "filler": ("str", "", "optional",
                   'the engine\'s filler: "-1" (default), "past_context" or "repeat" (check_topk\'s filler=)'),
        "block_table": ("int", "[n_requests, max_blocks]; with dcp_size: [dcp_size, n_requests, max_blocks]",
                        "optional; with kv_cache required",
                        "rows are global slot ids through it (GlobalSlots); with kv_cache, the cache's "
                        "block table [n_seqs, max_blocks], shared: rows are global slot ids only with req_ids"),
        "req_ids": ("int", "[n_rows]", "with block_table (with kv_cache: optional, = seq_ids)",
                    "each row's request"),
        "block_size": ("int scalar", "", "with block_table (with kv_cache: kv_cache's page size)",
                       "tokens per page"),
        "block_stride_rows": ("int scalar", "", "optional", "slots per page (default block_size)"),
        "prefill_req_ids": ("int", "[n_rows]", "optional", "a prefill row's request, -1 for decode"),
        "workspace_starts": ("int", "[n_prefill_requests]", "optional", "prefill workspace offsets"),
        "dcp_size": ("int scalar", "", "optional", "decode context parallel ranks (default 1)"),
        "dcp_interleave": ("int scalar", "", "optional", "tokens dealt to a rank at a time (default 1)"),
    },
    "blocks": {
        "kind": ("str", "", "required", '"blocks"'),
        "index_q": ("float", "[n_queries, n_kv_heads, d]", "required", "the block indexer's queries"),
        "index_k": ("float", "[n_keys, d]", "required", "its keys"),
        "query_pos": ("int", "[n_queries]", "required", "each query's position (within its sequence)"),
        "block_size": ("int scalar", "", "required", "BlockSparseConfig.block_size"),
        "top_blocks": ("int scalar", "", "required", "BlockSparseConfig.top_blocks"),
        "init_blocks": ("int scalar", "", "required", "BlockSparseConfig.init_blocks"),
        "local_blocks": ("int scalar", "", "required", "BlockSparseConfig.local_blocks"),
        "rows": ("int", "[n_queries, n_kv_heads, width] (head_major: [n_kv_heads, n_queries, width])",
                 "required", "block ids, any order, -1 padded"),
        "head_major": ("int scalar", "", "optional", "1: rows are head-major"),
        "block_table": ("int", "[n_seqs, max_blocks]", "optional", "rows are physical page ids through it"),
        "cu_seqlens": ("int", "[n_seqs + 1]", "optional", "packed sequences' key offsets"),
        "seq_ids": ("int", "[n_queries]", "optional (default all 0)", "each query's sequence"),
        "precision": ("str", "", "optional", "the engine's coarsest rounding (default float32)"),
    },
    "witnesses": {
        "kind": ("str", "", "required", '"witnesses"'),
        "before": ("int", "[rows, topk]", "required", "the buffer before scatter_topology_witnesses_"),
        "after": ("int", "[rows, topk]", "required", "the buffer after it"),
        "context_lens": ("int", "[rows]", "required", "each row's positions"),
        "num_segments": ("int scalar", "", "required", "the call's num_segments"),
    },
    "workload": {
        "kind": ("str", "", "optional when q, k and v are present", '"workload"'),
        "q": ("float", "[layers, n_heads, tokens, d]", "required", "the query heads (after rotary / norms)"),
        "k": ("float", "[layers, n_kv_heads, tokens, d]", "required", "the key heads"),
        "v": ("float", "[layers, n_kv_heads, tokens, d_v]", "required", "the value heads"),
        "index_q": ("float", "[layers, n_kv_heads, tokens, d_idx]; DSA form: [layers, tokens, H, d_idx]",
                    "optional, with index_k", "your indexer's queries"),
        "index_k": ("float", "[layers, n_kv_heads, tokens, d_idx]; DSA form: [layers, tokens, d_idx]",
                    "optional, with index_q", "your indexer's keys"),
        "weights": ("float", "[layers, tokens, H]", "optional (makes the DSA form)",
                    "the DSA indexer's per-query head weights, scales folded in"),
        "key_scale": ("float", "[layers, tokens]", "optional, DSA form", "per-key scales (fp8 cache)"),
        "scale": ("number", "", "optional", "the softmax scale (default 1/sqrt(d))"),
        "layer_ids": ("int", "[layers]", "optional", "the model's layer numbers"),
        "kv_head_ids": ("int", "[layers, n_kv_heads]", "optional", "the model's KV head numbers"),
    },
}
"""Every kind's keys: ``key -> (dtype class, shape, when required, meaning)``
(docs/dump-format.md is these tables). A key not in its kind's table is refused."""

# Old or easily confused names: the suggestion for each (the eval format's old
# names, and the API's format arguments).
_RENAMED = {"index_k_scale": "key_scale", "index_weights": "weights", "key_scales": "key_scale",
            "key_format": "index_k_format", "query_format": "index_q_format"}



def _refused(argument: str, message: str) -> ks.SelectionError:
    """A ``SelectionError`` as the native functions raise it: ``message``,
    ``argument`` naming the argument at fault, no core ``variant``."""
    e = ks.SelectionError(message)
    e.argument, e.variant = argument, None
    return e

class DumpError(ValueError):
    """A dump that cannot be checked: the message names the key."""


class Dump(Dict[str, np.ndarray]):
    """A dump's arrays, key by key (uncompressed members memory-mapped), with
    the ``X_format`` pairs decoded: ``formats[X]`` is X's format and the
    ``X_format`` keys are gone. ``kind`` and ``source`` (the file name, or
    ``""``) say what it is."""

    kind: str
    source: str
    formats: Dict[str, str]

    def floats(self, key: str) -> Optional[np.ndarray]:
        """Array ``key`` as float32 (raw bits decoded exactly), or None."""
        if key not in self:
            return None
        return decode32(self[key], self.formats.get(key))


def decode32(a: np.ndarray, fmt: Optional[str]) -> np.ndarray:
    """Raw ``fmt`` bits (or a float array, when ``fmt`` is None) as float32,
    exactly: every bfloat16 / float16 / float8_e4m3fn value is a float32."""
    if fmt is None or a.dtype.kind == "f":
        with np.errstate(over="ignore"):
            return np.asarray(a, dtype=np.float32)
    if fmt == "bfloat16":
        return (np.asarray(a, dtype=np.uint32) << 16).view(np.float32)
    if fmt == "float16":
        return np.ascontiguousarray(a).view(np.float16).astype(np.float32)
    from kvselect.reference import _fp8_e4m3fn_table  # the exact decode of all 256 bytes

    return _fp8_e4m3fn_table().astype(np.float32)[np.asarray(a)]


def save_dump(path: Union[str, "os.PathLike[str]"], kind: str, **arrays: Any) -> None:
    """Write a dump of ``kind`` (any of :data:`KINDS`, see docs/dump-format.md),
    uncompressed (``np.savez``, so a reader memory-maps each array).
    ``ml_dtypes`` arrays (bfloat16, float8_e4m3fn) are stored as their raw bits
    with a ``<name>_format`` key; strings and numbers as 0-d arrays. The file
    is written beside ``path`` and renamed onto it, so a reader still mapping
    the old file keeps its bytes. A key not in the kind's table is refused
    before anything is written."""
    if kind not in KINDS:
        raise DumpError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    out: Dict[str, np.ndarray] = {"kind": np.asarray(kind)}
    for name, value in arrays.items():
        a = np.asarray(value)
        fmt = a.dtype.name
        if fmt in ("bfloat16", "float8_e4m3fn"):
            out[name] = np.ascontiguousarray(a).view(FORMATS[fmt])
            out[f"{name}_format"] = np.asarray(fmt)
        else:
            out[name] = a
    validate(dict(out), source=os.fspath(path))  # never write what the reader refuses
    target = os.fspath(path)
    tmp = f"{target}.tmp{os.getpid()}.npz"
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **cast(Dict[str, Any], out))  # NumPy's stub types **kwds as its flags
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


_NPY_MAGIC = b"\x93NUMPY"


def _member(path: str, zf: zipfile.ZipFile, info: zipfile.ZipInfo, key: str, where: str) -> np.ndarray:
    """One archive member: memory-mapped when stored uncompressed (its local
    header and .npy header parsed, so only the bytes used are ever read), read
    whole otherwise; an object array is refused, never unpickled."""
    fmt = np.lib.format
    if info.compress_type == zipfile.ZIP_STORED and not info.flag_bits & 0x1:
        with open(path, "rb") as f:
            f.seek(info.header_offset)
            local = f.read(30)
            if len(local) == 30 and local[:4] == b"PK\x03\x04":
                n, m = struct.unpack("<HH", local[26:30])
                start = info.header_offset + 30 + n + m
                f.seek(start)
                try:
                    version = fmt.read_magic(f)
                    reader = {(1, 0): fmt.read_array_header_1_0, (2, 0): fmt.read_array_header_2_0}
                    header = reader.get(version)
                    got = None if header is None else header(f)
                except ValueError as e:
                    raise DumpError(f"{where}: {key} is not a NumPy array ({e})") from None
                if got is not None:
                    shape, fortran, dtype = got
                    if dtype.hasobject:
                        raise DumpError(f"{where}: {key}: holds Python objects (an object array), "
                                        f"not numbers, which a dump never needs")
                    offset = f.tell()
                    size = int(np.prod(shape)) * dtype.itemsize
                    if shape and size and offset + size <= start + info.file_size:
                        return np.memmap(path, dtype=dtype, mode="r", offset=offset,
                                         shape=shape, order="F" if fortran else "C")
    try:
        with zf.open(info) as f:
            return fmt.read_array(f, allow_pickle=False)
    except ValueError as e:
        if "allow_pickle" in str(e) or "object" in str(e).lower():
            raise DumpError(f"{where}: {key}: holds Python objects (an object array), "
                            f"not numbers, which a dump never needs") from None
        raise DumpError(f"{where}: {key} cannot be read as an array ({e})") from None


def read_archive(path: Union[str, "os.PathLike[str]"]) -> Dict[str, np.ndarray]:
    """An ``.npz`` archive's arrays, by key, never unpickling anything:
    uncompressed members (``np.savez``) memory-mapped, compressed ones
    (``np.savez_compressed``) read whole."""
    path = os.fspath(path)
    where = os.path.basename(path)
    if not os.path.exists(path):
        raise DumpError(f"{path}: no such file")
    if not os.path.isfile(path):
        raise DumpError(f"{path}: not a file (a directory or a device), not an .npz archive")
    with open(path, "rb") as f:
        head = f.read(8)
    if head.startswith(_NPY_MAGIC):
        raise DumpError(f"{where}: not a NumPy .npz archive (it holds a single array, an .npy "
                        f"file; save the arrays with numpy.savez(path, name=array, ...))")
    if not head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        what = "it is empty" if not head else f"it starts with {head!r}, not a zip header"
        raise DumpError(f"{where}: not a NumPy .npz archive ({what}); an .npz is the zip file "
                        f"numpy.savez or numpy.savez_compressed writes")
    try:
        with zipfile.ZipFile(path) as zf:
            out: Dict[str, np.ndarray] = {}
            for info in zf.infolist():
                name = info.filename
                if not name.endswith(".npy"):
                    raise DumpError(f"{where}: member {name!r} is not an array (.npy); an .npz "
                                    f"holds arrays only")
                out[name[:-4]] = _member(path, zf, info, name[:-4], where)
            return out
    except (OSError, EOFError, zipfile.BadZipFile) as e:
        raise DumpError(f"{where}: not a NumPy .npz archive ({e}); an .npz is the zip file "
                        f"numpy.savez or numpy.savez_compressed writes") from None


def _closest(key: str, known: Any) -> Optional[str]:
    if key in _RENAMED and _RENAMED[key] in known:
        return _RENAMED[key]
    same_case = [k for k in known if k.lower() == key.lower()]
    if same_case:
        return same_case[0]
    near = difflib.get_close_matches(key, list(known), n=1, cutoff=0.5)
    return near[0] if near else None


def validate(arrays: Mapping[str, np.ndarray], *, source: str = "",
             expect: Optional[Tuple[str, ...]] = None) -> Dump:
    """The shared refusals of every dump, then its kind's table: the kind
    (absent with q, k and v present: a workload), the ``X_format`` pairs
    (decoded into ``Dump.formats``), no key outside the kind's table (the
    refusal names the closest known key), every required key present and
    every key of its dtype class. ``expect``: the kinds the reader takes."""
    where = os.path.basename(source) if source else "the dump"
    d = {k: v if isinstance(v, np.ndarray) else np.asarray(v) for k, v in arrays.items()}
    for k, v in d.items():
        if v.dtype.hasobject:
            raise DumpError(f"{where}: {k}: holds Python objects (an object array), not numbers, "
                            f"which a dump never needs")
    if "kind" in d:
        kind = _text(d, "kind")
    elif any(k in d for k in ("q", "k", "v")):
        kind = "workload"  # a plain np.savez(path, q=..., k=..., v=...)
    else:
        raise DumpError(f"{where}: no 'kind' key (one of {', '.join(KINDS)}; a file without one "
                        f"is a workload only when it has q, k and v)")
    if kind not in KINDS:
        raise DumpError(f"{where}: kind must be one of {', '.join(KINDS)}, got {kind!r}")
    assert kind is not None
    if expect is not None and kind not in expect:
        how = ("kvselect eval --workload" if kind == "workload" else "kvselect check")
        raise DumpError(f"{where}: a {kind} dump, not {' or '.join(expect)} ({how} reads it)")
    table = TABLES[kind]
    for k in sorted(d):  # np.savez of ml_dtypes arrays: raw void bytes
        a = d[k]
        if a.dtype.kind != "V" or a.dtype.names is not None:
            continue
        bits: Any = {1: np.uint8, 2: np.uint16}.get(a.dtype.itemsize)
        floaty = k in table and table[k][0] in ("float", "cache")
        if bits is not None and floaty and f"{k}_format" in d:
            d[k] = a.view(bits)  # the same bytes, as the raw bits the format names
            continue
        if bits is None or not floaty:
            raise DumpError(f"{where}: {k}: raw {a.dtype.str} bytes (a void array), which a dump "
                            f"never needs here")
        which = ('"bfloat16" or "float16", whichever it is' if bits is np.uint16
                 else '"float8_e4m3fn"')
        raise DumpError(f"{where}: {k}: raw {a.dtype.str} bytes, how np.savez stores an ml_dtypes array: "
                        f"add {k}_format={which} (the bytes alone do not say which; or save with "
                        f"kvselect.checking.save_dump, which writes the format)")
    formats: Dict[str, str] = {}
    for k in sorted(d):
        if not k.endswith("_format") or k in table:
            continue
        base = k[: -len("_format")]
        if base not in table:
            continue  # refused below as an unknown key
        if table[base][0] not in ("float", "cache"):
            raise DumpError(f"{where}: {k}: {base} holds {table[base][0].replace(' scalar', '')}s, "
                            f"not floats; only a float key has a format")
        if base not in d:
            raise DumpError(f"{where}: {k} is given but {base} is not")
        fmt = _text(d, k)
        if fmt not in FORMATS:
            raise DumpError(f"{where}: {k} must be one of {', '.join(FORMATS)}, got {fmt!r}")
        a = d[base]
        if fmt == "float16" and a.dtype == np.float16:
            pass  # a real float16 array: the format says nothing more
        elif a.dtype != FORMATS[fmt]:
            raise DumpError(f"{where}: {k} {fmt!r} needs {base} as its raw "
                            f"{np.dtype(FORMATS[fmt]).name} bits, got {a.dtype}")
        else:
            formats[base] = cast(str, fmt)
        del d[k]
    unknown = sorted(set(d) - set(table))
    if unknown:
        k = unknown[0]
        near = _closest(k, list(table) + [f"{x}_format" for x, t in table.items() if t[0] in ("float", "cache")])
        hint = f" (did you mean {near!r}?)" if near else ""
        raise DumpError(f"{where}: unknown key {k!r} in a {kind} dump{hint}; the known keys are "
                        f"{list(table)} (docs/dump-format.md): an unknown key is refused, never "
                        f"ignored")
    missing = [k for k, t in table.items() if t[2] == "required" and k not in d]
    if missing:
        raise DumpError(f"{where}: missing required key(s) {missing}; found {sorted(d)}")
    for k, a in d.items():
        cls = table[k][0]
        if cls == "cache" and k not in formats and a.dtype not in _FLOATS and a.dtype != np.uint8:
            raise DumpError(f"{where}: {k}: expected float pages, raw bits with {k}_format, or uint8 "
                            f"fp8_scaled pages, got {a.dtype}")
        if cls == "float" and k not in formats and a.dtype not in _FLOATS:
            raw = (f" (raw bfloat16 / float16 / float8_e4m3fn bits need {k}_format beside them)"
                   if a.dtype in (np.uint16, np.uint8) else "")
            raise DumpError(f"{where}: {k}: expected dtype float16, float32 or float64, got "
                            f"{a.dtype}{raw}")
        if cls == "int" and a.dtype.kind not in "iu":
            raise DumpError(f"{where}: {k}: expected an integer dtype (int32 or int64), got {a.dtype}")
        if cls == "int scalar" and (a.ndim != 0 or a.dtype.kind not in "iub"):
            raise DumpError(f"{where}: {k} must be one integer, got dtype {a.dtype} shape {a.shape}")
        if cls == "number" and a.dtype.kind not in "fiu":
            raise DumpError(f"{where}: {k}: expected a number, got dtype {a.dtype}")
        if cls == "str" and (a.ndim != 0 or a.dtype.kind not in "US"):
            raise DumpError(f"{where}: {k} must be a string, got dtype {a.dtype} shape {a.shape}")
    out = Dump(d)
    out.kind, out.source, out.formats = kind, source, formats
    return out


_FLOATS = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


_DTYPE_WORDS = {
    "float": "float16 / float32 / float64, or raw bits + `X_format`",
    "cache": "as float; uint8 for `fp8_scaled` pages",
    "int": "int32 / int64",
    "int scalar": "integer, 0-d",
    "number": "number, 0-d",
    "str": "string, 0-d",
}

_KIND_NOTES = {
    "topk": "A token top-k (the lightning indexer's, or any), checked by `kvselect check`. "
            "The exact scores are either given (`scores` + `context_lens`) or computed from "
            "the indexer's inputs (`index_q`, `weights`, `index_k`, `query_pos`).",
    "blocks": "MiniMax-M3 block selection, checked by `kvselect check`.",
    "witnesses": "An in-place `scatter_topology_witnesses_` call, checked by `kvselect check`.",
    "workload": "Q/K/V a selection policy is judged on, read by `kvselect eval --workload` "
                "(`kvselect.workloads.load_npz`; `python -m kvselect.dump_hf` writes one). "
                "A file without `kind` that has `q`, `k` and `v` is a workload (a plain "
                "`np.savez(path, q=..., k=..., v=...)`). `weights` makes the DSA form "
                "(DeepSeek-V3.2/V4, GLM-5): `index_q` is then `[layers, tokens, H, d_idx]` "
                "and `index_k` `[layers, tokens, d_idx]`.",
}


def dump_format_markdown() -> str:
    """docs/dump-format.md: the format's rules and one table per kind, made
    from :data:`TABLES` (a test keeps the file fresh)."""
    out = [
        "# The dump format",
        "",
        "<!-- Generated: python -c 'import kvselect.checking as c; print(c.dump_format_markdown(), "
        "end=\"\")' > docs/dump-format.md -->",
        "",
        "One format for every dump `kvselect check` and `kvselect eval` read: a NumPy `.npz` "
        "archive with a string `kind` and the keys of that kind, read by one loader "
        "(`kvselect.checking.load_dump`) with one set of refusals. "
        "`kvselect.checking.save_dump(path, kind, **arrays)` writes any kind.",
        "",
        "- **Names** are the API's: `index_q`, `index_k`, `weights`, `key_scale`, as "
        "`kvselect.indexer_topk` takes them.",
        "- **Unknown keys are refused**, never ignored: the message names the key and the "
        "closest known one (`index_k_scale` → `key_scale`, `index_weights` → `weights`, "
        "`key_format` → `index_k_format`).",
        "- **Low precision**: `.npz` cannot hold `ml_dtypes` arrays, so a bfloat16 or "
        "float8_e4m3fn tensor `X` is stored as its raw `uint16` / `uint8` bits with a string "
        "`X_format` beside it (`\"bfloat16\"`, `\"float16\"`, `\"float8_e4m3fn\"`); float16 may "
        "also be a real float16 array. From torch: `t.view(torch.uint16).numpy()`. Only a float "
        "key may have a format; raw `uint16` / `uint8` bits without one are refused.",
        "- **Reading one layer reads only its bytes**: uncompressed members (`np.savez`, what "
        "`save_dump` writes) are memory-mapped; compressed ones (`np.savez_compressed`) load, "
        "read whole.",
        "- **Never unpickled**: an object array is refused.",
        "- Index arrays may be int32 or int64; scalars (config, `topk`) are 0-d arrays, "
        "strings 0-d string arrays.",
        "- 3-D `rows` only ever mean `[n_queries, n_heads, width]` (a blocks dump's). A topk dump "
        "with decode context parallelism (`dcp_size`) has 2-D rows `[n_rows, dcp_size * topk]`, "
        "the ranks' rows side by side, as `kvselect.check_topk` takes them with "
        "`slots=GlobalSlots(dcp_size=...)`.",
        "",
        "`kvselect check` exits 2 (never 1, \"the engine is wrong\") for any dump it cannot "
        "check.",
    ]
    for kind, table in TABLES.items():
        out += ["", f"## kind = \"{kind}\"", "", _KIND_NOTES[kind], "",
                "| key | dtype | shape | required | meaning |", "|---|---|---|---|---|"]
        for key, (cls, shape, req, meaning) in table.items():
            shape_ = f"`{shape}`" if shape else "0-d"
            out.append(f"| `{key}` | {_DTYPE_WORDS[cls]} | {shape_} | {req} | {meaning} |")
    return "\n".join(out) + "\n"


def load_dump(path: Union[str, "os.PathLike[str]"],
              expect: Optional[Tuple[str, ...]] = None) -> Dump:
    """A dump, read and checked (:func:`read_archive`, then :func:`validate`):
    the one loader of ``kvselect check`` and ``kvselect eval``."""
    return validate(read_archive(path), source=os.fspath(path), expect=expect)


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
            raise DumpError(f"{name} is {a[at]}: the exact scores of a "
                            f"non-finite {key} are undefined, so the dump cannot be checked")


def _formats(d: Mapping[str, np.ndarray]) -> Dict[str, Any]:
    """The native functions' format arguments from the dump's formats."""
    f = getattr(d, "formats", {})
    return {"key_format": f.get("index_k"), "query_format": f.get("index_q")}


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


def _vacuous_rows(scores: np.ndarray, mags: Optional[np.ndarray], lens: np.ndarray, topk: int,
                  atol: float, rtol: float) -> np.ndarray:
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


def _vacuous(scores: np.ndarray, mags: Optional[np.ndarray], lens: np.ndarray, topk: int,
             atol: float, rtol: float) -> int:
    """How many rows no selection could fail at this tolerance (see
    :func:`_vacuous_rows`)."""
    return int(_vacuous_rows(scores, mags, lens, topk, atol, rtol).sum())


# The float32 unit roundoff, the float64 one, and the smallest subnormal
# float32's half (the absolute error of a rounding into the subnormal range).
_U32 = 2.0**-24
_U64 = 2.0**-53
_ETA32 = 2.0**-150


def _gamma(n: int) -> float:
    """Higham's ``γ_n = n u / (1 - n u)``, ``u = 2^-24``."""
    return n * _U32 / (1.0 - n * _U32)


def _up32(x: np.ndarray) -> np.ndarray:
    """``x`` (float64) as float32 rounded up: the least float32 ``>= x``."""
    y = np.asarray(x, dtype=np.float64).astype(np.float32)
    with np.errstate(invalid="ignore"):
        return np.where(y < x, np.nextafter(y, np.float32(np.inf)), y)


def _down32(x: np.ndarray) -> np.ndarray:
    """``x`` (float64) as float32 rounded down: the greatest float32 ``<= x``."""
    y = np.asarray(x, dtype=np.float64).astype(np.float32)
    with np.errstate(invalid="ignore"):
        return np.where(y > x, np.nextafter(y, np.float32(-np.inf)), y)


def _one_blas_thread() -> Any:
    """A context in which BLAS runs on one thread, if threadpoolctl is
    installed: the re-scoring's products are small ([H, d] by [d, a row's
    candidates]), and a threaded BLAS spends far longer waking its threads
    than computing them, worse on a busy machine (30x measured on 2 shared
    cores)."""
    try:
        from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]
    except ImportError:  # pragma: no cover - an optional speed-up
        import contextlib

        return contextlib.nullcontext()
    return threadpool_limits(1, user_api="blas")


def _key_bounds(keys: Any, ksc: Optional[np.ndarray], key_format: Optional[str]) -> np.ndarray:
    """``g_t = |c_t| max_i |k_ti|`` per key (float64, exact: the product of
    two values of at most 24 significant bits), the keys decoded a chunk at a
    time so a long sequence never decodes all of them at once. NaN for a NaN
    key or scale."""
    from kvselect import reference

    keys = np.asarray(keys)
    n = len(keys)
    d = int(np.prod(keys.shape[1:])) if keys.ndim > 1 else 1
    name = keys.dtype.name
    raw = {"uint16": 0x7FFF, "uint8": 0x7F}.get(name) if key_format in ("bfloat16", "float16",
                                                                        "float8_e4m3fn") else None
    sign_less = {"bfloat16": 0x7FFF, "float16": 0x7FFF, "float8_e4m3fn": 0x7F}.get(name, raw)
    if sign_less is not None and keys.dtype.isnative and n and d:
        # bfloat16 / float16 / fp8 e4m3fn: |x| rises with the bits below the
        # sign (NaN codes the highest), so the largest code is kmax's.
        bits = keys.view(np.uint16 if sign_less == 0x7FFF else np.uint8).reshape(n, d)
        code = (bits & sign_less).max(axis=1).view(keys.dtype)
        g = np.abs(reference.decode(code, key_format, "key_format"))
    elif name == "float32":
        g = np.abs(keys.reshape(n, d)).max(axis=1, initial=0.0).astype(np.float64)
    else:
        g = np.empty(n, dtype=np.float64)
        step = max(1, (16 << 20) // (8 * max(1, d)))
        for a in range(0, n, step):
            kd = reference.decode(keys[a : a + step], key_format, "key_format").reshape(-1, d)
            g[a : a + step] = np.abs(kd).max(axis=1, initial=0.0)
    if ksc is not None:
        g *= np.abs(np.asarray(ksc, dtype=np.float32).astype(np.float64))
    return g


def _indexer_check(rows: np.ndarray, index_q: Any, weights: Any, index_k: Any, query_pos: np.ndarray,
                   topk: Optional[int], key_scale: Any, key_format: Optional[str], query_format: Optional[str],
                   cu_seqlens: Optional[np.ndarray], seq_ids: Optional[np.ndarray], atol: float, rtol: float,
                   layout_of: Any, whole: Optional[ks.GlobalSlots] = None, filler: str = "-1") -> dict:
    """The body of :func:`check_indexer_topk` (and of a dump's indexer-input
    check): ``layout_of(rows)`` is the ``GlobalSlots`` of those rows, or
    None; ``whole``, a ``GlobalSlots`` of every row, checks the batch in one
    piece through it instead; ``filler`` is :func:`kvselect.check_topk`'s."""
    engine_rows = np.asarray(rows)
    if engine_rows.ndim != 2 or (engine_rows.dtype.kind not in "iu" and engine_rows.size):
        raise _refused("rows", f"rows must be 2-D integers [n_rows, width], got "
                                f"{engine_rows.dtype} {engine_rows.shape}")
    n = len(engine_rows)
    pos = np.asarray(query_pos).astype(np.int64).reshape(-1) if np.ndim(query_pos) else \
        np.array([int(query_pos)], dtype=np.int64)
    q_arr = np.asarray(index_q)
    if q_arr.ndim != 3 or len(q_arr) != n or len(pos) != n:
        raise _refused("rows", f"rows has {n} rows, index_q {q_arr.shape}, query_pos "
                                f"{len(pos)} entries: one each per row")
    k_arr = np.asarray(index_k)
    if cu_seqlens is None:
        cu, seq = np.array([0, len(k_arr)], dtype=np.int64), np.zeros(n, dtype=np.int64)
    else:
        if seq_ids is None:
            raise _refused("seq_ids", "cu_seqlens needs seq_ids: each row's sequence")
        cu = np.asarray(cu_seqlens).astype(np.int64).reshape(-1)
        seq = np.asarray(seq_ids).astype(np.int64).reshape(-1)
        if len(seq) != n:
            raise _refused("seq_ids", f"seq_ids has {len(seq)} entries for {n} rows")
        if len(cu) < 2 or cu[0] != 0 or np.any(np.diff(cu) < 0) or cu[-1] != len(k_arr):
            raise _refused("cu_seqlens", f"cu_seqlens must rise from 0 to the {len(k_arr)} keys")
        if len(seq) and (seq.min() < 0 or seq.max() >= len(cu) - 1):
            raise _refused("seq_ids", f"seq_ids must name one of the {len(cu) - 1} sequences")
    w32 = np.asarray(weights, dtype=np.float32)
    c32 = None if key_scale is None else np.asarray(key_scale, dtype=np.float32)
    if c32 is not None and c32.ndim == 0:
        c32 = np.full(len(k_arr), c32, dtype=np.float32)  # one per-tensor scale
    h, d = q_arr.shape[1], q_arr.shape[2]
    parts: List[Tuple[np.ndarray, dict]] = []
    vacuous = 0
    if whole is not None:  # one piece: every sequence's scores in one matrix
        t_max = int(np.diff(cu).max()) if n else 0
        full = np.full((n, t_max), np.nan)
        full_m = np.full((n, t_max), np.nan) if rtol else None
        full_lens = np.zeros(n, dtype=np.int64)
    for s in np.unique(seq):
        lo, hi = int(cu[s]), int(cu[s + 1])
        keys, ksc = k_arr[lo:hi], None if c32 is None else c32[lo:hi]
        absc = np.ones(1) if ksc is None else np.abs(ksc.astype(np.float64))
        g: Optional[np.ndarray] = None
        idx = np.flatnonzero(seq == s)
        step = len(idx) if whole is not None else \
            max(1, _CHUNK_BYTES // (26 * max(1, hi - lo) + 16 * max(1, h * d)))
        for c0 in range(0, len(idx), step):
            sub = idx[c0 : c0 + step]
            S = ks.indexer_scores(q_arr[sub], w32[sub], keys, pos[sub], key_scale=ksc, key_format=key_format,
                                  query_format=query_format)
            if g is None:  # once per sequence, after the native call has vetted the keys
                g = _key_bounds(keys, ksc, key_format)
            lens = np.minimum(pos[sub] + 1, hi - lo)
            layout = whole if whole is not None else layout_of(sub)
            rel = None if whole is None else whole.positions(engine_rows)[sub]
            idx_, real, exact, mags, vac = _rescore(
                S, g, engine_rows[sub], lens, topk, atol, rtol, layout,
                (q_arr[sub], w32[sub], keys, ksc, absc, h, d, query_format, key_format), rel, whole is not None)
            vacuous += int(vac.sum())
            if whole is not None:
                full[sub, : hi - lo], full_lens[sub] = exact, lens
                if full_m is not None and mags is not None:
                    full_m[sub, : hi - lo] = mags
                continue
            # The exactly wrong rows against their float64 scores; the rest,
            # exactly right, against equal scores (their structural faults).
            mine = sub[idx_[real]]
            if len(mine):
                parts.append((mine, ks.check_topk(
                    exact[real], engine_rows[mine], lens[idx_[real]], topk=topk, atol=atol, rtol=rtol,
                    magnitudes=None if mags is None else mags[real], slots=layout_of(mine), filler=filler)))
            right = np.ones(len(sub), dtype=bool)
            right[idx_[real]] = False
            if right.any():
                parts.append((sub[right], ks.check_topk(
                    np.zeros((int(right.sum()), hi - lo), np.float32), engine_rows[sub[right]],
                    lens[right], topk=topk, slots=layout_of(sub[right]), filler=filler)))
    if whole is not None:
        parts = [(np.arange(n), ks.check_topk(full, engine_rows, full_lens, topk=topk, atol=atol, rtol=rtol,
                                              magnitudes=full_m, slots=whole, filler=filler))]
    out = _merge(parts)
    out["rows"] = n
    out["correct"] = n - out["wrong"]
    out["vacuous"] = vacuous
    if not parts:
        out["by_reason"] = dict.fromkeys(("padding_hole", "duplicate", "not_causal", "not_in_table",
                                          "wrong_count", "wrong_selection"), 0)
    return out


def _topk_of(rows: np.ndarray, topk: Optional[int], layout: Any) -> int:
    if topk is not None:
        return int(topk)
    ranks = 1 if layout is None else int(getattr(layout, "dcp_size", 1) or 1)
    return rows.shape[1] // ranks


def _rescore(S: np.ndarray, g: np.ndarray, rows: np.ndarray, lens: np.ndarray, topk: Optional[int],
             atol: float, rtol: float, layout: Any, operands: tuple, rel: Optional[np.ndarray] = None,
             full: bool = False) -> Tuple[np.ndarray, np.ndarray, np.ndarray, Optional[np.ndarray], np.ndarray]:
    """The float64-exact check of a chunk of rows (see
    :func:`check_indexer_topk` for the rule and why it is exact): ``(idx,
    real, scores, magnitudes, vacuous)``. ``scores`` (and ``magnitudes``,
    ``None`` at ``rtol = 0``) are rows ``idx`` of the chunk in float64: ``S``
    (``M'``) with the exact values at the candidates; ``real[j]`` says row
    ``idx[j]`` is exactly wrong, the rows whose values check_topk must see
    (every other row is exactly right, so any equal scores give its report:
    only its structural faults); every row with ``full``. ``vacuous`` is per
    chunk row. ``S`` is the native float32 scores (modified: NaN past each
    row's length becomes ``-inf``), ``g`` the sequence's :func:`_key_bounds`.

    The screen is vectorised over the chunk, in float32 for the rows with
    finite operands: one pass for each row's largest unselected score, one
    comparison against a per-row threshold, then arithmetic on the few
    candidates it leaves. The candidates are re-scored and each row's exact
    verdict is computed from them; only the exactly wrong rows, those the
    bounds leave undecided as to vacuity, and those with a non-finite
    operand are screened again, one by one in float64."""
    from kvselect import reference

    q, w32, keys, ksc, absc, h, d, query_format, key_format = operands
    c, t = S.shape
    k = _topk_of(rows, topk, layout)
    if rel is None:
        rel = layout.positions(rows) if layout is not None else np.asarray(rows, dtype=np.int64)
    lens = np.asarray(lens, dtype=np.int64)
    vac = np.zeros(c, dtype=bool)
    f64 = np.float64
    if t == 0:
        idx0 = np.arange(c) if full else np.zeros(0, dtype=np.int64)
        return idx0, np.zeros(len(idx0), bool), np.zeros((len(idx0), 0)), \
            (np.zeros((len(idx0), 0)) if rtol else None), vac
    S = np.ascontiguousarray(S)  # (the native call's already is: no copy)
    for i in np.flatnonzero(lens < t):  # past the row's length: -inf, below every bound
        S[i, lens[i] :] = -np.inf
    qd = reference.decode(q, query_format, "query_format").reshape(c, h, d)
    w64 = w32.astype(f64)
    absw = np.abs(w64)
    absq = np.abs(qd)
    wq = np.einsum("ch,chd->cd", absw, absq)  # Σ_h |w_h| |q_hi|, per row
    # A_q = Σ_h |w_h| Σ_i |q_hi|, rounded up past its float64 roundings (at
    # most d + H + 3 of them, each relative 2^-53): M'_t = A_q g_t >= M_t.
    with np.errstate(invalid="ignore", over="ignore"):
        A = wq.sum(axis=1) * (1.0 + 4 * (d + h + 4) * _U64)
        gmax = float(np.max(g, initial=0.0))
        gam = _gamma(d + h + 2)
        eta = 2 * 8 * _ETA32 * (float(absc.max(initial=1.0)) * (d * absw.sum(axis=1) + h) + 1.0)
        # Δ: the underflow term plus room for the screen's own roundings (and
        # check_topk's float64 ones): a few of size at most (2 + rtol) max M'
        # + atol, each off by at most u of it.
        delta = eta + 16 * _U32 * ((2 + rtol) * A * gmax + atol)
        # Rows whose float32 scores cannot overflow (nor be NaN): finite operands.
        fin = np.isfinite(A) & np.isfinite(delta) & np.isfinite(gmax) & (2 * A * gmax + delta < 2.0**120)
    ok = (rel >= 0) & (rel < lens[:, None])
    sr = np.broadcast_to(np.arange(c)[:, None], rel.shape)[ok]
    st = rel[ok]  # the selected (row, position) pairs, row by row
    flat = sr * t + st
    sel = np.zeros((c, t), dtype=bool)
    sel.reshape(-1)[flat] = True
    n_sel = np.count_nonzero(sel, axis=1)  # distinct selected positions
    has_both = (n_sel > 0) & (lens > n_sel)
    go = has_both & fin
    Sf = S.reshape(-1)  # a view: S is C-contiguous (made so above)
    with np.errstate(invalid="ignore", over="ignore"):
        # Unselected b: exact s_b - e_b lies in [S_b - (2γ + rtol) M'_b - Δ -
        # atol, S_b + 2γ M'_b + Δ - atol]. One pass finds each row's largest
        # unselected S (the selected set to -inf meanwhile); every b that can
        # be the best unselected has S_b >= that - (4γ + rtol) A gmax - 2Δ
        # (a float32 threshold rounded down: an exact float32 comparison),
        # a superset refined below with each position's own M'_b.
        sv32 = Sf[flat]
        Sf[flat] = -np.inf
        smax = S.max(axis=1).astype(f64)
        coarse = _down32(np.where(go, smax - (4 * gam + rtol) * A * gmax - 2 * delta, np.inf))
        cr, ct = np.nonzero(S >= coarse[:, None])
        Sf[flat] = sv32
        Sc = Sf[cr * t + ct].astype(f64)
        Mc = A[cr] * g[ct]
        lo_c = Sc - (2 * gam + rtol) * Mc - delta[cr] - atol
        lo_max = np.full(c, -np.inf)  # the best unselected lower bound
        if len(cr):
            starts = np.flatnonzero(np.r_[True, cr[1:] != cr[:-1]])
            lo_max[cr[starts]] = np.maximum.reduceat(lo_c, starts)
        keep = Sc + 2 * gam * Mc + delta[cr] - atol >= lo_max[cr]
        cr, ct = cr[keep], ct[keep]
        # Selected a: s_a + e_a within [S - E + atol, S + E + atol + rtol M'].
        sv = sv32.astype(f64)
        Ms = A[sr] * g[st]
        Es = 2 * gam * Ms + delta[sr]
        lo_s = sv - Es + atol
        up_s = sv + Es + atol + rtol * Ms
        worst_up = np.full(c, np.inf)
        top = np.full(c, -np.inf)
        if len(sr):
            starts = np.flatnonzero(np.r_[True, sr[1:] != sr[:-1]])
            worst_up[sr[starts]] = np.minimum.reduceat(up_s, starts)
            top[sr[starts]] = np.maximum.reduceat(sv - Es - atol - rtol * Ms, starts)
        s_cand = go[sr] & (lo_s <= worst_up[sr])
        # Certainly not vacuous: some s - e (a selected one's, or the best
        # unselected's) above some s + e (the worst selected's).
        decided = (lens <= k) | (np.maximum(top, lo_max) > worst_up)
    slow = ~fin | ~decided
    pr_parts, pt_parts = [cr, sr[s_cand]], [ct, st[s_cand]]
    for i in np.flatnonzero(slow):
        ts = _screen_row(S[i, : int(lens[i])], g[: int(lens[i])], float(A[i]), float(delta[i]), gam,
                         rel[i][ok[i]], k, atol, rtol)
        pr_parts.append(np.full(len(ts), i, dtype=np.int64))
        pt_parts.append(ts)
    keys_ = np.asarray(keys)
    cs_all = None if ksc is None else np.asarray(ksc, dtype=np.float32).astype(f64)

    def rescore(pr_parts: List[np.ndarray], pt_parts: List[np.ndarray], done: Optional[np.ndarray] = None
                ) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Re-score the (row, position) pairs not ``done`` in float64 (every
        product of the decoded operands exact; one decode of their distinct
        keys): the pairs (``row * t + position``, row, position), their
        scores and magnitudes."""
        u = np.unique(np.concatenate([np.asarray(p, dtype=np.int64) * t + np.asarray(q_, dtype=np.int64)
                                      for p, q_ in zip(pr_parts, pt_parts)]))
        if done is not None:
            u = u[~np.isin(u, done)]
        pr, pt = u // t, u % t
        ut, inv = np.unique(pt, return_inverse=True)
        kd = reference.decode(keys_[ut], key_format, "key_format").reshape(len(ut), d)
        absk = np.abs(kd)
        ex, mg = np.empty(len(u)), np.empty(len(u))
        starts = np.flatnonzero(np.r_[True, pr[1:] != pr[:-1]]) if len(pr) else np.zeros(0, np.int64)
        ends = np.r_[starts[1:], len(pr)].astype(np.int64)
        with np.errstate(invalid="ignore", over="ignore"), _one_blas_thread():
            for a_, b_ in zip(starts, ends):
                i, j = int(pr[a_]), inv[a_:b_]
                ex[a_:b_] = w64[i] @ np.maximum(qd[i] @ kd[j].T, 0.0)
                mg[a_:b_] = absk[j] @ wq[i]  # Σ_i (Σ_h |w_h| |q_hi|) |k_ti|: no ReLU, so one vector
            if cs_all is not None:
                ex *= cs_all[pt]
                mg *= np.abs(cs_all[pt])
        return u, pr, pt, ex, mg

    done, pr, pt, ex, mg = rescore(pr_parts, pt_parts)
    # Each row's exact verdict, as check_topk computes it, from its
    # candidates (they hold its best unselected and worst selected).
    is_sel = sel.reshape(-1)[done]
    with np.errstate(invalid="ignore", over="ignore"):
        rel_e = rtol * np.abs(mg) if rtol else np.zeros(len(mg))
        e = atol + np.where(np.isnan(rel_e), 0.0, rel_e)
        best = np.full(c, -np.inf)
        np.maximum.at(best, pr[~is_sel], (ex - e)[~is_sel])
        worst = np.full(c, np.inf)
        np.minimum.at(worst, pr[is_sel], (ex + e)[is_sel])
    wrong = has_both & (~fin | ~(best <= worst))
    if wrong.any():  # the wrong rows' threshold and counts past the line
        pr_parts, pt_parts = [], []
        for i in np.flatnonzero(wrong):
            ts = _screen_row(S[i, : int(lens[i])], g[: int(lens[i])], float(A[i]), float(delta[i]), gam,
                             rel[i][ok[i]], k, atol, rtol, (float(best[i]), float(worst[i])))
            pr_parts.append(np.full(len(ts), i, dtype=np.int64))
            pt_parts.append(ts)
        more = rescore(pr_parts, pt_parts, done)
        pr, pt, ex, mg = (np.concatenate([x, y]) for x, y in zip((pr, pt, ex, mg), more[1:]))
    # The float64 scores (and magnitudes) of the rows whose values matter:
    # the wrong ones' (check_topk reports their line) and the vacuous test's
    # undecided ones; every row with ``full``.
    need = np.ones(c, dtype=bool) if full else (wrong | slow)
    idx = np.flatnonzero(need)
    at = np.full(c, -1)
    at[idx] = np.arange(len(idx))
    out = S[idx].astype(f64)
    mags = np.multiply.outer(A[idx], g) if rtol else None
    mine = need[pr]
    out[at[pr[mine]], pt[mine]] = ex[mine]
    if mags is not None:
        mags[at[pr[mine]], pt[mine]] = mg[mine]
    if slow.any():
        rs = at[np.flatnonzero(slow)]
        vac[slow] = _vacuous_rows(out[rs], None if mags is None else mags[rs], lens[slow], k, atol, rtol)
    return idx, (wrong if not full else need)[idx], out, mags, vac


def _screen_row(S: np.ndarray, g: np.ndarray, A: float, delta: float, gam: float, selected: np.ndarray,
                k: int, atol: float, rtol: float, line: Optional[Tuple[float, float]] = None) -> np.ndarray:
    """One row's candidates (positions), screened in float64 (``S`` and
    ``g`` the row's ``L`` positions'). Without ``line``: a row the chunk's
    screen left undecided as to vacuity, or with a non-finite score or
    operand: its best unselected and worst selected candidates and the
    vacuous test's extremes. With ``line`` (the exact best unselected ``s -
    e`` and worst selected ``s + e`` of a wrong row): the threshold band and
    the positions whose side of the line the bounds leave open."""
    L = len(S)
    s = S.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        M = A * g
        E = 2 * gam * M + delta
        bad = ~(np.isfinite(s) & np.isfinite(E) & np.isfinite(M))
        s, M = np.where(bad, 0.0, s), np.where(bad, 0.0, M)
        E = np.where(bad, np.inf, E)  # a non-finite score or bound: anything
        lo_m, up_m = s - E - atol - rtol * M, s + E - atol  # bounds of s - e
        lo_p, up_p = s - E + atol, s + E + atol + rtol * M  # bounds of s + e
    sel = np.zeros(L, dtype=bool)
    sel[selected] = True
    uns = ~sel
    cand = bad.copy()
    if line is not None:
        if bad.any():
            cand[:] = True
        else:
            best, worst = line
            want = min(k, L)
            theta = np.partition(s, L - want)[L - want]
            cand |= np.abs(s - theta) <= E + 2 * E.max()
            cand |= uns & (up_m >= worst) & (lo_m <= worst)
            cand |= sel & (up_p >= best) & (lo_p <= best)
        return np.flatnonzero(cand)
    if sel.any() and uns.any():
        cand |= uns & (up_m >= lo_m[uns].max())
        cand |= sel & (lo_p <= up_p[sel].min())
    if L > k:  # the vacuous test's extremes, unless the bounds decide it
        top_lo, bottom_up = lo_m.max(), up_p.min()
        if not (top_lo > bottom_up or up_m.max() <= lo_p.min()):
            cand |= (up_m >= top_lo) | (lo_p <= bottom_up)
    return np.flatnonzero(cand)


def check_indexer_topk(rows: Any, index_q: Any, weights: Any, index_k: Any, query_pos: Any,
                       topk: Optional[int] = None, *, key_scale: Any = None, key_format: Optional[str] = None,
                       query_format: Optional[str] = None, cu_seqlens: Any = None, seq_ids: Any = None,
                       precision: str = "float32", atol: Optional[float] = None, rtol: Optional[float] = None,
                       slots: Optional[ks.GlobalSlots] = None, filler: str = "-1", kv_cache: Any = None,
                       block_table: Any = None, seq_lens: Any = None, page_layout: str = "dense") -> dict:
    """Whether each engine row is a correct lightning-indexer top-k of the
    indexer's inputs, judged against scores **exact up to float64
    rounding**: the report of :func:`kvselect.check_topk` plus ``vacuous``
    (the rows no selection could fail at this tolerance).

    The arguments are :func:`kvselect.indexer_topk`'s (``rows`` the engine's
    output ``[n_rows, width]``, any order, ``-1`` padded; ``topk`` defaults
    to the width, a rank's width with DCP ``slots``); a packed batch as
    :func:`kvselect.indexer_topk_packed` takes it (``cu_seqlens``,
    ``seq_ids``; ``query_pos`` within the sequence, rows offsets from its
    start); a paged cache as :func:`kvselect.indexer_topk_paged` takes it
    (``kv_cache``, ``block_table``, ``seq_lens``, ``seq_ids``,
    ``page_layout``; ``index_k`` None), each sequence's pages read in their
    own format; ``slots`` a :class:`kvselect.GlobalSlots` when the rows are
    global slot ids (the whole batch is then checked in one piece);
    ``filler`` the engine's contract for short rows, as
    :func:`kvselect.check_topk` takes it.
    ``precision`` names the engine's coarsest rounding and sets the default
    ``rtol`` (:data:`DEFAULT_RTOL`; ``atol`` defaults to 0), as in a dump.
    With ``atol = rtol = 0`` a row passes iff it is right up to float64
    rounding. The operands are the values the native kernel reads (weights
    and key scales as float32, keys and queries decoded exactly).

    How: the native float32 scores ``S`` (:func:`kvselect.indexer_scores`,
    the one native pass) screen, with a cheap bound ``M'`` in place of the
    magnitudes; only the candidates are re-scored in float64 (their score
    and their magnitude), each row is decided from them, and
    :func:`kvselect.check_topk` sees float64 scores (exact at the
    candidates, ``S`` elsewhere) and magnitudes (exact at the candidates,
    ``M'`` elsewhere).

    - **The magnitude bound.** ``M'_t = |c_t| kmax_t A_q`` with ``kmax_t =
      max_i |k_ti|`` (the decoded keys, once per sequence, a chunk of keys at
      a time) and ``A_q = Σ_h |w_h| Σ_i |q_hi|``: each ``|q_hi k_ti| <=
      |q_hi| kmax_t``, so ``M'_t >= M_t = |c_t| Σ_h |w_h| Σ_i |q_hi
      k_ti|``. It is computed in float64: ``|c_t| kmax_t`` is exact (a
      product of two values of at most 24 significant bits), and ``A_q`` is
      multiplied by ``1 + 4 (d + H + 4) 2^-53``, more than its at most ``d +
      H + 3`` float64 roundings and the product's one can take off, so the
      computed ``M'_t`` is an upper bound.
    - **The score bound.** ``S_t = fl(c_t · Σ_h fl(w_h · relu(fl(q_h ·
      k_t))))`` in float32, in whatever order a kernel sums. With ``u =
      2^-24`` and ``γ_n = n u / (1 - n u)``: a dot of ``d`` terms in any
      order is off by at most ``γ_d Σ_i |q_hi k_ti|``; the ReLU is exact and
      1-Lipschitz; the product with ``w_h``, the sum over ``H`` heads (any
      order) and the product with ``c_t`` add ``H + 2`` roundings, so ``|S_t
      - s_t| <= γ_{d+H+2} M_t`` plus the absolute error of roundings into
      the subnormal range (at most ``2^-150`` each, scaled by what
      multiplies them later): ``η = 8 · 2^-150 (|c|max (d Σ_h |w_h| + H) +
      1)``, doubled. ``E_t = 2 γ_{d+H+2} M'_t + Δ`` bounds it, ``Δ = η + 16
      u ((2 + rtol) A_q max_t g_t + atol)`` (``g_t = |c_t| kmax_t``): room
      for the screen's and the check's own roundings, each at most ``u`` of
      a value below ``(2 + rtol) max M' + atol``. The screen compares float32
      scores with per-row thresholds computed in float64 and rounded down to
      float32, so its comparisons are exact.
    - **The tolerance, with only bounds.** ``e_t = atol + rtol m_t``, ``m_t``
      the exact magnitude, lies in ``[atol, atol + rtol M'_t]``; so an
      unselected ``b``'s exact ``s_b - e_b`` lies in ``[S_b - E_b - atol -
      rtol M'_b, S_b + E_b - atol]`` and a selected ``a``'s ``s_a + e_a`` in
      ``[S_a - E_a + atol, S_a + E_a + atol + rtol M'_a]``.
    - **The candidates.** The unselected whose upper end reaches the largest
      lower end over the unselected, and the selected whose lower end
      reaches the smallest upper end over the selected: they hold the best
      unselected and the worst selected, the row's verdict and margin. A row
      is vacuous iff ``max_t (s_t - e_t) <= min_t (s_t + e_t)`` over all its
      positions; unless the bounds decide it (some lower end of an ``s - e``
      above some upper end of an ``s + e``: not vacuous; every upper end of
      ``s - e`` at most every lower end of ``s + e``: vacuous), the positions
      that can be those extremes, by the same rule over all positions, join.
      On a row the re-scored candidates show wrong: every ``t`` with ``|S_t -
      θ32| <= E_t + 2 max E`` (``θ32`` the float32 ``min(topk, L)``-th best;
      the exact threshold is within ``max E`` of it), and every position
      whose side of the line its interval leaves open (an unselected ``b``
      whose ``s_b - e_b`` interval holds the exact worst ``s_a + e_a``, a
      selected ``a`` whose ``s_a + e_a`` interval holds the exact best ``s_b
      - e_b``). A non-finite score or operand is always re-scored (the whole
      row when it may be wrong). The candidates are re-scored in float64,
      where every product of float32 / bfloat16 / float16 / fp8 operands is
      exact: the score and ``|c_t| Σ_h |w_h| Σ_i |q_hi k_ti|``.
    - **Why the result is exact.** A non-candidate's value as the check
      sees it (``S_t``, and ``e_t`` from ``M'_t``) lies in the same interval
      as its exact one, and that interval lies strictly on the losing side of
      an extreme a candidate holds: so the best unselected ``s - e``, the
      worst selected ``s + e`` and the vacuous test's maximum and minimum are
      the exact scores' — the verdict, the margin and the vacuous count are
      exact. On a wrong row the threshold is exact (every position near it is
      exact, every other on the same side of it either way), and so are
      ``n_dropped`` and ``n_intruders`` (every position whose count the
      bounds leave open is exact). Not exact: the listed scores of
      non-candidates in ``dropped`` / ``intruders`` (their float32 values),
      and so their order, and which are listed when there are more than the
      list holds. A row the candidates show exactly right is checked against
      equal scores (only its structural faults can then be reported: its
      selection is right), so only the wrong rows' scores are held in float64.
    - **The cost.** One native pass (the float32 scores), one pass over the
      keys for ``kmax`` (once per sequence; for bfloat16 / float16 / fp8 keys
      the largest sign-less code, since ``|x|`` rises with those bits), a
      vectorised float32 screen (one pass for each row's largest unselected
      score, one comparison with a per-row threshold, refined with each
      candidate's own ``M'``), and a re-score of the candidates (some tens
      per row near its line; more on the wrong rows, which are screened
      again one by one).
    """
    p = _ALIASES.get(precision, precision)
    if p not in DEFAULT_RTOL:
        raise _refused("precision", f"precision must be one of {', '.join(DEFAULT_RTOL)}, "
                                f"got {precision!r}")
    atol_ = 0.0 if atol is None else float(atol)
    rtol_ = DEFAULT_RTOL[p] if rtol is None else float(rtol)
    for name, v in (("atol", atol_), ("rtol", rtol_)):
        if not (np.isfinite(v) and v >= 0):
            raise _refused(name, f"{name} = {v} must be finite and non-negative")
    if slots is not None and not isinstance(slots, ks.GlobalSlots):
        raise TypeError(f"slots must be a GlobalSlots or None, got {type(slots).__name__}")
    _vet_api(rows, index_q, weights, index_k, query_pos, topk, key_scale, key_format, query_format,
             cu_seqlens, seq_ids, kv_cache, block_table, seq_lens, page_layout, filler)
    if kv_cache is not None:  # each sequence's pages, read into a packed batch's keys
        index_k, key_scale, cu_seqlens, key_format = _api_paged_keys(
            index_k, key_scale, cu_seqlens, kv_cache, block_table, seq_lens, seq_ids, page_layout, key_format)
    elif index_k is None:
        raise _refused("index_k", "index_k is None: pass the keys, or kv_cache= (with block_table=, "
                                "seq_lens=, seq_ids=) for a paged cache")
    return _indexer_check(rows, index_q, weights, index_k, query_pos, topk, key_scale, key_format,
                          query_format, cu_seqlens, seq_ids, atol_, rtol_, lambda rows_: None, slots,
                          filler=filler)


def _non_finite(name: str, a: np.ndarray) -> None:
    """Refuses a non-finite entry of operand ``name`` (float32 values),
    naming its index, as a dump's check does."""
    bad = ~np.isfinite(a)
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        raise _refused(name, f"{name}[{', '.join(map(str, at))}] is {a[at]}: the exact scores of a "
                             f"non-finite {name} are undefined, so the rows cannot be checked")


def _integers(name: str, a: Any) -> None:
    """An index argument holds integers (a float position is a TypeError,
    as the native functions raise it: never truncated)."""
    if isinstance(a, bool) or not isinstance(a, (int, np.integer)) and np.asarray(a).dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got {np.asarray(a).dtype}")


def _vet_api(rows: Any, index_q: Any, weights: Any, index_k: Any, query_pos: Any, topk: Any, key_scale: Any,
             key_format: Optional[str], query_format: Optional[str], cu_seqlens: Any, seq_ids: Any,
             kv_cache: Any, block_table: Any, seq_lens: Any, page_layout: str, filler: str) -> None:
    """:func:`check_indexer_topk`'s arguments judged before any work, each
    refusal naming the argument as the native functions do: shapes against
    ``rows`` and the keys, integer index arrays, finite operands (the exact
    score of a non-finite one is undefined), ``topk`` and ``filler``."""
    if filler not in FILLERS:
        raise _refused("filler", f"filler must be one of {', '.join(map(repr, FILLERS))}, got {filler!r}")
    if topk is not None:
        if isinstance(topk, bool) or not isinstance(topk, (int, np.integer)):
            raise TypeError(f"topk must be an integer, got {type(topk).__name__}")
        if topk < 1:
            raise _refused("topk", f"topk must be at least 1, got {topk}")
    if kv_cache is None:
        for name, v in (("block_table", block_table), ("seq_lens", seq_lens)):
            if v is not None:
                raise _refused(name, f"{name} without kv_cache: a paged cache is kv_cache with block_table, "
                                     f"seq_lens and seq_ids")
        if page_layout != "dense":
            raise _refused("page_layout", f"page_layout={page_layout!r} without kv_cache")
        if seq_ids is not None and cu_seqlens is None:
            raise _refused("seq_ids", "seq_ids without cu_seqlens: a packed batch is cu_seqlens with seq_ids")
    _integers("query_pos", query_pos)
    for name, v in (("seq_ids", seq_ids), ("cu_seqlens", cu_seqlens)):
        if v is not None:
            _integers(name, v)
    n = len(np.asarray(rows)) if np.ndim(rows) else 0
    q = np.asarray(index_q)
    if q.ndim == 3:
        h = q.shape[1]
        if np.shape(weights) != (n, h):
            raise _refused("weights", f"weights must be [n_queries={n}, H={h}], got {list(np.shape(weights))}")
        _non_finite("index_q", decode32(q, query_format) if q.dtype.kind in "fV" or query_format else q)
    _non_finite("weights", np.asarray(weights, dtype=np.float32))
    if index_k is not None:
        k = np.asarray(index_k)
        if key_scale is not None and np.ndim(key_scale) != 0 and np.shape(key_scale) != (len(k),):
            raise _refused("key_scale", f"key_scale must be [n_keys={len(k)}] or one number, got "
                                        f"{list(np.shape(key_scale))}")
        step = max(1, (16 << 20) // max(1, k[:1].size * 4))
        for t0 in range(0, len(k), step):  # decoded a chunk at a time
            part = decode32(k[t0 : t0 + step], key_format)
            bad = ~np.isfinite(part)
            if bad.any():
                t, i = (int(x) for x in np.argwhere(bad)[0][:2])
                raise _refused("index_k", f"index_k[{t0 + t}, {i}] is {part[t, i]}: the exact scores of a "
                                          f"non-finite index_k are undefined, so the rows cannot be checked")
    if key_scale is not None:
        _non_finite("key_scale", np.atleast_1d(np.asarray(key_scale, dtype=np.float32)))


def _api_paged_keys(index_k: Any, key_scale: Any, cu_seqlens: Any, kv_cache: Any, block_table: Any,
                    seq_lens: Any, seq_ids: Any, page_layout: str, key_format: Optional[str]) -> tuple:
    """:func:`check_indexer_topk`'s paged form: the pages read as a dump's
    (:func:`_paged_keys`), refusals as the API's (``SelectionError`` naming
    the argument)."""
    for name, v in (("index_k", index_k), ("key_scale", key_scale), ("cu_seqlens", cu_seqlens)):
        if v is not None:
            raise _refused(name, f"{name} beside kv_cache: the keys are either packed (index_k, "
                                    f"cu_seqlens, key_scale) or paged (kv_cache, block_table, seq_lens)")
    for name, v in (("block_table", block_table), ("seq_lens", seq_lens), ("seq_ids", seq_ids)):
        if v is None:
            raise _refused(name, f"kv_cache needs {name}, as indexer_topk_paged takes it")
    cache = np.asarray(kv_cache)
    raw = {"bfloat16": np.uint16, "float8_e4m3fn": np.uint8}.get(cache.dtype.name)
    d = Dump({"kv_cache": cache.view(raw) if raw is not None else cache,
              "block_table": np.asarray(block_table), "seq_lens": np.asarray(seq_lens),
              "seq_ids": np.asarray(seq_ids), "page_layout": np.array(page_layout)})
    fmt = cache.dtype.name if raw is not None else key_format
    d.kind, d.source, d.formats = "topk", "", ({} if fmt is None else {"kv_cache": fmt})
    try:
        return _paged_keys(d)
    except DumpError as e:  # named by the argument its message starts with
        first = re.match(r"(\w+)", str(e))
        name = first.group(1) if first else "kv_cache"
        name = {"kv_cache_format": "key_format"}.get(name, name)
        known = ("kv_cache", "block_table", "seq_lens", "seq_ids", "page_layout", "key_format")
        raise _refused(name if name in known else "kv_cache", str(e).replace("a paged dump", "a paged cache")) from e


def _paged_keys(d: Mapping[str, np.ndarray]) -> Tuple[np.ndarray, Optional[np.ndarray], np.ndarray,
                                                     Optional[str]]:
    """A paged dump's keys as a packed batch: ``(index_k, key_scale,
    cu_seqlens, key_format)``, each sequence's first ``seq_lens[s]`` keys
    read from the pages its ``block_table`` row names (as
    :func:`kvselect.indexer_topk_paged` reads them), in the cache's own
    format: raw bits stay raw bits with their format; ``fp8_scaled`` pages
    give their e4m3fn bytes and float32 scales."""
    ambiguous = [k for k in ("index_k", "cu_seqlens", "key_scale") if k in d]
    if ambiguous:
        raise DumpError(f"{ambiguous[0]} beside kv_cache: the keys are either packed (index_k, "
                        f"cu_seqlens, key_scale) or paged (kv_cache, block_table, seq_lens), not both")
    if "req_ids" not in d:
        stray = [k for k in ("block_size", "block_stride_rows", "prefill_req_ids", "workspace_starts",
                             "dcp_size", "dcp_interleave") if k in d]
        if stray:
            raise DumpError(f"{stray[0]} in a paged dump without req_ids is ambiguous: the page size is "
                            f"kv_cache's axis 1 and rows are positions within their sequence; add "
                            f"req_ids (= seq_ids) if the rows are global slot ids through block_table")
    else:
        if _int(d, "dcp_size", 1) > 1:
            raise DumpError("dcp_size in a paged dump: a paged cache has one block table, DCP one per "
                            "rank; dump the ranks' rows with index_k (or scores) instead")
        if not np.array_equal(_ints(d, "req_ids"), _ints(d, "seq_ids")):
            raise DumpError("req_ids must equal seq_ids in a paged dump: the indexer's cache and the "
                            "attention share one block table, whose row s is sequence s")
        if "block_size" in d and _int(d, "block_size") != d["kv_cache"].shape[1]:
            raise DumpError(f"block_size {_int(d, 'block_size')} is not kv_cache's page size "
                            f"{d['kv_cache'].shape[1]}: the paged dump's one block table has one page size")
    _need(d, "block_table", "seq_lens", "seq_ids")
    layout = _text(d, "page_layout", "dense")
    cache = d["kv_cache"]
    fmt = getattr(d, "formats", {}).get("kv_cache")
    table = np.asarray(d["block_table"])
    lens = _ints(d, "seq_lens")
    if table.ndim != 2 or table.dtype.kind not in "iu" or len(table) != len(lens):
        raise DumpError(f"block_table must be integer [n_seqs={len(lens)}, max_blocks] in a paged dump, "
                        f"got {table.dtype} {table.shape}")
    if layout == "fp8_scaled":
        if cache.dtype != np.uint8 or cache.ndim not in (3, 4) or (cache.ndim == 4 and cache.shape[2] != 1):
            raise DumpError(f"kv_cache: fp8_scaled pages are uint8 [num_blocks, block_size, (1,) d + 4], "
                            f"got {cache.dtype} {cache.shape}")
        if fmt is not None:
            raise DumpError("kv_cache_format with page_layout fp8_scaled: the pages' layout says their "
                            "format (e4m3fn bytes, then float32 scales)")
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
            raise DumpError(f"kv_cache: raw {cache.dtype} pages need kv_cache_format, or "
                            f"page_layout=\"fp8_scaled\" for vLLM's DSA pages")
        keys, scales, bs = cache, None, cache.shape[1]
    else:
        raise DumpError(f"page_layout must be \"dense\" or \"fp8_scaled\", got {layout!r}")
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
        raise DumpError(f"kv_cache: key {t}'s fp8_scaled scale is {c[t]}: the exact scores of a "
                        f"non-finite scale are undefined, so the dump cannot be checked")
    bad = ~np.isfinite(decode32(k, fmt))
    if bad.any():
        t, i = (int(x) for x in np.argwhere(bad)[0])
        raise DumpError(f"kv_cache: key {t} (in its sequence's pages, packed) element {i} is not finite: "
                        f"the exact scores of a non-finite key are undefined, so the dump cannot be checked")
    return np.ascontiguousarray(k), c, np.concatenate([[0], np.cumsum(lens)]).astype(np.int64), fmt


def _check_topk(d: Mapping[str, np.ndarray], atol: float, rtol: float,
                filler: str = "-1") -> List[Tuple[str, dict]]:
    _need(d, "rows")
    engine_rows = d["rows"]
    if engine_rows.dtype.kind not in "iu":
        raise DumpError(f"rows must hold integers (int32 or int64), got {engine_rows.dtype}")
    ranks = _int(d, "dcp_size", 1)
    if engine_rows.ndim == 3 and ranks > 1:
        raise DumpError(f"rows: a DCP dump's rows are the ranks' rows side by side, 2-D [n_rows, "
                        f"dcp_size * topk] (what check_topk takes with slots=GlobalSlots(dcp_size="
                        f"{ranks})), got 3-D {engine_rows.shape}: write "
                        f"np.concatenate(list(rows), axis=1) (3-D rows only ever mean [n_queries, "
                        f"n_heads, width], a blocks dump's)")
    if engine_rows.ndim != 2:
        raise DumpError(f"rows must be [n_rows, {'dcp_size * ' if ranks > 1 else ''}topk], got "
                        f"shape {engine_rows.shape}")
    width = engine_rows.shape[1]
    if ranks > 1:
        if width % ranks:
            raise DumpError(f"rows: a DCP dump's rows are [n_rows, dcp_size * topk], the "
                            f"dcp_size = {ranks} ranks' rows side by side, got width {width}, "
                            f"not a multiple of {ranks}")
        width //= ranks
    n = len(engine_rows)
    topk = _int(d, "topk", width)
    _same_rows(n, d, "scores", "context_lens", "magnitudes", "engine_scores", "index_q", "weights",
               "query_pos", "seq_ids", "req_ids", "prefill_req_ids")
    fmt: Dict[str, Any] = _formats(d)
    parts: List[Tuple[np.ndarray, dict]] = []
    vacuous = 0
    if "scores" in d:
        _need(d, "context_lens")
        scores, mags = _given(d, "scores"), _given(d, "magnitudes")
        assert scores is not None
        if rtol != 0 and mags is None:
            raise DumpError("rtol > 0 needs each score's magnitude: add 'magnitudes' to the "
                            "dump, pass --rtol 0 (and an --atol), or dump the indexer's inputs")
        lens = _ints(d, "context_lens")
        if "kv_cache" in d:
            raise DumpError("kv_cache beside scores: the exact scores are either given or computed "
                            "from the indexer's inputs, not both")
        parts.append((np.arange(n), ks.check_topk(
            scores, engine_rows, lens, topk=topk, atol=atol, rtol=rtol,
            magnitudes=mags, slots=_layout(d, np.arange(n)), filler=filler)))
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
        report = _indexer_check(
            engine_rows, q, _floats(d, "weights"), k, pos, topk, scale, key_format, fmt["query_format"],
            cu, seq, atol, rtol, lambda rows: _layout(d, rows), filler=filler)
        parts.append((np.arange(n), report))
        vacuous = report["vacuous"]
        lens = np.minimum(pos + 1, len(k) if cu is None else np.diff(cu)[seq])
    exact = _merge(parts)
    exact["vacuous"] = vacuous
    checks = [("against the exact scores", exact)]
    engine_scores = _given(d, "engine_scores")
    if engine_scores is not None:
        own = ks.check_topk(engine_scores, engine_rows, lens, topk=topk,
                            slots=_layout(d, np.arange(n)), filler=filler)
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
    fmt = _formats(d)
    _finite(d, "index_q", "index_k")
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


FILLERS = ("-1", "past_context", "repeat")
"""The ``filler`` rules of a topk dump (:func:`kvselect.check_topk`'s ``filler=``)."""


def check_dump(dump: Any, *, atol: Optional[float] = None, rtol: Optional[float] = None,
               filler: Optional[str] = None) -> dict:
    """Check a dump (a path, or the dict :func:`load_dump` returns): a dict
    with its ``kind``, the ``tolerance`` used, the ``filler`` rule (topk
    dumps: ``filler`` overrides the dump's) and one entry per check in
    ``checks`` (``name`` and the checker's ``report``); ``wrong`` is the
    number of rows some check found wrong."""
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
        note = ("the dump's scores carry no magnitudes, so no relative tolerance applies "
                "(rtol 0): add 'magnitudes', or dump the indexer's inputs")
    try:
        if kind == "topk":
            checks = _check_topk(d, atol_, rtol_, fill)
        elif kind == "blocks":
            checks = _check_blocks(d, atol_, rtol_)
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
_DUMP_TERMS = {"key_format": "index_k_format", "query_format": "index_q_format"}


def _in_dump_terms(message: str) -> str:
    """A native refusal's message with its argument names the dump's keys."""
    for api, key in _DUMP_TERMS.items():
        message = re.sub(rf"\b{api}\b", key, message)
    return message


def _digits(x: Any) -> str:
    """A score with every digit it needs to be told apart from any other:
    the shortest repr that round-trips, float32's when the value is a
    float32 (``1.0000001``, not ``1``)."""
    x = float(x)
    if not np.isfinite(x):
        return repr(x)
    with np.errstate(over="ignore"):
        f = np.float32(x)
    return str(f) if float(f) == x else repr(x)


def _describe(p: dict, filler: Optional[str] = None) -> str:
    """One problem in a sentence; ``filler`` (a topk check's rule) adds the
    rule that would take the entries as the engine's filler, when one would."""
    r = p["reason"]
    if r == "not_causal" and "n_slots" in p:
        holds = f"slot {p['slot']} holds {p['value'] if 'value' in p else p['position']}"
        if "value" in p:
            holds += f" (position {p['position']})"
        n = p["n_slots"]
        text = (f"not causal: {n} {'entry' if n == 1 else 'entries'} at or past the context "
                f"{p['context']} (first: {holds})")
        if filler is not None and filler != "past_context":
            text += ' — if that is the engine\'s filler, check with filler="past_context" (--filler past_context)'
        return text
    if r == "duplicate" and "n_slots" in p:
        n = p["n_slots"]
        text = (f"duplicate: {n} {'entry repeats' if n == 1 else 'entries repeat'} an earlier one "
                f"(first: slot {p['slot']} repeats position {p['position']} of slot {p['first']})")
        if filler is not None and filler != "repeat":
            text += ' — if that is the engine\'s filler, check with filler="repeat" (--filler repeat)'
        return text
    if r == "wrong_selection":
        def few(pairs):
            return ", ".join(f"{t} ({_digits(s)})" for t, s in pairs)
        return (f"wrong selection: dropped {p['n_dropped']} [{few(p['dropped'])}], "
                f"intruders {p['n_intruders']} [{few(p['intruders'])}]; "
                f"threshold {_digits(p['threshold'])}, margin {p['margin']:.3g}")
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
    fill = result.get("filler")
    fill_text = f", filler {fill!r}" if fill not in (None, "-1") else ""
    lines = [f"kvselect check{' ' + source if source else ''}: {result['kind']}, "
             f"{result['rows']} rows, {tol}{fill_text}"]
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
                lines.append(f"  {where if i == 0 else ' ' * len(where)}: "
                             f"{_describe(p, result.get('filler'))}")
        if len(details) > show:
            lines.append(f"  ... and {len(details) - show} more (--show N, or --json FILE)")
    for c in result["checks"]:
        v = c["report"].get("vacuous", 0)
        if not v:
            continue
        exact = t["atol"] == 0 and t["rtol"] == 0 or "own scores" in c["name"]
        if exact:  # no tolerance: every score of those rows is the same number
            lines += ["", f"warning: {v} of {c['report']['rows']} rows {c['name']} are vacuous — every "
                          f"position of such a row has the same score, so any selection of the right "
                          f"size is correct there: to test them, dump a case whose scores differ "
                          f"(distinct keys, or distinct queries)"]
        else:
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
    from kvselect.cli import _check_output  # the CLI's one output check

    def fail(message: str) -> int:
        print(f"kvselect check: {message}", file=sys.stderr)
        return 2

    to_file = args.json is not None and args.json != "-"
    if to_file:  # refused before the check runs, as eval does
        problem = _check_output("--json", args.json)
        if problem:
            return fail(problem)
        if os.path.exists(args.json) and os.path.exists(args.dump) and os.path.samefile(args.json, args.dump):
            return fail(f"--json {args.json!r} is the dump itself: give another file name")
    try:
        result = check_dump(args.dump, atol=args.atol, rtol=args.rtol, filler=args.filler)
    except DumpError as e:
        return fail(str(e))
    if args.json == "-":
        json.dump(_strict(result), sys.stdout, indent=2, allow_nan=False)
        print()
    else:
        if to_file:
            try:
                with open(args.json, "w") as f:
                    json.dump(_strict(result), f, indent=2, allow_nan=False)
                    f.write("\n")
            except OSError as e:
                return fail(f"--json {args.json!r}: {e}")
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
        "The dump format: docs/dump-format.md, or python -c 'import kvselect.checking as c; "
        "help(c)'. A dump that cannot be checked (an unknown key, a non-finite operand) exits "
        "2, never 1.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("dump", help="the .npz dump (the format: docs/dump-format.md, or kvselect.checking.dump_format_markdown())")
    p.add_argument("--rtol", type=_non_negative_float, default=None,
                   help="relative tolerance (default: by the dump's precision: "
                   + ", ".join(f"{k} {v:.3g}" for k, v in DEFAULT_RTOL.items()) + ")")
    p.add_argument("--atol", type=_non_negative_float, default=None,
                   help="absolute tolerance (default 0)")
    p.add_argument("--show", type=int, default=5, help="wrong rows shown in detail per check")
    p.add_argument("--json", metavar="FILE", default=None,
                   help="also write the full report as JSON to FILE (the text report is still "
                   "printed); '-' prints the JSON to stdout instead of the text")
    p.add_argument("--filler", choices=FILLERS, default=None,
                   help="how the engine fills a row that sees fewer than topk positions (overrides "
                   "the dump's filler; default \"-1\"): \"past_context\" ignores entries at or past "
                   "the context, \"repeat\" ignores repeats of an earlier entry")
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
