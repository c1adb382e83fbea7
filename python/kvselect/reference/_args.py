"""The reference's shared argument rules: the error mirror classes
(``ReferenceWitnessError``, ``ReferenceSelectionError``) and the one
conversion layer every public function reads its arguments through (the
native binding layer's rules: counts, index and float arrays, axes, query
positions, ``out=`` buffers).

Part of ``kvselect.reference``; see that package's docstring.
"""

from __future__ import annotations

import functools
import inspect
import operator
from typing import Any, Callable, List, Optional, TypeVar, cast

import numpy as np

# ==========================================================================
# Errors
# ==========================================================================


class ReferenceWitnessError(ValueError):
    """A refused call, shaped like ``kvselect.WitnessError``.

    ``variant`` is ``"RowsMismatch"``, ``"SegmentsOutOfRange"`` or
    ``"LearnedKeepOutOfRange"``; the variant's fields are attributes.
    """

    def __init__(self, variant: Optional[str], message: str, *, argument: Optional[str] = None, **fields: int) -> None:
        super().__init__(message)
        self.variant = variant
        self.argument = argument
        for name, value in fields.items():
            setattr(self, name, value)


class ReferenceSelectionError(ValueError):
    """A refused block-selection or attention call, shaped like
    ``kvselect.SelectionError``; ``argument`` names the argument."""

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(message)
        self.argument = argument


# ==========================================================================
# Input conversion: the one layer every public function reads through
# --------------------------------------------------------------------------
# As the native bindings do, a refusal belongs to a domain: a witness-domain
# argument that the bindings refuse (not one of the spec's variants) is a
# plain ``ValueError``; a selection-domain one (block selection, attention,
# the batched metrics) is a ``ReferenceSelectionError`` naming the argument.
# ==========================================================================

_WITNESS = "witness"
_SELECTION = "selection"

_I32_MIN = -(2**31)
_I32_MAX = 2**31 - 1
_I64_MAX = 2**63 - 1


def _refuse(domain: str, argument: str, message: str) -> ValueError:
    """The refusal of ``argument`` in ``domain`` (to be raised)."""
    if domain == _SELECTION:
        return ReferenceSelectionError(argument, message)
    return ReferenceWitnessError(None, message, argument=argument)


def _count(name: str, value: Any) -> int:
    """A count, length or position: a non-negative integer, as a Python int.
    Anything but an integer is a ``TypeError``; a negative one a ``ValueError``."""
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}") from None
    if v < 0:
        raise ValueError(f"{name} must be non-negative, got {v}")
    return v


def _index_array(name: str, value: Any, ndim: int, domain: str, *, positions: bool = False) -> np.ndarray:
    """An integer array of ``ndim`` dimensions, as int64 for the arithmetic.

    Integers of any width are accepted (an empty array of any dtype too);
    floats are a ``TypeError``. An index array's values must fit int32 (the
    native ``int32_array``); a position array's (``positions=True``: query
    positions, offsets, ids, lengths) must be non-negative and fit int64 (the
    native ``int64_array``). A wrong ``ndim`` or value is refused in ``domain``.
    """
    a = np.asarray(value)
    if a.size == 0 and a.dtype.kind not in "iu":
        a = a.astype(np.int64)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got dtype {a.dtype}")
    if a.ndim != ndim:
        raise _refuse(domain, name, f"{name} must be {ndim}-D, got shape {a.shape}")
    if a.size:
        # Compare in the array's own dtype: a cast first could wrap uint64 values.
        lo, hi = int(a.min()), int(a.max())
        if positions and lo < 0:
            raise _refuse(domain, name, f"{name} holds a negative value")
        if positions and hi > _I64_MAX:
            raise _refuse(domain, name, f"{name} holds {hi}, past any position")
        if not positions and (lo < _I32_MIN or hi > _I32_MAX):
            raise _refuse(domain, name, f"{name} holds values outside int32")
    return a.astype(np.int64)


def _scales(name: str, value: Any) -> np.ndarray:
    """A per-token scale vector: 1-D floats (as natively: integers or complex are a
    ``TypeError``, another rank a refusal naming it), as float32."""
    a = np.asarray(value)
    if a.dtype.kind != "f":
        raise TypeError(f"{name} must hold floats, got dtype {a.dtype}")
    if a.ndim != 1:
        raise ReferenceSelectionError(name, f"{name} must be 1-D [n], got {a.ndim}-D")
    return a.astype(np.float32)


