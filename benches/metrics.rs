//! Criterion benches for the metrics: dense probabilities (compute-bound),
//! batched coverage and recall over many rows, and the output relative error
//! (memory-bound, beside a `copy_from_slice` of the same rows as its ceiling).
//!
//! `cargo bench --bench metrics`

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kvselect::attention::AttentionShape;
use kvselect::metrics::{
    attention_mass_recall_rows, attention_probabilities, output_relative_error_rows,
    segment_coverage_rows,
};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn metrics(c: &mut Criterion) {
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let mut g = c.benchmark_group("metrics");
    g.sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));

    // Dense probabilities: 16 queries × 8 heads over L keys, d = 64.
    for n_keys in [4096usize, 32768] {
        let shape = AttentionShape {
            n_queries: 16,
            n_q_heads: 8,
            n_kv_heads: 2,
            d_k: 64,
            d_v: 64,
            n_keys,
        };
        let q: Vec<f32> = (0..16 * 8 * 64)
            .map(|_| rng.random::<f32>() - 0.5)
            .collect();
        let k: Vec<f32> = (0..n_keys * 2 * 64)
            .map(|_| rng.random::<f32>() - 0.5)
            .collect();
        let pos: Vec<usize> = (n_keys - 16..n_keys).collect();
        let mut out = vec![0.0f64; 16 * 8 * n_keys];
        g.throughput(Throughput::Elements((16 * 8 * n_keys) as u64));
        g.bench_with_input(
            BenchmarkId::new("probabilities", n_keys),
            &n_keys,
            |b, _| {
                b.iter(|| attention_probabilities(&q, &k, &shape, &pos, 0.125, &mut out).unwrap())
            },
        );
    }

    // Coverage and recall: rows of 2048 candidates over L = 32768.
    for rows in [64usize, 1024] {
        let (width, len) = (2048usize, 32768usize);
        let cand: Vec<i32> = (0..rows * width)
            .map(|_| rng.random_range(0..len as i32))
            .collect();
        let lens = vec![len; rows];
        let mut out = vec![0.0f64; rows];
        g.throughput(Throughput::Elements((rows * width) as u64));
        g.bench_with_input(BenchmarkId::new("coverage_rows", rows), &rows, |b, _| {
            b.iter(|| segment_coverage_rows(&cand, width, &lens, 64, &mut out).unwrap())
        });
        let attn: Vec<f64> = (0..rows * len).map(|_| rng.random::<f64>()).collect();
        g.throughput(Throughput::Bytes((rows * len * 8) as u64));
        g.bench_with_input(BenchmarkId::new("recall_rows", rows), &rows, |b, _| {
            b.iter(|| attention_mass_recall_rows(&cand, width, &attn, len, 1, &mut out).unwrap())
        });
        let mut copy = vec![0.0f64; attn.len()];
        g.bench_with_input(BenchmarkId::new("copy_from_slice", rows), &rows, |b, _| {
            b.iter(|| copy.copy_from_slice(black_box(&attn)))
        });
    }

    // Output relative error over 4096 rows of 128.
    let (rows, width) = (4096usize, 128usize);
    let a: Vec<f32> = (0..rows * width).map(|_| rng.random::<f32>()).collect();
    let b2: Vec<f32> = (0..rows * width).map(|_| rng.random::<f32>()).collect();
    let mut out = vec![0.0f64; rows];
    g.throughput(Throughput::Bytes((rows * width * 8) as u64));
    g.bench_function("output_relative_error_rows", |b| {
        b.iter(|| output_relative_error_rows(&a, &b2, width, &mut out).unwrap())
    });
    let mut copy = vec![0.0f32; a.len()];
    g.bench_function("copy_from_slice_error_rows", |b| {
        b.iter(|| copy.copy_from_slice(black_box(&a)))
    });
    g.finish();
}

criterion_group!(benches, metrics);
criterion_main!(benches);
