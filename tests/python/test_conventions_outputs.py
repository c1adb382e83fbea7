"""The conventions (docs/conventions.md), on the output and checker side.

- ``out=`` (and ``lse_out=``) on every function that returns a fixed-shape
  array follows one contract, natively and in the reference: the buffer is
  returned, filled with exactly what the call without it returns (bit for
  bit); a wrong dtype is a ``TypeError``; a wrong shape or a buffer sharing
  an input's memory is refused naming the buffer; a refused call leaves the
  buffer and every input byte-identical.
- A scalar ``query_pos`` is a batch of one query: the same as ``[p]``.
- Transposed or reshaped arrays are refused naming the argument and both
  shapes.
- The checkers take what the producers return: ``check_blocks`` the 3-D
  ``block_scores`` / ``block_sparse_select`` (query- or head-major),
  ``check_topk`` ``indexer_scores`` / ``indexer_topk``, ``check_witnesses``
  a ``scatter_topology_witnesses`` before/after pair; the witness check
  refuses with ``WitnessError``.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Callable

import numpy as np
import pytest

import kvselect as ks
from kvselect import reference as ref

SEED = 20261201
IMPLS = ["native", "reference"]


def _mod(impl):
    return ks if impl == "native" else ref


def _errors(impl, domain):
    if impl == "native":
        return ks.WitnessError if domain == "witness" else ks.SelectionError
    return ref.ReferenceWitnessError if domain == "witness" else ref.ReferenceSelectionError


# ---------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------


def _qkv(rng, n=3, hq=4, hkv=2, nk=9, d=5, dv=3):
    q = rng.standard_normal((n, hq, d)).astype(np.float32)
    k = rng.standard_normal((nk, hkv, d)).astype(np.float32)
    v = rng.standard_normal((nk, hkv, dv)).astype(np.float32)
    pos = rng.integers(0, nk + 2, n).astype(np.int64)
    return q, k, v, pos


def _selection(rng, n=3, hkv=2, width=4, nk=9):
    return rng.integers(-1, nk, (n, hkv, width)).astype(np.int32)


@dataclasses.dataclass
class OutSpec:
    """A function with output buffers: ``call(mod, args, **bufs)``; ``args``
    makes fresh inputs (a list, whose ndarray entries may be aliased);
    ``bufs`` maps each buffer keyword to (shape, dtype, index of it in the
    result or None when the result is the buffer itself)."""

    id: str
    domain: str
    args: Callable[[], list]
    call: Callable[..., Any]
    bufs: dict
    impls: tuple = ("native", "reference")
    reads_arrays: bool = True  # False: integers in (the null models)


def _attention_args():
    q, k, v, pos = _qkv(np.random.default_rng(SEED))
    return [q, k, v, pos]


def _sparse_args():
    rng = np.random.default_rng(SEED)
    q, k, v, pos = _qkv(rng)
    return [q, k, v, pos, _selection(rng)]


def _probs_args():
    q, k, _, pos = _qkv(np.random.default_rng(SEED))
    return [q, k, pos]


def _oracle_args():
    rng = np.random.default_rng(SEED + 1)
    return [rng.random((4, 10)), np.array([3, 9, 0, 12]), 3]


def _cand_args():
    rng = np.random.default_rng(SEED + 2)
    return [rng.integers(-1, 12, (5, 4)).astype(np.int32), rng.integers(0, 14, 5).astype(np.int64)]


def _recall_args():
    rng = np.random.default_rng(SEED + 3)
    return [rng.integers(-1, 10, (3, 4)).astype(np.int32), rng.random((6, 10))]


def _error_args():
    rng = np.random.default_rng(SEED + 4)
    return [rng.standard_normal((3, 2, 5)).astype(np.float32), rng.standard_normal((3, 2, 5)).astype(np.float32)]


def _witness_args():
    return [np.array([[0, 5, -1, -1], [3, -1, -1, -1]], np.int32), np.array([8, 6], np.int32)]


def _moba_args():
    rng = np.random.default_rng(SEED + 5)
    return [rng.standard_normal((3, 4, 5)).astype(np.float32), rng.standard_normal((9, 2, 5)).astype(np.float32)]


def _moba_packed_args():
    # Two sequences (4 and 5 keys), one and two queries: the boundaries are arrays too.
    return [*_moba_args(), np.array([0, 4, 9], np.int64), np.array([0, 1, 3], np.int64)]


def _paged(rng, q_shape, n_pages, page, row, lens):
    """Queries, a shuffled paged cache, its block table and the lengths."""
    q = rng.standard_normal(q_shape).astype(np.float32)
    cache = rng.standard_normal((n_pages, page, row)).astype(np.float32)
    table = rng.permutation(n_pages).astype(np.int32).reshape(len(lens), -1)
    return [q, cache, table, np.array(lens, np.int64)]


def _moba_paged_args():
    return _paged(np.random.default_rng(SEED + 6), (2, 4, 5), 6, 4, 10, [9, 5])


def _nsa_args():
    rng = np.random.default_rng(SEED + 7)
    return [rng.standard_normal((3, 4, 4)).astype(np.float32), rng.standard_normal((20, 2, 4)).astype(np.float32)]


def _nsa_packed_args():
    return [*_nsa_args(), np.array([0, 8, 20], np.int64), np.array([0, 1, 3], np.int64)]


def _nsa_compressed_args():
    q, k = _nsa_args()
    return [q, k.reshape(5, 4, 2, 4).mean(axis=1, dtype=np.float32)]  # blocks of 4: 5 compressed keys


def _nsa_compressed_packed_args():
    # Sequences of 8 and 12 tokens (2 and 3 compressed keys), one and two queries.
    q, ck = _nsa_compressed_args()
    return [q, ck, np.array([8, 12], np.int64), np.array([0, 1, 3], np.int64), np.array([0, 2, 5], np.int64)]


def _nsa_paged_args():
    return _paged(np.random.default_rng(SEED + 8), (2, 4, 4), 10, 4, 8, [20, 13])


def _infllm_args():
    rng = np.random.default_rng(SEED + 9)
    return [rng.standard_normal((1, 4, 8)).astype(np.float32), rng.standard_normal((63, 2, 8)).astype(np.float32)]


def _infllm_paged_args():
    q, ck = _infllm_args()
    cache = np.ascontiguousarray(ck.reshape(7, 9, 16)[::-1])  # 1,024 tokens' compressed keys, pages of 9
    return [q, cache, np.arange(6, -1, -1, dtype=np.int32)[None], np.array([1024], np.int64)]


def _quest_args():
    rng = np.random.default_rng(SEED + 10)
    kmin, kmax = ks.quest_bounds(rng.standard_normal((40, 2, 8)).astype(np.float32), 8)  # 5 pages
    return [rng.standard_normal((4, 8)).astype(np.float32), kmin, kmax]


def _quest_batch_args():
    # Two sequences of 17 and 13 tokens (3 and 2 pages of 8), one query each.
    rng = np.random.default_rng(SEED + 11)
    keys = rng.standard_normal((30, 2, 8)).astype(np.float32)
    kmin, kmax = ks.quest_bounds(keys, 8, cu_seqlens=np.array([0, 17, 30]))
    return [rng.standard_normal((2, 4, 8)).astype(np.float32), kmin, kmax, np.array([17, 13], np.int64)]


def _prefix_args():
    rng = np.random.default_rng(SEED + 15)
    return [rng.standard_normal((12, 2, 8)).astype(np.float32), rng.standard_normal((12, 8)).astype(np.float32)]


def _infllm_packed_args():
    # Two sequences of 1,024 and 512 tokens (63 and 31 compressed keys), one and two
    # queries: the shorter sequence's block scores end in NaN padding.
    rng = np.random.default_rng(SEED + 17)
    q = rng.standard_normal((3, 4, 8)).astype(np.float32)
    ck = rng.standard_normal((94, 2, 8)).astype(np.float32)
    return [q, ck, np.array([1024, 512], np.int64), np.array([0, 1, 3], np.int64), np.array([0, 63, 94], np.int64)]


def _infllm_paged2_args():
    # The same two sequences' compressed keys in pages of 9 (7 and 4 pages).
    q, ck, lens, _, _ = _infllm_packed_args()
    cache = np.zeros((11, 9, 16), np.float32)
    cache.reshape(-1, 16)[:94] = ck.reshape(94, 16)
    table = np.array([[0, 1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 0, 0, 0]], np.int32)
    return [q[1:], cache, table, lens]


SPECS = [
    OutSpec(
        "attention_probabilities",
        "selection",
        _probs_args,
        lambda m, a, **b: m.attention_probabilities(*a, **b),
        {"out": ((3, 4, 9), np.float64, None)},
    ),
    OutSpec(
        "dense_attention",
        "selection",
        _attention_args,
        lambda m, a, **b: m.dense_attention(*a, **b),
        {"out": ((3, 4, 3), np.float32, 0), "lse_out": ((3, 4), np.float32, 1)},
    ),
    OutSpec(
        "sparse_attention",
        "selection",
        _sparse_args,
        lambda m, a, **b: m.sparse_attention(*a, **b),
        {"out": ((3, 4, 3), np.float32, 0), "lse_out": ((3, 4), np.float32, 1)},
    ),
    OutSpec(
        "oracle_topk",
        "selection",
        _oracle_args,
        lambda m, a, **b: m.oracle_topk(*a, **b),
        {"out": ((4, 3), np.int32, None)},
    ),
    OutSpec(
        "Selector.rows",
        "selection",
        lambda: [np.array([0, 4, 9], np.int64)],
        lambda m, a, **b: ks.Selector.local(3).rows(*a, **b),
        {"out": ((3, 3), np.int32, None)},
        impls=("native",),
    ),
    OutSpec(
        "segment_coverage_rows",
        "witness",
        _cand_args,
        lambda m, a, **b: m.segment_coverage_rows(*a, 4, **b),
        {"out": ((5,), np.float64, None)},
    ),
    OutSpec(
        "slots_used_rows",
        "witness",
        _cand_args,
        lambda m, a, **b: m.slots_used_rows(*a, **b),
        {"out": ((5,), np.int64, None)},
    ),
    OutSpec(
        "attention_mass_recall_rows",
        "witness",
        _recall_args,
        lambda m, a, **b: m.attention_mass_recall_rows(*a, **b),
        {"out": ((6,), np.float64, None)},
    ),
    OutSpec(
        "output_relative_error_rows",
        "selection",
        _error_args,
        lambda m, a, **b: m.output_relative_error_rows(*a, **b),
        {"out": ((3, 2), np.float64, None)},
    ),
    OutSpec(
        "topology_witness_indices",
        "witness",
        _witness_args,
        lambda m, a, **b: m.topology_witness_indices(*a, 4, **b),
        {"out": ((2, 4), np.int32, None)},
    ),
    OutSpec(
        "apply_topology_witnesses",
        "witness",
        _witness_args,
        lambda m, a, **b: m.apply_topology_witnesses(*a, 2, 4, 2, **b),
        {"out": ((2, 4), np.int32, None)},
    ),
    # The block-selection rules (MoBA, NSA, InfLLM-v2): dense, packed and paged.
    OutSpec(
        "moba_gates",
        "selection",
        _moba_args,
        lambda m, a, **b: m.moba_gates(*a, 2, **b),
        {"out": ((3, 4, 5), np.float32, None)},
    ),
    OutSpec(
        "moba_select",
        "selection",
        _moba_args,
        lambda m, a, **b: m.moba_select(*a, 2, 2, **b),
        {"out": ((3, 4, 2), np.int32, None)},
    ),
    OutSpec(
        "moba_select-packed",
        "selection",
        _moba_packed_args,
        lambda m, a, **b: m.moba_select(a[0], a[1], 2, 2, cu_seqlens=a[2], cu_seqlens_q=a[3], **b),
        {"out": ((3, 4, 2), np.int32, None)},
    ),
    OutSpec(
        "moba_select_paged",
        "selection",
        _moba_paged_args,
        lambda m, a, **b: m.moba_select_paged(*a, 2, 2, 2, **b),
        {"out": ((2, 4, 2), np.int32, None)},
    ),
    OutSpec(
        "nsa_compress_keys",
        "selection",
        lambda: _nsa_args()[1:],
        lambda m, a, **b: m.nsa_compress_keys(*a, block_size=4, **b),
        {"out": ((5, 2, 4), np.float32, None)},
    ),
    OutSpec(
        "nsa_block_scores",
        "selection",
        _nsa_args,
        lambda m, a, **b: m.nsa_block_scores(*a, block_size=4, **b),
        {"out": ((3, 2, 5), np.float32, None)},
    ),
    OutSpec(
        "nsa_select",
        "selection",
        _nsa_args,
        lambda m, a, **b: m.nsa_select(*a, 3, block_size=4, **b),
        {"out": ((3, 2, 3), np.int32, None)},
    ),
    OutSpec(
        "nsa_select-packed",
        "selection",
        _nsa_packed_args,
        lambda m, a, **b: m.nsa_select(a[0], a[1], 3, block_size=4, cu_seqlens=a[2], cu_seqlens_q=a[3], **b),
        {"out": ((3, 2, 3), np.int32, None)},
    ),
    OutSpec(
        "nsa_block_scores_compressed",
        "selection",
        _nsa_compressed_args,
        lambda m, a, **b: m.nsa_block_scores_compressed(*a, 20, block_size=4, **b),
        {"out": ((3, 2, 5), np.float32, None)},
    ),
    OutSpec(
        "nsa_select_compressed",
        "selection",
        _nsa_compressed_args,
        lambda m, a, **b: m.nsa_select_compressed(*a, 20, 3, block_size=4, **b),
        {"out": ((3, 2, 3), np.int32, None)},
    ),
    OutSpec(
        "nsa_select_compressed-packed",
        "selection",
        _nsa_compressed_packed_args,
        lambda m, a, **b: m.nsa_select_compressed(
            a[0], a[1], a[2], 3, block_size=4, cu_seqlens_q=a[3], cu_seqlens_k=a[4], **b
        ),
        {"out": ((3, 2, 3), np.int32, None)},
    ),
    OutSpec(
        "nsa_block_scores_paged",
        "selection",
        _nsa_paged_args,
        lambda m, a, **b: m.nsa_block_scores_paged(*a, 2, block_size=4, **b),
        {"out": ((2, 2, 5), np.float32, None)},
    ),
    OutSpec(
        "nsa_select_paged",
        "selection",
        _nsa_paged_args,
        lambda m, a, **b: m.nsa_select_paged(*a, 2, 3, block_size=4, **b),
        {"out": ((2, 2, 3), np.int32, None)},
    ),
    OutSpec(
        "infllm_block_scores",
        "selection",
        _infllm_args,
        lambda m, a, **b: m.infllm_block_scores(*a, 1024, local_blocks=2, **b),
        {"out": ((1, 2, 16), np.float32, None)},
    ),
    OutSpec(
        "infllm_select",
        "selection",
        _infllm_args,
        lambda m, a, **b: m.infllm_select(*a, 1024, 4, local_blocks=2, **b),
        {"out": ((1, 2, 4), np.int32, None)},
    ),
    OutSpec(
        "infllm_block_scores_paged",
        "selection",
        _infllm_paged_args,
        lambda m, a, **b: m.infllm_block_scores_paged(*a, 2, local_blocks=2, **b),
        {"out": ((1, 2, 16), np.float32, None)},
    ),
    OutSpec(
        "quest_scores",
        "selection",
        _quest_args,
        lambda m, a, **b: m.quest_scores(*a, **b),
        {"out": ((4, 5), np.float32, None)},
    ),
    OutSpec(
        "quest_scores-sglang",
        "selection",
        _quest_args,
        lambda m, a, **b: m.quest_scores(*a, variant="sglang", **b),
        {"out": ((5,), np.float32, None)},
    ),
    OutSpec(
        "quest_select",
        "selection",
        _quest_args,
        lambda m, a, **b: m.quest_select(*a, 40, 2, 8, **b),
        {"out": ((4, 2), np.int32, None)},
    ),
    OutSpec(
        "quest_select-batch",
        "selection",
        _quest_batch_args,
        lambda m, a, **b: m.quest_select(*a, 2, 8, **b),
        {"out": ((2, 4, 2), np.int32, None)},
    ),
    OutSpec(
        "vslash_rows",
        "selection",
        lambda: [*_vslash_sets_args(), np.array([3, 150, 0], np.int64)],
        lambda m, a, **b: m.vslash_rows(a[0], a[1], 200, a[2], **b),
        {"out": ((2, 3, 100), np.int32, None)},
    ),
    # The eviction baselines (their twins transcribe kvpress's signatures: native
    # only) and the null models (scalars in).
    OutSpec(
        "snapkv_scores",
        "selection",
        _prefix_args,
        lambda m, a, **b: m.snapkv_scores(*a, window=4, **b),
        {"out": ((12,), np.float64, None)},
        impls=("native",),
    ),
    OutSpec(
        "tova_scores",
        "selection",
        lambda: [_prefix_args()[0][-1], _prefix_args()[1]],
        lambda m, a, **b: m.tova_scores(*a, **b),
        {"out": ((12,), np.float64, None)},
        impls=("native",),
    ),
    OutSpec(
        "observed_attention_scores",
        "selection",
        _prefix_args,
        lambda m, a, **b: m.observed_attention_scores(*a, **b),
        {"out": ((12,), np.float64, None)},
        impls=("native",),
    ),
    OutSpec(
        "h2o_keep",
        "selection",
        _prefix_args,
        lambda m, a, **b: m.h2o_keep(*a, 5, recent=2, **b),
        {"out": ((5,), np.int64, None)},
        impls=("native",),
    ),
    OutSpec(
        "keep_top",
        "selection",
        lambda: [np.random.default_rng(SEED + 16).random(9)],
        lambda m, a, **b: m.keep_top(*a, 4, **b),
        {"out": ((4,), np.int64, None)},
        impls=("native",),
    ),
    OutSpec(
        "random_null",
        "witness",
        list,
        lambda m, a, **b: m.random_null(20, 5, 7, **b),
        {"out": ((5,), np.int32, None)},
        impls=("native",),
        reads_arrays=False,
    ),
    OutSpec(
        "locality_null",
        "witness",
        list,
        lambda m, a, **b: m.locality_null(20, 5, **b),
        {"out": ((5,), np.int32, None)},
        reads_arrays=False,
    ),
    OutSpec(
        "GlobalSlots.positions",
        "selection",
        lambda: [np.array([[12, 5, -1, -7], [8, 15, 4, 13]], np.int64)],
        lambda m, a, **b: m.GlobalSlots(np.array([[3, 1]], np.int32), [0, 0], 4).positions(*a, **b),
        {"out": ((2, 4), np.int64, None)},
    ),
    OutSpec(
        "nsa_block_scores-packed",
        "selection",
        _nsa_packed_args,
        lambda m, a, **b: m.nsa_block_scores(a[0], a[1], block_size=4, cu_seqlens=a[2], cu_seqlens_q=a[3], **b),
        {"out": ((3, 2, 3), np.float32, None)},
    ),
    OutSpec(
        "nsa_block_scores_compressed-packed",
        "selection",
        _nsa_compressed_packed_args,
        lambda m, a, **b: m.nsa_block_scores_compressed(
            a[0], a[1], a[2], block_size=4, cu_seqlens_q=a[3], cu_seqlens_k=a[4], **b
        ),
        {"out": ((3, 2, 3), np.float32, None)},
    ),
    OutSpec(
        "infllm_block_scores-packed",
        "selection",
        _infllm_packed_args,
        lambda m, a, **b: m.infllm_block_scores(
            a[0], a[1], a[2], local_blocks=2, cu_seqlens_q=a[3], cu_seqlens_k=a[4], **b
        ),
        {"out": ((3, 2, 16), np.float32, None)},
    ),
    OutSpec(
        "infllm_select-packed",
        "selection",
        _infllm_packed_args,
        lambda m, a, **b: m.infllm_select(
            a[0], a[1], a[2], 4, local_blocks=2, cu_seqlens_q=a[3], cu_seqlens_k=a[4], **b
        ),
        {"out": ((3, 2, 4), np.int32, None)},
    ),
    OutSpec(
        "infllm_block_scores_paged-two",
        "selection",
        _infllm_paged2_args,
        lambda m, a, **b: m.infllm_block_scores_paged(*a, 2, local_blocks=2, **b),
        {"out": ((2, 2, 16), np.float32, None)},
    ),
    OutSpec(
        "infllm_select_paged-two",
        "selection",
        _infllm_paged2_args,
        lambda m, a, **b: m.infllm_select_paged(*a, 2, 4, local_blocks=2, **b),
        {"out": ((2, 2, 4), np.int32, None)},
    ),
    # Rows that end in -1 padding: MoBA's efficient topk = 1 (every block a query
    # sees, as wide as the most), Quest's sequences with fewer pages than the width.
    OutSpec(
        "moba_select-topk1",
        "selection",
        _moba_args,
        lambda m, a, **b: m.moba_select(*a, 1, 2, **b),
        {"out": ((3, 4, 5), np.int32, None)},
    ),
    OutSpec(
        "quest_select-batch-wide",
        "selection",
        _quest_batch_args,
        lambda m, a, **b: m.quest_select(*a, 3, 8, **b),
        {"out": ((2, 4, 3), np.int32, None)},
    ),
    OutSpec(
        "quest_select-batch-sglang",
        "selection",
        _quest_batch_args,
        lambda m, a, **b: m.quest_select(*a, 2, 8, variant="sglang", **b),
        {"out": ((2, 1, 5), np.int32, None)},
    ),
    OutSpec(
        "quest_select-batch-eval",
        "selection",
        _quest_batch_args,
        lambda m, a, **b: m.quest_select(*a, 2, 8, variant="eval", **b),
        {"out": ((2, 4, 3), np.int32, None)},
    ),
    OutSpec(
        "nsa_compress_keys-eq9",
        "selection",
        lambda: [np.random.default_rng(SEED + 19).standard_normal((100, 2, 4)).astype(np.float32)],
        lambda m, a, **b: m.nsa_compress_keys(*a, window="eq9", **b),
        {"out": ((5, 2, 4), np.float32, None)},
    ),
    OutSpec(
        "infllm_select_paged",
        "selection",
        _infllm_paged_args,
        lambda m, a, **b: m.infllm_select_paged(*a, 2, 4, local_blocks=2, **b),
        {"out": ((1, 2, 4), np.int32, None)},
    ),
]

CASES = [(s, impl) for s in SPECS for impl in s.impls]
IDS = [f"{s.id}-{impl}" for s, impl in CASES]


def _pick(result, index):
    return result if index is None else result[index]


def _sentinel(shape, dtype):
    b = np.empty(shape, dtype)
    b.view(np.uint8)[...] = 0xA5  # no result would be this pattern everywhere
    return b


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint8).tobytes()


def _snapshot(arrays):
    return [_bits(a) if isinstance(a, np.ndarray) else a for a in arrays]


@pytest.mark.parametrize("spec,impl", CASES, ids=IDS)
def test_out_is_returned_and_holds_what_the_call_without_it_returns(spec, impl):
    m = _mod(impl)
    want = spec.call(m, spec.args())
    bufs = {k: _sentinel(shape, dt) for k, (shape, dt, _) in spec.bufs.items()}
    got = spec.call(m, spec.args(), **bufs)
    for key, (_, _, index) in spec.bufs.items():
        assert _pick(got, index) is bufs[key], key
        expect = np.asarray(_pick(want, index)).astype(bufs[key].dtype)
        assert _bits(bufs[key]) == _bits(expect), key
    if impl == "native":  # natively, the no-out result has the buffer's dtype already
        for _key, (_, dt, index) in spec.bufs.items():
            assert np.asarray(_pick(want, index)).dtype == dt


@pytest.mark.parametrize("spec,impl", CASES, ids=IDS)
def test_an_out_of_the_wrong_dtype_is_a_type_error_and_stays_untouched(spec, impl):
    m = _mod(impl)
    for key, (shape, dt, _) in spec.bufs.items():
        wrong = np.int16 if np.dtype(dt).kind == "f" else np.float32
        buf = _sentinel(shape, wrong)
        args = spec.args()
        before = _bits(buf), _snapshot(args)
        with pytest.raises(TypeError, match=f"^{key} must"):
            spec.call(m, args, **{key: buf})
        assert (_bits(buf), _snapshot(args)) == before, key


@pytest.mark.parametrize("spec,impl", CASES, ids=IDS)
def test_an_out_of_the_wrong_shape_is_refused_naming_it_and_nothing_changes(spec, impl):
    m = _mod(impl)
    err = _errors(impl, spec.domain)
    for key, (shape, dt, _) in spec.bufs.items():
        # Transposed (or, 1-D, one axis more), and one slot too wide.
        moved = [s for s in (tuple(reversed(shape)), shape[1:] + shape[:1], shape + (1,)) if s != shape]
        wrong_shapes = [moved[0], shape[:-1] + (shape[-1] + 1,)]
        others = {k: _sentinel(s, d) for k, (s, d, _) in spec.bufs.items() if k != key}
        for wrong in wrong_shapes:
            buf = _sentinel(wrong, dt)
            args = spec.args()
            before = _bits(buf), _snapshot(args), [_bits(o) for o in others.values()]
            with pytest.raises(err) as e:
                spec.call(m, args, **{key: buf}, **others)
            assert e.value.argument == key, (wrong, str(e.value))
            after = _bits(buf), _snapshot(args), [_bits(o) for o in others.values()]
            assert after == before, (key, wrong)


def _aliased(array, shape, dtype):
    """``array``'s copy and a ``shape``/``dtype`` buffer over the same bytes."""
    out_bytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    blob = np.zeros(max(array.nbytes, out_bytes) + 8, np.uint8)
    inp = blob[: array.nbytes].view(array.dtype).reshape(array.shape)
    inp[...] = array
    return inp, blob[:out_bytes].view(dtype).reshape(shape)


