"""NSA's selection on given compressed keys (``nsa_select_compressed``,
``nsa_block_scores_compressed``; the keys from ``nsa_compress_keys``), an engine's decode
on its cache of mean-pooled keys: bit for bit the entry points on the keys (fla's window
and Eq. 9's, key formats, bfloat16 and fp8 compressed keys), at every SIMD level; the
twin's rows within the bound; refusals that name their argument and change nothing."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from levels import assert_child_equals, require_simd

import kvselect as ks
from kvselect import reference as ref
from kvselect.reference import nsa as RN

SEED = 45045


def _case(rng):
    """``q``, keys and settings: decode and prefill chunks, a sequence ending on a block
    boundary or past it, groups of 1 to 16, fla's window or Eq. 9's."""
    h, g = int(rng.choice([1, 2, 4])), int(rng.choice([1, 2, 16]))
    d = int(rng.integers(1, 40))
    if rng.random() < 0.3:
        bs, kz, st = [(64, 32, 16), (16, 8, 4), (8, 8, 4)][int(rng.integers(0, 3))]
        geo = dict(block_size=bs, window="eq9", kernel_size=kz, kernel_stride=st)
    else:
        bs = int(rng.choice([1, 4, 16, 64]))
        geo = dict(block_size=bs)
    n = int(rng.choice([bs * int(rng.integers(1, 30)), int(rng.integers(1, 30 * bs + 2))]))
    n_q = int(rng.choice([1, int(rng.integers(1, min(n, 6) + 1))]))
    k = rng.standard_normal((n, h, d)).astype(np.float32)
    q = rng.standard_normal((n_q, h * g, d)).astype(np.float32)
    return q, k, geo


def _compress_kw(geo):
    return {key: v for key, v in geo.items() if key in ("block_size", "window", "kernel_size", "kernel_stride")}


def _bits(x):
    return x.view(np.uint32)


def test_equals_the_keys_entry_points_bit_for_bit():
    """On the compressed keys ``nsa_compress_keys`` returns, the scores' bits and the
    rows are those of ``nsa_block_scores`` / ``nsa_select`` on the keys."""
    rng = np.random.default_rng(SEED)
    finite = 0
    for _ in range(200):
        q, k, geo = _case(rng)
        n = int(rng.choice([1, 3, 16]))
        ck = ks.nsa_compress_keys(k, **_compress_kw(geo))
        s = ks.nsa_block_scores_compressed(q, ck, len(k), **geo)
        assert np.array_equal(_bits(s), _bits(ks.nsa_block_scores(q, k, **geo)))
        assert np.array_equal(ks.nsa_select_compressed(q, ck, len(k), n, **geo), ks.nsa_select(q, k, n, **geo))
        finite += int(np.isfinite(s).sum())
    assert finite > 1000


@pytest.mark.parametrize("fmt", ["bfloat16", "fp8"])
def test_keys_in_a_format_compress_to_the_same_bits(fmt):
    """Keys read in place in their format (fp8 with a scale a token): the compressed
    keys kvselect computes from them give the keys' own rows."""
    rng = np.random.default_rng(SEED + 1)
    for _ in range(20):
        q, k, geo = _case(rng)
        kw = {}
        if fmt == "bfloat16":
            kk = k.astype(ml_dtypes.bfloat16)
        else:
            kk = k.astype(ml_dtypes.float8_e4m3fn)
            kw["k_scale"] = rng.uniform(0.5, 2.0, len(k)).astype(np.float32)
        ck = ks.nsa_compress_keys(kk, **_compress_kw(geo), **kw)
        s = ks.nsa_block_scores_compressed(q, ck, len(k), **geo)
        assert np.array_equal(_bits(s), _bits(ks.nsa_block_scores(q, kk, **geo, **kw)))
        assert np.array_equal(ks.nsa_select_compressed(q, ck, len(k), 4, **geo), ks.nsa_select(q, kk, 4, **geo, **kw))


def _blockwise(rng, fmt, n_c, bs, tail, h, d):
    """Compressed keys in ``fmt`` (fp8: and a scale a key), and float32 keys constant
    over each block whose block means are exactly their values."""
    ck = rng.standard_normal((n_c, h, d)).astype(np.float32)
    sc = None
    if fmt == "bfloat16":
        ck = ck.astype(ml_dtypes.bfloat16)
        vals = ck.astype(np.float32)
    else:
        ck = ck.astype(ml_dtypes.float8_e4m3fn)
        sc = rng.choice([0.5, 0.75, 1.25, 2.0], n_c).astype(np.float32)
        vals = (ck.astype(np.float32) * sc[:, None, None]).astype(np.float32)
    k = np.concatenate([np.repeat(vals, bs, axis=0), rng.standard_normal((tail, h, d)).astype(np.float32)])
    return ck, sc, k


