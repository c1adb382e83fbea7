//! Blocks, witnesses and global slot ids: hand examples pinned exactly, and
//! randomised engine-like rows (the rule's own rows always pass; each bug is
//! reported as itself).

use super::*;
use crate::block_sparse::{block_scores_into, select_batch_into};
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

#[test]
fn the_witness_rule_is_equality_and_each_broken_contract_is_named() {
    // L = 16, S = 4: segments of 4 with edges 0, 4, 8, 12. The learned row
    // covers segments 1 and 2 (tokens 5, 9); keep = 8 - 4 = 4, so the
    // witnesses 0 and 12 land in slots 4 and 5.
    let before = [5, 9, -1, -1, -1, -1, -1, -1];
    let lens = [16];
    let mut rule = before;
    crate::witness::scatter_topology_witnesses(&mut rule, 8, &lens, 4).unwrap();
    assert_eq!(rule, [5, 9, -1, -1, 0, 12, -1, -1]);
    let check = |after: &[i32]| check_witness_rows(&before, after, 8, &lens, 4).unwrap();
    assert!(check(&rule)[0].is_correct());
    let why = |after: &[i32]| match &check(after)[0].problems[..] {
        [Problem::WrongWitness { why, slot, .. }, ..] => (*slot, *why),
        p => panic!("{p:?}"),
    };
    assert_eq!(
        why(&[5, 9, -1, -1, 12, 0, -1, -1]),
        (
            4,
            "a witness in the wrong slot (the run must ascend by segment)"
        )
    );
    assert_eq!(
        why(&[5, 9, -1, -1, 4, 12, -1, -1]),
        (4, "the edge of a segment the learned row already covers")
    );
    assert_eq!(
        why(&[5, 9, -1, -1, -1, 12, -1, -1]),
        (4, "not written: the learned entry is still there")
    );
    assert_eq!(
        why(&[5, 9, -1, -1, 0, 13, -1, -1]),
        (5, "not a segment's left edge")
    );
    assert_eq!(why(&[5, 9, -1, -1, 0, 16, -1, -1]), (5, "past the context"));
    assert_eq!(
        check(&[6, 9, -1, -1, 0, 12, -1, -1])[0].problems,
        vec![Problem::PrefixChanged {
            slot: 0,
            learned: 5,
            got: 6,
            n_changed: 1
        }]
    );
    assert_eq!(
        check(&[5, 9, -1, -1, 0, 12, 3, -1])[0].problems,
        vec![Problem::TailChanged {
            slot: 6,
            learned: -1,
            got: 3,
            n_changed: 1
        }]
    );
    // A refused buffer is refused, not judged.
    assert!(check_witness_rows(&before, &rule[..7], 8, &lens, 4).is_err());
    assert!(check_witness_rows(&before, &rule, 8, &lens, 65).is_err());
    // Every row needs its length, the off switch included: none is read past
    // the buffer, none is left unjudged.
    assert!(check_witness_rows(&before, &before, 8, &[16, 3], 0).is_err());
    assert!(check_witness_rows(&before, &rule, 8, &[], 0).is_err());
}

