//! The rule on hand examples, and on randomised engine-like rows: every row
//! the rule allows (unordered, ties broken any way, scores perturbed inside
//! the tolerance) is accepted; every way of being wrong is reported as such.

use super::*;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn exact(scores: &[f32], row: &[i64], topk: usize) -> RowCheck {
    check_topk_row(scores, None, Tolerance::default(), row, scores.len(), topk)
}

#[test]
fn an_unordered_row_of_the_best_positions_is_correct() {
    let s = [0.5, 3.0, 1.0, 2.0, -1.0];
    assert!(exact(&s, &[3, 1, 2], 3).is_correct());
    assert!(exact(&s, &[1, 2, 3], 3).is_correct());
}

#[test]
fn a_tie_at_the_threshold_may_be_broken_either_way() {
    let s = [1.0, 2.0, 1.0, 1.0];
    for row in [[1, 0], [2, 1], [1, 3]] {
        assert!(exact(&s, &row, 2).is_correct(), "{row:?}");
    }
    // -0.0 and +0.0 are one score.
    assert!(exact(&[0.0, -0.0, -1.0], &[1], 1).is_correct());
}

#[test]
fn a_dropped_candidate_names_the_dropped_and_the_intruder_with_threshold_and_margin() {
    let s = [0.5, 3.0, 1.0, 2.0, -1.0];
    let c = exact(&s, &[1, 3, 0], 3);
    let [Problem::WrongSelection {
        dropped,
        intruders,
        n_dropped,
        n_intruders,
        threshold,
        margin,
    }] = &c.problems[..]
    else {
        panic!("{c:?}");
    };
    assert_eq!(
        (dropped.as_slice(), intruders.as_slice()),
        (&[(2, 1.0)][..], &[(0, 0.5)][..])
    );
    assert_eq!((*n_dropped, *n_intruders), (1, 1));
    assert_eq!(*threshold, 1.0);
    assert_eq!(*margin, 0.5);
}

#[test]
fn structural_faults_are_reported_before_the_selection() {
    let s = [0.0; 6];
    let c = exact(&s, &[0, 0, 1], 3);
    assert_eq!(
        c.problems[0],
        Problem::Duplicate {
            position: 0,
            first: 0,
            slot: 1,
            n_slots: 1
        }
    );
    let c = exact(&s, &[0, 6, 1], 3);
    assert_eq!(
        c.problems[0],
        Problem::NotCausal {
            slot: 1,
            position: 6,
            value: None,
            n_slots: 1,
            context: 6
        }
    );
    let c = exact(&s, &[0, -1, 1], 3);
    assert_eq!(
        c.problems[0],
        Problem::PaddingHole {
            slot: 2,
            position: 1
        }
    );
    let c = exact(&s, &[0, 1, -1], 3);
    assert_eq!(
        c.problems,
        vec![Problem::WrongCount {
            valid: 2,
            expected: 3
        }]
    );
    // A short context: exactly L valid entries, then padding.
    assert!(check_topk_row(&s, None, Tolerance::default(), &[2, 0, 1, -1], 3, 4).is_correct());
}

#[test]
fn nan_ranks_below_every_number_and_no_tolerance_saves_it() {
    let tol = Tolerance {
        atol: 1e30,
        rtol: 0.0,
    };
    let s = [f32::NAN, f32::NEG_INFINITY, 1.0];
    let c = check_topk_row(&s, None, tol, &[2, 0], 3, 2);
    assert!(
        matches!(c.problems[..], [Problem::WrongSelection { .. }]),
        "{c:?}"
    );
    assert!(check_topk_row(&s, None, tol, &[2, 1], 3, 2).is_correct());
    // Two infinities of one sign tie.
    let s = [f32::INFINITY, f32::INFINITY, 0.0];
    assert!(exact(&s, &[1], 1).is_correct() && exact(&s, &[0], 1).is_correct());
}

