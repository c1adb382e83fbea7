"""One report type: every checker — the native ``check_*``, the checking
layer's ``check_indexer_topk`` / ``check_v4_combined_indices`` /
``check_dump``, ``kvselect check --json`` and every ``kvselect.testing``
assertion — returns a :class:`kvselect.checking.Report` with the same core
keys, the dump keys on a dump's paths, and its JSON matches the schema of
docs/report-schema.md."""

import json
import pathlib
import re

import jsonschema
import numpy as np
import pytest

import kvselect as ks
from kvselect import checking, rules, testing
from kvselect.checking import Report
from kvselect.cli import main
from kvselect.testing import cases

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCHEMA_DOC = ROOT / "docs" / "report-schema.md"
CORE = ("rows", "correct", "wrong", "by_reason", "details")
DUMP = ("kind", "tolerance", "checks")


def _schema():
    blocks = re.findall(r"^```json\n(.*?)^```", SCHEMA_DOC.read_text(), re.M | re.S)
    assert len(blocks) == 1, "docs/report-schema.md holds one JSON block: the schema"
    return json.loads(blocks[0])


def _as_json(report):
    """The report as ``kvselect check --json`` writes it: strict JSON."""
    return json.loads(json.dumps(checking.strict_json(report), allow_nan=False))


# ---- reports of every path, each with wrong rows (details to validate) ----


def _topk_scores():
    scores = np.array([[0.5, 3.0, 1.0, 2.0, -1.0], [4.0, 3.0, 2.0, 1.0, 0.0]], np.float32)
    return scores, np.array([[1, 3, 0], [0, 1, 1]])  # row 0 drops 2 for 0; row 1 repeats 1


def _indexer_case(seed=1, n=6, t=40, h=2, d=8, topk=8):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n, h, d)).astype(np.float32)
    w = rng.standard_normal((n, h)).astype(np.float32)
    k = rng.standard_normal((t, d)).astype(np.float32)
    pos = np.array([3, 9, 17, 25, 33, 39])[:n]
    rows = ks.indexer_topk(q, w, k, pos, topk).astype(np.int64)
    return rows, q, w, k, pos, topk


def _broken(rows, pos, i=4):
    """Row ``i`` with its first entry swapped for a visible position it did not select."""
    bad = rows.copy()
    unselected = sorted(set(range(int(pos[i]) + 1)) - set(bad[i].tolist()))
    bad[i, 0] = unselected[0]
    return bad


def _blocks_dump(wrong=True):
    rng = np.random.default_rng(3)
    cfg = ks.BlockSparseConfig(16, 4, 1, 1)
    q = rng.standard_normal((4, 2, 8)).astype(np.float32)
    k = rng.standard_normal((128, 8)).astype(np.float32)
    pos = np.array([20, 60, 100, 127])
    rows = np.asarray(ks.block_sparse_select(q, k, pos, cfg)).astype(np.int64)
    if wrong:
        rows[3, 1, 0] = -1  # query 3, KV head 1: a block missing
    d = dict(kind="blocks", index_q=q, index_k=k, query_pos=pos, rows=rows)
    d.update(block_size=16, top_blocks=4, init_blocks=1, local_blocks=1)
    return {key: np.asarray(v) for key, v in d.items()}, cfg


def _witness_case(wrong=True):
    before = np.tile(np.arange(8, dtype=np.int32), (3, 1))
    lens = np.array([64, 64, 64], np.int32)
    after = before.copy()
    ks.scatter_topology_witnesses(after, lens, 4)
    if wrong:
        after[2, -1] = 1  # a witness slot the rule writes otherwise
    return before, after, lens, 4


