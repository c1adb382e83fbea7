//! Quest's page bounds, page scores and page sets (all raise `SelectionError`).

use numpy::{PyArrayDyn, PyUntypedArray};
use pyo3::prelude::*;
use pyo3::types::PyInt;

use super::args::KeyFormat;
use super::args::{
    detach, ndarrays, positions, AsFormatArg, EncodedIn, Named, Obj, Opt, Out, PageLayoutName,
    QueryFormat, QuestVariantName, I32, I32_MAX, S,
};
use super::cache::Paged;
use super::errors::refuse;
use crate::quest::{self, Layout, Variant, QUEST_PAGE_SIZE, SGLANG_RECENT_PAGES};

type F32<'py> = Bound<'py, PyArrayDyn<f32>>;

/// The variant an option string and `num_recent_pages` name.
fn variant(name: &Named<QuestVariantName>, recent: Opt) -> PyResult<Variant> {
    let r = S.count_or(recent, "num_recent_pages", I32_MAX, SGLANG_RECENT_PAGES)?;
    Ok(match name.get()? {
        QuestVariantName::Kernel => Variant::Kernel,
        QuestVariantName::Eval => Variant::Eval,
        QuestVariantName::Sglang => Variant::Sglang {
            num_recent_pages: r,
        },
    })
}

/// The `[n_pages, n_kv_heads, d]` float32 bounds: the caller's `out=(kmin,
/// kmax)` (checked as every `out=`, overlapping neither the inputs nor each
/// other) or two new zeroed arrays.
fn bounds_out<'py>(
    py: Python<'py>,
    out: Opt<'_, 'py>,
    (n_pages, l): (usize, Layout),
    inputs: &[&Bound<'py, PyUntypedArray>],
) -> PyResult<(Out<'py, f32>, Out<'py, f32>)> {
    let shape = [n_pages, l.n_kv_heads, l.d];
    let [lo, hi] = S.outputs(py, out, ("(kmin, kmax)", [&shape, &shape]), inputs)?;
    Ok((lo, hi))
}

