"""``kvselect check`` on a dump of an indexer-family kernel (issue 43): the
dump carries the options (``activation``, no ``weights``, ``force_first`` /
``force_last``, ``score_pool``, ``row_layout``, ``topk_length``) and is judged
by the family's one judge (:func:`kvselect.checking.family.judge_family`, as
:func:`kvselect.checking.check_indexer_family`); ``check_indexer_topk`` and
``kvselect.testing.assert_topk`` take the same options."""

import numpy as np
import pytest

import kvselect as ks
from kvselect import checking
from kvselect.checking import DumpError, check_dump, check_indexer_family, check_indexer_topk
from kvselect.cli import main
from kvselect.testing import CheckFailure, assert_topk, cases

SEED = 4343


def _dump(rows, inputs, **extra):
    """A topk dump of ``rows`` from a family case's / a call's ``inputs``
    (the API's names; ``weights=None`` left out, as the format says)."""
    d = {"kind": "topk", "rows": np.asarray(rows)}
    for key, v in inputs.items():
        if v is None:
            continue
        if key in ("activation", "row_layout"):
            d[key] = np.array(v)
        elif key in ("topk", "compress_ratio", "force_first", "force_last", "score_pool"):
            d[key] = np.array(int(v))
        else:
            d[key] = np.asarray(v)
    d.update(extra)
    return d


def _run(capsys, path, *argv):
    code = main(["check", str(path), *map(str, argv)])
    out = capsys.readouterr()
    return code, out.out, out.err


def _sorted_rows(rows):
    """Each row's entries ascending, compact, then -1 (cuDNN's layout)."""
    out = np.full_like(rows, -1)
    for i, row in enumerate(rows):
        v = np.sort(row[row >= 0])
        out[i, : len(v)] = v
    return out


# ---- right rows pass, in both layouts --------------------------------------


def _qsa_and_msa(rng):
    """QSA's shape (no weights, ratio 4, force_last) and MiniMax's MSA shape
    (no weights, no activation, a score pool, forced first / last blocks)."""
    q = rng.standard_normal((24, 4, 16)).astype(np.float32)
    k = rng.standard_normal((400, 16)).astype(np.float32)
    pos = rng.integers(0, 1600, 24)
    pos[:4] = [0, 2, 3, 4 * 9 - 1]  # nothing visible yet, one entry, the budget's edge
    qsa = dict(index_q=q, weights=None, index_k=k, query_pos=pos, topk=24, compress_ratio=4, force_last=1)
    msa = dict(
        index_q=q,
        weights=None,
        index_k=k,
        query_pos=rng.integers(0, 400, 24),
        topk=6,
        activation="none",
        score_pool=16,
        force_first=1,
        force_last=1,
    )
    return [("qsa", qsa), ("msa", msa)]


@pytest.mark.parametrize("layout", ["rank", "ascending"])
def test_kvselects_rows_pass_kvselect_check_in_both_layouts(tmp_path, capsys, layout):
    rng = np.random.default_rng(SEED)
    for name, inputs in _qsa_and_msa(rng):
        inputs = dict(inputs, row_layout=layout)
        rows = ks.indexer_topk(**inputs)
        extra = {"topk_length": (rows >= 0).sum(-1)} if layout == "ascending" else {}
        d = _dump(rows, inputs, **extra)
        report = check_dump(d)
        assert report["wrong"] == 0 and report["rows"] == len(rows), (name, report.summary())
        assert "no weights" in report["checks"][0]["name"]
        path = tmp_path / f"{name}-{layout}.npz"
        checking.save_dump(path, **d)
        code, out, err = _run(capsys, path)
        assert code == 0, out + err
        # The same verdict as the family check itself (one judge).
        direct = check_indexer_family(rows, **{k: v for k, v in inputs.items() if k != "topk"})
        assert direct["wrong"] == 0


def test_rank_rows_in_a_dump_that_says_ascending_are_named_not_ascending(capsys, tmp_path):
    rng = np.random.default_rng(SEED + 1)
    _, inputs = _qsa_and_msa(rng)[0]
    rows = ks.indexer_topk(**inputs)
    report = check_dump(_dump(rows, dict(inputs, row_layout="ascending")))
    assert report["wrong"] > 0
    assert report["by_reason"]["not_ascending"] == report["wrong"]
    assert report["by_reason"]["wrong_selection"] == 0
    path = tmp_path / "rank-as-ascending.npz"
    checking.save_dump(path, **_dump(rows, dict(inputs, row_layout="ascending")))
    code, out, _ = _run(capsys, path)
    assert code == 1 and "not_ascending" in out


