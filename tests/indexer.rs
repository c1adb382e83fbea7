//! The lightning indexer's rule, pinned by hand examples and checked on
//! randomised inputs against a plain float64 oracle.

use kvselect::indexer::{indexer_scores_into, indexer_topk_into, IndexerInputs, IndexerShape};
use kvselect::keys::{bf16_to_f32, f16_to_f32, fp8_e4m3fn_to_f32, Encoded};
use kvselect::witness::scatter_topology_witnesses;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// One f32 single-sequence call: `q` `[n, h, d]`, `w` `[n, h]`, `k` `[t, d]`.
struct Case {
    h: usize,
    d: usize,
    q: Vec<f32>,
    w: Vec<f32>,
    k: Vec<f32>,
    scale: Option<Vec<f32>>,
    pos: Vec<usize>,
}

impl Case {
    fn n(&self) -> usize {
        self.pos.len()
    }
    fn t(&self) -> usize {
        self.k.len() / self.d
    }
    fn run_with(&self, k: Encoded<'_>, topk: usize, s: usize) -> (Vec<i32>, Vec<f32>) {
        let shape = IndexerShape {
            n_queries: self.n(),
            n_heads: self.h,
            d: self.d,
            n_keys: self.t(),
        };
        let inputs = IndexerInputs {
            q: Encoded::F32(&self.q),
            weights: &self.w,
            k,
            key_scale: self.scale.as_deref(),
            query_pos: &self.pos,
            compress_ratio: 1,
        };
        let mut out = vec![7; self.n() * topk];
        let mut scores = vec![7.0; self.n() * topk];
        indexer_topk_into(&shape, &inputs, topk, s, &mut out, Some(&mut scores)).unwrap();
        (out, scores)
    }
    fn run(&self, topk: usize, s: usize) -> Vec<i32> {
        self.run_with(Encoded::F32(&self.k), topk, s).0
    }

    /// The rule in float64: scores of keys `0..L`, then the total order.
    fn oracle(&self, i: usize, topk: usize) -> Vec<i32> {
        let len = (self.pos[i] + 1).min(self.t());
        let score = |t: usize| -> f64 {
            let mut s = 0.0f64;
            for hh in 0..self.h {
                let qh = &self.q[(i * self.h + hh) * self.d..][..self.d];
                let dot: f64 = qh
                    .iter()
                    .zip(&self.k[t * self.d..][..self.d])
                    .map(|(&a, &b)| a as f64 * b as f64)
                    .sum();
                let r = if dot.is_nan() { f64::NAN } else { dot.max(0.0) };
                s += self.w[i * self.h + hh] as f64 * r;
            }
            s * self.scale.as_ref().map_or(1.0, |c| c[t] as f64) + 0.0
        };
        let mut order: Vec<(f64, usize)> = (0..len).map(|t| (score(t), t)).collect();
        order.sort_by(|a, b| match (a.0.is_nan(), b.0.is_nan()) {
            (true, true) => a.1.cmp(&b.1),
            (true, false) => std::cmp::Ordering::Greater,
            (false, true) => std::cmp::Ordering::Less,
            _ => b.0.partial_cmp(&a.0).unwrap().then(a.1.cmp(&b.1)),
        });
        let mut row = vec![-1; topk];
        for (slot, &(_, t)) in row.iter_mut().zip(&order) {
            *slot = t as i32;
        }
        row
    }
}

/// One query, one head of dimension 1: score(t) = w · max(q · k_t, 0).
fn one_head(k: &[f32], q: f32, w: f32, pos: usize) -> Case {
    Case {
        h: 1,
        d: 1,
        q: vec![q],
        w: vec![w],
        k: k.to_vec(),
        scale: None,
        pos: vec![pos],
    }
}

#[test]
fn ties_go_to_the_lower_position() {
    let c = one_head(&[1.0, 3.0, 2.0, 3.0, 3.0, 1.0], 1.0, 1.0, 5);
    assert_eq!(c.run(4, 0), vec![1, 3, 4, 2]);
}

#[test]
fn a_relu_plateau_of_zeros_is_filled_from_the_lowest_positions() {
    // Negative dot products are all 0 after the ReLU: one plateau, taken
    // from position 0 up, after the positive scores.
    let c = one_head(&[-1.0, -5.0, 2.0, -3.0, -0.5, 4.0, -2.0], 1.0, 1.0, 6);
    assert_eq!(c.run(5, 0), vec![5, 2, 0, 1, 3]);
}

#[test]
fn minus_zero_and_plus_zero_are_one_score() {
    // A negative key scale turns a zero into -0.0: still a tie with +0.0,
    // so the lower position goes first (ranking on raw bits would put the
    // -0.0 keys 0 and 2 after key 1).
    let c = Case {
        h: 1,
        d: 1,
        q: vec![0.0],
        w: vec![1.0],
        k: vec![1.0, -1.0, 2.0],
        scale: Some(vec![-1.0, 1.0, -1.0]),
        pos: vec![2],
    };
    let (row, scores) = c.run_with(Encoded::F32(&c.k), 3, 0);
    assert_eq!(row, vec![0, 1, 2]);
    assert!(
        scores.iter().all(|s| s.to_bits() == 0),
        "canonical +0.0: {scores:?}"
    );
}