def _int_list(name: str, value: Any) -> List[int]:
    """A 1-D array of non-negative integers (offsets, lengths) as a list, refused
    naming ``name`` as natively otherwise."""
    return [int(x) for x in _index_array(name, value, 1, "selection", positions=True).tolist()]


def _float_array(name: str, value: Any, ndim: Optional[int], domain: str, *, dtype: Any = np.float32) -> np.ndarray:
    """A float array of ``ndim`` dimensions (any when None), converted to
    ``dtype`` (what the native kernel computes on: float32 for tensors and
    outputs, float64 for attention rows) and widened to float64 for the
    arithmetic. Non-float data is a ``TypeError`` unless the array is empty."""
    a = np.asarray(value)
    if a.dtype.kind != "f" and a.size > 0:
        raise TypeError(f"{name} must be a float array, got dtype {a.dtype}")
    if ndim is not None and a.ndim != ndim:
        raise _refuse(domain, name, f"{name} must be {ndim}-D, got shape {a.shape}")
    return a.astype(dtype).astype(np.float64)


def _axes(name: str, got: tuple, want: list) -> None:
    """Refuses ``name`` unless its shape is ``want`` (``[(axis, size), ...]``)
    axis by axis, naming both shapes, as the native ``Args::axes``."""
    if tuple(got) != tuple(n for _, n in want):
        axes = ", ".join(f"{a}={n}" for a, n in want)
        raise ReferenceSelectionError(name, f"{name} must be [{axes}], got {list(got)}")


def _query_batch(query_pos: Any) -> np.ndarray:
    """``query_pos`` as int64 ``[n_queries]``: one position per query, or one
    integer (a 0-D array too) for a batch of one query, read as ``[p]``."""
    if np.ndim(query_pos) == 0:
        try:
            return np.array([_count("query_pos", query_pos)], dtype=np.int64)
        except ValueError as e:
            raise ReferenceSelectionError("query_pos", str(e)) from None
    return _index_array("query_pos", query_pos, 1, _SELECTION, positions=True)


def _query_positions(value: Any, n: int) -> np.ndarray:
    """:func:`_query_batch` for a batch of ``n`` queries (fixed by ``index_q``):
    ``[n_queries=n]``, or one integer when ``n`` is 1."""
    if np.ndim(value) == 0:
        if n != 1:
            raise ReferenceSelectionError(
                "query_pos", f"query_pos is one integer (a batch of one query), but index_q has n_queries={n}"
            )
        return _query_batch(value)
    a = np.asarray(value)
    pos = _index_array("query_pos", a, a.ndim, _SELECTION, positions=True)
    _axes("query_pos", pos.shape, [("n_queries", n)])
    return pos


def _along(name: str, value: Any, axis: tuple) -> np.ndarray:
    """A position array (``seq_ids``) whose one axis another argument fixes."""
    a = np.asarray(value)
    out = _index_array(name, a, a.ndim, _SELECTION, positions=True)
    _axes(name, out.shape, [axis])
    return out


def _native_pages(kv_cache: Any) -> np.ndarray:
    """A paged cache as the native call reads it, in place: refused (naming
    ``kv_cache``) in non-native byte order, which is never converted. Its dtype
    is checked after the layout's name (:func:`_readable_pages`), as natively."""
    cache = np.asarray(kv_cache)
    if cache.dtype.itemsize > 1 and not cache.dtype.isnative:
        raise ReferenceSelectionError(
            "kv_cache",
            f"kv_cache has non-native byte order ({cache.dtype.str}): pages are read in place, never "
            "converted; pass native byte order (kv_cache.astype(kv_cache.dtype.newbyteorder('=')))",
        )
    return cache


def _readable_pages(cache: np.ndarray) -> np.ndarray:
    """``cache`` (native byte order) unless it holds float64 or wider, a ``TypeError``:
    the native call reads pages in place and never converts them."""
    if cache.dtype.kind == "f" and cache.dtype.itemsize > 4:
        raise TypeError(
            f"kv_cache has dtype {cache.dtype}, and is read in place, never converted: pass float32, "
            "float16, ml_dtypes bfloat16 / float8_e4m3fn, or a raw uint16 / uint8 view with its format"
        )
    return cache


