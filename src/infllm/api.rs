//! The checked entry points: block scores and rows of the queries at the
//! end of one sequence, of a packed batch of sequences, and of decoding
//! queries over a paged cache of compressed keys.

use super::score::{block_scores, group_sums, Packed, Scratch};
use super::{select, Config};
use crate::error::{check_len, checked_size, ArgumentError};
use crate::keys::{BlockTable, CompressedBatch, Encoded, Heads, PagedCache};
use crate::simd::Isa;

/// A call's checked sizes.
struct Shape {
    n_q: usize,
    hq: usize,
    n_kv: usize,
    d: usize,
    n_c: usize,
    seq_len: usize,
}

impl Shape {
    fn group(&self) -> usize {
        self.hq / self.n_kv
    }
    /// The position of query `i` (the queries are the last `n_q` tokens).
    fn pos(&self, i: usize) -> usize {
        self.seq_len - self.n_q + i
    }
}

fn invalid(argument: &'static str, message: String) -> ArgumentError {
    ArgumentError::Invalid { argument, message }
}

/// The checks every form shares: the sizes, the heads, the geometry and the
/// scale.
fn check_common(heads: Heads, cfg: &Config) -> Result<(), ArgumentError> {
    let Heads {
        n_q_heads,
        n_kv_heads,
        d,
    } = heads;
    if d == 0 {
        return Err(invalid("d", "d must be at least 1".into()));
    }
    if n_kv_heads == 0 {
        return Err(invalid(
            "n_kv_heads",
            "n_kv_heads must be at least 1".into(),
        ));
    }
    if n_q_heads == 0 || !n_q_heads.is_multiple_of(n_kv_heads) {
        return Err(invalid(
            "q",
            format!(
                "q's {n_q_heads} heads are not a positive multiple of the {n_kv_heads} KV heads"
            ),
        ));
    }
    cfg.geometry.check()?;
    if !cfg.scale.is_finite() {
        return Err(invalid(
            "scale",
            format!("scale must be finite, got {}", cfg.scale),
        ));
    }
    Ok(())
}

fn check(
    q_len: usize,
    ck_len: usize,
    ck_scale: Option<&[f32]>,
    heads: Heads,
    seq_len: usize,
    cfg: &Config,
) -> Result<Shape, ArgumentError> {
    check_common(heads, cfg)?;
    let Heads {
        n_q_heads,
        n_kv_heads,
        d,
    } = heads;
    crate::packed::check_seq_len(seq_len)?;
    let per_q = checked_size("q", &[n_q_heads, d])?;
    if q_len == 0 || !q_len.is_multiple_of(per_q) {
        return Err(invalid(
            "q",
            format!("q holds {q_len} values, not a positive number of [n_q_heads={n_q_heads}, d={d}] queries"),
        ));
    }
    let n_q = q_len / per_q;
    if n_q > seq_len {
        return Err(invalid(
            "q",
            format!(
                "{n_q} queries but seq_len = {seq_len}: the queries are the sequence's last tokens"
            ),
        ));
    }
    let n_c = cfg.geometry.compressed_len(seq_len);
    check_len(
        "ck",
        ck_len,
        checked_size("ck", &[n_c, n_kv_heads, d])?,
        || {
            format!(
                "[n_c={n_c} (compressed keys of {seq_len} tokens), n_kv_heads={n_kv_heads}, d={d}]"
            )
        },
    )?;
    if let Some(s) = ck_scale {
        check_len("ck_scale", s.len(), n_c, || format!("[n_c={n_c}]"))?;
    }
    Ok(Shape {
        n_q,
        hq: n_q_heads,
        n_kv: n_kv_heads,
        d,
        n_c,
        seq_len,
    })
}

/// `x` as float32, each row of `row` values times its scale: borrowed when
/// it is unscaled float32 (no copy), else decoded.
fn decoded<'a>(x: Encoded<'a>, scale: Option<&[f32]>, row: usize) -> std::borrow::Cow<'a, [f32]> {
    if let (Encoded::F32(v), None) = (x, scale) {
        return std::borrow::Cow::Borrowed(v);
    }
    let mut v = vec![0.0f32; x.len()];
    x.decode(0, &mut v);
    if let Some(s) = scale {
        for (r, &c) in v.chunks_mut(row.max(1)).zip(s) {
            r.iter_mut().for_each(|x| *x *= c);
        }
    }
    std::borrow::Cow::Owned(v)
}

