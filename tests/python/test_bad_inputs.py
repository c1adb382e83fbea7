"""The bad-input catalogue: every kind of hostile argument, tried through the
public API, with the exception each one must give.

The whole catalogue runs in ONE subprocess (``python test_bad_inputs.py
--run``), which prints one JSON line per case as it goes; the tests here
check that the subprocess exited normally (a crash names the case it died
on: the first one without a line), that no case surfaced a
``PanicException``, that each case gave its documented outcome, and that
every refused in-place call left its buffer byte-identical.

``docs/bad-inputs.md`` is generated from this catalogue (``python
tests/python/test_bad_inputs.py --markdown > docs/bad-inputs.md``) and a
test checks that it is up to date.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import subprocess
import sys
from typing import Any, Callable, Optional

import numpy as np

try:  # pytest is only needed for the tests, not for ``--run``/``--markdown``.
    import pytest
except ImportError:  # pragma: no cover
    pytest = None

HERE = pathlib.Path(__file__).resolve()
DOC = HERE.parents[2] / "docs" / "bad-inputs.md"

ACCEPTED = "accepted"


@dataclasses.dataclass
class Case:
    id: str
    category: str
    call: str  # the call, as written in the table
    expect: str  # an exception name, or ACCEPTED
    build: Callable[[], dict]
    note: str = ""
    argument: Optional[str] = None  # the `argument` a kvselect error must name
    torch: bool = False


CASES: list[Case] = []


def case(id, category, call, expect, *, note="", argument=None, torch=False):
    def deco(fn):
        CASES.append(Case(id, category, call, expect, fn, note, argument, torch))
        return fn

    return deco


# ---------------------------------------------------------------------------
# Valid inputs every case starts from
# ---------------------------------------------------------------------------


def learned():
    return np.array([[0, 5, -1, -1], [3, -1, -1, -1]], dtype=np.int32)


def lens():
    return np.array([8, 6], dtype=np.int32)


def rng():
    return np.random.default_rng(0)


def index_q(batched=False):
    r = rng()
    shape = (2, 2, 3) if batched else (2, 3)
    return r.integers(-3, 4, size=shape).astype(np.float32)


def index_k():
    return rng().integers(-3, 4, size=(16, 3)).astype(np.float32)


def cfg():
    import kvselect as ks

    return ks.BlockSparseConfig(4, 2, 1, 1)


def qkv():
    r = rng()
    q = r.standard_normal((2, 2, 3)).astype(np.float32)
    k = r.standard_normal((6, 1, 3)).astype(np.float32)
    v = r.standard_normal((6, 1, 4)).astype(np.float32)
    return q, k, v, np.array([2, 5])


def selection():
    return np.array([[[0, 1, 2]], [[3, 4, 5]]], dtype=np.int32)


def same(reference: Callable[[], Any]) -> Callable[[Any], bool]:
    """A check that an accepted call returned what the canonical call does."""

    def check(result):
        want = reference()
        if isinstance(want, tuple):
            return all(_equal(a, b) for a, b in zip(result, want))
        return _equal(result, want)

    return check


def _equal(a, b):
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True)
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    return a == b


# ---------------------------------------------------------------------------
# The catalogue
# ---------------------------------------------------------------------------
# Each builder returns {"call": zero-argument callable, "watch": [arrays whose
# bytes must not change when the call is refused], "check": optional check
# of an accepted call's result}.

ks = None  # imported lazily in the subprocess / tests


def _ks():
    import kvselect

    return kvselect


# -- wrong dtype ------------------------------------------------------------


@case("float-learned", "wrong dtype", "`topology_witness_indices(learned.astype(float32), …)`", "TypeError")
def _():
    return {"call": lambda: _ks().topology_witness_indices(learned().astype(np.float32), lens(), 4)}


@case("float-lens", "wrong dtype", "`apply_topology_witnesses(learned, lens.astype(float64), …)`", "TypeError")
def _():
    return {"call": lambda: _ks().apply_topology_witnesses(learned(), lens().astype(float), 2, 4, 2)}


@case("bool-learned", "wrong dtype", "`topology_witness_indices(learned > 0, …)`", "TypeError")
def _():
    return {"call": lambda: _ks().topology_witness_indices(learned() > 0, lens(), 4)}


@case("complex-candidates", "wrong dtype", "`segment_coverage(candidates.astype(complex), 8, 4)`", "TypeError")
def _():
    return {"call": lambda: _ks().segment_coverage(np.array([1, 2], complex), 8, 4)}


@case("str-learned", "wrong dtype", "`topology_witness_indices(np.array([['a']]), …)`", "TypeError")
def _():
    return {"call": lambda: _ks().topology_witness_indices(np.array([["a"]]), [4], 4)}


@case("int64-buffer", "wrong dtype", "`scatter_topology_witnesses(buf.astype(int64), …)`", "TypeError")
def _():
    buf = learned().astype(np.int64)
    return {"call": lambda: _ks().scatter_topology_witnesses(buf, lens(), 2), "watch": [buf]}


@case("float32-buffer", "wrong dtype", "`scatter_topology_witnesses(buf.astype(float32), …)`", "TypeError")
def _():
    buf = learned().astype(np.float32)
    return {"call": lambda: _ks().scatter_topology_witnesses(buf, lens(), 2), "watch": [buf]}


@case("int64-out", "wrong dtype", "`apply_topology_witnesses(…, out=int64 array)`", "TypeError")
def _():
    out = np.full((2, 4), 7, np.int64)
    return {"call": lambda: _ks().apply_topology_witnesses(learned(), lens(), 2, 4, 2, out=out), "watch": [out]}


@case("int-keys", "wrong dtype", "`block_sparse_select(q, index_k.astype(int32), 9)`", "TypeError")
def _():
    return {"call": lambda: _ks().block_sparse_select(index_q(), index_k().astype(np.int32), 9, cfg())}


@case("float-query-pos-array", "wrong dtype", "`block_sparse_select(q3d, k, np.array([9.0, 15.0]))`", "TypeError")
def _():
    return {"call": lambda: _ks().block_sparse_select(index_q(True), index_k(), np.array([9.0, 15.0]), cfg())}


@case("float-selection", "wrong dtype", "`sparse_attention(q, k, v, pos, selection.astype(float32))`", "TypeError")
def _():
    q, k, v, p = qkv()
    return {"call": lambda: _ks().sparse_attention(q, k, v, p, selection().astype(np.float32))}


@case("int-q", "wrong dtype", "`dense_attention(q.astype(int32), k, v, pos)`", "TypeError")
def _():
    q, k, v, p = qkv()
    return {"call": lambda: _ks().dense_attention(q.astype(np.int32), k, v, p)}


@case(
    "float64-keys",
    "wrong dtype",
    "`block_sparse_select(q.astype(float64), k.astype(float16), 9)`",
    ACCEPTED,
    note="float64 queries converted once to float32; float16 keys read in place",
)
def _():
    ref = lambda: _ks().block_sparse_select(index_q(), index_k(), 9, cfg())  # noqa: E731
    return {
        "call": lambda: _ks().block_sparse_select(index_q().astype(np.float64), index_k().astype(np.float16), 9, cfg()),
        "check": same(ref),
    }


@case(
    "int64-learned",
    "wrong dtype",
    "`topology_witness_indices(learned.astype(int64), …)`",
    ACCEPTED,
    note="values fit int32: converted once",
)
def _():
    ref = lambda: _ks().topology_witness_indices(learned(), lens(), 4)  # noqa: E731
    return {
        "call": lambda: _ks().topology_witness_indices(learned().astype(np.int64), lens().astype(np.uint8), 4),
        "check": same(ref),
    }


# -- wrong ndim or shape ------------------------------------------------------


@case(
    "learned-1d",
    "wrong ndim/shape",
    "`topology_witness_indices(learned.ravel(), …)`",
    "WitnessError",
    argument="learned",
)
def _():
    return {"call": lambda: _ks().topology_witness_indices(learned().ravel(), lens(), 4)}


@case(
    "learned-0d",
    "wrong ndim/shape",
    "`topology_witness_indices(np.array(3, int32), …)`",
    "WitnessError",
    argument="learned",
)
def _():
    return {"call": lambda: _ks().topology_witness_indices(np.array(3, np.int32), lens(), 4)}


@case(
    "lens-2d",
    "wrong ndim/shape",
    "`apply_topology_witnesses(learned, lens[None], …)`",
    "WitnessError",
    argument="context_lens",
)
def _():
    return {"call": lambda: _ks().apply_topology_witnesses(learned(), lens()[None], 2, 4, 2)}


@case(
    "rows-mismatch",
    "wrong ndim/shape",
    "`apply_topology_witnesses(learned, lens[:1], …)`",
    "WitnessError",
    argument="context_lens",
)
def _():
    return {"call": lambda: _ks().apply_topology_witnesses(learned(), lens()[:1], 2, 4, 2)}


@case(
    "buffer-1d",
    "wrong ndim/shape",
    "`scatter_topology_witnesses(buf.ravel(), …)`",
    "WitnessError",
    argument="topk_indices",
)
def _():
    buf = learned().ravel()
    return {"call": lambda: _ks().scatter_topology_witnesses(buf, lens(), 2), "watch": [buf]}


@case(
    "buffer-3d",
    "wrong ndim/shape",
    "`scatter_topology_witnesses(buf[None], …)`",
    "WitnessError",
    argument="topk_indices",
)
def _():
    buf = learned()[None]
    return {"call": lambda: _ks().scatter_topology_witnesses(buf, lens(), 2), "watch": [buf]}


@case(
    "buffer-rows-mismatch",
    "wrong ndim/shape",
    "`scatter_topology_witnesses(buf, lens[:1], 2)`",
    "WitnessError",
    argument="context_lens",
)
def _():
    buf = learned()
    return {"call": lambda: _ks().scatter_topology_witnesses(buf, lens()[:1], 2), "watch": [buf]}


@case(
    "out-wrong-shape",
    "wrong ndim/shape",
    "`topology_witness_indices(…, out=np.empty((2, 3), int32))`",
    "WitnessError",
    argument="out",
)
def _():
    out = np.full((2, 3), 7, np.int32)
    return {"call": lambda: _ks().topology_witness_indices(learned(), lens(), 4, out=out), "watch": [out]}


@case("q-1d", "wrong ndim/shape", "`block_sparse_select(q.ravel(), k, 9)`", "SelectionError", argument="index_q")
def _():
    return {"call": lambda: _ks().block_sparse_select(index_q().ravel(), index_k(), 9, cfg())}


@case("q-4d", "wrong ndim/shape", "`block_sparse_select(q[None, None], k, 9)`", "SelectionError", argument="index_q")
def _():
    return {"call": lambda: _ks().block_sparse_select(index_q()[None, None], index_k(), 9, cfg())}


@case("k-3d", "wrong ndim/shape", "`block_sparse_select(q, k[None], 9)`", "SelectionError", argument="index_k")
def _():
    return {"call": lambda: _ks().block_sparse_select(index_q(), index_k()[None], 9, cfg())}


@case("d-mismatch", "wrong ndim/shape", "`block_sparse_select(q[:, :2], k, 9)`", "SelectionError", argument="index_q")
def _():
    return {"call": lambda: _ks().block_sparse_select(np.ascontiguousarray(index_q()[:, :2]), index_k(), 9, cfg())}


@case(
    "pos-array-for-one-query",
    "wrong ndim/shape",
    "`block_sparse_select(q2d, k, [9, 15])`",
    "SelectionError",
    argument="query_pos",
)
def _():
    return {"call": lambda: _ks().block_sparse_select(index_q(), index_k(), [9, 15], cfg())}


@case(
    "pos-wrong-length", "wrong ndim/shape", "`block_sparse_select(q3d, k, [9])`", "SelectionError", argument="query_pos"
)
def _():
    return {"call": lambda: _ks().block_sparse_select(index_q(True), index_k(), [9], cfg())}


@case(
    "packed-bad-cu",
    "wrong ndim/shape",
    "`block_sparse_select_packed(q, k, cu_seqlens=[0, 8, 15], …)`",
    "SelectionError",
    argument="cu_seqlens",
)
def _():
    return {
        "call": lambda: _ks().block_sparse_select_packed(index_q(True), index_k(), [0, 8, 15], [0, 1], [7, 7], cfg())
    }


def three_queries():
    """index_q ``[3 queries, 2 heads, 3]`` and its positions: the query-major
    ``[3, 2, width]`` and head-major ``[2, 3, width]`` shapes differ."""
    return rng().integers(-3, 4, size=(3, 2, 3)).astype(np.float32), [1, 4, 9]


@case(
    "head-major-out-query-major-shape",
    "wrong ndim/shape",
    "`block_sparse_select(q [3, 2, d], k, pos, head_major=True, out=np.empty((3, 2, 2), int32))`",
    "SelectionError",
    argument="out",
    note="head-major out is [n_kv_heads, n_queries, width]",
)
def _():
    q, p = three_queries()
    out = np.full((3, 2, 2), 7, np.int32)
    return {"call": lambda: _ks().block_sparse_select(q, index_k(), p, cfg(), head_major=True, out=out), "watch": [out]}


@case(
    "packed-head-major-out-query-major-shape",
    "wrong ndim/shape",
    "`block_sparse_select_packed(q [3, 2, d], k, [0, 16], …, head_major=True, out=np.empty((3, 2, 2), int32))`",
    "SelectionError",
    argument="out",
)
def _():
    q, p = three_queries()
    out = np.full((3, 2, 2), 7, np.int32)
    return {
        "call": lambda: _ks().block_sparse_select_packed(
            q, index_k(), [0, 16], [0, 0, 0], p, cfg(), head_major=True, out=out
        ),
        "watch": [out],
    }


@case("v-wrong-shape", "wrong ndim/shape", "`dense_attention(q, k, v[:5], pos)`", "SelectionError", argument="v")
def _():
    q, k, v, p = qkv()
    return {"call": lambda: _ks().dense_attention(q, k, v[:5], p)}


@case(
    "gqa-not-a-multiple",
    "wrong ndim/shape",
    "`dense_attention(q (3 heads), k (2 heads), v, pos)`",
    "SelectionError",
    argument="n_q_heads",
)
def _():
    r = rng()
    q = r.standard_normal((2, 3, 3)).astype(np.float32)
    k = r.standard_normal((6, 2, 3)).astype(np.float32)
    v = r.standard_normal((6, 2, 4)).astype(np.float32)
    return {"call": lambda: _ks().dense_attention(q, k, v, [2, 5])}


@case(
    "selection-wrong-shape",
    "wrong ndim/shape",
    "`sparse_attention(q, k, v, pos, selection[:1])`",
    "SelectionError",
    argument="selection",
)
def _():
    q, k, v, p = qkv()
    return {"call": lambda: _ks().sparse_attention(q, k, v, p, selection()[:1])}


@case(
    "oracle-pos-mismatch",
    "wrong ndim/shape",
    "`oracle_topk(attention [2, 6], [3], 2)`",
    "SelectionError",
    argument="query_pos",
)
def _():
    return {"call": lambda: _ks().oracle_topk(np.ones((2, 6)), [3], 2)}


@case(
    "recall-rows-not-multiple",
    "wrong ndim/shape",
    "`attention_mass_recall_rows(cand [2, 3], attention [3, 6])`",
    "WitnessError",
    argument="attention",
)
def _():
    return {"call": lambda: _ks().attention_mass_recall_rows(np.zeros((2, 3), np.int32), np.ones((3, 6)))}


@case(
    "rel-error-shape",
    "wrong ndim/shape",
    "`output_relative_error(a [2, 3], b [3, 2])`",
    "SelectionError",
    argument="dense",
)
def _():
    return {"call": lambda: _ks().output_relative_error(np.ones((2, 3), np.float32), np.ones((3, 2), np.float32))}


# -- Fortran order -----------------------------------------------------------


@case(
    "fortran-learned",
    "Fortran order",
    "`topology_witness_indices(np.asfortranarray(learned), …)`",
    ACCEPTED,
    note="read-only argument: copied to C order once",
)
def _():
    ref = lambda: _ks().topology_witness_indices(learned(), lens(), 4)  # noqa: E731
    return {"call": lambda: _ks().topology_witness_indices(np.asfortranarray(learned()), lens(), 4), "check": same(ref)}


@case(
    "fortran-keys",
    "Fortran order",
    "`block_sparse_select(q, np.asfortranarray(k), 9)`",
    ACCEPTED,
    note="copied to C order once",
)
def _():
    ref = lambda: _ks().block_sparse_select(index_q(), index_k(), 9, cfg())  # noqa: E731
    return {
        "call": lambda: _ks().block_sparse_select(index_q(), np.asfortranarray(index_k()), 9, cfg()),
        "check": same(ref),
    }


@case(
    "fortran-buffer",
    "Fortran order",
    "`scatter_topology_witnesses(np.asfortranarray(buf), …)`",
    "WitnessError",
    argument="topk_indices",
)
def _():
    buf = np.asfortranarray(learned())
    return {"call": lambda: _ks().scatter_topology_witnesses(buf, lens(), 2), "watch": [buf]}


@case(
    "fortran-out",
    "Fortran order",
    "`block_sparse_select(…, out=np.asfortranarray(out))`",
    "SelectionError",
    argument="out",
)
def _():
    out = np.asfortranarray(np.full((2, 2), 7, np.int32))
    return {"call": lambda: _ks().block_sparse_select(index_q(), index_k(), 9, cfg(), out=out), "watch": [out]}


# -- strided views -----------------------------------------------------------


@case("strided-learned", "strided view", "`topology_witness_indices(wide[:, ::2], …)`", ACCEPTED, note="copied once")
def _():
    wide = np.repeat(learned(), 2, axis=1)
    ref = lambda: _ks().topology_witness_indices(np.ascontiguousarray(wide[:, ::2]), lens(), 4)  # noqa: E731
    return {"call": lambda: _ks().topology_witness_indices(wide[:, ::2], lens(), 4), "check": same(ref)}


@case(
    "reversed-learned",
    "strided view",
    "`apply_topology_witnesses(learned[::-1], lens[::-1], …)`",
    ACCEPTED,
    note="negative strides: copied once",
)
def _():
    ref = lambda: _ks().apply_topology_witnesses(learned()[::-1].copy(), lens()[::-1].copy(), 2, 4, 2)  # noqa: E731
    return {"call": lambda: _ks().apply_topology_witnesses(learned()[::-1], lens()[::-1], 2, 4, 2), "check": same(ref)}


@case(
    "mla-value-view",
    "strided view",
    "`dense_attention(q, kv, kv[..., :2], pos)`",
    ACCEPTED,
    note="MLA values read in place",
)
def _():
    q, k, _, p = qkv()
    ref = lambda: _ks().dense_attention(q, k, np.ascontiguousarray(k[..., :2]), p)  # noqa: E731
    return {"call": lambda: _ks().dense_attention(q, k, k[..., :2], p), "check": same(ref)}


@case(
    "strided-buffer",
    "strided view",
    "`scatter_topology_witnesses(wide[:, ::2], …)`",
    "WitnessError",
    argument="topk_indices",
)
def _():
    wide = np.repeat(learned(), 2, axis=1)
    return {"call": lambda: _ks().scatter_topology_witnesses(wide[:, ::2], lens(), 2), "watch": [wide]}


@case(
    "reversed-buffer",
    "strided view",
    "`scatter_topology_witnesses(buf[::-1], …)`",
    "WitnessError",
    argument="topk_indices",
)
def _():
    buf = learned()
    return {"call": lambda: _ks().scatter_topology_witnesses(buf[::-1], lens(), 2), "watch": [buf]}


@case("strided-out", "strided view", "`apply_topology_witnesses(…, out=wide[:, ::2])`", "WitnessError", argument="out")
def _():
    wide = np.full((2, 8), 7, np.int32)
    return {
        "call": lambda: _ks().apply_topology_witnesses(learned(), lens(), 2, 4, 2, out=wide[:, ::2]),
        "watch": [wide],
    }


# -- read-only arrays ----------------------------------------------------------


def _ro(a):
    a.setflags(write=False)
    return a


@case(
    "readonly-learned",
    "read-only array",
    "`topology_witness_indices(read-only learned, …)`",
    ACCEPTED,
    note="read in place",
)
def _():
    ref = lambda: _ks().topology_witness_indices(learned(), lens(), 4)  # noqa: E731
    return {"call": lambda: _ks().topology_witness_indices(_ro(learned()), _ro(lens()), 4), "check": same(ref)}


@case(
    "readonly-buffer",
    "read-only array",
    "`scatter_topology_witnesses(read-only buf, …)`",
    "WitnessError",
    argument="topk_indices",
)
def _():
    buf = _ro(learned())
    return {"call": lambda: _ks().scatter_topology_witnesses(buf, lens(), 2), "watch": [buf]}


@case(
    "readonly-buffer-off-switch",
    "read-only array",
    "`scatter_topology_witnesses(read-only buf, lens, 0)`",
    "WitnessError",
    argument="topk_indices",
    note="checked even with the off switch",
)
def _():
    buf = _ro(learned())
    return {"call": lambda: _ks().scatter_topology_witnesses(buf, lens(), 0), "watch": [buf]}


@case("readonly-out", "read-only array", "`block_sparse_select(…, out=read-only)`", "SelectionError", argument="out")
def _():
    out = _ro(np.full((2, 2), 7, np.int32))
    return {"call": lambda: _ks().block_sparse_select(index_q(), index_k(), 9, cfg(), out=out), "watch": [out]}


@case(
    "frombuffer-bytes-buffer",
    "read-only array",
    "`scatter_topology_witnesses(np.frombuffer(bytes, int32).reshape(2, 4), …)`",
    "WitnessError",
    argument="topk_indices",
)
def _():
    buf = np.frombuffer(learned().tobytes(), np.int32).reshape(2, 4)
    return {"call": lambda: _ks().scatter_topology_witnesses(buf, lens(), 2), "watch": [buf]}


# -- aliasing ------------------------------------------------------------------


@case(
    "lens-inside-buffer",
    "aliasing",
    "`scatter_topology_witnesses(buf, buf[0, :2], 2)`",
    "WitnessError",
    argument="topk_indices",
)
def _():
    buf = np.array([[8, 6, -1, -1], [3, -1, -1, -1]], np.int32)
    return {"call": lambda: _ks().scatter_topology_witnesses(buf, buf[0, :2], 2), "watch": [buf]}


@case(
    "out-is-learned",
    "aliasing",
    "`apply_topology_witnesses(learned, lens, …, out=learned)`",
    "WitnessError",
    argument="out",
)
def _():
    buf = learned()
    return {"call": lambda: _ks().apply_topology_witnesses(buf, lens(), 2, 4, 2, out=buf), "watch": [buf]}


@case(
    "out-overlaps-learned",
    "aliasing",
    "`topology_witness_indices(big[:, :4], lens, 4, out=big[:, 2:6])`",
    "WitnessError",
    argument="out",
)
def _():
    big = np.zeros((2, 8), np.int32)
    big[:, :4] = learned()
    return {"call": lambda: _ks().topology_witness_indices(big[:, :4], lens(), 4, out=big[:, 2:6]), "watch": [big]}


@case(
    "out-views-keys",
    "aliasing",
    "`block_sparse_select(q, k, 9, out=k.view(int32)[…])`",
    "SelectionError",
    argument="out",
)
def _():
    k = index_k()
    out = k.view(np.int32).reshape(-1)[:4].reshape(2, 2)
    return {"call": lambda: _ks().block_sparse_select(index_q(), k, 9, cfg(), out=out), "watch": [k]}


# Aliasing through objects that are not ndarrays: the overlap is checked on the
# arrays handed to the core, after conversion, whatever the input came from.


@case(
    "lens-memoryview-of-buffer",
    "aliasing",
    "`scatter_topology_witnesses(buf, memoryview(buf.ravel()[:4]), 1)`",
    "WitnessError",
    argument="topk_indices",
)
def _():
    buf = np.array([[8, 6, 7, 5], [0, -1, -1, -1], [1, -1, -1, -1], [2, -1, -1, -1]], np.int32)
    return {"call": lambda: _ks().scatter_topology_witnesses(buf, memoryview(buf.ravel()[:4]), 1), "watch": [buf]}


@case(
    "learned-memoryview-of-out",
    "aliasing",
    "`apply_topology_witnesses(memoryview(out), lens, …, out=out)`",
    "WitnessError",
    argument="out",
)
def _():
    out = learned()
    return {"call": lambda: _ks().apply_topology_witnesses(memoryview(out), lens(), 2, 4, 2, out=out), "watch": [out]}


@case(
    "learned-bytearray-of-out",
    "aliasing",
    "`topology_witness_indices(memoryview(ba).cast('i', (2, 4)), lens, 4, out=np.frombuffer(ba, int32))`",
    "WitnessError",
    argument="out",
)
def _():
    ba = bytearray(learned().tobytes())
    out = np.frombuffer(ba, np.int32).reshape(2, 4)
    return {
        "call": lambda: _ks().topology_witness_indices(memoryview(ba).cast("i", (2, 4)), lens(), 4, out=out),
        "watch": [out],
    }


@case(
    "keys-memoryview-of-out",
    "aliasing",
    "`block_sparse_select(q, memoryview(k), 9, out=k.view(int32)[…])`",
    "SelectionError",
    argument="out",
)
def _():
    k = index_k()
    out = k.view(np.int32).reshape(-1)[:4].reshape(2, 2)
    return {"call": lambda: _ks().block_sparse_select(index_q(), memoryview(k), 9, cfg(), out=out), "watch": [k]}


@case(
    "packed-queries-memoryview-of-out",
    "aliasing",
    "`block_sparse_select_packed(memoryview(q), k, …, out=q.view(int32)[…])`",
    "SelectionError",
    argument="out",
)
def _():
    q = np.zeros((2, 2, 2), np.float32)
    out = q.view(np.int32)
    return {
        "call": lambda: _ks().block_sparse_select_packed(
            memoryview(q), index_k()[:, :2].copy(), [0, 16], [0, 0], [9, 15], cfg(), out=out
        ),
        "watch": [q],
    }


@case(
    "boundaries-memoryview-of-out",
    "aliasing",
    "`moba_select(q, k, 2, cu_seqlens=memoryview(b), out=b.view(int32)[…])`",
    "SelectionError",
    argument="out",
    note="boundaries and positions are read through a copy, but their memory is still an input's",
)
def _():
    r = rng()
    q = r.standard_normal((3, 4, 5)).astype(np.float32)
    k = r.standard_normal((9, 2, 5)).astype(np.float32)
    blob = np.zeros(3 * 4 * 2, np.int64)
    blob[:3] = [0, 4, 9]
    out = blob.view(np.int32)[: 3 * 4 * 2].reshape(3, 4, 2)
    return {
        "call": lambda: _ks().moba_select(
            q, k, 2, block_size=2, cu_seqlens=memoryview(blob[:3]), cu_seqlens_q=[0, 1, 3], out=out
        ),
        "watch": [blob],
    }


@case(
    "half-keys-out-views-keys",
    "aliasing",
    "`block_sparse_select(q, k16, 9, out=k16.view(int32)[…])` (float16 keys, read in place)",
    "SelectionError",
    argument="out",
)
def _():
    k16 = index_k().astype(np.float16)
    out = k16.reshape(-1).view(np.int32)[:4].reshape(2, 2)
    return {"call": lambda: _ks().block_sparse_select(index_q(), k16, 9, cfg(), out=out), "watch": [k16]}


@case(
    "packed-out-views-keys",
    "aliasing",
    "`block_sparse_select_packed(q, k, [0, 16], …, out=k.view(int32)[…])`",
    "SelectionError",
    argument="out",
)
def _():
    k = index_k()
    out = k.view(np.int32).reshape(-1)[:8].reshape(2, 2, 2)
    return {
        "call": lambda: _ks().block_sparse_select_packed(index_q(True), k, [0, 16], [0, 0], [9, 15], cfg(), out=out),
        "watch": [k],
    }


@case(
    "torch-view-of-buffer",
    "aliasing",
    "`scatter_topology_witnesses(buf, torch.from_numpy(buf).numpy()[0, :2], 2)`",
    "WitnessError",
    argument="topk_indices",
    torch=True,
)
def _():
    import torch

    buf = np.array([[8, 6, -1, -1], [3, -1, -1, -1]], np.int32)
    lens_view = torch.from_numpy(buf).numpy()[0, :2]
    return {"call": lambda: _ks().scatter_topology_witnesses(buf, lens_view, 2), "watch": [buf]}


# -- the lightning indexer --------------------------------------------------------


def indexer_args():
    r = rng()
    q = r.integers(-3, 4, size=(2, 3, 4)).astype(np.float32)
    w = r.integers(-2, 3, size=(2, 3)).astype(np.float32)
    k = r.integers(-3, 4, size=(16, 4)).astype(np.float32)
    return q, w, k, np.array([9, 15])


@case(
    "indexer-raw-view-no-format",
    "indexer formats",
    "`indexer_topk(q, w, k.astype(float16).view(uint16), pos, 4)`",
    "TypeError",
    note="a raw view needs key_format",
)
def _():
    q, w, k, p = indexer_args()
    return {"call": lambda: _ks().indexer_topk(q, w, k.astype(np.float16).view(np.uint16), p, 4)}


@case(
    "indexer-format-mismatch",
    "indexer formats",
    "`indexer_topk(q, w, k.astype(float16), pos, 4, key_format='bfloat16')`",
    "TypeError",
)
def _():
    q, w, k, p = indexer_args()
    return {"call": lambda: _ks().indexer_topk(q, w, k.astype(np.float16), p, 4, key_format="bfloat16")}


@case(
    "indexer-raw-bf16-view",
    "indexer formats",
    "`indexer_topk(q, w, bf16 bits as uint16, pos, 4, key_format='bfloat16')`",
    ACCEPTED,
    note="read in place: the same rows as the float32 keys",
)
def _():
    q, w, k, p = indexer_args()
    bits = (k.view(np.uint32) >> 16).astype(np.uint16)  # integers: exact in bfloat16
    ref = lambda: _ks().indexer_topk(q, w, k, p, 4)  # noqa: E731
    return {"call": lambda: _ks().indexer_topk(q, w, bits, p, 4, key_format="bfloat16"), "check": same(ref)}


@case(
    "indexer-scalar-key-scale",
    "indexer formats",
    "`indexer_topk(q, w, k, pos, 4, key_scale=0.5)`",
    ACCEPTED,
    note="a per-tensor scale: the same rows as key_scale=np.full(n_keys, 0.5)",
)
def _():
    q, w, k, p = indexer_args()
    full = np.full(len(k), 0.5, np.float32)
    ref = lambda: _ks().indexer_topk(q, w, k, p, 4, key_scale=full)  # noqa: E731
    return {"call": lambda: _ks().indexer_topk(q, w, k, p, 4, key_scale=0.5), "check": same(ref)}


@case(
    "indexer-key-scale-2d",
    "indexer formats",
    "`indexer_topk(q, w, k, pos, 4, key_scale=ones([16, 1]))`",
    "SelectionError",
    argument="key_scale",
    note="one number, or one per key: never another shape",
)
def _():
    q, w, k, p = indexer_args()
    c = np.ones((len(k), 1), np.float32)
    return {"call": lambda: _ks().indexer_topk(q, w, k, p, 4, key_scale=c), "watch": [q, w, k, c]}


@case(
    "indexer-d-mismatch",
    "indexer formats",
    "`indexer_topk(q, w, k[:, :3], pos, 4)`",
    "SelectionError",
    argument="index_q",
)
def _():
    q, w, k, p = indexer_args()
    return {"call": lambda: _ks().indexer_topk(q, w, np.ascontiguousarray(k[:, :3]), p, 4)}


@case(
    "indexer-segments-65",
    "indexer formats",
    "`indexer_topk(q, w, k, pos, 4, num_segments=65)`",
    "SelectionError",
    argument="num_segments",
)
def _():
    q, w, k, p = indexer_args()
    return {"call": lambda: _ks().indexer_topk(q, w, k, p, 4, num_segments=65)}


@case(
    "indexer-compress-ratio-0",
    "indexer formats",
    "`indexer_topk(q, w, k, pos, 4, compress_ratio=0, out=out)`",
    "SelectionError",
    argument="compress_ratio",
)
def _():
    q, w, k, p = indexer_args()
    out = np.full((len(q), 4), 7, np.int32)
    return {"call": lambda: _ks().indexer_topk(q, w, k, p, 4, compress_ratio=0, out=out), "watch": [q, w, k, out]}


@case(
    "indexer-compress-ratio-negative",
    "indexer formats",
    "`indexer_scores(q, w, k, pos, compress_ratio=-4)`",
    "SelectionError",
    argument="compress_ratio",
)
def _():
    q, w, k, p = indexer_args()
    return {"call": lambda: _ks().indexer_scores(q, w, k, p, compress_ratio=-4)}


@case(
    "indexer-out-aliases-keys",
    "indexer formats",
    "`indexer_topk(q, w, memoryview(k), pos, 4, out=k.view(int32)[…])`",
    "SelectionError",
    argument="out",
)
def _():
    q, w, k, p = indexer_args()
    out = k.view(np.int32).reshape(-1)[:8].reshape(2, 4)
    return {"call": lambda: _ks().indexer_topk(q, w, memoryview(k), p, 4, out=out), "watch": [k]}


@case(
    "indexer-packed-seq-id",
    "indexer formats",
    "`indexer_topk_packed(q, w, k, [0, 8, 16], seq_ids=[0, 2], …)`",
    "SelectionError",
    argument="seq_ids",
)
def _():
    q, w, k, p = indexer_args()
    return {"call": lambda: _ks().indexer_topk_packed(q, w, k, [0, 8, 16], [0, 2], [3, 5], 4)}


@case(
    "indexer-packed-out-aliases-weights",
    "indexer formats",
    "`indexer_topk_packed(q, memoryview(w), k, …, out=w.view(int32))`",
    "SelectionError",
    argument="out",
)
def _():
    q, w, k, p = indexer_args()
    return {
        "call": lambda: _ks().indexer_topk_packed(
            q, memoryview(w), k, [0, 8, 16], [0, 1], [3, 5], 3, out=w.view(np.int32)
        ),
        "watch": [w],
    }


@case(
    "indexer-paged-negative-block",
    "indexer formats",
    "`indexer_topk_paged(q, w, pages, block_table=[[-1, 0]], seq_lens=[3], …)`",
    "SelectionError",
    argument="block_table",
)
def _():
    q, w, k, p = indexer_args()
    pages = np.ascontiguousarray(k.reshape(8, 2, 4))
    return {"call": lambda: _ks().indexer_topk_paged(q, w, pages, np.array([[-1, 0]], np.int32), [3], [0, 0], p, 2)}


@case(
    "indexer-paged-block-past-cache",
    "indexer formats",
    "`indexer_topk_paged(q, w, pages (8), block_table=[[0, 8]], …)`",
    "SelectionError",
    argument="block_table",
)
def _():
    q, w, k, p = indexer_args()
    pages = np.ascontiguousarray(k.reshape(8, 2, 4))
    return {"call": lambda: _ks().indexer_topk_paged(q, w, pages, np.array([[0, 8]], np.int32), [3], [0, 0], p, 2)}


@case(
    "indexer-paged-short-row",
    "indexer formats",
    "`indexer_topk_paged(…, block_table=[[0]], seq_lens=[3])` (needs 2 blocks)",
    "SelectionError",
    argument="block_table",
)
def _():
    q, w, k, p = indexer_args()
    pages = np.ascontiguousarray(k.reshape(8, 2, 4))
    return {"call": lambda: _ks().indexer_topk_paged(q, w, pages, np.array([[0]], np.int32), [3], [0, 0], p, 2)}


@case(
    "indexer-paged-padding-not-read",
    "indexer formats",
    "`indexer_topk_paged(…, block_table=[[3, 1, 0, 0]], seq_lens=[4])`",
    ACCEPTED,
    note="vLLM's 0 padding past ⌈L / block_size⌉ is never read",
)
def _():
    q, w, k, p = indexer_args()
    pages = np.ascontiguousarray(k.reshape(8, 2, 4))
    ref = lambda: _ks().indexer_topk(q, w, np.concatenate([pages[3], pages[1]]), [3, 3], 2)  # noqa: E731
    return {
        "call": lambda: _ks().indexer_topk_paged(
            q, w, pages, np.array([[3, 1, 0, 0]], np.int32), [4], [0, 0], [3, 3], 2
        ),
        "check": same(ref),
    }


# -- block selection over a paged cache ---------------------------------------------


def paged():
    """A paged index-K cache of 6 pages of 4 tokens (``cfg().block_size``),
    d = 3; one sequence of 10 tokens in pages 2, 0, 5 (the table's fourth
    entry is not read); two queries at positions 4 and 9. Returns q
    ``[2, 2, 3]``, the cache, the table, seq_lens, seq_ids, query_pos."""
    cache = rng().integers(-3, 4, size=(6, 4, 3)).astype(np.float32)
    return index_q(True), cache, np.array([[2, 0, 5, 1]], np.int32), [10], [0, 0], [4, 9]


def paged_keys(cache):
    """The sequence's keys laid out contiguously: what the paged call must select over."""
    return np.concatenate([cache[2], cache[0], cache[5]])[:10]


