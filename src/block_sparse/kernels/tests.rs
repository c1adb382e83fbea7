//! The kernels against each other, and the engine's row groups.

use super::portable;
use crate::block_sparse::engine::{run_engine, score_blocks, Keys, PaddedRows, SCRATCH_FLOATS};
use crate::block_sparse::select::write_i32_row;
use crate::block_sparse::BlockSparseConfig;
use crate::keys::{bf16_to_f32, fp8_e4m3fn_to_f32, Encoded};
use crate::simd::{self, Isa};

pub(super) struct XorShift(pub(super) u64);
impl XorShift {
    pub(super) fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn f32(&mut self) -> f32 {
        // In [-1, 1), with a full 24-bit mantissa: rounding differs
        // between summation orders, so a mismatch would show.
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    pub(super) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    /// A bfloat16 value in `±[2^lo, 2^(lo + span))` (full 8-bit
    /// significand: sums round), or zero one time in 16 (the pair step's
    /// tests: x86-64 only).
    #[cfg(target_arch = "x86_64")]
    pub(super) fn bf16(&mut self, lo: i32, span: usize) -> f32 {
        let x = self.next();
        if x.is_multiple_of(16) {
            return 0.0;
        }
        let e = (lo + self.below(span) as i32 + 127) as u32;
        f32::from_bits(((x >> 8) as u32 & 0x807F_0000) | e << 23)
    }
}

/// What `score_blocks` leaves at `isa` (with the pair step's `pairs`) for
/// every (query, head) row of `q`: the block-major scratch (`[nb][stride]`,
/// `stride` the padded rows, plus one for the blocks' key magnitudes with
/// `mags`) and `stride`, blocks `0 .. nb` scored in `bpt`-block tasks, keys
/// walked `key_chunk` at a time.
#[allow(clippy::too_many_arguments)]
pub(super) fn scratch_of(
    isa: Isa,
    pairs: Option<crate::simd::bf16dp::PairRun>,
    q: &[f32],
    rows: usize,
    vis: &[usize],
    keys: &Keys<'_>,
    d: usize,
    bs: usize,
    (bpt, key_chunk): (usize, usize),
    mags: bool,
) -> (Vec<f32>, usize) {
    let padded = PaddedRows::new(&Encoded::F32(q), 0, rows, d, |r| vis[r]);
    let n_keys = keys.n_keys(d);
    let nb = vis.iter().map(|v| v.div_ceil(bs)).max().unwrap_or(0);
    let stride = padded.rows_pad + usize::from(mags);
    let mut scratch = vec![f32::NEG_INFINITY; nb * stride];
    for (t, chunk) in scratch.chunks_mut(stride * bpt).enumerate() {
        let b0 = t * bpt;
        score_blocks(
            isa, pairs, &padded, keys, d, n_keys, bs, b0, chunk, key_chunk, mags,
        );
    }
    (scratch, stride)
}

/// Block maxima of every (query, head) row, computed with `isa`.
fn maxima(
    isa: Isa,
    q: &[f32],
    rows: usize,
    vis: &[usize],
    keys: &Keys<'_>,
    d: usize,
    bs: usize,
) -> Vec<u32> {
    // Several tasks and a small key chunk, to cross every boundary.
    let (scratch, rp) = scratch_of(isa, None, q, rows, vis, keys, d, bs, (3, 5), false);
    let mut bits = Vec::new();
    for r in 0..rows {
        for b in 0..vis[r].div_ceil(bs) {
            bits.push(scratch[b * rp + r].to_bits());
        }
    }
    bits
}

/// The AVX-512, AVX2 and portable kernels compute bit-identical block
/// maxima (not merely close ones) on random full-precision data, for
/// odd dimensions, block sizes, row counts and causal limits -- the
/// summation order is the same on both.
#[test]
fn the_avx512_avx2_and_portable_kernels_give_bit_identical_block_maxima() {
    let Some(token) = simd::avx2_for_test() else {
        return;
    };
    let wide = simd::avx512_for_test();
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let mut finite = 0;
    for case in 0..300 {
        let d = 1 + rng.below(40);
        let n_keys = rng.below(90);
        let rows = 1 + rng.below(9);
        let bs = 1 + rng.below(13);
        let keys: Vec<f32> = (0..n_keys * d).map(|_| rng.f32()).collect();
        let mut q: Vec<f32> = (0..rows * d).map(|_| rng.f32()).collect();
        if case % 7 == 0 {
            // Exact zeros, so -0.0 vs +0.0 sums appear too.
            for v in q.iter_mut().step_by(2) {
                *v = -0.0;
            }
        }
        let vis: Vec<usize> = (0..rows).map(|_| rng.below(n_keys + 1)).collect();
        let keys = Keys::Dense(Encoded::F32(&keys));
        let a = maxima(Isa::Scalar, &q, rows, &vis, &keys, d, bs);
        let b = maxima(Isa::Avx2(token), &q, rows, &vis, &keys, d, bs);
        if let Some(t) = wide {
            let c = maxima(Isa::Avx512(t), &q, rows, &vis, &keys, d, bs);
            assert_eq!(
                a, c,
                "case {case} (AVX-512): d={d} n_keys={n_keys} rows={rows} bs={bs}"
            );
        }
        finite += a.iter().filter(|&&x| f32::from_bits(x).is_finite()).count();
        assert_eq!(
            a, b,
            "case {case}: d={d} n_keys={n_keys} rows={rows} bs={bs}"
        );
    }
    assert!(finite > 5_000, "only {finite} finite block maxima compared");
}

/// Keys decoded a chunk at a time (bfloat16 here) give the block maxima
/// of the same values read in place as float32, bit for bit, with either
/// kernel: decoding changes the bytes read, never a score.
#[test]
fn decoded_keys_give_the_block_maxima_of_their_float32_values() {
    let mut rng = XorShift(0x05ee_db16);
    let levels = simd::isas_for_test();
    for case in 0..200 {
        let d = 1 + rng.below(40);
        let n_keys = rng.below(300);
        let rows = 1 + rng.below(13);
        let bs = 1 + rng.below(40);
        // Finite bfloat16 bit patterns (exponent below all-ones).
        let bits: Vec<u16> = (0..n_keys * d)
            .map(|_| (rng.next() as u16) & 0xBFFF)
            .collect();
        let values: Vec<f32> = bits.iter().map(|&b| bf16_to_f32(b)).collect();
        let mut q: Vec<f32> = (0..rows * d).map(|_| rng.f32()).collect();
        // A query the fp8 kernel cannot carry the format's 2⁸ on (2⁸ × it
        // overflows: the keys are then decoded unscaled), and subnormal
        // elements (2⁸ × them is still exact).
        match case % 5 {
            1 => q[0] = f32::MAX / 3.0,
            2 => q.iter_mut().step_by(3).for_each(|v| *v *= 1e-40),
            _ => {}
        }
        let vis: Vec<usize> = (0..rows).map(|_| rng.below(n_keys + 1)).collect();
        // fp8: every byte but NaN, or (every third case) NaN bytes too, so
        // both the NaN-free fast decode and the exact one run.
        let bytes: Vec<u8> = (0..n_keys * d)
            .map(|_| match rng.next() as u8 {
                b if b & 0x7F == 0x7F && case % 3 != 0 => b ^ 1,
                b => b,
            })
            .collect();
        let fp8_values: Vec<f32> = bytes.iter().map(|&b| fp8_e4m3fn_to_f32(b)).collect();
        let pairs = [
            (Encoded::F32(&values), Encoded::Bf16(&bits)),
            (Encoded::F32(&fp8_values), Encoded::Fp8E4m3(&bytes)),
        ];
        for &isa in &levels {
            for (plain, encoded) in pairs {
                let a = maxima(isa, &q, rows, &vis, &Keys::Dense(plain), d, bs);
                let b = maxima(isa, &q, rows, &vis, &Keys::Dense(encoded), d, bs);
                let f = encoded.format();
                assert_eq!(
                    a, b,
                    "case {case} ({f:?}): d={d} n_keys={n_keys} rows={rows} bs={bs}"
                );
            }
        }
    }
}

/// Every block's key magnitude (the exact selection's `G_b`), as
/// `score_blocks` leaves it with `mags`: blocks `0 .. nb` of `bpt`-block
/// tasks, keys walked `key_chunk` at a time.
#[allow(clippy::too_many_arguments)]
fn magnitudes(
    isa: Isa,
    q: &[f32],
    rows: usize,
    vis: &[usize],
    keys: &Keys<'_>,
    d: usize,
    bs: usize,
    split: (usize, usize),
) -> Vec<f32> {
    let (scratch, stride) = scratch_of(isa, None, q, rows, vis, keys, d, bs, split, true);
    scratch
        .chunks_exact(stride)
        .map(|b| b[stride - 1])
        .collect()
}

/// `|k|` over all its keys, or NaN when one is NaN — whatever the format,
/// the task and chunk splits, the tiles and the masked pieces.
#[test]
fn the_kernels_take_every_blocks_key_magnitude() {
    let mut rng = XorShift(0x6d61_6773);
    let levels = simd::isas_for_test();
    let mut nan_blocks = 0;
    for case in 0..240 {
        let d = 1 + rng.below(40);
        let n_keys = 1 + rng.below(200);
        let rows = 1 + rng.below(13);
        let bs = 1 + rng.below(40);
        let q: Vec<f32> = (0..rows * d).map(|_| rng.f32()).collect();
        // Rows see at most every key; at least one row sees into the last
        // block some of the time, so the engine's part runs or not.
        let vis: Vec<usize> = (0..rows).map(|_| 1 + rng.below(n_keys)).collect();
        let nan = case % 4 == 0;
        // Codes of every kind (NaN ones only when `nan`), float32 finite
        // values at scales that make the largest one a few keys' only.
        let codes16: Vec<u16> = (0..n_keys * d)
            .map(|_| match rng.next() as u16 {
                b if b & 0x7C00 == 0x7C00 && !nan => b & 0xBFFF,
                b => b,
            })
            .collect();
        let bf16: Vec<u16> = codes16
            .iter()
            .map(|&b| {
                if b & 0x7F80 == 0x7F80 && !nan {
                    b & 0xBFFF
                } else {
                    b
                }
            })
            .collect();
        let fp8: Vec<u8> = (0..n_keys * d)
            .map(|_| match rng.next() as u8 {
                b if b & 0x7F == 0x7F && !nan => b ^ 1,
                b => b,
            })
            .collect();
        let mut f32s: Vec<f32> = (0..n_keys * d)
            .map(|_| rng.f32() * (1u64 << rng.below(20)) as f32)
            .collect();
        if nan {
            let i = rng.below(f32s.len());
            f32s[i] = f32::NAN;
        }
        let formats = [
            Encoded::F32(&f32s),
            Encoded::Bf16(&bf16),
            Encoded::F16(&codes16),
            Encoded::Fp8E4m3(&fp8),
        ];
        let nb = vis.iter().map(|v| v.div_ceil(bs)).max().unwrap_or(0);
        let splits = [(1, 5), (3, 64), (1 + rng.below(8), usize::MAX)];
        for enc in formats {
            // The reference: every decoded element of the block, one by one.
            let mut vals = vec![0.0f32; n_keys * d];
            enc.decode(0, &mut vals);
            let want: Vec<f32> = (0..nb)
                .map(|b| {
                    let block = &vals[b * bs * d..((b + 1) * bs).min(n_keys) * d];
                    block.iter().fold(0.0f32, |m, &v| {
                        if m.is_nan() || v.is_nan() {
                            f32::NAN
                        } else {
                            m.max(v.abs())
                        }
                    })
                })
                .collect();
            nan_blocks += want.iter().filter(|m| m.is_nan()).count();
            for &isa in &levels {
                for split in splits {
                    let got = magnitudes(isa, &q, rows, &vis, &Keys::Dense(enc), d, bs, split);
                    let same = got.len() == want.len()
                        && got
                            .iter()
                            .zip(&want)
                            .all(|(g, w)| (g.is_nan() && w.is_nan()) || g.to_bits() == w.to_bits());
                    assert!(
                        same,
                        "case {case} ({:?}, {isa:?}, split {split:?}): d={d} n_keys={n_keys} \
                         rows={rows} bs={bs}\n got {got:?}\nwant {want:?}",
                        enc.format()
                    );
                }
            }
        }
    }
    assert!(nan_blocks > 50, "only {nan_blocks} NaN blocks compared");
}

/// Splitting the rows into groups (to bound the scratch) changes
/// nothing: a scratch budget of one tile gives the same selections as
/// one group holding every row.
#[test]
fn row_groups_do_not_change_the_selection() {
    let mut rng = XorShift(0xabcdef);
    for case in 0..40 {
        let (heads, d) = (1 + rng.below(6), 1 + rng.below(20));
        let n_keys = 1 + rng.below(200);
        let n_q = 1 + rng.below(9);
        let cfg = BlockSparseConfig::new(
            1 + rng.below(6),
            1 + rng.below(5),
            rng.below(2),
            rng.below(2),
        )
        .unwrap();
        let w = cfg.width();
        let keys: Vec<f32> = (0..n_keys * d).map(|_| rng.f32()).collect();
        let q: Vec<f32> = (0..n_q * heads * d).map(|_| rng.f32()).collect();
        let vis: Vec<usize> = (0..n_q).map(|_| rng.below(n_keys + 1)).collect();
        let run = |scratch: usize| {
            let mut out = vec![0i32; n_q * heads * w];
            let mut rows: Vec<&mut [i32]> = out.chunks_exact_mut(w).collect();
            run_engine(
                simd::Isa::best(),
                &Encoded::F32(&q),
                heads,
                &vis,
                &Keys::Dense(Encoded::F32(&keys)),
                d,
                &cfg,
                &mut rows,
                crate::block_sparse::engine::Finish::Select(&write_i32_row),
                scratch,
            );
            out
        };
        assert_eq!(run(1), run(SCRATCH_FLOATS), "case {case}");
    }
}

/// The canonical dot product is what the module docs say it is.
#[test]
fn the_portable_dot_product_sums_eight_lanes_in_the_documented_order() {
    let q: Vec<f32> = (0..11).map(|i| (i as f32 + 1.0) * 0.1).collect();
    let k: Vec<f32> = (0..11).map(|i| 1.0 / (i as f32 + 3.0)).collect();
    let mut qp = q.clone();
    qp.resize(16, 0.0);
    let mut l = [0.0f32; 8];
    for i in 0..16 {
        let kv = k.get(i).copied().unwrap_or(0.0);
        l[i % 8] = qp[i].mul_add(kv, l[i % 8]);
    }
    let want = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
    assert_eq!(portable::dot(&qp, &k).to_bits(), want.to_bits());
}

/// Runs `block_sparse.segment` once at `isa`: the reach test's probe.
pub(super) fn probe(isa: Isa) {
    let (d, n) = (8, 40);
    let keys = vec![1.0f32; n * d];
    let got = maxima(
        isa,
        &[0.5; 8],
        1,
        &[n],
        &Keys::Dense(Encoded::F32(&keys)),
        d,
        16,
    );
    assert_eq!(got.len(), 3);
}
