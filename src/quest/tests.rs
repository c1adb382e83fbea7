//! Quest's core: the sources' examples pinned, properties on random
//! inputs, every refusal leaving the buffers as they were.

use super::select::{count, rank};
use super::*;
use crate::keys::{BlockTable, Encoded, PageLayout, PagedCache};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn layout(h: usize, d: usize, p: usize) -> Layout {
    Layout {
        n_kv_heads: h,
        d,
        page_size: p,
    }
}

fn bounds(keys: &[f32], scale: Option<&[f32]>, l: Layout) -> (Vec<f32>, Vec<f32>) {
    let n = keys.len() / l.row();
    let np = pages_of(n, l.page_size);
    let (mut lo, mut hi) = (vec![0.0; np * l.row()], vec![0.0; np * l.row()]);
    bounds_into(Encoded::F32(keys), scale, None, l, &mut lo, &mut hi).unwrap();
    (lo, hi)
}

#[allow(clippy::too_many_arguments)]
fn select(
    q: &[f32],
    hq: usize,
    lo: &[f32],
    hi: &[f32],
    n: usize,
    l: Layout,
    budget: usize,
    v: Variant,
) -> Vec<i32> {
    let rows = if matches!(v, Variant::Sglang { .. }) {
        1
    } else {
        hq
    };
    let mut out = vec![7; rows * width(v, budget)];
    select_into(Encoded::F32(q), hq, lo, hi, &[n], l, budget, v, &mut out).unwrap();
    out
}

#[test]
fn bounds_of_a_partly_filled_last_page_cover_its_keys_only() {
    // 5 tokens, pages of 2, 1 head, d = 2: pages {0,1}, {2,3}, {4}.
    let keys = [1.0, -1.0, 3.0, -5.0, 2.0, 2.0, -4.0, 0.5, 9.0, -9.0];
    let (lo, hi) = bounds(&keys, None, layout(1, 2, 2));
    assert_eq!(lo, vec![1.0, -5.0, -4.0, 0.5, 9.0, -9.0]);
    assert_eq!(hi, vec![3.0, -1.0, 2.0, 2.0, 9.0, -9.0]);
}

#[test]
fn the_score_is_the_sign_selected_bound_and_the_last_page_is_forced() {
    // 1 head, d = 2, pages of 1 token: page p's bounds are its key.
    // q = (1, -1): s_p = k_p0 - k_p1.
    let keys = [5.0, 0.0, 1.0, 0.0, 4.0, 0.0, 0.0, 9.0, 3.0, 0.0];
    let l = layout(1, 2, 1);
    let (lo, hi) = bounds(&keys, None, l);
    let mut s = vec![0.0; 5];
    scores_into(Encoded::F32(&[1.0, -1.0]), 1, &lo, &hi, l, &mut s).unwrap();
    assert_eq!(s, vec![5.0, 1.0, 4.0, -9.0, 3.0]);
    // budget 3: the last page (4) and the best 2 of pages 0..4: 0 and 2.
    assert_eq!(
        select(&[1.0, -1.0], 1, &lo, &hi, 5, l, 3, Variant::Kernel),
        vec![0, 2, 4]
    );
    // The evaluation script: the best max(3, 3) of all five, none forced.
    assert_eq!(
        select(&[1.0, -1.0], 1, &lo, &hi, 5, l, 3, Variant::Eval),
        vec![0, 2, 4]
    );
    // budget 2: page 4 forced, page 0; the script takes its floor of 3.
    assert_eq!(
        select(&[1.0, -1.0], 1, &lo, &hi, 5, l, 2, Variant::Kernel),
        vec![0, 4]
    );
    assert_eq!(
        select(&[1.0, -1.0], 1, &lo, &hi, 5, l, 2, Variant::Eval),
        vec![0, 2, 4]
    );
    // budget >= pages: every page, dense (no score read).
    assert_eq!(
        select(&[1.0, -1.0], 1, &lo, &hi, 5, l, 5, Variant::Kernel),
        vec![0, 1, 2, 3, 4]
    );
    assert_eq!(
        select(&[1.0, -1.0], 1, &lo, &hi, 5, l, 9, Variant::Kernel)[5..],
        [-1, -1, -1, -1]
    );
}

