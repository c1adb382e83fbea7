//! The pair step against the float32 kernels: the same block maxima and
//! magnitudes, bit for bit, wherever it runs; not run where its flushes
//! could act.

use super::pairs::{pack_keys, pack_keys_body, packed_len, pair_at, PairRows, PairRun, GROUP};
use super::portable;
use super::tests::{scratch_of, XorShift};
use super::PAIRED;
use crate::block_sparse::engine::{run_engine, Finish, Keys};
use crate::block_sparse::select::write_i32_row;
use crate::block_sparse::BlockSparseConfig;
use crate::keys::{BlockTable, Encoded, Format, PageLayout, PagedCache};
use crate::simd::bf16dp::{dp_model, min_exponent, pack};
use crate::simd::{self, Isa};

/// The pair runs this CPU has: the model everywhere, the instruction where
/// the CPU has it.
fn runs() -> Vec<PairRun> {
    let mut runs = vec![PairRun::Model];
    runs.extend(simd::avx512bf16_for_test().map(PairRun::Hw));
    runs
}

/// Every row's block maxima (bits) and every block's key magnitude, as
/// `score_blocks` leaves them ([`scratch_of`]), and how many segments ran
/// in pairs.
#[allow(clippy::too_many_arguments)]
fn scores(
    isa: Isa,
    pairs: Option<PairRun>,
    q: &[f32],
    rows: usize,
    vis: &[usize],
    keys: &Keys<'_>,
    d: usize,
    bs: usize,
    split: (usize, usize),
) -> (Vec<u32>, usize) {
    let before = PAIRED.with(|n| n.get());
    let (scratch, stride) = scratch_of(isa, pairs, q, rows, vis, keys, d, bs, split, true);
    let paired = PAIRED.with(|n| n.get()) - before;
    let mut bits = Vec::new();
    for (b, block) in scratch.chunks_exact(stride).enumerate() {
        for r in 0..rows {
            if b < vis[r].div_ceil(bs) {
                bits.push(block[r].to_bits());
            }
        }
        bits.push(block[stride - 1].to_bits());
    }
    (bits, paired)
}

