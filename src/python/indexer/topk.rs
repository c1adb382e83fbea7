//! The lightning indexer's top-k: single-sequence, packed, and over an
//! engine's paged key cache read in place.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::call::PoolScore;
use crate::indexer::{self, PagedInputs};
use crate::indexer::{Activation, RowLayout};
use crate::python::args::{
    ndarrays, positions, positions_along, refuse_extra_keywords, AsFormatArg, KeyFormat, Named,
    Obj, Opt, PageLayoutName, QueryFormat, I32, I32_MAX, S,
};
use crate::python::cache::{Paged, PagedArgs};

use super::call::{family, queries, ratio, run_topk, segments, Call};

/// The lightning indexer's top-k (DeepSeek-V3.2/V4, GLM-5), single-sequence form.
///
/// For each query, the ``topk`` positions of ``[0, L)``, ``L = min(query_pos + 1, T)``, with the
/// largest ``score(t) = key_scale[t] * sum_h weights[h] * max(index_q[h] . index_k[t], 0)`` in
/// real arithmetic (ties to the lower position; the set ``kvselect check`` accepts at ``rtol=0``),
/// listed in rank order of the float32 scores ``scores_out`` reports (score descending, ties to
/// the lower position, -0.0 == +0.0, NaN last), then -1. The float32 scores screen; the near
/// ties their rounding could misplace at the row's threshold are re-scored in float64 (every
/// product exact), so a row differs from the float32 scores' own top-k only there.
/// With ``compress_ratio=m`` each key is a compressed entry of ``m`` tokens (DeepSeek-V4's CSA:
/// 4, HCA: 128; GLM-5-Next's pools: 16): ``query_pos`` stays the token position and the query
/// sees ``L = min((query_pos + 1) // m, T)`` entries (none yet: a row of -1).
///
/// Every array is checked axis by axis (a transposed or reshaped ``weights`` is refused, naming
/// both shapes). A dense array in non-native byte order (``'>f2'``, ``'>u2'`` bits), misaligned
/// or not C-contiguous is copied once to a native, aligned one (as float64 is converted to
/// float32); the values read are the same. Any array argument may be a DLPack tensor
/// (torch, JAX, CuPy) in CPU memory, read in place.
///
/// Parameters
/// ----------
/// index_q : array_like, [n_queries, H, d]
///     The index queries: float32, float16, or ``ml_dtypes`` bfloat16 / float8_e4m3fn, read in
///     place; a raw ``uint16`` / ``uint8`` view needs ``query_format``.
/// weights : array_like of float32, [n_queries, H], or None
///     The head weights, with the softmax scale, ``H**-0.5`` and any query scale folded in.
///     None: no weights (Qwen's QSA, MiniMax's MSA), every head's weight 1 (the same rows as
///     weights of one, bit for bit).
/// index_k : array_like, [T, d]
///     The index keys, in the formats ``index_q`` takes (raw views need ``key_format``).
/// query_pos : array_like of int, [n_queries], or int
///     Each query's (token) position; one integer for a batch of one query.
/// topk : int
///     The row width, at most ``2**31 - 1``.
/// key_scale : array_like of float32, [T], or float, optional
///     Per-key scales (fp8 keys' dequantisation scales), or one number for every key (a
///     per-tensor scale: a Python or NumPy float, or a 0-D array); None is 1.
/// key_format, query_format : str, optional
///     The format of a raw ``uint16`` / ``uint8`` view: "bfloat16", "float16" or
///     "float8_e4m3fn". Not needed (and checked against the dtype) for typed arrays.
/// num_segments : int, optional
///     ``S`` in 1..=64 returns the reserved-tail witness row (the top ``topk - S`` then the
///     witnesses of ``scatter_topology_witnesses``); 0 (default) is off.
/// compress_ratio : int, optional
///     Tokens per key, at least 1 (default 1: token-level keys).
/// activation : str, optional
///     "relu" (default) or "none" (MiniMax's MSA: ``score(t) = key_scale[t] * sum_h weights[h]
///     * (index_q[h] . index_k[t])``, negative scores included).
/// force_first, force_last : int, optional
///     The first ``force_first`` and last ``force_last`` of a row's ``L`` visible keys are in
///     the row whenever it cannot hold all ``L`` (NVIDIA/cudnn-frontend#838's forced entries),
///     inside the budget: the rest of it is the best of the keys between them. A row with ``L
///     <= topk - num_segments`` holds every visible key once, forced or not. Their sum must fit
///     ``topk - num_segments`` (default 0: none).
/// row_layout : str, optional
///     "rank" (default): rank order of the float32 scores (forced entries by their scores too),
///     then -1. "ascending": cuDNN's layout, positions ascending and compact, then -1 (its
///     ``topk_length`` is ``(rows >= 0).sum(-1)``).
/// score_pool : int, optional
///     The score pool (MiniMax's MSA: 128): blocks of ``score_pool`` visible keys, the last one
///     partial, each scored by the largest of its keys' scores (NaN absent, a block of NaN
///     -inf; real arithmetic, as the keys are); the row then holds the ``topk`` best block ids
///     (ties to the lower block), ``force_first`` / ``force_last`` count blocks, and
///     ``scores_out`` receives the blocks' float32 scores. Default 1: no pool. Not with
///     ``num_segments``.
/// score_type : str, optional
///     How the pool scores a block: "max" (default) or "lse", SGLang's MiniMax-M3 selector's
///     ``ln sum_t exp(sm_scale * score(t))`` over the block's keys (a NaN key makes the block
///     -inf), exact up to about ``1e-7`` of the log (the project's exp; docs/indexer.md).
///     Needs ``score_pool >= 2``.
/// sm_scale : float, optional
///     The scores' scale inside the exponential, finite and above 0, read as float32;
///     ``1 / sqrt(d)`` by default (SGLang's). Only with ``score_type="lse"``.
/// out : ndarray of int32, [n_queries, topk], optional
///     Written and returned: C-contiguous, writeable, aligned, native byte order, not
///     overlapping any input (else refused, nothing written).
/// scores_out : ndarray of float32, [n_queries, topk], optional
///     Receives each entry's score (NaN where the row holds -1); the same rules as ``out``.
///
/// Returns
/// -------
/// ndarray of int32, [n_queries, topk]
///     The rows, row-relative positions in rank order, then -1 (then the witnesses).
///
/// Raises
/// ------
/// SelectionError
///     (a ValueError; ``.argument`` names the argument) on a shape that does not fit the others,
///     ``d = 0``, more than ``2**31 - 1`` keys, a negative ``query_pos``, ``topk`` or
///     ``num_segments`` out of range, ``compress_ratio < 1``, an unknown ``activation`` or
///     ``row_layout``, forced entries past the budget, a format that does not match the
///     dtype, a GPU DLPack tensor (move it with ``.cpu()``), or an output that cannot be written
///     or overlaps an input. Nothing is written.
/// TypeError
///     On an argument of the wrong type or dtype (a float position, a complex array, a bare
///     PyCapsule).
#[pyfunction]
#[pyo3(
    signature = (index_q, weights, index_k, query_pos, topk, *, key_scale=None, key_format=None,
                 query_format=None, num_segments=None, compress_ratio=None, activation=None, force_first=None,
                 force_last=None, row_layout=None, score_pool=None, score_type=None, sm_scale=None, out=None,
                 scores_out=None),
    text_signature = "(index_q, weights, index_k, query_pos, topk, *, key_scale=None, \
                      key_format=None, query_format=None, num_segments=0, compress_ratio=1, \
                      activation='relu', force_first=0, force_last=0, row_layout='rank', score_pool=1, \
                      score_type='max', sm_scale=None, out=None, scores_out=None)"
)]
pub(super) fn indexer_topk<'py>(
    py: Python<'py>,
    index_q: &Obj<'py>,
    weights: &Obj<'py>,
    index_k: &Obj<'py>,
    query_pos: &Obj<'py>,
    topk: &Obj<'py>,
    key_scale: Opt<'_, 'py>,
    key_format: Option<Named<KeyFormat>>,
    query_format: Option<Named<QueryFormat>>,
    num_segments: Opt<'_, 'py>,
    compress_ratio: Opt<'_, 'py>,
    activation: Option<Named<Activation>>,
    force_first: Opt<'_, 'py>,
    force_last: Opt<'_, 'py>,
    row_layout: Option<Named<RowLayout>>,
    score_pool: Opt<'_, 'py>,
    score_type: Option<Named<PoolScore>>,
    sm_scale: Option<f64>,
    out: Opt<'_, 'py>,
    scores_out: Opt<'_, 'py>,
) -> PyResult<I32<'py>> {
    let common = (index_q, weights, index_k, query_pos, topk);
    let mut call = Call::new(
        common,
        (
            key_scale,
            key_format.format_arg(),
            query_format.format_arg(),
            num_segments,
        ),
    )?;
    call.ratio = ratio(compress_ratio)?;
    let pool = (score_pool, score_type, sm_scale);
    let opts = family(
        (activation, force_first, force_last, row_layout, pool),
        call.shape.d,
    )?;
    let (shape, topk, segs) = (call.shape, call.topk, call.segs);
    call.run(py, (out, scores_out), |inputs, o, s| {
        indexer::indexer_topk_with_into(&shape, inputs, topk, segs, &opts, o, s)
    })
}

