"""The experiment the witness spec's metrics exist for: selection policies
compared at one identical token budget.

For every KV head of a workload and every evaluated query position ``i``
(context ``L = i + 1``), each policy picks at most ``k`` key positions; the
harness then measures, per query head:

- **segment coverage** of the selection (``S`` segments of ``[0, L)``);
- **attention-mass recall**: the share of the dense attention row's mass the
  selection keeps (mean, and the 5th percentile over heads and queries);
- **output relative error** ``‖o_sparse − o_dense‖ / ‖o_dense‖`` of sparse
  attention over the selection against dense attention: its mean, median and
  95th percentile over heads and queries (a ratio: rows whose dense output is
  near zero can dominate the mean, so the median says what is typical);
- **slots used**: distinct valid positions selected (a policy may use fewer
  than ``k``, never more), and the time its selection took.

The policies (``k`` slots each):

``learned top-k``
    the top ``k`` positions of the *indexer's* scores (the workload's
    ``index_q · index_k``, an approximation of the true scores, as DeepSeek's
    lightning indexer is).
``witnesses (reserved tail)``
    the top ``k − S`` learned positions, ``S`` padding slots, then
    :func:`kvselect.scatter_topology_witnesses`: every segment is covered.
``witnesses (as served)``
    the full top-``k`` row in score order, whose last ``S`` slots the scatter
    overwrites (the spec's caveat: a segment can end up uncovered).
``block-sparse``
    MiniMax-M3 block selection on the same indexer, ``k / block_size`` blocks
    (forced init and local blocks included), expanded to positions.
``random null``, ``locality null``
    the spec's null models (rows of the random and local selectors).
``sink + window``
    StreamingLLM: the first ``sinks`` keys and the most recent ``k − sinks``.
``oracle top-k``
    the ``k`` keys with the largest true attention weight (averaged over the
    KV head's query-head group): unusable in production, the ceiling.

A policy that cannot run at a budget (block-sparse when the budget holds no
whole block) is reported with NaN numbers and a note, the others run. A
budget at which every policy sees every key of every query (the budget holds
the context) is listed in :attr:`Report.every_key_budgets`, and the table
says so once instead of printing trivially perfect numbers.
:func:`derive_settings` gives the settings at a budget, scaling what must
scale with ``k`` (segments, block geometry, sinks) when it is not given.

Every number comes from kvselect's own functions: this module only slices
arrays, calls them and averages what they return.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

import kvselect as ks
from kvselect.workloads import Workload

POLICIES = (
    "learned top-k",
    "witnesses (reserved tail)",
    "witnesses (as served)",
    "witnesses (served, unordered)",
    "block-sparse",
    "random null",
    "locality null",
    "sink + window",
    "oracle top-k",
)


@dataclass(frozen=True)
class Settings:
    """What the harness compares at: the budget ``k``, the witness segment
    count ``S``, the block geometry and the nulls' knobs.

    Attributes
    ----------
    budget : int
        The token budget ``k``: slots per query row.
    segments : int
        The witness segment count ``S``.
    block_size, init_blocks, local_blocks : int
        Block-sparse's block geometry: tokens per block, forced init blocks,
        forced local blocks.
    sinks : int
        The sink + window policy's sink count.
    seed : int
        The seed of the random null and of the unordered served row's
        shuffle.
    """

    budget: int = 2048
    segments: int = 64
    block_size: int = 64
    init_blocks: int = 1
    local_blocks: int = 2
    sinks: int = 4
    seed: int = 0

    def check(self) -> None:
        """Refuses settings that cannot work at all. A block larger than the
        budget is not refused: block-sparse then cannot run at this budget
        and is reported ``n/a`` (see :meth:`block_sparse_note`) while the
        other policies run."""
        if self.budget < 1:
            raise ValueError(f"budget must be at least 1, got {self.budget}")
        if not 1 <= self.segments <= ks.MAX_TOPOLOGY_SEGMENTS:
            raise ValueError(
                f"segments must be in 1..{ks.MAX_TOPOLOGY_SEGMENTS}, got {self.segments}"
            )
        if self.segments > self.budget:
            raise ValueError(
                f"segments ({self.segments}) cannot exceed the budget ({self.budget}): "
                "the witnesses need a slot each"
            )
        if self.block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {self.block_size}")
        if self.init_blocks < 0 or self.local_blocks < 0 or self.sinks < 0:
            raise ValueError("init_blocks, local_blocks and sinks must be non-negative")
        if (
            self.block_sparse_note() is None
            and self.block_size * (self.init_blocks + self.local_blocks) > self.budget
        ):
            raise ValueError(
                f"init_blocks + local_blocks ({self.init_blocks} + {self.local_blocks}) "
                f"blocks of {self.block_size} exceed the budget ({self.budget})"
            )

    def block_sparse_note(self) -> Optional[str]:
        """Why block-sparse cannot run at these settings (``None`` if it can):
        the budget holds no whole block."""
        if self.budget < self.block_size:
            return f"the budget ({self.budget}) holds no block of {self.block_size} tokens"
        return None


class SettingsError(ValueError):
    """Settings that cannot work (a :class:`ValueError`), raised by
    :func:`derive_settings`.

    Attributes
    ----------
    fields : tuple of str
        The settings the caller gave that would have to change (empty when
        none of them is to blame).
    """

    def __init__(self, message: str, fields: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.fields = tuple(fields)


#: The settings :func:`derive_settings` may derive from the budget, with the
#: defaults they take whenever the budget allows.
DERIVED_FIELDS = ("segments", "block_size", "init_blocks", "local_blocks", "sinks")


def derive_settings(
    budget: int,
    *,
    segments: Optional[int] = None,
    block_size: Optional[int] = None,
    init_blocks: Optional[int] = None,
    local_blocks: Optional[int] = None,
    sinks: Optional[int] = None,
    seed: int = 0,
    names: Optional[Mapping[str, str]] = None,
) -> Tuple[Settings, Dict[str, int]]:
    """The settings at ``budget``.

    What the caller gave (not ``None``) is kept, what it left out is derived
    from the budget.

    The derivation keeps :class:`Settings`' defaults (S = 64, blocks of 64,
    1 init + 2 local blocks, 4 sinks) wherever the budget allows them (so a
    run that worked on the defaults is unchanged), and scales only what must
    scale with ``k``:

    - ``segments``: ``min(64, max(1, k // 8))``: 64 from ``k = 512`` on, at
      most an eighth of the row below (S = k would leave the reserved tail no
      learned slot and overwrite the whole row as served);
    - ``block_size``: the largest power of two up to 64 whose forced blocks
      (``init_blocks + local_blocks``, at least one block) fit the budget;
      64 from ``k = 192`` on with the default 1 + 2 forced blocks;
    - ``init_blocks``, ``local_blocks``: trimmed, init blocks first, when the
      forced blocks do not fit the budget's ``k // block_size`` blocks (with
      a given ``block_size``, or below 3 tokens);
    - ``sinks``: ``min(4, k - 1)`` (the window keeps one slot).

    A given ``block_size`` larger than the budget is kept: block-sparse is
    then ``n/a`` at this budget (:meth:`Settings.block_sparse_note`).

    Parameters
    ----------
    budget : int
        The token budget ``k`` (at least 1).
    segments, block_size, init_blocks, local_blocks, sinks : int or None
        The settings the caller gives; ``None`` derives it from the budget
        as above.
    seed : int
        :attr:`Settings.seed`, kept as given.
    names : mapping of str to str, optional
        How the caller spells each field in error messages
        (``{"local_blocks": "--local-blocks"}``, say; the field names by
        default).

    Returns
    -------
    settings : Settings
        The checked settings at ``budget``.
    derived : dict of str to int
        The derived values that differ from the defaults (empty when the
        defaults fit).

    Raises
    ------
    SettingsError
        A budget below 1, or a given setting that cannot work, naming it
        (as ``names`` spells it) in the message and in ``fields``.
    ValueError
        Settings that :meth:`Settings.check` refuses.
    """
    spell = dict(names or {})

    def name(f: str) -> str:
        return spell.get(f, f)

    d = Settings()
    k = int(budget)
    if k < 1:
        raise SettingsError(f"budget must be at least 1, got {k}")
    derived: Dict[str, int] = {}

    if segments is None:
        # At most an eighth of the row: S = k would make the reserved tail
        # all witnesses and the as-served row none of the learned top-k.
        segs = min(d.segments, max(1, k // 8))
    else:
        segs = int(segments)
        if not 1 <= segs <= ks.MAX_TOPOLOGY_SEGMENTS:
            raise SettingsError(
                f"{name('segments')} must be in 1..{ks.MAX_TOPOLOGY_SEGMENTS}, got {segs}",
                ["segments"],
            )
        if segs > k:
            raise SettingsError(
                f"{name('segments')} ({segs}) cannot exceed the budget ({k}): the witnesses "
                f"need a slot each; lower {name('segments')}, or leave it out to use "
                f"min({d.segments}, max(1, k // 8))",
                ["segments"],
            )

    init = d.init_blocks if init_blocks is None else int(init_blocks)
    local = d.local_blocks if local_blocks is None else int(local_blocks)
    if block_size is None:
        bs = d.block_size
        while bs > 1 and max(init + local, 1) * bs > k:
            bs //= 2
    else:
        bs = int(block_size)
        if bs < 1:
            raise SettingsError(
                f"{name('block_size')} must be at least 1, got {bs}", ["block_size"]
            )
    blocks = k // bs
    if blocks >= 1 and init + local > blocks:
        # Trim what was not given; the newest blocks (the query's own) last.
        if init_blocks is None:
            init = max(0, min(init, blocks - local))
        if local_blocks is None:
            local = max(0, min(local, blocks - init))
        if init + local > blocks:
            given = [f for f, v in (("init_blocks", init_blocks), ("local_blocks", local_blocks),
                                    ("block_size", block_size)) if v is not None]
            raise SettingsError(
                f"{init} init + {local} local blocks of {bs} tokens "
                f"({(init + local) * bs} tokens) exceed the budget ({k}): lower "
                + " or ".join(name(f) for f in given),
                given,
            )

    if sinks is None:
        sink = min(d.sinks, k - 1)
    else:
        sink = int(sinks)
        if sink < 0:
            raise SettingsError(f"{name('sinks')} must be non-negative, got {sink}", ["sinks"])
        if sink >= k:
            raise SettingsError(
                f"{name('sinks')} ({sink}) leaves no slot for the window at the budget "
                f"({k}): lower {name('sinks')}, or leave it out to use min({d.sinks}, k - 1)",
                ["sinks"],
            )

    s = Settings(
        budget=k, segments=segs, block_size=bs, init_blocks=init, local_blocks=local,
        sinks=sink, seed=seed,
    )
    given_values = dict(segments=segments, block_size=block_size, init_blocks=init_blocks,
                        local_blocks=local_blocks, sinks=sinks)
    for f in DERIVED_FIELDS:
        if given_values[f] is None and getattr(s, f) != getattr(d, f):
            derived[f] = getattr(s, f)
    s.check()
    return s, derived


@dataclass
class PolicyResult:
    """One policy's numbers at one budget, over heads and queries.

    ``output_error`` is a ratio, so a few rows whose dense output is near
    zero can dominate it: ``output_error_median`` and ``output_error_p95``
    say how typical the mean is. A policy that cannot run at the budget has
    NaN numbers and a ``note`` saying why.

    Attributes
    ----------
    policy : str
        The policy's name (one of ``POLICIES``).
    budget : int
        The token budget ``k``.
    coverage : float
        Mean segment coverage of the selection.
    recall_mean, recall_p5 : float
        Attention-mass recall: mean, and 5th percentile over heads and
        queries.
    output_error : float
        The mean over (query, query head) of
        ``‖o_sparse − o_dense‖ / ‖o_dense‖``.
    slots_used : float
        Mean distinct valid positions selected.
    select_us_per_query : float
        Selection time per query, in microseconds (NaN: not charged).
    output_error_median, output_error_p95 : float
        The output error's median and 95th percentile.
    note : str or None
        Why the policy could not run (``None`` when it ran).
    """

    policy: str
    budget: int
    coverage: float
    recall_mean: float
    recall_p5: float
    output_error: float
    slots_used: float
    select_us_per_query: float
    output_error_median: float = float("nan")
    output_error_p95: float = float("nan")
    note: Optional[str] = None

    @property
    def ran(self) -> bool:
        """False for a policy that could not run at this budget (``n/a``)."""
        return self.note is None


@dataclass
class Report:
    """Every policy's results at every budget of one evaluation.

    Attributes
    ----------
    workload, source : str
        The workload's name and where it came from.
    settings : list of dict
        Each budget's :class:`Settings`, as dicts.
    n_kv_heads, n_q_heads : int
        The KV heads and query heads evaluated.
    queries : int
        Query positions per head.
    tokens : int
        The context length (the longest, for a pooled report).
    results : list of PolicyResult
        Every policy at every budget.
    seconds : float
        Wall time of the evaluation.
    every_key_budgets : list of int
        The budgets at which every policy selected every visible key of
        every query (the budget holds every context): the numbers there are
        trivially perfect and compare nothing.
    indexer : str
        What the learned top-k ranked by.
    """

    workload: str
    source: str
    settings: List[dict]
    n_kv_heads: int
    n_q_heads: int
    queries: int
    tokens: int
    results: List[PolicyResult] = field(default_factory=list)
    seconds: float = 0.0
    every_key_budgets: List[int] = field(default_factory=list)
    indexer: str = ""

    def oracle_gap(self, budget: int) -> Optional[float]:
        """How far the learned top-k's mean recall sits below the oracle's at
        ``budget``: how good the indexer is (None if either did not run)."""
        got = {r.policy: r for r in self.results if r.budget == budget and r.ran}
        if "learned top-k" not in got or "oracle top-k" not in got:
            return None
        return got["oracle top-k"].recall_mean - got["learned top-k"].recall_mean

    def to_dict(self) -> dict:
        """A JSON-ready dict: NaN (the learned policy's uncharged time, an
        ``n/a`` policy's numbers) becomes None, so ``json.dumps(...,
        allow_nan=False)`` accepts it."""
        d = asdict(self)
        d["results"] = [
            {key: None if isinstance(val, float) and np.isnan(val) else val
             for key, val in asdict(r).items()}
            for r in self.results
        ]
        return d


@dataclass
class _Head:
    """One KV head's tensors, shaped the way the attention functions take
    them: queries ``[n, group, d]``, keys ``[T, 1, d]``, values ``[T, 1, d_v]``."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    index_q: np.ndarray
    index_k: np.ndarray
    learned: dict  # kvselect.indexer_topk's inputs for the learned top-k
    probs: np.ndarray  # [n, group, T] dense attention probabilities (f64)
    dense: np.ndarray  # [n, group, d_v] dense attention output


def _prepare_head(w: Workload, h: int, pos: np.ndarray) -> _Head:
    group = w.n_heads // w.n_kv_heads
    q = np.ascontiguousarray(w.q[h * group : (h + 1) * group][:, pos].transpose(1, 0, 2))
    tokens = w.k.shape[1]
    k = w.k[h].reshape(tokens, 1, -1)
    v = w.v[h].reshape(tokens, 1, -1)
    probs = ks.attention_probabilities(q, k, pos, scale=w.scale)
    dense, _ = ks.dense_attention(q, k, v, pos, scale=w.scale)
    index_q = np.ascontiguousarray(w.index_q[h][pos])
    return _Head(q, k, v, index_q, w.index_k[h], w.learned_inputs(h, pos), probs, dense)


def _group_sum(probs: np.ndarray) -> np.ndarray:
    """The group's summed attention weight per key, in head order in float64:
    what the core's oracle selector ranks by (a KV head's selection serves its
    whole group, so the group's total recall is what it maximises)."""
    out = probs[:, 0].copy()
    for j in range(1, probs.shape[1]):
        out += probs[:, j]
    return out


def _select(head: _Head, pos: np.ndarray, s: Settings) -> Dict[str, tuple]:
    """Every policy's selection ``[n, width]`` (int32, -1 padded) and the
    seconds it took; a policy that cannot run at ``s`` is missing. Every
    selection is charged, the learned top-k (kvselect's native lightning
    indexer) included, and the witness policies include the top-k they
    start from."""
    k, segs = s.budget, s.segments
    lens = (pos + 1).astype(np.int32)
    out: Dict[str, tuple] = {}

    def timed(name: str, fn: Callable[[], np.ndarray]) -> None:
        t0 = time.perf_counter()
        sel = fn()
        out[name] = (sel, time.perf_counter() - t0)

    def learned() -> np.ndarray:
        return ks.indexer_topk(**head.learned, query_pos=pos, topk=k)

    def reserved() -> np.ndarray:
        # Fused: the top k - S in rank order, then the witnesses, one pass.
        return ks.indexer_topk(**head.learned, query_pos=pos, topk=k, num_segments=segs)

    def served_from(rows: np.ndarray) -> float:
        """The scatter on a copy of the learned rows, charged with the
        learned top-k it starts from (computed once, above)."""
        t0 = time.perf_counter()
        ks.scatter_topology_witnesses(rows, lens, segs)
        return learned_secs + time.perf_counter() - t0

    def blocks() -> np.ndarray:
        cfg = ks.BlockSparseConfig(
            s.block_size, k // s.block_size, s.init_blocks, s.local_blocks
        )
        chosen = ks.block_sparse_select(head.index_q[:, None, :], head.index_k, pos, cfg)
        # One call for every row: [n, width * block_size], ascending then -1.
        # width = k // block_size (check() keeps the forced blocks within the
        # budget), so the rows fit in k slots; the rest is padding.
        covered = ks.positions_of_blocks(chosen[:, 0], pos, len(head.index_k), cfg)
        rows = np.full((len(pos), k), -1, dtype=np.int32)
        rows[:, : covered.shape[1]] = covered
        return rows

    learned()  # warm-up, untimed: the first call of a head pays its cold caches
    timed("learned top-k", learned)
    top, learned_secs = out["learned top-k"]
    timed("witnesses (reserved tail)", reserved)
    # As served: the row in rank order, its last S slots the lowest ranked.
    rank_order = top.copy()
    out["witnesses (as served)"] = (rank_order, served_from(rank_order))
    # Engines' rows are unordered (vLLM's top-k kernels): the slots the
    # scatter overwrites are arbitrary members of the row. The shuffle
    # stands for the engine's order, so it is not charged.
    keys = np.random.default_rng(s.seed).random(top.shape)
    keys[top < 0] = 2.0  # padding stays last
    unordered = np.ascontiguousarray(np.take_along_axis(top, np.argsort(keys, axis=1), axis=1))
    out["witnesses (served, unordered)"] = (unordered, served_from(unordered))
    if s.block_sparse_note() is None:
        timed("block-sparse", blocks)
    timed("random null", lambda: ks.Selector.random(k, s.seed).rows(pos, width=k))
    timed("locality null", lambda: ks.Selector.local(k).rows(pos, width=k))
    sinks = min(s.sinks, k - 1)
    timed(
        "sink + window",
        lambda: ks.Selector.sink_window(sinks, k - sinks).rows(pos, width=k),
    )
    timed("oracle top-k", lambda: ks.oracle_topk(_group_sum(head.probs), pos, k, width=k))
    return out


def _measure(
    head: _Head, pos: np.ndarray, sel: np.ndarray, s: Settings, scale: float
) -> Dict[str, np.ndarray]:
    """Per query head and query: coverage, recall, output error, slots used."""
    n, group, tokens = head.probs.shape
    lens = pos + 1
    coverage = ks.segment_coverage_rows(sel, lens, s.segments)
    recall = ks.attention_mass_recall_rows(sel, head.probs.reshape(n * group, tokens))
    sparse, _, _ = ks.sparse_attention(head.q, head.k, head.v, pos, sel[:, None, :], scale=scale)
    error = ks.output_relative_error_rows(sparse, head.dense)
    used = ks.slots_used_rows(sel, lens)
    return {
        "coverage": coverage,
        "recall": recall.reshape(n, group),
        "error": error.reshape(n, group),
        "used": used,
        "every_key": used == lens,
    }


def _runs(
    budgets: Sequence[int], settings: Union[None, Settings, Sequence[Settings]]
) -> List[Settings]:
    """One checked :class:`Settings` per distinct budget (see :func:`evaluate`)."""
    budgets = [int(b) for b in budgets]
    if settings is None or isinstance(settings, Settings):
        per = [settings or Settings()] * len(budgets)
    else:
        per = list(settings)
        if len(per) != len(budgets):
            raise ValueError(
                f"settings: expected one Settings per budget ({len(budgets)}), got {len(per)}"
            )
    # A budget named twice is one experiment, reported once (its first settings).
    chosen: Dict[int, Settings] = {}
    for b, s in zip(budgets, per):
        chosen.setdefault(b, replace(s, budget=b))
    runs = list(chosen.values())
    for r in runs:
        r.check()
    return runs


#: Per (budget, policy): lists of per-row metric arrays, the seconds, and the
#: selections they were spent on (queries × KV heads).
_Acc = Dict[tuple, Dict[str, list]]


def _accumulate(
    workload: Workload,
    runs: Sequence[Settings],
    acc: _Acc,
    progress: Optional[Callable[[Iterable], Iterable]] = None,
) -> None:
    """Every policy at every run's budget on every KV head of ``workload``,
    its per-row numbers appended to ``acc``."""
    pos = np.asarray(workload.query_positions, dtype=np.int64)
    heads: Iterable[int] = range(workload.n_kv_heads)
    if progress is not None:
        heads = progress(heads)
    for h in heads:
        head = _prepare_head(workload, h, pos)
        for s in runs:
            for name, (sel, secs) in _select(head, pos, s).items():
                m = _measure(head, pos, sel, s, workload.scale)
                slot = acc.setdefault(
                    (s.budget, name), {k: [] for k in (*m, "secs", "selections")}
                )
                for key, val in m.items():
                    slot[key].append(val.ravel())
                slot["secs"].append(np.array([secs]))
                slot["selections"].append(np.array([len(pos)]))


def _results(report: Report, runs: Sequence[Settings], acc: _Acc) -> None:
    """The report's results (and every-key budgets) from accumulated rows."""
    nan = float("nan")
    for s in runs:
        every_key = True
        for name in POLICIES:
            if (s.budget, name) not in acc:
                note = s.block_sparse_note() if name == "block-sparse" else None
                report.results.append(
                    PolicyResult(
                        policy=name, budget=s.budget, coverage=nan, recall_mean=nan,
                        recall_p5=nan, output_error=nan, slots_used=nan,
                        select_us_per_query=nan, note=note or "cannot run at these settings",
                    )
                )
                every_key = False
                continue
            m = {key: np.concatenate(v) for key, v in acc[(s.budget, name)].items()}
            every_key = every_key and bool(np.all(m["every_key"]))
            report.results.append(
                PolicyResult(
                    policy=name,
                    budget=s.budget,
                    coverage=float(np.mean(m["coverage"])),
                    recall_mean=float(np.mean(m["recall"])),
                    recall_p5=float(np.percentile(m["recall"], 5)),
                    output_error=float(np.mean(m["error"])),
                    slots_used=float(np.mean(m["used"])),
                    select_us_per_query=float(np.sum(m["secs"]) / np.sum(m["selections"]) * 1e6),
                    output_error_median=float(np.median(m["error"])),
                    output_error_p95=float(np.percentile(m["error"], 95)),
                )
            )
        if every_key:
            report.every_key_budgets.append(s.budget)


def _report_of(workload: Workload, runs: Sequence[Settings]) -> Report:
    return Report(
        workload=workload.name,
        source=workload.source,
        settings=[asdict(r) for r in runs],
        n_kv_heads=workload.n_kv_heads,
        n_q_heads=workload.n_heads,
        queries=len(workload.query_positions),
        tokens=workload.k.shape[1],
        indexer=(
            workload.indexer.description if workload.indexer is not None
            else "index_q · index_k (one index head per KV head)"
        ),
    )


def evaluate(
    workload: Workload,
    budgets: Sequence[int] = (2048,),
    settings: Union[None, Settings, Sequence[Settings]] = None,
    progress: Optional[Callable[[Iterable], Iterable]] = None,
) -> Report:
    """Runs every policy at every budget on every KV head of ``workload``.

    A policy that cannot run at a budget (block-sparse when the budget holds
    no block) is reported with NaN numbers and a note.

    Parameters
    ----------
    workload : Workload
        The tensors to evaluate on.
    budgets : sequence of int
        The token budgets ``k`` (a budget named twice runs once).
    settings : Settings, sequence of Settings, or None
        Everything but the budget: one :class:`Settings` for every budget
        (its ``budget`` is replaced by each of ``budgets``), or one per
        budget, in the order of ``budgets`` (as :func:`derive_settings`
        gives them); ``None``: the defaults.
    progress : callable, optional
        Wraps the iteration over heads (a progress bar, say).

    Returns
    -------
    Report
        Every policy's results at every budget.

    Raises
    ------
    ValueError
        A settings sequence whose length is not the budgets', or settings
        that :meth:`Settings.check` refuses.
    """
    reports, _ = evaluate_many([workload], budgets, settings, progress)
    return reports[0]


def evaluate_many(
    workloads: Iterable[Workload],
    budgets: Sequence[int] = (2048,),
    settings: Union[None, Settings, Sequence[Settings]] = None,
    progress: Optional[Callable[[Iterable], Iterable]] = None,
    on_report: Optional[Callable[[Report], None]] = None,
) -> Tuple[List[Report], Report]:
    """:func:`evaluate` on each workload in turn, and the pooled report.

    Parameters
    ----------
    workloads : iterable of Workload
        Consumed one at a time (pass a generator that loads each dump when
        asked, and memory stays bounded by one dump: only the per-row
        numbers are kept).
    budgets, settings, progress : see :func:`evaluate`
    on_report : callable, optional
        Receives each workload's report as soon as it is done.

    Returns
    -------
    reports : list of Report
        One report per workload, in order.
    pooled : Report
        Numbers over every (query, head) row of every workload, as if they
        were one; its ``n_kv_heads`` and ``n_q_heads`` are the totals,
        ``queries`` the total query positions per head summed over
        workloads, ``tokens`` the longest context.

    Raises
    ------
    ValueError
        No workload at all, a settings sequence whose length is not the
        budgets', or settings that :meth:`Settings.check` refuses.
    """
    runs = _runs(budgets, settings)
    t0 = time.perf_counter()
    pooled: _Acc = {}
    reports: List[Report] = []
    for w in workloads:
        t1 = time.perf_counter()
        acc: _Acc = {}
        _accumulate(w, runs, acc, progress)
        report = _report_of(w, runs)
        _results(report, runs, acc)
        report.seconds = time.perf_counter() - t1
        reports.append(report)
        del w  # the next workload loads with this one released: memory bounded by one
        if on_report is not None:
            on_report(report)
        for key, val in acc.items():
            slot = pooled.setdefault(key, {k: [] for k in val})
            for k, v in val.items():
                slot[k] += v
    if not reports:
        raise ValueError("workloads: expected at least one workload")
    total = Report(
        workload=f"pooled ({len(reports)} workloads)",
        source="; ".join(r.workload for r in reports),
        settings=[asdict(r) for r in runs],
        n_kv_heads=sum(r.n_kv_heads for r in reports),
        n_q_heads=sum(r.n_q_heads for r in reports),
        queries=sum(r.queries for r in reports),
        tokens=max(r.tokens for r in reports),
        indexer="; ".join(dict.fromkeys(r.indexer for r in reports)),
    )
    _results(total, runs, pooled)
    total.seconds = time.perf_counter() - t0
    return reports, total


def _geometry(s: dict) -> str:
    return (
        f"S = {s['segments']} segments, blocks of {s['block_size']} "
        f"({s['init_blocks']} init + {s['local_blocks']} local), {s['sinks']} sinks"
    )


def _num(x: float, fmt: str = ".3f") -> str:
    return "n/a" if np.isnan(x) else format(x, fmt)


def format_table(report: Report) -> str:
    """The report as Markdown tables, one per budget.

    They read well in a terminal too. Budgets at which every policy sees
    every key get one sentence between them instead of tables of trivially
    perfect numbers; a policy that cannot run at a budget reads ``n/a`` with
    the reason.

    Parameters
    ----------
    report : Report
        What :func:`evaluate` or :func:`evaluate_many` returned.

    Returns
    -------
    str
        The tables, lines joined by newlines.
    """
    geometries = {_geometry(s) for s in report.settings}
    uniform = len(geometries) == 1
    lines = [
        f"workload: {report.workload} — {report.source}",
        f"{report.n_kv_heads} KV heads ({report.n_q_heads} query heads), {report.queries} "
        f"query positions each, up to {report.tokens} tokens; "
        + (next(iter(geometries)) if uniform else "settings per budget below")
        + f"; {report.seconds:.1f} s",
        f"learned top-k: kvselect.indexer_topk on {report.indexer}",
    ]
    by_budget = {s["budget"]: s for s in report.settings}
    trivial = set(report.every_key_budgets)
    for budget in sorted({r.budget for r in report.results} - trivial):
        heading = f"budget k = {budget}"
        if not uniform:
            heading += f" ({_geometry(by_budget[budget])})"
        lines += [
            "",
            heading,
            "",
            "| policy | coverage | recall mean | recall p5 | output rel. error mean | "
            "error median | error p95 | slots used | select µs/query |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in report.results:
            if r.budget != budget:
                continue
            if not r.ran:
                lines.append(f"| {r.policy} | " + "n/a | " * 7 + f"n/a: {r.note} |")
                continue
            lines.append(
                f"| {r.policy} | {_num(r.coverage)} | {_num(r.recall_mean)} | "
                f"{_num(r.recall_p5)} | {_num(r.output_error)} | "
                f"{_num(r.output_error_median)} | {_num(r.output_error_p95)} | "
                f"{_num(r.slots_used, '.0f')} | "
                + ("—" if np.isnan(r.select_us_per_query) else f"{r.select_us_per_query:.1f}")
                + " |"
            )
        gap = report.oracle_gap(budget)
        if gap is not None:
            lines += [
                "",
                f"The indexer's quality: the learned top-k's recall is {gap:.3f} below the "
                f"oracle's at this budget.",
            ]
    if trivial:
        ks_ = ", ".join(str(b) for b in sorted(trivial))
        lines += [
            "",
            f"budget{'s' if len(trivial) > 1 else ''} k = {ks_}: every query's context fits "
            f"(the workload has {report.tokens} tokens), "
            f"so every policy sees every key — coverage 1.000, recall 1.000, "
            f"output error 0.000 for all, nothing to compare (no table); use a budget "
            f"below the context.",
        ]
    return "\n".join(lines)


def _import_pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError(
            "--plot needs matplotlib: pip install 'kvselect[plot]' (or pip install matplotlib)"
        ) from e
    return plt


def check_plot() -> None:
    """Checks that :func:`plot` can run: a check to make before a long
    evaluation.

    Returns
    -------
    None

    Raises
    ------
    ImportError
        matplotlib is not installed (the message gives the install command).
    """
    _import_pyplot()


def _settings_title(report: Report) -> str:
    def span(key: str) -> str:
        vals = sorted({s[key] for s in report.settings})
        return str(vals[0]) if len(vals) == 1 else f"{vals[0]}–{vals[-1]}"

    varies = any(len({s[key] for s in report.settings}) > 1
                 for key in ("segments", "block_size"))
    return f"S = {span('segments')}, blocks of {span('block_size')}" + (
        " (per budget)" if varies else ""
    )


def _budget_label(b: int) -> str:
    return str(int(b))


def figure(report: Report) -> Any:
    """The plot as a matplotlib figure.

    Attention-mass recall (left) and mean output relative error (right)
    against budget, one line per policy, the legend below both panels (never
    over a point), budgets on a log axis labelled with their values.

    Parameters
    ----------
    report : Report
        What :func:`evaluate` or :func:`evaluate_many` returned.

    Returns
    -------
    matplotlib.figure.Figure
        The two-panel figure.

    Raises
    ------
    ImportError
        matplotlib is not installed (needs matplotlib).
    """
    plt = _import_pyplot()
    fig, (rec, err) = plt.subplots(1, 2, figsize=(11, 5), dpi=120)
    budgets = sorted({r.budget for r in report.results})
    for name in POLICIES:
        rows = sorted((r for r in report.results if r.policy == name), key=lambda r: r.budget)
        style = dict(
            marker="o",
            label=name,
            linestyle="--" if "null" in name or "oracle" in name else "-",
        )
        x = [r.budget for r in rows]
        rec.plot(x, [r.recall_mean for r in rows], **style)  # NaN (n/a): a gap
        err.plot(x, [r.output_error for r in rows], **style)
    for ax in (rec, err):
        ax.set_xscale("log", base=2)
        ax.set_xticks(budgets)
        ax.set_xticklabels([_budget_label(b) for b in budgets])
        ax.minorticks_off()
        ax.set_xlabel("token budget k per query")
        ax.grid(True, alpha=0.3)
    rec.set_ylabel("attention-mass recall (mean)")
    rec.set_ylim(0, 1.02)
    rec.set_title("attention-mass recall", fontsize=10)
    err.set_ylabel("output relative error (mean)")
    err.set_ylim(bottom=0)
    err.set_title("output error ‖o_sparse − o_dense‖ / ‖o_dense‖", fontsize=10)
    fig.suptitle(
        f"{report.workload} ({report.tokens} tokens): policies at an identical budget — "
        f"{_settings_title(report)}",
        fontsize=11,
    )
    handles, labels = rec.get_legend_handles_labels()
    fig.legend(
        handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False,
        bbox_to_anchor=(0.5, 0.0),
    )
    fig.tight_layout(rect=(0, 0.12, 1, 0.95))
    return fig


def plot(report: Report, path: str) -> None:
    """:func:`figure` written to ``path`` (PNG).

    Parameters
    ----------
    report : Report
        What :func:`evaluate` or :func:`evaluate_many` returned.
    path : str
        Where the PNG is written.

    Returns
    -------
    None

    Raises
    ------
    ImportError
        matplotlib is not installed (``pip install 'kvselect[plot]'``).
    OSError
        ``path`` cannot be written.
    """
    plt = _import_pyplot()
    fig = figure(report)
    fig.savefig(path, format="png")
    plt.close(fig)
