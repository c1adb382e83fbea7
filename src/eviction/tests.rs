use super::*;
use crate::attention::AttentionShape;
use crate::simd::isas_for_test;

/// A deterministic pseudo-random float32 stream (xorshift), roughly
/// normal-sized values.
fn values(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
        })
        .collect()
}

fn bits(x: &[f64]) -> Vec<u64> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// Query `i`'s causal rows `[group, P]` from `metrics::attention_probabilities`
/// (the rows the policies' numbers are defined by).
fn metric_rows(pre: &Prefix, i: usize) -> Vec<f64> {
    let (p, g, d) = (pre.p_len, pre.group, pre.d);
    let shape = AttentionShape {
        n_queries: 1,
        n_q_heads: g,
        n_kv_heads: 1,
        d_k: d,
        d_v: d,
        n_keys: p,
    };
    let mut out = vec![0.0; g * p];
    let q = &pre.q[i * g * d..(i + 1) * g * d];
    crate::metrics::attention_probabilities(q, pre.k, &shape, &[i], pre.scale, &mut out).unwrap();
    out
}

/// SnapKV and ObservedAttention written out from the metric rows, in the
/// twin's order: the natively computed scores must equal them bit for bit.
fn snapkv_from_rows(pre: &Prefix, window: usize, kernel: usize) -> Vec<f64> {
    let (p, g) = (pre.p_len, pre.group);
    let keys = p - window;
    let mut per_head = vec![0.0; g * keys];
    for i in keys..p {
        let rows = metric_rows(pre, i);
        for h in 0..g {
            for j in 0..keys {
                per_head[h * keys + j] += rows[h * p + j];
            }
        }
    }
    let half = kernel / 2;
    let mut score = vec![0.0; keys];
    for h in 0..g {
        let mut pooled = vec![0.0; keys];
        for (j, o) in pooled.iter_mut().enumerate() {
            for tap in 0..kernel {
                let v = match (j + tap).checked_sub(half) {
                    Some(i) if i < keys => per_head[h * keys + i] / window as f64,
                    _ => 0.0,
                };
                *o += v;
            }
            *o /= kernel as f64;
        }
        for j in 0..keys {
            score[j] += pooled[j];
        }
    }
    for s in score.iter_mut() {
        *s /= g as f64;
    }
    let top = score.iter().cloned().fold(f64::NEG_INFINITY, f64::max) + 1.0;
    score.extend(std::iter::repeat_n(top, window));
    score
}

fn observed_from_rows(pre: &Prefix) -> Vec<f64> {
    let (p, g) = (pre.p_len, pre.group);
    let mut acc = vec![0.0; g * p];
    for i in 0..p {
        let rows = metric_rows(pre, i);
        for (a, r) in acc.iter_mut().zip(&rows) {
            *a += r;
        }
    }
    let mut score = vec![0.0; p];
    for h in 0..g {
        for j in 0..p {
            score[j] += acc[h * p + j] / (p - j) as f64;
        }
    }
    score.iter().map(|s| s / g as f64).collect()
}

fn prefix<'a>(q: &'a [f32], k: &'a [f32], p: usize, g: usize, d: usize) -> Prefix<'a> {
    Prefix {
        q,
        k,
        p_len: p,
        group: g,
        d,
        scale: 0.37,
    }
}

#[test]
fn scores_equal_the_metric_rows_summed_in_order_at_every_level() {
    for case in 0..40u64 {
        let (p, g, d) = (
            2 + (case as usize * 7) % 70,
            [1, 2, 8][case as usize % 3],
            1 + case as usize % 40,
        );
        let (q, k) = (values(case, p * g * d), values(case + 1000, p * d));
        let pre = prefix(&q, &k, p, g, d);
        let window = 1 + (case as usize) % (p - 1);
        let kernel = 1 + case as usize % 6;
        let want_snap = bits(&snapkv_from_rows(&pre, window, kernel));
        let want_obs = bits(&observed_from_rows(&pre));
        for isa in isas_for_test() {
            let got = snapkv_scores_at(isa, &pre, window, kernel).unwrap();
            assert_eq!(bits(&got), want_snap, "snapkv case {case} at {isa:?}");
            let got = observed_attention_scores_at(isa, &pre).unwrap();
            assert_eq!(bits(&got), want_obs, "observed case {case} at {isa:?}");
        }
    }
}

