"""The example dump shipped with the package (``data/check-example.npz``)."""

from __future__ import annotations

import os

import numpy as np

import kvselect as ks
from kvselect.checking.dumps import save_dump


def make_example(path: str, *, seed: int = 0) -> None:
    """Write the example dump shipped with the package.

    A lightning-indexer top-k of 48 decode queries over 1,024 fp8 keys with
    per-key scales (64 heads of dim 32), scored by an emulated engine in
    bfloat16 and returned as vLLM does — rows unordered, ties by arrival
    order, int64 global slot ids through a shuffled block table of 64-token
    pages — with one row broken the way vllm-project/vllm#51782 broke rows:
    a winner dropped for the best loser. Written with :func:`save_dump`
    (kind ``"topk"``, ``precision = "bfloat16"``, with ``engine_scores``).

    Parameters
    ----------
    path : str
        The ``.npz`` file to write (replaced if it exists).
    seed : int, optional
        The NumPy Generator's seed (default 0, the shipped file's).

    Returns
    -------
    None

    Raises
    ------
    ImportError
        When ``ml_dtypes`` (the ``formats`` extra) is not installed.
    OSError
        When the file cannot be written (from :func:`save_dump`).
    """
    import ml_dtypes

    rng = np.random.default_rng(seed)
    n_q, h, d, n_k, topk, bs = 48, 64, 32, 1024, 64, 64
    k = rng.standard_normal((n_k, d)).astype(np.float32)
    scale = (np.abs(k).max(axis=1) / 448).astype(np.float32)
    k8 = (k / scale[:, None]).astype(ml_dtypes.float8_e4m3fn)
    # Every cast to a low-precision dtype starts from float32: ml_dtypes
    # versions disagree on float64 -> bfloat16 (0.5 rounds through float32,
    # 0.7 rounds once), never on float32 -> bfloat16.
    q = rng.standard_normal((n_q, h, d)).astype(np.float32).astype(ml_dtypes.bfloat16)
    w = (rng.standard_normal((n_q, h)) / np.sqrt(h * d)).astype(np.float32)
    pos = np.sort(rng.integers(topk // 2, n_k, n_q))
    exact = ks.indexer_scores(q, w, k8, pos, key_scale=scale)
    # The engine: scores rounded to bfloat16, top-k by arrival order.
    engine = exact.astype(ml_dtypes.bfloat16).astype(np.float32)
    rows = np.full((n_q, topk), -1, dtype=np.int64)
    for i in range(n_q):
        L = int(pos[i]) + 1
        arrival = rng.permutation(L)
        s = engine[i, :L][arrival]
        best = arrival[np.argsort(-s, kind="stable")[: min(topk, L)]]
        rows[i, : len(best)] = rng.permutation(best)
    broken = n_q // 2
    L = int(pos[broken]) + 1
    order = np.argsort(-engine[broken, :L], kind="stable")
    slot = int(np.flatnonzero(rows[broken] == order[0])[0])
    rows[broken, slot] = order[topk]  # the best position dropped for the best loser
    pages = rng.permutation(4 * (n_k // bs))[: n_k // bs].astype(np.int32)
    table = pages[None, :]
    glob = np.where(rows < 0, -1, table[0][np.maximum(rows, 0) // bs].astype(np.int64) * bs + rows % bs)
    save_dump(
        path,
        "topk",
        rows=glob,
        index_q=q,
        weights=w,
        index_k=k8,
        key_scale=scale,
        query_pos=pos,
        topk=topk,
        engine_scores=engine,
        precision="bfloat16",
        block_table=table,
        req_ids=np.zeros(n_q, dtype=np.int64),
        block_size=bs,
    )


def example_path() -> str:
    """The path of the example dump shipped with the package.

    The file is ``kvselect/data/check-example.npz`` (:func:`make_example`
    wrote it); this does not check that it exists.

    Returns
    -------
    str
        The absolute path inside the installed package.
    """
    return os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "check-example.npz")
