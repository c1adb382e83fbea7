"""kvselect.testing's assertions: the kvselect check rules and text, the
report attached, vacuous rows never passing silently, arrays through _host."""

import numpy as np
import pytest

import kvselect as ks
from kvselect import checking, testing
from kvselect.checking import DEFAULT_RTOL, check_dump, format_report
from kvselect.testing import CheckFailure, assert_blocks, assert_topk, assert_witnesses, cases


def small(seed=0, n_q=5, h=4, d=16, n_k=203, topk=16):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n_q, h, d)).astype(np.float32)
    w = rng.standard_normal((n_q, h)).astype(np.float32)
    k = rng.standard_normal((n_k, d)).astype(np.float32)
    pos = np.array([n_k - 1, 150, 77, 40, 9][:n_q])
    rows = ks.indexer_topk(q, w, k, pos, topk)
    return rows, q, w, k, pos, topk


def swap_best_for_best_loser(rows, scores, row, topk):
    """The row's best position replaced by its best unselected one (a winner dropped)."""
    bad = rows.copy()
    s = np.where(np.isnan(scores[row]), -np.inf, scores[row])
    order = np.argsort(-s, kind="stable")
    slot = int(np.flatnonzero(bad[row] == order[0])[0])
    bad[row, slot] = order[topk]
    return bad


def test_a_right_selection_returns_the_report_the_dump_check_gives():
    rows, q, w, k, pos, topk = small()
    report = assert_topk(rows, q, w, k, pos, topk)
    dumped = check_dump(
        {
            "kind": np.asarray("topk"),
            "rows": rows.astype(np.int64),
            "index_q": q,
            "weights": w,
            "index_k": k,
            "query_pos": pos,
            "topk": np.asarray(topk),
        }
    )
    assert report["wrong"] == 0 and report["vacuous"] == 0
    assert report["checks"][0]["name"] == dumped["checks"][0]["name"] == "against the exact scores"
    assert report["checks"][0]["report"] == dumped["checks"][0]["report"]
    assert report["tolerance"] == dumped["tolerance"]


def test_a_dropped_winner_raises_an_assertion_error_with_the_check_text_and_the_report():
    rows, q, w, k, pos, topk = small()
    scores = ks.indexer_scores(q, w, k, pos)
    bad = swap_best_for_best_loser(rows, scores, 2, topk)
    with pytest.raises(AssertionError) as info:
        assert_topk(bad, q, w, k, pos, topk)
    err = info.value
    assert isinstance(err, CheckFailure)
    assert err.report["wrong"] == 1
    assert err.report["checks"][0]["report"]["details"][0]["row"] == 2
    assert str(err) == format_report(err.report, source="(assert_topk)")
    assert "row 2: wrong selection: dropped 1" in str(err) and "1 wrong row(s)" in str(err)


def test_an_assertion_leaves_every_argument_byte_identical():
    rows, q, w, k, pos, topk = small()
    scores = ks.indexer_scores(q, w, k, pos)
    args = (rows, q, w, k, pos, scores)
    copies = [a.copy() for a in args]
    assert_topk(rows, q, w, k, pos, topk, engine_scores=scores)
    assert all(np.array_equal(a, b, equal_nan=True) and a.tobytes() == b.tobytes() for a, b in zip(args, copies))


def test_the_tolerance_defaults_are_the_checks_by_precision_and_aliases():
    rows, q, w, k, pos, topk = small()
    for precision, name in (("float32", "float32"), ("bf16", "bfloat16"), ("fp8", "float8_e4m3fn")):
        t = assert_topk(rows, q, w, k, pos, topk, precision=precision, fail_vacuous=False)["tolerance"]
        assert (t["precision"], t["rtol"], t["atol"]) == (name, DEFAULT_RTOL[name], 0.0)
    t = assert_topk(rows, q, w, k, pos, topk, rtol=0.0, atol=1e-3)["tolerance"]
    assert (t["rtol"], t["atol"]) == (0.0, 1e-3)
    with pytest.raises(ValueError, match="precision must be one of"):
        assert_topk(rows, q, w, k, pos, topk, precision="float12")


def test_a_vacuous_row_fails_by_default_and_is_counted_when_allowed():
    c = cases.all_zero()
    args = {name: v for name, v in c.inputs.items()}
    with pytest.raises(CheckFailure, match=r"3 vacuous row\(s\) fail the assertion") as info:
        assert_topk(c.expected, **args, rtol=0.0, atol=0.0)
    assert info.value.report["wrong"] == 0 and info.value.report["vacuous"] == 3
    report = assert_topk(c.expected, **args, rtol=0.0, atol=0.0, fail_vacuous=False)
    assert report["vacuous"] == 3 and report["wrong"] == 0


