//! The AMX screen's second half: which of a row's positions the tiles'
//! scores rule out, and the float32 kernels' scores for all the others.
//!
//! # The rule
//!
//! A group scored with the screen ([`super::kernels::amx`]) holds, per
//! position, either the float32 kernels' score `ŝ_t` (a block the screen
//! did not take) or the screen's `v_t`; both lie within `E_t` of the real
//! score (`super::exact`'s bound, the same for both). Let `F` be the
//! positions whose value and bound are finite, `E*` the largest `E_t` over
//! `F` (`E_t` grows with the key's terms `g_t`, `|c_t|`: the bound of their
//! maxima), and `v_(k)` the `take`-th largest value in `F`. A position `t`
//! of `F` with `v_t < v_(k) − 8E*` is **ruled out**: it keeps the screen's
//! value; every other position gets the float32 kernels' score.
//!
//! # Why the row is the float32 kernels' row, bit for bit
//!
//! The `take` positions of `F` at or above `v_(k)` have float32 scores at
//! least `v_(k) − 2E*` (each within `E*` of its real score, as `v` is), so
//! the float32 kernels' `take`-th score is at least that, while a ruled-out
//! position's float32 score is at most `v_t + 2E* < v_(k) − 6E*`: it is
//! selected by neither, so [`super::select`] picks the same `take` from the
//! same scores either way. Its interval's upper end is below every
//! selected position's lower end (at least `v_(k) − 3E*` where every
//! selected one has a finite bound — a selected one with none makes every
//! unselected position the band) under both values, so `exact::refine`
//! forms the same band; and where the band is every unselected position,
//! the `take` positions above keep a ruled-out one out of the float64
//! choice (their real scores exceed its by `6E*`, far beyond float64's
//! rounding). So the rows and every score reported are the float32
//! kernels', and only the scores of ruled-out positions, which nothing
//! reads, are the screen's.
//!
//! Nor need the selection or `refine`'s band look at a ruled-out position
//! at all (the row is selected among the others alone,
//! `super::select::Search::Among`, which spares a decode's passes over its
//! whole row). It is never selected (above). It can reach the band only
//! when some selected position's lower end is below every lower end of the
//! `take` positions above — so one of those is unselected, a survivor, and
//! in the band with an upper end above every ruled-out one's: the band
//! stays non-empty, its largest upper end and so the selected that stay
//! outside it are the same with or without the ruled-out positions, and
//! they are never chosen from it (at least as many positions of the band
//! as are chosen lie `6E*` above them in real arithmetic).
//!
//! What would break it: a screen whose error exceeds `E_t` (the bound's
//! roundings count), a `take` other than the row's, or the pool and the
//! witnesses, which read every position's score (the screen is off there).

use super::exact::{Bound, RowScores};
use super::kernels::{self, Keys, Query, Scratch, Want};
use crate::keys::Encoded;
use crate::simd::Isa;