ARRAY_CASES = [(s, impl) for s, impl in CASES if s.reads_arrays]


@pytest.mark.parametrize("spec,impl", ARRAY_CASES, ids=[f"{s.id}-{impl}" for s, impl in ARRAY_CASES])
def test_an_out_sharing_any_inputs_memory_is_refused_and_nothing_changes(spec, impl):
    m = _mod(impl)
    err = _errors(impl, spec.domain)
    n_arrays = [i for i, a in enumerate(spec.args()) if isinstance(a, np.ndarray) and a.size]
    assert n_arrays
    for key, (shape, dt, _) in spec.bufs.items():
        for i in n_arrays:
            args = spec.args()
            args[i], buf = _aliased(args[i], shape, dt)
            before = _snapshot(args)
            with pytest.raises(err) as e:
                spec.call(m, args, **{key: buf})
            assert e.value.argument == key, (i, str(e.value))
            assert _snapshot(args) == before, (key, i)


def _hostile(shape, dtype):
    """Buffers of ``shape`` holding ``dtype`` that no ``out=`` may be: (name,
    buffer, the exception class or None for the domain's error)."""
    swapped = _sentinel(shape, np.dtype(dtype).newbyteorder())
    yield "byte-swapped", swapped, TypeError
    ro = _sentinel(shape, dtype)
    ro.flags.writeable = False
    yield "read-only", ro, None
    yield "strided", _sentinel(shape[:-1] + (2 * shape[-1],), dtype)[..., ::2], None
    if len(shape) >= 2 and shape[0] > 1 and shape[-1] > 1:
        yield "fortran", np.asfortranarray(_sentinel(shape, dtype)), None