def test_a_wrong_topk_length_is_named():
    rng = np.random.default_rng(SEED + 2)
    _, inputs = _qsa_and_msa(rng)[1]
    inputs = dict(inputs, row_layout="ascending")
    rows = ks.indexer_topk(**inputs)
    lengths = (rows >= 0).sum(-1)
    assert check_dump(_dump(rows, inputs, topk_length=lengths))["wrong"] == 0
    off = lengths.copy()
    off[[3, 7]] += 1  # a kernel reporting a slot more than it wrote
    report = check_dump(_dump(rows, inputs, topk_length=off))
    assert report["wrong"] == 2 and report["by_reason"]["wrong_length"] == 2
    assert [x["row"] for x in report["details"]] == [3, 7]


# ---- the planted faults, named through the dump -------------------------------

FAMILY = dict(cases.all_family_cases())


def _family_dump(case, rows):
    return _dump(rows, case.inputs)


@pytest.mark.parametrize("case_id", sorted(FAMILY))
def test_every_family_cases_answer_passes_kvselect_check(case_id):
    case = FAMILY[case_id]
    report = check_dump(_family_dump(case, case.expected), rtol=0.0)
    assert report["wrong"] == 0, report.summary()
    assert report["rows"] == len(case.expected)


def test_a_dropped_forced_entry_is_named_by_kvselect_check(tmp_path, capsys):
    case = FAMILY["forced_entry_dropped-203"]
    rows = case.expected.copy()
    topk, f1 = case.inputs["topk"], case.inputs["force_last"]
    lens = case.inputs["query_pos"] + 1
    planted = []
    for i, row in enumerate(rows):
        L = int(lens[i])
        if L > topk:  # the row must hold entry L - 1 (forced last): swap it for a spare
            spare = sorted(set(range(L)) - set(row.tolist()))[0]
            row[row == L - f1] = spare
            planted.append(i)
    assert len(planted) >= 3
    report = check_dump(_family_dump(case, rows), rtol=0.0)
    assert report["by_reason"]["forced_dropped"] == len(planted) == report["wrong"]
    dropped = [p for x in report["details"] for p in x["problems"] if p["reason"] == "forced_dropped"]
    assert all(p["positions"] == [int(lens[x["row"]]) - f1] for x, p in zip(report["details"], dropped))
    path = tmp_path / "dropped.npz"
    checking.save_dump(path, **_family_dump(case, rows))
    code, out, _ = _run(capsys, path, "--rtol", 0)
    assert code == 1 and "forced_dropped" in out


def test_a_forced_entry_counted_twice_is_named_by_kvselect_check():
    case = FAMILY["forced_entry_counted_twice-8"]
    rows = case.expected.copy()
    L = 6  # the naive writer: the first four, then the last four, of six visible entries
    rows[L] = sorted(list(range(4)) + list(range(L - 4, L)))
    report = check_dump(_family_dump(case, rows), rtol=0.0)
    assert report["wrong"] == 1 and report["details"][0]["row"] == L
    assert report["by_reason"]["duplicate"] == 1
    # The same row written as cuDNN's layout would (a length of 8): named too.
    d = _family_dump(case, rows)
    d["topk_length"] = (case.expected >= 0).sum(-1)
    d["topk_length"][L] = 8
    report = check_dump(d, rtol=0.0)
    assert report["by_reason"]["duplicate"] == 1 and report["by_reason"]["wrong_length"] == 0


def test_the_compressed_pools_partial_block_is_named_not_causal():
    case = FAMILY["pool_last_partial_block-r4"]
    rows = case.expected.copy()
    m, pos = case.inputs["compress_ratio"], case.inputs["query_pos"]
    i = int(np.flatnonzero(pos >= 8 * m)[0])
    rows[i, -1] = pos[i] // m  # the entry of the block the query's token is filling
    report = check_dump(_family_dump(case, rows), rtol=0.0)
    assert report["wrong"] == 1 and report["by_reason"]["not_causal"] == 1


