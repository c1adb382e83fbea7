//! Fillers: how an engine fills a short row (past-context entries,
//! repeats), and each filler rule against the default on random rows.

use super::*;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn filled(scores: &[f32], row: &[i64], len: usize, topk: usize, filler: Filler) -> RowCheck {
    let tol = Tolerance::default();
    check_topk_row_with(Values::F32(scores), None, tol, row, len, topk, filler)
}

#[test]
fn past_context_filler_ignores_future_and_negative_entries_wherever_they_sit() {
    let s = [1.0, 3.0, 2.0, 0.0, 9.0, 9.0, 9.0, 9.0];
    // L = 4, topk = 8: the 4 positions, future positions (and a -1) between them.
    let row = [5, 1, 7, 0, -1, 2, 4, 3];
    assert!(filled(&s, &row, 4, 8, Filler::PastContext).is_correct());
    // The default rule reports them: once, with the count and the context.
    let c = filled(&s, &row, 4, 8, Filler::MinusOne);
    let causal: Vec<_> = c
        .problems
        .iter()
        .filter(|p| p.reason() == "not_causal")
        .collect();
    assert_eq!(
        causal,
        [&Problem::NotCausal {
            slot: 0,
            position: 5,
            value: None,
            n_slots: 3,
            context: 4
        }]
    );
    // Filler never excuses a missing position or a wrong selection.
    let c = filled(&s, &[5, 1, 7, 0, -1, 2, 4, 6], 4, 8, Filler::PastContext);
    assert_eq!(
        c.problems,
        [Problem::WrongCount {
            valid: 3,
            expected: 4
        }]
    );
    let c = filled(&s, &[5, 1, 0, 3], 4, 2, Filler::PastContext);
    assert_eq!(
        c.problems,
        [Problem::WrongCount {
            valid: 3,
            expected: 2
        }]
    );
    let c = filled(&s, &[5, 1, 0, -1], 4, 2, Filler::PastContext);
    assert_eq!(c.problems[0].reason(), "wrong_selection");
}

#[test]
fn repeat_filler_ignores_repeats_of_earlier_entries_but_counts_distinct_ones() {
    let s = [1.0, 3.0, 2.0];
    // L = 3, topk = 6: the 3 positions, then the first repeated.
    assert!(filled(&s, &[1, 0, 2, 1, 1, 1], 3, 6, Filler::Repeat).is_correct());
    assert!(filled(&s, &[1, 1, 0, 2, 0, -1], 3, 6, Filler::Repeat).is_correct());
    // The default rule: one duplicate problem for the row, with its count.
    let c = filled(&s, &[1, 0, 2, 1, 1, 1], 3, 6, Filler::MinusOne);
    assert_eq!(
        c.problems[0],
        Problem::Duplicate {
            position: 1,
            first: 0,
            slot: 3,
            n_slots: 3
        }
    );
    // A row that repeats instead of selecting is short of distinct entries.
    let c = filled(&s, &[1, 1, 1, 1], 3, 2, Filler::Repeat);
    assert_eq!(
        c.problems,
        [Problem::WrongCount {
            valid: 1,
            expected: 2
        }]
    );
    // A repeat is no licence for a future position or a hole.
    let c = filled(&s, &[1, 0, 2, 3], 3, 4, Filler::Repeat);
    assert_eq!(c.problems[0].reason(), "not_causal");
    let c = filled(&s, &[1, -1, 0, 2], 3, 4, Filler::Repeat);
    assert_eq!(c.problems[0].reason(), "padding_hole");
}

#[test]
fn every_filler_rule_accepts_what_the_default_accepts_on_random_rows() {
    let mut rng = ChaCha8Rng::seed_from_u64(22);
    for case in 0..300 {
        let t = rng.random_range(1..40usize);
        let len = rng.random_range(1..=t);
        let topk = rng.random_range(1..20usize);
        let scores: Vec<f32> = (0..t).map(|_| rng.random_range(0..5) as f32).collect();
        let mut order: Vec<usize> = (0..len).collect();
        order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
        let k = topk.min(len);
        let mut row: Vec<i64> = order[..k].iter().map(|&p| p as i64).collect();
        row.shuffle(&mut rng);
        let mut padded = row.clone();
        padded.resize(topk, -1);
        // The "-1" row passes every rule.
        for f in [Filler::MinusOne, Filler::PastContext, Filler::Repeat] {
            assert!(
                filled(&scores, &padded, len, topk, f).is_correct(),
                "case {case} {f:?}"
            );
        }
        // Each engine's own filler passes its rule, and the default names it.
        let mut future = row.clone();
        while future.len() < topk {
            let at = rng.random_range(0..=future.len());
            future.insert(at, rng.random_range(len as i64..len as i64 + 50));
        }
        let mut repeat = row.clone();
        while repeat.len() < topk {
            repeat.push(row[rng.random_range(0..row.len())]);
        }
        assert!(filled(&scores, &future, len, topk, Filler::PastContext).is_correct());
        assert!(filled(&scores, &repeat, len, topk, Filler::Repeat).is_correct());
        if topk > len {
            let c = filled(&scores, &future, len, topk, Filler::MinusOne);
            assert!(
                matches!(c.problems[..], [Problem::NotCausal { n_slots, context, .. }, ..]
                    if n_slots == topk - len && context == len),
                "case {case}: {c:?}"
            );
            let c = filled(&scores, &repeat, len, topk, Filler::MinusOne);
            assert!(
                matches!(c.problems[..], [Problem::Duplicate { n_slots, .. }, ..]
                    if n_slots == topk - len),
                "case {case}: {c:?}"
            );
        }
    }
}

#[test]
fn filler_names_round_trip_and_unknown_ones_are_none() {
    for name in Filler::NAMES {
        assert_eq!(Filler::from_name(name).map(Filler::name), Some(name));
    }
    assert_eq!(Filler::from_name("pad"), None);
    assert_eq!(Filler::default(), Filler::MinusOne);
}
