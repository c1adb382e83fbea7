//! The AVX2+FMA kernels: the portable chains eight keys or columns at a
//! time.

use super::KEY_TILE;
use crate::exp::avx2::exp;
use crate::simd::Avx2;
use std::arch::x86_64::*;

/// # Safety
/// `_token` proves AVX2+FMA; `q_offs.len() == R`, `q_offs[r] + d <= q.len()`,
/// `ktile.len() >= 16 d`, `out.len() >= (R - 1) · stride + 16`.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn scores<const R: usize>(
    _token: Avx2,
    q: &[f32],
    q_offs: &[usize],
    ktile: &[f32],
    d: usize,
    scale: f32,
    out: &mut [f32],
    stride: usize,
) {
    let mut qp = [q.as_ptr(); R];
    for (p, &o) in qp.iter_mut().zip(q_offs) {
        // SAFETY: `o + d <= q.len()`.
        *p = unsafe { q.as_ptr().add(o) };
    }
    let k0 = ktile.as_ptr();
    let mut a0 = [_mm256_setzero_ps(); R];
    let mut a1 = [_mm256_setzero_ps(); R];
    for c in 0..d {
        // SAFETY: `c < d`, tile of `16 d` floats, rows of `d` floats.
        unsafe {
            let b0 = _mm256_loadu_ps(k0.add(c * 8));
            let b1 = _mm256_loadu_ps(k0.add(8 * d + c * 8));
            for r in 0..R {
                let x = _mm256_set1_ps(*qp[r].add(c));
                a0[r] = _mm256_fmadd_ps(x, b0, a0[r]);
                a1[r] = _mm256_fmadd_ps(x, b1, a1[r]);
            }
        }
    }
    let vs = _mm256_set1_ps(scale);
    for r in 0..R {
        // SAFETY: `(R - 1) · stride + 16 <= out.len()`.
        unsafe {
            let o = out.as_mut_ptr().add(r * stride);
            _mm256_storeu_ps(o, _mm256_mul_ps(a0[r], vs));
            _mm256_storeu_ps(o.add(KEY_TILE / 2), _mm256_mul_ps(a1[r], vs));
        }
    }
}

/// Packs 8 keys (rows at `k[rows[t]..rows[t] + d]`) into `dst`, a block
/// of `lanes · d` floats (`lanes` 8 or 16): dimension `c` of key `t` at
/// `c · lanes + first + t`, eight dimensions at a time through an 8×8
/// transpose; prefetches the rows in `next`.
///
/// # Safety
/// `_token` proves AVX2+FMA; `rows[t] + d <= k.len()`; `d >= 1`, `dst.len()
/// == lanes · d` and `first + 8 <= lanes`.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn pack_block(
    _token: Avx2,
    k: &[f32],
    rows: &[usize; 8],
    next: Option<&[usize; 8]>,
    d: usize,
    dst: &mut [f32],
    lanes: usize,
    first: usize,
) {
    if let Some(next) = next {
        for &o in next {
            for c in (0..d).step_by(16) {
                // A prefetch never faults; the pointer is not dereferenced.
                _mm_prefetch::<_MM_HINT_T0>(k.as_ptr().wrapping_add(o + c) as *const i8);
            }
        }
    }
    let kp = k.as_ptr();
    // SAFETY: `first < lanes <= lanes · d = dst.len()` (the contract: `d >= 1`).
    let dp = unsafe { dst.as_mut_ptr().add(first) };
    let mut c = 0;
    while c + 8 <= d {
        // SAFETY: `c + 8 <= d`, rows in bounds; dimension `c + i` goes to
        // `dst[(c + i) · lanes + first ..][..8]`, inside the `lanes · d` block.
        unsafe {
            let r = |t: usize| _mm256_loadu_ps(kp.add(rows[t] + c));
            let (r0, r1, r2, r3) = (r(0), r(1), r(2), r(3));
            let (r4, r5, r6, r7) = (r(4), r(5), r(6), r(7));
            let t0 = _mm256_unpacklo_ps(r0, r1);
            let t1 = _mm256_unpackhi_ps(r0, r1);
            let t2 = _mm256_unpacklo_ps(r2, r3);
            let t3 = _mm256_unpackhi_ps(r2, r3);
            let t4 = _mm256_unpacklo_ps(r4, r5);
            let t5 = _mm256_unpackhi_ps(r4, r5);
            let t6 = _mm256_unpacklo_ps(r6, r7);
            let t7 = _mm256_unpackhi_ps(r6, r7);
            let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
            let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
            let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
            let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
            let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
            let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
            let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
            let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
            let o = dp.add(c * lanes);
            _mm256_storeu_ps(o, _mm256_permute2f128_ps::<0x20>(u0, u4));
            _mm256_storeu_ps(o.add(lanes), _mm256_permute2f128_ps::<0x20>(u1, u5));
            _mm256_storeu_ps(o.add(2 * lanes), _mm256_permute2f128_ps::<0x20>(u2, u6));
            _mm256_storeu_ps(o.add(3 * lanes), _mm256_permute2f128_ps::<0x20>(u3, u7));
            _mm256_storeu_ps(o.add(4 * lanes), _mm256_permute2f128_ps::<0x31>(u0, u4));
            _mm256_storeu_ps(o.add(5 * lanes), _mm256_permute2f128_ps::<0x31>(u1, u5));
            _mm256_storeu_ps(o.add(6 * lanes), _mm256_permute2f128_ps::<0x31>(u2, u6));
            _mm256_storeu_ps(o.add(7 * lanes), _mm256_permute2f128_ps::<0x31>(u3, u7));
        }
        c += 8;
    }
    for cc in c..d {
        for (t, &o) in rows.iter().enumerate() {
            dst[cc * lanes + first + t] = k[o + cc];
        }
    }
}