#[test]
fn a_short_row_holds_every_position_in_rank_order_then_padding() {
    let c = one_head(&[1.0, 4.0, 2.0, 9.0, 9.0], 1.0, 1.0, 2);
    assert_eq!(c.run(6, 0), vec![1, 2, 0, -1, -1, -1]);
}

#[test]
fn a_query_at_position_zero_sees_only_key_zero() {
    let c = one_head(&[1.0, 100.0, 100.0], 1.0, 1.0, 0);
    assert_eq!(c.run(3, 0), vec![0, -1, -1]);
}

#[test]
fn a_query_past_the_keys_is_clipped_to_what_exists() {
    let c = one_head(&[1.0, 2.0], 1.0, 1.0, 1_000_000);
    assert_eq!(c.run(3, 0), vec![1, 0, -1]);
}

#[test]
fn a_nan_key_ranks_last_and_never_joins_the_zero_plateau() {
    // Key 0 is NaN: its dot product is NaN, and the ReLU must keep it NaN,
    // or it would win the zero tie at position 0.
    let c = one_head(&[f32::NAN, -1.0, 3.0, -2.0], 1.0, 1.0, 3);
    let (row, scores) = c.run_with(Encoded::F32(&c.k), 4, 0);
    assert_eq!(row, vec![2, 1, 3, 0]);
    assert!(scores[3].is_nan() && scores[1] == 0.0);
    // A NaN ranks below -inf too.
    let c = Case {
        h: 1,
        d: 1,
        q: vec![1.0],
        w: vec![-1.0],
        k: vec![f32::NAN, f32::INFINITY, 1.0],
        scale: None,
        pos: vec![2],
    };
    assert_eq!(c.run(3, 0), vec![2, 1, 0]);
}

#[test]
fn scores_are_summed_over_heads_with_their_weights_and_scaled_per_key() {
    // Two heads of d = 2; key scale 2 on key 1, 0.5 on key 2.
    let c = Case {
        h: 2,
        d: 2,
        q: vec![1.0, 0.0, 0.0, 1.0],
        w: vec![1.0, 3.0],
        k: vec![1.0, 0.0, 0.0, 1.0, 4.0, 1.0],
        scale: Some(vec![1.0, 2.0, 0.5]),
        pos: vec![2],
    };
    // score = c · (1·relu(k0) + 3·relu(k1)): 1, 6, 3.5
    let (row, scores) = c.run_with(Encoded::F32(&c.k), 3, 0);
    assert_eq!(row, vec![1, 2, 0]);
    assert_eq!(scores, vec![6.0, 3.5, 1.0]);
}

#[test]
fn the_fp8_page_keys_with_scales_score_like_their_decoded_float32() {
    // Every e4m3fn byte but the NaNs, as keys of d = 2, with scales.
    let bytes: Vec<u8> = (0..=255u8).filter(|b| b & 0x7F != 0x7F).collect();
    let t = bytes.len() / 2;
    let bytes = &bytes[..2 * t];
    let decoded: Vec<f32> = bytes.iter().map(|&b| fp8_e4m3fn_to_f32(b)).collect();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let scale: Vec<f32> = (0..t)
        .map(|_| rng.random_range(1..5) as f32 / 4.0)
        .collect();
    let c = Case {
        h: 3,
        d: 2,
        q: vec![1.0, -2.0, 0.5, 0.25, -1.0, 1.0],
        w: vec![1.0, 2.0, 0.5],
        k: decoded,
        scale: Some(scale),
        pos: vec![t - 1],
    };
    let want = c.run_with(Encoded::F32(&c.k), t, 0);
    assert_eq!(c.run_with(Encoded::Fp8E4m3(bytes), t, 0).0, want.0);
    assert_eq!(c.run_with(Encoded::Fp8E4m3(bytes), t, 0).1, want.1);
}

fn random_case(rng: &mut ChaCha8Rng, integer: bool) -> Case {
    let (n, h, d, t) = (
        rng.random_range(1..5),
        rng.random_range(1..10),
        rng.random_range(1..40),
        rng.random_range(1..300),
    );
    let mut val = |lo: i32, hi: i32| -> f32 {
        if integer {
            rng.random_range(lo..=hi) as f32
        } else {
            rng.random::<f32>() * (hi - lo) as f32 + lo as f32
        }
    };
    let q = (0..n * h * d).map(|_| val(-3, 3)).collect();
    let w = (0..n * h).map(|_| val(-2, 2)).collect();
    let k = (0..t * d).map(|_| val(-3, 3)).collect();
    let scale = (t % 2 == 0).then(|| (0..t).map(|_| val(1, 4)).collect());
    let pos = (0..n).map(|_| rng.random_range(0..t + 5)).collect();
    Case {
        h,
        d,
        q,
        w,
        k,
        scale,
        pos,
    }
}

