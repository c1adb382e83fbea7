//! Page bounds: built from dense or packed keys, from an engine's paged
//! cache, and updated as a decode step writes one key.

use super::kernels;
use super::{pages_of, Layout};
use crate::error::{check_len, checked_size, ArgumentError};
use crate::keys::{BlockTable, Encoded, PagedCache};
use crate::pool;
use crate::simd::Isa;
use rayon::prelude::*;

/// Tokens `0..n` of one sequence, read as rows of `layout.row()` floats:
/// `row(t, out)` decodes token `t`'s keys into `out` and returns its scale.
trait Tokens: Sync {
    fn n_tokens(&self) -> usize;
    fn row(&self, isa: Isa, t: usize, scratch: &mut [f32]) -> Option<f32>;
    /// Tokens `t0..t1` as rows in place in their format, with their
    /// scales, when the keys are stored so (dense keys).
    fn in_place(&self, _t0: usize, _t1: usize) -> Option<(Encoded<'_>, Option<&[f32]>)> {
        None
    }
}

/// A sequence's keys held contiguously (`[n_tokens, n_kv_heads, d]`).
struct Dense<'a> {
    keys: Encoded<'a>,
    scales: Option<&'a [f32]>,
    start: usize,
    n: usize,
    row: usize,
}

impl Tokens for Dense<'_> {
    fn n_tokens(&self) -> usize {
        self.n
    }
    fn row(&self, isa: Isa, t: usize, scratch: &mut [f32]) -> Option<f32> {
        let at = (self.start + t) * self.row;
        self.keys.decode_at(isa, at, &mut scratch[..self.row]);
        self.scales.map(|s| s[self.start + t])
    }
    fn in_place(&self, t0: usize, t1: usize) -> Option<(Encoded<'_>, Option<&[f32]>)> {
        let (a, b) = (self.start + t0, self.start + t1);
        let rows = self.keys.slice(a * self.row, b * self.row);
        Some((rows, self.scales.map(|s| &s[a..b])))
    }
}

/// A sequence's keys in an engine's paged cache, through its block-table row.
struct Paged<'a> {
    cache: &'a PagedCache<'a>,
    table: &'a BlockTable<'a>,
    seq: usize,
}

impl Tokens for Paged<'_> {
    fn n_tokens(&self) -> usize {
        self.table.seq_lens[self.seq]
    }
    fn row(&self, _isa: Isa, t: usize, scratch: &mut [f32]) -> Option<f32> {
        let bs = self.cache.block_size;
        let page = self.table.page(self.seq, t / bs);
        let mut scale = [0.0f32];
        self.cache
            .decode(page, t % bs, &mut scratch[..self.cache.d], &mut scale);
        (self.cache.layout == crate::keys::PageLayout::Fp8WithScales).then_some(scale[0])
    }
    fn in_place(&self, t0: usize, t1: usize) -> Option<(Encoded<'_>, Option<&[f32]>)> {
        // A Quest page is a cache page: tokens t0..t1 are the first rows of
        // one page, read in place when it holds keys alone (aligned).
        if self.cache.layout == crate::keys::PageLayout::Fp8WithScales {
            return None;
        }
        let page = self.table.page(self.seq, t0 / self.cache.block_size);
        let keys = self.cache.page_keys(page)?;
        Some((keys.slice(0, (t1 - t0) * self.cache.d), None))
    }
}

/// Writes one sequence's bounds (`n_pages` rows of `kmin` / `kmax`) from
/// its tokens: page `p`'s bounds over tokens `p·P .. min((p+1)·P, n)`
/// ([`kernels::page_bounds`]; the same bits as folding them in order).
/// Dense keys are read in place in their format, and so are a paged cache's
/// pages but for the fp8-with-scales layout's (decoded a page at a time into
/// a scratch); the kernel asks the next page's keys ahead as it reads. Pages
/// run in parallel on the pool.
fn build<T: Tokens>(isa: Isa, tokens: &T, layout: Layout, kmin: &mut [f32], kmax: &mut [f32]) {
    let (row, p_size) = (layout.row(), layout.page_size);
    let n = tokens.n_tokens();
    let page = |p: usize, lo: &mut [f32], hi: &mut [f32]| {
        let (t0, t1) = (p * p_size, ((p + 1) * p_size).min(n));
        if let Some((rows, scales)) = tokens.in_place(t0, t1) {
            // The next page's keys (none past the last), asked ahead by the
            // kernel.
            let next = (t1 < n)
                .then(|| tokens.in_place(t1, ((p + 2) * p_size).min(n)))
                .flatten()
                .map_or(&[][..], |(r, _)| r.bytes(0, r.len()));
            kernels::page_bounds(isa, rows, scales, lo, hi, next);
            return;
        }
        let mut scratch = vec![0.0f32; (t1 - t0) * row];
        let mut scales = vec![0.0f32; t1 - t0];
        let mut scaled = false;
        for t in t0..t1 {
            let at = (t - t0) * row;
            if let Some(c) = tokens.row(isa, t, &mut scratch[at..at + row]) {
                scales[t - t0] = c;
                scaled = true;
            }
        }
        kernels::page_bounds(
            isa,
            Encoded::F32(&scratch),
            scaled.then_some(&scales[..]),
            lo,
            hi,
            &[],
        );
    };
    let min_pages = pool::min_rows(p_size * row);
    pool::install(|parallel| {
        if parallel {
            kmin.par_chunks_mut(row)
                .zip(kmax.par_chunks_mut(row))
                .with_min_len(min_pages)
                .enumerate()
                .for_each(|(p, (lo, hi))| page(p, lo, hi));
        } else {
            for (p, (lo, hi)) in kmin.chunks_mut(row).zip(kmax.chunks_mut(row)).enumerate() {
                page(p, lo, hi);
            }
        }
    });
}

