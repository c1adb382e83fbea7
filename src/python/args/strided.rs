//! Strided rows: arrays read in place as rows that need not be adjacent.
//!
//! Reads the attention values (`v`, MLA's `kv[..., :d_v]` view) and the
//! pages of a paged cache (an engine's block axis interleaved with other
//! layers'). The rule: an array is read in place when every row is
//! contiguous and aligned and the rows are a uniform, positive stride apart
//! over the leading axes; the caller copies anything else once or refuses
//! it. The one `unsafe` read ([`StridedRows::slice`]) relies on exactly
//! that check.

use numpy::PyUntypedArrayMethods;
use numpy::{Element, PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn, PyUntypedArray};
use pyo3::prelude::*;

use super::arrays::is_aligned;

/// An array read in place as rows: its first `lead` axes index `rows` rows
/// of `row_len` C-contiguous elements, `stride` elements apart (`stride >=
/// row_len`, uniform over the leading axes). A C-order array is the case
/// `stride = row_len`; MLA's `kv[..., :d_v]` view of the keys and an
/// engine's pages interleaved with other layers' are the strided ones.
pub(in crate::python) struct StridedRows<'py, T: Element> {
    ro: PyReadonlyArrayDyn<'py, T>,
    pub shape: Vec<usize>,
    pub rows: usize,
    pub row_len: usize,
    pub stride: usize,
}

impl<'py, T: Element> StridedRows<'py, T> {
    /// `(rows, row_len, stride)` of `a`'s layout, `None` when it is not
    /// usable in place (unaligned, a row not contiguous, a non-uniform or
    /// non-positive row stride).
    fn layout(a: &Bound<'_, PyUntypedArray>, lead: usize) -> Option<(usize, usize, usize)> {
        let (shape, strides) = (a.shape(), a.strides());
        let item = std::mem::size_of::<T>() as isize;
        if !is_aligned(a) || lead > shape.len() {
            return None;
        }
        // Axes of length 1 may carry any stride: they are skipped.
        let chained = |axes: std::ops::Range<usize>, mut want: isize| {
            axes.rev().all(|j| {
                let ok = shape[j] == 1 || strides[j] == want;
                want = want.saturating_mul(shape[j] as isize);
                ok
            })
        };
        let row_len: usize = shape[lead..].iter().product();
        let rows: usize = shape[..lead].iter().product();
        if rows == 0 || row_len == 0 {
            // Nothing is read (NumPy gives empty arrays zero strides).
            return Some((rows, row_len, row_len));
        }
        if !chained(lead..shape.len(), item) {
            return None;
        }
        // The row stride: the innermost leading axis longer than 1.
        let Some(inner) = (0..lead).rev().find(|&j| shape[j] > 1) else {
            return Some((rows, row_len, row_len));
        };
        let s = strides[inner];
        let ok =
            s > 0 && s % item == 0 && (s / item) as usize >= row_len && chained(0..inner + 1, s);
        ok.then_some((rows, row_len, (s / item) as usize))
    }

    /// `a` read in place when its layout allows it, else `None`.
    pub fn new(a: &Bound<'py, PyArrayDyn<T>>, lead: usize) -> PyResult<Option<Self>> {
        let Some((rows, row_len, stride)) = Self::layout(a.as_untyped(), lead) else {
            return Ok(None);
        };
        let shape = a.shape().to_vec();
        Ok(Some(StridedRows {
            ro: a.try_readonly()?,
            shape,
            rows,
            row_len,
            stride,
        }))
    }

    pub fn untyped(&self) -> &Bound<'py, PyUntypedArray> {
        self.ro.as_untyped()
    }

    /// The memory the rows occupy: row `r` is the `row_len` elements at
    /// `r · stride`.
    pub fn slice(&self) -> &[T] {
        if self.rows == 0 || self.row_len == 0 {
            return &[];
        }
        let len = (self.rows - 1) * self.stride + self.row_len;
        // SAFETY: `layout` checked that every row is `row_len` contiguous
        // elements and that the rows are `stride` elements apart uniformly
        // over the leading axes, from the array's first element (positive
        // strides only), so the last element of the last row, at
        // `(rows − 1)·stride + row_len − 1`, lies inside the array; `self.ro`
        // keeps it alive and borrowed read-only for as long as the slice lives.
        unsafe { std::slice::from_raw_parts(self.ro.data(), len) }
    }
}
