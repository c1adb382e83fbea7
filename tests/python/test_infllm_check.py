"""InfLLM-v2's ``infllm`` dump kind, its assertion and cases: right rows pass
(tie-permuted ones included), each planted fault is named, the CLI's exit status
follows, and the eval policy runs at one budget and is n/a where its forced blocks
exceed it."""

import numpy as np
import pytest

import kvselect as ks
from kvselect import testing
from kvselect.cli import main
from kvselect.reference import infllm as RI
from kvselect.testing import cases

CASES = dict(cases.all_infllm_cases())


def _faulty_rows(c):
    """The case's rows from a kernel with the case's bug."""
    i = dict(c.inputs)
    fault = c.meta["faulty"]
    q, ck, n, k = i.pop("q"), i.pop("ck"), i.pop("seq_len"), i.pop("topk")
    init, local = i.get("init_blocks", 1), i.get("local_blocks", 32)
    pooling, keep = i.get("pooling", "cuda"), i.get("keep", "through_current")
    if fault == "filter":
        return ks.infllm_select(q, ck, n, k, **{**i, "keep": "through_current"})
    if fault == "scales":
        return ks.infllm_select(q, ck, n, k, **{**i, "ck_scale": None})
    if fault == "ties":
        rows = ks.infllm_select(q, ck, n, k, **i)
        rows[..., -1] = -1  # one block short
        return rows
    sums = RI.group_scores(q, ck, n, ck_scale=i.get("ck_scale"))
    n_q, h, _ = sums.shape
    nb = RI.n_blocks(n)
    out = np.full((n_q, h, k), -1, np.int32)
    for a in range(n_q):
        p = n - n_q + a
        qb = p // 64
        for g in range(h):
            s = RI.pool(sums[a, g], p, nb, init, local, pooling)
            if fault == "window":
                for b in range(nb):
                    if np.isfinite(s[b]):
                        taps = sums[a, g, 4 * b : 4 * b + 5]
                        s[b] = taps.max() if len(taps) else -np.inf
            elif fault == "current":
                taps = sums[a, g, max(4 * qb - 1, 0) : 4 * qb + 4]
                s[qb] = taps.max() if len(taps) else -np.inf
            r = RI.select_row(s, k, keep, p)
            out[a, g, : len(r)] = r
    return out


@pytest.mark.parametrize("cid", sorted(CASES))
def test_right_rows_pass_and_the_planted_fault_is_named(cid):
    c = CASES[cid]
    c.assert_rows(c.expected)
    i = c.inputs
    native = ks.infllm_select(
        i["q"],
        i["ck"],
        i["seq_len"],
        i["topk"],
        **{k: v for k, v in i.items() if k not in ("q", "ck", "seq_len", "topk")},
    )
    assert np.array_equal(native, c.expected)
    rev = np.full_like(native, -1)
    for idx in np.ndindex(native.shape[:2]):
        v = native[idx][native[idx] >= 0][::-1]
        rev[idx][: len(v)] = v
    c.assert_rows(rev)  # any order
    bad = _faulty_rows(c)
    assert not np.array_equal(bad, c.expected)
    with pytest.raises(testing.CheckFailure) as e:
        c.assert_rows(bad)
    reasons = set(e.value.report["by_reason"])
    assert reasons & {"wrong_selection", "not_causal", "wrong_count"}, reasons


def test_a_tie_broken_the_other_way_passes():
    """The zero query's blocks all tie: kvselect keeps the lowest ids, a kernel that
    keeps a higher one instead is right; one that keeps an excluded (local) block is not."""
    c = CASES["infllm_ties"]
    rows = c.expected.copy()
    assert rows[0, 0].tolist() == [0, 1, 2, 3, 4, 5]
    rows[0, 0, 5] = 7  # block 7 ties with 5 (the query is in block 9: 8, 9 are local)
    c.assert_rows(rows)
    rows[0, 0, 5] = 8
    with pytest.raises(testing.CheckFailure):
        c.assert_rows(rows)


def test_the_cli_exit_status_follows_the_rows(tmp_path):
    c = CASES["infllm_window_off_by_one"]
    i = c.inputs
    good, bad = tmp_path / "good.npz", tmp_path / "bad.npz"
    base = dict(
        kind="infllm",
        q=i["q"],
        ck=i["ck"],
        seq_len=i["seq_len"],
        topk=i["topk"],
        init_blocks=i["init_blocks"],
        local_blocks=i["local_blocks"],
    )
    np.savez(good, rows=c.expected.astype(np.int32), **base)
    np.savez(bad, rows=_faulty_rows(c), **base)
    assert main(["check", str(good)]) == 0
    assert main(["check", str(bad)]) == 1


def test_a_dump_that_does_not_fit_is_refused_by_name():
    c = CASES["infllm_window_off_by_one"]
    i = c.inputs
    with pytest.raises(ks.checking.DumpError, match="ck"):
        testing.assert_infllm(c.expected, i["q"], i["ck"][1:], i["seq_len"], i["topk"])
    with pytest.raises(ks.checking.DumpError, match="pooling"):
        testing.assert_infllm(c.expected, i["q"], i["ck"], i["seq_len"], i["topk"], pooling="cuda2")


def test_the_eval_policy_runs_and_is_na_past_its_forced_blocks():
    from kvselect import evaluate
    from kvselect.rules import infllm as rule
    from kvselect.rules._rule import EvalContext

    policy = [p for p in ks.rules.policies() if p.name == "infllm"][0]
    s, _ = evaluate.derive_settings(4096)  # MiniCPM4's blocks: 64 of them, a window of 32
    assert rule.geometry(s) == (64, 1, 32) and policy.unit.units(s) == 64 and policy.unit.forced(s) == 34
    s, _ = evaluate.derive_settings(512)
    assert rule.geometry(s) == (64, 1, 4) and policy.unit.forced(s) == 6
    assert rule.geometry(evaluate.derive_settings(100)[0]) == (32, 1, 1)  # 1 block of 64 cannot hold 3
    assert rule.geometry(evaluate.derive_settings(1)[0]) == (1, 0, 0)
    s2, _ = evaluate.derive_settings(512, infllm_local_blocks=7)
    assert rule.geometry(s2) == (32, 1, 7)  # a given window is kept: the block halves
    s2, _ = evaluate.derive_settings(512, infllm_local_blocks=600)
    assert policy.unit.forced(s2) == 602 > policy.unit.units(s2) == 512  # n/a
    rng = np.random.default_rng(3)
    n, g, d = 700, 2, 16

    class Head:
        q = rng.standard_normal((n, g, d)).astype(np.float32)
        k = rng.standard_normal((n, d)).astype(np.float32)

    pos = np.array([100, 450, 699])
    rows = policy.select(EvalContext(Head, pos, s, policy.unit.units(s), {})).rows
    assert rows.shape == (3, 512)
    for r, p in zip(rows, pos):
        toks = r[r >= 0]
        assert len(toks) <= 512 and (toks <= p).all() and len(set(toks.tolist())) == len(toks)
        assert p in toks and 0 in toks  # the current and init blocks
    w = ks.workloads.synthetic(context=700, queries=3, n_kv_heads=1, n_heads=2)
    report = evaluate.evaluate(w, budgets=[512], settings=[s2])
    na = [r for r in report.results if r.policy == "infllm"][0]
    assert not na.ran and "exceed the budget" in na.note
