"""kvselect's MoBA selection against MoBA's own torch code (MoonshotAI/MoBA),
run on a CPU from a checkout of that repository.

Skipped unless ``KVSELECT_MOBA_REPO`` names the checkout (the directory holding
``moba/``) and torch and einops are importable. Nothing of MoBA's code is copied:
its two modules are imported from the checkout and run as they are, with the
CUDA-only ``flash_attn`` stubbed (``moba/__init__.py``, which needs
transformers, is skipped):

- ``moba_naive.py`` ``moba_attn_varlen_naive`` runs whole on the CPU; its
  selection is the local ``need_attend`` ``[H, S, N]`` right after its top-k
  (read by a line tracer), the future blocks it keeps to fill a short row
  dropped as its causal mask drops them;
- ``moba_efficient.py`` ``moba_attn_varlen`` runs up to the attention: the
  stubbed ``MixedAttention.apply`` reads its caller's ``gate_mask`` ``[F, H, S]``
  (gate and top-k over the filtered chunks), and the current chunk is added as
  its self-attention over ``cu_chunk`` reads it; at ``topk = 1`` the stubbed
  ``flash_attn_varlen_func`` records the fallback to full causal attention.

Inputs are seeded float32 (MoBA takes the block mean in the keys' dtype: in
float32 the two means differ by float32 summation order only), packed batches of
MoBA's test shapes, GQA keys repeated to the query heads as ``moba/wrapper.py``
does. Rows equal kvselect's except where blocks tie within the float32 gates'
error bound (counted, and each such difference checked to be one).
"""

import importlib.util
import inspect
import os
import pathlib
import sys
import types

import numpy as np
import pytest

import kvselect as ks
from kvselect.reference import moba as rmoba

REPO = os.environ.get("KVSELECT_MOBA_REPO")
torch = pytest.importorskip("torch")
pytest.importorskip("einops")
pytestmark = pytest.mark.skipif(not REPO, reason="KVSELECT_MOBA_REPO (a MoonshotAI/MoBA checkout) is not set")


class _FullCausal(Exception):
    """The efficient code's fallback to full causal attention was taken."""


def _load(name):
    """``moba/<name>.py`` from the checkout, with ``flash_attn`` stubbed."""
    if "flash_attn" not in sys.modules:
        fa = types.ModuleType("flash_attn")
        iface = types.ModuleType("flash_attn.flash_attn_interface")

        def varlen_func(*args, **kwargs):
            raise _FullCausal

        def unused(*args, **kwargs):
            raise AssertionError("the attention itself is not run here")

        fa.flash_attn_varlen_func = varlen_func
        iface._flash_attn_varlen_forward = unused
        iface._flash_attn_varlen_backward = unused
        fa.flash_attn_interface = iface
        sys.modules["flash_attn"] = fa
        sys.modules["flash_attn.flash_attn_interface"] = iface
    path = pathlib.Path(REPO) / "moba" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"moba_upstream_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Captured(Exception):
    pass


