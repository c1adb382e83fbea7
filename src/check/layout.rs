//! The engines' row layouts, read back to row-relative ids.
//!
//! vLLM's sparse MLA backends do not hand the attention kernel row-relative
//! positions: `triton_convert_req_index_to_global_index`
//! (`vllm/v1/attention/backends/mla/sparse_utils.py`) maps position `t` of
//! request `r` to the global slot `block_table[r, t / B] · stride + t % B`
//! (`stride` the cache's rows per block, `B` or more when other layers'
//! pages sit between this cache's blocks), keeps `-1`, and maps a prefill
//! row's `t` to `workspace_starts[prefill_req] + t` instead. MiniMax-M3's
//! physical block ids are the same map with one "token" per block.
//!
//! [`Inverse::to_relative`] inverts it exactly: a slot names page
//! `slot / stride` at offset `slot % stride`, the page is looked up among the
//! request's table entries (the first logical block holding it wins), and a
//! slot that names no page of the table, or an offset past the page, becomes
//! [`super::UNMAPPED`] — reported with the engine's value, never
//! silently dropped.
//!
//! Decode context parallelism (DCP) splits a request's tokens over
//! `dcp_size` ranks, `dcp_interleave` at a time (token `t` lives on rank
//! `(t / il) % size`, at local position `(t / (size · il)) · il + t % il` of
//! that rank's own cache and block table), and each rank's converter keeps
//! only the slots it owns (`-1` for the rest, or its valid slots compacted
//! to the front). One rank's row is a share of the selection, which the
//! rule cannot judge alone; the ranks' rows side by side are the selection.
//! So a DCP map takes every rank's block table and reads slot `j` of a row
//! `[size · topk]` wide as rank `j / topk`'s, mapping its local position back
//! to the token; padding may then sit inside each rank's part.

use std::collections::HashMap;

use super::UNMAPPED;
use crate::error::ArgumentError;

/// The parameters of the global-slot map, one entry per checked row where
/// per-row.
#[derive(Debug, Clone, Copy)]
pub struct GlobalSlots<'a> {
    /// `[n_requests, max_blocks]` physical page ids (negative: unused).
    pub block_table: &'a [i32],
    pub max_blocks: usize,
    /// Tokens per page `B`.
    pub block_size: usize,
    /// Rows of the flat cache view per page (`>= block_size`).
    pub stride: usize,
    /// The request of each checked row.
    pub req_ids: &'a [usize],
    /// Per row, the prefill request index into `workspace_starts`, or
    /// negative for a decode row; `None`: every row is a decode row.
    pub prefill_req_ids: Option<&'a [i64]>,
    pub workspace_starts: &'a [i64],
    /// DCP ranks (1: none); with more, `block_table` is `[dcp_size,
    /// n_requests, max_blocks]`, one table per rank.
    pub dcp_size: usize,
    /// Consecutive tokens per rank in DCP's round robin.
    pub dcp_interleave: usize,
}

/// Each (rank, request)'s page → logical block map, built once.
pub struct Inverse<'a> {
    map: GlobalSlots<'a>,
    pages: HashMap<(usize, usize), HashMap<i64, usize>>,
}

