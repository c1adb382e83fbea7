//! The AVX2 + FMA kernel: tiles of 4 heads (then 1) × 16 of the block's
//! keys in two 8-lane registers, one chain per (head, register).

use super::{prefetch_line, prefetch_runs, slot, Src, BLOCK};
use crate::keys::x86::{load8_bf16, load8_f16, load8_fp8};
use crate::keys::Encoded;
use crate::simd::Avx2;
use std::arch::x86_64::*;

const LANES: usize = 8;
/// Keys per tile (two registers).
const TILE_KEYS: usize = 2 * LANES;
const _: () = assert!(BLOCK.is_multiple_of(TILE_KEYS));

/// `out[b][a] = r[a][b]`: an 8 × 8 transpose (32-bit pairs, 64-bit pairs,
/// then 128-bit halves).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
    let t: [__m256; 8] = std::array::from_fn(|j| match j % 2 {
        0 => _mm256_unpacklo_ps(r[j], r[j + 1]),
        _ => _mm256_unpackhi_ps(r[j - 1], r[j]),
    });
    // u[4g + c], half L: rows 4g .. 4g + 4 of column 4L + c.
    let u: [__m256; 8] = std::array::from_fn(|j| {
        let (g, c) = (j / 4 * 4, j % 4);
        let (a, b) = (t[g + c / 2], t[g + c / 2 + 2]);
        match c % 2 {
            0 => _mm256_shuffle_ps::<0x44>(a, b),
            _ => _mm256_shuffle_ps::<0xEE>(a, b),
        }
    });
    std::array::from_fn(|j| match j < 4 {
        true => _mm256_permute2f128_ps::<0x20>(u[j], u[j + 4]),
        false => _mm256_permute2f128_ps::<0x31>(u[j - 4], u[j]),
    })
}

/// Eight elements `at ..` of `src` decoded (the [`crate::keys::x86`]
/// loads, exact); a last tile narrower than 8 (`cols < 8`) is decoded by
/// the scalar decode into a zeroed buffer first.
///
/// # Safety
/// Elements `at .. at + cols` are in `src.enc`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load8(src: Src<'_>, at: usize, cols: usize) -> __m256 {
    if cols < LANES {
        let mut v = [0.0f32; LANES];
        src.enc.decode(at, &mut v[..cols]);
        // SAFETY: `v` holds 8 floats.
        return unsafe { _mm256_loadu_ps(v.as_ptr()) };
    }
    // SAFETY: (every arm) elements `at .. at + 8` exist (the contract).
    unsafe {
        match src.enc {
            Encoded::F32(s) => _mm256_loadu_ps(s.as_ptr().add(at)),
            Encoded::Bf16(s) => load8_bf16(s.as_ptr().add(at)),
            Encoded::F16(s) => load8_f16(s.as_ptr().add(at)),
            Encoded::Fp8E4m3(s) => load8_fp8(s.as_ptr().add(at)),
        }
    }
}

/// [`super::portable::transpose`] of the decoded keys, in 8 × 8 tiles
/// (zero rows past `n`), decoding as it loads.
///
/// # Safety
/// `src.enc.len() >= n * d`, `n <= BLOCK`, `kt.len() >= d * BLOCK` (the
/// token proves the CPU can run it).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn transpose(_: Avx2, src: Src<'_>, n: usize, d: usize, kt: &mut [f32]) {
    let dst = kt.as_mut_ptr();
    for r0 in (0..BLOCK).step_by(LANES) {
        for c0 in (0..d).step_by(LANES) {
            let cols = LANES.min(d - c0);
            let tile: [__m256; 8] = std::array::from_fn(|j| match r0 + j < n {
                // SAFETY: row `r0 + j < n`, its elements `c0 .. c0 + cols <= d`.
                true => unsafe { load8(src, (r0 + j) * d + c0, cols) },
                false => _mm256_setzero_ps(),
            });
            let t = transpose8(tile);
            for (c, v) in t.iter().enumerate().take(cols) {
                // SAFETY: row `c0 + c < d` of `kt`, lanes `r0 .. r0 + 8 <= BLOCK`.
                unsafe { _mm256_storeu_ps(dst.add((c0 + c) * BLOCK + r0), *v) };
            }
        }
    }
}