#[test]
fn the_tolerance_is_atol_plus_rtol_times_the_magnitude_on_both_sides() {
    // s_b - s_a = 0.3; e_a + e_b = 2·(0.1 + 0.05·m).
    let s = [1.0, 1.3, 5.0];
    let row = [2, 0]; // 1 (1.3) left out for 0 (1.0)
    let m = [1.0, 1.0, 1.0];
    let at = |atol, rtol| check_topk_row(&s, Some(&m), Tolerance { atol, rtol }, &row, 3, 2);
    assert!(!at(0.0, 0.0).is_correct());
    assert!(!at(0.1, 0.0).is_correct()); // 0.2 < 0.3
    assert!(at(0.1, 0.05).is_correct()); // 0.3 <= 0.3
    assert!(at(0.0, 0.15).is_correct());
    assert!(!at(0.0, 0.14).is_correct());
}

#[test]
fn the_exact_check_catches_a_threshold_shift_of_a_few_ulps() {
    // vllm#51782's drops moved the threshold by ~1e-4: exact catches it.
    let s = [0.5, 0.5001, 0.9];
    assert!(!exact(&s, &[2, 0], 2).is_correct());
    let tol = Tolerance {
        atol: 1e-3,
        rtol: 0.0,
    };
    assert!(check_topk_row(&s, None, tol, &[2, 0], 3, 2).is_correct());
}

/// An engine emulator: the exact top-k (ties among equals by a random
/// arrival order), rows shuffled, then optionally one bug of a kind.
fn engine_row(rng: &mut ChaCha8Rng, s: &[f32], topk: usize) -> Vec<i64> {
    let mut order: Vec<usize> = (0..s.len()).collect();
    order.shuffle(rng); // arrival order breaks ties
    order.sort_by(|&a, &b| crate::indexer::rank_key(s[b]).cmp(&crate::indexer::rank_key(s[a])));
    let mut row: Vec<i64> = order.iter().take(topk).map(|&t| t as i64).collect();
    row.shuffle(rng);
    row.resize(topk, -1);
    row
}

#[test]
fn engine_rows_are_accepted_and_each_bug_is_reported_as_itself() {
    let mut rng = ChaCha8Rng::seed_from_u64(13);
    for case in 0..3000 {
        let len = rng.random_range(1..60);
        let topk = rng.random_range(1..40);
        // Coarse values: many exact ties (a ReLU's zero plateau too).
        let s: Vec<f32> = (0..len)
            .map(|_| match rng.random_range(0..20) {
                0 => f32::NAN,
                1 => -0.0,
                _ => rng.random_range(-4i32..5).max(0) as f32,
            })
            .collect();
        let row = engine_row(&mut rng, &s, topk);
        let c = exact(&s, &row, topk);
        assert!(c.is_correct(), "case {case}: {s:?} {row:?} {c:?}");
        let m = topk.min(len);
        let mut bad = row.clone();
        let kind = case % 4;
        match kind {
            0 if m >= 2 => bad[1] = bad[0],
            1 => bad[0] = len as i64 + rng.random_range(0..3),
            2 if m >= 2 => {
                bad[0] = -1;
            }
            3 if m < len => {
                // Drop the best selected for the worst unselected, when
                // they are not tied (then the swap is a real error).
                let sel: Vec<usize> = bad[..m].iter().map(|&x| x as usize).collect();
                let best = *sel
                    .iter()
                    .max_by_key(|&&t| crate::indexer::rank_key(s[t]))
                    .unwrap();
                let worst_out = (0..len)
                    .filter(|t| !sel.contains(t))
                    .min_by_key(|&t| crate::indexer::rank_key(s[t]))
                    .unwrap();
                if crate::indexer::rank_key(s[best]) == crate::indexer::rank_key(s[worst_out]) {
                    continue;
                }
                let slot = bad.iter().position(|&x| x as usize == best).unwrap();
                bad[slot] = worst_out as i64;
            }
            _ => continue,
        }
        let c = exact(&s, &bad, topk);
        let ok = match kind {
            0 => matches!(c.problems[0], Problem::Duplicate { slot: 1, .. }),
            1 => matches!(c.problems[0], Problem::NotCausal { slot: 0, .. }),
            2 => matches!(
                c.problems[..],
                [
                    Problem::PaddingHole { slot: 1, .. },
                    Problem::WrongCount { .. }
                ]
            ),
            _ => matches!(
                c.problems[..],
                [Problem::WrongSelection { n_dropped: 1.., .. }]
            ),
        };
        assert!(ok, "case {case} kind {kind}: {s:?} {bad:?} {c:?}");
    }
}

