//! Which instruction set the hot loops run with, chosen at run time.
//!
//! The wheel is built for baseline x86-64 (never `target-cpu=native`), so it
//! runs on any x86-64 CPU; kernels that profit from AVX2 are compiled a second
//! time with `#[target_feature(enable = "avx2")]` and picked here by CPU
//! feature detection. Setting `KVSELECT_SIMD=scalar` in the environment forces
//! the portable path (for testing and for measuring what the SIMD buys).
//! Every dispatched kernel computes bit-identical results on every level.

use std::sync::OnceLock;

/// An instruction-set level a kernel can be dispatched to.
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

fn detect() -> Level {
    if std::env::var("KVSELECT_SIMD").is_ok_and(|v| v.eq_ignore_ascii_case("scalar")) {
        return Level::Scalar;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            return Level::Avx2;
        }
    }
    Level::Scalar
}

/// The best level this CPU supports (read once per process).
pub fn level() -> Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(detect)
}
