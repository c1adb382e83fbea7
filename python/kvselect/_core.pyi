"""Type stubs for the native module ``kvselect._core`` (checked by stubtest)."""

from typing import Any, Final, Optional, Protocol, TypeAlias, TypeVar, Union, final

import numpy as np
import numpy.typing as npt

# The module's ``__all__``: what ``kvselect`` re-exports as it is. Not the
# three checkers ``check_topk``, ``check_blocks``, ``check_witnesses``
# (defined below): ``kvselect`` wraps them.
__all__ = [
    "window_positions",
    "visible_entries",
    "compressed_entry_tokens",
    "expand_entries",
    "combine_topk_swa_indices",
    "quest_bounds",
    "quest_bounds_paged",
    "quest_update",
    "quest_scores",
    "quest_select",
    "moba_gates",
    "moba_select",
    "moba_select_paged",
    "vslash_select",
    "vslash_scores",
    "vslash_rows",
    "vslash_layout",
    "vslash_layout_batch",
    "infllm_block_scores",
    "infllm_select",
    "infllm_block_scores_paged",
    "infllm_select_paged",
    "nsa_block_scores",
    "nsa_select",
    "nsa_compress_keys",
    "nsa_block_scores_compressed",
    "nsa_select_compressed",
    "nsa_block_scores_paged",
    "nsa_select_paged",
    "snapkv_scores",
    "tova_scores",
    "observed_attention_scores",
    "h2o_keep",
    "keep_top",
    "__version__",
    "MAX_TOPOLOGY_SEGMENTS",
    "KvselectError",
    "WitnessError",
    "SelectionError",
    "segment_of",
    "topology_witness_indices",
    "apply_topology_witnesses",
    "scatter_topology_witnesses",
    "random_null",
    "locality_null",
    "segment_coverage",
    "attention_mass_recall",
    "MINIMAX_BLOCK_SIZE",
    "BlockSparseConfig",
    "block_sparse_select",
    "block_sparse_select_packed",
    "block_sparse_select_paged",
    "positions_of_blocks",
    "Selector",
    "oracle_topk",
    "attention_probabilities",
    "dense_attention",
    "sparse_attention",
    "segment_coverage_rows",
    "attention_mass_recall_rows",
    "slots_used_rows",
    "output_relative_error",
    "output_relative_error_rows",
    "set_num_threads",
    "get_num_threads",
    "simd_level",
    "_fma_floor",
    "_exp_bound",
    "_pair_speedup",
    "_amx_screen",
    "_dlpack_array",
    "indexer_topk",
    "indexer_topk_packed",
    "indexer_topk_paged",
    "indexer_scores",
    "indexer_magnitudes",
    "_indexer_rescore",
    "_indexer_rescore_all",
    "_indexer_rescore_verdict",
    "_check_topk_structure",
    "block_scores",
    "block_magnitudes",
    "GlobalSlots",
]

class _SupportsDLPack(Protocol):
    """Any object exporting DLPack (torch, JAX, CuPy, NumPy >= 1.22): read in place when it is in
    host memory, refused naming ``.cpu()`` when it is not (docs/dlpack.md)."""

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any: ...
    def __dlpack_device__(self) -> Any: ...

_T = TypeVar("_T", bound=np.generic)
# An array argument: anything NumPy converts, or a DLPack producer.
_ArrayIn: TypeAlias = Union[npt.ArrayLike, _SupportsDLPack]
# A buffer written in place (out=, in-place rows): an ndarray or a CPU DLPack tensor of that dtype.
_ArrayOut: TypeAlias = Union[npt.NDArray[_T], _SupportsDLPack]

__version__: Final[str]
MAX_TOPOLOGY_SEGMENTS: Final[int]
MINIMAX_BLOCK_SIZE: Final[int]

class KvselectError(ValueError):
    """A refused kvselect call (a ValueError): the base class of WitnessError and
    SelectionError, raised itself by the thread controls.

    `argument` names the argument at fault; `variant` names the core's refusal
    (or is None when the bindings refuse an argument themselves, such as a
    buffer that cannot be written); the variant's fields are attributes too.
    """

    variant: Optional[str]
    argument: str

class WitnessError(KvselectError):
    """A refused segment-witness call, or one of its metrics (a ValueError).

    `variant` names the spec's refusal ("RowsMismatch", "SegmentsOutOfRange",
    "LearnedKeepOutOfRange") or is None for an argument the bindings refuse
    (a bad buffer, a negative count); `argument` names the argument at fault,
    and the variant's fields (learned_len, topk, rows, num_segments,
    learned_keep) are attributes too.
    """

class SelectionError(KvselectError):
    """A refused block-selection, selector or attention call (a ValueError);
    `argument` names the argument at fault, `variant` the core's refusal.
    """

def segment_of(token: int, context_len: int, num_segments: int) -> int:
    """The segment of one token: the segment map itself.

    The segment of ``token`` in a row of ``context_len`` tokens cut into ``num_segments``
    segments, ``floor(token * S_eff / L)`` with ``L = max(context_len, 1)`` and
    ``S_eff = min(num_segments, L)``, exact for every integer up to 2**64 - 1. Not clamped:
    an out-of-range token maps past the partition (``segment_of(20, 4, 8) == 20``); only the
    merge clamps to ``S - 1``.

    Parameters
    ----------
    token : int
        The token's position, 0 to 2**64 - 1 (a Python or NumPy integer).
    context_len : int
        The row's length ``L``, 0 to 2**64 - 1 (0 is read as 1).
    num_segments : int
        The segment count ``S``, 0 to 2**64 - 1.

    Returns
    -------
    int
        The segment index, ``floor(token * S_eff / L)``.

    Raises
    ------
    WitnessError
        (a ValueError; ``.argument`` names the argument) when an argument is negative or
        above 2**64 - 1.
    TypeError
        when an argument is not an integer (a float, NaN, a string, None).
    """

def topology_witness_indices(
    learned: _ArrayIn,
    context_lens: _ArrayIn,
    num_segments: int,
    *,
    out: Optional[_ArrayOut[np.int32]] = None,
) -> npt.NDArray[np.int32]:
    """The witnesses of every learned row, one slot per segment.

    Slot ``s`` of row ``r`` holds the left edge ``e_s = ceil(s * L / S_eff)`` of segment
    ``s`` when the row does not occupy it, ``-1`` when it does or ``s >= S_eff``
    (``L = context_lens[r]``, ``S_eff = min(num_segments, L)``). A row of length <= 0 gets
    none. Any positive segment count is accepted.

    Parameters
    ----------
    learned : array_like of int, [rows, topk]
        Row-relative offsets, negative = padding; any integer dtype whose values fit int32
        (int64 ``torch.topk`` indices convert once), any layout (copied once when not
        C-contiguous, aligned and native int32). Any CPU DLPack tensor too.
    context_lens : array_like of int, [rows]
        Each row's length ``L``, values within int32; one per learned row.
    num_segments : int
        The segment count ``S``, 1 to 2**32 - 1.
    out : ndarray of int32, [rows, num_segments], optional
        Reuses a buffer: written in place and returned. Exactly that shape, native int32,
        C-contiguous, aligned, writeable, sharing no input's memory (an ndarray or a CPU
        DLPack tensor; never converted). A refused call leaves it untouched.

    Returns
    -------
    ndarray of int32, [rows, num_segments]
        The witnesses (``out`` itself when given).

    Raises
    ------
    WitnessError
        (a ValueError; ``.argument`` names the argument) when ``learned`` is not 2-D,
        ``context_lens`` is not 1-D with one entry per row, a value does not fit int32,
        ``num_segments`` is 0, negative or above 2**32 - 1, ``out`` has another shape, is not
        C-contiguous, aligned and writeable, or overlaps an input, or a tensor is not on
        the CPU.
    TypeError
        when an array holds no integers (floats, bools, strings), an argument is no array
        (None, an object, a dict), ``num_segments`` is not an integer, or ``out`` is not an
        int32 ndarray or tensor (another dtype, byte order or a list).
    MemoryError
        when the ``[rows, num_segments]`` result is too large to allocate.
    """

def apply_topology_witnesses(
    learned: _ArrayIn,
    context_lens: _ArrayIn,
    learned_keep: int,
    num_segments: int,
    max_replacements: int,
    *,
    out: Optional[_ArrayOut[np.int32]] = None,
) -> npt.NDArray[np.int32]:
    """The learned rows with witnesses merged in, as a new int32 array (or into ``out=``).

    Slots ``[0, learned_keep)`` are kept bit for bit, the witnesses in ascending segment
    order are written to slots ``learned_keep, ...`` up to
    ``B = min(max_replacements, topk - learned_keep)``, the rest dropped.

    Parameters
    ----------
    learned : array_like of int, [rows, topk]
        Row-relative offsets, negative = padding; any integer dtype whose values fit int32,
        any layout (copied once when needed). Any CPU DLPack tensor too.
    context_lens : array_like of int, [rows]
        Each row's length, values within int32; one per learned row.
    learned_keep : int
        The retained prefix, 0 to ``topk``.
    num_segments : int
        The segment count ``S``, 1 to 64 (``MAX_TOPOLOGY_SEGMENTS``).
    max_replacements : int
        The witness budget per row, 0 to 2**64 - 1 (capped by the row).
    out : ndarray of int32, [rows, topk], optional
        Written in place and returned. Exactly ``learned``'s shape, native int32,
        C-contiguous, aligned, writeable, sharing no input's memory (an ndarray or a CPU
        DLPack tensor; never converted). A refused call leaves it untouched.

    Returns
    -------
    ndarray of int32, [rows, topk]
        The merged rows (``out`` itself when given).

    Raises
    ------
    WitnessError
        (a ValueError; ``.argument`` names the argument) when ``learned`` is not 2-D,
        ``context_lens`` is not 1-D with one entry per row, a value does not fit int32,
        ``num_segments`` is 0 or more than 64, ``learned_keep > topk``, a count is negative
        or above 2**64 - 1, ``out`` has another shape, is not C-contiguous, aligned and
        writeable, or overlaps an input, or a tensor is not on the CPU.
    TypeError
        when an array holds no integers, an argument is no array, a count is not an integer
        (None, a float), or ``out`` is not an int32 ndarray or tensor.
    """

def scatter_topology_witnesses(
    topk_indices: _ArrayOut[np.int32],
    context_lens: _ArrayIn,
    num_segments: int,
) -> None:
    """The serving entry point: merges witnesses into ``topk_indices`` in place.

    The merge of :func:`apply_topology_witnesses` with ``keep = topk - num_segments`` and
    ``max_replacements = num_segments``, written into the caller's buffer. The buffer is
    never converted (a ``torch.topk`` result is int64: call ``.int()`` first) and is checked
    on every call; ``num_segments = 0`` is the off switch. A refused call leaves the buffer
    byte-identical.

    Parameters
    ----------
    topk_indices : ndarray of int32, [rows, topk]
        The learned rows, rewritten in place: native int32, C-contiguous, aligned,
        writeable, not overlapping ``context_lens`` (an ndarray or a CPU DLPack tensor,
        e.g. an int32 torch tensor; never converted or copied).
    context_lens : array_like of int, [rows]
        Each row's length, values within int32; one per buffer row.
    num_segments : int
        The segment count ``S``, 0 (off: nothing written) to 64 (``MAX_TOPOLOGY_SEGMENTS``).

    Returns
    -------
    None
        The merged rows are ``topk_indices`` itself, rewritten in place.

    Raises
    ------
    WitnessError
        (a ValueError; ``.argument`` names the argument) when ``topk_indices`` is not 2-D,
        not C-contiguous, misaligned, read-only or overlaps ``context_lens`` (checked even
        with the off switch), ``context_lens`` is not 1-D with one entry per row or holds a
        value outside int32, ``num_segments`` is negative or more than 64, or a tensor is
        not on the CPU.
    TypeError
        when ``topk_indices`` is not a native int32 ndarray or tensor (int64, float32,
        byte-swapped, a list, None; checked even with the off switch), ``context_lens``
        holds no integers, or ``num_segments`` is not an integer.
    """

def random_null(
    context_len: int,
    budget: int,
    seed: int,
    *,
    out: Optional[_ArrayOut[np.int32]] = None,
) -> npt.NDArray[np.int32]:
    """The random null: ``min(budget, context_len)`` tokens drawn uniformly.

    Drawn without replacement from ``[0, context_len)``, ascending, deterministic in
    ``seed`` (row ``L - 1`` of ``Selector.random(budget, seed)``).

    Parameters
    ----------
    context_len : int
        The row's length ``L``, 0 to 2**31 - 1.
    budget : int
        How many tokens to draw, 0 to 2**64 - 1 (capped at ``L``).
    seed : int
        The seed, 0 to 2**64 - 1.
    out : ndarray of int32, [min(budget, context_len)], optional
        ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
        aligned, native byte order (else refused, nothing written).

    Returns
    -------
    ndarray of int32, [min(budget, context_len)]
        The drawn tokens, ascending.

    Raises
    ------
    WitnessError
        (a ValueError; ``.argument`` names the argument) when ``context_len`` is above
        2**31 - 1, or an argument is negative or above 2**64 - 1.
        Also when ``out`` is refused (its shape, layout or read-only).
    TypeError
        when an argument is not an integer (a float, ``np.float64``, a string).
        Also when ``out`` is not an int32 ndarray.
    """

def locality_null(
    context_len: int,
    budget: int,
    *,
    out: Optional[_ArrayOut[np.int32]] = None,
) -> npt.NDArray[np.int32]:
    """The locality null: the ``min(budget, context_len)`` most recent tokens.

    The tokens ``[L - k, L)``, ``k = min(budget, L)`` (row ``L - 1`` of
    ``Selector.local(budget)``).

    Parameters
    ----------
    context_len : int
        The row's length ``L``, 0 to 2**31 - 1.
    budget : int
        How many tokens to keep, 0 to 2**64 - 1 (capped at ``L``).
    out : ndarray of int32, [min(budget, context_len)], optional
        ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
        aligned, native byte order (else refused, nothing written).

    Returns
    -------
    ndarray of int32, [min(budget, context_len)]
        ``L - k, ..., L - 1``.

    Raises
    ------
    WitnessError
        (a ValueError; ``.argument`` names the argument) when ``context_len`` is above
        2**31 - 1, or an argument is negative or above 2**64 - 1.
        Also when ``out`` is refused (its shape, layout or read-only).
    TypeError
        when an argument is not an integer (a string, a float).
        Also when ``out`` is not an int32 ndarray.
    """

def segment_coverage(candidates: _ArrayIn, context_len: int, num_segments: int) -> float:
    """The share of the ``S_eff`` segments of ``[0, context_len)`` that ``candidates`` meets.

    Padding, duplicates and out-of-range entries count for nothing; 1.0 when there are no
    segments (``S_eff = min(num_segments, L)``).

    Parameters
    ----------
    candidates : array_like of int, [k]
        The selected positions (1-D), any integer dtype whose values fit int32; negative =
        padding. Any CPU DLPack tensor too.
    context_len : int
        The row's length ``L``, 0 to 2**64 - 1.
    num_segments : int
        The segment count ``S``, 0 to 2**64 - 1.

    Returns
    -------
    float
        Segments met / ``S_eff``, in [0, 1].

    Raises
    ------
    WitnessError
        (a ValueError; ``.argument`` names the argument) when ``candidates`` is not 1-D or
        holds a value outside int32, a count is negative or above 2**64 - 1, or a tensor is
        not on the CPU.
    TypeError
        when ``candidates`` holds no integers (complex, bytes) or a count is not an integer.
    """

def attention_mass_recall(candidates: _ArrayIn, attention_row: _ArrayIn) -> float:
    """The share of a dense attention row's mass that ``candidates`` keeps.

    ``sum(a[x] for distinct x in C, 0 <= x < L) / sum(a)``, the plain quotient (NaN for
    0/0, ``±inf`` when a row summing to 0 keeps something; NaN in the row propagates).

    Parameters
    ----------
    candidates : array_like of int, [k]
        The selected positions (1-D), any integer dtype whose values fit int32; negative
        and out-of-range entries keep nothing. Any CPU DLPack tensor too.
    attention_row : array_like of float, [L]
        The row's attention weights ``a`` (1-D), read as float64 (other floats convert once).

    Returns
    -------
    float
        The kept share of the mass.

    Raises
    ------
    WitnessError
        (a ValueError; ``.argument`` names the argument) when an argument is not 1-D,
        ``candidates`` holds a value outside int32, or a tensor is not on the CPU.
    TypeError
        when ``candidates`` holds no integers or ``attention_row`` no floats (a list of
        ints included).
    """

@final
class BlockSparseConfig:
    """How many blocks a query may see, and which are free.

    ``BlockSparseConfig(block_size=128, top_blocks=32, init_blocks=1, local_blocks=2)``.
    Immutable, compares by value, hashable. Building one refuses a config that can select
    nothing (block_size 0, or top_blocks 0 with no forced block), since an empty selection is
    a NaN downstream. The released MiniMax-M3 checkpoint uses top_blocks=16, init_blocks=0,
    local_blocks=1. Rows of a selection are ``width = max(top_blocks, init_blocks +
    local_blocks)`` wide.

    Parameters
    ----------
    block_size : int, default 128
        Tokens per block (128 for a real checkpoint; also the KV page size), at least 1.
    top_blocks : int, default 32
        Total blocks visible per query, forced ones counted.
    init_blocks : int, default 1
        Blocks at the start of the sequence that are always visible.
    local_blocks : int, default 2
        Blocks nearest the query that are always visible. Every field is a non-negative
        integer, at most 2**31 - 1 (None takes the default).

    Raises
    ------
    SelectionError
        (a ValueError; ``.argument`` names the field) when a field is negative or past
        2**31 - 1, ``block_size`` is 0, or ``top_blocks`` is 0 with ``init_blocks`` and
        ``local_blocks`` both 0 (``.argument`` is ``top_blocks``).
    TypeError
        when a field is not an integer (or None).
    """

    def __new__(
        cls,
        block_size: int = 128,
        top_blocks: int = 32,
        init_blocks: int = 1,
        local_blocks: int = 2,
    ) -> "BlockSparseConfig": ...
    @property
    def block_size(self) -> int:
        """Tokens per block (128 for a real checkpoint; also the KV page size)."""
    @property
    def top_blocks(self) -> int:
        """Total blocks visible per query, forced ones counted."""
    @property
    def init_blocks(self) -> int:
        """Blocks at the start of the sequence that are always visible."""
    @property
    def local_blocks(self) -> int:
        """Blocks nearest the query that are always visible."""
    @property
    def width(self) -> int:
        """The fixed width of an output row: max(top_blocks, init_blocks + local_blocks)."""
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...
    def __reduce__(self) -> tuple[type["BlockSparseConfig"], tuple[int, int, int, int]]: ...

def block_sparse_select(
    index_q: _ArrayIn,
    index_k: _ArrayIn,
    query_pos: Union[int, _ArrayIn],
    config: Optional[BlockSparseConfig] = None,
    *,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    head_major: bool = False,
    out: Optional[_ArrayOut[np.int32]] = None,
) -> npt.NDArray[np.int32]:
    """The blocks each KV head may read: block ids ascending, then -1, int32.

    One query: ``index_q [n_kv_heads, d]`` with an int ``query_pos`` gives ``[n_kv_heads,
    width]``; a chunk of queries of one sequence: ``index_q [n_queries, n_kv_heads, d]`` with
    ``query_pos [n_queries]`` gives ``[n_queries, n_kv_heads, width]``, or the engines'
    ``[n_kv_heads, n_queries, width]`` with ``head_major=True``; ``width = config.width``.
    float32, float16 and ml_dtypes bfloat16 / float8_e4m3fn keys and queries are read in
    place (a raw uint16 / uint8 view names its format with ``key_format`` /
    ``query_format``); an array in non-native byte order, misaligned or not C-contiguous is
    copied once to a native, aligned one (the same values). NaN scores are absent: a row of
    them gets its forced blocks, then the lowest ids. The free blocks chosen are those with
    the largest block scores in real arithmetic (ties to the lower id): the float32 maxima
    :func:`block_scores` reports screen, and near ties at the threshold are re-scored in
    float64 (every product exact).

    Parameters
    ----------
    index_q : array_like, [n_kv_heads, d] or [n_queries, n_kv_heads, d]
        The indexer queries of one query (2-D) or of a chunk of one sequence (3-D): float32
        (float64 converted once), float16, ml_dtypes bfloat16 / float8_e4m3fn, or a raw
        uint16 / uint8 view with ``query_format``. Any CPU DLPack tensor too.
    index_k : array_like, [n_positions, d]
        The sequence's index keys, in the formats of ``index_q`` (raw views with
        ``key_format``); ``d`` is ``index_q``'s, at least 1. Any CPU DLPack tensor too.
    query_pos : int or array_like of int, [n_queries]
        Each query's position, >= 0 (one past the last key is clipped to the keys that
        exist). One integer with a 2-D ``index_q``; with a 3-D one ``[n_queries]``, or one
        integer for a batch of one query.
    config : BlockSparseConfig, optional
        The selection rule; None for ``BlockSparseConfig()``.
    key_format, query_format : str, optional
        The format of a raw view: "float32", "float16", "bfloat16" or "float8_e4m3fn".
        Required for a raw uint16 / uint8 array; with a typed array it must agree with its
        dtype.
    head_major : bool, default False
        Batched rows as the engines' ``[n_kv_heads, n_queries, width]`` instead of
        ``[n_queries, n_kv_heads, width]``.
    out : ndarray of int32, optional
        ``out=`` reuses a buffer: exactly the result's shape, written in place and returned.
        C-contiguous, writeable, aligned, native byte order, not overlapping any input (else
        refused, nothing written).

    Returns
    -------
    ndarray of int32, [n_kv_heads, width] or [n_queries, n_kv_heads, width]
        Each row's block ids, ascending, then -1: ``[n_kv_heads, width]`` for one query,
        ``[n_kv_heads, n_queries, width]`` batched with ``head_major=True``.

    Raises
    ------
    SelectionError
        (a ValueError; ``.argument`` names the argument) when ``index_q`` is not 2-D or 3-D,
        or its ``d`` is not ``index_k``'s (``index_q``); ``index_k`` is not 2-D (or its block
        ids would not fit int32); ``d`` is 0 (``d``); ``query_pos`` is negative, past
        2**63 - 1, not one integer with a 2-D ``index_q``, or not ``[n_queries]`` with a 3-D
        one; a format name is unknown; a tensor is on a GPU (``.cpu()`` it); ``out`` is
        refused (its shape, layout, read-only, or overlapping an input).
    TypeError
        when an array's dtype is no key format (int32 keys; a raw view without its format),
        ``query_pos`` is not integers (a float, inf), ``config`` is not a BlockSparseConfig or
        None, an argument is not an array (None, a DLPack capsule), or ``out`` is not an
        int32 ndarray.
    """

def block_sparse_select_packed(
    index_q: _ArrayIn,
    index_k: _ArrayIn,
    cu_seqlens: _ArrayIn,
    seq_ids: _ArrayIn,
    query_pos: _ArrayIn,
    config: Optional[BlockSparseConfig] = None,
    *,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    head_major: bool = False,
    out: Optional[_ArrayOut[np.int32]] = None,
) -> npt.NDArray[np.int32]:
    """Block selection over a packed serving batch of sequences.

    The keys of all sequences are concatenated in ``index_k [n_positions, d]``, sequence
    ``s`` owning rows ``cu_seqlens[s] .. cu_seqlens[s + 1]``; query ``i`` (``index_q
    [n_queries, n_kv_heads, d]``) belongs to sequence ``seq_ids[i]`` at position
    ``query_pos[i]`` within it, and its block ids count from the start of its sequence.
    Formats as :func:`block_sparse_select`.

    Parameters
    ----------
    index_q : array_like, [n_queries, n_kv_heads, d]
        The indexer queries, formats as :func:`block_sparse_select`. Any CPU DLPack tensor
        too.
    index_k : array_like, [n_positions, d]
        Every sequence's index keys, concatenated; formats as :func:`block_sparse_select`.
    cu_seqlens : array_like of int, [n_seqs + 1]
        Sequence starts: 0 first, non-decreasing, the last ``n_positions``.
    seq_ids : array_like of int, [n_queries]
        Each query's sequence, in ``0..n_seqs``.
    query_pos : int or array_like of int, [n_queries]
        Each query's position within its sequence, >= 0 (one integer for one query).
    config : BlockSparseConfig, optional
        The selection rule; None for ``BlockSparseConfig()``.
    key_format, query_format : str, optional
        The format of a raw uint16 / uint8 view, as in :func:`block_sparse_select`.
    head_major : bool, default False
        Rows as ``[n_kv_heads, n_queries, width]`` instead of ``[n_queries, n_kv_heads,
        width]``.
    out : ndarray of int32, optional
        ``out=`` reuses a buffer: exactly the result's shape, written in place and returned.
        C-contiguous, writeable, aligned, native byte order, not overlapping any input (else
        refused, nothing written).

    Returns
    -------
    ndarray of int32, [n_queries, n_kv_heads, width]
        Each row's block ids within its sequence, ascending, then -1 (``[n_kv_heads,
        n_queries, width]`` with ``head_major=True``).

    Raises
    ------
    SelectionError
        (a ValueError; ``.argument`` names the argument) when ``index_q`` is not 3-D or its
        ``d`` is not ``index_k``'s (``index_q``); ``index_k`` is not 2-D; ``d`` is 0;
        ``cu_seqlens`` is not 1-D, empty, does not start at 0, decreases or does not end at
        ``n_positions``; ``seq_ids`` is not ``[n_queries]`` or names no sequence;
        ``query_pos`` is negative or not ``[n_queries]``; a format name is unknown; a tensor
        is on a GPU; ``out`` is refused (its shape, layout, read-only, or overlapping an
        input).
    TypeError
        when an array's dtype is no key format, a position array is not integers, ``config``
        is not a BlockSparseConfig or None, an argument is not an array, or ``out`` is not an
        int32 ndarray.
    """

