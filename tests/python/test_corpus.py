"""A corpus of dumps, evaluated and checked unit by unit, serially or on a
2-worker Dask ``LocalCluster``: the same tables and JSON (timing excepted),
a worker killed mid-run changes nothing, a corrupt dump is named and the
rest complete, Ctrl-C leaves no process behind, and a folder checked equals
its files checked one by one. (kvselect.corpus; docs/evaluating-policies.md.)"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import kvselect as ks
from kvselect import checking, cli, corpus, evaluate, workloads
from kvselect.checking.files import RangedArray, expand, take_rows

distributed = pytest.importorskip("distributed")
ml_dtypes = pytest.importorskip("ml_dtypes")


def _workload_dumps(folder, *, tokens=300, seed=0):
    """Four dumps in every form a workload takes, and a corrupt one."""
    rng = np.random.default_rng(seed)
    f = folder
    checking.save_dump(
        f / "a_derived_gqa.npz",
        "workload",
        q=rng.standard_normal((2, 4, tokens, 16)).astype(np.float32),
        k=rng.standard_normal((2, 2, tokens, 16)).astype(np.float32),
        v=rng.standard_normal((2, 2, tokens, 8)).astype(np.float16),
    )
    L, H, di = 2, 3, 8
    checking.save_dump(
        f / "b_dsa.npz",
        "workload",
        q=rng.standard_normal((L, 2, tokens, 16)).astype(ml_dtypes.bfloat16),
        k=rng.standard_normal((L, 1, tokens, 16)).astype(ml_dtypes.bfloat16),
        v=rng.standard_normal((L, 1, tokens, 16)).astype(np.float32),
        index_q=rng.standard_normal((L, tokens, H, di)).astype(np.float32),
        weights=rng.standard_normal((L, tokens, H)).astype(np.float32),
        index_k=rng.standard_normal((L, tokens, di)).astype(np.float32),
        key_scale=rng.random((L, tokens)).astype(np.float32),
    )
    checking.save_dump(
        f / "c_indexer.npz",
        "workload",
        q=rng.standard_normal((3, 2, tokens, 16)).astype(np.float32),
        k=rng.standard_normal((3, 2, tokens, 16)).astype(np.float32),
        v=rng.standard_normal((3, 2, tokens, 8)).astype(np.float32),
        index_q=rng.standard_normal((3, 2, tokens, 4)).astype(np.float32),
        index_k=rng.standard_normal((3, 2, tokens, 4)).astype(np.float32),
    )
    np.savez_compressed(
        f / "d_compressed.npz",
        q=rng.standard_normal((1, 2, tokens, 8)).astype(np.float32),
        k=rng.standard_normal((1, 2, tokens, 8)).astype(np.float32),
        v=rng.standard_normal((1, 2, tokens, 8)).astype(np.float32),
    )
    (f / "e_corrupt.npz").write_bytes(b"PK\x03\x04 this is not a whole zip")
    return f


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    return _workload_dumps(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as c:
        yield c


RUNS = evaluate.check_runs([32, 96], [evaluate.derive_settings(32)[0], evaluate.derive_settings(96)[0]])


def _untimed(report):
    """A report's dict without its timing (the one thing measured where a unit ran)."""
    d = report.to_dict() if hasattr(report, "to_dict") else dict(report)
    d.pop("seconds", None)
    d["results"] = [{k: v for k, v in r.items() if k != "select_us_per_query"} for r in d["results"]]
    return json.dumps(d, sort_keys=True)


def _json_untimed(path):
    doc = json.loads(path.read_text())
    for r in doc["workloads"] + [doc["pooled"]]:
        r.pop("seconds")
        for p in r["results"]:
            p.pop("select_us_per_query")
    return doc


def _serial(dumps):
    return corpus.evaluate_corpus(expand([dumps]), RUNS, queries=12)


