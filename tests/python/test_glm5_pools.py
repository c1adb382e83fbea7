"""GLM-5-Next's k-pool indexer is the compressed-key indexer with other
parameters: ``indexer_topk(..., compress_ratio=kpool)`` followed by
``expand_entries(..., tail=always_select_tail, width=index_topk + kpool - 1)``.

The one differential test ports, in plain NumPy, the selection rule of
transformers' GLM-5-Next indexer from its pooled keys on:
huggingface/transformers ``src/transformers/models/glm5_next/
modeling_glm5_next.py`` (commit 1f4d57a75d2ce3fee91b50b8fbf03b14b88165cf;
the indexer's forward, ``append_visible_tail`` and the pool grouping):

- scores ``ReLU(q . k * d**-0.5)`` weighted by ``weights * H**-0.5`` and
  summed over heads;
- a pool ``j`` (tokens ``[kpool j, kpool (j + 1))``, no padding so pools
  start at token 0) is a candidate only if complete and its last token is
  visible to the query; others are masked with ``finfo(float32).min``;
- ``select_k = min(index_topk // kpool, n_pools)`` pools by descending score
  (``torch.topk``; the data has distinct scores, so its tie order does not
  matter), invalid picks -> ``kpool`` times -1, each pick expanded to its
  tokens ascending;
- with ``index_kpool_always_select_tail``, the visible incomplete tail
  (``(p + 1) % kpool`` tokens from ``(p + 1) - (p + 1) % kpool``, in ``kpool -
  1`` columns) concatenated right after the expanded block; then -1 padding
  to ``index_topk`` (``+ kpool - 1`` with the tail) and the slice to it.

The pooling itself (the gated mean) is not ported: both sides take the
pooled keys as given. Data are small integers and ``d = 16``, ``H = 4`` so
that every score is exact in float32 on both sides.
"""

import numpy as np

import kvselect as ks


def glm5_next_topk(q, weights, pool_keys, q_positions, kv_len, kpool, index_topk, always_select_tail):
    """transformers' GLM-5-Next indexer selection from pooled keys, in NumPy."""
    n_q, n_heads, d = q.shape
    n_pools = pool_keys.shape[0]
    scores = np.maximum(np.einsum("shd,pd->shp", q, pool_keys) * d**-0.5, 0)
    index_scores = np.einsum("sh,shp->sp", weights * n_heads**-0.5, scores)
    pool_indices = np.arange(n_pools)[:, None] * kpool + np.arange(kpool)  # [P, kpool]
    pool_valid = (pool_indices < kv_len).all(-1)
    pool_end = np.clip(pool_indices[:, -1], 0, kv_len - 1)
    pool_visible = pool_end[None, :] <= q_positions[:, None]
    valid_candidates = pool_visible & pool_valid[None, :]
    index_scores = np.where(valid_candidates, index_scores, np.finfo(np.float32).min)
    select_k = min(index_topk // kpool, n_pools)
    selected = np.argsort(-index_scores, axis=-1, kind="stable")[:, :select_k]
    selected_valid = np.take_along_axis(valid_candidates, selected, -1)
    topk_indices = pool_indices[selected].reshape(n_q, select_k * kpool)
    topk_indices = np.where(np.repeat(selected_valid, kpool, axis=-1), topk_indices, -1)
    output_width = index_topk
    if always_select_tail:
        visible_count = q_positions + 1
        tail_count = visible_count % kpool
        tail_start = visible_count - tail_count
        offsets = np.arange(kpool - 1)
        tail = tail_start[:, None] + offsets
        tail = np.where(offsets[None, :] < tail_count[:, None], tail, -1)
        topk_indices = np.concatenate([topk_indices, tail], axis=-1)
        output_width += kpool - 1
    pad = output_width - topk_indices.shape[-1]
    topk_indices = np.pad(topk_indices, ((0, 0), (0, pad)), constant_values=-1)
    return topk_indices[:, :output_width].astype(np.int32)


def _distinct_case(r, kpool):
    """A case whose visible pool scores are distinct for every query."""
    n_heads, d = 4, 16
    kv_len = int(r.integers(1, 8 * kpool))
    n_pools = -(-kv_len // kpool)
    n_q = int(r.integers(1, 6))
    q_positions = np.sort(r.choice(kv_len, min(n_q, kv_len), replace=False))
    q_positions[0] = int(r.choice([q_positions[0], min(kpool - 1, kv_len - 1), min(kpool - 2, kv_len - 1)]))
    q_positions = np.unique(np.maximum(q_positions, 0))
    while True:
        pool_keys = r.integers(-2, 8, (n_pools, d)).astype(np.float32)
        q = r.integers(-2, 8, (len(q_positions), n_heads, d)).astype(np.float32)
        weights = r.integers(1, 9, (len(q_positions), n_heads)).astype(np.float32)
        scores = np.einsum("sh,shp->sp", weights, np.maximum(np.einsum("shd,pd->shp", q, pool_keys), 0))
        if all(len(set(s[: (p + 1) // kpool])) == (p + 1) // kpool for s, p in zip(scores, q_positions)):
            return q, weights, pool_keys, q_positions, kv_len


def test_glm5_next_pooled_rows_are_the_compressed_indexer_and_expand_entries():
    r = np.random.default_rng(5)
    n_heads, d = 4, 16
    tails = 0
    for case in range(300):
        kpool = int(r.choice([2, 3, 4, 16]))
        index_topk = kpool * int(r.integers(1, 6))
        always_select_tail = bool(case % 4)
        q, weights, pool_keys, q_positions, kv_len = _distinct_case(r, kpool)
        want = glm5_next_topk(q, weights, pool_keys, q_positions, kv_len, kpool, index_topk, always_select_tail)
        select_k = min(index_topk // kpool, pool_keys.shape[0])
        folded = weights * n_heads**-0.5 * d**-0.5  # ReLU(x s) = s ReLU(x), s > 0
        entries = ks.indexer_topk(q, folded, pool_keys, q_positions, select_k, compress_ratio=kpool)
        width = index_topk + (kpool - 1 if always_select_tail else 0)
        got = ks.expand_entries(entries, q_positions, kpool, tail=always_select_tail, width=width)
        np.testing.assert_array_equal(got, want, err_msg=f"case {case}")
        tails += int(always_select_tail and ((q_positions + 1) % kpool).any())
    assert tails > 100
