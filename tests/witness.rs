//! The spec's fifteen tests for segment witnesses, under the spec's names.
//!
//! The first two and the refusals are the source's own hand examples, so a
//! divergence from the Python original fails before any property is
//! consulted. Randomised properties use fixed seeds.

use std::collections::HashSet;

use kvselect::attention::Selector;
use kvselect::witness::*;
use rand::{Rng, RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The left edge of segment `s`: `ceil(s·L / S_eff)`.
fn edge(s: usize, len: usize, num_segments: usize) -> i32 {
    let s_eff = num_segments.min(len);
    (s * len).div_ceil(s_eff) as i32
}

/// A random learned row of `topk` slots: distinct in-range tokens, padding
/// at random slots.
fn random_row(rng: &mut impl Rng, topk: usize, len: usize, padding: f64) -> Vec<i32> {
    let mut used = HashSet::new();
    (0..topk)
        .map(|_| {
            if rng.random_bool(padding) || used.len() == len {
                return -1;
            }
            loop {
                let x = rng.random_range(0..len) as i32;
                if used.insert(x) {
                    return x;
                }
            }
        })
        .collect()
}

#[test]
fn a_witness_fills_only_the_segment_the_learned_row_misses() {
    let w = topology_witness_indices(&[0, 5, 9, -1], 4, &[16], 4).unwrap();
    assert_eq!(w, vec![-1, -1, -1, 12]);
}

#[test]
fn the_merge_keeps_the_prefix_and_writes_witnesses_into_the_tail() {
    let out = apply_topology_witnesses(&[0, 5, 9, -1], 4, &[16], 2, 4, 2).unwrap();
    assert_eq!(out, vec![0, 5, 12, -1]);
}

#[test]
fn a_disabled_policy_is_the_identity() {
    let learned = vec![0, 5, 9, -1, 3, -1, -1, 7];
    let lens = [16, 8];

    // S = 0 is the off switch of the serving entry point.
    let mut buf = learned.clone();
    scatter_topology_witnesses(&mut buf, 4, &lens, 0).unwrap();
    assert_eq!(buf, learned);

    // B = 0, by max_replacements = 0 or by keeping the whole row.
    assert_eq!(
        apply_topology_witnesses(&learned, 4, &lens, 2, 4, 0).unwrap(),
        learned
    );
    assert_eq!(
        apply_topology_witnesses(&learned, 4, &lens, 4, 4, 4).unwrap(),
        learned
    );

    // Zero rows.
    assert!(apply_topology_witnesses(&[], 4, &[], 0, 4, 4)
        .unwrap()
        .is_empty());
    let mut empty: Vec<i32> = vec![];
    scatter_topology_witnesses(&mut empty, 4, &[], 4).unwrap();
}

#[test]
fn short_and_empty_rows_follow_the_source_fallback() {
    // A zero-length or negative-length row stays all padding.
    for len in [0, -1, -7, i32::MIN] {
        let learned = vec![-1; 4];
        assert_eq!(
            topology_witness_indices(&learned, 4, &[len], 4).unwrap(),
            vec![-1; 4]
        );
        assert_eq!(
            apply_topology_witnesses(&learned, 4, &[len], 0, 4, 4).unwrap(),
            learned
        );
        let mut buf = learned.clone();
        scatter_topology_witnesses(&mut buf, 4, &[len], 4).unwrap();
        assert_eq!(buf, learned);
    }
    // L < S: every segment is one token, and every token the row does not
    // hold becomes a witness.
    let w = topology_witness_indices(&[1, -1, -1, -1], 4, &[3], 8).unwrap();
    assert_eq!(w, vec![0, -1, 2, -1, -1, -1, -1, -1]);
    let merged = apply_topology_witnesses(&[1, -1, -1, -1], 4, &[3], 1, 8, 3).unwrap();
    assert_eq!(merged, vec![1, 0, 2, -1]);
}

#[test]
fn an_out_of_range_learned_index_is_clamped_rather_than_refused() {
    // L = 4, S = 8: σ(20) = 20·4/4 = 20 (segment_of is σ itself and does
    // not clamp); the occupancy pass clamps it to S - 1 = 7, beyond
    // S_eff = 4, as the original checks through topology_witness_indices.
    assert_eq!(segment_of(20, 4, 8), 20);
    // Segment 7 lies outside the partition, so every real segment still
    // gets its witness, and 20 passes through the merge.
    let w = topology_witness_indices(&[20, -1, -1, -1, -1], 5, &[4], 8).unwrap();
    assert_eq!(w, vec![0, 1, 2, 3, -1, -1, -1, -1]);
    let merged = apply_topology_witnesses(&[20, -1, -1, -1, -1], 5, &[4], 1, 8, 4).unwrap();
    assert_eq!(merged, vec![20, 0, 1, 2, 3]);
    // With S_eff = S it lands in the last real segment and occupies it:
    // σ(20) = 5 with L = 16, S = 4, clamped to 3 by the occupancy pass.
    assert_eq!(segment_of(20, 16, 4), 5);
    let w = topology_witness_indices(&[20, -1], 2, &[16], 4).unwrap();
    assert_eq!(w, vec![0, 4, 8, -1]);
    let merged = apply_topology_witnesses(&[20, -1, -1], 3, &[16], 1, 4, 2).unwrap();
    assert_eq!(merged, vec![20, 0, 4]);
    // σ is exact on the whole range, never clamped.
    assert_eq!(segment_of(i32::MAX as usize, i32::MAX as usize, 4), 4);
    assert_eq!(segment_of(usize::MAX, usize::MAX, usize::MAX), usize::MAX);
}

#[test]
fn malformed_calls_are_refused() {
    assert_eq!(
        topology_witness_indices(&[0, 5, 9], 4, &[16], 4),
        Err(WitnessError::RowsMismatch {
            learned_len: 3,
            topk: 4,
            rows: 1
        })
    );
    assert_eq!(
        apply_topology_witnesses(&[0, 5, 9, -1], 4, &[16, 16], 2, 4, 2),
        Err(WitnessError::RowsMismatch {
            learned_len: 4,
            topk: 4,
            rows: 2
        })
    );
    assert_eq!(
        topology_witness_indices(&[0, 5, 9, -1], 4, &[16], 0),
        Err(WitnessError::SegmentsOutOfRange { num_segments: 0 })
    );
    for s in [0, MAX_TOPOLOGY_SEGMENTS + 1] {
        assert_eq!(
            apply_topology_witnesses(&[0, 5, 9, -1], 4, &[16], 2, s, 2),
            Err(WitnessError::SegmentsOutOfRange { num_segments: s })
        );
    }
    assert_eq!(
        apply_topology_witnesses(&[0, 5, 9, -1], 4, &[16], 5, 4, 2),
        Err(WitnessError::LearnedKeepOutOfRange {
            learned_keep: 5,
            topk: 4
        })
    );
    // The index form accepts more than 64 segments: only the merge is
    // bounded by the 64-bit occupancy mask.
    // With L = 1000 and S = 65 (S_eff = 65), 0, 5 and 9 all fall in
    // segment 0 (σ(9) = floor(9·65/1000) = 0), so every other segment s is
    // a witness at its left edge e_s = ceil(s·1000/65); slot 0 is -1.
    let many = topology_witness_indices(&[0, 5, 9, -1], 4, &[1000], 65).unwrap();
    let edges: Vec<i32> = std::iter::once(-1)
        .chain((1..65usize).map(|s| (s * 1000).div_ceil(65) as i32))
        .collect();
    assert_eq!(many, edges);
    assert_eq!(&many[..4], &[-1, 16, 31, 47]);
    assert_eq!(many[13], 200, "13·1000/65 = 200 exactly: the edge itself");
    assert_eq!(many[64], 985);
    for (s, &e) in many.iter().enumerate().skip(1) {
        assert_eq!(segment_of(e as usize, 1000, 65), s, "σ(e_{s}) = {s}");
    }

    // A refused call to the serving entry point leaves the buffer untouched.
    let original = vec![0, 5, 9, -1, 3, 4, -1, -1];
    let mut buf = original.clone();
    assert_eq!(
        scatter_topology_witnesses(&mut buf, 4, &[16], 4),
        Err(WitnessError::RowsMismatch {
            learned_len: 8,
            topk: 4,
            rows: 1
        })
    );
    assert_eq!(buf, original);
    assert_eq!(
        scatter_topology_witnesses(&mut buf, 4, &[16, 16], 65),
        Err(WitnessError::SegmentsOutOfRange { num_segments: 65 })
    );
    assert_eq!(buf, original);
}

#[test]
fn every_witness_lands_in_its_own_segment() {
    for s in 1..=MAX_TOPOLOGY_SEGMENTS {
        for len in (1..=300).chain([1000, 4097, 65_536, 1 << 20, i32::MAX as usize]) {
            let s_eff = s.min(len);
            for seg in 0..s_eff {
                let e = edge(seg, len, s) as usize;
                assert!(e < len, "edge {e} of segment {seg} outside L={len}");
                assert_eq!(segment_of(e, len, s), seg, "L={len} S={s} s={seg}");
            }
        }
    }
    // Rounding the edge down instead does not round-trip: L = 10, S = 4,
    // s = 1 gives floor(10/4) = 2, which lies in segment 0.
    assert_eq!(segment_of(2, 10, 4), 0);
    assert_eq!(segment_of(3, 10, 4), 1);
}

#[test]
fn witnesses_are_causal_distinct_disjoint_and_complete() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for _ in 0..500 {
        let s = rng.random_range(1..=80usize);
        let len = match rng.random_range(0..3) {
            0 => rng.random_range(1..=s as i32 + 2),
            1 => rng.random_range(1..=5000),
            _ => rng.random_range(1..=i32::MAX),
        };
        let topk = rng.random_range(0..=64usize);
        let learned = random_row(&mut rng, topk, len as usize, 0.3);
        let w = topology_witness_indices(&learned, topk, &[len], s).unwrap();
        let witnesses: Vec<i32> = w.iter().copied().filter(|&x| x >= 0).collect();
        let set: HashSet<i32> = witnesses.iter().copied().collect();
        assert_eq!(set.len(), witnesses.len(), "witnesses are distinct");
        assert!(witnesses.iter().all(|&x| x < len), "witnesses are causal");
        assert!(
            learned.iter().all(|x| !set.contains(x)),
            "witnesses are disjoint from the learned row"
        );
        let union: Vec<i32> = learned.iter().chain(&witnesses).copied().collect();
        assert_eq!(
            segment_coverage(&union, len as usize, s),
            1.0,
            "K ∪ W(K) covers every segment"
        );
    }
}

