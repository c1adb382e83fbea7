//! The attention module: baseline selectors, the sparse and dense passes,
//! and the batched metrics.
//!
//! Float outputs are checked against a naive float64 attention written here
//! (not the crate's), and on a slice of real MiniLM Q/K/V shipped in
//! `tests/data/` (see its README). Randomised cases use fixed seeds.

use std::collections::BTreeSet;

use kvselect::attention::*;
use kvselect::metrics::*;
use kvselect::{pool, witness, ArgumentError};
use rand::{Rng, RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// One attention problem: row-major `q [n_queries, n_q_heads, d_k]`,
/// `k [n_keys, n_kv_heads, d_k]`, value rows `v_stride` apart.
#[derive(Clone)]
struct Case {
    shape: AttentionShape,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    v_stride: usize,
    query_pos: Vec<usize>,
}

fn uniform(rng: &mut impl Rng, n: usize, amp: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-amp..amp)).collect()
}

/// A random case; queries sit at the last `n_queries` positions (prefill)
/// unless `random_pos`, when they are anywhere, some past the keys. The gap
/// between value rows (`v_gap`) holds NaN, so reading it would show.
#[allow(clippy::too_many_arguments)]
fn case(
    rng: &mut impl Rng,
    n_queries: usize,
    n_q_heads: usize,
    n_kv_heads: usize,
    d_k: usize,
    d_v: usize,
    n_keys: usize,
    v_gap: usize,
    random_pos: bool,
) -> Case {
    let shape = AttentionShape {
        n_queries,
        n_q_heads,
        n_kv_heads,
        d_k,
        d_v,
        n_keys,
    };
    let v_stride = d_v + v_gap;
    let mut v = vec![f32::NAN; n_keys * n_kv_heads * v_stride];
    for row in v.chunks_mut(v_stride.max(1)) {
        for x in &mut row[..d_v] {
            *x = rng.random_range(-1.0..1.0);
        }
    }
    let query_pos = (0..n_queries)
        .map(|i| {
            if random_pos {
                rng.random_range(0..n_keys + 3)
            } else {
                (n_keys + i).saturating_sub(n_queries)
            }
        })
        .collect();
    Case {
        shape,
        q: uniform(rng, n_queries * n_q_heads * d_k, 2.0),
        k: uniform(rng, n_keys * n_kv_heads * d_k, 2.0),
        v,
        v_stride,
        query_pos,
    }
}

/// A random selection `[n_queries, n_kv_heads, width]`: in-range keys (some
/// past the query), duplicates and padding, in random order.
fn random_selection(rng: &mut impl Rng, c: &Case, width: usize) -> Vec<i32> {
    let n = c.shape.n_queries * c.shape.n_kv_heads * width;
    (0..n)
        .map(|_| match rng.random_range(0..10) {
            0 => -1,
            1 => -rng.random_range(2..100),
            _ => rng.random_range(0..c.shape.n_keys.max(1)) as i32,
        })
        .collect()
}

struct Output {
    out: Vec<f32>,
    lse: Vec<f32>,
    empty: usize,
}

fn dense(c: &Case, scale: f32) -> Output {
    let s = &c.shape;
    let mut out = vec![7.0; s.n_queries * s.n_q_heads * s.d_v];
    let mut lse = vec![7.0; s.n_queries * s.n_q_heads];
    let empty = dense_attention(
        &c.q,
        &c.k,
        &c.v,
        c.v_stride,
        s,
        &c.query_pos,
        scale,
        &mut out,
        &mut lse,
    )
    .unwrap();
    Output { out, lse, empty }
}

fn sparse(c: &Case, selection: &[i32], width: usize, scale: f32) -> Output {
    let s = &c.shape;
    let mut out = vec![7.0; s.n_queries * s.n_q_heads * s.d_v];
    let mut lse = vec![7.0; s.n_queries * s.n_q_heads];
    let empty = sparse_attention(
        &c.q,
        &c.k,
        &c.v,
        c.v_stride,
        s,
        &c.query_pos,
        selection,
        width,
        scale,
        &mut out,
        &mut lse,
    )
    .unwrap();
    Output { out, lse, empty }
}

