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

Besides the FMAs, each policy takes one float64 ``exp`` per (query, key)
pair it reads -- SnapKV ``window * g * P``, TOVA ``g * P``,
ObservedAttention ``g * P * (P + 1) / 2``, H2O ``g * sum over steps of the
cache`` -- from the C library (the arithmetic that keeps them bit for bit
with their twins, ``src/eviction/mod.rs``); the last column is the policy's
time divided by that count, the most each ``exp`` can cost.

    python benches/eviction.py [P] [B] [THREADS]

Times are CPU seconds of the whole process (``time.process_time``, every
thread's), best of three, for the policies and the bar's two measurements
alike: on a machine shared with other work, wall time measures the other
work too. ``THREADS`` sets ``kvselect.set_num_threads`` (default: as is).

prints one line per policy: seconds, the bar, their ratio, and the time per
``exp``. The policies are the native core (``src/eviction/``, through
``kvselect.rules.eviction``).
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
        t0 = time.process_time()
        fn()
        out = min(out, time.process_time() - t0)
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
    if len(sys.argv) > 3:
        ks.set_num_threads(int(sys.argv[3]))
    g, d, window = 2, 64, 64
    rng = np.random.default_rng(0)
    q = rng.standard_normal((p_len, g, d)).astype(np.float32)
    k = rng.standard_normal((p_len, d)).astype(np.float32)
    scale = 1 / np.sqrt(d)
    h2o_pairs = g * sum(min(t + 1, budget + 1) for t in range(p_len))
    cases = {
        "SnapKV": (lambda: ev.keep_top(ev.snapkv_scores(q, k, scale, window), budget), window * g * p_len),
        "TOVA": (lambda: ev.keep_top(ev.tova_scores(q, k, scale), budget), g * p_len),
        "ObservedAttention": (
            lambda: ev.keep_top(ev.observed_scores(q, k, scale), budget),
            g * p_len * (p_len + 1) // 2,
        ),
        "H2O": (lambda: ev.h2o_keep(q, k, budget, scale, budget // 2), h2o_pairs),
    }
    keys = read_seconds(p_len * d * 4)
    print(f"P = {p_len}, B = {budget}, group {g}, d {d}, window {window}; threads {ks.get_num_threads()}")
    for name, (fn, pairs) in cases.items():
        sec = best(fn)
        bar = 1.5 * max(floor_seconds(2.0 * d * pairs), keys)
        print(
            f"{name:18} {sec * 1e3:10.2f} ms   bar {bar * 1e3:9.3f} ms   x{sec / bar:6.1f}"
            f"   {pairs / 1e6:7.3f} M exp   {sec / pairs * 1e9:6.1f} ns/exp"
        )


if __name__ == "__main__":
    main()
