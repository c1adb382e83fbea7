"""InfLLM-v2's and NSA's packed (varlen) forms and InfLLM-v2's paged decode: every
sequence's rows equal the dense call's on that sequence (bit for bit), the twins agree
within the core's bound, every SIMD level gives the same bits, and the refusals name
their argument and change nothing."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from levels import assert_child_equals, require_simd

import kvselect as ks
from kvselect.reference import infllm as RI
from kvselect.reference import nsa as RN

SEED = 20261205


def _infllm_batch(rng, geometry=True):
    """A packed batch: ``q [total_q, hq, d]``, ``ck [total_c, h, d]``, per-sequence
    tokens and both boundary arrays, and the settings."""
    h, g = int(rng.choice([1, 2])), int(rng.choice([1, 2, 16]))
    d = int(rng.integers(1, 20))
    geo = {}
    if geometry and rng.random() < 0.3:
        b, kz, st = [(32, 16, 8), (16, 8, 4), (4, 2, 1), (6, 5, 3)][int(rng.integers(0, 4))]
        geo = dict(block_size=b, kernel_size=kz, kernel_stride=st)
    kz, st = geo.get("kernel_size", 32), geo.get("kernel_stride", 16)
    n_seqs = int(rng.integers(1, 5))
    lens = [int(rng.choice([rng.integers(1, 40), rng.integers(1, 700)])) for _ in range(n_seqs)]
    n_qs = [int(rng.integers(0, min(n, 4) + 1)) for n in lens]
    n_cs = [RI.compressed_len(n, kz, st) for n in lens]
    ties = rng.random() < 0.3
    ck = rng.integers(-2, 3, (sum(n_cs), h, d)) if ties else rng.standard_normal((sum(n_cs), h, d))
    q = rng.integers(-1, 2, (sum(n_qs), h * g, d)) if ties else rng.standard_normal((sum(n_qs), h * g, d))
    settings = dict(
        init_blocks=int(rng.integers(0, 3)),
        local_blocks=int(rng.integers(0, 4)),
        pooling=str(rng.choice(["cuda", "triton"])),
        **geo,
    )
    cu_q, cu_k = np.r_[0, np.cumsum(n_qs)], np.r_[0, np.cumsum(n_cs)]
    return q.astype(np.float32), ck.astype(np.float32), lens, cu_q, cu_k, settings


def test_infllm_packed_equals_each_sequence_alone_and_the_twin():
    """Thousands of rows over random batches (sequences with no query, below 32 tokens,
    decode and prefill, every variant and geometry): each sequence's packed rows and
    block scores are the dense call's bit for bit; the twin's packed rows agree within
    the core's bound, sequence by sequence."""
    rng = np.random.default_rng(SEED)
    rows_checked = 0
    for _ in range(300):
        q, ck, lens, cu_q, cu_k, st = _infllm_batch(rng)
        topk, keep = int(rng.choice([1, 3, 8, 40])), str(rng.choice(["through_current", "before_current"]))
        packed = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
        rows = ks.infllm_select(q, ck, lens, topk, keep=keep, **st, **packed)
        scores = ks.infllm_block_scores(q, ck, lens, **st, **packed)
        twin = RI.infllm_select(q, ck, lens, topk, keep=keep, **st, **packed)
        twin_scores = RI.infllm_block_scores(q, ck, lens, **st, **packed)
        assert rows.shape == (len(q), ck.shape[1], topk)
        assert scores.shape == (len(q), ck.shape[1], max(RI.n_blocks(n, st.get("block_size", 64)) for n in lens))
        geo = {k: v for k, v in st.items() if k in ("kernel_size", "kernel_stride")}
        for s, n in enumerate(lens):
            qs, cs = slice(cu_q[s], cu_q[s + 1]), slice(cu_k[s], cu_k[s + 1])
            if cu_q[s + 1] == cu_q[s]:
                continue
            dense = ks.infllm_select(q[qs], ck[cs], n, topk, keep=keep, **st)
            assert np.array_equal(rows[qs], dense)
            nb = RI.n_blocks(n, st.get("block_size", 64))
            ds = ks.infllm_block_scores(q[qs], ck[cs], n, **st)
            assert np.array_equal(scores[qs, :, :nb].view(np.uint32), ds.view(np.uint32))
            assert np.isnan(scores[qs, :, nb:]).all() and np.isnan(twin_scores[qs, :, nb:]).all()
            bound = RI.score_bound(q[qs], ck[cs], n, **geo)
            exact = twin_scores[qs, :, :nb]
            ok = RI.rows_within_bound(rows[qs], exact, bound, n, topk, keep, st.get("block_size", 64))
            assert ok.all(), (s, n, st)
            rows_checked += ok.size
            want = RI.infllm_select(q[qs], ck[cs], n, topk, keep=keep, **st)
            assert np.array_equal(twin[qs], want)
    assert rows_checked > 1000


