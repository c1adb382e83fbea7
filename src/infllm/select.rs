//! The one total order on blocks and a query's row.

use super::Keep;
use std::cmp::Ordering;

/// `a` before `b`: score descending (`+inf` first, NaN last), then id
/// ascending.
pub fn before(sa: f32, a: usize, sb: f32, b: usize) -> Ordering {
    let key = |s: f32| if s.is_nan() { f32::NEG_INFINITY } else { s };
    match (sa.is_nan(), sb.is_nan()) {
        (false, true) => return Ordering::Less,
        (true, false) => return Ordering::Greater,
        _ => {}
    }
    key(sb)
        .partial_cmp(&key(sa))
        .unwrap_or(Ordering::Equal)
        .then(a.cmp(&b))
}

/// The row of the query in block `qb` from its block scores: the top
/// `min(top_k, n)` blocks in the total order, those `keep` drops removed,
/// ascending, then `-1` to `out.len()`. `ids` is scratch.
pub fn row(
    scores: &[f32],
    top_k: usize,
    keep: Keep,
    qb: usize,
    ids: &mut Vec<u32>,
    out: &mut [i32],
) {
    let n = scores.len();
    let k = top_k.min(n);
    ids.clear();
    ids.extend(0..n as u32);
    let cmp = |a: &u32, b: &u32| {
        before(
            scores[*a as usize],
            *a as usize,
            scores[*b as usize],
            *b as usize,
        )
    };
    if k < n && k > 0 {
        ids.select_nth_unstable_by(k - 1, cmp);
    }
    ids.truncate(k);
    ids.retain(|&b| match keep {
        Keep::ThroughCurrent => (b as usize) <= qb,
        Keep::BeforeCurrent => (b as usize) < qb,
    });
    ids.sort_unstable();
    out.fill(-1);
    for (o, &b) in out.iter_mut().zip(ids.iter()) {
        *o = b as i32;
    }
}
