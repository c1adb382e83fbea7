"""Workloads: the synthetic generator's head types, the derived indexer, the
documented .npz format and its refusals, and the shipped real example."""

from __future__ import annotations

from importlib import resources

import numpy as np
import pytest

from kvselect.workloads import (
    HEAD_KINDS,
    Workload,
    WorkloadError,
    derive_indexer,
    example,
    load_npz,
    quantize_rows,
    query_positions,
    synthetic,
    synthetic_needles,
)


@pytest.fixture(scope="module")
def default_workload() -> Workload:
    return synthetic()


@pytest.fixture(scope="module")
def precise_workload() -> Workload:
    """The default workload with a precise indexer (a tenth of the default
    noise): the indexer's construction itself, not the knob's default."""
    return synthetic(index_noise=0.25)


def causal_probs(w: Workload, head: int, i: int) -> np.ndarray:
    """softmax over keys 0..=i of query head `head` at position i (float64)."""
    kv = head // w.group
    logits = (w.k[kv, : i + 1].astype(np.float64) @ w.q[head, i].astype(np.float64)) * w.scale
    p = np.exp(logits - logits.max())
    return p / p.sum()


def heads_of(w: Workload, kind: str) -> list:
    return [h for h in range(w.n_heads) if w.head_kinds[h // w.group] == kind]


def small_arrays(layers=2, heads=4, kv=2, tokens=16, d=8, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "q": rng.standard_normal((layers, heads, tokens, d)).astype(dtype),
        "k": rng.standard_normal((layers, kv, tokens, d)).astype(dtype),
        "v": rng.standard_normal((layers, kv, tokens, d + 2)).astype(dtype),
    }


def write(tmp_path, name="dump.npz", **arrays):
    path = tmp_path / name
    np.savez(path, **arrays)
    return path


# --- synthetic: shapes, determinism ---------------------------------------------


def test_synthetic_defaults_have_documented_shapes_and_dtypes(default_workload):
    w = default_workload
    assert w.q.shape == (8, 32768, 64) and w.k.shape == (4, 32768, 64)
    assert w.v.shape == (4, 32768, 64)
    assert w.index_q.shape == w.index_k.shape == (4, 32768, 16)
    for arr in (w.q, w.k, w.v, w.index_q, w.index_k):
        assert arr.dtype == np.float32 and arr.flags.c_contiguous
    assert w.head_kinds == HEAD_KINDS
    assert w.scale == pytest.approx(1 / 8)
    assert w.query_positions.dtype == np.int64 and w.query_positions.size == 24


def test_synthetic_is_deterministic_per_seed_and_differs_across_seeds():
    a, b = synthetic(context=2048, seed=3), synthetic(context=2048, seed=3)
    c = synthetic(context=2048, seed=4)
    for f in ("q", "k", "v", "index_q", "index_k", "query_positions"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
    assert not np.array_equal(a.k, c.k)
    assert not np.array_equal(a.query_positions, c.query_positions)


def test_synthetic_query_positions_cover_the_last_seven_eighths_and_end_at_the_last_token(
    default_workload,
):
    pos = default_workload.query_positions
    assert pos[0] >= 32768 // 8 and pos[-1] == 32767
    assert np.all(np.diff(pos) > 0)
    # stratified: one position per 1/24 of the range
    edges = 4096 + (np.arange(25) * (32768 - 4096)) // 24
    assert np.array_equal(np.searchsorted(edges, pos, side="right") - 1, np.arange(24))


def test_synthetic_gqa_groups_share_a_kv_head_and_kinds_cycle_over_kv_heads():
    w = synthetic(context=1024, n_heads=12, n_kv_heads=6, d=32, d_v=16, d_index=8)
    assert w.group == 2 and w.q.shape == (12, 1024, 32) and w.v.shape == (6, 1024, 16)
    assert w.index_q.shape == (6, 1024, 8)
    assert w.head_kinds == HEAD_KINDS + HEAD_KINDS[:2]


def test_synthetic_refuses_heads_that_do_not_group():
    with pytest.raises(WorkloadError, match="n_heads: 6 is not a multiple of n_kv_heads = 4"):
        synthetic(context=1024, n_heads=6)


def test_synthetic_refuses_an_odd_head_dimension_and_a_tiny_context():
    with pytest.raises(WorkloadError, match="d: expected an even"):
        synthetic(context=1024, d=33)
    with pytest.raises(WorkloadError, match="context: expected an int >= 64"):
        synthetic(context=32)


# --- synthetic: head character (plain NumPy attention) ---------------------------


def test_sink_heads_put_over_30_percent_of_mass_on_the_first_four_keys(default_workload):
    w = default_workload
    for h in heads_of(w, "sink"):
        for i in w.query_positions:
            assert causal_probs(w, h, int(i))[:4].sum() > 0.30, (h, i)


def test_local_heads_put_most_mass_in_the_last_256_keys(default_workload):
    w = default_workload
    for h in heads_of(w, "local"):
        for i in w.query_positions:
            assert causal_probs(w, h, int(i))[-256:].sum() > 0.5, (h, i)


def test_retrieval_heads_put_most_mass_on_needles_far_back(default_workload):
    w = default_workload
    for kv, kind in enumerate(w.head_kinds):
        if kind != "retrieval":
            continue
        needles = synthetic_needles(w.tokens, 0, kv)
        assert needles.max() < 0.75 * w.tokens  # > 25% of the context back from its end
        assert needles.min() < w.tokens // 8  # every evaluated query sees one
        for h in range(kv * w.group, (kv + 1) * w.group):
            for i in w.query_positions:
                p = causal_probs(w, h, int(i))
                assert p[needles[needles <= i]].sum() > 0.5, (h, i)
            # at the last query, the mass sits on average more than a quarter context back
            p = causal_probs(w, h, w.tokens - 1)
            mean_back = float(p @ (w.tokens - 1 - np.arange(w.tokens)))
            assert mean_back > 0.25 * w.tokens


def test_diffuse_heads_keep_the_top_percent_of_keys_under_10_percent_of_mass(
    default_workload,
):
    w = default_workload
    for h in heads_of(w, "diffuse"):
        for i in w.query_positions:
            p = np.sort(causal_probs(w, h, int(i)))
            top = max(1, int(0.01 * p.size))
            assert p[-top:].sum() < 0.10, (h, i)


def test_synthetic_indexer_is_8_bit_per_row(default_workload):
    w = default_workload
    for arr in (w.index_q, w.index_k):
        rows = arr.reshape(-1, arr.shape[-1])[::997]
        step = np.abs(rows).max(axis=1, keepdims=True) / 127
        np.testing.assert_allclose(rows / step, np.rint(rows / step), atol=1e-3)
        assert max(np.unique(r).size for r in rows) <= 255


def test_synthetic_indexer_top_k_agrees_with_the_true_top_k_partially_not_perfectly(
    precise_workload,
):
    w = precise_workload
    k = 16
    recalls = []
    for h in range(w.n_heads):
        kv = h // w.group
        for i in w.query_positions[::2]:
            i = int(i)
            true = w.k[kv, : i + 1] @ w.q[h, i]
            index = w.index_k[kv, : i + 1] @ w.index_q[kv, i]
            top_true = np.argpartition(-true, k)[:k]
            top_index = np.argpartition(-index, k)[:k]
            recalls.append(np.intersect1d(top_true, top_index).size / k)
    assert 0.2 < float(np.mean(recalls)) < 0.98


def test_synthetic_indexer_top_k_finds_most_attention_mass_of_structured_heads(
    precise_workload,
):
    w = precise_workload
    for h in range(w.n_heads):
        kv = h // w.group
        if w.head_kinds[kv] == "diffuse":
            continue
        mass = []
        for i in w.query_positions[::3]:
            i = int(i)
            index = w.index_k[kv, : i + 1] @ w.index_q[kv, i]
            mass.append(causal_probs(w, h, i)[np.argpartition(-index, 256)[:256]].sum())
        assert float(np.mean(mass)) > 0.6, (h, w.head_kinds[kv])


def test_index_noise_is_the_knob_the_learned_top_k_gets_worse_as_it_grows():
    """The DSA indexer's recall of the attention mass falls as index_noise
    grows, from near the oracle's (0.25) to visibly below it (the default)."""
    import kvselect as ks
    from kvselect import evaluate

    recall = {}
    for noise in (0.25, 2.0, 6.0):
        w = synthetic(context=4096, queries=8, index_noise=noise)
        pos = w.query_positions
        got, best = [], []
        for g in range(w.n_kv_heads):
            head = evaluate._prepare_head(w.head_inputs(g, pos), pos, w.scale)
            probs = head.probs.mean(axis=1)
            rows = ks.indexer_topk(**head.learned, query_pos=pos, topk=128)
            got.append(ks.attention_mass_recall_rows(rows, probs).mean())
            oracle = ks.oracle_topk(head.probs.sum(axis=1), pos, 128, width=128)
            best.append(ks.attention_mass_recall_rows(oracle, probs).mean())
        recall[noise] = (float(np.mean(got)), float(np.mean(best)))
    assert recall[0.25][0] > recall[2.0][0] > recall[6.0][0]
    gap = {noise: best - got for noise, (got, best) in recall.items()}
    assert gap[0.25] < 0.01 < gap[2.0] < gap[6.0], gap


def test_the_synthetic_dsa_indexer_stores_fp8_keys_with_per_key_scales(default_workload):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    ix = default_workload.indexer
    assert ix is not None and ix.key_format == "float8_e4m3fn" and ix.k.dtype == np.uint8
    assert ix.heads == 4 and ix.q.shape[:2] == (4, default_workload.tokens)
    # The bytes decode (ml_dtypes) to the projected keys within fp8's precision.
    decoded = ix.k.view(ml_dtypes.float8_e4m3fn).astype(np.float32) * ix.key_scale[..., None]
    from kvselect.workloads.indexer import projection

    k_p = default_workload.k @ projection(default_workload.d, ix.q.shape[3], 0)
    assert np.allclose(decoded, k_p, rtol=2**-3, atol=1e-4 * 448 / 448)


def test_fp8_rounding_equals_ml_dtypes_on_every_magnitude():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from kvselect.workloads import fp8_e4m3fn, fp8_e4m3fn_bytes

    rng = np.random.default_rng(4)
    x = (rng.standard_normal(100_000) * np.exp2(rng.uniform(-14, 10, 100_000))).astype(np.float32)
    x = np.concatenate([x, [0.0, -0.0, 448, -448, 2**-9, 2**-10, 3 * 2**-11, 2**-6]]).astype(np.float32)
    want = np.clip(x, -448, 448).astype(ml_dtypes.float8_e4m3fn)
    grid = fp8_e4m3fn(x)
    assert np.array_equal(grid.view(np.uint32), want.astype(np.float32).view(np.uint32))
    assert np.array_equal(fp8_e4m3fn_bytes(grid), want.view(np.uint8))


# --- shared rules -----------------------------------------------------------------


def test_query_positions_returns_the_whole_range_when_it_is_short():
    np.testing.assert_array_equal(query_positions(16, 64), np.arange(2, 16))
    pos = query_positions(100, 5, seed=1)
    assert pos.size == 5 and pos[-1] == 99 and pos[0] >= 12


def test_quantize_rows_uses_at_most_255_levels_and_keeps_zero_rows():
    x = np.random.default_rng(0).standard_normal((3, 1000)).astype(np.float32)
    x[1] = 0
    out = quantize_rows(x)
    assert out.dtype == np.float32 and np.all(out[1] == 0)
    assert np.unique(out[0]).size <= 255
    assert np.abs(out - x).max() <= np.abs(x).max() / 254 + 1e-6


def test_derive_indexer_is_deterministic_and_has_one_index_head_per_kv_head():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((6, 50, 32)).astype(np.float32)
    k = rng.standard_normal((2, 50, 32)).astype(np.float32)
    iq, ik = derive_indexer(q, k, n_kv_heads=2)
    assert iq.shape == ik.shape == (2, 50, 8)  # max(4, 32 // 4)
    assert iq.dtype == ik.dtype == np.float32 and iq.flags.c_contiguous
    iq2, ik2 = derive_indexer(q, k, n_kv_heads=2)
    np.testing.assert_array_equal(iq, iq2)
    np.testing.assert_array_equal(ik, ik2)
    iq3, _ = derive_indexer(q, k, n_kv_heads=2, seed=1)
    assert not np.array_equal(iq, iq3)
    assert derive_indexer(q[:, :, :8], k[:, :, :8], 2)[0].shape[-1] == 4  # the floor of 4
    assert derive_indexer(q, k, 2, d_index=12)[0].shape[-1] == 12


def test_derive_indexer_averages_the_query_heads_of_a_group_before_projecting():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((4, 10, 16)).astype(np.float32)
    k = rng.standard_normal((2, 10, 16)).astype(np.float32)
    mean = np.repeat(q.reshape(2, 2, 10, 16).mean(axis=1), 2, axis=0)
    np.testing.assert_array_equal(derive_indexer(q, k, 2)[0], derive_indexer(mean, k, 2)[0])


def test_derive_indexer_approximates_the_true_scores():
    rng = np.random.default_rng(2)
    q = rng.standard_normal((1, 400, 64)).astype(np.float32)
    k = rng.standard_normal((1, 400, 64)).astype(np.float32)
    iq, ik = derive_indexer(q, k, 1, d_index=32)
    true, approx = (k[0] @ q[0, -1]), (ik[0] @ iq[0, -1])
    assert 0.5 < np.corrcoef(true, approx)[0, 1] < 0.99


def test_derive_indexer_refuses_heads_that_do_not_group():
    with pytest.raises(WorkloadError, match="not a multiple"):
        derive_indexer(np.zeros((3, 4, 8)), np.zeros((2, 4, 8)), n_kv_heads=2)


# --- Workload validation ----------------------------------------------------------


def make(**over):
    rng = np.random.default_rng(0)
    f = dict(
        name="t",
        q=rng.standard_normal((4, 8, 6)).astype(np.float32),
        k=rng.standard_normal((2, 8, 6)).astype(np.float32),
        v=rng.standard_normal((2, 8, 5)).astype(np.float32),
        index_q=np.zeros((2, 8, 3), np.float32),
        index_k=np.zeros((2, 8, 3), np.float32),
        head_kinds=("a", "b"),
        query_positions=np.array([3, 7], dtype=np.int64),
        scale=0.5,
        source="test",
    )
    f.update(over)
    return Workload(**f)


def test_workload_accepts_a_valid_gqa_layout_and_reports_sizes():
    w = make()
    assert (w.n_heads, w.n_kv_heads, w.group, w.tokens, w.d, w.d_v, w.d_index) == (
        4,
        2,
        2,
        8,
        6,
        5,
        3,
    )


@pytest.mark.parametrize(
    "over, message",
    [
        (dict(q=np.zeros((3, 8, 6), np.float32)), "q: n_heads = 3 is not a multiple"),
        (dict(k=np.zeros((2, 8, 6), np.float64)), "k: expected dtype float32"),
        (dict(v=np.zeros((2, 7, 5), np.float32)), "v: expected shape"),
        (dict(index_k=np.zeros((2, 8, 4), np.float32)), "index_k: expected shape"),
        (dict(index_q=np.zeros((4, 8, 3), np.float32)), "index_q: expected shape"),
        (dict(q=np.zeros((4, 6, 8), np.float32).transpose(0, 2, 1)), "C-contiguous"),
        (dict(head_kinds=("a",)), "head_kinds: expected one label per KV head"),
        (dict(query_positions=np.array([7, 3])), "strictly increasing"),
        (dict(query_positions=np.array([8])), r"in \[0, 8\)"),
        (dict(query_positions=np.array([1, 2], dtype=np.int32)), "int64"),
        (dict(scale=float("nan")), "scale: expected a finite positive"),
        (dict(source="two\nlines"), "source"),
    ],
)
def test_workload_refuses_broken_fields_with_a_message_naming_the_field(over, message):
    with pytest.raises(WorkloadError, match=message):
        make(**over)


# --- load_npz: the documented format ----------------------------------------------


def test_load_npz_flattens_layers_into_heads_and_keeps_gqa_groups_within_a_layer(tmp_path):
    arrays = small_arrays(layers=2, heads=4, kv=2)
    w = load_npz(write(tmp_path, **arrays), queries=5)
    assert w.q.shape == (8, 16, 8) and w.k.shape == (4, 16, 8) and w.v.shape == (4, 16, 10)
    assert w.head_kinds == ("L0/H0", "L0/H1", "L1/H0", "L1/H1")
    # query head 5 = layer 1, head 1 -> kv head 1 * 2 + 1 // 2 = 2 = layer 1, kv head 0
    np.testing.assert_array_equal(w.q[5], arrays["q"][1, 1])
    np.testing.assert_array_equal(w.k[5 // w.group], arrays["k"][1, 0])
    assert w.scale == pytest.approx(1 / np.sqrt(8))
    assert w.query_positions[-1] == 15 and w.query_positions.size == 5
    iq, ik = derive_indexer(w.q, w.k, 4)
    np.testing.assert_array_equal(w.index_q, iq)
    np.testing.assert_array_equal(w.index_k, ik)


def test_load_npz_uses_a_dumped_indexer_scale_and_ids_and_selects_layers(tmp_path):
    arrays = small_arrays(layers=3, heads=2, kv=1, dtype=np.float16)
    rng = np.random.default_rng(5)
    arrays["index_q"] = rng.standard_normal((3, 1, 16, 4)).astype(np.float16)
    arrays["index_k"] = rng.standard_normal((3, 1, 16, 4)).astype(np.float16)
    arrays["scale"] = np.float64(0.125)
    arrays["layer_ids"] = np.array([4, 9, 11])
    arrays["kv_head_ids"] = np.array([[0], [0], [3]])
    w = load_npz(write(tmp_path, **arrays), layers=[2, 0])
    assert w.head_kinds == ("L11/H3", "L4/H0") and w.scale == 0.125
    np.testing.assert_array_equal(w.index_q[0], arrays["index_q"][2, 0].astype(np.float32))
    np.testing.assert_array_equal(w.q[3], arrays["q"][0, 1].astype(np.float32))
    assert w.q.dtype == np.float32
    assert load_npz(write(tmp_path, "b.npz", **arrays), layers=1).head_kinds == ("L9/H0",)


def test_load_npz_reads_compressed_archives_and_float64(tmp_path):
    path = tmp_path / "c.npz"
    np.savez_compressed(path, **small_arrays(dtype=np.float64))
    assert load_npz(path).q.dtype == np.float32


def test_load_npz_samples_all_positions_when_the_dump_is_short(tmp_path):
    w = load_npz(write(tmp_path, **small_arrays(tokens=10)), queries=64)
    np.testing.assert_array_equal(w.query_positions, np.arange(1, 10))


def test_load_npz_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such workload file: .*nope.npz"):
        load_npz(tmp_path / "nope.npz")


def test_load_npz_refuses_a_file_that_is_not_an_npz(tmp_path):
    text = tmp_path / "x.npz"
    text.write_text("hello")
    with pytest.raises(WorkloadError, match="not a NumPy .npz archive"):
        load_npz(text)
    single = tmp_path / "y.npy"
    np.save(single, np.zeros(3))
    with pytest.raises(WorkloadError, match="single array"):
        load_npz(single)


def test_load_npz_refuses_missing_required_keys(tmp_path):
    arrays = small_arrays()
    del arrays["v"]
    with pytest.raises(WorkloadError, match=r"missing required key\(s\) \['v'\]"):
        load_npz(write(tmp_path, **arrays))


def test_load_npz_refuses_unknown_keys_and_lists_the_allowed_ones(tmp_path):
    with pytest.raises(
        WorkloadError, match=r"unknown key 'Q' in a workload dump \(did you mean 'q'\?\); the known keys are"
    ):
        load_npz(write(tmp_path, Q=np.zeros(1), **small_arrays()))


def test_load_npz_refuses_one_indexer_half(tmp_path):
    arrays = small_arrays()
    arrays["index_q"] = np.zeros((2, 2, 16, 4), np.float32)
    with pytest.raises(WorkloadError, match="index_k: missing; index_q is present"):
        load_npz(write(tmp_path, **arrays))


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("q", np.zeros((2, 4, 16), np.float32), r"q: expected 4 dimensions .*got shape \(2, 4, 16\)"),
        ("k", np.zeros((3, 2, 16, 8), np.float32), r"k: expected 2 layers"),
        ("k", np.zeros((2, 2, 15, 8), np.float32), r"k: expected shape \[2, n_kv_heads, 16, 8\]"),
        ("k", np.zeros((2, 2, 16, 7), np.float32), r"k: expected shape"),
        ("v", np.zeros((2, 2, 12, 10), np.float32), r"v: expected shape \[2, 2, 16, d_v\]"),
        ("q", np.zeros((2, 4, 16, 8), np.int32), "q: expected dtype float16, float32 or float64, got int32"),
        ("v", np.zeros((2, 2, 16, 10), np.complex64), "v: expected dtype float16"),
    ],
)
def test_load_npz_refuses_arrays_that_break_the_format(tmp_path, key, value, message):
    arrays = small_arrays()
    arrays[key] = value
    with pytest.raises(WorkloadError, match=message):
        load_npz(write(tmp_path, **arrays))


def test_load_npz_refuses_query_heads_that_do_not_group_over_kv_heads(tmp_path):
    arrays = small_arrays(heads=4, kv=3)
    with pytest.raises(WorkloadError, match=r"n_heads = 4 .* not a multiple of n_kv_heads = 3"):
        load_npz(write(tmp_path, **arrays))


def test_load_npz_refuses_fewer_than_two_tokens(tmp_path):
    with pytest.raises(WorkloadError, match="q: expected at least 2 tokens"):
        load_npz(write(tmp_path, **small_arrays(tokens=1)))


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_load_npz_refuses_non_finite_values_naming_the_key(tmp_path, bad):
    arrays = small_arrays()
    arrays["k"][1, 0, 3, 2] = bad
    with pytest.raises(WorkloadError, match="k: expected finite values"):
        load_npz(write(tmp_path, **arrays))


def test_load_npz_refuses_float64_values_beyond_float32(tmp_path):
    arrays = small_arrays(dtype=np.float64)
    arrays["v"][0, 0, 0, 0] = 1e300
    with pytest.raises(WorkloadError, match="v: expected finite values"):
        load_npz(write(tmp_path, **arrays))


def test_load_npz_refuses_bad_layer_choices(tmp_path):
    path = write(tmp_path, **small_arrays())
    with pytest.raises(WorkloadError, match=r"layer 2 is out of range \[0, 2\)"):
        load_npz(path, layers=[2])
    with pytest.raises(WorkloadError, match="distinct"):
        load_npz(path, layers=[0, 0])


def test_load_npz_refuses_a_bad_scale_and_misshapen_ids(tmp_path):
    with pytest.raises(WorkloadError, match="scale: expected one finite positive"):
        load_npz(write(tmp_path, scale=np.float64(-1), **small_arrays()))
    with pytest.raises(WorkloadError, match=r"layer_ids: expected shape \(2,\)"):
        load_npz(write(tmp_path, "b.npz", layer_ids=np.arange(3), **small_arrays()))


# --- the shipped example ----------------------------------------------------------


def test_example_is_minilm_float16_in_the_documented_format():
    path = resources.files("kvselect").joinpath("data").joinpath("minilm_example.npz")
    with resources.as_file(path) as p:
        z = np.load(p)
        assert z["q"].dtype == z["k"].dtype == z["v"].dtype == np.float16
        assert z["q"].shape == (3, 3, 512, 32)
        assert p.stat().st_size < 1_000_000
    w = example()
    assert w.name == "minilm-example" and "float16" in w.source and "MiniLM" in w.source
    assert w.q.shape == w.k.shape == w.v.shape == (9, 512, 32) and w.group == 1
    assert w.head_kinds[:3] == ("L1/H11", "L1/H2", "L1/H10")
    assert w.index_q.shape == (9, 512, 8)
    assert w.scale == pytest.approx(32**-0.5)
    assert w.query_positions[-1] == 511 and w.query_positions[0] >= 64


def test_example_heads_show_the_character_they_were_picked_for():
    w = example()
    mean = lambda h, f: np.mean([f(causal_probs(w, h, int(i)), int(i)) for i in w.query_positions])  # noqa: E731
    sink = mean(0, lambda p, i: p[0])  # L1/H11: picked for mass on [CLS]
    local = mean(1, lambda p, i: p[-16:].sum())  # L1/H2: the last 16 keys
    assert sink > 0.2 and local > 0.7
    assert mean(5, lambda p, i: p[0]) < 0.05  # L3/H11, the diffuse pick, has no sink


def test_every_synthetic_workload_and_the_example_pass_workload_validation_again():
    # A Workload rebuilt from its own fields is valid (nothing was bypassed)
    # and equal to the original field by field; the same fields with one
    # broken (keys of another length, float64 queries) are refused by name.
    from kvselect.workloads import WorkloadError

    for w in (synthetic(context=256, queries=4), example(queries=4)):
        fields = {f: getattr(w, f) for f in w.__dataclass_fields__}
        again = Workload(**fields)
        for f, value in fields.items():
            got = getattr(again, f)
            if isinstance(value, np.ndarray):
                assert got.dtype == value.dtype and np.array_equal(got, value, equal_nan=True), f
            elif f != "indexer":
                assert got == value, f
        with pytest.raises(WorkloadError, match="^k: expected shape"):
            Workload(**{**fields, "k": np.ascontiguousarray(w.k[:, :-1])})
        with pytest.raises(WorkloadError, match="^q: expected dtype float32"):
            Workload(**{**fields, "q": w.q.astype(np.float64)})


# --- dumps in the user's terms: transposed layouts, files that are not archives ---


def test_load_npz_warns_on_a_dump_with_fewer_tokens_than_heads(tmp_path):
    """[layers, tokens, heads, d] saved by mistake: 64 tokens of 4 heads read
    as 64 heads of 4 tokens."""
    from kvselect.workloads import WorkloadWarning

    rng = np.random.default_rng(0)
    arrays = {key: rng.standard_normal((1, 64, 4, 8)).astype(np.float32) for key in "qkv"}
    with pytest.warns(WorkloadWarning, match=r"64 query heads \(axis 1\) of 4 tokens"):
        w = load_npz(write(tmp_path, **arrays))
    assert w.n_heads == 64 and w.tokens == 4  # loaded as written, with the warning


def test_load_npz_does_not_warn_on_the_documented_layout(tmp_path, recwarn):
    load_npz(write(tmp_path, **small_arrays()))
    assert not [w for w in recwarn if "heads" in str(w.message)]


def test_load_npz_words_a_transposed_gqa_dump_in_layers_heads_and_tokens(tmp_path):
    rng = np.random.default_rng(0)
    arrays = dict(
        q=rng.standard_normal((2, 32, 8, 4)).astype(np.float32),
        k=rng.standard_normal((2, 32, 2, 4)).astype(np.float32),
        v=rng.standard_normal((2, 32, 2, 4)).astype(np.float32),
    )
    with pytest.raises(WorkloadError) as info:
        load_npz(write(tmp_path, **arrays))
    text = str(info.value)
    assert "k has 2 tokens where q has 8" in text
    assert "q reads as 32 query heads of 8 tokens" in text
    assert "[layers, tokens, heads, dim]" in text


@pytest.mark.parametrize("content", [b"", b"q,k,v\n1,2,3\n", b"\x80\x04K\x01."])
def test_load_npz_calls_a_non_archive_what_it_is_and_never_suggests_pickle(tmp_path, content):
    path = tmp_path / "x.npz"
    path.write_bytes(content)  # empty, text, and a real pickle
    with pytest.raises(WorkloadError, match="not a NumPy .npz archive") as info:
        load_npz(path)
    assert "pickle" not in str(info.value).lower()


def test_load_npz_refuses_an_object_array_without_mentioning_pickle(tmp_path):
    arrays = small_arrays()
    arrays["v"] = np.array([None, 1.0], dtype=object)
    with pytest.raises(WorkloadError, match="v: holds Python objects") as info:
        load_npz(write(tmp_path, **arrays))
    assert "pickle" not in str(info.value).lower()
