//! Block selection on the caches engines hold: keys in bfloat16, float16
//! and fp8 (decoded exactly, so they select what their float32 values
//! select), a paged cache read through a shuffled block table (so it selects
//! what the contiguous keys select), the engines' head-major layout written
//! in place, physical page ids, the paged form's refusals, and the batched
//! positions of a selection.

use kvselect::block_sparse::{
    positions_of_blocks_batch_into, positions_of_blocks_i32, select_batch_encoded_into,
    select_batch_into, select_packed_encoded_into, select_paged_into, BlockIds, BlockSparseConfig,
    OutLayout, PagedBlocks,
};
use kvselect::indexer::{indexer_topk_paged_into, PagedInputs};
use kvselect::keys::{
    bf16_to_f32, f16_to_f32, fp8_e4m3fn_to_f32, BlockTable, Encoded, Format, PageLayout, PagedCache,
};
use kvselect::ArgumentError;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Keys of one format: the raw elements and the float32 values they hold.
struct RawKeys {
    f32s: Vec<f32>,
    u16s: Vec<u16>,
    u8s: Vec<u8>,
    format: Format,
}

impl RawKeys {
    /// `n` random finite values of `format` (every bit pattern but NaN and
    /// infinities, so subnormals and both zeros occur).
    fn random(rng: &mut ChaCha8Rng, n: usize, format: Format) -> Self {
        let (mut f32s, mut u16s, mut u8s) = (Vec::new(), Vec::new(), Vec::new());
        while f32s.len() < n {
            let bits: u32 = rng.random();
            let v = match format {
                Format::F32 => f32::from_bits(bits & 0xBFFF_FFFF),
                Format::Bf16 => bf16_to_f32(bits as u16 & 0xBFFF),
                Format::F16 => f16_to_f32(bits as u16 & 0xBBFF),
                Format::Fp8E4m3 => fp8_e4m3fn_to_f32(bits as u8),
            };
            if !v.is_finite() {
                continue;
            }
            match format {
                Format::Bf16 => u16s.push(bits as u16 & 0xBFFF),
                Format::F16 => u16s.push(bits as u16 & 0xBBFF),
                Format::Fp8E4m3 => u8s.push(bits as u8),
                Format::F32 => {}
            }
            f32s.push(v);
        }
        RawKeys {
            f32s,
            u16s,
            u8s,
            format,
        }
    }

    fn encoded(&self) -> Encoded<'_> {
        match self.format {
            Format::F32 => Encoded::F32(&self.f32s),
            Format::F16 => Encoded::F16(&self.u16s),
            Format::Bf16 => Encoded::Bf16(&self.u16s),
            Format::Fp8E4m3 => Encoded::Fp8E4m3(&self.u8s),
        }
    }

    /// Little-endian bytes of elements `a..b` (`b` past the end: zeros).
    fn bytes(&self, a: usize, b: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for i in a..b {
            match self.format {
                Format::F32 => out.extend(self.f32s.get(i).copied().unwrap_or(0.0).to_le_bytes()),
                Format::F16 | Format::Bf16 => {
                    out.extend(self.u16s.get(i).copied().unwrap_or(0).to_le_bytes())
                }
                Format::Fp8E4m3 => out.push(self.u8s.get(i).copied().unwrap_or(0)),
            }
        }
        out
    }
}

const FORMATS: [Format; 4] = [Format::F32, Format::F16, Format::Bf16, Format::Fp8E4m3];

fn random_cfg(rng: &mut ChaCha8Rng) -> BlockSparseConfig {
    BlockSparseConfig::new(
        rng.random_range(1..9),
        rng.random_range(1..6),
        rng.random_range(0..2),
        rng.random_range(0..3),
    )
    .expect("top_blocks >= 1")
}

