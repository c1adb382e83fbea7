"""kvselect.testing.cases: every case has the property it claims, its
expected answer passes its assertion, and a perturbed answer fails it for
the right reason."""

import numpy as np
import pytest

import kvselect as ks
from kvselect.testing import CheckFailure, cases

TOPK = cases.all_topk_cases()
BLOCKS = cases.all_block_cases()
WITNESSES = cases.all_witness_cases()
BY_ID = dict(TOPK)


def ulp32(x):
    x = np.abs(np.float32(x))
    return float(np.nextafter(x, np.float32(np.inf)) - x)


def threshold(case, row=0):
    """The row's exact min(topk, L)-th best score."""
    L = int(case.context_lens[row])
    m = min(int(case.inputs["topk"]), L)
    return case.scores[row, case.expected[row, m - 1]]


def perturbed(case):
    """A wrong answer and the reason the check must give: a winner dropped
    for the best loser where some row's line separates them, else a
    duplicate (rows every selection of the right size passes)."""
    topk = int(case.inputs["topk"])
    for i, L in enumerate(case.context_lens):
        if L <= topk:
            continue
        s = case.scores[i, :L]
        chosen, best = case.expected[i, 0], case.expected[i]
        loser = np.setdiff1d(np.arange(L), best)
        ls = np.where(np.isnan(s[loser]), -np.inf, s[loser])
        b = loser[np.argmax(ls)]
        if s[chosen] > s[b] or (np.isfinite(s[chosen]) and np.isnan(s[b])):
            bad = case.expected.copy()
            bad[i, 0] = b
            return bad, "wrong selection: dropped 1"
    i = int(np.argmax(case.context_lens))
    bad = case.expected.copy()
    bad[i, 1] = bad[i, 0]
    return bad, "duplicate"


@pytest.mark.parametrize("case", cases.pytest_params(TOPK + BLOCKS + WITNESSES))
def test_every_cases_expected_answer_passes_its_assertion(case):
    report = case.assert_rows(case.expected)
    assert report["wrong"] == 0


@pytest.mark.parametrize("case", cases.pytest_params(TOPK))
def test_a_perturbed_topk_answer_fails_with_the_reason_in_the_message(case):
    bad, reason = perturbed(case)
    with pytest.raises(CheckFailure) as info:
        case.assert_rows(bad)
    assert reason in str(info.value)
    assert info.value.report["wrong"] == 1


@pytest.mark.parametrize("case", cases.pytest_params(BLOCKS))
def test_a_perturbed_block_answer_fails_as_a_duplicate(case):
    bad = case.expected.copy()
    bad[-1, 0, 1] = bad[-1, 0, 0]
    with pytest.raises(CheckFailure, match="duplicate"):
        case.assert_rows(bad)


@pytest.mark.parametrize("case", cases.pytest_params(WITNESSES))
def test_a_touched_kept_prefix_fails_the_witness_check(case):
    bad = case.expected.copy()
    bad[-1, 0] += 1
    with pytest.raises(CheckFailure, match="prefix changed"):
        case.assert_rows(bad)


@pytest.mark.parametrize("case", cases.pytest_params([p for p in TOPK if p[1].form in ("dense", "compressed")]))
def test_the_expected_answer_is_kvselects_indexer_top_k(case):
    a = case.inputs
    got = ks.indexer_topk(
        a["index_q"],
        a["weights"],
        a["index_k"],
        a["query_pos"],
        a["topk"],
        key_scale=a.get("key_scale"),
        compress_ratio=a.get("compress_ratio", 1),
    )
    assert np.array_equal(got, case.expected)


@pytest.mark.parametrize(
    "case",
    cases.pytest_params([p for p in TOPK if p[1].form in ("dense", "compressed") and not p[1].meta.get("non_finite")]),
)
def test_float32_scores_in_a_shuffled_order_are_the_exact_ones(case):
    """Exact by construction: any summation order gives the float64 score."""
    import ml_dtypes  # noqa: F401  (the keys' dtypes)

    a = case.inputs
    rng = np.random.default_rng(1)
    q = np.asarray(a["index_q"], dtype=np.float32)[0]
    w = np.asarray(a["weights"], dtype=np.float32)[0]
    k = np.asarray(a["index_k"], dtype=np.float32)
    L = int(case.context_lens[0])
    total = np.zeros(L, dtype=np.float32)
    for h in rng.permutation(len(w)):
        dot = np.zeros(L, dtype=np.float32)
        for i in rng.permutation(q.shape[1]):
            dot = dot + q[h, i] * k[:L, i]
        total = total + w[h] * np.maximum(dot, np.float32(0))
    if "key_scale" in a:
        total = total * np.broadcast_to(np.asarray(a["key_scale"], dtype=np.float32), (len(k),))[:L]
    assert np.array_equal(total.astype(np.float64), case.scores[0, :L])


def base_cases(name):
    return [c for _, c in TOPK if c.id.startswith(name)]


