//! Which instruction set the hot loops run with, chosen at run time.
//!
//! The wheel is built for baseline x86-64 (never `target-cpu=native`), so it
//! runs on any x86-64 CPU; kernels that profit from AVX2 are compiled a second
//! time with `#[target_feature(enable = "avx2,fma")]` and picked here by CPU
//! feature detection. Setting `KVSELECT_SIMD=scalar` in the environment forces
//! the portable path (for testing and for measuring what the SIMD buys).
//! Every dispatched kernel computes bit-identical results on every level.
//!
//! # Soundness: a level is a value only detection can make
//!
//! Running an AVX2 instruction on a CPU without it is undefined behaviour,
//! so "AVX2 is available" is not a flag that any code could set: it is an
//! [`Avx2`] token, a zero-sized value whose only constructor is the run-time
//! detection below ([`Avx512`] likewise, and it implies [`Avx2`]). [`Isa`]
//! is the level dispatch runs at *with* its token: `Isa::Avx2(t)` cannot be
//! made without a `t`. [`Level`] is only the name of a level (the report
//! `kvselect.simd_level()` prints, what `KVSELECT_SIMD` asks for).
//!
//! # One dispatch per kernel family
//!
//! [`Isa::best`] is the one entry point to the level (detected once,
//! capped by `KVSELECT_SIMD`). A kernel family -- the functions that compute
//! one thing at every level, bit for bit alike -- is dispatched in exactly
//! one place, by `dispatch!`: the family names its per-level functions,
//! and the macro's one `match` calls the one the [`Isa`] it is handed
//! allows, inside its one `unsafe` (whose SAFETY argument is the token:
//! the arm of a level binds that level's token). A family that has no
//! kernel at a level refuses it by name (`avx512 => avx2`: the AVX2 kernel
//! runs with the token the AVX-512 one implies). The `match` is
//! exhaustive, so a new [`Isa`] variant is a compile error in the macro
//! until every family's form of it says what that level runs.
//!
//! A level may also depend on the inputs (a format pairing, a value-range
//! condition checked per key block): the family asks [`Isa::at_most`] for
//! the best level at or below the call's that the block admits and hands
//! that to the same `dispatch!` -- a block the fast level cannot take
//! falls back to the next level down, through the same path.

use std::sync::OnceLock;

pub(crate) mod amx;
pub(crate) mod bf16dp;
pub(crate) mod lines;

/// The name of an instruction-set level: what [`Isa::best`] chose
/// ([`level`]), what `KVSELECT_SIMD` asks for. Ordered from the portable
/// level up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// Portable Rust, auto-vectorised for the build target at most.
    Scalar,
    /// x86-64 with AVX2 (and FMA, which every AVX2 CPU shipped has).
    Avx2,
    /// x86-64 with AVX-512 (F, BW, DQ, VL) besides AVX2: block selection's
    /// kernels run two keys per 512-bit register, the indexer's and the
    /// attention pass's sixteen (one per lane); the other kernels AVX2.
    Avx512,
    /// AVX-512 with AVX512-BF16 (`VDPBF16PS`): the indexer's dot products of
    /// bfloat16-exact queries and bf16 / fp8 keys, and block selection's in a
    /// prefill (more than two row tiles a key chunk), two dimensions per
    /// instruction, bit for bit the float32 kernels' (admitted per key block
    /// or per row tile and chunk; the rest and every other kernel at the
    /// AVX-512 level).
    /// Offered only when the CPU's instruction matches the software model,
    /// and the default only where it does at least 1.3 times the products
    /// per second of the FMAs it replaces (`simd/bf16dp.rs`);
    /// `KVSELECT_SIMD=avx512bf16` asks for it on any CPU whose instruction
    /// matches the model.
    Avx512Bf16,
}

impl Level {
    /// Every level, from the portable one up.
    pub const ALL: [Level; 4] = [Level::Scalar, Level::Avx2, Level::Avx512, Level::Avx512Bf16];

