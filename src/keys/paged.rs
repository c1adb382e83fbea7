//! An engine's paged key cache and the block table that addresses it,
//! read in place: the part the lightning indexer's and block selection's
//! paged forms share, and the check InfLLM-v2's and NSA's paged decodes on
//! compressed keys share (`check_compressed_decode`).
//!
//! A cache is `n_pages` pages of `block_size` tokens, `page_stride` bytes
//! apart (vLLM may interleave other layers' pages, so the stride can exceed
//! a page). Sequence `s` owns logical blocks `0, 1, …`; entry `b` of its
//! block-table row names the page holding its tokens `b·block_size ..
//! (b+1)·block_size`. vLLM pads unused block-table entries with 0, a valid
//! page id, so only the first `⌈seq_len / block_size⌉` entries of a row are
//! read ([`BlockTable::check`]), and a row shorter than that is refused.
//!
//! Two page layouts:
//!
//! - [`PageLayout::Dense`]: `[block_size, d]` elements of one format
//!   (float32, float16, bfloat16, fp8 e4m3fn), no per-key scale — vLLM's
//!   MiniMax-M3 index-K cache (`[num_blocks, 128, 128]`, bfloat16 or fp8);
//! - [`PageLayout::Fp8WithScales`]: vLLM's DSA index-K page, as
//!   `indexer_k_quant_and_cache` writes it — the `block_size × d` e4m3fn
//!   bytes first (token `t`'s at `t·d`), then `block_size` little-endian
//!   float32 scales (token `t`'s at `block_size·d + 4t`, unaligned).
//!
//! Each page's rows are decoded exactly, so a paged call equals, row for
//! row, the dense call on the same keys laid out contiguously.

use super::{decode_bf16, decode_f16, Encoded, Format};
use crate::error::{check_len, checked_size, ArgumentError};

/// How a page stores its keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageLayout {
    /// `[block_size, d]` elements of the format, no scale.
    Dense(Format),
    /// `block_size × d` e4m3fn bytes, then `block_size` float32 scales.
    Fp8WithScales,
}

impl PageLayout {
    /// The format of the keys a page stores (e4m3fn for the scaled layout,
    /// whose scales follow the keys).
    pub fn key_format(self) -> Format {
        match self {
            PageLayout::Dense(f) => f,
            PageLayout::Fp8WithScales => Format::Fp8E4m3,
        }
    }
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

