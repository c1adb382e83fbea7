//! The kernels against each other.

use super::*;
use crate::keys::Encoded;

/// xorshift values in [-2, 2) with a full mantissa.
fn source(seed: u64) -> impl FnMut() -> f32 {
    let mut state = seed | 1;
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        ((state >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
    }
}

fn same(x: f32, y: f32) -> bool {
    x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())
}

const SHAPES: [(usize, usize); 10] = [
    (1, 1),
    (3, 7),
    (8, 16),
    (9, 33),
    (64, 128),
    (12, 24),
    (6, 8),
    (17, 5),
    (4, 16),
    (13, 31),
];

/// Every level's transpose is the same exact decode and copy:
/// `kt[i · BLOCK + r] = k_r[i]`, zero in the lanes past the block's keys,
/// for every key format (all 256 fp8 bytes, NaN among them, and random
/// 16-bit patterns), on ragged `d` and partial blocks.
#[test]
fn every_level_decodes_and_transposes_a_block_exactly() {
    let mut next = source(0x51ED_2701);
    let mut bits = source(0xB175);
    for &(_, d) in &SHAPES {
        for n in [BLOCK, 1, 7, 16, 17, 31] {
            let f32s: Vec<f32> = (0..n * d).map(|_| next()).collect();
            let u16s: Vec<u16> = (0..n * d).map(|_| (bits().to_bits() >> 7) as u16).collect();
            let mut fp8: Vec<u8> = (0..n * d).map(|i| (i * 37 + n) as u8).collect();
            let finite: Vec<u8> = fp8
                .iter()
                .map(|&b| if b & 0x7F == 0x7F { 0x12 } else { b })
                .collect();
            fp8[0] = 0xFF; // a NaN in every block
            let encodings = [
                Encoded::F32(&f32s),
                Encoded::Bf16(&u16s),
                Encoded::F16(&u16s),
                Encoded::Fp8E4m3(&fp8),
                Encoded::Fp8E4m3(&finite),
            ];
            for enc in encodings {
                let mut rows = vec![0.0f32; n * d];
                enc.decode(0, &mut rows);
                let mut want = vec![f32::NAN; d * BLOCK];
                transpose(
                    Isa::Scalar,
                    Src::new(Isa::Scalar, enc),
                    d,
                    &mut want,
                    &mut Vec::new(),
                );
                for i in 0..d {
                    for r in 0..BLOCK {
                        let x = if r < n { rows[r * d + i] } else { 0.0 };
                        assert!(
                            same(want[i * BLOCK + r], x),
                            "portable {:?} d={d} n={n} ({i}, {r})",
                            enc.format()
                        );
                    }
                }
                for level in [
                    crate::simd::avx2_for_test().map(Isa::Avx2),
                    crate::simd::avx512_for_test().map(Isa::Avx512),
                ]
                .into_iter()
                .flatten()
                {
                    let mut got = vec![f32::NAN; d * BLOCK];
                    transpose(level, Src::new(level, enc), d, &mut got, &mut Vec::new());
                    let ok = got
                        .iter()
                        .zip(&want)
                        .all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(ok, "{level:?} {:?} d={d} n={n}", enc.format());
                }
            }
        }
    }
}

/// Every head's elements have their own slots in each layout's tiles: the
/// layout is a permutation of `0 .. h · d`, and loading puts `q_h[i]` there.
#[test]
fn the_query_tiles_are_a_permutation() {
    for tiles in [Tiles::Eights, Tiles::Twelves, Tiles::Sixes] {
        for &(h, d) in &SHAPES {
            let mut seen = vec![false; h * d];
            for head in 0..h {
                let (base, stride) = slot(tiles, h, d, head);
                for i in 0..d {
                    assert!(
                        !std::mem::replace(&mut seen[base + i * stride], true),
                        "{tiles:?} h={h} d={d}"
                    );
                }
            }
            let values: Vec<f32> = (0..h * d).map(|x| x as f32).collect();
            let mut q = Query::new(h, d, Isa::Scalar);
            q.tiles = tiles;
            q.load(&Encoded::F32(&values), &vec![1.0; h], 0, false);
            for head in 0..h {
                let (base, stride) = slot(tiles, h, d, head);
                for i in 0..d {
                    assert_eq!(q.qt[base + i * stride], (head * d + i) as f32);
                }
            }
        }
    }
}

