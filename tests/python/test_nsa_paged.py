"""NSA's decode over an engine's paged cache of compressed keys (``nsa_select_paged``,
``nsa_block_scores_paged``): every sequence's row equals the dense call on its compressed
keys laid out densely (``nsa_select_compressed``), bit for bit, in every page format and
layout (shuffled, reversed and interleaved pages, fp8 with scales), at every SIMD level;
the twin agrees; refusals name their argument and change nothing."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from levels import assert_child_equals, require_simd

import kvselect as ks
from kvselect.reference import nsa as RN

SEED = 20261206
EQ9 = dict(window="eq9", kernel_size=32, kernel_stride=16)


def _n_c(n, bs, geo):
    if geo.get("window") == "eq9":
        kz, st = geo["kernel_size"], geo["kernel_stride"]
        return 0 if n < kz else (n - kz) // st + 1
    return n // bs


def _paged(flat, n_cs, page, rng, *, scales=None, order="shuffled", interleave=1):
    """Rows ``flat`` (each sequence's ``n_cs[s]`` compressed keys in turn, a row every KV
    head's key) in pages of ``page`` rows and the block table: pages handed out shuffled,
    in reverse, or in order; fp8 pages carry their float32 scales after the keys; with
    ``interleave > 1`` the block axis is a strided view (another layer's pages between,
    filled with 0xAB bytes / NaN)."""
    starts = np.r_[0, np.cumsum(n_cs)]
    need = [-(-n // page) for n in n_cs]
    n_pages = sum(need) + 2
    perm = {"shuffled": rng.permutation(n_pages), "reversed": np.arange(n_pages)[::-1]}.get(order, np.arange(n_pages))
    row_bytes = flat.shape[1] * flat.dtype.itemsize + (4 if scales is not None else 0)
    big = np.full((n_pages, interleave, page * row_bytes), 0xAB, np.uint8)
    pages = big[:, interleave - 1]
    table = np.zeros((len(n_cs), max(need, default=0) + 1), np.int32)  # vLLM pads with 0
    nxt = 0
    for s, n in enumerate(n_cs):
        for b in range(need[s]):
            p = int(perm[nxt])
            nxt += 1
            table[s, b] = p
            rows = flat[starts[s] + b * page : starts[s] + min(n, (b + 1) * page)]
            keys = np.zeros((page, flat.shape[1]), flat.dtype)
            keys[: len(rows)] = rows
            parts = [keys.reshape(-1).view(np.uint8)]
            if scales is not None:
                sc = np.zeros(page, np.float32)
                sc[: len(rows)] = scales[starts[s] + b * page : starts[s] + b * page + len(rows)]
                parts.append(sc.view(np.uint8))
            pages[p] = np.concatenate(parts)
    if scales is not None:
        return pages.reshape(n_pages, page, row_bytes), table
    cache = pages.view(flat.dtype).reshape(n_pages, page, flat.shape[1])
    assert interleave == 1 or (np.shares_memory(cache, big) and not cache.flags.c_contiguous)
    return cache, table


def _case(rng, fmt):
    """A batch: per-sequence compressed keys in ``fmt``, paged, with the dense arrays."""
    h, g = int(rng.choice([1, 2])), int(rng.choice([1, 2, 16]))
    d, bs = int(rng.integers(1, 20)), int(rng.choice([16, 32, 64]))
    geo = dict(EQ9) if rng.random() < 0.3 else {}
    if geo and bs % 16:
        geo = {}
    n_seqs = int(rng.integers(1, 5))
    # Sequences below one block and below Eq. 9's kernel (no key), and long ones.
    lens = [int(rng.choice([rng.integers(1, 40), rng.integers(40, 1500)])) for _ in range(n_seqs)]
    n_cs = [_n_c(n, bs, geo) for n in lens]
    ties = rng.random() < 0.25
    shape = (sum(n_cs), h, d)
    ck = (rng.integers(-2, 3, shape) if ties else rng.standard_normal(shape)).astype(np.float32)
    q = (rng.integers(-1, 2, (n_seqs, h * g, d)) if ties else rng.standard_normal((n_seqs, h * g, d))).astype(
        np.float32
    )
    scales, layout = None, "dense"
    if fmt == "fp8_scaled":
        ck = (ck * 40).clip(-448, 448).astype(ml_dtypes.float8_e4m3fn)
        scales = rng.uniform(0.01, 0.1, len(ck)).astype(np.float32)
        flat, layout = ck.reshape(len(ck), h * d).view(np.uint8), "fp8_scaled"
    else:
        ck = ck.astype({"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}[fmt])
        flat = ck.reshape(len(ck), h * d)
    page = int(rng.choice([1, 3, 16, 64]))
    order = str(rng.choice(["shuffled", "reversed", "in_order"]))
    cache, table = _paged(flat, n_cs, page, rng, scales=scales, order=order, interleave=int(rng.choice([1, 3])))
    kw = dict(block_size=bs, init_blocks=int(rng.integers(0, 2)), local_blocks=int(rng.integers(0, 3)), **geo)
    return q, ck, scales, lens, n_cs, cache, table, h, layout, kw


@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "float16", "fp8_scaled"])
def test_paged_decode_equals_dense_compressed_bit_for_bit(fmt):
    """Each sequence's decoding query over its compressed keys in pages (page sizes 1 to
    64, shuffled / reversed / in order, block axes interleaved with another layer's
    pages; GQA groups 1, 2, 16; fla's and Eq. 9's windows; sequences below a block and
    below the kernel; tied scores): the dense call's scores and rows bit for bit, NaN
    past the sequence's blocks, and the twin's paged rows equal its dense ones."""
    rng = np.random.default_rng(SEED + len(fmt))
    rows_checked = 0
    for _ in range(40):
        q, ck, scales, lens, n_cs, cache, table, h, layout, kw = _case(rng, fmt)
        n = int(rng.choice([1, 3, 16]))
        args = (q, cache, table, lens, h)
        got_s = ks.nsa_block_scores_paged(*args, page_layout=layout, **kw)
        got_r = ks.nsa_select_paged(*args, n, page_layout=layout, **kw)
        twin = RN.nsa_select_paged(*args, n, page_layout=layout, **kw)
        c0 = np.r_[0, np.cumsum(n_cs)]
        for s, ln in enumerate(lens):
            cs = slice(c0[s], c0[s + 1])
            sc = {} if scales is None else {"ck_scale": scales[cs]}
            want_s = ks.nsa_block_scores_compressed(q[s : s + 1], ck[cs], ln, **sc, **kw)
            nb = want_s.shape[2]
            assert np.array_equal(got_s[s : s + 1, :, :nb].view(np.uint32), want_s.view(np.uint32))
            assert np.isnan(got_s[s, :, nb:]).all()
            want_r = ks.nsa_select_compressed(q[s : s + 1], ck[cs], ln, n, **sc, **kw)
            assert np.array_equal(got_r[s : s + 1], want_r)
            dense_twin = RN.nsa_select_compressed(q[s : s + 1], ck[cs], ln, n, **sc, **kw)
            assert np.array_equal(twin[s : s + 1], dense_twin)
            rows_checked += h
    assert rows_checked > 60


def test_the_twin_agrees_within_the_bound():
    """Float32 compressed keys of real keys (``nsa_compress_keys``), paged: the core's
    rows equal the twin's but for swaps inside ``nsa_score_bound``, most exactly."""
    rng = np.random.default_rng(SEED + 1)
    rows_checked = exact = 0
    for _ in range(40):
        h, g, d, bs = 2, int(rng.choice([1, 16])), 16, int(rng.choice([16, 64]))
        lens = [int(x) for x in rng.integers(1, 1200, size=3)]
        ks_ = [rng.standard_normal((n, h, d)).astype(np.float32) for n in lens]
        cks = [ks.nsa_compress_keys(k, block_size=bs) for k in ks_]
        q = rng.standard_normal((3, h * g, d)).astype(np.float32)
        flat = np.concatenate([c.reshape(len(c), h * d) for c in cks])
        cache, table = _paged(flat, [len(c) for c in cks], 8, rng)
        n = int(rng.choice([1, 4, 16]))
        rows = ks.nsa_select_paged(q, cache, table, lens, h, n, block_size=bs)
        scores = RN.nsa_block_scores_paged(q, cache, table, lens, h, block_size=bs)
        twin = RN.nsa_select_paged(q, cache, table, lens, h, n, block_size=bs)
        for s, k in enumerate(ks_):
            nb = -(-lens[s] // bs)
            bound = RN.nsa_score_bound(q[s : s + 1], k, block_size=bs)
            ok = RN.nsa_rows_within_bound(rows[s : s + 1], scores[s : s + 1, :, :nb], bound, n)
            assert ok.all()
            rows_checked += ok.size
            exact += int((rows[s] == twin[s]).all(axis=-1).sum())
    assert rows_checked > 200 and exact >= 0.95 * rows_checked


def test_ties_go_to_the_lower_block():
    """Every compressed key equal: every candidate ties, so a row is the forced blocks
    and then the lowest ids — paged, dense and twin alike."""
    h, d, bs = 1, 4, 16
    lens = [16 * 20 + 5]
    ck = np.ones((20, h, d), np.float32)
    q = np.ones((1, 16, d), np.float32)
    cache, table = _paged(ck.reshape(20, -1), [20], 3, np.random.default_rng(SEED + 2))
    rows = ks.nsa_select_paged(q, cache, table, lens, h, 6, block_size=bs)
    assert rows[0, 0].tolist() == [0, 1, 2, 3, 19, 20]
    assert np.array_equal(rows, ks.nsa_select_compressed(q, ck, lens[0], 6, block_size=bs))
    assert np.array_equal(rows, RN.nsa_select_paged(q, cache, table, lens, h, 6, block_size=bs))


_CHILD = """
import sys, numpy as np, kvselect as ks
src = np.load(sys.argv[1])
out = {}
for i in range(int(src["n"])):
    q, cache, table, lens = src[f"q{i}"], src[f"cache{i}"], src[f"table{i}"], src[f"lens{i}"]
    h, layout = int(src[f"h{i}"]), str(src[f"layout{i}"])
    kw = dict(window="eq9") if i % 2 else {}
    out[f"s{i}"] = ks.nsa_block_scores_paged(q, cache, table, lens, h, page_layout=layout, **kw)
    out[f"r{i}"] = ks.nsa_select_paged(q, cache, table, lens, h, 6, page_layout=layout, **kw)
np.savez(sys.argv[2], **out)
"""


@pytest.mark.parametrize("level", ["scalar", "avx2"])
def test_every_simd_level_gives_the_same_bits(tmp_path, level):
    """A child at ``KVSELECT_SIMD=level`` returns this process's bits (best level): float32
    and fp8-scaled pages, fla's and Eq. 9's windows, groups 1 and 16, one batch past the
    parallel threshold (32 heads, ``d = 128``, 8,000 tokens)."""
    require_simd()
    rng = np.random.default_rng(SEED + 3)
    arrays, expected = {"n": np.array(6)}, {}
    for i in range(6):
        h, hq, d = (2, 32, 128) if i == 0 else (2, 2 * int(rng.choice([1, 16])), 16)
        lens = [8000, 70, 5] if i == 0 else [int(x) for x in rng.integers(1, 900, size=3)]
        kw = dict(window="eq9") if i % 2 else {}
        n_cs = [_n_c(n, 64, dict(EQ9) if kw else {}) for n in lens]
        ck = rng.standard_normal((sum(n_cs), h * d)).astype(np.float32)
        q = rng.standard_normal((3, hq, d)).astype(np.float32)
        layout, scales = "dense", None
        if i % 3 == 2:
            layout, scales = "fp8_scaled", rng.uniform(0.01, 0.1, len(ck)).astype(np.float32)
            ck = (ck * 40).clip(-448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
        cache, table = _paged(ck, n_cs, 16, rng, scales=scales)
        arrays.update({f"q{i}": q, f"cache{i}": cache, f"table{i}": table, f"lens{i}": np.array(lens)})
        arrays.update({f"h{i}": np.array(h), f"layout{i}": np.array(layout)})
        expected[f"s{i}"] = ks.nsa_block_scores_paged(q, cache, table, lens, h, page_layout=layout, **kw)
        expected[f"r{i}"] = ks.nsa_select_paged(q, cache, table, lens, h, 6, page_layout=layout, **kw)
    np.savez(tmp_path / "in.npz", **arrays)
    assert_child_equals(_CHILD, tmp_path, level, expected, timeout=600)


def _args():
    return dict(
        q=np.ones((1, 4, 8), np.float32),
        cache=np.arange(4 * 8 * 16, dtype=np.float32).reshape(4, 8, 16),
        table=np.array([[2, 1, 3]], np.int32),
        lens=[1100],  # 17 compressed keys of 64 tokens: 3 pages of 8
        h=2,
        kw={},
    )


@pytest.mark.parametrize(
    "change, argument",
    [
        (dict(table=np.array([[2, 1]], np.int32)), "block_table"),  # a row too short
        (dict(table=np.array([[2, 1, 4]], np.int32)), "block_table"),  # past the cache
        (dict(table=np.array([[2, -1, 3]], np.int32)), "block_table"),
        (dict(table=np.array([[2, 1, 3], [0, 0, 0]], np.int32)), "block_table"),  # not one row a sequence
        (dict(lens=[0]), "seq_lens"),
        (dict(lens=[-1]), "seq_lens"),
        (dict(lens=[2**31]), "seq_lens"),  # past an int32 position
        (dict(lens=[2**40]), "seq_lens"),  # its block scores' row not allocated first
        (dict(h=3), "n_kv_heads"),
        (dict(h=0), "n_kv_heads"),
        (dict(q=np.zeros((2, 4, 8), np.float32)), "q"),  # not one query a sequence
        (dict(q=np.zeros((1, 3, 8), np.float32)), "q"),  # heads not a multiple of the KV heads
        (dict(q=np.zeros((1, 4, 4), np.float32)), "q"),  # another d
        (dict(cache=np.zeros((4, 8, 15), np.float32)), "n_kv_heads"),
        (dict(cache=np.zeros((4, 8), np.float32)), "kv_cache"),
        (dict(kw=dict(block_counts=0)), "block_counts"),
        (dict(kw=dict(block_size=0)), "block_size"),
        (dict(kw=dict(scale=float("nan"))), "scale"),
        (dict(kw=dict(window="eq8")), "window"),
        (dict(kw=dict(window="eq9", kernel_stride=24)), "kernel_stride"),
        (dict(kw=dict(window="eq9", kernel_size=24)), "kernel_size"),
        (dict(kw=dict(page_layout="fp9")), "page_layout"),
    ],
)
def test_refusals_name_the_argument_and_change_nothing(change, argument):
    """Both entry points and the twin refuse naming the argument (a SelectionError, a
    ValueError in the twin) and leave every input byte-identical."""
    args = _args()
    args.update(change)
    before = {n: np.array(v, copy=True) for n, v in args.items() if isinstance(v, np.ndarray)}
    kw = dict(args["kw"])
    counts = kw.pop("block_counts", 3)
    pos = (args["q"], args["cache"], args["table"], args["lens"], args["h"])
    calls = [
        lambda m: m.nsa_select_paged(*pos, counts, **kw),
        lambda m: m.nsa_block_scores_paged(*pos, **kw),
    ]
    if argument == "block_counts":
        calls = calls[:1]
    for call in calls:
        with pytest.raises(ks.SelectionError, match=argument) as e:
            call(ks)
        assert e.value.argument == argument
        with pytest.raises(ValueError) as t:
            call(RN)
        assert getattr(t.value, "argument", None) == argument, t.value
    for name, v in before.items():
        assert np.array_equal(args[name], v), name


def test_fp8_scaled_pages_of_another_dtype_are_a_type_error():
    """``page_layout='fp8_scaled'`` takes uint8 pages: float32 ones are a TypeError,
    natively and in the twin."""
    a = _args()
    for m in (ks, RN):
        with pytest.raises(TypeError, match="uint8"):
            m.nsa_select_paged(a["q"], a["cache"], a["table"], a["lens"], a["h"], 3, page_layout="fp8_scaled")


def test_twins_keep_a_nan_score_as_a_candidate():
    """A NaN block score (an infinite compressed key: the softmax's ``inf - inf``) is a
    candidate after every number, in the core and in ``reference.nsa.nsa_select``; the
    compressed, packed and paged twins ranked only the NaN they pad with as nothing, and
    dropped these too (head 0's rows held only its forced blocks 0, 11, 12)."""
    rng = np.random.default_rng(SEED)
    ck = rng.standard_normal((12, 2, 8)).astype(np.float32)  # 800 tokens, 13 blocks of 64
    ck[5, 0, 0] = np.inf  # KV head 0's scores NaN, head 1's finite
    q = np.abs(rng.standard_normal((1, 4, 8))).astype(np.float32)
    assert np.isnan(ks.nsa_block_scores_compressed(q, ck, 800)[0, 0, 1:11]).all()
    rows = ks.nsa_select_compressed(q, ck, 800, 6)
    assert rows[0, 0].tolist() == [0, 1, 2, 3, 11, 12]  # forced, then NaN blocks by id
    with np.errstate(invalid="ignore"):
        assert np.array_equal(RN.nsa_select_compressed(q, ck, 800, 6), rows)
        # Packed beside a shorter sequence (its rows padded with NaN past its 2 blocks).
        q2, ck2 = np.concatenate([q, q]), np.concatenate([ck, ck[:1]])
        packed = dict(cu_seqlens_q=[0, 1, 2], cu_seqlens_k=[0, 12, 13])
        got = ks.nsa_select_compressed(q2, ck2, [800, 100], 6, **packed)
        assert np.array_equal(got[:1], rows) and got[1, :, 2:].tolist() == [[-1] * 4] * 2
        assert np.array_equal(RN.nsa_select_compressed(q2, ck2, [800, 100], 6, **packed), got)
        cache = ck.reshape(3, 4, 16)[::-1]
        table = np.array([[2, 1, 0]], dtype=np.int32)
        assert np.array_equal(ks.nsa_select_paged(q, cache, table, [800], 2, 6), rows)
        assert np.array_equal(RN.nsa_select_paged(q, cache, table, [800], 2, 6), rows)