def test_a_dumps_heads_read_one_at_a_time_are_load_npz_heads_bit_for_bit(dumps):
    for name in expand([dumps])[:4]:
        w = workloads.load_npz(name, queries=12)
        d = workloads.open_workload(name, queries=12)
        pos = d.query_positions
        assert np.array_equal(pos, w.query_positions) and d.source == w.source
        n_kv = w.n_kv_heads // d.n_layers
        for layer, h in d.units():
            a, b = w.head_inputs(layer * n_kv + h, pos), d.head(layer, h)
            for field in ("q", "k", "v", "index_q", "index_k"):
                x, y = getattr(a, field), getattr(b, field)
                assert x.dtype == y.dtype and np.array_equal(x, y), (name, field)
            for key, x in a.learned.items():
                y = b.learned[key]
                assert (
                    (x is None and y is None) or x == y if isinstance(x, (str, type(None))) else np.array_equal(x, y)
                ), (name, key)


def test_the_serial_corpus_run_equals_evaluate_on_each_loaded_dump(dumps):
    run = _serial(dumps)
    names = [os.path.basename(f.name) for f in run.failures]
    assert names == ["e_corrupt.npz"] and "not a NumPy .npz archive" in run.failures[0].error
    assert len(run.reports) == 4
    for name, report in zip(expand([dumps]), run.reports):
        assert _untimed(report) == _untimed(evaluate.evaluate(workloads.load_npz(name, queries=12), [32, 96], RUNS))


def test_a_two_worker_cluster_gives_exactly_the_serial_reports(dumps, cluster):
    serial = _serial(dumps)
    run = corpus.evaluate_corpus(
        expand([dumps]), RUNS, queries=12, executor=corpus.Dask(scheduler=cluster.scheduler_address)
    )
    assert [_untimed(r) for r in run.reports] == [_untimed(r) for r in serial.reports]
    assert _untimed(run.pooled) == _untimed(serial.pooled)
    assert [(f.name, f.error) for f in run.failures] == [(f.name, f.error) for f in serial.failures]
    assert len(run.stats.seconds) == 2 * 2 + 2 * 1 + 3 * 2 + 1 * 2  # one task per (layer, KV head)


@pytest.mark.parametrize(
    "experiment", [[], ["--boundary"], ["--boundary", "60"]], ids=["per-query", "boundary", "P=60"]
)
def test_the_cli_on_two_local_workers_prints_the_serial_tables_and_json(dumps, tmp_path, capsys, experiment):
    def table_without_timing(text):  # the select µs/query column and the seconds of a report
        return [
            line.rsplit("|", 2)[0] if line.startswith("|") else re.sub(r"; [0-9.]+ s$", "", line)
            for line in text.splitlines()
        ]

    out = {}
    for label, extra in (("serial", []), ("dask", ["--workers", "2"])):
        path = tmp_path / f"{label}.json"
        code = cli.main(
            [
                "eval",
                "--workload",
                str(dumps),
                "--budget",
                "32",
                "96",
                "--queries",
                "12",
                "--json",
                str(path),
                "--quiet",
                *experiment,
                *extra,
            ]
        )
        captured = capsys.readouterr()
        if experiment:  # the eviction baselines are rows of the boundary experiment
            assert "| SnapKV |" in captured.out and "| H2O |" in captured.out
        assert code == 1  # the corrupt dump
        assert "cannot load workload" in captured.err and "e_corrupt.npz" in captured.err
        out[label] = (table_without_timing(captured.out), _json_untimed(path))
        if label == "dask":
            assert "a local Dask cluster of 2 workers" in captured.err
    assert out["dask"] == out["serial"]


def test_a_worker_killed_during_the_run_changes_nothing(dumps, tmp_path):
    serial = _serial(dumps)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as c:

        def worker_pids():
            return [ws.pid for ws in c.scheduler.workers.values()]

        before = worker_pids()
        killed = []

        class KillOnFirstUpdate:
            total = 0

            def update(self, n):
                if not killed:  # one unit done, the rest queued or running: kill a worker now
                    pid = before[0]
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)

            def refresh(self):
                pass

            def close(self):
                pass

        run = corpus.evaluate_corpus(
            expand([dumps]),
            RUNS,
            queries=12,
            executor=corpus.Dask(scheduler=c.scheduler_address),
            progress=lambda total: KillOnFirstUpdate(),
        )
        assert killed and killed[0] not in worker_pids()  # it really died
    assert [_untimed(r) for r in run.reports] == [_untimed(r) for r in serial.reports]
    assert _untimed(run.pooled) == _untimed(serial.pooled)
    assert [f.name for f in run.failures] == [f.name for f in serial.failures]


