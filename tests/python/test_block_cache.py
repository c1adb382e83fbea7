"""Block selection where the serving engines keep their index keys: the key
and query formats, the engines' head-major output, the paged form over a
block table, and batched ``positions_of_blocks``.

Every behaviour is checked on the native functions against the NumPy
reference (``kvselect.reference``, written from ``spec/block_sparse.rs.txt``
and the stubs), and most tests run once per implementation (the
``impl`` parameter): the reference's own run checks it against the rule
written out in the test (the transpose, the gathered keys, the table
lookup, the brute-force union), so the oracle is checked too.

The data are integer-valued (or eighths from the float8 grid) and small, so
every float32 dot product is exact in any summation order and every format
holds the values exactly: the selections must be EQUAL, ties included.
Randomised cases are reproducible: a failing one names its seed.
"""

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvselect as ks
from kvselect import reference as ref

try:  # the typed bfloat16 / float8 arrays; the raw float16 views need nothing
    import ml_dtypes
except ImportError:  # pragma: no cover - a test extra
    ml_dtypes = None

SEED = 20261215
N_PAGED_CASES = 300
IMPLS = ["native", "reference"]

HYP = settings(max_examples=150, deadline=None)


def _mod(impl):
    return ks if impl == "native" else ref


def _error(impl):
    return ks.SelectionError if impl == "native" else ref.ReferenceSelectionError


def _assert_rows_equal(got, want, what):
    assert isinstance(got, np.ndarray) and got.dtype == np.int32, f"{what}: {type(got)} {getattr(got, 'dtype', None)}"
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if not np.array_equal(got, want):
        bad = tuple(np.argwhere(np.any(got != want, axis=-1))[0])
        raise AssertionError(f"{what}: first difference at {bad}: {got[bad].tolist()} != {want[bad].tolist()}")


def _transpose(a):
    return np.ascontiguousarray(a.transpose(1, 0, 2))


def _refused(impl, argument, fn, *args, **kwargs):
    with pytest.raises(_error(impl)) as e:
        fn(*args, **kwargs)
    assert isinstance(e.value, ValueError)
    assert e.value.argument == argument, (e.value.argument, str(e.value))
    return e.value


# ---------------------------------------------------------------------------
# Formats
# ---------------------------------------------------------------------------

_FP8 = ref.decode(np.arange(256, dtype=np.uint8), "float8_e4m3fn")
#: float8 e4m3fn values that are multiples of 1/8 in [-4, 4] (-0.0 included):
#: products are multiples of 1/64 below 16, so dot products stay exact.
EIGHTHS = np.unique(_FP8[np.isfinite(_FP8) & (np.abs(_FP8) <= 4) & (_FP8 * 8 == np.round(_FP8 * 8))])


def _formats(x):
    """``x`` (float32 values that every format holds exactly) in every
    format: ``[(array, format argument, name)]``, raw views with the format
    they need. The typed bfloat16 / float8 arrays need ml_dtypes."""
    f16 = x.astype(np.float16)
    out = [(x, None, "float32"), (f16, None, "float16"), (f16.view(np.uint16), "float16", "float16 raw")]
    if ml_dtypes is not None:
        bf16 = x.astype(ml_dtypes.bfloat16)
        fp8 = x.astype(ml_dtypes.float8_e4m3fn)
        out += [
            (bf16, None, "bfloat16"),
            (bf16.view(np.uint16), "bfloat16", "bfloat16 raw"),
            (fp8, None, "float8_e4m3fn"),
            (fp8.view(np.uint8), "float8_e4m3fn", "float8_e4m3fn raw"),
        ]
    return out


def _values(rng, shape, mode):
    if mode == "eighths":
        return rng.choice(EIGHTHS, size=shape).astype(np.float32)
    return rng.integers(-3, 4, size=shape).astype(np.float32)


def _config(rng, bs=None):
    bs = int(rng.choice([1, 2, 3, 4, 5, 8, 16, 64])) if bs is None else bs
    top = int(rng.integers(0, 7))
    init = int(rng.integers(0, 3))
    local = int(rng.integers(0 if (top or init) else 1, 3))
    return ks.BlockSparseConfig(bs, top, init, local)


def _format_case(rng):
    cfg = _config(rng)
    mode = str(rng.choice(["integers", "eighths"]))
    lens = rng.integers(0, 120, int(rng.integers(1, 4)))
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    n, h, d = int(rng.integers(1, 5)), int(rng.integers(1, 5)), int(rng.integers(1, 20))
    k = _values(rng, (int(cu[-1]), d), mode)
    if rng.random() < 0.2 and len(k):
        k[rng.integers(0, len(k), 3)] = np.nan  # NaN in every format
    q = _values(rng, (n, h, d), mode)
    sid = rng.integers(0, len(lens), n)
    pos = rng.integers(0, int(cu[-1]) + 3 * cfg.block_size + 1, n)
    return cfg, k, q, cu, sid, pos


