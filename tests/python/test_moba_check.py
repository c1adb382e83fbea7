"""The ``moba`` dump kind: ``kvselect check`` passes the core's rows (dense,
packed, Tq != Tkv, both variants, bfloat16 keys) and names the faults MoBA
invites, planted in otherwise right rows."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import kvselect as ks
from kvselect.checking import DumpError, check_dump
from kvselect.testing import CheckFailure, cases

SEED = 4546


def _dump(q, k, topk, bs, rows, **extra):
    d = {"kind": np.array("moba"), "q": q, "keys": k, "topk": np.array(topk), "block_size": np.array(bs), "rows": rows}
    d.update(extra)
    return d


def test_the_cores_rows_pass():
    rng = np.random.default_rng(SEED)
    for i in range(40):
        lens = rng.integers(1, 90, size=int(rng.integers(1, 4)))
        qlens = [int(rng.integers(0, n + 1)) for n in lens]
        h = int(rng.choice([1, 2]))
        hq, d, bs, topk = (
            h * int(rng.choice([1, 16])),
            int(rng.integers(1, 33)),
            int(rng.integers(1, 17)),
            int(rng.integers(1, 6)),
        )
        k = rng.standard_normal((int(lens.sum()), h, d)).astype(np.float32)
        if i % 4 == 0:
            k = k.astype(ml_dtypes.bfloat16)
        q = rng.standard_normal((sum(qlens), hq, d)).astype(np.float32)
        cu, cq = np.r_[0, np.cumsum(lens)], np.r_[0, np.cumsum(qlens)]
        variant = "naive" if i % 3 == 0 else "efficient"
        rows = ks.moba_select(q, k, topk, bs, cu_seqlens=cu, cu_seqlens_q=cq, variant=variant)
        # Any order within a row's valid entries: the check compares sets.
        n_valid = (rows >= 0).sum(axis=2, keepdims=True)
        rev = np.where(
            np.arange(rows.shape[2]) < n_valid, n_valid - 1 - np.arange(rows.shape[2]), np.arange(rows.shape[2])
        )
        rows = np.take_along_axis(rows, rev, axis=2)
        extra = {"keys_format": np.array("bfloat16")} if k.dtype != np.float32 else {}
        if extra:
            k = k.view(np.uint16)
        rep = check_dump(
            _dump(q, k, topk, bs, rows, cu_seqlens=cu, cu_seqlens_q=cq, variant=np.array(variant), **extra)
        )
        assert rep["wrong"] == 0, rep["details"][:2]
        assert rep["rows"] == sum(qlens) * hq


def _gates_with_partial(q, k, bs):
    """Every block's gate, the current block's over its keys so far (a kernel's
    partial mean): [n_q, hq, n_blocks] float64, future blocks -inf."""
    n, h, d = k.shape
    hq = q.shape[1]
    out = np.full((n, hq, -(-n // bs)), -np.inf)
    kf = k.astype(np.float64)
    for p in range(n):
        c = p // bs
        for b in range(c + 1):
            m = kf[b * bs : min((b + 1) * bs, p + 1)].mean(axis=0)  # [h, d]
            out[p, :, b] = np.einsum("hd,hd->h", q[p].astype(np.float64), m[np.arange(hq) // (hq // h)])
    return out


def _planted(q, k, bs, topk, fault):
    g = _gates_with_partial(q, k, bs)
    n, hq = q.shape[:2]
    rows = np.full((n, hq, topk), -1, np.int32)
    for p in range(n):
        c = p // bs
        for j in range(hq):
            order = sorted(range(c + 1), key=lambda b: (-g[p, j, b], b))
            if fault == "partial_block_gated":
                # The current block's partial mean competes for the gated slots, then
                # it is added as forced: when it wins a slot the row is one short.
                chosen = set(order[: min(topk - 1, c + 1)]) | {c}
            else:  # current_block_gated: no block forced, the top topk of 0..c
                chosen = set(order[:topk])
            r = sorted(chosen)
            rows[p, j, : len(r)] = r
    return rows


@pytest.mark.parametrize(
    "fault, reason", [("partial_block_gated", "wrong_count"), ("current_block_gated", "wrong_selection")]
)
def test_planted_faults_are_named(fault, reason):
    rng = np.random.default_rng(SEED + 1)
    k = rng.standard_normal((200, 1, 8)).astype(np.float32)
    q = rng.standard_normal((200, 2, 8)).astype(np.float32)
    rows = _planted(q, k, 16, 3, fault)
    rep = check_dump(_dump(q, k, 3, 16, rows))
    assert rep["wrong"] > 0 and rep["by_reason"][reason] > 0
    # The same rows on queries where the fault cannot show (the first block) pass.
    assert all(x["query"] >= 16 for x in rep["details"])


def test_the_naive_topk_one_row_fails_as_the_efficient_rule():
    rng = np.random.default_rng(SEED + 2)
    k = rng.standard_normal((64, 1, 4)).astype(np.float32)
    q = rng.standard_normal((64, 1, 4)).astype(np.float32)
    naive = ks.moba_select(q, k, 1, 8, variant="naive")
    wide = np.full((64, 1, 8), -1, np.int32)  # the efficient rule's width: every block
    wide[..., :1] = naive
    rep = check_dump(_dump(q, k, 1, 8, wide))
    assert rep["by_reason"]["wrong_count"] == 56  # every query past the first block
    assert check_dump(_dump(q, k, 1, 8, naive, variant=np.array("naive")))["wrong"] == 0


def test_a_malformed_dump_is_refused():
    q = np.zeros((4, 1, 2), np.float32)
    k = np.zeros((4, 1, 2), np.float32)
    rows = np.zeros((4, 1, 2), np.int32)
    with pytest.raises(DumpError, match="variant"):
        check_dump(_dump(q, k, 2, 2, rows, variant=np.array("fast")))
    with pytest.raises(DumpError, match="topk"):
        check_dump(_dump(q, k, 0, 2, rows))
    with pytest.raises(DumpError, match="cu_seqlens"):
        check_dump(_dump(q, k, 2, 2, rows, cu_seqlens=np.array([0, 3])))


CASES = dict(cases.all_moba_cases())


@pytest.mark.parametrize("case", cases.pytest_params(list(CASES.items())))
def test_every_case_passes_with_its_expected_answer(case):
    assert case.assert_rows(case.expected)["wrong"] == 0
    assert np.array_equal(case.expected, ks.moba_select(case.inputs["q"], case.inputs["keys"], case.inputs["topk"], 8))


@pytest.mark.parametrize(
    "case_id, fault, reason",
    [
        ("moba_partial_block_gated", "partial_block_gated", "wrong_count"),
        ("moba_current_block_forced", "current_block_gated", "wrong_selection"),
    ],
)
def test_each_case_catches_its_faulty_kernel(case_id, fault, reason):
    case = CASES[case_id]
    q, k, topk = case.inputs["q"], case.inputs["keys"], case.inputs["topk"]
    bad = _planted(q, k, 8, topk, fault)
    with pytest.raises(CheckFailure) as e:
        case.assert_rows(bad)
    assert e.value.report["by_reason"][reason] > 0


def test_the_tie_case_accepts_any_tied_block_and_refuses_a_worse_one():
    case = CASES["moba_ties"]
    rows = case.expected.copy()
    last = len(rows) - 1  # current block 7; the twin keeps blocks 1 and 3 of the tied 1, 3, 4
    assert rows[last, 0].tolist() == [1, 3, 7]
    rows[last, :, 1] = 4  # the other tied block
    assert case.assert_rows(rows)["wrong"] == 0
    rows[last, :, 1] = 0  # a worse block
    with pytest.raises(CheckFailure):
        case.assert_rows(rows)


def test_the_eval_policy_spends_the_budget_in_blocks_the_current_one_counted():
    from kvselect import evaluate
    from kvselect.reference import moba as RM
    from kvselect.rules import moba as rule
    from kvselect.rules._rule import EvalContext

    policy = ks.rules.policy("moba")
    geometry = {k: (rule.geometry(evaluate.derive_settings(k)[0])) for k in (1, 11, 12, 24, 2048, 49152, 10**6)}
    # MoBA's example chunk of 4096 where 12 blocks fit, halved until they do, down to 1 token.
    assert geometry == {1: 1, 11: 1, 12: 1, 24: 2, 2048: 128, 49152: 4096, 10**6: 4096}
    s, _ = evaluate.derive_settings(96)
    assert (rule.geometry(s), policy.unit.units(s), policy.unit.forced(s), policy.unit.note(s)) == (8, 12, 1, None)
    rng = np.random.default_rng(SEED + 1)
    n, g, d = 300, 2, 16

    pos = np.array([0, 7, 8, 95, 96, 150, 299])

    class Head:
        q = rng.standard_normal((len(pos), g, d)).astype(np.float32)  # the evaluated queries' vectors
        k = rng.standard_normal((n, d)).astype(np.float32)

    rows = policy.select(EvalContext(Head, pos, s, policy.unit.units(s), {})).rows
    assert rows.shape == (len(pos), 96) and rows.dtype == np.int32
    qm = (Head.q[:, 0] + Head.q[:, 1]) / np.float32(2)  # the group's mean query, summed in head order
    for i, (r, p) in enumerate(zip(rows, pos)):
        toks = r[r >= 0]
        blocks = RM.moba_select(qm[i][None, None], Head.k[: p + 1, None], 12, 8)[0, 0]
        blocks = blocks[blocks >= 0]
        assert len(blocks) == min(12, p // 8 + 1) and blocks[-1] == p // 8  # the current block, forced
        want = (blocks[:, None] * 8 + np.arange(8)).ravel()
        assert toks.tolist() == want[want <= p].tolist()
        assert len(toks) <= 96 and (r[len(toks) :] == -1).all()
    one, _ = evaluate.derive_settings(1)  # one block of one token: the query's own, not every block
    rows = policy.select(EvalContext(Head, pos, one, policy.unit.units(one), {})).rows
    assert rows[:, 0].tolist() == pos.tolist() and rows.shape == (len(pos), 1)


def test_the_eval_table_shows_moba_at_the_budget():
    from kvselect import evaluate

    w = ks.workloads.synthetic(context=700, queries=6, n_kv_heads=2, n_heads=8)
    budgets = [1, 13, 200]
    report = evaluate.evaluate(w, budgets=budgets, settings=[evaluate.derive_settings(k)[0] for k in budgets])
    by = {r.budget: r for r in report.results if r.policy == "moba"}
    assert sorted(by) == budgets
    for k, r in by.items():
        assert r.ran and r.note is None and 0 < r.slots_used <= k and r.recall_mean > 0
    assert "| moba |" in evaluate.format_table(report)