def test_a_coarse_tolerance_makes_low_contrast_rows_vacuous_not_passing():
    c = cases.low_contrast()
    with pytest.raises(CheckFailure, match="vacuous at this tolerance"):
        assert_topk(c.expected, **c.inputs, precision="bfloat16")


def test_engine_scores_that_agree_pass_all_three_checks():
    rows, q, w, k, pos, topk = small()
    scores = ks.indexer_scores(q, w, k, pos)
    report = assert_topk(rows, q, w, k, pos, topk, engine_scores=scores)
    assert [c["name"] for c in report["checks"]] == [
        "against the exact scores",
        "against the engine's own scores, exactly",
        "the engine's own scores against the exact ones",
    ]
    assert report["wrong"] == 0


def test_rows_that_are_not_the_top_k_of_the_engines_own_scores_fail_that_check_alone():
    rows, q, w, k, pos, topk = small()
    scores = ks.indexer_scores(q, w, k, pos)
    own = scores.copy()
    order = np.argsort(-np.nan_to_num(own[1], nan=-np.inf))
    own[1, order[0]] = own[1, order[topk]] - 1.0  # the engine's own best sank below its line
    with pytest.raises(CheckFailure) as info:
        assert_topk(rows, q, w, k, pos, topk, engine_scores=own)
    by_check = {c["name"]: c["report"]["wrong"] for c in info.value.report["checks"]}
    assert by_check["against the exact scores"] == 0
    assert by_check["against the engine's own scores, exactly"] == 1
    assert by_check["the engine's own scores against the exact ones"] == 1
    assert "score off: n_positions 1, position" in str(info.value)


def test_engine_scores_a_tolerance_apart_are_not_reported_off():
    rows, q, w, k, pos, topk = small()
    scores = ks.indexer_scores(q, w, k, pos)
    mags = ks.indexer_magnitudes(q, w, k, pos)
    nudged = (scores + 0.5 * DEFAULT_RTOL["float32"] * mags).astype(np.float32)
    report = assert_topk(rows, q, w, k, pos, topk, engine_scores=nudged, fail_vacuous=False)
    assert report["checks"][2]["report"]["wrong"] == 0
    far = (scores + 8 * DEFAULT_RTOL["float32"] * mags).astype(np.float32)
    with pytest.raises(CheckFailure, match=r"\n  score_off +5\n"):
        assert_topk(rows, q, w, k, pos, topk, engine_scores=far)


def test_a_non_finite_operand_is_refused_as_the_check_refuses_it():
    rows, q, w, k, pos, topk = small()
    k = k.copy()
    k[3, 4] = np.nan
    with pytest.raises(ks.SelectionError, match=r"index_k\[3, 4\] is nan"):
        assert_topk(rows, q, w, k, pos, topk)


def test_the_packed_and_paged_forms_are_checked():
    for c in (cases.short_contexts(packed=True), cases.paged(), cases.paged(page_layout="fp8_scaled")):
        assert assert_topk(c.expected, **c.inputs, rtol=0.0, atol=0.0)["wrong"] == 0
        bad = c.expected.copy()
        i = int(np.argmax(c.context_lens))
        bad[i, 0] = bad[i, 1]
        with pytest.raises(CheckFailure, match="duplicate"):
            assert_topk(bad, **c.inputs, rtol=0.0, atol=0.0)


def test_assert_blocks_passes_the_rules_selection_and_fails_a_wrong_one():
    c = cases.block_ties()
    assert assert_blocks(c.expected, **c.inputs)["wrong"] == 0
    bad = c.expected.copy()
    bad[0, 0, 0] = bad[0, 0, 1]
    with pytest.raises(CheckFailure, match="duplicate") as info:
        assert_blocks(bad, **c.inputs)
    assert info.value.report["kind"] == "blocks"
    head_major = np.ascontiguousarray(c.expected.transpose(1, 0, 2))
    assert assert_blocks(head_major, **c.inputs, head_major=True)["wrong"] == 0


def test_assert_witnesses_passes_the_rules_buffer_and_names_a_wrong_witness():
    c = cases.witness_rows()
    assert assert_witnesses(c.inputs["topk_indices"], c.expected, c.inputs["context_lens"], 8)["wrong"] == 0
    bad = c.expected.copy()
    slot = int(np.flatnonzero(c.expected[6] != c.inputs["topk_indices"][6])[0])
    bad[6, slot] += 1  # row of L = 1003: a witness the call wrote, moved
    with pytest.raises(CheckFailure, match="wrong witness"):
        assert_witnesses(c.inputs["topk_indices"], bad, c.inputs["context_lens"], 8)


# ---- _host: arrays from DLPack producers ------------------------------------------


