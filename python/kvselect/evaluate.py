"""The experiment the witness spec's metrics exist for: selection policies
compared at one identical token budget.

For every KV head of a workload and every evaluated query position ``i``
(context ``L = i + 1``), each policy picks at most ``k`` key positions; the
harness then measures, per query head:

- **segment coverage** of the selection (``S`` segments of ``[0, L)``);
- **attention-mass recall**: the share of the dense attention row's mass the
  selection keeps (mean, and the 5th percentile over heads and queries);
- **output relative error** ``‖o_sparse − o_dense‖ / ‖o_dense‖`` of sparse
  attention over the selection against dense attention;
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

Every number comes from kvselect's own functions: this module only slices
arrays, calls them and averages what they return.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Sequence

import numpy as np

import kvselect as ks
from kvselect.workloads import Workload

POLICIES = (
    "learned top-k",
    "witnesses (reserved tail)",
    "witnesses (as served)",
    "block-sparse",
    "random null",
    "locality null",
    "sink + window",
    "oracle top-k",
)


@dataclass(frozen=True)
class Settings:
    """What the harness compares at: the budget ``k``, the witness segment
    count ``S``, the block geometry and the nulls' knobs."""

    budget: int = 2048
    segments: int = 64
    block_size: int = 64
    init_blocks: int = 1
    local_blocks: int = 2
    sinks: int = 4
    seed: int = 0

    def check(self) -> None:
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
        if self.block_size < 1 or self.budget // self.block_size < 1:
            raise ValueError(
                f"the budget ({self.budget}) must hold at least one block of "
                f"{self.block_size} tokens"
            )
        if self.block_size * (self.init_blocks + self.local_blocks) > self.budget:
            raise ValueError(
                f"init_blocks + local_blocks ({self.init_blocks} + {self.local_blocks}) "
                f"blocks of {self.block_size} exceed the budget ({self.budget})"
            )


@dataclass
class PolicyResult:
    """One policy's numbers at one budget, averaged over heads and queries."""

    policy: str
    budget: int
    coverage: float
    recall_mean: float
    recall_p5: float
    output_error: float
    slots_used: float
    select_us_per_query: float


@dataclass
class Report:
    workload: str
    source: str
    settings: List[dict]
    n_kv_heads: int
    n_q_heads: int
    queries: int
    tokens: int
    results: List[PolicyResult] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict:
        """A JSON-ready dict: NaN (the learned policy's uncharged time) becomes
        None, so ``json.dumps(..., allow_nan=False)`` accepts it."""
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
    probs: np.ndarray  # [n, group, T] dense attention probabilities (f64)
    dense: np.ndarray  # [n, group, d_v] dense attention output
    index_order: np.ndarray  # [n, T] positions by descending index score


def _prepare_head(w: Workload, h: int, pos: np.ndarray) -> _Head:
    group = w.n_heads // w.n_kv_heads
    q = np.ascontiguousarray(w.q[h * group : (h + 1) * group][:, pos].transpose(1, 0, 2))
    tokens = w.k.shape[1]
    k = w.k[h].reshape(tokens, 1, -1)
    v = w.v[h].reshape(tokens, 1, -1)
    probs = ks.attention_probabilities(q, k, pos, scale=w.scale)
    dense, _ = ks.dense_attention(q, k, v, pos, scale=w.scale)
    index_q = np.ascontiguousarray(w.index_q[h][pos])
    index_k = w.index_k[h]
    # The indexer's scores, future keys masked; a stable descending order is
    # what torch.topk serves (ties to the lower position).
    scores = index_q @ index_k.T
    scores[np.arange(tokens)[None, :] > pos[:, None]] = -np.inf
    order = np.argsort(-scores, axis=1, kind="stable")
    return _Head(q, k, v, index_q, index_k, probs, dense, order)


def _select(head: _Head, pos: np.ndarray, s: Settings) -> Dict[str, tuple]:
    """Every policy's selection ``[n, width]`` (int32, -1 padded) and the
    seconds it took."""
    k, segs = s.budget, s.segments
    n = len(pos)
    lens = (pos + 1).astype(np.int32)
    visible = np.minimum(lens, k)
    # A budget above the workload's tokens is a row wider than the order:
    # its extra slots are padding.
    learned = np.full((n, k), -1, dtype=np.int32)
    width = min(k, head.index_order.shape[1])
    learned[:, :width] = head.index_order[:, :width]
    # A row shorter than k holds future positions past its visible part.
    learned[np.arange(k)[None, :] >= visible[:, None]] = -1
    out: Dict[str, tuple] = {}

    def timed(name: str, fn: Callable[[], np.ndarray]) -> None:
        t0 = time.perf_counter()
        sel = fn()
        out[name] = (sel, time.perf_counter() - t0)

    # The indexer's own top-k is upstream of kvselect: no time is charged.
    out["learned top-k"] = (learned, float("nan"))

    def reserved() -> np.ndarray:
        buf = learned.copy()
        buf[:, k - segs :] = -1
        ks.scatter_topology_witnesses(buf, lens, segs)
        return buf

    def served() -> np.ndarray:
        buf = learned.copy()
        ks.scatter_topology_witnesses(buf, lens, segs)
        return buf

    def blocks() -> np.ndarray:
        cfg = ks.BlockSparseConfig(
            s.block_size, k // s.block_size, s.init_blocks, s.local_blocks
        )
        chosen = ks.block_sparse_select(head.index_q[:, None, :], head.index_k, pos, cfg)
        # One call for every row: [n, width * block_size], ascending then -1.
        # width = k // block_size (check() keeps the forced blocks within the
        # budget), so the rows fit in k slots; the rest is padding.
        covered = ks.positions_of_blocks(chosen[:, 0], pos, len(head.index_k), cfg)
        rows = np.full((n, k), -1, dtype=np.int32)
        rows[:, : covered.shape[1]] = covered
        return rows

    timed("witnesses (reserved tail)", reserved)
    timed("witnesses (as served)", served)
    timed("block-sparse", blocks)
    timed("random null", lambda: ks.Selector.random(k, s.seed).rows(pos, width=k))
    timed("locality null", lambda: ks.Selector.local(k).rows(pos, width=k))
    sinks = min(s.sinks, k - 1)
    timed(
        "sink + window",
        lambda: ks.Selector.sink_window(sinks, k - sinks).rows(pos, width=k),
    )
    group_mean = head.probs.mean(axis=1)
    timed("oracle top-k", lambda: ks.oracle_topk(group_mean, pos, k, width=k))
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
    valid = (sel >= 0) & (sel <= pos[:, None])
    used = np.array([len(np.unique(r[v])) for r, v in zip(sel, valid)])
    return {
        "coverage": coverage,
        "recall": recall.reshape(n, group),
        "error": error.reshape(n, group),
        "used": used,
    }


