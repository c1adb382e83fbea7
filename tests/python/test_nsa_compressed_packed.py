"""NSA on given compressed keys over a packed batch (``nsa_select_compressed`` /
``nsa_block_scores_compressed`` with ``cu_seqlens_q`` and ``cu_seqlens_k``, as
``infllm_select`` takes them): every sequence's rows equal the dense call's on that
sequence bit for bit, the twin's likewise, and the refusals name their argument and
change nothing."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from levels import assert_child_equals, require_simd

import kvselect as ks
from kvselect.reference import nsa as RN

SEED = 20261207


def _batch(rng):
    h, g = int(rng.choice([1, 2])), int(rng.choice([1, 2, 16]))
    d, bs = int(rng.integers(1, 20)), int(rng.choice([16, 32, 64]))
    geo = dict(window="eq9", kernel_size=32, kernel_stride=16) if rng.random() < 0.3 else {}
    n_seqs = int(rng.integers(1, 5))
    lens = [int(rng.choice([rng.integers(1, 40), rng.integers(40, 900)])) for _ in range(n_seqs)]
    n_qs = [int(rng.integers(0, min(n, 4) + 1)) for n in lens]
    if geo:
        n_cs = [0 if n < 32 else (n - 32) // 16 + 1 for n in lens]
    else:
        n_cs = [n // bs for n in lens]
    ties = rng.random() < 0.25
    shape = (sum(n_cs), h, d)
    ck = (rng.integers(-2, 3, shape) if ties else rng.standard_normal(shape)).astype(np.float32)
    q = rng.standard_normal((sum(n_qs), h * g, d)).astype(np.float32)
    extra = {}
    fmt = rng.random()
    if fmt < 0.25:
        ck = (ck * 40).clip(-448, 448).astype(ml_dtypes.float8_e4m3fn)
        extra["ck_scale"] = rng.uniform(0.01, 0.1, len(ck)).astype(np.float32)
    elif fmt < 0.5:
        ck = ck.astype(ml_dtypes.bfloat16)
    kw = dict(block_size=bs, local_blocks=int(rng.integers(0, 3)), **geo)
    return q, ck, lens, np.r_[0, np.cumsum(n_qs)], np.r_[0, np.cumsum(n_cs)], kw, extra


def test_packed_equals_each_sequence_alone_and_the_twin():
    """Packed batches (sequences without queries, below a block and below Eq. 9's
    kernel; groups 1, 2, 16; float32, bfloat16 and fp8 compressed keys with scales;
    both windows; ties): each sequence's scores and rows are the dense call's bit for
    bit, NaN past its own blocks, and the twin's packed rows are its dense ones."""
    rng = np.random.default_rng(SEED)
    rows_checked = 0
    for _ in range(120):
        q, ck, lens, cu_q, cu_k, kw, extra = _batch(rng)
        n = int(rng.choice([1, 3, 16]))
        packed = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
        scores = ks.nsa_block_scores_compressed(q, ck, lens, **kw, **extra, **packed)
        rows = ks.nsa_select_compressed(q, ck, lens, n, **kw, **extra, **packed)
        twin = RN.nsa_select_compressed(q, ck, lens, n, **kw, **extra, **packed)
        assert rows.shape == (len(q), ck.shape[1], n)
        for s, ln in enumerate(lens):
            qs, cs = slice(cu_q[s], cu_q[s + 1]), slice(cu_k[s], cu_k[s + 1])
            if cu_q[s + 1] == cu_q[s]:
                continue
            sc = {"ck_scale": extra["ck_scale"][cs]} if extra else {}
            dense = ks.nsa_block_scores_compressed(q[qs], ck[cs], ln, **kw, **sc)
            nb = dense.shape[2]
            assert np.array_equal(scores[qs, :, :nb].view(np.uint32), dense.view(np.uint32))
            assert np.isnan(scores[qs, :, nb:]).all()
            assert np.array_equal(rows[qs], ks.nsa_select_compressed(q[qs], ck[cs], ln, n, **kw, **sc))
            assert np.array_equal(twin[qs], RN.nsa_select_compressed(q[qs], ck[cs], ln, n, **kw, **sc))
            rows_checked += rows[qs].shape[0] * rows.shape[1]
    assert rows_checked > 300


def test_a_packed_batch_pins_each_sequences_own_block_ids():
    """Two sequences (300 tokens, its last 2 queries; 200 tokens, its last query) in
    blocks of 64, one standing-out compressed key each: each row names its own
    sequence's block, numbered from 0."""
    d = 4
    ck = np.zeros((4 + 3, 1, d), np.float32)
    ck[1, 0, 0] = 8.0  # sequence 0: block 1
    ck[4 + 0, 0, 0] = 8.0  # sequence 1: block 0
    q = np.zeros((3, 1, d), np.float32)
    q[:, 0, 0] = 1.0
    rows = ks.nsa_select_compressed(
        q, ck, [300, 200], 1, init_blocks=0, local_blocks=0, scale=1.0, cu_seqlens_q=[0, 2, 3], cu_seqlens_k=[0, 4, 7]
    )
    assert rows[:, 0, 0].tolist() == [1, 1, 0]


def _args():
    rng = np.random.default_rng(SEED + 1)
    return dict(
        q=rng.standard_normal((3, 4, 8)).astype(np.float32),
        ck=rng.standard_normal((4 + 3, 2, 8)).astype(np.float32),
        seq_len=np.array([300, 200]),  # 4 and 3 compressed keys in blocks of 64
        cu_seqlens_q=np.array([0, 2, 3]),
        cu_seqlens_k=np.array([0, 4, 7]),
    )


