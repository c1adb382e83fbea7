"""Your own Q/K/V dumps: :func:`load_npz` reads the one dump format (kind
``"workload"``, ``docs/dump-format.md``), one layer at a time."""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from kvselect.checking.files import basename, is_url, stem, take_rows
from kvselect.workloads.indexer import derive_head, derive_indexer
from kvselect.workloads.model import (
    ONE_HEAD_INDEXER,
    HeadInputs,
    Indexer,
    PathLike,
    Workload,
    WorkloadError,
    WorkloadWarning,
    one_head_inputs,
    query_positions,
)


def load_npz(
    path: PathLike,
    *,
    layers: Union[None, int, Sequence[int]] = None,
    queries: int = 64,
    seed: int = 0,
) -> Workload:
    """Read a dump in the documented ``.npz`` format (see the module docstring).

    Parameters
    ----------
    path : str or os.PathLike
        The ``.npz`` file.
    layers : int, sequence of int, or None
        Which layers of the file to use (indices into its first axis, in the
        order given); ``None`` for all. Each layer contributes its heads,
        named ``"L{layer}/H{kv_head}"`` (the file's ``layer_ids`` /
        ``kv_head_ids`` when present, else the indices).
    queries : int
        How many query positions to evaluate, drawn by
        :func:`query_positions` over ``[tokens // 8, tokens)`` with
        ``tokens - 1`` always included (all of them if fewer).
    seed : int
        The seed of those positions. (A derived indexer always uses
        :func:`derive_indexer`'s fixed projection seed, 0.)

    Returns
    -------
    Workload
        float32 arrays with layers flattened into heads, ``scale`` from the
        file or ``1/sqrt(d)``, and the file's indexer or, without one,
        :func:`derive_indexer`'s.

    Raises
    ------
    FileNotFoundError
        No such file.
    WorkloadError
        Not an ``.npz`` archive, or an array that breaks the format; the
        message names the key and what was expected, in layers, heads and
        tokens.

    Warns
    -----
    WorkloadWarning
        ``q`` has fewer tokens (axis 2) than query heads (axis 1): the dump
        was probably saved as ``[layers, tokens, heads, d]`` (a common torch
        layout) and would be evaluated as many heads of a few tokens.
    """
    o = _open(path, lazy=False)
    if o.warning:
        warnings.warn(o.warning, WorkloadWarning, stacklevel=2)
    arrays, formats = o.arrays, o.formats
    n_layers, n_kv, tokens = o.n_layers, o.n_kv, o.tokens
    has_index, dsa, layer_ids, kv_head_ids = o.has_index, o.dsa, o.layer_ids, o.kv_head_ids
    from kvselect.checking import decode32

    chosen = _choose_layers(layers, n_layers)

    def read(key: str) -> np.ndarray:
        # Only the chosen layers' bytes are read (the members are memory-mapped).
        return decode32(arrays[key][chosen], formats.get(key))

    def flat(key: str) -> np.ndarray:
        arr = read(key)
        out = np.ascontiguousarray(arr.reshape(-1, *arr.shape[2:]), dtype=np.float32)
        if not np.isfinite(out).all():
            bad = np.argwhere(~np.isfinite(out))[0]
            raise WorkloadError(
                f"{key}: expected finite values (within float32 range), found "
                f"{arr.reshape(-1, *arr.shape[2:])[tuple(bad)]} at flattened head "
                f"{bad[0]}, token {bad[1]}"
            )
        return out

    fq, fk, fv = flat("q"), flat("k"), flat("v")
    indexer = None
    if has_index and not dsa:
        fiq, fik = flat("index_q"), flat("index_k")
    else:
        fiq, fik = derive_indexer(fq, fk, n_kv_heads=fk.shape[0])
    if dsa:

        def layer_major(key: str) -> np.ndarray:
            out = np.ascontiguousarray(read(key), dtype=np.float32)
            if not np.isfinite(out).all():
                raise WorkloadError(f"{key}: expected finite values (within float32 range)")
            return out

        scale_k = layer_major("key_scale") if "key_scale" in arrays else None
        indexer = Indexer(
            q=layer_major("index_q"),
            weights=layer_major("weights"),
            k=layer_major("index_k"),
            key_scale=scale_k,
            key_format="float32",
            of_kv_head=np.repeat(np.arange(len(chosen), dtype=np.int64), n_kv),
            description=o.dsa_description(),
        )
    kinds = tuple(f"L{int(layer_ids[li])}/H{int(kv_head_ids[li, h])}" for li in chosen for h in range(n_kv))
    return Workload(
        name=stem(o.name),
        q=fq,
        k=fk,
        v=fv,
        index_q=fiq,
        index_k=fik,
        head_kinds=kinds,
        query_positions=query_positions(tokens, queries, seed),
        scale=o.scale,
        source=o.source(chosen),
        indexer=indexer,
        n_layers=len(chosen),
    )


