"""The evaluation harness (``kvselect.evaluate``) on a tiny hand-built workload.

Every number the harness reports is recomputed here in plain NumPy/Python
from the definitions (dense softmax, the learned top-k as a stable
descending order of the indexer's scores, the segment-witness merge of the
spec, MiniMax block selection, the nulls, the oracle, and the metrics), not
through kvselect's functions. The one exception is the random null, whose
RNG (ChaCha8) is not reproduced: its rows come from ``ks.Selector.random``
and the check is that the harness scored exactly those rows.

The data are small integers and the softmax scale is 1/2 (``d = 4``), so
every dot product is exact in float32 and every index-score tie is a real
tie: the selections must agree exactly, whatever the summation order.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import kvselect as ks
from kvselect import evaluate
from kvselect.evaluate import POLICIES, PolicyResult, Report, Settings
from kvselect.workloads import Workload

TOKENS = 40
D = 4
D_V = 3
D_INDEX = 3
N_KV = 2
GROUP = 2
# Positions 0, 2 and 5 have contexts (1, 3, 6) shorter than every budget,
# and 1 and 3 are shorter than some segment counts.
POSITIONS = np.array([0, 2, 5, 9, 17, 30, 39], dtype=np.int64)
BUDGETS = [8, 16, 48]  # 48 > TOKENS: a budget above the workload

SETTINGS = {
    "partial blocks": Settings(
        segments=4, block_size=3, init_blocks=1, local_blocks=1, sinks=3, quest_page_size=3, seed=7
    ),
    "no init block": Settings(
        segments=3, block_size=4, init_blocks=0, local_blocks=2, sinks=1, quest_page_size=4, seed=8
    ),
}


def tiny_workload() -> Workload:
    rng = np.random.default_rng(20240607)
    base_q = rng.integers(-2, 3, (N_KV + 1, TOKENS, D))
    # KV head 0's second query head is twice its first: the group-mean
    # probabilities rank keys by the first head's logits (exact ties only).
    # KV head 1's query heads are independent, so its oracle ranks by a true
    # mean; oracle_row checks that no near-tie decides its cut.
    q = np.stack([base_q[0], 2 * base_q[0], base_q[1], base_q[2]])
    k = rng.integers(-2, 3, (N_KV, TOKENS, D))
    v = rng.integers(1, 6, (N_KV, TOKENS, D_V))  # positive: no zero dense output
    index_q = rng.integers(-2, 3, (N_KV, TOKENS, D_INDEX))
    index_k = rng.integers(-2, 3, (N_KV, TOKENS, D_INDEX))
    f32 = lambda a: np.ascontiguousarray(a, dtype=np.float32)  # noqa: E731
    return Workload(
        name="tiny",
        q=f32(q),
        k=f32(k),
        v=f32(v),
        index_q=f32(index_q),
        index_k=f32(index_k),
        head_kinds=("a", "b"),
        query_positions=POSITIONS.copy(),
        scale=0.5,
        source="a hand-built test workload",
    )


@pytest.fixture(scope="module")
def workload() -> Workload:
    return tiny_workload()


# --------------------------------------------------------------------------
# Direct computations from the definitions
# --------------------------------------------------------------------------


def dense_probs(w: Workload, h: int, p: int) -> np.ndarray:
    """float64 ``[group, p + 1]``: softmax of the causal logits of KV head
    ``h``'s query heads at position ``p``."""
    q = w.q[h * GROUP : (h + 1) * GROUP, p].astype(np.float64)
    logits = q @ w.k[h, : p + 1].astype(np.float64).T * w.scale
    logits -= logits.max(axis=1, keepdims=True)
    e = np.exp(logits)
    return e / e.sum(axis=1, keepdims=True)


def top_k_by(scores: np.ndarray, k: int) -> list:
    """The ``k`` positions with the largest scores, descending, ties to the
    lower position (what a stable descending sort serves)."""
    return sorted(range(len(scores)), key=lambda j: (-scores[j], j))[:k]


def learned_row(w: Workload, h: int, p: int, k: int) -> list:
    L = p + 1
    scores = w.index_k[h, :L].astype(np.float64) @ w.index_q[h, p].astype(np.float64)
    row = top_k_by(scores, k)
    return row + [-1] * (k - len(row))


