//! The AVX2 + FMA kernel: 4 rows × up to 3 keys of dot products per
//! step, one `__m256` accumulator each, reduced in the canonical order.
use super::{Pieces, Segment, TileOut, MR, PREFETCH_KEYS};
use crate::simd::x86::reduce4;
use crate::simd::Avx2;
use std::arch::x86_64::*;

/// Dot products of the 4 rows at `q` (stride `dp`) with the `NR` keys
/// at `k` (stride `d`), each as `[r0, r2, r1, r3]`.
///
/// # Safety
/// `q` must be readable for `4 * dp` floats with `dp >= d` rounded up
/// to 8, and `k` for `NR * d` floats.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn dots<const NR: usize>(
    q: *const f32,
    dp: usize,
    k: *const f32,
    d: usize,
    tail: __m256i,
) -> [__m128; NR] {
    let mut acc = [[_mm256_setzero_ps(); NR]; MR];
    let full = d / 8;
    for c in 0..full {
        let mut kv = [_mm256_setzero_ps(); NR];
        for (j, v) in kv.iter_mut().enumerate() {
            // SAFETY: key j's dims c*8 .. c*8+8 are within its d.
            *v = unsafe { _mm256_loadu_ps(k.add(j * d + c * 8)) };
        }
        // SAFETY: row r's dims c*8 .. c*8+8 are within dp.
        unsafe { fma_chunk(&mut acc, q, dp, c, &kv) };
    }
    if !d.is_multiple_of(8) {
        let c = full;
        let mut kv = [_mm256_setzero_ps(); NR];
        for (j, v) in kv.iter_mut().enumerate() {
            // SAFETY: the mask reads only dims c*8 .. d of key j.
            *v = unsafe { _mm256_maskload_ps(k.add(j * d + c * 8), tail) };
        }
        // SAFETY: dp is d rounded up to 8, zero-padded.
        unsafe { fma_chunk(&mut acc, q, dp, c, &kv) };
    }
    let mut outv = [_mm_setzero_ps(); NR];
    for (j, o) in outv.iter_mut().enumerate() {
        *o = reduce4(acc[0][j], acc[1][j], acc[2][j], acc[3][j]);
    }
    outv
}

/// `acc[r][j] = fma(q_r[8c..8c+8], kv[j], acc[r][j])` for the 4 rows at
/// `q` (stride `dp`): one 8-dimension step of [`dots`].
///
/// # Safety
/// `q` must be readable for `3 * dp + 8 * c + 8` floats.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn fma_chunk<const NR: usize>(
    acc: &mut [[__m256; NR]; MR],
    q: *const f32,
    dp: usize,
    c: usize,
    kv: &[__m256; NR],
) {
    for (r, accr) in acc.iter_mut().enumerate() {
        // SAFETY: row r's dims c*8 .. c*8+8 are readable (the contract).
        let qv = unsafe { _mm256_loadu_ps(q.add(r * dp + c * 8)) };
        for j in 0..NR {
            accr[j] = _mm256_fmadd_ps(qv, kv[j], accr[j]);
        }
    }
}

/// [`dots`] of `n` (1 to 3) keys, as three; the lanes of keys past `n` are
/// `-inf`.
///
/// # Safety
/// As [`dots`], for `n` keys.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn dots_upto3(
    q: *const f32,
    dp: usize,
    k: *const f32,
    d: usize,
    tail: __m256i,
    n: usize,
) -> [__m128; 3] {
    let neg_inf = _mm_set1_ps(f32::NEG_INFINITY);
    // SAFETY: the contract, for the `n` keys read.
    unsafe {
        match n {
            3 => dots::<3>(q, dp, k, d, tail),
            2 => {
                let [a, b] = dots::<2>(q, dp, k, d, tail);
                [a, b, neg_inf]
            }
            _ => {
                let [a] = dots::<1>(q, dp, k, d, tail);
                [a, neg_inf, neg_inf]
            }
        }
    }
}

/// Lanes `[r0, r2, r1, r3]` back in row order.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn unpermute(m: __m128) -> [f32; MR] {
    let mut a = [0.0f32; 4];
    // SAFETY: `a` holds 4 floats.
    unsafe { _mm_storeu_ps(a.as_mut_ptr(), m) };
    [a[0], a[2], a[1], a[3]]
}