/// Every page's element-wise key bounds: Quest's page metadata.
///
/// Page ``p`` of a sequence covers its tokens ``p * page_size .. min((p + 1) *
/// page_size, len)``: ``kmin[p, h, i]`` and ``kmax[p, h, i]`` are the least and
/// greatest ``keys[t, h, i]`` over them (exact: no arithmetic but ``k * scale``
/// rounded to float32 for scaled keys; NaN keys ignored). A partly filled last
/// page is bounded over its own keys only.
///
/// Parameters
/// ----------
/// keys : array_like, [n_tokens, n_kv_heads, d]
///     The keys: float32 (float64 converted once), float16, ml_dtypes bfloat16 /
///     float8_e4m3fn, or a raw uint16 / uint8 view with ``key_format``. Any CPU
///     DLPack tensor too.
/// page_size : int, optional
///     Tokens per page (default 16, Quest's).
/// key_scale : array_like of float32, [n_tokens], optional
///     Each token's scale (fp8 keys): a key's value is ``k * scale``.
/// key_format : str, optional
///     The format of a raw uint16 / uint8 ``keys``.
/// cu_seqlens : array_like of int, [n_seqs + 1], optional
///     A packed batch: sequence ``s`` is tokens ``cu_seqlens[s] .. cu_seqlens[s +
///     1]``, its pages after the previous sequence's. None: one sequence.
/// out : tuple of two ndarrays of float32, optional
///     ``(kmin, kmax)`` to write and return (an engine's metadata cache):
///     C-contiguous, writeable, aligned, not overlapping any input or each other.
///
/// Returns
/// -------
/// kmin, kmax : ndarray of float32, [n_pages, n_kv_heads, d]
///     ``n_pages`` is the sum of each sequence's ``ceil(len / page_size)``.
///
/// Raises
/// ------
/// SelectionError
///     (a ValueError; ``.argument`` names it) when ``keys`` is not 3-D or has a zero
///     axis but the first (``keys``, ``n_kv_heads``, ``d``); ``page_size`` is 0;
///     ``key_scale`` is not one per token; ``cu_seqlens`` does not rise from 0 to
///     ``n_tokens``; a format name is unknown; ``out`` is refused (``out``).
/// TypeError
///     when ``keys`` is no key format or ``out`` not two float32 ndarrays.
///
/// See Also
/// --------
/// quest_update : the O(n_kv_heads d) update of one decode step.
/// quest_bounds_paged : the bounds of an engine's paged cache.
///
/// Examples
/// --------
/// >>> import numpy as np, kvselect
/// >>> keys = np.array([[[1.0, -2.0]], [[3.0, 0.5]], [[-1.0, 4.0]]], dtype=np.float32)
/// >>> kmin, kmax = kvselect.quest_bounds(keys, page_size=2)
/// >>> kmin[:, 0].tolist(), kmax[:, 0].tolist()
/// ([[1.0, -2.0], [-1.0, 4.0]], [[3.0, 0.5], [-1.0, 4.0]])
#[pyfunction]
#[pyo3(
    signature = (keys, page_size=None, *, key_scale=None, key_format=None, cu_seqlens=None, out=None),
    text_signature = "(keys, page_size=16, *, key_scale=None, key_format=None, cu_seqlens=None, out=None)"
)]
pub(super) fn quest_bounds<'py>(
    py: Python<'py>,
    keys: &Obj<'py>,
    page_size: Opt<'_, 'py>,
    key_scale: Opt<'_, 'py>,
    key_format: Option<Named<KeyFormat>>,
    cu_seqlens: Opt<'_, 'py>,
    out: Opt<'_, 'py>,
) -> PyResult<(F32<'py>, F32<'py>)> {
    let p = S.count_or(page_size, "page_size", I32_MAX, QUEST_PAGE_SIZE)?;
    let layout = "[n_tokens, n_kv_heads, d]";
    let (k, [n, h, d]) = EncodedIn::new_3d(S, keys, "keys", layout, key_format.format_arg())?;
    let l = Layout::new(h, d, p);
    let scale = match key_scale {
        Some(o) => Some(S.input::<f32, 1>(o, "key_scale", "[n_tokens]")?),
        None => None,
    };
    let cu = cu_seqlens
        .map(|o| positions(S, o, "cu_seqlens"))
        .transpose()?;
    let n_pages: usize = match &cu {
        Some(c) => c
            .windows(2)
            .map(|w| quest::pages_of(w[1].saturating_sub(w[0]), p))
            .sum(),
        None => quest::pages_of(n, p),
    };
    // cu_seqlens is read through a copy: as positions and lengths everywhere,
    // it is memory an output must not share whatever the core does with it.
    let raw = cu_seqlens.map(|c| ndarrays(&[c])).unwrap_or_default();
    let mut inputs = vec![k.untyped()];
    inputs.extend(scale.as_ref().map(|s| s.untyped()));
    inputs.extend(raw.iter());
    let (mut lo, mut hi) = bounds_out(py, out, (n_pages, l), &inputs)?;
    let (enc, sc) = (k.encoded()?, scale.as_ref().map(|s| s.slice()).transpose()?);
    let (lo_s, hi_s) = (lo.slice()?, hi.slice()?);
    detach(py, enc.len(), || {
        quest::bounds_into(enc, sc, cu.as_deref(), l, lo_s, hi_s)
    })?;
    Ok((lo.finish(), hi.finish()))
}