fn unit(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

/// `[n, h, w]` rows transposed to `[h, n, w]`.
fn head_major(rows: &[i32], n: usize, h: usize, w: usize) -> Vec<i32> {
    let mut out = vec![0; rows.len()];
    for q in 0..n {
        for j in 0..h {
            out[(j * n + q) * w..][..w].copy_from_slice(&rows[(q * h + j) * w..][..w]);
        }
    }
    out
}

#[test]
fn low_precision_keys_and_queries_select_what_their_float32_values_select() {
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    for case in 0..400 {
        let (kf, qf) = (FORMATS[case % 4], FORMATS[(case / 4) % 4]);
        let cfg = random_cfg(&mut rng);
        let (n, h, d) = (
            rng.random_range(1..6),
            rng.random_range(1..5),
            rng.random_range(1..20),
        );
        let t = rng.random_range(0..200);
        let keys = RawKeys::random(&mut rng, t * d, kf);
        let q = RawKeys::random(&mut rng, n * h * d, qf);
        let pos: Vec<usize> = (0..n).map(|_| rng.random_range(0..t + 3)).collect();
        let w = cfg.width();
        let mut want = vec![0; n * h * w];
        select_batch_into(&q.f32s, n, h, &keys.f32s, d, &pos, &cfg, &mut want).unwrap();
        for layout in [OutLayout::QueryMajor, OutLayout::HeadMajor] {
            let mut got = vec![7; n * h * w];
            let (qe, ke) = (q.encoded(), keys.encoded());
            select_batch_encoded_into(qe, n, h, ke, d, &pos, &cfg, layout, &mut got).unwrap();
            let want = match layout {
                OutLayout::QueryMajor => want.clone(),
                OutLayout::HeadMajor => head_major(&want, n, h, w),
            };
            assert_eq!(
                got, want,
                "case {case}: keys {kf:?}, queries {qf:?}, {layout:?}"
            );
        }
    }
}

#[test]
fn a_packed_batch_in_head_major_layout_is_the_transpose_of_the_query_major_one() {
    let mut rng = ChaCha8Rng::seed_from_u64(13);
    for case in 0..100 {
        let cfg = random_cfg(&mut rng);
        let (h, d, n_seqs) = (
            rng.random_range(1..5),
            rng.random_range(1..10),
            rng.random_range(1..4),
        );
        let lens: Vec<usize> = (0..n_seqs).map(|_| rng.random_range(0..60)).collect();
        let mut cu = vec![0usize];
        for l in &lens {
            cu.push(cu.last().unwrap() + l);
        }
        let keys = RawKeys::random(&mut rng, cu[n_seqs] * d, Format::Bf16);
        let n = rng.random_range(1..8);
        let sid: Vec<usize> = (0..n).map(|_| rng.random_range(0..n_seqs)).collect();
        let pos: Vec<usize> = (0..n).map(|_| rng.random_range(0..70)).collect();
        let q = unit(&mut rng, n * h * d);
        let w = cfg.width();
        let run = |layout| {
            let mut out = vec![7; n * h * w];
            let (qe, ke) = (Encoded::F32(&q), keys.encoded());
            select_packed_encoded_into(qe, n, h, ke, d, &cu, &sid, &pos, &cfg, layout, &mut out)
                .unwrap();
            out
        };
        let (qm, hm) = (run(OutLayout::QueryMajor), run(OutLayout::HeadMajor));
        assert_eq!(hm, head_major(&qm, n, h, w), "case {case}");
    }
}

/// A paged cache of `seqs` (each the keys of one sequence): pages shuffled,
/// `gap` spare bytes between pages (another layer's), block-table rows
/// padded with 0 past what each sequence needs.
struct Paged {
    bytes: Vec<u8>,
    n_pages: usize,
    stride: usize,
    table: Vec<i32>,
    max_blocks: usize,
    lens: Vec<usize>,
}

impl Paged {
    fn new(rng: &mut ChaCha8Rng, seqs: &[RawKeys], lens: &[usize], bs: usize, d: usize) -> Self {
        let blocks: Vec<usize> = lens.iter().map(|l| l.div_ceil(bs)).collect();
        let max_blocks = blocks.iter().max().copied().unwrap_or(0) + rng.random_range(0..3);
        let n_pages = blocks.iter().sum::<usize>() + rng.random_range(0..3);
        let mut pages: Vec<usize> = (0..n_pages).collect();
        for i in (1..n_pages).rev() {
            pages.swap(i, rng.random_range(0..=i));
        }
        let elem = match seqs.first().map(|s| s.format) {
            Some(Format::F32) => 4,
            Some(Format::F16 | Format::Bf16) => 2,
            _ => 1,
        };
        let page_bytes = bs * d * elem;
        let stride = page_bytes + rng.random_range(0..3) * 4;
        let mut bytes = vec![0xAB; n_pages * stride];
        let mut table = vec![0i32; lens.len() * max_blocks];
        let mut next = 0;
        for (s, keys) in seqs.iter().enumerate() {
            for b in 0..blocks[s] {
                let page = pages[next];
                next += 1;
                table[s * max_blocks + b] = page as i32;
                let src = keys.bytes(b * bs * d, (b + 1) * bs * d);
                bytes[page * stride..][..page_bytes].copy_from_slice(&src);
            }
        }
        Paged {
            bytes,
            n_pages,
            stride,
            table,
            max_blocks,
            lens: lens.to_vec(),
        }
    }

    fn cache(&self, bs: usize, d: usize, format: Format) -> PagedCache<'_> {
        PagedCache {
            bytes: &self.bytes,
            n_pages: self.n_pages,
            page_stride: self.stride,
            block_size: bs,
            d,
            layout: PageLayout::Dense(format),
        }
    }

    fn table(&self) -> BlockTable<'_> {
        BlockTable {
            table: &self.table,
            max_blocks: self.max_blocks,
            seq_lens: &self.lens,
        }
    }
}

