//! The attention pass: splits a call into (query block, KV head) tasks on
//! the crate's pool, gathers each row's keys, and runs the kernels over row
//! groups (see the module docs of [`crate::attention`] for the rule and the
//! numbers).

use super::kernels::{self, ValueRows};
use super::shape::check_pass;
use super::AttentionShape;
use crate::error::{check_len, checked_size, ArgumentError};
use crate::pool;
use crate::simd::{self, Isa};

/// Rows scored together against each key tile while it is in L1.
const ROW_GROUP: usize = 16;
/// Keys per value-accumulation chunk (their value rows stay in cache while
/// every micro-tile of a row group uses them).
const KEY_CHUNK: usize = 64;
/// Queries per sparse task (per KV head).
const SPARSE_BLOCK: usize = 8;

/// What every row of a call shares.
struct Ctx<'a> {
    /// The best level every kernel runs at.
    isa: Isa,
    /// Whether value rows are prefetched a chunk ahead: a sparse row's are
    /// scattered; the dense pass's are the same runs for every row group,
    /// in cache after the first (and a burst of prefetches for lines
    /// already there stalls on the fill buffers: ~8% of a dense pass).
    prefetch: bool,
    q: &'a [f32],
    n_q_heads: usize,
    /// Query heads per KV head.
    g: usize,
    d_k: usize,
    d_v: usize,
    scale: f32,
}

impl<'a> Ctx<'a> {
    fn new(q: &'a [f32], shape: &AttentionShape, scale: f32, prefetch: bool) -> Self {
        Ctx {
            isa: simd::Isa::best(),
            prefetch,
            q,
            n_q_heads: shape.n_q_heads,
            g: shape.group(),
            d_k: shape.d_k,
            d_v: shape.d_v,
            scale,
        }
    }
}

/// A row group's working buffers.
#[derive(Default)]
struct GroupBufs {
    /// Scores, then probabilities: `[rows, stride]`.
    s: Vec<f32>,
    /// Output accumulators: `[rows, d_v]`.
    o: Vec<f32>,
    /// Per row: `(m, l)`.
    ml: Vec<(f32, f32)>,
}

/// A worker's reusable buffers.
#[derive(Default)]
struct Scratch {
    /// A sparse row's keys, packed (see [`kernels::pack_keys`]).
    kt: Vec<f32>,
    /// A sparse row's key list.
    list: Vec<usize>,
    /// Offsets of its value rows in `v`.
    voff: Vec<usize>,
    group: RowGroup,
}

/// A row group: offsets of its query rows in `q`, keys each sees, and its
/// working buffers.
#[derive(Default)]
struct RowGroup {
    q_offs: Vec<usize>,
    n_vis: Vec<usize>,
    bufs: GroupBufs,
}

/// One unit of parallel work: queries `q0..q0 + outs.len()`, KV head `h`.
struct Task<'a> {
    q0: usize,
    h: usize,
    /// Per query: its `[group, d_v]` output rows for this KV head.
    outs: Vec<&'a mut [f32]>,
    /// Per query: its `[group]` log-sum-exps.
    lses: Vec<&'a mut [f32]>,
}

/// Splits `out` and `lse` into disjoint per-(query block, KV head) tasks.
fn make_tasks<'a>(
    out: &'a mut [f32],
    lse: &'a mut [f32],
    shape: &AttentionShape,
    block: usize,
) -> Vec<Task<'a>> {
    let (nq, n_kv, g) = (shape.n_queries, shape.n_kv_heads, shape.group());
    let mut cells = Vec::with_capacity(nq * n_kv);
    let (mut out_rest, mut lse_rest) = (out, lse);
    for _ in 0..nq * n_kv {
        let (o, r1) = std::mem::take(&mut out_rest).split_at_mut(g * shape.d_v);
        let (l, r2) = std::mem::take(&mut lse_rest).split_at_mut(g);
        out_rest = r1;
        lse_rest = r2;
        cells.push(Some((o, l)));
    }
    let mut tasks = Vec::with_capacity(nq.div_ceil(block) * n_kv);
    for q0 in (0..nq).step_by(block) {
        let q1 = (q0 + block).min(nq);
        for h in 0..n_kv {
            let (mut outs, mut lses) = (Vec::with_capacity(q1 - q0), Vec::with_capacity(q1 - q0));
            for i in q0..q1 {
                if let Some((o, l)) = cells[i * n_kv + h].take() {
                    outs.push(o);
                    lses.push(l);
                }
            }
            tasks.push(Task { q0, h, outs, lses });
        }
    }
    tasks
}

