"""What every assertion of :mod:`kvselect.testing` shares: :class:`CheckFailure`,
the host copy of a DLPack argument (:func:`_host`), the conclusion of a report
(:func:`_conclude`) and a dump's array entry (:func:`_as_dump_array`).

A module of its own, below :mod:`kvselect.testing`, so that an assertion written
in its rule's module (``kvselect/rules/<rule>.py``, docs/adding-a-rule.md)
imports these from a private module as the earlier rules' assertions use them
from the package; :class:`CheckFailure` is ``kvselect.testing.CheckFailure``
(its ``__module__`` says so, and the package exports it).
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np

from kvselect._core import _dlpack_array
from kvselect.checking import Report, format_report

# DLPack's DLDeviceType for host memory (kDLCPU).
_DL_CPU = 1


class CheckFailure(AssertionError):
    """A selection that is not right (or whose check proves nothing).

    An :class:`AssertionError`, so pytest shows it as a failed assertion. Its
    message is the ``kvselect check`` report as text.

    Attributes
    ----------
    report : Report
        The report (a :class:`kvselect.checking.Report`, as
        :func:`kvselect.checking.check_dump` returns it).
    """

    __module__ = "kvselect.testing"  # where users import it from (and pickle finds it)

    def __init__(self, message: str, report: Report) -> None:
        super().__init__(message)
        self.report = report


def _host(x: Any, name: str) -> Any:
    """``x`` where kvselect can read it: a NumPy array passes through; a
    DLPack object on another device is copied to the host once (torch
    ``.cpu()``, CuPy ``.get()``, JAX ``jax.device_get``, else
    ``numpy.from_dlpack(x, device="cpu", copy=True)``); a CPU DLPack object
    (or the host copy) is viewed in place through the core's DLPack reader
    (zero-copy; bfloat16 / float8_e4m3fn as ml_dtypes views of the same
    bytes). Anything else (lists, scalars, None) is
    passed on unchanged."""
    if x is None or isinstance(x, np.ndarray) or not hasattr(x, "__dlpack_device__"):
        return x
    try:
        device = int(x.__dlpack_device__()[0])
    except Exception:
        # A broken device protocol: the core's reader below refuses it as it
        # does at every entry point (the domain's error, naming the argument).
        device = _DL_CPU
    if device != _DL_CPU:
        module = type(x).__module__ or ""
        if callable(getattr(x, "cpu", None)):  # torch
            x = x.cpu()
        elif module.startswith("cupy") and callable(getattr(x, "get", None)):
            return x.get()
        elif module.startswith("jax"):
            import jax  # type: ignore[import-not-found]

            return np.asarray(jax.device_get(x))
        else:
            try:
                return np.from_dlpack(x, device="cpu", copy=True)
            except Exception as e:
                raise TypeError(
                    f"{name}: a tensor on DLPack device {device}, which kvselect cannot "
                    f"copy to the host ({e}): pass it as a CPU tensor (.cpu())"
                ) from e
    # On the host: the core's own zero-copy view of the producer's memory;
    # bfloat16 / float8_e4m3fn (raw bits there) as ml_dtypes views of it.
    arr, fmt = _dlpack_array(x, name)
    if fmt is None:
        return arr
    try:
        import ml_dtypes
    except ImportError as e:
        raise TypeError(
            f"{name}: a {fmt} DLPack tensor needs ml_dtypes in kvselect.testing (pip install 'kvselect[formats]')"
        ) from e
    return arr.view(getattr(ml_dtypes, fmt))


def _conclude(result: Report, fail_vacuous: bool, what: str) -> Report:
    """Return ``result`` when every row is right (and, with
    ``fail_vacuous``, no row is vacuous); raise :class:`CheckFailure` with
    the report's text otherwise."""
    vacuous = sum(int(c["report"].get("vacuous", 0)) for c in result["checks"])
    result["vacuous"] = vacuous
    if result["wrong"] == 0 and not (fail_vacuous and vacuous):
        return result
    text = format_report(result, source=f"({what})")
    if result["wrong"] == 0:
        text += (
            f"\n{what}: {vacuous} vacuous row(s) fail the assertion (fail_vacuous=True): the test "
            f"proves nothing about them; pass fail_vacuous=False to accept them"
        )
    raise CheckFailure(text, result)


def _as_dump_array(a: Any, key: str, out: Dict[str, Any], fmt: Optional[str] = None) -> None:
    """Put ``a`` in a dump dict under ``key``: an ml_dtypes array as its raw
    bits with ``<key>_format``, raw bits with ``fmt`` likewise."""
    arr = np.asarray(a)
    name = arr.dtype.name
    if name in ("bfloat16", "float8_e4m3fn"):
        out[key] = np.ascontiguousarray(arr).view(np.uint16 if name == "bfloat16" else np.uint8)
        out[f"{key}_format"] = np.asarray(name)
    else:
        out[key] = arr
        if fmt is not None and fmt != "float32":
            out[f"{key}_format"] = np.asarray(fmt)
