"""The torch pipelines a user would write instead of kvselect, for
``benches/compare.py``'s witness, block-sparse and attention sections (the
indexer's are in ``indexer_cases.py``).

torch is never a dependency of the package or of CI: it is imported lazily,
and every ``*_cases`` function returns ``{}`` when it is not importable, so
the tables then say "not installed". Each pipeline is written the way a
competent torch user would on CPU: float32 / integer tensors shared with the
benchmark's NumPy inputs through ``torch.from_numpy`` (no copy), whole-array
tensor ops, no Python loop over rows. torch runs on as many threads as
kvselect (``torch.set_num_threads(ks.get_num_threads())``).

Each ``*_cases`` function returns named zero-argument callables over tensors
built once, outside the timed region, for :func:`timing.interleaved`; the
benchmark calls the same callables once more, untimed, to check the result
against kvselect's on the same inputs.

Every callable has been called :data:`WARM_CALLS` times, untimed, before it
is returned: torch on CPU allocates its intermediates with glibc's malloc,
which for the first calls maps them fresh from the OS and unmaps them on
free, until its dynamic mmap threshold has grown past them (measured on the
sparse attention case at k = 512 in a fresh process: about 8,500 page faults
and +10 ms per call for the first six calls, none after). A serving loop
sees the steady state, and a median over the few repetitions of ``--quick``
would otherwise be all warm-up. Inside the benchmark, after other cases'
large arrays, that case did not always settle (2,000 faults on every call at
k = 128), so its pipeline gathers into buffers allocated once, as a serving
loop with fixed shapes would. Intermediates past glibc's 32 MiB ceiling
(the block prefill's score matrix, the 4,096-row witness merge's int64
temporaries) are mapped fresh on every call: that cost is torch's and stays
in, as it does for NumPy's pipelines.
"""

import kvselect as ks

#: Untimed calls of every torch case before it is timed (see above).
WARM_CALLS = 8


def _warmed(cases: dict) -> dict:
    """``cases``, each called :data:`WARM_CALLS` times."""
    for fn in cases.values():
        for _ in range(WARM_CALLS):
            fn()
    return cases


def _torch():
    """torch, on kvselect's thread count, or None when it is not installed."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(ks.get_num_threads())
    return torch


def version() -> str:
    """torch's version and thread count, or "not installed"."""
    torch = _torch()
    return "not installed" if torch is None else f"{torch.__version__} x{torch.get_num_threads()}"


# --------------------------------------------------------------------------
# Segment witnesses
# --------------------------------------------------------------------------


