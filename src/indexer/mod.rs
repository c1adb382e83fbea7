//! DeepSeek's lightning indexer (DeepSeek-V3.2/V4, GLM-5: "DSA"): the
//! learned top-k that segment witnesses sit on, exact and deterministic.
//!
//! # The rule
//!
//! A query at position `p` sees keys `0 .. L`, `L = min(p + 1, T)` (a
//! position past the keys is clipped to what exists, as block selection
//! does). Over **compressed keys** (DeepSeek-V4's CSA and HCA layers, GLM-5
//! pools: each key an entry summarising `m` tokens, `compress_ratio = m`)
//! `L = min((p + 1) / m, T)`: entry `w` exists once token `(w + 1)·m − 1`
//! has arrived, and `p` stays the token position. A query that sees no
//! entry yet (`p < m − 1`) gets a row of `-1` (docs/compressed-keys.md). With `H` index heads `q_h`, per-query head weights `w_h` (the
//! caller folds the softmax scale, `H^-1/2` and any query scale in, as vLLM
//! does), index keys `k_t` and a per-key scale `c_t` (1 without scales):
//!
//! ```text
//!   score(t) = c_t · Σ_h w_h · max(q_h · k_t, 0)
//! ```
//!
//! The row is the `topk` positions of `[0, L)` with the largest scores **in
//! real arithmetic** (of the decoded operands; ties to the lower position),
//! listed **in rank order** of the float32 scores the kernels compute (the
//! ones `scores_out` reports): the best first, then down one total order —
//! descending score, ties to the lower position — then `-1`. Rows with
//! `L ≤ topk` hold all of `0 .. L` (still in that order). Entries are
//! row-relative int32 offsets, exactly what `scatter_topology_witnesses`
//! and `sparse_attention` take. The float32 scores screen; the positions
//! their rounding can have misplaced at the row's threshold are re-scored
//! in float64 (`exact.rs`), so a row is what `kvselect check` accepts at
//! `rtol = 0`, and differs from the float32 scores' own top-k only where
//! rounding decided a near tie.
//!
//! - **Ties are structural**: after the ReLU a plateau of exact zeros is
//!   common, and it goes to the lowest positions.
//! - **`-0.0` and `+0.0` are one score**: every score is canonicalised
//!   (`+ 0.0`) before it is ranked on its bits.
//! - **NaN ranks below every number**, `-inf` included, and never displaces
//!   a finite score. The ReLU keeps a NaN dot product NaN (`x <= 0 ? 0 : x`;
//!   a SIMD `max(x, 0)` with the operands the other way round would turn it
//!   into 0 and let a NaN key join the zero plateau). `±inf` inputs give
//!   IEEE results: a `+inf` dot product times a positive weight is `+inf`
//!   (ranked first), times a zero weight NaN (ranked last); a `-inf` one is
//!   0 after the ReLU; `+inf − inf` across heads is NaN.
//!
//! # The family's options
//!
//! One signature covers the indexer family (NVIDIA/cudnn-frontend#838,
//! `cudnn.sparse_attention.indexer_topk`: DeepSeek-V4, GLM-5.x, Qwen's QSA
//! and MiniMax's MSA as one call; [`IndexerOptions`]):
//!
//! - **`activation`**: the ReLU, or none (`score(t) = c_t · Σ_h w_h (q_h ·
//!   k_t)`, negative scores ranked like any). A const parameter of every
//!   kernel: the ReLU's instructions are unchanged, none drops them.
//! - **No weights** is `w_h = 1` (Qwen's QSA: huggingface/transformers
//!   `src/transformers/models/qwen4_exp/modeling_qwen4_exp.py` @ 009e78d,
//!   `Qwen4ExpTextQSAIndexer.forward`, `relu(q · k̄).sum(heads)`): the
//!   binding passes weights of one, and `fma(1, x, acc)` rounds as `acc + x`
//!   does, so the rows are the sum of heads' bit for bit.
//! - **Forced first / last entries** count inside the budget `topk − S`
//!   (refused past it): a row that cannot hold all `L` visible entries holds
//!   the first `force_first` and the last `force_last`, and the rest of the
//!   budget is the best of the entries between them (one contiguous range:
//!   the selection and its exact refinement run over it, `select.rs`); a
//!   row with `L ≤ topk − S` holds every visible entry once, so a forced
//!   prefix and suffix that overlap in a short causal prefix count once
//!   (the contract's tests, NVIDIA/cudnn-frontend#832: "force_first /
//!   force_last land inside the budget, interaction with short causal
//!   prefixes (prefix < k)"). A row lists its members in the one total
//!   order of their float32 scores, forced ones included.
//! - **The layout**: rank order, or cuDNN's ascending and compact (its
//!   `topk_length` the count of entries), `-1` past the entries.
//! - **The score pool** (MiniMax's MSA): blocks of `score_pool` visible
//!   entries, the last partial, each scored by its largest entry's score
//!   (NaN absent, a block of NaN `-inf`), or with `ScoreType::Lse` by the
//!   log-sum-exp of its entries' scaled scores (SGLang's MiniMax-M3
//!   selector; `lse.rs`, exact up to its stated bound); the row holds block
//!   ids and the forced entries count blocks. Exact by the block intervals
//!   of `exact::refine_pooled`. MiniMax-M3's block rule
//!   ([`crate::block_sparse`]) is this rule with one head per KV head, no
//!   weights, no activation: its rows are equal, its kernels are not shared
//!   (docs/indexer.md: their summation orders differ, so their float32
//!   scores do).
//!
//! The defaults are the rule above, bit for bit (the same code path: an
//! empty forced range, the ReLU kernels).
//!
//! # Numbers: one summation order, everywhere
//!
//! `q_h · k_t` is one fused multiply-add chain over the dimensions in order,
//! `dot = fma(q_hi, k_ti, dot)` for `i = 0 .. d` from `dot = +0.0`; the heads
//! are then summed in head order, `acc = fma(w_h, relu_h, acc)` from
//! `acc = +0.0`, and the sum multiplied by `c_t`. The SIMD kernels put keys
//! across vector lanes (a block of keys transposed, dimension-major), so each
//! lane runs exactly that scalar chain for its key and nothing is ever summed
//! across lanes; the portable kernel runs it with `f32::mul_add`. So every
//! SIMD level and thread count gives the same bits, and the same float64
//! re-scores of the same near ties: the same rows.
//!
//! # Batching
//!
//! Queries that read the same keys (a prefill's, one sequence's) are scored
//! in groups: each block of keys is read, decoded and transposed once for
//! the group, and the key chunks go across the pool (`run.rs`). Rows are
//! selected by an exact partial select on one integer per key (`select.rs`).
//!
//! # Witnesses in the same pass
//!
//! With `num_segments = S` (1..=64), each row is the serving row that covers
//! every segment: the top `max(topk − S, 0)` positions in rank order, then
//! `scatter_topology_witnesses` of that row widened to `topk` slots with
//! `-1`, with `context_lens = L` — the same call, so the two-call
//! composition and the fused one are equal by construction.
//!
//! # Formats
//!
//! Keys and queries are float32, float16, bfloat16 or float8 e4m3fn
//! ([`crate::keys`]), decoded exactly a block of keys at a time (as the
//! block is transposed): scoring decoded values equals scoring the same
//! values given as float32, bit for bit.

