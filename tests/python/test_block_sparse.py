"""Block-sparse selection: the native functions against the NumPy reference
(``kvselect.reference``, written from ``spec/block_sparse.rs.txt``), and the
binding contract of docs/conventions.md.

On integer-valued data (small integers in [-3, 3], so every float32 dot
product is exact whatever the summation order) the native block ids must
EQUAL the reference's, ties included. On random normal data they must be
equal except where two block scores are within rounding of each other at the
selection boundary.

The randomised configurations are reproducible: a failing case names its
seed, and ``make_case(seed)`` rebuilds it."""

import gc
import os
import pickle
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from levels import assert_child_equals, require_simd

import kvselect as ks
from kvselect import reference as ref

SEED_BASE = 20260311
N_INT_CASES = 2000  # integer-valued single-sequence configurations
N_PACKED_CASES = 250  # packed batches
N_FLOAT_CASES = 250  # random normal data

HYP = settings(max_examples=150, deadline=None)


# ---------------------------------------------------------------------------
# Randomised configurations
# ---------------------------------------------------------------------------

ODD_D = [1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 23, 24, 25, 31, 32, 33, 63, 64, 65, 127, 128, 129, 130]
BLOCK_SIZES = [1, 2, 3, 5, 7, 128]


def _cfg_tuple(cfg):
    return cfg.block_size, cfg.top_blocks, cfg.init_blocks, cfg.local_blocks


def _ref_select(q, k, pos, cfg):
    return ref.block_sparse_select(q, k, pos, cfg)


def _ref_packed(q, k, cu, sid, pos, cfg):
    return ref.block_sparse_select_packed(q, k, cu, sid, pos, cfg)


def _random_config(rng):
    bs = int(rng.choice(BLOCK_SIZES)) if rng.random() < 0.7 else int(rng.integers(1, 40))
    top = int(rng.choice([0, 0, 1, 2, 3, 4, 5, 8, 12, 32, int(rng.integers(0, 60))]))
    # init/local sometimes larger than the visible blocks.
    init = int(rng.choice([0, 0, 1, 1, 2, 3, int(rng.integers(0, 40))]))
    local = int(rng.choice([0, 1, 1, 2, 2, 3, int(rng.integers(0, 40))]))
    if top == 0 and init == 0 and local == 0:
        if rng.random() < 0.5:
            init = 1
        else:
            local = int(rng.integers(1, 4))
    return ks.BlockSparseConfig(bs, top, init, local)


def _n_positions(rng):
    r = rng.random()
    if r < 0.1:
        return int(rng.integers(1, 8))
    if r < 0.85:
        return int(np.exp(rng.uniform(0, np.log(3000))))
    return int(rng.integers(2000, 3001))


def _d(rng, n):
    d = int(rng.choice(ODD_D)) if rng.random() < 0.8 else int(rng.integers(1, 131))
    while n * d > 200_000 and d > 1:  # keep each case cheap
        d //= 2
    return d


