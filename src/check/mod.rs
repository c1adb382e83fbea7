//! Is an engine's selection right? The token top-k rule applied to a row a
//! kernel returned, with the tolerance a lower-precision engine is owed.
//!
//! # The rule
//!
//! A row for a query with context `L` and budget `topk` is **correct** iff
//!
//! - its valid (non-negative) entries come first, then only padding (`-1`,
//!   or any negative value): no hole;
//! - they are distinct and causal, `0 <= x < L`;
//! - there are exactly `min(topk, L')` of them, `L'` the positions whose
//!   score is not `-inf` (**`-inf` is not selectable**, below) (so rows may
//!   be narrower than `topk`, as transformers' indexers return
//!   `min(index_topk, n_entries)` columns, when every row's `min(topk, L)`
//!   fits the width: [`check_rows`] refuses only a row that could select
//!   more);
//!
//! (the first three as the default [`Filler::MinusOne`] states them: an
//! engine that fills a short row another way says so with its [`Filler`]);
//! - every selected position scores at least every unselected one, up to
//!   the tolerance below.
//!
//! Engines return rows **unordered** and break ties at the threshold as
//! they like (vLLM's top-k by atomic arrival order), so the check never
//! compares index sets: it compares scores, which is the same as comparing
//! the selected-score multiset with the exact top-k's. Ties at the
//! threshold are therefore never errors.
//!
//! # The tolerance, defined
//!
//! Each exact score `s_t` carries an error bound `e_t = atol + rtol · m_t`,
//! where `m_t` is the magnitude a lower-precision engine's rounding scales
//! with — for the lightning indexer `Σ_h |w_h| · Σ_i |q_hi · k_ti|`, passed
//! in per position. A selected `a` and an unselected `b` with `s_a < s_b`
//! are a tie, not an error, when `s_b − s_a ≤ e_a + e_b`. So the row is
//! right iff `max over unselected b of (s_b − e_b) ≤ min over selected a
//! of (s_a + e_a)`, an O(L) test; the difference is the row's **margin**
//! (positive: wrong by that much). With `atol = rtol = 0` the check is
//! exact — what an engine's row owes the engine's *own* scores, the test
//! that catches a few-1e-4 threshold shift any tolerance would mask.
//!
//! Scores and magnitudes are float32 or float64 ([`Values`]), read in
//! place either way; a float64 score (kvselect's float64-exact indexer
//! scores, `kvselect.checking.check_indexer_topk`) is compared as it is, so
//! the report's threshold and listed scores are the input's own values.
//!
//! **`-inf` is not selectable.** A candidate whose exact score is `-inf`
//! (a block whose scores are all `-inf`, a masked position) does not count
//! toward the selection's size: a row holds `min(topk, L')` entries, `L'`
//! the candidates scored otherwise, as vLLM's and SGLang's DSA
//! candidate-block selectors write `-1` for such a candidate ("only -inf
//! denotes padding"). Which entries is decided by the order as for any
//! score, so selecting a `-inf` candidate while a finite one is left out
//! is a `wrong_selection`, and holding it besides the `L'` others a
//! `wrong_count`. (NaN is selectable and ranks as below.)
//!
//! NaN scores rank below every number (the indexer's order), and no
//! tolerance makes a NaN tie with a number: a selected NaN while a number
//! is left out is an error, whatever the bounds. `-0.0` and `+0.0` are one
//! score.
//!
//! # Layout
//!
//! This module holds the token top-k rule and what every rule's check
//! shares: [`Problem`], [`RowCheck`], the structural scan of a row, the
//! tolerance, the batch entry point [`check_rows`] and its [`Rule`]s,
//! engines' layouts (`layout.rs`) and the [`Report`] (`report.rs`). A
//! rule's own check and its reasons sit beside the rule, re-exported here:
//! [`check_block_row`] and [`BLOCK_REASONS`] in `block_sparse/check.rs`,
//! [`check_witness_rows`] and [`WITNESS_REASONS`] in `witness/check.rs`.
//! A rule checked against exact scores implements `RowRule` beside itself
//! (its names, reasons, width, DCP form and row check) and is one line of
//! `rules!`, which makes the [`Rule`] enum and dispatches to it: no match
//! on the rule anywhere else.

pub mod layout;
mod report;
#[cfg(test)]
mod tests_filler;
#[cfg(test)]
mod tests_layout;
#[cfg(test)]
mod tests_topk;

pub use crate::block_sparse::check::{check_block_row, BLOCK_REASONS};
use crate::block_sparse::BlockSparseConfig;
pub use crate::witness::check::{check_witness_rows, WITNESS_REASONS};
pub use layout::GlobalSlots;
pub use report::{ByReason, Detail, Report};

/// The reasons of the token top-k check, in report order.
pub const TOPK_REASONS: &[&str] = &[
    "padding_hole",
    "duplicate",
    "not_causal",
    "not_in_table",
    "wrong_count",
    "wrong_selection",
];

/// At most this many dropped and intruding positions are listed per row
/// (the counts are always complete).
pub const MAX_LISTED: usize = 16;

/// A row-relative id that stands for an engine entry naming no position of
/// its row (a global slot outside the request's block table): reported as
/// [`Problem::NotInTable`] with the engine's value.
pub const UNMAPPED: i64 = i64::MAX;

