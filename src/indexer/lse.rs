//! The score pool's `lse` variant: a block scored by the log-sum-exp of its
//! entries' scaled scores, and the bounds that make its selection exact up
//! to a stated tolerance.
//!
//! # The rule
//!
//! SGLang 0.5.23's MiniMax-M3 selector (sgl-project/sglang
//! `python/sglang/kernels/ops/attention/minimax_sparse/prefill/flash_with_topk_idx.py`
//! @ 241670d, `_flash_attn_fwd_with_block_score_kernel`, `SCORE_TYPE == "lse"`)
//! scores a block of `block_size` positions by `sub_max + log2 Σ exp2(qk −
//! sub_max)` with `qk = q · k · sm_scale · log2 e`, and clamps the NaN of a
//! fully masked block to `-inf`. That is `log2 e · ln Σ_t exp(sm_scale ·
//! s_t)`: a positive multiple of the natural log-sum-exp, so the same order.
//! kvselect's block score is `ℓ_b = ln Σ_{t ∈ b} exp(λ s_t)` over the block's
//! visible entries (`λ = sm_scale`, float32, above 0), and a block with a NaN
//! entry scores `-inf` (kvselect's twin, `kvselect.reference.indexer.pool_scores`).
//!
//! # The float32 block score (the screen, `scores_out`, the listing order)
//!
//! [`lse32`]: `z_t = λ ⊗ ŝ_t` (float32), `m = max z_t`, `S = Σ_t
//! exp(z_t ⊖ m)` with the project's `exp` ([`crate::exp`], its argument `≤
//! 0`, summed in float64 in entry order), `ℓ̂ = fl32(m + ln S)` with [`ln`].
//! Scalar code: the same bits at every SIMD level.
//!
//! # Why the selection is exact up to `δ`
//!
//! `ℓ` is increasing in each `s_t` and 1-Lipschitz in the max norm (`|ℓ(x) −
//! ℓ(y)| ≤ max_t |x_t − y_t|`). So entry intervals `[a_t, b_t] ∋ λ s_t`
//! give the block interval `[ℓ(a), ℓ(b)]`, and [`bounds`] encloses `ℓ` of
//! float64 points rigorously: with `M = max x_t`, `y_t = x_t − M ≤ 0`
//! split as `h_t = fl32(y_t)` and `r_t = y_t − h_t` (exact), `e^{y_t} =
//! e^{h_t} e^{r_t}`; the project's `exp` gives `e^{h_t}` within
//! [`crate::exp::EXP_REL_ERR`] (exhaustively measured over every float32
//! argument in `[EXP_LO, 0]`; below `EXP_LO` it returns `+0` for a true
//! value under `2⁻¹²⁵`), and `1 + r ≤ e^r ≤ 1 + r + r²` (`|r| ≤ 1`); the
//! float64 roundings of `y_t`, of the products and of the sum (each `2⁻⁵³`
//! relative, counted with room) widen the sum's bounds; [`ln`] is within
//! [`LN_ERR`]; and the final `M + ln S` and `x_t = λ · a_t` add a relative
//! `2⁻⁵²` each. The sum's lower bound is at least `(1 − EXP_REL_ERR)(1 −
//! …) > 0` (the largest term is `exp(0) = 1`), so its log is defined.
//!
//! The band (blocks whose intervals from the float32 scores overlap the
//! row's threshold, `exact::refine_pooled`) is decided by `ℓ̃_b`, the
//! midpoint of [`bounds`] of the entries' float64 re-scores `λ s̃_t`. It
//! lies within `δ_b = w_b + λ max_t |s̃_t − s_t|` of the real `ℓ_b` (`w_b`
//! the half-width, about `EXP_REL_ERR`; the re-scores are off by at most
//! `γ_{d+H+2}` in units of `2⁻⁵³` of their magnitude), so a selected block
//! `a` and an unselected `b` satisfy `ℓ_a ≥ ℓ_b − δ_a − δ_b`: the rows are
//! the real top-k of `ℓ` except between blocks whose real scores lie within
//! that of each other, which the check treats as a tie. Blocks outside the
//! band are decided by rigorous intervals, exactly.
//!
//! # What would break it
//!
//! A change to the project's `exp` (its bound is measured, not derived), a
//! sum reordered between the screen and [`lse32`]'s callers (the listing
//! would change, not the set), an `h_t` outside the `exp` kernel's domain
//! (`y_t > 0`: impossible, `M` is the maximum), or a series in [`ln`] cut
//! shorter than its stated truncation.

use crate::exp::{exp_scalar, EXP_REL_ERR};

/// A bound on [`ln`]'s absolute error over `[2⁻⁶⁴, 2⁶⁴]` (the sums it is
/// used on lie in `[0.99, 2³²]`): the series' truncation (below `10⁻¹⁸`)
/// and at most 40 float64 roundings of values below 45 (below `2⁻⁴⁵`), with
/// room.
pub(super) const LN_ERR: f64 = 1.0 / (1u64 << 40) as f64;

