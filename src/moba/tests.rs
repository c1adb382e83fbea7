//! MoBA's core: the source's rule on hand-made examples, the total order,
//! the variants at `topk = 1`, paged equal to dense, every refusal leaving
//! the output as it was.

use super::*;
use crate::keys::{BlockTable, Encoded, PageLayout, PagedCache};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn shape(hq: usize, h: usize, d: usize, bs: usize) -> Shape {
    Shape {
        heads: Heads {
            n_q_heads: hq,
            n_kv_heads: h,
            d,
        },
        block_size: bs,
    }
}

fn select(q: &[f32], k: &[f32], s: Shape, topk: usize, v: Variant) -> Vec<i32> {
    let n_k = k.len() / (s.heads.n_kv_heads * s.heads.d);
    let n_q = q.len() / (s.heads.n_q_heads * s.heads.d);
    let w = width(v, topk, n_k.div_ceil(s.block_size));
    let mut out = vec![7; n_q * s.heads.n_q_heads * w];
    let cq = [0, n_q];
    select_into(
        Encoded::F32(q),
        Encoded::F32(k),
        None,
        &[0, n_k],
        Some(&cq),
        s,
        topk,
        v,
        &mut out,
    )
    .unwrap();
    out
}

/// 8 keys of d = 1 in blocks of 2: block means 1, 5, -2, 3.
const KEYS: [f32; 8] = [0.0, 2.0, 4.0, 6.0, -3.0, -1.0, 3.0, 3.0];

#[test]
fn past_blocks_ranked_by_the_gate_on_their_mean_the_current_forced() {
    let s = shape(1, 1, 1, 2);
    // One query (q = 1) at position 7: current block 3, past gates 1, 5, -2.
    assert_eq!(select(&[1.0], &KEYS, s, 2, Variant::Efficient), vec![1, 3]);
    assert_eq!(
        select(&[1.0], &KEYS, s, 3, Variant::Efficient),
        vec![0, 1, 3]
    );
    // q = -1 reverses the gates: -1, -5, 2.
    assert_eq!(
        select(&[-1.0], &KEYS, s, 3, Variant::Efficient),
        vec![0, 2, 3]
    );
    // More slots than past blocks: every one, then -1.
    assert_eq!(
        select(&[1.0], &KEYS, s, 6, Variant::Efficient),
        vec![0, 1, 2, 3, -1, -1]
    );
}

#[test]
fn every_query_gates_only_its_completed_past_blocks() {
    let s = shape(1, 1, 1, 2);
    // Queries at positions 0..8 (Tq = Tkv), topk 2, q = -1: the best past
    // block of a query in block c is the one of least mean before c.
    let rows = select(&[-1.0; 8], &KEYS, s, 2, Variant::Efficient);
    let want = [
        [0, -1],
        [0, -1],
        [0, 1],
        [0, 1],
        [0, 2],
        [0, 2],
        [2, 3],
        [2, 3],
    ];
    assert_eq!(rows, want.concat());
}

#[test]
fn fewer_queries_than_keys_sit_at_the_last_positions() {
    let s = shape(1, 1, 1, 2);
    // Two queries over 8 keys: positions 6 and 7.
    assert_eq!(
        select(&[1.0, -1.0], &KEYS, s, 2, Variant::Efficient),
        vec![1, 3, 2, 3]
    );
}

#[test]
fn ties_go_to_the_lower_block_and_nan_ranks_last() {
    let s = shape(1, 1, 1, 1);
    // Means 2, 2, 2, NaN, 2, 0: three slots of past blocks for the query at 6.
    let k = [2.0, 2.0, 2.0, f32::NAN, 2.0, 0.0, 1.0];
    assert_eq!(
        select(&[1.0], &k, s, 4, Variant::Efficient),
        vec![0, 1, 2, 6]
    );
    let k = [0.0, -0.0, 1.0];
    assert_eq!(select(&[1.0], &k, s, 2, Variant::Efficient), vec![0, 2]);
    assert_eq!(rank((f32::NAN, 0), (-1e30, 9)), Ordering::Greater);
}