/// How an engine fills the slots of a row it has no position for (a row
/// that sees fewer than `topk` positions), and pads in general: the entries
/// the check ignores. Whatever the filler, a correct row holds exactly
/// `min(topk, L)` distinct valid entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Filler {
    /// `"-1"`: negative entries are padding and come after the valid ones
    /// (a valid entry after padding is a `padding_hole`); an entry at or
    /// past `L` is `not_causal`.
    #[default]
    MinusOne,
    /// `"past_context"` (transformers' DeepSeek-V3.2-family DSA modules,
    /// whose `torch.topk` over masked scores fills with masked future
    /// positions): an entry at or past the row's context `L`, or negative,
    /// is filler and ignored wherever it sits. An entry read back through a
    /// layout that names no position of its request is still `not_in_table`.
    PastContext,
    /// `"repeat"` (engines that repeat a position): an entry equal to an
    /// earlier valid entry of the row is filler, ignored wherever it sits;
    /// negative entries are padding as with `"-1"`. A row that repeats
    /// instead of selecting holds too few distinct entries (`wrong_count`).
    Repeat,
}

impl Filler {
    /// The rules' names, as `filler=` spells them.
    pub const NAMES: [&'static str; 3] = ["-1", "past_context", "repeat"];

    /// The rule named `name`, or `None`.
    pub fn from_name(name: &str) -> Option<Filler> {
        match name {
            "-1" => Some(Filler::MinusOne),
            "past_context" => Some(Filler::PastContext),
            "repeat" => Some(Filler::Repeat),
            _ => None,
        }
    }

    /// The rule's name.
    pub fn name(self) -> &'static str {
        match self {
            Filler::MinusOne => "-1",
            Filler::PastContext => "past_context",
            Filler::Repeat => "repeat",
        }
    }
}

/// The tolerance: `e_t = atol + rtol · magnitude_t`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Tolerance {
    pub atol: f64,
    pub rtol: f64,
}

/// One thing wrong with a row. A row can have several (its structure is
/// checked first; the selection only on a row whose structure is sound).
/// Serialised as a map: `reason` (the variant's snake_case name, as
/// [`Problem::reason`] gives it), then the fields in order.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum Problem {
    /// A valid entry after padding: slot `slot` holds `position` although
    /// an earlier slot was padding (the first such slot only).
    PaddingHole { slot: usize, position: i64 },
    /// `position` appears in `first` and again in `slot` (the row's first
    /// repeat); `n_slots` entries of the row repeat an earlier one.
    Duplicate {
        position: i64,
        first: usize,
        slot: usize,
        n_slots: usize,
    },
    /// `position` in `slot` is not in `0..context` (a future position, or
    /// past the keys; the row's first such entry); `value` is the engine's
    /// own entry when the row was read back through a layout (the global
    /// slot id that names `position`); `n_slots` entries of the row are at
    /// or past its `context`.
    NotCausal {
        slot: usize,
        position: i64,
        #[serde(skip_serializing_if = "Option::is_none")]
        value: Option<i64>,
        n_slots: usize,
        context: usize,
    },
    /// The engine's entry `value` in `slot` is a global slot id that maps to
    /// no position of the row's request (not a page of its block table, or
    /// an offset past the page).
    NotInTable { slot: usize, value: i64 },
    /// Witness rows: slot `slot < keep` no longer holds the learned entry
    /// (`n_changed` such slots).
    PrefixChanged {
        slot: usize,
        learned: i64,
        got: i64,
        n_changed: usize,
    },
    /// Witness rows: slot `slot` of the witness run holds `got` where the
    /// rule writes `expected`, and `why` names the contract it breaks
    /// (`n_wrong` such slots).
    WrongWitness {
        slot: usize,
        expected: i64,
        got: i64,
        why: &'static str,
        n_wrong: usize,
    },
    /// Witness rows: slot `slot` past the witness run no longer holds the
    /// learned entry (`n_changed` such slots).
    TailChanged {
        slot: usize,
        learned: i64,
        got: i64,
        n_changed: usize,
    },
    /// Forced blocks (init or local) the row lacks: the first
    /// [`MAX_LISTED`] of them, and how many.
    MissingForced {
        blocks: Vec<usize>,
        n_missing: usize,
    },
    /// `valid` distinct causal entries where the rule wants `expected =
    /// min(topk, len)`.
    WrongCount { valid: usize, expected: usize },
    /// The row's `threshold` is its exact `min(topk, len)`-th best score;
    /// `dropped` are unselected positions not below it that beat the worst
    /// selected one beyond the tolerance, `intruders` selected ones below
    /// it that the best unselected one beats (either list, when that leaves
    /// it empty, every such position regardless of the threshold), each
    /// with its score,
    /// the first [`MAX_LISTED`] by how far past the line they are (then by
    /// position). `margin` is how far the best unselected lower bound sits
    /// above the worst selected upper bound.
    WrongSelection {
        dropped: Vec<(usize, f64)>,
        intruders: Vec<(usize, f64)>,
        n_dropped: usize,
        n_intruders: usize,
        threshold: f64,
        margin: f64,
    },
}

/// The verdict on one row: correct iff `problems` is empty.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RowCheck {
    pub problems: Vec<Problem>,
}

impl RowCheck {
    pub fn is_correct(&self) -> bool {
        self.problems.is_empty()
    }
}

/// A score with the rule's order: NaN below every number, `-0.0 == +0.0`;
/// `lo`/`hi` are the ends of its tolerance interval.
#[derive(Clone, Copy)]
struct Bounded {
    nan: bool,
    lo: f64,
    hi: f64,
}

impl Bounded {
    fn new(s: f64, e: f64) -> Self {
        let v = s + 0.0;
        // An infinite score with an infinite bound spans every number.
        let or = |x: f64, inf: f64| if x.is_nan() { inf } else { x };
        Bounded {
            nan: s.is_nan(),
            lo: or(v - e, f64::NEG_INFINITY),
            hi: or(v + e, f64::INFINITY),
        }
    }
}

