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
///
/// Written as a loop over the 8 lanes of each 8-dimension chunk (the tail
/// zero-padded into one more chunk), so a compiler vectorises it where the
/// target has vector FMAs (aarch64's NEON); every lane's chain is the same.
#[inline]
pub(super) fn dot(q: &[f32], kmin: &[f32], kmax: &[f32]) -> f32 {
    /// Lanes `l[h][j]` (lane `4h + j`) take dimensions `4h + j` of the
    /// chunk: both bounds read and the sign's pick a bit mask (as the AVX2
    /// kernel's blend), since a branch per lane would keep the loop scalar.
    #[inline(always)]
    fn chunk(l: &mut [[f32; 4]; 2], q: &[f32], kmin: &[f32], kmax: &[f32]) {
        for (h, lh) in l.iter_mut().enumerate() {
            let r = 4 * h..4 * h + 4;
            let (q, lo, hi) = (&q[r.clone()], &kmin[r.clone()], &kmax[r]);
            for (((a, &x), &lo), &hi) in lh.iter_mut().zip(q).zip(lo).zip(hi) {
                let m = 0u32.wrapping_sub(u32::from(x >= 0.0));
                let b = f32::from_bits((hi.to_bits() & m) | (lo.to_bits() & !m));
                *a = x.mul_add(b, *a);
            }
        }
    }
    let d = q.len();
    let (kmin, kmax) = (&kmin[..d], &kmax[..d]);
    let full = d / 8 * 8;
    let mut l = [[0.0f32; 4]; 2];
    for ((qc, lo), hi) in q[..full]
        .chunks_exact(8)
        .zip(kmin[..full].chunks_exact(8))
        .zip(kmax[..full].chunks_exact(8))
    {
        chunk(&mut l, qc, lo, hi);
    }
    if full < d {
        // Past `d`, `fma(0, 0, acc)`: `q = 0` picks `kmax`'s padding, 0.
        let (mut tq, mut tlo, mut thi) = ([0.0f32; 8], [0.0f32; 8], [0.0f32; 8]);
        tq[..d - full].copy_from_slice(&q[full..]);
        tlo[..d - full].copy_from_slice(&kmin[full..]);
        thi[..d - full].copy_from_slice(&kmax[full..]);
        chunk(&mut l, &tq, &tlo, &thi);
    }
    // `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))`.
    let h: [f32; 4] = std::array::from_fn(|j| l[0][j] + l[1][j]);
    (h[0] + h[2]) + (h[1] + h[3])
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