def _v4_batch(m=4, W=8, topk=4, h=2, d=8):
    rng = np.random.default_rng(11)
    sl, ql, gl = np.array([40, 30]), np.array([6, 4]), np.array([40, 20])
    qsl = np.concatenate([[0], np.cumsum(ql)])
    n_ent = sl // m
    cu = np.concatenate([[0], np.cumsum(n_ent)])
    k = rng.standard_normal((int(cu[-1]), d)).astype(np.float32)
    n = int(qsl[-1])
    q = rng.standard_normal((n, h, d)).astype(np.float32)
    w = rng.standard_normal((n, h)).astype(np.float32)
    req = np.repeat([0, 1], ql)
    pos = sl[req] - ql[req] + (np.arange(n) - qsl[req])
    rows = ks.indexer_topk_packed(q, w, k, cu, req, pos, topk, compress_ratio=m)
    N = int(n_ent.max())
    M = N + int(gl.max()) + 8
    combined, lens = ks.combine_topk_swa_indices(rows, qsl, sl, gl, W, m, topk, M, N)
    combined = combined.copy()
    combined[2, topk] -= 1  # a window slot one token before the window
    return combined, lens, (q, w, k, cu, qsl, sl, gl, W, m, topk, M, N)


def _sparse_attention_case():
    """``(out, q, k, v, indices, lse)``: the exact result of a small GQA call."""
    from kvselect.reference import sparse_attention_exact

    rng = np.random.default_rng(5)
    q = rng.standard_normal((6, 4, 8)).astype(np.float32)
    k = rng.standard_normal((20, 2, 8)).astype(np.float32)
    v = rng.standard_normal((20, 2, 4)).astype(np.float32)
    idx = rng.integers(-1, 20, (6, 2, 5))
    out, lse = sparse_attention_exact(q, k, v, idx)
    return out.astype(np.float32), q, k, v, idx, lse.astype(np.float32)


def _sparse_attention_dump(out, q, k, v, idx, lse):
    return {"kind": np.asarray("sparse_attention"), "out": out, "q": q, "k": k, "v": v, "indices": idx, "lse": lse}


def _failure(call):
    with pytest.raises(testing.CheckFailure) as e:
        call()
    return e.value.report