/// How far unselected `b` sits above selected `a` beyond the tolerance
/// (positive: `b` should have been chosen over `a`). A NaN never beats a
/// number and always loses to one.
fn excess(b: Bounded, a: Bounded) -> f64 {
    match (b.nan, a.nan) {
        (true, _) => f64::NEG_INFINITY,
        (false, true) => f64::INFINITY,
        // inf - inf: two infinite scores of one sign tie.
        (false, false) => match b.lo - a.hi {
            d if d.is_nan() => 0.0,
            d => d,
        },
    }
}

/// A row (or batch) of scores or magnitudes, float32 or float64, read in
/// place: one code path reads either through [`Values::get`] (a float32
/// value widened exactly).
#[derive(Debug, Clone, Copy)]
pub enum Values<'a> {
    F32(&'a [f32]),
    F64(&'a [f64]),
}

impl<'a> Values<'a> {
    pub fn len(&self) -> usize {
        match self {
            Values::F32(v) => v.len(),
            Values::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Entry `t`, as float64 (exactly the input's value).
    #[inline]
    pub fn get(&self, t: usize) -> f64 {
        match self {
            Values::F32(v) => f64::from(v[t]),
            Values::F64(v) => v[t],
        }
    }

    /// How many of the first `n` entries are exactly `-inf`.
    pub(crate) fn count_neg_inf(&self, n: usize) -> usize {
        match self {
            Values::F32(v) => v[..n].iter().filter(|&&x| x == f32::NEG_INFINITY).count(),
            Values::F64(v) => v[..n].iter().filter(|&&x| x == f64::NEG_INFINITY).count(),
        }
    }

    /// Entries `at .. at + n`.
    pub fn part(&self, at: usize, n: usize) -> Values<'a> {
        match *self {
            Values::F32(v) => Values::F32(&v[at..at + n]),
            Values::F64(v) => Values::F64(&v[at..at + n]),
        }
    }
}

impl<'a> From<&'a [f32]> for Values<'a> {
    fn from(v: &'a [f32]) -> Self {
        Values::F32(v)
    }
}

impl<'a> From<&'a [f64]> for Values<'a> {
    fn from(v: &'a [f64]) -> Self {
        Values::F64(v)
    }
}

/// Checks one row against its exact scores.
///
/// `scores[t]` is the exact score of position `t` for `t < len` (at least
/// `len` entries); `magnitudes`, if given, `m_t` alike (required for a
/// non-zero `rtol`; see the module docs). `row` is the engine's row, any
/// order, negative entries padding. [`check_topk_row_values`] takes float64
/// scores too.
///
/// # Panics
/// If `scores` (or `magnitudes`) holds fewer than `len` entries, or `rtol`
/// is non-zero without magnitudes — the public entry points check both.
pub fn check_topk_row(
    scores: &[f32],
    magnitudes: Option<&[f32]>,
    tol: Tolerance,
    row: &[i64],
    len: usize,
    topk: usize,
) -> RowCheck {
    check_topk_row_values(
        Values::F32(scores),
        magnitudes.map(Values::F32),
        tol,
        row,
        len,
        topk,
    )
}

/// [`check_topk_row`] of float32 or float64 scores and magnitudes.
///
/// # Panics
/// As [`check_topk_row`].
pub fn check_topk_row_values(
    scores: Values<'_>,
    magnitudes: Option<Values<'_>>,
    tol: Tolerance,
    row: &[i64],
    len: usize,
    topk: usize,
) -> RowCheck {
    check_topk_row_with(scores, magnitudes, tol, row, len, topk, Filler::MinusOne)
}

/// [`check_topk_row_values`] with the engine's [`Filler`].
///
/// # Panics
/// As [`check_topk_row`].
pub fn check_topk_row_with(
    scores: Values<'_>,
    magnitudes: Option<Values<'_>>,
    tol: Tolerance,
    row: &[i64],
    len: usize,
    topk: usize,
    filler: Filler,
) -> RowCheck {
    assert!(scores.len() >= len && magnitudes.is_none_or(|m| m.len() >= len));
    assert!(tol.rtol == 0.0 || magnitudes.is_some());
    let sc = Scored {
        scores,
        magnitudes,
        tol,
    };
    topk_row(&sc, row, row, len, topk, false, filler)
}

/// [`check_topk_row`] on a row read back from the engine's `raw` one
/// (`holes`: padding may sit anywhere).
fn topk_row(
    sc: &Scored<'_>,
    raw: &[i64],
    row: &[i64],
    len: usize,
    topk: usize,
    holes: bool,
    filler: Filler,
) -> RowCheck {
    // A candidate scored exactly -inf is not selectable: it does not count
    // toward the selection's size (vLLM's and SGLang's DSA candidate-block
    // selectors write -1 for it).
    let blocked = sc.scores.count_neg_inf(len);
    let (scan, mut problems, expected) =
        topk_structure(raw, row, len, blocked, topk, holes, filler);
    if problems.is_empty() {
        let mut unselected = Vec::with_capacity(len - scan.selected.len());
        unselected.extend((0..len).filter(|&t| !scan.is_chosen(t)));
        problems.extend(sc.selection(&scan.selected, &unselected, expected));
    }
    RowCheck { problems }
}

/// The structural half of the token top-k rule on one row ([`scan_row`],
/// then the count: `min(topk, len - blocked)` valid entries, `blocked` of
/// the `len` positions being unselectable): the row's scan, its problems and
/// the count it must hold. The selection half runs only on a row without
/// problems.
fn topk_structure(
    raw: &[i64],
    row: &[i64],
    len: usize,
    blocked: usize,
    topk: usize,
    holes: bool,
    filler: Filler,
) -> (Scan, Vec<Problem>, usize) {
    let mut problems = Vec::new();
    // Read back through a layout iff `row` is not the engine's `raw` itself.
    let mapped = !std::ptr::eq(raw, row);
    let scan = scan_row(raw, row, len, holes, mapped, filler, &mut problems);
    let expected = topk.min(len - blocked);
    if scan.selected.len() != expected {
        problems.push(Problem::WrongCount {
            valid: scan.selected.len(),
            expected,
        });
    }
    (scan, problems, expected)
}

/// A row's valid entries, read once.
pub(crate) struct Scan {
    /// The slot holding each id in `0..len` (`usize::MAX`: not chosen).
    chosen: Vec<usize>,
    /// The distinct in-range ids, in slot order.
    pub(crate) selected: Vec<usize>,
}

impl Scan {
    pub(crate) fn is_chosen(&self, id: usize) -> bool {
        self.chosen[id] != usize::MAX
    }
}

/// The structural half of the rule (padding after the valid entries unless
/// `holes` allows it anywhere — DCP's ranks leave their remote slots `-1`
/// in place — each in `0..len`, no duplicate; the entries `filler` names
/// ignored), shared by tokens and blocks. `row` holds
/// row-relative ids and, when `mapped` (read back through a layout),
/// [`UNMAPPED`] where the engine's entry (in `raw`, the row as the engine
/// wrote it) named no position of the row; unmapped, every entry is read as
/// the position it says. A row's not-causal entries are one problem (its
/// first, and how many), its duplicates alike.
pub(crate) fn scan_row(
    raw: &[i64],
    row: &[i64],
    len: usize,
    holes: bool,
    mapped: bool,
    filler: Filler,
    problems: &mut Vec<Problem>,
) -> Scan {
    let mut chosen = vec![usize::MAX; len];
    let mut selected = Vec::with_capacity(row.len().min(len));
    // With `holes`, or filler that may sit anywhere, padding may sit
    // anywhere (a hole is then no fault).
    let anywhere = holes || filler == Filler::PastContext;
    let (mut padding_at, mut hole) = (None, anywhere);
    // Where the row's one not-causal / duplicate problem sits in `problems`.
    let (mut not_causal, mut duplicate) = (None::<usize>, None::<usize>);
    for (slot, (&x, &engine)) in row.iter().zip(raw).enumerate() {
        if x < 0 {
            padding_at.get_or_insert(slot);
            continue;
        }
        let unmapped = mapped && x == UNMAPPED;
        let in_range = usize::try_from(x).ok().filter(|&p| p < len);
        if filler == Filler::PastContext && !unmapped && in_range.is_none() {
            continue; // a future position: the engine's filler
        }
        if filler == Filler::Repeat && in_range.is_some_and(|p| chosen[p] != usize::MAX) {
            continue; // a repeat of a valid entry: the engine's filler
        }
        if padding_at.is_some() && !hole {
            hole = true;
            // The engine's own value when it names no position of the row.
            let position = if unmapped { engine } else { x };
            problems.push(Problem::PaddingHole { slot, position });
        }
        if unmapped {
            problems.push(Problem::NotInTable {
                slot,
                value: engine,
            });
            continue;
        }
        let Some(p) = in_range else {
            match not_causal.and_then(|i| problems.get_mut(i)) {
                Some(Problem::NotCausal { n_slots, .. }) => *n_slots += 1,
                _ => {
                    not_causal = Some(problems.len());
                    problems.push(Problem::NotCausal {
                        slot,
                        position: x,
                        value: mapped.then_some(engine),
                        n_slots: 1,
                        context: len,
                    });
                }
            }
            continue;
        };
        if chosen[p] != usize::MAX {
            match duplicate.and_then(|i| problems.get_mut(i)) {
                Some(Problem::Duplicate { n_slots, .. }) => *n_slots += 1,
                _ => {
                    duplicate = Some(problems.len());
                    problems.push(Problem::Duplicate {
                        position: x,
                        first: chosen[p],
                        slot,
                        n_slots: 1,
                    });
                }
            }
            continue;
        }
        chosen[p] = slot;
        selected.push(p);
    }
    Scan { chosen, selected }
}

/// Exact scores with their tolerance: the selection half of the rule.
#[derive(Clone, Copy)]
pub(crate) struct Scored<'a> {
    pub(crate) scores: Values<'a>,
    pub(crate) magnitudes: Option<Values<'a>>,
    pub(crate) tol: Tolerance,
}