mod exact;
mod kernels;
mod lse;
mod paged;
mod run;
mod screen;
mod select;

/// Runs the indexer's kernel families at `isa` (the reach test's probe).
#[cfg(test)]
pub(crate) fn dispatch_probe(isa: crate::simd::Isa) {
    kernels::probe(isa);
    exact::probe(isa);
}

pub use crate::keys::{BlockTable, PageLayout, PagedCache};
pub use paged::{indexer_topk_paged_into, indexer_topk_paged_with_into, PagedInputs};

#[cfg(test)]
pub(crate) use select::rank_key;

use crate::error::{check_len, checked_size, ArgumentError};
use crate::keys::Encoded;
use crate::witness::MAX_TOPOLOGY_SEGMENTS;
use crate::{packed, simd};
use kernels::{KeyTerms, Keys, Scratch, Want};
use run::{Queries, Rows};
use select::RowRule;

/// Keys scored per parallel task: one chunk of them against a group of
/// queries (the chunk's scores stay in cache; each block of 32 keys in it is
/// decoded and transposed once for the whole group).
const KEY_CHUNK: usize = 1024;

/// The shape of an indexer call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexerShape {
    /// Queries (rows of the output).
    pub n_queries: usize,
    /// Index heads per query.
    pub n_heads: usize,
    /// Index head dimension.
    pub d: usize,
    /// Keys `T`.
    pub n_keys: usize,
}

/// The inputs of a single-sequence call (flat, row-major).
#[derive(Debug, Clone, Copy)]
pub struct IndexerInputs<'a> {
    /// `[n_queries, n_heads, d]`.
    pub q: Encoded<'a>,
    /// `[n_queries, n_heads]`, the folded head weights.
    pub weights: &'a [f32],
    /// `[n_keys, d]`.
    pub k: Encoded<'a>,
    /// `[n_keys]`, or `None` for a scale of 1.
    pub key_scale: Option<&'a [f32]>,
    /// `[n_queries]`: each query's token position.
    pub query_pos: &'a [usize],
    /// Tokens per key: 1 for token-level keys (DeepSeek-V3.2), `m` for keys
    /// that are compressed entries of `m` tokens each (DeepSeek-V4's CSA
    /// `m = 4`): a query at token `p` sees `min((p + 1) / m, T)` keys.
    pub compress_ratio: usize,
}