#[test]
fn on_integer_data_the_rows_equal_the_float64_rule_exactly() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for _ in 0..400 {
        let c = random_case(&mut rng, true);
        let topk = rng.random_range(1..40);
        let got = c.run(topk, 0);
        for i in 0..c.n() {
            assert_eq!(&got[i * topk..(i + 1) * topk], c.oracle(i, topk).as_slice());
        }
    }
}

#[test]
fn rows_are_in_rank_order_with_their_scores() {
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    for _ in 0..200 {
        let c = random_case(&mut rng, false);
        let topk = rng.random_range(1..60);
        let (rows, scores) = c.run_with(Encoded::F32(&c.k), topk, 0);
        for (row, sc) in rows.chunks(topk).zip(scores.chunks(topk)) {
            let valid = row.iter().take_while(|&&x| x >= 0).count();
            assert!(row[valid..].iter().all(|&x| x == -1));
            for j in 1..valid {
                let (a, b) = (sc[j - 1], sc[j]);
                assert!(
                    a > b || (a == b && row[j - 1] < row[j]) || b.is_nan(),
                    "{row:?} {sc:?}"
                );
            }
        }
    }
}

#[test]
fn witnesses_in_the_same_pass_equal_the_two_call_composition() {
    let mut rng = ChaCha8Rng::seed_from_u64(13);
    for _ in 0..1000 {
        let c = random_case(&mut rng, false);
        let topk = rng.random_range(1..80);
        let s = rng.random_range(1..=64);
        let fused = c.run(topk, s);
        let keep = topk.saturating_sub(s);
        let mut two = vec![-1; c.n() * topk];
        if keep > 0 {
            let plain = c.run(keep, 0);
            for i in 0..c.n() {
                two[i * topk..i * topk + keep].copy_from_slice(&plain[i * keep..(i + 1) * keep]);
            }
        }
        let lens: Vec<i32> = c.pos.iter().map(|&p| (p + 1).min(c.t()) as i32).collect();
        scatter_topology_witnesses(&mut two, topk, &lens, s).unwrap();
        assert_eq!(fused, two, "topk={topk} S={s}");
    }
}

#[test]
fn every_key_format_scores_like_its_decoded_float32() {
    let mut rng = ChaCha8Rng::seed_from_u64(14);
    for _ in 0..100 {
        let c = random_case(&mut rng, false);
        let topk = rng.random_range(1..50);
        let bits16: Vec<u16> = (0..c.k.len()).map(|_| rng.random::<u16>()).collect();
        let bits8: Vec<u8> = (0..c.k.len()).map(|_| rng.random::<u8>()).collect();
        for (enc, dec) in [
            (
                Encoded::Bf16(&bits16),
                bits16.iter().map(|&b| bf16_to_f32(b)).collect::<Vec<_>>(),
            ),
            (
                Encoded::F16(&bits16),
                bits16.iter().map(|&b| f16_to_f32(b)).collect(),
            ),
            (
                Encoded::Fp8E4m3(&bits8),
                bits8.iter().map(|&b| fp8_e4m3fn_to_f32(b)).collect(),
            ),
        ] {
            let as_f32 = Case {
                k: dec,
                scale: c.scale.clone(),
                q: c.q.clone(),
                w: c.w.clone(),
                pos: c.pos.clone(),
                ..c
            };
            let (a, sa) = as_f32.run_with(enc, topk, 0);
            let (b, sb) = as_f32.run_with(Encoded::F32(&as_f32.k), topk, 0);
            assert_eq!(a, b);
            assert!(sa.iter().zip(&sb).all(|(x, y)| x.to_bits() == y.to_bits()));
        }
    }
}

/// Over compressed keys (`compress_ratio = m`) a query at token `p` sees
/// the `(p + 1) / m` entries its tokens have completed: its row is the
/// token-level row of a query at entry `(p + 1) / m − 1`, and all `-1` when
/// no entry is complete yet — witnesses included, bit for bit.
#[test]
fn a_compressed_row_is_the_token_row_at_the_last_completed_entry() {
    let mut rng = ChaCha8Rng::seed_from_u64(25);
    for trial in 0..300 {
        let mut c = random_case(&mut rng, trial % 2 == 0);
        let m = [2usize, 3, 4, 16, 128][trial % 5];
        let t = c.t();
        for p in c.pos.iter_mut() {
            *p = match rng.random_range(0..3) {
                0 => rng.random_range(0..m - 1),               // no entry yet
                1 => (rng.random_range(0..t + 2) + 1) * m - 1, // completes an entry
                _ => rng.random_range(0..(t + 2) * m),
            };
        }
        let (topk, s) = (rng.random_range(1..40), [0, 0, 2][trial % 3]);
        let shape = IndexerShape {
            n_queries: c.n(),
            n_heads: c.h,
            d: c.d,
            n_keys: t,
        };
        let inputs = IndexerInputs {
            q: Encoded::F32(&c.q),
            weights: &c.w,
            k: Encoded::F32(&c.k),
            key_scale: c.scale.as_deref(),
            query_pos: &c.pos,
            compress_ratio: m,
        };
        let mut got = vec![7; c.n() * topk];
        indexer_topk_into(&shape, &inputs, topk, s, &mut got, None).unwrap();
        for (i, row) in got.chunks(topk).enumerate() {
            let seen = (c.pos[i] + 1) / m;
            if seen == 0 {
                assert!(row.iter().all(|&x| x == -1), "trial {trial}: {row:?}");
                continue;
            }
            let token = Case {
                q: c.q[i * c.h * c.d..(i + 1) * c.h * c.d].to_vec(),
                w: c.w[i * c.h..(i + 1) * c.h].to_vec(),
                k: c.k.clone(),
                scale: c.scale.clone(),
                pos: vec![seen - 1],
                ..c
            };
            assert_eq!(row, token.run(topk, s).as_slice(), "trial {trial} m {m}");
        }
    }
}