/// The query `q[head][i]` (row-major `h × d`) with weights `w`, laid out for
/// the kernel of `level`.
fn laid_out(level: Isa, h: usize, d: usize, q: &[f32], w: &[f32]) -> Query {
    let mut query = Query::new(h, d, level);
    query.load(&Encoded::F32(q), w, 0, false);
    query
}

/// The AVX-512, AVX2 and portable kernels give the same bits on ragged
/// shapes (every remainder of the AVX2 kernel's 6-head tiles among them),
/// NaN, infinities and signed zeros included, and the portable one is the
/// scalar rule written out: each dot one FMA chain over `i` in order, the
/// heads folded in order.
#[test]
fn every_level_scores_bit_identically() {
    let Some(token) = crate::simd::avx2_for_test() else {
        return;
    };
    let mut next = source(0x9E37_79B9_7F4A_7C15);
    let more = [
        (2, 9),
        (5, 16),
        (7, 3),
        (10, 8),
        (11, 17),
        (15, 4),
        (32, 64),
        (20, 6),
        (28, 9),
    ];
    for &(h, d) in SHAPES.iter().chain(&more) {
        for trial in 0..20 {
            let qs: Vec<f32> = (0..h * d).map(|_| next()).collect();
            let mut kt: Vec<f32> = (0..d * BLOCK).map(|_| next()).collect();
            match trial {
                3 => kt[5] = f32::NAN,
                4 => kt[(BLOCK + 2) % (d * BLOCK)] = f32::INFINITY,
                5 => kt.iter_mut().for_each(|x| *x = (*x * 2.0).round() * 0.0), // ±0.0
                6 => kt.iter_mut().step_by(3).for_each(|x| *x = (*x).round()),
                _ => {}
            }
            let w: Vec<f32> = (0..h).map(|_| next()).collect();
            let q = laid_out(Isa::Scalar, h, d, &qs, &w);
            let mut want = [0.0f32; BLOCK];
            portable::weighted_relu_sums::<true>(q.tiles, &q.qt, &kt, &w, d, &mut want);
            for (r, &got) in want.iter().enumerate() {
                let mut s = 0.0f32;
                for (head, wh) in w.iter().enumerate() {
                    let mut dot = 0.0f32;
                    for i in 0..d {
                        dot = qs[head * d + i].mul_add(kt[i * BLOCK + r], dot);
                    }
                    s = wh.mul_add(if dot <= 0.0 { 0.0 } else { dot }, s);
                }
                assert!(same(s, got), "portable h={h} d={d} key {r}");
            }
            let avx2 = Isa::Avx2(token);
            let mut got = [0.0f32; BLOCK];
            let q2 = laid_out(avx2, h, d, &qs, &w);
            weighted_relu_sums(avx2, &q2, &q2.qt, &kt, &mut got, &[]);
            for (r, (x, y)) in got.iter().zip(&want).enumerate() {
                assert!(same(*x, *y), "AVX2 h={h} d={d} key {r}");
            }
            if let Some(t) = crate::simd::avx512_for_test() {
                let wide = Isa::Avx512(t);
                let mut got = [0.0f32; BLOCK];
                let q5 = laid_out(wide, h, d, &qs, &w);
                weighted_relu_sums(wide, &q5, &q5.qt, &kt, &mut got, &[]);
                for (r, (x, y)) in got.iter().zip(&want).enumerate() {
                    assert!(same(*x, *y), "AVX-512 h={h} d={d} key {r}");
                }
            }
        }
    }
}

