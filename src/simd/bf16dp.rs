//! `VDPBF16PS` (AVX512-BF16): the instruction, its software model, and the
//! check that the CPU's instruction is the model before its level is taken.
//!
//! Per 32-bit lane the instruction treats `a` and `b` as pairs of bfloat16
//! values (element `2j` the low half, `2j + 1` the high half) and computes
//! `t = fma(a_hi, b_hi, acc)` then `r = fma(a_lo, b_lo, t)`, each rounded to
//! nearest-even, with denormals-are-zero on the inputs and on `acc` and
//! flush-to-zero on `t` and `r`, tininess detected after rounding, MXCSR
//! ignored (Intel SDM, `VDPBF16PS` pseudocode; measured on AMD EPYC Zen 4:
//! of 184 candidate models exactly one matched all 900,000 adversarial
//! inputs, this one). [`dp_model`] is that semantics in portable Rust.
//!
//! The level that runs the instruction ([`super::Avx512Bf16`]) is offered
//! only when the CPU's instruction gives the model's bits on a fixed set of
//! probes ([`hardware_agrees`]), flush cases among them: a CPU whose
//! instruction differed would silently change scores, so it keeps the
//! AVX-512 level instead.
//!
//! # When a chain of pairs is a chain of FMAs
//!
//! A chain `acc = dp(acc, a, b)` over pairs is the float32 chain `acc =
//! fma(a_hi, b_hi, acc); acc = fma(a_lo, b_lo, acc)` over the same values in
//! that order, except where denormals-are-zero or flush-to-zero act. They
//! cannot act when ([`admits`], on the summaries [`min_exponent`] gives):
//!
//! - every input is exactly a bfloat16 value (the low 16 bits of its
//!   float32 are zero) and none is subnormal: DAZ then never acts on an
//!   input (fp8 e4m3 values always qualify: their subnormals are normal
//!   bfloat16s);
//! - with `e_a`, `e_b` the smallest exponents of the nonzero finite values
//!   on each side, `e_a + e_b ≥ −112`. A bfloat16 is `M · 2^(e − 7)` with
//!   integer `M`, so every product is a multiple of `u = 2^(e_a + e_b − 14)
//!   ≥ 2⁻¹²⁶`, and so is every partial sum (a sum of multiples of `u` below
//!   `2²⁴ u` is exact; above it, its rounding step is a multiple of `u`):
//!   each is `0` or at least `2⁻¹²⁶` in magnitude, a normal float32, and FTZ
//!   / DAZ on the accumulator never act. NaN and infinities are the same
//!   IEEE values in both.
//!
//! What would break it: admitting on one side's exponents alone (a query of
//! tiny elements reaches the flushed range: with exponents in `[−80, −60]`
//! on both sides every indexer score differed).
//!
//! # Where the level pays
//!
//! Matching the model makes the level *exact*; whether it is *faster*
//! depends on the core. On AMD Zen 4 the instruction issues one 512-bit
//! register per cycle like an FMA, so it does twice the products per
//! second; on an Intel Xeon with AVX512-BF16 (two 512-bit FMA ports) it
//! measured one instruction every two cycles with a latency of about
//! nine, half the products per second of the FMAs it replaces, and the
//! pair level ran the indexer's fp8 × fp8 decode at 2.05× the float32
//! kernel's time. So the level is the default only where [`speedup`], a
//! register-resident race of the two instructions timed once per process,
//! finds the instruction's products at least [`PAYS_AT`] times FMA's;
//! elsewhere it is reached only by asking (`KVSELECT_SIMD=avx512bf16`). The
//! race decides speed only: every level gives the same bits.

/// The pair `(hi, lo)` in one 32-bit lane, each the upper half of its
/// float32: `hi` is the one the instruction multiplies first.
#[inline(always)]
pub(crate) fn pack(hi: f32, lo: f32) -> u32 {
    (hi.to_bits() & 0xFFFF_0000) | (lo.to_bits() >> 16)
}

