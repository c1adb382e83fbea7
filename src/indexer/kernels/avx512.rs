//! The AVX-512 kernel: tiles of 8 heads (then 4, then 1) × the block's 32
//! keys in two 16-lane registers, one chain per (head, register): per
//! dimension two key loads, one broadcast per head, two FMAs per head.

use super::{prefetch_line, prefetch_runs, Src, BLOCK};
use crate::keys::x86 as decode;
use crate::keys::Encoded;
use crate::simd::Avx512;
use std::arch::x86_64::*;

const LANES: usize = 16;
const _: () = assert!(BLOCK == 2 * LANES);

/// `out[b][a] = r[a][b]`: a 16 × 16 transpose in four rounds of shuffles
/// (32-bit pairs, 64-bit pairs, then 128-bit lanes twice).
#[inline]
#[target_feature(enable = "avx512f")]
fn transpose16(r: [__m512; 16]) -> [__m512; 16] {
    // t[2i], t[2i+1]: rows 2i, 2i+1 interleaved within each 128-bit lane.
    let t: [__m512; 16] = std::array::from_fn(|j| match j % 2 {
        0 => _mm512_unpacklo_ps(r[j], r[j + 1]),
        _ => _mm512_unpackhi_ps(r[j - 1], r[j]),
    });
    // u[4g + c], lane L: rows 4g .. 4g + 4 of column 4L + c.
    let u: [__m512; 16] = std::array::from_fn(|j| {
        let (g, c) = (j / 4 * 4, j % 4);
        let (a, b) = (t[g + c / 2], t[g + c / 2 + 2]);
        match c % 2 {
            0 => _mm512_shuffle_ps::<0x44>(a, b),
            _ => _mm512_shuffle_ps::<0xEE>(a, b),
        }
    });
    // Column 4L + c is lane L of u[c], u[4 + c], u[8 + c], u[12 + c]: a
    // 4 × 4 transpose of 128-bit lanes, in two rounds.
    let mut out = [_mm512_setzero_ps(); 16];
    for c in 0..4 {
        let v0 = _mm512_shuffle_f32x4::<0x88>(u[c], u[4 + c]);
        let v1 = _mm512_shuffle_f32x4::<0xDD>(u[c], u[4 + c]);
        let v2 = _mm512_shuffle_f32x4::<0x88>(u[8 + c], u[12 + c]);
        let v3 = _mm512_shuffle_f32x4::<0xDD>(u[8 + c], u[12 + c]);
        out[c] = _mm512_shuffle_f32x4::<0x88>(v0, v2);
        out[8 + c] = _mm512_shuffle_f32x4::<0xDD>(v0, v2);
        out[4 + c] = _mm512_shuffle_f32x4::<0x88>(v1, v3);
        out[12 + c] = _mm512_shuffle_f32x4::<0xDD>(v1, v3);
    }
    out
}

/// The key formats, as `const` parameters (each transpose is compiled per
/// format, so no load decides its format at run time).
const F32: u8 = 0;
const BF16: u8 = 1;
const F16: u8 = 2;
const FP8: u8 = 3;
const FP8_FINITE: u8 = 4;
/// bfloat16 rows read as pairs (`u32`s, dimension `2i` the low half), each
/// pair's halves swapped into the pair level's layout (`2i` high).
const PAIRS: u8 = 5;

/// Sixteen elements `at ..` of the block at `p` in format `F` (the lanes
/// off in `mask` read as 0, never touched), decoded exactly as the scalar
/// decodes do: bfloat16 as the upper halves of `f32`s, float16 by the F16C
/// conversion, e4m3fn through float16 ([`decode::fp8_as_f16_bits_256`]:
/// `seeeemmm` → `s0eeeemmm0000000`, `0x7F` / `0xFF` → the float16 NaN
/// unless `F` is [`FP8_FINITE`]) then `× 2⁸`, an exact multiply of a
/// normal.
///
/// # Safety
/// Every lane on in `mask` is an element of the block at `p`, and `mask`
/// has at least its first lane on (so `p` advanced by `at` elements stays
/// within the block); the CPU has AVX-512 F/BW/DQ/VL, AVX2, FMA and F16C.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
unsafe fn load16<const F: u8>(p: *const u8, at: usize, mask: __mmask16) -> __m512 {
    // SAFETY: (every arm) the lanes read are the ones on in `mask`, elements
    // of the block (the contract); masked-off lanes are never accessed.
    unsafe {
        match F {
            F32 => _mm512_maskz_loadu_ps(mask, p.cast::<f32>().add(at)),
            PAIRS => _mm512_castsi512_ps(_mm512_rol_epi32::<16>(_mm512_maskz_loadu_epi32(
                mask,
                p.cast::<i32>().add(at),
            ))),
            BF16 => {
                let w = _mm256_maskz_loadu_epi16(mask, p.cast::<u16>().add(at).cast());
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(w)))
            }
            F16 => _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(
                mask,
                p.cast::<u16>().add(at).cast(),
            )),
            _ => {
                let x = _mm256_cvtepu8_epi16(_mm_maskz_loadu_epi8(mask, p.add(at).cast()));
                // The float16 bits of `2⁻⁸ ×` the values: the one fp8 lane
                // decode of `keys/x86.rs` (every byte tested there).
                let h = match F {
                    FP8 => decode::fp8_as_f16_bits_256(x),
                    _ => decode::fp8_as_f16_bits_256_finite(x),
                };
                _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.0))
            }
        }
    }
}

