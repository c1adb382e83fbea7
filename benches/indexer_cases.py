"""The lightning indexer's side of ``benches/compare.py`` (``--only indexer``).

DeepSeek-V3.2's geometry: 64 index heads of dimension 128, top-k 2048. Every
case is timed in one run, repetitions interleaved, against:

- the machine's floor: ``kvselect._core._fma_floor``, a register-resident FMA
  loop on the same threads at the same SIMD level, timed beside the call;
- NumPy's bare product ``index_k @ index_q.T`` (no ReLU, no weights, no
  top-k) and the NumPy pipeline a user would write (product, ReLU in place,
  weights, causal mask, ``argpartition``, sort);
- torch's bare product and its pipeline (matmul, relu, weights, sum, causal
  mask, ``topk``) when torch is importable (never in CI: measure it in a
  benchmark venv).

Then: peak extra memory of a prefill, each pipeline in a fresh process;
bfloat16 and fp8 keys against float32; the fused witnesses' cost; decode and
prefill with fp8 × fp8 and bfloat16 × bfloat16 queries and keys (the AVX512-BF16
pair level's inputs) at this level and, where the CPU has the pair level, at the
other one in a child process; 1 vs 2 threads; cost against the context length.
"""

import os
import subprocess
import sys

import numpy as np
from timing import PAUSE_S, interleaved

import kvselect as ks
from kvselect import _core
from kvselect.workloads import quantize_fp8

H, D, TOPK = 64, 128, 2048
DECODE_T = 131_072
PREFILL_N, PREFILL_T = 128, 32_768


def seconds(cases: dict, reps: int, pause: float = 0.0) -> dict:
    """:func:`timing.interleaved`, in seconds."""
    return {name: ns / 1e9 for name, ns in interleaved(cases, reps, pause=pause).items()}