def test_every_generator_is_run_at_scores_times_two_to_the_plus_and_minus_30_with_the_same_answer():
    families = {}
    for _, c in TOPK:
        if c.meta.get("non_finite"):
            continue
        families.setdefault(c.id.rsplit("-x2^", 1)[0], []).append(c)
    assert len(families) >= 14
    for name, group in families.items():
        exps = sorted(c.meta["scale_exp"] for c in group)
        assert exps[-1] - exps[0] == 60, name
        assert all(np.array_equal(c.expected, group[0].expected) for c in group), name
        s0 = group[0].scores
        for c in group[1:]:
            ratio = 2.0 ** (c.meta["scale_exp"] - group[0].meta["scale_exp"])
            assert np.array_equal(c.scores, s0 * ratio, equal_nan=True), name


def test_the_tail_lengths_are_never_multiples_of_8_outside_the_short_context_cases():
    for _, c in TOPK:
        if c.id.startswith("short_contexts"):
            continue
        assert np.all(c.context_lens % 8 != 0), c.id
    lens = cases.tail_lengths(1029)
    assert len(set((lens % 8).tolist())) == len(lens) == 7 and lens[0] == 1029


def test_low_contrast_scores_are_within_a_few_ulps_of_the_threshold_in_one_radix_bucket():
    for c in base_cases("low_contrast"):
        theta = threshold(c)
        L = int(c.context_lens[0])
        s = c.scores[0, :L]
        assert np.max(np.abs(s - theta)) <= 2 * c.meta["ulps"] * ulp32(theta)
        bits = s.astype(np.float32).view(np.uint32) >> 20  # the top 12 bits: one bucket
        assert len(np.unique(bits)) == 1
        assert L > 10 * int(c.inputs["topk"])


def test_ties_at_the_threshold_outnumber_topk():
    for c in base_cases("ties_at_threshold"):
        theta = threshold(c)
        L = int(c.context_lens[0])
        assert np.sum(c.scores[0, :L] == theta) == c.meta["ties"] > int(c.inputs["topk"])
        assert np.sum(c.scores[0, :L] > theta) == c.meta["n_above"]


def test_signed_zeros_put_the_threshold_at_zero_with_both_signs_tied():
    for c in base_cases("signed_zeros"):
        L = int(c.context_lens[0])
        s = c.scores[0, :L]
        assert threshold(c) == 0.0
        zeros = s[s == 0.0]
        assert np.signbit(zeros).sum() > 10 and (~np.signbit(zeros)).sum() > 10
        assert np.sum(s > 0) == c.meta["n_positive"] < int(c.inputs["topk"]) and np.sum(s < 0) > 0


def test_all_zero_rows_are_all_zero_and_reported_vacuous():
    for c in base_cases("all_zero"):
        for i, L in enumerate(c.context_lens):
            assert np.all(c.scores[i, :L] == 0.0)
        assert c.assert_rows(c.expected)["vacuous"] == len(c.context_lens)


def test_short_contexts_cover_l_below_at_and_just_above_topk_and_zero_when_packed():
    topk = 64
    dense = base_cases("short_contexts-x2")[0]
    assert {1, topk - 3, topk, topk + 1} <= set(dense.context_lens.tolist())
    packed = BY_ID["short_contexts-packed-x2^0"]
    assert 0 in packed.context_lens.tolist()
    empty = int(np.flatnonzero(packed.context_lens == 0)[0])
    assert np.all(packed.expected[empty] == -1)


def test_fp8_extremes_hold_448_and_put_the_threshold_among_subnormals():
    import ml_dtypes

    c = BY_ID["fp8_extremes-x2^0"]
    k = c.inputs["index_k"]
    assert k.dtype == ml_dtypes.float8_e4m3fn
    assert 448.0 in k.astype(np.float32) and -448.0 in k.astype(np.float32)
    raw_threshold = threshold(c) / float(c.inputs["key_scale"])
    assert 0 < raw_threshold < 2.0**-6  # a subnormal e4m3fn value


def test_bf16_rounding_leaves_few_distinct_keys_and_ties_at_the_threshold():
    c = BY_ID["bf16_rounded_ties-x2^0"]
    assert c.meta["distinct"] <= 128 < c.meta["originals_distinct"]
    L = int(c.context_lens[0])
    assert np.sum(c.scores[0, :L] == threshold(c)) > 1


def test_paged_cases_shuffle_pages_and_pad_the_block_table_with_garbage():
    for layout in ("dense", "fp8_scaled"):
        c = BY_ID[f"paged-{layout}-x2^0"]
        table, n_pages = c.inputs["block_table"], len(c.inputs["kv_cache"])
        used = c.meta["used_pages"]
        assert any(np.any(np.diff(table[s, :n]) < 0) for s, n in enumerate(used))  # not in order
        for s, n in enumerate(used):
            tail = table[s, n:]
            assert len(tail) and np.all((tail < 0) | (tail >= n_pages) | np.isin(tail, table[s, :n], invert=True))
        assert np.all(c.inputs["seq_lens"] % 16 != 0)


