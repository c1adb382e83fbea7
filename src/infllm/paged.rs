//! Stage 1 at decode over an engine's paged cache of compressed keys, the
//! pages read in place: [`group_sums`], shared by InfLLM-v2's paged
//! selection ([`super::select_paged_into`]) and NSA's
//! (`crate::nsa::select_paged_into`, whose stage 1 is InfLLM-v2's); and
//! its dense twin [`dense_group_sums`], InfLLM-v2's dense call at decode
//! (a few queries, `api::in_place`) on its keys laid out densely, read
//! where they lie rather than decoded and packed.
//!
//! # The rule
//!
//! Sequence `s`'s compressed keys lie in pages of `page` rows, key `j` in
//! row `j % page` of page `table[s, j / page]` (`table.seq_lens` here: each
//! sequence's compressed-key count), a row every KV head's key (`n_kv · d`
//! elements; [`PagedCache`]'s layouts: one format, or fp8 bytes then one
//! float32 scale a key). [`group_sums`] gives, for one (sequence, KV head)
//! and one decoding query, the group sums `S_j` of keys `0..n_vis` that
//! [`super::score::group_sums`] gives on the same keys laid out densely
//! (float32, fp8 keys each times its scale, as the dense calls'
//! `ck_scale`).
//!
//! # Why the bits are the dense call's
//!
//! The row runs the stage-1 kernels' staged form ([`Staged`], one query:
//! any group size) a page at a time: the keys of a page are handed to it in
//! place (float32 and bfloat16 pages as their own elements, which is what
//! the dense calls read), or, for the other formats, the row's KV head's
//! `d` elements decoded (elementwise, exact) and, with scales, each
//! multiplied by its key's scale (one float32 product, as the dense calls'
//! `ck_scale`). Keys arrive in order with their indices, so every logit,
//! maximum and lane sum is the dense kernels' (`super::heads`, "why the
//! bits are `score::group_sums`'s"); then the same softmax and group sum
//! ([`Staged::finish`]).
//!
//! [`dense_group_sums`] is the same argument on dense keys: unscaled
//! float32 and bfloat16 keys go to the one-pass kernel
//! ([`super::heads::group_sums`], the same bits as the packed form by its
//! own argument), the other formats are decoded and scaled as a page is
//! here, [`DENSE_STEP`] keys at a time, into the staged kernel.
//!
//! [`dense_group_sums_queries`] (a decode of several queries: speculative or
//! multi-token steps) walks the keys once, [`DENSE_STEP`] at a time, and
//! hands each step to every query's staged chunks (float32 and bfloat16 in
//! place, other formats decoded and scaled once for all the queries): each
//! chunk still receives every key it sees once, in order, under its own
//! index, so each query's logits, maxima and softmax lanes are those of the
//! query alone (the staged kernel's argument), whichever chunk, step or
//! query order scores them. The queries' heads share a chunk's lanes only
//! when every vector's lanes see one key count (the kernels keep one count
//! a vector); otherwise each run of queries that see the same keys gets its
//! own chunks. Each query's sums are finished by its own chunks, in order.
//!
//! What would break it: a key handed to the kernels under another index
//! (its softmax lane moves), a scale applied after the dot rather than to
//! the key, a page read past the sequence's keys (a stale row of a reused
//! page would enter the softmax), a key past a query's own count entering
//! its softmax (queries of one call see different counts), or a step handed
//! to a chunk twice. The differential tests of both callers
//! (`src/infllm/tests.rs`, `src/nsa/paged.rs`, `tests/python`) check their
//! rows bit for bit against the dense calls at every SIMD level, and
//! `dense_in_place_equals_packed_at_every_level` the dense call's two
//! paths against each other.
//!
//! # Speed
//!
//! Nothing is gathered: the fp8 / float16 / misaligned rows of one KV head
//! are decoded a page at a time into a small buffer, and the next page's
//! keys are asked into the second-level cache while a page is scored. The
//! several-query dense walk reads each key from memory once for the call's
//! queries (a step of 96 keys, 48 KiB of float32 at `d = 128`, stays in the
//! second-level cache while every chunk scores it; the next step's rows are
//! asked in meanwhile), where the one-query form read them once a query.

use super::heads::{one_count_a_vector, Rows, Staged};
use crate::keys::{BlockTable, Encoded, PageLayout, PagedCache};
use crate::simd::lines::Floats;
use crate::simd::Isa;