    /// The level's name, as `kvselect.simd_level()` reports it.
    pub fn name(self) -> &'static str {
        match self {
            Level::Scalar => "scalar",
            Level::Avx2 => "avx2",
            Level::Avx512 => "avx512",
            Level::Avx512Bf16 => "avx512bf16",
        }
    }

    /// The level `KVSELECT_SIMD` names (any case), if any.
    fn parse(v: &str) -> Option<Level> {
        Level::ALL
            .into_iter()
            .find(|l| v.eq_ignore_ascii_case(l.name()))
    }
}

/// Proof that this CPU executes AVX2, FMA and F16C instructions (every
/// AVX2 CPU shipped has all three; F16C decodes float16 keys in the
/// kernels).
///
/// Zero-sized and `Copy`; its field is private, so the only way to get one
/// is run-time CPU feature detection ([`Isa::best`]). Every AVX2 kernel is
/// reached with one, which is what makes calling it sound.
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
/// kernels, `avx2` caps them at AVX2, `avx512` at AVX-512 (for testing and
/// for measuring what each level buys); `avx512bf16` also takes the pair
/// level where the CPU has it but it is not the default ([`pair_speedup`]);
/// anything else caps nothing.
fn requested() -> Option<Level> {
    static REQUESTED: OnceLock<Option<Level>> = OnceLock::new();
    *REQUESTED.get_or_init(|| Level::parse(&std::env::var("KVSELECT_SIMD").ok()?))
}

/// Proof that this CPU executes AVX-512 F, BW, DQ and VL besides
/// everything [`Avx2`] proves. Only detection makes one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Avx512(Avx2);

impl Avx512 {
    /// The AVX2 token this one implies.
    pub fn avx2(self) -> Avx2 {
        self.0
    }
}

/// Proof that this CPU executes AVX512-BF16's `VDPBF16PS` as the software
/// model does (`simd/bf16dp.rs`), besides everything [`Avx512`] proves. Only
/// detection (and the model check) makes one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Avx512Bf16(Avx512);

impl Avx512Bf16 {
    /// The AVX-512 token this one implies.
    pub fn avx512(self) -> Avx512 {
        self.0
    }
}

/// How many times FMA's products per second `VDPBF16PS` does on this core
/// (raced once per process, `simd/bf16dp.rs`), if the CPU has the pair
/// level at all: the pair level is the default where this is at least 1.3.
pub fn pair_speedup() -> Option<f64> {
    static SPEEDUP: OnceLock<Option<f64>> = OnceLock::new();
    *SPEEDUP.get_or_init(|| {
        let t = cpu_avx512bf16()?;
        #[cfg(target_arch = "x86_64")]
        return Some(bf16dp::speedup(t));
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = t;
            None
        }
    })
}

/// The AMX screen's token (`simd/amx.rs`): where this CPU and OS run
/// AMX-BF16's tile product as its model does, unless `KVSELECT_SIMD` names a
/// level (any level it names runs without the screen, so `avx512` and
/// `avx512bf16` test the kernels the screen hands positions back to) or
/// `KVSELECT_AMX=0`. Detected once per process.
pub fn amx_screen() -> Option<amx::Amx> {
    static AMX: OnceLock<Option<amx::Amx>> = OnceLock::new();
    *AMX.get_or_init(|| {
        let off = std::env::var_os("KVSELECT_AMX").is_some_and(|v| v == "0");
        match requested() {
            None if !off => amx::cpu_amx(cpu_avx512()),
            _ => None,
        }
    })
}

/// Whether the pair level is the default on this CPU: it has the level and
/// the race found the instruction's products at least
/// [`bf16dp::PAYS_AT`] times FMA's.
fn pair_level_pays() -> bool {
    pair_speedup().is_some_and(|x| x >= bf16dp::PAYS_AT)
}

/// The token if this CPU has AVX512-BF16 besides AVX-512 and its
/// instruction gives the model's bits on every probe.
fn cpu_avx512bf16() -> Option<Avx512Bf16> {
    static CPU: OnceLock<Option<Avx512Bf16>> = OnceLock::new();
    *CPU.get_or_init(|| {
        let avx512 = cpu_avx512()?;
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512bf16")
            // SAFETY: `hardware_agrees` runs `VDPBF16PS` and AVX-512 F
            // instructions: detection found avx512bf16, the token AVX-512.
            && unsafe { bf16dp::hardware_agrees(avx512) }
        {
            return Some(Avx512Bf16(avx512));
        }
        let _ = avx512;
        None
    })
}

