"""Dump Q/K/V from your own Hugging Face model into the workload format.

Usage::

    python -m kvselect.dump_hf MODEL_DIR TEXT_FILE OUT.npz [--max-tokens N]
        [--layers 0 5 11] [--dtype float16|float32] [--no-rotary]

It runs the model once on the first ``--max-tokens`` tokens of ``TEXT_FILE``
and writes ``q`` ``[layers, n_heads, tokens, d]``, ``k``/``v``
``[layers, n_kv_heads, tokens, d]``, ``layer_ids`` and (when the attention
module says) ``scale``: the format :func:`kvselect.workloads.load_npz` reads.
It needs ``torch`` and ``transformers`` (imported only when the command runs;
the core below does not import them).

How Q/K/V are captured (forward hooks, one forward pass, batch 1):

- Attention projections are found by name, per layer, in
  ``model.named_modules()``: ``q_proj``/``k_proj``/``v_proj`` (Llama, Mistral,
  Qwen, Gemma, …; grouped-query attention via ``num_key_value_heads``),
  ``query``/``key``/``value`` (BERT-like) or ``q_lin``/``k_lin``/``v_lin``
  (DistilBERT), siblings under one parent. Fused projections (``qkv_proj``,
  ``c_attn``, ``query_key_value``) and MLA are not supported: the error names
  the modules looked for.
- Where the attention has ``q_norm``/``k_norm`` (Qwen3, OLMo-2, Gemma-3) their
  outputs are taken instead of the raw projections, since that is what the
  scores use.
- Rotary embeddings: if the model has a ``rotary_emb`` module (per attention,
  or one for the whole model), its ``(cos, sin)`` output is captured and
  applied to q and k with the Hugging Face ``rotate_half`` convention
  (``x * cos + rotate_half(x) * sin`` on the first ``cos.shape[-1]`` dims), so
  ``q·k * scale`` is the model's logit. Several model-level rotary modules
  (e.g. Gemma-3's local/global pair) are refused: pass ``rotary=False``
  (``--no-rotary``) to dump pre-rotary projections knowingly.
- ``scale`` is the attention module's ``scaling`` attribute when it has one
  (most decoder models), otherwise left out (the loader uses ``1/sqrt(d)``).

Not captured: attention masks (sliding windows, padding), ALiBi biases, soft
caps; the evaluation applies a plain causal mask.

A model with a lightning indexer (DeepSeek-V3.2/V4, GLM-5: "DSA") is MLA and
not captured by the hooks above, but its indexer can be added to a dump by
hand in the DSA form :func:`kvselect.workloads.load_npz` reads. For
DeepSeek-V3.2 (``Indexer`` in the reference ``inference/model.py``; vLLM's
``Indexer`` in ``vllm/model_executor/models/deepseek_v2.py``), per layer and
token, after the indexer's rotary embedding (and its Hadamard rotation, which
does not change ``q · k``):

- ``index_q`` ``[layers, tokens, H, d_idx]``: the indexer's query heads
  (``H = 64``, ``d_idx = 128``; GLM-5 has ``H = 32``), from ``wq_b`` of the
  low-rank query;
- ``weights`` ``[layers, tokens, H]``: ``weights_proj(x)`` times
  ``H^-1/2 · d_idx^-1/2`` (and the query's fp8 scale, if you dump the
  quantised query), exactly the factor the model multiplies each head's
  ``relu(q · k)`` by;
- ``index_k`` ``[layers, tokens, d_idx]``: the indexer's key (``wk`` then its
  norm and rotary), one per token, shared by the heads; with the fp8 cache,
  its dequantised values ``k8 · scale`` or the fp8 values with
  ``key_scale`` ``[layers, tokens]`` beside them (the fp8 bytes as raw
  ``uint8`` with ``index_k_format = "float8_e4m3fn"``).

The names are :func:`kvselect.indexer_topk`'s, and the file is the one dump
format (``docs/dump-format.md``, the kind ``"workload"``). ``save`` stores
those keys like the others (``weights`` and ``key_scale`` are kept float32,
being scales), uncompressed, so a reader memory-maps one layer at a time.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

__all__ = ["PROJECTION_NAMES", "DumpError", "dump_qkv", "find_attention", "main", "save"]

#: Sibling module names tried, in order, for the query/key/value projections.
PROJECTION_NAMES: Tuple[Tuple[str, str, str], ...] = (
    ("q_proj", "k_proj", "v_proj"),
    ("query", "key", "value"),
    ("q_lin", "k_lin", "v_lin"),
)
_NORM_NAMES = ("q_norm", "k_norm")
_ROTARY_NAME = "rotary_emb"


class DumpError(ValueError):
    """The model (or its outputs) does not fit what the dumper understands.

    A :class:`ValueError`, raised by :func:`find_attention`, :func:`dump_qkv`
    and :func:`save`; the message names what did not fit.
    """


@dataclass(frozen=True)
class AttentionModules:
    """The modules of one attention layer that the dump hooks."""

    prefix: str  # the parent's name, "" for the root
    q: Any
    k: Any
    v: Any
    q_norm: Any = None
    k_norm: Any = None
    rotary: Any = None
    parent: Any = None


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def find_attention(model: Any) -> List[AttentionModules]:
    """The model's attention layers, in ``named_modules()`` order.

    Parameters
    ----------
    model : object
        Anything with ``named_modules()`` (a torch module).

    Returns
    -------
    list of AttentionModules
        One per attention layer found.

    Raises
    ------
    DumpError
        None found; the message lists the names looked for.
    """
    modules: Dict[str, Any] = dict(model.named_modules())
    found: List[AttentionModules] = []
    for name in modules:
        prefix, _, leaf = name.rpartition(".")
        for qn, kn, vn in PROJECTION_NAMES:
            if leaf != qn:
                continue
            kname, vname = _join(prefix, kn), _join(prefix, vn)
            if kname not in modules or vname not in modules:
                continue
            qnorm, knorm = (modules.get(_join(prefix, n)) for n in _NORM_NAMES)
            both = qnorm is not None and knorm is not None
            found.append(
                AttentionModules(
                    prefix=prefix,
                    q=modules[name],
                    k=modules[kname],
                    v=modules[vname],
                    q_norm=qnorm if both else None,
                    k_norm=knorm if both else None,
                    rotary=modules.get(_join(prefix, _ROTARY_NAME)),
                    parent=modules.get(prefix),
                )
            )
            break
    if not found:
        looked = ", ".join("/".join(t) for t in PROJECTION_NAMES)
        raise DumpError(
            f"no attention projections found: looked for sibling modules named {looked} "
            "(fused projections such as qkv_proj, c_attn or query_key_value, and MLA, are "
            "not supported; dump q/k/v yourself in the documented .npz format)"
        )
    return found


def _model_rotary(model: Any, layers: List[AttentionModules]) -> List[Tuple[str, Any]]:
    """Rotary modules not owned by an attention layer."""
    owned = {id(a.rotary) for a in layers if a.rotary is not None}
    return [
        (name, mod)
        for name, mod in model.named_modules()
        if name.rpartition(".")[2] == _ROTARY_NAME and id(mod) not in owned
    ]


def _to_numpy(x: Any) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x.astype(np.float32, copy=False)
    return np.asarray(x.detach().cpu().float().numpy(), dtype=np.float32)


def _output_tensor(output: Any) -> Any:
    # Some projections return tuples (e.g. (out, bias)); the first item is the output.
    return output[0] if isinstance(output, (tuple, list)) else output


def _heads(x: np.ndarray, tokens: int, heads: int, what: str) -> np.ndarray:
    """[1, T, H*D] or [1, T, H, D] -> [H, T, D]."""
    if x.ndim < 2 or x.shape[0] != 1 or x.shape[1] != tokens:
        raise DumpError(
            f"{what}: expected an output [1, {tokens}, ...] (batch 1, one row per token), got shape {x.shape}"
        )
    flat = x.reshape(tokens, -1)
    if flat.shape[1] % heads:
        raise DumpError(f"{what}: output width {flat.shape[1]} is not a multiple of {heads} heads")
    return np.ascontiguousarray(flat.reshape(tokens, heads, -1).transpose(1, 0, 2))


def _apply_rotary(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Hugging Face convention on [H, T, D]: x*cos + rotate_half(x)*sin on the
    first ``rot = cos.shape[-1]`` dims (the rest pass through)."""
    rot = cos.shape[-1]
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    half = rot // 2
    rotated = np.concatenate([-x_rot[..., half:], x_rot[..., :half]], axis=-1)
    out = x_rot * cos[None] + rotated * sin[None]
    return np.ascontiguousarray(np.concatenate([out, x_pass], axis=-1), dtype=np.float32)


