//! The KV-eviction baselines' selection, native: SnapKV's, TOVA's and
//! ObservedAttention's scores, H2O's greedy eviction and the one order that
//! turns scores into kept positions (`kvselect eval --boundary`'s policies,
//! `python/kvselect/rules/eviction.py`).
//!
//! **The rules** are the reference twin's (`kvselect.reference.eviction`),
//! read from NVIDIA/kvpress `kvpress/presses/snapkv_press.py`,
//! `tova_press.py`, `observed_attention_press.py` and `scorer_press.py` at
//! 8bb29b9c3078452a86d692f29123fa6c793e2b05, and FMInference/H2O
//! `h2o_hf/utils_real_drop/modify_llama.py` (`H2OKVCache_LayerWise`) at
//! ac75c2a8a9e76832b2a4139b9363373b56336bfb. Every function takes one KV
//! head's prefix: its query heads' queries `q` `[P, group, d]` (positions
//! `0..P-1`) and its keys `k` `[P, d]`, float32.
//!
//! - [`snapkv_scores`]: the last `window` queries' causal attention over the
//!   keys before the window, summed over those queries in order and divided
//!   by `window`; average-pooled (`kernel` taps, zero padding of `kernel /
//!   2`, divided by `kernel`); summed over the group's heads in order and
//!   divided by `group`; the window's positions one padded score, the
//!   maximum plus 1.
//! - [`tova_scores`]: the last query's attention over the keys before it,
//!   summed over the group's heads in order and divided by `group`; the
//!   last position padded with the maximum plus 1.
//! - [`observed_attention_scores`]: every prefix query's causal attention
//!   summed per key in query order, divided by the `P - j` queries that see
//!   key `j`, summed over the heads and divided by `group`.
//! - [`h2o_keep`]: token `t` joins the cache; its query heads' attention
//!   over the cache (softmax over the cached keys only, in position order)
//!   is added, head by head, to each cached position's score; while the
//!   cache exceeds `budget`, the position last in the order (score
//!   descending, ties to the lower position) among all but the `recent`
//!   newest is evicted with its score.
//! - [`keep_top`]: the first `budget` positions in one total order, score
//!   descending, ties to the lower position, returned ascending.
//!
//! # The arithmetic: float64, the policies' numbers bit for bit
//!
//! Each softmax row is `kvselect.attention_probabilities`'s
//! ([`crate::metrics::attention_probabilities`]): `s_j = (Σ_c q_c k_jc) ·
//! scale` in float64 (the dot one chain in dimension order; the inputs are
//! float32, so each product is exact and the chain rounds the same fused or
//! not), `m = max s_j`, `e_j = exp(s_j − m)` with the C library's `exp`
//! (`f64::exp`, the function Python's `math.exp` calls, so the twin's
//! `softmax_row` gets the same bits), `l = Σ e_j` in key order, `p_j = e_j /
//! l`. Every sum above runs in the twin's order (the queries, then the
//! pooling's taps, then the heads, each in index order from `+0` and
//! divided once), so the scores here equal the twin's bit for bit and the
//! differential tests compare kept positions exactly: **the bound between
//! core and twin is zero** (equal bits; against real arithmetic each
//! probability carries float64's rounding, about `d · 2⁻⁵³` relative, as
//! `src/metrics.rs` states, far below the float32 bound the kvpress
//! comparison allows). Why it holds at
//! every SIMD level and thread count: the one vector kernel
//! (`kernels::scores`, the dispatch `eviction.scores`) gives each key's
//! chain its own lane, and the parallel work is whole rows, summed in order
//! afterwards. What would break it: a pairwise or blocked reduction, a
//! vectorised `exp`, or rows from another softmax.
//!
//! **Why not float32 and the project's `exp`** (`crate::exp`, the served
//! rules' softmax, `EXP_REL_ERR = 8.5e-8` relative per exponential): the
//! policies' answers would then be those of another softmax, and the twin
//! would have to treat as tied every pair of candidates whose exact scores
//! lie within the propagated bound (about `d · 2⁻²⁴ · scale · Σ_c |q_c
//! k_jc|` on each logit and `8.5e-8` on each exponential, accumulated over
//! the summed rows). For SnapKV, TOVA and ObservedAttention that is a stated bound on
//! swaps; for H2O it is not even well defined: one near-tie evicted the
//! other way changes every later step. Kept bit for bit, the policies'
//! answers stay exactly what the twin and the kvpress comparison already
//! judge. The price is speed: a float64 `exp` from the C library costs
//! 12–25 ns a call on AMD EPYC (Zen 3), one per (query, key) pair, and
//! that — not the dot products — is what holds SnapKV, ObservedAttention
//! and H2O above the bar (`benches/eviction.py`,
//! docs/benchmarks.md). The bar counts float32 FMAs: a float64 FMA does
//! half their lanes, so float64 dot products alone sit at 1.33× it even at
//! the floor's own efficiency.
//!
//! # Refusals
//!
//! Every function checks all its arguments before any work and refuses with
//! [`ArgumentError`] naming the argument: lengths that do not match the
//! shape (`q`, `k`), an empty group (`q`), a non-finite `scale`, a query or
//! key that is not finite (`q`, `k`), a `scale` large enough that a scaled
//! dot product could overflow (`scale`: `|scale| · max ‖q‖₁ · max |k| >
//! 1e300`, so every `s_j − m` is finite), SnapKV's `window` outside
//! `1..P-1` (kvpress asserts the prefix exceeds it) or a `kernel` of 0,
//! TOVA's `q_last` on those terms and an empty prefix (`k`), H2O's `recent` above its `budget`, and a
//! NaN score handed to [`keep_top`] (`scores`). Nothing is written to a
//! caller's buffer: results are new vectors.

