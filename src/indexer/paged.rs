//! The paged form: keys read in place from an engine's paged cache,
//! addressed through a block table.
//!
//! A cache is `n_pages` pages of `block_size` tokens, `page_stride` bytes
//! apart (vLLM may interleave other layers' pages, so the stride can exceed
//! a page). Sequence `s` owns logical blocks `0, 1, …`; entry `b` of its
//! block-table row names the page holding its tokens `b·block_size ..
//! (b+1)·block_size`. vLLM pads unused block-table entries with 0, a valid
//! page id, so only the first `⌈seq_len / block_size⌉` entries of a row are
//! read, and a row shorter than that is refused.
//!
//! Two page layouts:
//!
//! - [`PageLayout::Dense`]: `[block_size, d]` elements of one format
//!   (float32, float16, bfloat16, fp8 e4m3fn), no per-key scale;
//! - [`PageLayout::Fp8WithScales`]: vLLM's DSA index-K page, as
//!   `indexer_k_quant_and_cache` writes it — the `block_size × d` e4m3fn
//!   bytes first (token `t`'s at `t·d`), then `block_size` little-endian
//!   float32 scales (token `t`'s at `block_size·d + 4t`, unaligned).
//!
//! Each page's rows are decoded exactly, so a paged call equals, row for
//! row, the dense call on the same keys laid out contiguously.

use super::{check_segments_and_topk, for_each_query, kernels, KEY_CHUNK};
use crate::error::{check_len, checked_size, AttentionError};
use crate::keys::{bf16_to_f32, f16_to_f32, Encoded, Format};
use crate::{pool, simd};

/// How a page stores its keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageLayout {
    /// `[block_size, d]` elements of the format, no scale.
    Dense(Format),
    /// `block_size × d` e4m3fn bytes, then `block_size` float32 scales.
    Fp8WithScales,
}

/// An engine's paged key cache, borrowed as bytes.
#[derive(Debug, Clone, Copy)]
pub struct PagedCache<'a> {
    /// From the first page's first byte to the last page's last.
    pub bytes: &'a [u8],
    pub n_pages: usize,
    /// Bytes from one page's start to the next's.
    pub page_stride: usize,
    pub block_size: usize,
    pub d: usize,
    pub layout: PageLayout,
}

