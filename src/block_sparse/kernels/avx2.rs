//! The AVX2 + FMA kernel: 4 rows × up to 3 keys of dot products per
//! step, one `__m256` accumulator each, reduced in the canonical order.
//! Keys are read in their own format ([`Load`]): a bfloat16, float16 or
//! fp8 key is decoded exactly into the lanes the float32 kernel would have
//! loaded, so the arithmetic, and every block max, is the same. The walk
//! over a segment is shared with the AVX-512 kernel and the bfloat16 pair
//! step, which only replace the [`Step`] over whole runs of keys (the
//! pair step from its own packed copy of the keys: `pairs.rs`); the walk
//! also takes each block's
//! key magnitude when the tile reports it ([`super::TileOut`]), a step's
//! keys right after the step, while they are in L1 (a max over their
//! codes: the same value however the keys are split, so the AVX-512
//! step's six keys give what three do).
use super::{exact, Pieces, Segment, TileOut, MR};
use crate::keys::lanes::{Bf16, Fp8, Fp8Scaled, Fp8ScaledFinite, Load, F16, F32 as L32};
use crate::keys::Encoded;
use crate::simd::x86::reduce4;
use crate::simd::Avx2;
use std::arch::x86_64::*;

/// Dot products of the 4 rows at `q` (stride `dp`) with the `NR` keys
/// at `k` (stride `d`), each as `[r0, r2, r1, r3]`.
///
/// # Safety
/// `q` must be readable for `4 * dp` floats with `dp >= d` rounded up
/// to 8, and `k` for `NR * d` elements.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dots<L: Load, const NR: usize>(
    q: *const f32,
    dp: usize,
    k: *const L::E,
    d: usize,
) -> [__m128; NR] {
    let mut acc = [[_mm256_setzero_ps(); NR]; MR];
    let full = d / 8;
    for c in 0..full {
        let mut kv = [_mm256_setzero_ps(); NR];
        for (j, v) in kv.iter_mut().enumerate() {
            // SAFETY: key j's dims c*8 .. c*8+8 are within its d.
            *v = unsafe { L::load8(k.add(j * d + c * 8)) };
        }
        // SAFETY: row r's dims c*8 .. c*8+8 are within dp.
        unsafe { fma_chunk(&mut acc, q, dp, c, &kv) };
    }
    if !d.is_multiple_of(8) {
        let c = full;
        let mut kv = [_mm256_setzero_ps(); NR];
        for (j, v) in kv.iter_mut().enumerate() {
            // SAFETY: only dims c*8 .. d of key j are read.
            *v = unsafe { L::load_tail(k.add(j * d + c * 8), d % 8) };
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
#[target_feature(enable = "avx2,fma,f16c")]
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
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dots_upto3<L: Load>(
    q: *const f32,
    dp: usize,
    k: *const L::E,
    d: usize,
    n: usize,
) -> [__m128; 3] {
    let neg_inf = _mm_set1_ps(f32::NEG_INFINITY);
    // SAFETY: the contract, for the `n` keys read.
    unsafe {
        match n {
            3 => dots::<L, 3>(q, dp, k, d),
            2 => {
                let [a, b] = dots::<L, 2>(q, dp, k, d);
                [a, b, neg_inf]
            }
            _ => {
                let [a] = dots::<L, 1>(q, dp, k, d);
                [a, neg_inf, neg_inf]
            }
        }
    }
}

/// A run of [`Step::KEYS`] consecutive keys scored against the tile and
/// folded into the running max `m` (lanes `[r0, r2, r1, r3]`): the one
/// thing the AVX-512 kernel and the pair step do differently.
pub(super) trait Step: Copy {
    const KEYS: usize;
    /// Whether fp8 keys are read as `2⁻⁸ ×` their values against a query
    /// that carries the `2⁸` ([`Fp8Scaled`]: one multiply per key fewer).
    const FOLDS_FP8_SCALE: bool = false;
    /// # Safety
    /// `q` readable for `4 * dp` floats (`dp >= d` rounded up to 8,
    /// zero-padded), `k` for `KEYS * d` elements; AVX2, FMA, F16C.
    unsafe fn fold<L: Load>(
        self,
        q: *const f32,
        dp: usize,
        k: *const L::E,
        d: usize,
        m: __m128,
    ) -> __m128;
}

/// Three keys per step, one `__m256` accumulator per (row, key).
#[derive(Clone, Copy)]
pub(super) struct Step3;

impl Step for Step3 {
    const KEYS: usize = 3;
    const FOLDS_FP8_SCALE: bool = true;
    #[inline(always)]
    unsafe fn fold<L: Load>(
        self,
        q: *const f32,
        dp: usize,
        k: *const L::E,
        d: usize,
        m: __m128,
    ) -> __m128 {
        // SAFETY: the contract.
        let s = unsafe { dots::<L, 3>(q, dp, k, d) };
        // SAFETY: SSE, which x86-64 always has.
        unsafe { _mm_max_ps(s[2], _mm_max_ps(s[1], _mm_max_ps(s[0], m))) }
    }
}

/// Lanes `[r0, r2, r1, r3]` back in row order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn unpermute(m: __m128) -> [f32; MR] {
    let mut a = [0.0f32; 4];
    // SAFETY: `a` holds 4 floats.
    unsafe { _mm_storeu_ps(a.as_mut_ptr(), m) };
    [a[0], a[2], a[1], a[3]]
}

/// # Safety
/// `_token` proves AVX2, FMA and F16C; every bound the pointer reads rely
/// on is asserted in [`segment_typed`] (a violated one panics, in release
/// builds too).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn segment<S: Step>(_token: Avx2, step: S, seg: &Segment<'_>, out: TileOut<'_>) {
    // fp8 keys against a query carrying their format's 2⁸ (exact; `None`
    // when an element would overflow, or for a step that does not fold).
    let folded = seg.q_fp8_folded.filter(|_| S::FOLDS_FP8_SCALE);
    let q = seg.q;
    // SAFETY: the token (above) for each format's kernel.
    unsafe {
        match (seg.keys, folded) {
            (Encoded::F32(k), _) => segment_typed::<L32, L32, S>(step, seg, q, k, None, out),
            (Encoded::Bf16(k), _) => segment_typed::<Bf16, Bf16, S>(step, seg, q, k, None, out),
            (Encoded::F16(k), _) => segment_typed::<F16, F16, S>(step, seg, q, k, None, out),
            // fp8: every piece is read with the three-operation decode,
            // then its bytes (now in cache) are checked for a NaN byte, and
            // a piece that has one is read again with the exact decode —
            // no pass over the keys before the kernel (that pass waited on
            // memory alone, with nothing to overlap it).
            (Encoded::Fp8E4m3(k), Some(fq)) => {
                let nan = |from: usize, to: usize| crate::keys::fp8_has_nan(&k[from..to]);
                segment_typed::<Fp8ScaledFinite, Fp8Scaled, S>(step, seg, fq, k, Some(&nan), out)
            }
            // (A query that would overflow × 2⁸: the exact decode.)
            (Encoded::Fp8E4m3(k), None) => segment_typed::<Fp8, Fp8, S>(step, seg, q, k, None, out),
        }
    }
}

/// [`segment`] on float32 keys, for a caller compiled with more features
/// than AVX2's (the pair step's walk: its step inlines into the walk only
/// where the walk has the step's features too).
///
/// # Safety
/// AVX2, FMA and F16C must be available; as [`segment`] otherwise.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn segment_f32<S: Step>(
    step: S,
    seg: &Segment<'_>,
    keys: &[f32],
    out: TileOut<'_>,
) {
    // SAFETY: the features (the contract).
    unsafe { segment_typed::<L32, L32, S>(step, seg, seg.q, keys, None, out) }
}