/// The AVX-512 token if this CPU has it, whatever `KVSELECT_SIMD` says: for
/// helpers whose every compilation gives the same answer (only their speed
/// depends on it).
#[cfg(target_arch = "x86_64")]
pub(crate) fn avx512_token() -> Option<Avx512> {
    cpu_avx512()
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

/// An instruction-set level together with the proof that this CPU runs it:
/// what every kernel family's `dispatch!` matches on. The AVX2 and
/// AVX-512 variants hold their tokens, so holding an `Isa` at a level is
/// holding that proof; `Scalar` needs none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// The portable kernels.
    Scalar,
    /// The AVX2 (+FMA, F16C) kernels.
    Avx2(Avx2),
    /// The AVX-512 kernels (and, where a family has none, its AVX2 ones).
    Avx512(Avx512),
    /// The AVX-512 kernels, the indexer's admitted blocks in bfloat16
    /// pairs.
    Avx512Bf16(Avx512Bf16),
}

impl Isa {
    /// The level dispatch runs at: the best this CPU has (detected once per
    /// process; the pair level only where it pays, [`pair_speedup`]), capped
    /// by `KVSELECT_SIMD` (`scalar`, `avx2`, `avx512`; `avx512bf16` takes
    /// the pair level wherever the CPU has it). The one entry point to the
    /// level.
    pub fn best() -> Isa {
        static BEST: OnceLock<Isa> = OnceLock::new();
        *BEST.get_or_init(|| Isa::chosen(Isa::available(), pair_level_pays, requested()))
    }

    /// The level dispatch runs at on a CPU whose best level is `available`:
    /// the pair level only where it `pays` or is `requested` by name, then
    /// capped at `requested`. `pays` (the race) is asked only when it
    /// decides: not when the pair level is asked for, nor capped away.
    fn chosen(available: Isa, pays: impl FnOnce() -> bool, requested: Option<Level>) -> Isa {
        let top = match (available, requested) {
            (Isa::Avx512Bf16(_), Some(Level::Avx512Bf16)) => available,
            (Isa::Avx512Bf16(_), Some(_)) => available.down(),
            (Isa::Avx512Bf16(_), None) if !pays() => available.down(),
            _ => available,
        };
        top.capped(requested)
    }

    /// The best level this CPU runs, whether or not it pays.
    fn available() -> Isa {
        match (cpu_avx512bf16(), cpu_avx512(), cpu_avx2()) {
            (Some(t), _, _) => Isa::Avx512Bf16(t),
            (None, Some(t), _) => Isa::Avx512(t),
            (None, None, Some(t)) => Isa::Avx2(t),
            (None, None, None) => Isa::Scalar,
        }
    }

    /// `self`, capped at the `requested` level (`None`: not capped).
    fn capped(self, requested: Option<Level>) -> Isa {
        match requested {
            Some(cap) => self.at_most(|l| l <= cap),
            None => self,
        }
    }

    /// The level's name.
    pub fn level(self) -> Level {
        match self {
            Isa::Scalar => Level::Scalar,
            Isa::Avx2(_) => Level::Avx2,
            Isa::Avx512(_) => Level::Avx512,
            Isa::Avx512Bf16(_) => Level::Avx512Bf16,
        }
    }

    /// The next level down, with the token this one implies (`Scalar`
    /// stays `Scalar`).
    pub fn down(self) -> Isa {
        match self {
            Isa::Avx512Bf16(t) => Isa::Avx512(t.avx512()),
            Isa::Avx512(t) => Isa::Avx2(t.avx2()),
            Isa::Avx2(_) | Isa::Scalar => Isa::Scalar,
        }
    }

    /// The best level at or below `self` that `admits` accepts (the
    /// portable one if no other): how a family picks the level of one
    /// block whose inputs a fast kernel may not take, before handing it to
    /// the same `dispatch!` as every other block. `admits` is asked from
    /// `self` down; the portable level is never asked.
    ///
    /// ```
    /// use kvselect::simd::{Isa, Level};
    /// // A block with a NaN byte falls back below AVX-512, the others run
    /// // at the call's level; every block goes through one dispatch.
    /// let isa = Isa::best();
    /// for has_nan in [false, true] {
    ///     let block = isa.at_most(|l| !(has_nan && l == Level::Avx512));
    ///     assert!(block.level() <= isa.level());
    ///     assert!(!(has_nan && block.level() == Level::Avx512));
    /// }
    /// ```
    pub fn at_most(self, admits: impl Fn(Level) -> bool) -> Isa {
        let mut isa = self;
        while isa != Isa::Scalar && !admits(isa.level()) {
            isa = isa.down();
        }
        isa
    }