def test_dumps_named_by_file_urls_and_in_memory_filesystems_give_the_same_reports(dumps, monkeypatch):
    fsspec = pytest.importorskip("fsspec")
    from kvselect.checking import dumps as reader

    monkeypatch.setattr(reader, "_EAGER_BYTES", 0)  # every stored member a RangedArray: ranges only
    local = expand([dumps])[:4]
    urls = [f"file://{p}" for p in local]
    mem = fsspec.filesystem("memory")
    for p in local:
        mem.pipe(f"/corpus/{os.path.basename(p)}", open(p, "rb").read())
    for names in (urls, expand(["memory:///corpus/*.npz"])):
        run = corpus.evaluate_corpus(names, RUNS, queries=12)
        assert not run.failures
        assert [_untimed(r) for r in run.reports] == [_untimed(r) for r in _serial(dumps).reports]


def test_a_ranged_array_reads_the_slices_numpy_gives(tmp_path):
    fsspec = pytest.importorskip("fsspec")
    rng = np.random.default_rng(3)
    a = rng.standard_normal((3, 4, 5, 6)).astype(np.float32)
    np.save(tmp_path / "x.npy", a)
    raw = (tmp_path / "x.npy").read_bytes()
    r = RangedArray(fsspec.filesystem("file"), str(tmp_path / "x.npy"), raw.index(a.tobytes()), a.shape, a.dtype, False)
    for key in [
        1,
        -1,
        (2, 3),
        (0, slice(1, 3)),
        (1, slice(None), 2),
        (2, 1, slice(2, 5), 4),
        slice(1, 3),
        (slice(0, 2), 1),
        (1, [0, 2]),
    ]:
        assert np.array_equal(r[key], a[key]), key
    pos = np.array([0, 2, 4])
    assert np.array_equal(take_rows(r, (1, 2), pos), a[1, 2][pos])
    assert np.array_equal(np.asarray(r), a) and r.view(np.int32).dtype == np.int32
    with pytest.raises(IndexError, match="index 3 is out of bounds for axis 0 with size 3"):
        r[3]


def test_a_urls_large_members_are_left_unread_until_indexed(tmp_path):
    a = np.arange(600_000, dtype=np.float32).reshape(2, 300_000)  # 2.4 MB: past the eager size
    np.savez(tmp_path / "x.npz", big=a, small=a[:, :10])
    got = checking.read_archive(f"file://{tmp_path}/x.npz", lazy=True)
    assert isinstance(got["big"], RangedArray) and isinstance(got["small"], np.ndarray)
    assert np.array_equal(got["big"][1, 5:9], a[1, 5:9])
    eager = checking.read_archive(f"file://{tmp_path}/x.npz")
    assert all(isinstance(x, np.ndarray) for x in eager.values())


