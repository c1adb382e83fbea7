//! The rule's examples pinned, the variants' forcing, the order, every
//! level's bits and the refusals.

use super::api::block_scores_at;
use super::score::{block_scores, pooled};
use super::*;
use crate::keys::Encoded;
use crate::simd::{isas_for_test, Isa};

fn cfg(pooling: Pooling, keep: Keep, init: usize, local: usize, top_k: usize) -> Config {
    Config {
        init_blocks: init,
        local_blocks: local,
        top_k,
        pooling,
        keep,
        scale: 1.0,
        geometry: Geometry::MINICPM4,
    }
}

/// MiniCPM4's sizes: 32-token keys every 16 tokens; a key seen once its
/// last token is.
#[test]
fn compressed_keys_and_visibility() {
    assert_eq!(compressed_len(31), 0);
    assert_eq!(compressed_len(32), 1);
    assert_eq!(compressed_len(47), 1);
    assert_eq!(compressed_len(48), 2);
    assert_eq!(compressed_len(131_072), 8191);
    assert_eq!(visible(30), 0);
    assert_eq!(visible(31), 1);
    assert_eq!(visible(46), 1);
    assert_eq!(visible(47), 2);
    assert_eq!((n_blocks(1), n_blocks(64), n_blocks(65)), (1, 1, 2));
}

/// Block b pools keys [4b − 1, 4b + 4): key 4b − 1 counts, key 4b + 4 does
/// not; block 0 starts at key 0; taps past n_c are dropped (CUDA) or read
/// as 0 (Triton); a key past the visible ones scores 0.
#[test]
fn the_pooling_window() {
    let mut sums = vec![0.0f32; 12];
    sums[3] = 5.0; // the last tap of block 0, the first of block 1
    sums[8] = 7.0; // block 2's second tap, not block 1's
    assert_eq!(pooled(Pooling::Cuda, &sums, 12, 4, 0), 5.0);
    assert_eq!(pooled(Pooling::Cuda, &sums, 12, 4, 1), 5.0);
    assert_eq!(pooled(Pooling::Cuda, &sums, 12, 4, 2), 7.0);
    sums[8] = 0.0;
    sums[7] = 2.0;
    assert_eq!(pooled(Pooling::Cuda, &sums, 12, 4, 2), 2.0);
    // Keys 9.. unseen (sums shorter than n_c) score 0.
    assert_eq!(pooled(Pooling::Cuda, &sums[..9], 12, 4, 3), 0.0);
    // Past n_c: no tap.
    assert_eq!(pooled(Pooling::Cuda, &sums, 12, 4, 4), f32::NEG_INFINITY);
    assert_eq!(pooled(Pooling::Triton, &sums, 12, 4, 4), 0.0);
}

/// The CUDA kernel forces init and the local_blocks + 1 blocks up to the
/// current one; the Triton one excludes the local_blocks blocks up to the
/// current one and forces init last.
#[test]
fn forced_and_excluded_blocks() {
    let sums = vec![0.5f32; 40];
    let p = 5 * 64 + 3; // block 5
    let mut out = [0.0f32; 10];
    block_scores(
        &cfg(Pooling::Cuda, Keep::ThroughCurrent, 1, 2, 4),
        &sums,
        40,
        p,
        &mut out,
    );
    let inf = f32::INFINITY;
    assert_eq!(out, [inf, 0.5, 0.5, inf, inf, inf, 0.5, 0.5, 0.5, 0.5]);
    block_scores(
        &cfg(Pooling::Triton, Keep::ThroughCurrent, 1, 2, 4),
        &sums,
        40,
        p,
        &mut out,
    );
    let ninf = f32::NEG_INFINITY;
    assert_eq!(out, [inf, 0.5, 0.5, 0.5, ninf, ninf, 0.5, 0.5, 0.5, 0.5]);
    // Init wins over the Triton local window.
    block_scores(
        &cfg(Pooling::Triton, Keep::ThroughCurrent, 1, 3, 4),
        &sums,
        40,
        64,
        &mut out,
    );
    assert_eq!(out[..3], [inf, ninf, 0.5]);
}

/// The order: +inf first, ties to the lower id, NaN last; the filter on
/// either side of the query's block.
#[test]
fn rows_keep_the_order_and_the_filter() {
    let s = [1.0f32, f32::NAN, 3.0, 3.0, f32::INFINITY, 0.0];
    let mut ids = Vec::new();
    let mut out = [0i32; 3];
    select::row(&s, 3, Keep::ThroughCurrent, 5, &mut ids, &mut out);
    assert_eq!(out, [2, 3, 4]);
    select::row(&s, 3, Keep::ThroughCurrent, 3, &mut ids, &mut out);
    assert_eq!(out, [2, 3, -1]);
    select::row(&s, 3, Keep::BeforeCurrent, 3, &mut ids, &mut out);
    assert_eq!(out, [2, -1, -1]);
    let mut wide = [0i32; 8];
    select::row(&s, 8, Keep::ThroughCurrent, 9, &mut ids, &mut wide);
    assert_eq!(wide, [0, 1, 2, 3, 4, 5, -1, -1]);
}

fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
        })
        .collect()
}

/// Every level gives the same bits, on ragged shapes, decode and prefill.
#[test]
fn every_level_gives_the_same_bits() {
    for &(hq, n_kv, d, seq_len, n_q) in &[
        (4, 1, 8, 100, 1),
        (8, 2, 16, 300, 5),
        (6, 3, 5, 33, 2),
        (16, 1, 64, 1000, 3),
        (2, 2, 3, 20, 20),
    ] {
        let q = random(n_q * hq * d, 7 + seq_len as u64);
        let n_c = compressed_len(seq_len);
        let ck = random(n_c * n_kv * d, 11 + d as u64);
        let c = cfg(Pooling::Cuda, Keep::ThroughCurrent, 0, 0, 4);
        let nb = n_blocks(seq_len);
        let mut want = vec![0.0f32; n_q * n_kv * nb];
        block_scores_at(
            crate::simd::Isa::Scalar,
            Encoded::F32(&q),
            Encoded::F32(&ck),
            None,
            Heads {
                n_q_heads: hq,
                n_kv_heads: n_kv,
                d,
            },
            seq_len,
            &c,
            &mut want,
        )
        .unwrap();
        assert!(want.iter().any(|x| x.is_finite() && *x > 0.0) || nb < 2);
        for isa in isas_for_test() {
            let mut got = vec![0.0f32; want.len()];
            block_scores_at(
                isa,
                Encoded::F32(&q),
                Encoded::F32(&ck),
                None,
                Heads {
                    n_q_heads: hq,
                    n_kv_heads: n_kv,
                    d,
                },
                seq_len,
                &c,
                &mut got,
            )
            .unwrap();
            let (g, w): (Vec<u32>, Vec<u32>) = (
                got.iter().map(|x| x.to_bits()).collect(),
                want.iter().map(|x| x.to_bits()).collect(),
            );
            assert_eq!(g, w, "{isa:?} {hq} {n_kv} {d} {seq_len}");
        }
    }
}

