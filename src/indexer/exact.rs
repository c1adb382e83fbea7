//! A row's selection made exact: the real-arithmetic top-k of the scores,
//! with the float32 kernel as a screen.
//!
//! # The rule
//!
//! The row holds the `take` positions whose **real** scores
//! `c_t · Σ_h w_h · max(q_h · k_t, 0)` (of the decoded operands) are the
//! largest, ties to the lower position — the set `kvselect check` accepts at
//! `rtol = 0`. The float32 scores decide every position their rounding
//! cannot have misplaced; the few that it can (a near tie at the row's
//! threshold) are re-scored in float64 and decided there. The row is listed
//! in the float32 scores' order (the scores `scores_out` reports), so only
//! the membership of near ties changes, never a clear-cut row.
//!
//! # Why it holds
//!
//! Each float32 score is one FMA chain of `d` steps per head, `H` fold steps
//! and the scale (module docs of `super`), so (Higham, *Accuracy and
//! Stability of Numerical Algorithms*, §3.1; the ReLU is 1-Lipschitz)
//! `|ŝ_t − s_t| ≤ γ_{d+H+1} |c_t| Σ_h |w_h| Σ_i |q_hi k_ti|` (the dot
//! products' `γ_d`, the fold's `γ_H` and the scale's `u` compound within
//! `γ_{d+H+1}`), plus at most `2⁻¹⁵⁰` per rounding into the subnormal
//! range. With `A = Σ_h |w_h| Σ_i |q_hi|` (per query) and `g_t ≥ |c_t|
//! max_i |k_ti|` (per key: its block's `max |c| · max |k|`, made by the
//! kernel as it transposes a block of 32 keys) that is at most `E_t = γ_{d+H+2} A g_t + 16 · 2⁻¹⁵⁰ (|c_t| (d Σ_h |w_h| +
//! H) + 1)`, `A` and `g_t` rounded up and `E_t` given `2⁻²⁰` of room for
//! this module's own float64 roundings.
//! So the real score lies in `[ŝ_t − E_t, ŝ_t + E_t]`. A selected position
//! whose lower end is above every unselected upper end is beaten by at most
//! the other selected ones: it belongs to the real top-k. An unselected one
//! whose upper end is below every selected lower end is beaten by all of
//! them: it does not. The rest — the band — is re-scored in float64, where
//! every product of two decoded operands (float32 values, at most 24
//! significant bits each) is exact, so the only roundings left are the
//! sums': the float64 scores order the band as real arithmetic does except
//! where two scores lie within float64 rounding of each other
//! (`γ_{d+H+2}` in units of `2⁻⁵³` of the same magnitude), which the check
//! treats as a tie. A non-finite float32 score or bound (an overflow, a NaN
//! or infinite operand) makes its interval the whole line: that position is
//! always re-scored, and float64 gives IEEE's answer without float32's
//! overflow.
//!
//! # The options: activation none, no weights, forced entries
//!
//! With **activation none** (MiniMax's MSA) the score is `c_t Σ_h w_h (q_h ·
//! k_t)` and may be negative. The bound above is unchanged: it used only
//! that the activation `a` is 1-Lipschitz (`|a(x̂) − a(x)| ≤ |x̂ − x|`, so
//! the dot products' error passes through it undiminished but not grown)
//! and that `|a(x)| ≤ |x|` (so the fold's and the scale's roundings are
//! relative to `Σ_h |w_h| Σ_i |q_hi k_ti|`); the identity has both
//! properties, the ReLU too. Nothing in the interval test assumes a sign:
//! `[ŝ − E, ŝ + E]` brackets a negative score as it does a positive one,
//! and the total order ranks every number. **No weights** (Qwen's QSA,
//! MSA) is `w_h = 1` for every head: `fma(1, x, acc)` rounds `acc + x`
//! once, as the sum of heads does, so the rows are those of explicit
//! weights of one, bit for bit, and the bound reads `Σ_h |w_h| = H`.
//! **Forced entries** (a prefix and a suffix of the visible entries) are
//! members without a score's say: the exact selection runs over the
//! entries between them (`lo .. len`, [`refine`]) with the budget they
//! leave, so no bound of a forced entry is ever compared.
//!
//! # What would break it
//!
//! A kernel whose chains are longer than the bound counts (a split dot
//! product adds no steps, but a changed fold would need its own count), a
//! `g_t` rounded down, or a re-score that rounds a product (a fused
//! multiply-add and a multiply-then-add agree here only because the product
//! is exact).

use super::kernels::{slot, Query};
use super::lse;
use super::select::candidate;
use super::ScoreType;
use crate::rounding::{self, gamma32, rank64, ETA16};
use crate::simd::{dispatch, Isa};

/// Keys re-scored together, one lane each: eight AVX2 registers of
/// float64 (the independent chains two FMA ports of latency 4 need), four
/// AVX-512 ones.
const LANES: usize = 32;

/// Band positions re-scored per parallel task.
const PART: usize = 8 * LANES;

/// A query's terms of the float32 scores' error bound (see the module docs).
pub(super) struct Bound {
    /// `γ_{d+H+2} A`, rounded up (with room for this module's roundings).
    scale: f64,
    /// `d Σ_h |w_h| + H`.
    under: f64,
}

impl Bound {
    /// The bound's terms of query `q` (its decoded elements and weights).
    pub fn of(q: &Query) -> Bound {
        let (h, d) = (q.h, q.d);
        let mut a = 0.0f64;
        let mut wsum = 0.0f64;
        for (head, &w) in q.w.iter().enumerate() {
            let (base, stride) = slot(q.tiles, h, d, head);
            let qsum: f64 = (0..d).map(|i| q.qt[base + i * stride].abs() as f64).sum();
            a += (w.abs() as f64) * qsum;
            wsum += w.abs() as f64;
        }
        // d + H + 3 float64 roundings above, each relative 2⁻⁵³ at most;
        // and `2⁻²⁰` of room for the float64 roundings of `ŝ ± E` (each
        // relative 2⁻⁵³ of `|ŝ| + E ≤ 2 A g_t`, far below `2⁻²⁰ γ A g_t`).
        let gamma = gamma32(d + h + 2);
        let room =
            (1.0 + 4.0 * (d + h + 4) as f64 * f64::EPSILON) * (1.0 + 1.0 / (1u64 << 20) as f64);
        Bound {
            scale: gamma * a * room,
            under: d as f64 * wsum * room + h as f64,
        }
    }

