"""The conventions (docs/conventions.md) on the input side of every rule's entry
points beyond the indexer's and block selection's (those are
``test_conventions_inputs.py``): Quest, InfLLM-v2, NSA, MoBA, MInference's
vertical-slash, the eviction baselines, the attention functions and the
baseline selectors, DeepSeek-V4's compressed sets, the witness functions, the
metrics, the checkers, ``GlobalSlots`` and ``Selector.rows``. Native and (where
``kvselect.reference`` has a twin of the same keywords) reference alike.

Each entry point is one :class:`Spec` (several for its packed, scaled-fp8 or
other forms): the keyword arguments of a small valid call. From it, for every
array argument:

- bent (transposed, reshaped to the same size) it is refused with the rule's
  error class (``SelectionError`` / ``WitnessError``, the reference's mirror
  classes), ``argument`` naming it (or, in ``NAMED``, the argument it now
  disagrees with), and every buffer byte-identical after; ``ACCEPTED`` lists
  the bends that are documented as no refusal;
- of the wrong dtype kind (floats where integers are expected, complex where
  floats are) it is a ``TypeError`` naming it, with every buffer intact;
- in the other byte order, one byte off its alignment, strided or as a
  memoryview, it gives the bits of the aligned native-order call, keys and
  queries in every format (a paged cache in the other byte order is refused
  naming ``kv_cache``, as the paged indexer's is);

every ``out=`` (or ``lens_out=``, ``lse_out=``) of the wrong shape, dtype or
strides, or sharing memory with an input, is refused naming it with nothing
written; every buffer written in place (``quest_update``'s bounds,
``scatter_topology_witnesses``' rows) swapped, misaligned, read-only, strided
or sharing memory with an input is refused naming it. A reference twin that
cannot keep a convention yet is a strict xfail (``_reference_input_gaps.py``).
The last tests fail when a public native entry point is in neither catalogue.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import numpy as np
import pytest
import test_conventions_inputs
from _reference_input_gaps import (
    REFERENCE_ALIAS_GAPS,
    REFERENCE_BENT_GAPS,
    REFERENCE_INPLACE_GAPS,
    REFERENCE_KIND_GAPS,
    REFERENCE_LAYOUT_GAPS,
    REFERENCE_OUT_GAPS,
    REFERENCE_PAGED_GAPS,
)

import kvselect as ks
from kvselect import reference as ref
from kvselect import rules

ml_dtypes = pytest.importorskip("ml_dtypes")

SEED = 20261205
IMPLS = ["native", "reference"]


@dataclasses.dataclass(frozen=True)
class Spec:
    """One entry point's catalogue row.

    ``build`` gives the keyword arguments of a valid call (every array an
    argument of its own name). ``outs``
    maps each output-buffer keyword to the index of its array in the result
    (None: the result itself). ``inplace``: the arguments written in place.
    ``lowp``: the arguments read in a low-precision format, with the format
    keyword of each.
    """

    name: str
    build: Callable[[], Dict[str, Any]]
    label: str = ""
    error: str = "selection"
    twin: bool = True
    outs: Mapping[str, Optional[int]] = dataclasses.field(default_factory=dict)
    twin_outs: bool = True
    inplace: Tuple[str, ...] = ()
    lowp: Mapping[str, str] = dataclasses.field(default_factory=dict)
    call: Optional[Callable[..., Any]] = None  # (module, **arguments): a class's method

    @property
    def id(self) -> str:
        return self.name + (f"[{self.label}]" if self.label else "")


def _rng(salt=0):
    return np.random.default_rng(SEED + salt)


def _ints(shape, lo=-3, hi=4, salt=0):
    """Small integers as float32: every sum exact, no ties broken by rounding only."""
    return _rng(salt).integers(lo, hi, size=shape).astype(np.float32)


def _normal(shape, salt=0):
    return _rng(salt).standard_normal(shape).astype(np.float32)


def _fp8_scaled(keys):
    """``keys`` [num_blocks, page_size, row] as vLLM's scaled fp8 pages: uint8
    [num_blocks, page_size, row + 4], each page its ``page_size x row`` e4m3fn bytes, then
    one float32 scale per token."""
    n, bs, row = keys.shape
    scales = (_rng(99).random((n, bs)) + 0.5).astype(np.float32)
    fp8 = keys.astype(ml_dtypes.float8_e4m3fn).view(np.uint8).reshape(n, bs * row)
    pages = np.concatenate([fp8, scales.view(np.uint8).reshape(n, bs * 4)], axis=1)
    return np.ascontiguousarray(pages.reshape(n, bs, row + 4))


def _scaled(build):
    """``build``'s call over the same pages in the scaled fp8 layout."""

    def scaled():
        a = build()
        return dict(a, kv_cache=_fp8_scaled(a["kv_cache"]), page_layout="fp8_scaled")

    return scaled


# -- Quest -------------------------------------------------------------------

Q_KEYS = (40, 2, 8)  # tokens, n_kv_heads, d


def _quest_bounds():
    return {"keys": _normal(Q_KEYS, 1), "page_size": 16, "key_scale": (_rng(2).random(40) + 0.5).astype(np.float32)}


def _quest_bounds_packed():
    return dict(_quest_bounds(), cu_seqlens=np.array([0, 23, 40]))


def _quest_pages():
    kmin, kmax = ks.quest_bounds(_normal(Q_KEYS, 1))
    return kmin, kmax


def _quest_bounds_paged():
    return {
        "kv_cache": _normal((3, 16, 16), 3),
        "block_table": np.array([[2, 0, 1]], np.int32),
        "seq_lens": np.array([40]),
        "n_kv_heads": 2,
    }


def _quest_update():
    kmin, kmax = _quest_pages()
    return {"kmin": kmin, "kmax": kmax, "key": _normal((2, 8), 4), "pos": 37, "page_size": 16}


def _quest_scores():
    kmin, kmax = _quest_pages()
    return {"q": _normal((4, 8), 5), "kmin": kmin, "kmax": kmax}


def _quest_select():
    kmin, kmax = _quest_pages()
    return {"q": _normal((1, 4, 8), 5), "kmin": kmin, "kmax": kmax, "seq_lens": np.array([40]), "page_budget": 2}


# -- InfLLM-v2 -----------------------------------------------------------------

I_LEN = 200  # tokens: (200 - 32) // 16 + 1 = 11 compressed keys


def _infllm():
    return {
        "q": _normal((3, 4, 8), 6),
        "ck": _normal((11, 2, 8), 7),
        "seq_len": I_LEN,
        "ck_scale": (_rng(8).random(11) + 0.5).astype(np.float32),
        "local_blocks": 1,
    }


def _infllm_select():
    return dict(_infllm(), topk=3)


def _infllm_packed():
    return dict(
        _infllm(),
        q=_normal((5, 4, 8), 6),
        ck=_normal((14, 2, 8), 7),
        ck_scale=(_rng(8).random(14) + 0.5).astype(np.float32),
        seq_len=np.array([I_LEN, 64]),
        cu_seqlens_q=np.array([0, 3, 5]),
        cu_seqlens_k=np.array([0, 11, 14]),
    )


def _infllm_select_packed():
    return dict(_infllm_packed(), topk=3)


def _infllm_block_scores_paged():
    args = _infllm_select_paged()
    del args["topk"]
    return args


