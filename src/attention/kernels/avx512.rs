//! The AVX-512 kernels: the portable chains sixteen columns at a time. Every
//! output element is still one FMA chain over the keys in order, so the
//! bits are those of every other level.

use super::KEY_TILE;
use crate::exp::avx512::exp;
use crate::simd::Avx512;
use std::arch::x86_64::*;

/// [`scores_tiles`] over `tiles` (1 or 2) tiles.
///
/// # Safety
/// As [`scores_tiles`] with `T = tiles`.
#[target_feature(enable = "avx512f,avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn scores<const R: usize>(
    token: Avx512,
    q: &[f32],
    q_offs: &[usize],
    ktiles: &[f32],
    tiles: usize,
    d: usize,
    scale: f32,
    out: &mut [f32],
    stride: usize,
) {
    // SAFETY: the caller's contract, for the `T` chosen.
    unsafe {
        match tiles {
            2 => scores_tiles::<R, 2>(token, q, q_offs, ktiles, d, scale, out, stride),
            _ => scores_tiles::<R, 1>(token, q, q_offs, ktiles, d, scale, out, stride),
        }
    }
}

/// [`super::avx2::scores`] with 512-bit registers over `T` (1 or 2) tiles:
/// a tile is one 16-lane block (dimension `c` of key `t` at `c · 16 + t`),
/// so each key is a lane and its score one FMA chain over the dimensions,
/// as on every level; `R · T` accumulators.
///
/// # Safety
/// `_token` proves AVX-512 F; `q_offs.len() == R`, `q_offs[r] + d <=
/// q.len()`, `ktiles.len() >= 16 T d`, `out.len() >= (R - 1) · stride + 16 T`.
#[target_feature(enable = "avx512f,avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn scores_tiles<const R: usize, const T: usize>(
    _token: Avx512,
    q: &[f32],
    q_offs: &[usize],
    ktiles: &[f32],
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
    let k0 = ktiles.as_ptr();
    let mut acc = [[_mm512_setzero_ps(); T]; R];
    for c in 0..d {
        // SAFETY: `c < d`; tile `t < T` is the `16 d` floats at `16 d t`;
        // query rows of `d` floats.
        unsafe {
            let mut b = [_mm512_setzero_ps(); T];
            for (t, bt) in b.iter_mut().enumerate() {
                *bt = _mm512_loadu_ps(k0.add(t * KEY_TILE * d + c * KEY_TILE));
            }
            for r in 0..R {
                let x = _mm512_set1_ps(*qp[r].add(c));
                for t in 0..T {
                    acc[r][t] = _mm512_fmadd_ps(x, b[t], acc[r][t]);
                }
            }
        }
    }
    let vs = _mm512_set1_ps(scale);
    for r in 0..R {
        for t in 0..T {
            // SAFETY: `(R - 1) · stride + 16 T <= out.len()`.
            unsafe {
                let o = out.as_mut_ptr().add(r * stride + t * KEY_TILE);
                _mm512_storeu_ps(o, _mm512_mul_ps(acc[r][t], vs));
            }
        }
    }
}

/// [`super::avx2::accumulate`] with 512-bit registers: 32 columns of `R`
/// rows per pass over the keys (`2R` accumulators), then 16, then the AVX2
/// kernel's 8-column and scalar tails.
///
/// # Safety
/// `token` proves AVX-512 F (and AVX2+FMA); `(r0 + R - 1) · stride + j1 <=
/// p.len()`, `(r0 + R) · d_v <= o.len()`, `j1 <= voff.len()`, and
/// `voff[j] + d_v <= v.len()` for `j` in `j0..j1`.
#[target_feature(enable = "avx512f,avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn accumulate<const R: usize>(
    token: Avx512,
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
    let mut c = 0;
    while c + 32 <= d_v {
        // SAFETY: the contract, and columns `c..c + 32 <= d_v`.
        unsafe { columns::<R, 2>(p, stride, r0, v, voff, j0, j1, o, d_v, c) };
        c += 32;
    }
    if c + 16 <= d_v {
        // SAFETY: the contract, and columns `c..c + 16 <= d_v`.
        unsafe { columns::<R, 1>(p, stride, r0, v, voff, j0, j1, o, d_v, c) };
        c += 16;
    }
    if c < d_v {
        // The last columns (fewer than 16): the AVX2 kernel's tails.
        // SAFETY: `token` implies AVX2+FMA; the same contract, and `c <= d_v`.
        unsafe {
            super::avx2::accumulate_cols::<R>(
                token.avx2(),
                p,
                stride,
                r0,
                v,
                voff,
                j0,
                j1,
                o,
                d_v,
                c,
            )
        };
    }
}

