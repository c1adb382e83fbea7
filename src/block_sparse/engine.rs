//! The engine: block scoring fused with the max-pool, split across the
//! crate's pool by ranges of whole blocks, then the selection of each row.
//!
//! Keys come from a [`Keys`] source and are read where they lie, in their
//! own format (the kernels decode each load exactly, so the scores are
//! bit-identical to scoring the same values as float32): a dense array
//! whole, a paged cache one page at a time through its block table. Only a
//! page whose bytes are misaligned for its element type is decoded into a
//! small scratch first.
//! Output rows are handed in as one slice per (query, head) row, in
//! query-major order, so that the caller decides where each lands (the
//! engines' head-major layout is the same slices in another order).

use super::exact::{self, Bound};
#[cfg(target_arch = "x86_64")]
use super::kernels::pairs::{self, PairRows};
#[cfg(target_arch = "x86_64")]
use super::kernels::run_pairs;
#[cfg(target_arch = "x86_64")]
use super::kernels::Stream;
use super::kernels::{run_segment, Segment, TileOut, MR};
use super::BlockSparseConfig;
use crate::keys::{BlockTable, Encoded, Format, PageLayout, PagedCache};
use crate::pool;
use crate::simd::bf16dp::PairRun;
use crate::simd::Isa;

/// Cap on the per-(row, block) scratch of one row group, in f32s (4 MiB).
pub(super) const SCRATCH_FLOATS: usize = 1 << 20;
/// Target work per parallel task, in multiply-adds (rows × keys × d).
pub(super) const TASK_WORK: usize = 1 << 22;
/// Bytes of keys walked against every row tile at a time (L2-resident,
/// while the 4-row query tile stays in L1).
pub(super) const KEY_CHUNK_BYTES: usize = 64 * 1024;
/// With this few row tiles, keys are streamed from memory once (decode):
/// the kernel prefetches ahead of itself.
pub(super) const STREAMING_TILES: usize = 2;
/// How far ahead of its reading a streaming kernel prefetches a paged
/// cache's keys into L2, in bytes of keys, rounded up to whole pages: the
/// next page's keys are fetched long before the jump to them, which the
/// hardware prefetcher cannot see coming (it picks a stream up again only
/// after a few misses in the new page).
#[cfg(target_arch = "x86_64")]
pub(super) const LEAD_BYTES: usize = 32 * 1024;
/// Bytes of decoded keys per chunk when keys are streamed and decoded
/// (L1-resident between the decode and the kernel).
pub(super) const DECODE_CHUNK_BYTES: usize = 16 * 1024;

/// Where the keys of one sequence come from.
#[derive(Clone, Copy)]
pub(super) enum Keys<'a> {
    /// `[n_keys, d]` rows of one format.
    Dense(Encoded<'a>),
    /// Sequence `seq` of a paged cache (pages of `cfg.block_size` tokens).
    Paged {
        cache: PagedCache<'a>,
        table: BlockTable<'a>,
        seq: usize,
    },
}

