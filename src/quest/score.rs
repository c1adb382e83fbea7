//! Page scores: each query head against its KV head's page bounds (the
//! original), or the group-mean query summed over KV heads (SGLang's).

use super::kernels;
use super::Layout;
use crate::error::{check_len, ArgumentError};
use crate::keys::Format;
use crate::pool;
use crate::simd::Isa;

/// Pages per parallel task: 32 pages' bounds are `32 × 2 × n_kv_heads × d`
/// floats (256 KiB at 8 heads of 128), an L2-sized piece.
const CHUNK_PAGES: usize = 32;

/// Refuses bounds that are not whole pages of one size, or queries whose
/// heads are not a whole number of groups per KV head; the page count.
pub(super) fn check_shapes(
    q_len: usize,
    n_q_heads: usize,
    kmin: &[f32],
    kmax: &[f32],
    layout: Layout,
) -> Result<usize, ArgumentError> {
    layout.check()?;
    let (h, d, row) = (layout.n_kv_heads, layout.d, layout.row());
    if n_q_heads == 0 || !n_q_heads.is_multiple_of(h) {
        return Err(ArgumentError::Invalid {
            argument: "q",
            message: format!(
                "q has {n_q_heads} heads, not a positive multiple of the {h} KV heads (each KV \
                 head serves n_q_heads / n_kv_heads query heads)"
            ),
        });
    }
    check_len("q", q_len, n_q_heads * d, || {
        format!("[n_q_heads={n_q_heads}, d={d}]")
    })?;
    if !kmin.len().is_multiple_of(row) || kmin.len() != kmax.len() {
        return Err(ArgumentError::Invalid {
            argument: "kmin",
            message: format!(
                "kmin ({}) and kmax ({}) must both hold [n_pages, n_kv_heads={h}, d={d}]",
                kmin.len(),
                kmax.len()
            ),
        });
    }
    Ok(kmin.len() / row)
}

/// The per-head scores of one sequence's pages: `out[j, p] = Σ_i fma(q_ji,
/// q_ji ≥ 0 ? kmax[p, h, i] : kmin[p, h, i])` (`h = j / (n_q_heads /
/// n_kv_heads)`, the 8-lane order), for `q` `[n_q_heads, d]` and bounds
/// `[n_pages, n_kv_heads, d]`; `out` is `[n_q_heads, n_pages]`. Shapes are
/// the caller's to check ([`check_shapes`]). Tasks are ranges of pages,
/// every head of a page scored while its bounds are read.
pub(super) fn per_head(
    isa: Isa,
    q: &[f32],
    n_q_heads: usize,
    kmin: &[f32],
    kmax: &[f32],
    layout: Layout,
    out: &mut [f32],
) {
    let (h, d, row) = (layout.n_kv_heads, layout.d, layout.row());
    let n_pages = kmin.len() / row;
    if n_pages == 0 {
        return;
    }
    let g = n_q_heads / h;
    let n_chunks = n_pages.div_ceil(CHUNK_PAGES);
    let width = n_q_heads * CHUNK_PAGES;
    let mut scratch = vec![0.0f32; n_chunks * width];
    let min_tasks = pool::min_rows(2 * CHUNK_PAGES * row);
    pool::for_each_row_mut(&mut scratch, width, min_tasks, |c, part| {
        let p0 = c * CHUNK_PAGES;
        let len = CHUNK_PAGES.min(n_pages - p0);
        let at = p0 * row;
        kernels::scores(
            isa,
            q,
            (h, g, d),
            &kmin[at..],
            &kmax[at..],
            row,
            len,
            &mut part[..n_q_heads * len],
        );
    });
    for c in 0..n_chunks {
        let p0 = c * CHUNK_PAGES;
        let len = CHUNK_PAGES.min(n_pages - p0);
        let part = &scratch[c * width..];
        for j in 0..n_q_heads {
            out[j * n_pages + p0..j * n_pages + p0 + len]
                .copy_from_slice(&part[j * len..(j + 1) * len]);
        }
    }
}

/// SGLang's query: each KV head's group of query heads averaged, `Σ_g q_g /
/// G` in float32 (the group summed in head order, then divided), rounded to
/// `format` (the query's own dtype: SGLang averages in it; float32 and fp8
/// queries are not rounded). `[n_kv_heads, d]`.
pub(super) fn group_mean(q: &[f32], n_q_heads: usize, layout: Layout, format: Format) -> Vec<f32> {
    let (h, d) = (layout.n_kv_heads, layout.d);
    let g = n_q_heads / h;
    let mut m = vec![0.0f32; h * d];
    for kv in 0..h {
        for i in 0..d {
            let mut s = 0.0f32;
            for r in 0..g {
                s += q[(kv * g + r) * d + i];
            }
            let v = s / g as f32;
            m[kv * d + i] = match format {
                Format::Bf16 => round_bf16(v),
                Format::F16 => round_f16(v),
                Format::F32 | Format::Fp8E4m3 => v,
            };
        }
    }
    m
}

/// `x` rounded to the nearest bfloat16 (ties to even), as a float32.
pub fn round_bf16(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let b = x.to_bits();
    let r = b.wrapping_add(0x7FFF + ((b >> 16) & 1)) & 0xFFFF_0000;
    f32::from_bits(r)
}

/// `x` rounded to the nearest float16 (ties to even, overflow to ±inf,
/// subnormals kept), as a float32.
pub fn round_f16(x: f32) -> f32 {
    if !x.is_finite() {
        return x;
    }
    let a = x.abs() as f64;
    // The float16 spacing at a: 2^(e - 10) for a normal a in [2^e, 2^(e+1))
    // (e >= -14), 2^-24 below 2^-14 (subnormals); a is rounded to a
    // multiple of it, exactly in float64.
    let e = if a < 2f64.powi(-14) {
        -14
    } else {
        ((x.abs().to_bits() >> 23) & 0xFF) as i32 - 127
    };
    let q = 2f64.powi(e - 10);
    let y = (a / q).round_ties_even() * q;
    let y = if y >= 65520.0 { f64::INFINITY } else { y };
    (y as f32).copysign(x)
}

/// SGLang's scores of one sequence's pages: `out[p] = Σ_h Σ_i fma(m_hi,
/// m_hi ≥ 0 ? kmax[p, h, i] : kmin[p, h, i])`, each head's sum in the
/// 8-lane order and the heads added in order (from `0.0`), for the
/// group-mean query `m` (`[n_kv_heads, d]`, [`group_mean`]); `out` is
/// `[n_pages]`.
pub(super) fn grouped(
    isa: Isa,
    m: &[f32],
    kmin: &[f32],
    kmax: &[f32],
    layout: Layout,
    out: &mut [f32],
) {
    let (h, d, row) = (layout.n_kv_heads, layout.d, layout.row());
    let min_tasks = pool::min_rows(2 * row);
    pool::for_each_row_mut(
        out,
        CHUNK_PAGES,
        min_tasks.div_ceil(CHUNK_PAGES),
        |c, part| {
            let p0 = c * CHUNK_PAGES;
            let len = part.len();
            let mut heads = vec![0.0f32; h * len];
            let at = p0 * row;
            kernels::scores(
                isa,
                m,
                (h, 1, d),
                &kmin[at..],
                &kmax[at..],
                row,
                len,
                &mut heads,
            );
            for (p, o) in part.iter_mut().enumerate() {
                let mut s = 0.0f32;
                for kv in 0..h {
                    s += heads[kv * len + p];
                }
                *o = s;
            }
        },
    );
}
