//! The baseline selectors (dense, local, random, sink + window) and the
//! oracle top-k (see the module docs of [`crate::attention`] for the rule).

use rand::seq::index;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::shape::check_query_pos;
use super::AttentionShape;
use crate::error::{check_len, checked_size, ArgumentError};
use crate::pool;

/// A score-free selection rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Selector {
    /// Every causal key.
    Dense,
    /// The `window` most recent keys, the query's own key included.
    Local {
        /// How many keys, counting back from the query.
        window: usize,
    },
    /// `budget` distinct keys drawn uniformly from the causal set.
    ///
    /// The draw for row `i` uses ChaCha8 (`rand_chacha`, a stable, documented
    /// stream cipher RNG) keyed by `seed` on stream `i`, and
    /// `rand::seq::index::sample` (both pinned exactly in `Cargo.toml`, so a
    /// seed draws the same keys from one release to the next). Rows are
    /// independent: row `i`'s draw does not depend on how many rows are asked.
    Random {
        /// Keys per row (fewer when the row has fewer causal keys).
        budget: usize,
        /// The draw's seed.
        seed: u64,
    },
    /// StreamingLLM: the first `sinks` keys plus the `window` most recent.
    SinkWindow {
        /// Attention-sink keys at the start of the sequence.
        sinks: usize,
        /// Most recent keys, the query's own included.
        window: usize,
    },
}

/// The largest row whose candidates fit in `i32` offsets.
const MAX_ROW: usize = i32::MAX as usize - 1;

impl Selector {
    /// The candidates of query row `row` (keys `0..=row` exist), ascending.
    pub fn row(&self, row: usize) -> Vec<i32> {
        let len = row.saturating_add(1);
        match *self {
            Selector::Dense => range_i32(0, len),
            Selector::Local { window } => range_i32(len.saturating_sub(window), len),
            Selector::Random { budget, seed } => random_draw(len, budget, seed, row as u64),
            Selector::SinkWindow { sinks, window } => {
                let tail_start = len.saturating_sub(window);
                let head_end = sinks.min(tail_start);
                let mut out = range_i32(0, head_end);
                out.extend(range_i32(tail_start, len));
                out
            }
        }
    }

    /// How many candidates row `row` has: the width a buffer needs for it.
    pub fn row_len(&self, row: usize) -> usize {
        let len = row.saturating_add(1);
        match *self {
            Selector::Dense => len,
            Selector::Local { window } => window.min(len),
            Selector::Random { budget, .. } => budget.min(len),
            Selector::SinkWindow { sinks, window } => {
                let tail = window.min(len);
                tail + sinks.min(len - tail)
            }
        }
    }

    /// Writes row `row`'s candidates into `out` (at least
    /// [`Self::row_len`] slots), then `-1` padding.
    fn fill_row(&self, row: usize, out: &mut [i32]) {
        /// Writes `start..end` at `out[n..]`; returns the new `n`.
        fn put(out: &mut [i32], n: usize, start: usize, end: usize) -> usize {
            for (o, x) in out[n..n + (end - start)].iter_mut().zip(start..end) {
                *o = x as i32;
            }
            n + (end - start)
        }
        let len = row + 1;
        let n = match *self {
            Selector::Dense => put(out, 0, 0, len),
            Selector::Local { window } => put(out, 0, len.saturating_sub(window), len),
            Selector::Random { budget, seed } => {
                let draw = random_draw(len, budget, seed, row as u64);
                out[..draw.len()].copy_from_slice(&draw);
                draw.len()
            }
            Selector::SinkWindow { sinks, window } => {
                let tail_start = len.saturating_sub(window);
                let n = put(out, 0, 0, sinks.min(tail_start));
                put(out, n, tail_start, len)
            }
        };
        out[n..].fill(-1);
    }

    /// Checks that every row is representable and fits `width` slots.
    fn check_rows(
        &self,
        rows: &[usize],
        argument: &'static str,
        width: usize,
    ) -> Result<(), ArgumentError> {
        for (index, &row) in rows.iter().enumerate() {
            if row > MAX_ROW {
                return Err(ArgumentError::OutOfRange {
                    argument,
                    index,
                    message: format!(
                        "{argument}[{index}]={row}: a row's keys must fit in i32 offsets \
                         (row <= {MAX_ROW})"
                    ),
                });
            }
            let need = self.row_len(row);
            if need > width {
                return Err(ArgumentError::Invalid {
                    argument: "width",
                    message: format!(
                        "width={width} cannot hold row {row} ({argument}[{index}]) of {self:?}, \
                         which has {need} candidates"
                    ),
                });
            }
        }
        Ok(())
    }