/// The positions of a row of `len` that the screen cannot rule out for a
/// row of `take` (all of them when `take >= len` or fewer than `take` have
/// a finite value and bound), from the row's values and terms `(g_t,
/// |c_t|)`, in order. Two passes over the row's runs: a histogram of the
/// values in `F` by their top 11 order bits, then the positions at or
/// above the lowest value of the bucket holding `v_(k)` less `8E*`, that
/// bucket's values among them (`v_(k)` selected there), cut to `v_(k) −
/// 8E*`.
pub(super) fn survivors(
    query: &Query,
    len: usize,
    take: usize,
    row: &(impl RowScores + Sync),
    parallel: bool,
) -> Vec<usize> {
    if take == 0 {
        return Vec::new();
    }
    if take >= len {
        return (0..len).collect();
    }
    // A long row's passes in parts across the pool (a decode's lone row).
    let parts = match parallel && len >= PAR_LEN {
        true => crate::pool::num_threads().max(1),
        false => 1,
    };
    let part = len.div_ceil(parts);
    let ranged = |p: usize, f: super::exact::Run<'_>| {
        let (lo, hi) = (p * part, ((p + 1) * part).min(len));
        row.runs(len, &mut |t0, s, g, c| {
            let (a, b) = (lo.max(t0), hi.min(t0 + s.len()));
            if a < b {
                let r = a - t0..b - t0;
                f(a, &s[r.clone()], &g[r.clone()], &c[r]);
            }
        });
    };
    let mut firsts = vec![Tally::new(); parts];
    each_part(&mut firsts, |p, tally| {
        ranged(p, &mut |_, s, g, c| tally.add(s, g, c))
    });
    let mut hist = vec![0usize; 1 << BUCKET_BITS];
    let (mut gmax, mut cmax, mut nf) = (0.0f32, 0.0f32, 0usize);
    for t in &firsts {
        let (h0, h1) = t.hist.split_at(1 << BUCKET_BITS);
        for ((a, &x), &y) in hist.iter_mut().zip(h0).zip(h1) {
            *a += x as usize + y as usize;
        }
        (gmax, cmax, nf) = (gmax.max(t.gmax), cmax.max(t.cmax), nf + t.nf);
    }
    if nf < take {
        return (0..len).collect();
    }
    // The bucket of the `take`-th largest, and how many lie above it.
    let (mut bucket, mut above) = (hist.len(), 0usize);
    while above + hist[bucket - 1] < take {
        bucket -= 1;
        above += hist[bucket];
    }
    let bucket = (bucket - 1) as u32;
    let estar = Bound::of(query).error(gmax, cmax);
    // `8 E*` with room for this float64 arithmetic's roundings; below the
    // bucket's lowest value first (`v_(k)` is at least that), then below
    // `v_(k)` itself.
    let room = 8.0 * estar * (1.0 + 1.0 / (1u64 << 20) as f64);
    let floor = f64::from(unorder(bucket << (32 - BUCKET_BITS))) - room;
    if !floor.is_finite() {
        return (0..len).collect();
    }
    let low = below(floor);
    let mut seconds = vec![(Vec::new(), Vec::new()); parts];
    each_part(&mut seconds, |p, (keep, inside)| {
        ranged(p, &mut |t0, s, g, c| {
            Kept {
                low,
                bucket,
                keep,
                inside,
            }
            .add(t0, s, g, c)
        })
    });
    let (mut keep, mut inside): (Vec<usize>, Vec<f32>) = (Vec::new(), Vec::new());
    for (k, i) in seconds {
        keep.extend(k);
        inside.extend(i);
    }
    let at = inside.len() - (take - above);
    let (_, vk, _) = inside.select_nth_unstable_by(at, f32::total_cmp);
    let cut = below(f64::from(*vk) - room);
    keep.retain(|&t| {
        let (s, (g, c)) = (row.score(t), row.terms(t));
        !in_f(s, g, c) || s >= cut
    });
    keep
}

/// Positions a pass of [`survivors`] takes at a time (one vector of 16
/// lanes, or two of 8).
const LANES: usize = 16;

/// The first pass of [`survivors`] over part of a row: `F`'s values by
/// bucket (two histograms, for a run's even and odd entries, so a run of
/// values in one bucket does not wait on its own increments), and over `F` the
/// largest `g_t` and `|c_t|` and the count.
#[derive(Clone)]
struct Tally {
    hist: Vec<u32>,
    gmax: f32,
    cmax: f32,
    nf: usize,
}

impl Tally {
    fn new() -> Self {
        Tally {
            hist: vec![0; 2 << BUCKET_BITS],
            gmax: 0.0,
            cmax: 0.0,
            nf: 0,
        }
    }

    /// Counts a run's positions (branch-free: a position outside `F` counts
    /// nothing).
    fn add(&mut self, s: &[f32], g: &[f32], c: &[f32]) {
        #[cfg(target_arch = "x86_64")]
        if let Some(t) = crate::simd::avx512_token() {
            // SAFETY: the token proves AVX-512 F and BW and AVX2.
            return unsafe { hw::tally(t, self, s, g, c) };
        }
        self.add_body(s, g, c)
    }