    /// `E_t` for a key whose bound terms are `(g_t, |c_t|)`.
    #[inline]
    pub(super) fn error(&self, g: f32, c: f32) -> f64 {
        self.scale * f64::from(g) + ETA16 * (f64::from(c) * self.under + 1.0)
    }

    /// `[ŝ − E, ŝ + E]` for a score `s` of a key whose bound terms are
    /// `(g_t, |c_t|)` ([`rounding::interval`]).
    #[inline]
    fn interval(&self, s: f32, (g, c): (f32, f32)) -> (f64, f64) {
        rounding::interval(s, self.error(g, c))
    }
}

impl Bound {
    /// Whether any of the keys given (scores `s`, terms `g`, `c`) that may
    /// be unselected (not scoring above `worst`, the selection's last
    /// score) has an upper end `>= lo` (a non-finite score or bound always
    /// has): the test of [`Bound::interval`] without a branch per key.
    #[inline]
    fn any_reaches(&self, s: &[f32], g: &[f32], c: &[f32], worst: f32, lo: f64) -> bool {
        let mut hit = false;
        for ((&s, &g), &c) in s.iter().zip(g).zip(c) {
            let e = self.error(g, c);
            let up = f64::from(s) + e;
            // NaN (a NaN score or bound) and ±inf reach anything.
            let reaches = up.is_nan() | (up >= lo) | s.is_infinite() | e.is_infinite();
            hit |= reaches & (s <= worst || s.is_nan());
        }
        hit
    }
}

pub(super) use crate::rounding::up32;

/// Where a row's keys are and how they are read: `key(t, row)` decodes key
/// `t` into `row` (`d` floats) and returns its scale (1 without scales).
pub(super) struct Rescore<'a, K> {
    pub level: Isa,
    pub query: &'a Query,
    pub key: K,
}

impl<K: Fn(usize, &mut [f32]) -> f32 + Sync> Rescore<'_, K> {
    /// The float64 scores of positions `ts` into `out` (see the module docs:
    /// products exact, sums in float64, in the float32 chain's order),
    /// parts of the band across the pool.
    pub(super) fn run(&self, ts: &[usize], out: &mut [f64])
    where
        K: Sync,
    {
        let q = self.query;
        let (h, d) = (q.h, q.d);
        let (q64, w64) = q.as_f64();
        let min_parts = crate::pool::min_rows(PART * h * d / 4);
        crate::pool::for_each_row_mut(out, PART, min_parts, |p, part| {
            let mut row = vec![0.0f32; d];
            let mut kt = vec![0.0f64; d * LANES];
            let ts = &ts[p * PART..p * PART + part.len()];
            for (tb, ob) in ts.chunks(LANES).zip(part.chunks_mut(LANES)) {
                let mut scale = [1.0f64; LANES];
                kt.fill(0.0);
                for (r, &t) in tb.iter().enumerate() {
                    scale[r] = (self.key)(t, &mut row) as f64;
                    for (i, &x) in row.iter().enumerate() {
                        kt[i * LANES + r] = x as f64;
                    }
                }
                let mut acc = [0.0f64; LANES];
                block(self.level, q.relu, &q64, &w64, d, &kt, &mut acc);
                for (r, o) in ob.iter_mut().enumerate() {
                    *o = acc[r] * scale[r] + 0.0;
                }
            }
        });
    }
}

/// Queries re-scored together by [`rescore_all`]: each key block is
/// decoded and transposed once for all of them.
const GROUP: usize = 8;

/// Key blocks transposed together by [`rescore_all`] (`d × 256` float64,
/// 256 KiB at `d = 128`: in L2 while each query of the group reads them).
const BLOCKS: usize = 8;

/// A query of [`rescore_all`]: [`Query::as_f64`]'s elements and weights,
/// `Σ_h |w_h| |q_hi|` per dimension, and how many keys it sees.
pub(super) struct DenseQuery {
    pub q64: Vec<f64>,
    pub w64: Vec<f64>,
    pub wq: Vec<f64>,
    pub len: usize,
}

/// Where [`rescore_all`] puts each query's scores and magnitudes: a row of
/// `WIDTH(t)` values per query, started by `start` and given each block of
/// its keys in order by `put` (keys `b0 ..`, as many as `scores` holds).
pub(super) trait Sink: Sync {
    /// The values a query's row holds, for `t` keys.
    fn width(&self, t: usize) -> usize;
    /// Starts query `i`'s row (which sees `len` keys of `t`).
    fn start(&self, i: usize, len: usize, t: usize, row: &mut [f64]);
    /// Takes keys `b0 .. b0 + scores.len()` of query `i`.
    fn put(&self, i: usize, row: &mut [f64], b0: usize, scores: &[f64], mags: &[f64]);
}

/// Every score and magnitude, kept: a row of `2t` (the scores, then the
/// magnitudes), NaN past the query's length.
pub(super) struct Matrix;

impl Sink for Matrix {
    fn width(&self, t: usize) -> usize {
        2 * t
    }
    fn start(&self, _: usize, len: usize, t: usize, row: &mut [f64]) {
        row[len..t].fill(f64::NAN);
        row[t + len..].fill(f64::NAN);
    }
    #[inline(always)]
    fn put(&self, _: usize, row: &mut [f64], b0: usize, scores: &[f64], mags: &[f64]) {
        let (s, m) = row.split_at_mut(row.len() / 2);
        s[b0..b0 + scores.len()].copy_from_slice(scores);
        m[b0..b0 + mags.len()].copy_from_slice(mags);
    }
}

/// The exact check's verdict of each row, folded as the scores come: with
/// `e = atol + rtol m` (each key's magnitude `m`), the highest `s − e` of
/// an unselected key and the lowest `s + e` of a selected one (the row is
/// right iff the first is at most the second), the highest `s − e` and the
/// lowest `s + e` of any key (no selection could fail it iff the first is at
/// most the second: the vacuous test), and how many keys are selected — a
/// row of 5, no score kept. `selected[i]` is query `i`'s selected keys, a
/// bit each.
pub(super) struct Verdict<'a> {
    pub selected: &'a [Vec<u64>],
    pub atol: f64,
    pub rtol: f64,
}

