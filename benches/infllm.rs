//! InfLLM-v2's stage 1 at MiniCPM4's shapes (issue 42's speed target).
//!
//! `cargo bench --bench infllm` (`-- --quick` for fewer repetitions).
//!
//! 32 query heads over 2 KV heads of 128, 131,072 tokens (8,191 compressed
//! keys, 2,048 blocks), MiniCPM4's `init_blocks 1`, `local_blocks 32`,
//! `topk 64`; a decoding query and a 2,048-token prefill chunk at the end of
//! the sequence. The compressed keys are an input (kvselect takes them
//! precomputed: engines keep them in a cache, appended as tokens arrive), so
//! their making is not timed.
//!
//! Reported, on one thread (the pool at 1 thread; each phase by the
//! calling thread's clock, `kvselect::infllm::profile::phases`, the same
//! kernels in the same order as the call):
//!
//! - the dot products' rate against `kvselect::simd::fma_floor` on the same
//!   thread count, timed beside it (target: at least 60%);
//! - the softmax's and the pooling's (with the top-k) share of the call
//!   (target: at most 25%);
//! - the whole call (`select_into`) at 1 and 2 threads, wall clock, its
//!   repetitions interleaved with the floor's: medians.
//!
//! Machines are shared and noisy: compare ratios from one run.

use std::time::{Duration, Instant};

use kvselect::infllm::{self, profile, Config, Heads};
use kvselect::keys::Encoded;
use kvselect::{pool, simd};

const HQ: usize = 32;
const HKV: usize = 2;
const D: usize = 128;
const TOKENS: usize = 131_072;

fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Seconds the floor takes for `flops` on the pool's threads, measured over
/// at least about 50 ms of it (a short run is all noise on a shared machine).
fn floor_secs(flops: f64) -> f64 {
    let per = simd::fma_floor(1).0 as f64;
    let iters = (flops / per).max(2e9 / per) as usize;
    let t = Instant::now();
    std::hint::black_box(simd::fma_floor(iters));
    t.elapsed().as_secs_f64() / (iters as f64 * per) * flops
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let reps = if quick { 3 } else { 7 };
    let cfg = Config::minicpm4(D);
    let n_c = infllm::compressed_len(TOKENS);
    let ck = data(n_c * HKV * D, 7);
    println!(
        "InfLLM-v2 stage 1: {HQ} heads over {HKV} KV heads, d {D}, {TOKENS} tokens ({n_c} compressed keys), \
         simd {:?}",
        simd::level()
    );
    for (name, n_q) in [("decode", 1usize), ("prefill 2048", 2048)] {
        let q = data(n_q * HQ * D, 11 + n_q as u64);
        let mut out = vec![0i32; n_q * HKV * cfg.top_k];
        pool::set_num_threads(1);
        let (mut dots, mut soft, mut pool_sel, mut total, mut floor) =
            (vec![], vec![], vec![], vec![], vec![]);
        let mut pack = vec![];
        let mut flops = 0;
        for _ in 0..reps {
            let ph = profile::phases(&q, HQ, &ck, HKV, D, TOKENS, &cfg, &mut out);
            flops = ph.dot_flops;
            let all = ph.pack + ph.dots + ph.softmax + ph.pool_select;
            dots.push(ph.dots.as_secs_f64());
            pack.push(ph.pack.as_secs_f64());
            soft.push(ph.softmax.as_secs_f64() / all.as_secs_f64());
            pool_sel.push(ph.pool_select.as_secs_f64() / all.as_secs_f64());
            total.push(all.as_secs_f64());
            floor.push(floor_secs(flops as f64));
        }
        let (dots, floor) = (median(dots), median(floor));
        let (soft, pool_sel) = (median(soft), median(pool_sel));
        println!(
            "{name}: 1 thread: call {:.2} ms (packing the keys {:.2} ms); dot products {:.2} ms = {:.1} GFLOP/s, \
             {:.0}% of the FMA floor ({:.1} GFLOP/s); softmax {:.1}% + pooling and top-k {:.1}% = {:.1}% of the call",
            median(total) * 1e3,
            median(pack) * 1e3,
            dots * 1e3,
            flops as f64 / dots / 1e9,
            100.0 * floor / dots,
            flops as f64 / floor / 1e9,
            100.0 * soft,
            100.0 * pool_sel,
            100.0 * (soft + pool_sel),
        );
        for threads in [1usize, 2] {
            pool::set_num_threads(threads);
            let (mut call, mut fl) = (vec![], vec![]);
            for _ in 0..reps {
                let t = Instant::now();
                infllm::select_into(
                    Encoded::F32(&q),
                    Encoded::F32(&ck),
                    None,
                    Heads {
                        n_q_heads: HQ,
                        n_kv_heads: HKV,
                        d: D,
                    },
                    TOKENS,
                    &cfg,
                    &mut out,
                )
                .unwrap();
                call.push(t.elapsed().as_secs_f64());
                fl.push(floor_secs(flops as f64));
            }
            let (c, f) = (median(call), median(fl));
            println!(
                "{name}: select_into at {threads} thread(s): {:.2} ms wall; the floor's time for its dot products \
                 {:.2} ms ({:.0}%)",
                c * 1e3,
                f * 1e3,
                100.0 * f / c
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