#[test]
fn topk_one_full_causal_for_the_efficient_code_own_block_for_the_naive() {
    let s = shape(1, 1, 1, 2);
    assert_eq!(
        select(&[1.0], &KEYS, s, 1, Variant::Efficient),
        vec![0, 1, 2, 3]
    );
    assert_eq!(select(&[1.0], &KEYS, s, 1, Variant::Naive), vec![3]);
    // Above 1 they agree.
    for topk in 2..6 {
        let q = [0.5, -1.0, 2.0];
        assert_eq!(
            select(&q, &KEYS, s, topk, Variant::Efficient),
            select(&q, &KEYS, s, topk, Variant::Naive)
        );
    }
}

#[test]
fn gqa_heads_read_their_group_kv_head() {
    // 2 KV heads, 4 query heads, d = 1, blocks of 1: KV head 0 means 1, 3,
    // KV head 1 means 3, 1; query heads all q = 1.
    let s = shape(4, 2, 1, 1);
    let k = [1.0, 3.0, 3.0, 1.0, 0.0, 0.0];
    assert_eq!(
        select(&[1.0; 4], &k, s, 2, Variant::Efficient),
        vec![1, 2, 1, 2, 0, 2, 0, 2]
    );
}

#[test]
fn gates_are_the_8_lane_fused_sum_at_every_level_and_the_rows_agree() {
    let mut rng = ChaCha8Rng::seed_from_u64(45);
    for &(hq, h, d, bs, n) in &[(4, 2, 13, 3, 40), (2, 1, 64, 16, 300), (16, 1, 8, 5, 61)] {
        let s = shape(hq, h, d, bs);
        let q: Vec<f32> = (0..n * hq * d).map(|_| rng.random::<f32>() - 0.5).collect();
        let k: Vec<f32> = (0..n * h * d).map(|_| rng.random::<f32>() - 0.5).collect();
        let nb = n.div_ceil(bs);
        let mut g = vec![0.0; n * hq * nb];
        gates_into(Encoded::F32(&q), Encoded::F32(&k), None, s, &mut g).unwrap();
        // The gate against a float64 mean and dot: within the stated bound.
        let u = f64::powi(2.0, -24);
        let m = (d + bs + 4) as f64;
        let gamma = m * u / (1.0 - m * u);
        for i in 0..n {
            let c = i / bs;
            for hh in 0..hq {
                let kv = hh / (hq / h);
                for b in 0..nb {
                    let got = g[(i * hq + hh) * nb + b];
                    if b >= c {
                        assert!(got.is_nan());
                        continue;
                    }
                    let (mut exact, mut mag) = (0.0f64, 0.0f64);
                    for dd in 0..d {
                        let (mut sum, mut abs) = (0.0f64, 0.0f64);
                        for t in b * bs..(b + 1) * bs {
                            let v = k[(t * h + kv) * d + dd] as f64;
                            sum += v;
                            abs += v.abs();
                        }
                        let qi = q[(i * hq + hh) * d + dd] as f64;
                        exact += qi * sum / bs as f64;
                        mag += qi.abs() * abs / bs as f64;
                    }
                    assert!((got as f64 - exact).abs() <= gamma * mag * 1.0001 + 1e-30);
                }
            }
        }
        for isa in crate::simd::isas_for_test() {
            kernels::probe(isa);
        }
    }
}