/// A thread's stage-1 scratch, reused across the rows and calls it
/// computes.
#[derive(Default)]
struct Scratch {
    /// The chunks' logits buffers ([`Staged::chunks`]).
    bufs: Vec<Floats>,
    sums: Vec<f32>,
    /// A page's keys of one KV head, decoded (fp8, float16, misaligned).
    keys: Vec<f32>,
    /// A misaligned page's rows, decoded whole.
    rows: Vec<f32>,
    scales: Vec<f32>,
}

impl Scratch {
    /// Finishes the row's chunks into `sums` (`n_vis` keys' group sums)
    /// and keeps their logits buffers for the next row, unless they have
    /// grown past [`KEEP`].
    fn finish(&mut self, chunks: Vec<Staged>, n_vis: usize) {
        self.sums.resize(n_vis, 0.0);
        for mut c in chunks {
            c.finish(&mut self.sums);
            c.into_bufs(&mut self.bufs);
        }
        if self.bufs.iter().map(|b| b.capacity()).sum::<usize>() > KEEP {
            self.bufs.clear();
        }
    }
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::default();
}

/// The most logits floats a thread keeps between calls (64 MiB).
const KEEP: usize = 1 << 24;

/// One (sequence, KV head) row of a paged decode: the group's `heads`
/// query rows of `d` at `q[q0..]`, sequence `s`'s keys of KV head `g`.
pub(crate) struct Row {
    pub s: usize,
    pub g: usize,
    pub q0: usize,
    pub heads: usize,
    pub d: usize,
}

/// The group sums of keys `0..n_vis` of `row` (see the module docs) handed
/// to `f` (`&[]` when `n_vis` is 0). `table.seq_lens` holds each
/// sequence's compressed-key count (at least `n_vis` for `row.s`), the
/// table and cache already checked ([`crate::keys::paged::check_compressed_decode`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn group_sums<R>(
    isa: Isa,
    q: &[f32],
    cache: &PagedCache<'_>,
    table: &BlockTable<'_>,
    row: Row,
    n_vis: usize,
    scale: f32,
    f: impl FnOnce(&[f32]) -> R,
) -> R {
    let Row { s, g, q0, heads, d } = row;
    let page = cache.block_size;
    SCRATCH.with_borrow_mut(|sc| {
        sc.sums.clear();
        if n_vis > 0 {
            let mut chunks = Staged::chunks(isa, q, &[q0], heads, d, &[n_vis], scale, &mut sc.bufs);
            for j0 in (0..n_vis).step_by(page) {
                let count = page.min(n_vis - j0);
                #[cfg(target_arch = "x86_64")]
                if j0 + page < n_vis {
                    let next = table.page(s, (j0 + page) / page);
                    ask_ahead(cache, next, g, d, page.min(n_vis - j0 - page));
                }
                let pg = table.page(s, j0 / page);
                score_page(cache, pg, g, d, (j0, count), &mut chunks, sc);
            }
            sc.finish(chunks, n_vis);
        }
        f(&sc.sums)
    })
}

/// Scores keys `j0 .. j0 + count` (rows `0 .. count` of page `page`) of KV
/// head `g` into every chunk: in place when the page holds float32 or
/// bfloat16 elements, else that head's elements decoded into `sc.keys`
/// (each times its key's scale for the scaled layout).
fn score_page(
    cache: &PagedCache<'_>,
    page: usize,
    g: usize,
    d: usize,
    (j0, count): (usize, usize),
    chunks: &mut [Staged],
    sc: &mut Scratch,
) {
    let row = cache.d;
    let base = g * d;
    match (cache.layout, cache.page_keys(page)) {
        (PageLayout::Dense(_), Some(Encoded::F32(v))) => {
            let keys = Rows {
                ck: v,
                base,
                stride: row,
            };
            chunks
                .iter_mut()
                .for_each(|c| c.score(keys, j0, count, &[]));
        }
        (PageLayout::Dense(_), Some(Encoded::Bf16(v))) => {
            let keys = Rows {
                ck: v,
                base,
                stride: row,
            };
            chunks
                .iter_mut()
                .for_each(|c| c.score(keys, j0, count, &[]));
        }
        (_, enc) => {
            let Scratch {
                keys, rows, scales, ..
            } = sc;
            keys.clear();
            keys.resize(count * d, 0.0);
            match enc {
                // The head's `d` elements of each row, decoded in place.
                Some(e) => decode_head(e, base, row, d, keys),
                // A misaligned page: its rows decoded whole, the head's part kept.
                None => {
                    rows.clear();
                    rows.resize(count * row, 0.0);
                    scales.resize(count.max(1), 0.0);
                    cache.decode(page, 0, rows, scales);
                    for (k, r) in keys.chunks_exact_mut(d).zip(rows.chunks_exact(row)) {
                        k.copy_from_slice(&r[base..base + d]);
                    }
                }
            }
            if cache.layout == PageLayout::Fp8WithScales {
                scales.clear();
                scales.resize(count, 0.0);
                cache.scales(page, 0, scales);
                times_scales(keys, d, scales);
            }
            let keys = Rows {
                ck: &keys[..],
                base: 0,
                stride: d,
            };
            chunks
                .iter_mut()
                .for_each(|c| c.score(keys, j0, count, &[]));
        }
    }
}

