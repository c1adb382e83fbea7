"""Threads, the GIL and fork.

- Many Python threads calling every entry point at once get results
  identical (bit for bit) to serial calls, also while another thread keeps
  changing the thread count.
- The GIL really is released: a pure-Python thread keeps counting while a
  long native call runs on another thread.
- After ``os.fork()`` a child gets correct results and never hangs (each
  child is given a deadline and killed if it misses it), including a child
  forked while another thread is in the middle of a parallel call.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import kvselect as ks

THREADS = 8
CALLS_PER_THREAD = 12


@pytest.fixture(autouse=True)
def _restore_threads():
    yield
    ks.set_num_threads(0)


def _same(a, b):
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, float):
        return np.float64(a).tobytes() == np.float64(b).tobytes()
    return a == b


def _workload():
    """One call per entry point, each big enough to release the GIL and to
    split across the pool; returns {name: zero-argument callable}."""
    r = np.random.default_rng(7)
    # 4096 x 256 entries: twice kvselect's parallel threshold (2^19
    # elements per run), so the witness paths really split across the pool.
    rows, topk, L = 4096, 256, 50_000
    learned = r.integers(-1, L, (rows, topk)).astype(np.int32)
    lens = r.integers(1, L, rows).astype(np.int32)
    q3 = r.standard_normal((32, 4, 64)).astype(np.float32)
    keys = r.standard_normal((8192, 64)).astype(np.float32)
    qpos = r.integers(0, 8192, 32)
    Q = r.standard_normal((64, 8, 32)).astype(np.float32)
    K = r.standard_normal((1024, 2, 32)).astype(np.float32)
    V = r.standard_normal((1024, 2, 32)).astype(np.float32)
    apos = np.arange(960, 1024)
    cfg = ks.BlockSparseConfig(64, 8, 1, 2)
    sel = ks.block_sparse_select(r.standard_normal((64, 2, 32)).astype(np.float32), K[:, 0, :].copy(), apos, cfg)
    positions = np.concatenate([ks.positions_of_blocks(row, 1023, 1024, cfg) for row in sel[:, 0, :]])
    sparse_sel = np.stack([np.resize(positions, (2, 512))] * 64).astype(np.int32)
    probs = ks.attention_probabilities(Q, K, apos)
    cand = ks.oracle_topk(probs[:, 0, :], apos, 64)

    idx_q = r.standard_normal((4, 16, 64)).astype(np.float32)
    idx_w = r.standard_normal((4, 16)).astype(np.float32)
    idx_table = r.permutation(64).astype(np.int32)[None, :]
    # The paged block selection: the same keys as 128 pages of cfg.block_size,
    # handed out shuffled to two sequences of 4,096 tokens.
    sel_table = r.permutation(128).astype(np.int32).reshape(2, 64)
    sel_pages = np.empty((128, 64, 64), np.float32)
    sel_pages[sel_table.ravel()] = keys.reshape(128, 64, 64)
    sel_pages_bf16 = (sel_pages.view(np.uint32) >> 16).astype(np.uint16)  # raw bfloat16 bits

    def scatter():
        buf = learned.copy()
        ks.scatter_topology_witnesses(buf, lens, 32)
        return buf

    return {
        "topology_witness_indices": lambda: ks.topology_witness_indices(learned, lens, 48),
        "apply_topology_witnesses": lambda: ks.apply_topology_witnesses(learned, lens, 200, 48, 48),
        "scatter_topology_witnesses": scatter,
        "random_null": lambda: ks.random_null(200_000, 50_000, 3),
        "segment_coverage": lambda: ks.segment_coverage(learned.ravel(), L, 64),
        "attention_mass_recall": lambda: ks.attention_mass_recall(learned.ravel(), probs[0].ravel().astype(np.float64)),
        "block_sparse_select": lambda: ks.block_sparse_select(q3, keys, qpos, cfg),
        "block_sparse_select_packed": lambda: ks.block_sparse_select_packed(
            q3, keys, [0, 4096, 8192], np.arange(32) % 2, qpos % 4096, cfg
        ),
        "selector_rows": lambda: ks.Selector.random(64, 5).rows(np.arange(4000, 4512)),
        "oracle_topk": lambda: ks.oracle_topk(probs.reshape(-1, 1024), np.repeat(apos, 8), 64),
        "attention_probabilities": lambda: ks.attention_probabilities(Q, K, apos),
        "dense_attention": lambda: ks.dense_attention(Q, K, V, apos),
        "sparse_attention": lambda: ks.sparse_attention(Q, K, V, apos, sparse_sel),
        "segment_coverage_rows": lambda: ks.segment_coverage_rows(learned, lens, 64),
        "attention_mass_recall_rows": lambda: ks.attention_mass_recall_rows(cand, probs[:, 0, :].copy()),
        "output_relative_error_rows": lambda: ks.output_relative_error_rows(Q * 1.01, Q),
        # The indexer: 4 queries x 16 heads over 8,192 keys splits into key chunks.
        "indexer_topk": lambda: ks.indexer_topk(idx_q, idx_w, keys, qpos[:4], 256, num_segments=16),
        "indexer_topk_paged": lambda: ks.indexer_topk_paged(
            idx_q, idx_w, keys.reshape(64, 128, 64), idx_table, [8192], [0] * 4, qpos[:4], 256
        ),
        "block_sparse_select_paged": lambda: ks.block_sparse_select_paged(
            q3, sel_pages, sel_table, [4096, 4096], np.arange(32) % 2, qpos % 4096, cfg
        ),
        "block_sparse_select_paged-bf16-head_major-physical": lambda: ks.block_sparse_select_paged(
            q3,
            sel_pages_bf16,
            sel_table,
            [4096, 4096],
            np.arange(32) % 2,
            qpos % 4096,
            cfg,
            key_format="bfloat16",
            head_major=True,
            physical=True,
        ),
    }


def test_many_threads_give_the_serial_results():
    work = _workload()
    ks.set_num_threads(2)
    serial = {name: f() for name, f in work.items()}
    names = sorted(work)

    def worker(t):
        bad = []
        for i in range(CALLS_PER_THREAD):
            name = names[(t * 5 + i) % len(names)]
            if not _same(work[name](), serial[name]):
                bad.append(name)
        return bad

    with ThreadPoolExecutor(THREADS) as ex:
        bad = sum(ex.map(worker, range(THREADS)), [])
    assert not bad, f"results differ from the serial ones under threads: {sorted(set(bad))}"


def test_changing_the_thread_count_mid_flight_changes_no_result():
    work = _workload()
    serial = {name: f() for name, f in work.items()}
    names = sorted(work)
    stop = threading.Event()

    def churn():
        n = 0
        while not stop.is_set():
            ks.set_num_threads(n % 4)  # 0 = default, 1 = inline, 2, 3
            n += 1
            time.sleep(0.001)

    churner = threading.Thread(target=churn)
    churner.start()
    try:
        with ThreadPoolExecutor(4) as ex:
            results = list(ex.map(lambda n: (n, work[n]()), names * 2))
    finally:
        stop.set()
        churner.join()
    bad = [n for n, r in results if not _same(r, serial[n])]
    assert not bad, f"results depend on the thread count: {bad}"


# ---------------------------------------------------------------------------
# The GIL
# ---------------------------------------------------------------------------


def _long_calls():
    """Calls that take long enough to see whether another thread runs;
    each is a builder taking a size factor."""
    r = np.random.default_rng(1)

    def bss(f):
        q = r.standard_normal((16 * f, 8, 64)).astype(np.float32)
        k = r.standard_normal((65536, 64)).astype(np.float32)
        return lambda: ks.block_sparse_select(q, k, np.full(16 * f, 65535), None)

    def dense(f):
        Q = r.standard_normal((128 * f, 8, 64)).astype(np.float32)
        K = r.standard_normal((4096, 2, 64)).astype(np.float32)
        V = r.standard_normal((4096, 2, 64)).astype(np.float32)
        return lambda: ks.dense_attention(Q, K, V, np.full(128 * f, 4095))

    def sparse(f):
        Q = r.standard_normal((128 * f, 8, 64)).astype(np.float32)
        K = r.standard_normal((4096, 2, 64)).astype(np.float32)
        sel = np.broadcast_to(np.arange(2048, dtype=np.int32), (128 * f, 2, 2048)).copy()
        return lambda: ks.sparse_attention(Q, K, K, np.full(128 * f, 4095), sel)

    def probs(f):
        Q = r.standard_normal((16 * f, 8, 64)).astype(np.float32)
        K = r.standard_normal((4096, 2, 64)).astype(np.float32)
        return lambda: ks.attention_probabilities(Q, K, np.full(16 * f, 4095))

    def witness(fn):
        def build(f):
            # Every entry in segment 0: no early exit, the whole row is scanned.
            small = r.integers(0, 1000, (64, 2048)).astype(np.int32)
            learned = np.tile(small, (32 * f, 1))
            lens = np.full(learned.shape[0], 10**9, np.int32)
            return lambda: fn(learned, lens)

        return build

    def oracle(f):
        a = r.random((256 * f, 8192))
        return lambda: ks.oracle_topk(a, np.full(256 * f, 8191), 512)

    return {
        "block_sparse_select": bss,
        "dense_attention": dense,
        "sparse_attention": sparse,
        "attention_probabilities": probs,
        "topology_witness_indices": witness(lambda rows, c: ks.topology_witness_indices(rows, c, 64)),
        "apply_topology_witnesses": witness(lambda rows, c: ks.apply_topology_witnesses(rows, c, 1024, 64, 64)),
        "scatter_topology_witnesses": witness(lambda rows, c: ks.scatter_topology_witnesses(rows, c, 64)),
        "oracle_topk": oracle,
    }


LONG = _long_calls()


def _fastest(call, n=3):
    """The shortest of `n` timings of `call`, in seconds."""
    best = float("inf")
    for _ in range(n):
        t0 = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - t0)
    return best


@pytest.mark.parametrize("name", sorted(LONG))
def test_the_gil_is_released_during_a_long_call(name):
    ks.set_num_threads(1)  # leave a core for the counting thread
    build = LONG[name]
    factor = 1
    call = build(factor)
    call()  # first touches
    # The best of three: one slow call (a page fault storm, the other
    # xdist worker) must not stop the growth at a size that is fast alone.
    while factor < 64 and _fastest(call) < 0.05:
        factor *= 2
        call = build(factor)
        call()

    count = [0]
    stop = threading.Event()

    def counter():
        while not stop.is_set():
            count[0] += 1

    th = threading.Thread(target=counter)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)  # a held GIL would let the counter run 0.1 ms at most
    th.start()
    try:
        time.sleep(0.05)
        c0, t0 = count[0], time.perf_counter()
        time.sleep(0.1)  # the counter's rate with the GIL free
        rate = (count[0] - c0) / (time.perf_counter() - t0)
        c0, t0 = count[0], time.perf_counter()
        call()
        took = time.perf_counter() - t0
        done = count[0] - c0
    finally:
        stop.set()
        th.join()
        sys.setswitchinterval(interval)
    # Holding the GIL would allow at most one switch interval of counting;
    # releasing it lets the counter run for the whole call.
    share = done / (rate * took)
    assert share > 0.25, f"{name}: the other thread ran {share:.0%} of the time during a {took:.2f}s call"


# ---------------------------------------------------------------------------
# fork
# ---------------------------------------------------------------------------

CHILD_DEADLINE = 60.0


def _fork_and_check(work, serial):
    """Forks; the child runs every call of `work` and reports whether each
    equals `serial`. Returns the child's report (or fails on a hang)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            os.close(r)
            bad = [n for n, f in work.items() if not _same(f(), serial[n])]
            os.write(w, (",".join(bad) or "ok").encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    deadline = time.monotonic() + CHILD_DEADLINE
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(r)
            pytest.fail(f"the forked child hung for {CHILD_DEADLINE}s")
        time.sleep(0.01)
    report = os.read(r, 65536).decode()
    os.close(r)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child died: status {status}"
    return report


pytestmark_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork")


@pytestmark_fork
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("threads", [0, 2, 3])
def test_a_child_forked_after_parallel_calls_works(threads):
    work = _workload()
    ks.set_num_threads(threads)
    serial = {name: f() for name, f in work.items()}  # the pool is built and warm
    assert _fork_and_check(work, serial) == "ok"
    # ... and the parent still works after the fork.
    assert all(_same(f(), serial[n]) for n, f in work.items())


@pytestmark_fork
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_child_forked_while_another_thread_is_mid_call_works():
    work = _workload()
    ks.set_num_threads(2)
    serial = {name: f() for name, f in work.items()}
    hot = {n: work[n] for n in ("block_sparse_select", "dense_attention", "apply_topology_witnesses")}
    stop = threading.Event()

    def hammer():
        while not stop.is_set():
            for f in hot.values():
                f()

    th = threading.Thread(target=hammer)
    th.start()
    try:
        for _ in range(5):
            time.sleep(0.02)
            assert _fork_and_check(hot, serial) == "ok"
    finally:
        stop.set()
        th.join()


@pytestmark_fork
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_forked_child_can_set_its_thread_count():
    work = _workload()
    ks.set_num_threads(2)
    serial = {name: f() for name, f in work.items()}

    def resized():
        ks.set_num_threads(3)
        return work["dense_attention"]()

    assert _fork_and_check({"dense_attention": resized}, serial) == "ok"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
