//! NSA's block scores and block rows from the keys, dense and packed:
//! `nsa_block_scores` and `nsa_select` (all raise `SelectionError`).

use numpy::{PyArrayDyn, PyUntypedArray};
use pyo3::prelude::*;

use super::common::{config, read_block_counts, read_geometry, read_window, WindowName};
use crate::nsa::{self, Config, Heads};
use crate::python::args::{
    detach, ndarrays, positions, AsFormatArg, EncodedIn, KeyFormat, Named, Obj, Opt, Out,
    QueryFormat, I32, S,
};
use crate::python::errors::refuse;

type F32<'py> = Bound<'py, PyArrayDyn<f32>>;

/// The arguments both entry points share, read and checked for shape.
struct Call<'py> {
    q: EncodedIn<'py>,
    k: EncodedIn<'py>,
    k_scale: Option<crate::python::args::In<'py, f32, 1>>,
    hq: usize,
    n_kv: usize,
    d: usize,
    n_q: usize,
    /// A packed batch: the keys' boundaries and the queries' (`None`: the
    /// keys').
    cu: Option<(Vec<usize>, Option<Vec<usize>>)>,
    raw: Vec<Bound<'py, PyUntypedArray>>,
    cfg: Config,
}

#[allow(clippy::too_many_arguments)]
fn call<'py>(
    q: &Obj<'py>,
    k: &Obj<'py>,
    block_counts: usize,
    (block_size, init_blocks, local_blocks): (Opt<'_, 'py>, Opt<'_, 'py>, Opt<'_, 'py>),
    scale: Option<f64>,
    k_scale: Opt<'_, 'py>,
    formats: (Option<Named<QueryFormat>>, Option<Named<KeyFormat>>),
    (cu_seqlens, cu_seqlens_q): (Opt<'_, 'py>, Opt<'_, 'py>),
) -> PyResult<Call<'py>> {
    let geometry = read_geometry((block_size, init_blocks, local_blocks))?;
    let q_format = formats.0.format_arg();
    let (qe, [n_q, hq, d]) = EncodedIn::new_3d(S, q, "q", "[n_q, n_q_heads, d]", q_format)?;
    let k_layout = "[seq_len, n_kv_heads, d]";
    let (ke, [seq_len, n_kv, dk]) = EncodedIn::new_3d(S, k, "k", k_layout, formats.1.format_arg())?;
    if dk != d {
        return Err(refuse(S, "k", format!("k has d={dk} but q has d={d}")));
    }
    if seq_len == 0 {
        return Err(refuse(S, "k", "k must hold at least 1 token"));
    }
    let cu = match (cu_seqlens, cu_seqlens_q) {
        (None, None) => None,
        (cu, cq) => Some((
            match cu {
                Some(o) => positions(S, o, "cu_seqlens")?,
                None => vec![0, seq_len],
            },
            cq.map(|o| positions(S, o, "cu_seqlens_q")).transpose()?,
        )),
    };
    let raw = ndarrays(&[cu_seqlens.unwrap_or(q), cu_seqlens_q.unwrap_or(q)]);
    let k_scale = match k_scale {
        Some(o) => Some(S.input::<f32, 1>(o, "k_scale", "[seq_len]")?),
        None => None,
    };
    Ok(Call {
        q: qe,
        k: ke,
        k_scale,
        hq,
        n_kv,
        d,
        n_q,
        cu,
        raw,
        cfg: config(geometry, block_counts, scale, d),
    })
}

impl<'py> Call<'py> {
    fn inputs(&self) -> Vec<&Bound<'py, PyUntypedArray>> {
        let mut v = vec![self.q.untyped(), self.k.untyped()];
        v.extend(self.k_scale.as_ref().map(|s| s.untyped()));
        v.extend(&self.raw);
        v
    }

    /// The query heads, KV heads and `d`.
    fn heads(&self) -> Heads {
        Heads {
            n_q_heads: self.hq,
            n_kv_heads: self.n_kv,
            d: self.d,
        }
    }

    /// The packed batch's boundaries for the core.
    fn cu(&self) -> Option<(&[usize], Option<&[usize]>)> {
        self.cu.as_ref().map(|(k, q)| (&k[..], q.as_deref()))
    }

    /// The blocks of the longest sequence of `n_k` keys (a packed call's rows
    /// are as wide).
    fn n_blocks(&self, n_k: usize) -> usize {
        match &self.cu {
            None => self.cfg.n_blocks(n_k),
            Some((cu, _)) => cu
                .windows(2)
                .map(|w| self.cfg.n_blocks(w[1].saturating_sub(w[0])))
                .max()
                .unwrap_or(0),
        }
    }
}