/// Rows `0 .. keys.len() / d` of `e` (row `r`'s KV head at `base + r ·
/// row`) decoded into `keys`, `d` elements a row (elementwise, exact).
fn decode_head(e: Encoded<'_>, base: usize, row: usize, d: usize, keys: &mut [f32]) {
    for (r, k) in keys.chunks_exact_mut(d).enumerate() {
        e.decode(r * row + base, k);
    }
}

/// Each decoded key (`d` elements) times its scale: one float32 product an
/// element, the dense calls' `ck_scale` product.
fn times_scales(keys: &mut [f32], d: usize, scales: &[f32]) {
    for (k, &m) in keys.chunks_exact_mut(d).zip(scales) {
        k.iter_mut().for_each(|x| *x *= m);
    }
}

/// One sequence's compressed keys laid out densely (`[n_c, n_kv, d]`, `row
/// = n_kv · d` elements a key, in any format), optionally each key times
/// its scale (`ck_scale`): the dense calls' keys.
#[derive(Clone, Copy)]
pub(crate) struct Dense<'a> {
    pub ck: Encoded<'a>,
    pub scales: Option<&'a [f32]>,
    pub row: usize,
}

/// Keys a step of [`dense_group_sums`]'s decoded path: a multiple of every
/// staged tile (12, 6, 3, 2 keys at AVX2; 16 and 8 at AVX-512), 48 KiB of
/// float32 keys at `d = 128`.
const DENSE_STEP: usize = 96;

/// [`group_sums`] on keys laid out densely ([`Dense`]; `row.s` unused):
/// the group sums of keys `0..n_vis` of KV head `row.g` handed to `f`,
/// the bits of [`super::score::group_sums`] on the same keys decoded and
/// packed (the dense calls' path for many queries). Unscaled float32 and
/// bfloat16 keys are scored where they lie by the one-pass kernel
/// ([`super::heads::group_sums`], its tiles asking the next rows into
/// cache); other formats, or scaled keys, are decoded [`DENSE_STEP`] keys
/// of the head at a time into a small buffer (times their scales) and
/// scored by the staged kernel, as a page is in [`group_sums`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn dense_group_sums<R>(
    isa: Isa,
    q: &[f32],
    keys: Dense<'_>,
    row: Row,
    n_vis: usize,
    scale: f32,
    f: impl FnOnce(&[f32]) -> R,
) -> R {
    let Row {
        g, q0, heads, d, ..
    } = row;
    let (base, stride) = (g * d, keys.row);
    match (keys.ck, keys.scales) {
        (Encoded::F32(ck), None) => ONE_PASS.with_borrow_mut(|sc| {
            let rows = Rows { ck, base, stride };
            super::heads::group_sums(isa, q, &[q0], heads, d, rows, &[n_vis], scale, sc, &[]);
            let r = f(&sc.sums);
            trim(sc);
            r
        }),
        (Encoded::Bf16(ck), None) => ONE_PASS.with_borrow_mut(|sc| {
            let rows = Rows { ck, base, stride };
            super::heads::group_sums(isa, q, &[q0], heads, d, rows, &[n_vis], scale, sc, &[]);
            let r = f(&sc.sums);
            trim(sc);
            r
        }),
        (e, scales) => SCRATCH.with_borrow_mut(|sc| {
            sc.sums.clear();
            if n_vis > 0 {
                let mut chunks =
                    Staged::chunks(isa, q, &[q0], heads, d, &[n_vis], scale, &mut sc.bufs);
                for j0 in (0..n_vis).step_by(DENSE_STEP) {
                    let count = DENSE_STEP.min(n_vis - j0);
                    sc.keys.clear();
                    sc.keys.resize(count * d, 0.0);
                    decode_head(e, j0 * stride + base, stride, d, &mut sc.keys);
                    if let Some(s) = scales {
                        times_scales(&mut sc.keys, d, &s[j0..j0 + count]);
                    }
                    let rows = Rows {
                        ck: &sc.keys[..],
                        base: 0,
                        stride: d,
                    };
                    chunks
                        .iter_mut()
                        .for_each(|c| c.score(rows, j0, count, &[]));
                }
                sc.finish(chunks, n_vis);
            }
            f(&sc.sums)
        }),
    }
}