def block_sparse_select_paged(
    index_q: _ArrayIn,
    kv_cache: _ArrayIn,
    block_table: _ArrayIn,
    seq_lens: _ArrayIn,
    seq_ids: _ArrayIn,
    query_pos: _ArrayIn,
    config: Optional[BlockSparseConfig] = None,
    *,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    head_major: bool = False,
    physical: bool = False,
    out: Optional[_ArrayOut[np.int32]] = None,
) -> npt.NDArray[np.int32]:
    """Block selection over an engine's paged index-K cache, read in place.

    vLLM's MiniMax-M3 layout: ``kv_cache [num_blocks, block_size, d]``, whose page is the
    block. Query ``i`` (``index_q [n_queries, n_kv_heads, d]``) belongs to sequence
    ``seq_ids[i]`` at ``query_pos[i]`` within it. Rows hold the sequence's logical block
    ids, ascending, then -1 (what vLLM's ``minimax_m3_index_topk`` returns);
    ``physical=True`` maps each through the block table to its page id, in the same slots.
    The pages are never converted: a cache in non-native byte order is refused (naming
    ``kv_cache``: pass ``kv_cache.astype(kv_cache.dtype.newbyteorder('='))``); misaligned
    pages are read in place, byte by byte.

    Parameters
    ----------
    index_q : array_like, [n_queries, n_kv_heads, d]
        The indexer queries, formats as :func:`block_sparse_select`. Any CPU DLPack tensor
        too.
    kv_cache : ndarray, [num_blocks, block_size, d]
        The pages: float32 / float16 / bfloat16 / float8_e4m3fn (a raw uint16 / uint8 view
        with ``key_format``), native byte order; the block axis may be strided.
        ``block_size`` must equal ``config.block_size``. Any CPU DLPack tensor too.
    block_table : array_like of int32, [n_seqs, max_blocks]
        Each sequence's pages (int64 converted once when every entry fits int32). Must be
        ``[len(seq_lens), max_blocks]``, axis by axis; only the first ``ceil(seq_lens[s] /
        block_size)`` entries of a row are read, and each must name a page.
    seq_lens : array_like of int, [n_seqs]
        Each sequence's length in tokens.
    seq_ids : array_like of int, [n_queries]
        Each query's sequence, in ``0..n_seqs``.
    query_pos : int or array_like of int, [n_queries]
        Each query's position within its sequence, >= 0 (one integer for one query).
    config : BlockSparseConfig, optional
        The selection rule; None for ``BlockSparseConfig()``.
    key_format, query_format : str, optional
        The format of a raw uint16 / uint8 view, as in :func:`block_sparse_select`.
    head_major : bool, default False
        Rows as ``[n_kv_heads, n_queries, width]`` instead of ``[n_queries, n_kv_heads,
        width]``.
    physical : bool, default False
        Page ids (through the block table) instead of logical block ids.
    out : ndarray of int32, optional
        ``out=`` reuses a buffer: exactly the result's shape, written in place and returned.
        C-contiguous, writeable, aligned, native byte order, not overlapping any input or
        page (else refused, nothing written).

    Returns
    -------
    ndarray of int32, [n_queries, n_kv_heads, width]
        Each row's block ids (page ids with ``physical=True``), ascending, then -1
        (``[n_kv_heads, n_queries, width]`` with ``head_major=True``).

    Raises
    ------
    SelectionError
        (a ValueError; ``.argument`` names the argument) when ``kv_cache`` is not 3-D, in
        non-native byte order, or its pages are not ``config.block_size`` tokens;
        ``block_table`` is not ``[len(seq_lens), max_blocks]``, too short for a sequence, a
        read entry names no page, or an entry does not fit int32; ``seq_ids`` is not
        ``[n_queries]`` or names no sequence; ``query_pos`` is negative or not
        ``[n_queries]``; ``index_q`` is not 3-D or of another ``d``; a format name is
        unknown; a tensor is on a GPU; ``out`` is refused (its shape, layout, read-only, or
        overlapping an input).
    TypeError
        when a dtype does not fit (float64 pages, a raw view without ``key_format`` or with
        another one, a float ``block_table``), ``config`` is not a BlockSparseConfig or
        None, an argument is not an array, or ``out`` is not an int32 ndarray.
    """

def positions_of_blocks(
    blocks: _ArrayIn,
    query_pos: Union[int, _ArrayIn],
    n_positions: Union[int, _ArrayIn],
    config: Optional[BlockSparseConfig] = None,
    *,
    head_major: bool = False,
    out: Optional[_ArrayOut[np.int32]] = None,
) -> npt.NDArray[np.int32]:
    """The positions a block selection covers, int32, ascending and causally clipped.

    Block ``b`` contributes ``b*bs .. min((b+1)*bs, n_positions, query_pos + 1)``; negative
    entries (padding) are skipped. 1-D ``blocks`` with an int ``query_pos`` and
    ``n_positions``: the positions, as long as they are. Batched, in one call: ``blocks
    [rows, width]``, or a selection's ``[n_queries, n_kv_heads, width]`` (``[n_kv_heads,
    n_queries, width]`` with ``head_major=True``), gives fixed-width rows ``[..., width *
    block_size]``, ascending then -1 (what :func:`sparse_attention` takes).

    Parameters
    ----------
    blocks : array_like of int32, [width], [rows, width] or [n_queries, n_kv_heads, width]
        Block ids, negative entries padding (a selection's rows as they come).
    query_pos, n_positions : int or array_like of int, [rows] or [n_queries]
        The query's position and the sequence length: an int (every row's), or, batched,
        one entry per row (2-D) or per query (3-D). The 1-D form takes ints.
    config : BlockSparseConfig, optional
        Its ``block_size`` (``bs``); None for ``BlockSparseConfig()``.
    head_major : bool, default False
        3-D ``blocks`` are ``[n_kv_heads, n_queries, width]``.
    out : ndarray of int32, [..., width * block_size], optional
        Batched only (the 1-D form takes no ``out=``): exactly that shape, written in place
        and returned. C-contiguous, writeable, aligned, native byte order, overlapping no
        input (else refused, nothing written).

    Returns
    -------
    ndarray of int32, [n_covered] (1-D ``blocks``) or [..., width * block_size]
        The covered positions, ascending (batched rows then -1).

    Raises
    ------
    SelectionError
        (a ValueError; ``.argument`` names the argument) when ``blocks`` is not 1-D, 2-D or
        3-D, or a covered position would not fit int32; ``query_pos`` / ``n_positions`` is
        negative, or neither an int nor one entry per row / per query (axis 1 when
        head-major); ``out`` is given with 1-D ``blocks``, or is refused (its shape,
        layout, read-only, or overlapping an input).
    TypeError
        when ``blocks`` or a position is not integers, ``config`` is not a BlockSparseConfig
        or None, or ``out`` is not an int32 ndarray.
    """

@final
class Selector:
    """A score-free baseline selector: which keys each query row of a causal sequence may see.

    Query row ``i`` of a causal sequence sees keys ``0..=i``. Build one with
    ``Selector.dense()``, ``Selector.local(window)``, ``Selector.random(budget, seed)`` or
    ``Selector.sink_window(sinks, window)``; rows are distinct, ascending and causal.
    Immutable, compares by value, hashable.
    """

    @staticmethod
    def dense() -> "Selector":
        """Every causal key.

        Row ``i`` is keys ``0..=i``.

        Returns
        -------
        Selector
            The dense selector.
        """
    @staticmethod
    def local(window: int) -> "Selector":
        """The ``window`` most recent keys, the query's own included.

        Parameters
        ----------
        window : int
            How many keys a row holds at most: a non-negative integer, at most 2**31 - 1.

        Returns
        -------
        Selector
            The local-window selector.

        Raises
        ------
        SelectionError
            (a ValueError; ``.argument`` is ``window``) when ``window`` is negative or past
            2**31 - 1.
        TypeError
            when ``window`` is not an integer.
        """
    @staticmethod
    def random(budget: int, seed: int) -> "Selector":
        """``budget`` distinct keys drawn uniformly from the causal set.

        ChaCha8 keyed by ``seed`` on stream ``i`` (the row): deterministic per seed and row.

        Parameters
        ----------
        budget : int
            Keys per row (all of them when the row has fewer): a non-negative integer, at most
            2**31 - 1.
        seed : int
            The generator's key, in ``0 .. 2**64 - 1``.

        Returns
        -------
        Selector
            The random selector.

        Raises
        ------
        SelectionError
            (a ValueError; ``.argument`` names the argument) when ``budget`` or ``seed`` is
            negative or too large.
        TypeError
            when ``budget`` or ``seed`` is not an integer.
        """
    @staticmethod
    def sink_window(sinks: int, window: int) -> "Selector":
        """StreamingLLM: the first ``sinks`` keys plus the ``window`` most recent.

        Parameters
        ----------
        sinks : int
            Keys at the start of the sequence every row keeps: non-negative, at most 2**31 - 1.
        window : int
            The most recent keys, the query's own included: non-negative, at most 2**31 - 1.

        Returns
        -------
        Selector
            The sink-plus-window selector.

        Raises
        ------
        SelectionError
            (a ValueError; ``.argument`` names the argument) when ``sinks`` or ``window`` is
            negative or past 2**31 - 1.
        TypeError
            when ``sinks`` or ``window`` is not an integer.
        """
    def row(self, row: int) -> npt.NDArray[np.int32]:
        """The candidates of query row ``row`` (keys ``0..=row``), ascending.

        Parameters
        ----------
        row : int
            The query's position: a non-negative integer, at most 2**31 - 2.

        Returns
        -------
        ndarray of int32, [n_candidates]
            The row's keys, distinct and ascending.

        Raises
        ------
        SelectionError
            (a ValueError; ``.argument`` is ``row``) when ``row`` is negative or past 2**31 - 2.
        TypeError
            when ``row`` is not an integer.
        """
    def rows(
        self,
        query_pos: _ArrayIn,
        width: Optional[int] = None,
        *,
        out: Optional[_ArrayOut[np.int32]] = None,
    ) -> npt.NDArray[np.int32]:
        """The candidates of every query position in ``query_pos``, as fixed-width rows.

        Row ``r`` holds the candidates of position ``query_pos[r]`` (as :meth:`row`), ascending,
        then -1 up to ``width``.

        Parameters
        ----------
        query_pos : int or array_like of int, [n]
            The query positions, each >= 0 (one integer for ``n = 1``).
        width : int, optional
            The row width, at least the widest row's candidates; defaults to the widest row.
        out : ndarray of int32, [n, width], optional
            Filled in place and returned: exactly ``[n, width]``, C-contiguous, writeable,
            aligned, native byte order, sharing no input's memory (else refused: a refused call
            leaves it untouched).

        Returns
        -------
        ndarray of int32, [n, width]
            Each position's candidates, ascending, then -1.

        Raises
        ------
        SelectionError
            (a ValueError; ``.argument`` names the argument) when ``query_pos`` is negative or
            not 1-D; ``width`` is negative, past 2**31 - 1 or cannot hold a row's candidates;
            ``out`` is refused (its shape, layout, read-only, or sharing an input's memory).
        TypeError
            when ``query_pos`` or ``width`` is not integers, or ``out`` is not an int32 ndarray.
        MemoryError
            when the output is too large to allocate.
        """
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

def oracle_topk(
    attention: _ArrayIn,
    query_pos: _ArrayIn,
    budget: int,
    *,
    width: Optional[int] = None,
    out: Optional[_ArrayOut[np.int32]] = None,
) -> npt.NDArray[np.int32]:
    """The oracle top-k: each row's ``budget`` heaviest causal keys of the dense attention.

    For each row ``i`` of ``attention`` (the dense attention row of query position
    ``query_pos[i]``), the ``budget`` keys with the largest weight among
    ``0..=query_pos[i]``, ties to the lower key (NaN ranks as -inf), ascending then -1.

    Parameters
    ----------
    attention : array_like of float64, [n, row_len]
        Dense attention rows (other float dtypes converted once). Any CPU DLPack tensor too.
    query_pos : int or array_like of int, [n]
        Each row's query position, >= 0. One integer is ``[query_pos]`` (``attention`` keeps
        its row axis, of length 1).
    budget : int
        Keys per row: non-negative, at most 2**31 - 1.
    width : int, optional
        The row width, at least every row's key count; defaults to the widest row.
    out : ndarray of int32, [n, width], optional
        Filled in place and returned: exactly ``[n, width]``, C-contiguous, writeable,
        aligned, native byte order, sharing no input's memory (else refused: a refused call
        leaves it untouched).

    Returns
    -------
    ndarray of int32, [n, width]
        Each row's selected keys, ascending, then -1.

    Raises
    ------
    SelectionError
        (a ValueError; ``.argument`` names the argument) when ``attention`` is not 2-D (or
        its rows do not fit int32 offsets); ``query_pos`` is negative or has not one
        position per attention row; ``budget`` or ``width`` is negative or past 2**31 - 1,
        or ``width`` cannot hold a row; ``out`` is refused (its shape, layout, read-only, or
        sharing an input's memory).
    TypeError
        when ``attention`` is not floats, ``query_pos``, ``budget`` or ``width`` is not
        integers, or ``out`` is not an int32 ndarray.
    """

def attention_probabilities(
    q: _ArrayIn,
    k: _ArrayIn,
    query_pos: _ArrayIn,
    *,
    scale: Optional[float] = None,
    out: Optional[_ArrayOut[np.float64]] = None,
) -> npt.NDArray[np.float64]:
    """Dense causal attention probabilities: the rows recall is measured against.

    Query ``i`` attends over keys ``0..=query_pos[i]`` with ``softmax(scale * q . k)``;
    entries after its position are zero. A KV head serves its group of query heads (GQA).

    Parameters
    ----------
    q : array_like of float32, [n_queries, n_q_heads, d_k]
        The queries (other float dtypes converted once). Any CPU DLPack tensor too.
    k : array_like of float32, [n_keys, n_kv_heads, d_k]
        The keys; ``n_q_heads`` must be a multiple of ``n_kv_heads``.
    query_pos : int or array_like of int, [n_queries]
        Each query's position, >= 0. One integer is ``[query_pos]`` (``q`` keeps its query
        axis, of length 1): never broadcast over many queries.
    scale : float, optional
        The softmax scale, finite; defaults to ``1 / sqrt(d_k)``.
    out : ndarray of float64, [n_queries, n_q_heads, n_keys], optional
        Filled in place and returned: exactly that shape, C-contiguous, writeable, aligned,
        native byte order, sharing no input's memory (else refused: a refused call leaves it
        untouched).

    Returns
    -------
    ndarray of float64, [n_queries, n_q_heads, n_keys]
        The probabilities, zeros after each query's position.

    Raises
    ------
    SelectionError
        (a ValueError; ``.argument`` names the argument) when ``q`` or ``k`` is not 3-D, or
        their ``d_k`` differ (``q``); ``n_kv_heads`` is 0 or does not divide ``n_q_heads``
        (``n_kv_heads`` / ``n_q_heads``); ``query_pos`` is negative or not ``[n_queries]``;
        ``scale`` is not finite; ``out`` is refused (its shape, layout, read-only, or
        sharing an input's memory).
    TypeError
        when ``q`` or ``k`` is not floats, ``query_pos`` is not integers, ``scale`` is not a
        number, or ``out`` is not a float64 ndarray.
    """

def dense_attention(
    q: _ArrayIn,
    k: _ArrayIn,
    v: _ArrayIn,
    query_pos: _ArrayIn,
    *,
    scale: Optional[float] = None,
    out: Optional[_ArrayOut[np.float32]] = None,
    lse_out: Optional[_ArrayOut[np.float32]] = None,
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """Dense causal attention: every query over the keys up to its position.

    Query ``i`` attends over keys ``0..=query_pos[i]``; a KV head serves its group of query
    heads (GQA). ``v`` may be MLA's strided ``kv[..., :d_v]`` view, read in place.

    Parameters
    ----------
    q : array_like of float32, [n_queries, n_q_heads, d_k]
        The queries (other float dtypes converted once). Any CPU DLPack tensor too.
    k : array_like of float32, [n_keys, n_kv_heads, d_k]
        The keys; ``n_q_heads`` must be a multiple of ``n_kv_heads``.
    v : array_like of float32, [n_keys, n_kv_heads, d_v]
        The values: read in place when float32 rows of ``d_v`` with a uniform row stride (a
        C-order array, or MLA's ``kv[..., :d_v]`` view of the keys), else converted once.
    query_pos : int or array_like of int, [n_queries]
        Each query's position, >= 0. One integer is ``[query_pos]`` (``q`` keeps its query
        axis, of length 1).
    scale : float, optional
        The softmax scale, finite; defaults to ``1 / sqrt(d_k)``.
    out : ndarray of float32, [n_queries, n_q_heads, d_v], optional
        Filled in place and returned: exactly that shape, C-contiguous, writeable, aligned,
        native byte order, sharing no input's memory nor ``lse_out``'s (else refused: a
        refused call leaves both untouched).
    lse_out : ndarray of float32, [n_queries, n_q_heads], optional
        The same for ``lse``.

    Returns
    -------
    out : ndarray of float32, [n_queries, n_q_heads, d_v]
        The attention output.
    lse : ndarray of float32, [n_queries, n_q_heads]
        Each row's log-sum-exp of its scaled scores (natural log).

    Raises
    ------
    SelectionError
        (a ValueError; ``.argument`` names the argument) when ``q``, ``k`` or ``v`` is not
        3-D, ``q`` and ``k`` differ in ``d_k`` (``q``), or ``v`` is not ``[n_keys,
        n_kv_heads, d_v]``; ``n_kv_heads`` is 0 or does not divide ``n_q_heads``;
        ``query_pos`` is negative or not ``[n_queries]``; ``scale`` is not finite; ``out`` or
        ``lse_out`` is refused (its shape, layout, read-only, or sharing memory).
    TypeError
        when an array is not of its dtype kind (int32 ``q``), ``query_pos`` is not integers,
        ``scale`` is not a number, or ``out`` / ``lse_out`` is not a float32 ndarray.
    """

def sparse_attention(
    q: _ArrayIn,
    k: _ArrayIn,
    v: _ArrayIn,
    query_pos: _ArrayIn,
    selection: _ArrayIn,
    *,
    scale: Optional[float] = None,
    duplicates: str = "once",
    out: Optional[_ArrayOut[np.float32]] = None,
    lse_out: Optional[_ArrayOut[np.float32]] = None,
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32], int]:
    """Sparse causal attention over ``selection``: each row attends to its selected keys only.

    A KV head's row of ``selection`` serves its query-head group. A row attends to its
    entries ``x`` with ``0 <= x <= min(query_pos[i], n_keys - 1)`` (negative entries are
    padding, later ones are masked as future keys, duplicates count once unless
    ``duplicates="each"``); a row that selects nothing gets zeros and ``lse = -inf`` and is
    counted in ``empty_rows``.
    ``query_pos``, ``out=`` and ``lse_out=`` as in :func:`dense_attention`.

    Parameters
    ----------
    q : array_like of float32, [n_queries, n_q_heads, d_k]
        The queries (other float dtypes converted once). Any CPU DLPack tensor too.
    k : array_like of float32, [n_keys, n_kv_heads, d_k]
        The keys; ``n_q_heads`` must be a multiple of ``n_kv_heads``.
    v : array_like of float32, [n_keys, n_kv_heads, d_v]
        The values, read in place as in :func:`dense_attention` (MLA's ``kv[..., :d_v]``).
    query_pos : int or array_like of int, [n_queries]
        Each query's position, >= 0 (one integer is ``[query_pos]``).
    selection : array_like of int32, [n_queries, n_kv_heads, width]
        Key indices per (query, KV head) row, e.g. :func:`positions_of_blocks`' rows.
    scale : float, optional
        The softmax scale, finite; defaults to ``1 / sqrt(d_k)``.
    duplicates : str, optional
        How a row counts an entry it repeats: ``"once"`` (the default: a selection is a
        set) or ``"each"`` time it appears (the engines' sparse MLA kernels, which gather
        every slot they read; docs/checking-sparse-attention.md).
    out : ndarray of float32, [n_queries, n_q_heads, d_v], optional
        Filled in place and returned: exactly that shape, C-contiguous, writeable, aligned,
        native byte order, sharing no input's memory nor ``lse_out``'s (else refused: a
        refused call leaves both untouched).
    lse_out : ndarray of float32, [n_queries, n_q_heads], optional
        The same for ``lse``.

    Returns
    -------
    out : ndarray of float32, [n_queries, n_q_heads, d_v]
        The attention output (zeros for an empty row).
    lse : ndarray of float32, [n_queries, n_q_heads]
        Each row's log-sum-exp of its scaled scores (``-inf`` for an empty row).
    empty_rows : int
        How many (query, query head) rows selected nothing.

    Raises
    ------
    SelectionError
        (a ValueError; ``.argument`` names the argument) as :func:`dense_attention`, when
        ``selection`` is not ``[n_queries, n_kv_heads, width]``, and when ``duplicates`` is
        not ``"once"`` or ``"each"``.
    TypeError
        as :func:`dense_attention`, and when ``selection`` is not integers or ``duplicates``
        not a string.
    """

def segment_coverage_rows(
    candidates: _ArrayIn,
    context_lens: _ArrayIn,
    num_segments: int,
    *,
    out: Optional[_ArrayOut[np.float64]] = None,
) -> npt.NDArray[np.float64]:
    """:func:`segment_coverage` of every row of ``candidates``, with its ``context_lens[r]``.

    Row ``r`` of the result is ``segment_coverage(candidates[r], context_lens[r],
    num_segments)``.

    Parameters
    ----------
    candidates : array_like of int, [rows, width]
        The selections, any integer dtype whose values fit int32; negative = padding. Any
        CPU DLPack tensor too.
    context_lens : array_like of int, [rows]
        Each row's length, every entry >= 0; one per candidate row.
    num_segments : int
        The segment count ``S``, 0 to 2**64 - 1.
    out : ndarray of float64, [rows], optional
        Filled and returned: exactly ``[rows]``, native float64, C-contiguous, aligned,
        writeable, sharing no input's memory (never converted). A refused call leaves it
        untouched.

    Returns
    -------
    ndarray of float64, [rows]
        Each row's coverage (``out`` itself when given).

    Raises
    ------
    WitnessError
        (a ValueError; ``.argument`` names the argument) when ``candidates`` is not 2-D or
        holds a value outside int32, ``context_lens`` is not 1-D with one entry per row or
        has a negative entry, ``num_segments`` is negative or above 2**64 - 1, ``out`` has
        another shape, is not C-contiguous, aligned and writeable, or overlaps an input, or
        a tensor is not on the CPU.
    TypeError
        when an array holds no integers, ``num_segments`` is not an integer, or ``out`` is
        not a float64 ndarray or tensor.
    """

def slots_used_rows(
    candidates: _ArrayIn,
    context_lens: _ArrayIn,
    *,
    out: Optional[_ArrayOut[np.int64]] = None,
) -> npt.NDArray[np.int64]:
    """How many distinct entries of each row of ``candidates`` lie in ``[0, context_lens[r])``.

    The keys the selection really uses: padding, duplicates and out-of-range entries use
    none.

    Parameters
    ----------
    candidates : array_like of int, [rows, width]
        The selections, any integer dtype whose values fit int32. Any CPU DLPack tensor too.
    context_lens : array_like of int, [rows]
        Each row's length, every entry >= 0; one per candidate row.
    out : ndarray of int64, [rows], optional
        Filled and returned: exactly ``[rows]``, native int64, C-contiguous, aligned,
        writeable, sharing no input's memory (never converted). A refused call leaves it
        untouched.

    Returns
    -------
    ndarray of int64, [rows]
        Each row's count of used keys (``out`` itself when given).

    Raises
    ------
    WitnessError
        (a ValueError; ``.argument`` names the argument) when ``candidates`` is not 2-D or
        holds a value outside int32, ``context_lens`` is not 1-D with one entry per row or
        has a negative entry, ``out`` has another shape, is not C-contiguous, aligned and
        writeable, or overlaps an input, or a tensor is not on the CPU.
    TypeError
        when an array holds no integers, or ``out`` is not an int64 ndarray or tensor.
    """