#[test]
fn scores_perturbed_inside_the_tolerance_are_ties_and_outside_are_errors() {
    let mut rng = ChaCha8Rng::seed_from_u64(14);
    let (mut accepted, mut refused) = (0, 0);
    for case in 0..2000 {
        let len = rng.random_range(2..50);
        let topk = rng.random_range(1..len);
        let exact_s: Vec<f32> = (0..len).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let m: Vec<f32> = (0..len).map(|_| rng.random_range(0.5f32..2.0)).collect();
        let tol = Tolerance {
            atol: 1e-3,
            rtol: 1e-2,
        };
        // The engine's scores: each off by at most its bound e_t.
        let engine: Vec<f32> = exact_s
            .iter()
            .zip(&m)
            .map(|(&s, &mt)| {
                let e = (tol.atol + tol.rtol * f64::from(mt)) as f32;
                s + rng.random_range(-0.999f32..0.999) * e
            })
            .collect();
        let row = engine_row(&mut rng, &engine, topk);
        let c = check_topk_row(&exact_s, Some(&m), tol, &row, len, topk);
        assert!(
            c.is_correct(),
            "case {case}: a selection of scores within e_t is a tie: {c:?}"
        );
        accepted += 1;
        // The same row judged exactly is wrong whenever the perturbation
        // reordered the threshold.
        if !exact(&exact_s, &row, topk).is_correct() {
            refused += 1;
        }
    }
    assert!(accepted == 2000 && refused > 100, "{accepted} {refused}");
}

#[test]
fn an_infinite_magnitude_adds_nothing_when_rtol_is_zero() {
    // 0 · inf must not turn the exact check into "anything ties".
    let s = [1.0, 2.0];
    let m = [f32::INFINITY, 1.0];
    let c = check_topk_row(&s, Some(&m), Tolerance::default(), &[0], 2, 1);
    assert!(!c.is_correct(), "{c:?}");
}

#[test]
fn the_position_that_beats_the_selection_is_named_even_below_the_threshold() {
    // Position 0 is the exact top-1 but owed a huge tolerance, so choosing 2
    // over it is fine; choosing 2 over 1 is not: 1 must be named.
    let s = [10.0, 5.0, 1.0];
    let m = [100.0, 0.0, 0.0];
    let tol = Tolerance {
        atol: 0.0,
        rtol: 1.0,
    };
    let c = check_topk_row(&s, Some(&m), tol, &[2], 3, 1);
    let [Problem::WrongSelection {
        dropped, intruders, ..
    }] = &c.problems[..]
    else {
        panic!("{c:?}");
    };
    assert_eq!(
        (dropped.as_slice(), intruders.as_slice()),
        (&[(1, 5.0)][..], &[(2, 1.0)][..])
    );
}

#[test]
fn float64_scores_are_compared_as_given_and_reported_as_their_own_values() {
    let s = [1.0, 1.0 + 2f64.powi(-40), 0.5];
    let c = check_topk_row_values(Values::F64(&s), None, Tolerance::default(), &[0], 3, 1);
    let [Problem::WrongSelection {
        dropped,
        threshold,
        margin,
        ..
    }] = &c.problems[..]
    else {
        panic!("{c:?}");
    };
    assert_eq!(dropped.as_slice(), &[(1, 1.0 + 2f64.powi(-40))][..]);
    assert_eq!(*threshold, 1.0 + 2f64.powi(-40));
    assert_eq!(*margin, 2f64.powi(-40));
    let ok = check_topk_row_values(Values::F64(&s), None, Tolerance::default(), &[1], 3, 1);
    assert!(ok.is_correct());
}

