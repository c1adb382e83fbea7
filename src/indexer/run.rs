//! How a call's queries are scored and selected.
//!
//! Consecutive queries that read the same keys (a prefill's queries, one
//! sequence's) form a **group** of at most [`GROUP`]. A group's keys are cut
//! into chunks that go across the pool; within a chunk every block of keys is
//! read, decoded and transposed once for the whole group
//! ([`super::kernels::score_keys`]), so a prefill reads its keys once per group, not
//! once per query. Then each query's row is selected from its scores, the
//! group's rows in parallel; a lone long row (a decode) is selected in
//! parallel parts instead, or among the AMX screen's survivors where it ran
//! ([`select_rows`]). The score matrix
//! ([`score_rows`], what an engine's rows are checked against) is the same
//! groups' scores copied out: one scoring path, so the scores checked are
//! the bits the top-k ranked. A second path (its own grouping, its own
//! chunks) could drift from it and make the check judge other numbers.
//!
//! The only buffers are one group's scores — at most [`GROUP`] queries × the
//! keys they see (rounded up to whole chunks), kept near [`GROUP_FLOATS`] —
//! and the candidates of the rows being selected: never
//! `[queries, positions]`.

use super::exact::{self, Rescore};
use super::kernels::{amx::AmxRun, KeyTerms, Query};
use super::screen;
use super::select::{select_row, RowRule, Search};
use crate::keys::Encoded;
use crate::pool;

/// Queries per group at most. 32, not 16: each group is a scoring pass and
/// a selection pass with a hand-off between them, and a prefill of 128 × 32K
/// keys on two Zen 3 cores ran at 122–128 GFLOP/s with 16, 135–142 with 32
/// (115 with 8; 64 no better than 32). The group's query tiles (32 KiB each
/// at 64 heads × 128) stream from L2/L3 either way.
pub(super) const GROUP: usize = 32;

/// A group's score buffer stays within this many floats (16 MiB) unless a
/// single query needs more: a long context gets smaller groups.
const GROUP_FLOATS: usize = 4 << 20;

/// A chunk's work in the pool's units ([`pool::PAR_MIN_WORK`] counts
/// elements a scan touches, about 0.4 ns each): `width` keys scored
/// against `g` queries of `h` heads of `d`. An FMA lane costs about a
/// twentieth of a scanned element (sixteen lanes a cycle at AVX2), and
/// every key also pays its transpose (`d` elements, shared by the group)
/// and its place in the selection. Counting FMA lanes as elements (as
/// before) split a small-head decode (4 heads × 16 dims: 64 lanes a key)
/// across threads at 16K keys, where one thread was faster than two.
pub(super) fn chunk_work(width: usize, g: usize, h: usize, d: usize) -> usize {
    let per_key = g.saturating_mul(h * d / 20 + 10) + d / 4;
    width.saturating_mul(per_key)
}

/// A group's scores, chunk-major: chunk `c` of query `j` is the `width`
/// floats at `(c · (g + extra) + j) · width`, so one chunk of the whole
/// group is one contiguous run (one parallel task); with the keys' bound
/// terms (`extra = 2`), the chunk's `g_t` and `|c_t|` are its rows `g` and
/// `g + 1`.
struct GroupScores<'a> {
    buf: &'a [f32],
    g: usize,
    extra: usize,
    width: usize,
}

impl GroupScores<'_> {
    #[inline]
    fn get(&self, j: usize, t: usize) -> f32 {
        self.buf[at(self.g + self.extra, self.width, j, t)]
    }

    /// Key `t`'s bound terms `(g_t, |c_t|)` (a group scored with them).
    #[inline]
    fn terms(&self, t: usize) -> (f32, f32) {
        (self.get(self.g, t), self.get(self.g + 1, t))
    }

    /// Query `j`'s first `dst.len()` scores into `dst`, a chunk at a time.
    fn copy_row(&self, j: usize, dst: &mut [f32]) {
        for (c, piece) in dst.chunks_mut(self.width).enumerate() {
            let at = (c * (self.g + self.extra) + j) * self.width;
            piece.copy_from_slice(&self.buf[at..at + piece.len()]);
        }
    }
}