#[test]
fn malformed_calls_are_refused_and_write_nothing() {
    let c = one_head(&[1.0, 2.0, 3.0], 1.0, 1.0, 2);
    let shape = IndexerShape {
        n_queries: 1,
        n_heads: 1,
        d: 1,
        n_keys: 3,
    };
    let ok = IndexerInputs {
        q: Encoded::F32(&c.q),
        weights: &c.w,
        k: Encoded::F32(&c.k),
        key_scale: None,
        query_pos: &c.pos,
        compress_ratio: 1,
    };
    let refused =
        |shape: IndexerShape, inputs: IndexerInputs<'_>, topk: usize, s: usize, out_len: usize| {
            let mut out = vec![7; out_len];
            let e = indexer_topk_into(&shape, &inputs, topk, s, &mut out, None).unwrap_err();
            assert!(out.iter().all(|&x| x == 7));
            e.argument()
        };
    assert_eq!(refused(shape, ok, 2, 65, 2), "num_segments");
    assert_eq!(refused(IndexerShape { d: 0, ..shape }, ok, 2, 0, 2), "d");
    assert_eq!(
        refused(
            shape,
            IndexerInputs {
                weights: &[1.0, 2.0],
                ..ok
            },
            2,
            0,
            2
        ),
        "weights"
    );
    assert_eq!(
        refused(
            shape,
            IndexerInputs {
                key_scale: Some(&[1.0]),
                ..ok
            },
            2,
            0,
            2
        ),
        "key_scale"
    );
    assert_eq!(
        refused(
            shape,
            IndexerInputs {
                query_pos: &[],
                ..ok
            },
            2,
            0,
            2
        ),
        "query_pos"
    );
    assert_eq!(
        refused(IndexerShape { n_keys: 4, ..shape }, ok, 2, 0, 2),
        "index_k"
    );
    assert_eq!(refused(shape, ok, 2, 0, 3), "out");
}

#[test]
fn the_packed_form_equals_one_call_per_sequence() {
    use kvselect::indexer::indexer_topk_packed_into;
    let mut rng = ChaCha8Rng::seed_from_u64(15);
    for _ in 0..200 {
        let (h, d) = (rng.random_range(1..6), rng.random_range(1..20));
        let n_seqs = rng.random_range(1..5);
        let lens: Vec<usize> = (0..n_seqs).map(|_| rng.random_range(0..60)).collect();
        let mut cu = vec![0];
        for l in &lens {
            cu.push(cu.last().unwrap() + l);
        }
        let total = *cu.last().unwrap();
        let k: Vec<f32> = (0..total * d).map(|_| rng.random::<f32>() - 0.5).collect();
        let scale: Vec<f32> = (0..total).map(|_| rng.random::<f32>() + 0.5).collect();
        let n = rng.random_range(1..8);
        let seq_ids: Vec<usize> = (0..n).map(|_| rng.random_range(0..n_seqs)).collect();
        let pos: Vec<usize> = (0..n).map(|_| rng.random_range(0..70)).collect();
        let q: Vec<f32> = (0..n * h * d).map(|_| rng.random::<f32>() - 0.5).collect();
        let w: Vec<f32> = (0..n * h).map(|_| rng.random::<f32>() - 0.5).collect();
        let (topk, s) = (rng.random_range(1..30), rng.random_range(0..5));
        let shape = IndexerShape {
            n_queries: n,
            n_heads: h,
            d,
            n_keys: total,
        };
        let inputs = IndexerInputs {
            q: Encoded::F32(&q),
            weights: &w,
            k: Encoded::F32(&k),
            key_scale: Some(&scale),
            query_pos: &pos,
            compress_ratio: 1,
        };
        let mut packed = vec![7; n * topk];
        indexer_topk_packed_into(&shape, &inputs, &cu, &seq_ids, topk, s, &mut packed, None)
            .unwrap();
        for i in 0..n {
            let (k0, k1) = (cu[seq_ids[i]], cu[seq_ids[i] + 1]);
            let one = IndexerShape {
                n_queries: 1,
                n_keys: k1 - k0,
                ..shape
            };
            let single = IndexerInputs {
                q: Encoded::F32(&q[i * h * d..(i + 1) * h * d]),
                weights: &w[i * h..(i + 1) * h],
                k: Encoded::F32(&k[k0 * d..k1 * d]),
                key_scale: Some(&scale[k0..k1]),
                query_pos: &pos[i..i + 1],
                compress_ratio: 1,
            };
            let mut row = vec![7; topk];
            indexer_topk_into(&one, &single, topk, s, &mut row, None).unwrap();
            assert_eq!(&packed[i * topk..(i + 1) * topk], row.as_slice());
        }
        // A sequence id past cu_seqlens is refused and writes nothing.
        let bad: Vec<usize> = seq_ids.iter().map(|_| n_seqs).collect();
        let mut untouched = vec![7; n * topk];
        let e = indexer_topk_packed_into(&shape, &inputs, &cu, &bad, topk, s, &mut untouched, None)
            .unwrap_err();
        assert_eq!(e.argument(), "seq_ids");
        assert!(untouched.iter().all(|&x| x == 7));
    }
}

