//! The pass's kernels. Each exists at every level -- AVX-512 (`avx512.rs`:
//! the scores, the value accumulation and the softmax's exponentials),
//! AVX2+FMA (`avx2.rs`) and portable (`portable.rs`) -- and all run the same
//! per-element chains of IEEE operations, so they agree bit for bit (see
//! the module docs of [`crate::attention`]). The functions here check the
//! bounds the kernels rely on and dispatch (one [`dispatch!`] a family) by
//! the [`Isa`] they are handed, whose tokens only run-time detection
//! makes. Packed keys are in the blocks of the level that packed
//! them ([`lanes`]): pack and score with the same token.

use crate::simd::{dispatch, Isa};

/// Keys per score micro-tile: two 8-lane blocks, or one 16-lane block at
/// the AVX-512 level.
pub(crate) const KEY_TILE: usize = 16;
/// Rows per micro-tile.
pub(crate) const ROW_TILE: usize = 4;

/// The value rows of a key list: row `j` is `v[off[j]..off[j] + d_v]`.
/// Every row is checked to lie in `v` once, when the list is built (in
/// release builds too: the AVX2 and AVX-512 kernels read them through raw
/// pointers), so [`accumulate`] needs no per-call check. The offsets come from validated
/// shapes (`check_pass`) and key lists, so the check never fails.
#[derive(Clone, Copy)]
pub(super) struct ValueRows<'a> {
    v: &'a [f32],
    off: &'a [usize],
    d_v: usize,
}

impl<'a> ValueRows<'a> {
    pub(super) fn new(v: &'a [f32], off: &'a [usize], d_v: usize) -> Self {
        let last = v.len().checked_sub(d_v);
        assert!(
            off.iter().all(|&x| last.is_some_and(|l| x <= l)),
            "a value row past the end of v"
        );
        ValueRows { v, off, d_v }
    }

    /// Rows in the list.
    pub(super) fn len(&self) -> usize {
        self.off.len()
    }
}

/// Keys per packed block at this level: 16 with AVX-512 (a tile is one
/// block, a key per lane of a 512-bit register), else 8.
pub(super) fn lanes(isa: Isa) -> usize {
    match isa {
        Isa::Avx512(_) | Isa::Avx512Bf16(_) => 16,
        Isa::Avx2(_) | Isa::Scalar => 8,
    }
}

/// Packs keys `0..n` of a key list as `K^T` in blocks of `L =`
/// [`lanes`]`(isa)`: key `j`, dimension `c` at `dst[(j / L) · L d + c · L + j
/// % L]`, key `j`'s row starting at `k[offset(j)]`. `dst` gets at least
/// `round_up(n, 16) · d` entries; the padding keys' contents are
/// unspecified (their scores are masked). [`scores`] reads the blocks of
/// the level it is handed: pass both the same `isa`.
pub(crate) fn pack_keys(
    isa: Isa,
    dst: &mut Vec<f32>,
    k: &[f32],
    d: usize,
    n: usize,
    offset: impl Fn(usize) -> usize,
) {
    let len = n.next_multiple_of(KEY_TILE) * d;
    if dst.len() < len {
        dst.resize(len, 0.0);
    }
    if d == 0 {
        return;
    }
    let lanes = lanes(isa);
    // SAFETY (bounds): every row `r + d <= k.len()` (asserted in
    // `rows_of`); `d >= 1` (returned above otherwise); each block is
    // `lanes · d` floats of `dst` (`block < n / lanes`), and `first + 8 <=
    // lanes`. The AVX-512 level packs with the AVX2 kernel (a packing is a
    // copy), into its own 16-key blocks.
    let done = dispatch!("attention.pack_keys", isa, {
        avx512 => avx2,
        avx2(token) => {
            // Whole groups of 8 keys: 8×8 register transposes, the next
            // group's rows prefetched (a packing is a copy: any method gives
            // the same bits). A block of 16 takes two groups.
            let rows_of = |b: usize| {
                let mut rows = [0usize; 8];
                for (t, r) in rows.iter_mut().enumerate() {
                    *r = offset(b * 8 + t);
                    assert!(*r + d <= k.len());
                }
                rows
            };
            let groups = n / lanes * (lanes / 8);
            let mut next = (groups > 0).then(|| rows_of(0));
            for b in 0..groups {
                let rows = next.unwrap_or_else(|| rows_of(b));
                next = (b + 1 < groups).then(|| rows_of(b + 1));
                let (block, first) = (b * 8 / lanes, b * 8 % lanes);
                avx2::pack_block(
                    token,
                    k,
                    &rows,
                    next.as_ref(),
                    d,
                    &mut dst[block * lanes * d..(block + 1) * lanes * d],
                    lanes,
                    first,
                );
            }
            groups * 8
        },
        scalar => 0,
    });
    portable::pack_keys(dst, k, d, lanes, done..n, offset);
}

