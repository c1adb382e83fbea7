//! The indexer's scoring kernels: a block of keys against every head of a
//! group of queries, in the summation order of the module docs.
//!
//! # Keys across lanes
//!
//! A block of [`BLOCK`] keys is transposed to dimension-major order,
//! `kt[i · BLOCK + r] = k_r[i]`, so that vector lane `r` carries key `r`'s
//! dot product with one head: `dot = fma(q_hi, k_ri, dot)` for `i = 0 .. d`
//! in order, the query's element broadcast to every lane. Nothing is ever
//! summed across lanes: the ReLU, the weight and the head fold
//! `s = fma(w_h, relu(dot_h), s)` run on whole vectors, sixteen keys (eight
//! with AVX2) at a time, and each lane's chain of operations is exactly the
//! scalar chain the portable kernel runs for its key. So every level gives
//! the same bits by construction, and the work is the FMAs and nothing else:
//! no reduction per dot product, no shuffle in the inner loop (the transpose
//! costs `d · BLOCK` moves per block, shared by every head).
//!
//! What would break the bit-identity: a kernel that splits a dot product
//! into partial chains (more accumulators per key, summed at the end), or
//! folds heads in any order but `0 .. H`, or a ReLU that is not
//! `x <= 0 ? 0 : x` on every level.

use crate::keys::Encoded;
use crate::simd::bf16dp::PairRun;
use crate::simd::lines::Line;
use crate::simd::{dispatch, Isa};

pub(super) mod amx;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod pairs;
mod portable;
mod rows;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_pairs;

/// The reach test's probe of this module's families (see `simd::tests`).
#[cfg(test)]
pub(super) fn probe(isa: Isa) {
    tests::probe(isa)
}

/// Keys per block: the lanes of two AVX-512 registers (four AVX2 ones).
pub(super) const BLOCK: usize = 32;

/// How many blocks ahead the AMX screen prefetches its keys.
#[cfg(target_arch = "x86_64")]
const AHEAD: usize = 4;

/// How a query's heads are cut into the kernels' head tiles. Each tile of
/// `G` heads starting at `h0` is dimension-major: head `h0 + j`'s element
/// `i` is at `h0 · d + i · G + j` ([`slot`]), so a tile's broadcasts are one
/// sequential run (`G · d` floats: 3–4 KiB at `d` = 128) that streams from
/// L2 while the block stays in L1. The layout is the kernel's choice (its
/// register budget); the arithmetic, and so the bits, never depend on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Tiles {
    /// 8s, then a 4 if 4 remain, then 1s: the portable kernel's (which
    /// reads any layout) and the pair level's pairs.
    Eights,
    /// 12s, then an 8 if 8 remain, then a 4 if 4 remain, then 1s: the
    /// AVX-512 kernel's (24 accumulators of the 32 registers, 14 loads for
    /// 24 multiply-adds a step).
    Twelves,
    /// 6s, then one tile of the 1–5 heads left: the AVX2 kernel's, whose
    /// 6 heads × 16 keys are 12 independent FMA chains in 15 of the 16
    /// registers. The rule the tile keeps: more independent chains than
    /// the 8 that two FMA ports of latency 4 need (a tile of exactly 8
    /// stalls both ports whenever one operand is late), and no more live
    /// registers than the 16 there are (past them the tile spills to the
    /// stack on every dimension). The measurements behind it are in
    /// docs/kernels.md.
    Sixes,
}

impl Tiles {
    /// The layout the kernel of `level` reads.
    pub fn of(level: Isa) -> Tiles {
        match level {
            Isa::Avx2(_) => Tiles::Sixes,
            Isa::Avx512(_) | Isa::Avx512Bf16(_) => Tiles::Twelves,
            Isa::Scalar => Tiles::Eights,
        }
    }
}

/// A query's heads decoded, in head tiles ([`Tiles`]), and its head weights.
pub(super) struct Query {
    pub h: usize,
    pub d: usize,
    pub tiles: Tiles,
    pub qt: Vec<f32>,
    pub w: Vec<f32>,
    /// The activation between a head's dot product and its weight: the
    /// ReLU (`true`, DeepSeek / GLM / QSA) or none (`false`, MiniMax's
    /// MSA: the dot product as it is).
    pub relu: bool,
    /// `qt × 2⁸`, made on first use after each [`Query::load`]: the query
    /// the AVX2 kernel reads fp8 keys against when it decodes them as `2⁻⁸
    /// ×` their values ([`crate::keys::x86::fp8_folded_query`]; exact, a
    /// power of two, so every FMA rounds as with the unscaled pair). `None`
    /// inside when an element would overflow: the keys are then decoded
    /// unscaled. Once per query per call, not once per key.
    fp8: std::sync::OnceLock<Option<Vec<f32>>>,
    /// The query as bfloat16 pairs for the pair level ([`pairs`]), made on
    /// first use after each [`Query::load`] (once per query per call).
    pairs: std::sync::OnceLock<pairs::QueryPairs>,
    /// The query as the AMX screen's tiles ([`amx`]), made on first use
    /// after each [`Query::load`].
    amx: std::sync::OnceLock<amx::QueryTiles>,
}

