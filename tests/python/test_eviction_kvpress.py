"""kvselect's eviction twins against kvpress's own scorers on the same tensors
(issue 44): SnapKV, PyramidKV, TOVA and ObservedAttention.

kvpress's ``score()`` takes precomputed attentions, so no model is needed: a
stub ``module`` carries ``config.num_attention_heads`` (and the KV heads, the
layers, ``head_dim``, ``layer_idx``), ``hidden_states`` is zeros of the right
length. The attentions handed to kvpress are kvselect's float64
probabilities rounded to float32 (what an eager float32 softmax returns,
within its rounding); kvpress then averages and pools in float32. Its kept
set (``topk`` of ``int(L * (1 - ratio))``) must equal the twin's except for
swaps between positions whose kvpress scores lie within the float32 error
bound of kvpress's threshold score: ``ERR`` below, counted and printed.

Skips without torch, transformers or kvpress. Run (kvpress 0.5.4 = the
pinned commit 8bb29b9c3078452a86d692f29123fa6c793e2b05's version)::

    PYTHONPATH=python /work/venv-torch/bin/python -m pytest -q -s tests/python/test_eviction_kvpress.py
"""

from __future__ import annotations

import importlib.util
import sys
import types

import numpy as np
import pytest

import kvselect as ks
from kvselect import reference as ref

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
if importlib.util.find_spec("kvpress") is None:
    pytest.skip("kvpress is not installed", allow_module_level=True)
if "kvpress" not in sys.modules:  # the presses only: kvpress/__init__ imports its evaluation stack
    _spec = importlib.util.find_spec("kvpress")
    _pkg = types.ModuleType("kvpress")
    _pkg.__path__ = list(_spec.submodule_search_locations or [])
    sys.modules["kvpress"] = _pkg
from kvpress.presses.observed_attention_press import ObservedAttentionPress  # noqa: E402
from kvpress.presses.pyramidkv_press import PyramidKVPress  # noqa: E402
from kvpress.presses.snapkv_press import SnapKVPress  # noqa: E402
from kvpress.presses.tova_press import TOVAPress  # noqa: E402

U32 = 2.0**-24


def _module(n_heads, n_kv, d, layers=1, layer=0):
    config = types.SimpleNamespace(num_attention_heads=n_heads, num_key_value_heads=n_kv, num_hidden_layers=layers)
    return types.SimpleNamespace(config=config, head_dim=d, layer_idx=layer)


def _inputs(rng, length, n_heads, n_kv, d):
    q = rng.standard_normal((length, n_heads, d)).astype(np.float32)
    k = rng.standard_normal((length, n_kv, d)).astype(np.float32)
    scale = 1 / np.sqrt(d)
    probs = ks.attention_probabilities(q, k, np.arange(length), scale=scale)  # [L, H, L] f64
    attn = torch.from_numpy(probs.astype(np.float32).transpose(1, 0, 2).copy())[None]  # [1, H, L, L]
    keys = torch.from_numpy(k.transpose(1, 0, 2).copy())[None]  # [1, n_kv, L, d]
    return q, k, scale, attn, keys


def _compare(theirs_scores, n_kept, ours, err):
    """Kept sets equal except swaps within ``err`` of kvpress's threshold:
    returns the swaps."""
    s = theirs_scores.double().numpy()
    theirs = np.sort(torch.topk(theirs_scores, n_kept).indices.numpy())
    only_ours, only_theirs = np.setdiff1d(ours, theirs), np.setdiff1d(theirs, ours)
    assert len(only_ours) == len(only_theirs)
    if len(only_ours):
        threshold = np.sort(s)[::-1][n_kept - 1]
        assert np.all(np.abs(s[only_ours] - threshold) <= err), (s[only_ours], threshold, err)
        assert np.all(np.abs(s[only_theirs] - threshold) <= err), (s[only_theirs], threshold, err)
    return len(only_ours)


@pytest.mark.parametrize("n_heads,n_kv", [(8, 8), (8, 1), (4, 2)])
def test_snapkv_keeps_what_kvpress_keeps(n_heads, n_kv):
    rng = np.random.default_rng(n_heads * 10 + n_kv)
    swaps = total = 0
    for _ in range(40):
        length, d = int(rng.integers(40, 200)), int(rng.integers(4, 32))
        window = int(rng.integers(1, 24))
        ratio = float(rng.uniform(0.05, 0.8))
        n_kept = int(length * (1 - ratio))  # kvpress truncates
        if n_kept < window:
            continue  # the window ties at its padded score: torch's topk picks any; tested below
        q, k, scale, attn, keys = _inputs(rng, length, n_heads, n_kv, d)
        press = SnapKVPress(compression_ratio=ratio, window_size=window)
        scores = press.score(_module(n_heads, n_kv, d), torch.zeros(1, length, 1), keys, keys, attn, {})[0]
        g = n_heads // n_kv
        for h in range(n_kv):
            ours = ref.snapkv_keep(q[:, h * g : (h + 1) * g], k[:, h], n_kept, scale, window=window)
            # float32: the rounded probabilities, the window's sum, the pooling's
            # 5 taps and the group's sum, each a rounding of at most the
            # largest score's magnitude.
            err = 4 * (window + 5 + g + 4) * U32 * float(scores[h, :-window].abs().max())
            swaps += _compare(scores[h], n_kept, ours, err)
            total += 1
    print(f"SnapKV ({n_heads} heads, {n_kv} KV): {swaps} swaps within the float32 bound over {total} heads")
    assert total > 20


