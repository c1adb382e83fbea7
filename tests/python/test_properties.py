"""Property tests (Hypothesis) of the public functions that the other suites
do not already drive through Hypothesis, each against the plain-NumPy oracle
``kvselect.reference`` where it has the function, plus contract properties.

Already covered elsewhere by Hypothesis (not repeated here):
``scatter_topology_witnesses``, ``apply_topology_witnesses``,
``topology_witness_indices`` (test_witness_native.py), ``block_sparse_select``
and ``positions_of_blocks`` (test_block_sparse.py), the set semantics of a
sparse selection row (test_attention.py).

Comparisons (never loosened to make a case pass):

- integer outputs (segments, nulls, selections, selector and oracle rows):
  exactly equal, dtype int32;
- metrics: exactly equal where the arithmetic is exact (integer-valued data,
  a single correctly rounded division), else within 1e-12 of
  ``max(1, |reference|)``; NaN must meet NaN and +-inf the same infinity;
- probabilities (float64 on both sides): within 1e-12 absolute;
- attention outputs (float32 native vs float64 reference): per row
  ``||o - o_ref|| <= 1e-5 ||o_ref|| + 1e-30``, ``lse`` within 1e-5
  absolute-or-relative, ``empty_rows`` exact, empty rows exactly zeros and
  ``-inf``. The data are small multiples of 1/2 and values of one sign per
  column, so every row is well conditioned.

Every test is derandomized under the default profile (tests/python/conftest.py):
a failure reproduces on the next run; KVSELECT_HYPOTHESIS=explore randomizes."""

import math
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import kvselect as ks
from kvselect import reference as ref

U64_MAX = 2**64 - 1
I32_MAX = 2**31 - 1
METRIC_TOL = 1e-12
PROB_TOL = 1e-12
OUT_RTOL = 1e-5
LSE_TOL = 1e-5
TINY = 1e-30


def _hyp(n):
    # derandomize / health checks come from the profile (tests/python/conftest.py).
    return settings(max_examples=n, deadline=None)


CHEAP = _hyp(200)  # scalar calls and tiny arrays
MEDIUM = _hyp(100)  # small arrays, a reference loop in Python
HEAVY = _hyp(50)  # attention problems


# ---------------------------------------------------------------------------
# Shared comparisons and strategies
# ---------------------------------------------------------------------------


def assert_same_ints(native, want, what=""):
    assert isinstance(native, np.ndarray) and native.dtype == np.int32, (what, native)
    assert native.shape == want.shape, (what, native.shape, want.shape)
    assert np.array_equal(native, want), (what, native.tolist(), want.tolist())


def assert_metric_close(a, b, what=""):
    """Equal NaN pattern, equal infinities, finite values within 1e-12 of
    ``max(1, |b|)``."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, (what, a.shape, b.shape)
    assert np.array_equal(np.isnan(a), np.isnan(b)), (what, a, b)
    inf = np.isinf(b)
    assert np.array_equal(np.isinf(a), inf), (what, a, b)
    assert np.all(a[inf] == b[inf]), (what, a, b)
    fin = np.isfinite(b)
    err = np.abs(a[fin] - b[fin])
    assert np.all(err <= METRIC_TOL * np.maximum(1.0, np.abs(b[fin]))), (what, err.max(initial=0))


def assert_metric_equal(a, b, what=""):
    """Bit-equal values, NaN meeting NaN."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, (what, a.shape, b.shape)
    assert np.array_equal(a, b, equal_nan=True), (what, a, b)


