//! The AVX2+FMA `exp`: [`super::portable::exp_scalar`] eight lanes at a time.

use super::portable::{exp_scalar, EXP_LO, LN2_HI, LN2_LO, LOG2E, P, ROUND};
use crate::simd::Avx2;
use std::arch::x86_64::*;

/// The vector twin of `exp_scalar`.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn exp(x: __m256) -> __m256 {
    let lo = _mm256_set1_ps(EXP_LO);
    let xc = _mm256_max_ps(lo, x);
    let round = _mm256_set1_ps(ROUND);
    let n = _mm256_sub_ps(
        _mm256_add_ps(_mm256_mul_ps(xc, _mm256_set1_ps(LOG2E)), round),
        round,
    );
    let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_HI), xc);
    let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_LO), r);
    let mut y = _mm256_set1_ps(P[0]);
    for &p in &P[1..] {
        y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(p));
    }
    let y = _mm256_add_ps(
        _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), r),
        _mm256_set1_ps(1.0),
    );
    let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    ));
    let e = _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
    _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_LT_OQ>(x, lo), e)
}

/// [`exp`] of `N` vectors, each step taken across all of them before the
/// next (independent chains side by side in program order, so the
/// scheduler overlaps them): per lane the same operations as [`exp`], in
/// the same order, so the same bits.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn exp_n<const N: usize>(x: [__m256; N]) -> [__m256; N] {
    let lo = _mm256_set1_ps(EXP_LO);
    let round = _mm256_set1_ps(ROUND);
    let (log2e, hi, lo2) = (
        _mm256_set1_ps(LOG2E),
        _mm256_set1_ps(-LN2_HI),
        _mm256_set1_ps(-LN2_LO),
    );
    let mut xc = x;
    let mut n = x;
    let mut r = x;
    for i in 0..N {
        xc[i] = _mm256_max_ps(lo, x[i]);
    }
    for i in 0..N {
        n[i] = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(xc[i], log2e), round), round);
    }
    for i in 0..N {
        r[i] = _mm256_fmadd_ps(n[i], lo2, _mm256_fmadd_ps(n[i], hi, xc[i]));
    }
    let mut y = [_mm256_set1_ps(P[0]); N];
    for &p in &P[1..] {
        let p = _mm256_set1_ps(p);
        for i in 0..N {
            y[i] = _mm256_fmadd_ps(y[i], r[i], p);
        }
    }
    let one = _mm256_set1_ps(1.0);
    let bias = _mm256_set1_epi32(127);
    let mut e = x;
    for i in 0..N {
        let yi = _mm256_add_ps(_mm256_fmadd_ps(y[i], _mm256_mul_ps(r[i], r[i]), r[i]), one);
        let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(n[i]), bias));
        let ei = _mm256_mul_ps(yi, _mm256_castsi256_ps(bits));
        e[i] = _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_LT_OQ>(x[i], lo), ei);
    }
    e
}

/// [`super::exp_shifted`] eight at a time, the tail with the scalar twin.
///
/// # Safety
/// `_token` proves AVX2+FMA; `out.len() == x.len()`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn exp_shifted(_token: Avx2, x: &[f32], shift: f32, out: &mut [f32]) {
    let whole = x.len() / 8 * 8;
    let s = _mm256_set1_ps(shift);
    for i in (0..whole).step_by(8) {
        // SAFETY: `i + 8 <= whole <= x.len() == out.len()`.
        unsafe {
            let v = _mm256_sub_ps(_mm256_loadu_ps(x.as_ptr().add(i)), s);
            _mm256_storeu_ps(out.as_mut_ptr().add(i), exp(v));
        }
    }
    for (o, &v) in out[whole..].iter_mut().zip(&x[whole..]) {
        *o = exp_scalar(v - shift);
    }
}
