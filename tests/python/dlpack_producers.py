"""A DLPack producer built with ctypes over a NumPy buffer, for the tests.

NumPy exports float32 / float16 / integer capsules itself, but not bfloat16
or float8_e4m3fn, and no test may need torch. `Producer` claims any dtype
code over the bytes of a NumPy array, on any device type, with any strides
and byte offset, read-only or not, as a versioned (DLPack >= 1.0) or a
legacy capsule, and counts its exports and the deleter's calls. It can
also be hostile: claim another DLPack major version, or hand out a capsule
under another name (one already consumed, ``used_dltensor[_versioned]``, or
one that is no DLPack capsule at all). The structs are the ABI of dlpack.h
(DLPack 1.3, as dlpark 0.10's `ffi`).
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

# DLDataTypeCode (dlpack.h; dlpark::ffi::DLDataTypeCode).
K_DL_INT, K_DL_UINT, K_DL_FLOAT, K_DL_BFLOAT, K_DL_COMPLEX, K_DL_BOOL = 0, 1, 2, 4, 5, 6
K_DL_FLOAT8_E4M3FN = 10  # DLPack >= 1.1
K_DL_CPU, K_DL_CUDA = 1, 2
READ_ONLY = 1

DTYPES = {
    "float32": (K_DL_FLOAT, 32),
    "float16": (K_DL_FLOAT, 16),
    "float64": (K_DL_FLOAT, 64),
    "int32": (K_DL_INT, 32),
    "int64": (K_DL_INT, 64),
    "uint8": (K_DL_UINT, 8),
    "uint16": (K_DL_UINT, 16),
    "bfloat16": (K_DL_BFLOAT, 16),
    "float8_e4m3fn": (K_DL_FLOAT8_E4M3FN, 8),
    "complex64": (K_DL_COMPLEX, 64),
    "bool": (K_DL_BOOL, 8),
}


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", DELETER),
]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", DELETER),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


# Every exported struct until its deleter runs, then forever (a test
# process exports a few hundred): freeing them with the producer object
# would let a view that outlives it call a freed deleter.
_LIVE: dict[int, Any] = {}
_DONE: list[Any] = []

_CAPSULE = object()  # `Producer(returns=...)`'s default: a capsule


class Producer:
    """An object with `__dlpack__` / `__dlpack_device__` over `array`'s bytes.

    `dtype` names the DLPack dtype claimed (default: the array's own);
    `shape` / `strides` (in elements, None for compact) and `byte_offset`
    describe the tensor within the buffer; `legacy` makes a producer whose
    `__dlpack__` takes no `max_version` (it raises TypeError, as DLPack
    0.x producers do), `raises` one whose `__dlpack__` raises that.
    Hostile ones: `version` is the (major, minor) a versioned capsule
    claims (a consumer must refuse a major other than 1, and call the
    deleter); `capsule_name` names the capsule instead of ``dltensor`` /
    ``dltensor_versioned`` — ``used_…`` for one already consumed (which the
    consumer must neither read nor delete), anything else for a capsule
    that is not DLPack's; `returns` is what `__dlpack__` returns instead of
    a capsule, `device` any object `__dlpack_device__` returns (an exception:
    raises it).
    """

    def __init__(
        self,
        array: np.ndarray,
        *,
        dtype: str | None = None,
        shape: tuple[int, ...] | None = None,
        strides: tuple[int, ...] | None = None,
        byte_offset: int = 0,
        device: Any = (K_DL_CPU, 0),
        read_only: bool = False,
        legacy: bool = False,
        raises: BaseException | None = None,
        version: tuple[int, int] = (1, 3),
        capsule_name: bytes | None = None,
        returns: Any = _CAPSULE,
    ) -> None:
        self.array = array
        self.code, self.bits = DTYPES[dtype or array.dtype.name]
        self.shape = tuple(array.shape if shape is None else shape)
        self.strides = strides
        self.byte_offset = byte_offset
        self.device = device
        self.read_only = read_only
        self.legacy = legacy
        self.raises = raises
        self.version = version
        self.capsule_name = capsule_name
        self.returns = returns
        self.exports = 0
        self.deletes = 0
        self.versions: list[Any] = []

    def __dlpack_device__(self) -> Any:
        if isinstance(self.device, BaseException):
            raise self.device
        return self.device

    def __dlpack__(self, *, stream: Any = None, **kwargs: Any) -> Any:
        if self.raises is not None:
            raise self.raises
        if self.legacy and kwargs:
            raise TypeError(f"__dlpack__() got an unexpected keyword argument {next(iter(kwargs))!r}")
        max_version = kwargs.get("max_version")
        self.versions.append(max_version)
        if self.returns is not _CAPSULE:
            return self.returns
        versioned = max_version is not None and max_version[0] >= 1
        return self._capsule(versioned)

    def _capsule(self, versioned: bool) -> Any:
        ndim = len(self.shape)
        shape = (ctypes.c_int64 * max(ndim, 1))(*self.shape)
        given = self.strides
        if given is None and versioned:
            # DLPack >= 1.2 asks versioned tensors for explicit strides.
            given = tuple(int(np.prod(self.shape[i + 1 :])) for i in range(ndim))
        strides = None if given is None else (ctypes.c_int64 * max(ndim, 1))(*given)
        managed: Any = DLManagedTensorVersioned() if versioned else DLManagedTensor()
        t = managed.dl_tensor
        t.data = self.array.ctypes.data
        t.device = DLDevice(*self.device)
        t.ndim = ndim
        t.dtype = DLDataType(self.code, self.bits, 1)
        t.shape = shape
        t.strides = strides if strides is not None else ctypes.POINTER(ctypes.c_int64)()
        t.byte_offset = self.byte_offset
        key = ctypes.addressof(managed)

        def deleter(_ptr: int) -> None:
            self.deletes += 1
            # Kept, not freed: this callback is running, and a consumer may
            # read the struct until the call returns.
            _DONE.append(_LIVE.pop(key, None))

        callback = DELETER(deleter)
        managed.deleter = callback
        if versioned:
            managed.version = DLPackVersion(*self.version)
            managed.flags = READ_ONLY if self.read_only else 0
        # The struct, its arrays, the callback and the buffer live until the
        # deleter runs — in the module, not on the producer: a consumer's view
        # may outlive the producer object (a temporary passed to a call).
        name = self.capsule_name or (b"dltensor_versioned" if versioned else b"dltensor")
        # The name too: a capsule keeps a pointer to it, not a copy.
        _LIVE[key] = (managed, shape, strides, callback, self.array, name)
        self.exports += 1
        return _capsule_new(key, name, None)


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 (to nearest even), as uint16 bits."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def fp8_bytes(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Random float8_e4m3fn bytes, NaN (0x7f / 0xff) excluded."""
    b = rng.integers(0, 256, size=shape, dtype=np.uint8)
    return np.where((b & 0x7F) == 0x7F, b ^ 1, b).astype(np.uint8)


class NumpyExport:
    """Only NumPy's own ``__dlpack__`` / ``__dlpack_device__``: not an ndarray."""

    def __init__(self, a: Any) -> None:
        self.a = a

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.a.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> Any:
        return self.a.__dlpack_device__()
