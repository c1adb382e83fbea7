"""Type stubs for the native module ``kvselect._core`` (checked by stubtest)."""

from typing import Any, Final, Optional, Union, final

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

__version__: Final[str]
MAX_TOPOLOGY_SEGMENTS: Final[int]
MINIMAX_BLOCK_SIZE: Final[int]

class KvselectError(ValueError):
    """A refused kvselect call: the base class of WitnessError and SelectionError,
    raised itself by the thread controls.

    ``argument`` names the argument at fault; ``variant`` names the core's
    refusal, or is None when the bindings refuse an argument themselves.
    """

    variant: Optional[str]
    argument: str

class WitnessError(KvselectError):
    """A refused segment-witness call, or one of its metrics.

    ``variant`` names the spec's refusal ("RowsMismatch", "SegmentsOutOfRange",
    "LearnedKeepOutOfRange") or is None for an argument the bindings refuse;
    ``argument`` names the argument at fault; the variant's fields
    (``learned_len``, ``topk``, ``rows``, ``num_segments``, ``learned_keep``)
    are attributes too.
    """

class SelectionError(KvselectError):
    """A refused block-selection, selector or attention call; ``argument`` names the
    argument at fault, ``variant`` the core's refusal."""

def segment_of(token: int, context_len: int, num_segments: int) -> int:
    """The segment map ``floor(token * S_eff / L)`` with ``L = max(context_len, 1)`` and ``S_eff = min(S, L)``,
    exact up to 2**64 - 1; not clamped (``segment_of(20, 4, 8) == 20``: only the merge clamps to ``S - 1``)."""

def topology_witness_indices(
    learned: npt.ArrayLike,
    context_lens: npt.ArrayLike,
    num_segments: int,
    *,
    out: Optional[npt.NDArray[np.int32]] = None,
) -> npt.NDArray[np.int32]:
    """The witnesses of every learned row, int32 ``[rows, num_segments]``.

    Slot ``s`` holds the left edge ``ceil(s*L/S_eff)`` of segment ``s`` when the
    row does not occupy it, else -1. Accepts any positive ``num_segments``.
    """

def apply_topology_witnesses(
    learned: npt.ArrayLike,
    context_lens: npt.ArrayLike,
    learned_keep: int,
    num_segments: int,
    max_replacements: int,
    *,
    out: Optional[npt.NDArray[np.int32]] = None,
) -> npt.NDArray[np.int32]:
    """The learned rows with witnesses merged in, int32 ``[rows, topk]`` (a new array, or ``out``).

    Slots ``[0, learned_keep)`` are kept bit for bit; witnesses in ascending
    segment order overwrite slots ``learned_keep, learned_keep + 1, ...`` up to
    ``min(max_replacements, topk - learned_keep)``.
    """

def scatter_topology_witnesses(
    topk_indices: npt.NDArray[np.int32],
    context_lens: npt.ArrayLike,
    num_segments: int,
) -> None:
    """The serving entry point: writes witnesses into ``topk_indices`` in place.

    ``topk_indices`` must be an int32, C-contiguous, writeable 2-D ndarray (a
    CPU torch tensor's ``.numpy()`` view works; ``torch.topk`` gives int64, so
    call ``.int()`` first). ``num_segments=0`` is the off switch.
    """

def random_null(context_len: int, budget: int, seed: int) -> npt.NDArray[np.int32]:
    """``min(budget, L)`` tokens drawn uniformly from ``[0, L)``, ascending; deterministic per seed."""

def locality_null(context_len: int, budget: int) -> npt.NDArray[np.int32]:
    """The ``min(budget, L)`` most recent tokens, ``[L - k, L)``."""

def segment_coverage(candidates: npt.ArrayLike, context_len: int, num_segments: int) -> float:
    """The share of the ``S_eff`` segments of ``[0, L)`` that ``candidates`` meets (1.0 with no segments)."""

