"""Judging the kernels that consume a selection (issue 40): the exact
reference's conventions pinned on small examples; a kernel whose arithmetic
follows its model never fails (>= 10^4 (query, head) rows per dtype pairing);
kvselect's own sparse_attention passes as a reference; every planted fault is
caught and named; paged, packed, block and head-major rows are checked as
the engine holds them; the dump kind and ``kvselect check``."""

import numpy as np
import pytest
from attn_kernels import FAULTS, kernel

import kvselect as ks
from kvselect import checking
from kvselect.checking.attention import MODELS, bound, check_sparse_attention, model_of
from kvselect.cli import main
from kvselect.reference import ReferenceSelectionError
from kvselect.reference.sparse_attn import PRESETS, conventions_of, exact, layout, sparse_attention_exact
from kvselect.testing import CheckFailure, assert_sparse_attention, cases

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16, FP8 = ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn


# ---- the reference, pinned ---------------------------------------------------


def _tiny():
    # q . k = 0 for every key: equal weights, so out is the mean of the counted values.
    q = np.zeros((1, 1, 2))
    k = np.zeros((6, 1, 2))
    v = np.arange(6.0).reshape(6, 1, 1)
    return q, k, v


@pytest.mark.parametrize(
    "row, conv, want_out, want_count",
    [
        ([0, 2, 2, -1], {}, 4 / 3, 3),  # a repeat counted each time
        ([0, 2, 2, -1], {"duplicates": "once"}, 1.0, 2),
        ([1, 3, 5, 4], {"read": "prefix"}, 2.0, 2),  # read_len 2 below
        ([1, 3, 5, 4], {"read": "suffix"}, 4.5, 2),
        ([1, -1, 3, -1, 5], {"read": "last_valid"}, 3.0, 3),
        ([1, 9, 3], {}, 2.0, 2),  # 9 is past the 6 keys: skipped
        ([5, 0, 4], {"causal": True}, 0.0, 1),  # query_pos 3 below
        ([0, 2], {"block_size": 2}, 2.5, 4),  # blocks [0,1] and [4,5]
    ],
)
def test_the_reference_counts_what_its_conventions_say(row, conv, want_out, want_count):
    q, k, v = _tiny()
    c = conventions_of(None, **conv)
    lay = layout(q, k, v, np.array([row]), c, query_pos=[3], read_len=[2])
    r = exact(lay)
    assert r.out[0, 0, 0] == pytest.approx(want_out, rel=1e-15)
    assert r.count[0, 0] == want_count
    assert r.lse[0, 0] == pytest.approx(np.log(want_count), rel=1e-15)


def test_an_empty_row_is_zero_with_minus_inf_and_a_sink_joins_the_denominator_only():
    q, k, v = _tiny()
    out, lse = sparse_attention_exact(q, k, v, np.array([[-1, -1]]))
    assert out.tolist() == [[[0.0]]] and lse.tolist() == [[-np.inf]]
    out, lse = sparse_attention_exact(q, k, v, np.array([[1, 3]]), sink=[np.log(2.0)])
    assert out[0, 0, 0] == pytest.approx(2.0 * 2 / 4, rel=1e-15)  # (1 + 3) / (2 + e^sink)
    assert lse[0, 0] == pytest.approx(np.log(2.0), rel=1e-15)  # the KV only