/// The activation between each head's dot product and its weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Activation {
    /// `max(x, 0)`, NaN kept (DeepSeek-V3.2/V4, GLM-5, Qwen's QSA).
    #[default]
    Relu,
    /// The dot product as it is (MiniMax's MSA): scores may be negative.
    None,
}

/// How a row lists its entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RowLayout {
    /// Rank order of the float32 scores (best first), then `-1`.
    #[default]
    Ranked,
    /// Ascending positions, compact, then `-1`: cuDNN's `indexer_topk`
    /// output (NVIDIA/cudnn-frontend#838), whose `topk_length` is the count
    /// of entries.
    Ascending,
}

/// How the score pool scores a block of entries.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum ScoreType {
    /// The largest entry's score, NaN absent, a block of NaN `-inf`
    /// (cuDNN's MSA row, MiniMax-M3's block rule).
    #[default]
    Max,
    /// `ln Σ_t exp(sm_scale · s_t)` over the block's entries, a block with a
    /// NaN entry `-inf` (SGLang's MiniMax-M3 selector, `score_type="lse"`:
    /// the same order as its base-2 log). `sm_scale` finite and above 0.
    /// Exact up to the bound of `lse.rs` (docs/indexer.md).
    Lse {
        /// The scores' scale inside the exponential (SGLang: `d^-1/2`).
        sm_scale: f32,
    },
}

/// The indexer family's options (NVIDIA/cudnn-frontend#838's
/// `cudnn.sparse_attention.indexer_topk` contract): the activation, forced
/// first / last entries and the output layout. "No weights" is head
/// weights of one ([`IndexerInputs::weights`] all `1.0`: the same bits,
/// see `exact.rs`). The default is today's rule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IndexerOptions {
    pub activation: Activation,
    /// The first `force_first` visible entries are in every row that cannot
    /// hold every visible entry, inside the budget (`topk − num_segments`).
    pub force_first: usize,
    /// The last `force_last` visible entries, likewise.
    pub force_last: usize,
    pub layout: RowLayout,
    /// The score pool: blocks of `score_pool` visible entries scored as one,
    /// by the max of their entries' scores (NaN absent; MiniMax's MSA, 128);
    /// the rows then hold block ids and the forced entries count blocks. 1 is
    /// no pool; 0 is refused (so is a pool with witnesses).
    pub score_pool: usize,
    /// How a block of the pool is scored ([`ScoreType::Lse`] needs a pool).
    pub score_type: ScoreType,
}

impl Default for IndexerOptions {
    fn default() -> Self {
        IndexerOptions {
            activation: Activation::Relu,
            force_first: 0,
            force_last: 0,
            layout: RowLayout::Ranked,
            score_pool: 1,
            score_type: ScoreType::Max,
        }
    }
}

impl IndexerOptions {
    fn rule(&self) -> RowRule {
        RowRule {
            force_first: self.force_first,
            force_last: self.force_last,
            ascending: self.layout == RowLayout::Ascending,
            pool: self.score_pool,
            score: self.score_type,
        }
    }

    fn relu(&self) -> bool {
        self.activation == Activation::Relu
    }

    /// Refuses forced entries that do not fit the budget `topk −
    /// num_segments` (naming `force_first` when it alone does not fit,
    /// else `force_last`).
    fn check(&self, topk: usize, num_segments: usize) -> Result<(), ArgumentError> {
        let invalid = |argument, message: String| Err(ArgumentError::Invalid { argument, message });
        if self.score_pool == 0 {
            return invalid(
                "score_pool",
                "score_pool=0: a block holds at least one entry (1: no pool)".into(),
            );
        }
        if let ScoreType::Lse { sm_scale } = self.score_type {
            if self.score_pool < 2 {
                let message = format!(
                    "score_type='lse' with score_pool={}: the log-sum-exp scores a block of the \
                     pool (score_pool >= 2)",
                    self.score_pool
                );
                return invalid("score_type", message);
            }
            if !(sm_scale.is_finite() && sm_scale > 0.0) {
                let message = format!("sm_scale must be finite and above 0, got {sm_scale}");
                return invalid("sm_scale", message);
            }
        }
        if self.score_pool > 1 && num_segments > 0 {
            let message = format!(
                "score_pool={} with num_segments={num_segments}: witnesses cover token positions, \
                 a pooled row holds block ids",
                self.score_pool
            );
            return invalid("score_pool", message);
        }
        let budget = topk.saturating_sub(num_segments);
        let (f0, f1) = (self.force_first, self.force_last);
        if f0.saturating_add(f1) <= budget {
            return Ok(());
        }
        let argument = if f0 > budget {
            "force_first"
        } else {
            "force_last"
        };
        Err(ArgumentError::Invalid {
            argument,
            message: format!(
                "force_first={f0} + force_last={f1} forced entries do not fit the budget \
                 topk - num_segments = {budget}: forced entries count inside it"
            ),
        })
    }
}