/// Refuses outputs that are not `n_pages × row` floats each.
fn check_out(
    kmin: &[f32],
    kmax: &[f32],
    n_pages: usize,
    layout: Layout,
) -> Result<(), ArgumentError> {
    let want = checked_size("kmin", &[n_pages, layout.n_kv_heads, layout.d])?;
    let shape = || {
        format!(
            "[n_pages={n_pages}, n_kv_heads={}, d={}]",
            layout.n_kv_heads, layout.d
        )
    };
    for (name, got) in [("kmin", kmin.len()), ("kmax", kmax.len())] {
        if got != want {
            return Err(ArgumentError::OutputSize {
                argument: name,
                expected: want,
                actual: got,
                shape: shape(),
            });
        }
    }
    Ok(())
}

/// The page bounds of dense keys, or of a packed batch of sequences.
///
/// `keys` is `[n_tokens, n_kv_heads, d]` row-major in any key format,
/// `key_scale` one float32 scale per token (`[n_tokens]`, fp8 keys' per-key
/// scale; a key's value is then `k · scale`, rounded to float32), and
/// `cu_seqlens` the packed sequences' token offsets (`[n_seqs + 1]`, from 0
/// to `n_tokens`; `None`: one sequence). `kmin` and `kmax` receive each
/// sequence's `⌈len / page_size⌉` pages, sequence after sequence (`[Σ
/// n_pages, n_kv_heads, d]`); the number of pages is returned.
///
/// # Errors
/// `keys` not a whole number of `n_kv_heads × d` rows (`keys`), a layout
/// with a zero (`n_kv_heads`, `d`, `page_size`), `key_scale` not one per
/// token (`key_scale`), `cu_seqlens` not rising from 0 to `n_tokens`
/// (`cu_seqlens`), outputs of another size (`kmin`, `kmax`). Nothing is
/// written before every check has passed.
pub fn bounds_into(
    keys: Encoded<'_>,
    key_scale: Option<&[f32]>,
    cu_seqlens: Option<&[usize]>,
    layout: Layout,
    kmin: &mut [f32],
    kmax: &mut [f32],
) -> Result<usize, ArgumentError> {
    layout.check()?;
    let row = layout.row();
    if !keys.len().is_multiple_of(row) {
        return Err(ArgumentError::Invalid {
            argument: "keys",
            message: format!(
                "keys hold {} elements, not a whole number of rows of n_kv_heads × d = {row}",
                keys.len()
            ),
        });
    }
    let n = keys.len() / row;
    if let Some(s) = key_scale {
        check_len("key_scale", s.len(), n, || format!("[n_tokens={n}]"))?;
    }
    let whole = [0, n];
    let cu = cu_seqlens.unwrap_or(&whole);
    check_cu(cu, n)?;
    let n_pages: usize = cu
        .windows(2)
        .map(|w| pages_of(w[1] - w[0], layout.page_size))
        .sum();
    check_out(kmin, kmax, n_pages, layout)?;
    let isa = Isa::best();
    let mut at = 0;
    for w in cu.windows(2) {
        let np = pages_of(w[1] - w[0], layout.page_size);
        let tokens = Dense {
            keys,
            scales: key_scale,
            start: w[0],
            n: w[1] - w[0],
            row,
        };
        let span = at * row..(at + np) * row;
        build(
            isa,
            &tokens,
            layout,
            &mut kmin[span.clone()],
            &mut kmax[span],
        );
        at += np;
    }
    Ok(n_pages)
}

/// Refuses offsets that do not rise from 0 to `n`.
fn check_cu(cu: &[usize], n: usize) -> Result<(), ArgumentError> {
    let bad = |index: usize, message: String| {
        Err(ArgumentError::OutOfRange {
            argument: "cu_seqlens",
            index,
            message,
        })
    };
    if cu.len() < 2 || cu[0] != 0 {
        return bad(
            0,
            format!("cu_seqlens must start at 0 and hold n_seqs + 1 >= 2 offsets, got {cu:?}"),
        );
    }
    if let Some(i) = (1..cu.len()).find(|&i| cu[i] < cu[i - 1]) {
        return bad(
            i,
            format!(
                "cu_seqlens[{i}] = {} is below cu_seqlens[{}] = {}",
                cu[i],
                i - 1,
                cu[i - 1]
            ),
        );
    }
    if cu[cu.len() - 1] != n {
        let i = cu.len() - 1;
        return bad(
            i,
            format!("cu_seqlens[{i}] = {} but keys hold {n} tokens", cu[i]),
        );
    }
    Ok(())
}