/// Where head `head`'s elements are in [`Query::qt`] under `tiles`: element
/// `i` at `base + i · stride` (the stride is the tile's head count).
#[inline]
pub(super) fn slot(tiles: Tiles, h: usize, d: usize, head: usize) -> (usize, usize) {
    let (h0, g) = match tiles {
        Tiles::Eights => {
            let eights = h / 8 * 8;
            if head < eights {
                (head / 8 * 8, 8)
            } else if h - eights >= 4 && head < eights + 4 {
                (eights, 4)
            } else {
                (head, 1)
            }
        }
        Tiles::Twelves => {
            let twelves = h / 12 * 12;
            let eight = twelves + usize::from(h - twelves >= 8) * 8;
            let four = eight + usize::from(h - eight >= 4) * 4;
            if head < twelves {
                (head / 12 * 12, 12)
            } else if head < eight {
                (twelves, 8)
            } else if head < four {
                (eight, 4)
            } else {
                (head, 1)
            }
        }
        Tiles::Sixes => {
            let sixes = h / 6 * 6;
            if head < sixes {
                (head / 6 * 6, 6)
            } else {
                (sixes, h - sixes)
            }
        }
    };
    (h0 * d + head - h0, g)
}

impl Query {
    /// An empty query laid out for the kernel of `level`.
    pub fn new(h: usize, d: usize, level: Isa) -> Self {
        Query {
            h,
            d,
            tiles: Tiles::of(level),
            qt: vec![0.0; h * d],
            w: vec![0.0; h],
            relu: true,
            fp8: std::sync::OnceLock::new(),
            pairs: std::sync::OnceLock::new(),
            amx: std::sync::OnceLock::new(),
        }
    }

    /// [`Query::qt`] `× 2⁸` for keys read as `2⁻⁸ ×` their fp8 values, or
    /// `None` if an element would overflow (made once per load).
    #[cfg(target_arch = "x86_64")]
    fn fp8_folded(&self) -> Option<&[f32]> {
        self.fp8
            .get_or_init(|| crate::keys::x86::fp8_folded_query(&self.qt))
            .as_deref()
    }

    /// The query in float64 for the exact re-score: `([H, d]` head-major
    /// elements, `[H]` weights)`, each value exactly as loaded.
    pub fn as_f64(&self) -> (Vec<f64>, Vec<f64>) {
        let (h, d) = (self.h, self.d);
        let mut q64 = vec![0.0f64; h * d];
        for (head, row) in q64.chunks_exact_mut(d).enumerate() {
            let (base, stride) = slot(self.tiles, h, d, head);
            for (i, x) in row.iter_mut().enumerate() {
                *x = self.qt[base + i * stride] as f64;
            }
        }
        (q64, self.w.iter().map(|&w| w as f64).collect())
    }

    /// Loads query `i`: its `h × d` elements of `q` and its `h` weights;
    /// with `magnitude`, their absolute values (for the error bound).
    pub fn load(&mut self, q: &Encoded<'_>, weights: &[f32], i: usize, magnitude: bool) {
        let (h, d) = (self.h, self.d);
        let mut row = vec![0.0f32; d];
        for head in 0..h {
            q.decode((i * h + head) * d, &mut row);
            let (base, stride) = slot(self.tiles, h, d, head);
            for (x, &v) in self.qt[base..].iter_mut().step_by(stride).zip(&row) {
                *x = v;
            }
        }
        self.w.copy_from_slice(&weights[i * h..(i + 1) * h]);
        if magnitude {
            self.qt.iter_mut().for_each(|x| *x = x.abs());
            self.w.iter_mut().for_each(|x| *x = x.abs());
        }
        self.fp8 = std::sync::OnceLock::new();
        self.pairs = std::sync::OnceLock::new();
        self.amx = std::sync::OnceLock::new();
    }

    /// The query as bfloat16 pairs (`d` even), made once per load.
    fn pairs(&self) -> &pairs::QueryPairs {
        self.pairs
            .get_or_init(|| pairs::QueryPairs::new(self.tiles, self.h, self.d, &self.qt))
    }