impl Scored<'_> {
    /// Whether `selected` (the chosen candidates) score at least every one
    /// of `unselected` (the rest), up to the tolerance; `want` is how many
    /// of the candidates the rule selects (the threshold is the `want`-th
    /// best). `None` when they do.
    pub(crate) fn selection(
        &self,
        selected: &[usize],
        unselected: &[usize],
        want: usize,
    ) -> Option<Problem> {
        let (scores, magnitudes, tol) = (self.scores, self.magnitudes, self.tol);
        let bound = |t: usize| {
            // rtol = 0 means no relative term, even for an infinite magnitude
            // (0 · inf would be NaN); a NaN magnitude adds none either (the
            // batch entry point refuses one).
            let rel = match (tol.rtol, magnitudes) {
                (r, Some(m)) if r != 0.0 => tol.rtol * m.get(t).abs(),
                _ => 0.0,
            };
            let e = if rel.is_nan() {
                tol.atol
            } else {
                tol.atol + rel
            };
            Bounded::new(scores.get(t), e)
        };
        let (worst, best) = self.extremes(selected, unselected);
        let (Some(worst), Some(best)) = (worst, best) else {
            return None; // nothing selected or nothing left out
        };
        let margin = excess(best, worst);
        if margin <= 0.0 {
            return None;
        }
        // Dropped: unselected positions that beat the worst selected one beyond
        // the tolerance and are not below the threshold (the exact
        // `expected`-th best score: a wrong row always has one, its best
        // unselected); intruders: selected ones strictly below the threshold
        // that the best unselected one beats (none when they tie it).
        let candidates: Vec<f64> = selected
            .iter()
            .chain(unselected)
            .map(|&t| scores.get(t))
            .collect();
        let threshold = kth_best(&candidates, want);
        let t_key = rank_key64(threshold);
        let key = |t: usize| rank_key64(scores.get(t));
        // (With tolerances that differ by position, the position that beats the
        // selection can sit below the threshold: then every unselected position
        // past the line is listed, so the report always names it.)
        let over = |b: usize| excess(bound(b), worst);
        let mut dropped: Vec<(usize, f64)> = unselected
            .iter()
            .copied()
            .filter(|&b| key(b) >= t_key)
            .map(|b| (b, over(b)))
            .filter(|&(_, x)| x > 0.0)
            .collect();
        if dropped.is_empty() {
            dropped = unselected
                .iter()
                .map(|&b| (b, over(b)))
                .filter(|&(_, x)| x > 0.0)
                .collect();
        }
        let under = |a: usize| excess(best, bound(a));
        let mut intruders: Vec<(usize, f64)> = selected
            .iter()
            .filter(|&&a| key(a) < t_key)
            .map(|&a| (a, under(a)))
            .filter(|&(_, x)| x > 0.0)
            .collect();
        if intruders.is_empty() {
            intruders = selected
                .iter()
                .map(|&a| (a, under(a)))
                .filter(|&(_, x)| x > 0.0)
                .collect();
        }
        let by_excess = |x: &(usize, f64), y: &(usize, f64)| {
            y.1.partial_cmp(&x.1)
                .unwrap_or(std::cmp::Ordering::Equal)
                .then(x.0.cmp(&y.0))
        };
        dropped.sort_by(by_excess);
        intruders.sort_by(by_excess);
        let list = |v: &[(usize, f64)]| -> Vec<(usize, f64)> {
            v.iter()
                .take(MAX_LISTED)
                .map(|&(t, _)| (t, scores.get(t)))
                .collect()
        };
        Some(Problem::WrongSelection {
            dropped: list(&dropped),
            intruders: list(&intruders),
            n_dropped: dropped.len(),
            n_intruders: intruders.len(),
            threshold,
            margin,
        })
    }
}