def open_workload(path: PathLike, *, queries: int = 64, seed: int = 0) -> "WorkloadDump":
    """A workload dump opened to be read one (layer, KV head) at a time.

    Every refusal of :func:`load_npz` that needs no value is made here, so a
    malformed dump fails before any head is read; reading nothing else.

    Parameters
    ----------
    path : str or os.PathLike
        The ``.npz`` file: a local path (memory-mapped) or an fsspec URL
        (read in byte ranges, :mod:`kvselect.checking.files`).
    queries, seed : int
        The query positions, as :func:`load_npz` draws them.

    Returns
    -------
    WorkloadDump
        Its heads, one :meth:`WorkloadDump.head` each.

    Raises
    ------
    FileNotFoundError
        No such local file.
    WorkloadError
        Not an ``.npz`` archive, a URL that cannot be read, or an array that
        breaks the format (as :func:`load_npz`).
    """
    return WorkloadDump(_open(path, lazy=True), queries, seed)


class WorkloadDump:
    """A workload dump read one KV head at a time: the unit of work of an
    evaluation over a corpus (:mod:`kvselect.corpus`).

    :meth:`head` reads, of one layer's KV head, its query heads *at the
    evaluated positions only*, its keys and values, and its indexer rows,
    and returns exactly what :meth:`Workload.head_inputs` returns for that
    head of ``load_npz(path)`` — bit for bit: the derived indexer is
    computed per row (:func:`derive_head`). Only those bytes are read
    (:meth:`bytes_per_head`). A value that is not finite is refused where it
    is read, naming its layer, head and token: a NaN at a position no
    evaluation reads is not seen (``load_npz`` reads every position and
    refuses it).

    Attributes
    ----------
    name, source : str
        As :func:`load_npz`'s workload has them.
    n_layers : int
        Layers of the dump.
    n_heads, n_kv_heads : int
        Query and KV heads over all layers (layers flattened into heads).
    tokens : int
        The context length.
    scale : float
        The softmax scale.
    query_positions : numpy.ndarray
        The evaluated positions (int64).
    indexer_description : str
        What the learned top-k ranks by.
    warning : str or None
        Why the dump is probably not what was meant (``load_npz``'s
        :class:`WorkloadWarning`), or None.
    """

    def __init__(self, opened: "_Opened", queries: int, seed: int) -> None:
        o = self._o = opened
        self.name = stem(o.name)
        self.source = o.source(range(o.n_layers))
        self.n_layers = o.n_layers
        self.n_heads = o.n_layers * o.n_heads
        self.n_kv_heads = o.n_layers * o.n_kv
        self.tokens = o.tokens
        self.scale = o.scale
        self.query_positions = query_positions(o.tokens, queries, seed)
        self.indexer_description = o.dsa_description() if o.dsa else ONE_HEAD_INDEXER
        self.warning = o.warning

    def units(self) -> List[Tuple[int, int]]:
        """Every ``(layer, kv_head)``, layer-major: the order heads are pooled in."""
        return [(layer, h) for layer in range(self._o.n_layers) for h in range(self._o.n_kv)]

    def bytes_per_head(self) -> int:
        """The bytes :meth:`head` reads from the file for one head."""
        o, a, n = self._o, self._o.arrays, len(self.query_positions)
        g = o.n_heads // o.n_kv

        def row(key: str) -> int:  # the bytes of one token of one head of key
            arr = a[key]
            token_axis = 1 if o.dsa and key not in ("q", "k", "v") else 2
            return int(np.prod(arr.shape[token_axis + 1 :], dtype=np.int64)) * arr.dtype.itemsize

        total = g * n * row("q") + o.tokens * (row("k") + row("v"))
        if o.has_index:
            total += n * (row("index_q") + (row("weights") if o.dsa else 0)) + o.tokens * (
                row("index_k") + (row("key_scale") if "key_scale" in a else 0)
            )
        return total

    def head_queries(self, layer: int, kv_head: int, pos: np.ndarray) -> np.ndarray:
        """KV head ``kv_head`` of layer ``layer``'s query heads at ``pos``,
        ``[n, group, d]`` float32: what the boundary experiment's eviction
        policies observe (only those rows are read).

        Parameters
        ----------
        layer, kv_head : int
            As :meth:`head` takes them.
        pos : ndarray of int, [n]
            The positions.

        Returns
        -------
        numpy.ndarray
            ``[n, group, d]``, C-contiguous.

        Raises
        ------
        IndexError
            A layer or head out of range.
        WorkloadError
            A value read is not finite (within float32 range).
        """
        o, a = self._o, self._o.arrays
        if not (0 <= layer < o.n_layers and 0 <= kv_head < o.n_kv):
            raise IndexError(f"head ({layer}, {kv_head}) is not in {o.n_layers} layers of {o.n_kv} KV heads")
        from kvselect.checking import decode32

        pos = np.asarray(pos, dtype=np.int64)
        g = o.n_heads // o.n_kv
        heads = []
        for j in range(g):
            x = np.ascontiguousarray(decode32(take_rows(a["q"], (layer, kv_head * g + j), pos), o.formats.get("q")))
            x = x.astype(np.float32, copy=False)
            if not np.isfinite(x).all():
                bad = int(pos[np.argwhere(~np.isfinite(x.reshape(len(x), -1)))[0][0]])
                raise WorkloadError(
                    f"q: expected finite values (within float32 range), found a non-finite one at layer "
                    f"{int(o.layer_ids[layer])}, query head {kv_head * g + j}, token {bad}"
                )
            heads.append(x)
        if not heads or len(pos) == 0:
            return np.zeros((len(pos), g, o.d), dtype=np.float32)
        return np.ascontiguousarray(np.stack(heads).transpose(1, 0, 2))

    def head(self, layer: int, kv_head: int) -> HeadInputs:
        """KV head ``kv_head`` of layer ``layer`` at :attr:`query_positions`.

        Parameters
        ----------
        layer, kv_head : int
            Indices into the dump's layers and its layer's KV heads.

        Returns
        -------
        HeadInputs
            Bit for bit ``load_npz(path).head_inputs(layer * n_kv + kv_head,
            pos)``.

        Raises
        ------
        IndexError
            A layer or head out of range.
        WorkloadError
            A value read is not finite (within float32 range).
        """
        o, a, pos = self._o, self._o.arrays, self.query_positions
        if not (0 <= layer < o.n_layers and 0 <= kv_head < o.n_kv):
            raise IndexError(f"head ({layer}, {kv_head}) is not in {o.n_layers} layers of {o.n_kv} KV heads")
        from kvselect.checking import decode32

        def checked(key: str, x: Any, where: str, tokens: np.ndarray) -> np.ndarray:
            out = np.ascontiguousarray(decode32(x, o.formats.get(key)), dtype=np.float32)
            if not np.isfinite(out).all():
                bad = np.argwhere(~np.isfinite(out.reshape(len(out), -1)))[0]
                raise WorkloadError(
                    f"{key}: expected finite values (within float32 range), found "
                    f"{out.reshape(len(out), -1)[tuple(bad)]} at layer {int(o.layer_ids[layer])}"
                    f"{where}, token {int(tokens[bad[0]])}"
                )
            return out

        every = np.arange(o.tokens)

        def rows(key: str, lead: Tuple[int, ...], where: str = "") -> np.ndarray:
            return checked(key, take_rows(a[key], lead, pos), where, pos)

        def whole(key: str, lead: Tuple[int, ...], where: str = "") -> np.ndarray:
            return checked(key, np.asarray(a[key][lead]), where, every)

        g = o.n_heads // o.n_kv
        at = f", KV head {int(o.kv_head_ids[layer, kv_head])}"
        q = np.stack([rows("q", (layer, kv_head * g + j), f", query head {kv_head * g + j}") for j in range(g)])
        k, v = whole("k", (layer, kv_head), at), whole("v", (layer, kv_head), at)
        if o.has_index and not o.dsa:
            iq, ik = rows("index_q", (layer, kv_head), at), whole("index_k", (layer, kv_head), at)
        else:
            iq, ik = derive_head(q, k)
        if o.dsa:
            learned = {
                "index_q": rows("index_q", (layer,)),
                "weights": rows("weights", (layer,)),
                "index_k": whole("index_k", (layer,)),
                "key_scale": whole("key_scale", (layer,)) if "key_scale" in a else None,
                "key_format": "float32",
            }
        else:
            learned = one_head_inputs(iq, ik)
        return HeadInputs(
            q=np.ascontiguousarray(q.transpose(1, 0, 2)), k=k, v=v, index_q=iq, index_k=ik, learned=learned
        )