/// Keys a query at token position `pos` sees, of `n_keys`: the entries
/// completed by token `pos`, `(pos + 1) / ratio` (entry `w` is written when
/// token `(w + 1)·ratio − 1` arrives), clipped to the keys that exist.
/// `ratio` is at least 1 (checked by every entry point).
#[inline]
pub(crate) fn visible(pos: usize, ratio: usize, n_keys: usize) -> usize {
    (pos.saturating_add(1) / ratio).min(n_keys)
}

/// The lightning indexer's top-k of every query, into `out`
/// (`[n_queries, topk]` int32, rank order then `-1`; see the module docs),
/// and optionally each selected entry's score into `scores`
/// (`[n_queries, topk]`, NaN where the row holds `-1`). `num_segments` in
/// `1..=64` writes the reserved-tail witness row; 0 is off.
///
/// Refuses, before writing anything, a buffer whose length does not match
/// its shape, `d = 0`, more than `i32::MAX` keys, `topk > i32::MAX` and
/// `num_segments > 64`.
pub fn indexer_topk_into(
    shape: &IndexerShape,
    inputs: &IndexerInputs<'_>,
    topk: usize,
    num_segments: usize,
    out: &mut [i32],
    scores: Option<&mut [f32]>,
) -> Result<(), ArgumentError> {
    let options = IndexerOptions::default();
    indexer_topk_with_into(shape, inputs, topk, num_segments, &options, out, scores)
}

/// [`indexer_topk_into`] with the family's options ([`IndexerOptions`]):
/// the activation, forced first / last entries and the layout. The default
/// options give [`indexer_topk_into`]'s rows, bit for bit. Refuses besides
/// forced entries that do not fit `topk − num_segments`.
pub fn indexer_topk_with_into(
    shape: &IndexerShape,
    inputs: &IndexerInputs<'_>,
    topk: usize,
    num_segments: usize,
    options: &IndexerOptions,
    out: &mut [i32],
    scores: Option<&mut [f32]>,
) -> Result<(), ArgumentError> {
    check(
        shape,
        inputs,
        topk,
        num_segments,
        out.len(),
        scores.as_deref(),
    )?;
    options.check(topk, num_segments)?;
    let rows = Rows {
        topk,
        num_segments,
        rule: options.rule(),
        out,
        scores,
    };
    run_queries(shape, inputs, options.relu(), rows, |_| (0, shape.n_keys));
    Ok(())
}

/// Every query's score of every key it sees, `out` `[n_queries, n_keys]`
/// (NaN past each query's context `L`): the exact scores
/// [`indexer_topk_into`] ranks, bit for bit — what an engine's rows are
/// checked against ([`crate::check`]). With `magnitude`, instead the bound
/// `m_t = |c_t| · Σ_h |w_h| · Σ_i |q_hi · k_ti|` a lower-precision engine's
/// rounding of `score(t)` scales with (the check's `rtol` multiplies it).
/// Scored group by group as the top-k is (`run.rs`), so the bits agree.
///
/// Refuses, before writing anything, the inputs [`indexer_topk_into`]
/// refuses and an `out` that is not `[n_queries, n_keys]`.
pub fn indexer_scores_into(
    shape: &IndexerShape,
    inputs: &IndexerInputs<'_>,
    magnitude: bool,
    out: &mut [f32],
) -> Result<(), ArgumentError> {
    indexer_scores_with_into(shape, inputs, Activation::Relu, magnitude, out)
}

