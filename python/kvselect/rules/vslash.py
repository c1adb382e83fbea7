"""MInference's vertical-slash pattern: the key columns and diagonals a
prefill's queries read, estimated from the last queries' attention.

The rule (``kvselect.vslash_select``, docs/vertical-slash.md): the causal
softmax of the last ``min(64, L)`` queries' scores; the column sums
("vertical") and the diagonal sums ("slash", by offset ``query - key``); the
first 30 columns and the 100 nearest diagonals forced (``variant="search"``:
unscaled scores, 30 diagonals); the top ``max(v, 30)`` columns and ``max(s,
50)`` diagonals, ties to the lower id.

Its ``vslash`` dump is checked against the exact sums (float64, the
reference twin's): an engine's columns and diagonals are each a top-k of
them up to the tolerance, the forced ones counting as ``+inf``. Its eval
policy spends the token budget on the union's distinct positions: ``v =
max(30, k // 7)`` columns and ``s = k - v`` diagonals (about MInference's
default ratio, 1000 columns to 6096 diagonals), so a row holds at most ``k``
positions; the forced 30 columns and 100 diagonals alone need ``min(P, 130)``
positions, and where that exceeds ``k`` it is ``n/a``. The estimate reads the prefill's last queries, which
only the boundary experiment holds (``kvselect eval --boundary``: the
prefix's queries): like the eviction policies it decides once, at the
boundary (``eviction=True``), one estimate per KV head from its group's mean
query, its row the positions the pattern gives query ``P - 1``; the harness
adds the arrivals.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence, Tuple, Union

import numpy as np

import kvselect as ks
from kvselect.checking._common import DumpError, _finite, _int, _need
from kvselect.rules._rule import DumpKind, EvalContext, Policy, Rule, Selection, timed

TABLE = {
    "kind": ("str", "", "required", '"vslash"'),
    "q": ("float", "[n_heads, min(64, L), d]", "required", "each head's last queries (query i at L - n + i)"),
    "keys": ("float", "[L, n_kv_heads, d]", "required", "the sequence's keys"),
    "vertical_size": ("int scalar", "", "required", "v: columns asked (at least 30 taken)"),
    "slash_size": ("int scalar", "", "required", "s: diagonals asked (at least 50 taken)"),
    "vertical": ("int", "[n_heads, nv]", "required", "the engine's columns, any order"),
    "slash": ("int", "[n_heads, ns]", "required", "the engine's diagonal offsets query - key, any order"),
    "key_scale": ("float", "[L]", "optional", "each key's scale (fp8 keys: the key is k * scale)"),
    "variant": ("str", "", 'optional (default "kernel")', '"kernel" or "search" (docs/vertical-slash.md)'),
    "precision": ("str", "", "optional", "the engine's coarsest rounding (default float32)"),
}

_VARIANTS = ("kernel", "search")


def check(
    d: Mapping[str, np.ndarray], atol: float, rtol: float, precision: str, filler: str
) -> Sequence[Tuple[str, Mapping[str, Any]]]:
    """A ``vslash`` dump against the exact column and diagonal sums."""
    from kvselect.reference.vslash import forced_slashes, vslash_scores, vslash_sizes

    _need(d, "q", "keys", "vertical_size", "slash_size", "vertical", "slash")
    formats = getattr(d, "formats", {})
    _finite(d, "q", "keys", "key_scale")
    variant = str(np.asarray(d["variant"])) if "variant" in d else "kernel"
    if variant not in _VARIANTS:
        raise DumpError(f"variant must be one of {', '.join(map(repr, _VARIANTS))}, got {variant!r}")
    q, keys = d["q"], d["keys"]
    if q.ndim != 3 or keys.ndim != 3:
        raise DumpError(f"q must be [n_heads, n, d] and keys [L, n_kv_heads, d], got {q.shape}, {keys.shape}")
    L, h = keys.shape[0], q.shape[0]
    nv, ns = vslash_sizes(L, _int(d, "vertical_size"), _int(d, "slash_size"))
    if q.shape[1] != min(64, L) or q.shape[2] != keys.shape[2] or h % keys.shape[1]:
        raise DumpError(f"q must be [n_heads, min(64, L)={min(64, L)}, d={keys.shape[2]}], got {q.shape}")
    try:
        v, s = vslash_scores(q, keys, variant=variant, key_scale=d.get("key_scale"), key_format=formats.get("keys"))
    except ValueError as e:
        raise DumpError(str(e)) from None
    v[:, :30] = np.inf
    s[:, : forced_slashes(variant)] = np.inf
    out = []
    for name, key, scores, k in (("vertical columns", "vertical", v, nv), ("slash diagonals", "slash", s, ns)):
        rows = np.asarray(d[key])
        if rows.ndim != 2 or rows.shape[0] != h or rows.dtype.kind not in "iu":
            raise DumpError(f"{key} must be integer [n_heads={h}, n], got {rows.dtype} {rows.shape}")
        mags = np.where(np.isfinite(scores), scores, 0.0)
        report = ks.check_topk(
            scores,
            np.ascontiguousarray(rows),  # (as the engine wrote them: int64 entries are never cut to int32)
            np.full(h, L, np.int32),
            topk=k,
            atol=atol,
            rtol=rtol,
            magnitudes=mags if rtol else None,
        )
        out.append((f"{name} against the exact sums", report))
    return out


#: MInference's default configuration takes 1000 columns and 6096 diagonals:
#: the budget is split about 1 : 6.
RATIO = 7


def sizes(k: int) -> Tuple[int, int]:
    """``(v, s)`` at a budget of ``k`` positions: ``v = max(30, k // 7)``, ``s = k - v``."""
    v = max(30, k // RATIO)
    return v, k - v


def select(ctx: EvalContext) -> Union[Selection, str]:
    """The estimate from the prefix's last ``min(64, P)`` queries (the group's
    mean, SGLang's alignment of a GQA group to its KV head) over its ``P`` keys,
    ``sizes(k)`` columns and diagonals; each query's row is the positions the
    pattern gives query ``P - 1``."""
    prefix = getattr(ctx.head, "observe", None)
    if prefix is None:
        return "the estimate reads the prefill's last 64 queries: it runs in the boundary experiment (--boundary)"
    p, k = len(prefix), ctx.settings.budget
    forced = forced_positions(p)
    if forced > k:
        return f"its forced 30 columns and 100 diagonals alone ({forced} positions at P = {p}) exceed the budget ({k})"
    v, s = sizes(k)

    def rows() -> np.ndarray:
        n = min(64, p)
        q = prefix[p - n :].astype(np.float32).mean(axis=1, dtype=np.float32)[None]
        keys = np.ascontiguousarray(ctx.head.k[:p].reshape(p, 1, -1), dtype=np.float32)
        vert, slash = ks.vslash_select(np.ascontiguousarray(q), keys, v, s)
        row = ks.vslash_rows(vert, slash, p, [p - 1])[0, 0]
        out = np.full((len(ctx.pos), ctx.settings.budget), -1, dtype=np.int32)
        out[:, : len(row)] = row[: ctx.settings.budget]
        return out

    return timed(rows)


def forced_positions(p: int) -> int:
    """The distinct positions the forced parts give query ``P - 1``: columns
    ``0 .. min(P, 30)`` and keys ``P - 1 - o`` for offsets ``o < min(P, 100)``
    (``min(P, 130)``; they meet only when ``P < 130``)."""
    cols = set(range(min(p, 30)))
    return len(cols | {p - 1 - o for o in range(min(p, 100))})


def assert_case(case: Any, rows: Any) -> Any:
    """A vertical-slash case's check of a kernel's ``(vertical, slash)`` pair,
    or of the two concatenated per head as the case's ``expected`` holds them,
    the columns first (:meth:`kvselect.testing.cases.Case.assert_rows`)."""
    from kvselect import testing

    if not isinstance(rows, tuple):
        nv = int(case.meta["nv"])
        rows = (rows[:, :nv], rows[:, nv:])
    return testing.assert_vslash(rows, **case.inputs, **case.check)


RULE = Rule(
    name="vslash",
    title="MInference vertical-slash",
    api=("vslash_select", "vslash_scores", "vslash_rows", "vslash_layout", "vslash_layout_batch"),
    reference="kvselect.reference.vslash",
    twins=(
        "vslash_select",
        "vslash_scores",
        "vslash_error_bounds",
        "vslash_sizes",
        "vslash_rows",
        "vslash_layout",
        "vslash_layout_batch",
    ),
    assertions=("kvselect.testing.assert_vslash",),
    cases="kvselect.testing.cases.all_vslash_cases",
    case_functions=(
        "kvselect.testing.cases.vslash_causal_mask",
        "kvselect.testing.cases.vslash_offset_sign",
        "kvselect.testing.cases.vslash_forced",
        "kvselect.testing.cases.vslash_short",
        "kvselect.testing.cases.vslash_fp8_scales",
    ),
    dumps=(
        DumpKind(
            "vslash",
            TABLE,
            "MInference's vertical-slash estimate (its columns and diagonals), checked by `kvselect check`.",
            check,
            rows=lambda d: int(np.asarray(d["vertical"]).shape[0]),
            assert_case=assert_case,
        ),
    ),
    policies=(
        Policy(
            "vertical-slash",
            select,
            "MInference's vertical-slash pattern estimated at the boundary from the prefix's last 64 queries "
            "(the group's mean): ``max(30, k // 7)`` columns and the rest diagonals, the forced 30 columns and "
            "100 diagonals counted; each row the positions it gives query ``P - 1``.",
            eviction=True,
        ),
    ),
    guide="docs/vertical-slash.md",
)
