"""The inputs that break selection kernels, as seeded generators.

Each generator takes a ``seed`` (a :func:`numpy.random.default_rng` seed)
and returns a :class:`Case`: the kernel's inputs as NumPy arrays under the
API's names (``case.inputs``), the answer of the exact rule
(``case.expected``, rows of positions, ``-1`` padded), and
``case.assert_rows(rows)``, which checks a kernel's output with
:func:`kvselect.testing.assert_topk` (or ``assert_blocks`` /
``assert_witnesses``) at the tolerance the case is built for. Each
generator's docstring says the bug it provokes and the engine issue where
it shipped.

**Exact by construction.** The token top-k cases are built from small
integers and powers of two so that every score is exact in float32 in *any*
summation order (every partial sum is an integer multiple of one quantum and
below ``2^24`` quanta): a kernel that accumulates in float32 owes the exact
answer, so ``case.check`` asks for ``rtol = atol = 0``. A kernel that rounds
its scores coarser (bfloat16) cannot tell these rows apart: at its tolerance
they are vacuous, and :func:`~kvselect.testing.assert_topk` says so.

**In every generator**: ``scale_exp`` multiplies the scores by
``2^scale_exp`` (exact; the ranking is unchanged), and the rows' context
lengths ``L`` have ``L mod 8 != 0`` (so ``L mod 16, 32, 64 != 0`` too)
unless the case is about a particular ``L`` (``L = topk``).
:func:`all_topk_cases` runs every generator at ``scale_exp`` 0, 30 and -30.

Torch users: ``torch.from_numpy(a)`` for float32 / int arrays;
``torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16)`` (or
``np.uint8`` / ``torch.float8_e4m3fn``) for the ml_dtypes ones.

Sizes are small by default (tests stay fast); ``long=True`` in
:func:`all_topk_cases` adds the 256K-key rows.

The sparse attention cases (:func:`all_sparse_attention_cases`, module
``attention``) are the index rows that broke the kernels consuming a
selection; their sources are in that module's docs.

Sources of the engine facts:

- vllm-project/vllm#51782: ``persistent_topk`` collects the threshold
  bin's candidates into a fixed-size shared-memory buffer and silently
  truncates it: with every value in one coarse histogram bin (values in
  ``[1.0, 1.245)``), k = 2048, rows of ``kv_len > 16384`` drop up to 2047
  candidates, score deltas ~1e-4, "a tolerance of 1e-4 would mask the
  boundary cases entirely".
- sgl-project/sglang#36807: ``fast_topk_v2`` returns wrong top-k sets when
  the radix threshold bucket exceeds its 4096-entry candidate buffer (k =
  2048; clean at L = 65536, 64/64 rows wrong at L = 1048576).
- ik_llama.cpp ``iqk_bucket_topk`` (8337e4cd, 2026-08-15, decode path), the
  two faults ``kvselect check`` found in that fused CPU indexer top-k when
  its decode rows were dumped and checked against the exact rule: (a) the
  last ``L % 8`` scores bucketed by truncation, the rest rounded; (b) an
  absolute early-out ``max - min < 1e-6``.
- The indexer's score ``key_scale[t] Σ_h w_h ReLU(q_h · k_t)`` with signed
  head weights (DeepSeek-V3.2's lightning indexer): folding the weights into
  the query drops the ReLU (:func:`relu_negative_dots`); fp8 index-K caches
  carry one float32 scale per token (vLLM's DSA pages,
  ``indexer_k_quant_and_cache``; :func:`fp8_per_key_scales`).
- Quest (mit-han-lab/Quest @01c1623b) and SGLang's Quest
  (``mem_cache/sparsity/algorithms/quest_algorithm.py`` @00544d86): the
  page bound's min / max and the sign of ``q_i``, the forced last page, the
  dense fallback, a page bounded over stale slots, fp8 keys' per-key scales
  (:func:`all_quest_cases`).
- InfLLM-v2 (OpenBMB/infllmv2_cuda_impl @f908e731 ``csrc/max_pooling_1d.cuh``;
  MiniCPM4.1's ``compressed_attention``): the pooling window ``[4b - 1, 4b + 4)``
  off by one, the current block not forced, the ``>= q_idx`` filter, a top-k that
  is one tie, fp8 compressed keys' scales (:func:`all_infllm_cases`).
- MInference's vertical-slash estimate (microsoft/MInference @fb56c917
  ``minference_forward.py``): the causal mask among the last queries, the
  diagonal offset's sign, the forced columns and diagonals, sequences shorter
  than the 64 last queries, fp8 keys' per-key scales (:func:`all_vslash_cases`).
- NSA as fla computes it (fla-org/flash-linear-attention @bc3b101d
  ``fla/ops/nsa/parallel.py``): an incomplete block compressed, the group summed
  before the softmax, ``Tq != Tkv`` offsets (:func:`all_nsa_cases`).
- vLLM's DeepSeek-V4 ``combine_topk_swa_indices``
  (``vllm/v1/attention/ops/deepseek_v4_ops/cache_utils.py``): token ``pos``
  sees ``(pos + 1) // compress_ratio`` compressed entries
  (:func:`compressed_entry_boundary`).
"""

