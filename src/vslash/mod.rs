//! MInference's vertical-slash pattern: which key columns ("vertical
//! lines") and which diagonals ("slash lines") a prefill's queries read,
//! estimated from the last queries' attention.
//!
//! # The rule, as the source states it
//!
//! microsoft/MInference @fb56c917 `minference/modules/minference_forward.py`,
//! `vertical_and_slash_kernel` (the one in `minference_prefill_kernel`, and
//! its copies for the HF and vLLM paths, `gather_last_q_vertical_slash_topk_vllm`),
//! for one query head over a sequence of `L` tokens:
//!
//! 1. the last `n = min(64, L)` queries' scores `q_i · k_c / √d`, each
//!    query seeing the keys up to its own position (the causal mask
//!    `LAST_Q_MASK` on the last `n` columns: query `L − n + i` sees
//!    columns `0 ..= L − n + i`), and their softmax, row by row;
//! 2. **vertical** = the column sums of those probabilities (`qk.sum(-2)`),
//!    **slash** = their diagonal sums (`sum_all_diagonal_matrix`, cut to
//!    the `L` diagonals at or below the main one): the diagonal at offset
//!    `o = query − key >= 0` sums `p[i][L − n + i − o]` over the rows that
//!    reach it;
//! 3. the first 30 columns and the 100 diagonals nearest the main one
//!    (offsets `0 .. 100`) forced (set to `+inf`), then the top
//!    `min(L, max(v, 30))` columns and `min(L, max(s, 50))` diagonals
//!    (`torch.topk`); the diagonals are passed on as offsets,
//!    `(L − 1) − index`.
//!
//! Every query `p` of the prefill then reads the selected columns `c <= p`
//! and the keys `p − o >= 0` of the selected diagonals ([`rows_into`]).
//! The engines hand the two index sets, columns ascending and offsets
//! descending, to `convert_vertical_slash_indexes` (`csrc/vertical_slash_index.cu`;
//! `minference/ops/pit_sparse_flash_attention_v2.py`
//! `vertical_slash_sparse_attention` sorts them so), which lays them out
//! per 64-query block for the sparse kernel ([`layout_into`] computes that
//! layout; see its docs). vLLM's dual-chunk attention backend
//! (vllm-project/vllm @006e0acb `vllm/attention/backends/dual_chunk_flash_attn.py`:
//! `sparse_attention_last_q = 64`, its `last_q_mask`) carries the estimate;
//! the engines' kernels take a later form of the conversion
//! (`convert_vertical_slash_indexes(.., q_seqlens, kv_seqlens, ..,
//! causal)` in vLLM's `_custom_ops` and SGLang's `sgl_kernel`, MInference's
//! `_opt` path), which clips the ranges to the keys; that form is not
//! reproduced here ([`layout_into`] is `csrc/vertical_slash_index.cu`'s).
//!
//! **Variants.** [`Variant::Kernel`] is the above. [`Variant::Search`] is
//! the copy in `search_pattern_v2` (the offline pattern search): the
//! scores are **not** scaled by `1/√d`, and only the **30** nearest
//! diagonals are forced. (Its source takes the last 64 queries whatever
//! `L`, which fails below 64 tokens; here both variants take `min(64, L)`.)
//!
//! **Forced diagonals and `s < 100`.** With `s` between 50 and 99 the 100
//! forced diagonals do not all fit: `torch.topk` then chooses among equal
//! `+inf` scores, an order torch does not promise (on a CPU it kept the
//! main diagonal). kvselect keeps the **nearest** `s` (offsets `0 .. s`):
//! the total order below with a diagonal's id its offset.
//!
//! **One total order.** Candidates rank by score descending, ties to the
//! lower id (a column's id is its index, a diagonal's its offset), so the
//! chosen set does not depend on the selection algorithm. `L = 1`: the one
//! column and the main diagonal (the source's slice `[..., :-0]` is empty
//! there and its `topk` fails).
//!
//! # Numbers
//!
//! The core computes in float32 in one fixed order, the same bits at every
//! SIMD level: each score a chain of fused multiply-adds over `k = 0 .. d`
//! from `+0`, times `fl(1/√d)` (the search variant: times 1); `e = exp(s −
//! max)` with the project's `exp` (`crate::exp`, its bound in
//! `docs/kernels.md`, [`crate::exp::EXP_REL_ERR`]; the subtraction rounded
//! to float32); a row's sum `Z` in eight lanes (lane `l` the columns
//! `l, l + 8, …` in order, the lanes added
//! `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))`); `w = fl(1/Z)`; each probability `fl(e · w)`; each column
//! and diagonal sum adding its rows in ascending order. Keys are decoded
//! exactly (float32, float16, bfloat16, fp8 e4m3fn); an fp8 key with a
//! per-key scale is `fl(k · scale)`. The source's own precision is lower:
//! it rounds the scores to the inputs' dtype (bf16) before the softmax;
//! kvselect decides on float32 scores and is exact up to the bound below.
//!
//! **The error bound** (what the NumPy twin treats as a tie and `check`
//! allows; `kvselect.reference.vslash` computes it per candidate): with `u
//! = 2^-24`, `A = Σ_k |q_k k_k|` and `γ_m = m·u / (1 − m·u)`, a computed
//! score is within `E = A/√d · (γ_d (1 + u)^2 + 2u + u^2)` of the real one
//! (`A · γ_d` unscaled); `exp`'s argument carries a further `u · |s − max|`
//! (its rounding) and its value `EXP_REL_ERR`; so each `e` is within a
//! factor `exp(±δ)`, `δ = E + E_max + u · (|s − max| + 2 E_max) −
//! ln(1 − EXP_REL_ERR)`, of `exp(s − max)`, `Z` within the `p`-weighted mean
//! of those factors and `γ_{⌈L/8⌉ + 3}`, `w` and `e · w` one rounding each,
//! and the 64-term sums `γ_64`; a term whose argument is below
//! [`crate::exp::EXP_LO`] is flushed to 0, an absolute error under
//! `2^-126` a term. Why it holds: every step is one IEEE operation (or the
//! `exp` whose bound is exhaustive), and the bounds compose as products of
//! their factors. What would break it: a change to the summation orders or
//! a compiler contracting `a · b + c` into an FMA (Rust does not).
//!
//! # Memory and speed
//!
//! One head at a time per thread, in one buffer: the triangle of the last
//! queries' scores (`n · L − n(n − 1)/2` floats: at `n = 64`, 8,064 bytes
//! under `64 · L · 4`), written `4 × 16` scores at a time (the rows' next slots
//! prefetched for writing: 64 rows advance together, more streams than the
//! hardware follows) and turned into probabilities in place; the sums are
//! then written over scores already read (column `c`'s sum over row
//! `n − 2`'s slot `c`, diagonal `t`'s over row `n − 1`'s slot `t`, a
//! 256-column tile at a time, the diagonals still open in a 319-float
//! window), and the top-k runs on ids written over the rows before them.
//! Beyond it, per thread: a panel of sixteen keys (`16 · d` floats; 8 KiB at
//! `d = 128`), 2 KiB of decoded key elements for keys that are not float32,
//! and about 4 KiB of stack; per call, the selection is staged
//! (`n_heads · (nv + ns)` int32) so that a refusal writes nothing.
//! `benches/vslash.py` measures the call against NumPy's product of the
//! last 64 queries with the keys (docs/vertical-slash.md, "Speed").
//!
//! What would break it: the causal mask among the last queries (a query
//! reading keys after itself shifts mass onto late columns and onto
//! negative offsets), the diagonal offset's sign (`index − (L − 1)`
//! instead of `(L − 1) − index` selects keys after the query), the forced
//! parts dropped or counted twice — each a planted fault in the tests and a
//! case of `kvselect.testing`.