/// A group's scores, writable: what the AMX screen's second half rewrites.
pub(super) struct GroupScoresMut<'a> {
    buf: &'a mut [f32],
    g: usize,
    extra: usize,
    width: usize,
}

impl GroupScoresMut<'_> {
    /// The scores, read-only.
    fn view(&self) -> GroupScores<'_> {
        GroupScores {
            buf: self.buf,
            g: self.g,
            extra: self.extra,
            width: self.width,
        }
    }

    /// Sets query `j`'s score of key `t`.
    fn set(&mut self, j: usize, t: usize, s: f32) {
        self.buf[at(self.g + self.extra, self.width, j, t)] = s;
    }
}

/// Where row `j`'s entry `t` is in a group's chunk-major buffer of `rows`
/// rows a chunk, chunks `width` wide ([`GroupScores`]).
#[inline(always)]
fn at(rows: usize, width: usize, j: usize, t: usize) -> usize {
    // A chunk is a power of two wide but for a paged cache's odd pages:
    // a shift, not a division, on every read of the selection.
    let (c, r) = match width.is_power_of_two() {
        true => (t >> width.trailing_zeros(), t & (width - 1)),
        false => (t / width, t % width),
    };
    (c * rows + j) * width + r
}

/// Query `j`'s row of a group scored with its keys' bound terms.
struct GroupRow<'a> {
    view: &'a GroupScores<'a>,
    j: usize,
}

// `score` and `terms` are read once per entry in the refinements' loops, from
// more than one instantiation (the max and lse pools): inlined, as when they
// had one caller.
impl exact::RowScores for GroupRow<'_> {
    #[inline]
    fn score(&self, t: usize) -> f32 {
        self.view.get(self.j, t)
    }

    #[inline]
    fn terms(&self, t: usize) -> (f32, f32) {
        self.view.terms(t)
    }

    fn runs(&self, len: usize, f: exact::Run<'_>) {
        let GroupScores { buf, g, width, .. } = *self.view;
        for (c, chunk) in buf.chunks(width * (g + 2)).enumerate() {
            let t0 = c * width;
            if t0 >= len {
                break;
            }
            let n = width.min(len - t0);
            let row = |j: usize| &chunk[j * width..j * width + n];
            f(t0, row(self.j), row(g), row(g + 1));
        }
    }
}

/// A screened row seen through its survivors ([`screen::survivors`],
/// ascending): the only positions [`exact::refine`]'s pass visits, each
/// maximal run of consecutive ones as a run. The proof in [`screen`]'s
/// docs shows the others change neither the row nor what `refine` makes of
/// it.
struct SurvivorRow<'a> {
    row: GroupRow<'a>,
    positions: &'a [usize],
}

impl exact::RowScores for SurvivorRow<'_> {
    #[inline]
    fn score(&self, t: usize) -> f32 {
        self.row.score(t)
    }

    #[inline]
    fn terms(&self, t: usize) -> (f32, f32) {
        self.row.terms(t)
    }

    fn runs(&self, len: usize, f: exact::Run<'_>) {
        debug_assert!(self.positions.is_sorted_by(|a, b| a < b));
        let (mut s, mut g, mut c) = (Vec::new(), Vec::new(), Vec::new());
        let mut rest = self.positions;
        while let Some(&t0) = rest.first().filter(|&&t| t < len) {
            let n = rest
                .iter()
                .enumerate()
                .take_while(|&(i, &t)| t == t0 + i && t < len)
                .count();
            s.clear();
            g.clear();
            c.clear();
            for t in t0..t0 + n {
                let (gt, ct) = self.row.terms(t);
                s.push(self.row.score(t));
                g.push(gt);
                c.push(ct);
            }
            f(t0, &s, &g, &c);
            rest = &rest[n..];
        }
    }
}

