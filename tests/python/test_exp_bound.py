"""The project's ``exp`` bound, as the core states it and docs/kernels.md quotes it.

The bound itself is proved exhaustively in Rust (``src/exp/mod.rs``,
``exp_bound_is_exhaustive``, run by ``.ci/run``); here: the figures the docs give are
the core's.
"""

from __future__ import annotations

import pathlib

import numpy as np

from kvselect import _core

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "kernels.md"


def test_the_docs_quote_the_cores_bound() -> None:
    rel, lo = _core._exp_bound()
    assert rel == 8.5e-8
    assert np.float32(lo) == np.float32(-87.33655)
    text = DOCS.read_text()
    assert "8.5·10⁻⁸" in text and "EXP_LO = -87.33655" in text
    # Below one and a half float32 ulps at 1, above half of one: a bound on
    # a faithful-ish exp, not a placeholder.
    assert 2.0**-25 < rel < 1.5 * 2.0**-24
