"""``kvselect check DUMP.npz``: the dump format, the report, the exit status.

Dumps here are written the way an engine author would write them (raw
low-precision bits with a format key, int64 indices, engines' layouts), by
:func:`kvselect.checking.save_dump` or by hand with ``np.savez``.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kvselect as ks
from kvselect import checking
from kvselect.cli import main

ml_dtypes = pytest.importorskip("ml_dtypes")


def run(capsys, *argv):
    code = main(["check", *map(str, argv)])
    out = capsys.readouterr()
    return code, out.out, out.err


def _oldest_ml_dtypes():
    """The oldest ml_dtypes the package allows (pyproject's floor), installed
    by .ci/run with ``pip install --no-deps --target`` and named by
    ``KVSELECT_ML_DTYPES_OLDEST``; CI (``KVSELECT_CI=1``) fails without it."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+, as CI

    path = os.environ.get("KVSELECT_ML_DTYPES_OLDEST")
    if not path:
        if os.environ.get("KVSELECT_CI") == "1":
            pytest.fail("KVSELECT_ML_DTYPES_OLDEST is not set: .ci/run installs the oldest ml_dtypes")
        pytest.skip("KVSELECT_ML_DTYPES_OLDEST is not set (.ci/run sets it)")
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    extras = [d for ds in project["optional-dependencies"].values() for d in ds]
    floor = {d.split(">=")[1] for d in extras if d.startswith("ml_dtypes>=")}
    assert len(floor) == 1, floor
    return path, floor.pop()


def _same_archive(a_path, b_path):
    with np.load(a_path) as a, np.load(b_path) as b:
        assert sorted(a.files) == sorted(b.files)
        for k in a.files:
            assert a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes(), k


@pytest.mark.parametrize("ml_dtypes_version", ["installed", "oldest allowed"])
def test_the_shipped_example_is_what_make_example_writes(tmp_path, ml_dtypes_version):
    """Byte for byte, with the newest ml_dtypes (the one a fresh install gets)
    and the oldest the package allows: their float64 -> bfloat16 casts differ
    (0.5 rounds through float32, 0.7 once), so the example casts from float32."""
    fresh = tmp_path / "fresh.npz"
    if ml_dtypes_version == "installed":
        checking.make_example(str(fresh))
    else:
        path, floor = _oldest_ml_dtypes()
        code = (
            "import sys, ml_dtypes; from kvselect import checking; "
            "checking.make_example(sys.argv[1]); print(ml_dtypes.__version__)"
        )
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([path, os.environ.get("PYTHONPATH", "")])}
        done = subprocess.run(
            [sys.executable, "-c", code, str(fresh)], env=env, capture_output=True, text=True, check=True
        )
        ran = [int(x) for x in done.stdout.split()[-1].split(".")]
        want = [int(x) for x in floor.split(".")]
        assert ran == want + [0] * (len(ran) - len(want)), (ran, floor)  # it really ran the oldest
    _same_archive(checking.example_path(), fresh)


def test_the_shipped_example_reports_its_one_broken_row_and_exits_1(capsys):
    code, out, _ = run(capsys, checking.example_path())
    assert code == 1
    assert "row 24: wrong selection: dropped 1" in out
    assert out.count("wrong_selection") == 2  # both checks catch it
    assert out.rstrip().endswith("1 wrong row(s)")
    result = checking.check_dump(checking.example_path())
    assert result["wrong"] == 1
    exact, own, accuracy = result["checks"]
    for c in (exact, own):
        assert [x["row"] for x in c["report"]["details"]] == [24]
        assert c["report"]["by_reason"]["wrong_selection"] == 1
    # The engine's bfloat16 scores are within the bfloat16 tolerance of the exact ones.
    assert accuracy["name"] == "the engine's own scores against the exact ones"
    assert (accuracy["report"]["rows"], accuracy["report"]["wrong"]) == (48, 0)