def attention_mass_recall(candidates: npt.ArrayLike, attention_row: npt.ArrayLike) -> float:
    """The share of ``attention_row``'s mass on ``candidates`` (NaN for a row with no mass)."""

@final
class BlockSparseConfig:
    """How many blocks a query may see, and which are free (immutable, compares by value).

    Building one refuses a config that can select nothing (``block_size`` 0, or
    ``top_blocks`` 0 with no forced block). The released MiniMax-M3 checkpoint
    uses ``top_blocks=16, init_blocks=0, local_blocks=1``.
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
        """Tokens per block (also the KV page size)."""
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
        """The fixed width of an output row: ``max(top_blocks, init_blocks + local_blocks)``."""
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...
    def __reduce__(self) -> tuple[type["BlockSparseConfig"], tuple[int, int, int, int]]: ...

def block_sparse_select(
    index_q: npt.ArrayLike,
    index_k: npt.ArrayLike,
    query_pos: Union[int, npt.ArrayLike],
    config: Optional[BlockSparseConfig] = None,
    *,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    head_major: bool = False,
    out: Optional[npt.NDArray[np.int32]] = None,
) -> npt.NDArray[np.int32]:
    """The blocks each KV head may read: ascending block ids, then -1 padding.

    ``index_q [n_kv_heads, d]`` with an int ``query_pos`` gives
    ``[n_kv_heads, width]``; ``index_q [n_queries, n_kv_heads, d]`` with one
    position per query gives ``[n_queries, n_kv_heads, width]``, or the
    engines' ``[n_kv_heads, n_queries, width]`` with ``head_major=True``.
    ``index_k`` is ``[n_positions, d]``. float32, float16 and ml_dtypes
    bfloat16 / float8_e4m3fn keys and queries are read in place (a raw
    uint16 / uint8 view needs ``key_format`` / ``query_format``); float64
    is converted, and an array of any format in non-native byte order or
    misaligned is copied once to a native, aligned one (same values). A
    batched ``query_pos`` may be one integer for a batch of one query.
    """

def block_sparse_select_packed(
    index_q: npt.ArrayLike,
    index_k: npt.ArrayLike,
    cu_seqlens: npt.ArrayLike,
    seq_ids: npt.ArrayLike,
    query_pos: npt.ArrayLike,
    config: Optional[BlockSparseConfig] = None,
    *,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    head_major: bool = False,
    out: Optional[npt.NDArray[np.int32]] = None,
) -> npt.NDArray[np.int32]:
    """A packed batch of sequences: keys concatenated with ``cu_seqlens`` offsets.

    Query ``i`` belongs to sequence ``seq_ids[i]`` at ``query_pos[i]`` within it,
    sees only that sequence's keys, and its block ids count from the
    sequence's start. Returns ``[n_queries, n_kv_heads, width]`` int32
    (``[n_kv_heads, n_queries, width]`` with ``head_major=True``).
    """

def block_sparse_select_paged(
    index_q: npt.ArrayLike,
    kv_cache: npt.ArrayLike,
    block_table: npt.ArrayLike,
    seq_lens: npt.ArrayLike,
    seq_ids: npt.ArrayLike,
    query_pos: npt.ArrayLike,
    config: Optional[BlockSparseConfig] = None,
    *,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    head_major: bool = False,
    physical: bool = False,
    out: Optional[npt.NDArray[np.int32]] = None,
) -> npt.NDArray[np.int32]:
    """Block selection over an engine's paged index-K cache, read in place.

    ``kv_cache [num_blocks, block_size, d]`` (float32 / float16 / bfloat16 /
    float8_e4m3fn, or a raw view with ``key_format``; the block axis may be
    strided) whose page is the block: ``block_size`` must equal
    ``config.block_size``. ``block_table`` int32 ``[n_seqs, max_blocks]``
    (only the first ``ceil(seq_lens[s] / block_size)`` entries are read),
    ``seq_lens [n_seqs]``; query ``i`` (``index_q [n_queries, n_kv_heads,
    d]``) belongs to sequence ``seq_ids[i]`` at ``query_pos[i]``. Rows hold
    logical block ids of the sequence, ascending, then -1; ``physical=True``
    maps each through the block table to its page id (same order). Pages are
    never converted: a cache in non-native byte order is refused (naming
    ``kv_cache``); misaligned pages are read in place, byte by byte.
    """

def positions_of_blocks(
    blocks: npt.ArrayLike,
    query_pos: Union[int, npt.ArrayLike],
    n_positions: Union[int, npt.ArrayLike],
    config: Optional[BlockSparseConfig] = None,
    *,
    head_major: bool = False,
    out: Optional[npt.NDArray[np.int32]] = None,
) -> npt.NDArray[np.int32]:
    """The positions a block selection covers, ascending and causally clipped (-1 skipped).

    1-D ``blocks`` with an int ``query_pos`` and ``n_positions``: the positions,
    as a 1-D array of their own length. Batched: ``blocks [rows, width]`` or a
    selection's ``[n_queries, n_kv_heads, width]`` (``[n_kv_heads, n_queries,
    width]`` with ``head_major=True``) gives int32 rows ``[..., width *
    block_size]``, ascending then -1; ``query_pos`` and ``n_positions`` are an
    int or one entry per row (2-D) or per query (3-D). Batched, ``out=`` (int32,
    exactly that shape, overlapping no input) receives the rows and is returned.
    """

@final
class Selector:
    """A score-free baseline selector: which keys query row ``i`` of a causal
    sequence (keys ``0..=i``) may attend to. Rows are distinct, ascending, causal."""

    @staticmethod
    def dense() -> "Selector":
        """Every causal key."""
    @staticmethod
    def local(window: int) -> "Selector":
        """The ``window`` most recent keys, the query's own included."""
    @staticmethod
    def random(budget: int, seed: int) -> "Selector":
        """``budget`` distinct keys drawn uniformly (ChaCha8 keyed by ``seed`` on stream ``i``)."""
    @staticmethod
    def sink_window(sinks: int, window: int) -> "Selector":
        """StreamingLLM: the first ``sinks`` keys plus the ``window`` most recent."""
    def row(self, row: int) -> npt.NDArray[np.int32]:
        """The candidates of query row ``row``, ascending."""
    def rows(
        self,
        query_pos: npt.ArrayLike,
        width: Optional[int] = None,
        *,
        out: Optional[npt.NDArray[np.int32]] = None,
    ) -> npt.NDArray[np.int32]:
        """``[n, width]`` int32 rows for the query positions (one integer is ``[p]``), ascending
        then -1; ``out=`` (int32 ``[n, width]`` exactly) is filled and returned."""
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