@pytest.mark.parametrize("spec,impl", CASES, ids=IDS)
def test_a_byte_swapped_read_only_strided_or_fortran_out_is_refused_and_untouched(spec, impl):
    # None of these is converted or written through a copy: the caller's buffer
    # is the one written, so one the kernels cannot write in place is refused.
    m = _mod(impl)
    for key, (shape, dt, _) in spec.bufs.items():
        for form, buf, err in _hostile(shape, dt):
            args = spec.args()
            before = _bits(buf), _snapshot(args)
            with pytest.raises(err or _errors(impl, spec.domain), match=f"^{key} ") as e:
                spec.call(m, args, **{key: buf})
            if err is None:
                assert e.value.argument == key, (form, str(e.value))
            assert (_bits(buf), _snapshot(args)) == before, (key, form)


@pytest.mark.parametrize("spec,impl", ARRAY_CASES, ids=[f"{s.id}-{impl}" for s, impl in ARRAY_CASES])
def test_an_input_given_as_a_memoryview_of_outs_memory_is_refused(spec, impl):
    # Every array argument, positions and boundaries (which the core reads
    # through a copy) included, passed as a memoryview over out's bytes.
    m = _mod(impl)
    err = _errors(impl, spec.domain)
    arrays = [i for i, a in enumerate(spec.args()) if isinstance(a, np.ndarray) and a.size]
    for key, (shape, dt, _) in spec.bufs.items():
        for i in arrays:
            args = spec.args()
            inp, buf = _aliased(args[i], shape, dt)
            args[i] = memoryview(inp)
            before = _bits(inp), _bits(buf)
            with pytest.raises(err, match="overlaps") as e:
                spec.call(m, args, **{key: buf})
            assert e.value.argument == key, (i, str(e.value))
            assert (_bits(inp), _bits(buf)) == before, (key, i)