mod paged {
    use super::*;
    use kvselect::indexer::{indexer_topk_paged_into, PageLayout, PagedCache, PagedInputs};
    use kvselect::keys::{BlockTable, Format};

    /// One query against one page of vLLM's fp8 layout: block_size 2, d 2 —
    /// bytes `[k0 (2 e4m3fn), k1 (2 e4m3fn), scale0 (f32 LE), scale1 (f32 LE)]`.
    #[test]
    fn the_fp8_page_layout_is_read_byte_for_byte() {
        // 0x38 = 1.0, 0x40 = 2.0, 0x00 = 0.0 in e4m3fn.
        let mut page = vec![0x38, 0x00, 0x40, 0x38];
        page.extend(3.0f32.to_le_bytes());
        page.extend(1.0f32.to_le_bytes());
        let cache = PagedCache {
            bytes: &page,
            n_pages: 1,
            page_stride: page.len(),
            block_size: 2,
            d: 2,
            layout: PageLayout::Fp8WithScales,
        };
        let (q, w) = ([1.0f32, 1.0], [1.0f32]);
        let inputs = PagedInputs {
            q: Encoded::F32(&q),
            weights: &w,
            cache,
            table: BlockTable {
                table: &[0],
                max_blocks: 1,
                seq_lens: &[2],
            },
            seq_ids: &[0],
            query_pos: &[1],
            compress_ratio: 1,
        };
        let (mut out, mut scores) = (vec![0; 2], vec![0.0; 2]);
        indexer_topk_paged_into(1, 1, &inputs, 2, 0, &mut out, Some(&mut scores)).unwrap();
        // key 0: 3 · (1 + 0) = 3; key 1: 1 · (2 + 1) = 3: a tie, to the lower.
        assert_eq!(out, vec![0, 1]);
        assert_eq!(scores, vec![3.0, 3.0]);
    }

    fn encode(layout: PageLayout, keys: &[f32], scale: &[f32], bs: usize, d: usize) -> Vec<u8> {
        // One page's bytes for `keys` (at most `bs` rows, zero-padded).
        let mut page = Vec::new();
        match layout {
            PageLayout::Dense(Format::F32) => {
                keys.iter().for_each(|x| page.extend(x.to_le_bytes()))
            }
            PageLayout::Dense(Format::Bf16) => keys
                .iter()
                .for_each(|x| page.extend(((x.to_bits() >> 16) as u16).to_le_bytes())),
            _ => page.extend(keys.iter().map(|x| fp8_of(*x))),
        }
        let elem = match layout {
            PageLayout::Dense(Format::F32) => 4,
            PageLayout::Dense(Format::Bf16) => 2,
            _ => 1,
        };
        page.resize(bs * d * elem, 0);
        if layout == PageLayout::Fp8WithScales {
            for t in 0..bs {
                page.extend(scale.get(t).copied().unwrap_or(0.0).to_le_bytes());
            }
        }
        page
    }

    /// Small integers to e4m3fn (exact for |x| <= 8: integers up to 16 are).
    fn fp8_of(x: f32) -> u8 {
        (0..=255u8)
            .find(|&b| fp8_e4m3fn_to_f32(b) == x && (x != 0.0 || b == 0))
            .expect("exact in e4m3fn")
    }

