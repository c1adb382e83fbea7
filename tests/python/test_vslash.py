"""MInference's vertical-slash estimate: the native core against the NumPy
twin (``kvselect.reference.vslash``, float64, written from the source) on
thousands of random and adversarial cases, every key format, every SIMD level.

The core computes in float32; the twin gives the exact sums and, per
candidate, the rigorous bound on the core's distance from them
(``vslash_error_bounds``). The core's sums must lie within it, and its
selection must be a top-k of the exact sums up to it: no candidate it dropped
is certainly above one it kept. Where the exact margin exceeds the bound the
two selections are equal; the rows that differ are counted.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from levels import assert_child_equals, require_simd

import kvselect as ks
import kvselect.reference as ref

SEED = 42
EXP = ks._core._exp_bound()


def _forced(variant: str) -> int:
    return 100 if variant == "kernel" else 30


def _valid_top(got: np.ndarray, exact: np.ndarray, err: np.ndarray, forced: int, k: int) -> bool:
    """``got`` is a top-``k`` of ``exact`` (forced ids first, the nearest when they
    do not fit) up to ``err``: no dropped candidate certainly above a kept one."""
    L = len(exact)
    if len(got) != k or len(np.unique(got)) != k or got.min() < 0 or got.max() >= L:
        return False
    if forced >= k:
        return np.array_equal(np.sort(got), np.arange(k))
    kept = np.zeros(L, bool)
    kept[got] = True
    if not kept[:forced].all():
        return False
    free = np.arange(L) >= forced
    k_free, d_free = kept & free, ~kept & free
    if not k_free.any() or not d_free.any():
        return True
    return bool((exact - err)[d_free].max() <= (exact + err)[k_free].min())


def _case(rng, L=None, kind="random"):
    L = int(rng.integers(1, 260)) if L is None else L
    hk = int(rng.integers(1, 3))
    h = hk * int(rng.integers(1, 3))
    d = int(rng.choice([1, 3, 8, 16, 24, 40]))
    spread = float(rng.choice([0.3, 1.0, 3.0]))
    keys = (rng.standard_normal((L, hk, d)) * spread).astype(np.float32)
    q = (rng.standard_normal((h, min(64, L), d)) * spread).astype(np.float32)
    if kind == "ties":  # equal keys: every row uniform, sums tied in runs
        keys[:] = keys[0]
    elif kind == "grid":  # half-integers: many exactly equal scores
        keys = np.round(keys * 2) / 2
        q = np.round(q * 2) / 2
    elif kind == "zero_q":
        q[:] = 0
    elif kind == "peaked":  # large scores: most probabilities underflow
        q *= 8
    return q, keys


def _compare(q, keys, v, s, variant="kernel", key_scale=None, key_format=None, bf=None):
    gv, gs = ks.vslash_select(q, keys, v, s, variant=variant, key_scale=key_scale, key_format=key_format)
    cv, cs = ks.vslash_scores(q, keys, variant=variant, key_scale=key_scale, key_format=key_format)
    xv, xs = ref.vslash_scores(q, keys, variant=variant, key_scale=key_scale, key_format=key_format)
    ev, es = ref.vslash_error_bounds(q, keys, EXP, variant=variant, key_scale=key_scale, key_format=key_format)
    assert np.all(np.abs(cv - xv) <= ev) and np.all(np.abs(cs - xs) <= es)
    L = keys.shape[0]
    nv, ns = ks.reference.vslash_sizes(L, v, s)
    assert gv.shape == (q.shape[0], nv) and gs.shape == (q.shape[0], ns)
    wv, ws = ref.vslash_select(q, keys, v, s, variant=variant, key_scale=key_scale, key_format=key_format)
    differ = 0
    for h in range(q.shape[0]):
        assert np.all(np.diff(gv[h]) > 0) and np.all(np.diff(gs[h]) > 0)  # ascending, distinct
        assert _valid_top(gv[h], xv[h], ev[h], 30, nv), (h, "vertical")
        assert _valid_top(gs[h], xs[h], es[h], _forced(variant), ns), (h, "slash")
        differ += not (np.array_equal(gv[h], wv[h]) and np.array_equal(gs[h], ws[h]))
    return differ


@pytest.mark.parametrize("kind", ["random", "ties", "grid", "zero_q", "peaked"])
def test_core_equals_the_twin_up_to_the_bound(kind):
    rng = np.random.default_rng([SEED, hash(kind) % 1000])
    rows = differ = 0
    for _ in range(300):
        q, keys = _case(rng, kind=kind)
        variant = str(rng.choice(["kernel", "search"]))
        v, s = int(rng.integers(0, 150)), int(rng.integers(0, 160))
        differ += _compare(q, keys, v, s, variant)
        rows += q.shape[0]
    print(f"\n{kind}: {rows} rows, {differ} differ from the exact selection within the bound")
    if kind == "random":
        assert differ < rows // 10


@pytest.mark.parametrize("L", [1, 2, 7, 29, 30, 31, 49, 50, 63, 64, 65, 99, 100, 101, 128, 129])
def test_short_sequences_and_the_edges_of_the_forced_parts(L):
    rng = np.random.default_rng([SEED, L])
    for v, s in [(0, 0), (30, 50), (31, 99), (40, 100), (200, 300)]:
        q, keys = _case(rng, L=L)
        for variant in ("kernel", "search"):
            _compare(q, keys, v, s, variant)


def test_key_formats_read_in_place():
    """bfloat16, float16, fp8 e4m3fn (with per-key scales), raw bit views: the
    twin decodes them from their bits; the core reads them in place."""
    rng = np.random.default_rng(SEED + 1)
    for trial in range(120):
        q, keys = _case(rng)
        fmt = ["bfloat16", "float16", "fp8", "fp8_raw", "bf16_raw"][trial % 5]
        scale, kf = None, None
        if fmt == "bfloat16":
            k = keys.astype(ml_dtypes.bfloat16)
        elif fmt == "float16":
            k = keys.astype(np.float16)
        elif fmt == "bf16_raw":
            k, kf = keys.astype(ml_dtypes.bfloat16).view(np.uint16), "bfloat16"
        else:
            k = (keys * 4).astype(ml_dtypes.float8_e4m3fn)
            scale = rng.uniform(0.05, 0.5, len(keys)).astype(np.float32)
            if fmt == "fp8_raw":
                k, kf = k.view(np.uint8), "float8_e4m3fn"
        _compare(q, k, int(rng.integers(0, 100)), int(rng.integers(0, 120)), key_scale=scale, key_format=kf)


def test_a_worked_example():
    """Equal scores: query i of 3 spreads 1 / (i + 1) over keys 0..i."""
    q = np.ones((1, 3, 4), np.float32)
    keys = np.zeros((3, 1, 4), np.float32)
    v, s = ks.vslash_scores(q, keys)
    want = np.array([1 + 1 / 2 + 1 / 3, 1 / 2 + 1 / 3, 1 / 3])
    np.testing.assert_allclose(v[0], want, rtol=1e-6)
    np.testing.assert_allclose(s[0], want, rtol=1e-6)  # offset o: the queries o.. reading key i - o
    gv, gs = ks.vslash_select(q, keys, 1, 1)
    assert gv.tolist() == [[0, 1, 2]] and gs.tolist() == [[0, 1, 2]]  # min(L, 30), min(L, 50)


def test_the_causal_mask_among_the_last_queries():
    """A key after a query gets nothing from it: with 64 queries, a large score
    on the last key only reaches the last query, so its column sum is at most 1
    and the diagonal at offset 0 takes it; the unmasked estimate (a planted
    fault) would give the last key nearly 64."""
    L, d = 200, 8
    keys = np.zeros((L, 1, d), np.float32)
    keys[-1, 0, 0] = 50.0
    q = np.zeros((1, 64, d), np.float32)
    q[0, :, 0] = 1.0
    v, s = ks.vslash_scores(q, keys)
    assert v[0, -1] <= 1.0 + 1e-6 and v[0, -1] > 0.99
    xv, _ = ref.vslash_scores(q, keys)
    np.testing.assert_allclose(v[0], xv[0], rtol=1e-5, atol=1e-12)
    scores = q[0].astype(np.float64) @ keys[:, 0].T.astype(np.float64) / np.sqrt(d)
    p = np.exp(scores - scores.max(1, keepdims=True))
    unmasked = (p / p.sum(1, keepdims=True)).sum(0)
    assert unmasked[-1] > 60  # what the fault would rank


def test_diagonal_offsets_are_query_minus_key():
    """Offset o holds the keys p - o: a score peaked at key p - 150 for every query
    p puts the mass on offset 150, the one free diagonal beside the 100 forced
    ones is 150, and the rows read p - 150 (the sign flipped, the fault, would
    name offset -150: keys after the query)."""
    L, d = 300, 16
    rng = np.random.default_rng(SEED + 3)
    keys = rng.standard_normal((L, 1, d)).astype(np.float32)
    q = np.zeros((1, 64, d), np.float32)
    for i in range(64):
        q[0, i] = keys[L - 64 + i - 150, 0] * 20  # query L-64+i peaks at key (L-64+i) - 150
    _, s = ks.vslash_scores(q, keys)
    assert int(np.argmax(s[0])) == 150 and s[0, 150] > 50
    gv, gs = ks.vslash_select(q, keys, 30, 101)
    assert gs[0].tolist() == list(range(100)) + [150]
    rows = ks.vslash_rows(gv, gs, L, [L - 1])
    assert (L - 1 - 150) in rows[0, 0] and rows[0, 0].max() == L - 1


def test_forced_diagonals_past_the_budget_keep_the_nearest():
    rng = np.random.default_rng(SEED + 4)
    q, keys = _case(rng, L=400)
    for s in (50, 64, 99):
        _, gs = ks.vslash_select(q, keys, 30, s)
        assert gs.tolist() == [list(range(s))] * q.shape[0]
    _, gs = ks.vslash_select(q, keys, 30, 20, variant="search")
    assert all(r[:30].tolist() == list(range(30)) for r in gs)  # 30 forced, then 20 free


def test_layout_equals_the_twin_and_covers_the_rows():
    rng = np.random.default_rng(SEED + 5)
    for _ in range(400):
        L = int(rng.integers(1, 600))
        h, nv, ns = int(rng.integers(1, 3)), int(rng.integers(1, 9)), int(rng.integers(1, 7))
        v = rng.integers(0, L, (h, nv)).astype(np.int32)
        s = rng.integers(0, L, (h, ns)).astype(np.int32)
        s[:, 0] = 0
        got = ks.vslash_layout(v, s, L)
        for a, b in zip(got, ref.vslash_layout(v, s, L)):
            assert np.array_equal(a, b)
        pos = np.arange(L)
        rows = ks.vslash_rows(v, s, L, pos)
        assert np.array_equal(rows, ref.vslash_rows(v, s, L, pos))
        bc, bo, cc, ci = got
        for j in range(h):
            for p in rng.integers(0, L, 5):
                m = p // 64
                reads = set(ci[j, m, : cc[j, m]].tolist())
                for b0 in bo[j, m, : bc[j, m]]:
                    reads.update(range(b0, b0 + 64))
                sel = rows[j, p][rows[j, p] >= 0]
                assert set(sel.tolist()) <= reads


def test_layout_of_the_selection_the_rule_makes():
    rng = np.random.default_rng(SEED + 6)
    q, keys = _case(rng, L=700)
    v, s = ks.vslash_select(q, keys, 100, 120)
    bc, bo, cc, ci = ks.vslash_layout(v, s, 700)
    assert bc.shape == (q.shape[0], 11) and bo.shape == (q.shape[0], 11, 120) and ci.shape == (q.shape[0], 11, 100)
    for a, b in zip((bc, bo, cc, ci), ref.vslash_layout(v, s, 700)):
        assert np.array_equal(a, b)


@pytest.mark.parametrize(
    "call, arg",
    [
        (lambda q, k: ks.vslash_select(q[:, 1:], k, 30, 50), "q"),
        (lambda q, k: ks.vslash_select(q, k[:, :, 1:], 30, 50), "q"),
        (lambda q, k: ks.vslash_select(q, k[0], 30, 50), "keys"),
        (lambda q, k: ks.vslash_select(q, k, -1, 50), "vertical_size"),
        (lambda q, k: ks.vslash_select(q, k, 30, -1), "slash_size"),
        (lambda q, k: ks.vslash_select(q[:3], k, 30, 50), "n_kv_heads"),
        (lambda q, k: ks.vslash_select(q, k, 30, 50, variant="sglang"), "variant"),
        (lambda q, k: ks.vslash_select(q, k, 30, 50, key_scale=np.ones(3, np.float32)), "key_scale"),
        (lambda q, k: ks.vslash_select(np.full_like(q, np.nan), k, 30, 50), "q"),
        (lambda q, k: ks.vslash_select(q, np.full_like(k, np.inf), 30, 50), "keys"),
        (lambda q, k: ks.vslash_scores(q * 1e30, k * 1e30), "keys"),
        (lambda q, k: ks.vslash_rows(np.array([[0, 80]]), np.array([[0]]), 80, [0]), "vertical"),
        (lambda q, k: ks.vslash_rows(np.array([[0]]), np.array([[0]]), 80, [80]), "positions"),
        (lambda q, k: ks.vslash_rows(np.array([[0]]), np.array([[0], [0]]), 80, [0]), "slash"),
        (lambda q, k: ks.vslash_layout(np.array([[0]]), np.array([[64]]), 80), "slash"),
    ],
)
def test_refusals_name_the_argument(call, arg):
    rng = np.random.default_rng(SEED)
    keys = rng.standard_normal((80, 2, 8)).astype(np.float32)
    q = rng.standard_normal((4, 64, 8)).astype(np.float32)
    before = (q.copy(), keys.copy())
    with pytest.raises(ks.SelectionError, match=arg) as e:
        call(q, keys)
    assert e.value.argument == arg
    assert np.array_equal(q, before[0]) and np.array_equal(keys, before[1])


_CHILD = """
import sys, numpy as np, kvselect as ks
d = np.load(sys.argv[1]); out = {}
for i in range(int(d["n"])):
    q, k, c = d[f"q_{i}"], d[f"k_{i}"], d[f"c_{i}"]
    out[f"v_{i}"], out[f"s_{i}"] = ks.vslash_select(q, k, 40, 70, key_scale=c)
    out[f"sv_{i}"], out[f"ss_{i}"] = ks.vslash_scores(q, k, key_scale=c)
