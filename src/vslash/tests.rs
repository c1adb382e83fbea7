use super::*;
use crate::simd::isas_for_test;

fn rng(seed: u64) -> impl FnMut() -> f32 {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

struct Case {
    q: Vec<f32>,
    k: Vec<f32>,
    shape: Shape,
}

fn case(
    seed: u64,
    n_heads: usize,
    n_kv_heads: usize,
    d: usize,
    seq_len: usize,
    spread: f32,
) -> Case {
    let mut r = rng(seed);
    let n = last_queries(seq_len);
    Case {
        q: (0..n_heads * n * d).map(|_| r() * spread).collect(),
        k: (0..seq_len * n_kv_heads * d)
            .map(|_| r() * spread)
            .collect(),
        shape: Shape {
            n_heads,
            n_kv_heads,
            d,
            seq_len,
        },
    }
}

/// The estimate in f64, plainly (rows, softmax, sums): the reference the
/// f32 pipeline is held to within a loose relative tolerance here (the
/// Python twin holds it to the stated bound).
fn naive(c: &Case, variant: Variant, h: usize) -> (Vec<f64>, Vec<f64>) {
    let Shape {
        n_heads,
        n_kv_heads,
        d,
        seq_len: l,
    } = c.shape;
    let n = last_queries(l);
    let g = h / (n_heads / n_kv_heads);
    let scale = match variant {
        Variant::Kernel => 1.0 / (d as f64).sqrt(),
        Variant::Search => 1.0,
    };
    let (mut v, mut s) = (vec![0.0; l], vec![0.0; l]);
    for i in 0..n {
        let p = l - n + i;
        let row: Vec<f64> = (0..=p)
            .map(|col| {
                (0..d)
                    .map(|k| {
                        c.q[(h * n + i) * d + k] as f64 * c.k[(col * n_kv_heads + g) * d + k] as f64
                    })
                    .sum::<f64>()
                    * scale
            })
            .collect();
        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = row.iter().map(|x| (x - m).exp()).sum();
        for (col, x) in row.iter().enumerate() {
            let pr = (x - m).exp() / z;
            v[col] += pr;
            s[p - col] += pr;
        }
    }
    (v, s)
}

#[test]
fn scores_match_a_plain_f64_estimate() {
    for (seed, &(hn, kvn, d, l)) in [
        (2, 1, 16, 1),
        (2, 1, 16, 2),
        (4, 2, 8, 37),
        (2, 2, 24, 64),
        (2, 1, 32, 65),
        (1, 1, 40, 300),
    ]
    .iter()
    .enumerate()
    {
        let c = case(seed as u64, hn, kvn, d, l, 1.5);
        for variant in [Variant::Kernel, Variant::Search] {
            let (mut v, mut s) = (vec![0.0f32; hn * l], vec![0.0f32; hn * l]);
            scores_into(
                &c.q,
                Encoded::F32(&c.k),
                None,
                c.shape,
                variant,
                &mut v,
                &mut s,
            )
            .unwrap();
            for h in 0..hn {
                let (nv, ns) = naive(&c, variant, h);
                for x in 0..l {
                    for (got, want) in [(v[h * l + x], nv[x]), (s[h * l + x], ns[x])] {
                        assert!(
                            (got as f64 - want).abs() <= 1e-5 * want.max(1e-30) + 1e-30,
                            "{l} {h} {x}: {got} vs {want}"
                        );
                    }
                }
                // Every query's probabilities add to 1: n in all.
                let total: f64 = nv.iter().sum();
                assert!((total - last_queries(l) as f64).abs() < 1e-9);
            }
        }
    }
}

#[test]
fn every_level_gives_the_same_bits() {
    for (seed, &(hn, kvn, d, l)) in [
        (2, 1, 16, 3),
        (4, 2, 8, 70),
        (2, 2, 13, 129),
        (1, 1, 128, 257),
    ]
    .iter()
    .enumerate()
    {
        let c = case(10 + seed as u64, hn, kvn, d, l, 3.0);
        let scales: Vec<f32> = (0..l).map(|i| 0.5 + (i % 7) as f32 * 0.25).collect();
        let fp8: Vec<u8> = (0..c.k.len())
            .map(|i| (i * 37 % 126) as u8 | ((i % 2) as u8) << 7)
            .collect();
        let bf16: Vec<u16> = c.k.iter().map(|x| (x.to_bits() >> 16) as u16).collect();
        let keysets = [
            (Encoded::F32(&c.k), None),
            (Encoded::Bf16(&bf16), None),
            (Encoded::Fp8E4m3(&fp8), Some(&scales[..])),
        ];
        for (keys, ks) in keysets {
            let (nv, ns) = sizes(l, 40, 60);
            type Got = (Vec<f32>, Vec<f32>, Vec<i32>, Vec<i32>);
            let mut want: Option<Got> = None;
            for isa in isas_for_test() {
                let (mut v, mut s) = (vec![0.0f32; hn * l], vec![0.0f32; hn * l]);
                scores_at(
                    isa,
                    &c.q,
                    keys,
                    ks,
                    c.shape,
                    Variant::Kernel,
                    &mut v,
                    &mut s,
                )
                .unwrap();
                let (mut vo, mut so) = (vec![0; hn * nv], vec![0; hn * ns]);
                select_at(
                    isa,
                    &c.q,
                    keys,
                    ks,
                    c.shape,
                    Variant::Kernel,
                    40,
                    60,
                    &mut vo,
                    &mut so,
                )
                .unwrap();
                let got = (v, s, vo, so);
                match &want {
                    None => want = Some(got),
                    Some(w) => {
                        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(&w.0), bits(&got.0), "{}", isa.level().name());
                        assert_eq!(bits(&w.1), bits(&got.1));
                        assert_eq!((&w.2, &w.3), (&got.2, &got.3));
                    }
                }
            }
        }
    }
}