def _fixed_example(tmp_path, **change):
    """The example with its broken row repaired (or other keys changed)."""
    with np.load(checking.example_path()) as z:
        d = {k: z[k] for k in z.files}
    table, bs = d["block_table"][0], int(d["block_size"])
    engine = d["engine_scores"]
    L = int(d["query_pos"][24]) + 1
    best = np.argsort(-engine[24, :L], kind="stable")[:64]
    d["rows"][24] = table[best // bs].astype(np.int64) * bs + best % bs
    d.update(change)
    path = tmp_path / "dump.npz"
    np.savez(path, **d)
    return path


def test_a_correct_dump_exits_0_and_says_so(tmp_path, capsys):
    code, out, _ = run(capsys, _fixed_example(tmp_path))
    assert code == 0, out
    assert out.rstrip().endswith("all rows correct")


def test_json_is_the_full_report_and_the_exit_status_holds(capsys):
    code, out, _ = run(capsys, checking.example_path(), "--json", "-")
    assert code == 1
    r = json.loads(out)
    assert r["kind"] == "topk" and r["rows"] == 48 and r["wrong"] == 1
    assert r["tolerance"] == {"precision": "bfloat16", "atol": 0.0, "rtol": 2.0**-8, "note": None}
    (p,) = r["checks"][0]["report"]["details"][0]["problems"]
    assert p["reason"] == "wrong_selection" and p["n_dropped"] == 1 and p["margin"] > 0


def test_the_tolerance_follows_the_precision_and_the_flags_override_it(tmp_path, capsys):
    # Exactly, the bfloat16 engine's rows are wrong where its rounding broke
    # ties; with the precision's rtol they are not.
    path = _fixed_example(tmp_path)
    assert run(capsys, path)[0] == 0
    code, out, _ = run(capsys, path, "--rtol", "0", "--json", "-")
    r = json.loads(out)
    assert code == 1 and r["tolerance"]["rtol"] == 0
    assert r["checks"][0]["report"]["wrong"] > 0
    assert r["checks"][1]["report"]["wrong"] == 0  # its own scores: exact, and right
    path32 = _fixed_example(tmp_path, precision=np.asarray("float32"))
    r = checking.check_dump(str(path32))
    assert r["tolerance"]["rtol"] == checking.DEFAULT_RTOL["float32"]


@pytest.mark.parametrize(
    "content, message",
    [
        (b"not a zip at all\n", "not a NumPy .npz archive"),
        (None, "no such file"),
    ],
)
def test_an_unreadable_dump_exits_2_without_suggesting_pickle(tmp_path, capsys, content, message):
    path = tmp_path / "dump.npz"
    if content is not None:
        path.write_bytes(content)
    code, out, err = run(capsys, path)
    assert code == 2 and message in err and "pickle" not in err and out == ""


def test_a_dump_missing_a_key_or_with_a_bad_kind_names_it(tmp_path, capsys):
    p = tmp_path / "a.npz"
    np.savez(p, kind=np.asarray("topk"), rows=np.zeros((2, 3), dtype=np.int64))
    code, _, err = run(capsys, p)
    assert code == 2 and "'index_q'" in err
    np.savez(p, kind=np.asarray("attention"))
    code, _, err = run(capsys, p)
    assert code == 2 and "kind must be one of topk, blocks, witnesses" in err
    np.savez(p, rows=np.zeros((2, 3)))
    assert run(capsys, p)[0] == 2


@pytest.mark.parametrize("chunk_rows", ["1", "7", "4096"])
@pytest.mark.parametrize(
    "change,message",
    [
        (dict(query_pos=np.arange(47)), "query_pos has 47 rows but the engine's rows have 48"),
        (dict(rows=np.zeros((47, 64), np.int64)), "has 48 rows but the engine's rows have 47"),
        (dict(query_pos=np.int64(5)), "query_pos must be [n_rows]"),
        (dict(rows=np.int64(3)), "rows must be [n_rows, topk]"),
    ],
)
def test_per_row_keys_that_disagree_are_refused_in_chunks_too(tmp_path, capsys, chunk_rows, change, message):
    # Chunks cut every per-row key to the same rows, so each chunk alone would fit:
    # a dump whose per-row keys disagree is checked (and refused) whole.
    with np.load(checking.example_path()) as z:
        d = {k: z[k] for k in z.files}
    d.update(change)
    p = tmp_path / "bad.npz"
    np.savez(p, **d)
    code, out, err = run(capsys, p, "--chunk-rows", chunk_rows)
    assert code == 2 and message in err and out == "", err


@pytest.mark.parametrize(
    "key,value,message",
    [
        ("rows", np.zeros(5, np.int64), "rows must be [n_rows, topk]"),
        ("weights", np.float32(1.0), "weights must be [n_rows, H]"),
        ("query_pos", np.int64(5), "query_pos must be [n_rows]"),
    ],
)
def test_too_few_axes_are_refused_naming_the_key_and_its_shape(tmp_path, capsys, key, value, message):
    with np.load(checking.example_path()) as z:
        d = {k: z[k] for k in z.files}
    d[key] = value
    p = tmp_path / "bad.npz"
    np.savez(p, **d)
    code, out, err = run(capsys, p)
    assert code == 2 and message in err and out == "", err


def test_a_scores_dump_is_checked_with_atol_only_unless_it_has_magnitudes(tmp_path, capsys):
    rng = np.random.default_rng(5)
    s = rng.integers(0, 4, (6, 30)).astype(np.float32)
    lens = rng.integers(1, 31, 6)
    rows = np.full((6, 5), -1, dtype=np.int64)
    for i, L in enumerate(lens):
        best = np.argsort(-s[i, :L], kind="stable")[:5]
        rows[i, : len(best)] = rng.permutation(best)
    p = tmp_path / "s.npz"
    checking.save_dump(str(p), "topk", scores=s, context_lens=lens, rows=rows)
    assert run(capsys, p)[0] == 0
    bad = rows.copy()
    bad[2, 0] = bad[2, 1]
    checking.save_dump(str(p), "topk", scores=s, context_lens=lens, rows=bad)
    code, out, _ = run(capsys, p)
    assert code == 1 and "row 2: duplicate" in out
    code, _, err = run(capsys, p, "--rtol", "0.1")
    assert code == 2 and "magnitudes" in err


def test_a_block_dump_in_the_engines_head_major_physical_layout(tmp_path, capsys):
    rng = np.random.default_rng(6)
    n, h, d, n_k = 5, 3, 8, 200
    cfg = ks.BlockSparseConfig(16, 4, 1, 1)
    q = rng.integers(-2, 3, (n, h, d)).astype(ml_dtypes.bfloat16)
    k = rng.integers(-2, 3, (n_k, d)).astype(ml_dtypes.bfloat16)
    pos = rng.integers(0, n_k, n)
    rows = ks.block_sparse_select(q, k, pos, cfg, head_major=True).astype(np.int64)
    pages = rng.permutation(40)[:13].astype(np.int32)
    phys = np.where(rows < 0, -1, pages[np.maximum(rows, 0)])
    for r in phys.reshape(-1, phys.shape[-1]):  # engines' rows are unordered
        rng.shuffle(r[r >= 0])
    p = tmp_path / "b.npz"
    fields = dict(
        index_q=q,
        index_k=k,
        query_pos=pos,
        block_size=16,
        top_blocks=4,
        init_blocks=1,
        local_blocks=1,
        head_major=1,
        block_table=pages[None, :],
    )
    checking.save_dump(str(p), "blocks", rows=phys, **fields)
    code, out, _ = run(capsys, p)
    assert code == 0, out
    # Drop the init block of query 3, KV head 1 for a free block it rejected.
    bad = phys.copy()
    row = bad[1, 3]
    row[row == pages[0]] = [b for b in pages[: -(-(pos[3] + 1) // 16)] if b not in row][0]
    checking.save_dump(str(p), "blocks", rows=bad, **fields)
    code, out, _ = run(capsys, p)
    assert code == 1 and "(query 3, KV head 1): missing forced: blocks [0]" in out


def test_a_witness_dump_names_the_broken_contract(tmp_path, capsys):
    rng = np.random.default_rng(7)
    lens = rng.integers(20, 200, 12).astype(np.int32)
    before = np.stack([rng.choice(L, 16, replace=False) for L in lens]).astype(np.int32)
    after = before.copy()
    ks.scatter_topology_witnesses(after, lens, 8)
    p = tmp_path / "w.npz"
    checking.save_dump(str(p), "witnesses", before=before, after=after, context_lens=lens, num_segments=8)
    assert run(capsys, p)[0] == 0
    i = next(i for i in range(12) if (after[i, 8:] != before[i, 8:]).sum() >= 2)
    swapped = after.copy()
    w = np.flatnonzero(after[i, 8:] != before[i, 8:])[:2] + 8
    swapped[i, w] = swapped[i, w[::-1]]
    checking.save_dump(str(p), "witnesses", before=before, after=swapped, context_lens=lens, num_segments=8)
    code, out, _ = run(capsys, p, "--json", "-")
    r = json.loads(out)
    assert code == 1 and r["wrong"] == 1
    (p0,) = r["checks"][0]["report"]["details"][0]["problems"]
    assert p0["reason"] == "wrong_witness" and p0["slot"] == w[0]
    assert "wrong slot" in p0["why"]


def test_the_console_script_runs_the_check(tmp_path):
    path = _fixed_example(tmp_path)
    cmd = [sys.executable, "-m", "kvselect", "check", str(path)]
    assert subprocess.run(cmd, capture_output=True).returncode == 0
    cmd[-1] = checking.example_path()
    assert subprocess.run(cmd, capture_output=True).returncode == 1


def test_a_dcp_dump_is_every_ranks_rows_judged_together(tmp_path, capsys):
    """Decode context parallelism: two ranks, tokens dealt two at a time,
    each rank's rows its own tokens as global slots through its own table."""
    rng = np.random.default_rng(8)
    size, il, bs, max_blocks, n, topk = 2, 2, 4, 8, 5, 6
    tables = np.stack([rng.permutation(max_blocks)[None] for _ in range(size)]).astype(np.int32)
    t = size * bs * max_blocks
    s = rng.integers(0, 9, (n, t)).astype(np.float32)
    lens = rng.integers(topk, t + 1, n)
    ranked = np.full((size, n, topk), -1, dtype=np.int64)
    for i, L in enumerate(lens):
        for tok in np.argsort(-s[i, :L], kind="stable")[:topk]:
            rank, local = (tok // il) % size, (tok // (size * il)) * il + tok % il
            at = int(np.argmax(ranked[rank, i] < 0))  # compacted to the front
            ranked[rank, i, at] = int(tables[rank, 0, local // bs]) * bs + local % bs
    fields = dict(
        scores=s,
        context_lens=lens,
        block_table=tables,
        req_ids=np.zeros(n, np.int64),
        block_size=bs,
        dcp_size=size,
        dcp_interleave=il,
        topk=topk,
    )
    p = tmp_path / "dcp.npz"
    side_by_side = np.concatenate(list(ranked), axis=1)  # [n_rows, dcp_size * topk]
    checking.save_dump(str(p), "topk", rows=side_by_side, **fields)
    code, out, _ = run(capsys, p)
    assert code == 0, out
    # Rank 1 loses one of its tokens: the row as a whole is one short.
    i, slot = next((i, j) for i in range(n) for j in range(topk) if ranked[1, i, j] >= 0)
    ranked[1, i, slot] = -1
    checking.save_dump(str(p), "topk", rows=np.concatenate(list(ranked), axis=1), **fields)
    r = checking.check_dump(str(p))
    (row,) = r["checks"][0]["report"]["details"]
    assert row["row"] == i and row["problems"] == [{"reason": "wrong_count", "valid": topk - 1, "expected": topk}]
    checking.save_dump(str(p), "topk", rows=ranked[0][:, : topk - 1], **fields)  # not 2 ranks wide
    code, _, err = run(capsys, p)
    assert code == 2 and "dcp_size = 2" in err


def test_a_dcp_dump_with_3d_rows_is_refused_with_the_side_by_side_fix(tmp_path, capsys):
    """3-D rows only ever mean [n_queries, n_heads, width]; a DCP topk dump's
    rows are the ranks' rows side by side, and the refusal says how."""
    tables = np.stack([np.arange(2)[None] for _ in range(2)]).astype(np.int32)
    rows = np.zeros((2, 3, 2), np.int64)  # [dcp_size, n_rows, topk], the old form
    p = tmp_path / "dcp3.npz"
    checking.save_dump(
        str(p),
        "topk",
        rows=rows,
        scores=np.zeros((3, 16), np.float32),
        context_lens=np.full(3, 16),
        block_table=tables,
        req_ids=np.zeros(3, np.int64),
        block_size=4,
        dcp_size=2,
    )
    code, _, err = run(capsys, p)
    assert code == 2
    assert "[n_rows, dcp_size * topk]" in err and "np.concatenate(list(rows), axis=1)" in err


def test_a_tolerance_that_covers_everything_is_flagged_as_vacuous(capsys):
    code, out, _ = run(capsys, checking.example_path(), "--rtol", "0.125")
    # Every row's intervals overlap: the exact-score check passes them all,
    # says so, and only the exact self-consistency check catches row 24.
    assert "warning: 48 of 48 rows against the exact scores are vacuous" in out
    r = checking.check_dump(checking.example_path(), rtol=0.125)
    assert [c["report"]["wrong"] for c in r["checks"]] == [0, 1, 0]
    assert checking.check_dump(checking.example_path())["checks"][0]["report"]["vacuous"] == 0


def test_json_is_strict_even_with_nan_scores(tmp_path, capsys):
    s = np.array([[3.0, np.nan, 1.0, 2.0]], np.float32)
    p = tmp_path / "nan.npz"
    checking.save_dump(str(p), "topk", scores=s, context_lens=[4], rows=np.array([[1, 0]]))
    code, out, _ = run(capsys, p, "--json", "-")
    assert code == 1

    def refuse(name):
        raise ValueError(name)

    r = json.loads(out, parse_constant=refuse)  # NaN / Infinity would be refused
    (prob,) = r["checks"][0]["report"]["details"][0]["problems"]
    assert prob["margin"] == "inf" and [1, "nan"] in prob["intruders"]


def test_low_precision_scores_round_trip_through_save_dump(tmp_path, capsys):
    rng = np.random.default_rng(9)
    s = rng.standard_normal((4, 40)).astype(np.float32)
    rows = np.argsort(-s, axis=1, kind="stable")[:, :8]
    p = tmp_path / "bf16.npz"
    checking.save_dump(
        str(p), "topk", scores=s, context_lens=np.full(4, 40), rows=rows, engine_scores=s.astype(ml_dtypes.bfloat16)
    )
    r = checking.check_dump(str(p))
    assert r["checks"][1]["name"].startswith("against the engine's own")
    assert r["checks"][0]["report"]["wrong"] == 0  # decoded, not refused as uint16


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(query_pos=np.arange(47)), "query_pos has 47 rows but the engine's rows have 48"),
        (dict(rows=np.zeros((47, 64), np.int64)), "has 48 rows but the engine's rows have 47"),
        (dict(req_ids=np.zeros(3, np.int64)), "req_ids has 3 rows"),
        (dict(rows=np.zeros((48, 64), np.float32)), "rows: expected an integer dtype"),
        (dict(cu_seqlens=np.array([0, 5]), seq_ids=np.zeros(48, np.int64)), "cu_seqlens must rise"),
        (dict(cu_seqlens=np.array([0, 1024]), seq_ids=np.full(48, 3)), "seq_ids must name"),
        (dict(weights=np.zeros((48, 64), np.int32)), "weights: expected dtype float16, float32 or float64, got int32"),
    ],
)
def test_a_dump_whose_arrays_do_not_fit_exits_2_naming_the_key(tmp_path, capsys, change, message):
    with np.load(checking.example_path()) as z:
        d = {k: z[k] for k in z.files}
    d.update(change)
    p = tmp_path / "bad.npz"
    np.savez(p, **d)
    code, out, err = run(capsys, p)
    assert code == 2 and message in err and out == "", err