mod estimate;
mod kernels;
mod layout;
#[cfg(test)]
mod tests;

pub use layout::{layout_batch_into, layout_into, rows_into, LayoutBatch, LAYOUT_BLOCK};

use crate::error::{check_len, checked_size, ArgumentError};
use crate::keys::Encoded;
use crate::simd::Isa;
use estimate::Head;

/// Runs the kernel families at `isa` (the reach test's probe).
#[cfg(test)]
pub(crate) fn dispatch_probe(isa: Isa) {
    kernels::probe(isa)
}

/// The last queries the estimate reads (`last_q = 64`).
pub const LAST_Q: usize = 64;
/// The leading columns forced (`vertical[..., :30] = inf`), and the least
/// number of columns taken.
pub const FORCED_COLUMNS: usize = 30;
/// The least number of diagonals taken (`max(slash_size, 50)`).
pub const MIN_SLASHES: usize = 50;

/// Which copy of the estimate (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Variant {
    /// `vertical_and_slash_kernel`: scores scaled by `1/√d`, the 100
    /// nearest diagonals forced.
    Kernel,
    /// `search_pattern_v2`'s copy: unscaled scores, 30 diagonals forced.
    Search,
}

impl Variant {
    /// The name Python uses (`"kernel"`, `"search"`).
    pub fn name(self) -> &'static str {
        match self {
            Variant::Kernel => "kernel",
            Variant::Search => "search",
        }
    }

    /// The variant of that name.
    pub fn from_name(name: &str) -> Option<Variant> {
        [Variant::Kernel, Variant::Search]
            .into_iter()
            .find(|v| v.name() == name)
    }

    /// Diagonals forced, nearest first.
    pub fn forced_slashes(self) -> usize {
        match self {
            Variant::Kernel => 100,
            Variant::Search => 30,
        }
    }

    /// The factor the scores are multiplied by: `fl(1/√d)`, or 1.
    pub fn scale(self, d: usize) -> f32 {
        match self {
            Variant::Kernel => (1.0 / (d as f64).sqrt()) as f32,
            Variant::Search => 1.0,
        }
    }
}

