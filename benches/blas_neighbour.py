"""kvselect beside OpenBLAS in one NumPy pipeline: does either slow the other?

After a product, OpenBLAS's idle worker threads spin (for up to
``OPENBLAS_THREAD_TIMEOUT``: by default 2^28 cycles, ~0.1 s) before they
sleep; a kvselect call made meanwhile shares the cores with them. The reverse
question: does kvselect's pool (rayon's workers, which also spin briefly
when idle) slow the BLAS call after it? Each configuration runs in a fresh
process (OpenBLAS reads its environment once), timing, in alternation:

- an indexer decode (64 heads × d 128 × 131,072 float32 keys, top 2,048) alone
  and right after a small product (256 × 256 float32 matmul);
- a product (512 × 512 float32 matmul) alone and right after the decode.

Each "alone" call follows a 0.3 s pause (every thread idle and asleep).
Medians of ``--reps`` (default 15) of each.

    python benches/blas_neighbour.py            # every configuration
    python benches/blas_neighbour.py --reps 5   # quicker
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CONFIGS = {
    "default": {},
    "OPENBLAS_THREAD_TIMEOUT=4": {"OPENBLAS_THREAD_TIMEOUT": "4"},
    "OPENBLAS_NUM_THREADS=1": {"OPENBLAS_NUM_THREADS": "1"},
}


def child(reps: int) -> dict:
    import numpy as np

    import kvselect as ks

    rng = np.random.default_rng(0)
    h, d, t = 64, 128, 131_072
    keys = rng.standard_normal((t, d), dtype=np.float32)
    q = rng.standard_normal((1, h, d), dtype=np.float32)
    w = rng.standard_normal((1, h), dtype=np.float32)
    pos = np.array([t - 1], np.int32)
    small = rng.standard_normal((256, 256), dtype=np.float32)
    big = rng.standard_normal((512, 512), dtype=np.float32)

    def decode() -> None:
        ks.indexer_topk(q, w, keys, pos, 2048)

    def product() -> None:
        big @ big

    def timed(fn) -> float:
        t0 = time.perf_counter_ns()
        fn()
        return (time.perf_counter_ns() - t0) / 1e6

    decode()
    product()
    out: dict = {k: [] for k in ("decode alone", "decode after product", "product alone", "product after decode")}
    for _ in range(reps):
        time.sleep(0.3)
        out["decode alone"].append(timed(decode))
        small @ small
        out["decode after product"].append(timed(decode))
        time.sleep(0.3)
        out["product alone"].append(timed(product))
        decode()
        out["product after decode"].append(timed(product))
    return {k: statistics.median(v) for k, v in out.items()} | {"threads": ks.get_num_threads()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.reps)))
        return 0
    import numpy as np

    import kvselect as ks

    cpu = next(
        (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
        "unknown",
    )
    print(f"CPU {cpu}, {os.cpu_count()} cores, kvselect {ks.simd_level()}, numpy {np.__version__}")
    print("| configuration | decode alone | after a product | product alone | after a decode |")
    print("|---|---|---|---|---|")
    for name, env in CONFIGS.items():
        clean = {k: v for k, v in os.environ.items() if not k.startswith("OPENBLAS_") and k != "OMP_WAIT_POLICY"}
        res = subprocess.run(
            [sys.executable, __file__, "--child", "--reps", str(args.reps)],
            env=clean | env,
            capture_output=True,
            text=True,
            check=True,
        )
        r = json.loads(res.stdout)
        print(
            f"| {name} | {r['decode alone']:.2f} ms | {r['decode after product']:.2f} ms "
            f"| {r['product alone']:.2f} ms | {r['product after decode']:.2f} ms |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
