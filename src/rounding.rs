//! What the exact selections (`indexer::exact`, `block_sparse::exact`)
//! share: the float32 rounding constants their error bounds are made of,
//! rounding up to a float32, and the total order of float64 re-scores.
//!
//! The rule: a float32 score is a screen whose error is bounded by a
//! multiple of `U32` (Higham's `γ_n = n u / (1 − n u)`) plus `2⁻¹⁵⁰` per
//! rounding into the subnormal range; the scores the screen cannot place
//! are re-scored in float64 and ranked by [`rank64`], the float64 twin of
//! the float32 rank key every selection uses (NaN lowest, `-0.0 == +0.0`,
//! ties to the lower index). A bound term rounded down, or a rank key that
//! split `-0.0` from `+0.0`, would break the exactness argument.

/// The float32 unit roundoff, `2⁻²⁴`.
pub(crate) const U32: f64 = 1.0 / (1u64 << 24) as f64;

/// Sixteen times the largest absolute error of one rounding into float32's
/// subnormal range (half its smallest step, `2⁻¹⁵⁰`).
pub(crate) const ETA16: f64 = 16.0 * 7.006_492_321_624_085e-46;

/// Higham's `γ_n = n u / (1 − n u)` in float32's unit roundoff.
#[inline]
pub(crate) fn gamma32(n: usize) -> f64 {
    let n = n as f64;
    n * U32 / (1.0 - n * U32)
}

/// `x` rounded up to a float32 (the least float32 `>= x`; NaN stays NaN).
#[inline]
pub(crate) fn up32(x: f64) -> f32 {
    let y = x as f32;
    if (y as f64) < x {
        y.next_up()
    } else {
        y
    }
}

/// `[ŝ − e, ŝ + e]`, the interval a float32 score `s` with error bound `e`
/// puts its real value in; the whole line when either is not finite (an
/// overflow, a NaN or infinite operand: anything is possible).
#[inline]
pub(crate) fn interval(s: f32, e: f64) -> (f64, f64) {
    let s = f64::from(s);
    if s.is_finite() && e.is_finite() {
        (s - e, s + e)
    } else {
        (f64::NEG_INFINITY, f64::INFINITY)
    }
}

/// A float64 score's place in the total order (NaN lowest, `-0.0 == +0.0`),
/// then the lower index: larger is better.
#[inline]
pub(crate) fn rank64(v: f64, index: usize) -> (u64, std::cmp::Reverse<usize>) {
    let key = if v.is_nan() {
        0
    } else {
        let b = (v + 0.0).to_bits();
        if b >> 63 == 1 {
            !b
        } else {
            b | (1 << 63)
        }
    };
    (key, std::cmp::Reverse(index))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `up32` is the least float32 at or above its argument; `rank64`
    /// orders like the values, NaN lowest, the two zeros as one.
    #[test]
    fn rounding_up_and_ranking() {
        for x in [1.0 + 1e-12, -1.0 - 1e-12, 1e-300, -1e-300, 3.0, f64::MAX] {
            let y = up32(x);
            assert!(f64::from(y) >= x && (y == f32::NEG_INFINITY || f64::from(y.next_down()) < x));
        }
        assert!(up32(f64::NAN).is_nan());
        let v = [
            f64::NAN,
            f64::NEG_INFINITY,
            -1.0,
            -0.0,
            0.0,
            2.0,
            f64::INFINITY,
        ];
        let keys: Vec<u64> = v.iter().map(|&x| rank64(x, 0).0).collect();
        assert!(keys.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(rank64(-0.0, 0), rank64(0.0, 0));
        assert!(rank64(1.0, 3) > rank64(1.0, 4));
    }
}