/// A NaN dot product stays NaN through the ReLU on every level (it must not
/// join the zero plateau), and a negative one is exactly `+0.0` weight.
#[test]
fn the_relu_keeps_nan_and_zeroes_negatives_on_every_level() {
    let (h, d) = (2, 3);
    let mut kt = vec![0.0f32; d * BLOCK];
    kt[0] = f32::NAN; // key 0: NaN dot
    kt[1] = -1.0; // key 1: negative dot
    kt[2] = 2.0; // key 2: positive dot
    for level in crate::simd::isas_for_test() {
        let q = laid_out(level, h, d, &[1.0; 6], &[1.0, 0.5]);
        let mut acc = [0.0f32; BLOCK];
        weighted_relu_sums(level, &q, &q.qt, &kt, &mut acc, &[]);
        assert!(acc[0].is_nan(), "{level:?}");
        assert_eq!(acc[1].to_bits(), 0.0f32.to_bits(), "{level:?}");
        assert_eq!(acc[2], 3.0, "{level:?}");
    }
}

/// The AVX2 transpose of fp8 keys read as `2⁻⁸ ×` their values (`scaled`)
/// is the portable transpose `× 2⁻⁸`, bit for bit, on all 256 bytes (NaN
/// among them: the same NaN bits), with and without the NaN-free decode,
/// on ragged `d` and partial blocks (the ragged edge's load included).
#[test]
fn the_scaled_fp8_transpose_is_the_decode_times_two_to_the_minus_eight_on_every_byte() {
    let Some(token) = crate::simd::avx2_for_test() else {
        return;
    };
    let level = Isa::Avx2(token);
    for d in [1, 3, 7, 8, 9, 16, 31, 128] {
        for n in [BLOCK, 1, 7, 9, 31] {
            for shift in 0..256usize.div_ceil(n * d).max(1) {
                let all: Vec<u8> = (0..n * d).map(|i| (i + shift * n * d) as u8).collect();
                let no_nan: Vec<u8> = all.iter().map(|&b| b & !1).collect(); // 0x7F, 0xFF → 0x7E, 0xFE
                for bytes in [&all, &no_nan] {
                    let enc = Encoded::Fp8E4m3(bytes);
                    let mut want = vec![f32::NAN; d * BLOCK];
                    transpose(
                        Isa::Scalar,
                        Src::new(Isa::Scalar, enc),
                        d,
                        &mut want,
                        &mut Vec::new(),
                    );
                    let src = Src {
                        scaled: true,
                        ..Src::new(level, enc)
                    };
                    #[cfg(target_arch = "x86_64")]
                    assert_eq!(src.finite, bytes.iter().all(|b| b & 0x7F != 0x7F));
                    let mut got = vec![f32::NAN; d * BLOCK];
                    transpose(level, src, d, &mut got, &mut Vec::new());
                    for (i, (x, y)) in got.iter().zip(&want).enumerate() {
                        let y = if y.is_nan() { *y } else { y / 256.0 };
                        assert!(y.is_nan() || y * 256.0 == want[i], "not exact");
                        assert_eq!(x.to_bits(), y.to_bits(), "d={d} n={n} at {i}");
                    }
                }
            }
        }
    }
}

