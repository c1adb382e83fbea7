//! The `eviction.scores` family: float64 scaled dot products of query rows
//! against keys stored dimension-major, `out[r][j] = (Σ_c q_rc · k_cj) ·
//! scale`, each dot one chain over the dimensions in order from 0.
//!
//! The inputs are float32 values widened to float64, so every product
//! `q_rc · k_cj` is exact (24 + 24 mantissa bits fit in 53): a fused
//! `fma(q, k, acc)` and the unfused `acc + q · k` round identically, and the
//! chain is the one `kvselect.attention_probabilities` (`src/metrics.rs`)
//! runs. `portable` is the definition; the AVX2 kernel runs each key's
//! chain in its own vector lane (four keys a register, eight registers a
//! tile of 32 keys, every query row of the block against the tile while it
//! is in L1), so both give the same bits. No AVX-512 kernel: the AVX-512
//! level runs the AVX2 one (the float64 `exp` after it dominates the
//! policies' time, module docs).

use crate::simd::{dispatch, Isa};

/// `out[r · out_stride + j] = (Σ_c q[r · d + c] · kt[c · stride + j]) · scale`
/// for the `rows` query rows (`q` is `[rows, d]`) and the keys `j < n`.
///
/// # Panics
/// If the lengths disagree (callers size them from one shape; never user
/// input).
#[allow(clippy::too_many_arguments)]
pub(super) fn scores(
    isa: Isa,
    q: &[f64],
    rows: usize,
    d: usize,
    kt: &[f64],
    stride: usize,
    n: usize,
    scale: f64,
    out: &mut [f64],
    out_stride: usize,
) {
    assert!(n <= stride && n <= out_stride);
    assert_eq!(q.len(), rows * d);
    assert!(kt.len() >= d * stride);
    assert!(rows == 0 || out.len() >= (rows - 1) * out_stride + n);
    // SAFETY (bounds): every key index read is `c · stride + j` with `c < d`
    // and `j < n <= stride`, within `kt` (`d · stride` entries); every write
    // is `r · out_stride + j` with `r < rows`, `j < n <= out_stride`, within
    // `out` (asserted above).
    dispatch!("eviction.scores", isa, {
        avx512 => avx2,
        avx2(t) => avx2::scores(t, q, d, rows, kt, stride, n, scale, out, out_stride),
        scalar => portable::scores(q, d, rows, kt, stride, n, scale, out, out_stride),
    })
}

mod portable {
    /// The definition: one chain per key, dimensions in order.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn scores(
        q: &[f64],
        d: usize,
        rows: usize,
        kt: &[f64],
        stride: usize,
        n: usize,
        scale: f64,
        out: &mut [f64],
        out_stride: usize,
    ) {
        for r in 0..rows {
            let o = &mut out[r * out_stride..][..n];
            o.fill(0.0);
            for c in 0..d {
                let qc = q[r * d + c];
                for (a, &k) in o.iter_mut().zip(&kt[c * stride..][..n]) {
                    *a += qc * k;
                }
            }
            for a in o.iter_mut() {
                *a *= scale;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use crate::simd::Avx2;
    use std::arch::x86_64::*;

    /// `U` registers of four keys from `j`, for every row: each lane one
    /// key's chain (`fma` of exact products, as the portable `+=`).
    ///
    /// # Safety
    /// `kt` holds `d` rows of `stride` keys with `j + 4 · U <= stride`;
    /// `out` holds `rows` rows of `out_stride` with `j + 4 · U <=
    /// out_stride`; `q` holds `rows · d` values.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile<const U: usize>(
        q: *const f64,
        d: usize,
        rows: usize,
        kt: *const f64,
        stride: usize,
        j: usize,
        scale: __m256d,
        out: *mut f64,
        out_stride: usize,
    ) {
        for r in 0..rows {
            let mut acc = [_mm256_setzero_pd(); U];
            for c in 0..d {
                // SAFETY: r · d + c < rows · d.
                let qc = _mm256_set1_pd(unsafe { *q.add(r * d + c) });
                for (u, a) in acc.iter_mut().enumerate() {
                    // SAFETY: c < d and j + 4u + 4 <= stride: within kt.
                    let k = unsafe { _mm256_loadu_pd(kt.add(c * stride + j + 4 * u)) };
                    *a = _mm256_fmadd_pd(qc, k, *a);
                }
            }
            for (u, a) in acc.iter().enumerate() {
                // SAFETY: r < rows and j + 4u + 4 <= out_stride: within out.
                unsafe {
                    _mm256_storeu_pd(
                        out.add(r * out_stride + j + 4 * u),
                        _mm256_mul_pd(*a, scale),
                    )
                };
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn scores(
        _t: Avx2,
        q: &[f64],
        d: usize,
        rows: usize,
        kt: &[f64],
        stride: usize,
        n: usize,
        scale: f64,
        out: &mut [f64],
        out_stride: usize,
    ) {
        let sv = _mm256_set1_pd(scale);
        let (qp, kp, op) = (q.as_ptr(), kt.as_ptr(), out.as_mut_ptr());
        let mut j = 0;
        while j + 32 <= n {
            // SAFETY: j + 32 <= n <= stride, out_stride (the family's
            // bounds); q holds rows · d values.
            unsafe { tile::<8>(qp, d, rows, kp, stride, j, sv, op, out_stride) };
            j += 32;
        }
        while j + 4 <= n {
            // SAFETY: as above, j + 4 <= n.
            unsafe { tile::<1>(qp, d, rows, kp, stride, j, sv, op, out_stride) };
            j += 4;
        }
        for r in 0..rows {
            for jj in j..n {
                let mut acc = 0.0f64;
                for c in 0..d {
                    acc = q[r * d + c].mul_add(kt[c * stride + jj], acc);
                }
                out[r * out_stride + jj] = acc * scale;
            }
        }
    }
}

/// Runs the family at `isa` against the portable kernel (the reach test).
#[cfg(test)]
pub(super) fn probe(isa: Isa) {
    let (d, stride, n, rows) = (7, 45, 43, 3);
    let q: Vec<f64> = (0..rows * d)
        .map(|i| (i as f32 * 0.37).sin() as f64)
        .collect();
    let kt: Vec<f64> = (0..d * stride)
        .map(|i| (i as f32 * 0.11).cos() as f64)
        .collect();
    let (mut a, mut b) = (vec![0.0f64; rows * 50], vec![0.0f64; rows * 50]);
    scores(isa, &q, rows, d, &kt, stride, n, 0.3, &mut a, 50);
    portable::scores(&q, d, rows, &kt, stride, n, 0.3, &mut b, 50);
    assert_eq!(
        a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        b.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
}