/// The page bounds of the sequences in an engine's paged key cache.
///
/// A cache page is a Quest page. Sequence ``s`` holds ``seq_lens[s]`` tokens through
/// its ``block_table`` row; the bounds equal :func:`quest_bounds`' of the same keys laid
/// out densely (fp8 keys times their scales), sequence after sequence.
///
/// Parameters
/// ----------
/// kv_cache : array_like, [num_blocks, page_size, n_kv_heads * d]
///     The pages read in place (an engine's ``[.., n_kv_heads, d]`` cache reshaped; any
///     block stride), or uint8 pages of fp8 keys then one float32 scale per token
///     (``[num_blocks, page_size, n_kv_heads * d + 4]``, ``page_layout='fp8_scaled'``).
/// block_table : array_like of int32, [n_seqs, max_blocks]
///     Logical page -> cache block, per sequence.
/// seq_lens : array_like of int, [n_seqs]
///     Tokens per sequence.
/// n_kv_heads : int
///     KV heads per token (``d`` is the row's elements over it).
/// page_layout : {'dense', 'fp8_scaled'}, optional
///     How a page holds its keys.
/// key_format : str, optional
///     The format of a raw uint16 / uint8 dense cache.
/// out : tuple of two ndarrays of float32, optional
///     ``(kmin, kmax)`` to write and return (an engine's metadata cache):
///     C-contiguous, writeable, aligned, not overlapping any input or each other.
///
/// Returns
/// -------
/// kmin, kmax : ndarray of float32, [n_pages, n_kv_heads, d]
///
/// Raises
/// ------
/// SelectionError
///     when the cache's layout, block table or lengths are refused (``kv_cache``,
///     ``block_table``, ``seq_lens``), ``n_kv_heads`` does not divide a row, or ``out``
///     is refused (``out``).
/// TypeError
///     when the cache's dtype is no key format or ``out`` not two float32 ndarrays.
///
/// See Also
/// --------
/// quest_bounds : the same bounds from dense keys.
///
/// Examples
/// --------
/// >>> import numpy as np, kvselect
/// >>> cache = np.arange(2 * 2 * 4, dtype=np.float32).reshape(2, 2, 4)  # 2 pages of 2
/// >>> kmin, kmax = kvselect.quest_bounds_paged(cache, np.array([[1, 0]], np.int32), [3], 2, )
/// >>> kmin.shape, kmin[0, 1].tolist(), kmax[1, 0].tolist()
/// ((2, 2, 2), [10.0, 11.0], [0.0, 1.0])
#[pyfunction]
#[pyo3(
    signature = (kv_cache, block_table, seq_lens, n_kv_heads, *, page_layout=None, key_format=None,
                 out=None),
    text_signature = "(kv_cache, block_table, seq_lens, n_kv_heads, *, page_layout='dense', \
                      key_format=None, out=None)"
)]
pub(super) fn quest_bounds_paged<'py>(
    py: Python<'py>,
    kv_cache: &Obj<'py>,
    block_table: &Obj<'py>,
    seq_lens: &Obj<'py>,
    n_kv_heads: &Obj<'py>,
    page_layout: Option<Named<PageLayoutName>>,
    key_format: Option<Named<KeyFormat>>,
    out: Opt<'_, 'py>,
) -> PyResult<(F32<'py>, F32<'py>)> {
    let h = S.count(n_kv_heads, "n_kv_heads", I32_MAX)?;
    let arrays = (kv_cache, block_table, seq_lens);
    let (paged, lens) = Paged::whole_sequences(py, arrays, h, page_layout, key_format)?;
    // The bounds are sized by the lengths: each checked before they are.
    for (s, &len) in lens.iter().enumerate() {
        crate::keys::paged::check_len_fits(s, len)?;
    }
    let block_size = paged.block_size();
    let l = Layout::new(h, paged.d / h, block_size);
    let n_pages: usize = lens.iter().map(|&n| quest::pages_of(n, block_size)).sum();
    let lens_raw = ndarrays(&[seq_lens]);
    let inputs: Vec<_> = paged.untyped().into_iter().chain(&lens_raw).collect();
    let (mut lo, mut hi) = bounds_out(py, out, (n_pages, l), &inputs)?;
    let (cache, table) = (paged.cache(), paged.table()?);
    let (lo_s, hi_s) = (lo.slice()?, hi.slice()?);
    detach(py, lo_s.len(), || {
        quest::bounds_paged_into(&cache, &table, l, lo_s, hi_s)
    })?;
    Ok((lo.finish(), hi.finish()))
}

