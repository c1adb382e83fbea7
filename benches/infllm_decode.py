"""InfLLM-v2's dense call at decode (docs/infllm.md, "Dense decode"): `infllm_select` for
the last `n_q` queries (default 1) of a sequence of 131,072 tokens ((131072 - 32) // 16 + 1 =
8,191 compressed keys), 32 query heads over 2 KV heads (MiniCPM4-like), d = 128, topk 64, its
compressed keys float32, bfloat16 or fp8 e4m3fn with a float32 scale a key. Only the dense call
is timed, so two builds compare in separate processes (interleave them). Run one thread:

    RAYON_NUM_THREADS=1 python benches/infllm_decode.py {float32|bfloat16|fp8_scaled} [reps] [tokens] [n_q]

Prints `<fmt> tokens=<L> n_q=<n>: median <ms> ms, range <lo>-<hi> ms (<reps> reps)`.
"""

import sys
import time

import ml_dtypes
import numpy as np

import kvselect as ks

HQ, H, D = 32, 2, 128


def main() -> None:
    fmt = sys.argv[1] if len(sys.argv) > 1 else "float32"
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 41
    tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 131072
    n_q = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    rng = np.random.default_rng(0)
    n_c = (tokens - 32) // 16 + 1
    q = rng.standard_normal((n_q, HQ, D)).astype(np.float32)
    ck = rng.standard_normal((n_c, H, D)).astype(np.float32)
    kw: dict = {}
    if fmt == "fp8_scaled":
        ck = (ck * 40).clip(-448, 448).astype(ml_dtypes.float8_e4m3fn)
        kw = {"ck_scale": rng.uniform(0.01, 0.1, n_c).astype(np.float32)}
    else:
        ck = ck.astype({"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}[fmt])

    def dense() -> np.ndarray:
        return ks.infllm_select(q, ck, tokens, 64, **kw)

    dense()
    t: list[float] = []
    for _ in range(reps):
        t0 = time.perf_counter()
        dense()
        t.append((time.perf_counter() - t0) * 1e3)
    print(
        f"{fmt} tokens={tokens} n_q={n_q}: median {np.median(t):.3f} ms, "
        f"range {min(t):.3f}-{max(t):.3f} ms ({reps} reps)"
    )


if __name__ == "__main__":
    main()