# ---------------------------------------------------------------------------
# Which entry points take out=
# ---------------------------------------------------------------------------

# The public entry points that return arrays but take no ``out=``, each with why.
NO_OUT = {
    "Selector.row": "one row, as long as its position's candidates: no fixed shape to reuse",
}


def _returns_arrays_without_out():
    """The stub's public functions and methods that return ndarrays (alone or in a
    tuple) and take no ``out``."""
    import ast
    import pathlib

    import kvselect._core as core

    tree = ast.parse(pathlib.Path(core.__file__).with_name("_core.pyi").read_text())
    found = set()

    def walk(body, prefix=""):
        for node in body:
            if isinstance(node, ast.ClassDef):
                walk(node.body, f"{node.name}.")
            elif isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                params = {a.arg for a in node.args.args + node.args.kwonlyargs}
                if node.returns is not None and "NDArray" in ast.unparse(node.returns) and "out" not in params:
                    found.add(prefix + node.name)

    walk(tree.body)
    return found


def test_every_entry_point_returning_arrays_takes_out_unless_named_with_its_reason():
    # docs/conventions.md: a function that allocates its result also takes out=
    # (serving loops reuse buffers). A new entry point without it fails here.
    assert _returns_arrays_without_out() == set(NO_OUT)


# ---------------------------------------------------------------------------
# out= as a tuple: the functions returning several arrays (natively)
# ---------------------------------------------------------------------------


def _vslash_est_args():
    rng = np.random.default_rng(SEED + 12)
    return [rng.standard_normal((2, 64, 16)).astype(np.float32), rng.standard_normal((200, 1, 16)).astype(np.float32)]


def _vslash_sets_args():
    v, s = ks.vslash_select(*_vslash_est_args(), 40, 60)
    return [v, s]


def _vslash_batch_args():
    v, s = _vslash_sets_args()
    return [
        np.stack([v, v[::-1]]),
        np.stack([s, s[::-1]]),
        np.array([100, 64], np.int64),
        np.array([200, 200], np.int64),
    ]


def _quest_paged_args():
    rng = np.random.default_rng(SEED + 13)
    cache = rng.standard_normal((6, 4, 16)).astype(np.float32)
    return [cache, rng.permutation(6).astype(np.int32).reshape(2, 3), np.array([9, 12], np.int64)]


@dataclasses.dataclass
class TupleSpec:
    """A function whose ``out=`` is a tuple of buffers: ``call(args, out=...)``
    returns them as its tuple; ``shapes`` are theirs, all of ``dtype``."""

    id: str
    args: Callable[[], list]
    call: Callable[..., Any]
    shapes: list
    dtype: Any


