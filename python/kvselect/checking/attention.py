"""Judging a kernel that consumes a selection: an engine's sparse attention /
sparse MLA ``out`` (and ``lse``) against the exact result, within an error
bound derived from a stated model of the kernel's arithmetic.

The exact result is :mod:`kvselect.reference.sparse_attn`'s: float64 over the
inputs as dumped (bfloat16 / fp8 values decoded exactly), under the engine's
declared conventions (which slots are read, padding, repeats, causality,
blocks, paging, the empty row's ``lse``, the ``lse`` base). The engine is owed
only the roundings its arithmetic makes beyond those inputs; an
:class:`ArithmeticModel` names them and :func:`bound` turns them into a
per-element bound.

The bound
---------

Row ``(n, h)`` with ``p_j`` its exact weights, ``L`` its counted keys,
``d`` the head width and ``u(x)`` the unit roundoff of precision ``x``
(float32 ``2^-24``, bfloat16 ``2^-8``, float16 ``2^-11``, e4m3 ``2^-4``):

- a logit's error ``δs = (d u(logits) + u(q_round) + u(kv_round)) M + 6 u(logits) (S + 1)``,
  ``M = max_j scale Σ_i |q_i k_ji|`` and ``S = max_j |s_j|`` (the dot's
  accumulation, an operand rounded on load, the max subtraction and ``exp``);
  logits off by at most ``Δ = c δs`` move ``out`` by at most
  ``(e^{2Δ} - 1) Σ_j p_j |v_j - out|``;
- probabilities rounded before ``P·V``: ``u(p_round) Σ_j p_j |v_j|``;
  values rounded on load: ``u(kv_round) Σ_j p_j |v_j|``;
- the ``P·V`` sum and its rescales: ``2 (L + 2) u(pv) Σ_j p_j |v_j|``;
- the output's one rounding to its own dtype: ``u(out) |out|``, and its
  smallest normal absolutely (a subnormal output may be flushed to zero).

The logit and sum terms are multiplied by the model's safety factor ``c``
(2: they are first order); a rounding of each ``p_j`` or ``v_j`` to nearest
is bounded as it stands (times ``1 + u``). ``lse`` (in the engine's base ``b``) may be off by
``c (δs + (L + 2) u(pv)) / ln b + 2 u(lse) |lse_b|``. ``atol`` / ``rtol``
given replace the model: ``atol + rtol |exact|``.

Why it holds: each term is a standard first-order rounding bound of one
step the model names (a dot product of ``d`` terms, one rounding of each
``p_j``, a sum of ``L`` terms with a rescale per chunk at most). What would
break it: a kernel rounding somewhere the model does not say (a bfloat16
running sum, fp8 probabilities) — then its model is another, and the
report names the one used.

The models, each read from its source (docs/checking-sparse-attention.md):
:data:`MODELS`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np

from kvselect.checking.attention_causes import CAUSES, diagnose_rows
from kvselect.checking.report import Report
from kvselect.reference import ReferenceSelectionError
from kvselect.reference.sparse_attn import (
    PRESETS,
    Conventions,
    Exact,
    conventions_of,
    exact,
    head_row,
    layout,
    terms,
)

UNIT_ROUNDOFF: Dict[str, float] = {
    "float64": 2.0**-53,
    "float32": 2.0**-24,
    "tfloat32": 2.0**-11,
    "float16": 2.0**-11,
    "bfloat16": 2.0**-8,
    "float8_e4m3fn": 2.0**-4,
}
"""Half the gap between 1 and the next value, by precision name (``tfloat32``:
the inputs of a float32 ``tl.dot`` on tensor cores, Triton's default)."""

_MIN_NORMAL: Dict[str, float] = {
    "float64": 0.0,
    "float32": 2.0**-126,
    "tfloat32": 2.0**-126,
    "float16": 2.0**-14,
    "bfloat16": 2.0**-126,
    "float8_e4m3fn": 2.0**-6,
}
# An output below its dtype's smallest normal may be flushed to zero (GPU FTZ):
# that much absolute slack is added to the output's rounding.

_ALIASES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "fp8": "float8_e4m3fn", "fp64": "float64"}


def _u(p: Optional[str]) -> float:
    return 0.0 if p is None else UNIT_ROUNDOFF[_ALIASES.get(p, p)]


