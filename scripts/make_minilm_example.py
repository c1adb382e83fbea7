"""Regenerate ``python/kvselect/data/minilm_example.npz`` from the shared dump.

Developer tool (the package and tests never run it): it reads
``../shared/data/minilm-qkv.npz`` (all-MiniLM-L6-v2 Q/K/V on two Debian
licence texts, made by ``../shared/data/extract_minilm_qkv.py``) and writes
the small example that :func:`kvselect.workloads.example` loads.

What it keeps, and why:

- one text, GPL-2 (``GPL_2_q``/``_k``/``_v``), all 512 tokens;
- layers 1, 3 and 5 (early, middle, last; layer 0 is mostly lexical);
- in each layer, three heads picked by their *causal* attention
  (softmax(q k^T / sqrt(32)) with query i seeing keys 0..=i, averaged over
  queries 64..511), greedily and without repeats: the head with the most mass
  on key 0 ([CLS], the sink), then the one with the most mass on its own and
  the 15 previous tokens (local), then the one with the highest normalised
  entropy (diffuse) — so the example covers the head types the synthetic
  workload imitates, on real weights;
- float16, as the source (no precision added or lost), compressed;
  ``layer_ids`` and ``kv_head_ids`` record the model's layer and head
  numbers, so heads are named ``L{layer}/H{head}`` as in the model.

Three layers of three heads keep the file under 1 MB (three of four heads
would not: float16 activations barely compress).

Usage: ``python scripts/make_minilm_example.py [SOURCE.npz] [OUT.npz]``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT.parent / "shared" / "data" / "minilm-qkv.npz"
OUT = ROOT / "python" / "kvselect" / "data" / "minilm_example.npz"
TEXT = "GPL_2"
LAYERS = (1, 3, 5)
FIRST_QUERY = 64
LOCAL_WINDOW = 16


def causal_attention(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """[heads, T, d] x2 -> [heads, T, T] probabilities, causal."""
    q32, k32 = q.astype(np.float32), k.astype(np.float32)
    logits = np.einsum("hqd,hkd->hqk", q32, k32) / np.sqrt(q.shape[-1])
    t = q.shape[1]
    logits = np.where(np.tril(np.ones((t, t), dtype=bool)), logits, -np.inf)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True)


def pick_heads(p: np.ndarray) -> list:
    """Sink, local, diffuse: greedy, distinct (see the module docstring)."""
    t = p.shape[-1]
    rows = np.arange(FIRST_QUERY, t)
    pr = p[:, rows]  # [heads, queries, keys]
    sink = pr[:, :, 0].mean(1)
    dist = rows[:, None] - np.arange(t)[None, :]
    near = (dist >= 0) & (dist < LOCAL_WINDOW)
    local = (pr * near[None]).sum(-1).mean(1)
    ent = -(pr * np.log(np.where(pr > 0, pr, 1.0))).sum(-1) / np.log(rows + 1)
    diffuse = ent.mean(1)
    chosen: list = []
    for score in (sink, local, diffuse):
        for h in np.argsort(-score, kind="stable"):
            if int(h) not in chosen:
                chosen.append(int(h))
                break
    return chosen


def main(argv: list) -> int:
    source = Path(argv[1]) if len(argv) > 1 else SOURCE
    out = Path(argv[2]) if len(argv) > 2 else OUT
    z = np.load(source)
    q, k, v = (z[f"{TEXT}_{n}"] for n in "qkv")  # float16 [6, 12, 512, 32]
    heads = []
    for layer in LAYERS:
        chosen = pick_heads(causal_attention(q[layer], k[layer]))
        heads.append(chosen)
        print(f"layer {layer}: heads {chosen} (sink, local, diffuse)")
    sel = lambda a: np.stack([a[li, h] for li, h in zip(LAYERS, heads)])  # noqa: E731
    arrays = {
        "q": sel(q),
        "k": sel(k),
        "v": sel(v),
        "layer_ids": np.asarray(LAYERS, dtype=np.int64),
        "kv_head_ids": np.asarray(heads, dtype=np.int64),
    }
    for name in "qkv":
        assert arrays[name].dtype == np.float16, arrays[name].dtype
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out, **arrays)
    print(f"wrote {out} ({out.stat().st_size} bytes): q {arrays['q'].shape} float16")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
