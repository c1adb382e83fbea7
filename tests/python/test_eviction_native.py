"""The eviction baselines' native selection (``src/eviction/``, issue 44's
speed item): equal to the NumPy twin bit for bit at every SIMD level and
thread count, on random and adversarial prefixes; every bad input refused
naming its argument, with every buffer left byte-identical."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from levels import require_simd

import kvselect as ks
from kvselect import reference as ref


def _case(rng, i, *, max_p=40):
    """One KV head's prefix: groups of 1, 2 and 8; every fifth case's keys
    repeated (equal logits, tied scores), every fifth's queries zero
    (uniform attention, every score tied)."""
    group = (1, 2, 8)[i % 3]
    p_len = int(rng.integers(2, max_p))
    d = int(rng.integers(1, 9))
    q = rng.standard_normal((p_len, group, d)).astype(np.float32)
    k = rng.standard_normal((p_len, d)).astype(np.float32)
    if i % 5 == 3:
        k = k[rng.integers(0, max(1, p_len // 3), p_len)]
    if i % 5 == 4:
        q[:] = 0
    budget = int(rng.integers(0, p_len + 6))  # budgets past the prefix too
    window = p_len - 1 if i % 4 == 0 else int(rng.integers(1, p_len))  # P = window + 1: the first window
    return q, k, budget, window, float(rng.uniform(0.1, 2.0))


def _large(rng, p_len=600, group=2, d=64):
    """Past the parallel and chunking thresholds, with a d that leaves a
    tail after the 32-key tiles."""
    q = rng.standard_normal((p_len, group, d)).astype(np.float32)
    k = rng.standard_normal((p_len, d)).astype(np.float32)
    return q, k


def _native(q, k, budget, window, scale):
    recent = budget // 2
    return {
        "snap": ks.snapkv_scores(q, k, window=window, scale=scale),
        "tova": ks.tova_scores(q[-1], k, scale=scale),
        "obs": ks.observed_attention_scores(q, k, scale=scale),
        "h2o": ks.h2o_keep(q, k, budget, recent=recent, scale=scale),
        "keep": ks.keep_top(ks.snapkv_scores(q, k, window=window, scale=scale), budget),
    }


def _twin(q, k, budget, window, scale):
    return {
        "snap": ref.snapkv_scores(q, k, scale, window=window),
        "tova": ref.tova_scores(q[-1], k, scale),
        "obs": ref.observed_attention_scores(q, k, scale),
        "h2o": ref.h2o_keep(q, k, budget, scale, recent=budget // 2),
        "keep": ref.snapkv_keep(q, k, budget, scale, window=window),
    }


def _same(got, want, what):
    assert got.dtype == want.dtype or (got.dtype == np.int64 and want.dtype.kind == "i"), what
    if got.dtype == np.float64:
        assert np.array_equal(got.view(np.uint64), want.view(np.uint64)), what
    else:
        assert np.array_equal(got, want), what


def test_the_native_selection_equals_the_twin_bit_for_bit():
    rng = np.random.default_rng(44)
    for i in range(600):
        q, k, budget, window, scale = _case(rng, i)
        got, want = _native(q, k, budget, window, scale), _twin(q, k, budget, window, scale)
        for name in want:
            _same(got[name], want[name], (i, name))


def test_snapkv_pooling_of_any_width_equals_the_twin_bit_for_bit():
    # Kernels from 1 tap to far wider than the pooled row (its taps in the zero
    # padding add exact zeros): the same bits as the twin's padded sum.
    rng = np.random.default_rng(45)
    for i in range(300):
        q, k, _, window, scale = _case(rng, i)
        keys = len(k) - window
        kernel = int(rng.integers(1, 2 * keys + 8)) if i % 10 else 100_001
        got = ks.snapkv_scores(q, k, window=window, kernel=kernel, scale=scale)
        _same(got, ref.snapkv_scores(q, k, scale, window=window, kernel=kernel), (i, kernel))


def test_snapkv_pooling_wider_than_any_row_costs_the_row():
    # Every pooled entry then averages the whole row over the kernel: the scores
    # before the window are one value. kernel = 2**40 + 1 once added every tap.
    q, k = _large(np.random.default_rng(46), p_len=40)
    got = ks.snapkv_scores(q, k, window=8, kernel=2**40 + 1)
    assert got.shape == (40,) and np.all(got[:32] == got[0]) and got[0] > 0


def test_large_prefixes_equal_the_twin_and_every_thread_count():
    rng = np.random.default_rng(45)
    q, k = _large(rng, p_len=300, group=2, d=37)
    got, want = _native(q, k, 64, 64, 0.2), _twin(q, k, 64, 64, 0.2)
    for name in want:
        _same(got[name], want[name], name)
    q, k = _large(rng)
    before = ks.get_num_threads()
    try:
        ks.set_num_threads(1)
        one = _native(q, k, 128, 64, 0.125)
        ks.set_num_threads(2)
        two = _native(q, k, 128, 64, 0.125)
    finally:
        ks.set_num_threads(before)
    for name in one:
        _same(two[name], one[name], name)


_CHILD = """
import sys, numpy as np, kvselect as ks
sys.path.insert(0, sys.argv[4])
from test_eviction_native import _native
src = np.load(sys.argv[1])
assert ks.simd_level() == sys.argv[3], ks.simd_level()
out = {}
for i in range(int(src["n"])):
    got = _native(src[f"q{i}"], src[f"k{i}"], int(src[f"b{i}"]), int(src[f"w{i}"]), float(src[f"s{i}"]))
    out.update({f"{name}{i}": v for name, v in got.items()})
