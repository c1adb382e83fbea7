"""The ``kvselect`` command line: in process through ``kvselect.cli.main``
(output captured), and once as ``python -m kvselect``.

Exit codes: 0 on success, 2 on a usage error (argparse), 1 when the
workload cannot be loaded, the settings are inconsistent or a plot needs
the missing matplotlib.
"""

from __future__ import annotations

import json
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
    "eval", "--context", "256", "--queries", "3", "--budget", "32",
    "--segments", "4", "--block-size", "8", "--quiet",
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
        [sys.executable, "-m", "kvselect", "eval", "--context", "2048", "--queries", "4",
         "--budget", "128", "--segments", "16", "--block-size", "16", "--quiet"],
        capture_output=True, text=True, timeout=120,
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
    assert [(r["budget"], r["policy"]) for r in report["results"]] == [
        (b, name) for b in (24, 32) for name in POLICIES
    ]
    assert report["workload"] == "synthetic"
    assert report["tokens"] == 256 and report["queries"] == 3
    assert [s["budget"] for s in report["settings"]] == [24, 32]
    for r in report["results"]:
        assert 0.0 <= r["coverage"] <= 1.0
        assert 0.0 <= r["recall_p5"] <= r["recall_mean"] <= 1.0 + 1e-12
        assert r["slots_used"] <= r["budget"]
    # The learned top-k is upstream of kvselect: its time is not charged.
    assert report["results"][0]["select_us_per_query"] is None


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
    assert "matplotlib" in err
    assert "Traceback" not in err
    assert not path.exists()
    assert "budget k = 32" in out  # the table was still printed


def test_the_shipped_example_workload_runs(capsys):
    code, out, err = run(
        capsys,
        ["eval", "--workload", "example", "--queries", "2", "--budget", "32",
         "--segments", "4", "--block-size", "8", "--quiet"],
    )
    assert code == 0, err
    assert "workload: minilm-example" in out
    assert "| oracle top-k |" in out


def test_a_budget_above_the_context_selects_every_key(capsys, tmp_path):
    """The example has 512 tokens; the default budget is 2048."""
    path = tmp_path / "r.json"
    code, _, err = run(
        capsys, ["eval", "--workload", "example", "--queries", "2", "--quiet",
                 "--json", str(path)],
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
        capsys, ["eval", "--workload", path, "--queries", "2", "--budget", "16",
                 "--segments", "4", "--block-size", "4", "--quiet"],
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
    for option in ("--workload", "--budget", "--segments", "--block-size", "--init-blocks",
                   "--local-blocks", "--sinks", "--context", "--queries", "--seed",
                   "--threads", "--json", "--plot", "--quiet"):
        assert option in out, option
    assert "example" in out and ".npz" in out


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
        (["--segments", "64", "--budget", "32"], "cannot exceed the budget"),
        (["--segments", "65", "--budget", "128"], "segments must be in 1..64"),
        (["--block-size", "64", "--budget", "32"], "at least one block"),
        (["--local-blocks", "4", "--budget", "32"], "exceed the budget"),
        (["--segments", "16", "--budget", "64", "8"], "segments (16) cannot exceed the budget (8)"),
    ],
)
def test_inconsistent_settings_exit_1_with_the_reason(capsys, extra, hint):
    code, out, err = run(capsys, [*TINY, *extra])
    assert code == 1
    assert err.startswith("kvselect eval: ")
    assert hint in err
    assert out == ""