/// One head, two visible keys: the softmax of the scaled logits, pooled.
#[test]
fn a_worked_example() {
    // d = 1, one head; 64 tokens: compressed keys 0..3 (n_c = 3), the query
    // at position 63 sees all three. Logits 0, ln 3, 0 (scale 1).
    let q = [1.0f32];
    let l3 = 3f32.ln();
    let ck = [0.0f32, l3, 0.0];
    let mut c = cfg(Pooling::Cuda, Keep::ThroughCurrent, 0, 0, 1);
    c.local_blocks = 0;
    let mut out = [0.0f32; 1];
    // Block 0 is the query's own block: forced.
    block_scores_into(
        Encoded::F32(&q),
        Encoded::F32(&ck),
        None,
        Heads {
            n_q_heads: 1,
            n_kv_heads: 1,
            d: 1,
        },
        64,
        &c,
        &mut out,
    )
    .unwrap();
    assert_eq!(out[0], f32::INFINITY);
    // 128 tokens: the query in block 1 sees 7 keys; block 0 pools keys 0..4.
    let ck: Vec<f32> = [0.0f32, l3, 0.0, 0.0, 0.0, 0.0, 0.0].to_vec();
    let mut out = [0.0f32; 2];
    block_scores_into(
        Encoded::F32(&q),
        Encoded::F32(&ck),
        None,
        Heads {
            n_q_heads: 1,
            n_kv_heads: 1,
            d: 1,
        },
        128,
        &c,
        &mut out,
    )
    .unwrap();
    // exp(ln 3) / (3 + 6) = 1/3.
    assert!((out[0] - 1.0 / 3.0).abs() < 1e-6, "{}", out[0]);
    assert_eq!(out[1], f32::INFINITY);
}

/// Each refusal names its argument and writes nothing.
#[test]
fn refusals_name_the_argument_and_write_nothing() {
    let (hq, n_kv, d, seq_len) = (4, 2, 8, 100);
    let q = random(hq * d, 3);
    let ck = random(compressed_len(seq_len) * n_kv * d, 5);
    let good = cfg(Pooling::Cuda, Keep::ThroughCurrent, 1, 2, 4);
    let nb = n_blocks(seq_len);
    let arg = |e: crate::ArgumentError| match e {
        crate::ArgumentError::Invalid { argument, .. }
        | crate::ArgumentError::Length { argument, .. }
        | crate::ArgumentError::OutputSize { argument, .. } => argument,
        other => panic!("{other:?}"),
    };
    let mut out = vec![7i32; n_kv * 4];
    let run = |q: &[f32], hq, ck: &[f32], n_kv, d, seq_len, c: Config, width: usize| {
        let mut o = vec![7i32; width];
        let r = select_into(
            Encoded::F32(q),
            Encoded::F32(ck),
            None,
            Heads {
                n_q_heads: hq,
                n_kv_heads: n_kv,
                d,
            },
            seq_len,
            &c,
            &mut o,
        );
        assert!(o.iter().all(|&x| x == 7));
        r.map_err(arg).unwrap_err()
    };
    assert_eq!(run(&q, 3, &ck, n_kv, d, seq_len, good, 8), "q");
    assert_eq!(run(&q, hq, &ck, n_kv, d, 0, good, 8), "seq_len");
    assert_eq!(run(&q, hq, &ck[1..], n_kv, d, seq_len, good, 8), "ck");
    assert_eq!(run(&q, hq, &ck, 0, d, seq_len, good, 8), "n_kv_heads");
    // The heads are read by name: `n_q_heads` and `n_kv_heads` swapped (2
    // query heads over 4 KV heads) are refused naming `q`, nothing written.
    let swapped = Heads {
        n_q_heads: n_kv,
        n_kv_heads: hq,
        d,
    };
    let mut o = vec![7i32; n_kv * 4];
    let e = select_into(
        Encoded::F32(&q),
        Encoded::F32(&ck),
        None,
        swapped,
        seq_len,
        &good,
        &mut o,
    )
    .unwrap_err();
    assert_eq!(e.argument(), "q");
    assert!(
        e.to_string()
            .contains("q's 2 heads are not a positive multiple of the 4 KV heads"),
        "{e}"
    );
    assert!(o.iter().all(|&x| x == 7));
    assert_eq!(run(&q, hq, &ck, n_kv, d, seq_len, good, 9), "out");
    assert_eq!(
        run(
            &q,
            hq,
            &ck,
            n_kv,
            d,
            seq_len,
            Config { top_k: 0, ..good },
            8
        ),
        "topk"
    );
    assert_eq!(
        run(
            &q,
            hq,
            &ck,
            n_kv,
            d,
            seq_len,
            Config {
                scale: f32::NAN,
                ..good
            },
            8
        ),
        "scale"
    );
    let odd = Geometry {
        block_size: 60,
        ..Geometry::MINICPM4
    };
    assert_eq!(
        run(
            &q,
            hq,
            &ck,
            n_kv,
            d,
            seq_len,
            Config {
                geometry: odd,
                ..good
            },
            8
        ),
        "block_size"
    );
    let zero = Geometry {
        kernel_stride: 0,
        ..Geometry::MINICPM4
    };
    assert_eq!(
        run(
            &q,
            hq,
            &ck,
            n_kv,
            d,
            seq_len,
            Config {
                geometry: zero,
                ..good
            },
            8
        ),
        "kernel_stride"
    );
    let two_q = [q.clone(), q.clone()].concat();
    assert_eq!(run(&two_q, hq, &[], n_kv, d, 1, good, 16), "q");
    select_into(
        Encoded::F32(&q),
        Encoded::F32(&ck),
        None,
        Heads {
            n_q_heads: hq,
            n_kv_heads: n_kv,
            d,
        },
        seq_len,
        &good,
        &mut out,
    )
    .unwrap();
    assert!(out.iter().all(|&x| (-1..nb as i32).contains(&x)));
}

