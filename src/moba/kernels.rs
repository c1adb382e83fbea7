//! MoBA's four kernel families. `portable` is each one's definition; the AVX2
//! kernels are the same arithmetic, so both give the same bits (a NaN gate's
//! sign and payload aside: x86 makes its default NaN negative, and no
//! selection reads either — every NaN ranks last). At the AVX-512 level
//! `moba.lanes` has its own kernel (below); the other families run their
//! AVX2 ones there.
//!
//! - `moba.gates`: query rows against block means, each gate the 8-lane
//!   fused sum of the module docs (lane `l` accumulates dimensions `l, l +
//!   8, …` by `fma`, the lanes added `((l0 + l4) + (l2 + l6)) + ((l1 + l5) +
//!   (l3 + l7))`). The AVX2 kernel keeps each lane a vector lane, tiled two
//!   rows by four blocks (the tiling changes which gates are computed
//!   together, never the operations of one gate); a full tile's eight
//!   accumulators are reduced together by a transpose whose additions are
//!   the same pairs in the same order (`lo + hi` halves give `l0 + l4, l1 +
//!   l5, l2 + l6, l3 + l7`; a lane swap puts `l2 + l6` beside `l0 + l4`;
//!   two horizontal adds finish the tree).
//! - `moba.lanes`: eight query rows against block means with the rows in the
//!   lanes, block after block (`out[b · 8 + l]`), each gate the same 8-lane
//!   fused sum, so the same bits as `moba.gates`. The AVX2 kernel tiles four
//!   rows by three means (twelve independent accumulators: the chains hide
//!   the FMA's latency with room, and twelve plus three means plus a row
//!   fill the sixteen registers), the two row halves' accumulators of one
//!   mean then reduced together by `reduce8` (gate `j` from accumulator `j`:
//!   the eight rows in the lanes); a pair of means left over is tiled 4 × 2,
//!   a single one 8 × 1. A prefill's rows stream through it once while the
//!   means stay in the L1 cache. The AVX-512 kernel holds two means a
//!   vector, each 256-bit half one mean's eight lanes (the row's eight
//!   dimensions broadcast to both halves): eight rows by three pairs, the
//!   pairs reduced by the same tree half by half (`reduce16`), so each
//!   gate's operations are the AVX2 kernel's, operand for operand.
//! - `moba.top`: the best `n ≤ TOP_MAX` blocks of each lane of `moba.lanes`'
//!   output by the module's total order, ascending. Each gate becomes an
//!   `i32` key that orders as the gate does (`g + 0.0`'s bits, the negative
//!   ones' magnitude bits flipped; NaN the least key but one), and the
//!   blocks are visited ascending into `n` slots kept sorted, a block
//!   entering only above a strictly smaller key: of equal gates the lower
//!   block stays ahead, the order of [`super::rank`]. The AVX2 kernel keeps
//!   the slots of all eight lanes in registers (compare, blend), no branch
//!   on the data.
//! - `moba.sums`: rows added into a running sum element by element, row
//!   after row (the block sum in token order); the AVX2 kernel adds each
//!   row whole, in memory order, before the next (one stream; the sum
//!   stays in the L1), so each element's additions are in row order.

use crate::keys::Encoded;
use crate::simd::{dispatch, Isa};

/// `out[r · n + b] = q_r · m_b` for the query rows `q_r = q[rows[r] ..
/// rows[r] + d8]` and the `n = means.len() / d8` means, all zero padded to
/// `d8` (a multiple of 8).
///
/// # Panics
/// If the lengths disagree or a row runs past `q` (callers size them from
/// one shape).
pub(super) fn gates(
    isa: Isa,
    q: &[f32],
    rows: &[usize],
    means: &[f32],
    d8: usize,
    out: &mut [f32],
) {
    assert!(d8 > 0 && d8.is_multiple_of(8));
    assert!(means.len().is_multiple_of(d8));
    assert!(rows.iter().all(|&r| r <= q.len() && q.len() - r >= d8));
    assert_eq!(out.len(), rows.len() * (means.len() / d8));
    // SAFETY (bounds): every row and mean is d8 floats within its slice and
    // `out` one gate per pair (asserted above); the kernels slice them.
    dispatch!("moba.gates", isa, {
        avx512 => avx2,
        avx2(t) => avx2::gates(t, q, rows, means, d8, out),
        scalar => portable::gates(q, rows, means, d8, out),
    })
}