    #[test]
    fn a_paged_cache_with_pages_out_of_order_and_interleaved_equals_the_contiguous_keys() {
        let mut rng = ChaCha8Rng::seed_from_u64(16);
        for case in 0..150 {
            let layout = [
                PageLayout::Dense(Format::F32),
                PageLayout::Dense(Format::Bf16),
                PageLayout::Fp8WithScales,
            ][case % 3];
            let (h, d, bs) = (
                rng.random_range(1..5),
                rng.random_range(1..12),
                rng.random_range(1..9),
            );
            let n_seqs = rng.random_range(1..4);
            let lens: Vec<usize> = (0..n_seqs).map(|_| rng.random_range(0..40)).collect();
            let max_blocks =
                lens.iter().map(|l| l.div_ceil(bs)).max().unwrap_or(0) + rng.random_range(0..3);
            let keys: Vec<Vec<f32>> = lens
                .iter()
                .map(|&l| {
                    (0..l * d)
                        .map(|_| rng.random_range(-3..=3) as f32)
                        .collect()
                })
                .collect();
            let scales: Vec<Vec<f32>> = lens
                .iter()
                .map(|&l| (0..l).map(|_| rng.random_range(1..=4) as f32).collect())
                .collect();
            // Pages in a random order, a spare page, and a stride wider than a page.
            let n_pages: usize = lens.iter().map(|l| l.div_ceil(bs)).sum::<usize>() + 1;
            let mut order: Vec<usize> = (0..n_pages).collect();
            for i in (1..n_pages).rev() {
                order.swap(i, rng.random_range(0..=i));
            }
            let page_len = encode(layout, &[], &[], bs, d).len();
            let stride = page_len + rng.random_range(0..3) * 16;
            let mut bytes = vec![0xAAu8; (n_pages - 1) * stride + page_len];
            let mut table = vec![0i32; n_seqs * max_blocks];
            let mut next = 0;
            for s in 0..n_seqs {
                for b in 0..lens[s].div_ceil(bs) {
                    let page = order[next];
                    next += 1;
                    table[s * max_blocks + b] = page as i32;
                    let rows = (lens[s] - b * bs).min(bs);
                    let enc = encode(
                        layout,
                        &keys[s][b * bs * d..(b * bs + rows) * d],
                        &scales[s][b * bs..b * bs + rows],
                        bs,
                        d,
                    );
                    bytes[page * stride..page * stride + page_len].copy_from_slice(&enc);
                }
            }
            let cache = PagedCache {
                bytes: &bytes,
                n_pages,
                page_stride: stride,
                block_size: bs,
                d,
                layout,
            };
            let n = rng.random_range(1..6);
            let seq_ids: Vec<usize> = (0..n).map(|_| rng.random_range(0..n_seqs)).collect();
            let pos: Vec<usize> = (0..n).map(|_| rng.random_range(0..45)).collect();
            let q: Vec<f32> = (0..n * h * d)
                .map(|_| rng.random_range(-3..=3) as f32)
                .collect();
            let w: Vec<f32> = (0..n * h)
                .map(|_| rng.random_range(-2..=2) as f32)
                .collect();
            let (topk, segs) = (rng.random_range(1..30), rng.random_range(0..4));
            let inputs = PagedInputs {
                q: Encoded::F32(&q),
                weights: &w,
                cache,
                table: BlockTable {
                    table: &table,
                    max_blocks,
                    seq_lens: &lens,
                },
                seq_ids: &seq_ids,
                query_pos: &pos,
                compress_ratio: 1,
            };
            let mut paged = vec![7; n * topk];
            indexer_topk_paged_into(n, h, &inputs, topk, segs, &mut paged, None).unwrap();
            for i in 0..n {
                let s = seq_ids[i];
                let one = IndexerShape {
                    n_queries: 1,
                    n_heads: h,
                    d,
                    n_keys: lens[s],
                };
                let scale = (layout == PageLayout::Fp8WithScales).then_some(&scales[s][..]);
                let dense = IndexerInputs {
                    q: Encoded::F32(&q[i * h * d..(i + 1) * h * d]),
                    weights: &w[i * h..(i + 1) * h],
                    k: Encoded::F32(&keys[s]),
                    key_scale: scale,
                    query_pos: &pos[i..i + 1],
                    compress_ratio: 1,
                };
                let mut row = vec![7; topk];
                indexer_topk_into(&one, &dense, topk, segs, &mut row, None).unwrap();
                assert_eq!(
                    &paged[i * topk..(i + 1) * topk],
                    row.as_slice(),
                    "{layout:?}"
                );
            }
        }
    }

