"""The lightning indexer's AMX screen (Intel AMX-BF16 tile products as a
screen, every survivor re-scored by the float32 kernels): it changes no row
and no score bit. Each call runs in this process (with the screen where
``_core._amx_screen()``) and in a child at ``KVSELECT_SIMD=avx512``, which
never runs it."""

import os
import platform
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from levels import assert_child_equals
from pages import vllm_fp8_pages

import kvselect as ks
from kvselect import _core

SEED = 20261206

# The calls, run alike by this process and by the child: `run(data)` gives
# every call's rows and scores from the arrays `data` holds.
_CALLS = """
import numpy as np
import kvselect as ks


def run(data):
    out = {}
    for i in range(int(data["n"])):
        kind, fmt = str(data[f"kind_{i}"]), str(data[f"fmt_{i}"])
        q, w, pos, topk = data[f"q_{i}"], data[f"w_{i}"], data[f"pos_{i}"], int(data[f"topk_{i}"])
        s = np.zeros((len(pos), topk), np.float32)
        if kind == "dense":
            scale = data[f"c_{i}"] if fmt == "float8_e4m3fn" else None
            rows = ks.indexer_topk(q, w, data[f"k_{i}"], pos, topk, key_scale=scale, key_format=fmt,
                                   query_format=fmt, scores_out=s)
        else:
            rows = ks.indexer_topk_paged(q, w, data[f"k_{i}"], data[f"table_{i}"], data[f"lens_{i}"],
                                         data[f"seq_{i}"], pos, topk, page_layout="fp8_scaled",
                                         query_format=fmt, scores_out=s)
        out[f"rows_{i}"], out[f"scores_{i}"] = rows, s
    return out
"""

_CHILD = (
    _CALLS
    + """
import sys
from kvselect import _core
assert not _core._amx_screen()
np.savez(sys.argv[2], **run(np.load(sys.argv[1])))
"""
)


def _inputs(rng) -> dict:
    """Decode and prefill shapes of DeepSeek's indexer (64 heads × 128, topk
    2048 over 20,000 and 40,000 keys; groups of queries), fp8 keys with vLLM's scales and
    bfloat16 keys, near ties (keys alike but for one element every query
    scales by 2⁻¹⁸: real scores closer than the roundings), low contrast (three
    distinct key rows), heads not a multiple of 16 and `d` not of 32 (the
    screen off), rows shorter than topk, and vLLM's paged fp8 cache."""
    arrays: dict = {}
    cases = [
        # (kind, fmt, n, h, d, t, topk, variant)
        ("dense", "float8_e4m3fn", 1, 64, 128, 40000, 2048, "random"),
        ("dense", "bfloat16", 1, 64, 128, 20000, 2048, "random"),
        ("dense", "float8_e4m3fn", 40, 16, 64, 3000, 256, "causal"),
        ("dense", "bfloat16", 40, 20, 64, 3000, 256, "causal"),
        ("dense", "float8_e4m3fn", 3, 64, 128, 6000, 300, "near"),
        ("dense", "bfloat16", 3, 16, 32, 6000, 300, "near"),
        ("dense", "float8_e4m3fn", 2, 8, 128, 5000, 100, "low"),
        ("dense", "bfloat16", 2, 1, 96, 4000, 50, "random"),
        ("dense", "float8_e4m3fn", 2, 64, 128, 500, 2048, "random"),
        ("paged", "float8_e4m3fn", 4, 64, 128, 9000, 1024, "random"),
    ]
    for i, (kind, fmt, n, h, d, t, topk, variant) in enumerate(cases):
        q = rng.standard_normal((n, h, d)).astype(np.float32)
        k = rng.standard_normal((t, d)).astype(np.float32)
        if variant == "near":
            q[:, :, 5] *= np.float32(2.0**-18)
            k[:] = k[0]
            k[:, 5] = rng.standard_normal(t)
        if variant == "low":
            k = k[rng.integers(0, 3, t)]
        w = rng.standard_normal((n, h)).astype(np.float32)
        pos = rng.integers(t - 50, t + 5, n) if variant != "causal" else np.sort(rng.integers(0, t, n))
        dtype, raw = (ml_dtypes.bfloat16, np.uint16) if fmt == "bfloat16" else (ml_dtypes.float8_e4m3fn, np.uint8)
        qq = q.astype(dtype).view(raw)
        arrays |= {f"kind_{i}": np.array(kind), f"fmt_{i}": np.array(fmt), f"q_{i}": qq, f"w_{i}": w}
        arrays |= {f"pos_{i}": pos, f"topk_{i}": np.array(topk)}
        c = (np.maximum(np.abs(k).max(axis=1), 1e-4) / 448).astype(np.float32)
        if kind == "dense":
            kk = (k / c[:, None]).astype(dtype).view(raw) if fmt == "float8_e4m3fn" else k.astype(dtype).view(raw)
            arrays |= {f"k_{i}": kk, f"c_{i}": c}
        else:
            half = t // 2
            keys = [(k[:half] / c[:half, None]), (k[half:] / c[half:, None])]
            cache, table = vllm_fp8_pages(keys, [c[:half], c[half:]], 64, rng)
            seq = np.arange(n) % 2
            lens = np.array([half, t - half])
            arrays |= {f"k_{i}": np.ascontiguousarray(cache), f"table_{i}": table}
            arrays |= {f"lens_{i}": lens, f"seq_{i}": seq, f"pos_{i}": lens[seq] - 1 - np.arange(n) // 2}
    arrays["n"] = np.array(len(cases))
    return arrays


def test_the_amx_screen_changes_no_row_and_no_score(tmp_path):
    if not _core._amx_screen():
        pytest.skip("this process runs no AMX screen (no AMX-BF16, KVSELECT_SIMD set, or KVSELECT_AMX=0)")
    arrays = _inputs(np.random.default_rng(SEED))
    np.savez(tmp_path / "in.npz", **arrays)
    scope: dict = {}
    exec(_CALLS, scope)
    expected = scope["run"](np.load(tmp_path / "in.npz"))
    assert_child_equals(_CHILD, tmp_path, "avx512", expected)


def test_the_amx_screen_runs_exactly_where_the_cpu_and_the_environment_allow():
    """With no ``KVSELECT_SIMD`` and no ``KVSELECT_AMX=0``, the screen runs
    exactly where ``/proc/cpuinfo`` lists AMX-BF16 and AMX-TILE on Linux 5.16
    or later (which grants the tiles); any ``KVSELECT_SIMD`` level, or
    ``KVSELECT_AMX=0``, turns it off."""
    bare = {k: v for k, v in os.environ.items() if k not in ("KVSELECT_SIMD", "KVSELECT_AMX")}

    def screen(env: dict) -> bool:
        code = "from kvselect import _core; print(_core._amx_screen())"
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        return out.stdout.strip() == "True"

    flags: set = set()
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            flags = {w for line in f if line.startswith("flags") for w in line.split()}
    release = tuple(int(x) for x in platform.release().split("-")[0].split(".")[:2])
    has = {"amx_bf16", "amx_tile", "avx512f"} <= flags and platform.system() == "Linux" and release >= (5, 16)
    assert screen(bare) == has
    assert not screen(dict(bare, KVSELECT_SIMD="avx512"))
    assert not screen(dict(bare, KVSELECT_SIMD="avx512bf16"))
    assert not screen(dict(bare, KVSELECT_AMX="0"))
    assert ks.simd_level() in ("scalar", "avx2", "avx512", "avx512bf16")