    /// Whether the AMX screen may have scored a block for this query since
    /// its last load (its tiles were made: a block passed the admission).
    pub fn screened(&self) -> bool {
        self.amx.get().is_some()
    }

    /// The query as the AMX screen's tiles, made once per load.
    fn amx_tiles(&self) -> &amx::QueryTiles {
        self.amx.get_or_init(|| amx::QueryTiles::new(self))
    }
}

/// The keys a call scores: `enc` holds rows of `d` elements, `scale` one
/// factor per row (`None`: 1), and `then` the bytes the caller scores next
/// if they are not the ones after `enc` (a paged cache's next page): they
/// are prefetched while the last block is scored.
#[derive(Debug, Clone, Copy)]
pub(super) struct Keys<'a> {
    pub enc: Encoded<'a>,
    pub scale: Option<&'a [f32]>,
    pub then: &'a [u8],
}

impl<'a> Keys<'a> {
    pub fn new(enc: Encoded<'a>, scale: Option<&'a [f32]>) -> Self {
        Keys {
            enc,
            scale,
            then: &[],
        }
    }
}

/// A call's working buffers, reused across calls: the transposed block
/// (cache-line aligned: [`Line`], its rows of `BLOCK` floats two whole
/// lines, so no kernel load splits one) and the portable path's decoded rows.
pub(super) struct Scratch {
    kt: Vec<Line>,
    decoded: Vec<f32>,
    /// The block as bfloat16 pairs, for the pair level.
    kp: Vec<u32>,
    /// The AMX screen's dot products of one query and the block.
    dots: Vec<f32>,
    /// The block's keys as bfloat16 rows ([`rows`]), for the AMX screen
    /// and the pair level.
    krows: Vec<u16>,
}

impl Scratch {
    pub fn new(d: usize) -> Self {
        Scratch {
            kt: vec![Line([0.0; 16]); d * BLOCK / 16],
            decoded: Vec::new(),
            kp: Vec::new(),
            dots: Vec::new(),
            krows: Vec::new(),
        }
    }
}

/// `x <= 0 ? 0 : x`: the ReLU that keeps NaN (a NaN dot product must not
/// join the zero plateau).
#[inline(always)]
fn relu(x: f32) -> f32 {
    if x <= 0.0 {
        0.0
    } else {
        x
    }
}

/// Every query's scores of keys `first ..`: query `j`'s of keys `first ..
/// first + outs[j].len()` into `outs[j]` (canonical: `-0.0` is `+0.0`).
/// Each block of keys is read, decoded and transposed once for all the
/// queries (a prefill's queries share it). With [`Want::Magnitudes`], every key is
/// read as its absolute value (and the queries were loaded as magnitudes,
/// the scales given as `|c|`): the scores' error bound
/// `|c_t| Σ_h |w_h| Σ_i |q_hi k_ti|` (the ReLU is then the identity).
/// With [`Want::Terms`], each key's `g_t = |c_t| max_i |k_ti|` (rounded up) and
/// `|c_t|` are written too, entry `r` for key `first + r` (the exact
/// selection's error bound, [`super::exact`]), from the transposed block
/// (or, on the pair level's rows path, from the rows: the same values).
pub(super) fn score_keys(
    level: Isa,
    queries: &[Query],
    keys: Keys<'_>,
    first: usize,
    outs: &mut [&mut [f32]],
    want: Want<'_>,
    scratch: &mut Scratch,
) {
    let run = PairRun::of(level);
    score_keys_in(level, run, queries, keys, first, outs, want, scratch);
}

