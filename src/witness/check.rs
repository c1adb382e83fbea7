//! The witness rule applied to an engine's in-place output: the check of
//! this rule, beside it, with the reasons it reports.
//!
//! The witness rule is integer-exact, so here equality is the test: a row
//! is correct iff it equals what [`scatter_topology_witnesses`] makes of the
//! buffer as it was before the call. A row that differs is told apart by
//! the spec's contracts, so the report says which one it breaks:
//!
//! - slots `[0, keep)` (`keep = topk − S`) are the learned row bit for bit;
//! - from `keep` on, one ascending run of witnesses, each the left edge of
//!   its own segment that the learned row leaves uncovered, up to the budget
//!   `min(S, topk)`;
//! - slots past the last witness are the learned row again.
//!
//! Equality holds as the test because the merge is deterministic integer
//! arithmetic with no ties and no tolerance ([`super`]): the rule has one
//! right row per input, and the check computes it with the rule's own
//! [`scatter_topology_witnesses`]. A check that re-derived the witnesses
//! itself could disagree with the rule it judges; the diagnosis of a wrong
//! row only names the contract broken, never decides whether it is wrong.

use super::{scatter_topology_witnesses, segment_of, topology_witness_indices_into, WitnessError};
use crate::check::{Problem, RowCheck};
use crate::error::ArgumentError;

/// The reasons of the witness check, in report order.
pub const WITNESS_REASONS: &[&str] = &["prefix_changed", "wrong_witness", "tail_changed"];

/// Every row of an engine's witness buffer checked against the rule:
/// `before` and `after` are `[rows, topk]` (the buffer before and after the
/// engine's in-place call), `context_lens` one per row. Refuses what
/// [`scatter_topology_witnesses`] refuses, and an `after` of another shape.
pub fn check_witness_rows(
    before: &[i32],
    after: &[i32],
    topk: usize,
    context_lens: &[i32],
    num_segments: usize,
) -> Result<Vec<RowCheck>, ArgumentError> {
    let refused = |e: WitnessError| ArgumentError::Invalid {
        argument: match e {
            WitnessError::SegmentsOutOfRange { .. } => "num_segments",
            WitnessError::RowsMismatch { .. } => "context_lens",
            WitnessError::OutMismatch { .. } => "after",
            WitnessError::LearnedKeepOutOfRange { .. } => "before",
        },
        message: e.to_string(),
    };
    // Every row needs its length, the off switch (S = 0) included: checked
    // before anything else, so no row is read past the buffer or left unjudged.
    if topk.checked_mul(context_lens.len()) != Some(before.len()) {
        return Err(ArgumentError::Invalid {
            argument: "context_lens",
            message: format!(
                "before has {} rows of {topk} but context_lens has {} entries: one per row",
                before.len().checked_div(topk).unwrap_or(0),
                context_lens.len()
            ),
        });
    }
    if after.len() != before.len() {
        return Err(ArgumentError::Invalid {
            argument: "after",
            message: format!(
                "after has {} entries but before has {}: the in-place call keeps the shape",
                after.len(),
                before.len()
            ),
        });
    }
    let mut expected = before.to_vec();
    scatter_topology_witnesses(&mut expected, topk, context_lens, num_segments).map_err(refused)?;
    let rows = context_lens.len();
    let mut out = vec![RowCheck::default(); rows];
    if topk == 0 {
        return Ok(out);
    }
    crate::pool::for_each_row_mut(&mut out, 1, crate::pool::min_rows(topk), |i, slot| {
        let span = i * topk..(i + 1) * topk;
        let (b, a, e) = (&before[span.clone()], &after[span.clone()], &expected[span]);
        if a != e {
            slot[0] = diagnose(b, a, e, context_lens[i], num_segments);
        }
    });
    Ok(out)
}

/// Why a row `a` that differs from the rule's `e` (made from `b`) is wrong.
fn diagnose(b: &[i32], a: &[i32], e: &[i32], len: i32, s: usize) -> RowCheck {
    let topk = b.len();
    let keep = if s == 0 { topk } else { topk.saturating_sub(s) };
    // The witnesses the rule wrote: e[keep..] up to the first slot it left.
    let mut witnesses = vec![-1; s.max(1)];
    if s > 0 {
        // Same inputs the scatter accepted: cannot be refused.
        let _ = topology_witness_indices_into(b, topk, &[len], s, &mut witnesses);
    }
    let present: Vec<i32> = witnesses.iter().copied().filter(|&w| w >= 0).collect();
    let written = present.len().min(topk - keep);
    let mut problems = Vec::new();
    let first_diff = |lo: usize, hi: usize| {
        let mut diff = (lo..hi).filter(|&t| a[t] != e[t]);
        diff.next().map(|t| (t, 1 + diff.count()))
    };
    if let Some((slot, n)) = first_diff(0, keep) {
        problems.push(Problem::PrefixChanged {
            slot,
            learned: b[slot].into(),
            got: a[slot].into(),
            n_changed: n,
        });
    }
    if let Some((slot, n)) = first_diff(keep, keep + written) {
        let why = why_wrong(a[slot], b, len, s, &present[..written], slot);
        problems.push(Problem::WrongWitness {
            slot,
            expected: e[slot].into(),
            got: a[slot].into(),
            why,
            n_wrong: n,
        });
    }
    if let Some((slot, n)) = first_diff(keep + written, topk) {
        problems.push(Problem::TailChanged {
            slot,
            learned: b[slot].into(),
            got: a[slot].into(),
            n_changed: n,
        });
    }
    RowCheck { problems }
}

/// Which contract the entry `got` in witness slot `slot` breaks (`run`:
/// the witnesses the rule writes, in order).
fn why_wrong(
    got: i32,
    learned: &[i32],
    len: i32,
    s: usize,
    run: &[i32],
    slot: usize,
) -> &'static str {
    if got == learned[slot] {
        return "not written: the learned entry is still there";
    }
    if got < 0 {
        return "padding where a witness belongs";
    }
    if got >= len.max(1) {
        return "past the context";
    }
    let l = len.max(1) as usize;
    let seg = segment_of(got as usize, l, s);
    let s_eff = s.min(l);
    let edge = (seg * l).div_ceil(s_eff);
    if edge != got as usize {
        return "not a segment's left edge";
    }
    let occupied = learned
        .iter()
        .filter(|&&x| x >= 0)
        .any(|&x| segment_of(x as usize, l, s).min(s - 1) == seg);
    if occupied {
        return "the edge of a segment the learned row already covers";
    }
    if run.contains(&got) {
        return "a witness in the wrong slot (the run must ascend by segment)";
    }
    "a witness past the budget, or one the learned row's tail already holds"
}