impl Sink for Verdict<'_> {
    fn width(&self, _: usize) -> usize {
        5
    }
    fn start(&self, i: usize, _: usize, _: usize, row: &mut [f64]) {
        let n_sel: u32 = self.selected[i].iter().map(|w| w.count_ones()).sum();
        row.copy_from_slice(&[
            f64::NEG_INFINITY,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::INFINITY,
            f64::from(n_sel),
        ]);
    }
    #[inline(always)]
    fn put(&self, i: usize, row: &mut [f64], b0: usize, scores: &[f64], mags: &[f64]) {
        let sel = &self.selected[i];
        let [best, worst, top, bottom, _] = row else {
            unreachable!("a verdict row holds 5 values")
        };
        // In registers for the block; a comparison rather than `min` /
        // `max`, and which of two zeros is kept decides no comparison of
        // the verdict. A NaN score (only a NaN or infinite operand makes
        // one) makes the row wrong and not vacuous, so that its caller
        // reports it from its scores rather than passing it.
        let (mut b, mut w, mut tp, mut bt) = (*best, *worst, *top, *bottom);
        for (j, (&s, &m)) in scores.iter().zip(mags).enumerate() {
            if s.is_nan() {
                (b, tp, bt) = (f64::INFINITY, f64::INFINITY, f64::NEG_INFINITY);
                continue;
            }
            let t = b0 + j;
            let e = self.atol + self.rtol * m;
            let (lo, up) = (s - e, s + e);
            if sel[t / 64] >> (t % 64) & 1 == 1 {
                if up < w {
                    w = up;
                }
            } else if lo > b {
                b = lo;
            }
            if lo > tp {
                tp = lo;
            }
            if up < bt {
                bt = up;
            }
        }
        (*best, *worst, *top, *bottom) = (b, w, tp, bt);
    }
}

/// Every query's float64 score of every key it sees, and its magnitude
/// `|c_t| Σ_i wq_i |k_ti|` (`wq` the query's), each summed in dimension
/// order, given to `sink` a block of keys at a time: `out` holds a row of
/// `sink.width(t)` per query. The scores are [`Rescore::run`]'s, bit for
/// bit (each lane of [`block`] is its own key's chain: which keys share a
/// block changes no bit), with each block of keys decoded and transposed
/// once per [`GROUP`] queries rather than once per query — what the exact
/// check computes where its float32 screen cannot decide (low-contrast
/// rows, whose band is every position); a magnitude costs `d` of a score's
/// `H d` multiply-adds. `keys(t0, rows, scales)` decodes keys `t0 ..` (as
/// many as `scales` holds) into `rows` (`d` floats each) and their scales
/// into `scales` (1 without scales): a block's keys in one call.
#[allow(clippy::too_many_arguments)]
pub(super) fn rescore_all<K: Fn(usize, &mut [f32], &mut [f32]) + Sync, S: Sink>(
    level: Isa,
    relu: bool,
    d: usize,
    t: usize,
    queries: &[DenseQuery],
    keys: K,
    sink: &S,
    out: &mut [f64],
) {
    let width = sink.width(t);
    assert!(out.len() == queries.len() * width && queries.iter().all(|q| q.len <= t));
    let h = queries.first().map_or(0, |q| q.w64.len());
    let min_groups = crate::pool::min_rows(GROUP * t * h * d / 4);
    crate::pool::for_each_row_mut(out, GROUP * width, min_groups, |g, part| {
        let first = g * GROUP;
        let queries = &queries[first..first + part.len() / width];
        let span = queries.iter().map(|q| q.len).max().unwrap_or(0);
        let mut rows = vec![0.0f32; d * LANES];
        let mut scales = [1.0f32; LANES];
        let mut kt = vec![0.0f64; d * LANES * BLOCKS];
        let mut scale = [1.0f64; LANES * BLOCKS];
        for (i, (o, q)) in part.chunks_mut(width).zip(queries).enumerate() {
            sink.start(first + i, q.len, t, o);
        }
        for p0 in (0..span).step_by(LANES * BLOCKS) {
            let p1 = (p0 + LANES * BLOCKS).min(span);
            for (b, kb) in kt.chunks_exact_mut(d * LANES).enumerate() {
                let b0 = p0 + b * LANES;
                let m = LANES.min(p1.saturating_sub(b0));
                if m < LANES {
                    kb.fill(0.0); // (lanes past the keys: zeros, never put)
                }
                if m == 0 {
                    continue;
                }
                keys(b0, &mut rows[..m * d], &mut scales[..m]);
                for (r, (row, &c)) in rows.chunks_exact(d).zip(&scales[..m]).enumerate() {
                    scale[b * LANES + r] = c as f64;
                    for (i, &x) in row.iter().enumerate() {
                        kb[i * LANES + r] = x as f64;
                    }
                }
            }
            for (i, (o, query)) in part.chunks_mut(width).zip(queries).enumerate() {
                let (len, q64, w64, wq) = (query.len, &query.q64, &query.w64, &query.wq);
                for (b, kb) in kt.chunks_exact(d * LANES).enumerate() {
                    let b0 = p0 + b * LANES;
                    if b0 >= len {
                        break;
                    }
                    let mut acc = [0.0f64; LANES];
                    block(level, relu, q64, w64, d, kb, &mut acc);
                    let m = LANES.min(len - b0);
                    let sc = &scale[b * LANES..b * LANES + m];
                    let at = (first + i, b0);
                    finish(level, sink, at, o, &mut acc, wq, kb, sc);
                }
            }
        }
    });
}

/// The rest of [`rescore_all`]'s work on one query and block of keys, given
/// its score sums `acc` (before the scales `sc`, one per key of the block
/// the query sees): each key's magnitude `Σ_i wq_i |k_ti|` (a multiply and
/// an add per dimension, in order), both times the key's scale (`acc · c +
/// 0`, `mag · |c|`), and the sink's `put` of query `at.0`, keys `at.1 ..`.
/// One body, compiled per level so the magnitudes' and the sink's loops
/// take the vector width (at a few heads they cost more than the scores'
/// FMAs); no FMA contracts it (Rust rounds each operation), so every level
/// gives the same bits.
#[allow(clippy::too_many_arguments)]
fn finish<S: Sink>(
    level: Isa,
    sink: &S,
    at: (usize, usize),
    row: &mut [f64],
    acc: &mut [f64; LANES],
    wq: &[f64],
    kt: &[f64],
    sc: &[f64],
) {
    assert!(kt.len() == wq.len() * LANES && sc.len() <= LANES);
    // SAFETY (bounds): none; the body indexes its slices (checked).
    dispatch!("indexer.dense", level, {
        avx512 => avx2,
        avx2(token) => x86::finish_avx2(token, sink, at, row, acc, wq, kt, sc),
        scalar => finish_body(sink, at, row, acc, wq, kt, sc),
    })
}