    /// The AVX2 token this level implies, if any.
    pub fn avx2(self) -> Option<Avx2> {
        match self {
            Isa::Scalar => None,
            Isa::Avx2(t) => Some(t),
            Isa::Avx512(t) => Some(t.avx2()),
            Isa::Avx512Bf16(t) => Some(t.avx512().avx2()),
        }
    }
}

/// The best level dispatched to (`kvselect.simd_level()`).
pub fn level() -> Level {
    Isa::best().level()
}

/// Dispatches one kernel family: the one `match` on the [`Isa`], the one
/// `unsafe` call into the kernel its level allows.
///
/// ```text
/// // SAFETY (bounds): what the kernels' pointer reads rely on, asserted above.
/// simd::dispatch!("family.name", isa, {
///     avx512(t) => avx512::kernel(t, ..),
///     avx2(t) => avx2::kernel(t, ..),
///     scalar => portable::kernel(..),
/// })
/// ```
///
/// or, for a family with no AVX-512 kernel, `avx512 => avx2,` in place of
/// the first arm (refused by name: the AVX2 expression runs with the AVX2
/// token the AVX-512 one implies). Each arm binds its level's token, so a
/// kernel is reachable only with the proof its instructions exist; that is
/// the instruction-set half of the SAFETY argument, made here once. The
/// other half, the bounds the kernel's pointer reads rely on, is the
/// family's: asserted before the dispatch and stated in a `SAFETY`
/// comment on it. The name is the family's in the reach test
/// (`simd::reach`), which records under `cfg(test)` which level's kernel
/// each family ran at each level it was handed.
macro_rules! dispatch {
    ($family:literal, $isa:expr, {
        avx512($t5:ident) => $e5:expr,
        avx2($t2:ident) => $e2:expr,
        scalar => $es:expr $(,)?
    }) => {
        match $isa {
            #[cfg(target_arch = "x86_64")]
            #[allow(unused_unsafe, clippy::macro_metavars_in_unsafe)]
            $crate::simd::Isa::Avx512Bf16(t) => {
                let $t5 = t.avx512();
                #[cfg(test)]
                $crate::simd::reach::record(
                    $family,
                    $crate::simd::Level::Avx512Bf16,
                    $crate::simd::Level::Avx512,
                );
                // SAFETY: this arm is reached only with the AVX512-BF16
                // token, which implies the AVX-512 one the kernel needs (only
                // run-time detection makes either). The bounds are the
                // family's.
                unsafe { $e5 }
            }
            #[cfg(target_arch = "x86_64")]
            #[allow(unused_unsafe, clippy::macro_metavars_in_unsafe)]
            $crate::simd::Isa::Avx512($t5) => {
                #[cfg(test)]
                $crate::simd::reach::record(
                    $family,
                    $crate::simd::Level::Avx512,
                    $crate::simd::Level::Avx512,
                );
                // SAFETY: this arm is reached only with `$t5`, the AVX-512
                // token (which only run-time detection makes): the CPU has
                // the kernel's instructions. The bounds are the family's
                // (asserted before the dispatch, see its SAFETY comment).
                unsafe { $e5 }
            }
            #[cfg(target_arch = "x86_64")]
            #[allow(unused_unsafe, clippy::macro_metavars_in_unsafe)]
            $crate::simd::Isa::Avx2($t2) => {
                #[cfg(test)]
                $crate::simd::reach::record(
                    $family,
                    $crate::simd::Level::Avx2,
                    $crate::simd::Level::Avx2,
                );
                // SAFETY: as above, with `$t2`, the AVX2 token.
                unsafe { $e2 }
            }
            #[cfg(not(target_arch = "x86_64"))]
            $crate::simd::Isa::Avx512Bf16(_)
            | $crate::simd::Isa::Avx512(_)
            | $crate::simd::Isa::Avx2(_) => {
                unreachable!("no x86 token exists off x86-64")
            }
            $crate::simd::Isa::Scalar => {
                #[cfg(test)]
                $crate::simd::reach::record(
                    $family,
                    $crate::simd::Level::Scalar,
                    $crate::simd::Level::Scalar,
                );
                $es
            }
        }
    };
    ($family:literal, $isa:expr, {
        avx512 => avx2,
        avx2($t2:ident) => $e2:expr,
        scalar => $es:expr $(,)?
    }) => {
        match $isa {
            #[cfg(target_arch = "x86_64")]
            #[allow(unused_unsafe, clippy::macro_metavars_in_unsafe)]
            $crate::simd::Isa::Avx512Bf16(t) => {
                let $t2 = t.avx512().avx2();
                #[cfg(test)]
                $crate::simd::reach::record(
                    $family,
                    $crate::simd::Level::Avx512Bf16,
                    $crate::simd::Level::Avx2,
                );
                // SAFETY: this arm is reached only with the AVX512-BF16
                // token, which implies the AVX2 one the kernel needs. The
                // bounds are the family's.
                unsafe { $e2 }
            }
            #[cfg(target_arch = "x86_64")]
            #[allow(unused_unsafe, clippy::macro_metavars_in_unsafe)]
            $crate::simd::Isa::Avx512(t) => {
                let $t2 = t.avx2();
                #[cfg(test)]
                $crate::simd::reach::record(
                    $family,
                    $crate::simd::Level::Avx512,
                    $crate::simd::Level::Avx2,
                );
                // SAFETY: this arm is reached only with the AVX-512 token,
                // which implies the AVX2 one the kernel needs (only run-time
                // detection makes either). The bounds are the family's.
                unsafe { $e2 }
            }
            #[cfg(target_arch = "x86_64")]
            #[allow(unused_unsafe, clippy::macro_metavars_in_unsafe)]
            $crate::simd::Isa::Avx2($t2) => {
                #[cfg(test)]
                $crate::simd::reach::record(
                    $family,
                    $crate::simd::Level::Avx2,
                    $crate::simd::Level::Avx2,
                );
                // SAFETY: this arm is reached only with `$t2`, the AVX2
                // token (which only run-time detection makes). The bounds
                // are the family's.
                unsafe { $e2 }
            }
            #[cfg(not(target_arch = "x86_64"))]
            $crate::simd::Isa::Avx512Bf16(_)
            | $crate::simd::Isa::Avx512(_)
            | $crate::simd::Isa::Avx2(_) => {
                unreachable!("no x86 token exists off x86-64")
            }
            $crate::simd::Isa::Scalar => {
                #[cfg(test)]
                $crate::simd::reach::record(
                    $family,
                    $crate::simd::Level::Scalar,
                    $crate::simd::Level::Scalar,
                );
                $es
            }
        }
    };
}
pub(crate) use dispatch;