def oracle_topk(
    attention: npt.ArrayLike,
    query_pos: npt.ArrayLike,
    budget: int,
    *,
    width: Optional[int] = None,
    out: Optional[npt.NDArray[np.int32]] = None,
) -> npt.NDArray[np.int32]:
    """The ``budget`` heaviest keys of each attention row among ``0..=query_pos[i]``
    (ties to the lower key), ``[n, width]`` int32 ascending then -1. The diagnostic ceiling.
    One integer ``query_pos`` is ``[query_pos]``; ``out=`` (int32 ``[n, width]``) is filled."""

def attention_probabilities(
    q: npt.ArrayLike,
    k: npt.ArrayLike,
    query_pos: npt.ArrayLike,
    *,
    scale: Optional[float] = None,
    out: Optional[npt.NDArray[np.float64]] = None,
) -> npt.NDArray[np.float64]:
    """Dense causal softmax rows, float64 ``[n_queries, n_q_heads, n_keys]`` (0 after each position).

    ``q`` is ``[n_queries, n_q_heads, d_k]``, ``k`` is ``[n_keys, n_kv_heads, d_k]``;
    ``scale`` defaults to ``1/sqrt(d_k)``; one integer ``query_pos`` is ``[query_pos]``.
    ``out=`` (float64 of exactly the result's shape, sharing no input's memory) is filled and
    returned; a refused call leaves it untouched.
    """