/// [`super::portable::weighted_relu_sums`], tiles of 4 heads then 1.
///
/// # Safety
/// `qt.len() >= d * w.len()`, `kt.len() >= d * BLOCK` (the token proves
/// the CPU can run it).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn weighted_relu_sums(
    _: Avx2,
    qt: &[f32],
    kt: &[f32],
    w: &[f32],
    d: usize,
    acc: &mut [f32; BLOCK],
    next: &[u8],
) {
    let h = w.len();
    let full = h / 4 * 4;
    let mut runs = prefetch_runs(next, (h / 4 + h % 4) * (BLOCK / TILE_KEYS));
    for h0 in (0..full).step_by(4) {
        for r0 in (0..BLOCK).step_by(TILE_KEYS) {
            let pf = runs.next().unwrap_or_default();
            // SAFETY: heads `h0 .. h0 + 4 <= h`, keys `r0 .. r0 + 16 <= BLOCK`.
            unsafe { tile::<4>(qt, kt, w, d, h0, r0, acc, pf) };
        }
    }
    for h0 in full..h {
        for r0 in (0..BLOCK).step_by(TILE_KEYS) {
            let pf = runs.next().unwrap_or_default();
            // SAFETY: head `h0 < h`, keys as above.
            unsafe { tile::<1>(qt, kt, w, d, h0, r0, acc, pf) };
        }
    }
}

/// Heads `h0 .. h0 + G` against keys `r0 .. r0 + 16` of the block, folded
/// into their sums in head order; the lines of `pf` prefetched, one per
/// dimension (the rest after).
///
/// # Safety
/// `qt.len() >= d * w.len()`, `kt.len() >= d * BLOCK`, `h0 + G <= w.len()`
/// with heads `h0 .. h0 + G` within one tile of the query's layout
/// ([`slot`]), `r0 + 16 <= BLOCK`; the CPU has AVX2 and FMA.
#[inline]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::needless_range_loop)] // indexed on purpose: the accumulators stay in registers
#[allow(clippy::too_many_arguments)]
unsafe fn tile<const G: usize>(
    qt: &[f32],
    kt: &[f32],
    w: &[f32],
    d: usize,
    h0: usize,
    r0: usize,
    acc: &mut [f32; BLOCK],
    pf: &[u8],
) {
    // Heads `h0 .. h0 + G` lie in one of the query's tiles (4 or 1 here are
    // whole tiles or halves of an 8): element `i` of head `h0 + j` at
    // `base + i · stride + j`.
    let (base, stride) = slot(w.len(), d, h0);
    let (qp, kp) = (qt.as_ptr(), kt.as_ptr());
    let mut a = [[_mm256_setzero_ps(); 2]; G];
    for i in 0..d {
        prefetch_line(pf, i);
        // SAFETY: `i < d`: lanes `r0 .. r0 + 16` of row `i` of `kt`, and
        // element `i` of heads `h0 .. h0 + G <= h` in `qt` (the contract).
        unsafe {
            let k0 = _mm256_loadu_ps(kp.add(i * BLOCK + r0));
            let k1 = _mm256_loadu_ps(kp.add(i * BLOCK + r0 + LANES));
            let q = qp.add(base + i * stride);
            for j in 0..G {
                let qv = _mm256_set1_ps(*q.add(j));
                a[j][0] = _mm256_fmadd_ps(qv, k0, a[j][0]);
                a[j][1] = _mm256_fmadd_ps(qv, k1, a[j][1]);
            }
        }
    }
    for i in d..pf.len().div_ceil(64) {
        prefetch_line(pf, i);
    }
    let zero = _mm256_setzero_ps();
    let ap = acc[r0..r0 + TILE_KEYS].as_mut_ptr();
    // SAFETY: `ap` points at 16 floats.
    let mut s = unsafe { [_mm256_loadu_ps(ap), _mm256_loadu_ps(ap.add(LANES))] };
    for j in 0..G {
        let wv = _mm256_set1_ps(w[h0 + j]);
        for p in 0..2 {
            // relu: `x <= 0 ? 0 : x` (NaN is not `<= 0`: kept).
            let x = a[j][p];
            let x = _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_LE_OQ>(x, zero), x);
            s[p] = _mm256_fmadd_ps(wv, x, s[p]);
        }
    }
    // SAFETY: as above.
    unsafe {
        _mm256_storeu_ps(ap, s[0]);
        _mm256_storeu_ps(ap.add(LANES), s[1]);
    }
}
