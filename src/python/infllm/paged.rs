//! InfLLM-v2's block scores and selection at decode over a paged cache of
//! compressed keys: `infllm_block_scores_paged` and `infllm_select_paged`
//! (both raise `SelectionError`), the cache, table, lengths and queries
//! read alike ([`PagedDecode`]).

use numpy::PyArrayDyn;
use pyo3::prelude::*;

use super::super::args::{KeyFormat, Named, Obj, Opt, PageLayoutName, QueryFormat, I32, I32_MAX, S};
use super::super::cache::PagedDecode;
use super::super::errors::refuse;
use super::config::config;
use crate::infllm::{self, Keep, Pooling};

type F32<'py> = Bound<'py, PyArrayDyn<f32>>;

/// :func:`infllm_block_scores` at decode, over an engine's paged cache of compressed
/// keys.
///
/// Sequence ``s`` decodes one query at position ``seq_lens[s] - 1``; its
/// ``(seq_lens[s] - 32) // 16 + 1`` compressed keys (0 below 32 tokens) are read in
/// place through its ``block_table`` row (compressed key ``j`` in row ``j % page_size``
/// of page ``block_table[s, j // page_size]``), a row every KV head's key. Row ``s``
/// equals :func:`infllm_block_scores` bit for bit on the same compressed keys laid out
/// densely (fp8 keys times their scales, as its ``ck_scale``), then NaN past the
/// sequence's own blocks (as its packed form pads).
///
/// Parameters
/// ----------
/// q : array_like, [n_seqs, n_q_heads, d]
///     Each sequence's decoding query.
/// kv_cache : array_like, [num_blocks, page_size, n_kv_heads * d]
///     The compressed keys' pages, read in place (any block stride; float32 and
///     bfloat16 pages without a copy), or uint8 pages of fp8 keys then one float32
///     scale per key (``page_layout='fp8_scaled'``).
/// block_table : array_like of int32, [n_seqs, max_blocks]
///     Logical page -> cache block, per sequence (entries past a sequence's compressed
///     keys are never read).
/// seq_lens : array_like of int, [n_seqs]
///     Tokens per sequence (the query's own included), each >= 1.
/// n_kv_heads : int
///     KV heads per compressed key.
/// init_blocks, local_blocks, pooling, scale
///     As :func:`infllm_block_scores`.
/// block_size, kernel_size, kernel_stride
///     As :func:`infllm_block_scores`.
/// page_layout : {'dense', 'fp8_scaled'}, optional
///     How a page holds its keys (as :func:`infllm_select_paged`).
/// key_format, query_format : str, optional
///     The formats of a raw cache and ``q``.
/// out : ndarray of float32, [n_seqs, n_kv_heads, max_blocks], optional
///     ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
///     aligned, native byte order, not overlapping any input (else refused, nothing written).
///
/// Returns
/// -------
/// ndarray of float32, [n_seqs, n_kv_heads, max_blocks]
///     ``max_blocks = ceil(max(seq_lens) / block_size)``; NaN past a sequence's own
///     blocks.
///
/// Raises
/// ------
/// SelectionError
///     (a ValueError; ``.argument`` names it) when the cache, table or lengths are
///     refused (``kv_cache``, ``block_table``, ``seq_lens``: a row too short for its
///     sequence's compressed keys, an entry read outside the cache, a sequence of no
///     token), ``n_kv_heads`` does not divide a row, ``q`` is not ``[n_seqs, n_q_heads,
///     d]`` or its heads are not a multiple of the KV heads (``q``), and as
///     :func:`infllm_block_scores` (``scale``, ``block_size``, ``kernel_size``,
///     ``kernel_stride``, ``pooling``).
///     Also when ``out`` is refused (its shape, layout, read-only, or overlapping an input).
/// TypeError
///     when ``out`` is not a float32 ndarray.
///
/// See Also
/// --------
/// infllm_select_paged : the blocks each decoding query reads.
/// infllm_block_scores : the dense and packed forms.
///
/// Examples
/// --------
/// >>> import numpy as np, kvselect
/// >>> rng = np.random.default_rng(0)
/// >>> ck = rng.standard_normal((63, 2, 8)).astype(np.float32)  # 1024 tokens' keys
/// >>> q = rng.standard_normal((1, 4, 8)).astype(np.float32)
/// >>> cache = ck.reshape(7, 9, 16)[::-1]  # pages of 9 keys, stored in reverse
/// >>> table = np.arange(6, -1, -1, dtype=np.int32)[None]
/// >>> s = kvselect.infllm_block_scores_paged(q, cache, table, [1024], 2, local_blocks=2)
/// >>> np.array_equal(s, kvselect.infllm_block_scores(q, ck, 1024, local_blocks=2))
/// True
#[pyfunction]
#[pyo3(
    signature = (q, kv_cache, block_table, seq_lens, n_kv_heads, *, init_blocks=None,
                 local_blocks=None, pooling=None, scale=None, page_layout=None,
                 key_format=None, query_format=None, block_size=None, kernel_size=None,
                 kernel_stride=None, out=None),
    text_signature = "(q, kv_cache, block_table, seq_lens, n_kv_heads, *, init_blocks=1, \
                      local_blocks=32, pooling='cuda', scale=None, page_layout='dense', \
                      key_format=None, query_format=None, block_size=64, kernel_size=32, \
                      kernel_stride=16, out=None)"
)]
#[allow(clippy::too_many_arguments)]
pub(in crate::python) fn infllm_block_scores_paged<'py>(
    py: Python<'py>,
    q: &Obj<'py>,
    kv_cache: &Obj<'py>,
    block_table: &Obj<'py>,
    seq_lens: &Obj<'py>,
    n_kv_heads: &Obj<'py>,
    init_blocks: Opt<'_, 'py>,
    local_blocks: Opt<'_, 'py>,
    pooling: Option<Named<Pooling>>,
    scale: Option<f64>,
    page_layout: Option<Named<PageLayoutName>>,
    key_format: Option<Named<KeyFormat>>,
    query_format: Option<Named<QueryFormat>>,
    block_size: Opt<'_, 'py>,
    kernel_size: Opt<'_, 'py>,
    kernel_stride: Opt<'_, 'py>,
    out: Opt<'_, 'py>,
) -> PyResult<F32<'py>> {
    let h = S.count(n_kv_heads, "n_kv_heads", I32_MAX)?;
    let formats = (page_layout, key_format, query_format);
    let c = PagedDecode::read(py, (q, kv_cache, block_table, seq_lens), h, formats)?;
    let options = (
        (init_blocks, local_blocks, 1),
        (block_size, kernel_size, kernel_stride),
        pooling,
        None,
    );
    let cfg = config(options, scale, c.d)?;
    // The output's width divides by `block_size`: refused here if 0.
    cfg.geometry.check()?;
    let nb = c.widest(|l| cfg.geometry.n_blocks(l))?;
    let heads = c.heads();
    let shape = [c.lens.len(), h, nb];
    c.run(py, out, &shape, c.work(), |qs, cache, table, o| {
        infllm::block_scores_paged_into(qs, cache, table, heads, &cfg, o)
    })
}

