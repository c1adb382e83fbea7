//! NSA at decode over an engine's paged cache of compressed keys:
//! `nsa_block_scores_paged` and `nsa_select_paged` (both raise
//! `SelectionError`). The cache, table, lengths and queries are read as
//! `infllm_select_paged` reads them ([`PagedDecode`]).

use numpy::PyArrayDyn;
use pyo3::prelude::*;

use super::common::{config, read_block_counts, read_geometry, read_window, WindowName};
use crate::nsa::{self, Config, Window};
use crate::python::args::{
    KeyFormat, Named, Obj, Opt, PageLayoutName, QueryFormat, I32, I32_MAX, S,
};
use crate::python::cache::{Formats, PagedDecode};

type F32<'py> = Bound<'py, PyArrayDyn<f32>>;

/// A paged call's arguments, read and checked in NSA's order (its counts,
/// geometry and window, then the cache and queries): the decode and its
/// configuration.
#[allow(clippy::too_many_arguments)]
fn paged_call<'py>(
    py: Python<'py>,
    arrays: (&Obj<'py>, &Obj<'py>, &Obj<'py>, &Obj<'py>),
    n_kv_heads: &Obj<'py>,
    block_counts: usize,
    geometry: (Opt<'_, 'py>, Opt<'_, 'py>, Opt<'_, 'py>),
    scale: Option<f64>,
    formats: Formats,
    (window, kernel_size, kernel_stride): (Option<Named<WindowName>>, Opt<'_, 'py>, Opt<'_, 'py>),
) -> PyResult<(PagedDecode<'py>, (Config, Window))> {
    let h = S.count(n_kv_heads, "n_kv_heads", I32_MAX)?;
    let geometry = read_geometry(geometry)?;
    let window = read_window(window, (kernel_size, kernel_stride), false)?;
    let c = PagedDecode::read(py, arrays, h, formats)?;
    let cfg = config(geometry, block_counts, scale, c.d);
    Ok((c, (cfg, window)))
}

/// :func:`nsa_block_scores_compressed` at decode, over an engine's paged cache of
/// compressed keys.
///
/// Sequence ``s`` decodes one query at position ``seq_lens[s] - 1``; its compressed
/// keys (``seq_lens[s] // block_size`` with ``window='fla'``, Eq. 9's ``(seq_lens[s] -
/// kernel_size) // kernel_stride + 1`` with ``window='eq9'``, 0 below ``kernel_size``
/// tokens) are read in place through its ``block_table`` row: compressed key ``j`` in
/// row ``j % page_size`` of page ``block_table[s, j // page_size]``, a row every KV
/// head's key. Row ``s`` equals :func:`nsa_block_scores_compressed` bit for bit on the
/// same compressed keys laid out densely (fp8 keys times their scales, as its
/// ``ck_scale``), then NaN past the sequence's own blocks.
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
/// block_size, init_blocks, local_blocks, scale
///     As :func:`nsa_block_scores`.
/// page_layout : {'dense', 'fp8_scaled'}, optional
///     How a page holds its keys (as :func:`infllm_select_paged`).
/// key_format, query_format : str, optional
///     The formats of a raw cache and ``q``.
/// window, kernel_size, kernel_stride : optional
///     As :func:`nsa_block_scores`.
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
///     :func:`nsa_block_scores_compressed` (``scale``, ``block_size``, ``window``,
///     ``kernel_size``, ``kernel_stride``).
///     Also when ``out`` is refused (its shape, layout, read-only, or overlapping an input).
/// TypeError
///     when ``out`` is not a float32 ndarray.
///
/// See Also
/// --------
/// nsa_select_paged : the blocks each decoding query reads.
/// nsa_block_scores_compressed : the dense form.
///
/// Examples
/// --------
/// >>> import numpy as np, kvselect
/// >>> rng = np.random.default_rng(0)
/// >>> ck = rng.standard_normal((12, 2, 8)).astype(np.float32)  # 800 tokens' keys
/// >>> q = rng.standard_normal((1, 4, 8)).astype(np.float32)
/// >>> cache = ck.reshape(3, 4, 16)[::-1]  # pages of 4 keys, stored in reverse
/// >>> table = np.array([[2, 1, 0]], dtype=np.int32)
/// >>> s = kvselect.nsa_block_scores_paged(q, cache, table, [800], 2)
/// >>> np.array_equal(s, kvselect.nsa_block_scores_compressed(q, ck, 800))
/// True
#[pyfunction]
#[pyo3(
    signature = (q, kv_cache, block_table, seq_lens, n_kv_heads, *, block_size=None,
                 init_blocks=None, local_blocks=None, scale=None, page_layout=None,
                 key_format=None, query_format=None, window=None, kernel_size=None,
                 kernel_stride=None, out=None),
    text_signature = "(q, kv_cache, block_table, seq_lens, n_kv_heads, *, block_size=64, \
                      init_blocks=1, local_blocks=2, scale=None, page_layout='dense', \
                      key_format=None, query_format=None, window='fla', kernel_size=32, \
                      kernel_stride=16, out=None)"
)]
#[allow(clippy::too_many_arguments)]
pub(super) fn nsa_block_scores_paged<'py>(
    py: Python<'py>,
    q: &Obj<'py>,
    kv_cache: &Obj<'py>,
    block_table: &Obj<'py>,
    seq_lens: &Obj<'py>,
    n_kv_heads: &Obj<'py>,
    block_size: Opt<'_, 'py>,
    init_blocks: Opt<'_, 'py>,
    local_blocks: Opt<'_, 'py>,
    scale: Option<f64>,
    page_layout: Option<Named<PageLayoutName>>,
    key_format: Option<Named<KeyFormat>>,
    query_format: Option<Named<QueryFormat>>,
    window: Option<Named<WindowName>>,
    kernel_size: Opt<'_, 'py>,
    kernel_stride: Opt<'_, 'py>,
    out: Opt<'_, 'py>,
) -> PyResult<F32<'py>> {
    let (c, cfg) = paged_call(
        py,
        (q, kv_cache, block_table, seq_lens),
        n_kv_heads,
        1,
        (block_size, init_blocks, local_blocks),
        scale,
        (page_layout, key_format, query_format),
        (window, kernel_size, kernel_stride),
    )?;
    let nb = c.widest(|l| cfg.0.n_blocks(l))?;
    let (heads, h) = (c.heads(), c.n_kv_heads);
    c.run(py, out, &[c.lens.len(), h, nb], c.work(), |qs, cache, table, o| {
        nsa::block_scores_paged_into(qs, cache, table, heads, (&cfg.0, cfg.1), o)
    })
}

