//! Stage 1 with the keys in the lanes, on keys packed once for many
//! queries (`infllm.panel_sums`): [`group_sums`], the same bits as
//! [`super::score::group_sums`] and [`super::heads::group_sums`].
//!
//! # Why a third layout
//!
//! At prefill every query sees few compressed keys (NSA's fla window: at
//! most 128 at 8,192 tokens, 64 on average) and thousands of queries see
//! the same ones. [`super::heads::group_sums`] puts a group's heads in the
//! lanes, so each query's rows must be transposed (8% of a prefill) and its
//! group sum transposes 8 keys by 8 heads back. Here the keys of one KV
//! head are transposed **once a call** into [`Panels`] of 32 keys (`[d][32]`
//! each, zero padded), and each query's rows are read where they lie: a
//! tile is 2 heads by 4 vectors of 8 keys (8 accumulators), a step 2
//! broadcasts of query elements and 4 loads for 8 fused multiply-adds, the
//! ratio of the heads-in-lanes tile of 32 heads by 2 keys; a panel's last
//! vectors take more heads (3 by 3, 4 by 2, 8 by 1: at least 8 chains, or
//! each waits on its own last multiply-add). 4 heads by 3 vectors (12
//! accumulators) spilled one to the stack. The logits come out
//! head-major (`[head][key]`), so each head's softmax runs along its row
//! (a vector maximum, `exp` eight heads side by side, the 8-lane sum of
//! `Z_h` is the vector of key lanes itself) and the group sum adds each
//! head's `e / Z_h` vector in head order: no transpose anywhere.
//!
//! The packing costs a copy of the compressed keys a call (`n_c · d` per
//! KV head), so it pays when many queries share them: NSA's `stage` uses it
//! from [`MIN_QUERIES`] queries a call up, on at most [`MAX_KEYS`]
//! compressed keys.
//!
//! # The rule, and why the bits are the packed form's
//!
//! `S_j = Σ_h e_hj / Z_h` (heads in order, from `+0.0`) with `e_hj =
//! exp(s_hj − m_h)`, `s_hj = (q_h · k_j) · scale`, `m_h = max_j s_hj + 0`:
//!
//! - each logit is one chain `acc = fma(q_hc, k_jc, acc)` over `c` in order
//!   from `+0.0`, then `acc · scale` — whatever lane it sits in (the product
//!   of a multiply-add commutes exactly);
//! - the maximum ignores NaN (`max(x, m)` returns `m` when `x` is NaN) and
//!   the padded keys (their lanes set to `−inf` first); its order is free
//!   (a sign of zero aside, which `+ 0` erases), so each tile folds its
//!   logits into its heads' 8-lane maxima as it stores them;
//! - `Z_h`'s 8 lanes are the key vectors' lanes: key `j` adds into lane
//!   `j % 8` in key order from `+0.0`; the padding past `n_vis` adds `+0`
//!   (its exponentials masked to `+0`), which leaves a lane that is `+0`
//!   or more, or NaN, as it is (the packed form adds `exp(−inf − m)`, `+0`
//!   or NaN when every key is NaN or `−inf`, and then the lanes with keys
//!   are NaN and so is `Z_h`); then `((l0+l4)+(l2+l6))+((l1+l5)+(l3+l7))`;
//! - `e_hj / Z_h` is the same division, added to `S_j` head by head in
//!   order from `+0.0`.
//!
//! What would break it: a reciprocal multiplied instead of the division, an
//! online (rescaled) softmax, another lane assignment or tree for `Z_h`, a
//! padded key's exponential added unmasked, or the heads summed in another
//! order. `src/infllm/tests.rs` checks it against the packed form bit for
//! bit at every level (groups of 1 to 33, `d` off 8, key counts off the
//! tiles and under one vector, infinite and NaN logits).

use super::heads::{Elem, Rows};
use super::score::Scratch;
use crate::simd::{dispatch, Isa};

/// Keys a panel: four vectors of 8.
pub(crate) const PANEL: usize = 32;

/// The fewest queries a call for which NSA's `stage` packs the keys into
/// [`Panels`] (a copy of the compressed keys, against at least this many
/// queries' scores on them).
pub(crate) const MIN_QUERIES: usize = 64;

/// The most compressed keys NSA's `stage` packs into [`Panels`]: a KV
/// head's panels then stay in the L2 (256 KiB at `d = 128`). Past it each
/// query would read its panels from the L3, where the heads-in-lanes
/// kernel reads the keys once for two queries: 64 and 256 queries over
/// 2,048 compressed keys ran 2-3% slower in panels (AMD EPYC Zen 3, one
/// thread).
pub(crate) const MAX_KEYS: usize = 512;

/// One KV head's first `n` compressed keys transposed into panels of
/// [`PANEL`]: element `c` of key `j` at `data[at + (j / 32) · 32 d + c ·
/// 32 + j % 32]`, the keys past `n` in the last panel `+0.0`; `at` puts the
/// panels on a 64-byte boundary, so a row of 32 floats is two whole cache
/// lines and no 512-bit load of the tiles splits one (on a 32-byte
/// boundary, half of them did: a call in cache ran 9% slower, Intel Xeon,
/// one thread).
pub(crate) struct Panels {
    data: Vec<f32>,
    at: usize,
    n: usize,
    d: usize,
}