    /// The batched form: the candidates of each row in `rows` (query
    /// positions), written to `out` as `[rows.len(), width]`, ascending,
    /// `-1` padded. Refuses a row that needs more than `width` slots (see
    /// [`Self::row_len`]) or whose keys do not fit in `i32`. Rows are
    /// computed in parallel on the crate's pool; each row equals
    /// [`Self::row`].
    pub fn rows_into(
        &self,
        rows: &[usize],
        width: usize,
        out: &mut [i32],
    ) -> Result<(), ArgumentError> {
        let n = checked_size("out", &[rows.len(), width])?;
        check_len("out", out.len(), n, || {
            format!("[rows={}, width={width}]", rows.len())
        })?;
        self.check_rows(rows, "rows", width)?;
        pool::for_each_row_mut(out, width, 64, |r, row| self.fill_row(rows[r], row));
        Ok(())
    }

    /// The attention-shaped batched form: `out` is `[n_queries, n_kv_heads,
    /// width]` (a [`sparse_attention`](super::sparse_attention) selection), query `i`'s row being row
    /// `query_pos[i]`, the same for every KV head (score-free rules do not
    /// depend on the head). Same refusals as [`Self::rows_into`].
    pub fn selection_into(
        &self,
        query_pos: &[usize],
        n_kv_heads: usize,
        width: usize,
        out: &mut [i32],
    ) -> Result<(), ArgumentError> {
        let n = checked_size("out", &[query_pos.len(), n_kv_heads, width])?;
        check_len("out", out.len(), n, || {
            format!(
                "[n_queries={}, n_kv_heads={n_kv_heads}, width={width}]",
                query_pos.len()
            )
        })?;
        self.check_rows(query_pos, "query_pos", width)?;
        pool::for_each_row_mut(out, n_kv_heads.saturating_mul(width), 16, |i, heads| {
            let (first, rest) = heads.split_at_mut(width);
            self.fill_row(query_pos[i], first);
            for h in rest.chunks_mut(width) {
                h.copy_from_slice(first);
            }
        });
        Ok(())
    }
}

fn range_i32(start: usize, end: usize) -> Vec<i32> {
    (start..end).map(|x| x as i32).collect()
}

/// `min(budget, len)` distinct offsets from `0..len`, ascending, drawn on
/// ChaCha8 stream `stream` of `seed`.
pub(crate) fn random_draw(len: usize, budget: usize, seed: u64, stream: u64) -> Vec<i32> {
    let amount = budget.min(len);
    if amount == len {
        return range_i32(0, len);
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(stream);
    let mut out: Vec<i32> = index::sample(&mut rng, len, amount)
        .into_iter()
        .map(|x| x as i32)
        .collect();
    out.sort_unstable();
    out
}

/// The oracle: the `budget` keys with the largest true attention weights.
///
/// Needs the dense attention row (see [`crate::metrics::attention_probabilities`]),
/// so it is a diagnostic ceiling, never a production selector. Ranking is
/// the total order "weight descending, then key ascending" -- ties go to the
/// lower key -- with NaN read as `-inf` (it never outranks a real weight)
/// and `-0.0` as `+0.0`. Rows come back ascending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OracleTopK {
    /// Keys per row (fewer when the row has fewer causal keys).
    pub budget: usize,
}

/// The `budget` largest entries of `attention_row`, ties to the lower
/// index, ascending: the oracle over a row whose every entry is visible.
pub fn oracle_topk_row(attention_row: &[f64], budget: usize) -> Vec<i32> {
    let mut out = vec![-1; budget.min(attention_row.len())];
    let mut scratch = Vec::new();
    let n = top_k_into(attention_row, budget, &mut scratch, &mut out);
    out.truncate(n);
    out
}

/// Writes the top `min(budget, scores.len())` indices of `scores` into
/// `out`, ascending, then `-1` padding; returns how many.
fn top_k_into(scores: &[f64], budget: usize, idx: &mut Vec<usize>, out: &mut [i32]) -> usize {
    let n = scores.len();
    let amount = budget.min(n).min(out.len());
    if amount == n {
        for (j, o) in out[..n].iter_mut().enumerate() {
            *o = j as i32;
        }
    } else if amount > 0 {
        let key = |j: usize| {
            let s = scores[j];
            if s.is_nan() {
                f64::NEG_INFINITY
            } else {
                s + 0.0
            }
        };
        let order = |a: &usize, b: &usize| key(*b).total_cmp(&key(*a)).then(a.cmp(b));
        idx.clear();
        idx.extend(0..n);
        idx.select_nth_unstable_by(amount - 1, order);
        let chosen = &mut idx[..amount];
        chosen.sort_unstable();
        for (o, &j) in out.iter_mut().zip(chosen.iter()) {
            *o = j as i32;
        }
    }
    out[amount..].fill(-1);
    amount
}