/// Asks for value rows `rows` of `vals` to be brought into cache ahead of
/// use: a sparse row's values are scattered, and issuing every line up
/// front overlaps their misses. No effect on results.
pub(super) fn prefetch_rows(isa: Isa, vals: ValueRows<'_>, rows: std::ops::Range<usize>) {
    let (v, voff, d_v) = (vals.v, &vals.off[rows], vals.d_v);
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        for &o in voff {
            for c in (0..d_v).step_by(16) {
                let p = v.as_ptr().wrapping_add(o + c) as *const i8;
                // SAFETY: a prefetch (baseline SSE) never faults and does
                // not dereference its pointer.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(p) };
            }
        }
    }
    let _ = (isa, v, voff, d_v);
}

/// Scores of `q_offs.len()` rows against `tiles` (1 or 2) consecutive
/// packed key tiles (packed by [`pack_keys`] with the same `isa`), times
/// `scale`, into `out[r · stride + t]`, `t < 16 · tiles`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn scores(
    isa: Isa,
    q: &[f32],
    q_offs: &[usize],
    ktiles: &[f32],
    tiles: usize,
    d: usize,
    scale: f32,
    out: &mut [f32],
    stride: usize,
) {
    let rows = q_offs.len();
    let width = tiles * KEY_TILE;
    assert!(
        (1..=ROW_TILE).contains(&rows)
            && (1..=2).contains(&tiles)
            && ktiles.len() >= width * d
            && out.len() >= (rows - 1) * stride + width
            && q_offs.iter().all(|&o| o + d <= q.len())
    );
    // The AVX2 and portable kernels take one 16-key tile a call.
    let tile = |t: usize| (&ktiles[t * KEY_TILE * d..], t * KEY_TILE);
    // SAFETY (bounds): asserted above (for one tile: its `16 d` floats, its
    // 16 columns of `out`); the tiles are in the blocks of the level they
    // are scored at (packed with the same level: 16-lane at AVX-512).
    dispatch!("attention.scores", isa, {
        avx512(t) => {
            let (k, n) = (ktiles, tiles);
            match rows {
                1 => avx512::scores::<1>(t, q, q_offs, k, n, d, scale, out, stride),
                2 => avx512::scores::<2>(t, q, q_offs, k, n, d, scale, out, stride),
                3 => avx512::scores::<3>(t, q, q_offs, k, n, d, scale, out, stride),
                _ => avx512::scores::<4>(t, q, q_offs, k, n, d, scale, out, stride),
            }
        },
        avx2(t) => for i in 0..tiles {
            let (ktile, col) = tile(i);
            let out = &mut out[col..];
            match rows {
                1 => avx2::scores::<1>(t, q, q_offs, ktile, d, scale, out, stride),
                2 => avx2::scores::<2>(t, q, q_offs, ktile, d, scale, out, stride),
                3 => avx2::scores::<3>(t, q, q_offs, ktile, d, scale, out, stride),
                _ => avx2::scores::<4>(t, q, q_offs, ktile, d, scale, out, stride),
            }
        },
        scalar => for i in 0..tiles {
            let (ktile, col) = tile(i);
            portable::scores(q, q_offs, ktile, d, scale, &mut out[col..], stride);
        },
    })
}

/// Softmax numerator in place over `s` (a multiple of 8 long, entries
/// past the row's keys already `-inf`); returns `(m, l)`.
pub(crate) fn softmax(isa: Isa, s: &mut [f32]) -> (f32, f32) {
    assert!(s.len().is_multiple_of(8));
    // SAFETY (bounds): the length is a multiple of 8 (asserted above).
    dispatch!("attention.softmax", isa, {
        avx512(t) => avx512::softmax(t, s),
        avx2(t) => avx2::softmax(t, s),
        scalar => portable::softmax(s),
    })
}