/// The smallest sum of exponents admitted: `2^(−112 − 14) = 2⁻¹²⁶`, the
/// smallest normal float32.
const MIN_EXPONENT_SUM: i32 = -112;

/// The exponent summary of a run of float32 values read as bfloat16: `None`
/// if one is not exactly a bfloat16 (low 16 bits set) or is subnormal;
/// else the smallest exponent of the nonzero finite ones (`i32::MAX / 4`
/// when there are none).
/// The portable rule the vector summaries (the pair kernels' packs and
/// scans) are tested against.
#[inline(always)]
pub(crate) fn min_exponent(values: impl IntoIterator<Item = u32>) -> Option<i32> {
    // `bad`: a value not exactly a bfloat16, or subnormal; `emin` the
    // smallest biased exponent of a nonzero finite value (`0xFF`: none).
    let (mut bad, mut emin) = (0u32, 0xFFu32);
    for bits in values {
        let e = (bits >> 23) & 0xFF;
        bad |= (bits & 0xFFFF) | u32::from(e == 0 && bits & 0x007F_FFFF != 0);
        emin = emin.min(if e == 0 { 0xFF } else { e });
    }
    match (bad, emin) {
        (0, 0xFF) => Some(i32::MAX / 4),
        (0, e) => Some(e as i32 - 127),
        _ => None,
    }
}

/// Whether a block of keys with exponent summary `keys` may be scored in
/// pairs against a query with summary `query` (the module docs' rule).
pub(crate) fn admits(keys: Option<i32>, query: Option<i32>) -> bool {
    matches!((keys, query), (Some(k), Some(q)) if k + q >= MIN_EXPONENT_SUM)
}

/// [`min_exponent`]'s summary of values known to be exactly bfloat16, from
/// the float32 bits of their smallest nonzero magnitude (`None`: every
/// value zero): `None` if that is subnormal, else its exponent
/// (`i32::MAX / 4` when it is infinity or NaN: no finite nonzero value).
/// Where the vector summaries (the pair kernels' packs and scans) end.
#[cfg(target_arch = "x86_64")]
pub(crate) fn summary_of_smallest(smallest: Option<u32>) -> Option<i32> {
    match smallest {
        None => Some(i32::MAX / 4),
        Some(m) if m < 0x0080_0000 => None,
        Some(m) => match m >> 23 {
            0xFF => Some(i32::MAX / 4),
            e => Some(e as i32 - 127),
        },
    }
}

/// How the work a pair kernel admits is run: by the instruction, or (in
/// tests, on every CPU) by its software model.
#[derive(Debug, Clone, Copy)]
pub(crate) enum PairRun {
    /// [`dp_model`], lane by lane: the tests' stand-in for the instruction,
    /// running the same layout and order logic.
    #[cfg_attr(not(test), allow(dead_code))]
    Model,
    /// `VDPBF16PS`, with the token that proves the CPU has it (and that it
    /// matches the model).
    #[cfg(target_arch = "x86_64")]
    Hw(super::Avx512Bf16),
}

impl PairRun {
    /// The pair level's run at `level`, if `level` has one.
    pub(crate) fn of(level: super::Isa) -> Option<PairRun> {
        match level {
            #[cfg(target_arch = "x86_64")]
            super::Isa::Avx512Bf16(t) => Some(PairRun::Hw(t)),
            _ => None,
        }
    }
}

/// A bfloat16 (`bits`) as a float32, denormals read as zeros of their sign.
#[inline(always)]
fn bf16_daz(bits: u32) -> f32 {
    let x = bits << 16;
    match x & 0x7F80_0000 {
        0 => f32::from_bits(x & 0x8000_0000),
        _ => f32::from_bits(x),
    }
}