/// A paged cache of compressed keys (pages of 3 keys, stored in reverse, an
/// f32 row per key) read at every level: each sequence's row is the dense
/// call's at the same level, bit for bit; a short table row is refused
/// before anything is written.
#[test]
fn paged_decode_equals_dense_at_every_level() {
    use crate::keys::{BlockTable, Format, PageLayout, PagedCache};
    let (hq, n_kv, d, page) = (8, 2, 16, 3);
    let lens = [1000usize, 20, 64, 130];
    let n_c: Vec<usize> = lens.iter().map(|&l| compressed_len(l)).collect();
    let per_seq = n_c.iter().map(|c| c.div_ceil(page)).max().unwrap();
    let n_pages = per_seq * lens.len();
    let ck = random(n_pages * page * n_kv * d, 5);
    // Sequence s's logical page b is physical page n_pages - 1 - (s * per_seq + b).
    let table: Vec<i32> = (0..lens.len() * per_seq)
        .map(|i| (n_pages - 1 - i) as i32)
        .collect();
    let bytes: Vec<u8> = ck.iter().flat_map(|x| x.to_le_bytes()).collect();
    let cache = PagedCache {
        bytes: &bytes,
        n_pages,
        page_stride: page * n_kv * d * 4,
        block_size: page,
        d: n_kv * d,
        layout: PageLayout::Dense(Format::F32),
    };
    let bt = BlockTable {
        table: &table,
        max_blocks: per_seq,
        seq_lens: &lens,
    };
    let q = random(lens.len() * hq * d, 9);
    let c = cfg(Pooling::Cuda, Keep::ThroughCurrent, 1, 2, 5);
    for isa in isas_for_test() {
        let mut got = vec![0i32; lens.len() * n_kv * 5];
        super::api::select_paged_at(
            isa,
            Encoded::F32(&q),
            &cache,
            &bt,
            Heads {
                n_q_heads: hq,
                n_kv_heads: n_kv,
                d,
            },
            &c,
            &mut got,
        )
        .unwrap();
        let width = c.geometry.n_blocks(lens.iter().copied().max().unwrap());
        let mut scores = vec![0.0f32; lens.len() * n_kv * width];
        super::api::block_scores_paged_at(
            isa,
            Encoded::F32(&q),
            &cache,
            &bt,
            Heads {
                n_q_heads: hq,
                n_kv_heads: n_kv,
                d,
            },
            &c,
            &mut scores,
        )
        .unwrap();
        for (s, (&len, &nc)) in lens.iter().zip(&n_c).enumerate() {
            let row = n_kv * d;
            let mut dense = vec![0.0f32; nc * row];
            for j in 0..nc {
                let p = n_pages - 1 - (s * per_seq + j / page);
                let at = (p * page + j % page) * row;
                dense[j * row..(j + 1) * row].copy_from_slice(&ck[at..at + row]);
            }
            let mut want = vec![0i32; n_kv * 5];
            super::api::select_at(
                isa,
                Encoded::F32(&q[s * hq * d..(s + 1) * hq * d]),
                Encoded::F32(&dense),
                None,
                Heads {
                    n_q_heads: hq,
                    n_kv_heads: n_kv,
                    d,
                },
                len,
                &c,
                &mut want,
            )
            .unwrap();
            assert_eq!(
                &got[s * n_kv * 5..(s + 1) * n_kv * 5],
                &want[..],
                "{isa:?} {s}"
            );
            // The paged block scores: the dense call's row bit for bit, then NaN.
            let nb = c.geometry.n_blocks(len);
            let mut want_scores = vec![0.0f32; n_kv * nb];
            super::api::block_scores_at(
                isa,
                Encoded::F32(&q[s * hq * d..(s + 1) * hq * d]),
                Encoded::F32(&dense),
                None,
                Heads {
                    n_q_heads: hq,
                    n_kv_heads: n_kv,
                    d,
                },
                len,
                &c,
                &mut want_scores,
            )
            .unwrap();
            for g in 0..n_kv {
                let row = &scores[(s * n_kv + g) * width..(s * n_kv + g + 1) * width];
                let want_row = &want_scores[g * nb..(g + 1) * nb];
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&row[..nb]), bits(want_row), "{isa:?} {s} {g}");
                assert!(row[nb..].iter().all(|x| x.is_nan()), "{isa:?} {s} {g}");
            }
        }
    }
    // A table row one page short for sequence 0's keys: refused, nothing written.
    let short = BlockTable {
        table: &table[..lens.len() * (per_seq - 1)],
        max_blocks: per_seq - 1,
        seq_lens: &lens,
    };
    let mut out = vec![7i32; lens.len() * n_kv * 5];
    let e = select_paged_into(
        Encoded::F32(&q),
        &cache,
        &short,
        Heads {
            n_q_heads: hq,
            n_kv_heads: n_kv,
            d,
        },
        &c,
        &mut out,
    )
    .unwrap_err();
    assert_eq!(e.argument(), "block_table");
    assert!(e.to_string().contains("61 compressed keys"), "{e}");
    assert!(out.iter().all(|&x| x == 7));
    let mut scores = vec![7.0f32; lens.len() * n_kv * 16];
    let e = super::block_scores_paged_into(
        Encoded::F32(&q),
        &cache,
        &short,
        Heads {
            n_q_heads: hq,
            n_kv_heads: n_kv,
            d,
        },
        &c,
        &mut scores,
    )
    .unwrap_err();
    assert_eq!(e.argument(), "block_table");
    assert!(scores.iter().all(|&x| x == 7.0));
}

#[derive(Clone, Copy, Debug)]
enum PageKind {
    F32,
    F32Misaligned,
    Bf16,
    Fp8Scaled,
}

