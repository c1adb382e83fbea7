//! The occupancy scan: which segments a learned row occupies, as a 64-bit
//! mask, by the f64 segment map (exact: see the module docs of
//! [`crate::witness`]); one kernel per instruction set.

use crate::simd::{dispatch, Isa};

#[cfg(target_arch = "x86_64")]
mod avx2;
mod portable;

/// `2⁻⁴⁰`: lifts an exact-integer quotient that rounding put just below
/// itself back above it (see the module docs for why this is exact).
const LIFT: f64 = 1.0 / (1u64 << 40) as f64;

/// One row's geometry: its length, effective segment count and the
/// constants of the segment map.
#[derive(Debug, Clone, Copy)]
pub(super) struct Row {
    pub(super) len: u64,
    pub(super) s_eff: u64,
    /// `S - 1`: where an out-of-range entry is clamped to.
    pub(super) s_last: u64,
}

impl Row {
    /// `None` for a row of length `<= 0`: such a row gets no witnesses.
    pub(super) fn new(context_len: i32, num_segments: usize) -> Option<Row> {
        if context_len <= 0 || num_segments == 0 {
            return None;
        }
        let len = context_len as u64;
        let s = num_segments as u64;
        Some(Row {
            len,
            s_eff: s.min(len),
            s_last: s - 1,
        })
    }

    /// The left edge of segment `s`, `ceil(s·L / S_eff)`; `< L` for
    /// `s < S_eff`, so it fits in `i32`.
    pub(super) fn edge(&self, s: u64) -> i32 {
        (s * self.len).div_ceil(self.s_eff) as i32
    }

    /// The segment of a non-negative entry, in exact integer arithmetic.
    pub(super) fn segment_exact(&self, x: i32) -> u64 {
        ((x as u64) * self.s_eff / self.len).min(self.s_last)
    }

    /// `S_eff / L` for the f64 segment map; only used with `S <= 64`.
    pub(super) fn ratio(&self) -> f64 {
        self.s_eff as f64 / self.len as f64
    }

    /// Bits `0..S_eff`: the segments that exist.
    pub(super) fn partition_mask(&self) -> u64 {
        if self.s_eff >= 64 {
            u64::MAX
        } else {
            (1u64 << self.s_eff) - 1
        }
    }
}

/// The segments `row` occupies, as a mask; bits at or past `S_eff` may be set
/// by out-of-range entries and mean nothing. Requires `S <= 64`. May stop
/// early once every segment of the partition is occupied.
pub(super) fn occupancy(row: &[i32], g: &Row, isa: Isa) -> u64 {
    scan(isa, row, None, g)
}

/// [`occupancy`] of `src` while copying it into `dst` (same length): one
/// pass over the learned row for the merge's copy and its scan.
pub(super) fn copy_occupancy(src: &[i32], dst: &mut [i32], g: &Row, isa: Isa) -> u64 {
    scan(isa, src, Some(dst), g)
}

/// The occupancy scan's one dispatch: [`occupancy`] of `row`, copied into
/// `copy` on the way when one is given (no AVX-512 kernel: the scan is
/// bound by the row's bytes, which AVX2 already keeps up with).
fn scan(isa: Isa, row: &[i32], copy: Option<&mut [i32]>, g: &Row) -> u64 {
    let (full, ratio, s_last) = (g.partition_mask(), g.ratio(), g.s_last as i32);
    // SAFETY (bounds): the kernel reads `row` through its bounds-checked
    // chunks, and asserts `dst.len() == row.len()` before its unchecked
    // stores (callers pass two rows of one `topk`).
    dispatch!("witness.scan", isa, {
        avx512 => avx2,
        avx2(t) => match copy {
            Some(dst) => avx2::occupancy_avx2::<true>(t, row, dst, ratio, s_last, full),
            None => avx2::occupancy_avx2::<false>(t, row, &mut [], ratio, s_last, full),
        },
        scalar => {
            if let Some(dst) = copy {
                dst.copy_from_slice(row);
            }
            portable::occupancy_scalar(row, ratio, s_last, full)
        }
    })
}