/// An upper bound on a term the project's `exp` returns as `+0` (its
/// argument below `EXP_LO = −87.33655`: `e^x < 2⁻¹²⁶ (1 + 10⁻⁵)`).
const UNDER: f64 = 2.0 * f32::MIN_POSITIVE as f64;

/// `ln x` for a finite `x > 0`, within [`LN_ERR`] on `[2⁻⁶⁴, 2⁶⁴]`: `x =
/// 2^k f` with `f ∈ [√½, √2)` (from the bits, exact), `ln x = k ln 2 + 2
/// atanh(z)`, `z = (f − 1)/(f + 1)`, `|z| < 0.1716`, and `atanh z = Σ_{j ≤
/// 10} z^{2j+1}/(2j + 1)` (the tail below `2 |z|²³/23 < 10⁻¹⁸`). `f − 1` is
/// exact (Sterbenz); the rest rounds at most 40 times. Not used past that
/// range; NaN for `x ≤ 0` or not finite.
pub(super) fn ln(x: f64) -> f64 {
    if !(x > 0.0 && x.is_finite()) {
        return f64::NAN;
    }
    let (mut k, mut f) = (0i64, x);
    if f < f64::MIN_POSITIVE {
        f *= (1u64 << 60) as f64; // subnormal: scale up exactly
        k -= 60;
    }
    let bits = f.to_bits();
    let e = ((bits >> 52) & 0x7ff) as i64 - 1023;
    f = f64::from_bits((bits & !(0x7ff << 52)) | (1023 << 52)); // [1, 2)
    k += e;
    if f > std::f64::consts::SQRT_2 {
        f *= 0.5;
        k += 1;
    }
    let z = (f - 1.0) / (f + 1.0);
    let z2 = z * z;
    let mut series = 1.0 / 21.0;
    for j in (0..10).rev() {
        series = series * z2 + 1.0 / (2 * j + 1) as f64;
    }
    k as f64 * std::f64::consts::LN_2 + 2.0 * z * series
}

/// A block's float32 `lse` score of the float32 entry scores `s` (see the
/// module docs): `-inf` with a NaN entry or no finite scaled score above
/// `-inf`; `+inf` when a scaled score overflows.
pub(super) fn lse32(s: impl Iterator<Item = f32> + Clone, lambda: f32) -> f32 {
    let mut m = f32::NEG_INFINITY;
    for x in s.clone() {
        if x.is_nan() {
            return f32::NEG_INFINITY;
        }
        m = m.max(lambda * x);
    }
    if !m.is_finite() {
        return m + 0.0;
    }
    let sum: f64 = s.map(|x| f64::from(exp_scalar(lambda * x - m))).sum();
    (f64::from(m) + ln(sum)) as f32 + 0.0
}

