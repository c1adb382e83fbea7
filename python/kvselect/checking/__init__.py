"""``kvselect check``: is an engine's selection right?

The checkers (:func:`kvselect.check_topk`, :func:`kvselect.check_blocks`,
:func:`kvselect.check_witnesses`) applied to a dump of one kernel call: the
tensors an engine author saves around it — inputs, output, lengths, config.
:func:`check_dump` runs the right checker and :func:`format_report` prints
what it found; ``kvselect check DUMP.npz`` does both, exits 1 when any row
is wrong (so it can gate a kernel's CI) and 2 when the dump cannot be read
or checked — "cannot check" is never reported as "the engine is wrong".
Every checker returns one report type, :class:`Report` (a ``dict``: the
same core keys on every path; its JSON schema is docs/report-schema.md).

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

``kind = "sparse_attention"`` — one sparse attention / sparse MLA call
(:func:`check_sparse_attention`, docs/checking-sparse-attention.md): its
inputs (``q``, ``k``, ``v`` or MLA's ``d_v``, ``indices``), outputs
(``out``, ``lse``), the engine's conventions (a ``preset``, or each by
name) and its arithmetic ``model``; checked against exact float64
attention within the model's bound.

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
- the engine's own scores (``engine_scores``): exactly, as given; and, with the
  indexer's inputs on dense or packed keys, those scores against the exact ones
  under the tolerance (reason ``score_off``). The report counts
the rows the tolerance makes **vacuous** — every position's interval meets
every other's, so no selection could fail — and warns when there are any:
such a check proves nothing about those rows.
"""

from typing import Dict, Mapping, Tuple

from kvselect.checking._common import DEFAULT_RTOL, FILLERS, Dump, DumpError, decode32
from kvselect.checking.attention import check_sparse_attention
from kvselect.checking.dump_check import check_dump
from kvselect.checking.dumps import (
    FORMATS,
    dump_format_markdown,
    load_dump,
    read_archive,
    save_dump,
    validate,
)
from kvselect.checking.exact import check_indexer_topk
from kvselect.checking.example import example_path, make_example
from kvselect.checking.family import check_indexer_family
from kvselect.checking.report import Report, format_report, strict_json
from kvselect.checking.v4 import check_v4_combined_indices

# Derived from the rules' registry on first use (module __getattr__, below).
KINDS: Tuple[str, ...]
CHECK_KINDS: Tuple[str, ...]
TABLES: Dict[str, Mapping[str, Tuple[str, str, str, str]]]

__all__ = [
    "Report",
    "check_v4_combined_indices",
    "DEFAULT_RTOL",
    "FILLERS",
    "KINDS",
    "CHECK_KINDS",
    "FORMATS",
    "TABLES",
    "DumpError",
    "Dump",
    "decode32",
    "save_dump",
    "read_archive",
    "validate",
    "dump_format_markdown",
    "load_dump",
    "check_indexer_family",
    "check_indexer_topk",
    "check_sparse_attention",
    "check_dump",
    "format_report",
    "strict_json",
    "make_example",
    "example_path",
]


def __getattr__(name: str) -> object:
    # The kinds and their tables come from the rules' registry, on first use
    # (kvselect.checking.dumps says why).
    if name in ("KINDS", "CHECK_KINDS", "TABLES"):
        from kvselect.checking import dumps

        return getattr(dumps, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