/// # Safety
/// `_token` proves AVX2+FMA; every bound the pointer reads rely on is
/// asserted here (a violated one panics, in release builds too).
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn segment(_token: Avx2, seg: &Segment<'_>, mut out: TileOut<'_>) {
    let d = seg.d;
    let dp = seg.dp;
    // Every key this segment reads must exist, and q must hold 4 rows.
    // The engine guarantees both; checked once per segment so that the
    // pointer reads stay sound even if it did not, and so that a broken
    // guarantee fails loudly rather than giving a quiet wrong answer.
    assert!(
        seg.start >= seg.base
            && seg
                .end
                .checked_sub(seg.base)
                .is_some_and(|n| n.saturating_mul(d) <= seg.keys.len())
            && seg.q.len() >= MR * dp
            && dp >= d.div_ceil(8) * 8,
        "block_sparse kernel called out of bounds"
    );
    let rem = (d % 8) as i32;
    let tail = _mm256_setr_epi32(
        -((rem > 0) as i32),
        -((rem > 1) as i32),
        -((rem > 2) as i32),
        -((rem > 3) as i32),
        -((rem > 4) as i32),
        -((rem > 5) as i32),
        -((rem > 6) as i32),
        -((rem > 7) as i32),
    );
    let q = seg.q.as_ptr();
    // Key `p` is at `kbase + (p - base) * d`.
    let (kbase, base) = (seg.keys.as_ptr(), seg.base);
    let neg_inf = _mm_set1_ps(f32::NEG_INFINITY);
    let mut cur_block = usize::MAX;
    let mut m = neg_inf;
    let pf_dist = if seg.prefetch { PREFETCH_KEYS } else { 0 };
    for piece in Pieces::new(seg) {
        if piece.block != cur_block {
            if cur_block != usize::MAX {
                out.flush(cur_block - seg.b0, unpermute(m));
            }
            cur_block = piece.block;
            m = neg_inf;
        }
        let (from, to) = (piece.from, piece.to);
        if !piece.masked {
            let mut p = from;
            while p + 3 <= to {
                if pf_dist > 0 {
                    // A hint only: never dereferenced, so an address past
                    // the keys is harmless (hence wrapping arithmetic).
                    let ahead = kbase.wrapping_add((p - base + pf_dist) * d) as *const i8;
                    let mut off = 0;
                    while off < 3 * d * 4 {
                        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(off));
                        off += 64;
                    }
                }
                // SAFETY: keys p..p+3 exist ((end - base) * d <= keys.len(), p >= base).
                let s = unsafe { dots::<3>(q, dp, kbase.add((p - base) * d), d, tail) };
                m = _mm_max_ps(s[0], m);
                m = _mm_max_ps(s[1], m);
                m = _mm_max_ps(s[2], m);
                p += 3;
            }
            if p < to {
                let n = to - p;
                // SAFETY: as above, for the last `n < 3` keys.
                let s = unsafe { dots_upto3(q, dp, kbase.add((p - base) * d), d, tail, n) };
                for &sj in &s[..n] {
                    m = _mm_max_ps(sj, m);
                }
            }
        } else {
            // Lane i keeps key p iff p < vis of row [0, 2, 1, 3][i],
            // compared relative to `from` so it fits an i32.
            let rel = |v: usize| v.saturating_sub(from).min(i32::MAX as usize) as i32;
            let vis = _mm_setr_epi32(
                rel(seg.vis[0]),
                rel(seg.vis[2]),
                rel(seg.vis[1]),
                rel(seg.vis[3]),
            );
            let mut p = from;
            while p < to {
                let n = (to - p).min(3);
                // SAFETY: as above, for keys p..p+n.
                let s = unsafe { dots_upto3(q, dp, kbase.add((p - base) * d), d, tail, n) };
                for (j, sj) in s.into_iter().enumerate().take(n) {
                    let rel_p = (p + j - from).min(i32::MAX as usize) as i32;
                    let keep = _mm_castsi128_ps(_mm_cmpgt_epi32(vis, _mm_set1_epi32(rel_p)));
                    // max(s, m) where kept; m (unchanged) elsewhere.
                    m = _mm_blendv_ps(m, _mm_max_ps(sj, m), keep);
                }
                p += n;
            }
        }
    }
    if cur_block != usize::MAX {
        out.flush(cur_block - seg.b0, unpermute(m));
    }
}