/// `fma(a, b, c)` rounded once to float32 (nearest-even), a tiny result
/// (below `2⁻¹²⁶` after rounding to 24 bits with the exponent unbounded)
/// flushed to a zero of its sign. `a` and `b` are bfloat16 values, so
/// their product is exact in float64.
fn fma_ftz(a: f32, b: f32, c: f32) -> f32 {
    if !(a.is_finite() && b.is_finite() && c.is_finite()) {
        return a.mul_add(b, c);
    }
    let p = f64::from(a) * f64::from(b);
    let c = f64::from(c);
    let s = p + c;
    if s == 0.0 {
        // An exact zero: IEEE's sign rule (−0 only from −0 + −0), as in f32.
        return s as f32;
    }
    // TwoSum: `s + e` is `p + c` exactly.
    let bb = s - p;
    let e = (p - (s - bb)) + (c - bb);
    // Scale `s` to [1, 2) (exact: a power of two), round to 24 bits; a
    // float64 exactly halfway between two float32s is decided by `e`.
    let k = ((s.to_bits() >> 52) & 0x7FF) as i32 - 1023;
    let scale = f64::from_bits(((1023 - k) as u64) << 52);
    let (y, e) = (s.abs() * scale, e * scale.copysign(s));
    let mut r = y as f32;
    let half = f64::from(r) - y;
    if half.abs() == (2.0f64).powi(-24) && e != 0.0 {
        let up = e > 0.0;
        if up && half < 0.0 {
            r = f32::from_bits(r.to_bits() + 1);
        } else if !up && half > 0.0 {
            r = f32::from_bits(r.to_bits() - 1);
        }
    }
    let m = f64::from(r) * f64::from_bits(((1023 + k) as u64) << 52);
    let m = if m < f64::from(f32::MIN_POSITIVE) {
        0.0
    } else if m >= 2f64.powi(128) {
        f64::INFINITY
    } else {
        m
    };
    (m as f32).copysign(s as f32)
}

/// One lane of `VDPBF16PS` (the module docs' semantics): `acc` plus the
/// products of pairs `a` and `b`, the high halves first.
pub fn dp_model(acc: f32, a: u32, b: u32) -> f32 {
    let acc = match acc.is_subnormal() {
        true => 0.0f32.copysign(acc),
        false => acc,
    };
    let t = fma_ftz(bf16_daz(a >> 16), bf16_daz(b >> 16), acc);
    fma_ftz(bf16_daz(a & 0xFFFF), bf16_daz(b & 0xFFFF), t)
}

/// The probes [`hardware_agrees`] runs: `(acc, a, b)` lanes spread over
/// every exponent (subnormals, flushed products, NaN, infinities among
/// them), and the hand-made edge cases of the model's tests.
#[cfg(target_arch = "x86_64")]
fn probes() -> Vec<(f32, u32, u32)> {
    let mut state = 0xBF16_D9B5_0123_4567u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let tiny = |e: i32| 2f32.powi(e);
    let mut out = vec![
        (tiny(-126), pack(tiny(-75), 0.0), pack(-tiny(-75), 0.0)),
        (-f32::from_bits(1), pack(-0.0, -0.0), 0),
        (0.0, pack(-tiny(-70), -0.0), pack(tiny(-70), 0.0)),
        (-tiny(40), pack(tiny(40), 1.0), pack(1.0, 1.0)),
        (f32::MAX, pack(f32::MAX, 0.0), pack(1.0, 0.0)),
        (0.0, 0x0001_0000, pack(tiny(100), 0.0)),
    ];
    for _ in 0..4096 {
        let x = next();
        // Exponents concentrated where flushes act, then anywhere.
        let bf = |x: u64| -> u32 {
            let e = match x % 4 {
                0 => (x >> 2) % 256,
                _ => 40 + (x >> 2) % 40,
            } as u32;
            ((x >> 12) as u32 & 0x807F) | (e << 7)
        };
        let a = bf(x) << 16 | bf(x >> 20);
        let b = bf(x >> 40) << 16 | bf(next());
        let acc = match x % 3 {
            0 => f32::from_bits(next() as u32),
            1 => f32::from_bits(next() as u32 & 0x80FF_FFFF),
            _ => 0.0,
        };
        out.push((acc, a, b));
    }
    out
}