/// [`finish`]'s body, written once.
#[inline(always)]
fn finish_body<S: Sink>(
    sink: &S,
    (i, b0): (usize, usize),
    row: &mut [f64],
    acc: &mut [f64; LANES],
    wq: &[f64],
    kt: &[f64],
    sc: &[f64],
) {
    let mut mag = [0.0f64; LANES];
    for (&a, k) in wq.iter().zip(kt.chunks_exact(LANES)) {
        for (m, &x) in mag.iter_mut().zip(k) {
            *m += a * x.abs();
        }
    }
    for ((s, mg), &c) in acc.iter_mut().zip(&mut mag).zip(sc) {
        *s = *s * c + 0.0;
        *mg *= c.abs();
    }
    let m = sc.len();
    sink.put(i, row, b0, &acc[..m], &mag[..m]);
}

/// `acc_r += w_h · relu(Σ_i q_hi k_ri)` in float64 for the block's lanes, in
/// head order, each dot product summed in dimension order from `+0.0`
/// (without `relu`, activation none: `w_h · Σ_i q_hi k_ri`).
/// `q64` is `[H, d]`, `kt` `[d, LANES]` (dimension-major).
fn block(
    level: Isa,
    relu: bool,
    q64: &[f64],
    w64: &[f64],
    d: usize,
    kt: &[f64],
    acc: &mut [f64; LANES],
) {
    assert!(q64.len() == w64.len() * d && kt.len() == d * LANES);
    // SAFETY (bounds): none; the body indexes its slices (lengths asserted).
    dispatch!("indexer.rescore", level, {
        avx512(token) => match relu {
            true => x86::block_avx512::<true>(token, q64, w64, d, kt, acc),
            false => x86::block_avx512::<false>(token, q64, w64, d, kt, acc),
        },
        avx2(token) => match relu {
            true => x86::block_avx2::<true>(token, q64, w64, d, kt, acc),
            false => x86::block_avx2::<false>(token, q64, w64, d, kt, acc),
        },
        scalar => match relu {
            true => block_body::<false, 2, true>(q64, w64, d, kt, acc),
            false => block_body::<false, 2, false>(q64, w64, d, kt, acc),
        },
    })
}

/// [`block`]'s body, written once. Each product of two decoded operands is
/// exact in float64, so `fma(q, k, x)` and `x + q · k` round alike: `FUSED`
/// (the SIMD levels, which have the instruction) takes the one that is a
/// single instruction, the portable level the other — the same bits.
///
/// The keys go in halves of [`HALF`], `HEADS` heads at a time (each key
/// vector loaded once feeds `HEADS` chains: two at AVX2, the eight 4-lane
/// accumulators two FMA ports of latency 4 keep busy, four at AVX-512);
/// every dot product is still its own chain over the dimensions in order
/// from `+0.0`, and `acc` takes the heads in order, so the grouping changes
/// no bit.
#[inline(always)]
fn block_body<const FUSED: bool, const HEADS: usize, const RELU: bool>(
    q64: &[f64],
    w64: &[f64],
    d: usize,
    kt: &[f64],
    acc: &mut [f64; LANES],
) {
    let h = w64.len();
    let whole = h / HEADS * HEADS;
    for half in 0..LANES / HALF {
        let acc: &mut [f64; HALF] = (&mut acc[half * HALF..(half + 1) * HALF])
            .try_into()
            .expect("HALF divides LANES");
        for h0 in (0..whole).step_by(HEADS) {
            heads::<FUSED, HEADS, RELU>(&q64[h0 * d..(h0 + HEADS) * d], &w64[h0..], kt, half, acc);
        }
        for h0 in whole..h {
            heads::<FUSED, 1, RELU>(&q64[h0 * d..(h0 + 1) * d], &w64[h0..], kt, half, acc);
        }
    }
}

/// `N` heads' dot products with half `half` of the block's keys, then their
/// weighted ReLUs (the dot products themselves without `RELU`) added to
/// `acc` in head order (see [`block_body`]).
#[inline(always)]
fn heads<const FUSED: bool, const N: usize, const RELU: bool>(
    q: &[f64],
    w: &[f64],
    kt: &[f64],
    half: usize,
    acc: &mut [f64; HALF],
) {
    let d = q.len() / N;
    let mut dot = [[0.0f64; HALF]; N];
    for (i, k) in kt.chunks_exact(LANES).enumerate().take(d) {
        let k: &[f64; HALF] = k[half * HALF..(half + 1) * HALF]
            .try_into()
            .expect("HALF divides LANES");
        for (j, dj) in dot.iter_mut().enumerate() {
            let qi = q[j * d + i];
            for (x, &kr) in dj.iter_mut().zip(k) {
                *x = if FUSED {
                    qi.mul_add(kr, *x)
                } else {
                    *x + qi * kr
                };
            }
        }
    }
    for (dj, &wh) in dot.iter().zip(w) {
        for (a, &x) in acc.iter_mut().zip(dj) {
            // The ReLU that keeps NaN, as the float32 kernels'; the weight's
            // product is not exact, so it is rounded on its own everywhere.
            let r = if RELU && x <= 0.0 { 0.0 } else { x };
            *a += wh * r;
        }
    }
}