/// Every block's score under NSA's selection as fla computes it, for the
/// queries at the end of one sequence or of each sequence of a packed batch.
///
/// Query ``i`` sits at position ``p = seq_len - n_q + i`` (fla's ``TK - TQ``
/// offset), in block ``IC = p // block_size``. The compressed keys are the
/// means of the complete blocks of ``k``; each query head's softmax over the
/// ``(p + 1) // block_size`` blocks it has seen whole, of ``scale * q . ck``;
/// the probabilities summed over each KV head's query group. Blocks before
/// ``IC`` score that sum; forced blocks (``b < init_blocks`` and the
/// ``local_blocks`` blocks up to ``IC``; fla's block 0, ``IC - 1``, ``IC``)
/// ``+inf``; the rest ``-inf``. Float32 with the project's ``exp`` (InfLLM-v2's
/// stage 1), the same bits at every SIMD level (docs/nsa.md).
///
/// Parameters
/// ----------
/// q : array_like, [n_q, n_q_heads, d]
///     The queries, the sequence's last ``n_q`` tokens: float32 (float64 converted
///     once), float16, ml_dtypes bfloat16 / float8_e4m3fn, or a raw view with
///     ``query_format``.
/// k : array_like, [seq_len, n_kv_heads, d]
///     The sequence's keys, any key format, read in place.
/// block_size : int, optional
///     Tokens a block (fla's 64).
/// init_blocks, local_blocks : int, optional
///     Blocks forced at the start and up to the query's own (fla's 1 and 2).
/// scale : float, optional
///     The logits' scale, finite; ``1 / sqrt(d)`` by default (fla's).
/// k_scale : array_like of float32, [seq_len], optional
///     Each token's key scale (fp8 keys): its value is ``k * scale``.
/// query_format, key_format : str, optional
///     The formats of raw uint16 / uint8 ``q`` and ``k``.
/// cu_seqlens : array_like of int, [n_seqs + 1], optional
///     A packed batch, as fla's varlen call takes it (``parallel_nsa(...,
///     cu_seqlens)``): sequence ``s`` is keys ``cu_seqlens[s] .. cu_seqlens[s + 1]``.
///     Each row equals the dense call's on its own sequence.
/// cu_seqlens_q : array_like of int, [n_seqs + 1], optional
///     Its queries, the last of its keys (fla's ``(cu_seqlens_q, cu_seqlens_k)``;
///     default ``cu_seqlens``; alone, one sequence of all the keys).
/// window : {'fla', 'eq9'}, optional
///     ``'fla'`` (default): one compressed key per block, its mean; block ``c`` scores its
///     group sum. ``'eq9'`` (the NSA paper's Eq. 9, a named variant): compressed keys of
///     ``kernel_size`` tokens every ``kernel_stride``, block ``j`` scoring ``sum_{m <
///     block_size / kernel_stride} sum_{n < kernel_size / kernel_stride} S[(block_size /
///     kernel_stride) j - m - n]``: at the paper's 32 / 16 / 64 the keys ``4j - 4 .. 4j``,
///     weighted 1, 2, 2, 2, 1 (docs/nsa.md). Dense calls only.
/// kernel_size, kernel_stride : int, optional
///     Eq. 9's compression (the paper's 32 and 16); ignored by ``'fla'``.
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
///     (a ValueError; ``.argument`` names it) when ``q`` or ``k`` is not 3-D, their
///     ``d`` differ, ``k`` is empty (``k``); ``q``'s heads are not a multiple of
///     ``k``'s or there are more queries than tokens (``q``); ``k_scale`` is not one
///     per token; ``scale`` is not finite; ``block_size`` is 0; ``cu_seqlens`` does
///     not rise from 0 to the keys (``cu_seqlens``); ``cu_seqlens_q`` does not rise from
///     0 to the queries or gives a sequence more queries than keys (``cu_seqlens_q``);
///     ``window`` names nothing or is ``'eq9'`` with ``cu_seqlens`` (``window``); Eq. 9's
///     stride does not divide ``block_size`` or ``kernel_size`` (``kernel_stride``,
///     ``kernel_size``).
///     Also when ``out`` is refused (its shape, layout, read-only, or overlapping an input).
/// TypeError
///     when ``out`` is not a float32 ndarray.
///
/// See Also
/// --------
/// nsa_select : the blocks each query reads.
///
/// Examples
/// --------
/// >>> import numpy as np, kvselect
/// >>> q = np.ones((1, 2, 4), dtype=np.float32)
/// >>> k = np.zeros((20, 1, 4), dtype=np.float32); k[8:12] = 1.0
/// >>> s = kvselect.nsa_block_scores(q, k, block_size=4)
/// >>> s[0, 0].round(4).tolist()
/// [inf, 0.1756, 1.2976, inf, inf]
#[pyfunction]
#[pyo3(
    signature = (q, k, *, block_size=None, init_blocks=None, local_blocks=None, scale=None,
                 k_scale=None, query_format=None, key_format=None, cu_seqlens=None,
                 cu_seqlens_q=None, window=None, kernel_size=None, kernel_stride=None, out=None),
    text_signature = "(q, k, *, block_size=64, init_blocks=1, local_blocks=2, scale=None, \
                      k_scale=None, query_format=None, key_format=None, cu_seqlens=None, \
                      cu_seqlens_q=None, window='fla', kernel_size=32, kernel_stride=16, out=None)"
)]
#[allow(clippy::too_many_arguments)]
pub(super) fn nsa_block_scores<'py>(
    py: Python<'py>,
    q: &Obj<'py>,
    k: &Obj<'py>,
    block_size: Opt<'_, 'py>,
    init_blocks: Opt<'_, 'py>,
    local_blocks: Opt<'_, 'py>,
    scale: Option<f64>,
    k_scale: Opt<'_, 'py>,
    query_format: Option<Named<QueryFormat>>,
    key_format: Option<Named<KeyFormat>>,
    cu_seqlens: Opt<'_, 'py>,
    cu_seqlens_q: Opt<'_, 'py>,
    window: Option<Named<WindowName>>,
    kernel_size: Opt<'_, 'py>,
    kernel_stride: Opt<'_, 'py>,
    out: Opt<'_, 'py>,
) -> PyResult<F32<'py>> {
    let c = call(
        q,
        k,
        1,
        (block_size, init_blocks, local_blocks),
        scale,
        k_scale,
        (query_format, key_format),
        (cu_seqlens, cu_seqlens_q),
    )?;
    let w = read_window(window, (kernel_size, kernel_stride), c.cu.is_some())?;
    let (qs, ks) = (c.q.encoded()?, c.k.encoded()?);
    let nb = c.n_blocks(ks.len() / (c.n_kv * c.d).max(1));
    let mut out: Out<'py, f32> = S.output(py, out, &[c.n_q, c.n_kv, nb], &c.inputs())?;
    let sc = c.k_scale.as_ref().map(|s| s.slice()).transpose()?;
    let o = out.slice()?;
    let work = c.n_q * c.hq * ks.len() / c.n_kv.max(1);
    let (cu, heads, cfg) = (c.cu(), c.heads(), &c.cfg);
    detach(py, work, || match cu {
        None => nsa::block_scores_window_into(qs, ks, sc, heads, (cfg, w), o),
        Some(cu) => nsa::block_scores_packed_into(qs, ks, sc, heads, cu, cfg, o),
    })?;
    Ok(out.finish())
}

