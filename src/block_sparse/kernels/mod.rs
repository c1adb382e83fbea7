//! The scoring kernels' interface -- a 4-row tile against a run of keys,
//! cut into per-block pieces -- and the dispatch to the AVX-512, AVX2 or
//! portable kernel, and to the bfloat16 pair step where the engine admits
//! it ([`run_pairs`]; all bit-identical: see the module docs of
//! [`crate::block_sparse`]).

use super::exact;
#[cfg(target_arch = "x86_64")]
use crate::keys::{prefetch, CacheLevel};
use crate::keys::{Encoded, Format};
use crate::simd::{dispatch, Isa};

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
pub(super) mod pairs;
mod portable;
#[cfg(test)]
mod tests;
#[cfg(all(test, target_arch = "x86_64"))]
mod tests_pairs;

/// The reach test's probe of this module's family (see `simd::tests`).
#[cfg(test)]
pub(super) fn probe(isa: Isa) {
    tests::probe(isa)
}

/// Rows (query heads) are padded to tiles of this many.
pub(super) const MR: usize = 4;
/// How many keys ahead the streaming kernel prefetches into L1.
#[cfg(target_arch = "x86_64")]
pub(super) const PREFETCH_KEYS: usize = 12;

/// One row tile against keys `start..end`, all within one task's blocks.
pub(super) struct Segment<'a> {
    /// 4 padded rows, `dp` apart.
    pub(super) q: &'a [f32],
    pub(super) dp: usize,
    /// `q × 2⁸` (exact), for a kernel reading fp8 keys as `2⁻⁸ ×` their
    /// values; `None` when it would overflow or the keys are not fp8. (The
    /// SIMD kernels' only, as is `stream`: x86-64 only.)
    #[cfg(target_arch = "x86_64")]
    pub(super) q_fp8_folded: Option<&'a [f32]>,
    /// Keys `base ..`, `d` elements each, in their format: key `p` is at
    /// element `(p - base) * d`.
    pub(super) keys: Encoded<'a>,
    pub(super) base: usize,
    pub(super) d: usize,
    /// Key indices (absolute, `>= base`), so that block ids are too.
    pub(super) start: usize,
    pub(super) end: usize,
    /// Keys at or past this index are checked against each row's `vis`.
    pub(super) mask_from: usize,
    pub(super) vis: [usize; MR],
    pub(super) bs: usize,
    /// First block of the task (`maxima` row 0).
    pub(super) b0: usize,
    /// What to prefetch ahead of the keys read, when they come from memory
    /// and are used once (`None`: they are reused from cache, or were
    /// decoded into a scratch).
    #[cfg(target_arch = "x86_64")]
    pub(super) stream: Option<Stream<'a>>,
}

/// Where a streaming kernel prefetches as it reads the keys `i .. i + n`
/// of its segment (`i = p - start`):
///
/// - into L1, the keys [`PREFETCH_KEYS`] further on, running on into `next`
///   past the segment's end;
/// - into L2, the keys `i .. i + n` of `lead` (a paged cache's): a page or
///   more ahead of the reading, so that each page's keys are fetched long
///   before the jump to them.
///
/// Both are bytes of keys in their format, contiguous in memory (a run of
/// a dense array, the rest of one page); past their end, nothing is
/// fetched.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(super) struct Stream<'a> {
    /// The keys that follow the segment in reading order (the rest of the
    /// array, the next page); empty when nothing follows in the task, or
    /// the segment's tile stops short of its chunk.
    pub(super) next: &'a [u8],
    /// The keys a lead further on than the segment's first in reading
    /// order (see the engine's `lead_keys`); empty for a dense array.
    pub(super) lead: &'a [u8],
}

#[cfg(target_arch = "x86_64")]
impl Stream<'_> {
    /// Prefetches for the keys `p .. p + n` of `seg` as they are read
    /// (`own`: the segment's keys as bytes, `kb` bytes a key): see
    /// [`Stream`].
    #[inline(always)]
    fn fetch_ahead(&self, seg: &Segment<'_>, own: &[u8], kb: usize, p: usize, n: usize) {
        let (a, b) = (p + PREFETCH_KEYS, p + PREFETCH_KEYS + n);
        let at = |k: usize| (k.min(seg.end) - seg.base) * kb;
        prefetch(own, at(a), at(b), CacheLevel::L1);
        let past = |k: usize| k.saturating_sub(seg.end) * kb;
        prefetch(self.next, past(a), past(b), CacheLevel::L1);
        let i = p - seg.start;
        prefetch(self.lead, i * kb, (i + n) * kb, CacheLevel::L2);
    }
}

/// Where a tile's block maxima go: `maxima[(b - b0) * stride + col + i]`;
/// with `mag_at`, the largest magnitude of the keys the kernel reads in
/// block `b` is merged into `maxima[(b - b0) * stride + mag_at]` (see
/// [`TileOut::flush_magnitude`]).
///
/// The magnitudes are taken as the keys are read, a step's keys right
/// after the step (they are in L1 then): a pass over the keys after the
/// kernel would read a decode's keys from memory a second time, as the
/// one before it did (a task's run of in-place keys, megabytes, is far
/// larger than L2; 27% of a float32 decode on Zen 3). A max over codes, so
/// it is the value [`exact::abs_max`] gives the same keys, however they
/// are split.
///
/// [`exact::abs_max`]: super::exact::abs_max
pub(super) struct TileOut<'a> {
    pub(super) maxima: &'a mut [f32],
    pub(super) stride: usize,
    pub(super) col: usize,
    pub(super) mag_at: Option<usize>,
}

