"""The KV-eviction baselines (issue 44): each policy against its NumPy twin on
random and adversarial prefixes, the sources' rules pinned on hand-worked
examples, and the boundary experiment in ``kvselect eval``."""

from __future__ import annotations

import numpy as np
import pytest

import kvselect as ks
from kvselect import cli, evaluate, rules, workloads
from kvselect import reference as ref
from kvselect.rules import eviction as ev


def _prefix(rng, p_len, group, d, *, ties=False, zero_q=False):
    q = rng.standard_normal((p_len, group, d)).astype(np.float32)
    k = rng.standard_normal((p_len, d)).astype(np.float32)
    if ties:  # repeated keys: equal logits, equal scores, the order decides
        k = k[rng.integers(0, max(1, p_len // 3), p_len)]
    if zero_q:  # uniform attention: every score ties
        q[:] = 0
    return q, k


def _cases(n, seed, *, max_p=40):
    rng = np.random.default_rng(seed)
    for i in range(n):
        group = (1, 2, 8)[i % 3]
        p_len = int(rng.integers(2, max_p))
        d = int(rng.integers(1, 6))
        budget = int(rng.integers(1, p_len + 6))  # budgets larger than the prefix too
        kind = i % 5
        q, k = _prefix(rng, p_len, group, d, ties=kind == 3, zero_q=kind == 4)
        scale = float(rng.uniform(0.1, 2.0))
        yield q, k, budget, scale, rng


def test_keep_top_is_one_total_order_ties_to_the_lower_position():
    score = np.array([0.5, 2.0, 0.5, 2.0, 0.5, 1.0])
    assert ref.keep_top(score, 3).tolist() == [1, 3, 5]
    assert ref.keep_top(score, 4).tolist() == [0, 1, 3, 5]
    assert ref.keep_top(score, 99).tolist() == list(range(6))
    rng = np.random.default_rng(3)
    for _ in range(500):
        s = rng.integers(0, 4, rng.integers(1, 30)).astype(np.float64)
        b = int(rng.integers(0, 35))
        assert np.array_equal(ev.keep_top(s, b), ref.keep_top(s, b))


def test_the_twin_softmax_is_the_native_float64_row_bit_for_bit():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n, d = int(rng.integers(1, 60)), int(rng.integers(1, 70))
        q = rng.standard_normal((1, 1, d)).astype(np.float32) * 3
        k = rng.standard_normal((n, 1, d)).astype(np.float32)
        scale = float(rng.uniform(0.01, 3))
        native = ks.attention_probabilities(q, k, np.array([n - 1]), scale=scale)[0, 0]
        assert np.array_equal(native, ref.softmax_row(q[0, 0], k[:, 0], scale))


def test_snapkv_equals_its_twin_on_random_and_adversarial_prefixes():
    seen_window_first = 0
    for q, k, budget, scale, rng in _cases(1500, 1):
        window = int(rng.integers(1, len(k))) if len(k) > 1 else 1
        if len(k) <= window:
            continue
        if rng.random() < 0.2:  # the boundary at the first window: P = window + 1
            window = len(k) - 1
            seen_window_first += 1
        want = ref.snapkv_scores(q, k, scale, window=window)
        got = ev.snapkv_scores(q, k, scale, window)
        assert np.array_equal(got, want)
        kept = ev.keep_top(got, budget)
        assert np.array_equal(kept, ref.snapkv_keep(q, k, budget, scale, window=window))
        # The window is kept first (its padded score tops every other); fewer
        # kept than the window keeps the window's lowest positions.
        w = np.arange(len(k) - window, len(k))
        assert np.array_equal(kept[np.isin(kept, w)], w[: min(budget, window)])
    assert seen_window_first > 100


def test_snapkv_refuses_a_window_the_prefix_does_not_exceed():
    q, k = _prefix(np.random.default_rng(0), 8, 2, 4)
    with pytest.raises(ValueError, match="window"):
        ref.snapkv_scores(q, k, 0.5, window=8)


def test_tova_equals_its_twin_and_keeps_the_last_position():
    for q, k, budget, scale, _ in _cases(1500, 2):
        want = ref.tova_scores(q[-1], k, scale)
        assert np.array_equal(ev.tova_scores(q, k, scale), want)
        kept = ev.keep_top(want, budget)
        assert np.array_equal(kept, ref.tova_keep(q, k, budget, scale))
        assert kept[-1] == len(k) - 1


def test_tova_on_uniform_attention_keeps_the_lowest_positions_and_the_last():
    q, k = _prefix(np.random.default_rng(0), 10, 2, 3, zero_q=True)
    assert ref.tova_keep(q, k, 4, 1.0).tolist() == [0, 1, 2, 9]


def test_observed_attention_equals_its_twin():
    for q, k, budget, scale, _ in _cases(900, 3, max_p=30):
        want = ref.observed_attention_scores(q, k, scale)
        assert np.array_equal(ev.observed_scores(q, k, scale), want)
        assert np.array_equal(ev.keep_top(want, budget), ref.observed_attention_keep(q, k, budget, scale))


def test_observed_attention_divides_by_the_queries_that_see_each_key():
    # One head, uniform attention: query i gives 1/(i+1) to each key j <= i;
    # key j's score is the mean of 1/(i+1) over i = j..P-1.
    q, k = _prefix(np.random.default_rng(0), 5, 1, 2, zero_q=True)
    got = ref.observed_attention_scores(q, k, 1.0)
    want = [np.mean([1 / (i + 1) for i in range(j, 5)]) for j in range(5)]
    assert np.allclose(got, want, rtol=1e-15)


def test_h2o_equals_its_twin_on_random_and_adversarial_prefixes():
    for q, k, budget, scale, rng in _cases(400, 4, max_p=28):
        recent = int(rng.integers(0, budget + 1))
        want = ref.h2o_keep(q, k, budget, scale, recent=recent)
        got = ev.h2o_keep(q, k, budget, scale, recent)
        assert np.array_equal(got, want), (len(k), budget, recent)
        assert len(want) == min(budget, len(k))
        # The recent window is always kept.
        newest = np.arange(max(0, len(k) - recent), len(k))
        assert np.isin(newest, want).all()


def test_h2o_greedy_eviction_on_uniform_attention_worked_by_hand():
    # One head, zero queries: each step gives 1/|cache| to each cached key.
    # recent = 0, budget 2: t = 2 scores (1.83, 0.83, 0.33) evict 2; t = 3
    # (2.17, 1.17, 0.33) evicts 3. recent = 1: t = 2 evicts 1 among [0, 1]
    # (0.83 < 1.83); t = 3 scores 0: 2.17, 2: 0.67, evicts 2.
    q, k = _prefix(np.random.default_rng(0), 4, 1, 2, zero_q=True)
    assert ref.h2o_keep(q, k, 2, 1.0, recent=0).tolist() == [0, 1]
    assert ref.h2o_keep(q, k, 2, 1.0, recent=1).tolist() == [0, 3]
    assert ref.h2o_keep(q, k, 2, 1.0, recent=2).tolist() == [2, 3]  # all recent: the newest
    with pytest.raises(ValueError, match="recent"):
        ref.h2o_keep(q, k, 2, 1.0, recent=3)


def test_pyramidkv_budgets_average_the_uniform_one_and_one_layer_is_snapkv():
    # kvpress's pyramid: 32 layers, q_len 4096, ratio 0.5: min_num = 2048 / 20
    # = 102.4, max_num = 4096 - 102.4 = 3993.6, a line between them, their
    # mean the uniform 2048.
    budgets = [ref.pyramidkv_layer_budget(i, 32, 4096, 0.5) for i in range(32)]
    assert budgets[0] == 3994 and budgets[-1] == 102
    assert budgets == sorted(budgets, reverse=True)
    assert abs(np.mean(budgets) - 2048) <= 1
    # At ratio 0.75 min_num = 51.2 falls below the window (64): kvpress falls
    # back to the uniform budget on every layer.
    assert {ref.pyramidkv_layer_budget(i, 32, 4096, 0.75) for i in range(32)} == {1024}
    assert ref.pyramidkv_layer_budget(0, 1, 100, 0.9) == 10  # one layer: the uniform budget
    with pytest.raises(ValueError, match="beta"):
        ref.pyramidkv_layer_budget(0, 2, 100, 0.5, beta=0)


def test_kvpress_budget_truncates():
    # The budget unit the eval replaces: kvpress keeps int(L * (1 - ratio)).
    assert int(100 * (1 - 0.9)) == 9


def _tiny(group=2, tokens=96, n_kv=2):
    return workloads.synthetic(context=tokens, queries=6, n_kv_heads=n_kv, n_heads=n_kv * group, seed=1)


@pytest.mark.parametrize("group", [1, 8])
def test_the_boundary_experiment_scores_kept_plus_arrivals(group):
    w = _tiny(group=group)
    budget, window = 16, 8
    s, _ = evaluate.derive_settings(budget, snapkv_window=window, boundary=evaluate.AUTO_BOUNDARY)
    report = evaluate.evaluate(w, budgets=[budget], settings=s)
    pos = np.asarray(w.query_positions)
    p = int(pos[0])
    assert report.boundary == p
    by = {r.policy: r for r in report.results}
    assert set(evaluate.POLICIES + evaluate.EVICTION_POLICIES) == set(by)
    kept_fn = {
        "SnapKV": lambda q, k: ref.snapkv_keep(q, k, budget, w.scale, window=window),
        "PyramidKV": lambda q, k: ref.snapkv_keep(q, k, budget, w.scale, window=window),
        "TOVA": lambda q, k: ref.tova_keep(q, k, budget, w.scale),
        "H2O": lambda q, k: ref.h2o_keep(q, k, budget, w.scale, recent=budget // 2),
        "ObservedAttention": lambda q, k: ref.observed_attention_keep(q, k, budget, w.scale),
        "locality null": lambda q, k: np.arange(p - budget, p),
    }
    for name, fn in kept_fn.items():
        recalls = []
        for h in range(w.n_kv_heads):
            x = w.head_inputs(h, pos)
            kept = fn(w.head_queries(h, np.arange(p)), x.k[:p])
            rows = np.full((len(pos), budget + pos[-1] - p + 1), -1, dtype=np.int32)
            for i, at in enumerate(pos):
                sel = np.concatenate([kept, np.arange(p, at + 1)])
                rows[i, : len(sel)] = sel
            probs = ks.attention_probabilities(x.q, x.k[:, None, :], pos, scale=w.scale)
            n, g, t = probs.shape
            recalls.append(ks.attention_mass_recall_rows(rows, probs.reshape(n * g, t)).reshape(n, g))
        assert by[name].recall_mean == pytest.approx(float(np.mean(np.concatenate(recalls))), rel=1e-12), name
        assert by[name].slots_used == pytest.approx(budget + np.mean(pos - p + 1)), name


def test_an_explicit_boundary_scores_only_the_queries_after_it():
    w = _tiny()
    pos = np.asarray(w.query_positions)
    p = int(pos[2])
    s, _ = evaluate.derive_settings(16, snapkv_window=8, boundary=p)
    rows = evaluate.head_rows(w.head_inputs(0, pos), pos, [s], w.scale, w.head_queries(0, np.arange(p)))
    assert len(rows[(16, "TOVA")]["recall"]) == (len(pos) - 2) * w.group


def test_a_boundary_past_every_query_is_refused_naming_it():
    w = _tiny()
    s, _ = evaluate.derive_settings(16, boundary=10_000)
    with pytest.raises(ValueError, match="boundary"):
        evaluate.evaluate(w, budgets=[16], settings=s)


def test_snapkv_is_na_when_the_prefix_does_not_exceed_its_window():
    w = _tiny()
    s, _ = evaluate.derive_settings(16, snapkv_window=500, boundary=0)
    by = {r.policy: r for r in evaluate.evaluate(w, budgets=[16], settings=s).results}
    assert "does not exceed the SnapKV window" in by["SnapKV"].note
    assert by["TOVA"].ran and by["H2O"].ran


def test_the_per_query_experiment_has_no_eviction_rows():
    w = _tiny()
    report = evaluate.evaluate(w, budgets=[16], settings=evaluate.derive_settings(16)[0])
    assert {r.policy for r in report.results} == set(evaluate.POLICIES)
    assert report.boundary is None


def test_h2o_recent_above_the_budget_is_refused_naming_it():
    with pytest.raises(evaluate.SettingsError, match="h2o_recent"):
        evaluate.derive_settings(8, h2o_recent=9)


def test_the_cli_prints_the_eviction_rows_and_the_equal_budget_header(capsys):
    code = cli.main(["eval", "--context", "512", "--queries", "4", "--budget", "32", "--boundary", "--quiet"])
    out = capsys.readouterr().out
    assert code == 0
    for name in evaluate.EVICTION_POLICIES:
        assert f"| {name} |" in out, name
    assert "equal budgets" in out and "plus the p - P + 1 arrivals" in out
    assert "its rows are SnapKV's" in out


def test_eviction_policies_are_registered_with_their_twin():
    rule = next(r for r in rules.RULES if r.name == "eviction")
    assert rule.reference == "kvselect.reference.eviction"
    assert all(p.eviction for p in rule.policies)
    # EVICTION_POLICIES: every policy that decides once at the boundary (the
    # eviction rule's, and MInference's vertical-slash estimate).
    assert list(evaluate.EVICTION_POLICIES) == [p.name for p in rules.policies() if p.eviction]
    assert [p.name for p in rule.policies] == [n for n in evaluate.EVICTION_POLICIES if n != "vertical-slash"]


def test_pyramidkv_layer_budgets_are_kvpress_formula_at_the_eval_ratio():
    # The eval's uniform budget B of a P prefix is kvpress's ratio 1 - B / P.
    rng = np.random.default_rng(7)
    for _ in range(2000):
        p_len = int(rng.integers(2, 5000))
        budget = int(rng.integers(1, p_len + 1))
        window = int(rng.integers(1, 128))
        layers = int(rng.integers(1, 80))
        layer = int(rng.integers(0, layers))
        want = ref.pyramidkv_layer_budget(layer, layers, p_len, 1 - budget / p_len, window=window)
        assert ev.pyramid_budget(layer, layers, p_len, budget, window) == want


def test_pyramidkv_on_a_multi_layer_dump_keeps_each_layers_budget():
    # B = 80, window 4: min_num = 80 / 20 = 4 reaches the window, so the
    # pyramid fits a prefix of 200 or more: layer 0 keeps more than B, the
    # last layer fewer.
    w = _tiny(tokens=512)
    pos = np.asarray(w.query_positions)
    p = int(pos[pos >= 200][0])
    at = pos[pos >= p]
    s, _ = evaluate.derive_settings(80, snapkv_window=4, boundary=p)
    q, k = w.head_queries(0, np.arange(p)), w.head_inputs(0, pos).k[:p]
    budgets = []
    for layer in (0, 3):
        rows = evaluate.head_rows(w.head_inputs(0, pos), pos, [s], w.scale, q, 4, layer)
        budget = ev.pyramid_budget(layer, 4, p, 80, 4)
        budgets.append(budget)
        want = ref.snapkv_keep(q, k, budget, w.scale, window=4)
        assert len(want) == budget
        assert np.array_equal(rows[(80, "PyramidKV")]["used"], len(want) + at - p + 1), layer
    assert budgets[0] > 80 > budgets[1]


def test_a_budget_holding_the_prefix_keeps_every_key_for_every_policy():
    # B >= P: every policy keeps the whole prefix (Quest's in whole pages of
    # 16), so every query reads its whole context: the budget is listed as
    # trivially perfect.
    w = _tiny()
    p = int(np.asarray(w.query_positions)[0])
    budget = 16 * (-(-p // 16)) + 16
    s, _ = evaluate.derive_settings(budget, snapkv_window=4, boundary=0)
    report = evaluate.evaluate(w, budgets=[budget], settings=s)
    assert report.every_key_budgets == [budget]
    for r in report.results:
        assert r.recall_mean == pytest.approx(1.0, abs=1e-12), r.policy


def test_the_cli_refuses_a_boundary_past_every_query_naming_it(capsys):
    code = cli.main(["eval", "--context", "512", "--queries", "4", "--budget", "32", "--boundary", "9999", "--quiet"])
    err = capsys.readouterr().err
    assert code == 1
    assert "boundary: 9999 leaves no evaluated query after it (the last is at 511)" in err
