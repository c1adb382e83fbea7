"""The same corpus evaluated serially and on a 2-worker Dask LocalCluster,
and what a task costs: its run time, the bytes it reads, and the
scheduler's overhead per task — the numbers that say what N machines would
do.

    python benches/corpus_dask.py                # 8 dumps x 2 layers x 4 KV heads, 16K tokens
    python benches/corpus_dask.py --dumps 4 --tokens 8192 --workers 2

It needs ``kvselect[distributed]``. It prints the CPU (lscpu's model name),
one table, and checks that both runs' reports are the same (timing columns
excepted). Run it on a quiet machine: it measures wall time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from kvselect import corpus, evaluate
from kvselect.checking import save_dump
from kvselect.checking.files import expand


def cpu() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, StopIteration):
        return "unknown CPU"


def make_corpus(folder: Path, dumps: int, layers: int, kv_heads: int, group: int, tokens: int, d: int) -> None:
    rng = np.random.default_rng(0)
    for i in range(dumps):
        save_dump(
            folder / f"layer_block_{i:03d}.npz",
            "workload",
            q=rng.standard_normal((layers, kv_heads * group, tokens, d)).astype(np.float16),
            k=rng.standard_normal((layers, kv_heads, tokens, d)).astype(np.float16),
            v=rng.standard_normal((layers, kv_heads, tokens, d)).astype(np.float16),
        )


def untimed(report: evaluate.Report) -> str:
    doc = report.to_dict()
    doc.pop("seconds")
    for r in doc["results"]:
        r.pop("select_us_per_query")
    return json.dumps(doc, sort_keys=True)


def noop() -> None:
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dumps", type=int, default=8)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--group", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--queries", type=int, default=32)
    ap.add_argument("--budget", type=int, default=1024)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()

    runs = evaluate.check_runs([args.budget], [evaluate.derive_settings(args.budget)[0]])
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        make_corpus(folder, args.dumps, args.layers, args.kv_heads, args.group, args.tokens, args.dim)
        names = expand([str(folder)])
        tasks = args.dumps * args.layers * args.kv_heads
        size = sum(p.stat().st_size for p in folder.glob("*.npz"))

        t0 = time.perf_counter()
        serial = corpus.evaluate_corpus(names, runs, queries=args.queries)
        serial_s = time.perf_counter() - t0

        executor = corpus.Dask(workers=args.workers)
        t0 = time.perf_counter()
        dist = corpus.evaluate_corpus(names, runs, queries=args.queries, executor=executor)
        dist_s = time.perf_counter() - t0  # cluster start-up included

        # The scheduler's cost per task: round trips of tasks that do nothing.
        with corpus.Dask(workers=args.workers) as ex:
            ex.client.gather([ex.client.submit(noop, pure=False) for _ in range(200)])  # warm
            t0 = time.perf_counter()
            ex.client.gather([ex.client.submit(noop, pure=False) for _ in range(2000)])
            overhead = (time.perf_counter() - t0) / 2000
        t0 = time.perf_counter()
        with corpus.Dask(workers=args.workers):
            startup = time.perf_counter() - t0  # a local cluster's start-up alone

    same = [untimed(r) for r in dist.reports] == [untimed(r) for r in serial.reports] and untimed(
        dist.pooled
    ) == untimed(serial.pooled)
    task_s = statistics.median(dist.stats.seconds)
    serial_task_s = statistics.median(serial.stats.seconds)
    bytes_task = statistics.median(dist.stats.bytes_read)
    busy = sum(dist.stats.seconds)
    print(
        f"CPU: {cpu()}; corpus: {args.dumps} dumps x {args.layers} layers x {args.kv_heads} KV heads "
        f"(group {args.group}, d {args.dim}, {args.tokens} tokens, float16) = {tasks} tasks, "
        f"{size / 2**20:.0f} MiB; {args.queries} queries, k = {args.budget}"
    )
    print()
    print("| run | wall s | vs serial | task median s | bytes read / task | same numbers |")
    print("|---|---:|---:|---:|---:|---|")
    print(f"| serial (one process) | {serial_s:.2f} | 1.00x | {serial_task_s:.3f} | {bytes_task / 2**20:.2f} MiB | - |")
    print(
        f"| Dask, {args.workers} workers (start-up {startup:.1f} s included) | {dist_s:.2f} | "
        f"{serial_s / dist_s:.2f}x | {task_s:.3f} | {bytes_task / 2**20:.2f} MiB | "
        f"{'yes' if same else 'NO'} |"
    )
    print(
        f"| Dask, {args.workers} workers, start-up excluded | {dist_s - startup:.2f} | "
        f"{serial_s / (dist_s - startup):.2f}x | | | |"
    )
    print()
    print(
        f"scheduler round trip per task (no-op tasks): {overhead * 1e3:.2f} ms = "
        f"{overhead / task_s * 100:.2f}% of a task; busy {busy:.1f} task-s over "
        f"{dist_s - startup:.1f} s x {args.workers} workers"
    )
    print(
        f"on N machines of W workers: wall ~ {busy:.1f} task-s / (N W) + start-up, while "
        f"N W <= {tasks} tasks; each task reads {bytes_task / 2**20:.2f} MiB "
        f"(from object storage at B MB/s, add {bytes_task / 1e6:.2f} / B s per task)"
    )
    if not same:
        raise SystemExit("the distributed reports differ from the serial ones")


if __name__ == "__main__":
    main()