from __future__ import annotations

from typing import Any, List

from kvselect._exports import RuleExports
from kvselect.testing.cases._case import Case, pytest_params, tail_lengths
from kvselect.testing.cases.attention import (
    all_sparse_attention_cases,
    causal_boundary,
    empty_rows,
    masked_first_chunk,
    neighbour_repeats,
    packed_mla,
    padding_reads,
    paged_blocks,
    repeated_entries,
    rising_scores,
)
from kvselect.testing.cases.blocks import (
    all_block_cases,
    all_witness_cases,
    block_partial_tail,
    block_short,
    block_ties,
    witness_rows,
)
from kvselect.testing.cases.family import (
    all_family_cases,
    forced_entry_counted_twice,
    forced_entry_dropped,
    pool_last_partial_block,
    score_pool_last_partial_block,
)
from kvselect.testing.cases.infllm import (
    all_infllm_cases,
    infllm_current_not_forced,
    infllm_decode_drops_current,
    infllm_fp8_scales,
    infllm_ties,
    infllm_window_off_by_one,
)
from kvselect.testing.cases.moba import (
    all_moba_cases,
    moba_current_block_forced,
    moba_partial_block_gated,
    moba_ties,
)
from kvselect.testing.cases.nsa import (
    all_nsa_cases,
    nsa_eq9_overlap_window,
    nsa_group_sum_before_softmax,
    nsa_incomplete_block_compressed,
    nsa_tq_offsets,
)
from kvselect.testing.cases.quest import (
    all_quest_cases,
    quest_dense_fallback,
    quest_fp8_scales,
    quest_last_page_forced,
    quest_minmax_swapped,
    quest_sign_ignored,
    quest_stale_slots,
    quest_ties,
)
from kvselect.testing.cases.semantics import compressed_entry_boundary, fp8_per_key_scales, relu_negative_dots
from kvselect.testing.cases.topk import (
    all_topk_cases,
    all_zero,
    bf16_rounded_ties,
    fp8_extremes,
    ik_absolute_early_out,
    ik_tail_truncation,
    low_contrast,
    non_finite,
    paged,
    short_contexts,
    signed_zeros,
    ties_at_threshold,
)
from kvselect.testing.cases.vslash import (
    all_vslash_cases,
    vslash_causal_mask,
    vslash_forced,
    vslash_fp8_scales,
    vslash_offset_sign,
    vslash_short,
)

# ``__all__``: the shared names, then every rule's cases as its record lists
# them (kvselect.rules: ``Rule.cases`` and ``Rule.case_functions``), read from
# the registry on first use, as are cases written in their rule's own module
# (kvselect._exports).
SHARED = ("Case", "pytest_params", "tail_lengths")

_EXPORTS = RuleExports(
    __name__,
    lambda: SHARED,
    lambda rule: ((rule.cases,) if rule.cases is not None else ()) + rule.case_functions,
)


def __getattr__(name: str) -> Any:
    return _EXPORTS.getattr(name)


def __dir__() -> List[str]:
    return _EXPORTS.dir()