impl OracleTopK {
    /// Query row `row`'s candidates from its dense attention row: the top
    /// `budget` of `attention_row[0..=row]` (entries past `row` are future
    /// keys and ignored; a row shorter than `row + 1` is all visible).
    pub fn row(&self, row: usize, attention_row: &[f64]) -> Vec<i32> {
        let visible = row.saturating_add(1).min(attention_row.len());
        oracle_topk_row(&attention_row[..visible], self.budget)
    }

    /// How many candidates row `row` has when its attention row has
    /// `row_len` entries.
    pub fn row_len(&self, row: usize, row_len: usize) -> usize {
        self.budget.min(row.saturating_add(1)).min(row_len)
    }

    /// The batched form: `attention` is `[rows.len(), row_len]`, attention
    /// row `r` belonging to query row `rows[r]`; `out` is
    /// `[rows.len(), width]`, each row equal to [`Self::row`], `-1` padded.
    /// Refuses a `width` narrower than a row needs.
    pub fn rows_into(
        &self,
        attention: &[f64],
        row_len: usize,
        rows: &[usize],
        width: usize,
        out: &mut [i32],
    ) -> Result<(), ArgumentError> {
        let na = checked_size("attention", &[rows.len(), row_len])?;
        check_len("attention", attention.len(), na, || {
            format!("[rows={}, row_len={row_len}]", rows.len())
        })?;
        let no = checked_size("out", &[rows.len(), width])?;
        check_len("out", out.len(), no, || {
            format!("[rows={}, width={width}]", rows.len())
        })?;
        self.check_width(rows, row_len, width, "rows")?;
        let budget = self.budget;
        pool::for_each_row_mut(out, width, 4, |r, o| {
            let visible = rows[r].saturating_add(1).min(row_len);
            let a = &attention[r * row_len..r * row_len + visible];
            top_k_into(a, budget, &mut Vec::new(), o);
        });
        Ok(())
    }

    fn check_width(
        &self,
        rows: &[usize],
        row_len: usize,
        width: usize,
        argument: &'static str,
    ) -> Result<(), ArgumentError> {
        if row_len > MAX_ROW + 1 {
            return Err(ArgumentError::Invalid {
                argument: "attention",
                message: format!("attention rows of {row_len} keys do not fit in i32 offsets"),
            });
        }
        for (index, &row) in rows.iter().enumerate() {
            let need = self.row_len(row, row_len);
            if need > width {
                return Err(ArgumentError::Invalid {
                    argument: "width",
                    message: format!(
                        "width={width} cannot hold {argument}[{index}]={row}, which has {need} \
                         candidates (budget={})",
                        self.budget
                    ),
                });
            }
        }
        Ok(())
    }

    /// The attention-shaped batched form: `attention` is the dense
    /// probabilities `[n_queries, n_q_heads, n_keys]`
    /// ([`crate::metrics::attention_probabilities`]); `out` is a
    /// [`sparse_attention`](super::sparse_attention) selection `[n_queries, n_kv_heads, width]`. A KV
    /// head's selection serves its whole query-head group, so each KV head
    /// ranks keys by the group's summed weight (summed in head order, in
    /// f64): the choice that maximises the group's total recall. Query `i`
    /// sees keys `0..=min(query_pos[i], n_keys - 1)`.
    pub fn selection_into(
        &self,
        attention: &[f64],
        shape: &AttentionShape,
        query_pos: &[usize],
        width: usize,
        out: &mut [i32],
    ) -> Result<(), ArgumentError> {
        shape.validate()?;
        let na = checked_size(
            "attention",
            &[shape.n_queries, shape.n_q_heads, shape.n_keys],
        )?;
        check_len("attention", attention.len(), na, || {
            format!(
                "[n_queries={}, n_q_heads={}, n_keys={}]",
                shape.n_queries, shape.n_q_heads, shape.n_keys
            )
        })?;
        check_query_pos(query_pos, shape.n_queries)?;
        let no = checked_size("out", &[shape.n_queries, shape.n_kv_heads, width])?;
        check_len("out", out.len(), no, || {
            format!(
                "[n_queries={}, n_kv_heads={}, width={width}]",
                shape.n_queries, shape.n_kv_heads
            )
        })?;
        self.check_width(query_pos, shape.n_keys, width, "query_pos")?;
        let g = shape.group();
        let (n_kv, n_keys, budget) = (shape.n_kv_heads, shape.n_keys, self.budget);
        pool::for_each_row_mut(out, width, 4, |r, o| {
            let (i, h) = (r / n_kv, r % n_kv);
            let visible = shape.visible(query_pos[i]);
            let base = (i * shape.n_q_heads + h * g) * n_keys;
            let mut sum = vec![0.0f64; visible];
            for head in 0..g {
                let a = &attention[base + head * n_keys..base + head * n_keys + visible];
                for (s, &x) in sum.iter_mut().zip(a) {
                    *s += x;
                }
            }
            top_k_into(&sum, budget, &mut Vec::new(), o);
        });
        Ok(())
    }
}
