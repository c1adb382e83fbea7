//! One head's estimate: the last queries' scores, their softmax, the
//! column and diagonal sums, and the top columns and diagonals — in one
//! buffer of at most `64 · L` floats (see the module docs, "Memory").

use super::kernels::{self, lanes_total, COLS, ROWS, TILE};
use super::Variant;
use crate::error::ArgumentError;
use crate::keys::Encoded;
use crate::simd::Isa;

/// One head's inputs: its last queries `q` `[n, d]` (float32) and its KV
/// head `g` of the keys `[L, n_kv_heads, d]`, read in place.
#[derive(Clone, Copy)]
pub(super) struct Head<'a> {
    pub q: &'a [f32],
    pub keys: Encoded<'a>,
    pub key_scale: Option<&'a [f32]>,
    pub g: usize,
    pub n_kv_heads: usize,
    pub d: usize,
    pub seq_len: usize,
    pub variant: Variant,
}

/// The triangle of causal scores: row `i` (query `base + i`) holds
/// columns `0 ..= base + i`, rows back to back.
#[derive(Clone, Copy)]
pub(super) struct Tri {
    pub n: usize,
    pub base: usize,
}

impl Tri {
    pub fn new(seq_len: usize) -> Tri {
        let n = super::last_queries(seq_len);
        Tri {
            n,
            base: seq_len - n,
        }
    }
    pub fn len(&self, i: usize) -> usize {
        self.base + i + 1
    }
    pub fn off(&self, i: usize) -> usize {
        i * (self.base + 1) + i * i.saturating_sub(1) / 2
    }
    /// Floats the triangle takes: `n · L − n(n − 1)/2`.
    pub fn total(&self) -> usize {
        self.off(self.n)
    }
}

/// Elements of a key decoded at a time (non-float32 keys, scaled keys).
const DECODE: usize = 64;

/// A column tile of the sums (see `sums`).
const SUM_TILE: usize = 256;

/// Where the finished sums are, in the buffer `sums` leaves: the vertical
/// sum of column `c < L − 1` at `buf[vert + c]`, of column `L − 1` in
/// `v_last`; the diagonal sum of offset `o` at `buf[slash + L − 1 − o]`.
pub(super) struct Sums {
    pub vert: usize,
    pub slash: usize,
    pub v_last: f32,
}

impl Sums {
    pub fn vertical(&self, buf: &[f32], seq_len: usize, c: usize) -> f32 {
        if c + 1 == seq_len {
            self.v_last
        } else {
            buf[self.vert + c]
        }
    }
    pub fn slash(&self, buf: &[f32], seq_len: usize, o: usize) -> f32 {
        buf[self.slash + seq_len - 1 - o]
    }
}

