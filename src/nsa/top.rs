//! A row's top-k by counting (`nsa.top`): the first `k` candidates of a
//! row of block scores in the total order of [`super::row`], ascending,
//! with no sort and no selection.
//!
//! # The rule, and why counting finds it
//!
//! Each block's score becomes an `i32` key ([`key`]) whose signed order is
//! the order of the scores: `+0` for `−0` (the two are equal), a negative
//! score's magnitude bits flipped, NaN `i32::MIN + 1` (after every number),
//! `−inf` `i32::MIN` (no candidate). These are [`super::order_key`]'s high
//! 32 bits with the sign bit flipped, so two blocks compare as there unless
//! their keys are equal, and then the lower id comes first.
//!
//! With `m` candidates (keys above `i32::MIN`) and `k < m`, let `t` be the
//! `k`-th largest key (the multiset's). Every block with a key above `t`
//! is in the row (fewer than `k` are), every block below it is not, and of
//! the blocks whose key is `t` the row takes the lowest ids, as many as
//! the row has slots left. `t` is found bit by bit from the top (a binary
//! search over the keys' values): `t` is the largest value `v` with
//! `count(key >= v) >= k`, so with the bits above decided, a bit is set
//! iff the count at the value with it set (and the lower bits clear) is
//! still `>= k`. A count of exactly `k` ends the search early: the blocks
//! at or above that value are the row, whatever `t` is. With `k >= m`
//! the row is every candidate.
//!
//! The rows it writes are therefore the order's, however the counting is
//! done: the portable kernel counts one key at a time, the AVX2 one eight
//! keys a compare and writes a row's ids eight lanes at a time (a table of
//! the lanes each compare mask keeps); both are only the rule above, so
//! they give the same ids. `src/nsa/top.rs`'s tests check both against the
//! selection `row` used before (an order key a block, `select_nth_unstable`)
//! and a full sort, on rows of ties, NaN, `±inf`, `±0` and every tail
//! length.
//!
//! What would break it: a key that orders two scores as the total order
//! does not (`−0` below `+0`, a NaN above a number, the key of `−inf` or
//! NaN shared with a number's), the ties at `t` taken other than by id,
//! or an unsigned compare on the signed keys.

use crate::simd::{dispatch, Isa};

/// The first `out.len()` candidates of `scores` (scores other than `−inf`)
/// in [`super::row`]'s total order, ascending, then `-1`. `scratch` holds
/// the keys (its contents are not read).
///
/// # Panics
/// If the row has more than `i32::MAX` blocks (its ids are `i32`; the
/// callers' lengths are checked int32 positions, so a row has at most
/// `i32::MAX` blocks, ids to `i32::MAX − 1`; the AVX2 kernel's padded lane
/// ids reach `2^31 − 1` and its per-lane counts sum to at most the row's
/// candidates).
pub(super) fn top(isa: Isa, scores: &[f32], scratch: &mut Vec<u64>, out: &mut [i32]) {
    out.fill(-1);
    if out.is_empty() || scores.is_empty() {
        return;
    }
    assert!(scores.len() <= i32::MAX as usize, "block ids fit an i32");
    // The keys, padded to whole vectors: `u64` scratch holds two a slot
    // (grown only: the kernels write every key they read).
    let len = scores.len().next_multiple_of(8) / 2;
    if scratch.len() < len {
        scratch.resize(len, 0);
    }
    let keys: &mut [i32] = bytemuck::cast_slice_mut(&mut scratch[..len]);
    // SAFETY (bounds): `keys` holds `scores.len()` rounded up to 8 (the
    // kernels write and read whole vectors of it, no further); `out` is
    // written through its slice.
    dispatch!("nsa.top", isa, {
        avx512 => avx2,
        avx2(t) => avx2::top(t, scores, keys, out),
        scalar => portable::top(scores, keys, out),
    })
}

