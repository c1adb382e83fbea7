"""InfLLM-v2's block scores and rows: the native core against the NumPy twin
(kvselect.reference.infllm) on thousands of random and adversarial cases, every
variant and key format; the core's bound holding; every SIMD level against the best;
refusals that name their argument."""

import ml_dtypes
import numpy as np
import pytest
from levels import assert_child_equals, require_simd

import kvselect as ks
from kvselect.reference import infllm as RI

SEED = 20261206
POOLINGS = ("cuda", "triton")
KEEPS = ("through_current", "before_current")


def _case(rng, kind="float", geometry=True):
    """``q [n_q, hq, d]``, compressed keys ``[n_c, h, d]``, ``seq_len`` and settings."""
    h = int(rng.choice([1, 2, 3]))
    g = int(rng.choice([1, 2, 4, 16]))
    d = int(rng.integers(1, 24))
    seq_len = int(rng.choice([int(rng.integers(1, 70)), int(rng.integers(1, 1400))]))
    n_q = int(rng.integers(1, min(seq_len, 4) + 1))
    geo = {}
    if geometry and rng.random() < 0.3:  # the eval's scaled-down geometries, and others
        b, kz, st = [(32, 16, 8), (16, 8, 4), (8, 4, 2), (4, 2, 1), (1, 2, 1), (32, 32, 8), (6, 5, 3)][
            int(rng.integers(0, 7))
        ]
        geo = dict(block_size=b, kernel_size=kz, kernel_stride=st)
    n_c = RI.compressed_len(seq_len, geo.get("kernel_size", 32), geo.get("kernel_stride", 16))
    if kind == "integer":  # many exact ties
        ck = rng.integers(-2, 3, (n_c, h, d)).astype(np.float32)
        q = rng.integers(-1, 2, (n_q, h * g, d)).astype(np.float32)
    elif kind == "ties":  # repeated keys: equal block scores
        base = rng.standard_normal((max(n_c, 1) // 3 + 1, h, d)).astype(np.float32)
        ck = base[rng.integers(0, len(base), n_c)] if n_c else np.zeros((0, h, d), np.float32)
        q = rng.standard_normal((n_q, h * g, d)).astype(np.float32)
        if rng.random() < 0.3:
            q[:] = 0.0  # a uniform softmax: every block ties
    else:
        ck = (rng.standard_normal((n_c, h, d)) * rng.choice([0.3, 1.0, 3.0])).astype(np.float32)
        q = rng.standard_normal((n_q, h * g, d)).astype(np.float32)
    settings = dict(
        init_blocks=int(rng.integers(0, 3)),
        local_blocks=int(rng.integers(0, 5)),
        pooling=str(rng.choice(POOLINGS)),
        **geo,
    )
    return q, ck, seq_len, settings


def _agree(q, ck, seq_len, topk, keep, settings, **fmt):
    rows = ks.infllm_select(q, ck, seq_len, topk, keep=keep, **settings, **fmt)
    sc = {k: v for k, v in fmt.items() if k == "ck_scale"}
    sc.update({k: v for k, v in settings.items() if k in ("kernel_size", "kernel_stride")})
    exact = RI.infllm_block_scores(q, ck, seq_len, **settings, **fmt)
    bound = RI.score_bound(q, ck, seq_len, **sc)
    ok = RI.rows_within_bound(rows, exact, bound, seq_len, topk, keep, settings.get("block_size", 64))
    return rows, exact, ok


@pytest.mark.parametrize("kind", ["float", "integer", "ties"])
def test_rows_equal_the_twin_within_the_bound(kind):
    """Thousands of rows: every variant, decode and prefill chunks, L < 32, L < 64,
    queries in the first block, topk past the blocks there are; exact equality but
    for swaps inside the bound, and exact equality in most rows."""
    rng = np.random.default_rng(SEED + {"float": 0, "integer": 1, "ties": 2}[kind])
    rows_checked = exact_equal = 0
    for _ in range(500):
        q, ck, seq_len, settings = _case(rng, kind)
        topk = int(rng.choice([1, 2, 3, 5, 8, 40]))
        keep = str(rng.choice(KEEPS))
        rows, exact, ok = _agree(q, ck, seq_len, topk, keep, settings)
        assert ok.all(), (seq_len, topk, keep, settings, np.argwhere(~ok))
        want = RI.infllm_select(q, ck, seq_len, topk, keep=keep, **settings)
        rows_checked += ok.size
        exact_equal += int((rows == want).all(axis=-1).sum())
    assert rows_checked > 1000
    assert exact_equal >= 0.95 * rows_checked, (exact_equal, rows_checked)


def test_block_scores_are_within_the_stated_bound():
    """Every finite float32 block score within ``R B + T`` of the exact one; the
    forced and excluded ones exactly ``+-inf``; equal to the twin where it is exact
    (``R`` small against the scores' gaps)."""
    rng = np.random.default_rng(SEED + 3)
    worst = 0.0
    for _ in range(300):
        q, ck, seq_len, settings = _case(rng)
        got = ks.infllm_block_scores(q, ck, seq_len, **settings).astype(np.float64)
        want = RI.infllm_block_scores(q, ck, seq_len, **settings)
        geo = {k: v for k, v in settings.items() if k in ("kernel_size", "kernel_stride")}
        R, T = RI.score_bound(q, ck, seq_len, **geo)
        inf = ~np.isfinite(want)
        assert np.array_equal(got[inf], want[inf])
        err = np.abs(got[~inf] - want[~inf])
        lim = np.broadcast_to(R[..., None], want.shape)[~inf] * np.abs(want[~inf]) + T
        assert (err <= lim).all(), float((err - lim).max())
        if err.size:
            worst = max(worst, float((err / np.maximum(lim, 1e-300)).max()))
    assert 0.0 < worst <= 1.0


def test_the_bound_reads_the_projects_exp_bound():
    assert RI._EXP_REL_ERR == ks._core._exp_bound()[0]


@pytest.mark.parametrize("fmt", ["bfloat16", "float16", "fp8"])
def test_key_formats_are_read_in_place(fmt):
    """bfloat16 / float16 compressed keys and queries, fp8 keys with per-key scales:
    the twin decodes the same values and the rows agree within the bound."""
    rng = np.random.default_rng(SEED + 4)
    for _ in range(150):
        q, ck, seq_len, settings = _case(rng, geometry=False)
        extra = {}
        if fmt == "fp8":
            ck = ck.astype(ml_dtypes.float8_e4m3fn)
            extra["ck_scale"] = rng.uniform(0.25, 2.0, len(ck)).astype(np.float32)
        else:
            dt = ml_dtypes.bfloat16 if fmt == "bfloat16" else np.float16
            ck, q = ck.astype(dt), q.astype(dt)
        keep = str(rng.choice(KEEPS))
        _, _, ok = _agree(q, ck, seq_len, 4, keep, settings, **extra)
        assert ok.all()


def test_pinned_examples():
    """The pooling window [4b - 1, 4b + 4), the forced blocks of each variant and
    the filters, on a query whose scores are hand-made: one key per block stands out."""
    seq_len, d = 64 * 8, 4
    n_c = RI.compressed_len(seq_len)  # 31
    ck = np.zeros((n_c, 1, d), np.float32)
    q = np.zeros((1, 1, d), np.float32)
    q[0, 0, 0] = 1.0
    # Key 7 (block 1's last tap, 4*2 - 1 = 7 is block 2's first): only block 2 and 1.
    ck[7, 0, 0] = 8.0
    s = ks.infllm_block_scores(q, ck, seq_len, init_blocks=0, local_blocks=0, scale=1.0)[0, 0]
    top = np.argsort(-s[:7], kind="stable")[:2]
    assert sorted(top.tolist()) == [1, 2] and s[1] == s[2] and s[1] > s[3]
    # CUDA: init 1 and local 2 + the current (block 7) forced.
    r = ks.infllm_select(q, ck, seq_len, 6, init_blocks=1, local_blocks=2, scale=1.0)
    assert r[0, 0].tolist() == [0, 1, 2, 5, 6, 7]
    # Triton: blocks 6, 7 excluded (-inf), 5 competes.
    r = ks.infllm_select(q, ck, seq_len, 4, init_blocks=1, local_blocks=2, pooling="triton", scale=1.0)
    assert r[0, 0].tolist() == [0, 1, 2, 3]
    # The earlier copy drops the current block.
    r = ks.infllm_select(q, ck, seq_len, 6, init_blocks=1, local_blocks=2, keep="before_current", scale=1.0)
    assert r[0, 0].tolist() == [0, 1, 2, 5, 6, -1]
    # Fewer blocks than topk: every block at or before the query's, then -1.
    r = ks.infllm_select(q[:, :, :], ck, seq_len, 20, scale=1.0)
    assert r[0, 0].tolist() == list(range(8)) + [-1] * 12
    # Below 32 tokens there is no compressed key: the query's block alone.
    r = ks.infllm_select(q, np.zeros((0, 1, d), np.float32), 20, 3, init_blocks=0, local_blocks=0)
    assert r[0, 0].tolist() == [0, -1, -1]


def test_planted_faults_are_caught():
    """A window one key late ([4b, 4b + 5)) and a current block left unforced give
    rows the twin's comparison rejects."""
    rng = np.random.default_rng(SEED + 5)
    caught = {"window": 0, "current": 0}
    for _ in range(60):
        q, ck, seq_len, _ = _case(rng, geometry=False)
        if seq_len < 300:
            continue
        settings = dict(init_blocks=1, local_blocks=1, pooling="cuda")
        exact = RI.infllm_block_scores(q, ck, seq_len, **settings)
        bound = RI.score_bound(q, ck, seq_len)
        sums = RI.group_scores(q, ck, seq_len)
        n_q, h, nb = exact.shape
        late, unforced = exact.copy(), exact.copy()
        for i in range(n_q):
            p = seq_len - n_q + i
            for g in range(h):
                for b in range(nb):
                    if np.isfinite(exact[i, g, b]):
                        taps = sums[i, g, 4 * b : 4 * b + 5]
                        late[i, g, b] = taps.max() if len(taps) else -np.inf
                qb = p // 64
                taps = sums[i, g, max(4 * qb - 1, 0) : 4 * qb + 4]
                unforced[i, g, qb] = taps.max() if len(taps) else -np.inf
        for name, bad in (("window", late), ("current", unforced)):
            rows = np.full((n_q, h, 8), -1, np.int32)
            for i in range(n_q):
                for g in range(h):
                    r = RI.select_row(bad[i, g], 8, "through_current", seq_len - n_q + i)
                    rows[i, g, : len(r)] = r
            caught[name] += int((~RI.rows_within_bound(rows, exact, bound, seq_len, 8, "through_current")).any())
    assert caught["window"] > 5 and caught["current"] > 5, caught


_CHILD = """
import sys, numpy as np, kvselect as ks
data = np.load(sys.argv[1])
out = {}
for i in range(int(data["n"])):
    q, ck, n = data[f"q_{i}"], data[f"k_{i}"], int(data[f"n_{i}"])
    for p in ("cuda", "triton"):
        out[f"scores_{p}_{i}"] = ks.infllm_block_scores(q, ck, n, pooling=p, init_blocks=1, local_blocks=1)
        out[f"r_{p}_{i}"] = ks.infllm_select(q, ck, n, 5, pooling=p, init_blocks=1, local_blocks=1)
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
        q, ck, n, _ = _case(rng, geometry=False)
        if i == 0:
            n = 9000
            q = rng.standard_normal((3, 32, 128)).astype(np.float32)
            ck = rng.standard_normal((RI.compressed_len(n), 2, 128)).astype(np.float32)
        arrays.update({f"q_{i}": q, f"k_{i}": ck, f"n_{i}": np.array(n)})
        for p in POOLINGS:
            expected[f"scores_{p}_{i}"] = ks.infllm_block_scores(q, ck, n, pooling=p, init_blocks=1, local_blocks=1)
            expected[f"r_{p}_{i}"] = ks.infllm_select(q, ck, n, 5, pooling=p, init_blocks=1, local_blocks=1)
    np.savez(tmp_path / "in.npz", **arrays)
    assert_child_equals(_CHILD, tmp_path, level, expected)


def _args():
    rng = np.random.default_rng(SEED + 7)
    q = rng.standard_normal((2, 4, 8)).astype(np.float32)
    ck = rng.standard_normal((RI.compressed_len(200), 2, 8)).astype(np.float32)
    return q, ck, 200


@pytest.mark.parametrize(
    "change, argument",
    [
        (lambda q, ck, n: (q[:, :3], ck, n, {}), "q"),
        (lambda q, ck, n: (q[0], ck, n, {}), "q"),
        (lambda q, ck, n: (q, ck[:, :, :7], n, {}), "ck"),
        (lambda q, ck, n: (q, ck[1:], n, {}), "ck"),
        (lambda q, ck, n: (q, ck, 0, {}), "seq_len"),
        (lambda q, ck, n: (q, ck[:0], 1, {}), "q"),
        (lambda q, ck, n: (q, ck, n, {"scale": float("nan")}), "scale"),
        (lambda q, ck, n: (q, ck, n, {"pooling": "cuda2"}), "pooling"),
        (lambda q, ck, n: (q, ck, n, {"keep": "all"}), "keep"),
        (lambda q, ck, n: (q, ck, n, {"topk": 0}), "topk"),
        (lambda q, ck, n: (q, ck, n, {"ck_scale": np.ones(3, np.float32)}), "ck_scale"),
        (lambda q, ck, n: (q, ck, n, {"init_blocks": -1}), "init_blocks"),
        (lambda q, ck, n: (q, ck, n, {"block_size": 60}), "block_size"),
        (lambda q, ck, n: (q, ck, n, {"kernel_stride": 0}), "kernel_stride"),
        (lambda q, ck, n: (q, ck, n, {"block_size": 0}), "block_size"),
    ],
)
def test_refusals_name_the_argument(change, argument):
    q, ck, n = _args()
    q2, ck2, n2, kw = change(q, ck, n)
    before = (q.copy(), ck.copy())
    # The block scores take every argument but topk and keep (a zero block_size once
    # divided by zero there, sizing the output).
    calls = [ks.infllm_select] + ([] if {"topk", "keep"} & set(kw) else [ks.infllm_block_scores])
    for fn in calls:
        with pytest.raises(ks.SelectionError, match=argument) as e:
            fn(q2, ck2, n2, **kw)
        assert e.value.argument == argument, fn.__name__
    with pytest.raises(ValueError, match=argument):
        RI.infllm_select(q2, ck2, n2, **kw)
    assert np.array_equal(q, before[0]) and np.array_equal(ck, before[1])


@pytest.mark.parametrize("fn", ["infllm_select", "infllm_block_scores"])
def test_a_length_past_an_int32_position_is_refused_by_both_naming_seq_len(fn):
    # Keys of 2**20 tokens make 2**31 tokens 2,048 compressed keys: every
    # other argument fits, so only the length is at fault.
    geo = {"block_size": 2**20, "kernel_size": 2**20, "kernel_stride": 2**20}
    n = 2**31
    q = np.zeros((1, 2, 4), np.float32)
    ck = np.zeros(((n - 2**20) // 2**20 + 1, 1, 4), np.float32)
    for impl in (ks, RI):
        with pytest.raises(ValueError) as e:
            getattr(impl, fn)(q, ck, n, **geo)
        assert e.value.argument == "seq_len", impl


def test_compress_keys_is_the_sources_window_mean():
    keys = np.arange(100 * 2 * 3, dtype=np.float32).reshape(100, 2, 3)
    ck = RI.compress_keys(keys)
    assert ck.shape == (5, 2, 3)
    assert np.array_equal(ck[1], keys[16:48].mean(axis=0))
    assert RI.compress_keys(keys[:31]).shape == (0, 2, 3)
