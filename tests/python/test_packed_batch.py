"""A packed batch (``cu_seqlens``, ``seq_ids``) is checked once in the core:
the indexer and block selection refuse each of its mistakes with the same
exception class, ``variant``, ``argument``, entry ``index`` and message."""

from __future__ import annotations

import numpy as np
import pytest

import kvselect as ks

N_KEYS, D = 10, 2


def _refusals(cu, seq_ids):
    """The refusal of ``indexer_topk_packed`` and of ``block_sparse_select_packed``
    for one packed batch over 10 keys, one query per ``seq_ids`` entry."""
    n = len(seq_ids)
    cu, seq_ids = np.asarray(cu, np.int64), np.asarray(seq_ids, np.int64)
    k = np.ones((N_KEYS, D), np.float32)
    pos = np.zeros(n, np.int64)
    with pytest.raises(ks.SelectionError) as indexer:
        ks.indexer_topk_packed(np.ones((n, 1, D), np.float32), np.ones((n, 1), np.float32), k, cu, seq_ids, pos, 2)
    config = ks.BlockSparseConfig(4, 2, 0, 0)
    with pytest.raises(ks.SelectionError) as blocks:
        ks.block_sparse_select_packed(np.ones((n, 1, D), np.float32), k, cu, seq_ids, pos, config)
    return indexer.value, blocks.value


@pytest.mark.parametrize(
    "cu, seq_ids, variant, argument, index, words",
    [
        ([], [0], "Invalid", "cu_seqlens", None, "cu_seqlens is empty"),
        ([1, 10], [0], "OutOfRange", "cu_seqlens", 0, "cu_seqlens[0] = 1, but the first sequence starts at 0"),
        ([0, 6, 4, 10], [0], "OutOfRange", "cu_seqlens", 2, "cu_seqlens[2] = 4 is out of range"),
        ([0, 12, 10], [0], "OutOfRange", "cu_seqlens", 1, "cu_seqlens[1] = 12 is out of range"),
        ([0, 4, 9], [0], "OutOfRange", "cu_seqlens", 2, "cu_seqlens ends at 9, but index_k has 10 keys"),
        ([0, 4, 10], [0, 2], "OutOfRange", "seq_ids", 1, "seq_ids[1] = 2 is out of range"),
    ],
    ids=["empty", "first-not-0", "decreasing", "past-the-keys", "short-of-the-keys", "seq-id-past"],
)
def test_the_indexer_and_block_selection_refuse_each_packed_mistake_alike(cu, seq_ids, variant, argument, index, words):
    indexer, blocks = _refusals(cu, seq_ids)
    for e in (indexer, blocks):
        assert type(e) is ks.SelectionError
        assert (e.variant, e.argument, getattr(e, "index", None)) == (variant, argument, index)
        assert words in str(e)
    assert str(indexer) == str(blocks)
