//! DeepSeek-V4's attention sets (sliding window + compressed entries), the
//! engines' combined index rows, the entry → tokens map, and GLM-5-Next's
//! pool expansion: the plain index arithmetic around the compressed-key
//! indexer ([`crate::indexer`] with `compress_ratio = m`).
//!
//! # The rules
//!
//! `m` is the compress ratio (V4's CSA: 4, HCA: 128), `W` the sliding window
//! (128), `p` a query's absolute token position.
//!
//! - **Visibility.** Compressed entry `w` is visible to `p` iff `w < (p + 1)
//!   / m` (integer division): it is written when its last source token
//!   `m(w + 1) − 1` arrives. transformers `models/deepseek_v4/
//!   modeling_deepseek_v4.py`, `DeepseekV4Indexer.forward` (`causal_threshold
//!   = (position_ids + 1) // self.compress_rate`); vLLM `vllm/models/
//!   deepseek_v4/hw_agnostic/attention/indexer.py`,
//!   `_build_prefill_chunk_metadata_kernel` (`(start_pos + 1 + offset) //
//!   COMPRESS_RATIO`).
//! - **The window** is `[max(0, p − W + 1), p]`, ascending, the query
//!   included: HF's `sliding_window_overlay` (`kv_idx > q_idx −
//!   sliding_window`) ANDed with causality ([`window_positions_into`]).
//! - **The attention set** of a CSA query is the window plus the indexer's
//!   top-k row over compressed entries; of an HCA query, the window plus
//!   every visible entry `0 .. min((p + 1) / m, T)` (`DeepseekV4HCACompressor`
//!   masks `entry_indices >= causal_threshold`; there is no HCA indexer)
//!   ([`visible_entries_into`]). HF attends a token in both the window and a
//!   selected entry twice; so do these sets (nothing is deduplicated).
//! - **The entry → tokens map** ([`compressed_entry_tokens_into`]): CSA entry
//!   `w` combines the overlapping window `[m(w − 1), m(w + 1))` (window `w −
//!   1`'s `Ca` half and window `w`'s `Cb` half; entry 0's first half has
//!   softmax weight 0, so it covers `[0, m)`): `DeepseekV4CSACompressor`.
//!   HCA entry `w` covers `[m·w, m(w + 1))`, no overlap
//!   (`DeepseekV4HCACompressor`).
//! - **vLLM's combined rows** ([`combine_topk_swa_indices_into`]), vLLM's
//!   `combine_topk_swa_indices` (`vllm/v1/attention/ops/deepseek_v4_ops/
//!   cache_utils.py`): for token `i` of request `b`, `pos = seq_len_b −
//!   query_len_b + (i − query_start_loc[b])`, `topk_len = min((pos + 1) / m,
//!   topk)`, `swa_len = min(pos + 1, W)`; the row is `topk_indices[i,
//!   :topk_len] + M·b`, then the window ascending at `M·b + N + (pos −
//!   swa_len + 1 − gather_start) + j` (`gather_start = seq_len_b −
//!   gather_len_b`), then −1 to `roundup(topk + W, 128)`; its length
//!   `topk_len + swa_len`. The top-k part is copied, not compacted: a −1
//!   among the first `topk_len` becomes `M·b − 1`, as in vLLM (LightSeek's
//!   tokenspeed `dsv4_combine_topk_swa_indices` compacts them instead).
//! - **GLM-5-Next's pools** ([`expand_entries_into`]): transformers
//!   `models/glm5_next/modeling_glm5_next.py` selects pools of `m` tokens
//!   `[m·w, m(w + 1))` with the same visibility rule, expands each selected
//!   pool to its tokens ascending in the row's pool order (an invalid pick to
//!   `m` × −1), appends the visible incomplete tail (`(p + 1) % m` tokens
//!   from `(p + 1) − (p + 1) % m`, in `m − 1` columns) right after the
//!   expanded block (`append_visible_tail`), and pads with −1.
//!
//! # Why it holds, what would break it
//!
//! Every output is a closed form of the positions, so the functions are
//! exact by construction; the refusals keep them so. Each function checks
//! every argument and every value it would write (int32 overflow included)
//! before writing anything, so a refused call leaves the outputs untouched.
//! [`combine_topk_swa_indices_into`] refuses what vLLM's kernel would
//! silently mis-index: `query_start_loc` not rising from 0 to `num_tokens`,
//! a request whose query is longer than its sequence or whose gathered
//! window is, a window starting before the gathered buffer, a top-k index
//! at or past `N` (it would read the window's tokens as entries), and a
//! window running into the next request's workspace (`N + gather_len_b >
//! M`). Changing the visibility threshold (e.g. to `p / m`), the window's
//! inclusive end, or the layout order (vLLM's FlashInfer decode rows put the
//! window first) would break equality with the engines.