def _infllm_select_paged():
    return {
        "q": _normal((1, 4, 8), 6),
        "kv_cache": _normal((13, 16, 16), 9),
        "block_table": np.array([[3, 0, 12, 1, 5, 7, 2, 9, 11, 4, 6, 8, 10]], np.int32),
        "seq_lens": np.array([I_LEN]),
        "n_kv_heads": 2,
        "topk": 3,
        "local_blocks": 1,
    }


# -- NSA ---------------------------------------------------------------------


def _nsa():
    return {
        "q": _normal((3, 4, 8), 10),
        "k": _normal((40, 2, 8), 11),
        "block_size": 8,
        "k_scale": (_rng(12).random(40) + 0.5).astype(np.float32),
    }


def _nsa_select():
    return dict(_nsa(), block_counts=3)


def _nsa_packed():
    return dict(
        _nsa(),
        q=_normal((5, 4, 8), 10),
        k=_normal((56, 2, 8), 11),
        k_scale=(_rng(12).random(56) + 0.5).astype(np.float32),
        cu_seqlens=np.array([0, 40, 56]),
        cu_seqlens_q=np.array([0, 3, 5]),
    )


def _nsa_select_packed():
    return dict(_nsa_packed(), block_counts=3)


def _nsa_compress():
    a = _nsa()
    return {"k": a["k"], "block_size": 8, "k_scale": a["k_scale"]}


def _nsa_cached():
    # 40 tokens in blocks of 8: 5 compressed keys, what nsa_compress_keys gives.
    return {
        "q": _normal((3, 4, 8), 10),
        "ck": _normal((5, 2, 8), 13),
        "seq_len": 40,
        "block_size": 8,
        "ck_scale": (_rng(14).random(5) + 0.5).astype(np.float32),
    }


def _nsa_cached_select():
    return dict(_nsa_cached(), block_counts=3)


def _nsa_cached_packed():
    # 40 and 24 tokens in blocks of 8: 5 and 3 compressed keys.
    return {
        "q": _normal((3, 4, 8), 10),
        "ck": _normal((8, 2, 8), 13),
        "seq_len": np.array([40, 24]),
        "block_size": 8,
        "ck_scale": (_rng(14).random(8) + 0.5).astype(np.float32),
        "cu_seqlens_q": np.array([0, 2, 3]),
        "cu_seqlens_k": np.array([0, 5, 8]),
    }


def _nsa_cached_packed_select():
    return dict(_nsa_cached_packed(), block_counts=3)


def _nsa_paged():
    # 40 tokens in blocks of 8: 5 compressed keys, in pages of 2 (3 pages, shuffled).
    return {
        "q": _normal((1, 4, 8), 10),
        "kv_cache": _normal((4, 2, 16), 13),
        "block_table": np.array([[2, 0, 3]], np.int32),
        "seq_lens": np.array([40]),
        "n_kv_heads": 2,
        "block_size": 8,
    }


def _nsa_paged_select():
    return dict(_nsa_paged(), block_counts=3)


# -- MoBA --------------------------------------------------------------------


def _moba_gates():
    return {
        "q": _normal((40, 4, 8), 13),
        "k": _normal((40, 2, 8), 14),
        "block_size": 8,
        "key_scale": (_rng(15).random(40) + 0.5).astype(np.float32),
    }


def _moba_select():
    return dict(_moba_gates(), topk=3)


def _moba_select_packed():
    return dict(
        _moba_select(),
        q=_normal((56, 4, 8), 13),
        k=_normal((56, 2, 8), 14),
        key_scale=(_rng(15).random(56) + 0.5).astype(np.float32),
        cu_seqlens=np.array([0, 40, 56]),
    )


def _moba_select_paged():
    return {
        "q": _normal((1, 4, 8), 16),
        "kv_cache": _normal((3, 16, 16), 17),
        "block_table": np.array([[0, 1, 2]], np.int32),
        "seq_lens": np.array([40]),
        "n_kv_heads": 2,
        "topk": 3,
        "block_size": 8,
    }


# -- vertical-slash ----------------------------------------------------------


def _vslash_scores():
    return {
        "q": _normal((4, 40, 8), 18),
        "keys": _normal((40, 2, 8), 19),
        "key_scale": (_rng(20).random(40) + 0.5).astype(np.float32),
    }


def _vslash_select():
    return dict(_vslash_scores(), vertical_size=30, slash_size=50)


def _vs():
    v = np.array([[0, 3, 9, 17, 30], [1, 2, 5, 8, 33]], np.int32)
    s = np.array([[0, 1, 7], [0, 4, 12]], np.int32)
    return v, s


def _vslash_rows():
    v, s = _vs()
    return {"vertical": v, "slash": s, "seq_len": 40, "positions": np.array([5, 21, 39])}


def _vslash_layout():
    v, s = _vs()
    return {"vertical": v, "slash": s, "seq_len": 200}


def _vslash_layout_batch():
    return {
        "vertical": np.array([[[3, 40, 41]], [[0, 7, 70]]], np.int32),
        "slash": np.array([[[0, 70]], [[0, 5]]], np.int32),
        "q_seqlens": np.array([100, 90]),
        "kv_seqlens": np.array([120, 90]),
    }


# -- the eviction baselines ----------------------------------------------------


def _evict():
    return {"q": _normal((24, 3, 8), 21), "k": _normal((24, 8), 22), "scale": 0.5}


def _snapkv():
    return dict(_evict(), window=4, kernel=3)


def _tova():
    return {"q_last": _normal((3, 8), 23), "k": _normal((24, 8), 22), "scale": 0.5}


def _h2o():
    return dict(_evict(), budget=9, recent=3)


def _keep_top():
    return {"scores": _rng(24).random(24), "budget": 7}


# -- attention, the baseline selectors ---------------------------------------


def _attn():
    return {
        "q": _normal((3, 4, 8), 25),
        "k": _normal((12, 2, 8), 26),
        "v": _normal((12, 2, 6), 27),
        "query_pos": np.array([4, 8, 11]),
    }


def _probs():
    a = _attn()
    del a["v"]
    return a


def _sparse_attention():
    sel = np.array([[[0, 2, 3, -1], [1, 4, -1, -1]], [[5, 8, 0, 1], [2, 3, 6, -1]], [[11, 0, -1, -1], [9, 10, 7, 1]]])
    return dict(_attn(), selection=sel.astype(np.int32))


def _oracle():
    return {"attention": _rng(28).random((3, 12)), "query_pos": np.array([4, 8, 11]), "budget": 3}


# -- DeepSeek-V4's compressed sets --------------------------------------------


def _window():
    return {"query_pos": np.array([3, 9, 17]), "window_size": 4}


def _visible():
    return {"query_pos": np.array([3, 9, 17]), "compress_ratio": 4, "n_entries": 5}


def _entry_tokens():
    return {"entries": np.array([[0, 2, 3], [1, -1, 4]], np.int32), "compress_ratio": 4, "overlap": True}


def _expand():
    return {
        "entry_rows": np.array([[0, 1, -1], [2, 0, 1]], np.int32),
        "query_pos": np.array([9, 13]),
        "compress_ratio": 4,
    }