/// [`super::portable::transpose`] of the decoded keys, in 16 × 16 tiles
/// (masked loads for a last tile narrower than 16 dimensions; zero rows
/// past `n`), decoding as it loads.
///
/// # Safety
/// `src.enc.len() >= n * d`, `n <= BLOCK`, `kt.len() >= d * BLOCK` (the
/// token proves the CPU can run it).
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn transpose(_: Avx512, src: Src<'_>, n: usize, d: usize, kt: &mut [f32]) {
    // SAFETY: (every arm) the block holds `n` rows of `d` elements of the
    // format named (the contract).
    unsafe {
        match src.enc {
            Encoded::F32(s) => tiles::<F32>(s.as_ptr().cast(), n, d, kt),
            Encoded::Bf16(s) => tiles::<BF16>(s.as_ptr().cast(), n, d, kt),
            Encoded::F16(s) => tiles::<F16>(s.as_ptr().cast(), n, d, kt),
            Encoded::Fp8E4m3(s) if src.finite => tiles::<FP8_FINITE>(s.as_ptr(), n, d, kt),
            Encoded::Fp8E4m3(s) => tiles::<FP8>(s.as_ptr(), n, d, kt),
        }
    }
}

/// The pair level's block ([`super::pairs`]) from a block of bfloat16 rows
/// (`rows`, `[BLOCK, d]`): `kp[i · BLOCK + r]` the pair of key `r`'s
/// dimensions `2i` (high half) and `2i + 1`. The transpose moves bits only
/// (shuffles, no arithmetic): [`super::pairs::transpose_rows`]'s pairs.
/// Callers need only the token (the lengths are asserted).
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
pub(super) fn transpose_pairs(_: Avx512, rows: &[u16], d: usize, kp: &mut [u32]) {
    assert!(d.is_multiple_of(2) && rows.len() == BLOCK * d && kp.len() == d / 2 * BLOCK);
    // SAFETY: `rows` holds `BLOCK` rows of `d / 2` pairs and `kp` `d / 2`
    // rows of `BLOCK` (asserted).
    unsafe {
        tiles::<PAIRS>(
            rows.as_ptr().cast(),
            BLOCK,
            d / 2,
            bytemuck::cast_slice_mut(kp),
        )
    }
}

/// [`transpose`] of the block at `p`, in format `F`.
///
/// # Safety
/// `p` holds `n <= BLOCK` rows of `d` elements in format `F`; `kt.len() >=
/// d * BLOCK`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
unsafe fn tiles<const F: u8>(p: *const u8, n: usize, d: usize, kt: &mut [f32]) {
    let dst = kt.as_mut_ptr();
    for c0 in (0..d).step_by(LANES) {
        // SAFETY: `c0 < d`; the rest is the contract.
        unsafe { columns::<F>(p, n, d, dst, c0) };
    }
}

/// Rows `c0 .. min(c0 + 16, d)` of the transposed block (dimensions `c0 ..`
/// of every key): two 16 × 16 tiles.
///
/// # Safety
/// `p` holds `n <= BLOCK` rows of `d` elements in format `F`; `dst` points
/// at `d * BLOCK` writable floats; `c0 < d`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
unsafe fn columns<const F: u8>(p: *const u8, n: usize, d: usize, dst: *mut f32, c0: usize) {
    let cols = LANES.min(d - c0);
    let mask: __mmask16 = (u32::MAX >> (32 - cols)) as u16;
    for r0 in (0..BLOCK).step_by(LANES) {
        let rows = n.saturating_sub(r0).min(LANES);
        let tile: [__m512; 16] = match rows == LANES {
            // A full tile: sixteen loads the compiler keeps in registers.
            true => std::array::from_fn(|j| {
                // SAFETY: row `r0 + j < n`, its lanes `c0 .. c0 + cols <= d`
                // (the rest masked off, never read).
                unsafe { load16::<F>(p, (r0 + j) * d + c0, mask) }
            }),
            false => std::array::from_fn(|j| match j < rows {
                // SAFETY: as above, `j < rows` so row `r0 + j < n`.
                true => unsafe { load16::<F>(p, (r0 + j) * d + c0, mask) },
                false => _mm512_setzero_ps(),
            }),
        };
        let t = transpose16(tile);
        for (c, v) in t.iter().enumerate().take(cols) {
            // SAFETY: row `c0 + c < d` of the block, lanes `r0 .. r0 + 16 <= BLOCK`.
            unsafe { _mm512_storeu_ps(dst.add((c0 + c) * BLOCK + r0), *v) };
        }
    }
}