/// `o[r][c] = fma(p[r][j], v[voff[j] + c], o[r][c])` for `j` in `j0..j1`
/// ascending, rows `r0..r0 + rows` (`p` rows `stride` apart, `o` rows
/// `d_v` apart), `v`, `voff` and `d_v` being those of `vals`.
#[allow(clippy::too_many_arguments)]
pub(super) fn accumulate(
    isa: Isa,
    p: &[f32],
    stride: usize,
    r0: usize,
    rows: usize,
    vals: ValueRows<'_>,
    j0: usize,
    j1: usize,
    o: &mut [f32],
) {
    let (v, voff, d_v) = (vals.v, vals.off, vals.d_v);
    assert!(
        (1..=ROW_TILE).contains(&rows)
            && j0 <= j1
            && j1 <= voff.len()
            && (r0 + rows - 1) * stride + j1 <= p.len()
            && (r0 + rows) * d_v <= o.len()
    );
    // SAFETY (bounds): row and key bounds are asserted above, and every
    // value row is in `v` (checked when `vals` was built, `ValueRows::new`).
    dispatch!("attention.accumulate", isa, {
        avx512(t) => match rows {
            1 => avx512::accumulate::<1>(t, p, stride, r0, v, voff, j0, j1, o, d_v),
            2 => avx512::accumulate::<2>(t, p, stride, r0, v, voff, j0, j1, o, d_v),
            3 => avx512::accumulate::<3>(t, p, stride, r0, v, voff, j0, j1, o, d_v),
            _ => avx512::accumulate::<4>(t, p, stride, r0, v, voff, j0, j1, o, d_v),
        },
        avx2(t) => match rows {
            1 => avx2::accumulate::<1>(t, p, stride, r0, v, voff, j0, j1, o, d_v),
            2 => avx2::accumulate::<2>(t, p, stride, r0, v, voff, j0, j1, o, d_v),
            3 => avx2::accumulate::<3>(t, p, stride, r0, v, voff, j0, j1, o, d_v),
            _ => avx2::accumulate::<4>(t, p, stride, r0, v, voff, j0, j1, o, d_v),
        },
        scalar => portable::accumulate(p, stride, r0, rows, v, voff, j0, j1, o, d_v),
    })
}

#[cfg(target_arch = "x86_64")]
// Accumulator arrays are indexed by row on purpose: they must stay in
// registers, which iterator adaptors over them can defeat.
#[allow(clippy::needless_range_loop)]
mod avx2;
#[cfg(target_arch = "x86_64")]
#[allow(clippy::needless_range_loop)]
mod avx512;
mod portable;

