"""MoBA's block selection: the source's rule on pinned examples, the core
against its NumPy twin on random and adversarial cases (ties, fewer blocks
than topk, the first block, Tq != Tkv, GQA groups of 1 and 16, bfloat16 and
fp8 keys, packed and paged), every SIMD level's bits, and the refusals."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from levels import assert_child_equals, require_simd

import kvselect as ks
import kvselect.reference as ref
from kvselect.reference import moba as rmoba

SEED = 4545


def test_the_source_rule_on_a_hand_made_sequence():
    # 8 keys of d = 1, blocks of 2: block means 1, 5, -2, 3.
    k = np.array([0, 2, 4, 6, -3, -1, 3, 3], np.float32).reshape(8, 1, 1)
    one = np.ones((1, 1, 1), np.float32)
    assert ks.moba_gates(one, k, 2)[0, 0, :3].tolist() == [1.0, 5.0, -2.0]
    assert ks.moba_select(one, k, 2, 2).tolist() == [[[1, 3]]]
    assert ks.moba_select(one, k, 3, 2).tolist() == [[[0, 1, 3]]]
    assert ks.moba_select(-one, k, 3, 2).tolist() == [[[0, 2, 3]]]
    # More slots than past blocks: all of them, then -1.
    assert ks.moba_select(one, k, 6, 2).tolist() == [[[0, 1, 2, 3, -1, -1]]]
    # topk = 1: the efficient code's full causal fallback, the naive code's own block.
    assert ks.moba_select(one, k, 1, 2).tolist() == [[[0, 1, 2, 3]]]
    assert ks.moba_select(one, k, 1, 2, variant="naive").tolist() == [[[3]]]


def test_a_block_is_gated_only_once_complete_and_the_current_block_is_forced():
    # Queries at every position (Tq = Tkv), topk 2, q = -1: a query in block c
    # reads the least-mean block before c, and c itself, whatever c's mean.
    k = np.array([0, 2, 4, 6, -3, -1, 3, 3], np.float32).reshape(8, 1, 1)
    rows = ks.moba_select(-np.ones((8, 1, 1), np.float32), k, 2, 2)[:, 0].tolist()
    assert rows == [[0, -1], [0, -1], [0, 1], [0, 1], [0, 2], [0, 2], [2, 3], [2, 3]]


def _case(rng, *, hq=None, h=None, integer=False, ties=False):
    h = h or int(rng.choice([1, 2]))
    hq = hq or h * int(rng.choice([1, 2, 4, 16]))
    d = int(rng.integers(1, 40))
    bs = int(rng.integers(1, 9))
    n_k = int(rng.integers(1, 60))
    n_q = int(rng.integers(0, n_k + 1)) if rng.random() < 0.5 else n_k
    if integer:
        k = rng.integers(-3, 4, size=(n_k, h, d)).astype(np.float32)
        q = rng.integers(-2, 3, size=(n_q, hq, d)).astype(np.float32)
    else:
        k = rng.standard_normal((n_k, h, d)).astype(np.float32)
        q = rng.standard_normal((n_q, hq, d)).astype(np.float32)
    if ties and n_k >= 2 * bs:
        # Copy whole blocks over others: equal means, equal gates bit for bit.
        nb = n_k // bs
        src = int(rng.integers(0, nb))
        for b in rng.choice(nb, size=min(nb, 3), replace=False):
            k[b * bs : (b + 1) * bs] = k[src * bs : (src + 1) * bs]
    topk = int(rng.integers(1, 8))
    return q, k, topk, bs


def _explained(got, want, q, k, topk, bs, variant, key_scale=None, key_format=None):
    """Rows that differ from the twin's must differ only among blocks whose exact
    gates lie within the native error bound of each other; returns the count."""
    gates = rmoba.moba_gates(q, k, bs, key_scale=key_scale, key_format=key_format)
    mags = rmoba.gate_magnitudes(q, k, bs, key_scale=key_scale, key_format=key_format)
    err = rmoba.gate_error_bound(q.shape[2], bs) * mags * (1 + 1e-9) + 1e-35
    n_k, n_q = len(k), len(q)
    diff = np.argwhere(np.any(got != want, axis=2))
    for i, h in diff:
        c = (n_k - n_q + i) // bs
        g, e = gates[i, h, :c], err[i, h, :c]
        row = [x for x in got[i, h].tolist() if x >= 0]
        assert c in row and row == sorted(set(row))
        past = [x for x in row if x != c]
        assert len(past) == rmoba.past_blocks_read(variant, topk, c)
        out = sorted(set(range(c)) - set(past))
        for a in past:
            for b in out:
                assert g[b] - g[a] <= e[a] + e[b], (i, h, a, b, g[a], g[b])
    return len(diff)


def test_the_core_equals_its_twin_on_random_and_adversarial_cases():
    rng = np.random.default_rng(SEED)
    n_rows = n_tied = 0
    for i in range(1500):
        kind = i % 5
        q, k, topk, bs = _case(
            rng, integer=kind == 1, ties=kind == 2, hq=16 if kind == 3 else None, h=1 if kind == 3 else None
        )
        variant = "naive" if i % 7 == 0 else "efficient"
        got = ks.moba_select(q, k, topk, bs, variant=variant)
        want = ref.moba_select(q, k, topk, bs, variant=variant)
        assert got.shape == want.shape
        if kind == 1 and bs & (bs - 1) == 0:
            # Small integers over a power-of-two block: every mean and gate is exact in
            # float32, so exact ties go to the lower id, as the twin's.
            np.testing.assert_array_equal(got, want)
        n_tied += _explained(got, want, q, k, topk, bs, variant)
        n_rows += got.shape[0] * got.shape[1]
    assert n_rows > 50_000
    assert n_tied < n_rows * 1e-3


def test_copied_blocks_tie_exactly_and_go_to_the_lower_id():
    rng = np.random.default_rng(SEED + 1)
    for _ in range(200):
        bs, d = int(rng.integers(1, 6)), int(rng.integers(1, 20))
        block = rng.standard_normal((bs, 1, d)).astype(np.float32)
        other = rng.standard_normal((bs, 1, d)).astype(np.float32) - 5
        # Blocks: other, block, block, other, block, then the query's block.
        k = np.concatenate([other, block, block, other, block, block[:1]])
        q = np.abs(rng.standard_normal((1, 1, d))).astype(np.float32) * np.sign(block.sum(0))[None]
        q = np.where(q == 0, 1, q).astype(np.float32)
        g = ks.moba_gates(q, k, bs)[0, 0]
        assert g[1] == g[2] == g[4]
        got = ks.moba_select(q, k, 3, bs)[0, 0].tolist()
        if g[1] > max(g[0], g[3]):
            assert got == [1, 2, 5]


@pytest.mark.parametrize("topk", [2, 3, 4, 9, 12])
def test_small_topk_with_ties_and_nan_gates_equals_the_twin_exactly(topk):
    # Small integer keys and queries over power-of-two blocks: every mean and gate is
    # exact in float32 and float64, so the rows must equal the twin's bit for bit, ties
    # (many: gates are small integers) to the lower id and NaN gates (a NaN key in a
    # block) last. topk 2 and 3 take the row's pass-per-slot path, 4 and 9 its
    # insertion path, 12 its selection path; a query sees up to 64 past blocks.
    rng = np.random.default_rng(SEED + 9 + topk)
    n_nan = n_rows = n_tied = 0
    for _ in range(60):
        h = int(rng.choice([1, 2]))
        hq = h * int(rng.choice([1, 4]))
        d, bs = int(rng.integers(1, 6)), int(rng.choice([1, 2, 4, 8]))
        n_k = int(rng.integers(bs, 65 * bs))
        k = rng.integers(-3, 4, size=(n_k, h, d)).astype(np.float32)
        q = rng.integers(-2, 3, size=(n_k, hq, d)).astype(np.float32)
        for t in rng.choice(n_k, size=int(rng.integers(0, 4)), replace=False):
            k[t, int(rng.integers(0, h)), int(rng.integers(0, d))] = np.nan
        got = ks.moba_select(q, k, topk, bs)
        want = ref.moba_select(q, k, topk, bs)
        np.testing.assert_array_equal(got, want)
        gates = ks.moba_gates(q, k, bs)
        for i in range(n_k):
            c = i // bs
            g = gates[i, :, :c]
            n_nan += int(np.isnan(g).any())
            finite = np.sort(g[~np.isnan(g)])
            n_tied += int(np.any(finite[1:] == finite[:-1]))
        n_rows += got.shape[0] * got.shape[1]
    # The cases are the ones meant: many rows, rows with NaN gates and with ties.
    assert n_rows > 10_000 and n_nan > 1000 and n_tied > 3000


def test_queries_fewer_than_keys_gqa_and_the_first_block():
    rng = np.random.default_rng(SEED + 2)
    for hq, h in [(1, 1), (16, 1), (16, 2), (4, 4)]:
        for n_q in [0, 1, 3, 17]:
            k = rng.standard_normal((40, h, 8)).astype(np.float32)
            q = rng.standard_normal((n_q, hq, 8)).astype(np.float32)
            got = ks.moba_select(q, k, 3, 5)
            want = ref.moba_select(q, k, 3, 5)
            _explained(got, want, q, k, 3, 5, "efficient")
            # The last query's gates equal the same query over all its keys alone.
            if n_q:
                solo = ks.moba_gates(q[-1:], k, 5)
                assert np.array_equal(ks.moba_gates(q, k, 5)[-1:], solo, equal_nan=True)
    # A query in the first block reads it alone (nothing to gate), at any topk.
    k = rng.standard_normal((3, 1, 4)).astype(np.float32)
    for topk in (1, 2, 9):
        rows = ks.moba_select(rng.standard_normal((3, 1, 4)).astype(np.float32), k, topk, 4)
        assert rows[:, 0, 0].tolist() == [0, 0, 0] and np.all(rows[:, 0, 1:] == -1)


@pytest.mark.parametrize("fmt", ["bfloat16", "float16", "fp8_scaled"])
def test_low_precision_keys_are_read_in_place_as_their_values(fmt):
    rng = np.random.default_rng(SEED + 3)
    for _ in range(100):
        q, k, topk, bs = _case(rng)
        scale = None
        if fmt == "bfloat16":
            kl = k.astype(ml_dtypes.bfloat16)
            kf = kl.astype(np.float32)
        elif fmt == "float16":
            kl = k.astype(np.float16)
            kf = kl.astype(np.float32)
        else:
            kl = (k * 50).clip(-448, 448).astype(ml_dtypes.float8_e4m3fn)
            scale = rng.uniform(0.001, 0.05, len(k)).astype(np.float32)
            kf = kl.astype(np.float32) * scale[:, None, None]
        got = ks.moba_select(q, kl, topk, bs, key_scale=scale)
        assert np.array_equal(got, ks.moba_select(q, kf, topk, bs))
        assert np.array_equal(ks.moba_gates(q, kl, bs, key_scale=scale), ks.moba_gates(q, kf, bs), equal_nan=True)
        want = ref.moba_select(q, kl, topk, bs, key_scale=scale)
        _explained(got, want, q, kl, topk, bs, "efficient", key_scale=scale)


def test_packed_equals_each_sequence_alone():
    rng = np.random.default_rng(SEED + 4)
    for _ in range(60):
        lens = rng.integers(0, 30, size=int(rng.integers(1, 5)))
        qlens = [int(rng.integers(0, n + 1)) for n in lens]
        h, hq, d, bs, topk = 2, 4, 7, int(rng.integers(1, 6)), int(rng.integers(1, 5))
        k = rng.standard_normal((int(lens.sum()), h, d)).astype(np.float32)
        q = rng.standard_normal((sum(qlens), hq, d)).astype(np.float32)
        cu, cq = np.r_[0, np.cumsum(lens)], np.r_[0, np.cumsum(qlens)]
        for variant in ("efficient", "naive"):
            got = ks.moba_select(q, k, topk, bs, cu_seqlens=cu, cu_seqlens_q=cq, variant=variant)
            want = ref.moba_select(q, k, topk, bs, cu_seqlens=cu, cu_seqlens_q=cq, variant=variant)
            assert got.shape == want.shape
            for s in range(len(lens)):
                alone = ks.moba_select(q[cq[s] : cq[s + 1]], k[cu[s] : cu[s + 1]], topk, bs, variant=variant)
                w = alone.shape[2]
                assert np.array_equal(got[cq[s] : cq[s + 1], :, :w], alone)
                assert np.all(got[cq[s] : cq[s + 1], :, w:] == -1)
                sl = slice(cq[s], cq[s + 1])
                _explained(got[sl, :, :w], want[sl, :, :w], q[sl], k[cu[s] : cu[s + 1]], topk, bs, variant)


def _paged(keys, lens, page, rng, scales=None):
    """A shuffled paged cache of each sequence's keys, its block table; with
    ``scales``, vLLM's fp8 page (the page's key bytes, then its float32 scales)."""
    n_pages = sum(-(-n // page) for n in lens)
    cache = np.zeros((n_pages, page) + keys.shape[1:], keys.dtype)
    sc = np.zeros((n_pages, page), np.float32)
    table = np.zeros((len(lens), max(-(-n // page) for n in lens)), np.int32)
    ids = rng.permutation(n_pages)
    at, cursor = 0, 0
    for s, n in enumerate(lens):
        for b in range(-(-n // page)):
            p = int(ids[cursor])
            cursor += 1
            table[s, b] = p
            rows = keys[at + b * page : at + min(n, (b + 1) * page)]
            cache[p, : len(rows)] = rows
            if scales is not None:
                sc[p, : len(rows)] = scales[at + b * page : at + min(n, (b + 1) * page)]
        at += n
    if scales is not None:
        flat = np.concatenate([cache.reshape(n_pages, -1), sc.view(np.uint8).reshape(n_pages, -1)], axis=1)
        return flat.reshape(n_pages, page, -1), table
    return cache, table


@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "fp8_scaled"])
def test_paged_decode_equals_dense(fmt):
    rng = np.random.default_rng(SEED + 5)
    for _ in range(40):
        lens = [int(x) for x in rng.integers(1, 50, size=int(rng.integers(1, 4)))]
        h, hq, d, bs, page, topk = 2, 4, 8, int(rng.integers(1, 7)), int(rng.choice([4, 16])), int(rng.integers(1, 5))
        k = rng.standard_normal((sum(lens), h, d)).astype(np.float32)
        q = rng.standard_normal((len(lens), hq, d)).astype(np.float32)
        scale = None
        if fmt == "bfloat16":
            k = k.astype(ml_dtypes.bfloat16)
            flat = k.reshape(len(k), h * d)
            layout = "dense"
        elif fmt == "fp8_scaled":
            k8 = (k * 40).clip(-448, 448).astype(ml_dtypes.float8_e4m3fn)
            scale = rng.uniform(0.01, 0.1, len(k)).astype(np.float32)
            flat = k8.reshape(len(k), -1).view(np.uint8)
            k, layout = k8, "fp8_scaled"
        else:
            flat, layout = k.reshape(len(k), h * d), "dense"
        cache, table = _paged(flat, lens, page, rng, scale)
        got = ks.moba_select_paged(q, cache, table, lens, h, topk, bs, page_layout=layout)
        cu = np.r_[0, np.cumsum(lens)]
        dense = ks.moba_select(q, k, topk, bs, key_scale=scale, cu_seqlens=cu, cu_seqlens_q=np.arange(len(lens) + 1))
        assert np.array_equal(got, dense)
        twin = ref.moba_select_paged(q, cache, table, lens, h, topk, bs, page_layout=layout)
        want = ref.moba_select(q, k, topk, bs, key_scale=scale, cu_seqlens=cu, cu_seqlens_q=np.arange(len(lens) + 1))
        assert np.array_equal(twin, want)


_CHILD = """
import sys, numpy as np, kvselect as ks
src = np.load(sys.argv[1])
out = {}
for i in range(int(src["n"])):
    q, k, t, b = src[f"q{i}"], src[f"k{i}"], int(src[f"t{i}"]), int(src[f"b{i}"])
    out[f"g{i}"] = ks.moba_gates(q, k, b)
    out[f"r{i}"] = ks.moba_select(q, k, t, b)
