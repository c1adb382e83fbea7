//! NSA on given compressed keys, an engine's decode on its cache of them:
//! `nsa_compress_keys`, `nsa_block_scores_compressed` and
//! `nsa_select_compressed` (all raise `SelectionError`), the last two dense
//! or packed (`cu_seqlens_q` / `cu_seqlens_k`, as `infllm_select` takes
//! them).

use numpy::{PyArrayDyn, PyUntypedArray};
use pyo3::prelude::*;

use super::common::{
    config, read_block_counts, read_block_size, read_geometry, read_window, WindowName,
};
use crate::nsa::{self, CompressedBatch, Config, Heads};
use crate::python::args::{
    detach, ndarrays, AsFormatArg, CompressedSeqs, EncodedIn, In, KeyFormat, Named, Obj, Opt, Out,
    QueryFormat, I32, I32_MAX, S,
};
use crate::python::errors::refuse;

type F32<'py> = Bound<'py, PyArrayDyn<f32>>;

/// The compressed keys NSA's selection reads, as kvselect computes them:
/// what a serving engine caches and extends as blocks complete, and hands to
/// :func:`nsa_select_compressed` at decode.
///
/// ``window='fla'`` (default): key ``c`` the mean of the keys of block ``c``
/// (tokens ``c * block_size ..``), the complete blocks only (``seq_len //
/// block_size`` keys; fla's ``mean_pooling`` also averages the trailing
/// incomplete block, which no query reads). ``window='eq9'``: key ``c`` the mean
/// of tokens ``c * kernel_stride .. c * kernel_stride + kernel_size``. Float32:
/// each element the sum of its tokens in token order, then one division (each
/// key times its token's ``k_scale`` first, rounded); the bits
/// :func:`nsa_select` computes from the same keys.
///
/// Parameters
/// ----------
/// k : array_like, [seq_len, n_kv_heads, d]
///     The sequence's keys, any key format, read in place.
/// block_size : int, optional
///     Tokens a block (fla's 64).
/// k_scale : array_like of float32, [seq_len], optional
///     Each token's key scale (fp8 keys): its value is ``k * scale``.
/// key_format : str, optional
///     The format of raw uint16 / uint8 ``k``.
/// window, kernel_size, kernel_stride : optional
///     As :func:`nsa_block_scores`.
/// out : ndarray of float32, [n_c, n_kv_heads, d], optional
///     ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
///     aligned, native byte order, not overlapping any input (else refused, nothing written).
///
/// Returns
/// -------
/// ndarray of float32, [n_c, n_kv_heads, d]
///     ``n_c = seq_len // block_size`` (fla's window) or ``(seq_len - kernel_size) //
///     kernel_stride + 1`` (0 below ``kernel_size`` tokens; Eq. 9's).
///
/// Raises
/// ------
/// SelectionError
///     (a ValueError; ``.argument`` names it) when ``k`` is not 3-D or is empty
///     (``k``); ``k_scale`` is not one per token; ``block_size`` is 0; ``window``
///     names nothing (``window``); Eq. 9's stride does not divide ``block_size`` or
///     ``kernel_size`` (``kernel_stride``, ``kernel_size``).
///     Also when ``out`` is refused (its shape, layout, read-only, or overlapping an input).
/// TypeError
///     when ``out`` is not a float32 ndarray.
///
/// See Also
/// --------
/// nsa_select_compressed : the rows from these keys.
///
/// Examples
/// --------
/// >>> import numpy as np, kvselect
/// >>> k = np.arange(10, dtype=np.float32).reshape(10, 1, 1)
/// >>> kvselect.nsa_compress_keys(k, block_size=4)[:, 0, 0].tolist()
/// [1.5, 5.5]
#[pyfunction]
#[pyo3(
    signature = (k, *, block_size=None, k_scale=None, key_format=None, window=None,
                 kernel_size=None, kernel_stride=None, out=None),
    text_signature = "(k, *, block_size=64, k_scale=None, key_format=None, window='fla', \
                      kernel_size=32, kernel_stride=16, out=None)"
)]
#[allow(clippy::too_many_arguments)]
pub(super) fn nsa_compress_keys<'py>(
    py: Python<'py>,
    k: &Obj<'py>,
    block_size: Opt<'_, 'py>,
    k_scale: Opt<'_, 'py>,
    key_format: Option<Named<KeyFormat>>,
    window: Option<Named<WindowName>>,
    kernel_size: Opt<'_, 'py>,
    kernel_stride: Opt<'_, 'py>,
    out: Opt<'_, 'py>,
) -> PyResult<F32<'py>> {
    let bs = read_block_size(block_size)?;
    let k_layout = "[seq_len, n_kv_heads, d]";
    let (ke, [seq_len, n_kv, d]) = EncodedIn::new_3d(S, k, "k", k_layout, key_format.format_arg())?;
    if seq_len == 0 {
        return Err(refuse(S, "k", "k must hold at least 1 token"));
    }
    let w = read_window(window, (kernel_size, kernel_stride), false)?;
    let k_scale = match k_scale {
        Some(o) => Some(S.input::<f32, 1>(o, "k_scale", "[seq_len]")?),
        None => None,
    };
    // The window's stride divides the length: refused here (`window`,
    // `kernel_stride`) before the output is sized by it.
    w.check(bs)?;
    let n_c = w.geometry(bs).compressed_len(seq_len);
    let mut inputs = vec![ke.untyped()];
    inputs.extend(k_scale.as_ref().map(|s| s.untyped()));
    let mut out: Out<'py, f32> = S.output(py, out, &[n_c, n_kv, d], &inputs)?;
    let ks = ke.encoded()?;
    let sc = k_scale.as_ref().map(|s| s.slice()).transpose()?;
    let o = out.slice()?;
    detach(py, ks.len(), || {
        nsa::compress_window_into(ks, sc, n_kv, d, bs, w, o)
    })?;
    Ok(out.finish())
}

