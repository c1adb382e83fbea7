"""MInference's vertical-slash estimate at L = 131,072, 32 query heads over 8
KV heads, d = 128 (issue #42's target): kvselect's ``vslash_select`` against
NumPy's bare product of each head's last 64 queries with its keys
(``q[h] @ keys[:, g].T``, the one product the estimate cannot avoid), both on
one thread (``OPENBLAS_NUM_THREADS=1``, ``kvselect.set_num_threads(1)``),
measured with ``time.thread_time`` (CPU time of this thread: the machine is
shared), repetitions interleaved, medians. First, the peak extra memory of
one call in the fresh process: ``VmHWM`` reset through ``/proc/self/clear_refs``
before it, read after, less the resident size before (Linux; it counts the
outputs too, ``n_heads · (nv + ns)`` int32).

Run: ``OPENBLAS_NUM_THREADS=1 python benches/vslash.py [--heads 32 --kv-heads 8 --len 131072 --reps 5]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np

import kvselect as ks


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--len", type=int, default=131072)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    if os.environ.get("OPENBLAS_NUM_THREADS") != "1":
        raise SystemExit("set OPENBLAS_NUM_THREADS=1: both contenders on one thread")
    ks.set_num_threads(1)
    rng = np.random.default_rng(0)
    keys = rng.standard_normal((a.len, a.kv_heads, a.d), dtype=np.float32)
    q = rng.standard_normal((a.heads, 64, a.d), dtype=np.float32)
    group = a.heads // a.kv_heads

    def bare() -> None:
        for h in range(a.heads):
            q[h] @ keys[:, h // group].T

    def kvselect() -> None:
        ks.vslash_select(q, keys, 1000, 6096)

    # Memory first, in this fresh process: later calls would reuse memory the
    # allocator kept from earlier ones, which a peak then does not see.
    extra = None
    if os.path.exists("/proc/self/clear_refs"):
        rss = _status("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS
        kvselect()
        extra = _status("VmHWM") - rss
    times: dict = {"numpy q @ k.T": [], "kvselect vslash_select": []}
    for _ in range(a.reps):
        for name, fn in zip(times, (bare, kvselect)):
            t0 = time.thread_time()
            fn()
            times[name].append(time.thread_time() - t0)
    med = {k: float(np.median(v)) for k, v in times.items()}
    cpu = "unknown"
    if os.path.exists("/proc/cpuinfo"):
        cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), cpu)
    print(f"CPU: {cpu} ({platform.machine()}), kvselect SIMD level {ks.simd_level()}, one thread")
    print(f"L = {a.len}, {a.heads} heads over {a.kv_heads} KV heads, d = {a.d}, float32 keys; medians of {a.reps}")
    for k, v in med.items():
        print(f"  {k:<24} {v * 1e3:9.1f} ms  ({v / a.heads * 1e3:.2f} ms a head)")
    print(f"  ratio kvselect / numpy   {med['kvselect vslash_select'] / med['numpy q @ k.T']:.2f} (target <= 1.5)")
    if extra is not None:
        budget = 64 * a.len * 4
        print(
            f"  peak extra memory of one call: {extra / 2**20:.2f} MiB (target 64 * L * 4 = {budget / 2**20:.2f} MiB)"
        )


if __name__ == "__main__":
    main()