/// [`indexer_scores_into`] under `activation` (the magnitudes are the same
/// under either: the bound of `|q · k|` passes through both).
pub fn indexer_scores_with_into(
    shape: &IndexerShape,
    inputs: &IndexerInputs<'_>,
    activation: Activation,
    magnitude: bool,
    out: &mut [f32],
) -> Result<(), ArgumentError> {
    let (n, t) = (shape.n_queries, shape.n_keys);
    check_keys(shape)?;
    check_inputs(shape, inputs)?;
    let o_len = checked_size("out", &[n, t])?;
    check_len("out", out.len(), o_len, || {
        format!("[n_queries={n}, n_keys={t}]")
    })?;
    let (level, h, d) = (simd::Isa::best(), shape.n_heads, shape.d);
    let abs_scale: Option<Vec<f32>> = match (magnitude, inputs.key_scale) {
        (true, Some(c)) => Some(c.iter().map(|x| x.abs()).collect()),
        _ => None,
    };
    let keys = Keys::new(inputs.k, abs_scale.as_deref().or(inputs.key_scale));
    let queries = Queries {
        n,
        h,
        d,
        level,
        magnitude,
        q: &inputs.q,
        weights: inputs.weights,
        relu: activation == Activation::Relu,
        same_keys: |_, _| true,
        len: |i: usize| visible(inputs.query_pos[i], inputs.compress_ratio, t),
    };
    run::score_rows(queries, t, out, KEY_CHUNK, |_, c, group, outs, _| {
        let scratch = &mut Scratch::new(d);
        kernels::score_keys(
            level,
            group,
            keys,
            c * KEY_CHUNK,
            outs,
            if magnitude {
                Want::Magnitudes
            } else {
                Want::Scores
            },
            scratch,
        );
    });
    Ok(())
}

/// The float64 scores of the pairs `(rows[j], positions[j])` into `out[j]`:
/// query `rows[j]`'s score of key `positions[j]`, re-scored as the exact
/// selection re-scores its band (`exact.rs`: every product of two decoded
/// operands exact, the sums in float64, the same bits at every level), so
/// within `γ_{d+H+2}` (in units of `2⁻⁵³`) of `|c_t| Σ_h |w_h| Σ_i |q_hi
/// k_ti|` of the real score. What the exact check re-scores the candidates
/// its float32 screen leaves with; pairs of one row are best given
/// together (each run of equal `rows` loads its query once).
///
/// Refuses, before writing anything, the inputs [`indexer_topk_into`]
/// refuses, `rows` and `positions` of different lengths, a row past the
/// queries, a position past its query's context, and an `out` of another
/// length.
pub fn indexer_rescore_into(
    shape: &IndexerShape,
    inputs: &IndexerInputs<'_>,
    rows: &[usize],
    positions: &[usize],
    out: &mut [f64],
) -> Result<(), ArgumentError> {
    let (n, t) = (shape.n_queries, shape.n_keys);
    check_keys(shape)?;
    check_inputs(shape, inputs)?;
    check_len("positions", positions.len(), rows.len(), || {
        format!("[{}], one per entry of rows", rows.len())
    })?;
    check_len("out", out.len(), rows.len(), || {
        format!("[{}], one per entry of rows", rows.len())
    })?;
    for (j, (&i, &p)) in rows.iter().zip(positions).enumerate() {
        if i >= n {
            return Err(ArgumentError::OutOfRange {
                argument: "rows",
                index: j,
                message: format!("rows[{j}] = {i} is past the {n} queries"),
            });
        }
        let len = visible(inputs.query_pos[i], inputs.compress_ratio, t);
        if p >= len {
            return Err(ArgumentError::OutOfRange {
                argument: "positions",
                index: j,
                message: format!("positions[{j}] = {p} is past query {i}'s context of {len} keys"),
            });
        }
    }
    let (level, h, d) = (simd::Isa::best(), shape.n_heads, shape.d);
    let mut query = kernels::Query::new(h, d, level);
    let mut j0 = 0;
    while j0 < rows.len() {
        let i = rows[j0];
        let j1 = j0 + rows[j0..].iter().take_while(|&&r| r == i).count();
        query.load(&inputs.q, inputs.weights, i, false);
        let rescore = exact::Rescore {
            level,
            query: &query,
            key: key_reader(inputs, d),
        };
        rescore.run(&positions[j0..j1], &mut out[j0..j1]);
        j0 = j1;
    }
    Ok(())
}

/// Every query's float64 score of every key it sees, and its magnitude,
/// into `out` (`[n_queries, 2, n_keys]`: row `i`'s scores, then their
/// magnitudes `|c_t| Σ_h |w_h| Σ_i |q_hi k_ti|`, NaN past its context): the
/// scores [`indexer_rescore_into`] gives each pair, bit for bit, each key
/// decoded once per group of queries. What the exact check computes where
/// its float32 screen would leave every position in the band (low-contrast
/// rows).
///
/// Refuses, before writing anything, the inputs [`indexer_topk_into`]
/// refuses and an `out` of another length.
pub fn indexer_rescore_all_into(
    shape: &IndexerShape,
    inputs: &IndexerInputs<'_>,
    out: &mut [f64],
) -> Result<(), ArgumentError> {
    let (n, t) = (shape.n_queries, shape.n_keys);
    check_keys(shape)?;
    check_inputs(shape, inputs)?;
    let want = n.saturating_mul(2).saturating_mul(t);
    check_len("out", out.len(), want, || format!("[{n}, 2, {t}]"))?;
    let (relu, queries) = dense_queries(shape, inputs);
    let keys = key_rows(inputs, shape.d);
    let level = simd::Isa::best();
    exact::rescore_all(level, relu, shape.d, t, &queries, keys, &exact::Matrix, out);
    Ok(())
}

