"""The eviction policies' selection time against the issue's bar (issue 44).

For each policy on one KV head's prefix (P tokens, d, a GQA group g, budget
B), the bar is 1.5x the larger of

- its FMA count at the machine's floor rate (``kvselect._core._fma_floor``
  on the same thread count: a register-resident FMA loop at the best SIMD
  level), and
- one read of the keys it needs (``P * d * 4`` bytes at a ``numpy`` copy's
  measured bandwidth).

FMA counts (the dot products; the softmax, pooling and sums are lower
order): SnapKV ``window * g * P * d``, TOVA ``g * P * d``, ObservedAttention
``g * P * (P + 1) / 2 * d``, H2O ``g * d * sum over steps of the cache``
(about ``g * d * (B * P)``).

    python benches/eviction.py [P] [B]

prints one line per policy: seconds, the bar, and their ratio. The policies
are NumPy over the native float64 probabilities (``kvselect.rules.eviction``),
not kernels: the ratio says how far they are from the bar.
"""

from __future__ import annotations

import sys
import time

import numpy as np

import kvselect as ks
from kvselect import _core
from kvselect.rules import eviction as ev


def best(fn, repeat=3):
    out = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out = min(out, time.perf_counter() - t0)
    return out


def floor_seconds(flops: float) -> float:
    per_iter = _core._fma_floor(1)[0]
    iters = max(1, int(flops / per_iter))
    sec = best(lambda: _core._fma_floor(iters))
    return sec * flops / (iters * per_iter)


def read_seconds(nbytes: int) -> float:
    src = np.ones(max(nbytes // 8, 1 << 20))
    dst = np.empty_like(src)
    sec = best(lambda: np.copyto(dst, src))
    return sec * nbytes / src.nbytes


def main() -> None:
    p_len = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
    budget = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
    g, d, window = 2, 64, 64
    rng = np.random.default_rng(0)
    q = rng.standard_normal((p_len, g, d)).astype(np.float32)
    k = rng.standard_normal((p_len, d)).astype(np.float32)
    scale = 1 / np.sqrt(d)
    cases = {
        "SnapKV": (lambda: ev.keep_top(ev.snapkv_scores(q, k, scale, window), budget), 2.0 * window * g * p_len * d),
        "TOVA": (lambda: ev.keep_top(ev.tova_scores(q, k, scale), budget), 2.0 * g * p_len * d),
        "ObservedAttention": (
            lambda: ev.keep_top(ev.observed_scores(q, k, scale), budget),
            2.0 * g * p_len * (p_len + 1) / 2 * d,
        ),
        "H2O": (
            lambda: ev.h2o_keep(q, k, budget, scale, budget // 2),
            2.0 * g * d * (sum(min(t + 1, budget + 1) for t in range(p_len))),
        ),
    }
    keys = read_seconds(p_len * d * 4)
    print(f"P = {p_len}, B = {budget}, group {g}, d {d}, window {window}; threads {ks.get_num_threads()}")
    for name, (fn, flops) in cases.items():
        sec = best(fn, repeat=1 if name in ("H2O", "ObservedAttention") else 3)
        bar = 1.5 * max(floor_seconds(flops), keys)
        print(f"{name:18} {sec * 1e3:10.2f} ms   bar {bar * 1e3:9.3f} ms   x{sec / bar:8.1f}")


if __name__ == "__main__":
    main()
