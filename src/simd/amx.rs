//! AMX-BF16's tile product `TDPBF16PS`: the instruction, its software
//! model, and the checks that this CPU and OS run it as the model does.
//!
//! # The instruction
//!
//! `TDPBF16PS C, A, B` multiplies a tile `A` of 16 rows × `K` pairs of
//! bfloat16 (a pair is one 32-bit element: element `2k` the low half,
//! `2k + 1` the high half) by a tile `B` of `K` rows of 16 pairs, into the
//! 16 × 16 float32 tile `C`. Per `(m, n)` it runs **two chains from
//! `+0.0`**, `e = fma(a_lo, b_lo, e)` over the low halves and `o = fma(a_hi,
//! b_hi, o)` over the high ones for `k = 0 .. K` in order, then `C[m][n] =
//! C[m][n] + (e + o)`: every step rounded to nearest-even, denormals-are-zero
//! on the inputs, flush-to-zero on the results, MXCSR ignored (Intel SDM,
//! `TDPBF16PS` pseudocode: its `temp1` holds the two chains, summed after the
//! loop over `k`). [`tile_model`] is that semantics in portable Rust.
//! Measured on an Intel Xeon with AMX (a Sapphire Rapids class part; the VM
//! reports model 167): 307,200 random results over wide exponent ranges
//! (and 128,000 within two octaves) all matched it; a single chain over the
//! 32 products in order (the indexer's canonical order) matched 33–74% of
//! the former, one rounding of the exact sum 40–72% (and all of the
//! latter, where it is exact).
//!
//! So the instruction does **not** compute the indexer's canonical order,
//! and never gives a score kvselect returns: the indexer runs it as a
//! *screen* only (`indexer/kernels/amx.rs`), whose error has the canonical
//! chain's bound (a product passes at most `K + 1 + ⌈d / 2K⌉` roundings,
//! fewer than the chain's `d`), and re-scores every position the screen
//! cannot rule out with the float32 kernels.
//!
//! # The checks
//!
//! The tiles exist only where the CPU has AMX-TILE and AMX-BF16 (CPUID leaf
//! 7) and the OS lets this process use the tile data (Linux 5.16 and later:
//! `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`, once per process).
//! Then the CPU's instruction must give [`tile_model`]'s bits on a fixed set
//! of probes (`hw::agrees`, on Linux x86-64) before the screen is offered.

/// Proof that this CPU and OS run `TDPBF16PS` (and its tile loads and
/// stores) as [`tile_model`] does, besides everything [`super::Avx512`]
/// proves. Only detection (and the model check) makes one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Amx(super::Avx512);

impl Amx {
    /// The AVX-512 token this one implies.
    pub fn avx512(self) -> super::Avx512 {
        self.0
    }
}

/// Rows of a tile, and pairs (32-bit elements) per row: every tile this
/// project configures is the full 16 × 64 bytes.
pub const TILE: usize = 16;

/// `x` read as DAZ reads it: a subnormal is a zero of its sign.
#[inline(always)]
fn daz(x: f32) -> f32 {
    match x.is_subnormal() {
        true => 0.0f32.copysign(x),
        false => x,
    }
}

/// `a + b` rounded to nearest-even with DAZ on both and FTZ on the result.
#[inline(always)]
fn add_ftz(a: f32, b: f32) -> f32 {
    daz(daz(a) + daz(b))
}

/// `fma(a, b, c)` rounded once, DAZ on `c`, FTZ on the result; `a` and `b`
/// are bfloat16 values (already read with DAZ), so the product is exact.
#[inline(always)]
fn fma_ftz(a: f32, b: f32, c: f32) -> f32 {
    daz(a.mul_add(b, daz(c)))
}

/// The bfloat16 in the low (`hi = false`) or high half of a pair, as a
/// float32 read with DAZ.
#[inline(always)]
fn half(pair: u32, hi: bool) -> f32 {
    let bits = match hi {
        true => pair & 0xFFFF_0000,
        false => pair << 16,
    };
    daz(f32::from_bits(bits))
}

/// One `TDPBF16PS` in software (the module docs' semantics): `c[m][n] +=`
/// the two chains over `k = 0 .. kpairs` of `a(m, k)` and `b(k, n)`.
pub fn tile_model(
    c: &mut [[f32; TILE]; TILE],
    a: impl Fn(usize, usize) -> u32,
    b: impl Fn(usize, usize) -> u32,
    kpairs: usize,
) {
    for (m, row) in c.iter_mut().enumerate() {
        for (n, acc) in row.iter_mut().enumerate() {
            let (mut e, mut o) = (0.0f32, 0.0f32);
            for k in 0..kpairs {
                let (x, y) = (a(m, k), b(k, n));
                e = fma_ftz(half(x, false), half(y, false), e);
                o = fma_ftz(half(x, true), half(y, true), o);
            }
            *acc = add_ftz(*acc, add_ftz(e, o));
        }
    }
}