/// The blocks each query reads under NSA's selection as fla computes it: the
/// top ``block_counts`` of :func:`nsa_block_scores`.
///
/// The candidates are the blocks up to the query's own; ranked by score
/// descending, ties to the lower block id (with ``block_counts < 3`` the forced
/// blocks tie and the lower ids stay), decided in exact arithmetic: a block
/// whose float32 probability underflows still fills a slot, where fla's top-k
/// can leave it to its ``-1`` padding. Ascending, ``-1`` padded.
///
/// Parameters
/// ----------
/// q, k
///     As :func:`nsa_block_scores`.
/// block_counts : int, optional
///     Blocks a row (fla's 16), at least 1.
/// block_size, init_blocks, local_blocks, scale, k_scale, query_format, key_format
///     As :func:`nsa_block_scores`.
/// cu_seqlens, cu_seqlens_q : array_like of int, [n_seqs + 1], optional
///     A packed batch, as :func:`nsa_block_scores` (each sequence's block ids from 0).
/// window, kernel_size, kernel_stride : optional
///     The block scores' window, as :func:`nsa_block_scores` (fla's, or the paper's
///     Eq. 9).
/// out : ndarray of int32, [n_q, n_kv_heads, block_counts], optional
///     ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
///     aligned, native byte order, not overlapping any input (else refused, nothing written).
///
/// Returns
/// -------
/// ndarray of int32, [n_q, n_kv_heads, block_counts]
///     Block ids ascending, then ``-1``.
///
/// Raises
/// ------
/// SelectionError
///     As :func:`nsa_block_scores`, and when ``block_counts`` is 0
///     (``block_counts``).
///     Also when ``out`` is refused (its shape, layout, read-only, or overlapping an input).
/// TypeError
///     when ``out`` is not an int32 ndarray.
///
/// See Also
/// --------
/// nsa_block_scores : the scores the rows rank.
///
/// Examples
/// --------
/// >>> import numpy as np, kvselect
/// >>> q = np.ones((1, 2, 4), dtype=np.float32)
/// >>> k = np.zeros((20, 1, 4), dtype=np.float32); k[8:12] = 1.0
/// >>> kvselect.nsa_select(q, k, 4, block_size=4)[0, 0].tolist()
/// [0, 2, 3, 4]
#[pyfunction]
#[pyo3(
    signature = (q, k, block_counts=None, *, block_size=None, init_blocks=None,
                 local_blocks=None, scale=None, k_scale=None, query_format=None,
                 key_format=None, cu_seqlens=None, cu_seqlens_q=None, window=None,
                 kernel_size=None, kernel_stride=None, out=None),
    text_signature = "(q, k, block_counts=16, *, block_size=64, init_blocks=1, \
                      local_blocks=2, scale=None, k_scale=None, query_format=None, \
                      key_format=None, cu_seqlens=None, cu_seqlens_q=None, window='fla', \
                      kernel_size=32, kernel_stride=16, out=None)"
)]
#[allow(clippy::too_many_arguments)]
pub(super) fn nsa_select<'py>(
    py: Python<'py>,
    q: &Obj<'py>,
    k: &Obj<'py>,
    block_counts: Opt<'_, 'py>,
    block_size: Opt<'_, 'py>,
    init_blocks: Opt<'_, 'py>,
    local_blocks: Opt<'_, 'py>,
    scale: Option<f64>,
    k_scale: Opt<'_, 'py>,
    query_format: Option<Named<QueryFormat>>,
    key_format: Option<Named<KeyFormat>>,
    cu_seqlens: Opt<'_, 'py>,
    cu_seqlens_q: Opt<'_, 'py>,
    window: Option<Named<WindowName>>,
    kernel_size: Opt<'_, 'py>,
    kernel_stride: Opt<'_, 'py>,
    out: Opt<'_, 'py>,
) -> PyResult<I32<'py>> {
    let n = read_block_counts(block_counts)?;
    let c = call(
        q,
        k,
        n,
        (block_size, init_blocks, local_blocks),
        scale,
        k_scale,
        (query_format, key_format),
        (cu_seqlens, cu_seqlens_q),
    )?;
    let w = read_window(window, (kernel_size, kernel_stride), c.cu.is_some())?;
    let mut out: Out<'py, i32> = S.output(py, out, &[c.n_q, c.n_kv, n], &c.inputs())?;
    let (qs, ks) = (c.q.encoded()?, c.k.encoded()?);
    let sc = c.k_scale.as_ref().map(|s| s.slice()).transpose()?;
    let o = out.slice()?;
    let work = c.n_q * c.hq * ks.len() / c.n_kv.max(1);
    let (cu, heads, cfg) = (c.cu(), c.heads(), &c.cfg);
    detach(py, work, || match cu {
        None => nsa::select_window_into(qs, ks, sc, heads, (cfg, w), o),
        Some(cu) => nsa::select_packed_into(qs, ks, sc, heads, cu, cfg, o),
    })?;
    Ok(out.finish())
}
