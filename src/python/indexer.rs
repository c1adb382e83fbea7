//! The lightning indexer's top-k, single-sequence and packed (both raise
//! `SelectionError`).

use pyo3::prelude::*;

use numpy::PyUntypedArray;

use super::args::{
    detach, ndarrays, positions, positions_along, query_positions_for, Args, EncodedIn, In, Obj,
    Opt, I32,
};
use super::cache::{Paged, PagedArgs};
use super::errors::Domain;
use crate::attention::ArgumentError as Error;
use crate::indexer::{self, IndexerInputs, IndexerShape, PagedInputs};

const S: Args = Args(Domain::Selection);

/// The arguments both forms share, checked and borrowed.
struct Call<'py> {
    q: EncodedIn<'py>,
    w: In<'py, f32, 2>,
    k: EncodedIn<'py>,
    scale: Option<In<'py, f32, 0>>,
    /// A per-tensor `key_scale` (a scalar) as the per-key vector the core
    /// reads: the scalar for every key.
    scale_fill: Option<Vec<f32>>,
    pos: Vec<usize>,
    /// The ndarrays among the arguments read through a copy (`query_pos`,
    /// a packed batch's offsets): an output must not share their memory either.
    raw: Vec<Bound<'py, PyUntypedArray>>,
    shape: IndexerShape,
    topk: usize,
    segs: usize,
    /// Tokens per key (`compress_ratio`; 1 for token-level keys).
    ratio: usize,
}

/// `(index_q, weights, index_k, query_pos, topk)` and the keyword arguments
/// `(key_scale, key_format, query_format, num_segments)`.
type Common<'a, 'py> = (
    &'a Obj<'py>,
    &'a Obj<'py>,
    &'a Obj<'py>,
    &'a Obj<'py>,
    &'a Obj<'py>,
);
type Options<'a, 'py> = (Opt<'a, 'py>, Option<&'a str>, Option<&'a str>, Opt<'a, 'py>);

/// `index_q` `[n_queries, n_heads, d]` in its format and `weights`
/// float32 `[n_queries, n_heads]`, with `[n, h, d]`.
fn queries<'py>(
    index_q: &Obj<'py>,
    weights: &Obj<'py>,
    query_format: Option<&str>,
) -> PyResult<(EncodedIn<'py>, In<'py, f32, 2>, [usize; 3])> {
    let (q, _) = EncodedIn::new(S, index_q, "index_q", ("query_format", query_format))?;
    let dims = S.dims::<3>(q.untyped(), "index_q", "[n_queries, n_heads, d]")?;
    let w = S.input::<f32, 2>(weights, "weights", "[n_queries, n_heads]")?;
    let [n, h, _] = dims;
    S.axes("weights", &w.shape, &[("n_queries", n), ("H", h)])?;
    Ok((q, w, dims))
}

/// The `compress_ratio` keyword: None is 1 (token-level keys); 0 the core
/// refuses.
fn ratio(compress_ratio: Opt<'_, '_>) -> PyResult<usize> {
    S.count_or(compress_ratio, "compress_ratio", u32::MAX as u64, 1)
}

/// The `num_segments` keyword: None is 0 (off); past 64 the core refuses.
fn segments(num_segments: Opt<'_, '_>) -> PyResult<usize> {
    num_segments.map_or(Ok(0), |s| S.count_within(s, "num_segments", u64::MAX, 64))
}

impl<'py> Call<'py> {
    fn new(
        (q, w, k, pos, topk): Common<'_, 'py>,
        (scale, kf, qf, segs): Options<'_, 'py>,
    ) -> PyResult<Self> {
        let mut call = Call::inputs((q, w, k, pos), (scale, kf, qf))?;
        call.topk = S.count(topk, "topk", i32::MAX as u64)?;
        call.segs = segments(segs)?;
        Ok(call)
    }

