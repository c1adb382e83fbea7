"""The score pool's ``score_type="lse"`` natively (issue 43, item 2): SGLang
0.5.23's MiniMax-M3 selector scores a block by the log-sum-exp of its
positions' scaled scores (sgl-project/sglang
``python/sglang/kernels/ops/attention/minimax_sparse/prefill/flash_with_topk_idx.py``
@ 241670d, ``SCORE_TYPE == "lse"``). Against the NumPy twin, the family check,
``kvselect check``, every form and every SIMD level."""

import numpy as np
import pytest
from levels import assert_child_equals, require_simd

import kvselect as ks
from kvselect import checking
from kvselect import reference as ref
from kvselect.checking import DumpError, check_dump, check_indexer_family
from kvselect.reference import indexer as ref_indexer

SEED = 20261244


def _sets(rows):
    return [sorted(r[r >= 0].tolist()) for r in rows]


def _sglang_block_scores(s, block_size, sm_scale):
    """SGLang's lse block score, written from flash_with_topk_idx.py: ``qk =
    s * sm_scale * log2(e)``; ``sub_max + log2(sum(exp2(qk - sub_max)))`` per
    block, a NaN (a fully masked block) clamped to -inf."""
    qk = s * sm_scale * 1.4426950409
    out = []
    for b in range(-(-len(s) // block_size)):
        block = qk[b * block_size : (b + 1) * block_size]
        sub_max = block.max()
        with np.errstate(invalid="ignore"):
            v = sub_max + np.log2(np.exp2(block - sub_max).sum())
        out.append(-np.inf if v != v else v)
    return np.array(out)


def test_a_pinned_example_ranks_as_sglang_does():
    """Blocks of 4: many good positions (5, 5, 5, 5) beat one better one (6)
    under lse, not under max; the partial last block (7 alone) is scored over
    what it holds; SGLang's base-2 scores give the same order, and
    ``scores_out`` holds the natural-log block scores in float32."""
    values = np.array([0, 0, 0, 6, 5, 5, 5, 5, 1, 0, 0, 0, 7], np.float32)
    q = np.ones((1, 1, 1), np.float32)
    k = values[:, None]
    run = dict(score_pool=4, activation="none", sm_scale=1.0)
    s_out = np.zeros((1, 4), np.float32)
    lse = ks.indexer_topk(q, None, k, 12, 4, score_type="lse", scores_out=s_out, **run)
    assert lse.tolist() == [[3, 1, 0, 2]]
    assert ks.indexer_topk(q, None, k, 12, 4, score_pool=4, activation="none").tolist() == [[3, 0, 1, 2]]
    sglang = _sglang_block_scores(values.astype(np.float64), 4, 1.0)
    assert np.argsort(-sglang, kind="stable").tolist() == [3, 1, 0, 2]
    want = np.array([7.0, np.log(4 * np.exp(5)), np.log(3 + np.exp(6)), np.log(np.e + 3)], np.float32)
    np.testing.assert_allclose(s_out[0], want, rtol=3e-7)
    np.testing.assert_allclose(s_out[0], sglang[[3, 1, 0, 2]] / np.log2(np.e), rtol=3e-7)


def _operands(rng, n, h, d, t, kind):
    if kind == "low":  # scores a few float32 ULPs apart: lse values within ~1e-6
        base = rng.standard_normal(d).astype(np.float32)
        k = (base + rng.integers(-3, 4, (t, d)) * np.float32(2.0**-22)).astype(np.float32)
        q = (np.abs(rng.standard_normal((n, h, d))) * np.sign(base)).astype(np.float32)
    elif kind == "ties":  # integer data: exact ties between whole blocks
        q = np.round(rng.standard_normal((n, h, d))).astype(np.float32)
        k = np.round(rng.standard_normal((t, d)) * 0.7).astype(np.float32)
    else:
        q = rng.standard_normal((n, h, d)).astype(np.float32)
        k = rng.standard_normal((t, d)).astype(np.float32)
    w = None if rng.random() < 0.5 else rng.uniform(0.2, 1.5, (n, h)).astype(np.float32)
    return q, w, k


def _options(rng, topk):
    f0 = int(rng.integers(0, topk + 1)) if rng.random() < 0.4 else 0
    f1 = int(rng.integers(0, topk - f0 + 1)) if rng.random() < 0.4 else 0
    return dict(
        score_pool=int(rng.choice([2, 3, 8, 16, 128])),
        score_type="lse",
        activation=str(rng.choice(["relu", "none"])),
        force_first=f0,
        force_last=f1,
        row_layout=str(rng.choice(["rank", "ascending"])),
        compress_ratio=int(rng.choice([1, 1, 4])),
    )


def test_native_rows_equal_the_twin_and_pass_the_exact_check():
    """Random data: the native rows are the twin's (float64 log-sum-exp)
    sets; on every kind of data (near ties included) the family check at
    ``rtol = 0`` passes them."""
    rng = np.random.default_rng(SEED)
    equal = 0
    for trial in range(240):
        kind = ("random", "low", "ties")[trial % 3]
        n, h, d, t = (
            int(rng.integers(1, 5)),
            int(rng.integers(1, 6)),
            int(rng.integers(1, 40)),
            int(rng.integers(1, 700)),
        )
        q, w, k = _operands(rng, n, h, d, t, kind)
        topk = int(rng.integers(1, 12))
        opts = _options(rng, topk)
        if rng.random() < 0.3:
            opts["sm_scale"] = float(rng.choice([0.01, 0.3, 1.0, 4.0]))
        pos = rng.integers(0, opts["compress_ratio"] * t + 4, n)
        got = ks.indexer_topk(q, w, k, pos, topk, **opts)
        report = check_indexer_family(got, q, w, k, pos, topk, **opts)
        assert report["wrong"] == 0, (trial, kind, report["details"][:2])
        if kind == "random":
            want = ref.indexer_topk(q, w, k, pos, topk, **opts)
            assert _sets(got) == _sets(want), trial
            if opts["row_layout"] == "ascending":
                np.testing.assert_array_equal(got, want)
            equal += 1
    assert equal == 80


def test_the_check_names_a_max_pool_row_judged_as_lse():
    """The max pool's rows, where they differ from the lse pool's, are wrong
    under lse (the same inputs): ``wrong_selection``."""
    rng = np.random.default_rng(SEED + 1)
    q = rng.standard_normal((40, 2, 16)).astype(np.float32)
    k = rng.standard_normal((900, 16)).astype(np.float32)
    pos = rng.integers(200, 900, 40)
    opts = dict(score_pool=16, activation="none")
    lse = ks.indexer_topk(q, None, k, pos, 5, score_type="lse", **opts)
    mx = ks.indexer_topk(q, None, k, pos, 5, **opts)
    differ = [i for i in range(40) if _sets(lse[i : i + 1]) != _sets(mx[i : i + 1])]
    assert len(differ) >= 5
    report = check_indexer_family(mx, q, None, k, pos, 5, score_type="lse", **opts)
    assert sorted(x["row"] for x in report["details"]) == differ
    assert report["by_reason"]["wrong_selection"] == len(differ)
    assert check_indexer_family(lse, q, None, k, pos, 5, score_type="lse", **opts)["wrong"] == 0


def test_packed_and_paged_forms_equal_the_dense_rows():
    rng = np.random.default_rng(SEED + 2)
    for trial in range(30):
        lens = rng.integers(1, 300, 3)
        d, h = int(rng.integers(2, 20)), int(rng.integers(1, 4))
        keys = [rng.standard_normal((int(L), d)).astype(np.float32) for L in lens]
        cu = np.concatenate([[0], np.cumsum(lens)])
        sid = rng.integers(0, 3, 6)
        pos = np.array([rng.integers(0, lens[s] + 2) for s in sid])
        q = rng.standard_normal((6, h, d)).astype(np.float32)
        opts = dict(score_pool=int(rng.choice([2, 8, 64])), score_type="lse", force_last=1, activation="none")
        packed = ks.indexer_topk_packed(q, None, np.concatenate(keys), cu, sid, pos, 6, **opts)
        for i, s in enumerate(sid):
            dense = ks.indexer_topk(q[i : i + 1], None, keys[s], pos[i : i + 1], 6, **opts)
            np.testing.assert_array_equal(packed[i : i + 1], dense, err_msg=f"{trial}/{i}")
        page = 16
        blocks = [-(-int(L) // page) for L in lens]
        cache = np.zeros((sum(blocks), page, d), np.float32)
        table = np.full((3, max(blocks)), -1, np.int32)
        at = 0
        for s in range(3):
            for b in range(blocks[s]):
                part = keys[s][b * page : (b + 1) * page]
                cache[at, : len(part)] = part
                table[s, b] = at
                at += 1
        paged = ks.indexer_topk_paged(q, None, cache, table, lens, sid, pos, 6, **opts)
        np.testing.assert_array_equal(paged, packed, err_msg=str(trial))


def test_the_default_scale_is_float32_one_over_root_d():
    rng = np.random.default_rng(SEED + 3)
    q = rng.standard_normal((8, 2, 24)).astype(np.float32)
    k = rng.standard_normal((500, 24)).astype(np.float32) * 4
    pos = rng.integers(0, 500, 8)
    opts = dict(score_pool=8, score_type="lse")
    s1, s2 = np.zeros((8, 7), np.float32), np.zeros((8, 7), np.float32)
    a = ks.indexer_topk(q, None, k, pos, 7, scores_out=s1, **opts)
    b = ks.indexer_topk(q, None, k, pos, 7, scores_out=s2, sm_scale=float(np.float32(24**-0.5)), **opts)
    np.testing.assert_array_equal(a, b)
    assert np.array_equal(s1.view(np.uint32), s2.view(np.uint32))
    c = ks.indexer_topk(q, None, k, pos, 7, sm_scale=4.0, **opts)
    assert _sets(c) != _sets(a)  # the scale moves an lse pool's order (not a max pool's)


@pytest.mark.parametrize(
    "kwargs, arg",
    [
        (dict(score_pool=4, score_type="mean"), "score_type"),
        (dict(score_pool=1, score_type="lse"), "score_type"),
        (dict(score_type="lse"), "score_type"),
        (dict(score_pool=4, score_type="lse", sm_scale=0.0), "sm_scale"),
        (dict(score_pool=4, score_type="lse", sm_scale=-1.0), "sm_scale"),
        (dict(score_pool=4, score_type="lse", sm_scale=float("inf")), "sm_scale"),
        (dict(score_pool=4, score_type="lse", sm_scale=1e300), "sm_scale"),
        (dict(score_pool=4, sm_scale=1.0), "sm_scale"),
    ],
)
def test_refusals_name_the_argument_and_write_nothing(kwargs, arg):
    q = np.ones((2, 1, 2), np.float32)
    k = np.ones((10, 2), np.float32)
    out = np.full((2, 3), 77, np.int32)
    with pytest.raises(ks.SelectionError, match=arg) as e:
        ks.indexer_topk(q, None, k, [9, 5], 3, out=out, **kwargs)
    assert e.value.argument == arg
    assert (out == 77).all()
    with pytest.raises(ValueError, match=arg):
        ref.indexer_topk(q, None, k, [9, 5], 3, **kwargs)


def test_kvselect_check_reads_score_type_and_sm_scale(tmp_path, capsys):
    from kvselect.cli import main

    rng = np.random.default_rng(SEED + 4)
    q = rng.standard_normal((10, 4, 16)).astype(np.float32)
    k = rng.standard_normal((700, 16)).astype(np.float32)
    pos = rng.integers(0, 700, 10)
    opts = dict(score_pool=32, score_type="lse", sm_scale=0.5, activation="none", row_layout="ascending")
    rows = ks.indexer_topk(q, None, k, pos, 4, **opts)
    d = dict(
        kind="topk",
        rows=rows,
        index_q=q,
        index_k=k,
        query_pos=pos,
        score_pool=np.array(32),
        score_type=np.array("lse"),
        sm_scale=np.array(0.5),
        activation=np.array("none"),
        row_layout=np.array("ascending"),
        topk_length=(rows >= 0).sum(-1),
    )
    assert check_dump(d)["wrong"] == 0
    path = tmp_path / "lse.npz"
    checking.save_dump(path, **d)
    assert main(["check", str(path)]) == 0
    capsys.readouterr()
    mx = ks.indexer_topk(q, None, k, pos, 4, **{**opts, "score_type": "max", "sm_scale": None})
    if _sets(mx) != _sets(rows):
        assert check_dump(dict(d, rows=mx))["by_reason"]["wrong_selection"] > 0
    for change, key in (
        ({"score_type": np.array("mean")}, "score_type"),
        ({"score_pool": np.array(1)}, "score_type"),
        ({"sm_scale": np.array(-2.0)}, "sm_scale"),
        ({"score_type": np.array("max")}, "sm_scale"),
    ):
        with pytest.raises(DumpError, match=key):
            check_dump(dict(d, **change))


_CHILD = """
import sys
import numpy as np
import kvselect as ks

src, dst = sys.argv[1:3]
a = np.load(src)
out = {}
for i in range(int(a["n"])):
    opts = dict(score_pool=int(a[f"sp_{i}"]), score_type="lse", activation=str(a[f"act_{i}"]),
                force_last=int(a[f"f1_{i}"]), compress_ratio=int(a[f"m_{i}"]))
    w = a[f"w_{i}"] if f"w_{i}" in a.files else None
    topk = int(a[f"topk_{i}"])
    s = np.zeros((len(a[f"q_{i}"]), topk), np.float32)
    out[f"rows_{i}"] = ks.indexer_topk(a[f"q_{i}"], w, a[f"k_{i}"], a[f"pos_{i}"], topk, scores_out=s, **opts)
    out[f"scores_{i}"] = s
np.savez(dst, **out)
"""


@pytest.mark.parametrize("level", ["scalar", "avx2"])
def test_every_simd_level_gives_the_same_rows_and_score_bits(tmp_path, level):
    require_simd()
    rng = np.random.default_rng(SEED + 5)
    arrays, expected = {"n": np.array(24)}, {}
    for i in range(24):
        kind = ("random", "low", "ties")[i % 3]
        n, h, d, t = (
            int(rng.integers(1, 5)),
            int(rng.integers(1, 10)),
            int(rng.integers(1, 70)),
            int(rng.integers(1, 900)),
        )
        q, w, k = _operands(rng, n, h, d, t, kind)
        m, pool, topk = int(rng.choice([1, 4])), int(rng.choice([2, 16, 128])), int(rng.integers(1, 20))
        act, f1 = str(rng.choice(["relu", "none"])), int(rng.integers(0, 2))
        pos = rng.integers(0, m * t + 4, n)
        arrays.update({f"q_{i}": q, f"k_{i}": k, f"pos_{i}": pos, f"topk_{i}": np.array(topk), f"m_{i}": np.array(m)})
        arrays.update({f"sp_{i}": np.array(pool), f"act_{i}": np.array(act), f"f1_{i}": np.array(f1)})
        if w is not None:
            arrays[f"w_{i}"] = w
        s = np.zeros((n, topk), np.float32)
        opts = dict(score_pool=pool, score_type="lse", activation=act, force_last=f1, compress_ratio=m)
        expected[f"rows_{i}"] = ks.indexer_topk(q, w, k, pos, topk, scores_out=s, **opts)
        expected[f"scores_{i}"] = s
    np.savez(tmp_path / "in.npz", **arrays)
    assert_child_equals(_CHILD, tmp_path, level, expected)


def test_the_twin_pool_scores_are_sglangs_order():
    """The twin's natural-log lse (pool_scores) orders blocks as SGLang's
    base-2 scores do, on random blocks: a positive multiple (log2 e), up to
    SGLang's constant 1.4426950409 (log2 e rounded at 1e-11)."""
    rng = np.random.default_rng(SEED + 6)
    for _ in range(50):
        s = rng.standard_normal(int(rng.integers(1, 300))) * 5
        ours = ref_indexer.pool_scores(s, 16, "lse", 0.25)
        theirs = _sglang_block_scores(s, 16, 0.25)
        np.testing.assert_allclose(theirs, ours * np.log2(np.e), rtol=1e-10, atol=1e-10)
        assert np.array_equal(np.argsort(-theirs, kind="stable"), np.argsort(-ours, kind="stable"))


def test_near_ties_the_float32_screen_misorders_are_decided_within_the_bound():
    """Low-contrast data: lse blocks a few float32 ULPs apart, so the float32
    block scores misorder them; the native rows (decided by the float64
    re-scores' bounds) pass the check at ``rtol = 0`` (ties within about
    ``1e-7`` of the log either way), and ``scores_out`` is the float32 lse of
    ``indexer_scores``' blocks (within a few float32 ULPs)."""
    rng = np.random.default_rng(SEED + 7)
    changed = 0
    for trial in range(60):
        n, h, d, t = 3, int(rng.integers(1, 5)), int(rng.integers(2, 24)), int(rng.integers(1, 600))
        q, _, k = _operands(rng, n, h, d, t, "low")
        pool, topk = int(rng.choice([2, 4, 16])), int(rng.integers(1, 20))
        opts = dict(score_pool=pool, score_type="lse", sm_scale=1.0, activation="none")
        pos = rng.integers(0, t + 4, n)
        s_out = np.zeros((n, topk), np.float32)
        got = ks.indexer_topk(q, None, k, pos, topk, scores_out=s_out, **opts)
        assert check_indexer_family(got, q, None, k, pos, topk, **opts)["wrong"] == 0, trial
        sc = ks.indexer_scores(q, None, k, pos, activation="none")
        for i in range(n):
            L = int((~np.isnan(sc[i])).sum())
            blocks = ref_indexer.pool_scores(sc[i, :L].astype(np.float64), pool, "lse", 1.0).astype(np.float32)
            held = got[i] >= 0
            np.testing.assert_allclose(s_out[i, held], blocks[got[i, held]], rtol=2e-6)
            f32 = sorted(sorted(range(len(blocks)), key=lambda b: (-blocks[b], b))[:topk])
            changed += f32 != sorted(got[i][held].tolist())
    assert changed > 0