/// The selection is the top of the scores in the one total order, the
/// forced parts first; rows ascending.
#[test]
fn selection_is_the_top_of_the_scores() {
    for (seed, &(l, v, s)) in [
        (5, 1, 1),
        (40, 10, 10),
        (64, 35, 55),
        (200, 31, 70),
        (300, 100, 120),
    ]
    .iter()
    .enumerate()
    {
        let c = case(30 + seed as u64, 2, 1, 16, l, 2.0);
        for variant in [Variant::Kernel, Variant::Search] {
            let (nv, ns) = sizes(l, v, s);
            let (mut vo, mut so) = (vec![0; 2 * nv], vec![0; 2 * ns]);
            select_into(
                &c.q,
                Encoded::F32(&c.k),
                None,
                c.shape,
                variant,
                v,
                s,
                &mut vo,
                &mut so,
            )
            .unwrap();
            let (mut vs, mut ss) = (vec![0.0f32; 2 * l], vec![0.0f32; 2 * l]);
            scores_into(
                &c.q,
                Encoded::F32(&c.k),
                None,
                c.shape,
                variant,
                &mut vs,
                &mut ss,
            )
            .unwrap();
            for h in 0..2 {
                let rank = |scores: &[f32], forced: usize, k: usize| {
                    let mut ids: Vec<usize> = (0..l).collect();
                    let key = |i: usize| if i < forced { f32::INFINITY } else { scores[i] };
                    ids.sort_by(|&a, &b| key(b).total_cmp(&key(a)).then(a.cmp(&b)));
                    let mut top: Vec<i32> = ids[..k].iter().map(|&i| i as i32).collect();
                    top.sort();
                    top
                };
                assert_eq!(
                    vo[h * nv..(h + 1) * nv],
                    rank(&vs[h * l..(h + 1) * l], FORCED_COLUMNS, nv)[..]
                );
                assert_eq!(
                    so[h * ns..(h + 1) * ns],
                    rank(&ss[h * l..(h + 1) * l], variant.forced_slashes(), ns)[..]
                );
            }
        }
    }
}