#[test]
fn float64_scores_keep_the_order_nan_lowest_and_negative_zero_equal_to_zero() {
    let s = [f64::NAN, -0.0, 0.0, -1.0];
    let tol = Tolerance::default();
    assert!(check_topk_row_values(Values::F64(&s), None, tol, &[1], 4, 1).is_correct());
    assert!(check_topk_row_values(Values::F64(&s), None, tol, &[2, 1], 4, 2).is_correct());
    assert!(!check_topk_row_values(Values::F64(&s), None, tol, &[0], 4, 1).is_correct());
    // float32 and its float64 widening give the same verdicts.
    let s32 = [3.0f32, 1.5, f32::NAN, 2.0];
    let s64: Vec<f64> = s32.iter().map(|&x| f64::from(x)).collect();
    for row in [[0, 3], [0, 1], [2, 0]] {
        let a = check_topk_row(&s32, None, tol, &row, 4, 2);
        let b = check_topk_row_values(Values::F64(&s64), None, tol, &row, 4, 2);
        assert_eq!(format!("{a:?}"), format!("{b:?}"), "{row:?}");
    }
}

/// transformers' indexers return `min(index_topk, n_entries)` columns: a
/// width below `topk` is accepted when every row's `min(topk, L)` fits it,
/// and refused, naming the first row that could hold more, when one does.
#[test]
fn rows_narrower_than_topk_are_accepted_when_every_rows_visible_count_fits() {
    let scores: Vec<f32> = (0..3 * 8).map(|i| ((i * 7) % 11) as f32).collect();
    let batch = |rows: &'static [i64], lens: &'static [usize]| Batch {
        scores: Values::F32(Box::leak(scores.clone().into_boxed_slice())),
        magnitudes: None,
        n_positions: 8,
        rows,
        width: 4,
        lens,
        global: None,
    };
    // Row 0 sees 2 positions, row 1 four, row 2 three: topk = 16 fits width 4.
    let best = |i: usize, l: usize, k: usize| {
        let mut t: Vec<usize> = (0..l).collect();
        t.sort_by(|&a, &b| scores[i * 8 + b].total_cmp(&scores[i * 8 + a]));
        t.truncate(k);
        t
    };
    let mut rows = vec![-1i64; 12];
    for (i, l) in [2, 4, 3].into_iter().enumerate() {
        for (j, t) in best(i, l, 16).into_iter().enumerate() {
            rows[i * 4 + j] = t as i64;
        }
    }
    let rows: &'static [i64] = Box::leak(rows.into_boxed_slice());
    let out = check_rows(
        &batch(rows, &[2, 4, 3]),
        Rule::Topk(16),
        Tolerance::default(),
    )
    .unwrap();
    assert!(out.iter().all(RowCheck::is_correct), "{out:?}");
    // A short row is still judged: row 1 sees 4 positions and holds 3.
    let mut short = rows.to_vec();
    short[4 + 3] = -1;
    let short: &'static [i64] = Box::leak(short.into_boxed_slice());
    let out = check_rows(
        &batch(short, &[2, 4, 3]),
        Rule::Topk(16),
        Tolerance::default(),
    )
    .unwrap();
    assert!(out[0].is_correct() && out[2].is_correct(), "{out:?}");
    assert_eq!(
        out[1].problems,
        [Problem::WrongCount {
            valid: 3,
            expected: 4
        }]
    );
    // Row 1 sees 5 positions: it could hold 5, the rows hold 4.
    let err = check_rows(
        &batch(rows, &[2, 5, 3]),
        Rule::Topk(16),
        Tolerance::default(),
    )
    .unwrap_err();
    assert_eq!(
        err,
        crate::error::ArgumentError::Invalid {
            argument: "topk",
            message: "the rule selects up to 16 but rows hold 4 slots: row 1 selects \
                      min(topk, context_lens[1] = 5) = 5"
                .into(),
        }
    );
    // A topk of 5 with rows that see 8: refused at row 0.
    let err = check_rows(
        &batch(rows, &[8, 8, 8]),
        Rule::Topk(5),
        Tolerance::default(),
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("row 0 selects min(topk, context_lens[0] = 8) = 5"),
        "{err}"
    );
    // Blocks still need the config's width, whatever a row sees.
    let cfg = BlockSparseConfig {
        top_blocks: 16,
        ..BlockSparseConfig::default()
    };
    let err = check_rows(
        &batch(rows, &[2, 4, 3]),
        Rule::Blocks(cfg),
        Tolerance::default(),
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("the rule selects up to 16 but rows hold 4 slots"),
        "{err}"
    );
    assert!(!err.to_string().contains("selects min"), "{err}");
}