/// `out[b · 8 + l] = q_l · m_b` for the eight query rows `q_l = q[rows[l] ..
/// rows[l] + d8]` and the `n = means.len() / d8` means, all zero padded to
/// `d8` (a multiple of 8): [`gates`]' values, the rows in the lanes.
///
/// # Panics
/// If the lengths disagree or a row runs past `q`.
pub(super) fn lanes(
    isa: Isa,
    q: &[f32],
    rows: &[usize; 8],
    means: &[f32],
    d8: usize,
    out: &mut [f32],
) {
    assert!(d8 > 0 && d8.is_multiple_of(8));
    assert!(means.len().is_multiple_of(d8));
    assert!(rows.iter().all(|&r| r <= q.len() && q.len() - r >= d8));
    assert_eq!(out.len(), 8 * (means.len() / d8));
    // SAFETY (bounds): every row and mean is d8 floats within its slice and
    // `out` eight gates per mean (asserted above); the kernels slice them.
    dispatch!("moba.lanes", isa, {
        avx512(t) => avx512::lanes(t, q, rows, means, d8, out),
        avx2(t) => avx2::lanes(t, q, rows, means, d8, out),
        scalar => portable::lanes(q, rows, means, d8, out),
    })
}

/// Asks the L2 cache for the lines of `q`'s first `n` floats (clipped to
/// `q`) ahead of their use: a hint, no effect on any value (a prefill's
/// queries a few groups on).
pub(super) fn prefetch(q: &[f32], n: usize) {
    #[cfg(target_arch = "x86_64")]
    crate::keys::prefetch(
        bytemuck::cast_slice(q),
        0,
        4 * n,
        crate::keys::CacheLevel::L2,
    );
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (q, n);
}

/// The most slots [`top`] keeps.
pub(super) const TOP_MAX: usize = 8;

/// For each lane `l` of `gates` (`gates[b · 8 + l]`, the gate of block `b`,
/// `n_blocks = gates.len() / 8`), its best `n` blocks by [`super::rank`],
/// ascending: `ids[s · 8 + l]`, `s < n`. Needs `n < n_blocks` (every slot
/// filled) and `1 ≤ n ≤ TOP_MAX`.
///
/// # Panics
/// If `n` is out of those bounds or `ids` is not `8 · n` long.
pub(super) fn top(isa: Isa, gates: &[f32], n: usize, ids: &mut [i32]) {
    assert!((1..=TOP_MAX).contains(&n));
    assert!(gates.len().is_multiple_of(8) && gates.len() / 8 > n);
    assert!(gates.len() / 8 <= i32::MAX as usize);
    assert_eq!(ids.len(), 8 * n);
    // SAFETY (bounds): `gates` is whole rows of 8 and `ids` `n` rows of 8
    // (asserted above); the kernels slice them.
    dispatch!("moba.top", isa, {
        avx512 => avx2,
        avx2(t) => match n {
            1 => avx2::top::<1>(t, gates, ids),
            2 => avx2::top::<2>(t, gates, ids),
            3 => avx2::top::<3>(t, gates, ids),
            4 => avx2::top::<4>(t, gates, ids),
            5 => avx2::top::<5>(t, gates, ids),
            6 => avx2::top::<6>(t, gates, ids),
            7 => avx2::top::<7>(t, gates, ids),
            _ => avx2::top::<8>(t, gates, ids),
        },
        scalar => portable::top(gates, n, ids),
    })
}

/// A gate as an `i32` that orders as [`super::rank`] orders gates, the
/// greater first: `-0.0` as `+0.0` (`g + 0.0`), a negative gate's magnitude
/// bits flipped (the more negative, the smaller), NaN `i32::MIN + 1`, below
/// `-inf`'s key and above the empty slot's `i32::MIN`.
#[inline(always)]
fn key(g: f32) -> i32 {
    let v = g + 0.0;
    if v.is_nan() {
        return i32::MIN + 1;
    }
    let bits = v.to_bits() as i32;
    bits ^ ((bits >> 31) & i32::MAX)
}