/// An interval holding the real `ln Σ_t e^{ξ_t}` for every `ξ` with `|ξ_t −
/// x_t| ≤ 2⁻⁵² |x_t|` (the points `x` as float64 computed them: `λ a_t`
/// rounded once). `(-inf, -inf)` when every `x_t` is `-inf` (or none
/// given); `(+inf, +inf)` when one is `+inf`. `x` holds no NaN.
pub(super) fn bounds(x: &[f64]) -> (f64, f64) {
    let m = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if m.is_infinite() {
        return (m, m);
    }
    let u = f64::EPSILON / 2.0; // 2⁻⁵³
    let (mut lo, mut hi, mut under, mut big) = (0.0f64, 0.0f64, 0usize, 0.0f64);
    for &xt in x {
        big = big.max(xt.abs());
        let y = xt - m; // <= 0, off by at most u |y|
        let h = y as f32;
        let r = y - f64::from(h); // exact
        let eta = 2.0 * u * y.abs();
        let e = f64::from(exp_scalar(h));
        if e == 0.0 {
            under += 1; // the true term lies in [0, UNDER]
            continue;
        }
        // |e − e^h| ≤ EXP_REL_ERR e^h: e^h ∈ [e / (1 + ε), e / (1 − ε)].
        let (rl, rh) = (r - eta, r + eta);
        lo += e / (1.0 + EXP_REL_ERR) * (1.0 + rl);
        hi += e / (1.0 - EXP_REL_ERR) * (1.0 + rh + rh * rh);
    }
    // Each term rounds at most 6 times, the sum n − 1 more: relative (n + 8) 2u.
    let g = (x.len() as f64 + 8.0) * 2.0 * u;
    let lo = lo * (1.0 - g);
    let hi = hi * (1.0 + g) + under as f64 * UNDER;
    // The points' own rounding (1-Lipschitz: at most 2u max |x| each way),
    // the log's error and the final sum's rounding (2u of |M| + |ln|, with room).
    let (l_lo, l_hi) = (ln(lo), ln(hi));
    let widen = |l: f64| 4.0 * u * (big + m.abs() + l.abs()) + LN_ERR;
    (m + l_lo - widen(l_lo), m + l_hi + widen(l_hi))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`ln`] against `f64::ln` (within a few units of `2⁻⁵³` on any libm)
    /// over a dense grid of `[2⁻⁶⁴, 2⁶⁴]` and the edges: far inside [`LN_ERR`].
    #[test]
    fn ln_is_within_its_bound() {
        let mut worst = 0.0f64;
        let mut x = 2f64.powi(-64);
        while x < 2f64.powi(64) {
            for t in [
                x,
                x * 1.000_000_1,
                x * std::f64::consts::SQRT_2,
                x * 1.999_999,
            ] {
                worst = worst.max((ln(t) - t.ln()).abs());
            }
            x *= 1.013;
        }
        for t in [
            1.0,
            2.0,
            0.5,
            std::f64::consts::SQRT_2,
            1.0 + 1e-15,
            1.0 - 1e-16,
        ] {
            worst = worst.max((ln(t) - t.ln()).abs());
        }
        assert!(worst < LN_ERR / 64.0, "ln off by {worst:e}");
        assert_eq!(ln(1.0), 0.0);
        assert!(ln(0.0).is_nan() && ln(-1.0).is_nan() && ln(f64::INFINITY).is_nan());
    }

    /// `UNDER` is above `e^{EXP_LO}` (the largest term `exp` drops to 0).
    #[test]
    fn under_bounds_the_dropped_terms() {
        let dropped = (f64::from(crate::exp::EXP_LO)).exp();
        assert!(UNDER > dropped && UNDER < 1e-37, "{UNDER:e} vs {dropped:e}");
    }

    /// [`bounds`] holds the float64 log-sum-exp (`f64::exp` / `ln`, far
    /// more accurate than the bound) and is about `EXP_REL_ERR` wide, on
    /// random points, wide ranges and underflowing terms.
    #[test]
    fn bounds_enclose_the_log_sum_exp() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        for trial in 0..4000 {
            let n = 1 + (next() * 130.0) as usize;
            let spread = [1e-3, 1.0, 30.0, 200.0, 1e4][trial % 5];
            let x: Vec<f64> = (0..n).map(|_| (next() - 0.5) * spread).collect();
            let m = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let want = m + x.iter().map(|&v| (v - m).exp()).sum::<f64>().ln();
            let (lo, hi) = bounds(&x);
            let slack = 1e-15 * (1.0 + want.abs());
            assert!(
                lo <= want + slack && want - slack <= hi,
                "{trial}: {lo} {want} {hi}"
            );
            assert!(
                hi - lo < 4.0 * EXP_REL_ERR + 1e-12 * (1.0 + m.abs()),
                "{trial}: width {}",
                hi - lo
            );
        }
        assert_eq!(bounds(&[]), (f64::NEG_INFINITY, f64::NEG_INFINITY));
        assert_eq!(
            bounds(&[f64::NEG_INFINITY; 3]),
            (f64::NEG_INFINITY, f64::NEG_INFINITY)
        );
        assert_eq!(
            bounds(&[1.0, f64::INFINITY]),
            (f64::INFINITY, f64::INFINITY)
        );
    }

    /// [`lse32`] lies inside the bounds of its own float32 points (rounded
    /// to float32 once more) on random blocks; NaN gives `-inf`.
    #[test]
    fn lse32_is_the_float32_log_sum_exp() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        for _ in 0..2000 {
            let n = 1 + (next() * 64.0) as usize;
            let s: Vec<f32> = (0..n).map(|_| ((next() - 0.5) * 40.0) as f32).collect();
            let lambda = 0.125f32;
            let x: Vec<f64> = s.iter().map(|&v| f64::from(lambda * v)).collect();
            let (lo, hi) = bounds(&x);
            let got = f64::from(lse32(s.iter().copied(), lambda));
            let ulp = 2f64.powi(-23) * got.abs().max(1e-30);
            assert!(got >= lo - ulp && got <= hi + ulp, "{lo} {got} {hi}");
        }
        assert_eq!(
            lse32([1.0f32, f32::NAN].into_iter(), 1.0),
            f32::NEG_INFINITY
        );
        assert_eq!(
            lse32([f32::NEG_INFINITY; 2].into_iter(), 1.0),
            f32::NEG_INFINITY
        );
        assert_eq!(lse32(std::iter::empty(), 1.0), f32::NEG_INFINITY);
        assert_eq!(lse32([0.0f32; 4].into_iter(), 1.0), (4.0f64.ln()) as f32);
    }
}