#[test]
fn sglang_averages_the_group_sums_the_heads_and_keeps_the_recent_pages() {
    // 2 KV heads, 2 query heads each, d = 1, pages of 1 token, 6 pages.
    let l = layout(2, 1, 1);
    let keys = [1.0, 0.0, -2.0, 5.0, 3.0, 3.0, 0.0, 0.0, 9.0, 9.0, 9.0, 9.0];
    let (lo, hi) = bounds(&keys, None, l);
    // Group means: (1 + 3) / 2 = 2 for head 0, (-1 + -3) / 2 = -2 for head 1.
    let q = [1.0, 3.0, -1.0, -3.0];
    let mut s = vec![0.0; 6];
    grouped_scores_into(Encoded::F32(&q), 4, &lo, &hi, l, &mut s).unwrap();
    assert_eq!(s, vec![2.0, -14.0, 0.0, 0.0, 0.0, 0.0]);
    // 2 recent pages (4, 5) and max(3 - 2, 1) = 1 of pages 0..4: page 0.
    let v = Variant::Sglang {
        num_recent_pages: 2,
    };
    assert_eq!(select(&q, 4, &lo, &hi, 6, l, 3, v), vec![0, 4, 5]);
    // A budget below the recent pages still takes one page before them.
    assert_eq!(select(&q, 4, &lo, &hi, 6, l, 1, v), vec![0, 4, 5]);
    // Pages 2 and 3 tie at 0 for the second place: the lower id, 2.
    assert_eq!(select(&q, 4, &lo, &hi, 6, l, 4, v), vec![0, 2, 4, 5]);
    // No page before the recent ones: every page.
    let v6 = Variant::Sglang {
        num_recent_pages: 6,
    };
    assert_eq!(
        select(&q, 4, &lo, &hi, 6, l, 2, v6)[..6],
        [0, 1, 2, 3, 4, 5]
    );
}

#[test]
fn the_bfloat16_group_mean_is_rounded_to_bfloat16() {
    assert_eq!(round_bf16(1.0 + 2f32.powi(-8)), 1.0); // a tie, to even
    assert_eq!(round_bf16(1.0 + 3.0 * 2f32.powi(-8)), 1.0 + 2f32.powi(-6));
    assert_eq!(round_f16(1.0 + 2f32.powi(-11)), 1.0);
    assert_eq!(round_f16(1.0 + 3.0 * 2f32.powi(-11)), 1.0 + 2f32.powi(-9));
    assert_eq!(round_f16(65519.0), 65504.0);
    assert_eq!(round_f16(65520.0), f32::INFINITY);
    assert_eq!(round_f16(3.0 * 2f32.powi(-26)), 2f32.powi(-24)); // subnormal
}

#[test]
fn ties_go_to_the_lower_page_and_nan_ranks_last() {
    use std::cmp::Ordering::*;
    assert_eq!(rank((1.0, 3), (1.0, 5)), Less);
    assert_eq!(rank((0.0, 5), (-0.0, 3)), Greater);
    assert_eq!(rank((f32::NAN, 0), (f32::NEG_INFINITY, 9)), Greater);
    // Every page scores the same: the lowest ids, the last page forced.
    let l = layout(1, 1, 1);
    let (lo, hi) = bounds(&[2.0; 8], None, l);
    assert_eq!(
        select(&[1.0], 1, &lo, &hi, 8, l, 4, Variant::Kernel),
        vec![0, 1, 2, 7]
    );
}

#[test]
fn updating_one_key_at_a_time_equals_building_from_the_keys() {
    let mut rng = ChaCha8Rng::seed_from_u64(41);
    for _ in 0..100 {
        let (h, d, p) = (
            rng.random_range(1..4),
            rng.random_range(1..20),
            rng.random_range(1..6),
        );
        let l = layout(h, d, p);
        let n = rng.random_range(1..40);
        let keys: Vec<f32> = (0..n * h * d)
            .map(|_| rng.random_range(-3.0f32..3.0))
            .collect();
        let scales: Vec<f32> = (0..n).map(|_| rng.random_range(0.1f32..2.0)).collect();
        let (lo, hi) = bounds(&keys, Some(&scales), l);
        // Stale bytes everywhere: the first key of each page resets it.
        let np = pages_of(n, p);
        let (mut ulo, mut uhi) = (vec![-77.0; np * l.row()], vec![77.0; np * l.row()]);
        for t in 0..n {
            let key = &keys[t * l.row()..(t + 1) * l.row()];
            update_bounds(Encoded::F32(key), Some(scales[t]), t, l, &mut ulo, &mut uhi).unwrap();
        }
        assert_eq!((lo, hi), (ulo, uhi));
    }
}