/// Checks elements `from .. to` of a segment's keys (offsets into its
/// `keys`) for what the fast decode cannot read (an fp8 NaN byte).
type Recheck<'a> = Option<&'a dyn Fn(usize, usize) -> bool>;

/// [`segment`] on keys of one format (`keys` is `seg.keys`' elements)
/// against the tile's rows `q` (`seg.q`, or it folded for the format): each
/// piece read with `L`, and — when `recheck` says the piece holds what `L`
/// cannot read — read again with `Lx` from the running max before it.
///
/// # Safety
/// AVX2, FMA and F16C must be available.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn segment_typed<L: Load, Lx: Load<E = L::E>, S: Step>(
    step: S,
    seg: &Segment<'_>,
    q: &[f32],
    keys: &[L::E],
    recheck: Recheck<'_>,
    mut out: TileOut<'_>,
) {
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
                .is_some_and(|n| n.saturating_mul(d) <= keys.len())
            && q.len() >= MR * dp
            && dp >= d.div_ceil(8) * 8,
        "block_sparse kernel called out of bounds"
    );
    let neg_inf = _mm_set1_ps(f32::NEG_INFINITY);
    let (mags, format) = (out.mag_at.is_some(), seg.keys.format());
    let mut cur_block = usize::MAX;
    let mut m = neg_inf;
    for piece in Pieces::new(seg) {
        if piece.block != cur_block {
            if cur_block != usize::MAX {
                out.flush(cur_block - seg.b0, unpermute(m));
            }
            cur_block = piece.block;
            m = neg_inf;
        }
        let before = m;
        // SAFETY: the bounds asserted above; the token's features.
        let (folded, code) =
            unsafe { fold_piece::<L, S>(step, seg, q, keys, &piece, before, mags) };
        m = folded;
        let (from, to) = ((piece.from - seg.base) * d, (piece.to - seg.base) * d);
        if recheck.is_some_and(|nan| nan(from, to)) {
            // SAFETY: as above.
            m = unsafe { fold_piece::<Lx, S>(step, seg, q, keys, &piece, before, false) }.0;
        }
        if mags {
            out.flush_magnitude(piece.block - seg.b0, format, code);
        }
    }
    if cur_block != usize::MAX {
        out.flush(cur_block - seg.b0, unpermute(m));
    }
}