impl Scored<'_> {
    /// The worst selected (lowest upper end, the first of equals) and the
    /// best unselected (highest lower end, the last of equals) in the rule's
    /// order (NaN below every number): `min_by` / `max_by` of each
    /// position's [`Bounded`], one loop per format of the scores and
    /// magnitudes (on a long right row this pass is the check's cost, and a
    /// format matched per position kept it from being one tight loop).
    fn extremes(
        &self,
        selected: &[usize],
        unselected: &[usize],
    ) -> (Option<Bounded>, Option<Bounded>) {
        use Values::{F32, F64};
        let tol = self.tol;
        match (self.scores, self.magnitudes) {
            (F32(s), None) => extremes_in(tol, s, None::<&[f32]>, selected, unselected),
            (F64(s), None) => extremes_in(tol, s, None::<&[f32]>, selected, unselected),
            (F32(s), Some(F32(m))) => extremes_in(tol, s, Some(m), selected, unselected),
            (F32(s), Some(F64(m))) => extremes_in(tol, s, Some(m), selected, unselected),
            (F64(s), Some(F32(m))) => extremes_in(tol, s, Some(m), selected, unselected),
            (F64(s), Some(F64(m))) => extremes_in(tol, s, Some(m), selected, unselected),
        }
    }
}

/// A float32 or float64 slice read as float64 (exactly).
trait Widen: Copy {
    fn at(self, t: usize) -> f64;
}

impl Widen for &[f32] {
    #[inline(always)]
    fn at(self, t: usize) -> f64 {
        f64::from(self[t])
    }
}

impl Widen for &[f64] {
    #[inline(always)]
    fn at(self, t: usize) -> f64 {
        self[t]
    }
}