@pytest.mark.parametrize(
    "change, argument",
    [
        (dict(cu_seqlens_q=None), "cu_seqlens_q"),
        (dict(cu_seqlens_k=None), "cu_seqlens_k"),
        (dict(cu_seqlens_k=np.array([0, 4, 8])), "cu_seqlens_k"),  # past ck's keys
        (dict(cu_seqlens_k=np.array([0, 3, 7])), "cu_seqlens_k"),  # not sequence 0's compressed keys
        (dict(cu_seqlens_k=np.array([1, 4, 7])), "cu_seqlens_k"),
        (dict(seq_len=np.array([300])), "seq_len"),
        (dict(seq_len=np.array([300, 0])), "seq_len"),
        (dict(seq_len=np.array([300, 2**31])), "seq_len"),  # past an int32 position (the twin named cu_seqlens_k)
        (dict(cu_seqlens_q=np.array([0, 3])), "cu_seqlens_q"),  # not one per sequence
        (dict(cu_seqlens_q=np.array([0, 1, 2])), "cu_seqlens_q"),  # not all the queries
        (dict(cu_seqlens_q=np.array([0, 3, 2])), "cu_seqlens_q"),  # decreasing
        # Sequence 1 holds 200 tokens but is given 202 queries.
        (dict(q=np.zeros((205, 4, 8), np.float32), cu_seqlens_q=np.array([0, 3, 205])), "cu_seqlens_q"),
        (dict(ck_scale=np.ones(5, np.float32)), "ck_scale"),
        (dict(cu_seqlens_q=np.array([0, -1, 3])), "cu_seqlens_q"),
        (dict(ck=np.zeros((7, 3, 8), np.float32)), "q"),  # 4 heads over 3 KV heads
    ],
)
def test_packed_refusals_name_the_argument_and_change_nothing(change, argument):
    args = _args()
    args.update(change)
    args = {n: v for n, v in args.items() if v is not None}
    before = {n: np.array(v, copy=True) for n, v in args.items()}
    q, ck, n = args.pop("q"), args.pop("ck"), args.pop("seq_len")
    for fn, twin in (
        (ks.nsa_select_compressed, RN.nsa_select_compressed),
        (ks.nsa_block_scores_compressed, RN.nsa_block_scores_compressed),
    ):
        with pytest.raises(ks.SelectionError, match=argument) as e:
            fn(q, ck, n, **args)
        assert e.value.argument == argument
        with pytest.raises(ValueError) as t:
            twin(q, ck, n, **args)
        assert getattr(t.value, "argument", None) == argument, t.value
    after = dict(args, q=q, ck=ck, seq_len=n)
    for name, v in before.items():
        assert np.array_equal(after[name], v), name


_CHILD = """
import sys, numpy as np, kvselect as ks
src = np.load(sys.argv[1])
out = {}
for i in range(int(src["n"])):
    q, ck, lens, cq, ckk = (src[f"{x}{i}"] for x in ("q", "ck", "lens", "cq", "ckk"))
    kw = dict(window="eq9") if i % 2 else {}
    out[f"s{i}"] = ks.nsa_block_scores_compressed(q, ck, lens, cu_seqlens_q=cq, cu_seqlens_k=ckk, **kw)
    out[f"r{i}"] = ks.nsa_select_compressed(q, ck, lens, 6, cu_seqlens_q=cq, cu_seqlens_k=ckk, **kw)
np.savez(sys.argv[2], **out)
"""


@pytest.mark.parametrize("level", ["scalar", "avx2"])
def test_every_simd_level_gives_the_same_bits(tmp_path, level):
    """A child at ``KVSELECT_SIMD=level`` returns this process's packed scores and rows
    (best level), both windows, groups 1 and 16, one batch past the parallel threshold."""
    require_simd()
    rng = np.random.default_rng(SEED + 2)
    arrays, expected = {"n": np.array(4)}, {}
    for i in range(4):
        h, hq, d = (2, 32, 128) if i == 0 else (2, 2 * int(rng.choice([1, 16])), 16)
        lens = [6000, 70, 5] if i == 0 else [int(x) for x in rng.integers(1, 900, size=3)]
        n_qs = [min(n, 3) for n in lens]
        n_cs = [(0 if n < 32 else (n - 32) // 16 + 1) if i % 2 else n // 64 for n in lens]
        ck = rng.standard_normal((sum(n_cs), h, d)).astype(np.float32)
        q = rng.standard_normal((sum(n_qs), hq, d)).astype(np.float32)
        cq, ckk = np.r_[0, np.cumsum(n_qs)], np.r_[0, np.cumsum(n_cs)]
        arrays.update({f"q{i}": q, f"ck{i}": ck, f"lens{i}": np.array(lens), f"cq{i}": cq, f"ckk{i}": ckk})
        kw = dict(window="eq9") if i % 2 else {}
        expected[f"s{i}"] = ks.nsa_block_scores_compressed(q, ck, lens, cu_seqlens_q=cq, cu_seqlens_k=ckk, **kw)
        expected[f"r{i}"] = ks.nsa_select_compressed(q, ck, lens, 6, cu_seqlens_q=cq, cu_seqlens_k=ckk, **kw)
    np.savez(tmp_path / "in.npz", **arrays)
    assert_child_equals(_CHILD, tmp_path, level, expected, timeout=600)
