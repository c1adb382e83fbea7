//! The pass's kernels. Each exists twice -- AVX2+FMA (`avx2.rs`) and
//! portable (`portable.rs`) -- and both run the same per-element chains of
//! IEEE operations, so they agree bit for bit (see the module docs of
//! [`crate::attention`]). The functions here check the bounds the kernels
//! rely on and dispatch: to AVX2 when handed an [`Avx2`] token (which only
//! run-time detection makes), else to the portable twin.

use crate::simd::Avx2;

/// Keys per score micro-tile: two 8-lane blocks.
pub(super) const KEY_TILE: usize = 16;
/// Rows per micro-tile.
pub(super) const ROW_TILE: usize = 4;

/// The value rows of a key list: row `j` is `v[off[j]..off[j] + d_v]`.
/// Every row is checked to lie in `v` once, when the list is built (in
/// release builds too: the AVX2 kernel reads them through raw pointers), so
/// [`accumulate`] needs no per-call check. The offsets come from validated
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

/// Packs keys `0..n` of a key list as `K^T` in blocks of 8: key `j`,
/// dimension `c` at `dst[(j / 8) · 8d + c · 8 + j % 8]`, key `j`'s row
/// starting at `k[offset(j)]`. `dst` gets at least
/// `round_up(n, 16) · d` entries; the padding keys' contents are
/// unspecified (their scores are masked).
pub(super) fn pack_keys(
    isa: Option<Avx2>,
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
    #[allow(unused_mut)] // only the AVX2 branch packs ahead of the portable tail
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if let Some(token) = isa {
        // Whole blocks of 8 keys: 8×8 register transposes, the next
        // block's rows prefetched (a packing is a copy: any method gives
        // the same bits).
        let rows_of = |b: usize| {
            let mut rows = [0usize; 8];
            for (t, r) in rows.iter_mut().enumerate() {
                *r = offset(b * 8 + t);
                assert!(*r + d <= k.len());
            }
            rows
        };
        let blocks = n / 8;
        let mut next = (blocks > 0).then(|| rows_of(0));
        for b in 0..blocks {
            let rows = next.unwrap_or_else(|| rows_of(b));
            next = (b + 1 < blocks).then(|| rows_of(b + 1));
            // SAFETY: `token` proves AVX2+FMA (only run-time detection
            // makes one); every row `r + d <= k.len()` (asserted in
            // `rows_of`), and the block is `8 d` floats.
            unsafe {
                avx2::pack_block(
                    token,
                    k,
                    &rows,
                    next.as_ref(),
                    d,
                    &mut dst[b * 8 * d..(b + 1) * 8 * d],
                )
            };
        }
        done = blocks * 8;
    }
    let _ = isa;
    portable::pack_keys(dst, k, d, done..n, offset);
}

