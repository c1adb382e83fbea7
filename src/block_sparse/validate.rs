//! The checks every entry point runs before it writes anything; each
//! refusal names its argument.

use super::{BlockSparseConfig, IndexLike};
use crate::error::product;
use crate::error::ArgumentError;

/// Exclusive end of the keys a query at `query_pos` sees.
pub(super) fn visible_end(query_pos: usize, n_positions: usize) -> usize {
    query_pos.saturating_add(1).min(n_positions)
}

/// Rows of `d` in `len` key values.
pub(super) fn key_rows(len: usize, d: usize) -> Result<usize, ArgumentError> {
    if d == 0 {
        return Err(ArgumentError::Invalid {
            argument: "d",
            message: "d is 0: index vectors need at least one dimension".into(),
        });
    }
    if !len.is_multiple_of(d) {
        return Err(ArgumentError::Invalid {
            argument: "index_k",
            message: format!(
                "index_k has {len} values, which is not a whole number of rows of d={d}"
            ),
        });
    }
    Ok(len / d)
}

pub(super) fn check_q_len(
    q_len: usize,
    n_queries: usize,
    n_kv_heads: usize,
    d: usize,
) -> Result<(), ArgumentError> {
    let expected = product(&[n_queries, n_kv_heads, d]);
    if expected != Some(q_len) {
        let want = match expected {
            Some(e) => e.to_string(),
            None => "more than usize::MAX".into(),
        };
        let message = if n_queries == 1 {
            format!(
                "index_q has {q_len} values, expected {want} = n_kv_heads ({n_kv_heads}) × d ({d})"
            )
        } else {
            format!(
                "index_q has {q_len} values, expected {want} = n_queries ({n_queries}) × \
                 n_kv_heads ({n_kv_heads}) × d ({d})"
            )
        };
        return Err(ArgumentError::Invalid {
            argument: "index_q",
            message,
        });
    }
    Ok(())
}

pub(super) fn check_per_query_len(
    argument: &'static str,
    len: usize,
    n_queries: usize,
) -> Result<(), ArgumentError> {
    if len != n_queries {
        return Err(ArgumentError::Invalid {
            argument,
            message: format!(
                "{argument} has {len} entries, expected one per query (n_queries = {n_queries})"
            ),
        });
    }
    Ok(())
}

pub(super) fn check_out(
    out: &[i32],
    n_queries: usize,
    n_kv_heads: usize,
    width: usize,
) -> Result<(), ArgumentError> {
    let expected = product(&[n_queries, n_kv_heads, width]);
    if expected != Some(out.len()) {
        return Err(ArgumentError::OutputSize {
            argument: "out",
            expected: expected.unwrap_or(usize::MAX),
            actual: out.len(),
            shape: format!(
                "n_queries ({n_queries}) × n_kv_heads ({n_kv_heads}) × width ({width}), \
                 width = max(top_blocks, init_blocks + local_blocks)"
            ),
        });
    }
    Ok(())
}

/// Block ids are written as int32: refuse keys with more blocks than that.
pub(super) fn check_block_ids_fit_i32(
    n_positions: usize,
    cfg: &BlockSparseConfig,
) -> Result<(), ArgumentError> {
    let n_blocks = n_positions.div_ceil(cfg.block_size.max(1));
    if n_blocks > i32::MAX as usize {
        return Err(ArgumentError::Invalid {
            argument: "index_k",
            message: format!(
                "index_k has {n_positions} positions, {n_blocks} blocks of {}: block ids \
                 past {} do not fit the int32 output",
                cfg.block_size,
                i32::MAX
            ),
        });
    }
    Ok(())
}

pub(super) fn bad_position<P: IndexLike>(i: usize, p: P) -> ArgumentError {
    ArgumentError::OutOfRange {
        argument: "query_pos",
        index: i,
        message: format!("query_pos[{i}] = {p} is out of range: a position must be >= 0"),
    }
}
