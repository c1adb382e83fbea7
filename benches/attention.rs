//! Criterion benches for the attention passes.
//!
//! `cargo bench --bench attention` (all groups), or one group:
//! `cargo bench --bench attention -- sparse_vs_k`.
//!
//! - `sparse_vs_k`: fixed context (L = 32768), growing selection: the time
//!   should grow linearly in k (gather only the selected rows).
//! - `sparse_vs_l`: fixed selection (k = 512), growing context: no work is
//!   O(L), so the time stays flat once K/V no longer fit in the last-level
//!   cache (below that, the scattered rows it gathers are cache hits).
//! - `dense_8192`: causal prefill, L = 8192, one head, d = 64 (and d = 128),
//!   to set beside NumPy's straightforward float32 pass on the same shape
//!   (`scores = q @ k.T * scale`, causal mask, softmax, `@ v`), e.g.
//!
//! ```text
//! env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python3 -c '
//! import time, numpy as np
//! L, d = 8192, 64; r = np.random.default_rng(0)
//! q, k, v = (r.standard_normal((L, d), dtype=np.float32) for _ in range(3))
//! mask = np.triu(np.ones((L, L), bool), 1)
//! def run():
//!     s = q @ k.T; s *= np.float32(d ** -0.5); s[mask] = -np.inf
//!     s -= s.max(1, keepdims=True); np.exp(s, out=s); s /= s.sum(1, keepdims=True)
//!     return s @ v
//! run(); t = time.perf_counter(); run(); print(time.perf_counter() - t)'
//! ```
//!
//! Machines are shared and noisy: compare ratios from one run, not absolute
//! times.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kvselect::attention::{dense_attention, softmax_scale, sparse_attention, AttentionShape};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Decode-style batch: 32 queries, 8 query heads over 2 KV heads, d = 128.
const QUERIES: usize = 32;
const Q_HEADS: usize = 8;
const KV_HEADS: usize = 2;
const D: usize = 128;

fn data(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
}

/// Queries at the end of an `n_keys` context, each KV row selecting `k`
/// distinct random keys (ascending, as a top-k sorted by index would be).
fn sparse_case(rng: &mut ChaCha8Rng, n_keys: usize, k: usize) -> (Vec<usize>, Vec<i32>) {
    let pos: Vec<usize> = (0..QUERIES).map(|i| n_keys - QUERIES + i).collect();
    let mut sel = Vec::with_capacity(QUERIES * KV_HEADS * k);
    for &p in &pos {
        for _ in 0..KV_HEADS {
            let mut row: Vec<i32> = rand::seq::index::sample(rng, p + 1, k.min(p + 1))
                .into_iter()
                .map(|x| x as i32)
                .collect();
            row.sort_unstable();
            row.resize(k, -1);
            sel.extend(row);
        }
    }
    (pos, sel)
}

fn bench_sparse(c: &mut Criterion, name: &str, cases: &[(usize, usize)], param_is_k: bool) {
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let mut g = c.benchmark_group(name);
    g.sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    let max_keys = cases.iter().map(|&(l, _)| l).max().unwrap();
    let k_all = data(&mut rng, max_keys * KV_HEADS * D);
    let v_all = data(&mut rng, max_keys * KV_HEADS * D);
    let q = data(&mut rng, QUERIES * Q_HEADS * D);
    let mut out = vec![0.0; QUERIES * Q_HEADS * D];
    let mut lse = vec![0.0; QUERIES * Q_HEADS];
    for &(n_keys, k) in cases {
        let (pos, sel) = sparse_case(&mut rng, n_keys, k);
        let shape = AttentionShape {
            n_queries: QUERIES,
            n_q_heads: Q_HEADS,
            n_kv_heads: KV_HEADS,
            d_k: D,
            d_v: D,
            n_keys,
        };
        let kk = &k_all[..n_keys * KV_HEADS * D];
        let vv = &v_all[..n_keys * KV_HEADS * D];
        // Query-head rows × selected keys × (d_k + d_v) multiply-adds.
        g.throughput(Throughput::Elements((QUERIES * Q_HEADS * k) as u64));
        let param = if param_is_k { k } else { n_keys };
        g.bench_with_input(
            BenchmarkId::new("sparse_attention", param),
            &param,
            |b, _| {
                b.iter(|| {
                    sparse_attention(
                        &q,
                        kk,
                        vv,
                        D,
                        &shape,
                        &pos,
                        &sel,
                        k,
                        softmax_scale(D),
                        &mut out,
                        &mut lse,
                    )
                    .unwrap()
                })
            },
        );
        // The memory-bound ceiling: gathering the selected key and value
        // rows with `copy_from_slice`, no arithmetic.
        let mut gathered = vec![0.0f32; 2 * k * D];
        g.bench_with_input(
            BenchmarkId::new("copy_from_slice_gather", param),
            &param,
            |b, _| {
                b.iter(|| {
                    for (r, row) in sel.chunks_exact(k).enumerate() {
                        let h = r % KV_HEADS;
                        for (slot, &j) in row.iter().enumerate().filter(|(_, &j)| j >= 0) {
                            let at = (j as usize * KV_HEADS + h) * D;
                            gathered[2 * slot * D..(2 * slot + 1) * D]
                                .copy_from_slice(&kk[at..at + D]);
                            gathered[(2 * slot + 1) * D..(2 * slot + 2) * D]
                                .copy_from_slice(&vv[at..at + D]);
                        }
                    }
                    std::hint::black_box(&gathered);
                })
            },
        );
    }
    g.finish();
}

fn sparse_vs_k(c: &mut Criterion) {
    let cases: Vec<(usize, usize)> = [64, 256, 1024, 4096].iter().map(|&k| (32_768, k)).collect();
    bench_sparse(c, "sparse_vs_k", &cases, true);
}

fn sparse_vs_l(c: &mut Criterion) {
    let cases: Vec<(usize, usize)> = [4_096, 16_384, 65_536].iter().map(|&l| (l, 512)).collect();
    bench_sparse(c, "sparse_vs_l", &cases, false);
}

fn dense_8192(c: &mut Criterion) {
    const L: usize = 8192;
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let mut g = c.benchmark_group("dense_8192");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    for d in [64usize, 128] {
        let q = data(&mut rng, L * d);
        let k = data(&mut rng, L * d);
        let v = data(&mut rng, L * d);
        let pos: Vec<usize> = (0..L).collect();
        let shape = AttentionShape {
            n_queries: L,
            n_q_heads: 1,
            n_kv_heads: 1,
            d_k: d,
            d_v: d,
            n_keys: L,
        };
        let mut out = vec![0.0; L * d];
        let mut lse = vec![0.0; L];
        g.bench_with_input(BenchmarkId::new("dense_attention", d), &d, |b, _| {
            b.iter(|| {
                dense_attention(
                    &q,
                    &k,
                    &v,
                    d,
                    &shape,
                    &pos,
                    softmax_scale(d),
                    &mut out,
                    &mut lse,
                )
                .unwrap()
            })
        });
    }
    g.finish();
}

criterion_group!(benches, sparse_vs_k, sparse_vs_l, dense_8192);
criterion_main!(benches);
