"""The ``kvselect`` command line: in process through ``kvselect.cli.main``
(output captured), and once as ``python -m kvselect``.

Exit codes: 0 on success, 2 on a usage error (argparse), 1 when the
workload cannot be loaded, the settings are inconsistent or a plot needs
the missing matplotlib.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys

import numpy as np
import pytest

import kvselect as ks
from kvselect import cli
from kvselect.evaluate import POLICIES

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# A synthetic workload small enough to evaluate in well under a second.
TINY = [
    "eval",
    "--context",
    "256",
    "--queries",
    "3",
    "--budget",
    "32",
    "--segments",
    "4",
    "--block-size",
    "8",
    "--quiet",
]


def run(capsys, argv):
    """``main(argv)`` in process: (exit code, stdout, stderr). A SystemExit
    (argparse's --help, --version and usage errors) gives its code."""
    try:
        code = cli.main(argv)
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def strict_json(path):
    """JSON as the standard has it: NaN and Infinity are refused."""

    def refuse(name):
        raise ValueError(f"not JSON: {name}")

    with open(path) as f:
        return json.load(f, parse_constant=refuse)


def tiny_npz(path, **overrides):
    rng = np.random.default_rng(0)
    arrays = dict(
        q=rng.standard_normal((1, 2, 64, 8)).astype(np.float32),
        k=rng.standard_normal((1, 1, 64, 8)).astype(np.float32),
        v=rng.standard_normal((1, 1, 64, 8)).astype(np.float32),
    )
    arrays.update(overrides)
    arrays = {key: val for key, val in arrays.items() if val is not None}
    np.savez(path, **arrays)
    return str(path)


# --------------------------------------------------------------------------
# Success
# --------------------------------------------------------------------------


def test_eval_on_a_tiny_synthetic_workload_prints_the_table_and_exits_0(capsys):
    code, out, err = run(capsys, TINY)
    assert code == 0, err
    assert "workload: synthetic" in out
    assert "budget k = 32" in out
    for name in POLICIES:
        assert f"| {name} |" in out
    assert err == ""  # --quiet: no progress bar, no warnings


def test_python_m_kvselect_eval_runs_as_a_subprocess():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvselect",
            "eval",
            "--context",
            "2048",
            "--queries",
            "4",
            "--budget",
            "128",
            "--segments",
            "16",
            "--block-size",
            "16",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "budget k = 128" in proc.stdout
    for name in POLICIES:
        assert f"| {name} |" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_a_budget_sweep_prints_one_table_per_budget(capsys):
    code, out, err = run(capsys, [*TINY, "--budget", "24", "64"])
    assert code == 0, err
    assert "budget k = 24" in out and "budget k = 64" in out
    assert "budget k = 32" not in out  # the last --budget wins
    assert out.count("| oracle top-k |") == 2


def test_json_writes_strict_json_with_every_result(capsys, tmp_path):
    path = tmp_path / "report.json"
    code, _, err = run(capsys, [*TINY, "--budget", "24", "32", "--json", str(path)])
    assert code == 0, err
    report = strict_json(path)
    assert [(r["budget"], r["policy"]) for r in report["results"]] == [(b, name) for b in (24, 32) for name in POLICIES]
    assert report["workload"] == "synthetic"
    assert report["tokens"] == 256 and report["queries"] == 3
    assert [s["budget"] for s in report["settings"]] == [24, 32]
    for r in report["results"]:
        assert 0.0 <= r["coverage"] <= 1.0
        assert 0.0 <= r["recall_p5"] <= r["recall_mean"] <= 1.0 + 1e-12
        assert r["slots_used"] <= r["budget"]
    # The learned top-k is upstream of kvselect: its time is not charged.
    assert report["results"][0]["select_us_per_query"] > 0  # the learned top-k is charged


def test_plot_writes_a_valid_png(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.image

    path = tmp_path / "recall.png"
    code, _, err = run(capsys, [*TINY, "--budget", "24", "64", "--plot", str(path)])
    assert code == 0, err
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    image = matplotlib.image.imread(str(path))
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    assert image.std() > 0  # something was drawn


def test_plot_without_matplotlib_exits_1_naming_matplotlib(capsys, tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    path = tmp_path / "recall.png"
    code, out, err = run(capsys, [*TINY, "--plot", str(path)])
    assert code == 1
    assert "matplotlib" in err and "pip install" in err
    assert "Traceback" not in err
    assert not path.exists()
    assert out == ""  # checked before the evaluation: no table


def test_the_shipped_example_workload_runs(capsys):
    code, out, err = run(
        capsys,
        [
            "eval",
            "--workload",
            "example",
            "--queries",
            "2",
            "--budget",
            "32",
            "--segments",
            "4",
            "--block-size",
            "8",
            "--quiet",
        ],
    )
    assert code == 0, err
    assert "workload: minilm-example" in out
    assert "| oracle top-k |" in out


def test_a_budget_above_the_context_selects_every_key(capsys, tmp_path):
    """The example has 512 tokens; the default budget is 2048."""
    path = tmp_path / "r.json"
    code, _, err = run(
        capsys,
        ["eval", "--workload", "example", "--queries", "2", "--quiet", "--json", str(path)],
    )
    assert code == 0, err
    report = strict_json(path)
    assert report["tokens"] == 512
    for r in report["results"]:
        assert r["budget"] == 2048
        assert r["coverage"] == 1.0, r["policy"]
        assert r["recall_mean"] == pytest.approx(1.0, abs=1e-9), r["policy"]


def test_a_valid_npz_dump_runs_and_is_named_by_its_file(capsys, tmp_path):
    path = tiny_npz(tmp_path / "mydump.npz")
    code, out, err = run(
        capsys,
        [
            "eval",
            "--workload",
            path,
            "--queries",
            "2",
            "--budget",
            "16",
            "--segments",
            "4",
            "--block-size",
            "4",
            "--quiet",
        ],
    )
    assert code == 0, err
    assert "workload: mydump" in out


def test_threads_1_runs_and_sets_kvselect_threads(capsys):
    try:
        code, out, err = run(capsys, [*TINY, "--threads", "1"])
        assert code == 0, err
        assert "budget k = 32" in out
        assert ks.get_num_threads() == 1
    finally:
        ks.set_num_threads(0)  # back to the default for the other tests


def test_demo_runs_a_small_eval(capsys):
    code, out, err = run(capsys, ["demo"])
    assert code == 0, err
    assert "workload: synthetic" in out
    assert "budget k = 512" in out
    assert "| witnesses (as served) |" in out


# --------------------------------------------------------------------------
# --help and --version
# --------------------------------------------------------------------------


def test_eval_help_exits_0_and_describes_the_options(capsys):
    code, out, _ = run(capsys, ["eval", "--help"])
    assert code == 0
    for option in (
        "--workload",
        "--budget",
        "--segments",
        "--block-size",
        "--init-blocks",
        "--local-blocks",
        "--sinks",
        "--context",
        "--queries",
        "--seed",
        "--threads",
        "--json",
        "--plot",
        "--quiet",
    ):
        assert option in out, option
    assert "example" in out and ".npz" in out


def eval_help_entries(out):
    """{option: its help text} from ``kvselect eval --help``."""
    entries, current = {}, None
    for line in out.splitlines():
        stripped = line.strip()
        if line.startswith("  -"):
            current = stripped.split()[0].rstrip(",")
            entries[current] = stripped
        elif current and line.startswith("        "):
            entries[current] += " " + stripped
        else:
            current = None
    return entries


def test_eval_help_shows_every_default_and_explains_the_block_size(capsys):
    code, out, _ = run(capsys, ["eval", "--help"])
    assert code == 0
    entries = eval_help_entries(out)
    (sub,) = [a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    options = [a.option_strings[-1] for a in sub.choices["eval"]._actions if a.option_strings != ["-h", "--help"]]
    assert (
        len(options) == 24
    )  # with --workers, --scheduler, --boundary, the eviction knobs, InfLLM-v2's window, Quest's dense layers
    for option in options:
        assert "(default: " in entries[option], option
    block = entries["--block-size"]
    assert "(default: 64" in block and "128" in block and "MiniMax-M3" in block
    assert "--init-blocks 0" in block  # a flag is never broken at its hyphen
    assert "(default: 2048)" in entries["--budget"]


def test_top_level_help_lists_the_subcommands(capsys):
    code, out, _ = run(capsys, ["--help"])
    assert code == 0
    assert "eval" in out and "demo" in out and "--version" in out


def test_version_prints_the_package_version(capsys):
    code, out, _ = run(capsys, ["--version"])
    assert code == 0
    assert out.strip() == f"kvselect {ks.__version__}"


# --------------------------------------------------------------------------
# Usage errors: exit 2
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, hint",
    [
        (["eval", "--no-such-option"], "unrecognized arguments"),
        (["eval", "--budget", "0"], "must be at least 1"),
        (["eval", "--budget", "abc"], "--budget"),
        (["eval", "--budget"], "--budget"),
        (["eval", "--segments", "-3"], "must be at least 1"),
        (["eval", "--sinks", "-1"], "must be non-negative"),
        (["eval", "--threads", "x"], "--threads"),
        (["eval", "--workers", "0"], "must be at least 1"),
        (["eval", "--workers", "2", "--scheduler", "tcp://h:8786"], "not allowed with argument"),
        (["check", "x.npz", "--workers", "two"], "--workers"),
        (["check", "x.npz", "--chunk-rows", "0"], "must be at least 1"),
        (["check"], "DUMP"),
        ([], "command"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_bad_usage_exits_2_with_a_usage_message(capsys, argv, hint):
    code, out, err = run(capsys, argv)
    assert code == 2
    assert "usage:" in err
    assert hint in err
    assert out == ""


# --------------------------------------------------------------------------
# Workloads that cannot be loaded, inconsistent settings: exit 1
# --------------------------------------------------------------------------


def test_a_missing_npz_exits_1_with_a_clear_message(capsys, tmp_path):
    path = tmp_path / "nope.npz"
    code, out, err = run(capsys, ["eval", "--workload", str(path), "--quiet"])
    assert code == 1
    assert "cannot load workload" in err
    assert "no such workload file" in err and "nope.npz" in err
    assert "Traceback" not in err
    assert out == ""


def test_an_npz_with_an_unknown_key_exits_1_naming_the_key(capsys, tmp_path):
    path = tiny_npz(tmp_path / "typo.npz", index_keys=np.zeros((1, 1, 64, 2), np.float32))
    code, out, err = run(capsys, ["eval", "--workload", path, "--quiet"])
    assert code == 1
    assert "index_keys" in err and "unknown key" in err
    assert out == ""


def test_an_npz_missing_a_required_key_exits_1_naming_the_key(capsys, tmp_path):
    path = tiny_npz(tmp_path / "nov.npz", v=None)
    code, _, err = run(capsys, ["eval", "--workload", path, "--quiet"])
    assert code == 1
    assert "missing required key" in err and "'v'" in err


def test_an_npz_with_a_badly_shaped_array_exits_1_naming_the_key(capsys, tmp_path):
    path = tiny_npz(tmp_path / "shape.npz", k=np.zeros((1, 1, 63, 8), np.float32))
    code, _, err = run(capsys, ["eval", "--workload", path, "--quiet"])
    assert code == 1
    assert "k: expected shape" in err


def test_a_file_that_is_not_an_npz_exits_1(capsys, tmp_path):
    path = tmp_path / "text.npz"
    path.write_text("not an archive")
    code, _, err = run(capsys, ["eval", "--workload", str(path), "--quiet"])
    assert code == 1
    assert "not a NumPy .npz archive" in err


@pytest.mark.parametrize(
    "extra, hint",
    [
        (["--segments", "64", "--budget", "32"], "--segments (64) cannot exceed the budget (32)"),
        (["--segments", "65", "--budget", "128"], "--segments must be in 1..64"),
        (["--local-blocks", "5", "--budget", "32"], "exceed the budget (32): lower --local-blocks or --block-size"),
        (
            ["--init-blocks", "2", "--local-blocks", "3", "--budget", "32"],
            "lower --init-blocks or --local-blocks or --block-size",
        ),
        (["--segments", "16", "--budget", "64", "8"], "at --budget 8: --segments (16) cannot exceed the budget (8)"),
        (["--sinks", "32"], "--sinks (32) leaves no slot for the window at the budget (32)"),
    ],
)
def test_a_given_setting_that_cannot_work_exits_1_naming_the_flag(capsys, extra, hint):
    code, out, err = run(capsys, [*TINY, *extra])
    assert code == 1
    assert err.startswith("kvselect eval: ")
    assert hint in err
    assert out == ""


def test_a_derived_setting_never_blames_a_flag_that_was_not_given(capsys):
    """--local-blocks 40 at k = 32: the block size shrinks to 1 (derived) and
    40 blocks still cannot fit; only --local-blocks is named."""
    code, out, err = run(
        capsys, ["eval", "--context", "256", "--queries", "2", "--budget", "32", "--local-blocks", "40", "--quiet"]
    )
    assert code == 1
    assert err.rstrip().endswith("lower --local-blocks")
    assert "--block-size" not in err and out == ""


# --------------------------------------------------------------------------
# Every budget works on the defaults
# --------------------------------------------------------------------------


SMALL = ["eval", "--context", "512", "--queries", "2", "--quiet"]


def tables(out):
    """{budget: [table rows]} from the printed tables."""
    found, budget = {}, None
    for line in out.splitlines():
        if line.startswith("budget k = ") and "every policy sees every key" not in line:
            budget = int(line.split()[3])
            found[budget] = []
        elif budget is not None and line.startswith("| ") and not line.startswith("| policy"):
            found[budget].append(line)
    return found


def test_every_small_budget_runs_on_the_defaults_and_says_what_was_derived(capsys):
    budgets = [1, 2, 3, 8, 64, 100, 191, 192, 512]
    code, out, err = run(capsys, [*SMALL, "--budget", *map(str, budgets)])
    assert code == 0, err
    assert err == ""
    lines = out.splitlines()
    derived = [line for line in lines if line.startswith("derived from the budget")]
    assert len(derived) == 1  # one line
    line = derived[0]
    assert "k = 1: --segments 1, --block-size 1, --init-blocks 0, --local-blocks 1, --sinks 0" in line
    assert "k = 64: --segments 8, --block-size 16" in line
    assert "k = 191: --segments 23, --block-size 32" in line and "k = 192: --segments 24" in line
    assert "k = 512" not in line  # the defaults fit there: nothing derived
    got = tables(out)
    assert sorted(got) == budgets
    for budget, rows in got.items():
        assert len(rows) == len(POLICIES), budget
        assert not any("n/a" in row for row in rows), budget
    assert "budget k = 64 (S = 8 segments, blocks of 16 (1 init + 2 local), 4 sinks)" in out


def test_the_default_budget_prints_no_derived_line(capsys):
    code, out, err = run(capsys, [*SMALL, "--budget", "512"])
    assert code == 0, err
    assert "derived" not in out
    assert "S = 64 segments, blocks of 64 (1 init + 2 local), 4 sinks" in out


def test_a_given_block_larger_than_the_budget_is_na_in_its_row_and_the_rest_run(capsys, tmp_path):
    path = tmp_path / "r.json"
    code, out, err = run(capsys, [*SMALL, "--block-size", "64", "--budget", "32", "256", "--json", str(path)])
    assert code == 0, err
    got = tables(out)
    (row,) = [r for r in got[32] if r.startswith("| block-sparse |")]
    assert "n/a" in row and "the budget (32) holds no block of 64 tokens" in row
    others = [r for r in got[32] if not r.startswith("| block-sparse |")]
    assert len(others) == len(POLICIES) - 1 and not any("n/a" in r for r in others)
    assert not any("n/a" in r for r in got[256])
    report = strict_json(path)
    (res,) = [r for r in report["results"] if r["budget"] == 32 and r["policy"] == "block-sparse"]
    assert res["recall_mean"] is None and "no block of 64" in res["note"]


def test_a_budget_holding_the_context_says_so_once_instead_of_tables(capsys):
    code, out, err = run(
        capsys, ["eval", "--workload", "example", "--queries", "2", "--budget", "32", "1024", "2048", "--quiet"]
    )
    assert code == 0, err
    assert out.count("every policy sees every key") == 1
    assert "budgets k = 1024, 2048: every query's context fits (the workload has 512 tokens)" in out
    assert out.count("| oracle top-k |") == 1  # the table of k = 32 only
    assert sorted(tables(out)) == [32]


# --------------------------------------------------------------------------
# Cheap checks before the run; dumps in the user's terms
# --------------------------------------------------------------------------


def test_json_into_a_missing_folder_fails_before_the_run(capsys, tmp_path):
    path = tmp_path / "no" / "such" / "r.json"
    code, out, err = run(capsys, [*TINY, "--json", str(path)])
    assert code == 1
    assert err.startswith("kvselect eval: --json")
    assert "does not exist" in err and "Traceback" not in err
    assert out == ""


def test_json_onto_a_directory_fails_before_the_run(capsys, tmp_path):
    code, out, err = run(capsys, [*TINY, "--json", str(tmp_path)])
    assert code == 1
    assert "is a directory" in err and out == ""


def test_plot_into_a_missing_folder_fails_before_the_run(capsys, tmp_path):
    code, out, err = run(capsys, [*TINY, "--plot", str(tmp_path / "nope" / "p.png")])
    assert code == 1
    assert err.startswith("kvselect eval: --plot") and out == ""


def test_a_dump_saved_tokens_before_heads_warns_on_stderr(capsys, tmp_path):
    """[layers, tokens, heads, d] (a torch layout): 256 tokens of 4 heads read
    as 256 heads of 4 tokens."""
    rng = np.random.default_rng(1)
    x = lambda: rng.standard_normal((1, 256, 4, 8)).astype(np.float32)  # noqa: E731
    path = tiny_npz(tmp_path / "torch.npz", q=x(), k=x(), v=x())
    code, out, err = run(capsys, ["eval", "--workload", path, "--queries", "2", "--budget", "2", "--quiet"])
    assert code == 0, err
    assert "kvselect eval: warning:" in err
    assert "256 query heads (axis 1) of 4 tokens" in err
    assert "[layers, tokens, heads, dim]" in err and "transpose(0, 2, 1, 3)" in err


def test_a_well_shaped_dump_does_not_warn(capsys, tmp_path):
    path = tiny_npz(tmp_path / "ok.npz")
    code, _, err = run(capsys, ["eval", "--workload", path, "--queries", "2", "--budget", "16", "--quiet"])
    assert code == 0 and err == ""


def test_a_transposed_gqa_dump_is_refused_in_layers_heads_and_tokens(capsys, tmp_path):
    rng = np.random.default_rng(2)
    path = tiny_npz(
        tmp_path / "gqa.npz",
        q=rng.standard_normal((1, 64, 4, 8)).astype(np.float32),
        k=rng.standard_normal((1, 64, 2, 8)).astype(np.float32),
        v=rng.standard_normal((1, 64, 2, 8)).astype(np.float32),
    )
    code, out, err = run(capsys, ["eval", "--workload", path, "--quiet"])
    assert code == 1 and out == ""
    assert "k has 2 tokens where q has 4" in err
    assert "q reads as 64 query heads of 4 tokens" in err
    assert "[layers, tokens, heads, dim]" in err


def test_a_three_dimensional_array_is_refused_in_the_users_terms(capsys, tmp_path):
    path = tiny_npz(tmp_path / "3d.npz", v=np.zeros((1, 64, 8), np.float32))
    code, _, err = run(capsys, ["eval", "--workload", path, "--quiet"])
    assert code == 1
    assert "(layers, KV heads, tokens, head dim)" in err and "x[None]" in err


def test_a_text_file_named_npz_never_suggests_pickle(capsys, tmp_path):
    path = tmp_path / "notes.npz"
    path.write_text("q k v as text")
    code, out, err = run(capsys, ["eval", "--workload", str(path), "--quiet"])
    assert code == 1 and out == ""
    assert "not a NumPy .npz archive" in err
    assert "pickle" not in err.lower()


def test_an_object_array_in_a_dump_never_suggests_pickle(capsys, tmp_path):
    path = tmp_path / "obj.npz"
    rng = np.random.default_rng(0)
    np.savez(
        path,
        q=rng.standard_normal((1, 2, 64, 8)).astype(np.float32),
        k=rng.standard_normal((1, 1, 64, 8)).astype(np.float32),
        v=np.array([None, 1], dtype=object),
    )
    code, _, err = run(capsys, ["eval", "--workload", str(path), "--quiet"])
    assert code == 1
    assert "v: holds Python objects" in err
    assert "pickle" not in err.lower()


# --------------------------------------------------------------------------
# Many dumps, and the DSA form
# --------------------------------------------------------------------------


def dsa_npz(path, seed=0):
    """A one-layer dump with a DeepSeek-style indexer: 3 index heads per
    token, per-token head weights, one shared index key per token."""
    rng = np.random.default_rng(seed)
    return tiny_npz(
        path,
        index_q=rng.standard_normal((1, 64, 3, 4)).astype(np.float32),
        weights=rng.uniform(0.5, 1.5, (1, 64, 3)).astype(np.float32),
        index_k=rng.standard_normal((1, 64, 4)).astype(np.float32),
    )


def test_a_directory_of_dumps_is_reported_per_dump_then_pooled(capsys, tmp_path):
    folder = tmp_path / "dumps"
    folder.mkdir()
    tiny_npz(folder / "a.npz")
    dsa_npz(folder / "b.npz")
    (folder / "notes.txt").write_text("not a dump")
    code, out, err = run(
        capsys,
        [
            "eval",
            "--workload",
            str(folder),
            "--queries",
            "2",
            "--budget",
            "16",
            "--segments",
            "4",
            "--block-size",
            "4",
            "--quiet",
            "--json",
            str(tmp_path / "r.json"),
        ],
    )
    assert code == 0, err
    names = [line.split(" — ")[0] for line in out.splitlines() if line.startswith("workload: ")]
    assert names == ["workload: a", "workload: b", "workload: pooled (2 workloads)"]
    assert "kvselect.indexer_topk on dumped DSA indexer: 3 index heads of dim 4" in out
    doc = strict_json(tmp_path / "r.json")
    assert [w["workload"] for w in doc["workloads"]] == ["a", "b"]
    pooled = {r["policy"]: r for r in doc["pooled"]["results"]}
    each = [{r["policy"]: r for r in w["results"]} for w in doc["workloads"]]
    # Both dumps have the same number of rows: the pooled mean is their mean.
    for name in POLICIES:
        want = (each[0][name]["recall_mean"] + each[1][name]["recall_mean"]) / 2
        assert pooled[name]["recall_mean"] == pytest.approx(want, abs=1e-12), name
    assert doc["pooled"]["n_kv_heads"] == 2


def test_one_unloadable_dump_among_several_exits_1_naming_it(capsys, tmp_path):
    good = tiny_npz(tmp_path / "good.npz")
    code, _, err = run(
        capsys,
        [
            "eval",
            "--workload",
            good,
            str(tmp_path / "missing.npz"),
            "--queries",
            "2",
            "--budget",
            "16",
            "--segments",
            "4",
            "--block-size",
            "4",
            "--quiet",
        ],
    )
    assert code == 1 and "missing.npz" in err


def test_an_empty_directory_exits_1_saying_so(capsys, tmp_path):
    code, _, err = run(capsys, ["eval", "--workload", str(tmp_path), "--quiet"])
    assert code == 1 and "no .npz file" in err


def test_the_index_noise_flag_reaches_the_synthetic_indexer(capsys):
    code, out, _ = run(capsys, [*TINY, "--index-noise", "0.5", "--index-heads", "2"])
    assert code == 0
    assert "index_heads=2, index_noise=0.5" in out
    assert "2 index heads of dim 16, noise 0.5" in out
    assert run(capsys, [*TINY, "--index-noise", "-1"])[0] == 2


def test_a_reader_that_leaves_early_gets_no_traceback():
    """`kvselect eval | head -1`: the pipe closes before the table is written."""
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-m", "kvselect", *TINY], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait() == 141 and "Traceback" not in err, err


@pytest.mark.parametrize("command", ["check", "eval"])
def test_each_options_help_shows_its_default_once(command, monkeypatch, capsys):
    # before: check's "--atol ATOL  absolute tolerance (default 0) (default: None)"
    from kvselect.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser = sub.choices[command]
    formatter = parser._get_formatter()
    for action in parser._actions:
        if action.help is None or action.help == argparse.SUPPRESS:
            continue
        text = formatter._expand_help(action)
        assert len(re.findall(r"\(default\b", text)) <= 1, (action.option_strings, text)
    for width in ("60", "100", "1000"):
        monkeypatch.setenv("COLUMNS", width)
        code, out, _ = run(capsys, [command, "--help"])
        assert code == 0
        lines = [line for line in out.splitlines() if len(re.findall(r"\(default\b", line)) > 1]
        assert not lines, lines
    if command == "check":
        atol = next(a for a in parser._actions if "--atol" in a.option_strings)
        assert formatter._expand_help(atol) == "absolute tolerance (default 0)"