@pytest.mark.parametrize("impl", IMPLS)
def test_every_key_and_query_format_selects_as_its_decoded_float32_values(impl):
    """bfloat16 / float8 / float16 keys and queries, typed or as raw views
    with key_format / query_format, select exactly what the same values
    given as float32 select: single, batched and packed forms."""
    pytest.importorskip("ml_dtypes")
    m = _mod(impl)
    rng = np.random.default_rng(SEED)
    checked = 0
    for case in range(40):
        cfg, k, q, cu, sid, pos = _format_case(rng)
        what = f"case {case} {cfg!r}"
        single = m.block_sparse_select(q[0], k, int(pos[0]), cfg)
        batched = m.block_sparse_select(q, k, pos, cfg)
        packed = m.block_sparse_select_packed(q, k, cu, sid, pos, cfg)
        if impl == "native":
            _assert_rows_equal(single, ref.block_sparse_select(q[0], k, int(pos[0]), cfg), what)
            _assert_rows_equal(batched, ref.block_sparse_select(q, k, pos, cfg), what)
            _assert_rows_equal(packed, ref.block_sparse_select_packed(q, k, cu, sid, pos, cfg), what)
        k_forms, q_forms = _formats(k), _formats(q)
        assert len(k_forms) == 7
        for j, (kk, kf, k_name) in enumerate(k_forms):
            # The format holds the values exactly (NaN stays NaN).
            np.testing.assert_array_equal(ref.decode(kk, kf).astype(np.float32), k)
            # Keys alone, then keys with a query format (a different one each time).
            qq, qf, q_name = q_forms[(j + case) % len(q_forms)]
            for qv, qfv, label in ((q, None, "float32"), (qq, qf, q_name)):
                w = f"{what}: keys {k_name}, queries {label}"
                kw = dict(key_format=kf, query_format=qfv)
                _assert_rows_equal(m.block_sparse_select(qv[0], kk, int(pos[0]), cfg, **kw), single, w + " (single)")
                _assert_rows_equal(m.block_sparse_select(qv, kk, pos, cfg, **kw), batched, w + " (batched)")
                _assert_rows_equal(
                    m.block_sparse_select_packed(qv, kk, cu, sid, pos, cfg, **kw), packed, w + " (packed)"
                )
                checked += 1
    assert checked == 40 * 7 * 2


@pytest.mark.parametrize("impl", IMPLS)
def test_a_raw_view_needs_its_format_and_a_typed_array_must_agree_with_one(impl):
    m = _mod(impl)
    cfg = ks.BlockSparseConfig(4, 3, 1, 1)
    k = np.ones((10, 4), np.float32)
    q = np.ones((2, 4), np.float32)
    raw = k.astype(np.float16).view(np.uint16)
    native = impl == "native"

    def says(native_text, reference_text):
        return re.escape(native_text if native else reference_text)

    with pytest.raises(
        TypeError, match=says("index_k has dtype uint16, which is not a key format", "index_k is a raw uint16 array")
    ):
        m.block_sparse_select(q, raw, 3, cfg)  # no format
    with pytest.raises(
        TypeError,
        match=says(
            "index_k has dtype uint16, which does not hold float8_e4m3fn (key_format)",
            "index_k is a raw uint16 array: it needs a matching format, got 'float8_e4m3fn'",
        ),
    ):
        m.block_sparse_select(q, raw, 3, cfg, key_format="float8_e4m3fn")  # uint16 is not fp8
    with pytest.raises(
        TypeError,
        match=says(
            "index_k has dtype float16, which does not hold bfloat16 (key_format)",
            "index_k has dtype float16, which does not hold bfloat16",
        ),
    ):
        m.block_sparse_select(q, k.astype(np.float16), 3, cfg, key_format="bfloat16")
    with pytest.raises(ks.SelectionError if impl == "native" else ref.ReferenceSelectionError) as e:
        m.block_sparse_select(q, k, 3, cfg, key_format="int4")  # not a format: a bad value
    assert e.value.argument == "key_format"
    with pytest.raises(
        TypeError, match=says("index_q has dtype uint16, which is not a key format", "index_q is a raw uint16 array")
    ):
        m.block_sparse_select(q.astype(np.float16).view(np.uint16), k, 3, cfg)  # queries too
    # With the right format the raw view is accepted and equals float32.
    assert np.array_equal(
        m.block_sparse_select(
            q.astype(np.float16).view(np.uint16), raw, 3, cfg, key_format="float16", query_format="float16"
        ),
        m.block_sparse_select(q, k, 3, cfg),
    )