/// The lightning indexer's top-k over a packed batch, serving-engine style.
///
/// The keys of all sequences are concatenated in ``index_k`` (``key_scale`` alike), sequence
/// ``s`` owning rows ``cu_seqlens[s] .. cu_seqlens[s + 1]``; query ``i`` belongs to sequence
/// ``seq_ids[i]`` at position ``query_pos[i]`` within it, sees only its own sequence's keys,
/// and its row holds offsets from the start of its sequence. Otherwise as
/// :func:`indexer_topk`, row for row (with ``compress_ratio``, each sequence's rows are its
/// compressed entries).
///
/// Parameters
/// ----------
/// index_q, weights, index_k : array_like
///     As :func:`indexer_topk` takes them; ``index_k`` is ``[n_keys, d]``, every sequence's keys.
/// cu_seqlens : array_like of int, [n_seqs + 1]
///     Non-decreasing key offsets from 0 to ``n_keys``.
/// seq_ids : array_like of int, [n_queries]
///     Each query's sequence.
/// query_pos : array_like of int, [n_queries], or int
///     Each query's position within its sequence; one integer for one query.
/// topk, key_scale, key_format, query_format, num_segments, compress_ratio : optional
///     As :func:`indexer_topk` takes them.
/// activation, force_first, force_last, row_layout, score_pool, score_type, sm_scale : optional
///     As :func:`indexer_topk` takes them.
/// out, scores_out : ndarray, [n_queries, topk], optional
///     As :func:`indexer_topk` takes them.
///
/// Returns
/// -------
/// ndarray of int32, [n_queries, topk]
///     Each query's row, offsets within its sequence, in rank order, then -1.
///
/// Raises
/// ------
/// SelectionError
///     (a ValueError; ``.argument`` names the argument) as :func:`indexer_topk`, and on
///     ``cu_seqlens`` that do not rise from 0 to the keys, or a ``seq_ids`` entry past them.
///     Nothing is written.
/// TypeError
///     On an argument of the wrong type or dtype.
#[pyfunction]
#[pyo3(
    signature = (index_q, weights, index_k, cu_seqlens, seq_ids, query_pos, topk, *, key_scale=None,
                 key_format=None, query_format=None, num_segments=None, compress_ratio=None,
                 activation=None, force_first=None, force_last=None, row_layout=None, score_pool=None,
                 score_type=None, sm_scale=None, out=None, scores_out=None),
    text_signature = "(index_q, weights, index_k, cu_seqlens, seq_ids, query_pos, topk, *, \
                      key_scale=None, key_format=None, query_format=None, num_segments=0, \
                      compress_ratio=1, activation='relu', force_first=0, force_last=0, \
                      row_layout='rank', score_pool=1, score_type='max', sm_scale=None, out=None, \
                      scores_out=None)"
)]
pub(super) fn indexer_topk_packed<'py>(
    py: Python<'py>,
    index_q: &Obj<'py>,
    weights: &Obj<'py>,
    index_k: &Obj<'py>,
    cu_seqlens: &Obj<'py>,
    seq_ids: &Obj<'py>,
    query_pos: &Obj<'py>,
    topk: &Obj<'py>,
    key_scale: Opt<'_, 'py>,
    key_format: Option<Named<KeyFormat>>,
    query_format: Option<Named<QueryFormat>>,
    num_segments: Opt<'_, 'py>,
    compress_ratio: Opt<'_, 'py>,
    activation: Option<Named<Activation>>,
    force_first: Opt<'_, 'py>,
    force_last: Opt<'_, 'py>,
    row_layout: Option<Named<RowLayout>>,
    score_pool: Opt<'_, 'py>,
    score_type: Option<Named<PoolScore>>,
    sm_scale: Option<f64>,
    out: Opt<'_, 'py>,
    scores_out: Opt<'_, 'py>,
) -> PyResult<I32<'py>> {
    let common = (index_q, weights, index_k, query_pos, topk);
    let mut call = Call::new(
        common,
        (
            key_scale,
            key_format.format_arg(),
            query_format.format_arg(),
            num_segments,
        ),
    )?;
    call.ratio = ratio(compress_ratio)?;
    call.raw.extend(ndarrays(&[cu_seqlens, seq_ids]));
    let (cu, sid) = (
        positions(S, cu_seqlens, "cu_seqlens")?,
        positions_along(S, seq_ids, "seq_ids", ("n_queries", call.shape.n_queries))?,
    );
    let pool = (score_pool, score_type, sm_scale);
    let opts = family(
        (activation, force_first, force_last, row_layout, pool),
        call.shape.d,
    )?;
    let (shape, topk, segs) = (call.shape, call.topk, call.segs);
    call.run(py, (out, scores_out), |inputs, o, s| {
        indexer::indexer_topk_packed_with_into(&shape, inputs, &cu, &sid, topk, segs, &opts, o, s)
    })
}