TUPLE_SPECS = [
    TupleSpec(
        "quest_bounds",
        lambda: [np.random.default_rng(SEED + 14).standard_normal((40, 2, 8)).astype(np.float32)],
        lambda a, **b: ks.quest_bounds(*a, 8, **b),
        [(5, 2, 8)] * 2,
        np.float32,
    ),
    TupleSpec(
        "quest_bounds_paged",
        _quest_paged_args,
        lambda a, **b: ks.quest_bounds_paged(*a, 2, **b),
        [(6, 2, 8)] * 2,
        np.float32,
    ),
    TupleSpec(
        "vslash_select",
        _vslash_est_args,
        lambda a, **b: ks.vslash_select(*a, 40, 60, **b),
        [(2, 40), (2, 60)],
        np.int32,
    ),
    TupleSpec("vslash_scores", _vslash_est_args, lambda a, **b: ks.vslash_scores(*a, **b), [(2, 200)] * 2, np.float32),
    TupleSpec(
        "vslash_layout",
        _vslash_sets_args,
        lambda a, **b: ks.vslash_layout(*a, 200, **b),
        [(2, 4), (2, 4, 60), (2, 4), (2, 4, 40)],
        np.int32,
    ),
    TupleSpec(
        "vslash_layout_batch",
        _vslash_batch_args,
        lambda a, **b: ks.vslash_layout_batch(*a, **b),
        [(2, 2, 2), (2, 2, 2, 60), (2, 2, 2), (2, 2, 2, 40)],
        np.int32,
    ),
]
TUPLE_IDS = [t.id for t in TUPLE_SPECS]


@pytest.mark.parametrize("spec", TUPLE_SPECS, ids=TUPLE_IDS)
def test_a_tuple_out_is_returned_and_holds_what_the_call_without_it_returns(spec):
    want = spec.call(spec.args())
    bufs = tuple(_sentinel(shape, spec.dtype) for shape in spec.shapes)
    got = spec.call(spec.args(), out=bufs)
    assert len(got) == len(bufs)
    for g, b, w in zip(got, bufs, want):
        assert g is b
        assert w.dtype == spec.dtype and _bits(b) == _bits(w)


@pytest.mark.parametrize("spec", TUPLE_SPECS, ids=TUPLE_IDS)
def test_a_tuple_out_of_the_wrong_kind_count_dtype_or_shape_is_refused_and_untouched(spec):
    n = len(spec.shapes)
    good = [_sentinel(shape, spec.dtype) for shape in spec.shapes]
    wrong = np.int16 if np.dtype(spec.dtype).kind == "f" else np.float32
    for bufs in (good[0], list(good), tuple(good[:-1]), tuple(good) + (good[0].copy(),)):
        args = spec.args()
        before = [_bits(b) for b in good], _snapshot(args)
        with pytest.raises(TypeError, match=f"^out must be a tuple .* of {['', 'one', 'two', 'three', 'four'][n]} "):
            spec.call(args, out=bufs)
        assert ([_bits(b) for b in good], _snapshot(args)) == before
    for i, shape in enumerate(spec.shapes):
        for bad, err in (
            (_sentinel(shape, wrong), TypeError),
            (_sentinel(shape[:-1] + (shape[-1] + 1,), spec.dtype), ks.SelectionError),
        ):
            bufs = [_sentinel(s, spec.dtype) for s in spec.shapes]
            bufs[i] = bad
            args = spec.args()
            before = [_bits(b) for b in bufs], _snapshot(args)
            with pytest.raises(err, match="^out must") as e:
                spec.call(args, out=tuple(bufs))
            if err is ks.SelectionError:
                assert e.value.argument == "out"
            assert ([_bits(b) for b in bufs], _snapshot(args)) == before, (i, err)


@pytest.mark.parametrize("spec", TUPLE_SPECS, ids=TUPLE_IDS)
def test_a_tuple_out_sharing_an_inputs_or_another_buffers_memory_is_refused(spec):
    arrays = [i for i, a in enumerate(spec.args()) if isinstance(a, np.ndarray)]
    for j, shape in enumerate(spec.shapes):
        for i in arrays:
            args = spec.args()
            args[i], buf = _aliased(args[i], shape, spec.dtype)
            bufs = [_sentinel(s, spec.dtype) for s in spec.shapes]
            bufs[j] = buf
            before = _snapshot(args), [_bits(b) for b in bufs]
            with pytest.raises(ks.SelectionError) as e:
                spec.call(args, out=tuple(bufs))
            assert e.value.argument == "out", (i, j, str(e.value))
            assert (_snapshot(args), [_bits(b) for b in bufs]) == before
    # Every pair of buffers, the smaller over the larger's memory.
    for i, j in itertools.combinations(range(len(spec.shapes)), 2):
        sizes = [int(np.prod(spec.shapes[x])) for x in (i, j)]
        big, small = (i, j) if sizes[0] >= sizes[1] else (j, i)
        bufs = [_sentinel(s, spec.dtype) for s in spec.shapes]
        n = int(np.prod(spec.shapes[small]))
        bufs[small] = bufs[big].reshape(-1)[:n].reshape(spec.shapes[small])
        before = [_bits(b) for b in bufs]
        with pytest.raises(ks.SelectionError, match="overlaps") as e:
            spec.call(spec.args(), out=tuple(bufs))
        assert e.value.argument == "out" and [_bits(b) for b in bufs] == before, (i, j)


@pytest.mark.parametrize("spec", TUPLE_SPECS, ids=TUPLE_IDS)
def test_a_tuple_out_holding_a_hostile_buffer_or_viewed_by_a_memoryview_input_is_refused(spec):
    for j, shape in enumerate(spec.shapes):
        for form, bad, err in _hostile(shape, spec.dtype):
            bufs = [_sentinel(s, spec.dtype) for s in spec.shapes]
            bufs[j] = bad
            args = spec.args()
            before = [_bits(b) for b in bufs], _snapshot(args)
            with pytest.raises(err or ks.SelectionError, match="^out ") as e:
                spec.call(args, out=tuple(bufs))
            if err is None:
                assert e.value.argument == "out", (j, form, str(e.value))
            assert ([_bits(b) for b in bufs], _snapshot(args)) == before, (j, form)
        for i in [i for i, a in enumerate(spec.args()) if isinstance(a, np.ndarray) and a.size]:
            args = spec.args()
            inp, buf = _aliased(args[i], shape, spec.dtype)
            args[i] = memoryview(inp)
            bufs = [_sentinel(s, spec.dtype) for s in spec.shapes]
            bufs[j] = buf
            before = _bits(inp), [_bits(b) for b in bufs]
            with pytest.raises(ks.SelectionError, match="overlaps") as e:
                spec.call(args, out=tuple(bufs))
            assert e.value.argument == "out", (i, j, str(e.value))
            assert (_bits(inp), [_bits(b) for b in bufs]) == before, (i, j)


def test_a_tuple_out_of_dlpack_tensors_is_checked_buffer_against_buffer():
    # Each buffer is checked as the array it is read as (a DLPack tensor's view), so
    # two tensors over one buffer are refused as two ndarrays would be.
    from dlpack_producers import NumpyExport

    keys = np.random.default_rng(SEED + 18).standard_normal((40, 2, 8)).astype(np.float32)
    lo, hi = ks.quest_bounds(keys, 8)
    shared = _sentinel(lo.shape, np.float32)
    before = _bits(shared)
    with pytest.raises(ks.SelectionError, match="overlaps") as e:
        ks.quest_bounds(keys, 8, out=(NumpyExport(shared), NumpyExport(shared)))
    assert e.value.argument == "out" and _bits(shared) == before
    a, b = _sentinel(lo.shape, np.float32), _sentinel(hi.shape, np.float32)
    ks.quest_bounds(keys, 8, out=(NumpyExport(a), NumpyExport(b)))
    assert _bits(a) == _bits(lo) and _bits(b) == _bits(hi)


