//! How a call's queries are scored and selected.
//!
//! Consecutive queries that read the same keys (a prefill's queries, one
//! sequence's) form a **group** of at most [`GROUP`]. A group's keys are cut
//! into chunks that go across the pool; within a chunk every block of keys is
//! read, decoded and transposed once for the whole group
//! ([`super::kernels::score_keys`]), so a prefill reads its keys once per group, not
//! once per query. Then each query's row is selected from its scores, the
//! group's rows in parallel; a lone long row (a decode) is selected in
//! parallel parts instead.
//!
//! The only buffers are one group's scores — at most [`GROUP`] queries × the
//! keys they see (rounded up to whole chunks), kept near [`GROUP_FLOATS`] —
//! and the candidates of the rows being selected: never
//! `[queries, positions]`.

use super::kernels::Query;
use super::select::select_row;
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
/// floats at `(c · g + j) · width`, so one chunk of the whole group is one
/// contiguous run (one parallel task).
struct GroupScores<'a> {
    buf: &'a [f32],
    g: usize,
    width: usize,
}

impl GroupScores<'_> {
    #[inline]
    fn get(&self, j: usize, t: usize) -> f32 {
        self.buf[((t / self.width) * self.g + j) * self.width + t % self.width]
    }
}

/// The query side of a call: `n` queries of `h` heads of `d`, their
/// weights `[n, h]`, and what each sees.
pub(super) struct Queries<'a, S, L> {
    pub n: usize,
    pub h: usize,
    pub d: usize,
    /// The SIMD level the queries are scored at (their tiles' layout).
    pub level: Option<crate::simd::Wide>,
    pub q: &'a Encoded<'a>,
    pub weights: &'a [f32],
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
    pub out: &'a mut [i32],
    pub scores: Option<&'a mut [f32]>,
}

/// Every query's row. `score(i0, c, group, outs)` computes chunk `c`
/// (keys `c · width ..`) of the group whose first query is `i0`: query
/// `j`'s scores into `outs[j]`, cut to the keys it sees (possibly empty).
pub(super) fn for_each_group<S, L>(
    queries: Queries<'_, S, L>,
    rows: Rows<'_>,
    width: usize,
    score: impl Fn(usize, usize, &[Query], &mut [&mut [f32]]) + Sync,
) where
    S: Fn(usize, usize) -> bool,
    L: Fn(usize) -> usize,
{
    let Queries {
        n,
        h,
        d,
        level,
        q,
        weights,
        same_keys,
        len,
    } = queries;
    let Rows {
        topk,
        num_segments,
        out,
        mut scores,
    } = rows;
    if n == 0 || topk == 0 {
        return;
    }
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
            query.load(q, weights, i0 + j, false);
        }
        let lens: Vec<usize> = (i0..i1).map(&len).collect();
        let chunks = lmax.div_ceil(width);
        let size = chunks * g * width;
        if buf.len() < size {
            buf.resize(size, 0.0); // every slot read below is written first
        }
        let min_chunks = pool::min_rows(chunk_work(width, g, h, d));
        pool::for_each_row_mut(&mut buf[..size], g * width, min_chunks, |c, region| {
            let mut outs: Vec<&mut [f32]> = region
                .chunks_mut(width)
                .zip(&lens)
                .map(|(o, &l)| &mut o[..l.saturating_sub(c * width).min(width)])
                .collect();
            score(i0, c, &group, &mut outs);
        });
        let view = GroupScores {
            buf: &buf[..size],
            g,
            width,
        };
        let group_out = &mut out[i0 * topk..i1 * topk];
        if g == 1 {
            select_row(
                |t| view.get(0, t),
                lens[0],
                topk,
                num_segments,
                group_out,
                true,
            );
        } else {
            let min_rows = pool::min_rows(lmax.saturating_mul(8));
            pool::for_each_row_mut(group_out, topk, min_rows, |j, row| {
                select_row(|t| view.get(j, t), lens[j], topk, num_segments, row, false);
            });
        }
        if let Some(s) = scores.as_deref_mut() {
            let rows = group_out.chunks(topk);
            for (j, (dst, row)) in s[i0 * topk..i1 * topk]
                .chunks_mut(topk)
                .zip(rows)
                .enumerate()
            {
                for (x, &t) in dst.iter_mut().zip(row) {
                    *x = if t >= 0 {
                        view.get(j, t as usize)
                    } else {
                        f32::NAN
                    };
                }
            }
        }
        i0 = i1;
    }
}
