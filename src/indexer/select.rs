//! A row's selection from its scores: the one total order (descending
//! score, NaN last, `-0.0 == +0.0`, ties to the lower position), exact
//! whatever the scores look like — a plateau of tens of thousands of equal
//! scores included, where histogram top-k kernels have gone wrong: each
//! candidate is one `u64` (the score's rank key, then the position
//! reversed), all distinct, so a partial select on them is the order itself.

use crate::pool;
use crate::witness;

/// A score's place in the total order, as an integer that sorts the same
/// way: NaN lowest (0), then every number by value, `-0.0 == +0.0`.
#[inline]
pub(crate) fn rank_key(score: f32) -> u32 {
    if score.is_nan() {
        return 0;
    }
    let b = (score + 0.0).to_bits();
    if b >> 31 == 1 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// Key `t`'s candidate: larger is better (the rank key, then the lower
/// position). Positions are `< 2^31` (checked by every entry point).
#[inline]
pub(super) fn candidate(score: f32, t: usize) -> u64 {
    ((rank_key(score) as u64) << 32) | (u32::MAX - t as u32) as u64
}

/// A row selected in parallel parts when it is at least this long (a
/// decode's single long row; a group's rows go in parallel instead).
const SPLIT_LEN: usize = 1 << 15;

/// How a row is filled and laid out besides its scores: forced entries and
/// the output layout ([`super::IndexerOptions`]).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct RowRule {
    /// The first `force_first` visible positions are members of any row
    /// that cannot hold every visible position.
    pub force_first: usize,
    /// The last `force_last` visible positions, likewise.
    pub force_last: usize,
    /// Ascending and compact (cuDNN's layout) instead of rank order.
    pub ascending: bool,
    /// Entries per block of the score pool (1: no pool; the row then holds
    /// block ids, forced entries counting blocks).
    pub pool: usize,
    /// How a block of the pool is scored.
    pub score: super::ScoreType,
}

/// Where [`select_row`] looks for a row's candidates.
#[derive(Debug, Clone, Copy)]
pub(super) enum Search<'a> {
    /// Every position, on this thread.
    Whole,
    /// Every position, the row cut into parallel parts when it is long
    /// (each part's best, then the best of those — the same set, since
    /// every part keeps all of its members that could be in the row's top).
    Parts,
    /// Only these positions: the caller has shown that no other can be in
    /// the row's top, nor change what `refine` makes of it (the AMX
    /// screen's survivors, `super::screen`).
    Among(&'a [usize]),
}

