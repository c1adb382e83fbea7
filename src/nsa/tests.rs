//! The rule's examples pinned, the forcing, the order, every level's bits
//! and the refusals.

use super::api::{block_scores_at, select_at};
use super::*;
use crate::keys::Encoded;
use crate::simd::isas_for_test;

fn cfg(bs: usize, k: usize) -> Config {
    Config {
        block_size: bs,
        block_counts: k,
        init_blocks: 1,
        local_blocks: 2,
        scale: 1.0,
    }
}

/// A tiny LCG: the tests' inputs, fixed by the seed.
fn rand(seed: &mut u64, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
        })
        .collect()
}

/// fla forces block 0 and the query's own two; with blocks of 4 tokens, a
/// query at position 21 (IC = 5, NC = 5) scores blocks 1..=3 and forces 0, 4, 5.
#[test]
fn forced_blocks_and_candidates() {
    let c = cfg(4, 16);
    let forced: Vec<usize> = (0..8).filter(|&b| c.forced(b, 5)).collect();
    assert_eq!(forced, vec![0, 4, 5]);
    let forced0: Vec<usize> = (0..8).filter(|&b| c.forced(b, 0)).collect();
    assert_eq!(forced0, vec![0]);
    let sums = [0.1f32, 0.5, 0.2, 0.3, 0.9];
    let mut out = [0.0f32; 7];
    block_scores(&c, Window::Fla, &sums, 21, &mut out);
    let inf = f32::INFINITY;
    assert_eq!(out, [inf, 0.5, 0.2, 0.3, inf, inf, -inf]);
    let mut ids = Vec::new();
    let mut r = [0i32; 4];
    row(&out, &mut ids, &mut r);
    assert_eq!(r, [0, 1, 4, 5]);
    // block_counts < 3: the forced blocks tie; the lower ids win.
    let mut r2 = [0i32; 2];
    row(&out, &mut ids, &mut r2);
    assert_eq!(r2, [0, 4]);
    // More slots than candidates: -1 padded.
    let mut r8 = [0i32; 8];
    row(&out, &mut ids, &mut r8);
    assert_eq!(r8, [0, 1, 2, 3, 4, 5, -1, -1]);
    // Probabilities that underflowed to 0 still fill the row, lower id first.
    let zeros = [0.0f32, 0.0, 0.0, 0.0, 0.0];
    block_scores(&c, Window::Fla, &zeros, 21, &mut out);
    let mut r5 = [0i32; 5];
    row(&out, &mut ids, &mut r5);
    assert_eq!(r5, [0, 1, 2, 4, 5]);
}

/// The compressed keys are the complete blocks' means; the trailing partial
/// block is not compressed.
#[test]
fn compressed_keys_are_complete_block_means() {
    let k: Vec<f32> = (0..10).map(|t| t as f32).collect(); // [10 tokens, 1 head, d = 1]
    let mut out = vec![0.0f32; 2];
    compress_into(Encoded::F32(&k), None, 1, 1, 4, &mut out).unwrap();
    assert_eq!(out, vec![1.5, 5.5]);
    let scales: Vec<f32> = (0..10).map(|t| if t < 4 { 2.0 } else { 1.0 }).collect();
    compress_into(Encoded::F32(&k), Some(&scales), 1, 1, 4, &mut out).unwrap();
    assert_eq!(out, vec![3.0, 5.5]);
    let mut wrong = vec![7.0f32; 3];
    let e = compress_into(Encoded::F32(&k), None, 1, 1, 4, &mut wrong).unwrap_err();
    assert!(format!("{e:?}").contains("out"));
    assert_eq!(wrong, vec![7.0; 3]);
}

/// Stage 1 by hand: two heads of one group, block size 2, query at position
/// 7 (IC = 3, NC = 4): block 1 and 2 compete; each head's softmax over the
/// four complete blocks, then summed.
#[test]
fn stage_one_by_hand() {
    // keys [8 tokens, 1 head, d = 1]: block means 0, 1, 2, 0.
    let k = [0.0f32, 0.0, 1.0, 1.0, 2.0, 2.0, 0.0, 0.0];
    let q = [1.0f32, -1.0]; // [1 query, 2 heads, d = 1]
    let c = Config {
        block_size: 2,
        block_counts: 3,
        init_blocks: 1,
        local_blocks: 1,
        scale: 1.0,
    };
    let mut out = vec![0.0f32; 4];
    block_scores_at(
        crate::simd::Isa::Scalar,
        Encoded::F32(&q),
        Encoded::F32(&k),
        None,
        Heads {
            n_q_heads: 2,
            n_kv_heads: 1,
            d: 1,
        },
        &c,
        &mut out,
    )
    .unwrap();
    let s = |x: &[f64]| -> Vec<f64> {
        let z: f64 = x.iter().map(|v| v.exp()).sum();
        x.iter().map(|v| v.exp() / z).collect()
    };
    let (a, b) = (s(&[0.0, 1.0, 2.0, 0.0]), s(&[0.0, -1.0, -2.0, 0.0]));
    for blk in 1..3 {
        assert!(
            (out[blk] as f64 - (a[blk] + b[blk])).abs() < 1e-6,
            "{out:?}"
        );
    }
    assert_eq!((out[0], out[3]), (f32::INFINITY, f32::INFINITY));
    let mut r = vec![0i32; 3];
    select_at(
        crate::simd::Isa::Scalar,
        Encoded::F32(&q),
        Encoded::F32(&k),
        None,
        Heads {
            n_q_heads: 2,
            n_kv_heads: 1,
            d: 1,
        },
        &c,
        &mut r,
    )
    .unwrap();
    assert_eq!(r, vec![0, 2, 3]);
}

/// Every SIMD level gives the same bits; GQA groups of 1 and 16; Tq < Tkv.
#[test]
fn same_bits_at_every_level() {
    let mut seed = 7u64;
    for &(hq, n_kv, d, seq, n_q, bs) in &[
        (16usize, 1usize, 24usize, 300usize, 5usize, 16usize),
        (2, 2, 8, 97, 97, 8),
        (32, 2, 64, 520, 3, 64),
    ] {
        let q = rand(&mut seed, n_q * hq * d);
        let k = rand(&mut seed, seq * n_kv * d);
        let c = Config {
            scale: 0.3,
            ..cfg(bs, 5)
        };
        let nb = c.n_blocks(seq);
        let mut want: Option<(Vec<f32>, Vec<i32>)> = None;
        for isa in isas_for_test() {
            let mut s = vec![0.0f32; n_q * n_kv * nb];
            block_scores_at(
                isa,
                Encoded::F32(&q),
                Encoded::F32(&k),
                None,
                Heads {
                    n_q_heads: hq,
                    n_kv_heads: n_kv,
                    d,
                },
                &c,
                &mut s,
            )
            .unwrap();
            let mut r = vec![0i32; n_q * n_kv * 5];
            select_at(
                isa,
                Encoded::F32(&q),
                Encoded::F32(&k),
                None,
                Heads {
                    n_q_heads: hq,
                    n_kv_heads: n_kv,
                    d,
                },
                &c,
                &mut r,
            )
            .unwrap();
            let bits = (s, r);
            match &want {
                None => want = Some(bits),
                Some(w) => {
                    assert_eq!(
                        w.0.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                        bits.0.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                        "{isa:?}"
                    );
                    assert_eq!(w.1, bits.1, "{isa:?}");
                }
            }
        }
    }
}