#[test]
fn the_serving_row_is_causal_distinct_ordered_and_within_budget() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for _ in 0..200 {
        let s = rng.random_range(1..=MAX_TOPOLOGY_SEGMENTS);
        let topk = rng.random_range(1..=256usize);
        let rows = rng.random_range(1..=8usize);
        let lens: Vec<i32> = (0..rows).map(|_| rng.random_range(-2..=20_000)).collect();
        let mut buf = Vec::new();
        for &len in &lens {
            buf.extend(random_row(&mut rng, topk, len.max(0) as usize, 0.2));
        }
        let learned = buf.clone();
        scatter_topology_witnesses(&mut buf, topk, &lens, s).unwrap();

        let keep = topk.saturating_sub(s);
        for (r, &len) in lens.iter().enumerate() {
            let before = &learned[r * topk..(r + 1) * topk];
            let after = &buf[r * topk..(r + 1) * topk];
            assert_eq!(after[..keep], before[..keep], "the prefix is bit-identical");
            let changed: Vec<usize> = (keep..topk).filter(|&i| after[i] != before[i]).collect();
            assert!(changed.len() <= s, "at most S slots change");
            if let (Some(&first), Some(&last)) = (changed.first(), changed.last()) {
                assert_eq!(first, keep, "the witnesses start at keep");
                assert!(
                    after[keep..=last].windows(2).all(|p| p[0] < p[1]),
                    "one ascending run of witnesses: {:?}",
                    &after[keep..=last]
                );
                assert!(
                    after[keep..=last].iter().all(|&x| 0 <= x && x < len),
                    "causal"
                );
            }
            let valid: Vec<i32> = after.iter().copied().filter(|&x| x >= 0).collect();
            let set: HashSet<i32> = valid.iter().copied().collect();
            assert_eq!(set.len(), valid.len(), "the row stays distinct: {after:?}");
        }
    }
}