def attention_mass_recall_rows(
    candidates: _ArrayIn,
    attention: _ArrayIn,
    *,
    out: Optional[_ArrayOut[np.float64]] = None,
) -> npt.NDArray[np.float64]:
    """:func:`attention_mass_recall` of every attention row against its candidate row.

    Row ``r`` of ``attention`` (float64 ``[n_rows, row_len]``) is judged against candidate
    row ``r // group``, ``group = n_rows / rows`` (a KV head's selection serves its query
    heads): float64 ``[n_rows]``. Or, as the attention functions give them, ``candidates``
    ``[n_queries, n_kv_heads, width]`` (a selection) and ``attention``
    ``[n_queries, n_q_heads, n_keys]`` (:func:`attention_probabilities`), checked axis by
    axis (``n_q_heads`` a multiple of ``n_kv_heads``): float64 ``[n_queries, n_q_heads]``,
    the same numbers.

    Parameters
    ----------
    candidates : array_like of int, [rows, width] or [n_queries, n_kv_heads, width]
        The selections, any integer dtype whose values fit int32. Any CPU DLPack tensor too.
    attention : array_like of float, [n_rows, row_len] or [n_queries, n_q_heads, n_keys]
        Dense attention rows, read as float64 (other floats convert once); 2-D with 2-D
        candidates (``n_rows`` a positive multiple of ``rows``; none when there are no
        candidate rows), 3-D with 3-D ones.
    out : ndarray of float64, [n_rows] or [n_queries, n_q_heads], optional
        Filled and returned: exactly the result's shape, native float64, C-contiguous,
        aligned, writeable, sharing no input's memory (never converted). A refused call
        leaves it untouched.

    Returns
    -------
    ndarray of float64, [n_rows] or [n_queries, n_q_heads]
        Each attention row's recall (``out`` itself when given).

    Raises
    ------
    WitnessError
        (a ValueError; ``.argument`` names the argument) when ``candidates`` is neither 2-D
        nor 3-D or holds a value outside int32; ``attention`` has the other form, another
        ``n_queries``, an ``n_q_heads`` that is no positive multiple of ``n_kv_heads``, or a
        row count that is no positive multiple of the candidate rows; ``out`` has another
        shape, is not C-contiguous, aligned and writeable, or overlaps an input; or a tensor
        is not on the CPU.
    TypeError
        when ``candidates`` holds no integers, ``attention`` no floats, or ``out`` is not a
        float64 ndarray or tensor.
    """

def output_relative_error(sparse: _ArrayIn, dense: _ArrayIn) -> float:
    """``‖sparse − dense‖ / ‖dense‖`` over whole arrays of one shape.

    Parameters
    ----------
    sparse : array_like of float32
        Any shape (other float dtypes converted once). Any CPU DLPack tensor too.
    dense : array_like of float32
        Of ``sparse``'s shape, checked axis by axis.

    Returns
    -------
    float
        The relative error, computed in float64.

    Raises
    ------
    SelectionError
        (a ValueError; ``.argument`` is ``dense``) when ``dense`` has another shape.
    TypeError
        when an input is not floats.
    """

def output_relative_error_rows(
    sparse: _ArrayIn,
    dense: _ArrayIn,
    *,
    out: Optional[_ArrayOut[np.float64]] = None,
) -> npt.NDArray[np.float64]:
    """``‖sparse − dense‖ / ‖dense‖`` per row over the last axis.

    Parameters
    ----------
    sparse : array_like of float32, [..., width]
        At least 1-D (other float dtypes converted once). Any CPU DLPack tensor too.
    dense : array_like of float32, [..., width]
        Of ``sparse``'s shape, checked axis by axis.
    out : ndarray of float64, [...], optional
        Filled in place and returned: exactly the leading shape, C-contiguous, writeable,
        aligned, native byte order, sharing no input's memory (else refused: a refused call
        leaves it untouched).

    Returns
    -------
    ndarray of float64, [...]
        Each row's relative error, of the leading shape.

    Raises
    ------
    SelectionError
        (a ValueError; ``.argument`` names the argument) when ``sparse`` is 0-D, ``dense``
        has another shape (``dense``), or ``out`` is refused (its shape, layout, read-only,
        or sharing an input's memory).
    TypeError
        when an input is not floats, or ``out`` is not a float64 ndarray.
    """

def set_num_threads(n: int) -> None:
    """Sets the number of threads kvselect's parallel paths use.

    Parameters
    ----------
    n : int
        The thread count, at most 65536; 0 restores the default (``RAYON_NUM_THREADS``, else
        every core).

    Returns
    -------
    None

    Raises
    ------
    KvselectError
        (a ValueError; ``.argument`` is ``n``) when ``n`` is negative or past 65536.
    TypeError
        when ``n`` is not an integer.
    """

def get_num_threads() -> int:
    """The number of threads kvselect's parallel paths use.

    Returns
    -------
    int
        The thread count (:func:`set_num_threads` sets it).
    """

def indexer_topk(
    index_q: _ArrayIn,
    weights: Optional[_ArrayIn],
    index_k: _ArrayIn,
    query_pos: _ArrayIn,
    topk: int,
    *,
    key_scale: Optional[_ArrayIn] = None,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    num_segments: int = 0,
    compress_ratio: int = 1,
    activation: str = "relu",
    force_first: int = 0,
    force_last: int = 0,
    row_layout: str = "rank",
    score_pool: int = 1,
    score_type: str = "max",
    sm_scale: Optional[float] = None,
    out: Optional[_ArrayOut[np.int32]] = None,
    scores_out: Optional[_ArrayOut[np.float32]] = None,
) -> npt.NDArray[np.int32]:
    """The lightning indexer's top-k (DeepSeek-V3.2/V4, GLM-5), single-sequence form.

    For each query, the ``topk`` positions of ``[0, L)``, ``L = min(query_pos + 1, T)``, with the
    largest ``score(t) = key_scale[t] * sum_h weights[h] * max(index_q[h] . index_k[t], 0)`` in
    real arithmetic (ties to the lower position; the set ``kvselect check`` accepts at ``rtol=0``),
    listed in rank order of the float32 scores ``scores_out`` reports (score descending, ties to
    the lower position, -0.0 == +0.0, NaN last), then -1. The float32 scores screen; the near
    ties their rounding could misplace at the row's threshold are re-scored in float64 (every
    product exact), so a row differs from the float32 scores' own top-k only there.
    With ``compress_ratio=m`` each key is a compressed entry of ``m`` tokens (DeepSeek-V4's CSA:
    4, HCA: 128; GLM-5-Next's pools: 16): ``query_pos`` stays the token position and the query
    sees ``L = min((query_pos + 1) // m, T)`` entries (none yet: a row of -1).

    Every array is checked axis by axis (a transposed or reshaped ``weights`` is refused, naming
    both shapes). A dense array in non-native byte order (``'>f2'``, ``'>u2'`` bits), misaligned
    or not C-contiguous is copied once to a native, aligned one (as float64 is converted to
    float32); the values read are the same. Any array argument may be a DLPack tensor
    (torch, JAX, CuPy) in CPU memory, read in place.

    Parameters
    ----------
    index_q : array_like, [n_queries, H, d]
        The index queries: float32, float16, or ``ml_dtypes`` bfloat16 / float8_e4m3fn, read in
        place; a raw ``uint16`` / ``uint8`` view needs ``query_format``.
    weights : array_like of float32, [n_queries, H], or None
        The head weights, with the softmax scale, ``H**-0.5`` and any query scale folded in.
        None: no weights (Qwen's QSA, MiniMax's MSA), every head's weight 1 (the same rows as
        weights of one, bit for bit).
    index_k : array_like, [T, d]
        The index keys, in the formats ``index_q`` takes (raw views need ``key_format``).
    query_pos : array_like of int, [n_queries], or int
        Each query's (token) position; one integer for a batch of one query.
    topk : int
        The row width, at most ``2**31 - 1``.
    key_scale : array_like of float32, [T], or float, optional
        Per-key scales (fp8 keys' dequantisation scales), or one number for every key (a
        per-tensor scale: a Python or NumPy float, or a 0-D array); None is 1.
    key_format, query_format : str, optional
        The format of a raw ``uint16`` / ``uint8`` view: "bfloat16", "float16" or
        "float8_e4m3fn". Not needed (and checked against the dtype) for typed arrays.
    num_segments : int, optional
        ``S`` in 1..=64 returns the reserved-tail witness row (the top ``topk - S`` then the
        witnesses of ``scatter_topology_witnesses``); 0 (default) is off.
    compress_ratio : int, optional
        Tokens per key, at least 1 (default 1: token-level keys).
    activation : str, optional
        "relu" (default) or "none" (MiniMax's MSA: ``score(t) = key_scale[t] * sum_h weights[h]
        * (index_q[h] . index_k[t])``, negative scores included).
    force_first, force_last : int, optional
        The first ``force_first`` and last ``force_last`` of a row's ``L`` visible keys are in
        the row whenever it cannot hold all ``L`` (NVIDIA/cudnn-frontend#838's forced entries),
        inside the budget: the rest of it is the best of the keys between them. A row with ``L
        <= topk - num_segments`` holds every visible key once, forced or not. Their sum must fit
        ``topk - num_segments`` (default 0: none).
    row_layout : str, optional
        "rank" (default): rank order of the float32 scores (forced entries by their scores too),
        then -1. "ascending": cuDNN's layout, positions ascending and compact, then -1 (its
        ``topk_length`` is ``(rows >= 0).sum(-1)``).
    score_pool : int, optional
        The score pool (MiniMax's MSA: 128): blocks of ``score_pool`` visible keys, the last one
        partial, each scored by the largest of its keys' scores (NaN absent, a block of NaN
        -inf; real arithmetic, as the keys are); the row then holds the ``topk`` best block ids
        (ties to the lower block), ``force_first`` / ``force_last`` count blocks, and
        ``scores_out`` receives the blocks' float32 scores. Default 1: no pool. Not with
        ``num_segments``.
    score_type : str, optional
        How the pool scores a block: "max" (default) or "lse", SGLang's MiniMax-M3 selector's
        ``ln sum_t exp(sm_scale * score(t))`` over the block's keys (a NaN key makes the block
        -inf), exact up to about ``1e-7`` of the log (the project's exp; docs/indexer.md).
        Needs ``score_pool >= 2``.
    sm_scale : float, optional
        The scores' scale inside the exponential, finite and above 0, read as float32;
        ``1 / sqrt(d)`` by default (SGLang's). Only with ``score_type="lse"``.
    out : ndarray of int32, [n_queries, topk], optional
        Written and returned: C-contiguous, writeable, aligned, native byte order, not
        overlapping any input (else refused, nothing written).
    scores_out : ndarray of float32, [n_queries, topk], optional
        Receives each entry's score (NaN where the row holds -1); the same rules as ``out``.

    Returns
    -------
    ndarray of int32, [n_queries, topk]
        The rows, row-relative positions in rank order, then -1 (then the witnesses).

    Raises
    ------
    SelectionError
        (a ValueError; ``.argument`` names the argument) on a shape that does not fit the others,
        ``d = 0``, more than ``2**31 - 1`` keys, a negative ``query_pos``, ``topk`` or
        ``num_segments`` out of range, ``compress_ratio < 1``, an unknown ``activation`` or
        ``row_layout``, forced entries past the budget, a format that does not match the
        dtype, a GPU DLPack tensor (move it with ``.cpu()``), or an output that cannot be written
        or overlaps an input. Nothing is written.
    TypeError
        On an argument of the wrong type or dtype (a float position, a complex array, a bare
        PyCapsule).
    """

def indexer_topk_packed(
    index_q: _ArrayIn,
    weights: Optional[_ArrayIn],
    index_k: _ArrayIn,
    cu_seqlens: _ArrayIn,
    seq_ids: _ArrayIn,
    query_pos: _ArrayIn,
    topk: int,
    *,
    key_scale: Optional[_ArrayIn] = None,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    num_segments: int = 0,
    compress_ratio: int = 1,
    activation: str = "relu",
    force_first: int = 0,
    force_last: int = 0,
    row_layout: str = "rank",
    score_pool: int = 1,
    score_type: str = "max",
    sm_scale: Optional[float] = None,
    out: Optional[_ArrayOut[np.int32]] = None,
    scores_out: Optional[_ArrayOut[np.float32]] = None,
) -> npt.NDArray[np.int32]:
    """The lightning indexer's top-k over a packed batch, serving-engine style.

    The keys of all sequences are concatenated in ``index_k`` (``key_scale`` alike), sequence
    ``s`` owning rows ``cu_seqlens[s] .. cu_seqlens[s + 1]``; query ``i`` belongs to sequence
    ``seq_ids[i]`` at position ``query_pos[i]`` within it, sees only its own sequence's keys,
    and its row holds offsets from the start of its sequence. Otherwise as
    :func:`indexer_topk`, row for row (with ``compress_ratio``, each sequence's rows are its
    compressed entries).

    Parameters
    ----------
    index_q, weights, index_k : array_like
        As :func:`indexer_topk` takes them; ``index_k`` is ``[n_keys, d]``, every sequence's keys.
    cu_seqlens : array_like of int, [n_seqs + 1]
        Non-decreasing key offsets from 0 to ``n_keys``.
    seq_ids : array_like of int, [n_queries]
        Each query's sequence.
    query_pos : array_like of int, [n_queries], or int
        Each query's position within its sequence; one integer for one query.
    topk, key_scale, key_format, query_format, num_segments, compress_ratio : optional
        As :func:`indexer_topk` takes them.
    activation, force_first, force_last, row_layout, score_pool, score_type, sm_scale : optional
        As :func:`indexer_topk` takes them.
    out, scores_out : ndarray, [n_queries, topk], optional
        As :func:`indexer_topk` takes them.

    Returns
    -------
    ndarray of int32, [n_queries, topk]
        Each query's row, offsets within its sequence, in rank order, then -1.

    Raises
    ------
    SelectionError
        (a ValueError; ``.argument`` names the argument) as :func:`indexer_topk`, and on
        ``cu_seqlens`` that do not rise from 0 to the keys, or a ``seq_ids`` entry past them.
        Nothing is written.
    TypeError
        On an argument of the wrong type or dtype.
    """

def indexer_topk_paged(
    index_q: _ArrayIn,
    weights: Optional[_ArrayIn],
    kv_cache: _ArrayIn,
    block_table: _ArrayIn,
    seq_lens: _ArrayIn,
    seq_ids: _ArrayIn,
    query_pos: _ArrayIn,
    topk: int,
    *,
    page_layout: str = "dense",
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    num_segments: int = 0,
    compress_ratio: int = 1,
    activation: str = "relu",
    force_first: int = 0,
    force_last: int = 0,
    row_layout: str = "rank",
    score_pool: int = 1,
    score_type: str = "max",
    sm_scale: Optional[float] = None,
    out: Optional[_ArrayOut[np.int32]] = None,
    scores_out: Optional[_ArrayOut[np.float32]] = None,
) -> npt.NDArray[np.int32]:
    """The lightning indexer's top-k over an engine's paged key cache, read in place.

    Query ``i`` belongs to sequence ``seq_ids[i]`` at ``query_pos[i]`` within it and its row
    holds positions within it. The pages are never converted: a cache in non-native byte order is
    refused (naming ``kv_cache``: pass ``kv_cache.astype(kv_cache.dtype.newbyteorder('='))``);
    misaligned pages are read in place, byte by byte. With ``compress_ratio=m`` the pages hold
    compressed entries (DeepSeek-V4's indexer cache: entry ``c`` at ``block_table[s, c //
    block_size] * block_size + c % block_size``) and ``seq_lens`` counts entries.

    Parameters
    ----------
    index_q, weights : array_like
        As :func:`indexer_topk` takes them.
    kv_cache : array_like
        ``page_layout="dense"``: ``[num_blocks, block_size, d]`` pages of float32 / float16 /
        bfloat16 / float8_e4m3fn (raw uint16 / uint8 with ``key_format``).
        ``page_layout="fp8_scaled"``: vLLM's DSA index-K pages, uint8 ``[num_blocks,
        block_size, 1, d + 4]`` or ``[num_blocks, block_size, d + 4]``, each page the
        ``block_size × d`` e4m3fn bytes then ``block_size`` float32 scales. The block axis may
        be strided.
    block_table : array_like of int32, [n_seqs, max_blocks]
        Each sequence's pages; only the first ``ceil(seq_lens[s] / block_size)`` entries of a
        row are read.
    seq_lens : array_like of int, [n_seqs]
        Each sequence's keys (entries with ``compress_ratio``).
    seq_ids : array_like of int, [n_queries]
        Each query's sequence.
    query_pos : array_like of int, [n_queries], or int
        Each query's position within its sequence; one integer for one query.
    topk, key_format, query_format, num_segments, compress_ratio : optional
        As :func:`indexer_topk` takes them.
    activation, force_first, force_last, row_layout, score_pool, score_type, sm_scale : optional
        As :func:`indexer_topk` takes them.
    page_layout : str, optional
        "dense" (default) or "fp8_scaled".
    out, scores_out : ndarray, [n_queries, topk], optional
        As :func:`indexer_topk` takes them.

    Returns
    -------
    ndarray of int32, [n_queries, topk]
        Each query's row, positions within its sequence, in rank order, then -1.

    Raises
    ------
    SelectionError
        (a ValueError; ``.argument`` names the argument) as :func:`indexer_topk`, and on a
        block-table entry that would be read and is negative or past the cache, a block-table row
        shorter than its sequence needs, a ``seq_ids`` entry past ``seq_lens``, or a cache in
        non-native byte order. Nothing is written.
    TypeError
        On an argument of the wrong type or dtype.
    """

def indexer_scores(
    index_q: _ArrayIn,
    weights: Optional[_ArrayIn],
    index_k: _ArrayIn,
    query_pos: _ArrayIn,
    *,
    key_scale: Optional[_ArrayIn] = None,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    compress_ratio: int = 1,
    activation: str = "relu",
    out: Optional[_ArrayOut[np.float32]] = None,
) -> npt.NDArray[np.float32]:
    """Every query's exact score of every key it sees.

    The scores :func:`indexer_topk` ranks, bit for bit — what :func:`check_topk` judges an
    engine's rows against. Builds the whole ``[n_queries, n_keys]`` matrix: a checking tool, not
    a serving path. Their error scales are :func:`indexer_magnitudes`.

    Parameters
    ----------
    index_q, weights, index_k, query_pos, key_scale, key_format, query_format, compress_ratio
        As :func:`indexer_topk` takes them (``weights=None``: no weights, every head's 1).
    activation : str, optional
        "relu" (default) or "none", as :func:`indexer_topk` takes it.
    out : ndarray of float32, [n_queries, n_keys], optional
        Written and returned: C-contiguous, writeable, aligned, native byte order, not
        overlapping any input.

    Returns
    -------
    ndarray of float32, [n_queries, n_keys]
        Each query's scores, NaN past its context (``L`` keys, as :func:`indexer_topk` counts
        them).

    Raises
    ------
    SelectionError
        (a ValueError; ``.argument`` names the argument) as :func:`indexer_topk`. Nothing is
        written.
    TypeError
        On an argument of the wrong type or dtype.
    """

def _indexer_rescore(
    index_q: Any,
    weights: Any,
    index_k: Any,
    query_pos: Any,
    rows: Any,
    positions: Any,
    *,
    key_scale: Any = None,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    compress_ratio: int = 1,
) -> npt.NDArray[np.float64]:
    """Chosen scores in float64 (private: the exact check's re-score).

    Query ``rows[j]``'s score of key ``positions[j]``, for each ``j``, the other arguments as
    :func:`indexer_scores` takes them (no ``out``): every product of two decoded operands
    exact, the sums in float64 (the same bits at every SIMD level), so within ``γ_{d+H+2}``
    (units of ``2^-53``) of ``|c_t| Σ_h |w_h| Σ_i |q_hi k_ti|`` of the real score. Pairs of
    one row are best given together. A row past the queries or a position past its query's
    context is refused.
    """

def _indexer_rescore_all(
    index_q: Any,
    weights: Any,
    index_k: Any,
    query_pos: Any,
    *,
    key_scale: Any = None,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    compress_ratio: int = 1,
) -> npt.NDArray[np.float64]:
    """Every score and its magnitude in float64 (private: the exact check's dense re-score).

    ``[n_queries, 2, n_keys]``: ``[:, 0]`` each query's score of every key it sees,
    :func:`_indexer_rescore`'s score of each pair, bit for bit (each key decoded once per
    group of queries); ``[:, 1]`` its magnitude ``|c_t| Σ_h |w_h| Σ_i |q_hi k_ti|``; NaN
    past the query's context (``L`` keys, as :func:`indexer_topk` counts them). The arguments as
    :func:`indexer_scores` takes them (no ``out``). What the exact check computes where its
    float32 screen would leave every position in the band (low-contrast rows).
    """

def _indexer_rescore_verdict(
    index_q: Any,
    weights: Any,
    index_k: Any,
    query_pos: Any,
    positions: Any,
    *,
    atol: float,
    rtol: float,
    key_scale: Any = None,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    compress_ratio: int = 1,
) -> npt.NDArray[np.float64]:
    """The exact check's verdict of each row from every float64 score (private: the dense check).

    From :func:`_indexer_rescore_all`'s scores ``s`` and magnitudes ``m`` of every key a row
    sees, no score kept: with ``e = atol + rtol m``, ``[n_queries, 5]``: the highest ``s - e``
    of an unselected key, the lowest ``s + e`` of a selected one, the highest ``s - e`` and the
    lowest ``s + e`` of any key (``-inf`` / ``inf`` when there is none), and how many distinct
    keys the row selects. ``positions`` (integer ``[n_queries, width]``) is each row's
    selection; entries outside the row's context (``-1`` among them) select nothing. The other
    arguments as :func:`indexer_scores` takes them (no ``out``).
    """

def indexer_magnitudes(
    index_q: _ArrayIn,
    weights: _ArrayIn,
    index_k: _ArrayIn,
    query_pos: _ArrayIn,
    *,
    key_scale: Optional[_ArrayIn] = None,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    compress_ratio: int = 1,
    out: Optional[_ArrayOut[np.float32]] = None,
) -> npt.NDArray[np.float32]:
    """Each :func:`indexer_scores` entry's error scale.

    ``|key_scale[t]| * sum_h |weights[h]| * sum_i |index_q[h, i] * index_k[t, i]|``: the
    ``magnitudes`` of :func:`check_topk` (its ``rtol`` multiplies them). The same under either
    activation (both pass ``|q . k|`` through; ``weights=None`` is weights of one).

    Parameters
    ----------
    index_q, weights, index_k, query_pos, key_scale, key_format, query_format, compress_ratio
        As :func:`indexer_topk` takes them.
    out : ndarray of float32, [n_queries, n_keys], optional
        As :func:`indexer_scores` takes it.

    Returns
    -------
    ndarray of float32, [n_queries, n_keys]
        The magnitudes, NaN past each query's context.

    Raises
    ------
    SelectionError
        (a ValueError; ``.argument`` names the argument) as :func:`indexer_topk`. Nothing is
        written.
    TypeError
        On an argument of the wrong type or dtype.
    """

def _check_topk_structure(
    rows: _ArrayIn,
    context_lens: _ArrayIn,
    *,
    topk: Optional[int] = None,
    slots: Optional["GlobalSlots"] = None,
    filler: str = "-1",
) -> dict[str, Any]:
    """The structural half of :func:`check_topk` alone (private: the exact indexer check's).

    Each row's valid entries first, distinct, causal, exactly ``min(topk, L)`` of them, under
    ``filler`` and ``slots`` as :func:`check_topk` reads them; no score is read, so a row's
    selection is taken as right. :func:`check_topk`'s report of the same rows against any equal
    scores (no position scored ``-inf``), without its pass over every position: for rows whose
    selection a float64 verdict has already passed.
    """