#[test]
fn a_paged_cache_with_shuffled_interleaved_pages_selects_what_the_contiguous_keys_select() {
    let mut rng = ChaCha8Rng::seed_from_u64(14);
    for case in 0..300 {
        let format = FORMATS[case % 4];
        let cfg = random_cfg(&mut rng);
        let (bs, h, d) = (
            cfg.block_size,
            rng.random_range(1..5),
            rng.random_range(1..12),
        );
        let n_seqs = rng.random_range(1..4);
        let lens: Vec<usize> = (0..n_seqs).map(|_| rng.random_range(0..50)).collect();
        let seqs: Vec<RawKeys> = lens
            .iter()
            .map(|&l| RawKeys::random(&mut rng, l * d, format))
            .collect();
        let paged = Paged::new(&mut rng, &seqs, &lens, bs, d);
        // A decode batch (one query per sequence) or a prefill chunk.
        let n = if case % 2 == 0 {
            n_seqs
        } else {
            rng.random_range(1..9)
        };
        let sid: Vec<usize> = (0..n)
            .map(|i| {
                if case % 2 == 0 {
                    i
                } else {
                    rng.random_range(0..n_seqs)
                }
            })
            .collect();
        let pos: Vec<usize> = sid
            .iter()
            .map(|&s| rng.random_range(0..lens[s] + 3))
            .collect();
        let q = unit(&mut rng, n * h * d);
        let w = cfg.width();
        let inputs = PagedBlocks {
            q: Encoded::F32(&q),
            n_queries: n,
            n_kv_heads: h,
            cache: paged.cache(bs, d, format),
            table: paged.table(),
            seq_ids: &sid,
            query_pos: &pos,
        };
        let logical = paged_select(&inputs, &cfg, OutLayout::QueryMajor, BlockIds::Logical);
        let physical = paged_select(&inputs, &cfg, OutLayout::QueryMajor, BlockIds::Physical);
        let hm = paged_select(&inputs, &cfg, OutLayout::HeadMajor, BlockIds::Logical);
        assert_eq!(hm, head_major(&logical, n, h, w), "case {case}: head-major");
        for i in 0..n {
            let s = sid[i];
            let mut want = vec![0; h * w];
            let qi = &q[i * h * d..(i + 1) * h * d];
            select_batch_into(qi, 1, h, &seqs[s].f32s, d, &[pos[i]], &cfg, &mut want).unwrap();
            assert_eq!(
                &logical[i * h * w..][..h * w],
                &want[..],
                "case {case}: query {i}"
            );
            let mapped: Vec<i32> = want
                .iter()
                .map(|&b| {
                    if b < 0 {
                        -1
                    } else {
                        paged.table[s * paged.max_blocks + b as usize]
                    }
                })
                .collect();
            assert_eq!(
                &physical[i * h * w..][..h * w],
                &mapped[..],
                "case {case}: physical"
            );
        }
    }
}