def dense_attention(
    q: npt.ArrayLike,
    k: npt.ArrayLike,
    v: npt.ArrayLike,
    query_pos: npt.ArrayLike,
    *,
    scale: Optional[float] = None,
    out: Optional[npt.NDArray[np.float32]] = None,
    lse_out: Optional[npt.NDArray[np.float32]] = None,
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """Dense causal attention: ``(out [n_queries, n_q_heads, d_v], lse [n_queries, n_q_heads])``.

    ``v`` is ``[n_keys, n_kv_heads, d_v]``; a strided view such as MLA's
    ``kv[..., :d_v]`` is read in place. One integer ``query_pos`` is ``[query_pos]``.
    ``out=`` / ``lse_out=`` (float32 of exactly those shapes) are filled and returned.
    """

def sparse_attention(
    q: npt.ArrayLike,
    k: npt.ArrayLike,
    v: npt.ArrayLike,
    query_pos: npt.ArrayLike,
    selection: npt.ArrayLike,
    *,
    scale: Optional[float] = None,
    out: Optional[npt.NDArray[np.float32]] = None,
    lse_out: Optional[npt.NDArray[np.float32]] = None,
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32], int]:
    """Sparse causal attention over ``selection [n_queries, n_kv_heads, width]``:
    ``(out, lse, empty_rows)``. -1 padding and entries after the query are
    ignored, duplicates count once; a row that selects nothing gets zeros,
    ``lse = -inf``, and is counted in ``empty_rows``. ``out=`` / ``lse_out=`` (float32, the
    shapes returned) are filled and returned in the tuple.
    """

def segment_coverage_rows(
    candidates: npt.ArrayLike,
    context_lens: npt.ArrayLike,
    num_segments: int,
    *,
    out: Optional[npt.NDArray[np.float64]] = None,
) -> npt.NDArray[np.float64]:
    """:func:`segment_coverage` of every row of ``candidates [rows, width]`` (``context_lens
    [rows]``); ``out=`` (float64 ``[rows]``) is filled and returned."""

def slots_used_rows(
    candidates: npt.ArrayLike,
    context_lens: npt.ArrayLike,
    *,
    out: Optional[npt.NDArray[np.int64]] = None,
) -> npt.NDArray[np.int64]:
    """How many distinct entries of each row of ``candidates [rows, width]`` lie in
    ``[0, context_lens[r])``: the keys the selection really uses, int64 ``[rows]``;
    ``out=`` (int64 ``[rows]``) is filled and returned."""

def attention_mass_recall_rows(
    candidates: npt.ArrayLike,
    attention: npt.ArrayLike,
    *,
    out: Optional[npt.NDArray[np.float64]] = None,
) -> npt.NDArray[np.float64]:
    """:func:`attention_mass_recall` of every attention row; row ``r`` is read against
    candidate row ``r // group``, ``group = n_rows / rows`` (GQA). Or 3-D: ``candidates
    [n_queries, n_kv_heads, width]`` with ``attention [n_queries, n_q_heads, n_keys]``, checked
    axis by axis, giving ``[n_queries, n_q_heads]``. ``out=`` (float64) is filled and returned."""

def output_relative_error(sparse: npt.ArrayLike, dense: npt.ArrayLike) -> float:
    """``||sparse - dense|| / ||dense||`` over whole arrays."""

def output_relative_error_rows(
    sparse: npt.ArrayLike,
    dense: npt.ArrayLike,
    *,
    out: Optional[npt.NDArray[np.float64]] = None,
) -> npt.NDArray[np.float64]:
    """``||sparse - dense|| / ||dense||`` per row over the last axis (``dense`` of ``sparse``'s
    shape, axis by axis); ``out=`` (float64 of the leading shape) is filled and returned."""

def set_num_threads(n: int) -> None:
    """Sets the threads kvselect's parallel paths use; 0 restores the default."""

