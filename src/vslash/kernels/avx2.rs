//! The AVX2 + FMA kernels: the portable arithmetic eight lanes at a time.

use super::portable::{self, COLS, ROWS, TILE};
use crate::simd::Avx2;
use std::arch::x86_64::*;

/// [`portable::tile`] with AVX2: two registers a row, sixteen keys in their
/// lanes; each lane runs the portable chain (`fma` over `k` ascending from
/// `+0`, then the product with `c`), so the bits are the portable ones.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
pub(super) fn tile(
    _t: Avx2,
    rows: &[&[f32]; ROWS],
    panel: &[f32],
    d: usize,
    c: f32,
    valid: &[usize; ROWS],
    dst: &mut [f32],
    at: &[usize; ROWS],
    row_max: &mut [f32; ROWS],
    finite: &mut bool,
) {
    assert!(panel.len() >= d * COLS && rows.iter().all(|r| r.len() >= d));
    assert!((0..ROWS).all(|r| valid[r] <= COLS && at[r] + valid[r] <= dst.len()));
    // The rows' next slots, a few tiles ahead, for writing: 64 rows are
    // written in parallel, more streams than the hardware prefetcher
    // follows. (A prefetch never faults: the address is only computed,
    // with `wrapping_add`, and may lie past the buffer.)
    for &a in at {
        let ahead = dst.as_ptr().wrapping_add(a + 4 * COLS);
        _mm_prefetch::<_MM_HINT_ET0>(ahead as *const i8);
    }
    let mut lo = [_mm256_setzero_ps(); ROWS];
    let mut hi = [_mm256_setzero_ps(); ROWS];
    let p = panel.as_ptr();
    let q: [*const f32; ROWS] = std::array::from_fn(|r| rows[r].as_ptr());
    for k in 0..d {
        // SAFETY: k < d; the panel holds d · 16 floats and every row d
        // (asserted above).
        unsafe {
            let k0 = _mm256_loadu_ps(p.add(k * COLS));
            let k1 = _mm256_loadu_ps(p.add(k * COLS + 8));
            for r in 0..ROWS {
                let qv = _mm256_broadcast_ss(&*q[r].add(k));
                lo[r] = _mm256_fmadd_ps(qv, k0, lo[r]);
                hi[r] = _mm256_fmadd_ps(qv, k1, hi[r]);
            }
        }
    }
    let cv = _mm256_set1_ps(c);
    let zero = _mm256_setzero_ps();
    let mut bad = _mm256_setzero_ps();
    for r in 0..ROWS {
        let s0 = _mm256_mul_ps(lo[r], cv);
        let s1 = _mm256_mul_ps(hi[r], cv);
        if valid[r] == COLS {
            // SAFETY: at[r] + 16 <= dst.len() (asserted above).
            unsafe {
                _mm256_storeu_ps(dst.as_mut_ptr().add(at[r]), s0);
                _mm256_storeu_ps(dst.as_mut_ptr().add(at[r] + 8), s1);
            }
            // x − x is NaN exactly when x is not finite.
            let nf0 = _mm256_cmp_ps::<_CMP_NEQ_UQ>(_mm256_sub_ps(s0, s0), zero);
            let nf1 = _mm256_cmp_ps::<_CMP_NEQ_UQ>(_mm256_sub_ps(s1, s1), zero);
            bad = _mm256_or_ps(bad, _mm256_or_ps(nf0, nf1));
            // Lane maxima, then across lanes: exact in any order.
            let m = _mm256_max_ps(s0, s1);
            let m = _mm256_max_ps(m, _mm256_permute2f128_ps::<1>(m, m));
            let m = _mm256_max_ps(m, _mm256_permute_ps::<0b01_00_11_10>(m));
            let m = _mm256_max_ps(m, _mm256_permute_ps::<0b10_11_00_01>(m));
            let m = _mm256_cvtss_f32(m);
            if m > row_max[r] {
                row_max[r] = m;
            }
        } else {
            let mut o = [0.0f32; COLS];
            // SAFETY: o is 16 floats.
            unsafe {
                _mm256_storeu_ps(o.as_mut_ptr(), s0);
                _mm256_storeu_ps(o.as_mut_ptr().add(8), s1);
            }
            let out = &mut dst[at[r]..at[r] + valid[r]];
            out.copy_from_slice(&o[..valid[r]]);
            for &x in out.iter() {
                *finite &= x.is_finite();
                if x > row_max[r] {
                    row_max[r] = x;
                }
            }
        }
    }
    if _mm256_movemask_ps(bad) != 0 {
        *finite = false;
    }
}