/// vLLM's and SGLang's DSA candidate-block selectors write `-1` for a block
/// whose scores are all `-inf`: such a candidate is not selectable, and does
/// not count toward `min(topk, L)`.
#[test]
fn minus_inf_is_not_selectable_and_does_not_count_toward_the_row() {
    let ninf = f32::NEG_INFINITY;
    let s = [3.0, ninf, 1.0, ninf, 2.0];
    // Three selectable candidates, topk 4: the row holds the three, then -1.
    assert!(exact(&s, &[0, 4, 2, -1], 4).is_correct());
    assert!(exact(&s, &[2, 0, 4, -1], 4).is_correct());
    // Holding a -inf candidate besides them: one entry too many.
    assert_eq!(
        exact(&s, &[0, 4, 2, 1], 4).problems,
        [Problem::WrongCount {
            valid: 4,
            expected: 3
        }]
    );
    // A -inf candidate instead of a finite one: a wrong selection.
    let c = exact(&s, &[0, 4, 1, -1], 4);
    let [Problem::WrongSelection {
        dropped, intruders, ..
    }] = &c.problems[..]
    else {
        panic!("{c:?}");
    };
    assert_eq!(dropped.as_slice(), &[(2, 1.0)]);
    assert_eq!(intruders.as_slice(), &[(1, f64::NEG_INFINITY)]);
    // Omitting a finite candidate: too few entries.
    assert_eq!(
        exact(&s, &[0, 4, -1, -1], 4).problems,
        [Problem::WrongCount {
            valid: 2,
            expected: 3
        }]
    );
    // A row whose candidates are all -inf selects nothing.
    assert!(exact(&[ninf; 3], &[-1, -1], 2).is_correct());
    assert_eq!(
        exact(&[ninf; 3], &[0, -1], 2).problems,
        [Problem::WrongCount {
            valid: 1,
            expected: 0
        }]
    );
    // With more selectable candidates than topk, -inf changes nothing.
    assert!(exact(&s, &[0, 4], 2).is_correct());
    // float64 scores alike, and through the batch entry point.
    let s64 = [3.0, f64::NEG_INFINITY, 1.0, f64::NEG_INFINITY, 2.0];
    let row = [0, 4, 2, -1];
    let c = check_topk_row_values(Values::F64(&s64), None, Tolerance::default(), &row, 5, 4);
    assert!(c.is_correct(), "{c:?}");
    let b = Batch {
        scores: Values::F32(&s),
        magnitudes: None,
        n_positions: 5,
        rows: &row,
        width: 4,
        lens: &[5],
        global: None,
    };
    let out = check_rows(&b, Rule::Topk(4), Tolerance::default()).unwrap();
    assert!(out[0].is_correct(), "{out:?}");
}
