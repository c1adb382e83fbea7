//! The report every checker returns, as data: `rows`, `correct`, `wrong`,
//! `by_reason` (how many rows have each reason, every reason of the check
//! listed in order, zeros included) and `details`, one entry per wrong row
//! with its problems. It serialises (serde) to the JSON shape the Python
//! bindings hand back and `kvselect check` writes: a problem is a map whose
//! first key, `reason`, is the variant's snake_case name, then its fields.
//!
//! The problems' fields, by reason: `padding_hole` {`slot`, `position`};
//! `duplicate` {`position`, `first`, `slot`, `n_slots`} (the row's first
//! repeat, and how many entries repeat an earlier one); `not_causal`
//! {`slot`, `position`, `value`, `n_slots`, `context`} (the row's first
//! entry at or past its context, the engine's slot id `value` when read
//! through a layout, how many such entries, the context `L`); `not_in_table`
//! {`slot`, `value`}; `missing_forced` {`blocks`, `n_missing`};
//! `wrong_count` {`valid`, `expected`}; `wrong_selection` {`dropped`,
//! `intruders`, `n_dropped`, `n_intruders`, `threshold`, `margin`}; the
//! witness reasons as [`super::Problem`] documents them. A row's filler
//! (see [`super::Filler`]) is thus one problem, never one per slot.

use serde::ser::{Serialize, Serializer};

use super::{Problem, RowCheck};

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
            debug_assert!(check.problems.iter().all(|p| reasons.contains(&p.reason())));
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
        s.collect_map(self.0.iter().copied())
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
    use crate::check::{BLOCK_REASONS, TOPK_REASONS, WITNESS_REASONS};

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

    /// One problem of every variant.
    fn every_variant() -> Vec<Problem> {
        vec![
            Problem::PaddingHole {
                slot: 1,
                position: 2,
            },
            Problem::Duplicate {
                position: 2,
                first: 0,
                slot: 1,
                n_slots: 1,
            },
            Problem::NotCausal {
                slot: 0,
                position: 9,
                value: Some(77),
                n_slots: 1,
                context: 4,
            },
            Problem::NotInTable { slot: 0, value: 5 },
            Problem::PrefixChanged {
                slot: 0,
                learned: 1,
                got: 2,
                n_changed: 1,
            },
            Problem::WrongWitness {
                slot: 3,
                expected: 4,
                got: 5,
                why: "not_a_witness",
                n_wrong: 1,
            },
            Problem::TailChanged {
                slot: 5,
                learned: 1,
                got: 2,
                n_changed: 1,
            },
            Problem::MissingForced {
                blocks: vec![0],
                n_missing: 1,
            },
            Problem::WrongCount {
                valid: 1,
                expected: 2,
            },
            Problem::WrongSelection {
                dropped: vec![(3, 1.5)],
                intruders: vec![(4, 0.5)],
                n_dropped: 1,
                n_intruders: 1,
                threshold: 1.0,
                margin: 1.0,
            },
        ]
    }

    #[test]
    fn a_problem_serialises_with_its_reason_first_and_that_reason_is_the_one_counted() {
        for p in every_variant() {
            let json = serde_json::to_string(&p).unwrap();
            let tag = format!("{{\"reason\":\"{}\",", p.reason());
            assert!(json.starts_with(&tag), "{json} does not start with {tag}");
            let listed = [TOPK_REASONS, BLOCK_REASONS, WITNESS_REASONS];
            assert!(listed.iter().any(|r| r.contains(&p.reason())), "{json}");
        }
    }

    #[test]
    fn a_position_read_in_place_has_no_engine_value_in_the_report() {
        let p = Problem::NotCausal {
            slot: 0,
            position: 9,
            value: None,
            n_slots: 3,
            context: 4,
        };
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(
            json,
            r#"{"reason":"not_causal","slot":0,"position":9,"n_slots":3,"context":4}"#
        );
    }

    #[test]
    fn a_report_serialises_in_the_documented_shape() {
        let checks = [row(vec![]), row(vec![every_variant().pop().unwrap()])];
        let json = serde_json::to_string(&Report::new(&checks, TOPK_REASONS)).unwrap();
        assert_eq!(
            json,
            r#"{"rows":2,"correct":1,"wrong":1,"by_reason":{"padding_hole":0,"duplicate":0,"not_causal":0,"not_in_table":0,"wrong_count":0,"wrong_selection":1},"details":[{"row":1,"problems":[{"reason":"wrong_selection","dropped":[[3,1.5]],"intruders":[[4,0.5]],"n_dropped":1,"n_intruders":1,"threshold":1.0,"margin":1.0}]}]}"#
        );
    }
}
