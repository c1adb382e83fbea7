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
//! # Two rows at once
//!
//! A row's search is a chain of passes, each waiting on the last one's
//! counts (a few vectors, then their lanes' sum and a compare): alone it
//! leaves the vector units idle. [`top2`] (`nsa.top2`, NSA's prefill rows
//! two at a time from `stage`) counts two rows' keys in one loop, each
//! row with its own `k`, value and end: a row whose count hit exactly its
//! `k` keeps its value while the other's search goes on, and the loop
//! ends when both have. The shorter row's keys past its end are
//! `i32::MIN`, which no searched value (above `i32::MIN`) counts, so each
//! row's counts, and then its ids, are those of [`top`] on it alone
//! (`two_rows_are_each_row_alone_at_every_level`).
//!
//! What would break it: a key that orders two scores as the total order
//! does not (`−0` below `+0`, a NaN above a number, the key of `−inf` or
//! NaN shared with a number's), the ties at `t` taken other than by id,
//! or an unsigned compare on the signed keys; in [`top2`], a row's value
//! changed after its search ended, or a padding key a search can count.

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

/// [`top`] of two rows (`scores[r]` into `out[r]`), the same ids as two
/// calls: the AVX2 kernel runs the two rows' searches side by side (a row's
/// search alone waits on its counts' latency), the portable one is two
/// calls.
///
/// # Panics
/// As [`top`].
pub(super) fn top2(isa: Isa, scores: [&[f32]; 2], scratch: &mut Vec<u64>, out: [&mut [i32]; 2]) {
    let [oa, ob] = out;
    if oa.is_empty() || ob.is_empty() {
        top(isa, scores[0], scratch, oa);
        return top(isa, scores[1], scratch, ob);
    }
    oa.fill(-1);
    ob.fill(-1);
    let w = scores[0].len().max(scores[1].len());
    assert!(w <= i32::MAX as usize, "block ids fit an i32");
    // Two rows of keys, each the longer row rounded up to 8 (`u64`
    // scratch holds two a slot).
    let len = w.next_multiple_of(8);
    if scratch.len() < len {
        scratch.resize(len, 0);
    }
    let keys: &mut [i32] = bytemuck::cast_slice_mut(&mut scratch[..len]);
    // SAFETY (bounds): `keys` holds `2 · round_up(w, 8)` (the kernel reads
    // and writes each row's whole vectors within its half); `out` is
    // written through its slices.
    dispatch!("nsa.top2", isa, {
        avx512 => avx2,
        avx2(t) => avx2::top2(t, scores, keys, [oa, ob]),
        scalar => {
            portable::top(scores[0], keys, oa);
            portable::top(scores[1], keys, ob)
        },
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
        // SAFETY: `keys` holds `scores.len()` rounded up to 8 (the contract).
        let (end, m) = unsafe { prep(scores, keys) };
        if end == 0 {
            return;
        }
        let nv = end.div_ceil(8);
        let (t, exact) = if m <= k {
            (CANDIDATE, true)
        } else {
            // SAFETY: `nv` vectors at `keys` (written by `prep`); more
            // than `k` candidates.
            unsafe { kth(keys.as_ptr(), nv, k) }
        };
        // SAFETY: as above.
        unsafe { finish(keys, end, t, exact, out) }
    }

    /// [`super::top2`]: each row's keys, then both rows' searches side by
    /// side (their counts in one loop: each search alone waits on its
    /// counts' latency), then each row's ids, as [`top`] writes them.
    ///
    /// # Safety
    /// `_token` proves AVX2; `keys` holds twice the longer row's length
    /// rounded up to 8.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn top2(
        _token: Avx2,
        [a, b]: [&[f32]; 2],
        keys: &mut [i32],
        [oa, ob]: [&mut [i32]; 2],
    ) {
        let w = a.len().max(b.len()).next_multiple_of(8);
        let (ka, kb) = keys[..2 * w].split_at_mut(w);
        // SAFETY: `ka` and `kb` hold `w`, each row's length rounded up to 8
        // or more.
        let ((ea, ma), (eb, mb)) = unsafe { (prep(a, ka), prep(b, kb)) };
        let (nva, nvb) = (ea.div_ceil(8), eb.div_ceil(8));
        let (sa, sb) = (ea > 0 && ma > oa.len(), eb > 0 && mb > ob.len());
        let (ta, tb) = if sa && sb {
            // Both rows searched together over the longer one's vectors:
            // the shorter one's past its own end `i32::MIN` (no candidate:
            // never at or above a searched value).
            let nv = nva.max(nvb);
            ka[nva * 8..nv * 8].fill(i32::MIN);
            kb[nvb * 8..nv * 8].fill(i32::MIN);
            // SAFETY: `nv` vectors at each (`nv · 8 <= w`), more than
            // each row's `k` candidates in each.
            let [ta, tb] = unsafe { kth2([ka.as_ptr(), kb.as_ptr()], nv, [oa.len(), ob.len()]) };
            (ta, tb)
        } else {
            let ta = if sa {
                // SAFETY: `nva` vectors written by `prep`, more than `k`
                // candidates.
                unsafe { kth(ka.as_ptr(), nva, oa.len()) }
            } else {
                (CANDIDATE, true)
            };
            let tb = if sb {
                // SAFETY: as above, row `b`.
                unsafe { kth(kb.as_ptr(), nvb, ob.len()) }
            } else {
                (CANDIDATE, true)
            };
            (ta, tb)
        };
        // SAFETY: each row's keys as `prep` wrote them to its `end` (a
        // padding past it is read by no `finish`).
        unsafe {
            if ea > 0 {
                finish(ka, ea, ta.0, ta.1, oa);
            }
            if eb > 0 {
                finish(kb, eb, tb.0, tb.1, ob);
            }
        }
    }

    /// A row's keys: `end` (one past its last candidate, 0 when none) and
    /// its candidates' count `m`, the keys of vectors `0..end.div_ceil(8)`
    /// written to `keys` (the last vector's lanes past `end` `i32::MIN`).
    ///
    /// # Safety
    /// AVX2; `keys` holds `scores.len()` rounded up to 8.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn prep(scores: &[f32], keys: &mut [i32]) -> (usize, usize) {
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
            return (0, 0);
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
        (end, hsum(m))
    }

    /// A row's ids from its keys (vectors `0..end.div_ceil(8)`, as
    /// [`prep`] wrote them) and its `k`-th key `t` (`exact`: the blocks at
    /// or above `t` are the row).
    ///
    /// # Safety
    /// AVX2; `end >= 1`; `keys` holds `end` rounded up to 8.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn finish(keys: &mut [i32], end: usize, t: i32, exact: bool, out: &mut [i32]) {
        let nv = end.div_ceil(8);
        assert!(keys.len() >= nv * 8, "keys for whole vectors");
        let kp = keys.as_mut_ptr();
        if !exact {
            // SAFETY: `nv` vectors at `kp`.
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

    /// [`kth`] of two rows side by side (each its own `k` and state, as
    /// [`kth`] alone: a row's bits stop at its count of exactly `k`, the
    /// other's search going on), their counts in one loop.
    ///
    /// # Safety
    /// AVX2; `nv` vectors of 8 keys at each of `kp`, more than that row's
    /// `k` of them candidates.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn kth2(kp: [*const i32; 2], nv: usize, k: [usize; 2]) -> [(i32, bool); 2] {
        let key = |t: u32| (t ^ 0x8000_0000) as i32;
        let mut t = [0u32; 2];
        let mut done = [false; 2];
        for s in (0..32).step_by(2).rev() {
            // `x >= v` as `x > v − 1`, as in [`kth`].
            let at = |r: usize, j: u32| _mm256_set1_epi32(key(t[r] | (j << s)).wrapping_sub(1));
            let v = [
                [at(0, 1), at(0, 2), at(0, 3)],
                [at(1, 1), at(1, 2), at(1, 3)],
            ];
            let mut a = [[_mm256_setzero_si256(); 3]; 2];
            for i in 0..nv {
                for r in 0..2 {
                    // SAFETY: vector `i < nv` of row `r`.
                    let x = unsafe { _mm256_loadu_si256(kp[r].add(i * 8).cast()) };
                    for j in 0..3 {
                        a[r][j] = _mm256_sub_epi32(a[r][j], _mm256_cmpgt_epi32(x, v[r][j]));
                    }
                }
            }
            for r in 0..2 {
                let [a1, a2, a3] = a[r];
                let h = _mm256_hadd_epi32(_mm256_hadd_epi32(a1, a2), _mm256_hadd_epi32(a3, a3));
                let c = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
                let kv = _mm_set1_epi32(k[r] as i32);
                let ge = _mm_cmpgt_epi32(c, _mm_sub_epi32(kv, _mm_set1_epi32(1)));
                let ge = _mm_movemask_ps(_mm_castsi128_ps(ge)) & 0b111;
                let eq = _mm_movemask_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(c, kv))) & 0b111;
                // A row whose search ended keeps its value.
                if !done[r] {
                    t[r] |= ge.count_ones() << s;
                    done[r] = eq != 0;
                }
            }
            if done[0] && done[1] {
                break;
            }
        }
        [(key(t[0]), done[0]), (key(t[1]), done[1])]
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

