"""Block selection's decode against one read of its keys (issue 46, item 3): one query,
4 KV heads, d = 128, 131,072 keys (64 MiB of float32, 32 MiB of bfloat16), MiniMax-M3's
config (blocks of 128, top 16, init 0, local 1).

Per key format (float32, bfloat16): ``block_sparse_select`` (the selection, exact: its
scores, its block key magnitudes and the choice) and ``block_scores`` (the scores alone);
beside them, NumPy reading the float32 keys once (``np.max``) and reading and writing
them (``np.copyto``), and the FMA floor of the rule's 67 M multiply-adds at this thread
count. Medians of interleaved repetitions: on one thread, CPU time of the calling thread
(``time.thread_time``: the machine may be shared); on two, wall time (``time.perf_counter``),
and the fastest repetition beside it (on a shared machine, the calls that had both cores).

Run: ``python benches/block_decode.py [reps]`` (``KVSELECT_SIMD=avx2`` to time the AVX2
level on an AVX-512 machine).
"""

from __future__ import annotations

import sys
import time

import ml_dtypes
import numpy as np
from timing import cpu_line, fma_rate, thread_medians

import kvselect as ks
from kvselect import _core


def wall_times(cases: dict, reps: int) -> dict:
    """Wall seconds per case and repetition, repetitions interleaved across cases."""
    out: dict = {name: [] for name in cases}
    for _ in range(reps):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            out[name].append(time.perf_counter() - t0)
    return out


def main(reps: int = 41) -> None:
    n, h, d = 131072, 4, 128
    rng = np.random.default_rng(0)
    k = rng.standard_normal((n, d), dtype=np.float32)
    kb = k.astype(ml_dtypes.bfloat16)
    q = rng.standard_normal((h, d), dtype=np.float32)
    cfg = ks.BlockSparseConfig(block_size=128, top_blocks=16, init_blocks=0, local_blocks=1)
    dst = np.empty_like(k)
    # bfloat16 keys select what their float32 values do, bit for bit.
    assert np.array_equal(
        ks.block_sparse_select(q, kb, n - 1, cfg),
        ks.block_sparse_select(q, kb.astype(np.float32), n - 1, cfg),
    )
    cases = {
        "select float32": lambda: ks.block_sparse_select(q, k, n - 1, cfg),
        "select bfloat16": lambda: ks.block_sparse_select(q, kb, n - 1, cfg),
        "scores float32": lambda: ks.block_scores(q[None], k, n - 1, cfg),
        "scores bfloat16": lambda: ks.block_scores(q[None], kb, n - 1, cfg),
        "np.max float32": lambda: k.max(),
        "np.copyto float32": lambda: np.copyto(dst, k),
    }
    fmas = n * h * d
    for threads in (1, 2):
        ks.set_num_threads(threads)
        for fn in cases.values():
            fn()  # warm
        print(cpu_line())
        if threads == 1:
            floor = fmas / fma_rate()
        else:  # both threads' FMAs over wall time (fma_rate times the calling thread)
            iters = 2_000_000
            flops = _core._fma_floor(1)[0] * iters
            floor = fmas * 2 / flops * min(wall_times({"": lambda: _core._fma_floor(iters)}, 5)[""])
        if threads == 1:
            t = {name: (s, None) for name, s in thread_medians(cases, reps).items()}
            clock = "thread CPU time, median"
        else:  # the fastest too: the other core is free for some calls at least
            t = {name: (float(np.median(v)), min(v)) for name, v in wall_times(cases, reps).items()}
            clock = "wall time, median (fastest)"
        print(f"{threads} thread(s), {clock} of {reps}; FMA floor {floor * 1e3:.2f} ms")
        for name, (s, fast) in t.items():
            nbytes = kb.nbytes if "bfloat16" in name else k.nbytes
            extra = "" if fast is None else f"  ({fast * 1e3:.2f} ms, {nbytes / fast / 2**30:.1f} GiB/s)"
            print(f"  {name:18s} {s * 1e3:6.2f} ms  {nbytes / s / 2**30:5.1f} GiB/s of keys{extra}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 41)
