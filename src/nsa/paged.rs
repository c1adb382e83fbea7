//! NSA's selection at decode over an engine's paged cache of compressed
//! keys: [`select_paged_into`] and [`block_scores_paged_into`].
//!
//! # The rule
//!
//! Sequence `s` holds `seq_lens[s]` tokens and decodes one query at its
//! last token, `p = seq_lens[s] − 1` (`q` `[n_seqs, n_q_heads, d]`). Its
//! compressed keys — the window's `compressed_len(seq_lens[s])` of them
//! (fla's: `seq_lens[s] / block_size`; Eq. 9's: `(seq_lens[s] −
//! kernel_size) / kernel_stride + 1`, 0 below `kernel_size` tokens) — lie
//! in an engine's cache of pages of `page` rows, key `j` in row `j % page`
//! of page `block_table[s, j / page]`, a row every KV head's key (`n_kv ·
//! d` elements; [`crate::keys::PagedCache`]'s layouts: one format, or fp8
//! bytes then one float32 scale a key). Each row is the dense call's
//! ([`super::select_compressed_into`]) on the sequence's compressed keys
//! laid out densely, fp8 keys given their scales as `ck_scale`.
//!
//! # Why the bits are the dense call's
//!
//! At decode the dense call scores every key the query sees (`visible(p)
//! = compressed_len(seq_len)`: all of them) with stage 1's kernels, whose
//! bits depend only on the keys' float32 values, the query and the scale
//! (`src/infllm/heads.rs`, "why the bits are `score::group_sums`'s": each
//! logit its own chain, the maximum exact, the softmax's lanes fixed by the
//! key's index). Here each (sequence, KV head) row runs the same kernels'
//! staged form (`infllm::heads::Staged`, one query: any group size) a page at a time
//! (the page walk shared with InfLLM-v2's paged selection,
//! [`crate::infllm::paged`]):
//! the keys of a page are handed to it in place (float32 and bfloat16 pages
//! as their own elements, which is what the dense call reads), or, for the
//! other formats, the row's KV head's `d` elements decoded (elementwise,
//! exact) and, with scales, each multiplied by its key's scale (one float32
//! product, as the dense call's `ck_scale`). Keys arrive in order with
//! their indices, so every logit, maximum and lane sum is the dense call's;
//! then the same softmax, group sum (`Staged::finish`), block scores
//! ([`super::block_scores`]) and row. A sequence whose query sees no key
//! scores its forced blocks only, as the dense call does.
//!
//! What would break it: a key handed to the kernels under another index
//! (its softmax lane moves), a scale applied after the dot rather than to
//! the key, a page read past the sequence's keys (a stale row of a reused
//! page would enter the softmax). The differential tests
//! (`tests/python/test_nsa_paged.py`) check the rows and scores bit for bit
//! against the dense call at every SIMD level.
//!
//! # Speed
//!
//! The pages are read in place, the fp8 / float16 rows of one KV head
//! decoded a page at a time into a small buffer; nothing is gathered. Rows
//! (sequence, KV head) run on the crate's pool.

use super::api::{
    check_block_counts, check_heads, check_out, check_sizes, decoded, score_row, select_row,
};
use super::{block_scores, Config, Window};
use crate::error::{check_len, checked_size, ArgumentError};
use crate::infllm::paged::{group_sums, Row};
use crate::keys::paged::check_compressed_decode;
use crate::keys::{BlockTable, Encoded, Heads, PagedCache};
use crate::simd::Isa;

/// A paged call checked: each sequence's compressed-key count.
struct Checked {
    n_c: Vec<usize>,
    n_seqs: usize,
}

/// The checks of a paged call, in the dense call's order where they share
/// one: the sizes (`d`, `n_kv_heads`, `block_size`), the window, the
/// queries' heads and the scale (`q`, `scale`), then the cache, lengths and
/// table ([`check_compressed_decode`]), then `q` one query a sequence.
fn check(
    q_len: usize,
    cache: &PagedCache<'_>,
    table: &BlockTable<'_>,
    heads: Heads,
    (cfg, window): (&Config, Window),
) -> Result<Checked, ArgumentError> {
    let Heads {
        n_q_heads,
        n_kv_heads,
        d,
    } = heads;
    check_sizes(n_kv_heads, d, cfg.block_size)?;
    window.check(cfg.block_size)?;
    check_heads(heads, cfg)?;
    let geo = window.geometry(cfg.block_size);
    let n_c = check_compressed_decode(cache, table, n_kv_heads, d, |n| geo.compressed_len(n))?;
    let n = n_c.len();
    let qrow = checked_size("q", &[n_q_heads, d])?;
    check_len("q", q_len, checked_size("q", &[n, qrow])?, || {
        format!("[n_seqs={n}, n_q_heads={n_q_heads}, d={d}]")
    })?;
    Ok(Checked { n_c, n_seqs: n })
}

