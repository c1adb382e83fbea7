"""Where dumps live: a local path, or an fsspec URL.

- A **local path** (``dumps/a.npz``, ``~/x.npz``) is opened with ``open`` and
  its uncompressed members are memory-mapped: reading one layer of one head
  touches only that slice's pages.
- A **URL** (``file:///data/a.npz``, ``s3://bucket/a.npz`` with ``s3fs``
  installed, ``memory://``, any filesystem fsspec knows, chained ones such as
  ``simplecache::s3://...`` included) is opened through fsspec, and its
  uncompressed members are :class:`RangedArray` s: indexing one reads one
  byte range (``fs.cat_file(path, start, end)``), so a task that needs one
  head of one layer fetches that head's bytes, not the dump. fsspec is needed
  only for URLs (``pip install fsspec``; it comes with
  ``kvselect[distributed]``).

A ``DIR_OR_GLOB`` names dumps (:func:`expand`): a file, a folder (its
``*.npz`` files) or a glob pattern, local or a URL, always in name order, so
a corpus is the same list of dumps on every machine.
"""

from __future__ import annotations

import glob as _glob
import os
import re
from typing import Any, List, Sequence, Tuple, Union

import numpy as np

from kvselect.checking._common import DumpError

PathLike = Union[str, "os.PathLike[str]"]

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
_GLOB_CHARS = re.compile(r"[*?\[]")


def is_url(path: Any) -> bool:
    """True for an fsspec URL (``scheme://...`` or a chained ``a::b``), False
    for a local path (a ``str`` without a scheme, or an ``os.PathLike``)."""
    return isinstance(path, str) and (bool(_SCHEME.match(path)) or "::" in path)


def filesystem(url: str) -> Tuple[Any, str]:
    """``(fs, path)`` of an fsspec URL: the filesystem object and the path on it.

    Raises
    ------
    DumpError
        fsspec is not installed, or it does not know the URL's protocol (the
        message names the package that provides it, as fsspec says).
    """
    try:
        import fsspec
    except ImportError:
        raise DumpError(
            f"{url}: reading a URL needs fsspec (pip install fsspec, or 'kvselect[distributed]'); a local path does not"
        ) from None
    try:
        fs, path = fsspec.core.url_to_fs(url)
    except (ValueError, ImportError) as e:  # unknown protocol, or its package missing
        raise DumpError(f"{url}: {e}") from None
    return fs, path


class Source:
    """One dump file, local or behind a URL: what the reader asks of it."""

    def __init__(self, path: PathLike) -> None:
        self.name = os.fspath(path)
        self.url = is_url(self.name)
        self.fs: Any = None
        self.path = self.name
        if self.url:
            self.fs, self.path = filesystem(self.name)

    @property
    def basename(self) -> str:
        return basename(self.name)

    def exists(self) -> bool:
        return bool(self.fs.exists(self.path)) if self.url else os.path.exists(self.path)

    def isfile(self) -> bool:
        return bool(self.fs.isfile(self.path)) if self.url else os.path.isfile(self.path)

    def open(self) -> Any:
        """A binary, seekable file object (close it, or use ``with``)."""
        return self.fs.open(self.path, "rb") if self.url else open(self.path, "rb")


class RangedArray:
    """A stored ``.npy`` member behind a URL, read in byte ranges.

    ``shape``, ``dtype``, ``ndim`` and ``view`` (same item size) cost no I/O.
    Indexing by integers on the leading axes, then at most one unit-step
    slice, reads exactly that contiguous block (one ``cat_file`` range) and
    applies the rest of the index in memory; any other use reads the whole
    array (``numpy.asarray``). C order only: a Fortran-order member is read
    whole on first use.
    """

    def __init__(self, fs: Any, path: str, offset: int, shape: Tuple[int, ...], dtype: np.dtype, fortran: bool) -> None:
        self.fs, self.path, self.offset = fs, path, int(offset)
        self.shape, self.dtype, self.fortran = tuple(int(s) for s in shape), np.dtype(dtype), fortran

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def _steps(self) -> List[int]:
        """Items between consecutive indices of each axis (C order)."""
        return [int(np.prod(self.shape[i + 1 :], dtype=np.int64)) for i in range(self.ndim)]

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    def __repr__(self) -> str:
        return f"RangedArray({self.fs.unstrip_protocol(self.path)!r}, shape={self.shape}, dtype={self.dtype})"

    def view(self, dtype: Any) -> "RangedArray":
        dtype = np.dtype(dtype)
        if dtype.itemsize != self.dtype.itemsize:
            raise ValueError(f"view: {dtype} has another item size than {self.dtype}")
        return RangedArray(self.fs, self.path, self.offset, self.shape, dtype, self.fortran)

    def _read(self, start: int, count: int, shape: Tuple[int, ...]) -> np.ndarray:
        """``count`` items from item ``start``, as an array of ``shape``."""
        nbytes = count * self.dtype.itemsize
        begin = self.offset + start * self.dtype.itemsize
        data = self.fs.cat_file(self.path, start=begin, end=begin + nbytes) if nbytes else b""
        if len(data) != nbytes:
            raise DumpError(
                f"{self.path}: the archive ends inside an array ({len(data)} of {nbytes} bytes read at offset {begin})"
            )
        flat = np.frombuffer(data, dtype=self.dtype)
        if self.fortran:
            return flat.reshape(shape, order="F").copy(order="F")
        return flat.reshape(shape).copy()

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self._read(0, self.size, self.shape)
        return out if dtype is None else out.astype(dtype)

    def __getitem__(self, key: Any) -> Any:
        key = key if isinstance(key, tuple) else (key,)
        if self.fortran or not self.shape or not key:
            return np.asarray(self)[key]
        start, dims, axis = 0, [], 0
        strides = self._steps
        lead = 0  # how many index entries the block read consumes
        for k in key:
            if axis == self.ndim:
                break
            if isinstance(k, (int, np.integer)) and not isinstance(k, bool):
                i = int(k) + (self.shape[axis] if k < 0 else 0)
                if not 0 <= i < self.shape[axis]:
                    raise IndexError(f"index {k} is out of bounds for axis {axis} with size {self.shape[axis]}")
                start += i * strides[axis]
                axis, lead = axis + 1, lead + 1
                continue
            if isinstance(k, slice) and k.step in (None, 1):
                a, b, _ = k.indices(self.shape[axis])
                b = max(a, b)
                start += a * strides[axis]
                dims.append(b - a)
                axis, lead = axis + 1, lead + 1
            break
        if lead == 0:
            return np.asarray(self)[key]
        shape = tuple(dims) + self.shape[axis:]
        block = self._read(start, int(np.prod(shape, dtype=np.int64)), shape)
        rest = key[lead:]
        if not rest:
            return block
        # The block keeps the sliced axis (if any) first: index it with ':'.
        return block[(slice(None),) * len(dims) + rest]


