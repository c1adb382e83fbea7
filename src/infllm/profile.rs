//! The call's phases timed one by one, on the calling thread: what the
//! benchmark (`benches/infllm.rs`) reports as the dot products' rate and
//! the softmax's and pooling's share. The same kernels and order as
//! [`super::select_into`], one row after another.

use super::score::{block_scores, logits, softmax_sums, start, Packed, Scratch};
use super::{select, Config};
use crate::simd::Isa;
use std::time::{Duration, Instant};

/// Seconds spent in each phase of one call.
#[derive(Debug, Clone, Copy, Default)]
pub struct Phases {
    /// Packing the compressed keys for the score kernels.
    pub pack: Duration,
    /// The dot products (times the scale).
    pub dots: Duration,
    /// Each head's softmax and the group sum.
    pub softmax: Duration,
    /// The pooling, forcing and the top-k rows.
    pub pool_select: Duration,
    /// Floating-point operations of the dot products (2 a multiply-add).
    pub dot_flops: u64,
}

/// [`super::select_into`]'s work for float32 `q` `[n_q, n_q_heads, d]` and
/// `ck` `[n_c, n_kv_heads, d]` (shapes as it checks them; a caller's
/// mistake panics here: this is a benchmark's probe), timed by phase on
/// one thread; the rows are written to `out`.
#[allow(clippy::too_many_arguments)]
pub fn phases(
    q: &[f32],
    n_q_heads: usize,
    ck: &[f32],
    n_kv: usize,
    d: usize,
    seq_len: usize,
    cfg: &Config,
    out: &mut [i32],
) -> Phases {
    let isa = Isa::best();
    let g = cfg.geometry;
    let (n_c, nb, group) = (
        g.compressed_len(seq_len),
        g.n_blocks(seq_len),
        n_q_heads / n_kv,
    );
    let n_q = q.len() / (n_q_heads * d);
    assert_eq!(
        ck.len(),
        n_c * n_kv * d,
        "ck is not the compressed keys of seq_len"
    );
    assert_eq!(
        out.len(),
        n_q * n_kv * cfg.top_k,
        "out is not [n_q, n_kv, top_k]"
    );
    let mut ph = Phases::default();
    let t = Instant::now();
    let packed: Vec<Packed> = (0..n_kv)
        .map(|h| Packed::new(isa, ck, n_c, n_kv, h, d))
        .collect();
    ph.pack = t.elapsed();
    let mut scratch = Scratch::default();
    let (mut blocks, mut ids) = (vec![0.0f32; nb], Vec::new());
    for i in 0..n_q {
        let p = seq_len - n_q + i;
        let n_vis = g.visible(p);
        for h in 0..n_kv {
            let qg = &q[(i * n_q_heads + h * group) * d..(i * n_q_heads + (h + 1) * group) * d];
            start(&mut scratch, group, n_vis);
            let t = Instant::now();
            logits(
                isa,
                qg,
                group,
                d,
                &packed[h],
                n_vis,
                cfg.scale,
                &mut scratch,
            );
            ph.dots += t.elapsed();
            let t = Instant::now();
            softmax_sums(isa, group, n_vis, &mut scratch);
            ph.softmax += t.elapsed();
            ph.dot_flops += (2 * group * n_vis * d) as u64;
            let t = Instant::now();
            block_scores(cfg, &scratch.sums, n_c, p, &mut blocks);
            let row = &mut out[(i * n_kv + h) * cfg.top_k..(i * n_kv + h + 1) * cfg.top_k];
            select::row(
                &blocks,
                cfg.top_k,
                cfg.keep,
                p / g.block_size,
                &mut ids,
                row,
            );
            ph.pool_select += t.elapsed();
        }
    }
    ph
}