def check_topk(
    scores: _ArrayIn,
    rows: _ArrayIn,
    context_lens: Optional[_ArrayIn] = None,
    *,
    topk: Optional[int] = None,
    atol: float = 0.0,
    rtol: float = 0.0,
    magnitudes: Optional[_ArrayIn] = None,
    slots: Optional["GlobalSlots"] = None,
    filler: str = "-1",
) -> dict[str, Any]:
    """Whether each of an engine's top-k rows is a correct selection of its row's exact scores.

    A correct row has its valid entries first, distinct, causal (``0 <= x < L``), exactly
    ``min(topk, L)`` of them, and every selected position scoring at least every unselected
    one — up to ``e_t = atol + rtol * magnitudes[t]`` on each side, so a tie within the
    engine's rounding is never an error (rows may be in any order; ties at the threshold
    broken any way). With ``atol = rtol = 0`` the check is exact. A position scored
    exactly ``-inf`` is not selectable: it does not count toward ``min(topk, L)`` (DSA
    candidate-block selectors write ``-1`` for it). Rows may be narrower than ``topk``
    when every row's ``min(topk, L)`` fits them.

    ``filler`` states how the engine fills a row that sees fewer than ``topk`` positions
    (and pads in general); the entries it names are ignored, and a correct row still holds
    exactly ``min(topk, L)`` distinct valid entries: ``"-1"`` (the default) — negative
    entries are padding and come after the valid ones; ``"past_context"`` (transformers'
    DeepSeek-V3.2-family DSA modules, whose ``torch.topk`` over masked scores fills with
    masked future positions) — an entry at or past the row's context ``L``, or negative, is
    filler wherever it sits (with ``slots``, an entry naming no position of its request is
    still ``not_in_table``); ``"repeat"`` — an entry equal to an earlier valid entry of the
    row is filler wherever it sits, negative ones padding as with ``"-1"`` (a row that
    repeats instead of selecting is short: ``wrong_count``). DCP rows (``slots`` with
    ``dcp_size > 1``) pad anywhere under every rule.

    Parameters
    ----------
    scores : array_like of float32 or float64, [n_rows, n_positions]
        Each row's scores, read as given and judged **in their own arithmetic**: the
        verdict is exact for these values, so float32 scores (e.g. :func:`indexer_scores`)
        decide a near tie as float32 rounding left it, which real arithmetic may decide the
        other way. For the real-arithmetic verdict on an indexer's rows (what
        :func:`indexer_topk` selects) use :func:`kvselect.checking.check_indexer_topk`, or
        pass float64-exact scores. Any other dtype is a ``TypeError``.
    rows : array_like of int32 or int64, [n_rows, width]
        The engine's rows (e.g. :func:`indexer_topk`; top-k rows are always 2-D, one per
        query), negative entries padding, row-relative or (``slots=GlobalSlots(...)``)
        global slot ids. Any integer dtype whose values fit int64 converts once.
    context_lens : array_like of int, [n_rows], optional
        Each row's context ``L``, 0 to ``n_positions`` (default: every position; for the
        indexer, ``min(query_pos + 1, n_keys)``).
    topk : int, optional
        The selection size, at most ``width``; defaults to ``width`` (a rank's width with
        DCP slots).
    atol, rtol : float, optional
        The tolerance ``e_t = atol + rtol * magnitudes[t]``, finite and >= 0 (default 0);
        ``rtol > 0`` needs ``magnitudes``.
    magnitudes : array_like of float, [n_rows, n_positions], optional
        Each score's magnitude (float32 or float64; another float dtype converts to
        float32), the shape of ``scores`` axis by axis; every entry within a row's context a
        number >= 0 (NaN past it is never read).
    slots : GlobalSlots, optional
        How to read global slot ids back to positions; None (the default) for row-relative
        rows.
    filler : str, optional
        ``"-1"`` (the default), ``"past_context"`` or ``"repeat"`` (above).

    Returns
    -------
    dict
        ``rows``, ``correct``, ``wrong``, ``by_reason`` (rows per reason: ``padding_hole``,
        ``duplicate``, ``not_causal``, ``not_in_table``, ``wrong_count``,
        ``wrong_selection``) and ``details``, one entry per wrong row: its ``row`` and
        ``problems`` (each a dict with its ``reason``; a wrong selection lists the
        ``dropped`` and ``intruders`` as ``(position, score)``, their counts, the row's exact
        ``threshold`` (scores and threshold are the input's own values, as Python floats)
        and the ``margin`` by which it is wrong; with ``slots``, a ``not_causal`` entry also
        carries the engine's ``value``, the slot id it wrote). A row's entries past its
        context are one ``not_causal`` problem (the first ``slot`` and ``position``,
        ``n_slots`` such entries, the row's ``context``), its repeats one ``duplicate`` (the
        first, and ``n_slots``). Plain Python data, JSON-ready. A wrong entry (a huge or
        future position, a slot of no page) is reported, never refused.

    Raises
    ------
    SelectionError
        (a ValueError; ``.argument`` names the argument) when ``filler`` is not one of the
        three rules; ``scores`` or ``rows`` is not 2-D; ``scores``, ``rows`` and
        ``context_lens`` do not count the same rows (the one that disagrees is named);
        ``context_lens`` has an entry that is negative or above ``n_positions``; ``topk`` is
        negative or above ``width``; ``atol`` or ``rtol`` is negative or not finite;
        ``rtol > 0`` without ``magnitudes``; ``magnitudes`` has another shape or a NaN or
        negative entry within a row's context; ``slots`` does not describe the rows
        (``req_ids``, ``prefill_req_ids``, the DCP width); or a tensor is not on the CPU.
    TypeError
        when ``scores`` is not float32 or float64 (float16 included), ``rows`` or
        ``context_lens`` holds no integers, ``magnitudes`` no floats, ``topk`` is not an
        integer, ``atol`` or ``rtol`` not a number, ``slots`` not a ``GlobalSlots`` or
        ``filler`` not a string.
    """

def block_scores(
    index_q: _ArrayIn,
    index_k: _ArrayIn,
    query_pos: _ArrayIn,
    config: Optional[BlockSparseConfig] = None,
    *,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    out: Optional[_ArrayOut[np.float32]] = None,
) -> npt.NDArray[np.float32]:
    """Every row's exact block scores: the values block selection ranks, bit for bit.

    Entry ``b`` of a row is the max of ``q . k`` over block ``b``'s visible positions
    (``-inf`` when all are NaN), NaN past the row's visible blocks; ``n_blocks =
    ceil(n_positions / config.block_size)``. Their error scales are
    :func:`block_magnitudes`.

    Parameters
    ----------
    index_q : array_like, [n_queries, n_kv_heads, d]
        The indexer queries (one query is ``index_q[None]``), in the formats of
        :func:`block_sparse_select`. Any CPU DLPack tensor too.
    index_k : array_like, [n_positions, d]
        The index keys, formats as :func:`block_sparse_select`.
    query_pos : int or array_like of int, [n_queries]
        Each query's position, >= 0 (one integer for one query).
    config : BlockSparseConfig, optional
        The selection rule; None for ``BlockSparseConfig()``.
    key_format, query_format : str, optional
        The format of a raw uint16 / uint8 view, as in :func:`block_sparse_select`.
    out : ndarray of float32, [n_queries, n_kv_heads, n_blocks], optional
        ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
        aligned, native byte order, not overlapping any input (else refused, nothing written).

    Returns
    -------
    ndarray of float32, [n_queries, n_kv_heads, n_blocks]
        The block scores, NaN past each row's visible blocks.

    Raises
    ------
    SelectionError
        (a ValueError; ``.argument`` names the argument) when ``index_q`` is not 3-D or its
        ``d`` is not ``index_k``'s (``index_q``); ``index_k`` is not 2-D; ``d`` is 0;
        ``query_pos`` is negative or not ``[n_queries]`` (one integer only for one query); a
        format name is unknown; a tensor is on a GPU; ``out`` is refused (its shape, layout,
        read-only, or overlapping an input).
    TypeError
        when an array's dtype is no key format, ``query_pos`` is not integers, ``config`` is
        not a BlockSparseConfig or None, an argument is not an array, or ``out`` is not a
        float32 ndarray.
    """

def block_magnitudes(
    index_q: _ArrayIn,
    index_k: _ArrayIn,
    query_pos: _ArrayIn,
    config: Optional[BlockSparseConfig] = None,
    *,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    out: Optional[_ArrayOut[np.float32]] = None,
) -> npt.NDArray[np.float32]:
    """The error scale of every :func:`block_scores` entry.

    Entry ``b`` is the max over block ``b``'s visible positions of ``sum_i |q_i * k_i|``:
    the ``magnitudes`` of :func:`check_blocks` (its ``rtol`` multiplies them). Arguments,
    shape and NaN padding as :func:`block_scores`.

    Parameters
    ----------
    index_q : array_like, [n_queries, n_kv_heads, d]
        The indexer queries, formats as :func:`block_sparse_select`. Any CPU DLPack tensor
        too.
    index_k : array_like, [n_positions, d]
        The index keys, formats as :func:`block_sparse_select`.
    query_pos : int or array_like of int, [n_queries]
        Each query's position, >= 0 (one integer for one query).
    config : BlockSparseConfig, optional
        The selection rule; None for ``BlockSparseConfig()``.
    key_format, query_format : str, optional
        The format of a raw uint16 / uint8 view, as in :func:`block_sparse_select`.
    out : ndarray of float32, [n_queries, n_kv_heads, n_blocks], optional
        ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
        aligned, native byte order, not overlapping any input (else refused, nothing written).

    Returns
    -------
    ndarray of float32, [n_queries, n_kv_heads, n_blocks]
        The magnitudes, NaN past each row's visible blocks.

    Raises
    ------
    SelectionError
        (a ValueError; ``.argument`` names the argument) as :func:`block_scores`: ``index_q``
        not 3-D or of another ``d`` (``index_q``), ``index_k`` not 2-D, ``d`` 0,
        ``query_pos`` negative or not ``[n_queries]``, an unknown format name, a GPU tensor,
        a refused ``out``.
    TypeError
        when an array's dtype is no key format, ``query_pos`` is not integers, ``config`` is
        not a BlockSparseConfig or None, an argument is not an array, or ``out`` is not a
        float32 ndarray.
    """

@final
class GlobalSlots:
    """How an engine wrote its rows as global cache slots (the ``slots=`` of the checkers).

    ``GlobalSlots(block_table, req_ids, block_size, *, block_stride_rows=None,
    prefill_req_ids=None, workspace_starts=None, dcp_size=None, dcp_interleave=None)``, as
    vLLM's ``triton_convert_req_index_to_global_index`` does: position ``t`` of request ``r``
    is slot ``block_table[r, t // block_size] * block_stride_rows + t % block_size``
    (``block_stride_rows`` defaults to ``block_size``), and a prefill row
    (``prefill_req_ids[row] >= 0``) holds ``workspace_starts[prefill_req_ids[row]] + t``
    instead; ``-1`` stays padding. ``req_ids`` names each checked row's request.
    MiniMax-M3's physical block ids are the case ``block_size=1``. The checkers read the
    rows back through it; an entry naming no position of its request is reported as
    ``not_in_table`` with the engine's value.

    Decode context parallelism: with ``dcp_size > 1`` (tokens dealt to the ranks
    ``dcp_interleave`` at a time), ``block_table`` is ``[dcp_size, n_requests,
    max_blocks]``, one table per rank, and the rows checked are the ranks' rows side by side
    (``np.concatenate(rank_rows, axis=1)``, ``[n_rows, dcp_size * topk]``): each rank keeps
    only its own tokens, so only together are they the selection; each rank's part pads on
    its own.

    Parameters
    ----------
    block_table : array_like of int, [n_requests, max_blocks] or [dcp_size, n_requests, max_blocks]
        Each request's pages, any integer dtype whose values fit int32 (copied once); 3-D
        exactly when ``dcp_size > 1``. Any CPU DLPack tensor too.
    req_ids : array_like of int, [n_rows]
        The request of each checked row, every entry >= 0 and below ``n_requests``.
    block_size : int
        Tokens per page, 1 to 2**31 - 1.
    block_stride_rows : int, optional
        Slots from one page to the next, ``block_size`` (the default) to 2**31 - 1.
    prefill_req_ids : array_like of int, [n_rows], optional
        Per row, the index into ``workspace_starts`` of a prefill row, or negative for a
        row read through ``block_table``. Given together with ``workspace_starts``.
    workspace_starts : array_like of int, [n_prefill_requests], optional
        Each prefill request's first workspace slot. Given together with
        ``prefill_req_ids``.
    dcp_size : int, optional
        The decode-context-parallel ranks, 1 (the default) to 2**31 - 1.
    dcp_interleave : int, optional
        Tokens dealt to a rank at a time, 1 (the default) to 2**31 - 1.

    Raises
    ------
    SelectionError
        (a ValueError; ``.argument`` names the argument) when ``block_table`` is not 2-D
        (``dcp_size = 1``) or 3-D with ``dcp_size`` tables, or holds a value outside int32;
        ``block_size``, ``dcp_size`` (named as ``block_table``'s shape) or ``dcp_interleave``
        is 0; ``block_stride_rows`` is below ``block_size`` (pages would overlap); a count
        is negative or above 2**31 - 1; ``req_ids`` (or ``prefill_req_ids``,
        ``workspace_starts``) is not 1-D or ``req_ids`` has a negative entry; only one of
        ``prefill_req_ids`` and ``workspace_starts`` is given (``workspace_starts`` is
        named); or a tensor is not on the CPU. ``req_ids`` and ``prefill_req_ids`` against
        the rows and tables (one entry per row, naming a request that exists) are checked
        by each call that reads rows.
    TypeError
        when an array holds no integers or a count is not an integer.
    """

    def __new__(
        cls,
        block_table: _ArrayIn,
        req_ids: _ArrayIn,
        block_size: int,
        *,
        block_stride_rows: Optional[int] = None,
        prefill_req_ids: Optional[_ArrayIn] = None,
        workspace_starts: Optional[_ArrayIn] = None,
        dcp_size: Optional[int] = None,
        dcp_interleave: Optional[int] = None,
    ) -> "GlobalSlots": ...
    def positions(self, rows: _ArrayIn, *, out: Optional[_ArrayOut[np.int64]] = None) -> npt.NDArray[np.int64]:
        """The engine's ``rows`` read back through the map, as the checkers read them.

        Int64 row-relative positions of the rows' shape, ``-1`` for padding (any negative
        entry) and ``2**63 - 1`` (``i64::MAX``) for an entry that maps to no position of its
        row's request (a page outside its block table, an offset past the page, a prefill slot
        before its workspace start). Positions are not checked against any context.

        Parameters
        ----------
        rows : array_like of int, [n_rows, width]
            Global slot ids, int32 or int64 (any integer dtype whose values fit int64), one row
            per ``req_ids`` entry; with DCP the ranks' rows side by side (``width`` a multiple
            of ``dcp_size``). Any CPU DLPack tensor too.
        out : ndarray of int64, [n_rows, width], optional
            ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
            aligned, native byte order, not overlapping ``rows`` (else refused, nothing
            written).

        Returns
        -------
        ndarray of int64, [n_rows, width]
            The row-relative positions.

        Raises
        ------
        SelectionError
            (a ValueError; ``.argument`` names the argument) when ``rows`` is not 2-D or holds a
            value outside int64, ``rows``' width is no multiple of ``dcp_size``, ``req_ids`` (or
            ``prefill_req_ids``) does not have one entry per row, an entry of ``req_ids`` names
            no request of ``block_table`` (or of ``prefill_req_ids`` no entry of
            ``workspace_starts``), a tensor is not on the CPU, or ``out`` is refused (its
            shape, layout, read-only, or overlapping ``rows``).
        TypeError
            when ``rows`` holds no integers, or ``out`` is not an int64 ndarray.
        """

def check_blocks(
    block_scores: _ArrayIn,
    rows: _ArrayIn,
    visible_blocks: _ArrayIn,
    config: Optional[BlockSparseConfig] = None,
    *,
    atol: float = 0.0,
    rtol: float = 0.0,
    magnitudes: Optional[_ArrayIn] = None,
    slots: Optional[GlobalSlots] = None,
    head_major: bool = False,
) -> dict[str, Any]:
    """Whether each of an engine's block-selection rows (MiniMax-M3) is correct under ``config``.

    A correct row has every forced block (the first ``init_blocks``, the newest
    ``local_blocks``) present, exactly ``min(max(top_blocks, #forced), n)`` distinct blocks
    ``0 <= b < n`` (``n`` the blocks the query sees), valid entries first, and every chosen
    free block scoring at least every rejected free one up to the tolerance of
    :func:`check_topk`. Rows are in any order, logical ids or (``slots``) physical ones;
    int32 or int64.

    Two forms, one meaning (a row per (query, KV head)):

    - 3-D, what :func:`block_scores` and :func:`block_sparse_select` give: ``block_scores``
      float32 ``[n_queries, n_kv_heads, n_blocks]``, ``rows`` ``[n_queries, n_kv_heads,
      width]`` (or, with ``head_major=True``, the engines' ``[n_kv_heads, n_queries,
      width]``), ``visible_blocks`` ``[n_queries]`` (every KV head of a query sees the same
      blocks); the report's row ``i * n_kv_heads + h`` is query ``i``, head ``h`` in either
      layout.
    - 2-D: ``block_scores`` ``[n_rows, n_blocks]``, ``rows`` ``[n_rows, width]``,
      ``visible_blocks`` ``[n_rows]`` (the 3-D form reshaped, or the 2-D ``index_q`` form's
      ``[n_kv_heads, ...]``).

    Parameters
    ----------
    block_scores : array_like of float, [n_queries, n_kv_heads, n_blocks] or [n_rows, n_blocks]
        Each row's block scores, judged as given in their own arithmetic: float32 (e.g.
        :func:`block_scores`) or float64 (e.g. exact scores) read in place; another float
        dtype converts once to float32. For the real-arithmetic verdict on a selection from
        its inputs use :func:`kvselect.testing.assert_blocks` or a ``blocks`` dump.
    rows : array_like of int32 or int64, [n_queries, n_kv_heads, width] or [n_rows, width]
        The engine's block rows, of ``block_scores``' form; negative entries padding. Any
        integer dtype whose values fit int64 converts once.
    visible_blocks : array_like of int, [n_queries] or [n_rows]
        The blocks each query sees, 0 to ``n_blocks``.
    config : BlockSparseConfig, optional
        The selection rule (None: the defaults); rows must hold ``config.width`` blocks.
    atol, rtol : float, optional
        The tolerance, as for :func:`check_topk`: finite and >= 0 (default 0); ``rtol > 0``
        needs ``magnitudes``.
    magnitudes : array_like of float, optional
        The shape of ``block_scores``, axis by axis, as for :func:`check_topk`.
    slots : GlobalSlots, optional
        How to read physical block ids back to logical ones; None for logical rows.
    head_major : bool, optional
        3-D rows are ``[n_kv_heads, n_queries, width]`` (default False).

    Returns
    -------
    dict
        :func:`check_topk`'s report, with the reason ``missing_forced`` beside its others.

    Raises
    ------
    SelectionError
        (a ValueError; ``.argument`` names the argument) when ``rows`` is neither 2-D nor
        3-D, or of another form than ``block_scores`` (3-D rows with 2-D scores name
        ``rows``, else ``block_scores``); 3-D ``rows`` or ``visible_blocks`` do not match
        the scores axis by axis (``visible_blocks`` is one count per query); 2-D row counts
        disagree; ``head_major=True`` with 2-D rows; ``config`` is invalid or no row could
        hold ``config.width`` blocks; ``visible_blocks`` has an entry that is negative or
        above ``n_blocks``; ``atol``, ``rtol``, ``magnitudes`` or ``slots`` are refused as
        by :func:`check_topk`; or a tensor is not on the CPU.
    TypeError
        when ``block_scores`` or ``magnitudes`` holds no floats, ``rows`` or
        ``visible_blocks`` no integers, ``config`` is not a ``BlockSparseConfig`` or None
        (a dict), ``slots`` not a ``GlobalSlots``, or ``head_major`` not a bool.
    """

def check_witnesses(
    before: _ArrayIn,
    after: _ArrayIn,
    context_lens: _ArrayIn,
    num_segments: int,
) -> dict[str, Any]:
    """Whether an engine's in-place witness call wrote exactly what the rule writes.

    The call is vLLM's ``scatter_topology_witnesses_``. The witness rule is integer-exact,
    so a row is correct iff it equals :func:`scatter_topology_witnesses` of ``before``; a
    row that is not says which contract it breaks: ``prefix_changed`` (a slot before
    ``topk - S`` is not the learned entry), ``wrong_witness`` (the slot, the witness the
    rule writes there, what the engine wrote and why that is wrong), ``tail_changed`` (a
    slot past the witnesses is not the learned entry).

    This is the serving layout (``keep = max(topk - S, 0)``, ``S`` witnesses at most;
    ``S = 0`` writes nothing), which for ``S >= 1`` is also
    ``apply_topology_witnesses(before, context_lens, max(topk - S, 0), S, S)``. An
    ``apply_topology_witnesses`` call with another ``learned_keep`` or ``max_replacements``
    returns a new array from its inputs, so it is checked by equality:
    ``np.array_equal(engine_out, apply_topology_witnesses(learned, context_lens,
    learned_keep, S, max_replacements))``.

    Parameters
    ----------
    before : array_like of int, [rows, topk]
        The buffer before the call, int32 or int64 (any integer dtype whose values fit
        int32). Any CPU DLPack tensor too.
    after : array_like of int, [rows, topk]
        The buffer after the call, of ``before``'s shape axis by axis (the same size in
        another shape is another buffer).
    context_lens : array_like of int, [rows]
        Each row's length, values within int32; every row needs one, the off switch
        included.
    num_segments : int
        The segment count ``S`` the engine was called with, 0 (off) to 64.

    Returns
    -------
    dict
        The report: ``rows``, ``correct``, ``wrong``, ``by_reason`` (rows per reason:
        ``prefix_changed``, ``wrong_witness``, ``tail_changed``) and ``details`` (per wrong
        row, its ``row`` and ``problems``), plain Python data.

    Raises
    ------
    WitnessError
        (a ValueError; ``.argument`` names the argument; refusals are ``WitnessError``, not
        ``SelectionError``) when ``before`` or ``after`` is not 2-D or holds a value outside
        int32, ``after`` has another shape than ``before``, ``context_lens`` is not
        ``[rows]``, ``num_segments`` is negative or more than 64, or a tensor is not on the
        CPU.
    TypeError
        when an array holds no integers or ``num_segments`` is not an integer.
    """

def simd_level() -> str:
    """The best instruction-set level the SIMD kernels dispatched to on this CPU.

    "avx512bf16" (AVX-512 with AVX512-BF16's ``VDPBF16PS``: the indexer's dot products of
    bfloat16-exact queries and bf16 / fp8 keys, and block selection's in a prefill, two dimensions
    per instruction, the same bits;
    offered only when the CPU's instruction matches kvselect's software model of it, and the
    default only where it does at least 1.3 times the products per second of the FMAs it
    replaces: AMD Zen 4, not an Intel Xeon, where it does half), "avx512" (block selection, the indexer and
    attention; the other kernels run AVX2), "avx2" or "scalar". ``KVSELECT_SIMD=avx512``,
    ``=avx2`` or ``=scalar`` in the environment caps it; ``KVSELECT_SIMD=avx512bf16`` takes the
    pair level wherever the CPU's instruction matches the model.

    Returns
    -------
    str
        "avx512bf16", "avx512", "avx2" or "scalar".
    """

def _fma_floor(iters: int) -> tuple[int, float]:
    """Benchmarks' floor (private): ``iters`` steps of a register-resident FMA
    loop on every pool thread at the best SIMD level; returns ``(flops,
    checksum)``, the caller times the call.
    """

def _pair_speedup() -> Optional[float]:
    """How many times FMA's products per second AVX512-BF16's `VDPBF16PS` does
    on this core (private; raced once per process), or None where the CPU
    has no pair level: the pair level is the default where this is at
    least 1.3.
    """

def _amx_screen() -> bool:
    """Whether the lightning indexer's AMX screen runs in this process
    (private): the CPU and OS run AMX-BF16's tile product as its model does,
    `KVSELECT_SIMD` names no level and `KVSELECT_AMX` is not ``0``. The
    screen changes no row and no score, only the time.
    """

def _exp_bound() -> tuple[float, float]:
    """The project's `exp` (private): `(rel_err, lo)`. For every float32 `x`
    in `[lo, 0]` the core's `exp(x)` (the same bits at every SIMD level) is
    within `rel_err · e^x` of the real exponential (the maximum over every
    such input, rounded up); below `lo` it is `+0`. Rules with a softmax
    treat candidates whose exact scores lie within this relative distance as
    tied; checks use it as the rigorous bound on each `exp`.
    """

def _dlpack_array(obj: Any, name: str = "array") -> tuple[npt.NDArray[Any], Optional[str]]:
    """`_dlpack_array(obj, name)`: the view [`view`] makes of a DLPack producer and
    the format its raw bits hold (`"bfloat16"`, `"float8_e4m3fn"`, or None
    when the dtype is NumPy's own) — for `kvselect.testing`, whose Python
    checks read arrays through NumPy. An ndarray is returned as itself.
    """

# DeepSeek-V4's attention sets, vLLM's combined index rows, GLM-5-Next's pools (src/compressed/)