impl TileOut<'_> {
    /// Merges a running max into the stored one (NaN-free, order-free).
    #[inline]
    fn flush(&mut self, block_rel: usize, m: [f32; MR]) {
        let at = block_rel * self.stride + self.col;
        if let Some(dst) = self.maxima.get_mut(at..at + MR) {
            for (o, v) in dst.iter_mut().zip(m) {
                if v > *o {
                    *o = v;
                }
            }
        }
    }

    /// Merges the magnitude code `code` of keys of block `block_rel` (in
    /// `format`: [`exact::code_max`]) into its stored magnitude, when this
    /// tile reports them.
    ///
    /// [`exact::code_max`]: super::exact::code_max
    #[inline]
    fn flush_magnitude(&mut self, block_rel: usize, format: Format, code: u32) {
        let Some(c) = self.mag_at else { return };
        if let Some(o) = self.maxima.get_mut(block_rel * self.stride + c) {
            *o = exact::merge_magnitude(*o, exact::magnitude_of(format, code));
        }
    }
}

/// Scores one segment with the AVX-512 or AVX2 kernel when handed a
/// token, else with the portable one (bit-identical block maxima on all
/// three).
pub(super) fn run_segment(isa: Isa, seg: &Segment<'_>, out: TileOut<'_>) {
    // SAFETY (bounds): the kernel asserts the bounds its pointer reads rely
    // on. (The AVX-512 step runs inside the AVX2 walk, the token it holds
    // proving its own instructions.)
    dispatch!("block_sparse.segment", isa, {
        avx512(t) => avx2::segment(t.avx2(), avx512::Step6(t), seg, out),
        avx2(t) => avx2::segment(t, avx2::Step3, seg, out),
        scalar => portable::segment(seg, out),
    })
}

/// Scores one segment with the pair step ([`pairs`]) run by `run`, on the
/// walk of `isa`'s AVX2 kernel (the portable kernel at the scalar level,
/// which has no walk to run it on): `seg`'s keys are float32 and `kp` their
/// pairs ([`pairs::pack_keys`]), `qp` the tile's rows of pairs
/// ([`pairs::PairRows::tile`]), admitted together
/// ([`pairs::PairRows::admits`]). Bit-identical block maxima to
/// [`run_segment`]'s.
#[cfg(target_arch = "x86_64")]
pub(super) fn run_pairs(
    isa: Isa,
    run: pairs::PairRun,
    seg: &Segment<'_>,
    qp: &[u32],
    kp: &[u32],
    out: TileOut<'_>,
) {
    // The pair step reads key `k` of `keys` as key `k` of `kp`, and `qp` as
    // the tile's 4 rows of `dp / 2`.
    let Encoded::F32(keys) = seg.keys else {
        panic!("block_sparse pair step called on non-float32 keys")
    };
    assert!(
        seg.d > 0
            && kp.len() == pairs::packed_len(keys.len() / seg.d, seg.d)
            && qp.len() * 2 == MR * seg.dp
            && seg.d == seg.dp
            && seg.d.is_multiple_of(pairs::GROUP),
        "block_sparse pair step called out of bounds"
    );
    let Some(token) = isa.avx2() else {
        return run_segment(isa, seg, out);
    };
    let keys_at = keys.as_ptr() as usize;
    match run {
        // SAFETY: the token proves AVX512-BF16, AVX-512 and AVX2 for the
        // walk and the step; the bounds are asserted in the walk and above.
        pairs::PairRun::Hw(t) => unsafe {
            let run = pairs::Hw(t);
            pairs::segment_hw(
                pairs::PairStep {
                    run,
                    qp,
                    keys_at,
                    kp,
                },
                seg,
                keys,
                out,
            );
        },
        // SAFETY: `token` proves AVX2, FMA and F16C for the walk; the
        // model's step runs no instruction beyond SSE.
        pairs::PairRun::Model => unsafe {
            let run = pairs::Model;
            let step = pairs::PairStep {
                run,
                qp,
                keys_at,
                kp,
            };
            avx2::segment(token, step, seg, out);
        },
    }
    #[cfg(test)]
    PAIRED.with(|n| n.set(n.get() + 1));
}

#[cfg(all(test, target_arch = "x86_64"))]
thread_local! {
    /// How many segments this thread's calls scored with the pair step
    /// (the tests' view of which path ran: both give the same bits).
    pub(super) static PAIRED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The pieces of a segment's keys, in increasing order: each lies in one
/// block and is either wholly unmasked (`< mask_from`) or wholly masked.
struct Pieces {
    p: usize,
    end: usize,
    mask_from: usize,
    bs: usize,
}

/// One piece: keys `from..to` of block `block`.
pub(super) struct Piece {
    block: usize,
    from: usize,
    to: usize,
    masked: bool,
}

impl Pieces {
    fn new(seg: &Segment<'_>) -> Self {
        Pieces {
            p: seg.start,
            end: seg.end,
            mask_from: seg.mask_from,
            bs: seg.bs,
        }
    }
}

impl Iterator for Pieces {
    type Item = Piece;

    #[inline]
    fn next(&mut self) -> Option<Piece> {
        if self.p >= self.end || self.bs == 0 {
            return None;
        }
        let block = self.p / self.bs;
        let block_end = (block + 1).saturating_mul(self.bs).min(self.end);
        let (to, masked) = if self.p < self.mask_from {
            (self.mask_from.min(block_end), false)
        } else {
            (block_end, true)
        };
        let from = self.p;
        self.p = to;
        Some(Piece {
            block,
            from,
            to,
            masked,
        })
    }
}
