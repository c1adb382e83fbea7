//! The AVX2 + FMA kernels: the portable arithmetic eight lanes at a time.

use super::portable;
use crate::keys::lanes::{Bf16, Fp8, Load, F16, F32 as L32};
use crate::keys::Encoded;
use crate::simd::{Avx2, Isa};
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

/// One column block of a page: elements `c .. c + 8 * W` of every row,
/// each element's pair of bounds in registers while the rows stream past.
/// `min_ps(v, acc)` keeps `acc` when `v` is NaN and `acc` starts at +inf
/// (`max_ps` at -inf), so neither is ever NaN; an element no row gave a
/// number ends with `min > max` and is NaN. Zeros are canonicalised once,
/// at the end (`+ 0.0`): the extremum of values that compare equal is one
/// value but for the sign of a zero. The same elements of the next page's
/// rows (`next`, its bytes; empty: none) are asked into the L2 as each row
/// is read: a block reads a line from each of 16 rows 2 KiB apart (two lines
/// of rows 4 KiB apart from float32 keys), which the hardware's prefetch did
/// not keep ahead of (from bfloat16 keys the build took float32's time at
/// half the bytes; with the prefetch 0.67-0.81 of it, Intel Xeon). A hint:
/// the bounds are the same.
///
/// # Safety
/// `c + 8 * W <= n`, `rows` holds `n_rows` rows of `n`, `scales` (if any)
/// `n_rows` entries, `lo` and `hi` `n` each.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn page_block<L: Load, const W: usize>(
    rows: &[L::E],
    n: usize,
    n_rows: usize,
    scales: Option<&[f32]>,
    c: usize,
    lo: &mut [f32],
    hi: &mut [f32],
    next: &[u8],
) {
    let zero = _mm256_setzero_ps();
    let mut a = [_mm256_set1_ps(f32::INFINITY); W];
    let mut b = [_mm256_set1_ps(f32::NEG_INFINITY); W];
    let size = std::mem::size_of::<L::E>();
    for t in 0..n_rows {
        // The next page's same elements of row `t` asked into the L2.
        let at = (t * n + c) * size;
        crate::keys::prefetch(next, at, at + 8 * W * size, crate::keys::CacheLevel::L2);
        let sc = scales.map(|s| _mm256_set1_ps(s[t]));
        for w in 0..W {
            // SAFETY: row t's elements c + 8w .. c + 8w + 8 are within rows
            // (the caller's bound).
            let k = unsafe { L::load8(rows.as_ptr().add(t * n + c + 8 * w)) };
            let v = match sc {
                Some(s) => _mm256_mul_ps(k, s),
                None => k,
            };
            a[w] = _mm256_min_ps(v, a[w]);
            b[w] = _mm256_max_ps(v, b[w]);
        }
    }
    let nan = _mm256_set1_ps(f32::NAN);
    for w in 0..W {
        let none = _mm256_cmp_ps::<_CMP_GT_OQ>(a[w], b[w]);
        let (x, y) = (_mm256_add_ps(a[w], zero), _mm256_add_ps(b[w], zero));
        // SAFETY: elements c + 8w .. c + 8w + 8 are within lo and hi.
        unsafe {
            _mm256_storeu_ps(
                lo.as_mut_ptr().add(c + 8 * w),
                _mm256_blendv_ps(x, nan, none),
            );
            _mm256_storeu_ps(
                hi.as_mut_ptr().add(c + 8 * w),
                _mm256_blendv_ps(y, nan, none),
            );
        }
    }
}

/// [`super::page_bounds`] with AVX2: the keys read in place in their own
/// format (decoded exactly into the lanes, [`Load`]), blocks of 32
/// elements (four registers of each bound: each row is read 32 elements at
/// a time), then of 8, the tail portable.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn page_bounds(
    _t: Avx2,
    rows: Encoded<'_>,
    scales: Option<&[f32]>,
    lo: &mut [f32],
    hi: &mut [f32],
    next: &[u8],
) {
    match rows {
        Encoded::F32(r) => blocks::<L32>(r, scales, lo, hi, next),
        Encoded::Bf16(r) => blocks::<Bf16>(r, scales, lo, hi, next),
        Encoded::F16(r) => blocks::<F16>(r, scales, lo, hi, next),
        Encoded::Fp8E4m3(r) => blocks::<Fp8>(r, scales, lo, hi, next),
    }
    let n = lo.len().min(hi.len());
    let full = n / 8 * 8;
    if full < n {
        // The tail: the rows' last n - full elements, decoded, portable.
        let mut v = vec![0.0f32; rows.len()];
        rows.decode_at(Isa::Scalar, 0, &mut v);
        let tail: Vec<f32> = v
            .chunks_exact(n)
            .flat_map(|r| r[full..].iter().copied())
            .collect();
        portable::page_bounds_f32(&tail, scales, &mut lo[full..n], &mut hi[full..n]);
    }
}