def make(n_q: int, t: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((t, D), dtype=np.float32)
    q = rng.standard_normal((n_q, H, D), dtype=np.float32)
    w = (rng.standard_normal((n_q, H)) / np.sqrt(H * D)).astype(np.float32)
    return q, w, k, np.arange(t - n_q, t)


def numpy_pipeline(q, w, k, pos, topk=TOPK):
    n_q, t = len(pos), len(k)
    s = q.reshape(n_q * H, D) @ k.T  # [n·H, T]
    np.maximum(s, 0, out=s)
    scores = np.matmul(w[:, None, :], s.reshape(n_q, H, t))[:, 0]  # [n, T]
    scores[np.arange(t)[None, :] > pos[:, None]] = -np.inf
    top = np.argpartition(-scores, topk - 1, axis=1)[:, :topk]
    order = np.argsort(-np.take_along_axis(scores, top, 1), axis=1, kind="stable")
    return np.take_along_axis(top, order, 1)


def torch_cases(q, w, k, pos, topk=TOPK) -> dict:
    try:
        import torch
    except ImportError:
        return {}
    torch.set_num_threads(ks.get_num_threads())
    tq, tw, tk = torch.from_numpy(q), torch.from_numpy(w), torch.from_numpy(k)
    n_q, t = len(pos), len(k)
    future = torch.arange(t)[None, :] > torch.from_numpy(pos)[:, None]

    def pipeline():
        s = torch.relu(tq.reshape(n_q * H, D) @ tk.T).view(n_q, H, t)
        s = (s * tw[:, :, None]).sum(1).masked_fill_(future, float("-inf"))
        return torch.topk(s, topk, dim=-1).indices

    return {
        "torch product": lambda: tk @ tq.reshape(n_q * H, D).T,
        "torch pipeline": pipeline,
    }


def floor_case(flops: float):
    """The FMA floor doing about ``flops``; returns (case, flops it does)."""
    per_iter = _core._fma_floor(1)[0]  # flops per step, every thread
    iters = max(1, int(flops / per_iter))
    return (lambda: _core._fma_floor(iters)), iters * per_iter


def pipelines(n_q: int, t: int, reps: int) -> dict:
    """One case against every other pipeline and the floor: seconds and
    GFLOP/s."""
    q, w, k, pos = make(n_q, t)
    flops = 2 * H * D * t * n_q
    floor, floor_flops = floor_case(flops)
    cases = {
        "ours": lambda: ks.indexer_topk(q, w, k, pos, TOPK),
        "floor": floor,
        "numpy product": lambda: k @ q.reshape(n_q * H, D).T,
        "numpy pipeline": lambda: numpy_pipeline(q, w, k, pos),
        **torch_cases(q, w, k, pos),
    }
    got = ks.indexer_topk(q, w, k, pos, TOPK)
    want = numpy_pipeline(q, w, k, pos)
    same = all(set(a) == set(b) for a, b in zip(got, want))
    sec = seconds(cases, reps, pause=PAUSE_S)  # BLAS products among the contenders
    return {
        "n_queries": n_q,
        "n_keys": t,
        "flops": flops,
        "floor_gflops": floor_flops / sec["floor"] / 1e9,
        "same_sets_as_numpy": same,
        "ms": {name: s * 1e3 for name, s in sec.items() if name != "floor"},
    }


_MEMORY_PROBE = r"""
import sys
sys.path.insert(0, sys.argv[2])
import numpy as np
import kvselect as ks
from indexer_cases import make, numpy_pipeline, torch_cases, PREFILL_N, PREFILL_T
q, w, k, pos = make(PREFILL_N, PREFILL_T)
who = sys.argv[1]
run = {
    "ours": lambda: ks.indexer_topk(q, w, k, pos, 2048),
    "numpy pipeline": lambda: numpy_pipeline(q, w, k, pos),
}.get(who) or torch_cases(q, w, k, pos)["torch pipeline"]
small = make(2, 4096)
ks.indexer_topk(*small, 64)  # load everything once
def rss_kib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4
base = rss_kib()
run()
with open("/proc/self/status") as f:
    peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
print(peak - base)
"""


def prefill_memory() -> dict:
    """Peak extra memory (MiB above the inputs) of one prefill call per
    pipeline, each in a fresh process so one's peak cannot hide another's."""
    who = ["ours", "numpy pipeline"]
    try:
        import torch  # noqa: F401

        who.append("torch pipeline")
    except ImportError:
        pass
    here = os.path.dirname(os.path.abspath(__file__))
    out = {}
    for name in who:
        r = subprocess.run(
            [sys.executable, "-c", _MEMORY_PROBE, name, here], capture_output=True, text=True, check=True
        )
        out[name] = int(r.stdout.strip()) / 1024
    return out


def fp8_pages(fp8, scale, bs: int, seed: int = 1):
    """fp8 keys and scales as vLLM's DSA index-K cache: pages of ``bs``
    tokens (the ``bs × d`` e4m3fn bytes, then ``bs`` float32 scales), viewed
    ``[num_blocks, bs, 1, d + 4]`` uint8, in a shuffled order, with the
    one-sequence block table that reads them back."""
    t, d = fp8.shape
    nb = t // bs
    perm = np.random.default_rng(seed).permutation(nb)
    pages = np.zeros((nb, bs * (d + 4)), np.uint8)
    pages[perm, : bs * d] = fp8.reshape(nb, bs * d)
    pages[perm, bs * d :] = scale.reshape(nb, bs).view(np.uint8)
    return pages.reshape(nb, bs, 1, d + 4), perm[None].astype(np.int32)


def formats_and_witnesses(reps: int) -> dict:
    """Decode with bfloat16 and fp8-with-scales keys (raw bits, read in
    place), fp8 in vLLM's paged layout, over the same keys as compressed
    entries, and with the fused witnesses (S = 16, 64), against float32."""
    q, w, k, pos = make(1, DECODE_T)
    bf16 = (k.view(np.uint32) >> 16).astype(np.uint16)
    fp8, scale = quantize_fp8(k)
    cache, table = fp8_pages(fp8, scale, 64)
    cases = {
        "float32": lambda: ks.indexer_topk(q, w, k, pos, TOPK),
        "bfloat16": lambda: ks.indexer_topk(q, w, bf16, pos, TOPK, key_format="bfloat16"),
        "fp8 + scales": lambda: ks.indexer_topk(q, w, fp8, pos, TOPK, key_scale=scale, key_format="float8_e4m3fn"),
        "paged fp8 (vLLM pages, shuffled)": lambda: ks.indexer_topk_paged(
            q, w, cache, table, [DECODE_T], [0], pos, TOPK, page_layout="fp8_scaled"
        ),
        # The same T keys as DeepSeek-V4 CSA entries, seen from token 4T - 1:
        # the cost per key must be the token-level one (issue 25: <= 1.1x).
        "compressed entries (m=4)": lambda: ks.indexer_topk(q, w, k, 4 * pos + 3, TOPK, compress_ratio=4),
        "witnesses S=16": lambda: ks.indexer_topk(q, w, k, pos, TOPK, num_segments=16),
        "witnesses S=64": lambda: ks.indexer_topk(q, w, k, pos, TOPK, num_segments=64),
    }
    return {name: s * 1e3 for name, s in seconds(cases, reps).items()}


def _query_format_cases(n_q: int, t: int) -> dict:
    """The same decode or prefill with float32, fp8 (queries and keys, the
    keys with scales: DeepSeek's own indexer) and bfloat16 queries and keys:
    the pair level's inputs (AVX512-BF16, issue 46), beside float32."""
    import ml_dtypes

    q, w, k, pos = make(n_q, t)
    fp8, scale = quantize_fp8(k)
    q8 = q.astype(ml_dtypes.float8_e4m3fn)
    qb, kb = q.astype(ml_dtypes.bfloat16), k.astype(ml_dtypes.bfloat16)
    return {
        "float32 × float32": lambda: ks.indexer_topk(q, w, k, pos, TOPK),
        "fp8 × fp8 + scales": lambda: ks.indexer_topk(
            q8, w, fp8, pos, TOPK, key_scale=scale, key_format="float8_e4m3fn"
        ),
        "bfloat16 × bfloat16": lambda: ks.indexer_topk(qb, w, kb, pos, TOPK),
    }


def query_formats(reps: int) -> dict:
    """Decode (1 × 131,072 keys) and prefill (128 × 32,768) by query × key
    format, ms, at this process's level (with the AMX screen where it runs);
    and the same in a child process at each level this process did not run
    (``KVSELECT_SIMD=avx512`` where the screen ran here; the pair level, or
    the AVX-512 one below it, where the CPU has it), so all are in one run.
    Targets (issue 46): fp8 × fp8 and bf16 × bf16 ≤ 0.6× the float32 decode
    and prefill."""
    out = {
        "level": ks.simd_level() + (" + AMX screen" if _core._amx_screen() else ""),
        "pair_speedup": _core._pair_speedup(),
        "decode": {n: s * 1e3 for n, s in seconds(_query_format_cases(1, DECODE_T), reps).items()},
        "prefill": {
            n: s * 1e3 for n, s in seconds(_query_format_cases(PREFILL_N, PREFILL_T), max(3, reps // 3)).items()
        },
    }
    if os.environ.get("KVSELECT_QUERY_FORMATS_CHILD") is None:
        # The levels this process did not run: the plain AVX-512 one where
        # the AMX screen ran here, the pair level (or the AVX-512 one below
        # it) where the CPU has it.
        others = ["avx512"] if _core._amx_screen() else []
        if out["pair_speedup"] is not None:
            others.append("avx512" if ks.simd_level() == "avx512bf16" else "avx512bf16")
        here = os.path.dirname(os.path.abspath(__file__))
        code = (
            f"import sys, json; sys.path.insert(0, {here!r}); import indexer_cases as c; "
            f"print(json.dumps(c.query_formats({reps})))"
        )
        import json

        out["other_levels"] = []
        for other in dict.fromkeys(others):
            env = dict(os.environ, KVSELECT_SIMD=other, KVSELECT_QUERY_FORMATS_CHILD="1")
            r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
            out["other_levels"].append(json.loads(r.stdout.strip().splitlines()[-1]))
    return out


def threads(reps: int) -> dict:
    """Decode and the floor on 1 and on 2 threads."""
    q, w, k, pos = make(1, DECODE_T)
    flops = 2 * H * D * DECODE_T
    before = ks.get_num_threads()
    out = {}
    try:
        for n in (1, 2):
            ks.set_num_threads(n)
            floor, floor_flops = floor_case(flops)
            sec = seconds({"ours": lambda: ks.indexer_topk(q, w, k, pos, TOPK), "floor": floor}, reps)
            out[n] = {
                "ms": sec["ours"] * 1e3,
                "gflops": flops / sec["ours"] / 1e9,
                "floor_gflops": floor_flops / sec["floor"] / 1e9,
            }
    finally:
        ks.set_num_threads(before)
    return out


def scaling(reps: int) -> dict:
    """Decode cost against the context length: ns per key should be flat."""
    out = {}
    for t in (16_384, 32_768, 65_536, 131_072, 262_144):
        q, w, k, pos = make(1, t)
        sec = seconds({"ours": lambda: ks.indexer_topk(q, w, k, pos, TOPK)}, reps)["ours"]
        out[t] = {"ms": sec * 1e3, "ns_per_key": sec / t * 1e9}
    return out


def bench_indexer(quick: bool) -> dict:
    reps = 3 if quick else 15
    return {
        "decode": pipelines(1, DECODE_T, reps),
        "prefill": pipelines(PREFILL_N, PREFILL_T, max(3, reps // 3)),
        "prefill_memory_mib": prefill_memory(),
        "formats_ms": formats_and_witnesses(reps),
        "query_formats": query_formats(reps),
        "threads": threads(reps),
        "scaling": scaling(reps),
    }


def print_indexer_table(r: dict) -> None:
    print(
        f"\nLightning indexer, {H} heads, d {D}, top-k {TOPK}, float32 keys, "
        f"{ks.get_num_threads()} threads, SIMD {ks.simd_level()}"
    )
    print("(ratios are time against ours; the floor is the FMA loop timed in the same run)\n")
    names = ["numpy product", "numpy pipeline", "torch product", "torch pipeline"]
    print("| case | ours ms | GFLOP/s | of the FMA floor | " + " | ".join(names) + " |")
    print("|---|---:|---:|---:|" + "---:|" * len(names))
    for case in ("decode", "prefill"):
        c = r[case]
        ours = c["ms"]["ours"]
        gflops = c["flops"] / ours / 1e6
        cells = [f"{c['ms'][n]:.1f} ({c['ms'][n] / ours:.2f}×)" if n in c["ms"] else "not installed" for n in names]
        label = f"{case}: {c['n_queries']} × {c['n_keys']:,} keys"
        print(
            f"| {label} | {ours:.1f} | {gflops:.0f} | {gflops / c['floor_gflops']:.0%} "
            f"of {c['floor_gflops']:.0f} | " + " | ".join(cells) + " |"
        )
    mem = r["prefill_memory_mib"]
    print(
        "\nPrefill peak extra memory (fresh process each): "
        + ", ".join(f"{n} {m:.1f} MiB" for n, m in mem.items())
        + f" — ours is {mem['ours'] / mem['numpy pipeline']:.2%} of NumPy's"
    )
    f = r["formats_ms"]
    base = f["float32"]
    print(
        "\nDecode by key format and with the fused witnesses (ms, ratio to float32): "
        + ", ".join(f"{n} {ms:.2f} ({ms / base:.3f}×)" for n, ms in f.items())
    )
    _print_query_formats(r["query_formats"])
    t = r["threads"]
    print(
        "\nThreads (decode): "
        + "; ".join(
            f"{n}: {v['ms']:.1f} ms, {v['gflops']:.0f} GFLOP/s = {v['gflops'] / v['floor_gflops']:.0%} "
            f"of the {v['floor_gflops']:.0f} GFLOP/s floor"
            for n, v in t.items()
        )
        + f"; speed-up {t[1]['ms'] / t[2]['ms']:.2f}×"
    )
    s = r["scaling"]
    print(
        "\nDecode cost against T: "
        + ", ".join(f"{n:,}: {v['ms']:.2f} ms ({v['ns_per_key']:.0f} ns/key)" for n, v in s.items())
    )
    for case in ("decode", "prefill"):
        if not r[case]["same_sets_as_numpy"]:
            print(f"\nWARNING: {case}: the rows' sets differ from NumPy's pipeline")


def _print_query_formats(qf: dict) -> None:
    """The query × key format rows: each level's times, ratios to its own
    float32 × float32 (the pair level's targets: ≤ 0.6×)."""
    sp = qf["pair_speedup"]
    race = "no AVX512-BF16" if sp is None else f"VDPBF16PS does {sp:.2f}× FMA's products per second"
    print(f"\nQuery × key formats (ms, ratio to float32 × float32 at the same level; {race}):")
    runs = [qf] + qf.get("other_levels", [])
    for run in runs:
        note = "" if run is qf else " (child process, KVSELECT_SIMD)"
        for case in ("decode", "prefill"):
            base = run[case]["float32 × float32"]
            cells = ", ".join(f"{n} {ms:.2f} ({ms / base:.3f}×)" for n, ms in run[case].items())
            print(f"  {run['level']}{note}, {case}: {cells}")
