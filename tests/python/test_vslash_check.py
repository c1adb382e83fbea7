"""The ``vslash`` dump kind, its ``kvselect.testing`` assertion and cases, and
the ``vertical-slash`` eval policy."""

from __future__ import annotations

import numpy as np
import pytest

import kvselect as ks
from kvselect import reference as R
from kvselect import testing
from kvselect.cli import main
from kvselect.testing import cases

CASES = dict(cases.all_vslash_cases())


def _faulty(case, kind):
    """The case's faulty estimate, in NumPy: the causal mask among the last
    queries dropped, the offsets' sign flipped, the forced parts left out, or
    fp8 keys' scales ignored."""
    i = case.inputs
    q = i["q"].astype(np.float64)
    keys = R.decode(i["keys"], i.get("key_format"))
    if i.get("key_scale") is not None and kind != "unscaled":
        keys = keys * i["key_scale"][:, None, None]
    L, d = keys.shape[0], q.shape[2]
    n = min(64, L)
    nv, ns = R.vslash_sizes(L, i["vertical_size"], i["slash_size"])
    cols, diags = [], []
    for h in range(q.shape[0]):
        s = q[h] @ keys[:, h * keys.shape[1] // q.shape[0]].T / np.sqrt(d)
        if kind != "unmasked":
            s = np.where(np.arange(L)[None] <= (L - n + np.arange(n))[:, None], s, -np.inf)
        p = np.exp(s - s.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        v, sl = p.sum(0), np.zeros(L)
        for r in range(n):
            sl[: L - n + r + 1] += p[r, L - n + r :: -1]
        if kind != "unforced":
            v[:30], sl[:100] = np.inf, np.inf
        vi, si = np.argsort(-v, kind="stable")[:nv], np.argsort(-sl, kind="stable")[:ns]
        cols.append(vi)
        diags.append(-si if kind == "sign" else si)
    return np.array(cols), np.array(diags)


def _split(case):
    nv = case.meta["nv"]
    return case.expected[:, :nv], case.expected[:, nv:]


@pytest.mark.parametrize("cid", list(CASES))
def test_the_rules_rows_pass_and_the_native_rows_are_the_rules(cid):
    c = CASES[cid]
    assert c.assert_rows(_split(c))["wrong"] == 0
    got = ks.vslash_select(**c.inputs)
    assert c.assert_rows(got)["wrong"] == 0
    assert np.array_equal(np.concatenate(got, axis=1), c.expected)


@pytest.mark.parametrize(
    "cid, reason",
    [
        ("vslash_causal_mask", "wrong_selection"),
        ("vslash_offset_sign", "wrong_count"),
        ("vslash_forced", "wrong_selection"),
        ("vslash_fp8_scales", "wrong_selection"),
    ],
)
def test_each_planted_fault_is_caught_and_named(cid, reason):
    c = CASES[cid]
    bad = _faulty(c, c.meta["faulty"])
    with pytest.raises(testing.CheckFailure) as e:
        c.assert_rows(bad)
    assert e.value.report["by_reason"][reason] >= 1
    # The same estimate with the fault repaired passes: the fault is what fails.
    assert c.assert_rows(_faulty(c, "none"))["wrong"] == 0


def test_the_unmasked_estimate_picks_the_late_keys():
    c = CASES["vslash_causal_mask"]
    cols, _ = _faulty(c, "unmasked")
    free = set(cols[0].tolist()) - set(range(30))
    assert free <= set(range(390, 400))
    right = set(_split(c)[0][0].tolist()) - set(range(30))
    assert right == set(c.meta["heavy"])


def test_tie_permuted_forced_diagonals_pass():
    """``s`` below 100: which forced diagonals survive is a tie in the source
    (``torch.topk``); the check accepts any of them, kvselect keeps the nearest."""
    rng = np.random.default_rng(3)
    keys = rng.standard_normal((300, 1, 8)).astype(np.float32)
    q = rng.standard_normal((1, 64, 8)).astype(np.float32)
    v, s = ks.vslash_select(q, keys, 30, 60)
    assert s[0].tolist() == list(range(60))
    other = np.arange(40, 100)[None]  # 60 other forced diagonals
    assert testing.assert_vslash((v, other), q, keys, 30, 60)["wrong"] == 0
    with pytest.raises(testing.CheckFailure):
        testing.assert_vslash((v, np.arange(41, 101)[None]), q, keys, 30, 60)  # 100 is not forced


def test_the_cli_exit_status_follows_the_verdict(tmp_path, capsys):
    c = CASES["vslash_causal_mask"]
    v, s = _split(c)
    d = {"kind": "vslash", **{k: np.asarray(x) for k, x in c.inputs.items()}, "vertical": v, "slash": s}
    bv, bs = _faulty(c, "unmasked")
    np.savez(tmp_path / "right.npz", **d)
    np.savez(tmp_path / "wrong.npz", **dict(d, vertical=bv, slash=bs))
    assert main(["check", str(tmp_path / "right.npz")]) == 0
    assert "all rows correct" in capsys.readouterr().out
    assert main(["check", str(tmp_path / "wrong.npz")]) == 1
    assert "wrong_selection" in capsys.readouterr().out


def test_a_dump_that_does_not_fit_is_refused_naming_the_key():
    c = CASES["vslash_offset_sign"]
    v, s = _split(c)
    d = {"kind": "vslash", **{k: np.asarray(x) for k, x in c.inputs.items()}, "vertical": v, "slash": s}
    with pytest.raises(ks.checking.DumpError, match="variant"):
        ks.checking.check_dump(dict(d, variant=np.asarray("dense")))
    with pytest.raises(ks.checking.DumpError, match="slash"):
        ks.checking.check_dump(dict(d, slash=s[:1]))
    with pytest.raises(ks.checking.DumpError, match="q"):
        ks.checking.check_dump(dict(d, q=d["q"][:, :10]))
    with pytest.raises(ks.checking.DumpError, match="vertical"):
        ks.checking.check_dump({k: x for k, x in d.items() if k != "vertical"})


def test_an_int64_entry_past_int32_is_a_wrong_row_never_cut_to_int32(tmp_path, capsys):
    # 2**32 + j read as int32 would be j: a right column. As written, it is a column
    # past the keys.
    c = CASES["vslash_causal_mask"]
    v, s = _split(c)
    d = {"kind": "vslash", **{k: np.asarray(x) for k, x in c.inputs.items()}, "vertical": v, "slash": s}
    far = np.asarray(v, np.int64).copy()
    far[0, -1] += 2**32
    np.savez(tmp_path / "far.npz", **dict(d, vertical=far))
    assert main(["check", str(tmp_path / "far.npz")]) == 1
    assert "not_causal" in capsys.readouterr().out


def test_the_eval_policy_runs_at_the_boundary_and_is_na_below_its_forced_parts():
    w = ks.workloads.synthetic(context=512, queries=8, n_kv_heads=1, n_heads=2)
    budgets = [64, 256]
    plain = [ks.evaluate.derive_settings(b)[0] for b in budgets]
    per_query = ks.evaluate.evaluate(w, budgets=budgets, settings=plain)
    assert all(r.policy != "vertical-slash" for r in per_query.results)  # it decides at a boundary
    runs = [ks.evaluate.derive_settings(b, boundary=384)[0] for b in budgets]
    report = ks.evaluate.evaluate(w, budgets=budgets, settings=runs)
    by = {(r.budget, r.policy): r for r in report.results}
    assert "130 positions" in by[(64, "vertical-slash")].note  # 30 columns + 100 diagonals forced
    r = by[(256, "vertical-slash")]
    assert r.note is None and 0 < r.slots_used <= 256 + 512 - 384  # the budget, and the arrivals
    assert r.recall_mean > 0


def test_the_forced_positions_count_the_union():
    from kvselect.rules.vslash import forced_positions, sizes

    assert [forced_positions(p) for p in (1, 30, 100, 129, 130, 131, 5000)] == [1, 30, 100, 129, 130, 130, 130]
    for k in (130, 140, 500, 7096):
        v, s = sizes(k)
        assert v >= 30 and s >= 100 and v + s == k
    assert sizes(7096) == (1013, 6083)  # about MInference's 1000 : 6096