    #[test]
    fn a_bad_block_table_is_refused_and_nothing_is_written() {
        let page = vec![0u8; 2 * 2 * 4];
        let cache = PagedCache {
            bytes: &page,
            n_pages: 1,
            page_stride: 16,
            block_size: 2,
            d: 2,
            layout: PageLayout::Dense(Format::F32),
        };
        let (q, w) = ([1.0f32, 1.0], [1.0f32]);
        let base = PagedInputs {
            q: Encoded::F32(&q),
            weights: &w,
            cache,
            table: BlockTable {
                table: &[0, 0],
                max_blocks: 2,
                seq_lens: &[2],
            },
            seq_ids: &[0],
            query_pos: &[1],
            compress_ratio: 1,
        };
        let refused = |inputs: PagedInputs<'_>| {
            let mut out = vec![7; 2];
            let e = indexer_topk_paged_into(1, 1, &inputs, 2, 0, &mut out, None).unwrap_err();
            assert_eq!(out, vec![7, 7]);
            e.argument()
        };
        assert_eq!(
            refused(PagedInputs {
                table: BlockTable {
                    table: &[-1, 0],
                    ..base.table
                },
                ..base
            }),
            "block_table"
        );
        assert_eq!(
            refused(PagedInputs {
                table: BlockTable {
                    table: &[1, 0],
                    ..base.table
                },
                ..base
            }),
            "block_table"
        );
        // A sequence longer than its block-table row.
        assert_eq!(
            refused(PagedInputs {
                table: BlockTable {
                    seq_lens: &[5],
                    ..base.table
                },
                ..base
            }),
            "block_table"
        );
        assert_eq!(
            refused(PagedInputs {
                seq_ids: &[1],
                ..base
            }),
            "seq_ids"
        );
        assert_eq!(
            refused(PagedInputs {
                cache: PagedCache {
                    page_stride: 8,
                    ..cache
                },
                ..base
            }),
            "kv_cache"
        );
        assert_eq!(
            refused(PagedInputs {
                cache: PagedCache {
                    n_pages: 2,
                    ..cache
                },
                ..base
            }),
            "kv_cache"
        );
        // The padding past the entries a sequence needs is never read: a
        // 0 there (vLLM's padding) or garbage is fine.
        let mut out = vec![7; 2];
        indexer_topk_paged_into(
            1,
            1,
            &PagedInputs {
                table: BlockTable {
                    table: &[0, -99],
                    ..base.table
                },
                ..base
            },
            2,
            0,
            &mut out,
            None,
        )
        .unwrap();
        assert_eq!(out, vec![0, 1]);
    }
}

/// A random float case with a batch of `n` queries (`n` drawn from
/// `queries`) at positions in any order, some past the keys.
fn batch_case(rng: &mut ChaCha8Rng, queries: std::ops::Range<usize>) -> Case {
    let mut c = random_case(rng, false);
    let n = rng.random_range(queries);
    c.q = (0..n * c.h * c.d)
        .map(|_| rng.random::<f32>() * 4.0 - 2.0)
        .collect();
    c.w = (0..n * c.h)
        .map(|_| rng.random::<f32>() * 2.0 - 1.0)
        .collect();
    c.pos = (0..n).map(|_| rng.random_range(0..c.t() + 3)).collect();
    c
}

/// Queries scored together (a prefill's, sharing every block of keys in
/// groups of up to 16) get exactly the rows and score bits they get one
/// call each, in every key format, with witnesses, and across group
/// boundaries (40 queries, positions in any order).
#[test]
fn a_batch_of_queries_equals_one_call_per_query() {
    let mut rng = ChaCha8Rng::seed_from_u64(23);
    for trial in 0..60 {
        let c = batch_case(&mut rng, 17..41);
        let n = c.n();
        let (topk, s) = (rng.random_range(1..50), [0, 0, 4][trial % 3]);
        let bf16: Vec<u16> = c.k.iter().map(|x| (x.to_bits() >> 16) as u16).collect();
        let fp8: Vec<u8> = c.k.iter().map(|x| (x.to_bits() >> 24) as u8).collect();
        for k in [
            Encoded::F32(&c.k),
            Encoded::Bf16(&bf16),
            Encoded::Fp8E4m3(&fp8),
        ] {
            let (rows, scores) = c.run_with(k, topk, s);
            for i in 0..n {
                let one = Case {
                    h: c.h,
                    d: c.d,
                    q: c.q[i * c.h * c.d..(i + 1) * c.h * c.d].to_vec(),
                    w: c.w[i * c.h..(i + 1) * c.h].to_vec(),
                    k: c.k.clone(),
                    scale: c.scale.clone(),
                    pos: vec![c.pos[i]],
                };
                let (r, sc) = one.run_with(k, topk, s);
                assert_eq!(
                    &rows[i * topk..(i + 1) * topk],
                    r.as_slice(),
                    "trial {trial} query {i}"
                );
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&scores[i * topk..(i + 1) * topk]),
                    bits(&sc),
                    "trial {trial} query {i}"
                );
            }
        }
    }
}