# ---------------------------------------------------------------------------
# Head-major output
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
def test_head_major_output_is_the_transpose_of_the_query_major_output(impl):
    m = _mod(impl)
    rng = np.random.default_rng(SEED + 1)
    for case in range(60):
        cfg, k, q, cu, sid, pos = _format_case(rng)
        what = f"case {case} {cfg!r} q {q.shape}"
        qm = m.block_sparse_select(q, k, pos, cfg)
        hm = m.block_sparse_select(q, k, pos, cfg, head_major=True)
        _assert_rows_equal(hm, _transpose(qm), what)
        assert hm.flags.c_contiguous
        assert np.array_equal(m.block_sparse_select(q, k, pos, cfg, head_major=False), qm)
        pm = m.block_sparse_select_packed(q, k, cu, sid, pos, cfg)
        _assert_rows_equal(m.block_sparse_select_packed(q, k, cu, sid, pos, cfg, head_major=True), _transpose(pm), what)
        # A 2-D index_q (one query): the flag changes nothing.
        one = m.block_sparse_select(q[0], k, int(pos[0]), cfg)
        _assert_rows_equal(m.block_sparse_select(q[0], k, int(pos[0]), cfg, head_major=True), one, what)
        if impl == "native":
            _assert_rows_equal(hm, ref.block_sparse_select(q, k, pos, cfg, head_major=True), what)


@pytest.mark.parametrize("impl", IMPLS)
def test_a_head_major_out_is_filled_and_returned_and_a_query_major_one_is_refused(impl):
    m = _mod(impl)
    rng = np.random.default_rng(SEED + 2)
    cfg = ks.BlockSparseConfig(4, 5, 1, 1)
    k = rng.integers(-3, 4, (200, 6)).astype(np.float32)
    q = rng.integers(-3, 4, (3, 2, 6)).astype(np.float32)
    pos = np.array([0, 77, 199])
    want = _transpose(m.block_sparse_select(q, k, pos, cfg))
    out = np.full((2, 3, 5), 12345, np.int32)
    assert m.block_sparse_select(q, k, pos, cfg, head_major=True, out=out) is out
    assert np.array_equal(out, want)
    out2 = np.full((2, 3, 5), -9, np.int32)
    got = m.block_sparse_select_packed(
        q, k, [0, 100, 200], [1, 1, 1], pos - np.array([0, 0, 100]), cfg, head_major=True, out=out2
    )
    assert got is out2
    assert np.array_equal(out2, _transpose(m.block_sparse_select(q, k[100:], pos - np.array([0, 0, 100]), cfg)))
    # The query-major shape is the wrong one when head-major (and vice versa).
    for kwargs, shape in ((dict(head_major=True), (3, 2, 5)), (dict(), (2, 3, 5))):
        bad = np.arange(30, dtype=np.int32).reshape(shape)
        snapshot = bad.tobytes()
        _refused(impl, "out", m.block_sparse_select, q, k, pos, cfg, out=bad, **kwargs)
        _refused(impl, "out", m.block_sparse_select_packed, q, k, [0, 200], [0, 0, 0], pos, cfg, out=bad, **kwargs)
        assert bad.tobytes() == snapshot


@pytest.mark.parametrize("impl", IMPLS)
def test_with_as_many_queries_as_heads_the_flag_not_the_shape_decides(impl):
    """``[3, 3, width]`` fits either layout: the flag alone says which, for
    the selection, its out=, and for positions_of_blocks' query axis."""
    m = _mod(impl)
    rng = np.random.default_rng(SEED + 3)
    cfg = ks.BlockSparseConfig(4, 3, 1, 1)
    k = rng.integers(-3, 4, (60, 5)).astype(np.float32)
    q = rng.integers(-3, 4, (3, 3, 5)).astype(np.float32)
    pos = np.array([5, 30, 59])
    qm = m.block_sparse_select(q, k, pos, cfg)
    assert qm.shape == (3, 3, 3)
    assert not np.array_equal(qm, _transpose(qm))  # the layouts are distinguishable
    hm = m.block_sparse_select(q, k, pos, cfg, head_major=True)
    _assert_rows_equal(hm, _transpose(qm), "head-major")
    for flag, want in ((False, qm), (True, hm)):
        out = np.full((3, 3, 3), 77, np.int32)
        assert m.block_sparse_select(q, k, pos, cfg, head_major=flag, out=out) is out
        assert np.array_equal(out, want), flag
        out = np.full((3, 3, 3), 77, np.int32)
        assert m.block_sparse_select_packed(q, k, [0, 60], [0, 0, 0], pos, cfg, head_major=flag, out=out) is out
        assert np.array_equal(out, want), flag
    # positions_of_blocks reads query_pos along the query axis the flag names.
    p_qm = m.positions_of_blocks(qm, pos, 60, cfg)
    p_hm = m.positions_of_blocks(hm, pos, 60, cfg, head_major=True)
    _assert_rows_equal(p_hm, _transpose(p_qm), "positions, head-major")
    wrong_axis = m.positions_of_blocks(hm, pos, 60, cfg)  # rows [h, i] read query_pos[h]
    assert not np.array_equal(wrong_axis, p_hm)