use crate::error::{checked_size, ArgumentError};

/// vLLM's `_SPARSE_PREFILL_TOPK_ALIGNMENT`: the combined rows' width is a
/// multiple of it.
pub const SPARSE_PREFILL_TOPK_ALIGNMENT: usize = 128;

fn invalid(argument: &'static str, message: String) -> ArgumentError {
    ArgumentError::Invalid { argument, message }
}

fn out_of_range(argument: &'static str, index: usize, message: String) -> ArgumentError {
    ArgumentError::OutOfRange {
        argument,
        index,
        message,
    }
}

fn check_ratio(compress_ratio: usize) -> Result<(), ArgumentError> {
    if compress_ratio == 0 {
        return Err(invalid(
            "compress_ratio",
            "compress_ratio must be at least 1 (tokens per compressed entry)".into(),
        ));
    }
    Ok(())
}

fn check_out(
    argument: &'static str,
    actual: usize,
    expected: usize,
    shape: String,
) -> Result<(), ArgumentError> {
    if actual != expected {
        return Err(ArgumentError::OutputSize {
            argument,
            expected,
            actual,
            shape,
        });
    }
    Ok(())
}

/// A query position that every output derived from it fits int32
/// (`p + 1 <= i32::MAX`).
fn check_positions(query_pos: &[usize]) -> Result<(), ArgumentError> {
    match query_pos.iter().position(|&p| p >= i32::MAX as usize) {
        Some(i) => Err(out_of_range(
            "query_pos",
            i,
            format!(
                "query_pos[{i}] = {} is too large: at most {}",
                query_pos[i],
                i32::MAX - 1
            ),
        )),
        None => Ok(()),
    }
}

/// The sliding window of each query, `[max(0, p − W + 1), p]` ascending,
/// then −1: `out` int32 `[n, window_size]`.
pub fn window_positions_into(
    query_pos: &[usize],
    window_size: usize,
    out: &mut [i32],
) -> Result<(), ArgumentError> {
    check_positions(query_pos)?;
    let need = checked_size("out", &[query_pos.len(), window_size])?;
    check_out(
        "out",
        out.len(),
        need,
        format!("[n_queries={}, window_size={window_size}]", query_pos.len()),
    )?;
    if window_size == 0 {
        return Ok(());
    }
    for (row, &p) in out.chunks_exact_mut(window_size).zip(query_pos) {
        let len = (p + 1).min(window_size);
        let start = p + 1 - len;
        for (j, slot) in row.iter_mut().enumerate() {
            // start + j <= p < i32::MAX (check_positions).
            *slot = if j < len { (start + j) as i32 } else { -1 };
        }
    }
    Ok(())
}

/// Every compressed entry each query sees, `0 .. min((p + 1) / m,
/// n_entries)` ascending, then −1: `out` int32 `[n, n_entries]` (HCA's set;
/// with `m = 1`, every causal token).
pub fn visible_entries_into(
    query_pos: &[usize],
    compress_ratio: usize,
    n_entries: usize,
    out: &mut [i32],
) -> Result<(), ArgumentError> {
    check_ratio(compress_ratio)?;
    check_positions(query_pos)?;
    if n_entries > i32::MAX as usize {
        return Err(invalid(
            "n_entries",
            format!("n_entries is too large: at most {}", i32::MAX),
        ));
    }
    let need = checked_size("out", &[query_pos.len(), n_entries])?;
    check_out(
        "out",
        out.len(),
        need,
        format!("[n_queries={}, n_entries={n_entries}]", query_pos.len()),
    )?;
    if n_entries == 0 {
        return Ok(());
    }
    for (row, &p) in out.chunks_exact_mut(n_entries).zip(query_pos) {
        let seen = ((p + 1) / compress_ratio).min(n_entries);
        for (j, slot) in row.iter_mut().enumerate() {
            *slot = if j < seen { j as i32 } else { -1 };
        }
    }
    Ok(())
}

