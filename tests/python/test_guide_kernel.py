"""Testing a kernel with kvselect (docs/testing-a-kernel.md): an engine-like
radix-select top-k with the bug of vllm-project/vllm#51782, and its fix."""

import numpy as np
import pytest

from kvselect.testing import assert_topk, cases

CAPACITY = 256  # the candidate buffer of the threshold's bucket (vLLM's is in shared memory)


def scores_of(index_q, weights, index_k, query_pos, key_scale=None):
    """The kernel's scores, float32: key_scale * sum_h weights * relu(q_h . k)."""
    q = np.asarray(index_q, dtype=np.float32)
    k = np.asarray(index_k, dtype=np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        dots = np.einsum("nhd,td->nht", q, k)
        s = np.einsum("nh,nht->nt", np.asarray(weights, dtype=np.float32), np.maximum(dots, np.float32(0)))
        if key_scale is not None:
            s = s * np.asarray(key_scale, dtype=np.float32)
    return s.astype(np.float32)


def order_keys(s):
    """float32 scores as uint32 keys in the same order (NaN lowest, -0.0 as +0.0)."""
    bits = (s + np.float32(0)).view(np.uint32)  # -0.0 + 0.0 is +0.0
    keys = np.where(bits >> 31, ~bits, bits | np.uint32(1 << 31))
    return np.where(np.isnan(s), np.uint32(0), keys)


def radix_topk(index_q, weights, index_k, query_pos, topk, key_scale=None, *, capacity=CAPACITY):
    """The engine's top-k: a coarse 11-bit histogram finds the threshold's
    bucket; every key above it wins; the bucket's keys are gathered into a
    buffer of ``capacity`` entries and ranked exactly. ``capacity=None``:
    the buffer holds them all (the fix)."""
    s = scores_of(index_q, weights, index_k, query_pos, key_scale)
    T = np.asarray(index_k).shape[0]
    out = np.full((len(s), topk), -1, dtype=np.int64)
    for i, pos in enumerate(np.asarray(query_pos)):
        L = min(int(pos) + 1, T)
        m = min(topk, L)
        if m == 0:
            continue
        keys = order_keys(s[i, :L])
        bucket = keys >> 21
        above = np.cumsum(np.bincount(bucket, minlength=2048)[::-1])[::-1]  # keys in buckets >= b
        b = int(np.flatnonzero(above >= m)[-1])  # the threshold's bucket
        winners = np.flatnonzero(bucket > b)
        candidates = np.flatnonzero(bucket == b)
        if capacity is not None:
            candidates = candidates[:capacity]  # THE BUG: an overflowing bucket is silently truncated
        ranked = candidates[np.lexsort((candidates, ~keys[candidates]))]
        row = np.concatenate([winners, ranked[: m - len(winners)]])
        out[i, : len(row)] = row
    return out


def buggy(**inputs):
    return radix_topk(**inputs)


def fixed(**inputs):
    return radix_topk(**inputs, capacity=None)


def kernel_inputs(case):
    """The case's inputs this kernel takes (the dense form)."""
    names = ("index_q", "weights", "index_k", "query_pos", "topk", "key_scale")
    return {n: case.inputs[n] for n in names if n in case.inputs}


DENSE = cases.all_topk_cases(forms=("dense",))
OVERFLOWING = [(i, c) for i, c in DENSE if i.startswith(("low_contrast", "ties_at_threshold"))]


@pytest.mark.parametrize("case", cases.pytest_params(DENSE))
def test_the_fixed_kernel_passes_every_case(case):
    case.assert_rows(fixed(**kernel_inputs(case)))


@pytest.mark.parametrize("case", cases.pytest_params(OVERFLOWING))
def test_the_buggy_kernel_fails_where_the_thresholds_bucket_overflows(case):
    rows = buggy(**kernel_inputs(case))
    with pytest.raises(AssertionError, match="wrong selection: dropped") as info:
        case.assert_rows(rows)
    assert info.value.report["wrong"] >= 1


def test_a_tolerance_comparison_of_the_selected_scores_misses_the_bug():
    case = dict(DENSE)["low_contrast-1029-float32-x2^0"]
    inputs = kernel_inputs(case)
    rows = buggy(**inputs)
    s = scores_of(**{n: inputs[n] for n in ("index_q", "weights", "index_k", "query_pos")})
    for i in range(len(rows)):
        got = np.sort(s[i, rows[i]])
        want = np.sort(s[i, case.expected[i]])
        assert np.allclose(got, want, rtol=1e-4, atol=1e-4)  # the usual test passes ...
        assert not np.array_equal(np.sort(rows[i]), np.sort(case.expected[i]))  # ... on a wrong set
    with pytest.raises(AssertionError, match="row 0: wrong selection"):
        assert_topk(rows, **case.inputs, rtol=0.0, atol=0.0)  # kvselect does not