#[test]
fn paged_bounds_equal_the_dense_ones_fp8_with_scales_and_bf16() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for case in 0..60 {
        let (h, d, p) = (
            rng.random_range(1..3),
            rng.random_range(1..9),
            rng.random_range(1..5),
        );
        let l = layout(h, d, p);
        let row = l.row();
        let mb = 12usize.div_ceil(p);
        let mut lens: Vec<usize> = (0..rng.random_range(1..4))
            .map(|_| rng.random_range(1..12))
            .collect();
        if case % 3 == 0 {
            // The last sequence fills its table row to the end: no page
            // past it is asked for (the kernel's next page stops there).
            *lens.last_mut().unwrap() = mb * p;
        }
        let n_pages_cache = 20;
        let fp8 = case % 2 == 0;
        let page_bytes = if fp8 { p * row + 4 * p } else { 2 * p * row };
        let mut cache = vec![0u8; n_pages_cache * page_bytes];
        for b in cache.iter_mut() {
            *b = rng.random_range(0..0x7Eu8) | if rng.random_range(0..2) == 0 { 0x80 } else { 0 };
        }
        if fp8 {
            for pg in 0..n_pages_cache {
                for t in 0..p {
                    let at = pg * page_bytes + p * row + 4 * t;
                    cache[at..at + 4]
                        .copy_from_slice(&rng.random_range(0.01f32..2.0).to_le_bytes());
                }
            }
        }
        let table: Vec<i32> = (0..lens.len() * mb)
            .map(|_| rng.random_range(0..n_pages_cache as i32))
            .collect();
        let pc = PagedCache {
            bytes: &cache,
            n_pages: n_pages_cache,
            page_stride: page_bytes,
            block_size: p,
            d: row,
            layout: if fp8 {
                PageLayout::Fp8WithScales
            } else {
                PageLayout::Dense(crate::keys::Format::Bf16)
            },
        };
        let bt = BlockTable {
            table: &table,
            max_blocks: mb,
            seq_lens: &lens,
        };
        let total: usize = lens.iter().map(|&n| pages_of(n, p)).sum();
        let (mut lo, mut hi) = (vec![0.0; total * row], vec![0.0; total * row]);
        bounds_paged_into(&pc, &bt, l, &mut lo, &mut hi).unwrap();
        // The same keys laid out densely, decoded and scaled.
        let (mut keys, mut scales, mut cu) = (Vec::new(), Vec::new(), vec![0usize]);
        for (s, &n) in lens.iter().enumerate() {
            for t in 0..n {
                let pg = table[s * mb + t / p] as usize;
                let mut row_v = vec![0.0f32; row];
                let mut sc = [1.0f32];
                pc.decode(pg, t % p, &mut row_v, &mut sc);
                keys.extend(row_v);
                scales.push(sc[0]);
            }
            cu.push(keys.len() / row);
        }
        let (mut dlo, mut dhi) = (vec![0.0; total * row], vec![0.0; total * row]);
        let sc = if fp8 { Some(&scales[..]) } else { None };
        bounds_into(Encoded::F32(&keys), sc, Some(&cu), l, &mut dlo, &mut dhi).unwrap();
        let same = |a: &[f32], b: &[f32]| {
            a.iter()
                .zip(b)
                .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
        };
        assert!(same(&lo, &dlo) && same(&hi, &dhi), "case {case}");
    }
}

/// The kernel path's page set from its definition: sort all candidates by
/// (score desc, id asc) and take a prefix, in float64 from the bounds.
fn naive_kernel(q: &[f32], lo: &[f32], hi: &[f32], d: usize, np: usize, budget: usize) -> Vec<i32> {
    if np <= budget {
        return (0..np as i32).collect();
    }
    let mut s: Vec<(f32, usize)> = (0..np - 1)
        .map(|p| {
            let mut l = [0.0f32; 8];
            for i in 0..d.div_ceil(8) * 8 {
                let (a, b) = if i < d {
                    (
                        q[i],
                        if q[i] >= 0.0 {
                            hi[p * d + i]
                        } else {
                            lo[p * d + i]
                        },
                    )
                } else {
                    (0.0, 0.0)
                };
                l[i % 8] = a.mul_add(b, l[i % 8]);
            }
            (
                ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7])),
                p,
            )
        })
        .collect();
    s.sort_by(|&a, &b| rank(a, b));
    let mut v: Vec<i32> = s[..budget - 1].iter().map(|&(_, p)| p as i32).collect();
    v.push(np as i32 - 1);
    v.sort();
    v
}