/// Runs every task on the crate's pool; sums what they return.
fn run_tasks<F>(tasks: &mut [Task<'_>], f: F) -> usize
where
    F: Fn(&mut Scratch, &mut Task<'_>) -> usize + Sync + Send,
{
    if tasks.len() < 2 {
        let mut sc = Scratch::default();
        return tasks.iter_mut().map(|t| f(&mut sc, t)).sum();
    }
    pool::install(|parallel| {
        if parallel {
            use rayon::prelude::*;
            tasks
                .par_iter_mut()
                .map_init(Scratch::default, |sc, t| f(sc, t))
                .sum()
        } else {
            let mut sc = Scratch::default();
            tasks.iter_mut().map(|t| f(&mut sc, t)).sum()
        }
    })
}

/// Attends the rows of one group (at most [`ROW_GROUP`]): row `r` has its
/// query at `q_offs[r]` and sees the first `n_vis[r]` keys of a key list
/// whose keys are packed in `kt` and whose value rows are `vals`.
/// Leaves unnormalised outputs in `bufs.o` and `(m, l)` in `bufs.ml`.
fn attend_group(
    ctx: &Ctx<'_>,
    kt: &[f32],
    vals: ValueRows<'_>,
    q_offs: &[usize],
    n_vis: &[usize],
    bufs: &mut GroupBufs,
) {
    let rows = q_offs.len();
    let (d_k, d_v) = (ctx.d_k, ctx.d_v);
    let n_max = n_vis.iter().copied().max().unwrap_or(0);
    let stride = n_max.next_multiple_of(kernels::KEY_TILE);
    debug_assert!(kt.len() >= stride * d_k && vals.len() >= n_max);
    if bufs.s.len() < rows * stride {
        bufs.s.resize(rows * stride, 0.0);
    }
    bufs.o.clear();
    bufs.o.resize(rows * d_v, 0.0);
    bufs.ml.clear();

    // Micro-tiles of up to 4 rows: (first row, rows, most keys, fewest keys).
    let mut tiles = [(0usize, 0usize, 0usize, 0usize); ROW_GROUP / kernels::ROW_TILE];
    let mut n_tiles = 0;
    for r0 in (0..rows).step_by(kernels::ROW_TILE) {
        let nr = kernels::ROW_TILE.min(rows - r0);
        let vis = &n_vis[r0..r0 + nr];
        let most = vis.iter().copied().max().unwrap_or(0);
        let fewest = vis.iter().copied().min().unwrap_or(0);
        tiles[n_tiles] = (r0, nr, most, fewest);
        n_tiles += 1;
    }
    let tiles = &tiles[..n_tiles];

    // Scores, key tiles outer (two at a time: the AVX-512 kernel keeps
    // both in registers) so that the packed tiles serve every row.
    let s = &mut bufs.s[..rows * stride];
    let n_tiles = stride / kernels::KEY_TILE;
    let mut kb = 0;
    while kb < n_tiles {
        let span = 2.min(n_tiles - kb);
        let j0 = kb * kernels::KEY_TILE;
        let kspan = &kt[j0 * d_k..(j0 + span * kernels::KEY_TILE) * d_k];
        for &(r0, nr, most, _) in tiles {
            if j0 < most {
                // The second tile only where a row of the group sees it.
                let t = if j0 + kernels::KEY_TILE < most {
                    span
                } else {
                    1
                };
                kernels::scores(
                    ctx.isa,
                    ctx.q,
                    &q_offs[r0..r0 + nr],
                    kspan,
                    t,
                    d_k,
                    ctx.scale,
                    &mut s[r0 * stride + j0..],
                    stride,
                );
            }
        }
        kb += span;
    }

    // The first chunk of value rows is fetched while the softmax runs.
    if ctx.prefetch {
        kernels::prefetch_rows(ctx.isa, vals, 0..n_max.min(KEY_CHUNK));
    }

    // Softmax per row, in place.
    for (r, &n) in n_vis.iter().enumerate() {
        if n == 0 {
            bufs.ml.push((f32::NEG_INFINITY, 0.0));
            continue;
        }
        let n8 = n.next_multiple_of(8);
        let row = &mut s[r * stride..r * stride + n8];
        row[n..].fill(f32::NEG_INFINITY);
        bufs.ml.push(kernels::softmax(ctx.isa, row));
    }

    // Values: key chunk outer; within a micro-tile, the keys every row sees
    // are done together, the rest row by row (the same chain per element).
    let mut j0 = 0;
    while j0 < n_max {
        let j1 = (j0 + KEY_CHUNK).min(n_max);
        let j2 = (j1 + KEY_CHUNK).min(n_max);
        if ctx.prefetch {
            kernels::prefetch_rows(ctx.isa, vals, j1..j2);
        }
        for &(r0, nr, _, fewest) in tiles {
            let joint = j1.min(fewest);
            if joint > j0 {
                kernels::accumulate(ctx.isa, s, stride, r0, nr, vals, j0, joint, &mut bufs.o);
            }
            for (r, &n) in n_vis.iter().enumerate().skip(r0).take(nr) {
                let (a, b) = (j0.max(fewest), j1.min(n));
                if b > a {
                    kernels::accumulate(ctx.isa, s, stride, r, 1, vals, a, b, &mut bufs.o);
                }
            }
        }
        j0 = j1;
    }
}

/// Attends rows `0..rows` of task `t` against one key list (keys packed in
/// `kt`, value rows `vals`), in groups of at most [`ROW_GROUP`], and
/// writes each row out; returns how many saw no key. Row `r` is query head
/// `r % g` of the group of the task's query `a = a0 + r / g`, and sees the
/// first `n_vis(a)` keys of the list. The dense and the sparse pass differ
/// only in the key lists they hand this.
#[allow(clippy::too_many_arguments)]
fn attend_rows(
    ctx: &Ctx<'_>,
    kt: &[f32],
    vals: ValueRows<'_>,
    rg: &mut RowGroup,
    t: &mut Task<'_>,
    a0: usize,
    rows: usize,
    n_vis: impl Fn(usize) -> usize,
) -> usize {
    let (g, d_v) = (ctx.g, ctx.d_v);
    let mut empty = 0;
    for start in (0..rows).step_by(ROW_GROUP) {
        let end = (start + ROW_GROUP).min(rows);
        rg.q_offs.clear();
        rg.n_vis.clear();
        for r in start..end {
            let a = a0 + r / g;
            let i = t.q0 + a;
            rg.q_offs
                .push((i * ctx.n_q_heads + t.h * g + r % g) * ctx.d_k);
            rg.n_vis.push(n_vis(a));
        }
        attend_group(ctx, kt, vals, &rg.q_offs, &rg.n_vis, &mut rg.bufs);
        for r in start..end {
            let (a, gi) = (a0 + r / g, r % g);
            let dst = &mut t.outs[a][gi * d_v..(gi + 1) * d_v];
            empty += finish_row(&rg.bufs, r - start, d_v, dst, &mut t.lses[a][gi]);
        }
    }
    empty
}

/// Writes row `r` of a finished group to `dst` / `lse`; returns 1 if the
/// row saw nothing (zeros, `-inf`), else 0.
fn finish_row(bufs: &GroupBufs, r: usize, d_v: usize, dst: &mut [f32], lse: &mut f32) -> usize {
    let (m, l) = bufs.ml[r];
    if l == 0.0 && m == f32::NEG_INFINITY {
        dst.fill(0.0);
        *lse = f32::NEG_INFINITY;
        return 1;
    }
    for (d, &o) in dst.iter_mut().zip(&bufs.o[r * d_v..(r + 1) * d_v]) {
        *d = o / l;
    }
    *lse = m + l.ln();
    0
}

/// The selected keys of a row, ascending (and distinct with
/// [`Repeats::Once`]): its entries `x` with `0 <= x < visible`. Sorts only
/// a row that is not already strictly ascending.
fn selected_keys(row: &[i32], visible: usize, repeats: Repeats, list: &mut Vec<usize>) {
    list.clear();
    let mut ascending = true;
    for &x in row {
        if x >= 0 && (x as usize) < visible {
            if list.last().is_some_and(|&last| last >= x as usize) {
                ascending = false;
            }
            list.push(x as usize);
        }
    }
    if !ascending {
        list.sort_unstable();
        if repeats == Repeats::Once {
            list.dedup();
        }
    }
}

/// Dense causal attention: every query attends to every key it sees,
/// `0..=min(query_pos[i], n_keys - 1)`. Layouts, rounding and refusals are
/// those of [`sparse_attention`] (see the module docs); the result equals
/// [`sparse_attention`] over the full causal selection, bit for bit.
///
/// Returns how many `(query, query head)` rows saw no key (only possible
/// with `n_keys = 0`); those get zeros and `lse = -inf`.
#[allow(clippy::too_many_arguments)]
pub fn dense_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    v_stride: usize,
    shape: &AttentionShape,
    query_pos: &[usize],
    scale: f32,
    out: &mut [f32],
    lse: &mut [f32],
) -> Result<usize, ArgumentError> {
    check_pass(q, k, v, v_stride, shape, query_pos, scale, out, lse)?;
    let (n_kv, d_k, g) = (shape.n_kv_heads, shape.d_k, shape.group());
    if shape.n_queries == 0 || shape.n_q_heads == 0 {
        return Ok(0);
    }
    let ctx = Ctx::new(q, shape, scale, false);
    // Each KV head's keys are packed once and shared by every task.
    let n_pack = query_pos
        .iter()
        .map(|&p| shape.visible(p))
        .max()
        .unwrap_or(0);
    let mut kts = Vec::with_capacity(n_kv);
    let mut voffs = Vec::with_capacity(n_kv);
    for h in 0..n_kv {
        let mut kt = Vec::new();
        kernels::pack_keys(ctx.isa, &mut kt, k, d_k, n_pack, |j| (j * n_kv + h) * d_k);
        kts.push(kt);
        voffs.push(
            (0..n_pack)
                .map(|j| (j * n_kv + h) * v_stride)
                .collect::<Vec<_>>(),
        );
    }
    let vals: Vec<ValueRows<'_>> = voffs
        .iter()
        .map(|off| ValueRows::new(v, off, ctx.d_v))
        .collect();
    let block = ROW_GROUP.div_ceil(g).max(1);
    let mut tasks = make_tasks(out, lse, shape, block);
    let empty = run_tasks(&mut tasks, |sc, t| {
        let (rows, q0, h) = (t.outs.len() * g, t.q0, t.h);
        let n_vis = |a: usize| shape.visible(query_pos[q0 + a]);
        attend_rows(&ctx, &kts[h], vals[h], &mut sc.group, t, 0, rows, n_vis)
    });
    Ok(empty)
}

/// How a selection row counts an entry that appears more than once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Repeats {
    /// Once: the row is a set (kvselect's rule, [`sparse_attention`]).
    #[default]
    Once,
    /// Each time it appears: the row is a list (the engines' sparse MLA
    /// kernels, which gather every slot they read).
    Each,
}

/// Sparse causal attention over selected positions (see the module docs
/// for layouts, the GQA rule and the numbers).
///
/// `selection` is `[n_queries, n_kv_heads, width]` key indices; a row
/// attends to the set of its entries `x` with
/// `0 <= x <= min(query_pos[i], n_keys - 1)` (negative entries are padding,
/// later ones are masked as future keys, duplicates count once). Writes
/// `out` `[n_queries, n_q_heads, d_v]` and `lse` `[n_queries, n_q_heads]`
/// and returns how many `(query, query head)` rows selected nothing: those
/// get zeros and `lse = -inf`, never NaN.
///
/// Values are read in place through `v_stride` (MLA: `v = k`,
/// `v_stride = d_k`). Costs `O(k · d)` per query head for `k` selected keys
/// (plus `O(width)` to read its row), independent of `n_keys`. Refuses
/// (before writing anything) a buffer whose length does not match its
/// shape, `n_kv_heads = 0`, `n_q_heads` not a multiple of `n_kv_heads`,
/// `v_stride < d_v`, and a non-finite `scale`.
#[allow(clippy::too_many_arguments)]
pub fn sparse_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    v_stride: usize,
    shape: &AttentionShape,
    query_pos: &[usize],
    selection: &[i32],
    width: usize,
    scale: f32,
    out: &mut [f32],
    lse: &mut [f32],
) -> Result<usize, ArgumentError> {
    sparse_attention_counting(
        q,
        k,
        v,
        v_stride,
        shape,
        query_pos,
        selection,
        width,
        scale,
        Repeats::Once,
        out,
        lse,
    )
}

