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
//!
//! # Layout
//!
//! This file: the rule, the refusals, σ. `merge.rs` (witnesses of a row and
//! their merge: copied, or in place), `measure.rs` (the null models and the
//! two metrics of one row), `scan/` (the occupancy scan: the segment map
//! and dispatch in `mod.rs`, `portable.rs`, `avx2.rs`), `check.rs` (the
//! rule applied to an engine's in-place output, and its reasons; public as
//! `kvselect::check::check_witness_rows`) and `tests_check.rs`.

use std::fmt;

pub(crate) mod check;
mod measure;
mod merge;
mod scan;
#[cfg(test)]
mod tests_check;

/// Runs the witness merge's kernel family at `isa` (the reach test's
/// probe).
#[cfg(test)]
pub(crate) fn dispatch_probe(isa: crate::simd::Isa) {
    merge::probe(isa)
}

pub use measure::{attention_mass_recall, locality_null, random_null, segment_coverage};
pub use merge::{
    apply_topology_witnesses, apply_topology_witnesses_into, scatter_topology_witnesses,
    topology_witness_indices, topology_witness_indices_into,
};

/// The most segments the merge accepts: occupancy is a 64-bit mask, as in the
/// fused kernel upstream, and both paths accept the same inputs.
pub const MAX_TOPOLOGY_SEGMENTS: usize = 64;

/// A refused call. Mirrors the source's `ValueError`s. Serialises as its
/// fields with the variant's name under `variant`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "variant")]
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
    /// A caller's output buffer (the Rust `_into` forms) is not `rows ×
    /// width` entries (`width` is `num_segments` for the witnesses, `topk`
    /// for the merge).
    OutMismatch {
        /// Entries in the output buffer.
        out_len: usize,
        /// Context lengths given, one per row.
        rows: usize,
        /// Slots per output row.
        width: usize,
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
            WitnessError::OutMismatch {
                out_len,
                rows,
                width,
            } => write!(
                f,
                "out has {out_len} entries, but {rows} context_lens rows x {width} slots needs {}",
                (rows as u128) * (width as u128)
            ),
            WitnessError::LearnedKeepOutOfRange { learned_keep, topk } => write!(
                f,
                "learned_keep={learned_keep} is wider than the row (topk={topk})"
            ),
        }
    }
}

impl WitnessError {
    /// The argument the error is about.
    pub fn argument(&self) -> &'static str {
        match self {
            WitnessError::RowsMismatch { .. } => "context_lens",
            WitnessError::SegmentsOutOfRange { .. } => "num_segments",
            WitnessError::OutMismatch { .. } => "out",
            WitnessError::LearnedKeepOutOfRange { .. } => "learned_keep",
        }
    }
}

impl std::error::Error for WitnessError {}

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
