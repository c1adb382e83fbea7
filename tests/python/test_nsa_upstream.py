"""kvselect's NSA rows against fla's own naive top-k, ``naive_nsa_topk``
(fla-org/flash-linear-attention @bc3b101d ``fla/ops/nsa/naive.py``), run on the CPU
from a checkout.

Skipped unless ``KVSELECT_FLA_REPO`` names the checkout (the directory holding
``fla/``) and torch is importable. ``naive.py`` imports ``einops.repeat`` (one GQA
repeat), ``fla.ops.utils`` and ``fla.ops.utils.pooling`` (used for varlen inputs and
by ``naive_nsa``, not by ``naive_nsa_topk``). The package ``fla`` imports its Triton
kernels and models on import, so those modules are stubs here and the file is compiled
from the checkout as it stands. Nothing of the upstream code is copied. The compressed
keys are each block's mean in torch (``mean_pooling``'s definition).

The naive code places query ``i`` at position ``i`` (``Tq = Tkv``), so the queries here
are the whole sequence. Rows must equal kvselect's except where ``block_counts`` is
below fla's 3 forced blocks: those score 1.0 each, and ``torch.topk`` picks among them
while kvselect keeps the lower ids. Those rows are counted and each is checked to hold
forced blocks only. The parallel kernel (``parallel_nsa_topk``) runs under the Triton
interpreter (``TRITON_INTERPRET=1``, set when the checkout is named), prefill chunks and
decode (``Tq < Tkv``) at its ``TK - TQ`` offset, with the same exception.
"""

import os
import sys
import types

import numpy as np
import pytest

import kvselect as ks

REPO = os.environ.get("KVSELECT_FLA_REPO")
if REPO:  # before torch imports triton: the interpreter is chosen when triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")
torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not REPO, reason="KVSELECT_FLA_REPO (a flash-linear-attention checkout) is not set")


def _naive_nsa_topk():
    einops = types.ModuleType("einops")
    einops.repeat = lambda x, pattern, g: x.repeat_interleave(g, dim=2)  # 'b t h d -> b t (h g) d'
    stubs = {"einops": einops}
    for name in ("fla", "fla.ops", "fla.ops.utils", "fla.ops.utils.pooling"):
        stubs[name] = types.ModuleType(name)
    stubs["fla.ops.utils"].prepare_chunk_offsets = None  # varlen only: not called
    stubs["fla.ops.utils.pooling"].mean_pooling = None  # naive_nsa only: not called
    saved = {n: sys.modules.get(n) for n in stubs}
    sys.modules.update(stubs)
    try:
        path = os.path.join(REPO, "fla", "ops", "nsa", "naive.py")
        ns: dict = {}
        with open(path) as f:
            exec(compile(f.read(), path, "exec"), ns)
    finally:
        for n, m in saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m
    return ns["naive_nsa_topk"]