@dataclass(frozen=True)
class ArithmeticModel:
    """Where a kernel rounds beyond its inputs.

    Attributes
    ----------
    name : str
        Its name in :data:`MODELS` and in the report.
    summary : str
        One sentence: what is rounded where.
    source : str
        Where it was read (repository, path, commit).
    logits : str
        The precision ``q · k``, the scale and ``exp`` are computed in.
    q_round, kv_round : str or None
        Queries / keys and values rounded to this on load, beyond the dumped
        values (MiniMax-M3: fp8 times its scale, rounded to bfloat16).
    p_round : str or None
        Probabilities rounded to this before ``P·V`` (a tensor-core ``P·V``
        takes them in ``V``'s dtype).
    pv : str
        The precision ``P·V`` accumulates in.
    safety : float
        The factor on the first-order terms.

    The output is rounded once to its own dtype (the ``out`` array's), and
    ``lse`` to its (float32 unless given float64).
    """

    name: str
    summary: str
    source: str
    logits: str = "float32"
    q_round: Optional[str] = None
    kv_round: Optional[str] = None
    p_round: Optional[str] = None
    pv: str = "float32"
    safety: float = 2.0


_FLASHMLA = (
    "deepseek-ai/FlashMLA tests/ref.py (a123d0b0: float32 reference, output rounded to bfloat16), "
    "tests/test-sparse-prefill.py (9a7d253a: out within 8e-4 + 3.01/128 relative, lse 2.01/65536), "
    "tests/test-sparse-decode.py (a123d0b0: out 1e-3 + 2.01/128, lse 8.01/65536); P·V on tensor "
    "cores takes P in V's dtype (bfloat16)"
)

MODELS: Dict[str, ArithmeticModel] = {
    m.name: m
    for m in (
        ArithmeticModel(
            "exact", "float64 throughout (a float64 reference)", "kvselect", logits="float64", pv="float64"
        ),
        ArithmeticModel(
            "float32",
            "float32 logits, probabilities and sums, nothing rounded before P·V",
            "kvselect src/attention (its sparse_attention); FlashMLA's and cuDNN #793's PyTorch references",
        ),
        ArithmeticModel(
            "flashmla_sparse",
            "bfloat16 q and latent KV as given, float32 logits and sums, P rounded to bfloat16 before P·V",
            _FLASHMLA,
            p_round="bfloat16",
        ),
        ArithmeticModel(
            "cudnn_793",
            "the contract's reference: float32 logits, softmax and sums; lse float32 base e",
            "NVIDIA/cudnn-frontend#793 (contract and PyTorch reference backend, as its description states)",
        ),
        ArithmeticModel(
            "vllm_triton_mla_sparse",
            "k cast to q's dtype, float32 tl.dot, scale·log2(e) folded, exp2, P cast to V's dtype "
            "(bfloat16) before tl.dot(P, V), float32 accumulator, output stored bfloat16",
            "vllm-project/vllm vllm/v1/attention/ops/xpu_mla_sparse.py (35772e31)",
            p_round="bfloat16",
        ),
        ArithmeticModel(
            "minimax_m3",
            "fp8 K/V times their scale rounded to q's dtype (bfloat16) on load, float32 tl.dot, exp2, "
            "P cast to V's dtype before tl.dot(P, V), float32 accumulator",
            "vllm-project/vllm vllm/models/minimax_m3/common/ops/sparse_attn.py (03034981)",
            kv_round="bfloat16",
            p_round="bfloat16",
        ),
    )
}
"""The arithmetic models by name."""

PRESET_MODELS: Dict[str, str] = {
    "flashmla_sparse_prefill": "flashmla_sparse",
    "flashmla_sparse_decode": "flashmla_sparse",
    "cudnn_793": "cudnn_793",
    "vllm_triton_mla_sparse": "vllm_triton_mla_sparse",
    "minimax_m3": "minimax_m3",
    "sglang_dsa_prefill": "vllm_triton_mla_sparse",
    "kvselect": "float32",
}
"""Each preset's default model."""

REASONS = ("non_finite", "empty_row", "out_error", "lse_error")
"""The report's ``by_reason`` keys: a NaN / infinite value where a number is
owed; an empty row whose ``out`` is not 0 or whose ``lse`` is not the
declared value; ``out`` or ``lse`` outside the bound."""