mod kernels;
#[cfg(test)]
mod tests;

use crate::error::{check_len, checked_size};
use crate::pool;
use crate::simd::Isa;
use crate::ArgumentError;

/// One KV head's prefix: `q` `[p_len, group, d]`, `k` `[p_len, d]`.
#[derive(Debug, Clone, Copy)]
pub struct Prefix<'a> {
    /// The group's queries, `[p_len, group, d]`, row-major.
    pub q: &'a [f32],
    /// The keys, `[p_len, d]`, row-major.
    pub k: &'a [f32],
    /// Prefix positions `P`.
    pub p_len: usize,
    /// Query heads reading this KV head.
    pub group: usize,
    /// Head dimension.
    pub d: usize,
    /// The softmax scale (usually `1/√d`).
    pub scale: f64,
}

/// Largest `|scale| · max ‖q‖₁ · max |k|` accepted: every scaled dot
/// product is at most this in magnitude, so `s_j − m` cannot overflow.
const SCORE_BOUND: f64 = 1e300;

fn invalid(argument: &'static str, message: String) -> ArgumentError {
    ArgumentError::Invalid { argument, message }
}

/// The checks every entry point shares: `q` (named `q_arg`, `[rows, group,
/// d]` as `q_shape` says) and `k` `[p_len, d]` of matching lengths, a
/// group, finite values and scale, and a scale that cannot overflow a
/// score (module docs, "Refusals").
#[allow(clippy::too_many_arguments)]
fn check_inputs(
    q: &[f32],
    q_arg: &'static str,
    q_shape: &[(&str, usize)],
    k: &[f32],
    p_len: usize,
    group: usize,
    d: usize,
    scale: f64,
) -> Result<(), ArgumentError> {
    let dims: Vec<usize> = q_shape.iter().map(|&(_, n)| n).collect();
    let nq = checked_size(q_arg, &dims)?;
    check_len(q_arg, q.len(), nq, || {
        let axes: Vec<String> = q_shape.iter().map(|(a, n)| format!("{a}={n}")).collect();
        format!("[{}]", axes.join(", "))
    })?;
    let nk = checked_size("k", &[p_len, d])?;
    check_len("k", k.len(), nk, || format!("[P={p_len}, d={d}]"))?;
    if group == 0 {
        let msg = format!("{q_arg} must hold at least one query head (group >= 1), got 0");
        return Err(invalid(q_arg, msg));
    }
    if !scale.is_finite() {
        return Err(invalid("scale", format!("scale={scale} is not finite")));
    }
    if let Some(i) = q.iter().position(|x| !x.is_finite()) {
        return Err(invalid(
            q_arg,
            format!("{q_arg} holds {} (flat index {i}): not finite", q[i]),
        ));
    }
    if let Some(i) = k.iter().position(|x| !x.is_finite()) {
        return Err(invalid(
            "k",
            format!("k holds {} (flat index {i}): not finite", k[i]),
        ));
    }
    let kmax = k.iter().fold(0.0f64, |m, &x| m.max((x as f64).abs()));
    let qmax = q
        .chunks_exact(d.max(1))
        .map(|r| r.iter().map(|&x| (x as f64).abs()).sum::<f64>())
        .fold(0.0f64, f64::max);
    if scale.abs() * qmax * kmax > SCORE_BOUND {
        let msg = format!(
            "scale={scale} times max |q|_1={qmax} times max |k|={kmax} exceeds \
             {SCORE_BOUND:e}: a scaled score could overflow"
        );
        return Err(invalid("scale", msg));
    }
    Ok(())
}