/// `acc[e] += rows[r · n + e]` for every row `r` in order (`n = acc.len()`),
/// one float32 addition each of the decoded value: `rows` is float32,
/// bfloat16 or float16 (decoded exactly), not fp8 (callers decode and scale
/// it first).
///
/// # Panics
/// If `rows` is not whole rows of `acc.len()`, or is fp8.
pub(super) fn sums(isa: Isa, acc: &mut [f32], rows: Encoded<'_>) {
    assert!(acc.is_empty() || rows.len().is_multiple_of(acc.len()));
    assert!(
        !matches!(rows, Encoded::Fp8E4m3(_)),
        "fp8 rows are decoded first"
    );
    if acc.is_empty() {
        return;
    }
    // SAFETY (bounds): `rows` is whole rows of `acc.len()` (asserted above);
    // the kernels read and write within the slices they are handed.
    dispatch!("moba.sums", isa, {
        avx512 => avx2,
        avx2(t) => match rows {
            Encoded::F32(r) => avx2::sums::<0>(t, acc, r, &[]),
            Encoded::Bf16(r) => avx2::sums::<1>(t, acc, &[], r),
            Encoded::F16(r) => avx2::sums::<2>(t, acc, &[], r),
            Encoded::Fp8E4m3(_) => unreachable!("refused above"),
        },
        scalar => portable::sums(acc, rows),
    })
}

/// The lanes summed in the module's order.
#[inline(always)]
fn reduce(l: [f32; 8]) -> f32 {
    ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))
}

mod portable {
    use crate::keys::Encoded;

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

    pub(super) fn gates(q: &[f32], rows: &[usize], means: &[f32], d8: usize, out: &mut [f32]) {
        let n = means.len() / d8;
        for (r, &off) in rows.iter().enumerate() {
            let qr = &q[off..][..d8];
            for (b, m) in means.chunks_exact(d8).enumerate() {
                out[r * n + b] = dot(qr, m);
            }
        }
    }

    pub(super) fn lanes(q: &[f32], rows: &[usize; 8], means: &[f32], d8: usize, out: &mut [f32]) {
        for (m, o) in means.chunks_exact(d8).zip(out.chunks_exact_mut(8)) {
            for (g, &off) in o.iter_mut().zip(rows) {
                *g = dot(&q[off..][..d8], m);
            }
        }
    }

    /// Each lane's blocks visited ascending into `n` slots kept sorted by
    /// key (the greatest first), a block entering above the first strictly
    /// smaller key; then the slots' ids sorted ascending.
    pub(super) fn top(gates: &[f32], n: usize, ids: &mut [i32]) {
        for l in 0..8 {
            let mut best = [i32::MIN; super::TOP_MAX];
            let mut id = [-1i32; super::TOP_MAX];
            for (b, g) in gates.chunks_exact(8).enumerate() {
                let k = super::key(g[l]);
                let Some(s) = (0..n).find(|&s| k > best[s]) else {
                    continue;
                };
                best.copy_within(s..n - 1, s + 1);
                id.copy_within(s..n - 1, s + 1);
                best[s] = k;
                id[s] = b as i32;
            }
            id[..n].sort_unstable();
            for (s, &v) in id[..n].iter().enumerate() {
                ids[s * 8 + l] = v;
            }
        }
    }

    pub(super) fn sums(acc: &mut [f32], rows: Encoded<'_>) {
        let n = acc.len();
        for r in 0..rows.len() / n {
            for (e, a) in acc.iter_mut().enumerate() {
                *a += value(rows, r * n + e);
            }
        }
    }