/// The whole blocks of [`page_bounds`] (elements `0 .. n / 8 * 8`).
#[target_feature(enable = "avx2,fma,f16c")]
fn blocks<L: Load>(
    rows: &[L::E],
    scales: Option<&[f32]>,
    lo: &mut [f32],
    hi: &mut [f32],
    next: &[u8],
) {
    let n = lo.len().min(hi.len());
    let n_rows = rows.len() / n.max(1);
    let full = n / 8 * 8;
    let mut c = 0;
    while c + 32 <= full {
        // SAFETY: c + 32 <= n; the slices' sizes are `super::page_bounds`'.
        unsafe { page_block::<L, 4>(rows, n, n_rows, scales, c, lo, hi, next) };
        c += 32;
    }
    while c < full {
        // SAFETY: c + 8 <= n.
        unsafe { page_block::<L, 1>(rows, n, n_rows, scales, c, lo, hi, next) };
        c += 8;
    }
}

/// `N` queries (rows of `dp` floats, zero-padded past `d`, with their sign
/// masks `m` alike) against one KV head's bounds of one page (`lo`, `hi`,
/// `d` floats): `out[r * n_pages]` for the tile's rows `r`.
///
/// # Safety
/// `q` and `m` readable for `N * dp` floats, `dp = d` rounded up to 8; `lo`
/// and `hi` for `d` floats; `out` writable at `r * n_pages` for `r < N`.
#[inline]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<const N: usize>(
    q: *const f32,
    m: *const f32,
    dp: usize,
    d: usize,
    lo_p: *const f32,
    hi_p: *const f32,
    n_pages: usize,
    out: *mut f32,
) {
    let zero = _mm256_setzero_ps();
    let full = d / 8;
    let mut acc = [zero; N];
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
            for j in 0..d % 8 {
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
            let (qv, mv) = unsafe {
                (
                    _mm256_loadu_ps(q.add(r * dp + c * 8)),
                    _mm256_loadu_ps(m.add(r * dp + c * 8)),
                )
            };
            *a = _mm256_fmadd_ps(qv, _mm256_blendv_ps(lo, hi, mv), *a);
        }
    }
    for (r, a) in acc.iter().enumerate() {
        // SAFETY: r < N (the caller's bound).
        unsafe { *out.add(r * n_pages) = reduce(*a) };
    }
}

/// [`super::scores`] with AVX2: page by page, each KV head's bounds read
/// once (contiguously: a page's whole row) against its query heads in
/// tiles of 4; padded query copies and their sign masks (`q >= 0`, as the
/// portable comparison) so every load is whole.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub(super) fn scores(
    _t: Avx2,
    q: &[f32],
    (h, g, d): (usize, usize, usize),
    kmin: &[f32],
    kmax: &[f32],
    stride: usize,
    n_pages: usize,
    out: &mut [f32],
) {
    let dp = d.div_ceil(8) * 8;
    let rows = h * g;
    let mut padded = vec![0.0f32; rows * dp];
    let mut masks = vec![0.0f32; rows * dp];
    for (r, row) in q.chunks_exact(d).enumerate() {
        padded[r * dp..r * dp + d].copy_from_slice(row);
        for (i, &x) in row.iter().enumerate() {
            masks[r * dp + i] = f32::from_bits(if x >= 0.0 { u32::MAX } else { 0 });
        }
        for i in d..dp {
            // Past d: q = 0 >= 0 picks the (zero) upper bound, as portably.
            masks[r * dp + i] = f32::from_bits(u32::MAX);
        }
    }
    for p in 0..n_pages {
        for kv in 0..h {
            let at = p * stride + kv * d;
            let (lo, hi) = (kmin[at..].as_ptr(), kmax[at..].as_ptr());
            let mut r = 0;
            while r < g {
                let n = (g - r).min(4);
                let row = kv * g + r;
                let (qp, mp) = (padded[row * dp..].as_ptr(), masks[row * dp..].as_ptr());
                let op = out[row * n_pages + p..].as_mut_ptr();
                // SAFETY: rows `row .. row + n` of `padded` / `masks` (dp
                // each) and of `out` (n_pages apart) exist; page p's head kv
                // bounds are `d` floats from `at` (`super::scores`' bounds).
                unsafe {
                    match n {
                        4 => tile::<4>(qp, mp, dp, d, lo, hi, n_pages, op),
                        3 => tile::<3>(qp, mp, dp, d, lo, hi, n_pages, op),
                        2 => tile::<2>(qp, mp, dp, d, lo, hi, n_pages, op),
                        _ => tile::<1>(qp, mp, dp, d, lo, hi, n_pages, op),
                    }
                }
                r += n;
            }
        }
    }
}