@pytest.mark.parametrize("fmt", ["bfloat16", "fp8"])
def test_compressed_keys_read_in_their_format(fmt):
    """bfloat16 / fp8 compressed keys (``ck_scale`` one a key) read in place: equal to
    the keys' entry points on float32 keys whose block means are those values."""
    rng = np.random.default_rng(SEED + 2)
    for tail in (0, 5, 15):
        ck, sc, k = _blockwise(rng, fmt, 40, 16, tail, 2, 24)
        assert np.array_equal(
            ks.nsa_compress_keys(k, block_size=16), ck.astype(np.float32) * (1 if sc is None else sc[:, None, None])
        )
        q = rng.standard_normal((3, 8, 24)).astype(np.float32)
        s = ks.nsa_block_scores_compressed(q, ck, len(k), block_size=16, ck_scale=sc)
        assert np.array_equal(_bits(s), _bits(ks.nsa_block_scores(q, k, block_size=16)))
        rows = ks.nsa_select_compressed(q, ck, len(k), 5, block_size=16, ck_scale=sc)
        assert np.array_equal(rows, ks.nsa_select(q, k, 5, block_size=16))
        raw = ck.view(np.uint16 if fmt == "bfloat16" else np.uint8)
        fmt_name = "bfloat16" if fmt == "bfloat16" else "float8_e4m3fn"
        again = ks.nsa_select_compressed(q, raw, len(k), 5, block_size=16, ck_scale=sc, key_format=fmt_name)
        assert np.array_equal(again, rows)


def test_the_twin_on_the_compressed_keys():
    """The twin from the same compressed keys (float64): the core's rows equal its rows
    but for swaps inside the bound (``nsa_score_bound`` of the keys: the compressed keys'
    own rounding is inside it), and most rows exactly."""
    rng = np.random.default_rng(SEED + 3)
    rows_checked = exact = 0
    for _ in range(150):
        q, k, geo = _case(rng)
        if geo.get("window") == "eq9":
            continue
        n = int(rng.choice([1, 3, 16]))
        ck = ks.nsa_compress_keys(k, block_size=geo["block_size"])
        rows = ks.nsa_select_compressed(q, ck, len(k), n, **geo)
        scores = RN.nsa_block_scores_compressed(q, ck, len(k), **geo)
        ok = RN.nsa_rows_within_bound(rows, scores, RN.nsa_score_bound(q, k, block_size=geo["block_size"]), n)
        assert ok.all()
        rows_checked += ok.size
        exact += int((rows == RN.nsa_select_compressed(q, ck, len(k), n, **geo)).all(axis=-1).sum())
    assert rows_checked > 300 and exact >= 0.95 * rows_checked


_CHILD = """
import sys, numpy as np, kvselect as ks
src = np.load(sys.argv[1])
out = {}
for i in range(int(src["n"])):
    q, ck, n = src[f"q{i}"], src[f"ck{i}"], int(src[f"n{i}"])
    kw = dict(window="eq9") if i % 3 == 2 else {}
    out[f"s{i}"] = ks.nsa_block_scores_compressed(q, ck, n, **kw)
    out[f"r{i}"] = ks.nsa_select_compressed(q, ck, n, 6, **kw)
np.savez(sys.argv[2], **out)
"""


@pytest.mark.parametrize("level", ["scalar", "avx2"])
def test_every_simd_level_gives_the_keys_bits(tmp_path, level):
    """A child at ``KVSELECT_SIMD=level`` on the compressed keys returns the bits this
    process's ``nsa_block_scores`` / ``nsa_select`` return on the keys at its best level."""
    require_simd()
    rng = np.random.default_rng(SEED + 4)
    arrays, expected = {"n": np.array(6)}, {}
    for i in range(6):
        n, n_q, hq, d = (20000, 4, 64, 128) if i == 0 else (int(rng.integers(100, 900)), 3, 8, 16)
        q = rng.standard_normal((n_q, hq, d)).astype(np.float32)
        k = rng.standard_normal((n, 2, d)).astype(np.float32)
        kw = dict(window="eq9") if i % 3 == 2 else {}
        arrays.update({f"q{i}": q, f"ck{i}": ks.nsa_compress_keys(k, **kw), f"n{i}": np.array(n)})
        expected[f"s{i}"] = ks.nsa_block_scores(q, k, **kw)
        expected[f"r{i}"] = ks.nsa_select(q, k, 6, **kw)
    np.savez(tmp_path / "in.npz", **arrays)
    assert_child_equals(_CHILD, tmp_path, level, expected, timeout=600)


