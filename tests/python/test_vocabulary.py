"""docs/vocabulary.md is the API's vocabulary: every parameter name of every
public function, method and constructor is in its table, so a new name (or a
second spelling of an old meaning) cannot arrive without a line there."""

import inspect
import re
from pathlib import Path

import kvselect as ks

TABLE = Path(__file__).parents[2] / "docs" / "vocabulary.md"


def documented_names():
    names = set()
    for line in TABLE.read_text().splitlines():
        if line.startswith("| `"):
            first_cell = line.split("|")[1]
            names.update(re.findall(r"`([A-Za-z_]+)`", first_cell))
    return names


def public_parameters():
    """(callable's name, parameter name) of every public signature."""
    found = []
    for name in ks.__all__:
        obj = getattr(ks, name)
        targets = []
        if inspect.isclass(obj):
            if issubclass(obj, BaseException):
                continue
            targets.append((name, obj))
            for attr, member in vars(obj).items():
                if not attr.startswith("_") and callable(member):
                    targets.append((f"{name}.{attr}", getattr(obj, attr)))
        elif callable(obj):
            targets.append((name, obj))
        for label, fn in targets:
            try:
                sig = inspect.signature(fn)
            except (TypeError, ValueError):
                continue
            found += [(label, p) for p in sig.parameters if p not in ("self", "cls")]
    return found


def test_every_public_parameter_name_is_in_the_vocabulary_table():
    params = public_parameters()
    assert len(params) > 100  # the signatures were really read
    missing = sorted({p for _, p in params} - documented_names())
    assert not missing, f"parameters missing from docs/vocabulary.md: {missing}"


def test_the_renamed_homonyms_are_gone_from_every_signature():
    # layout (a page format string and a GlobalSlots), num_blocks (visible
    # blocks and vLLM's pages), a magnitudes bool beside the magnitudes array
    names = {p for _, p in public_parameters()}
    assert not names & {"layout", "num_blocks"}
    for fn in (ks.indexer_scores, ks.block_scores):
        assert "magnitudes" not in inspect.signature(fn).parameters