def paged_out():
    return np.full((2, 2, 2), 7, np.int32)  # [n_queries, n_kv_heads, cfg().width]


def paged_refusal(**changes):
    """A paged call with some arguments replaced, an ``out=`` to fill, and
    every buffer watched."""
    q, cache, table, lens, sid, pos = paged()
    args = dict(index_q=q, kv_cache=cache, block_table=table, seq_lens=lens, seq_ids=sid, query_pos=pos, config=cfg())
    args.update(changes)
    out = paged_out()
    watch = [out] + [a for a in args.values() if isinstance(a, np.ndarray)]
    return {"call": lambda: _ks().block_sparse_select_paged(out=out, **args), "watch": watch}


@case(
    "paged-block-past-cache",
    "paged block selection",
    "`block_sparse_select_paged(q, pages (6), block_table=[[2, 6, 5, 1]], seq_lens=[10], …)`",
    "SelectionError",
    argument="block_table",
    note="an entry that is read must name a page",
)
def _():
    return paged_refusal(block_table=np.array([[2, 6, 5, 1]], np.int32))


@case(
    "paged-negative-block",
    "paged block selection",
    "`block_sparse_select_paged(…, block_table=[[2, 0, -1, 1]], seq_lens=[10])`",
    "SelectionError",
    argument="block_table",
)
def _():
    return paged_refusal(block_table=np.array([[2, 0, -1, 1]], np.int32))


@case(
    "paged-unread-entries-not-read",
    "paged block selection",
    "`block_sparse_select_paged(…, block_table=[[2, 0, 5, -7, 99]], seq_lens=[10])`",
    ACCEPTED,
    note="only the first ⌈L / block_size⌉ entries are read: the rest may hold anything",
)
def _():
    q, cache, _, lens, sid, pos = paged()
    ref = lambda: _ks().block_sparse_select(q, paged_keys(cache), pos, cfg())  # noqa: E731
    table = np.array([[2, 0, 5, -7, 99]], np.int32)
    return {"call": lambda: _ks().block_sparse_select_paged(q, cache, table, lens, sid, pos, cfg()), "check": same(ref)}


@case(
    "paged-short-row",
    "paged block selection",
    "`block_sparse_select_paged(…, block_table=[[2, 0]], seq_lens=[10])` (needs 3 blocks)",
    "SelectionError",
    argument="block_table",
)
def _():
    return paged_refusal(block_table=np.array([[2, 0]], np.int32))


@case(
    "paged-page-is-not-the-block",
    "paged block selection",
    "`block_sparse_select_paged(q, pages of 4 tokens, …, BlockSparseConfig(8, 2, 1, 1))`",
    "SelectionError",
    argument="kv_cache",
    note="the page size must be config.block_size",
)
def _():
    return paged_refusal(config=_ks().BlockSparseConfig(8, 2, 1, 1))


@case(
    "paged-seq-id-out-of-range",
    "paged block selection",
    "`block_sparse_select_paged(…, seq_lens=[10], seq_ids=[0, 1], …)`",
    "SelectionError",
    argument="seq_ids",
)
def _():
    return paged_refusal(seq_ids=np.array([0, 1], np.int32))


@case(
    "paged-seq-id-negative",
    "paged block selection",
    "`block_sparse_select_paged(…, seq_ids=[0, -1], …)`",
    "SelectionError",
    argument="seq_ids",
)
def _():
    return paged_refusal(seq_ids=np.array([0, -1], np.int32))


@case(
    "paged-seq-lens-wrong-length",
    "paged block selection",
    "`block_sparse_select_paged(…, block_table (1 row), seq_lens=[10, 3], …)`",
    "SelectionError",
    argument="block_table",
    note="one table row per sequence of seq_lens",
)
def _():
    return paged_refusal(seq_lens=np.array([10, 3], np.int32))