/// Whether the CPU's `VDPBF16PS` gives [`dp_model`]'s bits (NaN for NaN)
/// on every probe ([`probes`]), 16 lanes at a time.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512bf16,avx512f")]
pub(super) fn hardware_agrees(_: super::Avx512) -> bool {
    use std::arch::x86_64::*;
    probes().chunks(16).all(|lanes| {
        let mut acc = [0.0f32; 16];
        let (mut a, mut b) = ([0u32; 16], [0u32; 16]);
        for (j, &(c, x, y)) in lanes.iter().enumerate() {
            (acc[j], a[j], b[j]) = (c, x, y);
        }
        let mut got = [0.0f32; 16];
        // SAFETY: the arrays hold 16 lanes each (unaligned loads and store);
        // the caller's detection found avx512bf16 and the token AVX-512 F.
        unsafe {
            let r = dp(
                _mm512_loadu_ps(acc.as_ptr()),
                _mm512_loadu_si512(a.as_ptr().cast()),
                _mm512_loadu_si512(b.as_ptr().cast()),
            );
            _mm512_storeu_ps(got.as_mut_ptr(), r);
        }
        (0..16).all(|j| {
            let want = dp_model(acc[j], a[j], b[j]);
            got[j].to_bits() == want.to_bits() || (got[j].is_nan() && want.is_nan())
        })
    })
}

/// The products per second of `VDPBF16PS` over those of `VFMADD` on this
/// core (0.50 on an Intel Xeon with AVX512-BF16; on AMD Zen 4 a loop of
/// the same kind measured 2.04, the race itself not yet run there): the
/// same [`RACE_CHAINS`] independent register chains, [`RACE_STEPS`] steps
/// each (32 products a step for the pair instruction, 16 for the FMA), the
/// two loops alternated over [`RACE_ROUNDS`] rounds after a warm-up round
/// and the fastest time of each kept, so a preempted round cannot decide.
#[cfg(target_arch = "x86_64")]
pub(super) fn speedup(t: super::Avx512Bf16) -> f64 {
    use std::time::Instant;
    let (mut dp_best, mut fma_best) = (f64::INFINITY, f64::INFINITY);
    for round in 0..=RACE_ROUNDS {
        let t0 = Instant::now();
        // SAFETY: the token proves AVX512-BF16 and AVX-512 F.
        std::hint::black_box(unsafe { race_dp(t) });
        let t1 = Instant::now();
        // The benchmarks' FMA floor at the AVX-512 level: the same chains
        // and steps in `VFMADD`.
        std::hint::black_box(super::floor::run(
            super::Isa::Avx512(t.avx512()),
            RACE_STEPS,
        ));
        let t2 = Instant::now();
        if round > 0 {
            dp_best = dp_best.min((t1 - t0).as_secs_f64());
            fma_best = fma_best.min((t2 - t1).as_secs_f64());
        }
    }
    // Products per second: 2 × LANES a pair step, LANES an FMA step.
    match dp_best > 0.0 {
        true => 2.0 * fma_best / dp_best,
        false => f64::INFINITY,
    }
}

/// The pair level is the default where [`speedup`] is at least this: its
/// kernel also packs and decodes keys (15-22% of the pair work on Zen 4),
/// so a core whose instruction is barely faster gains nothing.
pub(super) const PAYS_AT: f64 = 1.3;

