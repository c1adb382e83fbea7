//! Global slot ids (block tables, prefill workspaces, DCP ranks) read back
//! to the row-relative verdicts.

use super::*;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

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