@case(
    "paged-seq-ids-wrong-length",
    "paged block selection",
    "`block_sparse_select_paged(q (2 queries), …, seq_ids=[0], …)`",
    "SelectionError",
    argument="seq_ids",
)
def _():
    return paged_refusal(seq_ids=np.array([0], np.int32))


@case(
    "paged-query-pos-wrong-length",
    "paged block selection",
    "`block_sparse_select_paged(q (2 queries), …, query_pos=[4])`",
    "SelectionError",
    argument="query_pos",
)
def _():
    return paged_refusal(query_pos=np.array([4], np.int64))


@case(
    "paged-int64-table",
    "paged block selection",
    "`block_sparse_select_paged(…, block_table.astype(int64), …)`",
    ACCEPTED,
    note="values fit int32: converted once",
)
def _():
    q, cache, table, lens, sid, pos = paged()
    ref = lambda: _ks().block_sparse_select(q, paged_keys(cache), pos, cfg())  # noqa: E731
    return {
        "call": lambda: _ks().block_sparse_select_paged(q, cache, table.astype(np.int64), lens, sid, pos, cfg()),
        "check": same(ref),
    }


@case(
    "paged-int64-table-past-int32",
    "paged block selection",
    "`block_sparse_select_paged(…, block_table=int64 [[2, 0, 5, 2**40]], seq_lens=[10])`",
    "SelectionError",
    argument="block_table",
    note="converted as a whole: even an unread entry must fit int32",
)
def _():
    return paged_refusal(block_table=np.array([[2, 0, 5, 2**40]], np.int64))


@case(
    "paged-float-table",
    "paged block selection",
    "`block_sparse_select_paged(…, block_table.astype(float32), …)`",
    "TypeError",
)
def _():
    return paged_refusal(block_table=np.array([[2, 0, 5, 1]], np.float32))


@case(
    "paged-cache-2d",
    "paged block selection",
    "`block_sparse_select_paged(q, pages.reshape(24, 3), …)`",
    "SelectionError",
    argument="kv_cache",
    note="[num_blocks, block_size, d]",
)
def _():
    q, cache, *_ = paged()
    return paged_refusal(kv_cache=cache.reshape(24, 3))


@case(
    "paged-cache-4d",
    "paged block selection",
    "`block_sparse_select_paged(q, pages[:, :, None], …)`",
    "SelectionError",
    argument="kv_cache",
)
def _():
    q, cache, *_ = paged()
    return paged_refusal(kv_cache=cache[:, :, None])


@case(
    "paged-cache-float64",
    "paged block selection",
    "`block_sparse_select_paged(q, pages.astype(float64), …)`",
    "TypeError",
    note="pages are read in place, never converted",
)
def _():
    q, cache, *_ = paged()
    return paged_refusal(kv_cache=cache.astype(np.float64))


@case(
    "paged-cache-raw-no-format",
    "paged block selection",
    "`block_sparse_select_paged(q, bf16 bits as uint16, …)`",
    "TypeError",
    note="a raw view needs key_format",
)
def _():
    q, cache, *_ = paged()
    return paged_refusal(kv_cache=(cache.view(np.uint32) >> 16).astype(np.uint16))


@case(
    "paged-cache-raw-bf16",
    "paged block selection",
    "`block_sparse_select_paged(q, bf16 bits as uint16, …, key_format='bfloat16')`",
    ACCEPTED,
    note="read in place: the same rows as the float32 pages",
)
def _():
    q, cache, table, lens, sid, pos = paged()
    bits = (cache.view(np.uint32) >> 16).astype(np.uint16)  # integers: exact in bfloat16
    ref = lambda: _ks().block_sparse_select(q, paged_keys(cache), pos, cfg())  # noqa: E731
    return {
        "call": lambda: _ks().block_sparse_select_paged(q, bits, table, lens, sid, pos, cfg(), key_format="bfloat16"),
        "check": same(ref),
    }


@case(
    "paged-key-format-mismatch",
    "paged block selection",
    "`block_sparse_select_paged(q, pages.astype(float16), …, key_format='bfloat16')`",
    "TypeError",
)
def _():
    q, cache, *_ = paged()
    return paged_refusal(kv_cache=cache.astype(np.float16), key_format="bfloat16")


@case(
    "paged-out-views-table",
    "paged block selection",
    "`block_sparse_select_paged(…, block_table=t [1, 8], …, out=t.reshape(2, 2, 2))`",
    "SelectionError",
    argument="out",
)
def _():
    q, cache, _, lens, sid, pos = paged()
    table = np.array([[2, 0, 5, 1, 0, 0, 0, 0]], np.int32)
    out = table.reshape(2, 2, 2)
    return {
        "call": lambda: _ks().block_sparse_select_paged(q, cache, table, lens, sid, pos, cfg(), out=out),
        "watch": [table, cache],
    }


@case(
    "paged-out-views-cache",
    "paged block selection",
    "`block_sparse_select_paged(q, pages16, …, out=pages16.view(int32)[…])` (float16 pages)",
    "SelectionError",
    argument="out",
)
def _():
    q, cache, table, lens, sid, pos = paged()
    pages16 = cache.astype(np.float16)
    out = pages16.reshape(-1).view(np.int32)[:8].reshape(2, 2, 2)
    return {
        "call": lambda: _ks().block_sparse_select_paged(q, pages16, table, lens, sid, pos, cfg(), out=out),
        "watch": [pages16, table],
    }


@case(
    "paged-out-views-cache-memoryview",
    "paged block selection",
    "`block_sparse_select_paged(q, memoryview(pages), …, out=pages.view(int32)[…])`",
    "SelectionError",
    argument="out",
)
def _():
    q, cache, table, lens, sid, pos = paged()
    out = cache.view(np.int32).reshape(-1)[:8].reshape(2, 2, 2)
    return {
        "call": lambda: _ks().block_sparse_select_paged(q, memoryview(cache), table, lens, sid, pos, cfg(), out=out),
        "watch": [cache, table],
    }


@case(
    "paged-head-major-out-query-major-shape",
    "paged block selection",
    "`block_sparse_select_paged(q [3, 2, d], …, head_major=True, out=np.empty((3, 2, 2), int32))`",
    "SelectionError",
    argument="out",
    note="head-major out is [n_kv_heads, n_queries, width]",
)
def _():
    q, p = three_queries()
    _, cache, table, lens, *_ = paged()
    out = np.full((3, 2, 2), 7, np.int32)
    return {
        "call": lambda: _ks().block_sparse_select_paged(
            q, cache, table, lens, [0, 0, 0], p, cfg(), head_major=True, out=out
        ),
        "watch": [out, cache, table],
    }


# -- batched positions_of_blocks -----------------------------------------------------


@case(
    "positions-4d",
    "batched positions",
    "`positions_of_blocks(np.zeros((1, 2, 3, 2), int32), 5, 10, cfg)`",
    "SelectionError",
    argument="blocks",
    note="1-D, [rows, width] or [n_queries, n_kv_heads, width]",
)
def _():
    return {"call": lambda: _ks().positions_of_blocks(np.zeros((1, 2, 3, 2), np.int32), 5, 10, cfg())}


@case(
    "positions-query-pos-wrong-length",
    "batched positions",
    "`positions_of_blocks(blocks [3, 2], [1, 2], 10, cfg)`",
    "SelectionError",
    argument="query_pos",
    note="an int, or one entry per row",
)
def _():
    return {"call": lambda: _ks().positions_of_blocks(np.zeros((3, 2), np.int32), [1, 2], 10, cfg())}


@case(
    "positions-head-major-query-pos-wrong-length",
    "batched positions",
    "`positions_of_blocks(blocks [2, 3, 2], [1, 2], 10, cfg, head_major=True)`",
    "SelectionError",
    argument="query_pos",
    note="one per query: axis 1 when head-major",
)
def _():
    return {
        "call": lambda: _ks().positions_of_blocks(np.zeros((2, 3, 2), np.int32), [1, 2], 10, cfg(), head_major=True)
    }


@case(
    "positions-n-positions-wrong-length",
    "batched positions",
    "`positions_of_blocks(blocks [3, 2], 5, [10, 10], cfg)`",
    "SelectionError",
    argument="n_positions",
)
def _():
    return {"call": lambda: _ks().positions_of_blocks(np.zeros((3, 2), np.int32), 5, [10, 10], cfg())}


@case(
    "positions-batched-past-int32",
    "batched positions",
    "`positions_of_blocks([[0, 2**31 - 1]], 2**62, 2**62, cfg)`",
    "SelectionError",
    argument="blocks",
    note="a covered position must fit int32",
)
def _():
    return {"call": lambda: _ks().positions_of_blocks(np.array([[0, 2**31 - 1]], np.int32), 2**62, 2**62, cfg())}


@case(
    "positions-batched-huge-block-clipped",
    "batched positions",
    "`positions_of_blocks([[0, 2**31 - 1]], 5, 10, cfg)`",
    ACCEPTED,
    note="the huge block covers nothing before the query: [0, 1, 2, 3, -1, …]",
)
def _():
    return {
        "call": lambda: _ks().positions_of_blocks(np.array([[0, 2**31 - 1]], np.int32), 5, 10, cfg()),
        "check": lambda r: r.dtype == np.int32 and r.tolist() == [[0, 1, 2, 3, -1, -1, -1, -1]],
    }


@case(
    "positions-of-a-selection",
    "batched positions",
    "`positions_of_blocks(block_sparse_select(q3d, k, [9, 15]), [9, 15], 16, cfg)`",
    ACCEPTED,
    note="[n_queries, n_kv_heads, width * block_size]: each row the 1-D call's, then -1",
)
def _():
    pos = [9, 15]

    def check(r):
        sel = _ks().block_sparse_select(index_q(True), index_k(), pos, cfg())
        if r.shape != (2, 2, 8) or r.dtype != np.int32:
            return False
        for i in range(2):
            for h in range(2):
                one = _ks().positions_of_blocks(sel[i, h], pos[i], 16, cfg())
                if r[i, h, : len(one)].tolist() != one.tolist() or not (r[i, h, len(one) :] == -1).all():
                    return False
        return True

    return {
        "call": lambda: _ks().positions_of_blocks(
            _ks().block_sparse_select(index_q(True), index_k(), pos, cfg()), pos, 16, cfg()
        ),
        "check": check,
    }


# -- empty arrays and zero-size dimensions ---------------------------------------


@case(
    "no-rows",
    "empty / zero-size",
    "`topology_witness_indices(np.empty((0, 4), int32), [], 4)`",
    ACCEPTED,
    note="shape (0, 4)",
)
def _():
    return {
        "call": lambda: _ks().topology_witness_indices(np.empty((0, 4), np.int32), np.empty(0, np.int32), 4),
        "check": lambda r: r.shape == (0, 4) and r.dtype == np.int32,
    }


@case(
    "zero-topk",
    "empty / zero-size",
    "`apply_topology_witnesses(np.empty((2, 0), int32), lens, 0, 4, 2)`",
    ACCEPTED,
    note="shape (2, 0)",
)
def _():
    return {
        "call": lambda: _ks().apply_topology_witnesses(np.empty((2, 0), np.int32), lens(), 0, 4, 2),
        "check": lambda r: r.shape == (2, 0),
    }


@case("empty-buffer", "empty / zero-size", "`scatter_topology_witnesses(np.empty((0, 0), int32), [], 4)`", ACCEPTED)
def _():
    return {
        "call": lambda: _ks().scatter_topology_witnesses(np.empty((0, 0), np.int32), np.empty(0, np.int32), 4),
        "check": lambda r: r is None,
    }


@case(
    "empty-list-learned",
    "empty / zero-size",
    "`topology_witness_indices([], [], 4)`",
    "WitnessError",
    argument="learned",
    note="an empty list is 1-D",
)
def _():
    return {"call": lambda: _ks().topology_witness_indices([], [], 4)}


@case(
    "no-keys",
    "empty / zero-size",
    "`block_sparse_select(q, np.empty((0, 3), float32), 9)`",
    ACCEPTED,
    note="all -1: nothing to select",
)
def _():
    return {
        "call": lambda: _ks().block_sparse_select(index_q(), np.empty((0, 3), np.float32), 9, cfg()),
        "check": lambda r: r.shape == (2, 2) and (r == -1).all(),
    }


@case("no-queries", "empty / zero-size", "`block_sparse_select(np.empty((0, 2, 3), float32), k, [])`", ACCEPTED)
def _():
    return {
        "call": lambda: _ks().block_sparse_select(
            np.empty((0, 2, 3), np.float32), index_k(), np.empty(0, np.int64), cfg()
        ),
        "check": lambda r: r.shape == (0, 2, 2),
    }


@case(
    "zero-d",
    "empty / zero-size",
    "`block_sparse_select(np.empty((2, 0)), np.empty((16, 0)), 9)`",
    "SelectionError",
    argument="d",
)
def _():
    return {
        "call": lambda: _ks().block_sparse_select(np.empty((2, 0), np.float32), np.empty((16, 0), np.float32), 9, cfg())
    }


@case(
    "zero-kv-heads",
    "empty / zero-size",
    "`dense_attention(q, k[:, :0], v[:, :0], pos)`",
    "SelectionError",
    argument="n_kv_heads",
)
def _():
    q, k, v, p = qkv()
    return {"call": lambda: _ks().dense_attention(q, k[:, :0], v[:, :0], p)}


@case(
    "attention-no-keys",
    "empty / zero-size",
    "`sparse_attention(q, k[:0], v[:0], pos, selection)`",
    ACCEPTED,
    note="every row empty: zeros, lse = -inf",
)
def _():
    q, k, v, p = qkv()

    def check(r):
        out, lse, empty = r
        return empty == 4 and (out == 0).all() and np.isneginf(lse).all()

    return {"call": lambda: _ks().sparse_attention(q, k[:0], v[:0], p, selection()), "check": check}


@case("empty-candidates", "empty / zero-size", "`attention_mass_recall([], row)`", ACCEPTED, note="0.0")
def _():
    return {"call": lambda: _ks().attention_mass_recall([], np.ones(4)), "check": lambda r: r == 0.0}


@case("empty-attention-row", "empty / zero-size", "`attention_mass_recall([1], [])`", ACCEPTED, note="NaN: no mass")
def _():
    return {"call": lambda: _ks().attention_mass_recall([1], np.empty(0)), "check": lambda r: r != r}


@case(
    "rel-error-empty", "empty / zero-size", "`output_relative_error_rows(np.empty((3, 0)), np.empty((3, 0)))`", ACCEPTED
)
def _():
    return {
        "call": lambda: _ks().output_relative_error_rows(np.empty((3, 0), np.float32), np.empty((3, 0), np.float32)),
        "check": lambda r: r.shape == (3,),
    }


@case(
    "rel-error-0d",
    "empty / zero-size",
    "`output_relative_error_rows(np.array(1, float32), np.array(1, float32))`",
    "SelectionError",
    argument="sparse",
)
def _():
    return {"call": lambda: _ks().output_relative_error_rows(np.array(1, np.float32), np.array(1, np.float32))}


# -- negative and huge integers ------------------------------------------------


@case(
    "segments-negative",
    "negative / huge integer",
    "`topology_witness_indices(learned, lens, -1)`",
    "WitnessError",
    argument="num_segments",
)
def _():
    return {"call": lambda: _ks().topology_witness_indices(learned(), lens(), -1)}


@case(
    "segments-zero",
    "negative / huge integer",
    "`topology_witness_indices(learned, lens, 0)`",
    "WitnessError",
    argument="num_segments",
)
def _():
    return {"call": lambda: _ks().topology_witness_indices(learned(), lens(), 0)}


@case(
    "segments-2**64",
    "negative / huge integer",
    "`apply_topology_witnesses(learned, lens, 2, 2**64, 2)`",
    "WitnessError",
    argument="num_segments",
)
def _():
    return {"call": lambda: _ks().apply_topology_witnesses(learned(), lens(), 2, 2**64, 2)}


@case(
    "segments-65",
    "negative / huge integer",
    "`apply_topology_witnesses(learned, lens, 2, 65, 2)`",
    "WitnessError",
    argument="num_segments",
)
def _():
    return {"call": lambda: _ks().apply_topology_witnesses(learned(), lens(), 2, 65, 2)}


@case(
    "keep-negative",
    "negative / huge integer",
    "`apply_topology_witnesses(learned, lens, -1, 4, 2)`",
    "WitnessError",
    argument="learned_keep",
)
def _():
    return {"call": lambda: _ks().apply_topology_witnesses(learned(), lens(), -1, 4, 2)}


@case(
    "keep-too-wide",
    "negative / huge integer",
    "`apply_topology_witnesses(learned, lens, 5, 4, 2)`",
    "WitnessError",
    argument="learned_keep",
)
def _():
    return {"call": lambda: _ks().apply_topology_witnesses(learned(), lens(), 5, 4, 2)}


@case(
    "replacements-2**100",
    "negative / huge integer",
    "`apply_topology_witnesses(learned, lens, 2, 4, 2**100)`",
    "WitnessError",
    argument="max_replacements",
)
def _():
    return {"call": lambda: _ks().apply_topology_witnesses(learned(), lens(), 2, 4, 2**100)}


@case(
    "replacements-u64-max",
    "negative / huge integer",
    "`apply_topology_witnesses(learned, lens, 2, 4, 2**64 - 1)`",
    ACCEPTED,
    note="budget capped by the row",
)
def _():
    ref = lambda: _ks().apply_topology_witnesses(learned(), lens(), 2, 4, 2)  # noqa: E731
    return {"call": lambda: _ks().apply_topology_witnesses(learned(), lens(), 2, 4, 2**64 - 1), "check": same(ref)}


@case(
    "scatter-segments-negative",
    "negative / huge integer",
    "`scatter_topology_witnesses(buf, lens, -1)`",
    "WitnessError",
    argument="num_segments",
)
def _():
    buf = learned()
    return {"call": lambda: _ks().scatter_topology_witnesses(buf, lens(), -1), "watch": [buf]}


@case(
    "scatter-segments-65",
    "negative / huge integer",
    "`scatter_topology_witnesses(buf, lens, 65)`",
    "WitnessError",
    argument="num_segments",
)
def _():
    buf = learned()
    return {"call": lambda: _ks().scatter_topology_witnesses(buf, lens(), 65), "watch": [buf]}


@case(
    "learned-int64-huge",
    "negative / huge integer",
    "`topology_witness_indices(learned.astype(int64) + 2**40, …)`",
    "WitnessError",
    argument="learned",
)
def _():
    return {"call": lambda: _ks().topology_witness_indices(learned().astype(np.int64) + 2**40, lens(), 4)}


@case(
    "lens-uint64-max",
    "negative / huge integer",
    "`topology_witness_indices(learned, np.array([2**64-1, 1], uint64), 4)`",
    "WitnessError",
    argument="context_lens",
)
def _():
    return {"call": lambda: _ks().topology_witness_indices(learned(), np.array([2**64 - 1, 1], np.uint64), 4)}


@case(
    "lens-negative",
    "negative / huge integer",
    "`topology_witness_indices(learned, [-5, 6], 4)`",
    ACCEPTED,
    note="a row of length <= 0 gets no witnesses",
)
def _():
    return {
        "call": lambda: _ks().topology_witness_indices(learned(), [-5, 6], 4),
        "check": lambda r: (r[0] == -1).all(),
    }


@case(
    "learned-int32-extremes",
    "negative / huge integer",
    "`topology_witness_indices([[INT32_MIN, INT32_MAX]], [8], 4)`",
    ACCEPTED,
    note="negative = padding; past L clamps to the last segment",
)
def _():
    a = np.array([[np.iinfo(np.int32).min, np.iinfo(np.int32).max]], np.int32)
    return {"call": lambda: _ks().topology_witness_indices(a, [8], 4), "check": lambda r: r.tolist() == [[0, 2, 4, -1]]}


@case("segment-of-negative", "negative / huge integer", "`segment_of(-1, 8, 4)`", "WitnessError", argument="token")
def _():
    return {"call": lambda: _ks().segment_of(-1, 8, 4)}


@case("segment-of-u64-max", "negative / huge integer", "`segment_of(2**64 - 1, 2**64 - 1, 2**64 - 1)`", ACCEPTED)
def _():
    return {"call": lambda: _ks().segment_of(2**64 - 1, 2**64 - 1, 2**64 - 1), "check": lambda r: r == 2**64 - 1}


@case(
    "random-null-len-2**40",
    "negative / huge integer",
    "`random_null(2**40, 3, 0)`",
    "WitnessError",
    argument="context_len",
)
def _():
    return {"call": lambda: _ks().random_null(2**40, 3, 0)}