def assert_output_close(out, lse, ref_out, ref_lse, what=""):
    assert out.dtype == np.float32 and lse.dtype == np.float32, what
    assert out.shape == ref_out.shape and lse.shape == ref_lse.shape, what
    empty = np.isneginf(ref_lse)
    assert np.array_equal(np.isneginf(lse), empty), f"{what}: -inf lse differs"
    assert np.all(out[empty] == 0.0), f"{what}: an empty row is not zeros"
    assert np.all(np.isfinite(out)) and not np.any(np.isnan(lse)), what
    err = np.linalg.norm(out.astype(np.float64) - ref_out, axis=-1)
    bound = OUT_RTOL * np.linalg.norm(ref_out, axis=-1) + TINY
    assert np.all(err <= bound), (what, err[err > bound], bound[err > bound])
    fin = ~empty
    lerr = np.abs(lse[fin].astype(np.float64) - ref_lse[fin])
    assert np.all(lerr <= LSE_TOL * np.maximum(1.0, np.abs(ref_lse[fin]))), (what, lerr.max(initial=0))


# A u64-ish count: small values (the interesting arithmetic), the edges of
# the integer widths, and anything in between.
_EDGES = [0, 1, 2, 3, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**53, 2**63 - 1, 2**63, U64_MAX - 1, U64_MAX]
u64s = st.one_of(
    st.integers(0, 20),
    st.sampled_from(_EDGES),
    st.integers(0, 2**40),
    st.integers(0, U64_MAX),
)

seeds = st.one_of(st.integers(0, 100), st.sampled_from([2**32, 2**63, U64_MAX]), st.integers(0, U64_MAX))


def index_rows(rows, width, hi):
    """int32 ``[rows, width]`` candidate rows: padding (any negative), valid
    tokens, repeats, tokens past ``hi`` and the int32 extremes."""
    elem = st.one_of(
        st.integers(-3, hi + 3),
        st.sampled_from([-(2**31), -1, I32_MAX]),
    )
    return hnp.arrays(np.int32, (rows, width), elements=elem)


# ---------------------------------------------------------------------------
# segment_of
# ---------------------------------------------------------------------------


@CHEAP
@given(token=u64s, context_len=u64s, num_segments=u64s)
def test_segment_of_equals_the_reference_over_the_whole_u64_range(token, context_len, num_segments):
    got = ks.segment_of(token, context_len, num_segments)
    assert type(got) is int
    assert got == ref.segment_of(token, context_len, num_segments)
    # The contract: σ itself, never clamped. It never exceeds the token, and a
    # token inside the context lands in one of the S_eff segments (0 when S is 0).
    assert 0 <= got <= token
    length = max(context_len, 1)
    if token < length:
        assert got < max(min(num_segments, length), 1)


@CHEAP
@given(t1=u64s, t2=u64s, context_len=u64s, num_segments=u64s)
def test_segment_of_never_decreases_as_the_token_grows(t1, t2, context_len, num_segments):
    lo, hi = sorted((t1, t2))
    assert ks.segment_of(lo, context_len, num_segments) <= ks.segment_of(hi, context_len, num_segments)


