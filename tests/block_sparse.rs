//! MiniMax-M3 block-sparse selection: the spec's ten tests on the flat
//! layout, the numeric edge cases, the refusals, the fixed-width and batched
//! forms, and a differential test against a naive port of the spec.

use kvselect::block_sparse::{
    block_sparse_select, positions_of_blocks, positions_of_blocks_i32, select_batch_into,
    select_into, select_packed_into, BlockSparseConfig, MINIMAX_BLOCK_SIZE,
};
use kvselect::{pool, ArgumentError};

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// `n` two-dimensional keys, flat: `[1, 0]` at the hot positions, `[0, 0.01]`
/// elsewhere.
fn keys(n: usize, hot: &[usize]) -> Vec<f32> {
    (0..n)
        .flat_map(|p| {
            if hot.contains(&p) {
                [1.0, 0.0]
            } else {
                [0.0, 0.01]
            }
        })
        .collect()
}

fn cfg(block: usize, top: usize, init: usize, local: usize) -> BlockSparseConfig {
    BlockSparseConfig {
        block_size: block,
        top_blocks: top,
        init_blocks: init,
        local_blocks: local,
    }
}

/// The spec-shaped call with `d = 2`: one query head per KV head in `q`.
fn select2(q: &[f32], k: &[f32], pos: usize, c: &BlockSparseConfig) -> Vec<Vec<usize>> {
    block_sparse_select(q, q.len() / 2, k, 2, pos, c).expect("a valid call")
}

/// The fixed-width form of one query, as rows.
fn select_rows(
    q: &[f32],
    heads: usize,
    k: &[f32],
    d: usize,
    pos: usize,
    c: &BlockSparseConfig,
) -> Vec<Vec<i32>> {
    let w = c.width();
    let mut out = vec![7i32; heads * w];
    select_into(q, heads, k, d, pos, c, &mut out).expect("a valid call");
    out.chunks(w.max(1)).map(|r| r.to_vec()).collect()
}

/// A selection as a fixed-width row: ascending ids, then -1.
fn padded(sel: &[usize], width: usize) -> Vec<i32> {
    let mut row: Vec<i32> = sel.iter().map(|&b| b as i32).collect();
    row.resize(width, -1);
    row
}

struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn int(&mut self, lo: i32, hi: i32) -> f32 {
        (lo + self.below((hi - lo + 1) as usize) as i32) as f32
    }
    /// In [-1, 1), full mantissa.
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// A straightforward port of the spec on the flat layout, in f64 (exact on
/// integer-valued data): forced blocks first, then the rest by their best
/// visible dot product, NaN ignored, -0.0 == +0.0, ties to the lower id.
fn naive_select(
    q: &[f32],
    heads: usize,
    k: &[f32],
    d: usize,
    pos: usize,
    c: &BlockSparseConfig,
) -> Vec<Vec<usize>> {
    let n_pos = k.len() / d;
    let bs = c.block_size;
    let n_blocks = (pos / bs + 1).min(n_pos.div_ceil(bs));
    let dot = |h: usize, p: usize| -> f64 {
        (0..d)
            .map(|i| q[h * d + i] as f64 * k[p * d + i] as f64)
            .sum()
    };
    (0..heads)
        .map(|h| {
            if n_blocks == 0 {
                return Vec::new();
            }
            let forced: Vec<bool> = (0..n_blocks)
                .map(|b| b < c.init_blocks || b + c.local_blocks >= n_blocks)
                .collect();
            let n_forced = forced.iter().filter(|f| **f).count();
            let budget = c.top_blocks.max(n_forced);
            let mut chosen: Vec<usize> = (0..n_blocks).filter(|&b| forced[b]).collect();
            let mut scored: Vec<(f64, usize)> = (0..n_blocks)
                .filter(|&b| !forced[b])
                .map(|b| {
                    let end = ((b + 1) * bs).min(n_pos).min(pos + 1);
                    let best = (b * bs..end)
                        .map(|p| dot(h, p))
                        .fold(f64::NEG_INFINITY, f64::max);
                    (best + 0.0, b)
                })
                .collect();
            scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            let room = budget.saturating_sub(chosen.len());
            chosen.extend(scored.iter().take(room).map(|&(_, b)| b));
            chosen.sort_unstable();
            chosen
        })
        .collect()
}

// ---------------------------------------------------------------------------
// The spec's ten tests, on the flat layout
// ---------------------------------------------------------------------------