def test_mla_reads_values_from_the_latents_head_and_gqa_rows_serve_their_group():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((3, 4, 6))
    kv = rng.standard_normal((10, 1, 6))
    idx = np.array([[1, 4, -1], [0, 0, 9], [-1, -1, -1]])
    out, lse = sparse_attention_exact(q, kv, None, idx, d_v=4)
    full, lse2 = sparse_attention_exact(q, kv, kv[..., :4].copy(), idx)
    assert np.array_equal(out, full) and np.array_equal(lse, lse2)
    # GQA: 4 query heads over 2 KV heads, one row each
    k = rng.standard_normal((10, 2, 6))
    rows = np.stack([idx, idx[::-1]], axis=1)  # [3, 2, 3]
    o, _ = sparse_attention_exact(q, k, k, rows)
    for h in range(4):
        one, _ = sparse_attention_exact(
            q[:, h : h + 1], k[:, h // 2 : h // 2 + 1], k[:, h // 2 : h // 2 + 1], rows[:, h // 2]
        )
        assert np.allclose(o[:, h], one[:, 0], rtol=1e-14, atol=0)


def test_the_presets_state_what_their_sources_say():
    assert PRESETS["flashmla_sparse_prefill"].empty_lse == "+inf"
    assert PRESETS["flashmla_sparse_decode"].lse_head_major
    assert PRESETS["cudnn_793"].duplicates == "unique" and PRESETS["cudnn_793"].empty_lse == "-inf"
    assert PRESETS["vllm_triton_mla_sparse"].empty_lse_range() == (-1e31, -1e29)
    mm = PRESETS["minimax_m3"]
    assert (mm.read, mm.block_size, mm.causal, mm.head_major, mm.lse_base) == ("prefix", 128, True, True, "2")
    assert PRESETS["sglang_dsa_prefill"].read == "last_valid"
    assert PRESETS["kvselect"].duplicates == "once" and PRESETS["kvselect"].causal
    assert model_of(None, "minimax_m3", None).kv_round == "bfloat16"
    assert model_of(None, "flashmla_sparse_prefill", None).p_round == "bfloat16"


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        ({"indices": np.array([[0, 1, 1]]), "preset": "cudnn_793"}, "indices"),  # unique rows
        ({"indices": np.array([[0, 7]]), "preset": "cudnn_793"}, "indices"),  # out of range, refused
        ({"indices": np.array([[0, 1]]), "preset": "kvselect"}, "query_pos"),  # causal needs positions
        ({"indices": np.array([[0, 1]]), "preset": "nope"}, "preset"),
        ({"indices": np.array([[[0], [1]]])}, "indices"),  # 2 rows a query for 1 head
        ({"indices": np.array([[0, 1]]), "sink": [0.0, 1.0]}, "sink"),
        ({"indices": np.array([[0, 1]]), "d_v": 3}, "d_v"),
    ],
)
def test_refusals_name_the_argument(kwargs, argument):
    q, k, _ = _tiny()
    kwargs = dict(kwargs)
    idx = kwargs.pop("indices")
    with pytest.raises(ReferenceSelectionError, match=argument) as e:
        sparse_attention_exact(q, k, None, idx, **kwargs)
    assert e.value.argument == argument


@pytest.mark.parametrize("where", ["q", "k", "v"])
def test_a_non_finite_input_a_row_reads_is_refused_naming_it_and_one_no_row_reads_is_not(where):
    rng = np.random.default_rng(3)
    q = rng.standard_normal((4, 2, 8))
    k = rng.standard_normal((10, 1, 8))
    v = rng.standard_normal((10, 1, 4))
    idx = np.array([[0, 1, -1], [2, 3, 4], [5, -1, -1], [-1, -1, -1]])
    out, lse = sparse_attention_exact(q, k, v, idx)
    arrays = {"q": q, "k": k, "v": v}
    unread = {"q": (3, 0, 0), "k": (9, 0, 0), "v": (9, 0, 0)}  # query 3 is empty; key 9 unselected
    arrays[where][unread[where]] = np.nan
    assert check_sparse_attention(out, **arrays, indices=idx, lse=lse)["wrong"] == 0
    read = {"q": (1, 1, 2), "k": (3, 0, 5), "v": (4, 0, 1)}
    arrays[where][read[where]] = np.inf
    with pytest.raises(ReferenceSelectionError, match=f"^{where} holds a NaN or infinite value") as e:
        check_sparse_attention(out, **arrays, indices=idx, lse=lse)
    assert e.value.argument == where
    with pytest.raises(checking.DumpError, match=where):
        checking.check_dump({"kind": np.asarray("sparse_attention"), "out": out, **arrays, "indices": idx})


def test_a_bad_convention_is_refused_by_name():
    for field, value in (("read", "all"), ("duplicates", "twice"), ("lse_base", "10"), ("block_size", 0)):
        with pytest.raises(ReferenceSelectionError, match=field):
            conventions_of(None, **{field: value})


# ---- a right kernel never fails; kvselect's own pass passes -------------------