@CHEAP
@given(context_len=st.integers(1, 10_000), num_segments=st.integers(1, 200), data=st.data())
def test_segment_of_a_token_inside_the_context_is_its_partition_cell(context_len, num_segments, data):
    """For ``x < L``, the segment is ``floor(x * S_eff / L)`` and the segment's
    left edge ``ceil(s * L / S_eff)`` is at or before ``x``."""
    x = data.draw(st.integers(0, context_len - 1))
    s_eff = min(num_segments, context_len)
    s = ks.segment_of(x, context_len, num_segments)
    assert s == x * s_eff // context_len < s_eff
    assert -(-s * context_len // s_eff) <= x


# ---------------------------------------------------------------------------
# random_null and locality_null
# ---------------------------------------------------------------------------


@CHEAP
@given(
    context_len=st.one_of(st.integers(0, 300), st.sampled_from([I32_MAX]), st.integers(0, I32_MAX)),
    budget=st.integers(0, 400),
    seed=seeds,
)
def test_the_random_null_draws_min_budget_length_distinct_ascending_tokens_per_seed(context_len, budget, seed):
    got = ks.random_null(context_len, budget, seed)
    assert isinstance(got, np.ndarray) and got.dtype == np.int32 and got.ndim == 1
    assert len(got) == min(budget, context_len)
    assert np.all(np.diff(got.astype(np.int64)) > 0)  # ascending, hence distinct
    assert np.all((got >= 0) & (got < context_len))
    if budget >= context_len:
        assert got.tolist() == list(range(context_len))
    # Deterministic per seed, and the last row of the random selector.
    assert np.array_equal(ks.random_null(context_len, budget, seed), got)
    if context_len >= 1:
        assert_same_ints(got, ks.Selector.random(budget, seed).row(context_len - 1), "selector row")


@st.composite
def _length_and_budget(draw):
    """Any length with a small budget, or a small length with any budget
    (the output has ``min(budget, L)`` entries, so one side stays small)."""
    if draw(st.booleans()):
        return draw(st.integers(0, I32_MAX) | st.integers(0, 50)), draw(st.integers(0, 300))
    return draw(st.integers(0, 300)), draw(u64s)


@CHEAP
@given(_length_and_budget())
def test_the_locality_null_equals_the_reference_and_the_local_selector(problem):
    context_len, budget = problem
    got = ks.locality_null(context_len, budget)
    assert_same_ints(got, ref.locality_null(context_len, budget), "locality_null")
    if context_len >= 1 and budget <= I32_MAX:
        assert_same_ints(got, ks.Selector.local(budget).row(context_len - 1), "local row")


# ---------------------------------------------------------------------------
# segment_coverage and attention_mass_recall (scalar)
# ---------------------------------------------------------------------------


@st.composite
def _coverage_problem(draw):
    context_len = draw(st.one_of(st.integers(0, 64), st.integers(0, 2**32), st.sampled_from([I32_MAX, 2**32])))
    num_segments = draw(st.one_of(st.integers(0, 80), u64s))
    hi = min(context_len, 10_000)
    n = draw(st.integers(0, 40))
    cands = draw(index_rows(1, n, hi))[0]
    return cands, context_len, num_segments


@CHEAP
@given(_coverage_problem())
def test_segment_coverage_equals_the_reference_and_is_a_share_of_segments(problem):
    cands, context_len, num_segments = problem
    got = ks.segment_coverage(cands, context_len, num_segments)
    want = ref.segment_coverage(cands, context_len, num_segments)
    assert type(got) is float
    assert_metric_equal(got, want, problem)  # a count over S_eff: one rounding
    assert 0.0 <= got <= 1.0
    # Order, duplicates and padding do not matter.
    shuffled = np.concatenate([cands[::-1], cands, np.full(3, -1, np.int32)])
    assert ks.segment_coverage(shuffled, context_len, num_segments) == got


@CHEAP
@given(
    weights=hnp.arrays(np.float64, st.integers(0, 40), elements=st.integers(0, 4).map(float)),
    data=st.data(),
)
def test_attention_mass_recall_equals_the_reference_nan_meeting_nan(weights, data):
    """Integer-valued weights make every sum exact, so the shares must be
    bit-equal; a row without mass is NaN on both sides."""
    cands = data.draw(index_rows(1, data.draw(st.integers(0, 40)), len(weights)))[0]
    got = ks.attention_mass_recall(cands, weights)
    want = ref.attention_mass_recall(cands, weights)
    assert type(got) is float
    assert_metric_equal(got, want, (cands, weights))
    if weights.sum() == 0:
        assert math.isnan(got)
    else:
        assert 0.0 <= got <= 1.0


@CHEAP
@given(
    weights=hnp.arrays(np.float64, st.integers(1, 60), elements=st.floats(0, 1, allow_subnormal=False)),
    data=st.data(),
)
def test_attention_mass_recall_of_real_weights_is_within_rounding_of_the_reference(weights, data):
    cands = data.draw(index_rows(1, data.draw(st.integers(0, 60)), len(weights)))[0]
    assert_metric_close(ks.attention_mass_recall(cands, weights), ref.attention_mass_recall(cands, weights), cands)
    # Every visible key selected: all the mass (or NaN without mass).
    full = ks.attention_mass_recall(np.arange(len(weights), dtype=np.int32), weights)
    assert math.isnan(full) if weights.sum() == 0 else abs(full - 1.0) <= METRIC_TOL


# ---------------------------------------------------------------------------
# BlockSparseConfig
# ---------------------------------------------------------------------------

_field = st.one_of(st.integers(0, 8), st.sampled_from([0, 1, I32_MAX]), st.integers(0, I32_MAX))


@CHEAP
@given(
    block_size=st.one_of(st.integers(1, 256), st.sampled_from([1, I32_MAX]), st.integers(1, I32_MAX)),
    top=_field,
    init=_field,
    local=_field,
)
def test_a_valid_block_sparse_config_builds_with_width_max_of_top_and_forced(block_size, top, init, local):
    if top == init == local == 0:
        local = 1  # the one refused combination of in-range fields
    cfg = ks.BlockSparseConfig(block_size, top, init, local)
    assert (cfg.block_size, cfg.top_blocks, cfg.init_blocks, cfg.local_blocks) == (block_size, top, init, local)
    assert cfg.width == max(top, init + local)
    twin = ks.BlockSparseConfig(block_size=block_size, top_blocks=top, init_blocks=init, local_blocks=local)
    assert cfg == twin and hash(cfg) == hash(twin)
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    other = ks.BlockSparseConfig(block_size, top + 1 if top < I32_MAX else top - 1, init, local)
    assert other != cfg


_NAMES = ["block_size", "top_blocks", "init_blocks", "local_blocks"]


@st.composite
def _invalid_config(draw):
    """One fault in an otherwise valid config, and the argument it names."""
    args = [draw(st.integers(1, 300)), draw(st.integers(1, 40)), draw(st.integers(0, 4)), draw(st.integers(0, 4))]
    kind = draw(st.sampled_from(["negative", "huge", "zero_block", "selects_nothing"]))
    if kind == "zero_block":
        args[0] = 0
        return args, "block_size"
    if kind == "selects_nothing":
        args[1:] = [0, 0, 0]
        return args, "top_blocks"
    i = draw(st.integers(0, 3))
    if kind == "negative":
        args[i] = draw(st.integers(-(2**70), -1) | st.sampled_from([-1, -(2**31), -(2**63)]))
    else:
        args[i] = draw(st.integers(2**31, 2**70) | st.sampled_from([2**31, 2**32, 2**63, U64_MAX, 2**64]))
    return args, _NAMES[i]


@CHEAP
@given(_invalid_config())
def test_an_invalid_block_sparse_config_raises_a_selection_error_naming_its_field(problem):
    args, argument = problem
    with pytest.raises(ks.SelectionError) as info:
        ks.BlockSparseConfig(*args)
    assert isinstance(info.value, ValueError)
    assert info.value.argument == argument, (args, info.value.argument, str(info.value))


# ---------------------------------------------------------------------------
# block_sparse_select_packed
# ---------------------------------------------------------------------------


@st.composite
def _packed_problem(draw):
    bs = draw(st.sampled_from([1, 2, 3, 5, 7, 16]))
    top = draw(st.integers(0, 6))
    init = draw(st.integers(0, 3))
    local = draw(st.integers(0 if (top or init) else 1, 3))
    cfg = ks.BlockSparseConfig(bs, top, init, local)
    lens = draw(st.lists(st.integers(0, 50), min_size=1, max_size=4))
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    d = draw(st.integers(1, 9))
    h = draw(st.integers(1, 4))
    n_q = draw(st.integers(0, 8))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    zeros = draw(st.sampled_from([0.0, 0.5, 1.0]))  # a share of zero keys: ties
    k = (rng.integers(-3, 4, (int(cu[-1]), d)) * (rng.random((int(cu[-1]), 1)) >= zeros)).astype(np.float32)
    q = rng.integers(-3, 4, (n_q, h, d)).astype(np.float32)
    sid = np.array([draw(st.integers(0, len(lens) - 1)) for _ in range(n_q)], dtype=np.int32)
    pos = np.array([draw(st.integers(0, lens[s] + 2 * bs + 2)) for s in sid], dtype=np.int32)
    return cfg, q, k, cu, sid, pos


@MEDIUM
@given(_packed_problem())
def test_packed_selection_equals_the_reference_and_the_per_sequence_calls(problem):
    cfg, q, k, cu, sid, pos = problem
    got = ks.block_sparse_select_packed(q, k, cu, sid, pos, cfg)
    want = ref.block_sparse_select_packed(q, k, cu, sid, pos, cfg)
    assert_same_ints(got, want, "packed vs reference")
    assert got.shape == (q.shape[0], q.shape[1], cfg.width)
    for i, s in enumerate(sid):
        alone = ks.block_sparse_select(q[i], k[cu[s] : cu[s + 1]], int(pos[i]), cfg)
        assert_same_ints(got[i], alone, f"query {i} of sequence {s}")


# ---------------------------------------------------------------------------
# Selector rows
# ---------------------------------------------------------------------------

positions = st.lists(st.integers(0, 2000) | st.integers(0, 40), max_size=10).map(lambda p: np.array(p, dtype=np.int64))


@MEDIUM
@given(
    pos=positions,
    window=st.integers(0, 60),
    sinks=st.integers(0, 20),
    extra=st.none() | st.integers(0, 5),
)
def test_dense_local_and_sink_window_rows_equal_the_reference_at_any_sufficient_width(pos, window, sinks, extra):
    cases = [
        (ks.Selector.dense(), lambda w: ref.dense_rows(pos, w)),
        (ks.Selector.local(window), lambda w: ref.local_rows(pos, window, w)),
        (ks.Selector.sink_window(sinks, window), lambda w: ref.sink_window_rows(pos, sinks, window, w)),
    ]
    for sel, want_of in cases:
        natural = want_of(None)
        width = None if extra is None else natural.shape[1] + extra
        assert_same_ints(sel.rows(pos, width), want_of(width), repr(sel))
        assert_same_ints(sel.rows(pos), natural, repr(sel))
        for p, row in zip(pos, natural):
            assert_same_ints(sel.row(int(p)), row[row >= 0], f"{sel!r}.row({p})")
        if natural.shape[1] > 0:
            with pytest.raises(ks.SelectionError) as e:
                sel.rows(pos, natural.shape[1] - 1)
            assert e.value.argument == "width", str(e.value)


@MEDIUM
@given(
    pos=positions,
    budget=st.integers(0, 80),
    seed=seeds,
    extra=st.none() | st.integers(0, 5),
)
def test_random_selector_rows_are_distinct_causal_ascending_within_budget_and_equal_row(pos, budget, seed, extra):
    sel = ks.Selector.random(budget, seed)
    need = int(np.minimum(pos + 1, budget).max(initial=0))
    width = None if extra is None else need + extra
    rows = sel.rows(pos, width)
    assert rows.dtype == np.int32 and rows.shape == (len(pos), need if width is None else width)
    for p, row in zip(pos, rows):
        got = row[row >= 0]
        assert np.all(row[len(got) :] == -1)  # the valid entries first, then -1
        assert len(got) == min(budget, p + 1)  # spends the budget when it can
        assert np.all(np.diff(got) > 0)  # ascending, hence distinct
        assert np.all((got >= 0) & (got <= p))  # causal
        assert_same_ints(got, sel.row(int(p)), f"row({p})")
    if need > 0:
        with pytest.raises(ks.SelectionError) as e:
            sel.rows(pos, need - 1)
        assert e.value.argument == "width", str(e.value)
    assert sel == ks.Selector.random(budget, seed) and hash(sel) == hash(ks.Selector.random(budget, seed))


# ---------------------------------------------------------------------------
# oracle_topk
# ---------------------------------------------------------------------------

_WEIGHTS = st.sampled_from([0.0, -0.0, 1.0, 2.0, 3.0, -1.0, np.nan, np.inf, -np.inf])


@st.composite
def _oracle_problem(draw):
    n = draw(st.integers(0, 6))
    row_len = draw(st.integers(0, 30))
    a = draw(hnp.arrays(np.float64, (n, row_len), elements=st.integers(0, 3).map(float) | _WEIGHTS))
    pos = np.array([draw(st.integers(0, row_len + 3)) for _ in range(n)], dtype=np.int64)
    budget = draw(st.integers(0, row_len + 2))
    return a, pos, budget


@MEDIUM
@given(_oracle_problem(), st.none() | st.integers(0, 4))
def test_oracle_topk_equals_the_reference_on_tied_integer_weights(problem, extra):
    a, pos, budget = problem
    natural = ref.oracle_topk(a, pos, budget)
    assert_same_ints(ks.oracle_topk(a, pos, budget), natural, "default width")
    width = None if extra is None else natural.shape[1] + extra
    got = ks.oracle_topk(a, pos, budget, width=width)
    assert_same_ints(got, ref.oracle_topk(a, pos, budget, width=width), f"width={width}")
    for p, row in zip(pos, got):
        ids = row[row >= 0]
        assert len(ids) == min(budget, p + 1, a.shape[1])
        assert np.all(np.diff(ids) > 0) and np.all(ids <= p)
    if natural.shape[1] > 0:
        with pytest.raises(ks.SelectionError) as e:
            ks.oracle_topk(a, pos, budget, width=natural.shape[1] - 1)
        assert e.value.argument == "width", str(e.value)


# ---------------------------------------------------------------------------
# Attention: probabilities, dense and sparse passes
# ---------------------------------------------------------------------------

_halves = st.integers(-4, 4).map(lambda x: x / 2.0)  # small multiples of 1/2


@st.composite
def _attention_problem(draw):
    n = draw(st.integers(1, 5))
    hkv = draw(st.integers(1, 3))
    group = draw(st.integers(1, 3))
    dk = draw(st.integers(1, 8))
    dv = draw(st.integers(1, 8))
    nk = draw(st.integers(0, 40))
    q = draw(hnp.arrays(np.float32, (n, hkv * group, dk), elements=_halves))
    k = draw(hnp.arrays(np.float32, (nk, hkv, dk), elements=_halves))
    # Values of one sign per column with magnitude 1..4: no cancellation.
    sign = np.array(draw(st.lists(st.sampled_from([-1.0, 1.0]), min_size=dv, max_size=dv)))
    mag = draw(hnp.arrays(np.float32, (nk, hkv, dv), elements=st.integers(1, 4).map(float)))
    v = (mag * sign).astype(np.float32)
    pos = np.array([draw(st.integers(0, nk + 5)) for _ in range(n)], dtype=np.int64)
    scale = draw(st.none() | st.sampled_from([0.25, 0.5, 1.0]) | st.floats(0.05, 1.0))
    return q, k, v, pos, scale


@HEAVY
@given(_attention_problem())
def test_attention_probabilities_equal_the_reference_within_1e_12(problem):
    q, k, _, pos, scale = problem
    got = ks.attention_probabilities(q, k, pos, scale=scale)
    want = ref.attention_probabilities(q, k, pos, scale=scale)
    assert got.dtype == np.float64 and got.shape == want.shape == (q.shape[0], q.shape[1], k.shape[0])
    assert np.all(np.abs(got - want) <= PROB_TOL), np.abs(got - want).max()
    # Causal rows: zero after the query, summing to one when a key is visible.
    visible = np.minimum(pos + 1, k.shape[0])
    for i, vis in enumerate(visible):
        assert np.all(got[i, :, vis:] == 0.0)
        assert np.all(np.abs(got[i].sum(axis=-1) - (1.0 if vis else 0.0)) <= 1e-12)


@HEAVY
@given(_attention_problem())
def test_dense_attention_equals_the_reference_within_1e_5_relative(problem):
    q, k, v, pos, scale = problem
    out, lse = ks.dense_attention(q, k, v, pos, scale=scale)
    r_out, r_lse, _ = ref.attention(q, k, v, pos, None, scale=scale)
    assert_output_close(out, lse, r_out, r_lse, "dense")


@HEAVY
@given(_attention_problem(), st.integers(0, 12), st.integers(0, 2**32 - 1))
def test_sparse_attention_equals_the_reference_within_1e_5_relative(problem, width, seed):
    q, k, v, pos, scale = problem
    nk, hkv = k.shape[0], k.shape[1]
    rng = np.random.default_rng(seed)
    sel = rng.integers(-3, nk + 6, (q.shape[0], hkv, width)).astype(np.int32)
    out, lse, empty = ks.sparse_attention(q, k, v, pos, sel, scale=scale)
    r_out, r_lse, r_empty = ref.attention(q, k, v, pos, sel, scale=scale)
    assert empty == r_empty
    assert_output_close(out, lse, r_out, r_lse, "sparse")
    # Selecting every visible key is the dense pass, bit for bit.
    full = np.repeat(ref.dense_rows(pos)[:, None, :], hkv, axis=1)
    f_out, f_lse, f_empty = ks.sparse_attention(q, k, v, pos, full, scale=scale)
    d_out, d_lse = ks.dense_attention(q, k, v, pos, scale=scale)
    assert f_empty == (q.shape[0] * q.shape[1] if nk == 0 else 0)
    assert np.array_equal(f_out, d_out) and np.array_equal(f_lse, d_lse)


# ---------------------------------------------------------------------------
# Batched metrics
# ---------------------------------------------------------------------------


@st.composite
def _coverage_rows_problem(draw):
    rows = draw(st.integers(0, 6))
    width = draw(st.integers(0, 12))
    cands = draw(index_rows(rows, width, 80))
    lens = np.array([draw(st.integers(0, 80) | st.sampled_from([I32_MAX])) for _ in range(rows)], dtype=np.int64)
    num_segments = draw(st.integers(0, 100) | u64s)
    return cands, lens, num_segments


@MEDIUM
@given(_coverage_rows_problem())
def test_segment_coverage_rows_equal_the_reference_and_the_scalar_metric(problem):
    cands, lens, num_segments = problem
    got = ks.segment_coverage_rows(cands, lens, num_segments)
    assert got.dtype == np.float64
    assert_metric_equal(got, ref.segment_coverage_rows(cands, lens, num_segments), problem)
    for r in range(len(lens)):
        assert got[r] == ks.segment_coverage(cands[r], int(lens[r]), num_segments)


@st.composite
def _recall_rows_problem(draw):
    rows = draw(st.integers(0, 5))
    group = draw(st.integers(1, 4))
    row_len = draw(st.integers(0, 30))
    cands = draw(index_rows(rows, draw(st.integers(0, 12)), row_len))
    if draw(st.booleans()):
        elem = st.integers(0, 4).map(float)  # exact sums, zero-mass rows likely
    else:
        elem = st.floats(0, 1, allow_subnormal=False)
    att = draw(hnp.arrays(np.float64, (rows * group, row_len), elements=elem))
    return cands, att


@MEDIUM
@given(_recall_rows_problem())
def test_attention_mass_recall_rows_equal_the_reference_with_gqa_groups(problem):
    cands, att = problem
    got = ks.attention_mass_recall_rows(cands, att)
    assert got.dtype == np.float64 and got.shape == (att.shape[0],)
    assert_metric_close(got, ref.attention_mass_recall_rows(cands, att), problem)
    group = att.shape[0] // cands.shape[0] if cands.shape[0] else 1
    for r in range(att.shape[0]):
        assert_metric_close(got[r], ks.attention_mass_recall(cands[r // group], att[r]), r)


_OUT_VALUES = st.one_of(
    st.integers(-4, 4).map(float),
    st.floats(-10, 10, width=32, allow_subnormal=False),
    st.floats(-10, 10, allow_subnormal=False),  # float64: rounded to float32 on both sides
    st.sampled_from([np.nan, np.inf, -np.inf]),
)


@st.composite
def _error_problem(draw):
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=6))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    finite = draw(st.booleans())
    elem = _OUT_VALUES.filter(math.isfinite) if finite else _OUT_VALUES
    dense = draw(hnp.arrays(dtype, shape, elements=elem))
    how = draw(st.sampled_from(["random", "equal", "perturbed", "zero_dense"]))
    if how == "random":
        sparse = draw(hnp.arrays(dtype, shape, elements=elem))
    elif how == "equal":
        sparse = dense.copy()
    elif how == "perturbed":
        sparse = dense + draw(hnp.arrays(dtype, shape, elements=st.sampled_from([0.0, 0.5, -1.0])))
    else:
        sparse = draw(hnp.arrays(dtype, shape, elements=elem))
        dense = np.zeros(shape, dtype)
        if shape and shape[-1] and draw(st.booleans()):
            dense[..., 0] = 1.0  # some rows with mass, some without
            dense.reshape(-1, shape[-1])[::2] = 0.0
    return sparse, dense


@MEDIUM
@given(_error_problem())
def test_output_relative_error_equals_the_reference_including_zero_inf_and_nan(problem):
    sparse, dense = problem
    with np.errstate(all="ignore"):
        want = ref.output_relative_error(sparse, dense)
    got = ks.output_relative_error(sparse, dense)
    assert type(got) is float
    assert_metric_close(got, want, problem)
    s32, d32 = sparse.astype(np.float32), dense.astype(np.float32)
    if np.all(np.isfinite(d32)) and np.array_equal(s32, d32):
        assert got == 0.0  # equal finite outputs (both zero included)


@MEDIUM
@given(_error_problem())
def test_output_relative_error_rows_equal_the_reference_row_by_row(problem):
    sparse, dense = problem
    with np.errstate(all="ignore"):
        want = ref.output_relative_error_rows(sparse, dense)
    got = ks.output_relative_error_rows(sparse, dense)
    assert got.dtype == np.float64 and got.shape == sparse.shape[:-1]
    assert_metric_close(got, want, problem)
    flat_s = sparse.reshape(-1, sparse.shape[-1]) if sparse.size else sparse.reshape(got.size, sparse.shape[-1])
    flat_d = dense.reshape(flat_s.shape)
    for r, value in enumerate(got.reshape(-1)):
        assert_metric_close(value, ks.output_relative_error(flat_s[r], flat_d[r]), r)


# ---------------------------------------------------------------------------
# Threads and SIMD level
# ---------------------------------------------------------------------------


@_hyp(30)
@given(n=st.integers(1, 6), problem=_packed_problem())
def test_the_thread_count_reads_back_and_never_changes_a_selection(n, problem):
    cfg, q, k, cu, sid, pos = problem
    default = None
    try:
        ks.set_num_threads(0)
        default = ks.get_num_threads()
        assert default >= 1
        base = ks.block_sparse_select_packed(q, k, cu, sid, pos, cfg)
        ks.set_num_threads(n)
        assert ks.get_num_threads() == n
        assert_same_ints(ks.block_sparse_select_packed(q, k, cu, sid, pos, cfg), base, f"{n} threads")
    finally:
        ks.set_num_threads(0)
    assert ks.get_num_threads() == default
    assert ks.simd_level() in ("avx512bf16", "avx512", "avx2", "scalar")
