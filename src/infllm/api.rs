//! The checked entry points: block scores and rows of the queries at the
//! end of one sequence.

use super::score::{block_scores, group_sums, Packed, Scratch};
use super::{select, Config};
use crate::error::{check_len, checked_size, ArgumentError};
use crate::keys::Encoded;
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

#[allow(clippy::too_many_arguments)]
fn check(
    q_len: usize,
    n_q_heads: usize,
    ck_len: usize,
    ck_scale: Option<&[f32]>,
    n_kv_heads: usize,
    d: usize,
    seq_len: usize,
    cfg: &Config,
) -> Result<Shape, ArgumentError> {
    let invalid =
        |argument: &'static str, message: String| ArgumentError::Invalid { argument, message };
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
    if seq_len == 0 {
        return Err(invalid(
            "seq_len",
            "seq_len must be at least 1 (the query's own token)".into(),
        ));
    }
    cfg.geometry.check()?;
    if !cfg.scale.is_finite() {
        return Err(invalid(
            "scale",
            format!("scale must be finite, got {}", cfg.scale),
        ));
    }
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
    let ck = decoded(ck, ck_scale, sh.n_kv * d);
    let packed: Vec<Packed> = (0..sh.n_kv)
        .map(|g| Packed::new(isa, &ck, sh.n_c, sh.n_kv, g, d))
        .collect();
    let work = g_heads * sh.n_c.max(1) * d;
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
#[allow(clippy::too_many_arguments)]
pub fn block_scores_into(
    q: Encoded<'_>,
    n_q_heads: usize,
    ck: Encoded<'_>,
    ck_scale: Option<&[f32]>,
    n_kv_heads: usize,
    d: usize,
    seq_len: usize,
    cfg: &Config,
    out: &mut [f32],
) -> Result<(), ArgumentError> {
    block_scores_at(
        Isa::best(),
        q,
        n_q_heads,
        ck,
        ck_scale,
        n_kv_heads,
        d,
        seq_len,
        cfg,
        out,
    )
}

/// [`block_scores_into`] at `isa` (the tests' way to every level).
#[allow(clippy::too_many_arguments)]
pub(super) fn block_scores_at(
    isa: Isa,
    q: Encoded<'_>,
    n_q_heads: usize,
    ck: Encoded<'_>,
    ck_scale: Option<&[f32]>,
    n_kv_heads: usize,
    d: usize,
    seq_len: usize,
    cfg: &Config,
    out: &mut [f32],
) -> Result<(), ArgumentError> {
    let sh = check(
        q.len(),
        n_q_heads,
        ck.len(),
        ck_scale,
        n_kv_heads,
        d,
        seq_len,
        cfg,
    )?;
    let nb = cfg.geometry.n_blocks(seq_len);
    check_out(
        out.len(),
        checked_size("out", &[sh.n_q, sh.n_kv, nb])?,
        || format!("[n_q={}, n_kv_heads={}, n_blocks={nb}]", sh.n_q, sh.n_kv),
    )?;
    run(isa, &sh, q, ck, ck_scale, cfg, out, nb, |row, _, blocks| {
        row.copy_from_slice(blocks)
    });
    Ok(())
}

/// The blocks each query reads: `out[i, g]` (`[n_q, n_kv_heads, top_k]`,
/// `int32`) the top `min(top_k, n_blocks)` blocks of
/// [`block_scores_into`]'s row in the total order, the ids the variant's
/// filter drops removed, ascending, `-1` padded.
///
/// # Errors
/// `top_k` 0 (`topk`), and as [`block_scores_into`].
#[allow(clippy::too_many_arguments)]
pub fn select_into(
    q: Encoded<'_>,
    n_q_heads: usize,
    ck: Encoded<'_>,
    ck_scale: Option<&[f32]>,
    n_kv_heads: usize,
    d: usize,
    seq_len: usize,
    cfg: &Config,
    out: &mut [i32],
) -> Result<(), ArgumentError> {
    if cfg.top_k == 0 {
        return Err(ArgumentError::Invalid {
            argument: "topk",
            message: "topk must be at least 1 block".into(),
        });
    }
    let sh = check(
        q.len(),
        n_q_heads,
        ck.len(),
        ck_scale,
        n_kv_heads,
        d,
        seq_len,
        cfg,
    )?;
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
        Isa::best(),
        &sh,
        q,
        ck,
        ck_scale,
        cfg,
        out,
        cfg.top_k,
        |row, p, blocks| {
            let mut ids = Vec::new();
            select::row(
                blocks,
                cfg.top_k,
                cfg.keep,
                p / cfg.geometry.block_size,
                &mut ids,
                row,
            );
        },
    );
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