/// [`Scored::extremes`] of one format: position `t`'s bound is that of
/// [`Scored::selection`] (no relative term at `rtol = 0` or for a NaN
/// magnitude).
#[inline(always)]
fn extremes_in<S: Widen, M: Widen>(
    tol: Tolerance,
    s: S,
    m: Option<M>,
    selected: &[usize],
    unselected: &[usize],
) -> (Option<Bounded>, Option<Bounded>) {
    let bound = |t: usize| {
        let rel = match (tol.rtol, m) {
            (r, Some(m)) if r != 0.0 => r * m.at(t).abs(),
            _ => 0.0,
        };
        let e = if rel.is_nan() {
            tol.atol
        } else {
            tol.atol + rel
        };
        Bounded::new(s.at(t), e)
    };
    let cmp = |x: (bool, f64), y: (bool, f64)| x.0.cmp(&y.0).then(x.1.total_cmp(&y.1));
    let mut worst: Option<Bounded> = None;
    for &a in selected {
        let x = bound(a);
        if worst.is_none_or(|w| cmp((!x.nan, x.hi), (!w.nan, w.hi)).is_lt()) {
            worst = Some(x);
        }
    }
    // The best unselected over four interleaved runs, each keeping its
    // highest lower end (`lo` is never NaN: Bounded::new makes it -inf) and
    // where; positions of equal keys are interchangeable (`selection` reads
    // only the best's `nan` and `lo`), and `-0.0` against `+0.0` decides no
    // comparison there (a zero margin or excess is no fault either way).
    const RUNS: usize = 4;
    let (mut top, mut at) = ([f64::NEG_INFINITY; RUNS], [usize::MAX; RUNS]);
    let mut nan_at = None;
    let mut runs = unselected.chunks_exact(RUNS);
    for c in &mut runs {
        for j in 0..RUNS {
            let x = bound(c[j]);
            if x.nan {
                nan_at = Some(c[j]);
            } else if x.lo >= top[j] {
                (top[j], at[j]) = (x.lo, c[j]);
            }
        }
    }
    for &b in runs.remainder() {
        let x = bound(b);
        if x.nan {
            nan_at = Some(b);
        } else if x.lo >= top[0] {
            (top[0], at[0]) = (x.lo, b);
        }
    }
    let mut pick = None::<usize>;
    for j in 0..RUNS {
        if at[j] != usize::MAX && pick.is_none_or(|p| top[j] >= top[p]) {
            pick = Some(j);
        }
    }
    let best = pick.map(|j| at[j]).or(nan_at).map(bound);
    (worst, best)
}

/// A float64 score's rank key: larger is better, NaN lowest (0), `-0.0 ==
/// +0.0` — the indexer's float32 order (`crate::indexer::rank_key`), which
/// it equals on widened float32 scores.
fn rank_key64(score: f64) -> u64 {
    if score.is_nan() {
        return 0;
    }
    let b = (score + 0.0).to_bits();
    if b >> 63 == 1 {
        !b
    } else {
        b | (1 << 63)
    }
}

/// The `k`-th best score of `scores` in the rule's order (`k >= 1`).
fn kth_best(scores: &[f64], k: usize) -> f64 {
    let mut keys: Vec<u64> = scores.iter().map(|&s| rank_key64(s)).collect();
    let i = keys.len() - k;
    let (_, &mut key, _) = keys.select_nth_unstable(i);
    // Back from the rank key to a score (NaN for key 0).
    match key {
        0 => f64::NAN,
        k if k >> 63 == 1 => f64::from_bits(k & !(1 << 63)),
        k => f64::from_bits(!k),
    }
}

/// A rule whose rows are checked against exact scores: what [`check_rows`]
/// needs of it. Each rule implements it beside its rule (the token top-k
/// here, [`crate::block_sparse::check`] for blocks) and is listed once in
/// [`Rule`] (`rules!`), which dispatches to it.
pub(crate) trait RowRule {
    /// The Python names of the batch's scores and of its per-row candidate
    /// counts, as messages name them.
    fn names(&self) -> (&'static str, &'static str);
    /// The reasons its check reports, in report order.
    fn reasons(&self) -> &'static [&'static str];
    /// The parameter that sets a row's width, and the slots a row needs to
    /// hold the rule's selection; a refusal when the parameter is unusable.
    fn needs(&self) -> Result<(&'static str, usize), crate::error::ArgumentError>;
    /// The slots a row with `len` candidates needs, when that is less than
    /// [`RowRule::needs`]' count for a row that sees fewer candidates (the
    /// token top-k's `min(topk, L)`): rows narrower than the rule's count
    /// are then accepted when every row's own count fits. `None`: every row
    /// needs the rule's count (the default).
    fn visible(&self, _len: usize) -> Option<usize> {
        None
    }
    /// Whether rows may be a DCP layout's ranks side by side.
    fn dcp(&self) -> bool;
    /// Whether [`RowRule::check_row`] reads the scores (a rule that does
    /// not takes a batch with none).
    fn reads_scores(&self) -> bool {
        true
    }
    /// One row: `raw` as the engine wrote it, `row` the same read back
    /// through a layout (or `raw` itself), `len` its candidates, `holes`
    /// whether padding may sit anywhere.
    fn check_row(
        &self,
        sc: &Scored<'_>,
        raw: &[i64],
        row: &[i64],
        len: usize,
        holes: bool,
        filler: Filler,
    ) -> RowCheck;
}

/// The token top-k rule with budget `k`: `min(k, L)` of the `L` positions
/// ([`check_topk_row`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct TopkRule(pub usize);

impl From<usize> for TopkRule {
    fn from(k: usize) -> Self {
        TopkRule(k)
    }
}

impl RowRule for TopkRule {
    fn names(&self) -> (&'static str, &'static str) {
        ("scores", "context_lens")
    }

    fn reasons(&self) -> &'static [&'static str] {
        TOPK_REASONS
    }

    fn needs(&self) -> Result<(&'static str, usize), crate::error::ArgumentError> {
        Ok(("topk", self.0))
    }

    fn visible(&self, len: usize) -> Option<usize> {
        Some(self.0.min(len))
    }

    fn dcp(&self) -> bool {
        true
    }

    fn check_row(
        &self,
        sc: &Scored<'_>,
        raw: &[i64],
        row: &[i64],
        len: usize,
        holes: bool,
        filler: Filler,
    ) -> RowCheck {
        topk_row(sc, raw, row, len, self.0, holes, filler)
    }
}