impl PagedCache<'_> {
    /// Bytes one page occupies.
    pub fn page_bytes(&self) -> Option<usize> {
        let keys = self.block_size.checked_mul(self.d)?;
        match self.layout {
            PageLayout::Dense(f) => keys.checked_mul(f.size()),
            PageLayout::Fp8WithScales => keys.checked_add(self.block_size.checked_mul(4)?),
        }
    }

    fn check(&self) -> Result<(), AttentionError> {
        let invalid = |message: String| {
            Err(AttentionError::Invalid {
                argument: "kv_cache",
                message,
            })
        };
        if self.block_size == 0 || self.d == 0 {
            return invalid(format!(
                "block_size={} and d={} must both be at least 1",
                self.block_size, self.d
            ));
        }
        let Some(page) = self.page_bytes() else {
            return Err(AttentionError::TooLarge {
                argument: "kv_cache",
            });
        };
        if self.n_pages > 0 && self.page_stride < page {
            return invalid(format!(
                "pages are {} bytes apart but hold {page}",
                self.page_stride
            ));
        }
        let need = match self.n_pages {
            0 => Some(0),
            n => (n - 1)
                .checked_mul(self.page_stride)
                .and_then(|x| x.checked_add(page)),
        };
        match need {
            Some(need) if need <= self.bytes.len() => Ok(()),
            _ => invalid(format!(
                "{} pages of {page} bytes, {} bytes apart, do not fit the {} bytes given",
                self.n_pages,
                self.page_stride,
                self.bytes.len()
            )),
        }
    }

    /// Rows `0..rows` of page `page`, decoded into `keys` (`rows × d`) and,
    /// for the scaled layout, their scales into `scales`.
    fn decode(&self, page: usize, rows: usize, keys: &mut [f32], scales: &mut [f32]) {
        let (d, bs) = (self.d, self.block_size);
        let p = &self.bytes[page * self.page_stride..];
        let n = rows * d;
        match self.layout {
            PageLayout::Dense(Format::F32) => {
                for (o, b) in keys[..n].iter_mut().zip(p.chunks_exact(4)) {
                    *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
            PageLayout::Dense(f @ (Format::F16 | Format::Bf16)) => {
                let dec = if f == Format::F16 {
                    f16_to_f32
                } else {
                    bf16_to_f32
                };
                for (o, b) in keys[..n].iter_mut().zip(p.chunks_exact(2)) {
                    *o = dec(u16::from_le_bytes([b[0], b[1]]));
                }
            }
            PageLayout::Dense(Format::Fp8E4m3) | PageLayout::Fp8WithScales => {
                Encoded::Fp8E4m3(&p[..n]).decode(0, &mut keys[..n]);
            }
        }
        if self.layout == PageLayout::Fp8WithScales {
            let s = &p[bs * d..bs * d + 4 * rows];
            for (o, b) in scales[..rows].iter_mut().zip(s.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
    }
}

/// The inputs of a paged call.
#[derive(Debug, Clone, Copy)]
pub struct PagedInputs<'a> {
    /// `[n_queries, n_heads, d]`.
    pub q: Encoded<'a>,
    /// `[n_queries, n_heads]`.
    pub weights: &'a [f32],
    pub cache: PagedCache<'a>,
    /// `[n_seqs, max_blocks]`: logical block → page, per sequence.
    pub block_table: &'a [i32],
    pub max_blocks: usize,
    /// `[n_seqs]`: tokens each sequence holds.
    pub seq_lens: &'a [usize],
    /// `[n_queries]`: each query's sequence.
    pub seq_ids: &'a [usize],
    /// `[n_queries]`: each query's position within its sequence.
    pub query_pos: &'a [usize],
}

/// [`super::indexer_topk_into`] over a paged cache (see the module docs):
/// query `i` sees tokens `0 .. min(query_pos[i] + 1, seq_lens[s])` of its
/// sequence `s = seq_ids[i]`, and its row holds positions within that
/// sequence. Refuses, before writing anything, a block-table entry that
/// would be read and is negative or past the cache, a block-table row
/// shorter than its sequence needs, and every shape mismatch.
#[allow(clippy::too_many_arguments)]
pub fn indexer_topk_paged_into(
    n_queries: usize,
    n_heads: usize,
    inputs: &PagedInputs<'_>,
    topk: usize,
    num_segments: usize,
    out: &mut [i32],
    scores: Option<&mut [f32]>,
) -> Result<(), AttentionError> {
    let c = inputs.cache;
    c.check()?;
    check_segments_and_topk(topk, num_segments)?;
    let (n, h, d, bs) = (n_queries, n_heads, c.d, c.block_size);
    let q_len = checked_size("index_q", &[n, h, d])?;
    check_len("index_q", inputs.q.len(), q_len, || {
        format!("[n_queries={n}, n_heads={h}, d={d}]")
    })?;
    check_len(
        "weights",
        inputs.weights.len(),
        checked_size("weights", &[n, h])?,
        || format!("[{n}, {h}]"),
    )?;
    let n_seqs = inputs.seq_lens.len();
    let bt_len = checked_size("block_table", &[n_seqs, inputs.max_blocks])?;
    check_len("block_table", inputs.block_table.len(), bt_len, || {
        format!(
            "[n_seqs={n_seqs} (seq_lens), max_blocks={}]",
            inputs.max_blocks
        )
    })?;
    check_len("seq_ids", inputs.seq_ids.len(), n, || {
        format!("[n_queries={n}]")
    })?;
    check_len("query_pos", inputs.query_pos.len(), n, || {
        format!("[n_queries={n}]")
    })?;
    let o_len = checked_size("out", &[n, topk])?;
    check_len("out", out.len(), o_len, || {
        format!("[n_queries={n}, topk={topk}]")
    })?;
    if let Some(s) = scores.as_deref() {
        check_len("scores", s.len(), o_len, || {
            format!("[n_queries={n}, topk={topk}]")
        })?;
    }
    let out_of_range = |argument, index, message| {
        Err(AttentionError::OutOfRange {
            argument,
            index,
            message,
        })
    };
    for (s, &len) in inputs.seq_lens.iter().enumerate() {
        if len > i32::MAX as usize {
            return out_of_range(
                "seq_lens",
                s,
                format!(
                    "seq_lens[{s}] = {len}: positions past {} do not fit the int32 output",
                    i32::MAX
                ),
            );
        }
        let needed = len.div_ceil(bs);
        if needed > inputs.max_blocks {
            let message = format!(
                "seq_lens[{s}] = {len} needs {needed} blocks of {bs}, but block_table rows have {}",
                inputs.max_blocks
            );
            return out_of_range("block_table", s * inputs.max_blocks, message);
        }
        let row = &inputs.block_table[s * inputs.max_blocks..][..needed];
        if let Some((b, &page)) = row
            .iter()
            .enumerate()
            .find(|&(_, &p)| p < 0 || p as usize >= c.n_pages)
        {
            let message = format!(
                "block_table[{s}, {b}] = {page} is not a page of the cache (0..{})",
                c.n_pages
            );
            return out_of_range("block_table", s * inputs.max_blocks + b, message);
        }
    }
    if let Some((i, &s)) = inputs
        .seq_ids
        .iter()
        .enumerate()
        .find(|&(_, &s)| s >= n_seqs)
    {
        return out_of_range(
            "seq_ids",
            i,
            format!("seq_ids[{i}] = {s} is out of range: {n_seqs} sequence(s)"),
        );
    }
    let level = simd::avx2();
    let max_len = inputs.seq_lens.iter().copied().max().unwrap_or(0);
    let min_blocks = pool::min_rows(bs.saturating_mul(h).saturating_mul(d)).max(KEY_CHUNK / bs / 4);
    for_each_query(
        (n, h, d),
        &inputs.q,
        inputs.weights,
        max_len,
        topk,
        num_segments,
        out,
        scores,
        |i, q, w, row| {
            let s = inputs.seq_ids[i];
            let len = inputs.query_pos[i]
                .saturating_add(1)
                .min(inputs.seq_lens[s]);
            let table = &inputs.block_table[s * inputs.max_blocks..];
            pool::for_each_row_mut(&mut row[..len], bs, min_blocks, |b, chunk| {
                // Checked above: the first ⌈len / bs⌉ entries are pages of the cache.
                let page = table[b] as usize;
                let mut keys = vec![0.0f32; chunk.len() * d];
                let mut scale = vec![1.0f32; chunk.len()];
                c.decode(page, chunk.len(), &mut keys, &mut scale);
                let scale = (c.layout == PageLayout::Fp8WithScales).then_some(&scale[..]);
                kernels::score_keys(level, q, w, &Encoded::F32(&keys), scale, 0, chunk);
            });
            len
        },
    );
    Ok(())
}
