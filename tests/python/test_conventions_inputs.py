"""The conventions (docs/conventions.md) on the input side of the indexer, block-selection and
paged-cache entry points: every array argument is checked axis by axis (a
transposed or reshaped one is refused, naming it and both shapes), a dense
array in non-native byte order or misaligned gives the same bits as the
native aligned one (a paged cache in non-native byte order is refused,
naming ``kv_cache``), a scalar ``query_pos`` is a batch of one query, and
``out=`` follows one contract. Native and reference alike.
"""

from __future__ import annotations

import numpy as np
import pytest

import kvselect as ks
from kvselect import reference as ref

ml_dtypes = pytest.importorskip("ml_dtypes")

IMPLS = ["native", "reference"]
SEED = 20261201

N, H, D, T = 3, 2, 4, 12  # queries, heads, dim, keys: no two alike
TOPK = 5
CFG = ks.BlockSparseConfig(4, 2, 1, 1)


def _mod(impl):
    return ks if impl == "native" else ref


def _error(impl):
    return ks.SelectionError if impl == "native" else ref.ReferenceSelectionError


def _cfg(impl):
    return CFG if impl == "native" else ref.BlockSparseConfig(4, 2, 1, 1)


def _inputs():
    r = np.random.default_rng(SEED)
    q = r.integers(-3, 4, size=(N, H, D)).astype(np.float32)
    return {
        "q": q,
        "w": r.standard_normal((N, H)).astype(np.float32),
        "k": r.integers(-3, 4, size=(T, D)).astype(np.float32),
        "scale": (r.random(T) + 0.5).astype(np.float32),
        "pos": np.array([5, 8, 11]),
        "cu": np.array([0, 5, 12]),
        "sid": np.array([0, 1, 1]),
        "ppos": np.array([4, 3, 6]),
        "cache": r.integers(-3, 4, size=(6, 4, D)).astype(np.float32),
        "table": np.array([[0, 2, 5], [1, 3, 4]], dtype=np.int32),
        "lens": np.array([7, 8]),
        "blocks": np.array([[[0, 1], [1, 2]], [[0, 2], [2, -1]], [[1, 2], [0, 1]]], dtype=np.int32),
    }


# Each entry point: a call on the canonical inputs, `a` the argument dict,
# overridable per argument name (the name the refusal must carry).
def _call(name, impl, a, **kw):
    m = _mod(impl)
    cfg = _cfg(impl)
    if name == "indexer_topk":
        return m.indexer_topk(a["q"], a["w"], a["k"], a["pos"], TOPK, key_scale=a["scale"], **kw)
    if name == "indexer_scores":
        return m.indexer_scores(a["q"], a["w"], a["k"], a["pos"], key_scale=a["scale"], **kw)
    if name == "indexer_magnitudes":
        return m.indexer_magnitudes(a["q"], a["w"], a["k"], a["pos"], key_scale=a["scale"], **kw)
    if name == "indexer_topk_packed":
        return m.indexer_topk_packed(
            a["q"], a["w"], a["k"], a["cu"], a["sid"], a["ppos"], TOPK, key_scale=a["scale"], **kw
        )
    if name == "indexer_topk_paged":
        return m.indexer_topk_paged(a["q"], a["w"], a["cache"], a["table"], a["lens"], a["sid"], a["ppos"], TOPK, **kw)
    if name == "block_sparse_select":
        return m.block_sparse_select(a["q"], a["k"], a["pos"], cfg, **kw)
    if name == "block_scores":
        return m.block_scores(a["q"], a["k"], a["pos"], cfg, **kw)
    if name == "block_magnitudes":
        return m.block_magnitudes(a["q"], a["k"], a["pos"], cfg, **kw)
    if name == "block_sparse_select_packed":
        return m.block_sparse_select_packed(a["q"], a["k"], a["cu"], a["sid"], a["ppos"], cfg, **kw)
    if name == "block_sparse_select_paged":
        return m.block_sparse_select_paged(a["q"], a["cache"], a["table"], a["lens"], a["sid"], a["ppos"], cfg, **kw)
    if name == "positions_of_blocks":
        return m.positions_of_blocks(a["blocks"], a["pos"], T, cfg, **kw)
    raise AssertionError(name)