/// The rule that stops a NaN. A query whose scores are all equally poor --
/// and one at the very start of a sequence -- still gets at least one block,
/// because the forced ones are added before any scoring. Attention over zero
/// positions is a softmax over an empty set, which propagates NaN through the
/// whole forward pass and surfaces as garbage rather than as an error.
#[test]
fn a_selection_is_never_empty_however_poor_the_scores() {
    let c = cfg(4, 1, 1, 1);
    // Every key identical and orthogonal to the query: no block can win on
    // score.
    let k = vec![0.0f32; 64 * 2];
    let q = [1.0, 0.0];
    for pos in [0usize, 1, 3, 4, 17, 63] {
        let sel = select2(&q, &k, pos, &c);
        assert!(
            !sel[0].is_empty(),
            "position {pos} selected nothing, which is a NaN downstream"
        );
        let covered = positions_of_blocks(&sel[0], pos, 64, &c);
        assert!(!covered.is_empty(), "position {pos} covers no positions");
        assert!(
            covered.iter().all(|&p| p <= pos),
            "position {pos} saw the future"
        );
    }
}

/// A block earns its place on its single best position, not its average.
/// One strongly-related token among 127 unrelated ones is exactly what
/// block-sparse attention exists to find, and a mean would average it away.
#[test]
fn a_block_is_scored_by_its_best_position_not_its_average() {
    // Four blocks of four. Block 1 holds a single hot key; block 2 holds
    // none. With one free slot, block 1 must win.
    let c = cfg(4, 3, 1, 1);
    let k = keys(16, &[5]);
    let sel = select2(&[1.0, 0.0], &k, 15, &c);
    assert!(
        sel[0].contains(&1),
        "the block holding the one hot key must be chosen, got {:?}",
        sel[0]
    );
}

/// Selection is per KV head with no cross-head reduction: two heads looking
/// for different things get different blocks. Reducing across heads first
/// would hand every GQA group one shared block set, which is the opposite of
/// what per-head selection is for.
#[test]
fn each_kv_head_selects_for_itself() {
    let c = cfg(4, 3, 1, 1);
    let mut k = vec![0.0f32; 16 * 2];
    k[5 * 2] = 1.0; // position 5 = [1, 0]: block 1, only head 0 wants it
    k[9 * 2 + 1] = 1.0; // position 9 = [0, 1]: block 2, only head 1 wants it
    let q = [1.0, 0.0, 0.0, 1.0];
    let sel = select2(&q, &k, 15, &c);
    assert_eq!(sel.len(), 2, "one selection per KV head");
    assert!(sel[0].contains(&1), "head 0: {:?}", sel[0]);
    assert!(sel[1].contains(&2), "head 1: {:?}", sel[1]);
    assert_ne!(sel[0], sel[1], "the heads must not be reduced together");
}

/// The first `init_blocks` and the newest `local_blocks` are in before
/// anything is scored, even when they score worst.
#[test]
fn the_first_and_newest_blocks_are_included_before_scoring() {
    let c = cfg(4, 3, 1, 1);
    // The hot keys are all in the middle blocks, so on score alone blocks 0
    // and 3 would both lose.
    let k = keys(16, &[4, 5, 8, 9]);
    let sel = select2(&[1.0, 0.0], &k, 15, &c);
    assert!(sel[0].contains(&0), "init block missing: {:?}", sel[0]);
    assert!(sel[0].contains(&3), "local block missing: {:?}", sel[0]);
}

/// Only the ORDER of the scores is consumed, so no softmax scale is applied.
/// Scaling every index key by a positive constant must leave the selection
/// identical -- if a scale were being applied and compared against anything
/// absolute, it would not.
#[test]
fn the_selection_depends_only_on_the_order_of_the_scores() {
    let c = cfg(4, 3, 1, 1);
    let k = keys(16, &[5]);
    let scaled: Vec<f32> = k.iter().map(|v| v * 1000.0).collect();
    let q = [1.0, 0.0];
    assert_eq!(select2(&q, &k, 15, &c), select2(&q, &scaled, 15, &c));
}

/// A query never sees a block that starts after it, and the block containing
/// it is clipped to its own position.
#[test]
fn selection_is_causal_and_the_current_block_is_clipped() {
    let c = cfg(4, 8, 1, 1);
    let k = keys(16, &[]);
    let sel = select2(&[1.0, 0.0], &k, 6, &c);
    assert!(
        sel[0].iter().all(|&b| b <= 1),
        "block 2 starts at position 8, after the query at 6: {:?}",
        sel[0]
    );
    let covered = positions_of_blocks(&sel[0], 6, 16, &c);
    assert_eq!(covered, vec![0, 1, 2, 3, 4, 5, 6]);
}