/// A score's key: the signed order of keys is the total order of scores
/// (see the module docs); `−inf` `i32::MIN`, NaN `i32::MIN + 1`.
#[inline(always)]
fn key(s: f32) -> i32 {
    if s.is_nan() {
        return i32::MIN + 1;
    }
    if s == f32::NEG_INFINITY {
        return i32::MIN;
    }
    let bits = (s + 0.0).to_bits() as i32;
    bits ^ (((bits >> 31) as u32) >> 1) as i32
}

/// The smallest candidate's key: `count(key >= CANDIDATE)` counts them.
const CANDIDATE: i32 = i32::MIN + 1;

/// The `k`-th largest of keys (`count_ge(v)`: how many are `>= v`), when
/// more than `k` are candidates, and whether exactly `k` are at or above
/// the value returned (then those are the row, ties or not).
#[inline(always)]
fn kth(k: usize, mut count_ge: impl FnMut(i32) -> usize) -> (i32, bool) {
    // In the unsigned order of `key ^ i32::MIN` (the same order), the
    // value's bits from the top.
    // Once set, `t`'s count is `>= k`, and the search ends if it is `k`:
    // a search that runs out of bits ends on a count above `k` (`t` is set
    // at some bit: the `k`-th largest key is a candidate's, above 0 here).
    let mut t = 0u32;
    for bit in (0..32).rev() {
        let v = t | (1 << bit);
        let c = count_ge((v ^ 0x8000_0000) as i32);
        if c >= k {
            t = v;
            if c == k {
                return ((t ^ 0x8000_0000) as i32, true);
            }
        }
    }
    ((t ^ 0x8000_0000) as i32, false)
}

/// The row from its keys when the `k`-th key `t` is tied past the row:
/// every block above `t`, then the lowest-id ones at `t` while slots are
/// left, their ids in order into `keys`' front (block `b`'s key is read
/// before id `o <= b` is written), then `out`.
fn ties(keys: &mut [i32], end: usize, t: i32, above: usize, out: &mut [i32]) {
    let mut left = out.len() - above;
    let mut o = 0;
    for b in 0..end {
        let x = keys[b];
        let tie = x == t && left > 0;
        keys[o] = b as i32;
        o += usize::from(x > t || tie);
        left -= usize::from(tie);
    }
    out[..o].copy_from_slice(&keys[..o]);
}

mod portable {
    use super::{key, kth, ties, CANDIDATE};