def get_num_threads() -> int:
    """The threads kvselect's parallel paths use."""

def indexer_topk(
    index_q: npt.ArrayLike,
    weights: npt.ArrayLike,
    index_k: npt.ArrayLike,
    query_pos: npt.ArrayLike,
    topk: int,
    *,
    key_scale: Optional[npt.ArrayLike] = None,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    num_segments: int = 0,
    compress_ratio: int = 1,
    out: Optional[npt.NDArray[np.int32]] = None,
    scores_out: Optional[npt.NDArray[np.float32]] = None,
) -> npt.NDArray[np.int32]:
    """The lightning indexer's top-k (DeepSeek-V3.2/V4, GLM-5), single sequence.

    For each query, the ``topk`` positions of ``[0, L)``, ``L = min(query_pos + 1,
    T)`` (over compressed keys, ``compress_ratio=m`` tokens each, ``L = min((query_pos
    + 1) // m, T)``), with the largest ``key_scale[t] * sum_h weights[h] * max(index_q[h] .
    index_k[t], 0)``, in rank order (score descending, ties to the lower
    position, -0.0 == +0.0, NaN last), then -1: int32 ``[n_queries, topk]``.
    ``index_q [n_queries, H, d]``, ``weights`` float32 ``[n_queries, H]``,
    ``index_k [T, d]``, ``key_scale`` float32 ``[T]`` or one number for every key
    (a per-tensor scale). float32, float16 and
    ml_dtypes bfloat16 / float8_e4m3fn are read in place; raw uint16 / uint8
    views need ``key_format`` / ``query_format``. Every array is checked axis by
    axis (a transposed or reshaped ``weights`` is refused, naming both shapes);
    ``query_pos`` may be one integer for a batch of one query. An array in
    non-native byte order or misaligned is copied once to a native, aligned one
    (same values). ``num_segments`` (1..=64) gives the reserved-tail witness
    row; ``scores_out`` receives the scores.
    """

def indexer_topk_packed(
    index_q: npt.ArrayLike,
    weights: npt.ArrayLike,
    index_k: npt.ArrayLike,
    cu_seqlens: npt.ArrayLike,
    seq_ids: npt.ArrayLike,
    query_pos: npt.ArrayLike,
    topk: int,
    *,
    key_scale: Optional[npt.ArrayLike] = None,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    num_segments: int = 0,
    compress_ratio: int = 1,
    out: Optional[npt.NDArray[np.int32]] = None,
    scores_out: Optional[npt.NDArray[np.float32]] = None,
) -> npt.NDArray[np.int32]:
    """:func:`indexer_topk` over a packed batch: sequence ``s`` owns key rows
    ``cu_seqlens[s] .. cu_seqlens[s + 1]``; query ``i`` belongs to sequence
    ``seq_ids[i]`` at ``query_pos[i]`` within it; rows are offsets from the start
    of each query's sequence."""

def indexer_topk_paged(
    index_q: npt.ArrayLike,
    weights: npt.ArrayLike,
    kv_cache: npt.ArrayLike,
    block_table: npt.ArrayLike,
    seq_lens: npt.ArrayLike,
    seq_ids: npt.ArrayLike,
    query_pos: npt.ArrayLike,
    topk: int,
    *,
    page_layout: str = "dense",
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    num_segments: int = 0,
    compress_ratio: int = 1,
    out: Optional[npt.NDArray[np.int32]] = None,
    scores_out: Optional[npt.NDArray[np.float32]] = None,
) -> npt.NDArray[np.int32]:
    """:func:`indexer_topk` over an engine's paged key cache, read in place.

    ``page_layout="dense"``: ``kv_cache [num_blocks, block_size, d]`` pages of float32 /
    float16 / bfloat16 / float8_e4m3fn. ``page_layout="fp8_scaled"``: vLLM's DSA
    index-K pages, uint8 ``[num_blocks, block_size, 1, d + 4]`` or ``[num_blocks, block_size, d + 4]`` (each page the
    ``block_size × d`` e4m3fn bytes, then ``block_size`` float32 scales). The
    block axis may be strided. ``block_table`` int32 ``[n_seqs, max_blocks]``
    (only the first ``ceil(seq_lens[s] / block_size)`` entries are read). Pages
    are never converted: a cache in non-native byte order is refused (naming
    ``kv_cache``; pass ``kv_cache.astype(kv_cache.dtype.newbyteorder('='))``);
    misaligned pages are read in place, byte by byte.
    """