/// [`dense_group_sums`] for several queries of one KV head at once (a
/// decode's 2 to 16: speculative or multi-token decoding), each key read
/// from memory once for all of them: query `s`'s `heads` rows of `d` start
/// at `q[q0s[s]..]`, it sees keys `0..n_vis[s]` of KV head `g`, and its
/// group sums go to `out[s · width..][..n_vis[s]]` (`width` at least every
/// `n_vis`; the rest of the row untouched), the bits of
/// [`super::score::group_sums`] on that query alone.
///
/// The keys are walked [`DENSE_STEP`] at a time (48 KiB of float32 at `d =
/// 128`, in the second-level cache while every query scores them; the next
/// step's rows asked in meanwhile), each step handed to every query's
/// staged chunks: float32 and bfloat16 rows in place, other formats or
/// scaled keys decoded (times their scales) once for all the queries. The
/// queries' heads share the chunks' lanes (two queries of 16 heads in one
/// chunk, four of 8, sixteen of 2) when every vector's lanes see one key
/// count ([`one_count_a_vector`]: always for a group a multiple of 8);
/// else each run of queries that see the same keys has its own chunks.
#[allow(clippy::too_many_arguments)]
pub(crate) fn dense_group_sums_queries(
    isa: Isa,
    q: &[f32],
    keys: Dense<'_>,
    g: usize,
    q0s: &[usize],
    heads: usize,
    d: usize,
    n_vis: &[usize],
    scale: f32,
    out: &mut [f32],
    width: usize,
) {
    assert_eq!(q0s.len(), n_vis.len(), "a key count a query");
    let n_max = n_vis.iter().copied().max().unwrap_or(0);
    assert!(
        n_max <= width && out.len() >= q0s.len() * width,
        "the sums of every query"
    );
    if n_max == 0 || heads == 0 {
        return;
    }
    let (base, stride) = (g * d, keys.row);
    SCRATCH.with_borrow_mut(|sc| {
        // Each chunk set's first query and query count, and its chunks.
        let mut sets: Vec<(usize, usize, Vec<Staged>)> = Vec::new();
        if one_count_a_vector(heads, n_vis) {
            let chunks = Staged::chunks(isa, q, q0s, heads, d, n_vis, scale, &mut sc.bufs);
            sets.push((0, q0s.len(), chunks));
        } else {
            // Runs of queries that see the same keys (a decode's queries
            // see at most two counts), a chunk set a run.
            let mut s0 = 0;
            while s0 < n_vis.len() {
                let n = n_vis[s0..].iter().take_while(|&&n| n == n_vis[s0]).count();
                if n_vis[s0] > 0 {
                    let (qs, seen) = (&q0s[s0..s0 + n], &n_vis[s0..s0 + n]);
                    let chunks = Staged::chunks(isa, q, qs, heads, d, seen, scale, &mut sc.bufs);
                    sets.push((s0, n, chunks));
                }
                s0 += n;
            }
        }
        for j0 in (0..n_max).step_by(DENSE_STEP) {
            let count = DENSE_STEP.min(n_max - j0);
            #[cfg(target_arch = "x86_64")]
            if j0 + count < n_max {
                let next = (j0 + count, DENSE_STEP.min(n_max - j0 - count));
                ask_dense_ahead(keys, base, d, next);
            }
            let at = j0 * stride + base;
            match (keys.ck, keys.scales) {
                (Encoded::F32(ck), None) => score_sets(
                    &mut sets,
                    Rows {
                        ck,
                        base: at,
                        stride,
                    },
                    j0,
                    count,
                ),
                (Encoded::Bf16(ck), None) => score_sets(
                    &mut sets,
                    Rows {
                        ck,
                        base: at,
                        stride,
                    },
                    j0,
                    count,
                ),
                (e, scales) => {
                    sc.keys.clear();
                    sc.keys.resize(count * d, 0.0);
                    decode_head(e, at, stride, d, &mut sc.keys);
                    if let Some(s) = scales {
                        times_scales(&mut sc.keys, d, &s[j0..j0 + count]);
                    }
                    let rows = Rows {
                        ck: &sc.keys[..],
                        base: 0,
                        stride: d,
                    };
                    score_sets(&mut sets, rows, j0, count);
                }
            }
        }
        for (s0, n, chunks) in sets {
            let seen = &n_vis[s0..s0 + n];
            let m = seen.iter().copied().max().unwrap_or(0);
            sc.sums.clear();
            sc.finish(chunks, n * m);
            for (t, &k) in seen.iter().enumerate() {
                out[(s0 + t) * width..][..k].copy_from_slice(&sc.sums[t * m..][..k]);
            }
        }
    });
}