@case(
    "random-null-seed-negative", "negative / huge integer", "`random_null(10, 3, -1)`", "WitnessError", argument="seed"
)
def _():
    return {"call": lambda: _ks().random_null(10, 3, -1)}


@case(
    "random-null-seed-2**64", "negative / huge integer", "`random_null(10, 3, 2**64)`", "WitnessError", argument="seed"
)
def _():
    return {"call": lambda: _ks().random_null(10, 3, 2**64)}


@case(
    "random-null-budget-huge",
    "negative / huge integer",
    "`random_null(10, 2**63, 0)`",
    ACCEPTED,
    note="min(budget, L) = 10 tokens",
)
def _():
    return {"call": lambda: _ks().random_null(10, 2**63, 0), "check": lambda r: r.tolist() == list(range(10))}


@case(
    "locality-budget-negative", "negative / huge integer", "`locality_null(10, -3)`", "WitnessError", argument="budget"
)
def _():
    return {"call": lambda: _ks().locality_null(10, -3)}


@case(
    "coverage-len-negative",
    "negative / huge integer",
    "`segment_coverage([1], -8, 4)`",
    "WitnessError",
    argument="context_len",
)
def _():
    return {"call": lambda: _ks().segment_coverage([1], -8, 4)}


@case(
    "query-pos-negative",
    "negative / huge integer",
    "`block_sparse_select(q, k, -1)`",
    "SelectionError",
    argument="query_pos",
)
def _():
    return {"call": lambda: _ks().block_sparse_select(index_q(), index_k(), -1, cfg())}


@case(
    "query-pos-2**63",
    "negative / huge integer",
    "`block_sparse_select(q, k, 2**63)`",
    "SelectionError",
    argument="query_pos",
)
def _():
    return {"call": lambda: _ks().block_sparse_select(index_q(), index_k(), 2**63, cfg())}


@case(
    "query-pos-past-keys",
    "negative / huge integer",
    "`block_sparse_select(q, k, 2**62)`",
    ACCEPTED,
    note="clipped to the keys that exist",
)
def _():
    ref = lambda: _ks().block_sparse_select(index_q(), index_k(), 15, cfg())  # noqa: E731
    return {"call": lambda: _ks().block_sparse_select(index_q(), index_k(), 2**62, cfg()), "check": same(ref)}


@case(
    "query-pos-array-negative",
    "negative / huge integer",
    "`block_sparse_select(q3d, k, [9, -1])`",
    "SelectionError",
    argument="query_pos",
)
def _():
    return {"call": lambda: _ks().block_sparse_select(index_q(True), index_k(), [9, -1], cfg())}


@case(
    "query-pos-uint64-huge",
    "negative / huge integer",
    "`block_sparse_select(q3d, k, np.array([9, 2**64-1], uint64))`",
    "SelectionError",
    argument="query_pos",
)
def _():
    return {
        "call": lambda: _ks().block_sparse_select(index_q(True), index_k(), np.array([9, 2**64 - 1], np.uint64), cfg())
    }


@case(
    "seq-id-out-of-range",
    "negative / huge integer",
    "`block_sparse_select_packed(…, seq_ids=[0, 2], …)`",
    "SelectionError",
    argument="seq_ids",
)
def _():
    return {
        "call": lambda: _ks().block_sparse_select_packed(index_q(True), index_k(), [0, 8, 16], [0, 2], [7, 7], cfg())
    }


@case(
    "config-negative",
    "negative / huge integer",
    "`BlockSparseConfig(block_size=-1)`",
    "SelectionError",
    argument="block_size",
)
def _():
    return {"call": lambda: _ks().BlockSparseConfig(block_size=-1)}


@case(
    "config-huge",
    "negative / huge integer",
    "`BlockSparseConfig(top_blocks=2**40)`",
    "SelectionError",
    argument="top_blocks",
)
def _():
    return {"call": lambda: _ks().BlockSparseConfig(top_blocks=2**40)}


@case(
    "config-selects-nothing",
    "negative / huge integer",
    "`BlockSparseConfig(4, 0, 0, 0)`",
    "SelectionError",
    argument="top_blocks",
)
def _():
    return {"call": lambda: _ks().BlockSparseConfig(4, 0, 0, 0)}


@case(
    "config-block-size-zero",
    "negative / huge integer",
    "`BlockSparseConfig(block_size=0)`",
    "SelectionError",
    argument="block_size",
)
def _():
    return {"call": lambda: _ks().BlockSparseConfig(block_size=0)}


@case(
    "blocks-past-int32",
    "negative / huge integer",
    "`positions_of_blocks([2**31 - 1], 2**62, 2**62, BlockSparseConfig(4, 2, 1, 1))`",
    "SelectionError",
    argument="blocks",
)
def _():
    return {"call": lambda: _ks().positions_of_blocks([2**31 - 1], 2**62, 2**62, cfg())}


@case(
    "blocks-negative",
    "negative / huge integer",
    "`positions_of_blocks([-7, 1, -1], 9, 16, cfg)`",
    ACCEPTED,
    note="negative = padding, skipped",
)
def _():
    return {
        "call": lambda: _ks().positions_of_blocks([-7, 1, -1], 9, 16, cfg()),
        "check": lambda r: r.tolist() == [4, 5, 6, 7],
    }


@case(
    "selector-window-negative", "negative / huge integer", "`Selector.local(-1)`", "SelectionError", argument="window"
)
def _():
    return {"call": lambda: _ks().Selector.local(-1)}


@case("selector-row-huge", "negative / huge integer", "`Selector.dense().row(2**31)`", "SelectionError", argument="row")
def _():
    return {"call": lambda: _ks().Selector.dense().row(2**31)}


@case(
    "selector-width-too-small",
    "negative / huge integer",
    "`Selector.local(3).rows([5], width=2)`",
    "SelectionError",
    argument="width",
)
def _():
    return {"call": lambda: _ks().Selector.local(3).rows([5], width=2)}


@case(
    "attention-pos-negative",
    "negative / huge integer",
    "`dense_attention(q, k, v, [2, -5])`",
    "SelectionError",
    argument="query_pos",
)
def _():
    q, k, v, _ = qkv()
    return {"call": lambda: _ks().dense_attention(q, k, v, [2, -5])}


@case(
    "oracle-budget-negative",
    "negative / huge integer",
    "`oracle_topk(attention, pos, -2)`",
    "SelectionError",
    argument="budget",
)
def _():
    return {"call": lambda: _ks().oracle_topk(np.ones((2, 6)), [3, 5], -2)}


@case("threads-negative", "negative / huge integer", "`set_num_threads(-1)`", "KvselectError", argument="n")
def _():
    return {"call": lambda: _ks().set_num_threads(-1)}


@case("threads-huge", "negative / huge integer", "`set_num_threads(10**9)`", "KvselectError", argument="n")
def _():
    return {"call": lambda: _ks().set_num_threads(10**9)}


@case(
    "output-too-large-witness",
    "negative / huge integer",
    "`topology_witness_indices(np.empty((4096, 0), int32), [1]*4096, 2**32 - 1)`",
    "MemoryError",
    note="64 TiB output: MemoryError, never an abort",
)
def _():
    return {
        "call": lambda: _ks().topology_witness_indices(
            np.empty((4096, 0), np.int32), np.ones(4096, np.int32), 2**32 - 1
        )
    }


@case(
    "output-too-large-selector",
    "negative / huge integer",
    "`Selector.dense().rows([2**31 - 2] * 4096)`",
    "MemoryError",
    note="32 TiB output",
)
def _():
    return {"call": lambda: _ks().Selector.dense().rows(np.full(4096, 2**31 - 2))}


# -- NaN and ±Inf floats -----------------------------------------------------------


@case(
    "nan-query",
    "NaN / ±Inf",
    "`block_sparse_select(q * nan, k, 15)`",
    ACCEPTED,
    note="NaN scores are absent: forced blocks, then lowest ids",
)
def _():
    return {
        "call": lambda: _ks().block_sparse_select(index_q() * np.nan, index_k(), 15, cfg()),
        "check": lambda r: r.tolist() == [[0, 3], [0, 3]],
    }


@case("inf-keys", "NaN / ±Inf", "`block_sparse_select(q, k with ±inf rows, 15)`", ACCEPTED)
def _():
    def call():
        k = index_k()
        k[5] = np.inf
        k[9] = -np.inf
        return _ks().block_sparse_select(index_q(), k, 15, cfg())

    return {"call": call, "check": lambda r: r.shape == (2, 2) and (r[:, 0] == 0).all()}


@case(
    "nan-learned",
    "NaN / ±Inf",
    "`topology_witness_indices([[nan, 1.0]], [8], 4)`",
    "TypeError",
    note="float indices are refused",
)
def _():
    return {"call": lambda: _ks().topology_witness_indices(np.array([[np.nan, 1.0]]), [8], 4)}


@case("nan-attention-row", "NaN / ±Inf", "`attention_mass_recall([0], [nan, 1.0])`", ACCEPTED, note="NaN propagates")
def _():
    return {"call": lambda: _ks().attention_mass_recall([0], [np.nan, 1.0]), "check": lambda r: r != r}


@case(
    "inf-attention-q",
    "NaN / ±Inf",
    "`dense_attention(q with inf, k, v, pos)`",
    ACCEPTED,
    note="non-finite inputs give non-finite outputs, no refusal",
)
def _():
    q, k, v, p = qkv()
    q[0, 0, 0] = np.inf
    return {"call": lambda: _ks().dense_attention(q, k, v, p), "check": lambda r: r[0].shape == (2, 2, 4)}


@case("nan-oracle", "NaN / ±Inf", "`oracle_topk([[nan, 0.5, nan, 0.1]], [3], 2)`", ACCEPTED, note="NaN ranks as -inf")
def _():
    return {
        "call": lambda: _ks().oracle_topk(np.array([[np.nan, 0.5, np.nan, 0.1]]), [3], 2),
        "check": lambda r: r.tolist() == [[1, 3]],
    }


@case("scale-nan", "NaN / ±Inf", "`dense_attention(q, k, v, pos, scale=nan)`", "SelectionError", argument="scale")
def _():
    q, k, v, p = qkv()
    return {"call": lambda: _ks().dense_attention(q, k, v, p, scale=float("nan"))}


@case("scale-inf", "NaN / ±Inf", "`sparse_attention(q, k, v, pos, sel, scale=inf)`", "SelectionError", argument="scale")
def _():
    q, k, v, p = qkv()
    return {"call": lambda: _ks().sparse_attention(q, k, v, p, selection(), scale=float("inf"))}


@case(
    "probabilities-scale-inf",
    "NaN / ±Inf",
    "`attention_probabilities(q, k, pos, scale=-inf)`",
    "SelectionError",
    argument="scale",
)
def _():
    q, k, _, p = qkv()
    return {"call": lambda: _ks().attention_probabilities(q, k, p, scale=float("-inf"))}


@case("count-nan", "NaN / ±Inf", "`segment_of(nan, 8, 4)`", "TypeError")
def _():
    return {"call": lambda: _ks().segment_of(float("nan"), 8, 4)}


@case("query-pos-inf", "NaN / ±Inf", "`block_sparse_select(q, k, inf)`", "TypeError")
def _():
    return {"call": lambda: _ks().block_sparse_select(index_q(), index_k(), float("inf"), cfg())}


# -- non-array objects ----------------------------------------------------------------


@case("count-float", "non-array object", "`topology_witness_indices(learned, lens, 4.0)`", "TypeError")
def _():
    return {"call": lambda: _ks().topology_witness_indices(learned(), lens(), 4.0)}


@case("count-numpy-float", "non-array object", "`random_null(np.float64(10), 3, 0)`", "TypeError")
def _():
    return {"call": lambda: _ks().random_null(np.float64(10), 3, 0)}


@case("count-str", "non-array object", "`locality_null('10', 3)`", "TypeError")
def _():
    return {"call": lambda: _ks().locality_null("10", 3)}


@case("count-none", "non-array object", "`apply_topology_witnesses(learned, lens, None, 4, 2)`", "TypeError")
def _():
    return {"call": lambda: _ks().apply_topology_witnesses(learned(), lens(), None, 4, 2)}


@case(
    "count-numpy-int",
    "non-array object",
    "`apply_topology_witnesses(learned, lens, np.int64(2), np.uint8(4), 2)`",
    ACCEPTED,
)
def _():
    ref = lambda: _ks().apply_topology_witnesses(learned(), lens(), 2, 4, 2)  # noqa: E731
    return {
        "call": lambda: _ks().apply_topology_witnesses(learned(), lens(), np.int64(2), np.uint8(4), 2),
        "check": same(ref),
    }


@case("learned-none", "non-array object", "`topology_witness_indices(None, lens, 4)`", "TypeError")
def _():
    return {"call": lambda: _ks().topology_witness_indices(None, lens(), 4)}


@case("learned-object", "non-array object", "`topology_witness_indices(object(), lens, 4)`", "TypeError")
def _():
    return {"call": lambda: _ks().topology_witness_indices(object(), lens(), 4)}


@case("learned-dict", "non-array object", "`topology_witness_indices({'a': 1}, lens, 4)`", "TypeError")
def _():
    return {"call": lambda: _ks().topology_witness_indices({"a": 1}, lens(), 4)}


@case("learned-bytes", "non-array object", "`segment_coverage(b'\\x01\\x02', 8, 4)`", "TypeError")
def _():
    return {"call": lambda: _ks().segment_coverage(b"\x01\x02", 8, 4)}


@case(
    "learned-ragged",
    "non-array object",
    "`topology_witness_indices([[1, 2], [3]], [4, 4], 2)`",
    "ValueError",
    note="NumPy's own ValueError (inhomogeneous shape)",
)
def _():
    return {"call": lambda: _ks().topology_witness_indices([[1, 2], [3]], [4, 4], 2)}


@case("learned-list", "non-array object", "`topology_witness_indices(learned.tolist(), lens.tolist(), 4)`", ACCEPTED)
def _():
    ref = lambda: _ks().topology_witness_indices(learned(), lens(), 4)  # noqa: E731
    return {"call": lambda: _ks().topology_witness_indices(learned().tolist(), lens().tolist(), 4), "check": same(ref)}


@case("buffer-list", "non-array object", "`scatter_topology_witnesses(learned.tolist(), lens, 2)`", "TypeError")
def _():
    return {"call": lambda: _ks().scatter_topology_witnesses(learned().tolist(), lens(), 2)}


@case(
    "buffer-none-off-switch",
    "non-array object",
    "`scatter_topology_witnesses(None, lens, 0)`",
    "TypeError",
    note="checked even with the off switch",
)
def _():
    return {"call": lambda: _ks().scatter_topology_witnesses(None, lens(), 0)}


@case("out-list", "non-array object", "`topology_witness_indices(learned, lens, 4, out=[[0] * 4] * 2)`", "TypeError")
def _():
    return {"call": lambda: _ks().topology_witness_indices(learned(), lens(), 4, out=[[0] * 4] * 2)}


@case("config-wrong-type", "non-array object", "`block_sparse_select(q, k, 9, config={'block_size': 4})`", "TypeError")
def _():
    return {"call": lambda: _ks().block_sparse_select(index_q(), index_k(), 9, {"block_size": 4})}


@case("keys-none", "non-array object", "`block_sparse_select(q, None, 9)`", "TypeError")
def _():
    return {"call": lambda: _ks().block_sparse_select(index_q(), None, 9, cfg())}


@case("scale-str", "non-array object", "`dense_attention(q, k, v, pos, scale='1')`", "TypeError")
def _():
    q, k, v, p = qkv()
    return {"call": lambda: _ks().dense_attention(q, k, v, p, scale="1")}


@case("query-pos-str", "non-array object", "`dense_attention(q, k, v, 'ab')`", "TypeError")
def _():
    q, k, v, _ = qkv()
    return {"call": lambda: _ks().dense_attention(q, k, v, "ab")}


@case(
    "masked-array-learned",
    "non-array object",
    "`topology_witness_indices(np.ma.masked_array(learned), lens, 4)`",
    ACCEPTED,
    note="read through np.asarray (the mask is ignored)",
)
def _():
    ref = lambda: _ks().topology_witness_indices(learned(), lens(), 4)  # noqa: E731
    return {
        "call": lambda: _ks().topology_witness_indices(np.ma.masked_array(learned()), lens(), 4),
        "check": same(ref),
    }


# -- DLPack producers (a ctypes producer over NumPy memory, tests/python/dlpack_producers.py) --


def _dl(a, **kw):
    from dlpack_producers import Producer

    return Producer(a, **kw)


def _topk_out():
    return np.full((2, 4), -7, dtype=np.int32)


@case(
    "dlpack-gpu",
    "DLPack",
    "`indexer_topk(q, w, k on cuda:0, pos, 4, out=buf)`",
    "SelectionError",
    argument="index_k",
    note="says to move it with .cpu(); nothing is exported or written",
)
def _():
    q, w, k, p = indexer_args()
    buf = _topk_out()
    return {"call": lambda: _ks().indexer_topk(q, w, _dl(k, device=(2, 0)), p, 4, out=buf), "watch": [buf]}


@case(
    "dlpack-unsupported-dtype",
    "DLPack",
    "`indexer_topk(q, w, complex64 tensor, pos, 4)`",
    "TypeError",
    argument="index_k",
    note="names the DLPack type code; the capsule is deleted",
)
def _():
    q, w, k, p = indexer_args()
    return {"call": lambda: _ks().indexer_topk(q, w, _dl(k.view(np.complex64), dtype="complex64"), p, 4)}


@case(
    "dlpack-raises",
    "DLPack",
    "`indexer_topk(q, weights whose __dlpack__ raises, k, pos, 4, out=buf)`",
    "SelectionError",
    argument="weights",
    note="the producer's exception is the cause",
)
def _():
    q, w, k, p = indexer_args()
    buf = _topk_out()
    bad = _dl(w, raises=RuntimeError("producer failed"))
    return {"call": lambda: _ks().indexer_topk(q, bad, k, p, 4, out=buf), "watch": [buf]}


@case(
    "dlpack-bare-capsule",
    "DLPack",
    "`indexer_topk(q, w, k.__dlpack__(), pos, 4)`",
    "TypeError",
    argument="index_k",
    note="pass the tensor, not its capsule",
)
def _():
    q, w, k, p = indexer_args()
    return {"call": lambda: _ks().indexer_topk(q, w, k.__dlpack__(), p, 4)}


@case(
    "dlpack-negative-strides-out",
    "DLPack",
    "`indexer_topk(q, w, k, pos, 4, out=tensor with strides (-4, 1))`",
    "SelectionError",
    argument="out",
    note="written in place, so never copied",
)
def _():
    q, w, k, p = indexer_args()
    buf = _topk_out()
    out = _dl(buf, shape=(2, 4), strides=(-4, 1), byte_offset=16)
    return {"call": lambda: _ks().indexer_topk(q, w, k, p, 4, out=out), "watch": [buf]}


@case(
    "dlpack-zero-strides-out",
    "DLPack",
    "`indexer_topk(q, w, k, pos, 4, out=tensor with strides (0, 1))`",
    "SelectionError",
    argument="out",
    note="written in place, so never copied",
)
def _():
    q, w, k, p = indexer_args()
    buf = _topk_out()
    out = _dl(buf, shape=(2, 4), strides=(0, 1))
    return {"call": lambda: _ks().indexer_topk(q, w, k, p, 4, out=out), "watch": [buf]}


@case(
    "dlpack-read-only-out",
    "DLPack",
    "`indexer_topk(q, w, k, pos, 4, out=read-only tensor)`",
    "SelectionError",
    argument="out",
    note="the versioned capsule's READ_ONLY flag is honoured",
)
def _():
    q, w, k, p = indexer_args()
    buf = _topk_out()
    return {"call": lambda: _ks().indexer_topk(q, w, k, p, 4, out=_dl(buf, read_only=True)), "watch": [buf]}


@case(
    "dlpack-negative-strides-input",
    "DLPack",
    "`indexer_topk(q, w, k reversed (strides (-4, 1)), pos, 4)`",
    ACCEPTED,
    note="a read-only input: copied once to C order, the same result",
)
def _():
    q, w, k, p = indexer_args()
    rev = k[::-1].copy()

    def ref():
        return _ks().indexer_topk(q, w, k, p, 4)

    tensor = _dl(rev, shape=k.shape, strides=(-4, 1), byte_offset=(len(k) - 1) * 16)
    return {"call": lambda: _ks().indexer_topk(q, w, tensor, p, 4), "check": same(ref), "watch": [rev]}


