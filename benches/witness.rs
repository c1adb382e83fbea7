//! Criterion benches for the witness hot paths, each memory-bound group with
//! a `copy_from_slice` of the same buffer as its ceiling.
//!
//! `cargo bench --bench witness`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kvselect::witness::{
    apply_topology_witnesses_into, scatter_topology_witnesses, topology_witness_indices_into,
};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

const TOPK: usize = 2048;
const S: usize = 64;
const CONTEXT: i32 = 131_072;

/// Worst case: each row's tokens in a random half of the segments, in random
/// order, tail reserved as padding. Best case: tokens spread uniformly.
fn buffer(rows: usize, worst: bool) -> Vec<i32> {
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let seg_len = CONTEXT / S as i32;
    let mut buf = vec![-1; rows * TOPK];
    for row in buf.chunks_mut(TOPK) {
        let mut segs: Vec<i32> = (0..S as i32).collect();
        for i in (1..S).rev() {
            segs.swap(i, rng.random_range(0..=i));
        }
        for x in &mut row[..TOPK - S] {
            *x = if worst {
                segs[rng.random_range(0..S / 2)] * seg_len + rng.random_range(0..seg_len)
            } else {
                rng.random_range(0..CONTEXT)
            };
        }
    }
    buf
}

fn witnesses(c: &mut Criterion) {
    for worst in [true, false] {
        let name = if worst {
            "witness_worst"
        } else {
            "witness_best"
        };
        let mut g = c.benchmark_group(name);
        for rows in [32usize, 512, 4096] {
            let pristine = buffer(rows, worst);
            let lens = vec![CONTEXT; rows];
            let bytes = (pristine.len() * 4) as u64;
            g.throughput(Throughput::Bytes(bytes));
            let mut dst = vec![0; pristine.len()];
            g.bench_with_input(BenchmarkId::new("copy_from_slice", rows), &rows, |b, _| {
                b.iter(|| dst.copy_from_slice(&pristine))
            });
            let mut buf = pristine.clone();
            g.bench_with_input(BenchmarkId::new("scatter", rows), &rows, |b, _| {
                b.iter(|| {
                    // Restore the reserved tails (all the scatter wrote), so
                    // every iteration sees the same worst-case buffer.
                    for row in buf.chunks_mut(TOPK) {
                        row[TOPK - S..].fill(-1);
                    }
                    scatter_topology_witnesses(&mut buf, TOPK, &lens, S).unwrap()
                })
            });
            g.bench_with_input(BenchmarkId::new("apply_into", rows), &rows, |b, _| {
                b.iter(|| {
                    apply_topology_witnesses_into(&pristine, TOPK, &lens, TOPK - S, S, S, &mut dst)
                        .unwrap()
                })
            });
            let mut w = vec![0; rows * S];
            g.bench_with_input(
                BenchmarkId::new("witness_indices_into", rows),
                &rows,
                |b, _| {
                    b.iter(|| {
                        topology_witness_indices_into(&pristine, TOPK, &lens, S, &mut w).unwrap()
                    })
                },
            );
        }
        g.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).warm_up_time(std::time::Duration::from_millis(300)).measurement_time(std::time::Duration::from_secs(1));
    targets = witnesses
}
criterion_main!(benches);