/// The budget is a ceiling, and the forced blocks are inside it -- not added
/// on top of it, which would silently widen every query's working set beyond
/// what the KV pool was sized for.
#[test]
fn the_budget_bounds_the_selection_including_the_forced_blocks() {
    let c = cfg(4, 3, 1, 1);
    let k = keys(64, &[]);
    let q = [1.0, 0.0];
    let sel = select2(&q, &k, 63, &c);
    assert_eq!(sel[0].len(), 3, "budget of 3: {:?}", sel[0]);

    // A budget smaller than the forced set cannot drop a forced block --
    // doing so would reintroduce the empty selection -- so it widens to hold
    // exactly them.
    let tight = cfg(4, 1, 2, 2);
    let sel = select2(&q, &k, 63, &tight);
    assert_eq!(sel[0], vec![0, 1, 14, 15]);
}

/// Ties break toward the lower block index rather than by whatever order the
/// sort happened to see, so a cached prefix and the run that produced it
/// cannot disagree.
#[test]
fn ties_break_deterministically_toward_the_lower_block() {
    let c = cfg(4, 3, 0, 0);
    // Every key identical: every block ties.
    let k: Vec<f32> = (0..16).flat_map(|_| [1.0, 0.0]).collect();
    let q = [1.0, 0.0];
    let first = select2(&q, &k, 15, &c);
    assert_eq!(first[0], vec![0, 1, 2]);
    for _ in 0..8 {
        assert_eq!(select2(&q, &k, 15, &c), first);
    }
}

/// A query past the end of the keys is clipped to what exists, rather than
/// naming blocks the pager never allocated.
#[test]
fn a_query_beyond_the_keys_is_clipped_to_what_exists() {
    let c = cfg(4, 8, 1, 1);
    let k = keys(6, &[]);
    let sel = select2(&[1.0, 0.0], &k, 100, &c);
    assert_eq!(sel[0], vec![0, 1], "only two blocks of keys exist");
    let covered = positions_of_blocks(&sel[0], 100, 6, &c);
    assert_eq!(covered, vec![0, 1, 2, 3, 4, 5]);
}

/// The real geometry: 128-token blocks, and the block size is the KV page
/// size too.
#[test]
fn the_real_block_size_is_the_kv_page_size() {
    assert_eq!(MINIMAX_BLOCK_SIZE, 128);
    let c = BlockSparseConfig::default();
    assert_eq!(c.block_size, MINIMAX_BLOCK_SIZE);
    assert_eq!(c.causal_blocks(0), 1);
    assert_eq!(c.causal_blocks(127), 1);
    assert_eq!(c.causal_blocks(128), 2);
}

// ---------------------------------------------------------------------------
// Numbers: NaN and signed zeros
// ---------------------------------------------------------------------------

/// A block whose every visible score is NaN scores -inf: it never displaces
/// a block with a finite score, even a very negative one, and a NaN never
/// ranks above anything.
#[test]
fn an_all_nan_block_never_displaces_a_finite_one() {
    // Blocks of 2, no forced blocks, one slot. Block 0 is all NaN, block 1
    // scores -1000, block 2 is all NaN.
    let c = cfg(2, 1, 0, 0);
    let nan = f32::NAN;
    let k = vec![
        nan, 0.0, nan, 0.0, -1000.0, 0.0, -1000.0, 0.0, nan, 0.0, nan, 0.0,
    ];
    let sel = block_sparse_select(&[1.0, 0.0], 1, &k, 2, 5, &c).unwrap();
    assert_eq!(sel[0], vec![1], "the finite block must win the only slot");

    // With two slots, the finite block and then the lowest -inf block.
    let c2 = cfg(2, 2, 0, 0);
    let sel = block_sparse_select(&[1.0, 0.0], 1, &k, 2, 5, &c2).unwrap();
    assert_eq!(sel[0], vec![0, 1]);
}

/// A NaN position inside a block is ignored, not allowed to win or to poison
/// the block: the block is scored by its other positions.
#[test]
fn a_nan_position_is_ignored_within_its_block() {
    let c = cfg(4, 1, 0, 0);
    let mut k = keys(12, &[6]); // block 1 holds the hot key
    k[5 * 2] = f32::NAN; // and a NaN next to it
    k[0] = f32::NAN; // block 0 holds only a NaN and poor keys
    let sel = block_sparse_select(&[1.0, 0.0], 1, &k, 2, 11, &c).unwrap();
    assert_eq!(sel[0], vec![1]);
}