@case(
    "dlpack-zero-strides-input",
    "DLPack",
    "`indexer_topk(q, w, one key broadcast (strides (0, 1)), pos, 4)`",
    ACCEPTED,
    note="a read-only input: copied once to C order, the same result",
)
def _():
    q, w, k, p = indexer_args()
    row = k[:1].copy()

    def ref():
        return _ks().indexer_topk(q, w, np.repeat(row, len(k), axis=0), p, 4)

    tensor = _dl(row, shape=k.shape, strides=(0, 1))
    return {"call": lambda: _ks().indexer_topk(q, w, tensor, p, 4), "check": same(ref), "watch": [row]}


# Hostile producers (the DLPack spec's refusals): each is the entry point's
# domain error naming the argument, and nothing is written.

_HOSTILE_DLPACK = [
    (
        "dlpack-major-99",
        "k exported as a DLPack 99.0 capsule",
        {"version": (99, 0)},
        "kvselect reads DLPack 1.x (it asks for max_version=(1, 3)) and legacy capsules; the capsule is deleted unread",
    ),
    (
        "dlpack-major-0-versioned",
        "k exported as a versioned DLPack 0.8 capsule",
        {"version": (0, 8)},
        "a versioned capsule must be DLPack 1.x; the capsule is deleted unread",
    ),
    (
        "dlpack-consumed-versioned",
        "k whose __dlpack__ returns a consumed capsule ('used_dltensor_versioned')",
        {"capsule_name": b"used_dltensor_versioned"},
        "already consumed: neither read nor deleted (its tensor is its consumer's)",
    ),
    (
        "dlpack-consumed-legacy",
        "k whose legacy __dlpack__ returns a consumed capsule ('used_dltensor')",
        {"legacy": True, "capsule_name": b"used_dltensor"},
        "already consumed: neither read nor deleted (its tensor is its consumer's)",
    ),
    (
        "dlpack-wrong-capsule-name",
        "k whose __dlpack__ returns a PyCapsule named 'not_a_dltensor'",
        {"capsule_name": b"not_a_dltensor"},
        "not a DLPack capsule: neither read nor deleted",
    ),
    (
        "dlpack-not-a-capsule",
        "k whose __dlpack__ returns 3",
        {"returns": 3},
        "not a DLPack capsule",
    ),
    (
        "dlpack-device-not-a-pair",
        "k whose __dlpack_device__ returns 'cpu'",
        {"device": "cpu"},
        "must be (device_type, device_id); nothing is exported",
    ),
    (
        "dlpack-device-raises",
        "k whose __dlpack_device__ raises",
        {"device": RuntimeError("no device")},
        "the producer's exception is the cause; nothing is exported",
    ),
    (
        "dlpack-layout-overflows",
        "k with shape (100, 4), strides (2**62, 1)",
        {"shape": (100, 4), "strides": (2**62, 1)},
        "the byte extent overflows; the capsule is deleted",
    ),
    (
        "dlpack-element-count-overflows",
        "k with shape (2**40, 2**40)",
        {"shape": (2**40, 2**40), "strides": (1, 1)},
        "the element count overflows; the capsule is deleted",
    ),
]


def _hostile_dlpack(id, what, hostility, note):
    @case(
        id,
        "DLPack",
        f"`indexer_topk(q, w, {what}, pos, 4, out=buf)`",
        "SelectionError",
        argument="index_k",
        note=note + "; out is left untouched",
    )
    def _():
        q, w, k, p = indexer_args()
        buf = _topk_out()
        bad = _dl(k, **hostility)
        return {"call": lambda: _ks().indexer_topk(q, w, bad, p, 4, out=buf), "watch": [buf]}


for _row in _HOSTILE_DLPACK:
    _hostile_dlpack(*_row)


@case(
    "dlpack-capsule-handed-out-twice",
    "DLPack",
    "`indexer_topk(q, weights whose __dlpack__ returns the capsule it returned before, k, pos, 4, out=buf)`",
    "SelectionError",
    argument="weights",
    note="the first call consumed it: neither read nor deleted again; out is left untouched",
)
def _():
    q, w, k, p = indexer_args()
    cap = w.__dlpack__()

    class Cached:
        def __dlpack__(self, **kwargs):
            return cap

        def __dlpack_device__(self):
            return w.__dlpack_device__()

    _ks().indexer_topk(q, Cached(), k, p, 4)  # consumes the capsule
    buf = _topk_out()
    return {"call": lambda: _ks().indexer_topk(q, Cached(), k, p, 4, out=buf), "watch": [buf]}


@case(
    "dlpack-consumed-buffer",
    "DLPack",
    "`scatter_topology_witnesses(buffer whose __dlpack__ returns a consumed capsule, lens, 2)`",
    "WitnessError",
    argument="topk_indices",
    note="the witness domain's error; the buffer is left untouched",
)
def _():
    buf = learned()
    bad = _dl(buf, capsule_name=b"used_dltensor_versioned")
    return {"call": lambda: _ks().scatter_topology_witnesses(bad, lens(), 2), "watch": [buf]}


@case(
    "dlpack-dtype-disagrees-with-key-format",
    "DLPack",
    "`indexer_topk(q, w, bfloat16 tensor, pos, 4, key_format='float16')`",
    "TypeError",
    argument="index_k",
    note="the tensor's DLPack dtype is its format: key_format must agree with it",
)
def _():
    from dlpack_producers import bf16_bits

    q, w, k, p = indexer_args()
    return {"call": lambda: _ks().indexer_topk(q, w, _dl(bf16_bits(k), dtype="bfloat16"), p, 4, key_format="float16")}


@case(
    "dlpack-out-aliases-an-input",
    "DLPack",
    "`indexer_topk(q over buf's memory, w, k, pos, 4, out=tensor over buf)`",
    "SelectionError",
    argument="out",
    note="out overlaps another argument's memory; buf is left untouched",
)
def _():
    _, w, k, p = indexer_args()
    buf = np.zeros((2, 4), dtype=np.int32)
    q_alias = _dl(buf.view(np.float32).reshape(2, 1, 4))
    return {"call": lambda: _ks().indexer_topk(q_alias, w[:, :1], k, p, 4, out=_dl(buf)), "watch": [buf]}


# -- torch tensors (skipped when torch is absent) ------------------------------------------


def _torch():
    import torch

    return torch


@case(
    "torch-int64-learned",
    "torch tensor",
    "`topology_witness_indices(torch.topk(…).indices, lens, 4)`",
    ACCEPTED,
    note="int64 values that fit: converted once",
    torch=True,
)
def _():
    ref = lambda: _ks().topology_witness_indices(learned(), lens(), 4)  # noqa: E731
    return {
        "call": lambda: _ks().topology_witness_indices(_torch().from_numpy(learned().astype(np.int64)), lens(), 4),
        "check": same(ref),
    }


@case(
    "torch-int64-buffer",
    "torch tensor",
    "`scatter_topology_witnesses(int64 tensor, lens, 2)`",
    "TypeError",
    torch=True,
    note="call .int() and pass .numpy()",
)
def _():
    t = _torch().from_numpy(learned().astype(np.int64))
    return {"call": lambda: _ks().scatter_topology_witnesses(t, lens(), 2), "watch": [t.numpy()]}


@case(
    "torch-int32-buffer",
    "torch tensor",
    "`scatter_topology_witnesses(int32 tensor, lens, 2)`",
    ACCEPTED,
    torch=True,
    note="a CPU tensor is written in place through DLPack",
)
def _():
    t = _torch().from_numpy(learned())
    want = learned()
    _ks().scatter_topology_witnesses(want, lens(), 2)
    return {
        "call": lambda: _ks().scatter_topology_witnesses(t, lens(), 2),
        "check": lambda r: r is None and np.array_equal(t.numpy(), want),
    }


@case(
    "torch-numpy-view-buffer",
    "torch tensor",
    "`scatter_topology_witnesses(t.int().numpy(), lens, 2)`",
    ACCEPTED,
    torch=True,
    note="written in place through the tensor's memory",
)
def _():
    t = _torch().from_numpy(learned())
    want = learned()
    _ks().scatter_topology_witnesses(want, lens(), 2)
    return {
        "call": lambda: _ks().scatter_topology_witnesses(t.numpy(), lens(), 2),
        "check": lambda r: r is None and np.array_equal(t.numpy(), want),
    }


@case("torch-float-keys", "torch tensor", "`block_sparse_select(torch q, torch k, 9)`", ACCEPTED, torch=True)
def _():
    ref = lambda: _ks().block_sparse_select(index_q(), index_k(), 9, cfg())  # noqa: E731
    return {
        "call": lambda: _ks().block_sparse_select(
            _torch().from_numpy(index_q()), _torch().from_numpy(index_k()), 9, cfg()
        ),
        "check": same(ref),
    }


@case(
    "torch-float-learned", "torch tensor", "`topology_witness_indices(float tensor, lens, 4)`", "TypeError", torch=True
)
def _():
    return {
        "call": lambda: _ks().topology_witness_indices(_torch().from_numpy(learned().astype(np.float32)), lens(), 4)
    }


def check_args():
    scores = np.array([[0.5, 3.0, 1.0, 2.0, -1.0], [1.0, 1.0, 0.0, 2.0, 0.5]], np.float32)
    rows = np.array([[3, 1, 2], [3, 0, 1]], np.int64)
    return scores, rows


@case(
    "check-negative-magnitude",
    "engine check",
    "`check_topk(scores, rows, rtol=0.01, magnitudes=-ones)`",
    "SelectionError",
    argument="magnitudes",
    note="a bound is never negative",
)
def _():
    s, r = check_args()
    m = -np.ones_like(s)
    return {"call": lambda: _ks().check_topk(s, r, rtol=0.01, magnitudes=m), "watch": [s, r, m]}


@case(
    "check-unknown-filler",
    "engine check",
    "`check_topk(scores, rows, filler='pad')`",
    "SelectionError",
    argument="filler",
    note='the message lists the rules: "-1", "past_context", "repeat"',
)
def _():
    s, r = check_args()
    return {"call": lambda: _ks().check_topk(s, r, filler="pad"), "watch": [s, r]}


@case("check-filler-not-a-string", "engine check", "`check_topk(scores, rows, filler=-1)`", "TypeError")
def _():
    s, r = check_args()
    return {"call": lambda: _ks().check_topk(s, r, filler=-1), "watch": [s, r]}


@case(
    "check-past-context-filler",
    "engine check",
    "`check_topk(scores, rows with a future position, [2, 5], filler='past_context')`",
    ACCEPTED,
    note="the engine's filler ignored: only the wrong row (row 1) is reported",
)
def _():
    s, r = check_args()
    r[0] = [1, 4, 0]  # L = 2, topk 3: both positions and a future one
    r[1] = [3, 0, 2]  # a wrong selection: position 4 (0.5) beats 2 (0.0)
    return {
        "call": lambda: _ks().check_topk(s, r, [2, 5], filler="past_context"),
        "check": lambda rep: [d["row"] for d in rep["details"]] == [1],
        "watch": [s, r],
    }


@case(
    "check-short-lens",
    "engine check",
    "`check_topk(scores [2, 5], rows [2, 3], context_lens=[5])`",
    "SelectionError",
    argument="context_lens",
    note="scores and rows agree: the lengths are named",
)
def _():
    s, r = check_args()
    return {"call": lambda: _ks().check_topk(s, r, [5]), "watch": [s, r]}


@case(
    "check-short-rows",
    "engine check",
    "`check_topk(scores [2, 5], rows[:1])`",
    "SelectionError",
    argument="rows",
    note="the lengths default to the scores' rows: the rows are named",
)
def _():
    s, r = check_args()
    one = r[:1].copy()
    return {"call": lambda: _ks().check_topk(s, one), "watch": [s, one]}


@case("check-float16-scores", "engine check", "`check_topk(scores.astype(float16), rows)`", "TypeError")
def _():
    s, r = check_args()
    s16 = s.astype(np.float16)
    return {"call": lambda: _ks().check_topk(s16, r), "watch": [s16, r]}


@case("check-float-rows", "engine check", "`check_topk(scores, rows.astype(float32))`", "TypeError")
def _():
    s, r = check_args()
    return {"call": lambda: _ks().check_topk(s, r.astype(np.float32)), "watch": [s]}


@case("check-3d-scores", "engine check", "`check_topk(scores[None], rows)`", "SelectionError", argument="scores")
def _():
    s, r = check_args()
    return {"call": lambda: _ks().check_topk(s[None], r), "watch": [s, r]}


@case(
    "check-context-past-scores",
    "engine check",
    "`check_topk(scores [2, 5], rows, context_lens=[5, 6])`",
    "SelectionError",
    argument="context_lens",
)
def _():
    s, r = check_args()
    return {"call": lambda: _ks().check_topk(s, r, [5, 6]), "watch": [s, r]}


@case(
    "check-rtol-without-magnitudes",
    "engine check",
    "`check_topk(scores, rows, rtol=0.01)`",
    "SelectionError",
    argument="rtol",
    note="rtol scales each score's magnitude: there is none to scale",
)
def _():
    s, r = check_args()
    return {"call": lambda: _ks().check_topk(s, r, rtol=0.01), "watch": [s, r]}


@case(
    "check-negative-atol", "engine check", "`check_topk(scores, rows, atol=-1e-3)`", "SelectionError", argument="atol"
)
def _():
    s, r = check_args()
    return {"call": lambda: _ks().check_topk(s, r, atol=-1e-3), "watch": [s, r]}


@case(
    "check-nan-magnitude",
    "engine check",
    "`check_topk(scores, rows, rtol=0.01, magnitudes=[[nan, …]])`",
    "SelectionError",
    argument="magnitudes",
    note="NaN past a row's context is never read, so it is allowed",
)
def _():
    s, r = check_args()
    m = np.abs(s)
    m[0, 0] = np.nan
    return {"call": lambda: _ks().check_topk(s, r, rtol=0.01, magnitudes=m), "watch": [s, r, m]}


@case(
    "check-int64-far-position",
    "engine check",
    "`check_topk(scores, rows with 2**40)`",
    ACCEPTED,
    note="reported as a non-causal entry of that row, not refused",
)
def _():
    s, r = check_args()
    r[1, 0] = 2**40
    return {
        "call": lambda: _ks().check_topk(s, r),
        "check": lambda rep: (
            rep["wrong"] == 1
            and rep["details"][0]["problems"][0]
            == {"reason": "not_causal", "slot": 0, "position": 2**40, "n_slots": 1, "context": 5}
        ),
    }


@case(
    "indexer-scores-d-mismatch",
    "engine check",
    "`indexer_scores(q [.., d=4], w, k[:, :3], pos)`",
    "SelectionError",
    argument="index_q",
)
def _():
    q, w, k, p = indexer_args()
    return {"call": lambda: _ks().indexer_scores(q, w, np.ascontiguousarray(k[:, :3]), p), "watch": [q, w, k]}


@case(
    "indexer-scores-negative-position",
    "engine check",
    "`indexer_scores(q, w, k, [-1, 5])`",
    "SelectionError",
    argument="query_pos",
)
def _():
    q, w, k, p = indexer_args()
    return {"call": lambda: _ks().indexer_scores(q, w, k, [-1, 5]), "watch": [q, w, k]}


def block_check_args():
    scores = np.array([[9, 5, 3, 1, 4, 0], [2, 7, 1, 0, 0, 0]], np.float32)
    rows = np.array([[5, 0], [0, 3]], np.int64)  # cfg: the init and the local block of each
    return scores, rows, np.array([6, 4])


@case(
    "check-blocks-float-rows",
    "engine check",
    "`check_blocks(block_scores, rows.astype(float32), visible_blocks, cfg)`",
    "TypeError",
)
def _():
    s, r, nb = block_check_args()
    return {"call": lambda: _ks().check_blocks(s, r.astype(np.float32), nb, cfg()), "watch": [s, nb]}


@case(
    "check-blocks-narrow-rows",
    "engine check",
    "`check_blocks(block_scores, rows[:, :1], visible_blocks, cfg)`",
    "SelectionError",
    argument="config",
    note="no row could hold config.width blocks",
)
def _():
    s, r, nb = block_check_args()
    return {"call": lambda: _ks().check_blocks(s, r[:, :1], nb, cfg()), "watch": [s, r, nb]}


@case(
    "check-blocks-negative-visible-blocks",
    "engine check",
    "`check_blocks(block_scores, rows, [-1, 4], cfg)`",
    "SelectionError",
    argument="visible_blocks",
)
def _():
    s, r, _ = block_check_args()
    return {"call": lambda: _ks().check_blocks(s, r, [-1, 4], cfg()), "watch": [s, r]}


@case(
    "check-blocks-rtol-without-magnitudes",
    "engine check",
    "`check_blocks(block_scores, rows, visible_blocks, cfg, rtol=0.01)`",
    "SelectionError",
    argument="rtol",
)
def _():
    s, r, nb = block_check_args()
    return {"call": lambda: _ks().check_blocks(s, r, nb, cfg(), rtol=0.01), "watch": [s, r, nb]}


@case(
    "check-blocks-dict-config",
    "engine check",
    "`check_blocks(block_scores, rows, visible_blocks, {'block_size': 4})`",
    "TypeError",
)
def _():
    s, r, nb = block_check_args()
    return {"call": lambda: _ks().check_blocks(s, r, nb, {"block_size": 4}), "watch": [s, r, nb]}


@case(
    "check-blocks-far-block",
    "engine check",
    "`check_blocks(block_scores, rows with 2**40, visible_blocks, cfg)`",
    ACCEPTED,
    note="reported as a non-causal entry of that row, not refused",
)
def _():
    s, r, nb = block_check_args()
    r[1, 1] = 2**40
    return {
        "call": lambda: _ks().check_blocks(s, r, nb, cfg()),
        "check": lambda rep: (
            rep["wrong"] == 1
            and {k: v for k, v in rep["details"][0]["problems"][0].items() if k != "context"}
            == {"reason": "not_causal", "slot": 1, "position": 2**40, "n_slots": 1}
        ),
    }


@case(
    "block-scores-2d-q",
    "engine check",
    "`block_scores(q [n_kv_heads, d], k, 9)`",
    "SelectionError",
    argument="index_q",
    note="one query is index_q[None] with [query_pos]",
)
def _():
    q, k = index_q(), index_k()
    return {"call": lambda: _ks().block_scores(q, k, 9, cfg()), "watch": [q, k]}


@case(
    "block-scores-query-pos-count",
    "engine check",
    "`block_scores(q [2, 2, 3], k, [9])`",
    "SelectionError",
    argument="query_pos",
)
def _():
    q, k = index_q(True), index_k()
    return {"call": lambda: _ks().block_scores(q, k, [9], cfg()), "watch": [q, k]}


@case(
    "block-scores-int-magnitudes",
    "engine check",
    "`block_scores(q, k, pos, cfg, magnitudes=1)`",
    "TypeError",
    note="a bool",
)
def _():
    q, k = index_q(True), index_k()
    return {"call": lambda: _ks().block_scores(q, k, [9, 15], cfg(), magnitudes=1), "watch": [q, k]}


def witness_check_args():
    before = learned()
    after = before.copy()
    _ks().scatter_topology_witnesses(after, lens(), 2)
    return before, after


@case("check-witnesses-float", "engine check", "`check_witnesses(before.astype(float32), after, lens, 2)`", "TypeError")
def _():
    b, a = witness_check_args()
    return {"call": lambda: _ks().check_witnesses(b.astype(np.float32), a, lens(), 2), "watch": [a]}


@case(
    "check-witnesses-after-shorter",
    "engine check",
    "`check_witnesses(before, after[:, :3], lens, 2)`",
    "WitnessError",
    argument="after",
    note="the in-place call keeps the shape",
)
def _():
    b, a = witness_check_args()
    return {"call": lambda: _ks().check_witnesses(b, a[:, :3], lens(), 2), "watch": [b, a]}


@case(
    "check-witnesses-outside-int32",
    "engine check",
    "`check_witnesses(before.astype(int64) + 2**40, after, lens, 2)`",
    "WitnessError",
    argument="before",
)
def _():
    b, a = witness_check_args()
    far = b.astype(np.int64) + 2**40
    return {"call": lambda: _ks().check_witnesses(far, a, lens(), 2), "watch": [far, a]}


@case(
    "check-witnesses-negative-segments",
    "engine check",
    "`check_witnesses(before, after, lens, -1)`",
    "WitnessError",
    argument="num_segments",
)
def _():
    b, a = witness_check_args()
    return {"call": lambda: _ks().check_witnesses(b, a, lens(), -1), "watch": [b, a]}


