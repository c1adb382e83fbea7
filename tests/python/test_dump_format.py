"""The one dump format of ``kvselect check`` and ``kvselect eval``: one loader,
one set of names and refusals, memory-mapped members, "cannot check" never
reported as "the engine is wrong"."""

import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from kvselect import checking
from kvselect.checking import DumpError, load_dump, save_dump
from kvselect.cli import main
from kvselect.workloads import WorkloadError, load_npz

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(capsys, *argv):
    try:
        code = main([*map(str, argv)])
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def topk_inputs(seed=0, n=4, h=3, d=8, keys=32, topk=5):
    """A correct topk dump's arrays: the indexer's inputs and its exact rows."""
    import kvselect as ks

    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n, h, d)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, (n, h)).astype(np.float32)
    k = rng.standard_normal((keys, d)).astype(np.float32)
    scale = rng.uniform(0.5, 2.0, keys).astype(np.float32)
    pos = np.sort(rng.integers(topk, keys, n))
    rows = ks.indexer_topk(q, w, k, pos, topk, key_scale=scale)
    return dict(index_q=q, weights=w, index_k=k, key_scale=scale, query_pos=pos, rows=rows)


def workload_arrays(layers=2, seed=0):
    rng = np.random.default_rng(seed)
    return dict(
        q=rng.standard_normal((layers, 2, 64, 8)).astype(np.float32),
        k=rng.standard_normal((layers, 1, 64, 8)).astype(np.float32),
        v=rng.standard_normal((layers, 1, 64, 8)).astype(np.float32),
    )


# --- item 1: unknown keys are refused, exit 2, naming the closest known one


def test_a_correct_topk_dump_with_its_key_scale_exits_0(tmp_path, capsys):
    p = tmp_path / "ok.npz"
    save_dump(p, "topk", **topk_inputs())
    code, out, _ = run(capsys, "check", p)
    assert code == 0, out


@pytest.mark.parametrize("wrong", ["index_k_scale", "key_scales"])
def test_a_misnamed_key_scale_exits_2_naming_the_key_and_key_scale(tmp_path, capsys, wrong):
    arrays = topk_inputs()
    arrays[wrong] = arrays.pop("key_scale")
    p = tmp_path / "bad.npz"
    np.savez(p, kind="topk", **arrays)  # by hand: save_dump would refuse it already
    code, _, err = run(capsys, "check", p)
    assert code == 2, err
    assert f"unknown key {wrong!r}" in err and "did you mean 'key_scale'?" in err


def test_save_dump_refuses_an_unknown_key_before_writing(tmp_path):
    p = tmp_path / "never.npz"
    with pytest.raises(DumpError, match="did you mean 'key_scale'"):
        save_dump(p, "topk", key_scales=np.ones(3, np.float32), **topk_inputs())
    assert not p.exists()


# --- item 2: messages name the dump's keys and the user's flags


def test_a_nan_index_k_is_refused_naming_index_k_and_its_index(tmp_path, capsys):
    arrays = topk_inputs()
    arrays["index_k"][7, 2] = np.nan
    p = tmp_path / "nan.npz"
    save_dump(p, "topk", **arrays)
    code, _, err = run(capsys, "check", p)
    assert code == 2
    assert "index_k[7, 2] is nan" in err and "magnitudes" not in err


def test_a_key_format_key_is_refused_suggesting_index_k_format(tmp_path, capsys):
    arrays = topk_inputs()
    arrays["index_k"] = (arrays["index_k"].view(np.uint32) >> 16).astype(np.uint16)
    p = tmp_path / "kf.npz"
    np.savez(p, kind="topk", key_format="bfloat16", **arrays)
    code, _, err = run(capsys, "check", p)
    assert code == 2
    assert "unknown key 'key_format'" in err and "did you mean 'index_k_format'?" in err


def test_raw_bits_without_their_format_are_refused_naming_the_dump_key(tmp_path, capsys):
    arrays = topk_inputs()
    arrays["index_k"] = (arrays["index_k"].view(np.uint32) >> 16).astype(np.uint16)
    p = tmp_path / "nofmt.npz"
    np.savez(p, kind="topk", **arrays)
    code, _, err = run(capsys, "check", p)
    assert code == 2
    assert "index_k_format" in err and "key_format" not in err.replace("index_k_format", "")


def test_native_messages_name_the_dump_keys_not_the_api_arguments():
    assert checking._common._in_dump_terms("view it with key_format, or query_format") == (
        "view it with index_k_format, or index_q_format"
    )