/// Row-relative `rows` as vLLM writes them: global slots through a block
/// table (`stride` rows per page), prefill rows offset into a workspace.
fn to_global(rows: &[i64], w: usize, g: &GlobalSlots<'_>) -> Vec<i64> {
    rows.chunks(w)
        .enumerate()
        .flat_map(|(i, row)| {
            let prefill = g
                .prefill_req_ids
                .and_then(|p| usize::try_from(p[i]).ok())
                .map(|r| g.workspace_starts[r]);
            let r = g.req_ids[i];
            row.iter()
                .map(move |&t| match (t, prefill) {
                    (t, _) if t < 0 => t,
                    (t, Some(start)) => start + t,
                    (t, None) => {
                        let (b, off) = (t as usize / g.block_size, t as usize % g.block_size);
                        i64::from(g.block_table[r * g.max_blocks + b]) * g.stride as i64
                            + off as i64
                    }
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn global_slot_rows_read_back_to_the_row_relative_verdicts() {
    let mut rng = ChaCha8Rng::seed_from_u64(32);
    for case in 0..300 {
        let (bs, n_req, max_blocks) = (rng.random_range(1..6), rng.random_range(1..4), 6);
        let stride = bs + rng.random_range(0..3);
        let mut pages: Vec<i32> = (0..(n_req * max_blocks) as i32).collect();
        pages.shuffle(&mut rng);
        let n_rows = rng.random_range(1..8);
        let req_ids: Vec<usize> = (0..n_rows).map(|_| rng.random_range(0..n_req)).collect();
        let prefill: Vec<i64> = (0..n_rows)
            .map(|_| {
                if rng.random_bool(0.3) {
                    rng.random_range(0..2)
                } else {
                    -1
                }
            })
            .collect();
        let starts = [rng.random_range(0..100), rng.random_range(100..200)];
        let g = GlobalSlots {
            block_table: &pages,
            max_blocks,
            block_size: bs,
            stride,
            req_ids: &req_ids,
            prefill_req_ids: Some(&prefill),
            workspace_starts: &starts,
            dcp_size: 1,
            dcp_interleave: 1,
        };
        let t = bs * max_blocks;
        let topk = rng.random_range(1..6);
        let lens: Vec<usize> = (0..n_rows).map(|_| rng.random_range(1..t + 1)).collect();
        let scores: Vec<f32> = (0..n_rows * t)
            .map(|_| rng.random_range(0i32..4) as f32)
            .collect();
        // Engine-like rows: right ones, and some with a bug.
        let mut rows = vec![-1i64; n_rows * topk];
        for i in 0..n_rows {
            let mut order: Vec<usize> = (0..lens[i]).collect();
            order.shuffle(&mut rng);
            order.sort_by(|&a, &b| scores[i * t + b].total_cmp(&scores[i * t + a]));
            for (slot, &p) in order.iter().take(topk).enumerate() {
                rows[i * topk + slot] = p as i64;
            }
            if rng.random_bool(0.3) {
                // Any position the table holds (future ones included).
                rows[i * topk] = rng.random_range(0..t as i64);
            }
        }
        let mut global = to_global(&rows, topk, &g);
        let batch = |rows: &[i64], global: Option<GlobalSlots<'_>>| {
            let b = Batch {
                scores: Values::F32(&scores),
                magnitudes: None,
                n_positions: t,
                rows,
                width: topk,
                lens: &lens,
                global,
            };
            check_rows(&b, Rule::Topk(topk), Tolerance::default()).unwrap()
        };
        let relative = batch(&rows, None);
        // Read back through the layout, the verdicts are the row-relative
        // ones, and a future position also names the slot id the engine wrote.
        let mut mapped = batch(&global, Some(g));
        for (r, row) in mapped.iter_mut().enumerate() {
            for p in row.problems.iter_mut() {
                if let Problem::NotCausal { slot, value, .. } = p {
                    assert_eq!(*value, Some(global[r * topk + *slot]), "case {case}");
                    *value = None;
                }
            }
        }
        assert_eq!(mapped, relative, "case {case}");
        // A decode row's slot on a page of another request, or in the gap
        // between pages, names no position of the row.
        if let Some(i) = (0..n_rows).find(|&i| prefill[i] < 0 && rows[i * topk] >= 0) {
            let foreign = (0..n_req * max_blocks)
                .find(|&p| !pages[req_ids[i] * max_blocks..][..max_blocks].contains(&(p as i32)));
            let bad = match foreign {
                Some(p) => p as i64 * stride as i64,
                None if stride > bs => bs as i64, // offset past page 0's tokens
                None => continue,
            };
            global[i * topk] = bad;
            let c = &batch(&global, Some(g))[i];
            assert!(
                c.problems.contains(&Problem::NotInTable {
                    slot: 0,
                    value: bad
                }),
                "case {case}: {c:?}"
            );
        }
    }
}

#[test]
fn dcp_ranks_rows_side_by_side_read_back_to_the_whole_selection() {
    let mut rng = ChaCha8Rng::seed_from_u64(33);
    let mut seen = [0usize; 2]; // wrong, correct verdicts
    for case in 0..300 {
        let (size, il) = (rng.random_range(2..4), rng.random_range(1..4));
        let (bs, max_blocks, n_req) = (rng.random_range(1..5), 8, rng.random_range(1..3));
        let stride = bs + rng.random_range(0..2);
        // One shuffled table per rank: [size, n_req, max_blocks].
        let mut pages: Vec<i32> = Vec::new();
        for _ in 0..size {
            let mut p: Vec<i32> = (0..(n_req * max_blocks) as i32).collect();
            p.shuffle(&mut rng);
            pages.extend(p);
        }
        let n_rows = rng.random_range(1..6);
        let req_ids: Vec<usize> = (0..n_rows).map(|_| rng.random_range(0..n_req)).collect();
        let t = size * il * ((bs * max_blocks) / il).max(1);
        let t = t.min(size * bs * max_blocks); // every token's local slot fits its table
        let topk = rng.random_range(1..6);
        let lens: Vec<usize> = (0..n_rows).map(|_| rng.random_range(1..t + 1)).collect();
        let scores: Vec<f32> = (0..n_rows * t)
            .map(|_| rng.random_range(0i32..4) as f32)
            .collect();
        let compact = rng.random_bool(0.5);
        let mut rows = vec![-1i64; n_rows * topk];
        let mut ranked = vec![-1i64; n_rows * size * topk];
        for i in 0..n_rows {
            let mut order: Vec<usize> = (0..lens[i]).collect();
            order.shuffle(&mut rng);
            order.sort_by(|&a, &b| scores[i * t + b].total_cmp(&scores[i * t + a]));
            let best: Vec<usize> = order.into_iter().take(topk).collect();
            let bug = rng.random_bool(0.2);
            for (slot, &p) in best.iter().enumerate() {
                rows[i * topk + slot] = p as i64;
                if bug && slot == 0 {
                    continue; // this rank drops the row's first token
                }
                // vLLM's converter on the owning rank: its local slot,
                // through its own table.
                let rank = (p / il) % size;
                let local = (p / (size * il)) * il + p % il;
                let page = pages[(rank * n_req + req_ids[i]) * max_blocks + local / bs];
                let global = i64::from(page) * stride as i64 + (local % bs) as i64;
                let at = if compact {
                    (0..topk)
                        .map(|s| i * size * topk + rank * topk + s)
                        .find(|&a| ranked[a] < 0)
                        .unwrap()
                } else {
                    i * size * topk + rank * topk + slot
                };
                ranked[at] = global;
            }
            if bug {
                rows[i * topk] = -1;
                rows[i * topk..(i + 1) * topk].sort_by(|a, b| b.cmp(a));
            }
        }
        let g = GlobalSlots {
            block_table: &pages,
            max_blocks,
            block_size: bs,
            stride,
            req_ids: &req_ids,
            prefill_req_ids: None,
            workspace_starts: &[],
            dcp_size: size,
            dcp_interleave: il,
        };
        let check = |rows: &[i64], width: usize, global: Option<GlobalSlots<'_>>| {
            let b = Batch {
                scores: Values::F32(&scores),
                magnitudes: None,
                n_positions: t,
                rows,
                width,
                lens: &lens,
                global,
            };
            check_rows(&b, Rule::Topk(topk), Tolerance::default()).unwrap()
        };
        let want = check(&rows, topk, None);
        let got = check(&ranked, size * topk, Some(g));
        // Compacted or with each remote slot left -1 in place, the same
        // verdicts, problem for problem.
        assert_eq!(got, want, "case {case} (compact {compact})");
        for c in &got {
            seen[c.is_correct() as usize] += 1;
        }
    }
    assert!(seen[0] > 50 && seen[1] > 200, "{seen:?}");
}

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
