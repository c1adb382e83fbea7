//! The portable kernels: the definition the AVX2 ones reproduce bit for bit.

use crate::keys::Encoded;
use crate::simd::Isa;

/// The canonical key value: `k · scale + 0.0` (`+ 0.0` turns `-0.0` into
/// `+0.0`, so no bound is ever `-0.0` and the comparisons below never meet
/// two zeros of different signs).
#[inline(always)]
pub(super) fn canon(k: f32, scale: Option<f32>) -> f32 {
    match scale {
        Some(c) => k * c + 0.0,
        None => k + 0.0,
    }
}

/// [`super::fold`] without SIMD.
pub(super) fn fold(
    keys: &[f32],
    scale: Option<f32>,
    first: bool,
    kmin: &mut [f32],
    kmax: &mut [f32],
) {
    for ((&k, lo), hi) in keys.iter().zip(kmin.iter_mut()).zip(kmax.iter_mut()) {
        let v = canon(k, scale);
        if first {
            *lo = v;
            *hi = v;
            continue;
        }
        if lo.is_nan() || v < *lo {
            *lo = v;
        }
        if hi.is_nan() || v > *hi {
            *hi = v;
        }
    }
}

/// One dot of a query with a page's sign-selected bounds, in the 8-lane
/// order: lane `l` accumulates dimensions `l, l + 8, …` with one fused
/// multiply-add each (a dimension past `d` as `fma(0, 0, acc)`), then
/// `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))`.
#[inline]
pub(super) fn dot(q: &[f32], kmin: &[f32], kmax: &[f32]) -> f32 {
    let d = q.len();
    let mut l = [0.0f32; 8];
    for i in 0..d.div_ceil(8) * 8 {
        let (qi, b) = if i < d {
            (q[i], if q[i] >= 0.0 { kmax[i] } else { kmin[i] })
        } else {
            (0.0, 0.0)
        };
        l[i % 8] = qi.mul_add(b, l[i % 8]);
    }
    ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))
}

/// [`super::page_bounds`] without SIMD: the rows decoded (portably), then
/// [`page_bounds_f32`].
pub(super) fn page_bounds(
    rows: Encoded<'_>,
    scales: Option<&[f32]>,
    lo: &mut [f32],
    hi: &mut [f32],
) {
    let mut v = vec![0.0f32; rows.len()];
    rows.decode_at(Isa::Scalar, 0, &mut v);
    page_bounds_f32(&v, scales, lo, hi)
}

/// [`super::page_bounds`] of float32 rows, without SIMD.
pub(super) fn page_bounds_f32(
    rows: &[f32],
    scales: Option<&[f32]>,
    lo: &mut [f32],
    hi: &mut [f32],
) {
    let n = lo.len();
    for (i, (l, h)) in lo.iter_mut().zip(hi.iter_mut()).enumerate() {
        let (mut a, mut b, mut seen) = (f32::INFINITY, f32::NEG_INFINITY, false);
        for (t, row) in rows.chunks_exact(n).enumerate() {
            let v = canon(row[i], scales.map(|s| s[t]));
            if v.is_nan() {
                continue;
            }
            seen = true;
            if v < a {
                a = v;
            }
            if v > b {
                b = v;
            }
        }
        (*l, *h) = if seen { (a, b) } else { (f32::NAN, f32::NAN) };
    }
}

/// [`super::scores`] without SIMD.
pub(super) fn scores(
    q: &[f32],
    (h, g, d): (usize, usize, usize),
    kmin: &[f32],
    kmax: &[f32],
    stride: usize,
    n_pages: usize,
    out: &mut [f32],
) {
    for p in 0..n_pages {
        for j in 0..h * g {
            let at = p * stride + (j / g) * d;
            out[j * n_pages + p] =
                dot(&q[j * d..(j + 1) * d], &kmin[at..at + d], &kmax[at..at + d]);
        }
    }
}