/// `s < 100`: the forced diagonals that survive are the nearest.
#[test]
fn forced_diagonals_past_the_budget_keep_the_nearest() {
    let c = case(7, 1, 1, 8, 500, 4.0);
    let (mut vo, mut so) = (vec![0; 30], vec![0; 50]);
    select_into(
        &c.q,
        Encoded::F32(&c.k),
        None,
        c.shape,
        Variant::Kernel,
        0,
        50,
        &mut vo,
        &mut so,
    )
    .unwrap();
    assert_eq!(so, (0..50).collect::<Vec<i32>>());
    assert_eq!(vo, (0..30).collect::<Vec<i32>>());
}

#[test]
fn refusals_name_the_argument_and_write_nothing() {
    let c = case(3, 2, 1, 8, 70, 1.0);
    let (nv, ns) = sizes(70, 30, 50);
    let run = |q: &[f32], k: &[f32], ks: Option<&[f32]>, shape: Shape, vl: usize, sl: usize| {
        let (mut vo, mut so) = (vec![-7; vl], vec![-7; sl]);
        let e = select_into(
            q,
            Encoded::F32(k),
            ks,
            shape,
            Variant::Kernel,
            30,
            50,
            &mut vo,
            &mut so,
        )
        .unwrap_err();
        assert!(vo.iter().chain(&so).all(|&x| x == -7));
        e.argument()
    };
    let sh = c.shape;
    assert_eq!(run(&c.q[1..], &c.k, None, sh, 2 * nv, 2 * ns), "q");
    assert_eq!(run(&c.q, &c.k[1..], None, sh, 2 * nv, 2 * ns), "keys");
    assert_eq!(
        run(&c.q, &c.k, Some(&[1.0; 3]), sh, 2 * nv, 2 * ns),
        "key_scale"
    );
    assert_eq!(
        run(&c.q, &c.k, None, sh, 2 * nv + 1, 2 * ns),
        "vertical_out"
    );
    assert_eq!(run(&c.q, &c.k, None, sh, 2 * nv, 0), "slash_out");
    assert_eq!(
        run(
            &c.q,
            &c.k,
            None,
            Shape {
                n_kv_heads: 3,
                ..sh
            },
            2 * nv,
            2 * ns
        ),
        "n_kv_heads"
    );
    assert_eq!(
        run(&c.q, &c.k, None, Shape { d: 0, ..sh }, 2 * nv, 2 * ns),
        "d"
    );
    let mut q = c.q.clone();
    q[5] = f32::NAN;
    assert_eq!(run(&q, &c.k, None, sh, 2 * nv, 2 * ns), "q");
    // A NaN key in the second head's KV head... there is one KV head: the
    // last key, which only the last query reads.
    let mut k = c.k.clone();
    let last = k.len() - 1;
    k[last] = f32::INFINITY;
    assert_eq!(run(&c.q, &k, None, sh, 2 * nv, 2 * ns), "keys");
    let big = vec![1e30f32; c.k.len()];
    assert_eq!(
        run(&vec![1e30; c.q.len()], &big, None, sh, 2 * nv, 2 * ns),
        "keys"
    );
}

