//! The `moba.gates` family: query rows against block means, each gate the
//! 8-lane fused sum of the module docs (lane `l` accumulates dimensions `l,
//! l + 8, …` by `fma`, the lanes added `((l0 + l4) + (l2 + l6)) + ((l1 +
//! l5) + (l3 + l7))`). `portable` is the definition; the AVX2 kernel is the
//! same arithmetic with each lane a vector lane, tiled two rows by four
//! blocks (the tiling changes which gates are computed together, never the
//! operations of one gate), so both give the same bits. No AVX-512 kernel:
//! the AVX-512 level runs the AVX2 one.

use crate::simd::{dispatch, Isa};

/// `out[r · n + b] = q_r · m_b` for the `rows = q.len() / d8` query rows and
/// `n = means.len() / d8` means, all zero padded to `d8` (a multiple of 8).
///
/// # Panics
/// If the lengths disagree (callers size them from one shape).
pub(super) fn gates(isa: Isa, q: &[f32], means: &[f32], d8: usize, out: &mut [f32]) {
    assert!(d8 > 0 && d8.is_multiple_of(8));
    assert!(q.len().is_multiple_of(d8) && means.len().is_multiple_of(d8));
    assert_eq!(out.len(), q.len() / d8 * (means.len() / d8));
    // SAFETY (bounds): the rows and means are whole rows of d8 and `out` one
    // gate per pair (asserted above); the kernels read and write within them.
    dispatch!("moba.gates", isa, {
        avx512 => avx2,
        avx2(t) => avx2::gates(t, q, means, d8, out),
        scalar => portable::gates(q, means, d8, out),
    })
}

/// The lanes summed in the module's order.
#[inline(always)]
fn reduce(l: [f32; 8]) -> f32 {
    ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))
}

mod portable {
    /// One gate: the 8-lane fused sum.
    fn dot(q: &[f32], m: &[f32]) -> f32 {
        let mut l = [0.0f32; 8];
        for (qc, mc) in q.chunks_exact(8).zip(m.chunks_exact(8)) {
            for j in 0..8 {
                l[j] = qc[j].mul_add(mc[j], l[j]);
            }
        }
        super::reduce(l)
    }

    pub(super) fn gates(q: &[f32], means: &[f32], d8: usize, out: &mut [f32]) {
        let n = means.len() / d8;
        for (r, qr) in q.chunks_exact(d8).enumerate() {
            for (b, m) in means.chunks_exact(d8).enumerate() {
                out[r * n + b] = dot(qr, m);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use crate::simd::Avx2;
    use std::arch::x86_64::*;

    /// The vector's lanes, summed in the module's order.
    #[target_feature(enable = "avx2,fma")]
    fn hsum(v: __m256) -> f32 {
        let mut l = [0.0f32; 8];
        // SAFETY: `l` holds 8 floats.
        unsafe { _mm256_storeu_ps(l.as_mut_ptr(), v) };
        super::reduce(l)
    }

    /// `R` rows against `B` means at once (`R × B` accumulators): each
    /// accumulator is one gate's lanes, updated as the portable `dot`.
    ///
    /// # Safety
    /// `q[r]` and `m[b]` each hold `d8` floats (a multiple of 8).
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile<const R: usize, const B: usize>(
        q: [*const f32; R],
        m: [*const f32; B],
        d8: usize,
    ) -> [[f32; B]; R] {
        let mut acc = [[_mm256_setzero_ps(); B]; R];
        let mut i = 0;
        while i < d8 {
            let mut mv = [_mm256_setzero_ps(); B];
            for b in 0..B {
                // SAFETY: i + 8 <= d8, within m[b]'s d8 floats.
                mv[b] = unsafe { _mm256_loadu_ps(m[b].add(i)) };
            }
            for r in 0..R {
                // SAFETY: as above, within q[r].
                let qv = unsafe { _mm256_loadu_ps(q[r].add(i)) };
                for b in 0..B {
                    acc[r][b] = _mm256_fmadd_ps(qv, mv[b], acc[r][b]);
                }
            }
            i += 8;
        }
        let mut out = [[0.0f32; B]; R];
        for r in 0..R {
            for b in 0..B {
                out[r][b] = hsum(acc[r][b]);
            }
        }
        out
    }

    /// Gates for rows `r0 .. r0 + R`, every mean, `B` means a step (the
    /// remainder one at a time).
    #[target_feature(enable = "avx2,fma")]
    fn rows<const R: usize>(q: &[f32], means: &[f32], d8: usize, r0: usize, out: &mut [f32]) {
        let n = means.len() / d8;
        let qp: [*const f32; R] = std::array::from_fn(|r| q[(r0 + r) * d8..][..d8].as_ptr());
        let mut b = 0;
        while b + 4 <= n {
            let mp: [*const f32; 4] = std::array::from_fn(|j| means[(b + j) * d8..][..d8].as_ptr());
            // SAFETY: every pointer heads a d8-float slice (sliced above).
            let g = unsafe { tile::<R, 4>(qp, mp, d8) };
            for r in 0..R {
                out[(r0 + r) * n + b..][..4].copy_from_slice(&g[r]);
            }
            b += 4;
        }
        while b < n {
            let mp = [means[b * d8..][..d8].as_ptr()];
            // SAFETY: as above.
            let g = unsafe { tile::<R, 1>(qp, mp, d8) };
            for r in 0..R {
                out[(r0 + r) * n + b] = g[r][0];
            }
            b += 1;
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn gates(_t: Avx2, q: &[f32], means: &[f32], d8: usize, out: &mut [f32]) {
        let n_rows = q.len() / d8;
        let mut r = 0;
        while r + 2 <= n_rows {
            rows::<2>(q, means, d8, r, out);
            r += 2;
        }
        if r < n_rows {
            rows::<1>(q, means, d8, r, out);
        }
    }
}

/// Runs the family at `isa` against the portable kernel (the reach test).
#[cfg(test)]
pub(super) fn probe(isa: Isa) {
    let q: Vec<f32> = (0..48).map(|i| (i as f32 * 0.37).sin()).collect();
    let m: Vec<f32> = (0..80).map(|i| (i as f32 * 0.11).cos()).collect();
    let (mut a, mut b) = (vec![0.0f32; 15], vec![0.0f32; 15]);
    gates(isa, &q, &m, 16, &mut a);
    portable::gates(&q, &m, 16, &mut b);
    assert_eq!(
        a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        b.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
}