/// [`sparse_attention`] with the row's repeated entries counted as
/// `repeats` says: [`Repeats::Once`] is [`sparse_attention`] itself (bit
/// for bit); [`Repeats::Each`] attends to the row's valid entries as a
/// list, so an entry that appears `m` times weighs `m` times (its key
/// packed `m` times: the same rounding as `m` distinct keys of equal
/// content). Everything else (padding, the causal mask, empty rows,
/// refusals) is [`sparse_attention`]'s.
#[allow(clippy::too_many_arguments)]
pub fn sparse_attention_counting(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    v_stride: usize,
    shape: &AttentionShape,
    query_pos: &[usize],
    selection: &[i32],
    width: usize,
    scale: f32,
    repeats: Repeats,
    out: &mut [f32],
    lse: &mut [f32],
) -> Result<usize, ArgumentError> {
    check_pass(q, k, v, v_stride, shape, query_pos, scale, out, lse)?;
    let (n_kv, d_k, g) = (shape.n_kv_heads, shape.d_k, shape.group());
    let ns = checked_size("selection", &[shape.n_queries, n_kv, width])?;
    check_len("selection", selection.len(), ns, || {
        format!(
            "[n_queries={}, n_kv_heads={n_kv}, width={width}]",
            shape.n_queries
        )
    })?;
    if shape.n_queries == 0 || shape.n_q_heads == 0 {
        return Ok(0);
    }
    let ctx = Ctx::new(q, shape, scale, true);
    let mut tasks = make_tasks(out, lse, shape, SPARSE_BLOCK);
    let empty = run_tasks(&mut tasks, |sc, t| {
        let h = t.h;
        let mut empty = 0;
        for a in 0..t.outs.len() {
            let i = t.q0 + a;
            let row = &selection[(i * n_kv + h) * width..(i * n_kv + h + 1) * width];
            selected_keys(row, shape.visible(query_pos[i]), repeats, &mut sc.list);
            let n = sc.list.len();
            if n == 0 {
                t.outs[a].fill(0.0);
                t.lses[a].fill(f32::NEG_INFINITY);
                empty += g;
                continue;
            }
            let list = &sc.list;
            kernels::pack_keys(ctx.isa, &mut sc.kt, k, d_k, n, |j| {
                (list[j] * n_kv + h) * d_k
            });
            sc.voff.clear();
            sc.voff
                .extend(list.iter().map(|&j| (j * n_kv + h) * v_stride));
            let vals = ValueRows::new(v, &sc.voff, ctx.d_v);
            empty += attend_rows(&ctx, &sc.kt, vals, &mut sc.group, t, a, g, |_| n);
        }
        empty
    });
    Ok(empty)
}