@case(
    "check-witnesses-int64",
    "engine check",
    "`check_witnesses(before.astype(int64), after.astype(int64), lens, 2)`",
    ACCEPTED,
    note="an int64 engine buffer whose values fit int32",
)
def _():
    b, a = witness_check_args()
    return {
        "call": lambda: _ks().check_witnesses(b.astype(np.int64), a.astype(np.int64), lens(), 2),
        "check": lambda rep: rep["rows"] == 2 and rep["wrong"] == 0,
    }


@case(
    "check-witnesses-lens-mismatch-off",
    "engine check",
    "`check_witnesses(before, after, [8, 6, 5], 0)`",
    "WitnessError",
    argument="context_lens",
    note="every row needs its length, the off switch included",
)
def _():
    b, a = witness_check_args()
    return {"call": lambda: _ks().check_witnesses(b, a, [8, 6, 5], 0), "watch": [b, a]}


@case(
    "check-witnesses-fewer-lens-off",
    "engine check",
    "`check_witnesses(before, after + 1, [], 0)`",
    "WitnessError",
    argument="context_lens",
    note="no row is left unjudged",
)
def _():
    b, a = witness_check_args()
    wrong = a + 1
    return {"call": lambda: _ks().check_witnesses(b, wrong, [], 0), "watch": [b, wrong]}


@case(
    "check-witnesses-65-segments",
    "engine check",
    "`check_witnesses(before, after, lens, 65)`",
    "WitnessError",
    argument="num_segments",
)
def _():
    b, a = witness_check_args()
    return {"call": lambda: _ks().check_witnesses(b, a, lens(), 65), "watch": [b, a]}


@case(
    "check-witnesses-reshaped-after",
    "engine check",
    "`check_witnesses(before [2, 4], after.reshape(4, 2), lens, 2)`",
    "WitnessError",
    argument="after",
    note="the same size in another shape is another buffer",
)
def _():
    b, a = witness_check_args()
    other = a.reshape(4, 2)
    return {"call": lambda: _ks().check_witnesses(b, other, lens(), 2), "watch": [b, other]}


@case(
    "slots-used-lens-mismatch",
    "metrics",
    "`slots_used_rows(rows [2, 4], [8])`",
    "WitnessError",
    argument="context_lens",
)
def _():
    r = learned()
    return {"call": lambda: _ks().slots_used_rows(r, [8]), "watch": [r]}


@case("slots-used-float", "metrics", "`slots_used_rows(rows.astype(float32), lens)`", "TypeError")
def _():
    r = learned().astype(np.float32)
    return {"call": lambda: _ks().slots_used_rows(r, lens()), "watch": [r]}


def slots_args():
    table = np.array([[3, 1]], np.int32)
    scores = np.arange(8, dtype=np.float32)[None]
    rows = np.array([[3 * 4 + 2, 1 * 4 + 3]], np.int64)  # positions 2 and 7
    return table, scores, rows


@case(
    "global-slots-1d-table",
    "engine check",
    "`GlobalSlots(block_table.ravel(), req_ids, 4)`",
    "SelectionError",
    argument="block_table",
)
def _():
    t, _, _ = slots_args()
    return {"call": lambda: _ks().GlobalSlots(t.ravel(), [0], 4), "watch": [t]}


@case(
    "global-slots-prefill-without-starts",
    "engine check",
    "`GlobalSlots(block_table, req_ids, 4, prefill_req_ids=[0])`",
    "SelectionError",
    argument="workspace_starts",
    note="the two go together",
)
def _():
    t, _, _ = slots_args()
    return {"call": lambda: _ks().GlobalSlots(t, [0], 4, prefill_req_ids=[0]), "watch": [t]}


@case(
    "global-slots-stride-below-page",
    "engine check",
    "`check_topk(scores, rows, slots=GlobalSlots(block_table, req_ids, 4, block_stride_rows=3))`",
    "SelectionError",
    argument="block_stride_rows",
    note="pages would overlap; a layout is judged when a check reads it",
)
def _():
    t, s, r = slots_args()
    return {
        "call": lambda: _ks().check_topk(s, r, slots=_ks().GlobalSlots(t, [0], 4, block_stride_rows=3)),
        "watch": [t, s, r],
    }


@case(
    "global-slots-req-count",
    "engine check",
    "`check_topk(scores [1, 8], rows, slots=GlobalSlots(…, req_ids=[0, 0], 4))`",
    "SelectionError",
    argument="req_ids",
    note="one request per checked row",
)
def _():
    t, s, r = slots_args()
    return {"call": lambda: _ks().check_topk(s, r, slots=_ks().GlobalSlots(t, [0, 0], 4)), "watch": [t, s, r]}


@case(
    "global-slots-req-past-table",
    "engine check",
    "`check_topk(scores, rows, slots=GlobalSlots(…, req_ids=[1], 4))`",
    "SelectionError",
    argument="req_ids",
)
def _():
    t, s, r = slots_args()
    return {"call": lambda: _ks().check_topk(s, r, slots=_ks().GlobalSlots(t, [1], 4)), "watch": [t, s, r]}


@case(
    "global-slots-prefill-past-starts",
    "engine check",
    "`check_topk(…, slots=GlobalSlots(…, prefill_req_ids=[1], workspace_starts=[0]))`",
    "SelectionError",
    argument="prefill_req_ids",
)
def _():
    t, s, r = slots_args()
    lay = _ks().GlobalSlots(t, [0], 4, prefill_req_ids=[1], workspace_starts=[0])
    return {"call": lambda: _ks().check_topk(s, r, slots=lay), "watch": [t, s, r]}


@case("check-slots-not-global-slots", "engine check", "`check_topk(scores, rows, slots='global')`", "TypeError")
def _():
    _, s, r = slots_args()
    return {"call": lambda: _ks().check_topk(s, r, slots="global"), "watch": [s, r]}


@case(
    "global-slot-outside-table",
    "engine check",
    "`check_topk(scores, rows with a slot of no page, slots=…)`",
    ACCEPTED,
    note="reported as not_in_table with the engine's value, not refused",
)
def _():
    t, s, r = slots_args()
    r[0, 1] = 5 * 4 + 1  # page 5: not in the request's table
    return {
        "call": lambda: _ks().check_topk(s, r, slots=_ks().GlobalSlots(t, [0], 4)),
        "check": lambda rep: rep["details"][0]["problems"][0] == {"reason": "not_in_table", "slot": 1, "value": 21},
    }


# -- nothing silent, inputs: transposed / reshaped / byte-swapped / misaligned --
# For every indexer, block-selection and paged entry point: an argument
# another one fixes the shape of is checked axis by axis (a transposed or
# reshaped one is refused, naming it); dense keys / queries / weights in
# non-native byte order or misaligned are converted once (the same result);
# a paged cache in non-native byte order is refused naming kv_cache
# (misaligned pages are read in place).


def ns_args():
    """n=3 queries, H=2 heads, d=4, 12 keys, two sequences (packed and paged)."""
    r = rng()
    return {
        "q": r.integers(-3, 4, size=(3, 2, 4)).astype(np.float32),
        "w": r.integers(-2, 3, size=(3, 2)).astype(np.float32),
        "k": r.integers(-3, 4, size=(12, 4)).astype(np.float32),
        "scale": np.linspace(0.5, 2.0, 12, dtype=np.float32),
        "pos": np.array([5, 8, 11]),
        "cu": np.array([0, 5, 12]),
        "sid": np.array([0, 1, 1]),
        "ppos": np.array([4, 3, 6]),
        "cache": r.integers(-3, 4, size=(6, 4, 4)).astype(np.float32),
        "table": np.array([[0, 2, 5], [1, 3, 4]], dtype=np.int32),
        "lens": np.array([7, 8]),
        "blocks": np.array([[[0, 1], [1, 2]], [[0, 2], [2, -1]], [[1, 2], [0, 1]]], dtype=np.int32),
    }


def ns_call(name, a, **kw):
    """Entry point `name` on the arrays of `a` (as ns_args)."""
    m, c = _ks(), cfg()
    calls = {
        "indexer_topk": lambda: m.indexer_topk(a["q"], a["w"], a["k"], a["pos"], 4, key_scale=a["scale"], **kw),
        "indexer_scores": lambda: m.indexer_scores(a["q"], a["w"], a["k"], a["pos"], key_scale=a["scale"], **kw),
        "indexer_magnitudes": lambda: m.indexer_magnitudes(
            a["q"], a["w"], a["k"], a["pos"], key_scale=a["scale"], **kw
        ),
        "indexer_topk_packed": lambda: m.indexer_topk_packed(
            a["q"], a["w"], a["k"], a["cu"], a["sid"], a["ppos"], 4, key_scale=a["scale"], **kw
        ),
        "indexer_topk_paged": lambda: m.indexer_topk_paged(
            a["q"], a["w"], a["cache"], a["table"], a["lens"], a["sid"], a["ppos"], 4, **kw
        ),
        "block_sparse_select": lambda: m.block_sparse_select(a["q"], a["k"], a["pos"], c, **kw),
        "block_scores": lambda: m.block_scores(a["q"], a["k"], a["pos"], c, **kw),
        "block_magnitudes": lambda: m.block_magnitudes(a["q"], a["k"], a["pos"], c, **kw),
        "block_sparse_select_packed": lambda: m.block_sparse_select_packed(
            a["q"], a["k"], a["cu"], a["sid"], a["ppos"], c, **kw
        ),
        "block_sparse_select_paged": lambda: m.block_sparse_select_paged(
            a["q"], a["cache"], a["table"], a["lens"], a["sid"], a["ppos"], c, **kw
        ),
        "positions_of_blocks": lambda: m.positions_of_blocks(a["blocks"], a["pos"], 12, c, **kw),
    }
    return calls[name]()


def ns_swapped(x):
    """The same values in the other byte order."""
    return x.byteswap().view(x.dtype.newbyteorder("S"))


def ns_misaligned(x):
    """The same values one byte off their alignment (np.frombuffer(buf, dtype, offset=1))."""
    buf = bytearray(x.nbytes + 1)
    m = np.frombuffer(buf, x.dtype, count=x.size, offset=1).reshape(x.shape)
    m[...] = x
    return m


_NS_INDEXER = ["indexer_topk", "indexer_scores", "indexer_magnitudes", "indexer_topk_packed", "indexer_topk_paged"]
_NS_DENSE = [
    "indexer_topk",
    "indexer_scores",
    "indexer_magnitudes",
    "indexer_topk_packed",
    "block_sparse_select",
    "block_scores",
    "block_magnitudes",
    "block_sparse_select_packed",
]
_NS_PAGED = ["indexer_topk_paged", "block_sparse_select_paged"]
_NS_ALL = _NS_INDEXER + [
    "block_sparse_select",
    "block_scores",
    "block_magnitudes",
    "block_sparse_select_packed",
    "block_sparse_select_paged",
    "positions_of_blocks",
]
_NS_POS = {n: ("ppos" if ("packed" in n or "paged" in n) else "pos") for n in _NS_ALL}
_NS_WORDS = {
    "w": "weights",
    "scale": "key_scale",
    "sid": "seq_ids",
    "table": "block_table",
    "k": "index_k",
    "pos": "query_pos",
    "ppos": "query_pos",
}


def _ns_refused(name, key, bend, how, argument):
    word = _NS_WORDS[key]

    @case(
        f"{name}-{word}-{how}",
        "transposed / reshaped",
        f"`{name}(…, {word}{bend[0]}, …)`",
        "SelectionError",
        argument=argument,
    )
    def _():
        a = ns_args()
        a[key] = np.ascontiguousarray(bend[1](a[key]))
        return {"call": lambda: ns_call(name, a), "watch": list(a.values())}


_T = (".T", lambda x: x.T)
_R = (".reshape(1, -1)", lambda x: x.reshape(1, -1))
for _n in _NS_ALL:
    if _n in _NS_INDEXER:
        _ns_refused(_n, "w", _T, "transposed", "weights")
        _ns_refused(_n, "w", _R, "reshaped", "weights")
    if _n in ("indexer_topk", "indexer_scores", "indexer_magnitudes", "indexer_topk_packed"):
        _ns_refused(_n, "scale", _R, "reshaped", "key_scale")
    if "packed" in _n or "paged" in _n:
        _ns_refused(_n, "sid", _R, "reshaped", "seq_ids")
    if _n in _NS_PAGED:
        _ns_refused(_n, "table", _T, "transposed", "block_table")
        _ns_refused(_n, "table", _R, "reshaped", "block_table")
    if _n in ("block_sparse_select", "block_scores", "block_magnitudes", "block_sparse_select_packed"):
        _ns_refused(_n, "k", _T, "transposed", "index_q")  # index_k [d, n]: its d disagrees with index_q's
    _ns_refused(_n, _NS_POS[_n], _R, "reshaped", "query_pos")


def _ns_out_transposed(name):
    @case(
        f"{name}-out-transposed",
        "transposed / reshaped",
        f"`{name}(…, out=<the output's shape, axes 0 and 1 swapped>)`",
        "SelectionError",
        argument="out",
    )
    def _():
        a = ns_args()
        want = ns_call(name, a)
        out = np.zeros((want.shape[1], want.shape[0]) + want.shape[2:], want.dtype)
        return {"call": lambda: ns_call(name, a, out=out), "watch": [out] + list(a.values())}


for _n in _NS_ALL:
    _ns_out_transposed(_n)


def _ns_dense(name, fmt, how):
    bend = ns_swapped if how == "byte-swapped" else ns_misaligned
    shown = {"byte-swapped": f"'>{fmt}'", "misaligned": f"misaligned {fmt}"}[how]

    @case(
        f"{name}-{how}-{fmt}",
        "byte order / alignment",
        f"`{name}(q, k as {shown}, …)`",
        ACCEPTED,
        note="converted once: the same result as native order"
        if how == "byte-swapped"
        else "copied once to an aligned array: the same result",
    )
    def _():
        import ml_dtypes

        a = ns_args()
        enc = {
            "f2": np.float16,
            "bf16": ml_dtypes.bfloat16,
            "f4": np.float32,
            "u2": np.float16,
            "fp8": ml_dtypes.float8_e4m3fn,
        }[fmt]
        kw = {"key_format": "float16", "query_format": "float16"} if fmt == "u2" else {}
        native = dict(a)
        for key in ("q", "k"):
            native[key] = a[key].astype(enc)
            if fmt == "u2":
                native[key] = native[key].view(np.uint16)
        bent = dict(native)
        for key in ("q", "k", "w", "scale"):
            bent[key] = bend(native[key])
        return {"call": lambda: ns_call(name, bent, **kw), "check": same(lambda: ns_call(name, native, **kw))}


for _n in _NS_DENSE:
    for _f in ("f2", "bf16", "f4", "u2"):
        _ns_dense(_n, _f, "byte-swapped")
    for _f in ("f2", "bf16", "fp8", "u2"):
        _ns_dense(_n, _f, "misaligned")


def _ns_paged(name, fmt, how):
    shown = {"byte-swapped": f"'>{fmt}'", "misaligned": f"misaligned {fmt}"}[how]
    refused = how == "byte-swapped"

    @case(
        f"{name}-kv-cache-{how}-{fmt}",
        "byte order / alignment",
        f"`{name}(q, kv_cache as {shown}, …)`",
        "SelectionError" if refused else ACCEPTED,
        argument="kv_cache" if refused else None,
        note="pages are read in place, never converted: pass native byte order"
        if refused
        else "read in place, byte by byte: the same result",
    )
    def _():
        import ml_dtypes

        a = ns_args()
        enc = {
            "f2": np.float16,
            "bf16": ml_dtypes.bfloat16,
            "f4": np.float32,
            "u2": np.float16,
            "fp8": ml_dtypes.float8_e4m3fn,
        }[fmt]
        kw = {"key_format": "float16"} if fmt == "u2" else {}
        native = dict(a)
        native["cache"] = a["cache"].astype(enc)
        if fmt == "u2":
            native["cache"] = native["cache"].view(np.uint16)
        bent = dict(native)
        bent["cache"] = (ns_swapped if refused else ns_misaligned)(native["cache"])
        spec = {"call": lambda: ns_call(name, bent, **kw), "watch": list(bent.values())}
        if not refused:
            spec["check"] = same(lambda: ns_call(name, native, **kw))
        return spec


for _n in _NS_PAGED:
    for _f in ("f2", "bf16", "f4", "u2"):
        _ns_paged(_n, _f, "byte-swapped")
    for _f in ("f2", "bf16", "fp8", "u2"):
        _ns_paged(_n, _f, "misaligned")


@case(
    "indexer-topk-str",
    "transposed / reshaped",
    "`indexer_topk(q, w, k, pos, '4')`",
    "TypeError",
    note="topk must be an integer, got str",
)
def _():
    a = ns_args()
    return {"call": lambda: _ks().indexer_topk(a["q"], a["w"], a["k"], a["pos"], "4"), "watch": list(a.values())}


@case(
    "positions-of-blocks-out-aliases-blocks",
    "transposed / reshaped",
    "`positions_of_blocks(blocks, pos, 12, out=<a view over blocks' memory>)`",
    "SelectionError",
    argument="out",
)
def _():
    a = ns_args()
    buf = np.zeros(3 * 2 * 8, np.int32)
    buf[:12] = a["blocks"].ravel()
    a["blocks"] = buf[:12].reshape(3, 2, 2)
    out = buf.reshape(3, 2, 8)
    return {"call": lambda: ns_call("positions_of_blocks", a, out=out), "watch": [buf]}


@case(
    "positions-of-blocks-out",
    "transposed / reshaped",
    "`positions_of_blocks(blocks [3, 2, 2], pos, 12, out=out)`",
    ACCEPTED,
    note="out is filled and returned",
)
def _():
    a = ns_args()
    out = np.full((3, 2, 8), 7, np.int32)
    return {
        "call": lambda: ns_call("positions_of_blocks", a, out=out),
        "check": lambda r: r is out and _equal(r, ns_call("positions_of_blocks", a)),
    }


# -- output buffers and shapes axis by axis (outputs and checkers) ----------
# One out= contract for every fixed-shape output: dtype, exact shape, no
# input's memory; a refused call leaves the buffer and its inputs untouched.


def _sentinel(shape, dtype):
    return np.full(shape, 7, dtype)


def _sharing(array, shape, dtype):
    """A copy of ``array`` and a ``shape`` / ``dtype`` buffer over its bytes."""
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    blob = np.zeros(max(array.nbytes, n) + 8, np.uint8)
    inp = blob[: array.nbytes].view(array.dtype).reshape(array.shape)
    inp[...] = array
    return inp, blob[:n].view(dtype).reshape(shape)


def _oracle_inputs():
    return np.arange(10, dtype=np.float64).reshape(2, 5), np.array([2, 4])


def _metric_inputs():
    return learned(), lens().astype(np.int64)