#[test]
fn every_segment_is_covered_when_the_reserved_tail_is_padding() {
    let mut rng = ChaCha8Rng::seed_from_u64(13);
    for _ in 0..200 {
        let s = rng.random_range(1..=MAX_TOPOLOGY_SEGMENTS);
        let topk = rng.random_range(s..=s + 300);
        let len = rng.random_range(1..=100_000i32);
        let mut row = random_row(&mut rng, topk - s, len as usize, 0.1);
        row.extend(std::iter::repeat_n(-1, s));
        scatter_topology_witnesses(&mut row, topk, &[len], s).unwrap();
        assert_eq!(segment_coverage(&row, len as usize, s), 1.0, "{row:?}");
    }
}

#[test]
fn overwriting_a_sole_tail_occupant_uncovers_its_segment() {
    // L = 16, S = 4, topk = 8: the serving merge keeps four slots. Segment 3's
    // only learned token (12) sits in the tail, so it counts as occupied, and
    // the witnesses for segments 1 and 2 then overwrite it.
    let mut row = vec![0, 1, 2, 3, 12, -1, -1, -1];
    scatter_topology_witnesses(&mut row, 8, &[16], 4).unwrap();
    assert_eq!(row, vec![0, 1, 2, 3, 4, 8, -1, -1]);
    assert_eq!(segment_coverage(&row, 16, 4), 0.75);
}