/// The exact check's verdict of each query's row from every float64 score
/// ([`indexer_rescore_all_into`]'s) and magnitude `m`, no score kept: with
/// `e = atol + rtol m`, `out[i]` (`[n_queries, 5]`) holds the highest `s −
/// e` of an unselected key, the lowest `s + e` of a selected one, the
/// highest `s − e` and the lowest `s + e` of any key it sees (`∓inf` when
/// there is none), and how many distinct keys it selects. Query `i`'s
/// selection is `positions[i * width ..][..width]`; entries outside its
/// context (`-1` padding among them) select nothing. A NaN score (only a
/// NaN or infinite operand makes one: finite operands' float64 scores are
/// finite) makes its row's best unselected `+inf` and its extremes `±inf`
/// the other way round (wrong, not vacuous: judged from its scores); the
/// exact check refuses such operands first.
///
/// Refuses, before writing anything, the inputs [`indexer_topk_into`]
/// refuses, `positions` of another length than `n_queries × width`, a
/// negative or non-finite `atol` / `rtol`, and an `out` of another length.
#[allow(clippy::too_many_arguments)]
pub fn indexer_rescore_verdict_into(
    shape: &IndexerShape,
    inputs: &IndexerInputs<'_>,
    positions: &[i64],
    width: usize,
    atol: f64,
    rtol: f64,
    out: &mut [f64],
) -> Result<(), ArgumentError> {
    let (n, t) = (shape.n_queries, shape.n_keys);
    check_keys(shape)?;
    check_inputs(shape, inputs)?;
    check_len(
        "positions",
        positions.len(),
        n.saturating_mul(width),
        || format!("[{n}, {width}]"),
    )?;
    for (name, v) in [("atol", atol), ("rtol", rtol)] {
        if !(v >= 0.0 && v.is_finite()) {
            return Err(ArgumentError::Invalid {
                argument: name,
                message: format!("{name} = {v} must be finite and non-negative"),
            });
        }
    }
    check_len("out", out.len(), n.saturating_mul(5), || {
        format!("[{n}, 5]")
    })?;
    let (relu, queries) = dense_queries(shape, inputs);
    let selected: Vec<Vec<u64>> = queries
        .iter()
        .enumerate()
        .map(|(i, q)| {
            let mut bits = vec![0u64; q.len.div_ceil(64)];
            for &p in &positions[i * width..(i + 1) * width] {
                if let Some(p) = usize::try_from(p).ok().filter(|&p| p < q.len) {
                    bits[p / 64] |= 1 << (p % 64);
                }
            }
            bits
        })
        .collect();
    let keys = key_rows(inputs, shape.d);
    let sink = exact::Verdict {
        selected: &selected,
        atol,
        rtol,
    };
    let level = simd::Isa::best();
    exact::rescore_all(level, relu, shape.d, t, &queries, keys, &sink, out);
    Ok(())
}

/// How the float64 re-scores read key `k`: decoded into `r` (`d` floats),
/// its scale returned (1 without scales).
fn key_reader<'a>(
    inputs: &'a IndexerInputs<'_>,
    d: usize,
) -> impl Fn(usize, &mut [f32]) -> f32 + Sync + 'a {
    move |k, r| {
        inputs.k.decode(k * d, r);
        inputs.key_scale.map_or(1.0, |s| s[k])
    }
}

/// How [`exact::rescore_all`] reads keys `t0 ..`: decoded into `rows` (`d`
/// floats each, one call for the run), their scales into `scales` (1
/// without scales).
fn key_rows<'a>(
    inputs: &'a IndexerInputs<'_>,
    d: usize,
) -> impl Fn(usize, &mut [f32], &mut [f32]) + Sync + 'a {
    move |t0, rows, scales| {
        inputs.k.decode(t0 * d, rows);
        match inputs.key_scale {
            Some(s) => scales.copy_from_slice(&s[t0..t0 + scales.len()]),
            None => scales.fill(1.0),
        }
    }
}