/// # Safety
/// `_token` proves AVX2+FMA; `s.len()` a multiple of 8.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn softmax(_token: Avx2, s: &mut [f32]) -> (f32, f32) {
    let mut vm = _mm256_set1_ps(f32::NEG_INFINITY);
    for c in s.chunks_exact(8) {
        // SAFETY: 8 in-bounds floats.
        let x = unsafe { _mm256_loadu_ps(c.as_ptr()) };
        // `x > m ? x : m`, as the scalar loop.
        vm = _mm256_max_ps(x, vm);
    }
    let m = max_of_lanes(vm);
    let vmv = _mm256_set1_ps(m);
    let mut acc = _mm256_setzero_ps();
    for c in s.chunks_exact_mut(8) {
        // SAFETY: 8 in-bounds floats.
        unsafe {
            let p = exp(_mm256_sub_ps(_mm256_loadu_ps(c.as_ptr()), vmv));
            _mm256_storeu_ps(c.as_mut_ptr(), p);
            acc = _mm256_add_ps(acc, p);
        }
    }
    (m, sum_of_lanes(acc))
}

/// The softmax's maximum from its 8 lane maxima: lane by lane as the
/// scalar loop (`x > m`), then `+ 0.0` (-0.0 and +0.0 are one maximum).
#[target_feature(enable = "avx2,fma")]
pub(super) fn max_of_lanes(vm: __m256) -> f32 {
    let mut lanes = [0.0f32; 8];
    // SAFETY: 8 floats.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), vm) };
    let mut m = f32::NEG_INFINITY;
    for x in lanes {
        if x > m {
            m = x;
        }
    }
    m + 0.0
}

/// The softmax's sum from its 8 lane sums: `((l0+l4)+(l2+l6)) +
/// ((l1+l5)+(l3+l7))`, the portable `reduce8`.
#[target_feature(enable = "avx2,fma")]
pub(super) fn sum_of_lanes(acc: __m256) -> f32 {
    let a = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps::<1>(acc));
    let b = _mm_add_ps(a, _mm_movehl_ps(a, a));
    _mm_cvtss_f32(_mm_add_ss(b, _mm_movehdup_ps(b)))
}

/// # Safety
/// `_token` proves AVX2+FMA; `(r0 + R - 1) · stride + j1 <= p.len()`,
/// `(r0 + R) · d_v <= o.len()`, `j1 <= voff.len()`, and
/// `voff[j] + d_v <= v.len()` for `j` in `j0..j1`.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn accumulate<const R: usize>(
    token: Avx2,
    p: &[f32],
    stride: usize,
    r0: usize,
    v: &[f32],
    voff: &[usize],
    j0: usize,
    j1: usize,
    o: &mut [f32],
    d_v: usize,
) {
    // SAFETY: the same contract; columns from 0.
    unsafe { accumulate_cols::<R>(token, p, stride, r0, v, voff, j0, j1, o, d_v, 0) }
}