/// `indexer_scores_into` gives, bit for bit, the scores the top-k ranks:
/// every selected entry's score is its row's score at that position, every
/// position past a query's context is NaN — for batches of queries of
/// different lengths across group boundaries.
#[test]
fn the_exact_scores_are_the_ones_the_selection_ranks() {
    let mut rng = ChaCha8Rng::seed_from_u64(29);
    for trial in 0..40 {
        let c = batch_case(&mut rng, 1..40);
        let n = c.n();
        let (t, topk) = (c.t(), rng.random_range(1..30));
        let (rows, scores) = c.run_with(Encoded::F32(&c.k), topk, 0);
        let shape = IndexerShape {
            n_queries: n,
            n_heads: c.h,
            d: c.d,
            n_keys: t,
        };
        let inputs = IndexerInputs {
            q: Encoded::F32(&c.q),
            weights: &c.w,
            k: Encoded::F32(&c.k),
            key_scale: c.scale.as_deref(),
            query_pos: &c.pos,
            compress_ratio: 1,
        };
        let mut all = vec![7.0f32; n * t];
        indexer_scores_into(&shape, &inputs, false, &mut all).unwrap();
        for i in 0..n {
            let len = (c.pos[i] + 1).min(t);
            assert!(
                all[i * t + len..(i + 1) * t].iter().all(|x| x.is_nan()),
                "trial {trial} row {i}"
            );
            for (slot, &p) in rows[i * topk..(i + 1) * topk].iter().enumerate() {
                if p >= 0 {
                    let (want, got) = (scores[i * topk + slot], all[i * t + p as usize]);
                    assert_eq!(
                        want.to_bits(),
                        got.to_bits(),
                        "trial {trial} row {i} slot {slot}"
                    );
                }
            }
        }
    }
}

/// The family's options through the Rust API (issue 43): on low-contrast
/// keys, whose float32 scores misorder near ties, rows with a score pool,
/// activation none and forced blocks are the float64 oracle's (the real
/// max-pool top-k: scores here are far apart in float64, within a few float32
/// ULPs of each other), ascending; and the default options are
/// `indexer_topk_into`'s rows bit for bit.
#[test]
fn the_family_options_are_the_float64_oracles_rows() {
    use kvselect::indexer::{indexer_topk_with_into, Activation, IndexerOptions, RowLayout};
    let mut rng = ChaCha8Rng::seed_from_u64(43);
    for trial in 0..60 {
        let (h, d, t) = (
            2usize,
            1 + rng.random_range(0..12usize),
            1 + rng.random_range(0..300usize),
        );
        let base: Vec<f32> = (0..d).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let k: Vec<f32> = (0..t * d)
            .map(|i| base[i % d] + rng.random_range(-3i32..4) as f32 * (2.0f32).powi(-22))
            .collect();
        let q: Vec<f32> = (0..h * d)
            .map(|i| rng.random_range(0.1f32..1.0) * base[i % d].signum())
            .collect();
        let w = vec![1.0f32; h];
        let pos = vec![rng.random_range(0..t + 2)];
        let (pool, topk) = (
            1 + rng.random_range(0..6usize),
            1 + rng.random_range(0..10usize),
        );
        let (f0, f1) = (rng.random_range(0..2usize).min(topk), 0);
        let opts = IndexerOptions {
            activation: Activation::None,
            force_first: f0,
            force_last: f1,
            layout: RowLayout::Ascending,
            score_pool: pool,
            ..IndexerOptions::default()
        };
        let shape = IndexerShape {
            n_queries: 1,
            n_heads: h,
            d,
            n_keys: t,
        };
        let inputs = IndexerInputs {
            q: Encoded::F32(&q),
            weights: &w,
            k: Encoded::F32(&k),
            key_scale: None,
            query_pos: &pos,
            compress_ratio: 1,
        };
        let mut got = vec![0i32; topk];
        indexer_topk_with_into(&shape, &inputs, topk, 0, &opts, &mut got, None).unwrap();
        // The oracle: float64 scores (exact products), block maxima, forced first blocks.
        let len = (pos[0] + 1).min(t);
        let score = |j: usize| -> f64 {
            (0..h)
                .map(|hh| {
                    (0..d)
                        .map(|i| q[hh * d + i] as f64 * k[j * d + i] as f64)
                        .sum::<f64>()
                })
                .sum()
        };
        let nb = len.div_ceil(pool);
        let blocks: Vec<f64> = (0..nb)
            .map(|b| {
                (b * pool..((b + 1) * pool).min(len))
                    .map(score)
                    .fold(f64::NEG_INFINITY, f64::max)
            })
            .collect();
        let mut want: Vec<usize> = if nb <= topk {
            (0..nb).collect()
        } else {
            let mut rest: Vec<usize> = (f0..nb).collect();
            rest.sort_by(|&a, &b| blocks[b].partial_cmp(&blocks[a]).unwrap().then(a.cmp(&b)));
            (0..f0).chain(rest.into_iter().take(topk - f0)).collect()
        };
        want.sort_unstable();
        let got_set: Vec<usize> = got
            .iter()
            .filter(|&&x| x >= 0)
            .map(|&x| x as usize)
            .collect();
        assert_eq!(
            got_set, want,
            "trial {trial}: t {t} pool {pool} topk {topk}"
        );
        // The defaults spelt out are today's call.
        let (mut a, mut b) = (vec![0i32; topk], vec![0i32; topk]);
        indexer_topk_into(&shape, &inputs, topk, 0, &mut a, None).unwrap();
        let default = IndexerOptions::default();
        indexer_topk_with_into(&shape, &inputs, topk, 0, &default, &mut b, None).unwrap();
        assert_eq!(a, b);
    }
}
