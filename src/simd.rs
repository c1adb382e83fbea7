//! Which instruction set the hot loops run with, chosen at run time.
//!
//! The wheel is built for baseline x86-64 (never `target-cpu=native`), so it
//! runs on any x86-64 CPU; kernels that profit from AVX2 are compiled a second
//! time with `#[target_feature(enable = "avx2,fma")]` and picked here by CPU
//! feature detection. Setting `KVSELECT_SIMD=scalar` in the environment forces
//! the portable path (for testing and for measuring what the SIMD buys).
//! Every dispatched kernel computes bit-identical results on every level.
//!
//! # Soundness: AVX2 is a value only detection can make
//!
//! Running an AVX2 instruction on a CPU without it is undefined behaviour,
//! so "AVX2 is available" is not a flag that any code could set: it is an
//! [`Avx2`] token, a zero-sized value whose only constructor is the run-time
//! detection below. Every AVX2 kernel entry takes the token, so a kernel
//! cannot be reached on a CPU that lacks the instructions, and each `unsafe`
//! call into one points at the token it was handed. [`Level`] is only the
//! report of what was chosen (`kvselect.simd_level()` prints its name).

use std::sync::OnceLock;

/// An instruction-set level a kernel can be dispatched to: the report of
/// what [`level`] chose. (Dispatch itself goes by the [`Avx2`] token.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Portable Rust, auto-vectorised for the build target at most.
    Scalar,
    /// x86-64 with AVX2 (and FMA, which every AVX2 CPU shipped has).
    Avx2,
    /// x86-64 with AVX-512 (F, BW, DQ, VL) besides AVX2: block selection's
    /// kernels run two keys per 512-bit register, the indexer's and the
    /// attention pass's sixteen (one per lane); the other kernels AVX2.
    Avx512,
}

impl Level {
    /// The level's name, as `kvselect.simd_level()` reports it.
    pub fn name(self) -> &'static str {
        match self {
            Level::Scalar => "scalar",
            Level::Avx2 => "avx2",
            Level::Avx512 => "avx512",
        }
    }
}

/// Proof that this CPU executes AVX2, FMA and F16C instructions (every
/// AVX2 CPU shipped has all three; F16C decodes float16 keys in the
/// kernels).
///
/// Zero-sized and `Copy`; its field is private, so the only way to get one
/// is [`avx2`] (run-time CPU feature detection). Every AVX2 kernel takes
/// one, which is what makes calling it sound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Avx2(());

/// The token if this CPU has AVX2, FMA and F16C, whatever `KVSELECT_SIMD` says
/// (detected once per process).
fn cpu_avx2() -> Option<Avx2> {
    static CPU: OnceLock<Option<Avx2>> = OnceLock::new();
    *CPU.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("f16c")
            {
                return Some(Avx2(()));
            }
        }
        None
    })
}

/// `KVSELECT_SIMD`, read once per process: `scalar` forces the portable
/// kernels, `avx2` caps them at AVX2 (for testing and for measuring what
/// each level buys).
fn requested() -> Option<Level> {
    static REQUESTED: OnceLock<Option<Level>> = OnceLock::new();
    *REQUESTED.get_or_init(|| {
        let v = std::env::var("KVSELECT_SIMD").ok()?;
        [Level::Scalar, Level::Avx2, Level::Avx512]
            .into_iter()
            .find(|l| v.eq_ignore_ascii_case(l.name()))
    })
}

/// The token the dispatched kernels run with: `Some` iff this CPU has AVX2,
/// FMA and F16C and `KVSELECT_SIMD=scalar` does not force the portable path.
pub fn avx2() -> Option<Avx2> {
    match requested() {
        Some(Level::Scalar) => None,
        _ => cpu_avx2(),
    }
}

/// Proof that this CPU executes AVX-512 F, BW, DQ and VL besides
/// everything [`Avx2`] proves. Only [`avx512`] makes one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Avx512(Avx2);

