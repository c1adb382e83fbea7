"""The check as engines meet it (issue 22 §2-§4): an engine's filler
(``filler=``), a row's filler reported once, batches and scales as engines
pass them (paged dumps, a per-tensor ``key_scale``, ``np.savez`` of
``ml_dtypes`` arrays) and ``kvselect check --json FILE``.

Native and reference are compared on randomised rows (fixed seeds).
"""

import json
import os
from pathlib import Path

import numpy as np
import pytest

import kvselect as ks
from kvselect import checking
from kvselect import reference as ref
from kvselect.cli import main

SEED = 20261322
IMPLS = ["native", "reference"]
FILLERS = ["-1", "past_context", "repeat"]


def _mod(impl):
    return ks if impl == "native" else ref


def _error(impl):
    return ks.SelectionError if impl == "native" else ref.ReferenceSelectionError


def run(capsys, *argv):
    code = main(["check", *map(str, argv)])
    out = capsys.readouterr()
    return code, out.out, out.err


def _exact_rows(scores, lens, topk, rng):
    """Each row's exact top-k, shuffled, as a list (no padding)."""
    out = []
    for i, L in enumerate(lens):
        s = scores[i, :L].astype(np.float64)
        order = np.lexsort((np.arange(L), -s))[: min(topk, L)]
        out.append(list(rng.permutation(order)))
    return out


def _filled(rows, lens, topk, filler, rng):
    """The rows as an engine with ``filler`` writes them: -1 after the valid
    entries, future positions anywhere, or repeats of a valid entry."""
    out = np.full((len(rows), topk), -1, np.int64)
    for i, (row, L) in enumerate(zip(rows, lens)):
        r = list(row)
        while len(r) < topk:
            if filler == "past_context":
                r.insert(int(rng.integers(0, len(r) + 1)), int(rng.integers(L, L + 100)))
            elif filler == "repeat":
                r.append(r[int(rng.integers(0, len(r)))])
            else:
                r.append(-1)
        out[i] = r
    return out


# ---------------------------------------------------------------- filler


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("filler", FILLERS)
def test_each_engines_filler_passes_its_own_rule_and_every_rule_takes_minus_one_padding(impl, filler):
    m = _mod(impl)
    rng = np.random.default_rng(SEED)
    n, t, topk = 12, 24, 16
    scores = rng.integers(0, 6, (n, t)).astype(np.float32)
    lens = rng.integers(1, t + 1, n)
    best = _exact_rows(scores, lens, topk, rng)
    own = _filled(best, lens, topk, filler, rng)
    assert m.check_topk(scores, own, lens, filler=filler)["wrong"] == 0
    padded = _filled(best, lens, topk, "-1", rng)
    assert m.check_topk(scores, padded, lens, filler=filler)["wrong"] == 0
    short = lens < topk
    if filler != "-1" and short.any():  # the default rule names the filler
        got = m.check_topk(scores, own, lens)
        reason = "not_causal" if filler == "past_context" else "duplicate"
        assert got["by_reason"][reason] == short.sum()


@pytest.mark.parametrize("impl", IMPLS)
def test_past_context_filler_ignores_future_entries_wherever_they_sit_but_not_a_wrong_selection(impl):
    m = _mod(impl)
    s = np.array([[1.0, 3.0, 2.0, 0.0, 9.0, 9.0, 9.0, 9.0]], np.float32)
    row = np.array([[5, 1, 7, 0, -1, 2, 4, 3]])
    assert m.check_topk(s, row, [4], filler="past_context")["wrong"] == 0
    # A position of the context missing is still missing, filler or not.
    r = m.check_topk(s, np.array([[5, 1, 7, 0, -1, 2, 4, 6]]), [4], filler="past_context")
    assert r["details"][0]["problems"] == [{"reason": "wrong_count", "valid": 3, "expected": 4}]
    r = m.check_topk(s, np.array([[5, 1, 0, -1]]), [4], topk=2, filler="past_context")
    assert r["by_reason"]["wrong_selection"] == 1


