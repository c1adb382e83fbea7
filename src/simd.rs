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
}

impl Level {
    /// The level's name, as `kvselect.simd_level()` reports it.
    pub fn name(self) -> &'static str {
        match self {
            Level::Scalar => "scalar",
            Level::Avx2 => "avx2",
        }
    }
}

/// Proof that this CPU executes AVX2 and FMA instructions.
///
/// Zero-sized and `Copy`; its field is private, so the only way to get one
/// is [`avx2`] (run-time CPU feature detection). Every AVX2 kernel takes
/// one, which is what makes calling it sound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Avx2(());

/// The token if this CPU has AVX2 and FMA, whatever `KVSELECT_SIMD` says
/// (detected once per process).
fn cpu_avx2() -> Option<Avx2> {
    static CPU: OnceLock<Option<Avx2>> = OnceLock::new();
    *CPU.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return Some(Avx2(()));
            }
        }
        None
    })
}

/// The token the dispatched kernels run with: `Some` iff this CPU has AVX2
/// and FMA and `KVSELECT_SIMD=scalar` does not force the portable path
/// (read once per process).
pub fn avx2() -> Option<Avx2> {
    static CHOSEN: OnceLock<Option<Avx2>> = OnceLock::new();
    *CHOSEN.get_or_init(|| {
        if std::env::var("KVSELECT_SIMD").is_ok_and(|v| v.eq_ignore_ascii_case("scalar")) {
            None
        } else {
            cpu_avx2()
        }
    })
}

/// The best level this CPU supports (read once per process).
pub fn level() -> Level {
    match avx2() {
        Some(_) => Level::Avx2,
        None => Level::Scalar,
    }
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