def _table_row(table: np.ndarray, s: int, need: int, n_pages: int, what: str) -> None:
    """Checks sequence ``s``'s block-table row as the native paged calls do, naming
    ``block_table``: ``need`` pages long at least (``what`` says what they hold), and
    every entry among them a page of the cache (NumPy would read a negative one from
    the end)."""
    if need > table.shape[1]:
        raise ReferenceSelectionError("block_table", f"{what} need {need} pages, rows have {table.shape[1]}")
    bad = [b for b in range(need) if not 0 <= table[s, b] < n_pages]
    if bad:
        raise ReferenceSelectionError("block_table", f"block_table[{s}, {bad[0]}] is not a page of the cache")


def _paged(kv_cache: Any, block_table: Any, n_seqs: int, n_kv_heads: int, page_layout: str) -> tuple:
    """A paged cache and its block table, checked as the native paged calls check
    them, each refusal naming its argument: the cache in native byte order, uint8
    ``[num_blocks, block_size, (1,) row + 4]`` under ``'fp8_scaled'`` (another dtype a
    ``TypeError``), ``[num_blocks, block_size, row]`` under ``'dense'``, its rows
    ``n_kv_heads`` heads of ``d``; the table 2-D integers, one row per sequence.
    Returns ``(cache [num_blocks, block_size, width], table int64)``."""
    cache = _native_pages(kv_cache)
    if page_layout not in ("dense", "fp8_scaled"):
        raise ReferenceSelectionError(
            "page_layout", f"page_layout must be 'dense' or 'fp8_scaled', got {page_layout!r}"
        )
    cache = _readable_pages(cache)
    if page_layout == "fp8_scaled":
        if cache.dtype != np.uint8:
            raise TypeError(f"kv_cache has dtype {cache.dtype}: with page_layout='fp8_scaled' it must be uint8")
        if cache.ndim == 4 and cache.shape[2] == 1:
            cache = cache.reshape(cache.shape[0], cache.shape[1], cache.shape[3])
        if cache.ndim != 3 or cache.shape[2] <= 4:
            raise ReferenceSelectionError(
                "kv_cache",
                f"with page_layout='fp8_scaled', kv_cache must be [num_blocks, block_size, d + 4], got {cache.shape}",
            )
        row = cache.shape[2] - 4
    elif page_layout == "dense":
        if cache.ndim != 3:
            raise ReferenceSelectionError(
                "kv_cache", f"kv_cache must be 3-D [num_blocks, block_size, d], got {cache.ndim}-D"
            )
        row = cache.shape[2]
    if n_kv_heads == 0 or row % n_kv_heads:
        raise ReferenceSelectionError(
            "n_kv_heads", f"n_kv_heads = {n_kv_heads} does not divide the cache's rows of {row}"
        )
    table = _index_array("block_table", block_table, 2, "selection")
    if table.shape[0] != n_seqs:
        raise ReferenceSelectionError(
            "block_table", f"block_table must be [n_seqs={n_seqs}, max_blocks], got {list(table.shape)}"
        )
    return cache, table


def _inplace_i32(name: str, value: Any, ndim: int, domain: str, dtype: Any = np.int32) -> np.ndarray:
    """A buffer written in place (``topk_indices``, ``out=``): a writeable,
    C-contiguous, aligned ndarray of ``dtype`` (int32 unless said, native byte
    order) and ``ndim`` dimensions, never converted. The reference computes on
    copies and could write any layout; it refuses what the native binding
    refuses (a buffer the native kernels cannot write in place), so the twins
    take the same buffers."""
    if not isinstance(value, np.ndarray) or value.dtype != dtype:
        raise TypeError(f"{name} must be a {np.dtype(dtype).name} numpy array")
    if value.ndim != ndim:
        raise _refuse(domain, name, f"{name} must be {ndim}-D")
    if not value.flags.c_contiguous:
        raise _refuse(domain, name, f"{name} is not C-contiguous: it is written in place, so it is never copied")
    if not value.flags.aligned:
        raise _refuse(domain, name, f"{name} is not aligned")
    if not value.flags.writeable:
        raise _refuse(domain, name, f"{name} must be writeable")
    return value


