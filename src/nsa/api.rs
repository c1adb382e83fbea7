//! The checked entry points: compressed keys, block scores and rows of the
//! queries at the end of one sequence, and of a packed batch of sequences.

use super::{block_scores, row, row2, Config, Window};
use crate::error::{check_len, checked_size, ArgumentError};
use crate::infllm::heads::{self, in_lanes, Rows};
use crate::infllm::panels::{self, Panels};
use crate::infllm::score::{group_sums, Packed, Scratch};
use crate::keys::{Encoded, Heads};
use crate::simd::lines::Floats;
use crate::simd::Isa;

/// A call's checked sizes.
pub(super) struct Shape {
    n_q: usize,
    hq: usize,
    n_kv: usize,
    d: usize,
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

/// The sizes every call checks first, in this order: `d`, `n_kv_heads`
/// and `block_size` at least 1.
pub(super) fn check_sizes(
    n_kv_heads: usize,
    d: usize,
    block_size: usize,
) -> Result<(), ArgumentError> {
    if d == 0 {
        return Err(invalid("d", "d must be at least 1".into()));
    }
    if n_kv_heads == 0 {
        return Err(invalid(
            "n_kv_heads",
            "n_kv_heads must be at least 1".into(),
        ));
    }
    if block_size == 0 {
        return Err(invalid(
            "block_size",
            "block_size must be at least 1".into(),
        ));
    }
    Ok(())
}

/// `q`'s heads a positive multiple of the KV heads, then the scale finite
/// (`n_kv_heads` already checked nonzero).
pub(super) fn check_heads(heads: Heads, cfg: &Config) -> Result<(), ArgumentError> {
    let Heads {
        n_q_heads,
        n_kv_heads,
        ..
    } = heads;
    if n_q_heads == 0 || !n_q_heads.is_multiple_of(n_kv_heads) {
        return Err(invalid(
            "q",
            format!(
                "q's {n_q_heads} heads are not a positive multiple of the {n_kv_heads} KV heads"
            ),
        ));
    }
    if !cfg.scale.is_finite() {
        return Err(invalid(
            "scale",
            format!("scale must be finite, got {}", cfg.scale),
        ));
    }
    Ok(())
}

/// Checks the keys' shape and scales and the block size; returns `seq_len`.
fn check_keys(
    k_len: usize,
    k_scale: Option<&[f32]>,
    n_kv_heads: usize,
    d: usize,
    block_size: usize,
) -> Result<usize, ArgumentError> {
    check_sizes(n_kv_heads, d, block_size)?;
    let per = checked_size("k", &[n_kv_heads, d])?;
    if k_len == 0 || !k_len.is_multiple_of(per) {
        return Err(invalid(
            "k",
            format!("k holds {k_len} values, not a positive number of [n_kv_heads={n_kv_heads}, d={d}] tokens"),
        ));
    }
    let seq_len = k_len / per;
    if let Some(s) = k_scale {
        check_len("k_scale", s.len(), seq_len, || {
            format!("[seq_len={seq_len}]")
        })?;
    }
    Ok(seq_len)
}

fn check(
    q_len: usize,
    k_len: usize,
    k_scale: Option<&[f32]>,
    heads: Heads,
    cfg: &Config,
) -> Result<Shape, ArgumentError> {
    let seq_len = check_keys(k_len, k_scale, heads.n_kv_heads, heads.d, cfg.block_size)?;
    check_queries(q_len, heads, seq_len, cfg)
}

/// Checks the queries' heads and count against `seq_len` tokens and the
/// scale (`d`, `n_kv_heads` already checked nonzero); returns the shape.
fn check_queries(
    q_len: usize,
    heads: Heads,
    seq_len: usize,
    cfg: &Config,
) -> Result<Shape, ArgumentError> {
    check_heads(heads, cfg)?;
    let Heads {
        n_q_heads,
        n_kv_heads,
        d,
    } = heads;
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
            format!("{n_q} queries but {seq_len} tokens of keys: the queries are the sequence's last tokens"),
        ));
    }
    Ok(Shape {
        n_q,
        hq: n_q_heads,
        n_kv: n_kv_heads,
        d,
        seq_len,
    })
}

/// A call on given compressed keys, checked: its shape and `n_c`.
pub(super) type CompressedCall = (Shape, usize);

/// Checks a call on given compressed keys: the sizes, `seq_len` (at least
/// 1), `ck` exactly `seq_len`'s compressed keys under `window`, `ck_scale`
/// one per compressed key, then the queries; returns the shape and `n_c`.
pub(super) fn check_compressed(
    q_len: usize,
    ck_len: usize,
    ck_scale: Option<&[f32]>,
    heads: Heads,
    seq_len: usize,
    (cfg, window): (&Config, Window),
) -> Result<CompressedCall, ArgumentError> {
    let Heads { n_kv_heads, d, .. } = heads;
    check_sizes(n_kv_heads, d, cfg.block_size)?;
    window.check(cfg.block_size)?;
    crate::packed::check_seq_len(seq_len)?;
    let n_c = window.geometry(cfg.block_size).compressed_len(seq_len);
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
    let sh = check_queries(q_len, heads, seq_len, cfg)?;
    Ok((sh, n_c))
}

/// The compressed keys, unchecked: `out` (`[n_c, n_kv, d]`) key `c` the
/// float32 mean of the rows of tokens `c·stride .. c·stride + kernel`
/// (fla's window: `kernel = stride = bs`, each complete block's mean),
/// summed in token order, each row decoded in place and times its token's
/// scale.
///
/// Each element's sum is its own chain (token order, then the division), so
/// the loops may run in any order: they take a token's whole row (`n_kv ·
/// d`, contiguous) once, front to back, and add it into every key whose
/// window holds the token (one for fla's window; `kernel / stride` for
/// overlapping windows, Eq. 9's two, added in one pass over the row: the
/// row loaded once for both sums), each key's `[n_kv, d]` contiguous; a
/// key is divided when its last token is in. The keys a token adds into
/// are kept as the tokens advance (no division a token). So the keys
/// stream from memory once (the AVX-512 body asking for each row
/// [`ROWS_AHEAD`] tokens before it reads it: [`rows_ahead`]), and each row
/// is decoded once, float32 rows read in place. (A KV head at a time, rows
/// `n_kv · d` apart, read the keys several times slower; a key at a time
/// read and decoded Eq. 9's rows twice: the same bits.)
///
/// At `isa`'s width (one body, each level compiling it with its own
/// instructions: elementwise additions, products and divisions, no fused
/// multiply-add, so the bits are the same at every level).
fn compress(
    isa: Isa,
    k: Encoded<'_>,
    k_scale: Option<&[f32]>,
    n_kv: usize,
    d: usize,
    ks: (usize, usize),
    out: &mut [f32],
) {
    let n_c = out.len() / (n_kv * d).max(1);
    compress_ring(
        isa,
        k,
        k_scale,
        n_kv,
        d,
        ks,
        (n_c, usize::MAX, rows_ahead(isa)),
        out,
        &mut |_, _, _| {},
    )
}

/// [`compress`] of `n_c` keys into `out`, key `c` at slot `c & mask`
/// (`usize::MAX`: every key its own slot; a power of two less one: a ring
/// of as many slots, each reused once its key was handed on), calling
/// `step(t, done, out)` after each token `t`, `done` the key its row
/// completed (divided), if any.
#[allow(clippy::too_many_arguments)]
fn compress_ring<F: FnMut(usize, Option<usize>, &[f32])>(
    isa: Isa,
    k: Encoded<'_>,
    k_scale: Option<&[f32]>,
    n_kv: usize,
    d: usize,
    ks: (usize, usize),
    n_c: (usize, usize, usize),
    out: &mut [f32],
    step: &mut F,
) {
    // SAFETY (bounds): none; the body slices its arguments (checked indexing).
    crate::simd::dispatch!("nsa.compress", isa, {
        avx512(token) => x86::compress_avx512(token, k, k_scale, n_kv, d, ks, n_c, out, step),
        avx2(token) => x86::compress_avx2(token, k, k_scale, n_kv, d, ks, n_c, out, step),
        scalar => compress_body(k, k_scale, n_kv, d, ks, n_c, out, step),
    })
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::compress_body;
    use crate::keys::Encoded;
    use crate::simd::{Avx2, Avx512};

    /// [`compress_body`] compiled for AVX-512 (the token proves the CPU has it).
    #[target_feature(enable = "avx512f,avx512bw,avx2")]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn compress_avx512<F: FnMut(usize, Option<usize>, &[f32])>(
        _: Avx512,
        k: Encoded<'_>,
        k_scale: Option<&[f32]>,
        n_kv: usize,
        d: usize,
        ks: (usize, usize),
        n_c: (usize, usize, usize),
        out: &mut [f32],
        step: &mut F,
    ) {
        compress_body(k, k_scale, n_kv, d, ks, n_c, out, step)
    }

    /// [`compress_body`] compiled for AVX2 (the token proves the CPU has it).
    #[target_feature(enable = "avx2")]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn compress_avx2<F: FnMut(usize, Option<usize>, &[f32])>(
        _: Avx2,
        k: Encoded<'_>,
        k_scale: Option<&[f32]>,
        n_kv: usize,
        d: usize,
        ks: (usize, usize),
        n_c: (usize, usize, usize),
        out: &mut [f32],
        step: &mut F,
    ) {
        compress_body(k, k_scale, n_kv, d, ks, n_c, out, step)
    }
}