def indexer_scores(
    index_q: npt.ArrayLike,
    weights: npt.ArrayLike,
    index_k: npt.ArrayLike,
    query_pos: npt.ArrayLike,
    *,
    key_scale: Optional[npt.ArrayLike] = None,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    compress_ratio: int = 1,
    out: Optional[npt.NDArray[np.float32]] = None,
) -> npt.NDArray[np.float32]:
    """Every query's exact score of every key it sees, float32 ``[n_queries, n_keys]`` (NaN past
    each context): what :func:`indexer_topk` ranks, bit for bit."""

def indexer_magnitudes(
    index_q: npt.ArrayLike,
    weights: npt.ArrayLike,
    index_k: npt.ArrayLike,
    query_pos: npt.ArrayLike,
    *,
    key_scale: Optional[npt.ArrayLike] = None,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    compress_ratio: int = 1,
    out: Optional[npt.NDArray[np.float32]] = None,
) -> npt.NDArray[np.float32]:
    """Each :func:`indexer_scores` entry's error scale ``|c_t| * sum_h |w_h| * sum_i |q_hi * k_ti|``
    (the ``magnitudes`` of :func:`check_topk`), float32 ``[n_queries, n_keys]``, NaN past each context."""

def check_topk(
    scores: npt.ArrayLike,
    rows: npt.ArrayLike,
    context_lens: Optional[npt.ArrayLike] = None,
    *,
    topk: Optional[int] = None,
    atol: float = 0.0,
    rtol: float = 0.0,
    magnitudes: Optional[npt.ArrayLike] = None,
    slots: Optional["GlobalSlots"] = None,
    filler: str = "-1",
) -> dict[str, Any]:
    """Whether each of an engine's top-k rows is a correct selection of its exact scores.

    ``scores`` float32 ``[n_rows, n_positions]``; ``rows`` int32/int64 ``[n_rows, width]``
    (any order, negative entries padding), row-relative or, with ``slots``, global slot ids;
    ``context_lens [n_rows]``; ``topk`` defaults to ``width``. A row is correct iff its valid
    entries come first, are distinct, causal, exactly ``min(topk, L)``, and every selected
    position scores at least every unselected one up to ``e_t = atol + rtol * magnitudes[t]``
    on each side. Returns ``rows``, ``correct``, ``wrong``, ``by_reason`` (``padding_hole``,
    ``duplicate``, ``not_causal``, ``not_in_table``, ``wrong_count``, ``wrong_selection``)
    and ``details`` (one entry per wrong row). ``filler`` is the engine's rule for the slots
    it has no position for: ``"-1"`` (negative entries, after the valid ones),
    ``"past_context"`` (entries at or past ``L``, or negative, anywhere) or ``"repeat"``
    (repeats of an earlier valid entry, anywhere); a row's not-causal entries are one
    problem (``n_slots``, ``context``), its duplicates alike.
    """

def block_scores(
    index_q: npt.ArrayLike,
    index_k: npt.ArrayLike,
    query_pos: npt.ArrayLike,
    config: Optional[BlockSparseConfig] = None,
    *,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    out: Optional[npt.NDArray[np.float32]] = None,
) -> npt.NDArray[np.float32]:
    """Every row's exact block scores, what block selection ranks (bit for bit): float32
    ``[n_queries, n_kv_heads, ceil(n_positions / block_size)]``, entry ``b`` the max of
    ``q . k`` over block ``b``'s visible positions (-inf when all are NaN), NaN past the row's
    visible blocks. ``index_q [n_queries, n_kv_heads, d]``, ``query_pos [n_queries]`` (one
    integer for one query)."""

