//! The portable kernels: the definition the AVX2 ones reproduce bit for bit.

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

/// [`super::scores`] without SIMD.
pub(super) fn scores(
    q: &[f32],
    d: usize,
    kmin: &[f32],
    kmax: &[f32],
    stride: usize,
    n_pages: usize,
    out: &mut [f32],
) {
    for (g, row) in out.chunks_mut(n_pages.max(1)).enumerate() {
        let qg = &q[g * d..(g + 1) * d];
        for (p, o) in row.iter_mut().enumerate() {
            let at = p * stride;
            *o = dot(qg, &kmin[at..at + d], &kmax[at..at + d]);
        }
    }
}