/// The lightning indexer's top-k over an engine's paged key cache, read in place.
///
/// Query ``i`` belongs to sequence ``seq_ids[i]`` at ``query_pos[i]`` within it and its row
/// holds positions within it. The pages are never converted: a cache in non-native byte order is
/// refused (naming ``kv_cache``: pass ``kv_cache.astype(kv_cache.dtype.newbyteorder('='))``);
/// misaligned pages are read in place, byte by byte. With ``compress_ratio=m`` the pages hold
/// compressed entries (DeepSeek-V4's indexer cache: entry ``c`` at ``block_table[s, c //
/// block_size] * block_size + c % block_size``) and ``seq_lens`` counts entries.
///
/// Parameters
/// ----------
/// index_q, weights : array_like
///     As :func:`indexer_topk` takes them.
/// kv_cache : array_like
///     ``page_layout="dense"``: ``[num_blocks, block_size, d]`` pages of float32 / float16 /
///     bfloat16 / float8_e4m3fn (raw uint16 / uint8 with ``key_format``).
///     ``page_layout="fp8_scaled"``: vLLM's DSA index-K pages, uint8 ``[num_blocks,
///     block_size, 1, d + 4]`` or ``[num_blocks, block_size, d + 4]``, each page the
///     ``block_size × d`` e4m3fn bytes then ``block_size`` float32 scales. The block axis may
///     be strided.
/// block_table : array_like of int32, [n_seqs, max_blocks]
///     Each sequence's pages; only the first ``ceil(seq_lens[s] / block_size)`` entries of a
///     row are read.
/// seq_lens : array_like of int, [n_seqs]
///     Each sequence's keys (entries with ``compress_ratio``).
/// seq_ids : array_like of int, [n_queries]
///     Each query's sequence.
/// query_pos : array_like of int, [n_queries], or int
///     Each query's position within its sequence; one integer for one query.
/// topk, key_format, query_format, num_segments, compress_ratio : optional
///     As :func:`indexer_topk` takes them.
/// activation, force_first, force_last, row_layout, score_pool, score_type, sm_scale : optional
///     As :func:`indexer_topk` takes them.
/// page_layout : str, optional
///     "dense" (default) or "fp8_scaled".
/// out, scores_out : ndarray, [n_queries, topk], optional
///     As :func:`indexer_topk` takes them.
///
/// Returns
/// -------
/// ndarray of int32, [n_queries, topk]
///     Each query's row, positions within its sequence, in rank order, then -1.
///
/// Raises
/// ------
/// SelectionError
///     (a ValueError; ``.argument`` names the argument) as :func:`indexer_topk`, and on a
///     block-table entry that would be read and is negative or past the cache, a block-table row
///     shorter than its sequence needs, a ``seq_ids`` entry past ``seq_lens``, or a cache in
///     non-native byte order. Nothing is written.
/// TypeError
///     On an argument of the wrong type or dtype.
#[pyfunction]
#[pyo3(
    signature = (index_q, weights, kv_cache, block_table, seq_lens, seq_ids, query_pos, topk, *,
                 page_layout=Named::known(PageLayoutName::Dense), key_format=None, query_format=None, num_segments=None,
                 compress_ratio=None, activation=None, force_first=None, force_last=None, row_layout=None,
                 score_pool=None, score_type=None, sm_scale=None, out=None, scores_out=None, **renamed),
    text_signature = "(index_q, weights, kv_cache, block_table, seq_lens, seq_ids, query_pos, topk, *, \
                      page_layout='dense', key_format=None, query_format=None, num_segments=0, \
                      compress_ratio=1, activation='relu', force_first=0, force_last=0, \
                      row_layout='rank', score_pool=1, score_type='max', sm_scale=None, out=None, \
                      scores_out=None)"
)]
pub(super) fn indexer_topk_paged<'py>(
    py: Python<'py>,
    index_q: &Obj<'py>,
    weights: &Obj<'py>,
    kv_cache: &Obj<'py>,
    block_table: &Obj<'py>,
    seq_lens: &Obj<'py>,
    seq_ids: &Obj<'py>,
    query_pos: &Obj<'py>,
    topk: &Obj<'py>,
    page_layout: Named<PageLayoutName>,
    key_format: Option<Named<KeyFormat>>,
    query_format: Option<Named<QueryFormat>>,
    num_segments: Opt<'_, 'py>,
    compress_ratio: Opt<'_, 'py>,
    activation: Option<Named<Activation>>,
    force_first: Opt<'_, 'py>,
    force_last: Opt<'_, 'py>,
    row_layout: Option<Named<RowLayout>>,
    score_pool: Opt<'_, 'py>,
    score_type: Option<Named<PoolScore>>,
    sm_scale: Option<f64>,
    out: Opt<'_, 'py>,
    scores_out: Opt<'_, 'py>,
    renamed: Option<&Bound<'py, PyDict>>,
) -> PyResult<I32<'py>> {
    let was = [("layout", "layout= is now page_layout=")];
    refuse_extra_keywords("indexer_topk_paged", renamed, &was)?;
    let (q, w, [n, h, dq]) = queries(index_q, weights, query_format.format_arg())?;
    let args = PagedArgs {
        kv_cache,
        block_table,
        seq_lens,
        seq_ids,
        query_pos,
    };
    let paged = Paged::new(args, &page_layout, key_format.format_arg(), (n, dq))?;
    let topk = S.count(topk, "topk", I32_MAX)?;
    let segs = segments(num_segments)?;
    let compress_ratio = ratio(compress_ratio)?;
    let pool = (score_pool, score_type, sm_scale);
    let opts = family((activation, force_first, force_last, row_layout, pool), dq)?;
    let inputs = PagedInputs {
        q: q.encoded()?,
        weights: w.slice()?,
        cache: paged.cache(),
        table: paged.table()?,
        seq_ids: &paged.seq_ids,
        query_pos: &paged.query_pos,
        compress_ratio,
    };
    let raw = ndarrays(&[seq_lens, seq_ids, query_pos]);
    let arrays = [
        &[q.untyped()][..],
        &w.untyped().into_iter().collect::<Vec<_>>(),
        &paged.untyped(),
        &raw.iter().collect::<Vec<_>>(),
    ]
    .concat();
    run_topk(
        py,
        &arrays,
        [n, topk],
        (out, scores_out),
        paged.work(n, h),
        |o, s| indexer::indexer_topk_paged_with_into(n, h, &inputs, topk, segs, &opts, o, s),
    )
}