fn full_selection(c: &Case) -> (Vec<i32>, usize) {
    // Wide enough for every row (a position past the keys asks for more
    // than exist: the extra entries are masked).
    let width = c.query_pos.iter().map(|&p| p + 1).max().unwrap_or(1);
    let mut sel = vec![0; c.shape.n_queries * c.shape.n_kv_heads * width];
    Selector::Dense
        .selection_into(&c.query_pos, c.shape.n_kv_heads, width, &mut sel)
        .unwrap();
    (sel, width)
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// The set a selection row attends to, by the module's rule.
fn key_set(row: &[i32], visible: usize) -> Vec<usize> {
    row.iter()
        .filter(|&&x| x >= 0 && (x as usize) < visible)
        .map(|&x| x as usize)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// Naive float64 attention, written from the definition: for each query
/// head, softmax over the key set of `(q·k)·scale`, weighted sum of values.
/// Returns `(out, lse)`; a row with no keys gives zeros and `-inf`.
fn reference(c: &Case, selection: Option<(&[i32], usize)>, scale: f64) -> (Vec<f64>, Vec<f64>) {
    let s = &c.shape;
    let g = s.n_q_heads / s.n_kv_heads;
    let mut out = vec![0.0; s.n_queries * s.n_q_heads * s.d_v];
    let mut lse = vec![f64::NEG_INFINITY; s.n_queries * s.n_q_heads];
    for i in 0..s.n_queries {
        let visible = (c.query_pos[i] + 1).min(s.n_keys);
        for h in 0..s.n_q_heads {
            let kv = h / g;
            let keys: Vec<usize> = match selection {
                Some((sel, width)) => {
                    let at = (i * s.n_kv_heads + kv) * width;
                    key_set(&sel[at..at + width], visible)
                }
                None => (0..visible).collect(),
            };
            if keys.is_empty() {
                continue;
            }
            let qr = &c.q[(i * s.n_q_heads + h) * s.d_k..][..s.d_k];
            let scores: Vec<f64> = keys
                .iter()
                .map(|&j| {
                    let kr = &c.k[(j * s.n_kv_heads + kv) * s.d_k..][..s.d_k];
                    qr.iter()
                        .zip(kr)
                        .map(|(&a, &b)| a as f64 * b as f64)
                        .sum::<f64>()
                        * scale
                })
                .collect();
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let p: Vec<f64> = scores.iter().map(|&x| (x - m).exp()).collect();
            let l: f64 = p.iter().sum();
            let o = &mut out[(i * s.n_q_heads + h) * s.d_v..][..s.d_v];
            for (&j, &pj) in keys.iter().zip(&p) {
                let vr = &c.v[(j * s.n_kv_heads + kv) * c.v_stride..][..s.d_v];
                for (oc, &vc) in o.iter_mut().zip(vr) {
                    *oc += pj * vc as f64 / l;
                }
            }
            lse[i * s.n_q_heads + h] = m + l.ln();
        }
    }
    (out, lse)
}

/// `‖got − want‖₂ / ‖want‖₂`.
fn rel_err(got: &[f32], want: &[f64]) -> f64 {
    let (mut d, mut n) = (0.0, 0.0);
    for (&g, &w) in got.iter().zip(want) {
        d += (g as f64 - w) * (g as f64 - w);
        n += w * w;
    }
    (d / n).sqrt()
}

// ---------------------------------------------------------------------------
// The passes
// ---------------------------------------------------------------------------

#[test]
fn a_full_selection_equals_dense_attention_bit_for_bit() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    for &(nq, hq, hkv, dk, dv, n, gap, rand_pos) in &[
        (1, 1, 1, 1, 1, 1, 0, false),
        (40, 4, 2, 64, 48, 300, 0, false),
        (23, 3, 3, 17, 9, 41, 3, true),
        (5, 16, 1, 72, 64, 700, 8, true),
        (70, 1, 1, 32, 32, 70, 0, false),
        // Degenerate widths: no key dimensions (uniform weights), no values.
        (4, 2, 1, 0, 3, 9, 0, true),
        (3, 2, 2, 5, 0, 7, 0, true),
    ] {
        let c = case(&mut rng, nq, hq, hkv, dk, dv, n, gap, rand_pos);
        let scale = softmax_scale(dk);
        let d = dense(&c, scale);
        let (sel, width) = full_selection(&c);
        let s = sparse(&c, &sel, width, scale);
        assert_eq!(bits(&d.out), bits(&s.out), "out, shape {:?}", c.shape);
        assert_eq!(bits(&d.lse), bits(&s.lse), "lse, shape {:?}", c.shape);
        assert_eq!((d.empty, s.empty), (0, 0));
    }
}

#[test]
fn outputs_are_within_1e_5_of_a_float64_reference() {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    for &(nq, hq, hkv, dk, dv, n, gap, rand_pos, peaky) in &[
        (37, 4, 2, 64, 48, 300, 0, false, false),
        (37, 4, 2, 64, 48, 300, 0, false, true),
        (6, 8, 1, 96, 64, 1000, 5, true, false),
        (64, 2, 2, 32, 32, 64, 0, false, true),
        (9, 6, 3, 128, 128, 513, 1, true, false),
        (4, 2, 1, 0, 3, 9, 0, true, false),
    ] {
        let mut c = case(&mut rng, nq, hq, hkv, dk, dv, n, gap, rand_pos);
        if peaky {
            // Large scores: most weights underflow, a few dominate.
            c.q.iter_mut().for_each(|x| *x *= 12.0);
        }
        let scale = softmax_scale(dk);
        let d = dense(&c, scale);
        let (want, want_lse) = reference(&c, None, scale as f64);
        let e = rel_err(&d.out, &want);
        assert!(e < 1e-5, "dense {:?}: relative error {e:e}", c.shape);
        for (&g, &w) in d.lse.iter().zip(&want_lse) {
            assert!(
                (g as f64 - w).abs() <= 1e-5 * w.abs().max(1.0),
                "lse {g} vs {w}"
            );
        }
        for width in [1, 16, 200] {
            let sel = random_selection(&mut rng, &c, width);
            let s = sparse(&c, &sel, width, scale);
            let (want, want_lse) = reference(&c, Some((&sel, width)), scale as f64);
            let e = rel_err(&s.out, &want);
            assert!(
                e < 1e-5,
                "sparse {:?} width {width}: relative error {e:e}",
                c.shape
            );
            for (&g, &w) in s.lse.iter().zip(&want_lse) {
                if w == f64::NEG_INFINITY {
                    assert_eq!(g, f32::NEG_INFINITY);
                } else {
                    assert!(
                        (g as f64 - w).abs() <= 1e-5 * w.abs().max(1.0),
                        "lse {g} vs {w}"
                    );
                }
            }
        }
    }
}

#[test]
fn keys_and_values_outside_the_selection_do_not_change_the_output() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for trial in 0..20 {
        let mut c = case(&mut rng, 1, 4, 2, 24, 16, 200, 2, true);
        let width = 12 + trial;
        let sel = random_selection(&mut rng, &c, width);
        let before = sparse(&c, &sel, width, 0.3);
        let s = c.shape;
        let visible = (c.query_pos[0] + 1).min(s.n_keys);
        for h in 0..s.n_kv_heads {
            let keep = key_set(&sel[h * width..(h + 1) * width], visible);
            for j in (0..s.n_keys).filter(|j| !keep.contains(j)) {
                let row = j * s.n_kv_heads + h;
                c.k[row * s.d_k..(row + 1) * s.d_k].fill(f32::NAN);
                c.v[row * c.v_stride..row * c.v_stride + s.d_v].fill(f32::INFINITY);
            }
        }
        let after = sparse(&c, &sel, width, 0.3);
        assert_eq!(bits(&before.out), bits(&after.out), "trial {trial}");
        assert_eq!(bits(&before.lse), bits(&after.lse), "trial {trial}");
    }
    // Dense: keys after every query are outside the causal set.
    let mut c = case(&mut rng, 30, 2, 1, 40, 40, 100, 0, false);
    c.query_pos = (0..30).map(|i| 3 * i).collect();
    let before = dense(&c, 0.2);
    let last = 3 * 29;
    c.k[(last + 1) * 40..].fill(f32::NAN);
    c.v[(last + 1) * 40..].fill(f32::NAN);
    let after = dense(&c, 0.2);
    assert_eq!(bits(&before.out), bits(&after.out));
    assert!(after.out.iter().all(|x| x.is_finite()));
}

