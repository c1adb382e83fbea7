"""NSA's block scores and rows as fla computes them: the native core against the NumPy
twin (kvselect.reference.nsa) on thousands of random and adversarial cases (ties,
fewer blocks than block_counts, the first block, Tq != Tkv, GQA groups of 1 and 16, key
formats); the core's bound holding; every SIMD level against the best; the underflow
example; refusals that name their argument."""

import ml_dtypes
import numpy as np
import pytest
from levels import assert_child_equals, require_simd

import kvselect as ks
from kvselect.reference import nsa as RN

SEED = 20261205


def _case(rng, kind="float"):
    """``q [n_q, hq, d]``, keys ``[seq_len, h, d]`` and settings."""
    h = int(rng.choice([1, 2, 3]))
    g = int(rng.choice([1, 2, 4, 16]))
    d = int(rng.integers(1, 24))
    bs = int(rng.choice([1, 2, 4, 8, 16, 64]))
    seq_len = int(rng.choice([int(rng.integers(1, 4 * bs + 3)), int(rng.integers(1, 40 * bs + 2))]))
    n_q = int(rng.choice([1, int(rng.integers(1, min(seq_len, 5) + 1)), seq_len if seq_len <= 40 else 1]))
    if kind == "integer":  # many exact ties
        k = rng.integers(-2, 3, (seq_len, h, d)).astype(np.float32)
        q = rng.integers(-1, 2, (n_q, h * g, d)).astype(np.float32)
    elif kind == "ties":  # repeated blocks: equal block scores
        nb = max(seq_len // bs, 1)
        base = rng.standard_normal((nb // 3 + 1, bs, h, d)).astype(np.float32)
        k = np.concatenate([base[rng.integers(0, len(base), nb + 1)].reshape(-1, h, d)])[:seq_len]
        q = rng.standard_normal((n_q, h * g, d)).astype(np.float32)
        if rng.random() < 0.3:
            q[:] = 0.0  # a uniform softmax: every block ties
    else:
        k = (rng.standard_normal((seq_len, h, d)) * rng.choice([0.3, 1.0, 3.0, 30.0])).astype(np.float32)
        q = rng.standard_normal((n_q, h * g, d)).astype(np.float32)
    settings = dict(block_size=bs)
    if rng.random() < 0.3:  # other forced counts (the paper's are fla's: 1 and 2)
        settings.update(init_blocks=int(rng.integers(0, 3)), local_blocks=int(rng.integers(0, 4)))
    return q, k, settings


def _agree(q, k, n, settings, **fmt):
    rows = ks.nsa_select(q, k, n, **settings, **fmt)
    exact = RN.nsa_block_scores(q, k, **settings, **fmt)
    sc = {key: v for key, v in fmt.items() if key in ("k_scale", "query_format", "key_format")}
    bound = RN.nsa_score_bound(q, k, block_size=settings["block_size"], **sc)
    return rows, RN.nsa_rows_within_bound(rows, exact, bound, n)


@pytest.mark.parametrize("kind", ["float", "integer", "ties"])
def test_rows_equal_the_twin_within_the_bound(kind):
    """Thousands of rows: decode and prefill chunks (Tq < Tkv and Tq = Tkv), queries in
    the first block, block_counts past the candidates, groups of 1 to 16; exact equality
    but for swaps inside the bound, and exact equality in most rows."""
    rng = np.random.default_rng(SEED + {"float": 0, "integer": 1, "ties": 2}[kind])
    rows_checked = exact_equal = 0
    for _ in range(400):
        q, k, settings = _case(rng, kind)
        n = int(rng.choice([1, 2, 3, 5, 16, 40]))
        rows, ok = _agree(q, k, n, settings)
        assert ok.all(), (k.shape, q.shape, n, settings, np.argwhere(~ok))
        want = RN.nsa_select(q, k, n, **settings)
        rows_checked += ok.size
        exact_equal += int((rows == want).all(axis=-1).sum())
    assert rows_checked > 1000
    assert exact_equal >= 0.95 * rows_checked, (exact_equal, rows_checked)


def test_block_scores_are_within_the_stated_bound():
    """Every finite float32 score within ``R S + T`` of the exact one, the forced and
    non-candidate blocks exactly ``+-inf``, and the bound not vacuous."""
    rng = np.random.default_rng(SEED + 3)
    worst = 0.0
    for _ in range(300):
        q, k, settings = _case(rng)
        got = ks.nsa_block_scores(q, k, **settings).astype(np.float64)
        want = RN.nsa_block_scores(q, k, **settings)
        R, T = RN.nsa_score_bound(q, k, block_size=settings["block_size"])
        inf = ~np.isfinite(want)
        assert np.array_equal(got[inf], want[inf])
        err = np.abs(got[~inf] - want[~inf])
        lim = np.broadcast_to(R[..., None], want.shape)[~inf] * np.abs(want[~inf]) + T
        assert (err <= lim).all(), float((err - lim).max())
        if err.size:
            worst = max(worst, float((err / np.maximum(lim, 1e-300)).max()))
    assert 0.0 < worst <= 1.0


def test_the_bound_reads_the_projects_exp_bound():
    from kvselect.reference import infllm

    assert infllm._EXP_REL_ERR == ks._core._exp_bound()[0]


@pytest.mark.parametrize("fmt", ["bfloat16", "float16", "fp8"])
def test_key_formats_are_read_in_place(fmt):
    """bfloat16 / float16 keys and queries, fp8 keys with per-token scales: the twin
    decodes the same values and the rows agree within the bound."""
    rng = np.random.default_rng(SEED + 4)
    for _ in range(150):
        q, k, settings = _case(rng)
        extra = {}
        if fmt == "fp8":
            k = np.clip(k, -400, 400).astype(ml_dtypes.float8_e4m3fn)
            extra["k_scale"] = rng.uniform(0.25, 2.0, len(k)).astype(np.float32)
        else:
            dt = ml_dtypes.bfloat16 if fmt == "bfloat16" else np.float16
            k, q = k.astype(dt), q.astype(dt)
        _, ok = _agree(q, k, 4, settings, **extra)
        assert ok.all()


def test_pinned_examples():
    """By hand: blocks of 4, 20 tokens, one query at 19 (IC = 4): block 2's keys are
    ones, the rest zeros; two heads of ones: softmax over the 5 complete blocks."""
    q = np.ones((1, 2, 4), np.float32)
    k = np.zeros((20, 1, 4), np.float32)
    k[8:12] = 1.0
    e = np.exp(2.0)
    s = ks.nsa_block_scores(q, k, block_size=4)[0, 0]
    assert s[0] == s[3] == s[4] == np.inf
    assert s[1] == pytest.approx(2 / (4 + e), rel=1e-6)
    assert s[2] == pytest.approx(2 * e / (4 + e), rel=1e-6)
    assert ks.nsa_select(q, k, 4, block_size=4)[0, 0].tolist() == [0, 2, 3, 4]
    # block_counts < 3: the forced blocks 0, 3, 4 tie; the lower ids stay.
    assert ks.nsa_select(q, k, 2, block_size=4)[0, 0].tolist() == [0, 3]
    assert ks.nsa_select(q, k, 1, block_size=4)[0, 0].tolist() == [0]
    # more slots than candidates (blocks 0..4): -1 padded
    assert ks.nsa_select(q, k, 8, block_size=4)[0, 0].tolist() == [0, 1, 2, 3, 4, -1, -1, -1]
    # the first block: a query at 2 sees no complete block; block 0 alone
    assert ks.nsa_select(q, k[:3], 4, block_size=4)[0, 0].tolist() == [0, -1, -1, -1]


def test_underflow_keeps_its_slot():
    """fla's float32 top-k: block 1's probability ``exp(-200)`` flushes to 0 and ties
    with the ``-1`` padding. kvselect decides in exact arithmetic: the row is full."""
    d = 1
    q = np.ones((1, 1, d), np.float32)
    k = np.zeros((24, 1, d), np.float32)  # blocks of 4: IC = 5, candidates 0..5
    k[8:12] = 200.0  # block 2: logit 200; block 1: logit 0
    s = ks.nsa_block_scores(q, k, block_size=4, scale=1.0)[0, 0]
    assert s[1] == 0.0  # float32 exp(-200) flushes to 0
    assert RN.nsa_block_scores(q, k, block_size=4, scale=1.0)[0, 0, 1] > 0.0
    rows = ks.nsa_select(q, k, 6, block_size=4, scale=1.0)[0, 0].tolist()
    assert rows == [0, 1, 2, 3, 4, 5]


def test_tq_offsets_and_the_naive_codes_position():
    """Query i sits at seq_len - n_q + i (fla's TK - TQ): the last query of a prefill
    chunk gets the decode query's row; placing it at i (the naive code) does not."""
    rng = np.random.default_rng(SEED + 5)
    q = rng.standard_normal((6, 4, 8)).astype(np.float32)
    k = rng.standard_normal((70, 2, 8)).astype(np.float32)
    chunk = ks.nsa_select(q, k, 3, block_size=8)
    last = ks.nsa_select(q[-1:], k, 3, block_size=8)
    assert np.array_equal(chunk[-1], last[0])
    assert (chunk[-1] >= 0).all() and chunk[-1].max() == 69 // 8
    naive = ks.nsa_select(q[:1], k[:1], 3, block_size=8)  # the naive code's p = 0
    assert not np.array_equal(chunk[0], naive[0])


_CHILD = """
import sys, numpy as np, kvselect as ks
data = np.load(sys.argv[1])
out = {}
for i in range(int(data["n"])):
    q, k, bs = data[f"q_{i}"], data[f"k_{i}"], int(data[f"b_{i}"])
    out[f"scores_{i}"] = ks.nsa_block_scores(q, k, block_size=bs)
    out[f"r_{i}"] = ks.nsa_select(q, k, 5, block_size=bs)
np.savez(sys.argv[2], **out)
"""


@pytest.mark.parametrize("level", ["scalar", "avx2"])
def test_every_simd_level_gives_the_same_bits(tmp_path, level):
    """Block scores' bits and rows at KVSELECT_SIMD=scalar / avx2 (a child process)
    equal the best level's, decode and prefill, past the parallel threshold."""
    require_simd()
    rng = np.random.default_rng(SEED + 6)
    arrays, expected = {"n": np.array(12)}, {}
    for i in range(12):
        q, k, settings = _case(rng)
        bs = settings["block_size"]
        if i == 0:
            bs = 64
            q = rng.standard_normal((3, 32, 128)).astype(np.float32)
            k = rng.standard_normal((9000, 2, 128)).astype(np.float32)
        arrays.update({f"q_{i}": q, f"k_{i}": k, f"b_{i}": np.array(bs)})
        expected[f"scores_{i}"] = ks.nsa_block_scores(q, k, block_size=bs)
        expected[f"r_{i}"] = ks.nsa_select(q, k, 5, block_size=bs)
    np.savez(tmp_path / "in.npz", **arrays)
    assert_child_equals(_CHILD, tmp_path, level, expected)


def _args():
    rng = np.random.default_rng(SEED + 7)
    q = rng.standard_normal((2, 4, 8)).astype(np.float32)
    k = rng.standard_normal((200, 2, 8)).astype(np.float32)
    return q, k


@pytest.mark.parametrize(
    "change, argument",
    [
        (lambda q, k: (q[:, :3], k, {}), "q"),
        (lambda q, k: (q[0], k, {}), "q"),
        (lambda q, k: (q, k[:, :, :7], {}), "k"),
        (lambda q, k: (q, k[:0], {}), "k"),
        (lambda q, k: (q, k[:1], {}), "q"),
        (lambda q, k: (q, k, {"scale": float("nan")}), "scale"),
        (lambda q, k: (q, k, {"block_counts": 0}), "block_counts"),
        (lambda q, k: (q, k, {"k_scale": np.ones(3, np.float32)}), "k_scale"),
        (lambda q, k: (q, k, {"init_blocks": -1}), "init_blocks"),
        (lambda q, k: (q, k, {"block_size": 0}), "block_size"),
    ],
)
def test_refusals_name_the_argument(change, argument):
    q, k = _args()
    q2, k2, kw = change(q, k)
    before = (q.copy(), k.copy())
    with pytest.raises(ks.SelectionError, match=argument) as e:
        ks.nsa_select(q2, k2, **kw)
    assert e.value.argument == argument
    with pytest.raises(ValueError, match=argument):
        RN.nsa_select(q2, k2, **kw)
    assert np.array_equal(q, before[0]) and np.array_equal(k, before[1])


def test_compress_keys_are_the_complete_blocks_means():
    """The twin's compressed keys: the complete blocks' means; the partial tail unused."""
    k = np.arange(10, dtype=np.float32).reshape(10, 1, 1)
    assert RN.nsa_compress_keys(k, block_size=4)[:, 0, 0].tolist() == [1.5, 5.5]