np.savez(sys.argv[2], **out)
"""


@pytest.mark.parametrize("level", ["scalar", "avx2"])
def test_every_simd_level_gives_the_same_bits(tmp_path, level):
    require_simd()
    rng = np.random.default_rng(SEED + 9)
    arrays, want = {"n": np.array(30)}, {}
    for i in range(30):
        q, k = _case(rng, kind=["random", "grid", "peaked"][i % 3])
        c = rng.uniform(0.5, 2, len(k)).astype(np.float32)
        arrays.update({f"q_{i}": q, f"k_{i}": k, f"c_{i}": c})
        want[f"v_{i}"], want[f"s_{i}"] = ks.vslash_select(q, k, 40, 70, key_scale=c)
        want[f"sv_{i}"], want[f"ss_{i}"] = ks.vslash_scores(q, k, key_scale=c)
    np.savez(tmp_path / "in.npz", **arrays)
    assert_child_equals(_CHILD, tmp_path, level, want)


def test_results_do_not_depend_on_the_thread_count():
    rng = np.random.default_rng(SEED + 11)
    keys = rng.standard_normal((700, 2, 16)).astype(np.float32)
    q = rng.standard_normal((8, 64, 16)).astype(np.float32)
    before = ks.get_num_threads()
    try:
        got = []
        for n in (1, 2, 3):
            ks.set_num_threads(n)
            got.append(ks.vslash_select(q, keys, 50, 120))
    finally:
        ks.set_num_threads(before)
    for v, s in got[1:]:
        assert np.array_equal(v, got[0][0]) and np.array_equal(s, got[0][1])
