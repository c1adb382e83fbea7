//! The portable `exp`: the scalar chain each vector kernel runs a lane at a
//! time (see the module docs of [`crate::exp`]).

// Cephes' expf: exp(x) = 2^n · exp(r), n = round(x·log2 e),
// r = x - n·ln 2 (ln 2 split in two for an exact first step).
pub(crate) const LOG2E: f32 = std::f32::consts::LOG2_E;
/// Below this, exp underflows (to about the smallest normal float): `+0`.
pub const EXP_LO: f32 = -87.336_55;
pub(crate) const LN2_HI: f32 = 0.693_359_4;
pub(crate) const LN2_LO: f32 = -2.121_944_4e-4;
#[allow(clippy::excessive_precision)]
pub(crate) const P: [f32; 6] = [
    1.987_569_150_0e-4,
    1.398_199_950_7e-3,
    8.333_451_907_3e-3,
    4.166_579_589_4e-2,
    1.666_666_545_9e-1,
    5.000_000_120_1e-1,
];
/// `1.5 · 2^23`: adding and subtracting it rounds `|t| < 2^22` to the
/// nearest integer, ties to even, with two plain IEEE additions.
pub(crate) const ROUND: f32 = 12_582_912.0;

/// `exp(x)` for `x <= 0` (NaN stays NaN), the scalar twin of the vector
/// kernels, operation for operation.
#[inline(always)]
pub(crate) fn exp_scalar(x: f32) -> f32 {
    // `_mm256_max_ps(LO, x)`: x when it is NaN.
    let xc = if EXP_LO > x { EXP_LO } else { x };
    let n = (xc * LOG2E + ROUND) - ROUND;
    let r = n.mul_add(-LN2_HI, xc);
    let r = n.mul_add(-LN2_LO, r);
    let mut y = P[0];
    for &p in &P[1..] {
        y = y.mul_add(r, p);
    }
    let y = y.mul_add(r * r, r) + 1.0;
    let e = y * f32::from_bits(((n as i32 + 127) << 23) as u32);
    if x < EXP_LO {
        0.0
    } else {
        e
    }
}

/// [`super::exp_shifted`], one element at a time.
pub(super) fn exp_shifted(x: &[f32], shift: f32, out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = exp_scalar(v - shift);
    }
}
