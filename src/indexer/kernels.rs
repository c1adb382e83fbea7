//! The indexer's scoring kernels: every key of a row against every head of
//! one query, in the summation order of the module docs. The AVX2 kernel
//! and the portable one run the same chains, so they agree bit for bit.

use crate::keys::Encoded;
use crate::simd::Avx2;

/// A query's heads decoded and zero-padded to `dp` (d rounded up to 8).
pub(super) struct Query {
    pub h: usize,
    pub d: usize,
    pub dp: usize,
    pub q: Vec<f32>,
}

impl Query {
    pub fn new(h: usize, d: usize) -> Self {
        let dp = d.div_ceil(8) * 8;
        Query {
            h,
            d,
            dp,
            q: vec![0.0; h * dp],
        }
    }

    /// Decodes the query whose `h × d` elements start at `start`.
    pub fn load(&mut self, q: &Encoded<'_>, start: usize) {
        let (d, dp) = (self.d, self.dp);
        for (head, row) in self.q.chunks_exact_mut(dp).enumerate() {
            q.decode(start + head * d, &mut row[..d]);
        }
    }
}

/// `x <= 0 ? 0 : x`: the ReLU that keeps NaN (a NaN dot product must not
/// join the zero plateau).
#[inline(always)]
fn relu(x: f32) -> f32 {
    if x <= 0.0 {
        0.0
    } else {
        x
    }
}

/// Keys per register tile of the AVX2 kernel.
const KEYS: usize = 2;
/// Keys decoded per step: a block small enough to stay in L1 while every
/// tile of heads passes over it (so the query's heads are read from cache
/// once per block, not once per key).
const BLOCK: usize = KEYS * 6;

/// The scores of keys `first .. first + out.len()` into `out` (canonical:
/// `-0.0` is `+0.0`).
pub(super) fn score_keys(
    level: Option<Avx2>,
    q: &Query,
    w: &[f32],
    keys: &Encoded<'_>,
    scale: Option<&[f32]>,
    first: usize,
    out: &mut [f32],
) {
    let (d, dp, h) = (q.d, q.dp, q.h);
    assert!(w.len() == h && q.q.len() == h * dp);
    assert!((first + out.len()) * d <= keys.len());
    assert!(scale.is_none_or(|c| first + out.len() <= c.len()));
    let mut kbuf = vec![0.0f32; BLOCK * dp];
    for (j, block) in out.chunks_mut(BLOCK).enumerate() {
        let t0 = first + j * BLOCK;
        // float32 keys already in the padded layout (d a multiple of 8) are
        // read in place; any other block is decoded (or padded) into `kbuf`.
        let k: &[f32] = match keys {
            Encoded::F32(s) if d == dp && block.len() == BLOCK => &s[t0 * d..(t0 + BLOCK) * d],
            _ => {
                for (r, row) in kbuf.chunks_exact_mut(dp).enumerate() {
                    match r < block.len() {
                        true => keys.decode((t0 + r) * d, &mut row[..d]),
                        false => row.fill(0.0), // a partial block's unused rows: scored, discarded
                    }
                }
                &kbuf
            }
        };
        let mut acc = [0.0f32; BLOCK];
        // The bounds the kernel's pointer reads rely on, checked in release.
        assert!(k.len() == BLOCK * dp && dp % 8 == 0);
        match level {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the token proves AVX2 and FMA; `q.q` holds `h` rows of
            // `dp` (asserted above), `k` holds `BLOCK` rows of `dp` (a full
            // block read in place, or `kbuf`), and `dp` is a multiple of 8.
            Some(token) => unsafe { avx2::weighted_relu_sums(token, &q.q, k, w, dp, &mut acc) },
            _ => {
                for (a, key) in acc.iter_mut().zip(k.chunks_exact(dp)).take(block.len()) {
                    *a = portable::weighted_relu_sum(&q.q, key, w, dp);
                }
            }
        }
        for (r, o) in block.iter_mut().enumerate() {
            let c = scale.map_or(1.0, |s| s[t0 + r]);
            *o = acc[r] * c + 0.0;
        }
    }
}

mod portable {
    use super::relu;

    /// `Σ_h fma(w_h, relu(q_h · k))` in head order, each dot in 8 lanes.
    pub(super) fn weighted_relu_sum(q: &[f32], k: &[f32], w: &[f32], dp: usize) -> f32 {
        let mut acc = 0.0f32;
        for (qh, &wh) in q.chunks_exact(dp).zip(w) {
            let mut lanes = [0.0f32; 8];
            for (qc, kc) in qh.chunks_exact(8).zip(k.chunks_exact(8)) {
                for j in 0..8 {
                    lanes[j] = qc[j].mul_add(kc[j], lanes[j]);
                }
            }
            let l = lanes;
            let dot = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
            acc = wh.mul_add(relu(dot), acc);
        }
        acc
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{relu, BLOCK, KEYS};
    use crate::simd::x86::reduce4;
    use crate::simd::Avx2;
    use std::arch::x86_64::*;

    /// Heads per register tile.
    const HEADS: usize = 4;

    /// `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))` of one accumulator.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn reduce(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let t = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)))
    }

