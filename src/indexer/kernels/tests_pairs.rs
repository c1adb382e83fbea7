//! The pair level ([`super::pairs`]) through its software model: the
//! float32 kernel's bits on every block it admits, the fallback taken
//! exactly where the instruction's flushes could act.

use super::pairs::{self, dp_model, min_exponent, QueryPairs};
use super::*;
use crate::keys::Encoded;

/// xorshift, 64 bits.
fn rng(seed: u64) -> impl FnMut() -> u64 {
    let mut state = seed | 1;
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    }
}

/// A float32 cut to its upper half: exactly a bfloat16.
fn bf16(x: f32) -> f32 {
    f32::from_bits(x.to_bits() & 0xFFFF_0000)
}

/// A bfloat16 with a random sign and mantissa and an exponent in `lo ..= hi`.
fn bf16_in(next: &mut impl FnMut() -> u64, lo: i32, hi: i32) -> f32 {
    let x = next();
    let e = (lo + (x % (hi - lo + 1) as u64) as i32 + 127) as u32;
    f32::from_bits(((x >> 20) as u32 & 0x8000_0000) | (e << 23) | ((x >> 8) as u32 & 0x007F_0000))
}

fn same(x: f32, y: f32) -> bool {
    x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())
}

/// The portable kernel's and the model's sums of one block, forced (no
/// admission asked): `(float32, pairs)`.
fn both(h: usize, d: usize, qs: &[f32], kt: &[f32], w: &[f32], relu: bool) -> [[f32; BLOCK]; 2] {
    both_with(PairRun::Model, h, d, qs, kt, w, relu)
}

/// The pair runs this CPU can test: the model everywhere, the instruction
/// where the CPU has it (skipped visibly elsewhere).
fn runs() -> Vec<PairRun> {
    #[allow(unused_mut)]
    let mut runs = vec![PairRun::Model];
    #[cfg(target_arch = "x86_64")]
    runs.extend(crate::simd::avx512bf16_for_test().map(PairRun::Hw));
    runs
}

/// [`both`] with the pairs run by `run`.
fn both_with(
    run: PairRun,
    h: usize,
    d: usize,
    qs: &[f32],
    kt: &[f32],
    w: &[f32],
    relu: bool,
) -> [[f32; BLOCK]; 2] {
    let mut q = Query::new(h, d, Isa::Scalar);
    q.load(&Encoded::F32(qs), w, 0, false);
    q.relu = relu;
    let mut want = [0.0f32; BLOCK];
    weighted_relu_sums(Isa::Scalar, &q, &q.qt, kt, &mut want, &[]);
    let mut kp = vec![0u32; d / 2 * BLOCK];
    pairs::pack_block(kt, d, &mut kp);
    let mut got = [0.0f32; BLOCK];
    pair_sums(run, &q, &kp, &mut got, &[]);
    [want, got]
}

/// On values where neither flush can act the model is two float32 FMAs,
/// the high halves first (the order the layout relies on).
#[test]
fn the_model_is_two_fmas_high_half_first_on_normal_values() {
    let mut next = rng(0xD0B1_F16A);
    for _ in 0..200_000 {
        let v: [f32; 4] = std::array::from_fn(|_| bf16_in(&mut next, -40, 40));
        let acc =
            f32::from_bits(next() as u32 & 0x8000_0000 | 0x3000_0000) * (next() % 1000) as f32;
        let (a, b) = (pairs::pack(v[0], v[1]), pairs::pack(v[2], v[3]));
        let want = v[1].mul_add(v[3], v[0].mul_add(v[2], acc));
        assert!(same(dp_model(acc, a, b), want), "{v:?} {acc}");
    }
    // The order shows: 2⁴⁰ − 2⁴⁰ + 1 is 1 high half first, 0 the other way.
    let (big, one) = (2f32.powi(40), 1.0f32);
    let a = pairs::pack(big, one);
    let b = pairs::pack(1.0, 1.0);
    assert_eq!(dp_model(-big, a, b), 1.0);
    assert_eq!(dp_model(-big, pairs::pack(one, big), b), 0.0);
}