impl Prefix<'_> {
    /// Checks the shape, finiteness and scale (module docs, "Refusals").
    pub fn check(&self) -> Result<(), ArgumentError> {
        let (p, g, d) = (self.p_len, self.group, self.d);
        let shape = [("P", p), ("group", g), ("d", d)];
        check_inputs(self.q, "q", &shape, self.k, p, g, d, self.scale)
    }

    /// The queries widened to float64 (exact).
    fn q64(&self) -> Vec<f64> {
        self.q.iter().map(|&x| x as f64).collect()
    }

    /// The keys widened to float64, dimension-major: `kt[c · P + j]`.
    fn keys_t(&self) -> Vec<f64> {
        let (p, d) = (self.p_len, self.d);
        let mut kt = vec![0.0f64; p * d];
        if d == 0 {
            return kt;
        }
        // In blocks of 64 keys: the block's rows are read once from L1 and
        // each dimension's 64 entries written contiguously (a key at a
        // time, every write would be a different cache line).
        const KEYS: usize = 64;
        for j0 in (0..p).step_by(KEYS) {
            let rows = &self.k[j0 * d..(j0 + KEYS).min(p) * d];
            for c in 0..d {
                let dst = &mut kt[c * p + j0..][..rows.len() / d];
                for (o, row) in dst.iter_mut().zip(rows.chunks_exact(d)) {
                    *o = row[c] as f64;
                }
            }
        }
        kt
    }
}

/// One softmax row in place over `row[..vis]`, whose entries are the scaled
/// scores: `metrics::attention_probabilities`'s arithmetic.
fn softmax_in_place(row: &mut [f64]) {
    let mut m = f64::NEG_INFINITY;
    for &a in row.iter() {
        m = m.max(a);
    }
    let mut total = 0.0;
    for a in row.iter_mut() {
        *a = (*a - m).exp();
        total += *a;
    }
    for a in row.iter_mut() {
        *a /= total;
    }
}

/// Query rows computed together (sharing each key tile while it is in L1).
const BLOCK_ROWS: usize = 8;
/// Bytes of probability rows held at once before they are summed in order.
const CHUNK_BYTES: usize = 8 << 20;

