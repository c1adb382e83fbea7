//! The indexer's paged form: keys read in place from an engine's paged
//! cache, addressed through a block table (the cache, its layouts and the
//! table's checks are [`crate::keys::paged`]'s). Each page's rows are
//! decoded exactly, so a paged call equals, row for row, the dense call on
//! the same keys laid out contiguously.

use super::kernels::{self, KeyTerms, Keys, Want};
use super::run::{self, Queries, Rows};
use super::{check_ratio, check_segments_and_topk, visible, IndexerOptions, KEY_CHUNK};
use crate::error::{check_len, checked_size, ArgumentError};
use crate::keys::{BlockTable, Encoded, PageLayout, PagedCache};
use crate::simd;

/// The inputs of a paged call.
#[derive(Debug, Clone, Copy)]
pub struct PagedInputs<'a> {
    /// `[n_queries, n_heads, d]`.
    pub q: Encoded<'a>,
    /// `[n_queries, n_heads]`.
    pub weights: &'a [f32],
    pub cache: PagedCache<'a>,
    /// Each sequence's pages and length.
    pub table: BlockTable<'a>,
    /// `[n_queries]`: each query's sequence.
    pub seq_ids: &'a [usize],
    /// `[n_queries]`: each query's token position within its sequence.
    pub query_pos: &'a [usize],
    /// Tokens per key ([`super::IndexerInputs::compress_ratio`]): the
    /// cache's rows are compressed entries, `seq_lens` counts entries.
    pub compress_ratio: usize,
}

/// [`super::indexer_topk_into`] over a paged cache (see the module docs):
/// query `i` sees keys `0 .. min((query_pos[i] + 1) / compress_ratio,
/// seq_lens[s])` of its sequence `s = seq_ids[i]`, and its row holds positions within that
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
) -> Result<(), ArgumentError> {
    let options = IndexerOptions::default();
    let (n, h, segs) = (n_queries, n_heads, num_segments);
    indexer_topk_paged_with_into(n, h, inputs, topk, segs, &options, out, scores)
}

/// [`indexer_topk_paged_into`] with the family's options
/// ([`super::indexer_topk_with_into`]).
#[allow(clippy::too_many_arguments)]
pub fn indexer_topk_paged_with_into(
    n_queries: usize,
    n_heads: usize,
    inputs: &PagedInputs<'_>,
    topk: usize,
    num_segments: usize,
    options: &IndexerOptions,
    out: &mut [i32],
    scores: Option<&mut [f32]>,
) -> Result<(), ArgumentError> {
    let c = inputs.cache;
    c.check()?;
    check_segments_and_topk(topk, num_segments)?;
    check_ratio(inputs.compress_ratio)?;
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
    let table = inputs.table;
    table.check(c.n_pages, bs)?;
    table.check_seq_ids(inputs.seq_ids)?;
    options.check(topk, num_segments)?;
    let level = simd::Isa::best();
    let (seq_lens, seq_ids, query_pos) = (table.seq_lens, inputs.seq_ids, inputs.query_pos);
    let ratio = inputs.compress_ratio;
    let queries = Queries {
        n,
        h,
        d,
        level,
        magnitude: false,
        q: &inputs.q,
        weights: inputs.weights,
        relu: options.relu(),
        same_keys: |i: usize, j: usize| seq_ids[i] == seq_ids[j],
        len: |i: usize| visible(query_pos[i], ratio, seq_lens[seq_ids[i]]),
    };
    let rows = Rows {
        topk,
        num_segments,
        rule: options.rule(),
        out,
        scores,
    };
    // A chunk is whole pages, about KEY_CHUNK tokens.
    let pages = (KEY_CHUNK / bs).max(1);
    let score = |i0: usize,
                 chunk: usize,
                 group: &[_],
                 outs: &mut [&mut [f32]],
                 mut terms: Option<KeyTerms<'_>>| {
        let s = seq_ids[i0];
        let (mut scale, mut spare) = (vec![1.0f32; bs], vec![0.0f32; bs]);
        let (mut decoded, mut scratch) = (Vec::new(), kernels::Scratch::new(d));
        let cut = |p: usize, len: usize| (p * bs).min(len)..((p + 1) * bs).min(len);
        let reads = |p: usize, outs: &[&mut [f32]]| {
            outs.iter()
                .map(|o| cut(p, o.len()).len())
                .max()
                .unwrap_or(0)
        };
        for p in 0..pages {
            let tokens = reads(p, outs);
            if tokens == 0 {
                break;
            }
            // Checked above: the first ⌈len / bs⌉ entries are pages of the cache.
            let page = table.page(s, chunk * pages + p);
            c.scales(page, 0, &mut scale[..tokens]);
            let scale = (c.layout == PageLayout::Fp8WithScales).then_some(&scale[..tokens]);
            // The page's keys in place (the kernel decodes each block of
            // them); a misaligned page is decoded first.
            let enc = match c.page_keys(page) {
                Some(k) => k,
                None => {
                    decoded.resize(tokens * d, 0.0);
                    c.decode(page, 0, &mut decoded, &mut spare[..tokens]);
                    Encoded::F32(&decoded)
                }
            };
            // The next page of this chunk (if a query reads it) is where the
            // keys go on: its first block is prefetched during this page's last.
            let then = match p + 1 < pages && reads(p + 1, outs) > 0 {
                true => c.page_keys(table.page(s, chunk * pages + p + 1)),
                false => None,
            };
            let then = then.map_or(&[][..], |k| k.bytes(0, kernels::BLOCK * d));
            let mut page_outs: Vec<&mut [f32]> = outs
                .iter_mut()
                .map(|o| {
                    let r = cut(p, o.len());
                    &mut o[r]
                })
                .collect();
            let keys = Keys { enc, scale, then };
            let page_terms = terms.as_mut().map(|t| KeyTerms {
                g: &mut t.g[p * bs..],
                c: &mut t.c[p * bs..],
                screen: t.screen,
            });
            kernels::score_keys(
                level,
                group,
                keys,
                0,
                &mut page_outs,
                page_terms.map_or(Want::Scores, Want::Terms),
                &mut scratch,
            );
        }
    };
    // A key of the row being made exact: decoded from its page.
    let key = |i0: usize, t: usize, row: &mut [f32]| {
        let mut scale = [1.0f32];
        c.decode(table.page(seq_ids[i0], t / bs), t % bs, row, &mut scale);
        scale[0]
    };
    let fetch = |i0: usize, t: usize| {
        if let Some(k) = c.page_keys(table.page(seq_ids[i0], t / bs)) {
            crate::keys::prefetch_key(k.bytes(t % bs * d, d));
        }
    };
    run::select_rows(queries, rows, pages * bs, score, key, fetch);
    Ok(())
}