/// Keys a pass over the heads takes at once: four AVX2 registers of
/// float64, two AVX-512 ones.
const HALF: usize = 16;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{block_body, finish_body, Sink, HALF, LANES};
    use crate::simd::{Avx2, Avx512};

    /// [`finish_body`] compiled for AVX2 (the token proves the CPU has it).
    #[target_feature(enable = "avx2")]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn finish_avx2<S: Sink>(
        _: Avx2,
        sink: &S,
        at: (usize, usize),
        row: &mut [f64],
        acc: &mut [f64; LANES],
        wq: &[f64],
        kt: &[f64],
        sc: &[f64],
    ) {
        finish_body(sink, at, row, acc, wq, kt, sc)
    }

    /// [`block_body`] by hand for AVX2+FMA (the compiler's vectorisation of
    /// the body spills): two heads at a time over each half of the block,
    /// eight 4-lane accumulators, each key vector loaded once for both
    /// heads. Lane for lane the same operations as the body: each dot
    /// product one FMA chain over the dimensions in order from `+0.0`, the
    /// ReLU (with `RELU`; activation none skips it) that keeps NaN (`x <= 0` is false for NaN, so `andnot` keeps it;
    /// `-0.0` becomes `+0.0`, as the body's `0.0`), then `acc + w · r` as a
    /// multiply and an add, the heads in order.
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn block_avx2<const RELU: bool>(
        _: Avx2,
        q64: &[f64],
        w64: &[f64],
        d: usize,
        kt: &[f64],
        acc: &mut [f64; LANES],
    ) {
        use std::arch::x86_64::*;
        let h = w64.len();
        assert!(q64.len() == h * d && kt.len() == d * LANES);
        let zero = _mm256_setzero_pd();
        // The ReLU, or with activation none the dot product as it is.
        let relu = |x: __m256d| match RELU {
            true => _mm256_andnot_pd(_mm256_cmp_pd::<_CMP_LE_OQ>(x, zero), x),
            false => x,
        };
        for half in 0..LANES / HALF {
            let ap = acc[half * HALF..].as_mut_ptr();
            let mut h0 = 0;
            while h0 < h {
                let two = h0 + 1 < h;
                let (qa, qb) = (
                    &q64[h0 * d..(h0 + 1) * d],
                    &q64[(h0 + two as usize) * d..][..d],
                );
                let mut a = [zero; 8];
                for i in 0..d {
                    // SAFETY: `i < d` and `half · HALF + 16 <= LANES`, so the
                    // four loads lie in row `i` of `kt` (`kt.len() == d · LANES`,
                    // asserted).
                    let k = unsafe {
                        let kp = kt.as_ptr().add(i * LANES + half * HALF);
                        [
                            _mm256_loadu_pd(kp),
                            _mm256_loadu_pd(kp.add(4)),
                            _mm256_loadu_pd(kp.add(8)),
                            _mm256_loadu_pd(kp.add(12)),
                        ]
                    };
                    let (x, y) = (_mm256_set1_pd(qa[i]), _mm256_set1_pd(qb[i]));
                    for j in 0..4 {
                        a[j] = _mm256_fmadd_pd(x, k[j], a[j]);
                        a[4 + j] = _mm256_fmadd_pd(y, k[j], a[4 + j]);
                    }
                }
                let heads: &[(usize, usize)] = if two {
                    &[(0, h0), (4, h0 + 1)]
                } else {
                    &[(0, h0)]
                };
                for &(o, head) in heads {
                    let w = _mm256_set1_pd(w64[head]);
                    for j in 0..4 {
                        // SAFETY: `ap` points at `acc[half · HALF]`, and
                        // `half · HALF + 4 j + 4 <= LANES`.
                        unsafe {
                            let p = ap.add(4 * j);
                            let r = _mm256_mul_pd(w, relu(a[o + j]));
                            _mm256_storeu_pd(p, _mm256_add_pd(_mm256_loadu_pd(p), r));
                        }
                    }
                }
                h0 += 1 + two as usize;
            }
        }
    }

    /// [`block_body`] compiled for AVX-512 (the token proves the CPU has it).
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) fn block_avx512<const RELU: bool>(
        _: Avx512,
        q64: &[f64],
        w64: &[f64],
        d: usize,
        kt: &[f64],
        acc: &mut [f64; LANES],
    ) {
        block_body::<true, 4, RELU>(q64, w64, d, kt, acc)
    }
}

/// A visitor of a row's runs: `(t0, scores, g, c)` for keys `t0 ..`.
pub(super) type Run<'a> = &'a mut dyn FnMut(usize, &[f32], &[f32], &[f32]);

/// A row's float32 scores and its keys' bound terms, as the group holds
/// them: point reads, and runs of consecutive keys for the pass over the
/// whole row.
pub(super) trait RowScores {
    /// Key `t`'s float32 score.
    fn score(&self, t: usize) -> f32;
    /// Key `t`'s bound terms `(g_t, |c_t|)`.
    fn terms(&self, t: usize) -> (f32, f32);
    /// Keys `0 .. len` in runs, ascending: `f(t0, scores, g, c)` for keys
    /// `t0 ..` — every key, or (a screened row's survivors) every key the
    /// caller has shown could change [`refine`]'s answer.
    fn runs(&self, len: usize, f: Run<'_>);
}

/// Makes `top` — a row's `take` best candidates among positions `lo ..
/// len` by their float32 scores, best first ([`candidate`] encoding) — the
/// real-arithmetic top-k of those positions (see the module docs), listed
/// in float32 order. The positions below `lo` (forced entries) are never
/// candidates; `lo = 0` is the whole row.
pub(super) fn refine<K: Fn(usize, &mut [f32]) -> f32 + Sync>(
    top: &mut Vec<u64>,
    lo: usize,
    len: usize,
    row: &impl RowScores,
    rescore: &Rescore<'_, K>,
) {
    let take = top.len();
    if take == 0 || take >= len.saturating_sub(lo) {
        return; // every position is in the row: only the listing order is the kernels'
    }
    let bound = Bound::of(rescore.query);
    let worst = top[take - 1];
    let pos = |c: u64| (u32::MAX - c as u32) as usize;
    let lower = |t: usize| bound.interval(row.score(t), row.terms(t)).0;
    // The selected lowest lower end (the selected, read where they are);
    // one pass over the row's runs for the unselected whose upper end
    // reaches it (the band) and their largest upper end; then the selected
    // whose lower end reaches that join the band.
    let worst_score = row.score(pos(worst)) + 0.0;
    let lows: Vec<f64> = top.iter().map(|&c| lower(pos(c))).collect();
    let lo_min = lows.iter().copied().fold(f64::INFINITY, f64::min);
    let mut up_max = f64::NEG_INFINITY;
    let mut band: Vec<usize> = Vec::new();
    row.runs(len, &mut |t0, s, g, c| {
        // A run's positions below `lo` (forced entries) are no candidates.
        let skip = lo.saturating_sub(t0).min(s.len());
        let (t0, s, g, c) = (t0 + skip, &s[skip..], &g[skip..], &c[skip..]);
        for (k, ((s, g), c)) in s.chunks(64).zip(g.chunks(64)).zip(c.chunks(64)).enumerate() {
            if !bound.any_reaches(s, g, c, worst_score, lo_min) {
                continue; // the common case, decided branch-free a run at a time
            }
            for (r, ((&s, &g), &c)) in s.iter().zip(g).zip(c).enumerate() {
                let (t, up) = (t0 + 64 * k + r, bound.interval(s, (g, c)).1);
                if up >= lo_min && candidate(s, t) < worst {
                    up_max = up_max.max(up);
                    band.push(t);
                }
            }
        }
    });
    if band.is_empty() {
        return; // no unselected position reaches a selected one: the float32 set is the real one
    }
    // The selected outside the band stay, in their order.
    let mut kept: Vec<u64> = Vec::with_capacity(take);
    for (&c, &lo) in top.iter().zip(&lows) {
        match lo <= up_max {
            true => band.push(pos(c)),
            false => kept.push(c),
        }
    }
    let mut exact = vec![0.0f64; band.len()];
    rescore.run(&band, &mut exact);
    // The band's best fill the rest, merged into the float32 order.
    let need = take - kept.len();
    let order = best_of_band(band.len(), need, |j| rank64(exact[j], band[j]));
    let mut chosen: Vec<u64> = order[..need]
        .iter()
        .map(|&j| candidate(row.score(band[j]), band[j]))
        .collect();
    chosen.sort_unstable_by(|a, b| b.cmp(a));
    top.clear();
    let (mut i, mut j) = (0, 0);
    while i < kept.len() || j < chosen.len() {
        if j == chosen.len() || (i < kept.len() && kept[i] > chosen[j]) {
            top.push(kept[i]);
            i += 1;
        } else {
            top.push(chosen[j]);
            j += 1;
        }
    }
}

/// The indices `0 .. n` with the `need` largest keys first (in no order
/// among themselves; `key` is one-to-one, so they are one set): a partial
/// selection, not a sort — on a low-contrast row the band is every position,
/// and sorting it cost more than re-scoring it.
fn best_of_band<O: Ord>(n: usize, need: usize, key: impl Fn(usize) -> O) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    if need > 0 && need < n {
        order.select_nth_unstable_by_key(need - 1, |&j| std::cmp::Reverse(key(j)));
    }
    order
}

