//! Segment witnesses: a covering constraint on top of a learned sparse top-k.
//!
//! A port of the candidate policy of vllm-project/vllm#47942 (commit
//! a41354cb34, "Add topology witnesses to the sparse MLA indexer top-k"),
//! specified in `spec/segment-witnesses.md`.
//!
//! # The rule
//!
//! A row has context length `L >= 1` and the policy a segment count `S >= 1`.
//! With `S_eff = min(S, L)`, `[0, L)` is cut into `S_eff` consecutive
//! segments with left edges `e_s = ceil(s·L / S_eff)` and segment map
//! `σ(x) = floor(x·S_eff / L)`. A learned row `K` occupies `{σ(x) : x ∈ K}`;
//! its witnesses are the edges `e_s` of the segments it does not occupy.
//!
//! `σ(e_s) = s` for every `s < S_eff`, because `S_eff <= L` (which is why `S`
//! is capped at `L` per row); rounding the edge down instead would not
//! round-trip (`L = 10, S = 4, s = 1` gives 2, and `σ(2) = 0`). So, with no
//! scan: witnesses are disjoint from the learned row, pairwise distinct, and
//! the union covers every segment.
//!
//! # The merge, and what it does not guarantee
//!
//! A row is `topk` slots; slots `[0, keep)` are kept bit for bit and the
//! witnesses, in ascending segment order, overwrite slots `keep, keep + 1, …`
//! up to the budget `B = min(max_replacements, topk - keep)`; witnesses past
//! `B` are dropped, and slots past the last witness are left as they were.
//! Occupancy is read from the *whole* learned row, tail included, so a
//! segment whose only learned token sits in an overwritten slot ends up
//! uncovered — the source's behaviour, pinned by a test so nobody "fixes" it.
//! With a reserved tail of padding, the merged row covers every segment.
//!
//! # Out-of-range entries and padding
//!
//! Any negative entry is padding: it marks nothing and passes through. A
//! learned `x >= L` is neither refused nor removed: it marks segment
//! `min(floor(x·S_eff / L), S - 1)`, which lies outside the partition when
//! `S_eff < S`, and passes through.
//!
//! # Exactness and speed
//!
//! The hot loop maps every entry to its segment. An integer division per
//! entry is slow, so the scan computes `floor(x · (S_eff/L) + 2⁻⁴⁰)` in f64
//! instead. That is exact for `0 <= x < 2³¹`, `1 <= S_eff <= 64`,
//! `S_eff <= L < 2³¹`: the computed product is within `64 · 2⁻⁵² = 2⁻⁴⁶` of
//! `x·S_eff/L`; when that is an integer `n`, adding `2⁻⁴⁰` lifts the result
//! above `n`, and when it is not, it is at least `1/L > 2⁻³¹` below the next
//! integer, far more than `2⁻⁴⁰ + 2⁻⁴⁶`. Since `S_eff <= L`, the product is
//! at most `x < 2³¹`, so the conversion to `i32` cannot overflow. Segment
//! counts above 64 (accepted by [`topology_witness_indices`] only) take an
//! exact integer path. The occupancy of a row is a 64-bit mask, as in the
//! fused kernel upstream; the AVX2 kernel builds it eight entries at a time
//! and stops once every segment is occupied.

use std::fmt;

use crate::attention::Selector;
use crate::pool;
use crate::simd::{self, Level};

/// The most segments the merge accepts: occupancy is a 64-bit mask, as in the
/// fused kernel upstream, and both paths accept the same inputs.
pub const MAX_TOPOLOGY_SEGMENTS: usize = 64;

/// A refused call. Mirrors the source's `ValueError`s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WitnessError {
    /// The context lengths do not cover every learned row
    /// (`learned_len != topk * rows`), so some row's offsets cannot be
    /// checked against a range.
    RowsMismatch {
        /// Entries in the learned buffer.
        learned_len: usize,
        /// Slots per row.
        topk: usize,
        /// Context lengths given, one per row.
        rows: usize,
    },
    /// Zero segments, or more than [`MAX_TOPOLOGY_SEGMENTS`] at the merge.
    SegmentsOutOfRange {
        /// The segment count asked for.
        num_segments: usize,
    },
    /// The retained prefix is wider than the row.
    LearnedKeepOutOfRange {
        /// The retained prefix asked for.
        learned_keep: usize,
        /// Slots per row.
        topk: usize,
    },
}

