"""Engine caches built in the tests: vLLM's DSA index-K pages (V3.2's, and
DeepSeek-V4's indexer cache, which keeps the same layout over compressed
entries)."""

import numpy as np
import pytest

ml_dtypes = pytest.importorskip("ml_dtypes")


def vllm_fp8_pages(keys_per_seq, scales_per_seq, bs, rng, interleave=2):
    """vLLM's DSA index-K cache for the given sequences: pages of ``bs`` tokens,
    each the ``bs × d`` e4m3fn bytes then ``bs`` float32 scales, viewed
    ``[num_blocks, bs, 1, d + 4]`` uint8; pages handed out in a random order and
    the block axis interleaved with another layer's pages (a strided view)."""
    d = keys_per_seq[0].shape[1]
    need = [-(-len(k) // bs) for k in keys_per_seq]
    n_blocks = sum(need) + 2
    order = rng.permutation(n_blocks)
    big = np.full((n_blocks, interleave, bs * (d + 4)), 0xAB, np.uint8)  # other layers' bytes
    page_of = big[:, interleave - 1]
    max_blocks = max(need) + 1
    table = np.zeros((len(keys_per_seq), max_blocks), np.int32)  # vLLM pads with 0
    nxt = 0
    for s, (k, c) in enumerate(zip(keys_per_seq, scales_per_seq)):
        for b in range(need[s]):
            p = order[nxt]
            nxt += 1
            table[s, b] = p
            rows = k[b * bs : (b + 1) * bs]
            fp8 = np.zeros((bs, d), np.uint8)
            fp8[: len(rows)] = rows.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
            sc = np.zeros(bs, np.float32)
            sc[: len(rows)] = c[b * bs : (b + 1) * bs]
            page_of[p] = np.concatenate([fp8.reshape(-1), sc.view(np.uint8)])
    cache = page_of.reshape(n_blocks, bs, 1, d + 4)
    assert not cache.flags.c_contiguous and np.shares_memory(cache, big)  # strided, in place
    return cache, table