@pytest.mark.parametrize(
    "argv, want",
    [
        (["eval", "--budget", "abc"], "argument --budget: expected a positive integer, got 'abc'"),
        (["eval", "--segments", "x"], "argument --segments: expected a positive integer, got 'x'"),
        (["eval", "--seed", "1.5"], "argument --seed: expected a non-negative integer, got '1.5'"),
        (["eval", "--index-noise", "lots"], "argument --index-noise: expected a non-negative number, got 'lots'"),
        (["check", "x.npz", "--rtol", "tiny"], "argument --rtol: expected a non-negative number, got 'tiny'"),
        # and a number out of its range, named as the flag (not as the API's argument)
        (["eval", "--budget", "2147483648"], "argument --budget: must be at most 2147483647"),
        (["check", "x.npz", "--threads", "100000"], "argument --threads: must be at most 65536, got 100000"),
        (["check", "x.npz", "--show", "-1"], "argument --show: must be non-negative, got -1"),
    ],
)
def test_a_flag_that_is_not_a_number_is_named_never_the_parser_function(capsys, argv, want):
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert want in err and "invalid" not in err and "_positive" not in err


# --- item 3: one format, one loader


def test_an_old_eval_name_in_a_workload_is_refused_with_the_new_name(tmp_path):
    rng = np.random.default_rng(1)
    arrays = workload_arrays(layers=1)
    arrays.update(
        index_q=rng.standard_normal((1, 64, 3, 4)).astype(np.float32),
        index_weights=rng.uniform(0.5, 1.5, (1, 64, 3)).astype(np.float32),
        index_k=rng.standard_normal((1, 64, 4)).astype(np.float32),
    )
    np.savez(tmp_path / "old.npz", **arrays)
    with pytest.raises(
        WorkloadError,
        match="unknown key 'index_weights' in a workload dump "
        r"\(did you mean 'weights'\?\)",
    ):
        load_npz(tmp_path / "old.npz")