/// Queries that share a chunk of heads (heads in the lanes, a group a
/// multiple of 8: two queries at a group of 16, four at 8) give each the row
/// and the block scores it gets alone, at every level: groups of 1, 8, 16
/// and 24 (and 33), query counts that leave a partial unit, blocks of 8 so
/// that queries of one unit see different key counts, key counts off the
/// tiles, prefill shapes (`Tq = Tkv`).
#[test]
fn fused_queries_equal_each_query_alone_at_every_level() {
    let mut seed = 17u64;
    for &(hq, n_kv, d, seq, n_q) in &[
        (16usize, 1usize, 24usize, 203usize, 7usize),
        (32, 2, 16, 131, 5),
        (16, 2, 8, 99, 70),
        (8, 1, 40, 77, 3),
        (8, 2, 24, 150, 9),
        (24, 1, 8, 150, 6),
        (2, 2, 8, 60, 5),
        (16, 1, 128, 1037, 4),
        // Prefill (`Tq = Tkv`): every query of the sequence, `d` a
        // multiple of 8 (whole 8×8 query transposes) and not.
        (32, 2, 128, 180, 180),
        (33, 1, 20, 90, 90),
        (8, 1, 16, 64, 64),
        // Many queries (from `panels::MIN_QUERIES`: the keys in panels)
        // at groups of 1 and 3, `d` off 8, `Tq ≠ Tkv`.
        (4, 4, 12, 150, 100),
        (3, 1, 9, 140, 70),
        (16, 1, 128, 520, 65),
        // Many queries on more keys than panels take (`panels::MAX_KEYS`):
        // the heads in the lanes.
        (16, 1, 8, 4200, 64),
    ] {
        let q = rand(&mut seed, n_q * hq * d);
        let k = rand(&mut seed, seq * n_kv * d);
        let c = Config {
            scale: 0.3,
            ..cfg(8, 4)
        };
        let nb = c.n_blocks(seq);
        for isa in isas_for_test() {
            let mut s = vec![0.0f32; n_q * n_kv * nb];
            let (qe, ke) = (Encoded::F32(&q), Encoded::F32(&k));
            block_scores_at(
                isa,
                qe,
                ke,
                None,
                Heads {
                    n_q_heads: hq,
                    n_kv_heads: n_kv,
                    d,
                },
                &c,
                &mut s,
            )
            .unwrap();
            let mut r = vec![0i32; n_q * n_kv * 4];
            select_at(
                isa,
                qe,
                ke,
                None,
                Heads {
                    n_q_heads: hq,
                    n_kv_heads: n_kv,
                    d,
                },
                &c,
                &mut r,
            )
            .unwrap();
            for i in 0..n_q {
                let p = seq - n_q + i;
                let qi = &q[i * hq * d..(i + 1) * hq * d];
                let ki = &k[..(p + 1) * n_kv * d];
                let nbi = c.n_blocks(p + 1);
                let mut si = vec![0.0f32; n_kv * nbi];
                let (qe, ke) = (Encoded::F32(qi), Encoded::F32(ki));
                block_scores_at(
                    isa,
                    qe,
                    ke,
                    None,
                    Heads {
                        n_q_heads: hq,
                        n_kv_heads: n_kv,
                        d,
                    },
                    &c,
                    &mut si,
                )
                .unwrap();
                let mut ri = vec![0i32; n_kv * 4];
                select_at(
                    isa,
                    qe,
                    ke,
                    None,
                    Heads {
                        n_q_heads: hq,
                        n_kv_heads: n_kv,
                        d,
                    },
                    &c,
                    &mut ri,
                )
                .unwrap();
                for g in 0..n_kv {
                    let row = &s[(i * n_kv + g) * nb..(i * n_kv + g + 1) * nb];
                    let alone = &si[g * nbi..(g + 1) * nbi];
                    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&row[..nbi]),
                        bits(alone),
                        "{isa:?} hq={hq} i={i} g={g}"
                    );
                    assert!(row[nbi..].iter().all(|&x| x == f32::NEG_INFINITY));
                    let got = &r[(i * n_kv + g) * 4..(i * n_kv + g + 1) * 4];
                    assert_eq!(got, &ri[g * 4..(g + 1) * 4], "{isa:?} hq={hq} i={i} g={g}");
                }
            }
        }
    }
}

/// fla's block scores (three passes) are the rule's block by block: forced
/// `+inf`, the group sum before the query's block, `−inf` after, for any
/// forced counts (none, more than the blocks) and rows wider than the
/// query's blocks.
#[test]
fn fla_block_scores_are_the_rule_block_by_block() {
    let mut seed = 3u64;
    for case in 0..300usize {
        let c = Config {
            init_blocks: case % 4,
            local_blocks: (case / 4) % 5,
            ..cfg(4, 16)
        };
        let p = case % 97;
        let nb = c.n_blocks(p + 1) + case % 3;
        let sums = rand(&mut seed, (p + 1) / 4);
        let mut out = vec![7.0f32; nb];
        block_scores(&c, Window::Fla, &sums, p, &mut out);
        let ic = p / 4;
        for (b, &o) in out.iter().enumerate() {
            let want = if c.forced(b, ic) {
                f32::INFINITY
            } else if b < ic {
                sums[b]
            } else {
                f32::NEG_INFINITY
            };
            assert_eq!(o.to_bits(), want.to_bits(), "case {case} b {b}");
        }
    }
}

/// Bfloat16 compressed keys, read in place by the heads-in-lanes kernels at
/// any group (1, 4, 8, 16, 24), give the bits of their float32 values
/// (decoded first; at groups under 8 the packed kernels), at every level,
/// key counts off the tiles, both windows.
#[test]
fn bf16_compressed_keys_read_in_place_equal_their_float32_values() {
    use super::api::{block_scores_compressed_at, select_compressed_at};
    let eq9 = Window::Eq9 {
        kernel_size: 8,
        kernel_stride: 4,
    };
    let mut seed = 29u64;
    for &(hq, n_kv, d, seq, n_q, window) in &[
        (1usize, 1usize, 8usize, 203usize, 3usize, Window::Fla),
        (8, 2, 16, 181, 5, Window::Fla),
        (16, 1, 24, 333, 4, Window::Fla),
        (32, 2, 16, 150, 7, Window::Fla),
        (24, 1, 8, 99, 2, Window::Fla),
        (16, 2, 16, 170, 4, eq9),
        // Many queries: the keys in panels (`panels::MIN_QUERIES`).
        (16, 2, 16, 170, 70, eq9),
        (16, 1, 24, 200, 66, Window::Fla),
        (2, 2, 8, 90, 64, Window::Fla),
    ] {
        let q = rand(&mut seed, n_q * hq * d);
        let c = Config {
            scale: 0.3,
            ..cfg(8, 4)
        };
        let n_c = window.geometry(8).compressed_len(seq);
        let bits: Vec<u16> = rand(&mut seed, n_c * n_kv * d)
            .iter()
            .map(|x| (x.to_bits() >> 16) as u16)
            .collect();
        let ck: Vec<f32> = bits.iter().map(|&b| crate::keys::bf16_to_f32(b)).collect();
        let nb = c.n_blocks(seq);
        for isa in isas_for_test() {
            let (qe, cf, cb) = (Encoded::F32(&q), Encoded::F32(&ck), Encoded::Bf16(&bits));
            let run_s = |k: Encoded<'_>| {
                let mut o = vec![0.0f32; n_q * n_kv * nb];
                block_scores_compressed_at(
                    isa,
                    qe,
                    k,
                    None,
                    Heads {
                        n_q_heads: hq,
                        n_kv_heads: n_kv,
                        d,
                    },
                    seq,
                    (&c, window),
                    &mut o,
                )
                .unwrap();
                o.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
            };
            let run_r = |k: Encoded<'_>| {
                let mut o = vec![0i32; n_q * n_kv * 4];
                select_compressed_at(
                    isa,
                    qe,
                    k,
                    None,
                    Heads {
                        n_q_heads: hq,
                        n_kv_heads: n_kv,
                        d,
                    },
                    seq,
                    (&c, window),
                    &mut o,
                )
                .unwrap();
                o
            };
            assert_eq!(run_s(cb), run_s(cf), "{isa:?} hq={hq}");
            assert_eq!(run_r(cb), run_r(cf), "{isa:?} hq={hq}");
        }
    }
}