#[test]
fn packed_equals_each_sequence_alone_and_paged_equals_dense() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let s = shape(4, 2, 6, 3);
    let lens = [10usize, 1, 7, 23];
    let n: usize = lens.iter().sum();
    let k: Vec<f32> = (0..n * 12).map(|_| rng.random::<f32>() - 0.5).collect();
    let q: Vec<f32> = (0..n * 24).map(|_| rng.random::<f32>() - 0.5).collect();
    let cu = cumulative(&lens);
    for topk in [1, 2, 4] {
        let w = width(Variant::Efficient, topk, 8);
        let mut out = vec![0; n * 4 * w];
        select_into(
            Encoded::F32(&q),
            Encoded::F32(&k),
            None,
            &cu,
            None,
            s,
            topk,
            Variant::Efficient,
            &mut out,
        )
        .unwrap();
        // The paged cache: pages of 4 tokens, shuffled; the last query of each sequence.
        let pages: usize = lens.iter().map(|l| l.div_ceil(4)).sum();
        let mut cache = vec![0.0f32; pages * 4 * 12];
        let mut table = vec![0i32; lens.len() * 6];
        let mut next = pages;
        for (si, &l) in lens.iter().enumerate() {
            for b in 0..l.div_ceil(4) {
                next -= 1;
                table[si * 6 + b] = next as i32;
                for t in b * 4..l.min(b * 4 + 4) {
                    let src = &k[(cu[si] + t) * 12..][..12];
                    cache[(next * 4 + t % 4) * 12..][..12].copy_from_slice(src);
                }
            }
        }
        let qd: Vec<f32> = cu[1..]
            .iter()
            .flat_map(|&e| q[(e - 1) * 24..e * 24].to_vec())
            .collect();
        let bytes: &[u8] = bytemuck::cast_slice(&cache);
        let pc = PagedCache {
            bytes,
            n_pages: pages,
            page_stride: 4 * 12 * 4,
            block_size: 4,
            d: 12,
            layout: PageLayout::Dense(crate::keys::Format::F32),
        };
        let bt = BlockTable {
            table: &table,
            max_blocks: 6,
            seq_lens: &lens,
        };
        let mut paged = vec![0; lens.len() * 4 * w];
        select_paged_into(
            Encoded::F32(&qd),
            &pc,
            &bt,
            s,
            topk,
            Variant::Efficient,
            &mut paged,
        )
        .unwrap();
        for (si, &e) in cu[1..].iter().enumerate() {
            assert_eq!(
                paged[si * 4 * w..(si + 1) * 4 * w],
                out[(e - 1) * 4 * w..e * 4 * w]
            );
            // Alone.
            let (a, b) = (cu[si], e);
            let alone = select(
                &q[a * 24..b * 24],
                &k[a * 12..b * 12],
                s,
                topk,
                Variant::Efficient,
            );
            let wa = alone.len() / ((b - a) * 4);
            for r in 0..(b - a) * 4 {
                assert_eq!(alone[r * wa..(r + 1) * wa], out[(a * 4 + r) * w..][..wa]);
                assert!(out[(a * 4 + r) * w + wa..(a * 4 + r + 1) * w]
                    .iter()
                    .all(|&x| x == -1));
            }
        }
    }
}

#[test]
fn refusals_name_the_argument_and_write_nothing() {
    let s = shape(1, 1, 1, 2);
    let q = [1.0f32; 2];
    let mut out = vec![5; 2 * 2];
    let run = |q: &[f32],
               k: &[f32],
               sc: Option<&[f32]>,
               cu: &[usize],
               cq: Option<&[usize]>,
               s: Shape,
               topk: usize,
               out: &mut [i32]| {
        select_into(
            Encoded::F32(q),
            Encoded::F32(k),
            sc,
            cu,
            cq,
            s,
            topk,
            Variant::Efficient,
            out,
        )
        .unwrap_err()
        .argument()
    };
    assert_eq!(
        run(&q, &KEYS, None, &[0, 8], Some(&[0, 2]), s, 0, &mut out),
        "topk"
    );
    assert_eq!(
        run(
            &q,
            &KEYS,
            None,
            &[0, 8],
            Some(&[0, 2]),
            shape(1, 1, 1, 0),
            2,
            &mut out
        ),
        "block_size"
    );
    assert_eq!(
        run(
            &q,
            &KEYS,
            None,
            &[0, 8],
            Some(&[0, 2]),
            shape(3, 2, 1, 2),
            2,
            &mut out
        ),
        "q"
    );
    assert_eq!(
        run(&q, &KEYS, None, &[0, 7], Some(&[0, 2]), s, 2, &mut out),
        "cu_seqlens"
    );
    assert_eq!(
        run(&q, &KEYS, None, &[0, 8], Some(&[0, 1]), s, 2, &mut out),
        "cu_seqlens_q"
    );
    assert_eq!(
        run(&q, &KEYS[..1], None, &[0, 1], Some(&[0, 2]), s, 2, &mut out),
        "cu_seqlens_q"
    );
    assert_eq!(
        run(
            &q,
            &KEYS,
            Some(&[1.0; 3]),
            &[0, 8],
            Some(&[0, 2]),
            s,
            2,
            &mut out
        ),
        "key_scale"
    );
    assert_eq!(
        run(&q, &KEYS, None, &[0, 8], Some(&[0, 2]), s, 3, &mut out),
        "out"
    );
    assert!(out.iter().all(|&x| x == 5));
}

