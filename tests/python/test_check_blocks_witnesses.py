"""``check_blocks``, ``check_witnesses``, ``block_scores`` and global slot
ids (``GlobalSlots``, ``check_topk(slots=)``): an engine's rows judged by
the rule.

The rows under test look like an engine's, not like kvselect's: NumPy
engine emulators written here return block rows unordered, with the forced
blocks scored 1e30 / 1e29 as vLLM's kernel does and ties broken by a seeded
arrival order, in int64 or int32, head-major ``[H, Q, width]`` (transposed
back before the check); witness rows come from an emulated in-place scatter
(right, and with each kind of bug); token rows are rewritten as vLLM's
global cache slots through a shuffled block table with a block stride wider
than the page and a mix of prefill rows offset by their workspace start.
Every row the rule allows is accepted, each way of being wrong is reported
with its reason, and the native report equals the NumPy reference's
exactly on thousands of randomised rows. Randomised cases use fixed seeds.
"""

import collections
import json

import numpy as np
import pytest
from test_check import _canonical, _order
from test_check import engine as topk_engine

import kvselect as ks
from kvselect import reference as ref

SEED = 20261313
IMPLS = ["native", "reference"]
FORCED_INIT, FORCED_LOCAL = np.float32(1e30), np.float32(1e29)


def _mod(impl):
    return ks if impl == "native" else ref


def _error(impl):
    return ks.SelectionError if impl == "native" else ref.ReferenceSelectionError


def _witness_error(impl):
    """The witness check refuses in the witness domain."""
    return ks.WitnessError if impl == "native" else ref.ReferenceWitnessError


def _reasons(report):
    """``{row: [reason, ...]}`` of a report's wrong rows."""
    return {d["row"]: [p["reason"] for p in d["problems"]] for d in report["details"]}


# ---------------------------------------------------------------------------
# Blocks: an engine emulator (vLLM's MiniMax-M3 block top-k)
# ---------------------------------------------------------------------------


def _block_case(rng, *, n_queries=None, n_heads=None, integer=True):
    """Integer-valued (or normal) queries and keys, a random config, and
    query positions that leave every visible-block count possible."""
    bs = int(rng.choice([1, 2, 4, 8, 16]))
    top, init, local = int(rng.integers(0, 7)), int(rng.integers(0, 3)), int(rng.integers(0, 3))
    cfg = ks.BlockSparseConfig(bs, top if top or init or local else 3, init, local)
    n_pos = int(rng.integers(1, 24 * bs))
    d = int(rng.integers(1, 9))
    nq = int(rng.integers(1, 6)) if n_queries is None else n_queries
    h = int(rng.integers(1, 4)) if n_heads is None else n_heads
    if integer:
        q = rng.integers(-3, 4, (nq, h, d)).astype(np.float32)
        k = rng.integers(-3, 4, (n_pos, d)).astype(np.float32)
    else:
        q = rng.standard_normal((nq, h, d)).astype(np.float32)
        k = rng.standard_normal((n_pos, d)).astype(np.float32)
    pos = rng.integers(0, n_pos + 2 * bs, nq)
    return q, k, pos, cfg