#[test]
fn tova_is_the_last_rows_head_mean_and_h2o_agrees_at_every_level() {
    for case in 0..30u64 {
        let (p, g, d) = (
            1 + (case as usize * 5) % 50,
            [1, 2, 8][case as usize % 3],
            1 + case as usize % 33,
        );
        let (q, k) = (values(case + 7, p * g * d), values(case + 77, p * d));
        let pre = prefix(&q, &k, p, g, d);
        let rows = metric_rows(&pre, p - 1);
        let mut want = vec![0.0; p - 1];
        for h in 0..g {
            for (j, w) in want.iter_mut().enumerate() {
                *w += rows[h * p + j];
            }
        }
        let want: Vec<f64> = want.iter().map(|w| w / g as f64).collect();
        let want = bits(&padded_with_top(want, 1));
        let last = &q[(p - 1) * g * d..];
        let budget = (case as usize * 3) % (p + 3);
        let recent = budget / 2;
        let first = h2o_keep_at(Isa::Scalar, &pre, budget, recent).unwrap();
        assert_eq!(first.len(), budget.min(p));
        for isa in isas_for_test() {
            let got = tova_scores_at(isa, last, &k, p, g, d, 0.37).unwrap();
            assert_eq!(bits(&got), want, "tova case {case} at {isa:?}");
            assert_eq!(h2o_keep_at(isa, &pre, budget, recent).unwrap(), first);
        }
        // The recent window is always kept.
        for t in p.saturating_sub(recent)..p {
            assert!(first.contains(&t), "case {case}: {t} not kept");
        }
    }
}

#[test]
fn h2o_greedy_eviction_on_uniform_attention_worked_by_hand() {
    // One head, zero queries: each step gives 1/|cache| to every cached key
    // (the Python test's hand-worked example).
    let (q, k) = (vec![0.0f32; 4 * 2], values(3, 4 * 2));
    let pre = Prefix {
        scale: 1.0,
        ..prefix(&q, &k, 4, 1, 2)
    };
    assert_eq!(h2o_keep(&pre, 2, 0).unwrap(), vec![0, 1]);
    assert_eq!(h2o_keep(&pre, 2, 1).unwrap(), vec![0, 3]);
    assert_eq!(h2o_keep(&pre, 2, 2).unwrap(), vec![2, 3]);
    assert_eq!(h2o_keep(&pre, 9, 0).unwrap(), vec![0, 1, 2, 3]);
    assert_eq!(h2o_keep(&pre, 0, 0).unwrap(), Vec::<usize>::new());
}

#[test]
fn observed_attention_divides_by_the_queries_that_see_each_key() {
    let (q, k) = (vec![0.0f32; 5 * 2], values(5, 5 * 2));
    let pre = Prefix {
        scale: 1.0,
        ..prefix(&q, &k, 5, 1, 2)
    };
    let got = observed_attention_scores(&pre).unwrap();
    for (j, g) in got.iter().enumerate() {
        let want: f64 = (j..5).map(|i| 1.0 / (i + 1) as f64).sum::<f64>() / (5 - j) as f64;
        assert!((g - want).abs() <= 1e-15 * want, "{j}: {g} vs {want}");
    }
}