@pytest.mark.parametrize("impl", IMPLS)
def test_repeat_filler_still_catches_a_row_that_repeats_instead_of_selecting(impl):
    m = _mod(impl)
    s = np.array([[1.0, 3.0, 2.0, 0.5]], np.float32)
    assert m.check_topk(s, np.array([[1, 2, 1, 1]]), [3], topk=2, filler="repeat")["wrong"] == 0
    r = m.check_topk(s, np.array([[1, 1, 1, 1]]), [4], topk=2, filler="repeat")
    assert r["details"][0]["problems"] == [{"reason": "wrong_count", "valid": 1, "expected": 2}]
    # A future position is no repeat.
    r = m.check_topk(s, np.array([[1, 0, 2, 3]]), [3], filler="repeat")
    assert r["details"][0]["problems"][0]["reason"] == "not_causal"


@pytest.mark.parametrize("impl", IMPLS)
def test_a_rows_filler_is_one_problem_with_its_first_slot_and_count(impl):
    m = _mod(impl)
    s = np.zeros((1, 4096), np.float32)
    row = np.concatenate([[0, 4093, 1, 2, 3], np.arange(4094, 4094 + 59)])[None, :]
    r = m.check_topk(s, row, [4], topk=64)
    assert r["details"][0]["problems"] == [
        {"reason": "not_causal", "slot": 1, "position": 4093, "n_slots": 60, "context": 4}
    ]
    dup = np.array([[0, 1, 2, 3] + [2] * 60])
    r = m.check_topk(s, dup, [4], topk=64)
    assert r["details"][0]["problems"] == [{"reason": "duplicate", "position": 2, "first": 2, "slot": 4, "n_slots": 60}]


def test_native_and_reference_reports_agree_on_random_rows_under_every_filler():
    rng = np.random.default_rng(SEED + 1)
    for case in range(60):
        n, t = 6, int(rng.integers(2, 30))
        topk = int(rng.integers(1, 20))
        s = rng.integers(0, 4, (n, t)).astype(np.float32)
        lens = rng.integers(1, t + 1, n)
        rows = rng.integers(-2, t + 5, (n, topk))
        for filler in FILLERS:
            got = ks.check_topk(s, rows, lens, topk=topk, filler=filler)
            want = ref.check_topk(s, rows, lens, topk=topk, filler=filler)
            assert json.dumps(got) == json.dumps(want), (case, filler)


@pytest.mark.parametrize("impl", IMPLS)
def test_dcp_rows_keep_their_holes_under_every_filler(impl):
    m = _mod(impl)
    # Two ranks, interleave 1: rank r owns the tokens t with t % 2 == r.
    table = np.array([[[0, 1]], [[2, 3]]], np.int32)
    slots = m.GlobalSlots(table, [0], 4, dcp_size=2)
    s = np.array([[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]], np.float32)
    # Positions 5, 4, 3, 2 (best four): rank 0 holds 4, 2 (locals 2, 1), rank 1 holds 5, 3.
    rows = np.array([[-1, 0 * 4 + 2, 0 * 4 + 1, -1, 2 * 4 + 2, -1, 2 * 4 + 1, -1]])
    for filler in FILLERS:
        assert m.check_topk(s, rows, [6], topk=4, slots=slots, filler=filler)["wrong"] == 0, filler


@pytest.mark.parametrize("impl", IMPLS)
def test_an_unknown_filler_is_refused_naming_filler_and_the_choices(impl):
    m = _mod(impl)
    s = np.zeros((1, 3), np.float32)
    with pytest.raises(_error(impl)) as e:
        m.check_topk(s, np.array([[0, 1, 2]]), filler="-2")
    assert e.value.argument == "filler"
    assert all(f'"{f}"' in str(e.value) for f in FILLERS)
    # Natively the argument is named in the exception's note (PyO3's
    # "while processing 'filler'"), which ``match`` reads too.
    with pytest.raises(TypeError, match="^filler must be a string|while processing 'filler'"):
        m.check_topk(s, np.array([[0, 1, 2]]), filler=-1)