def witnesses(row: list, L: int, S: int) -> list:
    """The left edges ``ceil(s L / S_eff)`` of the segments ``s < S_eff`` no
    entry of ``row`` occupies (``sigma(x) = floor(x S_eff / L)``), ascending."""
    s_eff = min(S, L)
    occupied = {min(x * s_eff // L, S - 1) for x in row if x >= 0}
    return [-(-s * L // s_eff) for s in range(s_eff) if s not in occupied]


def reserved_tail_row(learned: list, L: int, S: int) -> list:
    k = len(learned)
    row = learned[: k - S] + [-1] * S  # top k - S learned, then S padding slots
    for i, e in enumerate(witnesses(row, L, S)[:S]):
        row[k - S + i] = e
    return row


def as_served_row(learned: list, L: int, S: int) -> list:
    k = len(learned)
    row = list(learned)  # occupancy is read from the whole row, tail included
    for i, e in enumerate(witnesses(learned, L, S)[:S]):
        row[k - S + i] = e
    return row


def block_sparse_row(w: Workload, h: int, p: int, s: Settings) -> list:
    bs, top = s.block_size, s.budget // s.block_size
    n_vis = min(p + 1, TOKENS)
    n_blocks = -(-n_vis // bs)
    dots = w.index_k[h, :n_vis].astype(np.float64) @ w.index_q[h, p].astype(np.float64)
    score = [max(dots[b * bs : min((b + 1) * bs, n_vis)]) for b in range(n_blocks)]
    forced = set(range(min(s.init_blocks, n_blocks)))
    forced |= set(range(max(n_blocks - s.local_blocks, 0), n_blocks))
    room = min(max(top, len(forced)), n_blocks) - len(forced)
    free = [b for b in range(n_blocks) if b not in forced]
    chosen = set(forced) | set(sorted(free, key=lambda b: (-score[b], b))[: max(room, 0)])
    return [x for b in sorted(chosen) for x in range(b * bs, min((b + 1) * bs, n_vis))]


def quest_row(w: Workload, h: int, p: int, s: Settings) -> list:
    """Quest's kernel path on the group-mean query: every page when they fit
    ``k // page`` pages, else the last page and the best of the others
    (score descending, page ascending)."""
    page, units = s.quest_page_size, s.budget // s.quest_page_size
    L = p + 1
    n_pages = -(-L // page)
    q = w.q[h * GROUP : (h + 1) * GROUP, p].astype(np.float64).mean(axis=0)
    keys = w.k[h, :L].astype(np.float64)
    score = []
    for b in range(n_pages):
        blk = keys[b * page : (b + 1) * page]
        score.append(float(np.maximum(q * blk.max(axis=0), q * blk.min(axis=0)).sum()))
    if n_pages <= units:
        chosen = list(range(n_pages))
    else:
        chosen = sorted(sorted(range(n_pages - 1), key=lambda b: (-score[b], b))[: units - 1] + [n_pages - 1])
    return [x for b in chosen for x in range(b * page, min((b + 1) * page, L))]


def infllm_row(w: Workload, h: int, p: int, s: Settings) -> list:
    """InfLLM-v2 (the CUDA pooling, MiniCPM4.1's filter) from the NumPy twin, at the
    policy's geometry (kvselect.rules.infllm.geometry: blocks halved until the init
    block, the window and the current block fit the budget)."""
    from kvselect.reference import infllm as RI
    from kvselect.rules.infllm import geometry

    b, init, local = geometry(s)
    st = max(1, b // 4)
    L = p + 1
    keys = w.k[h, :L].astype(np.float32)[:, None, :]
    ck = RI.compress_keys(keys, 2 * st, st)
    q = w.q[h * GROUP : (h + 1) * GROUP, p].astype(np.float32)[None]
    blocks = RI.infllm_select(
        q,
        ck,
        L,
        s.budget // b,
        init_blocks=init,
        local_blocks=local,
        block_size=b,
        kernel_size=2 * st,
        kernel_stride=st,
    )[0, 0]
    return [x for blk in sorted(blocks[blocks >= 0].tolist()) for x in range(blk * b, min((blk + 1) * b, L))]


def nsa_row(w: Workload, h: int, p: int, s: Settings) -> list:
    """NSA as fla selects (block 0 and the query's last two forced) from the NumPy twin,
    at the policy's geometry (kvselect.rules.nsa.geometry: blocks halved until 4 fit)."""
    from kvselect.reference import nsa as RN
    from kvselect.rules.nsa import geometry

    b = geometry(s)
    L = p + 1
    keys = w.k[h, :L].astype(np.float32)[:, None, :]
    q = w.q[h * GROUP : (h + 1) * GROUP, p].astype(np.float32)[None]
    blocks = RN.nsa_select(q, keys, s.budget // b, block_size=b)[0, 0]
    return [x for blk in sorted(blocks[blocks >= 0].tolist()) for x in range(blk * b, min((blk + 1) * b, L))]


def nsa_eq9_row(w: Workload, h: int, p: int, s: Settings) -> list:
    """NSA with the paper's Eq. 9 window from the NumPy twin, at the policy's geometry:
    blocks as ``nsa_row``'s, compressed keys of half a block every quarter block (at least
    1 token), the same number of blocks."""
    from kvselect.reference import nsa as RN
    from kvselect.rules.nsa import geometry

    b = geometry(s)
    kz, st = max(b // 2, 1), max(b // 4, 1)
    L = p + 1
    keys = w.k[h, :L].astype(np.float32)[:, None, :]
    q = w.q[h * GROUP : (h + 1) * GROUP, p].astype(np.float32)[None]
    blocks = RN.nsa_select(q, keys, s.budget // b, block_size=b, window="eq9", kernel_size=kz, kernel_stride=st)
    blocks = blocks[0, 0]
    return [x for blk in sorted(blocks[blocks >= 0].tolist()) for x in range(blk * b, min((blk + 1) * b, L))]


def moba_row(w: Workload, h: int, p: int, s: Settings) -> list:
    """MoBA's efficient code on the group-mean query, from its statement: blocks of MoBA's
    chunk 4096 halved until 12 fit the budget, ``k // B`` of them, the query's current
    block forced, the rest the completed past blocks by ``q . mean(K)`` (gate descending,
    block ascending); at one block, the current block alone."""
    b = 4096
    while s.budget // b < 12 and b > 1:
        b //= 2
    topk, L, c = s.budget // b, p + 1, p // b
    q = w.q[h * GROUP : (h + 1) * GROUP, p].astype(np.float64).mean(axis=0)
    keys = w.k[h, :L].astype(np.float64)
    gate = [float(q @ keys[x * b : (x + 1) * b].mean(axis=0)) for x in range(c)]
    past = sorted(range(c), key=lambda x: (-gate[x], x))[: topk - 1] if topk > 1 else []
    return [x for blk in sorted(past) + [c] for x in range(blk * b, min((blk + 1) * b, L))]


def qsa_row(w: Workload, h: int, p: int, k: int) -> list:
    """Qwen's QSA (transformers' Qwen4ExpTextQSAIndexer.forward): complete
    blocks of 4 tokens, each scored relu(q . mean of its index keys) (one
    head, no weights), the best (k - 3) // 4 of them as their tokens (ties to
    the lower block), then the tail tokens of the partial block. The means of
    4 small integers are exact in float32."""
    r = 4 if k >= 7 else max(1, (k + 1) // 2)
    blocks, complete = (k - (r - 1)) // r, (p + 1) // r
    keys = w.index_k[h].astype(np.float64)
    q = w.index_q[h, p].astype(np.float64)
    scores = np.array([max(float(q @ keys[b * r : (b + 1) * r].mean(axis=0)), 0.0) for b in range(complete)])
    best = top_k_by(scores, blocks)
    return [b * r + j for b in best for j in range(r)] + list(range(complete * r, p + 1))


def locality_row(p: int, k: int) -> list:
    L = p + 1
    return list(range(max(0, L - k), L))


def sink_window_row(p: int, k: int, sinks: int) -> list:
    L = p + 1
    sinks = min(sinks, k - 1)
    window = k - sinks
    if L <= sinks + window:
        return list(range(L))
    return list(range(sinks)) + list(range(L - window, L))


def oracle_row(probs: np.ndarray, k: int) -> list:
    mean = probs.sum(axis=0)  # the group's total weight (the core's rule)
    row = top_k_by(mean, k)
    if len(row) < len(mean):  # the cut must not fall on a near-tie (test data guard)
        gap = abs(mean[row[-1]] - max(np.delete(mean, row)))
        assert gap == 0 or gap > 1e-9 * mean[row[-1]], "near-tie at the oracle's cut"
    return row


def expected_selections(w: Workload, h: int, s: Settings) -> dict:
    """Every policy's rows for KV head ``h`` (lists of positions, -1 allowed)."""
    k, S = s.budget, s.segments
    random_rows = ks.Selector.random(k, s.seed).rows(POSITIONS, width=k)
    learned_rows = np.array([learned_row(w, h, p, k) for p in POSITIONS.tolist()])
    # The engine's order: the harness's seeded shuffle of each row's members.
    keys = np.random.default_rng(s.seed).random(learned_rows.shape)
    keys[learned_rows < 0] = 2.0
    shuffled = np.take_along_axis(learned_rows, np.argsort(keys, axis=1), axis=1)
    out: dict = {name: [] for name in POLICIES}
    for i, p in enumerate(POSITIONS.tolist()):
        L = p + 1
        learned = learned_rows[i].tolist()
        out["learned top-k"].append(learned)
        out["witnesses (reserved tail)"].append(reserved_tail_row(learned, L, S))
        out["witnesses (as served)"].append(as_served_row(learned, L, S))
        out["witnesses (served, unordered)"].append(as_served_row(shuffled[i].tolist(), L, S))
        out["block-sparse"].append(block_sparse_row(w, h, p, s))
        out["quest"].append(quest_row(w, h, p, s))
        out["infllm"].append(infllm_row(w, h, p, s))
        out["nsa"].append(nsa_row(w, h, p, s))
        out["nsa (Eq. 9)"].append(nsa_eq9_row(w, h, p, s))
        out["moba"].append(moba_row(w, h, p, s))
        out["QSA (Qwen)"].append(qsa_row(w, h, p, k))
        out["random null"].append(random_rows[i].tolist())
        out["locality null"].append(locality_row(p, k))
        out["sink + window"].append(sink_window_row(p, k, s.sinks))
        out["oracle top-k"].append(oracle_row(dense_probs(w, h, p), k))
    return out


def row_metrics(w: Workload, h: int, p: int, row: list, S: int) -> tuple:
    """(coverage, recalls per query head, output errors per query head, slots used)."""
    L = p + 1
    chosen = sorted({x for x in row if 0 <= x < L})
    s_eff = min(S, L)
    coverage = len({x * s_eff // L for x in chosen}) / s_eff
    probs = dense_probs(w, h, p)
    recall = probs[:, chosen].sum(axis=1) / probs.sum(axis=1)
    v = w.v[h, :L].astype(np.float64)
    dense = probs @ v
    q = w.q[h * GROUP : (h + 1) * GROUP, p].astype(np.float64)
    logits = q @ w.k[h, chosen].astype(np.float64).T * w.scale
    logits -= logits.max(axis=1, keepdims=True)
    e = np.exp(logits)
    sparse = (e / e.sum(axis=1, keepdims=True)) @ v[chosen]
    error = np.linalg.norm(sparse - dense, axis=1) / np.linalg.norm(dense, axis=1)
    return coverage, recall, error, len(chosen)


def expected_results(w: Workload, s: Settings) -> dict:
    """policy -> (coverage, recall mean, recall p5, output error mean, slots used,
    output error median, output error p95)."""
    per: dict = {name: ([], [], [], []) for name in POLICIES}
    for h in range(N_KV):  # the harness's order: KV head, then query
        for name, rows in expected_selections(w, h, s).items():
            for p, row in zip(POSITIONS.tolist(), rows):
                cov, rec, err, used = row_metrics(w, h, p, row, s.segments)
                per[name][0].append(cov)
                per[name][1].extend(rec)
                per[name][2].extend(err)
                per[name][3].append(used)
    return {
        name: (
            float(np.mean(cov)),
            float(np.mean(rec)),
            float(np.percentile(rec, 5)),
            float(np.mean(err)),
            float(np.mean(used)),
            float(np.median(err)),
            float(np.percentile(err, 95)),
        )
        for name, (cov, rec, err, used) in per.items()
    }


# --------------------------------------------------------------------------
# The reported numbers
# --------------------------------------------------------------------------


@pytest.fixture(scope="module", params=list(SETTINGS), ids=list(SETTINGS))
def run(request, workload):
    settings = SETTINGS[request.param]
    return settings, evaluate.evaluate(workload, budgets=BUDGETS, settings=settings)


def test_every_reported_number_matches_a_direct_computation(workload, run):
    base, report = run
    for budget in BUDGETS:
        s = Settings(**{**base.__dict__, "budget": budget})
        expected = expected_results(workload, s)
        got = {r.policy: r for r in report.results if r.budget == budget}
        assert set(got) == set(POLICIES)
        for name in POLICIES:
            cov, rec_mean, rec_p5, err, used, err_median, err_p95 = expected[name]
            r = got[name]
            where = f"{name} at k = {budget}"
            assert r.ran and r.note is None, where
            assert r.coverage == cov, where
            assert r.slots_used == used, where
            assert r.recall_mean == pytest.approx(rec_mean, abs=1e-9), where
            assert r.recall_p5 == pytest.approx(rec_p5, abs=1e-9), where
            assert r.output_error == pytest.approx(err, rel=1e-4, abs=1e-5), where
            assert r.output_error_median == pytest.approx(err_median, rel=1e-4, abs=1e-5), where
            assert r.output_error_p95 == pytest.approx(err_p95, rel=1e-4, abs=1e-5), where


def test_the_hand_computations_are_not_trivial(workload, run):
    """Guards the test data: the policies must disagree, or matching every
    number would prove little."""
    base, report = run
    at8 = {r.policy: r for r in report.results if r.budget == 8}
    assert len({round(r.recall_mean, 9) for r in at8.values()}) >= 5
    assert at8["oracle top-k"].recall_mean > at8["locality null"].recall_mean
    assert min(r.coverage for r in at8.values()) < 1.0
    assert 0 < at8["witnesses (as served)"].output_error
    # Contexts shorter than the budget: a policy uses fewer than k slots.
    assert at8["locality null"].slots_used < 8


def test_the_reserved_tail_covers_every_segment_at_every_budget(run):
    _, report = run
    for r in report.results:
        if r.policy == "witnesses (reserved tail)":
            assert r.coverage == 1.0, r.budget


def test_as_served_witnesses_can_uncover_a_segment_the_reserved_tail_keeps():
    """The spec's caveat, built on purpose: one query at 39 (L = 40), k = 8,
    S = 4 segments of 10. The indexer ranks 0, 1, 2, 3 | 10, 20, 4, 5, so
    the last S slots hold 10 and 20, the only keys of segments 1 and 2.
    As served, segment 3's witness (30) overwrites slot 4 (key 10): segment 1
    is lost. The reserved tail keeps 0..3 and writes 10, 20, 30."""
    tokens = 40
    index_k = np.zeros((1, tokens, 1), dtype=np.float32)
    for score, x in zip([10, 9, 8, 7, 6, 5, 4, 3], [0, 1, 2, 3, 10, 20, 4, 5]):
        index_k[0, x, 0] = score
    rng = np.random.default_rng(3)
    w = Workload(
        name="caveat",
        q=rng.integers(-2, 3, (1, tokens, 4)).astype(np.float32),
        k=rng.integers(-2, 3, (1, tokens, 4)).astype(np.float32),
        v=rng.integers(1, 6, (1, tokens, 2)).astype(np.float32),
        index_q=np.ones((1, tokens, 1), dtype=np.float32),
        index_k=index_k,
        head_kinds=("h",),
        query_positions=np.array([39], dtype=np.int64),
        scale=0.5,
        source="the as-served caveat",
    )
    report = evaluate.evaluate(w, budgets=[8], settings=Settings(segments=4, block_size=4, local_blocks=1))
    got = {r.policy: r for r in report.results}
    learned = [0, 1, 2, 3, 10, 20, 4, 5]
    assert as_served_row(learned, 40, 4) == [0, 1, 2, 3, 30, 20, 4, 5]
    assert reserved_tail_row(learned, 40, 4) == [0, 1, 2, 3, 10, 20, 30, -1]
    assert got["learned top-k"].coverage == 0.75  # segments 0, 1, 2
    assert got["witnesses (as served)"].coverage == 0.75  # segments 0, 2, 3
    assert got["witnesses (reserved tail)"].coverage == 1.0
    assert got["witnesses (reserved tail)"].slots_used == 7
    assert got["witnesses (as served)"].slots_used == 8


def test_a_budget_above_the_workload_selects_every_key_for_every_policy(workload, run):
    _, report = run
    context_mean = float(np.mean(POSITIONS + 1))
    for r in report.results:
        if r.budget == 48:
            assert r.coverage == 1.0, r.policy
            assert r.recall_mean == pytest.approx(1.0, abs=1e-12), r.policy
            assert r.slots_used == context_mean, r.policy
            assert r.output_error < 1e-5, r.policy


def test_random_null_is_scored_on_the_selector_rows_of_the_settings_seed(workload):
    k = 8
    rows = ks.Selector.random(k, 7).rows(POSITIONS, width=k)
    # Same seed, same rows; another seed, other rows.
    np.testing.assert_array_equal(rows, ks.Selector.random(k, 7).rows(POSITIONS, width=k))
    assert not np.array_equal(rows, ks.Selector.random(k, 8).rows(POSITIONS, width=k))
    for i, p in enumerate(POSITIONS.tolist()):
        valid = rows[i][rows[i] >= 0]
        assert len(set(valid.tolist())) == len(valid) == min(k, p + 1)
        assert valid.max() <= p
    for seed in (7, 8):
        s = Settings(budget=k, segments=4, block_size=4, init_blocks=1, local_blocks=1, seed=seed)
        report = evaluate.evaluate(workload, budgets=[k], settings=s)
        (got,) = [r for r in report.results if r.policy == "random null"]
        seed_rows = ks.Selector.random(k, seed).rows(POSITIONS, width=k)
        recalls = [
            row_metrics(workload, h, p, seed_rows[i].tolist(), 4)[1]
            for h in range(N_KV)
            for i, p in enumerate(POSITIONS.tolist())
        ]
        assert got.recall_mean == pytest.approx(float(np.mean(recalls)), abs=1e-9)


# --------------------------------------------------------------------------
# Report shape, timing, table, progress
# --------------------------------------------------------------------------


def test_a_sweep_reports_one_result_per_budget_and_policy_in_policies_order(run):
    base, report = run
    assert [(r.budget, r.policy) for r in report.results] == [(b, name) for b in BUDGETS for name in POLICIES]
    assert [s["budget"] for s in report.settings] == BUDGETS
    assert all(s["segments"] == base.segments for s in report.settings)
    assert (report.n_kv_heads, report.n_q_heads, report.queries, report.tokens) == (
        N_KV,
        N_KV * GROUP,
        len(POSITIONS),
        TOKENS,
    )
    assert (report.workload, report.source) == ("tiny", "a hand-built test workload")
    assert report.seconds > 0


def test_every_policy_is_charged_its_time_the_learned_top_k_included(run):
    _, report = run
    for r in report.results:
        assert math.isfinite(r.select_us_per_query) and r.select_us_per_query > 0, r.policy


def test_the_learned_top_k_of_a_dsa_indexer_is_the_reference_lightning_indexer():
    """A workload with a DSA indexer (multi-head index queries, per-query
    weights, fp8 keys with scales): the learned rows the harness scores are
    exactly the reference lightning indexer's, in rank order."""
    from kvselect import reference as ref
    from kvselect.workloads import Indexer, quantize_fp8

    w0 = tiny_workload()
    rng = np.random.default_rng(11)
    heads = 3
    iq = rng.integers(-2, 3, (N_KV, TOKENS, heads, D_INDEX)).astype(np.float32)
    iw = rng.integers(1, 3, (N_KV, TOKENS, heads)).astype(np.float32)
    k8, scale = quantize_fp8(rng.integers(-3, 4, (N_KV, TOKENS, D_INDEX)).astype(np.float32))
    indexer = Indexer(iq, iw, k8, scale, "float8_e4m3fn", np.arange(N_KV), "test")
    w = Workload(**{**{f: getattr(w0, f) for f in w0.__dataclass_fields__}, "indexer": indexer})
    s = Settings(segments=4, block_size=4, init_blocks=1, local_blocks=1, sinks=2, budget=8)
    for h in range(N_KV):
        head = evaluate._prepare_head(w.head_inputs(h, POSITIONS), POSITIONS, w.scale)
        rows, secs = evaluate._select(head, POSITIONS, s)["learned top-k"]
        want = ref.indexer_topk(
            iq[h][POSITIONS], iw[h][POSITIONS], k8[h], POSITIONS, 8, key_scale=scale[h], key_format="float8_e4m3fn"
        )
        assert np.array_equal(rows, want) and secs > 0
        # The fused reserved tail is the reference's too.
        got = evaluate._select(head, POSITIONS, s)["witnesses (reserved tail)"][0]
        assert np.array_equal(
            got,
            ref.indexer_topk(
                iq[h][POSITIONS],
                iw[h][POSITIONS],
                k8[h],
                POSITIONS,
                8,
                key_scale=scale[h],
                key_format="float8_e4m3fn",
                num_segments=4,
            ),
        )


def test_the_report_dict_is_strict_json_and_round_trips(run):
    _, report = run
    d = report.to_dict()
    text = json.dumps(d, allow_nan=False)  # NaN is not JSON: it must be gone
    back = json.loads(text)
    assert len(back["results"]) == len(BUDGETS) * len(POLICIES)
    first = back["results"][0]
    assert first["policy"] == "learned top-k" and first["select_us_per_query"] > 0
    # A policy that could not run: its NaN numbers become None.
    na = evaluate.evaluate(
        tiny_workload(),
        budgets=[2],
        settings=Settings(segments=2, block_size=4, init_blocks=0, local_blocks=1, sinks=1),
    ).to_dict()
    blocks = next(r for r in na["results"] if r["policy"] == "block-sparse")
    assert blocks["recall_mean"] is None and blocks["note"]
    json.dumps(na, allow_nan=False)
    for got, r in zip(back["results"], report.results):
        assert got["recall_mean"] == r.recall_mean
        assert got["coverage"] == r.coverage
    assert back["tokens"] == TOKENS
    assert back["settings"][0]["budget"] == BUDGETS[0]


def test_the_table_names_every_policy_and_budget_below_the_context(run):
    _, report = run
    table = evaluate.format_table(report)
    for b in (8, 16):
        assert f"budget k = {b}\n" in table
    for name in POLICIES:
        assert table.count(f"| {name} |") == 2  # k = 48 holds the context: no table
    assert "tiny" in table
    assert "—" in table  # the learned policy's uncharged time
    assert "error median" in table and "error p95" in table


def test_a_budget_holding_every_context_is_said_once_instead_of_a_table(run):
    _, report = run
    assert report.every_key_budgets == [48]
    table = evaluate.format_table(report)
    assert table.count("every policy sees every key") == 1
    assert "budget k = 48: every query's context fits" in table
    assert "budget k = 48\n" not in table


def test_a_budget_equal_to_the_context_is_a_table_when_a_policy_still_drops_keys(workload):
    """k = 40 = the context: the reserved tail keeps k - S learned keys, so it
    does not see every key and the numbers still compare something."""
    s = SETTINGS["partial blocks"]
    report = evaluate.evaluate(workload, budgets=[40, 48], settings=s)
    assert report.every_key_budgets == [48]
    (tail,) = [r for r in report.results if r.budget == 40 and r.policy == "witnesses (reserved tail)"]
    assert tail.recall_mean < 1.0
    table = evaluate.format_table(report)
    assert "budget k = 40\n" in table
    assert "budget k = 48: every query's context fits" in table


def test_the_progress_callable_wraps_the_iteration_over_kv_heads(workload):
    seen = []

    def progress(heads):
        for h in heads:
            seen.append(h)
            yield h

    report = evaluate.evaluate(
        workload,
        budgets=[8],
        settings=Settings(segments=4, block_size=4, init_blocks=1, local_blocks=1),
        progress=progress,
    )
    assert seen == list(range(N_KV))
    assert len(report.results) == len(POLICIES)


def test_the_settings_budget_is_replaced_by_each_budget_of_the_sweep(workload):
    s = Settings(budget=1, segments=4, block_size=4, init_blocks=1, local_blocks=1)
    report = evaluate.evaluate(workload, budgets=[8], settings=s)
    assert {r.budget for r in report.results} == {8}
    assert report.settings[0]["budget"] == 8


def test_a_budget_named_twice_is_measured_and_reported_once(workload):
    # (pages of 4: Quest runs at k = 8, so every row is a number, not n/a's NaN)
    s = Settings(budget=8, segments=4, block_size=4, init_blocks=1, local_blocks=1, quest_page_size=4)
    once = evaluate.evaluate(workload, budgets=[8], settings=s)
    twice = evaluate.evaluate(workload, budgets=[8, 16, 8], settings=s)
    assert [r.budget for r in twice.results] == [8] * len(POLICIES) + [16] * len(POLICIES)
    for a, b in zip(once.results, twice.results):
        assert (a.policy, a.coverage, a.recall_mean, a.slots_used) == (
            b.policy,
            b.coverage,
            b.recall_mean,
            b.slots_used,
        )


def test_returned_results_are_policy_results():
    r = evaluate.evaluate(
        tiny_workload(),
        budgets=[8],
        settings=Settings(segments=2, block_size=4, init_blocks=1, local_blocks=1),
    )
    assert isinstance(r, Report)
    assert all(isinstance(x, PolicyResult) for x in r.results)


# --------------------------------------------------------------------------
# Settings refusals
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(budget=0), "budget must be at least 1"),
        (dict(budget=8, segments=9, block_size=4, local_blocks=1), "cannot exceed the budget"),
        (dict(budget=128, segments=65), "segments must be in 1..64"),
        (dict(budget=128, segments=0), "segments must be in 1..64"),
        (dict(budget=16, segments=4, block_size=0), "block_size must be at least 1"),
        (dict(budget=16, segments=4, block_size=8, init_blocks=1, local_blocks=2), "exceed the budget"),
    ],
)
def test_inconsistent_settings_are_refused_with_a_message(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Settings(**kwargs).check()


def test_consistent_settings_pass_the_check():
    Settings().check()
    Settings(budget=8, segments=8, block_size=4, init_blocks=1, local_blocks=1).check()
    Settings(budget=1, segments=1, block_size=1, init_blocks=0, local_blocks=1).check()


def test_one_inconsistent_budget_refuses_the_whole_sweep_before_any_work(workload):
    calls = []
    with pytest.raises(ValueError, match=r"segments \(4\) cannot exceed the budget \(2\)"):
        evaluate.evaluate(
            workload,
            budgets=[8, 2],
            settings=Settings(segments=4, block_size=1, init_blocks=1, local_blocks=1),
            progress=lambda heads: calls.append(1) or heads,
        )
    assert calls == []


# --------------------------------------------------------------------------
# A policy that cannot run at a budget; settings derived from the budget
# --------------------------------------------------------------------------


def test_a_block_larger_than_the_budget_is_not_refused_block_sparse_is_na(workload):
    s = Settings(budget=8, segments=4, block_size=16, init_blocks=1, local_blocks=2, quest_page_size=4)
    s.check()  # not refused: only block-sparse cannot run
    assert s.block_sparse_note() == "the budget (8) holds no block of 16 tokens"
    report = evaluate.evaluate(workload, budgets=[8, 48], settings=s)
    by = {(r.budget, r.policy): r for r in report.results}
    na = by[(8, "block-sparse")]
    assert not na.ran and na.note == s.block_sparse_note()
    assert math.isnan(na.recall_mean) and math.isnan(na.slots_used)
    # The others ran, and match a run at a block size that fits.
    other = evaluate.evaluate(
        workload, budgets=[8], settings=Settings(budget=8, segments=4, block_size=2, quest_page_size=4)
    )
    for r in other.results:
        if r.policy not in ("block-sparse", "random null"):
            assert by[(8, r.policy)].ran
            assert by[(8, r.policy)].recall_mean == r.recall_mean, r.policy
    assert by[(48, "block-sparse")].ran  # 48 holds three blocks of 16
    table = evaluate.format_table(report)
    assert "| block-sparse | n/a |" in table
    assert "the budget (8) holds no block of 16 tokens" in table
    d = json.loads(json.dumps(report.to_dict(), allow_nan=False))
    (row,) = [r for r in d["results"] if r["budget"] == 8 and r["policy"] == "block-sparse"]
    assert row["recall_mean"] is None and row["note"] == s.block_sparse_note()
    assert report.every_key_budgets == [48]


def test_derive_settings_keeps_the_defaults_wherever_they_fit():
    for k in (512, 1024, 2048, 100_000):
        s, derived = evaluate.derive_settings(k)
        assert derived == {}, k
        assert s == Settings(budget=k)


@pytest.mark.parametrize(
    "k, expected",
    [
        (1, dict(segments=1, block_size=1, init_blocks=0, local_blocks=1, sinks=0, quest_page_size=1)),
        (2, dict(segments=1, block_size=1, init_blocks=0, local_blocks=2, sinks=1, quest_page_size=2)),
        (3, dict(segments=1, block_size=1, init_blocks=1, local_blocks=2, sinks=2, quest_page_size=2)),
        (8, dict(segments=1, block_size=2, init_blocks=1, local_blocks=2, sinks=4, quest_page_size=8)),
        (32, dict(segments=4, block_size=8, init_blocks=1, local_blocks=2, sinks=4)),
        (64, dict(segments=8, block_size=16, init_blocks=1, local_blocks=2, sinks=4)),
        (191, dict(segments=23, block_size=32, init_blocks=1, local_blocks=2, sinks=4)),
        (192, dict(segments=24, block_size=64, init_blocks=1, local_blocks=2, sinks=4)),
        (511, dict(segments=63, block_size=64, init_blocks=1, local_blocks=2, sinks=4)),
    ],
)
def test_derive_settings_scales_what_must_scale_with_a_small_budget(k, expected):
    s, derived = evaluate.derive_settings(k)
    assert {f: getattr(s, f) for f in expected} == expected
    assert derived == {f: v for f, v in expected.items() if getattr(Settings(), f) != v}
    s.check()


def test_every_budget_from_1_runs_every_policy_on_the_derived_defaults(workload):
    budgets = list(range(1, 50))
    runs = [evaluate.derive_settings(k)[0] for k in budgets]
    report = evaluate.evaluate(workload, budgets=budgets, settings=runs)
    assert len(report.results) == len(budgets) * len(POLICIES)
    for r in report.results:
        assert r.ran, (r.budget, r.policy)
        assert 0 < r.slots_used <= r.budget, (r.budget, r.policy)
    assert [s["segments"] for s in report.settings] == [min(64, max(1, k // 8)) for k in budgets]


def test_derive_settings_keeps_what_was_given_and_trims_only_the_rest():
    s, derived = evaluate.derive_settings(32, block_size=16)  # 2 blocks: 1 + 2 cannot fit
    assert (s.block_size, s.init_blocks, s.local_blocks) == (16, 0, 2)
    assert derived == {"segments": 4, "init_blocks": 0}
    s, _ = evaluate.derive_settings(32, block_size=16, init_blocks=1)
    assert (s.init_blocks, s.local_blocks) == (1, 1)
    s, _ = evaluate.derive_settings(32, local_blocks=5)  # the block shrinks instead
    assert (s.block_size, s.init_blocks, s.local_blocks) == (4, 1, 5)
    s, _ = evaluate.derive_settings(32, block_size=64)  # kept: block-sparse n/a
    assert s.block_size == 64 and s.block_sparse_note() is not None


FLAGS = {
    "segments": "--segments",
    "block_size": "--block-size",
    "init_blocks": "--init-blocks",
    "local_blocks": "--local-blocks",
    "sinks": "--sinks",
}


@pytest.mark.parametrize(
    "k, given, fields, message",
    [
        (8, dict(segments=16), ("segments",), r"--segments \(16\) cannot exceed the budget \(8\)"),
        (128, dict(segments=65), ("segments",), r"--segments must be in 1\.\.64"),
        (
            32,
            dict(block_size=8, local_blocks=5),
            ("local_blocks", "block_size"),
            r"exceed the budget \(32\): lower --local-blocks or --block-size",
        ),
        (
            32,
            dict(block_size=8, init_blocks=2, local_blocks=3),
            ("init_blocks", "local_blocks", "block_size"),
            "lower --init-blocks or --local-blocks",
        ),
        (4, dict(local_blocks=5), ("local_blocks",), r"lower --local-blocks$"),
        (4, dict(sinks=4), ("sinks",), r"--sinks \(4\) leaves no slot for the window"),
    ],
)
def test_derive_settings_names_the_given_setting_that_cannot_work(k, given, fields, message):
    with pytest.raises(evaluate.SettingsError, match=message) as info:
        evaluate.derive_settings(k, names=FLAGS, **given)
    assert info.value.fields == fields


def test_one_settings_per_budget_is_taken_in_order_and_must_match_in_number(workload):
    runs = [Settings(budget=8, segments=2, block_size=2), Settings(budget=16, segments=8, block_size=4)]
    report = evaluate.evaluate(workload, budgets=[8, 16], settings=runs)
    assert [(s["budget"], s["segments"], s["block_size"]) for s in report.settings] == [(8, 2, 2), (16, 8, 4)]
    table = evaluate.format_table(report)
    assert "budget k = 8 (S = 2 segments, blocks of 2" in table
    with pytest.raises(ValueError, match="one Settings per budget"):
        evaluate.evaluate(workload, budgets=[8], settings=runs)


def test_output_error_median_and_p95_bracket_a_mean_dominated_by_near_zero_outputs():
    """One query head's dense output is near zero: its relative error is huge
    and drags the mean, while the median stays with the typical rows."""
    w = tiny_workload()
    v = w.v.copy()
    v[0] -= v[0].mean(axis=0, keepdims=True)  # KV head 0: values around zero
    w0 = Workload(**{**w.__dict__, "v": np.ascontiguousarray(v)})
    before, after = (
        {x.policy: x for x in evaluate.evaluate(x, budgets=[8], settings=SETTINGS["partial blocks"]).results}
        for x in (w, w0)
    )
    for name in ("learned top-k", "locality null", "oracle top-k"):
        a, b = before[name], after[name]
        assert b.output_error > 3 * a.output_error, name  # the mean follows the outliers
        assert b.output_error_p95 > 3 * a.output_error_p95, name
        assert b.output_error_median < 1.5 * a.output_error_median, name  # the median not
        assert b.output_error_median < b.output_error < b.output_error_p95, name


# --------------------------------------------------------------------------
# The plot
# --------------------------------------------------------------------------


def test_the_figure_has_two_panels_the_legend_outside_and_budget_ticks(run):
    pytest.importorskip("matplotlib")
    _, report = run
    fig = evaluate.figure(report)
    try:
        fig.canvas.draw()
        axes = fig.get_axes()
        assert len(axes) == 2
        assert "recall" in axes[0].get_ylabel() and "error" in axes[1].get_ylabel()
        renderer = fig.canvas.get_renderer()
        (legend,) = fig.legends
        box = legend.get_window_extent(renderer)
        for ax in axes:
            assert not box.overlaps(ax.get_window_extent(renderer))  # no point covered
            labels = [t.get_text() for t in ax.get_xticklabels()]
            assert labels == [str(b) for b in BUDGETS]
        assert len(legend.get_texts()) == len(POLICIES)
        title = fig._suptitle.get_text()
        s = report.settings[0]
        assert "tiny" in title
        assert f"S = {s['segments']}" in title and f"blocks of {s['block_size']}" in title
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def test_slots_used_counts_distinct_entries_within_the_context_natively():
    """The harness's 'slots used', counted natively, on rows with padding,
    duplicates, future and far positions: the distinct entries in [0, L)."""
    rng = np.random.default_rng(12)
    for _ in range(200):
        rows, width = rng.integers(0, 6), rng.integers(0, 12)
        cand = rng.integers(-3, 20, (rows, width)).astype(np.int32)
        lens = rng.integers(0, 20, rows)
        want = [len({int(x) for x in r if 0 <= x < L}) for r, L in zip(cand, lens)]
        got = ks.slots_used_rows(cand, lens)
        assert got.dtype == np.int64 and got.tolist() == want
        from kvselect import reference as ref

        assert ref.slots_used_rows(cand, lens).tolist() == want  # the NumPy twin too
    with pytest.raises(ks.WitnessError) as e:
        ks.slots_used_rows(np.zeros((2, 3), np.int32), [1])
    assert e.value.argument == "context_lens"