# A setting the rule refuses, with an ``out`` of the valid call's shape: the refusal names
# the setting (not ``out``, whose expected shape the bad setting would change), and ``out``
# and the inputs stay as they were. (spec id, the call with the bad setting, its name.)
BAD_SETTINGS = [
    ("moba_gates", lambda m, a, **b: m.moba_gates(*a, 0, **b), "block_size"),
    ("moba_select", lambda m, a, **b: m.moba_select(*a, 0, 2, **b), "topk"),
    ("moba_select", lambda m, a, **b: m.moba_select(*a, 2, 0, **b), "block_size"),
    ("moba_select-topk1", lambda m, a, **b: m.moba_select(*a, 1, 0, **b), "block_size"),
    ("moba_select_paged", lambda m, a, **b: m.moba_select_paged(*a, 2, 0, 2, **b), "topk"),
    ("moba_select_paged", lambda m, a, **b: m.moba_select_paged(*a, 2, 2, 0, **b), "block_size"),
    ("moba_select_paged", lambda m, a, **b: m.moba_select_paged(*a, 2, 1, 0, **b), "block_size"),
    ("nsa_compress_keys", lambda m, a, **b: m.nsa_compress_keys(*a, block_size=0, **b), "block_size"),
    ("nsa_block_scores", lambda m, a, **b: m.nsa_block_scores(*a, block_size=0, **b), "block_size"),
    ("nsa_select", lambda m, a, **b: m.nsa_select(*a, 0, block_size=4, **b), "block_counts"),
    (
        "nsa_block_scores_compressed",
        lambda m, a, **b: m.nsa_block_scores_compressed(*a, 0, block_size=4, **b),
        "seq_len",
    ),
    ("nsa_select_compressed", lambda m, a, **b: m.nsa_select_compressed(*a, 20, 0, block_size=4, **b), "block_counts"),
    ("nsa_select_compressed", lambda m, a, **b: m.nsa_select_compressed(*a, 0, 3, block_size=4, **b), "seq_len"),
    ("nsa_block_scores_paged", lambda m, a, **b: m.nsa_block_scores_paged(*a, 2, block_size=0, **b), "block_size"),
    ("nsa_select_paged", lambda m, a, **b: m.nsa_select_paged(*a, 2, 0, block_size=4, **b), "block_counts"),
    ("infllm_block_scores", lambda m, a, **b: m.infllm_block_scores(*a, 0, local_blocks=2, **b), "seq_len"),
    ("infllm_select", lambda m, a, **b: m.infllm_select(*a, 1024, 0, local_blocks=2, **b), "topk"),
    ("infllm_select", lambda m, a, **b: m.infllm_select(*a, 0, 4, local_blocks=2, **b), "seq_len"),
    ("infllm_select_paged", lambda m, a, **b: m.infllm_select_paged(*a, 2, 0, local_blocks=2, **b), "topk"),
    # A decode step's lengths size the paged forms' outputs: 0 or past int32, refused first.
    *[
        (
            spec_id,
            (lambda c, bad: lambda m, a, **b: c(m, [*a[:3], np.array(bad, np.int64), *a[4:]], **b))(c, bad),
            "seq_lens",
        )
        for spec_id, c in [
            ("moba_select_paged", lambda m, a, **b: m.moba_select_paged(*a, 2, 2, 2, **b)),
            ("nsa_block_scores_paged", lambda m, a, **b: m.nsa_block_scores_paged(*a, 2, block_size=4, **b)),
            (
                "infllm_block_scores_paged-two",
                lambda m, a, **b: m.infllm_block_scores_paged(*a, 2, local_blocks=2, **b),
            ),
        ]
        for bad in ([2**40, 5], [0, 5])
    ],
    ("quest_select", lambda m, a, **b: m.quest_select(*a, 40, 0, 8, **b), "page_budget"),
    ("quest_select-batch", lambda m, a, **b: m.quest_select(*a, 0, 8, **b), "page_budget"),
]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("spec_id,call,argument", BAD_SETTINGS, ids=[f"{i}-{a}" for i, _, a in BAD_SETTINGS])
def test_a_refused_setting_is_named_even_with_out_given_and_nothing_changes(spec_id, call, argument, impl):
    (spec,) = [s for s in SPECS if s.id == spec_id]
    ((shape, dt, _),) = spec.bufs.values()
    buf, args = _sentinel(shape, dt), spec.args()
    before = _bits(buf), _snapshot(args)
    with pytest.raises(_errors(impl, spec.domain)) as e:
        call(_mod(impl), args, out=buf)
    assert e.value.argument == argument, str(e.value)
    assert (_bits(buf), _snapshot(args)) == before


@pytest.mark.parametrize("impl", IMPLS)
def test_out_and_lse_out_sharing_memory_are_refused_naming_lse_out(impl):
    m = _mod(impl)
    q, k, v, pos = _attention_args()
    blob = np.zeros(3 * 4 * 3, np.float32)
    out, lse = blob.reshape(3, 4, 3), blob[:12].reshape(3, 4)
    with pytest.raises(_errors(impl, "selection")) as e:
        m.dense_attention(q, k, v, pos, out=out, lse_out=lse)
    assert e.value.argument == "lse_out"
    assert not blob.any()


# ---------------------------------------------------------------------------
# Scalar query_pos: a batch of one query
# ---------------------------------------------------------------------------


def _one_query(rng):
    q, k, v, _ = _qkv(rng, n=1)
    return q, k, v


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("p", [0, 4, 8, 20])
def test_a_scalar_query_pos_is_the_same_as_a_batch_of_one(impl, p):
    m = _mod(impl)
    rng = np.random.default_rng(SEED + p)
    q, k, v = _one_query(rng)
    sel = _selection(rng, n=1)
    for scalar in (p, np.int64(p), np.array(p), np.uint32(p)):
        cases = [
            (m.attention_probabilities(q, k, scalar), m.attention_probabilities(q, k, [p])),
            (m.dense_attention(q, k, v, scalar), m.dense_attention(q, k, v, [p])),
            (m.sparse_attention(q, k, v, scalar, sel), m.sparse_attention(q, k, v, [p], sel)),
        ]
        a = rng.random((1, 9))
        cases.append((m.oracle_topk(a, scalar, 3), m.oracle_topk(a, [p], 3)))
        for got, want in cases:
            got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
            for g, w in zip(got, want):
                if isinstance(w, np.ndarray):
                    assert g.shape == w.shape and _bits(g) == _bits(w)
                else:
                    assert g == w


@pytest.mark.parametrize("p", [0, 5, 31])
def test_a_scalar_query_pos_gives_selector_rows_of_one_query(p):
    for sel in (ks.Selector.dense(), ks.Selector.local(4), ks.Selector.sink_window(2, 3), ks.Selector.random(5, 7)):
        got, want = sel.rows(p), sel.rows([p])
        assert got.shape == (1, want.shape[1]) and np.array_equal(got, want)
    assert np.array_equal(ref.dense_rows(p), ref.dense_rows([p]))
    assert np.array_equal(ks.Selector.dense().rows(p), ref.dense_rows(p))


@pytest.mark.parametrize("impl", IMPLS)
def test_a_scalar_query_pos_for_many_queries_is_refused_naming_query_pos(impl):
    m = _mod(impl)
    q, k, v, _ = _qkv(np.random.default_rng(SEED))
    with pytest.raises(_errors(impl, "selection")) as e:
        m.attention_probabilities(q, k, 3)
    assert e.value.argument == "query_pos"
    with pytest.raises(_errors(impl, "selection")) as e:
        m.dense_attention(q, k, v, 3)
    assert e.value.argument == "query_pos"


@pytest.mark.parametrize("impl", IMPLS)
def test_a_negative_scalar_query_pos_is_refused_naming_query_pos(impl):
    m = _mod(impl)
    q, k, _ = _one_query(np.random.default_rng(SEED))
    with pytest.raises(_errors(impl, "selection")) as e:
        m.attention_probabilities(q, k, -1)
    assert e.value.argument == "query_pos"


# ---------------------------------------------------------------------------
# Shapes axis by axis
# ---------------------------------------------------------------------------


def test_a_transposed_selection_is_refused_naming_both_shapes():
    rng = np.random.default_rng(SEED)
    q, k, v, pos = _qkv(rng, n=2, hq=4, hkv=2)
    sel = _selection(rng, n=2, hkv=2)
    with pytest.raises(ks.SelectionError, match=r"n_queries=2, n_kv_heads=2.*got \[2, 4, 2\]") as e:
        ks.sparse_attention(q, k, v, pos, np.ascontiguousarray(sel.transpose(0, 2, 1)))
    assert e.value.argument == "selection"