def window_positions(
    query_pos: _ArrayIn,
    window_size: int,
    *,
    out: Optional[_ArrayOut[np.int32]] = None,
) -> npt.NDArray[np.int32]:
    """Each query's sliding window: DeepSeek-V4's raw-token part of the attention set.

    The positions ``[max(0, p - W + 1), p]`` (the query included) ascending, then -1, as
    transformers' sliding-window mask (``kv_idx > q_idx - sliding_window``) admits them.

    Parameters
    ----------
    query_pos : array_like of int, [n_queries], or int
        Each query's token position ``p``; one integer for one query.
    window_size : int
        ``W``, the window's tokens (128 in DeepSeek-V4's configs).
    out : ndarray of int32, optional
        Written and returned (the shape of the result): C-contiguous, writeable, aligned, native
        byte order, not overlapping any input (else refused, nothing written).

    Returns
    -------
    ndarray of int32, [n_queries, window_size]
        Each query's window, ascending, then -1.

    Raises
    ------
    SelectionError
        (a ValueError; ``.argument`` names the argument) on a negative position or count, or a row
        width past int32.
        Nothing is written.
    TypeError
        On an argument of the wrong type or dtype (a float position, say).
    """

def visible_entries(
    query_pos: _ArrayIn,
    compress_ratio: int,
    n_entries: int,
    *,
    out: Optional[_ArrayOut[np.int32]] = None,
) -> npt.NDArray[np.int32]:
    """Every compressed entry each query sees: an HCA query's attention set.

    The entries ``0 .. min((query_pos + 1) // compress_ratio, n_entries)`` ascending, then -1.
    An HCA query attends to all of them; a CSA query's entries are its :func:`indexer_topk` row
    with ``compress_ratio``.

    Parameters
    ----------
    query_pos : array_like of int, [n_queries], or int
        Each query's token position; one integer for one query.
    compress_ratio : int
        Tokens per entry, at least 1 (DeepSeek-V4's HCA: 128).
    n_entries : int
        The entries that exist (the row width).
    out : ndarray of int32, optional
        Written and returned (the shape of the result): C-contiguous, writeable, aligned, native
        byte order, not overlapping any input (else refused, nothing written).

    Returns
    -------
    ndarray of int32, [n_queries, n_entries]
        Each query's visible entries, ascending, then -1.

    Raises
    ------
    SelectionError
        (a ValueError; ``.argument`` names the argument) on a negative position or count,
        ``compress_ratio < 1``, or a
        row width past int32. Nothing is written.
    TypeError
        On an argument of the wrong type or dtype (a float position, say).
    """

def compressed_entry_tokens(
    entries: _ArrayIn,
    compress_ratio: int,
    *,
    overlap: bool,
    out: Optional[_ArrayOut[np.int32]] = None,
) -> npt.NDArray[np.int32]:
    """The tokens each compressed entry covers, ``[start, end)`` (end exclusive).

    With ``overlap=True`` DeepSeek-V4's CSA entry ``w`` is ``[max(0, m(w - 1)), m(w + 1))``
    (window ``w - 1``'s Ca half and window ``w``'s Cb half); with ``overlap=False`` an HCA
    entry (or a GLM-5-Next pool) is ``[m w, m(w + 1))``; a -1 entry is ``(-1, -1)``.

    Parameters
    ----------
    entries : array_like of int, any shape
        Entry ids, -1 for padding.
    compress_ratio : int
        ``m``, tokens per entry, at least 1.
    overlap : bool
        True for CSA's overlapping entries, False for HCA's (no default: say which).
    out : ndarray of int32, optional
        Written and returned (the shape of the result): C-contiguous, writeable, aligned, native
        byte order, not overlapping any input (else refused, nothing written).

    Returns
    -------
    ndarray of int32, entries.shape + (2,)
        Each entry's first token and one past its last.

    Raises
    ------
    SelectionError
        (a ValueError; ``.argument`` names the argument) on an entry below -1, ``compress_ratio <
        1``, or an end past
        int32. Nothing is written.
    TypeError
        On an argument of the wrong type or dtype (a float position, say).
    """

def expand_entries(
    entry_rows: _ArrayIn,
    query_pos: _ArrayIn,
    compress_ratio: int,
    *,
    tail: bool = False,
    width: Optional[int] = None,
    out: Optional[_ArrayOut[np.int32]] = None,
) -> npt.NDArray[np.int32]:
    """Selected compressed entries expanded to token rows (GLM-5-Next's pools).

    ``entry_rows`` (an :func:`indexer_topk` row with ``compress_ratio=m``: entry ids, then -1)
    becomes, at columns ``j*m .. (j+1)*m``, entry ``j``'s tokens ``m*w .. m*w + m - 1`` (a -1
    entry: ``m`` times -1). With ``tail=True`` the next ``m - 1`` columns hold the visible
    incomplete tail, ``(p + 1) % m`` tokens from ``(p + 1) - (p + 1) % m``, then -1; the row is
    padded with -1 to ``width``.

    Parameters
    ----------
    entry_rows : array_like of int32, [n_queries, k]
        Each query's selected entries, then -1.
    query_pos : array_like of int, [n_queries], or int
        Each query's token position; one integer for one query.
    compress_ratio : int
        ``m``, tokens per entry, at least 1 (GLM-5-Next: ``index_kpool``, 16).
    tail : bool, optional
        Append the visible incomplete tail (GLM-5-Next's ``index_kpool_always_select_tail``).
    width : int, optional
        The row width, at least ``k*m`` (plus ``m - 1`` with the tail), which is the default
        (GLM-5-Next: ``index_topk + kpool - 1``).
    out : ndarray of int32, optional
        Written and returned (the shape of the result): C-contiguous, writeable, aligned, native
        byte order, not overlapping any input (else refused, nothing written).

    Returns
    -------
    ndarray of int32, [n_queries, width]
        The token rows.

    Raises
    ------
    SelectionError
        (a ValueError; ``.argument`` names the argument) on an entry not yet visible to its query
        (``w >= (p + 1) // m``),
        a negative entry other than -1, a ``width`` too small for the expansion, or a width
        past int32. Nothing is written.
    TypeError
        On an argument of the wrong type or dtype (a float position, say).
    """

def combine_topk_swa_indices(
    topk_indices: _ArrayIn,
    query_start_loc: _ArrayIn,
    seq_lens: _ArrayIn,
    gather_lens: _ArrayIn,
    window_size: int,
    compress_ratio: int,
    topk: int,
    M: int,
    N: int,
    *,
    out: Optional[_ArrayOut[np.int32]] = None,
    lens_out: Optional[_ArrayOut[np.int32]] = None,
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]]:
    """vLLM's ``combine_topk_swa_indices`` (DeepSeek-V4 sparse prefill), exactly.

    From ``vllm/v1/attention/ops/deepseek_v4_ops/cache_utils.py``, same arguments in the same
    order. Token ``i`` of request ``b`` at ``pos = seq_len - query_len + (i -
    query_start_loc[b])`` gets ``topk_len = min((pos + 1) // compress_ratio, topk)`` top-k
    entries ``topk_indices[i, :topk_len] + M*b`` (copied as vLLM does: a -1 becomes ``M*b -
    1``), then its window of ``swa_len = min(pos + 1, window_size)`` tokens ascending at ``M*b +
    N + (pos - swa_len + 1 - gather_start) + j`` (``gather_start = seq_len - gather_len``), then
    -1.

    Parameters
    ----------
    topk_indices : array_like of int32, [num_tokens, >= topk]
        The indexer's rows over compressed entries.
    query_start_loc : array_like of int, [num_reqs + 1]
        Each request's first token, rising from 0 to ``num_tokens``.
    seq_lens, gather_lens : array_like of int, [num_reqs]
        Each request's tokens, and the tokens gathered into its workspace window.
    window_size, compress_ratio, topk : int
        ``W``, ``m`` and the top-k width.
    M, N : int
        The per-request workspace stride and the window's offset in it.
    out : ndarray of int32, [num_tokens, roundup(topk + window_size, 128)], optional
        Written and returned: C-contiguous, writeable, aligned, native byte order, not
        overlapping any input.
    lens_out : ndarray of int32, [num_tokens], optional
        The same rules.

    Returns
    -------
    tuple of ndarray
        ``(combined_indices, combined_lens)``: int32 ``[num_tokens, roundup(topk +
        window_size, 128)]`` and int32 ``[num_tokens]`` (``topk_len + swa_len``).

    Raises
    ------
    SelectionError
        (a ValueError; ``.argument`` names the argument) on ``query_start_loc`` not rising from 0 to
        ``num_tokens``, a
        query longer than its sequence, a ``gather_len`` longer than it or a window starting
        before the gathered tokens, a top-k entry ``>= N``, ``N + gather_len > M`` before the
        last request (its window would run into the next request's workspace), or
        ``topk_indices`` narrower than ``topk``. Nothing is written.
    TypeError
        On an argument of the wrong type or dtype (a float position, say).
    """

