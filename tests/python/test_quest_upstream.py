"""kvselect's Quest page scores and page sets against the Quest authors' own
CPU reference, ``_ref_cpu_estimate`` in ``quest/tests/test_estimate.py``
(mit-han-lab/Quest), run from a checkout of that repository.

Skipped unless ``KVSELECT_QUEST_REPO`` names the checkout (the directory
holding ``quest/``) and torch is importable. ``quest/utils/__init__.py``
imports the CUDA extension ``quest._kernels``, and ``quest/__init__.py`` the
model code (transformers): neither is needed by the reference, so the
package is entered without its ``__init__`` and the extension is a stub
module. Nothing of Quest's code is copied here: it is imported from the
checkout and called.

On seeded inputs of that test's shapes (fp16, 32 heads, head_dim 128, pages
of 16, its kv_len values), the page scores agree within that test's fp16
tolerance (``rtol = atol = 5e-3``), and the page sets -- from its scores by
``torch.topk(page_budget - 1)`` plus the last page, as ``controller.py`` and
``decode_topk`` do -- equal kvselect's except where scores tie within fp16
rounding (counted, and every such difference checked to be one).
"""

import importlib.util
import os
import pathlib
import sys
import types

import numpy as np
import pytest

import kvselect as ks

REPO = os.environ.get("KVSELECT_QUEST_REPO")
torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not REPO, reason="KVSELECT_QUEST_REPO (a mit-han-lab/Quest checkout) is not set")

KV_LENS = [27, 61, 113, 482, 577, 1110, 1541, 2047, 3330]  # test_estimate.py's
HEADS, HEAD_DIM, PAGE = 32, 128, 16


def _ref_cpu_estimate():
    """Quest's ``_ref_cpu_estimate``, imported from the checkout."""
    root = pathlib.Path(REPO) / "quest"
    if "quest" not in sys.modules:
        pkg = types.ModuleType("quest")
        pkg.__path__ = [str(root)]  # the package, without its __init__ (the model code)
        sys.modules["quest"] = pkg
        sys.modules["quest._kernels"] = types.ModuleType("quest._kernels")  # the CUDA extension, stubbed
    spec = importlib.util.spec_from_file_location("quest_test_estimate", root / "tests" / "test_estimate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._ref_cpu_estimate


def _inputs(kv_len, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, HEADS, HEAD_DIM, generator=g).half()
    k = torch.randn(kv_len, HEADS, HEAD_DIM, generator=g).half()
    return q, k


def test_page_scores_and_page_sets_match_quests_reference():
    ref = _ref_cpu_estimate()
    tied_rows = rows = 0
    for seed, kv_len in enumerate(KV_LENS):
        q, k = _inputs(kv_len, seed)
        theirs = ref(q, k, k, PAGE)  # [heads, n_pages - 1] fp16 (the last page excluded)
        n_pages = -(-kv_len // PAGE)
        if theirs.dim() == 1:
            theirs = theirs[:, None]
        kmin, kmax = ks.quest_bounds(k.numpy())
        mine = ks.quest_scores(q[0].numpy(), kmin, kmax)  # [heads, n_pages] float32
        assert theirs.shape == (HEADS, n_pages - 1)
        torch.testing.assert_close(
            torch.from_numpy(mine[:, : n_pages - 1]).half(), theirs, rtol=5e-3, atol=5e-3
        )  # test_estimate.py's fp16 tolerance
        for budget in (2, 4, 16, 64):
            if n_pages <= budget:
                continue
            top = torch.topk(theirs.float(), budget - 1, dim=-1).indices.numpy()
            upstream = np.sort(np.concatenate([top, np.full((HEADS, 1), n_pages - 1)], axis=1), axis=1)
            got = ks.quest_select(q[0].numpy(), kmin, kmax, kv_len, budget)
            their = theirs.float().numpy()
            for h in range(HEADS):
                rows += 1
                if np.array_equal(got[h], upstream[h]):
                    continue
                # Only pages tied within fp16 rounding may differ: their fp16
                # scores at most one fp16 step apart.
                diff = np.setxor1d(got[h], upstream[h])
                span = their[h, diff].max() - their[h, diff].min()
                step = float(np.spacing(np.float16(np.abs(their[h, diff]).max())))
                assert span <= step, (kv_len, budget, h, diff, span, step)
                tied_rows += 1
    print(f"\n{rows} page sets compared, {tied_rows} differ only by pages tied within fp16 rounding")
    assert rows > 500 and tied_rows < rows // 10
