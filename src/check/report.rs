//! The report every checker returns, as data: `rows`, `correct`, `wrong`,
//! `by_reason` (how many rows have each reason, every reason of the check
//! listed in order, zeros included) and `details`, one entry per wrong row
//! with its problems. It serialises (serde) to the JSON shape the Python
//! bindings hand back and `kvselect check` writes: a problem is a map whose
//! first key, `reason`, is the variant's snake_case name, then its fields.

use serde::ser::{Serialize, Serializer};

use super::{Problem, RowCheck, Rule};

/// The reasons of the token top-k check, in report order.
pub const TOPK_REASONS: &[&str] = &[
    "padding_hole",
    "duplicate",
    "not_causal",
    "not_in_table",
    "wrong_count",
    "wrong_selection",
];

/// The reasons of the block check: the top-k's and `missing_forced`.
pub const BLOCK_REASONS: &[&str] = &[
    "padding_hole",
    "duplicate",
    "not_causal",
    "not_in_table",
    "missing_forced",
    "wrong_count",
    "wrong_selection",
];

/// The reasons of the witness check.
pub const WITNESS_REASONS: &[&str] = &["prefix_changed", "wrong_witness", "tail_changed"];

impl Rule {
    /// The reasons this rule's check reports, in report order.
    pub fn reasons(&self) -> &'static [&'static str] {
        match self {
            Rule::Topk(_) => TOPK_REASONS,
            Rule::Blocks(_) => BLOCK_REASONS,
        }
    }
}

/// A checked batch.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Report {
    pub rows: usize,
    pub correct: usize,
    pub wrong: usize,
    pub by_reason: ByReason,
    pub details: Vec<Detail>,
}

/// Rows per reason, in the check's order: a map when serialised.
#[derive(Debug, Clone, PartialEq)]
pub struct ByReason(pub Vec<(&'static str, usize)>);

/// A wrong row: its index in the batch and what is wrong with it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Detail {
    pub row: usize,
    pub problems: Vec<Problem>,
}

impl Report {
    /// The report of `checks` (one per row, in order) for a check whose
    /// reasons are `reasons` (each problem's [`Problem::reason`] is one).
    pub fn new(checks: &[RowCheck], reasons: &[&'static str]) -> Report {
        let mut by_reason: Vec<(&'static str, usize)> = reasons.iter().map(|&r| (r, 0)).collect();
        let mut details = Vec::new();
        for (row, check) in checks.iter().enumerate().filter(|(_, c)| !c.is_correct()) {
            for (reason, count) in by_reason.iter_mut() {
                *count += check.problems.iter().any(|p| p.reason() == *reason) as usize;
            }
            let problems = check.problems.clone();
            details.push(Detail { row, problems });
        }
        Report {
            rows: checks.len(),
            correct: checks.len() - details.len(),
            wrong: details.len(),
            by_reason: ByReason(by_reason),
            details,
        }
    }
}

impl Serialize for ByReason {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(reason, n)| (reason, n)))
    }
}

impl Problem {
    /// The variant's name as the report spells it (its `reason`).
    pub fn reason(&self) -> &'static str {
        match self {
            Problem::PaddingHole { .. } => "padding_hole",
            Problem::Duplicate { .. } => "duplicate",
            Problem::NotCausal { .. } => "not_causal",
            Problem::NotInTable { .. } => "not_in_table",
            Problem::PrefixChanged { .. } => "prefix_changed",
            Problem::WrongWitness { .. } => "wrong_witness",
            Problem::TailChanged { .. } => "tail_changed",
            Problem::MissingForced { .. } => "missing_forced",
            Problem::WrongCount { .. } => "wrong_count",
            Problem::WrongSelection { .. } => "wrong_selection",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(problems: Vec<Problem>) -> RowCheck {
        RowCheck { problems }
    }

    #[test]
    fn a_row_counts_once_per_reason_and_every_reason_is_listed() {
        let hole = Problem::PaddingHole {
            slot: 1,
            position: 3,
        };
        let count = Problem::WrongCount {
            valid: 1,
            expected: 2,
        };
        let checks = [
            row(vec![]),
            row(vec![hole.clone(), hole.clone(), count.clone()]),
            row(vec![count]),
        ];
        let r = Report::new(&checks, TOPK_REASONS);
        assert_eq!((r.rows, r.correct, r.wrong), (3, 1, 2));
        let want: Vec<(&str, usize)> = TOPK_REASONS
            .iter()
            .map(|&k| {
                (
                    k,
                    [("padding_hole", 1), ("wrong_count", 2)]
                        .iter()
                        .find(|e| e.0 == k)
                        .map_or(0, |e| e.1),
                )
            })
            .collect();
        assert_eq!(r.by_reason.0, want);
        assert_eq!(r.details.iter().map(|d| d.row).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(r.details[0].problems.len(), 3);
    }

    #[test]
    fn every_reason_a_check_can_report_is_one_of_its_reasons() {
        for r in [
            Problem::MissingForced {
                blocks: vec![],
                n_missing: 0,
            }
            .reason(),
            Problem::NotInTable { slot: 0, value: 0 }.reason(),
        ] {
            assert!(BLOCK_REASONS.contains(&r));
        }
        assert!(!TOPK_REASONS.contains(&"missing_forced"));
        for w in [
            Problem::PrefixChanged {
                slot: 0,
                learned: 0,
                got: 0,
                n_changed: 1,
            },
            Problem::WrongWitness {
                slot: 0,
                expected: 0,
                got: 0,
                why: "",
                n_wrong: 1,
            },
            Problem::TailChanged {
                slot: 0,
                learned: 0,
                got: 0,
                n_changed: 1,
            },
        ] {
            assert!(WITNESS_REASONS.contains(&w.reason()));
        }
    }
}