/// The most queries a dense call scores on its compressed keys read in
/// place ([`in_place`]); more share one packed copy of each KV head's keys.
pub(super) const IN_PLACE_MAX_QUERIES: usize = 16;

/// Compressed-key elements (`n_c · n_kv · d`) from which decoded keys
/// (and one query's float32 keys) are scored in place at any group: 1 MiB
/// as float32, twice Zen 3's second-level cache, so the packed copy would
/// stream through memory.
pub(super) const IN_PLACE_MIN_ELEMENTS: usize = 1 << 18;

/// The fewest lanes (queries × a KV head's group) from which several
/// queries score keys that fit in the cache in place: two vectors.
pub(super) const IN_PLACE_MIN_LANES: usize = 16;

#[cfg(test)]
thread_local! {
    /// The tests' choice of [`run`]'s path (`None`: [`in_place`]'s).
    pub(super) static FORCE_IN_PLACE: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// Whether [`run`] scores the compressed keys where they lie
/// ([`super::paged::dense_group_sums`] for one query, the group's heads in
/// the lanes; [`super::paged::dense_group_sums_queries`] for several, each
/// key read once for all of them and their heads sharing the lanes) rather
/// than decoding and packing each KV head's keys once for every query
/// ([`Packed`]). The pack is a read and a write of every key a call; it
/// pays when many queries score the packed copy (a prefill), or when the
/// heads-in-lanes kernel runs with lanes empty on keys already in cache.
/// Measured (AMD EPYC Zen 3, one thread; `docs/infllm.md`, "Dense decode"):
///
/// - one query: in place, except keys that fit in the cache
///   ([`IN_PLACE_MIN_ELEMENTS`]) of a group under 16 when they are decoded
///   (fp8, float16, scaled), or unscaled float32 of a group under 8;
/// - 2 to [`IN_PLACE_MAX_QUERIES`] queries: in place when the queries'
///   heads fill two vectors ([`IN_PLACE_MIN_LANES`]: any group of 8 or
///   more; 8 queries of 2 heads, 16 of one), or on decoded or bfloat16
///   keys past the cache (the packed path would decode them to a fresh
///   float32 copy first); unscaled float32 with fewer lanes is packed (no
///   decode to save, lanes the in-place kernel leaves empty);
/// - otherwise packed.
fn in_place(sh: &Shape, ck: Encoded<'_>, ck_scale: Option<&[f32]>) -> bool {
    #[cfg(test)]
    if let Some(f) = FORCE_IN_PLACE.get() {
        return f;
    }
    let direct = ck_scale.is_none() && matches!(ck, Encoded::F32(_) | Encoded::Bf16(_));
    // Unscaled float32: the packed path's only copy is the pack itself.
    let copy_free = ck_scale.is_none() && matches!(ck, Encoded::F32(_));
    let wide = sh.group() >= 16;
    let large = ck.len() >= IN_PLACE_MIN_ELEMENTS;
    match sh.n_q {
        1 => wide || large || (direct && (!copy_free || sh.group() >= 8)),
        n => {
            n <= IN_PLACE_MAX_QUERIES
                && (n * sh.group() >= IN_PLACE_MIN_LANES || (large && !copy_free))
        }
    }
}

/// Runs `f(row, p, g, block_scores)` for every query `i` and KV head `g`
/// (row `i · n_kv + g` of `out`, `width` wide), on the crate's pool.
#[allow(clippy::too_many_arguments)]
fn run<T: Send>(
    isa: Isa,
    sh: &Shape,
    q: Encoded<'_>,
    ck: Encoded<'_>,
    ck_scale: Option<&[f32]>,
    cfg: &Config,
    out: &mut [T],
    width: usize,
    f: impl Fn(&mut [T], usize, &[f32]) + Sync + Send,
) {
    let (d, g_heads, nb) = (sh.d, sh.group(), cfg.geometry.n_blocks(sh.seq_len));
    let q = decoded(q, None, 0);
    let work = g_heads * sh.n_c.max(1) * d;
    if in_place(sh, ck, ck_scale) {
        let keys = super::paged::Dense {
            ck,
            scales: ck_scale,
            row: sh.n_kv * d,
        };
        // Several queries walk the keys once (`run_queries`), but for
        // float32 / bfloat16 read in place by a group that fills two
        // vectors a query: there the one-pass kernel a query measured as
        // fast (docs/infllm.md, "Dense decode").
        let direct = ck_scale.is_none() && matches!(ck, Encoded::F32(_) | Encoded::Bf16(_));
        if sh.n_q > 1 && !(direct && g_heads >= 16) {
            return run_queries(isa, sh, &q, keys, cfg, out, width, f);
        }
        crate::pool::for_each_row_mut(out, width, crate::pool::min_rows(work), |r, row| {
            let (i, g) = (r / sh.n_kv, r % sh.n_kv);
            let p = sh.pos(i);
            let n_vis = cfg.geometry.visible(p);
            let at = super::paged::Row {
                s: 0,
                g,
                q0: (i * sh.hq + g * g_heads) * d,
                heads: g_heads,
                d,
            };
            super::paged::dense_group_sums(isa, &q, keys, at, n_vis, cfg.scale, |sums| {
                let mut blocks = vec![0.0f32; nb];
                block_scores(cfg, sums, sh.n_c, p, &mut blocks);
                f(row, p, &blocks);
            });
        });
        return;
    }
    let ck = decoded(ck, ck_scale, sh.n_kv * d);
    let packed: Vec<Packed> = (0..sh.n_kv)
        .map(|g| Packed::new(isa, &ck, sh.n_c, sh.n_kv, g, d))
        .collect();
    crate::pool::for_each_row_mut(out, width, crate::pool::min_rows(work), |r, row| {
        let (i, g) = (r / sh.n_kv, r % sh.n_kv);
        let p = sh.pos(i);
        let qg = &q[(i * sh.hq + g * g_heads) * d..(i * sh.hq + (g + 1) * g_heads) * d];
        let mut scratch = Scratch::default();
        let n_vis = cfg.geometry.visible(p);
        group_sums(
            isa,
            qg,
            g_heads,
            d,
            &packed[g],
            n_vis,
            cfg.scale,
            &mut scratch,
        );
        let mut blocks = vec![0.0f32; nb];
        block_scores(cfg, &scratch.sums, sh.n_c, p, &mut blocks);
        f(row, p, &blocks);
    });
}

/// [`run`]'s in-place path for several queries (a speculative or
/// multi-token decode's; not float32 / bfloat16 keys of a group of 16 or
/// more, which keep the one-pass kernel a query): each KV head's keys read once for a batch of the
/// queries ([`super::paged::dense_group_sums_queries`]; one batch a KV head
/// on one thread, the queries split in as many batches as the pool's
/// threads need beside the KV heads), then each row's block scores.
#[allow(clippy::too_many_arguments)]
fn run_queries<T: Send>(
    isa: Isa,
    sh: &Shape,
    q: &[f32],
    keys: super::paged::Dense<'_>,
    cfg: &Config,
    out: &mut [T],
    width: usize,
    f: impl Fn(&mut [T], usize, &[f32]) + Sync + Send,
) {
    let (d, g_heads, nb) = (sh.d, sh.group(), cfg.geometry.n_blocks(sh.seq_len));
    // The last query sees the most keys (positions increase).
    let n_max = cfg.geometry.visible(sh.pos(sh.n_q - 1));
    let batches = crate::pool::num_threads()
        .div_ceil(sh.n_kv)
        .clamp(1, sh.n_q);
    let batch = sh.n_q.div_ceil(batches);
    let batches = sh.n_q.div_ceil(batch);
    // Unit `g · batches + b`: KV head `g`, queries `b · batch..`, a row of
    // `n_max` sums a query.
    let unit = batch * n_max;
    let mut sums = vec![0.0f32; sh.n_kv * batches * unit];
    let work = batch * g_heads * sh.n_c.max(1) * d;
    crate::pool::for_each_row_mut(&mut sums, unit, crate::pool::min_rows(work), |u, buf| {
        let (g, b) = (u / batches, u % batches);
        let qs = b * batch..sh.n_q.min((b + 1) * batch);
        let q0s: Vec<usize> = qs.clone().map(|i| (i * sh.hq + g * g_heads) * d).collect();
        let n_vis: Vec<usize> = qs.map(|i| cfg.geometry.visible(sh.pos(i))).collect();
        super::paged::dense_group_sums_queries(
            isa, q, keys, g, &q0s, g_heads, d, &n_vis, cfg.scale, buf, n_max,
        );
    });
    let per_row = sh.n_c.max(1) + nb;
    crate::pool::for_each_row_mut(out, width, crate::pool::min_rows(per_row), |r, row| {
        let (i, g) = (r / sh.n_kv, r % sh.n_kv);
        let p = sh.pos(i);
        let n_vis = cfg.geometry.visible(p);
        let at = (g * batches + i / batch) * unit + (i % batch) * n_max;
        let mut blocks = vec![0.0f32; nb];
        block_scores(cfg, &sums[at..at + n_vis], sh.n_c, p, &mut blocks);
        f(row, p, &blocks);
    });
}

/// Every block's score for the queries at the end of one sequence:
/// `out[i, g, b]` (`[n_q, n_kv_heads, ⌈seq_len / 64⌉]`) for query `i` (at
/// position `seq_len − n_q + i`), KV head `g`, block `b` — the pooled
/// group sum of stage 1, or `±inf` where the variant forces or excludes it
/// (see the module docs).
///
/// `q` is `[n_q, n_q_heads, d]`; `ck` the sequence's compressed keys
/// `[cfg.geometry.compressed_len(seq_len), n_kv_heads, d]`, optionally each row times
/// `ck_scale[j]` (fp8 keys; the product rounded to float32). Query head `h`
/// reads KV head `h / (n_q_heads / n_kv_heads)`.
///
/// # Errors
/// A zero `d` or `n_kv_heads` (named), `q` heads not a positive multiple of
/// the KV heads or `q` not whole queries, or more queries than tokens
/// (`q`), `seq_len` 0, a non-finite `scale`, `ck` or `ck_scale` of another
/// size, `out` of another size (`out`). Nothing is written before every
/// check has passed.
pub fn block_scores_into(
    q: Encoded<'_>,
    ck: Encoded<'_>,
    ck_scale: Option<&[f32]>,
    heads: Heads,
    seq_len: usize,
    cfg: &Config,
    out: &mut [f32],
) -> Result<(), ArgumentError> {
    block_scores_at(Isa::best(), q, ck, ck_scale, heads, seq_len, cfg, out)
}

/// [`block_scores_into`] at `isa` (the tests' way to every level).
#[allow(clippy::too_many_arguments)]
pub(super) fn block_scores_at(
    isa: Isa,
    q: Encoded<'_>,
    ck: Encoded<'_>,
    ck_scale: Option<&[f32]>,
    heads: Heads,
    seq_len: usize,
    cfg: &Config,
    out: &mut [f32],
) -> Result<(), ArgumentError> {
    let sh = check(q.len(), ck.len(), ck_scale, heads, seq_len, cfg)?;
    let nb = cfg.geometry.n_blocks(seq_len);
    check_out(
        out.len(),
        checked_size("out", &[sh.n_q, sh.n_kv, nb])?,
        || format!("[n_q={}, n_kv_heads={}, n_blocks={nb}]", sh.n_q, sh.n_kv),
    )?;
    run(isa, &sh, q, ck, ck_scale, cfg, out, nb, score_row);
    Ok(())
}

/// The blocks each query reads: `out[i, g]` (`[n_q, n_kv_heads, top_k]`,
/// `int32`) the top `min(top_k, n_blocks)` blocks of
/// [`block_scores_into`]'s row in the total order, the ids the variant's
/// filter drops removed, ascending, `-1` padded.
///
/// # Errors
/// `top_k` 0 (`topk`), and as [`block_scores_into`].
pub fn select_into(
    q: Encoded<'_>,
    ck: Encoded<'_>,
    ck_scale: Option<&[f32]>,
    heads: Heads,
    seq_len: usize,
    cfg: &Config,
    out: &mut [i32],
) -> Result<(), ArgumentError> {
    select_at(Isa::best(), q, ck, ck_scale, heads, seq_len, cfg, out)
}

/// [`select_into`] at `isa`.
#[allow(clippy::too_many_arguments)]
pub(super) fn select_at(
    isa: Isa,
    q: Encoded<'_>,
    ck: Encoded<'_>,
    ck_scale: Option<&[f32]>,
    heads: Heads,
    seq_len: usize,
    cfg: &Config,
    out: &mut [i32],
) -> Result<(), ArgumentError> {
    check_top_k(cfg)?;
    let sh = check(q.len(), ck.len(), ck_scale, heads, seq_len, cfg)?;
    check_out(
        out.len(),
        checked_size("out", &[sh.n_q, sh.n_kv, cfg.top_k])?,
        || {
            format!(
                "[n_q={}, n_kv_heads={}, top_k={}]",
                sh.n_q, sh.n_kv, cfg.top_k
            )
        },
    )?;
    run(
        isa,
        &sh,
        q,
        ck,
        ck_scale,
        cfg,
        out,
        cfg.top_k,
        |row, p, blocks| select_row(cfg, row, p, blocks),
    );
    Ok(())
}

/// A block-score row: the sequence's blocks, then NaN to the row's width
/// (a packed call's rows are as wide as its longest sequence's blocks).
fn score_row(row: &mut [f32], _p: usize, blocks: &[f32]) {
    row[..blocks.len()].copy_from_slice(blocks);
    row[blocks.len()..].fill(f32::NAN);
}

/// A selection row of the query at position `p` from its block scores.
fn select_row(cfg: &Config, row: &mut [i32], p: usize, blocks: &[f32]) {
    let mut ids = Vec::new();
    select::row(
        blocks,
        cfg.top_k,
        cfg.keep,
        p / cfg.geometry.block_size,
        &mut ids,
        row,
    );
}

fn check_top_k(cfg: &Config) -> Result<(), ArgumentError> {
    if cfg.top_k == 0 {
        return Err(invalid("topk", "topk must be at least 1 block".into()));
    }
    Ok(())
}

fn check_out(got: usize, want: usize, shape: impl FnOnce() -> String) -> Result<(), ArgumentError> {
    if got != want {
        return Err(ArgumentError::OutputSize {
            argument: "out",
            expected: want,
            actual: got,
            shape: shape(),
        });
    }
    Ok(())
}

/// One sequence of a packed call: its checked shape and where its queries
/// and compressed keys start.
struct Seq {
    sh: Shape,
    q0: usize,
    c0: usize,
}

/// The packed batch checked: sequence `s` is queries `cu_seqlens_q[s] ..
/// cu_seqlens_q[s + 1]`, compressed keys `cu_seqlens_k[s] ..
/// cu_seqlens_k[s + 1]` (the source's two arrays) and `seq_lens[s]`
/// tokens; its queries are its last tokens and its compressed keys exactly
/// those of its tokens.
fn check_packed(
    q_len: usize,
    ck_len: usize,
    ck_scale: Option<&[f32]>,
    heads: Heads,
    seqs: &CompressedBatch<'_>,
    cfg: &Config,
) -> Result<Vec<Seq>, ArgumentError> {
    check_common(heads, cfg)?;
    let batch = crate::packed::compressed_batch(
        q_len,
        ck_len,
        ck_scale.map(<[f32]>::len),
        heads,
        seqs,
        |len| cfg.geometry.compressed_len(len),
    )?;
    Ok(batch
        .into_iter()
        .map(|s| Seq {
            sh: Shape {
                n_q: s.n_q,
                hq: heads.n_q_heads,
                n_kv: heads.n_kv_heads,
                d: heads.d,
                n_c: s.n_c,
                seq_len: s.len,
            },
            q0: s.q0,
            c0: s.c0,
        })
        .collect())
}

/// Runs `f` over every sequence of a packed batch ([`run`] on its rows).
#[allow(clippy::too_many_arguments)]
fn run_packed<T: Send>(
    isa: Isa,
    seqs: &[Seq],
    q: Encoded<'_>,
    ck: Encoded<'_>,
    ck_scale: Option<&[f32]>,
    cfg: &Config,
    out: &mut [T],
    width: usize,
    f: impl Fn(&mut [T], usize, &[f32]) + Sync + Send + Copy,
) {
    for seq in seqs.iter().filter(|s| s.sh.n_q > 0) {
        let sh = &seq.sh;
        let (qr, cr) = (sh.hq * sh.d, sh.n_kv * sh.d);
        let qs = q.slice(seq.q0 * qr, (seq.q0 + sh.n_q) * qr);
        let cs = ck.slice(seq.c0 * cr, (seq.c0 + sh.n_c) * cr);
        let sc = ck_scale.map(|s| &s[seq.c0..seq.c0 + sh.n_c]);
        let rows = &mut out[seq.q0 * sh.n_kv * width..(seq.q0 + sh.n_q) * sh.n_kv * width];
        run(isa, sh, qs, cs, sc, cfg, rows, width, f);
    }
}

/// [`block_scores_into`] over a packed batch (InfLLM-v2's varlen call:
/// `infllmv2_attn_stage1` and `max_pooling_1d_varlen` take `cu_seqlens_q`
/// and `cu_seqlens_k`): sequence `s` is queries `cu_seqlens_q[s] ..
/// cu_seqlens_q[s + 1]` of `q`, the last of its `seq_lens[s]` tokens, and
/// compressed keys `cu_seqlens_k[s] .. cu_seqlens_k[s + 1]` of `ck` (its
/// `compressed_len(seq_lens[s])`). `out` is `[total_q, n_kv_heads,
/// max_blocks]`, `max_blocks` the most blocks of a sequence; each row is
/// the dense call's row on its own sequence, then NaN.
///
/// # Errors
/// As [`block_scores_into`] (`q`, `ck` not whole rows), `cu_seqlens_k` not
/// rising from 0 to the compressed keys or giving a sequence other than its
/// tokens' compressed keys (`cu_seqlens_k`), `seq_lens` not one per
/// sequence or 0 (`seq_len`), `cu_seqlens_q` not rising from 0 to the
/// queries or giving a sequence more queries than tokens (`cu_seqlens_q`).
/// Nothing is written before every check has passed.
pub fn block_scores_packed_into(
    q: Encoded<'_>,
    ck: Encoded<'_>,
    ck_scale: Option<&[f32]>,
    heads: Heads,
    seqs: &CompressedBatch<'_>,
    cfg: &Config,
    out: &mut [f32],
) -> Result<(), ArgumentError> {
    let checked = check_packed(q.len(), ck.len(), ck_scale, heads, seqs, cfg)?;
    let Heads {
        n_q_heads,
        n_kv_heads,
        d,
    } = heads;
    let n_q = q.len() / (n_q_heads * d);
    let nb = packed_width(&checked, cfg);
    check_out(
        out.len(),
        checked_size("out", &[n_q, n_kv_heads, nb])?,
        || format!("[total_q={n_q}, n_kv_heads={n_kv_heads}, max_blocks={nb}]"),
    )?;
    run_packed(
        Isa::best(),
        &checked,
        q,
        ck,
        ck_scale,
        cfg,
        out,
        nb,
        score_row,
    );
    Ok(())
}

/// The most blocks of a packed batch's sequences.
fn packed_width(seqs: &[Seq], cfg: &Config) -> usize {
    seqs.iter()
        .map(|s| cfg.geometry.n_blocks(s.sh.seq_len))
        .max()
        .unwrap_or(0)
}

/// [`select_into`] over a packed batch (see [`block_scores_packed_into`]):
/// `out` `[total_q, n_kv_heads, top_k]`, each row the dense call's row on
/// its own sequence (block ids of that sequence, from 0).
///
/// # Errors
/// `top_k` 0 (`topk`), and as [`block_scores_packed_into`].
pub fn select_packed_into(
    q: Encoded<'_>,
    ck: Encoded<'_>,
    ck_scale: Option<&[f32]>,
    heads: Heads,
    seqs: &CompressedBatch<'_>,
    cfg: &Config,
    out: &mut [i32],
) -> Result<(), ArgumentError> {
    check_top_k(cfg)?;
    let checked = check_packed(q.len(), ck.len(), ck_scale, heads, seqs, cfg)?;
    let Heads {
        n_q_heads,
        n_kv_heads,
        d,
    } = heads;
    let n_q = q.len() / (n_q_heads * d);
    let k = cfg.top_k;
    check_out(
        out.len(),
        checked_size("out", &[n_q, n_kv_heads, k])?,
        || format!("[total_q={n_q}, n_kv_heads={n_kv_heads}, top_k={k}]"),
    )?;
    run_packed(
        Isa::best(),
        &checked,
        q,
        ck,
        ck_scale,
        cfg,
        out,
        k,
        |row, p, blocks| select_row(cfg, row, p, blocks),
    );
    Ok(())
}

/// InfLLM-v2's block scores at decode over a paged cache of compressed
/// keys: sequence `s` decodes one query (`q` `[n_seqs, n_q_heads, d]`) at
/// position `seq_lens[s] − 1` (`table.seq_lens`: tokens), and its
/// compressed keys — `compressed_len(seq_lens[s])` of them, key `j` in row
/// `j % page` of page `table[s, j / page]` — are read in place (a cache row
/// is `n_kv_heads · d` elements; a `Fp8WithScales` page's scale is one per
/// compressed key). `out` `[n_seqs, n_kv_heads, max_blocks]`, `max_blocks`
/// the most blocks of a sequence; row `(s, g)` equals, bit for bit,
/// [`block_scores_into`]'s row on the sequence's compressed keys laid out
/// densely, then NaN past the sequence's own blocks (as
/// [`block_scores_packed_into`] pads).
///
/// # Errors
/// As [`block_scores_into`]; the cache refused as [`PagedCache::check`]
/// refuses it, or its rows not `n_kv_heads · d` (`kv_cache`); a `seq_lens`
/// entry 0 or past an int32 position (`seq_lens`); a block-table row too
/// short for its sequence's compressed keys, or an entry it reads outside
/// the cache (`block_table`); `q` not `[n_seqs, n_q_heads, d]` (`q`); `out`
/// of another size. Nothing is written before every check has passed.
pub fn block_scores_paged_into(
    q: Encoded<'_>,
    cache: &PagedCache<'_>,
    table: &BlockTable<'_>,
    heads: Heads,
    cfg: &Config,
    out: &mut [f32],
) -> Result<(), ArgumentError> {
    block_scores_paged_at(Isa::best(), q, cache, table, heads, cfg, out)
}

/// [`block_scores_paged_into`] at `isa`.
pub(super) fn block_scores_paged_at(
    isa: Isa,
    q: Encoded<'_>,
    cache: &PagedCache<'_>,
    table: &BlockTable<'_>,
    heads: Heads,
    cfg: &Config,
    out: &mut [f32],
) -> Result<(), ArgumentError> {
    let n_c = check_paged(q.len(), cache, table, heads, cfg)?;
    let n_kv_heads = heads.n_kv_heads;
    let n = n_c.len();
    let nb = table
        .seq_lens
        .iter()
        .map(|&l| cfg.geometry.n_blocks(l))
        .max()
        .unwrap_or(0);
    check_out(
        out.len(),
        checked_size("out", &[n, n_kv_heads, nb])?,
        || format!("[n_seqs={n}, n_kv_heads={n_kv_heads}, max_blocks={nb}]"),
    )?;
    run_paged(isa, q, cache, table, &n_c, heads, cfg, out, nb, score_row);
    Ok(())
}

/// InfLLM-v2's selection at decode over a paged cache of compressed keys
/// (see [`block_scores_paged_into`]): `out` `[n_seqs, n_kv_heads, top_k]`;
/// equal, row for row, to [`select_into`] on the sequence's compressed keys
/// laid out densely.
///
/// # Errors
/// `top_k` 0 (`topk`), and as [`block_scores_paged_into`].
pub fn select_paged_into(
    q: Encoded<'_>,
    cache: &PagedCache<'_>,
    table: &BlockTable<'_>,
    heads: Heads,
    cfg: &Config,
    out: &mut [i32],
) -> Result<(), ArgumentError> {
    select_paged_at(Isa::best(), q, cache, table, heads, cfg, out)
}

/// [`select_paged_into`] at `isa`.
pub(super) fn select_paged_at(
    isa: Isa,
    q: Encoded<'_>,
    cache: &PagedCache<'_>,
    table: &BlockTable<'_>,
    heads: Heads,
    cfg: &Config,
    out: &mut [i32],
) -> Result<(), ArgumentError> {
    check_top_k(cfg)?;
    let n_c = check_paged(q.len(), cache, table, heads, cfg)?;
    let n_kv_heads = heads.n_kv_heads;
    let n = n_c.len();
    let k = cfg.top_k;
    check_out(out.len(), checked_size("out", &[n, n_kv_heads, k])?, || {
        format!("[n_seqs={n}, n_kv_heads={n_kv_heads}, top_k={k}]")
    })?;
    run_paged(
        isa,
        q,
        cache,
        table,
        &n_c,
        heads,
        cfg,
        out,
        k,
        |row, p, blocks| select_row(cfg, row, p, blocks),
    );
    Ok(())
}

/// The checks both paged forms share (all but `top_k` and `out`): each
/// sequence's compressed-key count.
fn check_paged(
    q_len: usize,
    cache: &PagedCache<'_>,
    table: &BlockTable<'_>,
    heads: Heads,
    cfg: &Config,
) -> Result<Vec<usize>, ArgumentError> {
    check_common(heads, cfg)?;
    let Heads {
        n_q_heads,
        n_kv_heads,
        d,
    } = heads;
    let n_c = crate::keys::paged::check_compressed_decode(cache, table, n_kv_heads, d, |n| {
        cfg.geometry.compressed_len(n)
    })?;
    let n = table.seq_lens.len();
    let qrow = checked_size("q", &[n_q_heads, d])?;
    check_len("q", q_len, checked_size("q", &[n, qrow])?, || {
        format!("[n_seqs={n}, n_q_heads={n_q_heads}, d={d}]")
    })?;
    Ok(n_c)
}

/// Runs `f(row, p, block_scores)` for every (sequence, KV head) row of a
/// checked paged decode (`width` wide), its group sums from the shared page
/// walk ([`super::paged::group_sums`]), on the crate's pool.
#[allow(clippy::too_many_arguments)]
fn run_paged<T: Send>(
    isa: Isa,
    q: Encoded<'_>,
    cache: &PagedCache<'_>,
    table: &BlockTable<'_>,
    n_c: &[usize],
    heads: Heads,
    cfg: &Config,
    out: &mut [T],
    width: usize,
    f: impl Fn(&mut [T], usize, &[f32]) + Sync + Send,
) {
    let Heads {
        n_q_heads,
        n_kv_heads,
        d,
    } = heads;
    let lens = table.seq_lens;
    let rows = BlockTable {
        table: table.table,
        max_blocks: table.max_blocks,
        seq_lens: n_c,
    };
    let g_heads = n_q_heads / n_kv_heads;
    let qv = decoded(q, None, 0);
    let most = n_c.iter().copied().max().unwrap_or(0);
    let work = g_heads * most.max(1) * d;
    crate::pool::for_each_row_mut(out, width, crate::pool::min_rows(work), |r, o| {
        let (s, g) = (r / n_kv_heads, r % n_kv_heads);
        let (len, c) = (lens[s], n_c[s]);
        let p = len - 1;
        // The dense call's `n_vis`: every compressed key of the sequence.
        let n_vis = cfg.geometry.visible(p).min(c);
        let row = super::paged::Row {
            s,
            g,
            q0: (s * n_q_heads + g * g_heads) * d,
            heads: g_heads,
            d,
        };
        super::paged::group_sums(isa, &qv, cache, &rows, row, n_vis, cfg.scale, |sums| {
            let mut blocks = vec![0.0f32; cfg.geometry.n_blocks(len)];
            block_scores(cfg, sums, c, p, &mut blocks);
            f(o, p, &blocks);
        });
    });
}
