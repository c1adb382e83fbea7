//! The segment witness spec's API: the segment map, the witness indices,
//! and merging witnesses into (or scattering them over) an engine's rows.
//!
//! Reads token positions, context lengths, segment counts and rows. The
//! rule: every count fits int32 (a merge's segment count at most
//! `MAX_TOPOLOGY_SEGMENTS`, its occupancy mask), and the outputs the spec
//! writes whole are never zeroed first.

use pyo3::prelude::*;

use crate::python::args::{detach, ndarrays, Obj, Opt, I32, W};
use crate::witness;

/// What a merge's segment count is bounded by (the 64-bit occupancy mask).
const MERGE_MAX: u64 = witness::MAX_TOPOLOGY_SEGMENTS as u64;

/// The segment of one token: the segment map itself.
///
/// The segment of ``token`` in a row of ``context_len`` tokens cut into ``num_segments``
/// segments, ``floor(token * S_eff / L)`` with ``L = max(context_len, 1)`` and
/// ``S_eff = min(num_segments, L)``, exact for every integer up to 2**64 - 1. Not clamped:
/// an out-of-range token maps past the partition (``segment_of(20, 4, 8) == 20``); only the
/// merge clamps to ``S - 1``.
///
/// Parameters
/// ----------
/// token : int
///     The token's position, 0 to 2**64 - 1 (a Python or NumPy integer).
/// context_len : int
///     The row's length ``L``, 0 to 2**64 - 1 (0 is read as 1).
/// num_segments : int
///     The segment count ``S``, 0 to 2**64 - 1.
///
/// Returns
/// -------
/// int
///     The segment index, ``floor(token * S_eff / L)``.
///
/// Raises
/// ------
/// WitnessError
///     (a ValueError; ``.argument`` names the argument) when an argument is negative or
///     above 2**64 - 1.
/// TypeError
///     when an argument is not an integer (a float, NaN, a string, None).
#[pyfunction]
pub(super) fn segment_of(token: &Obj, context_len: &Obj, num_segments: &Obj) -> PyResult<usize> {
    let token = W.count(token, "token", u64::MAX)?;
    let len = W.count(context_len, "context_len", u64::MAX)?;
    let s = W.count(num_segments, "num_segments", u64::MAX)?;
    Ok(witness::segment_of(token, len, s))
}

/// The witnesses of every learned row, one slot per segment.
///
/// Slot ``s`` of row ``r`` holds the left edge ``e_s = ceil(s * L / S_eff)`` of segment
/// ``s`` when the row does not occupy it, ``-1`` when it does or ``s >= S_eff``
/// (``L = context_lens[r]``, ``S_eff = min(num_segments, L)``). A row of length <= 0 gets
/// none. Any positive segment count is accepted.
///
/// Parameters
/// ----------
/// learned : array_like of int, [rows, topk]
///     Row-relative offsets, negative = padding; any integer dtype whose values fit int32
///     (int64 ``torch.topk`` indices convert once), any layout (copied once when not
///     C-contiguous, aligned and native int32). Any CPU DLPack tensor too.
/// context_lens : array_like of int, [rows]
///     Each row's length ``L``, values within int32; one per learned row.
/// num_segments : int
///     The segment count ``S``, 1 to 2**32 - 1.
/// out : ndarray of int32, [rows, num_segments], optional
///     Reuses a buffer: written in place and returned. Exactly that shape, native int32,
///     C-contiguous, aligned, writeable, sharing no input's memory (an ndarray or a CPU
///     DLPack tensor; never converted). A refused call leaves it untouched.
///
/// Returns
/// -------
/// ndarray of int32, [rows, num_segments]
///     The witnesses (``out`` itself when given).
///
/// Raises
/// ------
/// WitnessError
///     (a ValueError; ``.argument`` names the argument) when ``learned`` is not 2-D,
///     ``context_lens`` is not 1-D with one entry per row, a value does not fit int32,
///     ``num_segments`` is 0, negative or above 2**32 - 1, ``out`` has another shape, is not
///     C-contiguous, aligned and writeable, or overlaps an input, or a tensor is not on
///     the CPU.
/// TypeError
///     when an array holds no integers (floats, bools, strings), an argument is no array
///     (None, an object, a dict), ``num_segments`` is not an integer, or ``out`` is not an
///     int32 ndarray or tensor (another dtype, byte order or a list).
/// MemoryError
///     when the ``[rows, num_segments]`` result is too large to allocate.
#[pyfunction]
#[pyo3(signature = (learned, context_lens, num_segments, *, out=None))]
pub(super) fn topology_witness_indices<'py>(
    py: Python<'py>,
    learned: &Obj<'py>,
    context_lens: &Obj<'py>,
    num_segments: &Obj<'py>,
    out: Opt<'_, 'py>,
) -> PyResult<I32<'py>> {
    // The lengths as the caller passed them too (an int64 array is read
    // through an int32 copy): as positions and lengths everywhere, they are
    // memory an output must not share whatever the core does with them.
    let raw = ndarrays(&[context_lens]);
    let learned = W.input::<i32, 2>(learned, "learned", "[rows, topk]")?;
    let lens = W.input::<i32, 1>(context_lens, "context_lens", "[rows]")?;
    let s = W.count(num_segments, "num_segments", u32::MAX as u64)?;
    let (shape, topk) = ([lens.shape[0], s], learned.shape[1]);
    let mut inputs = vec![learned.untyped(), lens.untyped()];
    inputs.extend(raw.iter());
    // SAFETY: `topology_witness_indices_into` writes every slot of every row
    // (each row is filled with -1 first) or refuses before writing.
    let out = unsafe { W.output_filled_by_core(py, out, &shape, &inputs)? };
    let (l, c) = (learned.slice()?, lens.slice()?);
    out.run(l.len() + shape[0] * s, |o| {
        witness::topology_witness_indices_into(l, topk, c, s, o)
    })
}