# (id, function, the call as written, domain, out keyword, its shape, dtype, call(out kwargs, args)-builder)
_OUT_FUNCS = [
    (
        "attention-probabilities",
        "attention_probabilities(q, k, pos",
        "SelectionError",
        "out",
        (2, 2, 6),
        np.float64,
        lambda: (list(qkv()[:2]) + [qkv()[3]], lambda a, **o: _ks().attention_probabilities(*a, **o)),
    ),
    (
        "dense-attention",
        "dense_attention(q, k, v, pos",
        "SelectionError",
        "out",
        (2, 2, 4),
        np.float32,
        lambda: (list(qkv()), lambda a, **o: _ks().dense_attention(*a, **o)),
    ),
    (
        "dense-attention-lse",
        "dense_attention(q, k, v, pos",
        "SelectionError",
        "lse_out",
        (2, 2),
        np.float32,
        lambda: (list(qkv()), lambda a, **o: _ks().dense_attention(*a, **o)),
    ),
    (
        "sparse-attention",
        "sparse_attention(q, k, v, pos, selection",
        "SelectionError",
        "out",
        (2, 2, 4),
        np.float32,
        lambda: (list(qkv()) + [selection()], lambda a, **o: _ks().sparse_attention(*a, **o)),
    ),
    (
        "sparse-attention-lse",
        "sparse_attention(q, k, v, pos, selection",
        "SelectionError",
        "lse_out",
        (2, 2),
        np.float32,
        lambda: (list(qkv()) + [selection()], lambda a, **o: _ks().sparse_attention(*a, **o)),
    ),
    (
        "oracle-topk",
        "oracle_topk(attention, pos, 2",
        "SelectionError",
        "out",
        (2, 2),
        np.int32,
        lambda: (list(_oracle_inputs()), lambda a, **o: _ks().oracle_topk(*a, 2, **o)),
    ),
    (
        "selector-rows",
        "Selector.local(3).rows(pos",
        "SelectionError",
        "out",
        (2, 3),
        np.int32,
        lambda: ([np.array([2, 7])], lambda a, **o: _ks().Selector.local(3).rows(*a, **o)),
    ),
    (
        "segment-coverage-rows",
        "segment_coverage_rows(rows, lens, 4",
        "WitnessError",
        "out",
        (2,),
        np.float64,
        lambda: (list(_metric_inputs()), lambda a, **o: _ks().segment_coverage_rows(*a, 4, **o)),
    ),
    (
        "slots-used-rows",
        "slots_used_rows(rows, lens",
        "WitnessError",
        "out",
        (2,),
        np.int64,
        lambda: (list(_metric_inputs()), lambda a, **o: _ks().slots_used_rows(*a, **o)),
    ),
    (
        "attention-mass-recall-rows",
        "attention_mass_recall_rows(rows, attention [4, 8]",
        "WitnessError",
        "out",
        (4,),
        np.float64,
        lambda: ([learned(), np.ones((4, 8))], lambda a, **o: _ks().attention_mass_recall_rows(*a, **o)),
    ),
    (
        "output-relative-error-rows",
        "output_relative_error_rows(a [2, 3], b [2, 3]",
        "SelectionError",
        "out",
        (2,),
        np.float64,
        lambda: (
            [np.ones((2, 3), np.float32), np.zeros((2, 3), np.float32)],
            lambda a, **o: _ks().output_relative_error_rows(*a, **o),
        ),
    ),
    (
        "topology-witness-indices",
        "topology_witness_indices(learned, lens, 4",
        "WitnessError",
        "out",
        (2, 4),
        np.int32,
        lambda: ([learned(), lens()], lambda a, **o: _ks().topology_witness_indices(*a, 4, **o)),
    ),
    (
        "apply-topology-witnesses",
        "apply_topology_witnesses(learned, lens, 2, 4, 2",
        "WitnessError",
        "out",
        (2, 4),
        np.int32,
        lambda: ([learned(), lens()], lambda a, **o: _ks().apply_topology_witnesses(*a, 2, 4, 2, **o)),
    ),
]


def _out_cases():
    for cid, call, err, key, shape, dtype, make in _OUT_FUNCS:
        wrong_dtype = np.int16 if np.dtype(dtype).kind == "f" else np.float32
        wrong_shape = shape[:-1] + (shape[-1] + 1,)
        dt = np.dtype(dtype).name

        def wrong_type(make=make, key=key, shape=shape, wrong_dtype=wrong_dtype):
            args, f = make()
            buf = _sentinel(shape, wrong_dtype)
            return {
                "call": lambda: f(args, **{key: buf}),
                "watch": [buf] + [a for a in args if isinstance(a, np.ndarray)],
            }

        def wrong_size(make=make, key=key, wrong_shape=wrong_shape, dtype=dtype):
            args, f = make()
            buf = _sentinel(wrong_shape, dtype)
            return {
                "call": lambda: f(args, **{key: buf}),
                "watch": [buf] + [a for a in args if isinstance(a, np.ndarray)],
            }

        def sharing(make=make, key=key, shape=shape, dtype=dtype):
            args, f = make()
            args[0], buf = _sharing(np.asarray(args[0]), shape, dtype)
            return {"call": lambda: f(args, **{key: buf}), "watch": [a for a in args if isinstance(a, np.ndarray)]}

        def accepted(make=make, key=key, shape=shape, dtype=dtype):
            args, f = make()
            buf = _sentinel(shape, dtype)
            want = f(args)

            def check(result):
                got = result if not isinstance(result, tuple) else result[0 if key == "out" else 1]
                w = want if not isinstance(want, tuple) else want[0 if key == "out" else 1]
                return got is buf and np.array_equal(got, w, equal_nan=True)

            return {"call": lambda: f(args, **{key: buf}), "check": check}

        yield (
            f"{cid}-{key.replace('_', '-')}-dtype",
            f"`{call}, {key}={wrong_dtype.__name__} array)`",
            "TypeError",
            None,
            "",
            wrong_type,
        )
        yield (
            f"{cid}-{key.replace('_', '-')}-shape",
            f"`{call}, {key}={dt} {list(wrong_shape)})`",
            err,
            key,
            f"must be exactly {list(shape)}",
            wrong_size,
        )
        yield (
            f"{cid}-{key.replace('_', '-')}-aliases-input",
            f"`{call}, {key}=a view of the first input's memory)`",
            err,
            key,
            "an out= never shares an input's memory",
            sharing,
        )
        yield (
            f"{cid}-{key.replace('_', '-')}-accepted",
            f"`{call}, {key}={dt} {list(shape)})`",
            ACCEPTED,
            None,
            "filled with what the call without it returns, and returned",
            accepted,
        )


for _cid, _call, _expect, _arg, _note, _build in _out_cases():
    case(_cid, "output buffers", _call, _expect, argument=_arg, note=_note)(_build)


@case(
    "dense-attention-out-and-lse-share",
    "output buffers",
    "`dense_attention(q, k, v, pos, out=o, lse_out=o's memory)`",
    "SelectionError",
    argument="lse_out",
    note="the two outputs never share memory",
)
def _():
    q, k, v, pos = qkv()
    blob = np.zeros(2 * 2 * 4, np.float32)
    o, lse = blob.reshape(2, 2, 4), blob[:4].reshape(2, 2)
    return {"call": lambda: _ks().dense_attention(q, k, v, pos, out=o, lse_out=lse), "watch": [blob, q, k, v]}


@case(
    "scalar-query-pos-attention",
    "batched positions",
    "`dense_attention(q[:1], k, v, 5)`",
    ACCEPTED,
    note="one integer is a batch of one query: the same as [5]",
)
def _():
    q, k, v, _ = qkv()
    return {
        "call": lambda: _ks().dense_attention(q[:1], k, v, 5),
        "check": same(lambda: _ks().dense_attention(q[:1], k, v, [5])),
    }


@case(
    "scalar-query-pos-oracle",
    "batched positions",
    "`oracle_topk(attention[:1], 3, 2)`",
    ACCEPTED,
    note="the same as [3]",
)
def _():
    a, _ = _oracle_inputs()
    return {"call": lambda: _ks().oracle_topk(a[:1], 3, 2), "check": same(lambda: _ks().oracle_topk(a[:1], [3], 2))}


@case(
    "scalar-query-pos-many-queries",
    "batched positions",
    "`attention_probabilities(q [2 queries], k, 5)`",
    "SelectionError",
    argument="query_pos",
    note="one integer is one query, never broadcast",
)
def _():
    q, k, _, _ = qkv()
    return {"call": lambda: _ks().attention_probabilities(q, k, 5), "watch": [q, k]}


@case(
    "transposed-selection",
    "wrong ndim/shape",
    "`sparse_attention(q, k, v, pos, selection.transpose(1, 0, 2))`",
    "SelectionError",
    argument="selection",
    note="checked axis by axis; the refusal shows both shapes",
)
def _():
    q, k, v, pos = qkv()
    sel = np.ascontiguousarray(selection().transpose(1, 0, 2))  # [1, 2, 3]: n_kv_heads first
    return {"call": lambda: _ks().sparse_attention(q, k, v, pos, sel), "watch": [sel, q, k, v]}


@case(
    "transposed-dense",
    "wrong ndim/shape",
    "`output_relative_error_rows(a [2, 3], b [3, 2])`",
    "SelectionError",
    argument="dense",
    note="dense is checked against sparse axis by axis",
)
def _():
    a, b = np.ones((2, 3), np.float32), np.ones((3, 2), np.float32)
    return {"call": lambda: _ks().output_relative_error_rows(a, b), "watch": [a, b]}


@case(
    "transposed-attention-3d",
    "metrics",
    "`attention_mass_recall_rows(selection [2, 1, 3], probs.transpose(1, 0, 2))`",
    "WitnessError",
    argument="attention",
    note="3-D attention must be [n_queries, n_q_heads, n_keys]",
)
def _():
    q, k, _, pos = qkv()
    probs = np.ascontiguousarray(_ks().attention_probabilities(q[:, :1], k, pos).transpose(1, 0, 2))  # [1, 2, 6]
    sel = selection()
    return {"call": lambda: _ks().attention_mass_recall_rows(sel, probs), "watch": [sel, probs]}


@case(
    "coverage-rows-lens-short",
    "metrics",
    "`segment_coverage_rows(rows [2, 4], [8], 4)`",
    "WitnessError",
    argument="context_lens",
    note="one length per row: [rows=2]",
)
def _():
    r = learned()
    return {"call": lambda: _ks().segment_coverage_rows(r, [8], 4), "watch": [r]}


@case(
    "check-topk-transposed-magnitudes",
    "engine check",
    "`check_topk(scores [2, 5], rows, magnitudes [5, 2], rtol=0.1)`",
    "SelectionError",
    argument="magnitudes",
    note="magnitudes have the scores' shape, axis by axis",
)
def _():
    s, r = check_args()
    m = np.ones((5, 2), np.float32)
    return {"call": lambda: _ks().check_topk(s, r, magnitudes=m, rtol=0.1), "watch": [s, r, m]}


def _blocks_3d():
    q = index_q(True)
    k = index_k()
    pos = np.array([9, 15])
    return _ks().block_scores(q, k, pos, cfg()), _ks().block_sparse_select(q, k, pos, cfg()), np.array([3, 4])


@case(
    "check-blocks-3d-round-trip",
    "engine check",
    "`check_blocks(block_scores(q3d, k, pos), block_sparse_select(q3d, k, pos), visible, cfg)`",
    ACCEPTED,
    note="3-D rows [n_queries, n_kv_heads, width], visible_blocks [n_queries]",
)
def _():
    s, r, nb = _blocks_3d()
    return {
        "call": lambda: _ks().check_blocks(s, r, nb, cfg()),
        "check": lambda rep: rep["wrong"] == 0 and rep["rows"] == 4,
    }


@case(
    "check-blocks-3d-head-major",
    "engine check",
    "`check_blocks(block_scores, block_sparse_select(…, head_major=True), visible, cfg, head_major=True)`",
    ACCEPTED,
)
def _():
    s, _, nb = _blocks_3d()
    hm = _ks().block_sparse_select(index_q(True), index_k(), np.array([9, 15]), cfg(), head_major=True)
    return {
        "call": lambda: _ks().check_blocks(s, hm, nb, cfg(), head_major=True),
        "check": lambda rep: rep["wrong"] == 0,
    }


@case(
    "check-blocks-3d-per-row-visible",
    "engine check",
    "`check_blocks(scores 3-D, rows 3-D, visible_blocks [n_queries * n_kv_heads], cfg)`",
    "SelectionError",
    argument="visible_blocks",
    note="with 3-D rows, one count per query",
)
def _():
    s, r, nb = _blocks_3d()
    per_row = np.repeat(nb, 2)
    return {"call": lambda: _ks().check_blocks(s, r, per_row, cfg()), "watch": [s, r, per_row]}


@case(
    "check-blocks-3d-scores-2d-rows",
    "engine check",
    "`check_blocks(block_scores 3-D, rows.reshape(4, -1), …)`",
    "SelectionError",
    argument="block_scores",
    note="block_scores and rows have one form",
)
def _():
    s, r, nb = _blocks_3d()
    flat = r.reshape(4, -1)
    return {"call": lambda: _ks().check_blocks(s, flat, np.repeat(nb, 2), cfg()), "watch": [s, flat]}


@case(
    "check-blocks-head-major-2d",
    "engine check",
    "`check_blocks(block_scores, rows 2-D, visible, cfg, head_major=True)`",
    "SelectionError",
    argument="head_major",
    note="head_major describes 3-D rows",
)
def _():
    s, r, nb = block_check_args()
    return {"call": lambda: _ks().check_blocks(s, r, nb, cfg(), head_major=True), "watch": [s, r, nb]}


@case(
    "check-blocks-transposed-rows-3d",
    "engine check",
    "`check_blocks(scores [2, 2, 4], rows [2, 2, w] read head-major with 3 queries)`",
    "SelectionError",
    argument="rows",
    note="checked axis by axis; both shapes in the refusal",
)
def _():
    s, r, nb = _blocks_3d()
    r3 = np.ascontiguousarray(np.concatenate([r, r[:1]], axis=0))  # [3, 2, w]
    return {"call": lambda: _ks().check_blocks(s, r3, nb, cfg()), "watch": [s, r3]}


@case(
    "check-witnesses-lens-length",
    "engine check",
    "`check_witnesses(before [2, 4], after, [8], 2)`",
    "WitnessError",
    argument="context_lens",
    note="context_lens is [rows]",
)
def _():
    b, a = witness_check_args()
    return {"call": lambda: _ks().check_witnesses(b, a, [8], 2), "watch": [b, a]}


# -- nothing silent, the other entry points: transposed / reshaped / byte-swapped / misaligned --
# The attention functions, the oracle, the witness and metric functions, the
# engine checkers and GlobalSlots, one array argument at a time: transposed
# (or, for a 1-D one, reshaped) it is refused, naming the argument the
# disagreement shows up in; in non-native byte order or misaligned an input
# is converted (copied) once and gives the native-order result, while
# scatter_topology_witnesses' topk_indices, written in place, is refused.


def ot_attention():
    r = rng()
    return {
        "q": r.standard_normal((3, 2, 4)).astype(np.float32),
        "k": r.standard_normal((7, 1, 4)).astype(np.float32),
        "v": r.standard_normal((7, 1, 5)).astype(np.float32),
        "query_pos": np.array([2, 4, 6]),
        "selection": np.array([[[0, 1, 2]], [[1, 3, 4]], [[0, 5, 6]]], np.int32),
    }


def ot_candidates():
    """Three candidate rows of width 4 (not square: a transposed one cannot pass)."""
    return {
        "candidates": np.array([[0, 5, 2, -1], [3, 1, -1, -1], [4, 4, 0, 7]], np.int32),
        "context_lens": np.array([8, 6, 5], np.int32),
    }


def ot_witness_check():
    before, after = witness_check_args()
    return {"before": before, "after": after}


def ot_check_topk():
    """Row 0 is wrong (position 0 in place of 2): the report carries scores and a margin of the magnitudes."""
    s, _ = check_args()
    return {
        "scores": s,
        "rows": np.array([[3, 1, 0], [3, 0, 1]], np.int64),
        "magnitudes": np.array([[1, 3, 1, 2, 1], [1, 1, 1, 2, 1]], np.float32),
    }


def ot_check_blocks():
    """Under BlockSparseConfig(4, 3, 1, 1) row 0 is wrong (block 4 in place of 1): the report carries scores."""
    s, _, nb = block_check_args()
    return {"block_scores": s, "rows": np.array([[5, 0, 4], [0, 3, 1]], np.int64), "visible_blocks": nb}


def ot_global_slots():
    _, s, r = slots_args()
    # Three requests of two pages; row 0 is request 2's (pages 3, 1), as in slots_args.
    return {
        "block_table": np.array([[0, 2], [5, 4], [3, 1]], np.int32),
        "req_ids": np.array([2], np.int32),
        "scores": s,
        "rows": r,
    }


def _ot_scatter(m, a):
    m.scatter_topology_witnesses(a["topk_indices"], a["context_lens"], 2)
    return a["topk_indices"]


# name: (the arrays, the call as written ({argument} marks each array bent), the call)
_OT = {
    "attention_probabilities": (
        lambda: ot_attention(),
        "attention_probabilities({q}, {k}, query_pos)",
        lambda m, a: m.attention_probabilities(a["q"], a["k"], a["query_pos"]),
    ),
    "dense_attention": (
        lambda: ot_attention(),
        "dense_attention({q}, {k}, {v}, query_pos)",
        lambda m, a: m.dense_attention(a["q"], a["k"], a["v"], a["query_pos"]),
    ),
    "sparse_attention": (
        lambda: ot_attention(),
        "sparse_attention({q}, {k}, {v}, query_pos, {selection})",
        lambda m, a: m.sparse_attention(a["q"], a["k"], a["v"], a["query_pos"], a["selection"]),
    ),
    "oracle_topk": (
        lambda: {"attention": rng().random((3, 7)), "query_pos": np.array([2, 4, 6])},
        "oracle_topk({attention}, query_pos, 3)",
        lambda m, a: m.oracle_topk(a["attention"], a["query_pos"], 3),
    ),
    "topology_witness_indices": (
        lambda: {"learned": learned(), "context_lens": lens()},
        "topology_witness_indices({learned}, {context_lens}, 4)",
        lambda m, a: m.topology_witness_indices(a["learned"], a["context_lens"], 4),
    ),
    "apply_topology_witnesses": (
        lambda: {"learned": learned(), "context_lens": lens()},
        "apply_topology_witnesses({learned}, {context_lens}, 2, 4, 2)",
        lambda m, a: m.apply_topology_witnesses(a["learned"], a["context_lens"], 2, 4, 2),
    ),
    "scatter_topology_witnesses": (
        lambda: {"topk_indices": learned(), "context_lens": lens()},
        "scatter_topology_witnesses({topk_indices}, {context_lens}, 2)",
        _ot_scatter,
    ),
    "segment_coverage_rows": (
        ot_candidates,
        "segment_coverage_rows({candidates}, {context_lens}, 4)",
        lambda m, a: m.segment_coverage_rows(a["candidates"], a["context_lens"], 4),
    ),
    "attention_mass_recall_rows": (
        lambda: {"candidates": ot_candidates()["candidates"], "attention": rng().random((6, 8))},
        "attention_mass_recall_rows({candidates}, {attention})",
        lambda m, a: m.attention_mass_recall_rows(a["candidates"], a["attention"]),
    ),
    "slots_used_rows": (
        ot_candidates,
        "slots_used_rows({candidates}, {context_lens})",
        lambda m, a: m.slots_used_rows(a["candidates"], a["context_lens"]),
    ),
    "output_relative_error_rows": (
        lambda: {
            "sparse": rng().standard_normal((3, 5)).astype(np.float32),
            "dense": rng().standard_normal((3, 5)).astype(np.float32)[::-1].copy(),
        },
        "output_relative_error_rows({sparse}, {dense})",
        lambda m, a: m.output_relative_error_rows(a["sparse"], a["dense"]),
    ),
    "check_topk": (
        ot_check_topk,
        "check_topk({scores}, {rows}, rtol=0.1, magnitudes={magnitudes})",
        lambda m, a: m.check_topk(a["scores"], a["rows"], rtol=0.1, magnitudes=a["magnitudes"]),
    ),
    "check_blocks": (
        ot_check_blocks,
        "check_blocks({block_scores}, {rows}, visible_blocks, BlockSparseConfig(4, 3, 1, 1))",
        lambda m, a: m.check_blocks(a["block_scores"], a["rows"], a["visible_blocks"], m.BlockSparseConfig(4, 3, 1, 1)),
    ),
    "check_witnesses": (
        ot_witness_check,
        "check_witnesses({before}, {after}, lens, 2)",
        lambda m, a: m.check_witnesses(a["before"], a["after"], lens(), 2),
    ),
    "GlobalSlots": (
        ot_global_slots,
        "check_topk(scores, rows, slots=GlobalSlots({block_table}, {req_ids}, 4))",
        lambda m, a: m.check_topk(a["scores"], a["rows"], slots=m.GlobalSlots(a["block_table"], a["req_ids"], 4)),
    ),
}

_OT_T2 = (".T", lambda x: x.T)
_OT_T3 = (".transpose(1, 0, 2)", lambda x: x.transpose(1, 0, 2))
_OT_R = (".reshape(1, -1)", lambda x: x.reshape(1, -1))