/// The query side of a call: `n` queries of `h` heads of `d`, their
/// weights `[n, h]`, and what each sees.
pub(super) struct Queries<'a, S, L> {
    pub n: usize,
    pub h: usize,
    pub d: usize,
    /// The SIMD level the queries are scored at (their tiles' layout).
    pub level: crate::simd::Isa,
    /// Load the queries as magnitudes (`|q|`, `|w|`), for the scores' error
    /// bound ([`super::indexer_scores_into`]); `false` for the scores
    /// themselves.
    pub magnitude: bool,
    pub q: &'a Encoded<'a>,
    pub weights: &'a [f32],
    /// The ReLU between each head's dot product and its weight (`false`:
    /// activation none).
    pub relu: bool,
    /// `same_keys(i, j)`: queries `i` and `j` read the same keys (may share
    /// a group).
    pub same_keys: S,
    /// Keys query `i` sees (its context `L`).
    pub len: L,
}

/// The output side: `[n, topk]` rows (rank order, then `-1`, then the
/// witnesses of `num_segments`), and optionally each entry's score.
pub(super) struct Rows<'a> {
    pub topk: usize,
    pub num_segments: usize,
    /// Forced entries and the layout ([`RowRule`]).
    pub rule: RowRule,
    pub out: &'a mut [i32],
    pub scores: Option<&'a mut [f32]>,
}

/// Every query's row: [`for_each_group`], each group's rows then selected
/// from its scores (the group's rows in parallel, a lone row in parallel
/// parts; a row the AMX screen ran on among its survivors alone) and made
/// exact ([`exact::refine`]): `key(i0, t, row)` decodes key `t` of the
/// group whose first query is `i0` into `row` and returns its scale;
/// `fetch(i0, t)` asks for that key's bytes ahead of it (a hint: the
/// screen's re-score reads its survivors' keys far apart, each a miss).
pub(super) fn select_rows<S, L>(
    queries: Queries<'_, S, L>,
    rows: Rows<'_>,
    width: usize,
    score: impl Fn(usize, usize, &[Query], &mut [&mut [f32]], Option<KeyTerms<'_>>) + Sync,
    key: impl Fn(usize, usize, &mut [f32]) -> f32 + Sync,
    fetch: impl Fn(usize, usize) + Sync,
) where
    S: Fn(usize, usize) -> bool,
    L: Fn(usize) -> usize,
{
    let level = queries.level;
    let Rows {
        topk,
        num_segments,
        rule,
        out,
        mut scores,
    } = rows;
    if topk == 0 {
        return;
    }
    // The AMX screen where the exact selection alone reads the scores: not
    // with the score pool, the witnesses or forced entries.
    let plain =
        rule.pool <= 1 && num_segments == 0 && rule.force_first == 0 && rule.force_last == 0;
    let screen = AmxRun::of(level, queries.d).filter(|_| plain);
    let settle = |i0: usize, lens: &[usize], view: &mut GroupScoresMut<'_>, group: &[Query]| {
        let fixes = {
            let view = view.view();
            let fix = |j: usize| {
                // A query none of whose blocks the screen took (its tiles
                // were never made) holds the float32 kernels' scores.
                if !group[j].screened() {
                    return None;
                }
                let (len, take) = (lens[j], topk.min(lens[j]));
                let row = GroupRow { view: &view, j };
                let keep = screen::survivors(&group[j], len, take, &row, group.len() == 1);
                let key = |t: usize, row: &mut [f32]| key(i0, t, row);
                let fetch = |t: usize| fetch(i0, t);
                let exact =
                    screen::rescore(level, &group[j], &keep, (&key, &fetch), group.len() == 1);
                Some((keep, exact))
            };
            // (A lone query's row runs on this thread: one row is no task.)
            let mut fixes = vec![None; group.len()];
            pool::for_each_row_mut(&mut fixes, 1, 1, |j, slot| slot[0] = fix(j));
            fixes
        };
        // Each screened row's survivors: its candidates ([`Search::Among`]).
        let mut among = Vec::with_capacity(group.len());
        for (j, fix) in fixes.into_iter().enumerate() {
            among.push(fix.map(|(keep, exact)| {
                for (&t, s) in keep.iter().zip(exact) {
                    view.set(j, t, s);
                }
                keep
            }));
        }
        among
    };
    for_each_group(
        queries,
        width,
        screen,
        Some(settle),
        score,
        |i0, lens, view, group, among| {
            let (g, i1) = (lens.len(), i0 + lens.len());
            let group_out = &mut out[i0 * topk..i1 * topk];
            let row_of = |j: usize, row: &mut [i32], split: bool| {
                if rule.pool > 1 {
                    return pooled_row(
                        &PooledRow {
                            view,
                            j,
                            len: lens[j],
                            level,
                            i0,
                            query: &group[j],
                        },
                        topk,
                        rule,
                        row,
                        &key,
                    );
                }
                let score = |t: usize| view.get(j, t);
                // A row all of whose positions survived is searched as any
                // other (in parallel parts where it is long).
                let survivors = among
                    .get(j)
                    .and_then(|a| a.as_deref())
                    .filter(|p| p.len() < lens[j]);
                let refine = |top: &mut Vec<u64>, lo: usize, hi: usize| {
                    let rescore = Rescore {
                        level,
                        query: &group[j],
                        key: |t: usize, row: &mut [f32]| key(i0, t, row),
                    };
                    let row = GroupRow { view, j };
                    match survivors {
                        Some(positions) => {
                            exact::refine(top, lo, hi, &SurvivorRow { row, positions }, &rescore)
                        }
                        None => exact::refine(top, lo, hi, &row, &rescore),
                    }
                };
                let search = match (survivors, split) {
                    (Some(positions), _) => Search::Among(positions),
                    (None, true) => Search::Parts,
                    (None, false) => Search::Whole,
                };
                select_row(
                    score,
                    lens[j],
                    topk,
                    num_segments,
                    rule,
                    row,
                    search,
                    refine,
                );
            };
            if g == 1 {
                row_of(0, group_out, true);
            } else {
                let lmax = lens.iter().copied().max().unwrap_or(0);
                let min_rows = pool::min_rows(lmax.saturating_mul(8));
                pool::for_each_row_mut(group_out, topk, min_rows, |j, row| row_of(j, row, false));
            }
            if let Some(s) = scores.as_deref_mut() {
                let rows = group_out.chunks(topk);
                for (j, (dst, row)) in s[i0 * topk..i1 * topk]
                    .chunks_mut(topk)
                    .zip(rows)
                    .enumerate()
                {
                    let (pool, len) = (rule.pool, lens[j]);
                    for (x, &t) in dst.iter_mut().zip(row) {
                        *x = match (t >= 0, pool > 1) {
                            (false, _) => f32::NAN,
                            (true, false) => view.get(j, t as usize),
                            (true, true) => {
                                let b = t as usize;
                                let end = ((b + 1) * pool).min(len);
                                exact::block_score(
                                    rule.score,
                                    (b * pool..end).map(|u| view.get(j, u)),
                                )
                            }
                        };
                    }
                }
            }
        },
    );
}

