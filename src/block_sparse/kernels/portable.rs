//! The portable kernel: the AVX2 kernel's exact arithmetic, lane by lane.
use super::{exact, Pieces, Segment, TileOut, MR};

/// One dot product in the canonical order (see the module docs). `q` is
/// zero-padded to `k.len()` rounded up to 8; past `k.len()` a key
/// dimension counts as 0.
#[inline]
pub(super) fn dot(q: &[f32], k: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let full = k.len() / 8;
    for c in 0..full {
        let (Some(qv), Some(kv)) = (q.get(c * 8..c * 8 + 8), k.get(c * 8..c * 8 + 8)) else {
            break;
        };
        for j in 0..8 {
            acc[j] = qv[j].mul_add(kv[j], acc[j]);
        }
    }
    if !k.len().is_multiple_of(8) {
        let c = full * 8;
        for (j, a) in acc.iter_mut().enumerate() {
            let x = q.get(c + j).copied().unwrap_or(0.0);
            let y = k.get(c + j).copied().unwrap_or(0.0);
            *a = x.mul_add(y, *a);
        }
    }
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
}

pub(super) fn segment(seg: &Segment<'_>, mut out: TileOut<'_>) {
    let (d, dp) = (seg.d, seg.dp);
    let mut cur_block = usize::MAX;
    let mut m = [f32::NEG_INFINITY; MR];
    let mut key = vec![0.0f32; d];
    for piece in Pieces::new(seg) {
        if piece.block != cur_block {
            if cur_block != usize::MAX {
                out.flush(cur_block - seg.b0, m);
            }
            cur_block = piece.block;
            m = [f32::NEG_INFINITY; MR];
        }
        if out.mag_at.is_some() {
            let len = seg.keys.len();
            let at = |p: usize| ((p - seg.base) * d).min(len);
            let code = exact::code_max(&seg.keys, at(piece.from), at(piece.to));
            out.flush_magnitude(piece.block - seg.b0, seg.keys.format(), code);
        }
        for p in piece.from..piece.to {
            let at = (p - seg.base) * d;
            if at + d > seg.keys.len() {
                break;
            }
            // Decoded exactly: the values the float32 kernel would read.
            seg.keys.decode(at, &mut key);
            let k = &key[..];
            for (r, mr) in m.iter_mut().enumerate() {
                if piece.masked && p >= seg.vis[r] {
                    continue;
                }
                let q = seg.q.get(r * dp..(r + 1) * dp).unwrap_or(&[]);
                let s = dot(q, k);
                // NaN never wins; same semantics as `_mm_max_ps(s, m)`.
                if s > *mr {
                    *mr = s;
                }
            }
        }
    }
    if cur_block != usize::MAX {
        out.flush(cur_block - seg.b0, m);
    }
}