#[cfg(test)]
thread_local! {
    /// How many blocks this thread's calls took by the pair level's rows
    /// path (the tests' view of which path ran: both give the same bits).
    pub(super) static ROWS_TAKEN: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// [`score_keys`] with the pair level's blocks run by `run` (`None`: no
/// block runs in pairs). Returns how many (query, block) pairs ran in
/// pairs.
#[allow(clippy::too_many_arguments)]
pub(super) fn score_keys_in(
    level: Isa,
    run: Option<PairRun>,
    queries: &[Query],
    keys: Keys<'_>,
    first: usize,
    outs: &mut [&mut [f32]],
    want: Want<'_>,
    scratch: &mut Scratch,
) -> usize {
    let Some(q0) = queries.first() else { return 0 };
    let (d, h) = (q0.d, q0.h);
    let n = outs.iter().map(|o| o.len()).max().unwrap_or(0);
    // The bounds the kernels' pointer reads rely on, checked in release.
    assert!(queries.len() == outs.len());
    assert!(queries.iter().all(|q| q.h == h
        && q.d == d
        && q.w.len() == h
        && q.qt.len() == h * d
        && q.tiles == Tiles::of(level)));
    assert!((first + n) * d <= keys.enc.len());
    assert!(keys.scale.is_none_or(|c| first + n <= c.len()));
    let (magnitude, mut terms) = match want {
        Want::Scores => (false, None),
        Want::Magnitudes => (true, None),
        Want::Terms(t) => (false, Some(t)),
    };
    assert!(terms
        .as_ref()
        .is_none_or(|t| t.g.len() >= n && t.c.len() >= n));
    if scratch.kt.len() != d * BLOCK / 16 {
        *scratch = Scratch::new(d);
    }
    let kt: &mut [f32] = bytemuck::cast_slice_mut(&mut scratch.kt);
    let decoded = &mut scratch.decoded;
    // The pair level needs pairs of dimensions; the AVX2 fp8 fold is below it.
    let run = run.filter(|_| d.is_multiple_of(2));
    // The AMX screen: only where the exact selection asked for it (it
    // re-scores what the screen cannot rule out; `amx::AmxRun::of` took
    // only `d` a multiple of 32), its keys fp8 or bfloat16, its queries
    // bfloat16-exact (decided once per call, so a call it cannot serve
    // pays nothing per block).
    let screen = terms
        .as_ref()
        .and_then(|t| t.screen)
        .filter(|_| matches!(keys.enc, Encoded::Bf16(_) | Encoded::Fp8E4m3(_)))
        .filter(|_| queries.iter().all(|q| q.pairs().summary.is_some()));
    // The pair level's rows path (below), decided once per call so a call
    // it cannot serve decodes no block for it: bfloat16 keys against
    // queries whose pairs are exact, fp8 keys against queries their fixed
    // summary admits.
    let rows_path = run.filter(|_| !magnitude).filter(|_| match keys.enc {
        Encoded::Bf16(_) => queries.iter().all(|q| q.pairs().summary.is_some()),
        Encoded::Fp8E4m3(_) => queries
            .iter()
            .all(|q| pairs::admits(rows::FP8_SUMMARY, q.pairs().summary)),
        _ => false,
    });
    let (kp, dots, krows) = (&mut scratch.kp, &mut scratch.dots, &mut scratch.krows);
    if run.is_some() {
        kp.resize(d / 2 * BLOCK, 0);
    }
    if let Some(screen) = screen {
        amx::begin(screen);
    }
    let mut paired = 0;
    // fp8 keys at the AVX2 level are read as `2⁻⁸ ×` their values against
    // each query `× 2⁸` (folded once per query per call), when every query
    // of the group folds exactly; otherwise they are decoded unscaled.
    let folded = fp8_folded(level, keys.enc, queries);
    for b in (0..n).step_by(BLOCK) {
        let (t0, nb) = (first + b, BLOCK.min(n - b));
        // The AMX screen takes the block from its rows, for every query of
        // the group, where it can ([`amx`]); else the kernels below.
        if let (Some(screen), Some(terms)) = (screen, terms.as_mut()) {
            // The screen reads a block in a few hundred cycles: the keys
            // `AHEAD` blocks ahead are fetched now, in two halves (the
            // hardware prefetcher alone left the decode waiting on memory).
            #[cfg(target_arch = "x86_64")]
            let ahead = keys.enc.bytes((t0 + AHEAD * BLOCK) * d, BLOCK * d);
            #[cfg(target_arch = "x86_64")]
            crate::keys::prefetch(ahead, 0, ahead.len() / 2, crate::keys::CacheLevel::L2);
            let enc = keys.enc.slice(t0 * d, (t0 + nb) * d);
            let rows = rows::block_rows(enc, nb, d, krows);
            #[cfg(target_arch = "x86_64")]
            crate::keys::prefetch(
                ahead,
                ahead.len() / 2,
                ahead.len(),
                crate::keys::CacheLevel::L2,
            );
            if let Some((rows, kmax, summary)) = rows {
                let scale = keys.scale.map(|s| &s[t0..t0 + nb]);
                let kmax = f64::from(kmax);
                let g = fill_terms(kmax, scale, nb, b, terms);
                if queries.iter().all(|q| {
                    pairs::admits(summary, q.pairs().summary) && q.amx_tiles().bounded(kmax, g)
                }) {
                    for (q, out) in queries.iter().zip(outs.iter_mut()) {
                        let Some(dst) = out.get_mut(b..).filter(|o| !o.is_empty()) else {
                            continue;
                        };
                        let mut acc = [0.0f32; BLOCK];
                        amx::sums(screen, q, q.amx_tiles(), rows, dots, &mut acc);
                        store_scaled(dst, &acc, keys.scale, t0);
                    }
                    continue;
                }
            }
        }
        // The next block's bytes are fetched while this one is scored: the
        // ones after it, or past the end of `enc` the caller's `then`.
        let mut next = keys.enc.bytes((t0 + BLOCK) * d, BLOCK * d);
        if next.is_empty() {
            next = keys.then;
        }
        // The pair level on bfloat16 or fp8 keys every query's pairs admit:
        // the block's bfloat16 rows (bfloat16 read in place, fp8 decoded;
        // none with a NaN or infinity) moved straight into pairs, no float32
        // transpose. The terms from the rows' largest magnitude, as
        // [`key_terms`] gives them from the transposed block.
        if let Some(run) = rows_path {
            let enc = keys.enc.slice(t0 * d, (t0 + nb) * d);
            if let Some((rows, kmax, _)) = rows::block_rows(enc, nb, d, krows)
                .filter(|&(_, _, s)| queries.iter().all(|q| pairs::admits(s, q.pairs().summary)))
            {
                #[cfg(test)]
                ROWS_TAKEN.with(|n| n.set(n.get() + 1));
                if let Some(terms) = terms.as_mut() {
                    let scale = keys.scale.map(|s| &s[t0..t0 + nb]);
                    fill_terms(f64::from(kmax), scale, nb, b, terms);
                }
                pairs::transpose_rows(rows, d, kp);
                for (q, out) in queries.iter().zip(outs.iter_mut()) {
                    let Some(dst) = out.get_mut(b..).filter(|o| !o.is_empty()) else {
                        continue;
                    };
                    let mut acc = [0.0f32; BLOCK];
                    pair_sums(run, q, kp, &mut acc, std::mem::take(&mut next));
                    paired += 1;
                    store_scaled(dst, &acc, keys.scale, t0);
                }
                continue;
            }
        }
        // The block's keys are read in place and decoded as they are
        // transposed (the portable path decodes them first).
        let src = Src {
            scaled: folded.is_some(),
            ..Src::new(level, keys.enc.slice(t0 * d, (t0 + nb) * d))
        };
        transpose(level, src, d, kt, decoded);
        if let Some(terms) = terms.as_mut() {
            // An AVX2 fp8 block holds `2⁻⁸ ×` the keys: the factor back is exact.
            let unfold = if folded.is_some() { 256.0 } else { 1.0 };
            key_terms(
                level,
                kt,
                nb,
                unfold,
                keys.scale.map(|s| &s[t0..t0 + nb]),
                b,
                terms,
            );
        }
        if magnitude {
            kt.iter_mut().for_each(|x| *x = x.abs());
        }
        // The block as pairs, and its exponent summary, when some query
        // could be scored in pairs.
        let block = match run {
            Some(run) if queries.iter().any(|q| q.pairs().summary.is_some()) => {
                Some((run, pairs::pack_block(kt, d, kp)))
            }
            _ => None,
        };
        for (j, (q, out)) in queries.iter().zip(outs.iter_mut()).enumerate() {
            let Some(dst) = out.get_mut(b..).filter(|o| !o.is_empty()) else {
                continue;
            };
            let qt = folded.as_ref().map_or(&q.qt[..], |f| f[j]);
            let mut acc = [0.0f32; BLOCK];
            match block.filter(|&(_, summary)| pairs::admits(summary, q.pairs().summary)) {
                Some((run, _)) => {
                    pair_sums(run, q, kp, &mut acc, std::mem::take(&mut next));
                    paired += 1;
                }
                None => weighted_relu_sums(level, q, qt, kt, &mut acc, std::mem::take(&mut next)),
            }
            store_scaled(dst, &acc, keys.scale, t0);
        }
    }
    if let Some(screen) = screen {
        amx::end(screen);
    }
    paired
}

/// A block's sums `acc` into `dst` (its keys `t0 ..`), each times its key's
/// scale (none: 1), `-0.0` stored as `+0.0` (the canonical score).
#[inline]
fn store_scaled(dst: &mut [f32], acc: &[f32; BLOCK], scale: Option<&[f32]>, t0: usize) {
    for (r, (o, a)) in dst.iter_mut().zip(acc).enumerate() {
        let c = scale.map_or(1.0, |s| s[t0 + r]);
        *o = a * c + 0.0;
    }
}

/// The block's `Σ_h fma(w_h, relu(q_h · k_r))` for every key `r`, in
/// pairs ([`pairs::pair_sums`]) run by `run`, into `acc`: the bits
/// [`weighted_relu_sums`] gives on a block [`pairs::admits`].
/// `next`'s lines are prefetched along the way, as [`weighted_relu_sums`]
/// does.
fn pair_sums(run: PairRun, q: &Query, kp: &[u32], acc: &mut [f32; BLOCK], next: &[u8]) {
    let (qp, w, d2) = (&q.pairs().qp[..], &q.w[..], q.d / 2);
    match run {
        // SAFETY: the model's operations are portable Rust.
        PairRun::Model => unsafe {
            match q.relu {
                true => pairs::pair_sums::<_, true>(pairs::Model, qp, kp, w, d2, acc, next),
                false => pairs::pair_sums::<_, false>(pairs::Model, qp, kp, w, d2, acc, next),
            }
        },
        // SAFETY: the token proves the CPU runs the kernel's instructions.
        #[cfg(target_arch = "x86_64")]
        PairRun::Hw(t) => unsafe {
            match q.relu {
                true => pairs::hw::sums::<true>(t, qp, kp, w, d2, acc, next),
                false => pairs::hw::sums::<false>(t, qp, kp, w, d2, acc, next),
            }
        },
    }
}

/// What [`score_keys`] writes besides, or instead of, the scores.
pub(super) enum Want<'a> {
    /// The scores.
    Scores,
    /// The scores' error bound instead (`|c_t| Σ_h |w_h| Σ_i |q_hi k_ti|`).
    Magnitudes,
    /// The scores, and each key's bound terms.
    Terms(KeyTerms<'a>),
}

/// The exact selection's per-key bound terms (see [`score_keys`]): `g`
/// and `c`, entry `r` for the `r`-th key scored.
pub(super) struct KeyTerms<'a> {
    pub g: &'a mut [f32],
    pub c: &'a mut [f32],
    /// The AMX screen the exact selection runs ([`amx`]), if any: blocks
    /// it admits are scored by the tiles, and the selection re-scores every
    /// position their scores cannot rule out.
    pub screen: Option<amx::AmxRun>,
}