impl fmt::Display for WitnessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            WitnessError::RowsMismatch {
                learned_len,
                topk,
                rows,
            } => write!(
                f,
                "learned has {learned_len} entries, but topk={topk} x {rows} context_lens rows \
                 needs {}",
                (topk as u128) * (rows as u128)
            ),
            WitnessError::SegmentsOutOfRange { num_segments } => write!(
                f,
                "num_segments={num_segments} is out of range: it must be between 1 and \
                 {MAX_TOPOLOGY_SEGMENTS}"
            ),
            WitnessError::LearnedKeepOutOfRange { learned_keep, topk } => write!(
                f,
                "learned_keep={learned_keep} is wider than the row (topk={topk})"
            ),
        }
    }
}

impl std::error::Error for WitnessError {}

/// `2⁻⁴⁰`: lifts an exact-integer quotient that rounding put just below
/// itself back above it (see the module docs for why this is exact).
const LIFT: f64 = 1.0 / (1u64 << 40) as f64;

/// The segment map σ itself: `floor(token·S_eff / L)` with `L` read as
/// `max(context_len, 1)` and `S_eff = min(S, L)`, exact for every `usize`
/// (the product is taken in 128 bits).
///
/// A length of 0 reads as 1 (the source's `clamp_min(1)`), so this never
/// divides by zero. It does not clamp: an out-of-range token maps past the
/// partition (`segment_of(20, 4, 8) == 20`), exactly as the original's
/// `segment_of`; only the merge's occupancy pass clamps to `S - 1` (see the
/// module docs). With `num_segments = 0` every token is in segment 0.
pub fn segment_of(token: usize, context_len: usize, num_segments: usize) -> usize {
    let len = context_len.max(1) as u128;
    let s_eff = (num_segments as u128).min(len);
    // `s_eff <= len`, so the quotient is at most `token`: it fits a usize.
    ((token as u128) * s_eff / len) as usize
}

/// One row's geometry: its length, effective segment count and the
/// constants of the segment map.
#[derive(Debug, Clone, Copy)]
struct Row {
    len: u64,
    s_eff: u64,
    /// `S - 1`: where an out-of-range entry is clamped to.
    s_last: u64,
}