def quest_bounds(
    keys: _ArrayIn,
    page_size: int = 16,
    *,
    key_scale: Optional[_ArrayIn] = None,
    key_format: Optional[str] = None,
    cu_seqlens: Optional[_ArrayIn] = None,
    out: Optional[tuple[_ArrayOut[np.float32], _ArrayOut[np.float32]]] = None,
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """Every page's element-wise key bounds: Quest's page metadata.

    Page ``p`` of a sequence covers its tokens ``p * page_size .. min((p + 1) *
    page_size, len)``: ``kmin[p, h, i]`` and ``kmax[p, h, i]`` are the least and
    greatest ``keys[t, h, i]`` over them (exact: no arithmetic but ``k * scale``
    rounded to float32 for scaled keys; NaN keys ignored). A partly filled last
    page is bounded over its own keys only.

    Parameters
    ----------
    keys : array_like, [n_tokens, n_kv_heads, d]
        The keys: float32 (float64 converted once), float16, ml_dtypes bfloat16 /
        float8_e4m3fn, or a raw uint16 / uint8 view with ``key_format``. Any CPU
        DLPack tensor too.
    page_size : int, optional
        Tokens per page (default 16, Quest's).
    key_scale : array_like of float32, [n_tokens], optional
        Each token's scale (fp8 keys): a key's value is ``k * scale``.
    key_format : str, optional
        The format of a raw uint16 / uint8 ``keys``.
    cu_seqlens : array_like of int, [n_seqs + 1], optional
        A packed batch: sequence ``s`` is tokens ``cu_seqlens[s] .. cu_seqlens[s +
        1]``, its pages after the previous sequence's. None: one sequence.
    out : tuple of two ndarrays of float32, optional
        ``(kmin, kmax)`` to write and return (an engine's metadata cache):
        C-contiguous, writeable, aligned, not overlapping any input or each other.

    Returns
    -------
    kmin, kmax : ndarray of float32, [n_pages, n_kv_heads, d]
        ``n_pages`` is the sum of each sequence's ``ceil(len / page_size)``.

    Raises
    ------
    SelectionError
        (a ValueError; ``.argument`` names it) when ``keys`` is not 3-D or has a zero
        axis but the first (``keys``, ``n_kv_heads``, ``d``); ``page_size`` is 0;
        ``key_scale`` is not one per token; ``cu_seqlens`` does not rise from 0 to
        ``n_tokens``; a format name is unknown; ``out`` is refused (``out``).
    TypeError
        when ``keys`` is no key format or ``out`` not two float32 ndarrays.

    See Also
    --------
    quest_update : the O(n_kv_heads d) update of one decode step.
    quest_bounds_paged : the bounds of an engine's paged cache.

    Examples
    --------
    >>> import numpy as np, kvselect
    >>> keys = np.array([[[1.0, -2.0]], [[3.0, 0.5]], [[-1.0, 4.0]]], dtype=np.float32)
    >>> kmin, kmax = kvselect.quest_bounds(keys, page_size=2)
    >>> kmin[:, 0].tolist(), kmax[:, 0].tolist()
    ([[1.0, -2.0], [-1.0, 4.0]], [[3.0, 0.5], [-1.0, 4.0]])
    """

def quest_bounds_paged(
    kv_cache: _ArrayIn,
    block_table: _ArrayIn,
    seq_lens: _ArrayIn,
    n_kv_heads: int,
    *,
    page_layout: str = "dense",
    key_format: Optional[str] = None,
    out: Optional[tuple[_ArrayOut[np.float32], _ArrayOut[np.float32]]] = None,
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """The page bounds of the sequences in an engine's paged key cache.

    A cache page is a Quest page. Sequence ``s`` holds ``seq_lens[s]`` tokens through
    its ``block_table`` row; the bounds equal :func:`quest_bounds`' of the same keys laid
    out densely (fp8 keys times their scales), sequence after sequence.

    Parameters
    ----------
    kv_cache : array_like, [num_blocks, page_size, n_kv_heads * d]
        The pages read in place (an engine's ``[.., n_kv_heads, d]`` cache reshaped; any
        block stride), or uint8 pages of fp8 keys then one float32 scale per token
        (``[num_blocks, page_size, n_kv_heads * d + 4]``, ``page_layout='fp8_scaled'``).
    block_table : array_like of int32, [n_seqs, max_blocks]
        Logical page -> cache block, per sequence.
    seq_lens : array_like of int, [n_seqs]
        Tokens per sequence.
    n_kv_heads : int
        KV heads per token (``d`` is the row's elements over it).
    page_layout : {'dense', 'fp8_scaled'}, optional
        How a page holds its keys.
    key_format : str, optional
        The format of a raw uint16 / uint8 dense cache.
    out : tuple of two ndarrays of float32, optional
        ``(kmin, kmax)`` to write and return (an engine's metadata cache):
        C-contiguous, writeable, aligned, not overlapping any input or each other.

    Returns
    -------
    kmin, kmax : ndarray of float32, [n_pages, n_kv_heads, d]

    Raises
    ------
    SelectionError
        when the cache's layout, block table or lengths are refused (``kv_cache``,
        ``block_table``, ``seq_lens``), ``n_kv_heads`` does not divide a row, or ``out``
        is refused (``out``).
    TypeError
        when the cache's dtype is no key format or ``out`` not two float32 ndarrays.

    See Also
    --------
    quest_bounds : the same bounds from dense keys.

    Examples
    --------
    >>> import numpy as np, kvselect
    >>> cache = np.arange(2 * 2 * 4, dtype=np.float32).reshape(2, 2, 4)  # 2 pages of 2
    >>> kmin, kmax = kvselect.quest_bounds_paged(cache, np.array([[1, 0]], np.int32), [3], 2, )
    >>> kmin.shape, kmin[0, 1].tolist(), kmax[1, 0].tolist()
    ((2, 2, 2), [10.0, 11.0], [0.0, 1.0])
    """

def quest_update(
    kmin: _ArrayOut[np.float32],
    kmax: _ArrayOut[np.float32],
    key: _ArrayIn,
    pos: int,
    page_size: int = 16,
    *,
    key_scale: Optional[float] = None,
    key_format: Optional[str] = None,
) -> None:
    """One decode step's update of the page bounds, in place, in O(n_kv_heads d).

    Token ``pos``'s keys are folded into page ``pos // page_size``: the page's first
    token (``pos % page_size == 0``) sets its bounds (so nothing stale of an earlier
    sequence in the buffer survives), every later one folds in. Updating tokens 0, 1,
    ... in order gives :func:`quest_bounds`' bounds bit for bit.

    Parameters
    ----------
    kmin, kmax : ndarray of float32, [n_pages, n_kv_heads, d]
        The bounds, written in place: C-contiguous, writeable, not overlapping.
    key : array_like, [n_kv_heads, d]
        The new token's keys, formats as :func:`quest_bounds`.
    pos : int
        Its position in the sequence.
    page_size : int, optional
        Tokens per page (default 16).
    key_scale : float, optional
        Its scale (fp8 keys).
    key_format : str, optional
        The format of a raw uint16 / uint8 ``key``.

    Raises
    ------
    SelectionError
        when ``key`` is not ``[n_kv_heads, d]`` of the bounds (``key``), ``pos`` is in
        no page they hold (``pos``), or a buffer is refused (``kmin``, ``kmax``).
        Nothing is written then.

    See Also
    --------
    quest_bounds : the bounds built from every key.

    Examples
    --------
    >>> import numpy as np, kvselect
    >>> kmin, kmax = np.zeros((1, 1, 2), np.float32), np.zeros((1, 1, 2), np.float32)
    >>> for t, k in enumerate([[1.0, -2.0], [3.0, 0.5]]):
    ...     kvselect.quest_update(kmin, kmax, np.array([k], np.float32), t)
    >>> kmin.tolist(), kmax.tolist()
    ([[[1.0, -2.0]]], [[[3.0, 0.5]]])
    """

def quest_scores(
    q: _ArrayIn,
    kmin: _ArrayIn,
    kmax: _ArrayIn,
    *,
    variant: str = "kernel",
    query_format: Optional[str] = None,
    out: Optional[_ArrayOut[np.float32]] = None,
) -> npt.NDArray[np.float32]:
    """Every page's Quest score for a decoding query: the bound on ``q . k`` its keys allow.

    ``variant='kernel'`` (or ``'eval'``, which scores alike): per query head ``j``, page
    ``p`` scores ``sum_i max(q_ji * kmax[p, h, i], q_ji * kmin[p, h, i])`` against its KV
    head ``h = j // (n_q_heads // n_kv_heads)``. ``variant='sglang'``: each KV head's
    query heads averaged (rounded to ``q``'s dtype), the page scored against every KV
    head and the heads summed. float32, summed in kvselect's fixed order.

    Parameters
    ----------
    q : array_like, [n_q_heads, d]
        The decoding query: float32, float16, bfloat16 (formats as the keys').
    kmin, kmax : array_like of float32, [n_pages, n_kv_heads, d]
        The page bounds (:func:`quest_bounds`).
    variant : {'kernel', 'eval', 'sglang'}, optional
        Whose score (default ``'kernel'``).
    query_format : str, optional
        The format of a raw uint16 ``q``.
    out : ndarray of float32, [n_q_heads, n_pages] (``'sglang'``: [n_pages]), optional
        ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
        aligned, native byte order, not overlapping any input (else refused, nothing written).

    Returns
    -------
    ndarray of float32, [n_q_heads, n_pages] (``'sglang'``: [n_pages])

    Raises
    ------
    SelectionError
        when ``q``'s heads are not a multiple of the KV heads or its ``d`` is not the
        bounds' (``q``), the bounds differ in shape (``kmax``), or ``out`` is refused
        (its shape, layout, read-only, or overlapping an input).
    TypeError
        when ``out`` is not a float32 ndarray.

    See Also
    --------
    quest_select : the page sets these scores rank.

    Examples
    --------
    >>> import numpy as np, kvselect
    >>> kmin = np.array([[[0.0, -1.0]], [[-2.0, 1.0]]], np.float32)
    >>> kmax = np.array([[[1.0, 2.0]], [[3.0, 1.0]]], np.float32)
    >>> kvselect.quest_scores(np.array([[1.0, -1.0]], np.float32), kmin, kmax).tolist()
    [[2.0, 2.0]]
    """

def quest_select(
    q: _ArrayIn,
    kmin: _ArrayIn,
    kmax: _ArrayIn,
    seq_lens: Union[int, _ArrayIn],
    page_budget: int,
    page_size: int = 16,
    *,
    variant: str = "kernel",
    num_recent_pages: int = 4,
    query_format: Optional[str] = None,
    out: Optional[_ArrayOut[np.int32]] = None,
) -> npt.NDArray[np.int32]:
    """The pages each decoding query reads: Quest's page set.

    ``variant='kernel'`` (Quest's kernels): every page when a sequence's
    ``ceil(len / page_size)`` pages fit ``page_budget``; else its last page, forced, and the
    ``page_budget - 1`` best of the others, per query head. ``'eval'`` (Quest's evaluation
    script): the best ``min(max(3, min(len, page_budget * page_size) // page_size), n_pages)``
    pages, none forced. ``'sglang'``: one set per sequence, the newest
    ``num_recent_pages`` pages forced and the best ``max(page_budget - num_recent_pages, 1)``
    of the pages before them (every page when there are none). Ties go to the lower
    page id; each row ascending, then -1.

    Parameters
    ----------
    q : array_like, [n_q_heads, d] or [n_seqs, n_q_heads, d]
        Each sequence's decoding query (2-D with an integer ``seq_lens``).
    kmin, kmax : array_like of float32, [n_pages, n_kv_heads, d]
        The sequences' page bounds, sequence after sequence (:func:`quest_bounds`).
    seq_lens : int or array_like of int, [n_seqs]
        Tokens per sequence (the query's own included), each >= 1.
    page_budget : int
        Pages per query, forced ones counted, >= 1.
    page_size : int, optional
        Tokens per page (default 16).
    variant : {'kernel', 'eval', 'sglang'}, optional
        Whose page set (default ``'kernel'``).
    num_recent_pages : int, optional
        SGLang's forced newest pages (default 4).
    query_format : str, optional
        The format of a raw uint16 ``q``.
    out : ndarray of int32, [rows, width] (or [n_seqs, rows, width]), optional
        ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
        aligned, native byte order, not overlapping any input (else refused, nothing written).

    Returns
    -------
    ndarray of int32, [rows, width] (or [n_seqs, rows, width])
        ``rows`` is ``n_q_heads`` (1 for ``'sglang'``), ``width`` the most pages the
        variant selects: ``page_budget`` (``'eval'``: ``max(page_budget, 3)``; ``'sglang'``:
        ``max(page_budget - r, 1) + r``).

    Raises
    ------
    SelectionError
        when ``page_budget`` is 0 (``page_budget``), a sequence is empty (``seq_lens``), the bounds
        are not the sequences' pages (``kmin``), ``q`` does not fit them (``q``), or ``out``
        is refused (its shape, layout, read-only, or overlapping an input).
    TypeError
        when ``out`` is not an int32 ndarray.

    See Also
    --------
    quest_scores : the scores ranked.

    Examples
    --------
    >>> import numpy as np, kvselect
    >>> keys = np.array([5, 1, 4, -9, 3], np.float32).reshape(5, 1, 1)
    >>> kmin, kmax = kvselect.quest_bounds(keys, page_size=1)
    >>> kvselect.quest_select(np.ones((1, 1), np.float32), kmin, kmax, 5, 3, page_size=1)
    array([[0, 2, 4]], dtype=int32)
    """

def moba_gates(
    q: _ArrayIn,
    k: _ArrayIn,
    block_size: int,
    *,
    key_scale: Optional[_ArrayIn] = None,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    out: Optional[_ArrayOut[np.float32]] = None,
) -> npt.NDArray[np.float32]:
    """The gate of every past block of each query: MoBA's ``q · mean(K of the block)``.

    One sequence: query ``i`` of ``n_queries`` sits at position ``n_keys - n_queries + i``,
    its current block is ``pos // block_size``, and each block ``b`` before it (all
    complete) is gated by the query head against its KV head's block mean (``n_q_heads /
    n_kv_heads`` query heads a KV head). The mean is the float32 sum in token order times
    ``float32(1 / block_size)``; the gate the 8-lane fused dot product of docs/moba.md,
    the same bits at every SIMD level.

    Parameters
    ----------
    q : array_like, [n_queries, n_q_heads, d]
        The queries (float32, float16, ml_dtypes bfloat16, or raw with ``query_format``).
    k : array_like, [n_keys, n_kv_heads, d]
        The keys: float32, float16, ml_dtypes bfloat16 / float8_e4m3fn, or a raw uint16 /
        uint8 view with ``key_format``; read in place.
    block_size : int
        Tokens per block (MoBA's ``moba_chunk_size``), >= 1.
    key_scale : array_like of float32, [n_keys], optional
        Each key's scale (fp8 keys): its value is ``k * scale`` rounded to float32.
    key_format, query_format : str, optional
        The formats of raw ``k`` and ``q``.
    out : ndarray of float32, [n_queries, n_q_heads, n_blocks], optional
        ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
        aligned, native byte order, not overlapping any input (else refused, nothing written).

    Returns
    -------
    ndarray of float32, [n_queries, n_q_heads, n_blocks]
        ``n_blocks = ceil(n_keys / block_size)``; NaN at the current and future blocks
        (never gated).

    Raises
    ------
    SelectionError
        when ``q`` or ``k`` is not 3-D, their ``d`` differ, the query heads are not a
        multiple of the KV heads or the queries outnumber the keys (``q``, ``k``),
        ``block_size`` is 0 (``block_size``) or ``key_scale`` is not one per key.
        Also when ``out`` is refused (its shape, layout, read-only, or overlapping an input).
    TypeError
        when ``out`` is not a float32 ndarray.

    See Also
    --------
    moba_select : the blocks these gates choose.

    Examples
    --------
    >>> import numpy as np, kvselect
    >>> k = np.array([0, 2, 4, 6, -3, -1], np.float32).reshape(6, 1, 1)
    >>> kvselect.moba_gates(np.ones((1, 1, 1), np.float32), k, 2)[0, 0].tolist()
    [1.0, 5.0, nan]
    """

def moba_select(
    q: _ArrayIn,
    k: _ArrayIn,
    topk: int,
    block_size: int,
    *,
    key_scale: Optional[_ArrayIn] = None,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    cu_seqlens: Optional[_ArrayIn] = None,
    cu_seqlens_q: Optional[_ArrayIn] = None,
    variant: str = "efficient",
    out: Optional[_ArrayOut[np.int32]] = None,
) -> npt.NDArray[np.int32]:
    """The blocks each query reads: MoBA's block selection.

    ``variant='efficient'`` (``moba/moba_efficient.py``, the rule): each query reads its
    current block (``pos // block_size``, forced, attended causally) and the ``topk - 1``
    past blocks with the greatest gate (:func:`moba_gates`), all of them when there are
    fewer; at ``topk = 1`` every block up to its own (MoBA's fallback to full causal
    attention). ``'naive'`` (``moba/moba_naive.py``): the same for ``topk >= 2``, its
    own block alone at ``topk = 1``. Only completed past blocks are gated; ties go to the
    lower block id. A packed batch (``cu_seqlens``) numbers each sequence's blocks from 0.

    Parameters
    ----------
    q : array_like, [n_queries, n_q_heads, d]
        The queries, formats as :func:`moba_gates`.
    k : array_like, [n_keys, n_kv_heads, d]
        The keys, read in place.
    topk : int
        Blocks per query, the forced current block counted (MoBA's ``moba_topk``), >= 1.
    block_size : int
        Tokens per block (``moba_chunk_size``), >= 1.
    key_scale : array_like of float32, [n_keys], optional
        Each key's scale (fp8 keys).
    key_format, query_format : str, optional
        The formats of raw ``k`` and ``q``.
    cu_seqlens : array_like of int, [n_seqs + 1], optional
        A packed batch: sequence ``s`` is keys ``cu_seqlens[s] .. cu_seqlens[s + 1]``.
        None: one sequence.
    cu_seqlens_q : array_like of int, [n_seqs + 1], optional
        Its queries, the last positions of its keys (default ``cu_seqlens``; without
        ``cu_seqlens``, the queries are the last ``n_queries`` of the keys).
    variant : {'efficient', 'naive'}, optional
        Whose selection (default ``'efficient'``).
    out : ndarray of int32, [n_queries, n_q_heads, width], optional
        ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
        aligned, native byte order, not overlapping any input (else refused, nothing written).

    Returns
    -------
    ndarray of int32, [n_queries, n_q_heads, width]
        Each row's block ids ascending, then -1. ``width`` is ``topk``, or, for
        ``'efficient'`` at ``topk = 1``, the most blocks a query of the batch sees.

    Raises
    ------
    SelectionError
        when ``topk`` or ``block_size`` is 0 (named), ``q`` does not fit ``k`` (``q``, ``k``),
        ``key_scale`` is not one per key, ``cu_seqlens`` does not rise from 0 to
        ``n_keys`` (``cu_seqlens``), ``cu_seqlens_q`` does not rise from 0 to
        ``n_queries`` or gives a sequence more queries than keys (``cu_seqlens_q``).
        Also when ``out`` is refused (its shape, layout, read-only, or overlapping an input).
    TypeError
        when ``out`` is not an int32 ndarray.

    See Also
    --------
    moba_gates : the gates ranked.
    moba_select_paged : the same selection at decode over a paged cache.

    Examples
    --------
    >>> import numpy as np, kvselect
    >>> k = np.array([0, 2, 4, 6, -3, -1, 3, 3], np.float32).reshape(8, 1, 1)
    >>> kvselect.moba_select(np.ones((1, 1, 1), np.float32), k, 2, 2)
    array([[[1, 3]]], dtype=int32)
    """

def moba_select_paged(
    q: _ArrayIn,
    kv_cache: _ArrayIn,
    block_table: _ArrayIn,
    seq_lens: _ArrayIn,
    n_kv_heads: int,
    topk: int,
    block_size: int,
    *,
    page_layout: str = "dense",
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    variant: str = "efficient",
    out: Optional[_ArrayOut[np.int32]] = None,
) -> npt.NDArray[np.int32]:
    """MoBA's block selection at decode, over an engine's paged key cache.

    Sequence ``s`` decodes one query at position ``seq_lens[s] - 1``; its keys are its
    first ``seq_lens[s]`` tokens through its ``block_table`` row (the cache's pages need
    not be MoBA's blocks). Equal, row for row, to :func:`moba_select` on the same keys
    laid out densely (fp8 keys times their scales).

    Parameters
    ----------
    q : array_like, [n_seqs, n_q_heads, d]
        Each sequence's decoding query.
    kv_cache : array_like, [num_blocks, page_size, n_kv_heads * d]
        The pages read in place (any block stride), or uint8 pages of fp8 keys then one
        float32 scale per token (``[num_blocks, page_size, n_kv_heads * d + 4]``,
        ``page_layout='fp8_scaled'``).
    block_table : array_like of int32, [n_seqs, max_blocks]
        Logical page -> cache block, per sequence.
    seq_lens : array_like of int, [n_seqs]
        Tokens per sequence (the query's own included), each >= 1.
    n_kv_heads : int
        KV heads per token.
    topk : int
        Blocks per query, the forced current block counted, >= 1.
    block_size : int
        MoBA's block, in tokens.
    page_layout : {'dense', 'fp8_scaled'}, optional
        How a page holds its keys.
    key_format, query_format : str, optional
        The formats of a raw cache and ``q``.
    variant : {'efficient', 'naive'}, optional
        Whose selection (default ``'efficient'``).
    out : ndarray of int32, [n_seqs, n_q_heads, width], optional
        ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
        aligned, native byte order, not overlapping any input (else refused, nothing written).

    Returns
    -------
    ndarray of int32, [n_seqs, n_q_heads, width]
        As :func:`moba_select`.

    Raises
    ------
    SelectionError
        when the cache, table or lengths are refused (``kv_cache``, ``block_table``,
        ``seq_lens``), ``n_kv_heads`` does not divide a row, ``q`` does not fit, or
        ``topk`` / ``block_size`` is 0.
        Also when ``out`` is refused (its shape, layout, read-only, or overlapping an input).
    TypeError
        when ``out`` is not an int32 ndarray.

    See Also
    --------
    moba_select : the dense and packed forms.

    Examples
    --------
    >>> import numpy as np, kvselect
    >>> cache = np.array([0, 2, 4, 6, -3, -1, 3, 3], np.float32).reshape(4, 2, 1)[::-1]
    >>> table = np.array([[3, 2, 1, 0]], np.int32)
    >>> kvselect.moba_select_paged(np.ones((1, 1, 1), np.float32), cache, table, [8], 1, 2, 2)
    array([[[1, 3]]], dtype=int32)
    """

def vslash_select(
    q: _ArrayIn,
    keys: _ArrayIn,
    vertical_size: int,
    slash_size: int,
    *,
    variant: str = "kernel",
    key_scale: Optional[_ArrayIn] = None,
    key_format: Optional[str] = None,
    out: Optional[tuple[_ArrayOut[np.int32], _ArrayOut[np.int32]]] = None,
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]]:
    """MInference's vertical-slash selection: the key columns and diagonals a prefill's
    queries read, from the last queries' attention.

    For each query head: the causal softmax of the last ``n = min(64, L)`` queries'
    scores ``q . k / sqrt(d)``; the column sums ("vertical") and the sums along each
    diagonal at offset ``o = query - key >= 0`` ("slash"); the first 30 columns and the
    100 nearest diagonals forced; the top ``min(L, max(vertical_size, 30))`` columns and
    ``min(L, max(slash_size, 50))`` diagonals, ties to the lower index (with fewer than
    100 diagonals taken, the nearest forced ones). microsoft/MInference
    ``vertical_and_slash_kernel``; see docs/vertical-slash.md.

    Parameters
    ----------
    q : array_like of float32, [n_heads, min(64, L), d]
        Each head's last queries (query ``i`` at position ``L - n + i``).
    keys : array_like, [L, n_kv_heads, d]
        The sequence's keys, read in place: float32, float16, ml_dtypes bfloat16 /
        float8_e4m3fn, or a raw uint16 / uint8 view with ``key_format``. Head ``h`` reads
        KV head ``h // (n_heads // n_kv_heads)``.
    vertical_size, slash_size : int
        ``v`` and ``s``: columns and diagonals asked for (at least 30 and 50 are taken).
    variant : {'kernel', 'search'}, optional
        ``'search'``: ``search_pattern_v2``'s copy (unscaled scores, 30 diagonals forced).
    key_scale : array_like of float32, [L], optional
        A per-key scale (fp8 keys): a key's value is ``k * scale`` rounded to float32.
    key_format : str, optional
        The format of a raw uint16 / uint8 ``keys``.
    out : tuple of two ndarrays of int32, optional
        ``(vertical, slash)`` to write and return: C-contiguous, writeable, aligned, not
        overlapping any input or each other (else refused, nothing written).

    Returns
    -------
    vertical : ndarray of int32, [n_heads, nv]
        The columns, ascending.
    slash : ndarray of int32, [n_heads, ns]
        The diagonal offsets ``query - key``, ascending (0 is the main diagonal).

    Raises
    ------
    SelectionError
        (a ValueError; ``.argument`` names it) when ``keys`` is not 3-D or has a zero
        axis (``keys``, ``seq_len``, ``n_kv_heads``, ``d``), ``q`` is not the last
        queries of that ``d`` or not finite (``q``), the heads do not divide
        (``n_kv_heads``), ``key_scale`` is not one per key, a score is not finite
        (``keys``), or an option is unknown.
        Also when ``out`` is refused (its shapes, layout, read-only, or overlapping).
    TypeError
        when ``out`` is not a tuple of two int32 ndarrays.

    See Also
    --------
    vslash_scores : the sums the selection ranks.
    vslash_rows : each query's positions.
    vslash_layout : the engines' per-block layout.

    Examples
    --------
    >>> import numpy as np, kvselect
    >>> rng = np.random.default_rng(0)
    >>> keys = rng.standard_normal((200, 1, 16)).astype(np.float32)
    >>> q = rng.standard_normal((2, 64, 16)).astype(np.float32)
    >>> vertical, slash = kvselect.vslash_select(q, keys, 40, 60)
    >>> vertical.shape, slash.shape, vertical[0, :30].tolist() == list(range(30))
    ((2, 40), (2, 100), True)
    """

def vslash_scores(
    q: _ArrayIn,
    keys: _ArrayIn,
    *,
    variant: str = "kernel",
    key_scale: Optional[_ArrayIn] = None,
    key_format: Optional[str] = None,
    out: Optional[tuple[_ArrayOut[np.float32], _ArrayOut[np.float32]]] = None,
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """The sums :func:`vslash_select` ranks: each column's and each diagonal's share of
    the last queries' attention, before anything is forced.

    Parameters
    ----------
    q, keys, variant, key_scale, key_format
        As :func:`vslash_select`.
    out : tuple of two ndarrays of float32, optional
        ``(vertical, slash)`` to write and return: C-contiguous, writeable, aligned, not
        overlapping any input or each other (else refused, nothing written).

    Returns
    -------
    vertical : ndarray of float32, [n_heads, L]
        Column ``c``'s sum of probabilities over the last queries.
    slash : ndarray of float32, [n_heads, L]
        Entry ``o``: the sum along the diagonal ``query - key = o``.

    Raises
    ------
    SelectionError
        As :func:`vslash_select`.
        Also when ``out`` is refused (its shapes, layout, read-only, or overlapping).
    TypeError
        when ``out`` is not a tuple of two float32 ndarrays.

    See Also
    --------
    vslash_select : the columns and diagonals these rank.

    Examples
    --------
    >>> import numpy as np, kvselect
    >>> keys = np.zeros((3, 1, 4), np.float32)  # equal scores: uniform rows
    >>> vertical, slash = kvselect.vslash_scores(np.ones((1, 3, 4), np.float32), keys)
    >>> np.round(vertical[0], 4).tolist(), np.round(slash[0], 4).tolist()
    ([1.8333, 0.8333, 0.3333], [1.8333, 0.8333, 0.3333])
    """

def vslash_rows(
    vertical: _ArrayIn,
    slash: _ArrayIn,
    seq_len: int,
    positions: _ArrayIn,
    *,
    out: Optional[_ArrayOut[np.int32]] = None,
) -> npt.NDArray[np.int32]:
    """Each query's positions under a vertical-slash selection: the selected columns up to
    it and the keys ``p - o`` of the selected diagonals.

    Parameters
    ----------
    vertical : array_like of int32, [n_heads, nv]
        Columns (any order, repeats allowed).
    slash : array_like of int32, [n_heads, ns]
        Diagonal offsets ``query - key``.
    seq_len : int
        ``L``: every id and position lies in ``[0, L)``.
    positions : array_like of int, [n_positions]
        The query positions to give rows for.
    out : ndarray of int32, [n_heads, n_positions, nv + ns], optional
        ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
        aligned, native byte order, not overlapping any input (else refused, nothing written).

    Returns
    -------
    ndarray of int32, [n_heads, n_positions, nv + ns]
        Ascending, distinct, ``-1`` padded.

    Raises
    ------
    SelectionError
        when a set is not 2-D of ``n_heads`` non-empty rows or holds an id outside
        ``[0, L)`` (``vertical``, ``slash``), or a position is outside it
        (``positions``).
        Also when ``out`` is refused (its shape, layout, read-only, or overlapping an input).
    TypeError
        when ``out`` is not an int32 ndarray.

    See Also
    --------
    vslash_select : the sets.
    vslash_layout : the same selection as the engines' kernels read it.

    Examples
    --------
    >>> import numpy as np, kvselect
    >>> kvselect.vslash_rows(np.array([[0, 4]]), np.array([[0, 3]]), 10, [3, 9]).tolist()
    [[[0, 3, -1, -1], [0, 4, 6, 9]]]
    """

def vslash_layout(
    vertical: _ArrayIn,
    slash: _ArrayIn,
    seq_len: int,
    *,
    out: Optional[tuple[_ArrayOut[np.int32], _ArrayOut[np.int32], _ArrayOut[np.int32], _ArrayOut[np.int32]]] = None,
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], npt.NDArray[np.int32], npt.NDArray[np.int32]]:
    """The engines' layout of a vertical-slash selection: per block of 64 queries, the
    64-key blocks its diagonals cover and the columns outside them, as MInference's
    ``convert_vertical_slash_indexes`` writes them for the sparse kernel.

    Parameters
    ----------
    vertical : array_like of int32, [n_heads, nv]
        Columns (any order: sorted here, as the engines sort them).
    slash : array_like of int32, [n_heads, ns]
        Diagonal offsets; each head needs one below 64 (the source reads past its list
        otherwise).
    seq_len : int
        ``L``; there are ``ceil(L / 64)`` query blocks.
    out : tuple of four ndarrays of int32, optional
        ``(block_count, block_offset, column_count, column_index)`` to write and
        return: C-contiguous, writeable, aligned, not overlapping any input or each
        other (else refused, nothing written).

    Returns
    -------
    block_count : ndarray of int32, [n_heads, n_blocks]
    block_offset : ndarray of int32, [n_heads, n_blocks, ns]
        The first key of each 64-key block read, ascending; unused slots 0.
    column_count : ndarray of int32, [n_heads, n_blocks]
    column_index : ndarray of int32, [n_heads, n_blocks, nv]
        The columns read outside those blocks; unused slots 0.

    Raises
    ------
    SelectionError
        As :func:`vslash_rows`, and when a head has no offset below 64 (``slash``).
        Also when ``out`` is refused (its shapes, layout, read-only, or overlapping).
    TypeError
        when ``out`` is not a tuple of four int32 ndarrays.

    See Also
    --------
    vslash_rows : the positions each query reads.
    vslash_layout_batch : the later form vLLM and SGLang carry.

    Examples
    --------
    >>> import numpy as np, kvselect
    >>> bc, bo, cc, ci = kvselect.vslash_layout(np.array([[3, 40, 150]]), np.array([[0, 1, 130]]), 256)
    >>> bc.tolist(), bo[0, 3].tolist(), cc.tolist(), ci[0, 3].tolist()
    ([[1, 2, 3, 3]], [62, 191, 255], [[0, 2, 0, 3]], [3, 40, 150])
    """

def vslash_layout_batch(
    vertical: _ArrayIn,
    slash: _ArrayIn,
    q_seqlens: _ArrayIn,
    kv_seqlens: _ArrayIn,
    *,
    context_size: Optional[int] = None,
    causal: bool = True,
    out: Optional[tuple[_ArrayOut[np.int32], _ArrayOut[np.int32], _ArrayOut[np.int32], _ArrayOut[np.int32]]] = None,
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], npt.NDArray[np.int32], npt.NDArray[np.int32]]:
    """The later form of the engines' layout, as vLLM's ``_custom_ops`` and SGLang's
    ``sgl_kernel`` write it: a batch of sequences, each with its own query and key
    lengths, the queries aligned to the end of the keys (``causal``) or after them,
    the ranges clipped to the keys.

    The same kernel in both engines (``convert_vertical_slash_indexes``, 64-query and
    64-key blocks, as their callers pass). For query block ``[start, end)`` of
    sequence ``b``, with ``base = kv_seqlens[b] - q_seqlens[b]`` (``causal``) or
    ``kv_seqlens[b]`` (not): offsets ``o >= base + end`` skipped, each other one
    covering the keys ``[base + end - o - 64, base + end - o)`` (its end at least 64),
    merged as :func:`vslash_layout` merges them; not causal, the offsets below
    ``start`` end the list. The ranges' blocks are clipped to the keys; a block with
    no offset reaching it reads one 64-key range past its queries. See
    docs/vertical-slash.md, "The engines' layout".

    Parameters
    ----------
    vertical : array_like of int32, [n_seqs, n_heads, nv]
        Columns, each in ``[0, kv_seqlen)`` of its sequence (any order: sorted here, as
        vLLM's caller sorts them).
    slash : array_like of int32, [n_seqs, n_heads, ns]
        Diagonal offsets ``>= 0`` (any order: sorted here, descending); offsets past
        the keys are taken as the source takes them.
    q_seqlens, kv_seqlens : array_like of int, [n_seqs]
        Each sequence's queries (``>= 0``) and keys (``>= 1``).
    context_size : int, optional
        The outputs have ``ceil(context_size / 64)`` query blocks a head; at least
        each sequence's; default ``max(q_seqlens)``.
    causal : bool, default True
        Queries aligned to the end of the keys, masked causally (vLLM's "intra"
        stage); ``False``: every query after the keys ("succ", "inter").
    out : tuple of four ndarrays of int32, optional
        ``(block_count, block_offset, column_count, column_index)`` to write and
        return: C-contiguous, writeable, aligned, not overlapping any input or each
        other (else refused, nothing written).

    Returns
    -------
    block_count : ndarray of int32, [n_seqs, n_heads, n_rows]
    block_offset : ndarray of int32, [n_seqs, n_heads, n_rows, ns]
        The first key of each 64-key block read; unused slots 0.
    column_count : ndarray of int32, [n_seqs, n_heads, n_rows]
    column_index : ndarray of int32, [n_seqs, n_heads, n_rows, nv]
        The columns read outside those blocks; unused slots 0. Query blocks at or
        past a sequence's ``q_seqlen`` are all 0 (the source does not write them).

    Raises
    ------
    SelectionError
        when a set is not 3-D with every axis at least 1 or the two disagree on
        ``[n_seqs, n_heads]`` (``vertical``, ``slash``), a length is not one per
        sequence or is out of range (``q_seqlens``, ``kv_seqlens``), ``context_size``
        holds fewer query blocks than a sequence (``context_size``), a column is
        outside its sequence's keys (``vertical``) or an offset negative (``slash``).
        Also when ``out`` is refused (its shapes, layout, read-only, or overlapping).
    TypeError
        when ``out`` is not a tuple of four int32 ndarrays.

    See Also
    --------
    vslash_layout : MInference's own form (one sequence, causal).

    Examples
    --------
    >>> import numpy as np, kvselect
    >>> v, s = np.array([[[5, 150, 290]]]), np.array([[[0, 10, 120]]])
    >>> bc, bo, cc, ci = kvselect.vslash_layout_batch(v, s, [100], [300])
    >>> bc.tolist(), bo[0, 0, 0].tolist(), cc.tolist(), ci[0, 0, 0].tolist()
    ([[[3, 2]]], [80, 190, 254], [[[2, 1]]], [5, 150, 0])
    """

def infllm_block_scores(
    q: _ArrayIn,
    ck: _ArrayIn,
    seq_len: Union[int, _ArrayIn],
    *,
    init_blocks: int = 1,
    local_blocks: int = 32,
    pooling: str = "cuda",
    scale: Optional[float] = None,
    ck_scale: Optional[_ArrayIn] = None,
    query_format: Optional[str] = None,
    key_format: Optional[str] = None,
    block_size: int = 64,
    kernel_size: int = 32,
    kernel_stride: int = 16,
    cu_seqlens_q: Optional[_ArrayIn] = None,
    cu_seqlens_k: Optional[_ArrayIn] = None,
    out: Optional[_ArrayOut[np.float32]] = None,
) -> npt.NDArray[np.float32]:
    """Every block's score under InfLLM-v2's stage 1 and pooling, for the queries
    at the end of one sequence or of each sequence of a packed batch.

    Query ``i`` sits at position ``seq_len - n_q + i``. Each query head's softmax
    over the compressed keys it sees (those whose 32 tokens end at or before its
    position), of ``scale * q . ck``; the probabilities summed over each KV head's
    query group; block ``b`` (64 tokens) the maximum over compressed keys ``4b - 1
    .. 4b + 3``. The variant's forced blocks score ``+inf``, its excluded ones
    ``-inf`` (``pooling``; docs/infllm.md). Float32 with the project's ``exp``, the
    same bits at every SIMD level.

    Parameters
    ----------
    q : array_like, [n_q, n_q_heads, d]
        The queries, the sequence's last ``n_q`` tokens: float32 (float64 converted
        once), float16, ml_dtypes bfloat16 / float8_e4m3fn, or a raw view with
        ``query_format``.
    ck : array_like, [n_c, n_kv_heads, d]
        The sequence's compressed keys (``n_c = (seq_len - 32) // 16 + 1``, 0 below
        32 tokens): key ``j`` the mean of the keys at tokens ``16 j .. 16 j + 31``
        (``kvselect.reference.infllm.compress_keys``). Any key format, read in place.
    seq_len : int, or array_like of int [n_seqs] with ``cu_seqlens_q``
        Tokens in the sequence (the queries' own included); packed: each sequence's.
    init_blocks, local_blocks : int, optional
        Blocks forced at the start and up to the query's own (MiniCPM4's 1 and 32).
    block_size, kernel_size, kernel_stride : int, optional
        The geometry (MiniCPM4's 64, 32, 16; the source takes them as parameters):
        compressed keys of ``kernel_size`` tokens every ``kernel_stride``, blocks of
        ``block_size`` (a multiple of ``kernel_stride``), pooled over ``s b - 1 .. s b +
        s - 1`` with ``s = block_size // kernel_stride``.
    pooling : {"cuda", "triton"}, optional
        ``"cuda"`` (the CUDA kernel, default): init and ``local_blocks + 1`` blocks
        up to the current one ``+inf``; ``"triton"`` (the older Triton kernel): the
        ``local_blocks`` blocks up to the current one ``-inf``, then init ``+inf``,
        taps past the keys read as 0.
    scale : float, optional
        The logits' scale, finite; ``1 / sqrt(d)`` by default (the source's).
    ck_scale : array_like of float32, [n_c], optional
        Each compressed key's scale (fp8 keys): its value is ``ck * scale``.
    query_format, key_format : str, optional
        The formats of raw uint16 / uint8 ``q`` and ``ck``.
    cu_seqlens_q, cu_seqlens_k : array_like of int, [n_seqs + 1], optional
        A packed batch, as the source's varlen calls take it (``infllmv2_attn_stage1``,
        ``max_pooling_1d_varlen``): sequence ``s`` is queries ``cu_seqlens_q[s] ..
        cu_seqlens_q[s + 1]`` of ``q`` (the last of its ``seq_len[s]`` tokens; the
        source's ``cache_lens[s]`` is ``seq_len[s]`` minus them) and compressed keys
        ``cu_seqlens_k[s] .. cu_seqlens_k[s + 1]`` of ``ck`` (its tokens' compressed keys).
        Each row equals the dense call's on its own sequence. Both or neither.
    out : ndarray of float32, optional
        ``out=`` reuses a buffer of the shape returned (below, packed or not): written in
        place and returned. C-contiguous, writeable, aligned, native byte order, not
        overlapping any input (else refused, nothing written).

    Returns
    -------
    ndarray of float32, [n_q, n_kv_heads, ceil(seq_len / 64)]
        Packed: ``[total_q, n_kv_heads, max_blocks]``, NaN past a sequence's own blocks.

    Raises
    ------
    SelectionError
        (a ValueError; ``.argument`` names it) when ``q`` or ``ck`` is not 3-D, their
        ``d`` differ, ``q``'s heads are not a multiple of ``ck``'s, there are more
        queries than tokens (``q``); ``ck`` is not ``seq_len``'s compressed keys
        (``ck``); ``ck_scale`` not one per key; ``seq_len`` is 0; ``scale`` is not
        finite; a geometry size is 0 or ``block_size`` not whole strides
        (``block_size``, ``kernel_size``, ``kernel_stride``); an option names nothing
        (``pooling``); packed: one of ``cu_seqlens_q`` / ``cu_seqlens_k`` alone (the
        missing one), ``cu_seqlens_k`` not rising from 0 to ``ck``'s keys or giving a
        sequence other than its tokens' compressed keys (``cu_seqlens_k``), ``seq_len``
        not one positive length per sequence (``seq_len``), ``cu_seqlens_q`` not rising
        from 0 to the queries or giving a sequence more queries than tokens
        (``cu_seqlens_q``).
        Also when ``out`` is refused (its shape, layout, read-only, or overlapping an input).
    TypeError
        when ``out`` is not a float32 ndarray.

    See Also
    --------
    infllm_select : the blocks each query reads.
    infllm_block_scores_paged : the same scores at decode over a paged cache.

    Examples
    --------
    >>> import numpy as np, kvselect
    >>> q = np.ones((1, 2, 4), dtype=np.float32)
    >>> ck = np.zeros((7, 1, 4), dtype=np.float32); ck[1] = 1.0
    >>> s = kvselect.infllm_block_scores(q, ck, 128, init_blocks=0, local_blocks=0)
    >>> s.shape, round(float(s[0, 0, 0]), 4), float(s[0, 0, 1])
    ((1, 1, 2), 1.1037, inf)
    """