/// Refusals name their argument and write nothing.
#[test]
fn refusals() {
    let q = [1.0f32; 8];
    let k = [1.0f32; 40];
    let mut out = vec![9i32; 4];
    let err = |r: Result<(), crate::ArgumentError>| format!("{:?}", r.unwrap_err());
    let c = cfg(4, 2);
    assert!(err(select_into(
        Encoded::F32(&q),
        Encoded::F32(&k),
        None,
        Heads {
            n_q_heads: 3,
            n_kv_heads: 2,
            d: 4
        },
        &c,
        &mut out
    ))
    .contains("\"q\""));
    assert!(err(select_into(
        Encoded::F32(&q),
        Encoded::F32(&k[..39]),
        None,
        Heads {
            n_q_heads: 2,
            n_kv_heads: 1,
            d: 4
        },
        &c,
        &mut out
    ))
    .contains("\"k\""));
    assert!(err(select_into(
        Encoded::F32(&q),
        Encoded::F32(&k),
        Some(&[1.0; 3]),
        Heads {
            n_q_heads: 2,
            n_kv_heads: 1,
            d: 4
        },
        &c,
        &mut out
    ))
    .contains("k_scale"));
    // The heads are read by name: no KV head is refused naming `n_kv_heads`,
    // `n_q_heads` and `n_kv_heads` swapped (1 query head over 2 KV heads,
    // whole tokens of `k` either way) naming `q`; nothing written.
    let heads = Heads {
        n_q_heads: 2,
        n_kv_heads: 1,
        d: 4,
    };
    for (h, argument) in [
        (
            Heads {
                n_kv_heads: 0,
                ..heads
            },
            "n_kv_heads",
        ),
        (
            Heads {
                n_q_heads: 1,
                n_kv_heads: 2,
                ..heads
            },
            "q",
        ),
    ] {
        let r = select_into(Encoded::F32(&q), Encoded::F32(&k), None, h, &c, &mut out);
        assert_eq!(r.unwrap_err().argument(), argument, "{h:?}");
        assert!(out.iter().all(|&x| x == 9));
    }
    let zero = Config {
        block_counts: 0,
        ..c
    };
    assert!(err(select_into(
        Encoded::F32(&q),
        Encoded::F32(&k),
        None,
        Heads {
            n_q_heads: 2,
            n_kv_heads: 1,
            d: 4
        },
        &zero,
        &mut out
    ))
    .contains("block_counts"));
    let nan = Config {
        scale: f32::NAN,
        ..c
    };
    assert!(err(select_into(
        Encoded::F32(&q),
        Encoded::F32(&k),
        None,
        Heads {
            n_q_heads: 2,
            n_kv_heads: 1,
            d: 4
        },
        &nan,
        &mut out
    ))
    .contains("scale"));
    let bs0 = Config { block_size: 0, ..c };
    assert!(err(select_into(
        Encoded::F32(&q),
        Encoded::F32(&k),
        None,
        Heads {
            n_q_heads: 2,
            n_kv_heads: 1,
            d: 4
        },
        &bs0,
        &mut out
    ))
    .contains("block_size"));
    // On given compressed keys too: the width divides by the block size, so it
    // is formed only after the check (a zero once panicked here).
    let heads = Heads {
        n_q_heads: 2,
        n_kv_heads: 1,
        d: 4,
    };
    let ck = vec![0.0f32; 8];
    let mut scores = vec![7.0f32; 8];
    let cw = (&bs0, Window::Fla);
    let refused = block_scores_compressed_into(
        Encoded::F32(&q),
        Encoded::F32(&ck),
        None,
        heads,
        10,
        cw,
        &mut scores,
    );
    assert!(err(refused).contains("block_size"));
    let refused = select_compressed_into(
        Encoded::F32(&q),
        Encoded::F32(&ck),
        None,
        heads,
        10,
        cw,
        &mut out,
    );
    assert!(err(refused).contains("block_size"));
    assert_eq!(scores, vec![7.0; 8]);
    assert!(err(select_into(
        Encoded::F32(&q),
        Encoded::F32(&k),
        None,
        Heads {
            n_q_heads: 2,
            n_kv_heads: 1,
            d: 4
        },
        &c,
        &mut out[..3]
    ))
    .contains("out"));
    assert_eq!(out, vec![9; 4]);
    // a good call: one query, 2 heads in one group, 10 tokens, 2 slots
    select_into(
        Encoded::F32(&q),
        Encoded::F32(&k),
        None,
        Heads {
            n_q_heads: 2,
            n_kv_heads: 1,
            d: 4,
        },
        &c,
        &mut out[..2],
    )
    .unwrap();
    assert_eq!(&out[..2], &[0, 1]);
}