# ---------------------------------------------------------------------------
# The paged form
# ---------------------------------------------------------------------------

GARBAGE = np.float32(16.0)  # held exactly by every format, and beats every real score


def make_paged_case(seed):
    """A paged cache as an engine holds it: every sequence's pages handed
    out in a shuffled order, unused pages and the tail of each last page
    full of garbage (16 and NaN, which would win a block if read), the block
    table padded with 0 beyond what is read, and sometimes the block axis
    strided (``big[:, j]`` of ``[num_blocks, 2, bs, d]``, another layer's
    pages interleaved).

    Returns a dict: cfg, keys (per sequence, float32, contiguous), big
    (float32 ``[num_blocks, layers, bs, d]``), layer, table, lens, q, sid,
    pos, mode.
    """
    rng = np.random.default_rng(seed)
    cfg = _config(rng)
    bs = cfg.block_size
    n_seqs = int(rng.integers(1, 5))
    lens = []
    for _ in range(n_seqs):
        r = rng.random()
        if r < 0.08:
            lens.append(0)
        elif r < 0.25:
            lens.append(bs * int(rng.integers(1, 6)))  # whole pages exactly
        else:
            lens.append(int(rng.integers(1, 12 * bs + 2)))
    lens = [min(n, 400) for n in lens]
    d, h = int(rng.integers(1, 20)), int(rng.integers(1, 5))
    need = [-(-n // bs) for n in lens]
    n_pages = max(sum(need) + int(rng.integers(0, 4)), 1)
    layers = 2 if rng.random() < 0.3 else 1
    layer = int(rng.integers(0, layers))
    big = np.full((n_pages, layers, bs, d), GARBAGE, np.float32)
    big[rng.random(big.shape) < 0.1] = np.nan
    page_order = rng.permutation(n_pages)
    table = np.zeros((n_seqs, max(need) + int(rng.integers(0, 3))), np.int32)
    data = str(rng.choice(["uniform", "ties", "zeros", "eighths"]))
    keys, nxt = [], 0
    for s, n in enumerate(lens):
        if data == "ties":  # rows from a pool of 1-3: many blocks tie
            pool = rng.integers(-1, 2, (int(rng.integers(1, 4)), d))
            k = pool[rng.integers(0, len(pool), n)]
        elif data == "zeros":
            k = rng.integers(-3, 4, (n, d)) * (rng.random((n, 1)) < 0.1)
        elif data == "eighths":
            k = rng.choice(EIGHTHS, (n, d))
        else:
            k = rng.integers(-3, 4, (n, d))
        k = np.asarray(k, np.float32).reshape(n, d)
        if n and rng.random() < 0.15:
            k[rng.integers(0, n, 2), int(rng.integers(0, d))] = np.nan
        keys.append(k)
        for b in range(need[s]):
            page = int(page_order[nxt])
            nxt += 1
            table[s, b] = page
            rows = k[b * bs : (b + 1) * bs]
            big[page, layer, : len(rows)] = rows
    mode = str(rng.choice(["decode", "prefill", "mixed"]))
    if mode == "decode":  # one query per sequence, at its newest token
        sid = rng.permutation(n_seqs)
        pos = np.array([max(lens[s] - 1, 0) for s in sid])
    elif mode == "prefill":  # a chunk of one sequence, then decode queries of the others
        s0 = int(rng.integers(0, n_seqs))
        chunk = int(rng.integers(1, 2 * bs + 3))
        first = max(lens[s0] - chunk, 0)
        sid = [s0] * (max(lens[s0], 1) - first) + [s for s in range(n_seqs) if s != s0]
        pos = list(range(first, max(lens[s0], 1))) + [max(lens[s] - 1, 0) for s in range(n_seqs) if s != s0]
        sid, pos = np.array(sid), np.array(pos)
    else:  # anywhere, including past the sequence's end
        n = int(rng.integers(1, 8))
        sid = rng.integers(0, n_seqs, n)
        pos = np.array([int(rng.integers(0, lens[s] + 2 * bs + 2)) for s in sid])
    q = rng.choice(EIGHTHS, (len(sid), h, d)) if data == "eighths" else rng.integers(-3, 4, (len(sid), h, d))
    return dict(
        cfg=cfg,
        keys=keys,
        big=big,
        layer=layer,
        table=table,
        lens=np.array(lens, np.int64),
        q=np.asarray(q, np.float32),
        sid=sid.astype(np.int64),
        pos=pos.astype(np.int64),
        mode=mode,
    )


def _physical(logical, table, sid):
    """Each id ``b >= 0`` of query ``i``'s rows replaced by ``table[sid[i], b]``."""
    if table.shape[1] == 0:  # no sequence has a block: every id is -1
        assert np.all(logical == -1)
        return logical.copy()
    rows = table[sid][:, None, :].astype(np.int64)
    looked_up = np.take_along_axis(
        np.broadcast_to(rows, logical.shape[:2] + rows.shape[2:]), np.maximum(logical, 0).astype(np.int64), axis=2
    )
    return np.where(logical >= 0, looked_up, -1).astype(np.int32)


def test_the_paged_case_generator_covers_what_the_differential_test_is_for():
    seen = {"strided": 0, "padding": 0, "shuffled": 0, "empty_seq": 0, "beyond": 0, "garbage_tail": 0}
    modes = set()
    for i in range(N_PAGED_CASES):
        c = make_paged_case(SEED + 1000 + i)
        bs = c["cfg"].block_size
        need = -(-c["lens"] // bs)
        seen["strided"] += c["big"].shape[1] == 2
        seen["padding"] += c["table"].shape[1] > need.max()
        seen["shuffled"] += any((c["table"][s, :n] != np.arange(n)).any() for s, n in enumerate(need))
        seen["empty_seq"] += bool((c["lens"] == 0).any())
        seen["beyond"] += bool((c["pos"] >= c["lens"][c["sid"]]).any())
        seen["garbage_tail"] += bool((c["lens"] % bs != 0).any())
        modes.add(c["mode"])
    assert modes == {"decode", "prefill", "mixed"}
    for key, count in seen.items():
        assert count >= 15, (key, count)


@pytest.mark.parametrize("impl", IMPLS)
def test_paged_selection_equals_the_dense_form_on_the_same_keys_laid_out_contiguously(impl):
    """Hundreds of engine-like caches in every format: the paged rows equal
    the dense and packed forms over each sequence's keys, physical ids are
    the block-table lookup of the logical ones, head-major is the transpose,
    and (native) everything equals the reference exactly."""
    m = _mod(impl)
    rng = np.random.default_rng(SEED + 4)
    for i in range(N_PAGED_CASES):
        seed = SEED + 1000 + i
        c = make_paged_case(seed)
        cfg, table, lens, q, sid, pos = c["cfg"], c["table"], c["lens"], c["q"], c["sid"], c["pos"]
        forms = _formats(c["big"])
        big, kf, k_name = forms[i % len(forms)]
        cache = big[:, c["layer"]]
        assert cache.shape[1] == cfg.block_size and np.shares_memory(cache, big)  # read in place
        if rng.random() < 0.6:
            qq, qf, q_name = q, None, "float32"
        else:
            q_forms = _formats(q)
            qq, qf, q_name = q_forms[int(rng.integers(0, len(q_forms)))]
        what = f"seed={seed} {cfg!r} lens={lens.tolist()} sid={sid.tolist()} pos={pos.tolist()} keys {k_name} queries {q_name} ({c['mode']})"

        def paged(**flags):
            return m.block_sparse_select_paged(
                qq, cache, table, lens, sid, pos, cfg, key_format=kf, query_format=qf, **flags
            )

        logical = paged()
        assert logical.shape == (len(sid), q.shape[1], cfg.width), what
        # The dense form, query by query, over the sequence's keys contiguously.
        for j in range(len(sid)):
            one = m.block_sparse_select(q[j], c["keys"][sid[j]], int(pos[j]), cfg)
            _assert_rows_equal(logical[j], one, f"{what}: query {j} vs the dense call")
        # The packed form over the same keys concatenated.
        cu = np.concatenate([[0], np.cumsum(lens)])
        packed = m.block_sparse_select_packed(q, np.concatenate(c["keys"]), cu, sid, pos, cfg)
        _assert_rows_equal(logical, packed, f"{what}: vs packed")
        phys = _physical(logical, table, sid)
        for head_major in (False, True):
            for physical in (False, True):
                want = phys if physical else logical
                want = _transpose(want) if head_major else want
                got = paged(head_major=head_major, physical=physical)
                _assert_rows_equal(got, want, f"{what}: head_major={head_major} physical={physical}")
        out = np.full(_transpose(logical).shape, 555, np.int32)
        assert paged(head_major=True, physical=True, out=out) is out
        _assert_rows_equal(out, _transpose(phys), f"{what}: out=")
        if impl == "native":  # the flags in turn, so each combination meets the reference ~75 times
            flags = dict(head_major=bool(i % 2), physical=bool(i // 2 % 2))
            want = ref.block_sparse_select_paged(
                qq, cache, table, lens, sid, pos, cfg, key_format=kf, query_format=qf, **flags
            )
            _assert_rows_equal(paged(**flags), want, f"{what}: native vs reference, {flags}")


@pytest.mark.parametrize("impl", IMPLS)
def test_a_paged_call_refuses_a_bad_cache_or_table_and_writes_nothing(impl):
    m = _mod(impl)
    rng = np.random.default_rng(SEED + 5)
    cfg = ks.BlockSparseConfig(4, 2, 1, 1)
    cache = rng.integers(-3, 4, (6, 4, 3)).astype(np.float32)
    q = rng.integers(-3, 4, (2, 2, 3)).astype(np.float32)
    sid, pos = [0, 0], [4, 9]
    lens = [10]  # needs 3 pages
    good = np.array([[2, 0, 5, 1]], np.int32)
    base = m.block_sparse_select_paged(q, cache, good, lens, sid, pos, cfg)
    out = np.arange(2 * 2 * cfg.width, dtype=np.int32).reshape(2, 2, cfg.width) * 7 - 5
    snapshot = out.tobytes()
    refusals = [
        # The page must be the block.
        ("kv_cache", (q, rng.integers(-3, 4, (6, 8, 3)).astype(np.float32), good, lens, sid, pos, cfg)),
        ("kv_cache", (q, cache, good, lens, sid, pos, ks.BlockSparseConfig(8, 2, 1, 1))),
        ("kv_cache", (q, cache, good, lens, sid, pos, ks.BlockSparseConfig(2, 2, 1, 1))),
        # Entries that are read: past the cache, negative.
        ("block_table", (q, cache, np.array([[2, 6, 5, 1]], np.int32), lens, sid, pos, cfg)),
        ("block_table", (q, cache, np.array([[2, 0, -1, 1]], np.int32), lens, sid, pos, cfg)),
        ("block_table", (q, cache, np.array([[2**31 - 1, 0, 5, 1]], np.int32), lens, sid, pos, cfg)),
        # A row shorter than the sequence needs.
        ("block_table", (q, cache, np.array([[2, 0]], np.int32), lens, sid, pos, cfg)),
        ("block_table", (q, cache, np.zeros((1, 0), np.int32), lens, sid, pos, cfg)),
        # A query of a sequence that does not exist.
        ("seq_ids", (q, cache, good, lens, [0, 1], pos, cfg)),
        ("seq_ids", (q, cache, np.tile(good, (2, 1)), [10, 3], [2, 0], pos, cfg)),
    ]
    for argument, args in refusals:
        for flags in (dict(), dict(head_major=False, physical=True)):
            _refused(impl, argument, m.block_sparse_select_paged, *args, out=out, **flags)
            assert out.tobytes() == snapshot, (argument, flags)
    # Entries that are not read may hold anything, -1 and past-the-cache included.
    for unread in ([[2, 0, 5, -1]], [[2, 0, 5, 99]], [[2, 0, 5, 2**31 - 1]], [[2, 0, 5]]):
        got = m.block_sparse_select_paged(q, cache, np.array(unread, np.int32), lens, sid, pos, cfg)
        _assert_rows_equal(got, base, f"unread {unread}")
    # A sequence whose length reads no page at all has an empty row to offer.
    two = np.array([[2, 0, 5], [-1, -1, -1]], np.int32)
    got = m.block_sparse_select_paged(q, cache, two, [10, 0], [1, 0], pos, cfg)
    assert np.all(got[0] == -1)
    _assert_rows_equal(got[1], base[1], "the second query")
    if impl == "native":
        _assert_rows_equal(base, ref.block_sparse_select_paged(q, cache, good, lens, sid, pos, cfg), "vs reference")


# ---------------------------------------------------------------------------
# Batched positions_of_blocks
# ---------------------------------------------------------------------------


def _brute_row(blocks, query_pos, n_positions, bs):
    limit = min(query_pos + 1, n_positions)
    covered = {p for b in blocks if b >= 0 for p in range(b * bs, min((b + 1) * bs, limit))}
    return sorted(covered)


def _check_rows(rows, blocks, qp_of, np_of, bs, query_axis, what):
    """Every row of ``rows [..., width * bs]``: the brute-force union, ascending, then -1."""
    assert rows.dtype == np.int32 and rows.shape == blocks.shape[:-1] + (blocks.shape[-1] * bs,), what
    for idx in np.ndindex(*blocks.shape[:-1]):
        i = idx[query_axis]
        want = _brute_row(blocks[idx].tolist(), qp_of(i), np_of(i), bs)
        row = rows[idx]
        assert row[: len(want)].tolist() == want, (what, idx)
        assert np.all(row[len(want) :] == -1), (what, idx)


def _per(value, i):
    return int(value) if np.ndim(value) == 0 else int(value[i])


def _positions_case(rng):
    bs = int(rng.choice([1, 2, 3, 5, 16, 128]))
    ndim = int(rng.choice([2, 3]))
    if ndim == 2:
        shape = (int(rng.integers(0, 8)), int(rng.integers(0, 7)))
    else:
        shape = (int(rng.integers(0, 6)), int(rng.integers(1, 5)), int(rng.integers(0, 7)))
    blocks = rng.integers(-1, 40, shape).astype(rng.choice([np.int32, np.int64]))
    if rng.random() < 0.5 and blocks.size:  # selections are ascending then -1; batches need not be
        blocks = np.sort(np.where(blocks < 0, 2**31 - 1, blocks), axis=-1)
        blocks = np.where(blocks == 2**31 - 1, -1, blocks).astype(blocks.dtype)
    head_major = bool(ndim == 3 and rng.random() < 0.5)
    n = blocks.shape[1] if head_major else blocks.shape[0]
    qp = int(rng.integers(0, 800)) if rng.random() < 0.3 else rng.integers(0, 800, n)
    npos = int(rng.integers(0, 900)) if rng.random() < 0.3 else rng.integers(0, 900, n)
    return ks.BlockSparseConfig(bs, 1, 0, 0), blocks, qp, npos, head_major


@pytest.mark.parametrize("impl", IMPLS)
def test_batched_positions_of_blocks_are_the_one_dimensional_rows_padded_with_minus_one(impl):
    m = _mod(impl)
    rng = np.random.default_rng(SEED + 6)
    for case in range(300):
        cfg, blocks, qp, npos, head_major = _positions_case(rng)
        bs = cfg.block_size
        what = f"case {case} bs={bs} blocks {blocks.shape} head_major={head_major}"
        query_axis = 1 if head_major else 0
        got = m.positions_of_blocks(blocks, qp, npos, cfg, head_major=head_major)
        _check_rows(got, blocks, lambda i: _per(qp, i), lambda i: _per(npos, i), bs, query_axis, what)
        # Row by row, the 1-D call.
        for idx in list(np.ndindex(*blocks.shape[:-1]))[:6]:
            i = idx[query_axis]
            one = m.positions_of_blocks(blocks[idx], _per(qp, i), _per(npos, i), cfg)
            assert one.dtype == np.int32
            assert got[idx][: len(one)].tolist() == one.tolist() and np.all(got[idx][len(one) :] == -1), (what, idx)
        if impl == "native":
            want = ref.positions_of_blocks(blocks, qp, npos, cfg, head_major=head_major)
            _assert_rows_equal(got, want, what)
        # With 2-D blocks the flag changes nothing.
        if blocks.ndim == 2:
            assert np.array_equal(m.positions_of_blocks(blocks, qp, npos, cfg, head_major=True), got)


@st.composite
def _positions_problem(draw):
    n_rows, width = draw(st.integers(0, 5)), draw(st.integers(0, 5))
    rows = draw(
        st.lists(st.lists(st.integers(-3, 30), min_size=width, max_size=width), min_size=n_rows, max_size=n_rows)
    )
    per_row = st.lists(st.integers(0, 300), min_size=n_rows, max_size=n_rows).map(lambda v: np.array(v, np.int64))
    qp = draw(st.integers(0, 300) | per_row)
    npos = draw(st.integers(0, 300) | per_row)
    return np.array(rows, np.int32).reshape(n_rows, width), qp, npos, draw(st.sampled_from([1, 2, 3, 7, 16]))


@HYP
@given(_positions_problem())
def test_property_batched_positions_of_blocks_equals_reference(problem):
    blocks, qp, npos, bs = problem
    cfg = ks.BlockSparseConfig(bs, 1, 0, 0)
    want = ref.positions_of_blocks(blocks, qp, npos, cfg)
    _check_rows(want, blocks, lambda i: _per(qp, i), lambda i: _per(npos, i), bs, 0, "reference")
    _assert_rows_equal(ks.positions_of_blocks(blocks, qp, npos, cfg), want, repr(problem))


@pytest.mark.parametrize("impl", IMPLS)
def test_a_selection_fed_straight_into_positions_of_blocks_equals_the_double_loop(impl):
    m = _mod(impl)
    rng = np.random.default_rng(SEED + 7)
    for case in range(40):
        cfg, k, q, cu, sid, pos = _format_case(rng)
        bs, n = cfg.block_size, len(k)
        what = f"case {case} {cfg!r}"
        sel = m.block_sparse_select(q, k, pos, cfg)
        got = m.positions_of_blocks(sel, pos, n, cfg)
        assert got.shape == sel.shape[:2] + (cfg.width * bs,), what
        for i in range(sel.shape[0]):
            for h in range(sel.shape[1]):
                one = m.positions_of_blocks(sel[i, h], int(pos[i]), n, cfg)
                want = np.full(cfg.width * bs, -1, np.int32)
                want[: len(one)] = one
                assert np.array_equal(got[i, h], want), (what, i, h)
        hm = m.block_sparse_select(q, k, pos, cfg, head_major=True)
        _assert_rows_equal(m.positions_of_blocks(hm, pos, n, cfg, head_major=True), _transpose(got), what)
        # Packed: each query's own sequence length.
        lens = np.diff(cu)
        psel = m.block_sparse_select_packed(q, k, cu, sid, pos, cfg)
        pgot = m.positions_of_blocks(psel, pos, lens[sid], cfg)
        for i in range(psel.shape[0]):
            for h in range(psel.shape[1]):
                one = m.positions_of_blocks(psel[i, h], int(pos[i]), int(lens[sid[i]]), cfg)
                assert pgot[i, h, : len(one)].tolist() == one.tolist() and np.all(pgot[i, h, len(one) :] == -1)
        if impl == "native":
            _assert_rows_equal(got, ref.positions_of_blocks(sel, pos, n, cfg), what)
            _assert_rows_equal(pgot, ref.positions_of_blocks(psel, pos, lens[sid], cfg), what)


@pytest.mark.parametrize("impl", IMPLS)
def test_batched_positions_of_blocks_refuses_a_wrong_length_or_shape_naming_the_argument(impl):
    m = _mod(impl)
    cfg = ks.BlockSparseConfig(4, 3, 1, 1)
    b2 = np.zeros((3, 2), np.int32)
    b3 = np.zeros((2, 3, 2), np.int32)  # [n_queries=2, H=3] or, head-major, [H=2, n_queries=3]
    _refused(impl, "query_pos", m.positions_of_blocks, b2, [1, 2], 10, cfg)
    _refused(impl, "n_positions", m.positions_of_blocks, b2, 5, [10, 10, 10, 10], cfg)
    _refused(impl, "query_pos", m.positions_of_blocks, b2, [[1, 2, 3]], 10, cfg)
    _refused(impl, "query_pos", m.positions_of_blocks, b3, [1, 2, 3], 10, cfg)  # 3 != n_queries 2
    _refused(impl, "query_pos", m.positions_of_blocks, b3, [1, 2], 10, cfg, head_major=True)  # 2 != 3
    _refused(impl, "n_positions", m.positions_of_blocks, b3, [1, 2, 3], [9, 9], cfg, head_major=True)
    _refused(impl, "query_pos", m.positions_of_blocks, b3, [1, -2], 10, cfg)
    _refused(impl, "blocks", m.positions_of_blocks, np.zeros((1, 2, 3, 2), np.int32), 5, 10, cfg)
    # Accepted: the lengths the flag names.
    assert m.positions_of_blocks(b3, [1, 2], [10, 10], cfg).shape == (2, 3, 8)
    assert m.positions_of_blocks(b3, [1, 2, 3], 10, cfg, head_major=True).shape == (2, 3, 8)
    with pytest.raises(TypeError, match="^blocks must hold integers.*got dtype float32$"):
        m.positions_of_blocks(b2.astype(np.float32), 5, 10, cfg)
    if impl == "reference":
        # 1-D blocks take int query_pos / n_positions only.
        _refused(impl, "query_pos", m.positions_of_blocks, np.zeros(2, np.int32), [1, 2], 10, cfg)