/// Random bfloat16-exact keys and queries, scored by the pair step (the
/// model, and the instruction where the CPU has it) on every SIMD walk,
/// from float32, bfloat16 and fp8 keys, dense and paged: the block maxima
/// and magnitudes are the float32 kernels' and the portable kernel's, bit
/// for bit, and the pair step did run.
#[test]
fn the_pair_step_gives_the_float32_block_maxima() {
    let Some(avx2) = simd::avx2_for_test() else {
        return;
    };
    let mut walks = vec![Isa::Avx2(avx2)];
    walks.extend(simd::avx512_for_test().map(Isa::Avx512));
    walks.extend(simd::avx512bf16_for_test().map(Isa::Avx512Bf16));
    let mut rng = XorShift(0x9a12_5bf1_6000_0001);
    let (mut paired, mut compared) = (0, 0);
    for case in 0..120 {
        let d = GROUP * (1 + rng.below(if case % 4 == 0 { 9 } else { 3 }));
        let n_keys = 1 + rng.below(300);
        // More than two tiles (the engine streams at most two: no pairs).
        let rows = 9 + rng.below(24);
        let bs = 1 + rng.below(40);
        // Exponent ranges near the admission's edge (the sum of the
        // smallest exponents -105), far from it, and past it (-130: the
        // float32 step runs).
        let (lo_q, lo_k) = match case % 4 {
            0 => (-8, -8),
            1 => (-60, -45),
            2 => (20, -40),
            _ => (-66, -64),
        };
        let q: Vec<f32> = (0..rows * d).map(|_| rng.bf16(lo_q, 8)).collect();
        let mut k: Vec<f32> = (0..n_keys * d).map(|_| rng.bf16(lo_k, 8)).collect();
        if case % 7 == 3 {
            // Infinities and NaN among the keys: the same IEEE values in
            // both; a max ignores NaN.
            let (i, j) = (rng.below(k.len()), rng.below(k.len()));
            (k[i], k[j]) = (f32::INFINITY, f32::NAN);
        }
        // Exact: the values are bfloat16s.
        let k16: Vec<u16> = k.iter().map(|&x| (x.to_bits() >> 16) as u16).collect();
        // fp8 codes of every finite value (NaN only in the NaN cases).
        let fp8: Vec<u8> = (0..n_keys * d)
            .map(|_| match rng.next() as u8 {
                b if b & 0x7F == 0x7F && case % 5 != 0 => b ^ 1,
                b => b,
            })
            .collect();
        let vis: Vec<usize> = (0..rows).map(|_| rng.below(n_keys + 1)).collect();
        // Pages of `bs` keys, in reverse order.
        let n_pages = n_keys.div_ceil(bs);
        let mut paged16 = vec![0u16; n_pages * bs * d];
        for b in 0..n_pages {
            let page = n_pages - 1 - b;
            let keys = &k16[b * bs * d..((b + 1) * bs).min(n_keys) * d];
            paged16[page * bs * d..page * bs * d + keys.len()].copy_from_slice(keys);
        }
        let bytes: Vec<u8> = paged16.iter().flat_map(|x| x.to_le_bytes()).collect();
        // The same pages in float32: read in place (a page's keys from its
        // own base).
        let bytes32: Vec<u8> = paged16
            .iter()
            .flat_map(|&x| (u32::from(x) << 16).to_le_bytes())
            .collect();
        let table: Vec<i32> = (0..n_pages).map(|b| (n_pages - 1 - b) as i32).collect();
        let lens = [n_keys];
        let paged = Keys::Paged {
            cache: PagedCache {
                bytes: &bytes,
                n_pages,
                page_stride: bs * d * 2,
                block_size: bs,
                d,
                layout: PageLayout::Dense(Format::Bf16),
            },
            table: BlockTable {
                table: &table,
                max_blocks: n_pages,
                seq_lens: &lens,
            },
            seq: 0,
        };
        let paged32 = Keys::Paged {
            cache: PagedCache {
                bytes: &bytes32,
                page_stride: bs * d * 4,
                layout: PageLayout::Dense(Format::F32),
                ..cache_of(&paged)
            },
            table: table_of(&paged),
            seq: 0,
        };
        let sources = [
            Keys::Dense(Encoded::F32(&k)),
            Keys::Dense(Encoded::Bf16(&k16)),
            Keys::Dense(Encoded::Fp8E4m3(&fp8)),
            paged,
            paged32,
        ];
        let split = [(1, 5), (3, 64), (1 + rng.below(4), 1 << 20)][case % 3];
        for keys in &sources {
            let want = scores(Isa::Scalar, None, &q, rows, &vis, keys, d, bs, split).0;
            for &isa in &walks {
                let plain = scores(isa, None, &q, rows, &vis, keys, d, bs, split).0;
                assert!(plain == want, "case {case}: the float32 kernels at {isa:?}");
                for run in runs() {
                    let (got, n) = scores(isa, Some(run), &q, rows, &vis, keys, d, bs, split);
                    assert!(
                        got == want,
                        "case {case} ({run:?} on {isa:?}, {:?}): d={d} n_keys={n_keys} \
                         rows={rows} bs={bs} split {split:?}",
                        keys_format(keys)
                    );
                    paired += n;
                    compared += got.len();
                }
            }
        }
    }
    assert!(
        paired > 50_000 && compared > 300_000,
        "{paired} paired, {compared}"
    );
}

fn cache_of<'a>(keys: &Keys<'a>) -> PagedCache<'a> {
    match keys {
        Keys::Paged { cache, .. } => *cache,
        Keys::Dense(_) => unreachable!("a paged source"),
    }
}

fn table_of<'a>(keys: &Keys<'a>) -> BlockTable<'a> {
    match keys {
        Keys::Paged { table, .. } => *table,
        Keys::Dense(_) => unreachable!("a paged source"),
    }
}

fn keys_format(keys: &Keys<'_>) -> Format {
    match keys {
        Keys::Dense(k) => k.format(),
        Keys::Paged { cache, .. } => cache.layout.key_format(),
    }
}

