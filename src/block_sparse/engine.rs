//! The engine: block scoring fused with the max-pool, split across the
//! crate's pool by ranges of whole blocks, then the selection of each row.

use super::kernels::{run_segment, Segment, TileOut, MR};
use super::select::select_blocks;
use super::BlockSparseConfig;
use crate::pool;
use crate::simd::Avx2;

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

/// Query heads padded into 4-row tiles, `dp = d` rounded up to 8, zeros in
/// the padding (so a padded dimension contributes `fma(0, 0, acc)`).
pub(super) struct PaddedRows {
    pub(super) q: Vec<f32>,
    /// Exclusive end of the keys each (padded) row sees.
    pub(super) vis: Vec<usize>,
    pub(super) rows_pad: usize,
    pub(super) dp: usize,
}

impl PaddedRows {
    pub(super) fn new(q: &[f32], rows: usize, d: usize, row_vis: impl Fn(usize) -> usize) -> Self {
        let dp = d.div_ceil(8) * 8;
        let rows_pad = rows.div_ceil(MR) * MR;
        let mut qp = vec![0.0f32; rows_pad * dp];
        for (dst, src) in qp.chunks_exact_mut(dp).zip(q.chunks_exact(d)) {
            dst[..d].copy_from_slice(src);
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
        }
    }
}

/// Scores `index_q` (`vis.len()` queries × `heads` rows of `d`) against
/// `keys` and writes each row's selection with `write` into `out` rows of
/// `out_width`. Inputs are already validated.
#[allow(clippy::too_many_arguments)]
pub(super) fn run_engine<T: Send>(
    isa: Option<Avx2>,
    index_q: &[f32],
    heads: usize,
    vis: &[usize],
    keys: &[f32],
    d: usize,
    cfg: &BlockSparseConfig,
    out: &mut [T],
    out_width: usize,
    write: &(dyn Fn(&[usize], &mut [T]) + Sync),
    scratch_floats: usize,
) {
    let rows = vis.len() * heads;
    if rows == 0 || out_width == 0 {
        return;
    }
    let bs = cfg.block_size;
    let n_keys = keys.len() / d;
    let row_vis = |r: usize| vis[r / heads];
    let max_blocks = vis.iter().map(|v| v.div_ceil(bs)).max().unwrap_or(0);
    // Rows per group (a multiple of the tile height), so the scratch stays
    // within `scratch_floats` -- or one tile, when a single tile exceeds it.
    let group = (scratch_floats / max_blocks.max(1) / MR).max(1) * MR;
    let mut g0 = 0;
    while g0 < rows {
        let g1 = g0.saturating_add(group).min(rows);
        let padded = PaddedRows::new(&index_q[g0 * d..g1 * d], g1 - g0, d, |r| row_vis(g0 + r));
        let n_blocks = (g0..g1).map(|r| row_vis(r).div_ceil(bs)).max().unwrap_or(0);
        let rp = padded.rows_pad;
        // Block-major: scratch[b * rows_pad + r] is row r's max over block b.
        let mut scratch = vec![f32::NEG_INFINITY; n_blocks * rp];
        let keys_per_task = (TASK_WORK / (rp * padded.dp)).max(1);
        let blocks_per_task = keys_per_task.div_ceil(bs).max(1);
        let key_chunk = (KEY_CHUNK_BYTES / (4 * d)).max(MR);
        pool::for_each_row_mut(&mut scratch, rp * blocks_per_task, 1, |task, maxima| {
            score_blocks(
                isa,
                &padded,
                keys,
                d,
                n_keys,
                bs,
                task * blocks_per_task,
                maxima,
                key_chunk,
            );
        });

        let scratch = &scratch;
        let sel_rows = &mut out[g0 * out_width..g1 * out_width];
        pool::for_each_row_mut(sel_rows, out_width, 64, |r, row| {
            let nb = row_vis(g0 + r).div_ceil(bs);
            let mut cand = Vec::new();
            let mut sel = Vec::with_capacity(cfg.width().min(nb));
            select_blocks(nb, |b| scratch[b * rp + r], cfg, &mut cand, &mut sel);
            write(&sel, row);
        });
        g0 = g1;
    }
}

/// Fills `maxima` (block-major, `[n_blk][rows_pad]`, initialised to -inf)
/// with every padded row's max score over blocks `b0 .. b0 + n_blk`.
#[allow(clippy::too_many_arguments)]
pub(super) fn score_blocks(
    isa: Option<Avx2>,
    rows: &PaddedRows,
    keys: &[f32],
    d: usize,
    n_keys: usize,
    bs: usize,
    b0: usize,
    maxima: &mut [f32],
    key_chunk: usize,
) {
    let rp = rows.rows_pad;
    let n_blk = maxima.len() / rp;
    // Few row tiles: each key is used a few times and then never again, so
    // memory latency is what to hide (and with one tile, chunking buys
    // nothing).
    let tiles = rp / MR;
    let streaming = tiles <= STREAMING_TILES;
    let key_chunk = if tiles == 1 { usize::MAX } else { key_chunk };
    let k_start = b0.saturating_mul(bs).min(n_keys);
    let k_end = b0.saturating_add(n_blk).saturating_mul(bs).min(n_keys);
    let mut c0 = k_start;
    while c0 < k_end {
        let c1 = c0.saturating_add(key_chunk).min(k_end);
        for (t, tile_vis) in rows.vis.chunks_exact(MR).enumerate() {
            let lo = tile_vis.iter().copied().min().unwrap_or(0);
            let hi = tile_vis.iter().copied().max().unwrap_or(0);
            let end = c1.min(hi);
            if end <= c0 {
                continue; // no row of this tile sees any key of the chunk
            }
            let seg = Segment {
                q: &rows.q[t * MR * rows.dp..(t + 1) * MR * rows.dp],
                dp: rows.dp,
                keys,
                d,
                start: c0,
                end,
                mask_from: lo.max(c0),
                vis: [tile_vis[0], tile_vis[1], tile_vis[2], tile_vis[3]],
                bs,
                b0,
                prefetch: streaming,
            };
            let out = TileOut {
                maxima: &mut *maxima,
                stride: rp,
                col: t * MR,
            };
            run_segment(isa, &seg, out);
        }
        c0 = c1;
    }
}
