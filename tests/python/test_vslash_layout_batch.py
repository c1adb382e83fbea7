"""The later form of the engines' vertical-slash layout (vLLM
``_custom_ops.convert_vertical_slash_indexes``, SGLang ``sgl_kernel``):
``kvselect.vslash_layout_batch`` against a hand-worked case, against the NumPy
twin written from the CUDA source on hundreds of random seeded batches (short
sequences, fewer keys than queries, causal and not, offsets past the keys),
against MInference's own form where the source says they agree, and its
refusals.
"""

from __future__ import annotations

import numpy as np
import pytest

import kvselect as ks
import kvselect.reference as ref
from kvselect.reference._args import ReferenceSelectionError

SEED = 4242


def _same(got, want):
    assert len(got) == len(want) == 4
    for a, b in zip(got, want):
        assert a.dtype == np.int32 and a.shape == b.shape
        assert np.array_equal(a, b)


def test_a_hand_worked_batch():
    # One sequence of 100 queries over 300 keys: query i sits at key 200 + i.
    v, s = np.array([[[290, 5, 150]]], np.int32), np.array([[[10, 0, 120]]], np.int32)
    # Block 0 (keys 200..263): offset 120 covers [80, 144), 10 opens [190, 254),
    # 0 extends it to [190, 318), clipped to the 300 keys; columns 5 and 150 lie
    # below the ranges, 290 inside. 200 rows of context: blocks 2 and 3 are past
    # the queries and stay 0.
    got = ks.vslash_layout_batch(v, s, [100], [300], context_size=200)
    want = (
        np.array([[[3, 2, 0, 0]]]),
        np.array([[[[80, 190, 254], [144, 254, 0], [0, 0, 0], [0, 0, 0]]]]),
        np.array([[[2, 1, 0, 0]]]),
        np.array([[[[5, 150, 0], [5, 0, 0], [0, 0, 0], [0, 0, 0]]]]),
    )
    _same(got, want)
    _same(ref.vslash_layout_batch(v, s, [100], [300], context_size=200), got)
    # Not causal (queries as if at keys 300 + i): block 1's offsets below its
    # first query (10, 0) end its list; both columns stay listed.
    got = ks.vslash_layout_batch(v, s, [100], [300], causal=False)
    want = (
        np.array([[[2, 1]]]),
        np.array([[[[180, 290, 0], [244, 0, 0]]]]),
        np.array([[[2, 2]]]),
        np.array([[[[5, 150, 0], [5, 150, 0]]]]),
    )
    _same(got, want)
    _same(ref.vslash_layout_batch(v, s, [100], [300], causal=False), got)


def _random_batch(rng):
    n, h = int(rng.integers(1, 4)), int(rng.integers(1, 3))
    nv, ns = int(rng.integers(1, 9)), int(rng.integers(1, 9))
    short = rng.random() < 0.3
    top = 70 if short else 400
    q = rng.integers(0 if rng.random() < 0.2 else 1, top, n)
    kv = rng.integers(1, top, n)  # fewer keys than queries about half the time
    v = np.stack([rng.integers(0, kv[b], (h, nv)) for b in range(n)]).astype(np.int32)
    reach = int(kv.max() + q.max()) + 130  # offsets past the keys and the queries too
    s = rng.integers(0, reach, (n, h, ns)).astype(np.int32)
    if rng.random() < 0.5:
        s[..., 0] = rng.integers(0, 64, (n, h))  # a near diagonal, as the rule forces
    ctx = None if rng.random() < 0.5 else int(q.max()) + int(rng.integers(0, 200))
    return v, s, q, kv, ctx, bool(rng.random() < 0.5)