/// A tile whose queries and keys could reach the flushed range, a tile
/// with a value that is not bfloat16, `d` not a multiple of 16, or one or
/// two tiles (a decode) run the float32 step — and the model would have
/// given other bits on the flushed data, so admitting it would show.
#[test]
fn the_pair_step_runs_only_where_it_gives_the_same_bits() {
    let Some(avx2) = simd::avx2_for_test() else {
        return;
    };
    let isa = Isa::Avx2(avx2);
    let mut rng = XorShift(0x0f1a_5b0d);
    let (d, n_keys, bs, rows) = (32, 200, 16, 16);
    let vis = vec![n_keys; rows];
    let one = |q: &[f32], k: &[f32], d: usize, rows: usize| {
        let keys = Keys::Dense(Encoded::F32(k));
        let vis = &vis[..rows];
        let plain = scores(isa, None, q, rows, vis, &keys, d, bs, (4, 64)).0;
        let (got, n) = scores(
            isa,
            Some(PairRun::Model),
            q,
            rows,
            vis,
            &keys,
            d,
            bs,
            (4, 64),
        );
        assert!(got == plain);
        n
    };
    // Exponents in [-70, -62] on both sides: sums below -112.
    let tiny_q: Vec<f32> = (0..rows * d).map(|_| rng.bf16(-70, 8)).collect();
    let tiny_k: Vec<f32> = (0..n_keys * d).map(|_| rng.bf16(-70, 8)).collect();
    let chunks = n_keys.div_ceil(64);
    assert_eq!(one(&tiny_q, &tiny_k, d, rows), 0);
    assert_eq!(chunks, 4);
    // The teeth: the model's pairs differ from the FMA chain on this data.
    let differs = (0..n_keys)
        .filter(|&p| {
            let (qr, kr) = (&tiny_q[..d], &tiny_k[p * d..(p + 1) * d]);
            pair_dot(qr, kr).to_bits() != portable::dot(qr, kr).to_bits()
        })
        .count();
    assert!(differs > n_keys / 2, "only {differs} keys' scores flush");
    // One tile of tiny queries among normal ones: the other three pair.
    let mut q: Vec<f32> = (0..rows * d).map(|_| rng.bf16(-4, 8)).collect();
    q[..4 * d].copy_from_slice(&tiny_q[..4 * d]);
    let k: Vec<f32> = (0..n_keys * d).map(|_| rng.bf16(-60, 8)).collect();
    assert_eq!(one(&q, &k, d, rows), 3 * chunks);
    // A query element that is not a bfloat16 keeps its tile out.
    let mut q2 = q.clone();
    q2[5 * d + 3] = f32::from_bits(q2[5 * d + 3].to_bits() | 1);
    assert_eq!(one(&q2, &k, d, rows), 2 * chunks);
    // A key that is not a bfloat16 keeps its chunk out (keys 64 .. 128).
    let mut k2 = k.clone();
    k2[70 * d] = f32::from_bits(k2[70 * d].to_bits() | 0x8000);
    assert_eq!(one(&q, &k2, d, rows), 3 * (chunks - 1));
    // d = 24 (not whole groups) or 12 (padded to 16, but its keys are not
    // whole groups), and two tiles: no pairs at all.
    for dd in [24, 12] {
        let q: Vec<f32> = (0..rows * dd).map(|_| rng.bf16(-4, 8)).collect();
        let k: Vec<f32> = (0..n_keys * dd).map(|_| rng.bf16(-4, 8)).collect();
        assert_eq!(one(&q, &k, dd, rows), 0);
    }
    assert_eq!(one(&q[..8 * d], &k, d, 8), 0);
    assert!(one(&q[..12 * d], &k, d, 12) > 0);
}

/// The dot product in pairs by the model: 8 lanes of `(j + 16m, j + 16m +
/// 8)` pairs, the canonical tree.
fn pair_dot(q: &[f32], k: &[f32]) -> f32 {
    let mut l = [0.0f32; 8];
    for (gq, gk) in q.chunks_exact(GROUP).zip(k.chunks_exact(GROUP)) {
        for (j, lj) in l.iter_mut().enumerate() {
            *lj = dp_model(*lj, pack(gq[j], gq[j + 8]), pack(gk[j], gk[j + 8]));
        }
    }
    ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))
}

/// The vector pack gives the portable pack's pairs and summary on every
/// kind of value: non-bfloat16 bits, subnormals (the largest one too),
/// zeros of both signs, infinities and NaN, every exponent.
#[test]
fn the_vector_pack_gives_the_portable_pairs_and_summary() {
    let mut rng = XorShift(0x7061_636b);
    let planted = [
        0x0001_0000u32,
        0x007F_0000,
        0x0080_0000,
        0x8000_0000,
        0,
        0x7F80_0000,
        0xFF80_0000,
        0x7FC0_0000,
        0x3F80_0001,
        0x3F80_8000,
    ];
    let mut kinds = [0usize; 3];
    for case in 0..4000 {
        let d = GROUP * (1 + rng.below(9));
        let n = 1 + rng.below(6);
        let span = 1 + rng.below(254);
        let lo = rng.below(255 - span);
        let mut bits: Vec<u32> = (0..n * d)
            .map(|_| {
                let x = rng.next() as u32;
                (x & 0x807F_0000) | (((lo + rng.below(span)) as u32) << 23)
            })
            .collect();
        for _ in 0..case % 3 {
            let i = rng.below(bits.len());
            bits[i] = planted[rng.below(planted.len())];
        }
        let keys: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
        // `got` starts stale: `pack_keys` writes every pair, an odd count's
        // last half with zeros (the body writes the keys' pairs alone).
        let mut want = vec![0u32; packed_len(n, d)];
        let summary = pack_keys_body(&keys, d, &mut want);
        assert_eq!(summary, min_exponent(bits.iter().copied()));
        let mut got = vec![0x5EED_5EEDu32; packed_len(n, d)];
        assert_eq!(pack_keys(&keys, d, &mut got), summary, "case {case}");
        assert_eq!(got, want, "case {case}");
        kinds[match summary {
            None => 0,
            Some(e) if e == i32::MAX / 4 => 1,
            Some(_) => 2,
        }] += 1;
        // The layout itself: lane j of key p's group m pairs its dimensions
        // 16m + j (high half) and 16m + 8 + j, keys 2i and 2i + 1 side by
        // side in each group.
        let (p, m, j) = (rng.below(n), rng.below(d / GROUP), rng.below(8));
        let at = |i: usize| keys[p * d + GROUP * m + i];
        let lane = p / 2 * d + GROUP * m + p % 2 * 8 + j;
        assert_eq!(pair_at(p, m, d) + j, lane);
        assert_eq!(want[lane], pack(at(j), at(j + 8)));
        if n % 2 == 1 {
            assert!(got[pair_at(n, m, d)..][..8].iter().all(|&x| x == 0));
        }
    }
    assert!(kinds[0] > 300 && kinds[2] > 300, "{kinds:?}");
}