/// [`compress`], for the tests.
#[cfg(test)]
pub(super) fn compress_at(
    isa: Isa,
    k: Encoded<'_>,
    k_scale: Option<&[f32]>,
    n_kv: usize,
    d: usize,
    ks: (usize, usize),
    out: &mut [f32],
) {
    compress(isa, k, k_scale, n_kv, d, ks, out)
}

/// Runs the `nsa.compress` family at `isa` once (the reach test's probe).
#[cfg(test)]
pub(super) fn probe(isa: Isa) {
    let k: Vec<f32> = (0..12).map(|t| t as f32).collect(); // [12 tokens, 1 head, d = 1]
    let mut out = [0.0f32; 5];
    compress(isa, Encoded::F32(&k), None, 1, 1, (4, 2), &mut out);
    assert_eq!(out, [1.5, 3.5, 5.5, 7.5, 9.5]);
}

/// [`compress_ring`]'s body, written once.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn compress_body<F: FnMut(usize, Option<usize>, &[f32])>(
    k: Encoded<'_>,
    k_scale: Option<&[f32]>,
    n_kv: usize,
    d: usize,
    (kernel, stride): (usize, usize),
    (n_c, mask, ahead): (usize, usize, usize),
    out: &mut [f32],
    step: &mut F,
) {
    let w = n_kv * d;
    #[cfg(target_arch = "x86_64")]
    let (kb, row_bytes) = {
        let kb = key_bytes(k);
        (kb, kb.len() / k.len().max(1) * w)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = ahead;
    if n_c == 0 {
        return;
    }
    let mut buf = vec![0.0f32; if matches!(k, Encoded::F32(_)) { 0 } else { w }];
    let div = kernel as f32;
    let end = (n_c - 1) * stride + kernel;
    // No fill: a key's first token (`t = c·stride`) sets it to `+0.0 + x`,
    // the same bits as adding `x` to a key filled with `+0.0` (a fill of
    // Eq. 9's 16 MiB of keys at 131,072 tokens was a pass over memory of its
    // own).
    //
    // The keys whose window holds token `t` (`c·stride <= t < c·stride +
    // kernel`) are `lo..=hi`, kept as `t` advances (no division a token).
    let (mut lo, mut hi) = (0usize, 0usize);
    for t in 0..end {
        while hi + 1 < n_c && (hi + 1) * stride <= t {
            hi += 1;
        }
        while lo * stride + kernel <= t {
            lo += 1;
        }
        // Row `t + ahead` asked into the second-level cache.
        #[cfg(target_arch = "x86_64")]
        if ahead > 0 {
            let at = (t + ahead) * row_bytes;
            crate::keys::prefetch(kb, at, at + row_bytes, crate::keys::CacheLevel::L2);
        }
        let rows: &[f32] = match k {
            Encoded::F32(s) => &s[t * w..(t + 1) * w],
            _ => {
                k.decode(t * w, &mut buf);
                &buf
            }
        };
        if hi == lo + 1 {
            // Two keys (Eq. 9's windows overlap by half): the row read once
            // for both, each element added into `lo`'s sum and set or added
            // into `hi`'s (its first token when `t = hi·stride`; `lo` began
            // before). The same chains (each product `x · s` the same
            // rounding), a load of the row fewer an element.
            let (a, b) = two_slots(out, lo & mask, hi & mask, w);
            add_two(a, b, rows, k_scale.map(|s| s[t]), hi * stride == t);
        } else {
            for c in lo..=hi {
                let at = c & mask;
                let acc = &mut out[at * w..(at + 1) * w];
                match (k_scale, c * stride == t) {
                    (Some(sc), false) => {
                        let s = sc[t];
                        acc.iter_mut().zip(rows).for_each(|(a, &x)| *a += x * s);
                    }
                    (Some(sc), true) => {
                        let s = sc[t];
                        acc.iter_mut()
                            .zip(rows)
                            .for_each(|(a, &x)| *a = 0.0 + x * s);
                    }
                    (None, false) => acc.iter_mut().zip(rows).for_each(|(a, &x)| *a += x),
                    (None, true) => acc.iter_mut().zip(rows).for_each(|(a, &x)| *a = 0.0 + x),
                }
            }
        }
        let done = t + 1 == lo * stride + kernel;
        if done {
            let at = lo & mask;
            out[at * w..(at + 1) * w].iter_mut().for_each(|a| *a /= div);
        }
        step(t, done.then_some(lo), out);
    }
}

/// Slots `a` and `b` (distinct) of `out`, `w` floats each, both mutable.
#[inline(always)]
fn two_slots(out: &mut [f32], a: usize, b: usize, w: usize) -> (&mut [f32], &mut [f32]) {
    assert_ne!(a, b, "two keys in one slot");
    if a < b {
        let (x, y) = out.split_at_mut(b * w);
        (&mut x[a * w..][..w], &mut y[..w])
    } else {
        let (x, y) = out.split_at_mut(a * w);
        (&mut y[..w], &mut x[b * w..][..w])
    }
}

/// A token's `row` (times `scale`, if any) added into two keys' sums: `a`
/// (`a + x`) and `b` (`0.0 + x` when `b_first`, its window's first token,
/// else `b + x`), each element's product `x · s` rounded once and added to
/// both: the bits of two passes, one a key.
#[inline(always)]
fn add_two(a: &mut [f32], b: &mut [f32], row: &[f32], scale: Option<f32>, b_first: bool) {
    let n = row.len();
    let (a, b) = (&mut a[..n], &mut b[..n]);
    // One loop a case, each vectorised over the three slices.
    match (scale, b_first) {
        (None, false) => {
            for i in 0..n {
                a[i] += row[i];
                b[i] += row[i];
            }
        }
        (None, true) => {
            for i in 0..n {
                a[i] += row[i];
                b[i] = 0.0 + row[i];
            }
        }
        (Some(s), false) => {
            for i in 0..n {
                let x = row[i] * s;
                a[i] += x;
                b[i] += x;
            }
        }
        (Some(s), true) => {
            for i in 0..n {
                let x = row[i] * s;
                a[i] += x;
                b[i] = 0.0 + x;
            }
        }
    }
}

/// The compressed keys of `k` (`[seq_len, n_kv_heads, d]`, any key format,
/// optionally each token's row times `k_scale[t]`): `out` (`[seq_len /
/// block_size, n_kv_heads, d]`) block `c`'s mean over tokens `c·bs ..
/// (c + 1)·bs`, the complete blocks only.
///
/// # Errors
/// A zero `d`, `n_kv_heads` or `block_size` (named), `k` not whole tokens
/// (`k`), `k_scale` not one per token, `out` of another size (`out`).
pub fn compress_into(
    k: Encoded<'_>,
    k_scale: Option<&[f32]>,
    n_kv_heads: usize,
    d: usize,
    block_size: usize,
    out: &mut [f32],
) -> Result<(), ArgumentError> {
    let seq_len = check_keys(k.len(), k_scale, n_kv_heads, d, block_size)?;
    let n_c = seq_len / block_size;
    check_out(out.len(), n_c * n_kv_heads * d, || {
        format!("[n_c={n_c}, n_kv_heads={n_kv_heads}, d={d}]")
    })?;
    compress(
        Isa::best(),
        k,
        k_scale,
        n_kv_heads,
        d,
        (block_size, block_size),
        out,
    );
    Ok(())
}

/// Runs `f(row, block_scores, ids)` for every query `i` and KV head `g`
/// (row `i · n_kv + g` of `out`, `width` wide) on the keys' compressed keys,
/// on the crate's pool (`ids` is scratch for the row's top-k).
#[allow(clippy::too_many_arguments)]
fn run<T: Send>(
    isa: Isa,
    sh: &Shape,
    q: Encoded<'_>,
    k: Encoded<'_>,
    k_scale: Option<&[f32]>,
    (cfg, window): (&Config, Window),
    out: &mut [T],
    width: usize,
    f: impl RowOut<T>,
) {
    let geo = window.geometry(cfg.block_size);
    let n_c = geo.compressed_len(sh.seq_len);
    if fuses(sh, window, n_c) {
        return run_fused(isa, sh, q, k, k_scale, (cfg, window), out, width, f);
    }
    // A fresh buffer each call, not one the thread keeps: its pages come
    // zeroed from the kernel as it is written, while a kept one's cold lines
    // were each read from memory before their first store (decode from the
    // keys 5-8% slower, AMD EPYC Zen 3).
    let mut ck = vec![0.0f32; n_c * sh.n_kv * sh.d];
    let kernel = (geo.kernel_size, geo.kernel_stride);
    compress(isa, k, k_scale, sh.n_kv, sh.d, kernel, &mut ck);
    stage(
        isa,
        sh,
        q,
        Keys::F32(&ck),
        n_c,
        (cfg, window),
        out,
        width,
        f,
    );
}

/// The most queries [`run_fused`] takes (a decode's few; a prefill's
/// queries each see few keys and are many: [`stage`] runs them in
/// parallel).
const FUSE_MAX_QUERIES: usize = 16;

/// Compressed keys [`run_fused`] scores together, a chunk of heads at a
/// time (the chunk's transposed queries, 16 KiB at 32 heads and `d = 128`,
/// loaded into the first-level cache once for them; a pair at a time they
/// came from the second level each time and the tiles ran at half speed).
const FUSE_BATCH: usize = 16;

/// How far ahead (in tokens) the compression asks each key row into the
/// second-level cache: [`run_fused`] at every level (its score tiles leave
/// the memory idle between rows: Eq. 9's decode with the AVX2 body measured
/// 50-51 ms without, 44-48 with, Intel Xeon, one thread), [`compress`] at
/// the AVX-512 levels ([`rows_ahead`]). 4 and 32 tokens measured as 16.
const ROWS_AHEAD: usize = 16;

/// [`compress`]'s distance for its rows at `isa`: [`ROWS_AHEAD`] for the
/// AVX-512 body, whose loop otherwise waits on the rows (Intel Xeon, one
/// thread, 131,072 tokens × 4 KV heads × d 128, the compression alone,
/// without and with: float32 keys 29-30 and 27 ms under fla's window, 45-47
/// and 37 under Eq. 9's; bfloat16 keys alike either way); none for the AVX2
/// and portable bodies, which the hardware's prefetch keeps fed (with the
/// rows asked for, Eq. 9's window from float32 keys took 39 ms at AVX2
/// width on the Xeon against 33 without, and fla's window measured slower
/// on AMD Zen 3).
fn rows_ahead(isa: Isa) -> usize {
    match isa {
        Isa::Avx512(_) | Isa::Avx512Bf16(_) => ROWS_AHEAD,
        Isa::Avx2(_) | Isa::Scalar => 0,
    }
}

/// The furthest ahead (in tokens) the score tiles of [`run_fused`] ask key
/// rows into the second-level cache.
const FUSE_TILES_AHEAD: usize = 32;

#[cfg(test)]
thread_local! {
    /// The tests' choice of [`run`]'s path (`None`: [`fuses`]'s); `Some(false)`
    /// also keeps [`stage`] off [`batched`] (a KV head at a time).
    pub(super) static FORCE_FUSE: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// Whether [`run`] scores the compressed keys as it compresses them
/// ([`run_fused`]): Eq. 9's window, a group of 8 heads or more (the heads in
/// the lanes), at most [`FUSE_MAX_QUERIES`] queries, some keys, and the
/// logits within [`PACKED_KEEP`]. fla's window measured the same either way
/// (a quarter of Eq. 9's keys, and its decode already at its floor's
/// copy): it keeps [`stage`].
fn fuses(sh: &Shape, window: Window, n_c: usize) -> bool {
    #[cfg(test)]
    if let Some(f) = FORCE_FUSE.get() {
        return f && in_lanes(sh.group()) && n_c > 0;
    }
    let logits = sh.n_q * sh.hq.next_multiple_of(8) * n_c.next_multiple_of(8);
    window != Window::Fla
        && in_lanes(sh.group())
        && n_c > 0
        && sh.n_q <= FUSE_MAX_QUERIES
        && logits <= PACKED_KEEP
}

/// [`run`] with stage 1's logits computed as the compression completes the
/// keys (a decode's few queries).
///
/// [`run`] writes every compressed key out (Eq. 9's 16 MiB at 131,072
/// tokens, a fresh buffer faulted in page by page) and stage 1 then
/// streams each KV head's keys back from memory, once a unit of queries.
/// Here the compression keeps its keys in a ring of slots (the batch being
/// scored, the next one summing: 64 KiB at 4 KV heads, `d = 128`), and
/// each batch of [`FUSE_BATCH`] complete keys is scored against every
/// query's heads ([`heads::Staged`]), a chunk of heads every few tokens
/// while the next batch compresses, the logits written to the chunks' kept
/// buffers. The key rows stream from memory throughout: the compression
/// asks each row [`ROWS_AHEAD`] tokens ahead into the second-level
/// cache, and the score tiles ask the next rows not yet asked for (a line
/// a trip, up to [`FUSE_TILES_AHEAD`] tokens ahead), so the memory keeps
/// reading while the multiply-adds run. Then each chunk's softmax and
/// group sum, the block scores and `f`, row by row.
///
/// The compressed keys are the same chains ([`compress_ring`]), each logit
/// the same chain on them, the maxima exact: the same bits as [`stage`] on
/// the written keys, at every level (`src/nsa/tests.rs`,
/// `fused_decode_equals_compress_then_stage_at_every_level`). What would
/// break it: a slot reused before its key was scored by every chunk (the
/// ring holds two batches and the kernel's overlap; the pending batch is
/// finished before the next one is queued), a chunk finished before its
/// last key was scored.
///
/// One thread: the compression is one pass over the keys in token order,
/// and the scoring rides on it.
#[allow(clippy::too_many_arguments)]
fn run_fused<T: Send>(
    isa: Isa,
    sh: &Shape,
    q: Encoded<'_>,
    k: Encoded<'_>,
    k_scale: Option<&[f32]>,
    (cfg, window): (&Config, Window),
    out: &mut [T],
    width: usize,
    f: impl RowOut<T>,
) {
    let (d, g_heads, n_kv) = (sh.d, sh.group(), sh.n_kv);
    let geo = window.geometry(cfg.block_size);
    let n_c = geo.compressed_len(sh.seq_len);
    let nb = cfg.n_blocks(sh.seq_len);
    let qv = decoded(q, None, 0);
    // The units of [`stage`] (queries sharing a chunk of heads); any
    // grouping gives each query's own bits.
    let fused = if g_heads.is_multiple_of(8) && sh.n_q > 1 {
        (32 / g_heads).clamp(1, MAX_FUSED)
    } else {
        1
    };
    let mut bufs = FUSED_BUFS.with_borrow_mut(std::mem::take);
    // Every unit and KV head: its queries, their key counts, its chunks.
    struct Unit {
        i0: usize,
        g: usize,
        n_vis: Vec<usize>,
        chunks: Vec<heads::Staged>,
    }
    let mut units = Vec::new();
    for i0 in (0..sh.n_q).step_by(fused) {
        let qs_n = fused.min(sh.n_q - i0);
        let n_vis: Vec<usize> = (i0..i0 + qs_n).map(|i| geo.visible(sh.pos(i))).collect();
        for g in 0..n_kv {
            let qs: Vec<usize> = (i0..i0 + qs_n)
                .map(|i| (i * sh.hq + g * g_heads) * d)
                .collect();
            let chunks = if n_vis.iter().any(|&n| n > 0) {
                heads::Staged::chunks(isa, &qv, &qs, g_heads, d, &n_vis, cfg.scale, &mut bufs)
            } else {
                Vec::new()
            };
            units.push(Unit {
                i0,
                g,
                n_vis: n_vis.clone(),
                chunks,
            });
        }
    }
    // The ring: when batch `[j, j + B)` completes (at key `j + B − 1`'s
    // last token) it is scored over the next `B · stride` tokens, during
    // which keys up to `j + 2B − 1 + (kernel − 1) / stride` begin; a power
    // of two slots (a multiple of `B`, so a batch is contiguous) holds them.
    let (kernel, stride) = (geo.kernel_size, geo.kernel_stride);
    let slots = (2 * FUSE_BATCH + kernel / stride).next_power_of_two();
    let w = n_kv * d;
    let mut ring = vec![0.0f32; slots * w];
    // A batch's jobs (a chunk each), spread `gap` tokens apart.
    let jobs: Vec<(usize, usize)> = units
        .iter()
        .enumerate()
        .flat_map(|(u, x)| (0..x.chunks.len()).map(move |i| (u, i)))
        .collect();
    let gap = (FUSE_BATCH * stride / jobs.len().max(1)).max(1);
    let kb = key_bytes(k);
    let row_bytes = kb.len() / sh.seq_len.max(1);
    // The keys' bytes asked for by the tiles so far.
    let mut asked = 0usize;
    // Runs the jobs of batch `p` (first key, key count, first token, jobs
    // done) up to job `upto`, at token `t`.
    let mut run_jobs = |ring: &[f32], upto: usize, t: usize, p: &mut Pending| {
        let at = (p.j & (slots - 1)) * w;
        while p.done < upto.min(jobs.len()) {
            let (u, i) = jobs[p.done];
            let x = &mut units[u];
            let keys = Rows {
                ck: &ring[at..],
                base: x.g * d,
                stride: w,
            };
            // The next lines of the keys not yet asked for, from the row
            // after token `t`'s, at most a line a tile's trip.
            let to = kb.len().min((t + FUSE_TILES_AHEAD) * row_bytes);
            let from = asked.max((t + 1) * row_bytes).min(to);
            let lines = (to - from).min(p.count.div_ceil(2) * (d / 2) * 64);
            x.chunks[i].score(keys, p.j, p.count, &kb[from..from + lines]);
            asked = from + lines;
            p.done += 1;
        }
    };
    let mut pending: Option<Pending> = None;
    compress_ring(
        isa,
        k,
        k_scale,
        n_kv,
        d,
        (kernel, stride),
        (n_c, slots - 1, ROWS_AHEAD),
        &mut ring,
        &mut |t, c, ring| {
            if let Some(p) = pending.as_mut() {
                // Job `i` at token `t0 + i · gap` (compared, not divided: a
                // division a token).
                if t >= p.t0 + p.done * gap {
                    run_jobs(ring, (t - p.t0) / gap + 1, t, p);
                    if p.done == jobs.len() {
                        pending = None;
                    }
                }
            }
            let Some(c) = c else { return };
            if (c + 1) % FUSE_BATCH != 0 && c + 1 != n_c {
                return;
            }
            if let Some(p) = pending.as_mut() {
                run_jobs(ring, usize::MAX, t, p);
            }
            let j = c - c % FUSE_BATCH;
            let mut p = Pending {
                j,
                count: c + 1 - j,
                t0: t + 1,
                done: 0,
            };
            if c + 1 == n_c {
                run_jobs(ring, usize::MAX, t, &mut p);
                pending = None;
            } else {
                pending = Some(p);
            }
        },
    );
    ROW_SCRATCH.with_borrow_mut(|s| {
        let RowScratch {
            stage1,
            blocks,
            ids,
        } = s;
        for u in units {
            let n_max = u.n_vis.iter().copied().max().unwrap_or(0);
            let sums = &mut stage1.sums;
            sums.clear();
            sums.resize(u.n_vis.len() * n_max, 0.0);
            for mut ch in u.chunks {
                ch.finish(sums);
                ch.into_bufs(&mut bufs);
            }
            for (s, &n) in u.n_vis.iter().enumerate() {
                blocks.clear();
                blocks.resize(nb, 0.0);
                let i = u.i0 + s;
                block_scores(cfg, window, &sums[s * n_max..][..n], sh.pos(i), blocks);
                let r = i * n_kv + u.g;
                f.one(&mut out[r * width..(r + 1) * width], blocks, ids);
            }
        }
    });
    if bufs.iter().map(|b| b.capacity()).sum::<usize>() <= PACKED_KEEP {
        FUSED_BUFS.with_borrow_mut(|b| *b = bufs);
    }
}

/// A batch of keys [`run_fused`] is scoring: keys `j..j + count`, its jobs
/// from token `t0`, `done` of them run.
struct Pending {
    j: usize,
    count: usize,
    t0: usize,
    done: usize,
}

/// The bytes of `k`, for prefetches.
fn key_bytes<'a>(k: Encoded<'a>) -> &'a [u8] {
    match k {
        Encoded::F32(s) => bytemuck::cast_slice(s),
        Encoded::F16(s) | Encoded::Bf16(s) => bytemuck::cast_slice(s),
        Encoded::Fp8E4m3(s) => s,
    }
}

