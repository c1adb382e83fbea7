//! The witness rule: equality with what the rule makes of the buffer, and
//! each broken contract named.

use super::check::check_witness_rows;
use super::WitnessError;
use crate::check::Problem;
use crate::error::ArgumentError;

#[test]
fn the_witness_rule_is_equality_and_each_broken_contract_is_named() {
    // L = 16, S = 4: segments of 4 with edges 0, 4, 8, 12. The learned row
    // covers segments 1 and 2 (tokens 5, 9); keep = 8 - 4 = 4, so the
    // witnesses 0 and 12 land in slots 4 and 5.
    let before = [5, 9, -1, -1, -1, -1, -1, -1];
    let lens = [16];
    let mut rule = before;
    super::scatter_topology_witnesses(&mut rule, 8, &lens, 4).unwrap();
    assert_eq!(rule, [5, 9, -1, -1, 0, 12, -1, -1]);
    let check = |after: &[i32]| check_witness_rows(&before, after, 8, &lens, 4).unwrap();
    assert!(check(&rule)[0].is_correct());
    let why = |after: &[i32]| match &check(after)[0].problems[..] {
        [Problem::WrongWitness { why, slot, .. }, ..] => (*slot, *why),
        p => panic!("{p:?}"),
    };
    assert_eq!(
        why(&[5, 9, -1, -1, 12, 0, -1, -1]),
        (
            4,
            "a witness in the wrong slot (the run must ascend by segment)"
        )
    );
    assert_eq!(
        why(&[5, 9, -1, -1, 4, 12, -1, -1]),
        (4, "the edge of a segment the learned row already covers")
    );
    assert_eq!(
        why(&[5, 9, -1, -1, -1, 12, -1, -1]),
        (4, "not written: the learned entry is still there")
    );
    assert_eq!(
        why(&[5, 9, -1, -1, 0, 13, -1, -1]),
        (5, "not a segment's left edge")
    );
    assert_eq!(why(&[5, 9, -1, -1, 0, 16, -1, -1]), (5, "past the context"));
    assert_eq!(
        check(&[6, 9, -1, -1, 0, 12, -1, -1])[0].problems,
        vec![Problem::PrefixChanged {
            slot: 0,
            learned: 5,
            got: 6,
            n_changed: 1
        }]
    );
    assert_eq!(
        check(&[5, 9, -1, -1, 0, 12, 3, -1])[0].problems,
        vec![Problem::TailChanged {
            slot: 6,
            learned: -1,
            got: 3,
            n_changed: 1
        }]
    );
    // A refused buffer is refused, not judged: each refusal is `Invalid` and
    // names the argument at fault, with a message that says why.
    let refused = |after: &[i32], lens: &[i32], s: usize| {
        let e = check_witness_rows(&before, after, 8, lens, s).unwrap_err();
        match e {
            ArgumentError::Invalid { argument, message } => (argument, message),
            e => panic!("not Invalid: {e:?}"),
        }
    };
    assert_eq!(
        refused(&rule[..7], &lens, 4),
        (
            "after",
            "after has 7 entries but before has 8: the in-place call keeps the shape".into()
        )
    );
    // The rule's own refusal (`WitnessError::SegmentsOutOfRange`), blamed on
    // the same argument with the rule's message.
    assert_eq!(
        refused(&rule, &lens, 65),
        (
            "num_segments",
            WitnessError::SegmentsOutOfRange { num_segments: 65 }.to_string()
        )
    );
    assert_eq!(
        refused(&rule, &lens, 65).1,
        "num_segments=65 is out of range: it must be between 1 and 64"
    );
    // Every row needs its length, the off switch included: none is read past
    // the buffer, none is left unjudged.
    assert_eq!(
        refused(&before, &[16, 3], 0),
        (
            "context_lens",
            "before has 1 rows of 8 but context_lens has 2 entries: one per row".into()
        )
    );
    assert_eq!(
        refused(&rule, &[], 0),
        (
            "context_lens",
            "before has 1 rows of 8 but context_lens has 0 entries: one per row".into()
        )
    );
}