def _combine():
    return {
        "topk_indices": np.array([[0, 1], [1, -1], [0, 2], [1, 3]], np.int32),
        "query_start_loc": np.array([0, 3, 4]),
        "seq_lens": np.array([8, 4]),
        "gather_lens": np.array([8, 4]),
        "window_size": 4,
        "compress_ratio": 4,
        "topk": 2,
        "M": 20,
        "N": 8,
    }


# -- witnesses, metrics, checkers ---------------------------------------------


def _learned():
    return np.array([[0, 5, 9, -1], [3, -1, -1, -1], [1, 2, 7, 30]], np.int32)


def _witness_indices():
    return {"learned": _learned(), "context_lens": np.array([16, 8, 40]), "num_segments": 4}


def _apply_witnesses():
    return dict(_witness_indices(), learned_keep=2, max_replacements=2)


def _scatter():
    return {"topk_indices": _learned(), "context_lens": np.array([16, 8, 40]), "num_segments": 4}


def _segment_coverage():
    return {"candidates": np.array([0, 5, 9, 17]), "context_len": 40, "num_segments": 4}


def _mass_recall():
    return {"candidates": np.array([0, 5, 9, 17]), "attention_row": _rng(29).random(40)}


def _coverage_rows():
    return {"candidates": _learned(), "context_lens": np.array([16, 8, 40]), "num_segments": 4}


def _slots_rows():
    return {"candidates": _learned(), "context_lens": np.array([16, 8, 40])}


def _recall_rows():
    return {"candidates": _learned(), "attention": _rng(30).random((3, 40))}


def _rel_error():
    return {
        "sparse": _rng(31).random((3, 4, 6)).astype(np.float32),
        "dense": _rng(32).random((3, 4, 6)).astype(np.float32),
    }


def _check_topk():
    scores = _rng(33).random((3, 12)).astype(np.float32)
    rows = np.argsort(-scores, axis=1, kind="stable")[:, :4].astype(np.int32)
    return {"scores": scores, "rows": rows, "context_lens": np.array([12, 12, 12])}


def _check_witnesses():
    before = _learned()
    after = before.copy()
    ks.scatter_topology_witnesses(after, np.array([16, 8, 40]), 4)
    return {"before": before, "after": after, "context_lens": np.array([16, 8, 40]), "num_segments": 4}