def _check_dumps(folder):
    """A topk dump with a wrong row, a head-major blocks dump with one wrong,
    a witness dump, a correct topk dump and one that cannot be checked."""
    rng = np.random.default_rng(8)
    checking.make_example(str(folder / "a_topk_example.npz"))
    n, h, d, n_k = 9, 3, 8, 200
    cfg = ks.BlockSparseConfig(16, 4, 1, 1)
    q = rng.integers(-2, 3, (n, h, d)).astype(np.float32)
    k = rng.integers(-2, 3, (n_k, d)).astype(np.float32)
    pos = rng.integers(0, n_k, n)
    rows = ks.block_sparse_select(q, k, pos, cfg, head_major=True).astype(np.int64)
    bad = rows.copy()
    bad[1, 7, 0] = -1 if bad[1, 7, 0] != -1 else 0
    checking.save_dump(
        folder / "b_blocks.npz",
        "blocks",
        rows=bad,
        index_q=q,
        index_k=k,
        query_pos=pos,
        block_size=16,
        top_blocks=4,
        init_blocks=1,
        local_blocks=1,
        head_major=1,
    )
    lens = rng.integers(20, 200, 11).astype(np.int32)
    before = np.stack([rng.choice(L, 16, replace=False) for L in lens]).astype(np.int32)
    after = before.copy()
    ks.scatter_topology_witnesses(after, lens, 8)
    after[6, 9] = after[6, 8]
    checking.save_dump(
        folder / "c_witnesses.npz", "witnesses", before=before, after=after, context_lens=lens, num_segments=8
    )
    s = rng.standard_normal((10, 50)).astype(np.float32)
    lens = rng.integers(10, 50, 10).astype(np.int32)
    top = np.stack([np.argsort(-np.where(np.arange(50) < L, r, -np.inf))[:8] for r, L in zip(s, lens)])
    checking.save_dump(folder / "d_scores.npz", "topk", scores=s, context_lens=lens, rows=top.astype(np.int32))
    weights = rng.standard_normal((7, 2)).astype(np.float32)
    weights[5, 1] = np.nan
    checking.save_dump(
        folder / "e_nan.npz",
        "topk",
        rows=np.zeros((7, 4), np.int32),
        index_q=rng.standard_normal((7, 2, 4)).astype(np.float32),
        weights=weights,
        index_k=rng.standard_normal((30, 4)).astype(np.float32),
        query_pos=np.arange(20, 27),
    )
    return folder


@pytest.fixture(scope="module")
def check_dumps(tmp_path_factory):
    return _check_dumps(tmp_path_factory.mktemp("checks"))


def test_a_folder_checked_in_chunks_equals_each_dump_checked_whole(check_dumps):
    run = corpus.check_corpus(expand([check_dumps]), chunk_rows=2)
    assert [os.path.basename(n) for n, _ in run.results] == [
        "a_topk_example.npz",
        "b_blocks.npz",
        "c_witnesses.npz",
        "d_scores.npz",
    ]
    for name, result in run.results:
        assert checking.strict_json(result) == checking.strict_json(checking.check_dump(name)), name
    assert [r["wrong"] for _, r in run.results] == [1, 1, 1, 0]
    (failure,) = run.failures
    with pytest.raises(checking.DumpError) as whole:
        checking.check_dump(failure.name)
    assert failure.error == str(whole.value) and "weights[5, 1]" in failure.error  # the dump's row


def test_check_dumps_named_by_urls_and_read_in_byte_ranges_give_the_same_results(check_dumps, monkeypatch):
    from kvselect.checking import dumps as reader

    monkeypatch.setattr(reader, "_EAGER_BYTES", 0)
    local = corpus.check_corpus(expand([check_dumps]), chunk_rows=2)
    urls = corpus.check_corpus(expand([f"file://{check_dumps}"]), chunk_rows=2)
    assert [checking.strict_json(r) for _, r in urls.results] == [checking.strict_json(r) for _, r in local.results]
    assert [f.error for f in urls.failures] == [f.error for f in local.failures]
    assert all(name.startswith("file://") for name, _ in urls.results)


def test_check_over_a_folder_on_two_workers_equals_the_per_file_runs(check_dumps, tmp_path, capsys):
    path = tmp_path / "all.json"
    code = cli.main(["check", str(check_dumps), "--chunk-rows", "3", "--workers", "2", "--json", str(path)])
    out = capsys.readouterr().out
    assert code == 1  # a wrong row somewhere wins over a dump that cannot be checked
    assert "4 right" not in out and "1 right, 3 with wrong rows" in out and "1 could not be checked" in out
    doc = json.loads(path.read_text())
    for entry in doc["dumps"]:
        one = tmp_path / "one.json"
        cli.main(["check", entry["dump"], "--json", str(one)])
        capsys.readouterr()
        assert json.loads(one.read_text()) == entry["result"], entry["dump"]
    assert [os.path.basename(x["dump"]) for x in doc["cannot_check"]] == ["e_nan.npz"]