@pytest.mark.parametrize("impl", IMPLS)
def test_a_transposed_dense_output_is_refused_naming_dense_and_both_shapes(impl):
    m = _mod(impl)
    s, d = _error_args()
    with pytest.raises(_errors(impl, "selection")) as e:
        m.output_relative_error_rows(s, np.ascontiguousarray(d.transpose(1, 0, 2)))
    assert e.value.argument == "dense"
    assert "[3, 2, 5]" in str(e.value).replace("(", "[").replace(")", "]") or "axis0=3" in str(e.value)
    assert "2, 3, 5" in str(e.value)


@pytest.mark.parametrize("impl", IMPLS)
def test_context_lens_of_another_length_is_refused_by_the_row_metrics(impl):
    m = _mod(impl)
    c, lens = _cand_args()
    for call in (lambda: m.segment_coverage_rows(c, lens[:4], 4), lambda: m.slots_used_rows(c, lens[:4])):
        with pytest.raises(_errors(impl, "witness")) as e:
            call()
        assert e.value.argument == "context_lens"


@pytest.mark.parametrize("impl", IMPLS)
def test_attention_mass_recall_rows_takes_the_attention_functions_3d_arrays(impl):
    m = _mod(impl)
    rng = np.random.default_rng(SEED + 7)
    q, k, v, pos = _qkv(rng)
    sel = _selection(rng)
    probs = ks.attention_probabilities(q, k, pos)
    got = m.attention_mass_recall_rows(sel, probs)
    flat = m.attention_mass_recall_rows(sel.reshape(-1, sel.shape[-1]), probs.reshape(-1, probs.shape[-1]))
    assert got.shape == (3, 4)
    assert np.array_equal(got.ravel(), flat, equal_nan=True)
    # A transposed attention array is another array: refused, naming it.
    with pytest.raises(_errors(impl, "witness")) as e:
        m.attention_mass_recall_rows(sel, np.ascontiguousarray(probs.transpose(1, 0, 2)))
    assert e.value.argument == "attention"


@pytest.mark.parametrize("impl", IMPLS)
def test_transposed_magnitudes_are_refused_by_check_topk(impl):
    m = _mod(impl)
    s = np.arange(12, dtype=np.float32).reshape(3, 4)
    rows = np.array([[3, 2], [3, 2], [3, 2]])
    mags = np.ones((4, 3), np.float32)
    with pytest.raises(_errors(impl, "selection")) as e:
        m.check_topk(s, rows, magnitudes=mags, rtol=0.1)
    assert e.value.argument == "magnitudes"


# ---------------------------------------------------------------------------
# Round trips: the checkers take what the producers return
# ---------------------------------------------------------------------------