ENTRY_POINTS = [
    "indexer_topk",
    "indexer_scores",
    "indexer_magnitudes",
    "indexer_topk_packed",
    "indexer_topk_paged",
    "block_sparse_select",
    "block_scores",
    "block_magnitudes",
    "block_sparse_select_packed",
    "block_sparse_select_paged",
    "positions_of_blocks",
]
INDEXER = {"indexer_topk", "indexer_scores", "indexer_magnitudes", "indexer_topk_packed", "indexer_topk_paged"}
PACKED = {"indexer_topk_packed", "block_sparse_select_packed"}
PAGED = {"indexer_topk_paged", "block_sparse_select_paged"}
# positions_of_blocks' query_pos is the rows' own (an int is every row's).
PER_QUERY_POS = {n: ("ppos" if n in PACKED | PAGED else "pos") for n in ENTRY_POINTS}

# (argument name in the refusal, input key, how it is bent) for each entry point.
BENT = []
for _name in ENTRY_POINTS:
    if _name in INDEXER:
        BENT += [(_name, "weights", "w", "transposed"), (_name, "weights", "w", "reshaped")]
    if _name in {"indexer_topk", "indexer_scores", "indexer_magnitudes", "indexer_topk_packed"}:
        BENT += [(_name, "key_scale", "scale", "reshaped")]
    if _name in PACKED | PAGED:
        BENT += [(_name, "seq_ids", "sid", "reshaped")]
    if _name in PAGED:
        BENT += [(_name, "block_table", "table", "transposed"), (_name, "block_table", "table", "reshaped")]
    if _name in {"block_sparse_select", "block_scores", "block_magnitudes"}:
        BENT += [(_name, "index_q", "k", "transposed")]  # index_k [d, T]: d disagrees with index_q's
    BENT += [(_name, "query_pos", PER_QUERY_POS[_name], "reshaped")]


def _bend(a, how):
    if how == "transposed":
        return np.ascontiguousarray(a.T)
    return np.ascontiguousarray(a.reshape(1, -1))


def _snapshot(arrays):
    return [(x, x.tobytes()) for x in arrays]


def _unchanged(snap):
    for x, b in snap:
        assert x.tobytes() == b, "a refused call changed a buffer"


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name,argument,key,how", BENT, ids=[f"{b[0]}-{b[2]}-{b[3]}" for b in BENT])
def test_a_transposed_or_reshaped_argument_is_refused_naming_it(impl, name, argument, key, how):
    a = _inputs()
    a[key] = _bend(a[key], how)
    snap = _snapshot(list(a.values()))
    with pytest.raises(_error(impl)) as e:
        _call(name, impl, a)
    assert e.value.argument == argument, str(e.value)
    if impl == "native" and argument != "index_q":
        # the shape it got and the one it needs
        assert str(list(a[key].shape)) in str(e.value), str(e.value)
        assert "must be [" in str(e.value), str(e.value)
    _unchanged(snap)


def test_transposed_weights_are_refused_naming_both_shapes():
    a = _inputs()
    with pytest.raises(ks.SelectionError, match=r"weights must be \[n_queries=3, H=2\], got \[2, 3\]"):
        ks.indexer_topk(a["q"], a["w"].T.copy(), a["k"], a["pos"], TOPK)