def test_infllm_packed_fp8_and_bf16_keys():
    """fp8 compressed keys with per-key scales (each sequence's slice of ``ck_scale``) and
    bfloat16 keys, read in place: packed equals dense per sequence."""
    rng = np.random.default_rng(SEED + 1)
    for i in range(60):
        q, ck, lens, cu_q, cu_k, st = _infllm_batch(rng, geometry=False)
        extra = {}
        if i % 2:
            ck = ck.astype(ml_dtypes.float8_e4m3fn)
            extra["ck_scale"] = rng.uniform(0.25, 2.0, len(ck)).astype(np.float32)
        else:
            ck, q = ck.astype(ml_dtypes.bfloat16), q.astype(ml_dtypes.bfloat16)
        rows = ks.infllm_select(q, ck, lens, 4, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, **st, **extra)
        for s, n in enumerate(lens):
            qs, cs = slice(cu_q[s], cu_q[s + 1]), slice(cu_k[s], cu_k[s + 1])
            if cu_q[s + 1] > cu_q[s]:
                sc = {"ck_scale": extra["ck_scale"][cs]} if extra else {}
                assert np.array_equal(rows[qs], ks.infllm_select(q[qs], ck[cs], n, 4, **st, **sc))


def _paged(flat, lens, page, rng, scales=None):
    """Rows ``flat`` (each sequence's ``lens[s]`` rows in turn) in shuffled pages of
    ``page`` rows, and the block table; fp8 pages carry their scales after the keys."""
    starts = np.r_[0, np.cumsum(lens)]
    n_pages = sum(-(-n // page) for n in lens) + 2
    order = rng.permutation(n_pages)
    cache = np.zeros((n_pages, page) + flat.shape[1:], flat.dtype)
    sc = np.zeros((n_pages, page), np.float32)
    width = max(1, max(-(-n // page) for n in lens))
    table = np.zeros((len(lens), width + 1), np.int32)
    nxt = 0
    for s, n in enumerate(lens):
        for b in range(-(-n // page)):
            p = int(order[nxt])
            nxt += 1
            table[s, b] = p
            rows = flat[starts[s] + b * page : starts[s] + min(n, (b + 1) * page)]
            cache[p, : len(rows)] = rows
            if scales is not None:
                sc[p, : len(rows)] = scales[starts[s] + b * page : starts[s] + b * page + len(rows)]
    if scales is not None:
        flat8 = np.concatenate([cache.reshape(n_pages, -1), sc.view(np.uint8).reshape(n_pages, -1)], axis=1)
        return flat8.reshape(n_pages, page, -1), table
    return cache, table


@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "float16", "fp8_scaled"])
def test_infllm_paged_decode_equals_dense(fmt):
    """Each sequence's decoding query over its compressed keys in shuffled pages (page
    sizes 1 to 16, sequences below 32 tokens with no key): the dense call's row bit for
    bit, and the twin's paged rows equal the twin's dense ones."""
    rng = np.random.default_rng(SEED + 2 + len(fmt))
    for _ in range(30):
        lens = [int(rng.choice([rng.integers(1, 40), rng.integers(40, 900)])) for _ in range(int(rng.integers(1, 4)))]
        n_cs = [RI.compressed_len(n) for n in lens]
        h, hq, d, page = 2, 4 * int(rng.choice([1, 4])), 8, int(rng.choice([1, 3, 16]))
        topk, local = int(rng.choice([2, 5, 9])), int(rng.integers(0, 3))
        ck = rng.standard_normal((sum(n_cs), h, d)).astype(np.float32)
        q = rng.standard_normal((len(lens), hq, d)).astype(np.float32)
        scale, layout = None, "dense"
        if fmt == "fp8_scaled":
            ck = (ck * 40).clip(-448, 448).astype(ml_dtypes.float8_e4m3fn)
            scale = rng.uniform(0.01, 0.1, len(ck)).astype(np.float32)
            flat, layout = ck.reshape(len(ck), h * d).view(np.uint8), "fp8_scaled"
        else:
            ck = ck.astype({"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}[fmt])
            flat = ck.reshape(len(ck), h * d)
        cache, table = _paged(flat, n_cs, page, rng, scale)
        got = ks.infllm_select_paged(q, cache, table, lens, h, topk, local_blocks=local, page_layout=layout)
        twin = RI.infllm_select_paged(q, cache, table, lens, h, topk, local_blocks=local, page_layout=layout)
        c0 = np.r_[0, np.cumsum(n_cs)]
        for s, n in enumerate(lens):
            cs = slice(c0[s], c0[s + 1])
            sc = {} if scale is None else {"ck_scale": scale[cs]}
            assert np.array_equal(
                got[s : s + 1], ks.infllm_select(q[s : s + 1], ck[cs], n, topk, local_blocks=local, **sc)
            )
            want = RI.infllm_select(q[s : s + 1], ck[cs], n, topk, local_blocks=local, **sc)
            assert np.array_equal(twin[s : s + 1], want)


@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "fp8_scaled"])
def test_infllm_paged_block_scores_equal_dense(fmt):
    """``infllm_block_scores_paged``: each sequence's decoding query over its compressed
    keys in shuffled pages (page sizes 1 to 16, GQA groups of 1 and 16, sequences below
    32 tokens with no key, both poolings): the dense call's row bit for bit, then NaN to
    the longest sequence's blocks; the twin's paged scores equal its dense ones."""
    rng = np.random.default_rng(SEED + 7 + len(fmt))
    rows_checked = 0
    for _ in range(30):
        lens = [int(rng.choice([rng.integers(1, 40), rng.integers(40, 900)])) for _ in range(int(rng.integers(1, 4)))]
        n_cs = [RI.compressed_len(n) for n in lens]
        h, g, d, page = int(rng.choice([1, 2])), int(rng.choice([1, 16])), 8, int(rng.choice([1, 3, 16]))
        st = dict(
            init_blocks=int(rng.integers(0, 3)),
            local_blocks=int(rng.integers(0, 3)),
            pooling=str(rng.choice(["cuda", "triton"])),
        )
        ck = rng.standard_normal((sum(n_cs), h, d)).astype(np.float32)
        q = rng.standard_normal((len(lens), h * g, d)).astype(np.float32)
        scale, layout = None, "dense"
        if fmt == "fp8_scaled":
            ck = (ck * 40).clip(-448, 448).astype(ml_dtypes.float8_e4m3fn)
            scale = rng.uniform(0.01, 0.1, len(ck)).astype(np.float32)
            flat, layout = ck.reshape(len(ck), h * d).view(np.uint8), "fp8_scaled"
        else:
            ck = ck.astype({"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}[fmt])
            flat = ck.reshape(len(ck), h * d)
        cache, table = _paged(flat, n_cs, page, rng, scale)
        got = ks.infllm_block_scores_paged(q, cache, table, lens, h, page_layout=layout, **st)
        twin = RI.infllm_block_scores_paged(q, cache, table, lens, h, page_layout=layout, **st)
        assert got.dtype == np.float32 and got.shape == (len(lens), h, max(-(-n // 64) for n in lens))
        c0 = np.r_[0, np.cumsum(n_cs)]
        for s, n in enumerate(lens):
            cs, nb = slice(c0[s], c0[s + 1]), -(-n // 64)
            sc = {} if scale is None else {"ck_scale": scale[cs]}
            dense = ks.infllm_block_scores(q[s : s + 1], ck[cs], n, **st, **sc)
            assert np.array_equal(got[s : s + 1, :, :nb].view(np.uint32), dense.view(np.uint32))
            assert np.isnan(got[s, :, nb:]).all()
            want = RI.infllm_block_scores(q[s : s + 1], ck[cs], n, **st, **sc)
            assert np.array_equal(twin[s : s + 1, :, :nb], want)
            assert np.isnan(twin[s, :, nb:]).all()
            rows_checked += h
    assert rows_checked > 50


def _nsa_batch(rng):
    h, g = int(rng.choice([1, 2])), int(rng.choice([1, 2, 16]))
    d, bs = int(rng.integers(1, 16)), int(rng.choice([1, 4, 8, 16]))
    lens = [int(rng.integers(0, 120)) for _ in range(int(rng.integers(1, 5)))]
    n_qs = [int(rng.integers(0, min(n, 5) + 1)) if rng.random() < 0.6 else n for n in lens]
    k = rng.standard_normal((sum(lens), h, d)).astype(np.float32)
    q = rng.standard_normal((sum(n_qs), h * g, d)).astype(np.float32)
    return q, k, lens, np.r_[0, np.cumsum(lens)], np.r_[0, np.cumsum(n_qs)], bs


def test_nsa_packed_equals_each_sequence_alone_and_the_twin():
    """fla's varlen form (``cu_seqlens``, and ``cu_seqlens_q`` for queries that are the
    last of their keys): each sequence's rows and scores are the dense call's bit for
    bit (empty sequences, sequences without queries, GQA groups of 1 and 16); the twin
    agrees within the bound."""
    rng = np.random.default_rng(SEED + 3)
    rows_checked = 0
    for i in range(250):
        q, k, lens, cu, cu_q, bs = _nsa_batch(rng)
        n = int(rng.integers(1, 7))
        packed = dict(cu_seqlens=cu, cu_seqlens_q=cu_q)
        if i % 3 == 0 and np.array_equal(cu, cu_q):
            packed.pop("cu_seqlens_q")
        rows = ks.nsa_select(q, k, n, block_size=bs, **packed)
        scores = ks.nsa_block_scores(q, k, block_size=bs, **packed)
        twin = RN.nsa_select(q, k, n, block_size=bs, **packed)
        twin_scores = RN.nsa_block_scores(q, k, block_size=bs, **packed)
        for s, ln in enumerate(lens):
            qs, kk = slice(cu_q[s], cu_q[s + 1]), slice(cu[s], cu[s + 1])
            if cu_q[s + 1] == cu_q[s]:
                continue
            nb = -(-ln // bs)
            assert np.array_equal(rows[qs], ks.nsa_select(q[qs], k[kk], n, block_size=bs))
            dense = ks.nsa_block_scores(q[qs], k[kk], block_size=bs)
            assert np.array_equal(scores[qs, :, :nb].view(np.uint32), dense.view(np.uint32))
            assert np.isnan(scores[qs, :, nb:]).all()
            bound = RN.nsa_score_bound(q[qs], k[kk], block_size=bs)
            ok = RN.nsa_rows_within_bound(rows[qs], twin_scores[qs, :, :nb], bound, n)
            assert ok.all()
            assert np.array_equal(twin[qs], RN.nsa_select(q[qs], k[kk], n, block_size=bs))
            rows_checked += ok.size
    assert rows_checked > 1000


_CHILD = """
import sys, numpy as np, kvselect as ks
src = np.load(sys.argv[1], allow_pickle=True)
out = {}
for i in range(int(src["n"])):
    q, ck, lens, cq, ckk = (src[f"{x}{i}"] for x in ("q", "ck", "lens", "cq", "ckk"))
    out[f"r{i}"] = ks.infllm_select(q, ck, lens, 5, local_blocks=1, cu_seqlens_q=cq, cu_seqlens_k=ckk)
    out[f"s{i}"] = ks.infllm_block_scores(q, ck, lens, local_blocks=1, cu_seqlens_q=cq, cu_seqlens_k=ckk)
    out[f"p{i}"] = ks.infllm_select_paged(src[f"pq{i}"], src[f"cache{i}"], src[f"table{i}"], lens, ck.shape[1], 5)
    out[f"ps{i}"] = ks.infllm_block_scores_paged(src[f"pq{i}"], src[f"cache{i}"], src[f"table{i}"], lens, ck.shape[1])
    k, cu, cuq = src[f"k{i}"], src[f"cu{i}"], src[f"cuq{i}"]
    out[f"n{i}"] = ks.nsa_select(q, k, 4, block_size=16, cu_seqlens=cu, cu_seqlens_q=cuq)
    out[f"ns{i}"] = ks.nsa_block_scores(q, k, block_size=16, cu_seqlens=cu, cu_seqlens_q=cuq)
np.savez(sys.argv[2], **out)
"""


@pytest.mark.parametrize("level", ["scalar", "avx2"])
def test_every_simd_level_gives_the_same_bits(tmp_path, level):
    """Packed InfLLM-v2 and NSA rows and scores, and paged InfLLM-v2 rows and scores, at
    KVSELECT_SIMD=scalar / avx2 (a child process) equal the best level's bits, one batch
    past the parallel threshold."""
    require_simd()
    rng = np.random.default_rng(SEED + 4)
    arrays, expected = {"n": np.array(8)}, {}
    for i in range(8):
        lens = [int(x) for x in rng.integers(1, 600, size=3)] if i else [5000, 40, 900]
        n_qs = [min(n, 3) for n in lens] if i else [64, 1, 3]
        n_cs = [RI.compressed_len(n) for n in lens]
        h, hq, d = 2, 32 if i == 0 else 4, 128 if i == 0 else 16
        ck = rng.standard_normal((sum(n_cs), h, d)).astype(np.float32)
        q = rng.standard_normal((sum(n_qs), hq, d)).astype(np.float32)
        k = rng.standard_normal((sum(lens), h, d)).astype(np.float32)
        cq, ckk = np.r_[0, np.cumsum(n_qs)], np.r_[0, np.cumsum(n_cs)]
        cache, table = _paged(ck.reshape(len(ck), -1), n_cs, 16, rng)
        pq = q[cq[1:] - 1]
        arrays.update({f"q{i}": q, f"ck{i}": ck, f"lens{i}": np.array(lens), f"cq{i}": cq, f"ckk{i}": ckk})
        arrays.update({f"pq{i}": pq, f"cache{i}": cache, f"table{i}": table, f"k{i}": k})
        arrays.update({f"cu{i}": np.r_[0, np.cumsum(lens)], f"cuq{i}": cq})
        expected[f"r{i}"] = ks.infllm_select(q, ck, lens, 5, local_blocks=1, cu_seqlens_q=cq, cu_seqlens_k=ckk)
        expected[f"s{i}"] = ks.infllm_block_scores(q, ck, lens, local_blocks=1, cu_seqlens_q=cq, cu_seqlens_k=ckk)
        expected[f"p{i}"] = ks.infllm_select_paged(pq, cache, table, lens, h, 5)
        expected[f"ps{i}"] = ks.infllm_block_scores_paged(pq, cache, table, lens, h)
        cu = arrays[f"cu{i}"]
        expected[f"n{i}"] = ks.nsa_select(q, k, 4, block_size=16, cu_seqlens=cu, cu_seqlens_q=cq)
        expected[f"ns{i}"] = ks.nsa_block_scores(q, k, block_size=16, cu_seqlens=cu, cu_seqlens_q=cq)
    np.savez(tmp_path / "in.npz", **arrays)
    assert_child_equals(_CHILD, tmp_path, level, expected, timeout=600)


def _infllm_args():
    rng = np.random.default_rng(SEED + 5)
    lens = [200, 40]
    n_cs = [RI.compressed_len(n) for n in lens]  # 11, 1
    q = rng.standard_normal((3, 4, 8)).astype(np.float32)
    ck = rng.standard_normal((sum(n_cs), 2, 8)).astype(np.float32)
    return dict(
        q=q, ck=ck, seq_len=np.array(lens), cu_seqlens_q=np.array([0, 2, 3]), cu_seqlens_k=np.array([0, 11, 12])
    )


@pytest.mark.parametrize(
    "change, argument",
    [
        (dict(cu_seqlens_q=None), "cu_seqlens_q"),
        (dict(cu_seqlens_k=None), "cu_seqlens_k"),
        (dict(cu_seqlens_k=np.array([0, 11, 13])), "cu_seqlens_k"),  # past ck's keys
        (dict(cu_seqlens_k=np.array([0, 10, 12])), "cu_seqlens_k"),  # not sequence 0's compressed keys
        (dict(cu_seqlens_k=np.array([1, 11, 12])), "cu_seqlens_k"),
        (dict(seq_len=np.array([200])), "seq_len"),
        (dict(seq_len=np.array([200, 0])), "seq_len"),
        (dict(cu_seqlens_q=np.array([0, 3])), "cu_seqlens_q"),  # not one per sequence
        (dict(cu_seqlens_q=np.array([0, 1, 2])), "cu_seqlens_q"),  # not all the queries
        (dict(cu_seqlens_q=np.array([0, 3, 2])), "cu_seqlens_q"),  # decreasing
        # Sequence 1 holds 40 tokens but is given 42 queries.
        (dict(q=np.zeros((45, 4, 8), np.float32), cu_seqlens_q=np.array([0, 3, 45])), "cu_seqlens_q"),
        (dict(ck_scale=np.ones(5, np.float32)), "ck_scale"),
        (dict(cu_seqlens_q=np.array([0, -1, 3])), "cu_seqlens_q"),
    ],
)
def test_infllm_packed_refusals_name_the_argument_and_change_nothing(change, argument):
    args = _infllm_args()
    args.update(change)
    args = {n: v for n, v in args.items() if v is not None}
    before = {n: np.array(v, copy=True) for n, v in args.items()}
    q, ck, n = args.pop("q"), args.pop("ck"), args.pop("seq_len")
    for fn in (ks.infllm_select, ks.infllm_block_scores):
        with pytest.raises(ks.SelectionError, match=argument) as e:
            fn(q, ck, n, **args)
        assert e.value.argument == argument
    with pytest.raises(ValueError, match=argument):
        RI.infllm_select(q, ck, n, **args)
    after = dict(args, q=q, ck=ck, seq_len=n)
    for name, v in before.items():
        assert np.array_equal(after[name], v), name


@pytest.mark.parametrize(
    "change, argument",
    [
        (dict(cu_seqlens=np.array([0, 30, 50])), "cu_seqlens"),  # past the keys
        (dict(cu_seqlens=np.array([0, 30, 20, 40])), "cu_seqlens"),
        (dict(cu_seqlens_q=np.array([0, 3])), "cu_seqlens_q"),
        (dict(cu_seqlens=np.array([0, 1, 40]), cu_seqlens_q=np.array([0, 2, 3])), "cu_seqlens_q"),
        (dict(k_scale=np.ones(3, np.float32)), "k_scale"),
        (dict(block_counts=0), "block_counts"),
    ],
)
def test_nsa_packed_refusals_name_the_argument_and_change_nothing(change, argument):
    rng = np.random.default_rng(SEED + 6)
    args = dict(
        q=rng.standard_normal((3, 4, 8)).astype(np.float32),
        k=rng.standard_normal((40, 2, 8)).astype(np.float32),
        cu_seqlens=np.array([0, 30, 40]),
        cu_seqlens_q=np.array([0, 2, 3]),
        block_size=4,
    )
    args.update(change)
    before = {n: np.array(v, copy=True) for n, v in args.items() if isinstance(v, np.ndarray)}
    q, k = args.pop("q"), args.pop("k")
    with pytest.raises(ks.SelectionError, match=argument) as e:
        ks.nsa_select(q, k, **args)
    assert e.value.argument == argument
    with pytest.raises(ValueError, match=argument):
        RN.nsa_select(q, k, **args)
    after = dict(args, q=q, k=k)
    for name, v in before.items():
        assert np.array_equal(after[name], v), name


@pytest.mark.parametrize(
    "change, argument",
    [
        (dict(table=np.array([[0]], np.int32)), "block_table"),  # 200 tokens: 11 keys, 2 pages of 8
        (dict(table=np.array([[0, 7]], np.int32)), "block_table"),  # past the cache
        (dict(lens=[0]), "seq_lens"),
        (dict(lens=[2**31]), "seq_lens"),  # past an int32 position
        (dict(lens=[2**40]), "seq_lens"),  # its block scores' row not allocated first
        (dict(h=3), "n_kv_heads"),
        (dict(q=np.zeros((2, 4, 8), np.float32)), "q"),
        (dict(cache=np.zeros((4, 8, 15), np.float32)), "n_kv_heads"),
        (dict(table=np.array([[2, -1]], np.int32)), "block_table"),
        (dict(h=0), "n_kv_heads"),
        (dict(q=np.zeros((1, 3, 8), np.float32)), "q"),  # heads not a multiple of the KV heads
        (dict(q=np.zeros((1, 4, 4), np.float32)), "q"),  # another d
        (dict(cache=np.zeros((4, 8), np.float32)), "kv_cache"),
        (dict(topk=0), "topk"),
        (dict(kw=dict(block_size=0)), "block_size"),
        (dict(kw=dict(kernel_stride=0)), "kernel_stride"),
        (dict(kw=dict(block_size=40)), "block_size"),  # not whole strides
        (dict(kw=dict(scale=float("nan"))), "scale"),
        (dict(kw=dict(pooling="max")), "pooling"),
        (dict(kw=dict(page_layout="fp9")), "page_layout"),
    ],
)
def test_infllm_paged_refusals_name_the_argument_and_change_nothing(change, argument):
    """Both paged entry points (``topk`` the selection's alone) and the scores' twin
    refuse naming the argument (a SelectionError; a ValueError in the twin) and leave
    every input byte-identical."""
    args = dict(
        q=np.ones((1, 4, 8), np.float32),
        cache=np.arange(4 * 8 * 16, dtype=np.float32).reshape(4, 8, 16),
        table=np.array([[2, 1]], np.int32),
        lens=[200],
        h=2,
        topk=3,
        kw={},
    )
    args.update(change)
    before = {n: np.array(v, copy=True) for n, v in args.items() if isinstance(v, np.ndarray)}
    pos, kw = (args["q"], args["cache"], args["table"], args["lens"], args["h"]), args["kw"]
    calls = [lambda m: m.infllm_select_paged(*pos, args["topk"], **kw)]
    if argument != "topk":
        calls.append(lambda m: m.infllm_block_scores_paged(*pos, **kw))
    for call in calls:
        with pytest.raises(ks.SelectionError, match=argument) as e:
            call(ks)
        assert e.value.argument == argument
    if argument != "topk":
        with pytest.raises(ValueError) as t:
            RI.infllm_block_scores_paged(*pos, **kw)
        assert getattr(t.value, "argument", None) == argument, t.value
    for name, v in before.items():
        assert np.array_equal(args[name], v), name


def test_a_packed_batch_pins_the_sources_varlen_rows():
    """Two sequences (512 tokens, its last 2 queries; 100 tokens, its last query) with
    one standing-out compressed key each: the rows are what the source's varlen pooling
    gives each sequence (its own blocks, numbered from 0)."""
    d = 4
    n_cs = [RI.compressed_len(512), RI.compressed_len(100)]  # 31, 5
    ck = np.zeros((sum(n_cs), 1, d), np.float32)
    ck[11, 0, 0] = 8.0  # sequence 0, key 11: a tap of blocks 2 and 3
    ck[31 + 3, 0, 0] = 8.0  # sequence 1, key 3: blocks 0 and 1
    q = np.zeros((3, 1, d), np.float32)
    q[:, 0, 0] = 1.0
    rows = ks.infllm_select(
        q, ck, [512, 100], 3, init_blocks=0, local_blocks=0, scale=1.0,
        cu_seqlens_q=[0, 2, 3], cu_seqlens_k=[0, 31, 36],
    )  # fmt: skip
    # Sequence 0 (queries at 510, 511; block 7 forced): key 11 lies in [4*3-1, 4*3+4) = [11, 16) and
    # [4*2-1, 4*2+4) = [7, 12): blocks 2 and 3 tie, then block 7.
    assert rows[0, 0].tolist() == [2, 3, 7] and rows[1, 0].tolist() == [2, 3, 7]
    # Sequence 1 (query at 99, block 1 forced): key 3 is in blocks 0 ([0, 4)) and 1 ([3, 8)).
    assert rows[2, 0].tolist() == [0, 1, -1]
