"""The indexer family's options (issue 43; NVIDIA/cudnn-frontend#838's
``indexer_topk`` contract): ``activation="none"``, ``weights=None``, forced
first / last entries inside the budget, and cuDNN's ascending compact row
layout — on every form (dense, packed, paged, compressed entries), against
the NumPy twin written from the sources, at every SIMD level."""

import numpy as np
import pytest
from levels import assert_child_equals, require_simd

import kvselect as ks
from kvselect import reference as ref
from kvselect.reference import indexer as ref_indexer

SEED = 20261243


def _sets(rows):
    return [sorted(r[r >= 0].tolist()) for r in rows]


def _random_options(rng, topk, segs):
    budget = max(topk - segs, 0)
    f0 = int(rng.integers(0, budget + 1)) if rng.random() < 0.7 else 0
    f1 = int(rng.integers(0, budget - f0 + 1)) if rng.random() < 0.7 else 0
    return dict(
        activation=str(rng.choice(["relu", "none"])),
        force_first=f0,
        force_last=f1,
        row_layout=str(rng.choice(["rank", "ascending"])),
        score_pool=int(rng.choice([1, 1, 2, 3, 8])) if segs == 0 else 1,
    )


def _operands(rng, n, h, d, t, ties):
    q = rng.standard_normal((n, h, d)).astype(np.float32)
    k = rng.standard_normal((t, d)).astype(np.float32)
    if ties:  # few distinct values: exact ties, zero and negative plateaus
        q, k = np.round(q), np.round(k * 0.7)
    w = None if rng.random() < 0.5 else rng.uniform(-1, 1.5, (n, h)).astype(np.float32)
    return q, w, k


def _same(got, want, layout):
    if layout == "ascending":  # one answer per row: compare exactly
        np.testing.assert_array_equal(got, want)
    else:  # rank order is the float32 scores' (the twin ranks float64): the sets
        assert _sets(got) == _sets(want)


def test_dense_rows_equal_the_reference_on_random_and_adversarial_inputs():
    rng = np.random.default_rng(SEED)
    for trial in range(400):
        n, h, d, t = (
            int(rng.integers(1, 5)),
            int(rng.integers(1, 7)),
            int(rng.integers(1, 24)),
            int(rng.integers(0, 260)),
        )
        ties = trial % 3 == 0
        q, w, k = _operands(rng, n, h, d, t, ties)
        m = int(rng.choice([1, 4]))
        # Visible counts below the forced entries and p < ratio - 1 (no entry yet) included.
        pos = rng.integers(0, m * (t + 2), n) if trial % 2 else rng.integers(0, 3 * m, n)
        topk, segs = int(rng.integers(1, 40)), int(rng.choice([0, 0, 0, 3]))
        opts = _random_options(rng, topk, segs)
        kw = dict(num_segments=segs, compress_ratio=m, **opts)
        s_got = np.zeros((n, topk), np.float32)
        got = ks.indexer_topk(q, w, k, pos, topk, scores_out=s_got, **kw)
        want = ref.indexer_topk(q, w, k, pos, topk, **kw)
        _same(got, want, opts["row_layout"])
        if opts["row_layout"] == "rank" and segs == 0:
            # Listed in the float32 scores' one total order, forced entries included.
            for row, sc in zip(got, s_got):
                mask = row >= 0
                assert np.array_equal(np.lexsort((row[mask], -sc[mask])), np.arange(mask.sum()))