/// Columns `c .. c + 16 C` of [`accumulate`]'s `R` rows, `C` registers per
/// row: each element one FMA chain over keys `j0..j1` in order.
///
/// # Safety
/// [`accumulate`]'s contract, and `c + 16 C <= d_v`.
#[target_feature(enable = "avx512f,avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn columns<const R: usize, const C: usize>(
    p: &[f32],
    stride: usize,
    r0: usize,
    v: &[f32],
    voff: &[usize],
    j0: usize,
    j1: usize,
    o: &mut [f32],
    d_v: usize,
    c: usize,
) {
    let (pp, vp, op) = (p.as_ptr(), v.as_ptr(), o.as_mut_ptr());
    // Every access relies on the contract: rows `r0 + r < r0 + R` of `o`
    // (`d_v` apart) and of `p` (`stride` apart, keys `j < j1`), value rows
    // `voff[j] + d_v <= v.len()`, columns `c..c + 16 C <= d_v`.
    let mut acc = [[_mm512_setzero_ps(); C]; R];
    for r in 0..R {
        for (x, a) in acc[r].iter_mut().enumerate() {
            // SAFETY: output row `r0 + r`, columns `c + 16 x ..+ 16 <= d_v`.
            *a = unsafe { _mm512_loadu_ps(op.add((r0 + r) * d_v + c + 16 * x)) };
        }
    }
    for j in j0..j1 {
        // SAFETY: `j < j1 <= voff.len()`; value row `voff[j]`, columns
        // `c..c + 16 C <= d_v`; probability `(r0 + r, j)` is in `p`.
        unsafe {
            let vr = vp.add(*voff.get_unchecked(j) + c);
            let mut b = [_mm512_setzero_ps(); C];
            for (x, bx) in b.iter_mut().enumerate() {
                *bx = _mm512_loadu_ps(vr.add(16 * x));
            }
            for r in 0..R {
                let w = _mm512_set1_ps(*pp.add((r0 + r) * stride + j));
                for x in 0..C {
                    acc[r][x] = _mm512_fmadd_ps(w, b[x], acc[r][x]);
                }
            }
        }
    }
    for r in 0..R {
        for (x, a) in acc[r].iter().enumerate() {
            // SAFETY: output row `r0 + r`, columns `c + 16 x ..+ 16 <= d_v`.
            unsafe { _mm512_storeu_ps(op.add((r0 + r) * d_v + c + 16 * x), *a) };
        }
    }
}

/// [`super::avx2::softmax`] sixteen lanes at a time: the maximum is the
/// same (a maximum does not depend on the grouping; NaN is skipped and ±0
/// made +0 alike), each exponential the same bits, and
/// the sum keeps the AVX2 kernel's order exactly: each 16-lane result is
/// added to the 8-lane accumulator as its low half, then its high half,
/// which are the AVX2 kernel's consecutive chunks.
///
/// # Safety
/// `_token` proves AVX-512 F and DQ and AVX2+FMA; `s.len()` a multiple of 8.
#[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
pub(super) unsafe fn softmax(_token: Avx512, s: &mut [f32]) -> (f32, f32) {
    // The maximum sixteen at a time, folded to eight lanes, then the last
    // eight: `max(x, m)` keeps `m` when `x` is NaN, on either width.
    let mut wide = _mm512_set1_ps(f32::NEG_INFINITY);
    let mut pairs = s.chunks_exact(16);
    for c in &mut pairs {
        // SAFETY: 16 in-bounds floats.
        let x = unsafe { _mm512_loadu_ps(c.as_ptr()) };
        wide = _mm512_max_ps(x, wide);
    }
    let mut vm = _mm256_max_ps(
        _mm512_castps512_ps256(wide),
        _mm512_extractf32x8_ps::<1>(wide),
    );
    if let Some(c) = pairs.remainder().get(..8) {
        // SAFETY: 8 in-bounds floats.
        let x = unsafe { _mm256_loadu_ps(c.as_ptr()) };
        vm = _mm256_max_ps(x, vm);
    }
    let m = super::avx2::max_of_lanes(vm);
    let vmv = _mm512_set1_ps(m);
    let mut acc = _mm256_setzero_ps();
    let mut pairs = s.chunks_exact_mut(16);
    for c in &mut pairs {
        // SAFETY: 16 in-bounds floats.
        unsafe {
            let p = exp(_mm512_sub_ps(_mm512_loadu_ps(c.as_ptr()), vmv));
            _mm512_storeu_ps(c.as_mut_ptr(), p);
            acc = _mm256_add_ps(acc, _mm512_castps512_ps256(p));
            acc = _mm256_add_ps(acc, _mm512_extractf32x8_ps::<1>(p));
        }
    }
    let rest = pairs.into_remainder();
    if !rest.is_empty() {
        // The last 8 (the length is a multiple of 8): the AVX2 exponential.
        // SAFETY: 8 in-bounds floats.
        unsafe {
            let x = _mm256_sub_ps(_mm256_loadu_ps(rest.as_ptr()), _mm256_set1_ps(m));
            let p = crate::exp::avx2::exp(x);
            _mm256_storeu_ps(rest.as_mut_ptr(), p);
            acc = _mm256_add_ps(acc, p);
        }
    }
    (m, super::avx2::sum_of_lanes(acc))
}