impl Keys<'_> {
    pub(super) fn n_keys(&self, d: usize) -> usize {
        match self {
            Keys::Dense(k) => k.len() / d,
            Keys::Paged { table, seq, .. } => table.seq_lens[*seq],
        }
    }

    /// The keys around key `c0`, read in place in their format, with the
    /// index of their first key: a dense array whole, a paged cache the
    /// page holding `c0`. `None` when a page's bytes are not aligned for
    /// its element type (then it is decoded instead).
    fn in_place(&self, c0: usize, bs: usize) -> Option<(Encoded<'_>, usize)> {
        match self {
            Keys::Dense(k) => Some((*k, 0)),
            Keys::Paged { cache, table, seq } => {
                if !matches!(cache.layout, PageLayout::Dense(_)) {
                    return None;
                }
                let keys = cache.page_keys(table.page(*seq, c0 / bs))?;
                Some((keys, c0 / bs * bs))
            }
        }
    }

    /// The format the keys are stored in.
    #[cfg(target_arch = "x86_64")]
    fn format(&self) -> Format {
        match self {
            Keys::Dense(k) => k.format(),
            Keys::Paged { cache, .. } => cache.layout.key_format(),
        }
    }

    /// The bytes of keys `pos ..` as far as they lie contiguous in memory
    /// (to the end of a dense array, or of `pos`'s page): what a kernel
    /// prefetches. Empty at or past the last key (a block table's entries
    /// past the sequence are never read), or for a page decoded instead.
    /// (The SIMD kernels prefetch; the portable ones do not: x86-64 only,
    /// as is [`Keys::lead_keys`].)
    #[cfg(target_arch = "x86_64")]
    fn bytes_from(&self, pos: usize, d: usize, bs: usize) -> &[u8] {
        if pos >= self.n_keys(d) {
            return &[];
        }
        self.in_place(pos, bs)
            .map_or(&[], |(k, base)| k.bytes((pos - base) * d, usize::MAX))
    }

    /// How many keys ahead in reading order a streaming kernel prefetches
    /// into L2: for a paged cache, [`LEAD_BYTES`] of keys of `key_bytes`
    /// each rounded up to whole pages (so that the lead is at the same
    /// offset in a later page, and one run of it covers a segment). None
    /// for a dense array: the hardware prefetcher follows its one stream,
    /// and the extra prefetches only cost (float32 decode 7–17% slower at
    /// the AVX-512 level on Zen 4, in one process against none;
    /// docs/benchmarks.md).
    #[cfg(target_arch = "x86_64")]
    fn lead_keys(&self, key_bytes: usize, bs: usize) -> Option<usize> {
        match self {
            Keys::Dense(_) => None,
            Keys::Paged { .. } => {
                let keys = LEAD_BYTES.div_ceil(key_bytes.max(1));
                Some(keys.div_ceil(bs.max(1)).saturating_mul(bs))
            }
        }
    }

    /// The end of the chunk that starts at key `c0` and wants to end at
    /// `c1`: a chunk of a paged cache never crosses a page.
    fn chunk_end(&self, c0: usize, c1: usize, bs: usize) -> usize {
        match self {
            Keys::Paged { .. } => c1.min((c0 / bs + 1) * bs),
            Keys::Dense(_) => c1,
        }
    }

    /// Keys `c0..c1` decoded into `buf` (`(c1 - c0) * d` floats); for a
    /// paged source `c0..c1` lies within one page.
    fn decode(&self, c0: usize, d: usize, bs: usize, buf: &mut [f32]) {
        match self {
            Keys::Dense(k) => k.decode(c0 * d, buf),
            Keys::Paged { cache, table, seq } => {
                let page = table.page(*seq, c0 / bs);
                cache.decode(page, c0 % bs, buf, &mut []);
            }
        }
    }
}

/// Query heads padded into 4-row tiles, `dp = d` rounded up to 8, zeros in
/// the padding (so a padded dimension contributes `fma(0, 0, acc)`).
pub(super) struct PaddedRows {
    pub(super) q: Vec<f32>,
    /// Exclusive end of the keys each (padded) row sees.
    pub(super) vis: Vec<usize>,
    pub(super) rows_pad: usize,
    pub(super) dp: usize,
    /// `q × 2⁸`, made on first use and shared by every task of the row
    /// group: the query the SIMD kernels read fp8 keys against when they
    /// read them as `2⁻⁸ ×` their values (exact, a power of two, so every
    /// FMA rounds as with the unscaled pair). `None` inside when an element
    /// would overflow: the keys are then decoded unscaled. The SIMD
    /// kernels' only: x86-64 only.
    #[cfg(target_arch = "x86_64")]
    fp8: std::sync::OnceLock<Option<Vec<f32>>>,
    /// The rows as bfloat16 pairs for the pair step, made on first use
    /// (`None` inside: no tile can run in pairs). x86-64 only.
    #[cfg(target_arch = "x86_64")]
    pairs: std::sync::OnceLock<Option<PairRows>>,
}

impl PaddedRows {
    /// Rows `r0 .. r0 + rows` of `q` (rows of `d`), decoded and padded.
    pub(super) fn new(
        q: &Encoded<'_>,
        r0: usize,
        rows: usize,
        d: usize,
        row_vis: impl Fn(usize) -> usize,
    ) -> Self {
        let dp = d.div_ceil(8) * 8;
        let rows_pad = rows.div_ceil(MR) * MR;
        let mut qp = vec![0.0f32; rows_pad * dp];
        for (r, dst) in qp.chunks_exact_mut(dp).take(rows).enumerate() {
            q.decode((r0 + r) * d, &mut dst[..d]);
        }
        // Padding rows copy the last real row's visibility, so a tile's
        // masked region is set by its real rows only; their scores are
        // never read.
        let vis = (0..rows_pad)
            .map(|r| row_vis(r.min(rows.saturating_sub(1))))
            .collect();
        PaddedRows {
            q: qp,
            vis,
            rows_pad,
            dp,
            #[cfg(target_arch = "x86_64")]
            fp8: std::sync::OnceLock::new(),
            #[cfg(target_arch = "x86_64")]
            pairs: std::sync::OnceLock::new(),
        }
    }