/// A packed batch at every level: each sequence's rows and scores are the
/// dense call's at that level, bit for bit (an empty sequence, one with no
/// query, queries fewer than keys); a batch whose queries outnumber a
/// sequence's keys is refused before anything is written.
#[test]
fn packed_equals_each_sequence_alone_at_every_level() {
    use super::api::{block_scores_packed_at, select_packed_at};
    let (hq, n_kv, d) = (4, 2, 8);
    let lens = [70usize, 0, 9, 33, 130];
    let n_qs = [3usize, 0, 0, 33, 1];
    let cu: Vec<usize> = std::iter::once(0)
        .chain(lens.iter().scan(0, |a, &l| {
            *a += l;
            Some(*a)
        }))
        .collect();
    let cq: Vec<usize> = std::iter::once(0)
        .chain(n_qs.iter().scan(0, |a, &l| {
            *a += l;
            Some(*a)
        }))
        .collect();
    let mut seed = 17u64;
    let k = rand(&mut seed, cu[lens.len()] * n_kv * d);
    let q = rand(&mut seed, cq[lens.len()] * hq * d);
    let c = cfg(8, 4);
    let (n_q, nb) = (cq[lens.len()], 130usize.div_ceil(8));
    for isa in isas_for_test() {
        let mut rows = vec![0i32; n_q * n_kv * 4];
        let mut scores = vec![0.0f32; n_q * n_kv * nb];
        let (qe, ke) = (Encoded::F32(&q), Encoded::F32(&k));
        select_packed_at(
            isa,
            qe,
            ke,
            None,
            Heads {
                n_q_heads: hq,
                n_kv_heads: n_kv,
                d,
            },
            (&cu, Some(&cq)),
            &c,
            &mut rows,
        )
        .unwrap();
        block_scores_packed_at(
            isa,
            qe,
            ke,
            None,
            Heads {
                n_q_heads: hq,
                n_kv_heads: n_kv,
                d,
            },
            (&cu, Some(&cq)),
            &c,
            &mut scores,
        )
        .unwrap();
        for s in 0..lens.len() {
            let (q0, q1, k0, k1) = (cq[s], cq[s + 1], cu[s], cu[s + 1]);
            if q1 == q0 {
                continue;
            }
            let qs = Encoded::F32(&q[q0 * hq * d..q1 * hq * d]);
            let ks = Encoded::F32(&k[k0 * n_kv * d..k1 * n_kv * d]);
            let mut want = vec![0i32; (q1 - q0) * n_kv * 4];
            select_at(
                isa,
                qs,
                ks,
                None,
                Heads {
                    n_q_heads: hq,
                    n_kv_heads: n_kv,
                    d,
                },
                &c,
                &mut want,
            )
            .unwrap();
            assert_eq!(
                &rows[q0 * n_kv * 4..q1 * n_kv * 4],
                &want[..],
                "{isa:?} {s}"
            );
            let nbs = lens[s].div_ceil(8);
            let mut ws = vec![0.0f32; (q1 - q0) * n_kv * nbs];
            block_scores_at(
                isa,
                qs,
                ks,
                None,
                Heads {
                    n_q_heads: hq,
                    n_kv_heads: n_kv,
                    d,
                },
                &c,
                &mut ws,
            )
            .unwrap();
            for (r, w) in scores[q0 * n_kv * nb..q1 * n_kv * nb]
                .chunks(nb)
                .zip(ws.chunks(nbs))
            {
                let bits: Vec<u32> = r[..nbs].iter().map(|x| x.to_bits()).collect();
                let wbits: Vec<u32> = w.iter().map(|x| x.to_bits()).collect();
                assert_eq!(bits, wbits, "{isa:?} {s}");
                assert!(r[nbs..].iter().all(|x| x.is_nan()));
            }
        }
    }
    let mut out = vec![7i32; n_q * n_kv * 4];
    let bad_q = [0usize, 3, 3, 3, 40, 41];
    let e = select_packed_into(
        Encoded::F32(&q),
        Encoded::F32(&k),
        None,
        Heads {
            n_q_heads: hq,
            n_kv_heads: n_kv,
            d,
        },
        (&cu, Some(&bad_q)),
        &c,
        &mut out,
    )
    .unwrap_err();
    assert_eq!(e.argument(), "cu_seqlens_q");
    assert!(e.to_string().contains("33 keys"), "{e}");
    assert!(out.iter().all(|&x| x == 7));
}

/// Eq. 9 at the paper's sizes (blocks of 64, keys of 32 every 16): block
/// `j` sums keys `4j − 4 ..= 4j` weighted 1, 2, 2, 2, 1, keys below 0 or
/// unseen adding nothing; the scores' bits are the same at every level.
#[test]
fn eq9_window_and_every_levels_bits() {
    let w = Window::Eq9 {
        kernel_size: PAPER_KERNEL_SIZE,
        kernel_stride: PAPER_KERNEL_STRIDE,
    };
    let c = cfg(64, 16);
    // Query at 639: IC = 9, forced 0, 8, 9; the keys' sums 10^i (exact in f32).
    let sums: Vec<f32> = (0..7).map(|i| 10f32.powi(i)).collect();
    let mut out = [0.0f32; 10];
    block_scores(&c, w, &sums, 639, &mut out);
    assert_eq!(out[1], 1.0 + 20.0 + 200.0 + 2000.0 + 10000.0);
    // Block 2 reads keys 4 ..= 8; 7 and 8 are unseen (sums has 7 entries).
    assert_eq!(out[2], 10000.0 + 2e5 + 2e6);
    assert_eq!(out[3], 0.0);
    assert_eq!(
        (out[0], out[8], out[9]),
        (f32::INFINITY, f32::INFINITY, f32::INFINITY)
    );
    assert!(w.check(64).is_ok());
    let bad = Window::Eq9 {
        kernel_size: 32,
        kernel_stride: 24,
    };
    assert_eq!(bad.check(64).unwrap_err().argument(), "kernel_stride");
    let (hq, n_kv, d, n) = (8, 2, 16, 900);
    let mut seed = 3u64;
    let q = rand(&mut seed, 3 * hq * d);
    let k = rand(&mut seed, n * n_kv * d);
    let nb = n.div_ceil(64);
    let run = |isa| {
        let mut o = vec![0.0f32; 3 * n_kv * nb];
        super::api::block_scores_window_at(
            isa,
            Encoded::F32(&q),
            Encoded::F32(&k),
            None,
            Heads {
                n_q_heads: hq,
                n_kv_heads: n_kv,
                d,
            },
            (&c, w),
            &mut o,
        )
        .unwrap();
        o.iter().map(|x| x.to_bits()).collect::<Vec<u32>>()
    };
    let want = run(crate::simd::Isa::Scalar);
    for isa in isas_for_test() {
        assert_eq!(run(isa), want, "{isa:?}");
    }
}