/// The queries the estimate reads at `seq_len` tokens: `min(64, seq_len)`.
pub fn last_queries(seq_len: usize) -> usize {
    seq_len.min(LAST_Q)
}

/// Columns and diagonals taken: `(min(L, max(v, 30)), min(L, max(s, 50)))`.
pub fn sizes(seq_len: usize, vertical_size: usize, slash_size: usize) -> (usize, usize) {
    (
        seq_len.min(vertical_size.max(FORCED_COLUMNS)),
        seq_len.min(slash_size.max(MIN_SLASHES)),
    )
}

/// The shape of one call: `n_heads` query heads over `n_kv_heads` KV
/// heads of `d`, a sequence of `seq_len` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub d: usize,
    pub seq_len: usize,
}

/// The checked inputs of one call.
struct Inputs<'a> {
    q: &'a [f32],
    keys: Encoded<'a>,
    key_scale: Option<&'a [f32]>,
    shape: Shape,
    variant: Variant,
}

impl<'a> Inputs<'a> {
    fn new(
        q: &'a [f32],
        keys: Encoded<'a>,
        key_scale: Option<&'a [f32]>,
        shape: Shape,
        variant: Variant,
    ) -> Result<Inputs<'a>, ArgumentError> {
        let Shape {
            n_heads,
            n_kv_heads,
            d,
            seq_len,
        } = shape;
        for (argument, v) in [
            ("n_heads", n_heads),
            ("n_kv_heads", n_kv_heads),
            ("d", d),
            ("seq_len", seq_len),
        ] {
            if v == 0 {
                return Err(ArgumentError::Invalid {
                    argument,
                    message: format!("{argument} must be at least 1"),
                });
            }
        }
        if n_heads % n_kv_heads != 0 {
            return Err(ArgumentError::Invalid {
                argument: "n_kv_heads",
                message: format!(
                    "n_heads ({n_heads}) must be a multiple of n_kv_heads ({n_kv_heads})"
                ),
            });
        }
        let n = last_queries(seq_len);
        let want = checked_size("q", &[n_heads, n, d])?;
        check_len("q", q.len(), want, || {
            format!("[n_heads={n_heads}, min(64, seq_len)={n}, d={d}]")
        })?;
        let want = checked_size("keys", &[seq_len, n_kv_heads, d])?;
        check_len("keys", keys.len(), want, || {
            format!("[seq_len={seq_len}, n_kv_heads={n_kv_heads}, d={d}]")
        })?;
        if let Some(s) = key_scale {
            check_len("key_scale", s.len(), seq_len, || {
                format!("[seq_len={seq_len}]")
            })?;
        }
        if let Some(i) = q.iter().position(|x| !x.is_finite()) {
            return Err(ArgumentError::OutOfRange {
                argument: "q",
                index: i,
                message: format!("q[{i}] is not finite ({})", q[i]),
            });
        }
        // The per-head buffer's size (the triangle) must be addressable.
        checked_size("keys", &[n, seq_len])?;
        Ok(Inputs {
            q,
            keys,
            key_scale,
            shape,
            variant,
        })
    }

    fn head(&self, h: usize) -> Head<'a> {
        let Shape {
            n_heads,
            n_kv_heads,
            d,
            seq_len,
        } = self.shape;
        let n = last_queries(seq_len);
        Head {
            q: &self.q[h * n * d..(h + 1) * n * d],
            keys: self.keys,
            key_scale: self.key_scale,
            g: h / (n_heads / n_kv_heads),
            n_kv_heads,
            d,
            seq_len,
            variant: self.variant,
        }
    }
}