/// [`super::portable::weighted_relu_sums`], tiles of 12, then 8, 4 and 1
/// heads (the query's tiles, [`super::Tiles::Twelves`]): 24 accumulators
/// and 14 loads for 24 multiply-adds a step (docs/kernels.md has the
/// measurements against tiles of 8).
///
/// # Safety
/// `qt.len() >= d * w.len()`, `kt.len() >= d * BLOCK` (the token proves
/// the CPU can run it).
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
pub(super) unsafe fn weighted_relu_sums<const RELU: bool>(
    _: Avx512,
    qt: &[f32],
    kt: &[f32],
    w: &[f32],
    d: usize,
    acc: &mut [f32; BLOCK],
    next: &[u8],
) {
    let h = w.len();
    let (twelves, rest) = (h / 12, h % 12);
    let tiles = twelves + usize::from(rest >= 8) + usize::from(rest % 8 >= 4) + rest % 4;
    let mut runs = prefetch_runs(next, tiles);
    let mut h0 = 0;
    while h0 + 12 <= h {
        // SAFETY: heads `h0 .. h0 + 12 <= h` (the bounds as the contract).
        unsafe { tile::<12, RELU>(qt, kt, w, d, h0, acc, runs.next().unwrap_or_default()) };
        h0 += 12;
    }
    if h0 + 8 <= h {
        // SAFETY: heads `h0 .. h0 + 8 <= h`.
        unsafe { tile::<8, RELU>(qt, kt, w, d, h0, acc, runs.next().unwrap_or_default()) };
        h0 += 8;
    }
    if h0 + 4 <= h {
        // SAFETY: heads `h0 .. h0 + 4 <= h`.
        unsafe { tile::<4, RELU>(qt, kt, w, d, h0, acc, runs.next().unwrap_or_default()) };
        h0 += 4;
    }
    for h0 in h0..h {
        // SAFETY: head `h0 < h`.
        unsafe { tile::<1, RELU>(qt, kt, w, d, h0, acc, runs.next().unwrap_or_default()) };
    }
}

/// Heads `h0 .. h0 + G` (one of the query's tiles) against the block,
/// folded into `acc` in head order; the lines of `pf` prefetched, one per
/// dimension (the rest after).
///
/// # Safety
/// `qt.len() >= d * w.len()`, `kt.len() >= d * BLOCK`, `h0 + G <= w.len()`
/// with `h0 .. h0 + G` a tile of the query's layout; the CPU has AVX-512
/// F/BW/DQ/VL, AVX2 and FMA.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
#[allow(clippy::needless_range_loop)] // indexed on purpose: the accumulators stay in registers
unsafe fn tile<const G: usize, const RELU: bool>(
    qt: &[f32],
    kt: &[f32],
    w: &[f32],
    d: usize,
    h0: usize,
    acc: &mut [f32; BLOCK],
    pf: &[u8],
) {
    let (qp, kp) = (qt.as_ptr(), kt.as_ptr());
    let mut a = [[_mm512_setzero_ps(); 2]; G];
    for i in 0..d {
        prefetch_line(pf, i);
        // SAFETY: `i < d`: row `i` of `kt` (`BLOCK` lanes), and element `i`
        // of the tile of heads `h0 .. h0 + G <= h` in `qt` (the contract:
        // [`super::Query`]'s tiles are this kernel's).
        unsafe {
            let k0 = _mm512_loadu_ps(kp.add(i * BLOCK));
            let k1 = _mm512_loadu_ps(kp.add(i * BLOCK + LANES));
            let q = qp.add(h0 * d + i * G);
            for j in 0..G {
                let qv = _mm512_set1_ps(*q.add(j));
                a[j][0] = _mm512_fmadd_ps(qv, k0, a[j][0]);
                a[j][1] = _mm512_fmadd_ps(qv, k1, a[j][1]);
            }
        }
    }
    for i in d..pf.len().div_ceil(64) {
        prefetch_line(pf, i);
    }
    let zero = _mm512_setzero_ps();
    let ap = acc.as_mut_ptr();
    // SAFETY: `acc` holds `BLOCK = 2 × 16` floats.
    let mut s = unsafe { [_mm512_loadu_ps(ap), _mm512_loadu_ps(ap.add(LANES))] };
    for j in 0..G {
        let wv = _mm512_set1_ps(w[h0 + j]);
        for p in 0..2 {
            // relu: `x <= 0 ? 0 : x` (NaN is not `<= 0`: kept); with no
            // activation the dot product as it is.
            let x = a[j][p];
            let x = match RELU {
                true => _mm512_mask_mov_ps(x, _mm512_cmp_ps_mask::<_CMP_LE_OQ>(x, zero), zero),
                false => x,
            };
            s[p] = _mm512_fmadd_ps(wv, x, s[p]);
        }
    }
    // SAFETY: as above.
    unsafe {
        _mm512_storeu_ps(ap, s[0]);
        _mm512_storeu_ps(ap.add(LANES), s[1]);
    }
}