np.savez(sys.argv[2], **out)
"""


@pytest.mark.parametrize("level", ["scalar", "avx2"])
def test_every_simd_level_gives_the_same_bits(tmp_path, level):
    require_simd()
    rng = np.random.default_rng(SEED + 6)
    arrays, expected = {"n": np.array(40)}, {}
    for i in range(40):
        q, k, topk, bs = _case(rng, ties=i % 2 == 0)
        if i % 5 == 0:  # past the parallel threshold
            k = rng.standard_normal((600, 2, 64)).astype(np.float32)
            q = rng.standard_normal((300, 8, 64)).astype(np.float32)
            topk, bs = 5, 16
        arrays.update({f"q{i}": q, f"k{i}": k, f"t{i}": np.array(topk), f"b{i}": np.array(bs)})
        expected[f"g{i}"] = ks.moba_gates(q, k, bs)
        expected[f"r{i}"] = ks.moba_select(q, k, topk, bs)
    np.savez(tmp_path / "in.npz", **arrays)
    assert_child_equals(_CHILD, tmp_path, level, expected)


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        ({"topk": 0}, "topk"),
        ({"block_size": 0}, "block_size"),
        ({"variant": "fast"}, "variant"),
        ({"cu_seqlens": [0, 5]}, "cu_seqlens"),
        ({"cu_seqlens_q": [0, 9]}, "cu_seqlens_q"),
        ({"key_scale": np.ones(3, np.float32)}, "key_scale"),
        ({"q": np.zeros((2, 3, 4), np.float32)}, "q"),
        ({"q": np.zeros((2, 2, 5), np.float32)}, "q"),
        ({"k": np.zeros((8, 4), np.float32)}, "k"),
    ],
)
def test_refusals_name_the_argument_and_change_nothing(kwargs, argument):
    args = {
        "q": np.ones((2, 2, 4), np.float32),
        "k": np.ones((8, 2, 4), np.float32),
        "topk": 2,
        "block_size": 2,
    }
    args.update(kwargs)
    before = {n: np.array(v, copy=True) for n, v in args.items() if isinstance(v, np.ndarray)}
    with pytest.raises(ValueError, match=argument) as e:
        ks.moba_select(args.pop("q"), args.pop("k"), args.pop("topk"), args.pop("block_size"), **args)
    assert e.value.argument == argument
    for n, v in before.items():
        arr = kwargs.get(n, None)
        if isinstance(arr, np.ndarray):
            assert np.array_equal(arr, v)


def test_paged_refusals_name_the_argument():
    cache = np.zeros((2, 4, 8), np.float32)
    q = np.zeros((1, 2, 4), np.float32)
    with pytest.raises(ValueError, match="block_table"):
        ks.moba_select_paged(q, cache, np.array([[0, 5]], np.int32), [8], 2, 2, 2)
    with pytest.raises(ValueError, match="seq_lens"):
        ks.moba_select_paged(q, cache, np.array([[0, 1]], np.int32), [0], 2, 2, 2)
    # The twin refuses as natively (it read a negative entry from the end, and raised
    # IndexError / a bare ValueError for the rest).
    cases = [([[-1, 0]], [8], "block_table"), ([[0, 2]], [8], "block_table"), ([[0, 1]], [9], "block_table")]
    cases += [([[0, 1]], [0], "seq_lens"), ([[0, 1]], [2**31], "seq_lens")]
    for table, lens, argument in cases:
        for m in (ks, rmoba):
            with pytest.raises(ValueError) as e:
                m.moba_select_paged(q, cache, np.array(table, np.int32), lens, 2, 2, 2)
            assert getattr(e.value, "argument", None) == argument, (m, table, lens, e.value)
    # Past an int32 position, at the efficient code's topk = 1 (a row as wide as the
    # blocks): refused naming seq_lens, no row of 2**39 blocks allocated first.
    for length in (2**31, 2**40):
        with pytest.raises(ks.SelectionError, match="seq_lens") as e:
            ks.moba_select_paged(q, cache, np.array([[0, 1]], np.int32), [length], 2, 1, 2)
        assert e.value.argument == "seq_lens"
    with pytest.raises(ValueError, match="n_kv_heads"):
        ks.moba_select_paged(q, cache, np.array([[0, 1]], np.int32), [8], 3, 2, 2)
