//! The core rules on small rows written out by hand.

use super::*;

#[test]
fn the_window_is_the_last_w_positions_ascending_then_minus_one() {
    let mut out = vec![0; 3 * 4];
    window_positions_into(&[0, 2, 9], 4, &mut out).unwrap();
    assert_eq!(out, [0, -1, -1, -1, 0, 1, 2, -1, 6, 7, 8, 9]);
}

#[test]
fn an_hca_query_sees_every_entry_below_p_plus_one_over_m() {
    let mut out = vec![0; 4 * 3];
    visible_entries_into(&[2, 3, 7, 100], 4, 3, &mut out).unwrap();
    assert_eq!(out, [-1, -1, -1, 0, -1, -1, 0, 1, -1, 0, 1, 2]);
}

#[test]
fn csa_entries_overlap_the_previous_window_and_hca_entries_do_not() {
    let mut out = vec![0; 6];
    compressed_entry_tokens_into(&[0, 2, -1], 4, true, &mut out).unwrap();
    assert_eq!(out, [0, 4, 4, 12, -1, -1]);
    compressed_entry_tokens_into(&[0, 2, -1], 4, false, &mut out).unwrap();
    assert_eq!(out, [0, 4, 8, 12, -1, -1]);
    let err = compressed_entry_tokens_into(&[-2, 0, 0], 4, false, &mut out).unwrap_err();
    assert_eq!(err.argument(), "entries");
}

#[test]
fn expansion_puts_each_pool_at_its_column_and_the_tail_right_after() {
    // m = 4, p = 13: pools 0..3 visible, tail 12, 13.
    let mut out = vec![7; 12];
    expand_entries_into(&[2, -1], 2, &[13], 4, true, 12, &mut out).unwrap();
    assert_eq!(out, [8, 9, 10, 11, -1, -1, -1, -1, 12, 13, -1, -1]);
    let err = expand_entries_into(&[3, -1], 2, &[13], 4, true, 12, &mut out).unwrap_err();
    assert_eq!(err.argument(), "entry_rows");
    let err = expand_entries_into(&[2, -1], 2, &[13], 4, true, 10, &mut out[..10]).unwrap_err();
    assert_eq!(err.argument(), "width");
}

fn combine(
    topk: &[i32],
    width: usize,
    qsl: &[usize],
    seq: &[usize],
    gather: &[usize],
    (w, m, k, big_m, big_n): (usize, usize, usize, usize, usize),
) -> Result<(Vec<i32>, Vec<i32>), ArgumentError> {
    let inputs = CombineInputs {
        topk_indices: topk,
        num_tokens: topk.len() / width,
        topk_width: width,
        query_start_loc: qsl,
        seq_lens: seq,
        gather_lens: gather,
        window_size: w,
        compress_ratio: m,
        topk: k,
        m: big_m,
        n: big_n,
    };
    let n = *qsl.last().unwrap();
    let cw = combined_width(k, w).unwrap();
    let (mut idx, mut lens) = (vec![0; n * cw], vec![0; n]);
    combine_topk_swa_indices_into(&inputs, &mut idx, &mut lens)?;
    Ok((idx, lens))
}

#[test]
fn vllm_rows_hold_the_topk_then_the_window_at_its_workspace_offset() {
    // Two requests, m = 4, W = 4, topk = 2, N = 8, M = 20. Request 0: a
    // 3-token chunk at positions 5..8 of 8 tokens, all gathered; request 1:
    // one decode token at position 3 of 4.
    let topk = [1, 0, 0, 1, 1, 0, -1, -1];
    let (idx, lens) = combine(&topk, 2, &[0, 3, 4], &[8, 4], &[8, 4], (4, 4, 2, 20, 8)).unwrap();
    let row = |i: usize| idx[i * 128..i * 128 + 8].to_vec();
    // pos 5: 1 entry, window 2..5 at 8 + 2..
    assert_eq!(row(0), [1, 8 + 2, 8 + 3, 8 + 4, 8 + 5, -1, -1, -1]);
    // pos 6: still 1 entry ((6 + 1) / 4); pos 7: 2.
    assert_eq!(row(1), [0, 8 + 3, 8 + 4, 8 + 5, 8 + 6, -1, -1, -1]);
    assert_eq!(row(2), [1, 0, 8 + 4, 8 + 5, 8 + 6, 8 + 7, -1, -1]);
    // request 1, pos 3: one entry (-1 copied: M·1 − 1), window 0..3.
    assert_eq!(row(3), [19, 28, 29, 30, 31, -1, -1, -1]);
    assert_eq!(lens, [5, 5, 6, 5]);
    assert!(idx[8..128].iter().all(|&v| v == -1));
}

#[test]
fn vllm_rows_refuse_what_the_kernel_would_mis_index() {
    let topk = [0, 0, 0, 0];
    let cfg = (4, 4, 1, 20, 8);
    let arg = |r: Result<_, ArgumentError>| r.unwrap_err().argument();
    assert_eq!(
        arg(combine(&topk, 1, &[1, 4], &[8], &[8], cfg)),
        "query_start_loc"
    );
    assert_eq!(arg(combine(&topk, 1, &[0, 4], &[3], &[3], cfg)), "seq_lens");
    assert_eq!(
        arg(combine(&topk, 1, &[0, 4], &[8], &[9], cfg)),
        "gather_lens"
    );
    // positions 4..8, window of token 4 starts at 1 < gather_start 8 − 5 = 3.
    assert_eq!(
        arg(combine(&topk, 1, &[0, 4], &[8], &[5], cfg)),
        "gather_lens"
    );
    assert_eq!(
        arg(combine(&[0, 0, 0, 9], 1, &[0, 4], &[8], &[8], cfg)),
        "topk_indices"
    );
    assert_eq!(
        arg(combine(
            &topk,
            1,
            &[0, 2, 4],
            &[8, 8],
            &[8, 8],
            (4, 4, 1, 15, 8)
        )),
        "M"
    );
    assert_eq!(
        arg(combine(&topk, 1, &[0, 4], &[8], &[8], (4, 0, 1, 20, 8))),
        "compress_ratio"
    );
}

#[test]
fn a_query_start_loc_that_overshoots_then_falls_is_refused_before_any_row_is_read() {
    let err = combine(
        &[0, 0, 0, 0],
        1,
        &[0, 5, 4],
        &[8, 8],
        &[8, 8],
        (4, 4, 1, 20, 8),
    )
    .unwrap_err();
    assert_eq!(err.argument(), "query_start_loc");
}
