"""Workloads: the query/key/value tensors a selection policy is judged on.

A :class:`Workload` is one causal, decode-style evaluation problem: per head,
the queries, keys and values of a context of ``tokens`` positions, the
positions of the queries to evaluate (a query at position ``i`` sees keys
``0..=i``), and an *approximate* indexer (``index_q`` / ``index_k``, one index
head per KV head) from which a learned top-k is drawn. Every policy is
compared at an identical token budget on the same workload, so the workload
fixes everything but the policy.

Three sources:

- :func:`synthetic`: a deterministic long-context workload with the head
  types real models show (attention sinks, local heads, retrieval heads whose
  needles sit far back, diffuse heads), generated in a second or two for the
  32K-token default, no download.
- :func:`example`: real Q/K/V of a trained transformer (all-MiniLM-L6-v2 on
  the GPL-2 licence text), shipped with the package (``kvselect/data``).
- :func:`load_npz`: your own dumps (see :mod:`kvselect.dump_hf` for a
  Hugging Face model), in the format below.

The ``.npz`` format read by :func:`load_npz`
--------------------------------------------

The one dump format of ``kvselect check`` and ``kvselect eval``
(``docs/dump-format.md`` tables every kind's keys; :mod:`kvselect.checking`
holds the loader), of the kind ``"workload"``: a NumPy ``.npz`` archive
(``np.savez``, or :func:`kvselect.checking.save_dump` ``(path,
"workload", ...)``, whose uncompressed members are memory-mapped, so only the
layers used are read; ``np.savez_compressed`` archives load too, read whole)
with ``kind = "workload"`` — or no ``kind`` at all when ``q``, ``k`` and
``v`` are present (a plain ``np.savez(path, q=..., k=..., v=...)`` is a
workload) — and:

- ``q``: ``[layers, n_heads, tokens, d]`` (required): the query heads;
- ``k``: ``[layers, n_kv_heads, tokens, d]`` (required);
- ``v``: ``[layers, n_kv_heads, tokens, d_v]`` (required);
- ``index_q``, ``index_k``: ``[layers, n_kv_heads, tokens, d_idx]``
  (optional, both or neither): your indexer's query and key, one index head
  per KV head (MiniMax-M3's form; the learned top-k ranks by ``index_q ·
  index_k`` and block selection scores it);
- or the **DSA form** (DeepSeek-V3.2/V4, GLM-5's lightning indexer), told
  apart by ``weights``: ``index_q`` ``[layers, tokens, H, d_idx]``
  (``H`` index heads per token), ``weights`` ``[layers, tokens, H]``
  (the per-query head weights, softmax scale and ``H^-1/2`` folded in, as
  the model computes them), ``index_k`` ``[layers, tokens, d_idx]`` (one
  index key per token, shared by the index heads), and optionally
  ``key_scale`` ``[layers, tokens]`` (the fp8 cache's per-key scale,
  with ``index_k`` its dequantised-by-``1/scale`` values; raw fp8 bits with
  ``index_k_format = "float8_e4m3fn"``). The names are
  :func:`kvselect.indexer_topk`'s. The learned
  top-k is then :func:`kvselect.indexer_topk` of it — one row per query,
  shared by every KV head of the layer, as DSA shares it — and block
  selection scores the derived indexer (:func:`derive_indexer`);
- ``scale``: a scalar (optional): the softmax scale, default ``1/sqrt(d)``;
- ``layer_ids``: ``[layers]`` integers (optional): the model's layer numbers;
- ``kv_head_ids``: ``[layers, n_kv_heads]`` integers (optional): the model's
  KV head numbers (the ids only name heads).

Rules (each broken one is a :class:`WorkloadError` naming the key):

- Arrays are float16, float32 or float64, or the raw bits of bfloat16 /
  float16 / float8_e4m3fn with an ``X_format`` key beside them (read as
  float32, exactly), and finite.
- ``n_heads`` is a multiple of ``n_kv_heads`` (grouped-query attention):
  query head ``h`` of a layer reads KV head ``h // (n_heads // n_kv_heads)``
  of the same layer. Multi-head attention is ``n_heads == n_kv_heads``.
- ``layers``, ``tokens`` and ``d`` agree across ``q``/``k``/``v``;
  ``tokens >= 2``. Positions are token order: row ``t`` is token ``t``, and
  the evaluation applies a causal mask (query ``i`` sees keys ``0..=i``),
  whether or not the model was causal.
- ``q`` and ``k`` are what the attention scores are computed from: after
  any rotary embedding or query/key norm (``q[l, h, i] · k[l, g, j] * scale``
  is the model's logit).
- ``index_q``/``index_k`` (both or neither) are your indexer's query and key
  (e.g. DeepSeek-V3.2's lightning indexer); without them the indexer is
  derived by :func:`derive_indexer`.
- Axis 1 is heads and axis 2 tokens: a ``q`` with fewer tokens than query
  heads loads with a :class:`WorkloadWarning` (it was probably saved as
  ``[layers, tokens, heads, d]``, a common torch layout).
- Any other key is refused (it is most likely a typo, such as ``Q`` or
  ``index_keys``, or an old name such as ``index_weights``, that would
  otherwise be silently ignored); the error names the closest known key and
  lists them all.

Layers are flattened into heads: the workload has ``layers * n_heads`` query
heads and ``layers * n_kv_heads`` KV heads, named ``"L{layer}/H{kv_head}"``
in :attr:`Workload.head_kinds`; flattening keeps every query head with the
KV heads of its own layer.
"""

from __future__ import annotations

from kvselect.workloads.dumps import WorkloadDump, load_npz, open_workload
from kvselect.workloads.example import example
from kvselect.workloads.indexer import derive_indexer
from kvselect.workloads.model import (
    HEAD_KINDS,
    HeadInputs,
    Indexer,
    Workload,
    WorkloadError,
    WorkloadWarning,
    query_positions,
)
from kvselect.workloads.quantize import fp8_e4m3fn, fp8_e4m3fn_bytes, quantize_fp8, quantize_rows
from kvselect.workloads.synthetic import synthetic, synthetic_needles

__all__ = [
    "HEAD_KINDS",
    "HeadInputs",
    "WorkloadDump",
    "open_workload",
    "Indexer",
    "fp8_e4m3fn",
    "fp8_e4m3fn_bytes",
    "quantize_fp8",
    "Workload",
    "WorkloadError",
    "WorkloadWarning",
    "derive_indexer",
    "example",
    "load_npz",
    "quantize_rows",
    "query_positions",
    "synthetic",
    "synthetic_needles",
]