/// Every query in float64 for [`exact::rescore_all`], with its `Σ_h |w_h|
/// |q_hi|` (the heads in order) and its context, and whether the ReLU
/// applies.
fn dense_queries(
    shape: &IndexerShape,
    inputs: &IndexerInputs<'_>,
) -> (bool, Vec<exact::DenseQuery>) {
    let (n, t, h, d) = (shape.n_queries, shape.n_keys, shape.n_heads, shape.d);
    let mut query = kernels::Query::new(h, d, simd::Isa::best());
    let queries = (0..n)
        .map(|i| {
            query.load(&inputs.q, inputs.weights, i, false);
            let (q64, w64) = query.as_f64();
            let mut wq = vec![0.0f64; d];
            for (qh, &w) in q64.chunks_exact(d).zip(&w64) {
                for (a, &x) in wq.iter_mut().zip(qh) {
                    *a += w.abs() * x.abs();
                }
            }
            let len = visible(inputs.query_pos[i], inputs.compress_ratio, t);
            exact::DenseQuery { q64, w64, wq, len }
        })
        .collect();
    (query.relu, queries)
}

/// The packed form, serving-engine style: the keys of all sequences are
/// concatenated in `inputs.k` (`[n_keys, d]`, `key_scale` alike), sequence
/// `s` owning rows `cu_seqlens[s] .. cu_seqlens[s + 1]` (`n_seqs + 1`
/// non-decreasing entries from 0 to `n_keys`); query `i` belongs to
/// sequence `seq_ids[i]` and sits at `query_pos[i]` *within* it, sees only
/// its own sequence's keys, and its row holds offsets from the start of its
/// sequence. Row for row equal to [`indexer_topk_into`] on each sequence.
#[allow(clippy::too_many_arguments)]
pub fn indexer_topk_packed_into(
    shape: &IndexerShape,
    inputs: &IndexerInputs<'_>,
    cu_seqlens: &[usize],
    seq_ids: &[usize],
    topk: usize,
    num_segments: usize,
    out: &mut [i32],
    scores: Option<&mut [f32]>,
) -> Result<(), ArgumentError> {
    let options = IndexerOptions::default();
    let (cu, sid) = (cu_seqlens, seq_ids);
    indexer_topk_packed_with_into(
        shape,
        inputs,
        cu,
        sid,
        topk,
        num_segments,
        &options,
        out,
        scores,
    )
}

/// [`indexer_topk_packed_into`] with the family's options
/// ([`indexer_topk_with_into`]).
#[allow(clippy::too_many_arguments)]
pub fn indexer_topk_packed_with_into(
    shape: &IndexerShape,
    inputs: &IndexerInputs<'_>,
    cu_seqlens: &[usize],
    seq_ids: &[usize],
    topk: usize,
    num_segments: usize,
    options: &IndexerOptions,
    out: &mut [i32],
    scores: Option<&mut [f32]>,
) -> Result<(), ArgumentError> {
    check(
        shape,
        inputs,
        topk,
        num_segments,
        out.len(),
        scores.as_deref(),
    )?;
    let bounds = packed::boundaries(cu_seqlens, shape.n_keys, ("keys", "index_k"))?;
    packed::check_seq_ids_len(seq_ids.len(), shape.n_queries)?;
    packed::check_seq_ids(seq_ids, bounds.len() - 1, "cu_seqlens")?;
    options.check(topk, num_segments)?;
    let rows = Rows {
        topk,
        num_segments,
        rule: options.rule(),
        out,
        scores,
    };
    run_queries(shape, inputs, options.relu(), rows, |i| {
        (bounds[seq_ids[i]], bounds[seq_ids[i] + 1])
    });
    Ok(())
}

/// Every query's row over contiguous keys, query `i` over key rows
/// `keys_of(i)` (checked to lie within `inputs.k`); queries with the same
/// key rows share their groups ([`run`]).
fn run_queries(
    shape: &IndexerShape,
    inputs: &IndexerInputs<'_>,
    relu: bool,
    rows: Rows<'_>,
    keys_of: impl Fn(usize) -> (usize, usize) + Sync,
) {
    let (level, h, d) = (simd::Isa::best(), shape.n_heads, shape.d);
    let queries = Queries {
        n: shape.n_queries,
        h,
        d,
        level,
        magnitude: false,
        q: &inputs.q,
        weights: inputs.weights,
        relu,
        same_keys: |i: usize, j: usize| keys_of(i) == keys_of(j),
        len: |i: usize| {
            let (k0, k1) = keys_of(i);
            visible(inputs.query_pos[i], inputs.compress_ratio, k1 - k0)
        },
    };
    let score =
        |i0: usize, c: usize, group: &[_], outs: &mut [&mut [f32]], terms: Option<KeyTerms<'_>>| {
            let (k0, k1) = keys_of(i0);
            let enc = inputs.k.slice(k0 * d, k1 * d);
            let keys = Keys::new(enc, inputs.key_scale.map(|s| &s[k0..k1]));
            let scratch = &mut Scratch::new(d);
            kernels::score_keys(
                level,
                group,
                keys,
                c * KEY_CHUNK,
                outs,
                terms.map_or(Want::Scores, Want::Terms),
                scratch,
            );
        };
    // A key of the row being made exact: decoded as the kernels decode it.
    let key = |i0: usize, t: usize, row: &mut [f32]| {
        let k = keys_of(i0).0 + t;
        inputs.k.decode(k * d, row);
        inputs.key_scale.map_or(1.0, |s| s[k])
    };
    let fetch = |i0: usize, t: usize| {
        let k = keys_of(i0).0 + t;
        crate::keys::prefetch_key(inputs.k.bytes(k * d, d));
    };
    run::select_rows(queries, rows, KEY_CHUNK, score, key, fetch);
}

