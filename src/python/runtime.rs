//! The runtime controls: the thread count of kvselect's parallel paths, the
//! SIMD level its kernels dispatched to, and the benchmarks' FMA floor.
//!
//! Reads counts only. The rule: a refused count is a `KvselectError` (the
//! base class: these controls belong to no selection or witness call),
//! naming the argument, never `OverflowError`.

use pyo3::prelude::*;

use super::args::Obj;
use super::errors::Domain;
use crate::{exp, pool, simd};

/// Sets the number of threads kvselect's parallel paths use.
///
/// Parameters
/// ----------
/// n : int
///     The thread count, at most 65536; 0 restores the default (``RAYON_NUM_THREADS``, else
///     every core).
///
/// Returns
/// -------
/// None
///
/// Raises
/// ------
/// KvselectError
///     (a ValueError; ``.argument`` is ``n``) when ``n`` is negative or past 65536.
/// TypeError
///     when ``n`` is not an integer.
#[pyfunction]
fn set_num_threads(n: &Obj) -> PyResult<()> {
    pool::set_num_threads(Domain::Base.count(n, "n", 1 << 16)?);
    Ok(())
}

/// The number of threads kvselect's parallel paths use.
///
/// Returns
/// -------
/// int
///     The thread count (:func:`set_num_threads` sets it).
#[pyfunction]
fn get_num_threads() -> usize {
    pool::num_threads()
}

/// The best instruction-set level the SIMD kernels dispatched to on this CPU.
///
/// "avx512bf16" (AVX-512 with AVX512-BF16's ``VDPBF16PS``: the indexer's dot products of
/// bfloat16-exact queries and bf16 / fp8 keys, and block selection's in a prefill, two dimensions
/// per instruction, the same bits;
/// offered only when the CPU's instruction matches kvselect's software model of it, and the
/// default only where it does at least 1.3 times the products per second of the FMAs it
/// replaces: AMD Zen 4, not an Intel Xeon, where it does half), "avx512" (block selection, the indexer and
/// attention; the other kernels run AVX2), "avx2" or "scalar". ``KVSELECT_SIMD=avx512``,
/// ``=avx2`` or ``=scalar`` in the environment caps it; ``KVSELECT_SIMD=avx512bf16`` takes the
/// pair level wherever the CPU's instruction matches the model.
///
/// Returns
/// -------
/// str
///     "avx512bf16", "avx512", "avx2" or "scalar".
#[pyfunction]
fn simd_level() -> &'static str {
    simd::level().name()
}

/// Benchmarks' floor (private): ``iters`` steps of a register-resident FMA
/// loop on every pool thread at the best SIMD level; returns ``(flops,
/// checksum)``, the caller times the call.
#[pyfunction]
fn _fma_floor(py: Python<'_>, iters: &Obj) -> PyResult<(u64, f32)> {
    let iters = Domain::Base.count(iters, "iters", 1 << 40)?;
    Ok(py.detach(|| simd::fma_floor(iters)))
}

/// How many times FMA's products per second AVX512-BF16's `VDPBF16PS` does
/// on this core (private; raced once per process), or None where the CPU
/// has no pair level: the pair level is the default where this is at
/// least 1.3.
#[pyfunction]
fn _pair_speedup() -> Option<f64> {
    simd::pair_speedup()
}

/// Whether the lightning indexer's AMX screen runs in this process
/// (private): the CPU and OS run AMX-BF16's tile product as its model does,
/// `KVSELECT_SIMD` names no level and `KVSELECT_AMX` is not ``0``. The
/// screen changes no row and no score, only the time.
#[pyfunction]
fn _amx_screen() -> bool {
    simd::amx_screen().is_some()
}

/// The project's `exp` (private): `(rel_err, lo)`. For every float32 `x`
/// in `[lo, 0]` the core's `exp(x)` (the same bits at every SIMD level) is
/// within `rel_err · e^x` of the real exponential (the maximum over every
/// such input, rounded up); below `lo` it is `+0`. Rules with a softmax
/// treat candidates whose exact scores lie within this relative distance as
/// tied; checks use it as the rigorous bound on each `exp`.
#[pyfunction]
fn _exp_bound() -> (f64, f32) {
    (exp::EXP_REL_ERR, exp::EXP_LO)
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_fma_floor, m)?)?;
    m.add_function(wrap_pyfunction!(_exp_bound, m)?)?;
    m.add_function(wrap_pyfunction!(_pair_speedup, m)?)?;
    m.add_function(wrap_pyfunction!(_amx_screen, m)?)?;
    m.add_function(wrap_pyfunction!(set_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(get_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(simd_level, m)?)?;
    Ok(())
}
