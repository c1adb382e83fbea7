//! Baseline selectors: which keys a query row may attend to under a fixed,
//! score-free rule.
//!
//! A selector is asked for the candidates of query row `i` of a causal
//! sequence: keys `0..=i` exist, nothing after. Every selector returns
//! distinct, ascending, causal key offsets (`i32`, as the top-k buffers use),
//! never more than its budget. Each has a per-row entry point, so one row
//! costs work proportional to what it returns, never an `[L, L]` mask.
//!
//! The witness spec's null models are the last row of two of these:
//! [`crate::witness::random_null`] is row `L - 1` of [`Selector::Random`] and
//! [`crate::witness::locality_null`] is row `L - 1` of [`Selector::Local`].

use rand::seq::index;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// A score-free selection rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