/// :func:`nsa_select_compressed` at decode, over an engine's paged cache of compressed
/// keys (see :func:`nsa_block_scores_paged`): the blocks each decoding query reads.
///
/// Equal, row for row and bit for bit, to :func:`nsa_select_compressed` on each
/// sequence's compressed keys laid out densely (fp8 keys times their scales), its one
/// query at its last token.
///
/// Parameters
/// ----------
/// q, kv_cache, block_table, seq_lens, n_kv_heads
///     As :func:`nsa_block_scores_paged`.
/// block_counts : int, optional
///     Blocks a row (fla's 16), at least 1.
/// block_size, init_blocks, local_blocks, scale, page_layout, key_format, query_format
///     As :func:`nsa_block_scores_paged`.
/// window, kernel_size, kernel_stride : optional
///     As :func:`nsa_block_scores`.
/// out : ndarray of int32, [n_seqs, n_kv_heads, block_counts], optional
///     ``out=`` reuses a buffer: written in place and returned. C-contiguous, writeable,
///     aligned, native byte order, not overlapping any input (else refused, nothing written).
///
/// Returns
/// -------
/// ndarray of int32, [n_seqs, n_kv_heads, block_counts]
///     Block ids ascending, then ``-1``.
///
/// Raises
/// ------
/// SelectionError
///     As :func:`nsa_block_scores_paged`, and when ``block_counts`` is 0
///     (``block_counts``).
///     Also when ``out`` is refused (its shape, layout, read-only, or overlapping an input).
/// TypeError
///     when ``out`` is not an int32 ndarray.
///
/// See Also
/// --------
/// nsa_select_compressed : the dense form.
/// infllm_select_paged : InfLLM-v2's paged decode, on the same kind of cache.
///
/// Examples
/// --------
/// >>> import numpy as np, kvselect
/// >>> rng = np.random.default_rng(0)
/// >>> ck = rng.standard_normal((12, 2, 8)).astype(np.float32)  # 800 tokens' keys
/// >>> q = rng.standard_normal((1, 4, 8)).astype(np.float32)
/// >>> cache = ck.reshape(3, 4, 16)[::-1]  # pages of 4 keys, stored in reverse
/// >>> table = np.array([[2, 1, 0]], dtype=np.int32)
/// >>> rows = kvselect.nsa_select_paged(q, cache, table, [800], 2, 4)
/// >>> rows.shape, np.array_equal(rows, kvselect.nsa_select_compressed(q, ck, 800, 4))
/// ((1, 2, 4), True)
#[pyfunction]
#[pyo3(
    signature = (q, kv_cache, block_table, seq_lens, n_kv_heads, block_counts=None, *,
                 block_size=None, init_blocks=None, local_blocks=None, scale=None,
                 page_layout=None, key_format=None, query_format=None, window=None,
                 kernel_size=None, kernel_stride=None, out=None),
    text_signature = "(q, kv_cache, block_table, seq_lens, n_kv_heads, block_counts=16, *, \
                      block_size=64, init_blocks=1, local_blocks=2, scale=None, \
                      page_layout='dense', key_format=None, query_format=None, window='fla', \
                      kernel_size=32, kernel_stride=16, out=None)"
)]
#[allow(clippy::too_many_arguments)]
pub(super) fn nsa_select_paged<'py>(
    py: Python<'py>,
    q: &Obj<'py>,
    kv_cache: &Obj<'py>,
    block_table: &Obj<'py>,
    seq_lens: &Obj<'py>,
    n_kv_heads: &Obj<'py>,
    block_counts: Opt<'_, 'py>,
    block_size: Opt<'_, 'py>,
    init_blocks: Opt<'_, 'py>,
    local_blocks: Opt<'_, 'py>,
    scale: Option<f64>,
    page_layout: Option<Named<PageLayoutName>>,
    key_format: Option<Named<KeyFormat>>,
    query_format: Option<Named<QueryFormat>>,
    window: Option<Named<WindowName>>,
    kernel_size: Opt<'_, 'py>,
    kernel_stride: Opt<'_, 'py>,
    out: Opt<'_, 'py>,
) -> PyResult<I32<'py>> {
    let n = read_block_counts(block_counts)?;
    let (c, cfg) = paged_call(
        py,
        (q, kv_cache, block_table, seq_lens),
        n_kv_heads,
        n,
        (block_size, init_blocks, local_blocks),
        scale,
        (page_layout, key_format, query_format),
        (window, kernel_size, kernel_stride),
    )?;
    let (heads, h) = (c.heads(), c.n_kv_heads);
    c.run(py, out, &[c.lens.len(), h, n], c.work(), |qs, cache, table, o| {
        nsa::select_paged_into(qs, cache, table, heads, (&cfg.0, cfg.1), o)
    })
}