/// MLA sparse attention: `n_heads` query heads share one latent KV head
/// `kv` `[n_keys, d_k]` whose first `d_v` columns are the values, read in
/// place (`v = kv`, `v_stride = d_k`; no copy). `q` is
/// `[query_pos.len(), n_heads, d_k]`; the rest is [`sparse_attention`] with
/// `n_kv_heads = 1` (`selection` is `[n_queries, width]`). This is the
/// masked pass over the positions a block selection covers that the block
/// spec refers to. Refuses `d_k = 0`, `d_v > d_k` and a `kv` that is not a
/// whole number of `d_k`-wide rows.
#[allow(clippy::too_many_arguments)]
pub fn causal_mla_attention_sparse(
    q: &[f32],
    kv: &[f32],
    n_heads: usize,
    d_k: usize,
    d_v: usize,
    query_pos: &[usize],
    selection: &[i32],
    width: usize,
    scale: f32,
    out: &mut [f32],
    lse: &mut [f32],
) -> Result<usize, ArgumentError> {
    if d_k == 0 {
        return Err(ArgumentError::Invalid {
            argument: "d_k",
            message: "d_k is 0: the latent KV rows have no width".into(),
        });
    }
    if d_v > d_k {
        return Err(ArgumentError::Invalid {
            argument: "d_v",
            message: format!("d_v={d_v} is wider than the latent rows (d_k={d_k})"),
        });
    }
    if !kv.len().is_multiple_of(d_k) {
        return Err(ArgumentError::Length {
            argument: "kv",
            expected: kv.len() / d_k * d_k,
            actual: kv.len(),
            shape: format!("a whole number of rows of d_k={d_k}"),
        });
    }
    let shape = AttentionShape::mla(query_pos.len(), n_heads, d_k, d_v, kv.len() / d_k);
    sparse_attention(
        q, kv, kv, d_k, &shape, query_pos, selection, width, scale, out, lse,
    )
}