#[test]
fn permuting_the_learned_row_leaves_the_witness_set_unchanged() {
    let a = [0, 5, 9, -1];
    let b = [5, 9, 0, -1];
    let c = [-1, 9, 5, 0];
    let wa = topology_witness_indices(&a, 4, &[16], 4).unwrap();
    assert_eq!(topology_witness_indices(&b, 4, &[16], 4).unwrap(), wa);
    assert_eq!(topology_witness_indices(&c, 4, &[16], 4).unwrap(), wa);

    // The merge is positional: moving 0 across the keep boundary changes
    // the retained set from {0, 5, 12} to {5, 9, 12}.
    let set = |row: Vec<i32>| -> HashSet<i32> { row.into_iter().filter(|&x| x >= 0).collect() };
    let ma = apply_topology_witnesses(&a, 4, &[16], 2, 4, 2).unwrap();
    let mb = apply_topology_witnesses(&b, 4, &[16], 2, 4, 2).unwrap();
    assert_eq!(set(ma), HashSet::from([0, 5, 12]));
    assert_eq!(set(mb), HashSet::from([5, 9, 12]));
}

#[test]
fn the_nulls_spend_exactly_the_policy_budget() {
    let mut rng = ChaCha8Rng::seed_from_u64(17);
    for _ in 0..100 {
        let s = rng.random_range(1..=16usize);
        let topk = rng.random_range(s..=64);
        let len = rng.random_range(1..=4096i32);
        let mut row = random_row(&mut rng, topk - s, len as usize, 0.2);
        row.extend(std::iter::repeat_n(-1, s));
        scatter_topology_witnesses(&mut row, topk, &[len], s).unwrap();
        let k = row.iter().filter(|&&x| x >= 0).count();

        let seed = rng.random::<u64>();
        let random = random_null(len as usize, k, seed);
        assert_eq!(random.len(), k);
        assert!(random.windows(2).all(|p| p[0] < p[1]));
        assert!(random.iter().all(|&x| 0 <= x && x < len));

        let local = locality_null(len as usize, k);
        let want: Vec<i32> = (len - k as i32..len).collect();
        assert_eq!(local, want, "the locality null is exactly [L - k, L)");
    }
    // A budget past the context spends the whole context, no more.
    assert_eq!(locality_null(3, 10), vec![0, 1, 2]);
    assert_eq!(random_null(3, 10, 1), vec![0, 1, 2]);
    assert!(random_null(0, 4, 1).is_empty() && locality_null(0, 4).is_empty());
}

#[test]
fn the_nulls_are_the_last_row_of_the_attention_selectors() {
    for len in [1usize, 2, 7, 100, 5000] {
        for k in [0usize, 1, 3, 64, 6000] {
            for seed in [0u64, 1, 42, u64::MAX] {
                assert_eq!(
                    random_null(len, k, seed),
                    Selector::Random { budget: k, seed }.row(len - 1)
                );
            }
            assert_eq!(
                locality_null(len, k),
                Selector::Local { window: k }.row(len - 1)
            );
        }
    }
}

