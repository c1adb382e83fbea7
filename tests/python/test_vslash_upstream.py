"""kvselect's vertical-slash selection against MInference's own index
computation, ``vertical_and_slash_kernel`` in ``minference_prefill_kernel``
(microsoft/MInference ``minference/modules/minference_forward.py``), run from a
checkout of that repository on the CPU.

Skipped unless ``KVSELECT_MINFERENCE_REPO`` names the checkout (the directory
holding ``minference/``) and torch is importable. The module imports
transformers, vLLM and the CUDA extension at its top, none of which the
estimate needs: the two functions it uses, ``sum_all_diagonal_matrix`` and the
nested ``vertical_and_slash_kernel``, are read from the file with ``ast`` and
run as they are, with ``LAST_Q_MASK`` built as the module builds it (on the
CPU) and the sparse attention call, ``vertical_slash_sparse_attention``,
replaced by one that returns the two index sets it is handed. Nothing of
MInference's code is copied here.

On seeded float32 inputs (its scores then float32, as kvselect's), the sets
equal kvselect's except where candidates tie within float32 rounding: every
differing row is checked to be a valid top-k of kvselect's own float32 sums
up to the twin's bound, and counted. ``s < 100`` (the forced diagonals' tie in
``torch.topk``) is left out: there the rules differ by design. The source
runs one head a call (``sum_all_diagonal_matrix`` reads batch 0, head 0).
"""

from __future__ import annotations

import ast
import math
import os
import pathlib

import numpy as np
import pytest

import kvselect as ks
from kvselect import reference as R

REPO = os.environ.get("KVSELECT_MINFERENCE_REPO")
torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not REPO, reason="KVSELECT_MINFERENCE_REPO (a microsoft/MInference checkout) is unset")


def _upstream(outer_name="minference_prefill_kernel"):
    """``vertical_and_slash_kernel(q, k, v, vertical_size, slash_size)`` of the function
    ``outer_name``, built from the checkout's source for sequences of ``q_len`` and
    head dim ``head_dim``."""
    path = pathlib.Path(REPO) / "minference" / "modules" / "minference_forward.py"
    tree = ast.parse(path.read_text())
    top = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    outer = top[outer_name]
    inner = next(n for n in outer.body if isinstance(n, ast.FunctionDef) and n.name == "vertical_and_slash_kernel")
    module = ast.Module(body=[top["sum_all_diagonal_matrix"], inner], type_ignores=[])
    arange = torch.arange(64)
    env = {
        "torch": torch,
        "math": math,
        "LAST_Q_MASK": arange[None, None, :, None] >= arange[None, None, None, :],  # as the module builds it
        "vertical_slash_sparse_attention": lambda q, k, v, vertical, slash: (vertical, slash),
    }
    exec(compile(module, str(path), "exec"), env)
    return env


def test_the_sets_equal_minferences_index_computation():
    env = _upstream()
    rng = np.random.default_rng(2024)
    rows = tied = 0
    exp = ks._core._exp_bound()
    for trial in range(60):
        L = int(rng.choice([40, 64, 65, 200, 511, 1024, 3000]))
        h, d = 4, int(rng.choice([32, 64, 128]))
        v_size = int(rng.integers(0, 400))
        s_size = int(rng.integers(100, 500))
        k = rng.standard_normal((1, h, L, d)).astype(np.float32)
        q = rng.standard_normal((1, h, L, d)).astype(np.float32) * float(rng.choice([0.5, 1.0, 2.0]))
        env["q_len"], env["head_dim"] = L, d
        # One head a call, as the source calls it (sum_all_diagonal_matrix's
        # strides read batch 0, head 0 only).
        theirs = [
            env["vertical_and_slash_kernel"](
                torch.from_numpy(q[:, j : j + 1]), torch.from_numpy(k[:, j : j + 1]), None, v_size, s_size
            )
            for j in range(h)
        ]
        theirs_v = np.sort(np.stack([t[0].numpy().reshape(-1) for t in theirs]), axis=1)
        theirs_s = np.sort(np.stack([t[1].numpy().reshape(-1) for t in theirs]), axis=1)
        n = min(64, L)
        qk = np.ascontiguousarray(q[0, :, L - n :])
        keys = np.ascontiguousarray(k[0].transpose(1, 0, 2))
        mine_v, mine_s = ks.vslash_select(qk, keys, v_size, s_size)
        assert theirs_v.shape == mine_v.shape and theirs_s.shape == mine_s.shape
        xv, xs = R.vslash_scores(qk, keys)
        ev, es = R.vslash_error_bounds(qk, keys, exp)
        for j in range(h):
            rows += 1
            if np.array_equal(theirs_v[j], mine_v[j]) and np.array_equal(theirs_s[j], mine_s[j]):
                continue
            # Only candidates tied within float32 rounding may differ: both sets
            # are then top-k of the exact sums up to float32's error (theirs is
            # float32 too: the bound scaled by 64 covers its other order).
            for got, mine, x, e, forced in (
                (theirs_v[j], mine_v[j], xv[j], ev[j], 30),
                (theirs_s[j], mine_s[j], xs[j], es[j], 100),
            ):
                if np.array_equal(got, mine):
                    continue
                diff = np.setxor1d(got, mine)
                assert np.all(diff >= forced), (trial, j, diff)
                span = x[diff].max() - x[diff].min()
                assert span <= 64 * e[diff].max(), (trial, j, diff, span, e[diff].max())
            tied += 1
    print(f"\n{rows} rows compared with MInference's vertical_and_slash_kernel, {tied} differ within float32 ties")
    assert rows == 240 and tied <= rows // 10


