//! The arguments every block selection reads alike: `index_q` and
//! `index_k` in their formats, and the output's row layout.
//!
//! Reads `index_q`, `index_k` (with `query_format` / `key_format`) and
//! `head_major`. The rule: `index_q` is `[n_queries, n_kv_heads, d]`,
//! `index_k` `[n_positions, d]`, each in a key format; rows are
//! query-major unless `head_major` asks for the engines' head-major order.

use pyo3::prelude::*;

use crate::block_sparse::OutLayout;
use crate::python::args::{EncodedIn, FormatArg, Obj, S};

/// The output layout `head_major` asks for.
pub(super) fn layout(head_major: bool) -> OutLayout {
    match head_major {
        true => OutLayout::HeadMajor,
        false => OutLayout::QueryMajor,
    }
}

/// `[n_queries, n_kv_heads, width]`, or head-major `[n_kv_heads, n_queries, width]`.
pub(super) fn rows_shape(n: usize, h: usize, w: usize, layout: OutLayout) -> Vec<usize> {
    match layout {
        OutLayout::QueryMajor => vec![n, h, w],
        OutLayout::HeadMajor => vec![h, n, w],
    }
}

/// `index_q` `[n_queries, n_kv_heads, d]` in its format, with `[n, h, d]`.
pub(super) fn queries<'py>(
    index_q: &Obj<'py>,
    format: FormatArg<'_>,
) -> PyResult<(EncodedIn<'py>, [usize; 3])> {
    let (q, _) = EncodedIn::new(S, index_q, "index_q", format)?;
    let dims = S.dims::<3>(q.untyped(), "index_q", "[n_queries, n_kv_heads, d]")?;
    Ok((q, dims))
}

/// `index_k` `[n_positions, d]` in its format, with `d`.
pub(super) fn index_keys<'py>(
    index_k: &Obj<'py>,
    format: FormatArg<'_>,
) -> PyResult<(EncodedIn<'py>, usize)> {
    let (k, _) = EncodedIn::new(S, index_k, "index_k", format)?;
    let [_, d] = S.dims::<2>(k.untyped(), "index_k", "[n_positions, d]")?;
    Ok((k, d))
}