#[test]
fn a_row_that_selects_nothing_gets_zeros_and_is_reported() {
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let c = case(&mut rng, 4, 6, 2, 16, 8, 50, 0, false);
    let width = 5;
    let mut sel = random_selection(&mut rng, &c, width);
    let pos0 = c.query_pos[0] as i32;
    // Query 0, KV head 1: padding only. Query 2, KV head 0: future keys only.
    sel[width..2 * width].fill(-1);
    let at = 2 * 2 * width;
    let pos2 = c.query_pos[2] as i32;
    sel[at..at + width].copy_from_slice(&[pos2 + 1, -1, pos2 + 1, 49, -7]);
    assert!(pos2 < 49 && pos0 < 49);
    let s = sparse(&c, &sel, width, 0.25);
    assert_eq!(s.empty, 2 * 3, "two KV rows of a three-head group each");
    assert!(s.out.iter().all(|x| !x.is_nan()) && s.lse.iter().all(|x| !x.is_nan()));
    let g = 3;
    for (i, kv) in [(0usize, 1usize), (2, 0)] {
        for h in kv * g..(kv + 1) * g {
            let r = i * 6 + h;
            assert!(s.out[r * 8..(r + 1) * 8].iter().all(|&x| x == 0.0));
            assert_eq!(s.lse[r], f32::NEG_INFINITY);
        }
    }
    // Every other row is still right.
    let (want, _) = reference(&c, Some((&sel, width)), 0.25);
    assert!(rel_err(&s.out, &want) < 1e-5);

    // Dense with no keys at all: every row is empty.
    let mut c0 = case(&mut rng, 3, 2, 2, 4, 4, 0, 0, false);
    c0.query_pos = vec![0, 5, 9];
    let d = dense(&c0, 0.5);
    assert_eq!(d.empty, 6);
    assert!(d.out.iter().all(|&x| x == 0.0));
    assert!(d.lse.iter().all(|&x| x == f32::NEG_INFINITY));
}

#[test]
fn padding_duplicates_order_and_future_entries_are_ignored() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let c = case(&mut rng, 1, 2, 1, 32, 32, 120, 0, false);
    let pos = c.query_pos[0] as i32;
    let clean = [0, 3, 17, 50, 51, pos];
    let w = clean.len();
    let base = sparse(&c, &clean, w, 0.2);
    let messy: [i32; 14] = [pos, -1, 51, 17, 17, -5, 0, 3, 50, pos, 3, i32::MIN, 0, 51];
    let got = sparse(&c, &messy, messy.len(), 0.2);
    assert_eq!(bits(&base.out), bits(&got.out));
    assert_eq!(bits(&base.lse), bits(&got.lse));
    // Entries after the query (or past the keys) are masked like future keys.
    let mut c2 = c.clone();
    c2.query_pos = vec![60];
    let a = sparse(&c2, &[0, 3, 17, 50, 51], 5, 0.2);
    let b = sparse(&c2, &[61, 0, 3, 119, 17, 50, 51, 200, i32::MAX], 9, 0.2);
    assert_eq!(bits(&a.out), bits(&b.out));
}

fn sparse_counting(c: &Case, selection: &[i32], width: usize, repeats: Repeats) -> Output {
    let s = &c.shape;
    let mut out = vec![7.0; s.n_queries * s.n_q_heads * s.d_v];
    let mut lse = vec![7.0; s.n_queries * s.n_q_heads];
    let empty = sparse_attention_counting(
        &c.q,
        &c.k,
        &c.v,
        c.v_stride,
        s,
        &c.query_pos,
        selection,
        width,
        0.2,
        repeats,
        &mut out,
        &mut lse,
    )
    .unwrap();
    Output { out, lse, empty }
}

#[test]
fn repeats_counted_each_time_weigh_like_copies_of_the_key() {
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    let c = case(&mut rng, 1, 2, 1, 16, 8, 120, 0, false);
    // Without repeats, Each is the set rule bit for bit.
    let clean = [0, 3, 17, 50, 51];
    let once = sparse_counting(&c, &clean, 5, Repeats::Once);
    let each = sparse_counting(&c, &clean, 5, Repeats::Each);
    assert_eq!(bits(&once.out), bits(&each.out));
    assert_eq!(bits(&once.lse), bits(&each.lse));
    assert_eq!(bits(&sparse(&c, &clean, 5, 0.2).out), bits(&once.out));
    // A key repeated twice weighs like the key and a copy of it (key 120).
    let rows: [i32; 8] = [17, -1, 0, 17, 3, 50, 0, 130];
    let got = sparse_counting(&c, &rows, 8, Repeats::Each);
    let mut copy = c.clone();
    copy.shape.n_keys = 122;
    for (from, to) in [(17, 120), (0, 121)] {
        let kr = copy.k[from * 16..(from + 1) * 16].to_vec();
        copy.k.extend(kr);
        let vr = copy.v[from * 8..(from + 1) * 8].to_vec();
        copy.v.extend(vr);
        assert_eq!(copy.k.len(), (to + 1) * 16);
    }
    copy.query_pos = vec![121];
    let want = sparse(&copy, &[0, 3, 17, 50, 120, 121], 6, 0.2);
    for (a, b) in got.out.iter().zip(&want.out) {
        assert!((a - b).abs() <= 1e-6 * (1.0 + b.abs()), "{a} vs {b}");
    }
    for (a, b) in got.lse.iter().zip(&want.lse) {
        assert!((a - b).abs() <= 1e-6 * (1.0 + b.abs()), "{a} vs {b}");
    }
    // ... and differs from the set rule, which counts each key once.
    let set = sparse_counting(&c, &rows, 8, Repeats::Once);
    assert!(got.lse.iter().zip(&set.lse).all(|(a, b)| a > b));
    // The order of a row's entries does not matter (its list is sorted).
    let shuffled: [i32; 8] = [0, 130, 50, 17, 3, -1, 17, 0];
    let again = sparse_counting(&c, &shuffled, 8, Repeats::Each);
    assert_eq!(bits(&got.out), bits(&again.out));
    assert_eq!((got.empty, again.empty), (0, 0));
}

