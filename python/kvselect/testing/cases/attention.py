"""Sparse attention / sparse MLA cases: the index rows that have broken the
kernels consuming a selection, each with its exact output.

Each generator returns a ``"sparse_attention"`` :class:`Case`: the kernel's
inputs (``q``, ``k``, ``v`` — None for MLA's latent —, ``indices`` and the
layout's arrays, with the ``conventions`` the rows are written for), the
exact output ``case.expected`` (float64 ``[n, H_q, d_v]``; the exact ``lse``
in the conventions' base and empty value is ``case.meta["lse"]``), and
``case.assert_rows(out)`` or ``case.assert_rows((out, lse))``, which runs
:func:`kvselect.testing.assert_sparse_attention` at the case's model
(``model=``, default ``"float32"``). ``case.meta["faults"]`` names the faults
of :data:`kvselect.checking.attention_causes.CAUSES` the case provokes.

Sources of the engine facts (docs/checking-sparse-attention.md cites each):

- vllm-project/vllm#49054: MiniMax-M3's split-K decode returns NaN for a
  row with no valid block (every split's lse is -inf); radixark/miles#2079:
  GLM-5 sparse-MLA kernels divide 0/0 on all-padding rows;
  NVIDIA/cudnn-frontend#676: NaN gradients on -1-padded and empty rows.
- vllm-project/vllm#48364: ``xpu_mla_sparse.py``'s NaN on a fully masked
  leading chunk (its running max now starts at -1e30); MiniMax-M3's prefill
  kernel: NaN when the first block it reads is entirely in the future, and
  a ``-1`` entry read as a page number (``block_table[b][-1]``).
- SGLang's DSA Triton sparse-MLA prefill (issue 40's measurement): on its
  ``union`` path a key weighed twice for one token because the neighbouring
  token's row repeated it.
- Every kernel measured counts a repeated index as often as it appears;
  kvselect's own ``sparse_attention`` counts it once.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import numpy as np

from kvselect.reference.sparse_attn import Conventions, conventions_of, sparse_attention_exact
from kvselect.testing.cases._case import Case


def _as(a: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "float32":
        return a.astype(np.float32)
    import ml_dtypes

    return a.astype(np.float32).astype(getattr(ml_dtypes, dtype))


def _case(
    id_: str,
    bug: str,
    inputs: Dict[str, Any],
    conv: Conventions,
    faults: Tuple[str, ...],
    model: str,
) -> Case:
    args = {k: v for k, v in inputs.items() if k not in ("q", "k", "v", "indices")}
    out, lse = sparse_attention_exact(
        inputs["q"], inputs["k"], inputs["v"], inputs["indices"], conventions=conv, **args
    )
    lo, hi = conv.empty_lse_range()
    empty = np.isneginf(lse)
    with np.errstate(invalid="ignore"):
        lse_b = lse / (np.log(2.0) if conv.lse_base == "2" else 1.0)
    lse_b[empty] = lo if lo == hi else (lo + hi) / 2
    if conv.lse_head_major:
        lse_b = lse_b.T
    return Case(
        id_,
        "sparse_attention",
        bug,
        {**inputs, "conventions": conv},
        out,
        {"model": model},
        meta={"faults": faults, "lse": lse_b, "empty_rows": int(empty.sum())},
    )


def _qkv(rng: np.random.Generator, n: int, H: int, Hkv: int, T: int, d: int, dv: int, dtype: str):
    q = _as(rng.standard_normal((n, H, d)), dtype)
    k = _as(rng.standard_normal((T, Hkv, d)), dtype)
    v = _as(rng.standard_normal((T, Hkv, dv)), dtype)
    return q, k, v


def empty_rows(seed: int = 0, *, causal: bool = False, model: str = "float32", dtype: str = "float32") -> Case:
    """Rows that count no key: all ``-1``, and (``causal``) every entry in the future.

    The bug: 0/0 or ``exp(-inf - -inf)`` on such a row: NaN where the
    conventions owe ``out = 0`` (vllm-project/vllm#49054, radixark/miles#2079,
    NVIDIA/cudnn-frontend#676).
    """
    rng = np.random.default_rng(seed)
    n, H, Hkv, T, W = 12, 4, 2, 37, 20
    q, k, v = _qkv(rng, n, H, Hkv, T, 16, 8, dtype)
    pos = rng.integers(0, T - 8, n)
    idx = rng.integers(0, T, (n, Hkv, W))
    idx[::3] = -1
    if causal:
        idx[1::3] = pos[1::3, None, None] + 1 + rng.integers(0, 6, (len(idx[1::3]), Hkv, W))
    conv = conventions_of(None, causal=causal)
    return _case(
        f"empty-rows{'-causal' if causal else ''}",
        "a row with no counted key: NaN where out = 0 is owed",
        {"q": q, "k": k, "v": v, "indices": idx, "query_pos": pos},
        conv,
        ("nan_empty_row",),
        model,
    )


def masked_first_chunk(seed: int = 0, *, causal: bool = False, model: str = "float32", dtype: str = "float32") -> Case:
    """Rows whose first 16, 32 or 64 slots are padding (or, ``causal``, in the future), valid entries after.

    The bug: a running max started at ``-inf`` stays ``-inf`` through the
    masked chunk and ``exp(-inf - -inf)`` poisons the row with NaN
    (vllm-project/vllm#48364; MiniMax-M3's prefill on a future first block).
    """
    rng = np.random.default_rng(seed)
    n, H, Hkv, T, W = 12, 2, 1, 200, 96
    q, k, v = _qkv(rng, n, H, Hkv, T, 16, 8, dtype)
    pos = rng.integers(100, T, n)
    idx = rng.integers(0, 100, (n, Hkv, W))
    lead = np.array([16, 32, 64])[np.arange(n) % 3]
    for i, m in enumerate(lead):
        idx[i, :, :m] = pos[i] + 1 + rng.integers(0, T - pos[i], m) if causal and pos[i] + 1 < T else -1
    conv = conventions_of(None, causal=causal)
    return _case(
        f"masked-first-chunk{'-causal' if causal else ''}",
        "the first chunk read is all masked: NaN from a -inf running max",
        {"q": q, "k": k, "v": v, "indices": idx, "query_pos": pos},
        conv,
        ("nan_masked_first_chunk",),
        model,
    )


def repeated_entries(
    seed: int = 0, *, duplicates: str = "each", model: str = "float32", dtype: str = "float32"
) -> Case:
    """Rows that repeat entries (some twice, some three times), under ``duplicates``.

    The bug: a repeat counted the other way: every engine measured counts it
    each time it appears; a set-valued kernel (kvselect's) once.
    """
    rng = np.random.default_rng(seed)
    n, H, Hkv, T, W = 16, 4, 2, 64, 24
    q, k, v = _qkv(rng, n, H, Hkv, T, 16, 8, dtype)
    idx = rng.permuted(np.tile(np.arange(T), (n, Hkv, 1)), axis=2)[:, :, :W]
    idx[:, :, W - 6 : W - 3] = idx[:, :, :3]
    idx[:, :, W - 3 :] = idx[:, :, :1]
    conv = conventions_of(None, duplicates=duplicates)
    return _case(
        f"repeated-entries-{duplicates}",
        "repeated entries: counted the other way",
        {"q": q, "k": k, "v": v, "indices": idx},
        conv,
        ("duplicates_other_way",),
        model,
    )


def neighbour_repeats(seed: int = 0, *, model: str = "float32", dtype: str = "float32") -> Case:
    """Adjacent rows sharing keys, where each row repeats a key its next row holds once.

    The bug: a kernel that reads a tile of queries' rows as one union counts
    a neighbour's entries (or its repeats) for this row (SGLang's DSA Triton
    sparse-MLA prefill, ``union`` path, issue 40).
    """
    rng = np.random.default_rng(seed)
    n, H, Hkv, T, W = 16, 2, 1, 80, 16
    q, k, v = _qkv(rng, n, H, Hkv, T, 16, 8, dtype)
    idx = np.full((n, Hkv, W), -1, dtype=np.int64)
    for i in range(n):
        own = rng.choice(T, W - 4, replace=False)
        idx[i, 0, : W - 4] = own
    for i in range(n - 1):
        shared = idx[i + 1, 0, 0]
        idx[i, 0, W - 4] = shared
        idx[i, 0, W - 3] = shared
    conv = conventions_of(None)
    return _case(
        "neighbour-repeats",
        "a neighbouring row's entries or repeats counted for this row",
        {"q": q, "k": k, "v": v, "indices": idx},
        conv,
        ("neighbour_entries",),
        model,
    )


def rising_scores(seed: int = 0, *, model: str = "float32", dtype: str = "float32") -> Case:
    """Rows whose scores rise slot by slot, so every chunk raises the running max.

    The bug: the accumulator (or the sum) not rescaled when the max grows:
    every earlier chunk is overweighted by ``exp(m_new - m_old)``.
    """
    rng = np.random.default_rng(seed)
    n, H, Hkv, T, W, d = 8, 2, 1, 128, 128, 16
    q = np.zeros((n, H, d))
    q[:, :, 0] = 1.0
    k = rng.standard_normal((T, Hkv, d)) * 0.1
    k[:, 0, 0] = np.linspace(-8.0, 8.0, T) * np.sqrt(d)
    v = rng.standard_normal((T, Hkv, 8))
    idx = np.tile(np.arange(W), (n, Hkv, 1))
    conv = conventions_of(None)
    return _case(
        "rising-scores",
        "the running max grows every chunk: a lost rescale overweights early chunks",
        {"q": _as(q, dtype), "k": _as(k, dtype), "v": _as(v, dtype), "indices": idx},
        conv,
        ("lost_rescale",),
        model,
    )


def causal_boundary(seed: int = 0, *, model: str = "float32", dtype: str = "float32") -> Case:
    """Causal rows holding ``query_pos`` and ``query_pos + 1`` (and ``- 1``) with large scores there.

    The bug: the causal bound off by one (``<`` for ``<=``, or the next key let in).
    """
    rng = np.random.default_rng(seed)
    n, H, Hkv, T, W, d = 10, 2, 1, 64, 12, 16
    q, k, v = _qkv(rng, n, H, Hkv, T, d, 8, dtype)
    pos = rng.integers(8, T - 2, n)
    idx = rng.integers(0, 8, (n, Hkv, W))
    idx[:, :, 0], idx[:, :, 1], idx[:, :, 2] = pos[:, None] - 1, pos[:, None], pos[:, None] + 1
    conv = conventions_of(None, causal=True)
    return _case(
        "causal-boundary",
        "entries at query_pos and query_pos + 1: an off-by-one causal bound",
        {"q": q, "k": k, "v": v, "indices": idx, "query_pos": pos},
        conv,
        ("causal_off_by_one",),
        model,
    )


def padding_reads(seed: int = 0, *, read: str = "row", model: str = "float32", dtype: str = "float32") -> Case:
    """``-1`` padding read under ``read``: trailing ``-1`` (``"row"``), live-looking
    entries past ``read_len`` (``"prefix"``), interior ``-1`` (``"last_valid"``);
    the first and last keys score high, so reading a ``-1`` as either shows.

    The bug: a padding slot read as a key (a clamped or wrapped ``-1``,
    radixark/miles#2079), or slots past the declared read length read.
    """
    rng = np.random.default_rng(seed)
    n, H, Hkv, T, W, d = 12, 2, 1, 50, 16, 16
    q, k, v = _qkv(rng, n, H, Hkv, T, d, 8, "float32")
    k[0] = k[-1] = q[0, 0] * 2.0
    idx = rng.integers(1, T - 1, (n, Hkv, W))
    args: Dict[str, Any] = {}
    if read == "row":
        idx[:, :, W // 2 :] = -1
    elif read == "prefix":
        args["read_len"] = rng.integers(2, W - 2, n)
    else:
        idx[:, :, 3:6] = -1
        idx[:, :, W - 4 :] = -1
    conv = conventions_of(None, read=read)
    faults: Tuple[str, ...] = ("padding_read",) if read != "prefix" else ("read_past_length",)
    return _case(
        f"padding-reads-{read}",
        "a padding slot (or a slot past the read length) read as a key",
        {"q": _as(q, dtype), "k": _as(k, dtype), "v": _as(v, dtype), "indices": idx, **args},
        conv,
        faults,
        model,
    )


def paged_blocks(seed: int = 0, *, model: str = "float32", dtype: str = "float32") -> Case:
    """MiniMax-M3's layout: 16-token blocks through a shuffled block table,
    head-major rows ``[H_kv, n, width]``, the first ``min(width, pos // 16 + 1)``
    read (``-1`` after), causal within the block, two sequences with partial last blocks.

    The bug: a ``-1`` entry read as a page number (``block_table[b][-1]``),
    a future block read first (NaN), the causal mask inside a block.
    """
    rng = np.random.default_rng(seed)
    bs, Hkv, H, d, W = 16, 2, 4, 16, 4
    lens = np.array([75, 53])
    pages = (lens + bs - 1) // bs
    n_pages = int(pages.sum()) + 3
    k = _as(rng.standard_normal((n_pages, bs, Hkv, d)), dtype)
    v = _as(rng.standard_normal((n_pages, bs, Hkv, 8)), dtype)
    perm = rng.permutation(n_pages)
    table = np.full((2, 6), -1, dtype=np.int64)
    table[0, : pages[0]] = perm[: pages[0]]
    table[1, : pages[1]] = perm[pages[0] : pages[0] + pages[1]]
    table[:, -1] = perm[-1]  # a page no sequence owns, where a -1 entry would read
    seq = np.repeat([0, 1], 8)
    pos = np.concatenate([rng.integers(0, lens[0], 8), rng.integers(0, lens[1], 8)])
    n = len(seq)
    q = _as(rng.standard_normal((n, H, d)), dtype)
    idx = np.full((n, Hkv, W), -1, dtype=np.int64)
    for i in range(n):
        seen = pos[i] // bs + 1
        for g in range(Hkv):
            short = int(i % 3 == 0 and seen > 1)  # the indexer wrote fewer than it may: a -1 inside the read prefix
            chosen = rng.permutation(seen)[: min(W, seen) - short]
            idx[i, g, : len(chosen)] = chosen
    conv = conventions_of("minimax_m3", block_size=bs)
    return _case(
        "paged-blocks",
        "block rows through a block table: a -1 read as block_table[b][-1]",
        {
            "q": q,
            "k": k,
            "v": v,
            "indices": idx.transpose(1, 0, 2).copy(),
            "query_pos": pos,
            "block_table": table,
            "seq_lens": lens,
            "seq_ids": seq,
        },
        conv,
        ("padding_read",),
        model,
    )


def packed_mla(seed: int = 0, *, model: str = "float32", dtype: str = "float32") -> Case:
    """MLA's shared latent (``v`` None, ``d_v`` of the ``d_qk``, the rope part the tail)
    over a packed batch of three sequences (``cu_seqlens``), positions within each.

    The bug: an index read in another sequence's keys, or the rope part read as values.
    """
    rng = np.random.default_rng(seed)
    cu = np.array([0, 40, 41, 97])
    d, dv, H, W = 24, 16, 4, 12
    k = _as(rng.standard_normal((int(cu[-1]), 1, d)), dtype)
    seq = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2])
    lens = np.diff(cu)[seq]
    idx = np.stack([rng.integers(-1, L, (1, W)) for L in lens])
    q = _as(rng.standard_normal((len(seq), H, d)), dtype)
    conv = conventions_of("flashmla_sparse_prefill")
    return _case(
        "packed-mla",
        "MLA over a packed batch: indices within each sequence, v the latent's head",
        {"q": q, "k": k, "v": None, "indices": idx, "d_v": dv, "cu_seqlens": cu, "seq_ids": seq},
        conv,
        ("padding_read",),
        model,
    )


def all_sparse_attention_cases(
    *, seed: int = 0, model: str = "float32", dtype: str = "float32"
) -> List[Tuple[str, Case]]:
    """Every sparse attention case, as ``(id, case)`` pairs.

    Parameters
    ----------
    seed : int, optional
        Every generator's seed (default 0).
    model : str, optional
        The arithmetic model the cases are checked at (default ``"float32"``).
    dtype : str, optional
        The inputs' dtype: ``"float32"`` (default) or ``"bfloat16"``.

    Returns
    -------
    list of (str, Case)
        ``(case.id, case)`` for each case.
    """
    kw: Dict[str, Any] = {"model": model, "dtype": dtype}
    made: List[Case] = [
        empty_rows(seed, **kw),
        empty_rows(seed, causal=True, **kw),
        masked_first_chunk(seed, **kw),
        masked_first_chunk(seed, causal=True, **kw),
        repeated_entries(seed, **kw),
        repeated_entries(seed, duplicates="once", **kw),
        neighbour_repeats(seed, **kw),
        rising_scores(seed, **kw),
        causal_boundary(seed, **kw),
        padding_reads(seed, **kw),
        padding_reads(seed, read="prefix", **kw),
        padding_reads(seed, read="last_valid", **kw),
        paged_blocks(seed, **kw),
        packed_mla(seed, **kw),
    ]
    return [(c.id, c) for c in made]