def test_forced_entries_are_members_once_inside_the_budget():
    """A row that cannot hold every visible entry holds the forced ones and
    ``topk`` entries in all; a row whose visible count fits the budget holds
    each visible entry once (a forced prefix and suffix that overlap are not
    counted twice); a query that sees nothing gets a row of -1."""
    rng = np.random.default_rng(SEED + 1)
    h, d, t, topk = 3, 8, 40, 6
    q = rng.standard_normal((t, h, d)).astype(np.float32)
    k = rng.standard_normal((t, d)).astype(np.float32)
    pos = np.arange(t)
    for f0, f1 in [(0, 0), (2, 0), (0, 3), (2, 3), (3, 3), (6, 0), (0, 6)]:
        for m in (1, 4):
            rows = ks.indexer_topk(q, None, k, pos, topk, compress_ratio=m, force_first=f0, force_last=f1)
            for p, row in zip(pos, rows):
                L = min((p + 1) // m, t)
                members = row[row >= 0].tolist()
                assert len(members) == len(set(members)) == min(L, topk)
                if L > topk:
                    forced = set(range(f0)) | set(range(L - f1, L))
                    assert forced <= set(members), (f0, f1, m, p)
                else:
                    assert sorted(members) == list(range(L))


def test_forced_entries_win_over_better_scores():
    """The forced entries are in the row even when every other entry scores
    above them: the budget left is the best of the middle."""
    d = 4
    k = np.zeros((10, d), np.float32)
    k[:, 0] = np.arange(10, dtype=np.float32)  # score rises with the position
    k[[0, 9], 0] = -5  # the forced ends score lowest
    q = np.ones((1, 1, d), np.float32)
    row = ks.indexer_topk(q, None, k, 9, 4, activation="none", force_first=1, force_last=1)
    assert row[0].tolist() == [8, 7, 0, 9]  # rank order: 8, 7, then the two at -5 (lower position first)
    asc = ks.indexer_topk(q, None, k, 9, 4, activation="none", force_first=1, force_last=1, row_layout="ascending")
    assert asc[0].tolist() == [0, 7, 8, 9]


def test_activation_none_ranks_negative_scores_and_relu_zeroes_them():
    k = np.array([[-3.0], [-1.0], [-2.0], [0.5]], np.float32)
    q = np.ones((1, 1, 1), np.float32)
    assert ks.indexer_topk(q, None, k, 3, 3, activation="none")[0].tolist() == [3, 1, 2]
    # Under the ReLU the three negatives tie at 0: to the lower positions.
    assert ks.indexer_topk(q, None, k, 3, 3)[0].tolist() == [3, 0, 1]
    sc = ks.indexer_scores(q, None, k, 3, activation="none")
    np.testing.assert_array_equal(sc[0], k[:, 0])


def test_no_weights_is_weights_of_one_bit_for_bit_every_form():
    rng = np.random.default_rng(SEED + 2)
    n, h, d, t, topk = 6, 4, 16, 300, 20
    q = rng.standard_normal((n, h, d)).astype(np.float32)
    k = rng.standard_normal((t, d)).astype(np.float32)
    ones = np.ones((n, h), np.float32)
    pos = rng.integers(0, t, n)
    for act in ("relu", "none"):
        a_s, b_s = np.zeros((n, topk), np.float32), np.zeros((n, topk), np.float32)
        a = ks.indexer_topk(q, None, k, pos, topk, activation=act, scores_out=a_s)
        b = ks.indexer_topk(q, ones, k, pos, topk, activation=act, scores_out=b_s)
        np.testing.assert_array_equal(a, b)
        assert np.array_equal(a_s.view(np.uint32), b_s.view(np.uint32))
        sa = ks.indexer_scores(q, None, k, pos, activation=act)
        sb = ks.indexer_scores(q, ones, k, pos, activation=act)
        assert np.array_equal(sa.view(np.uint32), sb.view(np.uint32))
    cu = np.array([0, 100, t])
    sid = np.array([0, 1, 1, 0, 1, 0])
    pk = ks.indexer_topk_packed(q, None, k, cu, sid, pos % 100, topk, force_last=2)
    pk1 = ks.indexer_topk_packed(q, ones, k, cu, sid, pos % 100, topk, force_last=2)
    np.testing.assert_array_equal(pk, pk1)
    np.testing.assert_array_equal(ks.indexer_magnitudes(q, None, k, pos), ks.indexer_magnitudes(q, ones, k, pos))


def _pages(rng, keys_per_seq, d, bs):
    """A dense paged cache holding each sequence's keys, pages shuffled."""
    need = [-(-len(k) // bs) for k in keys_per_seq]
    n_pages = sum(need) + 2
    cache = rng.standard_normal((n_pages, bs, d)).astype(np.float32)
    order = rng.permutation(n_pages)
    table = np.full((len(keys_per_seq), max(need + [1])), -1, np.int32)
    at = 0
    for s, keys in enumerate(keys_per_seq):
        for p in range(need[s]):
            page = order[at]
            at += 1
            table[s, p] = page
            chunk = keys[p * bs : (p + 1) * bs]
            cache[page, : len(chunk)] = chunk
    return cache, table


def test_packed_and_paged_forms_equal_the_dense_rows_and_the_reference():
    rng = np.random.default_rng(SEED + 3)
    for trial in range(60):
        h, d, bs = int(rng.integers(1, 5)), int(rng.integers(1, 12)), int(rng.choice([1, 4, 16]))
        lens = rng.integers(0, 120, int(rng.integers(1, 4)))
        keys = [rng.standard_normal((int(L), d)).astype(np.float32) for L in lens]
        if trial % 2:
            keys = [np.round(k) for k in keys]
        n = int(rng.integers(1, 6))
        sid = rng.integers(0, len(lens), n)
        m = int(rng.choice([1, 4]))
        pos = rng.integers(0, m * 130, n)
        q = rng.standard_normal((n, h, d)).astype(np.float32)
        w = None if trial % 3 else rng.uniform(0.2, 1, (n, h)).astype(np.float32)
        topk = int(rng.integers(1, 30))
        opts = _random_options(rng, topk, 0)
        cache, table = _pages(rng, keys, d, bs)
        paged = ks.indexer_topk_paged(q, w, cache, table, lens, sid, pos, topk, compress_ratio=m, **opts)
        want = ref.indexer_topk_paged(q, w, cache, table, lens, sid, pos, topk, compress_ratio=m, **opts)
        _same(paged, want, opts["row_layout"])
        cu = np.concatenate([[0], np.cumsum(lens)])
        k_all = np.concatenate(keys) if len(keys) else np.zeros((0, d), np.float32)
        packed = ks.indexer_topk_packed(q, w, k_all, cu, sid, pos, topk, compress_ratio=m, **opts)
        np.testing.assert_array_equal(packed, paged)
        for i in range(n):
            s = sid[i]
            wi = None if w is None else w[i : i + 1]
            dense = ks.indexer_topk(q[i : i + 1], wi, keys[s], pos[i], topk, compress_ratio=m, **opts)
            np.testing.assert_array_equal(dense[0], packed[i])


def test_the_ascending_layout_is_the_rank_rows_sorted_and_compact():
    rng = np.random.default_rng(SEED + 4)
    q = rng.standard_normal((30, 2, 8)).astype(np.float32)
    k = rng.standard_normal((90, 8)).astype(np.float32)
    pos = rng.integers(0, 100, 30)
    for segs in (0, 4):
        rank = ks.indexer_topk(q, None, k, pos, 16, num_segments=segs, force_last=1)
        asc = ks.indexer_topk(q, None, k, pos, 16, num_segments=segs, force_last=1, row_layout="ascending")
        for r, a in zip(rank, asc):
            n = int((a >= 0).sum())  # cuDNN's topk_length
            assert (a[:n] >= 0).all() and (a[n:] == -1).all()
            assert np.all(np.diff(a[:n]) > 0)
            assert a[:n].tolist() == sorted(r[r >= 0].tolist())


@pytest.mark.parametrize(
    "kwargs, arg",
    [
        (dict(activation="gelu"), "activation"),
        (dict(row_layout="cudnn"), "row_layout"),
        (dict(force_first=9), "force_first"),
        (dict(force_first=4, force_last=5), "force_last"),
        (dict(force_first=2, force_last=2, num_segments=6), "force_last"),
        (dict(force_first=-1), "force_first"),
        (dict(score_pool=0), "score_pool"),
        (dict(score_pool=2, num_segments=1), "score_pool"),
    ],
)
def test_refusals_name_the_argument_and_write_nothing(kwargs, arg):
    rng = np.random.default_rng(SEED + 5)
    q = rng.standard_normal((2, 2, 4)).astype(np.float32)
    k = rng.standard_normal((20, 4)).astype(np.float32)
    out = np.full((2, 8), 7, np.int32)
    with pytest.raises(ValueError, match=arg) as e:
        ks.indexer_topk(q, None, k, [5, 19], 8, out=out, **kwargs)
    assert getattr(e.value, "argument", arg) == arg
    assert (out == 7).all()
    with pytest.raises(ValueError, match=arg):
        ref.indexer_topk(q, None, k, [5, 19], 8, **kwargs)


def test_the_options_unused_are_todays_call():
    """The defaults spelt out are the call without them, bit for bit."""
    rng = np.random.default_rng(SEED + 6)
    q = rng.standard_normal((8, 3, 16)).astype(np.float32)
    w = rng.standard_normal((8, 3)).astype(np.float32)
    k = rng.standard_normal((500, 16)).astype(np.float32)
    pos = rng.integers(0, 500, 8)
    a_s, b_s = np.zeros((8, 32), np.float32), np.zeros((8, 32), np.float32)
    a = ks.indexer_topk(q, w, k, pos, 32, scores_out=a_s)
    b = ks.indexer_topk(
        q, w, k, pos, 32, activation="relu", force_first=0, force_last=0, row_layout="rank", scores_out=b_s
    )
    np.testing.assert_array_equal(a, b)
    assert np.array_equal(a_s.view(np.uint32), b_s.view(np.uint32))


def test_qsa_is_dense_up_to_its_budget_and_a_top_512_past_it():
    """Qwen's QSA (huggingface/transformers, models/qwen4_exp,
    ``Qwen4ExpTextQSAIndexer.forward``): ``block_topk = 2048 // 4 = 512``
    complete blocks, ``scores.topk(min(512, num_complete_blocks))`` — so a
    query that sees at most 512 complete blocks keeps them all. In entries:
    ``compress_ratio=4``, ``topk=512``, no weights."""
    rng = np.random.default_rng(SEED + 7)
    t = 600
    q = rng.standard_normal((4, 4, 16)).astype(np.float32)
    k = rng.standard_normal((t, 16)).astype(np.float32)
    pos = np.array([2, 2050, 2051, 2399])  # 0, 512, 513 and 600 complete blocks
    rows = ks.indexer_topk(q, None, k, pos, 512, compress_ratio=4, row_layout="ascending")
    assert (rows[0] == -1).all()
    assert rows[1].tolist() == list(range(512))
    for row, blocks in zip(rows[2:], (513, 600)):
        assert (row >= 0).all() and len(set(row.tolist())) == 512 and row.max() < blocks
    want = ref.indexer_topk(q, None, k, pos, 512, compress_ratio=4, row_layout="ascending")
    np.testing.assert_array_equal(rows, want)


_CHILD = """
import sys
import numpy as np
import kvselect as ks
src, dst = sys.argv[1], sys.argv[2]
a = np.load(src)
res = {}
for i in range(int(a["n"])):
    w = a[f"w_{i}"] if f"w_{i}" in a else None
    kw = dict(activation=str(a[f"act_{i}"]), force_first=int(a[f"f0_{i}"]), force_last=int(a[f"f1_{i}"]),
              row_layout=str(a[f"lay_{i}"]), compress_ratio=int(a[f"m_{i}"]), score_pool=int(a[f"sp_{i}"]))
    s = np.zeros((len(a[f"pos_{i}"]), int(a[f"topk_{i}"])), np.float32)
    res[f"rows_{i}"] = ks.indexer_topk(a[f"q_{i}"], w, a[f"k_{i}"], a[f"pos_{i}"], int(a[f"topk_{i}"]), scores_out=s, **kw)
    res[f"scores_{i}"] = s
np.savez(dst, **res)
"""


@pytest.mark.parametrize("level", ["scalar", "avx2"])
def test_every_simd_level_gives_the_same_rows_and_score_bits_with_the_options(tmp_path, level):
    require_simd()
    rng = np.random.default_rng(SEED + 8)
    arrays, expected = {"n": np.array(30)}, {}
    for i in range(30):
        n, h, d, t = (
            int(rng.integers(1, 5)),
            int(rng.integers(1, 14)),
            int(rng.integers(1, 70)),
            int(rng.integers(1, 400)),
        )
        q, w, k = _operands(rng, n, h, d, t, ties=i % 3 == 0)
        m = int(rng.choice([1, 4]))
        pos = rng.integers(0, m * t + 4, n)
        topk = int(rng.integers(1, 60))
        opts = _random_options(rng, topk, 0)
        arrays.update({f"q_{i}": q, f"k_{i}": k, f"pos_{i}": pos, f"topk_{i}": np.array(topk), f"m_{i}": np.array(m)})
        arrays.update({f"act_{i}": np.array(opts["activation"]), f"lay_{i}": np.array(opts["row_layout"])})
        arrays.update({f"f0_{i}": np.array(opts["force_first"]), f"f1_{i}": np.array(opts["force_last"])})
        arrays[f"sp_{i}"] = np.array(opts["score_pool"])
        if w is not None:
            arrays[f"w_{i}"] = w
        s = np.zeros((n, topk), np.float32)
        expected[f"rows_{i}"] = ks.indexer_topk(q, w, k, pos, topk, compress_ratio=m, scores_out=s, **opts)
        expected[f"scores_{i}"] = s
    np.savez(tmp_path / "in.npz", **arrays)
    assert_child_equals(_CHILD, tmp_path, level, expected)


def test_the_exact_check_accepts_activation_none_rows_with_their_scores():
    """Rows under activation none pass ``check_topk`` against the exact
    float64 scores the twin computes (the row is the real-arithmetic top-k)."""
    rng = np.random.default_rng(SEED + 9)
    q = rng.standard_normal((20, 3, 12)).astype(np.float32)
    k = rng.standard_normal((200, 12)).astype(np.float32)
    pos = rng.integers(0, 200, 20)
    rows = ks.indexer_topk(q, None, k, pos, 24, activation="none")
    exact = np.full((20, 200), np.nan)
    for i in range(20):
        L = min(int(pos[i]) + 1, 200)
        exact[i, :L] = ref_indexer.head_sum_scores(
            q[i].astype(np.float64), np.ones(3), k[:L].astype(np.float64), relu=False
        )
    report = ks.check_topk(exact, rows, np.minimum(pos + 1, 200), topk=24)
    assert report["wrong"] == 0, report.summary()


# ---- the check and the cases ---------------------------------------------------

from kvselect.checking import check_indexer_family  # noqa: E402
from kvselect.testing import CheckFailure, cases  # noqa: E402

FAMILY = cases.all_family_cases()


def _run(case):
    inputs = dict(case.inputs)
    return (ks.indexer_topk_packed if "cu_seqlens" in inputs else ks.indexer_topk)(**inputs)


@pytest.mark.parametrize("case", cases.pytest_params(FAMILY))
def test_every_family_cases_answer_and_kvselects_rows_pass(case):
    case.assert_rows(case.expected)
    rows = _run(case)
    case.assert_rows(rows)
    assert _sets(rows) == _sets(case.expected)


def _forced_of(case, i):
    inputs = case.inputs
    m = int(inputs.get("compress_ratio", 1))
    pos = int(np.asarray(inputs["query_pos"])[i])
    if "cu_seqlens" in inputs:
        cu, sid = inputs["cu_seqlens"], inputs["seq_ids"]
        t = int(cu[sid[i] + 1] - cu[sid[i]])
    else:
        t = len(inputs["index_k"])
    L = min((pos + 1) // m, t)
    f0, f1 = int(inputs.get("force_first", 0)), int(inputs.get("force_last", 0))
    if L <= int(inputs["topk"]):
        return L, []
    return L, list(range(f0)) + list(range(L - f1, L))


def test_a_dropped_forced_entry_is_named():
    case = cases.forced_entry_dropped()
    rows = case.expected.copy()
    planted = 0
    for i, row in enumerate(rows):
        L, forced = _forced_of(case, i)
        if forced:
            spare = sorted(set(range(L)) - set(row.tolist()))[0]  # a visible entry the row does not hold
            row[row == forced[-1]] = spare
            planted += 1
    assert planted >= 3
    with pytest.raises(CheckFailure, match="forced_dropped") as e:
        case.assert_rows(rows)
    assert e.value.report["by_reason"]["forced_dropped"] == planted


def test_a_forced_entry_counted_twice_is_named():
    case = cases.forced_entry_counted_twice()
    rows = case.expected.copy()
    # A row whose forced prefix and suffix overlap (L < topk): the naive writer's row,
    # the first half then the last half, an entry twice and the row short.
    topk, f0, f1 = 8, 4, 4
    L = 6
    assert rows[L].tolist() == list(range(L)) + [-1, -1]
    naive = sorted(list(range(min(f0, L))) + list(range(L - min(f1, L), L)))
    rows[L] = naive
    with pytest.raises(CheckFailure, match="duplicate") as e:
        case.assert_rows(rows)
    assert e.value.report["details"][0]["row"] == L
    assert topk == case.inputs["topk"]


def test_the_partial_blocks_entry_is_not_causal():
    case = cases.pool_last_partial_block()
    rows = case.expected.copy()
    m = case.inputs["compress_ratio"]
    pos = case.inputs["query_pos"]
    i = int(np.flatnonzero(pos >= 8 * m)[0])
    rows[i, -1] = pos[i] // m  # the entry of the block the query's token is filling
    with pytest.raises(CheckFailure, match="not_causal"):
        case.assert_rows(rows)


def test_right_rows_pass_in_both_layouts_and_a_wrong_order_is_named():
    rng = np.random.default_rng(SEED + 10)
    q = rng.standard_normal((12, 4, 16)).astype(np.float32)
    k = rng.standard_normal((300, 16)).astype(np.float32)
    pos = rng.integers(0, 1200, 12)
    opts = dict(compress_ratio=4, force_last=1)
    rank = ks.indexer_topk(q, None, k, pos, 32, **opts)
    asc = ks.indexer_topk(q, None, k, pos, 32, row_layout="ascending", **opts)
    assert check_indexer_family(rank, q, None, k, pos, **opts)["wrong"] == 0
    assert check_indexer_family(asc, q, None, k, pos, row_layout="ascending", **opts)["wrong"] == 0
    # The rank rows are right sets but not ascending: named as such.
    report = check_indexer_family(rank, q, None, k, pos, row_layout="ascending", **opts)
    assert report["by_reason"]["not_ascending"] == report["wrong"] > 0
    assert report["by_reason"]["wrong_selection"] == 0
    # A real intruder: swap one member for a visible non-member.
    bad = asc.copy()
    L = (pos[0] + 1) // 4
    outsider = sorted(set(range(min(L, 300))) - set(bad[0].tolist()))[0]
    bad[0, 1] = outsider
    bad[0, : (bad[0] >= 0).sum()] = np.sort(bad[0, : (bad[0] >= 0).sum()])
    report = check_indexer_family(bad, q, None, k, pos, row_layout="ascending", **opts)
    assert report["wrong"] == 1 and report["by_reason"]["wrong_selection"] == 1


def test_the_qsa_policy_is_the_top_blocks_of_mean_pooled_keys_plus_the_partial_block():
    """The eval's QSA policy, against QSA's rule written out here from
    Qwen4ExpTextQSAIndexer.forward: pooled keys (float32 mean of 4 tokens),
    Σ_h relu(q_h · k̄) without weights, the top blocks as their 4 tokens, then
    the (p + 1) mod 4 tokens of the partial block."""
    from types import SimpleNamespace

    from kvselect.rules import EvalContext
    from kvselect.rules.compressed import qsa

    rng = np.random.default_rng(SEED + 11)
    t, d = 203, 16
    index_k = rng.standard_normal((t, d)).astype(np.float32)
    pos = np.array([0, 2, 3, 57, 130, 202])
    index_q = rng.standard_normal((len(pos), d)).astype(np.float32)
    units = 4 * 9 + 3  # 9 blocks and the tail
    ctx = EvalContext(SimpleNamespace(index_q=index_q, index_k=index_k), pos, None, units, {})
    rows = qsa(ctx).rows
    assert rows.shape == (len(pos), units) and rows.dtype == np.int32
    pooled = index_k[: t // 4 * 4].reshape(-1, 4, d).astype(np.float64).mean(axis=1)
    for i, p in enumerate(pos):
        complete = (p + 1) // 4
        s = np.maximum(pooled[:complete] @ index_q[i].astype(np.float64), 0)
        best = sorted(np.lexsort((np.arange(complete), -s))[:9].tolist())
        want = sorted([4 * b + j for b in best for j in range(4)] + list(range(4 * complete, p + 1)))
        got = rows[i][rows[i] >= 0]
        assert sorted(got.tolist()) == want, p
        assert (rows[i, len(got) :] == -1).all()
    # Below one block and a full tail (7 tokens) the block shrinks to (k + 1) // 2 tokens:
    # at k = 6, blocks of 3 (one block and a tail of up to 2).
    small = qsa(EvalContext(ctx.head, pos, None, 6, {})).rows
    for i, p in enumerate(pos):
        got = sorted(small[i][small[i] >= 0].tolist())
        tail = list(range((p + 1) // 3 * 3, p + 1))
        assert got[len(got) - len(tail) :] == tail and len(got) == len(tail) + 3 * min(1, (p + 1) // 3)


# ---- the score pool: MiniMax-M3's block rule as the indexer with a pool -------------------


def test_minimax_block_rule_is_the_pooled_indexer_row_for_row():
    """One rule, two spellings: kvselect's native MiniMax-M3 block selection
    (per KV head one index head, block max-pool over the causally visible
    positions, init / local blocks forced inside the budget, ties to the lower
    id) equals the twin's indexer with ``score_pool=block_size``,
    ``activation="none"``, ``weights=None``, ``force_first=init_blocks``,
    ``force_last=local_blocks``, ascending — random and integer (exactly tied)
    data, partial last blocks, queries past the keys."""
    rng = np.random.default_rng(SEED + 12)
    for trial in range(200):
        hk, d, t = int(rng.integers(1, 4)), int(rng.integers(1, 16)), int(rng.integers(1, 400))
        bs, top = int(rng.choice([4, 8, 16])), int(rng.integers(1, 12))
        init, local = int(rng.integers(0, 3)), int(rng.integers(0, 3))
        cfg = ks.BlockSparseConfig(block_size=bs, top_blocks=top, init_blocks=init, local_blocks=local)
        n = int(rng.integers(1, 4))
        q = rng.standard_normal((n, hk, d)).astype(np.float32)
        k = rng.standard_normal((t, d)).astype(np.float32)
        if trial % 3 == 0:
            q, k = np.round(q), np.round(k)
        pos = rng.integers(0, t + 3, n)
        native = ks.block_sparse_select(q, k, pos, cfg)
        width = native.shape[-1]
        pooled = ref.indexer_topk_pooled(
            q.reshape(n * hk, 1, d),
            None,
            k,
            np.repeat(pos, hk),
            width,
            score_pool=bs,
            activation="none",
            force_first=init,
            force_last=local,
            row_layout="ascending",
        )
        np.testing.assert_array_equal(native.reshape(n * hk, width), pooled, err_msg=f"trial {trial}")


def test_the_lse_pool_counts_every_position_and_the_max_pool_the_best():
    """SGLang's ``score_type="lse"``: a block of many good positions (5, 5,
    5, 5) beats a block of one better one (6), which wins under ``max``; a NaN
    makes an lse block ``-inf`` and is absent from a max block; the partial
    last block (7 alone) is scored over the positions it holds."""
    values = np.array([0, 0, 0, 6, 5, 5, 5, 5, 1, np.nan, 0, 0, 7], np.float32)  # blocks of 4
    q = np.ones((1, 1, 1), np.float32)
    k = values[:, None]
    run = dict(score_pool=4, activation="none", sm_scale=1.0)
    assert ref.indexer_topk_pooled(q, None, k, 12, 4, **run).tolist() == [[3, 0, 1, 2]]  # max (default)
    assert ref.indexer_topk_pooled(q, None, k, 12, 4, score_type="lse", **run).tolist() == [[3, 1, 0, 2]]
    blocks = ref_indexer.pool_scores(values.astype(np.float64), 4, "lse", 1.0)
    np.testing.assert_allclose(blocks[:2], [np.log(3 + np.exp(6)), np.log(4 * np.exp(5))])
    assert blocks[2] == -np.inf and blocks[3] == 7
    assert ref_indexer.pool_scores(values.astype(np.float64), 4, "max")[2] == 1
    with pytest.raises(ValueError, match="score_type"):
        ref.indexer_topk_pooled(q, None, k, 12, 2, score_pool=4, score_type="mean")


def test_the_native_score_pool_is_minimax_block_rule_row_for_row():
    """The score pool natively: ``indexer_topk(score_pool=block_size, activation="none",
    weights=None, force_first=init, force_last=local, row_layout="ascending")`` on one index
    head per KV head gives ``block_sparse_select``'s rows — two native implementations (the
    block engine's 8-lane sums, the indexer's FMA chains), one exact rule."""
    rng = np.random.default_rng(SEED + 13)
    for trial in range(150):
        hk, d, t = int(rng.integers(1, 4)), int(rng.integers(1, 40)), int(rng.integers(1, 700))
        bs, top = int(rng.choice([3, 8, 16, 128])), int(rng.integers(1, 12))
        init, local = int(rng.integers(0, 3)), int(rng.integers(0, 3))
        cfg = ks.BlockSparseConfig(block_size=bs, top_blocks=top, init_blocks=init, local_blocks=local)
        n = int(rng.integers(1, 4))
        if trial % 2:  # low contrast: block maxima a few float32 ULPs apart
            q, _, k = _low_contrast(rng, n * hk, 1, d, t)
            q = q.reshape(n, hk, d)
        else:
            q = rng.standard_normal((n, hk, d)).astype(np.float32)
            k = rng.standard_normal((t, d)).astype(np.float32)
        pos = rng.integers(0, t + 3, n)
        native = ks.block_sparse_select(q, k, pos, cfg)
        width = native.shape[-1]
        pooled = ks.indexer_topk(
            q.reshape(n * hk, 1, d),
            None,
            k,
            np.repeat(pos, hk),
            width,
            score_pool=bs,
            activation="none",
            force_first=init,
            force_last=local,
            row_layout="ascending",
        )
        np.testing.assert_array_equal(native.reshape(n * hk, width), pooled, err_msg=f"trial {trial}")


def _low_contrast(rng, n, h, d, t):
    """Scores a few float32 ULPs apart: ``k_t = base + tiny`` (as test_exact_selection's)."""
    base = rng.standard_normal(d).astype(np.float32)
    k = (base + rng.integers(-3, 4, (t, d)) * np.float32(2.0**-22)).astype(np.float32)
    q = (np.abs(rng.standard_normal((n, h, d))) * np.sign(base)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, (n, h)).astype(np.float32)
    return q, w, k


def test_pooled_rows_are_the_real_max_pool_top_k_where_float32_rounding_decides():
    """On low-contrast data the float32 block maxima misorder near ties; the
    pooled rows are still the real-arithmetic top blocks: the twin's (float64)
    sets and the exact check at ``rtol = 0``; ``scores_out`` holds the blocks'
    float32 max-pool of ``indexer_scores``."""
    rng = np.random.default_rng(SEED + 14)
    changed = 0
    for trial in range(80):
        n, h, d, t = 3, int(rng.integers(1, 5)), int(rng.integers(2, 24)), int(rng.integers(1, 600))
        q, w, k = _low_contrast(rng, n, h, d, t)
        w = None if trial % 2 else w
        pool, topk = int(rng.choice([2, 4, 16])), int(rng.integers(1, 20))
        opts = dict(
            score_pool=pool, activation=str(rng.choice(["relu", "none"])), compress_ratio=int(rng.choice([1, 4]))
        )
        pos = rng.integers(0, opts["compress_ratio"] * t + 4, n)
        s_out = np.zeros((n, topk), np.float32)
        got = ks.indexer_topk(q, w, k, pos, topk, scores_out=s_out, **opts)
        want = ref.indexer_topk(q, w, k, pos, topk, **opts)
        assert _sets(got) == _sets(want), trial
        report = check_indexer_family(got, q, w, k, pos, topk, **opts)
        assert report["wrong"] == 0, report["details"][:2]
        sc = ks.indexer_scores(q, w, k, pos, activation=opts["activation"], compress_ratio=opts["compress_ratio"])
        for i in range(n):
            L = int((~np.isnan(sc[i])).sum())
            blocks = [np.float32(np.max(sc[i, b * pool : min((b + 1) * pool, L)])) for b in range(-(-L // pool))]
            for slot, b in enumerate(got[i]):
                if b >= 0:
                    assert s_out[i, slot] == blocks[b]
            f32 = sorted(sorted(range(len(blocks)), key=lambda b: (-blocks[b], b))[:topk])
            changed += f32 != sorted(got[i][got[i] >= 0].tolist())
    assert changed > 0  # the data really hold near ties float32 decides wrongly


def test_the_pools_refusals_name_it():
    q = np.ones((1, 1, 2), np.float32)
    k = np.ones((10, 2), np.float32)
    for kw in (dict(score_pool=0), dict(score_pool=4, num_segments=2)):
        with pytest.raises(ValueError, match="score_pool"):
            ks.indexer_topk(q, None, k, 9, 4, **kw)
        with pytest.raises(ValueError, match="score_pool"):
            ref.indexer_topk(q, None, k, 9, 4, **kw)