/// The row of `len` scores (`score(t)`, `t < len`): the top `topk` (or
/// `topk − S` with witnesses) in rank order, then `-1`, then the witnesses.
/// With forced entries (`rule`) and `len` above the budget, the first
/// `force_first` and last `force_last` positions are members and the rest of
/// the budget is the best of the positions between them; a row whose `len`
/// fits the budget holds every position (each once). The members are listed
/// in the one total order of their float32 scores, forced ones included;
/// with `rule.ascending`, by position instead, compact, then `-1`.
/// `search` says where the candidates are looked for ([`Search`]).
/// `refine(top, lo, hi)` then makes the float32 candidates (positions `lo ..
/// hi`) the real-arithmetic top-k ([`super::exact::refine`]).
#[allow(clippy::too_many_arguments)]
pub(super) fn select_row(
    score: impl Fn(usize) -> f32 + Sync,
    len: usize,
    topk: usize,
    num_segments: usize,
    rule: RowRule,
    out: &mut [i32],
    search: Search<'_>,
    refine: impl FnOnce(&mut Vec<u64>, usize, usize),
) {
    let take = topk.saturating_sub(num_segments).min(len);
    // Forced entries matter only when the budget is short of the row (else
    // every position is a member): a prefix and a suffix, disjoint then
    // (`force_first + force_last <= topk − S`, checked by every entry point;
    // clamped here all the same).
    let (f0, f1) = match take < len {
        true => {
            let f0 = rule.force_first.min(take);
            (f0, rule.force_last.min(take - f0))
        }
        false => (0, 0),
    };
    let (lo, hi, rest) = (f0, len - f1, take - f0 - f1);
    let threads = pool::num_threads();
    let mut top = match search {
        _ if rest == 0 => Vec::new(), // all witnesses or forced entries (or nothing): no candidate can be kept
        Search::Among(ts) => {
            let top = best(
                ts.iter()
                    .filter(|t| (lo..hi).contains(t))
                    .map(|&t| candidate(score(t), t))
                    .collect(),
                rest,
            );
            // The caller's positions hold the row: at least `rest` of them.
            debug_assert_eq!(top.len(), rest);
            top
        }
        Search::Parts if threads > 1 && hi - lo >= SPLIT_LEN && hi - lo >= 4 * rest => {
            // `threads` whole parts (the pool counts whole ones) and a remainder.
            best_in_parts(&score, lo, hi, rest, (hi - lo) / threads)
        }
        _ => best((lo..hi).map(|t| candidate(score(t), t)).collect(), rest),
    };
    refine(&mut top, lo, hi);
    if f0 + f1 > 0 {
        top.extend((0..lo).chain(hi..len).map(|t| candidate(score(t), t)));
        top.sort_unstable_by(|a, b| b.cmp(a));
    }
    out.fill(-1);
    for (slot, &c) in out.iter_mut().zip(top.iter()) {
        *slot = (u32::MAX - c as u32) as i32;
    }
    if num_segments > 0 {
        // `len <= i32::MAX` (checked); one row of the serving entry point.
        let lens = [len as i32];
        let merged = witness::scatter_topology_witnesses(out, topk, &lens, num_segments);
        // Unreachable: every entry point refused S > 64, and this is one row of `topk`.
        assert!(
            merged.is_ok(),
            "witness merge refused a checked row: {merged:?}"
        );
    }
    if rule.ascending {
        ascending(out);
    }
}

/// The row's entries (`>= 0`) ascending and compact, then `-1`: cuDNN's
/// `indexer_topk` layout (its `topk_length` is the count of entries).
pub(super) fn ascending(row: &mut [i32]) {
    let mut n = 0;
    for i in 0..row.len() {
        if row[i] >= 0 {
            row[n] = row[i];
            n += 1;
        }
    }
    row[..n].sort_unstable();
    row[n..].fill(-1);
}

/// The `take` largest candidates, largest first.
fn best(mut cand: Vec<u64>, take: usize) -> Vec<u64> {
    if take > 0 && take < cand.len() {
        cand.select_nth_unstable_by(take - 1, |a, b| b.cmp(a));
    }
    cand.truncate(take);
    cand.sort_unstable_by(|a, b| b.cmp(a));
    cand
}