    /// [`super::top`], a key at a time.
    pub(super) fn top(scores: &[f32], keys: &mut [i32], out: &mut [i32]) {
        let k = out.len();
        let end = scores
            .iter()
            .rposition(|&s| s != f32::NEG_INFINITY)
            .map_or(0, |e| e + 1);
        for (o, &s) in keys.iter_mut().zip(&scores[..end]) {
            *o = key(s);
        }
        let keys = &mut keys[..end];
        let count_ge = |v: i32| keys.iter().filter(|&&x| x >= v).count();
        let m = count_ge(CANDIDATE);
        let (t, exact) = if m <= k {
            (CANDIDATE, true)
        } else {
            kth(k, count_ge)
        };
        if exact {
            // The blocks at or above `t`, compacted in place (as in `ties`).
            let mut o = 0;
            for b in 0..end {
                let x = keys[b];
                keys[o] = b as i32;
                o += usize::from(x >= t);
            }
            out[..o].copy_from_slice(&keys[..o]);
        } else {
            let above = keys.iter().filter(|&&x| x > t).count();
            ties(keys, end, t, above, out);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{ties, CANDIDATE};
    use crate::simd::Avx2;
    use std::arch::x86_64::*;

    /// For each 8-bit mask, the lanes it keeps in order (byte `i` the
    /// `i`-th set bit's lane; the rest 0).
    static KEPT: [u64; 256] = {
        let mut t = [0u64; 256];
        let mut m = 0;
        while m < 256 {
            let (mut i, mut lane) = (0, 0);
            while lane < 8 {
                if m & (1 << lane) != 0 {
                    t[m] |= (lane as u64) << (8 * i);
                    i += 1;
                }
                lane += 1;
            }
            m += 1;
        }
        t
    };

    /// [`super::top`], eight keys a compare.
    ///
    /// # Safety
    /// `_token` proves AVX2; `keys` holds `scores.len()` rounded up to 8.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn top(_token: Avx2, scores: &[f32], keys: &mut [i32], out: &mut [i32]) {
        let k = out.len();
        let n = scores.len();
        let sp = scores.as_ptr();
        let ninf = _mm256_set1_ps(f32::NEG_INFINITY);
        // The candidates end after the last score other than `−inf`: a
        // forward pass without a branch on the data (a backward search's
        // exit branch cost a quarter of a prefill row).
        // The last vector with a candidate and its mask, then its last lane.
        let (mut last, mut last_m) = (0usize, 0u32);
        for v in 0..n / 8 {
            // SAFETY: `v · 8 + 8 <= n`.
            let x = unsafe { _mm256_loadu_ps(sp.add(v * 8)) };
            let m = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_NEQ_UQ>(x, ninf)) as u32;
            let keep = 0u32.wrapping_sub(u32::from(m != 0));
            last = (v & keep as usize) | (last & !keep as usize);
            last_m = (m & keep) | (last_m & !keep);
        }
        let mut end = if last_m == 0 {
            0
        } else {
            last * 8 + 32 - last_m.leading_zeros() as usize
        };
        for (b, &s) in scores.iter().enumerate().skip(n / 8 * 8) {
            if s != f32::NEG_INFINITY {
                end = b + 1;
            }
        }
        if end == 0 {
            return;
        }
        let nv = end.div_ceil(8);
        assert!(keys.len() >= nv * 8, "keys for whole vectors");
        let kp = keys.as_mut_ptr();
        // The keys, the last vector's lanes past `end` `−inf`'s.
        let mut m = _mm256_setzero_si256();
        for v in 0..nv {
            let x = if v * 8 + 8 <= n {
                // SAFETY: `v · 8 + 8 <= n`.
                unsafe { _mm256_loadu_ps(sp.add(v * 8)) }
            } else {
                let mut l = [f32::NEG_INFINITY; 8];
                l[..n - v * 8].copy_from_slice(&scores[v * 8..]);
                // SAFETY: `l` is 8 floats.
                unsafe { _mm256_loadu_ps(l.as_ptr()) }
            };
            let x = if v + 1 == nv && !end.is_multiple_of(8) {
                let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
                let past = _mm256_cmpgt_epi32(idx, _mm256_set1_epi32((end % 8) as i32 - 1));
                _mm256_blendv_ps(x, ninf, _mm256_castsi256_ps(past))
            } else {
                x
            };
            let key = keys8(x);
            m = _mm256_sub_epi32(m, _mm256_cmpgt_epi32(key, _mm256_set1_epi32(i32::MIN)));
            // SAFETY: vector `v < nv` of `keys`.
            unsafe { _mm256_storeu_si256(kp.add(v * 8).cast(), key) };
        }
        let m = hsum(m);
        let (t, exact) = if m <= k {
            (CANDIDATE, true)
        } else {
            // SAFETY: `nv` vectors at `kp`; more than `k` candidates.
            unsafe { kth(kp, nv, k) }
        };
        if !exact {
            // SAFETY: as above.
            let above = unsafe { count_ge(kp, nv, t.wrapping_add(1)) };
            return ties(keys, end, t, above, out);
        }
        // The blocks at or above `t` in id order, eight lanes a store into
        // `keys`' front: the `o`-th kept is written at `o <= 8 v` after
        // vector `v` is read (nothing past it overwritten).
        let tv = _mm256_set1_epi32(t - 1);
        let mut o = 0;
        for v in 0..nv {
            // SAFETY: vector `v < nv` of `keys`; the store's 8 lanes at `o
            // <= 8 v` end at or before `8 v + 8`.
            unsafe {
                let x = _mm256_loadu_si256(kp.add(v * 8).cast());
                let mask = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(x, tv)));
                let lanes = _mm_loadl_epi64(KEPT.as_ptr().add(mask as usize).cast());
                let ids = _mm256_add_epi32(
                    _mm256_cvtepu8_epi32(lanes),
                    _mm256_set1_epi32((v * 8) as i32),
                );
                _mm256_storeu_si256(kp.add(o).cast(), ids);
                o += mask.count_ones() as usize;
            }
        }
        out[..o].copy_from_slice(&keys[..o]);
    }

    /// [`super::kth`] two bits a pass: the counts at the three values with
    /// the pass's bits `01`, `10`, `11` (the bits above decided, those
    /// below clear), taken together; the bits are the number of counts
    /// `>= k` (they fall as the value rises), and a count of `k` ends the
    /// search (the value whose count it is: the bits that many).
    ///
    /// # Safety
    /// AVX2; `nv` vectors of 8 keys at `kp`, more than `k` of them
    /// candidates.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn kth(kp: *const i32, nv: usize, k: usize) -> (i32, bool) {
        let kv = _mm_set1_epi32(k as i32);
        let key = |t: u32| (t ^ 0x8000_0000) as i32;
        let mut t = 0u32;
        for s in (0..32).step_by(2).rev() {
            // `x >= v` as `x > v − 1` (`v` above `i32::MIN`: its bits are
            // not all clear).
            let at = |j: u32| _mm256_set1_epi32(key(t | (j << s)).wrapping_sub(1));
            let (v1, v2, v3) = (at(1), at(2), at(3));
            let (mut a1, mut a2, mut a3) = (
                _mm256_setzero_si256(),
                _mm256_setzero_si256(),
                _mm256_setzero_si256(),
            );
            for i in 0..nv {
                // SAFETY: vector `i < nv`.
                let x = unsafe { _mm256_loadu_si256(kp.add(i * 8).cast()) };
                a1 = _mm256_sub_epi32(a1, _mm256_cmpgt_epi32(x, v1));
                a2 = _mm256_sub_epi32(a2, _mm256_cmpgt_epi32(x, v2));
                a3 = _mm256_sub_epi32(a3, _mm256_cmpgt_epi32(x, v3));
            }
            // [c1, c2, c3, c3]: each accumulator's lanes added.
            let h = _mm256_hadd_epi32(_mm256_hadd_epi32(a1, a2), _mm256_hadd_epi32(a3, a3));
            let c = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
            let ge = _mm_cmpgt_epi32(c, _mm_sub_epi32(kv, _mm_set1_epi32(1)));
            let ge = _mm_movemask_ps(_mm_castsi128_ps(ge)) & 0b111;
            let eq = _mm_movemask_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(c, kv))) & 0b111;
            t |= (ge.count_ones()) << s;
            if eq != 0 {
                return (key(t), true);
            }
        }
        (key(t), false)
    }

    /// [`super::key`] of eight scores.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn keys8(x: __m256) -> __m256i {
        let bits = _mm256_castps_si256(_mm256_add_ps(x, _mm256_setzero_ps()));
        let flip = _mm256_srli_epi32::<1>(_mm256_srai_epi32::<31>(bits));
        let key = _mm256_xor_si256(bits, flip);
        let nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(x, x));
        let key = _mm256_blendv_epi8(key, _mm256_set1_epi32(i32::MIN + 1), nan);
        let ninf = _mm256_cmp_ps::<_CMP_EQ_OQ>(x, _mm256_set1_ps(f32::NEG_INFINITY));
        _mm256_blendv_epi8(key, _mm256_set1_epi32(i32::MIN), _mm256_castps_si256(ninf))
    }

    /// The eight lanes' sum.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn hsum(a: __m256i) -> usize {
        let s = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256::<1>(a));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
        _mm_cvtsi128_si32(s) as usize
    }

    /// How many of the `nv` vectors of keys at `kp` are `>= v` (`v >
    /// i32::MIN`).
    ///
    /// # Safety
    /// AVX2; `nv` vectors of 8 keys at `kp`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn count_ge(kp: *const i32, nv: usize, v: i32) -> usize {
        let t = _mm256_set1_epi32(v - 1);
        let (mut a, mut b) = (_mm256_setzero_si256(), _mm256_setzero_si256());
        let mut i = 0;
        while i + 2 <= nv {
            // SAFETY: vectors `i, i + 1 < nv`.
            unsafe {
                let x = _mm256_loadu_si256(kp.add(i * 8).cast());
                let y = _mm256_loadu_si256(kp.add(i * 8 + 8).cast());
                a = _mm256_sub_epi32(a, _mm256_cmpgt_epi32(x, t));
                b = _mm256_sub_epi32(b, _mm256_cmpgt_epi32(y, t));
            }
            i += 2;
        }
        if i < nv {
            // SAFETY: vector `i < nv`.
            let x = unsafe { _mm256_loadu_si256(kp.add(i * 8).cast()) };
            a = _mm256_sub_epi32(a, _mm256_cmpgt_epi32(x, t));
        }
        hsum(_mm256_add_epi32(a, b))
    }
}