/// The arguments both entry points on compressed keys share, read and
/// checked for shape.
struct CompressedCall<'py> {
    q: EncodedIn<'py>,
    ck: EncodedIn<'py>,
    ck_scale: Option<In<'py, f32, 1>>,
    heads: Heads,
    n_q: usize,
    seq_len: usize,
    batch: Option<CompressedSeqs>,
    raw: Vec<Bound<'py, PyUntypedArray>>,
    cfg: Config,
}

#[allow(clippy::too_many_arguments)]
fn compressed_call<'py>(
    q: &Obj<'py>,
    ck: &Obj<'py>,
    seq_len: &Obj<'py>,
    block_counts: usize,
    (block_size, init_blocks, local_blocks): (Opt<'_, 'py>, Opt<'_, 'py>, Opt<'_, 'py>),
    scale: Option<f64>,
    ck_scale: Opt<'_, 'py>,
    formats: (Option<Named<QueryFormat>>, Option<Named<KeyFormat>>),
    cu: (Opt<'_, 'py>, Opt<'_, 'py>),
) -> PyResult<CompressedCall<'py>> {
    let geometry = read_geometry((block_size, init_blocks, local_blocks))?;
    let batch = CompressedSeqs::read(S, seq_len, cu)?;
    let seq_n = match batch {
        None => {
            let n = S.count(seq_len, "seq_len", I32_MAX)?;
            crate::packed::check_seq_len(n)?;
            n
        }
        Some(_) => 0,
    };
    let q_format = formats.0.format_arg();
    let (qe, [n_q, hq, d]) = EncodedIn::new_3d(S, q, "q", "[n_q, n_q_heads, d]", q_format)?;
    let ck_layout = "[n_c, n_kv_heads, d]";
    let (ce, [_, n_kv, dk]) = EncodedIn::new_3d(S, ck, "ck", ck_layout, formats.1.format_arg())?;
    if dk != d {
        return Err(refuse(S, "ck", format!("ck has d={dk} but q has d={d}")));
    }
    let ck_scale = match ck_scale {
        Some(o) => Some(S.input::<f32, 1>(o, "ck_scale", "[n_c]")?),
        None => None,
    };
    Ok(CompressedCall {
        q: qe,
        ck: ce,
        ck_scale,
        heads: Heads {
            n_q_heads: hq,
            n_kv_heads: n_kv,
            d,
        },
        n_q,
        seq_len: seq_n,
        batch,
        raw: ndarrays(&[seq_len, cu.0.unwrap_or(q), cu.1.unwrap_or(q)]),
        cfg: config(geometry, block_counts, scale, d),
    })
}

