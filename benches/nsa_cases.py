"""NSA's block selection against its floor (issue 45): the larger of the rule's FMA
count at the machine's FMA rate (``kvselect._core._fma_floor``, same thread count)
and one read of the keys (``np.copyto`` of them), target <= 1.5x.

The shape is the NSA paper's and fla's: 64 query heads over 4 KV heads (GQA 16,
fla's ``tests/ops/test_nsa.py`` ``HQ = 16 * H``), d = 128, fla's selection defaults
(blocks of 64, ``block_counts`` 16, block 0 and the query's last two forced):

- **decode**: the last 4 queries of a 131,072-token sequence (``nsa_select``,
  ``Tq < Tkv``: fla's ``Q_OFFSET``), float32 and bfloat16 keys, queries float32;
  and the paper's Eq. 9 window (``window="eq9"``, compressed keys of 32 tokens every
  16) over the float32 keys. Every call compresses the keys: one read of them;
- **decode, cached**: the same queries on the compressed keys an engine keeps
  (``nsa_select_compressed``, float32 and bfloat16 compressed keys, 4 MiB / 2 MiB): the
  floor is stage 1's FMAs, or one read of the compressed keys;
- **prefill**: 8,192 queries over their own 8,192 tokens (``Tq = Tkv``), float32
  and bfloat16 keys. The floor counts the keys (16 MiB float32) but not the
  queries (256 MiB): their ``np.copyto`` is printed beside it as a share of the floor.

The keys' read is ``np.copyto`` of their bytes into an existing buffer (bfloat16
through ``uint16`` views: NumPy copies ml_dtypes' bfloat16 through a slower loop).

The rule's FMAs, counted as the core does them (``src/nsa/api.rs`` ``run``,
``src/infllm/score.rs`` ``group_sums``): the compressed keys (each of the ``n_c``
keys' ``n_kv_heads * d`` elements sums ``kernel`` token rows, then one division),
and for every query at position ``p`` and each query head, stage 1 over the
``visible(p)`` compressed keys: the dot product (``d``), the project's ``exp`` (its
8 fused multiply-adds; its max, shift, rounding and scaling are not counted) and
``e / Z`` added to the group sum (1). Eq. 9 adds ``(bs / stride) * (kernel /
stride)`` group sums per block before the query's. The top-k's comparisons are
not counted. Every count leaves work out, so the floor is low: a ratio is an
upper bound on how far the core is from the machine.

One thread (``RAYON_NUM_THREADS=1`` and ``kvselect.set_num_threads(1)``, the floor
on the same thread), ``time.thread_time`` (CPU time of the calling thread: the
machine is shared), the cases interleaved, medians of the repetitions. Run:
``RAYON_NUM_THREADS=1 python benches/nsa_cases.py [reps] [--only decode|cached|prefill]``
(``--only`` runs one group: the decode from the keys, the cached decode, or the prefill;
each group's cases are interleaved with their own copies as before).
"""

from __future__ import annotations

import argparse

import ml_dtypes
import numpy as np
from timing import cpu_line, fma_rate, thread_medians

import kvselect as ks

#: The fused multiply-adds of the project's ``exp`` (``src/exp/avx2.rs``: two for
#: the reduction, five for the polynomial, one to finish).
EXP_FMAS = 8


def compressed_len(n: int, kernel: int, stride: int) -> int:
    """``Geometry::compressed_len``: keys of ``kernel`` tokens every ``stride``."""
    return 0 if n < kernel else (n - kernel) // stride + 1


