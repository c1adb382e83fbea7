//! Block-sparse selection at the released MiniMax-M3 geometry (block 128,
//! top 16, init 0, local 1; 4 KV heads, index dim 128).
//!
//! - `decode`: one query against 131,072 keys -- memory-bound; compared with
//!   `read_keys_floor`, a plain pass that only reads the same 64 MiB of keys
//!   once on the same number of threads (no fused kernel can beat it by
//!   much; it pays a thread spawn per iteration, ~0.1 ms).
//! - `prefill`: 512 consecutive queries at the end of a 16,384-key sequence
//!   -- compute-bound.
//!
//! The NumPy side (`index_k @ index_q.T`, the bare BLAS product) is in the
//! Python benchmark script; report ratios, the machines are shared.
//!
//! Run: `cargo bench --bench block_sparse`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kvselect::block_sparse::{
    select_batch_encoded_into, select_batch_into, select_into, select_packed_into,
    BlockSparseConfig, OutLayout,
};
use kvselect::keys::Encoded;

const HEADS: usize = 4;
const D: usize = 128;

fn config() -> BlockSparseConfig {
    BlockSparseConfig {
        block_size: 128,
        top_blocks: 16,
        init_blocks: 0,
        local_blocks: 1,
    }
}

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

fn decode(c: &mut Criterion) {
    let n_pos = 131_072;
    let cfg = config();
    let keys = random(n_pos * D, 1);
    let q = random(HEADS * D, 2);
    let mut out = vec![0i32; HEADS * cfg.width()];

    let mut group = c.benchmark_group("block_sparse/decode");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .throughput(Throughput::Bytes((keys.len() * 4) as u64));
    group.bench_function("select_into", |b| {
        b.iter(|| {
            select_into(
                black_box(&q),
                HEADS,
                black_box(&keys),
                D,
                n_pos - 1,
                &cfg,
                &mut out,
            )
            .expect("valid shapes");
            black_box(&out);
        })
    });
    // The same keys in the engines' formats (bfloat16: the upper halves;
    // fp8: any byte but NaN), read in place.
    let bf16: Vec<u16> = keys.iter().map(|x| (x.to_bits() >> 16) as u16).collect();
    let fp8: Vec<u8> = (0..keys.len()).map(|i| (i * 37 % 127) as u8).collect();
    for (name, k) in [
        ("bf16", Encoded::Bf16(&bf16)),
        ("fp8", Encoded::Fp8E4m3(&fp8)),
    ] {
        group.bench_function(format!("select_into/{name}"), |b| {
            b.iter(|| {
                let (q, pos) = (Encoded::F32(black_box(&q)), [n_pos - 1]);
                let layout = OutLayout::QueryMajor;
                select_batch_encoded_into(q, 1, HEADS, k, D, &pos, &cfg, layout, &mut out)
                    .expect("valid shapes");
                black_box(&out);
            })
        });
    }
    group.bench_function("read_keys_floor", |b| {
        // Reads the keys once on as many threads as the selection uses, in
        // eight independent lanes per thread: bandwidth-, not latency-bound.
        let threads = kvselect::pool::num_threads().max(1);
        let part = keys.len().div_ceil(threads).div_ceil(8) * 8;
        b.iter(|| {
            std::thread::scope(|scope| {
                for chunk in black_box(&keys).chunks(part.max(8)) {
                    scope.spawn(move || {
                        let mut acc = [0.0f32; 8];
                        for row in chunk.chunks_exact(8) {
                            for (a, v) in acc.iter_mut().zip(row) {
                                *a += v;
                            }
                        }
                        black_box(acc);
                    });
                }
            });
        })
    });
    group.finish();
}

fn prefill(c: &mut Criterion) {
    let n_pos = 16_384;
    let n_q = 512;
    let cfg = config();
    let keys = random(n_pos * D, 3);
    let q = random(n_q * HEADS * D, 4);
    let pos: Vec<usize> = (n_pos - n_q..n_pos).collect();
    let mut out = vec![0i32; n_q * HEADS * cfg.width()];

    let mut group = c.benchmark_group("block_sparse/prefill");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    group.bench_function("select_batch_into", |b| {
        b.iter(|| {
            select_batch_into(
                black_box(&q),
                n_q,
                HEADS,
                black_box(&keys),
                D,
                &pos,
                &cfg,
                &mut out,
            )
            .expect("valid shapes");
            black_box(&out);
        })
    });
    group.finish();
}

/// A packed serving batch: 8 sequences of 16,384 keys each, concatenated,
/// one decode query per sequence; beside it, the same work as 8 separate
/// calls (the packed form should cost no more).
fn packed(c: &mut Criterion) {
    let n_seqs = 8;
    let len = 16_384;
    let cfg = config();
    let keys = random(n_seqs * len * D, 5);
    let q = random(n_seqs * HEADS * D, 6);
    let cu: Vec<usize> = (0..=n_seqs).map(|s| s * len).collect();
    let seq_ids: Vec<usize> = (0..n_seqs).collect();
    let pos = vec![len - 1; n_seqs];
    let mut out = vec![0i32; n_seqs * HEADS * cfg.width()];

    let mut group = c.benchmark_group("block_sparse/packed");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .throughput(Throughput::Bytes((keys.len() * 4) as u64));
    group.bench_function("select_packed_into", |b| {
        b.iter(|| {
            select_packed_into(
                black_box(&q),
                n_seqs,
                HEADS,
                black_box(&keys),
                D,
                &cu,
                &seq_ids,
                &pos,
                &cfg,
                &mut out,
            )
            .expect("valid shapes");
            black_box(&out);
        })
    });
    group.bench_function("one_call_per_sequence", |b| {
        let w = HEADS * cfg.width();
        b.iter(|| {
            for s in 0..n_seqs {
                select_into(
                    black_box(&q[s * HEADS * D..(s + 1) * HEADS * D]),
                    HEADS,
                    black_box(&keys[s * len * D..(s + 1) * len * D]),
                    D,
                    len - 1,
                    &cfg,
                    &mut out[s * w..(s + 1) * w],
                )
                .expect("valid shapes");
            }
            black_box(&out);
        })
    });
    group.finish();
}

/// Decode against the number of KV heads at a fixed 32,768 positions: one
/// read of the keys serves every head, so the cost should grow far slower
/// than the head count.
fn decode_vs_heads(c: &mut Criterion) {
    let n_pos = 32_768;
    let cfg = config();
    let keys = random(n_pos * D, 7);
    let mut group = c.benchmark_group("block_sparse/decode_vs_heads");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .throughput(Throughput::Bytes((keys.len() * 4) as u64));
    for heads in [1usize, 4, 8, 16] {
        let q = random(heads * D, 8);
        let mut out = vec![0i32; heads * cfg.width()];
        group.bench_function(format!("select_into/{heads}"), |b| {
            b.iter(|| {
                select_into(
                    black_box(&q),
                    heads,
                    black_box(&keys),
                    D,
                    n_pos - 1,
                    &cfg,
                    &mut out,
                )
                .expect("valid shapes");
                black_box(&out);
            })
        });
    }
    group.finish();
}

criterion_group!(benches, decode, decode_vs_heads, prefill, packed);
criterion_main!(benches);