def _check_blocks():
    cfg = ks.BlockSparseConfig(4, 2, 1, 1)
    q, k, pos = _ints((3, 2, 4), salt=34), _ints((12, 4), salt=35), np.array([5, 8, 11])
    scores = ks.block_scores(q, k, pos, cfg)
    rows = ks.block_sparse_select(q, k, pos, cfg)
    return {"block_scores": scores, "rows": rows, "visible_blocks": (pos // 4 + 1).astype(np.int32), "config": cfg}


def _global_slots():
    return {
        "block_table": np.array([[2, 0, 1], [3, 4, 5]], np.int32),
        "req_ids": np.array([0, 1, 1]),
        "block_size": 4,
        "rows": np.array([[9, 0, -1, 4], [12, 13, 17, -1], [20, 21, 22, 23]], np.int64),
    }


def _positions_through(m, rows, **a):
    return m.GlobalSlots(**a).positions(rows)


def _selector_rows():
    return {"query_pos": np.array([3, 5, 9])}


def _sink_window_rows(m, **a):
    return m.Selector.sink_window(1, 2).rows(**a)


SPECS = [
    # Quest
    Spec("quest_bounds", _quest_bounds, outs={"out": None}, twin_outs=False, lowp={"keys": "key_format"}),
    Spec("quest_bounds", _quest_bounds_packed, "packed", outs={"out": None}, twin_outs=False),
    Spec("quest_bounds_paged", _quest_bounds_paged, lowp={"kv_cache": "key_format"}),
    Spec("quest_bounds_paged", _scaled(_quest_bounds_paged), "fp8_scaled"),
    Spec("quest_update", _quest_update, inplace=("kmin", "kmax"), lowp={"key": "key_format"}),
    Spec("quest_scores", _quest_scores, lowp={"q": "query_format"}),
    Spec("quest_select", _quest_select, lowp={"q": "query_format"}),
    # InfLLM-v2
    Spec("infllm_block_scores", _infllm, lowp={"q": "query_format", "ck": "key_format"}),
    Spec("infllm_block_scores", _infllm_packed, "packed", lowp={"q": "query_format", "ck": "key_format"}),
    Spec("infllm_select", _infllm_select, lowp={"q": "query_format", "ck": "key_format"}),
    Spec("infllm_select", _infllm_select_packed, "packed", lowp={"q": "query_format", "ck": "key_format"}),
    Spec("infllm_block_scores_paged", _infllm_block_scores_paged, lowp={"kv_cache": "key_format"}),
    Spec("infllm_block_scores_paged", _scaled(_infllm_block_scores_paged), "fp8_scaled"),
    Spec("infllm_select_paged", _infllm_select_paged, lowp={"kv_cache": "key_format"}),
    Spec("infllm_select_paged", _scaled(_infllm_select_paged), "fp8_scaled"),
    # NSA
    Spec("nsa_block_scores", _nsa, lowp={"q": "query_format", "k": "key_format"}),
    Spec("nsa_block_scores", _nsa_packed, "packed", lowp={"q": "query_format", "k": "key_format"}),
    Spec("nsa_select", _nsa_select, lowp={"q": "query_format", "k": "key_format"}),
    Spec("nsa_select", _nsa_select_packed, "packed", lowp={"q": "query_format", "k": "key_format"}),
    Spec("nsa_compress_keys", _nsa_compress, lowp={"k": "key_format"}),
    Spec("nsa_block_scores_compressed", _nsa_cached, lowp={"q": "query_format", "ck": "key_format"}),
    Spec("nsa_select_compressed", _nsa_cached_select, lowp={"q": "query_format", "ck": "key_format"}),
    Spec("nsa_block_scores_compressed", _nsa_cached_packed, "packed", lowp={"q": "query_format", "ck": "key_format"}),
    Spec("nsa_select_compressed", _nsa_cached_packed_select, "packed", lowp={"q": "query_format", "ck": "key_format"}),
    Spec("nsa_block_scores_paged", _nsa_paged, lowp={"kv_cache": "key_format"}),
    Spec("nsa_block_scores_paged", _scaled(_nsa_paged), "fp8_scaled"),
    Spec("nsa_select_paged", _nsa_paged_select, lowp={"kv_cache": "key_format"}),
    Spec("nsa_select_paged", _scaled(_nsa_paged_select), "fp8_scaled"),
    # MoBA
    Spec("moba_gates", _moba_gates, lowp={"q": "query_format", "k": "key_format"}),
    Spec("moba_select", _moba_select, lowp={"q": "query_format", "k": "key_format"}),
    Spec("moba_select", _moba_select_packed, "packed", lowp={"q": "query_format", "k": "key_format"}),
    Spec("moba_select_paged", _moba_select_paged, lowp={"kv_cache": "key_format"}),
    Spec("moba_select_paged", _scaled(_moba_select_paged), "fp8_scaled"),
    # MInference vertical-slash
    Spec("vslash_scores", _vslash_scores, lowp={"keys": "key_format"}),
    Spec("vslash_select", _vslash_select, lowp={"keys": "key_format"}),
    Spec("vslash_rows", _vslash_rows),
    Spec("vslash_layout", _vslash_layout),
    Spec("vslash_layout_batch", _vslash_layout_batch),
    # the eviction baselines
    Spec("snapkv_scores", _snapkv),
    Spec("tova_scores", _tova),
    Spec("observed_attention_scores", _evict),
    Spec("h2o_keep", _h2o),
    Spec("keep_top", _keep_top),
    # attention, the baseline selectors
    Spec("attention_probabilities", _probs, outs={"out": None}),
    # (the reference's results are float64, its out= float32: its out= contract is its own)
    Spec("dense_attention", _attn, outs={"out": 0, "lse_out": 1}, twin_outs=False),
    Spec("sparse_attention", _sparse_attention, outs={"out": 0, "lse_out": 1}, twin_outs=False),
    Spec("oracle_topk", _oracle, outs={"out": None}),
    # DeepSeek-V4's compressed sets
    Spec("window_positions", _window, outs={"out": None}),
    Spec("visible_entries", _visible, outs={"out": None}),
    Spec("compressed_entry_tokens", _entry_tokens, outs={"out": None}),
    Spec("expand_entries", _expand, outs={"out": None}),
    Spec("combine_topk_swa_indices", _combine, outs={"out": 0, "lens_out": 1}),
    # the witness functions
    Spec("topology_witness_indices", _witness_indices, error="witness", outs={"out": None}),
    Spec("apply_topology_witnesses", _apply_witnesses, error="witness", outs={"out": None}),
    Spec("scatter_topology_witnesses", _scatter, error="witness", inplace=("topk_indices",)),
    # the metrics
    Spec("segment_coverage", _segment_coverage, error="witness"),
    Spec("attention_mass_recall", _mass_recall, error="witness"),
    Spec("segment_coverage_rows", _coverage_rows, error="witness", outs={"out": None}),
    Spec("slots_used_rows", _slots_rows, error="witness", outs={"out": None}),
    Spec("attention_mass_recall_rows", _recall_rows, error="witness", outs={"out": None}),
    Spec("output_relative_error", _rel_error),
    Spec("output_relative_error_rows", _rel_error, outs={"out": None}),
    # the checkers
    Spec("check_topk", _check_topk),
    Spec("check_witnesses", _check_witnesses, error="witness"),
    Spec("check_blocks", _check_blocks),
    # the classes: the slot map (its constructor's arrays and positions' rows), a selector's rows
    Spec("GlobalSlots", _global_slots, "positions", call=_positions_through),
    Spec("Selector", _selector_rows, "rows", twin=False, outs={"out": None}, call=_sink_window_rows),
]
BY_ID = {s.id: s for s in SPECS}
assert len(BY_ID) == len(SPECS)


def _args(spec: Spec) -> Dict[str, Any]:
    return spec.build()


def _fn(spec: Spec, impl: str):
    return getattr(ks if impl == "native" else ref, spec.name)


def _error(spec: Spec, impl: str):
    if impl == "native":
        return ks.WitnessError if spec.error == "witness" else ks.SelectionError
    return ref.ReferenceWitnessError if spec.error == "witness" else ref.ReferenceSelectionError


def _for_impl(spec: Spec, impl: str, a: Dict[str, Any]) -> Dict[str, Any]:
    """The arguments as ``impl`` takes them (the reference's own config class)."""
    if impl == "reference" and isinstance(a.get("config"), ks.BlockSparseConfig):
        c = a["config"]
        a = dict(a, config=ref.BlockSparseConfig(c.block_size, c.top_blocks, c.init_blocks, c.local_blocks))
    return a


def _call(spec: Spec, impl: str, a: Dict[str, Any], **kw):
    if spec.call is not None:
        return spec.call(ks if impl == "native" else ref, **_for_impl(spec, impl, a), **kw)
    return _fn(spec, impl)(**_for_impl(spec, impl, a), **kw)


def _impls(spec: Spec):
    return ["native"] + (["reference"] if spec.twin and hasattr(ref, spec.name) else [])


def _arrays(a: Mapping[str, Any]):
    return {k: v for k, v in a.items() if isinstance(v, np.ndarray)}


def _snapshot(arrays):
    return [(x, x.tobytes()) for x in arrays]


def _unchanged(snap):
    for x, b in snap:
        assert x.tobytes() == b, "a refused call changed a buffer"


# -- bent arrays --------------------------------------------------------------


def _bends(x: np.ndarray):
    """The ways ``x`` is bent: each (how, the bent array), each of another shape."""
    out = []
    if x.ndim >= 2 and x.T.shape != x.shape:
        out.append(("transposed", np.ascontiguousarray(x.T)))
    flat = (1, x.size) if (1, x.size) != x.shape else (x.size,)
    out.append(("reshaped", np.ascontiguousarray(x.reshape(flat))))
    return out


# Where a bent array is refused naming another argument: the one it now disagrees with
# (the first array read fixes the sizes; a later one that disagrees is the one named). A
# dict: the native and the reference name different ones (each names a real disagreement).
NAMED = {
    "quest_bounds": {("keys", "transposed"): "key_scale"},
    "quest_bounds[packed]": {("keys", "transposed"): "key_scale"},
    "quest_bounds_paged": {("kv_cache", "transposed"): "n_kv_heads"},
    "quest_update": {("kmin", "transposed"): "kmax"},
    "quest_scores": {("kmin", "transposed"): "kmax", ("kmin", "reshaped"): {"reference": "kmax"}},
    "quest_select": {("kmin", "transposed"): {"native": "kmax"}},
    "infllm_block_scores": {("q", "transposed"): "ck"},
    "infllm_block_scores[packed]": {
        ("q", "transposed"): {"native": "ck", "reference": "cu_seqlens_q"},
        ("ck", "transposed"): {"reference": "cu_seqlens_k"},
    },
    "infllm_select": {("q", "transposed"): "ck"},
    "infllm_select[packed]": {
        ("q", "transposed"): {"native": "ck", "reference": "cu_seqlens_q"},
        ("ck", "transposed"): {"reference": "cu_seqlens_k"},
    },
    "infllm_block_scores_paged": {("kv_cache", "transposed"): "n_kv_heads"},
    "infllm_select_paged": {("kv_cache", "transposed"): "n_kv_heads"},
    "nsa_block_scores": {("q", "transposed"): "k", ("k", "transposed"): {"reference": "k_scale"}},
    "nsa_block_scores[packed]": {
        ("q", "transposed"): {"native": "k", "reference": "cu_seqlens_q"},
        ("k", "transposed"): {"reference": "k_scale"},
    },
    "nsa_select": {("q", "transposed"): "k", ("k", "transposed"): {"reference": "k_scale"}},
    "nsa_select[packed]": {
        ("q", "transposed"): {"native": "k", "reference": "cu_seqlens_q"},
        ("k", "transposed"): {"reference": "k_scale"},
    },
    "nsa_compress_keys": {("k", "transposed"): "k_scale"},
    "nsa_block_scores_compressed": {("q", "transposed"): "ck"},
    "nsa_select_compressed": {("q", "transposed"): "ck"},
    "nsa_block_scores_compressed[packed]": {("q", "transposed"): "ck"},
    "nsa_select_compressed[packed]": {("q", "transposed"): "ck"},
    # (a transposed [16, 2, 4] cache has rows of 2 KV heads of d = 2: q's d disagrees)
    "nsa_block_scores_paged": {("kv_cache", "transposed"): "q"},
    "nsa_select_paged": {("kv_cache", "transposed"): "q"},
    "moba_gates": {("k", "transposed"): {"native": "q", "reference": "key_scale"}},
    "moba_select": {("k", "transposed"): {"native": "q", "reference": "key_scale"}},
    "moba_select[packed]": {("k", "transposed"): {"native": "q", "reference": "key_scale"}},
    "moba_select_paged": {("kv_cache", "transposed"): "n_kv_heads"},
    "vslash_scores": {("keys", "transposed"): "q"},
    "vslash_select": {("keys", "transposed"): "q"},
    "vslash_rows": {("vertical", "transposed"): "slash", ("vertical", "reshaped"): "slash"},
    "vslash_layout": {("vertical", "transposed"): "slash", ("vertical", "reshaped"): "slash"},
    "vslash_layout_batch": {("vertical", "transposed"): "slash"},
    "snapkv_scores": {("q", "transposed"): "k"},
    "tova_scores": {("q_last", "transposed"): "k", ("q_last", "reshaped"): "k"},
    "observed_attention_scores": {("q", "transposed"): "k"},
    "h2o_keep": {("q", "transposed"): "k"},
    "attention_probabilities": {("k", "transposed"): "q"},
    "dense_attention": {("k", "transposed"): "q"},
    "sparse_attention": {("k", "transposed"): "q"},
    "oracle_topk": {("attention", "transposed"): "query_pos", ("attention", "reshaped"): "query_pos"},
    "expand_entries": {("entry_rows", "transposed"): "query_pos", ("entry_rows", "reshaped"): "query_pos"},
    "combine_topk_swa_indices": {
        ("topk_indices", "transposed"): "query_start_loc",
        ("topk_indices", "reshaped"): "query_start_loc",
    },
    "topology_witness_indices": {("learned", "transposed"): "context_lens", ("learned", "reshaped"): "context_lens"},
    "apply_topology_witnesses": {("learned", "transposed"): "context_lens", ("learned", "reshaped"): "context_lens"},
    "scatter_topology_witnesses": {
        ("topk_indices", "transposed"): "context_lens",
        ("topk_indices", "reshaped"): "context_lens",
    },
    "segment_coverage_rows": {("candidates", "transposed"): "context_lens", ("candidates", "reshaped"): "context_lens"},
    "slots_used_rows": {("candidates", "transposed"): "context_lens", ("candidates", "reshaped"): "context_lens"},
    "attention_mass_recall_rows": {("candidates", "transposed"): "attention"},
    "output_relative_error": {("sparse", "transposed"): "dense", ("sparse", "reshaped"): "dense"},
    "output_relative_error_rows": {("sparse", "transposed"): "dense", ("sparse", "reshaped"): "dense"},
    "check_witnesses": {("before", "transposed"): "after", ("before", "reshaped"): "after"},
    "check_blocks": {("block_scores", "reshaped"): "rows", ("rows", "reshaped"): "block_scores"},
    "infllm_block_scores_paged[fp8_scaled]": {("kv_cache", "transposed"): "n_kv_heads"},
    "infllm_select_paged[fp8_scaled]": {("kv_cache", "transposed"): "n_kv_heads"},
    "GlobalSlots[positions]": {
        ("block_table", "reshaped"): "req_ids",
        ("rows", "transposed"): "req_ids",
        ("rows", "reshaped"): "req_ids",
    },
}


# Bends that are no refusal, as documented.
ACCEPTED = {
    ("GlobalSlots[positions]", "block_table", "transposed"): (
        "a [3, 2] table is a table of 3 requests: nothing tells it from a transposed one"
    ),
    ("compressed_entry_tokens", "entries", "transposed"): "entries may have any shape",
    ("compressed_entry_tokens", "entries", "reshaped"): "entries may have any shape",
    ("attention_mass_recall_rows", "candidates", "reshaped"): (
        "one candidate row for every attention row: n_rows a positive multiple of the candidate rows"
    ),
}


def _expected_argument(spec_id, key, how, impl):
    """The argument a refusal of ``key`` bent ``how`` names: itself, or (NAMED) the
    argument it now disagrees with."""
    named = NAMED.get(spec_id, {}).get((key, how), key)
    return named.get(impl, key) if isinstance(named, dict) else named


def _param(values, case_id, gaps):
    """A case, marked xfail(strict=True) when it is a known reference gap."""
    marks = [pytest.mark.xfail(strict=True, reason=gaps[case_id])] if case_id in gaps else []
    return pytest.param(*values, id=case_id, marks=marks)


def _bent_cases():
    cases = []
    for spec in SPECS:
        for key, x in _arrays(spec.build()).items():
            for how, _ in _bends(x):
                if (spec.id, key, how) in ACCEPTED:
                    continue
                for impl in _impls(spec):
                    case_id = f"{spec.id}-{key}-{how}-{impl}"
                    cases.append(_param((spec.id, key, how, impl), case_id, REFERENCE_BENT_GAPS))
    return cases


BENT = _bent_cases()


@pytest.mark.parametrize("spec_id,key,how,impl", BENT)
def test_a_bent_array_argument_is_refused_naming_it(spec_id, key, how, impl):
    spec = BY_ID[spec_id]
    a = _args(spec)
    a[key] = dict(_bends(a[key]))[how]
    snap = _snapshot(_arrays(a).values())
    with pytest.raises(_error(spec, impl)) as e:
        _call(spec, impl, a)
    argument = _expected_argument(spec_id, key, how, impl)
    assert e.value.argument == argument, str(e.value)
    if impl == "native":
        assert argument in str(e.value), str(e.value)  # the message names it too
    _unchanged(snap)


@pytest.mark.parametrize("spec_id,key,how", sorted(ACCEPTED), ids=["-".join(c) for c in sorted(ACCEPTED)])
@pytest.mark.parametrize("impl", IMPLS)
def test_a_documented_bend_is_accepted(spec_id, key, how, impl):
    spec = BY_ID[spec_id]
    if impl not in _impls(spec):
        pytest.skip("no reference twin")
    a = _args(spec)
    a[key] = dict(_bends(a[key]))[how]
    _call(spec, impl, a)


def _wrong_kind(x: np.ndarray):
    """``x`` with the same values in a dtype of the wrong kind: floats where integers are
    read, complex where floats are."""
    if x.dtype.kind in "iu":
        return x.astype(np.float64)
    return x.astype(np.complex64)


WRONG_KIND = [
    _param((spec.id, key, impl), f"{spec.id}-{key}-{impl}", REFERENCE_KIND_GAPS)
    for spec in SPECS
    for key in _arrays(spec.build())
    for impl in _impls(spec)
]


@pytest.mark.filterwarnings("ignore:Casting complex values")  # the reference's gaps, xfailed
@pytest.mark.parametrize("spec_id,key,impl", WRONG_KIND)
def test_an_array_of_the_wrong_dtype_kind_is_a_type_error_naming_it(spec_id, key, impl):
    spec = BY_ID[spec_id]
    a = _args(spec)
    a[key] = _wrong_kind(a[key])
    snap = _snapshot(_arrays(a).values())
    with pytest.raises(TypeError) as e:
        _call(spec, impl, a)
    assert key in str(e.value), str(e.value)
    _unchanged(snap)


# -- out= --------------------------------------------------------------------


def _result_arrays(spec: Spec, result):
    return {k: (result if i is None else result[i]) for k, i in spec.outs.items()}


OUT_SPECS = [s for s in SPECS if s.outs]


def _out_cases(kinds):
    return [
        _param((spec.id, name, kind, impl), f"{spec.id}-{name}-{kind}-{impl}", REFERENCE_OUT_GAPS)
        for spec in OUT_SPECS
        for name in spec.outs
        for kind in kinds
        for impl in _impls(spec)
        if impl == "native" or spec.twin_outs
    ]


def _filled(like: np.ndarray, shape=None, dtype=None):
    return np.full(like.shape if shape is None else shape, 7, dtype=like.dtype if dtype is None else dtype)


def _good_outs(spec: Spec, impl: str, a):
    """Each output buffer of the right shape and dtype, filled with 7s."""
    want = _result_arrays(spec, _call(spec, impl, a))
    return {k: (tuple(_filled(x) for x in v) if isinstance(v, tuple) else _filled(v)) for k, v in want.items()}


def _bad_out(like: np.ndarray, kind: str):
    if kind == "transposed":
        shape = like.shape[::-1] if like.shape[::-1] != like.shape else (like.shape[0] + 1,) + like.shape[1:]
        return _filled(like, shape)
    if kind == "extra-row":
        return _filled(like, (like.shape[0] + 1,) + like.shape[1:])
    if kind == "strided":
        wide = _filled(like, like.shape[:-1] + (2 * like.shape[-1],)) if like.ndim else _filled(like, (2,))
        return wide[..., ::2]
    assert kind == "dtype"
    wrong = {"f": np.int32 if like.itemsize == 4 else np.int64, "i": np.float32 if like.itemsize == 4 else np.float64}
    return _filled(like, dtype=wrong[like.dtype.kind])


@pytest.mark.parametrize("spec_id,name,kind,impl", _out_cases(["transposed", "extra-row", "strided", "dtype"]))
def test_a_bad_out_is_refused_naming_it_with_nothing_written(spec_id, name, kind, impl):
    spec = BY_ID[spec_id]
    a = _args(spec)
    outs = _good_outs(spec, impl, a)
    good = outs[name]
    outs[name] = tuple(_bad_out(x, kind) for x in good) if isinstance(good, tuple) else _bad_out(good, kind)
    buffers = [x for v in outs.values() for x in (v if isinstance(v, tuple) else (v,))]
    # the strided case's whole buffer too (its gaps must stay 7s)
    buffers += [x.base for x in buffers if isinstance(x.base, np.ndarray)]
    snap = _snapshot(buffers + list(_arrays(a).values()))
    expect = TypeError if kind == "dtype" else _error(spec, impl)
    with pytest.raises(expect) as e:
        _call(spec, impl, a, **outs)
    if kind == "dtype":
        assert str(e.value).startswith(f"{name} must"), str(e.value)
    else:
        assert e.value.argument == name, str(e.value)
    _unchanged(snap)


@pytest.mark.parametrize("spec_id,name,kind,impl", _out_cases(["good"]))
def test_a_good_out_is_returned_filled(spec_id, name, kind, impl):
    spec = BY_ID[spec_id]
    a = _args(spec)
    want = _result_arrays(spec, _call(spec, impl, a))
    outs = _good_outs(spec, impl, a)
    got = _result_arrays(spec, _call(spec, impl, a, **outs))
    if isinstance(outs[name], tuple):
        for o, g, w in zip(outs[name], got[name], want[name]):
            assert g is o and o.tobytes() == w.tobytes()
    else:
        assert got[name] is outs[name] and outs[name].tobytes() == want[name].tobytes()


# Positions and lengths, read through a copy: an out= sharing their memory is refused
# whatever their dtype (src/python/args/arrays.rs, `ndarray`).
POSITIONS_AND_LENGTHS = {
    "query_pos",
    "context_lens",
    "cu_seqlens",
    "cu_seqlens_q",
    "cu_seqlens_k",
    "seq_lens",
    "query_start_loc",
    "gather_lens",
    "positions",
}

ALIASED = [
    _param((spec.id, name, key, dtype, impl), f"{spec.id}-{name}-{key}-{dtype}-{impl}", REFERENCE_ALIAS_GAPS)
    for spec in OUT_SPECS
    for name in spec.outs
    for key in _arrays(spec.build())
    for dtype in ("as-given", "widened", "memoryview", "array-interface")
    # (a widened array read through a converted copy aliases nothing the core reads: the
    # conventions check "after conversion"; positions and lengths are refused either way)
    if dtype != "widened" or key in POSITIONS_AND_LENGTHS
    for impl in _impls(spec)
    if impl == "native" or spec.twin_outs
]


class _ArrayInterface:
    """An array NumPy reads through ``__array_interface__`` alone: no ndarray, no
    buffer, no DLPack (a view of ``a``'s memory all the same)."""

    def __init__(self, a: np.ndarray) -> None:
        self._a = a
        self.__array_interface__ = a.__array_interface__


@pytest.mark.parametrize("spec_id,name,key,dtype,impl", ALIASED)
def test_an_out_sharing_memory_with_an_input_is_refused_naming_it(spec_id, name, key, dtype, impl):
    # One byte buffer holds the input (its values, at the start) and the output over it,
    # whatever their dtypes: no input may alias an output, even one read through a
    # converted copy ("widened": int64 / float64, which the binding converts), whatever
    # object it comes as (an ndarray, a memoryview, an object NumPy reads through
    # __array_interface__).
    spec = BY_ID[spec_id]
    a = _args(spec)
    good = _good_outs(spec, impl, a)[name]
    first = good[0] if isinstance(good, tuple) else good
    x = a[key]
    if dtype == "widened":
        x = x.astype(np.int64 if x.dtype.kind in "iu" else np.float64)
    buf = np.zeros(max(x.nbytes, first.nbytes) + 64, np.uint8)
    a[key] = buf[: x.nbytes].view(x.dtype).reshape(x.shape)
    a[key][...] = x
    if dtype == "memoryview":
        a[key] = memoryview(a[key])
    elif dtype == "array-interface":
        a[key] = _ArrayInterface(a[key])
    over = buf[: first.nbytes].view(first.dtype).reshape(first.shape)
    outs = _good_outs(spec, impl, _args(spec))
    outs[name] = (over,) + tuple(good[1:]) if isinstance(good, tuple) else over
    before = buf.tobytes()
    with pytest.raises(_error(spec, impl)) as e:
        _call(spec, impl, a, **outs)
    assert e.value.argument == name, str(e.value)
    assert buf.tobytes() == before


# -- in-place buffers ---------------------------------------------------------

INPLACE = [
    _param((spec.id, key, kind, impl), f"{spec.id}-{key}-{kind}-{impl}", REFERENCE_INPLACE_GAPS)
    for spec in SPECS
    for key in spec.inplace
    for kind in ("swapped", "misaligned", "read-only", "strided")
    for impl in _impls(spec)
]


def _swapped(x):
    """The same values in the other byte order (a no-op for single bytes)."""
    return x.byteswap().view(x.dtype.newbyteorder("S"))


def _misaligned(x):
    """The same values in a view one byte off its dtype's alignment."""
    buf = bytearray(x.nbytes + 1)
    m = np.frombuffer(buf, x.dtype, count=x.size, offset=1).reshape(x.shape)
    m[...] = x
    return m


@pytest.mark.parametrize("spec_id,key,kind,impl", INPLACE)
def test_an_in_place_buffer_is_never_converted(spec_id, key, kind, impl):
    spec = BY_ID[spec_id]
    a = _args(spec)
    x = a[key]
    if kind == "swapped":
        a[key] = _swapped(x)
    elif kind == "misaligned":
        a[key] = _misaligned(x)
    elif kind == "read-only":
        a[key] = x.copy()
        a[key].flags.writeable = False
    else:
        wide = np.zeros(x.shape[:-1] + (2 * x.shape[-1],), x.dtype)
        wide[..., ::2] = x
        a[key] = wide[..., ::2]
    snap = _snapshot(_arrays(a).values())
    with pytest.raises((TypeError, _error(spec, impl))) as e:
        _call(spec, impl, a)
    assert key in str(e.value), str(e.value)
    if isinstance(e.value, ValueError):
        assert e.value.argument == key, str(e.value)
    _unchanged(snap)


INPLACE_ALIASED = [
    pytest.param(spec.id, buffer, key, dtype, impl, id=f"{spec.id}-{buffer}-{key}-{dtype}-{impl}")
    for spec in SPECS
    for buffer in spec.inplace
    for key in _arrays(spec.build())
    if key not in spec.inplace
    for dtype in ("as-given", "widened", "memoryview", "array-interface")
    if dtype != "widened" or key in POSITIONS_AND_LENGTHS
    for impl in _impls(spec)
]


@pytest.mark.parametrize("spec_id,buffer,key,dtype,impl", INPLACE_ALIASED)
def test_an_in_place_buffer_sharing_memory_with_an_input_is_refused(spec_id, buffer, key, dtype, impl):
    spec = BY_ID[spec_id]
    a = _args(spec)
    x, b = a[key], a[buffer]
    if dtype == "widened":
        x = x.astype(np.int64 if x.dtype.kind in "iu" else np.float64)
    mem = np.zeros(max(x.nbytes, b.nbytes) + 64, np.uint8)
    a[buffer] = mem[: b.nbytes].view(b.dtype).reshape(b.shape)
    a[buffer][...] = b
    a[key] = mem[: x.nbytes].view(x.dtype).reshape(x.shape)
    a[key][...] = x  # (the input's values over the buffer's first bytes)
    if dtype == "memoryview":
        a[key] = memoryview(a[key])
    elif dtype == "array-interface":
        a[key] = _ArrayInterface(a[key])
    before = mem.tobytes()
    with pytest.raises(_error(spec, impl)) as e:
        _call(spec, impl, a)
    assert e.value.argument == buffer, str(e.value)
    assert mem.tobytes() == before


# -- byte order and alignment ---------------------------------------------------

FORMATS = ["float32", "float16", "bfloat16", "float8_e4m3fn", "raw-bfloat16", "raw-float16", "raw-float8"]
MULTIBYTE = ["float32", "float16", "bfloat16", "raw-bfloat16", "raw-float16"]


def _encode(a, spec: Spec, fmt: str):
    """``a`` with its low-precision arguments in ``fmt`` (a raw format: the bits as
    uint16 / uint8 with the format keyword)."""
    a = dict(a)
    if fmt == "float32":
        return a
    raw = fmt.startswith("raw-")
    name = {"raw-bfloat16": "bfloat16", "raw-float16": "float16", "raw-float8": "float8_e4m3fn"}.get(fmt, fmt)
    dtype = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float8_e4m3fn": ml_dtypes.float8_e4m3fn}[name]
    for key, keyword in spec.lowp.items():
        x = a[key].astype(dtype)
        if raw:
            x = x.view(np.uint8 if x.itemsize == 1 else np.uint16)
            a[keyword] = name
        a[key] = x
    return a


def _bits(result):
    if isinstance(result, tuple):
        return tuple(_bits(r) for r in result)
    if isinstance(result, np.ndarray):
        return (result.dtype.str, result.shape, result.tobytes())
    if isinstance(result, Mapping):
        return tuple(sorted((k, _bits(v)) for k, v in result.items()))
    return result


def _read_only(spec: Spec, a):
    return [k for k in _arrays(a) if k not in spec.inplace]


def _strided(x):
    """The same values in a view of every other element of a wider buffer."""
    if x.ndim == 0:
        return x
    wide = np.zeros(x.shape[:-1] + (2 * x.shape[-1],), x.dtype)
    wide[..., ::2] = x
    return wide[..., ::2]


def _memoryview(x):
    """The same values as a memoryview (the buffer protocol; ml_dtypes' types have none)."""
    return memoryview(x) if x.dtype.kind in "iuf" and x.ndim else x


def _interface(x):
    """The same values as an object NumPy reads through ``__array_interface__`` alone
    (its typestr names no ml_dtypes type: those stay arrays)."""
    return _ArrayInterface(x) if x.dtype.kind in "iuf" and x.ndim else x


HOWS = {
    "swapped": _swapped,
    "misaligned": _misaligned,
    "strided": _strided,
    "memoryview": _memoryview,
    "array-interface": _interface,
}

LAYOUT = [
    _param((spec.id, fmt, how, impl), f"{spec.id}-{fmt}-{how}-{impl}", REFERENCE_LAYOUT_GAPS)
    for spec in SPECS
    for fmt in (FORMATS if spec.lowp else ["float32"])
    for how in HOWS
    if not (how == "swapped" and fmt not in MULTIBYTE)
    for impl in _impls(spec)
]


@pytest.mark.parametrize("spec_id,fmt,how,impl", LAYOUT)
def test_swapped_misaligned_strided_memoryview_or_interface_inputs_give_the_native_bits(spec_id, fmt, how, impl):
    spec = BY_ID[spec_id]
    a = _encode(_args(spec), spec, fmt)
    want = _bits(_call(spec, impl, a))
    b = _encode(_args(spec), spec, fmt)
    # every read-only array (a paged cache in the other byte order is refused: below)
    bent = [k for k in _read_only(spec, b) if not (how == "swapped" and k == "kv_cache")]
    if how == "swapped":
        bent = [k for k in bent if b[k].dtype.itemsize > 1]
    assert bent, "the case is real"
    for k in bent:
        b[k] = HOWS[how](b[k])
    if how == "swapped":
        assert not any(b[k].dtype.isnative for k in bent)
    assert _bits(_call(spec, impl, b)) == want


PAGED = [
    _param((spec.id, fmt, impl), f"{spec.id}-{fmt}-{impl}", REFERENCE_PAGED_GAPS)
    for spec in SPECS
    if "kv_cache" in spec.lowp  # (a scaled fp8 cache is bytes: no byte order)
    for fmt in MULTIBYTE
    for impl in _impls(spec)
]


@pytest.mark.parametrize("spec_id,fmt,impl", PAGED)
def test_a_paged_cache_in_the_other_byte_order_is_refused_naming_kv_cache(spec_id, fmt, impl):
    spec = BY_ID[spec_id]
    a = _encode(_args(spec), spec, fmt)
    a["kv_cache"] = _swapped(a["kv_cache"])
    snap = _snapshot(_arrays(a).values())
    with pytest.raises(_error(spec, impl)) as e:
        _call(spec, impl, a)
    assert e.value.argument == "kv_cache", str(e.value)
    assert "newbyteorder('=')" in str(e.value)
    _unchanged(snap)


FLOAT64_PAGED = [
    _param((spec.id, impl), f"{spec.id}-{impl}", REFERENCE_PAGED_GAPS)
    for spec in SPECS
    if "kv_cache" in spec.lowp
    for impl in _impls(spec)
]


@pytest.mark.parametrize("spec_id,impl", FLOAT64_PAGED)
def test_a_float64_paged_cache_is_a_type_error(spec_id, impl):
    # Pages are read in place, never converted: the twin refuses what the native call
    # cannot read, though NumPy could compute on it.
    spec = BY_ID[spec_id]
    a = _args(spec)
    assert a["kv_cache"].dtype == np.float32
    a["kv_cache"] = a["kv_cache"].astype(np.float64)
    snap = _snapshot(_arrays(a).values())
    with pytest.raises(TypeError, match="^kv_cache has dtype float64, and is read in place, never converted"):
        _call(spec, impl, a)
    _unchanged(snap)


# -- two faults at once: the twin names what the native binding names ------------


def _two_fault_calls():
    rng = np.random.default_rng(SEED + 7)
    q = rng.standard_normal((2, 4, 5)).astype(np.float32)
    cache = rng.standard_normal((6, 4, 10)).astype(np.float32)
    table, lens = rng.permutation(6).astype(np.int32).reshape(2, 3), np.array([9, 5])
    k = rng.standard_normal((40, 2, 4)).astype(np.float32)
    key = np.ones((1, 4), np.float32)
    mem = np.zeros(64, np.float32)
    ro = np.zeros((2, 1, 4), np.float32)
    ro.flags.writeable = False
    rows = np.array([[0, 5, -1, -1], [3, -1, -1, -1]], np.int32)
    ro_rows = rows.copy()
    ro_rows.flags.writeable = False

    def paged(m, c, **kw):
        return lambda: m.moba_select_paged(q, c, table, lens, 2, 2, block_size=4, **kw)

    return {
        # (the byte order before the dtype; the layout's name before the dtype)
        "paged-swapped-float64": (lambda m: paged(m, cache.astype(">f8")), "kv_cache"),
        "paged-float64-bad-layout": (lambda m: paged(m, cache.astype(np.float64), page_layout="x"), "page_layout"),
        # (k before the window's settings; the settings' values before the window's name)
        "compress-2d-k-eq9-stride-0": (
            lambda m: lambda: m.nsa_compress_keys(k[0], window="eq9", kernel_stride=0),
            "k",
        ),
        "compress-2d-k-window-eq8": (lambda m: lambda: m.nsa_compress_keys(k[0], window="eq8"), "k"),
        "compress-fla-kernel-size-negative": (lambda m: lambda: m.nsa_compress_keys(k, kernel_size=-1), "kernel_size"),
        "compress-eq8-stride-0": (
            lambda m: lambda: m.nsa_compress_keys(k, window="eq8", kernel_stride=0),
            "window",
        ),
        # (the key before the buffers; kmin whole before kmax; a page size of 0 after)
        "update-bad-key-read-only-kmin": (
            lambda m: lambda: m.quest_update(ro, np.zeros((2, 1, 4), np.float32), key.astype(np.int8), 0, 4),
            "key",
        ),
        "update-page-size-0-read-only-kmin": (
            lambda m: lambda: m.quest_update(ro, np.zeros((2, 1, 4), np.float32), key, 0, 0),
            "kmin",
        ),
        "update-kmin-over-key-read-only-kmax": (
            lambda m: lambda: m.quest_update(mem[:8].reshape(2, 1, 4), ro, mem[:4].reshape(1, 4), 0, 4),
            "kmin",
        ),
        # (the lengths before the buffer, even with the off switch)
        "scatter-2d-lens-read-only-rows": (
            lambda m: lambda: m.scatter_topology_witnesses(ro_rows, np.array([[8, 6]]), 2),
            "context_lens",
        ),
        "scatter-off-2d-lens": (
            lambda m: lambda: m.scatter_topology_witnesses(rows.copy(), np.array([[8, 6]]), 0),
            "context_lens",
        ),
    }


@pytest.mark.parametrize("case", list(_two_fault_calls()))
def test_with_two_faults_the_twin_names_what_the_native_binding_names(case):
    make, argument = _two_fault_calls()[case]
    named = []
    for m in (ks, ref):
        with pytest.raises((TypeError, ValueError)) as e:
            make(m)()
        named.append(getattr(e.value, "argument", None) or str(e.value).split(" ")[0])
    assert named == [argument, argument], (case, named)


# -- every entry point is in a catalogue ----------------------------------------

# test_conventions_inputs.py's entry points (its own list, so the two cannot drift).
INDEXER_AND_BLOCKS = set(test_conventions_inputs.ENTRY_POINTS)

# Public native names that take no array, so have no bad-input row here.
NO_ARRAYS = {
    "segment_of": "three integers",
    "random_null": "integers (a context length, a budget, a seed)",
    "locality_null": "integers (a context length, a budget)",
    "set_num_threads": "an integer",
    "get_num_threads": "no arguments",
    "simd_level": "no arguments",
    # A class of integers (GlobalSlots and the Selector have Specs above).
    "BlockSparseConfig": "a class of integers",
    # Not callables.
    "MAX_TOPOLOGY_SEGMENTS": "a constant",
    "MINIMAX_BLOCK_SIZE": "a constant",
    "__version__": "a constant",
    "KvselectError": "an exception class",
    "SelectionError": "an exception class",
    "WitnessError": "an exception class",
}


def _registered_names():
    """Every public native name, from the rule registry: each rule's ``api`` and
    the shared names."""
    names = {n for rule in rules.RULES for n in rule.api}
    names |= {n for _, group in rules.SHARED_API for n in group}
    return names


def test_every_public_native_entry_point_is_in_a_catalogue():
    registered = _registered_names()
    assert registered == set(ks.__all__), "the registry and kvselect.__all__ disagree (test_rules.py)"
    covered = INDEXER_AND_BLOCKS | {s.name for s in SPECS}
    missing = sorted(registered - covered - set(NO_ARRAYS))
    assert not missing, f"public entry points in no bad-input catalogue (and not exempt): {missing}"
    stale = sorted((covered | set(NO_ARRAYS)) - registered)
    assert not stale, f"catalogued names that are not public: {stale}"


@pytest.mark.parametrize(
    "name", sorted(n for n in NO_ARRAYS if callable(getattr(ks, n)) and inspect.isroutine(getattr(ks, n)))
)
def test_an_exempt_function_takes_no_array(name):
    # The exemption is for functions of scalars only: a new array parameter ends it
    # (``out=``, the buffer written, is not read).
    sig = inspect.signature(getattr(ks, name))
    scalars = {"token", "context_len", "num_segments", "budget", "seed", "n", "out"}
    arrays = [p for p in sig.parameters if p not in scalars]
    assert not arrays, f"{name} takes {arrays}: give it a Spec"


def test_every_spec_makes_a_valid_call():
    for spec in SPECS:
        for impl in _impls(spec):
            _call(spec, impl, _args(spec))
