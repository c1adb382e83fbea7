//! The indexer's scoring kernels: every key of a row against every head of
//! one query, in the summation order of the module docs. The AVX2 kernel
//! and the portable one run the same chains, so they agree bit for bit.

use crate::keys::Encoded;
use crate::simd::Avx2;

/// One worker's buffers: the query's heads, zero-padded to `dp` (d rounded
/// up to 8), one decoded key, and the row's scores.
pub(super) struct Scratch {
    h: usize,
    d: usize,
    dp: usize,
    q: Vec<f32>,
    k: Vec<f32>,
    scores: Vec<f32>,
}

impl Scratch {
    pub fn new(h: usize, d: usize) -> Self {
        let dp = d.div_ceil(8) * 8;
        Scratch {
            h,
            d,
            dp,
            q: vec![0.0; h * dp],
            k: vec![0.0; dp],
            scores: Vec::new(),
        }
    }

    /// Decodes the query whose `h × d` elements start at `start`.
    pub fn load_query(&mut self, q: &Encoded<'_>, start: usize) {
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

/// The scores of keys `0 .. len` (canonical: `-0.0` is `+0.0`).
pub(super) fn score_keys<'s>(
    level: Option<Avx2>,
    sc: &'s mut Scratch,
    w: &[f32],
    keys: &Encoded<'_>,
    scale: Option<&[f32]>,
    len: usize,
) -> &'s [f32] {
    let (d, dp, h) = (sc.d, sc.dp, sc.h);
    assert!(w.len() == h && sc.q.len() == h * dp && sc.k.len() == dp);
    sc.scores.clear();
    sc.scores.reserve(len);
    for t in 0..len {
        keys.decode(t * d, &mut sc.k[..d]);
        let acc = match level {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the token proves AVX2 and FMA; `q` holds `h` rows of
            // `dp`, `k` holds `dp` (asserted above), `dp` a multiple of 8.
            Some(token) => unsafe { avx2::weighted_relu_sum(token, &sc.q, &sc.k, w, dp) },
            _ => portable::weighted_relu_sum(&sc.q, &sc.k, w, dp),
        };
        let c = scale.map_or(1.0, |s| s[t]);
        sc.scores.push(acc * c + 0.0);
    }
    &sc.scores
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
    use super::relu;
    use crate::simd::Avx2;
    use std::arch::x86_64::*;

    /// The portable kernel's chains, eight dimensions per FMA; the key's
    /// chunks are loaded once per group of up to 8 heads.
    ///
    /// # Safety
    /// `q.len() == w.len() * dp`, `k.len() == dp`, `dp % 8 == 0` (the
    /// token proves the CPU can run it).
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn weighted_relu_sum(
        _: Avx2,
        q: &[f32],
        k: &[f32],
        w: &[f32],
        dp: usize,
    ) -> f32 {
        const G: usize = 8;
        let h = w.len();
        let mut acc = 0.0f32;
        let mut h0 = 0;
        while h0 < h {
            let g = (h - h0).min(G);
            let mut a = [_mm256_setzero_ps(); G];
            for c in (0..dp).step_by(8) {
                // SAFETY: `c + 8 <= dp = k.len()`.
                let kv = unsafe { _mm256_loadu_ps(k.as_ptr().add(c)) };
                for (j, aj) in a.iter_mut().enumerate().take(g) {
                    // SAFETY: head `h0 + j < h`, dims `c .. c + 8` of its `dp`.
                    let qv = unsafe { _mm256_loadu_ps(q.as_ptr().add((h0 + j) * dp + c)) };
                    *aj = _mm256_fmadd_ps(qv, kv, *aj);
                }
            }
            for (j, &v) in a.iter().enumerate().take(g) {
                // ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))
                let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
                let t = _mm_add_ps(s, _mm_movehl_ps(s, s));
                let dot = _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
                acc = w[h0 + j].mul_add(relu(dot), acc);
            }
            h0 += g;
        }
        acc
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
                // SAFETY: shapes as the kernel requires.
                let b = unsafe { avx2::weighted_relu_sum(token, &q, &k, &w, dp) };
                assert!(
                    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                    "h={h} d={d}"
                );
            }
        }
    }
}
