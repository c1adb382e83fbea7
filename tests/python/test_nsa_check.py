"""NSA's ``nsa`` dump kind, its assertion and cases: right rows pass (the core's and the
twin's), each case names the faulty kernel it was built for, refusals name the dump key."""

import numpy as np
import pytest

import kvselect as ks
from kvselect import testing
from kvselect.checking import DumpError, check_dump
from kvselect.testing import CheckFailure, cases

CASES = dict(cases.all_nsa_cases())


def _faulty(q, k, n_sel, bs, fault, scale=None, window="fla", kz=32, st=16):
    """A float64 NSA with one planted fault: ``incomplete`` (the query's partial block
    compressed and in the softmax), ``group_first`` (one softmax over the group's summed
    logits), ``offsets`` (query ``i`` at ``p = i``), ``overlap_window`` (Eq. 9's block
    scored over the keys that overlap it, ``s j - 1 .. s j + s - 1`` with ``s = bs /
    st``, instead of ``s j - s .. s j``). ``window="eq9"``: compressed keys of ``kz``
    tokens every ``st``, blocks scored by Eq. 9."""
    n_q, hq, d = q.shape
    seq_len, h, _ = k.shape
    gs = hq // h
    sc = 1 / np.sqrt(d) if scale is None else scale
    kernel, stride = (kz, st) if window == "eq9" else (bs, bs)
    s_b, s_k = bs // stride, kernel // stride
    out = np.full((n_q, h, n_sel), -1, np.int32)
    for i in range(n_q):
        p = i if fault == "offsets" else seq_len - n_q + i
        ic = p // bs
        n_seen = p + 1
        nc = max((n_seen - kernel) // stride + 1, 0) if window == "eq9" else n_seen // bs
        if fault == "incomplete":
            nc = -(-n_seen // bs)
        blocks = [k[c * stride : min(c * stride + kernel, n_seen)].astype(np.float64).mean(axis=0) for c in range(nc)]
        ck = np.stack(blocks) if blocks else np.zeros((0, h, d))
        for g in range(h):
            s_all = np.zeros(ic + 1)
            if nc:
                lg = q[i, g * gs : (g + 1) * gs].astype(np.float64) @ ck[:, g].T * sc
                if fault == "group_first":
                    lg = lg.sum(axis=0, keepdims=True)
                e = np.exp(lg - lg.max(axis=1, keepdims=True))
                pr = (e / e.sum(axis=1, keepdims=True)).sum(axis=0)
                if window == "eq9":
                    for j in range(ic):
                        if fault == "overlap_window":
                            taps = range(s_b * j - 1, s_b * j + s_b)
                        else:
                            taps = [s_b * j - m - n for m in range(s_b) for n in range(s_k)]
                        s_all[j] = sum(pr[t] for t in taps if 0 <= t < nc)
                else:
                    s_all[: min(ic, nc)] = pr[: min(ic, nc)]
            for b in (0, ic - 1, ic):
                if b >= 0:
                    s_all[b] = np.inf
            top = np.lexsort((np.arange(ic + 1), -s_all))[:n_sel]
            out[i, g, : len(top)] = np.sort(top)
    return out


def _case_faulty(c, fault):
    i = c.inputs
    geo = dict(window=i.get("window", "fla"), kz=i.get("kernel_size", 32), st=i.get("kernel_stride", 16))
    return _faulty(i["q"], i["k"], i["block_counts"], i["block_size"], fault, i.get("scale"), **geo)


@pytest.mark.parametrize("case_id", sorted(CASES))
def test_each_case_passes_the_rule_and_fails_its_faulty_kernel(case_id):
    c = CASES[case_id]
    i = c.inputs
    geo = {key: i[key] for key in ("window", "kernel_size", "kernel_stride") if key in i}
    native = ks.nsa_select(i["q"], i["k"], i["block_counts"], block_size=i["block_size"], scale=i.get("scale"), **geo)
    assert np.array_equal(native, c.expected)
    assert c.assert_rows(c.expected)["wrong"] == 0
    bad = _case_faulty(c, c.meta["faulty"])
    assert not np.array_equal(bad, c.expected)
    with pytest.raises(CheckFailure):
        c.assert_rows(bad)
    # the clean float64 kernel with no fault passes
    assert np.array_equal(_case_faulty(c, None), c.expected)


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


def test_the_eq9_case_fails_the_overlap_window_and_fla_window():
    """``nsa_eq9_overlap_window``: Eq. 9's rows pass; a kernel scoring each block over the
    keys that overlap it fails, and so does one that ignores the window (fla's block
    means); the report names the row and the blocks."""
    c = CASES["nsa_eq9_overlap_window"]
    i = c.inputs
    assert c.expected[0, 0].tolist() == [0, 3, 6, 7]
    overlap = _case_faulty(c, "overlap_window")
    fla = ks.nsa_select(i["q"], i["k"], 4, block_size=64, scale=1.0)
    assert overlap[0, 0].tolist() == [0, 2, 6, 7] and fla[0, 0].tolist() == [0, 2, 6, 7]
    for bad in (overlap, fla):
        with pytest.raises(CheckFailure) as e:
            c.assert_rows(bad)
        assert e.value.report["wrong"] == 1
    # the dump carries the window: the same rows judged as fla's pass
    kw = dict(block_size=64, scale=1.0)
    assert testing.assert_nsa(fla, i["q"], i["k"], 4, **kw)["wrong"] == 0
    with pytest.raises(CheckFailure):
        testing.assert_nsa(c.expected, i["q"], i["k"], 4, **kw)


def test_eq9_rows_pass_and_planted_faults_are_caught():
    """Random inputs under Eq. 9 (two geometries): the core's rows pass ``assert_nsa`` with
    ``window="eq9"``; the overlap window's and fla's rows fail where they differ."""
    rng = np.random.default_rng(12)
    caught = {"overlap_window": 0, "fla": 0}
    checked = 0
    for _ in range(80):
        bs, kz, st = [(16, 8, 4), (64, 32, 16)][int(rng.integers(0, 2))]
        g = int(rng.choice([1, 2, 16]))
        seq_len = int(rng.integers(bs, 20 * bs))
        n_q = int(rng.integers(1, 3))
        q = rng.standard_normal((n_q, g, 8)).astype(np.float32)
        k = (rng.standard_normal((seq_len, 1, 8)) * 2).astype(np.float32)
        geo = dict(block_size=bs, window="eq9", kernel_size=kz, kernel_stride=st)
        rows = ks.nsa_select(q, k, 4, **geo)
        assert testing.assert_nsa(rows, q, k, 4, **geo)["wrong"] == 0
        assert np.array_equal(_faulty(q, k, 4, bs, None, window="eq9", kz=kz, st=st), rows)
        checked += rows.size
        for fault, bad in (
            ("overlap_window", _faulty(q, k, 4, bs, "overlap_window", window="eq9", kz=kz, st=st)),
            ("fla", ks.nsa_select(q, k, 4, block_size=bs)),
        ):
            if not np.array_equal(bad, rows):
                d = {"kind": np.asarray("nsa"), "q": q, "k": k, "rows": bad, "block_size": np.asarray(bs)}
                d.update(window=np.asarray("eq9"), kernel_size=np.asarray(kz), kernel_stride=np.asarray(st))
                caught[fault] += int(check_dump(d)["wrong"] > 0)
    assert checked > 100 and all(v > 5 for v in caught.values()), caught


def test_the_window_key_is_checked():
    q = np.ones((1, 2, 4), np.float32)
    k = np.zeros((20, 1, 4), np.float32)
    d = {"kind": np.asarray("nsa"), "q": q, "k": k, "rows": np.array([[[0, 3]]]), "block_size": np.asarray(4)}
    with pytest.raises(DumpError, match="window"):
        check_dump({**d, "window": np.asarray("paper")})
    with pytest.raises(DumpError, match="kernel_stride"):
        check_dump({**d, "window": np.asarray("eq9"), "kernel_stride": np.asarray(3)})
    with pytest.raises(DumpError, match="window"):
        testing.assert_nsa(np.array([[[0, 3]]]), q, k, 2, block_size=4, window="paper")