impl Row {
    /// `None` for a row of length `<= 0`: such a row gets no witnesses.
    fn new(context_len: i32, num_segments: usize) -> Option<Row> {
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
    fn edge(&self, s: u64) -> i32 {
        (s * self.len).div_ceil(self.s_eff) as i32
    }

    /// The segment of a non-negative entry, in exact integer arithmetic.
    fn segment_exact(&self, x: i32) -> u64 {
        ((x as u64) * self.s_eff / self.len).min(self.s_last)
    }

    /// `S_eff / L` for the f64 segment map; only used with `S <= 64`.
    fn ratio(&self) -> f64 {
        self.s_eff as f64 / self.len as f64
    }

    /// Bits `0..S_eff`: the segments that exist.
    fn partition_mask(&self) -> u64 {
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
fn occupancy(row: &[i32], g: &Row, level: Level) -> u64 {
    let full = g.partition_mask();
    #[cfg(target_arch = "x86_64")]
    {
        if level == Level::Avx2 {
            // SAFETY: `Level::Avx2` is only ever produced by `simd::level()`
            // after run-time detection found AVX2 and FMA on this CPU.
            return unsafe {
                scan::occupancy_avx2::<false>(row, &mut [], g.ratio(), g.s_last as i32, full)
            };
        }
    }
    let _ = level;
    scan::occupancy_scalar(row, g.ratio(), g.s_last as i32, full)
}

/// [`occupancy`] of `src` while copying it into `dst` (same length): one
/// pass over the learned row for the merge's copy and its scan.
fn copy_occupancy(src: &[i32], dst: &mut [i32], g: &Row, level: Level) -> u64 {
    let full = g.partition_mask();
    #[cfg(target_arch = "x86_64")]
    {
        if level == Level::Avx2 {
            // SAFETY: as in `occupancy`; `dst.len() == src.len()` (callers
            // pass two rows of one `topk`).
            return unsafe {
                scan::occupancy_avx2::<true>(src, dst, g.ratio(), g.s_last as i32, full)
            };
        }
    }
    let _ = level;
    dst.copy_from_slice(src);
    scan::occupancy_scalar(src, g.ratio(), g.s_last as i32, full)
}

/// The f64 segment map on one non-negative entry; exact (module docs).
#[inline(always)]
fn segment_fast(x: i32, ratio: f64, s_last: i32) -> i32 {
    ((x as f64 * ratio + LIFT) as i32).min(s_last)
}

mod scan {
    use super::segment_fast;

    /// How many entries are scanned between checks for a full mask.
    pub(super) const CHUNK: usize = 128;

    pub(super) fn occupancy_scalar(row: &[i32], ratio: f64, s_last: i32, full: u64) -> u64 {
        let mut mask = 0u64;
        for chunk in row.chunks(CHUNK) {
            for &x in chunk {
                if x >= 0 {
                    mask |= 1u64 << segment_fast(x, ratio, s_last);
                }
            }
            if mask & full == full {
                break;
            }
        }
        mask
    }

    /// Eight entries per step: convert to f64, scale and lift with one FMA
    /// (a single rounding: the error bound of the module docs only shrinks),
    /// truncate (exact for the non-negative values that count), clamp to
    /// `S - 1`, then turn padding into segment -1 by the sign of the entry.
    /// One bit per entry is set in two 32-bit halves of the mask:
    /// `vpsllvd` yields 0 for any count outside `0..32`, so the low half
    /// takes segments 0–31 from `1 << seg`, the high half segments 32–63
    /// from `1 << (seg - 32)`, and padding (-1) sets nothing in either.
    ///
    /// The shifts are inline assembly on purpose: the `_mm256_sllv_epi32`
    /// intrinsic is lowered through a generic shift plus an explicit
    /// out-of-range select, which costs four extra instructions per eight
    /// entries for a behaviour the instruction already has.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn occupancy_avx2<const COPY: bool>(
        row: &[i32],
        dst: &mut [i32],
        ratio: f64,
        s_last: i32,
        full: u64,
    ) -> u64 {
        use std::arch::asm;
        use std::arch::x86_64::*;

        let vratio = _mm256_set1_pd(ratio);
        let vlift = _mm256_set1_pd(super::LIFT);
        let vlast = _mm256_set1_epi32(s_last);
        let one = _mm256_set1_epi32(1);
        let thirty_two = _mm256_set1_epi32(32);
        let minus_one = _mm256_set1_epi32(-1);
        let mut lo = _mm256_setzero_si256();
        let mut hi = _mm256_setzero_si256();

        // `1 << count` per 32-bit lane, 0 for a count outside 0..32. A
        // macro, not a function, so the asm sits in this AVX2 function.
        macro_rules! shift_left {
            ($one:expr, $count:expr) => {{
                let out: __m256i;
                // SAFETY: a register-only AVX2 instruction (this function
                // requires AVX2); no memory, stack or flags touched.
                unsafe {
                    asm!(
                        "vpsllvd {out}, {one}, {count}",
                        out = lateout(ymm_reg) out,
                        one = in(ymm_reg) $one,
                        count = in(ymm_reg) $count,
                        options(pure, nomem, nostack, preserves_flags),
                    );
                }
                out
            }};
        }

        #[inline(always)]
        fn fold(v: __m256i) -> u32 {
            // SAFETY: only called from this AVX2 function, inlined into it.
            unsafe {
                let x = _mm_or_si128(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
                let x = _mm_or_si128(x, _mm_shuffle_epi32::<0b01_00_11_10>(x));
                let x = _mm_or_si128(x, _mm_shuffle_epi32::<0b10_11_00_01>(x));
                _mm_cvtsi128_si32(x) as u32
            }
        }
        let reduce = |lo: __m256i, hi: __m256i| (fold(lo) as u64) | ((fold(hi) as u64) << 32);

        // With COPY, `dst` receives `row` as it is scanned (apply's fused
        // copy): the stores ride along with loads the scan makes anyway.
        debug_assert!(!COPY || dst.len() == row.len());
        let mut done = 0;
        let mut chunks = row.chunks_exact(super::scan::CHUNK);
        for chunk in chunks.by_ref() {
            for (j, v8) in chunk.chunks_exact(8).enumerate() {
                // SAFETY: `v8` is 8 in-bounds i32s; the load is unaligned.
                let v = unsafe { _mm256_loadu_si256(v8.as_ptr() as *const __m256i) };
                if COPY {
                    // SAFETY: `dst` has `row`'s length, so these 8 slots
                    // (at the same offset as `v8`) are in bounds.
                    unsafe {
                        _mm256_storeu_si256(dst.as_mut_ptr().add(done + 8 * j) as *mut __m256i, v)
                    };
                }
                let a = _mm256_cvtepi32_pd(_mm256_castsi256_si128(v));
                let b = _mm256_cvtepi32_pd(_mm256_extracti128_si256::<1>(v));
                let sa = _mm256_cvttpd_epi32(_mm256_fmadd_pd(a, vratio, vlift));
                let sb = _mm256_cvttpd_epi32(_mm256_fmadd_pd(b, vratio, vlift));
                let seg = _mm256_min_epi32(_mm256_set_m128i(sb, sa), vlast);
                // Padding (sign bit set) becomes segment -1.
                let seg = _mm256_castps_si256(_mm256_blendv_ps(
                    _mm256_castsi256_ps(seg),
                    _mm256_castsi256_ps(minus_one),
                    _mm256_castsi256_ps(v),
                ));
                lo = _mm256_or_si256(lo, shift_left!(one, seg));
                hi = _mm256_or_si256(hi, shift_left!(one, _mm256_sub_epi32(seg, thirty_two)));
            }
            done += chunk.len();
            if reduce(lo, hi) & full == full {
                if COPY {
                    dst[done..].copy_from_slice(&row[done..]);
                }
                return reduce(lo, hi);
            }
        }
        let mut mask = reduce(lo, hi);
        if COPY {
            dst[done..].copy_from_slice(&row[done..]);
        }
        for &x in chunks.remainder() {
            if x >= 0 {
                mask |= 1u64 << segment_fast(x, ratio, s_last);
            }
        }
        mask
    }
}

fn check_rows(learned_len: usize, topk: usize, rows: usize) -> Result<(), WitnessError> {
    if topk.checked_mul(rows) != Some(learned_len) {
        return Err(WitnessError::RowsMismatch {
            learned_len,
            topk,
            rows,
        });
    }
    Ok(())
}

/// Writes row `row`'s witnesses into `out` (`num_segments` slots, slot `s`
/// holding `e_s` for a missing segment `s < S_eff` and `-1` otherwise).
fn witness_row(row: &[i32], context_len: i32, num_segments: usize, out: &mut [i32], level: Level) {
    out.fill(-1);
    let Some(g) = Row::new(context_len, num_segments) else {
        return;
    };
    if num_segments <= MAX_TOPOLOGY_SEGMENTS {
        let mut missing = !occupancy(row, &g, level) & g.partition_mask();
        while missing != 0 {
            let s = missing.trailing_zeros() as u64;
            out[s as usize] = g.edge(s);
            missing &= missing - 1;
        }
    } else {
        let mut occupied = vec![false; g.s_eff as usize];
        for &x in row {
            if x >= 0 {
                if let Some(o) = occupied.get_mut(g.segment_exact(x) as usize) {
                    *o = true;
                }
            }
        }
        for (s, o) in occupied.iter().enumerate() {
            if !o {
                out[s] = g.edge(s as u64);
            }
        }
    }
}

/// The witnesses of every learned row: row-major `[rows, num_segments]`,
/// slot `s` holding the left edge `e_s` of segment `s` when the row does not
/// occupy it, `-1` when it does or when `s >= S_eff`. A row of length `<= 0`
/// gets none.
///
/// Accepts any positive segment count (above 64 it takes an exact integer
/// path); refuses 0 and a `learned` that is not `topk × context_lens.len()`.
pub fn topology_witness_indices(
    learned: &[i32],
    topk: usize,
    context_lens: &[i32],
    num_segments: usize,
) -> Result<Vec<i32>, WitnessError> {
    // The original's order of refusals: rows, then the segment count.
    check_rows(learned.len(), topk, context_lens.len())?;
    if num_segments == 0 {
        return Err(WitnessError::SegmentsOutOfRange { num_segments });
    }
    let len = context_lens
        .len()
        .checked_mul(num_segments)
        .ok_or(WitnessError::SegmentsOutOfRange { num_segments })?;
    let mut out = vec![-1; len];
    topology_witness_indices_into(learned, topk, context_lens, num_segments, &mut out)?;
    Ok(out)
}

/// [`topology_witness_indices`] into a caller's `[rows, num_segments]`
/// buffer (a serving loop reuses it). `out.len()` must be
/// `rows * num_segments` (else `RowsMismatch` naming `out`'s length).
pub fn topology_witness_indices_into(
    learned: &[i32],
    topk: usize,
    context_lens: &[i32],
    num_segments: usize,
    out: &mut [i32],
) -> Result<(), WitnessError> {
    // The original's order of refusals: rows, then the segment count.
    let rows = context_lens.len();
    check_rows(learned.len(), topk, rows)?;
    if num_segments == 0 {
        return Err(WitnessError::SegmentsOutOfRange { num_segments });
    }
    check_rows(out.len(), num_segments, rows)?;
    let level = simd::level();
    pool::for_each_row_mut(out, num_segments, pool::min_rows(topk), |r, out_row| {
        let row = &learned[r * topk..(r + 1) * topk];
        witness_row(row, context_lens[r], num_segments, out_row, level);
    });
    Ok(())
}

/// Merges witnesses into one row in place: occupancy from the whole row,
/// witnesses in ascending segment order into slots `keep..keep + budget`.
/// Requires `1 <= num_segments <= 64` and `keep + budget <= row.len()`.
fn merge_row(
    row: &mut [i32],
    context_len: i32,
    num_segments: usize,
    keep: usize,
    budget: usize,
    level: Level,
) {
    let Some(g) = Row::new(context_len, num_segments) else {
        return;
    };
    let missing = !occupancy(row, &g, level) & g.partition_mask();
    write_witnesses(&mut row[keep..keep + budget], missing, &g);
}

/// [`merge_row`] from `src` into `dst` (the learned row and its output
/// slot): the copy and the occupancy scan are one pass.
#[allow(clippy::too_many_arguments)]
fn merge_row_from(
    src: &[i32],
    dst: &mut [i32],
    context_len: i32,
    num_segments: usize,
    keep: usize,
    budget: usize,
    level: Level,
) {
    let Some(g) = Row::new(context_len, num_segments) else {
        dst.copy_from_slice(src);
        return;
    };
    let missing = !copy_occupancy(src, dst, &g, level) & g.partition_mask();
    write_witnesses(&mut dst[keep..keep + budget], missing, &g);
}

/// Writes the edges of the `missing` segments, ascending, into `slots`
/// until either runs out; slots past the last witness are left as they are.
fn write_witnesses(slots: &mut [i32], mut missing: u64, g: &Row) {
    for slot in slots {
        if missing == 0 {
            break;
        }
        let s = missing.trailing_zeros() as u64;
        *slot = g.edge(s);
        missing &= missing - 1;
    }
}

/// Checks a merge's arguments; returns the replacement budget `B`.
fn check_merge(
    learned_len: usize,
    topk: usize,
    rows: usize,
    learned_keep: usize,
    num_segments: usize,
    max_replacements: usize,
) -> Result<usize, WitnessError> {
    check_rows(learned_len, topk, rows)?;
    if num_segments == 0 || num_segments > MAX_TOPOLOGY_SEGMENTS {
        return Err(WitnessError::SegmentsOutOfRange { num_segments });
    }
    if learned_keep > topk {
        return Err(WitnessError::LearnedKeepOutOfRange { learned_keep, topk });
    }
    Ok(max_replacements.min(topk - learned_keep))
}

/// The learned rows with witnesses merged in: slots `[0, learned_keep)` kept
/// bit for bit, witnesses in ascending segment order written to slots
/// `learned_keep, learned_keep + 1, …` up to
/// `B = min(max_replacements, topk - learned_keep)`, the rest dropped.
///
/// Refuses 0 or more than 64 segments, `learned_keep > topk`, and a `learned`
/// that is not `topk × context_lens.len()`. `B = 0` or zero rows returns the
/// learned rows unchanged.
pub fn apply_topology_witnesses(
    learned: &[i32],
    topk: usize,
    context_lens: &[i32],
    learned_keep: usize,
    num_segments: usize,
    max_replacements: usize,
) -> Result<Vec<i32>, WitnessError> {
    check_merge(
        learned.len(),
        topk,
        context_lens.len(),
        learned_keep,
        num_segments,
        max_replacements,
    )?;
    let mut out = vec![0; learned.len()];
    apply_topology_witnesses_into(
        learned,
        topk,
        context_lens,
        learned_keep,
        num_segments,
        max_replacements,
        &mut out,
    )?;
    Ok(out)
}

/// [`apply_topology_witnesses`] into a caller's buffer of `learned.len()`
/// entries (a serving loop reuses it). Every check runs before `out` is
/// written, so a refused call leaves it untouched.
pub fn apply_topology_witnesses_into(
    learned: &[i32],
    topk: usize,
    context_lens: &[i32],
    learned_keep: usize,
    num_segments: usize,
    max_replacements: usize,
    out: &mut [i32],
) -> Result<(), WitnessError> {
    let budget = check_merge(
        learned.len(),
        topk,
        context_lens.len(),
        learned_keep,
        num_segments,
        max_replacements,
    )?;
    check_rows(out.len(), topk, context_lens.len())?;
    if budget == 0 {
        out.copy_from_slice(learned);
        return Ok(());
    }
    let level = simd::level();
    pool::for_each_row_mut(out, topk, pool::min_rows(2 * topk), |r, out_row| {
        let src = &learned[r * topk..(r + 1) * topk];
        let (len, keep) = (context_lens[r], learned_keep);
        merge_row_from(src, out_row, len, num_segments, keep, budget, level);
    });
    Ok(())
}

/// The serving entry point: merges witnesses into `topk_indices` in place,
/// with `keep = topk - S` (saturating) and `max_replacements = S`.
///
/// Reads each row's occupancy and writes only its witnesses into that row's
/// reserved tail; nothing else is written, and no copy of the buffer is made.
/// `num_segments = 0` is the off switch: it returns `Ok` before any other
/// check. Otherwise every check runs before anything is written, so a
/// refused call leaves the buffer untouched.
pub fn scatter_topology_witnesses(
    topk_indices: &mut [i32],
    topk: usize,
    context_lens: &[i32],
    num_segments: usize,
) -> Result<(), WitnessError> {
    if num_segments == 0 {
        return Ok(());
    }
    let keep = topk.saturating_sub(num_segments);
    let budget = check_merge(
        topk_indices.len(),
        topk,
        context_lens.len(),
        keep,
        num_segments,
        num_segments,
    )?;
    if budget == 0 {
        return Ok(());
    }
    let level = simd::level();
    pool::for_each_row_mut(topk_indices, topk, pool::min_rows(topk), |r, row| {
        merge_row(row, context_lens[r], num_segments, keep, budget, level);
    });
    Ok(())
}

/// The random null: `min(budget, L)` tokens drawn uniformly without
/// replacement from `[0, L)`, ascending; row `L - 1` of
/// [`Selector::Random`]. Empty for `L = 0`.
pub fn random_null(context_len: usize, budget: usize, seed: u64) -> Vec<i32> {
    match context_len.checked_sub(1) {
        Some(last) => Selector::Random { budget, seed }.row(last),
        None => Vec::new(),
    }
}

/// The locality null: the `min(budget, L)` most recent tokens,
/// `[L - k, L)`; row `L - 1` of [`Selector::Local`]. Empty for `L = 0`.
pub fn locality_null(context_len: usize, budget: usize) -> Vec<i32> {
    match context_len.checked_sub(1) {
        Some(last) => Selector::Local { window: budget }.row(last),
        None => Vec::new(),
    }
}

/// The share of the `S_eff` segments of `[0, L)` that `candidates` meets:
/// `|{σ(x) : x ∈ C ∩ [0, L)}| / S_eff`. Padding, duplicates and out-of-range
/// entries count for nothing. 1 when there are no segments (`L = 0` or
/// `num_segments = 0`).
pub fn segment_coverage(candidates: &[i32], context_len: usize, num_segments: usize) -> f64 {
    let s_eff = num_segments.min(context_len);
    if s_eff == 0 {
        return 1.0;
    }
    let segments = candidates
        .iter()
        .filter(|&&x| x >= 0 && (x as usize) < context_len)
        .map(|&x| segment_of(x as usize, context_len, num_segments));
    // Memory follows the candidates, never the segment count alone (which
    // may be huge): a flag per segment when there are few segments for the
    // candidates, else sort and count the distinct ones.
    let hit = if s_eff <= 64 + 8 * candidates.len() {
        let mut seen = vec![false; s_eff];
        segments
            .filter(|&s| !std::mem::replace(&mut seen[s], true))
            .count()
    } else {
        let mut hit: Vec<usize> = segments.collect();
        hit.sort_unstable();
        hit.dedup();
        hit.len()
    };
    hit as f64 / s_eff as f64
}

/// The share of a dense attention row's mass that `candidates` keeps:
/// `Σ_{x ∈ C ∩ [0, L)} a_x / Σ_{x < L} a_x`, with `L = attention_row.len()`.
/// Padding, duplicates and out-of-range entries count for nothing. The
/// quotient is taken as it is, as in the original: NaN for a row with no
/// mass and nothing kept (0/0), `±inf` when something is kept from a row
/// whose weights sum to 0 (`[0]` against `[1.0, -1.0]` is `+inf`).
pub fn attention_mass_recall(candidates: &[i32], attention_row: &[f64]) -> f64 {
    let len = attention_row.len();
    let mut seen = vec![false; len];
    let mut kept = 0.0;
    for &x in candidates {
        if x >= 0 && (x as usize) < len && !seen[x as usize] {
            seen[x as usize] = true;
            kept += attention_row[x as usize];
        }
    }
    kept / attention_row.iter().sum::<f64>()
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
            let want = scan::occupancy_scalar(&row, g.ratio(), g.s_last as i32, full);
            let exact = row
                .iter()
                .filter(|&&x| x >= 0)
                .fold(0u64, |m, &x| m | 1 << g.segment_exact(x));
            assert_eq!(want & full, exact & full);
            #[cfg(target_arch = "x86_64")]
            if simd::level() == Level::Avx2 {
                let got = unsafe {
                    scan::occupancy_avx2::<false>(&row, &mut [], g.ratio(), g.s_last as i32, full)
                };
                assert_eq!(got & full, want & full, "row={row:?} L={len} S={s}");
                let mut copy = vec![0; row.len()];
                let got = unsafe {
                    scan::occupancy_avx2::<true>(&row, &mut copy, g.ratio(), g.s_last as i32, full)
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