#[test]
fn the_gates_kernel_is_bit_identical_on_every_level() {
    let mut rng = ChaCha8Rng::seed_from_u64(46);
    for _ in 0..300 {
        let d8: usize = 8 * rng.random_range(1..10);
        let (r, n): (usize, usize) = (rng.random_range(0..7), rng.random_range(0..11));
        let val = |rng: &mut ChaCha8Rng| match rng.random_range(0..10) {
            0 => 0.0,
            1 => -0.0,
            2 => 1e-40,
            _ => rng.random_range(-4.0f32..4.0),
        };
        let q: Vec<f32> = (0..r * d8).map(|_| val(&mut rng)).collect();
        let m: Vec<f32> = (0..n * d8).map(|_| val(&mut rng)).collect();
        // Rows at any offset (read in place), in any order, repeated.
        let rows: Vec<usize> = (0..rng.random_range(0..9))
            .map(|_| rng.random_range(0..(r * d8).saturating_sub(d8) + 1))
            .filter(|_| r > 0)
            .collect();
        let mut want = vec![0.0f32; rows.len() * n];
        kernels::gates(Isa::Scalar, &q, &rows, &m, d8, &mut want);
        // The definition: each gate the 8-lane fused sum, lanes added in the
        // module's order.
        for (i, &off) in rows.iter().enumerate() {
            for b in 0..n {
                let mut l = [0.0f32; 8];
                for x in 0..d8 {
                    l[x % 8] = q[off + x].mul_add(m[b * d8 + x], l[x % 8]);
                }
                let g = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
                assert_eq!(want[i * n + b].to_bits(), g.to_bits());
            }
        }
        for isa in crate::simd::isas_for_test() {
            let mut got = vec![9.0f32; rows.len() * n];
            kernels::gates(isa, &q, &rows, &m, d8, &mut got);
            assert!(got
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits()));
        }
    }
}

#[test]
fn the_sums_kernel_adds_rows_in_order_bit_identically_on_every_level() {
    let mut rng = ChaCha8Rng::seed_from_u64(48);
    for case in 0..300 {
        // Whole 32-element pieces only (the body alone, no tail) in the
        // first cases, then any width.
        let n = match case {
            0..=9 => [32, 64][case % 2],
            _ => rng.random_range(1..80),
        };
        let rows = rng.random_range(0..40);
        // Magnitudes far apart: the order of the additions shows in the bits.
        let x: Vec<f32> = (0..rows * n)
            .map(|_| rng.random_range(-1.0f32..1.0) * f32::powi(2.0, rng.random_range(-30..30)))
            .collect();
        let start: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let mut want = start.clone();
        for r in 0..rows {
            for e in 0..n {
                want[e] += x[r * n + e];
            }
        }
        // bfloat16 and float16 rows: their exact values added.
        let bf: Vec<u16> = x.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
        let hf: Vec<u16> = x.iter().map(|v| half_bits(*v * 1e-3)).collect();
        let sum = |dec: &dyn Fn(usize) -> f32| {
            let mut a = start.clone();
            for r in 0..rows {
                for (e, v) in a.iter_mut().enumerate() {
                    *v += dec(r * n + e);
                }
            }
            a
        };
        let want_bf = sum(&|i| crate::keys::bf16_to_f32(bf[i]));
        let want_hf = sum(&|i| crate::keys::f16_to_f32(hf[i]));
        for isa in crate::simd::isas_for_test() {
            for (rows, want) in [
                (Encoded::F32(&x), &want),
                (Encoded::Bf16(&bf), &want_bf),
                (Encoded::F16(&hf), &want_hf),
            ] {
                let mut got = start.clone();
                kernels::sums(isa, &mut got, rows);
                assert!(got
                    .iter()
                    .zip(want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()));
            }
        }
    }
}

