"""DLPack arguments: read in place, bit for bit the NumPy call, deleter once.

The producers are ctypes structs over NumPy buffers (dlpack_producers.py)
and NumPy's own ``__dlpack__``; no test needs torch.
"""

import gc
import re

import numpy as np
import pytest
from dlpack_producers import K_DL_CUDA, NumpyExport, Producer, bf16_bits, fp8_bytes

import kvselect
import kvselect.testing as kt


def _indexer(seed=0, n=3, h=4, d=16, t=200):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n, h, d), dtype=np.float32)
    w = rng.standard_normal((n, h), dtype=np.float32)
    k = rng.standard_normal((t, d), dtype=np.float32)
    pos = np.array([t // 3, t // 2, t - 1][:n], dtype=np.int64)
    return rng, q, w, k, pos


def test_numpys_own_dlpack_export_gives_the_numpy_result_for_every_argument():
    _, q, w, k, pos = _indexer()
    want = kvselect.indexer_topk(q, w, k, pos, 16)
    got = kvselect.indexer_topk(NumpyExport(q), NumpyExport(w), NumpyExport(k), NumpyExport(pos), 16)
    assert type(got) is np.ndarray
    assert np.array_equal(got, want)


def test_bfloat16_keys_are_read_as_bfloat16_without_key_format():
    _, q, w, k, pos = _indexer(1)
    bits = bf16_bits(k)
    want = kvselect.indexer_topk(q, w, bits, pos, 16, key_format="bfloat16")
    got = kvselect.indexer_topk(q, w, Producer(bits, dtype="bfloat16"), pos, 16)
    assert np.array_equal(got, want)
    # The same bits claimed as float16 give another answer: the dtype decided.
    as_f16 = kvselect.indexer_topk(q, w, bits, pos, 16, key_format="float16")
    assert not np.array_equal(as_f16, want)


def test_float8_keys_and_queries_are_read_as_e4m3fn_bit_for_bit():
    rng, _, w, _, pos = _indexer(2)
    k8, q8 = fp8_bytes(rng, (200, 16)), fp8_bytes(rng, (3, 4, 16))
    want = kvselect.indexer_topk(q8, w, k8, pos, 16, key_format="float8_e4m3fn", query_format="float8_e4m3fn")
    got = kvselect.indexer_topk(Producer(q8, dtype="float8_e4m3fn"), w, Producer(k8, dtype="float8_e4m3fn"), pos, 16)
    assert np.array_equal(got, want)


def test_a_dtype_that_disagrees_with_key_format_is_refused():
    _, q, w, k, pos = _indexer(3)
    with pytest.raises(TypeError, match=r"^index_k has dtype bfloat16, which does not hold float16 \(key_format\)"):
        kvselect.indexer_topk(q, w, Producer(bf16_bits(k), dtype="bfloat16"), pos, 16, key_format="float16")


def test_block_selection_from_bfloat16_producers_equals_the_numpy_call():
    rng = np.random.default_rng(4)
    q, k = (
        bf16_bits(rng.standard_normal((2, 32), dtype=np.float32)),
        bf16_bits(rng.standard_normal((1024, 32), dtype=np.float32)),
    )
    cfg = kvselect.BlockSparseConfig(block_size=64, top_blocks=4, init_blocks=1, local_blocks=1)
    want = kvselect.block_sparse_select(q, k, 1000, cfg, key_format="bfloat16", query_format="bfloat16")
    got = kvselect.block_sparse_select(Producer(q, dtype="bfloat16"), Producer(k, dtype="bfloat16"), 1000, cfg)
    assert np.array_equal(got, want)


def test_witnesses_are_written_in_place_into_the_producers_memory():
    rng = np.random.default_rng(5)
    rows = rng.integers(0, 4096, size=(8, 64), dtype=np.int32)
    lens = np.full(8, 4096, dtype=np.int64)
    want = rows.copy()
    kvselect.scatter_topology_witnesses(want, lens, 16)
    buf = rows.copy()
    p = Producer(buf)
    kvselect.scatter_topology_witnesses(p, Producer(lens), 16)
    assert np.array_equal(buf, want) and not np.array_equal(buf, rows)


def test_out_through_dlpack_is_written_zero_copy_and_returned_over_the_same_memory():
    _, q, w, k, pos = _indexer(6)
    want = kvselect.indexer_topk(q, w, k, pos, 16)
    buf = np.full_like(want, -7)
    got = kvselect.indexer_topk(q, w, k, pos, 16, out=Producer(buf))
    assert np.array_equal(buf, want)
    assert np.shares_memory(got, buf)


def test_every_export_is_deleted_exactly_once_when_the_call_is_done():
    _, q, w, k, pos = _indexer(7)
    ps = [Producer(a) for a in (q, w, k, pos)]
    out = Producer(np.zeros((3, 16), dtype=np.int32))
    res = kvselect.indexer_topk(*ps, 16, out=out)
    del res
    gc.collect()
    for p in ps[:3]:
        assert (p.exports, p.deletes) == (1, 1)
    # query_pos is exported once for its values and once for the aliasing check.
    for p in (ps[3], out):
        assert p.exports >= 1 and p.deletes == p.exports


def test_the_producers_memory_stays_alive_while_a_result_views_it():
    _, q, w, k, pos = _indexer(8)
    buf = np.zeros((3, 16), dtype=np.int32)
    p = Producer(buf)
    got = kvselect.indexer_topk(q, w, k, pos, 16, out=p)
    gc.collect()
    assert p.deletes == 0  # `got` views the producer's memory
    del got
    gc.collect()
    assert p.deletes == p.exports == 1


def test_a_gpu_tensor_is_refused_naming_cpu_before_anything_is_exported_or_written():
    _, q, w, k, pos = _indexer(9)
    buf = np.full((3, 16), -7, dtype=np.int32)
    gpu = Producer(k, device=(K_DL_CUDA, 0))
    with pytest.raises(kvselect.SelectionError, match=r"index_k is on cuda.*index_k\.cpu\(\)") as e:
        kvselect.indexer_topk(q, w, gpu, pos, 16, out=buf)
    assert e.value.argument == "index_k"
    assert gpu.exports == 0 and (buf == -7).all()


def test_a_read_only_tensor_is_refused_as_out_and_left_untouched():
    _, q, w, k, pos = _indexer(10)
    buf = np.full((3, 16), -7, dtype=np.int32)
    with pytest.raises(kvselect.SelectionError, match="out is read-only") as e:
        kvselect.indexer_topk(q, w, k, pos, 16, out=Producer(buf, read_only=True))
    assert e.value.argument == "out"
    assert (buf == -7).all()


def test_a_read_only_tensor_is_read_as_an_input():
    _, q, w, k, pos = _indexer(11)
    want = kvselect.indexer_topk(q, w, k, pos, 16)
    assert np.array_equal(kvselect.indexer_topk(q, w, Producer(k, read_only=True), pos, 16), want)


def test_a_raising_dlpack_surfaces_naming_the_argument_with_the_cause():
    _, q, w, k, pos = _indexer(12)
    with pytest.raises(kvselect.SelectionError, match=r"weights\.__dlpack__\(\) raised RuntimeError: boom") as e:
        kvselect.indexer_topk(q, Producer(w, raises=RuntimeError("boom")), k, pos, 16)
    assert isinstance(e.value.__cause__, RuntimeError)
    assert e.value.argument == "weights"


def test_a_legacy_producer_without_max_version_gets_a_legacy_capsule():
    _, q, w, k, pos = _indexer(13)
    p = Producer(k, legacy=True)
    got = kvselect.indexer_topk(q, w, p, pos, 16)
    assert np.array_equal(got, kvselect.indexer_topk(q, w, k, pos, 16))
    assert p.versions == [None] and p.deletes == 1


def test_a_versioned_producer_is_asked_for_dlpack_1_3():
    _, q, w, k, pos = _indexer(14)
    p = Producer(k)
    kvselect.indexer_topk(q, w, p, pos, 16)
    assert p.versions == [(1, 3)]


def test_a_bare_capsule_is_refused():
    _, q, w, k, pos = _indexer(15)
    with pytest.raises(TypeError, match="^index_k is a bare PyCapsule"):
        kvselect.indexer_topk(q, w, k.__dlpack__(), pos, 16)


def test_an_unsupported_dtype_is_a_type_error_and_its_capsule_is_deleted():
    _, q, w, k, pos = _indexer(16)
    p = Producer(k.view(np.complex64), dtype="complex64")
    with pytest.raises(TypeError, match="^index_k has an unsupported DLPack dtype"):
        kvselect.indexer_topk(q, w, p, pos, 16)
    gc.collect()
    assert p.deletes == p.exports == 1


@pytest.mark.parametrize("kind", ["negative", "zero", "padded"])
def test_strided_inputs_are_copied_once_and_give_the_numpy_result(kind):
    _, q, w, k, pos = _indexer(17)
    t, d = k.shape
    if kind == "negative":  # rows in reverse: the last row first, stride -d
        buf, shape, strides, off = k[::-1].copy(), (t, d), (-d, 1), (t - 1) * d * 4
    elif kind == "zero":  # one row broadcast over every key
        k = np.broadcast_to(k[:1], k.shape)
        buf, shape, strides, off = np.ascontiguousarray(k[:1]), (t, d), (0, 1), 0
    else:  # every other row of a buffer twice as tall
        buf = np.zeros((2 * t, d), dtype=np.float32)
        buf[::2] = k
        shape, strides, off = (t, d), (2 * d, 1), 0
    want = kvselect.indexer_topk(q, w, np.ascontiguousarray(k), pos, 16)
    got = kvselect.indexer_topk(q, w, Producer(buf, shape=shape, strides=strides, byte_offset=off), pos, 16)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("strides", [(-16, 1), (0, 1)], ids=["negative", "zero"])
def test_a_strided_out_is_refused_and_left_untouched(strides):
    _, q, w, k, pos = _indexer(18)
    buf = np.full((3, 16), -7, dtype=np.int32)
    off = 2 * 16 * 4 if strides[0] < 0 else 0
    with pytest.raises(kvselect.SelectionError, match="out is not C-contiguous") as e:
        kvselect.indexer_topk(q, w, k, pos, 16, out=Producer(buf, shape=(3, 16), strides=strides, byte_offset=off))
    assert e.value.argument == "out"
    assert (buf == -7).all()


def test_a_byte_offset_selects_the_tensor_within_the_buffer():
    _, q, w, k, pos = _indexer(19)
    buf = np.concatenate([np.full((5, 16), np.nan, dtype=np.float32), k])
    got = kvselect.indexer_topk(q, w, Producer(buf, shape=k.shape, byte_offset=5 * 16 * 4), pos, 16)
    assert np.array_equal(got, kvselect.indexer_topk(q, w, k, pos, 16))


def test_a_misaligned_byte_offset_is_read_through_one_aligned_copy():
    _, q, w, k, pos = _indexer(20)
    raw = np.zeros(k.nbytes + 8, dtype=np.uint8)
    raw[1 : 1 + k.nbytes] = k.view(np.uint8).ravel()
    got = kvselect.indexer_topk(q, w, Producer(raw, dtype="float32", shape=k.shape, byte_offset=1), pos, 16)
    assert np.array_equal(got, kvselect.indexer_topk(q, w, k, pos, 16))


def test_an_output_aliasing_a_dlpack_input_is_refused():
    _, _, w, k, _ = _indexer(21)
    buf = np.zeros((3, 16), dtype=np.int32)
    q_alias = Producer(buf.view(np.float32).reshape(3, 1, 16))
    with pytest.raises(kvselect.SelectionError, match="^out overlaps another argument's memory") as e:
        kvselect.indexer_topk(q_alias, w[:, :1], k, np.array([10, 20, 30]), 16, out=Producer(buf))
    assert e.value.argument == "out"
    assert (buf == 0).all()


def test_assert_topk_reads_a_bfloat16_dlpack_producer():
    _, q, w, k, pos = _indexer(22)
    bits = bf16_bits(k)
    rows = kvselect.indexer_topk(q, w, bits, pos, 16, key_format="bfloat16")
    report = kt.assert_topk(rows, q, w, Producer(bits, dtype="bfloat16"), pos, precision="bfloat16")
    assert report["wrong"] == 0 and report["rows"] == 3
    bad = rows.copy()
    bad[:, 0] = bad[:, 1]
    with pytest.raises(AssertionError, match="assert_topk"):
        kt.assert_topk(bad, q, w, Producer(bits, dtype="bfloat16"), pos, precision="bfloat16")


# -- Hostile producers: every refusal is the entry point's domain error, naming the argument --

# name: (the producer's hostility, what the message says after "<argument>.")
HOSTILE = {
    "major-99": ({"version": (99, 0)}, r"__dlpack__\(\) returned a DLPack 99\.0 capsule: kvselect reads DLPack 1\.x"),
    "major-0-versioned": ({"version": (0, 8)}, r"__dlpack__\(\) returned a DLPack 0\.8 capsule"),
    "consumed-versioned": (
        {"capsule_name": b"used_dltensor_versioned"},
        r"__dlpack__\(\) returned a capsule that was already consumed \(named 'used_dltensor_versioned'\)",
    ),
    "consumed-legacy": (
        {"legacy": True, "capsule_name": b"used_dltensor"},
        r"__dlpack__\(\) returned a capsule that was already consumed \(named 'used_dltensor'\)",
    ),
    "wrong-name": (
        {"capsule_name": b"not_a_dltensor"},
        r"__dlpack__\(\) returned a PyCapsule named 'not_a_dltensor', not a DLPack capsule",
    ),
    "not-a-capsule": ({"returns": 3}, r"__dlpack__\(\) returned int, not a DLPack capsule"),
    "device-not-a-pair": ({"device": "cpu"}, r"__dlpack_device__\(\) must return \(device_type, device_id\)"),
    "device-raises": ({"device": RuntimeError("no device")}, r"__dlpack_device__\(\) raised RuntimeError: no device"),
}


def _entry_points():
    """(name, domain error, argument, build) with build(make) -> (call, watched buffers):
    selection and witness entry points, inputs and an in-place buffer, and kvselect.testing."""
    _, q, w, k, pos = _indexer(30)
    learned = np.array([[0, 5, -1, -1], [3, -1, -1, -1]], dtype=np.int32)
    lens = np.array([8, 6], dtype=np.int32)
    cfg = kvselect.BlockSparseConfig(block_size=16, top_blocks=2, init_blocks=1, local_blocks=1)

    def indexer(make):
        out = np.full((3, 16), -7, dtype=np.int32)
        return (lambda: kvselect.indexer_topk(q, w, make(k), pos, 16, out=out)), [out]

    def blocks(make):
        want = kvselect.block_sparse_select(q[:, :1], k, pos, cfg)
        out = np.full_like(want, -7)
        return (lambda: kvselect.block_sparse_select(make(q[:, :1]), k, pos, cfg, out=out)), [out]

    def witness_indices(make):
        out = np.full((2, 4), -7, dtype=np.int32)
        return (lambda: kvselect.topology_witness_indices(make(learned), lens, 4, out=out)), [out]

    def scatter(make):
        rows = np.random.default_rng(31).integers(0, 4096, size=(8, 64), dtype=np.int32)
        n = np.full(8, 4096, dtype=np.int64)
        return (lambda: kvselect.scatter_topology_witnesses(make(rows), n, 16)), [rows]

    def assert_topk(make):
        rows = kvselect.indexer_topk(q, w, k, pos, 16)
        return (lambda: kt.assert_topk(rows, q, w, make(k), pos)), [rows]

    return {
        "indexer_topk": (kvselect.SelectionError, "index_k", indexer),
        "kvselect.testing.assert_topk": (kvselect.SelectionError, "index_k", assert_topk),
        "block_sparse_select": (kvselect.SelectionError, "index_q", blocks),
        "topology_witness_indices": (kvselect.WitnessError, "learned", witness_indices),
        "scatter_topology_witnesses": (kvselect.WitnessError, "topk_indices", scatter),
    }


_HOSTILE_CALLS = [(how, entry) for how in HOSTILE for entry in _entry_points()]


@pytest.mark.parametrize(("how", "entry"), _HOSTILE_CALLS)
def test_a_hostile_producer_is_refused_naming_the_argument_and_nothing_is_written(how, entry):
    error, argument, build = _entry_points()[entry]
    made = []

    def make(a):
        made.append(Producer(a, **HOSTILE[how][0]))
        return made[-1]

    call, watched = build(make)
    before = [b.tobytes() for b in watched]
    with pytest.raises(error, match="^" + re.escape(argument) + r"\." + HOSTILE[how][1]) as e:
        call()
    assert e.value.argument == argument and e.value.variant is None
    assert [b.tobytes() for b in watched] == before
    gc.collect()
    (p,) = made
    if how.startswith("major"):
        # Another major version: deleted unread, as the spec asks, once.
        assert (p.exports, p.deletes) == (1, 1)
        assert isinstance(e.value.__cause__, RuntimeError)
    elif how.startswith(("consumed", "wrong")):
        # Not kvselect's to delete: a consumed capsule's tensor is its consumer's.
        assert (p.exports, p.deletes) == (1, 0)
    elif how.startswith("device"):
        assert p.exports == 0 and isinstance(e.value.__cause__, Exception)


def test_a_producer_that_hands_out_one_capsule_twice_is_refused_the_second_time():
    # The realistic consumed capsule: a cached export, read once already.
    _, q, w, k, pos = _indexer(32)
    cap = w.__dlpack__()

    class Cached:
        def __dlpack__(self, **kwargs):
            return cap

        def __dlpack_device__(self):
            return w.__dlpack_device__()

    want = kvselect.indexer_topk(q, w, k, pos, 16)
    assert np.array_equal(kvselect.indexer_topk(q, Cached(), k, pos, 16), want)
    gc.collect()
    with pytest.raises(
        kvselect.SelectionError, match=r"^weights\.__dlpack__\(\) returned a capsule that was already"
    ) as e:
        kvselect.indexer_topk(q, Cached(), k, pos, 16)
    assert e.value.argument == "weights"


@pytest.mark.parametrize(
    ("shape", "strides", "says"),
    [
        ((100, 16), (2**62, 1), "index_k's DLPack layout overflows"),
        ((2**40, 2**40), (1, 1), "index_k's DLPack tensor is invalid: number of elements overflows"),
    ],
    ids=["byte-extent", "element-count"],
)
def test_a_descriptor_that_overflows_is_refused_naming_the_argument_and_deleted(shape, strides, says):
    _, q, w, k, pos = _indexer(33)
    p = Producer(k, shape=shape, strides=strides)
    with pytest.raises(kvselect.SelectionError, match="^" + re.escape(says)) as e:
        kvselect.indexer_topk(q, w, p, pos, 16)
    assert e.value.argument == "index_k"
    gc.collect()
    assert p.deletes == p.exports == 1