#[test]
fn coverage_and_recall_match_a_hand_computed_example() {
    // L = 8, S = 4: segments {0,1} {2,3} {4,5} {6,7}. Dyadic weights, so
    // every sum below is exact.
    let a: Vec<f64> = [64.0, 4.0, 26.0, 2.0, 16.0, 1.0, 14.0, 1.0]
        .iter()
        .map(|w| w / 128.0)
        .collect();
    assert_eq!(a.iter().sum::<f64>(), 1.0);

    // The learned top-4 is [0, 2, 1, 3] (segments 0 and 1 only); keeping two
    // and witnessing the rest gives [0, 2, 4, 6].
    let policy = apply_topology_witnesses(&[0, 2, 1, 3], 4, &[8], 2, 4, 2).unwrap();
    assert_eq!(policy, vec![0, 2, 4, 6]);
    assert_eq!(segment_coverage(&policy, 8, 4), 1.0);
    assert_eq!(attention_mass_recall(&policy, &a), 0.9375);

    let local = locality_null(8, 4);
    assert_eq!(local, vec![4, 5, 6, 7]);
    assert_eq!(segment_coverage(&local, 8, 4), 0.5);
    assert_eq!(attention_mass_recall(&local, &a), 0.25);

    // Padding, duplicates and out-of-range entries count for nothing.
    let noisy = [0, 2, 4, 6, -1, 0, 6, 8, 100, -5];
    assert_eq!(segment_coverage(&noisy, 8, 4), 1.0);
    assert_eq!(attention_mass_recall(&noisy, &a), 0.9375);
    let noisy_local = [4, 5, 6, 7, 7, -1, 9];
    assert_eq!(segment_coverage(&noisy_local, 8, 4), 0.5);
    assert_eq!(attention_mass_recall(&noisy_local, &a), 0.25);

    // No segments: coverage is 1. No mass: recall is NaN.
    assert_eq!(segment_coverage(&[1], 0, 4), 1.0);
    assert_eq!(segment_coverage(&[1], 8, 0), 1.0);
    assert!(attention_mass_recall(&[0], &[0.0, 0.0]).is_nan());
}

/// When a call is malformed in several ways, the refusal is the one the
/// original reports: it checks the rows first, then the segment count, then
/// the retained prefix.
#[test]
fn refusals_come_in_the_originals_order() {
    let mismatch = |learned_len, topk, rows| WitnessError::RowsMismatch {
        learned_len,
        topk,
        rows,
    };
    // Rows and segments both wrong: RowsMismatch, in every function.
    assert_eq!(
        topology_witness_indices(&[0, 5, 9], 4, &[16], 0),
        Err(mismatch(3, 4, 1))
    );
    let mut out = [0; 4];
    assert_eq!(
        kvselect::witness::topology_witness_indices_into(&[0, 5, 9], 4, &[16], 0, &mut out),
        Err(mismatch(3, 4, 1))
    );
    assert_eq!(
        apply_topology_witnesses(&[0, 5, 9], 4, &[16], 9, 65, 2),
        Err(mismatch(3, 4, 1))
    );
    let mut buf = [0, 5, 9];
    assert_eq!(
        scatter_topology_witnesses(&mut buf, 4, &[16], 65),
        Err(mismatch(3, 4, 1))
    );
    // Segments and prefix both wrong: SegmentsOutOfRange.
    assert_eq!(
        apply_topology_witnesses(&[0, 5, 9, -1], 4, &[16], 9, 0, 2),
        Err(WitnessError::SegmentsOutOfRange { num_segments: 0 })
    );
}