/// One decode step's update of the page bounds, in place, in O(n_kv_heads d).
///
/// Token ``pos``'s keys are folded into page ``pos // page_size``: the page's first
/// token (``pos % page_size == 0``) sets its bounds (so nothing stale of an earlier
/// sequence in the buffer survives), every later one folds in. Updating tokens 0, 1,
/// ... in order gives :func:`quest_bounds`' bounds bit for bit.
///
/// Parameters
/// ----------
/// kmin, kmax : ndarray of float32, [n_pages, n_kv_heads, d]
///     The bounds, written in place: C-contiguous, writeable, not overlapping.
/// key : array_like, [n_kv_heads, d]
///     The new token's keys, formats as :func:`quest_bounds`.
/// pos : int
///     Its position in the sequence.
/// page_size : int, optional
///     Tokens per page (default 16).
/// key_scale : float, optional
///     Its scale (fp8 keys).
/// key_format : str, optional
///     The format of a raw uint16 / uint8 ``key``.
///
/// Raises
/// ------
/// SelectionError
///     when ``key`` is not ``[n_kv_heads, d]`` of the bounds (``key``), ``pos`` is in
///     no page they hold (``pos``), or a buffer is refused (``kmin``, ``kmax``).
///     Nothing is written then.
///
/// See Also
/// --------
/// quest_bounds : the bounds built from every key.
///
/// Examples
/// --------
/// >>> import numpy as np, kvselect
/// >>> kmin, kmax = np.zeros((1, 1, 2), np.float32), np.zeros((1, 1, 2), np.float32)
/// >>> for t, k in enumerate([[1.0, -2.0], [3.0, 0.5]]):
/// ...     kvselect.quest_update(kmin, kmax, np.array([k], np.float32), t)
/// >>> kmin.tolist(), kmax.tolist()
/// ([[[1.0, -2.0]]], [[[3.0, 0.5]]])
#[pyfunction]
#[pyo3(
    signature = (kmin, kmax, key, pos, page_size=None, *, key_scale=None, key_format=None),
    text_signature = "(kmin, kmax, key, pos, page_size=16, *, key_scale=None, key_format=None)"
)]
pub(super) fn quest_update<'py>(
    kmin: &Obj<'py>,
    kmax: &Obj<'py>,
    key: &Obj<'py>,
    pos: &Obj<'py>,
    page_size: Opt<'_, 'py>,
    key_scale: Option<f32>,
    key_format: Option<Named<KeyFormat>>,
) -> PyResult<()> {
    let p = S.count_or(page_size, "page_size", I32_MAX, QUEST_PAGE_SIZE)?;
    let pos = S.count(pos, "pos", I32_MAX)?;
    let (k, shape) = EncodedIn::new(S, key, "key", key_format.format_arg())?;
    let mut lo = S.inplace::<f32>(kmin, "kmin", 3, &[k.untyped()])?;
    let mut hi = S.inplace::<f32>(kmax, "kmax", 3, &[k.untyped(), lo.untyped()])?;
    let bshape = lo.shape().to_vec();
    if hi.shape() != &bshape[..] {
        let msg = format!("kmax has shape {:?} but kmin {bshape:?}", hi.shape());
        return Err(refuse(S, "kmax", msg));
    }
    if shape[..] != bshape[1..] {
        let msg = format!(
            "key must be [n_kv_heads={}, d={}] as the bounds, got {shape:?}",
            bshape[1], bshape[2]
        );
        return Err(refuse(S, "key", msg));
    }
    let l = Layout::new(bshape[1], bshape[2], p);
    let enc = k.encoded()?;
    let (lo_s, hi_s) = (lo.slice()?, hi.slice()?);
    quest::update_bounds(enc, key_scale, pos, l, lo_s, hi_s)?;
    Ok(())
}