def test_snapkv_window_ties_when_fewer_are_kept_than_the_window():
    rng = np.random.default_rng(0)
    q, k, scale, attn, keys = _inputs(rng, 50, 2, 1, 8)
    scores = SnapKVPress(compression_ratio=0.9, window_size=16).score(
        _module(2, 1, 8), torch.zeros(1, 50, 1), keys, keys, attn, {}
    )[0, 0]
    assert torch.all(scores[-16:] == scores[-1]) and scores[-1] > scores[:-16].max()  # one padded score
    n_kept = int(50 * (1 - 0.9))
    assert n_kept == 4  # 1 - 0.9 = 0.09999999999999998, times 50 = 4.999999999999999: truncated to 4
    ours = ref.snapkv_keep(q, k[:, 0], n_kept, scale, window=16)
    assert ours.tolist() == [34, 35, 36, 37]  # the window's lowest: the tie decided


def test_pyramidkv_layer_budget_is_kvpress():
    rng = np.random.default_rng(1)
    for _ in range(500):
        layers = int(rng.integers(2, 80))
        layer = int(rng.integers(0, layers))
        q_len = int(rng.integers(2, 8000))
        window = int(rng.integers(1, 128))
        ratio = float(rng.uniform(0.01, 0.99))
        press = PyramidKVPress(compression_ratio=ratio, window_size=window)
        want = press.get_layer_budget(_module(8, 8, 16, layers, layer), q_len)
        assert ref.pyramidkv_layer_budget(layer, layers, q_len, ratio, window=window) == want


def test_tova_keeps_what_kvpress_keeps_with_one_kv_head():
    # kvpress averages the last query's attention over every head of the
    # layer; with one KV head that is the eval's group mean.
    rng = np.random.default_rng(2)
    swaps = 0
    for _ in range(60):
        length, d, heads = int(rng.integers(8, 200)), int(rng.integers(2, 32)), int(rng.integers(1, 9))
        ratio = float(rng.uniform(0.05, 0.9))
        n_kept = int(length * (1 - ratio))
        if n_kept < 1:
            continue
        q, k, scale, attn, keys = _inputs(rng, length, heads, 1, d)
        scores = TOVAPress(compression_ratio=ratio).score(
            _module(heads, 1, d), torch.zeros(1, length, 1), keys, keys, attn, {}
        )[0, 0]
        ours = ref.tova_keep(q, k[:, 0], n_kept, scale)
        err = 4 * (heads + 2) * U32 * float(scores[:-1].abs().max())
        swaps += _compare(scores, n_kept, ours, err)
    print(f"TOVA: {swaps} swaps within the float32 bound")


def test_observed_attention_keeps_what_kvpress_keeps():
    rng = np.random.default_rng(3)
    swaps = 0
    for _ in range(30):
        length, d = int(rng.integers(8, 120)), int(rng.integers(2, 16))
        n_heads, n_kv = (4, 2) if rng.random() < 0.5 else (2, 2)
        ratio = float(rng.uniform(0.05, 0.9))
        n_kept = int(length * (1 - ratio))
        if n_kept < 1:
            continue
        q, k, scale, attn, keys = _inputs(rng, length, n_heads, n_kv, d)
        scores = ObservedAttentionPress(compression_ratio=ratio).score(
            _module(n_heads, n_kv, d), torch.zeros(1, length, 1), keys, keys, attn, {}
        )[0]
        g = n_heads // n_kv
        for h in range(n_kv):
            ours = ref.observed_attention_keep(q[:, h * g : (h + 1) * g], k[:, h], n_kept, scale)
            # float32 sums of up to L rounded probabilities (torch's sum is
            # pairwise, bounded here by the sequential bound), a division,
            # the group's mean.
            err = 4 * (length + g + 4) * U32 * float(scores[h].abs().max())
            swaps += _compare(scores[h], n_kept, ours, err)
    print(f"ObservedAttention: {swaps} swaps within the float32 bound")
