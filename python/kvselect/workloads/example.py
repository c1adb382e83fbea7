"""The real workload shipped with the package: all-MiniLM-L6-v2 on the GPL-2
licence text (``kvselect/data``)."""

from __future__ import annotations

from dataclasses import replace

from kvselect.workloads.dumps import load_npz
from kvselect.workloads.model import Workload

#: The file name of the shipped example inside the package's ``data`` folder.
EXAMPLE_FILE = "minilm_example.npz"


def example(*, queries: int = 64, seed: int = 0) -> Workload:
    """The shipped real workload: all-MiniLM-L6-v2 on the GPL-2 licence text.

    Query, key and value projections of 3 layers x 3 heads (multi-head: each
    head is its own KV head), all 512 tokens of one text, stored float16 in
    ``kvselect/data/minilm_example.npz`` in the documented format (see
    ``kvselect/data/README.md`` for provenance and which heads). The model is
    bidirectional; the evaluation applies a causal mask. Context is short:
    use small blocks (8-32) with it. The indexer is derived
    (:func:`derive_indexer`).

    Parameters
    ----------
    queries : int
        Query positions to evaluate (as for :func:`load_npz`).
    seed : int
        The query positions' seed (as for :func:`load_npz`).

    Returns
    -------
    Workload
        Named ``minilm-example``.

    Raises
    ------
    WorkloadError
        ``queries`` is not a positive int.
    """
    from importlib import resources

    ref = resources.files("kvselect").joinpath("data").joinpath(EXAMPLE_FILE)
    with resources.as_file(ref) as path:
        workload = load_npz(path, queries=queries, seed=seed)
    return replace(
        workload,
        name="minilm-example",
        source="all-MiniLM-L6-v2 on the GPL-2 licence text, " + workload.source,
    )