/// Denormals are zeros on the inputs and the accumulator; a tiny result is
/// flushed with tininess after rounding — including `2⁻¹²⁶ − 2⁻¹⁵⁰`,
/// which IEEE's gradual underflow rounds up to the normal `2⁻¹²⁶`.
#[test]
fn the_model_flushes_as_the_instruction_does() {
    let tiny_bf16 = f32::from_bits(0x0001_0000); // a subnormal bfloat16
    let one = pairs::pack(1.0, 0.0);
    // DAZ on an input: the subnormal times 2¹⁰⁰ would be a normal float.
    let a = pairs::pack(tiny_bf16, 0.0);
    assert_eq!(dp_model(0.0, a, pairs::pack(2f32.powi(100), 0.0)), 0.0);
    assert!(tiny_bf16.mul_add(2f32.powi(100), 0.0) > 0.0);
    // DAZ on the accumulator: a subnormal accumulator plus 0 × 0 is +0,
    // a negative one plus −0 × 0 twice is −0 (the zero keeps its sign).
    let sub = f32::from_bits(1);
    assert_eq!(dp_model(sub, 0, 0).to_bits(), 0);
    let neg = pairs::pack(-0.0, -0.0);
    assert_eq!(dp_model(-sub, neg, 0).to_bits(), (-0.0f32).to_bits());
    assert_eq!((-0.0f32).mul_add(0.0, -sub), -sub, "without DAZ it stays");
    // FTZ, tininess after rounding.
    let (p, q) = (2f32.powi(-75), -(2f32.powi(-75)));
    let r = dp_model(f32::MIN_POSITIVE, pairs::pack(p, 0.0), pairs::pack(q, 0.0));
    assert_eq!(r.to_bits(), 0, "2⁻¹²⁶ − 2⁻¹⁵⁰ is tiny: flushed");
    assert_eq!(
        p.mul_add(q, f32::MIN_POSITIVE),
        f32::MIN_POSITIVE,
        "IEEE rounds it up"
    );
    // A subnormal result of an FMA is flushed to a zero of its sign.
    let r = dp_model(
        0.0,
        pairs::pack(-(2f32.powi(-70)), -0.0),
        pairs::pack(2f32.powi(-70), 0.0),
    );
    assert_eq!(r.to_bits(), (-0.0f32).to_bits());
    // Overflow rounds to infinity; NaN and infinities are IEEE's.
    let m = bf16(f32::MAX);
    assert_eq!(dp_model(f32::MAX, pairs::pack(m, 0.0), one), f32::INFINITY);
    assert!(dp_model(0.0, pairs::pack(f32::INFINITY, 0.0), 0).is_nan());
    assert!(dp_model(f32::NAN, one, one).is_nan());
    assert_eq!(
        dp_model(1.0, pairs::pack(f32::NEG_INFINITY, 0.0), one),
        f32::NEG_INFINITY
    );
}

/// The exponent summary: bfloat16-exact values only, subnormals refused,
/// zeros, infinities and NaN not counted.
#[test]
fn the_exponent_summary_reads_bfloat16_values_only() {
    assert_eq!(
        min_exponent([1.0f32, 0.5, -0.0, f32::INFINITY, f32::NAN].map(f32::to_bits)),
        Some(-1)
    );
    assert_eq!(min_exponent([0.0f32].map(f32::to_bits)), Some(i32::MAX / 4));
    assert_eq!(
        min_exponent([1.0f32 + f32::EPSILON].map(f32::to_bits)),
        None
    );
    assert_eq!(min_exponent([0x0001_0000u32]), None, "a subnormal bfloat16");
    assert_eq!(min_exponent([f32::MIN_POSITIVE.to_bits()]), Some(-126));
    assert!(pairs::admits(Some(-56), Some(-56)));
    assert!(!pairs::admits(Some(-56), Some(-57)));
    assert!(!pairs::admits(None, Some(0)) && !pairs::admits(Some(0), None));
}