#[test]
fn mla_values_read_through_a_strided_view_equal_an_explicit_copy() {
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    let (n_heads, d_k, d_v, n_keys, nq) = (8, 72, 64, 400, 5);
    let kv = uniform(&mut rng, n_keys * d_k, 1.5);
    let q = uniform(&mut rng, nq * n_heads * d_k, 1.5);
    let query_pos: Vec<usize> = (0..nq).map(|i| 395 + i).collect();
    let width = 64;
    let sel: Vec<i32> = (0..nq * width)
        .map(|_| rng.random_range(-1..n_keys as i32))
        .collect();
    let scale = softmax_scale(d_k);
    let mut out_view = vec![0.0; nq * n_heads * d_v];
    let mut lse_view = vec![0.0; nq * n_heads];
    let empty = causal_mla_attention_sparse(
        &q,
        &kv,
        n_heads,
        d_k,
        d_v,
        &query_pos,
        &sel,
        width,
        scale,
        &mut out_view,
        &mut lse_view,
    )
    .unwrap();
    assert_eq!(empty, 0);
    // The explicit copy: the first d_v columns of every latent row.
    let v_copy: Vec<f32> = kv.chunks(d_k).flat_map(|r| r[..d_v].to_vec()).collect();
    let c = Case {
        shape: AttentionShape::mla(nq, n_heads, d_k, d_v, n_keys),
        q,
        k: kv,
        v: v_copy,
        v_stride: d_v,
        query_pos,
    };
    let copied = sparse(&c, &sel, width, scale);
    assert_eq!(bits(&out_view), bits(&copied.out));
    assert_eq!(bits(&lse_view), bits(&copied.lse));
    // The same view, through the general entry point.
    let view = Case {
        v: c.k.clone(),
        v_stride: d_k,
        ..c.clone()
    };
    assert_eq!(
        bits(&sparse(&view, &sel, width, scale).out),
        bits(&out_view)
    );
    // d_v wider than the latent rows is refused.
    let err = causal_mla_attention_sparse(
        &c.q,
        &c.k,
        n_heads,
        d_k,
        d_k + 1,
        &c.query_pos,
        &sel,
        width,
        scale,
        &mut [],
        &mut [],
    )
    .unwrap_err();
    assert_eq!(err.argument(), "d_v");
}

#[test]
fn a_kv_heads_selection_serves_its_whole_query_head_group() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let (nq, hq, hkv, dk, dv, n) = (7, 6, 2, 20, 12, 90);
    let g = hq / hkv;
    let c = case(&mut rng, nq, hq, hkv, dk, dv, n, 0, true);
    let width = 10;
    let sel = random_selection(&mut rng, &c, width);
    let all = sparse(&c, &sel, width, 0.4);
    // Each query head alone, as single-head attention on its KV head.
    for h in 0..hq {
        let kv = h / g;
        let one = Case {
            shape: AttentionShape {
                n_queries: nq,
                n_q_heads: 1,
                n_kv_heads: 1,
                d_k: dk,
                d_v: dv,
                n_keys: n,
            },
            q: (0..nq)
                .flat_map(|i| c.q[(i * hq + h) * dk..][..dk].to_vec())
                .collect(),
            k: (0..n)
                .flat_map(|j| c.k[(j * hkv + kv) * dk..][..dk].to_vec())
                .collect(),
            v: (0..n)
                .flat_map(|j| c.v[(j * hkv + kv) * dv..][..dv].to_vec())
                .collect(),
            v_stride: dv,
            query_pos: c.query_pos.clone(),
        };
        let one_sel: Vec<i32> = (0..nq)
            .flat_map(|i| sel[(i * hkv + kv) * width..][..width].to_vec())
            .collect();
        let o = sparse(&one, &one_sel, width, 0.4);
        for i in 0..nq {
            assert_eq!(
                bits(&all.out[(i * hq + h) * dv..][..dv]),
                bits(&o.out[i * dv..][..dv]),
                "query {i}, head {h}"
            );
            assert_eq!(all.lse[i * hq + h].to_bits(), o.lse[i].to_bits());
        }
    }
    // Changing KV head 1's selection leaves KV head 0's group untouched.
    let mut sel2 = sel.clone();
    for i in 0..nq {
        sel2[(i * hkv + 1) * width..][..width].fill(0);
    }
    let changed = sparse(&c, &sel2, width, 0.4);
    for i in 0..nq {
        let group0 = (i * hq) * dv..(i * hq + g) * dv;
        assert_eq!(bits(&all.out[group0.clone()]), bits(&changed.out[group0]));
    }
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    // The pool size is global state: everything that changes it is here.
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    let c = case(&mut rng, 150, 4, 2, 64, 32, 400, 0, true);
    let width = 48;
    let sel = random_selection(&mut rng, &c, width);
    let rows: Vec<usize> = (0..300).map(|i| i * 7).collect();
    let run = || {
        let d = dense(&c, 0.125);
        let s = sparse(&c, &sel, width, 0.125);
        let mut r = vec![0; rows.len() * 64];
        Selector::Random {
            budget: 64,
            seed: 9,
        }
        .rows_into(&rows, 64, &mut r)
        .unwrap();
        let mut probs = vec![0.0; 150 * 4 * 400];
        attention_probabilities(&c.q, &c.k, &c.shape, &c.query_pos, 0.125, &mut probs).unwrap();
        let mut oracle = vec![0; 150 * 2 * width];
        OracleTopK { budget: width }
            .selection_into(&probs, &c.shape, &c.query_pos, width, &mut oracle)
            .unwrap();
        let mut recall = vec![0.0; 150 * 4];
        attention_mass_recall_rows(&sel, width, &probs, 400, 2, &mut recall).unwrap();
        (
            bits(&d.out),
            bits(&d.lse),
            bits(&s.out),
            bits(&s.lse),
            r,
            probs.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            oracle,
            recall.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        )
    };
    pool::set_num_threads(1);
    let one = run();
    for threads in [2, 3] {
        pool::set_num_threads(threads);
        assert!(run() == one, "{threads} threads differ from 1");
    }
    pool::set_num_threads(0);
}