/// One piece of a segment folded into the running max `m`; with `mags`,
/// also the magnitude code of its keys ([`exact::code_max`], else 0),
/// taken a step's keys at a time right after the step reads them (from
/// L1: see [`super::TileOut`]).
///
/// # Safety
/// The bounds [`segment_typed`] asserts; AVX2, FMA and F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fold_piece<L: Load, S: Step>(
    step: S,
    seg: &Segment<'_>,
    q: &[f32],
    keys: &[L::E],
    piece: &super::Piece,
    mut m: __m128,
    mags: bool,
) -> (__m128, u32) {
    let d = seg.d;
    let dp = seg.dp;
    let q = q.as_ptr();
    // Key `p` is at `kbase + (p - base) * d`.
    let (kbase, base) = (keys.as_ptr(), seg.base);
    let (from, to) = (piece.from, piece.to);
    let mut code = 0u32;
    // Keys `a .. b`' magnitude code, into `code`: what the steps read.
    let mut take = |a: usize, b: usize| {
        if mags {
            code = code.max(exact::code_max(&seg.keys, (a - base) * d, (b - base) * d));
        }
    };
    if !piece.masked {
        let own = seg.keys.bytes(0, usize::MAX);
        let kb = d * std::mem::size_of::<L::E>();
        let mut p = from;
        while p + S::KEYS <= to {
            if let Some(stream) = &seg.stream {
                // The last whole step of the piece also issues the
                // prefetches of the keys read after it one or two at a time
                // (which issue none), so the lead does not lapse at each
                // block's end.
                let n = if p + 2 * S::KEYS > to {
                    to - p
                } else {
                    S::KEYS
                };
                stream.fetch_ahead(seg, own, kb, p, n);
            }
            // SAFETY: keys p..p+KEYS exist ((end - base) * d <= keys.len(), p >= base).
            m = unsafe { step.fold::<L>(q, dp, kbase.add((p - base) * d), d, m) };
            take(p, p + S::KEYS);
            p += S::KEYS;
        }
        take(p, to);
        while p < to {
            let n = (to - p).min(3);
            // SAFETY: as above, for the last keys, at most 3 at a time.
            let s = unsafe { dots_upto3::<L>(q, dp, kbase.add((p - base) * d), d, n) };
            for &sj in &s[..n] {
                m = _mm_max_ps(sj, m);
            }
            p += n;
        }
    } else {
        take(from, to);
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
            let s = unsafe { dots_upto3::<L>(q, dp, kbase.add((p - base) * d), d, n) };
            for (j, sj) in s.into_iter().enumerate().take(n) {
                let rel_p = (p + j - from).min(i32::MAX as usize) as i32;
                let keep = _mm_castsi128_ps(_mm_cmpgt_epi32(vis, _mm_set1_epi32(rel_p)));
                // max(s, m) where kept; m (unchanged) elsewhere.
                m = _mm_blendv_ps(m, _mm_max_ps(sj, m), keep);
            }
            p += n;
        }
    }
    (m, code)
}