/// Blocks that score nothing but NaN can still fill slots nothing better
/// wants, lowest id first, so the budget is spent the same way every time.
#[test]
fn all_nan_blocks_fill_empty_slots_lowest_id_first() {
    let c = cfg(2, 3, 0, 0);
    let mut k = vec![f32::NAN; 10 * 2];
    k[7 * 2] = 5.0; // block 3 is the only one with a finite score
    k[7 * 2 + 1] = 0.0;
    let sel = block_sparse_select(&[1.0, 0.0], 1, &k, 2, 9, &c).unwrap();
    assert_eq!(sel[0], vec![0, 1, 3]);
}

/// -0.0 and +0.0 are one score, so a zero tie goes to the lower block even
/// when the higher block's zero is the "positive" one.
#[test]
fn a_tie_between_minus_zero_and_plus_zero_goes_to_the_lower_block() {
    let c = cfg(1, 1, 0, 0);
    // Scores: position 0 -> -0.0 (0 * -1), position 1 -> +0.0.
    let k = vec![-1.0, 1.0];
    let q = [0.0];
    let sel = block_sparse_select(&q, 1, &k, 1, 1, &c).unwrap();
    assert_eq!(sel[0], vec![0]);
    // And the other way round.
    let k = vec![1.0, -1.0];
    let sel = block_sparse_select(&q, 1, &k, 1, 1, &c).unwrap();
    assert_eq!(sel[0], vec![0]);
    // A literal -0.0 query against +0.0 keys.
    let k = vec![1.0, 2.0, 3.0];
    let sel = block_sparse_select(&[-0.0], 1, &k, 1, 2, &c).unwrap();
    assert_eq!(sel[0], vec![0]);
}

// ---------------------------------------------------------------------------
// Refusals
// ---------------------------------------------------------------------------