impl Avx512 {
    /// The AVX2 token this one implies.
    pub fn avx2(self) -> Avx2 {
        self.0
    }
}

fn cpu_avx512() -> Option<Avx512> {
    static CPU: OnceLock<Option<Avx512>> = OnceLock::new();
    *CPU.get_or_init(|| {
        let avx2 = cpu_avx2()?;
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx512f") && has!("avx512bw") && has!("avx512dq") && has!("avx512vl") {
                return Some(Avx512(avx2));
            }
        }
        let _ = avx2;
        None
    })
}

/// The AVX-512 token the block kernel runs with: `Some` iff this CPU has it
/// and `KVSELECT_SIMD` asks for neither `scalar` nor `avx2`.
pub fn avx512() -> Option<Avx512> {
    match requested() {
        Some(Level::Scalar | Level::Avx2) => None,
        _ => cpu_avx512(),
    }
}

/// The best level dispatched to (`kvselect.simd_level()`).
pub fn level() -> Level {
    match (avx512(), avx2()) {
        (Some(_), _) => Level::Avx512,
        (None, Some(_)) => Level::Avx2,
        (None, None) => Level::Scalar,
    }
}

/// What a kernel with an AVX2 and an AVX-512 version may run: the best
/// token dispatch allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wide {
    Avx2(Avx2),
    Avx512(Avx512),
}

impl Wide {
    /// The AVX2 token either level implies.
    pub fn avx2(self) -> Avx2 {
        match self {
            Wide::Avx2(t) => t,
            Wide::Avx512(t) => t.avx2(),
        }
    }

    /// The best token dispatch allows, if any.
    pub fn best() -> Option<Wide> {
        match (avx512(), avx2()) {
            (Some(t), _) => Some(Wide::Avx512(t)),
            (None, Some(t)) => Some(Wide::Avx2(t)),
            (None, None) => None,
        }
    }
}

/// [`avx2_for_test`]'s AVX-512 twin (skipped visibly, never failed: CI
/// machines are only guaranteed AVX2).
#[cfg(test)]
pub(crate) fn avx512_for_test() -> Option<Avx512> {
    let token = cpu_avx512();
    if token.is_none() {
        eprintln!("skipped: this CPU has no AVX-512");
    }
    token
}

/// For the unit tests that compare an AVX2 kernel against its portable
/// twin: the token if this CPU has AVX2 and FMA (ignoring `KVSELECT_SIMD`,
/// which is about dispatch, not about what a test may call). Without it the
/// test is skipped visibly -- `skipped: this CPU has no AVX2` on stderr --
/// and with `KVSELECT_REQUIRE_AVX2=1` (set in CI, whose machines have AVX2)
/// it fails instead, so the comparison cannot silently stop running.
#[cfg(test)]
pub(crate) fn avx2_for_test() -> Option<Avx2> {
    let token = cpu_avx2();
    if token.is_none() {
        eprintln!("skipped: this CPU has no AVX2");
        assert!(
            std::env::var_os("KVSELECT_REQUIRE_AVX2").is_none_or(|v| v != "1"),
            "KVSELECT_REQUIRE_AVX2=1, but this CPU has no AVX2: the AVX2 kernel cannot be \
             compared against the portable one"
        );
    }
    token
}

/// SIMD building blocks shared by the kernels of several modules.
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use std::arch::x86_64::*;

    /// Sums the 8 lanes of `a, b, c, d` in the canonical order
    /// `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`; lanes come out as
    /// `[a, c, b, d]` (rows 0, 2, 1, 3).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn reduce4(a: __m256, b: __m256, c: __m256, d: __m256) -> __m128 {
        // [a_j + a_{j+4} | b_j + b_{j+4}], j = 0..4
        let x = _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(a, b),
            _mm256_permute2f128_ps::<0x31>(a, b),
        );
        let y = _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(c, d),
            _mm256_permute2f128_ps::<0x31>(c, d),
        );
        // [x0+x2, x1+x3, y0+y2, y1+y3 | x4+x6, x5+x7, y4+y6, y5+y7]
        let z = _mm256_add_ps(
            _mm256_shuffle_ps::<0x44>(x, y),
            _mm256_shuffle_ps::<0xEE>(x, y),
        );
        _mm_hadd_ps(_mm256_castps256_ps128(z), _mm256_extractf128_ps::<1>(z))
    }
}