/// The block's bound terms: every one of its `nb` keys gets the block's
/// `g = max_r |c_r| · max_r max_i |k_ri|` rounded up to a float32 (at least
/// each key's own `|c_t| max_i |k_ti|`; one rounding per block, not per
/// key) and `c = max_r |c_r|`, into `terms` from entry `at`. The keys are
/// transposed in `kt`, each `unfold` × its stored value. NaN when a key
/// holds a NaN (its bound is then no bound: the exact selection re-scores
/// the block's keys).
fn key_terms(
    level: Isa,
    kt: &[f32],
    nb: usize,
    unfold: f64,
    scale: Option<&[f32]>,
    at: usize,
    terms: &mut KeyTerms<'_>,
) {
    let mut m = [0u32; BLOCK];
    abs_max_bits(level, kt, &mut m);
    let kmax = m[..nb].iter().copied().max().unwrap_or(0);
    fill_terms(
        f64::from(f32::from_bits(kmax)) * unfold,
        scale,
        nb,
        at,
        terms,
    );
}

/// [`key_terms`] from the block's largest `|k|` (`kmax`, exact in float64):
/// fills entries `at .. at + nb` and returns the block's `g`.
fn fill_terms(
    kmax: f64,
    scale: Option<&[f32]>,
    nb: usize,
    at: usize,
    terms: &mut KeyTerms<'_>,
) -> f32 {
    let cmax = scale.map_or(1.0, |s| s[..nb].iter().fold(0.0f32, |a, x| a.max(x.abs())));
    // A NaN scale: `f32::max` skips it, so the block's `c` is NaN by hand.
    let cmax = match scale.is_some_and(|s| s[..nb].iter().any(|x| x.is_nan())) {
        true => f32::NAN,
        false => cmax,
    };
    let g = super::exact::up32(kmax * f64::from(cmax));
    terms.g[at..at + nb].fill(g);
    terms.c[at..at + nb].fill(cmax);
    g
}