    /// [`Tally::add`]'s body: the maxima and the count in lanes of
    /// [`LANES`], by comparisons (the terms of `F` are finite, the others 0:
    /// no NaN to order), so they vectorise; the histograms a position at a
    /// time.
    #[inline(always)]
    fn add_body(&mut self, s: &[f32], g: &[f32], c: &[f32]) {
        let (mut gm, mut cm, mut n) = ([0.0f32; LANES], [0.0f32; LANES], [0u32; LANES]);
        let mut lane = |l: usize, s: f32, g: f32, c: f32| {
            let ok = in_f(s, g, c);
            let (g, c) = if ok { (g, c) } else { (0.0, 0.0) };
            gm[l] = if gm[l] > g { gm[l] } else { g };
            cm[l] = if cm[l] > c { cm[l] } else { c };
            n[l] += u32::from(ok);
        };
        let (sx, gx, cx) = (
            s.chunks_exact(LANES),
            g.chunks_exact(LANES),
            c.chunks_exact(LANES),
        );
        let rest = sx
            .remainder()
            .iter()
            .zip(gx.remainder())
            .zip(cx.remainder());
        for ((s, g), c) in sx.zip(gx).zip(cx) {
            for l in 0..LANES {
                lane(l, s[l], g[l], c[l]);
            }
        }
        for (l, ((&s, &g), &c)) in rest.enumerate() {
            lane(l, s, g, c);
        }
        self.gmax = gm.into_iter().fold(self.gmax, f32::max);
        self.cmax = cm.into_iter().fold(self.cmax, f32::max);
        self.nf += n.into_iter().map(|x| x as usize).sum::<usize>();
        let (h0, h1) = self.hist.split_at_mut(1 << BUCKET_BITS);
        for ((s, g), c) in s.chunks(2).zip(g.chunks(2)).zip(c.chunks(2)) {
            h0[bucket_of(s[0]) as usize] += u32::from(in_f(s[0], g[0], c[0]));
            if let (Some(&s), Some(&g), Some(&c)) = (s.get(1), g.get(1), c.get(1)) {
                h1[bucket_of(s) as usize] += u32::from(in_f(s, g, c));
            }
        }
    }
}

/// The second pass of [`survivors`] over part of a row: every position
/// outside `F` or at or above `low` into `keep`, and the values of those in
/// `bucket` into `inside`.
struct Kept<'a> {
    low: f32,
    bucket: u32,
    keep: &'a mut Vec<usize>,
    inside: &'a mut Vec<f32>,
}

impl Kept<'_> {
    /// A run of positions from `t0`.
    fn add(&mut self, t0: usize, s: &[f32], g: &[f32], c: &[f32]) {
        #[cfg(target_arch = "x86_64")]
        if let Some(t) = crate::simd::avx512_token() {
            // SAFETY: the token proves AVX-512 F and BW and AVX2.
            return unsafe { hw::kept(t, self, t0, s, g, c) };
        }
        self.add_body(t0, s, g, c)
    }

    /// [`Kept::add`]'s body: a whole chunk of [`LANES`] with no position to
    /// keep (a long row's common case) is passed over on one vectorised
    /// test; the others a position at a time.
    #[inline(always)]
    fn add_body(&mut self, t0: usize, s: &[f32], g: &[f32], c: &[f32]) {
        let low = self.low;
        let kept = |s: f32, g: f32, c: f32| !in_f(s, g, c) | (s >= low);
        let (sx, gx, cx) = (
            s.chunks_exact(LANES),
            g.chunks_exact(LANES),
            c.chunks_exact(LANES),
        );
        let whole = s.len() - sx.remainder().len();
        for (k, ((s, g), c)) in sx.zip(gx).zip(cx).enumerate() {
            let mut any = false;
            for l in 0..LANES {
                any |= kept(s[l], g[l], c[l]);
            }
            if any {
                self.each(t0 + k * LANES, s, g, c);
            }
        }
        self.each(t0 + whole, &s[whole..], &g[whole..], &c[whole..]);
    }

    /// Positions from `t0` one at a time.
    #[inline(always)]
    fn each(&mut self, t0: usize, s: &[f32], g: &[f32], c: &[f32]) {
        for (r, ((&s, &g), &c)) in s.iter().zip(g).zip(c).enumerate() {
            match in_f(s, g, c) {
                false => self.keep.push(t0 + r),
                true if s >= self.low => {
                    self.keep.push(t0 + r);
                    if bucket_of(s) == self.bucket {
                        self.inside.push(s);
                    }
                }
                true => {}
            }
        }
    }
}