/// A caller's output buffer of the wrong size is refused as `out`'s fault,
/// in `out`'s words, after the learned rows' and the segment count's checks,
/// and leaves the buffer untouched.
#[test]
fn an_output_of_another_size_is_refused_naming_out() {
    use kvselect::witness::{apply_topology_witnesses_into, topology_witness_indices_into};
    let learned = [0, 5, 9, -1, 3, 4, 7, 8];
    for len in [0, 7, 9, 16] {
        let mut out = vec![i32::MIN + 3; len];
        let e = topology_witness_indices_into(&learned, 4, &[16, 16], 4, &mut out).unwrap_err();
        assert_eq!(
            e,
            WitnessError::OutMismatch {
                out_len: len,
                rows: 2,
                width: 4
            }
        );
        assert_eq!(e.argument(), "out");
        assert_eq!(
            e.to_string(),
            format!("out has {len} entries, but 2 context_lens rows x 4 slots needs 8")
        );
        assert!(out.iter().all(|&x| x == i32::MIN + 3));
        let e =
            apply_topology_witnesses_into(&learned, 4, &[16, 16], 1, 4, 2, &mut out).unwrap_err();
        assert_eq!(
            e,
            WitnessError::OutMismatch {
                out_len: len,
                rows: 2,
                width: 4
            }
        );
        assert!(out.iter().all(|&x| x == i32::MIN + 3));
    }
    // The rows' and the segment count's refusals come first.
    let mut out = [0; 3];
    assert!(matches!(
        topology_witness_indices_into(&learned, 4, &[16], 4, &mut out),
        Err(WitnessError::RowsMismatch { .. })
    ));
    assert_eq!(
        topology_witness_indices_into(&learned, 4, &[16, 16], 0, &mut out),
        Err(WitnessError::SegmentsOutOfRange { num_segments: 0 })
    );
}

/// Recall is the quotient kept / total as the original computes it, with no
/// special case for a row without mass: 0/0 is NaN, x/0 is ±inf.
#[test]
fn recall_is_the_plain_quotient_of_the_original() {
    assert_eq!(attention_mass_recall(&[0], &[1.0, -1.0]), f64::INFINITY);
    assert_eq!(attention_mass_recall(&[1], &[1.0, -1.0]), f64::NEG_INFINITY);
    assert!(attention_mass_recall(&[0], &[0.0, 0.0]).is_nan());
    assert!(attention_mass_recall(&[], &[0.0]).is_nan());
    assert_eq!(attention_mass_recall(&[], &[0.5, 0.5]), 0.0);
}

/// The contract the bindings rely on to hand back an output they did not
/// zero: `topology_witness_indices_into` and `apply_topology_witnesses_into`
/// write every slot of their output, at every size (the parallel path
/// included), or refuse before writing any.
#[test]
fn the_witness_outputs_are_written_in_full_at_every_size() {
    use kvselect::witness::{apply_topology_witnesses_into, topology_witness_indices_into};
    const SENTINEL: i32 = i32::MIN + 7;
    for &(rows, topk) in &[
        (0, 4),
        (1, 1),
        (3, 0),
        (5, 7),
        (64, 129),
        (512, 2048),
        (1, 1 << 20),
    ] {
        let learned: Vec<i32> = (0..rows * topk)
            .map(|i| if i % 3 == 0 { -1 } else { (i % 1000) as i32 })
            .collect();
        let lens: Vec<i32> = (0..rows).map(|r| [0, 1, 37, 5000, -2][r % 5]).collect();
        for s in [1, 17, 64] {
            let mut out = vec![SENTINEL; rows * s];
            topology_witness_indices_into(&learned, topk, &lens, s, &mut out).unwrap();
            assert!(
                !out.contains(&SENTINEL),
                "indices rows={rows} topk={topk} S={s}"
            );
            for keep in [0, topk / 2, topk] {
                let mut out = vec![SENTINEL; rows * topk];
                apply_topology_witnesses_into(&learned, topk, &lens, keep, s, s, &mut out).unwrap();
                assert!(
                    !out.contains(&SENTINEL),
                    "apply rows={rows} topk={topk} keep={keep}"
                );
            }
        }
        // A refusal writes nothing.
        let mut out = vec![SENTINEL; rows * topk];
        let refused =
            apply_topology_witnesses_into(&learned, topk, &lens, topk + 1, 4, 4, &mut out);
        assert_eq!(
            refused,
            Err(WitnessError::LearnedKeepOutOfRange {
                learned_keep: topk + 1,
                topk
            }),
            "rows={rows} topk={topk}"
        );
        assert_eq!(refused.unwrap_err().argument(), "learned_keep");
        assert!(out.iter().all(|&x| x == SENTINEL));
    }
}
