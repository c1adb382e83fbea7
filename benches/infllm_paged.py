"""InfLLM-v2's paged decode against its dense call on the same keys (docs/infllm.md,
"Paged decode"): one query, 131,072 tokens ((131072 - 32) // 16 + 1 = 8,191 compressed
keys), 32 query heads over 2 KV heads (MiniCPM4-like), d = 128, topk 64, the keys in
shuffled pages of 16. The two calls interleaved; medians. Run one thread:

    RAYON_NUM_THREADS=1 python benches/infllm_paged.py {float32|bfloat16|fp8_scaled} [reps]
"""

import sys
import time

import ml_dtypes
import numpy as np

import kvselect as ks

L, HQ, H, D, PAGE = 131072, 32, 2, 128, 16


def main() -> None:
    fmt = sys.argv[1] if len(sys.argv) > 1 else "float32"
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 41
    rng = np.random.default_rng(0)
    n_c = (L - 32) // 16 + 1
    q = rng.standard_normal((1, HQ, D)).astype(np.float32)
    ck = rng.standard_normal((n_c, H, D)).astype(np.float32)
    n_pages = -(-n_c // PAGE)
    perm = rng.permutation(n_pages)
    table = perm[None].astype(np.int32)
    kw: dict = {}
    sc_kw: dict = {}
    if fmt == "fp8_scaled":
        ck = (ck * 40).clip(-448, 448).astype(ml_dtypes.float8_e4m3fn)
        scale = rng.uniform(0.01, 0.1, n_c).astype(np.float32)
        flat = np.zeros((n_pages * PAGE, H * D), np.uint8)
        flat[:n_c] = ck.reshape(n_c, H * D).view(np.uint8)
        sc = np.zeros(n_pages * PAGE, np.float32)
        sc[:n_c] = scale
        pages = np.empty((n_pages, PAGE * H * D + 4 * PAGE), np.uint8)
        parts = [flat.reshape(n_pages, -1), sc.view(np.uint8).reshape(n_pages, -1)]
        pages[perm] = np.concatenate(parts, axis=1)
        cache = pages.reshape(n_pages, PAGE, -1)
        kw, sc_kw = {"page_layout": "fp8_scaled"}, {"ck_scale": scale}
    else:
        ck = ck.astype({"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}[fmt])
        flat = np.zeros((n_pages * PAGE, H * D), ck.dtype)
        flat[:n_c] = ck.reshape(n_c, H * D)
        cache = np.empty((n_pages, PAGE, H * D), ck.dtype)
        cache[perm] = flat.reshape(n_pages, PAGE, H * D)

    def paged() -> np.ndarray:
        return ks.infllm_select_paged(q, cache, table, [L], H, 64, **kw)

    def dense() -> np.ndarray:
        return ks.infllm_select(q, ck, L, 64, **sc_kw)

    assert np.array_equal(paged(), dense())
    tp: list[float] = []
    td: list[float] = []
    for _ in range(reps):
        for f, t in ((paged, tp), (dense, td)):
            t0 = time.perf_counter()
            f()
            t.append(time.perf_counter() - t0)
    print(f"{fmt}: paged {np.median(tp) * 1e3:.2f} ms, dense {np.median(td) * 1e3:.2f} ms (n_c={n_c}, {reps} reps)")


if __name__ == "__main__":
    main()