def take_rows(a: Any, lead: Tuple[int, ...], rows: np.ndarray) -> np.ndarray:
    """``a[lead][rows]`` read now, for a memory map, an array or a
    :class:`RangedArray` (one byte range per row, fetched together with
    ``fs.cat_ranges``): the rows of one head at the query positions, never
    the head."""
    rows = np.asarray(rows, dtype=np.int64)
    if not isinstance(a, RangedArray) or a.fortran:
        return np.asarray(np.asarray(a[lead] if lead else a)[rows])
    inner = a.shape[len(lead) + 1 :]
    steps, size = a._steps, a.dtype.itemsize
    per = steps[len(lead)] * size  # one row's bytes
    base = a.offset + sum(int(i) * steps[axis] for axis, i in enumerate(lead)) * size
    n = a.shape[len(lead)]
    if len(rows) and (rows.min() < 0 or rows.max() >= n):
        raise IndexError(f"rows out of bounds for axis {len(lead)} with size {n}")
    starts = [base + int(r) * per for r in rows]
    blobs = a.fs.cat_ranges([a.path] * len(rows), starts, [x + per for x in starts])
    out = np.empty((len(rows), *inner), dtype=a.dtype)
    for i, blob in enumerate(blobs):
        if isinstance(blob, Exception) or len(blob) != per:
            raise DumpError(
                f"{a.path}: a row could not be read at offset {starts[i]}"
                + (f" ({blob})" if isinstance(blob, Exception) else "")
            )
        out[i] = np.frombuffer(blob, dtype=a.dtype).reshape(inner)
    return out


def expand(specs: Sequence[PathLike], suffix: str = ".npz") -> List[str]:
    """The dumps a list of ``DIR_OR_GLOB`` names: each a file, a folder (its
    ``*suffix`` files) or a glob pattern, local or a URL, each expanded in
    name order (URLs stay URLs, in the filesystem's own spelling).

    Raises
    ------
    FileNotFoundError
        A folder with no ``*suffix`` file, or a pattern that matches nothing.
    DumpError
        A URL fsspec cannot open (see :func:`filesystem`).
    """
    out: List[str] = []
    for spec in specs:
        name = os.fspath(spec)
        if is_url(name):
            fs, path = filesystem(name)
            if _GLOB_CHARS.search(path):
                found = sorted(fs.glob(path))
                what = "a pattern that matches no file"
            elif fs.isdir(path):
                found = sorted(p for p in fs.ls(path, detail=False) if p.endswith(suffix))
                what = f"a folder with no {suffix} file"
            else:
                out.append(name)
                continue
            if not found:
                raise FileNotFoundError(f"{name!r} is {what}")
            out += [fs.unstrip_protocol(p) for p in found]
        elif os.path.isdir(name):
            found = sorted(_glob.glob(os.path.join(_glob.escape(name), f"*{suffix}")))
            if not found:
                raise FileNotFoundError(f"{name!r} is a directory with no {suffix} file")
            out += found
        elif _GLOB_CHARS.search(name) and not os.path.exists(name):
            found = sorted(p for p in _glob.glob(os.path.expanduser(name)) if os.path.isfile(p))
            if not found:
                raise FileNotFoundError(f"{name!r} is a pattern that matches no file")
            out += found
        else:
            out.append(name)
    return out


def basename(name: str) -> str:
    """A dump's file name, without its folder (a URL's last path segment)."""
    return name.rstrip("/").rsplit("/", 1)[-1] if is_url(name) else os.path.basename(name)


def stem(name: str) -> str:
    """A dump's name without folder and extension: what its report is called."""
    return os.path.splitext(basename(name))[0]


__all__ = ["is_url", "filesystem", "Source", "RangedArray", "expand", "basename", "stem", "take_rows"]