/// [`accumulate`] of columns `c0..d_v` only (the AVX-512 kernel's tail).
///
/// # Safety
/// As [`accumulate`], and `c0 <= d_v`.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn accumulate_cols<const R: usize>(
    _token: Avx2,
    p: &[f32],
    stride: usize,
    r0: usize,
    v: &[f32],
    voff: &[usize],
    j0: usize,
    j1: usize,
    o: &mut [f32],
    d_v: usize,
    c0: usize,
) {
    let pp = p.as_ptr();
    let vp = v.as_ptr();
    let op = o.as_mut_ptr();
    let mut c = c0;
    // Every block below relies on the bounds of the function's contract:
    // rows `r0 + r < r0 + R` of `o` (`d_v` apart) and of `p` (`stride`
    // apart, keys `j < j1`), value rows `voff[j] + d_v <= v.len()`, and the
    // columns of each loop (`c + 16 <= d_v`, `c + 8 <= d_v`, `cc < d_v`).
    while c + 16 <= d_v {
        let mut a0 = [_mm256_setzero_ps(); R];
        let mut a1 = [_mm256_setzero_ps(); R];
        for r in 0..R {
            // SAFETY: output row `r0 + r`, columns `c..c + 16 <= d_v`.
            unsafe {
                a0[r] = _mm256_loadu_ps(op.add((r0 + r) * d_v + c));
                a1[r] = _mm256_loadu_ps(op.add((r0 + r) * d_v + c + 8));
            }
        }
        for j in j0..j1 {
            // SAFETY: `j < j1 <= voff.len()`; value row `voff[j]`, columns
            // `c..c + 16 <= d_v`; probability `(r0 + r, j)` is in `p`.
            unsafe {
                let vr = vp.add(*voff.get_unchecked(j) + c);
                let b0 = _mm256_loadu_ps(vr);
                let b1 = _mm256_loadu_ps(vr.add(8));
                for r in 0..R {
                    let x = _mm256_set1_ps(*pp.add((r0 + r) * stride + j));
                    a0[r] = _mm256_fmadd_ps(x, b0, a0[r]);
                    a1[r] = _mm256_fmadd_ps(x, b1, a1[r]);
                }
            }
        }
        for r in 0..R {
            // SAFETY: output row `r0 + r`, columns `c..c + 16 <= d_v`.
            unsafe {
                _mm256_storeu_ps(op.add((r0 + r) * d_v + c), a0[r]);
                _mm256_storeu_ps(op.add((r0 + r) * d_v + c + 8), a1[r]);
            }
        }
        c += 16;
    }
    if c + 8 <= d_v {
        let mut a0 = [_mm256_setzero_ps(); R];
        for r in 0..R {
            // SAFETY: output row `r0 + r`, columns `c..c + 8 <= d_v`.
            unsafe { a0[r] = _mm256_loadu_ps(op.add((r0 + r) * d_v + c)) };
        }
        for j in j0..j1 {
            // SAFETY: `j < j1 <= voff.len()`; value row `voff[j]`, columns
            // `c..c + 8 <= d_v`; probability `(r0 + r, j)` is in `p`.
            unsafe {
                let b0 = _mm256_loadu_ps(vp.add(*voff.get_unchecked(j) + c));
                for r in 0..R {
                    let x = _mm256_set1_ps(*pp.add((r0 + r) * stride + j));
                    a0[r] = _mm256_fmadd_ps(x, b0, a0[r]);
                }
            }
        }
        for r in 0..R {
            // SAFETY: output row `r0 + r`, columns `c..c + 8 <= d_v`.
            unsafe { _mm256_storeu_ps(op.add((r0 + r) * d_v + c), a0[r]) };
        }
        c += 8;
    }
    for cc in c..d_v {
        for r in 0..R {
            // SAFETY: output row `r0 + r`, column `cc < d_v`; value rows and
            // probabilities as above.
            unsafe {
                let mut a = *op.add((r0 + r) * d_v + cc);
                for j in j0..j1 {
                    let x = *pp.add((r0 + r) * stride + j);
                    a = x.mul_add(*vp.add(*voff.get_unchecked(j) + cc), a);
                }
                *op.add((r0 + r) * d_v + cc) = a;
            }
        }
    }
}
