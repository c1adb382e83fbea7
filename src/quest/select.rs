//! The page set: which pages a query reads, from its pages' scores.

use std::cmp::Ordering;

use super::Variant;

/// Pages ranked by "score descending, then page id ascending": NaN below
/// every number, `-0.0` one with `+0.0` (`Less` = `a` ranks first).
pub fn rank(a: (f32, usize), b: (f32, usize)) -> Ordering {
    match (a.0.is_nan(), b.0.is_nan()) {
        (false, false) => (b.0 + 0.0).total_cmp(&(a.0 + 0.0)).then(a.1.cmp(&b.1)),
        (true, true) => a.1.cmp(&b.1),
        (false, true) => Ordering::Less,
        (true, false) => Ordering::Greater,
    }
}

/// The ids of the `k` best of `scores[0..n]` by [`rank`] (all of them when
/// `k >= n`), pushed onto `out` in no particular order.
fn top(scores: &[f32], n: usize, k: usize, out: &mut Vec<usize>) {
    if k >= n {
        out.extend(0..n);
        return;
    }
    if k == 0 {
        return;
    }
    let mut v: Vec<(f32, usize)> = scores[..n].iter().copied().zip(0..n).collect();
    v.select_nth_unstable_by(k - 1, |&a, &b| rank(a, b));
    out.extend(v[..k].iter().map(|&(_, p)| p));
}

/// How many pages the variant selects of `n_pages` (of a sequence of
/// `n_tokens` tokens in pages of `page_size`), with `budget` pages.
pub fn count(
    variant: Variant,
    budget: usize,
    n_pages: usize,
    n_tokens: usize,
    page_size: usize,
) -> usize {
    match variant {
        Variant::Kernel => budget.min(n_pages),
        Variant::Eval => eval_pages(budget, n_pages, n_tokens, page_size),
        Variant::Sglang {
            num_recent_pages: r,
        } => {
            let recent_start = n_pages.saturating_sub(r);
            let k = budget.saturating_sub(r).max(1).min(recent_start.max(1));
            (if recent_start > 0 { k } else { 0 }) + (n_pages - recent_start)
        }
    }
}

/// The evaluation script's chunk count: `min(max(3, token_budget // P),
/// n)` with `token_budget = min(n_tokens, budget · P)`.
fn eval_pages(budget: usize, n_pages: usize, n_tokens: usize, page_size: usize) -> usize {
    let token_budget = n_tokens.min(budget.saturating_mul(page_size));
    (token_budget / page_size).max(3).min(n_pages)
}

/// Whether the variant reads every page, so no score is needed.
pub fn reads_all(
    variant: Variant,
    budget: usize,
    n_pages: usize,
    n_tokens: usize,
    page_size: usize,
) -> bool {
    count(variant, budget, n_pages, n_tokens, page_size) == n_pages
}

/// One row: the pages the variant selects from `scores` (`[n_pages]`; not
/// read when [`reads_all`]), ascending, then `-1` to the end of `out`.
///
/// - [`Variant::Kernel`]: every page when `n_pages <= budget`; else the
///   last page and the best `budget − 1` of the others.
/// - [`Variant::Eval`]: the best `min(max(3, min(n_tokens, budget·P) / P),
///   n_pages)` pages, none forced.
/// - [`Variant::Sglang`]: the newest `num_recent_pages` pages, and the best
///   `min(max(budget − num_recent_pages, 1), max(recent_start, 1))` of the
///   pages before them (`recent_start = n_pages − num_recent_pages`, none
///   when it is 0).
///
/// # Panics
/// If `out` is narrower than [`count`] (callers size it with
/// [`super::width`]).
pub fn select_row(
    scores: &[f32],
    n_pages: usize,
    n_tokens: usize,
    page_size: usize,
    budget: usize,
    variant: Variant,
    out: &mut [i32],
) {
    let mut chosen = Vec::with_capacity(count(variant, budget, n_pages, n_tokens, page_size));
    match variant {
        Variant::Kernel => {
            if n_pages <= budget {
                chosen.extend(0..n_pages);
            } else {
                top(scores, n_pages - 1, budget - 1, &mut chosen);
                chosen.push(n_pages - 1);
            }
        }
        Variant::Eval => top(
            scores,
            n_pages,
            eval_pages(budget, n_pages, n_tokens, page_size),
            &mut chosen,
        ),
        Variant::Sglang {
            num_recent_pages: r,
        } => {
            let recent_start = n_pages.saturating_sub(r);
            if recent_start > 0 {
                let k = budget.saturating_sub(r).max(1).min(recent_start);
                top(scores, recent_start, k, &mut chosen);
            }
            chosen.extend(recent_start..n_pages);
        }
    }
    chosen.sort_unstable();
    assert!(chosen.len() <= out.len());
    for (o, p) in out.iter_mut().zip(
        chosen
            .iter()
            .map(|&p| p as i32)
            .chain(std::iter::repeat(-1)),
    ) {
        *o = p;
    }
}