/// One query's row of a group, for the score pool.
struct PooledRow<'a> {
    view: &'a GroupScores<'a>,
    j: usize,
    len: usize,
    level: crate::simd::Isa,
    i0: usize,
    query: &'a Query,
}

/// A row of the score pool: the `len` entries' float32 scores max-pooled
/// into `ceil(len / pool)` blocks ([`exact::pooled`]), the top `topk`
/// blocks selected (forced blocks as [`RowRule`] says) and made exact
/// ([`exact::refine_pooled`]).
fn pooled_row(
    r: &PooledRow<'_>,
    topk: usize,
    rule: RowRule,
    out: &mut [i32],
    key: &(impl Fn(usize, usize, &mut [f32]) -> f32 + Sync),
) {
    let (pool, len) = (rule.pool, r.len);
    let span = |b: usize| b * pool..((b + 1) * pool).min(len);
    let scores = |b: usize| span(b).map(|t| r.view.get(r.j, t));
    let blocks: Vec<f32> = match rule.score {
        // The max pool's loop as it was (no per-block dispatch).
        super::ScoreType::Max => (0..len.div_ceil(pool))
            .map(|b| exact::pooled(scores(b)))
            .collect(),
        score => (0..len.div_ceil(pool))
            .map(|b| exact::block_score(score, scores(b)))
            .collect(),
    };
    let refine = |top: &mut Vec<u64>, lo: usize, hi: usize| {
        let rescore = Rescore {
            level: r.level,
            query: r.query,
            key: |t: usize, row: &mut [f32]| key(r.i0, t, row),
        };
        let row = GroupRow {
            view: r.view,
            j: r.j,
        };
        exact::refine_pooled(top, lo, hi, (pool, rule.score), len, &row, &rescore);
    };
    select_row(
        |b| blocks[b],
        blocks.len(),
        topk,
        0,
        rule,
        out,
        Search::Whole,
        refine,
    );
}

