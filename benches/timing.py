"""The timing the benchmark scripts share: interleaved repetitions, medians
(``compare.py`` and its indexer and Quest cases, wall time); CPU-time medians,
the FMA rate and the CPU line of the issue-45 floors (``moba_cases.py``,
``nsa_cases.py``)."""

import time

import numpy as np

#: Idle time before each timed call where a BLAS product is a contender, so
#: that OpenBLAS's worker threads, which busy-wait for a while after a
#: product, do not eat the cores while the next contender runs: every call
#: then starts from idle threads. (Not used for the witness cases, which
#: involve no BLAS and are measured back to back, as a serving loop runs.)
PAUSE_S = 0.003


def interleaved(cases: dict, reps: int, setup=None, pause: float = 0.0) -> dict:
    """Median ns per case, repetitions interleaved across cases."""
    times: dict = {name: [] for name in cases}
    for _ in range(reps):
        for name, fn in cases.items():
            if setup is not None:
                setup()
            if pause:
                time.sleep(pause)
            t0 = time.perf_counter_ns()
            fn()
            times[name].append(time.perf_counter_ns() - t0)
    return {name: float(np.median(t)) for name, t in times.items()}


# --- CPU-time medians and the FMA floor (``moba_cases.py``, ``nsa_cases.py``) ---
#
# The issue-45 benchmarks run on one thread of a shared machine, so they time
# CPU time of the calling thread (``time.thread_time``: waiting for the other
# jobs is not counted; their use of the caches and memory still is).


def thread_medians(cases: dict, reps: int) -> dict:
    """Median CPU seconds of the calling thread per case, repetitions
    interleaved across cases."""
    out: dict = {name: [] for name in cases}
    for _ in range(reps):
        for name, fn in cases.items():
            t0 = time.thread_time()
            fn()
            out[name].append(time.thread_time() - t0)
    return {name: float(np.median(v)) for name, v in out.items()}


def fma_rate(iters: int = 2_000_000, reps: int = 5) -> float:
    """FMAs per second of ``kvselect._core._fma_floor`` at the current thread
    count (a FMA is 2 flops), from the median of ``reps`` runs."""
    from kvselect import _core

    per_iter = _core._fma_floor(1)[0]
    t = thread_medians({"floor": lambda: _core._fma_floor(iters)}, reps)["floor"]
    return iters * per_iter / 2 / t


def cpu_line() -> str:
    """The CPU and the conditions, for the benchmark's first line: lscpu's model
    name, family and model, the SIMD flags, kvselect's level and threads, the
    load average."""
    import os
    import subprocess

    import kvselect as ks

    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        info = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
        info = {k.strip(): v.strip() for k, v in info.items()}
    except (OSError, subprocess.CalledProcessError):
        info = {}
    flags = set(info.get("Flags", "").split())
    simd = "+".join(f for f in ("avx2", "fma", "f16c", "avx512f") if f in flags) or "?"
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"cpu: {info.get('Model name', '?')} (family {info.get('CPU family', '?')} "
        f"model {info.get('Model', '?')}, {simd}); kvselect simd {ks.simd_level()}, "
        f"threads {ks.get_num_threads()}; load average {load}"
    )
