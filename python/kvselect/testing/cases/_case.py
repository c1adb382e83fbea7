"""The case type and the helpers every generator shares: exact integer operands, exact scores, the rule's answer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np


@dataclass(frozen=True)
class Case:
    """One hard input: a kernel's arguments, the exact rule's answer, how to check.

    Made by the generators (``seed`` in, :class:`Case` out); frozen.
    :meth:`assert_rows` checks a kernel's output at the tolerance the case
    is built for; :attr:`form` says which form of the API it exercises.

    Attributes
    ----------
    id : str
        A short name, unique within an ``all_*_cases()`` list (a pytest id).
    rule : str
        ``"topk"``, ``"blocks"``, ``"quest"``, ``"infllm"``, ``"nsa"``,
        ``"moba"``, ``"vslash"``, ``"witnesses"`` or ``"sparse_attention"``.
    bug : str
        The bug the case provokes and where it shipped.
    inputs : dict
        The kernel's arguments, by the API's names: the ``indexer_topk*``
        ones for ``topk`` (``index_q``, ``weights``, ``index_k``,
        ``query_pos``, ``topk``, and where used ``key_scale``,
        ``cu_seqlens``, ``seq_ids``, ``kv_cache``, ``block_table``,
        ``seq_lens``, ``page_layout``, ``compress_ratio``);
        ``block_sparse_select``'s for ``blocks``; for ``quest``, ``infllm``,
        ``nsa``, ``moba`` and ``vslash`` those of
        :func:`kvselect.testing.assert_quest`, ``assert_infllm``,
        ``assert_nsa``, ``assert_moba`` and ``assert_vslash``;
        ``topk_indices``, ``context_lens``, ``num_segments`` for
        ``witnesses``; ``assert_sparse_attention``'s (``q``, ``k``, ``v``,
        ``indices``, ``conventions`` and the layout's arrays) for
        ``sparse_attention``.
    expected : ndarray
        The exact rule's answer: rows of positions (ties to the lower
        position), ``-1`` padded; block ids for ``blocks``; the columns and
        the diagonal offsets concatenated per head (``meta["nv"]`` columns
        first) for ``vslash``; the buffer after the call for
        ``witnesses``; the exact output (float64) for ``sparse_attention``.
    check : dict
        Keyword arguments of the assertion the case is built for (its
        tolerance, ``fail_vacuous``).
    scores : ndarray or None
        The exact scores (float64 ``[n_rows, n_positions]``, NaN past each
        row's context) of a ``topk`` case.
    context_lens : ndarray or None
        Each ``topk`` row's ``L``.
    meta : dict
        What the case claims, for its tests (``ulps``, ``ties``, ...).
    """

    id: str
    rule: str
    bug: str
    inputs: Mapping[str, Any]
    expected: np.ndarray
    check: Mapping[str, Any] = field(default_factory=dict)
    scores: Optional[np.ndarray] = None
    context_lens: Optional[np.ndarray] = None
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def form(self) -> str:
        """``"dense"``, ``"packed"``, ``"paged"``, ``"compressed"`` (topk: ``index_k`` of
        compressed entries, ``compress_ratio`` among the inputs), or the rule's name."""
        return str(self.meta.get("form", self.rule))

    def assert_rows(self, rows: Any) -> dict:
        """Check a kernel's output for this case.

        Parameters
        ----------
        rows : array_like or DLPack tensor, or a tuple (out, lse)
            The kernel's output on ``case.inputs``: top-k rows, block rows,
            the witness buffer after the merge, a vertical-slash
            ``(vertical, slash)`` pair (or the two concatenated per head, as
            ``expected`` holds them), or a sparse attention kernel's ``out``
            (or ``(out, lse)``), as the case's rule has it. Every case passes
            its own ``expected``.

        Returns
        -------
        dict
            The report, when every row is right.

        Raises
        ------
        CheckFailure
            (an ``AssertionError``) when some row is wrong (or vacuous where
            the case's ``check`` fails vacuous rows); the report is ``err.report``.
        SelectionError, WitnessError, TypeError
            When ``rows`` does not fit the case (shape, dtype).
        """
        from kvselect import rules

        for rule in rules.RULES:  # the case's dump kind says how (kvselect.rules.DumpKind.assert_case)
            for kind in rule.dumps:
                if kind.name == self.rule:
                    if kind.assert_case is not None:
                        return kind.assert_case(self, rows)
                    return rules.resolve(rule.assertions[0])(rows, **self.inputs, **self.check)
        raise LookupError(f"case {self.id!r}: no rule has the dump kind {self.rule!r}")


def pytest_params(cases: Sequence[Tuple[str, Case]]) -> List[Any]:
    """``(id, case)`` pairs as ``pytest.param(case, id=id)``.

    Use: ``@pytest.mark.parametrize("case", pytest_params(all_topk_cases()))``.

    Parameters
    ----------
    cases : sequence of (str, Case)
        What :func:`all_topk_cases`, :func:`all_block_cases` or
        :func:`all_witness_cases` return.

    Returns
    -------
    list of pytest.param
        One per pair, in order, the case its value and its id the pytest id.

    Raises
    ------
    ImportError
        When pytest is not installed (it is imported only here).
    """
    import pytest

    return [pytest.param(c, id=i) for i, c in cases]


def tail_lengths(n_keys: int, rows: int = 7) -> np.ndarray:
    """Context lengths ``<= n_keys``, none a multiple of 8: the tails a vectorised kernel handles apart.

    Their residues mod 8 run through 1..7, the first the longest such
    length; fewer than ``rows`` when ``n_keys`` is too small to hold them.

    Parameters
    ----------
    n_keys : int
        The longest length allowed.
    rows : int, optional
        How many lengths (default 7).

    Returns
    -------
    numpy.ndarray
        int64 ``[<= rows]``, descending.
    """
    top = n_keys if n_keys % 8 else n_keys - 1
    out: List[int] = []
    L = top
    while len(out) < rows and L > 0:
        if L % 8:
            out.append(L)
            L -= 1 + 8 * len(out)  # residues step down by one each time
        else:
            L -= 1
    return np.array(out, dtype=np.int64)


# ---- building exact operands ------------------------------------------------


_BASE = 21.0 * 2.0**19  # low-contrast scores sit at 1.3125 * 2^23 + o: o ULPs away, far from a bucket edge


def _as(values: np.ndarray, key_dtype: str) -> np.ndarray:
    """Exactly representable float64 ``values`` in ``key_dtype`` (float32,
    or an ml_dtypes bfloat16 / float8_e4m3fn array)."""
    if key_dtype == "float32":
        out = values.astype(np.float32)
    else:
        import ml_dtypes

        out = values.astype(np.float32).astype(getattr(ml_dtypes, key_dtype))
    back = out.astype(np.float64)
    same = (back == values) | (np.isnan(back) & np.isnan(values))
    assert same.all(), f"a value not exact in {key_dtype}"
    return out


def _offset_operands(
    rng: np.random.Generator, offsets: np.ndarray, heads: int, dim: int, key_dtype: str
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One query's ``index_q [H, d]`` (float64 values), ``weights [H]`` and
    keys ``[T, d]`` whose exact score of key ``t`` is ``1.3125 * 2^23 + offsets[t]``
    (integers, ``|o| <= 271``), exact in float32 in any summation order,
    with every head needed: heads weigh 1 or 2, each carries ``1.3125 * 2^23 / H``
    (component 0, keys all 256), head 0 the offset (``16 a + b``), and
    components 3.. per-head noise whose weighted sum over heads is zero."""
    assert heads & (heads - 1) == 0 and dim >= 3 and np.abs(offsets).max(initial=0) <= 271
    T = len(offsets)
    w = np.where(np.arange(heads) % 2 == 1, 2.0, 1.0)
    q = np.zeros((heads, dim))
    q[:, 0] = _BASE / (heads * 256.0 * w)
    q[0, 1], q[0, 2] = 16.0, 1.0
    q[1:, 3:] = rng.integers(-2, 3, (heads - 1, dim - 3))
    q[0, 3:] = -(w[1:, None] * q[1:, 3:]).sum(axis=0)  # head 0 has weight 1
    a = np.round(offsets / 16.0)
    k = np.zeros((T, dim))
    k[:, 0], k[:, 1], k[:, 2] = 256.0, a, offsets - 16.0 * a
    k[:, 3:] = rng.integers(-4, 5, (T, dim - 3))
    return q, w, k


def _exact_scores(q: np.ndarray, w: np.ndarray, k: np.ndarray, c: Any, lens: np.ndarray) -> np.ndarray:
    """float64 scores ``c_t Σ_h w_h max(q_h . k_t, 0)`` (exact for the cases'
    operands; NaN and inf propagate as the rule's float32 scores do), NaN
    past each row's ``L``."""
    with np.errstate(invalid="ignore", over="ignore"):
        dots = np.einsum("nhd,td->nht", q.astype(np.float64), k.astype(np.float64))
        relu = np.where(np.isnan(dots), np.nan, np.maximum(dots, 0.0))
        s = (
            np.einsum("nh,nht->nt", w.astype(np.float64), relu)
            if not np.isinf(w).any()
            else np.nansum(w.astype(np.float64)[:, :, None] * relu, axis=1)
            + np.where(np.isnan(w[:, :, None] * relu).any(axis=1), np.nan, 0.0)
        )
        if c is not None:
            s = s * np.asarray(c, dtype=np.float64)
    s[np.arange(s.shape[1])[None, :] >= lens[:, None]] = np.nan
    return s


def _rank(scores: np.ndarray, lens: np.ndarray, topk: int) -> np.ndarray:
    """The rule's rows: score descending, ties to the lower position, -0.0 ==
    +0.0, NaN last; ``min(topk, L)`` positions, then -1."""
    out = np.full((len(scores), topk), -1, dtype=np.int64)
    for i, L in enumerate(int(x) for x in lens):
        s = scores[i, :L]
        key = np.where(np.isnan(s), np.inf, -s)  # NaN after every number, +inf first
        nan_last = np.isnan(s).astype(np.int8)
        order = np.lexsort((np.arange(L), key, nan_last))
        m = min(topk, L)
        out[i, :m] = order[:m]
    return out


def _topk_case(
    id_: str,
    bug: str,
    rng: np.random.Generator,
    q1: np.ndarray,
    w1: np.ndarray,
    k: np.ndarray,
    lens: np.ndarray,
    topk: int,
    scale_exp: int,
    key_dtype: str = "float32",
    key_scale: Any = None,
    query_dtype: str = "float32",
    meta: Optional[Dict[str, Any]] = None,
    check: Optional[Dict[str, Any]] = None,
    query_pos: Optional[np.ndarray] = None,
    compress_ratio: int = 1,
) -> Case:
    """A dense case: the same query ``q1 [H, d]`` (weights ``w1``) for every
    row, row ``i`` at ``query_pos = lens[i] - 1`` unless ``query_pos`` is
    given (``lens`` then each row's visible keys, entries with
    ``compress_ratio``: ``(query_pos + 1) // compress_ratio``, form
    ``"compressed"``)."""
    n = len(lens)
    pos = lens - 1 if query_pos is None else np.asarray(query_pos, dtype=np.int64)
    assert np.array_equal(np.minimum((pos + 1) // compress_ratio, len(k)), lens)
    q = np.broadcast_to(q1, (n,) + q1.shape).copy()
    w = np.broadcast_to(w1 * 2.0**scale_exp, (n, len(w1))).copy()
    scores = _exact_scores(q, w, k, key_scale, lens)
    inputs: Dict[str, Any] = {
        "index_q": _as(q, query_dtype),
        "weights": w.astype(np.float32),
        "index_k": _as(k, key_dtype),
        "query_pos": pos.astype(np.int64),
        "topk": topk,
    }
    if compress_ratio != 1:
        inputs["compress_ratio"] = compress_ratio
    if key_scale is not None:
        inputs["key_scale"] = np.asarray(key_scale, dtype=np.float32)
    return Case(
        f"{id_}-x2^{scale_exp}",
        "topk",
        bug,
        inputs,
        _rank(scores, lens, topk),
        dict(check if check is not None else {"rtol": 0.0, "atol": 0.0}),
        scores,
        lens.astype(np.int64),
        {"form": "dense" if compress_ratio == 1 else "compressed", "scale_exp": scale_exp, **(meta or {})},
    )


# ---- token top-k ----------------------------------------------------------------


def _value_operands(
    rng: np.random.Generator, values: np.ndarray, heads: int, dim: int, sign: float = 1.0
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Operands whose exact score of key ``t`` is ``max(sign * values[t], 0)``:
    every head reads component 0 (``q = sign``), weights ``1/H``."""
    q = np.zeros((heads, dim))
    q[:, 0] = sign
    k = np.zeros((len(values), dim))
    k[:, 0] = values
    k[:, 1:] = rng.integers(-3, 4, (len(values), dim - 1))  # never read (q is 0 there)
    return q, np.full(heads, 1.0 / heads), k
