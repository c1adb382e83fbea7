"""NSA's ``nsa`` dump kind, its assertion and cases: right rows pass (the core's and the
twin's), each case names the faulty kernel it was built for, refusals name the dump key."""

import numpy as np
import pytest

import kvselect as ks
from kvselect import testing
from kvselect.checking import DumpError, check_dump
from kvselect.testing import CheckFailure, cases

CASES = dict(cases.all_nsa_cases())


def _faulty(q, k, n_sel, bs, fault, scale=None):
    """A float64 NSA with one planted fault: ``incomplete`` (the query's partial block
    compressed and in the softmax), ``group_first`` (one softmax over the group's summed
    logits), ``offsets`` (query ``i`` at ``p = i``)."""
    n_q, hq, d = q.shape
    seq_len, h, _ = k.shape
    gs = hq // h
    sc = 1 / np.sqrt(d) if scale is None else scale
    out = np.full((n_q, h, n_sel), -1, np.int32)
    for i in range(n_q):
        p = i if fault == "offsets" else seq_len - n_q + i
        ic = p // bs
        nc = -(-(p + 1) // bs) if fault == "incomplete" else (p + 1) // bs
        blocks = [k[c * bs : min((c + 1) * bs, p + 1)].astype(np.float64).mean(axis=0) for c in range(nc)]
        ck = np.stack(blocks) if blocks else np.zeros((0, h, d))
        for g in range(h):
            s_all = np.zeros(ic + 1)
            if nc:
                lg = q[i, g * gs : (g + 1) * gs].astype(np.float64) @ ck[:, g].T * sc
                if fault == "group_first":
                    lg = lg.sum(axis=0, keepdims=True)
                e = np.exp(lg - lg.max(axis=1, keepdims=True))
                pr = (e / e.sum(axis=1, keepdims=True)).sum(axis=0)
                s_all[: min(ic, nc)] = pr[: min(ic, nc)]
            for b in (0, ic - 1, ic):
                if b >= 0:
                    s_all[b] = np.inf
            top = np.lexsort((np.arange(ic + 1), -s_all))[:n_sel]
            out[i, g, : len(top)] = np.sort(top)
    return out


@pytest.mark.parametrize("case_id", sorted(CASES))
def test_each_case_passes_the_rule_and_fails_its_faulty_kernel(case_id):
    c = CASES[case_id]
    i = c.inputs
    native = ks.nsa_select(i["q"], i["k"], i["block_counts"], block_size=i["block_size"], scale=i.get("scale"))
    assert np.array_equal(native, c.expected)
    assert c.assert_rows(c.expected)["wrong"] == 0
    fault = c.meta["faulty"]
    bad = _faulty(i["q"], i["k"], i["block_counts"], i["block_size"], fault, i.get("scale"))
    assert not np.array_equal(bad, c.expected)
    with pytest.raises(CheckFailure):
        c.assert_rows(bad)
    # the clean float64 kernel with no fault passes
    assert np.array_equal(_faulty(i["q"], i["k"], i["block_counts"], i["block_size"], None, i.get("scale")), c.expected)


def test_right_rows_pass_and_planted_faults_are_named():
    """Random inputs: the core's rows pass; each fault's rows fail where they differ."""
    rng = np.random.default_rng(11)
    caught = {"incomplete": 0, "group_first": 0, "offsets": 0}
    for _ in range(150):
        g = int(rng.choice([1, 2, 16]))
        bs = int(rng.choice([2, 4, 8]))
        seq_len = int(rng.integers(bs, 30 * bs))
        n_q = int(rng.integers(1, 4))
        q = rng.standard_normal((n_q, g, 8)).astype(np.float32)
        k = (rng.standard_normal((seq_len, 1, 8)) * 2).astype(np.float32)
        rows = ks.nsa_select(q, k, 4, block_size=bs)
        assert testing.assert_nsa(rows, q, k, 4, block_size=bs)["wrong"] == 0
        for fault in caught:
            bad = _faulty(q, k, 4, bs, fault)
            if not np.array_equal(bad, rows):
                rep = check_dump({"kind": np.asarray("nsa"), "q": q, "k": k, "rows": bad, "block_size": np.asarray(bs)})
                caught[fault] += int(rep["wrong"] > 0)
    assert all(v > 5 for v in caught.values()), caught


def test_forced_ties_either_way_pass():
    """block_counts < 3: the forced blocks tie at +inf; either survivor is right."""
    q = np.ones((1, 2, 4), np.float32)
    k = np.zeros((20, 1, 4), np.float32)
    k[8:12] = 1.0
    for row in ([0, 3], [0, 4], [3, 4]):
        assert testing.assert_nsa(np.array([[row]]), q, k, 2, block_size=4)["wrong"] == 0
    with pytest.raises(CheckFailure):
        testing.assert_nsa(np.array([[[0, 2]]]), q, k, 2, block_size=4)


def test_refusals_name_the_dump_key():
    q = np.ones((1, 2, 4), np.float32)
    k = np.zeros((20, 1, 4), np.float32)
    with pytest.raises(DumpError, match="rows"):
        testing.assert_nsa(np.array([[0, 2]]), q, k, 2, block_size=4)
    with pytest.raises(DumpError, match="block_counts"):
        testing.assert_nsa(np.array([[[0, 2]]]), q, k, 0, block_size=4)
    with pytest.raises(DumpError, match="k"):
        testing.assert_nsa(np.array([[[0, 2]]]), q, k[:, :, :3], 2, block_size=4)