/// InfLLM-v2's block selection at decode, over an engine's paged cache of compressed
/// keys.
///
/// Sequence ``s`` decodes one query at position ``seq_lens[s] - 1``; its
/// ``(seq_lens[s] - 32) // 16 + 1`` compressed keys are read in place through its
/// ``block_table`` row (compressed key ``j`` in row ``j % page_size`` of page
/// ``block_table[s, j // page_size]``), as OpenBMB's SGLang backend for MiniCPM4 /
/// SALA keeps them (a pool of compressed keys and a per-request table). Equal, row for
/// row, to :func:`infllm_select` on the same compressed keys laid out densely (fp8 keys
/// times their scales).
///
/// Parameters
/// ----------
/// q : array_like, [n_seqs, n_q_heads, d]
///     Each sequence's decoding query.
/// kv_cache : array_like, [num_blocks, page_size, n_kv_heads * d]
///     The compressed keys' pages, read in place (any block stride), or uint8 pages of
///     fp8 keys then one float32 scale per key (``page_layout='fp8_scaled'``).
/// block_table : array_like of int32, [n_seqs, max_blocks]
///     Logical page -> cache block, per sequence.
/// seq_lens : array_like of int, [n_seqs]
///     Tokens per sequence (the query's own included), each >= 1.
/// n_kv_heads : int
///     KV heads per compressed key.
/// topk : int, optional
///     Blocks per row before the filter (MiniCPM4's 64), at least 1.
/// init_blocks, local_blocks, pooling, keep, scale
///     As :func:`infllm_select`.
/// block_size, kernel_size, kernel_stride
///     As :func:`infllm_select`.
/// page_layout : {'dense', 'fp8_scaled'}, optional
///     How a page holds its keys.
/// key_format, query_format : str, optional
///     The formats of a raw cache and ``q``.
/// out : ndarray of int32, [n_seqs, n_kv_heads, topk], optional
///     ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
///     aligned, native byte order, not overlapping any input (else refused, nothing written).
///
/// Returns
/// -------
/// ndarray of int32, [n_seqs, n_kv_heads, topk]
///     As :func:`infllm_select`.
///
/// Raises
/// ------
/// SelectionError
///     when the cache, table or lengths are refused (``kv_cache``, ``block_table``,
///     ``seq_lens``: a row too short for its sequence's compressed keys, an entry read
///     outside the cache, a sequence of no token), ``n_kv_heads`` does not divide a row,
///     ``q`` does not fit, and as :func:`infllm_select`.
///     Also when ``out`` is refused (its shape, layout, read-only, or overlapping an input).
/// TypeError
///     when ``out`` is not an int32 ndarray.
///
/// See Also
/// --------
/// infllm_select : the dense and packed forms.
/// infllm_block_scores_paged : the block scores these rows rank.
///
/// Examples
/// --------
/// >>> import numpy as np, kvselect
/// >>> rng = np.random.default_rng(0)
/// >>> ck = rng.standard_normal((63, 2, 8)).astype(np.float32)  # 1024 tokens' keys
/// >>> q = rng.standard_normal((1, 4, 8)).astype(np.float32)
/// >>> cache = ck.reshape(7, 9, 16)[::-1]  # pages of 9 keys, stored in reverse
/// >>> table = np.arange(6, -1, -1, dtype=np.int32)[None]
/// >>> rows = kvselect.infllm_select_paged(q, cache, table, [1024], 2, 4, local_blocks=2)
/// >>> np.array_equal(rows, kvselect.infllm_select(q, ck, 1024, 4, local_blocks=2))
/// True
#[pyfunction]
#[pyo3(
    signature = (q, kv_cache, block_table, seq_lens, n_kv_heads, topk=None, *, init_blocks=None,
                 local_blocks=None, pooling=None, keep=None, scale=None, page_layout=None,
                 key_format=None, query_format=None, block_size=None, kernel_size=None,
                 kernel_stride=None, out=None),
    text_signature = "(q, kv_cache, block_table, seq_lens, n_kv_heads, topk=64, *, \
                      init_blocks=1, local_blocks=32, pooling='cuda', keep='through_current', \
                      scale=None, page_layout='dense', key_format=None, query_format=None, \
                      block_size=64, kernel_size=32, kernel_stride=16, out=None)"
)]
#[allow(clippy::too_many_arguments)]
pub(in crate::python) fn infllm_select_paged<'py>(
    py: Python<'py>,
    q: &Obj<'py>,
    kv_cache: &Obj<'py>,
    block_table: &Obj<'py>,
    seq_lens: &Obj<'py>,
    n_kv_heads: &Obj<'py>,
    topk: Opt<'_, 'py>,
    init_blocks: Opt<'_, 'py>,
    local_blocks: Opt<'_, 'py>,
    pooling: Option<Named<Pooling>>,
    keep: Option<Named<Keep>>,
    scale: Option<f64>,
    page_layout: Option<Named<PageLayoutName>>,
    key_format: Option<Named<KeyFormat>>,
    query_format: Option<Named<QueryFormat>>,
    block_size: Opt<'_, 'py>,
    kernel_size: Opt<'_, 'py>,
    kernel_stride: Opt<'_, 'py>,
    out: Opt<'_, 'py>,
) -> PyResult<I32<'py>> {
    let h = S.count(n_kv_heads, "n_kv_heads", I32_MAX)?;
    let k = S.count_or(topk, "topk", I32_MAX, infllm::MINICPM4_TOP_K)?;
    if k == 0 {
        return Err(refuse(S, "topk", "topk must be at least 1 block"));
    }
    let formats = (page_layout, key_format, query_format);
    let c = PagedDecode::read(py, (q, kv_cache, block_table, seq_lens), h, formats)?;
    let options = (
        (init_blocks, local_blocks, k),
        (block_size, kernel_size, kernel_stride),
        pooling,
        keep,
    );
    let cfg = config(options, scale, c.d)?;
    let heads = c.heads();
    c.run(py, out, &[c.lens.len(), h, k], c.work(), |qs, cache, table, o| {
        infllm::select_paged_into(qs, cache, table, heads, &cfg, o)
    })
}