/// A block's float32 max-pool score: the largest of its entries' scores
/// (`+0.0` canonical), NaN absent, `-inf` for a block of NaN (MiniMax-M3's
/// block rule, `crate::block_sparse`).
#[inline]
pub(super) fn pooled(scores: impl Iterator<Item = f32>) -> f32 {
    scores
        .filter(|s| !s.is_nan())
        .fold(f32::NEG_INFINITY, f32::max)
        + 0.0
}

/// A block's float32 score under `score`: [`pooled`] or `lse::lse32`.
#[inline]
pub(super) fn block_score(score: ScoreType, scores: impl Iterator<Item = f32> + Clone) -> f32 {
    match score {
        ScoreType::Max => pooled(scores),
        ScoreType::Lse { sm_scale } => lse::lse32(scores, sm_scale),
    }
}

/// [`refine`] for a row of blocks of `pool` entries (the score pool): `top`
/// holds the `take` best blocks among `lo .. hi` by their float32 block
/// scores ([`block_score`]), of a row of `len` entries; made the blocks with
/// the largest real block scores, ties to the lower block (with `lse`, up to
/// the bound of `lse.rs`).
///
/// Why it holds: each entry's real score lies in its interval `[ŝ_t − E_t,
/// ŝ_t + E_t]` (the module docs; the whole line for a non-finite score or
/// bound, a NaN among them), and a block's score is monotone in each entry's:
/// its real maximum lies in `[max_t (ŝ_t − E_t), max_t (ŝ_t + E_t)]` (NaN
/// absent), its real log-sum-exp in `lse::bounds` of the scaled ends (the
/// whole line when an entry's interval is, since a NaN entry makes the block
/// `-inf`). The test of [`refine`] then runs on the blocks' intervals, and
/// the blocks of the band are decided by their entries' float64 re-scores:
/// the float64 maxima (NaN absent), or the log-sum-exp bounds' midpoints (a
/// NaN re-score `-inf`). What would break it: a block interval from the
/// float32 block scores alone (the float32 max of a block need not be its
/// real argmax's score), or a NaN entry given a finite interval (a float32
/// NaN can be an overflow `inf − inf` of finite reals).
#[allow(clippy::too_many_arguments)]
pub(super) fn refine_pooled<K: Fn(usize, &mut [f32]) -> f32 + Sync>(
    top: &mut Vec<u64>,
    lo: usize,
    hi: usize,
    (pool, score): (usize, ScoreType),
    len: usize,
    row: &impl RowScores,
    rescore: &Rescore<'_, K>,
) {
    // One monomorphised body per block score: the max pool's is the code it was.
    let at = (lo, hi, pool, len);
    match score {
        ScoreType::Max => {
            let interval = |bound: &Bound, entries: std::ops::Range<usize>| {
                entries.fold((f64::NEG_INFINITY, f64::NEG_INFINITY), |(l, u), t| {
                    let (lt, ut) = bound.interval(row.score(t), row.terms(t));
                    (l.max(lt), u.max(ut))
                })
            };
            let value = |block: &[f64]| {
                block
                    .iter()
                    .filter(|x| !x.is_nan())
                    .fold(f64::NEG_INFINITY, |a, &x| a.max(x))
            };
            refine_blocks(top, at, score, row, rescore, interval, value);
        }
        ScoreType::Lse { sm_scale } => {
            let lambda = f64::from(sm_scale);
            let interval = |bound: &Bound, entries: std::ops::Range<usize>| {
                let ends: Vec<(f64, f64)> = entries
                    .map(|t| bound.interval(row.score(t), row.terms(t)))
                    .collect();
                if ends.iter().any(|&(l, u)| !(l.is_finite() && u.is_finite())) {
                    return (f64::NEG_INFINITY, f64::INFINITY);
                }
                let lows: Vec<f64> = ends.iter().map(|&(l, _)| lambda * l).collect();
                let ups: Vec<f64> = ends.iter().map(|&(_, u)| lambda * u).collect();
                (lse::bounds(&lows).0, lse::bounds(&ups).1)
            };
            let value = |block: &[f64]| {
                if block.iter().any(|x| x.is_nan()) {
                    return f64::NEG_INFINITY;
                }
                let x: Vec<f64> = block.iter().map(|&s| lambda * s).collect();
                let (l, u) = lse::bounds(&x);
                if l == u {
                    l
                } else {
                    l + (u - l) / 2.0
                }
            };
            refine_blocks(top, at, score, row, rescore, interval, value);
        }
    }
}