thread_local! {
    /// The calling thread's buffers for [`run_fused`]'s chunks' logits, kept between calls up to
    /// [`PACKED_KEEP`] floats: a decode on 131,072 tokens writes 8 MiB of
    /// logits, and a fresh buffer would be faulted in page by page.
    static FUSED_BUFS: std::cell::RefCell<Vec<Floats>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A thread's scratch, reused across the rows and the calls it computes
/// (fresh buffers a row cost more than stage 1 at decode: each large one
/// is a new mapping the kernel zero-fills page by page).
#[derive(Default)]
struct RowScratch {
    stage1: Scratch,
    blocks: Vec<f32>,
    ids: Vec<u64>,
}

thread_local! {
    static ROW_SCRATCH: std::cell::RefCell<RowScratch> = std::cell::RefCell::default();
    /// The first row's block scores of a pair [`stage`] hands to
    /// [`RowOut::two`] (the second's are [`RowScratch`]'s).
    static PAIR_BLOCKS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    /// The calling thread's packed-key buffers, kept between calls up to
    /// [`PACKED_KEEP`] floats: a decode call on 131,072 tokens packs 4 MiB,
    /// and a fresh buffer each call cost a third of the call in page faults
    /// and zeroing (AMD EPYC Zen 3, one thread).
    static PACKED_BUFS: std::cell::RefCell<Vec<Vec<f32>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The compressed keys [`stage`] reads (`[n_c, n_kv, d]`): float32, or
/// unscaled bfloat16 bits read in place by the heads-in-lanes kernels
/// (their float32 values exactly: the same bits as decoding them first).
#[derive(Clone, Copy)]
enum Keys<'a> {
    F32(&'a [f32]),
    Bf16(&'a [u16]),
}

/// What [`stage`] does with a query's block scores: `(query in its run,
/// scores, top-k scratch)`.
type RowFn<'a> = dyn FnMut(usize, &[f32], &mut Vec<u64>) + 'a;

/// The most queries whose stage 1 shares a chunk of heads (a group of 8
/// heads: four queries fill a chunk of 32).
const MAX_FUSED: usize = 4;

/// The most packed-key floats a thread keeps between calls (64 MiB).
const PACKED_KEEP: usize = 1 << 24;

/// [`run`] on given compressed keys `ck` (`[n_c, n_kv, d]`, float32): stage
/// 1, the block scores and `f` for every row. The bits depend only on `ck`,
/// `q` and the settings, so a call on an engine's cached compressed keys
/// equals one that compressed the same keys itself.
#[allow(clippy::too_many_arguments)]
fn stage<T: Send, F: RowOut<T>>(
    isa: Isa,
    sh: &Shape,
    q: Encoded<'_>,
    ck: Keys<'_>,
    n_c: usize,
    (cfg, window): (&Config, Window),
    out: &mut [T],
    width: usize,
    f: F,
) {
    let (d, g_heads) = (sh.d, sh.group());
    let geo = window.geometry(cfg.block_size);
    let nb = cfg.n_blocks(sh.seq_len);
    // Float32 queries are read in place; other formats decoded once.
    let qv = decoded(q, None, 0);
    // A group of 8 heads or more is scored with its heads in the lanes, on
    // the compressed keys in place (`heads`); a smaller one packs them.
    // Bfloat16 compressed keys are read in place there at any group.
    let lanes = in_lanes(g_heads) || matches!(ck, Keys::Bf16(_));
    let mut bufs = PACKED_BUFS.with_borrow_mut(std::mem::take);
    // Many queries (a prefill) on few keys at a vector level: each KV
    // head's keys transposed once into panels (`panels`), every query
    // scored on them with its rows in place (no query transposes; the
    // same bits).
    let in_panels = sh.n_q >= panels::MIN_QUERIES && n_c <= panels::MAX_KEYS && isa != Isa::Scalar;
    let kv_panels: Vec<Panels> = match (in_panels, ck) {
        (false, _) => Vec::new(),
        (true, Keys::F32(ck)) => (0..sh.n_kv)
            .map(|g| {
                let rows = Rows {
                    ck,
                    base: g * d,
                    stride: sh.n_kv * d,
                };
                Panels::new_in(bufs.pop().unwrap_or_default(), rows, n_c, d)
            })
            .collect(),
        (true, Keys::Bf16(ck)) => (0..sh.n_kv)
            .map(|g| {
                let rows = Rows {
                    ck,
                    base: g * d,
                    stride: sh.n_kv * d,
                };
                Panels::new_in(bufs.pop().unwrap_or_default(), rows, n_c, d)
            })
            .collect(),
    };
    let lanes = lanes && !in_panels;
    let packed: Vec<Packed> = match (lanes || in_panels, ck) {
        (false, Keys::F32(ck)) => (0..sh.n_kv)
            .map(|g| Packed::new_in(bufs.pop().unwrap_or_default(), isa, ck, n_c, sh.n_kv, g, d))
            .collect(),
        _ => Vec::new(),
    };
    let work = g_heads * n_c.max(1) * d;
    // Stage 1 of queries `i0 + s` (`s < qs_n`) at KV head `g`, then each
    // one's row `f(row(s), ..)`.
    let rows_of = |g: usize, i0: usize, qs_n: usize, row: &mut RowFn<'_>| {
        let mut n_vis = [0usize; MAX_FUSED];
        for (s, n) in n_vis[..qs_n].iter_mut().enumerate() {
            *n = geo.visible(sh.pos(i0 + s));
        }
        let n_max = n_vis[..qs_n].iter().copied().max().unwrap_or(0);
        ROW_SCRATCH.with_borrow_mut(|s| {
            let RowScratch {
                stage1,
                blocks,
                ids,
            } = s;
            if in_panels {
                let at = (i0 * sh.hq + g * g_heads) * d;
                let (qg, next) = qv[at..].split_at(g_heads * d);
                // The next group's rows (the next KV head's, or the next
                // query's first).
                let next = &next[..next.len().min(g_heads * d)];
                let (p, n) = (&kv_panels[g], n_vis[0]);
                panels::group_sums(isa, qg, g_heads, d, p, n, cfg.scale, stage1, next);
            } else if lanes {
                // The next unit's queries (contiguous), its `g`-th part.
                let unit = qs_n * sh.hq * d;
                let ahead = qv.get((i0 + qs_n) * sh.hq * d..).unwrap_or(&[]);
                let ahead = &ahead[..unit.min(ahead.len())];
                let part = ahead.len().div_ceil(sh.n_kv);
                let next = ahead.chunks(part.max(1)).nth(g).unwrap_or(&[]);
                let (base, stride) = (g * d, sh.n_kv * d);
                let mut qs = [0usize; MAX_FUSED];
                for (s, o) in qs[..qs_n].iter_mut().enumerate() {
                    *o = ((i0 + s) * sh.hq + g * g_heads) * d;
                }
                let (qs, nv) = (&qs[..qs_n], &n_vis[..qs_n]);
                match ck {
                    Keys::F32(ck) => {
                        let keys = Rows { ck, base, stride };
                        heads::group_sums(
                            isa, &qv, qs, g_heads, d, keys, nv, cfg.scale, stage1, next,
                        )
                    }
                    Keys::Bf16(ck) => {
                        let keys = Rows { ck, base, stride };
                        heads::group_sums(
                            isa, &qv, qs, g_heads, d, keys, nv, cfg.scale, stage1, next,
                        )
                    }
                }
            } else {
                let qg = &qv[(i0 * sh.hq + g * g_heads) * d..(i0 * sh.hq + (g + 1) * g_heads) * d];
                group_sums(isa, qg, g_heads, d, &packed[g], n_max, cfg.scale, stage1);
            }
            for (s, &n) in n_vis[..qs_n].iter().enumerate() {
                // `block_scores` writes every block.
                blocks.resize(nb, 0.0);
                let sums = &stage1.sums[s * n_max..s * n_max + n];
                block_scores(cfg, window, sums, sh.pos(i0 + s), blocks);
                row(s, blocks, ids);
            }
        });
    };
    // With the heads in the lanes and a group a multiple of 8, `fused`
    // queries share a chunk of at most 32 heads (the keys read once for
    // them, each key element broadcast against twice the heads at a group
    // of 16; each query's softmax over its own keys): the rows of `fused`
    // queries are one unit. The bits are each query's alone
    // (`heads::group_sums`).
    let fused = if lanes && g_heads.is_multiple_of(8) && sh.n_q > 1 {
        (32 / g_heads).clamp(1, MAX_FUSED)
    } else {
        1
    };
    let whole = if fused > 1 { sh.n_q / fused * fused } else { 0 };
    let (head, tail) = out.split_at_mut(whole * sh.n_kv * width);
    let unit = fused * sh.n_kv * width;
    // A decode's units read every KV head's keys in one pass (see
    // [`batched`]).
    let one_pass = lanes && sh.n_q <= FUSE_MAX_QUERIES;
    #[cfg(test)]
    let one_pass = one_pass && FORCE_FUSE.get() != Some(false);
    crate::pool::for_each_row_mut(head, unit, crate::pool::min_rows(work * fused), |u, o| {
        let mut put = |s: usize, g: usize, blocks: &[f32], ids: &mut Vec<u64>| {
            let r = s * sh.n_kv + g;
            f.one(&mut o[r * width..(r + 1) * width], blocks, ids);
        };
        let i0 = u * fused;
        let done = one_pass
            && match ck {
                Keys::F32(ck) => batched(isa, sh, &qv, ck, (i0, fused), (cfg, window), &mut put),
                Keys::Bf16(ck) => batched(isa, sh, &qv, ck, (i0, fused), (cfg, window), &mut put),
            };
        if !done {
            for g in 0..sh.n_kv {
                rows_of(g, i0, fused, &mut |s, blocks, ids| put(s, g, blocks, ids));
            }
        }
    });
    // The other rows one at a time, or two at a time where `f` pairs them
    // (their top-k searches side by side): rows `2 p` and `2 p + 1` of the
    // tail, an odd last row alone.
    let pairs = if F::PAIRS { tail.len() / width / 2 } else { 0 };
    let (two, one) = tail.split_at_mut(pairs * 2 * width);
    let min_pairs = crate::pool::min_rows(work * 2);
    crate::pool::for_each_row_mut(two, 2 * width, min_pairs, |p, o| {
        let (oa, ob) = o.split_at_mut(width);
        let r = 2 * p + whole * sh.n_kv;
        PAIR_BLOCKS.with_borrow_mut(|first| {
            let (i, g) = (r / sh.n_kv, r % sh.n_kv);
            rows_of(g, i, 1, &mut |_, blocks, _| {
                first.clear();
                first.extend_from_slice(blocks);
            });
            let (i, g) = ((r + 1) / sh.n_kv, (r + 1) % sh.n_kv);
            rows_of(g, i, 1, &mut |_, blocks, ids| {
                f.two([&mut *oa, &mut *ob], [first, blocks], ids)
            });
        });
    });
    crate::pool::for_each_row_mut(one, width, crate::pool::min_rows(work), |r, o| {
        let r = r + whole * sh.n_kv + 2 * pairs;
        let (i, g) = (r / sh.n_kv, r % sh.n_kv);
        rows_of(g, i, 1, &mut |_, blocks, ids| f.one(o, blocks, ids));
    });
    bufs.extend(packed.into_iter().map(|p| p.keys));
    bufs.extend(kv_panels.into_iter().map(Panels::into_buf));
    if bufs.iter().map(Vec::capacity).sum::<usize>() <= PACKED_KEEP {
        PACKED_BUFS.with_borrow_mut(|b| *b = bufs);
    }
}

/// What [`batched`] does with a row: `(query in its unit, KV head, block
/// scores, top-k scratch)`.
type PutFn<'a> = dyn FnMut(usize, usize, &[f32], &mut Vec<u64>) + 'a;

/// Compressed keys [`batched`] scores together, a chunk of heads at a time
/// (64 KiB at 4 KV heads, `d = 128`, float32; batches of 64 to 256 keys
/// measured slower cold: the next batch's prefetch ran further ahead of
/// its use).
const CACHED_BATCH: usize = 32;

/// Stage 1 of queries `i0..i0 + qs_n` (a unit of [`stage`]) against every
/// KV head's compressed keys `ck` (`[n_c, n_kv, d]`, float32 or bfloat16
/// bits) in one pass, then each query and KV head's row `put(s, g, ..)`;
/// `false` (nothing done) when the queries see no key.
///
/// [`stage`]'s chunk of one KV head reads that head's 512 bytes of every
/// key (at `d = 128`), then the next head's: each pass a strided read, and
/// an engine's compressed keys come from memory (a decode call's 4 MiB
/// read cold cost 0.2-0.3 ms more than warm). Here the keys are taken in
/// batches of [`CACHED_BATCH`] (every head's rows, contiguous), each
/// scored by every chunk of every KV head ([`heads::Staged`]: the same
/// tiles, logits and maxima), while the tiles ask for the next batch's
/// bytes ([`heads::Staged::score`]); then each chunk's softmax and group sum.
/// The same bits as [`heads::group_sums`] (`src/nsa/tests.rs`).
fn batched<E: heads::Elem + bytemuck::Pod>(
    isa: Isa,
    sh: &Shape,
    qv: &[f32],
    ck: &[E],
    (i0, qs_n): (usize, usize),
    (cfg, window): (&Config, Window),
    put: &mut PutFn<'_>,
) -> bool {
    let (d, g_heads, n_kv) = (sh.d, sh.group(), sh.n_kv);
    let geo = window.geometry(cfg.block_size);
    let nb = cfg.n_blocks(sh.seq_len);
    let n_vis: Vec<usize> = (i0..i0 + qs_n).map(|i| geo.visible(sh.pos(i))).collect();
    let n_max = n_vis.iter().copied().max().unwrap_or(0);
    if n_max == 0 {
        return false;
    }
    let stride = n_kv * d;
    let bytes: &[u8] = bytemuck::cast_slice(ck);
    let row_bytes = stride * std::mem::size_of::<E>();
    // The first batch, asked for as the chunks are set up (read at once
    // after; the hint's level made no difference measured here).
    #[cfg(target_arch = "x86_64")]
    crate::keys::prefetch(
        bytes,
        0,
        CACHED_BATCH * row_bytes,
        crate::keys::CacheLevel::L2,
    );
    let mut bufs = FUSED_BUFS.with_borrow_mut(std::mem::take);
    let mut chunks: Vec<Vec<heads::Staged>> = (0..n_kv)
        .map(|g| {
            let qs: Vec<usize> = (i0..i0 + qs_n)
                .map(|i| (i * sh.hq + g * g_heads) * d)
                .collect();
            heads::Staged::chunks(isa, qv, &qs, g_heads, d, &n_vis, cfg.scale, &mut bufs)
        })
        .collect();
    let jobs: usize = chunks.iter().map(Vec::len).sum();
    let cb = CACHED_BATCH;
    for j0 in (0..n_max).step_by(cb) {
        let count = cb.min(n_max - j0);
        // The next batch's bytes, shared out among the jobs.
        let next = bytes.get((j0 + CACHED_BATCH) * row_bytes..).unwrap_or(&[]);
        let next = &next[..next.len().min(cb * row_bytes)];
        let share = next.len().div_ceil(jobs.max(1)).next_multiple_of(64);
        let mut parts = next.chunks(share.max(64));
        for (g, chs) in chunks.iter_mut().enumerate() {
            let keys = Rows {
                ck,
                base: g * d + j0 * stride,
                stride,
            };
            for ch in chs.iter_mut() {
                ch.score(keys, j0, count, parts.next().unwrap_or(&[]));
            }
        }
    }
    ROW_SCRATCH.with_borrow_mut(|s| {
        let RowScratch {
            stage1,
            blocks,
            ids,
        } = s;
        for (g, chs) in chunks.into_iter().enumerate() {
            let sums = &mut stage1.sums;
            sums.clear();
            sums.resize(qs_n * n_max, 0.0);
            for mut ch in chs {
                ch.finish(sums);
                ch.into_bufs(&mut bufs);
            }
            for (s, &n) in n_vis.iter().enumerate() {
                blocks.clear();
                blocks.resize(nb, 0.0);
                block_scores(cfg, window, &sums[s * n_max..][..n], sh.pos(i0 + s), blocks);
                put(s, g, blocks, ids);
            }
        }
    });
    if bufs.iter().map(|b| b.capacity()).sum::<usize>() <= PACKED_KEEP {
        FUSED_BUFS.with_borrow_mut(|b| *b = bufs);
    }
    true
}

thread_local! {
    /// The calling thread's buffer for compressed keys given in another
    /// format than float32, kept between calls up to [`PACKED_KEEP`]
    /// floats: a fresh 4 MiB a call (a decode on 131,072 tokens' bfloat16
    /// compressed keys) was a new mapping zero-filled page by page.
    static CK_BUF: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `f` on the compressed keys `ck` as float32, each row of `row` values
/// times its scale: `ck` itself when it is unscaled float32, else decoded
/// (the product rounded to float32, as [`decoded`]) into the thread's kept
/// buffer, which is only resized when its length changes (decoding writes
/// every element).
fn with_compressed<R>(
    ck: Encoded<'_>,
    scale: Option<&[f32]>,
    row: usize,
    f: impl FnOnce(&[f32]) -> R,
) -> R {
    if let (Encoded::F32(v), None) = (ck, scale) {
        return f(v);
    }
    let mut buf = CK_BUF.with_borrow_mut(std::mem::take);
    if buf.len() != ck.len() {
        buf.clear();
        buf.resize(ck.len(), 0.0);
    }
    ck.decode(0, &mut buf);
    if let Some(s) = scale {
        for (r, &c) in buf.chunks_mut(row.max(1)).zip(s) {
            r.iter_mut().for_each(|x| *x *= c);
        }
    }
    let out = f(&buf);
    if buf.capacity() <= PACKED_KEEP {
        CK_BUF.with_borrow_mut(|b| *b = buf);
    }
    out
}

/// `x` as float32, each row of `row` values times its scale: borrowed when
/// it is unscaled float32 (no copy), else decoded (the product rounded to
/// float32, as [`compress`] rounds a scaled key).
pub(super) fn decoded<'a>(
    x: Encoded<'a>,
    scale: Option<&[f32]>,
    row: usize,
) -> std::borrow::Cow<'a, [f32]> {
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

/// Every block's score for the queries at the end of one sequence:
/// `out[i, g, b]` (`[n_q, n_kv_heads, ⌈seq_len / bs⌉]`) for query `i` (at
/// position `seq_len − n_q + i`), KV head `g`, block `b` — stage 1's group
/// sum for a block before the query's own, `+inf` for a forced block,
/// `−inf` for the rest (see the module docs).
///
/// `q` is `[n_q, n_q_heads, d]`; `k` the sequence's keys `[seq_len,
/// n_kv_heads, d]`, any key format read in place, optionally each token's
/// row times `k_scale[t]` (fp8 keys). Query head `h` reads KV head `h /
/// (n_q_heads / n_kv_heads)`.
///
/// # Errors
/// As [`compress_into`]; `q`'s heads not a positive multiple of the KV
/// heads, `q` not whole queries or more queries than tokens (`q`); a
/// non-finite `scale`; `out` of another size. Nothing is written before
/// every check has passed.
pub fn block_scores_into(
    q: Encoded<'_>,
    k: Encoded<'_>,
    k_scale: Option<&[f32]>,
    heads: Heads,
    cfg: &Config,
    out: &mut [f32],
) -> Result<(), ArgumentError> {
    block_scores_at(Isa::best(), q, k, k_scale, heads, cfg, out)
}

/// [`block_scores_into`] at `isa` (the tests' way to every level).
pub(super) fn block_scores_at(
    isa: Isa,
    q: Encoded<'_>,
    k: Encoded<'_>,
    k_scale: Option<&[f32]>,
    heads: Heads,
    cfg: &Config,
    out: &mut [f32],
) -> Result<(), ArgumentError> {
    block_scores_window_at(isa, q, k, k_scale, heads, (cfg, Window::Fla), out)
}

/// [`block_scores_window_into`] at `isa`.
pub(super) fn block_scores_window_at(
    isa: Isa,
    q: Encoded<'_>,
    k: Encoded<'_>,
    k_scale: Option<&[f32]>,
    heads: Heads,
    (cfg, window): (&Config, Window),
    out: &mut [f32],
) -> Result<(), ArgumentError> {
    window.check(cfg.block_size)?;
    let sh = check(q.len(), k.len(), k_scale, heads, cfg)?;
    let nb = cfg.n_blocks(sh.seq_len);
    check_out(
        out.len(),
        checked_size("out", &[sh.n_q, sh.n_kv, nb])?,
        || format!("[n_q={}, n_kv_heads={}, n_blocks={nb}]", sh.n_q, sh.n_kv),
    )?;
    run(isa, &sh, q, k, k_scale, (cfg, window), out, nb, score_row);
    Ok(())
}

/// The blocks each query reads: `out[i, g]` (`[n_q, n_kv_heads,
/// block_counts]`, `int32`) the top `block_counts` candidates of
/// [`block_scores_into`]'s row in the total order, ascending, `-1` padded.
///
/// # Errors
/// `block_counts` 0 (`block_counts`), and as [`block_scores_into`].
pub fn select_into(
    q: Encoded<'_>,
    k: Encoded<'_>,
    k_scale: Option<&[f32]>,
    heads: Heads,
    cfg: &Config,
    out: &mut [i32],
) -> Result<(), ArgumentError> {
    select_at(Isa::best(), q, k, k_scale, heads, cfg, out)
}

/// [`select_into`] at `isa`.
pub(super) fn select_at(
    isa: Isa,
    q: Encoded<'_>,
    k: Encoded<'_>,
    k_scale: Option<&[f32]>,
    heads: Heads,
    cfg: &Config,
    out: &mut [i32],
) -> Result<(), ArgumentError> {
    select_window_at(isa, q, k, k_scale, heads, (cfg, Window::Fla), out)
}

/// [`select_window_into`] at `isa`.
pub(super) fn select_window_at(
    isa: Isa,
    q: Encoded<'_>,
    k: Encoded<'_>,
    k_scale: Option<&[f32]>,
    heads: Heads,
    (cfg, window): (&Config, Window),
    out: &mut [i32],
) -> Result<(), ArgumentError> {
    check_block_counts(cfg)?;
    window.check(cfg.block_size)?;
    let sh = check(q.len(), k.len(), k_scale, heads, cfg)?;
    let w = cfg.block_counts;
    check_out(
        out.len(),
        checked_size("out", &[sh.n_q, sh.n_kv, w])?,
        || format!("[n_q={}, n_kv_heads={}, block_counts={w}]", sh.n_q, sh.n_kv),
    )?;
    run(isa, &sh, q, k, k_scale, (cfg, window), out, w, SelectRows);
    Ok(())
}

/// A block-score row: the sequence's blocks, then NaN to the row's width
/// (a packed call's rows are as wide as its longest sequence's blocks).
pub(super) fn score_row(o: &mut [f32], blocks: &[f32], _: &mut Vec<u64>) {
    o[..blocks.len()].copy_from_slice(blocks);
    o[blocks.len()..].fill(f32::NAN);
}

/// A selection row from its block scores.
pub(super) fn select_row(o: &mut [i32], blocks: &[f32], ids: &mut Vec<u64>) {
    row(blocks, ids, o);
}

/// What [`run`] and [`stage`] write for a row: `one(row, block_scores,
/// ids)` (`ids` the top-k's scratch); [`RowOut::PAIRS`] asks [`stage`]'s
/// prefill path to hand rows two at a time to [`RowOut::two`] (the same
/// outputs as two calls of `one`, by its contract).
pub(super) trait RowOut<T>: Sync + Send {
    /// Whether [`RowOut::two`] gains on two calls of [`RowOut::one`].
    const PAIRS: bool = false;
    /// A row from its block scores.
    fn one(&self, o: &mut [T], blocks: &[f32], ids: &mut Vec<u64>);
    /// Two rows, the outputs of `one` on each.
    fn two(&self, [oa, ob]: [&mut [T]; 2], [a, b]: [&[f32]; 2], ids: &mut Vec<u64>) {
        self.one(oa, a, ids);
        self.one(ob, b, ids);
    }
}

impl<T, F: Fn(&mut [T], &[f32], &mut Vec<u64>) + Sync + Send> RowOut<T> for F {
    fn one(&self, o: &mut [T], blocks: &[f32], ids: &mut Vec<u64>) {
        self(o, blocks, ids)
    }
}

/// [`select_row`], two rows' top-k searches side by side where [`stage`]
/// hands rows in pairs ([`row2`]: the same ids).
#[derive(Clone, Copy)]
pub(super) struct SelectRows;

impl RowOut<i32> for SelectRows {
    const PAIRS: bool = true;
    fn one(&self, o: &mut [i32], blocks: &[f32], ids: &mut Vec<u64>) {
        row(blocks, ids, o);
    }
    fn two(&self, o: [&mut [i32]; 2], blocks: [&[f32]; 2], ids: &mut Vec<u64>) {
        row2(blocks, ids, o);
    }
}

pub(super) fn check_out(
    got: usize,
    want: usize,
    shape: impl FnOnce() -> String,
) -> Result<(), ArgumentError> {
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

pub(super) fn check_block_counts(cfg: &Config) -> Result<(), ArgumentError> {
    if cfg.block_counts == 0 {
        return Err(invalid(
            "block_counts",
            "block_counts must be at least 1 block".into(),
        ));
    }
    Ok(())
}

/// The packed batch checked: sequence `s` is keys `cu_seqlens[s] ..
/// cu_seqlens[s + 1]` and queries `cu_seqlens_q[s] .. cu_seqlens_q[s + 1]`
/// (`None`: `cu_seqlens`), its queries the last of its keys (fla's
/// `cu_seqlens` or `(cu_seqlens_q, cu_seqlens_k)`). Returns each sequence's
/// shape and its first query and key row.
fn check_packed(
    q_len: usize,
    k_len: usize,
    k_scale: Option<&[f32]>,
    heads: Heads,
    (cu_seqlens, cu_seqlens_q): (&[usize], Option<&[usize]>),
    cfg: &Config,
) -> Result<Vec<(Shape, usize, usize)>, ArgumentError> {
    let Heads {
        n_q_heads,
        n_kv_heads,
        d,
    } = heads;
    check_sizes(n_kv_heads, d, cfg.block_size)?;
    check_heads(heads, cfg)?;
    let (per_k, per_q) = (
        checked_size("k", &[n_kv_heads, d])?,
        checked_size("q", &[n_q_heads, d])?,
    );
    if !k_len.is_multiple_of(per_k) {
        let message =
            format!("k holds {k_len} values, not whole [n_kv_heads={n_kv_heads}, d={d}] tokens");
        return Err(invalid("k", message));
    }
    if !q_len.is_multiple_of(per_q) {
        let message =
            format!("q holds {q_len} values, not whole [n_q_heads={n_q_heads}, d={d}] queries");
        return Err(invalid("q", message));
    }
    let (n_k, n_q) = (k_len / per_k, q_len / per_q);
    let cu_k = crate::packed::boundaries(cu_seqlens, n_k, ("keys", "k"))?;
    let lens: Vec<usize> = cu_k.windows(2).map(|w| w[1] - w[0]).collect();
    let cu_q = cu_seqlens_q.unwrap_or(&cu_k);
    crate::packed::query_bounds(cu_q, "cu_seqlens", &lens, "keys", n_q)?;
    if let Some(s) = k_scale {
        check_len("k_scale", s.len(), n_k, || format!("[n_keys={n_k}]"))?;
    }
    Ok((0..lens.len())
        .map(|s| {
            let sh = Shape {
                n_q: cu_q[s + 1] - cu_q[s],
                hq: n_q_heads,
                n_kv: n_kv_heads,
                d,
                seq_len: lens[s],
            };
            (sh, cu_q[s], cu_k[s])
        })
        .collect())
}

/// Runs `f` over every sequence of a packed batch with queries ([`run`] on
/// its rows).
#[allow(clippy::too_many_arguments)]
fn run_packed<T: Send>(
    isa: Isa,
    seqs: &[(Shape, usize, usize)],
    q: Encoded<'_>,
    k: Encoded<'_>,
    k_scale: Option<&[f32]>,
    cfg: &Config,
    out: &mut [T],
    width: usize,
    f: impl RowOut<T> + Copy,
) {
    for (sh, q0, k0) in seqs.iter().filter(|s| s.0.n_q > 0) {
        let (qr, kr) = (sh.hq * sh.d, sh.n_kv * sh.d);
        let qs = q.slice(q0 * qr, (q0 + sh.n_q) * qr);
        let ks = k.slice(k0 * kr, (k0 + sh.seq_len) * kr);
        let sc = k_scale.map(|s| &s[*k0..k0 + sh.seq_len]);
        let rows = &mut out[q0 * sh.n_kv * width..(q0 + sh.n_q) * sh.n_kv * width];
        run(isa, sh, qs, ks, sc, (cfg, Window::Fla), rows, width, f);
    }
}

/// [`block_scores_into`] over a packed batch (fla's varlen call,
/// `parallel_nsa_topk(..., cu_seqlens)`): sequence `s` is keys
/// `cu_seqlens[s] .. cu_seqlens[s + 1]` of `k` and queries `cu_seqlens_q[s]
/// .. cu_seqlens_q[s + 1]` of `q` (`None`: `cu_seqlens`), the last of its
/// tokens. `out` `[total_q, n_kv_heads, max_blocks]`, `max_blocks` the most
/// blocks of a sequence; each row the dense call's row on its own sequence,
/// then NaN.
///
/// # Errors
/// As [`block_scores_into`] (`q`, `k` not whole rows; a sequence may be
/// empty), `cu_seqlens` not rising from 0 to the keys (`cu_seqlens`),
/// `cu_seqlens_q` not rising from 0 to the queries or giving a sequence
/// more queries than keys (`cu_seqlens_q`). Nothing is written before every
/// check has passed.
pub fn block_scores_packed_into(
    q: Encoded<'_>,
    k: Encoded<'_>,
    k_scale: Option<&[f32]>,
    heads: Heads,
    cu: (&[usize], Option<&[usize]>),
    cfg: &Config,
    out: &mut [f32],
) -> Result<(), ArgumentError> {
    block_scores_packed_at(Isa::best(), q, k, k_scale, heads, cu, cfg, out)
}

/// [`block_scores_packed_into`] at `isa`.
#[allow(clippy::too_many_arguments)]
pub(super) fn block_scores_packed_at(
    isa: Isa,
    q: Encoded<'_>,
    k: Encoded<'_>,
    k_scale: Option<&[f32]>,
    heads: Heads,
    cu: (&[usize], Option<&[usize]>),
    cfg: &Config,
    out: &mut [f32],
) -> Result<(), ArgumentError> {
    let seqs = check_packed(q.len(), k.len(), k_scale, heads, cu, cfg)?;
    let Heads {
        n_q_heads,
        n_kv_heads,
        d,
    } = heads;
    let n_q = q.len() / (n_q_heads * d);
    let nb = seqs
        .iter()
        .map(|s| cfg.n_blocks(s.0.seq_len))
        .max()
        .unwrap_or(0);
    check_out(
        out.len(),
        checked_size("out", &[n_q, n_kv_heads, nb])?,
        || format!("[total_q={n_q}, n_kv_heads={n_kv_heads}, max_blocks={nb}]"),
    )?;
    run_packed(isa, &seqs, q, k, k_scale, cfg, out, nb, score_row);
    Ok(())
}

/// [`select_into`] over a packed batch (see [`block_scores_packed_into`]):
/// `out` `[total_q, n_kv_heads, block_counts]`, each row the dense call's
/// row on its own sequence (block ids of that sequence, from 0).
///
/// # Errors
/// `block_counts` 0 (`block_counts`), and as [`block_scores_packed_into`].
pub fn select_packed_into(
    q: Encoded<'_>,
    k: Encoded<'_>,
    k_scale: Option<&[f32]>,
    heads: Heads,
    cu: (&[usize], Option<&[usize]>),
    cfg: &Config,
    out: &mut [i32],
) -> Result<(), ArgumentError> {
    select_packed_at(Isa::best(), q, k, k_scale, heads, cu, cfg, out)
}

/// [`select_packed_into`] at `isa`.
#[allow(clippy::too_many_arguments)]
pub(super) fn select_packed_at(
    isa: Isa,
    q: Encoded<'_>,
    k: Encoded<'_>,
    k_scale: Option<&[f32]>,
    heads: Heads,
    cu: (&[usize], Option<&[usize]>),
    cfg: &Config,
    out: &mut [i32],
) -> Result<(), ArgumentError> {
    check_block_counts(cfg)?;
    let seqs = check_packed(q.len(), k.len(), k_scale, heads, cu, cfg)?;
    let Heads {
        n_q_heads,
        n_kv_heads,
        d,
    } = heads;
    let n_q = q.len() / (n_q_heads * d);
    let w = cfg.block_counts;
    check_out(
        out.len(),
        checked_size("out", &[n_q, n_kv_heads, w])?,
        || format!("[total_q={n_q}, n_kv_heads={n_kv_heads}, block_counts={w}]"),
    )?;
    run_packed(isa, &seqs, q, k, k_scale, cfg, out, w, SelectRows);
    Ok(())
}

/// [`block_scores_into`] with the compressed keys and block scores of
/// `window` ([`Window::Eq9`]: the NSA paper's Eq. 9 over overlapping
/// compressed keys; [`Window::Fla`]: the same as [`block_scores_into`]).
///
/// # Errors
/// As [`block_scores_into`]; a window whose sizes are 0 or do not divide
/// the block and the kernel into strides (`kernel_size`, `kernel_stride`).
pub fn block_scores_window_into(
    q: Encoded<'_>,
    k: Encoded<'_>,
    k_scale: Option<&[f32]>,
    heads: Heads,
    (cfg, window): (&Config, Window),
    out: &mut [f32],
) -> Result<(), ArgumentError> {
    block_scores_window_at(Isa::best(), q, k, k_scale, heads, (cfg, window), out)
}

/// [`select_into`] with the block scores of `window` (see
/// [`block_scores_window_into`]).
///
/// # Errors
/// As [`select_into`] and [`block_scores_window_into`].
pub fn select_window_into(
    q: Encoded<'_>,
    k: Encoded<'_>,
    k_scale: Option<&[f32]>,
    heads: Heads,
    (cfg, window): (&Config, Window),
    out: &mut [i32],
) -> Result<(), ArgumentError> {
    select_window_at(Isa::best(), q, k, k_scale, heads, (cfg, window), out)
}

/// [`compress_into`] under `window`: `out` (`[n_c, n_kv_heads, d]`, `n_c`
/// the window's compressed keys of `seq_len` tokens) key `c` the float32
/// mean of tokens `c·stride .. c·stride + kernel` (fla's window: each
/// complete block's mean, `n_c = seq_len / block_size`; Eq. 9's: `kernel`
/// tokens every `stride`). These are the bits every entry point on the
/// keys computes, so an engine that caches them and calls
/// [`select_compressed_into`] gets the rows [`select_window_into`] returns.
///
/// # Errors
/// As [`compress_into`]; a window whose sizes are 0 or do not divide the
/// block and the kernel into strides (`kernel_size`, `kernel_stride`).
pub fn compress_window_into(
    k: Encoded<'_>,
    k_scale: Option<&[f32]>,
    n_kv_heads: usize,
    d: usize,
    block_size: usize,
    window: Window,
    out: &mut [f32],
) -> Result<(), ArgumentError> {
    let seq_len = check_keys(k.len(), k_scale, n_kv_heads, d, block_size)?;
    window.check(block_size)?;
    let geo = window.geometry(block_size);
    let n_c = geo.compressed_len(seq_len);
    check_out(
        out.len(),
        checked_size("out", &[n_c, n_kv_heads, d])?,
        || format!("[n_c={n_c}, n_kv_heads={n_kv_heads}, d={d}]"),
    )?;
    compress(
        Isa::best(),
        k,
        k_scale,
        n_kv_heads,
        d,
        (geo.kernel_size, geo.kernel_stride),
        out,
    );
    Ok(())
}

/// [`block_scores_window_into`] on given compressed keys, as a serving
/// engine keeps them (fla's decode reads a cache of them, extended as
/// blocks complete): `ck` `[n_c, n_kv_heads, d]`, `n_c` exactly the
/// window's compressed keys of `seq_len` tokens (`seq_len / block_size`
/// for fla's window), any key format read in place, optionally each row
/// times `ck_scale[c]` (fp8 keys; the product rounded to float32). The
/// queries are the sequence's last `n_q` tokens, as there.
///
/// Equal bit for bit to [`block_scores_window_into`] on keys whose
/// compressed keys ([`compress_window_into`]) equal `ck`'s float32 values:
/// from the compressed keys on, the two run the same code.
///
/// # Errors
/// A zero `d`, `n_kv_heads` or `block_size` (named), the window's sizes
/// (`kernel_size`, `kernel_stride`), `seq_len` 0 (`seq_len`), `ck` not
/// `[n_c, n_kv_heads, d]` for `seq_len` (`ck`), `ck_scale` not one per
/// compressed key (`ck_scale`), and the queries as
/// [`block_scores_into`] (`q`, `scale`), `out` of another size (`out`).
/// Nothing is written before every check has passed.
pub fn block_scores_compressed_into(
    q: Encoded<'_>,
    ck: Encoded<'_>,
    ck_scale: Option<&[f32]>,
    heads: Heads,
    seq_len: usize,
    (cfg, window): (&Config, Window),
    out: &mut [f32],
) -> Result<(), ArgumentError> {
    block_scores_compressed_at(
        Isa::best(),
        q,
        ck,
        ck_scale,
        heads,
        seq_len,
        (cfg, window),
        out,
    )
}

/// [`block_scores_compressed_into`] at `isa`.
#[allow(clippy::too_many_arguments)]
pub(super) fn block_scores_compressed_at(
    isa: Isa,
    q: Encoded<'_>,
    ck: Encoded<'_>,
    ck_scale: Option<&[f32]>,
    heads: Heads,
    seq_len: usize,
    (cfg, window): (&Config, Window),
    out: &mut [f32],
) -> Result<(), ArgumentError> {
    let (nb, cw) = (|| cfg.n_blocks(seq_len), (cfg, window));
    let keys = (ck, ck_scale);
    compressed_call(
        isa,
        q,
        keys,
        heads,
        seq_len,
        cw,
        out,
        (nb, "n_blocks"),
        score_row,
    )
}

/// A call on given compressed keys: [`check_compressed`], `out` exactly
/// `[n_q, n_kv_heads, width()]` (named `what` in the refusal), then
/// [`compressed_rows`].
#[allow(clippy::too_many_arguments)]
fn compressed_call<T: Send, F: RowOut<T>>(
    isa: Isa,
    q: Encoded<'_>,
    (ck, ck_scale): (Encoded<'_>, Option<&[f32]>),
    heads: Heads,
    seq_len: usize,
    cw: (&Config, Window),
    out: &mut [T],
    (width, what): (impl FnOnce() -> usize, &str),
    f: F,
) -> Result<(), ArgumentError> {
    let checked = check_compressed(q.len(), ck.len(), ck_scale, heads, seq_len, cw)?;
    // The width only now: it can divide by a block size the checks refuse.
    let (sh, width) = (&checked.0, width());
    check_out(
        out.len(),
        checked_size("out", &[sh.n_q, sh.n_kv, width])?,
        || format!("[n_q={}, n_kv_heads={}, {what}={width}]", sh.n_q, sh.n_kv),
    )?;
    compressed_rows(isa, &checked, q, (ck, ck_scale), heads, cw, out, width, f);
    Ok(())
}

/// A call's rows on given compressed keys once [`check_compressed`] has
/// passed (`checked` its result) and `out` holds `width` a row: bfloat16
/// compressed keys without scales read in place, others as float32 (times
/// their scales), each row written by `f` ([`score_row`]: the block scores;
/// [`SelectRows`]: the selection). Nothing here refuses.
#[allow(clippy::too_many_arguments)]
pub(super) fn compressed_rows<T: Send, F: RowOut<T>>(
    isa: Isa,
    (sh, n_c): &CompressedCall,
    q: Encoded<'_>,
    (ck, ck_scale): (Encoded<'_>, Option<&[f32]>),
    heads: Heads,
    (cfg, window): (&Config, Window),
    out: &mut [T],
    width: usize,
    f: F,
) {
    let cw = (cfg, window);
    if let (Encoded::Bf16(v), None) = (ck, ck_scale) {
        stage(isa, sh, q, Keys::Bf16(v), *n_c, cw, out, width, f);
    } else {
        with_compressed(ck, ck_scale, heads.n_kv_heads * heads.d, |ckv| {
            stage(isa, sh, q, Keys::F32(ckv), *n_c, cw, out, width, f)
        });
    }
}

/// [`select_window_into`] on given compressed keys (see
/// [`block_scores_compressed_into`]): `out` `[n_q, n_kv_heads,
/// block_counts]`, equal to [`select_window_into`]'s rows on keys whose
/// compressed keys equal `ck`'s values.
///
/// # Errors
/// `block_counts` 0 (`block_counts`), and as
/// [`block_scores_compressed_into`].
pub fn select_compressed_into(
    q: Encoded<'_>,
    ck: Encoded<'_>,
    ck_scale: Option<&[f32]>,
    heads: Heads,
    seq_len: usize,
    (cfg, window): (&Config, Window),
    out: &mut [i32],
) -> Result<(), ArgumentError> {
    select_compressed_at(
        Isa::best(),
        q,
        ck,
        ck_scale,
        heads,
        seq_len,
        (cfg, window),
        out,
    )
}

/// [`select_compressed_into`] at `isa`.
#[allow(clippy::too_many_arguments)]
pub(super) fn select_compressed_at(
    isa: Isa,
    q: Encoded<'_>,
    ck: Encoded<'_>,
    ck_scale: Option<&[f32]>,
    heads: Heads,
    seq_len: usize,
    (cfg, window): (&Config, Window),
    out: &mut [i32],
) -> Result<(), ArgumentError> {
    check_block_counts(cfg)?;
    let (w, cw) = (|| cfg.block_counts, (cfg, window));
    let keys = (ck, ck_scale);
    compressed_call(
        isa,
        q,
        keys,
        heads,
        seq_len,
        cw,
        out,
        (w, "block_counts"),
        SelectRows,
    )
}