#[test]
fn random_page_sets_equal_the_definition() {
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    for _ in 0..300 {
        let (d, p) = (rng.random_range(1..12), rng.random_range(1..5));
        let l = layout(1, d, p);
        let n = rng.random_range(1..60);
        // Small integers: many exact ties.
        let keys: Vec<f32> = (0..n * d).map(|_| rng.random_range(-3..4) as f32).collect();
        let q: Vec<f32> = (0..d).map(|_| rng.random_range(-2..3) as f32).collect();
        let (lo, hi) = bounds(&keys, None, l);
        let np = pages_of(n, p);
        let budget = rng.random_range(1..np + 3);
        let got = select(&q, 1, &lo, &hi, n, l, budget, Variant::Kernel);
        let want = naive_kernel(&q, &lo, &hi, d, np, budget);
        assert_eq!(&got[..want.len()], &want[..]);
        assert!(got[want.len()..].iter().all(|&x| x == -1));
        assert_eq!(want.len(), count(Variant::Kernel, budget, np, n, p));
    }
}

#[test]
fn refusals_name_the_argument_and_write_nothing() {
    let l = layout(2, 4, 16);
    let keys = vec![1.0f32; 40 * 8];
    let (mut lo, mut hi) = (vec![5.0f32; 3 * 8], vec![5.0f32; 3 * 8]);
    let e = bounds_into(Encoded::F32(&keys[..7]), None, None, l, &mut lo, &mut hi).unwrap_err();
    assert_eq!(e.argument(), "keys");
    let e = bounds_into(
        Encoded::F32(&keys),
        Some(&[1.0; 3]),
        None,
        l,
        &mut lo,
        &mut hi,
    )
    .unwrap_err();
    assert_eq!(e.argument(), "key_scale");
    let e = bounds_into(
        Encoded::F32(&keys),
        None,
        Some(&[0, 50, 40]),
        l,
        &mut lo,
        &mut hi,
    )
    .unwrap_err();
    assert_eq!(e.argument(), "cu_seqlens");
    let e = bounds_into(Encoded::F32(&keys), None, None, l, &mut lo[..8], &mut hi).unwrap_err();
    assert_eq!(e.argument(), "kmin");
    let e = bounds_into(
        Encoded::F32(&keys),
        None,
        None,
        layout(0, 4, 16),
        &mut lo,
        &mut hi,
    )
    .unwrap_err();
    assert_eq!(e.argument(), "n_kv_heads");
    let e = update_bounds(Encoded::F32(&keys[..8]), None, 48, l, &mut lo, &mut hi).unwrap_err();
    assert_eq!(e.argument(), "pos");
    let e = update_bounds(Encoded::F32(&keys[..5]), None, 1, l, &mut lo, &mut hi).unwrap_err();
    assert_eq!(e.argument(), "key");
    let q = vec![1.0f32; 4 * 4];
    let mut out = vec![9i32; 4 * 4];
    let v = Variant::Kernel;
    let e = select_into(Encoded::F32(&q), 4, &lo, &hi, &[40], l, 0, v, &mut out).unwrap_err();
    assert_eq!(e.argument(), "page_budget");
    let e = select_into(Encoded::F32(&q), 4, &lo, &hi, &[20], l, 4, v, &mut out).unwrap_err();
    assert_eq!(e.argument(), "kmin");
    let e = select_into(
        Encoded::F32(&q),
        3,
        &lo,
        &hi,
        &[40],
        l,
        4,
        v,
        &mut out[..12],
    )
    .unwrap_err();
    assert_eq!(e.argument(), "q");
    let e = select_into(Encoded::F32(&q), 4, &lo, &hi, &[0], l, 4, v, &mut out).unwrap_err();
    assert_eq!(e.argument(), "seq_lens");
    let e = select_into(Encoded::F32(&q), 4, &lo, &hi, &[40], l, 4, v, &mut out[..5]).unwrap_err();
    assert_eq!(e.argument(), "out");
    assert!(lo.iter().chain(&hi).all(|&x| x == 5.0) && out.iter().all(|&x| x == 9));
}