def test_the_score_pools_last_partial_block_counts_and_a_kernel_that_skips_it_is_named():
    """With ``score_pool = P`` a query at ``p`` has ``ceil((p + 1) / P)``
    blocks, the last one partial; the case puts the best score there, so a
    kernel that pools only complete blocks (``(p + 1) // P``) drops it."""
    case = FAMILY["score_pool_last_partial_block-p8"]
    inputs = case.inputs
    P, topk, pos = inputs["score_pool"], inputs["topk"], inputs["query_pos"]
    n, t = len(pos), int(inputs["cu_seqlens"][1])
    assert ((pos + 1) % P).all()
    rows = ks.indexer_topk_packed(**inputs)
    own = pos // P  # the partial block's id
    assert all(own[i] in rows[i] for i in range(n))
    assert check_dump(_dump(rows, inputs))["wrong"] == 0
    # The complete-blocks-only kernel: the best of blocks 0 .. (p + 1) // P - 1.
    keys = inputs["index_k"][:, 0].reshape(n, t)
    skip = np.full_like(rows, -1)
    for i, p in enumerate(pos):
        blocks = [b.max() for b in np.split(keys[i, : (p + 1) // P * P], (p + 1) // P)]
        skip[i] = np.sort(np.argsort(-np.array(blocks), kind="stable")[:topk])
    report = check_dump(_dump(skip, inputs))
    assert report["wrong"] == n and report["by_reason"]["wrong_selection"] == n


# ---- given scores: the same judge -------------------------------------------


def test_given_scores_with_forced_entries_are_judged_by_the_same_judge():
    rng = np.random.default_rng(SEED + 4)
    scores = rng.standard_normal((30, 50))
    lens = rng.integers(0, 51, 30)
    topk, f0, f1 = 8, 2, 1
    rows = np.full((30, topk), -1, dtype=np.int64)
    for i, L in enumerate(lens):
        if L <= topk:
            rows[i, :L] = np.arange(L)
            continue
        forced = list(range(f0)) + list(range(L - f1, L))
        rest = [t for t in np.argsort(-scores[i, :L], kind="stable") if t not in forced][: topk - f0 - f1]
        rows[i] = np.sort(forced + rest)
    d = dict(
        kind="topk",
        rows=rows,
        scores=scores,
        context_lens=lens,
        force_first=np.array(f0),
        force_last=np.array(f1),
        row_layout=np.array("ascending"),
    )
    assert check_dump(d)["wrong"] == 0
    bad = rows.copy()
    i = int(np.flatnonzero(lens > topk + 3)[0])
    spare = sorted(set(range(lens[i])) - set(bad[i].tolist()))[0]
    bad[i, 0] = spare  # entry 0, forced first, swapped out
    bad[i] = np.sort(bad[i])
    report = check_dump(dict(d, rows=bad))
    assert report["wrong"] == 1 and report["by_reason"]["forced_dropped"] == 1
    # Without the option the plain check judges these rows by score alone: wrong.
    plain = {k: v for k, v in d.items() if k not in ("force_first", "force_last", "row_layout")}
    assert check_dump(plain)["by_reason"]["wrong_selection"] > 0


# ---- refusals of inconsistent dumps, naming the key ------------------------------


def _msa_dump():
    rng = np.random.default_rng(SEED + 5)
    _, inputs = _qsa_and_msa(rng)[1]
    rows = ks.indexer_topk(**inputs)
    return _dump(rows, inputs)


@pytest.mark.parametrize(
    "change, key",
    [
        ({"activation": np.array("gelu")}, "activation"),
        ({"row_layout": np.array("descending")}, "row_layout"),
        ({"force_first": np.array(4), "force_last": np.array(3)}, "force_first"),
        ({"force_last": np.array(-1)}, "force_last"),
        ({"score_pool": np.array(0)}, "score_pool"),
        ({"topk_length": np.zeros(5, np.int64)}, "topk_length"),
        ({"engine_scores": np.zeros((24, 400), np.float32)}, "engine_scores"),
        ({"dcp_size": np.array(2)}, "dcp_size"),
        ({"filler": np.array("repeat")}, "filler"),
    ],
)
def test_an_inconsistent_family_dump_is_refused_naming_the_key(change, key, tmp_path, capsys):
    d = dict(_msa_dump(), **change)
    with pytest.raises(DumpError, match=key):
        check_dump(d)
    path = tmp_path / "bad.npz"
    np.savez(path, **d)
    code, out, err = _run(capsys, path)
    assert code == 2 and key in err + out


@pytest.mark.parametrize("key", ["activation", "score_pool"])
def test_scoring_options_beside_given_scores_are_refused(key):
    value = np.array("none") if key == "activation" else np.array(4)
    d = dict(kind="topk", rows=np.zeros((2, 3), np.int64), scores=np.zeros((2, 5)), context_lens=np.array([5, 5]))
    with pytest.raises(DumpError, match=f"{key} beside scores"):
        check_dump(dict(d, **{key: value}))


def test_the_dump_format_lists_the_options():
    text = checking.dump_format_markdown()
    for key in ("activation", "score_pool", "force_first", "force_last", "row_layout", "topk_length"):
        assert f"| `{key}` |" in text
    assert "absent with index_q: no weights" in text


# ---- check_indexer_topk and assert_topk take the options ---------------------------


def test_check_indexer_topk_with_the_options_is_the_family_check_every_form():
    rng = np.random.default_rng(SEED + 6)
    q = rng.standard_normal((10, 2, 8)).astype(np.float32)
    k = rng.standard_normal((96, 8)).astype(np.float32)
    pos = rng.integers(0, 96, 10)
    opts = dict(activation="none", force_first=1, force_last=2, row_layout="ascending")
    rows = ks.indexer_topk(q, None, k, pos, 7, **opts)
    rows[4, 0] = rows[4, 1]  # a duplicate
    mine = check_indexer_topk(rows, q, None, k, pos, 7, rtol=0, **opts)
    theirs = check_indexer_family(rows, q, None, k, pos, 7, **opts)
    assert mine == theirs and mine["wrong"] >= 1 and mine["by_reason"]["duplicate"] >= 1
    # Paged: one sequence's keys in pages of 16, the same verdicts.
    pages = k.reshape(6, 16, 8)[::-1].copy()
    table = np.arange(6)[::-1][None, :]
    paged = check_indexer_topk(
        rows,
        q,
        None,
        None,
        pos,
        7,
        rtol=0,
        kv_cache=pages,
        block_table=table,
        seq_lens=np.array([96]),
        seq_ids=np.zeros(10, np.int64),
        **opts,
    )
    assert paged["by_reason"] == mine["by_reason"] and paged["details"] == mine["details"]
    with pytest.raises(ks.SelectionError, match="filler") as e:
        check_indexer_topk(rows, q, None, k, pos, 7, filler="repeat", **opts)
    assert e.value.argument == "filler"
    with pytest.raises(ks.SelectionError, match="topk_length") as e:
        check_indexer_topk(rows, q, None, k, pos, 7, topk_length=np.zeros(3, np.int64), **opts)
    assert e.value.argument == "topk_length"


def test_assert_topk_takes_the_options_and_refuses_engine_scores_with_them():
    rng = np.random.default_rng(SEED + 7)
    q = rng.standard_normal((6, 4, 8)).astype(np.float32)
    k = rng.standard_normal((80, 8)).astype(np.float32)
    pos = np.array([3, 17, 40, 63, 79, 200])
    opts = dict(compress_ratio=2, force_last=1)
    rows = ks.indexer_topk(q, None, k, pos, 9, **opts)
    assert assert_topk(rows, q, None, k, pos, 9, **opts)["wrong"] == 0
    bad = rows.copy()
    L = (pos[-1] + 1) // 2
    bad[-1][bad[-1] == min(L, 80) - 1] = sorted(set(range(min(L, 80))) - set(bad[-1].tolist()))[0]
    with pytest.raises(CheckFailure, match="forced_dropped"):
        assert_topk(bad, q, None, k, pos, 9, **opts)
    with pytest.raises(ks.SelectionError, match="engine_scores") as e:
        assert_topk(rows, q, None, k, pos, 9, engine_scores=np.zeros((6, 40), np.float32), **opts)
    assert e.value.argument == "engine_scores"


def test_the_two_judges_agree_where_the_options_are_unused():
    """Today's check (kvselect.checking.exact) and the family's judge at the
    defaults: the same verdicts, row for row, on right and perturbed rows."""
    rng = np.random.default_rng(SEED + 8)
    for trial in range(20):
        n, h, d, t = 8, int(rng.integers(1, 5)), 8, int(rng.integers(10, 120))
        q = rng.integers(-3, 4, (n, h, d)).astype(np.float32)  # integer data: exact ties
        w = rng.integers(-2, 3, (n, h)).astype(np.float32)
        k = rng.integers(-3, 4, (t, d)).astype(np.float32)
        pos = rng.integers(0, t + 10, n)
        rows = ks.indexer_topk(q, w, k, pos, 6)
        for i in rng.choice(n, 3, replace=False):  # perturb: swap a member for a visible outsider
            L = min(int(pos[i]) + 1, t)
            out = sorted(set(range(L)) - set(rows[i].tolist()))
            if out and rows[i, 0] >= 0:
                rows[i, 0] = out[int(rng.integers(len(out)))]
        a = check_indexer_topk(rows, q, w, k, pos, 6, rtol=0)
        b = check_indexer_family(rows, q, w, k, pos, 6)
        wrong_a = sorted(x["row"] for x in a["details"])
        wrong_b = sorted(x["row"] for x in b["details"])
        assert wrong_a == wrong_b, trial