    /// The scoring arguments alone (`topk` and `num_segments` left 0):
    /// `(index_q, weights, index_k, query_pos)` and `(key_scale,
    /// key_format, query_format)`.
    fn inputs(
        (q, w, k, pos): (&Obj<'py>, &Obj<'py>, &Obj<'py>, &Obj<'py>),
        (scale, kf, qf): (Opt<'_, 'py>, Option<&str>, Option<&str>),
    ) -> PyResult<Self> {
        let (q, w, [n, h, dq]) = queries(q, w, qf)?;
        let (k, _) = EncodedIn::new(S, k, "index_k", ("key_format", kf))?;
        let [t, d] = S.dims::<2>(k.untyped(), "index_k", "[n_keys, d]")?;
        S.same_d(dq, d, "index_k")?;
        // A scalar (0-D array, Python or NumPy float) is one scale for every
        // key; else one per key.
        let mut scale_fill = None;
        let scale = scale
            .map(|c| {
                let (c, shape) = S.input_dyn::<f32>(c, "key_scale")?;
                if shape.is_empty() {
                    scale_fill = Some(vec![c.slice()?[0]; t]);
                } else {
                    S.axes("key_scale", &shape, &[("n_keys", t)])?;
                }
                Ok::<_, PyErr>(c)
            })
            .transpose()?;
        let raw = ndarrays(&[pos]);
        let pos = query_positions_for(S, pos, n)?;
        let shape = IndexerShape {
            n_queries: n,
            n_heads: h,
            d,
            n_keys: t,
        };
        Ok(Call {
            q,
            w,
            k,
            scale,
            scale_fill,
            pos,
            raw,
            shape,
            topk: 0,
            segs: 0,
            ratio: 1,
        })
    }

    /// The arrays as the core reads them.
    fn borrowed(&self) -> PyResult<IndexerInputs<'_>> {
        Ok(IndexerInputs {
            q: self.q.encoded()?,
            weights: self.w.slice()?,
            k: self.k.encoded()?,
            key_scale: match &self.scale_fill {
                Some(v) => Some(&v[..]),
                None => self.scale.as_ref().map(|c| c.slice()).transpose()?,
            },
            query_pos: &self.pos,
            compress_ratio: self.ratio,
        })
    }

    /// Every array argument, as an output must not overlap them.
    fn arrays(&self) -> Vec<&Bound<'py, PyUntypedArray>> {
        let mut arrays = vec![self.q.untyped(), self.w.untyped(), self.k.untyped()];
        arrays.extend(self.scale.as_ref().map(|c| c.untyped()));
        arrays.extend(&self.raw);
        arrays
    }

    /// Multiply-adds of scoring every key for every query (for `detach`).
    fn work(&self) -> usize {
        let s = self.shape;
        s.n_queries
            .saturating_mul(s.n_keys)
            .saturating_mul(s.n_heads)
            .saturating_mul(s.d)
    }

    /// Runs `core` on the borrowed inputs (see [`run_topk`]).
    fn run(
        self,
        py: Python<'py>,
        outs: (Opt<'_, 'py>, Opt<'_, 'py>),
        core: impl FnOnce(&IndexerInputs<'_>, &mut [i32], Option<&mut [f32]>) -> Result<(), Error>
            + Send,
    ) -> PyResult<I32<'py>> {
        let arrays = self.arrays();
        let (inputs, work) = (self.borrowed()?, self.work());
        let shape = [self.shape.n_queries, self.topk];
        run_topk(py, &arrays, shape, outs, work, |o, s| core(&inputs, o, s))
    }
}

/// Runs a top-k `core` call into `out` (int32 `[n, topk]`) and `scores_out`
/// (float32, when given), both checked against every input array and each
/// other; returns the rows.
fn run_topk<'py>(
    py: Python<'py>,
    arrays: &[&Bound<'py, PyUntypedArray>],
    shape: [usize; 2],
    (out, scores_out): (Opt<'_, 'py>, Opt<'_, 'py>),
    work: usize,
    core: impl FnOnce(&mut [i32], Option<&mut [f32]>) -> Result<(), Error> + Send,
) -> PyResult<I32<'py>> {
    let mut out = S.output::<i32>(py, out, &shape, arrays)?;
    let arrays = [arrays, &[out.untyped()]].concat();
    let mut scores = scores_out
        .map(|s| S.buffer::<f32>(s, "scores_out", &shape, &arrays))
        .transpose()?;
    let (o, s) = (
        out.slice()?,
        scores.as_mut().map(|s| s.slice()).transpose()?,
    );
    detach(py, work, || core(o, s))?;
    Ok(out.finish())
}