/// The token top-k rule's structural half alone, budget `k`: each row's
/// valid entries first, distinct, causal, `min(k, L)` of them; no score is
/// read ([`RowRule::reads_scores`]). For rows whose selection is already
/// known right: the exact indexer check's rows that its float64 verdict
/// passed, whose report is their structural faults alone (what
/// [`TopkRule`] reports of them against any equal scores, without the pass
/// over every position).
#[derive(Debug, Clone, Copy)]
pub(crate) struct TopkStructureRule(pub usize);

impl From<usize> for TopkStructureRule {
    fn from(k: usize) -> Self {
        TopkStructureRule(k)
    }
}

impl RowRule for TopkStructureRule {
    fn names(&self) -> (&'static str, &'static str) {
        TopkRule(self.0).names()
    }

    fn reasons(&self) -> &'static [&'static str] {
        TOPK_REASONS
    }

    fn needs(&self) -> Result<(&'static str, usize), crate::error::ArgumentError> {
        TopkRule(self.0).needs()
    }

    fn visible(&self, len: usize) -> Option<usize> {
        TopkRule(self.0).visible(len)
    }

    fn dcp(&self) -> bool {
        true
    }

    fn reads_scores(&self) -> bool {
        false
    }

    fn check_row(
        &self,
        _: &Scored<'_>,
        raw: &[i64],
        row: &[i64],
        len: usize,
        holes: bool,
        filler: Filler,
    ) -> RowCheck {
        let (_, problems, _) = topk_structure(raw, row, len, 0, self.0, holes, filler);
        RowCheck { problems }
    }
}