def test_equals_the_twin_on_random_batches():
    rng = np.random.default_rng(SEED)
    kinds = {"causal": 0, "not causal": 0, "kv < q": 0, "empty rows": 0, "clipped": 0}
    for _ in range(600):
        v, s, q, kv, ctx, causal = _random_batch(rng)
        got = ks.vslash_layout_batch(v, s, q, kv, context_size=ctx, causal=causal)
        _same(got, ref.vslash_layout_batch(v, s, q, kv, context_size=ctx, causal=causal))
        bc, bo, cc, ci = got
        rows = bc.shape[2]
        b = int(rng.integers(0, len(q)))  # a sequence's rows depend on it alone
        one = ks.vslash_layout_batch(
            v[b : b + 1], s[b : b + 1], q[b : b + 1], kv[b : b + 1], context_size=rows * 64, causal=causal
        )
        _same(one, tuple(x[b : b + 1] for x in got))
        assert rows == -(-(int(q.max()) if ctx is None else ctx) // 64)
        for b in range(len(q)):
            live = -(-int(q[b]) // 64)
            # the rows the source never writes are zeros, and the written ones list
            # blocks inside the keys (the start may precede 0: a block before the
            # sequence when kv < q) and columns of the sequence
            assert not bc[b, :, live:].any() and not bo[b, :, live:].any()
            assert not cc[b, :, live:].any() and not ci[b, :, live:].any()
            kinds["empty rows"] += live < rows
            for j in range(v.shape[1]):
                for m in range(live):
                    blocks = bo[b, j, m, : bc[b, j, m]]
                    assert np.all(blocks < kv[b]) and np.all(np.diff(blocks) > 0)
                    assert set(ci[b, j, m, : cc[b, j, m]].tolist()) <= set(v[b, j].tolist())
        kinds["causal" if causal else "not causal"] += 1
        kinds["kv < q"] += bool(np.any(kv < q))
        kinds["clipped"] += bool(np.any(s > kv.max()))
    assert min(kinds.values()) >= 50, kinds


def test_one_sequence_equals_minference_with_blocks_past_the_keys_dropped():
    """One sequence, ``q_seqlen = kv_seqlen = L``, causal, an offset below 64 in every
    head (MInference's form needs one): the later kernel makes the same choices
    (the skip loop stops at the same offset, the list ends the same way, the spent
    column is the same ``end + 64``); it only clips each range to the keys, so it
    equals MInference's layout with the block starts ``>= L`` dropped."""
    rng = np.random.default_rng(SEED + 1)
    differ = 0
    for _ in range(400):
        L = int(rng.integers(1, 500))
        h, nv, ns = int(rng.integers(1, 3)), int(rng.integers(1, 9)), int(rng.integers(1, 9))
        v = rng.integers(0, L, (h, nv)).astype(np.int32)
        s = rng.integers(0, L, (h, ns)).astype(np.int32)
        s[:, 0] = rng.integers(0, min(L, 64), h)
        obc, obo, occ, oci = ks.vslash_layout(v, s, L)
        bc, bo, cc, ci = ks.vslash_layout_batch(v[None], s[None], [L], [L])
        assert np.array_equal(cc[0], occ) and np.array_equal(ci[0], oci)
        for j in range(h):
            for m in range(obc.shape[1]):
                kept = [x for x in obo[j, m, : obc[j, m]] if x < L]
                differ += len(kept) < obc[j, m]
                assert bo[0, j, m, : bc[0, j, m]].tolist() == kept
                assert not bo[0, j, m, bc[0, j, m] :].any()
    assert differ > 0  # the clip is exercised
    # The smallest such case: L = 66, offsets 0 and 60; block 1's range [4, 132)
    # lists the block at 68 in MInference's form, past the 66 keys.
    v, s = np.array([[1]], np.int32), np.array([[0, 60]], np.int32)
    assert ks.vslash_layout(v, s, 66)[1][0, 1].tolist() == [4, 68]
    assert ks.vslash_layout_batch(v[None], s[None], [66], [66])[1][0, 0, 1].tolist() == [4, 0]


@pytest.mark.parametrize(
    "kwargs, arg",
    [
        ({"vertical": np.zeros((1, 1, 0), np.int32)}, "vertical"),
        ({"vertical": np.zeros((1, 1), np.int32)}, "vertical"),
        ({"slash": np.zeros((1, 1, 0), np.int32)}, "slash"),
        ({"slash": np.zeros((2, 1, 1), np.int32)}, "slash"),
        ({"q_seqlens": [10, 10]}, "q_seqlens"),
        ({"q_seqlens": [-1]}, "q_seqlens"),
        ({"kv_seqlens": [0]}, "kv_seqlens"),
        ({"kv_seqlens": [2**31]}, "kv_seqlens"),
        ({"q_seqlens": [65], "context_size": 64}, "context_size"),
        ({"context_size": -1}, "context_size"),
        ({"vertical": np.array([[[20]]], np.int32)}, "vertical"),  # past the 20 keys
        ({"vertical": np.array([[[-1]]], np.int32)}, "vertical"),
        ({"slash": np.array([[[-3]]], np.int32)}, "slash"),
    ],
)
def test_refusals_name_the_argument(kwargs, arg):
    call = {
        "vertical": np.array([[[3]]], np.int32),
        "slash": np.array([[[0]]], np.int32),
        "q_seqlens": [10],
        "kv_seqlens": [20],
    }
    call.update(kwargs)
    before = {k: np.array(x, copy=True) for k, x in call.items()}
    with pytest.raises(ks.SelectionError, match=arg) as e:
        ks.vslash_layout_batch(**call)
    assert e.value.argument == arg
    assert all(np.array_equal(np.asarray(call[k]), before[k]) for k in call)
    with pytest.raises(ReferenceSelectionError) as r:
        ref.vslash_layout_batch(**call)
    assert r.value.argument == arg


def _catalogue_inputs():
    rng = np.random.default_rng(SEED + 1)
    v = np.sort(rng.integers(0, 100, (2, 3, 4)), axis=-1).astype(np.int32)
    s = rng.integers(0, 150, (2, 3, 5)).astype(np.int32)
    s[..., 0] = 0
    return {"vertical": v, "slash": s, "q_seqlens": np.array([50, 90]), "kv_seqlens": np.array([100, 120])}


@pytest.mark.parametrize(
    "key, bend, named",
    [
        # `vertical` fixes [n_seqs, n_heads]: bent, it disagrees with `slash`, which is named
        # with both shapes; bent itself, `slash` is named the same way.
        ("vertical", lambda a: np.ascontiguousarray(a.transpose(1, 0, 2)), "slash"),
        ("vertical", lambda a: a.reshape(3, 2, 4).copy(), "slash"),
        ("slash", lambda a: np.ascontiguousarray(a.transpose(1, 0, 2)), "slash"),
        ("slash", lambda a: a.reshape(3, 2, 5).copy(), "slash"),
        ("q_seqlens", lambda a: a.reshape(2, 1), "q_seqlens"),
        ("kv_seqlens", lambda a: a.reshape(1, 2), "kv_seqlens"),
    ],
)
def test_a_transposed_or_reshaped_argument_is_refused_by_name_and_writes_nothing(key, bend, named):
    call = _catalogue_inputs()
    call[key] = bend(call[key])
    before = {k: x.tobytes() for k, x in call.items()}
    with pytest.raises(ks.SelectionError, match=r"must be (1-D )?\[") as e:
        ks.vslash_layout_batch(**call)
    assert e.value.argument == named
    assert all(call[k].tobytes() == before[k] for k in call)


@pytest.mark.parametrize(
    "key, form",
    [
        ("vertical", lambda a: a.astype(a.dtype.newbyteorder(">"))),
        ("slash", lambda a: a.astype(a.dtype.newbyteorder(">"))),
        ("q_seqlens", lambda a: a.astype(">i8")),
        ("kv_seqlens", lambda a: a.astype(">i8")),
        ("vertical", memoryview),
        ("slash", memoryview),
        ("vertical", lambda a: np.concatenate([a, a], -1)[..., ::2]),  # strided
    ],
)
def test_byte_swapped_memoryview_and_strided_inputs_give_the_same_layout(key, form):
    call = _catalogue_inputs()
    want = ks.vslash_layout_batch(**call)
    call[key] = form(call[key])
    _same(ks.vslash_layout_batch(**call), want)