def _cos_sin(output: Any, tokens: int, head_dim: int, what: str) -> Tuple[np.ndarray, np.ndarray]:
    if not isinstance(output, (tuple, list)) or len(output) != 2:
        raise DumpError(f"{what}: expected a (cos, sin) output from the rotary module")
    cos, sin = (_to_numpy(t) for t in output)
    while cos.ndim > 2 and cos.shape[0] == 1:
        cos, sin = cos[0], sin[0]
    if cos.ndim != 2 or cos.shape != sin.shape:
        raise DumpError(f"{what}: expected cos/sin of shape [tokens, rot], got {cos.shape}")
    cos, sin = cos[-tokens:], sin[-tokens:]  # a cached table longer than the input
    rot = cos.shape[1]
    if cos.shape[0] != tokens or rot % 2 or rot > head_dim:
        raise DumpError(f"{what}: cos/sin shape {cos.shape} does not fit {tokens} tokens and head_dim {head_dim}")
    return cos, sin


def dump_qkv(
    model: Any,
    input_ids: Any,
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    layers: Optional[Sequence[int]] = None,
    rotary: Optional[bool] = None,
) -> Dict[str, np.ndarray]:
    """Run ``model(input_ids)`` once and return the workload arrays.

    The model needs only ``named_modules()``, modules with
    ``register_forward_hook(hook) -> handle`` (``handle.remove()``), and
    outputs with ``.detach().cpu().float().numpy()`` (torch tensors) or NumPy
    arrays; nothing here imports torch. Call it under ``torch.no_grad()``.

    Parameters
    ----------
    model : object
        The model (for Hugging Face, the base model or a ``*ForCausalLM``).
    input_ids : object
        ``[1, tokens]`` token ids, what ``model(input_ids)`` accepts.
    num_heads, num_kv_heads, head_dim : int
        From the model config (``num_attention_heads``,
        ``num_key_value_heads``, ``head_dim``).
    layers : sequence of int, optional
        Indices among the attention layers found (in module order); ``None``
        for all.
    rotary : bool or None
        ``None`` to apply a rotary embedding when the model has one, ``True``
        to require one, ``False`` to dump pre-rotary projections.

    Returns
    -------
    dict of str to numpy.ndarray
        ``{"q": [L, num_heads, T, head_dim], "k": [L, num_kv_heads, T,
        head_dim], "v": [L, num_kv_heads, T, d_v], "layer_ids": [L]}``
        (float32 / int64), plus ``"scale"`` (a 0-d float64) when the
        attention modules carry a ``scaling`` attribute.

    Raises
    ------
    DumpError
        Projections not found, a layer index out of range, heads that do
        not divide, outputs of an unexpected shape, or an ambiguous rotary
        embedding.
    """
    sizes = (("num_heads", num_heads), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim))
    for what, n in sizes:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise DumpError(f"{what}: expected a positive int, got {n!r}")
    if num_heads % num_kv_heads:
        raise DumpError(f"num_heads = {num_heads} is not a multiple of num_kv_heads = {num_kv_heads}")
    shape = tuple(getattr(input_ids, "shape", ()))
    if len(shape) != 2 or shape[0] != 1 or shape[1] < 2:
        raise DumpError(f"input_ids: expected shape [1, tokens >= 2], got {shape}")
    tokens = int(shape[1])

    found = find_attention(model)
    if layers is None:
        chosen = list(range(len(found)))
    else:
        chosen = [int(i) for i in layers]
        bad = [i for i in chosen if not 0 <= i < len(found)]
        if bad or not chosen or len(set(chosen)) != len(chosen):
            raise DumpError(
                f"layers: expected distinct indices in [0, {len(found)}) (the attention "
                f"layers found), got {list(layers)}"
            )
    per_layer_rotary = all(found[i].rotary is not None for i in chosen)
    model_rotary = [] if per_layer_rotary else _model_rotary(model, found)
    if rotary is None:
        rotary = per_layer_rotary or bool(model_rotary)
    if rotary and not per_layer_rotary:
        if len(model_rotary) != 1:
            names = [n for n, _ in model_rotary]
            raise DumpError(
                f"rotary: expected one model-level '{_ROTARY_NAME}' module, found "
                f"{names or 'none'}; pass rotary=False (--no-rotary) to dump pre-rotary "
                "projections"
            )

    captured: Dict[Tuple[int, str], List[Any]] = {}
    handles: List[Any] = []

    def hook(key: Tuple[int, str]) -> Callable[..., None]:
        def record(module: Any, inputs: Any, output: Any) -> None:
            captured.setdefault(key, []).append(output)

        return record

    try:
        for i in chosen:
            a = found[i]
            mods = {
                "q": a.q_norm if a.q_norm is not None else a.q,
                "k": a.k_norm if a.k_norm is not None else a.k,
                "v": a.v,
            }
            if rotary and per_layer_rotary:
                mods["rot"] = a.rotary
            for what, mod in mods.items():
                handles.append(mod.register_forward_hook(hook((i, what))))
        if rotary and not per_layer_rotary:
            handles.append(model_rotary[0][1].register_forward_hook(hook((-1, "rot"))))
        model(input_ids)
    finally:
        for h in handles:
            h.remove()

    qs, ks, vs = [], [], []
    for i in chosen:
        name = found[i].prefix or "<root>"
        outs = {}
        for what in ("q", "k", "v"):
            calls = captured.get((i, what), [])
            if len(calls) != 1:
                raise DumpError(
                    f"{name}: the {what} projection ran {len(calls)} times in one forward "
                    "pass (expected once; shared or skipped layers are not supported)"
                )
            outs[what] = _to_numpy(_output_tensor(calls[0]))
        q = _heads(outs["q"], tokens, num_heads, f"{name} q")
        k = _heads(outs["k"], tokens, num_kv_heads, f"{name} k")
        v = _heads(outs["v"], tokens, num_kv_heads, f"{name} v")
        if q.shape[2] != head_dim or k.shape[2] != head_dim:
            raise DumpError(
                f"{name}: expected head_dim {head_dim}, got q {q.shape[2]} and k {k.shape[2]} "
                f"(check num_heads / num_kv_heads / head_dim against the config)"
            )
        if rotary:
            key = (i, "rot") if per_layer_rotary else (-1, "rot")
            calls = captured.get(key, [])
            if not calls:
                raise DumpError(f"{name}: the rotary module did not run")
            cos, sin = _cos_sin(calls[0], tokens, head_dim, f"{name} rotary")
            q, k = _apply_rotary(q, cos, sin), _apply_rotary(k, cos, sin)
        qs.append(q)
        ks.append(k)
        vs.append(v)

    out: Dict[str, np.ndarray] = {
        "q": np.stack(qs),
        "k": np.stack(ks),
        "v": np.stack(vs),
        "layer_ids": np.asarray(chosen, dtype=np.int64),
    }
    scalings = [getattr(found[i].parent, "scaling", None) for i in chosen]
    numbers = [float(s) for s in scalings if isinstance(s, (int, float)) and not isinstance(s, bool)]
    if len(numbers) == len(chosen) and len(set(numbers)) == 1:
        out["scale"] = np.asarray(numbers[0], dtype=np.float64)
    return out