/// Runs `nsa.top` once at `isa` (the reach test's probe).
#[cfg(test)]
pub(super) fn probe(isa: Isa) {
    let mut out = [0i32; 2];
    top(isa, &[0.5, 2.0, f32::NAN, 1.0], &mut Vec::new(), &mut out);
    assert_eq!(out, [1, 3]);
}

#[cfg(test)]
mod tests {
    use super::super::{order_key, ROW_SCAN_MAX, ROW_SELECT_MAX};
    use super::*;
    use crate::simd::isas_for_test;

    /// The selection [`super::super::row`] ran before this kernel: an order
    /// key a block, the `k`-th largest by `select_nth_unstable`, the blocks
    /// at or above it in id order.
    fn by_selection(scores: &[f32], k: usize) -> Vec<i32> {
        let end = scores
            .iter()
            .rposition(|&s| s != f32::NEG_INFINITY)
            .map_or(0, |e| e + 1);
        let keys: Vec<u64> = (0..end).map(|b| order_key(scores[b], b)).collect();
        let above = order_key(f32::NEG_INFINITY, 0) + 1;
        let m = keys.iter().filter(|&&x| x >= above).count();
        let t = if m > k {
            let mut c = keys.clone();
            *c.select_nth_unstable(end - k).1
        } else {
            above
        };
        let mut row: Vec<i32> = (0..end)
            .filter(|&b| keys[b] >= t)
            .map(|b| b as i32)
            .collect();
        row.resize(k, -1);
        row
    }