/// A call's scores of fp8 keys (every byte, NaN among them, with scales)
/// are the same bits on every level, the AVX2 level reading them scaled
/// against the folded query; a query whose fold would overflow (`|q| ·
/// 2⁸` past `f32::MAX`) takes the unscaled decode and scores the same too,
/// and a later load of the same `Query` folds afresh.
#[test]
fn fp8_scores_are_the_same_bits_on_every_level_folded_or_not() {
    let mut next = source(0xF8F8_2727);
    let levels: Vec<Isa> = crate::simd::isas_for_test();
    for &(h, d) in &SHAPES {
        let t = 256 + 37;
        let bytes: Vec<u8> = (0..t * d).map(|i| (i * 7 + i / 256) as u8).collect();
        let scale: Vec<f32> = (0..t).map(|_| next()).collect();
        let w: Vec<f32> = (0..h).map(|_| next()).collect();
        let mut qs: Vec<Vec<f32>> = (0..3)
            .map(|_| (0..h * d).map(|_| next() * 1e3).collect())
            .collect();
        qs[2][0] = f32::MAX / 100.0; // `× 2⁸` overflows: no fold for the group
        for (case, group) in [&qs[..2], &qs[1..]].into_iter().enumerate() {
            let mut want: Vec<Vec<f32>> = Vec::new();
            for (li, &level) in levels.iter().enumerate() {
                let queries: Vec<Query> =
                    group.iter().map(|q| laid_out(level, h, d, q, &w)).collect();
                if matches!(level, Isa::Avx2(_)) {
                    let folds = fp8_folded(level, Encoded::Fp8E4m3(&bytes), &queries);
                    assert_eq!(folds.is_some(), case == 0, "h={h} d={d} case {case}");
                }
                let mut rows = vec![vec![0.0f32; t]; group.len()];
                let mut outs: Vec<&mut [f32]> = rows.iter_mut().map(|r| &mut r[..]).collect();
                let keys = Keys::new(Encoded::Fp8E4m3(&bytes), Some(&scale));
                let (mut g, mut c) = (vec![0.0f32; t], vec![0.0f32; t]);
                let terms = KeyTerms {
                    g: &mut g,
                    c: &mut c,
                    screen: None,
                };
                score_keys(
                    level,
                    &queries,
                    keys,
                    0,
                    &mut outs,
                    Want::Terms(terms),
                    &mut Scratch::new(d),
                );
                // The bound terms are the decoded keys' (a folded AVX2
                // block's `2⁻⁸` undone), whatever the level: each block of
                // BLOCK keys the largest |k| times the largest |c| (so at
                // least each key's own |c_t| max |k_t|).
                let mut row = vec![0.0f32; d];
                for b0 in (0..t).step_by(BLOCK) {
                    let keys = b0..(b0 + BLOCK).min(t);
                    let (mut m, mut nan) = (0.0f32, false);
                    for r in keys.clone() {
                        Encoded::Fp8E4m3(&bytes).decode(r * d, &mut row);
                        m = row.iter().fold(m, |a, x| a.max(x.abs()));
                        nan |= row.iter().any(|x| x.is_nan());
                    }
                    let cmax = scale[keys.clone()]
                        .iter()
                        .fold(0.0f32, |a, x| a.max(x.abs()));
                    let want_g = match nan {
                        true => f32::NAN,
                        false => crate::indexer::exact::up32(f64::from(m) * f64::from(cmax)),
                    };
                    for r in keys {
                        assert_eq!(g[r].to_bits(), want_g.to_bits(), "{level:?} key {r}");
                        assert_eq!(c[r], cmax);
                    }
                }
                if li == 0 {
                    want = rows;
                    continue;
                }
                for (j, (a, b)) in rows.iter().zip(&want).enumerate() {
                    for (r, (x, y)) in a.iter().zip(b).enumerate() {
                        assert!(
                            same(*x, *y),
                            "{level:?} h={h} d={d} case {case} q {j} key {r}"
                        );
                    }
                }
            }
        }
    }
    // A reloaded query folds its new values, not the old ones.
    #[cfg(target_arch = "x86_64")]
    if let Some(token) = crate::simd::avx2_for_test() {
        let level = Isa::Avx2(token);
        let mut q = laid_out(level, 1, 2, &[1.0, 2.0], &[1.0]);
        assert_eq!(q.fp8_folded(), Some(&[256.0, 512.0][..]));
        q.load(&Encoded::F32(&[3.0, f32::MAX]), &[1.0], 0, false);
        assert_eq!(q.fp8_folded(), None);
        q.load(&Encoded::F32(&[3.0, 4.0]), &[1.0], 0, false);
        assert_eq!(q.fp8_folded(), Some(&[768.0, 1024.0][..]));
    }
}

/// Every bfloat16 and float16 bit pattern (all 65,536, NaNs and
/// subnormals among them) goes through each level's transpose — the AVX2
/// one's 16-bit tiles and its 8 × 8 edges — to the portable decode's bits.
#[test]
fn every_16_bit_pattern_transposes_to_the_scalar_decode_on_every_level() {
    let levels: Vec<Isa> = [
        crate::simd::avx2_for_test().map(Isa::Avx2),
        crate::simd::avx512_for_test().map(Isa::Avx512),
    ]
    .into_iter()
    .flatten()
    .collect();
    let all: Vec<u16> = (0..=u16::MAX).collect();
    // d 128: 16-bit tiles only; d 40: two of them and an 8 × 8 edge; d 9:
    // edges only. 32 keys a block, the last block partial.
    for d in [128, 40, 9] {
        for block in all.chunks(BLOCK * d) {
            let n = block.len() / d;
            let block = &block[..n * d];
            for enc in [Encoded::Bf16(block), Encoded::F16(block)] {
                let mut want = vec![f32::NAN; d * BLOCK];
                transpose(
                    Isa::Scalar,
                    Src::new(Isa::Scalar, enc),
                    d,
                    &mut want,
                    &mut Vec::new(),
                );
                for &level in &levels {
                    let mut got = vec![f32::NAN; d * BLOCK];
                    let src = Src::new(level, enc);
                    transpose(level, src, d, &mut got, &mut Vec::new());
                    let ok = got
                        .iter()
                        .zip(&want)
                        .all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(ok, "{level:?} {:?} d={d} n={n}", enc.format());
                }
            }
        }
    }
}