#[test]
fn write_row_keeps_the_best_by_the_total_order_at_every_slot_count() {
    let mut rng = ChaCha8Rng::seed_from_u64(47);
    let mut scratch = Vec::new();
    for _ in 0..3000 {
        let c = rng.random_range(0..40);
        let gates: Vec<f32> = (0..c)
            .map(|_| match rng.random_range(0..8) {
                0 => f32::NAN,
                1 => -0.0,
                2 => 0.0,
                3 => 1.0,
                _ => rng.random_range(-3.0f32..3.0),
            })
            .collect();
        let n_past = rng.random_range(0..c + 2).min(c);
        let mut want: Vec<(f32, u32)> = gates
            .iter()
            .enumerate()
            .map(|(b, &g)| (g, b as u32))
            .collect();
        want.sort_by(|a, b| rank(*a, *b));
        let mut ids: Vec<i32> = want[..n_past].iter().map(|e| e.1 as i32).collect();
        ids.sort();
        ids.push(c as i32);
        let mut row = vec![7; c + 2];
        write_row(&gates, c, n_past, &mut scratch, &mut row);
        assert_eq!(&row[..ids.len()], &ids[..]);
        assert!(row[ids.len()..].iter().all(|&x| x == -1));
    }
}

/// Float16 bits of `v` (round toward zero; any float16 serves the test).
fn half_bits(v: f32) -> u16 {
    let b = v.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let e = ((b >> 23) & 0xFF) as i32 - 127 + 15;
    if e <= 0 {
        sign
    } else if e >= 31 {
        sign | 0x7BFF
    } else {
        sign | ((e as u16) << 10) | ((b >> 13) & 0x3FF) as u16
    }
}

/// An unscaled fp8 page (`PageLayout::Dense(Fp8E4m3)`) is decoded before its
/// rows are summed, as a scaled one is: the paged selection over fp8 pages
/// equals the one over the same pages decoded to float32. (The kernel's sums
/// take float32 / bfloat16 / float16 rows only; an fp8 page handed to them
/// in place was a panic reaching Python.)
#[test]
fn unscaled_fp8_pages_equal_their_float32_decode() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let s = shape(4, 2, 6, 3);
    let (lens, pages, d) = ([23usize, 9], 9usize, 12usize);
    // Every code but the two NaNs (0x7F, 0xFF).
    let fp8: Vec<u8> = (0..pages * 4 * d)
        .map(|_| {
            let c = rng.random::<u8>();
            if c & 0x7F == 0x7F {
                c & 0xF0
            } else {
                c
            }
        })
        .collect();
    let mut f32s = vec![0.0f32; fp8.len()];
    Encoded::Fp8E4m3(&fp8).decode(0, &mut f32s);
    let table: Vec<i32> = vec![8, 0, 7, 1, 6, 2, 5, 3, 4, -1, -1, -1];
    let bt = BlockTable {
        table: &table,
        max_blocks: 6,
        seq_lens: &lens,
    };
    let q: Vec<f32> = (0..lens.len() * 24)
        .map(|_| rng.random::<f32>() - 0.5)
        .collect();
    for topk in [2, 4] {
        let w = width(Variant::Efficient, topk, 8);
        let run = |bytes: &[u8], format, stride| {
            let pc = PagedCache {
                bytes,
                n_pages: pages,
                page_stride: stride,
                block_size: 4,
                d,
                layout: PageLayout::Dense(format),
            };
            let mut out = vec![0; lens.len() * 4 * w];
            select_paged_into(
                Encoded::F32(&q),
                &pc,
                &bt,
                s,
                topk,
                Variant::Efficient,
                &mut out,
            )
            .unwrap();
            out
        };
        let want = run(
            bytemuck::cast_slice(&f32s),
            crate::keys::Format::F32,
            4 * d * 4,
        );
        assert_eq!(run(&fp8, crate::keys::Format::Fp8E4m3, 4 * d), want);
    }
}

/// A value for the kernels' bit tests: zeros of both signs, a subnormal,
/// infinities, NaN, repeats (ties) and ordinary numbers.
fn wild(rng: &mut ChaCha8Rng) -> f32 {
    match rng.random_range(0..40) {
        0 => 0.0,
        1 => -0.0,
        2 => 1e-40,
        3 => f32::INFINITY,
        4 => f32::NEG_INFINITY,
        5 => f32::NAN,
        6..=12 => 1.0,
        13..=16 => -2.0,
        _ => rng.random_range(-4.0f32..4.0),
    }
}