def efficient_rows(q, k, cu, chunk, topk):
    """MoBA's efficient selection: ``{(seq, s_local, h): set of block ids}``, or
    ``None`` when it falls back to full causal attention."""
    mod = _load("moba_efficient")
    mod.calc_chunks.cache_clear()
    seen = {}

    class Fake:
        @staticmethod
        def apply(*args):
            f = inspect.currentframe().f_back.f_locals
            seen.update(
                gate_mask=f["gate_mask"].clone(),
                filtered=f["filtered_chunk_indices"].clone(),
                cu_chunk=f["cu_chunk"].clone(),
                chunk_to_batch=f["chunk_to_batch"].clone(),
            )
            raise _Captured

    mod.MixedAttention = Fake
    cu_t = torch.tensor(cu, dtype=torch.int32)
    try:
        mod.moba_attn_varlen(q, k, k, cu_t, int(np.diff(cu).max()), chunk, topk)
    except _FullCausal:
        return None
    except _Captured:
        pass
    rows = {}
    n_seq = len(cu) - 1
    for s in range(n_seq):
        for t in range(cu[s], cu[s + 1]):
            for h in range(q.shape[1]):
                rows[(s, t - cu[s], h)] = {(t - cu[s]) // chunk}  # the current chunk, self-attended
    gm = seen["gate_mask"].numpy()
    for j, g in enumerate(seen["filtered"].tolist()):
        b = int(seen["chunk_to_batch"][g])
        local = (int(seen["cu_chunk"][g]) - cu[b]) // chunk
        for h, t in zip(*np.nonzero(gm[j])):
            rows[(b, int(t) - cu[b], int(h))].add(local)
    return rows


def naive_rows(q, k, cu, chunk, topk):
    """MoBA's naive selection, read from its ``need_attend`` after the top-k."""
    mod = _load("moba_naive")
    fn = mod.moba_attn_varlen_naive
    lines, start = inspect.getsourcelines(fn)
    target = start + next(i for i, ln in enumerate(lines) if "gate[need_attend] = 0" in ln)
    got = []

    def tracer(frame, event, arg):
        if frame.f_code is not fn.__code__:
            return None
        if event == "line" and frame.f_lineno == target:
            got.append(frame.f_locals["need_attend"].clone())
        return tracer

    sys.settrace(tracer)
    try:
        fn(q, k, k, torch.tensor(cu, dtype=torch.int32), int(np.diff(cu).max()), chunk, topk)
    finally:
        sys.settrace(None)
    rows = {}
    for s, need in enumerate(got):
        need = need.numpy()  # [H, S, N]
        for h in range(need.shape[0]):
            for t in range(need.shape[1]):
                rows[(s, t, h)] = {int(b) for b in np.nonzero(need[h, t])[0] if b * chunk <= t}
    return rows


CONFIGS = [  # (batch, total seqlen, q heads, kv heads, head_dim, chunk, topk)
    (1, 512, 2, 2, 128, 128, 3),
    (4, 1024, 4, 1, 64, 128, 2),
    (7, 2048, 2, 1, 32, 256, 4),
    (3, 700, 16, 1, 16, 64, 5),
    (2, 600, 4, 4, 32, 32, 8),
    (3, 500, 2, 2, 16, 64, 1),
]


def _inputs(batch, seqlen, hq, hkv, d, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(seqlen, hq, d, generator=g)
    k = torch.randn(seqlen, hkv, d, generator=g)
    rng = np.random.default_rng(seed)
    cuts = sorted(rng.choice(np.arange(1, seqlen - 1), batch - 1, replace=False).tolist()) if batch > 1 else []
    return q, k, [0] + cuts + [seqlen]


@pytest.mark.parametrize("variant", ["efficient", "naive"])
def test_moba_selection_matches_the_upstream_torch_code(variant):
    rows = tied = 0
    for seed, (batch, seqlen, hq, hkv, d, chunk, topk) in enumerate(CONFIGS):
        q, k, cu = _inputs(batch, seqlen, hq, hkv, d, seed)
        k_rep = torch.repeat_interleave(k, hq // hkv, dim=1)  # moba/wrapper.py's GQA
        theirs = (efficient_rows if variant == "efficient" else naive_rows)(q, k_rep, cu, chunk, topk)
        mine = ks.moba_select(q.numpy(), k.numpy(), topk, chunk, cu_seqlens=np.array(cu), variant=variant)
        if theirs is None:  # the efficient code's topk = 1: full causal attention
            assert topk == 1 and variant == "efficient"
            for s in range(batch):
                for t in range(cu[s], cu[s + 1]):
                    want = list(range((t - cu[s]) // chunk + 1))
                    assert mine[t, :, : len(want)].tolist() == [want] * hq
            rows += (cu[-1]) * hq
            continue
        for s in range(batch):
            qs, kk = q[cu[s] : cu[s + 1]].numpy(), k[cu[s] : cu[s + 1]].numpy()
            gates = rmoba.moba_gates(qs, kk, chunk)
            err = rmoba.gate_error_bound(d, chunk) * rmoba.gate_magnitudes(qs, kk, chunk)
            for t in range(cu[s + 1] - cu[s]):
                for h in range(hq):
                    rows += 1
                    m = {int(x) for x in mine[cu[s] + t, h] if x >= 0}
                    u = theirs[(s, t, h)]
                    if m == u:
                        continue
                    # Only blocks tied within the float32 gates' bound (each side's
                    # float32 rounding: kvselect's, and torch's in another order).
                    assert len(m) == len(u) and (t // chunk) in m and (t // chunk) in u
                    a, b = sorted(m - u), sorted(u - m)
                    g, e = gates[t, h], 2 * err[t, h] + 1e-30
                    assert max(g[b]) - min(g[a]) <= max(e[a]) + max(e[b]), (seed, s, t, h, a, b)
                    tied += 1
    print(f"\n{variant}: {rows} rows compared, {tied} differ only by blocks tied within float32")
    assert rows > 10_000 and tied <= rows // 1000