/// The learned rows with witnesses merged in, as a new int32 array (or into ``out=``).
///
/// Slots ``[0, learned_keep)`` are kept bit for bit, the witnesses in ascending segment
/// order are written to slots ``learned_keep, ...`` up to
/// ``B = min(max_replacements, topk - learned_keep)``, the rest dropped.
///
/// Parameters
/// ----------
/// learned : array_like of int, [rows, topk]
///     Row-relative offsets, negative = padding; any integer dtype whose values fit int32,
///     any layout (copied once when needed). Any CPU DLPack tensor too.
/// context_lens : array_like of int, [rows]
///     Each row's length, values within int32; one per learned row.
/// learned_keep : int
///     The retained prefix, 0 to ``topk``.
/// num_segments : int
///     The segment count ``S``, 1 to 64 (``MAX_TOPOLOGY_SEGMENTS``).
/// max_replacements : int
///     The witness budget per row, 0 to 2**64 - 1 (capped by the row).
/// out : ndarray of int32, [rows, topk], optional
///     Written in place and returned. Exactly ``learned``'s shape, native int32,
///     C-contiguous, aligned, writeable, sharing no input's memory (an ndarray or a CPU
///     DLPack tensor; never converted). A refused call leaves it untouched.
///
/// Returns
/// -------
/// ndarray of int32, [rows, topk]
///     The merged rows (``out`` itself when given).
///
/// Raises
/// ------
/// WitnessError
///     (a ValueError; ``.argument`` names the argument) when ``learned`` is not 2-D,
///     ``context_lens`` is not 1-D with one entry per row, a value does not fit int32,
///     ``num_segments`` is 0 or more than 64, ``learned_keep > topk``, a count is negative
///     or above 2**64 - 1, ``out`` has another shape, is not C-contiguous, aligned and
///     writeable, or overlaps an input, or a tensor is not on the CPU.
/// TypeError
///     when an array holds no integers, an argument is no array, a count is not an integer
///     (None, a float), or ``out`` is not an int32 ndarray or tensor.
#[pyfunction]
#[pyo3(signature = (learned, context_lens, learned_keep, num_segments, max_replacements, *, out=None))]
pub(super) fn apply_topology_witnesses<'py>(
    py: Python<'py>,
    learned: &Obj<'py>,
    context_lens: &Obj<'py>,
    learned_keep: &Obj<'py>,
    num_segments: &Obj<'py>,
    max_replacements: &Obj<'py>,
    out: Opt<'_, 'py>,
) -> PyResult<I32<'py>> {
    // The lengths as the caller passed them too (an int64 array is read
    // through an int32 copy): as positions and lengths everywhere, they are
    // memory an output must not share whatever the core does with them.
    let raw = ndarrays(&[context_lens]);
    let learned = W.input::<i32, 2>(learned, "learned", "[rows, topk]")?;
    let lens = W.input::<i32, 1>(context_lens, "context_lens", "[rows]")?;
    let keep = W.count(learned_keep, "learned_keep", u64::MAX)?;
    let s = W.count_within(num_segments, "num_segments", u64::MAX, MERGE_MAX)?;
    let budget = W.count(max_replacements, "max_replacements", u64::MAX)?;
    let mut inputs = vec![learned.untyped(), lens.untyped()];
    inputs.extend(raw.iter());
    // SAFETY: `apply_topology_witnesses_into` copies every learned row into
    // its output row, or refuses before writing.
    let out = unsafe { W.output_filled_by_core(py, out, &learned.shape, &inputs)? };
    let (l, c, topk) = (learned.slice()?, lens.slice()?, learned.shape[1]);
    out.run(l.len(), |o| {
        witness::apply_topology_witnesses_into(l, topk, c, keep, s, budget, o)
    })
}