def save(
    path: Union[str, "Path"],
    arrays: Dict[str, np.ndarray],
    *,
    dtype: Union[str, np.dtype] = "float16",
) -> Path:
    """Write ``arrays`` (from :func:`dump_qkv`) as a workload dump.

    The dump is :func:`kvselect.checking.save_dump`'s with kind
    ``"workload"``: uncompressed, so a reader memory-maps each layer; a key
    outside the workload table is refused, naming the closest known one.

    Float arrays are stored as ``dtype`` (float16 by default: half the size,
    and ample for ranking keys; ``"bfloat16"`` stores raw bits with an
    ``X_format``); integer and scalar entries are kept. If a
    value does not fit float16 (|x| > 65504) the save is refused with a hint
    to use float32 rather than writing infinities.

    Parameters
    ----------
    path : str or pathlib.Path
        Where to write; ``.npz`` is added when missing.
    arrays : dict of str to numpy.ndarray
        What :func:`dump_qkv` returned.
    dtype : str or numpy.dtype
        ``"float16"`` (default), ``"bfloat16"``, ``"float32"`` or
        ``"float64"``.

    Returns
    -------
    pathlib.Path
        The path written (NumPy adds ``.npz`` when missing).

    Raises
    ------
    DumpError
        Another ``dtype``, a value that does not fit it, or a key or array
        the workload format refuses.
    OSError
        The file cannot be written.
    """
    from kvselect.checking import DumpError as FormatError
    from kvselect.checking import save_dump

    bf16 = str(dtype) == "bfloat16"
    dtype = np.dtype(np.float32 if bf16 else dtype)
    if dtype not in (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)):
        raise DumpError(f"dtype: expected float16, bfloat16, float32 or float64, got {dtype}")
    out: Dict[str, np.ndarray] = {}
    for key, arr in arrays.items():
        arr = np.asarray(arr)
        if key in ("q", "k", "v", "index_q", "index_k"):  # weights and scales stay float32
            with np.errstate(over="ignore"):  # overflow -> inf, refused below
                cast = arr.astype(dtype)
            if not np.isfinite(cast).all():
                raise DumpError(
                    f"{key}: values do not fit {dtype} (max |x| = {np.abs(arr).max():.4g}); "
                    "save with dtype='float32' (--dtype float32)"
                )
            arr = cast
            if bf16:  # round to nearest even, kept as raw bits
                bits = np.ascontiguousarray(arr, dtype=np.float32).view(np.uint32)
                rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
                if not np.isfinite(arr).all() or np.any((rounded & 0x7F80) == 0x7F80):
                    raise DumpError(f"{key}: values do not fit bfloat16; save with dtype='float32'")
                arr = rounded.astype(np.uint16)
                out[f"{key}_format"] = np.asarray("bfloat16")
        out[key] = arr
    path = Path(path)
    if path.suffix != ".npz":
        path = path.with_name(path.name + ".npz")
    path.parent.mkdir(parents=True, exist_ok=True)
    formats = {k: v for k, v in out.items() if k.endswith("_format")}
    try:
        save_dump(path, "workload", **{k: v for k, v in out.items() if k not in formats}, **formats)
    except FormatError as e:
        raise DumpError(str(e)) from None
    return path