def _out_shape(name, a):
    return {
        "indexer_topk": (N, TOPK),
        "indexer_topk_packed": (N, TOPK),
        "indexer_topk_paged": (N, TOPK),
        "indexer_scores": (N, T),
        "indexer_magnitudes": (N, T),
        "block_sparse_select": (N, H, CFG.width),
        "block_sparse_select_packed": (N, H, CFG.width),
        "block_sparse_select_paged": (N, H, CFG.width),
        "block_scores": (N, H, T // 4),
        "block_magnitudes": (N, H, T // 4),
        "positions_of_blocks": (N, H, 2 * 4),
    }[name]


def _out_dtype(name):
    return (
        np.float32 if name in {"indexer_scores", "indexer_magnitudes", "block_scores", "block_magnitudes"} else np.int32
    )


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_an_out_of_the_transposed_shape_is_refused_naming_out(impl, name):
    a = _inputs()
    shape = _out_shape(name, a)
    out = np.full((shape[1], shape[0]) + shape[2:], 7, dtype=_out_dtype(name))
    snap = _snapshot([out] + list(a.values()))
    with pytest.raises(_error(impl)) as e:
        _call(name, impl, a, out=out)
    assert e.value.argument == "out", str(e.value)
    _unchanged(snap)


# -- byte order and alignment ---------------------------------------------

FORMATS = ["float32", "float16", "bfloat16", "float8_e4m3fn", "raw-bfloat16", "raw-float16", "raw-float8"]


def _encode(x, fmt):
    """``x`` (float32) in ``fmt``, with the format argument it needs."""
    if fmt == "float32":
        return x, None
    if fmt == "float16":
        return x.astype(np.float16), None
    if fmt == "bfloat16":
        return x.astype(ml_dtypes.bfloat16), None
    if fmt == "float8_e4m3fn":
        return x.astype(ml_dtypes.float8_e4m3fn), None
    if fmt == "raw-bfloat16":
        return x.astype(ml_dtypes.bfloat16).view(np.uint16), "bfloat16"
    if fmt == "raw-float16":
        return x.astype(np.float16).view(np.uint16), "float16"
    return x.astype(ml_dtypes.float8_e4m3fn).view(np.uint8), "float8_e4m3fn"


def _swapped(a):
    """The same values in the other byte order (a no-op for single bytes)."""
    return a.byteswap().view(a.dtype.newbyteorder("S"))


def _misaligned(a):
    """The same values in a view one byte off its dtype's alignment."""
    buf = bytearray(a.nbytes + 1)
    m = np.frombuffer(buf, a.dtype, count=a.size, offset=1).reshape(a.shape)
    m[...] = a
    return m


MULTIBYTE = [f for f in FORMATS if f not in ("float8_e4m3fn", "raw-float8")]


def _dense_calls(impl, a, fmt, bend):
    """Every dense entry point on keys and queries in ``fmt``, each bent by ``bend``."""
    m, cfg = _mod(impl), _cfg(impl)
    q, qf = _encode(a["q"], fmt)
    k, kf = _encode(a["k"], fmt)
    q, k = bend(q), bend(k)
    w, c = bend(a["w"]), bend(a["scale"])
    f = {"key_format": kf, "query_format": qf}
    return {
        "indexer_topk": m.indexer_topk(q, w, k, a["pos"], TOPK, key_scale=c, **f),
        "indexer_scores": m.indexer_scores(q, w, k, a["pos"], key_scale=c, **f),
        "indexer_magnitudes": m.indexer_magnitudes(q, w, k, a["pos"], key_scale=c, **f),
        "indexer_topk_packed": m.indexer_topk_packed(q, w, k, a["cu"], a["sid"], a["ppos"], TOPK, key_scale=c, **f),
        "block_sparse_select": m.block_sparse_select(q, k, a["pos"], cfg, **f),
        "block_scores": m.block_scores(q, k, a["pos"], cfg, **f),
        "block_magnitudes": m.block_magnitudes(q, k, a["pos"], cfg, **f),
        "block_sparse_select_packed": m.block_sparse_select_packed(q, k, a["cu"], a["sid"], a["ppos"], cfg, **f),
    }


def _bits_equal(got, want):
    for name in want:
        g, w = got[name], want[name]
        assert g.dtype == w.dtype and g.shape == w.shape, name
        assert g.tobytes() == w.tobytes(), f"{name}: different bits"


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("fmt", MULTIBYTE)
def test_dense_inputs_in_the_other_byte_order_give_the_native_bits(impl, fmt):
    a = _inputs()
    swapped = _dense_calls(impl, a, fmt, _swapped)
    assert not _swapped(a["w"]).dtype.isnative  # the case is real
    _bits_equal(swapped, _dense_calls(impl, a, fmt, lambda x: x))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_misaligned_dense_inputs_give_the_aligned_bits(impl, fmt):
    a = _inputs()
    if _encode(a["q"], fmt)[0].itemsize > 1:
        assert not _misaligned(_encode(a["q"], fmt)[0]).flags.aligned  # the case is real
    misaligned = _dense_calls(impl, a, fmt, _misaligned)
    _bits_equal(misaligned, _dense_calls(impl, a, fmt, lambda x: x))


def _paged_calls(impl, a, cache, kf):
    m, cfg = _mod(impl), _cfg(impl)
    return {
        "indexer_topk_paged": m.indexer_topk_paged(
            a["q"], a["w"], cache, a["table"], a["lens"], a["sid"], a["ppos"], TOPK, key_format=kf
        ),
        "block_sparse_select_paged": m.block_sparse_select_paged(
            a["q"], cache, a["table"], a["lens"], a["sid"], a["ppos"], cfg, key_format=kf
        ),
    }


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("fmt", MULTIBYTE)
@pytest.mark.parametrize("name", sorted(PAGED))
def test_a_paged_cache_in_the_other_byte_order_is_refused_naming_kv_cache(impl, fmt, name):
    a = _inputs()
    cache, kf = _encode(a["cache"], fmt)
    a["cache"] = _swapped(cache)
    snap = _snapshot(list(a.values()))
    with pytest.raises(_error(impl)) as e:
        _call(name, impl, a, key_format=kf)
    assert e.value.argument == "kv_cache"
    assert "newbyteorder('=')" in str(e.value)
    _unchanged(snap)


@pytest.mark.parametrize("impl", IMPLS)
def test_single_byte_pages_flagged_big_endian_are_read_as_they_are(impl):
    # Byte order means nothing for one byte: an fp8 cache whose dtype says '>' is not refused.
    a = _inputs()
    cache = a["cache"].astype(ml_dtypes.float8_e4m3fn)
    flagged = cache.view(cache.dtype.newbyteorder(">"))
    assert not flagged.dtype.isnative
    _bits_equal(_paged_calls(impl, a, flagged, None), _paged_calls(impl, a, cache, None))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_misaligned_paged_cache_gives_the_aligned_bits(impl, fmt):
    a = _inputs()
    cache, kf = _encode(a["cache"], fmt)
    _bits_equal(_paged_calls(impl, a, _misaligned(cache), kf), _paged_calls(impl, a, cache, kf))


def test_the_paged_byte_order_refusal_says_how_to_fix_it():
    a = _inputs()
    cache = _swapped(a["cache"].astype(np.float16))
    with pytest.raises(ks.SelectionError) as e:
        ks.indexer_topk_paged(a["q"], a["w"], cache, a["table"], a["lens"], a["sid"], a["ppos"], TOPK)
    fixed = cache.astype(cache.dtype.newbyteorder("="))
    assert e.value.argument == "kv_cache" and ".astype(kv_cache.dtype.newbyteorder('='))" in str(e.value)
    want = ks.indexer_topk_paged(
        a["q"], a["w"], a["cache"].astype(np.float16), a["table"], a["lens"], a["sid"], a["ppos"], TOPK
    )
    got = ks.indexer_topk_paged(a["q"], a["w"], fixed, a["table"], a["lens"], a["sid"], a["ppos"], TOPK)
    assert np.array_equal(got, want)


# -- counts ---------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
def test_a_str_topk_is_a_clean_type_error(impl):
    a = _inputs()
    with pytest.raises(TypeError) as e:
        _mod(impl).indexer_topk(a["q"], a["w"], a["k"], a["pos"], "5")
    assert str(e.value) == "topk must be an integer, got str"


def test_no_count_type_error_repeats_type_error_inside_it():
    a = _inputs()
    for bad in ("5", 5.0, None, [5]):
        with pytest.raises(TypeError) as e:
            ks.indexer_topk(a["q"], a["w"], a["k"], a["pos"], bad)
        assert "TypeError" not in str(e.value), str(e.value)
        assert str(e.value).startswith("topk must be an integer, got "), str(e.value)


# -- scalar query_pos ------------------------------------------------------

SCALAR_POS = [n for n in ENTRY_POINTS if n != "positions_of_blocks"]


def _one_query(a):
    """The canonical inputs cut to the first query (its sequence's)."""
    b = dict(a)
    b["q"], b["w"] = a["q"][:1], a["w"][:1]
    b["sid"] = a["sid"][:1]
    b["blocks"] = a["blocks"][:1]
    return b


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", SCALAR_POS)
def test_a_scalar_query_pos_is_the_same_as_a_batch_of_one(impl, name):
    a = _one_query(_inputs())
    key = PER_QUERY_POS[name]
    p = int(a[key][0])
    a[key] = np.array([p])
    want = _call(name, impl, a)
    assert want.shape[0 if name != "block_sparse_select" else 0] == 1
    for scalar in (p, np.int64(p), np.array(p)):
        a[key] = scalar
        got = _call(name, impl, a)
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes() and got.shape == want.shape, name


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", SCALAR_POS)
def test_a_scalar_query_pos_with_several_queries_is_refused(impl, name):
    a = _inputs()
    a[PER_QUERY_POS[name]] = 4
    with pytest.raises(_error(impl)) as e:
        _call(name, impl, a)
    assert e.value.argument == "query_pos"


@pytest.mark.parametrize("impl", IMPLS)
def test_positions_of_blocks_keeps_an_int_query_pos_for_every_row(impl):
    a = _inputs()
    a["pos"] = 9
    got = _call("positions_of_blocks", impl, a)
    a["pos"] = np.array([9, 9, 9])
    assert np.array_equal(got, _call("positions_of_blocks", impl, a))


# -- out= -----------------------------------------------------------------

OUT_CONTRACT = ["indexer_scores", "indexer_magnitudes", "block_scores", "block_magnitudes", "positions_of_blocks"]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", OUT_CONTRACT)
def test_out_is_returned_and_equals_the_call_without_it(impl, name):
    a = _inputs()
    want = _call(name, impl, a)
    out = np.full(want.shape, 7, dtype=want.dtype)
    got = _call(name, impl, a, out=out)
    assert got is out
    assert out.tobytes() == want.tobytes()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", OUT_CONTRACT)
def test_an_out_of_the_wrong_dtype_is_a_type_error(impl, name):
    a = _inputs()
    wrong = np.float64 if _out_dtype(name) == np.float32 else np.int64
    out = np.full(_out_shape(name, a), 7, dtype=wrong)
    snap = _snapshot([out] + list(a.values()))
    with pytest.raises(TypeError, match="^out must"):
        _call(name, impl, a, out=out)
    _unchanged(snap)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", OUT_CONTRACT)
def test_an_out_of_the_wrong_shape_is_refused_naming_out(impl, name):
    a = _inputs()
    shape = _out_shape(name, a)
    out = np.full((shape[0] + 1,) + shape[1:], 7, dtype=_out_dtype(name))
    snap = _snapshot([out] + list(a.values()))
    with pytest.raises(_error(impl)) as e:
        _call(name, impl, a, out=out)
    assert e.value.argument == "out"
    _unchanged(snap)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", OUT_CONTRACT)
def test_an_out_aliasing_an_input_is_refused(impl, name):
    a = _inputs()
    shape = _out_shape(name, a)
    dtype = _out_dtype(name)
    size = int(np.prod(shape))
    # One buffer holds the input (at its start) and the output over it.
    if dtype == np.float32:
        q = a["q"].ravel()
        buf = np.zeros(max(size, q.size), np.float32)
        buf[: q.size] = q
        a["q"] = buf[: q.size].reshape(a["q"].shape)
    else:
        blocks = a["blocks"].ravel()
        buf = np.zeros(max(size, blocks.size), np.int32)
        buf[: blocks.size] = blocks
        a["blocks"] = buf[: blocks.size].reshape(a["blocks"].shape)
    out = buf[:size].reshape(shape)
    before = buf.tobytes()
    with pytest.raises(_error(impl)) as e:
        _call(name, impl, a, out=out)
    assert e.value.argument == "out"
    assert buf.tobytes() == before


@pytest.mark.parametrize("impl", IMPLS)
def test_1d_positions_of_blocks_takes_no_out(impl):
    out = np.zeros(8, np.int32)
    with pytest.raises(_error(impl)) as e:
        _mod(impl).positions_of_blocks(np.array([0, 1], np.int32), 9, 12, _cfg(impl), out=out)
    assert e.value.argument == "out"
    assert not out.any()


# -- an out= sharing memory with an argument read through a copy -------------
# query_pos, seq_ids and cu_seqlens are copied before anything is written, but
# no input may alias an output whatever the core does with it (one rule for
# every argument, as the attention functions and the witness metrics keep it).


class _ArrayInterface:
    """An array NumPy reads through ``__array_interface__`` alone (a view of ``a``)."""

    def __init__(self, a: np.ndarray) -> None:
        self._a = a
        self.__array_interface__ = a.__array_interface__


# The forms the positions come as: each a view of the same memory.
FORMS = {"ndarray": lambda a: a, "memoryview": memoryview, "array-interface": _ArrayInterface}


def _aliased_calls(m, form):
    cfg = ks.BlockSparseConfig(4, 2, 1, 1)
    q3, k = np.ones((2, 1, 4), np.float32), np.ones((16, 4), np.float32)
    qi, w = np.ones((2, 3, 4), np.float32), np.ones((2, 3), np.float32)

    def block(buf):
        pos = buf.reshape(-1)[:2]
        pos[:] = [5, 9]
        return lambda: m.block_sparse_select(q3, k, form(pos), cfg, out=buf)

    def packed(buf):
        sid = buf.reshape(-1)[:2]
        sid[:] = 0
        return lambda: m.block_sparse_select_packed(q3, k, [0, 16], form(sid), [5, 9], cfg, out=buf)

    def indexer(buf):
        pos = buf.reshape(-1)[:2]
        pos[:] = [3, 7]
        return lambda: m.indexer_topk(qi, w, k, form(pos), 2, out=buf)

    def indexer_packed(buf):
        cu = buf.reshape(-1)[:2]
        cu[:] = [0, 16]
        return lambda: m.indexer_topk_packed(qi, w, k, form(cu), [0, 0], [3, 7], 2, out=buf)

    def positions(buf):
        pos = buf.reshape(-1)[:2]
        pos[:] = [5, 9]
        blocks = np.array([[0, 1], [1, 2]], np.int32)
        return lambda: m.positions_of_blocks(blocks, form(pos), 12, cfg, out=buf)

    return [
        (block, (2, 1, 2)),
        (packed, (2, 1, 2)),
        (indexer, (2, 2)),
        (indexer_packed, (2, 2)),
        (positions, (2, 8)),
    ]


@pytest.mark.parametrize("impl", ["native", "reference"])
@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("case", range(5))
def test_an_out_sharing_memory_with_positions_is_refused_naming_out(impl, form, case):
    # Whatever object the positions come as, their memory is an input's.
    m = ks if impl == "native" else ref
    make, shape = _aliased_calls(m, FORMS[form])[case]
    buf = np.zeros(shape, np.int32)
    call = make(buf)
    before = buf.copy()
    with pytest.raises(ks.SelectionError if impl == "native" else ref.ReferenceSelectionError) as e:
        call()
    assert e.value.argument == "out", str(e.value)
    assert np.array_equal(buf, before)


@pytest.mark.parametrize("impl", ["native", "reference"])
def test_a_float64_paged_cache_is_a_type_error(impl):
    # Pages are read in place, never converted (test_conventions_inputs_rules.py holds
    # the other rules' paged forms to the same).
    m = ks if impl == "native" else ref
    rng = np.random.default_rng(45)
    q = rng.standard_normal((2, 2, 3)).astype(np.float32)
    w = np.ones((2, 2), np.float32)
    pages, table = rng.standard_normal((3, 4, 3)), np.array([[0, 1]], np.int32)
    cfg = ks.BlockSparseConfig(4, 1, 1, 1)
    calls = [
        lambda: m.indexer_topk_paged(q, w, pages, table, [5], [0, 0], [3, 4], 2),
        lambda: m.block_sparse_select_paged(q[:, :1].copy(), pages, table, [5], [0, 0], [3, 4], cfg),
    ]
    for call in calls:
        with pytest.raises(TypeError, match="^kv_cache has dtype float64, and is read in place"):
            call()


@pytest.mark.parametrize("impl", ["native", "reference"])
@pytest.mark.parametrize("argument", ["key_format", "query_format"])
def test_an_unknown_format_name_is_refused_naming_its_argument(impl, argument):
    # A bad value of a str parameter, as page_layout: a refusal naming it, not
    # an anonymous TypeError.
    m = ks if impl == "native" else ref
    error = ks.SelectionError if impl == "native" else ref.ReferenceSelectionError
    q, w, k = np.ones((1, 2, 4), np.float32), np.ones((1, 2), np.float32), np.ones((8, 4), np.float32)
    calls = [
        lambda **f: m.indexer_topk(q, w, k, [3], 2, **f),
        lambda **f: m.block_sparse_select(q[:, :1], k, [3], ks.BlockSparseConfig(4, 1, 0, 1), **f),
    ]
    for call in calls:
        with pytest.raises(error) as e:
            call(**{argument: "bfloat12"})
        assert e.value.argument == argument and "bfloat12" in str(e.value)