/// The AVX-512 pack (its summary in the same pass) gives the portable
/// body's pairs and summary on blocks of bfloat16 values of every exponent,
/// with zeros, infinities, NaN, subnormals and values below bfloat16's
/// precision planted one at a time or together.
#[cfg(target_arch = "x86_64")]
#[test]
fn the_vector_pack_gives_the_portable_pairs_and_summary() {
    let Some(t) = crate::simd::avx512_for_test() else {
        return;
    };
    let _ = t;
    let mut next = rng(0x9AC4_B10C);
    let mut seen = std::collections::HashSet::new();
    for case in 0..4000 {
        let d = [2, 6, 32, 64, 128, 130][case % 6];
        let (lo, hi) = [(-126, 127), (-10, 8), (-60, -50), (-126, -120)][case / 6 % 4];
        let mut kt: Vec<f32> = (0..d * BLOCK).map(|_| bf16_in(&mut next, lo, hi)).collect();
        let planted = [
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::from_bits(0x0001_0000),
            f32::from_bits(0x8070_0000),
            f32::from_bits(0x807F_0000),
            f32::MIN_POSITIVE,
            1.0 + f32::EPSILON,
            f32::from_bits(0x7F80_0001),
        ];
        for _ in 0..next() % 4 {
            let at = (next() % (d * BLOCK) as u64) as usize;
            kt[at] = planted[(next() % planted.len() as u64) as usize];
        }
        if case % 50 == 0 {
            kt.iter_mut().for_each(|x| *x = 0.0);
        }
        let (mut want, mut got) = (vec![0u32; d / 2 * BLOCK], vec![7u32; d / 2 * BLOCK]);
        let summary = pairs::pack_block_body(&kt, &mut want);
        assert_eq!(summary, min_exponent(kt.iter().map(|x| x.to_bits())));
        assert_eq!(
            pairs::pack_block(&kt, d, &mut got),
            summary,
            "case {case}, d {d}"
        );
        assert_eq!(got, want, "case {case}, d {d}");
        seen.insert(summary.map(|e| e.min(1000)));
    }
    // The cases reach a refusal, no exponent, and exponents down to -126.
    assert!(seen.contains(&None) && seen.contains(&Some(1000)) && seen.contains(&Some(-126)));
}

/// The query's pairs sit where the pair kernel reads them: pair `i` of
/// head `head` at `slot(Eights, h, d / 2, head)`, dimension `2i` high.
#[test]
fn the_query_pairs_are_laid_out_in_tiles_of_eights() {
    for (h, d) in [(1, 2), (3, 8), (9, 16), (13, 30), (64, 128)] {
        let qs: Vec<f32> = (0..h * d).map(|x| x as f32).collect();
        for level in crate::simd::isas_for_test() {
            let mut q = Query::new(h, d, level);
            q.load(&Encoded::F32(&qs), &vec![1.0; h], 0, false);
            let p = QueryPairs::new(q.tiles, h, d, &q.qt);
            for head in 0..h {
                let (base, stride) = slot(Tiles::Eights, h, d / 2, head);
                for i in 0..d / 2 {
                    let e = qs[head * d + 2 * i];
                    let o = qs[head * d + 2 * i + 1];
                    assert_eq!(p.qp[base + i * stride], pairs::pack(e, o), "h={h} d={d}");
                }
            }
        }
    }
}

