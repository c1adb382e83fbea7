//! InfLLM-v2's block scores and block rows, dense and packed (the source's
//! varlen calls): `infllm_block_scores` and `infllm_select`.
//!
//! Reads `q`, `ck`, `seq_len`, `ck_scale`, the formats and `cu_seqlens_q` /
//! `cu_seqlens_k` ([`call`]); the options through [`config`]. The rule: a
//! packed batch takes both boundaries or neither, each sequence's length is
//! an int32 position, `q` and `ck` are 3-D with one `d`; outputs are checked
//! against every input.

use numpy::{PyArrayDyn, PyUntypedArray};
use pyo3::prelude::*;

use super::config::{config, Options};
use crate::infllm::{self, CompressedBatch, Config, Heads, Keep, Pooling};
use crate::python::args::{
    detach, ndarrays, AsFormatArg, CompressedSeqs, EncodedIn, In, KeyFormat, Named, Obj, Opt, Out,
    QueryFormat, I32, I32_MAX, S,
};
use crate::python::errors::refuse;

type F32<'py> = Bound<'py, PyArrayDyn<f32>>;

/// The arguments both entry points share, read and checked for shape.
struct Call<'py> {
    q: EncodedIn<'py>,
    ck: EncodedIn<'py>,
    ck_scale: Option<In<'py, f32, 1>>,
    raw: Vec<Bound<'py, PyUntypedArray>>,
    heads: Heads,
    n_q: usize,
    seq_len: usize,
    batch: Option<CompressedSeqs>,
    cfg: Config,
}

#[allow(clippy::too_many_arguments)]
fn call<'py>(
    q: &Obj<'py>,
    ck: &Obj<'py>,
    seq_len: &Obj<'py>,
    options: Options<'_, 'py>,
    scale: Option<f64>,
    ck_scale: Opt<'_, 'py>,
    formats: (Option<Named<QueryFormat>>, Option<Named<KeyFormat>>),
    (cu_seqlens_q, cu_seqlens_k): (Opt<'_, 'py>, Opt<'_, 'py>),
) -> PyResult<Call<'py>> {
    let batch = CompressedSeqs::read(S, seq_len, (cu_seqlens_q, cu_seqlens_k))?;
    let seq_n = match batch {
        None => {
            let n = S.count(seq_len, "seq_len", I32_MAX)?;
            crate::packed::check_seq_len(n)?;
            n
        }
        Some(_) => 0,
    };
    let q_layout = "[n_q, n_q_heads, d]";
    let (qe, [n_q, hq, d]) = EncodedIn::new_3d(S, q, "q", q_layout, formats.0.format_arg())?;
    let ck_layout = "[n_c, n_kv_heads, d]";
    let (ke, [_, n_kv, dk]) = EncodedIn::new_3d(S, ck, "ck", ck_layout, formats.1.format_arg())?;
    if dk != d {
        return Err(refuse(S, "ck", format!("ck has d={dk} but q has d={d}")));
    }
    let cfg = config(options, scale, d)?;
    // The output's width divides by `block_size` (and its window by the
    // kernel's stride): refused here, before anything is sized by them.
    cfg.geometry.check()?;
    let ck_scale = match ck_scale {
        Some(o) => Some(S.input::<f32, 1>(o, "ck_scale", "[n_c]")?),
        None => None,
    };
    let raw = ndarrays(&[
        seq_len,
        cu_seqlens_q.unwrap_or(q),
        cu_seqlens_k.unwrap_or(q),
    ]);
    Ok(Call {
        q: qe,
        ck: ke,
        ck_scale,
        raw,
        heads: Heads {
            n_q_heads: hq,
            n_kv_heads: n_kv,
            d,
        },
        n_q,
        seq_len: seq_n,
        batch,
        cfg,
    })
}