#[test]
fn rows_are_the_columns_and_diagonals_up_to_the_query() {
    let mut out = vec![0; 2 * 3 * 5];
    rows_into(
        &[0, 4, 1, 2],
        &[0, 3, 6, 0, 1, 9],
        2,
        10,
        &[0, 3, 9],
        &mut out,
    )
    .unwrap();
    assert_eq!(
        out,
        vec![
            0, -1, -1, -1, -1, // head 0, p = 0: column 0, diagonal 0 (the same key)
            0, 3, -1, -1, -1, // p = 3: column 0, keys 3 (o = 0), 0 (o = 3)
            0, 3, 4, 6, 9, // p = 9: columns 0, 4; keys 9, 6, 3
            0, -1, -1, -1, -1, // head 1, p = 0: o = 0
            1, 2, 3, -1, -1, // p = 3: columns 1, 2; keys 3, 2
            0, 1, 2, 8, 9, // p = 9: columns 1, 2; keys 9, 8, 0
        ]
    );
    let e = rows_into(&[0, 10], &[0], 1, 10, &[0], &mut [0; 3]).unwrap_err();
    assert_eq!(e.argument(), "vertical");
    let e = rows_into(&[0], &[0], 1, 10, &[10], &mut [0; 2]).unwrap_err();
    assert_eq!(e.argument(), "positions");
    let e = rows_into(&[0], &[0], 1, 10, &[1], &mut [0; 3]).unwrap_err();
    assert_eq!(e.argument(), "out");
}

/// The layout of a hand-worked selection (L = 256, columns 3, 40, 150,
/// offsets 0, 1, 130), block by block as the source's loop runs.
#[test]
fn layout_of_a_worked_example() {
    let (mut bc, mut bo, mut cc, mut ci) = (vec![9; 4], vec![9; 12], vec![9; 4], vec![9; 12]);
    layout_into(
        &[150, 3, 40],
        &[1, 130, 0],
        1,
        256,
        &mut bc,
        &mut bo,
        &mut cc,
        &mut ci,
    )
    .unwrap();
    assert_eq!(bc, [1, 2, 3, 3]);
    assert_eq!(bo, [0, 0, 0, 63, 127, 0, 0, 127, 191, 62, 191, 255]);
    assert_eq!(cc, [0, 2, 0, 3]);
    assert_eq!(ci, [0, 0, 0, 3, 40, 0, 0, 0, 0, 3, 40, 150]);
    // No offset below 64: the source would read past its list.
    let e = layout_into(
        &[0],
        &[64],
        1,
        256,
        &mut bc,
        &mut bo[..4],
        &mut cc,
        &mut ci[..4],
    )
    .unwrap_err();
    assert_eq!(e.argument(), "slash");
}

/// With the main diagonal selected, the layout covers every row's
/// selection (the kernel reads its blocks and columns up to the query).
#[test]
fn layout_covers_the_rows() {
    let mut r = rng(99);
    for trial in 0..200 {
        let l = 1 + (trial * 37) % 400;
        let nv = 1 + trial % 7;
        let ns = 1 + trial % 5;
        let mut pick = |k: usize| -> Vec<i32> {
            (0..k)
                .map(|_| ((r() + 1.0) * 0.5 * l as f32) as i32 % l as i32)
                .collect()
        };
        let v = pick(nv);
        let mut s = pick(ns);
        s[0] = 0;
        let nb = l.div_ceil(64);
        let (mut bc, mut bo, mut cc, mut ci) =
            (vec![0; nb], vec![0; nb * ns], vec![0; nb], vec![0; nb * nv]);
        layout_into(&v, &s, 1, l, &mut bc, &mut bo, &mut cc, &mut ci).unwrap();
        let positions: Vec<i64> = (0..l as i64).collect();
        let mut rows = vec![0; l * (nv + ns)];
        rows_into(&v, &s, 1, l, &positions, &mut rows).unwrap();
        for p in 0..l {
            let m = p / 64;
            let reads = |key: i32| {
                (0..bc[m] as usize).any(|j| (bo[m * ns + j]..bo[m * ns + j] + 64).contains(&key))
                    || ci[m * nv..m * nv + cc[m] as usize].contains(&key)
            };
            for &key in rows[p * (nv + ns)..(p + 1) * (nv + ns)]
                .iter()
                .filter(|&&x| x >= 0)
            {
                assert!(reads(key), "L={l} v={v:?} s={s:?} p={p} key={key}");
            }
        }
    }
}