def _inputs():
    rng = np.random.default_rng(SEED + 5)
    q = rng.standard_normal((2, 4, 8)).astype(np.float32)
    ck = rng.standard_normal((5, 2, 8)).astype(np.float32)  # 5 complete blocks of 4: seq_len 20 .. 23
    return q, ck


@pytest.mark.parametrize(
    "change, argument",
    [
        (dict(seq_len=19), "ck"),  # 4 complete blocks, 5 keys given
        (dict(seq_len=24), "ck"),  # 6
        (dict(ck=lambda ck: ck[:, :, :4]), "ck"),  # d differs from q's
        (dict(ck=lambda ck: ck[0]), "ck"),  # 2-D
        (dict(q=lambda q: q[:, :3]), "q"),  # 3 heads over 2 KV heads
        (dict(q=lambda q: np.concatenate([q] * 11), seq_len=20), "q"),  # 22 queries, 20 tokens
        (dict(seq_len=0), "seq_len"),
        (dict(seq_len=2**31), "seq_len"),  # past an int32 position (the twin named ck)
        (dict(ck_scale=np.ones(4, np.float32)), "ck_scale"),
        (dict(scale=float("nan")), "scale"),
        (dict(block_counts=0), "block_counts"),
        (dict(window="paper"), "window"),
        (dict(window="eq9", kernel_size=5, kernel_stride=2), "kernel_size"),  # not whole strides of 2
        (dict(window="eq9", kernel_stride=3), "kernel_stride"),
    ],
)
def test_refusals_name_the_argument_and_change_nothing(change, argument):
    q, ck = _inputs()
    before = (q.copy(), ck.copy())
    args = dict(q=q, ck=ck, seq_len=21, block_size=4)
    for key, v in change.items():
        args[key] = v(args[key]) if callable(v) else v
    n = args.pop("block_counts", 3)
    for fn, twin in (
        (ks.nsa_select_compressed, RN.nsa_select_compressed),
        (ks.nsa_block_scores_compressed, RN.nsa_block_scores_compressed),
    ):
        if fn is ks.nsa_block_scores_compressed and argument == "block_counts":
            continue
        extra = (n,) if fn is ks.nsa_select_compressed else ()
        a = dict(args)
        qa, cka, sl = a.pop("q"), a.pop("ck"), a.pop("seq_len")
        with pytest.raises(ks.SelectionError) as e:
            fn(qa, cka, sl, *extra, **a)
        assert e.value.argument == argument, str(e.value)
        with pytest.raises(ValueError) as t:
            twin(qa, cka, sl, *extra, **a)
        assert getattr(t.value, "argument", None) == argument, t.value
    assert np.array_equal(q, before[0]) and np.array_equal(ck, before[1])


def test_compress_keys_refusals_and_the_twin():
    rng = np.random.default_rng(SEED + 6)
    k = rng.standard_normal((50, 2, 8)).astype(np.float32)
    assert np.allclose(
        ks.nsa_compress_keys(k, block_size=16), RN.nsa_compress_keys(k, block_size=16), rtol=1e-6, atol=1e-7
    )
    e9 = ks.nsa_compress_keys(k, block_size=16, window="eq9", kernel_size=8, kernel_stride=4)
    assert np.allclose(e9, RN.eq9_compress_keys(k, 8, 4)[0], rtol=1e-6, atol=1e-7) and e9.shape == (11, 2, 8)
    # The twin takes the native signature, Eq. 9's window included.
    r9 = RN.nsa_compress_keys(k, block_size=16, window="eq9", kernel_size=8, kernel_stride=4)
    assert np.array_equal(r9, RN.eq9_compress_keys(k, 8, 4)[0])
    assert ks.nsa_compress_keys(k[:7], block_size=16).shape == (0, 2, 8)
    for m, error in ((ks, ks.SelectionError), (RN, ref.ReferenceSelectionError)):
        for kwargs, argument in (
            (dict(block_size=0), "block_size"),
            (dict(k_scale=np.ones(3, np.float32)), "k_scale"),
            (dict(window="eq9", kernel_stride=5), "kernel_stride"),
            (dict(window="eq8"), "window"),
        ):
            with pytest.raises(error) as e:
                m.nsa_compress_keys(k, **kwargs)
            assert e.value.argument == argument, (m, kwargs)
        with pytest.raises(error) as e:
            m.nsa_compress_keys(k[0])
        assert e.value.argument == "k"
