"""The evaluation's results: one row per policy and budget, the report, its
table and its plot (part of :mod:`kvselect.evaluate`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, List, Optional

import numpy as np

from kvselect.evaluate.settings import POLICIES


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
        Time of the evaluation: a workload's, its tasks' run times summed
        (one task per KV head, wherever it ran); the pooled report's, the
        wall time of the whole run.
    every_key_budgets : list of int
        The budgets at which every policy selected every visible key of
        every query (the budget holds every context): the numbers there are
        trivially perfect and compare nothing.
    indexer : str
        What the learned top-k ranked by.
    layers : int
        The workload's layers (the most of any pooled workload).
    boundary : int or None
        The boundary experiment's ``P`` on this workload (None: the
        per-query experiment; a pooled report of workloads with different
        ``P``: -1).
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
    boundary: Optional[int] = None
    layers: int = 1

    def oracle_gap(self, budget: int) -> Optional[float]:
        """How far the learned top-k's mean recall sits below the oracle's at
        ``budget``: how good the indexer is (None if either did not run).

        Parameters
        ----------
        budget : int
            One of the report's budgets.

        Returns
        -------
        float or None
            The oracle's mean recall minus the learned top-k's, or None.
        """
        got = {r.policy: r for r in self.results if r.budget == budget and r.ran}
        if "learned top-k" not in got or "oracle top-k" not in got:
            return None
        return got["oracle top-k"].recall_mean - got["learned top-k"].recall_mean

    def to_dict(self) -> dict:
        """A JSON-ready dict: NaN (the learned policy's uncharged time, an
        ``n/a`` policy's numbers) becomes None, so ``json.dumps(...,
        allow_nan=False)`` accepts it.

        Returns
        -------
        dict
            The report's fields, ``results`` one dict per row.
        """
        d = asdict(self)
        d["results"] = [
            {key: None if isinstance(val, float) and np.isnan(val) else val for key, val in asdict(r).items()}
            for r in self.results
        ]
        return d


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
        if by_budget[budget].get("boundary") is not None:
            at = "each workload's P" if report.boundary in (None, -1) else f"P = {report.boundary}"
            heading += (
                f"; the boundary experiment at {at}: equal budgets, every policy's query at p >= P reads "
                f"{budget} prefix positions (an eviction policy's kept ones, a per-query policy's choice "
                f"among 0..P-1) plus the p - P + 1 arrivals P..p; only queries at or after P are scored"
            )
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
        ran = {r.policy for r in report.results if r.budget == budget and r.ran}
        if "PyramidKV" in ran and report.layers == 1:
            lines += [
                "",
                "PyramidKV: a one-layer workload has no pyramid (kvpress's per-layer budgets need two "
                "layers or more), so its budget is the uniform one and its rows are SnapKV's.",
            ]
        dense = int(by_budget[budget].get("quest_dense_layers", 0))
        if "quest" in ran and report.layers > 1 and dense > 0:
            lines += [
                "",
                f"quest: layers 0..{min(dense, report.layers) - 1} read every position (Quest's model keeps its "
                f"first {dense} layers dense), so its rows there exceed k and its slots used is above "
                f"{budget}; --quest-dense-layers 0 holds it to the identical budget on every layer.",
            ]
        gap = report.oracle_gap(budget)
        if gap is not None:
            lines += [
                "",
                f"The indexer's quality: the learned top-k's recall is {gap:.3f} below the oracle's at this budget.",
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
        raise ImportError("--plot needs matplotlib: pip install 'kvselect[plot]' (or pip install matplotlib)") from e
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

    varies = any(len({s[key] for s in report.settings}) > 1 for key in ("segments", "block_size"))
    return f"S = {span('segments')}, blocks of {span('block_size')}" + (" (per budget)" if varies else "")


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
        f"{report.workload} ({report.tokens} tokens): policies at an identical budget — {_settings_title(report)}",
        fontsize=11,
    )
    handles, labels = rec.get_legend_handles_labels()
    fig.legend(
        handles,
        labels,
        loc="lower center",
        ncol=4,
        fontsize=8,
        frameon=False,
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