/// Chains in the race, the FMA floor's: enough to cover the pair
/// instruction's latency (about nine cycles at one every two on the Xeon;
/// one a cycle on Zen 4).
#[cfg(target_arch = "x86_64")]
const RACE_CHAINS: usize = super::FLOOR_CHAINS;
/// Steps of every chain in one round of the race (about 10-30 µs).
#[cfg(target_arch = "x86_64")]
const RACE_STEPS: usize = 4096;
/// Timed rounds of the race.
#[cfg(target_arch = "x86_64")]
const RACE_ROUNDS: usize = 7;

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512bf16,avx512f")]
fn race_dp(_: super::Avx512Bf16) -> f32 {
    use std::arch::x86_64::*;
    use std::hint::black_box;
    // Pairs of 1.0 times pairs of 2⁻²³: every sum normal, no flush acts.
    let a = _mm512_set1_epi32(black_box(0x3F80_3F80u32) as i32);
    let b = _mm512_set1_epi32(black_box(0x3400_3400u32) as i32);
    let mut acc = [_mm512_setzero_ps(); RACE_CHAINS];
    for _ in 0..RACE_STEPS {
        for v in acc.iter_mut() {
            *v = dp(*v, a, b);
        }
    }
    let s = acc
        .iter()
        .fold(_mm512_setzero_ps(), |s, &v| _mm512_add_ps(s, v));
    _mm512_reduce_add_ps(s)
}

/// `VDPBF16PS acc, a, b` on pairs held as 32-bit integers.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512bf16,avx512f")]
pub(crate) fn dp(
    acc: std::arch::x86_64::__m512,
    a: std::arch::x86_64::__m512i,
    b: std::arch::x86_64::__m512i,
) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    // SAFETY: `__m512i` and `__m512bh` are both 64 bytes of plain lanes;
    // the pairs are reinterpreted, not converted.
    let (a, b) = unsafe {
        (
            std::mem::transmute::<__m512i, __m512bh>(a),
            std::mem::transmute::<__m512i, __m512bh>(b),
        )
    };
    _mm512_dpbf16_ps(acc, a, b)
}

#[cfg(test)]
mod tests {
    /// The probes the level's check runs have teeth: many land where the
    /// instruction's flushes act (the model differs from two IEEE FMAs),
    /// many where they do not.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_probes_reach_the_flushes_and_the_normal_range() {
        let bf = |x: u32| f32::from_bits(x << 16);
        let (mut flushed, mut plain) = (0, 0);
        for (acc, a, b) in super::probes() {
            let ieee =
                bf(a & 0xFFFF).mul_add(bf(b & 0xFFFF), bf(a >> 16).mul_add(bf(b >> 16), acc));
            let model = super::dp_model(acc, a, b);
            match model.to_bits() == ieee.to_bits() || (model.is_nan() && ieee.is_nan()) {
                true => plain += 1,
                false => flushed += 1,
            }
        }
        assert!(
            flushed >= 500 && plain >= 500,
            "{flushed} flushed, {plain} plain"
        );
    }

    /// The race gives a finite, positive ratio where the CPU has the pair
    /// level, and the default level follows it: the pair level exactly
    /// where the ratio reaches `PAYS_AT` (unless `KVSELECT_SIMD` says
    /// otherwise).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_race_decides_the_default_level() {
        use crate::simd::{pair_speedup, Isa, Level};
        let Some(t) = crate::simd::avx512bf16_for_test() else {
            assert_eq!(pair_speedup(), None);
            return;
        };
        let once = pair_speedup().unwrap();
        let again = super::speedup(t);
        assert!(once.is_finite() && once > 0.0 && again.is_finite() && again > 0.0);
        eprintln!("VDPBF16PS products per second: {once:.2}× FMA's (again: {again:.2}×)");
        if std::env::var_os("KVSELECT_SIMD").is_none() {
            let want = match once >= super::PAYS_AT {
                true => Level::Avx512Bf16,
                false => Level::Avx512,
            };
            assert_eq!(Isa::best().level(), want);
        }
    }

    /// Where the CPU has the instruction, it is the model on every probe
    /// (the level's check) — a CPU where it is not fails here loudly
    /// rather than only losing the level.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_cpus_instruction_is_the_model() {
        let Some(t) = crate::simd::avx512_for_test() else {
            return;
        };
        if !std::arch::is_x86_feature_detected!("avx512bf16") {
            eprintln!("skipped: this CPU has no AVX512-BF16");
            return;
        }
        // SAFETY: detection found avx512bf16; the token proves AVX-512 F.
        assert!(unsafe { super::hardware_agrees(t) });
    }
}