/// The paged decode (its pages read in place, `paged::group_sums`) equals
/// the dense call on the same keys, bit for bit, at every level: float32,
/// a misaligned float32 cache, bfloat16, fp8 with scales; pages of 1, 3
/// and 16 keys, shuffled, another layer's bytes between them; groups of 1,
/// 2 and 16; both poolings and both keeps; sequences below the kernel (no
/// key), at it (one key) and past a page.
#[test]
fn paged_in_place_equals_dense_at_every_level() {
    use super::score::{group_sums, Packed, Scratch};
    use crate::keys::{BlockTable, Format, PageLayout, PagedCache};
    let mut seed = 77u64;
    let mut next = move || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        seed >> 33
    };
    let lens = [1000usize, 5, 31, 32, 300, 130];
    let n_c: Vec<usize> = lens.iter().map(|&l| compressed_len(l)).collect();
    assert_eq!(&n_c[1..4], &[0, 0, 1]);
    let (mut checked, mut sums_checked) = (0, 0);
    for kind in [
        PageKind::F32,
        PageKind::F32Misaligned,
        PageKind::Bf16,
        PageKind::Fp8Scaled,
    ] {
        for &(hq, n_kv, d, page) in &[
            (2usize, 2usize, 8usize, 1usize),
            (4, 2, 16, 3),
            (16, 1, 24, 16),
            (32, 2, 16, 3),
        ] {
            let row = n_kv * d;
            let per_page: Vec<usize> = n_c.iter().map(|c| c.div_ceil(page)).collect();
            let n_pages = per_page.iter().sum::<usize>() + 2;
            // Page `p` of the cache is the `perm[p]`-th handed out.
            let mut perm: Vec<usize> = (0..n_pages).collect();
            for i in (1..n_pages).rev() {
                perm.swap(i, next() as usize % (i + 1));
            }
            let max_blocks = per_page.iter().copied().max().unwrap_or(0) + 1;
            let mut table = vec![0i32; lens.len() * max_blocks];
            let total: usize = n_c.iter().sum();
            let vals = random(total * row, next());
            let bf: Vec<u16> = vals.iter().map(|x| (x.to_bits() >> 16) as u16).collect();
            // fp8 e4m3fn bytes, NaN (0x7f / 0xff) avoided.
            let fp8: Vec<u8> = (0..vals.len())
                .map(|_| match next() as u8 {
                    b if b & 0x7f == 0x7f => 0x3f,
                    b => b,
                })
                .collect();
            let scales: Vec<f32> = random(total, next())
                .iter()
                .map(|x| x.abs() + 0.01)
                .collect();
            let (elem, layout) = match kind {
                PageKind::F32 | PageKind::F32Misaligned => (4, PageLayout::Dense(Format::F32)),
                PageKind::Bf16 => (2, PageLayout::Dense(Format::Bf16)),
                PageKind::Fp8Scaled => (1, PageLayout::Fp8WithScales),
            };
            let scaled = matches!(kind, PageKind::Fp8Scaled);
            let page_bytes = page * row * elem + if scaled { 4 * page } else { 0 };
            let stride = page_bytes + 8; // another layer's bytes between pages
            let off = usize::from(matches!(kind, PageKind::F32Misaligned));
            let mut bytes = vec![0xabu8; off + n_pages * stride];
            let (mut handed, mut c0) = (0, 0);
            for (s, &c) in n_c.iter().enumerate() {
                for b in 0..c.div_ceil(page) {
                    let p = perm[handed];
                    handed += 1;
                    table[s * max_blocks + b] = p as i32;
                    let at = off + p * stride;
                    for r in 0..page.min(c - b * page) {
                        let j = c0 + b * page + r;
                        let el = &mut bytes[at + r * row * elem..at + (r + 1) * row * elem];
                        match kind {
                            PageKind::F32 | PageKind::F32Misaligned => el.copy_from_slice(
                                bytemuck::cast_slice(&vals[j * row..(j + 1) * row]),
                            ),
                            PageKind::Bf16 => el
                                .copy_from_slice(bytemuck::cast_slice(&bf[j * row..(j + 1) * row])),
                            PageKind::Fp8Scaled => {
                                el.copy_from_slice(&fp8[j * row..(j + 1) * row]);
                                let sa = at + page * row + 4 * r;
                                bytes[sa..sa + 4].copy_from_slice(&scales[j].to_le_bytes());
                            }
                        }
                    }
                }
                c0 += c;
            }
            let cache = PagedCache {
                bytes: &bytes[off..],
                n_pages,
                page_stride: stride,
                block_size: page,
                d: row,
                layout,
            };
            let bt = BlockTable {
                table: &table,
                max_blocks,
                seq_lens: &lens,
            };
            let q = random(lens.len() * hq * d, next());
            for pooling in [Pooling::Cuda, Pooling::Triton] {
                for keep in [Keep::ThroughCurrent, Keep::BeforeCurrent] {
                    let c = Config {
                        scale: 0.7,
                        ..cfg(pooling, keep, 1, 2, 4)
                    };
                    for isa in isas_for_test() {
                        let mut got = vec![9i32; lens.len() * n_kv * 4];
                        let qe = Encoded::F32(&q);
                        super::api::select_paged_at(
                            isa,
                            qe,
                            &cache,
                            &bt,
                            Heads {
                                n_q_heads: hq,
                                n_kv_heads: n_kv,
                                d,
                            },
                            &c,
                            &mut got,
                        )
                        .unwrap();
                        let mut c0 = 0;
                        for (s, (&len, &cn)) in lens.iter().zip(&n_c).enumerate() {
                            let qs = Encoded::F32(&q[s * hq * d..(s + 1) * hq * d]);
                            let keys = c0 * row..(c0 + cn) * row;
                            let (ck, sc) = match kind {
                                PageKind::F32 | PageKind::F32Misaligned => {
                                    (Encoded::F32(&vals[keys]), None)
                                }
                                PageKind::Bf16 => (Encoded::Bf16(&bf[keys]), None),
                                PageKind::Fp8Scaled => {
                                    (Encoded::Fp8E4m3(&fp8[keys]), Some(&scales[c0..c0 + cn]))
                                }
                            };
                            let mut want = vec![0i32; n_kv * 4];
                            super::api::select_at(
                                isa,
                                qs,
                                ck,
                                sc,
                                Heads {
                                    n_q_heads: hq,
                                    n_kv_heads: n_kv,
                                    d,
                                },
                                len,
                                &c,
                                &mut want,
                            )
                            .unwrap();
                            // Stage 1's group sums themselves, bit for bit.
                            if matches!((pooling, keep), (Pooling::Cuda, Keep::ThroughCurrent)) {
                                let mut dense = vec![0.0f32; cn * row];
                                ck.decode(0, &mut dense);
                                if let Some(sc) = sc {
                                    for (k, &m) in dense.chunks_exact_mut(row).zip(sc) {
                                        k.iter_mut().for_each(|x| *x *= m);
                                    }
                                }
                                let rows = BlockTable {
                                    table: &table,
                                    max_blocks,
                                    seq_lens: &n_c,
                                };
                                for g in 0..n_kv {
                                    let gh = hq / n_kv;
                                    let q0 = (s * hq + g * gh) * d;
                                    let packed = Packed::new(isa, &dense, cn, n_kv, g, d);
                                    let mut scr = Scratch::default();
                                    let qg = &q[q0..q0 + gh * d];
                                    group_sums(isa, qg, gh, d, &packed, cn, c.scale, &mut scr);
                                    let row = super::paged::Row {
                                        s,
                                        g,
                                        q0,
                                        heads: gh,
                                        d,
                                    };
                                    let bits = |v: &[f32]| {
                                        v.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
                                    };
                                    let got = super::paged::group_sums(
                                        isa, &q, &cache, &rows, row, cn, c.scale, bits,
                                    );
                                    assert_eq!(got, bits(&scr.sums), "{kind:?} {isa:?} {s} {g}");
                                    sums_checked += usize::from(cn > 0);
                                }
                            }
                            let r = s * n_kv * 4;
                            let what =
                                format!("{kind:?} {isa:?} {hq}/{n_kv} page {page} {c:?} {s}");
                            assert_eq!(&got[r..r + n_kv * 4], &want[..], "{what}");
                            c0 += cn;
                            checked += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 0 && sums_checked > 0);
}

/// Stage 1 with the heads in the lanes (`heads::group_sums`) equals the
/// packed form (`score::group_sums`) bit for bit at every level: groups of
/// 8 (one vector), 9 to 16 (two, lanes left empty), 17 to 33 (a second
/// chunk); key counts off the tiles (6 and 12 keys) and off 8 (the lane
/// sums' padding and the last keys' scalar group sum); keys past `n_vis`
/// present; logits that overflow to `±inf`, and NaN keys.
#[test]
fn heads_in_lanes_equal_the_packed_form_at_every_level() {
    use super::heads::{self, Rows};
    use super::score::{group_sums, Packed, Scratch};
    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    let mut seed = 40;
    for &heads in &[8usize, 9, 12, 16, 17, 24, 32, 33] {
        for &(d, n_vis, n_c) in &[
            (1usize, 1usize, 1usize),
            (2, 3, 9),
            (3, 9, 9),
            (6, 13, 20),
            (14, 40, 64),
            (7, 5, 9),
            (24, 6, 6),
            (16, 7, 20),
            (8, 12, 13),
            (24, 13, 13),
            (32, 31, 40),
            (128, 100, 100),
        ] {
            let n_kv = 3;
            seed += 1;
            let q = random(heads * d, seed);
            let mut ck = random(n_c * n_kv * d, seed + 1000);
            for special in 0..3 {
                let mut q = q.clone();
                match special {
                    // Huge queries: logits of ±inf in some rows.
                    1 => q.iter_mut().step_by(3).for_each(|x| *x *= 3e37),
                    // A NaN key element: that key's logit NaN in every head.
                    2 => ck[(n_vis / 2 * n_kv + 1) * d] = f32::NAN,
                    _ => {}
                }
                let g = 1;
                let packed = Packed::new(Isa::Scalar, &ck, n_c, n_kv, g, d);
                let mut want = Scratch::default();
                group_sums(Isa::Scalar, &q, heads, d, &packed, n_vis, 0.7, &mut want);
                for isa in isas_for_test() {
                    let mut got = Scratch::default();
                    let rows = Rows {
                        ck: &ck,
                        base: g * d,
                        stride: n_kv * d,
                    };
                    heads::group_sums(isa, &q, &[0], heads, d, rows, &[n_vis], 0.7, &mut got, &[]);
                    assert_eq!(
                        bits(&got.sums),
                        bits(&want.sums),
                        "{isa:?} heads={heads} d={d} n_vis={n_vis} special={special}"
                    );
                    // Reused scratch (a longer row before) gives the same.
                    heads::group_sums(isa, &q, &[0], heads, d, rows, &[n_vis], 0.7, &mut got, &[]);
                    assert_eq!(bits(&got.sums), bits(&want.sums), "{isa:?} reused");
                }
                if special == 0 {
                    assert!(want.sums.iter().all(|s| s.is_finite() && *s > 0.0));
                }
            }
        }
    }
}

/// Several queries in one chunk of heads (`heads::group_sums` with `qs` of
/// 2 to 4 queries, a group of 8 or 16) each equal the packed form on that
/// query alone, bit for bit at every level: each query seeing its own key
/// count (0, 1, off 8, off the tiles, a multiple of 8), so the vectors'
/// last keys (past their last whole 8) differ within a chunk; `d` a
/// multiple of 8 and not (the 8×8 query transposes and their tails); a
/// prefetch span given (`next`) that covers the queries themselves; an
/// infinite and a NaN query element (NaN sums: the layouts and the levels
/// may give NaNs of either sign — the portable level's `mul_add` is not the
/// hardware's — so a NaN is any NaN; every other bit is pinned).
#[test]
fn fused_heads_in_lanes_equal_the_packed_form_a_query_at_a_time() {
    use super::heads::{self, Rows};
    use super::score::{group_sums, Packed, Scratch};
    let bits = |x: &[f32]| {
        x.iter()
            .map(|v| if v.is_nan() { u32::MAX } else { v.to_bits() })
            .collect::<Vec<_>>()
    };
    let mut seed = 90;
    for &(heads, n_q) in &[(8usize, 4usize), (8, 3), (16, 2), (16, 1)] {
        for &(d, n_c) in &[(128usize, 70usize), (20, 29), (8, 17)] {
            for vis in [[n_c, n_c - 3, 0, 9], [8, 1, n_c, 16], [13, 13, 12, 5]] {
                let n_kv = 2;
                seed += 1;
                let mut q = random(n_q * heads * d, seed);
                let ck = random(n_c * n_kv * d, seed + 500);
                if seed % 2 == 0 {
                    q[d + 3] = f32::INFINITY;
                    q[heads * d / 2] = f32::NAN;
                }
                let qs: Vec<usize> = (0..n_q).map(|s| s * heads * d).collect();
                let n_vis = &vis[..n_q];
                let n_max = n_vis.iter().copied().max().unwrap();
                for g in 0..n_kv {
                    let packed = Packed::new(Isa::Scalar, &ck, n_c, n_kv, g, d);
                    let rows = Rows {
                        ck: &ck,
                        base: g * d,
                        stride: n_kv * d,
                    };
                    let mut first: Option<Vec<u32>> = None;
                    for isa in isas_for_test() {
                        let mut got = Scratch::default();
                        heads::group_sums(isa, &q, &qs, heads, d, rows, n_vis, 0.7, &mut got, &q);
                        match &first {
                            None => first = Some(bits(&got.sums)),
                            Some(f) => {
                                assert_eq!(&bits(&got.sums), f, "{isa:?} against the first level")
                            }
                        }
                        for (s, &n) in n_vis.iter().enumerate() {
                            let mut want = Scratch::default();
                            let qi = &q[s * heads * d..(s + 1) * heads * d];
                            group_sums(Isa::Scalar, qi, heads, d, &packed, n, 0.7, &mut want);
                            assert_eq!(
                                bits(&got.sums[s * n_max..s * n_max + n]),
                                bits(&want.sums),
                                "{isa:?} heads={heads} d={d} n_vis={n_vis:?} s={s} g={g}"
                            );
                        }
                    }
                }
            }
        }
    }
}

/// Stage 1 on keys packed in panels (`panels::group_sums`) equals the
/// packed form (`score::group_sums`) bit for bit at every level: groups of
/// 1, 2, 3, 5, 8, 16, 18 and 33 (the tiles' 2, 3, 4 or 8 heads and their
/// remainders); `d` off 8, 1, and of every remainder by 4 (the tiles take
/// four elements a trip, then the rest one at a time); key counts under
/// one vector, off 8 by every remainder, a
/// panel's last 1, 2 and 3 vectors, several panels, and
/// fewer than the panels hold (`n_vis < n`: the last vector's real keys
/// past `n_vis` masked); logits that overflow to `±inf`, a NaN key, and
/// every logit `−inf` or NaN (`m = −inf`: NaN sums, any NaN), a huge key
/// just past `n_vis` (the maxima folded into the tiles mask it); a scratch
/// reused after a longer call.
#[test]
fn panels_equal_the_packed_form_at_every_level() {
    use super::heads::Rows;
    use super::panels::{self, Panels};
    use super::score::{group_sums, Packed, Scratch};
    let bits = |x: &[f32]| {
        x.iter()
            .map(|v| if v.is_nan() { u32::MAX } else { v.to_bits() })
            .collect::<Vec<_>>()
    };
    let mut seed = 700;
    for &heads in &[1usize, 2, 3, 5, 8, 16, 18, 33] {
        for &(d, n_vis, n_c) in &[
            (1usize, 1usize, 1usize),
            (5, 2, 9),
            (9, 3, 3),
            (11, 12, 20),
            (4, 18, 19),
            (128, 66, 128),
            (2, 3, 9),
            (3, 9, 9),
            (6, 13, 20),
            (14, 40, 64),
            (7, 5, 9),
            (24, 6, 6),
            (16, 7, 30),
            (8, 24, 24),
            (13, 25, 48),
            (33, 47, 49),
            (12, 33, 40),
            (9, 57, 60),
            (16, 100, 130),
            (128, 64, 128),
            (128, 127, 128),
        ] {
            let n_kv = 3;
            seed += 1;
            let q = random(heads * d, seed);
            for special in 0..5 {
                let mut q = q.clone();
                let mut ck = random(n_c * n_kv * d, seed + 1000);
                match special {
                    // Huge queries: logits of ±inf in some rows.
                    1 => q.iter_mut().step_by(3).for_each(|x| *x *= 3e37),
                    // A NaN key element: that key's logit NaN in every head.
                    2 => ck[(n_vis / 2 * n_kv + 1) * d] = f32::NAN,
                    // Every logit NaN (`m = −inf`) in the first head.
                    3 => q[0] = f32::NAN,
                    // The first key past `n_vis` (in the last vector's
                    // padding lanes when `n_vis % 8 != 0`) huge: its logits
                    // would be the maxima were its lanes not masked.
                    4 if n_vis < n_c => ck[(n_vis * n_kv + 1) * d..][..d]
                        .iter_mut()
                        .for_each(|x| *x = x.signum() * 1e30),
                    _ => {}
                }
                let g = 1;
                let packed = Packed::new(Isa::Scalar, &ck, n_c, n_kv, g, d);
                let mut want = Scratch::default();
                group_sums(Isa::Scalar, &q, heads, d, &packed, n_vis, 0.7, &mut want);
                let rows = Rows {
                    ck: &ck,
                    base: g * d,
                    stride: n_kv * d,
                };
                // A reused buffer with other contents first.
                let panels = Panels::new_in(vec![5.0; 999], rows, n_c, d);
                for isa in isas_for_test() {
                    let mut got = Scratch::default();
                    // A longer call first: the scratch reused.
                    panels::group_sums(isa, &q, heads, d, &panels, n_c, 0.3, &mut got, &q);
                    panels::group_sums(isa, &q, heads, d, &panels, n_vis, 0.7, &mut got, &[]);
                    assert_eq!(
                        bits(&got.sums),
                        bits(&want.sums),
                        "{isa:?} heads={heads} d={d} n_vis={n_vis} special={special}"
                    );
                }
                if special == 0 || special == 4 {
                    assert!(want.sums.iter().all(|s| s.is_finite() && *s > 0.0));
                }
                if special == 3 {
                    assert!(want.sums.iter().all(|s| s.is_nan()));
                }
            }
            // No keys: empty sums.
            let panels = Panels::new_in(
                Vec::new(),
                Rows {
                    ck: &[0.0f32; 0],
                    base: 0,
                    stride: d,
                },
                0,
                d,
            );
            for isa in isas_for_test() {
                let mut got = Scratch::default();
                panels::group_sums(isa, &q, heads, d, &panels, 0, 0.7, &mut got, &[]);
                assert!(got.sums.is_empty());
            }
        }
    }
}

/// Bfloat16 keys packed into panels are their float32 values: the sums
/// equal those of the decoded keys bit for bit at every level.
#[test]
fn bf16_panels_equal_their_decoded_keys() {
    use super::heads::Rows;
    use super::panels::{self, Panels};
    use super::score::Scratch;
    let (heads, d, n_c, n_kv) = (16usize, 20usize, 50usize, 2usize);
    let q = random(heads * d, 3);
    let raw: Vec<u16> = random(n_c * n_kv * d, 4)
        .iter()
        .map(|x| (x.to_bits() >> 16) as u16)
        .collect();
    let dec: Vec<f32> = raw.iter().map(|&b| crate::keys::bf16_to_f32(b)).collect();
    for g in 0..n_kv {
        let (base, stride) = (g * d, n_kv * d);
        let pb = Panels::new_in(
            Vec::new(),
            Rows {
                ck: &raw,
                base,
                stride,
            },
            n_c,
            d,
        );
        let pf = Panels::new_in(
            Vec::new(),
            Rows {
                ck: &dec,
                base,
                stride,
            },
            n_c,
            d,
        );
        for isa in isas_for_test() {
            let (mut a, mut b) = (Scratch::default(), Scratch::default());
            panels::group_sums(isa, &q, heads, d, &pb, 41, 0.7, &mut a, &q);
            panels::group_sums(isa, &q, heads, d, &pf, 41, 0.7, &mut b, &[]);
            assert_eq!(a.sums.len(), 41);
            assert!(a
                .sums
                .iter()
                .zip(&b.sums)
                .all(|(x, y)| x.to_bits() == y.to_bits()));
        }
    }
}

/// The dense call's in-place path (a decode's few queries: the keys scored
/// where they lie, `paged::dense_group_sums`) equals its packed path (each
/// KV head's keys decoded and packed once), bit for bit, at every level:
/// float32, bfloat16 and float16 keys, fp8 with and without scales, float32
/// with scales; groups of 1, 2, 16 and 40 (two chunks of heads); `d` of 1,
/// 13 and 24 (tails off every vector); sequences of no key, one key, and
/// key counts off every tile and step; one to sixteen queries (the
/// several-query path: query counts off the chunks' lanes, a query that sees
/// no key, queries seeing different key counts); both poolings and both
/// keeps; tied keys, NaN and ±inf in the queries and the keys.
#[test]
fn dense_in_place_equals_packed_at_every_level() {
    use super::api::{select_at, FORCE_IN_PLACE};
    let mut seed = 91u64;
    let mut next = move || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        seed >> 33
    };
    // Both paths of one call at `isa`: (in place, packed).
    #[allow(clippy::too_many_arguments)]
    fn both<T: Default + Clone>(
        call: impl Fn(&mut [T]) -> Result<(), crate::ArgumentError>,
        len: usize,
    ) -> (Vec<T>, Vec<T>) {
        let mut out = [vec![T::default(); len], vec![T::default(); len]];
        for (o, force) in out.iter_mut().zip([true, false]) {
            FORCE_IN_PLACE.set(Some(force));
            let r = call(o);
            FORCE_IN_PLACE.set(None);
            r.unwrap();
        }
        let [a, b] = out;
        (a, b)
    }
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let mut checked = 0;
    // (the keys' format, scaled)
    let kinds: [(&str, bool); 6] = [
        ("f32", false),
        ("bf16", false),
        ("f16", false),
        ("fp8", false),
        ("fp8", true),
        ("f32", true),
    ];
    for (kind, scaled) in kinds {
        for &(hq, n_kv, d) in &[
            (2usize, 2usize, 13usize),
            (4, 2, 24),
            (16, 1, 1),
            (32, 2, 13),
            (40, 1, 24),
        ] {
            for &(seq_len, n_q) in &[
                (5usize, 1usize),
                (32, 1),
                (47, 2),
                (300, 3),
                (1000, 1),
                (1700, 5),
                // Several queries (a speculative decode's): counts off the
                // chunks' 32 lanes and off the steps of 96 keys, a query
                // that sees no key (34 tokens, 4 queries), queries that
                // see different key counts.
                (34, 4),
                (700, 2),
                (1580, 7),
                (1551, 8),
                (2000, 9),
                (3100, 16),
            ] {
                let n_c = compressed_len(seq_len);
                let mut q = random(n_q * hq * d, next());
                let mut vals = random(n_c * n_kv * d, next());
                // Ties: a run of keys equal to key 0 (equal logits, equal
                // sums), some all-zero queries (uniform rows).
                for j in 1..n_c.min(9) {
                    let (a, b) = vals.split_at_mut(j * n_kv * d);
                    b[..n_kv * d].copy_from_slice(&a[..n_kv * d]);
                }
                if hq > 2 {
                    q[d..2 * d].fill(0.0);
                }
                // NaN and ±inf: in a query row and in keys (float formats).
                let special = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY];
                if next() % 2 == 0 && n_q * hq > 3 {
                    q[3 * d + d / 2] = special[next() as usize % 3];
                }
                for _ in 0..(n_c / 100).min(3) {
                    let at = next() as usize % vals.len();
                    vals[at] = special[next() as usize % 3];
                }
                let bf: Vec<u16> = vals.iter().map(|x| (x.to_bits() >> 16) as u16).collect();
                // float16 bits below 2 in magnitude (subnormals among
                // them), a NaN or ±inf now and then.
                let hf: Vec<u16> = (0..vals.len())
                    .map(|_| match next() as u16 {
                        b if b % 331 == 0 => [0x7e00, 0x7c00, 0xfc00][usize::from(b) % 3],
                        b => b & 0xbfff,
                    })
                    .collect();
                // fp8 e4m3fn bytes of every value, NaN (0x7f / 0xff) one
                // time in four it comes up.
                let fp8: Vec<u8> = (0..vals.len())
                    .map(|_| match next() as u8 {
                        b if b & 0x7f == 0x7f && next() % 4 != 0 => 0x3f,
                        b => b,
                    })
                    .collect();
                let scales: Vec<f32> = random(n_c, next())
                    .iter()
                    .map(|x| x.abs() * 3.0 + 0.01)
                    .collect();
                let ck = match kind {
                    "f32" => Encoded::F32(&vals),
                    "bf16" => Encoded::Bf16(&bf),
                    "f16" => Encoded::F16(&hf),
                    _ => Encoded::Fp8E4m3(&fp8),
                };
                let sc = scaled.then_some(&scales[..]);
                let qe = Encoded::F32(&q);
                for pooling in [Pooling::Cuda, Pooling::Triton] {
                    for keep in [Keep::ThroughCurrent, Keep::BeforeCurrent] {
                        let mut c = cfg(pooling, keep, 1, 2, 3);
                        c.scale = 0.3;
                        let nb = n_blocks(seq_len);
                        let (sn, kn) = (n_q * n_kv * nb, n_q * n_kv * 3);
                        let mut first: Option<(Vec<u32>, Vec<i32>)> = None;
                        for isa in isas_for_test() {
                            let (a, b) = both(
                                |o: &mut [f32]| {
                                    block_scores_at(
                                        isa,
                                        qe,
                                        ck,
                                        sc,
                                        Heads {
                                            n_q_heads: hq,
                                            n_kv_heads: n_kv,
                                            d,
                                        },
                                        seq_len,
                                        &c,
                                        o,
                                    )
                                },
                                sn,
                            );
                            assert_eq!(
                                bits(&a),
                                bits(&b),
                                "scores: {kind} scaled {scaled}, {hq}/{n_kv} heads, d {d}, \
                                 {seq_len} tokens, {n_q} queries, {pooling:?} {keep:?}, {isa:?}"
                            );
                            let (ra, rb) = both(
                                |o: &mut [i32]| {
                                    select_at(
                                        isa,
                                        qe,
                                        ck,
                                        sc,
                                        Heads {
                                            n_q_heads: hq,
                                            n_kv_heads: n_kv,
                                            d,
                                        },
                                        seq_len,
                                        &c,
                                        o,
                                    )
                                },
                                kn,
                            );
                            assert_eq!(
                                ra, rb,
                                "rows: {kind} scaled {scaled}, {hq}/{n_kv} heads, d {d}, \
                                 {seq_len} tokens, {n_q} queries, {pooling:?} {keep:?}, {isa:?}"
                            );
                            // And the level does not change them.
                            match &first {
                                None => first = Some((bits(&a), ra)),
                                Some((s, r)) => {
                                    assert_eq!(s, &bits(&a), "scores across levels at {isa:?}");
                                    assert_eq!(r, &ra, "rows across levels at {isa:?}");
                                }
                            }
                            checked += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(checked >= 6 * 5 * 12 * 4, "{checked} calls checked");
}

/// The probes' compressed keys: `n_c` rows of `row` random float32s, the
/// same values cut to bfloat16 bits and to fp8 e4m3 codes (no NaN), and a
/// positive scale a row.
fn probe_keys(n_c: usize, row: usize) -> (Vec<f32>, Vec<u16>, Vec<u8>, Vec<f32>) {
    let vals = random(n_c * row, 3);
    let bf = vals.iter().map(|x| (x.to_bits() >> 16) as u16).collect();
    let fp8 = vals
        .iter()
        .map(|x| ((x.to_bits() >> 24) as u8) & 0xbf)
        .collect();
    let scales = random(n_c, 4).iter().map(|x| x.abs() + 0.01).collect();
    (vals, bf, fp8, scales)
}

/// Not a check: the measurement behind `api::in_place` (docs/infllm.md,
/// "Dense decode"). Each path forced on the same keys, interleaved, at
/// MiniCPM4-like shapes (`d = 128`, groups 16, 8, 2 and 1 over 2 KV heads,
/// 131,072 and 8,192 tokens, float32 / bfloat16 / fp8 with scales, 1 to 64
/// queries); prints `in place / packed` medians in ms. Run one thread:
/// `RAYON_NUM_THREADS=1 cargo test --release --lib in_place_threshold_probe
/// -- --ignored --nocapture`.
#[test]
#[ignore]
fn in_place_threshold_probe() {
    use super::api::{select_at, FORCE_IN_PLACE};
    let d = 128;
    for &(hq, n_kv) in &[(32usize, 2usize), (16, 2), (4, 2), (2, 2)] {
        for &seq_len in &[131_072usize, 8192] {
            let n_c = compressed_len(seq_len);
            let (vals, bf, fp8, scales) = probe_keys(n_c, n_kv * d);
            for kind in ["f32", "bf16", "fp8s"] {
                let (ck, sc) = match kind {
                    "f32" => (Encoded::F32(&vals), None),
                    "bf16" => (Encoded::Bf16(&bf), None),
                    _ => (Encoded::Fp8E4m3(&fp8), Some(&scales[..])),
                };
                let mut line = format!("hq {hq} kv {n_kv} L {seq_len} {kind}:");
                for n_q in [1usize, 2, 4, 8, 16, 32, 64] {
                    let q = random(n_q * hq * d, 7);
                    let c = Config::minicpm4(d);
                    let mut out = vec![0i32; n_q * n_kv * 64];
                    let mut t = [Vec::new(), Vec::new()];
                    let reps = if seq_len > 10000 { 5 } else { 9 };
                    for _ in 0..reps {
                        for (k, f) in [true, false].into_iter().enumerate() {
                            FORCE_IN_PLACE.set(Some(f));
                            let t0 = std::time::Instant::now();
                            select_at(
                                Isa::best(),
                                Encoded::F32(&q),
                                ck,
                                sc,
                                Heads {
                                    n_q_heads: hq,
                                    n_kv_heads: n_kv,
                                    d,
                                },
                                seq_len,
                                &c,
                                &mut out,
                            )
                            .unwrap();
                            t[k].push(t0.elapsed().as_secs_f64() * 1e3);
                            FORCE_IN_PLACE.set(None);
                        }
                    }
                    for v in t.iter_mut() {
                        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
                    }
                    let (a, b) = (t[0][t[0].len() / 2], t[1][t[1].len() / 2]);
                    line += &format!(" q{n_q} {a:.2}/{b:.2}={:.2}", a / b);
                }
                println!("{line}");
            }
        }
    }
}

/// Not a check: the several-query in-place path
/// (`paged::dense_group_sums_queries`, the keys read once) against each
/// query on its own (`paged::dense_group_sums`, the keys read a query), on
/// one KV head of MiniCPM4-like keys (`d = 128`, 2 KV heads, 131,072
/// tokens); prints both medians in ms. Run one thread:
/// `RAYON_NUM_THREADS=1 cargo test --release --lib several_queries_probe
/// -- --ignored --nocapture`.
#[test]
#[ignore]
fn several_queries_probe() {
    use super::paged::{dense_group_sums, dense_group_sums_queries, Dense, Row};
    let (d, n_kv, seq_len) = (128usize, 2usize, 131_072usize);
    let n_c = compressed_len(seq_len);
    let (vals, bf, fp8, scales) = probe_keys(n_c, n_kv * d);
    for heads in [16usize, 2] {
        for kind in ["f32", "bf16", "fp8s"] {
            let keys = match kind {
                "f32" => Dense {
                    ck: Encoded::F32(&vals),
                    scales: None,
                    row: n_kv * d,
                },
                "bf16" => Dense {
                    ck: Encoded::Bf16(&bf),
                    scales: None,
                    row: n_kv * d,
                },
                _ => Dense {
                    ck: Encoded::Fp8E4m3(&fp8),
                    scales: Some(&scales[..]),
                    row: n_kv * d,
                },
            };
            let mut line = format!("group {heads} {kind}:");
            for n_q in [1usize, 2, 4, 8, 16] {
                let q = random(n_q * heads * d, 7);
                let q0s: Vec<usize> = (0..n_q).map(|i| i * heads * d).collect();
                let n_vis = vec![n_c; n_q];
                let mut out = vec![0.0f32; n_q * n_c];
                let mut t = [Vec::new(), Vec::new()];
                for _ in 0..7 {
                    let t0 = std::time::Instant::now();
                    for &q0 in &q0s {
                        let row = Row {
                            s: 0,
                            g: 0,
                            q0,
                            heads,
                            d,
                        };
                        dense_group_sums(Isa::best(), &q, keys, row, n_c, 0.1, |s| s[0]);
                    }
                    t[0].push(t0.elapsed().as_secs_f64() * 1e3);
                    let t0 = std::time::Instant::now();
                    dense_group_sums_queries(
                        Isa::best(),
                        &q,
                        keys,
                        0,
                        &q0s,
                        heads,
                        d,
                        &n_vis,
                        0.1,
                        &mut out,
                        n_c,
                    );
                    t[1].push(t0.elapsed().as_secs_f64() * 1e3);
                }
                for v in t.iter_mut() {
                    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
                }
                let (a, b) = (t[0][3], t[1][3]);
                line += &format!(" q{n_q} {a:.2}/{b:.2}={:.2}", b / a);
            }
            println!("{line}");
        }
    }
}

/// The several-query in-place path (`api::run_queries`) at groups whose
/// heads straddle the vectors (3, 5, 6, 7: a vector holds the heads of two
/// or three queries, a query's heads two vectors), 2 to 16 queries seeing
/// one or two key counts or none, against the packed path, bit for bit.
#[test]
fn several_queries_of_odd_groups_equal_the_packed_form() {
    use super::api::{select_at, FORCE_IN_PLACE};
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let mut seed = 301u64;
    let mut checked = 0;
    // MiniCPM4's geometry (a decode's queries see one or two key counts)
    // and a key every 2 tokens (up to 9 counts among 16 queries).
    let small = Geometry {
        block_size: 8,
        kernel_size: 4,
        kernel_stride: 2,
    };
    for (geometry, group, n_kv, d) in [
        (Geometry::MINICPM4, 3usize, 1usize, 5usize),
        (Geometry::MINICPM4, 5, 2, 9),
        (Geometry::MINICPM4, 6, 1, 16),
        (Geometry::MINICPM4, 7, 3, 3),
        (Geometry::MINICPM4, 3, 2, 8),
        (small, 3, 1, 5),
        (small, 1, 2, 8),
        (small, 2, 1, 7),
        (small, 5, 1, 4),
    ] {
        let hq = group * n_kv;
        for &(seq_len, n_q) in &[
            (34usize, 3usize),
            (47, 2),
            (63, 5),
            (129, 16),
            (200, 7),
            (415, 11),
            (1000, 9),
            (40, 20),
        ] {
            seed += 1;
            let n_c = geometry.compressed_len(seq_len);
            let q = random(n_q * hq * d, seed);
            let vals = random(n_c * n_kv * d, seed + 1000);
            let heads = Heads {
                n_q_heads: hq,
                n_kv_heads: n_kv,
                d,
            };
            let mut c = cfg(Pooling::Cuda, Keep::ThroughCurrent, 1, 2, 3);
            c.scale = 0.3;
            c.geometry = geometry;
            let nb = geometry.n_blocks(seq_len);
            for isa in isas_for_test() {
                let mut s = [vec![0f32; n_q * n_kv * nb], vec![0f32; n_q * n_kv * nb]];
                let mut r = [vec![0i32; n_q * n_kv * 3], vec![0i32; n_q * n_kv * 3]];
                for (k, force) in [true, false].into_iter().enumerate() {
                    FORCE_IN_PLACE.set(Some(force));
                    let qe = Encoded::F32(&q);
                    let ck = Encoded::F32(&vals);
                    let a = block_scores_at(isa, qe, ck, None, heads, seq_len, &c, &mut s[k]);
                    let b = select_at(isa, qe, ck, None, heads, seq_len, &c, &mut r[k]);
                    FORCE_IN_PLACE.set(None);
                    a.unwrap();
                    b.unwrap();
                }
                let msg = format!("{geometry:?} group {group}, {n_kv} KV heads, d {d}, {seq_len} tokens, {n_q} queries, {isa:?}");
                assert_eq!(bits(&s[0]), bits(&s[1]), "scores: {msg}");
                assert_eq!(r[0], r[1], "rows: {msg}");
                checked += 1;
            }
        }
    }
    assert!(checked >= 72, "{checked}");
}

/// The staged chunks at every level on the shapes their 512-bit kernels
/// take apart: a 16-lane chunk whose 512-bit vector holds two queries of a
/// group of 8 seeing different key counts (its bulk of exponentials only
/// below the smaller count, not a multiple of 8), 32-lane chunks of groups
/// of 8 and 16 with mixed counts, and `d` of 40 and 128 (bfloat16 rows
/// widened 16 at a time, then a tail), against each query's packed form,
/// bit for bit.
#[test]
fn staged_chunks_of_mixed_counts_equal_the_packed_form_at_every_level() {
    use super::paged::{dense_group_sums_queries, Dense};
    use super::score::{group_sums, Packed, Scratch};
    let mut checked = 0;
    for &(heads, ref n_vis) in &[
        (8usize, vec![13usize, 21]),
        (8, vec![21, 13]),
        (8, vec![13, 21, 21, 30]),
        (16, vec![37, 40]),
        (8, vec![7, 100]),
    ] {
        for d in [40usize, 128] {
            let n_kv = 2;
            let n_c = n_vis.iter().copied().max().unwrap();
            let vals = random(n_c * n_kv * d, (heads * d) as u64);
            let bf: Vec<u16> = vals.iter().map(|x| (x.to_bits() >> 16) as u16).collect();
            let dec: Vec<f32> = bf.iter().map(|&b| crate::keys::bf16_to_f32(b)).collect();
            let q = random(n_vis.len() * heads * d, 5);
            let q0s: Vec<usize> = (0..n_vis.len()).map(|i| i * heads * d).collect();
            for (kind, ck, want_keys) in [
                ("f32", Encoded::F32(&vals), &vals),
                ("bf16", Encoded::Bf16(&bf), &dec),
            ] {
                let keys = Dense {
                    ck,
                    scales: None,
                    row: n_kv * d,
                };
                for g in 0..n_kv {
                    let packed = Packed::new(Isa::Scalar, want_keys, n_c, n_kv, g, d);
                    for isa in isas_for_test() {
                        let mut out = vec![f32::NAN; n_vis.len() * n_c];
                        dense_group_sums_queries(
                            isa, &q, keys, g, &q0s, heads, d, n_vis, 0.3, &mut out, n_c,
                        );
                        for (s, &n) in n_vis.iter().enumerate() {
                            let mut sc = Scratch::default();
                            let qs = &q[q0s[s]..][..heads * d];
                            group_sums(Isa::Scalar, qs, heads, d, &packed, n, 0.3, &mut sc);
                            let got: Vec<u32> =
                                out[s * n_c..][..n].iter().map(|x| x.to_bits()).collect();
                            let want: Vec<u32> = sc.sums[..n].iter().map(|x| x.to_bits()).collect();
                            assert_eq!(
                                got,
                                want,
                                "{} {kind}: heads {heads}, d {d}, counts {n_vis:?}, query {s}, KV head {g}",
                                isa.level().name()
                            );
                            checked += 1;
                        }
                    }
                }
            }
        }
    }
    // 12 queries, 2 d, 2 formats, 2 KV heads, at each level.
    assert_eq!(checked, 12 * 2 * 2 * 2 * isas_for_test().len());
}