#[test]
fn a_decode_prefetching_pages_ahead_selects_the_same_and_reads_no_entry_past_the_sequence() {
    // Sequences long enough that a decode's prefetch a page or more ahead
    // (32 KiB of keys) lands in pages of the sequence, and at its end; the
    // table entries past what each sequence needs are garbage, which a
    // prefetch that ran on past the sequence would read (and panic on).
    let mut rng = ChaCha8Rng::seed_from_u64(21);
    // Every format with every dimension: leads of 32 to 512 keys, and with
    // d 256 float32 chunks of half a page (a chunk that starts mid-page).
    for case in 0..72 {
        let format = FORMATS[case % 4];
        let d = [64, 128, 256][case / 4 % 3];
        let bs = [16, 64, 128][case / 12 % 3];
        let cfg = BlockSparseConfig::new(bs, rng.random_range(1..6), 0, 1).unwrap();
        let h = rng.random_range(1..9);
        let n_seqs = rng.random_range(1..3);
        let lens: Vec<usize> = (0..n_seqs).map(|_| rng.random_range(200..1200)).collect();
        let seqs: Vec<RawKeys> = lens
            .iter()
            .map(|&l| RawKeys::random(&mut rng, l * d, format))
            .collect();
        let mut paged = Paged::new(&mut rng, &seqs, &lens, bs, d);
        for (s, &l) in lens.iter().enumerate() {
            for b in l.div_ceil(bs)..paged.max_blocks {
                paged.table[s * paged.max_blocks + b] = [-99, i32::MAX][b % 2];
            }
        }
        let sid: Vec<usize> = (0..n_seqs).collect();
        let pos: Vec<usize> = lens
            .iter()
            .map(|&l| l - 1 - rng.random_range(0..3))
            .collect();
        let q = unit(&mut rng, n_seqs * h * d);
        let w = cfg.width();
        let inputs = PagedBlocks {
            q: Encoded::F32(&q),
            n_queries: n_seqs,
            n_kv_heads: h,
            cache: paged.cache(bs, d, format),
            table: paged.table(),
            seq_ids: &sid,
            query_pos: &pos,
        };
        let got = paged_select(&inputs, &cfg, OutLayout::QueryMajor, BlockIds::Logical);
        for s in 0..n_seqs {
            let mut want = vec![0; h * w];
            let qs = &q[s * h * d..(s + 1) * h * d];
            select_batch_into(qs, 1, h, &seqs[s].f32s, d, &[pos[s]], &cfg, &mut want).unwrap();
            assert_eq!(
                &got[s * h * w..][..h * w],
                &want[..],
                "case {case}: sequence {s}"
            );
        }
    }
}

/// A paged call's output (`out` filled with 7 first, so a row left
/// unwritten shows).
fn paged_select(
    inputs: &PagedBlocks<'_>,
    cfg: &BlockSparseConfig,
    layout: OutLayout,
    ids: BlockIds,
) -> Vec<i32> {
    let mut out = vec![7; inputs.n_queries * inputs.n_kv_heads * cfg.width()];
    select_paged_into(inputs, cfg, layout, ids, &mut out).unwrap();
    out
}