    /// The portable kernel's chains for a block of `BLOCK` keys: for each
    /// tile of `HEADS` heads in head order, every pair of keys in the block
    /// (8 accumulators, kept in registers: the tile's loops have constant
    /// bounds). Each dot product is still one 8-lane FMA chain over the
    /// dimensions in order, and each key's sum takes its heads in head order.
    ///
    /// # Safety
    /// `q.len() == w.len() * dp`, `k.len() == BLOCK * dp`, `dp % 8 == 0`
    /// (the token proves the CPU can run it).
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn weighted_relu_sums(
        _: Avx2,
        q: &[f32],
        k: &[f32],
        w: &[f32],
        dp: usize,
        acc: &mut [f32; BLOCK],
    ) {
        let h = w.len();
        let full = h / HEADS * HEADS;
        for h0 in (0..full).step_by(HEADS) {
            for p in (0..BLOCK).step_by(KEYS) {
                // SAFETY: heads `h0 .. h0 + HEADS <= h`; keys `p .. p + KEYS`
                // of the block's `BLOCK` rows of `dp`.
                unsafe { tile::<HEADS>(q, &k[p * dp..], w, dp, h0, &mut acc[p..p + KEYS]) };
            }
        }
        for h0 in full..h {
            for p in (0..BLOCK).step_by(KEYS) {
                // SAFETY: head `h0 < h`; keys `p .. p + KEYS` as above.
                unsafe { tile::<1>(q, &k[p * dp..], w, dp, h0, &mut acc[p..p + KEYS]) };
            }
        }
    }

    /// Heads `h0 .. h0 + G` against `KEYS` keys (`k`: `KEYS` rows of `dp`),
    /// folded into `acc` (`KEYS` sums).
    ///
    /// # Safety
    /// `q.len() >= (h0 + G) * dp`, `k.len() >= KEYS * dp`, `acc.len() ==
    /// KEYS`, `h0 + G <= w.len()`, `dp % 8 == 0`; the CPU has AVX2 and FMA.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::needless_range_loop)] // indexed on purpose: the accumulators stay in registers
    unsafe fn tile<const G: usize>(
        q: &[f32],
        k: &[f32],
        w: &[f32],
        dp: usize,
        h0: usize,
        acc: &mut [f32],
    ) {
        let (qp, kp) = (q.as_ptr(), k.as_ptr());
        let mut a = [[_mm256_setzero_ps(); KEYS]; G];
        for c in (0..dp).step_by(8) {
            // SAFETY: `c + 8 <= dp`; keys `0..KEYS` of `dp` each; heads
            // `h0 .. h0 + G` of `dp` each (the function's contract).
            unsafe {
                let kv: [__m256; KEYS] =
                    std::array::from_fn(|r| _mm256_loadu_ps(kp.add(r * dp + c)));
                for j in 0..G {
                    let qv = _mm256_loadu_ps(qp.add((h0 + j) * dp + c));
                    for r in 0..KEYS {
                        a[j][r] = _mm256_fmadd_ps(qv, kv[r], a[j][r]);
                    }
                }
            }
        }
        if G == HEADS {
            // Four dot products per reduction; the ReLU (`x <= 0 ? 0 : x`,
            // NaN kept) on the vector; then each key's sum in head order.
            for r in 0..KEYS {
                let m = reduce4(a[0][r], a[1 % G][r], a[2 % G][r], a[3 % G][r]);
                let m = _mm_andnot_ps(_mm_cmp_ps::<_CMP_LE_OQ>(m, _mm_setzero_ps()), m);
                let mut v = [0.0f32; 4];
                // SAFETY: `v` holds 4 floats.
                unsafe { _mm_storeu_ps(v.as_mut_ptr(), m) };
                for (j, lane) in [0, 2, 1, 3].into_iter().enumerate() {
                    acc[r] = w[h0 + j].mul_add(v[lane], acc[r]);
                }
            }
        } else {
            for j in 0..G {
                for r in 0..KEYS {
                    let dot = reduce(a[j][r]);
                    acc[r] = w[h0 + j].mul_add(relu(dot), acc[r]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The AVX2 and portable kernels give the same bits on ragged shapes,
    /// NaN and signed zeros included.
    #[test]
    fn every_level_scores_bit_identically() {
        let Some(token) = crate::simd::avx2_for_test() else {
            return;
        };
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
        };
        for &(h, d) in &[
            (1usize, 1usize),
            (3, 7),
            (8, 16),
            (9, 33),
            (64, 128),
            (17, 5),
        ] {
            let dp = d.div_ceil(8) * 8;
            for trial in 0..20 {
                let mut q = vec![0.0f32; h * dp];
                for (i, x) in q.iter_mut().enumerate() {
                    if i % dp < d {
                        *x = next();
                    }
                }
                let mut k = vec![0.0f32; dp];
                for x in k.iter_mut().take(d) {
                    *x = next();
                }
                if trial == 3 {
                    k[0] = f32::NAN;
                }
                let w: Vec<f32> = (0..h).map(|_| next()).collect();
                let a = portable::weighted_relu_sum(&q, &k, &w, dp);
                // A second key: the first reversed over its d dimensions.
                let mut second = k.clone();
                second[..d].reverse();
                let b = portable::weighted_relu_sum(&q, &second, &w, dp);
                let mut block = [k.clone(), second].concat();
                block.resize(BLOCK * dp, 0.5);
                let mut got = [0.0f32; BLOCK];
                // SAFETY: shapes as the kernel requires.
                unsafe { avx2::weighted_relu_sums(token, &q, &block, &w, dp, &mut got) };
                let same =
                    |x: f32, y: f32| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan());
                let c = portable::weighted_relu_sum(&q, &block[(BLOCK - 1) * dp..], &w, dp);
                assert!(same(c, got[BLOCK - 1]), "h={h} d={d} last key");
                assert!(same(a, got[0]) && same(b, got[1]), "h={h} d={d}");
            }
        }
    }
}