/// `acc[h · ncols + j] = +0 + p(first, h, j) + p(first + 1, h, j) + …` over
/// the queries `first..P` in order, for the keys `j < ncols` (a key after a
/// query adds its exact 0, i.e. nothing): query `i`'s causal rows over the
/// keys `0..=i`. The rows are computed in parallel, `BLOCK_ROWS` query
/// heads a task, and added in order afterwards.
fn accumulate(pre: &Prefix, isa: Isa, first: usize, ncols: usize) -> Vec<f64> {
    let (p, g, d) = (pre.p_len, pre.group, pre.d);
    let mut acc = vec![0.0f64; g * ncols];
    if first >= p || ncols == 0 {
        return acc;
    }
    let (q64, kt) = (pre.q64(), pre.keys_t());
    let per_query = (CHUNK_BYTES / (8 * g * p)).max(1);
    let mut buf = Vec::new();
    let mut start = first;
    while start < p {
        let stop = (start + per_query).min(p);
        let rows = (stop - start) * g;
        buf.clear();
        buf.resize(rows * p, 0.0);
        let work = pool::min_rows(BLOCK_ROWS * p * (d + 8));
        pool::for_each_row_mut(&mut buf, BLOCK_ROWS * p, work, |b, block| {
            let r0 = b * BLOCK_ROWS;
            let nr = block.len() / p;
            let last = start + (r0 + nr - 1) / g;
            let qs = &q64[(start * g + r0) * d..(start * g + r0 + nr) * d];
            kernels::scores(isa, qs, nr, d, &kt, p, last + 1, pre.scale, block, p);
            for (r, row) in block.chunks_exact_mut(p).enumerate() {
                let i = start + (r0 + r) / g;
                softmax_in_place(&mut row[..i + 1]);
            }
        });
        for (r, row) in buf.chunks_exact(p).enumerate() {
            let (i, h) = (start + r / g, r % g);
            let n = (i + 1).min(ncols);
            for (a, &x) in acc[h * ncols..][..n].iter_mut().zip(&row[..n]) {
                *a += x;
            }
        }
        start = stop;
    }
    acc
}

/// `+0 + x[0][j] + x[1][j] + …` over the `group` rows of `x` (`[group,
/// n]`), divided by `group`.
fn head_mean(x: &[f64], group: usize, n: usize) -> Vec<f64> {
    let mut out = vec![0.0f64; n];
    for h in 0..group {
        for (o, &v) in out.iter_mut().zip(&x[h * n..][..n]) {
            *o += v;
        }
    }
    for o in out.iter_mut() {
        *o /= group as f64;
    }
    out
}

/// `scores` followed by `pad` copies of their maximum plus 1 (1 when there
/// are none).
fn padded_with_top(mut scores: Vec<f64>, pad: usize) -> Vec<f64> {
    let top = if scores.is_empty() {
        1.0
    } else {
        scores.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x)) + 1.0
    };
    scores.resize(scores.len() + pad, top);
    scores
}

/// SnapKV's score of every prefix position, `[P]` (module docs;
/// `kvselect.reference.snapkv_scores`).
///
/// Refuses what [`Prefix::check`] refuses, `window` outside `1..P-1`
/// (`window`) and `kernel == 0` (`kernel`).
pub fn snapkv_scores(
    pre: &Prefix,
    window: usize,
    kernel: usize,
) -> Result<Vec<f64>, ArgumentError> {
    snapkv_scores_at(Isa::best(), pre, window, kernel)
}

/// [`snapkv_scores`] at the SIMD level `isa` (the tests' every level).
pub fn snapkv_scores_at(
    isa: Isa,
    pre: &Prefix,
    window: usize,
    kernel: usize,
) -> Result<Vec<f64>, ArgumentError> {
    pre.check()?;
    let p = pre.p_len;
    if window == 0 || window >= p {
        let msg = format!(
            "window must be in 1..P-1 (P = {p}: kvpress asserts the prefix exceeds it), got {window}"
        );
        return Err(invalid("window", msg));
    }
    if kernel == 0 {
        return Err(invalid(
            "kernel",
            "kernel must be at least 1, got 0".to_string(),
        ));
    }
    let (g, keys) = (pre.group, p - window);
    let mut per_head = accumulate(pre, isa, keys, keys);
    for x in per_head.iter_mut() {
        *x /= window as f64;
    }
    let half = kernel / 2;
    let mut pooled = vec![0.0f64; g * keys];
    for h in 0..g {
        let src = &per_head[h * keys..][..keys];
        for (j, o) in pooled[h * keys..][..keys].iter_mut().enumerate() {
            // The padded row's entries `j + tap` inside the row only: the
            // zero padding's exact zeros, added to a sum of non-negative
            // values from +0.0 as the twin's padded sum adds them, change
            // no bit, and a kernel far wider than the row then costs the
            // row, not the kernel (`kernel = 2**40` had run for hours).
            let (lo, hi) = (
                half.saturating_sub(j),
                kernel.min((keys + half).saturating_sub(j)),
            );
            let mut a = 0.0f64;
            for tap in lo..hi {
                a += src[j + tap - half];
            }
            *o = a / kernel as f64;
        }
    }
    Ok(padded_with_top(head_mean(&pooled, g, keys), window))
}