/// Keys `j0..j0 + count` (key `j0 + k`'s row at `rows.base + k ·
/// rows.stride`) into every chunk of every set, in order.
fn score_sets<E: super::heads::Elem>(
    sets: &mut [(usize, usize, Vec<Staged>)],
    rows: Rows<'_, E>,
    j0: usize,
    count: usize,
) {
    for (_, _, chunks) in sets.iter_mut() {
        chunks
            .iter_mut()
            .for_each(|c| c.score(rows, j0, count, &[]));
    }
}

/// KV head elements `base..base + d` of dense keys `j .. j + count` (and
/// their scales) asked into the second-level cache: the next step's keys,
/// fetched while this step's are scored. No effect on results.
#[cfg(target_arch = "x86_64")]
fn ask_dense_ahead(keys: Dense<'_>, base: usize, d: usize, (j, count): (usize, usize)) {
    use crate::keys::{prefetch, CacheLevel};
    let (bytes, elem): (&[u8], usize) = match keys.ck {
        Encoded::F32(v) => (bytemuck::cast_slice(v), 4),
        Encoded::F16(v) | Encoded::Bf16(v) => (bytemuck::cast_slice(v), 2),
        Encoded::Fp8E4m3(v) => (v, 1),
    };
    for r in j..j + count {
        let from = (r * keys.row + base) * elem;
        prefetch(bytes, from, from + d * elem, CacheLevel::L2);
    }
    if let Some(s) = keys.scales {
        let s: &[u8] = bytemuck::cast_slice(s);
        prefetch(s, 4 * j, 4 * (j + count), CacheLevel::L2);
    }
}

thread_local! {
    /// [`dense_group_sums`]'s one-pass scratch, reused across rows and calls.
    static ONE_PASS: std::cell::RefCell<super::score::Scratch> = std::cell::RefCell::default();
}

/// Frees a one-pass scratch whose logits outgrew [`KEEP`].
fn trim(sc: &mut super::score::Scratch) {
    if sc.logits.capacity() > KEEP {
        *sc = super::score::Scratch::default();
    }
}

/// KV head `g`'s elements of rows `0 .. count` of page `page` (and their
/// scales) asked into the second-level cache: the next page's keys, fetched
/// while this page's are scored (the hardware prefetcher loses the stream at
/// every page, and a head's share of a row is a strided read). No effect on
/// results.
#[cfg(target_arch = "x86_64")]
fn ask_ahead(cache: &PagedCache<'_>, page: usize, g: usize, d: usize, count: usize) {
    use crate::keys::{prefetch, CacheLevel};
    let elem = cache.layout.key_format().size();
    let (row, at) = (cache.d * elem, page * cache.page_stride);
    for r in 0..count {
        let from = at + r * row + g * d * elem;
        prefetch(cache.bytes, from, from + d * elem, CacheLevel::L2);
    }
    if cache.layout == PageLayout::Fp8WithScales {
        let sc = at + cache.block_size * row;
        prefetch(cache.bytes, sc, sc + 4 * count, CacheLevel::L2);
    }
}