def _out_buffer(out: Any, name: str, shape: tuple, domain: str, dtype: Any, inputs: tuple = ()) -> Optional[np.ndarray]:
    """The caller's output buffer ``name`` (``out=``, ``lse_out=``): None, or
    a writeable ndarray of ``dtype`` and exactly ``shape`` that shares no
    memory with ``inputs`` (checked before anything is written, and before
    any of the spec's refusals, as natively)."""
    if out is None:
        return None
    out = _inplace_i32(name, out, len(shape), domain, dtype)
    if out.shape != tuple(shape):
        raise _refuse(domain, name, f"{name} must have shape {tuple(shape)}, got {out.shape}")
    if _overlaps(out, inputs):
        raise _refuse(domain, name, f"{name} overlaps another argument's memory")
    return out


def _memory(value: Any) -> Optional[np.ndarray]:
    """``value``'s memory as an ndarray, for the overlap check: an ndarray
    itself, a CPU DLPack producer its view, anything else but a Python number,
    string or sequence what ``numpy.asarray`` makes of it (a view of the
    caller's memory where it is one: a ``memoryview``, an object with
    ``__array_interface__`` or ``__array__``; else a fresh copy, which overlaps
    nothing), as natively (``src/python/args/arrays.rs``, ``ndarray``). None
    where NumPy cannot read it: the argument's own reader refuses it."""
    if isinstance(value, np.ndarray):
        return value
    if value is None or isinstance(value, (list, tuple, int, float, str)):
        return None
    if hasattr(value, "__dlpack__"):
        try:
            return np.from_dlpack(value)
        except Exception:  # not viewable here: read (and refused) by its reader
            pass
    try:
        return np.asarray(value)
    except Exception:  # NumPy cannot read it: its reader refuses it
        return None


def _overlaps(out: np.ndarray, inputs: Any) -> bool:
    """Whether ``out`` may share memory with any of ``inputs`` (see :func:`_memory`)."""
    views = (_memory(a) for a in inputs)
    return any(v is not None and np.may_share_memory(out, v) for v in views)


def _output(out: Any, shape: tuple, domain: str, dtype: Any = np.int32, inputs: tuple = ()) -> Optional[np.ndarray]:
    """:func:`_out_buffer` for ``out=``."""
    return _out_buffer(out, "out", shape, domain, dtype, inputs)


_F = TypeVar("_F", bound=Callable[..., Any])


def _takes_out(dtype: Any, domain: str = _SELECTION) -> Callable[[_F], _F]:
    """A twin given ``out=`` as its native function is (docs/conventions.md): ``out``'s
    type, layout and overlap with every array argument checked first, then the
    result computed as without it, ``out``'s shape checked against it (a refused
    ``out`` is left as it was, refused as ``domain``'s error), written, and
    returned. With one bad argument the twin names what the native call names;
    with a bad ``out`` and another bad argument, the native binding may name
    the other first (its own settings come before ``out``).

    The twin declares ``out: Any = None`` itself, keyword-only and last (before
    ``**kw``), so that its signature is the native one for static type checkers
    too; the decorator takes ``out``, and the body never sees a buffer."""

    def wrap(f: _F) -> _F:
        param = inspect.signature(f).parameters.get("out")
        if param is None or param.kind is not inspect.Parameter.KEYWORD_ONLY or param.default is not None:
            raise TypeError(f"{f.__qualname__} must declare out: Any = None, keyword-only")

        @functools.wraps(f)
        def call(*args: Any, out: Any = None, **kwargs: Any) -> Any:
            if out is None:
                return f(*args, **kwargs)
            # What natively is checked before the rule's own refusals: the
            # buffer's type, layout and overlap; its shape once the result
            # has one.
            arrays = tuple(v for v in map(_memory, (*args, *kwargs.values())) if v is not None)
            _inplace_i32("out", out, out.ndim if isinstance(out, np.ndarray) else 0, domain, dtype)
            if _overlaps(out, arrays):
                raise _refuse(domain, "out", "out overlaps another argument's memory")
            result = f(*args, **kwargs)
            return _deliver(result, _output(out, result.shape, domain, dtype, arrays))

        return cast(_F, call)

    return wrap


def _deliver(result: np.ndarray, out: Optional[np.ndarray]) -> np.ndarray:
    """``result`` (int32 unless float32), written into ``out`` and ``out``
    returned when given."""
    if out is None:
        return result if result.dtype == np.float32 else result.astype(np.int32)
    out[...] = result
    return out
