"""How long `kvselect check` takes on a realistic lightning-indexer dump.

    python benches/check_throughput.py [--queries 256] [--keys 32768]

Builds a decode dump (64 index heads of dim 128, bfloat16 queries, fp8 keys
with per-key scales, top-k 2048, rows from kvselect's own indexer) and times
the indexer call that made the rows, then `kvselect.checking.check_dump` on
the dump: the check recomputes the float32 scores (one native pass), screens
them with a cheap bound on the magnitudes (|c_t| max_i |k_ti| Σ_h |w_h| Σ_i
|q_hi|), re-scores the candidates near each row's line in float64 and judges
every row. Then `kvselect.testing.assert_topk` on the same tensors (no dump:
the arrays as a test holds them). Prints each check's cost as a ratio to the
indexer_topk call that made the rows (the README's bar: 2.0x), each time the
minimum of --repeat runs (a shared machine is noisy: the minimum is the
least disturbed). Needs ml_dtypes.
"""

import argparse
import os
import tempfile
import time

import ml_dtypes
import numpy as np

import kvselect as ks
from kvselect import checking, testing


def best(fn, repeat):
    """The minimum wall time of ``repeat`` calls of ``fn`` and its last result."""
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queries", type=int, default=256)
    ap.add_argument("--keys", type=int, default=32768)
    ap.add_argument("--repeat", type=int, default=3, help="runs of each call; the minimum is reported")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    n_q, h, d, n_k, topk = args.queries, 64, 128, args.keys, 2048
    k = rng.standard_normal((n_k, d)).astype(np.float32)
    scale = (np.abs(k).max(axis=1) / 448).astype(np.float32)
    k8 = (k / scale[:, None]).astype(ml_dtypes.float8_e4m3fn)
    q = rng.standard_normal((n_q, h, d)).astype(ml_dtypes.bfloat16)
    w = (rng.standard_normal((n_q, h)) / np.sqrt(h * d)).astype(np.float32)
    pos = np.sort(rng.integers(n_k // 2, n_k, n_q))
    t_index, rows = best(lambda: ks.indexer_topk(q, w, k8, pos, topk, key_scale=scale), args.repeat)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "dump.npz")
        checking.save_dump(
            path,
            "topk",
            rows=rows.astype(np.int64),
            index_q=q,
            weights=w,
            index_k=k8,
            key_scale=scale,
            query_pos=pos,
            topk=topk,
            precision="float32",
        )
        t_dump, result = best(lambda: checking.check_dump(path), args.repeat)
    t_assert, report = best(lambda: testing.assert_topk(rows, q, w, k8, pos, topk, key_scale=scale), args.repeat)
    print(
        f"{n_q} queries x {n_k} keys x {h} heads x d {d}, top-k {topk} (min of {args.repeat}): "
        f"indexer_topk {t_index:.2f} s; check_dump {t_dump:.2f} s ({result['wrong']} wrong of "
        f"{result['rows']} rows) = {t_dump / t_index:.2f}x the indexer call; assert_topk "
        f"{t_assert:.2f} s ({report['wrong']} wrong, {report['vacuous']} vacuous) = "
        f"{t_assert / t_index:.2f}x the indexer call"
    )


if __name__ == "__main__":
    main()