def test_a_workload_reads_bfloat16_raw_bits_with_their_format(tmp_path):
    arrays = workload_arrays()
    bits = {k: (v.view(np.uint32) >> 16).astype(np.uint16) for k, v in arrays.items()}
    save_dump(tmp_path / "bf.npz", "workload", **bits, q_format="bfloat16", k_format="bfloat16", v_format="bfloat16")
    w = load_npz(tmp_path / "bf.npz", layers=1)
    want = (bits["q"][1].astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(w.q, want)
    assert "bfloat16" in w.source


def test_a_workload_reads_the_api_names_in_the_dsa_form(tmp_path):
    rng = np.random.default_rng(2)
    arrays = workload_arrays(layers=1)
    arrays.update(
        index_q=rng.standard_normal((1, 64, 3, 4)).astype(np.float32),
        weights=rng.uniform(0.5, 1.5, (1, 64, 3)).astype(np.float32),
        index_k=rng.standard_normal((1, 64, 4)).astype(np.float32),
        key_scale=rng.uniform(0.5, 2, (1, 64)).astype(np.float32),
    )
    save_dump(tmp_path / "dsa.npz", "workload", **arrays)
    w = load_npz(tmp_path / "dsa.npz")
    assert w.indexer is not None
    np.testing.assert_array_equal(w.indexer.weights[0], arrays["weights"][0])
    np.testing.assert_array_equal(w.indexer.key_scale[0], arrays["key_scale"][0])


def test_a_plain_savez_of_q_k_v_without_kind_reads_as_a_workload(tmp_path):
    np.savez(tmp_path / "plain.npz", **workload_arrays())
    assert load_dump(tmp_path / "plain.npz").kind == "workload"
    assert load_npz(tmp_path / "plain.npz").n_kv_heads == 2


def test_a_topk_dump_is_refused_by_eval_and_a_workload_by_check(tmp_path, capsys):
    save_dump(tmp_path / "t.npz", "topk", **topk_inputs())
    with pytest.raises(WorkloadError, match="a topk dump, not workload"):
        load_npz(tmp_path / "t.npz")
    save_dump(tmp_path / "w.npz", "workload", **workload_arrays())
    code, _, err = run(capsys, "check", tmp_path / "w.npz")
    assert code == 2 and "a workload dump, not topk or blocks or witnesses" in err


def test_save_dump_writes_uncompressed_members_that_load_as_memory_maps(tmp_path):
    p = tmp_path / "w.npz"
    save_dump(p, "workload", **workload_arrays())
    with zipfile.ZipFile(p) as z:
        assert {i.compress_type for i in z.infolist()} == {zipfile.ZIP_STORED}
    d = load_dump(p)
    for key in ("q", "k", "v"):
        assert isinstance(d[key], np.memmap), key
        np.testing.assert_array_equal(d[key], workload_arrays()[key])


def test_a_workload_layer_is_read_through_the_memory_map(tmp_path, monkeypatch):
    """load_npz slices the chosen layer out of the memory-mapped member: the
    array it indexes is a memmap, and only that layer's values come out."""
    from kvselect.workloads import dumps as workloads  # the module that reads the archive

    p = tmp_path / "w.npz"
    arrays = workload_arrays(layers=3)
    save_dump(p, "workload", **arrays)
    seen = {}
    real = workloads._read_npz

    def spy(path, lazy):
        got, formats = real(path, lazy)
        seen.update(got)
        return got, formats

    monkeypatch.setattr(workloads, "_read_npz", spy)
    w = load_npz(p, layers=2)
    assert isinstance(seen["q"], np.memmap)
    np.testing.assert_array_equal(w.q, arrays["q"][2])


def test_compressed_archives_still_load_read_whole(tmp_path):
    p = tmp_path / "c.npz"
    np.savez_compressed(p, **workload_arrays())
    d = load_dump(p)
    assert not isinstance(d["q"], np.memmap)
    np.testing.assert_array_equal(load_npz(p, layers=0).q, workload_arrays()["q"][0])
    save_dump(tmp_path / "t.npz", "topk", **topk_inputs())
    with np.load(tmp_path / "t.npz") as z:
        np.savez_compressed(tmp_path / "tc.npz", **{k: z[k] for k in z.files})
    assert checking.check_dump(str(tmp_path / "tc.npz"))["wrong"] == 0


def test_an_eval_folder_with_one_bad_dump_names_it_pools_the_rest_and_exits_1(tmp_path, capsys):
    folder = tmp_path / "dumps"
    folder.mkdir()
    np.savez(folder / "a.npz", **workload_arrays(seed=1))
    bad = workload_arrays(seed=2)
    bad["Q"] = bad.pop("q")
    np.savez(folder / "b.npz", **bad)
    np.savez(folder / "c.npz", **workload_arrays(seed=3))
    code, out, err = run(
        capsys,
        "eval",
        "--workload",
        folder,
        "--queries",
        "2",
        "--budget",
        "16",
        "--segments",
        "4",
        "--block-size",
        "4",
        "--quiet",
    )
    assert code == 1
    assert "b.npz" in err and "unknown key 'Q'" in err
    names = [line.split(" — ")[0] for line in out.splitlines() if line.startswith("workload: ")]
    assert names == ["workload: a", "workload: c", "workload: pooled (2 workloads)"]
    assert "1 of 3 workloads could not be loaded" in err


def test_the_format_doc_is_the_tables(tmp_path):
    with open(os.path.join(ROOT, "docs", "dump-format.md")) as f:
        assert f.read() == checking.dump_format_markdown(), (
            "regenerate: python -c 'import kvselect.checking as c; "
            'print(c.dump_format_markdown(), end="")\' > docs/dump-format.md'
        )


def test_every_kind_has_a_table_and_save_dump_writes_each(tmp_path):
    assert set(checking.TABLES) == set(checking.KINDS)
    save_dump(
        tmp_path / "wi.npz",
        "witnesses",
        before=np.zeros((1, 4), np.int32),
        after=np.zeros((1, 4), np.int32),
        context_lens=[4],
        num_segments=2,
    )
    assert load_dump(tmp_path / "wi.npz").kind == "witnesses"


# --- item 5: submodules after `import kvselect`


def test_the_submodules_are_attributes_after_import_kvselect_in_a_fresh_interpreter():
    code = (
        "import kvselect\n"
        "for name in ('checking', 'reference', 'workloads', 'evaluate'):\n"
        "    assert name in dir(kvselect), name\n"
        "    assert getattr(kvselect, name).__name__ == 'kvselect.' + name\n"
        "help(kvselect.checking)\n"
        "try:\n"
        "    kvselect.no_such_thing\n"
        "except AttributeError:\n"
        "    print('ok')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.rstrip().endswith("ok")