impl Panels {
    /// Keys `0..n` of `keys` (each `d` elements), in `buf`'s allocation.
    pub(crate) fn new_in<E: Elem>(
        mut buf: Vec<f32>,
        keys: Rows<'_, E>,
        n: usize,
        d: usize,
    ) -> Self {
        let len = n.div_ceil(PANEL) * PANEL * d;
        buf.clear();
        buf.resize(len + 16, 0.0);
        let at = buf.as_ptr().align_offset(64).min(16);
        if n > 0 {
            assert!(
                keys.base + (n - 1) * keys.stride + d <= keys.ck.len(),
                "a key row past its array"
            );
        }
        let out = &mut buf[at..at + len];
        for j in 0..n {
            let row = &keys.ck[keys.base + j * keys.stride..][..d];
            let panel = &mut out[j / PANEL * PANEL * d..][..PANEL * d];
            for (c, &x) in row.iter().enumerate() {
                panel[c * PANEL + j % PANEL] = x.value();
            }
        }
        Panels {
            data: buf,
            at,
            n,
            d,
        }
    }

    /// The buffer back, for the next call.
    pub(crate) fn into_buf(self) -> Vec<f32> {
        self.data
    }

    /// The panels (`n.div_ceil(32) · 32 d` floats).
    fn keys(&self) -> &[f32] {
        &self.data[self.at..self.at + self.n.div_ceil(PANEL) * PANEL * self.d]
    }
}

/// `S_j` for `j < n_vis`: [`super::score::group_sums`] of the `heads`
/// query rows `q[h · d..][..d]` over keys `0..n_vis` of `panels`, into
/// `scratch.sums[..n_vis]` (empty when `n_vis == 0`).
///
/// `next` is what the caller reads next (the next group's query rows:
/// prefill streams its queries from memory), asked for a few lines a tile
/// with `prefetcht0` (every cache level; the AVX-512 tile's lines left
/// after its loop with `prefetcht1`, where the level made no difference).
/// Measured on AMD Zen 4 only: NSA's prefill 2-3% faster at AVX-512 and
/// 3-5% at AVX2 than with `prefetcht1`. Empty: nothing. No effect on
/// results.
#[allow(clippy::too_many_arguments)]
pub(crate) fn group_sums(
    isa: Isa,
    q: &[f32],
    heads: usize,
    d: usize,
    panels: &Panels,
    n_vis: usize,
    scale: f32,
    scratch: &mut Scratch,
    next: &[f32],
) {
    scratch.sums.clear();
    scratch.sums.resize(n_vis, 0.0);
    if n_vis == 0 || heads == 0 {
        return;
    }
    assert!(
        panels.d == d && n_vis <= panels.n && heads * d <= q.len(),
        "keys past the panels, or queries past their array"
    );
    let n8 = n_vis.next_multiple_of(8);
    if scratch.logits.len() < heads * n8 {
        scratch.logits.resize(heads * n8, 0.0);
    }
    // `Z_h` (`heads` floats), then each head's running maximum (8 lanes).
    scratch.qt.clear();
    scratch.qt.resize(heads * 9, 0.0);
    // (read by the x86 kernel's prefetch only)
    #[cfg(not(target_arch = "x86_64"))]
    let _ = next;
    let keys = panels.keys();
    let (logits, z, sums) = (&mut scratch.logits, &mut scratch.qt, &mut scratch.sums);
    // SAFETY (bounds): `q` holds `heads` rows of `d`; the panels hold keys
    // `0..round_up(n_vis, 32)` (asserted: `n_vis <= n`, panels whole);
    // `logits` `heads · n8`, `z` `9 heads`, `sums` `n_vis` floats.
    dispatch!("infllm.panel_sums", isa, {
        avx512(t) => {
            let next = bytemuck::cast_slice(next);
            avx512::sums(t, q, heads, d, keys, n_vis, scale, logits, z, sums, next)
        },
        avx2(t) => {
            let next = bytemuck::cast_slice(next);
            avx2::sums(t, q, heads, d, keys, n_vis, scale, logits, z, sums, next)
        },
        scalar => portable::sums(q, heads, d, keys, n_vis, scale, logits, z, sums),
    });
}

/// Element `c` of key `j` in the panels.
#[inline(always)]
fn key(keys: &[f32], d: usize, j: usize, c: usize) -> f32 {
    keys[j / PANEL * PANEL * d + c * PANEL + j % PANEL]
}

mod portable {
    use super::key;
    use crate::exp::exp_scalar;