/// The entry points on given compressed keys equal the ones on the keys, bit
/// for bit, at every level: fla's window and Eq. 9's, decode and prefill
/// chunks, a sequence ending on a block boundary and one past it; the
/// compressed keys given as float32 (what [`compress_window_into`] writes),
/// bfloat16 and fp8 with a scale a key (keys constant over each block, so
/// the means are those values exactly).
#[test]
fn compressed_keys_given_equal_the_keys_at_every_level() {
    use super::api::{
        block_scores_compressed_at, block_scores_window_at, select_compressed_at, select_window_at,
    };
    let eq9 = Window::Eq9 {
        kernel_size: 8,
        kernel_stride: 4,
    };
    let mut seed = 11u64;
    for &(hq, n_kv, d, seq, n_q, bs, window) in &[
        (
            16usize,
            1usize,
            24usize,
            300usize,
            1usize,
            16usize,
            Window::Fla,
        ),
        (8, 2, 16, 256, 4, 16, Window::Fla),
        (4, 4, 8, 97, 97, 8, Window::Fla),
        (32, 2, 64, 1000, 3, 64, Window::Fla),
        (8, 2, 16, 300, 2, 16, eq9),
        (4, 1, 8, 64, 64, 16, eq9),
    ] {
        let q = rand(&mut seed, n_q * hq * d);
        let k = rand(&mut seed, seq * n_kv * d);
        let c = Config {
            scale: 0.3,
            ..cfg(bs, 5)
        };
        let n_c = window.geometry(bs).compressed_len(seq);
        let mut ck = vec![0.0f32; n_c * n_kv * d];
        compress_window_into(Encoded::F32(&k), None, n_kv, d, bs, window, &mut ck).unwrap();
        let nb = c.n_blocks(seq);
        for isa in isas_for_test() {
            let (mut want_s, mut got_s) =
                (vec![0.0f32; n_q * n_kv * nb], vec![1.0f32; n_q * n_kv * nb]);
            let (mut want_r, mut got_r) = (vec![0i32; n_q * n_kv * 5], vec![7i32; n_q * n_kv * 5]);
            let (qe, ke, cke) = (Encoded::F32(&q), Encoded::F32(&k), Encoded::F32(&ck));
            block_scores_window_at(
                isa,
                qe,
                ke,
                None,
                Heads {
                    n_q_heads: hq,
                    n_kv_heads: n_kv,
                    d,
                },
                (&c, window),
                &mut want_s,
            )
            .unwrap();
            select_window_at(
                isa,
                qe,
                ke,
                None,
                Heads {
                    n_q_heads: hq,
                    n_kv_heads: n_kv,
                    d,
                },
                (&c, window),
                &mut want_r,
            )
            .unwrap();
            block_scores_compressed_at(
                isa,
                qe,
                cke,
                None,
                Heads {
                    n_q_heads: hq,
                    n_kv_heads: n_kv,
                    d,
                },
                seq,
                (&c, window),
                &mut got_s,
            )
            .unwrap();
            select_compressed_at(
                isa,
                qe,
                cke,
                None,
                Heads {
                    n_q_heads: hq,
                    n_kv_heads: n_kv,
                    d,
                },
                seq,
                (&c, window),
                &mut got_r,
            )
            .unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got_s), bits(&want_s), "{isa:?} {seq} {window:?}");
            assert_eq!(got_r, want_r, "{isa:?} {seq} {window:?}");
            assert!(got_s.iter().any(|x| x.is_finite() && *x > 0.0));
        }
    }

    // bfloat16 and fp8 compressed keys: keys constant over each block of 16.
    let (hq, n_kv, d, bs, seq, n_q) = (8usize, 2usize, 8usize, 16usize, 16 * 37 + 5, 2usize);
    let n_c = seq / bs;
    let c = cfg(bs, 6);
    // bf16 values: the top half of random float32s (exact in bf16).
    let bf: Vec<u16> = rand(&mut seed, n_c * n_kv * d)
        .iter()
        .map(|x| (x.to_bits() >> 16) as u16)
        .collect();
    // fp8 e4m3 values: sign, exponent 5..=8, 3 mantissa bits; per key scale 0.75 or 1.25.
    let f8: Vec<u8> = rand(&mut seed, n_c * n_kv * d)
        .iter()
        .map(|x| {
            let b = x.to_bits();
            (((b >> 31) as u8) << 7) | (((5 + (b >> 8) % 4) as u8) << 3) | (b % 8) as u8
        })
        .collect();
    let f8_scale: Vec<f32> = (0..n_c)
        .map(|i| if i % 2 == 0 { 0.75 } else { 1.25 })
        .collect();
    let q = rand(&mut seed, n_q * hq * d);
    let nb = c.n_blocks(seq);
    for (name, ce, sc) in [
        ("bf16", Encoded::Bf16(&bf), None),
        ("fp8", Encoded::Fp8E4m3(&f8), Some(&f8_scale[..])),
    ] {
        let mut vals = vec![0.0f32; n_c * n_kv * d];
        ce.decode(0, &mut vals);
        if let Some(s) = sc {
            for (r, &x) in vals.chunks_mut(n_kv * d).zip(s) {
                r.iter_mut().for_each(|v| *v *= x);
            }
        }
        // The keys: each block's tokens the value, the tail block's anything.
        let mut k = Vec::with_capacity(seq * n_kv * d);
        for t in 0..seq {
            match vals.chunks(n_kv * d).nth(t / bs) {
                Some(row) => k.extend_from_slice(row),
                None => k.extend(rand(&mut seed, n_kv * d)),
            }
        }
        let mut ck = vec![0.0f32; n_c * n_kv * d];
        compress_into(Encoded::F32(&k), None, n_kv, d, bs, &mut ck).unwrap();
        assert_eq!(ck, vals, "{name}: the means are the values");
        for isa in isas_for_test() {
            let (mut want_s, mut got_s) =
                (vec![0.0f32; n_q * n_kv * nb], vec![1.0f32; n_q * n_kv * nb]);
            let (mut want_r, mut got_r) = (vec![0i32; n_q * n_kv * 6], vec![7i32; n_q * n_kv * 6]);
            let (qe, ke) = (Encoded::F32(&q), Encoded::F32(&k));
            let fla = Window::Fla;
            block_scores_at(
                isa,
                qe,
                ke,
                None,
                Heads {
                    n_q_heads: hq,
                    n_kv_heads: n_kv,
                    d,
                },
                &c,
                &mut want_s,
            )
            .unwrap();
            select_at(
                isa,
                qe,
                ke,
                None,
                Heads {
                    n_q_heads: hq,
                    n_kv_heads: n_kv,
                    d,
                },
                &c,
                &mut want_r,
            )
            .unwrap();
            block_scores_compressed_at(
                isa,
                qe,
                ce,
                sc,
                Heads {
                    n_q_heads: hq,
                    n_kv_heads: n_kv,
                    d,
                },
                seq,
                (&c, fla),
                &mut got_s,
            )
            .unwrap();
            select_compressed_at(
                isa,
                qe,
                ce,
                sc,
                Heads {
                    n_q_heads: hq,
                    n_kv_heads: n_kv,
                    d,
                },
                seq,
                (&c, fla),
                &mut got_r,
            )
            .unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got_s), bits(&want_s), "{name} {isa:?}");
            assert_eq!(got_r, want_r, "{name} {isa:?}");
        }
    }
}