/// Refuses, in this order, what [`check_keys`] refuses, `topk` and
/// `num_segments` out of range, what [`check_inputs`] refuses, and an `out`
/// or `scores` that is not `[n_queries, topk]`.
fn check(
    shape: &IndexerShape,
    inputs: &IndexerInputs<'_>,
    topk: usize,
    num_segments: usize,
    out_len: usize,
    scores: Option<&[f32]>,
) -> Result<(), ArgumentError> {
    let n = shape.n_queries;
    check_keys(shape)?;
    check_segments_and_topk(topk, num_segments)?;
    check_inputs(shape, inputs)?;
    let o_len = checked_size("out", &[n, topk])?;
    check_len("out", out_len, o_len, || {
        format!("[n_queries={n}, topk={topk}]")
    })?;
    if let Some(s) = scores {
        check_len("scores", s.len(), o_len, || {
            format!("[n_queries={n}, topk={topk}]")
        })?;
    }
    Ok(())
}

/// Refuses `d = 0` and more keys than int32 positions reach.
fn check_keys(shape: &IndexerShape) -> Result<(), ArgumentError> {
    let (d, t) = (shape.d, shape.n_keys);
    let invalid = |argument, message: String| Err(ArgumentError::Invalid { argument, message });
    if d == 0 {
        return invalid(
            "d",
            "d is 0: index vectors need at least one dimension".into(),
        );
    }
    if t > i32::MAX as usize {
        return invalid(
            "index_k",
            format!(
                "index_k has {t} keys: positions past {} do not fit the int32 output",
                i32::MAX
            ),
        );
    }
    Ok(())
}

/// Refuses a `compress_ratio` of 0 and an input whose length does not match
/// its shape.
fn check_inputs(shape: &IndexerShape, inputs: &IndexerInputs<'_>) -> Result<(), ArgumentError> {
    let &IndexerShape {
        n_queries: n,
        n_heads: h,
        d,
        n_keys: t,
    } = shape;
    check_ratio(inputs.compress_ratio)?;
    let q_len = checked_size("index_q", &[n, h, d])?;
    check_len("index_q", inputs.q.len(), q_len, || {
        format!("[n_queries={n}, n_heads={h}, d={d}]")
    })?;
    let w_len = checked_size("weights", &[n, h])?;
    check_len("weights", inputs.weights.len(), w_len, || {
        format!("[n_queries={n}, n_heads={h}]")
    })?;
    let k_len = checked_size("index_k", &[t, d])?;
    check_len("index_k", inputs.k.len(), k_len, || {
        format!("[n_keys={t}, d={d}]")
    })?;
    if let Some(c) = inputs.key_scale {
        check_len("key_scale", c.len(), t, || format!("[n_keys={t}]"))?;
    }
    check_len("query_pos", inputs.query_pos.len(), n, || {
        format!("[n_queries={n}]")
    })
}

/// Refuses a `compress_ratio` of 0 (an entry of no tokens).
fn check_ratio(ratio: usize) -> Result<(), ArgumentError> {
    if ratio == 0 {
        let message = "compress_ratio=0: a key stands for at least one token (1 for \
                       token-level keys, 4 for DeepSeek-V4's CSA, 128 for HCA)";
        return Err(ArgumentError::Invalid {
            argument: "compress_ratio",
            message: message.into(),
        });
    }
    Ok(())
}

/// Refuses `topk > i32::MAX` and `num_segments > 64` (0 is off).
fn check_segments_and_topk(topk: usize, num_segments: usize) -> Result<(), ArgumentError> {
    let invalid = |argument, message: String| Err(ArgumentError::Invalid { argument, message });
    if topk > i32::MAX as usize {
        return invalid("topk", format!("topk={topk} is past {}", i32::MAX));
    }
    if num_segments > MAX_TOPOLOGY_SEGMENTS {
        let message = format!(
            "num_segments={num_segments} is out of range: 0 (off) or 1..={MAX_TOPOLOGY_SEGMENTS}"
        );
        return invalid("num_segments", message);
    }
    Ok(())
}
