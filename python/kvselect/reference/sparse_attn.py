"""Exact sparse attention over an engine's selection, in float64, with the
engine's conventions declared: the reference ``kvselect.checking`` judges a
sparse attention / sparse MLA kernel's ``out`` and ``lse`` against.

Part of ``kvselect.reference``; see that package's docstring.

The rule
--------

Query ``n`` at head ``h`` attends to the keys its index row selects. With
``s_j = scale · q[n, h] · k[j]`` over the row's counted keys, each counted
``m_j`` times,

    lse = log Σ_j m_j exp(s_j)                        (natural log, KV only)
    out = Σ_j m_j exp(s_j) v[j] / (Σ_j m_j exp(s_j) + exp(sink[h]))

(``exp(sink[h])`` only with a sink: it joins the denominator, never ``lse``:
NVIDIA/cudnn-frontend#793's contract, and FlashMLA's
``tests/ref.py``, deepseek-ai/FlashMLA a123d0b0, whose ``lse`` is the KV
``logsumexp`` before the sink is merged). A row that counts no key is
**empty**: ``out = 0`` and ``lse = -inf`` here; the value an engine stores
for it is a declared convention (:class:`Conventions` ``empty_lse``).

Which keys a row counts is where the engines differ, and every difference
is a named option of :class:`Conventions`, never guessed:

- ``read``: which slots of the row are read at all: ``"row"`` (every slot:
  FlashMLA, vLLM's Triton sparse MLA, cuDNN #793), ``"prefix"`` (the first
  ``read_len[n]`` slots: FlashMLA's ``topk_length``, MiniMax-M3's
  ``min(topk, valid blocks)``), ``"suffix"`` (the last ``read_len[n]``),
  ``"last_valid"`` (up to the last valid entry of the row: SGLang's DSA
  prefill). ``read_len`` defaults to ``min(width, query_pos // block_size + 1)``
  (the blocks a causal query can see, MiniMax-M3's count).
- an entry is **padding** when it is negative (``-1`` by every engine read);
  an entry at or past its sequence's entries is **out of range**: skipped
  (FlashMLA's ``invalid_mask``: ``indices >= s_kv``) or refused
  (``out_of_range="refuse"``, a caller's mistake).
- ``duplicates``: a repeated entry counts ``"each"`` time it appears (every
  kernel measured in issue 40), ``"once"`` (kvselect's own
  ``sparse_attention``: a selection is a set), or must not occur
  (``"unique"``: cuDNN #793 requires unique rows; a repeat is refused).
- ``causal``: with ``True`` a token past ``query_pos[n]`` is masked; with
  ``False`` every index is trusted (the token-level MLA kernels take no
  query position).
- ``block_size``: tokens per index entry (1: token indices; MiniMax-M3's
  128-token blocks); an entry ``e`` covers tokens ``e·bs .. e·bs + bs - 1``,
  those past the sequence's keys masked.
- ``global_indices``: entries are flat ids into the whole key array (THD
  layout) rather than positions within the query's sequence (an entry in
  another sequence is out of range).
- ``head_major``: the index rows are ``[groups, n_queries, width]``
  (MiniMax-M3's ``[num_kv_heads, total_q, topk]``) rather than
  ``[n_queries, groups, width]``.

Where the keys are: ``k`` ``[n_keys, n_kv_heads, d_qk]`` (one sequence, or
several packed by ``cu_seqlens`` with ``seq_ids`` naming each query's), or a
paged cache ``[n_pages, page_size, n_kv_heads, d_qk]`` read through
``block_table[seq, position // page_size]`` with ``seq_lens``. ``v`` alike,
or None for MLA's shared latent: ``v = k[..., :d_v]`` (the rope part is the
tail of ``d_qk``, read by the score only). Index rows are shared by a group
of heads: ``G`` rows per query, ``G`` one of 1 (every head), ``n_kv_heads``
(GQA: query head ``h`` reads row ``h // (H_q / H_kv)``) or ``H_q`` (one per
query head).

Everything is computed in float64 from the inputs as given (an ml_dtypes
bfloat16 / float8 array is read by its values), so the result is exact up
to float64 rounding: the kernels judged against it round far coarser.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Dict, Optional, Tuple, Union

import numpy as np

from ._args import ReferenceSelectionError

READS = ("row", "prefix", "suffix", "last_valid")
"""The values of :attr:`Conventions.read`."""

DUPLICATES = ("each", "once", "unique")
"""The values of :attr:`Conventions.duplicates`."""

EmptyLse = Union[str, float, Tuple[float, float]]


@dataclass(frozen=True)
class Conventions:
    """How an engine reads its index rows and reports an empty row.

    Attributes
    ----------
    read : str
        Which slots are read: ``"row"``, ``"prefix"``, ``"suffix"``,
        ``"last_valid"`` (module docs).
    duplicates : str
        ``"each"``, ``"once"`` or ``"unique"``.
    causal : bool
        Mask tokens past each query's ``query_pos``.
    block_size : int
        Tokens per index entry (1: token indices).
    out_of_range : str
        ``"skip"`` or ``"refuse"`` an entry at or past its sequence's entries.
    global_indices : bool
        Entries are flat ids into every key (packed batches only).
    head_major : bool
        Index rows are ``[groups, n_queries, width]``.
    lse_head_major : bool
        The engine's ``lse`` is ``[H_q, n_queries]`` (FlashMLA's decode
        returns ``lse.transpose``).
    empty_lse : str, float or (float, float)
        What the engine stores as an empty row's ``lse``: ``"-inf"``,
        ``"+inf"`` (FlashMLA), a number, or a ``(low, high)`` range of
        finite sentinels (vLLM's Triton sparse MLA stores
        ``-1e30 · ln 2 + ln(slots)``). The output is 0 in every convention.
    lse_base : str
        ``"e"`` or ``"2"``: the engine's ``lse`` is ``log`` or ``log2`` of
        the sum (the exact one converted, never the engine's).
    """

    read: str = "row"
    duplicates: str = "each"
    causal: bool = False
    block_size: int = 1
    out_of_range: str = "skip"
    global_indices: bool = False
    head_major: bool = False
    lse_head_major: bool = False
    empty_lse: EmptyLse = "-inf"
    lse_base: str = "e"

    def __post_init__(self) -> None:
        if self.read not in READS:
            raise ReferenceSelectionError("read", f"read must be one of {', '.join(READS)}, got {self.read!r}")
        if self.duplicates not in DUPLICATES:
            raise ReferenceSelectionError(
                "duplicates", f"duplicates must be one of {', '.join(DUPLICATES)}, got {self.duplicates!r}"
            )
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, (int, np.integer)):
            raise ReferenceSelectionError("block_size", f"block_size must be an integer, got {self.block_size!r}")
        if self.block_size < 1:
            raise ReferenceSelectionError("block_size", f"block_size must be at least 1, got {self.block_size}")
        if self.out_of_range not in ("skip", "refuse"):
            raise ReferenceSelectionError(
                "out_of_range", f"out_of_range must be 'skip' or 'refuse', got {self.out_of_range!r}"
            )
        if self.lse_base not in ("e", "2"):
            raise ReferenceSelectionError("lse_base", f"lse_base must be 'e' or '2', got {self.lse_base!r}")
        e = self.empty_lse
        ok = (
            e in ("-inf", "+inf")
            if isinstance(e, str)
            else (
                isinstance(e, tuple) and len(e) == 2 and all(np.isfinite(x) for x in e) and e[0] <= e[1]
                if isinstance(e, tuple)
                else isinstance(e, (int, float, np.floating)) and not np.isnan(e)
            )
        )
        if not ok:
            raise ReferenceSelectionError(
                "empty_lse", f"empty_lse must be '-inf', '+inf', a number or a finite (low, high) range, got {e!r}"
            )

    def empty_lse_range(self) -> Tuple[float, float]:
        """The empty row's ``lse`` as a closed range (equal ends for one value)."""
        e = self.empty_lse
        if isinstance(e, str):
            x = float(e)
            return (x, x)
        if isinstance(e, tuple):
            return (float(e[0]), float(e[1]))
        return (float(e), float(e))


#: The engines' conventions, each read from its source (docs/checking-sparse-attention.md):
PRESETS: Dict[str, Conventions] = {
    # deepseek-ai/FlashMLA tests/ref.py (a123d0b0) ref_sparse_attn_fwd: every slot, an
    # index < 0 or >= s_kv invalid, topk_length makes it a prefix; no causality; an
    # empty row's lse is +inf ("so that corresponding O will be 0").
    "flashmla_sparse_prefill": Conventions(empty_lse="+inf"),
    # same file, ref_sparse_attn_decode: -1 invalid, lse returned transposed [b, h_q, s_q].
    "flashmla_sparse_decode": Conventions(empty_lse="+inf", lse_head_major=True),
    # NVIDIA/cudnn-frontend#793: -1 padded, unique per row, base-e float32 lse over the
    # KV only, dead rows out = 0 and lse = -inf.
    "cudnn_793": Conventions(duplicates="unique", out_of_range="refuse"),
    # vllm-project/vllm vllm/v1/attention/ops/xpu_mla_sparse.py (35772e31): every slot,
    # -1 or >= seq_kv masked to a -1e30 logit, running max from -1e30: an empty row is
    # out = 0, lse = -1e30 ln 2 + ln(slots).
    "vllm_triton_mla_sparse": Conventions(empty_lse=(-1.0e31, -1.0e29)),
    # vllm-project/vllm vllm/models/minimax_m3/common/ops/sparse_attn.py (03034981):
    # 128-token blocks, the first min(topk, pos // 128 + 1) read, causal within the
    # block, head-major rows [num_kv_heads, total_q, topk], base-2 partial lse.
    "minimax_m3": Conventions(read="prefix", causal=True, block_size=128, head_major=True, lse_base="2"),
    # SGLang's DSA Triton sparse-MLA prefill as issue 40 measured it: up to the last
    # non-negative entry, repeats counted.
    "sglang_dsa_prefill": Conventions(read="last_valid"),
    # kvselect's own sparse_attention (src/attention): a selection is a set, causal.
    "kvselect": Conventions(duplicates="once", causal=True),
}


def conventions_of(preset: Optional[str] = None, **overrides: Any) -> Conventions:
    """A preset's :class:`Conventions` (default: every default) with ``overrides``.

    Raises
    ------
    ReferenceSelectionError
        An unknown preset (``argument == "preset"``) or an invalid override.
    """
    if preset is None:
        base = Conventions()
    elif preset in PRESETS:
        base = PRESETS[preset]
    else:
        raise ReferenceSelectionError("preset", f"preset must be one of {', '.join(PRESETS)}, got {preset!r}")
    given = {k: v for k, v in overrides.items() if v is not None}
    return replace(base, **given) if given else base


@dataclass
class Layout:
    """The inputs of one call, checked and normalised (what every pass reads).

    ``q`` ``[n, H_q, d_qk]``, ``k`` / ``v`` flat ``[n_slots, H_kv, d]``
    float64, ``idx`` ``[n, G, W]`` int64 (query-major), ``pos`` ``[n]`` or
    None, ``seq`` ``[n]``, ``seq_len`` ``[n_seqs]``, ``base`` ``[n_seqs]``
    (packed: the first key's row), ``table`` ``[n_seqs, max_blocks]`` or None,
    ``page`` the page size, ``read_len`` ``[n]``, ``scale``, ``sink`` ``[H_q]``
    or None, ``group`` (query heads per KV head), ``G``.
    """

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    idx: np.ndarray
    pos: Optional[np.ndarray]
    seq: np.ndarray
    seq_len: np.ndarray
    base: np.ndarray
    table: Optional[np.ndarray]
    page: int
    read_len: np.ndarray
    scale: float
    sink: Optional[np.ndarray]
    group: int
    G: int
    conv: Conventions


def _floats(name: str, a: Any) -> np.ndarray:
    arr = np.asarray(a)
    if arr.dtype.kind not in "fcV" and arr.dtype.name not in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        raise TypeError(f"{name} must hold floats, got {arr.dtype}")
    return arr.astype(np.float64)


def _ints(name: str, a: Any, ndim: Optional[int] = None) -> np.ndarray:
    arr = np.asarray(a)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got {arr.dtype}")
    if ndim is not None and arr.ndim != ndim:
        raise ReferenceSelectionError(name, f"{name} must be {ndim}-D, got shape {arr.shape}")
    return arr.astype(np.int64)


def layout(
    q: Any,
    k: Any,
    v: Any,
    indices: Any,
    conv: Conventions,
    *,
    query_pos: Any = None,
    scale: Optional[float] = None,
    d_v: Optional[int] = None,
    sink: Any = None,
    read_len: Any = None,
    cu_seqlens: Any = None,
    seq_ids: Any = None,
    block_table: Any = None,
    seq_lens: Any = None,
) -> Layout:
    """Check the inputs of one call and put them in one :class:`Layout`.

    Raises
    ------
    ReferenceSelectionError
        Shapes that do not fit together, naming the argument.
    TypeError
        Floats where indices belong, or the reverse.
    """
    qf = _floats("q", q)
    if qf.ndim != 3:
        raise ReferenceSelectionError("q", f"q must be [n_queries, n_heads, d_qk], got shape {qf.shape}")
    n, H, d = qf.shape
    kf = _floats("k", k)
    paged = block_table is not None
    if kf.ndim != (4 if paged else 3):
        want = "[n_pages, page_size, n_kv_heads, d_qk]" if paged else "[n_keys, n_kv_heads, d_qk]"
        raise ReferenceSelectionError("k", f"k must be {want}, got shape {kf.shape}")
    page = int(kf.shape[1]) if paged else 1
    if kf.shape[-1] != d:
        raise ReferenceSelectionError("k", f"k's last axis ({kf.shape[-1]}) must be q's d_qk ({d})")
    Hkv = int(kf.shape[-2])
    if Hkv < 1 or H % Hkv:
        raise ReferenceSelectionError("k", f"q's {H} heads are not a multiple of k's {Hkv} KV heads")
    if v is None:
        dv = d if d_v is None else int(d_v)
        if not 0 < dv <= d:
            raise ReferenceSelectionError("d_v", f"d_v must be in 1..{d} (the latent's width), got {dv}")
        vf = kf[..., :dv]
    else:
        vf = _floats("v", v)
        if vf.shape[:-1] != kf.shape[:-1]:
            raise ReferenceSelectionError("v", f"v must be {kf.shape[:-1]} + [d_v], got shape {vf.shape}")
    kflat = kf.reshape(-1, Hkv, d)
    vflat = vf.reshape(-1, Hkv, vf.shape[-1])
    idx = _ints("indices", indices)
    if idx.ndim == 2:
        idx = idx[:, None, :] if not conv.head_major else idx[None, :, :]
    if idx.ndim != 3:
        raise ReferenceSelectionError("indices", f"indices must be 2-D or 3-D, got shape {idx.shape}")
    if conv.head_major:
        idx = idx.transpose(1, 0, 2)
    if idx.shape[0] != n:
        raise ReferenceSelectionError("indices", f"indices hold {idx.shape[0]} queries' rows, q holds {n}")
    G = int(idx.shape[1])
    if G not in (1, Hkv, H):
        raise ReferenceSelectionError("indices", f"indices hold {G} rows a query: 1, n_kv_heads ({Hkv}) or H_q ({H})")
    pos = None
    if query_pos is not None:
        pos = _ints("query_pos", query_pos).reshape(-1)
        if len(pos) != n or (pos < 0).any():
            raise ReferenceSelectionError("query_pos", f"query_pos must be {n} non-negative positions")
    if conv.causal and pos is None:
        raise ReferenceSelectionError("query_pos", "causal conventions need query_pos")
    if seq_ids is None:
        seq = np.zeros(n, dtype=np.int64)
    else:
        seq = _ints("seq_ids", seq_ids).reshape(-1)
        if len(seq) != n:
            raise ReferenceSelectionError("seq_ids", f"seq_ids must hold {n} entries, got {len(seq)}")
    if paged:
        table = _ints("block_table", block_table, 2)
        if seq_lens is None:
            raise ReferenceSelectionError("seq_lens", "a paged cache needs seq_lens")
        seq_len = _ints("seq_lens", seq_lens).reshape(-1)
        if len(seq_len) != len(table):
            raise ReferenceSelectionError("seq_lens", "seq_lens must hold one length per block_table row")
        if (seq_len > table.shape[1] * page).any() or (seq_len < 0).any():
            raise ReferenceSelectionError("seq_lens", "a sequence is longer than its block_table row holds")
        live = np.arange(table.shape[1])[None, :] < (seq_len[:, None] + page - 1) // page
        if ((table < 0) | (table >= kf.shape[0]))[live].any():
            raise ReferenceSelectionError("block_table", f"block_table names a page outside 0..{kf.shape[0] - 1}")
        base = np.zeros(len(table), dtype=np.int64)
    elif cu_seqlens is not None:
        cu = _ints("cu_seqlens", cu_seqlens).reshape(-1)
        if len(cu) < 2 or cu[0] != 0 or (np.diff(cu) < 0).any() or cu[-1] != len(kflat):
            raise ReferenceSelectionError("cu_seqlens", f"cu_seqlens must rise from 0 to the {len(kflat)} keys")
        table, base, seq_len = None, cu[:-1], np.diff(cu)
    else:
        table, base, seq_len = None, np.zeros(1, dtype=np.int64), np.array([len(kflat)], dtype=np.int64)
    if ((seq < 0) | (seq >= len(seq_len))).any():
        raise ReferenceSelectionError("seq_ids", f"seq_ids must name one of {len(seq_len)} sequences")
    if conv.global_indices and table is not None:
        raise ReferenceSelectionError("global_indices", "global indices are for packed keys, not a paged cache")
    W = idx.shape[2]
    bs = int(conv.block_size)
    if read_len is None:
        if conv.read in ("prefix", "suffix"):
            if pos is None:
                raise ReferenceSelectionError("read_len", f"read={conv.read!r} needs read_len or query_pos")
            rl = np.minimum(W, pos // bs + 1)
        else:
            rl = np.full(n, W, dtype=np.int64)
    else:
        rl = _ints("read_len", read_len).reshape(-1)
        if len(rl) != n or (rl < 0).any():
            raise ReferenceSelectionError("read_len", f"read_len must be {n} non-negative counts")
        rl = np.minimum(rl, W)
    sk = None
    if sink is not None:
        sk = _floats("sink", sink).reshape(-1)
        if len(sk) != H:
            raise ReferenceSelectionError("sink", f"sink must hold one logit per query head ({H})")
    sc = 1.0 / np.sqrt(d) if scale is None else float(scale)
    if not np.isfinite(sc):
        raise ReferenceSelectionError("scale", f"scale must be finite, got {scale}")
    return Layout(qf, kflat, vflat, idx, pos, seq, seq_len, base, table, page, rl, sc, sk, H // Hkv, G, conv)


def read_mask(lay: Layout) -> np.ndarray:
    """``[n, G, W]``: the slots the conventions read."""
    n, G, W = lay.idx.shape
    slot = np.arange(W)[None, None, :]
    rl = lay.read_len[:, None, None]
    r = lay.conv.read
    if r == "row":
        return np.ones((n, G, W), dtype=bool)
    if r == "prefix":
        return np.broadcast_to(slot < rl, (n, G, W)).copy()
    if r == "suffix":
        return np.broadcast_to(slot >= W - rl, (n, G, W)).copy()
    valid = lay.idx >= 0
    last = np.where(valid.any(axis=2), W - 1 - np.argmax(valid[:, :, ::-1], axis=2), -1)
    return slot <= last[:, :, None]


@dataclass
class Terms:
    """The counted keys of some queries' rows, token by token in slot order.

    ``flat`` ``[n, G, W·bs]``: each token's row in the flat keys (0 where not
    counted); ``weight`` the times it counts (0, 1, or more with repeats);
    ``masked`` a read slot's token that does not count (padding, out of
    range, past the sequence, in the future), in slot order.
    """

    flat: np.ndarray
    weight: np.ndarray
    masked: np.ndarray


def terms(lay: Layout, rows: Optional[np.ndarray] = None) -> Terms:
    """The counted tokens of queries ``rows`` (default all).

    Raises
    ------
    ReferenceSelectionError
        A repeat under ``duplicates="unique"``, or an out-of-range entry
        under ``out_of_range="refuse"`` (``argument == "indices"``).
    """
    sel = np.arange(len(lay.q)) if rows is None else np.asarray(rows)
    conv = lay.conv
    idx = lay.idx[sel]
    n, G, W = idx.shape
    bs = conv.block_size
    read = read_mask(lay)[sel]
    seq = lay.seq[sel]
    slen = lay.seq_len[seq]
    local = idx.copy()
    if conv.global_indices:
        local = idx - lay.base[seq][:, None, None]
    entries = (slen + bs - 1) // bs
    valid = read & (idx >= 0)
    in_range = (local >= 0) & (local < entries[:, None, None])
    if conv.out_of_range == "refuse" and (valid & ~in_range).any():
        at = tuple(int(x) for x in np.argwhere(valid & ~in_range)[0])
        raise ReferenceSelectionError(
            "indices", f"indices{list(at)} is past its sequence's {int(entries[at[0]])} entries"
        )
    ok = valid & in_range
    tok = local[..., None] * bs + np.arange(bs)[None, None, None, :]  # [n, G, W, bs]
    vis = ok[..., None] & (tok < slen[:, None, None, None])
    if conv.causal:
        assert lay.pos is not None
        vis &= tok <= lay.pos[sel][:, None, None, None]
    tok = np.where(vis, tok, 0)
    if lay.table is not None:
        phys = lay.table[seq[:, None, None, None], tok // lay.page] * lay.page + tok % lay.page
    else:
        phys = lay.base[seq][:, None, None, None] + tok
    flat = np.where(vis, phys, 0).reshape(n, G, W * bs)
    vis = vis.reshape(n, G, W * bs)
    masked = np.repeat(read, bs, axis=2) & ~vis
    weight = vis.astype(np.float64)
    if conv.duplicates != "each":
        key = np.where(vis, flat, -1)
        order = np.argsort(key, axis=2, kind="stable")
        srt = np.take_along_axis(key, order, axis=2)
        rep = np.zeros_like(vis)
        rep[:, :, 1:] = (srt[:, :, 1:] == srt[:, :, :-1]) & (srt[:, :, 1:] >= 0)
        if conv.duplicates == "unique" and rep.any():
            i, g = (int(x) for x in np.argwhere(rep.any(axis=2))[0])
            raise ReferenceSelectionError(
                "indices", f"indices row (query {int(sel[i])}, group {g}) repeats an entry: the conventions say unique"
            )
        first = np.ones_like(vis)
        np.put_along_axis(first, order, ~rep, axis=2)
        weight = weight * first
    return Terms(flat, weight, masked)


@dataclass
class Exact:
    """The exact result of some queries' rows, with what an error bound needs.

    Attributes
    ----------
    out : ndarray of float64, [n, H_q, d_v]
        The output (0 for an empty row).
    lse : ndarray of float64, [n, H_q]
        Natural-log ``lse`` over the KV (``-inf`` for an empty row).
    count : ndarray of float64, [n, H_q]
        Keys counted (with repeats).
    abs_pv : ndarray of float64, [n, H_q, d_v]
        ``Σ_j p_j |v_j|``, ``p_j`` the normalised weights.
    dev_pv : ndarray of float64, [n, H_q, d_v]
        An upper bound on ``Σ_j p_j |v_j - out|`` (Cauchy-Schwarz over the
        weights' second moment, or the triangle inequality, the smaller).
    mag : ndarray of float64, [n, H_q]
        ``max_j scale Σ_i |q_i k_ji|``: the scale of a logit's rounding.
    smax : ndarray of float64, [n, H_q]
        ``max_j |s_j|``.
    """

    out: np.ndarray
    lse: np.ndarray
    count: np.ndarray
    abs_pv: np.ndarray
    dev_pv: np.ndarray
    mag: np.ndarray
    smax: np.ndarray

    @property
    def empty(self) -> np.ndarray:
        """``[n, H_q]``: the rows that count no key."""
        return self.count == 0


#: Elements gathered at once (a chunk of queries' keys).
_CHUNK = 1 << 22


def head_row(lay: Layout, h: int) -> Tuple[int, int]:
    """Query head ``h``'s index row group and KV head."""
    kvh = h // lay.group
    g = 0 if lay.G == 1 else (kvh if lay.G * lay.group == lay.q.shape[1] else h)
    return g, kvh


def scores(lay: Layout, t: Terms, sel: np.ndarray) -> np.ndarray:
    """``[n, H_q, L]`` scaled logits of queries ``sel``'s tokens (``-inf`` where not counted)."""
    n = len(sel)
    H = lay.q.shape[1]
    L = t.flat.shape[2]
    s = np.full((n, H, L), -np.inf)
    for (g, kvh), heads in _head_groups(lay).items():
        kk = lay.k[t.flat[:, g], kvh]  # [n, L, d]
        sh = np.matmul(lay.q[sel][:, heads], kk.transpose(0, 2, 1)) * lay.scale
        s[:, heads] = np.where((t.weight[:, g] > 0)[:, None, :], sh, -np.inf)
    return s


def exact(lay: Layout, rows: Optional[np.ndarray] = None) -> Exact:
    """The exact result of queries ``rows`` (default all) under ``lay.conv``.

    Raises
    ------
    ReferenceSelectionError
        As :func:`terms`.
    """
    sel = np.arange(len(lay.q)) if rows is None else np.asarray(rows, dtype=np.int64)
    H = lay.q.shape[1]
    dv = lay.v.shape[-1]
    d = lay.q.shape[2]
    W = lay.idx.shape[2] * lay.conv.block_size
    step = max(1, _CHUNK // max(1, W * max(d, dv)))
    parts = []
    with np.errstate(invalid="ignore", over="ignore"):  # a NaN / inf input yields NaN, reported by the caller
        for c0 in range(0, len(sel), step):
            parts.append(_exact_chunk(lay, sel[c0 : c0 + step]))
    if not parts:
        z = np.zeros((0, H))
        zv = np.zeros((0, H, dv))
        return Exact(zv, z, z, zv, zv, z, z)
    return Exact(*(np.concatenate([getattr(p, f) for p in parts]) for f in Exact.__dataclass_fields__))


def _head_groups(lay: Layout) -> Dict[Tuple[int, int], list]:
    """Query heads by the (index row, KV head) they read: each pair's keys are gathered once."""
    out: Dict[Tuple[int, int], list] = {}
    for h in range(lay.q.shape[1]):
        out.setdefault(head_row(lay, h), []).append(h)
    return out


def _exact_chunk(lay: Layout, sel: np.ndarray) -> Exact:
    t = terms(lay, sel)
    n = len(sel)
    H = lay.q.shape[1]
    dv = lay.v.shape[-1]
    out = np.zeros((n, H, dv))
    lse = np.full((n, H), -np.inf)
    count = np.zeros((n, H))
    abs_pv = np.zeros((n, H, dv))
    dev_pv = np.zeros((n, H, dv))
    mag = np.zeros((n, H))
    smax = np.zeros((n, H))
    for (g, kvh), heads in _head_groups(lay).items():
        w = t.weight[:, g]  # [n, L]
        kk = lay.k[t.flat[:, g], kvh]  # [n, L, d]
        vv = lay.v[t.flat[:, g], kvh]  # [n, L, dv]
        qh = lay.q[sel][:, heads]  # [n, h, d]
        kt = kk.transpose(0, 2, 1)
        s = np.matmul(qh, kt) * lay.scale  # [n, h, L]
        a = np.matmul(np.abs(qh), np.abs(kt)) * abs(lay.scale)
        live = (w > 0)[:, None, :]
        s = np.where(live, s, -np.inf)
        m = s.max(axis=2, initial=-np.inf)
        fin = np.isfinite(m)
        mm = np.where(fin, m, 0.0)
        e = np.where(live, w[:, None, :] * np.exp(s - mm[..., None]), 0.0)
        z = e.sum(axis=2)
        with np.errstate(divide="ignore"):
            lse[:, heads] = np.where(fin, mm + np.log(np.where(fin, z, 1.0)), -np.inf)
        denom = z.copy()
        if lay.sink is not None:
            denom = denom + np.exp(lay.sink[heads][None, :] - mm)
        p = np.where(fin[..., None], e / np.where(denom > 0, denom, 1.0)[..., None], 0.0)
        o = np.matmul(p, vv)
        out[:, heads] = o
        count[:, heads] = w.sum(axis=1)[:, None]
        abs_pv[:, heads] = np.matmul(p, np.abs(vv))
        # Σ p_j |v_j - out| <= sqrt(Σ p_j) sqrt(Σ p_j (v_j - out)^2) (Cauchy-Schwarz), the
        # second moment from one product: Σ p_j v_j^2 - out^2 (2 - Σ p_j), as Σ p_j v_j = out;
        # its cancellation (float64) covered by 2^-50 of the moment.
        sp = p.sum(axis=2)[..., None]
        m2 = np.matmul(p, vv * vv)
        var = np.maximum(m2 - o * o * (2.0 - sp), 0.0) + 2.0**-50 * m2
        dev_pv[:, heads] = np.minimum(np.sqrt(var * sp), abs_pv[:, heads] + np.abs(o) * sp)
        mag[:, heads] = np.where(live, a, 0.0).max(axis=2, initial=0.0)
        smax[:, heads] = np.where(live, np.abs(np.where(live, s, 0.0)), 0.0).max(axis=2, initial=0.0)
    return Exact(out, lse, count, abs_pv, dev_pv, mag, smax)


def sparse_attention_exact(
    q: Any,
    k: Any,
    v: Any,
    indices: Any,
    *,
    preset: Optional[str] = None,
    conventions: Optional[Conventions] = None,
    query_pos: Any = None,
    scale: Optional[float] = None,
    d_v: Optional[int] = None,
    sink: Any = None,
    read_len: Any = None,
    cu_seqlens: Any = None,
    seq_ids: Any = None,
    block_table: Any = None,
    seq_lens: Any = None,
) -> Tuple[np.ndarray, np.ndarray]:
    """Exact sparse attention (float64) over index rows read by an engine's conventions.

    Parameters
    ----------
    q : array_like, [n_queries, H_q, d_qk]
        The queries (any float dtype, ml_dtypes bfloat16 / float8 included).
    k : array_like, [n_keys, H_kv, d_qk] or [n_pages, page_size, H_kv, d_qk]
        The keys (a paged cache with ``block_table``).
    v : array_like or None
        The values, ``k``'s shape with ``d_v`` last; None for MLA's shared
        latent (``v = k[..., :d_v]``).
    indices : array_like of int, [n_queries, G, width] (or [G, n_queries, width] head-major; 2-D: G = 1)
        The engine's index rows.
    preset, conventions : optional
        The engine's conventions: a name of :data:`PRESETS`, or a
        :class:`Conventions` (which wins).
    query_pos, scale, d_v, sink, read_len, cu_seqlens, seq_ids, block_table, seq_lens : optional
        As the module docs say (``scale`` defaults to ``1/sqrt(d_qk)``).

    Returns
    -------
    out : ndarray of float64, [n_queries, H_q, d_v]
        0 for an empty row.
    lse : ndarray of float64, [n_queries, H_q]
        Natural-log ``lse`` over the KV; ``-inf`` for an empty row (the
        engine's base and empty value are the check's business).

    Raises
    ------
    ReferenceSelectionError
        Inputs that do not fit together, naming the argument; a repeat under
        ``duplicates="unique"``.
    TypeError
        Floats where indices belong, or the reverse.

    See Also
    --------
    kvselect.checking.check_sparse_attention : an engine's out and lse judged against this.

    Examples
    --------
    >>> import numpy as np
    >>> q = np.zeros((1, 1, 2)); k = np.zeros((3, 1, 2)); v = np.arange(3.0).reshape(3, 1, 1)
    >>> out, lse = sparse_attention_exact(q, k, v, np.array([[0, 2, 2, -1]]))
    >>> out.ravel().tolist(), round(float(np.exp(lse[0, 0])))  # key 2 counted twice
    ([1.3333333333333333], 3)
    """
    conv = conventions if conventions is not None else conventions_of(preset)
    lay = layout(
        q,
        k,
        v,
        indices,
        conv,
        query_pos=query_pos,
        scale=scale,
        d_v=d_v,
        sink=sink,
        read_len=read_len,
        cu_seqlens=cu_seqlens,
        seq_ids=seq_ids,
        block_table=block_table,
        seq_lens=seq_lens,
    )
    r = exact(lay)
    return r.out, r.lse