/// The entry points on compressed keys refuse by name and write nothing.
#[test]
fn compressed_refusals() {
    let (hq, n_kv, d, bs, seq) = (4usize, 2usize, 4usize, 4usize, 21usize);
    let q = [0.5f32; 4 * 4];
    let ck = [1.0f32; 5 * 2 * 4]; // seq 21 → 5 complete blocks
    let c = cfg(bs, 3);
    let fla = Window::Fla;
    let mut out = vec![9i32; n_kv * 3];
    let mut scores = vec![9.0f32; n_kv * 6];
    let arg = |r: Result<(), crate::ArgumentError>| r.unwrap_err().argument();
    let sel = |q: &[f32],
               ck: &[f32],
               sc: Option<&[f32]>,
               hq,
               n_kv,
               d,
               seq,
               c: &Config,
               w,
               out: &mut [i32]| {
        select_compressed_into(
            Encoded::F32(q),
            Encoded::F32(ck),
            sc,
            Heads {
                n_q_heads: hq,
                n_kv_heads: n_kv,
                d,
            },
            seq,
            (c, w),
            out,
        )
    };
    // Compressed keys of another count: of 20 tokens (5 keys) is right for 21,
    // of 19 (4 keys) is not.
    assert_eq!(
        arg(sel(
            &q,
            &ck[..32],
            None,
            hq,
            n_kv,
            d,
            seq,
            &c,
            fla,
            &mut out
        )),
        "ck"
    );
    assert_eq!(
        arg(sel(&q, &ck, None, hq, n_kv, d, 19, &c, fla, &mut out)),
        "ck"
    );
    assert_eq!(
        arg(sel(
            &q,
            &ck[..39],
            None,
            hq,
            n_kv,
            d,
            seq,
            &c,
            fla,
            &mut out
        )),
        "ck"
    );
    assert_eq!(
        arg(sel(&q, &ck, None, hq, n_kv, d, 0, &c, fla, &mut out)),
        "seq_len"
    );
    assert_eq!(
        arg(sel(
            &q,
            &ck,
            Some(&[1.0; 4]),
            hq,
            n_kv,
            d,
            seq,
            &c,
            fla,
            &mut out
        )),
        "ck_scale"
    );
    assert_eq!(
        arg(sel(&q, &ck, None, 3, n_kv, d, seq, &c, fla, &mut out)),
        "q"
    );
    assert_eq!(
        arg(sel(
            &q[..15],
            &ck,
            None,
            hq,
            n_kv,
            d,
            seq,
            &c,
            fla,
            &mut out
        )),
        "q"
    );
    let few = [1.0f32; 2 * 2 * 4]; // 2 tokens' compressed keys at bs = 1
    let c1 = cfg(1, 3);
    let mut out2 = vec![9i32; 4 * n_kv * 3];
    let q4 = [0.5f32; 4 * 4 * 4];
    assert_eq!(
        arg(sel(&q4, &few, None, hq, n_kv, d, 2, &c1, fla, &mut out2)),
        "q"
    ); // 4 queries, 2 tokens
    let zero = Config {
        block_counts: 0,
        ..c
    };
    assert_eq!(
        arg(sel(&q, &ck, None, hq, n_kv, d, seq, &zero, fla, &mut out)),
        "block_counts"
    );
    let nan = Config {
        scale: f32::NAN,
        ..c
    };
    assert_eq!(
        arg(sel(&q, &ck, None, hq, n_kv, d, seq, &nan, fla, &mut out)),
        "scale"
    );
    let bad = Window::Eq9 {
        kernel_size: 6,
        kernel_stride: 4,
    };
    assert_eq!(
        arg(sel(&q, &ck, None, hq, n_kv, d, seq, &c, bad, &mut out)),
        "kernel_size"
    );
    assert_eq!(
        arg(sel(&q, &ck, None, hq, n_kv, d, seq, &c, fla, &mut out[..5])),
        "out"
    );
    assert_eq!(
        arg(block_scores_compressed_into(
            Encoded::F32(&q),
            Encoded::F32(&ck),
            None,
            Heads {
                n_q_heads: hq,
                n_kv_heads: n_kv,
                d
            },
            seq,
            (&c, fla),
            &mut scores[..11]
        )),
        "out"
    );
    assert_eq!(out, vec![9; n_kv * 3]);
    assert_eq!(out2, vec![9; 4 * n_kv * 3]);
    assert_eq!(scores, vec![9.0; n_kv * 6]);
    // The same arguments, right: rows written (block_counts 3 holds the forced blocks).
    sel(&q, &ck, None, hq, n_kv, d, seq, &c, fla, &mut out).unwrap();
    assert_eq!(out, vec![0, 4, 5, 0, 4, 5]); // query at 20: IC = 5, forced 0, 4, 5
}

/// [`row`] against a full sort in the total order: random scores with many
/// ties, `+inf` and `-inf` blocks, widths on both sides of `ROW_SCAN_MAX`
/// (the insertion pass and the quickselect).
#[test]
fn row_is_the_first_k_of_the_total_order() {
    let mut seed = 5u64;
    let mut ids = Vec::new();
    for case in 0..400 {
        let n = 1 + case % 300;
        let vals = rand(&mut seed, n);
        let scores: Vec<f32> = vals
            .iter()
            .map(|&v| match ((v + 2.0) * 8.0) as i32 {
                0 => f32::INFINITY,
                1 | 2 => f32::NEG_INFINITY,
                x => (x % 7) as f32 * 0.25, // few values: ties
            })
            .collect();
        for k in [1, 2, 3, 16, ROW_SCAN_MAX, ROW_SCAN_MAX + 1, 200] {
            let mut got = vec![5i32; k];
            row(&scores, &mut ids, &mut got);
            assert_eq!(got, best_row(&scores, k), "n={n} k={k}");
        }
    }
}

/// The same with NaN scores among the candidates (they come last, by id):
/// the one-pass row's threshold (`s > t`, `t = −inf` when the `k`-th is NaN)
/// keeps the order's first `k`, as a sort by it does.
#[test]
fn row_is_the_first_k_of_the_total_order_with_nans() {
    let mut seed = 6u64;
    let mut ids = Vec::new();
    for case in 0..400 {
        let n = 1 + case % 120;
        let vals = rand(&mut seed, n);
        let scores: Vec<f32> = vals
            .iter()
            .map(|&v| match ((v + 2.0) * 8.0) as i32 {
                0 => f32::INFINITY,
                1 => f32::NEG_INFINITY,
                2..=5 => f32::NAN,
                x => (x % 5) as f32 * 0.25,
            })
            .collect();
        for k in [1, 2, 3, 5, 16, ROW_SCAN_MAX] {
            let mut got = vec![5i32; k];
            row(&scores, &mut ids, &mut got);
            assert_eq!(got, best_row(&scores, k), "n={n} k={k}");
        }
    }
    // A NaN `k`-th gives way to any later score; a later NaN does not enter.
    let s = [0.5, f32::NAN, f32::NAN, 0.1];
    let mut got = [0i32; 2];
    row(&s, &mut ids, &mut got);
    assert_eq!(got, [0, 3]);
}

/// [`row`] on rows long enough for its insertion pass (more than
/// `ROW_SELECT_MAX` blocks, `k <= ROW_SCAN_MAX`) and for its selection, with
/// `+0` and `−0` scores (equal: ties to the lower id), NaN, `±inf`, against
/// a full sort in the total order.
#[test]
fn row_is_the_first_k_of_the_total_order_on_long_rows_and_signed_zeros() {
    let mut seed = 7u64;
    let mut ids = Vec::new();
    for case in 0..60 {
        let n = [
            ROW_SELECT_MAX - 1,
            ROW_SELECT_MAX,
            ROW_SELECT_MAX + 1,
            700,
            1500,
        ][case % 5];
        let vals = rand(&mut seed, n);
        let scores: Vec<f32> = vals
            .iter()
            .map(|&v| match ((v + 2.0) * 16.0) as i32 {
                0 => f32::INFINITY,
                1..=3 => f32::NEG_INFINITY,
                4 => f32::NAN,
                5..=9 => 0.0,
                10..=14 => -0.0,
                x => (x % 11) as f32 * 0.125 - 0.5, // few values: ties, negatives
            })
            .collect();
        for k in [1, 2, 3, 16, ROW_SCAN_MAX, ROW_SCAN_MAX + 1, n] {
            let mut got = vec![5i32; k];
            row(&scores, &mut ids, &mut got);
            assert_eq!(got, best_row(&scores, k), "n={n} k={k}");
        }
    }
    // `−0` then `+0`: a tie, the lower id first, either way round.
    let mut got = [0i32; 1];
    row(&[-0.0, 0.0], &mut ids, &mut got);
    assert_eq!(got, [0]);
    row(&[0.0, -0.0], &mut ids, &mut got);
    assert_eq!(got, [0]);
    // A long row's scan: the same.
    let mut long = vec![f32::NEG_INFINITY; ROW_SELECT_MAX + 100];
    (long[3], long[ROW_SELECT_MAX + 50], long[7]) = (0.0, -0.0, 1.0);
    let mut got = [0i32; 2];
    row(&long, &mut ids, &mut got);
    assert_eq!(got, [3, 7]);
}