/// Runs `nsa.top` and `nsa.top2` once at `isa` (the reach test's probe).
#[cfg(test)]
pub(super) fn probe(isa: Isa) {
    let mut out = [0i32; 2];
    top(isa, &[0.5, 2.0, f32::NAN, 1.0], &mut Vec::new(), &mut out);
    assert_eq!(out, [1, 3]);
    let (mut a, mut b) = ([0i32; 2], [0i32; 1]);
    let s = [0.5, 2.0, f32::NAN, 1.0];
    top2(isa, [&s, &s[2..]], &mut Vec::new(), [&mut a, &mut b]);
    assert_eq!((a, b), ([1, 3], [1]));
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

    /// Two rows at once ([`top2`]) are each row alone ([`top`]) at every
    /// level: rows of 0 to 140 blocks against each other (the two of a pair
    /// of different lengths, either the longer; a row with no candidate;
    /// every tail length against 8), ties, NaN, `±inf`, `±0`, trailing
    /// `−inf` runs, each row its own `k` (at most, exactly and past its
    /// candidates: one row searched and the other not), and a scratch left
    /// by a longer pair.
    #[test]
    fn two_rows_are_each_row_alone_at_every_level() {
        let mut seed = 47u64;
        let mut scratch = vec![u64::MAX; 300];
        let lens: Vec<usize> = (0..=140).filter(|n| *n <= 20 || n % 9 < 2).collect();
        // Pairs whose rows are both searched and end in different vectors.
        let mut both = 0;
        let ea = |r: &[f32]| {
            let e = r.iter().rposition(|&x| x != f32::NEG_INFINITY);
            e.map_or(0, |e| e / 8 + 1)
        };
        for (i, &na) in lens.iter().enumerate() {
            for &nb in lens.iter().skip(i % 3).step_by(3) {
                let values = [3u64, 40, 1 << 20][(na + nb) % 3];
                let mut a = row_of(&mut seed, na, values);
                let mut b = row_of(&mut seed, nb, values);
                // Trailing `−inf` of some length (a prefill row's shape).
                let (ta, tb) = ((na * 7 + 3) % (na / 2 + 1), (nb * 5) % (nb / 3 + 1));
                a[na - ta..].fill(f32::NEG_INFINITY);
                b[nb - tb..].fill(f32::NEG_INFINITY);
                let cands = |r: &[f32]| r.iter().filter(|&&x| x != f32::NEG_INFINITY).count();
                let (ma, mb) = (cands(&a), cands(&b));
                for (ka, kb) in [
                    (16, 16),
                    (1, 3),
                    (ma.max(1), mb.saturating_sub(1).max(1)),
                    (ma + 1, 2),
                    (5, mb + 2),
                ] {
                    for isa in isas_for_test() {
                        let (mut wa, mut wb) = (vec![7i32; ka], vec![7i32; kb]);
                        top(isa, &a, &mut Vec::new(), &mut wa);
                        top(isa, &b, &mut Vec::new(), &mut wb);
                        let (mut ga, mut gb) = (vec![7i32; ka], vec![7i32; kb]);
                        top2(isa, [&a, &b], &mut scratch, [&mut ga, &mut gb]);
                        assert_eq!((&ga, &gb), (&wa, &wb), "{isa:?} {na} {nb} {ka} {kb}");
                        assert_eq!(wa, by_selection(&a, ka), "{isa:?} {na} {ka}");
                    }
                    both += usize::from(ka < ma && kb < mb && ea(&a) != ea(&b));
                }
            }
        }
        assert!(both > 500, "{both} pairs searched side by side");
        // Rows of one value (every key tied) and of NaN alone, side by side.
        for isa in isas_for_test() {
            for n in [1, 8, 9, 64, 129] {
                let (a, b) = (vec![f32::NAN; n], vec![-0.0f32; n + 3]);
                let (mut ga, mut gb) = (vec![7i32; 3], vec![7i32; 5]);
                top2(isa, [&a, &b], &mut scratch, [&mut ga, &mut gb]);
                let want = |k: usize, n: usize| {
                    let mut w: Vec<i32> = (0..k.min(n) as i32).collect();
                    w.resize(k, -1);
                    w
                };
                assert_eq!((ga, gb), (want(3, n), want(5, n + 3)), "{isa:?} {n}");
            }
        }
    }

    /// [`super::super::row2`] is [`super::super::row`] of each row, on rows
    /// the counting kernel takes and on longer ones (the long-row scan).
    #[test]
    fn row2_is_row_of_each() {
        let mut seed = 48u64;
        let mut ids = Vec::new();
        for (na, nb) in [
            (100, 90),
            (ROW_SELECT_MAX, 3),
            (ROW_SELECT_MAX + 1, 60),
            (7, ROW_SELECT_MAX + 9),
        ] {
            let a = row_of(&mut seed, na, 50);
            let b = row_of(&mut seed, nb, 50);
            for (ka, kb) in [(16, 16), (ROW_SCAN_MAX + 1, 2)] {
                let (mut ga, mut gb) = (vec![7i32; ka], vec![7i32; kb]);
                super::super::row2([&a, &b], &mut ids, [&mut ga, &mut gb]);
                assert_eq!(ga, by_selection(&a, ka), "{na} {ka}");
                assert_eq!(gb, by_selection(&b, kb), "{nb} {kb}");
            }
        }
    }

    /// Timing, not a check (`cargo test --release --lib top2_timing --
    /// --ignored --nocapture`): rows of a prefill (128 blocks, the first
    /// 1 to 128 candidates, `k = 16`), two at a time against one at a time,
    /// interleaved.
    #[test]
    #[ignore]
    fn top2_timing() {
        let mut seed = 49u64;
        let rows: Vec<Vec<f32>> = (0..256)
            .map(|i| {
                let mut r = row_of(&mut seed, 128, 1 << 20);
                r.iter_mut().for_each(|x| *x = x.abs().min(1e6));
                r[i / 2 % 128 + 1..].fill(f32::NEG_INFINITY);
                r
            })
            .collect();
        let isa = Isa::best();
        let mut scratch = Vec::new();
        let (mut oa, mut ob) = (vec![0i32; 16], vec![0i32; 16]);
        let mut t = [0f64; 2];
        for rep in 0..400 {
            for side in [rep % 2, 1 - rep % 2] {
                let t0 = std::time::Instant::now();
                for p in rows.chunks(2) {
                    if side == 0 {
                        top(isa, &p[0], &mut scratch, &mut oa);
                        top(isa, &p[1], &mut scratch, &mut ob);
                    } else {
                        top2(isa, [&p[0], &p[1]], &mut scratch, [&mut oa, &mut ob]);
                    }
                }
                t[side] += t0.elapsed().as_secs_f64();
            }
        }
        println!(
            "one at a time {:.1} ms, two {:.1} ms",
            t[0] * 1e3,
            t[1] * 1e3
        );
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
