//! The kernels against each other.

use super::*;

/// The AVX-512, AVX2 and portable kernels give the same bits on ragged shapes,
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
        (12, 24),
        (6, 8),
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
            // The other keys random too (every lane of every tile differs).
            for _ in 2..BLOCK {
                block.extend((0..dp).map(|i| if i < d { next() } else { 0.0 }));
            }
            let mut got = [0.0f32; BLOCK];
            // SAFETY: shapes as the kernel requires.
            unsafe { avx2::weighted_relu_sums(token, &q, &block, &w, dp, &mut got) };
            let same = |x: f32, y: f32| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan());
            for (r, g) in got.iter().enumerate() {
                let want = portable::weighted_relu_sum(&q, &block[r * dp..(r + 1) * dp], &w, dp);
                assert!(same(want, *g), "h={h} d={d} key {r}");
            }
            if let Some(t) = crate::simd::avx512_for_test() {
                let mut wide = [0.0f32; BLOCK];
                // SAFETY: shapes as the kernel requires; the token.
                unsafe { avx512::weighted_relu_sums(t, &q, &block, &w, dp, &mut wide) };
                for (r, (x, y)) in wide.iter().zip(&got).enumerate() {
                    assert!(same(*x, *y), "h={h} d={d} key {r}, AVX-512");
                }
            }
            assert!(same(a, got[0]) && same(b, got[1]), "h={h} d={d}");
        }
    }
}