/// TOVA's score `[P]` from the last query's heads `q_last` `[group, d]`
/// (`pre.q`, with `pre.p_len` the keys' count: module docs;
/// `kvselect.reference.tova_scores`).
///
/// Refuses what [`Prefix::check`] refuses (with `q` one position's heads)
/// and an empty prefix (`k`).
pub fn tova_scores(
    q_last: &[f32],
    k: &[f32],
    p_len: usize,
    group: usize,
    d: usize,
    scale: f64,
) -> Result<Vec<f64>, ArgumentError> {
    tova_scores_at(Isa::best(), q_last, k, p_len, group, d, scale)
}

/// [`tova_scores`] at the SIMD level `isa`.
pub fn tova_scores_at(
    isa: Isa,
    q_last: &[f32],
    k: &[f32],
    p_len: usize,
    group: usize,
    d: usize,
    scale: f64,
) -> Result<Vec<f64>, ArgumentError> {
    let shape = [("group", group), ("d", d)];
    check_inputs(q_last, "q_last", &shape, k, p_len, group, d, scale)?;
    if p_len == 0 {
        let msg =
            "k must hold at least one prefix position (TOVA reads the last query's), got P = 0";
        return Err(invalid("k", msg.to_string()));
    }
    let pre = Prefix {
        q: q_last,
        k,
        p_len,
        group,
        d,
        scale,
    };
    let n = p_len - 1;
    let q64 = pre.q64();
    let mut rows = vec![0.0f64; group * p_len];
    // One query position reads each key once: the keys are widened a block
    // at a time into a buffer that stays in cache, not all at once.
    const KEYS: usize = 256;
    let mut kt = vec![0.0f64; d * KEYS];
    for j0 in (0..p_len).step_by(KEYS) {
        let nb = KEYS.min(p_len - j0);
        let block = Prefix {
            k: &k[j0 * d..(j0 + nb) * d],
            p_len: nb,
            ..pre
        };
        kt[..d * nb].copy_from_slice(&block.keys_t());
        kernels::scores(
            isa,
            &q64,
            group,
            d,
            &kt,
            nb,
            nb,
            scale,
            &mut rows[j0..],
            p_len,
        );
    }
    let mut per_head = vec![0.0f64; group * n];
    for (h, row) in rows.chunks_exact_mut(p_len).enumerate() {
        softmax_in_place(row);
        for (a, &x) in per_head[h * n..][..n].iter_mut().zip(&row[..n]) {
            *a += x;
        }
    }
    Ok(padded_with_top(head_mean(&per_head, group, n), 1))
}

/// ObservedAttention's score `[P]` (module docs;
/// `kvselect.reference.observed_attention_scores`).
///
/// Refuses what [`Prefix::check`] refuses.
pub fn observed_attention_scores(pre: &Prefix) -> Result<Vec<f64>, ArgumentError> {
    observed_attention_scores_at(Isa::best(), pre)
}

/// [`observed_attention_scores`] at the SIMD level `isa`.
pub fn observed_attention_scores_at(isa: Isa, pre: &Prefix) -> Result<Vec<f64>, ArgumentError> {
    pre.check()?;
    let p = pre.p_len;
    let mut acc = accumulate(pre, isa, 0, p);
    for h in 0..pre.group {
        for (j, a) in acc[h * p..][..p].iter_mut().enumerate() {
            *a /= (p - j) as f64;
        }
    }
    Ok(head_mean(&acc, pre.group, p))
}

/// H2O's cache after the prefix, ascending (module docs;
/// `kvselect.reference.h2o_keep`): `min(budget, P)` positions, the
/// `recent` newest among them.
///
/// Refuses what [`Prefix::check`] refuses and `recent > budget`
/// (`recent`).
pub fn h2o_keep(pre: &Prefix, budget: usize, recent: usize) -> Result<Vec<usize>, ArgumentError> {
    h2o_keep_at(Isa::best(), pre, budget, recent)
}