PAIRINGS = [
    # (name, q dtype, k/v dtype, out dtype, P rounded to, model)
    ("f32", np.float32, np.float32, np.float32, None, "float32"),
    ("bf16", BF16, BF16, BF16, BF16, "flashmla_sparse"),
    ("bf16-out-f32", BF16, BF16, np.float32, BF16, "flashmla_sparse"),
    ("fp8-kv", BF16, FP8, BF16, BF16, "flashmla_sparse"),
    ("fp8-kv-out-f32", BF16, FP8, np.float32, BF16, "vllm_triton_mla_sparse"),
]


def _random_batch(seed, kv_dtype, q_dtype, n=2500, H=4, Hkv=2, T=300, W=48, d=64, dv=32):
    rng = np.random.default_rng(seed)
    q = (rng.standard_normal((n, H, d)) * 1.5).astype(q_dtype)
    k = (rng.standard_normal((T, Hkv, d)) * rng.choice([0.5, 1.0, 3.0], (T, 1, 1))).astype(kv_dtype)
    v = rng.standard_normal((T, Hkv, dv)).astype(kv_dtype)
    idx = rng.integers(-1, T, (n, Hkv, W))
    idx[::41] = -1  # empty rows
    idx[1::7, :, :20] = -1  # leading padding
    idx[2::5, :, 30:] = idx[2::5, :, :18]  # repeats
    pos = rng.integers(0, T, n)
    return q, k, v, idx, pos


@pytest.mark.parametrize("pairing", PAIRINGS, ids=[p[0] for p in PAIRINGS])
@pytest.mark.parametrize("causal", [False, True])
def test_a_kernel_following_its_model_never_fails_on_ten_thousand_rows(pairing, causal):
    name, qd, kd, od, pd, model = pairing
    q, k, v, idx, pos = _random_batch(11, kd, qd)
    out, lse = kernel(q, k, v, idx, query_pos=pos, causal=causal, p_dtype=pd, out_dtype=od)
    conv = conventions_of(None, causal=causal)
    report = check_sparse_attention(out, q, k, v, idx, lse=lse, conventions=conv, model=model, query_pos=pos)
    assert report["rows"] >= 10_000
    assert report["wrong"] == 0, report["worst"]
    assert report["empty_rows"] > 0
    # The bound is not vacuous: the kernel's error uses a visible share of it.
    lay = layout(q, k, v, idx, conv, query_pos=pos)
    ex = exact(lay)
    b_out, b_lse = bound(ex, MODELS[model], q.shape[2], np.dtype(od).name, "float32", "e")
    ratio = np.abs(out.astype(np.float64) - ex.out) / b_out
    assert 0.02 < ratio.max() <= 1.0


def test_mla_with_a_rope_tail_passes_and_its_values_are_the_latents_head():
    rng = np.random.default_rng(5)
    n, H, d, dv, T = 2500, 4, 40, 32, 200
    q = rng.standard_normal((n, H, d)).astype(BF16)
    kv = rng.standard_normal((T, 1, d)).astype(BF16)
    idx = rng.integers(-1, T, (n, 1, 24))
    out, lse = kernel(q, kv, None, idx, d_v=dv, p_dtype=BF16, out_dtype=BF16)
    r = check_sparse_attention(
        out, q, kv, None, idx, lse=lse, d_v=dv, preset="vllm_triton_mla_sparse", model="flashmla_sparse"
    )
    assert r["rows"] == 10_000 and r["wrong"] == 4 * len(np.flatnonzero((idx < 0).all(axis=(1, 2))))
    # ... the only wrong rows are the empty ones, whose lse the preset says is a finite sentinel
    assert set(r["by_reason"]) and r["by_reason"]["empty_row"] == r["wrong"]
    sentinel = np.where(np.isneginf(lse), -6.9e29, lse)
    assert (
        check_sparse_attention(
            out, q, kv, None, idx, lse=sentinel, d_v=dv, preset="vllm_triton_mla_sparse", model="flashmla_sparse"
        )["wrong"]
        == 0
    )


