//! Stage 1 and the pooling of one query against one KV head's compressed
//! keys, in the order of the module docs.

use super::{Config, Pooling};
use crate::attention::kernels::{pack_keys, scores, softmax, KEY_TILE, ROW_TILE};
use crate::simd::lines::Floats;
use crate::simd::Isa;

/// One KV head's compressed keys, packed for the score kernels of `isa`.
pub(crate) struct Packed {
    pub keys: Vec<f32>,
}

impl Packed {
    /// Packs keys `0..n_c` of KV head `g` of `ck` (`[n_c, n_kv_heads, d]`,
    /// float32).
    pub(crate) fn new(isa: Isa, ck: &[f32], n_c: usize, n_kv: usize, g: usize, d: usize) -> Packed {
        Packed::new_in(Vec::new(), isa, ck, n_c, n_kv, g, d)
    }

    /// [`Packed::new`] into `keys`, a buffer reused from an earlier call
    /// (its old contents only fill the padding keys, whose scores are never
    /// read: `softmax_sums` masks every key from `n_vis` on).
    pub(crate) fn new_in(
        mut keys: Vec<f32>,
        isa: Isa,
        ck: &[f32],
        n_c: usize,
        n_kv: usize,
        g: usize,
        d: usize,
    ) -> Packed {
        pack_keys(isa, &mut keys, ck, d, n_c, |j| (j * n_kv + g) * d);
        if keys.len() < n_c.next_multiple_of(2 * KEY_TILE) * d {
            keys.resize(n_c.next_multiple_of(2 * KEY_TILE) * d, 0.0);
        }
        Packed { keys }
    }
}

/// Scratch reused across the rows a thread computes.
#[derive(Default)]
pub(crate) struct Scratch {
    /// On a cache-line boundary, as `qt` ([`Floats`]): rows of a multiple
    /// of 16 floats never split a line (the panels' logit rows are `n_vis`
    /// rounded up to 8: every other one may).
    pub(super) logits: Floats,
    pub sums: Vec<f32>,
    /// The group's queries transposed ([`super::heads::group_sums`]).
    pub(super) qt: Floats,
}

/// `S_j` for `j < n_vis`: the group's softmax probabilities summed, head
/// by head in order, into `scratch.sums[..n_vis]` (zeros when `n_vis == 0`).
/// `q` holds the group's `heads` query rows of `d` (`q[h · d..]`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn group_sums(
    isa: Isa,
    q: &[f32],
    heads: usize,
    d: usize,
    packed: &Packed,
    n_vis: usize,
    scale: f32,
    scratch: &mut Scratch,
) {
    start(scratch, heads, n_vis);
    if n_vis == 0 {
        return;
    }
    logits(isa, q, heads, d, packed, n_vis, scale, scratch);
    softmax_sums(isa, heads, n_vis, scratch);
}

/// Zeroes the sums and sizes the logits: `heads` rows of `round_up(n_vis,
/// 32)`.
pub(crate) fn start(scratch: &mut Scratch, heads: usize, n_vis: usize) {
    scratch.sums.clear();
    scratch.sums.resize(n_vis, 0.0);
    scratch
        .logits
        .resize(heads * n_vis.next_multiple_of(2 * KEY_TILE), 0.0);
}

/// Every head's logits over keys `0..n_vis`. The keys are the outer loop:
/// each 32-key tile is scored against every head (tiles of [`ROW_TILE`])
/// while it sits in L1, so the packed keys stream from memory once a call,
/// not once a head tile. The order of the tiles changes no arithmetic.
#[allow(clippy::too_many_arguments)]
pub(crate) fn logits(
    isa: Isa,
    q: &[f32],
    heads: usize,
    d: usize,
    packed: &Packed,
    n_vis: usize,
    scale: f32,
    scratch: &mut Scratch,
) {
    let width = n_vis.next_multiple_of(2 * KEY_TILE);
    let offs: Vec<usize> = (0..heads).map(|h| h * d).collect();
    let tile = 2 * KEY_TILE * d;
    for c in (0..n_vis).step_by(2 * KEY_TILE) {
        let tiles = if n_vis - c > KEY_TILE { 2 } else { 1 };
        let t = c / (2 * KEY_TILE);
        let keys = &packed.keys[t * tile..(t + 1) * tile];
        for h0 in (0..heads).step_by(ROW_TILE) {
            let rows = ROW_TILE.min(heads - h0);
            let out = &mut scratch.logits[h0 * width + c..];
            scores(
                isa,
                q,
                &offs[h0..h0 + rows],
                keys,
                tiles,
                d,
                scale,
                out,
                width,
            );
        }
    }
}

/// Each head in order: its softmax over keys `0..n_vis` (the row's maximum
/// shift, the project's `exp`, the lanes' sum), `e_j / Z` added to the sums.
pub(crate) fn softmax_sums(isa: Isa, heads: usize, n_vis: usize, scratch: &mut Scratch) {
    let width = n_vis.next_multiple_of(2 * KEY_TILE);
    let n8 = n_vis.next_multiple_of(8);
    for r in 0..heads {
        let row = &mut scratch.logits[r * width..r * width + n8];
        row[n_vis..].fill(f32::NEG_INFINITY);
        let (_, z) = softmax(isa, row);
        for (s, &e) in scratch.sums.iter_mut().zip(&row[..n_vis]) {
            *s += e / z;
        }
    }
}

/// Block `b`'s pooled score from the group sums (`sums[..n_vis]`, keys
/// `n_vis..n_c` scoring 0), before any forcing: with `s = kpb` keys per
/// block, the maximum over `[s b − 1, s b + s)` (`[4b − 1, 4b + 4)` at
/// MiniCPM4's geometry) clamped to `[0, n_c)` (`−inf` when empty) for the
/// CUDA kernel; `max(0, ..)` of it for the Triton one.
pub(crate) fn pooled(pooling: Pooling, sums: &[f32], n_c: usize, kpb: usize, b: usize) -> f32 {
    let lo = (kpb * b).saturating_sub(1);
    let hi = (kpb * b + kpb).min(n_c);
    let mut m = match pooling {
        Pooling::Cuda => f32::NEG_INFINITY,
        Pooling::Triton => 0.0,
    };
    for j in lo..hi {
        let v = sums.get(j).copied().unwrap_or(0.0);
        if v > m || m.is_nan() {
            m = v;
        }
    }
    m
}

/// The score of every block `0..out.len()` for the query at position `p`:
/// forced `+inf` / excluded `−inf` by the variant, else pooled.
pub(crate) fn block_scores(cfg: &Config, sums: &[f32], n_c: usize, p: usize, out: &mut [f32]) {
    let qb = p / cfg.geometry.block_size;
    let kpb = cfg.geometry.keys_per_block();
    for (b, o) in out.iter_mut().enumerate() {
        let init = b < cfg.init_blocks;
        *o = match cfg.pooling {
            Pooling::Cuda => {
                if init || (b <= qb && qb <= b + cfg.local_blocks) {
                    f32::INFINITY
                } else {
                    pooled(Pooling::Cuda, sums, n_c, kpb, b)
                }
            }
            Pooling::Triton => {
                if init {
                    f32::INFINITY
                } else if b <= qb && qb < b + cfg.local_blocks {
                    f32::NEG_INFINITY
                } else {
                    pooled(Pooling::Triton, sums, n_c, kpb, b)
                }
            }
        };
    }
}
