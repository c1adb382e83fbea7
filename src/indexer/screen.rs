//! The AMX screen's second half: which of a row's positions the tiles'
//! scores rule out, and the float32 kernels' scores for all the others.
//!
//! # The rule
//!
//! A group scored with the screen ([`super::kernels::amx`]) holds, per
//! position, either the float32 kernels' score `ŝ_t` (a block the screen
//! did not take) or the screen's `v_t`; both lie within `E_t` of the real
//! score (`super::exact`'s bound, the same for both). Let `F` be the
//! positions whose value and bound are finite, `E*` the largest `E_t` over
//! `F` (`E_t` grows with the key's terms `g_t`, `|c_t|`: the bound of their
//! maxima), and `v_(k)` the `take`-th largest value in `F`. A position `t`
//! of `F` with `v_t < v_(k) − 8E*` is **ruled out**: it keeps the screen's
//! value; every other position gets the float32 kernels' score.
//!
//! # Why the row is the float32 kernels' row, bit for bit
//!
//! The `take` positions of `F` at or above `v_(k)` have float32 scores at
//! least `v_(k) − 2E*` (each within `E*` of its real score, as `v` is), so
//! the float32 kernels' `take`-th score is at least that, while a ruled-out
//! position's float32 score is at most `v_t + 2E* < v_(k) − 6E*`: it is
//! selected by neither, so [`super::select`] picks the same `take` from the
//! same scores either way. Its interval's upper end is below every
//! selected position's lower end (at least `v_(k) − 3E*` where every
//! selected one has a finite bound — a selected one with none makes every
//! unselected position the band) under both values, so `exact::refine`
//! forms the same band; and where the band is every unselected position,
//! the `take` positions above keep a ruled-out one out of the float64
//! choice (their real scores exceed its by `6E*`, far beyond float64's
//! rounding). So the rows and every score reported are the float32
//! kernels', and only the scores of ruled-out positions, which nothing
//! reads, are the screen's.
//!
//! What would break it: a screen whose error exceeds `E_t` (the bound's
//! roundings count), a `take` other than the row's, or the pool and the
//! witnesses, which read every position's score (the screen is off there).

use super::exact::Bound;
use super::kernels::{self, Keys, Query, Scratch, Want};
use crate::keys::Encoded;
use crate::simd::Isa;

/// The positions of a row of `len` that the screen cannot rule out for a
/// row of `take` (all of them when `take >= len` or fewer than `take` have
/// a finite value and bound), given each position's value and terms `(g_t,
/// |c_t|)`.
pub(super) fn survivors(
    query: &Query,
    len: usize,
    take: usize,
    score: impl Fn(usize) -> f32,
    terms: impl Fn(usize) -> (f32, f32),
) -> Vec<usize> {
    if take == 0 {
        return Vec::new();
    }
    let finite = |t: usize| {
        let (g, c) = terms(t);
        score(t).is_finite() && g.is_finite() && c.is_finite()
    };
    let (mut values, mut gmax, mut cmax) = (Vec::with_capacity(len), 0.0f32, 0.0f32);
    for t in (0..len).filter(|&t| finite(t)) {
        let (g, c) = terms(t);
        (gmax, cmax) = (gmax.max(g), cmax.max(c.abs()));
        values.push(score(t));
    }
    if take >= len || values.len() < take {
        return (0..len).collect();
    }
    let estar = Bound::of(query).error(gmax, cmax);
    let at = values.len() - take;
    let (_, vk, _) = values.select_nth_unstable_by(at, f32::total_cmp);
    // `8 E*` with room for this float64 arithmetic's roundings.
    let cut = f64::from(*vk) - 8.0 * estar * (1.0 + 1.0 / (1u64 << 20) as f64);
    if !cut.is_finite() {
        return (0..len).collect();
    }
    (0..len)
        .filter(|&t| !finite(t) || f64::from(score(t)) >= cut)
        .collect()
}

/// The float32 kernels' scores of `positions` for `query` at `level`
/// (`key(t, row)` decodes key `t` into `row` and returns its scale): the
/// bits the kernels give them in place (decoding is exact, so a decoded
/// key scores as its encoding does).
pub(super) fn rescore(
    level: Isa,
    query: &Query,
    positions: &[usize],
    key: impl Fn(usize, &mut [f32]) -> f32,
) -> Vec<f32> {
    let (n, d) = (positions.len(), query.d);
    let mut rows = vec![0.0f32; n * d];
    let mut scales = vec![1.0f32; n];
    for ((&t, row), c) in positions.iter().zip(rows.chunks_exact_mut(d)).zip(&mut scales) {
        *c = key(t, row);
    }
    let mut out = vec![0.0f32; n];
    kernels::score_keys(
        level,
        std::slice::from_ref(query),
        Keys::new(Encoded::F32(&rows), Some(&scales)),
        0,
        &mut [&mut out[..]],
        Want::Scores,
        &mut Scratch::new(d),
    );
    out
}
