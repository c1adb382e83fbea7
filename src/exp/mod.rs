//! The project's own `exp`, shared by every rule with a float32 softmax:
//! the sparse-attention pass, InfLLM-v2's stage 1, MInference's
//! vertical-slash estimate, the indexer's `lse` score pool. (The eviction
//! baselines keep the float64 probabilities of `attention_probabilities`,
//! the C library's `exp`: `crate::eviction` says why.)
//!
//! **The rule.** `exp(x)` for `x <= 0` as Cephes' `expf`: `n =
//! round(x · log2 e)` (ties to even, by adding and subtracting `1.5 · 2^23`),
//! `r = x − n · ln 2` with `ln 2` split in two so the first product is exact,
//! a degree-6 polynomial in `r` by Horner's rule with FMAs, then the
//! product with `2^n` built from its bits. Below [`EXP_LO`] the result is
//! `+0` (the true value is below the smallest normal float); NaN stays NaN.
//!
//! **Identical at every level.** The portable kernel (`f32::mul_add`), the
//! AVX2+FMA kernel and the AVX-512 kernel run the same IEEE operations in
//! the same order on each element (the vector kernels are the scalar one a
//! lane at a time), so every level returns the same bits; the tests below
//! compare them bit for bit, and [`exp_shifted`] is the one dispatch point.
//!
//! **The bound.** For every float32 `x` in `[EXP_LO, 0]`,
//! `|exp_f32(x) − e^x| <= EXP_REL_ERR · e^x` with `e^x` the real
//! exponential. The figure is not an estimate: it is the maximum over every
//! one of the 1,118,743,634 float32 inputs in that range (the exhaustive
//! test below, `cargo test --release -- --ignored exp_bound_is_exhaustive`),
//! measured against `f64::exp` (correctly rounded to well within 2^-52
//! relative, four orders of magnitude below the figure) and rounded up.
//! What would break it: a change to a constant, to the operation order, or a
//! compiler contracting `a * b + c` into an FMA (Rust does not contract
//! floating-point operations). A rule that ranks softmax terms computed
//! with this `exp` treats two candidates whose exact scores lie within this
//! relative distance as tied; a check that decides in real arithmetic uses
//! it as the rigorous bound on each exponential.

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
pub(crate) mod portable;

pub(crate) use portable::exp_scalar;
pub use portable::EXP_LO;

use crate::simd::{dispatch, Isa};

/// The largest relative error of `exp_scalar` (every level's `exp`) over
/// every float32 input in `[EXP_LO, 0]`: `8.5e-8`, about `1.43 · 2^-24`
/// (the measured maximum is `8.3993e-8`, at `x = -5.8778844`, rounded up;
/// see the module docs).
pub const EXP_REL_ERR: f64 = 8.5e-8;