def infllm_select(
    q: _ArrayIn,
    ck: _ArrayIn,
    seq_len: Union[int, _ArrayIn],
    topk: int = 64,
    *,
    init_blocks: int = 1,
    local_blocks: int = 32,
    pooling: str = "cuda",
    keep: str = "through_current",
    scale: Optional[float] = None,
    ck_scale: Optional[_ArrayIn] = None,
    query_format: Optional[str] = None,
    key_format: Optional[str] = None,
    block_size: int = 64,
    kernel_size: int = 32,
    kernel_stride: int = 16,
    cu_seqlens_q: Optional[_ArrayIn] = None,
    cu_seqlens_k: Optional[_ArrayIn] = None,
    out: Optional[_ArrayOut[np.int32]] = None,
) -> npt.NDArray[np.int32]:
    """The blocks each query reads under InfLLM-v2: the top-k of
    :func:`infllm_block_scores`, filtered as the modelling code filters.

    The top ``min(topk, n_blocks)`` blocks of each query's row for each KV head,
    ranked by score descending, ties to the lower block id (where more blocks are
    forced than ``topk`` holds, the lower ids); then the ids past the query's own
    block dropped (``keep="through_current"``, MiniCPM4.1's ``> q_idx``) or from it
    on (``keep="before_current"``, an earlier copy's ``>= q_idx``); ascending,
    ``-1`` padded.

    Parameters
    ----------
    q, ck, seq_len
        As :func:`infllm_block_scores` (packed: per sequence, with ``cu_seqlens_q``).
    topk : int, optional
        Blocks per row before the filter (MiniCPM4's 64), at least 1.
    init_blocks, local_blocks, pooling, scale, ck_scale, query_format, key_format
        As :func:`infllm_block_scores`.
    block_size, kernel_size, kernel_stride
        As :func:`infllm_block_scores`.
    keep : {"through_current", "before_current"}, optional
        Which ids the filter keeps (default ``"through_current"``).
    cu_seqlens_q, cu_seqlens_k : array_like of int, [n_seqs + 1], optional
        A packed batch, as :func:`infllm_block_scores`; each row equals the dense call's
        on its own sequence (that sequence's block ids, from 0).
    out : ndarray of int32, [n_q, n_kv_heads, topk], optional
        ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
        aligned, native byte order, not overlapping any input (else refused, nothing written).

    Returns
    -------
    ndarray of int32, [n_q, n_kv_heads, topk]
        Block ids ascending, then ``-1`` (packed: ``[total_q, n_kv_heads, topk]``).

    Raises
    ------
    SelectionError
        As :func:`infllm_block_scores`, and when ``topk`` is 0 (``topk``) or
        ``keep`` names nothing (``keep``).
        Also when ``out`` is refused (its shape, layout, read-only, or overlapping an input).
    TypeError
        when ``out`` is not an int32 ndarray.

    See Also
    --------
    infllm_block_scores : the scores the rows rank.
    infllm_select_paged : the same rows at decode over a paged cache.

    Examples
    --------
    >>> import numpy as np, kvselect
    >>> rng = np.random.default_rng(0)
    >>> q = rng.standard_normal((1, 4, 8)).astype(np.float32)
    >>> ck = rng.standard_normal((63, 2, 8)).astype(np.float32)
    >>> rows = kvselect.infllm_select(q, ck, 1024, topk=4, local_blocks=2)
    >>> rows.shape, rows[0, 0, -3:].tolist()
    ((1, 2, 4), [13, 14, 15])
    """

def infllm_block_scores_paged(
    q: _ArrayIn,
    kv_cache: _ArrayIn,
    block_table: _ArrayIn,
    seq_lens: _ArrayIn,
    n_kv_heads: int,
    *,
    init_blocks: int = 1,
    local_blocks: int = 32,
    pooling: str = "cuda",
    scale: Optional[float] = None,
    page_layout: str = "dense",
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    block_size: int = 64,
    kernel_size: int = 32,
    kernel_stride: int = 16,
    out: Optional[_ArrayOut[np.float32]] = None,
) -> npt.NDArray[np.float32]:
    """:func:`infllm_block_scores` at decode, over an engine's paged cache of compressed
    keys.

    Sequence ``s`` decodes one query at position ``seq_lens[s] - 1``; its
    ``(seq_lens[s] - 32) // 16 + 1`` compressed keys (0 below 32 tokens) are read in
    place through its ``block_table`` row (compressed key ``j`` in row ``j % page_size``
    of page ``block_table[s, j // page_size]``), a row every KV head's key. Row ``s``
    equals :func:`infllm_block_scores` bit for bit on the same compressed keys laid out
    densely (fp8 keys times their scales, as its ``ck_scale``), then NaN past the
    sequence's own blocks (as its packed form pads).

    Parameters
    ----------
    q : array_like, [n_seqs, n_q_heads, d]
        Each sequence's decoding query.
    kv_cache : array_like, [num_blocks, page_size, n_kv_heads * d]
        The compressed keys' pages, read in place (any block stride; float32 and
        bfloat16 pages without a copy), or uint8 pages of fp8 keys then one float32
        scale per key (``page_layout='fp8_scaled'``).
    block_table : array_like of int32, [n_seqs, max_blocks]
        Logical page -> cache block, per sequence (entries past a sequence's compressed
        keys are never read).
    seq_lens : array_like of int, [n_seqs]
        Tokens per sequence (the query's own included), each >= 1.
    n_kv_heads : int
        KV heads per compressed key.
    init_blocks, local_blocks, pooling, scale
        As :func:`infllm_block_scores`.
    block_size, kernel_size, kernel_stride
        As :func:`infllm_block_scores`.
    page_layout : {'dense', 'fp8_scaled'}, optional
        How a page holds its keys (as :func:`infllm_select_paged`).
    key_format, query_format : str, optional
        The formats of a raw cache and ``q``.
    out : ndarray of float32, [n_seqs, n_kv_heads, max_blocks], optional
        ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
        aligned, native byte order, not overlapping any input (else refused, nothing written).

    Returns
    -------
    ndarray of float32, [n_seqs, n_kv_heads, max_blocks]
        ``max_blocks = ceil(max(seq_lens) / block_size)``; NaN past a sequence's own
        blocks.

    Raises
    ------
    SelectionError
        (a ValueError; ``.argument`` names it) when the cache, table or lengths are
        refused (``kv_cache``, ``block_table``, ``seq_lens``: a row too short for its
        sequence's compressed keys, an entry read outside the cache, a sequence of no
        token), ``n_kv_heads`` does not divide a row, ``q`` is not ``[n_seqs, n_q_heads,
        d]`` or its heads are not a multiple of the KV heads (``q``), and as
        :func:`infllm_block_scores` (``scale``, ``block_size``, ``kernel_size``,
        ``kernel_stride``, ``pooling``).
        Also when ``out`` is refused (its shape, layout, read-only, or overlapping an input).
    TypeError
        when ``out`` is not a float32 ndarray.

    See Also
    --------
    infllm_select_paged : the blocks each decoding query reads.
    infllm_block_scores : the dense and packed forms.

    Examples
    --------
    >>> import numpy as np, kvselect
    >>> rng = np.random.default_rng(0)
    >>> ck = rng.standard_normal((63, 2, 8)).astype(np.float32)  # 1024 tokens' keys
    >>> q = rng.standard_normal((1, 4, 8)).astype(np.float32)
    >>> cache = ck.reshape(7, 9, 16)[::-1]  # pages of 9 keys, stored in reverse
    >>> table = np.arange(6, -1, -1, dtype=np.int32)[None]
    >>> s = kvselect.infllm_block_scores_paged(q, cache, table, [1024], 2, local_blocks=2)
    >>> np.array_equal(s, kvselect.infllm_block_scores(q, ck, 1024, local_blocks=2))
    True
    """
    ...

def infllm_select_paged(
    q: _ArrayIn,
    kv_cache: _ArrayIn,
    block_table: _ArrayIn,
    seq_lens: _ArrayIn,
    n_kv_heads: int,
    topk: int = 64,
    *,
    init_blocks: int = 1,
    local_blocks: int = 32,
    pooling: str = "cuda",
    keep: str = "through_current",
    scale: Optional[float] = None,
    page_layout: str = "dense",
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    block_size: int = 64,
    kernel_size: int = 32,
    kernel_stride: int = 16,
    out: Optional[_ArrayOut[np.int32]] = None,
) -> npt.NDArray[np.int32]:
    """InfLLM-v2's block selection at decode, over an engine's paged cache of compressed
    keys.

    Sequence ``s`` decodes one query at position ``seq_lens[s] - 1``; its
    ``(seq_lens[s] - 32) // 16 + 1`` compressed keys are read in place through its
    ``block_table`` row (compressed key ``j`` in row ``j % page_size`` of page
    ``block_table[s, j // page_size]``), as OpenBMB's SGLang backend for MiniCPM4 /
    SALA keeps them (a pool of compressed keys and a per-request table). Equal, row for
    row, to :func:`infllm_select` on the same compressed keys laid out densely (fp8 keys
    times their scales).

    Parameters
    ----------
    q : array_like, [n_seqs, n_q_heads, d]
        Each sequence's decoding query.
    kv_cache : array_like, [num_blocks, page_size, n_kv_heads * d]
        The compressed keys' pages, read in place (any block stride), or uint8 pages of
        fp8 keys then one float32 scale per key (``page_layout='fp8_scaled'``).
    block_table : array_like of int32, [n_seqs, max_blocks]
        Logical page -> cache block, per sequence.
    seq_lens : array_like of int, [n_seqs]
        Tokens per sequence (the query's own included), each >= 1.
    n_kv_heads : int
        KV heads per compressed key.
    topk : int, optional
        Blocks per row before the filter (MiniCPM4's 64), at least 1.
    init_blocks, local_blocks, pooling, keep, scale
        As :func:`infllm_select`.
    block_size, kernel_size, kernel_stride
        As :func:`infllm_select`.
    page_layout : {'dense', 'fp8_scaled'}, optional
        How a page holds its keys.
    key_format, query_format : str, optional
        The formats of a raw cache and ``q``.
    out : ndarray of int32, [n_seqs, n_kv_heads, topk], optional
        ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
        aligned, native byte order, not overlapping any input (else refused, nothing written).

    Returns
    -------
    ndarray of int32, [n_seqs, n_kv_heads, topk]
        As :func:`infllm_select`.

    Raises
    ------
    SelectionError
        when the cache, table or lengths are refused (``kv_cache``, ``block_table``,
        ``seq_lens``: a row too short for its sequence's compressed keys, an entry read
        outside the cache, a sequence of no token), ``n_kv_heads`` does not divide a row,
        ``q`` does not fit, and as :func:`infllm_select`.
        Also when ``out`` is refused (its shape, layout, read-only, or overlapping an input).
    TypeError
        when ``out`` is not an int32 ndarray.

    See Also
    --------
    infllm_select : the dense and packed forms.
    infllm_block_scores_paged : the block scores these rows rank.

    Examples
    --------
    >>> import numpy as np, kvselect
    >>> rng = np.random.default_rng(0)
    >>> ck = rng.standard_normal((63, 2, 8)).astype(np.float32)  # 1024 tokens' keys
    >>> q = rng.standard_normal((1, 4, 8)).astype(np.float32)
    >>> cache = ck.reshape(7, 9, 16)[::-1]  # pages of 9 keys, stored in reverse
    >>> table = np.arange(6, -1, -1, dtype=np.int32)[None]
    >>> rows = kvselect.infllm_select_paged(q, cache, table, [1024], 2, 4, local_blocks=2)
    >>> np.array_equal(rows, kvselect.infllm_select(q, ck, 1024, 4, local_blocks=2))
    True
    """

def nsa_block_scores(
    q: _ArrayIn,
    k: _ArrayIn,
    *,
    block_size: int = 64,
    init_blocks: int = 1,
    local_blocks: int = 2,
    scale: Optional[float] = None,
    k_scale: Optional[_ArrayIn] = None,
    query_format: Optional[str] = None,
    key_format: Optional[str] = None,
    cu_seqlens: Optional[_ArrayIn] = None,
    cu_seqlens_q: Optional[_ArrayIn] = None,
    window: str = "fla",
    kernel_size: int = 32,
    kernel_stride: int = 16,
    out: Optional[_ArrayOut[np.float32]] = None,
) -> npt.NDArray[np.float32]:
    """Every block's score under NSA's selection as fla computes it, for the
    queries at the end of one sequence or of each sequence of a packed batch.

    Query ``i`` sits at position ``p = seq_len - n_q + i`` (fla's ``TK - TQ``
    offset), in block ``IC = p // block_size``. The compressed keys are the
    means of the complete blocks of ``k``; each query head's softmax over the
    ``(p + 1) // block_size`` blocks it has seen whole, of ``scale * q . ck``;
    the probabilities summed over each KV head's query group. Blocks before
    ``IC`` score that sum; forced blocks (``b < init_blocks`` and the
    ``local_blocks`` blocks up to ``IC``; fla's block 0, ``IC - 1``, ``IC``)
    ``+inf``; the rest ``-inf``. Float32 with the project's ``exp`` (InfLLM-v2's
    stage 1), the same bits at every SIMD level (docs/nsa.md).

    Parameters
    ----------
    q : array_like, [n_q, n_q_heads, d]
        The queries, the sequence's last ``n_q`` tokens: float32 (float64 converted
        once), float16, ml_dtypes bfloat16 / float8_e4m3fn, or a raw view with
        ``query_format``.
    k : array_like, [seq_len, n_kv_heads, d]
        The sequence's keys, any key format, read in place.
    block_size : int, optional
        Tokens a block (fla's 64).
    init_blocks, local_blocks : int, optional
        Blocks forced at the start and up to the query's own (fla's 1 and 2).
    scale : float, optional
        The logits' scale, finite; ``1 / sqrt(d)`` by default (fla's).
    k_scale : array_like of float32, [seq_len], optional
        Each token's key scale (fp8 keys): its value is ``k * scale``.
    query_format, key_format : str, optional
        The formats of raw uint16 / uint8 ``q`` and ``k``.
    cu_seqlens : array_like of int, [n_seqs + 1], optional
        A packed batch, as fla's varlen call takes it (``parallel_nsa(...,
        cu_seqlens)``): sequence ``s`` is keys ``cu_seqlens[s] .. cu_seqlens[s + 1]``.
        Each row equals the dense call's on its own sequence.
    cu_seqlens_q : array_like of int, [n_seqs + 1], optional
        Its queries, the last of its keys (fla's ``(cu_seqlens_q, cu_seqlens_k)``;
        default ``cu_seqlens``; alone, one sequence of all the keys).
    window : {'fla', 'eq9'}, optional
        ``'fla'`` (default): one compressed key per block, its mean; block ``c`` scores its
        group sum. ``'eq9'`` (the NSA paper's Eq. 9, a named variant): compressed keys of
        ``kernel_size`` tokens every ``kernel_stride``, block ``j`` scoring ``sum_{m <
        block_size / kernel_stride} sum_{n < kernel_size / kernel_stride} S[(block_size /
        kernel_stride) j - m - n]``: at the paper's 32 / 16 / 64 the keys ``4j - 4 .. 4j``,
        weighted 1, 2, 2, 2, 1 (docs/nsa.md). Dense calls only.
    kernel_size, kernel_stride : int, optional
        Eq. 9's compression (the paper's 32 and 16); ignored by ``'fla'``.
    out : ndarray of float32, optional
        ``out=`` reuses a buffer of the shape returned (below, packed or not): written in
        place and returned. C-contiguous, writeable, aligned, native byte order, not
        overlapping any input (else refused, nothing written).

    Returns
    -------
    ndarray of float32, [n_q, n_kv_heads, ceil(seq_len / block_size)]
        Packed: ``[total_q, n_kv_heads, max_blocks]``, NaN past a sequence's own blocks.

    Raises
    ------
    SelectionError
        (a ValueError; ``.argument`` names it) when ``q`` or ``k`` is not 3-D, their
        ``d`` differ, ``k`` is empty (``k``); ``q``'s heads are not a multiple of
        ``k``'s or there are more queries than tokens (``q``); ``k_scale`` is not one
        per token; ``scale`` is not finite; ``block_size`` is 0; ``cu_seqlens`` does
        not rise from 0 to the keys (``cu_seqlens``); ``cu_seqlens_q`` does not rise from
        0 to the queries or gives a sequence more queries than keys (``cu_seqlens_q``);
        ``window`` names nothing or is ``'eq9'`` with ``cu_seqlens`` (``window``); Eq. 9's
        stride does not divide ``block_size`` or ``kernel_size`` (``kernel_stride``,
        ``kernel_size``).
        Also when ``out`` is refused (its shape, layout, read-only, or overlapping an input).
    TypeError
        when ``out`` is not a float32 ndarray.

    See Also
    --------
    nsa_select : the blocks each query reads.

    Examples
    --------
    >>> import numpy as np, kvselect
    >>> q = np.ones((1, 2, 4), dtype=np.float32)
    >>> k = np.zeros((20, 1, 4), dtype=np.float32); k[8:12] = 1.0
    >>> s = kvselect.nsa_block_scores(q, k, block_size=4)
    >>> s[0, 0].round(4).tolist()
    [inf, 0.1756, 1.2976, inf, inf]
    """

def nsa_select(
    q: _ArrayIn,
    k: _ArrayIn,
    block_counts: int = 16,
    *,
    block_size: int = 64,
    init_blocks: int = 1,
    local_blocks: int = 2,
    scale: Optional[float] = None,
    k_scale: Optional[_ArrayIn] = None,
    query_format: Optional[str] = None,
    key_format: Optional[str] = None,
    cu_seqlens: Optional[_ArrayIn] = None,
    cu_seqlens_q: Optional[_ArrayIn] = None,
    window: str = "fla",
    kernel_size: int = 32,
    kernel_stride: int = 16,
    out: Optional[_ArrayOut[np.int32]] = None,
) -> npt.NDArray[np.int32]:
    """The blocks each query reads under NSA's selection as fla computes it: the
    top ``block_counts`` of :func:`nsa_block_scores`.

    The candidates are the blocks up to the query's own; ranked by score
    descending, ties to the lower block id (with ``block_counts < 3`` the forced
    blocks tie and the lower ids stay), decided in exact arithmetic: a block
    whose float32 probability underflows still fills a slot, where fla's top-k
    can leave it to its ``-1`` padding. Ascending, ``-1`` padded.

    Parameters
    ----------
    q, k
        As :func:`nsa_block_scores`.
    block_counts : int, optional
        Blocks a row (fla's 16), at least 1.
    block_size, init_blocks, local_blocks, scale, k_scale, query_format, key_format
        As :func:`nsa_block_scores`.
    cu_seqlens, cu_seqlens_q : array_like of int, [n_seqs + 1], optional
        A packed batch, as :func:`nsa_block_scores` (each sequence's block ids from 0).
    window, kernel_size, kernel_stride : optional
        The block scores' window, as :func:`nsa_block_scores` (fla's, or the paper's
        Eq. 9).
    out : ndarray of int32, [n_q, n_kv_heads, block_counts], optional
        ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
        aligned, native byte order, not overlapping any input (else refused, nothing written).

    Returns
    -------
    ndarray of int32, [n_q, n_kv_heads, block_counts]
        Block ids ascending, then ``-1``.

    Raises
    ------
    SelectionError
        As :func:`nsa_block_scores`, and when ``block_counts`` is 0
        (``block_counts``).
        Also when ``out`` is refused (its shape, layout, read-only, or overlapping an input).
    TypeError
        when ``out`` is not an int32 ndarray.

    See Also
    --------
    nsa_block_scores : the scores the rows rank.

    Examples
    --------
    >>> import numpy as np, kvselect
    >>> q = np.ones((1, 2, 4), dtype=np.float32)
    >>> k = np.zeros((20, 1, 4), dtype=np.float32); k[8:12] = 1.0
    >>> kvselect.nsa_select(q, k, 4, block_size=4)[0, 0].tolist()
    [0, 2, 3, 4]
    """

def nsa_compress_keys(
    k: _ArrayIn,
    *,
    block_size: int = 64,
    k_scale: Optional[_ArrayIn] = None,
    key_format: Optional[str] = None,
    window: str = "fla",
    kernel_size: int = 32,
    kernel_stride: int = 16,
    out: Optional[_ArrayOut[np.float32]] = None,
) -> npt.NDArray[np.float32]:
    """The compressed keys NSA's selection reads, as kvselect computes them:
    what a serving engine caches and extends as blocks complete, and hands to
    :func:`nsa_select_compressed` at decode.

    ``window='fla'`` (default): key ``c`` the mean of the keys of block ``c``
    (tokens ``c * block_size ..``), the complete blocks only (``seq_len //
    block_size`` keys; fla's ``mean_pooling`` also averages the trailing
    incomplete block, which no query reads). ``window='eq9'``: key ``c`` the mean
    of tokens ``c * kernel_stride .. c * kernel_stride + kernel_size``. Float32:
    each element the sum of its tokens in token order, then one division (each
    key times its token's ``k_scale`` first, rounded); the bits
    :func:`nsa_select` computes from the same keys.

    Parameters
    ----------
    k : array_like, [seq_len, n_kv_heads, d]
        The sequence's keys, any key format, read in place.
    block_size : int, optional
        Tokens a block (fla's 64).
    k_scale : array_like of float32, [seq_len], optional
        Each token's key scale (fp8 keys): its value is ``k * scale``.
    key_format : str, optional
        The format of raw uint16 / uint8 ``k``.
    window, kernel_size, kernel_stride : optional
        As :func:`nsa_block_scores`.
    out : ndarray of float32, [n_c, n_kv_heads, d], optional
        ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
        aligned, native byte order, not overlapping any input (else refused, nothing written).

    Returns
    -------
    ndarray of float32, [n_c, n_kv_heads, d]
        ``n_c = seq_len // block_size`` (fla's window) or ``(seq_len - kernel_size) //
        kernel_stride + 1`` (0 below ``kernel_size`` tokens; Eq. 9's).

    Raises
    ------
    SelectionError
        (a ValueError; ``.argument`` names it) when ``k`` is not 3-D or is empty
        (``k``); ``k_scale`` is not one per token; ``block_size`` is 0; ``window``
        names nothing (``window``); Eq. 9's stride does not divide ``block_size`` or
        ``kernel_size`` (``kernel_stride``, ``kernel_size``).
        Also when ``out`` is refused (its shape, layout, read-only, or overlapping an input).
    TypeError
        when ``out`` is not a float32 ndarray.

    See Also
    --------
    nsa_select_compressed : the rows from these keys.

    Examples
    --------
    >>> import numpy as np, kvselect
    >>> k = np.arange(10, dtype=np.float32).reshape(10, 1, 1)
    >>> kvselect.nsa_compress_keys(k, block_size=4)[:, 0, 0].tolist()
    [1.5, 5.5]
    """