def scatter_witnesses(torch, buf, lens, num_segments: int) -> None:
    """``ks.scatter_topology_witnesses`` in torch integer ops, in place on
    the int32 tensor ``buf [rows, topk]`` (``lens`` int32 ``[rows]``).

    The rule of ``kvselect.reference``: ``keep = max(topk - S, 0)``,
    ``B = min(S, topk - keep)``; per row ``L' = max(L, 1)``,
    ``S_eff = min(S, L')``. Every non-negative entry ``x`` of the whole row
    (tail included, ``x >= L`` too) occupies segment
    ``min(x * S_eff // L', S - 1)`` (one ``scatter_`` into a boolean
    ``[rows, S + 1]`` table whose last column swallows the padding). The
    witnesses are the left edges ``ceil(s * L' / S_eff)`` (an ``arange``) of
    the unoccupied segments ``s < S_eff`` of rows with ``L > 0``; a
    ``cumsum`` ranks them and a second ``scatter_`` compacts them, in
    ascending segment order, into slots ``keep, keep + 1, ...``; slots past
    the last witness keep what they held. Arithmetic in int64, as the
    reference's, so no product overflows."""
    rows, topk = buf.shape
    S = num_segments
    keep = max(topk - S, 0)
    B = min(S, topk - keep)
    if S == 0 or B == 0 or rows == 0:
        return
    L = lens.to(torch.int64)
    live = L > 0
    L1 = L.clamp(min=1)[:, None]
    s_eff = L1.clamp(max=S)
    x = buf.to(torch.int64)
    seg = torch.where(x >= 0, (x * s_eff // L1).clamp_(max=S - 1), S)
    occupied = torch.zeros(rows, S + 1, dtype=torch.bool).scatter_(1, seg, True)[:, :S]
    s = torch.arange(S)[None, :]
    edges = (s * L1 + s_eff - 1) // s_eff  # ceil(s L' / S_eff): every term >= 0
    witness = live[:, None] & (s < s_eff) & ~occupied
    rank = witness.cumsum(1) - 1
    slot = torch.where(witness & (rank < B), rank, B)  # column B: dropped
    tail = torch.cat([buf[:, keep : keep + B], buf.new_empty(rows, 1)], 1)
    tail.scatter_(1, slot, edges.to(torch.int32))
    buf[:, keep : keep + B] = tail[:, :B]


def witness_cases(buf, lens, num_segments: int) -> dict:
    """``{"torch": ...}``: :func:`scatter_witnesses` in place on the NumPy
    int32 buffer ``buf`` (shared, not copied), or ``{}`` without torch. The
    warm-up calls leave witnesses in ``buf``'s tail: reset it before use."""
    torch = _torch()
    if torch is None:
        return {}
    tb, tl = torch.from_numpy(buf), torch.from_numpy(lens)
    return _warmed({"torch": lambda: scatter_witnesses(torch, tb, tl, num_segments)})


# --------------------------------------------------------------------------
# Block-sparse selection
# --------------------------------------------------------------------------


def block_select(torch, q, k, pos, bs: int, top: int, init: int, local: int):
    """``compare.numpy_block_select`` in torch: int32 ``[m, h, width]``
    block ids per query and KV head (``q [m, h, d]``, ``k [n, d]``,
    ``pos [m]`` int64 tensors), ``width = max(top, init + local)``.

    The ``[m·h, n]`` score matrix ``q @ k.T``; NaN scores and positions
    past ``min(pos + 1, n)`` set to -inf; a block max-pool (``amax`` over
    the scores viewed ``[m, h, n_blocks, bs]``, padded with -inf when the
    last block is partial). Ranking: the forced blocks (the first ``init``
    and the last ``local`` visible ones) first, then the other blocks by
    score descending, ties to the lower block id (two stable sorts: by
    score, then by forced); the first ``min(max(top, n_forced),
    n_visible_blocks)`` of them, sorted ascending, then -1."""
    m, h, d = q.shape
    n = k.shape[0]
    nb = -(-n // bs)
    vis = (pos + 1).clamp(max=n)
    scores = (q.reshape(m * h, d) @ k.T).view(m, h, n)
    torch.nan_to_num_(scores, nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))
    future = torch.arange(n)[None, :] >= vis[:, None]
    scores.masked_fill_(future[:, None, :], float("-inf"))
    if nb * bs != n:
        scores = torch.nn.functional.pad(scores, (0, nb * bs - n), value=float("-inf"))
    block = scores.view(m, h, nb, bs).amax(-1)

    ids = torch.arange(nb)[None, :]
    nvb = (vis + bs - 1) // bs
    forced = (ids < nvb[:, None]) & ((ids < init) | (ids >= (nvb - local)[:, None]))
    order = torch.sort(block, dim=-1, descending=True, stable=True).indices
    free = (~forced)[:, None, :].expand(m, h, nb).gather(-1, order).to(torch.uint8)
    order = order.gather(-1, torch.sort(free, dim=-1, stable=True).indices)

    width = max(top, init + local)
    big = nb  # past every block id: sorts last, then becomes -1
    chosen = order[..., :width]
    if chosen.shape[-1] < width:
        chosen = torch.nn.functional.pad(chosen, (0, width - chosen.shape[-1]), value=big)
    budget = torch.minimum(forced.sum(1).clamp(min=top), nvb)
    chosen = chosen.masked_fill(torch.arange(width) >= budget[:, None, None], big)
    chosen = chosen.sort(-1).values
    return chosen.masked_fill_(chosen == big, -1).to(torch.int32)


def block_cases(q, k, pos, bs: int, top: int, init: int, local: int) -> dict:
    """``{"torch product": k @ q.T, "torch pipeline": block_select}`` on the
    NumPy inputs (``q [m, h, d]``, ``k [n, d]``, ``pos [m]``), or ``{}``."""
    torch = _torch()
    if torch is None:
        return {}
    tq, tk = torch.from_numpy(q), torch.from_numpy(k)
    tp = torch.as_tensor(pos, dtype=torch.int64).reshape(q.shape[0])
    flat = tq.reshape(-1, q.shape[-1])
    return _warmed(
        {
            "torch product": lambda: tk @ flat.T,
            "torch pipeline": lambda: block_select(torch, tq, tk, tp, bs, top, init, local),
        }
    )


# --------------------------------------------------------------------------
# Attention
# --------------------------------------------------------------------------


def dense_attention_cases(q, k, v) -> dict:
    """``{"torch sdpa": ...}``: ``F.scaled_dot_product_attention(q, k, v,
    is_causal=True)`` on the ``[n, d]`` NumPy inputs viewed
    ``[1, 1, n, d]`` (one batch, one head; the default scale
    ``d ** -0.5``), or ``{}``."""
    torch = _torch()
    if torch is None:
        return {}
    n, d = q.shape
    tq, tk, tv = (torch.from_numpy(a).view(1, 1, n, d) for a in (q, k, v))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    return _warmed({"torch sdpa": lambda: sdpa(tq, tk, tv, is_causal=True)})


def sparse_attention(torch, q, k, v, sel, gathered):
    """Sparse decode in torch: ``[nq, hq, d]`` outputs for ``q [nq, hq, d]``
    over the keys ``sel [nq, hkv, width]`` (int32 key ids, all valid) of
    ``k, v [L, hkv, d]``; query head ``h`` reads KV head
    ``h // (hq // hkv)``.

    Two ``index_select`` calls gather every (query, KV head)'s selected rows
    of the keys and of the values viewed ``[L·hkv, d]`` (row ``id·hkv + j``)
    into the preallocated ``gathered`` pair of ``[nq·hkv·width, d]`` buffers
    (a serving loop's shapes repeat, and these are the pipeline's only large
    intermediates: 32 MiB at k = 512, which glibc would otherwise map fresh
    from the OS on many calls); the query heads are viewed
    ``[nq, hkv, group, d]`` so each group broadcasts over its KV head's
    gathered rows (the expand, without a copy); then
    ``scores = q·k·d**-0.5``, ``softmax``, weighted sum of the values, all
    batched matmuls."""
    nq, hq, d = q.shape
    length, hkv, _ = k.shape
    width = sel.shape[-1]
    rows = (sel.to(torch.int64) * hkv + torch.arange(hkv)[None, :, None]).view(-1)
    kg, vg = (
        torch.index_select(x.view(length * hkv, d), 0, rows, out=buf).view(nq, hkv, width, d)
        for x, buf in zip((k, v), gathered)
    )
    qg = q.view(nq, hkv, hq // hkv, d)
    p = torch.softmax((qg @ kg.transpose(-1, -2)) * d**-0.5, dim=-1)
    return (p @ vg).view(nq, hq, d)


def sparse_attention_cases(q, k, v, sel) -> dict:
    """``{"torch": sparse_attention}`` on the NumPy inputs, its gather
    buffers allocated here, or ``{}``."""
    torch = _torch()
    if torch is None:
        return {}
    tq, tk, tv, ts = (torch.from_numpy(a) for a in (q, k, v, sel))
    gathered = [torch.empty(sel.size, q.shape[-1]) for _ in range(2)]
    return _warmed({"torch": lambda: sparse_attention(torch, tq, tk, tv, ts, gathered)})
