"""NSA's Eq. 9 window (``window="eq9"``, the paper's selection scores over overlapping
compressed keys): the window pinned on a hand-made sequence against fla's, the core
against the twin within its bound, every SIMD level's bits, and the refusals."""

from __future__ import annotations

import numpy as np
import pytest
from levels import assert_child_equals, require_simd

import kvselect as ks
from kvselect.reference import nsa as RN

SEED = 9009


def test_the_papers_window_is_not_the_overlapping_keys():
    """Tokens 144 .. 175 stand out (d = 1): compressed key 9 (tokens 144 .. 175) peaks,
    keys 8 and 10 half. fla's block means put them in block 2 (tokens 128 .. 191); Eq. 9
    sums keys ``[4j - 4, 4j]`` weighted 1, 2, 2, 2, 1, so block 3 (keys 8 .. 12: 8 once,
    9 and 10 twice) outscores block 2 (keys 4 .. 8: 8 once) — the window of keys that
    overlap block 2 would be ``[7, 11]``."""
    k = np.zeros((512, 1, 1), np.float32)
    k[144:176] = 4.0
    q = np.ones((1, 1, 1), np.float32)
    fla = ks.nsa_select(q, k, 4, scale=1.0)
    eq9 = ks.nsa_select(q, k, 4, scale=1.0, window="eq9")
    assert fla[0, 0].tolist() == [0, 2, 6, 7]  # block 0 and the query's last two forced
    assert eq9[0, 0].tolist() == [0, 3, 6, 7]
    s = ks.nsa_block_scores(q, k, scale=1.0, window="eq9")[0, 0]
    p = RN.eq9_compress_keys(k, 32, 16)[0][:, 0, 0]  # the keys' values: 4 at key 9, 2 at 8, 10
    assert p[8] == 2.0 and p[9] == 4.0 and p[10] == 2.0
    e = np.exp(p - p.max()) / np.exp(p - p.max()).sum()  # one head's softmax (all 31 keys seen)
    assert s[2] == pytest.approx(e[4] + 2 * e[5] + 2 * e[6] + 2 * e[7] + e[8], rel=1e-6)
    assert s[3] == pytest.approx(e[8] + 2 * e[9] + 2 * e[10] + 2 * e[11] + e[12], rel=1e-6)
    assert s[1] == pytest.approx(e[0] + 2 * e[1] + 2 * e[2] + 2 * e[3] + e[4], rel=1e-6)
    assert np.array_equal(RN.nsa_select(q, k, 4, scale=1.0, window="eq9"), eq9)


def _case(rng):
    h, g = int(rng.choice([1, 2])), int(rng.choice([1, 2, 16]))
    d = int(rng.integers(1, 16))
    bs, kz, st = [(64, 32, 16), (16, 8, 4), (8, 4, 2), (8, 8, 4), (6, 4, 2)][int(rng.integers(0, 5))]
    n = int(rng.integers(1, 400))
    n_q = int(rng.integers(1, min(n, 4) + 1))
    if rng.random() < 0.3:
        k = rng.integers(-2, 3, (n, h, d)).astype(np.float32)
        q = rng.integers(-1, 2, (n_q, h * g, d)).astype(np.float32)
    else:
        k = rng.standard_normal((n, h, d)).astype(np.float32)
        q = rng.standard_normal((n_q, h * g, d)).astype(np.float32)
    return q, k, dict(block_size=bs, kernel_size=kz, kernel_stride=st)


def test_eq9_equals_the_twin_within_the_bound():
    """Thousands of rows (decode and prefill chunks, short sequences, ties, groups of 1
    and 16, several geometries): the core's rows equal the twin's but for swaps inside
    the core's bound, and its block scores lie within ``R B + T`` of the exact ones."""
    rng = np.random.default_rng(SEED)
    rows_checked = worst = 0.0
    for _ in range(300):
        q, k, geo = _case(rng)
        n = int(rng.integers(1, 8))
        rows = ks.nsa_select(q, k, n, window="eq9", **geo)
        got = ks.nsa_block_scores(q, k, window="eq9", **geo).astype(np.float64)
        exact = RN.nsa_block_scores(q, k, window="eq9", **geo)
        R, T = RN.eq9_score_bound(q, k, **geo)
        fin = np.isfinite(exact)
        assert np.array_equal(got[~fin], exact[~fin])
        err = np.abs(got[fin] - exact[fin])
        lim = np.broadcast_to(R[..., None], exact.shape)[fin] * np.abs(exact[fin]) + T
        assert (err <= lim).all()
        if err.size:
            worst = max(worst, float((err / lim).max()))
        ok = RN.nsa_rows_within_bound(rows, exact, (R, T), n)
        assert ok.all(), geo
        rows_checked += ok.size
    assert rows_checked > 1000 and 0.0 < worst <= 1.0


_CHILD = """
import sys, numpy as np, kvselect as ks
src = np.load(sys.argv[1])
out = {}
for i in range(int(src["n"])):
    q, k = src[f"q{i}"], src[f"k{i}"]
    out[f"s{i}"] = ks.nsa_block_scores(q, k, window="eq9")
    out[f"r{i}"] = ks.nsa_select(q, k, 6, window="eq9")
np.savez(sys.argv[2], **out)
"""


@pytest.mark.parametrize("level", ["scalar", "avx2"])
def test_every_simd_level_gives_the_same_bits(tmp_path, level):
    require_simd()
    rng = np.random.default_rng(SEED + 1)
    arrays, expected = {"n": np.array(6)}, {}
    for i in range(6):
        n, n_q, hq, d = (6000, 16, 32, 128) if i == 0 else (int(rng.integers(100, 900)), 3, 4, 16)
        q = rng.standard_normal((n_q, hq, d)).astype(np.float32)
        k = rng.standard_normal((n, 2, d)).astype(np.float32)
        arrays.update({f"q{i}": q, f"k{i}": k})
        expected[f"s{i}"] = ks.nsa_block_scores(q, k, window="eq9")
        expected[f"r{i}"] = ks.nsa_select(q, k, 6, window="eq9")
    np.savez(tmp_path / "in.npz", **arrays)
    assert_child_equals(_CHILD, tmp_path, level, expected, timeout=600)


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        (dict(window="paper"), "window"),
        (dict(window="eq9", kernel_stride=24), "kernel_stride"),  # does not divide 64
        (dict(window="eq9", kernel_stride=0), "kernel_stride"),
        (dict(window="eq9", kernel_size=24), "kernel_size"),  # not whole strides of 16
        (dict(window="eq9", cu_seqlens=[0, 100]), "window"),
    ],
)
def test_refusals_name_the_argument_and_change_nothing(kwargs, argument):
    rng = np.random.default_rng(SEED + 2)
    q = rng.standard_normal((2, 4, 8)).astype(np.float32)
    k = rng.standard_normal((100, 2, 8)).astype(np.float32)
    before = (q.copy(), k.copy())
    for fn in (ks.nsa_select, ks.nsa_block_scores):
        with pytest.raises(ks.SelectionError, match=argument) as e:
            fn(q, k, **kwargs)
        assert e.value.argument == argument
    if "cu_seqlens" not in kwargs:  # the keys' compression alone (a zero stride once divided by zero)
        with pytest.raises(ks.SelectionError, match=argument) as e:
            ks.nsa_compress_keys(k, **kwargs)
        assert e.value.argument == argument
    with pytest.raises(ValueError, match=argument):
        RN.nsa_select(q, k, **kwargs)
    assert np.array_equal(q, before[0]) and np.array_equal(k, before[1])
