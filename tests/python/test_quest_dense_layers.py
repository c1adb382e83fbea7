"""Quest's dense first layers in ``kvselect eval`` (issue #41): on a workload
of more than one layer, Quest's rows on the layers below
``quest_dense_layers`` (default 2, Quest's ``_quest_skip_layer``) read every
visible position, the other layers keep the identical budget, and the table
says so; ``--quest-dense-layers 0`` holds Quest to the budget everywhere."""

import dataclasses

import numpy as np
import pytest

from kvselect import cli, evaluate, rules
from kvselect.evaluate import Settings, SettingsError, derive_settings
from kvselect.rules import quest
from kvselect.rules._rule import EvalContext
from kvselect.workloads import Workload

TOKENS, D, LAYERS, K = 96, 8, 3, 16
POSITIONS = np.array([20, 47, 70, 95], dtype=np.int64)


def _workload(layers: int = LAYERS) -> Workload:
    """``layers`` layers of 2 KV heads each (one query head per KV head)."""
    rng = np.random.default_rng(41)
    n_kv = 2 * layers
    f32 = lambda a: np.ascontiguousarray(a, dtype=np.float32)  # noqa: E731
    return Workload(
        name="layered",
        q=f32(rng.standard_normal((n_kv, TOKENS, D))),
        k=f32(rng.standard_normal((n_kv, TOKENS, D))),
        v=f32(rng.standard_normal((n_kv, TOKENS, D))),
        index_q=f32(rng.standard_normal((n_kv, TOKENS, 4))),
        index_k=f32(rng.standard_normal((n_kv, TOKENS, 4))),
        head_kinds=("a",) * n_kv,
        query_positions=POSITIONS.copy(),
        scale=D**-0.5,
        source="a layered test workload",
        n_layers=layers,
    )


def _quest_rows(w: Workload, h: int, s: Settings):
    pos = np.asarray(w.query_positions, dtype=np.int64)
    layer = h // (w.n_kv_heads // w.n_layers)
    head = evaluate._prepare_head(w.head_inputs(h, pos), pos, w.scale, w.n_layers, layer)
    policy = rules.policy("quest")
    return policy.select(EvalContext(head, pos, s, policy.unit.units(s), {}))


@pytest.mark.parametrize("h", range(2 * LAYERS))
def test_layers_below_the_dense_count_read_every_visible_position_the_rest_the_budget(h):
    w = _workload()
    s, _ = derive_settings(K)
    assert s.quest_dense_layers == 2  # Quest's model: its first two layers
    sel = _quest_rows(w, h, s)
    layer = h // 2
    if layer < 2:
        assert sel.dense
        for row, p in zip(sel.rows, POSITIONS):
            assert np.array_equal(row[row >= 0], np.arange(p + 1)), (h, p)
    else:
        assert not sel.dense and sel.rows.shape == (len(POSITIONS), K)
        # the identical-budget selection, what quest_dense_layers=0 gives on every layer
        flat = _quest_rows(w, h, dataclasses.replace(s, quest_dense_layers=0))
        assert np.array_equal(sel.rows, flat.rows)


def test_zero_dense_layers_and_a_one_layer_workload_keep_the_budget_everywhere():
    s0, _ = derive_settings(K, quest_dense_layers=0)
    for h in range(2 * LAYERS):
        sel = _quest_rows(_workload(), h, s0)
        assert not sel.dense and sel.rows.shape[1] == K
    s, _ = derive_settings(K)
    one = _workload(layers=1)
    for h in range(2):
        sel = _quest_rows(one, h, s)
        assert not sel.dense and sel.rows.shape[1] == K
        assert quest.dense_layer(EvalContext(type("H", (), {"layers": 1, "layer": 0})(), POSITIONS, s, 1, {})) is False


def test_the_table_charges_the_dense_layers_and_says_so():
    w = _workload()
    r = evaluate.evaluate(w, budgets=[K], settings=derive_settings(K)[0])
    (row,) = [x for x in r.results if x.policy == "quest"]
    flat = evaluate.evaluate(w, budgets=[K], settings=derive_settings(K, quest_dense_layers=0)[0])
    (row0,) = [x for x in flat.results if x.policy == "quest"]
    # Two layers of three read everything: slots used above k, recall up.
    assert row.slots_used > K >= row0.slots_used
    assert row.recall_mean > row0.recall_mean
    text = evaluate.format_table(r)
    assert "quest: layers 0..1 read every position" in text and "--quest-dense-layers 0" in text
    assert "quest: layers" not in evaluate.format_table(flat)
    # Every other policy is untouched by the knob.
    others = {x.policy: (x.recall_mean, x.slots_used) for x in r.results if x.policy != "quest"}
    assert others == {x.policy: (x.recall_mean, x.slots_used) for x in flat.results if x.policy != "quest"}


def test_a_negative_count_is_refused_naming_the_setting(capsys):
    with pytest.raises(SettingsError, match="quest_dense_layers") as err:
        derive_settings(K, quest_dense_layers=-1)
    assert err.value.fields == ("quest_dense_layers",)
    with pytest.raises(ValueError, match="quest_dense_layers"):
        Settings(budget=K, segments=4, quest_dense_layers=-1).check()
    with pytest.raises(SystemExit):
        cli.main(["eval", "--quest-dense-layers", "-1", "--quiet"])
    assert "--quest-dense-layers" in capsys.readouterr().err
