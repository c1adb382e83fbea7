"""Regenerate tests/data/minilm_qkv.bin from the MiniLM Q/K/V archive.

    python3 tests/data/make_minilm_fixture.py PATH/TO/minilm-qkv.npz

The archive (`minilm-qkv.npz`, made by `extract_minilm_qkv.py`) holds float16
arrays `[layers=6, heads=12, tokens=512, head_dim=32]` of all-MiniLM-L6-v2 run
on the GPL-2 licence text. This script keeps a small slice of it -- the layers,
heads and tokens below -- as one raw float32 little-endian file, so the Rust
tests never read anything outside the repository. float16 -> float32 is exact.

Layout of the output (C order): [3 (q, k, v), 2 layers, 2 heads, 128 tokens, 32 dims].
"""

import sys
from pathlib import Path

import numpy as np

TEXT = "GPL_2"
LAYERS = [0, 5]  # first and last layer
HEADS = [0, 7]
TOKENS = 128


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    archive = np.load(sys.argv[1])
    parts = []
    for name in ("q", "k", "v"):
        x = archive[f"{TEXT}_{name}"]  # [6, 12, 512, 32] float16
        x = x[LAYERS][:, HEADS][:, :, :TOKENS, :]
        parts.append(x.astype("<f4"))
    out = np.ascontiguousarray(np.stack(parts))
    assert out.shape == (3, len(LAYERS), len(HEADS), TOKENS, 32), out.shape
    path = Path(__file__).resolve().parent / "minilm_qkv.bin"
    out.tofile(path)
    print("wrote", path, out.shape, out.dtype)


if __name__ == "__main__":
    main()