/// [`h2o_keep`] at the SIMD level `isa`.
///
/// The cache's keys live in slots (float64, dimension-major, `cap =
/// min(budget + 1, P)` of them): a new token takes the slot the last
/// eviction freed, so the live slots are always `0..len`. Scores, maxima
/// and exponentials are per slot (elementwise, order-free); the softmax's
/// denominator is summed in the cache's position order through `slot_of`,
/// as the twin sums it.
pub fn h2o_keep_at(
    isa: Isa,
    pre: &Prefix,
    budget: usize,
    recent: usize,
) -> Result<Vec<usize>, ArgumentError> {
    pre.check()?;
    if recent > budget {
        let msg = format!("recent must be in 0..budget ({budget}), got {recent}");
        return Err(invalid("recent", msg));
    }
    let (p, g, d) = (pre.p_len, pre.group, pre.d);
    let cap = budget.saturating_add(1).min(p);
    let q64 = pre.q64();
    let mut kt = vec![0.0f64; d * cap];
    let mut slot_of = vec![0usize; p];
    let mut score = vec![0.0f64; cap];
    let mut e = vec![0.0f64; cap];
    let mut cache: Vec<usize> = Vec::with_capacity(cap);
    let mut free = 0usize;
    for t in 0..p {
        let slot = free;
        for (c, &x) in pre.k[t * d..(t + 1) * d].iter().enumerate() {
            kt[c * cap + slot] = x as f64;
        }
        cache.push(t);
        slot_of[t] = slot;
        score[slot] = 0.0;
        let n = cache.len();
        for h in 0..g {
            let qh = &q64[(t * g + h) * d..(t * g + h + 1) * d];
            kernels::scores(isa, qh, 1, d, &kt, cap, n, pre.scale, &mut e, cap);
            let m = e[..n].iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x));
            for x in e[..n].iter_mut() {
                *x = (*x - m).exp();
            }
            let mut total = 0.0;
            for &pos in &cache {
                total += e[slot_of[pos]];
            }
            for (s, &x) in score[..n].iter_mut().zip(&e[..n]) {
                *s += x / total;
            }
        }
        if cache.len() > budget {
            let old = cache.len() - recent;
            let mut victim = 0;
            let mut low = f64::INFINITY;
            for (i, &pos) in cache[..old].iter().enumerate() {
                let s = score[slot_of[pos]];
                if s <= low {
                    low = s;
                    victim = i;
                }
            }
            free = slot_of[cache.remove(victim)];
        } else {
            free = cache.len();
        }
    }
    Ok(cache)
}

/// The first `budget` positions by `scores` descending, ties to the lower
/// position, ascending (all of them when `budget` is at least their count;
/// `kvselect.reference.keep_top`). `+0` and `-0` are equal scores.
///
/// Refuses a NaN score (`scores`): it has no place in the order.
pub fn keep_top(scores: &[f64], budget: usize) -> Result<Vec<usize>, ArgumentError> {
    if let Some(i) = scores.iter().position(|x| x.is_nan()) {
        return Err(invalid(
            "scores",
            format!("scores[{i}] is NaN: it has no place in the order"),
        ));
    }
    let n = scores.len();
    if budget >= n {
        return Ok((0..n).collect());
    }
    if budget == 0 {
        return Ok(Vec::new());
    }
    // Score descending, then position ascending: one total order (no NaN;
    // `+ 0.0` makes -0 into +0).
    let key = |j: &usize| (scores[*j] + 0.0, *j);
    let mut idx: Vec<usize> = (0..n).collect();
    idx.select_nth_unstable_by(budget - 1, |a, b| {
        let ((sa, ja), (sb, jb)) = (key(a), key(b));
        sb.total_cmp(&sa).then(ja.cmp(&jb))
    });
    idx.truncate(budget);
    idx.sort_unstable();
    Ok(idx)
}

/// Runs the kernel family at `isa` (the reach test).
#[cfg(test)]
pub(crate) fn dispatch_probe(isa: Isa) {
    kernels::probe(isa)
}