    /// The rows as pairs ([`PairRows`]), or `None`: no tile can run in
    /// pairs.
    #[cfg(target_arch = "x86_64")]
    fn pair_rows(&self) -> Option<&PairRows> {
        self.pairs
            .get_or_init(|| PairRows::new(&self.q, self.dp))
            .as_ref()
    }

    /// [`PaddedRows::q`] `× 2⁸` (see the field), or `None`: an element
    /// would overflow.
    #[cfg(target_arch = "x86_64")]
    fn fp8_folded(&self) -> Option<&[f32]> {
        self.fp8
            .get_or_init(|| crate::keys::x86::fp8_folded_query(&self.q))
            .as_deref()
    }
}

/// Receives a row's visible block count, its maxima by block, and its slice.
pub(super) type ScoresFn<T> = dyn Fn(usize, &dyn Fn(usize) -> f32, &mut [T]) + Sync;

/// What the engine does with one row's block maxima.
pub(super) enum Finish<'a, T> {
    /// Selects by the rule and writes the selection with this function.
    Select(&'a (dyn Fn(&[usize], &mut [T]) + Sync)),
    /// Hands the row's visible block count and its maxima (canonical: `-0.0`
    /// reads as `+0.0`) to this function: the checker's exact block scores.
    Scores(&'a ScoresFn<T>),
}

/// Scores `index_q` (`vis.len()` queries × `heads` rows of `d`) against
/// `keys` and finishes each row (see [`Finish`]) into its slice of `rows`
/// (one per query-major (query, head) row). Inputs are validated.
#[allow(clippy::too_many_arguments)]
pub(super) fn run_engine<T: Send>(
    isa: Isa,
    index_q: &Encoded<'_>,
    heads: usize,
    vis: &[usize],
    keys: &Keys<'_>,
    d: usize,
    cfg: &BlockSparseConfig,
    rows: &mut [&mut [T]],
    finish: Finish<'_, T>,
    scratch_floats: usize,
) {
    let n_rows = vis.len() * heads;
    if n_rows == 0 || rows.len() < n_rows {
        return;
    }
    let bs = cfg.block_size;
    let n_keys = keys.n_keys(d);
    let row_vis = |r: usize| vis[r / heads];
    let max_blocks = vis.iter().map(|v| v.div_ceil(bs)).max().unwrap_or(0);
    // Rows per group (a multiple of the tile height), so the scratch stays
    // within `scratch_floats` -- or one tile, when a single tile exceeds it.
    let group = (scratch_floats / max_blocks.max(1) / MR).max(1) * MR;
    let mut g0 = 0;
    while g0 < n_rows {
        let g1 = g0.saturating_add(group).min(n_rows);
        let padded = PaddedRows::new(index_q, g0, g1 - g0, d, |r| row_vis(g0 + r));
        let n_blocks = (g0..g1).map(|r| row_vis(r).div_ceil(bs)).max().unwrap_or(0);
        let rp = padded.rows_pad;
        // Block-major: scratch[b * stride + r] is row r's max over block b;
        // selecting, scratch[b * stride + rp] is block b's keys' largest
        // magnitude (the exact selection's bound, `exact.rs`).
        let mags = matches!(finish, Finish::Select(_));
        let stride = rp + usize::from(mags);
        let mut scratch = vec![f32::NEG_INFINITY; n_blocks * stride];
        let keys_per_task = (TASK_WORK / (rp * padded.dp)).max(1);
        let blocks_per_task = keys_per_task.div_ceil(bs).max(1);
        let key_chunk = (KEY_CHUNK_BYTES / (4 * d)).max(MR);
        pool::for_each_row_mut(&mut scratch, stride * blocks_per_task, 1, |task, maxima| {
            score_blocks(
                isa,
                PairRun::of(isa),
                &padded,
                keys,
                d,
                n_keys,
                bs,
                task * blocks_per_task,
                maxima,
                key_chunk,
                mags,
            );
        });

        let scratch = &scratch;
        pool::for_each_row_mut(&mut rows[g0..g1], 1, 64, |r, row| {
            let nb = row_vis(g0 + r).div_ceil(bs);
            let Some(row) = row.first_mut() else { return };
            match &finish {
                Finish::Select(write) => {
                    let (mut cand, mut buf) = (Vec::new(), Vec::new());
                    let mut sel = Vec::with_capacity(cfg.width().min(nb));
                    let q = &padded.q[r * padded.dp..r * padded.dp + d];
                    let vis = row_vis(g0 + r);
                    let rescore = |b: usize| {
                        let read = |c0: usize, c1: usize, out: &mut [f32]| {
                            // A paged source decodes within one page at a time.
                            let mut a = c0;
                            while a < c1 {
                                let e = keys.chunk_end(a, c1, bs);
                                keys.decode(a, d, bs, &mut out[(a - c0) * d..(e - c0) * d]);
                                a = e;
                            }
                        };
                        exact::block_score64(q, b, bs, vis, read, &mut buf)
                    };
                    exact::select_exact(
                        nb,
                        |b| scratch[b * stride + r],
                        |b| scratch[b * stride + rp],
                        &Bound::of(q),
                        rescore,
                        cfg,
                        &mut cand,
                        &mut sel,
                    );
                    write(&sel, row);
                }
                Finish::Scores(f) => f(nb, &|b| scratch[b * stride + r] + 0.0, row),
            }
        });
        g0 = g1;
    }
}

/// Fills `maxima` (block-major, `[n_blk][stride]`, initialised to -inf)
/// with every padded row's max score over blocks `b0 .. b0 + n_blk`; with
/// `mags` (`stride = rows_pad + 1`), each block's last entry with the
/// largest magnitude of its keys (NaN if one holds NaN).
///
/// With `pair_run` (the pair level's run, [`PairRun::of`]; the tests hand
/// in its model), a chunk that many row tiles read is also packed into
/// bfloat16 pairs, and each tile the pairs admit is scored by the pair
/// step (`kernels/pairs.rs`, x86-64 only): the same bits.
#[allow(clippy::too_many_arguments)]
pub(super) fn score_blocks(
    isa: Isa,
    pair_run: Option<PairRun>,
    rows: &PaddedRows,
    keys: &Keys<'_>,
    d: usize,
    n_keys: usize,
    bs: usize,
    b0: usize,
    maxima: &mut [f32],
    key_chunk: usize,
    mags: bool,
) {
    let rp = rows.rows_pad;
    let stride = rp + usize::from(mags);
    let n_blk = maxima.len() / stride;
    // Few row tiles: each key is used a few times and then never again, so
    // memory latency is what to hide (and with one tile, chunking in-place
    // keys buys nothing).
    let tiles = rp / MR;
    let streaming = tiles <= STREAMING_TILES;
    let paged = matches!(keys, Keys::Paged { .. });
    // The SIMD kernels read fp8 keys in place as 2⁻⁸ × their values
    // against the query × 2⁸, folded once per row group (see
    // `PaddedRows::fp8_folded`). They check each piece for a NaN byte after
    // reading it (no pass over the keys that waits on memory before the
    // kernel runs). Keys decoded into a scratch are float32 and need none.
    // (Off x86-64 only the portable kernel runs: it neither folds nor
    // prefetches.)
    #[cfg(target_arch = "x86_64")]
    let fp8_in_place = isa != Isa::Scalar && keys.format() == Format::Fp8E4m3;
    let key_chunk = match (paged, tiles) {
        (false, 1) => usize::MAX,
        _ => key_chunk,
    };
    #[cfg(target_arch = "x86_64")]
    let lead = keys.lead_keys(d * keys.format().size(), bs);
    let mut buf = Vec::new();
    // The pair step, where many tiles read each chunk (it packs the chunk
    // once for all of them), `d` is whole pair groups (then `dp = d`) and
    // some tile's queries are bfloat16-exact.
    #[cfg(target_arch = "x86_64")]
    let paired = pair_run
        .filter(|_| !streaming && d.is_multiple_of(pairs::GROUP))
        .and_then(|run| Some((run, rows.pair_rows()?)));
    #[cfg(not(target_arch = "x86_64"))]
    let _ = pair_run;
    #[cfg(target_arch = "x86_64")]
    let mut kp = Vec::new();
    let k_start = b0.saturating_mul(bs).min(n_keys);
    let k_end = b0.saturating_add(n_blk).saturating_mul(bs).min(n_keys);
    let mut c0 = k_start;
    while c0 < k_end {
        let mut c1 = keys.chunk_end(c0, c0.saturating_add(key_chunk).min(k_end), bs);
        // The chunk's keys in place, or (a misaligned page) decoded a
        // cache-sized run at a time.
        // With many row tiles, a low-precision chunk is decoded once into
        // float32 rather than once per tile.
        let view = keys
            .in_place(c0, bs)
            .filter(|(k, _)| streaming || k.format() == Format::F32);
        let (chunk, base, in_place) = match view {
            Some((k, base)) => (k, base, true),
            None => {
                if streaming {
                    c1 = c1.min(c0 + (DECODE_CHUNK_BYTES / (4 * d)).max(MR));
                }
                buf.resize((c1 - c0) * d, 0.0);
                keys.decode(c0, d, bs, &mut buf);
                (Encoded::F32(&buf), c0, false)
            }
        };
        // Off x86-64 the portable kernel reads the chunk wherever it is.
        #[cfg(not(target_arch = "x86_64"))]
        let _ = in_place;
        // Keys read in place and used once: the kernel prefetches what
        // follows the chunk (into L1, a few keys ahead) and, from a paged
        // cache, the keys a lead further on (into L2), both in reading
        // order — across pages.
        #[cfg(target_arch = "x86_64")]
        let stream = (streaming && in_place).then(|| Stream {
            next: if c1 < k_end {
                keys.bytes_from(c1, d, bs)
            } else {
                &[]
            },
            lead: lead.map_or(&[], |l| keys.bytes_from(c0.saturating_add(l), d, bs)),
        });
        #[cfg(target_arch = "x86_64")]
        let folded = (fp8_in_place && in_place)
            .then(|| rows.fp8_folded())
            .flatten();
        // The chunk's float32 keys as pairs, and their exponent summary.
        #[cfg(target_arch = "x86_64")]
        let packed = match (paired, chunk) {
            (Some((run, pr)), Encoded::F32(k)) => {
                let own = &k[(c0 - base) * d..(c1 - base) * d];
                kp.resize(pairs::packed_len(c1 - c0, d), 0);
                Some((run, pr, own, pairs::pack_keys(own, d, &mut kp)))
            }
            _ => None,
        };
        // Keys `c0 .. mags_to` have had their magnitudes taken by a kernel:
        // the first tile to read the chunk takes those it reads.
        let mut mags_to = c0;
        for (t, tile_vis) in rows.vis.chunks_exact(MR).enumerate() {
            let lo = tile_vis.iter().copied().min().unwrap_or(0);
            let hi = tile_vis.iter().copied().max().unwrap_or(0);
            let end = c1.min(hi);
            if end <= c0 {
                continue; // no row of this tile sees any key of the chunk
            }
            let takes_mags = mags && mags_to == c0;
            if takes_mags {
                mags_to = end;
            }
            let tile = t * MR * rows.dp..(t + 1) * MR * rows.dp;
            let seg = Segment {
                q: &rows.q[tile.clone()],
                #[cfg(target_arch = "x86_64")]
                q_fp8_folded: folded.map(|f| &f[tile]),
                dp: rows.dp,
                keys: chunk,
                base,
                d,
                start: c0,
                end,
                mask_from: lo.max(c0),
                vis: [tile_vis[0], tile_vis[1], tile_vis[2], tile_vis[3]],
                bs,
                b0,
                // A tile that stops short of the chunk's end reads nothing
                // that follows it: its L1 prefetch does not run on.
                #[cfg(target_arch = "x86_64")]
                stream: stream.map(|s| {
                    if end == c1 {
                        s
                    } else {
                        Stream { next: &[], ..s }
                    }
                }),
            };
            let out = TileOut {
                maxima: &mut *maxima,
                stride,
                col: t * MR,
                mag_at: takes_mags.then_some(rp),
            };
            #[cfg(target_arch = "x86_64")]
            if let Some((run, pr, own, _)) = packed.filter(|&(_, pr, _, k)| pr.admits(t, k)) {
                let seg = Segment {
                    keys: Encoded::F32(own),
                    base: c0,
                    ..seg
                };
                run_pairs(isa, run, &seg, pr.tile(t, rows.dp), &kp, out);
                continue;
            }
            run_segment(isa, &seg, out);
        }
        if mags {
            // The chunk's keys no tile read (past every row's visibility),
            // block by block.
            let mut a = mags_to;
            while a < c1 {
                let e = c1.min((a / bs + 1) * bs);
                let m = exact::abs_max(isa, &chunk, (a - base) * d, (e - base) * d);
                let at = (a / bs - b0) * stride + rp;
                maxima[at] = exact::merge_magnitude(maxima[at], m);
                a = e;
            }
        }
        c0 = c1;
    }
}