def _reports(tmp_path):
    """``{path name: (report, is a dump's)}``: a report of every checker."""
    out = {}
    scores, rows = _topk_scores()
    out["check_topk"] = (ks.check_topk(scores, rows), False)
    d, cfg = _blocks_dump()
    bs = ks.block_scores(d["index_q"], d["index_k"], d["query_pos"], cfg)
    nb = -(-(d["query_pos"] + 1) // 16)
    out["check_blocks"] = (ks.check_blocks(bs, d["rows"], nb, cfg), False)
    before, after, lens, segs = _witness_case()
    out["check_witnesses"] = (ks.check_witnesses(before, after, lens, segs), False)
    r, q, w, k, pos, topk = _indexer_case()
    out["check_indexer_topk"] = (checking.check_indexer_topk(_broken(r, pos), q, w, k, pos, topk), False)
    combined, clens, args = _v4_batch()
    out["check_v4_combined_indices"] = (checking.check_v4_combined_indices(combined, clens, *args), False)
    out["check_dump topk"] = (checking.check_dump(checking.example_path()), True)
    out["check_dump blocks"] = (checking.check_dump(d), True)
    wd = dict(kind="witnesses", before=before, after=after, context_lens=lens, num_segments=segs)
    out["check_dump witnesses"] = (checking.check_dump({k_: np.asarray(v) for k_, v in wd.items()}), True)
    q4, w4, k4, cu, qsl, sl, gl, W, m, tk, M, N = args
    v4 = dict(kind="v4_combined", combined_indices=combined, combined_lens=clens, index_q=q4, weights=w4)
    v4.update(index_k=k4, cu_entries=cu, query_start_loc=qsl, seq_lens=sl, gather_lens=gl, window_size=W)
    v4.update(compress_ratio=m, topk=tk, M=M, N=N)
    out["check_dump v4_combined"] = (checking.check_dump({k_: np.asarray(v) for k_, v in v4.items()}), True)
    own = (ks.indexer_scores(q, w, k, pos) + np.float32(0)).astype(np.float32)
    out["assert_topk"] = (testing.assert_topk(r, q, w, k, pos, topk, engine_scores=own), True)
    out["assert_topk failing"] = (
        _failure(lambda: testing.assert_topk(_broken(r, pos), q, w, k, pos, topk, engine_scores=own)),
        True,
    )
    good, _ = _blocks_dump(wrong=False)
    out["assert_blocks"] = (
        testing.assert_blocks(good["rows"], good["index_q"], good["index_k"], good["query_pos"], cfg),
        True,
    )
    out["assert_blocks failing"] = (
        _failure(lambda: testing.assert_blocks(d["rows"], d["index_q"], d["index_k"], d["query_pos"], cfg)),
        True,
    )
    b0, a0, l0, s0 = _witness_case(wrong=False)
    out["assert_witnesses"] = (testing.assert_witnesses(b0, a0, l0, s0), True)
    out["assert_witnesses failing"] = (_failure(lambda: testing.assert_witnesses(before, after, lens, segs)), True)
    sa = _sparse_attention_case()
    out["check_sparse_attention"] = (checking.check_sparse_attention(sa[0] + 1, *sa[1:5], lse=sa[5]), False)
    out["check_dump sparse_attention"] = (checking.check_dump(_sparse_attention_dump(sa[0] + 1, *sa[1:])), True)
    out["assert_sparse_attention"] = (testing.assert_sparse_attention(*sa[:5], lse=sa[5]), True)
    out["assert_sparse_attention failing"] = (
        _failure(lambda: testing.assert_sparse_attention(sa[0] * 2, *sa[1:5], lse=sa[5])),
        True,
    )
    json_path = tmp_path / "report.json"
    assert main(["check", "--json", str(json_path), str(checking.example_path())]) == 1
    out["kvselect check --json"] = (json.loads(json_path.read_text()), True)
    fam = _first_family_case()
    out["check_indexer_family"] = (checking.check_indexer_family(_perturbed(fam), **fam.inputs, **fam.check), False)
    for path, entry in _reports_of_the_registry().items():
        out.setdefault(path, entry)  # (a path built by hand above keeps its hand-made input)
    return out


# ---- the paths derived from the registries: none can be added unchecked ----


def _perturbed(case):
    """``case.expected`` made wrong: an entry repeated in the first row that
    holds two distinct entries (a duplicate: wrong whatever the rule), the
    kept prefix touched (witnesses), the output moved (sparse attention)."""
    bad = np.array(case.expected, copy=True)
    if case.rule == "sparse_attention":
        return bad * 2 + 1
    if case.rule == "witnesses":
        bad[-1, 0] += 1
        return bad
    for row in bad.reshape(-1, bad.shape[-1]):
        if row.shape[0] >= 2 and row[0] >= 0 and row[1] >= 0 and row[0] != row[1]:
            row[1] = row[0]
            return bad
    raise AssertionError(f"case {case.id} has no row with two entries to repeat")


def _first_family_case():
    return next(c for _, c in cases.all_family_cases() if c.meta.get("family"))


def _reports_of_the_registry():
    """For every assertion of every rule in :data:`kvselect.rules.RULES`: the
    first of the rule's cases that goes through it, run right (``assert_*``)
    and perturbed (``assert_* failing``); and ``check_dump <kind>`` of the
    perturbed dump the assertion handed to ``check_dump`` (recorded there),
    so every dump kind an assertion builds is checked with wrong rows."""
    out = {}
    for rule in rules.RULES:
        for dotted in rule.assertions:
            # The assertion's own module (kvselect.testing, or a rule module that keeps
            # its assertion): the spies go where Case.assert_rows and the assertion
            # look the names up.
            module, _, name = dotted.rpartition(".")
            home = rules.resolve(module)
            real, real_check_dump = getattr(home, name), home.check_dump
            for _, case in rules.resolve(rule.cases)():
                called, dumps = [], []

                def spy(*a, _real=real, **kw):
                    called.append(name)
                    return _real(*a, **kw)

                def recording(d, *a, **kw):
                    dumps.append(d)
                    return real_check_dump(d, *a, **kw)

                with pytest.MonkeyPatch.context() as mp:
                    mp.setattr(home, name, spy)
                    mp.setattr(home, "check_dump", recording)
                    right = case.assert_rows(case.expected)
                    if not called:
                        continue  # (a case of the rule's generator checked another way)
                    dumps.clear()
                    wrong = _failure(lambda c=case: c.assert_rows(_perturbed(c)))
                out[name] = (right, True)
                out[f"{name} failing"] = (wrong, True)
                for d in dumps:
                    out.setdefault(f"check_dump {d['kind']}", (checking.check_dump(d), True))
                break
            else:
                raise AssertionError(f"no case of {rule.cases} goes through {dotted}")
    return out


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    return _reports(tmp_path_factory.mktemp("reports"))


def _derived_paths():
    """Every public checker, from the lists the package keeps of them: the
    native ``check_*`` (``kvselect.__all__``), the checking layer's
    (``kvselect.checking.__all__``), ``check_dump`` of every dump kind of the
    rules registry, every ``kvselect.testing`` assertion (right and failing)
    and ``kvselect check --json``. A checker, assertion or dump kind added
    without a report case here is a path :func:`_reports` does not build."""
    paths = [n for n in ks.__all__ if n.startswith("check_")]
    paths += [n for n in checking.__all__ if n.startswith("check_") and n != "check_dump"]
    paths += [f"check_dump {kind}" for kind in rules.dump_kinds()]
    for n in testing.__all__:
        if n.startswith("assert_"):
            paths += [n, f"{n} failing"]
    return paths + ["kvselect check --json"]


PATHS = _derived_paths()


def test_the_paths_list_is_every_path_built(reports):
    assert sorted(reports) == sorted(PATHS)


def test_the_derived_paths_hold_every_checker_named_today():
    # (the derivation itself: it finds what the hand-kept list of before held, and the
    # registry's rules an audit found missing from it)
    for path in (
        "check_topk",
        "check_blocks",
        "check_witnesses",
        "check_indexer_topk",
        "check_indexer_family",
        "check_v4_combined_indices",
        "check_sparse_attention",
        "kvselect check --json",
    ):
        assert path in PATHS
    for kind in ("topk", "blocks", "witnesses", "v4_combined", "quest", "infllm", "nsa", "vslash", "moba"):
        assert f"check_dump {kind}" in PATHS
    for rule in ("topk", "blocks", "witnesses", "quest", "infllm", "vslash", "moba", "nsa", "sparse_attention"):
        assert f"assert_{rule}" in PATHS and f"assert_{rule} failing" in PATHS
    assert len(PATHS) == len(set(PATHS))


def test_the_schema_in_the_docs_is_a_valid_json_schema():
    jsonschema.Draft202012Validator.check_schema(_schema())


@pytest.mark.parametrize("path", PATHS)
def test_every_path_returns_the_one_report_type_with_the_core_keys(reports, path):
    report, dump = reports[path]
    if path != "kvselect check --json":  # (read back from its file: plain JSON)
        assert type(report) is Report
        for check in report.get("checks", []):
            assert type(check["report"]) is Report
    for key in CORE:
        assert key in report, (path, key)
    assert report["correct"] + report["wrong"] == report["rows"]
    assert report["wrong"] == len(report["details"])
    for reason, n in report["by_reason"].items():
        assert n == sum(any(p["reason"] == reason for p in x["problems"]) for x in report["details"]), (path, reason)
    assert all(key in report for key in DUMP) == dump, path
    json.dumps(checking.strict_json(report), allow_nan=False)  # JSON-ready, as indexed


@pytest.mark.parametrize("path", PATHS)
def test_every_paths_report_matches_the_json_schema_of_the_docs(reports, path):
    report, _ = reports[path]
    jsonschema.validate(_as_json(report), _schema(), cls=jsonschema.Draft202012Validator)


def test_the_failing_paths_did_find_wrong_rows(reports):
    # (so the schema above validated real details, not only empty lists)
    for path in PATHS:
        if path.startswith(("check_", "kvselect")) or path.endswith("failing"):
            assert reports[path][0]["wrong"] >= 1, path
            assert reports[path][0]["details"][0]["problems"], path


def test_the_schema_refuses_a_report_without_a_core_key_or_with_half_the_dump_keys(reports):
    schema = _schema()
    report = _as_json(reports["check_dump blocks"][0])
    for key in CORE + DUMP:
        broken = {k: v for k, v in report.items() if k != key}
        # The missing key is named: "'rows' is a required property", or a dump key's
        # "'kind' is a dependency of 'tolerance'".
        with pytest.raises(jsonschema.ValidationError, match=f"^'{key}' is a (required property|dependency of)"):
            jsonschema.validate(broken, schema, cls=jsonschema.Draft202012Validator)
    with pytest.raises(
        jsonschema.ValidationError, match="'extra' was unexpected"
    ):  # an undocumented key is not a report's
        jsonschema.validate({**report, "extra": 1}, schema, cls=jsonschema.Draft202012Validator)


def test_a_harness_written_against_check_topk_reads_a_blocks_dump():
    def harness(rep):  # what a kernel's CI writes against check_topk's report
        return rep["correct"], rep["wrong"], {r: n for r, n in rep["by_reason"].items() if n}

    scores, rows = _topk_scores()
    assert harness(ks.check_topk(scores, rows)) == (0, 2, {"duplicate": 1, "wrong_count": 1, "wrong_selection": 1})
    d, _ = _blocks_dump()
    rep = checking.check_dump(d)
    correct, wrong, reasons = harness(rep)
    assert (correct, wrong) == (7, 1) and rep["rows"] == 8  # 4 queries x 2 KV heads
    assert reasons == {r: n for r, n in rep["checks"][0]["report"]["by_reason"].items() if n}
    (row,) = rep["details"]
    assert (row["row"], row["query"], row["kv_head"]) == (7, 3, 1)
    assert row["problems"] == [
        dict(p, check="against the exact block scores") for p in rep["checks"][0]["report"]["details"][0]["problems"]
    ]


def test_a_dumps_core_keys_are_the_checks_together_a_row_counted_once_per_reason(tmp_path):
    # Two checks: against the given scores and against the engine's own.
    # Row 0 is wrong in both (the same reason), row 1 only against the
    # exact scores, row 2 only against the engine's own.
    rng = np.random.default_rng(5)
    exact = rng.permutation(40).reshape(4, 10).astype(np.float32)
    own = exact.copy()
    rows = np.argsort(-exact, axis=1, kind="stable")[:, :3]
    own_best = np.argsort(-own, axis=1, kind="stable")
    rows[0, 0] = own_best[0, 5]  # a loser in both
    own[1] = -exact[1]  # the engine's own scores rank row 1 upside down: its rows right only by the exact
    own[2, own_best[2, 8]] = 1e6  # the engine's own best is a position its row lacks
    d = dict(kind="topk", scores=exact, context_lens=np.full(4, 10), rows=rows, engine_scores=own)
    rep = checking.check_dump({k: np.asarray(v) for k, v in d.items()})
    first, second = (c["report"] for c in rep["checks"])
    assert [x["row"] for x in first["details"]] == [0]
    assert [x["row"] for x in second["details"]] == [0, 1, 2]
    assert (rep["rows"], rep["wrong"], rep["correct"]) == (4, 3, 1)
    assert [x["row"] for x in rep["details"]] == [0, 1, 2]
    assert rep["by_reason"]["wrong_selection"] == 3  # row 0 once, though both checks found it
    assert sum(rep["by_reason"].values()) == 3
    assert set(rep["by_reason"]) == set(first["by_reason"]) | set(second["by_reason"])
    assert [p["check"] for p in rep["details"][0]["problems"]] == [c["name"] for c in rep["checks"]]
    assert [p["check"] for p in rep["details"][1]["problems"]] == [rep["checks"][1]["name"]]
    # The checks' own reports are as they were: no key added to their problems.
    assert all("check" not in p for c in rep["checks"] for x in c["report"]["details"] for p in x["problems"])


def test_a_chunked_kvselect_check_writes_the_same_report_as_one_piece(tmp_path):
    whole, chunked = tmp_path / "whole.json", tmp_path / "chunked.json"
    example = str(checking.example_path())
    assert main(["check", "--json", str(whole), example]) == 1
    assert main(["check", "--chunk-rows", "5", "--json", str(chunked), example]) == 1
    a, b = json.loads(whole.read_text()), json.loads(chunked.read_text())
    assert a == b
    assert (a["rows"], a["correct"], a["wrong"]) == (48, 47, 1)


def test_the_report_type_is_a_dict_that_pickles_and_compares_as_one():
    import pickle

    scores, rows = _topk_scores()
    rep = ks.check_topk(scores, rows)
    assert isinstance(rep, dict) and rep == dict(rep)
    back = pickle.loads(pickle.dumps(rep))
    assert type(back) is Report and back == rep
    assert ks.check_topk.__doc__ == ks._core.check_topk.__doc__
    assert ks.check_topk.__name__ == "check_topk"