/// A digest of dense and sparse outputs on a fixed case.
fn digest() -> u64 {
    let mut rng = ChaCha8Rng::seed_from_u64(10);
    let c = case(&mut rng, 33, 4, 2, 67, 45, 257, 3, true);
    let width = 40;
    let sel = random_selection(&mut rng, &c, width);
    let d = dense(&c, 0.15);
    let s = sparse(&c, &sel, width, 0.15);
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for x in d.out.iter().chain(&d.lse).chain(&s.out).chain(&s.lse) {
        h = (h ^ x.to_bits() as u64).wrapping_mul(0x100_0000_01b3);
    }
    h
}

#[test]
fn the_portable_kernels_give_the_same_bits_as_the_simd_ones() {
    if std::env::var_os("KVSELECT_TEST_DIGEST_CHILD").is_some() {
        println!(
            "DIGEST={:016x}@{}",
            digest(),
            kvselect::simd::level().name()
        );
        return;
    }
    if kvselect::simd::Isa::best().avx2().is_none() {
        // The comparison still runs (and still checks the child's digest),
        // but scalar against scalar: say so, and fail where AVX2 is required.
        eprintln!("skipped: this CPU has no AVX2 (or KVSELECT_SIMD=scalar is set)");
        assert!(
            std::env::var_os("KVSELECT_REQUIRE_AVX2").is_none_or(|v| v != "1"),
            "KVSELECT_REQUIRE_AVX2=1, but the SIMD level is scalar: AVX2 cannot be compared \
             against the portable kernels"
        );
    }
    // Every level on every architecture gives x86-64's bits: the digest of
    // this case as all three x86-64 levels computed it (and the portable
    // kernels on aarch64, run under qemu-user in CI). A change to the case
    // above changes it; a change to a kernel must not.
    const PINNED: &str = "7a922cf92fd46e21";
    let want = format!("{:016x}", digest());
    assert_eq!(
        want,
        PINNED,
        "this architecture's {:?} kernels differ from x86-64's bits",
        kvselect::simd::level()
    );
    // Off x86-64 there is one level (the portable kernels): no child to
    // compare with (and under qemu-user a child of this test binary could
    // not be started without the emulator).
    if cfg!(not(target_arch = "x86_64")) {
        return;
    }
    // Each capped level in a child process: the portable kernels, and AVX2
    // (below AVX-512 on a CPU that has it).
    for level in ["scalar", "avx2"] {
        let exe = std::env::current_exe().unwrap();
        let child = std::process::Command::new(exe)
            .args([
                "--exact",
                "the_portable_kernels_give_the_same_bits_as_the_simd_ones",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("KVSELECT_SIMD", level)
            .env("KVSELECT_TEST_DIGEST_CHILD", "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&child.stdout);
        let line = text
            .lines()
            .find_map(|l| l.split_once("DIGEST=").map(|(_, d)| d.trim()))
            .unwrap_or_else(|| panic!("child printed no digest: {text}"));
        let (got, ran) = line.split_once('@').unwrap_or((line, "?"));
        assert_eq!(
            got,
            want,
            "KVSELECT_SIMD={level} (ran {ran}) differs from {:?}",
            kvselect::simd::level()
        );
    }
}

// ---------------------------------------------------------------------------
// Selectors
// ---------------------------------------------------------------------------

fn budget_of(sel: &Selector, row: usize) -> usize {
    match *sel {
        Selector::Dense => row + 1,
        Selector::Local { window } => window,
        Selector::Random { budget, .. } => budget,
        Selector::SinkWindow { sinks, window } => sinks + window,
    }
}

#[test]
fn every_selector_row_is_causal_distinct_ascending_within_budget_and_deterministic() {
    let selectors = [
        Selector::Dense,
        Selector::Local { window: 0 },
        Selector::Local { window: 1 },
        Selector::Local { window: 37 },
        Selector::Random { budget: 0, seed: 1 },
        Selector::Random { budget: 5, seed: 1 },
        Selector::Random {
            budget: 200,
            seed: u64::MAX,
        },
        Selector::SinkWindow {
            sinks: 4,
            window: 16,
        },
        Selector::SinkWindow {
            sinks: 0,
            window: 3,
        },
        Selector::SinkWindow {
            sinks: 10,
            window: 0,
        },
    ];
    let rows: Vec<usize> = (0..70).chain([199, 200, 201, 1000, 4095]).collect();
    for sel in &selectors {
        let width = rows.iter().map(|&r| sel.row_len(r)).max().unwrap();
        let mut batch = vec![0; rows.len() * width];
        sel.rows_into(&rows, width, &mut batch).unwrap();
        for (r, &row) in rows.iter().enumerate() {
            let got = sel.row(row);
            assert_eq!(got, sel.row(row), "{sel:?} row {row} is not deterministic");
            assert_eq!(got.len(), sel.row_len(row), "{sel:?} row {row}");
            assert!(
                got.len() <= budget_of(sel, row).min(row + 1),
                "{sel:?} row {row}"
            );
            assert!(
                got.iter().all(|&x| x >= 0 && x as usize <= row),
                "{sel:?} causal"
            );
            assert!(
                got.windows(2).all(|w| w[0] < w[1]),
                "{sel:?} ascending, distinct"
            );
            // The batched row is the row, then padding.
            let b = &batch[r * width..(r + 1) * width];
            assert_eq!(&b[..got.len()], &got[..]);
            assert!(b[got.len()..].iter().all(|&x| x == -1));
        }
    }
    // The rules themselves.
    assert_eq!(Selector::Local { window: 3 }.row(10), vec![8, 9, 10]);
    assert_eq!(
        Selector::SinkWindow {
            sinks: 2,
            window: 3
        }
        .row(10),
        vec![0, 1, 8, 9, 10]
    );
    assert_eq!(
        Selector::SinkWindow {
            sinks: 4,
            window: 3
        }
        .row(5),
        vec![0, 1, 2, 3, 4, 5]
    );
    assert_eq!(Selector::Dense.row(3), vec![0, 1, 2, 3]);
    assert_eq!(
        Selector::Random { budget: 9, seed: 0 }.row(4),
        vec![0, 1, 2, 3, 4]
    );
    // A random row depends on (seed, row) only, not on the batch.
    let r = Selector::Random {
        budget: 8,
        seed: 77,
    };
    let mut a = vec![0; 3 * 8];
    r.rows_into(&[500, 20, 500], 8, &mut a).unwrap();
    assert_eq!(&a[..8], &r.row(500)[..]);
    assert_eq!(&a[16..], &r.row(500)[..]);
    assert_eq!(&a[8..16], &r.row(20)[..]);
    assert_ne!(
        r.row(500),
        Selector::Random {
            budget: 8,
            seed: 78
        }
        .row(500)
    );
    // The attention-shaped form repeats the row for every KV head.
    let mut s = vec![0; 2 * 3 * 4];
    Selector::Local { window: 4 }
        .selection_into(&[9, 2], 3, 4, &mut s)
        .unwrap();
    assert_eq!(&s[..12], &[6, 7, 8, 9, 6, 7, 8, 9, 6, 7, 8, 9]);
    assert_eq!(&s[12..16], &[0, 1, 2, -1]);
}

#[test]
fn random_rows_are_uniform_over_the_causal_set() {
    // Row 9 (ten keys), budget 3, 20,000 seeds: each key expects 6,000 hits
    // (binomial sd ≈ 65); and one seed over many rows hits every key.
    let mut counts = [0usize; 10];
    for seed in 0..20_000u64 {
        for x in (Selector::Random { budget: 3, seed }).row(9) {
            counts[x as usize] += 1;
        }
    }
    for (key, &n) in counts.iter().enumerate() {
        assert!((5_700..=6_300).contains(&n), "key {key}: {n} hits");
    }
    let mut late = [0usize; 10];
    for row in 9..20_009usize {
        for x in (Selector::Random { budget: 3, seed: 5 }).row(row) {
            late[(x as usize * 10) / (row + 1)] += 1;
        }
    }
    for (decile, &n) in late.iter().enumerate() {
        assert!((5_650..=6_350).contains(&n), "decile {decile}: {n} hits");
    }
}

#[test]
fn the_oracle_takes_the_heaviest_keys_with_ties_to_the_lower_key() {
    let a = [0.1, 0.3, 0.05, 0.3, f64::NAN, 0.25, 0.0, -0.0];
    assert_eq!(oracle_topk_row(&a, 2), vec![1, 3]);
    assert_eq!(oracle_topk_row(&a, 3), vec![1, 3, 5]);
    // NaN ranks below every weight, -0.0 ties +0.0 (lower key first).
    assert_eq!(oracle_topk_row(&a, 6), vec![0, 1, 2, 3, 5, 6]);
    assert_eq!(oracle_topk_row(&a, 7), vec![0, 1, 2, 3, 5, 6, 7]);
    assert_eq!(oracle_topk_row(&a, 100), (0..8).collect::<Vec<i32>>());
    assert!(oracle_topk_row(&a, 0).is_empty());
    // Row 2 sees keys 0..=2 only.
    assert_eq!(OracleTopK { budget: 2 }.row(2, &a), vec![0, 1]);
    let ties = [0.25; 8];
    assert_eq!(oracle_topk_row(&ties, 3), vec![0, 1, 2]);
    // Batched: each row equals the single-row form.
    let rows = [7usize, 2, 0, 5];
    let att: Vec<f64> = rows.iter().flat_map(|_| a).collect();
    let o = OracleTopK { budget: 3 };
    let mut out = vec![0; 4 * 3];
    o.rows_into(&att, 8, &rows, 3, &mut out).unwrap();
    for (r, &row) in rows.iter().enumerate() {
        let want = o.row(row, &a);
        assert_eq!(&out[r * 3..r * 3 + want.len()], &want[..]);
        assert!(out[r * 3 + want.len()..(r + 1) * 3]
            .iter()
            .all(|&x| x == -1));
    }
    // GQA: a KV head ranks keys by its group's summed weight.
    let shape = AttentionShape {
        n_queries: 1,
        n_q_heads: 2,
        n_kv_heads: 1,
        d_k: 1,
        d_v: 1,
        n_keys: 4,
    };
    let probs = [0.5, 0.0, 0.3, 0.2, 0.0, 0.6, 0.3, 0.1];
    let mut sel = vec![0; 2];
    OracleTopK { budget: 2 }
        .selection_into(&probs, &shape, &[3], 2, &mut sel)
        .unwrap();
    assert_eq!(sel, vec![1, 2], "sums 0.5, 0.6, 0.6, 0.3");
}

// ---------------------------------------------------------------------------
// Metrics
// ---------------------------------------------------------------------------

#[test]
fn batched_metrics_equal_the_single_row_witness_metrics() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let c = case(&mut rng, 20, 4, 2, 16, 16, 64, 0, true);
    let mut probs = vec![0.0; 20 * 4 * 64];
    attention_probabilities(&c.q, &c.k, &c.shape, &c.query_pos, 0.25, &mut probs).unwrap();
    for (r, row) in probs.chunks(64).enumerate() {
        let visible = (c.query_pos[r / 4] + 1).min(64);
        let total: f64 = row.iter().sum();
        assert!((total - 1.0).abs() < 1e-12);
        assert!(row[visible..].iter().all(|&x| x == 0.0));
    }
    let width = 9;
    let sel = random_selection(&mut rng, &c, width);
    let mut recall = vec![0.0; 80];
    attention_mass_recall_rows(&sel, width, &probs, 64, 2, &mut recall).unwrap();
    for r in 0..80 {
        let cand = &sel[(r / 2) * width..][..width];
        let want = witness::attention_mass_recall(cand, &probs[r * 64..][..64]);
        assert_eq!(recall[r].to_bits(), want.to_bits());
    }
    let lens: Vec<usize> = (0..40).map(|r| c.query_pos[r / 2] + 1).collect();
    let mut cov = vec![0.0; 40];
    segment_coverage_rows(&sel, width, &lens, 8, &mut cov).unwrap();
    for r in 0..40 {
        let want = witness::segment_coverage(&sel[r * width..][..width], lens[r], 8);
        assert_eq!(cov[r], want);
    }
    // Relative error: exact on a hand example, per row and overall.
    let a = [3.0f32, 4.0, 0.0, 0.0];
    let b = [0.0f32, 0.0, 1.0, 0.0];
    assert_eq!(output_relative_error(&a, &a).unwrap(), 0.0);
    assert_eq!(
        output_relative_error(&[0.0, 0.0], &[0.0, 0.0]).unwrap(),
        0.0
    );
    assert_eq!(
        output_relative_error(&[1.0, 0.0], &[0.0, 0.0]).unwrap(),
        f64::INFINITY
    );
    let mut rows = [0.0; 2];
    output_relative_error_rows(&[3.0, 4.0, 1.0, 1.0], &[0.0, 5.0, 1.0, 1.0], 2, &mut rows).unwrap();
    assert_eq!(rows, [(10.0f64 / 25.0).sqrt(), 0.0]);
    assert_eq!(
        output_relative_error(&a, &b).unwrap(),
        (26.0f64).sqrt(),
        "‖(3,4,-1,0)‖ / ‖(0,0,1,0)‖"
    );
    assert_eq!(
        output_relative_error(&a[..3], &b).unwrap_err().argument(),
        "sparse"
    );
}

// ---------------------------------------------------------------------------
// Real attention inputs
// ---------------------------------------------------------------------------

const FIXTURE: &[u8] = include_bytes!("data/minilm_qkv.bin");
const LAYERS: usize = 2;
const HEADS: usize = 2;
const TOKENS: usize = 128;
const DIM: usize = 32;

/// Layer `layer` of the fixture as a causal MHA case: `[tokens, heads, dim]`.
fn minilm(layer: usize) -> Case {
    assert_eq!(FIXTURE.len(), 3 * LAYERS * HEADS * TOKENS * DIM * 4);
    let at = |t: usize, l: usize, h: usize, i: usize, d: usize| {
        let idx = (((t * LAYERS + l) * HEADS + h) * TOKENS + i) * DIM + d;
        f32::from_le_bytes(FIXTURE[idx * 4..idx * 4 + 4].try_into().unwrap())
    };
    let gather = |t: usize| -> Vec<f32> {
        let mut x = Vec::with_capacity(TOKENS * HEADS * DIM);
        for i in 0..TOKENS {
            for h in 0..HEADS {
                for d in 0..DIM {
                    x.push(at(t, layer, h, i, d));
                }
            }
        }
        x
    };
    Case {
        shape: AttentionShape {
            n_queries: TOKENS,
            n_q_heads: HEADS,
            n_kv_heads: HEADS,
            d_k: DIM,
            d_v: DIM,
            n_keys: TOKENS,
        },
        q: gather(0),
        k: gather(1),
        v: gather(2),
        v_stride: DIM,
        query_pos: (0..TOKENS).collect(),
    }
}

#[test]
fn real_minilm_attention_matches_a_float64_computation() {
    let scale = softmax_scale(DIM);
    assert_eq!(scale, 1.0 / 32f32.sqrt());
    for layer in 0..LAYERS {
        let c = minilm(layer);
        assert!(c.q.iter().chain(&c.k).chain(&c.v).all(|x| x.is_finite()));
        let d = dense(&c, scale);
        let (want, want_lse) = reference(&c, None, scale as f64);
        let e = rel_err(&d.out, &want);
        assert!(e < 1e-5, "layer {layer}: relative error {e:e}");
        for (&g, &w) in d.lse.iter().zip(&want_lse) {
            assert!((g as f64 - w).abs() < 1e-5 * w.abs().max(1.0));
        }
        // The f64 probabilities are the reference's softmax.
        let mut probs = vec![0.0; TOKENS * HEADS * TOKENS];
        attention_probabilities(&c.q, &c.k, &c.shape, &c.query_pos, scale as f64, &mut probs)
            .unwrap();
        for i in 0..TOKENS {
            for h in 0..HEADS {
                let row = &probs[(i * HEADS + h) * TOKENS..][..TOKENS];
                let qr = &c.q[(i * HEADS + h) * DIM..][..DIM];
                let s: Vec<f64> = (0..=i)
                    .map(|j| {
                        let kr = &c.k[(j * HEADS + h) * DIM..][..DIM];
                        qr.iter()
                            .zip(kr)
                            .map(|(&a, &b)| a as f64 * b as f64)
                            .sum::<f64>()
                            * scale as f64
                    })
                    .collect();
                let lse = want_lse[i * HEADS + h];
                for (j, &sj) in s.iter().enumerate() {
                    assert!((row[j] - (sj - lse).exp()).abs() < 1e-12);
                }
            }
        }
    }
}

#[test]
fn on_real_attention_the_oracle_recall_bounds_every_selector_at_equal_budget() {
    let scale = softmax_scale(DIM) as f64;
    for layer in 0..LAYERS {
        let c = minilm(layer);
        let mut probs = vec![0.0; TOKENS * HEADS * TOKENS];
        attention_probabilities(&c.q, &c.k, &c.shape, &c.query_pos, scale, &mut probs).unwrap();
        let d = dense(&c, scale as f32);
        let mut errors = Vec::new();
        for budget in [4usize, 16, 64] {
            let mut oracle = vec![0; TOKENS * HEADS * budget];
            OracleTopK { budget }
                .selection_into(&probs, &c.shape, &c.query_pos, budget, &mut oracle)
                .unwrap();
            let mut best = vec![0.0; TOKENS * HEADS];
            attention_mass_recall_rows(&oracle, budget, &probs, TOKENS, 1, &mut best).unwrap();
            for sel in [
                Selector::Local { window: budget },
                Selector::Random { budget, seed: 3 },
                Selector::SinkWindow {
                    sinks: budget / 4,
                    window: budget - budget / 4,
                },
            ] {
                let mut s = vec![0; TOKENS * HEADS * budget];
                sel.selection_into(&c.query_pos, HEADS, budget, &mut s)
                    .unwrap();
                let mut recall = vec![0.0; TOKENS * HEADS];
                attention_mass_recall_rows(&s, budget, &probs, TOKENS, 1, &mut recall).unwrap();
                for (r, (&o, &x)) in best.iter().zip(&recall).enumerate() {
                    assert!(
                        o >= x - 1e-12,
                        "layer {layer} {sel:?} row {r}: {x} > oracle {o}"
                    );
                }
            }
            let o_sel = sparse(&c, &oracle, budget, scale as f32);
            errors.push(output_relative_error(&o_sel.out, &d.out).unwrap());
        }
        // More of the heaviest keys, closer to dense.
        eprintln!("layer {layer}: oracle output error at budgets 4, 16, 64: {errors:?}");
        assert!(errors.windows(2).all(|w| w[1] < w[0]), "{errors:?}");
        // Budget = every key: the oracle selection is dense, bit for bit.
        let mut full = vec![0; TOKENS * HEADS * TOKENS];
        OracleTopK { budget: TOKENS }
            .selection_into(&probs, &c.shape, &c.query_pos, TOKENS, &mut full)
            .unwrap();
        let s = sparse(&c, &full, TOKENS, scale as f32);
        assert_eq!(bits(&s.out), bits(&d.out));
    }
}

// ---------------------------------------------------------------------------
// Refusals
// ---------------------------------------------------------------------------

#[test]
fn malformed_calls_are_refused_before_anything_is_written() {
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    let c = case(&mut rng, 3, 4, 2, 8, 8, 10, 0, false);
    let s = c.shape;
    let sel = vec![0i32; 3 * 2 * 4];
    let call = |c: &Case,
                shape: &AttentionShape,
                sel: &[i32],
                width: usize,
                scale: f32,
                on: usize,
                nl: usize| {
        let mut out = vec![7.0f32; on];
        let mut lse = vec![7.0f32; nl];
        let r = sparse_attention(
            &c.q,
            &c.k,
            &c.v,
            c.v_stride,
            shape,
            &c.query_pos,
            sel,
            width,
            scale,
            &mut out,
            &mut lse,
        );
        let d = dense_attention(
            &c.q,
            &c.k,
            &c.v,
            c.v_stride,
            shape,
            &c.query_pos,
            scale,
            &mut out,
            &mut lse,
        );
        if r.is_err() && d.is_err() {
            assert!(
                out.iter().chain(&lse).all(|&x| x == 7.0),
                "a refused call wrote"
            );
        }
        (r.map(|_| ()), d.map(|_| ()))
    };
    let (on, nl) = (3 * 4 * 8, 3 * 4);
    assert_eq!(call(&c, &s, &sel, 4, 0.3, on, nl), (Ok(()), Ok(())));
    let refused = |r: (Result<(), ArgumentError>, Result<(), ArgumentError>)| -> &'static str {
        let e = r.0.unwrap_err();
        assert!(e.to_string().contains(e.argument()), "{e}");
        e.argument()
    };
    let mut bad = s;
    bad.n_kv_heads = 0;
    assert_eq!(refused(call(&c, &bad, &sel, 4, 0.3, on, nl)), "n_kv_heads");
    bad = s;
    bad.n_kv_heads = 3;
    assert_eq!(refused(call(&c, &bad, &sel, 4, 0.3, on, nl)), "n_q_heads");
    bad = s;
    bad.d_k = 7;
    assert_eq!(refused(call(&c, &bad, &sel, 4, 0.3, on, nl)), "q");
    bad = s;
    bad.n_keys = 11;
    assert_eq!(refused(call(&c, &bad, &sel, 4, 0.3, on, nl)), "k");
    bad = s;
    bad.n_queries = usize::MAX;
    assert_eq!(refused(call(&c, &bad, &sel, 4, 0.3, on, nl)), "q");
    assert_eq!(refused(call(&c, &s, &sel, 5, 0.3, on, nl)), "selection");
    assert_eq!(refused(call(&c, &s, &sel, 4, f32::NAN, on, nl)), "scale");
    assert_eq!(
        refused(call(&c, &s, &sel, 4, f32::INFINITY, on, nl)),
        "scale"
    );
    assert_eq!(refused(call(&c, &s, &sel, 4, 0.3, on - 1, nl)), "out");
    assert_eq!(refused(call(&c, &s, &sel, 4, 0.3, on, nl + 1)), "lse");
    let mut short_v = c.clone();
    short_v.v.pop();
    assert_eq!(refused(call(&short_v, &s, &sel, 4, 0.3, on, nl)), "v");
    let mut narrow = c.clone();
    narrow.v_stride = 7;
    assert_eq!(refused(call(&narrow, &s, &sel, 4, 0.3, on, nl)), "v_stride");
    let mut few_pos = c.clone();
    few_pos.query_pos.pop();
    assert_eq!(
        refused(call(&few_pos, &s, &sel, 4, 0.3, on, nl)),
        "query_pos"
    );

    // Selectors: a width too narrow for a row, a row past i32.
    let mut out = vec![7; 2 * 3];
    let e = Selector::Local { window: 4 }
        .rows_into(&[10, 11], 3, &mut out)
        .unwrap_err();
    assert_eq!(e.argument(), "width");
    let e = Selector::Dense
        .rows_into(&[1, usize::MAX], 3, &mut out)
        .unwrap_err();
    assert_eq!(e.argument(), "rows");
    let e = Selector::Dense
        .rows_into(&[1, 2], 3, &mut out[..5])
        .unwrap_err();
    assert_eq!(e.argument(), "out");
    assert!(out.iter().all(|&x| x == 7));
    let e = OracleTopK { budget: 4 }
        .rows_into(&[0.5; 8], 8, &[7], 3, &mut out[..3])
        .unwrap_err();
    assert_eq!(e.argument(), "width");
    // Metrics.
    let mut m = vec![7.0; 4];
    let e = attention_mass_recall_rows(&[0; 8], 4, &[0.0; 12], 3, 0, &mut m).unwrap_err();
    assert_eq!(e.argument(), "group");
    let e = attention_mass_recall_rows(&[0; 8], 4, &[0.0; 12], 3, 3, &mut m).unwrap_err();
    assert_eq!(e.argument(), "group");
    let e = attention_mass_recall_rows(&[0; 8], 3, &[0.0; 12], 3, 2, &mut m).unwrap_err();
    assert_eq!(e.argument(), "candidates");
    let e = segment_coverage_rows(&[0; 8], 2, &[1, 2, 3], 4, &mut m).unwrap_err();
    assert_eq!(e.argument(), "context_lens");
    let e = attention_probabilities(&c.q, &c.k, &s, &c.query_pos, f64::NAN, &mut m).unwrap_err();
    assert_eq!(e.argument(), "scale");
    let e = attention_probabilities(&c.q, &c.k, &s, &c.query_pos, 1.0, &mut m).unwrap_err();
    assert_eq!(e.argument(), "out");
    assert!(m.iter().all(|&x| x == 7.0));
}