def test_rows_equal_fla_naive_topk_but_for_forced_ties():
    topk = _naive_nsa_topk()
    rng = np.random.default_rng(0)
    rows = equal = forced_ties = 0
    for _ in range(200):
        g, h = int(rng.choice([1, 2, 16])), int(rng.choice([1, 2]))
        bs, d, n_sel = int(rng.choice([4, 8, 16, 64])), int(rng.choice([8, 16])), int(rng.choice([1, 2, 3, 4, 8]))
        T = int(rng.integers(1, 20 * bs))
        q = rng.standard_normal((T, h * g, d)).astype(np.float32)
        k = rng.standard_normal((T, h, d)).astype(np.float32)
        kt = torch.from_numpy(k)
        k_cmp = torch.stack([kt[c * bs : (c + 1) * bs].mean(0) for c in range(-(-T // bs))])[None]
        up = topk(torch.from_numpy(q)[None], k_cmp, n_sel, bs, d**-0.5)[0].numpy()
        up = np.sort(np.where(up < 0, np.iinfo(np.int64).max, up), axis=-1)
        up = np.where(up == np.iinfo(np.int64).max, -1, up)
        mine = ks.nsa_select(q, k, n_sel, block_size=bs)
        for t in range(T):
            forced = {0, t // bs - 1, t // bs} - {-1}
            for j in range(h):
                rows += 1
                if (up[t, j] == mine[t, j]).all():
                    equal += 1
                    continue
                a, b = set(up[t, j][up[t, j] >= 0].tolist()), set(mine[t, j][mine[t, j] >= 0].tolist())
                assert n_sel < len(forced) and a <= forced and b <= forced and len(a) == len(b), (T, bs, n_sel, t, j)
                forced_ties += 1
    assert rows > 10_000 and equal > 0.5 * rows
    print(f"rows {rows}: equal {equal}, forced ties {forced_ties}")


def test_the_underflow_example_is_a_short_row_upstream_and_a_full_one_here():
    """docs/nsa.md's example: blocks of 4, block 2's keys 200, the rest 0, ``q = 1``,
    ``scale = 1``; the query at 23 has candidates 0..5. Blocks 1 and 3 have probability
    ``e^-200 / (..)``, 0 in float32, tied with the future blocks' 0. kvselect's row is
    full; fla's, where ``torch.topk`` prefers a future block, holds ``-1``."""
    topk = _naive_nsa_topk()
    T, bs = 40, 4
    q = np.ones((T, 1, 1), np.float32)
    k = np.zeros((T, 1, 1), np.float32)
    k[8:12] = 200.0
    kt = torch.from_numpy(k)
    k_cmp = torch.stack([kt[c * bs : (c + 1) * bs].mean(0) for c in range(T // bs)])[None]
    up = topk(torch.from_numpy(q)[None], k_cmp, 6, bs, 1.0)[0].numpy()[23, 0]
    mine = ks.nsa_select(q[23:24], k[:24], 6, block_size=bs, scale=1.0)[0, 0]
    assert mine.tolist() == [0, 1, 2, 3, 4, 5]
    print(f"fla naive row at 23: {sorted(up.tolist())}; kvselect: {mine.tolist()}")
    assert set(up[up >= 0].tolist()) <= set(mine.tolist())


def _parallel_nsa_topk():
    """fla's ``parallel_nsa_topk`` (``fla/ops/nsa/parallel.py``) under the Triton
    interpreter: the ``fla`` packages are bare namespaces over the checkout (the package
    ``__init__`` imports every model), ``einops`` a stub (not called by the top-k), and the
    kernel's autotuner keeps one config (with several it benchmarks, which needs a GPU
    driver; the configs differ only in ``num_warps``)."""
    pytest.importorskip("triton")
    import importlib

    for name, path in (
        ("fla", "fla"),
        ("fla.ops", "fla/ops"),
        ("fla.ops.nsa", "fla/ops/nsa"),
        ("fla.ops.attn", "fla/ops/attn"),
    ):
        if name not in sys.modules:
            m = types.ModuleType(name)
            m.__path__ = [os.path.join(REPO, path)]
            m.__version__ = "0"
            sys.modules[name] = m
    if "einops" not in sys.modules:
        e = types.ModuleType("einops")
        e.rearrange = e.repeat = e.reduce = None
        sys.modules["einops"] = e
    par = importlib.import_module("fla.ops.nsa.parallel")
    tuner = par.parallel_nsa_kernel_topk.fn
    tuner.configs = tuner.configs[:1]
    return par.parallel_nsa_topk


def test_rows_equal_fla_parallel_topk_under_the_interpreter_but_for_forced_ties():
    """The parallel kernel places query ``t`` at ``t + TK - TQ``: prefill chunks and
    decode (``Tq < Tkv``) here. Its row is score-ordered and padded to a power of two; the
    attention reads the first ``block_counts``, compared as a set."""
    topk = _parallel_nsa_topk()
    rng = np.random.default_rng(1)
    rows = equal = forced_ties = 0
    for _ in range(40):
        g, h = int(rng.choice([1, 2, 16])), int(rng.choice([1, 2]))
        bs, d, n_sel = int(rng.choice([16, 32])), 16, int(rng.choice([1, 2, 3, 4, 8]))
        tk = int(rng.integers(1, 12 * bs))
        tq = int(rng.integers(1, min(tk, 6) + 1))
        q = rng.standard_normal((tq, h * g, d)).astype(np.float32)
        k = rng.standard_normal((tk, h, d)).astype(np.float32)
        kt = torch.from_numpy(k)
        k_cmp = torch.stack([kt[c * bs : (c + 1) * bs].mean(0) for c in range(-(-tk // bs))])[None].contiguous()
        up = topk(torch.from_numpy(q)[None].contiguous(), k_cmp, tk, None, n_sel, bs, d**-0.5)[0].numpy()[..., :n_sel]
        mine = ks.nsa_select(q, k, n_sel, block_size=bs)
        for t in range(tq):
            p = tk - tq + t
            forced = {0, p // bs - 1, p // bs} - {-1}
            for j in range(h):
                rows += 1
                a = sorted(set(up[t, j][up[t, j] >= 0].tolist()))
                b = mine[t, j][mine[t, j] >= 0].tolist()
                if a == b:
                    equal += 1
                    continue
                assert n_sel < len(forced) and set(a) <= forced and set(b) <= forced and len(a) == len(b), (tk, tq, t)
                forced_ties += 1
    assert rows > 100 and equal > 0.5 * rows
    print(f"rows {rows}: equal {equal}, forced ties {forced_ties}")


def test_packed_rows_equal_fla_varlen_parallel_topk_but_for_forced_ties():
    """fla's varlen form, ``parallel_nsa_topk(..., cu_seqlens=(cu_seqlens_q,
    cu_seqlens_k))`` (each sequence its own ``TQ``, ``TK``, ``Q_OFFSET`` and compressed
    keys at ``chunk_offsets``), against ``nsa_select(..., cu_seqlens=, cu_seqlens_q=)``
    on packed batches of 1 to 3 sequences: equal as sets but for forced ties."""
    topk = _parallel_nsa_topk()
    rng = np.random.default_rng(2)
    rows = equal = forced_ties = 0
    for _ in range(15):
        g, h = int(rng.choice([1, 2, 16])), int(rng.choice([1, 2]))
        bs, d, n_sel = int(rng.choice([16, 32])), 16, int(rng.choice([1, 2, 3, 4, 8]))
        tks = [int(rng.integers(1, 8 * bs)) for _ in range(int(rng.integers(1, 4)))]
        tqs = [int(rng.integers(1, min(tk, 4) + 1)) for tk in tks]
        cu_k, cu_q = np.r_[0, np.cumsum(tks)], np.r_[0, np.cumsum(tqs)]
        q = rng.standard_normal((cu_q[-1], h * g, d)).astype(np.float32)
        k = rng.standard_normal((cu_k[-1], h, d)).astype(np.float32)
        kt = torch.from_numpy(k)
        k_cmp = torch.cat(
            [
                torch.stack(
                    [
                        kt[cu_k[s] + c * bs : min(cu_k[s] + (c + 1) * bs, cu_k[s + 1])].mean(0)
                        for c in range(-(-tk // bs))
                    ]
                )
                for s, tk in enumerate(tks)
            ]
        )[None].contiguous()
        cu = (torch.from_numpy(cu_q).long(), torch.from_numpy(cu_k).long())
        up = topk(torch.from_numpy(q)[None].contiguous(), k_cmp, max(tks), None, n_sel, bs, d**-0.5, cu_seqlens=cu)
        up = up[0].numpy()[..., :n_sel]
        mine = ks.nsa_select(q, k, n_sel, block_size=bs, cu_seqlens=cu_k, cu_seqlens_q=cu_q)
        for s, (tk, tq) in enumerate(zip(tks, tqs)):
            for t in range(tq):
                i, p = cu_q[s] + t, tk - tq + t
                forced = {0, p // bs - 1, p // bs} - {-1}
                for j in range(h):
                    rows += 1
                    a = sorted(set(up[i, j][up[i, j] >= 0].tolist()))
                    b = mine[i, j][mine[i, j] >= 0].tolist()
                    if a == b:
                        equal += 1
                        continue
                    assert n_sel < len(forced) and set(a) <= forced and set(b) <= forced and len(a) == len(b), (
                        tks,
                        tqs,
                        s,
                        t,
                    )
                    forced_ties += 1
    assert rows > 30 and equal > 0.5 * rows
    print(f"varlen rows {rows}: equal {equal}, forced ties {forced_ties}")