    /// Element `i` of float32, bfloat16 or float16 rows, decoded.
    pub(super) fn value(rows: Encoded<'_>, i: usize) -> f32 {
        match rows {
            Encoded::F32(r) => r[i],
            Encoded::Bf16(r) => crate::keys::bf16_to_f32(r[i]),
            Encoded::F16(r) => crate::keys::f16_to_f32(r[i]),
            Encoded::Fp8E4m3(r) => crate::keys::fp8_e4m3fn_to_f32(r[i]),
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use crate::keys::Encoded;
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

    /// `R` rows against `B` means at once: [`raw`]'s `R × B` accumulators,
    /// each reduced by `hsum` (`out[r][b]`, the gate of row `r` and mean `b`).
    ///
    /// # Safety
    /// `q[r]` and `m[b]` each hold `d8` floats (a multiple of 8).
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile<const R: usize, const B: usize>(
        q: [*const f32; R],
        m: [*const f32; B],
        d8: usize,
    ) -> [[f32; B]; R] {
        // SAFETY: the caller's contract is raw's.
        let acc = unsafe { raw::<R, B>(q, m, d8) };
        std::array::from_fn(|r| std::array::from_fn(|b| hsum(acc[b][r])))
    }

    /// Two rows against four means, the eight gates reduced together:
    /// `[q0·m0, q0·m1, q0·m2, q0·m3, q1·m0, …, q1·m3]`, each the lanes'
    /// `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))`.
    ///
    /// # Safety
    /// `q[r]` and `m[b]` each hold `d8` floats (a multiple of 8).
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile_2x4(q: [*const f32; 2], m: [*const f32; 4], d8: usize) -> [f32; 8] {
        let mut acc = [[_mm256_setzero_ps(); 4]; 2];
        let mut i = 0;
        while i < d8 {
            // SAFETY: i + 8 <= d8, within each row's and mean's d8 floats.
            let mv: [__m256; 4] = std::array::from_fn(|b| unsafe { _mm256_loadu_ps(m[b].add(i)) });
            for r in 0..2 {
                // SAFETY: as above, within q[r].
                let qv = unsafe { _mm256_loadu_ps(q[r].add(i)) };
                for b in 0..4 {
                    acc[r][b] = _mm256_fmadd_ps(qv, mv[b], acc[r][b]);
                }
            }
            i += 8;
        }
        reduce8([
            acc[0][0], acc[0][1], acc[0][2], acc[0][3], acc[1][0], acc[1][1], acc[1][2], acc[1][3],
        ])
    }

    /// Eight rows against one mean: `[q0·m, …, q7·m]`.
    ///
    /// # Safety
    /// `q[r]` and `m` each hold `d8` floats (a multiple of 8).
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile_8x1(q: [*const f32; 8], m: *const f32, d8: usize) -> [f32; 8] {
        let mut acc = [_mm256_setzero_ps(); 8];
        let mut i = 0;
        while i < d8 {
            // SAFETY: i + 8 <= d8, within the mean's and each row's d8 floats.
            let mv = unsafe { _mm256_loadu_ps(m.add(i)) };
            for r in 0..8 {
                // SAFETY: as above.
                let qv = unsafe { _mm256_loadu_ps(q[r].add(i)) };
                acc[r] = _mm256_fmadd_ps(qv, mv, acc[r]);
            }
            i += 8;
        }
        reduce8(acc)
    }

    /// Eight gates' lanes reduced together, gate `j` from `a[j]`: each the
    /// lanes' `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))`.
    #[target_feature(enable = "avx2,fma")]
    fn reduce8(a: [__m256; 8]) -> [f32; 8] {
        let mut out = [0.0f32; 8];
        // SAFETY: `out` holds 8 floats.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), reduce8v(a)) };
        out
    }

    /// [`reduce8`]'s gates as one vector, gate `j` in lane `j`.
    #[target_feature(enable = "avx2,fma")]
    fn reduce8v(a: [__m256; 8]) -> __m256 {
        // x(a) = lo(a) + hi(a) is [l0 + l4, l1 + l5, l2 + l6, l3 + l7];
        // s[j] holds x(a[j]) | x(a[j + 4]), its halves' lanes reordered to
        // [x0, x2, x1, x3]: the pairs the tree adds next.
        let s: [__m256; 4] = std::array::from_fn(|j| {
            let lo = _mm256_permute2f128_ps::<0x20>(a[j], a[j + 4]);
            let hi = _mm256_permute2f128_ps::<0x31>(a[j], a[j + 4]);
            _mm256_permute_ps::<0b11_01_10_00>(_mm256_add_ps(lo, hi))
        });
        // hadd: [x0 + x2, x1 + x3] of a[j], a[j + 1]; then their sum.
        let h01 = _mm256_hadd_ps(s[0], s[1]);
        let h23 = _mm256_hadd_ps(s[2], s[3]);
        _mm256_hadd_ps(h01, h23)
    }

    /// `R` rows against `B` means, the `R × B` accumulators unreduced
    /// (`[b][r]`): each one gate's lanes, updated as the portable `dot`.
    ///
    /// # Safety
    /// `q[r]` and `m[b]` each hold `d8` floats (a multiple of 8).
    #[target_feature(enable = "avx2,fma")]
    unsafe fn raw<const R: usize, const B: usize>(
        q: [*const f32; R],
        m: [*const f32; B],
        d8: usize,
    ) -> [[__m256; R]; B] {
        let mut acc = [[_mm256_setzero_ps(); R]; B];
        let mut i = 0;
        while i < d8 {
            // SAFETY: i + 8 <= d8, within each mean's d8 floats.
            let mv: [__m256; B] = std::array::from_fn(|b| unsafe { _mm256_loadu_ps(m[b].add(i)) });
            for r in 0..R {
                // SAFETY: as above, within q[r].
                let qv = unsafe { _mm256_loadu_ps(q[r].add(i)) };
                for b in 0..B {
                    acc[b][r] = _mm256_fmadd_ps(qv, mv[b], acc[b][r]);
                }
            }
            i += 8;
        }
        acc
    }

    /// The gates of rows 0-3 (`x`) and 4-7 (`y`) against `B` means,
    /// reduced mean by mean, the rows in the lanes, into `out[b · 8 ..]`.
    #[target_feature(enable = "avx2,fma")]
    fn lanes_out<const B: usize>(x: [[__m256; 4]; B], y: [[__m256; 4]; B], out: &mut [f32]) {
        for b in 0..B {
            let (xb, yb) = (x[b], y[b]);
            let g = reduce8v([xb[0], xb[1], xb[2], xb[3], yb[0], yb[1], yb[2], yb[3]]);
            let o = &mut out[b * 8..][..8];
            // SAFETY: `o` holds 8 floats.
            unsafe { _mm256_storeu_ps(o.as_mut_ptr(), g) };
        }
    }

    /// Eight rows' gates, the rows in the lanes, mean after mean: means
    /// three at a time as two 4 × 3 tiles (rows 0-3 and 4-7: twelve
    /// independent chains each), a pair left as two 4 × 2 tiles, a single
    /// mean 8 × 1.
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn lanes(
        _t: Avx2,
        q: &[f32],
        rows: &[usize; 8],
        means: &[f32],
        d8: usize,
        out: &mut [f32],
    ) {
        let n = means.len() / d8;
        let qp: [*const f32; 8] = std::array::from_fn(|l| q[rows[l]..][..d8].as_ptr());
        let (lo, hi) = ([qp[0], qp[1], qp[2], qp[3]], [qp[4], qp[5], qp[6], qp[7]]);
        let mp = |b: usize| means[b * d8..][..d8].as_ptr();
        let mut b = 0;
        while b + 3 <= n {
            let m = [mp(b), mp(b + 1), mp(b + 2)];
            // SAFETY: every pointer heads a d8-float slice (sliced above).
            let (x, y) = unsafe { (raw::<4, 3>(lo, m, d8), raw::<4, 3>(hi, m, d8)) };
            lanes_out(x, y, &mut out[b * 8..][..24]);
            b += 3;
        }
        if b + 2 <= n {
            let m = [mp(b), mp(b + 1)];
            // SAFETY: as above.
            let (x, y) = unsafe { (raw::<4, 2>(lo, m, d8), raw::<4, 2>(hi, m, d8)) };
            lanes_out(x, y, &mut out[b * 8..][..16]);
        } else if b < n {
            // SAFETY: as above.
            let g = unsafe { tile_8x1(qp, mp(b), d8) };
            out[b * 8..][..8].copy_from_slice(&g);
        }
    }

    /// Eight gates' keys ([`super::key`], lane by lane).
    #[target_feature(enable = "avx2")]
    fn keys(g: __m256) -> __m256i {
        let v = _mm256_add_ps(g, _mm256_setzero_ps());
        let bits = _mm256_castps_si256(v);
        let flip = _mm256_and_si256(_mm256_srai_epi32::<31>(bits), _mm256_set1_epi32(i32::MAX));
        let k = _mm256_xor_si256(bits, flip);
        let nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
        _mm256_blendv_epi8(k, _mm256_set1_epi32(i32::MIN + 1), nan)
    }

    /// [`super::portable::top`] for the eight lanes at once: the slots'
    /// keys and ids in registers, a block moving the slots below its place
    /// down one (compare, blend), then the ids sorted by `N` rounds of
    /// odd-even transposition.
    #[target_feature(enable = "avx2")]
    pub(super) fn top<const N: usize>(_t: Avx2, gates: &[f32], ids: &mut [i32]) {
        let mut best = [_mm256_set1_epi32(i32::MIN); N];
        let mut id = [_mm256_set1_epi32(-1); N];
        for (b, g) in gates.chunks_exact(8).enumerate() {
            // SAFETY: `g` holds 8 floats.
            let k = keys(unsafe { _mm256_loadu_ps(g.as_ptr()) });
            let bid = _mm256_set1_epi32(b as i32);
            // gt[s]: the block enters at or above slot s (the slots are
            // sorted, so gt[s - 1] implies gt[s]).
            let gt: [__m256i; N] = std::array::from_fn(|s| _mm256_cmpgt_epi32(k, best[s]));
            for s in (1..N).rev() {
                let kb = _mm256_blendv_epi8(k, best[s - 1], gt[s - 1]);
                let ib = _mm256_blendv_epi8(bid, id[s - 1], gt[s - 1]);
                best[s] = _mm256_blendv_epi8(best[s], kb, gt[s]);
                id[s] = _mm256_blendv_epi8(id[s], ib, gt[s]);
            }
            best[0] = _mm256_blendv_epi8(best[0], k, gt[0]);
            id[0] = _mm256_blendv_epi8(id[0], bid, gt[0]);
        }
        for round in 0..N {
            let mut s = round % 2;
            while s + 1 < N {
                let (lo, hi) = (
                    _mm256_min_epi32(id[s], id[s + 1]),
                    _mm256_max_epi32(id[s], id[s + 1]),
                );
                id[s] = lo;
                id[s + 1] = hi;
                s += 2;
            }
        }
        for (s, v) in id.iter().enumerate() {
            let o = &mut ids[s * 8..][..8];
            // SAFETY: `o` holds 8 i32s.
            unsafe { _mm256_storeu_si256(o.as_mut_ptr().cast(), *v) };
        }
    }

    /// Gates for the rows `r0 .. r0 + R` of `rows` (offsets into `q`)
    /// against `means` (a multiple of four of them), four a step; `out` has
    /// `n` gates a row.
    #[target_feature(enable = "avx2,fma")]
    fn rows<const R: usize>(
        q: &[f32],
        rows: &[usize],
        means: &[f32],
        n: usize,
        d8: usize,
        r0: usize,
        out: &mut [f32],
    ) {
        let n4 = means.len() / d8;
        let qp: [*const f32; R] = std::array::from_fn(|r| q[rows[r0 + r]..][..d8].as_ptr());
        let mut b = 0;
        while b + 4 <= n4 {
            let mp: [*const f32; 4] = std::array::from_fn(|j| means[(b + j) * d8..][..d8].as_ptr());
            if R == 2 {
                // SAFETY: every pointer heads a d8-float slice (sliced above).
                let g = unsafe { tile_2x4([qp[0], qp[R - 1]], mp, d8) };
                out[r0 * n + b..][..4].copy_from_slice(&g[..4]);
                out[(r0 + 1) * n + b..][..4].copy_from_slice(&g[4..]);
            } else {
                // SAFETY: as above.
                let g = unsafe { tile::<R, 4>(qp, mp, d8) };
                for r in 0..R {
                    out[(r0 + r) * n + b..][..4].copy_from_slice(&g[r]);
                }
            }
            b += 4;
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn gates(
        _t: Avx2,
        q: &[f32],
        rows: &[usize],
        means: &[f32],
        d8: usize,
        out: &mut [f32],
    ) {
        let (n_rows, n) = (rows.len(), means.len() / d8);
        // The means in fours: two rows at a time.
        let n4 = n / 4 * 4;
        let m4 = &means[..n4 * d8];
        let mut r = 0;
        while r + 2 <= n_rows {
            self::rows::<2>(q, rows, m4, n, d8, r, out);
            r += 2;
        }
        if r < n_rows {
            self::rows::<1>(q, rows, m4, n, d8, r, out);
        }
        // The other means one at a time: eight rows at a time.
        for b in n4..n {
            let m = means[b * d8..][..d8].as_ptr();
            let mut r = 0;
            while r + 8 <= n_rows {
                let qp: [*const f32; 8] = std::array::from_fn(|j| q[rows[r + j]..][..d8].as_ptr());
                // SAFETY: every pointer heads a d8-float slice (sliced above).
                let g = unsafe { tile_8x1(qp, m, d8) };
                for (j, gj) in g.iter().enumerate() {
                    out[(r + j) * n + b] = *gj;
                }
                r += 8;
            }
            while r < n_rows {
                let qp = [q[rows[r]..][..d8].as_ptr()];
                // SAFETY: as above.
                out[r * n + b] = unsafe { tile::<1, 1>(qp, [m], d8) }[0][0];
                r += 1;
            }
        }
    }

    /// Rows added into `acc` in order, each element's additions in row
    /// order (the portable kernel's bits), each row read in memory order:
    /// one stream. (Sixteen rows side by side with `acc` in registers are
    /// sixteen streams a row apart: on AMD Zen 5 a paged bfloat16 decode
    /// read its keys at half a copy's speed that way; docs/moba.md,
    /// "Speed".) `FMT` 0: float32 rows `rf`; 1: bfloat16 rows `rh`; 2:
    /// float16 rows `rh` (decoded exactly).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn sums<const FMT: u8>(_t: Avx2, acc: &mut [f32], rf: &[f32], rh: &[u16]) {
        let n = acc.len();
        let len = if FMT == 0 { rf.len() } else { rh.len() };
        let n_rows = len / n;
        // Eight elements of row `r` from element `e` (`e + 8 <= n`).
        let load = |r: usize, e: usize| -> __m256 {
            let at = r * n + e;
            if FMT == 0 {
                let x = &rf[at..at + 8];
                // SAFETY: `x` holds 8 floats.
                unsafe { _mm256_loadu_ps(x.as_ptr()) }
            } else {
                let x = &rh[at..at + 8];
                // SAFETY: `x` holds 8 u16s.
                unsafe {
                    if FMT == 1 {
                        crate::keys::x86::load8_bf16(x.as_ptr())
                    } else {
                        crate::keys::x86::load8_f16(x.as_ptr())
                    }
                }
            }
        };
        let rows = if FMT == 0 {
            Encoded::F32(rf)
        } else if FMT == 1 {
            Encoded::Bf16(rh)
        } else {
            Encoded::F16(rh)
        };
        // Row after row, each in memory order: one stream, which the
        // hardware prefetchers follow; `acc` stays in the L1 between rows.
        let body = n / 32 * 32;
        for r in 0..n_rows {
            let mut e = 0;
            while e < body {
                let a = &mut acc[e..e + 32];
                for j in 0..4 {
                    // SAFETY: `a` holds 32 floats.
                    unsafe {
                        let p = a.as_mut_ptr().add(8 * j);
                        _mm256_storeu_ps(p, _mm256_add_ps(_mm256_loadu_ps(p), load(r, e + 8 * j)));
                    }
                }
                e += 32;
            }
            for (x, a) in acc.iter_mut().enumerate().skip(body) {
                *a += super::portable::value(rows, r * n + x);
            }
        }
    }
}

/// `moba.lanes` in 512-bit registers: two means a vector, each half the
/// AVX2 kernel's eight lanes (`l`: dimensions `l, l + 8, …`), so every gate
/// keeps its own chain of fused multiply-adds and its own tree: the bits of
/// `moba.gates`.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop)] // indexed on purpose: the accumulators stay in registers
mod avx512 {
    use crate::simd::Avx512;
    use std::arch::x86_64::*;

    /// Eight rows against `2P` means from `m` (`2P` rows of `d8` floats):
    /// accumulator `[r][p]` holds row `r`'s eight lanes for mean `2p` in its
    /// low half and for mean `2p + 1` in its high half, each lane updated as
    /// the portable `dot` (the row's eight dimensions broadcast to both
    /// halves, the two means' side by side).
    ///
    /// # Safety
    /// `q[r]` and `m`'s `2P` rows each hold `d8` floats (a multiple of 8).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
    unsafe fn raw<const P: usize>(
        q: [*const f32; 8],
        m: *const f32,
        d8: usize,
    ) -> [[__m512; P]; 8] {
        let mut acc = [[_mm512_setzero_ps(); P]; 8];
        let mut i = 0;
        while i < d8 {
            // SAFETY: `i + 8 <= d8`, within each of the `2P` means.
            let mv: [__m512; P] = std::array::from_fn(|p| unsafe {
                let lo = _mm256_loadu_ps(m.add(2 * p * d8 + i));
                let hi = _mm256_loadu_ps(m.add((2 * p + 1) * d8 + i));
                _mm512_insertf32x8::<1>(_mm512_castps256_ps512(lo), hi)
            });
            for r in 0..8 {
                // SAFETY: as above, within `q[r]`.
                let qv = unsafe { _mm512_broadcast_f32x8(_mm256_loadu_ps(q[r].add(i))) };
                for p in 0..P {
                    acc[r][p] = _mm512_fmadd_ps(qv, mv[p], acc[r][p]);
                }
            }
            i += 8;
        }
        acc
    }

    /// `super::avx2::reduce8v` on each 256-bit half: `a[r]` row `r`'s lanes
    /// for two means, out `[the low mean's gates of rows 0-7 | the high
    /// one's]`, each the lanes' `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 +
    /// l7))` by the same additions with the same operands first (the
    /// AVX2 kernel's `hadd` is two shuffles and an addition here, `x[2i] +
    /// x[2i + 1]`: the NaN the instruction keeps when both are NaN, as
    /// measured — the other order failed the bit test against `moba.gates`
    /// on an AVX-512 CPU).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
    fn reduce16(a: [__m512; 8]) -> __m512 {
        // Per half, `permute2f128`'s low and high 128-bit lanes of `a[j]` and
        // `a[j + 4]`.
        let ilo = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27);
        let ihi = _mm512_setr_epi32(4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
        let s: [__m512; 4] = std::array::from_fn(|j| {
            let lo = _mm512_permutex2var_ps(a[j], ilo, a[j + 4]);
            let hi = _mm512_permutex2var_ps(a[j], ihi, a[j + 4]);
            _mm512_permute_ps::<0b11_01_10_00>(_mm512_add_ps(lo, hi))
        });
        let hadd = |x: __m512, y: __m512| {
            let even = _mm512_shuffle_ps::<0b10_00_10_00>(x, y);
            let odd = _mm512_shuffle_ps::<0b11_01_11_01>(x, y);
            _mm512_add_ps(even, odd)
        };
        hadd(hadd(s[0], s[1]), hadd(s[2], s[3]))
    }

    /// Eight rows' gates against `2P` means from mean `b` into `out[b · 8
    /// ..]`.
    ///
    /// # Safety
    /// Every `qp[r]` heads `d8` readable floats (a multiple of 8).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
    unsafe fn pairs<const P: usize>(
        qp: [*const f32; 8],
        means: &[f32],
        b: usize,
        d8: usize,
        out: &mut [f32],
    ) {
        let m = &means[b * d8..][..2 * P * d8];
        // SAFETY: every row heads `d8` floats (the contract), `m` the `2P`
        // means (sliced above).
        let acc = unsafe { raw::<P>(qp, m.as_ptr(), d8) };
        let o = &mut out[b * 8..][..16 * P];
        for p in 0..P {
            let g = reduce16(std::array::from_fn(|r| acc[r][p]));
            // SAFETY: `o` holds `16P` floats.
            unsafe { _mm512_storeu_ps(o.as_mut_ptr().add(16 * p), g) };
        }
    }

    /// [`super::avx2::lanes`] two means a vector: means six at a time
    /// (eight rows by three pairs, twenty-four independent chains), then
    /// four, then two, a last one by the AVX2 kernel's eight rows by one.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
    pub(super) fn lanes(
        _t: Avx512,
        q: &[f32],
        rows: &[usize; 8],
        means: &[f32],
        d8: usize,
        out: &mut [f32],
    ) {
        let n = means.len() / d8;
        let qp: [*const f32; 8] = std::array::from_fn(|l| q[rows[l]..][..d8].as_ptr());
        let mut b = 0;
        while b + 6 <= n {
            // SAFETY: every `qp[l]` heads a `d8`-float slice (sliced above).
            unsafe { pairs::<3>(qp, means, b, d8, out) };
            b += 6;
        }
        if b + 4 <= n {
            // SAFETY: as above.
            unsafe { pairs::<2>(qp, means, b, d8, out) };
            b += 4;
        }
        if b + 2 <= n {
            // SAFETY: as above.
            unsafe { pairs::<1>(qp, means, b, d8, out) };
            b += 2;
        }
        if b < n {
            // SAFETY: every pointer heads a `d8`-float slice (sliced above).
            let g = unsafe { super::avx2::tile_8x1(qp, means[b * d8..][..d8].as_ptr(), d8) };
            out[b * 8..][..8].copy_from_slice(&g);
        }
    }
}

/// Runs the family at `isa` against the portable kernel (the reach test).
#[cfg(test)]
pub(super) fn probe(isa: Isa) {
    let q: Vec<f32> = (0..48).map(|i| (i as f32 * 0.37).sin()).collect();
    let m: Vec<f32> = (0..80).map(|i| (i as f32 * 0.11).cos()).collect();
    let rows = [0, 16, 32];
    let (mut a, mut b) = (vec![0.0f32; 15], vec![0.0f32; 15]);
    gates(isa, &q, &rows, &m, 16, &mut a);
    portable::gates(&q, &rows, &m, 16, &mut b);
    assert_eq!(
        a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        b.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    let rows8 = [0, 16, 32, 8, 24, 0, 16, 32];
    let (mut a, mut b) = (vec![0.0f32; 40], vec![0.0f32; 40]);
    lanes(isa, &q, &rows8, &m, 16, &mut a);
    portable::lanes(&q, &rows8, &m, 16, &mut b);
    assert_eq!(
        a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        b.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    let (mut x, mut y) = ([0i32; 16], [0i32; 16]);
    top(isa, &a, 2, &mut x);
    portable::top(&a, 2, &mut y);
    assert_eq!(x, y);
    let h: Vec<u16> = (0..80u16).map(|i| 0x3C00 + 37 * i).collect();
    for rows in [Encoded::F32(&m), Encoded::Bf16(&h), Encoded::F16(&h)] {
        let (mut a, mut b) = (vec![1.0f32; 40], vec![1.0f32; 40]);
        sums(isa, &mut a, rows);
        portable::sums(&mut b, rows);
        assert_eq!(a, b);
    }
}
