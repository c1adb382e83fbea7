//! The AVX-512 `exp`: [`super::avx2::exp`] on sixteen lanes.

use super::portable::{exp_scalar, EXP_LO, LN2_HI, LN2_LO, LOG2E, P, ROUND};
use crate::simd::Avx512;
use std::arch::x86_64::*;

/// [`super::avx2::exp`] on sixteen lanes, operation for operation (the
/// same constants, FMAs, rounding and underflow cut-off), so lane for lane
/// the same bits.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) fn exp(x: __m512) -> __m512 {
    let lo = _mm512_set1_ps(EXP_LO);
    let xc = _mm512_max_ps(lo, x);
    let round = _mm512_set1_ps(ROUND);
    let n = _mm512_sub_ps(
        _mm512_add_ps(_mm512_mul_ps(xc, _mm512_set1_ps(LOG2E)), round),
        round,
    );
    let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_HI), xc);
    let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_LO), r);
    let mut y = _mm512_set1_ps(P[0]);
    for &p in &P[1..] {
        y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(p));
    }
    let y = _mm512_add_ps(
        _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), r),
        _mm512_set1_ps(1.0),
    );
    let bits = _mm512_slli_epi32::<23>(_mm512_add_epi32(
        _mm512_cvtps_epi32(n),
        _mm512_set1_epi32(127),
    ));
    let e = _mm512_mul_ps(y, _mm512_castsi512_ps(bits));
    // Zero where `x < EXP_LO` (ordered: a NaN keeps its NaN), as the AVX2
    // kernel's `andnot` of the comparison.
    let under = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, lo);
    _mm512_maskz_mov_ps(!under, e)
}

/// [`super::exp_shifted`] sixteen at a time, the tail with the scalar twin.
///
/// # Safety
/// `_token` proves AVX-512 F (and AVX2+FMA); `out.len() == x.len()`.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn exp_shifted(_token: Avx512, x: &[f32], shift: f32, out: &mut [f32]) {
    let whole = x.len() / 16 * 16;
    let s = _mm512_set1_ps(shift);
    for i in (0..whole).step_by(16) {
        // SAFETY: `i + 16 <= whole <= x.len() == out.len()`.
        unsafe {
            let v = _mm512_sub_ps(_mm512_loadu_ps(x.as_ptr().add(i)), s);
            _mm512_storeu_ps(out.as_mut_ptr().add(i), exp(v));
        }
    }
    for (o, &v) in out[whole..].iter_mut().zip(&x[whole..]) {
        *o = exp_scalar(v - shift);
    }
}