/// The tokens `[start, end)` each entry covers, as `out` int32 `[len, 2]`:
/// CSA's overlapping `[max(0, m(w − 1)), m(w + 1))` with `overlap`, HCA's
/// (and GLM-5-Next's pools') `[m·w, m(w + 1))` without; a −1 entry is `(−1,
/// −1)`, any other negative entry is refused.
pub fn compressed_entry_tokens_into(
    entries: &[i32],
    compress_ratio: usize,
    overlap: bool,
    out: &mut [i32],
) -> Result<(), ArgumentError> {
    check_ratio(compress_ratio)?;
    let need = checked_size("out", &[entries.len(), 2])?;
    check_out(
        "out",
        out.len(),
        need,
        format!("[..., 2] for {} entries", entries.len()),
    )?;
    let m = compress_ratio as i64;
    for (i, &w) in entries.iter().enumerate() {
        if w < -1 {
            return Err(out_of_range(
                "entries",
                i,
                format!("entries[{i}] = {w} is negative and not the -1 padding"),
            ));
        }
        if w >= 0 && (w as i64 + 1) * m > i32::MAX as i64 {
            return Err(out_of_range(
                "entries",
                i,
                format!(
                    "entries[{i}] = {w} ends at token {} (compress_ratio={m}), past int32",
                    (w as i64 + 1) * m
                ),
            ));
        }
    }
    for (pair, &w) in out.chunks_exact_mut(2).zip(entries) {
        let (start, end) = match w {
            -1 => (-1, -1),
            w => {
                let w = w as i64;
                let start = if overlap { (m * (w - 1)).max(0) } else { m * w };
                (start, m * (w + 1))
            }
        };
        // Both fit int32: checked above.
        pair[0] = start as i32;
        pair[1] = end as i32;
    }
    Ok(())
}

/// The columns [`expand_entries_into`] writes before padding: `k·m`, plus
/// `m − 1` with the tail.
pub fn expanded_width(k: usize, compress_ratio: usize, tail: bool) -> Option<usize> {
    let tail_cols = if tail {
        compress_ratio.saturating_sub(1)
    } else {
        0
    };
    k.checked_mul(compress_ratio)?.checked_add(tail_cols)
}

/// Selected entries (pools of `m` tokens `[m·w, m(w + 1))`) expanded to
/// token rows: row `i` of `entry_rows` (int32 `[n, k]`, entry ids then −1)
/// becomes, at columns `j·m .. (j + 1)·m`, entry `j`'s tokens ascending (−1
/// entries: `m` × −1); with `tail`, the `m − 1` columns after them hold the
/// visible incomplete tail, `(p + 1) % m` tokens from `(p + 1) − (p + 1) %
/// m`, then −1; −1 to `width`. An entry the query cannot see yet (`w >= (p +
/// 1) / m`), a negative entry other than −1, or a `width` below
/// [`expanded_width`] is refused.
pub fn expand_entries_into(
    entry_rows: &[i32],
    k: usize,
    query_pos: &[usize],
    compress_ratio: usize,
    tail: bool,
    width: usize,
    out: &mut [i32],
) -> Result<(), ArgumentError> {
    check_ratio(compress_ratio)?;
    check_positions(query_pos)?;
    let n = query_pos.len();
    let rows_len = checked_size("entry_rows", &[n, k])?;
    crate::error::check_len("entry_rows", entry_rows.len(), rows_len, || {
        format!("[n_queries={n}, k={k}]")
    })?;
    let min_width = expanded_width(k, compress_ratio, tail)
        .ok_or(ArgumentError::TooLarge { argument: "width" })?;
    if width < min_width {
        return Err(invalid(
            "width",
            format!(
                "width={width} is below the {min_width} columns the expansion writes (k·m{})",
                if tail { " + m − 1" } else { "" }
            ),
        ));
    }
    let need = checked_size("out", &[n, width])?;
    check_out(
        "out",
        out.len(),
        need,
        format!("[n_queries={n}, width={width}]"),
    )?;
    let m = compress_ratio;
    for (i, &p) in query_pos.iter().enumerate() {
        let seen = (p + 1) / m;
        for (j, &w) in entry_rows[i * k..(i + 1) * k].iter().enumerate() {
            let bad = w < -1 || (w >= 0 && w as usize >= seen);
            if bad {
                let why = if w < -1 {
                    "is negative and not the -1 padding".to_string()
                } else {
                    format!("is not visible to query_pos[{i}] = {p} (entries w < (p + 1) // {m} = {seen})")
                };
                return Err(out_of_range(
                    "entry_rows",
                    i * k + j,
                    format!("entry_rows[{i}, {j}] = {w} {why}"),
                ));
            }
        }
    }
    if width == 0 {
        return Ok(());
    }
    for (i, (row, &p)) in out.chunks_exact_mut(width).zip(query_pos).enumerate() {
        row.fill(-1);
        for (j, &w) in entry_rows[i * k..(i + 1) * k].iter().enumerate() {
            if w >= 0 {
                for (t, slot) in row[j * m..(j + 1) * m].iter_mut().enumerate() {
                    // m·w + t <= p < i32::MAX: w < (p + 1) / m.
                    *slot = (w as usize * m + t) as i32;
                }
            }
        }
        if tail {
            let count = (p + 1) % m;
            let start = p + 1 - count;
            for t in 0..count {
                // start + t <= p.
                row[k * m + t] = (start + t) as i32;
            }
        }
    }
    Ok(())
}