    /// The keys order as the order keys' high halves do, and `−inf` and
    /// NaN hold the two lowest, shared with no number.
    #[test]
    fn keys_order_as_the_order_keys() {
        let vals = [
            f32::NEG_INFINITY,
            -f32::MAX,
            -1.5,
            -f32::MIN_POSITIVE,
            -1e-45,
            -0.0,
            0.0,
            1e-45,
            f32::MIN_POSITIVE,
            0.25,
            f32::MAX,
            f32::INFINITY,
            f32::NAN,
            -f32::NAN,
        ];
        for &a in &vals {
            for &b in &vals {
                let (ka, kb) = (order_key(a, 0) >> 32, order_key(b, 0) >> 32);
                assert_eq!(key(a).cmp(&key(b)), ka.cmp(&kb), "{a} {b}");
            }
        }
        assert_eq!(key(f32::NEG_INFINITY), i32::MIN);
        assert_eq!(key(-f32::NAN), CANDIDATE);
        assert!(key(-f32::MAX) > CANDIDATE);
    }

    /// Scores from a few values (ties), `±inf`, NaN, `±0` and negatives.
    fn row_of(seed: &mut u64, n: usize, values: u64) -> Vec<f32> {
        (0..n)
            .map(|_| {
                *seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let r = *seed >> 33;
                match r % 24 {
                    0 => f32::INFINITY,
                    1 | 2 => f32::NEG_INFINITY,
                    3 => f32::NAN,
                    4 => -f32::NAN,
                    5 => 0.0,
                    6 => -0.0,
                    7 => -(((r >> 8) % values) as f32) * 0.125,
                    8 => f32::from_bits((r >> 8) as u32 % 8), // subnormals
                    _ => ((r >> 8) % values) as f32 * 0.0625,
                }
            })
            .collect()
    }

