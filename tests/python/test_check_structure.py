"""The structural half of the token top-k check alone
(``kvselect._core._check_topk_structure``), which the exact indexer check
runs on the rows its float64 verdict passed: the report of
:func:`kvselect.check_topk` on the same rows against equal scores, entry for
entry, on random rows with every structural fault (padding holes,
duplicates, future and negative entries, short and long rows), each filler,
rows read back through global slots (DCP ranks side by side included); and
its refusals, each naming the argument. Also: the element type names the
bindings read from NumPy's built-in dtypes (a fast path beside
``dtype.name``) are NumPy's own names."""

from __future__ import annotations

import numpy as np
import pytest

import kvselect as ks

FILLERS = ("-1", "past_context", "repeat")


def _rows(rng: np.random.Generator, n: int, width: int, lens: np.ndarray, topk: int) -> np.ndarray:
    """Rows with every structural fault at some rate: right rows, holes,
    duplicates, entries past the context, negative padding, short rows."""
    rows = np.full((n, width), -1, dtype=np.int64)
    for i, L in enumerate(lens):
        m = min(topk, int(L))
        r = rng.permutation(int(L))[:m] if L else np.zeros(0, dtype=np.int64)
        kind = rng.integers(0, 7)
        if kind == 1 and m > 1:  # a duplicate
            r[rng.integers(1, m)] = r[0]
        elif kind == 2 and m:  # past the context
            r[rng.integers(0, m)] = L + rng.integers(0, 3)
        elif kind == 3 and m > 1:  # a hole
            r = np.concatenate([r[:1], [-1], r[1:]])
        elif kind == 4 and m:  # short
            r = r[:-1]
        elif kind == 5:  # a filler entry, or a long row
            r = np.concatenate([r, [int(L) + 5 if rng.integers(0, 2) else (r[0] if m else 0)]])
        rows[i, : min(len(r), width)] = r[:width]
    return rows


@pytest.mark.parametrize("filler", FILLERS)
@pytest.mark.parametrize("seed", range(40))
def test_structure_equals_check_topk_on_equal_scores(seed: int, filler: str) -> None:
    rng = np.random.default_rng(seed)
    n, t, topk = int(rng.integers(1, 12)), int(rng.integers(1, 90)), int(rng.integers(1, 20))
    width = topk + int(rng.integers(0, 3))
    lens = rng.integers(0, t + 1, n)
    rows = _rows(rng, n, width, lens, topk)
    for dtype in (np.int64, np.int32):
        r = rows.astype(dtype)
        want = ks.check_topk(np.zeros((n, t), np.float32), r, lens, topk=topk, filler=filler)
        got = ks._core._check_topk_structure(r, lens, topk=topk, filler=filler)
        assert got == dict(want)
    # (every fault kind was drawn somewhere over the seeds)


def test_the_random_rows_hold_every_fault() -> None:
    reasons: set = set()
    for seed in range(40):
        rng = np.random.default_rng(seed)
        n, t, topk = 12, 60, 8
        lens = rng.integers(0, t + 1, n)
        rows = _rows(rng, n, topk + 1, lens, topk)
        r = ks._core._check_topk_structure(rows, lens, topk=topk)
        reasons |= {k for k, v in r["by_reason"].items() if v}
    assert reasons >= {"padding_hole", "duplicate", "not_causal", "wrong_count"}


@pytest.mark.parametrize("seed", range(20))
def test_structure_through_global_slots(seed: int) -> None:
    rng = np.random.default_rng(seed)
    bs, n_req, n_blocks = 4, 3, 6
    dcp = int(rng.choice([1, 2]))
    table = rng.permutation(n_req * n_blocks * dcp).reshape((dcp, n_req, n_blocks) if dcp > 1 else (n_req, n_blocks))
    n, topk = 5, 6
    req = rng.integers(0, n_req, n)
    slots = ks.GlobalSlots(table, req, bs, dcp_size=dcp) if dcp > 1 else ks.GlobalSlots(table, req, bs)
    t = bs * n_blocks * dcp
    lens = rng.integers(1, t + 1, n)
    width = topk * dcp
    rows = np.full((n, width), -1, dtype=np.int64)
    slot_of = rng.integers(-1, n_req * n_blocks * dcp * bs + 3, (n, width))
    keep = rng.random((n, width)) < 0.6
    rows[keep] = slot_of[keep]
    for filler in ("-1",) if dcp > 1 else FILLERS:
        want = ks.check_topk(np.zeros((n, t), np.float32), rows, lens, topk=topk, slots=slots, filler=filler)
        got = ks._core._check_topk_structure(rows, lens, topk=topk, slots=slots, filler=filler)
        assert got == dict(want)


def test_structure_refusals_name_the_argument() -> None:
    rows = np.zeros((3, 4), dtype=np.int64)
    lens = np.array([4, 4, 4])
    with pytest.raises(ks.SelectionError) as e:
        ks._core._check_topk_structure(rows, lens[:2], topk=4)
    assert e.value.argument == "context_lens"
    with pytest.raises(ks.SelectionError) as e:
        ks._core._check_topk_structure(rows, np.array([4, 5, 4]), topk=5)  # row 1 selects 5 of 4 slots
    assert e.value.argument == "topk"
    with pytest.raises(ks.SelectionError) as e:
        ks._core._check_topk_structure(rows, lens, topk=4, filler="zero")
    assert e.value.argument == "filler"
    with pytest.raises(ks.SelectionError) as e:
        ks._core._check_topk_structure(rows[0], lens, topk=4)
    assert e.value.argument == "rows"
    with pytest.raises(TypeError, match="context_lens"):
        ks._core._check_topk_structure(rows, lens.astype(np.float32), topk=4)


# Every NumPy built-in numeric dtype and a few others: a key array of one
# that is no key format is refused naming the dtype as NumPy names it.
_DTYPES = [c for c in np.typecodes["All"] if c not in "OMmUSVa"] + ["U3", "S2", ">f4", "<i2"]


@pytest.mark.parametrize("code", _DTYPES)
def test_element_names_are_numpys(code: str) -> None:
    dtype = np.dtype(code)
    q, w = np.ones((1, 2, 4), np.float32), np.ones((1, 2), np.float32)
    k = np.zeros((5, 4), dtype)
    if dtype.kind == "f" and dtype.itemsize in (2, 4, 8):
        ks.indexer_scores(q, w, k, np.array([4]))  # a key format (float64 converts)
        return
    with pytest.raises(TypeError) as e:
        ks.indexer_scores(q, w, k, np.array([4]))
    assert f"index_k has dtype {dtype.name}," in str(e.value)