/// The bounds `[n_pages, n_kv_heads, d]` as the core reads them.
fn bounds_in<'py>(
    kmin: &Obj<'py>,
    kmax: &Obj<'py>,
) -> PyResult<(super::args::In<'py, f32, 3>, super::args::In<'py, f32, 3>)> {
    let what = "[n_pages, n_kv_heads, d]";
    let lo = S.input::<f32, 3>(kmin, "kmin", what)?;
    let hi = S.input::<f32, 3>(kmax, "kmax", what)?;
    if hi.shape != lo.shape {
        let msg = format!("kmax has shape {:?} but kmin {:?}", hi.shape, lo.shape);
        return Err(refuse(S, "kmax", msg));
    }
    Ok((lo, hi))
}

/// Every page's Quest score for a decoding query: the bound on ``q . k`` its keys allow.
///
/// ``variant='kernel'`` (or ``'eval'``, which scores alike): per query head ``j``, page
/// ``p`` scores ``sum_i max(q_ji * kmax[p, h, i], q_ji * kmin[p, h, i])`` against its KV
/// head ``h = j // (n_q_heads // n_kv_heads)``. ``variant='sglang'``: each KV head's
/// query heads averaged (rounded to ``q``'s dtype), the page scored against every KV
/// head and the heads summed. float32, summed in kvselect's fixed order.
///
/// Parameters
/// ----------
/// q : array_like, [n_q_heads, d]
///     The decoding query: float32, float16, bfloat16 (formats as the keys').
/// kmin, kmax : array_like of float32, [n_pages, n_kv_heads, d]
///     The page bounds (:func:`quest_bounds`).
/// variant : {'kernel', 'eval', 'sglang'}, optional
///     Whose score (default ``'kernel'``).
/// query_format : str, optional
///     The format of a raw uint16 ``q``.
/// out : ndarray of float32, [n_q_heads, n_pages] (``'sglang'``: [n_pages]), optional
///     ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
///     aligned, native byte order, not overlapping any input (else refused, nothing written).
///
/// Returns
/// -------
/// ndarray of float32, [n_q_heads, n_pages] (``'sglang'``: [n_pages])
///
/// Raises
/// ------
/// SelectionError
///     when ``q``'s heads are not a multiple of the KV heads or its ``d`` is not the
///     bounds' (``q``), the bounds differ in shape (``kmax``), or ``out`` is refused
///     (its shape, layout, read-only, or overlapping an input).
/// TypeError
///     when ``out`` is not a float32 ndarray.
///
/// See Also
/// --------
/// quest_select : the page sets these scores rank.
///
/// Examples
/// --------
/// >>> import numpy as np, kvselect
/// >>> kmin = np.array([[[0.0, -1.0]], [[-2.0, 1.0]]], np.float32)
/// >>> kmax = np.array([[[1.0, 2.0]], [[3.0, 1.0]]], np.float32)
/// >>> kvselect.quest_scores(np.array([[1.0, -1.0]], np.float32), kmin, kmax).tolist()
/// [[2.0, 2.0]]
#[pyfunction]
#[pyo3(
    signature = (q, kmin, kmax, *, variant=None, query_format=None, out=None),
    text_signature = "(q, kmin, kmax, *, variant='kernel', query_format=None, out=None)"
)]
pub(super) fn quest_scores<'py>(
    py: Python<'py>,
    q: &Obj<'py>,
    kmin: &Obj<'py>,
    kmax: &Obj<'py>,
    variant: Option<Named<QuestVariantName>>,
    query_format: Option<Named<QueryFormat>>,
    out: Opt<'_, 'py>,
) -> PyResult<F32<'py>> {
    let v = self::variant(
        &variant.unwrap_or(Named::known(QuestVariantName::Kernel)),
        None,
    )?;
    let (qe, qshape) = EncodedIn::new(S, q, "q", query_format.format_arg())?;
    let [hq, dq] = qshape[..] else {
        let msg = format!("q must be 2-D [n_q_heads, d], got {}-D {:?}", qshape.len(), qshape);
        return Err(refuse(S, "q", msg));
    };
    let (lo, hi) = bounds_in(kmin, kmax)?;
    let [np_, h, d] = lo.shape;
    if dq != d {
        return Err(refuse(S, "q", format!("q has d={dq} but the bounds d={d}")));
    }
    let l = Layout::new(h, d, 1);
    let sglang = matches!(v, Variant::Sglang { .. });
    let shape: Vec<usize> = if sglang { vec![np_] } else { vec![hq, np_] };
    let inputs = [qe.untyped(), lo.untyped(), hi.untyped()];
    let mut out: Out<'py, f32> = S.output(py, out, &shape, &inputs)?;
    let (qs, lo_s, hi_s) = (qe.encoded()?, lo.slice()?, hi.slice()?);
    let o = out.slice()?;
    detach(py, lo_s.len(), || {
        if sglang {
            quest::grouped_scores_into(qs, hq, lo_s, hi_s, l, o)
        } else {
            quest::scores_into(qs, hq, lo_s, hi_s, l, o)
        }
    })?;
    Ok(out.finish())
}