/// Each lane's largest `|k|` over the transposed block `kt` (`[d, BLOCK]`),
/// as the bits of a float32: the magnitude's bits order as its value does,
/// and a NaN's are above infinity's, so a lane holding a NaN ends NaN.
fn abs_max_bits(level: Isa, kt: &[f32], m: &mut [u32; BLOCK]) {
    assert!(kt.len().is_multiple_of(BLOCK));
    // SAFETY (bounds): none; the body iterates its slices.
    dispatch!("indexer.key_max", level, {
        avx512(token) => lanes::abs_max_bits_avx512(token, kt, m),
        avx2(token) => lanes::abs_max_bits_avx2(token, kt, m),
        scalar => abs_max_bits_body(kt, m),
    })
}

/// [`abs_max_bits`]'s portable body.
fn abs_max_bits_body(kt: &[f32], m: &mut [u32; BLOCK]) {
    for lanes in kt.chunks_exact(BLOCK) {
        for (x, &k) in m.iter_mut().zip(lanes) {
            *x = (*x).max(k.to_bits() & 0x7FFF_FFFF);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod lanes {
    use super::BLOCK;
    use crate::simd::{Avx2, Avx512};
    use std::arch::x86_64::*;

    /// [`super::abs_max_bits`] in AVX2: four registers of lanes, kept across
    /// the rows (a compiler left to it vectorises across rows instead).
    #[target_feature(enable = "avx2")]
    pub(super) fn abs_max_bits_avx2(_: Avx2, kt: &[f32], m: &mut [u32; BLOCK]) {
        let mask = _mm256_set1_epi32(0x7FFF_FFFF);
        let mut acc = [_mm256_setzero_si256(); BLOCK / 8];
        for lanes in kt.chunks_exact(BLOCK) {
            for (j, a) in acc.iter_mut().enumerate() {
                // SAFETY: `lanes` holds BLOCK floats; lane group `j` is
                // floats `8j .. 8j + 8` of it (an unaligned load).
                let v = unsafe { _mm256_loadu_si256(lanes.as_ptr().add(8 * j).cast()) };
                *a = _mm256_max_epu32(*a, _mm256_and_si256(v, mask));
            }
        }
        for (j, a) in acc.iter().enumerate() {
            let mut out = [0u32; 8];
            // SAFETY: `out` holds 8 u32 (an unaligned store).
            unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), *a) };
            for (x, o) in m[8 * j..8 * j + 8].iter_mut().zip(out) {
                *x = (*x).max(o);
            }
        }
    }

    /// [`super::abs_max_bits`] in AVX-512: two registers of lanes.
    #[target_feature(enable = "avx512f,avx2")]
    pub(super) fn abs_max_bits_avx512(_: Avx512, kt: &[f32], m: &mut [u32; BLOCK]) {
        let mask = _mm512_set1_epi32(0x7FFF_FFFF);
        let mut acc = [_mm512_setzero_si512(); BLOCK / 16];
        for lanes in kt.chunks_exact(BLOCK) {
            for (j, a) in acc.iter_mut().enumerate() {
                // SAFETY: `lanes` holds BLOCK floats; lane group `j` is
                // floats `16j .. 16j + 16` of it (an unaligned load).
                let v = unsafe { _mm512_loadu_si512(lanes.as_ptr().add(16 * j).cast()) };
                *a = _mm512_max_epu32(*a, _mm512_and_si512(v, mask));
            }
        }
        for (j, a) in acc.iter().enumerate() {
            let mut out = [0u32; 16];
            // SAFETY: `out` holds 16 u32 (an unaligned store).
            unsafe { _mm512_storeu_si512(out.as_mut_ptr().cast(), *a) };
            for (x, o) in m[16 * j..16 * j + 16].iter_mut().zip(out) {
                *x = (*x).max(o);
            }
        }
    }
}