/// The serving entry point: merges witnesses into ``topk_indices`` in place.
///
/// The merge of :func:`apply_topology_witnesses` with ``keep = topk - num_segments`` and
/// ``max_replacements = num_segments``, written into the caller's buffer. The buffer is
/// never converted (a ``torch.topk`` result is int64: call ``.int()`` first) and is checked
/// on every call; ``num_segments = 0`` is the off switch. A refused call leaves the buffer
/// byte-identical.
///
/// Parameters
/// ----------
/// topk_indices : ndarray of int32, [rows, topk]
///     The learned rows, rewritten in place: native int32, C-contiguous, aligned,
///     writeable, not overlapping ``context_lens`` (an ndarray or a CPU DLPack tensor,
///     e.g. an int32 torch tensor; never converted or copied).
/// context_lens : array_like of int, [rows]
///     Each row's length, values within int32; one per buffer row.
/// num_segments : int
///     The segment count ``S``, 0 (off: nothing written) to 64 (``MAX_TOPOLOGY_SEGMENTS``).
///
/// Returns
/// -------
/// None
///     The merged rows are ``topk_indices`` itself, rewritten in place.
///
/// Raises
/// ------
/// WitnessError
///     (a ValueError; ``.argument`` names the argument) when ``topk_indices`` is not 2-D,
///     not C-contiguous, misaligned, read-only or overlaps ``context_lens`` (checked even
///     with the off switch), ``context_lens`` is not 1-D with one entry per row or holds a
///     value outside int32, ``num_segments`` is negative or more than 64, or a tensor is
///     not on the CPU.
/// TypeError
///     when ``topk_indices`` is not a native int32 ndarray or tensor (int64, float32,
///     byte-swapped, a list, None; checked even with the off switch), ``context_lens``
///     holds no integers, or ``num_segments`` is not an integer.
#[pyfunction]
pub(super) fn scatter_topology_witnesses<'py>(
    py: Python<'py>,
    topk_indices: &Obj<'py>,
    context_lens: &Obj<'py>,
    num_segments: &Obj<'py>,
) -> PyResult<()> {
    let lens = W.input::<i32, 1>(context_lens, "context_lens", "[rows]")?;
    // The lengths as the caller passed them too (an int64 array is read
    // through an int32 copy): the buffer may share memory with neither.
    let raw = ndarrays(&[context_lens]);
    let mut inputs = vec![lens.untyped()];
    inputs.extend(raw.iter());
    let mut buf = W.inplace::<i32>(topk_indices, "topk_indices", 2, &inputs)?;
    let s = W.count_within(num_segments, "num_segments", u64::MAX, MERGE_MAX)?;
    if s == 0 {
        return Ok(());
    }
    let topk = buf.shape()[1];
    let (c, b) = (lens.slice()?, buf.slice()?);
    detach(py, b.len(), || {
        witness::scatter_topology_witnesses(b, topk, c, s)
    })?;
    Ok(())
}
