//! Float buffers that start on a cache-line boundary.
//!
//! A 512-bit load or store at an address that is not a multiple of 64
//! bytes touches two cache lines (a split access, served as two): NSA's
//! prefill tile, whose keys sat on a 32-byte boundary, ran 9% slower a
//! call than on a 64-byte one (Intel Xeon; `src/infllm/panels.rs` places
//! its panels by an offset into a reused `Vec<f32>`, the staged kernels'
//! buffers are [`Floats`]). A kernel whose buffers are laid
//! out in rows of 16 floats (or multiples of 8 at AVX2) from a [`Floats`]
//! never splits a line. The values, and so every result, are the same
//! wherever the buffer lies.

use std::ops::{Deref, DerefMut};

/// A cache line of floats: a `Vec<Line>` starts on a line boundary.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(64))]
pub(crate) struct Line(pub [f32; 16]);

/// Floats in whole cache lines: a `Vec<f32>`'s `len`, `clear`, `resize`
/// and slices, its first element on a 64-byte boundary.
#[derive(Clone, Default)]
pub(crate) struct Floats {
    lines: Vec<Line>,
    len: usize,
}

impl Floats {
    /// `len` floats of `value`.
    pub(crate) fn filled(len: usize, value: f32) -> Floats {
        let mut f = Floats::default();
        f.resize(len, value);
        f
    }

    /// Empty, the allocation kept.
    pub(crate) fn clear(&mut self) {
        self.len = 0;
    }

    /// `len` floats: the first `min(len, self.len())` as they were, the
    /// rest `value` (as `Vec::resize`).
    pub(crate) fn resize(&mut self, len: usize, value: f32) {
        // Floats past the old lines are written once, as new lines of
        // `value`; those between the old length and the old lines' end hold
        // what they held, and are filled.
        let (old, held) = (self.len, self.lines.len() * 16);
        let lines = len.div_ceil(16);
        if self.lines.len() < lines {
            self.lines.resize(lines, Line([value; 16]));
        }
        self.len = len;
        if len > old {
            let end = len.min(held);
            if end > old {
                self[old..end].fill(value);
            }
        }
    }

    /// Floats held without a new allocation.
    pub(crate) fn capacity(&self) -> usize {
        self.lines.capacity() * 16
    }
}

impl Deref for Floats {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        &bytemuck::cast_slice(&self.lines)[..self.len]
    }
}

impl DerefMut for Floats {
    fn deref_mut(&mut self) -> &mut [f32] {
        &mut bytemuck::cast_slice_mut(&mut self.lines)[..self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::Floats;

    #[test]
    fn floats_are_a_vec_on_a_line_boundary() {
        let mut f = Floats::default();
        let mut v: Vec<f32> = Vec::new();
        for (len, x) in [
            (5, 1.0),
            (40, 2.0),
            (3, 3.0),
            (0, 4.0),
            (17, 5.0),
            (70, 6.0),
        ] {
            f.resize(len, x);
            v.resize(len, x);
            assert_eq!(&f[..], &v[..]);
            assert_eq!(f.as_ptr() as usize % 64, 0);
            f[len / 2..].iter_mut().for_each(|y| *y += 0.5);
            v[len / 2..].iter_mut().for_each(|y| *y += 0.5);
        }
        f.clear();
        assert!(f.is_empty() && f.capacity() >= 70);
        assert_eq!(&Floats::filled(3, 7.0)[..], &[7.0; 3]);
    }
}
