"""One computation at another SIMD level, in a child process
(``KVSELECT_SIMD`` is read once per process): the tests that compare a
level's rows and score bits against this process's."""

import os
import subprocess
import sys

import numpy as np
import pytest

#: Run ahead of every child: the child fails unless it runs at the level asked.
_LEVEL_CHECK = "import sys, kvselect\nassert kvselect.simd_level() == sys.argv[3], kvselect.simd_level()\n"


def assert_child_equals(
    child: str, tmp_path, level: str, expected: dict, timeout: float = 300, nan_bits: bool = True
) -> None:
    """Runs ``child`` (a script given ``in.npz``, ``out.npz`` and ``level``,
    with ``in.npz`` already in ``tmp_path``) at ``KVSELECT_SIMD=level``,
    failing unless the child runs at that level, then asserts that each of
    its outputs equals ``expected``'s: float32 arrays bit for bit (NaNs'
    payloads and zeros' signs too; with ``nan_bits=False`` a NaN may differ
    from another NaN in sign and payload), the others exactly."""
    subprocess.run(
        [sys.executable, "-c", _LEVEL_CHECK + child, str(tmp_path / "in.npz"), str(tmp_path / "out.npz"), level],
        check=True,
        env=dict(os.environ, KVSELECT_SIMD=level),
        timeout=timeout,
    )
    got = np.load(tmp_path / "out.npz")
    for name, want in expected.items():
        g = got[name]  # an NpzFile reads the array from the archive at each access
        assert g.dtype == want.dtype, name
        if want.dtype != np.float32:
            assert np.array_equal(g, want), name
        elif nan_bits:
            assert np.array_equal(g.view(np.uint32), want.view(np.uint32)), name
        else:
            nan = np.isnan(want)
            assert np.array_equal(np.isnan(g), nan), name
            assert np.array_equal(g[~nan].view(np.uint32), want[~nan].view(np.uint32)), name


def require_simd() -> None:
    """Skips an every-level test where the CPU's best kernel is the scalar one
    (there is no other level to compare), and fails it there instead under
    ``KVSELECT_REQUIRE_AVX2=1`` (``.ci/run``'s machines have AVX2). The scalar
    level by choice (``KVSELECT_SIMD=scalar``, as ``.ci/run`` runs the suite
    once) still compares against the children's levels."""
    import kvselect

    if kvselect.simd_level() == "scalar" and os.environ.get("KVSELECT_SIMD") != "scalar":
        if os.environ.get("KVSELECT_REQUIRE_AVX2") == "1":
            pytest.fail("KVSELECT_REQUIRE_AVX2=1, but the kernels dispatched to scalar")
        pytest.skip("this CPU only has the scalar kernel")


def level_runs(level: str) -> bool:
    """Whether ``KVSELECT_SIMD=level`` gives that level on this CPU (the pair
    level exists only with AVX512-BF16)."""
    got = subprocess.run(
        [sys.executable, "-c", "import kvselect; print(kvselect.simd_level())"],
        env=dict(os.environ, KVSELECT_SIMD=level),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return got == level