def _int_data(rng, n, n_heads, d, n_queries, mode):
    """float32 keys [n, d] and queries [n_queries, n_heads, d], integer-valued."""
    if mode == "uniform":
        k = rng.integers(-3, 4, size=(n, d))
        q = rng.integers(-3, 4, size=(n_queries, n_heads, d))
    elif mode == "ties":
        # Keys drawn from a tiny pool of rows: every block ties with many.
        pool = rng.integers(-1, 2, size=(int(rng.integers(1, 4)), d))
        k = pool[rng.integers(0, len(pool), size=n)]
        q = rng.integers(-1, 2, size=(n_queries, n_heads, d))
    elif mode == "zeros":
        # Mostly zero keys (all-zero scores tie), a few hot ones.
        k = rng.integers(-3, 4, size=(n, d)) * (rng.random((n, 1)) < 0.05)
        q = rng.integers(-3, 4, size=(n_queries, n_heads, d))
    elif mode == "all_equal":
        k = np.broadcast_to(rng.integers(-3, 4, size=(1, d)), (n, d))
        q = rng.integers(-3, 4, size=(n_queries, n_heads, d))
    elif mode == "signed_zero":
        # Scores of exactly -0.0 and +0.0 in every block: a positive query
        # against keys of all -0.0 (or +0.0), plus some small integers.
        # Signs come in runs, so whole blocks are -0.0 or +0.0.
        run = int(rng.choice([1, 2, 3, 5, 7, 128]))
        sign = np.repeat(np.where(rng.random(n // run + 1) < 0.5, -1.0, 1.0), run)[:n]
        k = np.zeros((n, d)) * sign[:, None]  # rows of -0.0 or +0.0
        some = rng.random(n) < 0.02
        k[some] = rng.integers(-1, 1, size=(int(some.sum()), d))
        q = rng.integers(0, 3, size=(n_queries, n_heads, d)).astype(float)
        if rng.random() < 0.5:
            q[rng.random(q.shape) < 0.3] = -0.0
    else:
        raise AssertionError(mode)
    k = np.array(k, dtype=np.float32)
    q = np.array(q, dtype=np.float32)
    if rng.random() < 0.2:
        # NaN keys: some single positions, and sometimes a whole block.
        nan_rows = rng.random(n) < rng.choice([0.01, 0.1, 0.5])
        k[nan_rows, int(rng.integers(0, d))] = np.nan
    return k, q


def _positions(rng, n, bs, n_queries):
    """Query positions: inside, at the edges, beyond the keys, and far beyond."""
    choices = []
    for _ in range(n_queries):
        c = rng.random()
        if c < 0.5:
            p = int(rng.integers(0, n))
        elif c < 0.6:
            p = n - 1
        elif c < 0.65:
            p = 0
        elif c < 0.75:
            p = int(rng.choice([bs - 1, bs, 2 * bs - 1, 2 * bs]))
        elif c < 0.95:
            p = n + int(rng.integers(0, 5 * bs + 5))
        else:
            p = int(rng.choice([2**31 - 1, 2**40, 2**62]))
        choices.append(p)
    return np.array(choices, dtype=np.int64)


def make_case(seed):
    """One integer-valued configuration: (cfg, k, q [nq, h, d], pos [nq], mode)."""
    rng = np.random.default_rng(seed)
    cfg = _random_config(rng)
    n = _n_positions(rng)
    d = _d(rng, n)
    n_heads = int(rng.integers(1, 9))
    n_queries = int(rng.integers(1, 7))
    mode = str(rng.choice(["uniform", "uniform", "ties", "zeros", "all_equal", "signed_zero"]))
    k, q = _int_data(rng, n, n_heads, d, n_queries, mode)
    pos = _positions(rng, n, cfg.block_size, n_queries)
    if rng.random() < 0.1 and n > 2 * cfg.block_size:
        # A whole block of NaN keys.
        b = int(rng.integers(0, n // cfg.block_size))
        k[b * cfg.block_size : (b + 1) * cfg.block_size] = np.nan
    return cfg, k, q, pos, mode


def _describe(seed, cfg, k, q, pos, mode):
    return (
        f"seed={seed} {cfg!r} n_positions={k.shape[0]} d={k.shape[1]} "
        f"n_kv_heads={q.shape[1]} query_pos={pos.tolist()} mode={mode}"
    )


def _assert_rows_equal(native, expected, what):
    assert native.dtype == np.int32, what
    assert native.shape == expected.shape, f"{what}: shape {native.shape} != {expected.shape}"
    if not np.array_equal(native, expected):
        bad = np.argwhere(np.any(native != expected, axis=-1))[0]
        raise AssertionError(
            f"{what}: first difference at {tuple(bad)}: native {native[tuple(bad)].tolist()} "
            f"!= reference {expected[tuple(bad)].tolist()}"
        )


def _check_row_shape(rows, cfg):
    """Every row: ascending distinct ids, then -1 padding."""
    for row in rows.reshape(-1, rows.shape[-1]):
        ids = row[row >= 0]
        n = len(ids)
        assert np.all(row[n:] == -1), row
        assert np.all(np.diff(ids) > 0), row


# ---------------------------------------------------------------------------
# The differential test on integer-valued data (exact)
# ---------------------------------------------------------------------------

_N_CHUNKS = 8


@pytest.mark.parametrize("chunk", range(_N_CHUNKS))
def test_integer_data_native_equals_reference(chunk):
    """Batched 3-D form vs reference, and every query's 2-D call vs its row."""
    per = N_INT_CASES // _N_CHUNKS
    for i in range(chunk * per, (chunk + 1) * per):
        seed = SEED_BASE + i
        cfg, k, q, pos, mode = make_case(seed)
        what = _describe(seed, cfg, k, q, pos, mode)
        expected = _ref_select(q, k, pos, cfg)
        native = ks.block_sparse_select(q, k, pos, cfg)
        _assert_rows_equal(native, expected, what)
        _check_row_shape(native, cfg)
        for j, p in enumerate(pos):
            one = ks.block_sparse_select(q[j], k, int(p), cfg)
            _assert_rows_equal(one, native[j], f"{what}: 2-D call for query {j}")


def test_the_random_configurations_cover_the_edge_cases():
    """The generator does reach what the differential test is meant to cover."""
    seen = {"bs": set(), "beyond": 0, "top0": 0, "nan": 0, "huge_forced": 0, "heads": set()}
    modes = set()
    for i in range(N_INT_CASES):
        cfg, k, q, pos, mode = make_case(SEED_BASE + i)
        seen["bs"].add(cfg.block_size)
        seen["beyond"] += int(np.any(pos >= k.shape[0]))
        seen["top0"] += int(cfg.top_blocks == 0)
        seen["nan"] += int(np.isnan(k).any())
        seen["heads"].add(q.shape[1])
        n_blocks = -(-k.shape[0] // cfg.block_size)
        seen["huge_forced"] += int(cfg.init_blocks + cfg.local_blocks > n_blocks)
        modes.add(mode)
    assert set(BLOCK_SIZES) <= seen["bs"]
    assert seen["heads"] == set(range(1, 9))
    assert modes == {"uniform", "ties", "zeros", "all_equal", "signed_zero"}
    for key in ("beyond", "top0", "nan", "huge_forced"):
        assert seen[key] >= 30, (key, seen[key])


# ---------------------------------------------------------------------------
# Packed batches
# ---------------------------------------------------------------------------


def make_packed_case(seed):
    rng = np.random.default_rng(seed)
    cfg = _random_config(rng)
    n_seqs = int(rng.integers(1, 6))
    lens = [int(rng.choice([0, int(rng.integers(1, 10)), int(rng.integers(1, 700))])) for _ in range(n_seqs)]
    if sum(lens) == 0:
        lens[0] = int(rng.integers(1, 50))
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    n = int(cu[-1])
    d = _d(rng, n)
    n_heads = int(rng.integers(1, 9))
    n_queries = int(rng.integers(1, 12))
    mode = str(rng.choice(["uniform", "ties", "zeros", "signed_zero"]))
    k, q = _int_data(rng, n, n_heads, d, n_queries, mode)
    sid = rng.integers(0, n_seqs, size=n_queries)
    if rng.random() < 0.5:
        sid = np.sort(sid)  # runs of one sequence, as a serving batch has
    pos = np.array([_positions(rng, max(lens[s], 1), cfg.block_size, 1)[0] for s in sid], dtype=np.int64)
    return cfg, k, q, cu, sid.astype(np.int64), pos, mode


def test_packed_equals_reference_and_per_sequence_calls():
    for i in range(N_PACKED_CASES):
        seed = SEED_BASE + 100_000 + i
        cfg, k, q, cu, sid, pos, mode = make_packed_case(seed)
        what = (
            f"seed={seed} {cfg!r} cu_seqlens={cu.tolist()} seq_ids={sid.tolist()} "
            f"query_pos={pos.tolist()} d={k.shape[1]} heads={q.shape[1]} mode={mode}"
        )
        native = ks.block_sparse_select_packed(q, k, cu, sid, pos, cfg)
        _assert_rows_equal(native, _ref_packed(q, k, cu, sid, pos, cfg), what)
        for j in range(len(sid)):
            s = int(sid[j])
            keys = k[cu[s] : cu[s + 1]]
            one = ks.block_sparse_select(q[j], keys, int(pos[j]), cfg)
            _assert_rows_equal(one, native[j], f"{what}: per-sequence call for query {j}")
            _assert_rows_equal(_ref_select(q[j], keys, int(pos[j]), cfg), native[j], f"{what}: ref query {j}")


def test_packed_sequence_with_no_keys_selects_nothing():
    cfg = ks.BlockSparseConfig(4, 3, 1, 1)
    k = np.ones((10, 2), np.float32)
    q = np.ones((3, 2, 2), np.float32)
    cu = np.array([0, 0, 10, 10])
    out = ks.block_sparse_select_packed(q, k, cu, [0, 1, 2], [5, 5, 0], cfg)
    assert np.all(out[0] == -1) and np.all(out[2] == -1)
    assert out[1].tolist() == [[0, 1, -1], [0, 1, -1]]


# ---------------------------------------------------------------------------
# Random normal data: equal except for near-ties at the boundary
# ---------------------------------------------------------------------------


def test_random_float_data_agrees_except_near_ties():
    rows = exact_rows = 0
    for i in range(N_FLOAT_CASES):
        seed = SEED_BASE + 200_000 + i
        rng = np.random.default_rng(seed)
        cfg = _random_config(rng)
        n = _n_positions(rng)
        d = _d(rng, n)
        n_heads = int(rng.integers(1, 9))
        n_queries = int(rng.integers(1, 5))
        k = rng.standard_normal((n, d)).astype(np.float32)
        q = rng.standard_normal((n_queries, n_heads, d)).astype(np.float32)
        pos = _positions(rng, n, cfg.block_size, n_queries)
        native = ks.block_sparse_select(q, k, pos, cfg)
        expected = _ref_select(q, k, pos, cfg)
        all_scores = ref.block_scores(q, k, pos, cfg)
        for j in range(n_queries):
            scores = all_scores[j][:, ~np.isnan(all_scores[j, 0])]  # the visible blocks
            for h in range(n_heads):
                rows += 1
                a, b = native[j, h], expected[j, h]
                if np.array_equal(a, b):
                    exact_rows += 1
                    continue
                a_set, b_set = set(a[a >= 0].tolist()), set(b[b >= 0].tolist())
                assert len(a_set) == len(b_set), (seed, j, h, a, b)
                # The boundary: the weakest block the reference chose on score.
                n_blocks = scores.shape[1]
                forced = set(range(min(cfg.init_blocks, n_blocks))) | set(
                    range(max(n_blocks - cfg.local_blocks, 0), n_blocks)
                )
                assert forced <= a_set, (seed, j, h, a, forced)
                boundary = min(scores[h, sorted(b_set - forced)])
                tol = 1e-4 * max(1.0, abs(boundary))
                for blk in a_set ^ b_set:
                    assert abs(scores[h, blk] - boundary) <= tol, (
                        f"seed={seed} query {j} head {h}: block {blk} scores "
                        f"{scores[h, blk]!r}, boundary {boundary!r}; native {a}, ref {b}"
                    )
    # Near-ties at the boundary are rare on random data: the check is not vacuous.
    assert exact_rows >= 0.99 * rows, (exact_rows, rows)


def test_a_near_tie_is_only_resolved_within_rounding():
    """Two blocks whose maxima differ by far more than float32 rounding."""
    cfg = ks.BlockSparseConfig(2, 1, 0, 0)
    k = np.array([[1.0], [0.0], [1.0 + 2**-20], [0.0]], np.float32)
    q = np.array([[1.0]], np.float32)
    assert ks.block_sparse_select(q, k, 3, cfg).tolist() == [[1]]
    assert _ref_select(q, k, 3, cfg).tolist() == [[1]]


# ---------------------------------------------------------------------------
# Numbers: NaN, signed zeros, ties
# ---------------------------------------------------------------------------


def test_nan_positions_are_absent_and_nan_blocks_score_minus_inf():
    cfg = ks.BlockSparseConfig(2, 2, 0, 0)
    q = np.array([[1.0, 1.0]], np.float32)
    k = np.zeros((8, 2), np.float32)
    k[0] = [np.nan, 0]  # block 0: one NaN, one 0 -> scores 0
    k[2] = [np.nan, 0]
    k[3] = [0, np.nan]  # block 1: all NaN -> -inf
    k[4] = [-5, -5]  # block 2: -10 and 0 -> 0
    k[6] = [-1, -1]
    k[7] = [-1, -1]  # block 3: -2
    native = ks.block_sparse_select(q, k, 7, cfg)
    assert native.tolist() == [[0, 2]]
    assert _ref_select(q, k, 7, cfg).tolist() == [[0, 2]]

    # With room for all four, the NaN block fills a slot nothing better wants.
    cfg4 = ks.BlockSparseConfig(2, 4, 0, 0)
    assert ks.block_sparse_select(q, k, 7, cfg4).tolist() == [[0, 1, 2, 3]]
    # A NaN block never displaces a finite one, however negative.
    cfg3 = ks.BlockSparseConfig(2, 3, 0, 0)
    k2 = k.copy()
    k2[6:] = -1e30
    assert ks.block_sparse_select(q, k2, 7, cfg3).tolist() == [[0, 2, 3]]
    assert _ref_select(q, k2, 7, cfg3).tolist() == [[0, 2, 3]]


def test_minus_inf_blocks_fill_slots_lowest_id_first():
    cfg = ks.BlockSparseConfig(1, 3, 0, 1)
    k = np.full((6, 1), np.nan, np.float32)
    k[2] = 1.0
    q = np.array([[1.0]], np.float32)
    # Block 5 forced; block 2 best; the remaining slot goes to the lowest -inf block.
    assert ks.block_sparse_select(q, k, 5, cfg).tolist() == [[0, 2, 5]]
    assert _ref_select(q, k, 5, cfg).tolist() == [[0, 2, 5]]
    # Every key NaN: still never empty, and lowest ids first.
    k[:] = np.nan
    assert ks.block_sparse_select(q, k, 5, cfg).tolist() == [[0, 1, 5]]


@pytest.mark.parametrize("neg_first", [True, False])
def test_minus_zero_and_plus_zero_are_one_score(neg_first):
    """A zero tie goes to the lower block whichever block holds -0.0."""
    cfg = ks.BlockSparseConfig(2, 1, 0, 0)
    neg = np.array([[-0.0, -0.0]], np.float32)
    pos = np.array([[0.0, 0.0]], np.float32)
    k = np.concatenate([neg, neg, pos, pos] if neg_first else [pos, pos, neg, neg])
    k = np.concatenate([k, np.full((2, 2), -1, np.float32)])  # block 2 scores -2
    q = np.array([[1.0, 2.0]], np.float32)
    assert ks.block_sparse_select(q, k, 5, cfg).tolist() == [[0]]
    assert _ref_select(q, k, 5, cfg).tolist() == [[0]]
    # And the mirror: a negative query makes +0.0 keys score -0.0.
    assert ks.block_sparse_select(-q, k[:4], 3, cfg).tolist() == [[0]]


def test_every_block_tied_goes_to_the_lowest_ids():
    for bs in (1, 3, 128):
        cfg = ks.BlockSparseConfig(bs, 3, 0, 0)
        k = np.ones((40 * bs, 5), np.float32)
        q = np.ones((2, 5), np.float32)
        assert ks.block_sparse_select(q, k, 40 * bs - 1, cfg).tolist() == [[0, 1, 2]] * 2


# ---------------------------------------------------------------------------
# The spec's own examples
# ---------------------------------------------------------------------------


def _keys(n, hot):
    return np.array([[1.0, 0.0] if p in hot else [0.0, 0.01] for p in range(n)], np.float32)


def test_spec_examples():
    q = np.array([[1.0, 0.0]], np.float32)
    c = ks.BlockSparseConfig(4, 3, 1, 1)
    # Best position, not the average.
    assert 1 in ks.block_sparse_select(q, _keys(16, [5]), 15, c)[0]
    # Forced first and newest blocks.
    sel = ks.block_sparse_select(q, _keys(16, [4, 5, 8, 9]), 15, c)[0]
    assert 0 in sel and 3 in sel
    # The budget includes the forced blocks; a tight budget widens to hold them.
    assert (ks.block_sparse_select(q, _keys(64, []), 63, c)[0] >= 0).sum() == 3
    tight = ks.BlockSparseConfig(4, 1, 2, 2)
    assert ks.block_sparse_select(q, _keys(64, []), 63, tight).tolist() == [[0, 1, 14, 15]]
    # Causal: a query at 6 with blocks of 4 sees blocks 0 and 1 only.
    c8 = ks.BlockSparseConfig(4, 8, 1, 1)
    sel = ks.block_sparse_select(q, _keys(16, []), 6, c8)[0]
    assert sel[sel >= 0].tolist() == [0, 1]
    assert ks.positions_of_blocks(sel, 6, 16, c8).tolist() == list(range(7))
    assert ref.positions_of_blocks(sel, 6, 16, c8).tolist() == list(range(7))
    # A query beyond the keys is clipped.
    sel = ks.block_sparse_select(q, _keys(6, []), 100, c8)[0]
    assert sel[sel >= 0].tolist() == [0, 1]
    assert ks.positions_of_blocks(sel, 100, 6, c8).tolist() == [0, 1, 2, 3, 4, 5]
    assert ref.positions_of_blocks(sel, 100, 6, c8).tolist() == [0, 1, 2, 3, 4, 5]
    # Ties to the lower block, run after run.
    c0 = ks.BlockSparseConfig(4, 3, 0, 0)
    allsame = np.tile(np.array([[1.0, 0.0]], np.float32), (16, 1))
    for _ in range(8):
        assert ks.block_sparse_select(q, allsame, 15, c0).tolist() == [[0, 1, 2]]
    # Per KV head, no reduction.
    k = np.zeros((16, 2), np.float32)
    k[5] = [1, 0]
    k[9] = [0, 1]
    sel = ks.block_sparse_select(np.eye(2, dtype=np.float32), k, 15, c)
    assert 1 in sel[0] and 2 in sel[1]
    # Never empty, however poor the scores.
    c1 = ks.BlockSparseConfig(4, 1, 1, 1)
    z = np.zeros((64, 2), np.float32)
    for p in [0, 1, 3, 4, 17, 63]:
        sel = ks.block_sparse_select(q, z, p, c1)[0]
        covered = ks.positions_of_blocks(sel, p, 64, c1)
        assert len(covered) and covered.max() <= p


def test_no_keys_selects_nothing():
    cfg = ks.BlockSparseConfig(4, 3, 1, 1)
    k = np.zeros((0, 3), np.float32)
    q = np.ones((2, 3), np.float32)
    for p in (0, 5, 2**40):
        assert ks.block_sparse_select(q, k, p, cfg).tolist() == [[-1, -1, -1]] * 2
        assert _ref_select(q, k, p, cfg).tolist() == [[-1, -1, -1]] * 2
    out = ks.block_sparse_select(np.ones((3, 2, 3), np.float32), k, [0, 1, 9], cfg)
    assert out.shape == (3, 2, 3) and np.all(out == -1)


def test_top_blocks_zero_selects_exactly_the_forced_blocks():
    cfg = ks.BlockSparseConfig(3, 0, 2, 1)
    rng = np.random.default_rng(5)
    k = rng.integers(-3, 4, size=(100, 4)).astype(np.float32)
    q = rng.integers(-3, 4, size=(3, 4)).astype(np.float32)
    for p in (0, 3, 6, 50, 99, 500):
        nb = min(p // 3 + 1, 34)
        want = sorted(set(range(min(2, nb))) | {nb - 1})
        row = want + [-1] * (3 - len(want))
        assert ks.block_sparse_select(q, k, p, cfg).tolist() == [row] * 3


def test_default_config_is_the_spec_default():
    rng = np.random.default_rng(11)
    k = rng.integers(-3, 4, size=(5000, 16)).astype(np.float32)
    q = rng.integers(-3, 4, size=(4, 16)).astype(np.float32)
    a = ks.block_sparse_select(q, k, 4999)
    assert a.shape == (4, 32)
    assert np.array_equal(a, ks.block_sparse_select(q, k, 4999, ks.BlockSparseConfig()))
    assert np.array_equal(a, ks.block_sparse_select(q, k, 4999, None))
    assert np.array_equal(a, ref.block_sparse_select(q, k, 4999))


# ---------------------------------------------------------------------------
# Conversions: dtypes, strides, read-only, zero-copy
# ---------------------------------------------------------------------------


def test_float16_and_float64_inputs_equal_float32():
    for i in range(40):
        cfg, k, q, pos, mode = make_case(SEED_BASE + 300_000 + i)
        base = ks.block_sparse_select(q, k, pos, cfg)
        for dt in (np.float16, np.float64):
            got = ks.block_sparse_select(q.astype(dt), k.astype(dt), pos, cfg)
            _assert_rows_equal(got, base, f"case {i}, {np.dtype(dt).name}")
            got = ks.block_sparse_select(q.astype(dt), k, pos, cfg)
            _assert_rows_equal(got, base, f"case {i}, q {np.dtype(dt).name}")
    # Non-integer float64: converted to float32 first (only the order matters).
    rng = np.random.default_rng(3)
    k64 = rng.standard_normal((700, 33))
    q64 = rng.standard_normal((5, 4, 33))
    cfg = ks.BlockSparseConfig(7, 6, 1, 2)
    pos = np.array([0, 100, 699, 350, 5000])
    assert np.array_equal(
        ks.block_sparse_select(q64, k64, pos, cfg),
        ks.block_sparse_select(q64.astype(np.float32), k64.astype(np.float32), pos, cfg),
    )


def test_non_contiguous_inputs_equal_contiguous():
    for i in range(30):
        cfg, k, q, pos, mode = make_case(SEED_BASE + 400_000 + i)
        base = ks.block_sparse_select(q, k, pos, cfg)
        n, d = k.shape
        wide = np.zeros((n, 2 * d), np.float32)
        wide[:, ::2] = k
        fortran = np.asfortranarray(k)
        reversed_rows = k[::-1][::-1]  # negative strides twice: a view
        for kk in (wide[:, ::2], fortran, reversed_rows):
            _assert_rows_equal(ks.block_sparse_select(q, kk, pos, cfg), base, f"case {i}")
        qt = np.ascontiguousarray(q.transpose(2, 1, 0)).transpose(2, 1, 0)  # strided view
        _assert_rows_equal(ks.block_sparse_select(qt, k, pos, cfg), base, f"case {i}, q view")
        pos_wide = np.zeros(2 * len(pos), np.int64)
        pos_wide[::2] = pos
        _assert_rows_equal(ks.block_sparse_select(q, k, pos_wide[::2], cfg), base, f"case {i}")
        if np.all(pos < 2**31):
            p32 = pos.astype(np.int32)
            _assert_rows_equal(ks.block_sparse_select(q, k, p32, cfg), base, f"case {i}, int32")
        _assert_rows_equal(ks.block_sparse_select(q.tolist(), k.tolist(), pos.tolist(), cfg), base, f"case {i}")


def test_read_only_float32_is_accepted():
    rng = np.random.default_rng(0)
    k = rng.integers(-3, 4, size=(300, 8)).astype(np.float32)
    q = rng.integers(-3, 4, size=(2, 3, 8)).astype(np.float32)
    pos = np.array([10, 299])
    base = ks.block_sparse_select(q, k, pos, ks.BlockSparseConfig(4, 5, 1, 1))
    for a in (k, q, pos):
        a.setflags(write=False)
    got = ks.block_sparse_select(q, k, pos, ks.BlockSparseConfig(4, 5, 1, 1))
    assert np.array_equal(got, base)
    cfg = ks.BlockSparseConfig(4, 5, 1, 1)
    got = ks.block_sparse_select_packed(q, k, [0, 300], [0, 0], pos, cfg)
    assert np.array_equal(got, base)


def _peak_numpy_bytes(fn):
    gc.collect()
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        fn()
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        if not was_tracing:
            tracemalloc.stop()


def test_float32_c_contiguous_keys_are_not_copied():
    """NumPy allocations are visible to tracemalloc: converting 16 MB of keys
    shows up, reading float32 keys in place does not."""
    k32 = np.zeros((64 * 1024, 64), np.float32)  # 16 MiB
    q = np.ones((4, 64), np.float32)
    cfg = ks.BlockSparseConfig(128, 4, 1, 1)
    in_place = _peak_numpy_bytes(lambda: ks.block_sparse_select(q, k32, 10**6, cfg))
    k64 = k32.astype(np.float64)
    converted = _peak_numpy_bytes(lambda: ks.block_sparse_select(q, k64, 10**6, cfg))
    assert converted >= k32.nbytes  # the method sees a conversion...
    assert in_place < 1 << 20  # ...and there is none for float32


# ---------------------------------------------------------------------------
# The out= buffer
# ---------------------------------------------------------------------------


def _small_case():
    rng = np.random.default_rng(1)
    k = rng.integers(-3, 4, size=(200, 6)).astype(np.float32)
    q = rng.integers(-3, 4, size=(3, 2, 6)).astype(np.float32)
    return ks.BlockSparseConfig(4, 5, 1, 1), k, q, np.array([0, 77, 199])


def test_out_is_filled_and_returned():
    cfg, k, q, pos = _small_case()
    want = ks.block_sparse_select(q, k, pos, cfg)
    out = np.full(want.shape, 12345, np.int32)
    got = ks.block_sparse_select(q, k, pos, cfg, out=out)
    assert got is out and np.array_equal(out, want)
    out2 = np.full((2, 5), 7, np.int32)
    assert ks.block_sparse_select(q[1], k, 77, cfg, out=out2) is out2
    assert np.array_equal(out2, want[1])
    # Reused: a second call overwrites every slot.
    ks.block_sparse_select(q, k, np.array([5, 5, 5]), cfg, out=out)
    assert np.array_equal(out, ks.block_sparse_select(q, k, np.array([5, 5, 5]), cfg))
    out3 = np.full(want.shape, -7, np.int32)
    packed = ks.block_sparse_select_packed(q, k, [0, 200], [0, 0, 0], pos, cfg, out=out3)
    assert packed is out3 and np.array_equal(out3, want)


def test_out_refusals_leave_it_untouched():
    cfg, k, q, pos = _small_case()
    shape = (3, 2, 5)
    with pytest.raises(TypeError, match=r"^out must have dtype int32, got int64: .*never converted"):
        ks.block_sparse_select(q, k, pos, cfg, out=np.zeros(shape, np.int64))
    with pytest.raises(TypeError, match=r"^out must have dtype int32, got float32: "):
        ks.block_sparse_select(q, k, pos, cfg, out=np.zeros(shape, np.float32))
    with pytest.raises(ks.SelectionError) as e:
        ks.block_sparse_select(q, k, pos, cfg, out=np.zeros((3, 2, 6), np.int32))
    assert e.value.argument == "out"
    with pytest.raises(ks.SelectionError) as e:
        ks.block_sparse_select(q, k, pos, cfg, out=np.zeros((6, 5), np.int32))
    assert e.value.argument == "out"
    ro = np.zeros(shape, np.int32)
    ro.setflags(write=False)
    with pytest.raises(ks.SelectionError, match=r"^out is read-only$") as e:
        ks.block_sparse_select(q, k, pos, cfg, out=ro)
    assert e.value.argument == "out"
    strided = np.zeros((3, 2, 10), np.int32)[:, :, ::2]
    with pytest.raises(ks.SelectionError, match=r"^out is not C-contiguous: .*never copied") as e:
        ks.block_sparse_select(q, k, pos, cfg, out=strided)
    assert e.value.argument == "out"

    # A refused call leaves out byte-identical, whatever it refused.
    out = np.arange(30, dtype=np.int32).reshape(shape) * 7 - 3
    snapshot = out.tobytes()
    refusals = [
        (lambda: ks.block_sparse_select(q, k, np.array([0, -1, 3]), cfg, out=out), "query_pos", r"query_pos\[1\] = -1"),
        (
            lambda: ks.block_sparse_select(q, k, np.array([0, 1]), cfg, out=out),
            "query_pos",
            r"\[n_queries=3\], got \[2\]",
        ),
        (lambda: ks.block_sparse_select(q, k[:, :5], pos, cfg, out=out), "index_q", r"d=6 but index_k has d=5"),
        (
            lambda: ks.block_sparse_select_packed(q, k, [0, 200], [0, 1, 0], pos, cfg, out=out),
            "seq_ids",
            r"seq_ids\[1\] = 1 is out of range",
        ),
        (
            lambda: ks.block_sparse_select_packed(q, k, [0, 100], [0, 0, 0], pos, cfg, out=out),
            "cu_seqlens",
            r"cu_seqlens ends at 100, but index_k has 200 keys",
        ),
        (
            lambda: ks.block_sparse_select_packed(q, k, [0, 200], [0, 0, 0], [0, 1, -5], cfg, out=out),
            "query_pos",
            r"query_pos\[2\] = -5 is negative",
        ),
    ]
    for refuse, argument, message in refusals:
        with pytest.raises(ks.SelectionError, match=message) as e:
            refuse()
        assert e.value.argument == argument, (argument, str(e.value))
        assert out.tobytes() == snapshot


# ---------------------------------------------------------------------------
# Refusals
# ---------------------------------------------------------------------------


def _raises_selection(fn, argument):
    with pytest.raises(ks.SelectionError) as e:
        fn()
    assert isinstance(e.value, ValueError)
    assert e.value.argument == argument, (e.value.argument, str(e.value))
    assert argument in str(e.value)
    return e.value


def test_wrong_shapes_name_the_argument():
    cfg = ks.BlockSparseConfig(4, 3, 1, 1)
    k = np.ones((10, 4), np.float32)
    q = np.ones((2, 4), np.float32)
    q3 = np.ones((3, 2, 4), np.float32)
    sel = ks.block_sparse_select
    _raises_selection(lambda: sel(np.ones((2, 3), np.float32), k, 3, cfg), "index_q")
    _raises_selection(lambda: sel(np.ones((3, 2, 5), np.float32), k, [1, 2, 3], cfg), "index_q")
    _raises_selection(lambda: sel(np.ones(4, np.float32), k, 3, cfg), "index_q")
    _raises_selection(lambda: sel(np.ones((1, 1, 2, 4), np.float32), k, 3, cfg), "index_q")
    _raises_selection(lambda: sel(q, np.ones((2, 10, 4), np.float32), 3, cfg), "index_k")
    _raises_selection(lambda: sel(q, np.ones(40, np.float32), 3, cfg), "index_k")
    _raises_selection(lambda: sel(q, k, np.array([3]), cfg), "query_pos")
    _raises_selection(lambda: sel(q, k, np.array([3, 4]), cfg), "query_pos")
    _raises_selection(lambda: sel(q3, k, np.array([1, 2]), cfg), "query_pos")
    _raises_selection(lambda: sel(q3, k, np.array([[1, 2, 3]]), cfg), "query_pos")
    pk = ks.block_sparse_select_packed
    _raises_selection(lambda: pk(q, k, [0, 10], [0, 0], [1, 2], cfg), "index_q")
    _raises_selection(lambda: pk(q3, k, [0, 10], [0, 0], [1, 2, 3], cfg), "seq_ids")
    _raises_selection(lambda: pk(q3, k, [0, 10], [0, 0, 0], [1, 2], cfg), "query_pos")
    _raises_selection(lambda: pk(q3, k, [0, 10], [0, 0, 1], [1, 2, 3], cfg), "seq_ids")
    _raises_selection(lambda: pk(q3, k, [0, 5], [0, 0, 0], [1, 2, 3], cfg), "cu_seqlens")
    _raises_selection(lambda: pk(q3, k, [0, 6, 5, 10], [0, 0, 0], [1, 2, 3], cfg), "cu_seqlens")


def test_negative_positions_are_selection_errors_not_overflow():
    cfg = ks.BlockSparseConfig(4, 3, 1, 1)
    k = np.ones((10, 4), np.float32)
    q = np.ones((2, 4), np.float32)
    q3 = np.ones((2, 2, 4), np.float32)
    for bad in (-1, -(2**40), -(2**70)):
        _raises_selection(lambda: ks.block_sparse_select(q, k, bad, cfg), "query_pos")
    _raises_selection(lambda: ks.block_sparse_select(q, k, 2**70, cfg), "query_pos")
    _raises_selection(lambda: ks.block_sparse_select(q3, k, [1, -1], cfg), "query_pos")
    for bad in (np.array([1, -1], np.int8), np.array([1, 2**64 - 1], np.uint64)):
        _raises_selection(lambda: ks.block_sparse_select(q3, k, bad, cfg), "query_pos")
    _raises_selection(lambda: ks.positions_of_blocks([0], -1, 10, cfg), "query_pos")
    _raises_selection(lambda: ks.positions_of_blocks([0], 1, -10, cfg), "n_positions")


def test_wrong_dtypes_are_type_errors():
    cfg = ks.BlockSparseConfig(4, 3, 1, 1)
    k = np.ones((10, 4), np.float32)
    q = np.ones((2, 4), np.float32)
    sel = ks.block_sparse_select
    # Each refusal names the argument and the dtype or type it was given.
    for bad_q, dtype in (
        (np.ones((2, 4), np.int32), "int32"),
        (np.ones((2, 4), np.int64), "int64"),
        (np.full((2, 4), "a"), "str32"),
        (np.full((2, 4), None, dtype=object), "object"),
        (np.ones((2, 4), bool), "bool"),
    ):
        with pytest.raises(TypeError, match=rf"^index_q has dtype {dtype}, which is not a key format: .*query_format$"):
            sel(bad_q, k, 3, cfg)
    for bad_k, dtype in (
        (np.ones((10, 4), np.int32), "int32"),
        (np.full((10, 4), "x"), "str32"),
        (np.full((10, 4), object()), "object"),
    ):
        with pytest.raises(TypeError, match=rf"^index_k has dtype {dtype}, which is not a key format: .*key_format$"):
            sel(q, bad_k, 3, cfg)
    with pytest.raises(TypeError, match=r"^query_pos must be an integer, got float$"):
        sel(q, k, 3.0, cfg)
    with pytest.raises(TypeError, match=r"^query_pos must be an integer, got str$"):
        sel(q, k, "3", cfg)
    with pytest.raises(TypeError, match=r"^query_pos must hold integers, got dtype float64$"):
        sel(np.ones((2, 2, 4), np.float32), k, np.array([1.0, 2.0]), cfg)
    with pytest.raises(TypeError, match=r"^config must be a kvselect\.BlockSparseConfig or None, got str$"):
        sel(q, k, 3, "config")
    with pytest.raises(TypeError, match=r"^config must be a kvselect\.BlockSparseConfig or None, got tuple$"):
        sel(q, k, 3, (4, 3, 1, 1))
    with pytest.raises(TypeError, match=r"^blocks must hold integers \(int32 offsets\), got dtype float64$"):
        ks.positions_of_blocks(np.array([0.0]), 3, 10, cfg)
    with pytest.raises(TypeError, match=r"^cu_seqlens must hold integers, got dtype float64$"):
        ks.block_sparse_select_packed(np.ones((2, 2, 4), np.float32), k, [0.0, 10.0], [0, 0], [1, 2], cfg)


def test_numpy_integer_positions_are_accepted():
    cfg = ks.BlockSparseConfig(4, 3, 1, 1)
    rng = np.random.default_rng(2)
    k = rng.integers(-3, 4, size=(50, 4)).astype(np.float32)
    q = rng.integers(-3, 4, size=(2, 4)).astype(np.float32)
    base = ks.block_sparse_select(q, k, 33, cfg)
    for p in (np.int64(33), np.int32(33), np.uint8(33), np.array(33)):
        assert np.array_equal(ks.block_sparse_select(q, k, p, cfg), base)


# ---------------------------------------------------------------------------
# BlockSparseConfig
# ---------------------------------------------------------------------------


def test_config_defaults_repr_eq_hash():
    c = ks.BlockSparseConfig()
    assert (c.block_size, c.top_blocks, c.init_blocks, c.local_blocks) == (128, 32, 1, 2)
    assert c.block_size == ks.MINIMAX_BLOCK_SIZE == ref.MINIMAX_BLOCK_SIZE == 128
    assert c.width == 32
    assert repr(c) == ("BlockSparseConfig(block_size=128, top_blocks=32, init_blocks=1, local_blocks=2)")
    assert eval(repr(c), {"BlockSparseConfig": ks.BlockSparseConfig}) == c
    assert c == ks.BlockSparseConfig(128, 32, 1, 2)
    assert c == ks.BlockSparseConfig(block_size=128, top_blocks=32, init_blocks=1, local_blocks=2)
    assert c != ks.BlockSparseConfig(128, 16, 0, 1)
    assert c != (128, 32, 1, 2)
    assert hash(c) == hash(ks.BlockSparseConfig())
    assert len({c, ks.BlockSparseConfig(), ks.BlockSparseConfig(128, 16, 0, 1)}) == 2
    assert ks.BlockSparseConfig(4, 1, 2, 2).width == 4
    assert ks.BlockSparseConfig(top_blocks=16, init_blocks=0, local_blocks=1).block_size == 128


def test_config_is_immutable_and_pickles():
    c = ks.BlockSparseConfig(7, 5, 0, 3)
    for name in ("block_size", "top_blocks", "init_blocks", "local_blocks", "width"):
        with pytest.raises(
            AttributeError, match=rf"attribute '{name}' of '(kvselect\.)?BlockSparseConfig' objects is not writable"
        ):
            setattr(c, name, 1)
    with pytest.raises(AttributeError, match=r"'(kvselect\.)?BlockSparseConfig' object has no attribute 'new_field'"):
        c.new_field = 1
    for proto in range(pickle.HIGHEST_PROTOCOL + 1):
        back = pickle.loads(pickle.dumps(c, protocol=proto))
        assert back == c and type(back) is ks.BlockSparseConfig
    assert c == ks.BlockSparseConfig(7, 5, 0, 3)


def test_refused_configs():
    for args, argument in [
        ((0,), "block_size"),
        ((0, 4, 1, 1), "block_size"),
        ((4, 0, 0, 0), "top_blocks"),
        ((-1,), "block_size"),
        ((4, -1), "top_blocks"),
        ((4, 3, -1), "init_blocks"),
        ((4, 3, 1, -2), "local_blocks"),
        ((2**40,), "block_size"),
    ]:
        with pytest.raises(ks.SelectionError) as e:
            ks.BlockSparseConfig(*args)
        assert isinstance(e.value, ValueError)
        assert e.value.argument == argument, (args, e.value.argument)
        if args in ((0,), (0, 4, 1, 1), (4, 0, 0, 0)):
            with pytest.raises(ref.ReferenceSelectionError) as e:
                ref.block_sparse_select(np.ones((1, 1)), np.ones((1, 1)), 0, ref.BlockSparseConfig(*args))
            assert e.value.argument == argument
    for bad, kind in (("4", "str"), (4.0, "float"), (4.5, "float"), ([4], "list")):
        with pytest.raises(TypeError, match=rf"^block_size must be an integer, got {kind}$"):
            ks.BlockSparseConfig(bad)
    # Forced blocks alone are a valid config.
    assert ks.BlockSparseConfig(4, 0, 1, 0).width == 1
    assert ks.BlockSparseConfig(4, 0, 0, 1).width == 1


# ---------------------------------------------------------------------------
# positions_of_blocks
# ---------------------------------------------------------------------------


def test_positions_of_blocks_examples():
    c = ks.BlockSparseConfig(4, 8, 1, 1)
    assert ks.positions_of_blocks([0, 1], 6, 16, c).tolist() == [0, 1, 2, 3, 4, 5, 6]
    assert ks.positions_of_blocks([0, 1, -1, -1], 100, 6, c).tolist() == [0, 1, 2, 3, 4, 5]
    assert ks.positions_of_blocks([4], 6, 16, c).tolist() == []  # after the query
    assert ks.positions_of_blocks([3, 1, 1], 15, 16, c).tolist() == [4, 5, 6, 7, 12, 13, 14, 15]
    assert ks.positions_of_blocks([2**31 - 1], 10, 10, c).tolist() == []
    assert ks.positions_of_blocks([], 10, 10, c).tolist() == []
    out = ks.positions_of_blocks(np.array([0, 2], np.int64), 200, 300)  # default: blocks of 128
    assert out.dtype == np.int32 and out.tolist() == list(range(128))  # block 2 is after 200
    both = list(range(128)) + list(range(256, 300))
    assert ks.positions_of_blocks([2, 0], 299, 300).tolist() == both
    assert ref.positions_of_blocks([0, 2], 200, 300).tolist() == list(range(128))


@HYP
@given(
    blocks=st.lists(st.integers(-3, 60), max_size=12),
    query_pos=st.integers(0, 400),
    n_positions=st.integers(0, 400),
    bs=st.sampled_from([1, 2, 3, 5, 7, 16, 128]),
)
def test_positions_of_blocks_equals_reference(blocks, query_pos, n_positions, bs):
    cfg = ks.BlockSparseConfig(bs, 1, 0, 0)
    got = ks.positions_of_blocks(np.array(blocks, np.int32), query_pos, n_positions, cfg)
    want = ref.positions_of_blocks(np.array(blocks, np.int64), query_pos, n_positions, cfg)
    assert got.dtype == np.int32
    assert got.tolist() == want.tolist()
    assert np.all(np.diff(got) > 0)
    assert np.all(got < min(query_pos + 1, n_positions))


# ---------------------------------------------------------------------------
# Property tests (Hypothesis)
# ---------------------------------------------------------------------------


@st.composite
def _int_problem(draw):
    bs = draw(st.sampled_from([1, 2, 3, 5, 7, 128]) | st.integers(1, 12))
    top = draw(st.integers(0, 8))
    init = draw(st.integers(0, 4))
    local = draw(st.integers(0 if (top or init) else 1, 4))
    n = draw(st.integers(0, 300))
    d = draw(st.integers(1, 20))
    h = draw(st.integers(1, 8))
    if n * d <= 64:
        # Small enough for Hypothesis to draw (and shrink) every value.
        small = st.integers(-3, 3).map(float)
        k = draw(hnp.arrays(np.float32, (n, d), elements=small))
        q = draw(hnp.arrays(np.float32, (h, d), elements=small))
    else:
        # Larger: values from a drawn seed, with a drawn share of zero keys
        # (ties) and of keys repeated from a small pool.
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        zeros = draw(st.sampled_from([0.0, 0.5, 0.95, 1.0]))
        k = rng.integers(-3, 4, size=(n, d)) * (rng.random((n, 1)) >= zeros)
        if draw(st.booleans()):
            k = k[rng.integers(0, 3, size=n)] if n >= 3 else k
        k = k.astype(np.float32)
        q = rng.integers(-3, 4, size=(h, d)).astype(np.float32)
    pos = draw(st.integers(0, n + 3 * bs + 3))
    return ks.BlockSparseConfig(bs, top, init, local), k, q, pos


@HYP
@given(_int_problem())
def test_property_integer_data_equals_reference(problem):
    cfg, k, q, pos = problem
    native = ks.block_sparse_select(q, k, pos, cfg)
    _assert_rows_equal(native, _ref_select(q, k, pos, cfg), repr(problem))
    _check_row_shape(native, cfg)
    # Never empty when a key exists; only visible blocks.
    n_blocks = -(-min(pos + 1, k.shape[0]) // cfg.block_size)
    for row in native:
        ids = row[row >= 0]
        assert (len(ids) > 0) == (n_blocks > 0)
        assert np.all(ids < n_blocks)
        forced = set(range(min(cfg.init_blocks, n_blocks))) | set(range(max(n_blocks - cfg.local_blocks, 0), n_blocks))
        assert forced <= set(ids.tolist())
        assert len(ids) == min(n_blocks, max(cfg.top_blocks, len(forced)))


@HYP
@given(_int_problem(), st.integers(-4, 4), st.randoms(use_true_random=False))
def test_property_order_only_scale_and_head_permutation(problem, exponent, rnd):
    """Scaling keys by a positive power of two changes no score's order, and
    permuting the KV heads permutes the rows (no cross-head reduction)."""
    cfg, k, q, pos = problem
    base = ks.block_sparse_select(q, k, pos, cfg)
    scaled = ks.block_sparse_select(q, k * np.float32(2.0**exponent), pos, cfg)
    assert np.array_equal(base, scaled)
    perm = list(range(q.shape[0]))
    rnd.shuffle(perm)
    assert np.array_equal(ks.block_sparse_select(q[perm], k, pos, cfg), base[perm])
    # Keys after the query never change its selection.
    if pos + 1 < k.shape[0]:
        k2 = k.copy()
        k2[pos + 1 :] = 3.0 * np.sign(q.sum(axis=0) + 0.5)
        assert np.array_equal(ks.block_sparse_select(q, k2, pos, cfg), base)


# ---------------------------------------------------------------------------
# Threads and determinism
# ---------------------------------------------------------------------------


def test_thread_count_does_not_change_the_result():
    rng = np.random.default_rng(9)
    k = rng.standard_normal((40_000, 64)).astype(np.float32)
    q = rng.standard_normal((24, 8, 64)).astype(np.float32)
    pos = rng.integers(0, 42_000, size=24)
    ki = rng.integers(-3, 4, size=(20_000, 33)).astype(np.float32)
    qi = rng.integers(-3, 4, size=(16, 4, 33)).astype(np.float32)
    posi = rng.integers(0, 20_000, size=16)
    cfgs = [ks.BlockSparseConfig(), ks.BlockSparseConfig(7, 20, 1, 3)]
    results = {}
    try:
        for n in (1, 2):
            ks.set_num_threads(n)
            assert ks.get_num_threads() == n
            results[n] = [ks.block_sparse_select(q, k, pos, c) for c in cfgs] + [
                ks.block_sparse_select(qi, ki, posi, c) for c in cfgs
            ]
    finally:
        ks.set_num_threads(0)
    for a, b in zip(results[1], results[2]):
        assert np.array_equal(a, b)
    # Integer data: equal to the reference too, at this size.
    assert np.array_equal(results[2][3], _ref_select(qi, ki, posi, cfgs[1]))


def test_repeated_calls_are_identical():
    rng = np.random.default_rng(4)
    k = rng.standard_normal((5000, 40)).astype(np.float32)
    q = rng.standard_normal((8, 4, 40)).astype(np.float32)
    pos = rng.integers(0, 5000, size=8)
    cfg = ks.BlockSparseConfig(16, 10, 1, 2)
    first = ks.block_sparse_select(q, k, pos, cfg)
    for _ in range(5):
        assert np.array_equal(first, ks.block_sparse_select(q, k, pos, cfg))


_CHILD = """
import sys
import numpy as np
import kvselect as ks
data = np.load(sys.argv[1])
out = {}
for name in data.files:
    if name.startswith("k_"):
        i = name[2:]
        cfg = ks.BlockSparseConfig(*data["cfg_" + i].tolist())
        out[i] = ks.block_sparse_select(data["q_" + i], data["k_" + i], data["pos_" + i], cfg)
np.savez(sys.argv[2], **out)
"""


@pytest.mark.parametrize("level", ["scalar", "avx2"])
def test_scalar_and_simd_kernels_select_identically(tmp_path, level):
    """The module docs promise one summation order on every SIMD level, so
    even random float data (near-ties and all) selects the same blocks with
    the portable or the AVX2 kernel (in a child process) as with the best
    level (AVX-512 where the CPU has it)."""
    require_simd()
    arrays, expected = {}, {}
    for i in range(60):
        rng = np.random.default_rng(SEED_BASE + 500_000 + i)
        cfg = _random_config(rng)
        n = _n_positions(rng)
        d = _d(rng, n)
        k = rng.standard_normal((n, d)).astype(np.float32)
        if i % 3 == 0:
            k = np.round(k * 2) / 2  # many exact ties, some -0.0
        q = rng.standard_normal((4, int(rng.integers(1, 9)), d)).astype(np.float32)
        pos = _positions(rng, n, cfg.block_size, 4)
        arrays.update({f"k_{i}": k, f"q_{i}": q, f"pos_{i}": pos, f"cfg_{i}": np.array(_cfg_tuple(cfg))})
        expected[str(i)] = ks.block_sparse_select(q, k, pos, cfg)
    np.savez(tmp_path / "in.npz", **arrays)
    assert_child_equals(_CHILD, tmp_path, level, expected, timeout=120)


def test_scores_past_float32_range_are_ranked_in_real_arithmetic():
    """1e20 * 1e20 and 1e20 * 2e20 both overflow float32 to +inf (the spec,
    scoring in float32, would tie them and take the lower block); the
    selection is exact, so block 2 (2e40) beats block 1 (1e40). The scores
    reported stay float32's."""
    cfg = ks.BlockSparseConfig(2, 1, 0, 0)
    k = np.array([[0], [0], [1e20], [0], [2e20], [0]], np.float32)
    q = np.array([[1e20]], np.float32)
    assert np.isinf(ks.block_scores(q[None], k, [5], cfg)[0, 0, 1:]).all()
    assert ks.block_sparse_select(q, k, 5, cfg).tolist() == [[2]]
    assert _ref_select(q, k, 5, cfg).tolist() == [[2]]
    # An infinite key times a zero query component is NaN: absent.
    k = np.array([[np.inf, 5], [0, 0], [0, 1], [0, 0]], np.float32)
    q = np.array([[0, 1]], np.float32)
    assert ks.block_sparse_select(q, k, 3, cfg).tolist() == [[1]]
    assert _ref_select(q, k, 3, cfg).tolist() == [[1]]


def test_large_batches_equal_reference():
    """Batches big enough to be split into several row groups and tasks."""
    rng = np.random.default_rng(7)
    k = rng.integers(-1, 2, size=(3000, 5)).astype(np.float32)
    q = rng.integers(-1, 2, size=(200, 8, 5)).astype(np.float32)
    pos = rng.integers(0, 3500, size=200)
    cfg = ks.BlockSparseConfig(1, 17, 2, 3)
    _assert_rows_equal(ks.block_sparse_select(q, k, pos, cfg), _ref_select(q, k, pos, cfg), "bs 1")
    # A whole prefill chunk, every position, in both orders.
    k = rng.integers(-2, 3, size=(700, 9)).astype(np.float32)
    q = rng.integers(-2, 3, size=(700, 2, 9)).astype(np.float32)
    cfg = ks.BlockSparseConfig(7, 6, 1, 2)
    for pos in (np.arange(700), np.arange(700)[::-1]):
        want = _ref_select(q, k, pos, cfg)
        _assert_rows_equal(ks.block_sparse_select(q, k, pos, cfg), want, "prefill")
    # A long context at the real block size, mostly zero keys (ties everywhere).
    k = np.zeros((200_000, 16), np.float32)
    k[rng.integers(0, 200_000, 50)] = rng.integers(-3, 4, size=(50, 16))
    q = rng.integers(-3, 4, size=(6, 4, 16)).astype(np.float32)
    pos = np.array([199_999, 150_000, 1000, 128 * 64 - 1, 128 * 64, 10**9])
    cfg = ks.BlockSparseConfig()
    _assert_rows_equal(ks.block_sparse_select(q, k, pos, cfg), _ref_select(q, k, pos, cfg), "200k")


def test_a_nan_query_selects_the_forced_and_lowest_blocks():
    cfg = ks.BlockSparseConfig(4, 5, 1, 2)
    k = np.arange(80, dtype=np.float32).reshape(40, 2)
    q = np.array([[np.nan, 1.0], [1.0, 1.0]], np.float32)
    got = ks.block_sparse_select(q, k, 39, cfg)
    assert got.tolist() == [[0, 1, 2, 8, 9], [0, 6, 7, 8, 9]]
    assert _ref_select(q, k, 39, cfg).tolist() == got.tolist()


_PAIRS_CHILD = """
import sys
import numpy as np
import kvselect as ks
data = np.load(sys.argv[1])
out = {}
for i in range(int(data["n"])):
    fmt = str(data[f"fmt_{i}"])
    kf = None if fmt == "float32" else fmt
    qf = None if fmt == "float32" else "bfloat16"
    cfg = ks.BlockSparseConfig(*data[f"cfg_{i}"].tolist())
    args = (data[f"q_{i}"], data[f"k_{i}"], data[f"pos_{i}"], cfg)
    out[f"rows_{i}"] = ks.block_sparse_select(*args, key_format=kf, query_format=qf)
    out[f"scores_{i}"] = ks.block_scores(*args, key_format=kf, query_format=qf)
np.savez(sys.argv[2], **out)
"""


@pytest.mark.parametrize("level", ["avx512bf16", "avx512", "avx2", "scalar"])
def test_bf16_prefills_give_the_same_blocks_and_score_bits_at_every_level(tmp_path, level):
    """The pair step's inputs -- bfloat16 queries against bfloat16 or fp8 keys
    (raw views), or float32 arrays holding bfloat16 values, many rows (a
    prefill: the pair step runs where more than two row tiles read each key
    chunk) -- give the same blocks and block score bits at every level as in
    this process, whichever level it runs: exponents the pair level admits,
    tiny queries and keys it must hand to the float32 step (their flushes
    would act), NaN keys and signed zeros, d a multiple of 16 or not, blocks
    that start at odd keys. The pair level runs in a child with
    ``KVSELECT_SIMD=avx512bf16`` wherever the CPU has it, default or not."""
    from levels import level_runs

    ml_dtypes = pytest.importorskip("ml_dtypes")
    if not level_runs(level):
        if level in ("avx2", "scalar") and os.environ.get("KVSELECT_REQUIRE_AVX2") == "1":
            pytest.fail(f"KVSELECT_REQUIRE_AVX2=1, but KVSELECT_SIMD={level} is not that level")
        pytest.skip(f"this CPU has no {level} level")
    rng = np.random.default_rng(SEED_BASE + 46)
    n_cases = 18
    arrays, expected = {"n": np.array(n_cases)}, {}
    for i in range(n_cases):
        m, h = int(rng.integers(4, 40)), int(rng.choice([1, 3, 4, 8]))
        t, d = int(rng.integers(1, 1500)), int(rng.choice([16, 32, 64, 128, 24]))
        bs = int(rng.choice([5, 16, 64, 128]))
        cfg = (bs, int(rng.integers(0, 12)), int(rng.integers(0, 2)), int(rng.integers(0, 2)))
        q = rng.standard_normal((m, h, d)).astype(np.float32)
        k = rng.standard_normal((t, d)).astype(np.float32)
        fmt = ["bfloat16", "float8_e4m3fn", "float32"][i % 3]
        if i % 2 == 1 and fmt != "float8_e4m3fn":
            # Tiny keys against tiny queries: exponent sums below -112 (the
            # products near 2^-130, where the instruction would flush), the
            # float32 step's (fp8 keys cannot get there: only bfloat16).
            k[rng.random(t) < 0.3] *= np.float32(2.0**-64)
            q[: m // 2] *= np.float32(2.0**-66)
        if i % 4 in (1, 2):
            k[rng.integers(0, t)] = np.nan
            k[rng.random((t, d)) < 0.1] = -0.0
        qq = q.astype(ml_dtypes.bfloat16)
        if fmt == "float32":
            qq, kk = qq.astype(np.float32), k.astype(ml_dtypes.bfloat16).astype(np.float32)
        else:
            dtype = ml_dtypes.bfloat16 if fmt == "bfloat16" else ml_dtypes.float8_e4m3fn
            qq, kk = qq.view(np.uint16), k.astype(dtype).view(np.uint16 if fmt == "bfloat16" else np.uint8)
        pos = np.sort(rng.integers(0, t + 5, m))
        arrays.update(
            {f"q_{i}": qq, f"k_{i}": kk, f"pos_{i}": pos, f"cfg_{i}": np.array(cfg), f"fmt_{i}": np.array(fmt)}
        )
        kf = None if fmt == "float32" else fmt
        qf = None if fmt == "float32" else "bfloat16"
        args = (qq, kk, pos, ks.BlockSparseConfig(*cfg))
        expected[f"rows_{i}"] = ks.block_sparse_select(*args, key_format=kf, query_format=qf)
        expected[f"scores_{i}"] = ks.block_scores(*args, key_format=kf, query_format=qf)
    np.savez(tmp_path / "in.npz", **arrays)
    assert_child_equals(_PAIRS_CHILD, tmp_path, level, expected)
