"""kvselect: which KV positions a query may attend to in sparse attention.

The decision half of sparse attention, exact on the CPU, for NumPy pipelines:

- segment witnesses on top of a learned sparse top-k (a port of the candidate
  policy of vLLM PR 47942): :func:`topology_witness_indices`,
  :func:`apply_topology_witnesses` and the in-place serving entry point
  :func:`scatter_topology_witnesses`, with the null models
  :func:`random_null` / :func:`locality_null` and the metrics
  :func:`segment_coverage` / :func:`attention_mass_recall`;
- block-sparse selection as in MiniMax-M3 (:class:`BlockSparseConfig`,
  :func:`block_sparse_select`, :func:`block_sparse_select_packed`,
  :func:`block_sparse_select_paged` (paged bfloat16 / fp8 caches),
  :func:`positions_of_blocks`): which KV blocks each KV head may read;
- the attention module: baseline selectors (:class:`Selector`,
  :func:`oracle_topk`), dense and sparse causal attention
  (:func:`dense_attention`, :func:`sparse_attention`; GQA, MLA strided
  values), dense probabilities and batched metrics
  (:func:`attention_probabilities`, :func:`segment_coverage_rows`,
  :func:`attention_mass_recall_rows`, :func:`output_relative_error_rows`);
- the learned top-k itself, DeepSeek's lightning indexer
  (:func:`indexer_topk`, :func:`indexer_topk_packed`,
  :func:`indexer_topk_paged`): exact, one total order, float32 / float16 /
  bfloat16 / fp8 keys read in place, witnesses in the same pass;
- is an engine's selection right? The rules applied to a kernel's rows,
  tie-aware, with a defined tolerance and a report: :func:`check_topk`
  (token top-k; :func:`indexer_scores` gives the exact scores and their
  error scales), :func:`check_blocks` (MiniMax-M3 blocks;
  :func:`block_scores`), :func:`check_witnesses` (an in-place witness
  call), rows in the engines' global slot ids through :class:`GlobalSlots`;
  ``kvselect check DUMP.npz`` (:mod:`kvselect.checking`) runs them on a
  dump of one kernel call;
- DeepSeek-V4's attention sets over compressed keys: the sliding window
  (:func:`window_positions`), the entries an HCA query sees
  (:func:`visible_entries`; a CSA query's are :func:`indexer_topk` with
  ``compress_ratio``), the tokens an entry covers
  (:func:`compressed_entry_tokens`), vLLM's combined index rows
  (:func:`combine_topk_swa_indices`) and GLM-5-Next's pool expansion
  (:func:`expand_entries`);
- Quest's query-aware page selection (:func:`quest_bounds`,
  :func:`quest_bounds_paged`, :func:`quest_update`, :func:`quest_scores`,
  :func:`quest_select`): each page's key bounds, built from dense or paged
  bfloat16 / fp8 caches and updated per decode step, the score bound they put
  on a query, and the pages it reads (Quest's kernels, its evaluation script,
  SGLang's variant);
- InfLLM-v2's block selection (MiniCPM4 / 4.1: :func:`infllm_block_scores`,
  :func:`infllm_select`, :func:`infllm_block_scores_paged`, :func:`infllm_select_paged`): stage 1's softmax over compressed keys summed over
  the query group, max pooled onto 64-token blocks, the forced blocks and the
  top-k (the CUDA and the older Triton pooling, both top-k filters);
- MInference's vertical-slash estimate (:func:`vslash_select`,
  :func:`vslash_scores`, :func:`vslash_rows`, :func:`vslash_layout`,
  :func:`vslash_layout_batch`): the key columns and diagonals a prefill reads,
  from the last queries' causal softmax, each query's positions, and the
  per-block layout the engines' kernels take (MInference's form and vLLM's /
  SGLang's later one);
- MoBA's block selection (:func:`moba_gates`, :func:`moba_select`,
  :func:`moba_select_paged`): each query's gate on every completed past
  block's mean key, the top ``topk - 1`` blocks and its own, dense, packed
  or paged at decode, bfloat16 / fp8 keys read in place;
- NSA's block selection as fla computes it (:func:`nsa_block_scores`,
  :func:`nsa_select`): InfLLM-v2's stage 1 over the means of complete blocks,
  block 0 and the query's last two forced, the top ``block_counts`` decided in
  exact arithmetic; on an engine's cached compressed keys, dense or paged at
  decode (:func:`nsa_select_compressed`, :func:`nsa_select_paged`);
- the KV-eviction baselines' selection (:func:`snapkv_scores`,
  :func:`tova_scores`, :func:`observed_attention_scores`, :func:`h2o_keep`,
  :func:`keep_top`): SnapKV's, TOVA's and ObservedAttention's scores and H2O's
  greedy eviction over one KV head's prefix, float64 bit for bit with their
  NumPy twins, and the one order that keeps the top;
- ``kvselect eval`` (:mod:`kvselect.evaluate`): policies compared at one
  identical budget on a built-in workload or your own Q/K/V dumps.

Arrays that already have the right dtype and C order are read in place;
others are converted once when that keeps their meaning (integer arrays that
fit in int32, such as ``torch.topk``'s int64). The in-place buffer of
:func:`scatter_topology_witnesses` is never converted. Refusals raise
:class:`WitnessError` / :class:`SelectionError` (subclasses of
:class:`KvselectError`, a ``ValueError``) or ``TypeError``; a refused call
leaves every buffer byte-identical.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable, Dict, List

import kvselect._core as _core
from kvselect._exports import RuleExports

if TYPE_CHECKING:
    from kvselect._core import *  # noqa: F403  (type checkers: the stub's names)
else:
    # Every public name the native module registers (its bindings' ``register``),
    # bound here; which rule owns each is the registry's (``__all__`` below).
    globals().update({n: getattr(_core, n) for n in _core.__all__ if n[:1] != "_" or n[:2] == "__"})
from kvselect._core import check_blocks as _native_check_blocks
from kvselect._core import check_topk as _native_check_topk
from kvselect._core import check_witnesses as _native_check_witnesses

if TYPE_CHECKING:
    from typing_extensions import ParamSpec

    from kvselect.checking.report import Report

    _P = ParamSpec("_P")


def _reported(native: Callable[_P, Dict[str, Any]]) -> Callable[_P, Report]:
    """The native checker ``native`` returning its report as a
    :class:`kvselect.checking.Report` (the one report type of every
    checker), its signature and docstring the native's."""

    @functools.wraps(native)
    def checker(*args: _P.args, **kwargs: _P.kwargs) -> Report:
        from kvselect.checking.report import Report

        return Report(native(*args, **kwargs))

    checker.__annotations__ = {}  # (the native's have none; ours name typing-only names)
    return checker


check_topk = _reported(_native_check_topk)
check_blocks = _reported(_native_check_blocks)
check_witnesses = _reported(_native_check_witnesses)

# The pure-Python submodules, imported on first use (PEP 562): ``import
# kvselect`` stays light, and ``kvselect.checking`` (which imports kvselect)
# works without its own import statement.
_SUBMODULES = ("checking", "cli", "dump_hf", "evaluate", "reference", "workloads")


# ``__all__``: every rule's native names as its record lists them (kvselect.rules:
# ``Rule.api``, in the rules' order), then the names no one rule owns
# (``kvselect.rules.SHARED_API``), read from the registry on first use
# (kvselect._exports): the registry's modules import this one.
def _shared_api() -> List[str]:
    from kvselect.rules import SHARED_API

    return [n for _, names in SHARED_API for n in names]


_EXPORTS = RuleExports(
    __name__, _shared_api, lambda rule: (f"kvselect._core.{n}" for n in rule.api), shared_first=False
)


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        import importlib

        return importlib.import_module(f"kvselect.{name}")
    if name == "__all__":  # (every native name is bound above: only __all__ reads the registry)
        return _EXPORTS.all()
    raise AttributeError(f"module 'kvselect' has no attribute {name!r}")


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(_SUBMODULES))