#[test]
fn the_lanes_kernel_gives_the_gates_kernels_bits_on_every_level() {
    let mut rng = ChaCha8Rng::seed_from_u64(49);
    for _ in 0..400 {
        let d8: usize = 8 * rng.random_range(1..18);
        let n: usize = rng.random_range(0..21);
        let r: usize = rng.random_range(1..12);
        let q: Vec<f32> = (0..r * d8).map(|_| wild(&mut rng)).collect();
        let m: Vec<f32> = (0..n * d8).map(|_| wild(&mut rng)).collect();
        // Rows at any offset (read in place), in any order, repeated.
        let rows: [usize; 8] = std::array::from_fn(|_| rng.random_range(0..(r - 1) * d8 + 1));
        let mut portable = vec![0.0f32; 8 * n];
        kernels::gates(Isa::Scalar, &q, &rows, &m, d8, &mut portable);
        for isa in crate::simd::isas_for_test() {
            // The same level's `moba.gates`: the same bits, NaNs' too.
            let mut want = vec![0.0f32; 8 * n];
            kernels::gates(isa, &q, &rows, &m, d8, &mut want);
            let mut got = vec![9.0f32; 8 * n];
            kernels::lanes(isa, &q, &rows, &m, d8, &mut got);
            for (l, b) in (0..8).flat_map(|l| (0..n).map(move |b| (l, b))) {
                let (g, w, p) = (got[b * 8 + l], want[l * n + b], portable[l * n + b]);
                let at = format!("{isa:?} d8 {d8} n {n} lane {l} block {b}");
                assert_eq!(g.to_bits(), w.to_bits(), "{at}");
                // The portable level's: the same bits but for a NaN's sign
                // and payload (x86's default NaN is negative), which no
                // selection reads (every NaN ranks last).
                assert!(
                    g.to_bits() == p.to_bits() || (g.is_nan() && p.is_nan()),
                    "{at}"
                );
            }
        }
    }
}

#[test]
fn the_top_kernel_keeps_what_write_row_keeps_on_every_level() {
    let mut rng = ChaCha8Rng::seed_from_u64(50);
    let mut scratch = Vec::new();
    for _ in 0..3000 {
        let nb: usize = rng.random_range(2..40);
        let n = rng.random_range(1..=kernels::TOP_MAX.min(nb - 1));
        // Few distinct values: ties at the threshold are the rule, not luck.
        let pool: Vec<f32> = (0..rng.random_range(1..6))
            .map(|_| wild(&mut rng))
            .collect();
        let gates: Vec<f32> = (0..8 * nb)
            .map(|_| {
                if rng.random_range(0..3) == 0 {
                    wild(&mut rng)
                } else {
                    pool[rng.random_range(0..pool.len())]
                }
            })
            .collect();
        let mut want = vec![0i32; 8 * n];
        for l in 0..8 {
            let lane: Vec<f32> = (0..nb).map(|b| gates[b * 8 + l]).collect();
            let mut row = vec![7; n + 1];
            write_row(&lane, nb, n, &mut scratch, &mut row);
            assert_eq!(row[n], nb as i32);
            for s in 0..n {
                want[s * 8 + l] = row[s];
            }
        }
        for isa in crate::simd::isas_for_test() {
            let mut got = vec![-7i32; 8 * n];
            kernels::top(isa, &gates, n, &mut got);
            assert_eq!(got, want, "{isa:?} blocks {nb} slots {n}");
        }
    }
}

/// One sequence's rows the row-by-row way: block means at the portable
/// level, each row's gates by the `moba.gates` portable kernel, its top
/// blocks by [`write_row`].
fn rows_one_by_one(q: &[f32], k: &[f32], s: Shape, topk: usize, v: Variant, w: usize) -> Vec<i32> {
    let (hq, d, d8) = (s.heads.n_q_heads, s.heads.d, s.d8());
    let (n_k, n_q) = (k.len() / (s.heads.n_kv_heads * d), q.len() / (hq * d));
    let n_means = n_k.saturating_sub(1) / s.block_size;
    let row = s.heads.n_kv_heads * d;
    let means = block_means(s, n_means, |t0, t1, acc| {
        kernels::sums(Isa::Scalar, acc, Encoded::F32(&k[t0 * row..t1 * row]))
    });
    let mut out = vec![0i32; n_q * hq * w];
    let mut scratch = Vec::new();
    let mut qp = vec![0.0f32; d8];
    for i in 0..n_q {
        let c = (n_k - n_q + i) / s.block_size;
        let n_past = past_blocks_read(v, topk, c);
        for h in 0..hq {
            qp[..d].copy_from_slice(&q[(i * hq + h) * d..][..d]);
            let mut g = vec![0.0f32; c];
            if n_past < c {
                let m = &means[h / s.group() * n_means * d8..][..c * d8];
                kernels::gates(Isa::Scalar, &qp, &[0], m, d8, &mut g);
            }
            let dest = &mut out[(i * hq + h) * w..][..w];
            write_row(&g, c, n_past, &mut scratch, dest);
        }
    }
    out
}