/// `out[i] = exp(x[i] − shift)`, the subtraction in float32, at the level
/// `isa` (every level the same bits). The shift is a row's maximum in a
/// softmax: every argument is then `<= 0`, the kernel's domain.
///
/// # Panics
/// When `out.len() != x.len()` (a caller's bug, never user input).
pub fn exp_shifted(isa: Isa, x: &[f32], shift: f32, out: &mut [f32]) {
    assert_eq!(x.len(), out.len(), "exp_shifted: lengths differ");
    dispatch!("exp.shifted", isa, {
        // SAFETY (bounds): both kernels read `x` and write `out` in whole
        // registers only below `x.len() / lanes · lanes` and the rest with
        // the scalar twin; `out.len() == x.len()` (asserted above).
        avx512(t) => avx512::exp_shifted(t, x, shift, out),
        avx2(t) => avx2::exp_shifted(t, x, shift, out),
        scalar => portable::exp_shifted(x, shift, out),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::isas_for_test;

    fn rel_err(x: f32) -> f64 {
        let want = (x as f64).exp();
        ((exp_scalar(x) as f64 - want) / want).abs()
    }

    /// The scalar kernel within [`EXP_REL_ERR`] on a dense grid and at the
    /// edges; `1` at `0`; `+0` below [`EXP_LO`] and at `-inf`; NaN on NaN.
    #[test]
    fn exp_is_within_its_bound() {
        for i in 0..=2_000_000u32 {
            let x = -(i as f32) * (-EXP_LO / 2_000_000.0);
            if x >= EXP_LO {
                assert!(rel_err(x) <= EXP_REL_ERR, "x={x}: {}", rel_err(x));
            }
        }
        for x in [0.0f32, -0.0, -1e-45, -1e-30, EXP_LO, -f32::MIN_POSITIVE] {
            assert!(rel_err(x) <= EXP_REL_ERR, "x={x}");
        }
        assert_eq!(exp_scalar(0.0), 1.0);
        assert_eq!(exp_scalar(-0.0), 1.0);
        assert!(exp_scalar(EXP_LO) > 0.0);
        let below = f32::from_bits(EXP_LO.to_bits() + 1);
        assert_eq!(exp_scalar(below).to_bits(), 0);
        assert_eq!(exp_scalar(f32::NEG_INFINITY).to_bits(), 0);
        assert!(exp_scalar(f32::NAN).is_nan());
    }

    /// Every float32 in `[EXP_LO, 0]`, against `f64::exp`: the maximum
    /// relative error is at most [`EXP_REL_ERR`]. About 1.1e9 inputs: run
    /// in release (`--ignored`), seconds there.
    #[test]
    #[ignore = "exhaustive: 1.1e9 inputs; run with --release -- --ignored"]
    fn exp_bound_is_exhaustive() {
        let (lo, hi) = (0x8000_0000u32, EXP_LO.to_bits());
        let mut worst = (0.0f64, 0.0f32);
        for b in std::iter::once(0u32).chain(lo..=hi) {
            let x = f32::from_bits(b);
            let e = rel_err(x);
            if e > worst.0 {
                worst = (e, x);
            }
        }
        eprintln!(
            "exp: {} inputs, max relative error {:e} at x = {:e}",
            hi - lo + 2,
            worst.0,
            worst.1
        );
        assert!(worst.0 <= EXP_REL_ERR, "{worst:?}");
    }

    /// Every level's [`exp_shifted`] the same bits as the scalar kernel
    /// (NaN for NaN), on lengths that leave every remainder.
    #[test]
    fn every_level_is_the_scalar_kernel() {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for len in [0usize, 1, 7, 8, 15, 16, 17, 33, 100, 257] {
            let mut x: Vec<f32> = (0..len)
                .map(|_| -((next() % 1_000_000) as f32) * 1e-4)
                .collect();
            if len > 3 {
                x[1] = f32::NAN;
                x[2] = f32::NEG_INFINITY;
                x[3] = EXP_LO - 1.0;
            }
            let shift = if len % 2 == 0 { 0.0 } else { 1.5 };
            let want: Vec<f32> = x.iter().map(|&v| exp_scalar(v - shift)).collect();
            for isa in isas_for_test() {
                let mut got = vec![7.0f32; len];
                exp_shifted(isa, &x, shift, &mut got);
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                        "{}: len {len}, i {i}: {g} vs {w}",
                        isa.level().name()
                    );
                }
            }
        }
    }

    /// `avx2::exp_n` (four vectors side by side) is `exp` lane for lane: the
    /// scalar kernel's bits (NaN for NaN) over a sweep of `[EXP_LO − 2, 0]`,
    /// `−0`, `−inf` and NaN.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn exp_n_is_the_scalar_kernel() {
        use std::arch::x86_64::{_mm256_loadu_ps, _mm256_storeu_ps};
        let Some(_token) = crate::simd::avx2_for_test() else {
            return;
        };
        let mut x: Vec<f32> = (0..64_000)
            .map(|i| (EXP_LO - 2.0) * (i as f32 / 63_999.0))
            .collect();
        x.extend([-0.0, 0.0, f32::NEG_INFINITY, f32::NAN, EXP_LO, -1e-30]);
        x.resize(x.len().next_multiple_of(32), -0.5);
        for c in x.chunks_exact(32) {
            let mut got = [0.0f32; 32];
            // SAFETY: the token proves AVX2+FMA; every pointer has 8 floats.
            unsafe {
                let v = [0, 8, 16, 24].map(|o| _mm256_loadu_ps(c.as_ptr().add(o)));
                let e = avx2::exp_n(v);
                for (i, ei) in e.iter().enumerate() {
                    _mm256_storeu_ps(got.as_mut_ptr().add(8 * i), *ei);
                }
            }
            for (&g, &xi) in got.iter().zip(c) {
                let w = exp_scalar(xi);
                assert!(
                    g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                    "{xi}: {g} vs {w}"
                );
            }
        }
    }
}