    /// Element by element: each head's logits, softmax and `e / Z` into
    /// the sums, head by head.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn sums(
        q: &[f32],
        heads: usize,
        d: usize,
        keys: &[f32],
        n_vis: usize,
        scale: f32,
        logits: &mut [f32],
        _: &mut [f32],
        sums: &mut [f32],
    ) {
        let row = &mut logits[..n_vis];
        for h in 0..heads {
            let qh = &q[h * d..][..d];
            let mut mx = f32::NEG_INFINITY;
            for (j, o) in row.iter_mut().enumerate() {
                let mut acc = 0.0f32;
                for (c, &x) in qh.iter().enumerate() {
                    acc = x.mul_add(key(keys, d, j, c), acc);
                }
                *o = acc * scale;
                if *o > mx {
                    mx = *o;
                }
            }
            let m = mx + 0.0;
            let mut lanes = [0.0f32; 8];
            for (j, o) in row.iter_mut().enumerate() {
                *o = exp_scalar(*o - m);
                lanes[j % 8] += *o;
            }
            let z = super::super::heads::reduce8(lanes);
            for (s, &e) in sums.iter_mut().zip(row.iter()) {
                *s += e / z;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
// Accumulator arrays are indexed on purpose: they must stay in registers.
#[allow(clippy::needless_range_loop)]
mod avx2 {
    use super::PANEL;
    use crate::exp::avx2::exp_n;
    use crate::keys::CacheLevel;
    use crate::simd::Avx2;
    use std::arch::x86_64::*;

    /// [`super::portable::sums`] with the keys in the lanes: the logits
    /// `[head][n8]` by tiles of 2 heads by 4 vectors of keys (more heads on
    /// fewer vectors), each head's
    /// maximum, exponentials (eight heads side by side) and `Z_h`, then `e /
    /// Z_h` added head by head, four key vectors side by side.
    ///
    /// # Safety
    /// `_token` proves AVX2+FMA; `q` holds `heads · d` floats, `keys` the
    /// panels of keys `0..round_up(n_vis, 32)`, `logits` `heads ·
    /// round_up(n_vis, 8)`, `z` `heads`, `sums` `n_vis`; `n_vis >= 1`.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn sums(
        _token: Avx2,
        q: &[f32],
        heads: usize,
        d: usize,
        keys: &[f32],
        n_vis: usize,
        scale: f32,
        logits: &mut [f32],
        z: &mut [f32],
        sums: &mut [f32],
        next: &[u8],
    ) {
        let n8 = n_vis.next_multiple_of(8);
        let nv = n8 / 8;
        // `next`'s lines spread over the tiles (about `heads / 2` a panel).
        let tiles = nv.div_ceil(4) * heads.div_ceil(2);
        let per = next.len().div_ceil(64).div_ceil(tiles) * 64;
        let mut at = 0;
        let (qp, kp, lp) = (q.as_ptr(), keys.as_ptr(), logits.as_mut_ptr());
        // The last vector's lanes that hold keys (the rest padding).
        let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let valid = _mm256_castsi256_ps(_mm256_cmpgt_epi32(
            _mm256_set1_epi32((n_vis - (nv - 1) * 8) as i32),
            idx,
        ));
        // Each head's running maximum, 8 lanes, after the `Z_h` slots.
        z[heads..heads * 9].fill(f32::NEG_INFINITY);
        let mxp = z[heads..].as_mut_ptr();
        // Pass 1: the logits, a panel's vectors against every head while
        // the panel sits in L1; each head's maximum folded in as the tiles
        // store them (no pass over the logits for it: 1.5-2.1 ms a prefill
        // call faster in three in-process runs, AMD EPYC Zen 3).
        for v0 in (0..nv).step_by(4) {
            let kt = kp.wrapping_add(v0 / 4 * PANEL * d);
            let j = (nv - v0).min(4);
            // The tiles' last vector: the call's last (its padding masked
            // to `−inf` for the maximum) or a whole one.
            let last = if v0 + j == nv {
                valid
            } else {
                _mm256_castsi256_ps(_mm256_set1_epi32(-1))
            };
            // Heads a tile: at least 8 accumulators whatever the key
            // vectors (each chain waits on its last multiply-add: fewer
            // chains leave the units idle).
            let rows = [8, 4, 3, 2][j - 1];
            for h0 in (0..heads).step_by(rows) {
                let r = (heads - h0).min(rows);
                let (q0, out) = (qp.wrapping_add(h0 * d), lp.wrapping_add(h0 * n8 + v0 * 8));
                crate::keys::prefetch(next, at, at + per, CacheLevel::L1);
                at += per;
                // SAFETY: heads `h0..h0 + r` are in `q`, key vectors `v0..v0
                // + j` in the panel at `kt`, their logits in `logits`, their
                // maxima at `mxp + 8 h0` (`z` holds `9 heads`).
                unsafe { tile_rj(r, j, q0, d, kt, out, n8, scale, mxp.add(8 * h0), last) };
            }
        }
        // SAFETY: pass 1 wrote every head's logits and maxima (the contract's
        // sizes).
        unsafe { rest(_token, heads, n_vis, logits, z, sums) }
    }

    /// Passes 2 and 3 of [`sums`], after pass 1 (at any level) has written
    /// each head's logits (`[head][n8]`, `n8 = round_up(n_vis, 8)`, the
    /// padding's lanes whatever they are) and its running maximum's 8 lanes
    /// (`z[heads + 8 h..]`, the padding counted as `−inf`).
    ///
    /// # Safety
    /// `_token` proves AVX2+FMA; `logits` holds `heads · n8` floats, `z`
    /// `9 heads`, `sums` `n_vis`; `n_vis >= 1`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn rest(
        _token: Avx2,
        heads: usize,
        n_vis: usize,
        logits: &mut [f32],
        z: &mut [f32],
        sums: &mut [f32],
    ) {
        let n8 = n_vis.next_multiple_of(8);
        let nv = n8 / 8;
        assert!(logits.len() >= heads * n8 && z.len() >= 9 * heads && sums.len() >= n_vis);
        let lp = logits.as_mut_ptr();
        let ninf = _mm256_set1_ps(f32::NEG_INFINITY);
        let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let valid = _mm256_castsi256_ps(_mm256_cmpgt_epi32(
            _mm256_set1_epi32((n_vis - (nv - 1) * 8) as i32),
            idx,
        ));
        let (zp, mxp) = (z.as_mut_ptr(), z[heads..].as_mut_ptr());
        // Pass 2: each head's exponentials and `Z_h`, eight heads side by
        // side (then four, then one at a time; eight against four: 0-2%
        // faster, within the noise; two at a time 4% slower; a head at a
        // time, four vectors side by side, 3 ms a prefill call slower).
        let mut h0 = 0;
        while h0 + 8 <= heads {
            // SAFETY: heads `h0..h0 + 8` have rows in `logits`, `z` slots
            // and maxima.
            unsafe {
                softmax::<8>(
                    lp.add(h0 * n8),
                    n8,
                    valid,
                    ninf,
                    zp.add(h0),
                    mxp.add(8 * h0),
                )
            };
            h0 += 8;
        }
        if h0 + 4 <= heads {
            // SAFETY: as above, four heads.
            unsafe {
                softmax::<4>(
                    lp.add(h0 * n8),
                    n8,
                    valid,
                    ninf,
                    zp.add(h0),
                    mxp.add(8 * h0),
                )
            };
            h0 += 4;
        }
        while h0 < heads {
            // SAFETY: as above, one head.
            unsafe {
                softmax::<1>(
                    lp.add(h0 * n8),
                    n8,
                    valid,
                    ninf,
                    zp.add(h0),
                    mxp.add(8 * h0),
                )
            };
            h0 += 1;
        }
        // Pass 3: `S_j = Σ_h e_hj / Z_h`, heads in order from `+0.0`, four
        // key vectors side by side; the last vector's padding not stored.
        let sp = sums.as_mut_ptr();
        let mut v = 0;
        while v + 4 <= nv {
            // SAFETY: key vectors `v..v + 4` lie in every head's row and,
            // when whole, in `sums`.
            unsafe { group::<4>(lp.add(v * 8), heads, n8, z, sp.add(v * 8), n_vis - v * 8) };
            v += 4;
        }
        while v < nv {
            // SAFETY: as above, one vector.
            unsafe { group::<1>(lp.add(v * 8), heads, n8, z, sp.add(v * 8), n_vis - v * 8) };
            v += 1;
        }
    }

    /// [`tile`] with `R = r`, `J = j` (`r <= 8 / j`, or 2 at `j = 4`).
    ///
    /// # Safety
    /// [`tile`]'s.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile_rj(
        r: usize,
        j: usize,
        q: *const f32,
        d: usize,
        kt: *const f32,
        out: *mut f32,
        n8: usize,
        scale: f32,
        mx: *mut f32,
        last: __m256,
    ) {
        macro_rules! by_r {
            ($j:literal, $($r:literal)*) => {
                match r {
                    $($r => tile::<$r, $j>(q, d, kt, out, n8, scale, mx, last),)*
                    _ => unreachable!("at most {} heads by {} vectors", 8 / $j, $j),
                }
            };
        }
        // SAFETY: the contract.
        unsafe {
            match j {
                4 => by_r!(4, 1 2),
                3 => by_r!(3, 1 2 3),
                2 => by_r!(2, 1 2 3 4),
                _ => by_r!(1, 1 2 3 4 5 6 7 8),
            }
        }
    }

    /// Heads `0..R` (rows `n8` apart from `q`, `d` each) against key
    /// vectors `0..J` of the panel at `kt`: logit to `out[r · n8 + 8 t..]`,
    /// and folded into head `r`'s running maximum `mx[8 r..][..8]` as
    /// `max(x, m)` (a NaN logit leaves it as it was; vector `J − 1`'s lanes
    /// outside `last` count as `−inf`).
    ///
    /// # Safety
    /// AVX2+FMA; `R` rows of `d` at `q`, a panel of `32 d` at `kt`, `R`
    /// rows of `8 J` floats `n8` apart at `out`, `8 R` floats at `mx`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile<const R: usize, const J: usize>(
        q: *const f32,
        d: usize,
        kt: *const f32,
        out: *mut f32,
        n8: usize,
        scale: f32,
        mx: *mut f32,
        last: __m256,
    ) {
        let mut acc = [[_mm256_setzero_ps(); J]; R];
        // Element `c` of every row into its chains.
        macro_rules! step {
            ($c:expr) => {{
                let c = $c;
                // SAFETY: `c < d`: in the panel and in each query row.
                unsafe {
                    let mut k = [_mm256_setzero_ps(); J];
                    for t in 0..J {
                        k[t] = _mm256_loadu_ps(kt.add(c * PANEL + 8 * t));
                    }
                    for r in 0..R {
                        let b = _mm256_broadcast_ss(&*q.add(r * d + c));
                        for t in 0..J {
                            acc[r][t] = _mm256_fmadd_ps(b, k[t], acc[r][t]);
                        }
                    }
                }
            }};
        }
        // Four elements a trip, in order (the same chains, the same bits):
        // a trip an element ran 2-4% slower in NSA's prefill, eight a trip
        // no faster than one (AMD EPYC Zen 3, one thread).
        let d4 = d / 4 * 4;
        for c in (0..d4).step_by(4) {
            step!(c);
            step!(c + 1);
            step!(c + 2);
            step!(c + 3);
        }
        for c in d4..d {
            step!(c);
        }
        let (vs, ninf) = (_mm256_set1_ps(scale), _mm256_set1_ps(f32::NEG_INFINITY));
        for r in 0..R {
            // SAFETY: head `r`'s maximum (the contract).
            let mut m = unsafe { _mm256_loadu_ps(mx.add(8 * r)) };
            for t in 0..J {
                let x = _mm256_mul_ps(acc[r][t], vs);
                // SAFETY: the logits' rows (the contract).
                unsafe { _mm256_storeu_ps(out.add(r * n8 + 8 * t), x) };
                let x = if t == J - 1 {
                    _mm256_blendv_ps(ninf, x, last)
                } else {
                    x
                };
                m = _mm256_max_ps(x, m);
            }
            // SAFETY: as above.
            unsafe { _mm256_storeu_ps(mx.add(8 * r), m) };
        }
    }

    /// A head's maximum from its 8 lanes (no NaN among them: order free),
    /// `+ 0`, in every lane.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn lanes_max(mx: __m256) -> __m256 {
        let a = _mm256_max_ps(mx, _mm256_permute2f128_ps::<1>(mx, mx));
        let a = _mm256_max_ps(a, _mm256_permute_ps::<0b01_00_11_10>(a));
        let a = _mm256_max_ps(a, _mm256_permute_ps::<0b10_11_00_01>(a));
        _mm256_add_ps(a, _mm256_setzero_ps())
    }

    /// `Z_h` from its 8 lane sums, in the canonical tree
    /// ([`super::super::heads::reduce8`]).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn lanes_sum(lanes: __m256) -> f32 {
        let mut l = [0.0f32; 8];
        // SAFETY: `l` is 8 floats.
        unsafe { _mm256_storeu_ps(l.as_mut_ptr(), lanes) };
        super::super::heads::reduce8(l)
    }

    /// Heads `0..N` (rows `n8` apart at `lp`, the 8 lanes of their running
    /// maxima at `mxp`, folded in by [`tile`]): each row's maximum `m_h`,
    /// `e = exp(x − m_h)` written over the logits (the padding's masked to
    /// `+0`), `Z_h` to `z[h]`.
    ///
    /// # Safety
    /// AVX2+FMA; `N` rows of `n8 >= 8` floats at `lp`, `N` floats at `z`,
    /// `8 N` at `mxp`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn softmax<const N: usize>(
        lp: *mut f32,
        n8: usize,
        valid: __m256,
        ninf: __m256,
        z: *mut f32,
        mxp: *const f32,
    ) {
        let last = n8 - 8;
        let mut m = [ninf; N];
        for h in 0..N {
            // SAFETY: head `h`'s maximum (the contract).
            m[h] = lanes_max(unsafe { _mm256_loadu_ps(mxp.add(8 * h)) });
        }
        let mut lanes = [_mm256_setzero_ps(); N];
        for j in (0..n8).step_by(8) {
            let mut x = [_mm256_setzero_ps(); N];
            for h in 0..N {
                // SAFETY: as above.
                x[h] = _mm256_sub_ps(unsafe { _mm256_loadu_ps(lp.add(h * n8 + j)) }, m[h]);
            }
            let mut e = exp_n(x);
            if j == last {
                for h in 0..N {
                    e[h] = _mm256_and_ps(e[h], valid);
                }
            }
            for h in 0..N {
                // SAFETY: as above.
                unsafe { _mm256_storeu_ps(lp.add(h * n8 + j), e[h]) };
                lanes[h] = _mm256_add_ps(lanes[h], e[h]);
            }
        }
        for h in 0..N {
            // SAFETY: `z` holds `N` floats (the contract).
            unsafe { *z.add(h) = lanes_sum(lanes[h]) };
        }
    }

    /// Key vectors `0..N` from `lp` (each head's row `n8` apart): `Σ_h e /
    /// Z_h` in head order from `+0.0`, to `sp`, at most `left` floats.
    ///
    /// # Safety
    /// AVX2+FMA; `heads` rows of `8 N` floats `n8` apart at `lp`, `z` holds
    /// `heads`, `sp` `min(left, 8 N)` floats.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn group<const N: usize>(
        lp: *const f32,
        heads: usize,
        n8: usize,
        z: &[f32],
        sp: *mut f32,
        left: usize,
    ) {
        let mut s = [_mm256_setzero_ps(); N];
        for (h, &zh) in z[..heads].iter().enumerate() {
            let zv = _mm256_set1_ps(zh);
            for t in 0..N {
                // SAFETY: row `h`'s vector `t` (the contract).
                let e = unsafe { _mm256_loadu_ps(lp.add(h * n8 + 8 * t)) };
                s[t] = _mm256_add_ps(s[t], _mm256_div_ps(e, zv));
            }
        }
        for t in 0..N {
            if left >= 8 * (t + 1) {
                // SAFETY: 8 floats at `sp + 8 t` (the contract).
                unsafe { _mm256_storeu_ps(sp.add(8 * t), s[t]) };
            } else {
                let mut l = [0.0f32; 8];
                // SAFETY: `l` is 8 floats; `left − 8 t < 8` at `sp + 8 t`.
                unsafe {
                    _mm256_storeu_ps(l.as_mut_ptr(), s[t]);
                    std::ptr::copy_nonoverlapping(l.as_ptr(), sp.add(8 * t), left - 8 * t);
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
// Accumulator arrays are indexed on purpose: they must stay in registers.
#[allow(clippy::needless_range_loop)]
mod avx512 {
    use super::PANEL;
    use crate::keys::CacheLevel;
    use crate::simd::Avx512;
    use std::arch::x86_64::*;

    /// [`super::avx2::sums`] in 512-bit registers: pass 1 (the logits) a
    /// panel's two vectors of 16 keys against tiles of 8 heads (16 chains),
    /// a step 2 loads and 8 broadcasts for 16 fused multiply-adds; then
    /// passes 2 and 3 sixteen keys a vector ([`rest`]).
    /// Each logit is the same chain in whichever lane, and each head's
    /// 8-lane maximum folds a vector's two halves in as `max(x, m)` (order
    /// free, NaN ignored), so the bits are the AVX2 kernel's.
    ///
    /// # Safety
    /// [`super::avx2::sums`]'s, with `token` proving AVX-512 F.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn sums(
        token: Avx512,
        q: &[f32],
        heads: usize,
        d: usize,
        keys: &[f32],
        n_vis: usize,
        scale: f32,
        logits: &mut [f32],
        z: &mut [f32],
        sums: &mut [f32],
        next: &[u8],
    ) {
        let n8 = n_vis.next_multiple_of(8);
        // Vectors of 16 keys, the last one's lanes past `n8` not stored
        // (the next head's row) and past `n_vis` counted as `−inf` in the
        // maximum.
        let nv = n_vis.div_ceil(16);
        let tiles = nv.div_ceil(2) * heads.div_ceil(8);
        let per = next.len().div_ceil(64).div_ceil(tiles) * 64;
        let mut at = 0;
        let (qp, kp, lp) = (q.as_ptr(), keys.as_ptr(), logits.as_mut_ptr());
        let tail = n_vis - (nv - 1) * 16;
        let valid: __mmask16 = ((1u32 << tail) - 1) as u16;
        let stored: __mmask16 = ((1u32 << (n8 - (nv - 1) * 16)) - 1) as u16;
        z[heads..heads * 9].fill(f32::NEG_INFINITY);
        let mxp = z[heads..].as_mut_ptr();
        for v0 in (0..nv).step_by(2) {
            let kt = kp.wrapping_add(v0 / 2 * PANEL * d);
            let j = (nv - v0).min(2);
            let (last, store) = match v0 + j == nv {
                true => (valid, stored),
                false => (!0, !0),
            };
            // Heads a tile: 8 by 2 vectors, 16 by 1 (16 chains either way).
            let rows = [16, 8][j - 1];
            for h0 in (0..heads).step_by(rows) {
                let r = (heads - h0).min(rows);
                let (q0, out) = (qp.wrapping_add(h0 * d), lp.wrapping_add(h0 * n8 + v0 * 16));
                let pf = next
                    .get(at.min(next.len())..(at + per).min(next.len()))
                    .unwrap_or(&[]);
                at += per;
                // SAFETY: heads `h0..h0 + r` are in `q`, key vectors `v0..v0
                // + j` in the panel at `kt` (panels are whole: 32 keys), their
                // logits in `logits` up to `n8` (the last vector's store
                // masked to it), their maxima at `mxp + 8 h0`.
                unsafe {
                    tile_rj(
                        r,
                        j,
                        q0,
                        d,
                        kt,
                        out,
                        n8,
                        scale,
                        mxp.add(8 * h0),
                        last,
                        store,
                        pf,
                    )
                };
            }
        }
        // SAFETY: pass 1 wrote every head's logits and maxima.
        unsafe { rest(token, heads, n_vis, logits, z, sums) }
    }

    /// [`super::avx2::rest`] sixteen keys a vector: each head's maximum
    /// from its 8 lanes, its exponentials (`crate::exp::avx512::exp`, the
    /// AVX2 `exp`'s bits lane for lane) and `Z_h`, whose 8 lanes take a
    /// vector's low half and then its high half (key `j` into lane `j % 8`
    /// in key order, as at AVX2); then `Σ_h e / Z_h` in head order, sixteen
    /// keys a vector. The same operations on the same values: the same bits.
    ///
    /// # Safety
    /// [`super::avx2::rest`]'s, with `_token` proving AVX-512 F.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
    unsafe fn rest(
        _token: Avx512,
        heads: usize,
        n_vis: usize,
        logits: &mut [f32],
        z: &mut [f32],
        sums: &mut [f32],
    ) {
        let n8 = n_vis.next_multiple_of(8);
        assert!(logits.len() >= heads * n8 && z.len() >= 9 * heads && sums.len() >= n_vis);
        let lp = logits.as_mut_ptr();
        let (zp, mxp) = (z.as_mut_ptr(), z[heads..].as_ptr());
        // Pass 2, four heads side by side (then one at a time).
        let mut h0 = 0;
        while h0 + 4 <= heads {
            // SAFETY: heads `h0..h0 + 4` have rows in `logits`, `z` slots
            // and maxima (asserted sizes).
            unsafe { softmax::<4>(lp.add(h0 * n8), n8, n_vis, zp.add(h0), mxp.add(8 * h0)) };
            h0 += 4;
        }
        while h0 < heads {
            // SAFETY: as above, one head.
            unsafe { softmax::<1>(lp.add(h0 * n8), n8, n_vis, zp.add(h0), mxp.add(8 * h0)) };
            h0 += 1;
        }
        // Pass 3: `S_j = Σ_h e_hj / Z_h`, heads in order from `+0.0`, up to
        // four vectors of keys side by side (each sum a chain of `heads`
        // additions), the last one's lanes past `n_vis` neither read nor
        // stored.
        let sp = sums.as_mut_ptr();
        for j in (0..n_vis).step_by(64) {
            let left = n_vis - j;
            // SAFETY: keys `j..j + min(left, 64)` lie in every row and in
            // `sums`.
            unsafe {
                let (lj, sj) = (lp.add(j), sp.add(j));
                match left.div_ceil(16) {
                    1 => group::<1>(lj, heads, n8, z, sj, left),
                    2 => group::<2>(lj, heads, n8, z, sj, left),
                    3 => group::<3>(lj, heads, n8, z, sj, left),
                    _ => group::<4>(lj, heads, n8, z, sj, left),
                }
            }
        }
    }

    /// Heads `0..N` (rows `n8` apart at `lp`, their maxima's 8 lanes at
    /// `mxp`): `m_h`, `e = exp(x − m_h)` over keys `0..n8` written back
    /// (those past `n_vis` as `+0`), `Z_h` to `z[h]`.
    ///
    /// # Safety
    /// AVX-512 F; `N` rows of `n8 >= 8` floats at `lp`, `N` floats at `z`,
    /// `8 N` at `mxp`; `n_vis <= n8 < n_vis + 8`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
    unsafe fn softmax<const N: usize>(
        lp: *mut f32,
        n8: usize,
        n_vis: usize,
        z: *mut f32,
        mxp: *const f32,
    ) {
        let mut m = [_mm512_setzero_ps(); N];
        for h in 0..N {
            // SAFETY: head `h`'s maximum (the contract).
            let a = super::avx2::lanes_max(unsafe { _mm256_loadu_ps(mxp.add(8 * h)) });
            m[h] = _mm512_broadcastss_ps(_mm256_castps256_ps128(a));
        }
        let mut lanes = [_mm256_setzero_ps(); N];
        let mut j = 0;
        while j < n8 {
            // The keys of this vector in the row (16, or the row's last 8),
            // and those below `n_vis` (the rest `+0`).
            let (row, keys) = (((1u32 << (n8 - j).min(16)) - 1) as u16, (n_vis - j).min(16));
            let seen = ((1u32 << keys) - 1) as u16;
            let mut x = [_mm512_setzero_ps(); N];
            for h in 0..N {
                // SAFETY: the row's lanes `row` names (the contract).
                let y = unsafe { _mm512_maskz_loadu_ps(row, lp.add(h * n8 + j)) };
                x[h] = _mm512_sub_ps(y, m[h]);
            }
            for h in 0..N {
                let e = _mm512_maskz_mov_ps(seen, crate::exp::avx512::exp(x[h]));
                // SAFETY: as above.
                unsafe { _mm512_mask_storeu_ps(lp.add(h * n8 + j), row, e) };
                lanes[h] = _mm256_add_ps(lanes[h], _mm512_castps512_ps256(e));
                if n8 - j > 8 {
                    lanes[h] = _mm256_add_ps(lanes[h], _mm512_extractf32x8_ps::<1>(e));
                }
            }
            j += 16;
        }
        for h in 0..N {
            // SAFETY: `z` holds `N` floats (the contract).
            unsafe { *z.add(h) = super::avx2::lanes_sum(lanes[h]) };
        }
    }

    /// Keys `0..min(left, 16 N)` from `lp` (each head's row `n8` apart): `Σ_h
    /// e / Z_h` in head order from `+0.0`, to `sp`.
    ///
    /// # Safety
    /// AVX-512 F; `heads` rows holding those keys, `n8` apart, at `lp`; `z`
    /// holds `heads`, `sp` `min(left, 16 N)` floats.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
    unsafe fn group<const N: usize>(
        lp: *const f32,
        heads: usize,
        n8: usize,
        z: &[f32],
        sp: *mut f32,
        left: usize,
    ) {
        let mut keep = [0u16; N];
        for (t, k) in keep.iter_mut().enumerate() {
            *k = ((1u32 << left.saturating_sub(16 * t).min(16)) - 1) as u16;
        }
        let mut s = [_mm512_setzero_ps(); N];
        for (h, &zh) in z[..heads].iter().enumerate() {
            let zv = _mm512_set1_ps(zh);
            for t in 0..N {
                // SAFETY: row `h`'s keys `keep[t]` names (the contract).
                let e = unsafe { _mm512_maskz_loadu_ps(keep[t], lp.add(h * n8 + 16 * t)) };
                s[t] = _mm512_add_ps(s[t], _mm512_div_ps(e, zv));
            }
        }
        for t in 0..N {
            // SAFETY: the keys `keep[t]` names, in `sums` (the contract).
            unsafe { _mm512_mask_storeu_ps(sp.add(16 * t), keep[t], s[t]) };
        }
    }

    /// [`tile`] with `R = r`, `J = j` (at most 16 heads by 1 vector, 8 by
    /// 2).
    ///
    /// # Safety
    /// [`tile`]'s.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile_rj(
        r: usize,
        j: usize,
        q: *const f32,
        d: usize,
        kt: *const f32,
        out: *mut f32,
        n8: usize,
        scale: f32,
        mx: *mut f32,
        last: __mmask16,
        store: __mmask16,
        pf: &[u8],
    ) {
        macro_rules! by_r {
            ($j:literal, $($r:literal)*) => {
                match r {
                    $($r => if d == 128 {
                        tile::<$r, $j, 128>(q, d, kt, out, n8, scale, mx, last, store, pf)
                    } else {
                        tile::<$r, $j, 0>(q, d, kt, out, n8, scale, mx, last, store, pf)
                    },)*
                    _ => unreachable!("at most {} heads by {} vectors", 16 / $j, $j),
                }
            };
        }
        // SAFETY: the contract.
        unsafe {
            match j {
                2 => by_r!(2, 1 2 3 4 5 6 7 8),
                _ => by_r!(1, 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16),
            }
        }
    }

    /// Heads `0..R` (rows `d` apart from `q`) against key vectors `0..J`
    /// of 16 of the panel at `kt`: logit `t` to `out[r · n8 + 16 t..]`
    /// (vector `J − 1`'s lanes outside `store` not written), and folded
    /// into head `r`'s 8-lane running maximum `mx[8 r..][..8]` half by half
    /// as `max(x, m)` (a NaN logit leaves it as it was; vector `J − 1`'s
    /// lanes outside `last` count as `−inf`).
    ///
    /// `D`: `d` as a constant (the query rows' offsets in the instructions),
    /// or 0 to read `d`.
    ///
    /// # Safety
    /// AVX-512 F; `D` is 0 or `d`; `R` rows of `d` at `q`, a panel of `32 d`
    /// at `kt`, `R` rows `n8` apart at `out` with room for the stored lanes,
    /// `8 R` floats at `mx`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile<const R: usize, const J: usize, const D: usize>(
        q: *const f32,
        d: usize,
        kt: *const f32,
        out: *mut f32,
        n8: usize,
        scale: f32,
        mx: *mut f32,
        last: __mmask16,
        store: __mmask16,
        pf: &[u8],
    ) {
        debug_assert!(D == 0 || D == d, "a constant d other than d");
        let d = if D > 0 { D } else { d };
        let mut acc = [[_mm512_setzero_ps(); J]; R];
        macro_rules! step {
            ($c:expr) => {{
                let c = $c;
                // SAFETY: `c < d`: in the panel and in each query row.
                unsafe {
                    let mut k = [_mm512_setzero_ps(); J];
                    for t in 0..J {
                        k[t] = _mm512_loadu_ps(kt.add(c * PANEL + 16 * t));
                    }
                    for r in 0..R {
                        let b = _mm512_set1_ps(*q.add(r * d + c));
                        for t in 0..J {
                            acc[r][t] = _mm512_fmadd_ps(b, k[t], acc[r][t]);
                        }
                    }
                }
            }};
        }
        // The next queries' lines asked for, one a trip of four elements
        // (all at once, they stalled the tile on the fill buffers), into
        // every cache level (`group_sums` says why).
        let d4 = d / 4 * 4;
        let ahead = (pf.len().div_ceil(64) * 4).min(d4);
        let pp = pf.as_ptr() as *const i8;
        let mut c = 0;
        while c < ahead {
            // SAFETY: line `c / 4` of `pf` starts within it (`c / 4` below
            // its lines); a prefetch reads nothing architecturally.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(pp.add(16 * c)) };
            step!(c);
            step!(c + 1);
            step!(c + 2);
            step!(c + 3);
            c += 4;
        }
        while c < d4 {
            step!(c);
            step!(c + 1);
            step!(c + 2);
            step!(c + 3);
            c += 4;
        }
        for c in d4..d {
            step!(c);
        }
        // The lines left (the level measured no different here).
        crate::keys::prefetch(pf, 16 * d4, pf.len(), CacheLevel::L2);
        let (vs, ninf) = (_mm512_set1_ps(scale), _mm512_set1_ps(f32::NEG_INFINITY));
        for r in 0..R {
            // SAFETY: head `r`'s maximum (the contract).
            let mut m = unsafe { _mm256_loadu_ps(mx.add(8 * r)) };
            for t in 0..J {
                let y = _mm512_mul_ps(acc[r][t], vs);
                let (x, keep) = match t == J - 1 {
                    true => (_mm512_mask_blend_ps(last, ninf, y), store),
                    false => (y, !0),
                };
                // SAFETY: the logits' row, the lanes `keep` names (the
                // contract).
                unsafe { _mm512_mask_storeu_ps(out.add(r * n8 + 16 * t), keep, y) };
                m = _mm256_max_ps(_mm512_castps512_ps256(x), m);
                m = _mm256_max_ps(_mm512_extractf32x8_ps::<1>(x), m);
            }
            // SAFETY: as above.
            unsafe { _mm256_storeu_ps(mx.add(8 * r), m) };
        }
    }
}

/// Runs `infllm.panel_sums` once at `isa` (the reach test's probe).
#[cfg(test)]
pub(crate) fn probe(isa: Isa) {
    // 8 heads, d = 1, 3 keys of 0: every head uniform, so each sum is 8 / 3.
    let ck = [0.0f32; 3];
    let rows = Rows {
        ck: &ck,
        base: 0,
        stride: 1,
    };
    let panels = Panels::new_in(Vec::new(), rows, 3, 1);
    let mut s = Scratch::default();
    group_sums(isa, &[1.0; 8], 8, 1, &panels, 3, 1.0, &mut s, &[]);
    assert!(s.sums.iter().all(|&x| (x - 8.0 / 3.0).abs() < 1e-5));
}