/// A thread's scratch for a row's blocks, reused across the rows and
/// calls it computes (stage 1's is [`crate::infllm::paged`]'s).
#[derive(Default)]
struct Scratch {
    blocks: Vec<f32>,
    ids: Vec<u64>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::default();
}

/// Runs `f(row, block_scores, ids)` for every sequence `s` and KV head `g`
/// (row `s · n_kv + g` of `out`, `width` wide), on the crate's pool.
#[allow(clippy::too_many_arguments)]
fn run<T: Send>(
    isa: Isa,
    q: Encoded<'_>,
    cache: &PagedCache<'_>,
    table: &BlockTable<'_>,
    ck: &Checked,
    heads: Heads,
    (cfg, window): (&Config, Window),
    out: &mut [T],
    width: usize,
    f: impl Fn(&mut [T], &[f32], &mut Vec<u64>) + Sync + Send,
) {
    let Heads {
        n_q_heads,
        n_kv_heads: n_kv,
        d,
    } = heads;
    let geo = window.geometry(cfg.block_size);
    let g_heads = n_q_heads / n_kv;
    let qv = decoded(q, None, 0);
    let rows = BlockTable {
        table: table.table,
        max_blocks: table.max_blocks,
        seq_lens: &ck.n_c,
    };
    let most = ck.n_c.iter().copied().max().unwrap_or(0);
    let work = g_heads * most.max(1) * d;
    crate::pool::for_each_row_mut(out, width, crate::pool::min_rows(work), |r, o| {
        let (s, g) = (r / n_kv, r % n_kv);
        let p = table.seq_lens[s] - 1;
        let nb = cfg.n_blocks(p + 1);
        // Every compressed key of the sequence is visible to its last token.
        let n_vis = geo.visible(p).min(ck.n_c[s]);
        let q0 = (s * n_q_heads + g * g_heads) * d;
        let row = Row {
            s,
            g,
            q0,
            heads: g_heads,
            d,
        };
        group_sums(isa, &qv, cache, &rows, row, n_vis, cfg.scale, |sums| {
            SCRATCH.with_borrow_mut(|sc| {
                let Scratch { blocks, ids } = sc;
                blocks.clear();
                blocks.resize(nb, 0.0);
                block_scores(cfg, window, sums, p, blocks);
                f(o, blocks, ids);
            })
        });
    });
}

/// NSA's block scores at decode over a paged cache of compressed keys
/// (see the module docs): `out` `[n_seqs, n_kv_heads, max_blocks]`,
/// `max_blocks` the most blocks of a sequence (`⌈seq_lens[s] /
/// block_size⌉`); row `(s, g)` the dense call's
/// ([`super::block_scores_compressed_into`]) on sequence `s`'s compressed
/// keys laid out densely, then NaN.
///
/// # Errors
/// A zero `d`, `n_kv_heads` or `block_size` (named), the window's sizes
/// (`kernel_size`, `kernel_stride`), `q`'s heads not a positive multiple of
/// the KV heads (`q`), a non-finite `scale`; the cache refused as
/// [`PagedCache::check`] refuses it, or its rows not `n_kv_heads · d`
/// (`kv_cache`); a `seq_lens` entry 0 or past an int32 position
/// (`seq_lens`); a block-table row too short for its sequence's compressed
/// keys, or an entry it reads outside the cache (`block_table`); `q` not
/// `[n_seqs, n_q_heads, d]` (`q`); `out` of another size. Nothing is
/// written before every check has passed.
pub fn block_scores_paged_into(
    q: Encoded<'_>,
    cache: &PagedCache<'_>,
    table: &BlockTable<'_>,
    heads: Heads,
    (cfg, window): (&Config, Window),
    out: &mut [f32],
) -> Result<(), ArgumentError> {
    block_scores_paged_at(Isa::best(), q, cache, table, heads, (cfg, window), out)
}