/// Lists the rules [`check_rows`] takes, once: each variant holds its rule's
/// parameter, and every [`RowRule`] method of [`Rule`] dispatches to the
/// rule's own implementation (`$imp`, made from the parameter by `From`). A
/// new rule is one line here and its `RowRule` impl beside it.
macro_rules! rules {
    ($($(#[$doc:meta])* $variant:ident($param:ty) => $imp:ty),* $(,)?) => {
        /// What a batch's rows are checked against.
        #[derive(Debug, Clone, Copy)]
        pub enum Rule {
            $($(#[$doc])* $variant($param),)*
        }

        impl Rule {
            fn with<R>(&self, f: impl FnOnce(&dyn RowRule) -> R) -> R {
                match *self {
                    $(Rule::$variant(p) => f(&<$imp>::from(p)),)*
                }
            }
        }
    };
}

rules! {
    /// The token top-k: `min(topk, L)` of the `L` positions
    /// ([`check_topk_row`]).
    Topk(usize) => TopkRule,
    /// The token top-k's structural half alone: each row's valid entries
    /// first, distinct, causal, `min(topk, L)` of them, its selection taken
    /// as right; `scores` and `magnitudes` are not read (pass them empty).
    TopkStructure(usize) => TopkStructureRule,
    /// MiniMax-M3's block selection with this config
    /// ([`check_block_row`]); a row's "context" is its visible block count.
    Blocks(BlockSparseConfig) => BlockSparseConfig,
}

impl Rule {
    /// The Python names of the batch's scores and of its per-row candidate
    /// counts.
    pub fn names(&self) -> (&'static str, &'static str) {
        self.with(|r| r.names())
    }

    /// The reasons this rule's check reports, in report order: each rule's
    /// list is kept beside its check.
    pub fn reasons(&self) -> &'static [&'static str] {
        self.with(|r| r.reasons())
    }

    fn needs(&self) -> Result<(&'static str, usize), crate::error::ArgumentError> {
        self.with(|r| r.needs())
    }

    fn visible(&self, len: usize) -> Option<usize> {
        self.with(|r| r.visible(len))
    }

    fn dcp(&self) -> bool {
        self.with(|r| r.dcp())
    }

    fn reads_scores(&self) -> bool {
        self.with(|r| r.reads_scores())
    }

    fn check_row(
        &self,
        sc: &Scored<'_>,
        raw: &[i64],
        row: &[i64],
        len: usize,
        holes: bool,
        filler: Filler,
    ) -> RowCheck {
        self.with(|r| r.check_row(sc, raw, row, len, holes, filler))
    }
}

/// The rows of a batch checked against their exact scores.
#[derive(Debug, Clone, Copy)]
pub struct Batch<'a> {
    /// `[n_rows, n_positions]`: row `i`'s exact score of candidate `t` (a
    /// position, or a block) at `i * n_positions + t` (only `t < lens[i]`
    /// is read), float32 or float64.
    pub scores: Values<'a>,
    /// `[n_rows, n_positions]` magnitudes `m_t`, or `None`.
    pub magnitudes: Option<Values<'a>>,
    pub n_positions: usize,
    /// `[n_rows, width]`: the engine's rows, negative entries padding.
    pub rows: &'a [i64],
    pub width: usize,
    /// `[n_rows]`: each row's candidates: its context `L`, or its visible
    /// blocks.
    pub lens: &'a [usize],
    /// How the engine wrote its ids: `None` row-relative, else global slot
    /// ids read back through this map ([`layout`]).
    pub global: Option<GlobalSlots<'a>>,
}

/// Every row of `batch` checked by `rule` (in parallel), after refusing
/// shapes that do not match, rows too narrow for the rule's selection (for
/// the token top-k: a row whose `min(topk, L)` exceeds the width, so a
/// width below `topk` is accepted when every row's visible count fits it;
/// for blocks: a width below the config's), a row with more candidates than `n_positions`, a
/// negative or non-finite tolerance, a non-zero `rtol` without magnitudes,
/// a NaN magnitude, and a global map that does not describe the rows.
pub fn check_rows(
    batch: &Batch<'_>,
    rule: Rule,
    tol: Tolerance,
) -> Result<Vec<RowCheck>, crate::error::ArgumentError> {
    check_rows_with(batch, rule, tol, Filler::MinusOne)
}

/// [`check_rows`] with the engine's [`Filler`] (token rows only: block rows
/// always pad with `-1`).
pub fn check_rows_with(
    batch: &Batch<'_>,
    rule: Rule,
    tol: Tolerance,
    filler: Filler,
) -> Result<Vec<RowCheck>, crate::error::ArgumentError> {
    use crate::error::{check_len, checked_size, ArgumentError};
    let b = batch;
    let n = b.lens.len();
    let invalid = |argument, message: String| Err(ArgumentError::Invalid { argument, message });
    // The Python parameters' names, which differ by rule.
    let (scores_name, lens_name) = rule.names();
    // A rule that reads no scores takes none (and no magnitudes).
    let reads = rule.reads_scores();
    let grid = match reads {
        true => checked_size(scores_name, &[n, b.n_positions])?,
        false => 0,
    };
    check_len(scores_name, b.scores.len(), grid, || {
        format!("[n_rows={n} ({lens_name}), n_candidates={}]", b.n_positions)
    })?;
    if let Some(m) = b.magnitudes {
        check_len("magnitudes", m.len(), grid, || "the shape of scores".into())?;
    }
    let rows = checked_size("rows", &[n, b.width])?;
    check_len("rows", b.rows.len(), rows, || {
        format!("[n_rows={n}, width={}]", b.width)
    })?;
    let (name, need) = rule.needs()?;
    if need > b.width {
        let message = format!(
            "the rule selects up to {need} but rows hold {} slots",
            b.width
        );
        // Rows narrower than the rule's count (transformers' indexers return
        // `min(index_topk, n_entries)` columns) are right when no row
        // selects more than they hold: refused at the first row that does.
        if rule.visible(0).is_none() {
            return invalid(name, message);
        }
        let fits = |l: usize| rule.visible(l).is_some_and(|v| v <= b.width);
        if let Some((i, &l)) = b.lens.iter().enumerate().find(|&(_, &l)| !fits(l)) {
            let v = rule.visible(l).unwrap_or(need);
            return invalid(
                name,
                format!("{message}: row {i} selects min({name}, {lens_name}[{i}] = {l}) = {v}"),
            );
        }
    }
    if let Some((i, &l)) = b.lens.iter().enumerate().find(|&(_, &l)| l > b.n_positions) {
        return Err(ArgumentError::OutOfRange {
            argument: lens_name,
            index: i,
            message: format!(
                "{lens_name}[{i}] = {l} but only {} candidates are scored",
                b.n_positions
            ),
        });
    }
    for (name, v) in [("atol", tol.atol), ("rtol", tol.rtol)] {
        if !(v >= 0.0 && v.is_finite()) {
            return invalid(
                name,
                format!("{name} = {v} must be finite and non-negative"),
            );
        }
    }
    if tol.rtol != 0.0 && b.magnitudes.is_none() {
        return invalid(
            "rtol",
            "rtol > 0 scales each score's magnitude: pass magnitudes (for the indexer, \
             Σ_h |w_h| Σ_i |q_hi k_ti|)"
                .into(),
        );
    }
    if let Some(m) = b.magnitudes.filter(|_| reads) {
        for (i, &l) in b.lens.iter().enumerate() {
            let row = m.part(i * b.n_positions, l);
            if let Some(t) = (0..l)
                .map(|t| row.get(t))
                .position(|x| x.is_nan() || x < 0.0)
            {
                return Err(ArgumentError::OutOfRange {
                    argument: "magnitudes",
                    index: i * b.n_positions + t,
                    message: format!(
                        "magnitudes[{i}, {t}] is {}: a bound must be a number >= 0 within each \
                         row's context",
                        row.get(t)
                    ),
                });
            }
        }
    }
    let inverse = match b.global {
        Some(g) => {
            g.check(n)?;
            Some(g.inverse())
        }
        None => None,
    };
    // DCP: the ranks' rows side by side, padding anywhere (each rank keeps
    // `-1` where a token is another rank's, unless it compacts).
    let ranks = b.global.map_or(1, |g| g.dcp_size);
    if ranks > 1 && (!rule.dcp() || !b.width.is_multiple_of(ranks)) {
        return invalid(
            "slots",
            format!(
                "a DCP layout reads token rows of dcp_size = {ranks} ranks side by side: the \
                 rows' width ({}) must be a multiple of it (and blocks have no DCP form)",
                b.width
            ),
        );
    }
    let mut out = vec![RowCheck::default(); n];
    let (t, w) = (b.n_positions, b.width);
    // A row's share of the scores: none for a rule that reads none.
    let scored = if reads { t } else { 0 };
    crate::pool::for_each_row_mut(&mut out, 1, crate::pool::min_rows(t.max(w)), |i, slot| {
        let scores = b.scores.part(i * scored, scored);
        let magnitudes = b.magnitudes.map(|m| m.part(i * scored, scored));
        let sc = Scored {
            scores,
            magnitudes,
            tol,
        };
        let raw = &b.rows[i * w..(i + 1) * w];
        let mut mapped = Vec::new();
        let row = match &inverse {
            Some(inv) => {
                inv.to_relative(i, raw, &mut mapped);
                &mapped[..]
            }
            None => raw,
        };
        slot[0] = rule.check_row(&sc, raw, row, b.lens[i], ranks > 1, filler);
    });
    Ok(out)
}