def nsa_block_scores_compressed(
    q: _ArrayIn,
    ck: _ArrayIn,
    seq_len: Union[int, _ArrayIn],
    *,
    block_size: int = 64,
    init_blocks: int = 1,
    local_blocks: int = 2,
    scale: Optional[float] = None,
    ck_scale: Optional[_ArrayIn] = None,
    query_format: Optional[str] = None,
    key_format: Optional[str] = None,
    window: str = "fla",
    kernel_size: int = 32,
    kernel_stride: int = 16,
    cu_seqlens_q: Optional[_ArrayIn] = None,
    cu_seqlens_k: Optional[_ArrayIn] = None,
    out: Optional[_ArrayOut[np.float32]] = None,
) -> npt.NDArray[np.float32]:
    """:func:`nsa_block_scores` on given compressed keys, as a serving engine keeps
    them: the decode path of an engine that caches the mean-pooled keys and
    extends the cache as blocks complete (fla's NSA decode reads such a cache).

    ``ck`` holds exactly the compressed keys of ``seq_len`` tokens
    (:func:`nsa_compress_keys`' layout and count); the queries are the sequence's
    last ``n_q`` tokens, as in :func:`nsa_block_scores`. The result equals
    :func:`nsa_block_scores` bit for bit on any keys whose compressed keys have
    ``ck``'s values: from the compressed keys on, the two run the same code.

    Parameters
    ----------
    q : array_like, [n_q, n_q_heads, d]
        The queries, as :func:`nsa_block_scores`.
    ck : array_like, [n_c, n_kv_heads, d]
        The compressed keys: ``n_c = seq_len // block_size`` (fla's window; the
        complete blocks' means) or Eq. 9's ``(seq_len - kernel_size) // kernel_stride
        + 1`` (0 below ``kernel_size`` tokens). Any key format, read in place
        (float32 without a copy).
    seq_len : int, or array_like of int [n_seqs] with ``cu_seqlens_q``
        Tokens in the sequence, the queries' own included (a query's block and the
        blocks it has seen whole depend on it, not on ``n_c`` alone); packed: each
        sequence's.
    block_size, init_blocks, local_blocks, scale, window, kernel_size, kernel_stride
        As :func:`nsa_block_scores`.
    ck_scale : array_like of float32, [n_c], optional
        Each compressed key's scale (fp8 keys): its value is ``ck * scale``, rounded
        to float32.
    query_format, key_format : str, optional
        The formats of raw uint16 / uint8 ``q`` and ``ck``.
    cu_seqlens_q, cu_seqlens_k : array_like of int, [n_seqs + 1], optional
        A packed batch, as :func:`infllm_block_scores` takes one: sequence ``s`` is
        queries ``cu_seqlens_q[s] .. cu_seqlens_q[s + 1]`` of ``q`` (the last of its
        ``seq_len[s]`` tokens; ``seq_len`` then one length per sequence) and compressed
        keys ``cu_seqlens_k[s] .. cu_seqlens_k[s + 1]`` of ``ck`` (exactly its tokens'
        compressed keys). Each row equals the dense call's on its own sequence. Both or
        neither.
    out : ndarray of float32, optional
        ``out=`` reuses a buffer of the shape returned (below, packed or not): written in
        place and returned. C-contiguous, writeable, aligned, native byte order, not
        overlapping any input (else refused, nothing written).

    Returns
    -------
    ndarray of float32, [n_q, n_kv_heads, ceil(seq_len / block_size)]
        Packed: ``[total_q, n_kv_heads, max_blocks]``, NaN past a sequence's own blocks.

    Raises
    ------
    SelectionError
        (a ValueError; ``.argument`` names it) when ``q`` or ``ck`` is not 3-D or
        their ``d`` differ (``q``, ``ck``); ``ck`` does not hold ``seq_len``'s
        compressed keys (``ck``); ``ck_scale`` is not one per compressed key;
        ``seq_len`` is 0; ``q``'s heads are not a multiple of ``ck``'s or there are
        more queries than tokens (``q``); ``scale`` is not finite; ``block_size`` is
        0; ``window`` names nothing (``window``); Eq. 9's stride does not divide
        ``block_size`` or ``kernel_size`` (``kernel_stride``, ``kernel_size``); packed:
        one of ``cu_seqlens_q`` / ``cu_seqlens_k`` alone (the missing one),
        ``cu_seqlens_k`` not rising from 0 to ``ck``'s keys or giving a sequence other
        than its tokens' compressed keys (``cu_seqlens_k``), ``seq_len`` not one positive
        length per sequence (``seq_len``), ``cu_seqlens_q`` not rising from 0 to the
        queries or giving a sequence more queries than tokens (``cu_seqlens_q``).
        Also when ``out`` is refused (its shape, layout, read-only, or overlapping an input).
    TypeError
        when ``out`` is not a float32 ndarray.

    See Also
    --------
    nsa_select_compressed : the blocks each query reads.
    nsa_compress_keys : the compressed keys.

    Examples
    --------
    >>> import numpy as np, kvselect
    >>> q = np.ones((1, 2, 4), dtype=np.float32)
    >>> k = np.zeros((20, 1, 4), dtype=np.float32); k[8:12] = 1.0
    >>> ck = kvselect.nsa_compress_keys(k, block_size=4)
    >>> s = kvselect.nsa_block_scores_compressed(q, ck, 20, block_size=4)
    >>> np.array_equal(s, kvselect.nsa_block_scores(q, k, block_size=4))
    True
    """

def nsa_select_compressed(
    q: _ArrayIn,
    ck: _ArrayIn,
    seq_len: Union[int, _ArrayIn],
    block_counts: int = 16,
    *,
    block_size: int = 64,
    init_blocks: int = 1,
    local_blocks: int = 2,
    scale: Optional[float] = None,
    ck_scale: Optional[_ArrayIn] = None,
    query_format: Optional[str] = None,
    key_format: Optional[str] = None,
    window: str = "fla",
    kernel_size: int = 32,
    kernel_stride: int = 16,
    cu_seqlens_q: Optional[_ArrayIn] = None,
    cu_seqlens_k: Optional[_ArrayIn] = None,
    out: Optional[_ArrayOut[np.int32]] = None,
) -> npt.NDArray[np.int32]:
    """:func:`nsa_select` on given compressed keys (see
    :func:`nsa_block_scores_compressed`): the rows an engine's decode reads,
    equal to :func:`nsa_select`'s on any keys whose compressed keys have
    ``ck``'s values.

    Parameters
    ----------
    q, ck, seq_len
        As :func:`nsa_block_scores_compressed`.
    block_counts : int, optional
        Blocks a row (fla's 16), at least 1.
    block_size, init_blocks, local_blocks, scale, ck_scale, query_format, key_format
        As :func:`nsa_block_scores_compressed`.
    window, kernel_size, kernel_stride : optional
        As :func:`nsa_block_scores`.
    cu_seqlens_q, cu_seqlens_k : array_like of int, [n_seqs + 1], optional
        A packed batch, as :func:`nsa_block_scores_compressed`; each row equals the dense
        call's on its own sequence (that sequence's block ids, from 0).
    out : ndarray of int32, [n_q, n_kv_heads, block_counts], optional
        ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
        aligned, native byte order, not overlapping any input (else refused, nothing written).

    Returns
    -------
    ndarray of int32, [n_q, n_kv_heads, block_counts]
        Block ids ascending, then ``-1`` (packed: ``[total_q, n_kv_heads,
        block_counts]``).

    Raises
    ------
    SelectionError
        As :func:`nsa_block_scores_compressed`, and when ``block_counts`` is 0
        (``block_counts``).
        Also when ``out`` is refused (its shape, layout, read-only, or overlapping an input).
    TypeError
        when ``out`` is not an int32 ndarray.

    See Also
    --------
    nsa_select : the same rows from the keys.
    nsa_compress_keys : the compressed keys.
    nsa_select_paged : the same rows at decode over a paged cache.

    Examples
    --------
    >>> import numpy as np, kvselect
    >>> q = np.ones((1, 2, 4), dtype=np.float32)
    >>> ck = np.zeros((5, 1, 4), dtype=np.float32); ck[2] = 1.0
    >>> kvselect.nsa_select_compressed(q, ck, 20, 4, block_size=4)[0, 0].tolist()
    [0, 2, 3, 4]
    """

def nsa_block_scores_paged(
    q: _ArrayIn,
    kv_cache: _ArrayIn,
    block_table: _ArrayIn,
    seq_lens: _ArrayIn,
    n_kv_heads: int,
    *,
    block_size: int = 64,
    init_blocks: int = 1,
    local_blocks: int = 2,
    scale: Optional[float] = None,
    page_layout: str = "dense",
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    window: str = "fla",
    kernel_size: int = 32,
    kernel_stride: int = 16,
    out: Optional[_ArrayOut[np.float32]] = None,
) -> npt.NDArray[np.float32]:
    """:func:`nsa_block_scores_compressed` at decode, over an engine's paged cache of
    compressed keys.

    Sequence ``s`` decodes one query at position ``seq_lens[s] - 1``; its compressed
    keys (``seq_lens[s] // block_size`` with ``window='fla'``, Eq. 9's ``(seq_lens[s] -
    kernel_size) // kernel_stride + 1`` with ``window='eq9'``, 0 below ``kernel_size``
    tokens) are read in place through its ``block_table`` row: compressed key ``j`` in
    row ``j % page_size`` of page ``block_table[s, j // page_size]``, a row every KV
    head's key. Row ``s`` equals :func:`nsa_block_scores_compressed` bit for bit on the
    same compressed keys laid out densely (fp8 keys times their scales, as its
    ``ck_scale``), then NaN past the sequence's own blocks.

    Parameters
    ----------
    q : array_like, [n_seqs, n_q_heads, d]
        Each sequence's decoding query.
    kv_cache : array_like, [num_blocks, page_size, n_kv_heads * d]
        The compressed keys' pages, read in place (any block stride; float32 and
        bfloat16 pages without a copy), or uint8 pages of fp8 keys then one float32
        scale per key (``page_layout='fp8_scaled'``).
    block_table : array_like of int32, [n_seqs, max_blocks]
        Logical page -> cache block, per sequence (entries past a sequence's compressed
        keys are never read).
    seq_lens : array_like of int, [n_seqs]
        Tokens per sequence (the query's own included), each >= 1.
    n_kv_heads : int
        KV heads per compressed key.
    block_size, init_blocks, local_blocks, scale
        As :func:`nsa_block_scores`.
    page_layout : {'dense', 'fp8_scaled'}, optional
        How a page holds its keys (as :func:`infllm_select_paged`).
    key_format, query_format : str, optional
        The formats of a raw cache and ``q``.
    window, kernel_size, kernel_stride : optional
        As :func:`nsa_block_scores`.
    out : ndarray of float32, [n_seqs, n_kv_heads, max_blocks], optional
        ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
        aligned, native byte order, not overlapping any input (else refused, nothing written).

    Returns
    -------
    ndarray of float32, [n_seqs, n_kv_heads, max_blocks]
        ``max_blocks = ceil(max(seq_lens) / block_size)``; NaN past a sequence's own
        blocks.

    Raises
    ------
    SelectionError
        (a ValueError; ``.argument`` names it) when the cache, table or lengths are
        refused (``kv_cache``, ``block_table``, ``seq_lens``: a row too short for its
        sequence's compressed keys, an entry read outside the cache, a sequence of no
        token), ``n_kv_heads`` does not divide a row, ``q`` is not ``[n_seqs, n_q_heads,
        d]`` or its heads are not a multiple of the KV heads (``q``), and as
        :func:`nsa_block_scores_compressed` (``scale``, ``block_size``, ``window``,
        ``kernel_size``, ``kernel_stride``).
        Also when ``out`` is refused (its shape, layout, read-only, or overlapping an input).
    TypeError
        when ``out`` is not a float32 ndarray.

    See Also
    --------
    nsa_select_paged : the blocks each decoding query reads.
    nsa_block_scores_compressed : the dense form.

    Examples
    --------
    >>> import numpy as np, kvselect
    >>> rng = np.random.default_rng(0)
    >>> ck = rng.standard_normal((12, 2, 8)).astype(np.float32)  # 800 tokens' keys
    >>> q = rng.standard_normal((1, 4, 8)).astype(np.float32)
    >>> cache = ck.reshape(3, 4, 16)[::-1]  # pages of 4 keys, stored in reverse
    >>> table = np.array([[2, 1, 0]], dtype=np.int32)
    >>> s = kvselect.nsa_block_scores_paged(q, cache, table, [800], 2)
    >>> np.array_equal(s, kvselect.nsa_block_scores_compressed(q, ck, 800))
    True
    """

def nsa_select_paged(
    q: _ArrayIn,
    kv_cache: _ArrayIn,
    block_table: _ArrayIn,
    seq_lens: _ArrayIn,
    n_kv_heads: int,
    block_counts: int = 16,
    *,
    block_size: int = 64,
    init_blocks: int = 1,
    local_blocks: int = 2,
    scale: Optional[float] = None,
    page_layout: str = "dense",
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    window: str = "fla",
    kernel_size: int = 32,
    kernel_stride: int = 16,
    out: Optional[_ArrayOut[np.int32]] = None,
) -> npt.NDArray[np.int32]:
    """:func:`nsa_select_compressed` at decode, over an engine's paged cache of compressed
    keys (see :func:`nsa_block_scores_paged`): the blocks each decoding query reads.

    Equal, row for row and bit for bit, to :func:`nsa_select_compressed` on each
    sequence's compressed keys laid out densely (fp8 keys times their scales), its one
    query at its last token.

    Parameters
    ----------
    q, kv_cache, block_table, seq_lens, n_kv_heads
        As :func:`nsa_block_scores_paged`.
    block_counts : int, optional
        Blocks a row (fla's 16), at least 1.
    block_size, init_blocks, local_blocks, scale, page_layout, key_format, query_format
        As :func:`nsa_block_scores_paged`.
    window, kernel_size, kernel_stride : optional
        As :func:`nsa_block_scores`.
    out : ndarray of int32, [n_seqs, n_kv_heads, block_counts], optional
        ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
        aligned, native byte order, not overlapping any input (else refused, nothing written).

    Returns
    -------
    ndarray of int32, [n_seqs, n_kv_heads, block_counts]
        Block ids ascending, then ``-1``.

    Raises
    ------
    SelectionError
        As :func:`nsa_block_scores_paged`, and when ``block_counts`` is 0
        (``block_counts``).
        Also when ``out`` is refused (its shape, layout, read-only, or overlapping an input).
    TypeError
        when ``out`` is not an int32 ndarray.

    See Also
    --------
    nsa_select_compressed : the dense form.
    infllm_select_paged : InfLLM-v2's paged decode, on the same kind of cache.

    Examples
    --------
    >>> import numpy as np, kvselect
    >>> rng = np.random.default_rng(0)
    >>> ck = rng.standard_normal((12, 2, 8)).astype(np.float32)  # 800 tokens' keys
    >>> q = rng.standard_normal((1, 4, 8)).astype(np.float32)
    >>> cache = ck.reshape(3, 4, 16)[::-1]  # pages of 4 keys, stored in reverse
    >>> table = np.array([[2, 1, 0]], dtype=np.int32)
    >>> rows = kvselect.nsa_select_paged(q, cache, table, [800], 2, 4)
    >>> rows.shape, np.array_equal(rows, kvselect.nsa_select_compressed(q, ck, 800, 4))
    ((1, 2, 4), True)
    """

def snapkv_scores(
    q: _ArrayIn,
    k: _ArrayIn,
    *,
    window: int = 64,
    kernel: int = 5,
    scale: Optional[float] = None,
    out: Optional[_ArrayOut[np.float64]] = None,
) -> npt.NDArray[np.float64]:
    """SnapKV's score of every prefix position (kvpress ``SnapKVPress.score``), float64.

    The last ``window`` queries' causal attention over the keys before the window, summed
    over those queries in order and divided by ``window``; average-pooled (``kernel``
    taps, zero padding of ``kernel // 2``, divided by ``kernel``); summed over the group's
    heads and divided by ``group``; the window's positions one padded score, the maximum
    plus 1. The softmax is :func:`attention_probabilities`' float64 arithmetic, so the
    scores equal :func:`kvselect.reference.snapkv_scores` bit for bit.

    Parameters
    ----------
    q : array_like of float32, [P, group, d]
        The prefix's queries, the query heads of one KV head.
    k : array_like of float32, [P, d]
        That KV head's keys.
    window : int, optional
        The observation window, ``1 <= window < P`` (default 64).
    kernel : int, optional
        The pooling's taps, at least 1 (default 5).
    scale : float, optional
        The softmax scale (default ``1 / sqrt(d)``).
    out : ndarray of float64, [P], optional
        ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
        aligned, native byte order, not overlapping any input (else refused, nothing written).

    Returns
    -------
    ndarray of float64, [P]
        Each position's score.

    Raises
    ------
    SelectionError
        (a ValueError; ``.argument`` names it) when ``q`` is not 3-D, holds no query head
        or a non-finite value (``q``); ``k`` is not ``[P, d]`` or not finite (``k``);
        ``scale`` is not finite or could overflow a score (``scale``); ``window`` is not
        in ``1..P-1`` (``window``); ``kernel`` is 0 (``kernel``).
        Also when ``out`` is refused (its shape, layout, read-only, or overlapping an input).
    TypeError
        when ``out`` is not a float64 ndarray.

    See Also
    --------
    keep_top : the kept positions of these scores.
    kvselect.reference.snapkv_scores : the NumPy twin.

    Examples
    --------
    >>> import numpy as np, kvselect
    >>> rng = np.random.default_rng(0)
    >>> q = rng.standard_normal((12, 2, 8)).astype(np.float32)
    >>> k = rng.standard_normal((12, 8)).astype(np.float32)
    >>> s = kvselect.snapkv_scores(q, k, window=4)
    >>> s.shape, bool((s[8:] == s.max()).all())
    ((12,), True)
    """

def tova_scores(
    q_last: _ArrayIn,
    k: _ArrayIn,
    *,
    scale: Optional[float] = None,
    out: Optional[_ArrayOut[np.float64]] = None,
) -> npt.NDArray[np.float64]:
    """TOVA's score of every prefix position (kvpress ``TOVAPress.score``), float64.

    The last query's attention (position ``P - 1``, its ``group`` heads) over the keys
    before it, summed over the heads and divided by ``group``; the last position padded
    with the maximum plus 1. Equal to :func:`kvselect.reference.tova_scores` bit for bit.

    Parameters
    ----------
    q_last : array_like of float32, [group, d]
        The last prefix query's heads.
    k : array_like of float32, [P, d]
        The KV head's keys, ``P >= 1``.
    scale : float, optional
        The softmax scale (default ``1 / sqrt(d)``).
    out : ndarray of float64, [P], optional
        ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
        aligned, native byte order, not overlapping any input (else refused, nothing written).

    Returns
    -------
    ndarray of float64, [P]
        Each position's score.

    Raises
    ------
    SelectionError
        (a ValueError; ``.argument`` names it) when ``q_last`` is not 2-D, holds no head
        or a non-finite value (``q_last``); ``k`` is not ``[P, d]``, empty or not finite
        (``k``); ``scale`` is not finite or could overflow a score (``scale``).
        Also when ``out`` is refused (its shape, layout, read-only, or overlapping an input).
    TypeError
        when ``out`` is not a float64 ndarray.

    See Also
    --------
    keep_top : the kept positions of these scores.
    kvselect.reference.tova_scores : the NumPy twin.

    Examples
    --------
    >>> import numpy as np, kvselect
    >>> k = np.eye(4, dtype=np.float32)
    >>> q_last = np.zeros((1, 4), dtype=np.float32)
    >>> kvselect.tova_scores(q_last, k).tolist()
    [0.25, 0.25, 0.25, 1.25]
    """

def observed_attention_scores(
    q: _ArrayIn,
    k: _ArrayIn,
    *,
    scale: Optional[float] = None,
    out: Optional[_ArrayOut[np.float64]] = None,
) -> npt.NDArray[np.float64]:
    """ObservedAttention's score of every prefix position (kvpress
    ``ObservedAttentionPress``), float64.

    Every prefix query's causal attention summed per key in query order, divided by the
    ``P - j`` queries that see key ``j``, summed over the group's heads and divided by
    ``group``. Equal to :func:`kvselect.reference.observed_attention_scores` bit for bit.

    Parameters
    ----------
    q : array_like of float32, [P, group, d]
        The prefix's queries, the query heads of one KV head.
    k : array_like of float32, [P, d]
        That KV head's keys.
    scale : float, optional
        The softmax scale (default ``1 / sqrt(d)``).
    out : ndarray of float64, [P], optional
        ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
        aligned, native byte order, not overlapping any input (else refused, nothing written).

    Returns
    -------
    ndarray of float64, [P]
        Each position's score.

    Raises
    ------
    SelectionError
        (a ValueError; ``.argument`` names it) when ``q`` is not 3-D, holds no query head
        or a non-finite value (``q``); ``k`` is not ``[P, d]`` or not finite (``k``);
        ``scale`` is not finite or could overflow a score (``scale``).
        Also when ``out`` is refused (its shape, layout, read-only, or overlapping an input).
    TypeError
        when ``out`` is not a float64 ndarray.

    See Also
    --------
    keep_top : the kept positions of these scores.
    kvselect.reference.observed_attention_scores : the NumPy twin.

    Examples
    --------
    >>> import numpy as np, kvselect
    >>> q = np.zeros((3, 1, 2), dtype=np.float32)
    >>> k = np.ones((3, 2), dtype=np.float32)
    >>> [round(x, 4) for x in kvselect.observed_attention_scores(q, k).tolist()]
    [0.6111, 0.4167, 0.3333]
    """

def h2o_keep(
    q: _ArrayIn,
    k: _ArrayIn,
    budget: int,
    *,
    recent: int,
    scale: Optional[float] = None,
    out: Optional[_ArrayOut[np.int64]] = None,
) -> npt.NDArray[np.int64]:
    """H2O's cache after the prefix (FMInference/H2O ``H2OKVCache_LayerWise``): the greedy
    per-step eviction, frozen at the boundary.

    Token ``t`` joins the cache; its query heads' attention over the cache (softmax over
    the cached keys only) is added to each cached position's score, head by head; when the
    cache exceeds ``budget``, the position last in the order (score descending, ties to the
    lower position) among all but the ``recent`` newest is evicted with its score. Equal
    to :func:`kvselect.reference.h2o_keep`.

    Parameters
    ----------
    q : array_like of float32, [P, group, d]
        The prefix's queries, the query heads of one KV head.
    k : array_like of float32, [P, d]
        That KV head's keys.
    budget : int
        Positions kept.
    recent : int
        The newest positions always kept, ``0 <= recent <= budget``.
    scale : float, optional
        The softmax scale (default ``1 / sqrt(d)``).
    out : ndarray of int64, [min(budget, P)], optional
        ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
        aligned, native byte order, not overlapping any input (else refused, nothing written).

    Returns
    -------
    ndarray of int64, [min(budget, P)]
        The kept positions, ascending.

    Raises
    ------
    SelectionError
        (a ValueError; ``.argument`` names it) when ``q`` is not 3-D, holds no query head
        or a non-finite value (``q``); ``k`` is not ``[P, d]`` or not finite (``k``);
        ``scale`` is not finite or could overflow a score (``scale``); ``budget`` or
        ``recent`` is negative, or ``recent`` exceeds ``budget`` (``recent``).
        Also when ``out`` is refused (its shape, layout, read-only, or overlapping an input).
    TypeError
        when ``out`` is not an int64 ndarray.

    See Also
    --------
    kvselect.reference.h2o_keep : the NumPy twin.

    Examples
    --------
    >>> import numpy as np, kvselect
    >>> q = np.zeros((4, 1, 2), dtype=np.float32)
    >>> k = np.ones((4, 2), dtype=np.float32)
    >>> kvselect.h2o_keep(q, k, 2, recent=1).tolist()
    [0, 3]
    """

def keep_top(
    scores: _ArrayIn,
    budget: int,
    *,
    out: Optional[_ArrayOut[np.int64]] = None,
) -> npt.NDArray[np.int64]:
    """The first ``budget`` positions by score descending, ties to the lower position, in
    ascending order: the one total order the eviction policies keep by.

    Parameters
    ----------
    scores : array_like of float64, [n]
        One score per position (``-0.0`` and ``0.0`` are equal).
    budget : int
        Positions kept (all of them when ``budget >= n``).
    out : ndarray of int64, [min(budget, n)], optional
        ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
        aligned, native byte order, not overlapping any input (else refused, nothing written).

    Returns
    -------
    ndarray of int64, [min(budget, n)]
        The kept positions, ascending.

    Raises
    ------
    SelectionError
        (a ValueError; ``.argument`` names it) when ``scores`` is not 1-D or holds a NaN
        (``scores``), or ``budget`` is negative (``budget``).
        Also when ``out`` is refused (its shape, layout, read-only, or overlapping an input).
    TypeError
        when ``out`` is not an int64 ndarray.

    See Also
    --------
    snapkv_scores, tova_scores, observed_attention_scores : the scores it ranks.
    kvselect.reference.keep_top : the NumPy twin.

    Examples
    --------
    >>> import kvselect
    >>> kvselect.keep_top([0.5, 2.0, 0.5, 2.0, 0.5, 1.0], 4).tolist()
    [0, 1, 3, 5]
    """