/// The machine's floor for compute-bound kernels: a register-resident FMA
/// loop, `iters` steps of [`FLOOR_CHAINS`] independent chains at the widest
/// level dispatch allows (16 lanes with AVX-512, 8 with AVX2, 1 portable),
/// on every thread of the crate's pool at once. Returns the flops done (2
/// per lane per step) — a benchmark divides them by the time it measured —
/// and the chains' sum, which depends on every step (so no compiler can
/// drop the loop).
pub fn fma_floor(iters: usize) -> (u64, f32) {
    let threads = crate::pool::num_threads().max(1);
    let lanes = match Wide::best() {
        Some(Wide::Avx512(_)) => 16,
        Some(Wide::Avx2(_)) => 8,
        None => 1,
    };
    let mut sums = vec![0.0f32; threads];
    crate::pool::for_each_row_mut(&mut sums, 1, 1, |_, s| s[0] = floor::run(iters));
    let flops = (threads * iters * FLOOR_CHAINS * lanes * 2) as u64;
    (flops, sums.iter().sum())
}

/// Independent FMA chains in [`fma_floor`]: enough to cover the latency of
/// two FMA ports (4 cycles × 2), with room.
pub const FLOOR_CHAINS: usize = 12;

mod floor {
    use super::{Wide, FLOOR_CHAINS};
    use std::hint::black_box;

    pub(super) fn run(iters: usize) -> f32 {
        match Wide::best() {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the token proves AVX-512 F.
            Some(Wide::Avx512(_)) => unsafe { avx512(iters) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the token proves AVX2 and FMA.
            Some(Wide::Avx2(_)) => unsafe { avx2(iters) },
            _ => portable(iters),
        }
    }

    fn portable(iters: usize) -> f32 {
        let (x, y) = (black_box(0.999_999f32), black_box(1e-7f32));
        let mut a = [1.0f32; FLOOR_CHAINS];
        for _ in 0..iters {
            for v in a.iter_mut() {
                *v = v.mul_add(x, y);
            }
        }
        a.iter().sum()
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn avx2(iters: usize) -> f32 {
        use std::arch::x86_64::*;
        let (x, y) = (
            _mm256_set1_ps(black_box(0.999_999)),
            _mm256_set1_ps(black_box(1e-7)),
        );
        let mut a = [_mm256_set1_ps(1.0); FLOOR_CHAINS];
        for _ in 0..iters {
            for v in a.iter_mut() {
                *v = _mm256_fmadd_ps(*v, x, y);
            }
        }
        let s = a
            .iter()
            .fold(_mm256_setzero_ps(), |s, &v| _mm256_add_ps(s, v));
        _mm_cvtss_f32(_mm256_castps256_ps128(s))
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    fn avx512(iters: usize) -> f32 {
        use std::arch::x86_64::*;
        let (x, y) = (
            _mm512_set1_ps(black_box(0.999_999)),
            _mm512_set1_ps(black_box(1e-7)),
        );
        let mut a = [_mm512_set1_ps(1.0); FLOOR_CHAINS];
        for _ in 0..iters {
            for v in a.iter_mut() {
                *v = _mm512_fmadd_ps(*v, x, y);
            }
        }
        let s = a
            .iter()
            .fold(_mm512_setzero_ps(), |s, &v| _mm512_add_ps(s, v));
        _mm512_reduce_add_ps(s)
    }
}