/// The lightning indexer's top-k (DeepSeek-V3.2/V4, GLM-5), single-sequence form.
///
/// For each query, the ``topk`` positions of ``[0, L)``, ``L = min(query_pos + 1, T)``, with the
/// largest ``score(t) = key_scale[t] * sum_h weights[h] * max(index_q[h] . index_k[t], 0)``, in
/// rank order (score descending, ties to the lower position, -0.0 == +0.0, NaN last), then -1.
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
/// weights : array_like of float32, [n_queries, H]
///     The head weights, with the softmax scale, ``H**-0.5`` and any query scale folded in.
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
///     ``num_segments`` out of range, ``compress_ratio < 1``, a format that does not match the
///     dtype, a GPU DLPack tensor (move it with ``.cpu()``), or an output that cannot be written
///     or overlaps an input. Nothing is written.
/// TypeError
///     On an argument of the wrong type or dtype (a float position, a complex array, a bare
///     PyCapsule).
#[pyfunction]
#[pyo3(
    signature = (index_q, weights, index_k, query_pos, topk, *, key_scale=None, key_format=None,
                 query_format=None, num_segments=None, compress_ratio=None, out=None, scores_out=None),
    text_signature = "(index_q, weights, index_k, query_pos, topk, *, key_scale=None, \
                      key_format=None, query_format=None, num_segments=0, compress_ratio=1, out=None, \
                      scores_out=None)"
)]
fn indexer_topk<'py>(
    py: Python<'py>,
    index_q: &Obj<'py>,
    weights: &Obj<'py>,
    index_k: &Obj<'py>,
    query_pos: &Obj<'py>,
    topk: &Obj<'py>,
    key_scale: Opt<'_, 'py>,
    key_format: Option<&str>,
    query_format: Option<&str>,
    num_segments: Opt<'_, 'py>,
    compress_ratio: Opt<'_, 'py>,
    out: Opt<'_, 'py>,
    scores_out: Opt<'_, 'py>,
) -> PyResult<I32<'py>> {
    let common = (index_q, weights, index_k, query_pos, topk);
    let mut call = Call::new(common, (key_scale, key_format, query_format, num_segments))?;
    call.ratio = ratio(compress_ratio)?;
    let (shape, topk, segs) = (call.shape, call.topk, call.segs);
    call.run(py, (out, scores_out), |inputs, o, s| {
        indexer::indexer_topk_into(&shape, inputs, topk, segs, o, s)
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
                 key_format=None, query_format=None, num_segments=None, compress_ratio=None, out=None,
                 scores_out=None),
    text_signature = "(index_q, weights, index_k, cu_seqlens, seq_ids, query_pos, topk, *, \
                      key_scale=None, key_format=None, query_format=None, num_segments=0, \
                      compress_ratio=1, out=None, scores_out=None)"
)]
fn indexer_topk_packed<'py>(
    py: Python<'py>,
    index_q: &Obj<'py>,
    weights: &Obj<'py>,
    index_k: &Obj<'py>,
    cu_seqlens: &Obj<'py>,
    seq_ids: &Obj<'py>,
    query_pos: &Obj<'py>,
    topk: &Obj<'py>,
    key_scale: Opt<'_, 'py>,
    key_format: Option<&str>,
    query_format: Option<&str>,
    num_segments: Opt<'_, 'py>,
    compress_ratio: Opt<'_, 'py>,
    out: Opt<'_, 'py>,
    scores_out: Opt<'_, 'py>,
) -> PyResult<I32<'py>> {
    let common = (index_q, weights, index_k, query_pos, topk);
    let mut call = Call::new(common, (key_scale, key_format, query_format, num_segments))?;
    call.ratio = ratio(compress_ratio)?;
    call.raw.extend(ndarrays(&[cu_seqlens, seq_ids]));
    let (cu, sid) = (
        positions(S, cu_seqlens, "cu_seqlens")?,
        positions_along(S, seq_ids, "seq_ids", ("n_queries", call.shape.n_queries))?,
    );
    let (shape, topk, segs) = (call.shape, call.topk, call.segs);
    call.run(py, (out, scores_out), |inputs, o, s| {
        indexer::indexer_topk_packed_into(&shape, inputs, &cu, &sid, topk, segs, o, s)
    })
}

