"""The timing both benchmark scripts share (``compare.py`` and its indexer
cases): interleaved repetitions, medians."""

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
