"""What the exact check costs on low-contrast rows, against the selection
call on the same inputs: the 64-row decode batch of ``exact_selection.py``
(8,192 keys, H 64, d 128, float32, every score within a few ULPs of the
others) through :func:`kvselect.checking.check_indexer_topk` and as a dump
through :func:`kvselect.checking.check_dump`, and the low-contrast rows of
``kvselect.testing.cases`` (1,029 keys; 262,149 keys with ``topk = 2048``).
One thread, thread CPU time, the second best of several calls (of hundreds,
the same quantile, for a call well under a millisecond).

The selection the check is held to is the float32 ``indexer_topk`` of a
build before exact selection: save the inputs with this build, then time
the selection with each build on the same files (a build without the dense
check times only the selection)::

    python benches/check_cost.py --save DIR      # this build: writes DIR/*.npz
    python benches/check_cost.py --inputs DIR    # any build: times them

docs/benchmarks.md ("The check's cost on near ties") has the figures and
the CPU they were taken on.
"""

from __future__ import annotations

import argparse
import glob
import os
import tempfile
import time
from typing import Callable

import numpy as np
from exact_selection import low_contrast_decode

import kvselect as ks


def _cpu(f: Callable[[], object], n: int = 7) -> float:
    """``f``'s thread CPU time: the second best of ``n`` calls, or for a
    call under ~35 ms the same order statistic (the 1/7 quantile) of as
    many calls as fill a quarter second (at most 1,000): a 0.1 ms call is
    timed over hundreds."""
    t = time.thread_time()
    f()
    reps = max(n, min(1000, int(0.25 / max(time.thread_time() - t, 1e-6))))
    ts = []
    for _ in range(reps):
        t = time.thread_time()
        f()
        ts.append(time.thread_time() - t)
    return sorted(ts)[max(1, reps // 7)]


def _save(out: str) -> None:
    from kvselect.testing import cases  # (its bfloat16 / fp8 keys need ml_dtypes)

    os.makedirs(out, exist_ok=True)
    q, w, k, pos = low_contrast_decode()
    batch = dict(index_q=q, weights=w, index_k=k, query_pos=pos, topk=2048)
    runs = [("64 rows of 8,192 keys, H 64, d 128, float32", batch)]
    for key_dtype in ("float32", "bfloat16", "float8_e4m3fn"):
        c = cases.low_contrast(key_dtype=key_dtype)
        runs.append((f"cases.low_contrast, 1,029 keys, {key_dtype}", dict(c.inputs)))
    for key_dtype in ("float32", "float8_e4m3fn"):
        c = cases.low_contrast(n_keys=262149, topk=2048, key_dtype=key_dtype)
        runs.append((f"cases.low_contrast, 262,149 keys, topk 2048, {key_dtype}", dict(c.inputs)))
    for i, (name, inputs) in enumerate(runs):
        k = np.asarray(inputs["index_k"])
        fmt = {"bfloat16": (np.uint16, "bfloat16"), "float8_e4m3fn": (np.uint8, "float8_e4m3fn")}.get(k.dtype.name)
        if fmt is not None:  # raw bits, so a build's NumPy needs no ml_dtypes
            inputs["index_k"], inputs["key_format"] = k.view(fmt[0]), fmt[1]
        np.savez(os.path.join(out, f"{i}.npz"), name=name, **inputs)


def _time(inputs: str) -> None:
    has_check = hasattr(ks._core, "_indexer_rescore_verdict")
    print(f"kvselect {ks.__version__}, {ks.simd_level()}, dense check: {has_check}")
    for path in sorted(glob.glob(os.path.join(inputs, "*.npz")), key=lambda p: int(os.path.basename(p)[:-4])):
        z = dict(np.load(path))
        name = str(z.pop("name"))
        topk = int(z.pop("topk"))
        q, w, k, pos = (z.pop(a) for a in ("index_q", "weights", "index_k", "query_pos"))
        kw = {a: (str(b) if a == "key_format" else b) for a, b in z.items()}
        select = _cpu(lambda: ks.indexer_topk(q, w, k, pos, topk, **kw))
        line = f"{name:60s} select {select * 1e3:9.3f} ms"
        if has_check:
            from kvselect import checking

            rows = ks.indexer_topk(q, w, k, pos, topk, **kw)
            check = _cpu(lambda: checking.check_indexer_topk(rows, q, w, k, pos, topk, atol=0, rtol=0, **kw), 5)
            line += f"  check {check * 1e3:9.3f} ms"
            if path.endswith(f"{os.sep}0.npz"):
                with tempfile.TemporaryDirectory() as tmp:
                    dump = os.path.join(tmp, "dump.npz")
                    checking.save_dump(
                        dump, "topk", rows=rows, index_q=q, weights=w, index_k=k, query_pos=pos, topk=topk
                    )
                    t_dump = _cpu(lambda: checking.check_dump(dump, atol=0, rtol=0), 5)
                line += f"  check_dump {t_dump * 1e3:9.3f} ms"
        print(line, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--save", metavar="DIR", help="write the inputs (this build's kvselect.testing)")
    g.add_argument("--inputs", metavar="DIR", help="time the selection (and the check) on saved inputs")
    args = ap.parse_args()
    ks.set_num_threads(1)
    if args.save:
        _save(args.save)
    else:
        _time(args.inputs)


if __name__ == "__main__":
    main()
