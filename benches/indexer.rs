//! The lightning indexer at DeepSeek-V3.2's geometry (64 index heads of
//! dimension 128, top-k 2048).
//!
//! - `decode`: one query against 131,072 keys, float32, bfloat16 and fp8
//!   (with per-key scales) — 2·H·d = 16,384 flops per key, compute-bound;
//!   `fma_floor` beside it is [`kvselect::simd::fma_floor`], a
//!   register-resident FMA loop doing the same flops on the same threads at
//!   the same SIMD level: the machine's floor, for a fraction.
//! - `prefill`: 128 queries at the end of a 32,768-key sequence.
//!
//! The NumPy side (`index_k @ index_q.T`, the bare product, and the pipeline
//! a user would write) is in `benches/compare.py`; report ratios.
//!
//! Run: `cargo bench --bench indexer`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kvselect::indexer::{indexer_topk_into, IndexerInputs, IndexerShape};
use kvselect::keys::Encoded;

const H: usize = 64;
const D: usize = 128;
const TOPK: usize = 2048;

/// Deterministic values in [-1, 1) with a full mantissa (xorshift).
fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn run(
    q: &[f32],
    w: &[f32],
    k: Encoded<'_>,
    scale: Option<&[f32]>,
    pos: &[usize],
    n_keys: usize,
    out: &mut [i32],
) {
    let shape = IndexerShape {
        n_queries: pos.len(),
        n_heads: H,
        d: D,
        n_keys,
    };
    let inputs = IndexerInputs {
        q: Encoded::F32(q),
        weights: w,
        k,
        key_scale: scale,
        query_pos: pos,
        compress_ratio: 1,
    };
    indexer_topk_into(&shape, &inputs, TOPK, 0, out, None).expect("valid shapes");
}

fn decode(c: &mut Criterion) {
    let t = 131_072;
    let keys = random(t * D, 1);
    let bf16: Vec<u16> = keys.iter().map(|x| (x.to_bits() >> 16) as u16).collect();
    let fp8: Vec<u8> = keys
        .iter()
        .map(|x| ((x.to_bits() >> 24) as u8) & 0x7E)
        .collect();
    let scale = random(t, 5)
        .iter()
        .map(|x| x.abs() + 0.5)
        .collect::<Vec<_>>();
    let q = random(H * D, 2);
    let w = random(H, 3);
    let mut out = vec![0i32; TOPK];
    let mut group = c.benchmark_group("indexer/decode");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    group.throughput(Throughput::Elements((2 * H * D * t) as u64));
    group.bench_function("float32", |b| {
        b.iter(|| run(&q, &w, Encoded::F32(&keys), None, &[t - 1], t, &mut out))
    });
    group.bench_function("bfloat16", |b| {
        b.iter(|| run(&q, &w, Encoded::Bf16(&bf16), None, &[t - 1], t, &mut out))
    });
    group.bench_function("fp8_scaled", |b| {
        b.iter(|| {
            run(
                &q,
                &w,
                Encoded::Fp8E4m3(&fp8),
                Some(&scale),
                &[t - 1],
                t,
                &mut out,
            )
        })
    });
    // The floor doing the same flops: steps of FLOOR_CHAINS chains of 16
    // lanes (AVX-512; 8 with AVX2) on every thread.
    let lanes = match kvselect::simd::level() {
        kvselect::simd::Level::Avx512 | kvselect::simd::Level::Avx512Bf16 => 16,
        kvselect::simd::Level::Avx2 => 8,
        kvselect::simd::Level::Scalar => 1,
    };
    let per_step = kvselect::pool::num_threads() * kvselect::simd::FLOOR_CHAINS * lanes * 2;
    group.bench_function("fma_floor", |b| {
        b.iter(|| black_box(kvselect::simd::fma_floor(2 * H * D * t / per_step)))
    });
    group.finish();
}

fn prefill(c: &mut Criterion) {
    let (t, n) = (32_768, 128);
    let keys = random(t * D, 4);
    let q = random(n * H * D, 6);
    let w = random(n * H, 7);
    let pos: Vec<usize> = (t - n..t).collect();
    let mut out = vec![0i32; n * TOPK];
    let mut group = c.benchmark_group("indexer/prefill");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    group.throughput(Throughput::Elements((2 * H * D * t * n) as u64));
    group.bench_function("float32", |b| {
        b.iter(|| run(&q, &w, Encoded::F32(&keys), None, &pos, t, &mut out))
    });
    group.finish();
}

criterion_group!(benches, decode, prefill);
criterion_main!(benches);