def model_of(
    model: Union[None, str, ArithmeticModel], preset: Optional[str], precision: Optional[str]
) -> ArithmeticModel:
    """The model a check uses: ``model`` given, else ``precision``'s uniform
    model (every intermediate rounded to it), else the preset's, else
    ``"float32"``.

    Raises
    ------
    ValueError
        An unknown model or precision name (the message names the argument).
    """
    if isinstance(model, ArithmeticModel):
        return model
    if model is not None:
        if model not in MODELS:
            raise ValueError(f"model must be one of {', '.join(MODELS)}, got {model!r}")
        return MODELS[model]
    if precision is not None:
        p = _ALIASES.get(precision, precision)
        if p not in UNIT_ROUNDOFF:
            raise ValueError(f"precision must be one of {', '.join(UNIT_ROUNDOFF)}, got {precision!r}")
        coarse = p if UNIT_ROUNDOFF[p] >= UNIT_ROUNDOFF["float32"] else "float32"
        return ArithmeticModel(
            f"precision {p}",
            f"every intermediate (logits, P, P·V) rounded to {p}",
            "precision= given",
            logits=coarse,
            p_round=p,
            pv=coarse,
        )
    return MODELS[PRESET_MODELS.get(preset or "", "float32")]


def _dtype_name(a: np.ndarray) -> str:
    name = a.dtype.name
    return name if name in UNIT_ROUNDOFF else ("float64" if name == "float64" else "float32")


def bound(
    ex: Exact, model: ArithmeticModel, d: int, out_dtype: str, lse_dtype: str, base: str
) -> Tuple[np.ndarray, np.ndarray]:
    """The per-element bound on ``out`` and per-row bound on ``lse`` (module docs).

    Returns
    -------
    (ndarray [n, H, d_v], ndarray [n, H])
    """
    u_log = _u(model.logits)
    ds = (d * u_log + _u(model.q_round) + _u(model.kv_round)) * ex.mag + 6 * u_log * (ex.smax + 1.0)
    D = model.safety * ds
    L = np.maximum(ex.count, 1.0)
    u_pv = _u(model.pv)
    first = np.expm1(2 * D)[..., None] * ex.dev_pv + 2 * (L + 2)[..., None] * u_pv * ex.abs_pv
    u_pk = _u(model.p_round) + _u(model.kv_round)
    # Rounding each p_j (or v_j) to nearest is exact to first order: no safety factor.
    pre = model.safety * first + u_pk * (1 + u_pk) * ex.abs_pv + u_pv * np.abs(ex.out)
    b_out = pre + _u(out_dtype) * (np.abs(ex.out) + pre) + _MIN_NORMAL[out_dtype]
    ln_b = np.log(2.0) if base == "2" else 1.0
    lse_b = np.where(np.isfinite(ex.lse), ex.lse, 0.0) / ln_b
    b_lse = model.safety * (ds + (L + 2) * u_pv) / ln_b + 2 * _u(lse_dtype) * np.abs(lse_b) + _MIN_NORMAL[lse_dtype]
    return b_out, b_lse