def test_ik_tail_truncation_has_the_reports_numbers():
    c = BY_ID["ik_tail_truncation-x2^0"]
    assert int(c.context_lens[0]) == 4093 and 4093 % 8 == 5 and int(c.inputs["topk"]) == 256
    s = c.scores[0]
    assert np.sum(s == 1.0) == 255 and s[100] == 1014 / 1024 and s[4090] == 1010 / 1024
    assert 100 in c.expected[0] and 4090 not in c.expected[0]
    bad = c.expected.copy()
    bad[0][bad[0] == 100] = 4090  # what iqk_bucket_topk returned
    with pytest.raises(CheckFailure, match=r"dropped 1 \[100 \(0\.9902344\)\], intruders 1 \[4090 \(0\.9863281\)\]"):
        c.assert_rows(bad)


def test_ik_absolute_early_out_rows_are_flat_by_1e_6_but_not_their_first_positions():
    for c in base_cases("ik_absolute_early_out"):
        if c.meta["scale_exp"] > -30:
            continue
        topk = int(c.inputs["topk"])
        L = int(c.context_lens[0])
        s = c.scores[0, :L]
        assert s.max() - s.min() < 1e-6
        first = np.tile(np.arange(topk), (len(c.context_lens), 1))
        with pytest.raises(CheckFailure, match="wrong selection"):
            c.assert_rows(first)


def test_non_finite_cases_hold_their_operand_and_the_rule_ranks_nan_last():
    for _, c in TOPK:
        if not c.meta.get("non_finite"):
            continue
        a = c.inputs
        arrays = [np.asarray(a[n], dtype=np.float32) for n in ("index_q", "weights", "index_k", "key_scale") if n in a]
        assert any(not np.isfinite(x).all() for x in arrays), c.id
        L = int(c.context_lens[0])
        s = c.scores[0, :L]
        picked = c.expected[0][c.expected[0] >= 0]
        if np.isfinite(s).sum() >= len(picked):  # NaN never picked while a number is left
            assert not np.isnan(s[picked]).any(), c.id
        assert (
            np.all(s[picked] == np.inf)
            or not np.isinf(s).any()
            or np.isinf(s[picked]).sum() == min(np.sum(s == np.inf), len(picked))
        ), c.id


def test_the_fp8_nan_case_holds_both_nan_bytes():
    c = BY_ID["non_finite-fp8_nan-nan-x2^0"]
    b = c.inputs["index_k"].view(np.uint8)
    assert (b == 0x7F).any() and (b == 0xFF).any()


def test_generators_are_deterministic_per_seed():
    a, b, other = cases.low_contrast(3), cases.low_contrast(3), cases.low_contrast(4)
    assert np.array_equal(a.inputs["index_k"], b.inputs["index_k"])
    assert not np.array_equal(a.inputs["index_k"], other.inputs["index_k"])


def test_the_long_rows_are_behind_a_parameter():
    assert not any("262149" in i for i, _ in TOPK)
    c = cases.low_contrast(n_keys=262149, topk=2048)
    assert int(c.context_lens[0]) == 262149 and c.expected.shape == (7, 2048)


def test_block_and_witness_contexts_are_not_multiples_of_8_but_the_particular_ones():
    for _, c in BLOCKS:
        assert np.all((c.inputs["query_pos"] + 1) % 8 != 0), c.id
    for _, c in WITNESSES:
        lens = np.asarray(c.inputs["context_lens"])
        topk = c.inputs["topk_indices"].shape[1]
        assert np.all(lens >= 0) and np.all((lens % 8 != 0) | (lens == 0) | (lens == topk)), c.id


def test_block_cases_have_their_properties():
    ties = dict(BLOCKS)["block_ties-x2^0"]
    bs = ties.inputs["config"].block_size
    assert np.all((ties.inputs["query_pos"] + 1) % bs != 0)
    scores = ks.block_scores(
        ties.inputs["index_q"], ties.inputs["index_k"], ties.inputs["query_pos"], ties.inputs["config"]
    )
    top = np.nanmax(scores[0, 0])
    assert np.sum(scores[0, 0] == top) == ties.meta["tied_blocks"] > ties.inputs["config"].top_blocks
    tail = dict(BLOCKS)["block_partial_tail-x2^0"]
    full = tail.inputs["index_k"].astype(np.float64) @ tail.inputs["index_q"][0, 0].astype(np.float64)
    p = int(tail.inputs["query_pos"][0])
    block = p // bs
    assert full[p + 1 : (block + 1) * bs].max() > full[: p + 1].max()  # future keys score highest
    assert block not in tail.expected[0, 0]


def test_pytest_params_carry_the_case_ids():
    params = cases.pytest_params(WITNESSES)
    assert [p.id for p in params] == [i for i, _ in WITNESSES]
    assert params[0].values[0] is WITNESSES[0][1]