def evaluate(
    workload: Workload,
    budgets: Sequence[int] = (2048,),
    settings: Optional[Settings] = None,
    progress: Optional[Callable[[Iterable], Iterable]] = None,
) -> Report:
    """Runs every policy at every budget on every KV head of ``workload``.

    ``settings`` gives everything but the budget (its ``budget`` is replaced
    by each of ``budgets``). ``progress`` wraps the iteration over heads (a
    progress bar, say)."""
    base = settings or Settings()
    # A budget named twice is one experiment, reported once.
    unique = list(dict.fromkeys(int(b) for b in budgets))
    runs = [Settings(**{**asdict(base), "budget": b}) for b in unique]
    for r in runs:
        r.check()
    pos = np.asarray(workload.query_positions, dtype=np.int64)
    t0 = time.perf_counter()
    acc: Dict[tuple, Dict[str, list]] = {}
    heads: Iterable[int] = range(workload.n_kv_heads)
    if progress is not None:
        heads = progress(heads)
    for h in heads:
        head = _prepare_head(workload, h, pos)
        for s in runs:
            for name, (sel, secs) in _select(head, pos, s).items():
                m = _measure(head, pos, sel, s, workload.scale)
                slot = acc.setdefault((s.budget, name), {k: [] for k in (*m, "secs")})
                for key, val in m.items():
                    slot[key].append(val.ravel())
                slot["secs"].append(np.array([secs]))
    report = Report(
        workload=workload.name,
        source=workload.source,
        settings=[asdict(r) for r in runs],
        n_kv_heads=workload.n_kv_heads,
        n_q_heads=workload.n_heads,
        queries=len(pos),
        tokens=workload.k.shape[1],
    )
    for s in runs:
        for name in POLICIES:
            m = {key: np.concatenate(v) for key, v in acc[(s.budget, name)].items()}
            report.results.append(
                PolicyResult(
                    policy=name,
                    budget=s.budget,
                    coverage=float(np.mean(m["coverage"])),
                    recall_mean=float(np.mean(m["recall"])),
                    recall_p5=float(np.percentile(m["recall"], 5)),
                    output_error=float(np.mean(m["error"])),
                    slots_used=float(np.mean(m["used"])),
                    select_us_per_query=float(
                        np.sum(m["secs"]) / (len(pos) * workload.n_kv_heads) * 1e6
                    ),
                )
            )
    report.seconds = time.perf_counter() - t0
    return report


def format_table(report: Report) -> str:
    """The report as a Markdown table (it reads well in a terminal too)."""
    lines = [
        f"workload: {report.workload} — {report.source}",
        f"{report.n_kv_heads} KV heads ({report.n_q_heads} query heads), {report.queries} "
        f"query positions each, up to {report.tokens} tokens; "
        f"S = {report.settings[0]['segments']} segments, blocks of "
        f"{report.settings[0]['block_size']}; {report.seconds:.1f} s",
    ]
    for budget in sorted({r.budget for r in report.results}):
        lines += [
            "",
            f"budget k = {budget}",
            "",
            "| policy | coverage | recall mean | recall p5 | output rel. error | slots used | "
            "select µs/query |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r in report.results:
            if r.budget == budget:
                lines.append(
                    f"| {r.policy} | {r.coverage:.3f} | {r.recall_mean:.3f} | {r.recall_p5:.3f} | "
                    f"{r.output_error:.3f} | {r.slots_used:.0f} | "
                    + ("—" if np.isnan(r.select_us_per_query) else f"{r.select_us_per_query:.1f}")
                    + " |"
                )
    return "\n".join(lines)


def plot(report: Report, path: str) -> None:
    """Recall against budget, one line per policy, written to ``path`` (PNG).

    Needs matplotlib (``pip install 'kvselect[plot]'``)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover - exercised via the CLI test
        raise ImportError(
            "--plot needs matplotlib: pip install 'kvselect[plot]' (or pip install matplotlib)"
        ) from e
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for name in POLICIES:
        rows = sorted((r for r in report.results if r.policy == name), key=lambda r: r.budget)
        ax.plot(
            [r.budget for r in rows],
            [r.recall_mean for r in rows],
            marker="o",
            label=name,
            linestyle="--" if "null" in name or "oracle" in name else "-",
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("token budget k per query")
    ax.set_ylabel("attention-mass recall (mean)")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"{report.workload}: recall at an identical budget")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