impl<'py> CompressedCall<'py> {
    /// The packed batch's arrays for the core.
    fn seqs(&self) -> Option<CompressedBatch<'_>> {
        self.batch.as_ref().map(CompressedSeqs::core)
    }

    /// The blocks of the longest sequence (a packed call's rows are as
    /// wide).
    fn n_blocks(&self) -> usize {
        match &self.batch {
            None => self.cfg.n_blocks(self.seq_len),
            Some(b) => b.seq_lens.iter().map(|&l| self.cfg.n_blocks(l)).max().unwrap_or(0),
        }
    }

    fn inputs(&self) -> Vec<&Bound<'py, PyUntypedArray>> {
        let mut v = vec![self.q.untyped(), self.ck.untyped()];
        v.extend(self.ck_scale.as_ref().map(|s| s.untyped()));
        v.extend(&self.raw);
        v
    }
}

/// :func:`nsa_block_scores` on given compressed keys, as a serving engine keeps
/// them: the decode path of an engine that caches the mean-pooled keys and
/// extends the cache as blocks complete (fla's NSA decode reads such a cache).
///
/// ``ck`` holds exactly the compressed keys of ``seq_len`` tokens
/// (:func:`nsa_compress_keys`' layout and count); the queries are the sequence's
/// last ``n_q`` tokens, as in :func:`nsa_block_scores`. The result equals
/// :func:`nsa_block_scores` bit for bit on any keys whose compressed keys have
/// ``ck``'s values: from the compressed keys on, the two run the same code.
///
/// Parameters
/// ----------
/// q : array_like, [n_q, n_q_heads, d]
///     The queries, as :func:`nsa_block_scores`.
/// ck : array_like, [n_c, n_kv_heads, d]
///     The compressed keys: ``n_c = seq_len // block_size`` (fla's window; the
///     complete blocks' means) or Eq. 9's ``(seq_len - kernel_size) // kernel_stride
///     + 1`` (0 below ``kernel_size`` tokens). Any key format, read in place
///     (float32 without a copy).
/// seq_len : int, or array_like of int [n_seqs] with ``cu_seqlens_q``
///     Tokens in the sequence, the queries' own included (a query's block and the
///     blocks it has seen whole depend on it, not on ``n_c`` alone); packed: each
///     sequence's.
/// block_size, init_blocks, local_blocks, scale, window, kernel_size, kernel_stride
///     As :func:`nsa_block_scores`.
/// ck_scale : array_like of float32, [n_c], optional
///     Each compressed key's scale (fp8 keys): its value is ``ck * scale``, rounded
///     to float32.
/// query_format, key_format : str, optional
///     The formats of raw uint16 / uint8 ``q`` and ``ck``.
/// cu_seqlens_q, cu_seqlens_k : array_like of int, [n_seqs + 1], optional
///     A packed batch, as :func:`infllm_block_scores` takes one: sequence ``s`` is
///     queries ``cu_seqlens_q[s] .. cu_seqlens_q[s + 1]`` of ``q`` (the last of its
///     ``seq_len[s]`` tokens; ``seq_len`` then one length per sequence) and compressed
///     keys ``cu_seqlens_k[s] .. cu_seqlens_k[s + 1]`` of ``ck`` (exactly its tokens'
///     compressed keys). Each row equals the dense call's on its own sequence. Both or
///     neither.
/// out : ndarray of float32, optional
///     ``out=`` reuses a buffer of the shape returned (below, packed or not): written in
///     place and returned. C-contiguous, writeable, aligned, native byte order, not
///     overlapping any input (else refused, nothing written).
///
/// Returns
/// -------
/// ndarray of float32, [n_q, n_kv_heads, ceil(seq_len / block_size)]
///     Packed: ``[total_q, n_kv_heads, max_blocks]``, NaN past a sequence's own blocks.
///
/// Raises
/// ------
/// SelectionError
///     (a ValueError; ``.argument`` names it) when ``q`` or ``ck`` is not 3-D or
///     their ``d`` differ (``q``, ``ck``); ``ck`` does not hold ``seq_len``'s
///     compressed keys (``ck``); ``ck_scale`` is not one per compressed key;
///     ``seq_len`` is 0; ``q``'s heads are not a multiple of ``ck``'s or there are
///     more queries than tokens (``q``); ``scale`` is not finite; ``block_size`` is
///     0; ``window`` names nothing (``window``); Eq. 9's stride does not divide
///     ``block_size`` or ``kernel_size`` (``kernel_stride``, ``kernel_size``); packed:
///     one of ``cu_seqlens_q`` / ``cu_seqlens_k`` alone (the missing one),
///     ``cu_seqlens_k`` not rising from 0 to ``ck``'s keys or giving a sequence other
///     than its tokens' compressed keys (``cu_seqlens_k``), ``seq_len`` not one positive
///     length per sequence (``seq_len``), ``cu_seqlens_q`` not rising from 0 to the
///     queries or giving a sequence more queries than tokens (``cu_seqlens_q``).
///     Also when ``out`` is refused (its shape, layout, read-only, or overlapping an input).
/// TypeError
///     when ``out`` is not a float32 ndarray.
///
/// See Also
/// --------
/// nsa_select_compressed : the blocks each query reads.
/// nsa_compress_keys : the compressed keys.
///
/// Examples
/// --------
/// >>> import numpy as np, kvselect
/// >>> q = np.ones((1, 2, 4), dtype=np.float32)
/// >>> k = np.zeros((20, 1, 4), dtype=np.float32); k[8:12] = 1.0
/// >>> ck = kvselect.nsa_compress_keys(k, block_size=4)
/// >>> s = kvselect.nsa_block_scores_compressed(q, ck, 20, block_size=4)
/// >>> np.array_equal(s, kvselect.nsa_block_scores(q, k, block_size=4))
/// True
#[pyfunction]
#[pyo3(
    signature = (q, ck, seq_len, *, block_size=None, init_blocks=None, local_blocks=None,
                 scale=None, ck_scale=None, query_format=None, key_format=None, window=None,
                 kernel_size=None, kernel_stride=None, cu_seqlens_q=None, cu_seqlens_k=None,
                 out=None),
    text_signature = "(q, ck, seq_len, *, block_size=64, init_blocks=1, local_blocks=2, \
                      scale=None, ck_scale=None, query_format=None, key_format=None, \
                      window='fla', kernel_size=32, kernel_stride=16, cu_seqlens_q=None, \
                      cu_seqlens_k=None, out=None)"
)]
#[allow(clippy::too_many_arguments)]
pub(super) fn nsa_block_scores_compressed<'py>(
    py: Python<'py>,
    q: &Obj<'py>,
    ck: &Obj<'py>,
    seq_len: &Obj<'py>,
    block_size: Opt<'_, 'py>,
    init_blocks: Opt<'_, 'py>,
    local_blocks: Opt<'_, 'py>,
    scale: Option<f64>,
    ck_scale: Opt<'_, 'py>,
    query_format: Option<Named<QueryFormat>>,
    key_format: Option<Named<KeyFormat>>,
    window: Option<Named<WindowName>>,
    kernel_size: Opt<'_, 'py>,
    kernel_stride: Opt<'_, 'py>,
    cu_seqlens_q: Opt<'_, 'py>,
    cu_seqlens_k: Opt<'_, 'py>,
    out: Opt<'_, 'py>,
) -> PyResult<F32<'py>> {
    let c = compressed_call(
        q,
        ck,
        seq_len,
        1,
        (block_size, init_blocks, local_blocks),
        scale,
        ck_scale,
        (query_format, key_format),
        (cu_seqlens_q, cu_seqlens_k),
    )?;
    let w = read_window(window, (kernel_size, kernel_stride), false)?;
    let nb = c.n_blocks();
    let mut out: Out<'py, f32> = S.output(py, out, &[c.n_q, c.heads.n_kv_heads, nb], &c.inputs())?;
    let (qs, cs) = (c.q.encoded()?, c.ck.encoded()?);
    let sc = c.ck_scale.as_ref().map(|s| s.slice()).transpose()?;
    let o = out.slice()?;
    let work = c.n_q * c.heads.n_q_heads * cs.len() / c.heads.n_kv_heads.max(1);
    let (heads, n, cfg, seqs) = (c.heads, c.seq_len, &c.cfg, c.seqs());
    detach(py, work, || match seqs {
        None => nsa::block_scores_compressed_into(qs, cs, sc, heads, n, (cfg, w), o),
        Some(b) => nsa::block_scores_compressed_packed_into(qs, cs, sc, heads, &b, (cfg, w), o),
    })?;
    Ok(out.finish())
}