/// [`best`] of the candidates of positions `lo .. hi`, built and reduced in
/// parts of `part` keys across the pool: each part's `take` best, then the
/// best of those.
fn best_in_parts(
    score: &(impl Fn(usize) -> f32 + Sync),
    lo: usize,
    hi: usize,
    take: usize,
    part: usize,
) -> Vec<u64> {
    let mut cand = vec![0u64; hi - lo];
    pool::for_each_row_mut(&mut cand, part, 1, |p, run| {
        for (r, c) in run.iter_mut().enumerate() {
            let t = lo + p * part + r;
            *c = candidate(score(t), t);
        }
        if take > 0 && take < run.len() {
            run.select_nth_unstable_by(take - 1, |a, b| b.cmp(a));
        }
    });
    let kept: Vec<u64> = cand
        .chunks(part)
        .flat_map(|run| run[..take.min(run.len())].iter().copied())
        .collect();
    best(kept, take)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Cutting a row into parts (each part's best, then the best of those)
    /// gives exactly the whole row's best, on rows of a few tied values, NaN
    /// and signed zeros included, with ties straddling every part boundary.
    #[test]
    fn selecting_in_parts_equals_selecting_the_whole_row() {
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move |m: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % m
        };
        let values = [1.0f32, 0.0, -0.0, 2.0, f32::NAN, -1.0, 2.0, 1.0];
        for trial in 0..200 {
            let len = 1 + next(3000) as usize;
            let distinct = 1 + next(values.len() as u64) as usize;
            let row: Vec<f32> = (0..len)
                .map(|_| values[next(distinct as u64) as usize])
                .collect();
            let take = next(len as u64 + 1) as usize;
            let part = 1 + next(len as u64) as usize;
            let whole = best((0..len).map(|t| candidate(row[t], t)).collect(), take);
            let parts = best_in_parts(&|t| row[t], 0, len, take, part);
            assert_eq!(
                whole, parts,
                "trial {trial}: len {len} take {take} part {part}"
            );
        }
    }

    /// Forced entries: a row short of its context holds the first `f0` and
    /// last `f1` positions and the best of the rest (by the total order),
    /// every member once, listed in the total order (or ascending); a row
    /// whose context fits the budget holds every position. Cut into parallel
    /// parts or not, or searched among its members and some others, the
    /// same row.
    #[test]
    fn forced_entries_are_members_inside_the_budget_in_every_layout() {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move |m: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % m
        };
        let values = [1.0f32, 0.0, -0.0, 2.0, f32::NAN, -1.0, 3.0];
        for trial in 0..400 {
            let len = next(200) as usize;
            let row: Vec<f32> = (0..len).map(|_| values[next(7) as usize]).collect();
            let topk = 1 + next(40) as usize;
            let f0 = next(topk as u64 + 1) as usize;
            let f1 = next((topk - f0) as u64 + 1) as usize;
            let rule = |ascending| RowRule {
                force_first: f0,
                force_last: f1,
                ascending,
                pool: 1,
                score: Default::default(),
            };
            let mut want: Vec<usize> = if len <= topk {
                (0..len).collect()
            } else {
                let mut mid: Vec<usize> = (f0..len - f1).collect();
                mid.sort_by_key(|&t| std::cmp::Reverse(candidate(row[t], t)));
                let mut m: Vec<usize> = (0..f0).chain(len - f1..len).collect();
                m.extend(&mid[..topk - f0 - f1]);
                m
            };
            want.sort_by_key(|&t| std::cmp::Reverse(candidate(row[t], t)));
            if len > topk {
                // The middle's best in parallel parts (a long row's path), offset by `f0`.
                let (lo, hi, rest) = (f0, len - f1, topk - f0 - f1);
                let whole = best((lo..hi).map(|t| candidate(row[t], t)).collect(), rest);
                let part = 1 + next((hi - lo) as u64) as usize;
                assert_eq!(best_in_parts(&|t| row[t], lo, hi, rest, part), whole);
            }
            // The row's members and any others: a search among them finds
            // the same row.
            let mut among: Vec<usize> = want.clone();
            among.extend((0..len).filter(|_| next(3) == 0));
            among.sort_unstable();
            among.dedup();
            for search in [Search::Whole, Search::Parts, Search::Among(&among)] {
                let mut out = vec![7i32; topk];
                select_row(
                    |t| row[t],
                    len,
                    topk,
                    0,
                    rule(false),
                    &mut out,
                    search,
                    |_, _, _| {},
                );
                let got: Vec<usize> = out
                    .iter()
                    .filter(|&&x| x >= 0)
                    .map(|&x| x as usize)
                    .collect();
                assert_eq!(
                    got, want,
                    "trial {trial}: len {len} topk {topk} f0 {f0} f1 {f1}"
                );
                assert!(out[got.len()..].iter().all(|&x| x == -1));
                let mut asc = vec![7i32; topk];
                select_row(
                    |t| row[t],
                    len,
                    topk,
                    0,
                    rule(true),
                    &mut asc,
                    search,
                    |_, _, _| {},
                );
                let mut sorted = want.clone();
                sorted.sort_unstable();
                let got: Vec<usize> = asc[..sorted.len()].iter().map(|&x| x as usize).collect();
                assert_eq!(got, sorted, "trial {trial}: ascending");
                assert!(asc[sorted.len()..].iter().all(|&x| x == -1));
            }
        }
    }
}
