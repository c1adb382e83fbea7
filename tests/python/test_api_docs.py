"""docs/api.md is written by scripts/api_docs.py from the live module's
docstrings: the committed file must be what the script writes now, and it
must name every public name, so neither a changed docstring nor a new
function can leave the reference behind."""

import dataclasses
import importlib.util
import inspect
import re
import sys
from pathlib import Path

import kvselect
import kvselect._core
from kvselect.rules import RULES

ROOT = Path(__file__).parents[2]
API_MD = ROOT / "docs" / "api.md"
SCRIPT = ROOT / "scripts" / "api_docs.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("api_docs", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["api_docs"] = module
    spec.loader.exec_module(module)
    return module


api_docs = _load_script()


def headings():
    return set(re.findall(r"^### `([^`]+)`$", API_MD.read_text(encoding="utf-8"), re.M))


def test_docs_api_md_is_what_the_script_writes_from_the_live_module():
    committed = API_MD.read_text(encoding="utf-8")
    assert committed == api_docs.render(), "docs/api.md is stale: run `python scripts/api_docs.py`"


def test_the_script_writes_the_same_text_twice():
    # deterministic: no timestamps, addresses or set order
    assert api_docs.render() == api_docs.render()
    assert not re.search(r" at 0x[0-9a-f]+>", api_docs.render())


def test_every_public_name_of_kvselect_has_its_own_section_in_docs_api_md():
    documented = headings()
    native = {n for n in dir(kvselect._core) if not n.startswith("_")}
    expected = {f"kvselect.{n}" for n in set(kvselect.__all__) | native}
    missing = sorted(expected - documented)
    assert not missing, f"not in docs/api.md: {missing}"


def test_the_checking_modules_public_functions_are_documented():
    documented = headings()
    for name in ("check_indexer_topk", "check_dump", "load_dump", "save_dump", "format_report", "example_path"):
        assert f"kvselect.checking.{name}" in documented
    for name in kvselect.workloads.__all__:
        assert f"kvselect.workloads.{name}" in documented
    assert "kvselect.evaluate.evaluate" in documented


def test_every_name_of_kvselect_is_in_a_concept_group_not_the_ungrouped_section():
    grouped = [n for _, names in api_docs.GROUPS for n in names]
    assert len(grouped) == len(set(grouped)), "a name is in two groups"
    assert sorted(grouped) == sorted(kvselect.__all__)
    assert f"## {api_docs.UNGROUPED}" not in API_MD.read_text(encoding="utf-8")


def test_a_name_missing_from_the_groups_still_lands_in_the_file(monkeypatch):
    dropped = api_docs.GROUPS[0][1][0]
    groups = [(title, [n for n in names if n != dropped]) for title, names in api_docs.GROUPS]
    monkeypatch.setattr(api_docs, "GROUPS", groups)
    text = api_docs.render()
    assert f"## {api_docs.UNGROUPED}" in text
    assert f"### `kvselect.{dropped}`" in text


def test_every_public_function_and_class_has_a_docstring_in_the_file():
    # a new function without a docstring cannot pass for documented
    undocumented = []
    for _title, _, entries in api_docs.sections():
        for qualname, obj in entries:
            if (inspect.isclass(obj) or callable(obj)) and api_docs._doc(obj) is None:
                undocumented.append(qualname)
    assert not undocumented, f"no docstring: {undocumented}"


def test_every_signature_and_docstring_appears_verbatim():
    text = API_MD.read_text(encoding="utf-8")
    for name in kvselect.__all__:
        obj = getattr(kvselect, name)
        if callable(obj) and not inspect.isclass(obj):
            assert api_docs.signature(obj, name) in text
            doc = api_docs._doc(obj)
            assert doc is not None and doc in text, name
    assert "indexer_topk(index_q, weights, index_k, query_pos, topk, *," in text


def test_check_mode_reports_a_stale_file_and_accepts_a_fresh_one(tmp_path, capsys):
    target = tmp_path / "api.md"
    target.write_text("stale\n", encoding="utf-8")
    assert api_docs.main(["--check", str(target)]) == 1
    assert "stale" in capsys.readouterr().err
    assert api_docs.main([str(target)]) == 0
    assert api_docs.main(["--check", str(target)]) == 0
    assert target.read_text(encoding="utf-8") == api_docs.render()