    /// Every level's kernel equals the selection `row` ran before, bit for
    /// bit: rows of 1 to 600 blocks (every tail length against 8), with
    /// ties, NaN, `±inf`, `±0`, trailing `−inf` runs of every length, `k`
    /// from 1 past the candidates.
    #[test]
    fn top_equals_the_selection_at_every_level() {
        let mut seed = 45u64;
        let mut scratch = Vec::new();
        for n in (1..=600).filter(|n| *n <= 80 || n % 7 == 0 || n % 64 < 9) {
            for (case, values) in [(0, 3u64), (1, 40), (2, 1 << 20)] {
                let mut scores = row_of(&mut seed, n, values);
                // Trailing `−inf` (a prefill row's shape), of every length.
                let tail = (n * 5 + case * 3) % (n + 1);
                scores[n - tail..].fill(f32::NEG_INFINITY);
                let m = scores.iter().filter(|&&s| s != f32::NEG_INFINITY).count();
                for k in [
                    1,
                    2,
                    3,
                    5,
                    16,
                    17,
                    64,
                    65,
                    m.saturating_sub(1),
                    m,
                    m + 1,
                    n + 3,
                ] {
                    let k = k.max(1);
                    let want = by_selection(&scores, k);
                    for isa in isas_for_test() {
                        let mut got = vec![7i32; k];
                        top(isa, &scores, &mut scratch, &mut got);
                        assert_eq!(got, want, "{isa:?} n={n} k={k} case={case}");
                    }
                }
            }
        }
    }

    /// Rows of one value (every key tied), of NaN alone, of `−inf` alone
    /// (an empty row), and `+inf` ties at the `k`-th: the lowest ids.
    #[test]
    fn ties_go_to_the_lower_ids_at_every_level() {
        let mut scratch = Vec::new();
        for isa in isas_for_test() {
            for n in [1, 7, 8, 9, 63, 64, 65, 129] {
                for v in [0.5f32, -0.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                    let scores = vec![v; n];
                    for k in [1, 3, n, n + 1] {
                        let mut got = vec![7i32; k];
                        top(isa, &scores, &mut scratch, &mut got);
                        let kept = if v == f32::NEG_INFINITY { 0 } else { k.min(n) };
                        let mut want: Vec<i32> = (0..kept as i32).collect();
                        want.resize(k, -1);
                        assert_eq!(got, want, "{isa:?} n={n} k={k} v={v}");
                    }
                }
            }
            // `+inf` ties before a number, NaN after; `−0` ties with `+0`.
            let s = [1.0, f32::INFINITY, f32::NAN, -0.0, f32::INFINITY, 0.0, 2.0];
            for (k, want) in [
                (1, vec![1]),
                (2, vec![1, 4]),
                (3, vec![1, 4, 6]),
                (5, vec![0, 1, 3, 4, 6]),
                (6, vec![0, 1, 3, 4, 5, 6]),
            ] {
                let mut got = vec![7i32; k];
                top(isa, &s, &mut scratch, &mut got);
                assert_eq!(got, want, "{isa:?} k={k}");
            }
        }
    }

    /// [`super::super::row`] takes this kernel up to its selection's widths;
    /// its output there is the kernel's at the dispatched level.
    #[test]
    fn row_is_the_kernel_where_it_selects() {
        let mut seed = 46u64;
        let mut ids = Vec::new();
        for n in [1, 9, 100, ROW_SELECT_MAX, ROW_SELECT_MAX + 1] {
            let scores = row_of(&mut seed, n, 50);
            for k in [1, 16, ROW_SCAN_MAX + 1] {
                if n > ROW_SELECT_MAX && k <= ROW_SCAN_MAX {
                    continue;
                }
                let mut got = vec![7i32; k];
                super::super::row(&scores, &mut ids, &mut got);
                assert_eq!(got, by_selection(&scores, k), "n={n} k={k}");
            }
        }
    }
}
