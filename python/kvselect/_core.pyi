"""Type stubs for the native module ``kvselect._core`` (checked by stubtest)."""

from typing import Any, Final, Optional, Protocol, TypeAlias, TypeVar, Union, final

import numpy as np
import numpy.typing as npt

__all__ = [
    "window_positions",
    "visible_entries",
    "compressed_entry_tokens",
    "expand_entries",
    "combine_topk_swa_indices",
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
    "_dlpack_array",
    "indexer_topk",
    "indexer_topk_packed",
    "indexer_topk_paged",
    "check_topk",
    "indexer_scores",
    "indexer_magnitudes",
    "block_scores",
    "block_magnitudes",
    "GlobalSlots",
    "check_blocks",
    "check_witnesses",
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

def random_null(context_len: int, budget: int, seed: int) -> npt.NDArray[np.int32]:
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

    Returns
    -------
    ndarray of int32, [min(budget, context_len)]
        The drawn tokens, ascending.

    Raises
    ------
    WitnessError
        (a ValueError; ``.argument`` names the argument) when ``context_len`` is above
        2**31 - 1, or an argument is negative or above 2**64 - 1.
    TypeError
        when an argument is not an integer (a float, ``np.float64``, a string).
    """

def locality_null(context_len: int, budget: int) -> npt.NDArray[np.int32]:
    """The locality null: the ``min(budget, context_len)`` most recent tokens.

    The tokens ``[L - k, L)``, ``k = min(budget, L)`` (row ``L - 1`` of
    ``Selector.local(budget)``).

    Parameters
    ----------
    context_len : int
        The row's length ``L``, 0 to 2**31 - 1.
    budget : int
        How many tokens to keep, 0 to 2**64 - 1 (capped at ``L``).

    Returns
    -------
    ndarray of int32, [min(budget, context_len)]
        ``L - k, ..., L - 1``.

    Raises
    ------
    WitnessError
        (a ValueError; ``.argument`` names the argument) when ``context_len`` is above
        2**31 - 1, or an argument is negative or above 2**64 - 1.
    TypeError
        when an argument is not an integer (a string, a float).
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
    """``BlockSparseConfig(block_size=128, top_blocks=32, init_blocks=1,
    local_blocks=2)``: how many blocks a query may see, and which are free.

    Immutable, compares by value, hashable. Building one refuses a config
    that can select nothing (block_size 0, or top_blocks 0 with no forced
    block), since an empty selection is a NaN downstream. The released
    MiniMax-M3 checkpoint uses top_blocks=16, init_blocks=0, local_blocks=1.
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
    """The blocks each KV head may read, ascending then -1, int32. One query:
    ``index_q [n_kv_heads, d]`` with an int ``query_pos`` gives ``[n_kv_heads,
    width]``; a chunk of queries of one sequence: ``index_q [n_queries,
    n_kv_heads, d]`` with ``query_pos [n_queries]`` gives ``[n_queries,
    n_kv_heads, width]``, or the engines' ``[n_kv_heads, n_queries, width]``
    with ``head_major=True``. ``index_k`` is ``[n_positions, d]``; ``width =
    config.width``. float32, float16 and ml_dtypes bfloat16 / float8_e4m3fn
    keys and queries are read in place (a raw uint16 / uint8 view names its
    format with ``key_format`` / ``query_format``); an array in non-native
    byte order, misaligned or not C-contiguous is copied once to a native,
    aligned one (the same values). A batched ``query_pos`` may be one
    integer for a batch of one query. ``out=`` reuses a buffer.
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
    """A packed serving batch: the keys of all sequences concatenated in
    ``index_k [n_positions, d]``, sequence ``s`` owning rows ``cu_seqlens[s]
    .. cu_seqlens[s + 1]``; query ``i`` (``index_q [n_queries, n_kv_heads,
    d]``) belongs to sequence ``seq_ids[i]`` at position ``query_pos[i]``
    within it, and its block ids count from the start of its sequence.
    Returns int32 ``[n_queries, n_kv_heads, width]`` (``[n_kv_heads,
    n_queries, width]`` with ``head_major=True``); formats as
    :func:`block_sparse_select`; ``seq_ids`` and ``query_pos`` are
    ``[n_queries]`` (``query_pos`` one integer for one query); ``out=``
    reuses a buffer.
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
    """Block selection over an engine's paged index-K cache, read in place
    (vLLM's MiniMax-M3 layout): ``kv_cache [num_blocks, block_size, d]`` of
    float32 / float16 / bfloat16 / float8_e4m3fn (a raw view with
    ``key_format``; the block axis may be strided), whose page is the block:
    ``block_size`` must equal ``config.block_size``. ``block_table`` int32
    ``[n_seqs, max_blocks]`` (only the first ``ceil(seq_lens[s] /
    block_size)`` entries of a row are read), ``seq_lens [n_seqs]``; query
    ``i`` (``index_q [n_queries, n_kv_heads, d]``) belongs to sequence
    ``seq_ids[i]`` at ``query_pos[i]`` within it (``query_pos`` one integer
    for one query); ``block_table`` must be ``[len(seq_lens), max_blocks]``,
    axis by axis. Rows hold the sequence's
    logical block ids, ascending, then -1 (what vLLM's
    ``minimax_m3_index_topk`` returns); ``physical=True`` maps each through
    the block table to its page id, in the same slots. ``head_major=True``
    gives ``[n_kv_heads, n_queries, width]``; ``out=`` reuses a buffer.
    The pages are never converted: a cache in non-native byte order is
    refused (naming ``kv_cache``: pass ``kv_cache.astype(kv_cache.dtype
    .newbyteorder('='))``); misaligned pages are read in place, byte by byte.
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
    """The positions a block selection covers, int32, ascending and causally
    clipped: block ``b`` contributes ``b*bs .. min((b+1)*bs, n_positions,
    query_pos + 1)``; negative entries (padding) are skipped. 1-D ``blocks``
    with an int ``query_pos`` and ``n_positions``: the positions, as long as
    they are. Batched, in one call: ``blocks [rows, width]``, or a
    selection's ``[n_queries, n_kv_heads, width]`` (``[n_kv_heads,
    n_queries, width]`` with ``head_major=True``), gives fixed-width rows
    ``[..., width * block_size]``, ascending then -1 (what
    :func:`sparse_attention` takes); ``query_pos`` and ``n_positions`` are an
    int (every row's), or one entry per row (2-D) or per query (3-D).
    Batched, ``out=`` (int32, exactly that shape, overlapping no input)
    receives the rows and is returned; the 1-D form takes no ``out=``.
    """

@final
class Selector:
    """A score-free baseline selector: which keys query row ``i`` of a causal
    sequence (keys ``0..=i``) may attend to. Build one with
    ``Selector.dense()``, ``Selector.local(window)``,
    ``Selector.random(budget, seed)`` or ``Selector.sink_window(sinks,
    window)``; rows are distinct, ascending and causal.
    """

    @staticmethod
    def dense() -> "Selector":
        """Every causal key."""
    @staticmethod
    def local(window: int) -> "Selector":
        """The ``window`` most recent keys, the query's own included."""
    @staticmethod
    def random(budget: int, seed: int) -> "Selector":
        """``budget`` distinct keys drawn uniformly from the causal set
        (ChaCha8 keyed by ``seed`` on stream ``i``: deterministic per seed and row).
        """
    @staticmethod
    def sink_window(sinks: int, window: int) -> "Selector":
        """StreamingLLM: the first ``sinks`` keys plus the ``window`` most recent."""
    def row(self, row: int) -> npt.NDArray[np.int32]:
        """The candidates of query row ``row`` (keys ``0..=row``), ascending."""
    def rows(
        self,
        query_pos: _ArrayIn,
        width: Optional[int] = None,
        *,
        out: Optional[_ArrayOut[np.int32]] = None,
    ) -> npt.NDArray[np.int32]:
        """The candidates of every query position in ``query_pos`` (``[n]``, or
        one integer for ``n = 1``): int32 ``[n, width]``, ascending then -1;
        ``width`` defaults to the widest row. ``out=`` (int32 ``[n, width]``
        exactly, C-contiguous, writeable, sharing no input's memory) is filled
        and returned; a refused call leaves it untouched.
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
    """The oracle top-k: for each row of ``attention`` (float64 ``[n,
    row_len]``, the dense attention row of query position ``query_pos[i]``),
    the ``budget`` keys with the largest weight among ``0..=query_pos[i]``,
    ties to the lower key; int32 ``[n, width]`` ascending then -1. One
    integer ``query_pos`` is ``[query_pos]`` (``attention`` keeps its row
    axis, of length 1). ``out=`` (int32 ``[n, width]`` exactly) is filled
    and returned; a refused call leaves it untouched.
    """

def attention_probabilities(
    q: _ArrayIn,
    k: _ArrayIn,
    query_pos: _ArrayIn,
    *,
    scale: Optional[float] = None,
    out: Optional[_ArrayOut[np.float64]] = None,
) -> npt.NDArray[np.float64]:
    """Dense causal attention probabilities, float64 ``[n_queries, n_q_heads,
    n_keys]`` (zeros after each query's position): the rows recall is
    measured against. One integer ``query_pos`` is ``[query_pos]`` (``q``
    keeps its query axis, of length 1). ``out=`` (float64 ``[n_queries,
    n_q_heads, n_keys]`` exactly, C-contiguous, writeable, sharing no
    input's memory) is filled and returned; a refused call leaves it
    untouched.
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
    """Dense causal attention: ``(out [n_queries, n_q_heads, d_v], lse
    [n_queries, n_q_heads])``, every query over keys ``0..=query_pos`` (one
    integer ``query_pos`` is ``[query_pos]``: ``q`` keeps its query axis).
    ``v`` may be MLA's strided ``kv[..., :d_v]`` view, read in place.
    ``out=`` / ``lse_out=`` (float32 of exactly those shapes, C-contiguous,
    writeable, sharing no input's memory nor each other's) are filled and
    returned; a refused call leaves both untouched.
    """

def sparse_attention(
    q: _ArrayIn,
    k: _ArrayIn,
    v: _ArrayIn,
    query_pos: _ArrayIn,
    selection: _ArrayIn,
    *,
    scale: Optional[float] = None,
    out: Optional[_ArrayOut[np.float32]] = None,
    lse_out: Optional[_ArrayOut[np.float32]] = None,
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32], int]:
    """Sparse causal attention over ``selection`` (int32 ``[n_queries,
    n_kv_heads, width]`` key indices; a KV head's row serves its query-head
    group): ``(out, lse, empty_rows)``; a row that selects nothing gets
    zeros and ``lse = -inf`` and is counted in ``empty_rows``. ``query_pos``,
    ``out=`` and ``lse_out=`` as in :func:`dense_attention`.
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
    """``‖sparse − dense‖ / ‖dense‖`` over whole arrays of one shape (float64;
    ``dense`` is checked axis by axis against ``sparse``).
    """

def output_relative_error_rows(
    sparse: _ArrayIn,
    dense: _ArrayIn,
    *,
    out: Optional[_ArrayOut[np.float64]] = None,
) -> npt.NDArray[np.float64]:
    """``‖sparse − dense‖ / ‖dense‖`` per row over the last axis (float32
    inputs of one shape, at least 1-D; ``dense`` is checked axis by axis
    against ``sparse``): float64 of the leading shape. ``out=`` (float64 of
    exactly that shape) is filled and returned; a refused call leaves it
    untouched.
    """

def set_num_threads(n: int) -> None:
    """Sets the number of threads kvselect's parallel paths use (at most
    65536); 0 restores the default (``RAYON_NUM_THREADS``, else every core).
    """

def get_num_threads() -> int:
    """The number of threads kvselect's parallel paths use."""

def indexer_topk(
    index_q: _ArrayIn,
    weights: _ArrayIn,
    index_k: _ArrayIn,
    query_pos: _ArrayIn,
    topk: int,
    *,
    key_scale: Optional[_ArrayIn] = None,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    num_segments: int = 0,
    compress_ratio: int = 1,
    out: Optional[_ArrayOut[np.int32]] = None,
    scores_out: Optional[_ArrayOut[np.float32]] = None,
) -> npt.NDArray[np.int32]:
    """The lightning indexer's top-k (DeepSeek-V3.2/V4, GLM-5), single-sequence
    form: for each query, the ``topk`` positions of ``[0, L)``, ``L =
    min(query_pos + 1, T)``, with the largest ``score(t) = key_scale[t] *
    sum_h weights[h] * max(index_q[h] . index_k[t], 0)``, in rank order
    (score descending, ties to the lower position, -0.0 == +0.0, NaN last),
    then -1: int32 ``[n_queries, topk]``.

    ``index_q`` is ``[n_queries, H, d]``, ``weights`` float32 ``[n_queries,
    H]`` (softmax scale, H**-0.5 and any query scale folded in), ``index_k``
    ``[T, d]``, ``key_scale`` float32 ``[T]``, one number for every key (a
    per-tensor scale: a Python or NumPy float, or a 0-D array) or None (1).
    Keys and queries may
    be float32, float16, or ``ml_dtypes`` bfloat16 / float8_e4m3fn arrays,
    read in place; a raw ``uint16`` / ``uint8`` view (``t.view(torch.uint8)
    .numpy()``) needs ``key_format`` / ``query_format`` ("bfloat16",
    "float16", "float8_e4m3fn"). Every array is checked axis by axis
    (a transposed or reshaped ``weights`` is refused, naming both shapes);
    ``query_pos`` is ``[n_queries]``, or one integer for a batch of one
    query. A dense array in non-native byte order (``'>f2'``, ``'>u2'``
    bits), misaligned or not C-contiguous is copied once to a native,
    aligned one (as float64 is converted to float32); the values read are
    the same. ``compress_ratio=m`` (DeepSeek-V4's CSA: 4, HCA: 128; 1 is
    token-level keys) makes each key a compressed entry of ``m`` tokens:
    ``query_pos`` stays the token position and the query sees ``L =
    min((query_pos + 1) // m, T)`` entries (none yet: a row of -1).
    ``num_segments=S`` (1..=64) returns the
    reserved-tail witness row; ``out=`` reuses a buffer; ``scores_out=``
    (float32 ``[n_queries, topk]``) receives each entry's score (NaN at -1).
    """

def indexer_topk_packed(
    index_q: _ArrayIn,
    weights: _ArrayIn,
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
    out: Optional[_ArrayOut[np.int32]] = None,
    scores_out: Optional[_ArrayOut[np.float32]] = None,
) -> npt.NDArray[np.int32]:
    """The packed form, serving-engine style: the keys of all sequences
    concatenated in ``index_k [n_keys, d]`` (``key_scale`` alike), sequence
    ``s`` owning rows ``cu_seqlens[s] .. cu_seqlens[s + 1]``; query ``i``
    belongs to sequence ``seq_ids[i]`` at position ``query_pos[i]`` within
    it and its row holds offsets from the start of its sequence (``seq_ids``
    ``[n_queries]``, ``query_pos`` too or one integer for one query;
    ``compress_ratio``: each sequence's rows are its compressed entries).
    Otherwise as :func:`indexer_topk`, row for row.
    """

def indexer_topk_paged(
    index_q: _ArrayIn,
    weights: _ArrayIn,
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
    out: Optional[_ArrayOut[np.int32]] = None,
    scores_out: Optional[_ArrayOut[np.float32]] = None,
) -> npt.NDArray[np.int32]:
    """:func:`indexer_topk` over an engine's paged key cache, read in place:
    ``kv_cache`` is ``[num_blocks, block_size, d]`` pages of float32 /
    float16 / bfloat16 / float8_e4m3fn (``page_layout="dense"``; raw uint16 /
    uint8 with ``key_format``), or vLLM's DSA index-K pages (``page_layout=
    "fp8_scaled"``: uint8 ``[num_blocks, block_size, 1, d + 4]`` or
    ``[num_blocks, block_size, d + 4]``, each page the ``block_size × d``
    e4m3fn bytes then ``block_size`` float32 scales). The block axis may be
    strided. ``block_table`` is int32 ``[n_seqs, max_blocks]`` (only the
    first ``ceil(seq_lens[s] / block_size)`` entries of a row are read),
    ``seq_lens`` ``[n_seqs]`` (``block_table`` is checked against it axis by
    axis); query ``i`` belongs to sequence ``seq_ids[i]`` at ``query_pos[i]``
    within it (``query_pos`` one integer for one query), and its row holds
    positions within it. With ``compress_ratio=m`` the pages hold compressed
    entries (DeepSeek-V4's indexer cache: entry ``c`` at ``block_table[s, c
    // block_size] * block_size + c % block_size``) and ``seq_lens`` counts
    entries.
    The pages are never converted: a cache in non-native byte order is
    refused (naming ``kv_cache``: pass ``kv_cache.astype(kv_cache.dtype
    .newbyteorder('='))``); misaligned pages are read in place, byte by byte.
    """

def indexer_scores(
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
    """Every query's exact score of every key it sees, float32 ``[n_queries,
    n_keys]`` (NaN past each query's context): the scores :func:`indexer_topk`
    ranks, bit for bit — what :func:`check_topk` judges an engine's rows
    against. Arguments as :func:`indexer_topk`; ``out=`` (float32
    ``[n_queries, n_keys]``) reuses a buffer. Builds the whole matrix: a
    checking tool, not a serving path (``compress_ratio`` as
    :func:`indexer_topk` takes it). Their error scales are
    :func:`indexer_magnitudes`.
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
    """Each :func:`indexer_scores` entry's error scale ``|key_scale[t]| *
    sum_h |weights[h]| * sum_i |index_q[h, i] * index_k[t, i]|``: the
    ``magnitudes`` of :func:`check_topk` (its ``rtol`` multiplies them).
    Arguments, shape and NaN padding as :func:`indexer_scores`.
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
    broken any way). With ``atol = rtol = 0`` the check is exact.

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
        Each row's exact scores, read as given: e.g. :func:`indexer_scores`, or
        float64-exact scores; any other dtype is a ``TypeError``.
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
    """Every row's exact block scores, the values block selection ranks (bit
    for bit): float32 ``[n_queries, n_kv_heads, n_blocks]``, ``n_blocks =
    ceil(n_positions / config.block_size)``, entry ``b`` the max of ``q . k``
    over block ``b``'s visible positions (``-inf`` when all are NaN), NaN past
    the row's visible blocks. ``index_q`` is ``[n_queries, n_kv_heads, d]``
    with ``query_pos [n_queries]`` (one integer for one query); formats as
    :func:`block_sparse_select`;
    ``out=`` (float32, that shape) reuses a buffer. Their error scales are
    :func:`block_magnitudes`.
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
    """The error scale of every :func:`block_scores` entry: the max over the
    block's visible positions of ``sum_i |q_i * k_i|``, the ``magnitudes``
    of :func:`check_blocks` (its ``rtol`` multiplies them). Arguments,
    shape and NaN padding as :func:`block_scores`.
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
    def positions(self, rows: _ArrayIn) -> npt.NDArray[np.int64]:
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
            ``workspace_starts``), or a tensor is not on the CPU.
        TypeError
            when ``rows`` holds no integers.
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
        Each row's block scores, read as float32 (other floats convert once).
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
    """The best instruction-set level the SIMD kernels dispatched to on this
    CPU: "avx512" (block selection, the indexer and attention; the other
    kernels run AVX2), "avx2" or "scalar". ``KVSELECT_SIMD=avx2`` or
    ``=scalar`` in the environment caps it.
    """

def _fma_floor(iters: int) -> tuple[int, float]:
    """Benchmarks' floor (private): ``iters`` steps of a register-resident FMA
    loop on every pool thread at the best SIMD level; returns ``(flops,
    checksum)``, the caller times the call.
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
    """Each query's sliding window, DeepSeek-V4's ``[max(0, p - W + 1), p]``
    (the query included) ascending, then -1: int32 ``[n_queries,
    window_size]``. ``query_pos`` is ``[n_queries]``, or one integer for one
    query; ``out=`` reuses a buffer.
    """

def visible_entries(
    query_pos: _ArrayIn,
    compress_ratio: int,
    n_entries: int,
    *,
    out: Optional[_ArrayOut[np.int32]] = None,
) -> npt.NDArray[np.int32]:
    """Every compressed entry each query sees, ``0 .. min((query_pos + 1) //
    compress_ratio, n_entries)`` ascending, then -1: int32 ``[n_queries,
    n_entries]`` — an HCA query's entries (it attends to all of them; a CSA
    query's are its :func:`indexer_topk` row with ``compress_ratio``).
    ``out=`` reuses a buffer.
    """

def compressed_entry_tokens(
    entries: _ArrayIn,
    compress_ratio: int,
    *,
    overlap: bool,
    out: Optional[_ArrayOut[np.int32]] = None,
) -> npt.NDArray[np.int32]:
    """The tokens each compressed entry covers, ``[start, end)`` (end
    exclusive), int32 ``entries.shape + (2,)``: with ``overlap=True``
    DeepSeek-V4's CSA entry ``w`` is ``[max(0, m(w - 1)), m(w + 1))``; with
    ``overlap=False`` an HCA entry (or a GLM-5-Next pool) is ``[m w, m(w +
    1))``; a -1 entry is ``(-1, -1)``. ``out=`` reuses a buffer.
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
    """Selected compressed entries expanded to token rows (GLM-5-Next's pools):
    ``entry_rows`` int32 ``[n_queries, k]`` (an :func:`indexer_topk` row with
    ``compress_ratio=m``: entry ids, then -1) becomes, at columns ``j*m ..
    (j+1)*m``, entry ``j``'s tokens ``m*w .. m*w + m - 1`` (a -1 entry: ``m``
    times -1). With ``tail=True`` the next ``m - 1`` columns hold the visible
    incomplete tail, ``(p + 1) % m`` tokens from ``(p + 1) - (p + 1) % m``,
    then -1. The row is padded with -1 to ``width`` (default ``k*m``, plus
    ``m - 1`` with the tail; GLM-5-Next: ``index_topk + kpool - 1``). An
    entry not yet visible to its query (``w >= (p + 1) // m``) is refused.
    ``out=`` reuses a buffer.
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
    """vLLM's ``combine_topk_swa_indices`` (DeepSeek-V4 sparse prefill,
    ``vllm/v1/attention/ops/deepseek_v4_ops/cache_utils.py``), same arguments
    in the same order: ``topk_indices`` int32 ``[num_tokens, >= topk]``,
    ``query_start_loc`` ``[num_reqs + 1]``, ``seq_lens`` and ``gather_lens``
    ``[num_reqs]``. Token ``i`` of request ``b`` at ``pos = seq_len -
    query_len + (i - query_start_loc[b])`` gets ``topk_len = min((pos + 1) //
    compress_ratio, topk)`` top-k entries ``topk_indices[i, :topk_len] + M*b``
    (copied as vLLM does: a -1 becomes ``M*b - 1``), then its window of
    ``swa_len = min(pos + 1, window_size)`` tokens ascending at ``M*b + N +
    (pos - swa_len + 1 - gather_start) + j`` (``gather_start = seq_len -
    gather_len``), then -1. Returns ``(combined_indices, combined_lens)``:
    int32 ``[num_tokens, roundup(topk + window_size, 128)]`` and int32
    ``[num_tokens]`` (``topk_len + swa_len``); ``out=`` / ``lens_out=`` reuse
    buffers. Refused, naming the argument: ``query_start_loc`` not rising
    from 0 to ``num_tokens``, a query longer than its sequence, a
    ``gather_len`` longer than it or a window starting before the gathered
    tokens, a top-k entry ``>= N``, and ``N + gather_len > M`` before the last
    request (its window would run into the next request's workspace).
    """