@pytest.mark.parametrize("pairing", PAIRINGS, ids=[p[0] for p in PAIRINGS])
def test_kvselects_own_sparse_attention_passes_as_a_reference(pairing):
    name, qd, kd, od, _, _ = pairing
    q, k, v, idx, pos = _random_batch(12, kd, qd)
    q32, k32, v32 = (np.asarray(a).astype(np.float32) for a in (q, k, v))  # the decoded inputs
    out, lse, _ = ks.sparse_attention(q32, k32, v32, pos, idx.astype(np.int32))
    report = assert_sparse_attention(out.astype(od), q, k, v, idx, lse=lse, preset="kvselect", query_pos=pos)
    assert report["rows"] >= 10_000 and report["checks"][0]["report"]["model"]["name"] == "float32"
    # ... and its counting is the set's: read as every engine counts, it fails by repeats
    with pytest.raises(CheckFailure, match="counted once"):
        assert_sparse_attention(
            out, q, k, v, idx, lse=lse, conventions=conventions_of("kvselect", duplicates="each"), query_pos=pos
        )


@pytest.mark.parametrize("pairing", PAIRINGS, ids=[p[0] for p in PAIRINGS])
def test_kvselects_pass_counting_repeats_each_time_is_a_reference_for_the_engines_convention(pairing):
    name, qd, kd, od, _, _ = pairing
    q, k, v, idx, pos = _random_batch(18, kd, qd)
    q32, k32, v32 = (np.asarray(a).astype(np.float32) for a in (q, k, v))
    out, lse, _ = ks.sparse_attention(q32, k32, v32, pos, idx.astype(np.int32), duplicates="each")
    each = conventions_of("kvselect", duplicates="each")
    report = assert_sparse_attention(out.astype(od), q, k, v, idx, lse=lse, conventions=each, query_pos=pos)
    assert report["rows"] >= 10_000
    with pytest.raises(CheckFailure, match="counted each"):  # read as a set, it fails by the repeats
        assert_sparse_attention(out, q, k, v, idx, lse=lse, preset="kvselect", query_pos=pos)