# ------------------------------------------------------- per-tensor scale


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(
    "make",
    [float, np.float32, np.float64, lambda x: np.array(x, np.float32)],
    ids=["python", "np.float32", "np.float64", "0-d"],
)
def test_a_scalar_key_scale_is_one_scale_for_every_key(impl, make):
    m = _mod(impl)
    rng = np.random.default_rng(SEED + 2)
    q = rng.standard_normal((5, 3, 8)).astype(np.float32)
    w = rng.standard_normal((5, 3)).astype(np.float32)
    k = rng.standard_normal((20, 8)).astype(np.float32)
    pos = rng.integers(0, 20, 5)
    c = 0.375
    full = np.full(20, c, np.float32)
    np.testing.assert_array_equal(
        m.indexer_scores(q, w, k, pos, key_scale=make(c)), m.indexer_scores(q, w, k, pos, key_scale=full)
    )
    np.testing.assert_array_equal(
        m.indexer_magnitudes(q, w, k, pos, key_scale=make(c)), m.indexer_magnitudes(q, w, k, pos, key_scale=full)
    )
    np.testing.assert_array_equal(
        m.indexer_topk(q, w, k, pos, 6, key_scale=make(c)), m.indexer_topk(q, w, k, pos, 6, key_scale=full)
    )
    cu, sid = np.array([0, 8, 20]), np.array([0, 1, 1, 0, 1])
    pos8 = np.minimum(pos, 7)
    np.testing.assert_array_equal(
        m.indexer_topk_packed(q, w, k, cu, sid, pos8, 6, key_scale=make(c)),
        m.indexer_topk_packed(q, w, k, cu, sid, pos8, 6, key_scale=full),
    )


@pytest.mark.parametrize("impl", IMPLS)
def test_a_2d_key_scale_is_still_refused_naming_key_scale(impl):
    m = _mod(impl)
    q, w, k = np.ones((1, 2, 4), np.float32), np.ones((1, 2), np.float32), np.ones((3, 4), np.float32)
    with pytest.raises(_error(impl)) as e:
        m.indexer_scores(q, w, k, 2, key_scale=np.ones((3, 1), np.float32))
    assert e.value.argument == "key_scale"


# ------------------------------------------------------------- the dumps


def _indexer_case(rng, n=10, t=40, h=4, d=16):
    q = rng.standard_normal((n, h, d)).astype(np.float32)
    w = rng.standard_normal((n, h)).astype(np.float32)
    k = rng.standard_normal((t, d)).astype(np.float32)
    pos = rng.integers(0, t, n)
    return q, w, k, pos


def _break(rows, i):
    """Row ``i`` with its first valid entry swapped for a position it lacks."""
    rows = rows.copy()
    valid = rows[i][rows[i] >= 0]
    lacking = [p for p in range(int(valid.max()) + 2) if p not in set(valid.tolist())]
    rows[i, 0] = lacking[0]
    return rows


def test_a_dumps_filler_is_the_rule_and_the_flag_overrides_it(tmp_path, capsys):
    rng = np.random.default_rng(SEED + 4)
    q, w, k, pos = _indexer_case(rng)
    pos[:3] = [1, 2, 3]  # rows that see fewer than topk positions
    topk = 8
    exact = ks.indexer_scores(q, w, k, pos)
    lens = np.minimum(pos + 1, len(k))
    rows = _filled(_exact_rows(exact, lens, topk, rng), lens, topk, "past_context", rng)
    p = tmp_path / "d.npz"
    checking.save_dump(p, "topk", rows=rows, index_q=q, weights=w, index_k=k, query_pos=pos, filler="past_context")
    code, out, _ = run(capsys, p)
    assert code == 0, out
    assert "filler 'past_context'" in out
    code, out, _ = run(capsys, p, "--filler", "-1")
    assert code == 1
    # The filler once per row, with the rule that would take it.
    assert out.count("not causal:") == (lens < topk).sum() == 4
    assert "at or past the context 2 (first: slot" in out
    assert 'check with filler="past_context"' in out
    checking.save_dump(p, "topk", rows=rows, index_q=q, weights=w, index_k=k, query_pos=pos, filler="pad")
    code, _, err = run(capsys, p)
    assert code == 2 and "filler" in err and "past_context" in err


