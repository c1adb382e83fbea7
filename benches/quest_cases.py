"""Quest's benchmark cases for ``compare.py`` (``--only quest``): the decode
step of docs/quest.md's speed targets (issue 41), each against the copy of
what it reads.

- **scoring**: 32 query heads over 8 KV heads, d = 128, 131,072 tokens
  (8,192 pages of 16): ``quest_scores`` (and ``quest_select``, scores + top-k)
  against one ``np.copyto`` of the page bounds it reads (``kmin`` and ``kmax``:
  8 MiB per KV head in float32, 64 MiB), target <= 1.5x;
- **building the bounds** from the keys (float32 and bfloat16, 512 / 256 MiB)
  against one ``np.copyto`` of the keys, target <= 1.5x: into the caller's
  buffers (``out=``, an engine's metadata cache, as the copy writes into
  one), and into new arrays (their first touch, 64 MiB of page faults,
  counted);
- **the O(d) update** of one decode step (``quest_update``), per step.

kvselect runs at its default threads, ``np.copyto`` single-threaded, as
everywhere in ``compare.py``; interleaved repetitions, medians.
"""

from __future__ import annotations

import numpy as np
from timing import interleaved

import kvselect as ks

H_Q, H_KV, D, TOKENS, PAGE = 32, 8, 128, 131_072, 16


def _bf16(a: np.ndarray) -> np.ndarray:
    b = a.view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def bench_quest(quick: bool) -> list:
    reps = 3 if quick else 15
    rng = np.random.default_rng(0)
    rows = []
    n_pages = TOKENS // PAGE
    # Scoring: the bounds of 8,192 pages, 8 KV heads.
    a = rng.standard_normal((n_pages, H_KV, D), dtype=np.float32)
    b = rng.standard_normal((n_pages, H_KV, D), dtype=np.float32)
    kmin, kmax = np.minimum(a, b), np.maximum(a, b)
    del a, b
    q = rng.standard_normal((H_Q, D), dtype=np.float32)
    dst_lo, dst_hi = np.empty_like(kmin), np.empty_like(kmax)

    def copy_bounds():
        np.copyto(dst_lo, kmin)
        np.copyto(dst_hi, kmax)

    t = interleaved(
        {
            "scores": lambda: ks.quest_scores(q, kmin, kmax),
            "select": lambda: ks.quest_select(q, kmin, kmax, TOKENS, 64),
            "sglang": lambda: ks.quest_select(q, kmin, kmax, TOKENS, 64, variant="sglang"),
            "copy": copy_bounds,
        },
        reps,
    )
    mib = 2 * kmin.nbytes / 2**20
    for name, what in (
        ("scores", "quest_scores, 32 q heads / 8 KV heads"),
        ("select", "quest_select, page_budget 64 (scores + top-k)"),
        ("sglang", "quest_select, variant='sglang'"),
    ):
        rows.append(
            {
                "case": what,
                "reads": f"{mib:.0f} MiB bounds",
                "ours_ms": t[name] / 1e6,
                "copy_ms": t["copy"] / 1e6,
                "target": 1.5,
            }
        )
    # Building the bounds: 131,072 tokens of 8 KV heads, d = 128.
    keys = rng.standard_normal((TOKENS, H_KV, D), dtype=np.float32)
    for fmt in ("float32", "bfloat16"):
        k = keys if fmt == "float32" else _bf16(keys)
        kf = None if fmt == "float32" else "bfloat16"
        dst = np.empty_like(k)
        out = (np.empty((n_pages, H_KV, D), np.float32), np.empty((n_pages, H_KV, D), np.float32))
        t = interleaved(
            {
                "build": lambda: ks.quest_bounds(k, key_format=kf, out=out),
                "fresh": lambda: ks.quest_bounds(k, key_format=kf),
                "copy": lambda: np.copyto(dst, k),
            },
            max(3, reps // 3),
        )
        for name, what in (("build", "out= reused"), ("fresh", "new arrays")):
            rows.append(
                {
                    "case": f"quest_bounds from {fmt} keys, {what}",
                    "reads": f"{k.nbytes / 2**20:.0f} MiB keys",
                    "ours_ms": t[name] / 1e6,
                    "copy_ms": t["copy"] / 1e6,
                    "target": 1.5,
                }
            )
    # The update: one decode step's keys folded in, O(n_kv_heads d).
    key = keys[0]
    pos = iter(range(10**9))
    steps = 2000
    t = interleaved({"update": lambda: [ks.quest_update(kmin, kmax, key, next(pos) % TOKENS) for _ in range(steps)]}, 5)
    rows.append(
        {
            "case": "quest_update, one decode step (8 KV heads x 128)",
            "reads": "4 KiB key",
            "ours_ms": t["update"] / 1e6 / steps,
            "copy_ms": None,
            "target": None,
        }
    )
    return rows


def print_quest_table(rows: list) -> None:
    print("\nQuest (decode: 131,072 tokens, pages of 16, 8 KV heads, d 128)")
    print(f"{'case':52} {'reads':>16} {'ours':>11} {'np.copyto':>11} {'ratio':>7} {'target':>7}")
    for r in rows:
        if r["copy_ms"] is None:
            print(f"{r['case']:52} {r['reads']:>16} {r['ours_ms'] * 1e3:>8.2f} µs {'':>11} {'':>7} {'':>7}")
            continue
        ratio = r["ours_ms"] / r["copy_ms"]
        met = "yes" if ratio <= r["target"] else "NO"
        print(
            f"{r['case']:52} {r['reads']:>16} {r['ours_ms']:>8.2f} ms {r['copy_ms']:>8.2f} ms "
            f"{ratio:>6.2f}x ≤{r['target']:.1f}x {met}"
        )