def _block_case(rng):
    bs = int(rng.choice([1, 2, 4, 8]))
    cfg = ks.BlockSparseConfig(bs, int(rng.integers(1, 5)), int(rng.integers(0, 2)), int(rng.integers(0, 2)))
    n_pos = int(rng.integers(1, 12 * bs))
    nq, h, d = int(rng.integers(1, 5)), int(rng.integers(1, 4)), int(rng.integers(1, 6))
    q = rng.integers(-3, 4, (nq, h, d)).astype(np.float32)
    k = rng.integers(-3, 4, (n_pos, d)).astype(np.float32)
    pos = rng.integers(0, n_pos + bs, nq)
    visible = -(-np.minimum(pos + 1, n_pos) // bs)
    return q, k, pos, cfg, visible


@pytest.mark.parametrize("impl", IMPLS)
def test_check_blocks_accepts_block_sparse_select_against_block_scores_in_either_major(impl):
    m = _mod(impl)
    rng = np.random.default_rng(SEED + 11)
    corrupted = 0
    for _ in range(40):
        q, k, pos, cfg, visible = _block_case(rng)
        scores = ks.block_scores(q, k, pos, cfg)
        rows = ks.block_sparse_select(q, k, pos, cfg)
        assert m.check_blocks(scores, rows, visible, cfg)["wrong"] == 0
        hm = ks.block_sparse_select(q, k, pos, cfg, head_major=True)
        assert m.check_blocks(scores, hm, visible, cfg, head_major=True)["wrong"] == 0
        # Corrupt one (query, head) row: that row, and only it, is wrong.
        i, h = int(rng.integers(q.shape[0])), int(rng.integers(q.shape[1]))
        if visible[i] == 0:
            continue
        bad = rows.copy()
        bad[i, h, 0] = visible[i] + 3  # past the visible blocks
        rep = m.check_blocks(scores, bad, visible, cfg)
        assert rep["wrong"] == 1 and rep["details"][0]["row"] == i * q.shape[1] + h
        bad_hm = hm.copy()
        bad_hm[h, i, 0] = visible[i] + 3
        rep = m.check_blocks(scores, bad_hm, visible, cfg, head_major=True)
        assert rep["wrong"] == 1 and rep["details"][0]["row"] == i * q.shape[1] + h
        corrupted += 1
    assert corrupted > 10


def test_check_blocks_3d_reports_equal_the_reference_and_the_2d_form():
    rng = np.random.default_rng(SEED + 12)
    for _ in range(20):
        q, k, pos, cfg, visible = _block_case(rng)
        scores = ks.block_scores(q, k, pos, cfg)
        rows = ks.block_sparse_select(q, k, pos, cfg)
        rows[..., 0] = np.where(rng.random(rows.shape[:2]) < 0.3, 0, rows[..., 0])  # some wrong
        h = q.shape[1]
        native = ks.check_blocks(scores, rows, visible, cfg)
        assert native == ref.check_blocks(scores, rows, visible, cfg)
        flat = ks.check_blocks(
            scores.reshape(-1, scores.shape[-1]), rows.reshape(-1, rows.shape[-1]), np.repeat(visible, h), cfg
        )
        assert native == flat


@pytest.mark.parametrize("impl", IMPLS)
def test_check_blocks_refuses_3d_rows_of_the_other_major_or_per_row_visible_blocks(impl):
    m = _mod(impl)
    err = _errors(impl, "selection")
    rng = np.random.default_rng(SEED + 13)
    q = rng.integers(-3, 4, (3, 2, 4)).astype(np.float32)
    k = rng.integers(-3, 4, (16, 4)).astype(np.float32)
    pos, cfg = np.array([3, 9, 15]), ks.BlockSparseConfig(4, 2, 1, 1)
    scores, rows = ks.block_scores(q, k, pos, cfg), ks.block_sparse_select(q, k, pos, cfg)
    visible = -(-np.minimum(pos + 1, 16) // 4)
    with pytest.raises(err) as e:
        m.check_blocks(scores, rows, visible, cfg, head_major=True)  # [3, 2, w] read as [H=2, Q=3, w]
    assert e.value.argument == "rows"
    with pytest.raises(err) as e:
        m.check_blocks(scores, rows, np.repeat(visible, 2), cfg)
    assert e.value.argument == "visible_blocks"
    with pytest.raises(err) as e:  # the forms do not mix: the 3-D one of the pair is named
        m.check_blocks(scores.reshape(6, -1), rows, visible, cfg)
    assert e.value.argument == "rows"
    with pytest.raises(err) as e:
        m.check_blocks(scores, rows.reshape(6, -1), np.repeat(visible, 2), cfg)
    assert e.value.argument == "block_scores"
    with pytest.raises(err) as e:
        m.check_blocks(scores.reshape(6, -1), rows.reshape(6, -1), np.repeat(visible, 2), cfg, head_major=True)
    assert e.value.argument == "head_major"
    with pytest.raises(err) as e:
        m.check_blocks(scores, rows, visible, cfg, magnitudes=np.ones(scores.shape[::-1], np.float32))
    assert e.value.argument == "magnitudes"


@pytest.mark.parametrize("impl", IMPLS)
def test_check_topk_accepts_indexer_topk_against_indexer_scores(impl):
    m = _mod(impl)
    rng = np.random.default_rng(SEED + 14)
    for _ in range(20):
        nq, h, d, nk = (
            int(rng.integers(1, 5)),
            int(rng.integers(1, 4)),
            int(rng.integers(1, 6)),
            int(rng.integers(1, 40)),
        )
        q = rng.integers(-3, 4, (nq, h, d)).astype(np.float32)
        w = rng.integers(-2, 3, (nq, h)).astype(np.float32)
        k = rng.integers(-3, 4, (nk, d)).astype(np.float32)
        pos = rng.integers(0, nk + 3, nq)
        topk = int(rng.integers(1, 12))
        lens = np.minimum(pos + 1, nk)
        scores = ks.indexer_scores(q, w, k, pos)
        rows = ks.indexer_topk(q, w, k, pos, topk)
        assert m.check_topk(scores, rows, lens)["wrong"] == 0
        bad = rows.copy()
        i = int(rng.integers(nq))
        bad[i, 0] = lens[i] + 1  # not causal
        rep = m.check_topk(scores, bad, lens)
        assert rep["wrong"] == 1 and rep["details"][0]["row"] == i


@pytest.mark.parametrize("impl", IMPLS)
def test_check_witnesses_accepts_scatter_topology_witnesses_before_and_after(impl):
    m = _mod(impl)
    rng = np.random.default_rng(SEED + 15)
    for _ in range(20):
        rows, topk, S = int(rng.integers(1, 6)), int(rng.integers(1, 12)), int(rng.integers(0, 9))
        lens = rng.integers(0, 40, rows).astype(np.int32)
        before = rng.integers(-1, 40, (rows, topk)).astype(np.int32)
        after = before.copy()
        ks.scatter_topology_witnesses(after, lens, S)
        assert m.check_witnesses(before, after, lens, S)["wrong"] == 0
        # The serving layout is apply_topology_witnesses(keep = topk - S, S, S).
        if S:
            applied = ks.apply_topology_witnesses(before, lens, max(topk - S, 0), S, S)
            assert np.array_equal(applied, after)
        bad = after.copy()
        bad[0, -1] += 1
        assert m.check_witnesses(before, bad, lens, S)["wrong"] == 1


@pytest.mark.parametrize("impl", IMPLS)
def test_check_witnesses_refuses_with_witness_error(impl):
    m = _mod(impl)
    err = _errors(impl, "witness")
    b = np.array([[0, 5, -1, -1], [3, -1, -1, -1]], np.int32)
    a = b.copy()
    lens = np.array([8, 6], np.int32)
    for args, argument in [
        ((b, a, lens, 65), "num_segments"),
        ((b, a.reshape(4, 2), lens, 2), "after"),
        ((b, a, lens[:1], 2), "context_lens"),
        ((b, a, lens, -1), "num_segments"),
    ]:
        with pytest.raises(err) as e:
            m.check_witnesses(*args)
        assert e.value.argument == argument, args
        if impl == "native":
            assert not isinstance(e.value, ks.SelectionError)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("scale", [float("nan"), float("inf"), 1e300])
def test_a_refusal_after_the_buffers_are_checked_still_leaves_them_untouched(impl, scale):
    m = _mod(impl)
    q, k, v, pos = _attention_args()
    out, lse = _sentinel((3, 4, 3), np.float32), _sentinel((3, 4), np.float32)
    before = _bits(out), _bits(lse)
    with pytest.raises(_errors(impl, "selection")) as e:  # 1e300 is inf in float32
        m.dense_attention(q, k, v, pos, scale=scale, out=out, lse_out=lse)
    assert e.value.argument == "scale"
    assert (_bits(out), _bits(lse)) == before
    probs = _sentinel((3, 4, 9), np.float64)
    if np.isfinite(scale):
        return  # a finite float64 scale is a valid probabilities scale
    with pytest.raises(_errors(impl, "selection")) as e:
        m.attention_probabilities(q, k, pos, scale=scale, out=probs)
    assert e.value.argument == "scale" and _bits(probs) == _bits(_sentinel((3, 4, 9), np.float64))


@pytest.mark.parametrize("impl", IMPLS)
def test_check_topk_rows_are_2d_one_per_query_and_3d_rows_are_refused_naming_rows(impl):
    m = _mod(impl)
    s = np.arange(12, dtype=np.float32).reshape(3, 4)
    rows = np.array([[3, 2], [3, 2], [3, 2]])
    assert m.check_topk(s, rows)["wrong"] == 0
    with pytest.raises(_errors(impl, "selection")) as e:
        m.check_topk(s, rows[:, None, :])
    assert e.value.argument == "rows"


# ---------------------------------------------------------------------------
# One NaN
# ---------------------------------------------------------------------------

_NAN32 = np.uint32(0x7FC00000)
_NAN64 = np.uint64(0x7FF8000000000000)


def _nan_inputs():
    """Queries and keys whose first two dimensions hold NaNs of both signs
    and distinct payloads, crossed (a +NaN query against a -NaN key and the
    reverse): which one an FMA propagates depends on its operand order."""
    rng = np.random.default_rng(SEED)

    def planted(shape, first, second):
        a = rng.standard_normal(shape).astype(np.float32)
        bits = a.view(np.uint32)
        bits[..., 0] = first
        bits[..., 1] = second
        return a

    q = planted((4, 8, 16), 0x7FC00001, 0xFFC00003)
    k = planted((64, 2, 16), 0xFFC00002, 0x7FC00004)
    iq = planted((2, 8, 16), 0x7FC00001, 0xFFC00003)
    ik = planted((64, 16), 0xFFC00002, 0x7FC00004)
    v = rng.standard_normal((64, 2, 16)).astype(np.float32)
    return q, k, iq, ik, v


def _nan_producers():
    q, k, iq, ik, v = _nan_inputs()
    w = np.ones((2, 8), np.float32)
    pos = np.array([62, 63])
    qpos = np.arange(60, 64)
    sel = np.tile(np.arange(8, dtype=np.int32), (4, 2, 1))
    return {
        "indexer_scores": lambda: ks.indexer_scores(iq, w, ik, pos),
        "indexer_magnitudes": lambda: ks.indexer_magnitudes(iq, w, ik, pos),
        "quest_bounds": lambda: ks.quest_bounds(k, 16),
        "moba_gates": lambda: ks.moba_gates(q, k, 8),
        "nsa_block_scores": lambda: ks.nsa_block_scores(q, k, block_size=8),
        "nsa_compress_keys": lambda: ks.nsa_compress_keys(k, block_size=8),
        "dense_attention": lambda: ks.dense_attention(q, k, v, qpos),
        "sparse_attention": lambda: ks.sparse_attention(q, k, v, qpos, sel)[:2],
        "attention_probabilities": lambda: ks.attention_probabilities(q, k, qpos),
    }


@pytest.mark.parametrize("name", sorted(_nan_producers()))
def test_every_nan_a_float_output_holds_is_numpys_nan(name):
    """NaN inputs of both signs give NaN outputs, each exactly ``np.nan``'s
    bits: the same bytes at every SIMD level (CI runs this at each) and on
    every architecture (docs/conventions.md, "One NaN")."""
    got = _nan_producers()[name]()
    arrays = got if isinstance(got, tuple) else (got,)
    n_nan = 0
    for a in arrays:
        a = np.ascontiguousarray(a)
        assert a.dtype in (np.float32, np.float64), (name, a.dtype)
        nan = np.isnan(a)
        n_nan += int(nan.sum())
        bits = a.view(np.uint32 if a.dtype == np.float32 else np.uint64)[nan]
        canonical = _NAN32 if a.dtype == np.float32 else _NAN64
        assert np.all(bits == canonical), (name, sorted({hex(int(b)) for b in bits}))
    assert n_nan > 0, f"{name}: the planted NaNs reached no output"


def test_a_callers_out_buffer_gets_numpys_nan_too():
    _, _, iq, ik, _ = _nan_inputs()
    w = np.ones((2, 8), np.float32)
    out = np.full((2, 64), 7.0, np.float32)
    got = ks.indexer_scores(iq, w, ik, np.array([62, 63]), out=out)
    assert got is out
    nan = np.isnan(out)
    assert nan.any()
    assert np.all(out.view(np.uint32)[nan] == _NAN32)