/// Every query's exact score of every key it sees.
///
/// The scores :func:`indexer_topk` ranks, bit for bit — what :func:`check_topk` judges an
/// engine's rows against. Builds the whole ``[n_queries, n_keys]`` matrix: a checking tool, not
/// a serving path. Their error scales are :func:`indexer_magnitudes`.
///
/// Parameters
/// ----------
/// index_q, weights, index_k, query_pos, key_scale, key_format, query_format, compress_ratio
///     As :func:`indexer_topk` takes them.
/// out : ndarray of float32, [n_queries, n_keys], optional
///     Written and returned: C-contiguous, writeable, aligned, native byte order, not
///     overlapping any input.
///
/// Returns
/// -------
/// ndarray of float32, [n_queries, n_keys]
///     Each query's scores, NaN past its context (``L`` keys, as :func:`indexer_topk` counts
///     them).
///
/// Raises
/// ------
/// SelectionError
///     (a ValueError; ``.argument`` names the argument) as :func:`indexer_topk`. Nothing is
///     written.
/// TypeError
///     On an argument of the wrong type or dtype.
#[pyfunction]
#[pyo3(
    signature = (index_q, weights, index_k, query_pos, *, key_scale=None, key_format=None,
                 query_format=None, compress_ratio=None, out=None),
    text_signature = "(index_q, weights, index_k, query_pos, *, key_scale=None, key_format=None, \
                      query_format=None, compress_ratio=1, out=None)"
)]
fn indexer_scores<'py>(
    py: Python<'py>,
    index_q: &Obj<'py>,
    weights: &Obj<'py>,
    index_k: &Obj<'py>,
    query_pos: &Obj<'py>,
    key_scale: Opt<'_, 'py>,
    key_format: Option<&str>,
    query_format: Option<&str>,
    compress_ratio: Opt<'_, 'py>,
    out: Opt<'_, 'py>,
) -> PyResult<Bound<'py, numpy::PyArrayDyn<f32>>> {
    let common = (index_q, weights, index_k, query_pos);
    let mut call = Call::inputs(common, (key_scale, key_format, query_format))?;
    call.ratio = ratio(compress_ratio)?;
    call.score_matrix(py, out, false)
}