def rule_fmas(n, n_q, hq, h, d, bs, kernel, stride, cached=False) -> int:
    """The rule's FMAs for the last ``n_q`` queries of ``n`` tokens (see the module
    docs): the compressed keys (none when ``cached``), then stage 1 (and Eq. 9's sums)
    per query."""
    means = 0 if cached else compressed_len(n, kernel, stride) * h * d * (kernel + 1)
    per_block = 0 if kernel == stride == bs else (bs // stride) * (kernel // stride)
    stage1 = 0
    for p in range(n - n_q, n):
        stage1 += compressed_len(p + 1, kernel, stride) * hq * (d + EXP_FMAS + 1)
        stage1 += (p // bs) * h * per_block
    return means + stage1


def report(label, t, fmas, rate, keys_copy, extra="") -> str:
    floor = max(fmas / rate, keys_copy)
    return (
        f"{label}: {t * 1e3:.2f} ms; FMAs {fmas / 1e6:.1f} M = {fmas / rate * 1e3:.2f} ms, "
        f"keys copy {keys_copy * 1e3:.2f} ms -> {t / floor:.2f}x the floor{extra}"
    )


def main(reps: int = 7, only: str | None = None) -> None:
    ks.set_num_threads(1)
    print(cpu_line())
    rate = fma_rate()  # FMAs per second on this one thread
    print(f"fma floor: {rate / 1e9:.1f} GFMA/s")
    rng = np.random.default_rng(0)
    hq, h, d, bs, counts = 64, 4, 128, 64, 16

    # Decode: the last few queries of a long sequence.
    n, n_q = 131072, 4
    k = rng.standard_normal((n, h, d), dtype=np.float32)
    kb = k.astype(ml_dtypes.bfloat16)
    q = rng.standard_normal((n_q, hq, d), dtype=np.float32)
    dst, dst_b = np.empty_like(k), np.empty_like(kb)
    ck = ks.nsa_compress_keys(k)
    ckb = ck.astype(ml_dtypes.bfloat16)
    cdst, cdst_b = np.empty_like(ck), np.empty_like(ckb)
    decode = {
        "f32": lambda: ks.nsa_select(q, k, counts),
        "bf16": lambda: ks.nsa_select(q, kb, counts),
        "eq9": lambda: ks.nsa_select(q, k, counts, window="eq9"),
        "copy": lambda: np.copyto(dst, k),
        "copy_b": lambda: np.copyto(dst_b.view(np.uint16), kb.view(np.uint16)),
    }
    cached = {
        "cached": lambda: ks.nsa_select_compressed(q, ck, n, counts),
        "cached_b": lambda: ks.nsa_select_compressed(q, ckb, n, counts),
        "ccopy": lambda: np.copyto(cdst, ck),
        "ccopy_b": lambda: np.copyto(cdst_b.view(np.uint16), ckb.view(np.uint16)),
    }
    cases = {**(decode if only in (None, "decode") else {}), **(cached if only in (None, "cached") else {})}
    t = thread_medians(cases, reps) if cases else {}
    shape = f"last {n_q} of {n} tokens, {hq}/{h} heads, d={d}, B={bs}, block_counts={counts}"
    if "f32" in t:
        fmas = rule_fmas(n, n_q, hq, h, d, bs, bs, bs)
        print(report(f"decode f32 keys, {shape}", t["f32"], fmas, rate, t["copy"]))
        print(report(f"decode bf16 keys, {shape}", t["bf16"], fmas, rate, t["copy_b"]))
        fmas9 = rule_fmas(n, n_q, hq, h, d, bs, 32, 16)
        print(report(f"decode f32 keys, eq9 (32/16), {shape}", t["eq9"], fmas9, rate, t["copy"]))
    if "cached" in t:
        fmas_c = rule_fmas(n, n_q, hq, h, d, bs, bs, bs, cached=True)
        print(report(f"decode cached f32 compressed keys, {shape}", t["cached"], fmas_c, rate, t["ccopy"]))
        print(report(f"decode cached bf16 compressed keys, {shape}", t["cached_b"], fmas_c, rate, t["ccopy_b"]))
    del k, kb, dst, dst_b

    if only not in (None, "prefill"):
        return
    # Prefill: every query of a sequence.
    n = n_q = 8192
    k = rng.standard_normal((n, h, d), dtype=np.float32)
    kb = k.astype(ml_dtypes.bfloat16)
    q = rng.standard_normal((n_q, hq, d), dtype=np.float32)
    dst, dst_b, dst_q = np.empty_like(k), np.empty_like(kb), np.empty_like(q)
    t = thread_medians(
        {
            "f32": lambda: ks.nsa_select(q, k, counts),
            "bf16": lambda: ks.nsa_select(q, kb, counts),
            "copy": lambda: np.copyto(dst, k),
            "copy_b": lambda: np.copyto(dst_b.view(np.uint16), kb.view(np.uint16)),
            "qcopy": lambda: np.copyto(dst_q, q),
        },
        reps,
    )
    shape = f"{n} queries over {n} tokens, {hq}/{h} heads, d={d}, B={bs}, block_counts={counts}"
    fmas = rule_fmas(n, n_q, hq, h, d, bs, bs, bs)
    for name, copy in (("f32", "copy"), ("bf16", "copy_b")):
        floor = max(fmas / rate, t[copy])
        extra = f" (queries copy {t['qcopy'] * 1e3:.2f} ms = {t['qcopy'] / floor:.2f}x the floor, not counted in it)"
        print(report(f"prefill {name} keys, {shape}", t[name], fmas, rate, t[copy], extra))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reps", nargs="?", type=int, default=7)
    parser.add_argument("--only", choices=("decode", "cached", "prefill"))
    args = parser.parse_args()
    main(args.reps, args.only)