@dataclass
class _Opened:
    name: str
    arrays: Dict[str, Any]
    formats: Dict[str, str]
    n_layers: int
    n_heads: int
    n_kv: int
    tokens: int
    d: int
    scale: float
    layer_ids: np.ndarray
    kv_head_ids: np.ndarray
    has_index: bool
    dsa: bool
    warning: Optional[str]

    def source(self, chosen: Sequence[int]) -> str:
        q = self.arrays["q"]
        note = (
            "dumped DSA indexer (blocks: derived indexer)"
            if self.dsa
            else "dumped indexer"
            if self.has_index
            else "derived indexer (derive_indexer)"
        )
        return (
            f"{basename(self.name)}: layers {[int(self.layer_ids[li]) for li in chosen]}, "
            f"{self.n_heads} query / {self.n_kv} KV heads each, {self.tokens} tokens, "
            f"{self.formats.get('q', q.dtype)}; {note}"
        )

    def dsa_description(self) -> str:
        iq = self.arrays["index_q"]
        return (
            f"dumped DSA indexer: {iq.shape[2]} index heads of dim {iq.shape[3]}, one per "
            f"layer, shared by its {self.n_kv} KV heads"
        )


def _open(path: PathLike, lazy: bool) -> "_Opened":
    """The dump's arrays (unread: memory-mapped, or byte ranges behind a URL)
    and every refusal of :func:`load_npz` that needs no array's values."""
    name = os.fspath(path)
    if not is_url(name) and not os.path.isfile(name):
        raise FileNotFoundError(f"no such workload file: {name!r}")
    arrays, formats = _read_npz(name, lazy)

    q, k, v = arrays["q"], arrays["k"], arrays["v"]
    n_layers, n_heads, tokens, d = q.shape
    n_kv = k.shape[1]
    hint = _transposed_hint(q.shape)
    if k.shape[0] != n_layers or v.shape[0] != n_layers:
        bad = "k" if k.shape[0] != n_layers else "v"
        raise WorkloadError(
            f"{bad}: expected {n_layers} layers (axis 0, as in q {q.shape}), "
            f"got {arrays[bad].shape}: {bad} has {arrays[bad].shape[0]} layers where q has "
            f"{n_layers}"
        )
    if k.shape[2:] != (tokens, d):
        what = (
            f"k has {k.shape[2]} tokens where q has {tokens}"
            if k.shape[2] != tokens
            else f"k's head dim is {k.shape[3]} where q's is {d}"
        )
        raise WorkloadError(
            f"k: expected shape [{n_layers}, n_kv_heads, {tokens}, {d}] (tokens and d as in "
            f"q {q.shape}), got {k.shape}: {what}" + hint
        )
    if v.shape[1:3] != (n_kv, tokens):
        what = (
            f"v has {v.shape[1]} KV heads where k has {n_kv}"
            if v.shape[1] != n_kv
            else f"v has {v.shape[2]} tokens where q and k have {tokens}"
        )
        raise WorkloadError(
            f"v: expected shape [{n_layers}, {n_kv}, {tokens}, d_v] (heads as in k, tokens "
            f"as in q), got {v.shape}: {what}" + hint
        )
    for key, arr in (("q", q), ("k", k), ("v", v)):
        if 0 in arr.shape:
            raise WorkloadError(f"{key}: expected no empty axis, got shape {arr.shape} ({_describe(key, arr.shape)})")
    if tokens < 2:
        raise WorkloadError(f"q: expected at least 2 tokens (axis 2), got {tokens} ({_describe('q', q.shape)})" + hint)
    if n_heads % n_kv:
        raise WorkloadError(
            f"q: n_heads = {n_heads} (axis 1) is not a multiple of n_kv_heads = {n_kv} "
            f"(axis 1 of k): {n_heads} query heads cannot share {n_kv} KV heads evenly "
            f"(grouped-query attention)" + hint
        )
    has_index = "index_q" in arrays
    dsa = "weights" in arrays
    if dsa:
        iq, iw, ik = arrays["index_q"], arrays["weights"], arrays["index_k"]
        heads = iq.shape[2]
        if iq.shape[:2] != (n_layers, tokens) or 0 in iq.shape:
            raise WorkloadError(
                f"index_q: expected shape [{n_layers}, {tokens}, H, d_idx] (the DSA form: "
                f"layers, tokens, index heads, dim), got {iq.shape}"
            )
        if iw.shape != (n_layers, tokens, heads):
            raise WorkloadError(
                f"weights: expected shape [{n_layers}, {tokens}, {heads}] (one weight "
                f"per token and index head of index_q), got {iw.shape}"
            )
        if ik.shape != (n_layers, tokens, iq.shape[3]):
            raise WorkloadError(
                f"index_k: expected shape [{n_layers}, {tokens}, {iq.shape[3]}] (the DSA "
                f"form: one key per token, shared by the index heads), got {ik.shape}"
            )
        if "key_scale" in arrays and arrays["key_scale"].shape != (n_layers, tokens):
            raise WorkloadError(f"key_scale: expected shape [{n_layers}, {tokens}], got {arrays['key_scale'].shape}")
    elif has_index:
        iq, ik = arrays["index_q"], arrays["index_k"]
        if iq.shape[:3] != (n_layers, n_kv, tokens) or iq.shape[3] == 0:
            raise WorkloadError(
                f"index_q: expected shape [{n_layers}, {n_kv}, {tokens}, d_idx] (one index "
                f"head per KV head), got {iq.shape} ({_describe('index_q', iq.shape)}; "
                f"q and k have {n_layers} layers, {n_kv} KV heads, {tokens} tokens)"
            )
        if ik.shape != iq.shape:
            raise WorkloadError(
                f"index_k: expected shape {iq.shape} to match index_q, got {ik.shape} "
                f"({_describe('index_k', ik.shape)})"
            )
    warning = None
    if hint:
        warning = (
            f"{basename(name)}: q reads as {n_heads} query heads (axis 1) of {tokens} tokens "
            f"(axis 2), fewer tokens than heads: probably saved as [layers, tokens, heads, "
            f"dim]; the format is [layers, heads, tokens, dim] (x.transpose(0, 2, 1, 3), "
            f"or x.permute(0, 2, 1, 3) in torch)"
        )

    scale = 1.0 / math.sqrt(d)
    if "scale" in arrays:
        s = arrays["scale"]
        value = float(s.reshape(-1)[0]) if s.size == 1 else float("nan")
        if not (math.isfinite(value) and value > 0):
            raise WorkloadError(
                f"scale: expected one finite positive number, got {s.reshape(-1)[:4]} (shape {s.shape})"
            )
        scale = value
    layer_ids = np.arange(n_layers)
    if "layer_ids" in arrays:
        layer_ids = arrays["layer_ids"]
        if layer_ids.shape != (n_layers,):
            raise WorkloadError(f"layer_ids: expected shape ({n_layers},), got {layer_ids.shape}")
    kv_head_ids = np.broadcast_to(np.arange(n_kv), (n_layers, n_kv))
    if "kv_head_ids" in arrays:
        kv_head_ids = arrays["kv_head_ids"]
        if kv_head_ids.shape != (n_layers, n_kv):
            raise WorkloadError(f"kv_head_ids: expected shape ({n_layers}, {n_kv}), got {kv_head_ids.shape}")

    return _Opened(
        name,
        arrays,
        formats,
        n_layers,
        n_heads,
        n_kv,
        tokens,
        d,
        scale,
        layer_ids,
        kv_head_ids,
        has_index,
        dsa,
        warning,
    )


