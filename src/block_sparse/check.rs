//! The block-selection rule (MiniMax-M3) applied to an engine's row: the
//! check of this rule, beside it, with the reasons it reports.
//!
//! A row for a query that sees `n` blocks is correct iff, besides the
//! structure every row owes (valid entries first, distinct, `0 <= b < n`):
//!
//! - every forced block is present: the first `min(init_blocks, n)` and the
//!   newest `local_blocks` (vLLM's kernel forces them with scores 1e30 and
//!   1e29; the rule forces them before any scoring);
//! - it holds exactly `min(max(top_blocks, #forced), n)` blocks — the budget
//!   includes the forced blocks;
//! - every chosen free block scores at least every rejected free block, up
//!   to the tolerance of the token check ([`crate::check`]): the forced
//!   blocks are not candidates, so their scores never enter the comparison.
//!
//! It holds because it is the rule of the module's docs ([`super`]) read
//! over a returned row: the same forced set and budget as
//! [`super::select_into`], and the token check's comparison for the free
//! blocks, so the rule's own rows always pass (the tests run them through
//! at random shapes). A forced set or budget that differs from the rule's
//! would break it (the rule's own rows would fail), and so would comparing
//! the forced blocks' scores: every engine that forces them with sentinel
//! scores would fail.
//!
//! The structural half and the tolerance are the shared machinery of
//! [`crate::check`] (`scan_row`, `Scored`); the batch entry point is
//! [`crate::check::check_rows`] with [`crate::check::Rule::Blocks`].

use super::BlockSparseConfig;
use crate::check::{
    scan_row, Filler, Problem, RowCheck, RowRule, Scored, Tolerance, Values, MAX_LISTED,
};
use crate::error::ArgumentError;

/// The block rule as [`crate::check::check_rows`] takes it
/// ([`crate::check::Rule::Blocks`]): its scores are a query's block scores,
/// its rows as wide as the config's selection, no DCP form.
impl RowRule for BlockSparseConfig {
    fn names(&self) -> (&'static str, &'static str) {
        ("block_scores", "visible_blocks")
    }

    fn reasons(&self) -> &'static [&'static str] {
        BLOCK_REASONS
    }

    fn needs(&self) -> Result<(&'static str, usize), ArgumentError> {
        self.validate().map_err(|e| ArgumentError::Invalid {
            argument: "config",
            message: e.to_string(),
        })?;
        Ok(("config", self.width()))
    }

    fn dcp(&self) -> bool {
        false
    }

    fn check_row(
        &self,
        sc: &Scored<'_>,
        raw: &[i64],
        row: &[i64],
        len: usize,
        _holes: bool,
        _filler: Filler,
    ) -> RowCheck {
        block_row(sc, raw, row, len, self)
    }
}

/// The reasons of the block check, in report order: the top-k's and
/// `missing_forced`.
pub const BLOCK_REASONS: &[&str] = &[
    "padding_hole",
    "duplicate",
    "not_causal",
    "not_in_table",
    "missing_forced",
    "wrong_count",
    "wrong_selection",
];

/// Checks one engine row of block ids against the row's exact block
/// `scores` (the max of `q · k` over each block's visible positions, as
/// [`super::block_scores_into`] gives them) for a query that
/// sees `n_blocks` blocks.
///
/// # Panics
/// If `scores` (or `magnitudes`) holds fewer than `n_blocks` entries, or
/// `rtol` is non-zero without magnitudes — the batch entry point
/// ([`crate::check::check_rows`]) checks both.
pub fn check_block_row(
    scores: &[f32],
    magnitudes: Option<&[f32]>,
    tol: Tolerance,
    row: &[i64],
    n_blocks: usize,
    cfg: &BlockSparseConfig,
) -> RowCheck {
    assert!(scores.len() >= n_blocks && magnitudes.is_none_or(|m| m.len() >= n_blocks));
    assert!(tol.rtol == 0.0 || magnitudes.is_some());
    let sc = Scored {
        scores: Values::F32(scores),
        magnitudes: magnitudes.map(Values::F32),
        tol,
    };
    block_row(&sc, row, row, n_blocks, cfg)
}

/// [`check_block_row`] on a row read back from the engine's `raw` one.
pub(crate) fn block_row(
    sc: &Scored<'_>,
    raw: &[i64],
    row: &[i64],
    n: usize,
    cfg: &BlockSparseConfig,
) -> RowCheck {
    let mut problems = Vec::new();
    let mapped = !std::ptr::eq(raw, row);
    let scan = scan_row(raw, row, n, false, mapped, Filler::MinusOne, &mut problems);
    // The rule's forced set: blocks 0..init_end and local_start..n.
    let init_end = cfg.init_blocks.min(n);
    let local_start = (n - cfg.local_blocks.min(n)).max(init_end);
    let n_forced = init_end + (n - local_start);
    let forced = (0..init_end).chain(local_start..n);
    let missing: Vec<usize> = forced.filter(|&b| !scan.is_chosen(b)).collect();
    if !missing.is_empty() {
        problems.push(Problem::MissingForced {
            blocks: missing.iter().copied().take(MAX_LISTED).collect(),
            n_missing: missing.len(),
        });
    }
    let expected = cfg.top_blocks.max(n_forced).min(n);
    if scan.selected.len() != expected {
        problems.push(Problem::WrongCount {
            valid: scan.selected.len(),
            expected,
        });
    }
    if problems.is_empty() {
        let free = init_end..local_start;
        let (chosen, rejected): (Vec<usize>, Vec<usize>) = free.partition(|&b| scan.is_chosen(b));
        problems.extend(sc.selection(&chosen, &rejected, expected - n_forced));
    }
    RowCheck { problems }
}