/// The query pairs: each tile's summary from its own rows, the rows packed
/// as the keys are; no pairs at all when `dp` is not a multiple of 16 or
/// no tile is bfloat16-exact.
#[test]
fn the_query_pairs_summarise_each_tile() {
    let mut rng = XorShift(0x7175_6572);
    let dp = 48;
    let mut q: Vec<f32> = (0..12 * dp).map(|_| rng.bf16(-3, 6)).collect();
    q[4 * dp + 7] = 2f32.powi(-90);
    q[8 * dp + 1] = 1.0 + f32::EPSILON;
    let pr = PairRows::new(&q, dp).expect("two exact tiles");
    assert_eq!(pr.tiles[1], Some(-90));
    assert_eq!(pr.tiles[2], None);
    assert_eq!(
        pr.tiles[0],
        min_exponent(q[..4 * dp].iter().map(|x| x.to_bits()))
    );
    let mut want = vec![0u32; dp];
    pack_keys_body(&q[5 * dp..6 * dp], dp, &mut want);
    // A query row is one key's pairs, group after group.
    let row: Vec<u32> = (0..dp / GROUP)
        .flat_map(|m| want[pair_at(0, m, dp)..][..8].to_vec())
        .collect();
    assert_eq!(&pr.tile(1, dp)[dp / 2..dp], &row[..]);
    assert!(pr.admits(1, Some(-22)) && !pr.admits(1, Some(-23)) && !pr.admits(2, Some(0)));
    assert!(PairRows::new(&q[..4 * 40], 40).is_none());
    let inexact: Vec<f32> = q.iter().map(|x| f32::from_bits(x.to_bits() | 1)).collect();
    assert!(PairRows::new(&inexact, dp).is_none());
}

/// The engine takes the pair step exactly at the pair level: a prefill's
/// bfloat16 rows through `run_engine` (one task: it runs on this thread)
/// run in pairs at `Isa::Avx512Bf16` and never below it, with the same
/// selections.
#[test]
fn the_engine_takes_the_pair_step_at_the_pair_level_only() {
    let mut rng = XorShift(0x656e_6769);
    let (heads, d, n_q, n_keys) = (4, 32, 6, 700);
    let cfg = BlockSparseConfig::new(16, 5, 1, 1).unwrap();
    let w = cfg.width();
    let keys: Vec<f32> = (0..n_keys * d).map(|_| rng.bf16(-4, 8)).collect();
    let q: Vec<f32> = (0..n_q * heads * d).map(|_| rng.bf16(-4, 8)).collect();
    let vis: Vec<usize> = (0..n_q).map(|i| n_keys - 40 * i).collect();
    let mut want = None;
    for isa in simd::isas_for_test() {
        let mut out = vec![0i32; n_q * heads * w];
        let mut rows: Vec<&mut [i32]> = out.chunks_exact_mut(w).collect();
        let before = PAIRED.with(|n| n.get());
        run_engine(
            isa,
            &Encoded::F32(&q),
            heads,
            &vis,
            &Keys::Dense(Encoded::F32(&keys)),
            d,
            &cfg,
            &mut rows,
            Finish::Select(&write_i32_row),
            1 << 20,
        );
        let paired = PAIRED.with(|n| n.get()) - before;
        assert_eq!(
            paired > 0,
            matches!(isa, Isa::Avx512Bf16(_)),
            "{isa:?}: {paired}"
        );
        assert_eq!(*want.get_or_insert_with(|| out.clone()), out, "{isa:?}");
    }
}