/// The passes compiled for AVX-512 (the screen runs where the CPU has it).
#[cfg(target_arch = "x86_64")]
mod hw {
    use super::{Kept, Tally};
    use crate::simd::Avx512;

    /// [`Tally::add_body`] compiled for AVX-512.
    #[target_feature(enable = "avx512f,avx512bw,avx2")]
    pub(super) fn tally(_: Avx512, t: &mut Tally, s: &[f32], g: &[f32], c: &[f32]) {
        t.add_body(s, g, c)
    }

    /// [`Kept::add_body`] compiled for AVX-512.
    #[target_feature(enable = "avx512f,avx512bw,avx2")]
    pub(super) fn kept(_: Avx512, k: &mut Kept<'_>, t0: usize, s: &[f32], g: &[f32], c: &[f32]) {
        k.add_body(t0, s, g, c)
    }
}

/// Whether a value and its bound terms are finite (the position is in `F`).
#[inline(always)]
fn in_f(s: f32, g: f32, c: f32) -> bool {
    s.is_finite() && g.is_finite() && c.is_finite()
}

/// Rows at least this long have their [`survivors`] passes split across the
/// pool when asked (a decode's row; a prefill's rows run in parallel
/// already).
const PAR_LEN: usize = 1 << 15;

/// `f(p, &mut items[p])` for every part `p`, across the pool.
fn each_part<T: Send>(items: &mut [T], f: impl Fn(usize, &mut T) + Sync + Send) {
    crate::pool::for_each_row_mut(items, 1, 1, |p, slot| f(p, &mut slot[0]));
}

/// The largest float32 at or below `x` (so every float32 `s >= x` passes
/// `s >= below(x)`; a few below `x` pass too, harmlessly).
fn below(x: f64) -> f32 {
    let y = x as f32;
    if f64::from(y) > x {
        y.next_down()
    } else {
        y
    }
}

/// [`order`]'s inverse.
fn unorder(o: u32) -> f32 {
    f32::from_bits(match o >> 31 {
        1 => o & 0x7FFF_FFFF,
        _ => !o,
    })
}

/// Histogram buckets of [`survivors`]: the top bits of [`order`].
const BUCKET_BITS: u32 = 11;

/// A value's bucket: the top [`BUCKET_BITS`] of its [`order`].
#[inline(always)]
fn bucket_of(x: f32) -> u32 {
    order(x) >> (32 - BUCKET_BITS)
}

/// A float32's place in the total order of finite values as an unsigned
/// integer (sign bit flipped for positives, all bits for negatives).
#[inline(always)]
fn order(x: f32) -> u32 {
    let b = x.to_bits();
    match b >> 31 {
        0 => b | 0x8000_0000,
        _ => !b,
    }
}

/// The float32 kernels' scores of `positions` for `query` at `level`
/// (`key(t, row)` decodes key `t` into `row` and returns its scale,
/// `fetch(t)` asks for its bytes ahead): the bits the kernels give them in
/// place (decoding is exact, so a decoded key scores as its encoding does).
pub(super) fn rescore<K, F>(
    level: Isa,
    query: &Query,
    positions: &[usize],
    (key, fetch): (&K, &F),
    parallel: bool,
) -> Vec<f32>
where
    K: Fn(usize, &mut [f32]) -> f32 + Sync,
    F: Fn(usize) + Sync,
{
    // At most `PART` keys decoded at a time (a row whose every position
    // survives must not hold all its keys in float32); the parts across the
    // pool when asked (a decode's lone row).
    const PART: usize = 512;
    let parts: Vec<&[usize]> = positions.chunks(PART).collect();
    let mut out: Vec<Vec<f32>> = vec![Vec::new(); parts.len()];
    match parallel {
        true => crate::pool::for_each_row_mut(&mut out, 1, 1, |i, slot| {
            slot[0] = rescore_part(level, query, parts[i], key, fetch)
        }),
        false => {
            for (o, p) in out.iter_mut().zip(&parts) {
                *o = rescore_part(level, query, p, key, fetch);
            }
        }
    }
    out.concat()
}