/// :func:`nsa_select` on given compressed keys (see
/// :func:`nsa_block_scores_compressed`): the rows an engine's decode reads,
/// equal to :func:`nsa_select`'s on any keys whose compressed keys have
/// ``ck``'s values.
///
/// Parameters
/// ----------
/// q, ck, seq_len
///     As :func:`nsa_block_scores_compressed`.
/// block_counts : int, optional
///     Blocks a row (fla's 16), at least 1.
/// block_size, init_blocks, local_blocks, scale, ck_scale, query_format, key_format
///     As :func:`nsa_block_scores_compressed`.
/// window, kernel_size, kernel_stride : optional
///     As :func:`nsa_block_scores`.
/// cu_seqlens_q, cu_seqlens_k : array_like of int, [n_seqs + 1], optional
///     A packed batch, as :func:`nsa_block_scores_compressed`; each row equals the dense
///     call's on its own sequence (that sequence's block ids, from 0).
/// out : ndarray of int32, [n_q, n_kv_heads, block_counts], optional
///     ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
///     aligned, native byte order, not overlapping any input (else refused, nothing written).
///
/// Returns
/// -------
/// ndarray of int32, [n_q, n_kv_heads, block_counts]
///     Block ids ascending, then ``-1`` (packed: ``[total_q, n_kv_heads,
///     block_counts]``).
///
/// Raises
/// ------
/// SelectionError
///     As :func:`nsa_block_scores_compressed`, and when ``block_counts`` is 0
///     (``block_counts``).
///     Also when ``out`` is refused (its shape, layout, read-only, or overlapping an input).
/// TypeError
///     when ``out`` is not an int32 ndarray.
///
/// See Also
/// --------
/// nsa_select : the same rows from the keys.
/// nsa_compress_keys : the compressed keys.
/// nsa_select_paged : the same rows at decode over a paged cache.
///
/// Examples
/// --------
/// >>> import numpy as np, kvselect
/// >>> q = np.ones((1, 2, 4), dtype=np.float32)
/// >>> ck = np.zeros((5, 1, 4), dtype=np.float32); ck[2] = 1.0
/// >>> kvselect.nsa_select_compressed(q, ck, 20, 4, block_size=4)[0, 0].tolist()
/// [0, 2, 3, 4]
#[pyfunction]
#[pyo3(
    signature = (q, ck, seq_len, block_counts=None, *, block_size=None, init_blocks=None,
                 local_blocks=None, scale=None, ck_scale=None, query_format=None,
                 key_format=None, window=None, kernel_size=None, kernel_stride=None,
                 cu_seqlens_q=None, cu_seqlens_k=None, out=None),
    text_signature = "(q, ck, seq_len, block_counts=16, *, block_size=64, init_blocks=1, \
                      local_blocks=2, scale=None, ck_scale=None, query_format=None, \
                      key_format=None, window='fla', kernel_size=32, kernel_stride=16, \
                      cu_seqlens_q=None, cu_seqlens_k=None, out=None)"
)]
#[allow(clippy::too_many_arguments)]
pub(super) fn nsa_select_compressed<'py>(
    py: Python<'py>,
    q: &Obj<'py>,
    ck: &Obj<'py>,
    seq_len: &Obj<'py>,
    block_counts: Opt<'_, 'py>,
    block_size: Opt<'_, 'py>,
    init_blocks: Opt<'_, 'py>,
    local_blocks: Opt<'_, 'py>,
    scale: Option<f64>,
    ck_scale: Opt<'_, 'py>,
    query_format: Option<Named<QueryFormat>>,
    key_format: Option<Named<KeyFormat>>,
    window: Option<Named<WindowName>>,
    kernel_size: Opt<'_, 'py>,
    kernel_stride: Opt<'_, 'py>,
    cu_seqlens_q: Opt<'_, 'py>,
    cu_seqlens_k: Opt<'_, 'py>,
    out: Opt<'_, 'py>,
) -> PyResult<I32<'py>> {
    let n = read_block_counts(block_counts)?;
    let c = compressed_call(
        q,
        ck,
        seq_len,
        n,
        (block_size, init_blocks, local_blocks),
        scale,
        ck_scale,
        (query_format, key_format),
        (cu_seqlens_q, cu_seqlens_k),
    )?;
    let w = read_window(window, (kernel_size, kernel_stride), false)?;
    let mut out: Out<'py, i32> = S.output(py, out, &[c.n_q, c.heads.n_kv_heads, n], &c.inputs())?;
    let (qs, cs) = (c.q.encoded()?, c.ck.encoded()?);
    let sc = c.ck_scale.as_ref().map(|s| s.slice()).transpose()?;
    let o = out.slice()?;
    let work = c.n_q * c.heads.n_q_heads * cs.len() / c.heads.n_kv_heads.max(1);
    let (heads, sl, cfg, seqs) = (c.heads, c.seq_len, &c.cfg, c.seqs());
    detach(py, work, || match seqs {
        None => nsa::select_compressed_into(qs, cs, sc, heads, sl, (cfg, w), o),
        Some(b) => nsa::select_compressed_packed_into(qs, cs, sc, heads, &b, (cfg, w), o),
    })?;
    Ok(out.finish())
}