/// Runs the pass's kernel families (`attention.pack_keys`, `.scores`,
/// `.softmax`, `.accumulate`) once at `isa`: the reach test's probe.
#[cfg(test)]
pub(super) fn probe(isa: Isa) {
    let (d, n) = (4, 16);
    let k: Vec<f32> = (0..n * d).map(|i| i as f32 / 64.0).collect();
    let mut packed = Vec::new();
    pack_keys(isa, &mut packed, &k, d, n, |j| j * d);
    let mut s = vec![0.0f32; n];
    scores(isa, &[1.0; 4], &[0], &packed, 1, d, 1.0, &mut s, n);
    softmax(isa, &mut s);
    let v = vec![1.0f32; n * d];
    let off: Vec<usize> = (0..n).map(|j| j * d).collect();
    let mut o = vec![0.0f32; d];
    accumulate(isa, &s, n, 0, 1, ValueRows::new(&v, &off, d), 0, n, &mut o);
    assert!(o.iter().all(|x| x.is_finite() && *x > 0.0));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::{avx2_for_test, avx512_for_test};

    /// The bits of each float: `-0.0` is not `+0.0` here.
    fn bits(x: &[f32]) -> Vec<u32> {
        x.iter().map(|v| v.to_bits()).collect()
    }

    /// Scores, softmax and value accumulation: every level, bit for bit,
    /// on ragged shapes.
    #[test]
    fn every_kernel_is_bit_identical_on_every_level() {
        let Some(token) = avx2_for_test() else {
            return;
        };
        let isa = Some(token);
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
        };
        let shapes = [
            (1, 1, 1),
            (7, 5, 2),
            (32, 32, 3),
            (64, 24, 4),
            (65, 17, 4),
            (16, 40, 1),
            (8, 57, 2),
            (128, 40, 4),
            (33, 64, 3),
            (64, 81, 4),
            (3, 7, 2),
            (9, 48, 4),
            (130, 130, 3),
        ];
        for &(d, d_v, rows) in &shapes {
            let q: Vec<f32> = (0..rows * d + 3).map(|_| next()).collect();
            let q_offs: Vec<usize> = (0..rows).map(|r| r * d + 1).collect();
            // Keys packed and scored at each level, one tile or two, against
            // the portable kernels on their own packing: the same bits.
            let keys: Vec<f32> = (0..50 * d).map(|_| next()).collect();
            let order: Vec<usize> = (0..37).map(|j| (j * 17) % 50).collect();
            let mut plain = Vec::new();
            pack_keys(Isa::Scalar, &mut plain, &keys, d, 37, |j| order[j] * d);
            let mut levels = vec![Isa::Avx2(token)];
            levels.extend(avx512_for_test().map(Isa::Avx512));
            for &level in &levels {
                let mut packed = Vec::new();
                pack_keys(level, &mut packed, &keys, d, 37, |j| order[j] * d);
                let l = lanes(level);
                for j in 0..37 {
                    for c in 0..d {
                        let got = packed[(j / l) * l * d + c * l + j % l];
                        assert_eq!(got, keys[order[j] * d + c], "pack {level:?} d={d}");
                    }
                }
                for tiles in [1, 2] {
                    let stride = 40;
                    let mut a = vec![0.0f32; rows * stride];
                    let mut b = a.clone();
                    let (qs, kp) = (&q_offs[..], &packed[..]);
                    scores(level, &q, qs, kp, tiles, d, 0.3, &mut a, stride);
                    // The portable kernels row by row: a row's scores do not
                    // depend on the rows that share its tile.
                    for r in 0..rows {
                        let (qo, o) = (&q_offs[r..r + 1], &mut b[r * stride..]);
                        scores(Isa::Scalar, &q, qo, &plain, tiles, d, 0.3, o, stride);
                    }
                    assert_eq!(bits(&a), bits(&b), "scores {level:?} d={d} tiles={tiles}");
                    let width = tiles * KEY_TILE;
                    assert!(a
                        .iter()
                        .enumerate()
                        .all(|(i, &x)| (i % stride < width) == (x != 0.0)));
                }
            }
            // Softmax over 8, 16, 40 (two 16-lane pairs and a last 8) and 48
            // scores, the last three masked.
            for len in [8, 16, 40, 48] {
                let mut sb: Vec<f32> = (0..len).map(|_| next() * 20.0).collect();
                sb[len - 3..].fill(f32::NEG_INFINITY);
                let sb_in = sb.clone();
                let mb = softmax(Isa::Scalar, &mut sb);
                for &level in &levels {
                    let mut sa = sb_in.clone();
                    let ma = softmax(level, &mut sa);
                    assert_eq!(
                        (ma.0.to_bits(), ma.1.to_bits()),
                        (mb.0.to_bits(), mb.1.to_bits()),
                        "softmax {level:?} len={len}"
                    );
                    assert_eq!(bits(&sa), bits(&sb), "softmax {level:?} len={len}");
                }
            }
            let n = 37;
            let v: Vec<f32> = (0..n * (d_v + 3)).map(|_| next()).collect();
            let voff: Vec<usize> = (0..n).map(|j| ((j * 7) % n) * (d_v + 3) + 2).collect();
            let p: Vec<f32> = (0..rows * n).map(|_| next().abs()).collect();
            let mut oa: Vec<f32> = (0..rows * d_v).map(|_| next()).collect();
            let mut ob = oa.clone();
            let vals = ValueRows::new(&v, &voff, d_v);
            let mut oc = oa.clone();
            for r in 0..rows {
                accumulate(Isa::Scalar, &p, n, r, 1, vals, 3, n, &mut ob);
            }
            accumulate(
                isa.map_or(Isa::Scalar, Isa::Avx2),
                &p,
                n,
                0,
                rows,
                vals,
                3,
                n,
                &mut oa,
            );
            assert_eq!(bits(&oa), bits(&ob), "accumulate d_v={d_v}");
            if let Some(wide) = avx512_for_test() {
                accumulate(Isa::Avx512(wide), &p, n, 0, rows, vals, 3, n, &mut oc);
                assert_eq!(bits(&oc), bits(&ob), "accumulate (AVX-512) d_v={d_v}");
            }
        }
    }
}