fn check_out(
    argument: &'static str,
    got: usize,
    want: usize,
    shape: impl FnOnce() -> String,
) -> Result<(), ArgumentError> {
    if got != want {
        return Err(ArgumentError::OutputSize {
            argument,
            expected: want,
            actual: got,
            shape: shape(),
        });
    }
    Ok(())
}

/// Runs `f(head, buffer, row)` on every head's `width`-wide row of `rows`
/// (`width >= 1`), the heads cut into one run per thread, each run reusing
/// one buffer; returns the first refusal (by head), or `Ok`.
fn per_head<F>(n_heads: usize, width: usize, rows: &mut [i32], f: F) -> Result<(), ArgumentError>
where
    F: Fn(usize, &mut Vec<f32>, &mut [i32]) -> Result<(), ArgumentError> + Sync + Send,
{
    let threads = crate::pool::num_threads().clamp(1, n_heads.max(1));
    let per_run = n_heads.div_ceil(threads).max(1);
    let run = |(r, chunk): (usize, &mut [i32])| -> Result<(), ArgumentError> {
        let mut buf = Vec::new();
        for (j, row) in chunk.chunks_mut(width).enumerate() {
            f(r * per_run + j, &mut buf, row)?;
        }
        Ok(())
    };
    let step = per_run * width;
    let results: Vec<Result<(), ArgumentError>> = crate::pool::install(|parallel| {
        if parallel {
            use rayon::prelude::*;
            rows.par_chunks_mut(step).enumerate().map(run).collect()
        } else {
            rows.chunks_mut(step).enumerate().map(run).collect()
        }
    });
    results.into_iter().collect()
}