/// Runs the indexer's kernel families (`indexer.transpose`,
/// `indexer.weighted_relu_sums`) once at `isa`: the reach test's probe.
pub(super) fn probe(isa: Isa) {
    let (h, d) = (2, 8);
    // A query no bfloat16 holds (0.5 + 2⁻²⁰), so that the pair level, too,
    // hands every block to `indexer.weighted_relu_sums`: 8 such products
    // per head sum exactly to 4 + 2⁻¹⁷, and 1.5 times that is a float32.
    let x = 0.5 + 2f32.powi(-20);
    let q = laid_out(isa, h, d, &[x; 16], &[1.0, 0.5]);
    let keys = vec![1.0f32; 40 * d];
    let mut out = [0.0f32; 40];
    let mut scratch = Scratch::new(d);
    let keys = Keys::new(Encoded::F32(&keys), None);
    let (mut g, mut c) = ([0.0f32; 40], [0.0f32; 40]);
    let terms = KeyTerms {
        g: &mut g,
        c: &mut c,
        screen: None,
    };
    score_keys(
        isa,
        &[q],
        keys,
        0,
        &mut [&mut out[..]],
        Want::Terms(terms),
        &mut scratch,
    );
    assert!(out.iter().all(|&s| s == 6.0 + 1.5 * 2f32.powi(-17)));
    assert!(g.iter().zip(&c).all(|(&g, &c)| g == 1.0 && c == 1.0));
}

/// Activation none (MiniMax's MSA): every level runs each key's scalar chain
/// `s = fma(w_h, dot_h, s)` without the ReLU, bit for bit — negative, NaN,
/// infinite and signed-zero dot products included.
#[test]
fn activation_none_gives_the_scalar_chain_bit_for_bit_on_every_level() {
    let mut state = 0x51ED_2701_A5A5_0F0Fu64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
    };
    for &(h, d) in &[(1, 1), (3, 7), (4, 128), (5, 16), (6, 9), (8, 33), (13, 5)] {
        for trial in 0..12 {
            let qs: Vec<f32> = (0..h * d).map(|_| next()).collect();
            let mut kt: Vec<f32> = (0..d * BLOCK).map(|_| next()).collect();
            match trial {
                3 => kt[5] = f32::NAN,
                4 => kt[(BLOCK + 2) % (d * BLOCK)] = f32::NEG_INFINITY,
                5 => kt.iter_mut().for_each(|x| *x = (*x * 2.0).round() * 0.0),
                _ => {}
            }
            let w: Vec<f32> = (0..h).map(|_| next()).collect();
            let mut want = [0.0f32; BLOCK];
            for (r, s) in want.iter_mut().enumerate() {
                for (head, wh) in w.iter().enumerate() {
                    let mut dot = 0.0f32;
                    for i in 0..d {
                        dot = qs[head * d + i].mul_add(kt[i * BLOCK + r], dot);
                    }
                    *s = wh.mul_add(dot, *s);
                }
            }
            for level in crate::simd::isas_for_test() {
                let mut q = laid_out(level, h, d, &qs, &w);
                q.relu = false;
                let mut got = [0.0f32; BLOCK];
                weighted_relu_sums(level, &q, &q.qt, &kt, &mut got, &[]);
                for (r, (x, y)) in got.iter().zip(&want).enumerate() {
                    assert!(same(*x, *y), "{level:?} h={h} d={d} key {r}: {x} vs {y}");
                }
            }
        }
    }
}