/// Survivors whose keys are asked for ahead of the one decoded: they lie
/// far apart (a few in a hundred), so each key is a miss the hardware
/// prefetcher does not foresee, and decoding them one by one waited on
/// memory for about half of the re-score's time.
const FETCH_AHEAD: usize = 16;

/// [`rescore`] of one part, on this thread.
fn rescore_part(
    level: Isa,
    query: &Query,
    positions: &[usize],
    key: &impl Fn(usize, &mut [f32]) -> f32,
    fetch: &impl Fn(usize),
) -> Vec<f32> {
    let (n, d) = (positions.len(), query.d);
    let mut rows = vec![0.0f32; n * d];
    let mut scales = vec![1.0f32; n];
    positions.iter().take(FETCH_AHEAD).for_each(|&t| fetch(t));
    for (i, ((&t, row), c)) in positions
        .iter()
        .zip(rows.chunks_exact_mut(d))
        .zip(&mut scales)
        .enumerate()
    {
        if let Some(&ahead) = positions.get(i + FETCH_AHEAD) {
            fetch(ahead);
        }
        *c = key(t, row);
    }
    let mut out = vec![0.0f32; n];
    kernels::score_keys(
        level,
        std::slice::from_ref(query),
        Keys::new(Encoded::F32(&rows), Some(&scales)),
        0,
        &mut [&mut out[..]],
        Want::Scores,
        &mut Scratch::new(d),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::super::kernels::amx::{tests_force, AmxRun};
    use super::super::{indexer_topk_into, IndexerInputs, IndexerShape};
    use crate::keys::Encoded;
    use rand::{RngExt, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Rows and score bits of one call, under the screen `run`.
    fn call(
        run: Option<AmxRun>,
        shape: &IndexerShape,
        inputs: &IndexerInputs<'_>,
        topk: usize,
    ) -> (Vec<i32>, Vec<u32>) {
        let n = shape.n_queries;
        let (mut out, mut scores) = (vec![7; n * topk], vec![7.0f32; n * topk]);
        tests_force::with(run, || {
            indexer_topk_into(shape, inputs, topk, 0, &mut out, Some(&mut scores)).unwrap()
        });
        (out, scores.iter().map(|x| x.to_bits()).collect())
    }

    /// A head whose dot product overflows in the tiles' order (two chains)
    /// but not in the canonical one, hidden by a small weight: the block is
    /// not screened (the guard bounds each head's sums), so the row is the
    /// float32 kernels' — screened, the `-inf` dot's ReLU would give 0 and
    /// rule out the best key.
    #[test]
    fn a_head_overflowing_in_the_tiles_order_is_not_screened() {
        let bf16 = |x: f32| (x.to_bits() >> 16) as u16;
        let (h, d, t) = (1, 32, 32);
        let mut q = vec![0u16; d];
        q[..5].fill(bf16(2f32.powi(120)));
        let w = [2f32.powi(-40)];
        let mut k = vec![0u16; t * d];
        for (i, x) in [-128.0f32, 128.0, -128.0, 64.0, 128.0]
            .into_iter()
            .enumerate()
        {
            k[i] = bf16(x);
        }
        k[d + 4] = bf16(32.0);
        let shape = IndexerShape {
            n_queries: 1,
            n_heads: h,
            d,
            n_keys: t,
        };
        let inputs = IndexerInputs {
            q: Encoded::Bf16(&q),
            weights: &w,
            k: Encoded::Bf16(&k),
            key_scale: None,
            query_pos: &[40],
            compress_ratio: 1,
        };
        let want = call(None, &shape, &inputs, 1);
        assert_eq!(want.0, vec![0]);
        for run in runs() {
            assert_eq!(call(Some(run), &shape, &inputs, 1), want, "{run:?}");
        }
    }

    /// The model, and the instruction where this CPU has it.
    fn runs() -> Vec<AmxRun> {
        #[allow(unused_mut)]
        let mut runs = vec![AmxRun::Model];
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        if let Some(t) = crate::simd::amx::cpu_amx(crate::simd::avx512_token()) {
            runs.push(AmxRun::Hw(t));
        }
        runs
    }

    /// The screen (its software model, on every CPU) gives the float32
    /// kernels' rows and score bits: fp8 keys with scales and bfloat16 keys,
    /// random and low-contrast (a few distinct key rows: thousands of exact
    /// ties at the threshold), query groups of 1 and 16 heads and more, `d`
    /// 32 to 128, rows shorter and longer than `topk`, a NaN key, and the
    /// hardware where this CPU has it.
    #[test]
    fn the_screen_gives_the_float32_kernels_rows_and_scores() {
        let mut rng = ChaCha8Rng::seed_from_u64(0x5C_EE4);
        let bf16 = |x: f32| (x.to_bits() >> 16) as u16;
        let runs = runs();
        for case in 0..60 {
            let h = [1, 4, 16, 20, 64][case % 5];
            let d = [32, 64, 128][case / 5 % 3];
            // The last cases are long rows, whose passes run in parts.
            let t = match case {
                56.. => rng.random_range(33_000..40_000usize),
                _ => rng.random_range(1..1500usize),
            };
            let n = rng.random_range(1..4usize);
            let topk = [1, 16, 100, 700][case / 15 % 4];
            let low = case % 4 == 3;
            // Near ties: one key row but for element 5, which every head's
            // query scales by 2⁻¹⁸ — real scores apart by less than the
            // roundings, so the screen's and the kernels' orders differ.
            let near = case % 4 == 1;
            let fp8 = case % 2 == 0;
            let q: Vec<u16> = (0..n * h * d)
                .map(|i| {
                    let x = rng.random_range(-2.0f32..2.0);
                    bf16(if near && i % d == 5 {
                        x * 2f32.powi(-18)
                    } else {
                        x
                    })
                })
                .collect();
            let w: Vec<f32> = (0..n * h).map(|_| rng.random_range(-1.0f32..1.0)).collect();
            // Low contrast: every key one of four rows.
            let distinct = if low { 4 } else { t };
            let rows8: Vec<u8> = (0..distinct * d)
                .map(|_| loop {
                    let b: u8 = rng.random();
                    if b & 0x7F != 0x7F {
                        break b;
                    }
                })
                .collect();
            let rows16: Vec<u16> = (0..distinct * d)
                .map(|_| bf16(rng.random_range(-3.0f32..3.0)))
                .collect();
            let pick = |r: usize| if low { r % 4 } else { r };
            let pick = |r: usize| if near { 0 } else { pick(r) };
            let mut k8: Vec<u8> = (0..t)
                .flat_map(|r| rows8[pick(r) * d..][..d].to_vec())
                .collect();
            let mut k16: Vec<u16> = (0..t)
                .flat_map(|r| rows16[pick(r) * d..][..d].to_vec())
                .collect();
            if near {
                for r in 0..t {
                    k8[r * d + 5] = rng.random_range(0..0x7Eu8);
                    k16[r * d + 5] = bf16(rng.random_range(-3.0f32..3.0));
                }
            }
            if case % 7 == 5 {
                k8[(t / 2) * d] = 0x7F; // a NaN key: its block goes to the kernels
            }
            let scale: Vec<f32> = (0..t)
                .map(|r| {
                    if low || near {
                        0.01
                    } else {
                        0.001 + (r % 13) as f32 * 1e-3
                    }
                })
                .collect();
            let pos: Vec<usize> = (0..n).map(|_| rng.random_range(0..t + 40)).collect();
            let shape = IndexerShape {
                n_queries: n,
                n_heads: h,
                d,
                n_keys: t,
            };
            let inputs = IndexerInputs {
                q: Encoded::Bf16(&q),
                weights: &w,
                k: if fp8 {
                    Encoded::Fp8E4m3(&k8)
                } else {
                    Encoded::Bf16(&k16)
                },
                key_scale: fp8.then_some(&scale[..]),
                query_pos: &pos,
                compress_ratio: 1,
            };
            let want = call(None, &shape, &inputs, topk);
            for &run in &runs {
                let got = call(Some(run), &shape, &inputs, topk);
                assert_eq!(
                    got.0, want.0,
                    "rows, case {case} ({run:?}, h {h}, d {d}, t {t})"
                );
                assert_eq!(
                    got.1, want.1,
                    "scores, case {case} ({run:?}, h {h}, d {d}, t {t})"
                );
            }
        }
    }
}