class CpuTensor:
    """A CPU DLPack producer over a NumPy array (as torch's CPU tensors are)."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, **kwargs):
        return self.a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return (1, 0)


class GpuTensor:
    """A device tensor with torch's way to the host; counts the copies."""

    copies = 0

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, **kwargs):
        raise BufferError("on the device")

    def __dlpack_device__(self):
        return (2, 0)

    def cpu(self):
        type(self).copies += 1
        return CpuTensor(self.a)


class CupyLike:
    __module__ = "cupy._core.core"

    def __init__(self, a):
        self.a = a

    def __dlpack_device__(self):
        return (2, 0)

    def get(self):
        return self.a.copy()


class Unreachable:
    def __dlpack__(self, **kwargs):
        raise BufferError("no host copy")

    def __dlpack_device__(self):
        return (14, 0)


class Bf16Like:
    """A CPU producer of a dtype NumPy's DLPack cannot take."""

    def __dlpack__(self, **kwargs):
        raise BufferError("unsupported dtype")

    def __dlpack_device__(self):
        return (1, 0)


def test_host_passes_numpy_arrays_through_and_views_cpu_dlpack_in_place():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert testing._host(a, "x") is a
    view = testing._host(CpuTensor(a), "x")
    assert isinstance(view, np.ndarray) and np.shares_memory(view, a)


def test_host_copies_a_device_tensor_once_and_says_which_argument_it_cannot_move():
    a = np.arange(6, dtype=np.float32)
    GpuTensor.copies = 0
    got = testing._host(GpuTensor(a), "index_q")
    assert GpuTensor.copies == 1 and np.array_equal(got, a)
    assert np.array_equal(testing._host(CupyLike(a), "index_k"), a)
    with pytest.raises(TypeError, match=r"index_k: a tensor on DLPack device 14.*\.cpu\(\)"):
        testing._host(Unreachable(), "index_k")
    # A CPU producer is read by the core's own DLPack reader: its failure names the argument.
    with pytest.raises(ks.SelectionError, match=r"index_k\.__dlpack__\(\) raised BufferError"):
        testing._host(Bf16Like(), "index_k")


def test_assert_topk_takes_dlpack_tensors_from_a_device():
    rows, q, w, k, pos, topk = small()
    report = assert_topk(GpuTensor(rows), GpuTensor(q), CpuTensor(w), GpuTensor(k), pos, topk)
    assert report["wrong"] == 0


def test_assert_topk_reports_as_the_dump_check_of_the_same_call_does():
    # Every check is the checking layer's (the exact one, the engine's own
    # scores, their accuracy against the exact ones), so a dump of the same
    # call gives the same reports.
    rows, q, w, k, pos, topk = small()
    scores = ks.indexer_scores(q, w, k, pos)
    own = scores.copy()
    order = np.argsort(-np.nan_to_num(own[1], nan=-np.inf))
    own[1, order[0]] = own[1, order[topk]] - 1.0  # wrong by the engine's own scores only
    bad = swap_best_for_best_loser(rows, scores, 2, topk).astype(np.int64)  # wrong by both
    own[2] = scores[2]
    with pytest.raises(CheckFailure) as info:
        assert_topk(bad, q, w, k, pos, topk, engine_scores=own)
    report = info.value.report
    dumped = check_dump(
        {
            "kind": np.asarray("topk"),
            "rows": bad,
            "index_q": q,
            "weights": w,
            "index_k": k,
            "query_pos": pos,
            "topk": np.asarray(topk),
            "engine_scores": own,
        }
    )
    assert type(report) is type(dumped) is checking.Report
    assert report["checks"] == dumped["checks"]
    assert len(report["checks"]) == 3
    for key in ("kind", "tolerance", "filler"):
        assert report[key] == dumped[key], key
    assert (report["rows"], report["correct"], report["wrong"]) == (5, 3, 2)
    assert [x["row"] for x in report["details"]] == [1, 2]
    assert report["by_reason"]["wrong_selection"] == 2  # row 2 once, though two checks found it
    assert report["by_reason"]["score_off"] == 1  # row 1's sunk score, the third check's
    assert [p["check"] for p in report["details"][0]["problems"]] == [
        "against the engine's own scores, exactly",
        "the engine's own scores against the exact ones",
    ]


def test_the_assertions_hold_no_checking_logic_of_their_own():
    # kvselect.testing calls the checking layer: no copy of its precision
    # names, vacuity rule, context lengths, score bound or report assembly.
    from kvselect.checking import _common, engine_scores

    for name in ("_PRECISION_ALIASES", "_exactly_vacuous", "_score_accuracy", "_wrong_rows", "_ranks"):
        assert not hasattr(testing, name), name
    assert testing._precision is _common._precision
    for name in ("_context_lens", "_topk_of", "score_accuracy", "own_scores_check"):
        assert not hasattr(testing, name), name  # the engine scores' checks: engine_score_checks
    assert testing.engine_score_checks is engine_scores.engine_score_checks