def _stub_doc(source, name):
    import ast

    node = next(n for n in ast.parse(source).body if getattr(n, "name", None) == name)
    return ast.get_docstring(node)


def _stub_docs():
    spec = importlib.util.spec_from_file_location("stub_docs", ROOT / "scripts" / "stub_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_stubs_docstrings_are_the_live_modules_one_source():
    # scripts/stub_docs.py writes _core.pyi's docstrings from the Rust `///`
    # text (what help() shows): the committed stub is what it writes now.
    # The stub read is the one beside the imported module (the clone's, or
    # the copy an installed wheel ships: its stub and its module agree too).
    stub = _stub_docs()
    shipped = Path(kvselect._core.__file__).with_name("_core.pyi").read_text()
    text, errors = stub.render(shipped, kvselect._core)
    assert not errors
    assert text == shipped, "python/kvselect/_core.pyi is stale: run python scripts/stub_docs.py"
    assert _stub_doc(text, "indexer_topk") == inspect.cleandoc(kvselect._core.indexer_topk.__doc__)


def test_a_stub_docstring_that_disagrees_is_rewritten():
    stub = _stub_docs()
    source = 'def segment_of(token: int, context_len: int, num_segments: int) -> int:\n    """clamps to S-1"""\n'
    text, errors = stub.render(source, kvselect._core)
    assert not errors and "clamps to S-1" not in text
    assert _stub_doc(text, "segment_of") == inspect.cleandoc(kvselect._core.segment_of.__doc__)


def _numpydoc_gaps(fn):
    """What ``fn``'s docstring lacks of numpydoc: a section header, or a
    parameter of its signature not named in Parameters (``name :``, or one
    of a combined ``a, b :`` line)."""
    doc = inspect.cleandoc(fn.__doc__ or "")
    gaps = [h for h in ("Parameters\n----------", "Returns\n-------", "Raises\n------") if h not in doc]
    params = doc.split("Parameters\n----------")[-1].split("Returns\n-------")[0]
    named = set()
    for line in params.splitlines():
        if line and not line.startswith(" "):
            named.update(n.strip() for n in line.split(":")[0].split(","))
    sig = inspect.signature(fn)
    gaps += [f"parameter {p}" for p in sig.parameters if p not in named]
    return gaps


def test_every_indexer_and_compressed_function_documents_parameters_returns_and_raises():
    names = [
        "indexer_topk",
        "indexer_topk_packed",
        "indexer_topk_paged",
        "indexer_scores",
        "indexer_magnitudes",
        "window_positions",
        "visible_entries",
        "compressed_entry_tokens",
        "expand_entries",
        "combine_topk_swa_indices",
    ]
    gaps = {n: g for n in names if (g := _numpydoc_gaps(getattr(kvselect, n)))}
    assert not gaps, gaps


# The public native functions and methods of src/python/block_sparse/,
# src/python/attention/ and src/python/runtime.rs, by hand (a new one is added here).
# BlockSparseConfig stands for its __new__: a class's parameters are documented on the
# class, which returns nothing.
_BLOCK_AND_ATTENTION = [
    "BlockSparseConfig",
    "block_sparse_select",
    "block_scores",
    "block_magnitudes",
    "block_sparse_select_packed",
    "block_sparse_select_paged",
    "positions_of_blocks",
    "Selector.local",
    "Selector.random",
    "Selector.sink_window",
    "Selector.row",
    "Selector.rows",
    "oracle_topk",
    "attention_probabilities",
    "dense_attention",
    "sparse_attention",
    "output_relative_error_rows",
    "output_relative_error",
    "set_num_threads",
]
# These take no argument and refuse nothing: Returns is their only section.
_NO_ARGUMENTS = ["Selector.dense", "get_num_threads", "simd_level"]


# The public native functions of src/python/witness.rs and src/python/check.rs
# (the class GlobalSlots documents its constructor's parameters).
WITNESS_AND_CHECK_FUNCTIONS = [
    "segment_of",
    "topology_witness_indices",
    "apply_topology_witnesses",
    "scatter_topology_witnesses",
    "random_null",
    "locality_null",
    "segment_coverage",
    "attention_mass_recall",
    "segment_coverage_rows",
    "slots_used_rows",
    "attention_mass_recall_rows",
    "check_topk",
    "check_blocks",
    "check_witnesses",
    "GlobalSlots",
    "GlobalSlots.positions",
]
NUMPYDOC_SECTION = re.compile(r"^(\w[\w ]*)\n-+$", re.MULTILINE)


def _numpydoc_sections(doc):
    """``{header: body}`` of a numpydoc docstring's underlined sections."""
    heads = list(NUMPYDOC_SECTION.finditer(doc))
    ends = [h.start() for h in heads[1:]] + [len(doc)]
    return {h.group(1): doc[h.end() : end] for h, end in zip(heads, ends)}


def _documented_parameter_set(section):
    """The names of the ``name : type`` (or ``a, b : type``) lines of a
    Parameters section."""
    names = set()
    for line in section.splitlines():
        m = re.match(r"^(\w+(?:, \w+)*) :", line)
        if m:
            names.update(m.group(1).split(", "))
    return names


def _native(qualname):
    obj = kvselect._core
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _signature_parameters(obj):
    text = obj.__text_signature__
    assert text and text.startswith("(") and text.endswith(")"), text
    names = []
    for part in text[1:-1].split(","):
        name = part.split("=")[0].strip().lstrip("*")
        if name and name not in ("/", "$self", "$cls", "self", "cls"):
            names.append(name)
    return names


def _section(doc, title):
    """The body of numpydoc section `title`, up to the next section header."""
    head = f"\n{title}\n{'-' * len(title)}\n"
    if head not in doc:
        return None
    body = doc.split(head, 1)[1]
    following = re.search(r"^\S[^\n]*\n-{3,}\n", body, re.MULTILINE)
    return body[: following.start()] if following else body


def _documented_parameters(section):
    names = []
    for line in re.findall(r"^(\w+(?:, \w+)*) :", section, re.MULTILINE):
        names.extend(line.split(", "))
    return names


def test_every_block_and_attention_function_documents_parameters_returns_and_raises():
    faults = []
    for qualname in _BLOCK_AND_ATTENTION:
        obj = _native(qualname)
        doc = inspect.cleandoc(obj.__doc__ or "")
        is_class = inspect.isclass(obj)
        for title in ("Parameters", "Raises") + (() if is_class else ("Returns",)):
            if _section(doc, title) is None:
                faults.append(f"{qualname}: no {title} section")
        raises = _section(doc, "Raises") or ""
        if not re.search(r"^(SelectionError|KvselectError|TypeError)$", raises, re.MULTILINE):
            faults.append(f"{qualname}: Raises names no exception class")
        documented = _documented_parameters(_section(doc, "Parameters") or "")
        for name in _signature_parameters(obj):
            if name not in documented:
                faults.append(f"{qualname}: parameter {name} is not documented as `{name} :`")
        extra = set(documented) - set(_signature_parameters(obj))
        if extra:
            faults.append(f"{qualname}: documents parameters it does not take: {sorted(extra)}")
    for qualname in _NO_ARGUMENTS:
        obj = _native(qualname)
        assert _signature_parameters(obj) == [], f"{qualname} takes arguments: document them"
        if _section(inspect.cleandoc(obj.__doc__ or ""), "Returns") is None:
            faults.append(f"{qualname}: no Returns section")
    assert not faults, "\n".join(faults)


def test_the_block_and_attention_list_names_every_function_those_files_register():
    # the explicit list above cannot fall behind the bindings
    registered = set()
    bindings = ROOT / "src" / "python"
    files = [*sorted((bindings / "block_sparse").glob("*.rs")), *sorted((bindings / "attention").glob("*.rs"))]
    files.append(bindings / "runtime.rs")
    for path in files:
        source = path.read_text(encoding="utf-8")
        registered |= set(re.findall(r"wrap_pyfunction!\((?:\w+::)*(\w+), m\)", source))
    public = {n for n in registered if not n.startswith("_")}
    listed = {n for n in _BLOCK_AND_ATTENTION + _NO_ARGUMENTS if "." not in n and n[0].islower()}
    assert public == listed


def test_the_section_reader_finds_a_missing_parameter():
    doc = "Summary.\n\nParameters\n----------\na, b : int\n    Two.\n\nReturns\n-------\nint\n    One.\n"
    assert _documented_parameters(_section(doc, "Parameters")) == ["a", "b"]
    assert _section(doc, "Raises") is None
    assert "int\n    One." in _section(doc, "Returns")


def test_every_witness_and_check_function_documents_parameters_returns_and_raises():
    for qualname in WITNESS_AND_CHECK_FUNCTIONS:
        obj = _native(qualname)
        doc = inspect.cleandoc(obj.__doc__ or "")
        headers = ["Parameters\n----------", "Raises\n------"]
        if not inspect.isclass(obj):  # a class documents its constructor: nothing returned
            headers.insert(1, "Returns\n-------")
        for header in headers:
            assert f"\n{header}\n" in doc, f"{qualname}: no {header.splitlines()[0]} section"
        sections = _numpydoc_sections(doc)
        assert sections["Raises"].strip(), f"{qualname}: empty Raises section"
        signature = inspect.signature(obj)
        params = [p for p in signature.parameters if p not in ("self", "$self")]
        assert params, f"{qualname}: no parameters in {obj.__text_signature__!r}"
        documented = _documented_parameter_set(sections["Parameters"])
        missing = [p for p in params if p not in documented]
        assert not missing, f"{qualname}: {missing} not documented as `name :` in Parameters"


def test_the_parameter_check_reads_combined_lines_and_sees_a_missing_name():
    section = "\na, b : float\n    Tolerances.\nout : ndarray, optional\n    Written.\n"
    assert _documented_parameter_set(section) == {"a", "b", "out"}
    doc = "Summary.\n\nParameters\n----------\nx : int\n    A count.\n\nReturns\n-------\nint\n"
    sections = _numpydoc_sections(doc)
    assert set(sections) == {"Parameters", "Returns"}
    assert _documented_parameter_set(sections["Parameters"]) == {"x"}
    assert "int" in sections["Returns"] and "x :" not in sections["Returns"]


# The public functions of kvselect.checking and kvselect.testing.cases: by hand but
# the rules' cases generators, derived from the registry (issue #24 §3; the
# completeness test below keeps the list from falling behind).
_CHECKING_AND_CASES = [
    "checking.decode32",
    "checking.save_dump",
    "checking.read_archive",
    "checking.validate",
    "checking.dump_format_markdown",
    "checking.load_dump",
    "checking.check_indexer_topk",
    "checking.check_indexer_family",
    "checking.check_dump",
    "checking.format_report",
    "checking.strict_json",
    "checking.make_example",
    "checking.example_path",
    "checking.check_v4_combined_indices",
    "checking.check_sparse_attention",
    "testing.cases.pytest_params",
    "testing.cases.tail_lengths",
    # every rule's cases generator (all_<rule>_cases), from the registry
    *(f"testing.cases.{r.cases.rpartition('.')[2]}" for r in RULES if r.cases is not None),
]
# These raise nothing of their own (no `raise` in their source, checked below): a
# malformed argument fails inside NumPy or a dict lookup, not in a refusal of theirs,
# so they have no Raises section. decode32, strict_json, format_report,
# dump_format_markdown, example_path: pure decoding / formatting of what they are
# given. tail_lengths and the all_*_cases lists: the generators they call with fixed,
# valid arguments.
_RAISE_NOTHING = {
    "checking.decode32",
    "checking.dump_format_markdown",
    "checking.format_report",
    "checking.strict_json",
    "checking.example_path",
    "testing.cases.tail_lengths",
    # every rule's cases generator (all_<rule>_cases), from the registry
    *(f"testing.cases.{r.cases.rpartition('.')[2]}" for r in RULES if r.cases is not None),
}
# These take no argument (checked below): Parameters would be empty, so it is omitted.
_TAKE_NOTHING = {"checking.dump_format_markdown", "checking.example_path"}
_EXCEPTIONS = {"DumpError", "SelectionError", "TypeError", "ValueError", "ImportError", "OSError"}


def _python_api(qualname):
    import importlib

    module, name = qualname.rsplit(".", 1)
    return getattr(importlib.import_module(f"kvselect.{module}"), name)


def _parameter_names(section):
    """The names a Parameters section documents: ``name :`` or ``a, b :`` lines at
    column 0 (``**arrays :`` names ``arrays``)."""
    names = []
    for line in section.splitlines():
        if line and not line[0].isspace() and " :" in line:
            names += [n.strip().lstrip("*") for n in line.split(" :")[0].split(",")]
    return names


def _python_function_faults(names, take_nothing, raise_nothing, exceptions):
    """What the pure-Python functions ``names`` lack of numpydoc: the three
    sections (Parameters unless it takes nothing, Raises unless its source
    raises nothing), exception classes in Raises, and exactly its parameters."""
    faults = []
    for qualname in names:
        fn = _python_api(qualname)
        doc = inspect.getdoc(fn) or ""
        params = list(inspect.signature(fn).parameters)
        if qualname in take_nothing:
            assert params == [], f"{qualname} takes arguments: document them"
        elif "Parameters\n----------" not in doc:
            faults.append(f"{qualname}: no Parameters section")
        if "Returns\n-------" not in doc:
            faults.append(f"{qualname}: no Returns section")
        if qualname in raise_nothing:
            assert not re.search(r"\braise\b", inspect.getsource(fn)), f"{qualname} raises: document it"
        elif "Raises\n------" not in doc:
            faults.append(f"{qualname}: no Raises section")
        else:
            named = set(re.findall(r"^(\w+)$", _section(doc, "Raises") or "", re.MULTILINE))
            if not named or not named <= exceptions:
                faults.append(f"{qualname}: Raises names {sorted(named)}, not exception classes")
        documented = _parameter_names(_section(doc, "Parameters") or "")
        missing = [p for p in params if p not in documented]
        if missing:
            faults.append(f"{qualname}: parameters {missing} not named in Parameters")
        extra = sorted(set(documented) - set(params))
        if extra:
            faults.append(f"{qualname}: documents parameters it does not take: {extra}")
    return faults


def test_every_checking_and_cases_function_documents_parameters_returns_and_raises():
    faults = _python_function_faults(_CHECKING_AND_CASES, _TAKE_NOTHING, _RAISE_NOTHING, _EXCEPTIONS)
    for cls in (kvselect.checking.Dump, kvselect.checking.DumpError, kvselect.testing.cases.Case):
        doc = inspect.getdoc(cls) or ""
        assert len(doc.splitlines()) > 2, f"{cls.__name__}: a one-line class docstring"
    for cls in (kvselect.checking.Dump, kvselect.testing.cases.Case):
        assert "Attributes\n----------" in (inspect.getdoc(cls) or ""), cls.__name__
    assert not faults, "\n".join(faults)


def test_the_checking_and_cases_list_names_every_public_function_of_those_packages():
    import kvselect.checking
    import kvselect.testing.cases

    # each a rule's generator of one input, documented on its own terms (the registry's)
    generators = {f.rpartition(".")[2] for r in RULES for f in r.case_functions}
    public = set()
    for prefix, module in (("checking", kvselect.checking), ("testing.cases", kvselect.testing.cases)):
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isfunction(obj) and name not in generators:
                public.add(f"{prefix}.{name}")
    assert public == set(_CHECKING_AND_CASES)


# The public functions of kvselect.evaluate, kvselect.workloads and kvselect.dump_hf,
# by hand (issue #24 §3; the completeness test below keeps the list from falling behind).
_EVALUATE_WORKLOADS_AND_DUMP_HF = [
    "evaluate.check_plot",
    "evaluate.derive_settings",
    "evaluate.evaluate",
    "evaluate.evaluate_many",
    "evaluate.figure",
    "evaluate.format_table",
    "evaluate.plot",
    "evaluate.check_runs",
    "evaluate.head_rows",
    "evaluate.resolve_boundary",
    "evaluate.prefix_length",
    "evaluate.report_header",
    "evaluate.pooled_header",
    "workloads.open_workload",
    "workloads.fp8_e4m3fn",
    "workloads.fp8_e4m3fn_bytes",
    "workloads.quantize_fp8",
    "workloads.quantize_rows",
    "workloads.derive_indexer",
    "workloads.example",
    "workloads.load_npz",
    "workloads.query_positions",
    "workloads.synthetic",
    "workloads.synthetic_needles",
    "dump_hf.dump_qkv",
    "dump_hf.find_attention",
    "dump_hf.main",
    "dump_hf.save",
]
# These raise nothing of their own (no `raise` in their source, and none in what they
# call with their arguments): format_table formats the report it is given; the fp8 and
# 8-bit quantisers are NumPy arithmetic on whatever array they are given.
_EVALUATE_RAISE_NOTHING = {
    "evaluate.format_table",
    "evaluate.report_header",
    "evaluate.pooled_header",
    "workloads.fp8_e4m3fn",
    "workloads.fp8_e4m3fn_bytes",
    "workloads.quantize_fp8",
    "workloads.quantize_rows",
}
# These take no argument (checked below): Parameters would be empty, so it is omitted.
_EVALUATE_TAKE_NOTHING = {"evaluate.check_plot"}
_EVALUATE_EXCEPTIONS = {
    "DumpError",
    "WorkloadError",
    "SettingsError",
    "ValueError",
    "ImportError",
    "OSError",
    "FileNotFoundError",
    "SystemExit",
}
# The public classes: a docstring of more than one line; the dataclasses (and the
# errors that carry a field) document their fields in Attributes.
_EVALUATE_WORKLOADS_AND_DUMP_HF_CLASSES = {
    "evaluate.PolicyResult": True,
    "evaluate.Report": True,
    "evaluate.Settings": True,
    "evaluate.SettingsError": True,
    "evaluate.Tally": False,
    "workloads.HeadInputs": True,
    "workloads.WorkloadDump": True,
    "workloads.Indexer": True,
    "workloads.Workload": True,
    "workloads.WorkloadError": False,
    "workloads.WorkloadWarning": False,
    "dump_hf.DumpError": False,
    "testing.CheckFailure": True,
}


def test_every_evaluate_workloads_and_dump_hf_function_documents_parameters_returns_and_raises():
    faults = _python_function_faults(
        _EVALUATE_WORKLOADS_AND_DUMP_HF, _EVALUATE_TAKE_NOTHING, _EVALUATE_RAISE_NOTHING, _EVALUATE_EXCEPTIONS
    )
    for qualname, has_attributes in _EVALUATE_WORKLOADS_AND_DUMP_HF_CLASSES.items():
        cls = _python_api(qualname)
        doc = inspect.getdoc(cls) or ""
        if len(doc.splitlines()) <= 2:
            faults.append(f"{qualname}: a one-line class docstring")
        if has_attributes and "Attributes\n----------" not in doc:
            faults.append(f"{qualname}: no Attributes section")
        if has_attributes and dataclasses.is_dataclass(cls):
            documented = _parameter_names(_section(doc, "Attributes") or "")
            missing = [f.name for f in dataclasses.fields(cls) if f.name not in documented]
            if missing:
                faults.append(f"{qualname}: fields {missing} not named in Attributes")
    assert not faults, "\n".join(faults)


def test_the_evaluate_workloads_and_dump_hf_lists_name_every_public_name_of_those_modules():
    import kvselect.dump_hf
    import kvselect.evaluate
    import kvselect.workloads

    functions, classes = set(), set()
    evaluate_names = kvselect.evaluate.__all__
    for prefix, module, names in (
        ("evaluate", kvselect.evaluate, evaluate_names),
        ("workloads", kvselect.workloads, kvselect.workloads.__all__),
        ("dump_hf", kvselect.dump_hf, kvselect.dump_hf.__all__),
    ):
        for name in names:
            obj = getattr(module, name)
            if inspect.isclass(obj):
                classes.add(f"{prefix}.{name}")
            elif inspect.isfunction(obj):
                functions.add(f"{prefix}.{name}")
    assert functions == set(_EVALUATE_WORKLOADS_AND_DUMP_HF)
    assert classes | {"testing.CheckFailure"} == set(_EVALUATE_WORKLOADS_AND_DUMP_HF_CLASSES)


def test_the_public_methods_of_the_python_classes_document_their_parameters_and_returns():
    from kvselect.checking import Dump
    from kvselect.evaluate import Report, Settings
    from kvselect.testing.cases import Case
    from kvselect.workloads import Indexer, Workload

    methods = [
        Dump.floats,
        Case.assert_rows,
        Indexer.inputs,
        Workload.learned_inputs,
        Settings.check,
        Settings.block_sparse_note,
        Report.oracle_gap,
        Report.to_dict,
    ]
    gaps = {}
    for m in methods:
        doc = inspect.getdoc(m) or ""
        missing = [h for h in ("Returns\n-------",) if h not in doc]
        params = [p for p in inspect.signature(m).parameters if p != "self"]
        if params and "Parameters\n----------" not in doc:
            missing.append("Parameters")
        missing += [p for p in params if not re.search(rf"^{p} :", doc, re.MULTILINE)]
        if missing:
            gaps[m.__qualname__] = missing
    assert not gaps, gaps
