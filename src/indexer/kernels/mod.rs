//! The indexer's scoring kernels: every key of a row against every head of
//! one query, in the summation order of the module docs. The AVX2 kernel
//! and the portable one run the same chains, so they agree bit for bit.

use crate::keys::Encoded;
use crate::simd::Wide;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod portable;
#[cfg(test)]
mod tests;

/// A query's heads decoded and zero-padded to `dp` (d rounded up to 8).
pub(super) struct Query {
    pub h: usize,
    pub d: usize,
    pub dp: usize,
    pub q: Vec<f32>,
}

impl Query {
    pub fn new(h: usize, d: usize) -> Self {
        let dp = d.div_ceil(8) * 8;
        Query {
            h,
            d,
            dp,
            q: vec![0.0; h * dp],
        }
    }

    /// Every element as its absolute value (for the error bound).
    pub fn abs(&mut self) {
        self.q.iter_mut().for_each(|x| *x = x.abs());
    }

    /// Decodes the query whose `h × d` elements start at `start`.
    pub fn load(&mut self, q: &Encoded<'_>, start: usize) {
        let (d, dp) = (self.d, self.dp);
        for (head, row) in self.q.chunks_exact_mut(dp).enumerate() {
            q.decode(start + head * d, &mut row[..d]);
        }
    }
}

/// `x <= 0 ? 0 : x`: the ReLU that keeps NaN (a NaN dot product must not
/// join the zero plateau).
#[inline(always)]
fn relu(x: f32) -> f32 {
    if x <= 0.0 {
        0.0
    } else {
        x
    }
}

/// Keys per register tile of the AVX2 kernel.
const KEYS: usize = 2;
/// Keys decoded per step: a block small enough to stay in L1 while every
/// tile of heads passes over it (so the query's heads are read from cache
/// once per block, not once per key).
const BLOCK: usize = KEYS * 6;

/// The scores of keys `first .. first + out.len()` into `out` (canonical:
/// `-0.0` is `+0.0`). With `magnitude`, every key is read as its absolute
/// value (and the caller passes `|q|`, `|w|`, `|c|`): the scores' error
/// bound `|c_t| Σ_h |w_h| Σ_i |q_hi k_ti|` (the ReLU is then the identity).
#[allow(clippy::too_many_arguments)]
pub(super) fn score_keys(
    level: Option<Wide>,
    q: &Query,
    w: &[f32],
    keys: &Encoded<'_>,
    scale: Option<&[f32]>,
    first: usize,
    out: &mut [f32],
    magnitude: bool,
) {
    let (d, dp, h) = (q.d, q.dp, q.h);
    assert!(w.len() == h && q.q.len() == h * dp);
    assert!((first + out.len()) * d <= keys.len());
    assert!(scale.is_none_or(|c| first + out.len() <= c.len()));
    let mut kbuf = vec![0.0f32; BLOCK * dp];
    for (j, block) in out.chunks_mut(BLOCK).enumerate() {
        let t0 = first + j * BLOCK;
        crate::keys::prefetch(keys, (t0 + 2 * BLOCK) * d, BLOCK * d);
        // float32 keys already in the padded layout (d a multiple of 8) are
        // read in place; any other block is decoded (or padded) into `kbuf`.
        let k: &[f32] = match keys {
            Encoded::F32(s) if d == dp && block.len() == BLOCK && !magnitude => {
                &s[t0 * d..(t0 + BLOCK) * d]
            }
            _ => {
                let n = block.len();
                if d == dp {
                    // Rows need no padding: the block's keys are one run,
                    // decoded in one call (a call per short row costs more
                    // than the decode itself at small d).
                    keys.decode(t0 * d, &mut kbuf[..n * d]);
                    kbuf[n * d..].fill(0.0); // a partial block's unused rows: scored, discarded
                } else {
                    for (r, row) in kbuf.chunks_exact_mut(dp).enumerate() {
                        match r < n {
                            true => keys.decode((t0 + r) * d, &mut row[..d]),
                            false => row.fill(0.0),
                        }
                    }
                }
                if magnitude {
                    kbuf.iter_mut().for_each(|x| *x = x.abs());
                }
                &kbuf
            }
        };
        let mut acc = [0.0f32; BLOCK];
        // The bounds the kernel's pointer reads rely on, checked in release.
        assert!(k.len() == BLOCK * dp && dp % 8 == 0);
        match level {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the token proves AVX2 and FMA; `q.q` holds `h` rows of
            // `dp` (asserted above), `k` holds `BLOCK` rows of `dp` (a full
            // block read in place, or `kbuf`), and `dp` is a multiple of 8.
            Some(Wide::Avx2(token)) => unsafe {
                avx2::weighted_relu_sums(token, &q.q, k, w, dp, &mut acc)
            },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above, the token proving AVX-512 too.
            Some(Wide::Avx512(token)) => unsafe {
                avx512::weighted_relu_sums(token, &q.q, k, w, dp, &mut acc)
            },
            _ => {
                for (a, key) in acc.iter_mut().zip(k.chunks_exact(dp)).take(block.len()) {
                    *a = portable::weighted_relu_sum(&q.q, key, w, dp);
                }
            }
        }
        for (r, o) in block.iter_mut().enumerate() {
            let c = scale.map_or(1.0, |s| s[t0 + r]);
            *o = acc[r] * c + 0.0;
        }
    }
}