def block_magnitudes(
    index_q: npt.ArrayLike,
    index_k: npt.ArrayLike,
    query_pos: npt.ArrayLike,
    config: Optional[BlockSparseConfig] = None,
    *,
    key_format: Optional[str] = None,
    query_format: Optional[str] = None,
    out: Optional[npt.NDArray[np.float32]] = None,
) -> npt.NDArray[np.float32]:
    """The error scale of every :func:`block_scores` entry: the max of ``sum_i |q_i * k_i|`` over
    the block's visible positions (the ``magnitudes`` of :func:`check_blocks`)."""

@final
class GlobalSlots:
    """How an engine wrote its rows as global cache slots (vLLM's
    ``triton_convert_req_index_to_global_index``): position ``t`` of request ``r`` is slot
    ``block_table[r, t // block_size] * block_stride_rows + t % block_size``; a prefill row
    (``prefill_req_ids[row] >= 0``) holds ``workspace_starts[prefill_req_ids[row]] + t``.
    ``req_ids`` names each checked row's request; MiniMax-M3's physical block ids are the case
    ``block_size=1``. An entry naming no position of its request is reported ``not_in_table``.
    The parameters are judged against the rows when a check uses them. With ``dcp_size > 1``
    (decode context parallelism, tokens dealt ``dcp_interleave`` at a time), ``block_table``
    is ``[dcp_size, n_requests, max_blocks]`` and the rows are the ranks' rows side by side.
    """

    def __new__(
        cls,
        block_table: npt.ArrayLike,
        req_ids: npt.ArrayLike,
        block_size: int,
        *,
        block_stride_rows: Optional[int] = None,
        prefill_req_ids: Optional[npt.ArrayLike] = None,
        workspace_starts: Optional[npt.ArrayLike] = None,
        dcp_size: Optional[int] = None,
        dcp_interleave: Optional[int] = None,
    ) -> "GlobalSlots": ...
    def positions(self, rows: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """The engine's ``rows [n_rows, width]`` read back through the map as the checkers read them:
        int64 row-relative positions, ``-1`` for padding, ``2**63 - 1`` for an entry that maps to no
        position of its row's request."""

def check_blocks(
    block_scores: npt.ArrayLike,
    rows: npt.ArrayLike,
    visible_blocks: npt.ArrayLike,
    config: Optional[BlockSparseConfig] = None,
    *,
    atol: float = 0.0,
    rtol: float = 0.0,
    magnitudes: Optional[npt.ArrayLike] = None,
    slots: Optional[GlobalSlots] = None,
    head_major: bool = False,
) -> dict[str, Any]:
    """Whether each of an engine's block-selection rows (MiniMax-M3) is correct under ``config``.

    3-D, as :func:`block_scores` / :func:`block_sparse_select` give them: ``block_scores``
    float32 ``[n_queries, n_kv_heads, n_blocks]``, ``rows`` ``[n_queries, n_kv_heads, width]``
    (``[n_kv_heads, n_queries, width]`` with ``head_major=True``), ``visible_blocks
    [n_queries]``; report row ``i * n_kv_heads + h``. Or 2-D, one row per (query, head):
    ``block_scores [n_rows, n_blocks]``, ``rows`` int32/int64 ``[n_rows, width]`` in any order,
    logical or (with ``slots``) physical ids; ``visible_blocks [n_rows]``. Correct iff
    every forced block is present, exactly ``min(max(top_blocks, #forced), n)`` distinct blocks
    ``0 <= b < n``, valid entries first, and every chosen free block scores at least every
    rejected free one up to the tolerance of :func:`check_topk`. The report is
    :func:`check_topk`'s, with ``missing_forced`` among its reasons.
    """

def check_witnesses(
    before: npt.ArrayLike,
    after: npt.ArrayLike,
    context_lens: npt.ArrayLike,
    num_segments: int,
) -> dict[str, Any]:
    """Whether an engine's in-place witness call (``scatter_topology_witnesses_``) wrote exactly
    what the rule writes: ``before`` and ``after`` the ``[rows, topk]`` buffer around the call.
    A wrong row names the contract it breaks: ``prefix_changed``, ``wrong_witness`` (the slot,
    the rule's witness, the engine's entry and why it is wrong) or ``tail_changed``. Refusals
    are ``WitnessError``. The serving layout (``keep = max(topk - S, 0)``); an
    ``apply_topology_witnesses`` call with another ``learned_keep`` / ``max_replacements`` is
    checked by ``np.array_equal`` with :func:`apply_topology_witnesses`.
    """

def simd_level() -> str:
    """The best SIMD level the kernels dispatched to on this CPU: "avx512" (block selection,
    the indexer and attention use it; the other kernels AVX2), "avx2" or "scalar"
    (`KVSELECT_SIMD=avx2` or `=scalar` caps it)."""

def _fma_floor(iters: int) -> tuple[int, float]:
    """Benchmarks' floor (private): ``iters`` steps of a register-resident FMA loop on every
    pool thread at the best SIMD level; returns ``(flops, checksum)``, the caller times the
    call."""

# DeepSeek-V4's attention sets, vLLM's combined index rows, GLM-5-Next's pools (src/compressed/)

def window_positions(
    query_pos: npt.ArrayLike,
    window_size: int,
    *,
    out: Optional[npt.NDArray[np.int32]] = None,
) -> npt.NDArray[np.int32]:
    """Each query's sliding window ``[max(0, p - W + 1), p]`` ascending, then -1: int32
    ``[n_queries, window_size]``."""

def visible_entries(
    query_pos: npt.ArrayLike,
    compress_ratio: int,
    n_entries: int,
    *,
    out: Optional[npt.NDArray[np.int32]] = None,
) -> npt.NDArray[np.int32]:
    """Every compressed entry each query sees, ``0 .. min((p + 1) // m, n_entries)``, then -1:
    int32 ``[n_queries, n_entries]`` (an HCA query's entries)."""

def compressed_entry_tokens(
    entries: npt.ArrayLike,
    compress_ratio: int,
    *,
    overlap: bool,
    out: Optional[npt.NDArray[np.int32]] = None,
) -> npt.NDArray[np.int32]:
    """The tokens ``[start, end)`` each entry covers, int32 ``entries.shape + (2,)``: CSA's
    overlapping ``[max(0, m(w - 1)), m(w + 1))`` or HCA's ``[m w, m(w + 1))``; -1 is (-1, -1)."""

def expand_entries(
    entry_rows: npt.ArrayLike,
    query_pos: npt.ArrayLike,
    compress_ratio: int,
    *,
    tail: bool = False,
    width: Optional[int] = None,
    out: Optional[npt.NDArray[np.int32]] = None,
) -> npt.NDArray[np.int32]:
    """Selected entries expanded to their tokens (GLM-5-Next's pools), the visible incomplete
    tail appended with ``tail``, -1 to ``width``: int32 ``[n_queries, width]``."""

def combine_topk_swa_indices(
    topk_indices: npt.ArrayLike,
    query_start_loc: npt.ArrayLike,
    seq_lens: npt.ArrayLike,
    gather_lens: npt.ArrayLike,
    window_size: int,
    compress_ratio: int,
    topk: int,
    M: int,
    N: int,
    *,
    out: Optional[npt.NDArray[np.int32]] = None,
    lens_out: Optional[npt.NDArray[np.int32]] = None,
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]]:
    """vLLM's ``combine_topk_swa_indices`` (DeepSeek-V4 sparse prefill): ``(combined_indices
    [num_tokens, roundup(topk + window_size, 128)], combined_lens [num_tokens])``, int32."""
