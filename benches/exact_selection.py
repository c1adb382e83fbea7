"""What exact selection costs: kvselect's indexer and block selection on
ordinary and low-contrast data, one thread, thread CPU time (the second best
of nine calls, so a busy machine's waits are not counted), and the exact
check of the low-contrast indexer rows.

    python benches/exact_selection.py            # this build
    python benches/exact_selection.py --check    # and the check's cost

Run it with two builds (the same script) to compare them; docs/benchmarks.md
("Exact selection") has the figures and the CPU they were taken on.
"""

from __future__ import annotations

import argparse
import time
from typing import Callable, Dict

import ml_dtypes
import numpy as np

import kvselect as ks
from kvselect import checking


def _cpu(f: Callable[[], object], n: int = 9) -> float:
    f()
    ts = []
    for _ in range(n):
        t = time.thread_time()
        f()
        ts.append(time.thread_time() - t)
    return sorted(ts)[1]


def _indexer(rng: np.random.Generator, t: int, nq: int, low: bool) -> Callable[[], object]:
    h, d = 64, 128
    if low:  # every key a few ULPs from one: every score within ~1e-6 of the others
        base = rng.standard_normal(d).astype(np.float32)
        k = (base + rng.integers(-3, 4, (t, d)) * np.float32(2.0**-20)).astype(np.float32)
        q = (np.abs(rng.standard_normal((nq, h, d))) * np.sign(base)).astype(np.float32)
        w = rng.uniform(0.5, 1.5, (nq, h)).astype(np.float32)
        kk, kf, c = k, None, None
    else:  # DeepSeek-V3.2's cache: fp8 keys with per-key scales
        k = rng.standard_normal((t, d)).astype(np.float32)
        c = (np.abs(k).max(axis=1) / 448).astype(np.float32)
        kk, kf = (k / c[:, None]).astype(ml_dtypes.float8_e4m3fn).view(np.uint8), "float8_e4m3fn"
        q = rng.standard_normal((nq, h, d)).astype(np.float32)
        w = rng.standard_normal((nq, h)).astype(np.float32)
    pos = np.arange(t - nq, t)
    out = np.zeros((nq, 2048), np.int32)
    return lambda: ks.indexer_topk(q, w, kk, pos, 2048, key_scale=c, key_format=kf, out=out)


def _blocks(rng: np.random.Generator, t: int, nq: int) -> Callable[[], object]:
    d, h = 128, 8
    cfg = ks.BlockSparseConfig(128, 16, 1, 1)
    k = rng.standard_normal((t, d)).astype(ml_dtypes.bfloat16)
    q = rng.standard_normal((nq, h, d)).astype(np.float32)
    pos = np.arange(t - nq, t)
    return lambda: ks.block_sparse_select(q, k, pos, cfg)


def low_contrast_decode() -> tuple:
    """The check's low-contrast batch: ``(index_q, weights, index_k,
    query_pos)`` of 64 decode rows over 8,192 float32 keys (H 64, d 128),
    every key one vector plus a few units of ``2^-20`` and every query of
    its signs, so every score lies within a few float32 ULPs of the others
    (seeded: the same batch every run; ``check_cost.py`` saves it too)."""
    rng = np.random.default_rng(1)
    h, d, t, n = 64, 128, 8192, 64
    base = rng.standard_normal(d).astype(np.float32)
    k = (base + rng.integers(-3, 4, (t, d)) * np.float32(2.0**-20)).astype(np.float32)
    q = (np.abs(rng.standard_normal((n, h, d))) * np.sign(base)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, (n, h)).astype(np.float32)
    return q, w, k, np.arange(t - n, t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="also time the exact check of low-contrast rows")
    args = ap.parse_args()
    ks.set_num_threads(1)
    rng = np.random.default_rng(0)
    cases: Dict[str, Callable[[], object]] = {
        "indexer decode 8K (fp8)": _indexer(rng, 8192, 1, False),
        "indexer decode 64K (fp8)": _indexer(rng, 65536, 1, False),
        "indexer prefill 32 x 8K (fp8)": _indexer(rng, 8192, 32, False),
        "indexer decode 8K, low contrast": _indexer(rng, 8192, 1, True),
        "indexer prefill 32 x 8K, low contrast": _indexer(rng, 8192, 32, True),
        "blocks decode 64K (bf16)": _blocks(rng, 65536, 1),
        "blocks prefill 64 x 8K (bf16)": _blocks(rng, 8192, 64),
    }
    for name, f in cases.items():
        print(f"{name:40s} {_cpu(f) * 1e3:9.2f} ms", flush=True)
    if args.check:
        q, w, k, pos = low_contrast_decode()
        rows = ks.indexer_topk(q, w, k, pos, 2048)
        t_sel = _cpu(lambda: ks.indexer_topk(q, w, k, pos, 2048), 3)
        t0 = time.thread_time()
        report = checking.check_indexer_topk(rows, q, w, k, pos, 2048, atol=0, rtol=0)
        t_chk = time.thread_time() - t0
        print(f"check, 64 low-contrast rows of 8K: select {t_sel:.3f} s, check {t_chk:.3f} s, wrong {report['wrong']}")


if __name__ == "__main__":
    main()