# --------------------------------------------------------------------------
# Command line (the only place torch / transformers are imported)
# --------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m kvselect.dump_hf",
        description="Dump Q/K/V of a Hugging Face model on a text into kvselect's .npz "
        "workload format (needs torch and transformers).",
    )
    p.add_argument("model_dir", help="a local model directory (or hub id if you are online)")
    p.add_argument("text_file", help="a UTF-8 text file; its first --max-tokens tokens are used")
    p.add_argument("out", help="the .npz to write")
    p.add_argument("--max-tokens", type=int, default=4096, help="tokens to keep (default 4096)")
    p.add_argument(
        "--layers",
        type=int,
        nargs="+",
        default=None,
        help="attention layer indices to dump (default: all)",
    )
    p.add_argument("--dtype", choices=("float16", "bfloat16", "float32"), default="float16")
    p.add_argument(
        "--no-rotary",
        action="store_true",
        help="do not apply the model's rotary embedding (dump raw projections)",
    )
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command ``python -m kvselect.dump_hf`` (see its ``--help``).

    Loads the model (torch and transformers, imported here only), dumps
    Q/K/V on the text's first ``--max-tokens`` tokens with :func:`dump_qkv`
    and writes them with :func:`save`.

    Parameters
    ----------
    argv : sequence of str, optional
        The arguments (``None``: ``sys.argv[1:]``).

    Returns
    -------
    int
        0 on success; 2 when ``--max-tokens`` is below 2 or torch or
        transformers is missing (the error is printed to stderr).

    Raises
    ------
    SystemExit
        Bad arguments, or ``--help`` (argparse).
    DumpError
        As :func:`dump_qkv` and :func:`save` raise it.
    OSError
        The text file cannot be read or the dump cannot be written.
    """
    args = _parser().parse_args(argv)
    if args.max_tokens < 2:
        print("error: --max-tokens must be at least 2", file=sys.stderr)
        return 2
    try:
        import torch
        from transformers import AutoConfig, AutoModel, AutoTokenizer
    except ImportError as exc:
        print(
            f"error: kvselect.dump_hf needs torch and transformers ({exc}); "
            "install them (e.g. pip install torch transformers)",
            file=sys.stderr,
        )
        return 2
    text = Path(args.text_file).read_text(encoding="utf-8", errors="replace")
    config = AutoConfig.from_pretrained(args.model_dir)
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    num_heads = int(cfg.num_attention_heads)
    num_kv = int(getattr(cfg, "num_key_value_heads", None) or num_heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // num_heads)
    tok = AutoTokenizer.from_pretrained(args.model_dir)
    try:
        model = AutoModel.from_pretrained(args.model_dir, torch_dtype=torch.float32, attn_implementation="eager")
    except (TypeError, ValueError):
        model = AutoModel.from_pretrained(args.model_dir, torch_dtype=torch.float32)
    model = model.to(args.device).eval()
    ids = tok(text, return_tensors="pt", truncation=True, max_length=args.max_tokens)
    input_ids = ids["input_ids"].to(args.device)
    with torch.no_grad():
        arrays = dump_qkv(
            model,
            input_ids,
            num_heads=num_heads,
            num_kv_heads=num_kv,
            head_dim=head_dim,
            layers=args.layers,
            rotary=False if args.no_rotary else None,
        )
    path = save(args.out, arrays, dtype=args.dtype)
    q, k = arrays["q"], arrays["k"]
    print(
        f"wrote {path}: q {q.shape}, k {k.shape}, v {arrays['v'].shape} ({args.dtype}), "
        f"layers {arrays['layer_ids'].tolist()}, tokens {q.shape[2]}"
        + (f", scale {float(arrays['scale']):.6g}" if "scale" in arrays else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