/// A config that can select nothing is refused when it is built, and by
/// every selection function when it is written down literally.
#[test]
fn a_config_that_can_select_nothing_is_refused() {
    let e = BlockSparseConfig::new(0, 4, 1, 1).unwrap_err();
    assert!(matches!(
        e,
        ArgumentError::InvalidConfig {
            field: "block_size",
            ..
        }
    ));
    assert!(e.to_string().contains("block_size"), "{e}");
    let e = BlockSparseConfig::new(4, 0, 0, 0).unwrap_err();
    assert!(matches!(
        e,
        ArgumentError::InvalidConfig {
            field: "top_blocks",
            ..
        }
    ));
    assert!(e.to_string().contains("top_blocks"), "{e}");

    // Forced blocks alone are enough, and so is a budget alone.
    assert_eq!(BlockSparseConfig::new(4, 0, 1, 0).unwrap().width(), 1);
    assert_eq!(BlockSparseConfig::new(4, 0, 0, 2).unwrap().width(), 2);
    assert_eq!(BlockSparseConfig::new(4, 3, 0, 0).unwrap().width(), 3);
    assert_eq!(
        BlockSparseConfig::new(128, 32, 1, 2).unwrap(),
        BlockSparseConfig::default()
    );
    assert_eq!(BlockSparseConfig::default().width(), 32);
    assert_eq!(cfg(4, 1, 2, 2).width(), 4);

    let k = keys(8, &[]);
    let bad = cfg(0, 3, 1, 1);
    // Every entry point refuses an unusable config with the config's own
    // refusal: `InvalidConfig` naming the field at fault.
    let refusal = bad.validate().unwrap_err();
    assert_eq!(
        refusal,
        ArgumentError::InvalidConfig {
            field: "block_size",
            message: "block_size is 0: a block must hold at least one position".into(),
        }
    );
    assert_eq!(
        block_sparse_select(&[1.0, 0.0], 1, &k, 2, 7, &bad).unwrap_err(),
        refusal
    );
    let mut out = vec![0i32; 3];
    assert_eq!(
        select_into(&[1.0, 0.0], 1, &k, 2, 7, &bad, &mut out),
        Err(refusal)
    );
    assert_eq!(
        out,
        vec![0, 0, 0],
        "nothing is written before the checks pass"
    );
    let e = positions_of_blocks_i32(&[0], 3, 8, &cfg(4, 0, 0, 0)).unwrap_err();
    assert!(
        matches!(
            e,
            ArgumentError::InvalidConfig {
                field: "top_blocks",
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(e, cfg(4, 0, 0, 0).validate().unwrap_err());
}

/// Shape mismatches are refused with a message naming the argument and the
/// sizes, and the output buffer is left untouched.
#[test]
fn a_shape_mismatch_is_refused_naming_the_argument_and_sizes() {
    let c = cfg(4, 2, 1, 1);
    let k = vec![0.0f32; 10];
    let e = block_sparse_select(&[1.0; 4], 1, &k, 4, 3, &c).unwrap_err();
    assert_eq!(
        e.to_string(),
        "index_k has 10 values, which is not a whole number of rows of d=4"
    );
    assert_eq!(e.argument(), "index_k");

    let k = vec![0.0f32; 16];
    let e = block_sparse_select(&[1.0; 5], 2, &k, 4, 3, &c).unwrap_err();
    assert_eq!(e.argument(), "index_q");
    assert!(
        e.to_string().contains("5") && e.to_string().contains("8"),
        "{e}"
    );

    let e = block_sparse_select(&[], 1, &[], 0, 3, &c).unwrap_err();
    assert_eq!(e.argument(), "d");

    // The output buffer: [n_kv_heads, width].
    let mut out = vec![9i32; 5];
    let e = select_into(&[1.0; 8], 2, &k, 4, 3, &c, &mut out).unwrap_err();
    assert!(matches!(
        e,
        ArgumentError::OutputSize {
            argument: "out",
            expected: 4,
            actual: 5,
            ..
        }
    ));
    assert!(
        e.to_string().starts_with("out has 5 slots, expected 4"),
        "{e}"
    );
    assert_eq!(out, vec![9; 5]);

    // Batched: one position per query, and no negative positions.
    let mut out = vec![9i32; 2 * 2 * 2];
    let e = select_batch_into(&[1.0; 16], 2, 2, &k, 4, &[3i64], &c, &mut out).unwrap_err();
    assert_eq!(e.argument(), "query_pos");
    let e = select_batch_into(&[1.0; 16], 2, 2, &k, 4, &[3i64, -1], &c, &mut out).unwrap_err();
    assert!(matches!(
        e,
        ArgumentError::OutOfRange {
            argument: "query_pos",
            index: 1,
            ..
        }
    ));
    assert!(e.to_string().contains("query_pos[1] = -1"), "{e}");
    assert_eq!(out, vec![9; 8], "nothing is written before the checks pass");
}

/// A batch with no queries (or no heads) is accepted and writes nothing,
/// however large the other dimension claims to be.
#[test]
fn an_empty_batch_is_accepted_and_writes_nothing() {
    let c = cfg(4, 2, 1, 1);
    let k = vec![0.0f32; 8];
    let none: &[usize] = &[];
    select_batch_into(&[], 0, usize::MAX, &k, 4, none, &c, &mut []).unwrap();
    select_batch_into(&[], 3, 0, &k, 4, &[0usize, 1, 2], &c, &mut []).unwrap();
    select_packed_into(
        &[],
        0,
        usize::MAX,
        &k,
        4,
        &[0usize, 2],
        none,
        none,
        &c,
        &mut [],
    )
    .unwrap();
    assert_eq!(
        block_sparse_select(&[], 0, &k, 4, 1, &c).unwrap(),
        Vec::<Vec<usize>>::new()
    );
}

/// A packed batch refuses sequence boundaries that are not a partition of
/// the keys, and sequence ids that name no sequence.
#[test]
fn a_packed_batch_refuses_bad_sequence_boundaries_and_ids() {
    let c = cfg(4, 2, 1, 1);
    let k = vec![0.0f32; 10 * 2];
    let q = [1.0f32, 0.0];
    let mut out = vec![5i32; 2];
    let mut call = |cu: &[i64], seq: &[i64], pos: &[i64]| {
        select_packed_into(&q, 1, 1, &k, 2, cu, seq, pos, &c, &mut out).unwrap_err()
    };
    let e = call(&[], &[0], &[0]);
    assert_eq!(e.argument(), "cu_seqlens");
    let e = call(&[1, 10], &[0], &[0]);
    assert!(matches!(
        e,
        ArgumentError::OutOfRange {
            argument: "cu_seqlens",
            index: 0,
            ..
        }
    ));
    let e = call(&[0, 6, 4, 10], &[0], &[0]);
    assert!(matches!(
        e,
        ArgumentError::OutOfRange {
            argument: "cu_seqlens",
            index: 2,
            ..
        }
    ));
    let e = call(&[0, 4, 9], &[0], &[0]);
    assert!(e.to_string().contains("cu_seqlens ends at 9"), "{e}");
    let e = call(&[0, 4, 12], &[0], &[0]);
    assert_eq!(e.argument(), "cu_seqlens");
    let e = call(&[0, 4, 10], &[2], &[0]);
    assert!(matches!(
        e,
        ArgumentError::OutOfRange {
            argument: "seq_ids",
            index: 0,
            ..
        }
    ));
    assert!(e.to_string().contains("seq_ids[0] = 2"), "{e}");
    let e = call(&[0, 4, 10], &[-1], &[0]);
    assert_eq!(e.argument(), "seq_ids");
    let e = call(&[0, 4, 10], &[1], &[-3]);
    assert_eq!(e.argument(), "query_pos");
    let e = call(&[0, 4, 10], &[1, 0], &[0]);
    assert_eq!(e.argument(), "seq_ids");
    assert_eq!(out, vec![5, 5], "nothing is written before the checks pass");
}

/// `positions_of_blocks` never overflows on a huge block id, skips blocks
/// past the keys or the query, and its int32 form skips negative padding.
#[test]
fn positions_of_blocks_ignores_padding_and_blocks_past_the_keys_or_query() {
    let c = cfg(4, 2, 1, 1);
    assert_eq!(
        positions_of_blocks(&[usize::MAX, 1, 0, 1, 7], 9, 100, &c),
        vec![0, 1, 2, 3, 4, 5, 6, 7]
    );
    assert_eq!(positions_of_blocks(&[2], 9, 9, &c), vec![8]);
    assert_eq!(positions_of_blocks(&[2], usize::MAX, 10, &c), vec![8, 9]);
    assert!(positions_of_blocks(&[0], 5, 0, &c).is_empty());
    assert_eq!(
        positions_of_blocks_i32(&[-1, 2, -7, 0, i32::MAX], 9, 100, &c).unwrap(),
        vec![0, 1, 2, 3, 8, 9]
    );
    let huge = cfg(1 << 40, 1, 0, 0);
    assert!(positions_of_blocks(&[usize::MAX], usize::MAX, usize::MAX, &huge).is_empty());
}

// ---------------------------------------------------------------------------
// Fixed-width, batched and packed forms
// ---------------------------------------------------------------------------

/// The bindings' rows are `width` int32s: ascending block ids, then -1.
#[test]
fn fixed_width_rows_hold_ascending_ids_then_minus_one_padding() {
    let c = cfg(4, 3, 1, 2);
    assert_eq!(c.width(), 3);
    let k = keys(40, &[21]);
    let q = [1.0, 0.0, 0.0, 1.0];
    let rows = select_rows(&q, 2, &k, 2, 39, &c);
    assert_eq!(rows, vec![vec![0, 8, 9], vec![0, 8, 9]]);
    let c = cfg(4, 5, 1, 1);
    let rows = select_rows(&q, 2, &k, 2, 39, &c);
    assert_eq!(
        rows[0],
        vec![0, 1, 2, 5, 9],
        "forced 0 and 9, the hot block 5, then the ties lowest first"
    );
    // Early in the sequence there are fewer blocks than slots.
    let rows = select_rows(&q, 2, &k, 2, 5, &c);
    assert_eq!(rows, vec![vec![0, 1, -1, -1, -1]; 2]);
    // No keys: nothing to select, every slot is padding.
    let rows = select_rows(&q, 2, &[], 2, 5, &c);
    assert_eq!(rows, vec![vec![-1; 5]; 2]);
    // A wide forced set: width = init + local.
    let c = cfg(4, 1, 2, 2);
    let rows = select_rows(&q[..2], 1, &k, 2, 39, &c);
    assert_eq!(rows, vec![vec![0, 1, 8, 9]]);
}

fn random_unit(rng: &mut XorShift, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.unit()).collect()
}

/// A batch of queries (a prefill chunk) selects, row for row and bit for
/// bit, what one call per query selects -- including odd head counts, whose
/// row tiles span queries at different positions.
#[test]
fn a_batched_call_equals_one_call_per_query() {
    let mut rng = XorShift(0x1234_5678_9abc_def1);
    for (heads, d, n_pos, bs) in [
        (3, 19, 300, 7),
        (4, 64, 1000, 128),
        (1, 8, 50, 1),
        (5, 33, 257, 16),
    ] {
        let c = cfg(bs, 5, 1, 1);
        let w = c.width();
        let n_q = 11;
        let k = random_unit(&mut rng, n_pos * d);
        let q = random_unit(&mut rng, n_q * heads * d);
        let pos: Vec<usize> = (0..n_q)
            .map(|i| {
                if i % 4 == 3 {
                    n_pos + 17
                } else {
                    rng.below(n_pos)
                }
            })
            .collect();
        let mut out = vec![0i32; n_q * heads * w];
        select_batch_into(&q, n_q, heads, &k, d, &pos, &c, &mut out).unwrap();
        for (i, &p) in pos.iter().enumerate() {
            let mut one = vec![0i32; heads * w];
            select_into(
                &q[i * heads * d..(i + 1) * heads * d],
                heads,
                &k,
                d,
                p,
                &c,
                &mut one,
            )
            .unwrap();
            assert_eq!(
                &out[i * heads * w..(i + 1) * heads * w],
                &one[..],
                "query {i} at {p}, heads {heads}, d {d}"
            );
        }
    }
}

/// A packed batch of several sequences selects, row for row, what one call
/// per sequence on that sequence's own keys selects: a query never sees
/// another sequence's keys, and its block ids count from its own start.
#[test]
fn a_packed_batch_equals_one_call_per_sequence() {
    let mut rng = XorShift(0xfeed_beef_0bad_cafe);
    let (heads, d) = (3, 12);
    let c = cfg(8, 4, 1, 1);
    let w = c.width();
    let lens = [37usize, 0, 100, 9];
    let cu: Vec<usize> = std::iter::once(0)
        .chain(lens.iter().scan(0, |s, &l| {
            *s += l;
            Some(*s)
        }))
        .collect();
    let total = cu[lens.len()];
    let k = random_unit(&mut rng, total * d);
    let seq_ids = [2usize, 0, 0, 2, 1, 2, 3, 3, 0, 2];
    let n_q = seq_ids.len();
    let pos: Vec<usize> = seq_ids.iter().map(|&s| rng.below(lens[s] + 5)).collect();
    let q = random_unit(&mut rng, n_q * heads * d);
    let mut out = vec![0i32; n_q * heads * w];
    select_packed_into(&q, n_q, heads, &k, d, &cu, &seq_ids, &pos, &c, &mut out).unwrap();
    for i in 0..n_q {
        let s = seq_ids[i];
        let own = &k[cu[s] * d..cu[s + 1] * d];
        let mut one = vec![0i32; heads * w];
        select_into(
            &q[i * heads * d..(i + 1) * heads * d],
            heads,
            own,
            d,
            pos[i],
            &c,
            &mut one,
        )
        .unwrap();
        assert_eq!(
            &out[i * heads * w..(i + 1) * heads * w],
            &one[..],
            "query {i}"
        );
    }
    // The empty sequence selects nothing.
    assert_eq!(&out[4 * heads * w..5 * heads * w], &vec![-1; heads * w][..]);
}

/// The thread count changes nothing, bit for bit, on full-precision data
/// large enough to be split into many parallel tasks.
#[test]
fn the_selection_does_not_depend_on_the_thread_count() {
    let mut rng = XorShift(0x0ddb_a11c_0ffe_e123);
    let (n_q, heads, d, n_pos) = (48, 4, 64, 8192);
    let c = cfg(64, 9, 1, 1);
    let w = c.width();
    let k = random_unit(&mut rng, n_pos * d);
    let q = random_unit(&mut rng, n_q * heads * d);
    let pos: Vec<usize> = (0..n_q).map(|i| n_pos - n_q * 37 + i * 37).collect();
    let run = |threads: usize| {
        pool::set_num_threads(threads);
        let mut out = vec![0i32; n_q * heads * w];
        select_batch_into(&q, n_q, heads, &k, d, &pos, &c, &mut out).unwrap();
        let mut one = vec![0i32; heads * w];
        select_into(&q[..heads * d], heads, &k, d, n_pos - 1, &c, &mut one).unwrap();
        (out, one)
    };
    let single = run(1);
    let double = run(2);
    let triple = run(3);
    pool::set_num_threads(0);
    assert_eq!(single, double);
    assert_eq!(single, triple);
}

// ---------------------------------------------------------------------------
// Differential test against the naive spec port
// ---------------------------------------------------------------------------

/// On thousands of random cases -- tiny and odd block sizes and dimensions,
/// queries beyond the keys, no keys at all, many exact ties, NaN and
/// infinite keys -- every form of the selection equals a naive port of the
/// spec computed in f64 on integer-valued data (where every score is exact).
#[test]
fn every_form_matches_a_naive_port_of_the_spec_on_random_cases() {
    let mut rng = XorShift(0x5eed_0000_0000_0001);
    let mut checked = 0;
    for case in 0..4000 {
        let d = 1 + rng.below(if case % 10 == 0 { 70 } else { 20 });
        let n_pos = if case % 50 == 0 {
            0
        } else {
            rng.below(if case % 9 == 0 { 700 } else { 60 })
        };
        let heads = 1 + rng.below(6);
        let c = cfg(1 + rng.below(9), rng.below(9), rng.below(4), rng.below(4));
        if let Err(refusal) = c.validate() {
            assert!(
                matches!(refusal, ArgumentError::InvalidConfig { .. }),
                "{refusal:?}"
            );
            assert_eq!(
                block_sparse_select(&[], 0, &[], 1, 0, &c).unwrap_err(),
                refusal,
                "case {case}: {c:?}"
            );
            continue;
        }
        // Small integer ranges make many exact ties.
        let span = 1 + rng.below(3) as i32;
        let mut k: Vec<f32> = (0..n_pos * d).map(|_| rng.int(-span, span)).collect();
        let q: Vec<f32> = (0..heads * d).map(|_| rng.int(-span, span)).collect();
        if case % 13 == 0 && !k.is_empty() {
            for _ in 0..1 + rng.below(8) {
                let at = rng.below(k.len());
                k[at] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY][rng.below(3)];
            }
        }
        let n_q = 1 + rng.below(5);
        let pos: Vec<usize> = (0..n_q).map(|_| rng.below(n_pos + 12)).collect();
        let w = c.width();

        let mut batch = vec![0i32; n_q * heads * w];
        let qs: Vec<f32> = (0..n_q).flat_map(|_| q.iter().copied()).collect();
        select_batch_into(&qs, n_q, heads, &k, d, &pos, &c, &mut batch).unwrap();

        for (i, &p) in pos.iter().enumerate() {
            let want = naive_select(&q, heads, &k, d, p, &c);
            let got = block_sparse_select(&q, heads, &k, d, p, &c).unwrap();
            assert_eq!(got, want, "case {case}: d={d} n_pos={n_pos} pos={p} {c:?}");
            let rows = select_rows(&q, heads, &k, d, p, &c);
            for h in 0..heads {
                let row = padded(&want[h], w);
                assert_eq!(rows[h], row, "case {case}: fixed-width row, head {h}");
                assert_eq!(
                    &batch[(i * heads + h) * w..(i * heads + h + 1) * w],
                    &row[..],
                    "case {case}: batched row, query {i} head {h}"
                );
                // The selection is never empty when keys exist, and covers
                // only positions the query may see.
                if n_pos > 0 {
                    assert!(!want[h].is_empty());
                }
                let covered = positions_of_blocks(&want[h], p, n_pos, &c);
                assert!(covered.iter().all(|&x| x <= p && x < n_pos));
                let covered32 = positions_of_blocks_i32(&row, p, n_pos, &c).unwrap();
                assert!(covered32
                    .iter()
                    .map(|&x| x as usize)
                    .eq(covered.iter().copied()));
            }
            checked += 1;
        }
    }
    assert!(checked > 5000, "only {checked} selections were checked");
}

// ---------------------------------------------------------------------------
// Timing (release mode, ignored by default)
// ---------------------------------------------------------------------------

fn best_of(reps: usize, mut f: impl FnMut()) -> (f64, f64) {
    f();
    let mut times: Vec<f64> = (0..reps)
        .map(|_| {
            let t = std::time::Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    times.sort_by(f64::total_cmp);
    (times[0], times[reps / 2])
}

/// Times the decode and prefill cases of the benchmark (run with
/// `cargo test --release --test block_sparse -- --ignored --nocapture`).
#[test]
#[ignore]
fn timing_decode_and_prefill() {
    let mut rng = XorShift(42);
    let c = cfg(128, 16, 0, 1);
    let (heads, d) = (4, 128);

    let n_pos = 131072;
    let k = random_unit(&mut rng, n_pos * d);
    let q = random_unit(&mut rng, heads * d);
    let mut out = vec![0i32; heads * c.width()];
    let (best, median) = best_of(40, || {
        select_into(&q, heads, &k, d, n_pos - 1, &c, &mut out).unwrap();
    });
    println!("decode  (1 query, {heads} heads, d={d}, {n_pos} keys): best {best:.3} ms, median {median:.3} ms");

    let n_pos = 16384;
    let n_q = 512;
    let k = random_unit(&mut rng, n_pos * d);
    let q = random_unit(&mut rng, n_q * heads * d);
    let pos: Vec<usize> = (n_pos - n_q..n_pos).collect();
    let mut out = vec![0i32; n_q * heads * c.width()];
    let (best, median) = best_of(10, || {
        select_batch_into(&q, n_q, heads, &k, d, &pos, &c, &mut out).unwrap();
    });
    println!("prefill ({n_q} queries, {heads} heads, d={d}, {n_pos} keys): best {best:.3} ms, median {median:.3} ms");
}