def test_ctrl_c_shuts_the_local_cluster_down_leaving_no_process(tmp_path):
    psutil = pytest.importorskip("psutil")
    rng = np.random.default_rng(1)
    for i in range(6):
        checking.save_dump(
            tmp_path / f"w{i}.npz",
            "workload",
            q=rng.standard_normal((4, 4, 4096, 32)).astype(np.float32),
            k=rng.standard_normal((4, 4, 4096, 32)).astype(np.float32),
            v=rng.standard_normal((4, 4, 4096, 32)).astype(np.float32),
        )
    p = subprocess.Popen(
        [sys.executable, "-m", "kvselect", "eval", "--workload", str(tmp_path), "--workers", "2", "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = p.stderr.readline()
        assert "local Dask cluster of 2 workers" in line, line
        deadline = time.time() + 60
        children = []
        while time.time() < deadline and len(children) < 2:
            children = [c for c in psutil.Process(p.pid).children(recursive=True)]
            time.sleep(0.2)
        assert len(children) >= 2, children  # the workers are up (and working)
        time.sleep(1.0)
        p.send_signal(signal.SIGINT)
        code = p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert code != 0
    _, alive = psutil.wait_procs(children, timeout=20)
    assert alive == [], alive


def _threads_after(threads):
    from kvselect.corpus import tasks

    tasks.use_threads(threads)
    return ks.get_num_threads()


def test_a_task_on_dask_takes_its_share_of_the_hosts_cores_never_more(cluster):
    """Two workers of one task thread each on one host: each task's native
    pool is half the cores (at least 1), so 2 workers x 1 task x threads <=
    cores; an explicit count is used as it is."""
    executor = corpus.Dask(scheduler=cluster.scheduler_address)
    with executor:
        (sharing,) = executor.host_threads.values()
        assert sharing == 2
        cores = len(os.sched_getaffinity(0))
        got = executor.client.submit(_threads_after, executor.host_threads, pure=False).result()
        assert got == max(1, cores // 2)
        assert executor.client.submit(_threads_after, 3, pure=False).result() == 3


def test_a_built_in_workload_is_not_sent_to_workers(capsys):
    code = cli.main(["eval", "--workload", "synthetic", "--workers", "2", "--quiet"])
    err = capsys.readouterr().err
    assert code == 1 and "'synthetic' is built in this process" in err and "drop the flag" in err


def test_without_dask_the_distributed_flags_name_the_extra_and_nothing_runs(dumps, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed -> ImportError
    code = cli.main(["eval", "--workload", str(dumps), "--workers", "2", "--quiet"])
    captured = capsys.readouterr()
    assert code == 1 and "pip install 'kvselect[distributed]'" in captured.err
    assert captured.out == ""  # no table: the run never started
    code = cli.main(["check", str(dumps), "--workers", "2"])
    assert code == 2 and "kvselect[distributed]" in capsys.readouterr().err


def test_a_url_without_fsspec_names_the_package(dumps, monkeypatch):
    monkeypatch.setitem(sys.modules, "fsspec", None)
    with pytest.raises(checking.DumpError, match=r"reading a URL needs fsspec \(pip install fsspec"):
        checking.read_archive(f"file://{dumps}/c_indexer.npz")
    assert checking.read_archive(dumps / "c_indexer.npz")  # a local path never needs it


def test_an_unknown_url_protocol_and_an_empty_pattern_are_named(tmp_path, capsys):
    assert cli.main(["check", "nosuchproto://bucket/x.npz"]) == 2
    assert "nosuchproto" in capsys.readouterr().err
    assert cli.main(["eval", "--workload", str(tmp_path / "*.npz"), "--quiet"]) == 1
    assert "a pattern that matches no file" in capsys.readouterr().err


def test_a_scheduler_that_cannot_be_reached_is_an_oserror_not_a_hang():
    with pytest.raises(OSError, match="tcp://127.0.0.1:9"):
        with corpus.Dask(scheduler="tcp://127.0.0.1:9", timeout=2):
            pass


def test_a_non_finite_value_fails_its_dump_naming_layer_head_and_token(tmp_path):
    rng = np.random.default_rng(2)
    k = rng.standard_normal((2, 2, 100, 8)).astype(np.float32)
    k[1, 0, 5, 3] = np.inf
    checking.save_dump(
        tmp_path / "nan.npz",
        "workload",
        q=rng.standard_normal((2, 2, 100, 8)).astype(np.float32),
        k=k,
        v=rng.standard_normal((2, 2, 100, 8)).astype(np.float32),
    )
    checking.save_dump(
        tmp_path / "ok.npz",
        "workload",
        q=rng.standard_normal((1, 2, 100, 8)).astype(np.float32),
        k=k[:1],
        v=rng.standard_normal((1, 2, 100, 8)).astype(np.float32),
    )
    run = corpus.evaluate_corpus(expand([tmp_path]), RUNS, queries=8)
    (failure,) = run.failures
    assert os.path.basename(failure.name) == "nan.npz"
    assert failure.error == "k: expected finite values (within float32 range), found inf at layer 1, KV head 0, token 5"
    assert [r.workload for r in run.reports] == ["ok"] and run.pooled is not None


def _case_dumps(folder):
    """Every dump ``kvselect.testing``'s cases build, one file each: the
    arrays each ``assert_*`` hands to ``check_dump`` for the case's exact
    answer, captured on the way (every rule's cases, every form)."""
    from kvselect import rules, testing
    from kvselect.testing import cases as hard

    captured = []
    real = testing.check_dump

    def record(d, **kwargs):
        captured.append(dict(d))
        return real(d, **kwargs)

    # Every module an assertion is written in (kvselect.testing, or a rule module
    # that keeps its assertion): its check_dump is recorded.
    homes = {testing} | {rules.resolve(a.rpartition(".")[0]) for r in rules.RULES for a in r.assertions}
    names = sorted(n for n in dir(hard) if n.startswith("all_") and n.endswith("_cases"))
    with pytest.MonkeyPatch.context() as mp:
        for home in homes:
            mp.setattr(home, "check_dump", record)
        for name in names:
            for item in getattr(hard, name)():
                case = item[1] if isinstance(item, tuple) else item
                if case.rule == "topk" and not case.meta.get("family") and not case.meta.get("non_finite"):
                    # assert_topk judges in memory: its dump is the inputs and the rows
                    inputs = {k: v for k, v in case.inputs.items() if v is not None}
                    captured.append({"kind": "topk", "rows": case.expected, **inputs})
                else:
                    case.assert_rows(case.expected)
    for i, d in enumerate(captured):
        kind = str(d.pop("kind"))
        checking.save_dump(folder / f"{i:03d}_{kind}.npz", kind, **d)
    return sorted(folder.glob("*.npz"))


def test_every_kind_the_cases_build_checks_the_same_on_two_workers_in_chunks(tmp_path, cluster):
    """Each rule's dump kind through the distributed path: cut into units of
    3 rows and run on two Dask workers, every result equals the dump checked
    whole in this process, and every one of them passes (the cases' answers
    are the exact ones)."""
    files = _case_dumps(tmp_path)
    kinds = {str(checking.load_dump(f)["kind"]) for f in files}
    assert set(checking.CHECK_KINDS) - kinds <= {"v4_combined"}, sorted(kinds)  # every kind but the grouped one
    serial = {f: checking.check_dump(f) for f in map(str, files)}
    assert all(r["wrong"] == 0 for r in serial.values())
    executor = corpus.Dask(scheduler=cluster.scheduler_address)
    with executor:
        run = corpus.check_corpus([str(f) for f in files], chunk_rows=3, executor=executor)
    assert run.failures == []
    assert [n for n, _ in run.results] == [str(f) for f in files]
    for name, result in run.results:
        assert checking.strict_json(result) == checking.strict_json(serial[name]), name
