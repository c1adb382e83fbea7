//! The AVX2 + FMA kernels: the portable arithmetic eight lanes at a time.

use super::portable;
use crate::simd::Avx2;
use std::arch::x86_64::*;

/// [`super::fold`] with AVX2: eight keys per step, the tail portable (the
/// fold is element-wise, so the two agree element by element).
#[target_feature(enable = "avx2,fma")]
pub(super) fn fold(
    _t: Avx2,
    keys: &[f32],
    scale: Option<f32>,
    first: bool,
    kmin: &mut [f32],
    kmax: &mut [f32],
) {
    let n = keys.len().min(kmin.len()).min(kmax.len());
    let full = n / 8 * 8;
    let zero = _mm256_setzero_ps();
    let c = _mm256_set1_ps(scale.unwrap_or(1.0));
    let mut i = 0;
    while i < full {
        // SAFETY: i + 8 <= full <= the length of all three slices.
        unsafe {
            let k = _mm256_loadu_ps(keys.as_ptr().add(i));
            // `k · scale + 0`, or `k + 0`: as `portable::canon`.
            let v = match scale {
                Some(_) => _mm256_add_ps(_mm256_mul_ps(k, c), zero),
                None => _mm256_add_ps(k, zero),
            };
            let (lo_p, hi_p) = (kmin.as_mut_ptr().add(i), kmax.as_mut_ptr().add(i));
            if first {
                _mm256_storeu_ps(lo_p, v);
                _mm256_storeu_ps(hi_p, v);
            } else {
                let lo = _mm256_loadu_ps(lo_p);
                let hi = _mm256_loadu_ps(hi_p);
                // Take v where the bound is NaN or v is past it (ordered
                // comparisons: false when v is NaN).
                let take_lo = _mm256_or_ps(
                    _mm256_cmp_ps::<_CMP_UNORD_Q>(lo, lo),
                    _mm256_cmp_ps::<_CMP_LT_OQ>(v, lo),
                );
                let take_hi = _mm256_or_ps(
                    _mm256_cmp_ps::<_CMP_UNORD_Q>(hi, hi),
                    _mm256_cmp_ps::<_CMP_GT_OQ>(v, hi),
                );
                _mm256_storeu_ps(lo_p, _mm256_blendv_ps(lo, v, take_lo));
                _mm256_storeu_ps(hi_p, _mm256_blendv_ps(hi, v, take_hi));
            }
        }
        i += 8;
    }
    portable::fold(
        &keys[full..n],
        scale,
        first,
        &mut kmin[full..n],
        &mut kmax[full..n],
    );
}

/// `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))` of `v`'s lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn reduce(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps::<0b01>(s, s)))
}

/// `N` queries (rows of `dp` floats, zero-padded past `d`) against pages
/// `0..n_pages`: `out[r * n_pages + p]` for the tile's rows `r`.
///
/// # Safety
/// `q` readable for `N * dp` floats, `dp = d` rounded up to 8; page `p`'s
/// bounds readable at `p * stride .. p * stride + d` of `kmin` and `kmax`;
/// `out` writable for `N * n_pages` floats.
#[inline]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<const N: usize>(
    q: *const f32,
    dp: usize,
    d: usize,
    kmin: *const f32,
    kmax: *const f32,
    stride: usize,
    n_pages: usize,
    out: *mut f32,
) {
    let zero = _mm256_setzero_ps();
    let full = d / 8;
    let rem = d % 8;
    for p in 0..n_pages {
        let mut acc = [zero; N];
        // SAFETY: page p's bounds start at p * stride (the caller's bound).
        let (lo_p, hi_p) = unsafe { (kmin.add(p * stride), kmax.add(p * stride)) };
        for c in 0..dp / 8 {
            let (lo, hi) = if c < full {
                // SAFETY: dims c*8 .. c*8+8 are within the page's d.
                unsafe {
                    (
                        _mm256_loadu_ps(lo_p.add(c * 8)),
                        _mm256_loadu_ps(hi_p.add(c * 8)),
                    )
                }
            } else {
                // The tail: dims c*8 .. d, zero past d (as the portable
                // kernel's fma(0, 0, acc)).
                let (mut a, mut b) = ([0.0f32; 8], [0.0f32; 8]);
                for j in 0..rem {
                    // SAFETY: c*8 + j < d.
                    unsafe {
                        a[j] = *lo_p.add(c * 8 + j);
                        b[j] = *hi_p.add(c * 8 + j);
                    }
                }
                // SAFETY: reads the two local arrays.
                unsafe { (_mm256_loadu_ps(a.as_ptr()), _mm256_loadu_ps(b.as_ptr())) }
            };
            for (r, a) in acc.iter_mut().enumerate() {
                // SAFETY: row r's dims c*8 .. c*8+8 are within dp.
                let qv = unsafe { _mm256_loadu_ps(q.add(r * dp + c * 8)) };
                let b = _mm256_blendv_ps(lo, hi, _mm256_cmp_ps::<_CMP_GE_OQ>(qv, zero));
                *a = _mm256_fmadd_ps(qv, b, *a);
            }
        }
        for (r, a) in acc.iter().enumerate() {
            // SAFETY: r < N, p < n_pages.
            unsafe { *out.add(r * n_pages + p) = reduce(*a) };
        }
    }
}

/// [`super::scores`] with AVX2: the queries in tiles of 4 (each page's
/// bounds loaded once per tile), padded copies so every load is whole.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub(super) fn scores(
    _t: Avx2,
    q: &[f32],
    d: usize,
    kmin: &[f32],
    kmax: &[f32],
    stride: usize,
    n_pages: usize,
    out: &mut [f32],
) {
    let g = q.len() / d;
    let dp = d.div_ceil(8) * 8;
    let mut padded = vec![0.0f32; g * dp];
    for (r, row) in q.chunks_exact(d).enumerate() {
        padded[r * dp..r * dp + d].copy_from_slice(row);
    }
    let mut r = 0;
    while r < g {
        let n = (g - r).min(4);
        let qp = padded[r * dp..].as_ptr();
        let op = out[r * n_pages..].as_mut_ptr();
        let (lo, hi) = (kmin.as_ptr(), kmax.as_ptr());
        // SAFETY: rows r .. r + n of `padded` (dp each) and of `out`
        // (n_pages each) exist; the bounds are the caller's (see
        // `super::scores`).
        unsafe {
            match n {
                4 => tile::<4>(qp, dp, d, lo, hi, stride, n_pages, op),
                3 => tile::<3>(qp, dp, d, lo, hi, stride, n_pages, op),
                2 => tile::<2>(qp, dp, d, lo, hi, stride, n_pages, op),
                _ => tile::<1>(qp, dp, d, lo, hi, stride, n_pages, op),
            }
        }
        r += n;
    }
}
