"""Soak: repeated calls of every entry point keep the resident set flat.

Each entry point -- accepted calls, refused calls (errors carry attributes)
and in-place calls -- is called N times after a warm-up, and the growth of
the process's RSS over those N calls must stay under a bound. Inputs are
sized so that leaking one output (or one error) per call would exceed the
bound several times over.

Quick mode (CI): N = 10^4. ``KVSELECT_SOAK=long``: N = 10^5.

RSS is a property of the whole process, and a test suite that ran before
this module leaves heap slack of its own that can absorb a leak unseen (it
did: the control below passed alone and failed after the full suite). So
the soak runs in a fresh interpreter: in the parent pytest process this
module is one test that runs the module again as a child and requires it to
pass; the measurements themselves run only in that child.
"""

from __future__ import annotations

import ctypes
import gc
import os
import subprocess
import sys

import numpy as np
import pytest

import kvselect as ks

LONG = os.environ.get("KVSELECT_SOAK", "").lower() == "long"
N = 100_000 if LONG else 10_000
WARMUP = 1_000
#: RSS growth allowed over N calls. A leak of 1 KiB per call is 10 MiB in
#: quick mode (100 MiB in long mode).
BOUND = 4 << 20

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="RSS is read from /proc/self/statm")


def _malloc_trim() -> None:
    """Return the C heap's free pages to the OS (glibc), so that slack left
    by earlier tests in the same process cannot absorb a leak unseen."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def rss() -> int:
    """Resident set size after a collection and a heap trim."""
    gc.collect()
    _malloc_trim()
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _calls():
    r = np.random.default_rng(3)
    learned = r.integers(-1, 5000, (16, 64)).astype(np.int32)  # 4 KiB
    lens = r.integers(1, 5000, 16).astype(np.int32)
    out = np.empty((16, 64), np.int32)
    q = r.standard_normal((4, 2, 16)).astype(np.float32)
    k = r.standard_normal((512, 16)).astype(np.float32)
    cfg = ks.BlockSparseConfig(16, 8, 1, 2)
    sel_out = np.empty((4, 2, 8), np.int32)
    Q = r.standard_normal((4, 4, 16)).astype(np.float32)
    K = r.standard_normal((64, 2, 16)).astype(np.float32)
    V = r.standard_normal((64, 2, 32)).astype(np.float32)
    pos = np.array([10, 30, 50, 63])
    sel = np.tile(np.arange(16, dtype=np.int32), (4, 2, 1))
    probs = ks.attention_probabilities(Q, K, pos)
    att = probs.reshape(-1, 64)
    cand = np.tile(np.arange(32, dtype=np.int32), (16, 1))
    row = np.abs(r.standard_normal(1000))
    buf = learned.copy()
    sink = {}
    # Indexer inputs: fp8 keys as raw bytes with scales, and vLLM-layout pages.
    k_fp8 = (np.clip(k, -8, 8) * 16).astype(np.int8).view(np.uint8)
    k_scale = np.full(512, 0.5, np.float32)
    pages = np.zeros((40, 16, 1, 16 + 4), np.uint8)
    table = np.arange(40, dtype=np.int32).reshape(2, 20)
    # Block selection on engine caches: 16 queries x 2 heads x width 8 is
    # 1 KiB out per call. bfloat16 / float8 pages and keys are ml_dtypes
    # arrays when it is installed (the dtype lookup is exercised), raw
    # views with key_format otherwise.
    bq = r.standard_normal((16, 2, 16)).astype(np.float32)
    bpos = r.integers(0, 256, 16)
    bsid = np.arange(16) % 2
    bcache = r.standard_normal((40, 16, 16)).astype(np.float32)  # pages of cfg.block_size
    btable = r.permutation(40).astype(np.int32).reshape(2, 20)
    blens = np.array([300, 256])
    bf16_bits = lambda a: (a.view(np.uint32) >> 16).astype(np.uint16)  # noqa: E731
    fp8_bytes = (r.integers(0, 0x7F, bcache.shape) | (r.integers(0, 2, bcache.shape) << 7)).astype(np.uint8)
    try:
        import ml_dtypes

        k_bf16, k_bf16_fmt = k.astype(ml_dtypes.bfloat16), None
        pages_bf16, pages_bf16_fmt = bcache.astype(ml_dtypes.bfloat16), None
        pages_fp8, pages_fp8_fmt = fp8_bytes.view(ml_dtypes.float8_e4m3fn), None
    except ImportError:
        k_bf16, k_bf16_fmt = bf16_bits(k), "bfloat16"
        pages_bf16, pages_bf16_fmt = bf16_bits(bcache), "bfloat16"
        pages_fp8, pages_fp8_fmt = fp8_bytes, "float8_e4m3fn"
    bsel = ks.block_sparse_select(bq, k, bpos, cfg)
    bsel_hm = ks.block_sparse_select(bq, k, bpos, cfg, head_major=True)
    bsel_out = np.empty((16, 2, 8), np.int32)
    bsel_out_hm = np.empty((2, 16, 8), np.int32)
    bad_table = btable.copy()
    bad_table[1, 3] = 40  # past the cache, among the entries read
    wide_table = np.zeros((2, 128), np.int32)  # out= over it overlaps the table
    wide_table[:, :20] = btable

    def catch(f, exc):
        def call():
            try:
                f()
            except exc:
                pass
            else:  # pragma: no cover
                raise AssertionError("expected a refusal")

        return call

    rng_check = np.random.default_rng(7)
    check_scores = rng_check.standard_normal((64, 256)).astype(np.float32)
    check_rows = np.argsort(-check_scores, axis=1)[:, :32].astype(np.int64)
    check_rows[::4, 0] = check_rows[::4, 1]  # duplicates
    check_rows[1::4, 0] = 300  # not causal
    check_rows[2::4, 5] = np.argsort(-check_scores[2::4], axis=1)[:, 100]  # wrong selection
    # The same rows as global slots (pages of 16 rows at a stride of 32), and
    # one outside the table.
    slot_table = r.permutation(80).astype(np.int32).reshape(4, 20)
    slot_req = np.arange(64) % 4
    slot_rows = np.where(check_rows >= 0, slot_table[slot_req[:, None], check_rows // 16] * 32 + check_rows % 16, -1)
    slot_rows[::8, 1] = 80 * 32 + 3
    slots = ks.GlobalSlots(slot_table, slot_req, 16, block_stride_rows=32)
    # Block rows of every kind of problem: 16 queries x 2 heads.
    blk_scores = ks.block_scores(bq, k, bpos, cfg).reshape(32, -1)
    blk_nb = np.repeat(-(-np.minimum(bpos + 1, 512) // 16), 2)
    blk_rows = bsel.reshape(32, 8).astype(np.int64)
    blk_rows[::4, 0] = blk_rows[::4, 1]  # duplicates (and a forced block missing)
    blk_rows[1::4, 7] = 99  # not causal
    for i in range(2, 32, 4):  # a free block for an unchosen one: wrong selections
        free = [b for b in range(1, blk_nb[i] - 2) if b not in blk_rows[i]]
        blk_rows[i, 1] = free[0] if free else blk_rows[i, 1]
    # Witness rows: the rule's scatter, then bugs in every part of some rows.
    wit_after = learned.copy()
    ks.scatter_topology_witnesses(wit_after, lens, 16)
    wit_after[::3, 0] += 1
    wit_after[1::3, 48] = -7  # the first witness slot
    wit_after[2::3, 63] = 4
    calls = {
        "segment_of": lambda: ks.segment_of(12345, 100000, 64),
        "topology_witness_indices": lambda: ks.topology_witness_indices(learned, lens, 64),
        "topology_witness_indices-out": lambda: ks.topology_witness_indices(learned, lens, 64, out=out),
        "apply_topology_witnesses": lambda: ks.apply_topology_witnesses(learned, lens, 32, 32, 32),
        "apply_topology_witnesses-int64": lambda: ks.apply_topology_witnesses(
            learned.astype(np.int64), lens, 32, 32, 32
        ),
        "scatter_topology_witnesses": lambda: ks.scatter_topology_witnesses(buf, lens, 16),
        "random_null": lambda: ks.random_null(5000, 256, 1),
        "locality_null": lambda: ks.locality_null(5000, 256),
        "segment_coverage": lambda: ks.segment_coverage(learned[0], 5000, 64),
        "attention_mass_recall": lambda: ks.attention_mass_recall(learned[0], row),
        "BlockSparseConfig": lambda: sink.__setitem__("cfg", ks.BlockSparseConfig(16, 8, 1, 2)),
        "block_sparse_select": lambda: ks.block_sparse_select(q, k, pos * 8, cfg),
        "block_sparse_select-out": lambda: ks.block_sparse_select(q, k, pos * 8, cfg, out=sel_out),
        "block_sparse_select_packed": lambda: ks.block_sparse_select_packed(
            q, k, [0, 256, 512], [0, 1, 0, 1], pos, cfg
        ),
        "block_sparse_select-bf16": lambda: ks.block_sparse_select(bq, k_bf16, bpos, cfg, key_format=k_bf16_fmt),
        "block_sparse_select-bf16-out": lambda: ks.block_sparse_select(
            bq, k_bf16, bpos, cfg, key_format=k_bf16_fmt, out=bsel_out
        ),
        "block_sparse_select-bf16-head_major-out": lambda: ks.block_sparse_select(
            bq, k_bf16, bpos, cfg, key_format=k_bf16_fmt, head_major=True, out=bsel_out_hm
        ),
        "block_sparse_select_paged": lambda: ks.block_sparse_select_paged(bq, bcache, btable, blens, bsid, bpos, cfg),
        "block_sparse_select_paged-bf16": lambda: ks.block_sparse_select_paged(
            bq, pages_bf16, btable, blens, bsid, bpos, cfg, key_format=pages_bf16_fmt
        ),
        "block_sparse_select_paged-fp8": lambda: ks.block_sparse_select_paged(
            bq, pages_fp8, btable, blens, bsid, bpos, cfg, key_format=pages_fp8_fmt
        ),
        "block_sparse_select_paged-head_major-out": lambda: ks.block_sparse_select_paged(
            bq, bcache, btable, blens, bsid, bpos, cfg, head_major=True, out=bsel_out_hm
        ),
        "block_sparse_select_paged-physical": lambda: ks.block_sparse_select_paged(
            bq, pages_bf16, btable, blens, bsid, bpos, cfg, key_format=pages_bf16_fmt, physical=True
        ),
        "positions_of_blocks": lambda: ks.positions_of_blocks([0, 3, 7, -1], 500, 512, cfg),
        "positions_of_blocks-batched": lambda: ks.positions_of_blocks(bsel, bpos, 512, cfg),
        "positions_of_blocks-batched-head_major": lambda: ks.positions_of_blocks(
            bsel_hm, bpos, blens[bsid], cfg, head_major=True
        ),
        "Selector.rows": lambda: ks.Selector.sink_window(4, 60).rows(np.arange(100, 116)),
        "Selector.row": lambda: ks.Selector.random(64, 9).row(1000),
        "oracle_topk": lambda: ks.oracle_topk(att, np.repeat(pos, 4), 16),
        "attention_probabilities": lambda: ks.attention_probabilities(Q, K, pos),
        "dense_attention": lambda: ks.dense_attention(Q, K, V, pos),
        "sparse_attention": lambda: ks.sparse_attention(Q, K, V, pos, sel),
        "segment_coverage_rows": lambda: ks.segment_coverage_rows(cand, lens, 64),
        "attention_mass_recall_rows": lambda: ks.attention_mass_recall_rows(cand, att),
        "output_relative_error": lambda: ks.output_relative_error(V * 1.1, V),
        "output_relative_error_rows": lambda: ks.output_relative_error_rows(V * 1.1, V),
        "get/set_num_threads": lambda: ks.set_num_threads(ks.get_num_threads()),
        "indexer_topk": lambda: ks.indexer_topk(Q, Q[:, :, 0], k, pos * 8, 32, num_segments=8),
        "indexer_topk-fp8-raw": lambda: ks.indexer_topk(
            Q, Q[:, :, 0], k_fp8, pos * 8, 32, key_scale=k_scale, key_format="float8_e4m3fn"
        ),
        "indexer_topk_packed": lambda: ks.indexer_topk_packed(Q, Q[:, :, 0], k, [0, 256, 512], [0, 1, 0, 1], pos, 32),
        "indexer_topk_paged": lambda: ks.indexer_topk_paged(
            Q, Q[:, :, 0], pages, table, [300, 200], [0, 1, 0, 1], pos, 32, page_layout="fp8_scaled"
        ),
        # A report of wrong rows (every problem kind): dicts, lists, tuples.
        "check_topk": lambda: ks.check_topk(
            check_scores, check_rows, atol=1e-3, rtol=0.1, magnitudes=np.abs(check_scores)
        ),
        "check_topk-global-slots": lambda: ks.check_topk(check_scores, slot_rows, slots=slots),
        "GlobalSlots": lambda: sink.__setitem__(
            "slots",
            ks.GlobalSlots(
                slot_table, slot_req, 16, block_stride_rows=32, prefill_req_ids=slot_req - 2, workspace_starts=[0, 9]
            ),
        ),
        "block_scores": lambda: ks.block_scores(bq, k, bpos, cfg),
        "block_scores-magnitudes": lambda: ks.block_magnitudes(bq, k_bf16, bpos, cfg, key_format=k_bf16_fmt),
        "check_blocks": lambda: ks.check_blocks(
            blk_scores, blk_rows, blk_nb, cfg, atol=1e-3, rtol=0.1, magnitudes=np.abs(np.nan_to_num(blk_scores))
        ),
        "check_witnesses": lambda: ks.check_witnesses(learned, wit_after, lens, 16),
        # Refusals: errors with attributes, buffers borrowed and released.
        "refused-rows-mismatch": catch(
            lambda: ks.apply_topology_witnesses(learned, lens[:3], 32, 32, 32), ks.WitnessError
        ),
        "refused-readonly-buffer": catch(
            lambda: ks.scatter_topology_witnesses(np.frombuffer(learned.tobytes(), np.int32).reshape(16, 64), lens, 8),
            ks.WitnessError,
        ),
        "refused-aliased-out": catch(
            lambda: ks.apply_topology_witnesses(buf, lens, 32, 32, 32, out=buf), ks.WitnessError
        ),
        "refused-float-indices": catch(
            lambda: ks.topology_witness_indices(learned.astype(np.float32), lens, 64), TypeError
        ),
        "refused-int64-out-of-range": catch(
            lambda: ks.topology_witness_indices(learned.astype(np.int64) << 40, lens, 64), ks.WitnessError
        ),
        "refused-negative-count": catch(lambda: ks.random_null(5000, -1, 1), ks.WitnessError),
        "refused-huge-count": catch(lambda: ks.segment_of(2**70, 1, 1), ks.WitnessError),
        "refused-selection-shape": catch(lambda: ks.block_sparse_select(q, k, [1, 2], cfg), ks.SelectionError),
        "refused-paged-block-table": catch(
            lambda: ks.block_sparse_select_paged(
                bq, pages_bf16, bad_table, blens, bsid, bpos, cfg, key_format=pages_bf16_fmt, out=bsel_out
            ),
            ks.SelectionError,
        ),
        "refused-paged-out-aliases-table": catch(
            lambda: ks.block_sparse_select_paged(
                bq, bcache, wide_table, blens, bsid, bpos, cfg, out=wide_table.reshape(16, 2, 8)
            ),
            ks.SelectionError,
        ),
        "refused-attention-scale": catch(
            lambda: ks.dense_attention(Q, K, V, pos, scale=float("nan")), ks.SelectionError
        ),
        "refused-config": catch(lambda: ks.BlockSparseConfig(0), ks.SelectionError),
        "refused-check-rtol": catch(lambda: ks.check_topk(check_scores, check_rows, rtol=0.1), ks.SelectionError),
        "refused-check-layout": catch(
            lambda: ks.check_topk(check_scores, slot_rows, slots=ks.GlobalSlots(slot_table, slot_req[:3], 16)),
            ks.SelectionError,
        ),
        "refused-check-blocks-config": catch(
            lambda: ks.check_blocks(blk_scores, blk_rows[:, :4], blk_nb, cfg), ks.SelectionError
        ),
        "refused-check-witnesses": catch(
            lambda: ks.check_witnesses(learned, wit_after[:, :8], lens, 16), ks.WitnessError
        ),
        "refused-memory": catch(lambda: ks.Selector.dense().rows(np.full(4096, 2**31 - 2)), MemoryError),
    }
    return calls


CALLS = _calls()


_CHILD = os.environ.get("KVSELECT_MEMORY_CHILD") == "1"
child_only = pytest.mark.skipif(not _CHILD, reason="runs in the fresh child process")


@pytest.mark.skipif(_CHILD, reason="this is the child")
def test_the_soak_passes_in_a_fresh_interpreter():
    env = {**os.environ, "KVSELECT_MEMORY_CHILD": "1"}
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    # Every measurement ran (only this parent-side test is skipped there).
    summary = r.stdout.strip().splitlines()[-1]
    assert f"{len(CALLS) + 1} passed" in summary, summary


@pytest.fixture(scope="module", autouse=True)
def _single_thread():
    # Repeated small calls never reach the pool; keep its threads' stacks
    # out of the measurement anyway.
    ks.set_num_threads(1)
    yield
    ks.set_num_threads(0)


@child_only
@pytest.mark.parametrize("name", sorted(CALLS))
def test_repeated_calls_keep_rss_flat(name):
    f = CALLS[name]
    for _ in range(WARMUP):
        f()
    gc.collect()
    before = rss()
    for _ in range(N):
        f()
    gc.collect()
    grown = rss() - before
    assert grown < BOUND, f"{name}: RSS grew {grown / 2**20:.1f} MiB over {N} calls"


@child_only
def test_a_leak_would_be_caught():
    """The bound is tight enough: keeping one 1 KiB output per call trips it."""
    kept = []
    gc.collect()
    before = rss()
    for _ in range(N):
        kept.append(ks.locality_null(5000, 256))
    assert rss() - before > BOUND