/// Every query's [`Query::qt`] `× 2⁸` when `level` is AVX2, the keys are
/// fp8 and every query folds exactly (the AVX2 transpose then decodes the
/// keys as `2⁻⁸ ×` their values: no multiply per key element); else `None`.
fn fp8_folded<'q>(level: Isa, enc: Encoded<'_>, queries: &'q [Query]) -> Option<Vec<&'q [f32]>> {
    #[cfg(target_arch = "x86_64")]
    if let (Isa::Avx2(_), Encoded::Fp8E4m3(_)) = (level, enc) {
        return queries.iter().map(Query::fp8_folded).collect();
    }
    let _ = (level, enc, queries);
    None
}

/// A block's keys as a transpose reads them: the encoded rows, whether fp8
/// bytes are known to hold no NaN (the AVX-512 and AVX2 decodes then skip
/// the NaN fix-up; the bytes are checked once per block, 64 at a time,
/// already in cache: the block was prefetched while the last one was
/// scored), and whether fp8 keys are wanted as `2⁻⁸ ×` their values (the
/// AVX2 transpose only; the query then carries the `2⁸`).
#[derive(Clone, Copy)]
pub(super) struct Src<'a> {
    pub enc: Encoded<'a>,
    /// Read by the SIMD decodes only: x86-64 only.
    #[cfg(target_arch = "x86_64")]
    pub finite: bool,
    pub scaled: bool,
}

impl<'a> Src<'a> {
    fn new(level: Isa, enc: Encoded<'a>) -> Self {
        #[cfg(not(target_arch = "x86_64"))]
        let _ = level;
        Src {
            enc,
            #[cfg(target_arch = "x86_64")]
            finite: match (level, enc) {
                (Isa::Avx2(_) | Isa::Avx512(_) | Isa::Avx512Bf16(_), Encoded::Fp8E4m3(b)) => {
                    !crate::keys::fp8_has_nan(b)
                }
                _ => false,
            },
            scaled: false,
        }
    }
}