impl<'a> GlobalSlots<'a> {
    /// Refuses parameters that do not describe `n_rows` rows.
    pub fn check(&self, n_rows: usize) -> Result<(), ArgumentError> {
        let invalid = |argument, message: String| Err(ArgumentError::Invalid { argument, message });
        if self.block_size == 0 {
            return invalid("block_size", "block_size must be at least 1".into());
        }
        if self.stride < self.block_size {
            return invalid(
                "block_stride_rows",
                format!(
                    "block_stride_rows = {} is below block_size = {}: pages would overlap",
                    self.stride, self.block_size
                ),
            );
        }
        if self.dcp_size == 0 || self.dcp_interleave == 0 {
            let arg = if self.dcp_size == 0 {
                "dcp_size"
            } else {
                "dcp_interleave"
            };
            return invalid(arg, format!("{arg} must be at least 1"));
        }
        let per_table = self.max_blocks.saturating_mul(self.dcp_size);
        let n_req = match self.block_table.len().checked_div(per_table) {
            Some(n) if n * per_table == self.block_table.len() => n,
            _ => {
                return invalid(
                    "block_table",
                    "block_table must be [n_requests, max_blocks] (one per DCP rank, \
                     [dcp_size, n_requests, max_blocks], with dcp_size > 1) with \
                     max_blocks >= 1"
                        .into(),
                )
            }
        };
        if self.req_ids.len() != n_rows {
            return invalid(
                "req_ids",
                format!(
                    "req_ids has {} entries for {n_rows} rows",
                    self.req_ids.len()
                ),
            );
        }
        if let Some((i, &r)) = self.req_ids.iter().enumerate().find(|(_, &r)| r >= n_req) {
            return Err(ArgumentError::OutOfRange {
                argument: "req_ids",
                index: i,
                message: format!("req_ids[{i}] = {r} but block_table has {n_req} requests"),
            });
        }
        if let Some(p) = self.prefill_req_ids {
            if p.len() != n_rows {
                return invalid(
                    "prefill_req_ids",
                    format!("prefill_req_ids has {} entries for {n_rows} rows", p.len()),
                );
            }
            let n_ws = self.workspace_starts.len();
            if let Some((i, &r)) = p
                .iter()
                .enumerate()
                .find(|(_, &r)| r >= 0 && r as usize >= n_ws)
            {
                return Err(ArgumentError::OutOfRange {
                    argument: "prefill_req_ids",
                    index: i,
                    message: format!(
                        "prefill_req_ids[{i}] = {r} but workspace_starts has {n_ws} entries"
                    ),
                });
            }
        }
        Ok(())
    }

    /// The inverse map of every request the rows name, on every rank
    /// (after [`Self::check`]).
    pub fn inverse(self) -> Inverse<'a> {
        let mut pages: HashMap<(usize, usize), HashMap<i64, usize>> = HashMap::new();
        let n_req = self.block_table.len() / (self.max_blocks * self.dcp_size);
        for rank in 0..self.dcp_size {
            for &r in self.req_ids {
                pages.entry((rank, r)).or_insert_with(|| {
                    let at = (rank * n_req + r) * self.max_blocks;
                    let row = &self.block_table[at..][..self.max_blocks];
                    let mut m = HashMap::with_capacity(row.len());
                    for (b, &page) in row.iter().enumerate().filter(|(_, &p)| p >= 0) {
                        m.entry(i64::from(page)).or_insert(b);
                    }
                    m
                });
            }
        }
        Inverse { map: self, pages }
    }
}

impl Inverse<'_> {
    /// Row `i`'s engine entries `raw` as row-relative ids in `out`:
    /// negative entries stay padding, an entry naming no position of the
    /// row's request becomes [`UNMAPPED`]. With DCP, `raw` is the ranks'
    /// rows side by side (`raw.len()` a multiple of `dcp_size`).
    pub fn to_relative(&self, i: usize, raw: &[i64], out: &mut Vec<i64>) {
        let m = &self.map;
        out.clear();
        let prefill = m
            .prefill_req_ids
            .and_then(|p| usize::try_from(p[i]).ok())
            .map(|r| m.workspace_starts[r]);
        let share = raw.len() / m.dcp_size.max(1);
        // Each rank's page map for this row's request, looked up once.
        let maps: Vec<&HashMap<i64, usize>> = (0..m.dcp_size)
            .map(|rank| &self.pages[&(rank, m.req_ids[i])])
            .collect();
        let (bs, stride) = (m.block_size as i64, m.stride as i64);
        let (size, il) = (m.dcp_size as i64, m.dcp_interleave as i64);
        out.extend(raw.iter().enumerate().map(|(j, &g)| {
            if g < 0 {
                return g;
            }
            if let Some(start) = prefill {
                return match g.checked_sub(start) {
                    Some(t) if t >= 0 => t,
                    _ => UNMAPPED,
                };
            }
            let rank = j.checked_div(share).unwrap_or(0);
            let (page, off) = (g / stride, g % stride);
            let local = match maps[rank].get(&page) {
                Some(&b) if off < bs => (b as i64).checked_mul(bs).and_then(|x| x.checked_add(off)),
                _ => None,
            };
            // The rank's local position back to the request's token.
            local
                .and_then(|l| {
                    (l / il)
                        .checked_mul(size * il)?
                        .checked_add(rank as i64 * il)?
                        .checked_add(l % il)
                })
                .unwrap_or(UNMAPPED)
        }));
    }
}
