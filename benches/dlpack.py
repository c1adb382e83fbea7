"""What reading an argument through DLPack costs: the same call on NumPy buffers and on DLPack
wrappers of the same buffers, interleaved in one run.

    python benches/dlpack.py [--queries 64] [--keys 32768] [--repeat 31]

A decode batch of the lightning indexer (64 heads of dim 128, bfloat16 keys, top-k 2048): every
array argument (index_q, weights, index_k, query_pos, out=) passed as a NumPy array, then as an
object exposing only `__dlpack__` / `__dlpack_device__` over the same memory (index_k as a
bfloat16 DLPack tensor through tests/python/dlpack_producers.py, the rest through NumPy's own
export). Prints the CPU model, both medians and their ratio (the bar: <= 1.05x). The
measurements alternate, so drift on a shared machine hits both sides alike.
"""

import argparse
import pathlib
import statistics
import subprocess
import sys
import time
import timeit

import numpy as np

import kvselect as ks
from kvselect._core import _dlpack_array

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "python"))
from dlpack_producers import NumpyExport as Export
from dlpack_producers import Producer, bf16_bits


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no lscpu)"
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=64)
    ap.add_argument("--keys", type=int, default=32768)
    ap.add_argument("--repeat", type=int, default=31)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    n, h, d, t, topk = a.queries, 64, 128, a.keys, 2048
    q = rng.standard_normal((n, h, d), dtype=np.float32)
    w = rng.standard_normal((n, h), dtype=np.float32)
    k = bf16_bits(rng.standard_normal((t, d), dtype=np.float32))
    pos = np.full(n, t - 1, dtype=np.int64)
    out = np.zeros((n, topk), dtype=np.int32)

    def numpy_call():
        ks.indexer_topk(q, w, k, pos, topk, key_format="bfloat16", out=out)

    def dlpack_call():
        ks.indexer_topk(Export(q), Export(w), Producer(k, dtype="bfloat16"), Export(pos), topk, out=Export(out))

    numpy_call()
    want = out.copy()
    out[:] = -1
    dlpack_call()
    assert np.array_equal(out, want), "the DLPack call must give the NumPy call's rows"
    times = {"numpy": [], "dlpack": []}
    for _ in range(a.repeat):
        for name, fn in (("numpy", numpy_call), ("dlpack", dlpack_call)):
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    med = {name: statistics.median(v) for name, v in times.items()}
    print(f"CPU: {cpu_model()}")
    print(
        f"indexer_topk, {n} queries x {t} bf16 keys x {h} heads x d {d}, topk {topk}, "
        f"{a.repeat} interleaved runs each, simd {ks.simd_level()}"
    )
    print(f"  NumPy buffers  median {med['numpy'] * 1e3:9.3f} ms")
    print(f"  DLPack objects median {med['dlpack'] * 1e3:9.3f} ms")
    print(f"  ratio {med['dlpack'] / med['numpy']:.3f}x (bar: <= 1.05x)")
    # The fixed cost per argument, apart from the call: NumPy's export plus kvselect's view, and
    # the ctypes test producer's own capsule (slow Python, the producer's cost, not kvselect's).
    view = Export(q)
    per_view = min(timeit.repeat(lambda: _dlpack_array(view), number=1000, repeat=5)) / 1000
    producer = Producer(k, dtype="bfloat16")
    per_capsule = min(timeit.repeat(lambda: producer.__dlpack__(max_version=(1, 3)), number=200, repeat=5)) / 200
    print(
        f"  per argument: NumPy export + kvselect view {per_view * 1e6:.1f} us; "
        f"the ctypes producer's own capsule {per_capsule * 1e6:.1f} us"
    )


if __name__ == "__main__":
    main()