impl<'py> Call<'py> {
    /// The packed batch's arrays for the core.
    fn seqs(&self) -> Option<CompressedBatch<'_>> {
        self.batch.as_ref().map(CompressedSeqs::core)
    }

    /// The blocks of the longest sequence (a packed call's rows are as
    /// wide).
    fn n_blocks(&self) -> usize {
        let g = self.cfg.geometry;
        match &self.batch {
            None => g.n_blocks(self.seq_len),
            Some(b) => b.seq_lens.iter().map(|&l| g.n_blocks(l)).max().unwrap_or(0),
        }
    }

    fn inputs(&self) -> Vec<&Bound<'py, PyUntypedArray>> {
        let mut v = vec![self.q.untyped(), self.ck.untyped()];
        v.extend(self.ck_scale.as_ref().map(|s| s.untyped()));
        v.extend(&self.raw);
        v
    }
}

/// Every block's score under InfLLM-v2's stage 1 and pooling, for the queries
/// at the end of one sequence or of each sequence of a packed batch.
///
/// Query ``i`` sits at position ``seq_len - n_q + i``. Each query head's softmax
/// over the compressed keys it sees (those whose 32 tokens end at or before its
/// position), of ``scale * q . ck``; the probabilities summed over each KV head's
/// query group; block ``b`` (64 tokens) the maximum over compressed keys ``4b - 1
/// .. 4b + 3``. The variant's forced blocks score ``+inf``, its excluded ones
/// ``-inf`` (``pooling``; docs/infllm.md). Float32 with the project's ``exp``, the
/// same bits at every SIMD level.
///
/// Parameters
/// ----------
/// q : array_like, [n_q, n_q_heads, d]
///     The queries, the sequence's last ``n_q`` tokens: float32 (float64 converted
///     once), float16, ml_dtypes bfloat16 / float8_e4m3fn, or a raw view with
///     ``query_format``.
/// ck : array_like, [n_c, n_kv_heads, d]
///     The sequence's compressed keys (``n_c = (seq_len - 32) // 16 + 1``, 0 below
///     32 tokens): key ``j`` the mean of the keys at tokens ``16 j .. 16 j + 31``
///     (``kvselect.reference.infllm.compress_keys``). Any key format, read in place.
/// seq_len : int, or array_like of int [n_seqs] with ``cu_seqlens_q``
///     Tokens in the sequence (the queries' own included); packed: each sequence's.
/// init_blocks, local_blocks : int, optional
///     Blocks forced at the start and up to the query's own (MiniCPM4's 1 and 32).
/// block_size, kernel_size, kernel_stride : int, optional
///     The geometry (MiniCPM4's 64, 32, 16; the source takes them as parameters):
///     compressed keys of ``kernel_size`` tokens every ``kernel_stride``, blocks of
///     ``block_size`` (a multiple of ``kernel_stride``), pooled over ``s b - 1 .. s b +
///     s - 1`` with ``s = block_size // kernel_stride``.
/// pooling : {"cuda", "triton"}, optional
///     ``"cuda"`` (the CUDA kernel, default): init and ``local_blocks + 1`` blocks
///     up to the current one ``+inf``; ``"triton"`` (the older Triton kernel): the
///     ``local_blocks`` blocks up to the current one ``-inf``, then init ``+inf``,
///     taps past the keys read as 0.
/// scale : float, optional
///     The logits' scale, finite; ``1 / sqrt(d)`` by default (the source's).
/// ck_scale : array_like of float32, [n_c], optional
///     Each compressed key's scale (fp8 keys): its value is ``ck * scale``.
/// query_format, key_format : str, optional
///     The formats of raw uint16 / uint8 ``q`` and ``ck``.
/// cu_seqlens_q, cu_seqlens_k : array_like of int, [n_seqs + 1], optional
///     A packed batch, as the source's varlen calls take it (``infllmv2_attn_stage1``,
///     ``max_pooling_1d_varlen``): sequence ``s`` is queries ``cu_seqlens_q[s] ..
///     cu_seqlens_q[s + 1]`` of ``q`` (the last of its ``seq_len[s]`` tokens; the
///     source's ``cache_lens[s]`` is ``seq_len[s]`` minus them) and compressed keys
///     ``cu_seqlens_k[s] .. cu_seqlens_k[s + 1]`` of ``ck`` (its tokens' compressed keys).
///     Each row equals the dense call's on its own sequence. Both or neither.
/// out : ndarray of float32, optional
///     ``out=`` reuses a buffer of the shape returned (below, packed or not): written in
///     place and returned. C-contiguous, writeable, aligned, native byte order, not
///     overlapping any input (else refused, nothing written).
///
/// Returns
/// -------
/// ndarray of float32, [n_q, n_kv_heads, ceil(seq_len / 64)]
///     Packed: ``[total_q, n_kv_heads, max_blocks]``, NaN past a sequence's own blocks.
///
/// Raises
/// ------
/// SelectionError
///     (a ValueError; ``.argument`` names it) when ``q`` or ``ck`` is not 3-D, their
///     ``d`` differ, ``q``'s heads are not a multiple of ``ck``'s, there are more
///     queries than tokens (``q``); ``ck`` is not ``seq_len``'s compressed keys
///     (``ck``); ``ck_scale`` not one per key; ``seq_len`` is 0; ``scale`` is not
///     finite; a geometry size is 0 or ``block_size`` not whole strides
///     (``block_size``, ``kernel_size``, ``kernel_stride``); an option names nothing
///     (``pooling``); packed: one of ``cu_seqlens_q`` / ``cu_seqlens_k`` alone (the
///     missing one), ``cu_seqlens_k`` not rising from 0 to ``ck``'s keys or giving a
///     sequence other than its tokens' compressed keys (``cu_seqlens_k``), ``seq_len``
///     not one positive length per sequence (``seq_len``), ``cu_seqlens_q`` not rising
///     from 0 to the queries or giving a sequence more queries than tokens
///     (``cu_seqlens_q``).
///     Also when ``out`` is refused (its shape, layout, read-only, or overlapping an input).
/// TypeError
///     when ``out`` is not a float32 ndarray.
///
/// See Also
/// --------
/// infllm_select : the blocks each query reads.
/// infllm_block_scores_paged : the same scores at decode over a paged cache.
///
/// Examples
/// --------
/// >>> import numpy as np, kvselect
/// >>> q = np.ones((1, 2, 4), dtype=np.float32)
/// >>> ck = np.zeros((7, 1, 4), dtype=np.float32); ck[1] = 1.0
/// >>> s = kvselect.infllm_block_scores(q, ck, 128, init_blocks=0, local_blocks=0)
/// >>> s.shape, round(float(s[0, 0, 0]), 4), float(s[0, 0, 1])
/// ((1, 1, 2), 1.1037, inf)
#[pyfunction]
#[pyo3(
    signature = (q, ck, seq_len, *, init_blocks=None, local_blocks=None, pooling=None,
                 scale=None, ck_scale=None, query_format=None, key_format=None,
                 block_size=None, kernel_size=None, kernel_stride=None, cu_seqlens_q=None,
                 cu_seqlens_k=None, out=None),
    text_signature = "(q, ck, seq_len, *, init_blocks=1, local_blocks=32, pooling='cuda', \
                      scale=None, ck_scale=None, query_format=None, key_format=None, \
                      block_size=64, kernel_size=32, kernel_stride=16, cu_seqlens_q=None, \
                      cu_seqlens_k=None, out=None)"
)]
#[allow(clippy::too_many_arguments)]
pub(super) fn infllm_block_scores<'py>(
    py: Python<'py>,
    q: &Obj<'py>,
    ck: &Obj<'py>,
    seq_len: &Obj<'py>,
    init_blocks: Opt<'_, 'py>,
    local_blocks: Opt<'_, 'py>,
    pooling: Option<Named<Pooling>>,
    scale: Option<f64>,
    ck_scale: Opt<'_, 'py>,
    query_format: Option<Named<QueryFormat>>,
    key_format: Option<Named<KeyFormat>>,
    block_size: Opt<'_, 'py>,
    kernel_size: Opt<'_, 'py>,
    kernel_stride: Opt<'_, 'py>,
    cu_seqlens_q: Opt<'_, 'py>,
    cu_seqlens_k: Opt<'_, 'py>,
    out: Opt<'_, 'py>,
) -> PyResult<F32<'py>> {
    let c = call(
        q,
        ck,
        seq_len,
        (
            (init_blocks, local_blocks, 1),
            (block_size, kernel_size, kernel_stride),
            pooling,
            None,
        ),
        scale,
        ck_scale,
        (query_format, key_format),
        (cu_seqlens_q, cu_seqlens_k),
    )?;
    let nb = c.n_blocks();
    let mut out: Out<'py, f32> = S.output(py, out, &[c.n_q, c.heads.n_kv_heads, nb], &c.inputs())?;
    let (qs, ks) = (c.q.encoded()?, c.ck.encoded()?);
    let sc = c.ck_scale.as_ref().map(|s| s.slice()).transpose()?;
    let o = out.slice()?;
    let work = c.n_q * c.heads.n_q_heads * ks.len() / c.heads.n_kv_heads.max(1);
    let (seqs, heads, n, cfg) = (c.seqs(), c.heads, c.seq_len, &c.cfg);
    detach(py, work, || match seqs {
        None => infllm::block_scores_into(qs, ks, sc, heads, n, cfg, o),
        Some(b) => infllm::block_scores_packed_into(qs, ks, sc, heads, &b, cfg, o),
    })?;
    Ok(out.finish())
}