np.savez(sys.argv[2], **out)
"""


@pytest.mark.parametrize("level", ["scalar", "avx2"])
def test_every_simd_level_equals_the_twin(tmp_path, level):
    require_simd()
    rng = np.random.default_rng(46)
    arrays, expected = {"n": np.array(201)}, {}
    for i in range(201):
        if i == 200:  # past the parallel threshold: against this process's native
            q, k = _large(rng)
            budget, window, scale = 100, 64, 0.125
            want = _native(q, k, budget, window, scale)
        else:
            q, k, budget, window, scale = _case(rng, i)
            want = _twin(q, k, budget, window, scale)
        arrays.update({f"q{i}": q, f"k{i}": k, f"b{i}": np.array(budget), f"w{i}": np.array(window)})
        arrays[f"s{i}"] = np.array(scale)
        expected.update({f"{name}{i}": v for name, v in want.items()})
    np.savez(tmp_path / "in.npz", **arrays)
    here = os.path.dirname(os.path.abspath(__file__))
    subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path / "in.npz"), str(tmp_path / "out.npz"), level, here],
        check=True,
        env=dict(os.environ, KVSELECT_SIMD=level),
        timeout=600,
    )
    got = np.load(tmp_path / "out.npz")
    for name, want in expected.items():
        _same(got[name], want, name)


def test_hand_worked_examples():
    # Uniform attention over identical keys: TOVA's last query gives 1/P to each.
    k = np.eye(4, dtype=np.float32)
    assert ks.tova_scores(np.zeros((1, 4), np.float32), k).tolist() == [0.25, 0.25, 0.25, 1.25]
    # H2O, one head, zero queries (tests/python/test_eviction.py works these by hand).
    q, k = np.zeros((4, 1, 2), np.float32), np.ones((4, 2), np.float32)
    assert ks.h2o_keep(q, k, 2, recent=0).tolist() == [0, 1]
    assert ks.h2o_keep(q, k, 2, recent=1).tolist() == [0, 3]
    assert ks.h2o_keep(q, k, 2, recent=2).tolist() == [2, 3]
    assert ks.keep_top([0.5, 2.0, 0.5, 2.0, 0.5, 1.0], 3).tolist() == [1, 3, 5]
    assert ks.keep_top([0.0, -0.0, 0.0], 2).tolist() == [0, 1]
    assert ks.keep_top([], 3).tolist() == []


def _arrays():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((6, 2, 3)).astype(np.float32)
    k = rng.standard_normal((6, 3)).astype(np.float32)
    return q, k


def _nan(a, at=1):
    a = a.copy()
    a.flat[at] = np.nan
    return a


_REFUSALS = [
    # (entry point, call on (q, k), the argument named)
    ("snapkv_scores", lambda q, k: ks.snapkv_scores(q[:, 0], k, window=2), "q"),
    ("snapkv_scores", lambda q, k: ks.snapkv_scores(q[:, :0], k, window=2), "q"),
    ("snapkv_scores", lambda q, k: ks.snapkv_scores(_nan(q), k, window=2), "q"),
    ("snapkv_scores", lambda q, k: ks.snapkv_scores(q, k[:5], window=2), "k"),
    ("snapkv_scores", lambda q, k: ks.snapkv_scores(q, k[:, :2], window=2), "k"),
    ("snapkv_scores", lambda q, k: ks.snapkv_scores(q, _nan(k), window=2), "k"),
    ("snapkv_scores", lambda q, k: ks.snapkv_scores(q, k, window=6), "window"),
    ("snapkv_scores", lambda q, k: ks.snapkv_scores(q, k, window=0), "window"),
    ("snapkv_scores", lambda q, k: ks.snapkv_scores(q, k, window=-1), "window"),
    ("snapkv_scores", lambda q, k: ks.snapkv_scores(q, k, window=2, kernel=0), "kernel"),
    ("snapkv_scores", lambda q, k: ks.snapkv_scores(q, k, window=2, scale=float("inf")), "scale"),
    ("snapkv_scores", lambda q, k: ks.snapkv_scores(q, k, window=2, scale=1e300), "scale"),
    ("tova_scores", lambda q, k: ks.tova_scores(q, k), "q_last"),
    ("tova_scores", lambda q, k: ks.tova_scores(_nan(q[-1]), k), "q_last"),
    ("tova_scores", lambda q, k: ks.tova_scores(q[-1, :0], k), "q_last"),
    ("tova_scores", lambda q, k: ks.tova_scores(q[-1], k[:0]), "k"),
    ("tova_scores", lambda q, k: ks.tova_scores(q[-1], k[:, :2]), "k"),
    ("tova_scores", lambda q, k: ks.tova_scores(q[-1], k, scale=float("nan")), "scale"),
    ("observed_attention_scores", lambda q, k: ks.observed_attention_scores(q, _nan(k, 7)), "k"),
    ("observed_attention_scores", lambda q, k: ks.observed_attention_scores(q[:5], k), "k"),
    ("observed_attention_scores", lambda q, k: ks.observed_attention_scores(q, k, scale=-1e300), "scale"),
    ("h2o_keep", lambda q, k: ks.h2o_keep(q, k, 2, recent=3), "recent"),
    ("h2o_keep", lambda q, k: ks.h2o_keep(q, k, 2, recent=-1), "recent"),
    ("h2o_keep", lambda q, k: ks.h2o_keep(q, k, -2, recent=0), "budget"),
    ("h2o_keep", lambda q, k: ks.h2o_keep(_nan(q), k, 2, recent=1), "q"),
    ("keep_top", lambda q, k: ks.keep_top(np.array([1.0, np.nan]), 1), "scores"),
    ("keep_top", lambda q, k: ks.keep_top(np.ones((2, 2)), 1), "scores"),
    ("keep_top", lambda q, k: ks.keep_top(np.ones(3), -1), "budget"),
]


@pytest.mark.parametrize("call, argument", [(c, a) for _, c, a in _REFUSALS], ids=[f"{n}-{a}" for n, _, a in _REFUSALS])
def test_bad_inputs_are_refused_naming_the_argument_and_change_nothing(call, argument):
    q, k = _arrays()
    q0, k0 = q.copy(), k.copy()
    with pytest.raises(ks.SelectionError, match=rf"\b{argument}\b") as e:
        call(q, k)
    assert e.value.argument == argument
    assert isinstance(e.value, ValueError)
    assert q.tobytes() == q0.tobytes() and k.tobytes() == k0.tobytes()


def test_non_numbers_are_type_errors():
    """A TypeError here is PyO3's, not the KvselectError family's, so it has no
    ``.argument``: a refused extraction names its argument in a note ("while
    processing 'scale'", Python >= 3.11 only), a missing one in its message."""
    q, k = _arrays()
    with pytest.raises(TypeError, match=r"^must be real number, not str") as e:
        ks.snapkv_scores(q, k, window=2, scale="big")
    assert str(e.value) == "must be real number, not str"
    assert not isinstance(e.value, ks.KvselectError)
    if sys.version_info >= (3, 11):
        assert e.value.__notes__ == ["while processing 'scale'"]
    with pytest.raises(TypeError, match=r"^h2o_keep\(\) missing 1 required keyword argument: 'recent'$") as e:
        ks.h2o_keep(q, k, 2)  # recent is required
    assert not isinstance(e.value, ks.KvselectError)