#[test]
fn rows_eight_queries_at_a_time_equal_the_row_by_row_path_on_every_level() {
    let mut rng = ChaCha8Rng::seed_from_u64(51);
    let (mut cases, mut tiled) = (0, 0);
    for &(hq, h) in &[(1, 1), (4, 1), (16, 1), (8, 2), (6, 3), (2, 2)] {
        for &d in &[8usize, 13, 64] {
            for _ in 0..6 {
                let bs = [1, 3, 8, 8, 16, 21][rng.random_range(0..6)];
                let n_k = rng.random_range(1..300);
                // Tq = Tkv, Tq < Tkv, query counts off the tiles of eight.
                let n_q = match rng.random_range(0..3) {
                    0 => n_k,
                    1 => rng.random_range(1..=n_k),
                    _ => n_k.min(rng.random_range(1..20)),
                };
                let topk = [1, 2, 3, 3, 5, 9, 10, 40][rng.random_range(0..8)];
                let variant = if rng.random_range(0..4) == 0 {
                    Variant::Naive
                } else {
                    Variant::Efficient
                };
                let s = shape(hq, h, d, bs);
                // Small integers (exact sums, many tied gates), the odd
                // infinity or NaN.
                let val = |rng: &mut ChaCha8Rng| match rng.random_range(0..300) {
                    0 => f32::INFINITY,
                    1 => f32::NEG_INFINITY,
                    2 => f32::NAN,
                    3..=150 => rng.random_range(-2..3) as f32,
                    _ => rng.random_range(-1.0f32..1.0),
                };
                let q: Vec<f32> = (0..n_q * hq * d).map(|_| val(&mut rng)).collect();
                let k: Vec<f32> = (0..n_k * h * d).map(|_| val(&mut rng)).collect();
                let w = width(variant, topk, n_k.div_ceil(bs));
                let want = rows_one_by_one(&q, &k, s, topk, variant, w);
                let n_means = (n_k - 1) / bs;
                let row = h * d;
                for isa in crate::simd::isas_for_test() {
                    let means = block_means(s, n_means, |t0, t1, acc| {
                        kernels::sums(isa, acc, Encoded::F32(&k[t0 * row..t1 * row]))
                    });
                    let mut got = vec![-7i32; want.len()];
                    rows(isa, s, &q, n_k, &means, n_means, topk, variant, w, &mut got);
                    assert_eq!(
                        got, want,
                        "{isa:?} hq {hq} h {h} d {d} bs {bs} n_k {n_k} n_q {n_q} topk {topk} {variant:?}"
                    );
                }
                cases += 1;
                // Did a block hold eight queries the eight-at-a-time path
                // takes (1 to TOP_MAX past blocks kept, fewer than seen)?
                tiled += block_queries(variant, topk, n_k, n_q, bs).into_iter().any(
                    |(c, n_past, queries)| {
                        (1..=kernels::TOP_MAX).contains(&n_past) && n_past < c && queries >= 8
                    },
                ) as usize;
            }
        }
    }
    assert_eq!(cases, 108);
    assert!(tiled >= 25, "{tiled} cases took the eight-at-a-time path");
}

/// `0` and the running sums of `lens`: a packed batch's boundaries.
fn cumulative(lens: &[usize]) -> Vec<usize> {
    std::iter::once(0)
        .chain(lens.iter().scan(0, |a, &l| {
            *a += l;
            Some(*a)
        }))
        .collect()
}

/// Each block `c` of a sequence of `n_k` keys whose last `n_q` positions are
/// its queries: `(c, past blocks its queries read, queries in it)`.
fn block_queries(
    variant: Variant,
    topk: usize,
    n_k: usize,
    n_q: usize,
    bs: usize,
) -> Vec<(usize, usize, usize)> {
    let first = n_k - n_q;
    (0..n_k.div_ceil(bs))
        .map(|c| {
            let queries = (c * bs..((c + 1) * bs).min(n_k))
                .filter(|&p| p >= first)
                .count();
            (c, past_blocks_read(variant, topk, c), queries)
        })
        .collect()
}