/// Each :func:`indexer_scores` entry's error scale.
///
/// ``|key_scale[t]| * sum_h |weights[h]| * sum_i |index_q[h, i] * index_k[t, i]|``: the
/// ``magnitudes`` of :func:`check_topk` (its ``rtol`` multiplies them).
///
/// Parameters
/// ----------
/// index_q, weights, index_k, query_pos, key_scale, key_format, query_format, compress_ratio
///     As :func:`indexer_topk` takes them.
/// out : ndarray of float32, [n_queries, n_keys], optional
///     As :func:`indexer_scores` takes it.
///
/// Returns
/// -------
/// ndarray of float32, [n_queries, n_keys]
///     The magnitudes, NaN past each query's context.
///
/// Raises
/// ------
/// SelectionError
///     (a ValueError; ``.argument`` names the argument) as :func:`indexer_topk`. Nothing is
///     written.
/// TypeError
///     On an argument of the wrong type or dtype.
#[pyfunction]
#[pyo3(
    signature = (index_q, weights, index_k, query_pos, *, key_scale=None, key_format=None,
                 query_format=None, compress_ratio=None, out=None),
    text_signature = "(index_q, weights, index_k, query_pos, *, key_scale=None, key_format=None, \
                      query_format=None, compress_ratio=1, out=None)"
)]
fn indexer_magnitudes<'py>(
    py: Python<'py>,
    index_q: &Obj<'py>,
    weights: &Obj<'py>,
    index_k: &Obj<'py>,
    query_pos: &Obj<'py>,
    key_scale: Opt<'_, 'py>,
    key_format: Option<&str>,
    query_format: Option<&str>,
    compress_ratio: Opt<'_, 'py>,
    out: Opt<'_, 'py>,
) -> PyResult<Bound<'py, numpy::PyArrayDyn<f32>>> {
    let common = (index_q, weights, index_k, query_pos);
    let mut call = Call::inputs(common, (key_scale, key_format, query_format))?;
    call.ratio = ratio(compress_ratio)?;
    call.score_matrix(py, out, true)
}

impl<'py> Call<'py> {
    /// The `[n_queries, n_keys]` scores (or their magnitudes) into `out`.
    fn score_matrix(
        self,
        py: Python<'py>,
        out: Opt<'_, 'py>,
        magnitudes: bool,
    ) -> PyResult<Bound<'py, numpy::PyArrayDyn<f32>>> {
        let shape = self.shape;
        let arrays = self.arrays();
        let out = S.output::<f32>(py, out, &[shape.n_queries, shape.n_keys], &arrays)?;
        let (inputs, work) = (self.borrowed()?, self.work());
        out.run(work, |o| {
            indexer::indexer_scores_into(&shape, &inputs, magnitudes, o)
        })
    }
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(indexer_scores, m)?)?;
    m.add_function(wrap_pyfunction!(indexer_magnitudes, m)?)?;
    m.add_function(wrap_pyfunction!(indexer_topk, m)?)?;
    m.add_function(wrap_pyfunction!(indexer_topk_packed, m)?)?;
    m.add_function(wrap_pyfunction!(indexer_topk_paged, m)?)?;
    Ok(())
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
                 page_layout="dense", key_format=None, query_format=None, num_segments=None,
                 compress_ratio=None, out=None, scores_out=None),
    text_signature = "(index_q, weights, kv_cache, block_table, seq_lens, seq_ids, query_pos, topk, *, \
                      page_layout='dense', key_format=None, query_format=None, num_segments=0, \
                      compress_ratio=1, out=None, scores_out=None)"
)]
fn indexer_topk_paged<'py>(
    py: Python<'py>,
    index_q: &Obj<'py>,
    weights: &Obj<'py>,
    kv_cache: &Obj<'py>,
    block_table: &Obj<'py>,
    seq_lens: &Obj<'py>,
    seq_ids: &Obj<'py>,
    query_pos: &Obj<'py>,
    topk: &Obj<'py>,
    page_layout: &str,
    key_format: Option<&str>,
    query_format: Option<&str>,
    num_segments: Opt<'_, 'py>,
    compress_ratio: Opt<'_, 'py>,
    out: Opt<'_, 'py>,
    scores_out: Opt<'_, 'py>,
) -> PyResult<I32<'py>> {
    let (q, w, [n, h, dq]) = queries(index_q, weights, query_format)?;
    let args = PagedArgs {
        kv_cache,
        block_table,
        seq_lens,
        seq_ids,
        query_pos,
    };
    let paged = Paged::new(args, page_layout, key_format, (n, dq))?;
    let topk = S.count(topk, "topk", i32::MAX as u64)?;
    let segs = segments(num_segments)?;
    let compress_ratio = ratio(compress_ratio)?;
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
        &[q.untyped(), w.untyped()][..],
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
        |o, s| indexer::indexer_topk_paged_into(n, h, &inputs, topk, segs, o, s),
    )
}
