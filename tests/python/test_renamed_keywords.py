"""A keyword renamed in the API says its new name (issue 37 item 5).

The entry points whose keywords were renamed (``layout=`` → ``page_layout=`` /
``slots=``, ``num_blocks=`` → ``visible_blocks=``, ``magnitudes=True`` → their own
functions) refuse the old keyword with the parser's ``TypeError`` and its message,
followed by what replaced it; any other unknown keyword is the parser's message
alone; and the signatures they show are unchanged (the old names are not in them).
"""

import inspect
import re

import numpy as np
import pytest

import kvselect

# (function, its positional arguments, the old keyword and its value, what the refusal adds)
RENAMED = [
    ("indexer_topk_paged", 8, {"layout": "fp8_scaled"}, "layout= is now page_layout="),
    ("check_topk", 2, {"layout": None}, "layout= is now slots="),
    ("check_blocks", 3, {"layout": None}, "layout= is now slots="),
    ("check_blocks", 3, {"num_blocks": [1]}, "num_blocks= is now visible_blocks="),
    ("indexer_scores", 4, {"magnitudes": True}, "magnitudes=True is now its own function, indexer_magnitudes"),
    ("block_scores", 3, {"magnitudes": True}, "magnitudes=True is now its own function, block_magnitudes"),
]


@pytest.mark.parametrize("name,n_args,old,hint", RENAMED, ids=[f"{r[0]}-{next(iter(r[2]))}" for r in RENAMED])
def test_an_old_keyword_names_its_replacement(name, n_args, old, hint):
    key = next(iter(old))
    want = f"{name}() got an unexpected keyword argument '{key}': {hint}"
    with pytest.raises(TypeError, match=f"^{re.escape(want)}$"):
        getattr(kvselect, name)(*[None] * n_args, **old)


@pytest.mark.parametrize("name,n_args", sorted({(r[0], r[1]) for r in RENAMED}))
def test_any_other_unknown_keyword_is_the_parsers_refusal(name, n_args):
    want = f"{name}() got an unexpected keyword argument 'bogus'"
    with pytest.raises(TypeError, match=f"^{re.escape(want)}$"):
        getattr(kvselect, name)(*[None] * n_args, bogus=1)


@pytest.mark.parametrize("name", sorted({r[0] for r in RENAMED}))
def test_the_signature_shown_is_unchanged(name):
    params = inspect.signature(getattr(kvselect, name)).parameters
    assert not any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params.values())
    assert not {"layout", "num_blocks"} & set(params)
    # the checkers take a magnitudes array; the score functions no magnitudes flag
    assert name.startswith("check_") or "magnitudes" not in params


def test_the_old_keyword_is_refused_before_any_argument_is_read():
    # a call that would otherwise be refused for its arrays names the rename first
    with pytest.raises(TypeError, match="layout= is now page_layout="):
        kvselect.indexer_topk_paged(np.zeros(3), None, None, None, None, None, None, None, layout="dense")


def test_the_new_keyword_still_works_beside_the_refusal():
    # block_magnitudes answers what magnitudes=True used to
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 1, 8)).astype(np.float32)
    k = rng.standard_normal((300, 8)).astype(np.float32)
    m = kvselect.block_magnitudes(q, k, [10, 299])
    assert m.shape == kvselect.block_scores(q, k, [10, 299]).shape