def test_the_search_variant_equals_search_pattern_v2s_copy():
    """``search_pattern_v2``'s ``vertical_and_slash_kernel``: unscaled scores, 30
    diagonals forced, 64 queries whatever ``L`` (so ``L >= 64`` here)."""
    env = _upstream("search_pattern_v2")
    rng = np.random.default_rng(7)
    rows = 0
    for trial in range(20):
        L, d = int(rng.choice([64, 100, 700])), 16
        v_size, s_size = int(rng.integers(0, 200)), int(rng.integers(30, 300))
        k = (rng.standard_normal((1, 1, L, d)) * 0.3).astype(np.float32)
        q = (rng.standard_normal((1, 1, L, d)) * 0.3).astype(np.float32)
        env["q_len"] = L
        vt, st = env["vertical_and_slash_kernel"](torch.from_numpy(q), torch.from_numpy(k), None, v_size, s_size)
        mine_v, mine_s = ks.vslash_select(
            q[0, :, L - 64 :], k[0].transpose(1, 0, 2).copy(), v_size, s_size, variant="search"
        )
        assert np.array_equal(np.sort(vt.numpy().reshape(-1)), mine_v[0]), trial
        assert np.array_equal(np.sort(st.numpy().reshape(-1)), mine_s[0]), trial
        rows += 1
    assert rows == 20


def test_bfloat16_inputs_differ_only_within_the_sources_precision():
    """On bfloat16 inputs the source rounds each score to bfloat16 (its ``einsum``
    and the division by ``sqrt(d)`` in the inputs' dtype) before its float32
    softmax; kvselect reads the same bfloat16 keys exactly and decides on float32
    scores. The sets then differ only where candidates' exact sums lie within
    what that rounding can move them: a score off by at most ``2^-8 |s|`` (two
    bfloat16 roundings) moves a probability by a factor ``exp(+-2 * 2^-8 max|s|)``
    at most. Counted."""
    import ml_dtypes

    env = _upstream()
    rng = np.random.default_rng(77)
    rows = differ = 0
    for trial in range(30):
        L, d = int(rng.choice([100, 700, 2000])), 64
        v_size, s_size = int(rng.integers(30, 300)), int(rng.integers(100, 400))
        k = rng.standard_normal((1, 1, L, d)).astype(ml_dtypes.bfloat16)
        q = rng.standard_normal((1, 1, L, d)).astype(ml_dtypes.bfloat16)
        kt = torch.from_numpy(k.view(np.uint16).astype(np.int16)).view(torch.bfloat16)
        qt = torch.from_numpy(q.view(np.uint16).astype(np.int16)).view(torch.bfloat16)
        env["q_len"], env["head_dim"] = L, d
        vt, st = env["vertical_and_slash_kernel"](qt, kt, None, v_size, s_size)
        n = min(64, L)
        qk = q[0, :, L - n :].astype(np.float32)
        keys = np.ascontiguousarray(k[0].transpose(1, 0, 2))
        mine_v, mine_s = ks.vslash_select(qk, keys, v_size, s_size)
        xv, xs = R.vslash_scores(qk, keys)
        s_max = float(np.abs(qk.astype(np.float64) @ keys[:, 0].astype(np.float64).T).max() / np.sqrt(d))
        slack = math.exp(2 * 2.0**-8 * s_max) ** 2 - 1
        rows += 1
        for theirs, mine, x, forced in (
            (np.sort(vt.numpy().reshape(-1)), mine_v[0], xv[0], 30),
            (np.sort(st.numpy().reshape(-1)), mine_s[0], xs[0], 100),
        ):
            assert theirs.shape == mine.shape
            if np.array_equal(theirs, mine):
                continue
            diff = np.setxor1d(theirs, mine)
            assert np.all(diff >= forced), (trial, diff)
            assert x[diff].max() <= x[diff].min() * (1 + slack) + 1e-30, (trial, diff, x[diff], slack)
            differ += 1
    print(f"\n{rows} bfloat16 cases, {differ} of {2 * rows} sets differ within the source's bfloat16 rounding")
    assert rows == 30
