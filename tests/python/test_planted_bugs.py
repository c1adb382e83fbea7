"""kvselect.testing.cases catch what they claim: a NumPy indexer top-k with
one planted bug switched in (no ReLU; ``p // m`` visible entries; fp8 keys
without their per-key scale) fails the cases named for that bug, and the
same kernel with no bug passes every case of ``all_topk_cases()``."""

import numpy as np
import pytest

from kvselect.testing import CheckFailure, cases

TOPK = cases.all_topk_cases()

# The bug each planted kernel has, and the cases named for it.
BUGS = {
    "no_relu": "relu_negative_dots",
    "p_div_m": "compressed_entry_boundary",
    "no_key_scale": "fp8_per_key_scales",
}


def _sequences(a):
    """Each sequence of the inputs: (its rows, its keys [T, d] as float32,
    its scales [T] or None, whether the keys are fp8)."""
    pos = np.asarray(a["query_pos"], dtype=np.int64).reshape(-1)
    if a.get("kv_cache") is not None:  # paged: gather each sequence's pages
        cache, table = np.asarray(a["kv_cache"]), np.asarray(a["block_table"])
        n_pages, bs = cache.shape[0], cache.shape[1]
        d = np.asarray(a["index_q"]).shape[-1]
        if a.get("page_layout", "dense") == "fp8_scaled":
            import ml_dtypes

            flat = cache.reshape(n_pages, -1)
            keys = flat[:, : bs * d].copy().view(ml_dtypes.float8_e4m3fn).reshape(n_pages, bs, d)
            scales = flat[:, bs * d :].copy().view(np.float32).reshape(n_pages, bs)
        else:
            keys, scales = cache, None
        fp8 = keys.dtype.name == "float8_e4m3fn"
        seq_ids = np.asarray(a["seq_ids"], dtype=np.int64)
        for s, L in enumerate(int(x) for x in a["seq_lens"]):
            ids = table[s, : -(-L // bs)]
            k = np.asarray(keys[ids], dtype=np.float32).reshape(-1, d)[:L]
            c = None if scales is None else scales[ids].reshape(-1)[:L]
            yield np.flatnonzero(seq_ids == s), k, c, fp8
        return
    fp8 = np.asarray(a["index_k"]).dtype.name == "float8_e4m3fn"
    k = np.asarray(a["index_k"], dtype=np.float32)
    c = a.get("key_scale")
    c = None if c is None else np.broadcast_to(np.asarray(c, dtype=np.float32), (len(k),))
    if a.get("cu_seqlens") is not None:
        cu, seq_ids = np.asarray(a["cu_seqlens"]), np.asarray(a["seq_ids"], dtype=np.int64)
        for s in range(len(cu) - 1):
            lo, hi = int(cu[s]), int(cu[s + 1])
            yield np.flatnonzero(seq_ids == s), k[lo:hi], None if c is None else c[lo:hi], fp8
        return
    yield np.arange(len(pos)), k, c, fp8


def numpy_topk(inputs, bug=None):
    """The indexer top-k, in float32 NumPy (exact on the cases' operands):
    ``key_scale[t] * sum_h w_h * relu(q_h . k_t)`` over each row's visible
    keys, score descending, ties to the lower position, -0.0 == +0.0, NaN
    last, then -1. ``bug`` switches one planted bug in: ``"no_relu"``;
    ``"p_div_m"`` (compressed keys: ``p // m`` visible entries, not ``(p +
    1) // m``; the token-level path, ``m = 1``, stays right);
    ``"no_key_scale"`` (fp8 keys decoded without their scales; float32 keys
    keep theirs)."""
    assert bug in (None, *BUGS)
    a = inputs
    q = np.asarray(a["index_q"], dtype=np.float32)
    w = np.asarray(a["weights"], dtype=np.float32)
    pos = np.asarray(a["query_pos"], dtype=np.int64).reshape(-1)
    topk, m = int(a["topk"]), int(a.get("compress_ratio", 1))
    out = np.full((len(pos), topk), -1, dtype=np.int64)
    for rows, k, c, fp8 in _sequences(a):
        with np.errstate(invalid="ignore", over="ignore"):
            dots = np.einsum("nhd,td->nht", q[rows], k)
            s = np.einsum("nh,nht->nt", w[rows], dots if bug == "no_relu" else np.maximum(dots, np.float32(0)))
            if c is not None and not (bug == "no_key_scale" and fp8):
                s = s * c
        for j, i in enumerate(rows):
            seen = pos[i] // m if bug == "p_div_m" and m > 1 else (pos[i] + 1) // m
            L = min(int(seen), len(k))
            r = s[j, :L]
            order = np.lexsort((np.arange(L), np.where(np.isnan(r), 0, -r), np.isnan(r)))
            n = min(topk, L)
            out[i, :n] = order[:n]
    return out


def fails(case, rows):
    try:
        case.assert_rows(rows)
    except CheckFailure:
        return True
    return False


@pytest.mark.parametrize("case", cases.pytest_params(TOPK))
def test_the_kernel_without_a_bug_passes_every_case(case):
    case.assert_rows(numpy_topk(case.inputs))


@pytest.mark.parametrize("bug", list(BUGS))
def test_each_planted_bug_fails_every_case_named_for_it(bug):
    named = [c for i, c in TOPK if i.startswith(BUGS[bug])]
    assert len(named) == 3  # scale_exp 0, 30, -30
    for case in named:
        with pytest.raises(CheckFailure, match="wrong selection: dropped") as info:
            case.assert_rows(numpy_topk(case.inputs, bug))
        assert info.value.report["wrong"] >= 1, case.id


@pytest.mark.parametrize("bug", list(BUGS))
def test_only_the_cases_named_for_a_bug_catch_it(bug):
    """The finding the new cases answer: no other case of the lists caught these bugs."""
    caught = [i for i, c in TOPK if fails(c, numpy_topk(c.inputs, bug))]
    assert caught and all(i.startswith(BUGS[bug]) for i in caught), caught


@pytest.mark.parametrize("bug", list(BUGS))
def test_a_case_named_for_one_bug_passes_the_other_bugs_kernels(bug):
    """Each new case is about its bug: the other planted bugs do not change its rows."""
    for other in BUGS:
        if other == bug:
            continue
        for case in (c for i, c in TOPK if i.startswith(BUGS[bug])):
            case.assert_rows(numpy_topk(case.inputs, other))


def test_the_compressed_rows_that_catch_p_div_m_are_those_at_an_entrys_last_token():
    case = dict(TOPK)["compressed_entry_boundary-m4-x2^0"]
    m = case.inputs["compress_ratio"]
    pos = case.inputs["query_pos"]
    bad = numpy_topk(case.inputs, "p_div_m")
    wrong = np.array([not np.array_equal(b, e) for b, e in zip(bad, case.expected)])
    assert np.array_equal(wrong, (pos + 1) % m == 0) and wrong.sum() == case.meta["boundary_rows"]
    assert np.all(case.context_lens % 8 != 0)


def test_a_kernel_that_rounds_the_visible_entries_up_is_not_causal():
    case = dict(TOPK)["compressed_entry_boundary-m4-x2^0"]
    inputs = dict(case.inputs, query_pos=case.inputs["query_pos"] + case.inputs["compress_ratio"] - 1)
    rows = numpy_topk(inputs)  # ceil((p + 1) / m) entries for the case's positions
    with pytest.raises(CheckFailure, match="not_causal|past"):
        case.assert_rows(rows)


def test_the_relu_case_has_negative_dots_that_would_win_and_winners_they_would_mask():
    for case in (c for i, c in TOPK if i.startswith("relu_negative_dots")):
        w = case.inputs["weights"][0].astype(np.float64)
        q = case.inputs["index_q"][0].astype(np.float64)
        k = case.inputs["index_k"].astype(np.float64)
        dots = k @ q.T  # [T, H]
        no_relu = dots @ w
        traps, masked = case.meta["traps"], case.meta["masked_winners"]
        assert np.all(w[1] < 0) and np.all(dots[traps, 1] < 0)  # negative dot, negative weight
        assert np.all(w[2] > 0) and np.all(dots[masked, 2] < 0)
        for i in range(len(case.context_lens)):
            assert np.all(no_relu[traps] > case.scores[i, case.expected[i, -1]])  # would win without the ReLU
            assert np.all(no_relu[masked] < case.scores[i, case.expected[i, -1]])  # would lose
            assert not np.isin(traps, case.expected[i]).any() and np.isin(masked, case.expected[i]).all()


def test_the_per_key_scales_change_the_ranking_in_every_row():
    for case in (c for i, c in TOPK if i.startswith("fp8_per_key_scales")):
        scale = case.inputs["key_scale"]
        assert scale.shape == (len(case.inputs["index_k"]),) and len(np.unique(scale)) > 2
        unscaled = numpy_topk(case.inputs, "no_key_scale")
        for i in range(len(case.expected)):
            assert set(unscaled[i]) != set(case.expected[i])