/// [`block_scores_paged_into`] at `isa`.
pub(super) fn block_scores_paged_at(
    isa: Isa,
    q: Encoded<'_>,
    cache: &PagedCache<'_>,
    table: &BlockTable<'_>,
    heads: Heads,
    (cfg, window): (&Config, Window),
    out: &mut [f32],
) -> Result<(), ArgumentError> {
    let ck = check(q.len(), cache, table, heads, (cfg, window))?;
    let n_kv_heads = heads.n_kv_heads;
    let n = ck.n_seqs;
    let nb = table
        .seq_lens
        .iter()
        .map(|&l| cfg.n_blocks(l))
        .max()
        .unwrap_or(0);
    check_out(
        out.len(),
        checked_size("out", &[n, n_kv_heads, nb])?,
        || format!("[n_seqs={n}, n_kv_heads={n_kv_heads}, max_blocks={nb}]"),
    )?;
    run(
        isa,
        q,
        cache,
        table,
        &ck,
        heads,
        (cfg, window),
        out,
        nb,
        score_row,
    );
    Ok(())
}

/// NSA's selection at decode over a paged cache of compressed keys (see
/// the module docs): `out` `[n_seqs, n_kv_heads, block_counts]`, row `(s,
/// g)` the dense call's ([`super::select_compressed_into`]) on sequence
/// `s`'s compressed keys laid out densely.
///
/// # Errors
/// `block_counts` 0 (`block_counts`), and as [`block_scores_paged_into`].
pub fn select_paged_into(
    q: Encoded<'_>,
    cache: &PagedCache<'_>,
    table: &BlockTable<'_>,
    heads: Heads,
    (cfg, window): (&Config, Window),
    out: &mut [i32],
) -> Result<(), ArgumentError> {
    select_paged_at(Isa::best(), q, cache, table, heads, (cfg, window), out)
}