/// The vertical-slash selection of every query head: `vertical_out`
/// `[n_heads, nv]` the columns ascending, `slash_out` `[n_heads, ns]` the
/// diagonal offsets (`query − key`) ascending, `(nv, ns) = sizes(L, v, s)`.
///
/// `q` `[n_heads, min(64, L), d]` float32: the last queries of each head
/// (query `i` at position `L − n + i`); `keys` `[L, n_kv_heads, d]` in any
/// key format, read in place; `key_scale` `[L]`, a per-key scale (fp8 keys).
/// Query head `h` reads KV head `h / (n_heads / n_kv_heads)`.
///
/// # Errors
/// A zero in the shape, heads not a multiple (`n_kv_heads`), an array of
/// another size (`q`, `keys`, `key_scale`, `vertical_out`, `slash_out`), a
/// query not finite (`q`), a score not finite (`keys`). Nothing is
/// written unless every head succeeds.
#[allow(clippy::too_many_arguments)]
pub fn select_into(
    q: &[f32],
    keys: Encoded<'_>,
    key_scale: Option<&[f32]>,
    shape: Shape,
    variant: Variant,
    vertical_size: usize,
    slash_size: usize,
    vertical_out: &mut [i32],
    slash_out: &mut [i32],
) -> Result<(), ArgumentError> {
    select_at(
        Isa::best(),
        q,
        keys,
        key_scale,
        shape,
        variant,
        vertical_size,
        slash_size,
        vertical_out,
        slash_out,
    )
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn select_at(
    isa: Isa,
    q: &[f32],
    keys: Encoded<'_>,
    key_scale: Option<&[f32]>,
    shape: Shape,
    variant: Variant,
    vertical_size: usize,
    slash_size: usize,
    vertical_out: &mut [i32],
    slash_out: &mut [i32],
) -> Result<(), ArgumentError> {
    let inputs = Inputs::new(q, keys, key_scale, shape, variant)?;
    let (h_n, l) = (shape.n_heads, shape.seq_len);
    let (nv, ns) = sizes(l, vertical_size, slash_size);
    check_out("vertical_out", vertical_out.len(), h_n * nv, || {
        format!("[n_heads={h_n}, nv={nv}]")
    })?;
    check_out("slash_out", slash_out.len(), h_n * ns, || {
        format!("[n_heads={h_n}, ns={ns}]")
    })?;
    let width = nv + ns;
    let mut rows = vec![0i32; h_n * width];
    per_head(h_n, width, &mut rows, |h, buf, row| {
        let (v_row, s_row) = row.split_at_mut(nv);
        select_head(isa, inputs.head(h), nv, ns, buf, v_row, s_row)
    })?;
    for (h, row) in rows.chunks(width.max(1)).enumerate().take(h_n) {
        vertical_out[h * nv..(h + 1) * nv].copy_from_slice(&row[..nv]);
        slash_out[h * ns..(h + 1) * ns].copy_from_slice(&row[nv..]);
    }
    Ok(())
}

/// One head's selection (see [`select_into`]).
fn select_head(
    isa: Isa,
    h: Head<'_>,
    nv: usize,
    ns: usize,
    buf: &mut Vec<f32>,
    v_out: &mut [i32],
    s_out: &mut [i32],
) -> Result<(), ArgumentError> {
    let l = h.seq_len;
    if l == 1 {
        single_score(isa, h)?;
        v_out.fill(0);
        s_out.fill(0);
        return Ok(());
    }
    let sums = estimate::sums(isa, h, buf)?;
    let forced_s = h.variant.forced_slashes();
    let (scratch, rest) = buf.split_at_mut(sums.vert);
    let rest: &[f32] = rest;
    let base = sums.vert;
    let vertical = |c: usize| {
        if c < FORCED_COLUMNS {
            f32::INFINITY
        } else if c + 1 == l {
            sums.v_last
        } else {
            rest[sums.vert - base + c]
        }
    };
    let slash = |o: usize| {
        if o < forced_s {
            f32::INFINITY
        } else {
            rest[sums.slash - base + l - 1 - o]
        }
    };
    let mut own = Vec::new();
    let ids: &mut [u32] = if scratch.len() >= l {
        bytemuck::cast_slice_mut(scratch)
    } else {
        own.resize(l, 0u32);
        &mut own
    };
    estimate::top(l, nv, vertical, ids, v_out);
    estimate::top(l, ns, slash, ids, s_out);
    Ok(())
}

/// At `L = 1` the one score only needs to be finite (its probability is 1).
fn single_score(isa: Isa, h: Head<'_>) -> Result<(), ArgumentError> {
    let d = h.d;
    let mut panel = vec![0.0f32; d * kernels::COLS];
    let mut key = vec![0.0f32; d];
    h.keys.decode_at(isa, h.g * d, &mut key);
    if let Some(s) = h.key_scale {
        key.iter_mut().for_each(|x| *x *= s[0]);
    }
    for k in 0..d {
        panel[k * kernels::COLS] = key[k];
    }
    let rows = [h.q; kernels::ROWS];
    let mut out = [0.0f32; 1];
    let mut valid = [0; kernels::ROWS];
    valid[0] = 1;
    let (mut m, mut finite) = ([f32::NEG_INFINITY; kernels::ROWS], true);
    let c = h.variant.scale(d);
    let at = [0; kernels::ROWS];
    let (dst, vm) = (&mut out[..], (&valid, &at));
    kernels::tile(
        isa,
        &rows,
        &panel,
        d,
        c,
        vm.0,
        dst,
        vm.1,
        &mut m,
        &mut finite,
    );
    if !finite {
        return Err(ArgumentError::Invalid {
            argument: "keys",
            message: "a score q·k (scaled) is not finite: NaN or infinite keys or key_scale, \
                      or a product past float32's range"
                .into(),
        });
    }
    Ok(())
}

/// The estimate's column sums `vertical_out` `[n_heads, L]` and diagonal
/// sums `slash_out` `[n_heads, L]` (by offset `o = query − key`), before
/// anything is forced: what [`select_into`] ranks.
///
/// # Errors
/// As [`select_into`] (the outputs named `vertical_out`, `slash_out`).
pub fn scores_into(
    q: &[f32],
    keys: Encoded<'_>,
    key_scale: Option<&[f32]>,
    shape: Shape,
    variant: Variant,
    vertical_out: &mut [f32],
    slash_out: &mut [f32],
) -> Result<(), ArgumentError> {
    scores_at(
        Isa::best(),
        q,
        keys,
        key_scale,
        shape,
        variant,
        vertical_out,
        slash_out,
    )
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn scores_at(
    isa: Isa,
    q: &[f32],
    keys: Encoded<'_>,
    key_scale: Option<&[f32]>,
    shape: Shape,
    variant: Variant,
    vertical_out: &mut [f32],
    slash_out: &mut [f32],
) -> Result<(), ArgumentError> {
    let inputs = Inputs::new(q, keys, key_scale, shape, variant)?;
    let (h_n, l) = (shape.n_heads, shape.seq_len);
    let want = checked_size("vertical_out", &[h_n, l])?;
    check_out("vertical_out", vertical_out.len(), want, || {
        format!("[n_heads={h_n}, seq_len={l}]")
    })?;
    check_out("slash_out", slash_out.len(), want, || {
        format!("[n_heads={h_n}, seq_len={l}]")
    })?;
    let mut v = vec![0.0f32; want];
    let mut s = vec![0.0f32; want];
    let mut buf = Vec::new();
    for h in 0..h_n {
        let head = inputs.head(h);
        let (vr, sr) = (&mut v[h * l..(h + 1) * l], &mut s[h * l..(h + 1) * l]);
        if l == 1 {
            single_score(isa, head)?;
            vr[0] = 1.0;
            sr[0] = 1.0;
            continue;
        }
        let sums = estimate::sums(isa, head, &mut buf)?;
        for c in 0..l {
            vr[c] = sums.vertical(&buf, l, c);
            sr[c] = sums.slash(&buf, l, c);
        }
    }
    vertical_out.copy_from_slice(&v);
    slash_out.copy_from_slice(&s);
    Ok(())
}
