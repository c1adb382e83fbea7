"""Plain NumPy reference implementations of kvselect's native functions.

This package is written from the specifications (``spec/segment-witnesses.md``,
``spec/block_sparse.rs.txt``, the module docs of ``src/attention/`` and
``src/metrics.rs``, and the Python API contract of ``docs/conventions.md``),
independently of the Rust core. It is the oracle of the differential tests:
the native functions of ``kvselect`` must equal these exactly on integer
data (integer outputs, and float outputs computed from integer-valued
inputs), and within a stated tolerance on other float outputs. It favours
being obviously right over being fast, uses only NumPy, and never imports
the native module.

Its modules mirror ``src/``; each name is re-exported here, so
``kvselect.reference.X`` is the one spelling (the modules are where the code
lives, not a second API). What is exported (and ``__all__``) is the shared
names below and every rule's twin as its record lists it
(``kvselect.rules.Rule.twins``): a rule written after these keeps its twin in
its own module, ``kvselect/rules/<rule>.py``, exported here all the same and
held to the same rule (it calls nothing native; ``docs/adding-a-rule.md``).
Bottom up (each imports only modules above it):

- **_args**: the shared argument rules: the error mirror classes
  ``ReferenceWitnessError`` / ``ReferenceSelectionError`` and the one
  conversion layer every public function reads through (below);
- **keys**: the key formats (float32, float16, bfloat16, float8 e4m3fn) and
  their exact decodes from the bits (``decode``), which block selection and
  the indexer read their keys and queries through;
- **witness**: segment witnesses, the null models, the scalar metrics;
- **block_sparse**: MiniMax-M3 block selection over dense, packed and
  paged keys in every key format, query- or head-major, and the positions
  a selection covers (one row or batched); ``block_scores`` and
  ``block_magnitudes``;
- **attn** (``src/attention/``; named so that ``reference.attention`` stays
  the function): the baseline selectors, the oracle top-k, the dense and
  sparse attention pass;
- **sparse_attn**: exact float64 sparse attention over an engine's index
  rows, read by the engine's declared conventions (``Conventions``, the
  engines' presets), what ``kvselect.checking.check_sparse_attention``
  judges a sparse attention / sparse MLA kernel against;
- **indexer**: DeepSeek's lightning indexer top-k (dense, packed, paged),
  ``indexer_scores`` and ``indexer_magnitudes`` (uses witness);
- **compressed**: DeepSeek-V4's window and visible entries, the entry →
  tokens map, GLM-5-Next's pool expansion and vLLM's combined index rows
  (``combine_topk_swa_indices``);
- **quest**: Quest's page bounds (dense, packed, paged, the decode update),
  page scores and page sets (Quest's kernels, its evaluation script, SGLang's);
- **infllm**: InfLLM-v2's block selection (MiniCPM4 / 4.1): compressed keys, stage 1's
  group scores, the CUDA and Triton pooling, the rows; the core's error bound
  (``score_bound``) and the comparison within it (``rows_within_bound``);
- **vslash**: MInference's vertical-slash estimate (the last queries' column
  and diagonal sums, their top-k, each query's positions, the engines'
  per-block layout) and the bound on the core's float32 sums;
- **moba**: MoBA's block gates and block sets (the efficient code and the naive
  variant; dense, packed, paged at decode);
- **nsa**: NSA's block selection as fla computes it: the complete blocks' means,
  InfLLM-v2's stage 1 over them, the forced blocks, the rows (from the keys, dense
  or packed; from given compressed keys, dense, packed, or paged at decode); the
  core's bound (``nsa_score_bound``) and the comparison within it
  (``nsa_rows_within_bound``);
- **metrics**: attention probabilities, batched coverage and recall, the
  output relative error (uses witness, attn);
- **eviction**: the KV-eviction baselines' kept positions at a boundary
  (SnapKV, PyramidKV's layer budget, TOVA, H2O, ObservedAttention; kvpress's
  presses and FMInference/H2O), with kvselect's float64 softmax redone;
- **check**: is an engine's selection right? The token top-k, block and
  witness rules applied to an engine's rows (row-relative or
  ``GlobalSlots`` global slot ids), with the native checkers' reports
  (uses witness, block_sparse).

Each public function takes the signature of the native function of the same
name (``Selector.dense().rows(...)`` and its kin are ``dense_rows`` and its
kin; ``attention`` is the reference's own). Arguments
pass through one conversion layer, the native binding layer's rules:
counts are Python integers, index arrays hold integers whose values fit
int32 (floats are a ``TypeError``), position arrays hold non-negative
integers, float arrays hold floats and are converted to the kernel's type
(the keys and queries of block selection and the indexer are decoded
exactly from their format by ``decode``);
an out-of-range value is a ``ValueError`` (a ``ReferenceSelectionError``
naming the argument for the block-selection and attention functions).
``random_null`` and ``Selector.random`` have no reference: their draws are
ChaCha8's, not a specification's.
"""