def _describe(key: str, shape: Tuple[int, ...]) -> str:
    """A 4-D dump array's shape in words: layers, heads, tokens, dims."""
    heads = "query heads" if key == "q" else ("index heads" if key.startswith("index") else "KV heads")
    if len(shape) != 4:
        return f"{len(shape)} dimensions"
    layers, h, t, dim = shape
    return f"{layers} layers x {h} {heads} x {t} tokens x dim {dim}"


def _transposed_hint(q_shape: Tuple[int, ...]) -> str:
    """A suffix for shape errors when ``q`` has fewer tokens than heads (a
    dump probably saved as ``[layers, tokens, heads, d]``); '' otherwise."""
    _, heads, tokens, _ = q_shape
    if tokens >= heads:
        return ""
    return (
        f"; q reads as {heads} query heads of {tokens} tokens: were the arrays saved as "
        f"[layers, tokens, heads, dim]? The format is [layers, heads, tokens, dim] "
        f"(x.transpose(0, 2, 1, 3))"
    )


def _read_npz(path: str, lazy: bool) -> Tuple[Dict[str, Any], Dict[str, str]]:
    """The dump's arrays (memory-mapped, in their file dtype) and formats, read
    by the one dump loader (:func:`kvselect.checking.load_dump`: its shared
    refusals and the workload table), then the workload's own rules."""
    from kvselect.checking import DumpError, read_archive, validate

    try:
        dump = validate(read_archive(path, lazy=lazy), source=path, expect=("workload",))
    except DumpError as e:
        raise WorkloadError(str(e)) from None
    keys = set(dump)
    if ("index_q" in keys) != ("index_k" in keys):
        have, lack = ("index_q", "index_k") if "index_q" in keys else ("index_k", "index_q")
        raise WorkloadError(
            f"{lack}: missing; {have} is present, and the indexer needs both (or neither, to derive one)"
        )
    dsa = "weights" in keys
    if dsa and "index_q" not in keys:
        raise WorkloadError("weights: the DSA form's head weights need index_q and index_k")
    if "key_scale" in keys and not dsa:
        raise WorkloadError("key_scale: only the DSA form (with weights) has per-key scales")
    # The DSA form: one shared index key per position, so fewer axes.
    dsa_dims = {
        "index_k": (3, "[layers, tokens, d_idx]"),
        "weights": (3, "[layers, tokens, H]"),
        "key_scale": (2, "[layers, tokens]"),
    }
    for key in sorted(keys):
        arr = dump[key]
        if key in ("kind", "scale", "layer_ids", "kv_head_ids"):
            continue
        if dsa and key in dsa_dims:
            ndim, what = dsa_dims[key]
            if arr.ndim != ndim:
                raise WorkloadError(
                    f"{key}: expected {ndim} dimensions {what} (the DSA form: "
                    f"weights is present), got shape {arr.shape}"
                )
        elif arr.ndim != 4:
            dims = "d_idx" if key.startswith("index") else ("d_v" if key == "v" else "d")
            heads = "n_heads" if key == "q" else "n_kv_heads"
            words = "query heads" if key == "q" else "KV heads"
            one = "; a single layer still needs its axis: x[None]" if arr.ndim == 3 else ""
            raise WorkloadError(
                f"{key}: expected 4 dimensions [layers, {heads}, tokens, {dims}] "
                f"(layers, {words}, tokens, head dim), got shape {arr.shape}" + one
            )
    arrays = dict(dump)
    arrays.pop("kind", None)
    return arrays, dict(dump.formats)


def _choose_layers(layers: Union[None, int, Sequence[int]], n_layers: int) -> List[int]:
    if layers is None:
        return list(range(n_layers))
    if isinstance(layers, (int, np.integer)) and not isinstance(layers, bool):
        layers = [int(layers)]
    try:
        chosen = list(layers)  # type: ignore[arg-type]
    except TypeError:
        raise WorkloadError(
            f"layers: expected None, an int or a sequence of ints, got {type(layers).__name__}"
        ) from None
    if not chosen:
        raise WorkloadError("layers: expected at least one layer, got none")
    for layer in chosen:
        if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)):
            raise WorkloadError(f"layers: expected ints, got {layer!r}")
        if not 0 <= layer < n_layers:
            raise WorkloadError(f"layers: layer {layer} is out of range [0, {n_layers})")
    if len(set(int(x) for x in chosen)) != len(chosen):
        raise WorkloadError(f"layers: expected distinct layers, got {chosen}")
    return [int(x) for x in chosen]