/// Every level this CPU has, from the portable one up, whatever
/// `KVSELECT_SIMD` says, the pair level too where the CPU has it (whether
/// or not it is the default): the levels a test compares.
#[cfg(test)]
pub(crate) fn isas_for_test() -> Vec<Isa> {
    let mut isa = Isa::available();
    let mut all = vec![isa];
    while isa != Isa::Scalar {
        isa = isa.down();
        all.push(isa);
    }
    all.reverse();
    all
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

/// [`avx512_for_test`]'s AVX512-BF16 twin (skipped visibly: only Zen 4 and
/// Intel Sapphire Rapids or later have it).
#[cfg(all(test, target_arch = "x86_64"))]
pub(crate) fn avx512bf16_for_test() -> Option<Avx512Bf16> {
    let token = cpu_avx512bf16();
    if token.is_none() {
        eprintln!("skipped: this CPU has no AVX512-BF16 (or its instruction is not the model)");
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
    let isa = Isa::best();
    let lanes = match isa {
        Isa::Avx512(_) | Isa::Avx512Bf16(_) => 16,
        Isa::Avx2(_) => 8,
        Isa::Scalar => 1,
    };
    let mut sums = vec![0.0f32; threads];
    crate::pool::for_each_row_mut(&mut sums, 1, 1, |_, s| s[0] = floor::run(isa, iters));
    let flops = (threads * iters * FLOOR_CHAINS * lanes * 2) as u64;
    (flops, sums.iter().sum())
}

/// Independent FMA chains in [`fma_floor`]: enough to cover the latency of
/// two FMA ports (4 cycles × 2), with room.
pub const FLOOR_CHAINS: usize = 12;

mod floor {
    use super::{Isa, FLOOR_CHAINS};
    use std::hint::black_box;

    pub(super) fn run(isa: Isa, iters: usize) -> f32 {
        // SAFETY (bounds): none; the kernels read only their registers.
        super::dispatch!("simd.fma_floor", isa, {
            avx512(_t) => avx512(iters),
            avx2(_t) => avx2(iters),
            scalar => portable(iters),
        })
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

/// Which level's kernel each family ran at each level it was handed, as
/// `dispatch!` records it under `cfg(test)`: the reach test's evidence
/// that a level is reached by every family (or refused by it by name).
#[cfg(test)]
pub(crate) mod reach {
    use super::Level;
    use std::collections::BTreeSet;
    use std::sync::Mutex;

    static SEEN: Mutex<BTreeSet<(&'static str, Level, Level)>> = Mutex::new(BTreeSet::new());

    /// `family`, handed `level`, ran its kernel of level `ran`.
    pub(crate) fn record(family: &'static str, level: Level, ran: Level) {
        SEEN.lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((family, level, ran));
    }

    /// The level whose kernel `family` ran when handed `level`, if it was.
    pub(crate) fn ran(family: &str, level: Level) -> Option<Level> {
        let seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
        let mut it = seen.iter().filter(|(f, l, _)| *f == family && *l == level);
        let first = it.next().map(|&(_, _, r)| r);
        assert!(
            it.next().is_none(),
            "{family} at {level:?} ran two levels' kernels"
        );
        first
    }
}

#[cfg(test)]
mod tests {
    use super::{Isa, Level};

    /// `KVSELECT_SIMD` caps the CPU's level and never raises it past what
    /// the CPU runs; a name it does not know caps nothing (as before the
    /// dispatch was one). The pair level is the default only where it pays,
    /// and `avx512bf16` by name takes it wherever the CPU has it.
    #[test]
    fn the_override_caps_the_level_and_never_raises_it() {
        for cpu in super::isas_for_test() {
            assert_eq!(cpu.capped(None), cpu);
            for cap in Level::ALL {
                let got = cpu.capped(Some(cap));
                assert_eq!(
                    got.level(),
                    cpu.level().min(cap),
                    "{cpu:?} capped at {cap:?}"
                );
            }
            for pays in [false, true] {
                for requested in Level::ALL.map(Some).into_iter().chain([None]) {
                    let got = Isa::chosen(cpu, || pays, requested).level();
                    let default = match cpu.level() {
                        Level::Avx512Bf16 if !pays => Level::Avx512,
                        level => level,
                    };
                    let want = match requested {
                        None => default,
                        Some(Level::Avx512Bf16) => cpu.level(),
                        Some(cap) => default.min(cap),
                    };
                    assert_eq!(got, want, "{cpu:?}, pays {pays}, asked {requested:?}");
                }
            }
        }
        assert_eq!(Level::parse("AVX2"), Some(Level::Avx2));
        assert_eq!(Level::parse("scalar"), Some(Level::Scalar));
        assert_eq!(Level::parse("avx512"), Some(Level::Avx512));
        assert_eq!(Level::parse("AVX512BF16"), Some(Level::Avx512Bf16));
        assert_eq!(Level::parse("sse4"), None);
        assert_eq!(super::level(), Isa::best().level());
    }

    /// Every kernel family (the name its [`dispatch!`](super::dispatch)
    /// gives) and a probe that runs it once at a given level.
    type Probe = fn(Isa);
    const FAMILIES: &[(&str, Probe)] = &[
        ("simd.fma_floor", |isa| {
            super::floor::run(isa, 4);
        }),
        ("keys.fp8_has_nan", |isa| {
            assert!(crate::keys::fp8_has_nan_at(isa, &[0x7F; 100]));
        }),
        ("keys.decode", |isa| {
            let mut out = [0.0f32; 20];
            crate::keys::Encoded::Fp8E4m3(&[0x38; 20]).decode_at(isa, 0, &mut out);
            assert_eq!(out, [1.0; 20]);
        }),
        ("exp.shifted", |isa| {
            let mut out = [0.0f32; 20];
            crate::exp::exp_shifted(isa, &[1.0; 20], 1.0, &mut out);
            assert_eq!(out, [1.0; 20]);
        }),
        ("witness.scan", crate::witness::dispatch_probe),
        ("block_sparse.segment", crate::block_sparse::dispatch_probe),
        ("block_sparse.key_max", crate::block_sparse::dispatch_probe),
        ("indexer.transpose", crate::indexer::dispatch_probe),
        ("indexer.weighted_relu_sums", crate::indexer::dispatch_probe),
        ("indexer.rescore", crate::indexer::dispatch_probe),
        ("indexer.dense", crate::indexer::dispatch_probe),
        ("indexer.key_max", crate::indexer::dispatch_probe),
        ("attention.pack_keys", crate::attention::dispatch_probe),
        ("attention.scores", crate::attention::dispatch_probe),
        ("attention.softmax", crate::attention::dispatch_probe),
        ("attention.accumulate", crate::attention::dispatch_probe),
        ("quest.fold", crate::quest::dispatch_probe),
        ("quest.page_bounds", crate::quest::dispatch_probe),
        ("quest.scores", crate::quest::dispatch_probe),
        ("vslash.scores", crate::vslash::dispatch_probe),
        ("vslash.transpose", crate::vslash::dispatch_probe),
        ("vslash.sums", crate::vslash::dispatch_probe),
        ("vslash.lane_sums", crate::vslash::dispatch_probe),
        ("moba.gates", crate::moba::dispatch_probe),
        ("moba.lanes", crate::moba::dispatch_probe),
        ("moba.top", crate::moba::dispatch_probe),
        ("moba.sums", crate::moba::dispatch_probe),
        ("eviction.scores", crate::eviction::dispatch_probe),
        ("nsa.compress", crate::nsa::dispatch_probe),
        ("nsa.top", crate::nsa::dispatch_probe),
        ("nsa.top2", crate::nsa::dispatch_probe),
        ("infllm.head_sums", crate::infllm::dispatch_probe),
        ("infllm.panel_sums", crate::infllm::dispatch_probe),
        ("infllm.staged", crate::infllm::staged_probe),
    ];

    /// The levels a family has no kernel for, refused by name (`avx512 =>
    /// avx2` in its dispatch): the level whose kernel runs instead.
    const REFUSED: &[(&str, Level, Level)] = &[
        ("keys.fp8_has_nan", Level::Avx512, Level::Avx2),
        ("keys.decode", Level::Avx512, Level::Avx2),
        ("witness.scan", Level::Avx512, Level::Avx2),
        ("attention.pack_keys", Level::Avx512, Level::Avx2),
        ("quest.fold", Level::Avx512, Level::Avx2),
        ("quest.page_bounds", Level::Avx512, Level::Avx2),
        ("quest.scores", Level::Avx512, Level::Avx2),
        ("vslash.scores", Level::Avx512, Level::Avx2),
        ("vslash.transpose", Level::Avx512, Level::Avx2),
        ("vslash.sums", Level::Avx512, Level::Avx2),
        ("vslash.lane_sums", Level::Avx512, Level::Avx2),
        ("moba.gates", Level::Avx512, Level::Avx2),
        ("moba.top", Level::Avx512, Level::Avx2),
        ("moba.sums", Level::Avx512, Level::Avx2),
        ("eviction.scores", Level::Avx512, Level::Avx2),
        ("nsa.top", Level::Avx512, Level::Avx2),
        ("nsa.top2", Level::Avx512, Level::Avx2),
        ("indexer.dense", Level::Avx512, Level::Avx2),
        ("infllm.head_sums", Level::Avx512, Level::Avx2),
    ];

    /// A level added to the dispatch is reached by every kernel family, or
    /// refused by it by name.
    ///
    /// Compile time: [`dispatch!`](super::dispatch)'s `match` on [`Isa`] is
    /// exhaustive, and each family's invocation names an arm per level (or
    /// refuses one by name), so a new `Isa` variant does not compile until
    /// the macro handles it, and a new arm in the macro does not compile
    /// until every family supplies (or refuses) it. Run time, here: every
    /// family, run at every level this CPU has and at the level dispatch
    /// chose (`Isa::best`, which `KVSELECT_SIMD` caps), ran that level's
    /// kernel -- or, where [`REFUSED`] names the pair, the named lower
    /// one. The family list is checked against every `dispatch!` in the
    /// sources, so a new family cannot be left out of it.
    #[test]
    fn every_level_is_reached_by_every_family_or_refused_by_name() {
        let mut levels = super::isas_for_test();
        levels.push(Isa::best());
        for &isa in &levels {
            for &(family, probe) in FAMILIES {
                probe(isa);
                let level = isa.level();
                // The pair level runs every family's AVX-512 kernel (its
                // pairs are the indexer's, inside `indexer.weighted_relu_sums`'s
                // caller: `indexer::kernels::score_keys`).
                let as_level = level.min(Level::Avx512);
                let want = REFUSED
                    .iter()
                    .find(|&&(f, l, _)| f == family && l == as_level)
                    .map_or(as_level, |&(_, _, ran)| ran);
                assert_eq!(
                    super::reach::ran(family, level),
                    Some(want),
                    "{family} at {level:?}"
                );
            }
        }
        // Every `dispatch!` in the sources is a family above.
        let mut named = Vec::new();
        let mut dirs = vec![std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src")];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let text = std::fs::read_to_string(&path).unwrap();
                    let code = text.lines().filter(|l| !l.trim_start().starts_with("//"));
                    for line in code {
                        for piece in line.split("dispatch!(\"").skip(1) {
                            named.push(piece.split('"').next().unwrap().to_string());
                        }
                    }
                }
            }
        }
        named.sort();
        let mut listed: Vec<String> = FAMILIES.iter().map(|(f, _)| f.to_string()).collect();
        listed.sort();
        assert_eq!(
            named, listed,
            "every dispatch!(\"family\", ..) has a probe above"
        );
    }

    /// An input-dependent level, chosen per block and run through a real
    /// family's one dispatch: fp8 keys decoded 32 at a time, a block that
    /// holds a NaN byte at the level below the call's (here the portable
    /// one: the key loads refuse AVX-512 by name), the others at the
    /// call's. Each block still decodes to the portable bits, and both
    /// levels were taken.
    #[test]
    fn a_block_level_that_depends_on_the_inputs_goes_through_the_same_dispatch() {
        use crate::keys::{fp8_has_nan_at, Encoded};
        let bytes: Vec<u8> = (0..=255u8).cycle().take(32 * 12).collect();
        let mut want = vec![0.0f32; bytes.len()];
        Encoded::Fp8E4m3(&bytes).decode_at(Isa::Scalar, 0, &mut want);
        for isa in super::isas_for_test() {
            let mut got = vec![0.0f32; bytes.len()];
            let mut taken = Vec::new();
            for (block, out) in bytes.chunks(32).zip(got.chunks_mut(32)) {
                let nan = fp8_has_nan_at(isa, block);
                let level = isa.at_most(|l| !nan || l < Level::Avx2);
                Encoded::Fp8E4m3(block).decode_at(level, 0, out);
                taken.push(level.level());
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{isa:?}");
            assert!(taken.contains(&Level::Scalar) && taken.contains(&isa.level()));
        }
    }

    /// A block-level fallback steps down one level at a time, keeping the
    /// token the higher level implies, and never below the portable level.
    #[test]
    fn a_block_falls_back_to_the_next_level_down() {
        for isa in super::isas_for_test() {
            assert_eq!(isa.at_most(|_| true), isa);
            assert_eq!(isa.at_most(|_| false), Isa::Scalar);
            let below = isa.at_most(|l| l < isa.level());
            assert_eq!(below, isa.down());
            assert_eq!(below.level() < isa.level(), isa != Isa::Scalar);
            assert_eq!(isa.avx2().is_some(), isa.level() >= Level::Avx2);
        }
    }
}