/// One sequence of 10 tokens in pages of 4 (3 blocks), for the refusals.
fn small_paged() -> (Vec<u8>, Vec<f32>) {
    (vec![0u8; 4 * 4 * 2 * 4], vec![1.0; 2])
}

fn refused(
    table: &[i32],
    max_blocks: usize,
    lens: &[usize],
    sid: &[usize],
    bs: usize,
) -> ArgumentError {
    let (bytes, q) = small_paged();
    let cfg = BlockSparseConfig::new(4, 2, 0, 1).unwrap();
    let inputs = PagedBlocks {
        q: Encoded::F32(&q),
        n_queries: sid.len(),
        n_kv_heads: 1,
        cache: PagedCache {
            bytes: &bytes,
            n_pages: 4,
            page_stride: 32,
            block_size: bs,
            d: 2,
            layout: PageLayout::Dense(Format::F32),
        },
        table: BlockTable {
            table,
            max_blocks,
            seq_lens: lens,
        },
        seq_ids: sid,
        query_pos: &vec![9; sid.len()],
    };
    let mut out = vec![7; sid.len() * cfg.width()];
    let e = select_paged_into(
        &inputs,
        &cfg,
        OutLayout::QueryMajor,
        BlockIds::Logical,
        &mut out,
    )
    .expect_err("refused");
    assert!(out.iter().all(|&x| x == 7), "a refused call wrote to out");
    e
}