/// The blocks each query reads under InfLLM-v2: the top-k of
/// :func:`infllm_block_scores`, filtered as the modelling code filters.
///
/// The top ``min(topk, n_blocks)`` blocks of each query's row for each KV head,
/// ranked by score descending, ties to the lower block id (where more blocks are
/// forced than ``topk`` holds, the lower ids); then the ids past the query's own
/// block dropped (``keep="through_current"``, MiniCPM4.1's ``> q_idx``) or from it
/// on (``keep="before_current"``, an earlier copy's ``>= q_idx``); ascending,
/// ``-1`` padded.
///
/// Parameters
/// ----------
/// q, ck, seq_len
///     As :func:`infllm_block_scores` (packed: per sequence, with ``cu_seqlens_q``).
/// topk : int, optional
///     Blocks per row before the filter (MiniCPM4's 64), at least 1.
/// init_blocks, local_blocks, pooling, scale, ck_scale, query_format, key_format
///     As :func:`infllm_block_scores`.
/// block_size, kernel_size, kernel_stride
///     As :func:`infllm_block_scores`.
/// keep : {"through_current", "before_current"}, optional
///     Which ids the filter keeps (default ``"through_current"``).
/// cu_seqlens_q, cu_seqlens_k : array_like of int, [n_seqs + 1], optional
///     A packed batch, as :func:`infllm_block_scores`; each row equals the dense call's
///     on its own sequence (that sequence's block ids, from 0).
/// out : ndarray of int32, [n_q, n_kv_heads, topk], optional
///     ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
///     aligned, native byte order, not overlapping any input (else refused, nothing written).
///
/// Returns
/// -------
/// ndarray of int32, [n_q, n_kv_heads, topk]
///     Block ids ascending, then ``-1`` (packed: ``[total_q, n_kv_heads, topk]``).
///
/// Raises
/// ------
/// SelectionError
///     As :func:`infllm_block_scores`, and when ``topk`` is 0 (``topk``) or
///     ``keep`` names nothing (``keep``).
///     Also when ``out`` is refused (its shape, layout, read-only, or overlapping an input).
/// TypeError
///     when ``out`` is not an int32 ndarray.
///
/// See Also
/// --------
/// infllm_block_scores : the scores the rows rank.
/// infllm_select_paged : the same rows at decode over a paged cache.
///
/// Examples
/// --------
/// >>> import numpy as np, kvselect
/// >>> rng = np.random.default_rng(0)
/// >>> q = rng.standard_normal((1, 4, 8)).astype(np.float32)
/// >>> ck = rng.standard_normal((63, 2, 8)).astype(np.float32)
/// >>> rows = kvselect.infllm_select(q, ck, 1024, topk=4, local_blocks=2)
/// >>> rows.shape, rows[0, 0, -3:].tolist()
/// ((1, 2, 4), [13, 14, 15])
#[pyfunction]
#[pyo3(
    signature = (q, ck, seq_len, topk=None, *, init_blocks=None, local_blocks=None, pooling=None,
                 keep=None, scale=None, ck_scale=None, query_format=None, key_format=None,
                 block_size=None, kernel_size=None, kernel_stride=None, cu_seqlens_q=None,
                 cu_seqlens_k=None, out=None),
    text_signature = "(q, ck, seq_len, topk=64, *, init_blocks=1, local_blocks=32, \
                      pooling='cuda', keep='through_current', scale=None, ck_scale=None, \
                      query_format=None, key_format=None, block_size=64, kernel_size=32, \
                      kernel_stride=16, cu_seqlens_q=None, cu_seqlens_k=None, out=None)"
)]
#[allow(clippy::too_many_arguments)]
pub(super) fn infllm_select<'py>(
    py: Python<'py>,
    q: &Obj<'py>,
    ck: &Obj<'py>,
    seq_len: &Obj<'py>,
    topk: Opt<'_, 'py>,
    init_blocks: Opt<'_, 'py>,
    local_blocks: Opt<'_, 'py>,
    pooling: Option<Named<Pooling>>,
    keep: Option<Named<Keep>>,
    scale: Option<f64>,
    ck_scale: Opt<'_, 'py>,
    query_format: Option<Named<QueryFormat>>,
    key_format: Option<Named<KeyFormat>>,
    block_size: Opt<'_, 'py>,
    kernel_size: Opt<'_, 'py>,
    kernel_stride: Opt<'_, 'py>,
    cu_seqlens_q: Opt<'_, 'py>,
    cu_seqlens_k: Opt<'_, 'py>,
    out: Opt<'_, 'py>,
) -> PyResult<I32<'py>> {
    let k = S.count_or(topk, "topk", I32_MAX, infllm::MINICPM4_TOP_K)?;
    if k == 0 {
        return Err(refuse(S, "topk", "topk must be at least 1 block"));
    }
    let c = call(
        q,
        ck,
        seq_len,
        (
            (init_blocks, local_blocks, k),
            (block_size, kernel_size, kernel_stride),
            pooling,
            keep,
        ),
        scale,
        ck_scale,
        (query_format, key_format),
        (cu_seqlens_q, cu_seqlens_k),
    )?;
    let mut out: Out<'py, i32> = S.output(py, out, &[c.n_q, c.heads.n_kv_heads, k], &c.inputs())?;
    let (qs, ks) = (c.q.encoded()?, c.ck.encoded()?);
    let sc = c.ck_scale.as_ref().map(|s| s.slice()).transpose()?;
    let o = out.slice()?;
    let work = c.n_q * c.heads.n_q_heads * ks.len() / c.heads.n_kv_heads.max(1);
    let (seqs, heads, n, cfg) = (c.seqs(), c.heads, c.seq_len, &c.cfg);
    detach(py, work, || match seqs {
        None => infllm::select_into(qs, ks, sc, heads, n, cfg, o),
        Some(b) => infllm::select_packed_into(qs, ks, sc, heads, &b, cfg, o),
    })?;
    Ok(out.finish())
}