/// [`refine_pooled`]'s body: `interval(bound, entries)` is a block's real
/// score interval from its entries' float32 scores, `value(block)` its
/// decision value from their float64 re-scores.
fn refine_blocks<K, I, V>(
    top: &mut Vec<u64>,
    (lo, hi, pool, len): (usize, usize, usize, usize),
    score: ScoreType,
    row: &impl RowScores,
    rescore: &Rescore<'_, K>,
    interval: I,
    value: V,
) where
    K: Fn(usize, &mut [f32]) -> f32 + Sync,
    I: Fn(&Bound, std::ops::Range<usize>) -> (f64, f64),
    V: Fn(&[f64]) -> f64,
{
    let take = top.len();
    if take == 0 || take >= hi.saturating_sub(lo) {
        return;
    }
    let bound = Bound::of(rescore.query);
    let entries = |b: usize| b * pool..((b + 1) * pool).min(len);
    let interval = |b: usize| interval(&bound, entries(b));
    let pos = |c: u64| (u32::MAX - c as u32) as usize;
    let selected: std::collections::HashSet<usize> = top.iter().map(|&c| pos(c)).collect();
    let lows: Vec<f64> = top.iter().map(|&c| interval(pos(c)).0).collect();
    let lo_min = lows.iter().copied().fold(f64::INFINITY, f64::min);
    let mut up_max = f64::NEG_INFINITY;
    let mut band: Vec<usize> = Vec::new();
    for b in (lo..hi).filter(|b| !selected.contains(b)) {
        let up = interval(b).1;
        if up >= lo_min || up.is_nan() {
            up_max = up_max.max(up);
            band.push(b);
        }
    }
    if band.is_empty() {
        return; // no unselected block reaches a selected one
    }
    let mut kept: Vec<u64> = Vec::with_capacity(take);
    for (&c, &l) in top.iter().zip(&lows) {
        match l <= up_max {
            true => band.push(pos(c)),
            false => kept.push(c),
        }
    }
    // Every entry of the band's blocks, re-scored in float64.
    let ts: Vec<usize> = band.iter().flat_map(|&b| entries(b)).collect();
    let mut exact = vec![0.0f64; ts.len()];
    rescore.run(&ts, &mut exact);
    let mut at = 0;
    let values: Vec<f64> = band
        .iter()
        .map(|&b| {
            let n = entries(b).len();
            let v = value(&exact[at..at + n]);
            at += n;
            v + 0.0
        })
        .collect();
    let need = take - kept.len();
    let order = best_of_band(band.len(), need, |j| rank64(values[j], band[j]));
    let float32 = |b: usize| block_score(score, entries(b).map(|t| row.score(t)));
    let mut chosen: Vec<u64> = order[..need]
        .iter()
        .map(|&j| candidate(float32(band[j]), band[j]))
        .collect();
    chosen.sort_unstable_by(|a, b| b.cmp(a));
    kept.extend(chosen);
    kept.sort_unstable_by(|a, b| b.cmp(a));
    *top = kept;
}

