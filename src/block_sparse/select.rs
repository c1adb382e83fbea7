//! The spec's selection rule, applied to one row's block maxima: the forced
//! blocks, then the best-scoring free blocks up to the budget (ties to the
//! lower id), ascending.

use super::BlockSparseConfig;

/// The spec's selection for one row with `n_blocks` visible blocks, given
/// each block's max score. Writes the ascending selection into `sel`.
pub(super) fn select_blocks(
    n_blocks: usize,
    score: impl Fn(usize) -> f32,
    cfg: &BlockSparseConfig,
    cand: &mut Vec<(f32, usize)>,
    sel: &mut Vec<usize>,
) {
    sel.clear();
    if n_blocks == 0 {
        return;
    }
    let init_end = cfg.init_blocks.min(n_blocks);
    let local_start = (n_blocks - cfg.local_blocks.min(n_blocks)).max(init_end);
    let forced = init_end + (n_blocks - local_start);
    let budget = cfg.top_blocks.max(forced);
    let free = local_start - init_end;
    let want = (budget - forced).min(free);

    sel.extend(0..init_end);
    if want == free {
        sel.extend(init_end..local_start);
    } else if want > 0 {
        cand.clear();
        // `+ 0.0` canonicalises -0.0 to +0.0 (and leaves everything else,
        // -inf included, as it is); block maxima are never NaN.
        cand.extend((init_end..local_start).map(|b| (score(b) + 0.0, b)));
        let order = |a: &(f32, usize), b: &(f32, usize)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        cand.select_nth_unstable_by(want - 1, order);
        let start = sel.len();
        sel.extend(cand.iter().take(want).map(|&(_, b)| b));
        sel[start..].sort_unstable();
    }
    sel.extend(local_start..n_blocks);
}

pub(super) fn write_i32_row(sel: &[usize], row: &mut [i32]) {
    let mut it = sel.iter();
    for slot in row.iter_mut() {
        // Ids were checked to fit i32 (`check_block_ids_fit_i32`).
        *slot = it.next().map_or(-1, |&b| b as i32);
    }
}