/// The token if this CPU has AMX-TILE, AMX-BF16 and AVX-512, the OS lets
/// the process use the tiles, and the instruction is the model on every
/// probe (detected once per process).
pub(crate) fn cpu_amx(avx512: Option<super::Avx512>) -> Option<Amx> {
    let avx512 = avx512?;
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        // CPUID leaf 7 exists on every CPU with AVX-512.
        let leaf = std::arch::x86_64::__cpuid_count(7, 0);
        let (bf16, tile) = (leaf.edx >> 22 & 1 == 1, leaf.edx >> 24 & 1 == 1);
        if bf16 && tile && hw::permit() {
            let t = Amx(avx512);
            // SAFETY: the CPU has the tiles and the OS granted them.
            if unsafe { hw::agrees(t) } {
                return Some(t);
            }
        }
    }
    let _ = avx512;
    None
}

/// The probes [`hw::agrees`] runs: `(a, b, c)` tiles of pairs spread over
/// every exponent (subnormals, flushed sums, NaN and infinities among
/// them), then within two octaves, where the chains' roundings show.
#[cfg_attr(
    not(all(target_arch = "x86_64", target_os = "linux")),
    allow(dead_code)
)]
fn probes() -> Vec<([u32; 256], [u32; 256], [f32; 256])> {
    let mut state = 0xA3C5_7117_0BF1_6D00u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    (0..12)
        .map(|p| {
            let (lo, span) = match p % 3 {
                0 => (0u64, 256u64),
                1 => (100, 55),
                _ => (126, 3),
            };
            let bf = |x: u64| -> u32 {
                let e = (lo + (x >> 2) % span).min(255) as u32;
                ((x >> 12) as u32 & 0x807F) | (e << 7)
            };
            let mut pair = || {
                let x = next();
                bf(x) << 16 | bf(x >> 20)
            };
            let a: [u32; 256] = std::array::from_fn(|_| pair());
            let b: [u32; 256] = std::array::from_fn(|_| pair());
            let c: [f32; 256] = std::array::from_fn(|i| match i % 3 {
                0 => 0.0,
                _ => f32::from_bits(bf(next()) << 16 | (next() as u32 & 0xFFFF)),
            });
            (a, b, c)
        })
        .collect()
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub(crate) mod hw {
    //! The instructions, in inline assembly (Rust's AMX intrinsics are not
    //! stable). The tile registers are named in the assembly and nowhere
    //! else: this crate is built without the `amx-*` target features, so the
    //! compiler never allocates, spills or clobbers a tile between two
    //! `asm!` blocks, and the kernel's tiles stay as the last block left
    //! them (the OS saves them with the thread's extended state).
    use super::{Amx, TILE};
    use std::arch::asm;

    /// Asks Linux for the tile data once per process (`arch_prctl(0x1023,
    /// 18)`: `ARCH_REQ_XCOMP_PERM`, `XFEATURE_XTILEDATA`); whether granted.
    pub(super) fn permit() -> bool {
        let r: i64;
        // SAFETY: the system call reads its two integer arguments and
        // clobbers rcx and r11 (the syscall instruction's), nothing else.
        unsafe {
            asm!(
                "syscall",
                inlateout("rax") 158i64 => r,
                in("rdi") 0x1023i64,
                in("rsi") 18i64,
                lateout("rcx") _,
                lateout("r11") _,
                options(nostack),
            );
        }
        r == 0
    }

    /// The tile configuration: palette 1, all eight tiles 16 rows × 64
    /// bytes.
    #[repr(C, align(64))]
    struct Config([u8; 64]);

    const CONFIG: Config = {
        let mut c = [0u8; 64];
        c[0] = 1;
        let mut t = 0;
        while t < 8 {
            c[16 + 2 * t] = 64;
            c[48 + t] = TILE as u8;
            t += 1;
        }
        Config(c)
    };

    /// Configures this thread's tiles ([`Config`]); [`release`] when done.
    pub(crate) fn configure(_: Amx) {
        // SAFETY: the token proves the CPU has the tiles and the OS granted
        // them; `CONFIG` is a valid 64-byte palette-1 configuration.
        unsafe { asm!("ldtilecfg [{0}]", in(reg) CONFIG.0.as_ptr(), options(nostack, readonly)) };
    }

    /// Returns this thread's tiles to their initial state (so a context
    /// switch saves none of them).
    pub(crate) fn release(_: Amx) {
        // SAFETY: the token proves the CPU has the tiles.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }

    /// `c += a · b` by one `TDPBF16PS` on 16 × 16 tiles (`a` and `b` row
    /// major, 16 pairs a row), in tiles 0–2.
    ///
    /// # Safety
    ///
    /// The tiles must be configured ([`configure`]) on this thread.
    unsafe fn one(_: Amx, a: &[u32; 256], b: &[u32; 256], c: &mut [f32; 256]) {
        // SAFETY: each tile load and store touches 16 rows of 64 bytes at a
        // stride of 64: exactly the 1,024 bytes of its array.
        unsafe {
            asm!(
                "tileloadd tmm0, [{c} + {s}*1]",
                "tileloadd tmm1, [{a} + {s}*1]",
                "tileloadd tmm2, [{b} + {s}*1]",
                "tdpbf16ps tmm0, tmm1, tmm2",
                "tilestored [{c} + {s}*1], tmm0",
                a = in(reg) a.as_ptr(),
                b = in(reg) b.as_ptr(),
                c = in(reg) c.as_mut_ptr(),
                s = in(reg) 64usize,
                options(nostack),
            );
        }
    }

    /// Whether the CPU's `TDPBF16PS` gives [`super::tile_model`]'s bits (NaN
    /// for NaN) on every probe ([`super::probes`]).
    ///
    /// # Safety
    ///
    /// The CPU must have the tiles and the OS must have granted them.
    pub(super) unsafe fn agrees(t: Amx) -> bool {
        configure(t);
        let ok = super::probes().iter().all(|(a, b, c0)| {
            let mut got = *c0;
            // SAFETY: configured above.
            unsafe { one(t, a, b, &mut got) };
            let mut want = [[0.0f32; TILE]; TILE];
            for (i, x) in c0.iter().enumerate() {
                want[i / TILE][i % TILE] = *x;
            }
            super::tile_model(
                &mut want,
                |m, k| a[m * TILE + k],
                |k, n| b[k * TILE + n],
                TILE,
            );
            want.iter()
                .flatten()
                .zip(&got)
                .all(|(w, g)| w.to_bits() == g.to_bits() || (w.is_nan() && g.is_nan()))
        });
        release(t);
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The model on hand-made cases: two chains, each from `+0.0`, summed
    /// and then added to `C` — not one chain in order.
    #[test]
    fn the_model_runs_two_chains_then_adds_them_to_c() {
        let bf = |x: f32| x.to_bits() >> 16;
        let pair = |lo: f32, hi: f32| bf(hi) << 16 | bf(lo);
        // Low halves 2²⁵ then 1, high halves -2²⁵ then 1: the chains are
        // 2²⁵ and -2²⁵ (each +1 lost to rounding), their sum 0; one chain in
        // element order would give 2²⁵ - 2²⁵ + 1 + 1 = 2.
        let big = 33_554_432.0f32;
        let a = [pair(big, -big), pair(1.0, 1.0)];
        let b = [pair(1.0, 1.0), pair(1.0, 1.0)];
        let mut c = [[0.0f32; TILE]; TILE];
        tile_model(&mut c, |_, k| a[k], |k, _| b[k], 2);
        assert_eq!(c[0][0], 0.0);
        // `C` is added last: C = 1 plus chains 2⁻²⁴ and 2⁻²⁴ gives 1 + 2⁻²³.
        let tiny = 2f32.powi(-24);
        let mut c = [[1.0f32; TILE]; TILE];
        tile_model(&mut c, |_, _| pair(tiny, tiny), |_, _| pair(1.0, 1.0), 1);
        assert_eq!(c[3][7], 1.0 + 2.0 * tiny);
        // Subnormal inputs read as zero; a subnormal sum flushed.
        let sub = f32::from_bits(1 << 16);
        let mut c = [[0.0f32; TILE]; TILE];
        tile_model(&mut c, |_, _| pair(sub, 0.0), |_, _| pair(1e30, 0.0), 1);
        assert_eq!(c[0][0], 0.0);
        let t = 2f32.powi(-70);
        let mut c = [[0.0f32; TILE]; TILE];
        tile_model(&mut c, |_, _| pair(t, 0.0), |_, _| pair(t, 0.0), 1);
        assert_eq!(c[0][0].to_bits(), 0);
    }

    /// Where the CPU has the tiles, its instruction is the model on every
    /// probe — a CPU where it is not fails here loudly rather than only
    /// losing the screen.
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    #[test]
    fn the_cpus_tile_product_is_the_model() {
        let Some(t) = crate::simd::avx512_for_test() else {
            return;
        };
        let leaf = std::arch::x86_64::__cpuid_count(7, 0);
        if leaf.edx >> 22 & 1 == 0 || leaf.edx >> 24 & 1 == 0 || !hw::permit() {
            eprintln!("skipped: this CPU or OS has no AMX-BF16 tiles");
            return;
        }
        // SAFETY: detection found the tiles, the OS granted them.
        assert!(unsafe { hw::agrees(Amx(t)) });
    }
}
