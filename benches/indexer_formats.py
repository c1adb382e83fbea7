"""The lightning indexer by query × key format, one format per process (issue 46 (b)).

``benches/compare.py --only indexer`` times the formats interleaved in one process: the
way to compare them call by call, but not how a server runs (one format, call after call).
Here each format's decode (1 × 131,072 keys) and prefill (128 × 32,768), DeepSeek's shapes
(64 heads, d 128, top-k 2048), run in a fresh process of their own: a few warm-up calls, then
the median of ``reps`` back-to-back calls, on 1 and on 2 threads. The process's level is
printed beside it (``+ AMX screen`` where the indexer's AMX screen runs; set
``KVSELECT_SIMD=avx512`` to time the same without it).

Run: ``python benches/indexer_formats.py [reps]``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

CHILD = r"""
import json, sys, time
import ml_dtypes, numpy as np
sys.path.insert(0, {here!r})
from indexer_cases import TOPK, make
from kvselect.workloads import quantize_fp8
import kvselect as ks
from kvselect import _core

fmt, n_q, t, reps, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
ks.set_num_threads(threads)
q, w, k, pos = make(n_q, t)
if fmt == "float32":
    call = lambda: ks.indexer_topk(q, w, k, pos, TOPK)
elif fmt == "fp8":
    k8, scale = quantize_fp8(k)
    q8 = q.astype(ml_dtypes.float8_e4m3fn)
    call = lambda: ks.indexer_topk(q8, w, k8, pos, TOPK, key_scale=scale, key_format="float8_e4m3fn")
else:
    qb, kb = q.astype(ml_dtypes.bfloat16), k.astype(ml_dtypes.bfloat16)
    call = lambda: ks.indexer_topk(qb, w, kb, pos, TOPK)
for _ in range(3):
    call()
times = []
for _ in range(reps):
    t0 = time.perf_counter()
    call()
    times.append(time.perf_counter() - t0)
level = ks.simd_level() + (" + AMX screen" if _core._amx_screen() else "")
print(json.dumps({{"ms": float(np.median(times)) * 1e3, "level": level}}))
"""


def run(fmt: str, n_q: int, t: int, reps: int, threads: int) -> dict:
    here = os.path.dirname(os.path.abspath(__file__))
    code = CHILD.format(here=here)
    args = [sys.executable, "-c", code, fmt, str(n_q), str(t), str(reps), str(threads)]
    out = subprocess.run(args, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    from timing import cpu_line

    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 21
    print(cpu_line())
    names = {"float32": "float32 × float32", "fp8": "fp8 × fp8 + scales", "bf16": "bfloat16 × bfloat16"}
    for case, n_q, t, r in (
        ("decode 1 × 131,072", 1, 131072, reps),
        ("prefill 128 × 32,768", 128, 32768, max(3, reps // 4)),
    ):
        for threads in (1, 2):
            got = {f: run(f, n_q, t, r, threads) for f in names}
            base = got["float32"]["ms"]
            cells = ", ".join(f"{names[f]} {g['ms']:.2f} ({g['ms'] / base:.3f}×)" for f, g in got.items())
            print(f"{case}, {threads} thread(s), {got['fp8']['level']}: {cells}")


if __name__ == "__main__":
    main()