#[test]
fn keep_top_is_one_total_order_ties_to_the_lower_position() {
    let s = [0.5, 2.0, 0.5, 2.0, 0.5, 1.0];
    assert_eq!(keep_top(&s, 3).unwrap(), vec![1, 3, 5]);
    assert_eq!(keep_top(&s, 4).unwrap(), vec![0, 1, 3, 5]);
    assert_eq!(keep_top(&s, 99).unwrap(), vec![0, 1, 2, 3, 4, 5]);
    assert_eq!(keep_top(&s, 0).unwrap(), Vec::<usize>::new());
    assert_eq!(keep_top(&[0.0, -0.0, 0.0], 2).unwrap(), vec![0, 1]);
    assert_eq!(keep_top(&[-0.0, 0.0, 1.0], 2).unwrap(), vec![0, 2]);
    assert_eq!(
        keep_top(&[f64::NEG_INFINITY, f64::INFINITY, 1.0], 2).unwrap(),
        vec![1, 2]
    );
    // Against a full sort, on many small integer-valued (tie-heavy) scores.
    for case in 0..300u64 {
        let v = values(case, 1 + case as usize % 40);
        let s: Vec<f64> = v.iter().map(|x| (x.abs() * 2.0).floor() as f64).collect();
        let budget = case as usize % 45;
        let mut order: Vec<usize> = (0..s.len()).collect();
        order.sort_by(|&a, &b| s[b].partial_cmp(&s[a]).unwrap().then(a.cmp(&b)));
        let mut want: Vec<usize> = order.into_iter().take(budget).collect();
        want.sort_unstable();
        assert_eq!(keep_top(&s, budget).unwrap(), want, "case {case}");
    }
}

fn refused(e: ArgumentError) -> &'static str {
    match e {
        ArgumentError::Invalid { argument, .. } | ArgumentError::Length { argument, .. } => {
            argument
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn bad_inputs_are_refused_naming_the_argument() {
    let (p, g, d) = (6, 2, 3);
    let (q, k) = (values(1, p * g * d), values(2, p * d));
    let pre = prefix(&q, &k, p, g, d);
    let short = prefix(&q[1..], &k, p, g, d);
    assert_eq!(refused(snapkv_scores(&short, 2, 5).unwrap_err()), "q");
    let short_k = prefix(&q, &k[1..], p, g, d);
    assert_eq!(
        refused(observed_attention_scores(&short_k).unwrap_err()),
        "k"
    );
    let no_group = Prefix {
        q: &[],
        group: 0,
        ..pre
    };
    assert_eq!(refused(h2o_keep(&no_group, 2, 1).unwrap_err()), "q");
    for scale in [f64::NAN, f64::INFINITY, 1e300] {
        let bad = Prefix { scale, ..pre };
        assert_eq!(
            refused(observed_attention_scores(&bad).unwrap_err()),
            "scale"
        );
    }
    let mut qn = q.clone();
    qn[5] = f32::NAN;
    assert_eq!(
        refused(snapkv_scores(&Prefix { q: &qn, ..pre }, 2, 5).unwrap_err()),
        "q"
    );
    let mut kn = k.clone();
    kn[4] = f32::INFINITY;
    assert_eq!(
        refused(h2o_keep(&Prefix { k: &kn, ..pre }, 2, 1).unwrap_err()),
        "k"
    );
    for window in [0, p, p + 1] {
        assert_eq!(
            refused(snapkv_scores(&pre, window, 5).unwrap_err()),
            "window"
        );
    }
    assert_eq!(refused(snapkv_scores(&pre, 2, 0).unwrap_err()), "kernel");
    assert_eq!(refused(h2o_keep(&pre, 2, 3).unwrap_err()), "recent");
    let last = &q[(p - 1) * g * d..];
    assert_eq!(
        refused(tova_scores(&last[1..], &k, p, g, d, 0.5).unwrap_err()),
        "q_last"
    );
    assert_eq!(
        refused(tova_scores(last, &[], 0, g, d, 0.5).unwrap_err()),
        "k"
    );
    assert_eq!(
        refused(tova_scores(last, &k, p, g, d, f64::NAN).unwrap_err()),
        "scale"
    );
    assert_eq!(
        refused(keep_top(&[1.0, f64::NAN], 1).unwrap_err()),
        "scores"
    );
    // The inputs are read-only slices: nothing to leave unchanged but them.
    assert_eq!(q, values(1, p * g * d));
}