/// Asks for value rows `rows` of `vals` to be brought into cache ahead of
/// use: a sparse row's values are scattered, and issuing every line up
/// front overlaps their misses. No effect on results.
pub(super) fn prefetch_rows(isa: Option<Avx2>, vals: ValueRows<'_>, rows: std::ops::Range<usize>) {
    let (v, voff, d_v) = (vals.v, &vals.off[rows], vals.d_v);
    #[cfg(target_arch = "x86_64")]
    if isa.is_some() {
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

/// Scores of `q_offs.len()` rows against one packed key tile, times
/// `scale`, into `out[r · stride + t]`.
#[allow(clippy::too_many_arguments)]
pub(super) fn scores(
    isa: Option<Avx2>,
    q: &[f32],
    q_offs: &[usize],
    ktile: &[f32],
    d: usize,
    scale: f32,
    out: &mut [f32],
    stride: usize,
) {
    let rows = q_offs.len();
    assert!(
        (1..=ROW_TILE).contains(&rows)
            && ktile.len() >= KEY_TILE * d
            && out.len() >= (rows - 1) * stride + KEY_TILE
            && q_offs.iter().all(|&o| o + d <= q.len())
    );
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = isa {
        // SAFETY: `t` proves AVX2+FMA (only run-time detection makes one);
        // the bounds the kernel relies on are asserted above.
        unsafe {
            match rows {
                1 => avx2::scores::<1>(t, q, q_offs, ktile, d, scale, out, stride),
                2 => avx2::scores::<2>(t, q, q_offs, ktile, d, scale, out, stride),
                3 => avx2::scores::<3>(t, q, q_offs, ktile, d, scale, out, stride),
                _ => avx2::scores::<4>(t, q, q_offs, ktile, d, scale, out, stride),
            }
        }
        return;
    }
    let _ = isa;
    portable::scores(q, q_offs, ktile, d, scale, out, stride);
}

/// Softmax numerator in place over `s` (a multiple of 8 long, entries
/// past the row's keys already `-inf`); returns `(m, l)`.
pub(super) fn softmax(isa: Option<Avx2>, s: &mut [f32]) -> (f32, f32) {
    assert!(s.len().is_multiple_of(8));
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = isa {
        // SAFETY: `t` proves AVX2+FMA (only run-time detection makes one);
        // the length is a multiple of 8 (asserted above).
        return unsafe { avx2::softmax(t, s) };
    }
    let _ = isa;
    portable::softmax(s)
}

/// `o[r][c] = fma(p[r][j], v[voff[j] + c], o[r][c])` for `j` in `j0..j1`
/// ascending, rows `r0..r0 + rows` (`p` rows `stride` apart, `o` rows
/// `d_v` apart), `v`, `voff` and `d_v` being those of `vals`.
#[allow(clippy::too_many_arguments)]
pub(super) fn accumulate(
    isa: Option<Avx2>,
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
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = isa {
        // SAFETY: `t` proves AVX2+FMA (only run-time detection makes one);
        // row and key bounds are asserted above, and every value row is in
        // `v` (checked when `vals` was built, `ValueRows::new`).
        unsafe {
            match rows {
                1 => avx2::accumulate::<1>(t, p, stride, r0, v, voff, j0, j1, o, d_v),
                2 => avx2::accumulate::<2>(t, p, stride, r0, v, voff, j0, j1, o, d_v),
                3 => avx2::accumulate::<3>(t, p, stride, r0, v, voff, j0, j1, o, d_v),
                _ => avx2::accumulate::<4>(t, p, stride, r0, v, voff, j0, j1, o, d_v),
            }
        }
        return;
    }
    let _ = isa;
    portable::accumulate(p, stride, r0, rows, v, voff, j0, j1, o, d_v);
}

#[cfg(target_arch = "x86_64")]
// Accumulator arrays are indexed by row on purpose: they must stay in
// registers, which iterator adaptors over them can defeat.
#[allow(clippy::needless_range_loop)]
mod avx2;
mod portable;

#[cfg(test)]
mod tests {
    use super::portable::{exp_scalar, EXP_LO};
    use super::*;
    use crate::simd::avx2_for_test;

    /// The exp kernel is within 2 ulp-ish of libm on `[-87, 0]`, exactly
    /// 1 at 0, 0 below the underflow limit, NaN on NaN -- and the AVX2
    /// twin agrees bit for bit.
    #[test]
    fn exp_is_accurate_and_the_same_on_every_level() {
        let mut xs: Vec<f32> = (0..200_000)
            .map(|i| -(i as f32) * 87.3 / 200_000.0)
            .collect();
        xs.extend([
            0.0,
            -0.0,
            -1e-30,
            -87.33,
            -87.34,
            -88.0,
            -1e30,
            f32::NEG_INFINITY,
        ]);
        let ln2 = std::f32::consts::LN_2;
        xs.extend([-ln2, -ln2 / 2.0, -1.5 * ln2]);
        while !xs.len().is_multiple_of(8) {
            xs.push(-0.5);
        }
        for &x in &xs {
            let e = exp_scalar(x) as f64;
            let want = (x as f64).exp();
            if x >= EXP_LO {
                assert!(((e - want) / want).abs() < 3e-7, "x={x}: {e} vs {want}");
            } else {
                assert_eq!(e, 0.0, "x={x}");
            }
        }
        assert_eq!(exp_scalar(0.0), 1.0);
        assert!(exp_scalar(f32::NAN).is_nan());
        let token = avx2_for_test();
        #[cfg(target_arch = "x86_64")]
        if token.is_some() {
            use std::arch::x86_64::*;
            xs.extend([f32::NAN; 8]);
            for c in xs.chunks_exact(8) {
                let mut got = [0.0f32; 8];
                // SAFETY: `token` is `Some`, so this CPU has AVX2+FMA;
                // 8-float buffers.
                unsafe {
                    let x = _mm256_loadu_ps(c.as_ptr());
                    _mm256_storeu_ps(got.as_mut_ptr(), avx2::exp(x));
                }
                for (g, &x) in got.iter().zip(c) {
                    let want = exp_scalar(x);
                    assert!(
                        g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                        "x={x}: avx2 {g} vs scalar {want}"
                    );
                }
            }
        }
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
        for &(d, d_v, rows) in &[(1, 1, 1), (7, 5, 2), (32, 32, 3), (64, 24, 4), (65, 17, 4)] {
            let q: Vec<f32> = (0..rows * d + 3).map(|_| next()).collect();
            let k: Vec<f32> = (0..KEY_TILE * d).map(|_| next()).collect();
            let q_offs: Vec<usize> = (0..rows).map(|r| r * d + 1).collect();
            let stride = 24;
            let mut a = vec![0.0f32; rows * stride];
            let mut b = a.clone();
            scores(isa, &q, &q_offs, &k, d, 0.3, &mut a, stride);
            scores(None, &q, &q_offs, &k, d, 0.3, &mut b, stride);
            assert_eq!(a, b, "scores d={d}");
            let mut sa: Vec<f32> = (0..24).map(|_| next() * 20.0).collect();
            sa[21..].fill(f32::NEG_INFINITY);
            let mut sb = sa.clone();
            let ma = softmax(isa, &mut sa);
            let mb = softmax(None, &mut sb);
            assert_eq!(
                (ma.0.to_bits(), ma.1.to_bits()),
                (mb.0.to_bits(), mb.1.to_bits())
            );
            assert_eq!(sa, sb);
            let n = 37;
            let v: Vec<f32> = (0..n * 40).map(|_| next()).collect();
            let voff: Vec<usize> = (0..n).map(|j| ((j * 7) % n) * 40 + 2).collect();
            let p: Vec<f32> = (0..rows * n).map(|_| next().abs()).collect();
            let mut oa: Vec<f32> = (0..rows * d_v).map(|_| next()).collect();
            let mut ob = oa.clone();
            let vals = ValueRows::new(&v, &voff, d_v);
            accumulate(isa, &p, n, 0, rows, vals, 3, n, &mut oa);
            accumulate(None, &p, n, 0, rows, vals, 3, n, &mut ob);
            assert_eq!(oa, ob, "accumulate d_v={d_v}");
            // Packing: a copy either way.
            let keys: Vec<f32> = (0..50 * d).map(|_| next()).collect();
            let order: Vec<usize> = (0..29).map(|j| (j * 17) % 50).collect();
            let (mut pa, mut pb) = (Vec::new(), Vec::new());
            pack_keys(isa, &mut pa, &keys, d, 29, |j| order[j] * d);
            pack_keys(None, &mut pb, &keys, d, 29, |j| order[j] * d);
            assert_eq!(pa[..29 / 8 * 8 * d], pb[..29 / 8 * 8 * d], "pack d={d}");
            for j in 0..29 {
                for c in 0..d {
                    assert_eq!(pa[(j / 8) * 8 * d + c * 8 + j % 8], keys[order[j] * d + c]);
                }
            }
        }
    }
}