/// Runs the family at `isa` once (the reach test's probe): two keys whose
/// float64 scores are known exactly.
#[cfg(test)]
pub(super) fn probe(isa: Isa) {
    let d = 4;
    let q64 = [1.0, 2.0, 3.0, 4.0];
    let mut kt = vec![0.0f64; d * LANES];
    for i in 0..d {
        kt[i * LANES] = 1.0;
        kt[i * LANES + 1] = -1.0;
    }
    let mut acc = [0.0f64; LANES];
    block(isa, true, &q64, &[0.5], d, &kt, &mut acc);
    assert_eq!(&acc[..2], &[5.0, 0.0]);
    let mut acc = [0.0f64; LANES];
    block(isa, false, &q64, &[0.5], d, &kt, &mut acc);
    assert_eq!(&acc[..2], &[5.0, -5.0]);
    let mut row = [0.0f64; 4];
    finish(
        isa,
        &Matrix,
        (0, 0),
        &mut row,
        &mut acc,
        &[1.0, 2.0, 3.0, 4.0],
        &kt,
        &[2.0, -1.0],
    );
    assert_eq!(row, [10.0, 5.0, 20.0, 10.0]);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Float32 values (as many as asked, from `seed`): a uniform mantissa
    /// in `[-0.5, 0.5)` times `2^e`, `e` in `[-span, span)` (xorshift64).
    fn floats(seed: u64, span: i32) -> impl FnMut() -> f32 {
        let mut state = seed;
        move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let m = (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            let e = ((state >> 8) % (2 * span as u64)) as i32 - span;
            m * 2f32.powi(e)
        }
    }

    /// Every level's [`block`] (the AVX2 kernel written by hand) gives the
    /// portable body's bits: odd and even head counts, dimensions that are
    /// not a multiple of anything, negative dot products (the ReLU), `-0.0`,
    /// NaN and infinite operands.
    #[test]
    fn every_level_gives_the_portable_bits() {
        let mut next = {
            let mut f = floats(0x2545_F491_4F6C_DD1D, 20);
            move || f() as f64
        };
        for (h, d) in [(1, 1), (2, 3), (3, 7), (5, 64), (64, 128)] {
            let mut q64: Vec<f64> = (0..h * d).map(|_| next()).collect();
            let w64: Vec<f64> = (0..h).map(|_| next()).collect();
            let mut kt: Vec<f64> = (0..d * LANES).map(|_| next()).collect();
            if d > 2 {
                kt[3] = -0.0;
                kt[LANES + 5] = f64::NAN;
                kt[2 * LANES + 7] = f64::INFINITY;
                q64[d - 1] = -0.0;
            }
            for relu in [true, false] {
                let mut want = [0.0f64; LANES];
                match relu {
                    true => block_body::<false, 2, true>(&q64, &w64, d, &kt, &mut want),
                    false => block_body::<false, 2, false>(&q64, &w64, d, &kt, &mut want),
                }
                for isa in crate::simd::isas_for_test() {
                    let mut got = [0.0f64; LANES];
                    block(isa, relu, &q64, &w64, d, &kt, &mut got);
                    for (r, (x, y)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()),
                            "{} h={h} d={d} lane {r}: {x} vs {y}",
                            isa.level().name()
                        );
                    }
                }
            }
        }
    }

    /// [`rescore_all`] gives [`Rescore::run`]'s bits for every row and key
    /// at every level, NaN past each row's length, and magnitudes summed in
    /// dimension order: group tails (11 rows), part and block tails (300
    /// keys), rows of length 0, 1, 32, 255, 256 and past the keys.
    #[test]
    fn the_dense_rescore_is_the_pair_rescore_bit_for_bit() {
        let mut next = floats(0xD1B5_4A32_D192_ED03, 8);
        let (h, d, t) = (5, 9, 300);
        let keys: Vec<f32> = (0..t * d).map(|_| next()).collect();
        let scales: Vec<f32> = (0..t).map(|_| next()).collect();
        let key = |k: usize, r: &mut [f32]| {
            r.copy_from_slice(&keys[k * d..(k + 1) * d]);
            scales[k]
        };
        // The same keys a block at a time, as rescore_all reads them.
        let run = |t0: usize, r: &mut [f32], c: &mut [f32]| {
            r.copy_from_slice(&keys[t0 * d..t0 * d + r.len()]);
            c.copy_from_slice(&scales[t0..t0 + c.len()]);
        };
        let lens = [0, 1, 32, 255, 256, 300, 17, 299, 64, 300, 5];
        let queries: Vec<DenseQuery> = lens
            .iter()
            .map(|&len| DenseQuery {
                q64: (0..h * d).map(|_| next() as f64).collect(),
                w64: (0..h).map(|_| next() as f64).collect(),
                wq: (0..d).map(|_| next().abs() as f64).collect(),
                len,
            })
            .collect();
        for isa in crate::simd::isas_for_test() {
            for relu in [true, false] {
                let mut out = vec![0.0f64; lens.len() * 2 * t];
                rescore_all(isa, relu, d, t, &queries, run, &Matrix, &mut out);
                for (i, (&len, row)) in lens.iter().zip(out.chunks(2 * t)).enumerate() {
                    let mut query = Query::new(h, d, isa);
                    query.relu = relu;
                    query.qt.iter_mut().for_each(|x| *x = 0.0);
                    // Load the float64 query through the layout the kernel reads.
                    for head in 0..h {
                        let (base, stride) = super::slot(query.tiles, h, d, head);
                        for j in 0..d {
                            query.qt[base + j * stride] = queries[i].q64[head * d + j] as f32;
                        }
                        query.w[head] = queries[i].w64[head] as f32;
                    }
                    let ts: Vec<usize> = (0..len).collect();
                    let mut want = vec![0.0f64; len];
                    let rescore = Rescore {
                        level: isa,
                        query: &query,
                        key,
                    };
                    rescore.run(&ts, &mut want);
                    let (got, mags) = row.split_at(t);
                    for (p, (x, y)) in got[..len].iter().zip(&want).enumerate() {
                        assert_eq!(
                            x.to_bits(),
                            y.to_bits(),
                            "{} row {i} key {p}",
                            isa.level().name()
                        );
                    }
                    for (p, m) in mags[..len].iter().enumerate() {
                        let mut sum = 0.0f64;
                        for (j, &a) in queries[i].wq.iter().enumerate() {
                            sum += a * (keys[p * d + j] as f64).abs();
                        }
                        assert_eq!(m.to_bits(), (sum * (scales[p] as f64).abs()).to_bits());
                    }
                    assert!(got[len..].iter().chain(&mags[len..]).all(|x| x.is_nan()));
                }
                // The verdict sink folds the same scores: every third key
                // selected, a tolerance with both terms.
                let selected: Vec<Vec<u64>> = lens
                    .iter()
                    .map(|&len| {
                        let mut bits = vec![0u64; len.div_ceil(64)];
                        (0..len)
                            .step_by(3)
                            .for_each(|p| bits[p / 64] |= 1 << (p % 64));
                        bits
                    })
                    .collect();
                let (atol, rtol) = (0.25, 0.125);
                let sink = Verdict {
                    selected: &selected,
                    atol,
                    rtol,
                };
                let mut v = vec![0.0f64; lens.len() * 5];
                rescore_all(isa, relu, d, t, &queries, run, &sink, &mut v);
                for ((&len, row), got) in lens.iter().zip(out.chunks(2 * t)).zip(v.chunks(5)) {
                    let mut want = [
                        f64::NEG_INFINITY,
                        f64::INFINITY,
                        f64::NEG_INFINITY,
                        f64::INFINITY,
                    ];
                    for p in 0..len {
                        let e = atol + rtol * row[t + p];
                        let (lo, up) = (row[p] - e, row[p] + e);
                        if p % 3 == 0 {
                            want[1] = want[1].min(up);
                        } else {
                            want[0] = want[0].max(lo);
                        }
                        want[2] = want[2].max(lo);
                        want[3] = want[3].min(up);
                    }
                    assert_eq!(&got[..4], &want, "{}", isa.level().name());
                    assert_eq!(got[4], len.div_ceil(3) as f64);
                }
            }
        }
    }

    /// The fused body and the portable one give the same bits: every
    /// product of two float32 values is exact in float64 (random operands
    /// over a wide exponent range, subnormal float32 products included).
    #[test]
    fn the_fused_and_unfused_bodies_round_alike() {
        let mut next = {
            let mut f = floats(0x9E37_79B9_7F4A_7C15, 40);
            move || f() as f64
        };
        for d in [1, 7, 64, 128] {
            let h = 3;
            let q64: Vec<f64> = (0..h * d).map(|_| next()).collect();
            let w64: Vec<f64> = (0..h).map(|_| next()).collect();
            let kt: Vec<f64> = (0..d * LANES).map(|_| next()).collect();
            let (mut a, mut b) = ([0.0f64; LANES], [0.0f64; LANES]);
            block_body::<true, 4, true>(&q64, &w64, d, &kt, &mut a);
            block_body::<false, 2, true>(&q64, &w64, d, &kt, &mut b);
            for (x, y) in a.iter().zip(&b) {
                assert_eq!(x.to_bits(), y.to_bits(), "d={d}");
            }
            let (mut a, mut b) = ([0.0f64; LANES], [0.0f64; LANES]);
            block_body::<true, 4, false>(&q64, &w64, d, &kt, &mut a);
            block_body::<false, 2, false>(&q64, &w64, d, &kt, &mut b);
            for (x, y) in a.iter().zip(&b) {
                assert_eq!(x.to_bits(), y.to_bits(), "d={d}, activation none");
            }
        }
    }
}
