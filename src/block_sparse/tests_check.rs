//! The block rule: hand examples pinned exactly, and randomised engine-like
//! rows (the rule's own rows always pass; each bug is reported as itself).

use super::check::check_block_row;
use super::{block_scores_into, select_batch_into, BlockSparseConfig};
use crate::check::{Problem, RowCheck, Tolerance};
use crate::keys::Encoded;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn cfg(top: usize, init: usize, local: usize) -> BlockSparseConfig {
    BlockSparseConfig::new(4, top, init, local).unwrap()
}

fn blocks(scores: &[f32], row: &[i64], cfg: &BlockSparseConfig) -> RowCheck {
    check_block_row(scores, None, Tolerance::default(), row, scores.len(), cfg)
}

#[test]
fn a_block_row_holds_the_forced_blocks_and_the_best_free_ones_in_any_order() {
    // Six blocks; 0 (init) and 5 (local) forced, one free slot: block 2.
    let s = [9.0, 1.0, 5.0, 3.0, 2.0, -7.0];
    let c = cfg(3, 1, 1);
    assert!(blocks(&s, &[5, 0, 2], &c).is_correct());
    assert!(blocks(&s, &[2, 5, 0], &c).is_correct());
    // The forced blocks' own scores never enter the comparison: block 5
    // scores lowest of all and is still right.
    let r = blocks(&s, &[0, 5, 3], &c);
    let [Problem::WrongSelection {
        dropped,
        intruders,
        threshold,
        margin,
        ..
    }] = &r.problems[..]
    else {
        panic!("{r:?}")
    };
    assert_eq!(
        (&dropped[..], &intruders[..]),
        (&[(2, 5.0)][..], &[(3, 3.0)][..])
    );
    assert_eq!((*threshold, *margin), (5.0, 2.0));
}

#[test]
fn a_missing_forced_block_and_a_broken_budget_are_named() {
    let s = [9.0, 1.0, 5.0, 3.0, 2.0, -7.0];
    let c = cfg(3, 1, 1);
    assert_eq!(
        blocks(&s, &[0, 2, 3], &c).problems,
        vec![Problem::MissingForced {
            blocks: vec![5],
            n_missing: 1
        }]
    );
    assert_eq!(
        blocks(&s, &[0, 5, 2, 3], &c).problems,
        vec![Problem::WrongCount {
            valid: 4,
            expected: 3
        }]
    );
    // Fewer blocks than the budget: every block, forced or not.
    assert!(blocks(&s[..2], &[1, 0, -1], &c).is_correct());
    assert_eq!(
        blocks(&s[..2], &[0, 2, -1], &c).problems[0],
        Problem::NotCausal {
            slot: 1,
            position: 2,
            value: None,
            n_slots: 1,
            context: 2
        }
    );
}

#[test]
fn block_scores_are_the_maxima_selection_ranks_and_its_rows_always_pass() {
    let mut rng = ChaCha8Rng::seed_from_u64(31);
    for case in 0..200 {
        let (d, h) = (rng.random_range(1..9), rng.random_range(1..4));
        let n_keys = rng.random_range(1..90);
        let n_q = rng.random_range(1..6);
        let c = BlockSparseConfig::new(
            rng.random_range(1..9),
            rng.random_range(1..6),
            rng.random_range(0..3),
            rng.random_range(0..3),
        )
        .unwrap();
        // Integer values: many exact ties, every dot product exact.
        let k: Vec<f32> = (0..n_keys * d)
            .map(|_| rng.random_range(-2i32..3) as f32)
            .collect();
        let q: Vec<f32> = (0..n_q * h * d)
            .map(|_| rng.random_range(-2i32..3) as f32)
            .collect();
        let pos: Vec<usize> = (0..n_q).map(|_| rng.random_range(0..n_keys + 5)).collect();
        let nb_all = n_keys.div_ceil(c.block_size);
        let mut sc = vec![0f32; n_q * h * nb_all];
        block_scores_into(
            Encoded::F32(&q),
            n_q,
            h,
            Encoded::F32(&k),
            d,
            &pos,
            &c,
            false,
            &mut sc,
        )
        .unwrap();
        let w = c.width();
        let mut rows = vec![0i32; n_q * h * w];
        select_batch_into(&q, n_q, h, &k, d, &pos, &c, &mut rows).unwrap();
        for (i, &p) in pos.iter().enumerate() {
            let vis = (p + 1).min(n_keys);
            let nb = vis.div_ceil(c.block_size);
            for j in 0..h {
                let r = i * h + j;
                let scores = &sc[r * nb_all..(r + 1) * nb_all];
                for (b, &got) in scores.iter().enumerate() {
                    let want = (b * c.block_size..((b + 1) * c.block_size).min(vis))
                        .map(|t| (0..d).map(|x| q[r * d + x] * k[t * d + x]).sum::<f32>())
                        .fold(f32::NEG_INFINITY, f32::max);
                    if b < nb {
                        assert_eq!(got, want + 0.0, "case {case} row {r} block {b}");
                    } else {
                        assert!(got.is_nan(), "case {case}: past the visible blocks");
                    }
                }
                let mut row: Vec<i64> =
                    rows[r * w..(r + 1) * w].iter().map(|&x| x.into()).collect();
                let n_valid = row.iter().filter(|&&x| x >= 0).count();
                row[..n_valid].shuffle(&mut rng);
                let v = blocks(&scores[..nb], &row, &c);
                assert!(v.is_correct(), "case {case}: {row:?} {v:?}");
            }
        }
    }
}
