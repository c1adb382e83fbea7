//! The sizes of an attention call, and the checks a pass runs on its
//! arguments before it writes anything.

use crate::error::{check_len, checked_size, ArgumentError};

/// The usual softmax scale, `1 / sqrt(d_k)` (1 for `d_k = 0`).
pub fn softmax_scale(d_k: usize) -> f32 {
    if d_k == 0 {
        1.0
    } else {
        (1.0 / (d_k as f64).sqrt()) as f32
    }
}

/// The sizes of an attention call (see the module docs for the layouts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionShape {
    /// Queries (rows of `q`, entries of `query_pos`).
    pub n_queries: usize,
    /// Query heads per query; a multiple of `n_kv_heads`.
    pub n_q_heads: usize,
    /// KV heads per key (1 for MLA's latent head).
    pub n_kv_heads: usize,
    /// Query/key head dimension.
    pub d_k: usize,
    /// Value head dimension (for MLA, at most `d_k`).
    pub d_v: usize,
    /// Keys (positions) in the KV buffer.
    pub n_keys: usize,
}

impl AttentionShape {
    /// MLA: `n_heads` query heads sharing one latent KV head.
    pub fn mla(n_queries: usize, n_heads: usize, d_k: usize, d_v: usize, n_keys: usize) -> Self {
        AttentionShape {
            n_queries,
            n_q_heads: n_heads,
            n_kv_heads: 1,
            d_k,
            d_v,
            n_keys,
        }
    }

    /// Query heads per KV head (`n_q_heads / n_kv_heads`; 0 if
    /// `n_kv_heads == 0`, which [`Self::validate`] refuses).
    pub fn group(&self) -> usize {
        self.n_q_heads.checked_div(self.n_kv_heads).unwrap_or(0)
    }

    /// Refuses `n_kv_heads == 0` and an `n_q_heads` that is not a multiple
    /// of `n_kv_heads`.
    pub fn validate(&self) -> Result<(), ArgumentError> {
        if self.n_kv_heads == 0 {
            return Err(ArgumentError::Invalid {
                argument: "n_kv_heads",
                message: "n_kv_heads is 0: every query head needs a KV head to read".into(),
            });
        }
        if !self.n_q_heads.is_multiple_of(self.n_kv_heads) {
            return Err(ArgumentError::Invalid {
                argument: "n_q_heads",
                message: format!(
                    "n_q_heads={} is not a multiple of n_kv_heads={} (GQA groups must be equal)",
                    self.n_q_heads, self.n_kv_heads
                ),
            });
        }
        Ok(())
    }

    /// Checks `q` and `k` against the shape.
    pub(crate) fn check_qk(&self, q: &[f32], k: &[f32]) -> Result<(), ArgumentError> {
        self.validate()?;
        let nq = checked_size("q", &[self.n_queries, self.n_q_heads, self.d_k])?;
        check_len("q", q.len(), nq, || {
            format!(
                "[n_queries={}, n_q_heads={}, d_k={}]",
                self.n_queries, self.n_q_heads, self.d_k
            )
        })?;
        let nk = checked_size("k", &[self.n_keys, self.n_kv_heads, self.d_k])?;
        check_len("k", k.len(), nk, || {
            format!(
                "[n_keys={}, n_kv_heads={}, d_k={}]",
                self.n_keys, self.n_kv_heads, self.d_k
            )
        })
    }

    /// The keys query position `pos` sees: `min(pos + 1, n_keys)`.
    pub(crate) fn visible(&self, pos: usize) -> usize {
        pos.saturating_add(1).min(self.n_keys)
    }
}

pub(super) fn check_query_pos(query_pos: &[usize], n_queries: usize) -> Result<(), ArgumentError> {
    check_len("query_pos", query_pos.len(), n_queries, || {
        format!("one position per query, n_queries={n_queries}")
    })
}

fn check_scale(scale: f32) -> Result<(), ArgumentError> {
    if !scale.is_finite() {
        return Err(ArgumentError::Invalid {
            argument: "scale",
            message: format!("scale={scale} is not finite"),
        });
    }
    Ok(())
}

/// Checks a pass's arguments (all but the selection).
#[allow(clippy::too_many_arguments)]
pub(super) fn check_pass(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    v_stride: usize,
    shape: &AttentionShape,
    query_pos: &[usize],
    scale: f32,
    out: &[f32],
    lse: &[f32],
) -> Result<(), ArgumentError> {
    shape.check_qk(q, k)?;
    if v_stride < shape.d_v {
        return Err(ArgumentError::Invalid {
            argument: "v_stride",
            message: format!(
                "v_stride={v_stride} is less than d_v={}: value rows would overlap",
                shape.d_v
            ),
        });
    }
    let rows = checked_size("v", &[shape.n_keys, shape.n_kv_heads])?;
    let need = match rows.checked_sub(1) {
        None => 0,
        Some(last) => last
            .checked_mul(v_stride)
            .and_then(|x| x.checked_add(shape.d_v))
            .ok_or(ArgumentError::TooLarge { argument: "v" })?,
    };
    if v.len() < need {
        return Err(ArgumentError::Length {
            argument: "v",
            expected: need,
            actual: v.len(),
            shape: format!(
                "at least ((n_keys={} x n_kv_heads={}) - 1) x v_stride={} + d_v={}",
                shape.n_keys, shape.n_kv_heads, v_stride, shape.d_v
            ),
        });
    }
    check_query_pos(query_pos, shape.n_queries)?;
    check_scale(scale)?;
    let no = checked_size("out", &[shape.n_queries, shape.n_q_heads, shape.d_v])?;
    check_len("out", out.len(), no, || {
        format!(
            "[n_queries={}, n_q_heads={}, d_v={}]",
            shape.n_queries, shape.n_q_heads, shape.d_v
        )
    })?;
    let nl = checked_size("lse", &[shape.n_queries, shape.n_q_heads])?;
    check_len("lse", lse.len(), nl, || {
        format!(
            "[n_queries={}, n_q_heads={}]",
            shape.n_queries, shape.n_q_heads
        )
    })
}