/// The arguments of vLLM's `combine_topk_swa_indices`, in its order.
pub struct CombineInputs<'a> {
    /// int32 `[num_tokens, topk_width]`, `topk_width >= topk`.
    pub topk_indices: &'a [i32],
    /// `topk_indices`' rows.
    pub num_tokens: usize,
    pub topk_width: usize,
    /// `[num_reqs + 1]`, from 0 rising to `num_tokens`.
    pub query_start_loc: &'a [usize],
    /// `[num_reqs]`.
    pub seq_lens: &'a [usize],
    /// `[num_reqs]`.
    pub gather_lens: &'a [usize],
    pub window_size: usize,
    pub compress_ratio: usize,
    pub topk: usize,
    /// The per-request workspace stride.
    pub m: usize,
    /// The window's offset inside a request's workspace.
    pub n: usize,
}

/// The width of vLLM's combined rows, `roundup(topk + window_size, 128)`.
pub fn combined_width(topk: usize, window_size: usize) -> Option<usize> {
    let a = SPARSE_PREFILL_TOPK_ALIGNMENT;
    Some(topk.checked_add(window_size)?.checked_add(a - 1)? / a * a)
}

impl CombineInputs<'_> {
    /// Every refusal, before anything is written.
    fn check(&self, num_tokens: usize) -> Result<(), ArgumentError> {
        check_ratio(self.compress_ratio)?;
        let (qsl, reqs) = (self.query_start_loc, self.seq_lens.len());
        if self.topk_width < self.topk {
            return Err(invalid(
                "topk_indices",
                format!(
                    "topk_indices has {} columns, fewer than topk={}",
                    self.topk_width, self.topk
                ),
            ));
        }
        if qsl.len() != reqs + 1 {
            return Err(invalid(
                "query_start_loc",
                format!(
                    "query_start_loc must be [num_reqs + 1 = {}] (seq_lens has {reqs}), got [{}]",
                    reqs + 1,
                    qsl.len()
                ),
            ));
        }
        if qsl[0] != 0 || qsl[reqs] != num_tokens {
            return Err(invalid("query_start_loc", format!(
                "query_start_loc must run from 0 to num_tokens={num_tokens} (topk_indices' rows), got {} .. {}",
                qsl[0], qsl[reqs])));
        }
        let limit = i32::MAX as u128;
        // Rising first: every request's rows then lie inside topk_indices.
        for b in 0..reqs {
            if qsl[b + 1] < qsl[b] {
                return Err(out_of_range(
                    "query_start_loc",
                    b + 1,
                    format!(
                        "query_start_loc[{}] = {} is below query_start_loc[{b}] = {}",
                        b + 1,
                        qsl[b + 1],
                        qsl[b]
                    ),
                ));
            }
        }
        for b in 0..reqs {
            let (seq, gather, qlen) = (self.seq_lens[b], self.gather_lens[b], qsl[b + 1] - qsl[b]);
            if qlen > seq {
                return Err(out_of_range(
                    "seq_lens",
                    b,
                    format!(
                        "seq_lens[{b}] = {seq} is shorter than request {b}'s query ({qlen} tokens)"
                    ),
                ));
            }
            if gather > seq {
                return Err(out_of_range(
                    "gather_lens",
                    b,
                    format!("gather_lens[{b}] = {gather} is longer than seq_lens[{b}] = {seq}"),
                ));
            }
            let base = self.m as u128 * b as u128;
            if qlen > 0 {
                let pos = seq - qlen;
                let start = pos + 1 - (pos + 1).min(self.window_size);
                if start < seq - gather {
                    return Err(out_of_range("gather_lens", b, format!(
                        "request {b}'s first window starts at token {start}, before its gathered tokens \
                         (gather_lens[{b}] = {gather} starts them at {})", seq - gather)));
                }
                if base + self.n as u128 + gather as u128 > limit + 1 {
                    return Err(invalid(
                        "M",
                        format!(
                            "request {b}'s window indices pass int32 (M={}, N={})",
                            self.m, self.n
                        ),
                    ));
                }
            }
            if b + 1 < reqs && self.n as u128 + gather as u128 > self.m as u128 {
                return Err(invalid("M", format!(
                    "M={} is below N + gather_lens[{b}] = {}: request {b}'s window would run into request {}'s workspace",
                    self.m, self.n + gather, b + 1)));
            }
            for i in qsl[b]..qsl[b + 1] {
                let pos = seq - qlen + (i - qsl[b]);
                let topk_len = ((pos + 1) / self.compress_ratio).min(self.topk);
                let row = &self.topk_indices[i * self.topk_width..][..topk_len];
                for (j, &v) in row.iter().enumerate() {
                    if v >= 0 && v as usize >= self.n {
                        return Err(out_of_range("topk_indices", i * self.topk_width + j, format!(
                            "topk_indices[{i}, {j}] = {v} is at or past N={}: it would read the window's tokens", self.n)));
                    }
                    if base as i128 + v as i128 > limit as i128 {
                        return Err(invalid(
                            "M",
                            format!("topk_indices[{i}, {j}] + M·{b} passes int32 (M={})", self.m),
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

/// vLLM's `combine_topk_swa_indices` into `combined_indices` (int32
/// `[num_tokens, combined_width(topk, window_size)]`) and `combined_lens`
/// (int32 `[num_tokens]`); see the module docs for the rule and the
/// refusals.
pub fn combine_topk_swa_indices_into(
    inputs: &CombineInputs<'_>,
    combined_indices: &mut [i32],
    combined_lens: &mut [i32],
) -> Result<(), ArgumentError> {
    let s = inputs;
    if s.seq_lens.len() != s.gather_lens.len() {
        return Err(invalid(
            "gather_lens",
            format!(
                "gather_lens must be [num_reqs={}], got [{}]",
                s.seq_lens.len(),
                s.gather_lens.len()
            ),
        ));
    }
    let num_tokens = s.num_tokens;
    let rows = checked_size("topk_indices", &[num_tokens, s.topk_width])?;
    crate::error::check_len("topk_indices", s.topk_indices.len(), rows, || {
        format!("[num_tokens={num_tokens}, {}]", s.topk_width)
    })?;
    let width = combined_width(s.topk, s.window_size)
        .filter(|&w| w <= i32::MAX as usize)
        .ok_or(ArgumentError::TooLarge {
            argument: "window_size",
        })?;
    s.check(num_tokens)?;
    let need = checked_size("out", &[num_tokens, width])?;
    check_out(
        "out",
        combined_indices.len(),
        need,
        format!("[num_tokens={num_tokens}, {width}]"),
    )?;
    check_out(
        "lens_out",
        combined_lens.len(),
        num_tokens,
        format!("[num_tokens={num_tokens}]"),
    )?;
    let qsl = s.query_start_loc;
    for b in 0..s.seq_lens.len() {
        let (seq, gather) = (s.seq_lens[b], s.gather_lens[b]);
        let qlen = qsl[b + 1] - qsl[b];
        if qlen == 0 {
            continue;
        }
        // M·b fits int32 when request b writes anything (checked).
        let base = s.m as i64 * b as i64;
        for i in qsl[b]..qsl[b + 1] {
            let pos = seq - qlen + (i - qsl[b]);
            let topk_len = ((pos + 1) / s.compress_ratio).min(s.topk);
            let swa_len = (pos + 1).min(s.window_size);
            let row = &mut combined_indices[i * width..(i + 1) * width];
            row.fill(-1);
            let src = &s.topk_indices[i * s.topk_width..][..topk_len];
            for (slot, &v) in row.iter_mut().zip(src) {
                // Fits int32: checked (v < N, M·b + v <= i32::MAX; a
                // negative v + M·b lies in [i32::MIN, i32::MAX]).
                *slot = (v as i64 + base) as i32;
            }
            // The window start is at or after gather_start (checked).
            let first = base + s.n as i64 + (pos + 1 - swa_len - (seq - gather)) as i64;
            for (j, slot) in row[topk_len..topk_len + swa_len].iter_mut().enumerate() {
                // <= M·b + N + gather_len − 1 <= i32::MAX (checked).
                *slot = (first + j as i64) as i32;
            }
            combined_lens[i] = (topk_len + swa_len) as i32;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