/// The contract the Python binding's uninitialised output rests on:
/// `select_into` writes every slot of `out` (a block id of the row's own
/// sequence, or -1), whatever the batch (sequences without queries,
/// `Tq < Tkv`, `cu_seqlens_q` omitted, one query, blocks of one token, every
/// variant, `d` off the multiples of 8), on every path a block's queries
/// take: eight at a time, the row-by-row chunks (more slots than the
/// eight-at-a-time top-k keeps), and the selection past `write_row`'s few
/// slots.
#[test]
fn select_into_writes_every_slot_of_the_output() {
    let mut rng = ChaCha8Rng::seed_from_u64(61);
    // Cases reaching: the eight-at-a-time path, whole blocks through the
    // chunks with more than `TOP_MAX` slots, `write_row` past `SMALL`.
    let (mut tiled, mut chunked, mut selected, mut omitted) = (0, 0, 0, 0);
    for case in 0..300 {
        let (hq, h) = [(1, 1), (4, 2), (8, 2), (6, 3), (16, 1)][case % 5];
        let d = [1usize, 8, 13, 64][rng.random_range(0..4)];
        let bs = [1usize, 2, 5, 8, 16][rng.random_range(0..5)];
        let topk = [1usize, 2, 3, 5, 9, 12, 17][rng.random_range(0..7)];
        let variant = if case % 3 == 0 {
            Variant::Naive
        } else {
            Variant::Efficient
        };
        let n_seq = rng.random_range(1..5);
        let lens: Vec<usize> = (0..n_seq).map(|_| rng.random_range(1..120)).collect();
        // Every fourth batch a query per key, `cu_seqlens_q` omitted.
        let omit = case % 4 == 1;
        let q_lens: Vec<usize> = lens
            .iter()
            .map(|&l| match rng.random_range(0..4) {
                _ if omit => l,
                0 => 0,
                1 => l,
                _ => rng.random_range(1..=l),
            })
            .collect();
        let (cu_k, cu_q) = (cumulative(&lens), cumulative(&q_lens));
        let (n_k, n_q) = (cu_k[n_seq], cu_q[n_seq]);
        let k: Vec<f32> = (0..n_k * h * d)
            .map(|_| rng.random_range(-2..3) as f32)
            .collect();
        let q: Vec<f32> = (0..n_q * hq * d)
            .map(|_| rng.random_range(-1.0..1.0))
            .collect();
        let max_blocks = lens.iter().map(|l| l.div_ceil(bs)).max().unwrap();
        let w = width(variant, topk, max_blocks);
        let mut out = vec![i32::MIN; n_q * hq * w];
        select_into(
            Encoded::F32(&q),
            Encoded::F32(&k),
            None,
            &cu_k,
            if omit { None } else { Some(&cu_q) },
            shape(hq, h, d, bs),
            topk,
            variant,
            &mut out,
        )
        .unwrap();
        omitted += omit as usize;
        for s in 0..n_seq {
            let rows = &out[cu_q[s] * hq * w..cu_q[s + 1] * hq * w];
            let blocks = lens[s].div_ceil(bs) as i32;
            assert!(
                rows.iter().all(|&x| (-1..blocks).contains(&x)),
                "case {case}: sequence {s} of {lens:?} ({q_lens:?} queries) holds a slot not written"
            );
            // The paths this sequence's blocks took.
            for (c, n_past, queries) in block_queries(variant, topk, lens[s], q_lens[s], bs) {
                if queries == 0 || n_past >= c {
                    continue;
                }
                tiled += ((1..=kernels::TOP_MAX).contains(&n_past) && queries >= 8) as usize;
                chunked += (n_past > kernels::TOP_MAX && queries == bs) as usize;
                selected += (n_past > SMALL) as usize;
            }
        }
    }
    assert!(
        tiled >= 50 && chunked >= 20 && selected >= 20 && omitted == 75,
        "paths reached: {tiled} eight at a time, {chunked} chunked, {selected} past SMALL, \
         {omitted} without cu_seqlens_q"
    );
}