/// The compressed keys bit for bit the key-at-a-time sums (each key's rows
/// added in token order, then one division), at every level: fla's window
/// and overlapping ones, float32 with and without scales, bfloat16.
#[test]
fn compress_is_each_keys_token_ordered_sum_at_every_level() {
    let mut seed = 21u64;
    let (n_kv, d) = (3usize, 20usize);
    let w = n_kv * d;
    for &(seq, kernel, stride) in &[
        (300usize, 16usize, 16usize),
        (301, 8, 4),
        (97, 32, 16),
        (50, 6, 2),
        (7, 8, 4),
    ] {
        let k = rand(&mut seed, seq * w);
        let bf: Vec<u16> = k.iter().map(|x| (x.to_bits() >> 16) as u16).collect();
        let scales: Vec<f32> = rand(&mut seed, seq).iter().map(|x| x * 0.7 + 1.5).collect();
        // The first key's tokens all `−0` (its sum from `+0.0` is `+0`: no
        // fill, the first token sets `+0.0 + x`), one infinite and one NaN
        // element further on.
        let mut kz = k.clone();
        kz[..kernel.min(seq) * w].fill(-0.0);
        kz[(seq / 2) * w + 3] = f32::INFINITY;
        kz[(seq / 2) * w + 5] = f32::NAN;
        let n_c = if seq < kernel {
            0
        } else {
            (seq - kernel) / stride + 1
        };
        for (enc, sc) in [
            (Encoded::F32(&k), None),
            (Encoded::F32(&k), Some(&scales[..])),
            (Encoded::Bf16(&bf), None),
            (Encoded::F32(&kz), None),
            (Encoded::F32(&kz), Some(&scales[..])),
        ] {
            let mut rows = vec![0.0f32; seq * w];
            enc.decode(0, &mut rows);
            let mut want = vec![0.0f32; n_c * w];
            for (c, acc) in want.chunks_exact_mut(w).enumerate() {
                for t in c * stride..c * stride + kernel {
                    for (e, a) in acc.iter_mut().enumerate() {
                        *a += match sc {
                            Some(s) => rows[t * w + e] * s[t],
                            None => rows[t * w + e],
                        };
                    }
                }
                acc.iter_mut().for_each(|a| *a /= kernel as f32);
            }
            for isa in isas_for_test() {
                let mut got = vec![9.0f32; n_c * w];
                super::api::compress_at(isa, enc, sc, n_kv, d, (kernel, stride), &mut got);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{isa:?} {seq} {kernel}/{stride}");
            }
        }
    }
}

/// [`row`]'s rule by a sort: the best `k` candidates (scores other than
/// `−inf`) in the total order, ascending, then `-1`.
fn best_row(scores: &[f32], k: usize) -> Vec<i32> {
    let mut sorted: Vec<usize> = (0..scores.len())
        .filter(|&b| scores[b] != f32::NEG_INFINITY)
        .collect();
    sorted.sort_by(|&a, &b| crate::infllm::select::before(scores[a], a, scores[b], b));
    let mut want: Vec<i32> = sorted.iter().take(k).map(|&b| b as i32).collect();
    want.sort_unstable();
    want.resize(k, -1);
    want
}

/// The decode path that scores each compressed key as its compression
/// completes it (`run_fused`) equals the one that writes every key out
/// first (`stage`, a KV head at a time), and so do the compressed keys
/// given (float32 and bfloat16) scored every KV head in one pass
/// (`batched`), bit for bit, at every level: Eq. 9's window (the
/// paper's 32 / 16 and 8 / 4) and fla's, float32, bfloat16 and scaled
/// keys, fewer queries than tokens (1 to 5: pairs of queries a chunk and a
/// query alone), a sequence shorter than a window and ones ending past a
/// stride, keys and queries with `±0`, `±inf` and NaN, groups of 1 (not
/// fused: the same path), 8, 16 and 33 (chunks of 32 and 1), an odd `d`,
/// batches of keys short of a whole one and more keys than the ring's
/// slots.
#[test]
fn fused_decode_equals_compress_then_stage_at_every_level() {
    use super::api::{block_scores_window_at, select_window_at, FORCE_FUSE};
    let mut seed = 45u64;
    let paper = Window::Eq9 {
        kernel_size: PAPER_KERNEL_SIZE,
        kernel_stride: PAPER_KERNEL_STRIDE,
    };
    let small = Window::Eq9 {
        kernel_size: 8,
        kernel_stride: 4,
    };
    let mut fused_cases = 0;
    // (heads a group, n_kv, d, seq, n_q, block size, window)
    for &(grp, n_kv, d, seq, n_q, bs, window) in &[
        (
            16usize,
            2usize,
            24usize,
            64 * 9 + 17,
            4usize,
            64usize,
            paper,
        ),
        (16, 1, 13, 64 * 5, 5, 64, paper),
        (16, 2, 24, 64 * 7 + 40, 3, 64, Window::Fla),
        (33, 1, 16, 150, 2, 16, small),
        (33, 2, 8, 150, 3, 16, Window::Fla),
        (8, 2, 16, 16 * 9 + 3, 5, 16, small),
        (1, 2, 16, 200, 3, 16, small),
        (16, 1, 16, 20, 2, 64, paper),
        (16, 1, 16, 31, 1, 16, paper),
        (16, 1, 16, 45, 1, 16, paper),
        // Keys past the ring's slots (its slots reused): 249 and 159 keys.
        (16, 1, 8, 1000, 3, 16, small),
        (8, 2, 8, 64 * 40, 4, 64, paper),
    ] {
        let hq = grp * n_kv;
        let q = rand(&mut seed, n_q * hq * d);
        let k = rand(&mut seed, seq * n_kv * d);
        let bf: Vec<u16> = k.iter().map(|x| (x.to_bits() >> 16) as u16).collect();
        let scales: Vec<f32> = rand(&mut seed, seq).iter().map(|x| x * 0.7 + 1.5).collect();
        // Specials: the first tokens `−0`, an infinite and a NaN key
        // element mid-sequence, a query element `+inf` and one `−0`.
        let mut kx = k.clone();
        let head = (4 * n_kv * d).min(kx.len());
        kx[..head].fill(-0.0);
        kx[(seq / 2) * n_kv * d + 1] = f32::INFINITY;
        kx[(seq / 3) * n_kv * d + 2] = f32::NAN;
        let mut qx = q.clone();
        qx[d + 1] = f32::INFINITY;
        qx[0] = -0.0;
        let c = Config {
            scale: 0.3,
            ..cfg(bs, 5)
        };
        let nb = c.n_blocks(seq);
        for (name, qv, ke, sc) in [
            ("f32", &q, Encoded::F32(&k), None),
            ("bf16", &q, Encoded::Bf16(&bf), None),
            ("scaled", &q, Encoded::F32(&k), Some(&scales[..])),
            ("specials", &qx, Encoded::F32(&kx), None),
        ] {
            let qe = Encoded::F32(qv);
            for isa in isas_for_test() {
                let run = |fuse: bool| {
                    FORCE_FUSE.set(Some(fuse));
                    let mut s = vec![0.0f32; n_q * n_kv * nb];
                    let mut r = vec![0i32; n_q * n_kv * 5];
                    block_scores_window_at(
                        isa,
                        qe,
                        ke,
                        sc,
                        Heads {
                            n_q_heads: hq,
                            n_kv_heads: n_kv,
                            d,
                        },
                        (&c, window),
                        &mut s,
                    )
                    .unwrap();
                    select_window_at(
                        isa,
                        qe,
                        ke,
                        sc,
                        Heads {
                            n_q_heads: hq,
                            n_kv_heads: n_kv,
                            d,
                        },
                        (&c, window),
                        &mut r,
                    )
                    .unwrap();
                    FORCE_FUSE.set(None);
                    (s.iter().map(|x| x.to_bits()).collect::<Vec<u32>>(), r, s)
                };
                let (want_s, want_r, vals) = run(false);
                let (got_s, got_r, _) = run(true);
                let at = format!("{name} {isa:?} grp={grp} seq={seq} n_q={n_q} {window:?}");
                assert_eq!(got_s, want_s, "{at}");
                assert_eq!(got_r, want_r, "{at}");
                // The compressed keys given (float32, and rounded to
                // bfloat16 bits), every KV head in one pass (`batched`)
                // against a head at a time.
                let n_c = window.geometry(bs).compressed_len(seq);
                let mut ck = vec![0.0f32; n_c * n_kv * d];
                compress_window_into(ke, sc, n_kv, d, bs, window, &mut ck).unwrap();
                let ckb: Vec<u16> = ck.iter().map(|x| (x.to_bits() >> 16) as u16).collect();
                for cke in [Encoded::F32(&ck), Encoded::Bf16(&ckb)] {
                    let cached = |fuse: Option<bool>| {
                        FORCE_FUSE.set(fuse);
                        let mut s = vec![0.0f32; n_q * n_kv * nb];
                        let mut r = vec![0i32; n_q * n_kv * 5];
                        let cw = (&c, window);
                        super::api::block_scores_compressed_at(
                            isa,
                            qe,
                            cke,
                            None,
                            Heads {
                                n_q_heads: hq,
                                n_kv_heads: n_kv,
                                d,
                            },
                            seq,
                            cw,
                            &mut s,
                        )
                        .unwrap();
                        super::api::select_compressed_at(
                            isa,
                            qe,
                            cke,
                            None,
                            Heads {
                                n_q_heads: hq,
                                n_kv_heads: n_kv,
                                d,
                            },
                            seq,
                            cw,
                            &mut r,
                        )
                        .unwrap();
                        FORCE_FUSE.set(None);
                        (s.iter().map(|x| x.to_bits()).collect::<Vec<u32>>(), r)
                    };
                    let (ws, wr) = cached(Some(false));
                    let (gs, gr) = cached(None);
                    assert_eq!(gs, ws, "cached {at}");
                    assert_eq!(gr, wr, "cached {at}");
                    if matches!(cke, Encoded::F32(_)) {
                        assert_eq!(gs, want_s, "cached = keys {at}");
                    }
                }
                // A case with candidates scores some of them above 0.
                if name == "f32" && vals.iter().any(|x| x.is_finite()) {
                    assert!(vals.iter().any(|x| x.is_finite() && *x > 0.0), "{at}");
                    fused_cases += usize::from(grp >= 8);
                }
            }
        }
    }
    assert_eq!(fused_cases, 8 * isas_for_test().len());
}