    /// Refuses a cache whose pages do not fit its bytes (what [`decode`]
    /// relies on).
    ///
    /// [`decode`]: PagedCache::decode
    pub fn check(&self) -> Result<(), ArgumentError> {
        let invalid = |message: String| {
            Err(ArgumentError::Invalid {
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
            return Err(ArgumentError::TooLarge {
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

    /// Page `page`'s `block_size × d` keys in place, as their element type
    /// (the scaled layout: its e4m3fn bytes), or `None` when the page's
    /// bytes are not aligned for that type.
    ///
    /// # Panics
    /// If the page is past the cache ([`check`] makes every page of a
    /// checked cache readable).
    ///
    /// [`check`]: PagedCache::check
    pub fn page_keys(&self, page: usize) -> Option<Encoded<'_>> {
        let (n, start) = (self.block_size * self.d, page * self.page_stride);
        let format = self.layout.key_format();
        let bytes = &self.bytes[start..start + n * format.size()];
        Some(match format {
            Format::F32 => Encoded::F32(bytemuck::try_cast_slice(bytes).ok()?),
            Format::F16 => Encoded::F16(bytemuck::try_cast_slice(bytes).ok()?),
            Format::Bf16 => Encoded::Bf16(bytemuck::try_cast_slice(bytes).ok()?),
            Format::Fp8E4m3 => Encoded::Fp8E4m3(bytes),
        })
    }

    /// Rows `r0 .. r0 + keys.len() / d` of page `page`, decoded into `keys`
    /// and, for the scaled layout, their scales into `scales` (left as they
    /// are otherwise): through [`Encoded::decode`] (the SIMD decodes) when
    /// the page is aligned, byte by byte otherwise.
    ///
    /// # Panics
    /// If the page or the rows are past the cache ([`check`] makes every
    /// page of a checked cache readable).
    ///
    /// [`check`]: PagedCache::check
    pub fn decode(&self, page: usize, r0: usize, keys: &mut [f32], scales: &mut [f32]) {
        let d = self.d;
        let rows = keys.len() / d;
        let p = &self.bytes[page * self.page_stride..];
        let (a, b) = (r0 * d, (r0 + rows) * d);
        match (self.page_keys(page), self.layout) {
            (Some(k), _) => k.decode(a, keys),
            (None, PageLayout::Dense(Format::F16)) => decode_f16(&p[2 * a..2 * b], keys),
            (None, PageLayout::Dense(Format::Bf16)) => decode_bf16(&p[2 * a..2 * b], keys),
            (None, _) => {
                // A misaligned float32 page (fp8 pages are always aligned).
                for (o, b) in keys.iter_mut().zip(p[4 * a..4 * b].chunks_exact(4)) {
                    *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
        }
        if self.layout == PageLayout::Fp8WithScales {
            self.scales(page, r0, &mut scales[..rows]);
        }
    }

    /// The scales of rows `r0 .. r0 + scales.len()` of page `page` (the
    /// scaled layout; nothing to write for the dense one).
    ///
    /// # Panics
    /// As [`PagedCache::decode`].
    pub fn scales(&self, page: usize, r0: usize, scales: &mut [f32]) {
        if self.layout != PageLayout::Fp8WithScales {
            return;
        }
        let keys = self.block_size * self.d;
        let p = &self.bytes[page * self.page_stride + keys..];
        let s = &p[4 * r0..4 * (r0 + scales.len())];
        for (o, b) in scales.iter_mut().zip(s.chunks_exact(4)) {
            *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
    }
}

/// A block table with the sequence lengths it serves.
#[derive(Debug, Clone, Copy)]
pub struct BlockTable<'a> {
    /// `[n_seqs, max_blocks]`: logical block → page, per sequence.
    pub table: &'a [i32],
    pub max_blocks: usize,
    /// `[n_seqs]`: tokens each sequence holds.
    pub seq_lens: &'a [usize],
}

impl BlockTable<'_> {
    /// Sequences described.
    pub fn n_seqs(&self) -> usize {
        self.seq_lens.len()
    }

    /// The page holding logical block `b` of sequence `s`.
    ///
    /// # Panics
    /// If the entry is past the table. After [`check`], every entry a
    /// sequence's tokens need is a page of the cache.
    ///
    /// [`check`]: BlockTable::check
    #[inline]
    pub fn page(&self, s: usize, b: usize) -> usize {
        self.table[s * self.max_blocks + b] as usize
    }

    /// Refuses, for a cache of `n_pages` pages of `block_size` tokens: a
    /// table whose length is not `n_seqs × max_blocks`, a sequence longer
    /// than an int32 position can name or than its row covers, and an entry
    /// that would be read and is negative or past the cache. Entries past
    /// `⌈seq_lens[s] / block_size⌉` are never read, so never checked.
    pub fn check(&self, n_pages: usize, block_size: usize) -> Result<(), ArgumentError> {
        let (n_seqs, mb) = (self.n_seqs(), self.max_blocks);
        let len = checked_size("block_table", &[n_seqs, mb])?;
        check_len("block_table", self.table.len(), len, || {
            format!("[n_seqs={n_seqs} (seq_lens), max_blocks={mb}]")
        })?;
        let out_of_range = |argument, index, message| {
            Err(ArgumentError::OutOfRange {
                argument,
                index,
                message,
            })
        };
        for (s, &len) in self.seq_lens.iter().enumerate() {
            check_len_fits(s, len)?;
            let needed = len.div_ceil(block_size.max(1));
            if needed > mb {
                let message = format!(
                    "seq_lens[{s}] = {len} needs {needed} blocks of {block_size}, but block_table \
                     rows have {mb}"
                );
                return out_of_range("block_table", s * mb, message);
            }
            let row = &self.table[s * mb..][..needed];
            if let Some((b, &page)) = row
                .iter()
                .enumerate()
                .find(|&(_, &p)| p < 0 || p as usize >= n_pages)
            {
                let message = format!(
                    "block_table[{s}, {b}] = {page} is not a page of the cache (0..{n_pages})"
                );
                return out_of_range("block_table", s * mb + b, message);
            }
        }
        Ok(())
    }

    /// Refuses a sequence id that names no sequence, in the words and
    /// variant a packed batch refuses one with.
    pub fn check_seq_ids(&self, seq_ids: &[usize]) -> Result<(), ArgumentError> {
        crate::packed::check_seq_ids(seq_ids, self.n_seqs(), "seq_lens")
    }
}

/// `seq_lens[s] = len` within an int32 position: every paged form's check
/// of a length (a token's position is an `int32`).
pub(crate) fn check_len_fits(s: usize, len: usize) -> Result<(), ArgumentError> {
    if len > i32::MAX as usize {
        return Err(ArgumentError::OutOfRange {
            argument: "seq_lens",
            index: s,
            message: format!(
                "seq_lens[{s}] = {len}: a sequence holds at most {} tokens (an int32 position)",
                i32::MAX
            ),
        });
    }
    Ok(())
}

/// The lengths of a decode step's sequences, each decoding one query at its
/// last token: `1 ..= i32::MAX` tokens. The paged decode forms (MoBA's,
/// NSA's, InfLLM-v2's) check them before anything else is sized by them.
pub(crate) fn check_decode_lens(seq_lens: &[usize]) -> Result<(), ArgumentError> {
    match seq_lens
        .iter()
        .position(|&l| l == 0 || l > i32::MAX as usize)
    {
        Some(s) => Err(ArgumentError::OutOfRange {
            argument: "seq_lens",
            index: s,
            message: format!(
                "seq_lens[{s}] = {}: a decoding query's sequence holds 1 ..= {} tokens",
                seq_lens[s],
                i32::MAX
            ),
        }),
        None => Ok(()),
    }
}

/// A paged cache of compressed keys read at decode (InfLLM-v2's and NSA's
/// paged forms): sequence `s` holds `seq_lens[s]` tokens, decodes one query
/// at its last, and its `compressed_len(seq_lens[s])` compressed keys are
/// rows `0, 1, …` of its block-table row's pages (a cache row `n_kv_heads ·
/// d` elements, every KV head's key). Checks the cache ([`PagedCache::check`]),
/// its rows (`kv_cache`), each length (`seq_lens`: 1 ..= an int32 position),
/// each row of the table against its sequence's compressed keys, not its
/// tokens (`block_table`: long enough, every entry read a page of the
/// cache); returns each sequence's compressed-key count.
///
/// A table row is checked for the pages its compressed keys fill, not its
/// tokens': an engine's table of compressed keys has a page per `block_size`
/// compressed keys (vLLM pads the rest with 0, never read).
pub(crate) fn check_compressed_decode(
    cache: &PagedCache<'_>,
    table: &BlockTable<'_>,
    n_kv_heads: usize,
    d: usize,
    compressed_len: impl Fn(usize) -> usize,
) -> Result<Vec<usize>, ArgumentError> {
    cache.check()?;
    let row = checked_size("kv_cache", &[n_kv_heads, d])?;
    if cache.d != row {
        let message = format!(
            "the cache's rows hold {} elements, not n_kv_heads * d = {row}",
            cache.d
        );
        return Err(ArgumentError::Invalid {
            argument: "kv_cache",
            message,
        });
    }
    let lens = table.seq_lens;
    check_decode_lens(lens)?;
    let mut n_c = Vec::with_capacity(lens.len());
    for (s, &len) in lens.iter().enumerate() {
        let c = compressed_len(len);
        let needed = c.div_ceil(cache.block_size.max(1));
        if needed > table.max_blocks {
            return Err(ArgumentError::OutOfRange {
                argument: "block_table",
                index: s * table.max_blocks,
                message: format!(
                    "seq_lens[{s}] = {len} tokens have {c} compressed keys, which need {needed} \
                     pages of {}, but block_table rows have {}",
                    cache.block_size, table.max_blocks
                ),
            });
        }
        n_c.push(c);
    }
    // The rows the compressed keys need, checked as every paged form checks
    // its table (lengths, entries inside the cache).
    let rows = BlockTable {
        table: table.table,
        max_blocks: table.max_blocks,
        seq_lens: &n_c,
    };
    rows.check(cache.n_pages, cache.block_size)?;
    Ok(n_c)
}