# (name, argument, bend, the exception, the argument it names, note): what the library really does.
_OT_REFUSED = [
    ("attention_probabilities", "q", _OT_T3, "SelectionError", "query_pos", "q's query axis meets query_pos"),
    ("attention_probabilities", "k", _OT_T3, "SelectionError", "n_q_heads", "7 KV heads cannot serve q's 2 heads"),
    ("dense_attention", "q", _OT_T3, "SelectionError", "query_pos", "q's query axis meets query_pos"),
    ("dense_attention", "k", _OT_T3, "SelectionError", "v", "k fixes v's [n_keys, n_kv_heads]"),
    ("dense_attention", "v", _OT_T3, "SelectionError", "v", None),
    ("sparse_attention", "q", _OT_T3, "SelectionError", "selection", "q fixes selection's [n_queries, n_kv_heads]"),
    ("sparse_attention", "k", _OT_T3, "SelectionError", "v", "k fixes v's [n_keys, n_kv_heads]"),
    ("sparse_attention", "v", _OT_T3, "SelectionError", "v", None),
    ("sparse_attention", "selection", _OT_T3, "SelectionError", "selection", None),
    ("oracle_topk", "attention", _OT_T2, "SelectionError", "query_pos", "one position per attention row"),
    ("topology_witness_indices", "learned", _OT_T2, "WitnessError", "context_lens", "one length per learned row"),
    ("topology_witness_indices", "context_lens", _OT_R, "WitnessError", "context_lens", None),
    ("apply_topology_witnesses", "learned", _OT_T2, "WitnessError", "context_lens", "one length per learned row"),
    ("apply_topology_witnesses", "context_lens", _OT_R, "WitnessError", "context_lens", None),
    ("scatter_topology_witnesses", "topk_indices", _OT_T2, "WitnessError", "context_lens", "one length per buffer row"),
    ("scatter_topology_witnesses", "context_lens", _OT_R, "WitnessError", "context_lens", None),
    ("segment_coverage_rows", "candidates", _OT_T2, "WitnessError", "context_lens", "one length per candidate row"),
    ("segment_coverage_rows", "context_lens", _OT_R, "WitnessError", "context_lens", None),
    (
        "attention_mass_recall_rows",
        "candidates",
        _OT_T2,
        "WitnessError",
        "attention",
        "6 attention rows are no multiple of 4 candidate rows",
    ),
    ("attention_mass_recall_rows", "attention", _OT_T2, "WitnessError", "attention", None),
    ("slots_used_rows", "candidates", _OT_T2, "WitnessError", "context_lens", "one length per candidate row"),
    ("slots_used_rows", "context_lens", _OT_R, "WitnessError", "context_lens", None),
    ("output_relative_error_rows", "sparse", _OT_T2, "SelectionError", "dense", "dense is checked against sparse"),
    ("output_relative_error_rows", "dense", _OT_T2, "SelectionError", "dense", None),
    ("check_topk", "scores", _OT_T2, "SelectionError", "rows", "scores and rows have one row each per row"),
    ("check_topk", "rows", _OT_T2, "SelectionError", "rows", None),
    ("check_topk", "magnitudes", _OT_T2, "SelectionError", "magnitudes", None),
    ("check_blocks", "block_scores", _OT_T2, "SelectionError", "block_scores", None),
    ("check_blocks", "rows", _OT_T2, "SelectionError", "rows", None),
    ("check_witnesses", "before", _OT_T2, "WitnessError", "after", "after is checked against before"),
    ("check_witnesses", "after", _OT_T2, "WitnessError", "after", None),
    ("GlobalSlots", "block_table", _OT_T2, "SelectionError", "req_ids", "req_ids[0] = 2: the table now has 2 requests"),
    ("GlobalSlots", "req_ids", _OT_R, "SelectionError", "req_ids", None),
]

# Arguments written in place: never converted, so refused (exception, argument it names, note) when bent.
_OT_IN_PLACE = {
    ("scatter_topology_witnesses", "topk_indices"): {
        "byte-swapped": ("TypeError", None, "written in place, so never converted: pass native int32"),
        "misaligned": ("WitnessError", "topk_indices", "written in place, so never copied"),
    },
}


def _ot_shown(name, key, text):
    """The call as written, `key` shown as `text` and every other array by its name."""
    template = _OT[name][1]
    names = {f: f for f in _OT[name][0]() if "{" + f + "}" in template}
    names[key] = text
    return "`" + template.format(**names) + "`"


def _ot_refused(name, key, bend, expect, argument, note):
    how = "reshaped" if bend is _OT_R else "transposed"

    @case(
        f"{name}-{key.replace('_', '-')}-{how}",
        "transposed / reshaped",
        _ot_shown(name, key, key + bend[0]),
        expect,
        argument=argument,
        note=note or "",
    )
    def _():
        make, _, call = _OT[name]
        a = make()
        a[key] = np.ascontiguousarray(bend[1](a[key]))
        return {"call": lambda: call(_ks(), a), "watch": list(a.values())}


for _r in _OT_REFUSED:
    _ot_refused(*_r)


def _ot_bent(name, key, how):
    bend = ns_swapped if how == "byte-swapped" else ns_misaligned
    code = _OT[name][0]()[key].dtype.str[1:]
    shown = {"byte-swapped": f"{key} as '>{code}'", "misaligned": f"{key} as misaligned {code}"}[how]
    refused = _OT_IN_PLACE.get((name, key), {}).get(how)
    if refused:
        expect, argument, note = refused
    else:
        expect, argument = ACCEPTED, None
        note = (
            "converted once: the same result as native order"
            if how == "byte-swapped"
            else "copied once to an aligned array: the same result"
        )

    @case(
        f"{name}-{key.replace('_', '-')}-{how}",
        "byte order / alignment",
        _ot_shown(name, key, shown),
        expect,
        argument=argument,
        note=note,
    )
    def _():
        make, _, call = _OT[name]
        a = make()
        a[key] = bend(a[key])
        spec = {"call": lambda: call(_ks(), a), "watch": list(a.values())}
        if not refused:
            spec["check"] = same(lambda: call(_ks(), make()))
        return spec


for _n, _k in [(_r[0], _r[1]) for _r in _OT_REFUSED]:
    for _how in ("byte-swapped", "misaligned"):
        _ot_bent(_n, _k, _how)


# -- DeepSeek-V4 attention sets and vLLM's combined index rows ----------------------

V4 = "V4 sets / combined rows"


def v4_args(**bend):
    """vLLM's `combine_topk_swa_indices` arguments: two requests, m = W = 4, topk = 2."""
    a = {
        "topk_indices": np.array([[1, 0], [0, 1], [1, 0], [-1, 0]], np.int32),
        "query_start_loc": np.array([0, 3, 4]),
        "seq_lens": np.array([8, 4]),
        "gather_lens": np.array([8, 4]),
        "window_size": 4,
        "compress_ratio": 4,
        "topk": 2,
        "M": 20,
        "N": 8,
    }
    a.update(bend)
    return a


def v4_refused(id, call, expect, argument, note="", **bend):
    @case(id, V4, call, expect, argument=argument, note=note)
    def _():
        a = v4_args(**bend)
        out, lens_out = np.full((4, 128), 7, np.int32), np.full(4, 7, np.int32)
        return {
            "call": lambda: _ks().combine_topk_swa_indices(**a, out=out, lens_out=lens_out),
            "watch": [out, lens_out] + [v for v in a.values() if isinstance(v, np.ndarray)],
        }


v4_refused(
    "combine-float-topk",
    "`combine_topk_swa_indices(topk_indices.astype(float32), …)`",
    "TypeError",
    None,
    topk_indices=v4_args()["topk_indices"].astype(np.float32),
)
v4_refused(
    "combine-topk-1d",
    "`combine_topk_swa_indices(topk_indices.ravel(), …)`",
    "SelectionError",
    "topk_indices",
    topk_indices=v4_args()["topk_indices"].ravel(),
)
v4_refused(
    "combine-topk-narrow",
    "`combine_topk_swa_indices(topk_indices[:, :1], …, topk=2, …)`",
    "SelectionError",
    "topk_indices",
    "fewer columns than topk",
    topk_indices=np.zeros((4, 1), np.int32),
)
v4_refused(
    "combine-qsl-not-from-0",
    "`combine_topk_swa_indices(…, query_start_loc=[1, 3, 4], …)`",
    "SelectionError",
    "query_start_loc",
    "must rise from 0 to num_tokens",
    query_start_loc=np.array([1, 3, 4]),
)
v4_refused(
    "combine-qsl-falls",
    "`combine_topk_swa_indices(…, query_start_loc=[0, 5, 4], …)`",
    "SelectionError",
    "query_start_loc",
    "checked before any row is read",
    query_start_loc=np.array([0, 5, 4]),
)
v4_refused(
    "combine-qsl-short",
    "`combine_topk_swa_indices(…, query_start_loc=[0, 3], …)`",
    "SelectionError",
    "seq_lens",
    "query_start_loc fixes num_reqs = 1",
    query_start_loc=np.array([0, 4]),
)
v4_refused(
    "combine-query-past-seq",
    "`combine_topk_swa_indices(…, seq_lens=[2, 4], …)`",
    "SelectionError",
    "seq_lens",
    "a query longer than its sequence",
    seq_lens=np.array([2, 4]),
    gather_lens=np.array([2, 4]),
)
v4_refused(
    "combine-gather-past-seq",
    "`combine_topk_swa_indices(…, gather_lens=[9, 4], …)`",
    "SelectionError",
    "gather_lens",
    seq_lens=np.array([8, 4]),
    gather_lens=np.array([9, 4]),
)
v4_refused(
    "combine-window-before-gather",
    "`combine_topk_swa_indices(…, gather_lens=[4, 4], …)`",
    "SelectionError",
    "gather_lens",
    "the first window starts at token 2, the gathered tokens at 4",
    gather_lens=np.array([4, 4]),
)
v4_refused(
    "combine-topk-past-N",
    "`combine_topk_swa_indices(topk_indices with 8, …, N=8)`",
    "SelectionError",
    "topk_indices",
    "it would read the window's tokens as entries",
    topk_indices=np.array([[1, 0], [0, 1], [1, 8], [0, -1]], np.int32),
)
v4_refused(
    "combine-M-overlaps-next",
    "`combine_topk_swa_indices(…, M=15, N=8)`",
    "SelectionError",
    "M",
    "request 0's window would run into request 1's workspace",
    M=15,
)
v4_refused(
    "combine-negative-window",
    "`combine_topk_swa_indices(…, window_size=-1, …)`",
    "SelectionError",
    "window_size",
    window_size=-1,
)
v4_refused(
    "combine-ratio-0",
    "`combine_topk_swa_indices(…, compress_ratio=0, …)`",
    "SelectionError",
    "compress_ratio",
    compress_ratio=0,
)
v4_refused("combine-huge-M", "`combine_topk_swa_indices(…, M=2**31, …)`", "SelectionError", "M", M=2**31)


@case(
    "combine-minus-one-copied",
    V4,
    "`combine_topk_swa_indices(topk_indices with -1 in the top-k part, …)`",
    ACCEPTED,
    note="copied as vLLM does: request 1's -1 becomes M*1 - 1 = 19",
)
def _():
    def check(result):
        return int(result[0][3, 0]) == 19 and _equal(result[0], _ref().combine_topk_swa_indices(**v4_args())[0])

    return {"call": lambda: _ks().combine_topk_swa_indices(**v4_args()), "check": check}


@case("combine-lens-out-int64", V4, "`combine_topk_swa_indices(…, lens_out=int64 array)`", "TypeError")
def _():
    lens_out = np.full(4, 7, np.int64)
    return {"call": lambda: _ks().combine_topk_swa_indices(**v4_args(), lens_out=lens_out), "watch": [lens_out]}


@case(
    "combine-lens-out-is-out",
    V4,
    "`combine_topk_swa_indices(…, out=out, lens_out=out[:, 0])`",
    "SelectionError",
    argument="lens_out",
)
def _():
    out = np.full((4, 128), 7, np.int32)
    lens_out = out[:, 0]
    return {"call": lambda: _ks().combine_topk_swa_indices(**v4_args(), out=out, lens_out=lens_out), "watch": [out]}


@case(
    "combine-out-wrong-shape",
    V4,
    "`combine_topk_swa_indices(…, out=int32 [4, 8])`",
    "SelectionError",
    argument="out",
    note="the rows are roundup(topk + window_size, 128) wide",
)
def _():
    out = np.full((4, 8), 7, np.int32)
    return {"call": lambda: _ks().combine_topk_swa_indices(**v4_args(), out=out), "watch": [out]}


def v4_set_refused(id, call, expect, argument, make, note=""):
    @case(id, V4, call, expect, argument=argument, note=note)
    def _():
        fn, out = make()
        return {"call": lambda: fn(_ks(), out), "watch": [out]}


v4_set_refused(
    "expand-invisible-entry",
    "`expand_entries([[3]], query_pos=[11], 4)`",
    "SelectionError",
    "entry_rows",
    lambda: (lambda k, o: k.expand_entries(np.array([[3]], np.int32), [11], 4, out=o), np.full((1, 4), 7, np.int32)),
    "entry 3 is complete only at token 15",
)
v4_set_refused(
    "expand-entry-minus-2",
    "`expand_entries([[-2]], [11], 4)`",
    "SelectionError",
    "entry_rows",
    lambda: (lambda k, o: k.expand_entries(np.array([[-2]], np.int32), [11], 4, out=o), np.full((1, 4), 7, np.int32)),
)
v4_set_refused(
    "expand-width-too-small",
    "`expand_entries([[0]], [11], 4, tail=True, width=6)`",
    "SelectionError",
    "width",
    lambda: (
        lambda k, o: k.expand_entries(np.array([[0]], np.int32), [11], 4, tail=True, width=6, out=o),
        np.full((1, 6), 7, np.int32),
    ),
    "the expansion writes k*m + m - 1 = 7 columns",
)
v4_set_refused(
    "expand-one-pos-two-rows",
    "`expand_entries(rows [2, 1], query_pos=11, 4)`",
    "SelectionError",
    "query_pos",
    lambda: (lambda k, o: k.expand_entries(np.zeros((2, 1), np.int32), 11, 4, out=o), np.full((2, 4), 7, np.int32)),
)
v4_set_refused(
    "entry-tokens-minus-3",
    "`compressed_entry_tokens([0, -3], 4, overlap=True)`",
    "SelectionError",
    "entries",
    lambda: (
        lambda k, o: k.compressed_entry_tokens(np.array([0, -3]), 4, overlap=True, out=o),
        np.full((2, 2), 7, np.int32),
    ),
)
v4_set_refused(
    "entry-tokens-past-int32",
    "`compressed_entry_tokens([2**30], 4, overlap=False)`",
    "SelectionError",
    "entries",
    lambda: (
        lambda k, o: k.compressed_entry_tokens(np.array([2**30]), 4, overlap=False, out=o),
        np.full((1, 2), 7, np.int32),
    ),
    "its end, 4 * (2**30 + 1), is past int32",
)
v4_set_refused(
    "entry-tokens-float",
    "`compressed_entry_tokens([0.5], 4, overlap=False)`",
    "TypeError",
    None,
    lambda: (
        lambda k, o: k.compressed_entry_tokens(np.array([0.5]), 4, overlap=False, out=o),
        np.full((1, 2), 7, np.int32),
    ),
)
v4_set_refused(
    "entry-tokens-no-overlap-arg",
    "`compressed_entry_tokens([0], 4)`",
    "TypeError",
    None,
    lambda: (lambda k, o: k.compressed_entry_tokens(np.array([0]), 4, out=o), np.full((1, 2), 7, np.int32)),
    "overlap (CSA or HCA) is required",
)
v4_set_refused(
    "visible-entries-negative-pos",
    "`visible_entries([-1], 4, 3)`",
    "SelectionError",
    "query_pos",
    lambda: (lambda k, o: k.visible_entries(np.array([-1]), 4, 3, out=o), np.full((1, 3), 7, np.int32)),
)
v4_set_refused(
    "visible-entries-ratio-0",
    "`visible_entries([3], 0, 3)`",
    "SelectionError",
    "compress_ratio",
    lambda: (lambda k, o: k.visible_entries([3], 0, 3, out=o), np.full((1, 3), 7, np.int32)),
)
v4_set_refused(
    "window-pos-past-int32",
    "`window_positions([2**31], 4)`",
    "SelectionError",
    "query_pos",
    lambda: (lambda k, o: k.window_positions(np.array([2**31]), 4, out=o), np.full((1, 4), 7, np.int32)),
)


def _ref():
    import kvselect.reference

    return kvselect.reference


# ---------------------------------------------------------------------------
# Running the catalogue (in the subprocess)
# ---------------------------------------------------------------------------


def _base_bytes(a):
    """The bytes of the whole memory an array views (its base, if any)."""
    while isinstance(getattr(a, "base", None), np.ndarray):
        a = a.base
    return np.asarray(a).tobytes(order="A") if isinstance(a, np.ndarray) else None


def run_case(c: Case) -> dict:
    if c.torch:
        try:
            import torch  # noqa: F401
        except ImportError:
            return {"id": c.id, "outcome": "skipped"}
    spec = c.build()
    watch = spec.get("watch", [])
    before = [_base_bytes(a) for a in watch]
    rec: dict[str, Any] = {"id": c.id}
    try:
        result = spec["call"]()
        rec["outcome"] = ACCEPTED
        check = spec.get("check")
        rec["check"] = bool(check(result)) if check else True
    except BaseException as e:  # PanicException derives from BaseException
        rec["outcome"] = type(e).__name__
        rec["mro"] = [t.__name__ for t in type(e).__mro__]
        rec["message"] = str(e)[:300]
        rec["argument"] = getattr(e, "argument", None)
    rec["untouched"] = all(_base_bytes(a) == b for a, b in zip(watch, before))
    return rec


def run_all(out=sys.stdout):
    for c in CASES:
        out.write(json.dumps(run_case(c)) + "\n")
        out.flush()  # a crash leaves every earlier line behind


def markdown() -> str:
    lines = [
        "# Bad inputs: what each one raises",
        "",
        "Generated from the catalogue in `tests/python/test_bad_inputs.py` (`python",
        "tests/python/test_bad_inputs.py --markdown`), where every row is a test run in a",
        "subprocess: the interpreter never crashes, no `PanicException` ever reaches",
        "Python, and a refused in-place call leaves its buffer byte-identical.",
        "`WitnessError` and `SelectionError` are subclasses of `KvselectError`, a",
        "`ValueError`, whose `argument` attribute names the argument at fault (shown",
        "in parentheses; for a `TypeError`, the argument its message begins with).",
        "*accepted* means the call succeeds (the test checks its result); torch rows",
        "run only when torch is installed.",
        "",
        "| Category | Input | Result |",
        "| --- | --- | --- |",
    ]
    for c in CASES:
        result = "*accepted*" if c.expect == ACCEPTED else f"`{c.expect}`"
        if c.argument:
            result += f" (`{c.argument}`)"
        if c.note:
            result += f" — {c.note}"
        call = c.call.replace("|", "\\|")
        lines.append(f"| {c.category} | {call} | {result} |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------
# The tests
# ---------------------------------------------------------------------------

if pytest is not None:

    @pytest.fixture(scope="module")
    def catalogue_run():
        env = dict(os.environ, RAYON_NUM_THREADS="2")
        proc = subprocess.run(
            [sys.executable, str(HERE), "--run"],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        results = {}
        for line in proc.stdout.splitlines():
            rec = json.loads(line)
            results[rec["id"]] = rec
        return proc, results

    def test_the_catalogue_subprocess_exits_normally(catalogue_run):
        proc, results = catalogue_run
        missing = [c.id for c in CASES if c.id not in results]
        assert proc.returncode == 0 and not missing, (
            f"the catalogue subprocess exited with {proc.returncode}; "
            f"first case without a result (the one it died on): {missing[:1]}\n{proc.stderr[-2000:]}"
        )

    def test_case_ids_are_unique():
        ids = [c.id for c in CASES]
        assert len(ids) == len(set(ids))

    @pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
    def test_bad_input(catalogue_run, c):
        _, results = catalogue_run
        rec = results.get(c.id)
        assert rec is not None, "the subprocess died before this case"
        if rec["outcome"] == "skipped":
            pytest.skip("torch is not installed")
        assert "PanicException" not in rec.get("mro", []), f"a panic reached Python: {rec}"
        assert rec["outcome"] == c.expect, f"expected {c.expect}, got {rec}"
        if c.expect == ACCEPTED:
            assert rec["check"], f"accepted, but the result is wrong: {rec}"
        else:
            assert rec["untouched"], f"a refused call modified its buffer: {rec}"
        if c.expect in ("WitnessError", "SelectionError", "KvselectError"):
            assert "ValueError" in rec["mro"]
            assert rec["argument"] == c.argument, f"names {rec['argument']!r}: {rec['message']}"
        elif c.argument is not None:  # a TypeError names its argument first in the message
            assert rec["message"].startswith(c.argument), f"does not name {c.argument!r}: {rec['message']}"

    def test_the_readme_table_is_generated_from_the_catalogue():
        assert DOC.read_text() == markdown(), (
            "docs/bad-inputs.md is stale: python tests/python/test_bad_inputs.py --markdown > docs/bad-inputs.md"
        )


if __name__ == "__main__":
    if "--run" in sys.argv:
        run_all()
    elif "--markdown" in sys.argv:
        sys.stdout.write(markdown())
    else:
        print(__doc__)