#[test]
fn a_paged_call_refuses_bad_tables_pages_and_ids_before_writing() {
    // Pages of 2 tokens under a config of 4: the block size is the page size.
    let e = refused(&[0, 1, 2, 3], 4, &[8], &[0], 2);
    assert_eq!(e.argument(), "kv_cache");
    assert!(e.to_string().contains("config.block_size is 4"), "{e}");
    // Entry 2 is read (10 tokens need 3 blocks) and past the 4 pages.
    let e = refused(&[0, 1, 4, 0], 4, &[10], &[0], 4);
    assert!(
        matches!(
            e,
            ArgumentError::OutOfRange {
                argument: "block_table",
                index: 2,
                ..
            }
        ),
        "{e:?}"
    );
    let e = refused(&[0, -1, 2, 0], 4, &[10], &[0], 4);
    assert!(
        matches!(
            e,
            ArgumentError::OutOfRange {
                argument: "block_table",
                index: 1,
                ..
            }
        ),
        "{e:?}"
    );
    // A row of 2 entries cannot hold 10 tokens in blocks of 4.
    let e = refused(&[0, 1], 2, &[10], &[0], 4);
    assert!(e.to_string().contains("needs 3 blocks"), "{e}");
    let e = refused(&[0, 1, 2, 3], 4, &[10], &[1], 4);
    assert!(
        matches!(
            e,
            ArgumentError::OutOfRange {
                argument: "seq_ids",
                index: 0,
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn entries_past_what_a_sequence_needs_are_never_read() {
    // 10 tokens need 3 of the 4 entries; the fourth is garbage, not refused.
    let (bytes, q) = small_paged();
    let cfg = BlockSparseConfig::new(4, 2, 0, 1).unwrap();
    let inputs = PagedBlocks {
        q: Encoded::F32(&q),
        n_queries: 1,
        n_kv_heads: 1,
        cache: PagedCache {
            bytes: &bytes,
            n_pages: 4,
            page_stride: 32,
            block_size: 4,
            d: 2,
            layout: PageLayout::Dense(Format::F32),
        },
        table: BlockTable {
            table: &[3, 0, 1, -99],
            max_blocks: 4,
            seq_lens: &[10],
        },
        seq_ids: &[0],
        query_pos: &[9],
    };
    let mut out = vec![7; 2];
    select_paged_into(
        &inputs,
        &cfg,
        OutLayout::QueryMajor,
        BlockIds::Physical,
        &mut out,
    )
    .unwrap();
    // All scores tie at 0: block 0 wins the free slot, block 2 is local.
    assert_eq!(out, vec![3, 1]);
}

#[test]
fn batched_positions_are_the_one_row_positions_then_minus_one() {
    let mut rng = ChaCha8Rng::seed_from_u64(15);
    for case in 0..300 {
        let cfg = random_cfg(&mut rng);
        let bs = cfg.block_size;
        // Rows wider than the kernel's stack buffer (64) now and then.
        let w = if case % 10 == 0 {
            70
        } else {
            rng.random_range(1..6)
        };
        let (n, h) = (rng.random_range(0..6), rng.random_range(1..4));
        let layout = [OutLayout::QueryMajor, OutLayout::HeadMajor][case % 2];
        // Ascending distinct rows (a selection's) a third of the time, else
        // unordered with repeats and padding.
        let blocks: Vec<i32> = if case % 3 == 0 {
            (0..n * h)
                .flat_map(|_| (0..w as i32).map(|b| b * 2 - 2))
                .collect()
        } else {
            (0..n * h * w).map(|_| rng.random_range(-2..8)).collect()
        };
        let per_query = |rng: &mut ChaCha8Rng, hi: usize| -> Vec<usize> {
            match rng.random_range(0..2) {
                0 => vec![rng.random_range(0..hi)],
                _ => (0..n).map(|_| rng.random_range(0..hi)).collect(),
            }
        };
        let qp = per_query(&mut rng, 60);
        let np = per_query(&mut rng, 60);
        let mut out = vec![7; n * h * w * bs];
        positions_of_blocks_batch_into(&blocks, n, h, w, layout, &qp, &np, &cfg, &mut out).unwrap();
        for r in 0..n * h {
            let q = match layout {
                OutLayout::QueryMajor => r / h,
                OutLayout::HeadMajor => r % n,
            };
            let pick = |v: &[usize]| if v.len() == 1 { v[0] } else { v[q] };
            let one =
                positions_of_blocks_i32(&blocks[r * w..][..w], pick(&qp), pick(&np), &cfg).unwrap();
            let row = &out[r * w * bs..][..w * bs];
            assert_eq!(&row[..one.len()], &one[..], "case {case}: row {r}");
            assert!(
                row[one.len()..].iter().all(|&x| x == -1),
                "case {case}: row {r} padding"
            );
        }
    }
}

#[test]
fn batched_positions_refuse_a_position_past_int32_and_bad_lengths() {
    let cfg = BlockSparseConfig::new(1 << 20, 1, 0, 0).unwrap();
    let blocks = [2048i32];
    let mut out = vec![7; 1 << 20];
    let far = [usize::MAX];
    let e = positions_of_blocks_batch_into(
        &blocks,
        1,
        1,
        1,
        OutLayout::QueryMajor,
        &far,
        &far,
        &cfg,
        &mut out,
    )
    .expect_err("2048 · 2^20 is past int32");
    assert!(
        matches!(
            e,
            ArgumentError::OutOfRange {
                argument: "blocks",
                index: 0,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(out.iter().all(|&x| x == 7));
    let cfg = BlockSparseConfig::new(4, 2, 0, 0).unwrap();
    let mut out = vec![7; 2 * 2 * 4];
    let e = positions_of_blocks_batch_into(
        &[0; 4],
        2,
        1,
        2,
        OutLayout::QueryMajor,
        &[1, 2, 3],
        &[9],
        &cfg,
        &mut out,
    )
    .expect_err("three positions for two queries");
    assert_eq!(e.argument(), "query_pos");
}

#[test]
fn wide_fp8_keys_and_empty_head_major_batches_return() {
    // fp8 keys are scanned in 16 KiB chunks: a key wider than that is one
    // chunk, not zero (which never advanced).
    let cfg = BlockSparseConfig::new(2, 1, 0, 0).unwrap();
    let d = 20_000;
    let keys: Vec<u8> = (0..3 * d)
        .map(|i| if i / d == 1 { 0x38 } else { 0 })
        .collect();
    let q = vec![1.0f32; d];
    let mut out = vec![7; 1];
    let (qe, ke) = (Encoded::F32(&q), Encoded::Fp8E4m3(&keys));
    select_batch_encoded_into(
        qe,
        1,
        1,
        ke,
        d,
        &[2usize],
        &cfg,
        OutLayout::QueryMajor,
        &mut out,
    )
    .unwrap();
    assert_eq!(out, vec![0]); // block 0 holds key 1 (all ones); block 1 is key 2 (zeros)
                              // No queries, head-major: nothing to write, no panic.
    let mut none: Vec<i32> = Vec::new();
    let (qe, ke) = (Encoded::F32(&[]), Encoded::F32(&[0.0; 4]));
    select_batch_encoded_into(
        qe,
        0,
        2,
        ke,
        2,
        &[0usize; 0],
        &cfg,
        OutLayout::HeadMajor,
        &mut none,
    )
    .unwrap();
}

#[test]
fn a_cache_whose_pages_are_misaligned_for_their_type_selects_the_same() {
    // The same pages one byte off their element alignment: read byte by
    // byte instead of cast in place, the selection does not change.
    let mut rng = ChaCha8Rng::seed_from_u64(16);
    for case in 0..60 {
        let format = [Format::F32, Format::F16, Format::Bf16][case % 3];
        let cfg = random_cfg(&mut rng);
        let (bs, h, d) = (
            cfg.block_size,
            rng.random_range(1..4),
            rng.random_range(1..10),
        );
        let lens = vec![rng.random_range(1..40)];
        let seqs = vec![RawKeys::random(&mut rng, lens[0] * d, format)];
        let paged = Paged::new(&mut rng, &seqs, &lens, bs, d);
        let q = unit(&mut rng, h * d);
        let mut shifted = vec![0u8];
        shifted.extend_from_slice(&paged.bytes);
        let run = |bytes: &[u8]| {
            let mut cache = paged.cache(bs, d, format);
            cache.bytes = bytes;
            let inputs = PagedBlocks {
                q: Encoded::F32(&q),
                n_queries: 1,
                n_kv_heads: h,
                cache,
                table: paged.table(),
                seq_ids: &[0],
                query_pos: &[lens[0] - 1],
            };
            let mut out = vec![7; h * cfg.width()];
            select_paged_into(
                &inputs,
                &cfg,
                OutLayout::QueryMajor,
                BlockIds::Logical,
                &mut out,
            )
            .unwrap();
            out
        };
        assert_eq!(
            run(&shifted[1..]),
            run(&paged.bytes),
            "case {case}: {format:?}"
        );
        // The indexer's paged form, too.
        let w = unit(&mut rng, h);
        let topk = rng.random_range(1..20);
        let index = |bytes: &[u8]| {
            let mut cache = paged.cache(bs, d, format);
            cache.bytes = bytes;
            let inputs = PagedInputs {
                q: Encoded::F32(&q),
                weights: &w,
                cache,
                table: paged.table(),
                seq_ids: &[0],
                query_pos: &[lens[0] - 1],
                compress_ratio: 1,
            };
            let (mut out, mut sc) = (vec![7; topk], vec![0.0f32; topk]);
            indexer_topk_paged_into(1, h, &inputs, topk, 0, &mut out, Some(&mut sc)).unwrap();
            (out, sc.iter().map(|x| x.to_bits()).collect::<Vec<_>>())
        };
        let (a, b) = (index(&shifted[1..]), index(&paged.bytes));
        assert_eq!(a, b, "case {case}: indexer, {format:?}");
    }
}