/// Every query's score of every key it sees, `out` `[n, n_keys]`: its
/// group's scores as [`for_each_group`] computes them for the top-k (the
/// same bits), NaN past the keys it sees.
pub(super) fn score_rows<S, L>(
    queries: Queries<'_, S, L>,
    n_keys: usize,
    out: &mut [f32],
    width: usize,
    score: impl Fn(usize, usize, &[Query], &mut [&mut [f32]], Option<KeyTerms<'_>>) + Sync,
) where
    S: Fn(usize, usize) -> bool,
    L: Fn(usize) -> usize,
{
    if n_keys == 0 {
        return;
    }
    type Settle = fn(usize, &[usize], &mut GroupScoresMut<'_>, &[Query]) -> Vec<Option<Vec<usize>>>;
    for_each_group(
        queries,
        width,
        None,
        None::<Settle>,
        score,
        |i0, lens, view, _, _| {
            let rows = out[i0 * n_keys..].chunks_mut(n_keys);
            for (j, (row, &len)) in rows.zip(lens).enumerate() {
                let (seen, unseen) = row.split_at_mut(len);
                view.copy_row(j, seen);
                unseen.fill(f32::NAN);
            }
        },
    );
}

/// Every query's scores, group by group. `score(i0, c, group, outs,
/// terms)` computes chunk `c` (keys `c · width ..`) of the group whose first
/// query is `i0`: query `j`'s scores into `outs[j]`, cut to the keys it sees
/// (possibly empty), and with `settle` (the exact selection's groups) the
/// chunk's keys' bound terms, the AMX `screen` asked for in them; then
/// `settle(i0, lens, scores, group)` may rewrite the group's scores (the
/// screen's second half, [`screen`]) and returns each query's survivors
/// (`None` for a query it did not screen); `finish(i0, lens, view, group,
/// survivors)` gets the scores, `lens[j]` of them for its query `j`, and
/// the survivors (empty without `settle`).
#[allow(clippy::too_many_arguments)]
fn for_each_group<S, L>(
    queries: Queries<'_, S, L>,
    width: usize,
    screen: Option<AmxRun>,
    settle: Option<
        impl Fn(usize, &[usize], &mut GroupScoresMut<'_>, &[Query]) -> Vec<Option<Vec<usize>>>,
    >,
    score: impl Fn(usize, usize, &[Query], &mut [&mut [f32]], Option<KeyTerms<'_>>) + Sync,
    mut finish: impl FnMut(usize, &[usize], &GroupScores<'_>, &[Query], &[Option<Vec<usize>>]),
) where
    S: Fn(usize, usize) -> bool,
    L: Fn(usize) -> usize,
{
    let Queries {
        n,
        h,
        d,
        level,
        magnitude,
        q,
        weights,
        relu,
        same_keys,
        len,
    } = queries;
    if n == 0 {
        return;
    }
    let with_terms = settle.is_some();
    let width = width.max(1);
    let mut group: Vec<Query> = Vec::new();
    let mut buf: Vec<f32> = Vec::new();
    let mut i0 = 0;
    while i0 < n {
        let mut lmax = len(i0);
        let mut i1 = i0 + 1;
        while i1 < n && i1 - i0 < GROUP && same_keys(i0, i1) {
            let l = lmax.max(len(i1));
            if (i1 - i0 + 1).saturating_mul(l) > GROUP_FLOATS {
                break;
            }
            (lmax, i1) = (l, i1 + 1);
        }
        let g = i1 - i0;
        group.resize_with(g, || Query::new(h, d, level));
        for (j, query) in group.iter_mut().enumerate() {
            query.load(q, weights, i0 + j, magnitude);
            // (Magnitudes are of absolute values: either activation is the identity there.)
            query.relu = relu;
        }
        let lens: Vec<usize> = (i0..i1).map(&len).collect();
        let chunks = lmax.div_ceil(width);
        let extra = if with_terms { 2 } else { 0 };
        let size = chunks * (g + extra) * width;
        if buf.len() < size {
            buf.resize(size, 0.0); // every slot read below is written first
        }
        let min_chunks = pool::min_rows(chunk_work(width, g, h, d));
        let region_len = (g + extra) * width;
        pool::for_each_row_mut(&mut buf[..size], region_len, min_chunks, |c, region| {
            let (scores, rest) = region.split_at_mut(g * width);
            let mut outs: Vec<&mut [f32]> = scores
                .chunks_mut(width)
                .zip(&lens)
                .map(|(o, &l)| &mut o[..l.saturating_sub(c * width).min(width)])
                .collect();
            let terms = with_terms.then(|| {
                let (g, c) = rest.split_at_mut(width);
                KeyTerms { g, c, screen }
            });
            score(i0, c, &group, &mut outs, terms);
        });
        let mut among = Vec::new();
        if let Some(settle) = settle.as_ref().filter(|_| screen.is_some()) {
            let mut scores = GroupScoresMut {
                buf: &mut buf[..size],
                g,
                extra,
                width,
            };
            among = settle(i0, &lens, &mut scores, &group);
        }
        let view = GroupScores {
            buf: &buf[..size],
            g,
            extra,
            width,
        };
        finish(i0, &lens, &view, &group, &among);
        i0 = i1;
    }
}

#[cfg(test)]
mod tests {
    use super::super::select::candidate;
    use super::*;
    use exact::RowScores;

    /// A screened row seen through its survivors visits exactly them (those
    /// below the row's length), each with its own score and terms, in
    /// maximal runs of consecutive positions — across the group's chunk
    /// boundaries too.
    #[test]
    fn a_row_among_its_survivors_visits_them_in_maximal_runs() {
        let (g, width, len) = (2usize, 8usize, 30usize);
        let chunks = len.div_ceil(width);
        // Query `j`'s score of key `t` is `1000 j + t`, its terms `-t`, `-2t`.
        let mut buf = vec![f32::NAN; chunks * (g + 2) * width];
        for t in 0..len {
            for j in 0..g {
                buf[at(g + 2, width, j, t)] = (1000 * j + t) as f32;
            }
            buf[at(g + 2, width, g, t)] = -(t as f32);
            buf[at(g + 2, width, g + 1, t)] = -2.0 * t as f32;
        }
        let view = GroupScores {
            buf: &buf,
            g,
            extra: 2,
            width,
        };
        let positions = [0, 1, 2, 7, 8, 9, 15, 16, 23, 29, 31, 32];
        let among = SurvivorRow {
            row: GroupRow { view: &view, j: 1 },
            positions: &positions,
        };
        let mut seen = Vec::new();
        among.runs(len, &mut |t0, s, gs, cs| {
            assert!(s.len() == gs.len() && s.len() == cs.len());
            for (r, ((&s, &gt), &ct)) in s.iter().zip(gs).zip(cs).enumerate() {
                let t = t0 + r;
                assert_eq!(
                    (s, gt, ct),
                    ((1000 + t) as f32, -(t as f32), -2.0 * t as f32)
                );
            }
            seen.push((t0, s.len()));
        });
        assert_eq!(seen, [(0, 3), (7, 3), (15, 2), (23, 1), (29, 1)]);
        assert_eq!(among.score(16), 1016.0);
        assert_eq!(among.terms(9), (-9.0, -18.0));
    }

    /// [`exact::refine`] through a row's survivors makes of it what it makes
    /// of the whole row when a selected position's bound is not finite (its
    /// interval the whole line, so every unselected position reaches it and
    /// the whole row's band holds them all): the real top-k, listed in
    /// float32 order. The float32 scores here are off their real values
    /// within their bounds, so the float32 top-k is not the real one and
    /// the band decides; the position with the infinite bound is one the
    /// real top-k leaves out; the ruled-out positions score below every
    /// survivor. (Shown to fail with the runs skipping the survivor after
    /// each run, and with a selected position whose lower end is not finite
    /// kept out of the band.)
    #[test]
    fn refine_among_survivors_equals_the_whole_row_with_a_non_finite_selected_bound() {
        let (g, width, len, take) = (1usize, 8usize, 60usize, 6usize);
        let mut next = {
            let mut x = 0x9E37_79B9_7F4A_7C15u64;
            move || {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 40) as f32 / (1u64 << 24) as f32
            }
        };
        // One head, d = 1, q = w = 1, no ReLU: a position's real score is
        // its key. Survivors (every third position) 100 + u, the others
        // 10 u; the survivors' float32 scores off by up to ±0.5, covered by
        // their bounds (g = 4·10⁶: E ≈ 1), so several swap places.
        let survivors: Vec<usize> = (0..len).step_by(3).collect();
        let keys: Vec<f32> = (0..len)
            .map(|t| match t % 3 {
                0 => 100.0 + next(),
                _ => 10.0 * next(),
            })
            .collect();
        let mut buf = vec![f32::NAN; len.div_ceil(width) * (g + 2) * width];
        for t in 0..len {
            let (s, gt) = match t % 3 {
                0 => (keys[t] + (next() - 0.5), 4.0e6),
                _ => (keys[t], keys[t].abs()),
            };
            buf[at(g + 2, width, 0, t)] = s;
            buf[at(g + 2, width, g, t)] = gt;
            buf[at(g + 2, width, g + 1, t)] = 1.0;
        }
        // The float32 top-k, and the real one listed by float32 score.
        let scored = |t: usize| candidate(buf[at(g + 2, width, 0, t)], t);
        let mut top0: Vec<u64> = (0..len).map(scored).collect();
        top0.sort_unstable_by(|a, b| b.cmp(a));
        top0.truncate(take);
        let mut real: Vec<usize> = (0..len).collect();
        real.sort_by(|&a, &b| keys[b].total_cmp(&keys[a]));
        let mut want: Vec<u64> = real[..take].iter().map(|&t| scored(t)).collect();
        want.sort_unstable_by(|a, b| b.cmp(a));
        // A selected position the real top-k leaves out gets a bound that
        // is not finite: it must leave through the band.
        let leave: Vec<&u64> = top0.iter().filter(|c| !want.contains(c)).collect();
        assert!(
            leave.len() >= 2,
            "{} float32 selections are not real ones",
            leave.len()
        );
        let out = (u32::MAX - *leave[0] as u32) as usize;
        buf[at(g + 2, width, g, out)] = f32::INFINITY;
        let view = GroupScores {
            buf: &buf,
            g,
            extra: 2,
            width,
        };
        let row = GroupRow { view: &view, j: 0 };
        for isa in crate::simd::isas_for_test() {
            let mut query = Query::new(1, 1, isa);
            query.relu = false;
            query.qt[0] = 1.0;
            query.w[0] = 1.0;
            let rescore = Rescore {
                level: isa,
                query: &query,
                key: |t: usize, r: &mut [f32]| {
                    r[0] = keys[t];
                    1.0
                },
            };
            let mut whole = top0.clone();
            exact::refine(&mut whole, 0, len, &row, &rescore);
            let mut among = top0.clone();
            let (row, positions) = (GroupRow { view: &view, j: 0 }, &survivors);
            exact::refine(
                &mut among,
                0,
                len,
                &SurvivorRow { row, positions },
                &rescore,
            );
            let name = isa.level().name();
            assert_eq!(whole, want, "{name}: the whole row");
            assert_eq!(among, want, "{name}: among the survivors");
        }
    }
}