def check_sparse_attention(
    out: Any,
    q: Any,
    k: Any,
    v: Any,
    indices: Any,
    *,
    lse: Any = None,
    preset: Optional[str] = None,
    conventions: Optional[Conventions] = None,
    model: Union[None, str, ArithmeticModel] = None,
    precision: Optional[str] = None,
    atol: Optional[float] = None,
    rtol: Optional[float] = None,
    query_pos: Any = None,
    scale: Optional[float] = None,
    d_v: Optional[int] = None,
    sink: Any = None,
    read_len: Any = None,
    cu_seqlens: Any = None,
    seq_ids: Any = None,
    block_table: Any = None,
    seq_lens: Any = None,
    out_dtype: Optional[str] = None,
    diagnose: int = 128,
) -> Report:
    """An engine's sparse attention ``out`` (and ``lse``) judged against the exact result.

    Parameters
    ----------
    out : array_like, [n_queries, H_q, d_v]
        The engine's output (float32, float64, float16, or an ml_dtypes
        bfloat16 array: its dtype is the output's rounding).
    q, k, v, indices : array_like
        The call's inputs, as :func:`kvselect.reference.sparse_attention_exact`
        takes them (``v`` None: MLA's latent, ``v = k[..., :d_v]``).
    lse : array_like, [n_queries, H_q] (``[H_q, n_queries]`` with ``lse_head_major``), optional
        The engine's ``lse``, in its declared base.
    preset : str, optional
        A name of :data:`kvselect.reference.sparse_attn.PRESETS`: the
        engine's conventions and its default model.
    conventions : Conventions, optional
        The conventions (wins over ``preset``'s).
    model : str or ArithmeticModel, optional
        The arithmetic model (:data:`MODELS`); default the preset's, else ``"float32"``.
    precision : str, optional
        Instead of a model: every intermediate rounded to this precision.
    atol, rtol : float, optional
        Given, they replace the model: an element may be off by ``atol + rtol |exact|``.
    query_pos, scale, d_v, sink, read_len, cu_seqlens, seq_ids, block_table, seq_lens : optional
        As :func:`kvselect.reference.sparse_attention_exact`.
    out_dtype : str, optional
        The precision ``out`` was stored in, when ``out`` holds its values
        widened (a dump's decoded bfloat16); default ``out``'s dtype.
    diagnose : int
        How many wrong rows (the worst, from at most ``diagnose // 16``
        queries) are tried against the known causes.

    Returns
    -------
    Report
        ``rows`` (one per (query, query head), row ``n · H_q + h``),
        ``correct``, ``wrong``, ``by_reason`` (:data:`REASONS`), ``details``
        (each wrong row: ``row``, ``query``, ``head``, ``problems``, each
        with its ``reason``, ``error``, ``bound``, ``got``, ``expected``,
        ``element`` and, when recognised, ``cause`` and ``why``); plus
        ``model`` (its name, summary, source, or the given tolerance),
        ``conventions``, ``empty_rows``, ``diagnosed`` (the wrong rows tried
        against the causes), ``by_cause`` and ``worst`` (the largest error
        over its bound).

    Raises
    ------
    ValueError
        Inputs that do not fit together (a ``ReferenceSelectionError``
        naming the argument); a NaN or infinite input some row reads (its
        exact attention is undefined: ``argument`` names ``q``, ``k``, ``v``
        or ``sink``); an unknown model or precision.
    TypeError
        Floats where indices belong, or the reverse.

    See Also
    --------
    kvselect.testing.assert_sparse_attention : the assertion, through ``kvselect check``'s dump.

    Examples
    --------
    >>> import numpy as np
    >>> q = np.ones((1, 1, 2), np.float32); k = np.ones((3, 1, 2), np.float32)
    >>> v = np.arange(3, dtype=np.float32).reshape(3, 1, 1)
    >>> r = check_sparse_attention(np.array([[[1.5]]], np.float32), q, k, v, np.array([[1, 2, -1]]))
    >>> r["wrong"], r["model"]["name"]
    (0, 'float32')
    """
    conv = conventions if conventions is not None else conventions_of(preset)
    m = model_of(model, preset, precision)
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
    o_arr = np.asarray(out)
    n, H = lay.q.shape[:2]
    dv = lay.v.shape[-1]
    if o_arr.shape != (n, H, dv):
        raise ReferenceSelectionError(
            "out", f"out must be [n_queries, H_q, d_v] = {[n, H, dv]}, got {list(o_arr.shape)}"
        )
    got = o_arr.astype(np.float64)
    got_lse = None
    lse_dtype = "float32"
    if lse is not None:
        l_arr = np.asarray(lse)
        want = (H, n) if conv.lse_head_major else (n, H)
        if l_arr.shape != want:
            raise ReferenceSelectionError("lse", f"lse must be {list(want)}, got {list(l_arr.shape)}")
        got_lse = l_arr.astype(np.float64)
        if conv.lse_head_major:
            got_lse = got_lse.T
        lse_dtype = _dtype_name(l_arr)
    ex = exact(lay)
    _refuse_non_finite(lay, ex)
    o_dtype = _dtype_name(o_arr) if out_dtype is None else _ALIASES.get(out_dtype, out_dtype)
    if o_dtype not in UNIT_ROUNDOFF:
        raise ValueError(f"out_dtype must be one of {', '.join(UNIT_ROUNDOFF)}, got {out_dtype!r}")
    b_out, b_lse = bound(ex, m, lay.q.shape[2], o_dtype, lse_dtype, conv.lse_base)
    ln_b = np.log(2.0) if conv.lse_base == "2" else 1.0
    want_lse = ex.lse / ln_b
    if atol is not None or rtol is not None:
        a, r = float(atol or 0.0), float(rtol or 0.0)
        b_out = a + r * np.abs(ex.out)
        b_lse = a + r * np.abs(np.where(np.isfinite(want_lse), want_lse, 0.0))
        model_info: Dict[str, Any] = {"name": "tolerance", "atol": a, "rtol": r, "summary": "atol + rtol |exact|"}
    else:
        model_info = {"name": m.name, "summary": m.summary, "source": m.source}
    problems = _judge(got, got_lse, ex, want_lse, b_out, b_lse, conv)
    wrong_rows = sorted(problems)
    worst_first: List[int] = []
    if diagnose and wrong_rows:
        ranked = sorted(wrong_rows, key=lambda r: -max(p["ratio"] for p in problems[r]))
        queries: Dict[int, None] = {}
        for r in ranked:  # the worst rows, from at most diagnose // 16 queries (each recomputed per hypothesis)
            if len(worst_first) == diagnose:
                break
            if r // H in queries or len(queries) < max(1, diagnose // 16):
                queries[r // H] = None
                worst_first.append(r)
        lse_d = lse_dtype

        def bound_of(alt: Exact) -> Tuple[np.ndarray, np.ndarray]:
            if atol is not None or rtol is not None:
                a, r = float(atol or 0.0), float(rtol or 0.0)
                alt_lse = np.where(np.isfinite(alt.lse), alt.lse / ln_b, 0.0)
                return a + r * np.abs(alt.out), a + r * np.abs(alt_lse)
            return bound(alt, m, lay.q.shape[2], o_dtype, lse_d, conv.lse_base)

        diagnose_rows(lay, ex, got, got_lse, problems, worst_first, bound_of)
    details: List[Dict[str, Any]] = []
    by_reason = {r: 0 for r in REASONS}
    by_cause: Dict[str, int] = {}
    worst: Optional[Dict[str, Any]] = None
    for row in wrong_rows:
        ps = problems[row]
        for reason in dict.fromkeys(p["reason"] for p in ps):
            by_reason[reason] += 1
        for cause in dict.fromkeys(p["cause"] for p in ps if "cause" in p):
            by_cause[cause] = by_cause.get(cause, 0) + 1
        for p in ps:
            if worst is None or p["ratio"] > worst["ratio"]:
                worst = {"row": row, "query": row // H, "head": row % H, **p}
        details.append({"row": row, "query": row // H, "head": row % H, "problems": ps})
    rows = n * H
    return Report(
        rows=rows,
        correct=rows - len(details),
        wrong=len(details),
        by_reason=by_reason,
        details=details,
        model=model_info,
        conventions=asdict(conv),
        empty_rows=int(ex.empty.sum()),
        diagnosed=len(worst_first),
        by_cause=by_cause,
        worst=worst,
    )


def _refuse_non_finite(lay: Any, ex: Exact) -> None:
    """A row whose exact result is not finite reads a NaN or infinite input
    (the exact attention over it is undefined): refused, naming the input and
    the first such row. An input no counted key reaches (an unused page) is
    never looked at."""
    bad = ~np.isfinite(ex.out).all(axis=2) | (~np.isfinite(ex.lse) & ~ex.empty)
    if not bad.any():
        return
    i, h = (int(x) for x in np.argwhere(bad)[0])
    g, kvh = head_row(lay, h)
    t = terms(lay, np.array([i]))
    keys = t.flat[0, g][t.weight[0, g] > 0]
    if not np.isfinite(lay.q[i, h]).all():
        arg = "q"
    elif not np.isfinite(lay.k[keys, kvh]).all():
        arg = "k"
    elif not np.isfinite(lay.v[keys, kvh]).all():
        arg = "v"
    else:
        arg = "sink" if lay.sink is not None and not np.isfinite(lay.sink[h]) else "q"
    raise ReferenceSelectionError(
        arg,
        f"{arg} holds a NaN or infinite value that row (query {i}, head {h}) reads: its exact attention "
        "is undefined, so it cannot be checked",
    )


def _judge(
    got: np.ndarray,
    got_lse: Optional[np.ndarray],
    ex: Exact,
    want_lse: np.ndarray,
    b_out: np.ndarray,
    b_lse: np.ndarray,
    conv: Conventions,
) -> Dict[int, List[Dict[str, Any]]]:
    """Every wrong row's problems, by row number (the ``ratio`` of each is
    its error over its bound; infinite for a non-finite value)."""
    n, H, _ = got.shape
    out: Dict[int, List[Dict[str, Any]]] = {}
    empty = ex.empty
    with np.errstate(invalid="ignore"):
        err = np.abs(got - ex.out)
    bad_num = ~np.isfinite(got)
    lo, hi = conv.empty_lse_range()
    for i, h in zip(*np.nonzero(bad_num.any(axis=2) | (empty & (got != 0).any(axis=2)) | (err > b_out).any(axis=2))):
        row = int(i) * H + int(h)
        if empty[i, h]:
            c = int(np.argmax(got[i, h] != 0)) if not bad_num[i, h].any() else int(np.argmax(bad_num[i, h]))
            reason = "non_finite" if bad_num[i, h].any() else "empty_row"
            out.setdefault(row, []).append(
                _problem(reason, "out", float(got[i, h, c]), 0.0, np.inf, 0.0, c, "an empty row's out must be 0")
            )
            continue
        if bad_num[i, h].any():
            c = int(np.argmax(bad_num[i, h]))
            out.setdefault(row, []).append(
                _problem(
                    "non_finite", "out", float(got[i, h, c]), float(ex.out[i, h, c]), np.inf, float(b_out[i, h, c]), c
                )
            )
            continue
        ratio = err[i, h] / b_out[i, h]
        c = int(np.argmax(ratio))
        out.setdefault(row, []).append(
            _problem(
                "out_error",
                "out",
                float(got[i, h, c]),
                float(ex.out[i, h, c]),
                float(err[i, h, c]),
                float(b_out[i, h, c]),
                c,
            )
        )
    if got_lse is None:
        return out
    with np.errstate(invalid="ignore"):
        empty_bad = empty & (np.isnan(got_lse) | ~((got_lse >= lo) & (got_lse <= hi)))
        diff = np.abs(got_lse - want_lse)
        live_bad = ~empty & (~np.isfinite(got_lse) | (diff > b_lse))
    want_empty = lo if lo == hi else (lo + hi) / 2
    for i, h in zip(*np.nonzero(empty_bad | live_bad)):
        row = int(i) * H + int(h)
        g = float(got_lse[i, h])
        if empty[i, h]:
            reason = "non_finite" if np.isnan(g) else "empty_row"
            note = f"an empty row's lse must be {conv.empty_lse}"
            out.setdefault(row, []).append(_problem(reason, "lse", g, want_empty, np.inf, 0.0, None, note))
        elif not np.isfinite(g):
            out.setdefault(row, []).append(
                _problem("non_finite", "lse", g, float(want_lse[i, h]), np.inf, float(b_lse[i, h]), None)
            )
        else:
            out.setdefault(row, []).append(
                _problem("lse_error", "lse", g, float(want_lse[i, h]), float(diff[i, h]), float(b_lse[i, h]), None)
            )
    return out


def _problem(
    reason: str,
    what: str,
    got: float,
    expected: float,
    error: float,
    bound_: float,
    element: Optional[int],
    note: Optional[str] = None,
) -> Dict[str, Any]:
    p: Dict[str, Any] = {
        "reason": reason,
        "of": what,
        "got": got,
        "expected": expected,
        "error": error,
        "bound": bound_,
    }
    p["ratio"] = float("inf") if error == np.inf else (error / bound_ if bound_ > 0 else float("inf"))
    if element is not None:
        p["element"] = element
    if note:
        p["note"] = note
    return p


__all__ = [
    "ArithmeticModel",
    "MODELS",
    "PRESET_MODELS",
    "PRESETS",
    "REASONS",
    "CAUSES",
    "UNIT_ROUNDOFF",
    "bound",
    "model_of",
    "check_sparse_attention",
]