from __future__ import annotations

from typing import Any, List

from kvselect._exports import RuleExports

from ._args import (
    ReferenceSelectionError,
    ReferenceWitnessError,
)
from .attn import (
    attention,
    dense_attention,
    dense_rows,
    local_rows,
    oracle_topk,
    sink_window_rows,
    sparse_attention,
)
from .block_sparse import (
    MINIMAX_BLOCK_SIZE,
    BlockSparseConfig,
    block_magnitudes,
    block_scores,
    block_sparse_select,
    block_sparse_select_packed,
    block_sparse_select_paged,
    positions_of_blocks,
)
from .check import (
    GlobalSlots,
    check_blocks,
    check_topk,
    check_witnesses,
)
from .compressed import (
    combine_topk_swa_indices,
    compressed_entry_tokens,
    expand_entries,
    visible_entries,
    window_positions,
)
from .eviction import (
    h2o_keep,
    keep_top,
    observed_attention_keep,
    observed_attention_scores,
    pyramidkv_layer_budget,
    snapkv_keep,
    snapkv_scores,
    softmax_row,
    tova_keep,
    tova_scores,
)
from .indexer import (
    indexer_magnitudes,
    indexer_scores,
    indexer_topk,
    indexer_topk_packed,
    indexer_topk_paged,
    indexer_topk_pooled,
)
from .infllm import (
    compress_keys,
    infllm_block_scores,
    infllm_block_scores_paged,
    infllm_select,
    infllm_select_paged,
)
from .keys import (  # kvselect.checking decodes fp8 bytes through it
    decode,
    fp8_e4m3fn_table,
)
from .metrics import (
    attention_mass_recall_rows,
    attention_probabilities,
    output_relative_error,
    output_relative_error_rows,
    segment_coverage_rows,
    slots_used_rows,
)
from .moba import (
    moba_gates,
    moba_select,
    moba_select_paged,
)
from .nsa import (
    nsa_block_scores,
    nsa_block_scores_compressed,
    nsa_block_scores_paged,
    nsa_compress_keys,
    nsa_select,
    nsa_select_compressed,
    nsa_select_paged,
)
from .quest import (
    quest_bounds,
    quest_bounds_paged,
    quest_scores,
    quest_select,
    quest_update,
)
from .sparse_attn import (
    Conventions,
    conventions_of,
    sparse_attention_exact,
)
from .vslash import (
    vslash_error_bounds,
    vslash_layout,
    vslash_layout_batch,
    vslash_rows,
    vslash_scores,
    vslash_select,
    vslash_sizes,
)
from .witness import (
    MAX_TOPOLOGY_SEGMENTS,
    apply_topology_witnesses,
    attention_mass_recall,
    locality_null,
    scatter_topology_witnesses,
    segment_coverage,
    segment_of,
    topology_witness_indices,
)

# The names no one rule owns (the argument layer's errors, the key decode, the
# checkers, the metrics), then every rule's twin as its record lists it
# (kvselect.rules: ``Rule.twins``): ``__all__`` and a twin written in its
# rule's own module are read from the registry on first use (kvselect._exports).
SHARED = (
    "ReferenceWitnessError",
    "ReferenceSelectionError",
    "decode",
    "GlobalSlots",
    "check_topk",
    "check_blocks",
    "check_witnesses",
    "attention_probabilities",
    "segment_coverage_rows",
    "attention_mass_recall_rows",
    "output_relative_error",
    "output_relative_error_rows",
)

_EXPORTS = RuleExports(__name__, lambda: SHARED, lambda rule: (f"{rule.reference}.{n}" for n in rule.twins))


def __getattr__(name: str) -> Any:
    return _EXPORTS.getattr(name)


def __dir__() -> List[str]:
    return _EXPORTS.dir()