def test_an_unknown_filler_flag_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["check", checking.example_path(), "--filler", "zero"])
    assert e.value.code == 2


def _pages(rng, lens, bs, n_blocks):
    """A shuffled block table for sequences of ``lens`` keys."""
    table = np.full((len(lens), max(-(-int(L) // bs) for L in lens) + 1), -1, np.int32)
    free = list(rng.permutation(n_blocks))
    for s, L in enumerate(lens):
        for b in range(-(-int(L) // bs)):
            table[s, b] = free.pop()
    return table


@pytest.mark.parametrize("page_layout", ["dense", "fp8_scaled"])
def test_a_paged_dump_of_indexer_topk_paged_rows_passes_and_a_broken_row_is_caught(tmp_path, capsys, page_layout):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(SEED + 5)
    bs, d, h, n_blocks = 8, 16, 4, 24
    lens = np.array([13, 40, 29])
    table = _pages(rng, lens, bs, n_blocks)
    keys = rng.standard_normal((n_blocks, bs, d)).astype(np.float32)
    if page_layout == "dense":
        cache = keys.astype(ml_dtypes.bfloat16)
    else:
        scale = (np.abs(keys).max(axis=2) / 448).astype(np.float32)
        fp8 = (keys / scale[..., None]).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
        cache = np.concatenate(
            [fp8.reshape(n_blocks, bs * d), scale.view(np.uint8).reshape(n_blocks, bs * 4)], axis=1
        ).reshape(n_blocks, bs, 1, d + 4)
    seq = rng.integers(0, 3, 12)
    pos = np.array([rng.integers(0, lens[s]) for s in seq])
    q = rng.standard_normal((12, h, d)).astype(np.float32).astype(ml_dtypes.bfloat16)
    w = rng.standard_normal((12, h)).astype(np.float32)
    topk = 6
    rows = ks.indexer_topk_paged(q, w, cache, table, lens, seq, pos, topk, page_layout=page_layout)
    p = tmp_path / "paged.npz"
    common = dict(
        index_q=q,
        weights=w,
        kv_cache=cache,
        block_table=table,
        seq_lens=lens,
        seq_ids=seq,
        query_pos=pos,
        page_layout=page_layout,
    )
    checking.save_dump(p, "topk", rows=rows, **common)
    assert checking.load_dump(p)["kv_cache"].dtype in (np.uint16, np.uint8)  # raw bits, never converted
    code, out, _ = run(capsys, p, "--rtol", "0")
    assert code == 0, out
    broken = int(np.flatnonzero(pos >= topk)[0])
    checking.save_dump(p, "topk", rows=_break(rows, broken), **common)
    r = checking.check_dump(p, rtol=0.0)
    assert [x["row"] for x in r["checks"][0]["report"]["details"]] == [broken]
    # The same rows as global slot ids through the shared block table.
    glob = np.where(rows < 0, -1, table[seq[:, None], np.maximum(rows, 0) // bs].astype(np.int64) * bs + rows % bs)
    checking.save_dump(p, "topk", rows=glob, req_ids=seq, **common)
    assert checking.check_dump(p, rtol=0.0)["wrong"] == 0


@pytest.mark.parametrize(
    "extra, message",
    [
        (dict(block_size=8), "without req_ids is ambiguous"),
        (dict(dcp_size=2), "without req_ids is ambiguous"),
        (dict(req_ids=np.zeros(12, np.int64)), "req_ids must equal seq_ids"),
        (dict(index_k=np.zeros((4, 16), np.float32)), "either packed"),
        (dict(req_ids="seq", block_size=4), "not kv_cache's page size"),
    ],
)
def test_an_ambiguous_paged_dump_is_refused_with_a_clear_message(tmp_path, capsys, extra, message):
    rng = np.random.default_rng(SEED + 6)
    bs, d, n_blocks = 8, 16, 12
    lens = np.array([13, 30])
    table = _pages(rng, lens, bs, n_blocks)
    cache = rng.standard_normal((n_blocks, bs, d)).astype(np.float32)
    seq, pos = np.array([0, 1] * 6), np.array([3, 9] * 6)
    q, w = rng.standard_normal((12, 2, d)).astype(np.float32), rng.standard_normal((12, 2)).astype(np.float32)
    rows = ks.indexer_topk_paged(q, w, cache, table, lens, seq, pos, 4)
    extra = {k: (seq if isinstance(v, str) else v) for k, v in extra.items()}
    p = tmp_path / "paged.npz"
    checking.save_dump(
        p,
        "topk",
        rows=rows,
        index_q=q,
        weights=w,
        kv_cache=cache,
        block_table=table,
        seq_lens=lens,
        seq_ids=seq,
        query_pos=pos,
        **extra,
    )
    code, _, err = run(capsys, p)
    assert code == 2 and message in err, err


def test_a_per_tensor_key_scale_in_a_dump_is_every_keys_scale(tmp_path, capsys):
    rng = np.random.default_rng(SEED + 7)
    q, w, k, pos = _indexer_case(rng)
    rows = ks.indexer_topk(q, w, k, pos, 8, key_scale=0.5)
    p = tmp_path / "d.npz"
    checking.save_dump(p, "topk", rows=rows, index_q=q, weights=w, index_k=k, query_pos=pos, key_scale=np.float32(0.5))
    assert run(capsys, p, "--rtol", "0")[0] == 0
    checking.save_dump(
        p, "topk", rows=rows, index_q=q, weights=w, index_k=k, query_pos=pos, key_scale=np.float32(np.nan)
    )
    code, _, err = run(capsys, p)
    assert code == 2 and "key_scale is nan" in err


@pytest.mark.parametrize("dtype, fmt", [("bfloat16", "bfloat16"), ("float8_e4m3fn", "float8_e4m3fn")])
def test_an_np_savez_of_ml_dtypes_arrays_is_read_with_its_format_and_refused_without(tmp_path, capsys, dtype, fmt):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(SEED + 8)
    q, w, k, pos = _indexer_case(rng)
    k = k.astype(getattr(ml_dtypes, dtype))
    rows = ks.indexer_topk(q, w, k, pos, 8)
    p = tmp_path / "savez.npz"
    np.savez(p, kind="topk", rows=rows, index_q=q, weights=w, index_k=k, query_pos=pos)
    assert np.load(p)["index_k"].dtype.kind == "V"  # what np.savez really wrote
    code, _, err = run(capsys, p)
    assert code == 2
    assert "index_k" in err and "index_k_format=" in err
    if dtype == "bfloat16":
        assert '"bfloat16" or "float16"' in err  # |V2 is either: never guessed
    else:
        assert '"float8_e4m3fn"' in err
    np.savez(p, kind="topk", rows=rows, index_q=q, weights=w, index_k=k, index_k_format=fmt, query_pos=pos)
    code, out, _ = run(capsys, p, "--rtol", "0")
    assert code == 0, out
    np.savez(
        p,
        kind="topk",
        rows=_break(rows, int(np.argmax(pos))),
        index_q=q,
        weights=w,
        index_k=k,
        index_k_format=fmt,
        query_pos=pos,
    )
    assert run(capsys, p, "--rtol", "0")[0] == 1


def test_3d_rows_mean_queries_and_heads_only_and_a_topk_dump_refuses_them(tmp_path, capsys):
    rng = np.random.default_rng(SEED + 9)
    q, w, k, pos = _indexer_case(rng)
    rows = ks.indexer_topk(q, w, k, pos, 8)
    p = tmp_path / "d.npz"
    checking.save_dump(p, "topk", rows=rows[:, None, :], index_q=q, weights=w, index_k=k, query_pos=pos)
    code, _, err = run(capsys, p)
    assert code == 2 and "rows must be [n_rows, topk]" in err


# ------------------------------------------------------------ --json FILE


def test_json_file_is_written_beside_the_text_report_in_one_run(tmp_path, capsys):
    out_json = tmp_path / "report.json"
    code, out, _ = run(capsys, checking.example_path(), "--json", out_json)
    assert code == 1
    assert out.startswith("kvselect check") and "1 wrong row(s)" in out
    r = json.loads(out_json.read_text())
    assert r["wrong"] == 1 and r["kind"] == "topk"
    assert r == json.loads(json.dumps(checking.strict_json(checking.check_dump(checking.example_path()))))


def test_json_dash_prints_the_json_instead_of_the_text(capsys):
    code, out, _ = run(capsys, checking.example_path(), "--json", "-")
    assert code == 1
    assert json.loads(out)["wrong"] == 1


def test_an_unwritable_json_file_is_refused_before_the_check_runs(tmp_path, capsys):
    missing = tmp_path / "no-such-folder" / "r.json"
    code, out, err = run(capsys, tmp_path / "not-even-a-dump.npz", "--json", missing)
    assert code == 2
    assert "--json" in err and "does not exist" in err  # not the dump's error: nothing was checked
    assert out == ""
    code, _, err = run(capsys, checking.example_path(), "--json", tmp_path)
    assert code == 2 and "is a directory" in err
    assert not os.path.exists(missing)


def test_json_onto_the_dump_itself_is_refused_and_the_dump_survives(tmp_path, capsys):
    p = tmp_path / "d.npz"
    p.write_bytes(Path(checking.example_path()).read_bytes())
    before = p.read_bytes()
    code, _, err = run(capsys, p, "--json", p)
    assert code == 2 and "the dump itself" in err
    assert p.read_bytes() == before


def test_the_filler_flag_on_a_dump_without_token_rows_is_refused(tmp_path, capsys):
    p = tmp_path / "w.npz"
    before = np.array([[0, 1, -1]], np.int32)
    checking.save_dump(
        p, "witnesses", before=before, after=before, context_lens=np.array([2], np.int32), num_segments=0
    )
    assert run(capsys, p)[0] == 0
    code, _, err = run(capsys, p, "--filler", "repeat")
    assert code == 2 and "--filler applies to topk dumps" in err


def test_a_paged_dump_with_a_non_finite_key_in_a_read_page_cannot_be_checked(tmp_path, capsys):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(SEED + 10)
    cache = rng.standard_normal((4, 4, 8)).astype(np.float32)
    table, lens = np.array([[2, 0]], np.int32), np.array([6])
    q, w = rng.standard_normal((2, 2, 8)).astype(np.float32), rng.standard_normal((2, 2)).astype(np.float32)
    seq, pos = np.array([0, 0]), np.array([5, 3])
    rows = ks.indexer_topk_paged(q, w, cache, table, lens, seq, pos, 4)
    cache[0, 1, 3] = np.nan  # key 5 of the sequence: page 0 is its second
    p = tmp_path / "paged.npz"
    checking.save_dump(
        p,
        "topk",
        rows=rows,
        index_q=q,
        weights=w,
        kv_cache=cache.astype(ml_dtypes.bfloat16),
        block_table=table,
        seq_lens=lens,
        seq_ids=seq,
        query_pos=pos,
    )
    code, _, err = run(capsys, p)
    assert code == 2 and "key 5" in err and "not finite" in err
    cache[0, 1, 3] = 0.0
    rows = ks.indexer_topk_paged(q, w, cache.astype(ml_dtypes.bfloat16), table, lens, seq, pos, 4)
    cache[1] = np.nan  # a page no sequence reads
    checking.save_dump(
        p,
        "topk",
        rows=rows,
        index_q=q,
        weights=w,
        kv_cache=cache.astype(ml_dtypes.bfloat16),
        block_table=table,
        seq_lens=lens,
        seq_ids=seq,
        query_pos=pos,
    )
    assert run(capsys, p)[0] == 0