/// [`portable::transpose`] with AVX2: 8 × 8 blocks transposed in registers,
/// the rest portable (moves only: the same values).
#[target_feature(enable = "avx2,fma")]
pub(super) fn transpose(_t: Avx2, rows: &[&[f32]; TILE], panel: &mut [f32]) {
    let kc = rows[0].len();
    assert!(
        rows.iter().all(|r| r.len() == kc) && (kc == 0 || panel.len() >= (kc - 1) * COLS + TILE)
    );
    let full = kc / 8 * 8;
    let mut k = 0;
    while k < full {
        // SAFETY: k + 8 <= kc, every row's length (asserted); the panel
        // holds (kc − 1) · 16 + 8 floats: rows k .. k + 8 of it, eight
        // floats each, are written.
        unsafe {
            let r: [__m256; 8] = std::array::from_fn(|j| _mm256_loadu_ps(rows[j].as_ptr().add(k)));
            let t0 = _mm256_unpacklo_ps(r[0], r[1]);
            let t1 = _mm256_unpackhi_ps(r[0], r[1]);
            let t2 = _mm256_unpacklo_ps(r[2], r[3]);
            let t3 = _mm256_unpackhi_ps(r[2], r[3]);
            let t4 = _mm256_unpacklo_ps(r[4], r[5]);
            let t5 = _mm256_unpackhi_ps(r[4], r[5]);
            let t6 = _mm256_unpacklo_ps(r[6], r[7]);
            let t7 = _mm256_unpackhi_ps(r[6], r[7]);
            let u0 = _mm256_shuffle_ps::<0b01_00_01_00>(t0, t2);
            let u1 = _mm256_shuffle_ps::<0b11_10_11_10>(t0, t2);
            let u2 = _mm256_shuffle_ps::<0b01_00_01_00>(t1, t3);
            let u3 = _mm256_shuffle_ps::<0b11_10_11_10>(t1, t3);
            let u4 = _mm256_shuffle_ps::<0b01_00_01_00>(t4, t6);
            let u5 = _mm256_shuffle_ps::<0b11_10_11_10>(t4, t6);
            let u6 = _mm256_shuffle_ps::<0b01_00_01_00>(t5, t7);
            let u7 = _mm256_shuffle_ps::<0b11_10_11_10>(t5, t7);
            let out = [
                _mm256_permute2f128_ps::<0x20>(u0, u4),
                _mm256_permute2f128_ps::<0x20>(u1, u5),
                _mm256_permute2f128_ps::<0x20>(u2, u6),
                _mm256_permute2f128_ps::<0x20>(u3, u7),
                _mm256_permute2f128_ps::<0x31>(u0, u4),
                _mm256_permute2f128_ps::<0x31>(u1, u5),
                _mm256_permute2f128_ps::<0x31>(u2, u6),
                _mm256_permute2f128_ps::<0x31>(u3, u7),
            ];
            for (i, v) in out.iter().enumerate() {
                _mm256_storeu_ps(panel.as_mut_ptr().add((k + i) * COLS), *v);
            }
        }
        k += 8;
    }
    if full < kc {
        let tail: [&[f32]; TILE] = std::array::from_fn(|j| &rows[j][full..]);
        portable::transpose(&tail, &mut panel[full * COLS..]);
    }
}

/// [`portable::accumulate`] compiled for AVX2 (the same operations in the
/// same order on each element; the compiler may only widen them).
#[target_feature(enable = "avx2,fma")]
pub(super) fn accumulate(_t: Avx2, e: &[f32], w: f32, vert: &mut [f32], slash: &mut [f32]) {
    portable::accumulate(e, w, vert, slash)
}

/// [`portable::lane_sums`] compiled for AVX2.
#[target_feature(enable = "avx2,fma")]
pub(super) fn lane_sums(_t: Avx2, e: &[f32], lanes: &mut [f32; 8]) {
    portable::lane_sums(e, lanes)
}