/// The existing kernel tests' inputs, cut to bfloat16 (random values in
/// [-2, 2), a NaN, an infinity, signed zeros, integers; ragged head counts,
/// even `d`): the model's pair kernel gives the portable kernel's bits,
/// with the ReLU and without.
#[test]
fn the_pair_kernel_gives_the_float32_bits_on_the_kernel_tests_inputs() {
    let mut next = rng(0x9E37_79B9_7F4A_7C15);
    let mut uniform = move || ((next() >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0;
    let shapes = [
        (1, 2),
        (3, 8),
        (8, 16),
        (9, 32),
        (64, 128),
        (12, 24),
        (6, 8),
        (17, 4),
        (13, 30),
        (5, 16),
        (32, 64),
    ];
    for &(h, d) in &shapes {
        for trial in 0..20 {
            let qs: Vec<f32> = (0..h * d).map(|_| bf16(uniform())).collect();
            let mut kt: Vec<f32> = (0..d * BLOCK).map(|_| bf16(uniform())).collect();
            match trial {
                3 => kt[5] = f32::NAN,
                4 => kt[(BLOCK + 2) % (d * BLOCK)] = f32::INFINITY,
                5 => kt.iter_mut().for_each(|x| *x = (*x * 2.0).round() * 0.0), // ±0.0
                6 => kt.iter_mut().step_by(3).for_each(|x| *x = (*x).round()),
                7 => kt[0] = f32::NEG_INFINITY,
                _ => {}
            }
            let w: Vec<f32> = (0..h).map(|_| uniform()).collect();
            let qsum = min_exponent(qs.iter().map(|x| x.to_bits()));
            let ksum = min_exponent(kt.iter().map(|x| x.to_bits()));
            assert!(pairs::admits(ksum, qsum), "h={h} d={d} trial {trial}");
            for relu in [true, false] {
                for run in runs() {
                    let [want, got] = both_with(run, h, d, &qs, &kt, &w, relu);
                    for (r, (x, y)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            same(*x, *y),
                            "h={h} d={d} trial {trial} relu {relu} key {r}"
                        );
                    }
                }
            }
        }
    }
}

/// Scores `t` keys of `enc` (scaled by `scale`) for `queries`, through
/// `score_keys` with the model's pair run and without: the two score sets
/// and how many (query, block) pairs ran in pairs.
#[allow(clippy::too_many_arguments)]
fn scored(
    pair: PairRun,
    h: usize,
    d: usize,
    qs: &[Vec<f32>],
    w: &[f32],
    enc: Encoded<'_>,
    scale: Option<&[f32]>,
    t: usize,
) -> (Vec<Vec<f32>>, Vec<Vec<f32>>, usize) {
    let run = |pairs: Option<PairRun>| {
        let queries: Vec<Query> = qs
            .iter()
            .map(|q| {
                let mut query = Query::new(h, d, Isa::Scalar);
                query.load(&Encoded::F32(q), w, 0, false);
                query
            })
            .collect();
        let mut rows = vec![vec![0.0f32; t]; qs.len()];
        let mut outs: Vec<&mut [f32]> = rows.iter_mut().map(|r| &mut r[..]).collect();
        let keys = Keys::new(enc, scale);
        let n = score_keys_in(
            Isa::Scalar,
            pairs,
            &queries,
            keys,
            0,
            &mut outs,
            Want::Scores,
            &mut Scratch::new(d),
        );
        (rows, n)
    };
    let (want, none) = run(None);
    assert_eq!(none, 0);
    let (got, paired) = run(Some(pair));
    (want, got, paired)
}

/// fp8 keys, all 256 codes in every lane (NaN among them), with scales,
/// against fp8 and bfloat16 queries: every block runs in pairs (fp8 keys
/// always qualify against fp8 queries), bit for bit the float32 scores.
#[test]
fn every_fp8_code_in_every_lane_scores_the_float32_bits_in_pairs() {
    let mut next = rng(0xF8F8_0256);
    let (d, blocks) = (16, 16);
    let t = BLOCK * blocks;
    // Key `r` of block `b`, dimension `i`: code `i + 16 b + r`: every lane
    // (`r mod 32`) sees all 256 codes over the blocks and dimensions.
    let bytes: Vec<u8> = (0..t * d)
        .map(|x| {
            let (key, i) = (x / d, x % d);
            (i + 16 * (key / BLOCK) + key % BLOCK) as u8
        })
        .collect();
    let scale: Vec<f32> = (0..t)
        .map(|_| (next() % 1000) as f32 / 64.0 - 7.0)
        .collect();
    for h in [1, 4, 9, 64] {
        let w: Vec<f32> = (0..h).map(|_| (next() % 200) as f32 / 16.0 - 6.0).collect();
        let mut fp8_query = vec![0.0f32; h * d];
        let codes: Vec<u8> = (0..h * d).map(|_| next() as u8 & !0x80 | 0x08).collect();
        Encoded::Fp8E4m3(&codes).decode(0, &mut fp8_query);
        let bf16_query: Vec<f32> = (0..h * d).map(|_| bf16_in(&mut next, -20, 20)).collect();
        let qs = vec![fp8_query, bf16_query];
        for run in runs() {
            let (want, got, paired) = scored(
                run,
                h,
                d,
                &qs,
                &w,
                Encoded::Fp8E4m3(&bytes),
                Some(&scale),
                t,
            );
            assert_eq!(
                paired,
                2 * blocks,
                "h={h}: every block of both queries in pairs"
            );
            for (j, (a, b)) in got.iter().zip(&want).enumerate() {
                for (r, (x, y)) in a.iter().zip(b).enumerate() {
                    assert!(same(*x, *y), "h={h} query {j} key {r}: {x} vs {y}");
                }
            }
        }
    }
}

/// bfloat16 keys and queries on both sides of the exponent condition: a
/// block whose smallest key exponent plus the query's smallest is `−112`
/// runs in pairs, `−113` falls back (so does a block holding a subnormal
/// or a query not exactly bfloat16); every score is the float32 kernel's.
/// Forced past the condition (exponents in `[−80, −60]` on both sides),
/// the pair kernel differs from the float32 one: the fallback is needed.
#[test]
fn the_fallback_is_taken_exactly_where_the_flushes_could_act() {
    let mut next = rng(0xE7E7_0112);
    let (h, d) = (8, 32);
    let blocks = 6;
    let t = BLOCK * blocks;
    let w: Vec<f32> = (0..h).map(|_| bf16_in(&mut next, -2, 2)).collect();
    let mut qs: Vec<f32> = (0..h * d).map(|_| bf16_in(&mut next, -56, -40)).collect();
    qs[3] = 2f32.powi(-56); // the query's smallest exponent: −56
    let mut keys: Vec<f32> = (0..t * d).map(|_| bf16_in(&mut next, -50, -30)).collect();
    // Block 1: smallest key exponent −56 (sum −112, admitted); block 2:
    // −57 (sum −113, refused); block 3: a subnormal key element (refused);
    // block 4: ±0, NaN, ±inf (admitted); blocks 0 and 5: plain (admitted).
    keys[BLOCK * d + 7] = -(2f32.powi(-56));
    keys[2 * BLOCK * d + 9] = 2f32.powi(-57);
    keys[3 * BLOCK * d + 11] = f32::from_bits(0x0001_0000);
    for (x, v) in keys[4 * BLOCK * d..].iter_mut().zip([
        0.0,
        -0.0,
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
    ]) {
        *x = v;
    }
    let u16s: Vec<u16> = keys.iter().map(|x| (x.to_bits() >> 16) as u16).collect();
    let mut not_bf16 = qs.clone();
    not_bf16[0] = f32::from_bits(not_bf16[0].to_bits() | 1);
    let queries = vec![qs.clone(), not_bf16];
    for run in runs() {
        let (want, got, paired) = scored(run, h, d, &queries, &w, Encoded::Bf16(&u16s), None, t);
        assert_eq!(
            paired, 4,
            "blocks 0, 1, 4, 5 of the first query; none of the second"
        );
        for (j, (a, b)) in got.iter().zip(&want).enumerate() {
            for (r, (x, y)) in a.iter().zip(b).enumerate() {
                assert!(same(*x, *y), "{run:?} query {j} key {r}: {x} vs {y}");
            }
        }
    }
    // Forced: the refused blocks' inputs do reach the flushes.
    let mut differ = 0;
    for _ in 0..20 {
        let qs: Vec<f32> = (0..h * d).map(|_| bf16_in(&mut next, -80, -60)).collect();
        let kt: Vec<f32> = (0..d * BLOCK)
            .map(|_| bf16_in(&mut next, -80, -60))
            .collect();
        let [want, got] = both(h, d, &qs, &kt, &w, false);
        differ += got
            .iter()
            .zip(&want)
            .filter(|(x, y)| !same(**x, **y))
            .count();
    }
    assert_eq!(
        differ,
        20 * BLOCK,
        "every score differs once the flushes act"
    );
    // A subnormal key element, forced: DAZ reads it as zero.
    let mut kt = vec![0.0f32; d * BLOCK];
    kt[0] = f32::from_bits(0x0001_0000);
    let [want, got] = both(1, d, &[2f32.powi(100); 32], &kt, &[1.0], false);
    assert!(want[0] > 0.0 && got[0] == 0.0);
}

/// The rows' transpose into pairs (512-bit shuffles where the CPU has
/// AVX-512) is the pair-at-a-time body's, on every even `d` shape: a
/// partial 16-pair tile, one pair, many tiles; NaN payloads moved intact.
#[test]
fn the_rows_transpose_is_the_pair_at_a_time_one() {
    #[cfg(target_arch = "x86_64")]
    let _ = crate::simd::avx512_for_test();
    let mut next = rng(0x7A25_0DD5);
    for d in [2, 6, 30, 32, 34, 128, 130, 256] {
        let rows: Vec<u16> = (0..BLOCK * d).map(|_| next() as u16).collect();
        let (mut want, mut got) = (vec![0u32; d / 2 * BLOCK], vec![7u32; d / 2 * BLOCK]);
        pairs::transpose_rows_body(&rows, d, &mut want);
        pairs::transpose_rows(&rows, d, &mut got);
        assert_eq!(got, want, "d={d}");
        let (r, i) = ((next() % BLOCK as u64) as usize, d / 2 - 1);
        assert_eq!(
            want[i * BLOCK + r],
            u32::from(rows[r * d + 2 * i]) << 16 | u32::from(rows[r * d + 2 * i + 1])
        );
    }
}

/// The pair level's rows path (bfloat16 and fp8 keys moved straight into
/// pairs, [`pairs::transpose_rows`]) gives the float32 path's scores and
/// the exact selection's bound terms (`g`, `c`) from the rows' largest
/// magnitude: whole and partial blocks, scales of both signs (a NaN scale
/// in one block), blocks with a NaN or an infinity (scored the float32
/// way: their terms NaN or infinite as the transpose's).
#[test]
fn the_rows_path_gives_the_scores_and_terms_of_the_transpose() {
    let mut next = rng(0x7E2A_5011);
    let h = 9;
    for (d, t) in [32, 2, 130]
        .into_iter()
        .flat_map(|d| [BLOCK * 5, BLOCK * 4 + 7, 13].map(|t| (d, t)))
    {
        let w: Vec<f32> = (0..h).map(|_| bf16_in(&mut next, -2, 2)).collect();
        let qs = [
            (0..h * d)
                .map(|_| bf16_in(&mut next, -6, 3))
                .collect::<Vec<f32>>(),
            (0..h * d).map(|_| bf16_in(&mut next, -3, 1)).collect(),
        ];
        let mut scale: Vec<f32> = (0..t).map(|_| bf16_in(&mut next, -4, 4)).collect();
        if t > 3 * BLOCK {
            scale[2 * BLOCK + 5] = f32::NAN;
        }
        let mut keys: Vec<f32> = (0..t * d).map(|_| bf16_in(&mut next, -9, 8)).collect();
        if t > 4 * BLOCK {
            keys[3 * BLOCK * d + 40] = f32::NAN;
            keys[4 * BLOCK * d + 3] = f32::NEG_INFINITY;
        }
        let bf16s: Vec<u16> = keys.iter().map(|x| (x.to_bits() >> 16) as u16).collect();
        // Codes of every value but NaN, a NaN planted where the keys
        // hold theirs.
        let mut codes: Vec<u8> = (0..t * d)
            .map(|_| match next() as u8 {
                c if c & 0x7F == 0x7F => c ^ 1,
                c => c,
            })
            .collect();
        if t > 4 * BLOCK {
            codes[3 * BLOCK * d + 40] = 0xFF;
        }
        // The blocks the rows path must take: all but those with a NaN or
        // an infinity (fp8 has no infinity).
        let blocks = t.div_ceil(BLOCK);
        let taken = match t > 4 * BLOCK {
            true => [blocks - 2, blocks - 1],
            false => [blocks, blocks],
        };
        for (enc, taken) in [Encoded::Bf16(&bf16s), Encoded::Fp8E4m3(&codes)]
            .into_iter()
            .zip(taken)
        {
            for run in runs() {
                let score = |pairs: Option<PairRun>| {
                    let queries: Vec<Query> = qs
                        .iter()
                        .map(|q| {
                            let mut query = Query::new(h, d, Isa::Scalar);
                            query.load(&Encoded::F32(q), &w, 0, false);
                            query
                        })
                        .collect();
                    let mut rows = vec![vec![0.0f32; t]; qs.len()];
                    let mut outs: Vec<&mut [f32]> = rows.iter_mut().map(|r| &mut r[..]).collect();
                    let (mut g, mut c) = (vec![0.0f32; t], vec![0.0f32; t]);
                    let terms = KeyTerms {
                        g: &mut g,
                        c: &mut c,
                        screen: None,
                    };
                    let paired = score_keys_in(
                        Isa::Scalar,
                        pairs,
                        &queries,
                        Keys::new(enc, Some(&scale)),
                        0,
                        &mut outs,
                        Want::Terms(terms),
                        &mut Scratch::new(d),
                    );
                    (rows, g, c, paired)
                };
                let (want, want_g, want_c, _) = score(None);
                ROWS_TAKEN.with(|n| n.set(0));
                let (got, got_g, got_c, paired) = score(Some(run));
                let rows = ROWS_TAKEN.with(|n| n.get());
                assert_eq!(rows, taken, "{run:?} d={d} t={t}: blocks by the rows path");
                assert_eq!(paired, 2 * blocks, "{run:?} d={d} t={t}");
                for (r, ((x, y), (u, v))) in got_g
                    .iter()
                    .zip(&want_g)
                    .zip(got_c.iter().zip(&want_c))
                    .enumerate()
                {
                    assert!(
                        same(*x, *y) && same(*u, *v),
                        "{run:?} t={t} key {r}: g {x} vs {y}, c {u} vs {v}"
                    );
                }
                for (j, (a, b)) in got.iter().zip(&want).enumerate() {
                    for (r, (x, y)) in a.iter().zip(b).enumerate() {
                        assert!(same(*x, *y), "{run:?} t={t} query {j} key {r}: {x} vs {y}");
                    }
                }
            }
        }
    }
}

/// An odd `d` never runs in pairs (the last dimension has no partner);
/// the scores are the float32 kernel's.
#[test]
fn an_odd_dimension_never_runs_in_pairs() {
    let (h, d, t) = (4, 7, 70);
    let keys: Vec<u16> = (0..t * d).map(|x| 0x3F80 + (x % 97) as u16).collect();
    let qs = vec![vec![0.5f32; h * d]];
    let (want, got, paired) = scored(
        PairRun::Model,
        h,
        d,
        &qs,
        &[1.0; 4],
        Encoded::Bf16(&keys),
        None,
        t,
    );
    assert_eq!(paired, 0);
    assert_eq!(want, got);
}