/// The later form (vLLM / SGLang) on a hand-worked case: one sequence of
/// 100 queries over 300 keys (so the queries sit at keys 200..299),
/// columns 5, 150, 290, offsets 0, 10, 120, 200 rows of context (4 query
/// blocks, the last two past the queries and left 0), causal and not.
#[test]
fn batch_layout_of_a_worked_example() {
    let run = |causal: bool| {
        let batch = LayoutBatch {
            n_seqs: 1,
            n_heads: 1,
            nv: 3,
            ns: 3,
            context_size: 200,
            causal,
        };
        let (mut bc, mut bo, mut cc, mut ci) = (vec![9; 4], vec![9; 12], vec![9; 4], vec![9; 12]);
        layout_batch_into(
            &[290, 5, 150],
            &[10, 0, 120],
            &[100],
            &[300],
            batch,
            &mut bc,
            &mut bo,
            &mut cc,
            &mut ci,
        )
        .unwrap();
        (bc, bo, cc, ci)
    };
    // Causal, block 0 (queries at keys 200..263): offset 120 gives keys
    // [80, 144), 10 starts [190, 254), 0 extends it to [190, 318), clipped
    // to the 300 keys; columns 5 and 150 lie below the ranges, 290 inside.
    let (bc, bo, cc, ci) = run(true);
    assert_eq!(bc, [3, 2, 0, 0]);
    assert_eq!(bo, [80, 190, 254, 144, 254, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(cc, [2, 1, 0, 0]);
    assert_eq!(ci, [5, 150, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0]);
    // Not causal (queries as if at keys 300 + i): block 1 stops at the
    // offsets below its first query (10, 0) and keeps the columns.
    let (bc, bo, cc, ci) = run(false);
    assert_eq!(bc, [2, 1, 0, 0]);
    assert_eq!(bo, [180, 290, 0, 244, 0, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(cc, [2, 2, 0, 0]);
    assert_eq!(ci, [5, 150, 0, 5, 150, 0, 0, 0, 0, 0, 0, 0]);
}

/// Each refusal names its argument and writes nothing.
#[test]
fn batch_layout_refusals() {
    let batch = LayoutBatch {
        n_seqs: 1,
        n_heads: 1,
        nv: 1,
        ns: 1,
        context_size: 64,
        causal: true,
    };
    let run = |v: &[i32], s: &[i32], q: &[i64], kv: &[i64], batch: LayoutBatch| {
        let (mut bc, mut bo, mut cc, mut ci) = (vec![9; 1], vec![9; 1], vec![9; 1], vec![9; 1]);
        let e =
            layout_batch_into(v, s, q, kv, batch, &mut bc, &mut bo, &mut cc, &mut ci).unwrap_err();
        assert_eq!((bc, bo, cc, ci), (vec![9], vec![9], vec![9], vec![9]));
        e.argument()
    };
    let b = batch;
    assert_eq!(
        run(&[], &[0], &[10], &[10], LayoutBatch { nv: 0, ..b }),
        "vertical"
    );
    assert_eq!(
        run(&[0], &[], &[10], &[10], LayoutBatch { ns: 0, ..b }),
        "slash"
    );
    assert_eq!(run(&[0, 1], &[0], &[10], &[10], b), "vertical");
    assert_eq!(run(&[0], &[0], &[10, 1], &[10], b), "q_seqlens");
    assert_eq!(run(&[0], &[0], &[-1], &[10], b), "q_seqlens");
    assert_eq!(run(&[0], &[0], &[10], &[0], b), "kv_seqlens");
    assert_eq!(run(&[0], &[0], &[65], &[80], b), "context_size");
    assert_eq!(run(&[10], &[0], &[10], &[10], b), "vertical");
    assert_eq!(run(&[-1], &[0], &[10], &[10], b), "vertical");
    assert_eq!(run(&[0], &[-1], &[10], &[10], b), "slash");
    let two_rows = LayoutBatch {
        context_size: 65,
        ..b
    };
    assert_eq!(run(&[0], &[0], &[10], &[10], two_rows), "block_count");
}