/// A call's rows, handed to the top-k two at a time (`stage`'s rows
/// after any fused units, `row2`), are each row's `row` of its block
/// scores, at every level: rows in pairs of one query's KV heads and
/// across queries (one or three KV heads: pairs of rows that end at
/// different blocks, an odd last row), the panels' prefill path and the
/// packed one (fewer queries), `k` above and below a row's candidates, and
/// a query of NaN (its rows' scores NaN).
#[test]
fn rows_in_pairs_are_each_row_alone_at_every_level() {
    let mut seed = 45u64;
    for &(hq, n_kv, d, seq, n_q, bs) in &[
        (48usize, 3usize, 16usize, 700usize, 65usize, 16usize),
        (16, 1, 8, 130, 130, 8),
        (8, 4, 8, 97, 97, 8),
        (2, 2, 8, 50, 7, 8),
        (3, 3, 4, 41, 41, 4),
    ] {
        let mut q = rand(&mut seed, n_q * hq * d);
        q[(n_q / 2) * hq * d] = f32::NAN;
        let k = rand(&mut seed, seq * n_kv * d);
        for counts in [5, 16] {
            let c = Config {
                scale: 0.3,
                ..cfg(bs, counts)
            };
            let nb = c.n_blocks(seq);
            let rows = n_q * n_kv;
            for isa in isas_for_test() {
                let mut s = vec![0.0f32; rows * nb];
                let (qe, ke) = (Encoded::F32(&q), Encoded::F32(&k));
                let heads = Heads {
                    n_q_heads: hq,
                    n_kv_heads: n_kv,
                    d,
                };
                block_scores_at(isa, qe, ke, None, heads, &c, &mut s).unwrap();
                let mut r = vec![0i32; rows * counts];
                select_at(isa, qe, ke, None, heads, &c, &mut r).unwrap();
                let mut ids = Vec::new();
                for (i, (got, sc)) in r.chunks(counts).zip(s.chunks(nb)).enumerate() {
                    let mut want = vec![7i32; counts];
                    row(sc, &mut ids, &mut want);
                    assert_eq!(got, want, "{isa:?} hq={hq} n_kv={n_kv} n_q={n_q} row {i}");
                }
                // The NaN query's rows: NaN scores, still rows.
                let nan = &s[(n_q / 2) * n_kv * nb..][..nb];
                assert!(nan.iter().any(|x| x.is_nan()), "{isa:?}");
            }
        }
    }
}

/// [`rows_in_pairs_are_each_row_alone_at_every_level`] under Eq. 9's
/// window (compressed keys of 2 or 4 blocks' tokens every block): the
/// paired rows of `stage` are each row's `row`.
#[test]
fn rows_in_pairs_under_eq9_windows_are_each_row_alone() {
    use super::api::{block_scores_window_at, select_window_at};
    let mut seed = 46u64;
    for &(hq, n_kv, d, seq, n_q, bs, ks) in &[
        (6usize, 3usize, 8usize, 301usize, 45usize, 8usize, 16usize),
        (16, 1, 8, 130, 129, 8, 32),
        (2, 1, 4, 77, 77, 4, 8),
    ] {
        let q = rand(&mut seed, n_q * hq * d);
        let k = rand(&mut seed, seq * n_kv * d);
        let window = Window::Eq9 {
            kernel_size: ks,
            kernel_stride: bs,
        };
        for counts in [3, 16] {
            let c = Config {
                scale: 0.3,
                ..cfg(bs, counts)
            };
            let nb = c.n_blocks(seq);
            let rows = n_q * n_kv;
            let heads = Heads {
                n_q_heads: hq,
                n_kv_heads: n_kv,
                d,
            };
            for isa in isas_for_test() {
                let (qe, ke) = (Encoded::F32(&q), Encoded::F32(&k));
                let mut s = vec![0.0f32; rows * nb];
                block_scores_window_at(isa, qe, ke, None, heads, (&c, window), &mut s).unwrap();
                let mut r = vec![0i32; rows * counts];
                select_window_at(isa, qe, ke, None, heads, (&c, window), &mut r).unwrap();
                let mut ids = Vec::new();
                for (i, (got, sc)) in r.chunks(counts).zip(s.chunks(nb)).enumerate() {
                    let mut want = vec![7i32; counts];
                    row(sc, &mut ids, &mut want);
                    assert_eq!(got, want, "{isa:?} hq={hq} n_kv={n_kv} n_q={n_q} row {i}");
                }
            }
        }
    }
}