/// The scores of `h` into `buf` (resized to the triangle), their softmax
/// and sums, in place. Refuses a score that is not finite (naming `keys`:
/// the queries were checked before).
pub(super) fn sums(isa: Isa, h: Head<'_>, buf: &mut Vec<f32>) -> Result<Sums, ArgumentError> {
    let (l, d) = (h.seq_len, h.d);
    let tri = Tri::new(l);
    let n = tri.n;
    debug_assert!(n >= 2);
    if buf.len() != tri.total() {
        // Zeroed by the allocator (fresh pages), not by a pass of ours:
        // every slot is written before it is read.
        *buf = vec![0.0; tri.total()];
    }
    let c = h.variant.scale(d);

    // 1. Scores, a 4 × 16 tile at a time: sixteen keys interleaved into a
    //    panel (element k of key j at k · 16 + j; float32 keys straight from
    //    the input, others decoded 64 elements at a time), then every row
    //    that sees them. A row past the last (n not a multiple of 4) repeats
    //    the last row; its scores are not kept.
    let mut panel = vec![0.0f32; d * COLS];
    let mut dec = [0.0f32; TILE * DECODE];
    let mut row_max = [f32::NEG_INFINITY; 64];
    let mut finite = true;
    for c0 in (0..l).step_by(COLS) {
        let cw = (l - c0).min(COLS);
        for half in 0..COLS / TILE {
            // A key past the end repeats the last one (its scores unused).
            let key = |j: usize| (c0 + (half * TILE + j).min(cw - 1)) * h.n_kv_heads + h.g;
            let dst = &mut panel[half * TILE..];
            match (h.keys, h.key_scale) {
                (Encoded::F32(k), None) => {
                    let rows: [&[f32]; TILE] =
                        std::array::from_fn(|j| &k[key(j) * d..key(j) * d + d]);
                    kernels::transpose(isa, &rows, dst);
                }
                (keys, scale) => {
                    for k0 in (0..d).step_by(DECODE) {
                        let kc = (d - k0).min(DECODE);
                        for j in 0..TILE {
                            let out = &mut dec[j * DECODE..j * DECODE + kc];
                            keys.decode_at(isa, key(j) * d + k0, out);
                            if let Some(s) = scale {
                                let sj = s[key(j) / h.n_kv_heads];
                                out.iter_mut().for_each(|x| *x *= sj);
                            }
                        }
                        let rows: [&[f32]; TILE] =
                            std::array::from_fn(|j| &dec[j * DECODE..j * DECODE + kc]);
                        kernels::transpose(isa, &rows, &mut dst[k0 * COLS..]);
                    }
                }
            }
        }
        let first = c0.saturating_sub(tri.base) / ROWS * ROWS;
        for r0 in (first..n).step_by(ROWS) {
            let rows: [&[f32]; ROWS] = std::array::from_fn(|r| {
                let i = (r0 + r).min(n - 1);
                &h.q[i * d..(i + 1) * d]
            });
            let valid: [usize; ROWS] = std::array::from_fn(|r| {
                if r0 + r < n {
                    tri.len(r0 + r).saturating_sub(c0).min(cw)
                } else {
                    0
                }
            });
            let at: [usize; ROWS] = std::array::from_fn(|r| tri.off((r0 + r).min(n - 1)) + c0);
            let mut m: [f32; ROWS] = std::array::from_fn(|r| row_max[(r0 + r).min(63)]);
            kernels::tile(
                isa,
                &rows,
                &panel,
                d,
                c,
                &valid,
                buf,
                &at,
                &mut m,
                &mut finite,
            );
            for (r, &mr) in m.iter().enumerate().take(n.saturating_sub(r0)) {
                row_max[r0 + r] = mr;
            }
        }
    }
    if !finite {
        return Err(ArgumentError::Invalid {
            argument: "keys",
            message: "a score q·k (scaled) is not finite: NaN or infinite keys or key_scale, \
                      or a product past float32's range"
                .into(),
        });
    }

    // 2. Each row's exp(s − max) in place, and its sum in eight lanes.
    let mut w = [0.0f32; 64];
    let mut tmp = [0.0f32; 512];
    for i in 0..n {
        let row = &mut buf[tri.off(i)..tri.off(i) + tri.len(i)];
        let mut lanes = [0.0f32; 8];
        for chunk in row.chunks_mut(tmp.len()) {
            let t = &mut tmp[..chunk.len()];
            t.copy_from_slice(chunk);
            crate::exp::exp_shifted(isa, t, row_max[i], chunk);
            kernels::lane_sums(isa, chunk, &mut lanes);
        }
        w[i] = 1.0 / lanes_total(&lanes);
    }

    // 3. The sums, a column tile at a time over every row: p = e · w into
    //    the column's sum and into the sum of its diagonal (offset
    //    base + i − c, kept by t = L − 1 − offset = c + n − 1 − i). A
    //    tile's columns and the diagonals t below its end are then
    //    complete, and are written over scores already read: column c's
    //    sum over row n − 2's slot c, diagonal t's over row n − 1's slot t.
    let (vert_at, slash_at) = (tri.off(n - 2), tri.off(n - 1));
    let mut vert = [0.0f32; SUM_TILE];
    let mut win = [0.0f32; SUM_TILE + 63];
    let mut v_last = 0.0f32;
    for c0 in (0..l).step_by(SUM_TILE) {
        let cw = (l - c0).min(SUM_TILE);
        vert.fill(0.0);
        for (i, &wi) in w.iter().enumerate().take(n) {
            let len = tri.len(i);
            if len <= c0 {
                continue;
            }
            let m = (len - c0).min(cw);
            let shift = n - 1 - i;
            let start = tri.off(i) + c0;
            kernels::accumulate(
                isa,
                &buf[start..start + m],
                wi,
                &mut vert[..m],
                &mut win[shift..shift + m],
            );
        }
        for j in 0..cw {
            let col = c0 + j;
            if col + 1 == l {
                v_last = vert[j];
            } else {
                buf[vert_at + col] = vert[j];
            }
            buf[slash_at + col] = win[j];
        }
        win.copy_within(cw.., 0);
        let keep = win.len() - cw;
        win[keep..].fill(0.0);
    }
    Ok(Sums {
        vert: vert_at,
        slash: slash_at,
        v_last,
    })
}

/// The `k` best of `count` candidates by `score` (descending, ties to the
/// lower id), written ascending into `out` (`k` slots). `scratch` holds at
/// least `count` values. Every score is `+0`, a positive number or `+inf`
/// (sums of probabilities, forced ones): their bits order as the values do,
/// so the `k`-th largest is found among plain integers, and one pass in id
/// order keeps those above it and, of those equal to it, the lowest ids.
pub(super) fn top(
    count: usize,
    k: usize,
    score: impl Fn(usize) -> f32,
    scratch: &mut [u32],
    out: &mut [i32],
) {
    if k >= count {
        for (i, o) in out.iter_mut().enumerate().take(count) {
            *o = i as i32;
        }
        return;
    }
    let vals = &mut scratch[..count];
    for (i, x) in vals.iter_mut().enumerate() {
        let v = score(i);
        debug_assert!(v >= 0.0 && v.is_sign_positive());
        *x = v.to_bits();
    }
    let threshold = *vals.select_nth_unstable(count - k).1;
    let above = (0..count)
        .filter(|&i| score(i).to_bits() > threshold)
        .count();
    let mut ties = k - above;
    let mut n = 0;
    for i in 0..count {
        let b = score(i).to_bits();
        if b > threshold || (b == threshold && ties > 0) {
            if b == threshold {
                ties -= 1;
            }
            out[n] = i as i32;
            n += 1;
        }
    }
    debug_assert_eq!(n, k);
}