def test_the_native_pass_counting_repeats_equals_its_numpy_twin():
    from kvselect import reference

    rng = np.random.default_rng(19)
    for trial in range(40):
        n, hkv, group, d, dv, T, W = 7, int(rng.integers(1, 3)), int(rng.integers(1, 3)), 16, 8, 50, 12
        q = rng.standard_normal((n, hkv * group, d)).astype(np.float32)
        k = rng.standard_normal((T, hkv, d)).astype(np.float32)
        v = rng.standard_normal((T, hkv, dv)).astype(np.float32)
        sel = rng.integers(-2, T + 3, (n, hkv, W)).astype(np.int32)
        sel[:, :, W // 2 :] = sel[:, :, : W - W // 2]  # repeats
        pos = rng.integers(0, T + 2, n)
        for dup in ("once", "each"):
            o, l_, e = ks.sparse_attention(q, k, v, pos, sel, duplicates=dup)
            ro, rl, re_ = reference.sparse_attention(q, k, v, pos, sel, duplicates=dup)
            assert e == re_
            assert np.allclose(o, ro, rtol=1e-5, atol=1e-6), (trial, dup)
            assert np.array_equal(np.isneginf(l_), np.isneginf(rl))
            assert np.allclose(np.where(np.isinf(rl), 0, l_), np.where(np.isinf(rl), 0, rl), rtol=1e-5, atol=1e-6)


def test_an_unknown_duplicates_is_refused_naming_it_and_writes_nothing():
    from kvselect import reference

    q, k, v = np.ones((1, 1, 2), np.float32), np.ones((3, 1, 2), np.float32), np.ones((3, 1, 2), np.float32)
    sel = np.array([[[0, 0]]], np.int32)
    out, lse = np.full((1, 1, 2), 7.0, np.float32), np.full((1, 1), 7.0, np.float32)
    for impl in (ks.sparse_attention, reference.sparse_attention):
        with pytest.raises(ValueError, match="duplicates") as e:
            impl(q, k, v, [2], sel, duplicates="twice", out=out, lse_out=lse)
        assert e.value.argument == "duplicates"
        assert (out == 7).all() and (lse == 7).all()
        with pytest.raises(TypeError, match="^duplicates must be a string|(?s:'str'.*while processing 'duplicates')"):
            impl(q, k, v, [2], sel, duplicates=1)


# ---- planted faults, caught and named ---------------------------------------------

CAUSE = {f: f for f in FAULTS}


@pytest.mark.parametrize("fault", FAULTS)
def test_each_planted_fault_is_caught_and_named(fault):
    q, k, v, idx, pos = _random_batch(13, BF16, BF16, n=600)
    causal = fault == "causal_off_by_one"
    if fault == "padding_read":
        idx[3::4, :, -5:] = -1  # trailing padding a wrapped -1 reads as the last key
    out, lse = kernel(q, k, v, idx, query_pos=pos, causal=causal, p_dtype=BF16, out_dtype=BF16, fault=fault)
    conv = conventions_of(None, causal=causal)
    r = check_sparse_attention(out, q, k, v, idx, lse=lse, conventions=conv, model="flashmla_sparse", query_pos=pos)
    assert r["wrong"] > 0
    named = r["by_cause"]
    # (a kernel whose running max starts at -inf unguarded is NaN on empty rows too)
    also = {"nan_empty_row"} if fault == "nan_masked_first_chunk" else set()
    assert CAUSE[fault] in named and set(named) <= {CAUSE[fault]} | also, named
    assert 0 < r["diagnosed"] <= min(r["wrong"], 128)
    assert sum(named.values()) >= 0.9 * r["diagnosed"]
    with pytest.raises(CheckFailure, match="likely cause"):
        assert_sparse_attention(out, q, k, v, idx, lse=lse, conventions=conv, model="flashmla_sparse", query_pos=pos)


def test_a_report_names_rows_worst_error_and_bound():
    q, k, v, idx, pos = _random_batch(14, np.float32, np.float32, n=50)
    out, lse = kernel(q, k, v, idx, fault="lost_rescale")
    r = check_sparse_attention(out, q, k, v, idx, lse=lse)
    row = r["details"][0]
    p = row["problems"][0]
    assert row["row"] == row["query"] * 4 + row["head"]
    assert p["error"] > p["bound"] > 0 and p["ratio"] == p["error"] / p["bound"]
    assert r["worst"]["ratio"] == max(x["ratio"] for d in r["details"] for x in d["problems"])
    assert r["model"] == {"name": "float32", "summary": MODELS["float32"].summary, "source": MODELS["float32"].source}


def test_atol_rtol_replace_the_model_and_a_loose_one_hides_a_fault():
    q, k, v, idx, pos = _random_batch(15, np.float32, np.float32, n=100)
    out, lse = kernel(q, k, v, idx, fault="lost_rescale")
    assert check_sparse_attention(out, q, k, v, idx, lse=lse)["wrong"] > 0
    loose = check_sparse_attention(out, q, k, v, idx, atol=100.0)
    assert loose["wrong"] == 0 and loose["model"]["name"] == "tolerance"


# ---- layouts as the engine holds them --------------------------------------------------


def _paged_engine(case, fault=None, indices=None):
    """MiniMax-M3's read of a paged_blocks case, by hand: the first
    min(width, pos // block + 1) entries, each block's tokens through the block
    table (with ``fault``, a -1 entry read as the page block_table[seq][-1],
    every token of it visible), then the float32 kernel on those token rows."""
    inp = case.inputs
    k, v, table = inp["k"], inp["v"], inp["block_table"]
    P = k.shape[1]
    idx = (inp["indices"] if indices is None else indices).transpose(1, 0, 2)
    n, G, W = idx.shape
    rows = np.full((n, G, W * P), -1, dtype=np.int64)
    for i in range(n):
        s, pos = inp["seq_ids"][i], inp["query_pos"][i]
        read = min(W, pos // P + 1)
        for g in range(G):
            for j in range(read):
                e = idx[i, g, j]
                if e < 0:
                    if fault == "table_last":
                        rows[i, g, j * P : (j + 1) * P] = table[s, -1] * P + np.arange(P)
                    continue
                t = e * P + np.arange(P)
                ok = (t < inp["seq_lens"][s]) & (t <= pos)
                rows[i, g, j * P : (j + 1) * P] = np.where(ok, table[s, e] * P + t % P, -1)
    flat_k, flat_v = k.reshape(-1, *k.shape[2:]), v.reshape(-1, *v.shape[2:])
    nan_fault = "nan_masked_first_chunk" if fault == "nan_masked_first_chunk" else None
    return kernel(inp["q"], flat_k, flat_v, rows, chunk=P, fault=nan_fault)


def test_paged_head_major_block_rows_are_checked_as_the_engine_holds_them():
    case = cases.paged_blocks(3)
    out, _ = _paged_engine(case)
    assert case.assert_rows(out)["wrong"] == 0
    out, _ = _paged_engine(case, fault="table_last")
    with pytest.raises(CheckFailure) as e:
        case.assert_rows(out)
    r = e.value.report["checks"][0]["report"]
    assert r["wrong"] > 0 and set(r["by_cause"]) == {"padding_read"}
    assert "block_table[seq][-1]" in str(e.value)


def test_a_future_first_block_is_named_and_a_paged_dump_is_checked_as_held(tmp_path):
    # MiniMax-M3's prefill: the first block read entirely in the future (an indexer that
    # wrote it first), a running max from -inf: NaN, named by the row's first masked tokens.
    case = cases.paged_blocks(4)
    inp = case.inputs
    idx = inp["indices"].copy()  # [G, n, W]
    P = inp["k"].shape[1]
    moved = []
    for i in range(idx.shape[1]):
        s, pos = inp["seq_ids"][i], inp["query_pos"][i]
        future = pos // P + 1
        if future * P < inp["seq_lens"][s] and pos // P >= 1 and (idx[:, i, 1] >= 0).all():
            idx[:, i, 0] = future  # slot 0 now a future block, the rest still valid
            moved.append(i)
    assert moved
    args = {k_: v_ for k_, v_ in inp.items() if k_ not in ("indices", "conventions")}
    good, _ = _paged_engine(case, indices=idx)
    assert_sparse_attention(good, **{**args, "indices": idx}, conventions=inp["conventions"])
    bad, _ = _paged_engine(case, fault="nan_masked_first_chunk", indices=idx)
    with pytest.raises(CheckFailure) as e:
        assert_sparse_attention(bad, **{**args, "indices": idx}, conventions=inp["conventions"])
    r = e.value.report["checks"][0]["report"]
    assert set(r["by_cause"]) == {"nan_masked_first_chunk"}
    assert {d["query"] for d in r["details"]} <= set(moved)
    # The same call as a dump: a paged head-major block dump, checked as the engine holds it.
    path = tmp_path / "paged.npz"
    c = inp["conventions"]
    checking.save_dump(
        path,
        "sparse_attention",
        out=good,
        **{**args, "indices": idx},
        preset="minimax_m3",
        block_size=c.block_size,
    )
    assert checking.check_dump(path)["wrong"] == 0


def test_a_packed_batch_reads_each_querys_own_sequence():
    case = cases.packed_mla(2)
    inp = case.inputs
    cu, seq = inp["cu_seqlens"], inp["seq_ids"]
    glob = np.where(inp["indices"] >= 0, inp["indices"] + cu[seq][:, None, None], -1)
    out, lse = kernel(inp["q"], inp["k"], None, glob, d_v=inp["d_v"])
    lse = np.where(np.isneginf(lse), np.inf, lse)  # FlashMLA's empty row
    assert case.assert_rows((out, lse))["wrong"] == 0
    local, _ = kernel(inp["q"], inp["k"], None, inp["indices"], d_v=inp["d_v"])  # forgot the offsets
    # The first sequence's rows (offset 0) stay right; the others read the wrong keys.
    with pytest.raises(CheckFailure, match=r"\n  out_error +24\n"):
        case.assert_rows(local)


# ---- the cases ----------------------------------------------------------------------

SA = cases.all_sparse_attention_cases()
DENSE = [(i, c) for i, c in SA if "block_table" not in c.inputs and "cu_seqlens" not in c.inputs]


@pytest.mark.parametrize("case", cases.pytest_params(SA))
def test_every_sparse_attention_case_passes_its_exact_answer(case):
    assert case.assert_rows(case.expected)["wrong"] == 0
    assert case.assert_rows((case.expected, case.meta["lse"]))["wrong"] == 0


def _run(case, fault=None):
    inp, conv = case.inputs, case.inputs["conventions"]
    idx = inp["indices"]
    if conv.read == "prefix":  # the kernel reads whole rows: give it the prefix
        keep = np.arange(idx.shape[2])[None, None, :] < inp["read_len"][:, None, None]
        idx = np.where(keep, idx, -1) if fault != "padding_read" else idx
    if conv.read == "last_valid":
        last = np.where((idx >= 0).any(axis=2), idx.shape[2] - 1 - np.argmax((idx >= 0)[:, :, ::-1], axis=2), -1)
        idx = np.where(np.arange(idx.shape[2]) <= last[..., None], idx, -2)  # -2: never read as -1
    return kernel(
        inp["q"],
        inp["k"],
        inp["v"],
        idx,
        query_pos=inp.get("query_pos"),
        causal=conv.causal,
        duplicates=conv.duplicates,
        fault=fault,
    )


@pytest.mark.parametrize("case", cases.pytest_params(DENSE))
def test_the_right_kernel_passes_every_dense_case_and_each_fault_fails_the_cases_named_for_it(case):
    out, lse = _run(case)
    assert case.assert_rows((out, lse))["wrong"] == 0
    for fault in case.meta["faults"]:
        kernel_fault = "padding_read" if fault == "read_past_length" else fault
        if kernel_fault not in FAULTS:
            continue
        out, lse = _run(case, kernel_fault)
        with pytest.raises(CheckFailure) as e:
            case.assert_rows((out, lse))
        assert fault in e.value.report["checks"][0]["report"]["by_cause"], (case.id, fault)


# ---- the dump kind and kvselect check ------------------------------------------------


def test_a_dump_is_checked_by_kvselect_check_with_its_exit_status(tmp_path, capsys):
    q, k, v, idx, pos = _random_batch(16, BF16, BF16, n=40)
    good, lse = kernel(q, k, v, idx, p_dtype=BF16, out_dtype=BF16, empty_lse=np.inf)  # FlashMLA's empty row
    bad, _ = kernel(q, k, v, idx, p_dtype=BF16, out_dtype=BF16, fault="duplicates_other_way")
    for name, out, code in (("good", good, 0), ("bad", bad, 1)):
        path = tmp_path / f"{name}.npz"
        checking.save_dump(
            path, "sparse_attention", q=q, k=k, v=v, indices=idx, out=out, lse=lse, preset="flashmla_sparse_prefill"
        )
        assert main(["check", str(path)]) == code
        text = capsys.readouterr().out
        assert "flashmla_sparse" in text
    assert "a repeated entry counted the other way" in text
    assert main(["check", str(tmp_path / "bad.npz"), "--atol", "100"]) == 0
    capsys.readouterr()
    # The empty row's convention is checked: FlashMLA's +inf, not -inf
    path = tmp_path / "minus.npz"
    checking.save_dump(
        path,
        "sparse_attention",
        q=q,
        k=k,
        v=v,
        indices=idx,
        out=good,
        lse=minus_lse(lse),
        preset="flashmla_sparse_prefill",
    )
    assert main(["check", str(path)]) == 1
    text = capsys.readouterr().out
    assert "empty_row" in text and "an empty row's lse must be +inf" in text and "likely cause" not in text


def minus_lse(lse):
    return np.where(np.isposinf(lse), -np.inf, lse)


def test_a_dump_that_cannot_be_checked_is_a_dump_error_naming_the_key():
    q, k, v, idx, _ = _random_batch(17, np.float32, np.float32, n=10)
    d = dict(kind="sparse_attention", q=q, k=k, v=v, indices=idx, out=np.zeros((10, 4, 32), np.float32))
    with pytest.raises(checking.DumpError, match="preset"):
        checking.check_dump({**d, "preset": np.asarray("nope")})
    with pytest.raises(checking.DumpError, match="out"):
        checking.check_dump({**d, "out": np.zeros((10, 4, 31), np.float32)})
    with pytest.raises(checking.DumpError, match="empty_lse"):
        checking.check_dump({**d, "empty_lse_high": np.asarray(1.0)})