/// The pages each decoding query reads: Quest's page set.
///
/// ``variant='kernel'`` (Quest's kernels): every page when a sequence's
/// ``ceil(len / page_size)`` pages fit ``page_budget``; else its last page, forced, and the
/// ``page_budget - 1`` best of the others, per query head. ``'eval'`` (Quest's evaluation
/// script): the best ``min(max(3, min(len, page_budget * page_size) // page_size), n_pages)``
/// pages, none forced. ``'sglang'``: one set per sequence, the newest
/// ``num_recent_pages`` pages forced and the best ``max(page_budget - num_recent_pages, 1)``
/// of the pages before them (every page when there are none). Ties go to the lower
/// page id; each row ascending, then -1.
///
/// Parameters
/// ----------
/// q : array_like, [n_q_heads, d] or [n_seqs, n_q_heads, d]
///     Each sequence's decoding query (2-D with an integer ``seq_lens``).
/// kmin, kmax : array_like of float32, [n_pages, n_kv_heads, d]
///     The sequences' page bounds, sequence after sequence (:func:`quest_bounds`).
/// seq_lens : int or array_like of int, [n_seqs]
///     Tokens per sequence (the query's own included), each >= 1.
/// page_budget : int
///     Pages per query, forced ones counted, >= 1.
/// page_size : int, optional
///     Tokens per page (default 16).
/// variant : {'kernel', 'eval', 'sglang'}, optional
///     Whose page set (default ``'kernel'``).
/// num_recent_pages : int, optional
///     SGLang's forced newest pages (default 4).
/// query_format : str, optional
///     The format of a raw uint16 ``q``.
/// out : ndarray of int32, [rows, width] (or [n_seqs, rows, width]), optional
///     ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
///     aligned, native byte order, not overlapping any input (else refused, nothing written).
///
/// Returns
/// -------
/// ndarray of int32, [rows, width] (or [n_seqs, rows, width])
///     ``rows`` is ``n_q_heads`` (1 for ``'sglang'``), ``width`` the most pages the
///     variant selects: ``page_budget`` (``'eval'``: ``max(page_budget, 3)``; ``'sglang'``:
///     ``max(page_budget - r, 1) + r``).
///
/// Raises
/// ------
/// SelectionError
///     when ``page_budget`` is 0 (``page_budget``), a sequence is empty (``seq_lens``), the bounds
///     are not the sequences' pages (``kmin``), ``q`` does not fit them (``q``), or ``out``
///     is refused (its shape, layout, read-only, or overlapping an input).
/// TypeError
///     when ``out`` is not an int32 ndarray.
///
/// See Also
/// --------
/// quest_scores : the scores ranked.
///
/// Examples
/// --------
/// >>> import numpy as np, kvselect
/// >>> keys = np.array([5, 1, 4, -9, 3], np.float32).reshape(5, 1, 1)
/// >>> kmin, kmax = kvselect.quest_bounds(keys, page_size=1)
/// >>> kvselect.quest_select(np.ones((1, 1), np.float32), kmin, kmax, 5, 3, page_size=1)
/// array([[0, 2, 4]], dtype=int32)
#[pyfunction]
#[pyo3(
    signature = (q, kmin, kmax, seq_lens, page_budget, page_size=None, *, variant=None,
                 num_recent_pages=None, query_format=None, out=None),
    text_signature = "(q, kmin, kmax, seq_lens, page_budget, page_size=16, *, variant='kernel', \
                      num_recent_pages=4, query_format=None, out=None)"
)]
pub(super) fn quest_select<'py>(
    py: Python<'py>,
    q: &Obj<'py>,
    kmin: &Obj<'py>,
    kmax: &Obj<'py>,
    seq_lens: &Obj<'py>,
    page_budget: &Obj<'py>,
    page_size: Opt<'_, 'py>,
    variant: Option<Named<QuestVariantName>>,
    num_recent_pages: Opt<'_, 'py>,
    query_format: Option<Named<QueryFormat>>,
    out: Opt<'_, 'py>,
) -> PyResult<I32<'py>> {
    let p = S.count_or(page_size, "page_size", I32_MAX, QUEST_PAGE_SIZE)?;
    let page_budget = S.count(page_budget, "page_budget", I32_MAX)?;
    quest::check_budget(page_budget)?;
    let v = self::variant(
        &variant.unwrap_or(Named::known(QuestVariantName::Kernel)),
        num_recent_pages,
    )?;
    let single = seq_lens.is_instance_of::<PyInt>();
    let lens = if single {
        vec![S.count(seq_lens, "seq_lens", I32_MAX)?]
    } else {
        positions(S, seq_lens, "seq_lens")?
    };
    let (qe, qshape) = EncodedIn::new(S, q, "q", query_format.format_arg())?;
    let (hq, dq) = match (single, &qshape[..]) {
        (true, &[hq, dq]) => (hq, dq),
        (false, &[n, hq, dq]) if n == lens.len() => (hq, dq),
        _ => {
            let (n, why) = (
                lens.len(),
                ["", " (seq_lens is one integer)"][single as usize],
            );
            let want = ["[n_seqs={n}, n_q_heads, d]", "[n_q_heads, d]"][single as usize];
            let msg = format!(
                "q must be {}{why}, got {qshape:?}",
                want.replace("{n}", &n.to_string())
            );
            return Err(refuse(S, "q", msg));
        }
    };
    let (lo, hi) = bounds_in(kmin, kmax)?;
    let [_, h, d] = lo.shape;
    if dq != d {
        return Err(refuse(S, "q", format!("q has d={dq} but the bounds d={d}")));
    }
    let l = Layout::new(h, d, p);
    let rows = if matches!(v, Variant::Sglang { .. }) {
        1
    } else {
        hq
    };
    let w = quest::width(v, page_budget);
    if w > I32_MAX as usize {
        let msg = "page_budget is too large: rows would be wider than int32";
        return Err(refuse(S, "page_budget", msg));
    }
    let mut shape = vec![rows, w];
    if !single {
        shape.insert(0, lens.len());
    }
    let raw = ndarrays(&[seq_lens]);
    let inputs: Vec<&Bound<'py, PyUntypedArray>> = [qe.untyped(), lo.untyped(), hi.untyped()]
        .into_iter()
        .chain(&raw)
        .collect();
    let mut out: Out<'py, i32> = S.output(py, out, &shape, &inputs)?;
    let (qs, lo_s, hi_s) = (qe.encoded()?, lo.slice()?, hi.slice()?);
    let o = out.slice()?;
    detach(py, lo_s.len(), || {
        quest::select_into(qs, hq, lo_s, hi_s, &lens, l, page_budget, v, o)
    })?;
    Ok(out.finish())
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(quest_bounds, m)?)?;
    m.add_function(wrap_pyfunction!(quest_bounds_paged, m)?)?;
    m.add_function(wrap_pyfunction!(quest_update, m)?)?;
    m.add_function(wrap_pyfunction!(quest_scores, m)?)?;
    m.add_function(wrap_pyfunction!(quest_select, m)?)?;
    Ok(())
}