/// [`select_paged_into`] at `isa`.
pub(super) fn select_paged_at(
    isa: Isa,
    q: Encoded<'_>,
    cache: &PagedCache<'_>,
    table: &BlockTable<'_>,
    heads: Heads,
    (cfg, window): (&Config, Window),
    out: &mut [i32],
) -> Result<(), ArgumentError> {
    check_block_counts(cfg)?;
    let ck = check(q.len(), cache, table, heads, (cfg, window))?;
    let n_kv_heads = heads.n_kv_heads;
    let (n, w) = (ck.n_seqs, cfg.block_counts);
    check_out(out.len(), checked_size("out", &[n, n_kv_heads, w])?, || {
        format!("[n_seqs={n}, n_kv_heads={n_kv_heads}, block_counts={w}]")
    })?;
    run(
        isa,
        q,
        cache,
        table,
        &ck,
        heads,
        (cfg, window),
        out,
        w,
        select_row,
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    //! The paged rows and scores equal the dense call's on the same keys,
    //! bit for bit, at every level: float32, bfloat16, a misaligned float32
    //! cache, fp8 with scales; pages shuffled; groups of 1, 2 and 16; fla's
    //! window and Eq. 9's, a sequence below one block and one below the
    //! kernel.

    use super::super::api::{block_scores_compressed_at, select_compressed_at};
    use super::*;
    use crate::keys::{Format, PageLayout};
    use crate::simd::isas_for_test;

    /// A tiny LCG (the inputs fixed by the seed).
    fn next(seed: &mut u64) -> u64 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *seed >> 33
    }

    fn rand(seed: &mut u64, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| (next(seed) % (1 << 24)) as f32 / (1 << 24) as f32 * 4.0 - 2.0)
            .collect()
    }

    #[derive(Clone, Copy, Debug)]
    enum Kind {
        F32,
        F32Misaligned,
        Bf16,
        Fp8Scaled,
    }

    #[test]
    fn paged_equals_dense_compressed_at_every_level() {
        let eq9 = Window::Eq9 {
            kernel_size: 8,
            kernel_stride: 4,
        };
        let mut seed = 45u64;
        for kind in [Kind::F32, Kind::F32Misaligned, Kind::Bf16, Kind::Fp8Scaled] {
            for &(hq, n_kv, d, page, window) in &[
                (16usize, 1usize, 24usize, 3usize, Window::Fla),
                (2, 2, 8, 1, Window::Fla),
                (4, 2, 16, 5, eq9),
                (32, 2, 16, 16, eq9),
            ] {
                let bs = 16;
                let lens = [300usize, 5, 7, 64, 17];
                let geo = window.geometry(bs);
                let n_c: Vec<usize> = lens.iter().map(|&l| geo.compressed_len(l)).collect();
                let row = n_kv * d;
                let per_page = n_c.iter().map(|c| c.div_ceil(page)).collect::<Vec<_>>();
                let n_pages = per_page.iter().sum::<usize>() + 2;
                // Page `p` of the cache is the `perm[p]`-th handed out.
                let mut perm: Vec<usize> = (0..n_pages).collect();
                for i in (1..n_pages).rev() {
                    perm.swap(i, next(&mut seed) as usize % (i + 1));
                }
                let max_blocks = per_page.iter().copied().max().unwrap_or(0) + 1;
                let mut table = vec![0i32; lens.len() * max_blocks];
                // Each sequence's dense compressed keys (the elements) and scales.
                let vals = rand(&mut seed, n_c.iter().sum::<usize>() * row);
                let fp8: Vec<u8> = (0..vals.len())
                    .map(|_| {
                        let b = next(&mut seed) as u8;
                        if b & 0x7f == 0x7f {
                            0x3f
                        } else {
                            b
                        }
                    })
                    .collect();
                let scales: Vec<f32> = rand(&mut seed, n_c.iter().sum())
                    .iter()
                    .map(|x| x.abs() + 0.01)
                    .collect();
                let bf: Vec<u16> = vals.iter().map(|x| (x.to_bits() >> 16) as u16).collect();
                let (elem, layout) = match kind {
                    Kind::F32 | Kind::F32Misaligned => (4, PageLayout::Dense(Format::F32)),
                    Kind::Bf16 => (2, PageLayout::Dense(Format::Bf16)),
                    Kind::Fp8Scaled => (1, PageLayout::Fp8WithScales),
                };
                let scaled = matches!(kind, Kind::Fp8Scaled);
                let page_bytes = page * row * elem + if scaled { 4 * page } else { 0 };
                let stride = page_bytes + 8; // pages apart (another layer's bytes between)
                let off = usize::from(matches!(kind, Kind::F32Misaligned));
                let mut bytes = vec![0xabu8; off + n_pages * stride];
                let mut handed = 0;
                let mut c0 = 0;
                for (s, &c) in n_c.iter().enumerate() {
                    for b in 0..c.div_ceil(page) {
                        let p = perm[handed];
                        handed += 1;
                        table[s * max_blocks + b] = p as i32;
                        let at = off + p * stride;
                        for r in 0..page.min(c - b * page) {
                            let j = c0 + b * page + r;
                            let el = &mut bytes[at + r * row * elem..at + (r + 1) * row * elem];
                            match kind {
                                Kind::F32 | Kind::F32Misaligned => el.copy_from_slice(
                                    bytemuck::cast_slice(&vals[j * row..(j + 1) * row]),
                                ),
                                Kind::Bf16 => el.copy_from_slice(bytemuck::cast_slice(
                                    &bf[j * row..(j + 1) * row],
                                )),
                                Kind::Fp8Scaled => {
                                    el.copy_from_slice(&fp8[j * row..(j + 1) * row]);
                                    let sa = at + page * row + 4 * r;
                                    bytes[sa..sa + 4].copy_from_slice(&scales[j].to_le_bytes());
                                }
                            }
                        }
                    }
                    c0 += c;
                }
                let cache = PagedCache {
                    bytes: &bytes[off..],
                    n_pages,
                    page_stride: stride,
                    block_size: page,
                    d: row,
                    layout,
                };
                let bt = BlockTable {
                    table: &table,
                    max_blocks,
                    seq_lens: &lens,
                };
                let q = rand(&mut seed, lens.len() * hq * d);
                let c = Config {
                    scale: 0.7,
                    ..Config::fla(d)
                };
                let c = Config {
                    block_size: bs,
                    block_counts: 4,
                    ..c
                };
                let nb = lens.iter().map(|&l| c.n_blocks(l)).max().unwrap();
                for isa in isas_for_test() {
                    let mut got_s = vec![0.0f32; lens.len() * n_kv * nb];
                    let mut got_r = vec![9i32; lens.len() * n_kv * 4];
                    let qe = Encoded::F32(&q);
                    block_scores_paged_at(
                        isa,
                        qe,
                        &cache,
                        &bt,
                        Heads {
                            n_q_heads: hq,
                            n_kv_heads: n_kv,
                            d,
                        },
                        (&c, window),
                        &mut got_s,
                    )
                    .unwrap();
                    select_paged_at(
                        isa,
                        qe,
                        &cache,
                        &bt,
                        Heads {
                            n_q_heads: hq,
                            n_kv_heads: n_kv,
                            d,
                        },
                        (&c, window),
                        &mut got_r,
                    )
                    .unwrap();
                    let mut c0 = 0;
                    for (s, (&len, &cn)) in lens.iter().zip(&n_c).enumerate() {
                        let qs = Encoded::F32(&q[s * hq * d..(s + 1) * hq * d]);
                        let (ck, sc) = match kind {
                            Kind::F32 | Kind::F32Misaligned => {
                                (Encoded::F32(&vals[c0 * row..(c0 + cn) * row]), None)
                            }
                            Kind::Bf16 => (Encoded::Bf16(&bf[c0 * row..(c0 + cn) * row]), None),
                            Kind::Fp8Scaled => (
                                Encoded::Fp8E4m3(&fp8[c0 * row..(c0 + cn) * row]),
                                Some(&scales[c0..c0 + cn]),
                            ),
                        };
                        let snb = c.n_blocks(len);
                        let mut want_s = vec![0.0f32; n_kv * snb];
                        let mut want_r = vec![0i32; n_kv * 4];
                        let cw = (&c, window);
                        block_scores_compressed_at(
                            isa,
                            qs,
                            ck,
                            sc,
                            Heads {
                                n_q_heads: hq,
                                n_kv_heads: n_kv,
                                d,
                            },
                            len,
                            cw,
                            &mut want_s,
                        )
                        .unwrap();
                        select_compressed_at(
                            isa,
                            qs,
                            ck,
                            sc,
                            Heads {
                                n_q_heads: hq,
                                n_kv_heads: n_kv,
                                d,
                            },
                            len,
                            cw,
                            &mut want_r,
                        )
                        .unwrap();
                        for g in 0..n_kv {
                            let r = (s * n_kv + g) * nb;
                            let got = &got_s[r..r + nb];
                            let want = &want_s[g * snb..(g + 1) * snb];
                            let bits =
                                |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                            assert_eq!(bits(&got[..snb]), bits(want), "{kind:?} {isa:?} {s} {g}");
                            assert!(got[snb..].iter().all(|x| x.is_nan()));
                        }
                        let r = s * n_kv * 4;
                        assert_eq!(&got_r[r..r + n_kv * 4], &want_r[..], "{kind:?} {isa:?} {s}");
                        c0 += cn;
                    }
                    assert!(got_s.iter().any(|x| x.is_finite() && *x > 0.0));
                }
            }
        }
    }

    #[test]
    fn refusals_name_the_argument_and_write_nothing() {
        let row = 16;
        let bytes: Vec<u8> = vec![0; 4 * 8 * row * 4];
        let cache = PagedCache {
            bytes: &bytes,
            n_pages: 4,
            page_stride: 8 * row * 4,
            block_size: 8,
            d: row,
            layout: PageLayout::Dense(crate::keys::Format::F32),
        };
        let q = [1.0f32; 4 * 8];
        let c = Config {
            block_size: 16,
            ..Config::fla(8)
        };
        // 300 tokens: 18 compressed keys, 3 pages of 8.
        let refuse = |table: &[i32], lens: &[usize], hq: usize, n_kv: usize, c: Config| {
            let bt = BlockTable {
                table,
                max_blocks: table.len() / lens.len().max(1),
                seq_lens: lens,
            };
            let mut out = vec![7i32; lens.len() * n_kv * c.block_counts];
            let e = select_paged_into(
                Encoded::F32(&q[..lens.len() * hq * 8]),
                &cache,
                &bt,
                Heads {
                    n_q_heads: hq,
                    n_kv_heads: n_kv,
                    d: 8,
                },
                (&c, Window::Fla),
                &mut out,
            )
            .unwrap_err();
            assert!(out.iter().all(|&x| x == 7));
            e.argument()
        };
        assert_eq!(refuse(&[0, 1], &[300], 4, 2, c), "block_table");
        assert_eq!(refuse(&[0, 1, 4], &[300], 4, 2, c), "block_table");
        assert_eq!(refuse(&[0, 1, 2], &[0], 4, 2, c), "seq_lens");
        assert_eq!(refuse(&[0, 1, 2], &[300], 4, 3, c), "q");
        assert_eq!(refuse(&[0, 1, 2], &[300], 4, 4, c), "kv_cache");
        let zero = Config {
            block_counts: 0,
            ..c
        };
        assert_eq!(refuse(&[0, 1, 2], &[300], 4, 2, zero), "block_counts");
        let nan = Config {
            scale: f32::NAN,
            ..c
        };
        assert_eq!(refuse(&[0, 1, 2], &[300], 4, 2, nan), "scale");
    }
}