def _visible_blocks(pos, n_pos, bs):
    return -(-np.minimum(pos + 1, n_pos) // bs)


def _forced(n, cfg):
    init_end = min(cfg.init_blocks, n)
    local_start = max(n - min(cfg.local_blocks, n), init_end)
    return list(range(init_end)) + list(range(local_start, n))


def block_engine(rng, scores, visible_blocks, cfg, n_heads, dtype=np.int64):
    """Block rows as vLLM's kernel returns them: the forced blocks scored
    1e30 (init) and 1e29 (local), then a top-k of the budget with ties by a
    random arrival order, each row shuffled and padded with -1, returned
    head-major ``[H, Q, width]``. ``scores`` is ``[Q * H, n_blocks]``
    (query-major rows), ``visible_blocks`` one per row."""
    n_rows = len(visible_blocks)
    width = cfg.width
    rows = np.full((n_rows, width), -1, dtype)
    for i, n in enumerate(visible_blocks):
        n = int(n)
        sc = scores[i, :n].copy()
        forced = _forced(n, cfg)
        sc[: min(cfg.init_blocks, n)] = FORCED_INIT
        sc[[b for b in forced if b >= min(cfg.init_blocks, n)]] = FORCED_LOCAL
        budget = min(max(cfg.top_blocks, len(forced)), n)
        arrival = rng.permutation(n)
        best = arrival[_order(sc[arrival])][:budget]
        rows[i, :budget] = rng.permutation(best)
    nq = n_rows // n_heads
    return np.ascontiguousarray(rows.reshape(nq, n_heads, width).transpose(1, 0, 2))


def _from_head_major(out):
    """``[H, Q, width]`` back to the checker's ``[Q * H, width]`` rows."""
    return out.transpose(1, 0, 2).reshape(-1, out.shape[-1])


def _block_inputs(q, k, pos, cfg):
    """The checker's inputs: exact block scores as rows, visible counts."""
    s = ks.block_scores(q, k, pos, cfg)
    nb = np.repeat(_visible_blocks(pos, len(k), cfg.block_size), q.shape[1])
    return s.reshape(-1, s.shape[-1]), nb


def _free_swap(row, n, scores, cfg, *, strictly_lower=True):
    """A chosen free block and a rejected free one scoring strictly lower
    (or higher), or None."""
    forced = set(_forced(n, cfg))
    chosen = [b for b in row if 0 <= b < n and b not in forced]
    rejected = [b for b in range(n) if b not in forced and b not in set(row.tolist())]
    for a in chosen:
        for b in rejected:
            if (scores[b] < scores[a]) if strictly_lower else (scores[b] > scores[a]):
                return a, b
    return None


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_engine_block_rows_unordered_head_major_with_ties_any_way_are_correct(impl, dtype):
    rng = np.random.default_rng(SEED)
    checked = 0
    for _ in range(60):
        q, k, pos, cfg = _block_case(rng)
        s, nb = _block_inputs(q, k, pos, cfg)
        for _ in range(2):  # two arrival orders: the ties broken two ways
            rows = _from_head_major(block_engine(rng, s, nb, cfg, q.shape[1], dtype))
            assert rows.dtype == dtype
            report = _mod(impl).check_blocks(s, rows, nb, cfg)
            assert report["wrong"] == 0, (cfg, report["details"][:2])
            checked += report["rows"]
    assert checked > 500


@pytest.mark.parametrize("impl", IMPLS)
def test_a_lower_precision_block_engine_is_owed_its_rounding_and_no_more(impl):
    """Block scores off by up to e_b = atol + rtol * m_b: every row chosen on
    them passes the tolerant check, many fail the exact one, and each is
    exactly right for the engine's own scores."""
    rng = np.random.default_rng(SEED + 1)
    tolerant_rows = strict_wrong = 0
    for _ in range(40):
        q, k, pos, cfg = _block_case(rng, n_heads=2)
        s, nb = _block_inputs(q, k, pos, cfg)
        m = ks.block_magnitudes(q, k, pos, cfg).reshape(s.shape)
        atol, rtol = 1.0, 2.0**-5
        e = (atol + rtol * np.nan_to_num(m.astype(np.float64))) * 0.999
        served = (s + rng.uniform(-1, 1, s.shape) * e).astype(np.float32)
        rows = _from_head_major(block_engine(rng, served, nb, cfg, 2))
        mod = _mod(impl)
        tolerant = mod.check_blocks(s, rows, nb, cfg, atol=atol, rtol=rtol, magnitudes=m)
        assert tolerant["wrong"] == 0, tolerant["details"][:1]
        strict = mod.check_blocks(s, rows, nb, cfg)
        assert {r for r, v in strict["by_reason"].items() if v} <= {"wrong_selection"}
        assert mod.check_blocks(served, rows, nb, cfg)["wrong"] == 0
        tolerant_rows += tolerant["rows"]
        strict_wrong += strict["wrong"]
    assert tolerant_rows > 200 and strict_wrong > 10, (tolerant_rows, strict_wrong)


@pytest.mark.parametrize("impl", IMPLS)
def test_each_block_bug_is_reported_with_its_reason(impl):
    rng = np.random.default_rng(SEED + 2)
    seen = dict.fromkeys(["dropped", "duplicate", "future", "hole", "forced"], 0)
    for case in range(120):
        q, k, pos, cfg = _block_case(rng)
        s, nb = _block_inputs(q, k, pos, cfg)
        rows = _from_head_major(block_engine(rng, s, nb, cfg, q.shape[1]))
        bad, want = rows.copy(), {}
        for i in range(len(rows)):
            n, row = int(nb[i]), bad[i]
            valid = int((row >= 0).sum())
            kind = list(seen)[(case + i) % len(seen)]
            forced = _forced(n, cfg)
            if kind == "dropped" and (swap := _free_swap(row, n, s[i], cfg)):
                row[row == swap[0]] = swap[1]
                want[i] = ["wrong_selection"]
            elif kind == "duplicate" and valid >= 2:
                row[valid - 1] = row[0]
                want[i] = ["duplicate"]
            elif kind == "future" and valid >= 1:
                row[int(rng.integers(valid))] = n + int(rng.integers(0, 3))
                want[i] = ["not_causal"]
            elif kind == "hole" and valid >= 2:
                row[0] = -1
                want[i] = ["padding_hole"]
            elif kind == "forced" and forced and valid < n:
                missing = int(rng.choice(forced))
                free = [b for b in range(n) if b not in set(row.tolist())]
                row[row == missing] = int(rng.choice(free))
                want[i] = ["missing_forced"]
            else:
                continue
            seen[kind] += 1
        report = _mod(impl).check_blocks(s, bad, nb, cfg)
        got = _reasons(report)
        assert set(got) == set(want), (case, cfg, got, want)
        for i, reasons in want.items():
            assert reasons[0] in got[i], (case, i, got[i], want[i])
        for i in got:  # a dropped candidate is exactly one swap: nothing else is wrong
            if want[i] == ["wrong_selection"]:
                p = report["details"][[d["row"] for d in report["details"]].index(i)]["problems"]
                assert len(p) == 1 and p[0]["n_dropped"] >= 1 and p[0]["n_intruders"] >= 1
    assert all(v >= 20 for v in seen.values()), seen


def test_a_block_report_names_what_is_wrong():
    cfg = ks.BlockSparseConfig(4, 4, 1, 1)
    s = np.array([[9, 5, 3, 1, 4, 0]], np.float32)  # block 0 init, block 5 local
    nb = [6]
    good = np.array([[5, 1, 0, 4]])  # free blocks 1, 4 (5 and 4 beat 3 and 1)
    assert ks.check_blocks(s, good, nb, cfg)["wrong"] == 0
    for impl in IMPLS:
        check = _mod(impl).check_blocks
        r = check(s, np.array([[5, 1, 0, 3]]), nb, cfg)["details"][0]["problems"]
        assert r == [
            {
                "reason": "wrong_selection",
                "dropped": [(4, 4.0)],
                "intruders": [(3, 1.0)],
                "n_dropped": 1,
                "n_intruders": 1,
                "threshold": 4.0,
                "margin": 3.0,
            }
        ]
        r = check(s, np.array([[2, 1, 3, 4]]), nb, cfg)["details"][0]["problems"]
        assert r == [{"reason": "missing_forced", "blocks": [0, 5], "n_missing": 2}]
        r = check(s, np.array([[5, 0, 1, -1]]), nb, cfg)["details"][0]["problems"]
        assert r == [{"reason": "wrong_count", "valid": 3, "expected": 4}]
        # The forced blocks' own scores never enter the comparison: a forced
        # block scoring below every free one is no intruder.
        low = s.copy()
        low[0, 0] = -100
        assert check(low, good, nb, cfg)["wrong"] == 0


def test_native_block_report_equals_reference_on_randomised_engine_rows_with_bugs():
    rng = np.random.default_rng(SEED + 3)
    checked = wrong = 0
    totals = collections.Counter()
    for case in range(400):
        q, k, pos, cfg = _block_case(rng, integer=case % 4 != 0)
        s, nb = _block_inputs(q, k, pos, cfg)
        if case % 5 == 0:  # ties, NaN, infinities among the scores
            s = np.round(s)
            s[rng.random(s.shape) < 0.05] = np.nan
            s[rng.random(s.shape) < 0.03] = -np.inf
        rows = _from_head_major(
            block_engine(rng, np.nan_to_num(s, nan=-np.inf), nb, cfg, q.shape[1], np.int32 if case % 2 else np.int64)
        )
        hit = rng.random(rows.shape) < 0.06
        rows[hit] = rng.integers(-2, s.shape[1] + 2, int(hit.sum()))
        for i in np.flatnonzero(rng.random(len(rows)) < 0.3):  # a lower free block for a chosen one
            swap = _free_swap(rows[i], int(nb[i]), s[i], cfg)
            if swap:
                rows[i][rows[i] == swap[0]] = swap[1]
        kw = dict(atol=float(rng.choice([0.0, 0.5])))
        if case % 3 == 0:  # |q| . |k| bounds the scores' rounding (any magnitudes do here)
            m = ks.block_scores(np.abs(q), np.abs(k), pos, cfg).reshape(s.shape)
            kw.update(rtol=0.125, magnitudes=np.nan_to_num(m, nan=1.0))
        lays = {"native": None, "reference": None}
        if case % 3 == 2:  # physical block ids: each query's blocks through a shuffled table
            n_q, n_req = q.shape[0], 2
            table = rng.permutation(n_req * s.shape[1] + 3)[: n_req * s.shape[1]].astype(np.int32)
            table = table.reshape(n_req, s.shape[1])
            req = np.repeat(rng.integers(0, n_req, n_q), q.shape[1])
            rows = np.where(rows >= 0, table[req[:, None], np.clip(rows, 0, s.shape[1] - 1)], rows)
            rows[rng.random(rows.shape) < 0.02] = table.size + 7  # a page of no request
            lays = {"native": ks.GlobalSlots(table, req, 1), "reference": ref.GlobalSlots(table, req, 1)}
        a = ks.check_blocks(s, rows, nb, cfg, slots=lays["native"], **kw)
        b = ref.check_blocks(s, rows, nb, cfg, slots=lays["reference"], **kw)
        assert _canonical(a) == _canonical(b), f"case {case}"
        assert json.dumps(a) == json.dumps(b), f"case {case}: the same report, keys in another order"
        checked += a["rows"]
        wrong += a["wrong"]
        totals.update(a["by_reason"])
    assert checked > 2000 and 0.1 * checked < wrong < 0.9 * checked, (checked, wrong)
    assert min(totals.values()) >= 20, totals  # every reason, many times


# ---------------------------------------------------------------------------
# block_scores: the exact scores block selection ranks
# ---------------------------------------------------------------------------


def test_block_scores_equal_the_reference_on_integer_data():
    rng = np.random.default_rng(SEED + 4)
    for case in range(150):
        q, k, pos, cfg = _block_case(rng)
        if case % 7 == 0:
            k[rng.random(len(k)) < 0.2] = np.nan  # NaN keys: ignored, -inf for an all-NaN block
        for name in ("block_scores", "block_magnitudes"):
            a = getattr(ks, name)(q, k, pos, cfg)
            b = getattr(ref, name)(q, k, pos, cfg)
            assert a.dtype == b.dtype == np.float32 and a.shape == b.shape
            assert np.array_equal(a.view(np.uint32), b.view(np.uint32)) or np.array_equal(a, b, equal_nan=True), case
            nb = _visible_blocks(pos, len(k), cfg.block_size)
            for i, n in enumerate(nb):  # NaN exactly past each query's visible blocks
                assert np.isnan(a[i, :, n:]).all() and not np.isnan(a[i, :, :n]).any(), (case, i)
        m = ks.block_magnitudes(q, k, pos, cfg)
        s = ks.block_scores(q, k, pos, cfg)
        finite = np.isfinite(s)
        assert (np.abs(s[finite]) <= m[finite]).all()


@pytest.mark.parametrize("integer", [True, False])
def test_block_scores_are_what_selection_ranks_bit_for_bit(integer):
    """The selection's own rows are exactly right for these scores, on float
    data too; and trading a chosen free block for a strictly lower one is
    always a wrong selection, so the scores are not merely close."""
    rng = np.random.default_rng(SEED + 5 + integer)
    flipped = 0
    for case in range(80):
        q, k, pos, cfg = _block_case(rng, integer=integer)
        s, nb = _block_inputs(q, k, pos, cfg)
        rows = ks.block_sparse_select(q, k, pos, cfg).reshape(-1, cfg.width)
        assert ks.check_blocks(s, rows, nb, cfg)["wrong"] == 0, case
        hm = ks.block_sparse_select(q, k, pos, cfg, head_major=True)
        assert ks.check_blocks(s, _from_head_major(hm), nb, cfg)["wrong"] == 0
        bad = rows.copy()
        flips = []
        for i in range(len(rows)):
            swap = _free_swap(bad[i], int(nb[i]), s[i], cfg)
            if swap:
                bad[i][bad[i] == swap[0]] = swap[1]
                flips.append(i)
        report = ks.check_blocks(s, bad, nb, cfg)
        assert sorted(_reasons(report)) == flips and all(r == ["wrong_selection"] for r in _reasons(report).values())
        flipped += len(flips)
    assert flipped > 100


def test_block_scores_of_bfloat16_keys_are_what_their_selection_ranks():
    rng = np.random.default_rng(SEED + 7)
    for _ in range(20):
        q, k, pos, cfg = _block_case(rng, integer=False)
        k16 = (k.view(np.uint32) >> 16).astype(np.uint16)  # raw bfloat16 bits (truncated)
        s = ks.block_scores(q, k16, pos, cfg, key_format="bfloat16")
        assert np.array_equal(
            s, ref.block_scores(q, k16, pos, cfg, key_format="bfloat16"), equal_nan=True
        ) or np.allclose(
            s, ref.block_scores(q, k16, pos, cfg, key_format="bfloat16"), rtol=1e-5, atol=1e-5, equal_nan=True
        )
        rows = ks.block_sparse_select(q, k16, pos, cfg, key_format="bfloat16").reshape(-1, cfg.width)
        nb = np.repeat(_visible_blocks(pos, len(k), cfg.block_size), q.shape[1])
        assert ks.check_blocks(s.reshape(len(rows), -1), rows, nb, cfg)["wrong"] == 0


def test_physical_block_ids_read_back_through_the_block_table():
    """MiniMax-M3's physical ids (``block_sparse_select_paged(physical=True)``)
    are the global-slot map with one token per block."""
    rng = np.random.default_rng(SEED + 8)
    for _ in range(20):
        cfg = ks.BlockSparseConfig(4, int(rng.integers(1, 6)), 1, 1)
        d, max_blocks = 3, 8
        lens = rng.integers(1, 4 * max_blocks + 1, 2)
        n_pages = 2 * max_blocks + 3
        table = rng.permutation(n_pages)[: 2 * max_blocks].astype(np.int32).reshape(2, max_blocks)
        cache = rng.integers(-3, 4, (n_pages, 4, d)).astype(np.float32)
        sid = rng.integers(0, 2, 5)
        pos = np.array([int(rng.integers(0, lens[s])) for s in sid])
        q = rng.integers(-3, 4, (5, 2, d)).astype(np.float32)
        phys = ks.block_sparse_select_paged(q, cache, table, lens, sid, pos, cfg, physical=True)
        keys = [cache[table[s]].reshape(-1, d)[: lens[s]] for s in range(2)]
        s = np.full((5, 2, max_blocks), np.nan, np.float32)
        for j in range(5):
            one = ks.block_scores(q[j : j + 1], keys[sid[j]], pos[j : j + 1], cfg)[0]
            s[j, :, : one.shape[1]] = one
        nb = np.repeat(_visible_blocks(pos, lens[sid], 4), 2)
        layout = ks.GlobalSlots(table, np.repeat(sid, 2), 1)
        rows = phys.reshape(-1, cfg.width)
        for impl in IMPLS:
            lay = layout if impl == "native" else ref.GlobalSlots(table, np.repeat(sid, 2), 1)
            report = _mod(impl).check_blocks(s.reshape(10, -1), rows, nb, cfg, slots=lay)
            assert report["wrong"] == 0, report["details"][:1]
            # Another request's page is in no row of this one's table.
            bad = rows.copy()
            other = table[1 - np.repeat(sid, 2)[0]]
            bad[0, 0] = int(other[0])
            got = _mod(impl).check_blocks(s.reshape(10, -1), bad, nb, cfg, slots=lay)
            assert got["details"][0]["problems"][0] == {"reason": "not_in_table", "slot": 0, "value": int(other[0])}


# ---------------------------------------------------------------------------
# Global slot ids: vLLM's index converter, emulated
# ---------------------------------------------------------------------------


def _slots_case(rng, n_req=3, max_blocks=6):
    """A shuffled block table, a block stride wider than the page, rows of
    mixed requests with some prefill rows offset by their workspace start."""
    bs = int(rng.choice([1, 2, 4, 16]))
    stride = bs + int(rng.choice([0, 1, bs, 3 * bs]))
    n_pages = n_req * max_blocks + 5
    table = rng.permutation(n_pages)[: n_req * max_blocks].astype(np.int32).reshape(n_req, max_blocks)
    table[rng.random(table.shape) < 0.1] = -1  # unused entries
    n_rows = int(rng.integers(1, 10))
    req = rng.integers(0, n_req, n_rows)
    n_prefill = 2
    prefill = np.where(rng.random(n_rows) < 0.4, rng.integers(0, n_prefill, n_rows), -1)
    starts = rng.integers(0, 10_000, n_prefill)
    return bs, stride, table, req, prefill, starts


def to_global(rows, bs, stride, table, req, prefill, starts):
    """vLLM's ``triton_convert_req_index_to_global_index``: row-relative
    positions to global slots (``-1`` kept); a position past the table's
    entries is written as ``-1`` too, as the kernel masks it."""
    out = np.full(rows.shape, -1, np.int64)
    for i, row in enumerate(rows):
        for j, t in enumerate(int(x) for x in row):
            if t < 0:
                continue
            if prefill[i] >= 0:
                out[i, j] = starts[prefill[i]] + t
            elif t // bs < table.shape[1] and table[req[i], t // bs] >= 0:
                out[i, j] = int(table[req[i], t // bs]) * stride + t % bs
    return out


def _layouts(bs, stride, table, req, prefill, starts):
    kw = dict(block_stride_rows=stride, prefill_req_ids=prefill, workspace_starts=starts)
    return {"native": ks.GlobalSlots(table, req, bs, **kw), "reference": ref.GlobalSlots(table, req, bs, **kw)}


def _lens_within_table(rng, bs, table, req, prefill):
    """Contexts whose every position has a table entry (decode rows)."""
    lens = []
    for i, r in enumerate(req):
        if prefill[i] >= 0:
            lens.append(int(rng.integers(1, 60)))
            continue
        mapped = np.flatnonzero(table[r] < 0)
        blocks = int(mapped[0]) if len(mapped) else table.shape[1]
        lens.append(int(rng.integers(1, max(blocks * bs, 1) + 1)) if blocks else 0)
    return np.array(lens)


def _mappable(bs, table, req, prefill, i, t):
    """How many leading positions of row ``i`` the converter maps."""
    if prefill[i] >= 0:
        return t + 5
    unused = np.flatnonzero(table[req[i]] < 0)
    return (int(unused[0]) if len(unused) else table.shape[1]) * bs


@pytest.mark.parametrize("impl", IMPLS)
def test_global_slot_rows_are_judged_as_their_positions(impl):
    rng = np.random.default_rng(SEED + 9)
    rows_checked = named = 0
    for _ in range(80):
        bs, stride, table, req, prefill, starts = _slots_case(rng)
        lens = _lens_within_table(rng, bs, table, req, prefill)
        t = max(int(lens.max()), 1)
        s = rng.integers(-3, 5, (len(req), t)).clip(0, None).astype(np.float32)
        topk = int(rng.integers(1, 20))
        rel = topk_engine(rng, s, lens, topk, rng.choice([np.int32, np.int64]))
        glob = to_global(rel, bs, stride, table, req, prefill, starts)
        layout = _layouts(bs, stride, table, req, prefill, starts)[impl]
        mod = _mod(impl)
        report = mod.check_topk(s, glob, lens, topk=topk, slots=layout)
        assert report["wrong"] == 0, report["details"][:1]
        # A bug in row-relative terms reads back as the same report.
        bad = rel.copy()
        hit = rng.random(bad.shape) < 0.1
        for i, j in zip(*np.nonzero(hit)):  # any position the table maps, causal or not
            limit = _mappable(bs, table, req, prefill, i, t)
            bad[i, j] = rng.integers(-1, limit) if limit else -1
        want = mod.check_topk(s, bad, lens, topk=topk)
        bad_global = to_global(bad, bs, stride, table, req, prefill, starts)
        got = mod.check_topk(s, bad_global, lens, topk=topk, slots=layout)
        # A future position read back through the layout also names the
        # slot id the engine wrote; otherwise the report is the relative one.
        for d in got["details"]:
            for p in d["problems"]:
                if p["reason"] == "not_causal":
                    assert p.pop("value") == bad_global[d["row"], p["slot"]]
                    named += 1
        assert _canonical(got) == _canonical(want)
        rows_checked += len(req)
    assert rows_checked > 300 and named > 10


@pytest.mark.parametrize("impl", IMPLS)
def test_a_global_slot_outside_the_table_is_reported_with_the_engines_value(impl):
    rng = np.random.default_rng(SEED + 10)
    seen = {"foreign page": 0, "offset past page": 0, "before workspace": 0}
    for _ in range(60):
        bs, stride, table, req, prefill, starts = _slots_case(rng)
        lens = _lens_within_table(rng, bs, table, req, prefill)
        t = max(int(lens.max()), 1)
        s = rng.standard_normal((len(req), t)).astype(np.float32)
        glob = to_global(topk_engine(rng, s, lens, 8), bs, stride, table, req, prefill, starts)
        want = {}
        for i in range(len(req)):
            valid = int((glob[i] >= 0).sum())
            if valid == 0:
                continue
            slot = int(rng.integers(valid))
            if prefill[i] >= 0:
                if starts[prefill[i]] == 0:
                    continue
                value, kind = int(starts[prefill[i]]) - 1 - int(rng.integers(0, starts[prefill[i]])), "before workspace"
            elif stride > bs and rng.random() < 0.5:
                page = table[req[i]][table[req[i]] >= 0][0]
                value, kind = int(page) * stride + bs + int(rng.integers(0, stride - bs)), "offset past page"
            else:  # a page of another request (or of no request): the wrong block table row
                foreign = sorted(set(range(table.size + 5)) - set(table[req[i]].tolist()))
                value, kind = int(rng.choice(foreign)) * stride + int(rng.integers(0, bs)), "foreign page"
            glob[i, slot] = value
            want[i] = {"reason": "not_in_table", "slot": slot, "value": value}
            seen[kind] += 1
        layout = _layouts(bs, stride, table, req, prefill, starts)[impl]
        report = _mod(impl).check_topk(s, glob, lens, topk=8, slots=layout)
        got = {d["row"]: d["problems"] for d in report["details"]}
        assert set(got) == set(want)
        for i, p in want.items():
            assert got[i][0] == p and [q["reason"] for q in got[i]] == ["not_in_table", "wrong_count"], got[i]
        assert report["by_reason"]["not_in_table"] == len(want)
    assert all(v >= 10 for v in seen.values()), seen


def test_the_inverse_map_reads_the_first_logical_block_of_a_page():
    table = np.array([[7, -1, 7, 2]], np.int32)  # page 7 twice: logical block 0 wins
    s = np.arange(16, dtype=np.float32)[None]
    rows = np.array([[7 * 4 + 3, 2 * 4, -1, -1]])  # positions 3 and 12
    for impl in IMPLS:
        m = _mod(impl)
        lay = m.GlobalSlots(table, [0], 4)
        r = m.check_topk(s, rows, topk=2, slots=lay)
        assert r["details"][0]["problems"][0]["reason"] == "wrong_selection"
        assert r["details"][0]["problems"][0]["intruders"] == [(3, 3.0), (12, 12.0)]  # not 11: block 2
        r = m.check_topk(s, np.array([[13, 7 * 4 + 1, 15, -1]]), topk=3, slots=lay)  # page 3: in no entry
        assert [p["reason"] for p in r["details"][0]["problems"]] == ["not_in_table", "not_in_table", "wrong_count"]
        assert [p.get("value") for p in r["details"][0]["problems"]] == [13, 15, None]
        assert r["details"][0]["problems"][1]["slot"] == 2


def test_native_global_slot_report_equals_reference_on_random_slots():
    rng = np.random.default_rng(SEED + 11)
    checked = 0
    totals = collections.Counter()
    for case in range(400):
        bs, stride, table, req, prefill, starts = _slots_case(rng)
        lens = _lens_within_table(rng, bs, table, req, prefill)
        t = max(int(lens.max()), 1)
        s = rng.integers(-4, 6, (len(req), t)).astype(np.float32)
        topk = int(rng.integers(1, 12))
        rel = topk_engine(rng, s, lens, topk)
        for i in np.flatnonzero(rng.random(len(req)) < 0.4):  # another position for a chosen one
            valid = np.flatnonzero(rel[i] >= 0)
            limit = _mappable(bs, table, req, prefill, i, t)
            if len(valid) and limit:  # mostly within the context, sometimes past it
                rel[i, rng.choice(valid)] = rng.integers(0, lens[i] if lens[i] and rng.random() < 0.8 else limit)
        glob = to_global(rel, bs, stride, table, req, prefill, starts)
        hit = rng.random(glob.shape) < 0.04  # any slot at all: in, out of, or past the table
        glob[hit] = rng.integers(-2, (table.size + 6) * stride, int(hit.sum()))
        lays = _layouts(bs, stride, table, req, prefill, starts)
        a = ks.check_topk(s, glob, lens, topk=topk, slots=lays["native"])
        b = ref.check_topk(s, glob, lens, topk=topk, slots=lays["reference"])
        assert _canonical(a) == _canonical(b), f"case {case}"
        assert json.dumps(a) == json.dumps(b), f"case {case}: the same report, keys in another order"
        checked += a["rows"]
        totals.update(a["by_reason"])
    assert checked > 1000
    assert min(totals.values()) >= 20, totals


# ---------------------------------------------------------------------------
# Witnesses: an engine's in-place scatter, emulated
# ---------------------------------------------------------------------------


def scatter_engine(buf, lens, S, bug=None, rng=None):
    """vLLM's ``scatter_topology_witnesses_`` written from the spec, in
    place on ``buf`` (int32 or int64): keep = max(topk - S, 0); the left
    edges of the segments the learned row leaves uncovered, ascending, into
    slots keep, keep + 1, ... up to min(S, topk). ``bug`` plants one kind of
    bug per row where the row allows it; returns the rows it changed."""
    topk = buf.shape[1]
    keep = max(topk - S, 0)
    bugged = {}
    for i, L in enumerate(int(x) for x in lens):
        learned = buf[i].copy()
        run, covered, uncovered = [], [], []
        if L > 0:
            s_eff = min(S, L)
            occ = {min(int(x) * s_eff // L, S - 1) for x in learned if x >= 0}
            edges = [-(-s * L // s_eff) for s in range(s_eff)]
            uncovered = [e for s, e in enumerate(edges) if s not in occ]
            run = uncovered[: topk - keep]
            covered = [e for s, e in enumerate(edges) if s in occ]
        buf[i, keep : keep + len(run)] = run
        if bug is None:
            continue
        if bug == "swap" and len(run) >= 2:  # the run not ascending: a witness in the wrong slot
            a, b = sorted(rng.choice(len(run), 2, replace=False))
            buf[i, keep + a], buf[i, keep + b] = run[b], run[a]
        elif bug == "shift" and 1 <= len(run) < topk - keep and learned[keep] != run[0]:  # one slot late
            buf[i, keep + 1 : keep + 1 + len(run)] = run
            buf[i, keep] = learned[keep]
        elif bug == "prefix" and keep > 0:
            j = int(rng.integers(keep))
            buf[i, j] = learned[j] + 1
        elif bug == "tail" and keep + len(run) < topk:
            j = int(rng.integers(keep + len(run), topk))
            buf[i, j] = learned[j] - 1 if learned[j] >= 0 else 0
        elif bug == "covered" and run and set(covered) - {learned[keep]}:
            buf[i, keep] = int(rng.choice(sorted(set(covered) - {learned[keep]})))
        elif bug == "past" and run and learned[keep] != max(L, 1):
            buf[i, keep] = max(L, 1)
        elif bug == "unwritten" and run and learned[keep] != run[0]:
            buf[i, keep] = learned[keep]
        elif bug == "beyond" and 0 < len(run) < len(uncovered) and uncovered[len(run)] not in learned:
            buf[i, keep + len(run) - 1] = uncovered[len(run)]  # a witness past the budget
        else:
            continue
        bugged[i] = bug
    return bugged


def _witness_case(rng, rows=None):
    S = int(rng.integers(1, 17))
    topk = int(rng.integers(1, 40))
    rows = int(rng.integers(1, 12)) if rows is None else rows
    lens = rng.integers(-2, 400, rows).astype(np.int32)
    learned = np.full((rows, topk), -1, np.int32)
    for i, L in enumerate(lens):
        n = int(rng.integers(0, topk + 1))
        learned[i, :n] = rng.integers(0, max(int(L), 1) + 5, n)  # some past the context
    return learned, lens, S


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_the_engines_correct_scatter_is_accepted(impl, dtype):
    rng = np.random.default_rng(SEED + 12)
    for _ in range(100):
        before, lens, S = _witness_case(rng)
        before = before.astype(dtype)
        after = before.copy()
        assert scatter_engine(after, lens, S) == {}
        native = before.astype(np.int32)
        ks.scatter_topology_witnesses(native, lens, S)
        assert np.array_equal(after, native)  # the emulator is the rule
        report = _mod(impl).check_witnesses(before, after, lens, S)
        assert report["wrong"] == 0 and report["rows"] == len(lens), report["details"][:1]


WHY = {
    "swap": "a witness in the wrong slot (the run must ascend by segment)",
    "covered": "the edge of a segment the learned row already covers",
    "past": "past the context",
    "unwritten": "not written: the learned entry is still there",
    "beyond": "a witness past the budget, or one the learned row's tail already holds",
}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("bug", ["swap", "shift", "prefix", "tail", "covered", "past", "unwritten", "beyond"])
def test_each_witness_bug_is_reported_with_its_reason(impl, bug):
    rng = np.random.default_rng(SEED + 13)
    planted = 0
    for _ in range(200):
        before, lens, S = _witness_case(rng)
        after = before.copy()
        bugged = scatter_engine(after, lens, S, bug, rng)
        report = _mod(impl).check_witnesses(before, after, lens, S)
        got = {d["row"]: d["problems"] for d in report["details"]}
        assert set(got) == set(bugged), (bug, got, bugged)
        for i in bugged:
            reasons = [p["reason"] for p in got[i]]
            want = {"prefix": "prefix_changed", "tail": "tail_changed"}.get(bug, "wrong_witness")
            if bug == "shift":  # the last witness lands past the run, on the tail
                assert reasons in (["wrong_witness"], ["wrong_witness", "tail_changed"]), got[i]
            else:
                assert reasons == [want], (bug, got[i])
            p = got[i][0]
            if bug in WHY:
                assert p["why"] == WHY[bug], (bug, p)
            if bug == "shift":
                assert p["slot"] == max(before.shape[1] - S, 0)
            assert p["got"] == after[i, p["slot"]]
        planted += len(bugged)
    assert planted >= 30, planted


def test_a_witness_report_names_the_slot_the_rule_and_the_engine():
    before = np.array([[0, 1, -1, -1]], np.int32)  # L = 16, S = 4: segments 1, 2, 3 uncovered
    after = before.copy()
    ks.scatter_topology_witnesses(after, [16], 4)
    assert after.tolist() == [[4, 8, 12, -1]]
    wrong = np.array([[4, 12, 8, -1]], np.int32)
    for impl in IMPLS:
        r = _mod(impl).check_witnesses(before, wrong, [16], 4)
        assert r["details"] == [
            {
                "row": 0,
                "problems": [
                    {
                        "reason": "wrong_witness",
                        "slot": 1,
                        "expected": 8,
                        "got": 12,
                        "why": "a witness in the wrong slot (the run must ascend by segment)",
                        "n_wrong": 2,
                    }
                ],
            }
        ]
        r = _mod(impl).check_witnesses(before, np.array([[4, 8, 13, 5]], np.int32), [16], 4)
        assert r["details"][0]["problems"] == [
            {
                "reason": "wrong_witness",
                "slot": 2,
                "expected": 12,
                "got": 13,
                "why": "not a segment's left edge",
                "n_wrong": 1,
            },
            {"reason": "tail_changed", "slot": 3, "learned": -1, "got": 5, "n_changed": 1},
        ]


def test_native_witness_report_equals_reference_on_randomised_engine_rows_with_bugs():
    rng = np.random.default_rng(SEED + 14)
    checked = wrong = 0
    whys = collections.Counter()
    bugs = [None, "swap", "shift", "prefix", "tail", "covered", "past", "unwritten", "beyond"]
    for case in range(400):
        before, lens, S = _witness_case(rng)
        after = before.copy()
        scatter_engine(after, lens, S, bugs[case % len(bugs)], rng)
        hit = rng.random(after.shape) < 0.03  # and random damage anywhere
        after[hit] = rng.integers(-1, 420, int(hit.sum()))
        a = ks.check_witnesses(before, after, lens, S)
        b = ref.check_witnesses(before, after, lens, S)
        assert _canonical(a) == _canonical(b), f"case {case}"
        assert json.dumps(a) == json.dumps(b), f"case {case}: the same report, keys in another order"
        checked += a["rows"]
        wrong += a["wrong"]
        whys.update(p.get("why", p["reason"]) for d in a["details"] for p in d["problems"])
    assert checked > 2000 and wrong > 500, (checked, wrong)
    assert len(whys) >= 2 + 6 and min(whys.values()) >= 5, whys  # every contract (padding: rarely)


@pytest.mark.parametrize("impl", IMPLS)
def test_every_report_lists_its_reasons_in_the_documented_order(impl):
    m = _mod(impl)
    cfg, s, rows, nb = _block_args()
    b = np.zeros((1, 4), np.int32)
    reports = {
        "topk": m.check_topk(s, rows),
        "blocks": m.check_blocks(s, rows, nb, cfg),
        "witnesses": m.check_witnesses(b, b, [8], 2),
    }
    for report in reports.values():
        assert list(report) == ["rows", "correct", "wrong", "by_reason", "details"]
    assert list(reports["topk"]["by_reason"]) == [
        "padding_hole",
        "duplicate",
        "not_causal",
        "not_in_table",
        "wrong_count",
        "wrong_selection",
    ]
    assert list(reports["blocks"]["by_reason"]) == [
        "padding_hole",
        "duplicate",
        "not_causal",
        "not_in_table",
        "missing_forced",
        "wrong_count",
        "wrong_selection",
    ]
    assert list(reports["witnesses"]["by_reason"]) == ["prefix_changed", "wrong_witness", "tail_changed"]


# ---------------------------------------------------------------------------
# Bad arguments: refused naming them, buffers unchanged
# ---------------------------------------------------------------------------


def _block_args():
    cfg = ks.BlockSparseConfig(4, 3, 1, 1)
    s = np.arange(12, dtype=np.float32).reshape(2, 6)
    rows = np.array([[0, 5, 4], [0, 3, 2]])
    return cfg, s, rows, np.array([6, 4])


@pytest.mark.parametrize("impl", IMPLS)
def test_bad_block_check_arguments_are_refused_naming_them(impl):
    cfg, s, rows, nb = _block_args()
    m = _mod(impl)
    check = m.check_blocks
    assert check(s, rows, nb, cfg)["wrong"] == 0
    watched = [s, rows, nb]
    before = [a.copy() for a in watched]
    for argument, call in [
        ("config", lambda: check(s, rows[:, :2], nb, cfg)),
        ("rows", lambda: check(s, rows[None], nb, cfg)),
        ("rows", lambda: check(s, rows[:1], nb, cfg)),
        ("rtol", lambda: check(s, rows, nb, cfg, rtol=0.1)),
        ("atol", lambda: check(s, rows, nb, cfg, atol=-1.0)),
        ("magnitudes", lambda: check(s, rows, nb, cfg, magnitudes=np.zeros((2, 5), np.float32))),
        ("magnitudes", lambda: check(s, rows, nb, cfg, rtol=0.1, magnitudes=np.full((2, 6), np.nan, np.float32))),
        ("visible_blocks", lambda: check(s, rows, [-1, 4], cfg)),
        ("block_size", lambda: check(s, rows, nb, cfg, slots=m.GlobalSlots(np.zeros((1, 2), np.int32), [0, 0], 0))),
    ]:
        with pytest.raises(_error(impl)) as e:
            call()
        assert e.value.argument == argument, (argument, str(e.value))
    # The native extraction names ``slots`` in the exception's note
    # ("while processing 'slots'"), which ``match`` reads too.
    for argument, call in [
        ("rows", lambda: check(s, rows.astype(np.float32), nb, cfg)),
        ("config", lambda: check(s, rows, nb, "cfg")),
        ("block_scores", lambda: check(s.astype(np.int32), rows, nb, cfg)),
        ("slots", lambda: check(s, rows, nb, cfg, slots="x")),
    ]:
        with pytest.raises(TypeError, match=rf"^{argument} must|while processing '{argument}'"):
            call()
    assert all(np.array_equal(a, b) for a, b in zip(watched, before))


# Refusals name the Python parameter the caller passed (the native bindings
# once named the core's argument, panicked on a witness buffer with more
# lengths than rows and no segments, and accepted one with fewer).


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "argument, bad",
    [
        ("block_scores", "3d"),
        ("visible_blocks", "rows"),  # block_scores and rows agree: visible_blocks is the odd one out
        ("visible_blocks", "past"),
    ],
)
def test_bad_block_scores_and_visible_blocks_are_named_as_passed(impl, argument, bad, request):
    cfg, s, rows, nb = _block_args()
    call = {
        "3d": lambda: _mod(impl).check_blocks(s[None], rows, nb, cfg),
        "rows": lambda: _mod(impl).check_blocks(s, rows, [6, 4, 3], cfg),
        "past": lambda: _mod(impl).check_blocks(s, rows, [7, 4], cfg),
    }[bad]
    with pytest.raises(_error(impl)) as e:
        call()
    assert e.value.argument == argument, str(e.value)


@pytest.mark.parametrize("impl", IMPLS)
def test_bad_block_scores_arguments_are_refused_naming_them(impl):
    m = _mod(impl)
    cfg = ks.BlockSparseConfig(4, 3, 1, 1)
    rng = np.random.default_rng(0)
    q = rng.integers(-3, 4, (3, 2, 5)).astype(np.float32)
    k = rng.integers(-3, 4, (18, 5)).astype(np.float32)
    for argument, call in [
        ("query_pos", lambda: m.block_scores(q, k, [0, 7], cfg)),
        ("query_pos", lambda: m.block_scores(q, k, [0, 7, -1], cfg)),
        ("index_q", lambda: m.block_scores(q[0], k, 3, cfg)),
        ("index_q", lambda: m.block_scores(q, k[:, :4], [0, 7, 30], cfg)),
        ("index_k", lambda: m.block_scores(q, k[None], [0, 7, 30], cfg)),
    ]:
        with pytest.raises(_error(impl)) as e:
            call()
        assert e.value.argument == argument, (argument, str(e.value))
    for argument, call in [
        ("magnitudes", lambda: m.block_scores(q, k, [0, 7, 3], cfg, magnitudes=1)),
        ("index_k", lambda: m.block_scores(q, k.astype(np.int32), [0, 7, 3], cfg)),
        ("query_pos", lambda: m.block_scores(q, k, [0.0, 7.0, 3.0], cfg)),
    ]:
        with pytest.raises(TypeError, match=rf"^{argument} (must|has)|keyword argument '{argument}'"):
            call()
    assert m.block_scores(q, k[:0], [0, 7, 3], cfg).shape == (3, 2, 0)
    assert m.block_scores(q[:0], k, [], cfg).shape == (0, 2, 5)


@pytest.mark.parametrize("impl", IMPLS)
def test_bad_global_slots_are_refused_naming_them(impl):
    m = _mod(impl)
    s = np.zeros((1, 8), np.float32)
    rows = np.array([[12, 13, -1]])
    t = np.array([[3, 1]], np.int32)
    for argument, make in [
        ("block_table", lambda: m.GlobalSlots(np.array([3, 1]), [0], 4)),
        ("block_table", lambda: m.GlobalSlots(np.array([[2**40]]), [0], 4)),
        ("req_ids", lambda: m.GlobalSlots(t, [-1], 4)),
        ("block_size", lambda: m.GlobalSlots(t, [0], -4)),
        ("block_stride_rows", lambda: m.GlobalSlots(t, [0], 4, block_stride_rows=-1)),
        ("workspace_starts", lambda: m.GlobalSlots(t, [0], 4, prefill_req_ids=[0])),
        ("workspace_starts", lambda: m.GlobalSlots(t, [0], 4, workspace_starts=[0])),
        # No rows can make these right: refused at once.
        ("block_size", lambda: m.GlobalSlots(t, [0], 0)),
        ("block_stride_rows", lambda: m.GlobalSlots(t, [0], 4, block_stride_rows=3)),
    ]:
        with pytest.raises(_error(impl)) as e:
            make()
        assert e.value.argument == argument, (argument, str(e.value))
    with pytest.raises(TypeError, match=r"^block_table must hold integers.*got dtype float64$"):
        m.GlobalSlots(t.astype(float), [0], 4)
    # Judged against the rows when a check uses them.
    for argument, lay in [
        ("block_table", m.GlobalSlots(np.zeros((1, 0), np.int32), [0], 4)),
        ("req_ids", m.GlobalSlots(t, [0, 0], 4)),
        ("req_ids", m.GlobalSlots(t, [1], 4)),
        ("prefill_req_ids", m.GlobalSlots(t, [0], 4, prefill_req_ids=[1], workspace_starts=[0])),
        ("prefill_req_ids", m.GlobalSlots(t, [0], 4, prefill_req_ids=[0, 1], workspace_starts=[0])),
    ]:
        with pytest.raises(_error(impl)) as e:
            m.check_topk(s, rows, slots=lay)
        assert e.value.argument == argument, (argument, str(e.value))
    # What slots= takes, and that it is slots (natively in the note, "while processing 'slots'").
    with pytest.raises(TypeError, match=r"^slots must be a GlobalSlots|(?s:GlobalSlots.*while processing 'slots')"):
        m.check_topk(s, rows, slots="x")
    assert rows.tolist() == [[12, 13, -1]] and t.tolist() == [[3, 1]]


@pytest.mark.parametrize("impl", IMPLS)
def test_bad_witness_check_arguments_are_refused_naming_them(impl):
    m = _mod(impl)
    b = np.array([[0, 5, -1, -1, 7, 9]], np.int32)
    a = b.copy()
    for argument, call in [
        ("after", lambda: m.check_witnesses(b, a[:, :4], [10], 2)),
        ("before", lambda: m.check_witnesses(b.ravel(), a, [10], 2)),
        ("before", lambda: m.check_witnesses(b.astype(np.int64) + 2**40, a, [10], 2)),
        ("num_segments", lambda: m.check_witnesses(b, a, [10], -1)),
    ]:
        with pytest.raises(_witness_error(impl)) as e:
            call()
        assert e.value.argument == argument, (argument, str(e.value))
    with pytest.raises(TypeError, match=r"^before must hold integers.*got dtype float32$"):
        m.check_witnesses(b.astype(np.float32), a, [10], 2)
    # context_lens is [rows] axis by axis: 3 lengths for 5 empty rows are refused (no longer read as 3 rows).
    with pytest.raises(_witness_error(impl)) as e:
        m.check_witnesses(np.zeros((5, 0), np.int32), np.zeros((5, 0), np.int32), [1, 2, 3], 2)
    assert e.value.argument == "context_lens"
    assert m.check_witnesses(np.zeros((5, 0), np.int32), np.zeros((5, 0), np.int32), [1, 2, 3, 4, 5], 2)["rows"] == 5
    assert (b == [[0, 5, -1, -1, 7, 9]]).all() and (a == b).all()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "argument, bad",
    [
        ("num_segments", "65 segments"),
        ("context_lens", "rows mismatch"),
        ("context_lens", "rows mismatch, no segments"),
        ("context_lens", "fewer lens, no segments"),
        ("after", "same size, another shape"),
    ],
)
def test_bad_witness_arguments_are_named_as_passed(impl, argument, bad, request):
    m = _mod(impl)
    b = np.array([[0, 5, -1, -1, 7, 9]], np.int32)
    call = {
        "65 segments": lambda: m.check_witnesses(b, b, [10], 65),
        "rows mismatch": lambda: m.check_witnesses(b, b, [10, 3], 2),
        # Once a PanicException natively (a slice past the buffer).
        "rows mismatch, no segments": lambda: m.check_witnesses(b, b, [10, 3], 0),
        # Once accepted natively, the row without a length never judged.
        "fewer lens, no segments": lambda: m.check_witnesses(b, b + 1, [], 0),
        "same size, another shape": lambda: m.check_witnesses(b, b.reshape(2, 3), [10], 2),
    }[bad]
    try:
        call()
    except _witness_error(impl) as e:
        assert e.argument == argument, str(e)
    except BaseException as e:  # noqa: BLE001 - a panic is a BaseException
        pytest.fail(f"{type(e).__name__}: {e}")
    else:
        pytest.fail("accepted")


# --------------------------------------------------------------------------
# Decode context parallelism: the ranks' rows side by side
# --------------------------------------------------------------------------


def _dcp_rows(rng, rows, size, il, tables, bs, req_ids, compact):
    """vLLM's converter on each DCP rank: a rank keeps the tokens it owns
    (token t on rank (t // il) % size, local slot (t // (size il)) il + t % il),
    as global slots through its own table, -1 elsewhere (or compacted to
    the front); the ranks' rows side by side."""
    n, topk = rows.shape
    out = np.full((n, size, topk), -1, dtype=np.int64)
    for i in range(n):
        for slot, t in enumerate(rows[i]):
            if t < 0:
                continue
            rank, local = (t // il) % size, (t // (size * il)) * il + t % il
            g = int(tables[rank, req_ids[i], local // bs]) * bs + local % bs
            at = int(np.argmax(out[i, rank] < 0)) if compact else slot
            out[i, rank, at] = g
    return out.reshape(n, size * topk)


@pytest.mark.parametrize("compact", [False, True])
def test_dcp_ranks_rows_side_by_side_are_judged_as_the_whole_selection(compact):
    rng = np.random.default_rng(44)
    seen = {True: 0, False: 0}
    for case in range(150):
        size, il, bs, max_blocks, n_req = int(rng.integers(2, 4)), int(rng.integers(1, 4)), 4, 6, 2
        tables = np.stack([rng.permutation(n_req * max_blocks).reshape(n_req, max_blocks) for _ in range(size)]).astype(
            np.int32
        )
        t = size * bs * max_blocks
        n = int(rng.integers(1, 6))
        s = rng.integers(0, 4, (n, t)).astype(np.float32)
        lens = rng.integers(1, t + 1, n)
        req = rng.integers(0, n_req, n)
        topk = int(rng.integers(1, 7))
        rows = np.full((n, topk), -1, dtype=np.int64)
        for i, L in enumerate(lens):
            arrival = rng.permutation(L)
            best = arrival[np.argsort(-s[i, :L][arrival], kind="stable")][: min(topk, L)]
            rows[i, : len(best)] = best
            if rng.random() < 0.25 and len(best) > 1:
                rows[i, 0] = rows[i, 1]  # a duplicate
        ranked = _dcp_rows(rng, rows, size, il, tables, bs, req, compact)
        want = ks.check_topk(s, rows, lens, topk=topk)
        reports = []
        for impl in (ks, ref):
            lay = impl.GlobalSlots(tables, req, bs, dcp_size=size, dcp_interleave=il)
            reports.append(impl.check_topk(s, ranked, lens, slots=lay))  # topk: a rank's width
        assert reports[0] == reports[1], case  # native == reference, slot for slot
        got = reports[0]

        # The same verdicts and reasons as the row-relative rows (the slots
        # differ: a DCP row is the ranks' rows side by side).
        def gist(r):
            return [(d["row"], [p["reason"] for p in d["problems"]]) for d in r["details"]]

        assert gist(got) == gist(want) and got["correct"] == want["correct"], case
        for d in want["details"]:
            assert d["problems"][0]["reason"] == "duplicate"
        seen[True] += want["correct"]
        seen[False] += want["wrong"]
    assert seen[True] > 100 and seen[False] > 20, seen


@pytest.mark.parametrize("impl", IMPLS)
def test_a_dcp_layout_refuses_a_width_that_is_no_whole_number_of_ranks(impl):
    m = _mod(impl)
    tables = np.zeros((2, 1, 4), np.int32)
    lay = m.GlobalSlots(tables, [0], 4, dcp_size=2)
    with pytest.raises(_error(impl)) as e:
        m.check_topk(np.zeros((1, 16), np.float32), np.zeros((1, 3), np.int64), topk=1, slots=lay)
    assert e.value.argument == "slots"
    with pytest.raises(_error(impl)) as e:
        m.GlobalSlots(tables[0], [0], 4, dcp_size=2)  # one table per rank
    assert e.value.argument == "block_table"
    with pytest.raises(_error(impl)) as e:
        m.GlobalSlots(tables, [0], 4, dcp_size=2, dcp_interleave=0)
    assert e.value.argument == "dcp_interleave"