/// The f64 segment map on one non-negative entry; exact (module docs).
#[inline(always)]
pub(super) fn segment_fast(x: i32, ratio: f64, s_last: i32) -> i32 {
    ((x as f64 * ratio + LIFT) as i32).min(s_last)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The f64 map equals exact integer division on every segment edge and
    /// its neighbours, and on random entries, for every S the merge accepts.
    #[test]
    fn the_f64_segment_map_is_exact() {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut lens: Vec<u64> = (1..=300).collect();
        lens.extend([
            i32::MAX as u64,
            i32::MAX as u64 - 1,
            1 << 30,
            (1 << 31) - 3,
            65_537,
            999_999_937,
        ]);
        for _ in 0..300 {
            lens.push(next() % (i32::MAX as u64) + 1);
        }
        let mut checked = 0u64;
        for &len in &lens {
            for s in 1..=64u64 {
                let g = Row::new(len as i32, s as usize).unwrap();
                let mut probe = |x: u64| {
                    if x <= i32::MAX as u64 {
                        let exact = g.segment_exact(x as i32) as i32;
                        let fast = segment_fast(x as i32, g.ratio(), g.s_last as i32);
                        assert_eq!(fast, exact, "x={x} L={len} S={s}");
                        checked += 1;
                    }
                };
                for k in 0..=g.s_eff {
                    let e = (k * len).div_ceil(g.s_eff);
                    for x in [e.saturating_sub(1), e, e + 1] {
                        probe(x);
                    }
                }
                for _ in 0..8 {
                    probe(next() % len);
                }
                probe(i32::MAX as u64);
            }
        }
        assert!(checked > 1_000_000, "only {checked} cases checked");
    }

    /// The AVX2 kernel and the portable one build the same mask, padding,
    /// out-of-range entries, early stops and ragged tails included.
    #[test]
    fn every_simd_level_builds_the_same_occupancy() {
        let mut state = 12345u64;
        let mut next = move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as u32
        };
        #[cfg(target_arch = "x86_64")]
        let token = crate::simd::avx2_for_test();
        for case in 0..4000 {
            let len = match case % 4 {
                0 => (next() % 40) as i32 + 1,
                1 => (next() % 5000) as i32 + 1,
                2 => i32::MAX - (next() % 3) as i32,
                _ => (next() % 1_000_000) as i32 + 1,
            };
            let s = (next() % 64) as usize + 1;
            let n = (next() % 700) as usize;
            let row: Vec<i32> = (0..n)
                .map(|_| match next() % 10 {
                    0 => -1,
                    1 => -((next() % 1000) as i32) - 1,
                    2 => len.saturating_add((next() % 100) as i32),
                    _ => (next() % len as u32) as i32,
                })
                .collect();
            let g = Row::new(len, s).unwrap();
            let full = g.partition_mask();
            let want = portable::occupancy_scalar(&row, g.ratio(), g.s_last as i32, full);
            let exact = row
                .iter()
                .filter(|&&x| x >= 0)
                .fold(0u64, |m, &x| m | 1 << g.segment_exact(x));
            assert_eq!(want & full, exact & full);
            #[cfg(target_arch = "x86_64")]
            if let Some(t) = token {
                // SAFETY: `t` proves AVX2+FMA.
                let got = unsafe {
                    avx2::occupancy_avx2::<false>(
                        t,
                        &row,
                        &mut [],
                        g.ratio(),
                        g.s_last as i32,
                        full,
                    )
                };
                assert_eq!(got & full, want & full, "row={row:?} L={len} S={s}");
                let mut copy = vec![0; row.len()];
                // SAFETY: `t` proves AVX2+FMA; `copy` has `row`'s length.
                let got = unsafe {
                    avx2::occupancy_avx2::<true>(
                        t,
                        &row,
                        &mut copy,
                        g.ratio(),
                        g.s_last as i32,
                        full,
                    )
                };
                assert_eq!(
                    got & full,
                    want & full,
                    "fused copy: row={row:?} L={len} S={s}"
                );
                assert_eq!(copy, row, "the fused scan copies the whole row");
            }
        }
    }
}