/// The page bounds of the sequences of an engine's paged cache.
///
/// `cache` holds pages of `page_size` tokens (the cache's `block_size` is
/// the Quest page: a Quest page is a cache page), each token a row of
/// `n_kv_heads × d` keys (`cache.d` is that product); fp8 pages with
/// per-token scales read `k · scale` as [`bounds_into`] does. Sequence `s`
/// covers `table.seq_lens[s]` tokens through its block-table row. The
/// bounds are written as [`bounds_into`]'s for the same keys laid out
/// densely, sequence after sequence; the number of pages is returned.
///
/// # Errors
/// As [`bounds_into`], and: a cache whose pages do not fit its bytes
/// (`kv_cache`), a page size other than the layout's or a row other than
/// `n_kv_heads × d` (`kv_cache`), a block table that does not cover its
/// sequences or names a page outside the cache (`block_table`,
/// `seq_lens`).
pub fn bounds_paged_into(
    cache: &PagedCache<'_>,
    table: &BlockTable<'_>,
    layout: Layout,
    kmin: &mut [f32],
    kmax: &mut [f32],
) -> Result<usize, ArgumentError> {
    layout.check()?;
    cache.check()?;
    if cache.block_size != layout.page_size || cache.d != layout.row() {
        return Err(ArgumentError::Invalid {
            argument: "kv_cache",
            message: format!(
                "the cache's pages hold {} tokens of {} elements, but Quest pages of {} tokens \
                 of n_kv_heads × d = {} were asked for",
                cache.block_size,
                cache.d,
                layout.page_size,
                layout.row()
            ),
        });
    }
    table.check(cache.n_pages, cache.block_size)?;
    let n_pages: usize = table
        .seq_lens
        .iter()
        .map(|&l| pages_of(l, layout.page_size))
        .sum();
    check_out(kmin, kmax, n_pages, layout)?;
    let (isa, row) = (Isa::best(), layout.row());
    let mut at = 0;
    for s in 0..table.n_seqs() {
        let np = pages_of(table.seq_lens[s], layout.page_size);
        let tokens = Paged {
            cache,
            table,
            seq: s,
        };
        let span = at * row..(at + np) * row;
        build(
            isa,
            &tokens,
            layout,
            &mut kmin[span.clone()],
            &mut kmax[span],
        );
        at += np;
    }
    Ok(n_pages)
}

/// A decode step's update: token `pos`'s keys (`[n_kv_heads, d]`, scaled by
/// `key_scale` when given) folded into the bounds of its page, `pos /
/// page_size`, in `O(n_kv_heads × d)`. The page's first token
/// (`pos % page_size == 0`) *sets* its bounds, so a page is never bounded
/// over the stale slots of an earlier sequence; every later one folds in.
/// Updating tokens `0, 1, …, n − 1` in order gives, bit for bit, the
/// bounds [`bounds_into`] builds from the same keys.
///
/// # Errors
/// `key` not `n_kv_heads × d` elements (`key`), bounds not a whole number
/// of pages or of different sizes (`kmin`, `kmax`), `pos` in no page they
/// hold (`pos`). Nothing is written then.
pub fn update_bounds(
    key: Encoded<'_>,
    key_scale: Option<f32>,
    pos: usize,
    layout: Layout,
    kmin: &mut [f32],
    kmax: &mut [f32],
) -> Result<(), ArgumentError> {
    layout.check()?;
    let row = layout.row();
    check_len("key", key.len(), row, || {
        format!("[n_kv_heads={}, d={}]", layout.n_kv_heads, layout.d)
    })?;
    if !kmin.len().is_multiple_of(row) || kmin.len() != kmax.len() {
        return Err(ArgumentError::Invalid {
            argument: "kmin",
            message: format!(
                "kmin ({}) and kmax ({}) must both hold [n_pages, n_kv_heads, d] with \
                 n_kv_heads × d = {row}",
                kmin.len(),
                kmax.len()
            ),
        });
    }
    let (page, slot) = (pos / layout.page_size, pos % layout.page_size);
    let n_pages = kmin.len() / row;
    if page >= n_pages {
        return Err(ArgumentError::OutOfRange {
            argument: "pos",
            index: 0,
            message: format!(
                "pos = {pos} is in page {page}, but the bounds hold {n_pages} pages of {}",
                layout.page_size
            ),
        });
    }
    let isa = Isa::best();
    let mut scratch = vec![0.0f32; row];
    key.decode_at(isa, 0, &mut scratch);
    let span = page * row..(page + 1) * row;
    kernels::fold(
        isa,
        &scratch,
        key_scale,
        slot == 0,
        &mut kmin[span.clone()],
        &mut kmax[span],
    );
    Ok(())
}