/// `kt[i · BLOCK + r] = k_r[i]` for the `src.enc.len() / d ≤ BLOCK` keys
/// given (decoded exactly), `0` in the lanes of the keys past them (scored,
/// discarded). `decoded` is the portable path's buffer for the decoded rows.
fn transpose(level: Isa, src: Src<'_>, d: usize, kt: &mut [f32], decoded: &mut Vec<f32>) {
    let n = src.enc.len() / d;
    assert!(n <= BLOCK && src.enc.len() == n * d && kt.len() == d * BLOCK);
    // Only the AVX2 transpose reads fp8 keys scaled (its query is folded).
    assert!(!src.scaled || matches!(level, Isa::Avx2(_)));
    // SAFETY (bounds): `src` holds `n <= BLOCK` rows of `d` and `kt` `d`
    // rows of `BLOCK` (asserted above).
    dispatch!("indexer.transpose", level, {
        avx512(token) => avx512::transpose(token, src, n, d, kt),
        avx2(token) => avx2::transpose(token, src, n, d, kt),
        scalar => {
            let rows: &[f32] = match src.enc {
                Encoded::F32(s) => s,
                enc => {
                    decoded.resize(n * d, 0.0);
                    enc.decode_at(level, 0, decoded);
                    decoded
                }
            };
            portable::transpose(rows, n, d, kt)
        }
    })
}

/// The block's `Σ_h fma(w_h, relu(q_h · k_r))` for every key `r`, in head
/// order, into `acc` (which starts at `+0.0`); `next`'s cache lines are
/// prefetched along the way, spread over the FMAs (a burst of prefetches
/// stalls on the line-fill buffers; spread out they hide under the work).
fn weighted_relu_sums(
    level: Isa,
    q: &Query,
    qt: &[f32],
    kt: &[f32],
    acc: &mut [f32; BLOCK],
    next: &[u8],
) {
    let (h, d, w) = (q.h, q.d, &q.w[..]);
    // The kernels read the query (`q.qt`, or its fp8 fold) in their own
    // tiles (checked in release: a wrong layout would read other heads'
    // elements).
    assert!(w.len() == h && qt.len() == h * d && kt.len() == d * BLOCK);
    assert!(q.tiles == Tiles::of(level) || level == Isa::Scalar);
    // Off x86-64 only the portable kernel runs: it leaves the prefetching
    // of `next` to the hardware.
    #[cfg(not(target_arch = "x86_64"))]
    let _ = next;
    // SAFETY (bounds): `qt` holds the `h` heads' tiles of `d`, `kt` `d`
    // rows of `BLOCK`, `w` `h` weights (asserted).
    // The activation is a const parameter of every kernel: the ReLU's code
    // is the same instructions it always was, and activation none drops
    // them (the lanes' chains are otherwise the same, so the levels still
    // agree bit for bit).
    let relu = q.relu;
    dispatch!("indexer.weighted_relu_sums", level, {
        avx512(token) => match relu {
            true => avx512::weighted_relu_sums::<true>(token, qt, kt, w, d, acc, next),
            false => avx512::weighted_relu_sums::<false>(token, qt, kt, w, d, acc, next),
        },
        avx2(token) => match relu {
            true => avx2::weighted_relu_sums::<true>(token, qt, kt, w, d, acc, next),
            false => avx2::weighted_relu_sums::<false>(token, qt, kt, w, d, acc, next),
        },
        scalar => match relu {
            true => portable::weighted_relu_sums::<true>(q.tiles, qt, kt, w, d, acc),
            false => portable::weighted_relu_sums::<false>(q.tiles, qt, kt, w, d, acc),
        },
    })
}

/// `next` cut into `tiles` runs of whole cache lines, one per tile call.
fn prefetch_runs(next: &[u8], tiles: usize) -> impl Iterator<Item = &[u8]> {
    let per = next.len().div_ceil(64).div_ceil(tiles.max(1)).max(1) * 64;
    next.chunks(per).chain(std::iter::repeat(&[][..]))
}

/// Hints the cache hierarchy to fetch line `i` of `run` into L1 (and so
/// L2; nothing past the run): [`crate::keys::prefetch`] of its first byte.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_line(run: &[u8], i: usize) {
    let at = i.saturating_mul(64);
    crate::keys::prefetch(run, at, at.saturating_add(1), crate::keys::CacheLevel::L1);
}
