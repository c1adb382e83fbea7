//! NSA's block selection as fla computes it: compressed keys mean-pooled
//! over complete blocks, each query head's softmax over them summed over
//! its GQA group, the forced blocks, the top `block_counts`.
//!
//! # The rule, as the sources state it
//!
//! Read in fla-org/flash-linear-attention @bc3b101d (`fla/ops/nsa/parallel.py`
//! `parallel_nsa` and `parallel_nsa_kernel_topk`, `fla/ops/nsa/naive.py`
//! `naive_nsa_topk`, `fla/ops/utils/pooling.py` `mean_pooling`), and in its
//! older standalone copy fla-org/native-sparse-attention @bd67af59
//! (`native_sparse_attention/ops/parallel.py` `parallel_nsa_kernel_topk`,
//! `ops/naive.py`), which assumes the query length equals the key length.
//!
//! **Compressed keys** ([`compress_into`]): block `c` of a KV head (tokens
//! `c·bs .. (c + 1)·bs`, `bs = block_size`, fla's 64) is the mean of its
//! keys. fla's `mean_pooling` also averages the trailing incomplete block,
//! but no query ever reads it: the softmax runs over the **complete** blocks
//! the query has seen, `c < NC = (p + 1) / bs` (`NC = (i_t + Q_OFFSET + 1)
//! // BS`), and only blocks `c < IC = p / bs` are scored. kvselect therefore
//! compresses the `seq_len / bs` complete blocks only.
//!
//! **Stage 1** is InfLLM-v2's, reused rather than restated
//! ([`crate::infllm`]'s `score::group_sums`): query head `h` at position `p`
//! scores `s_hc = (q_h · ck_c) · scale` over `c < NC`, `P_hc =
//! softmax_c(s_hc)` (fla's `exp(b_s − b_lse)`, the lse over the same
//! `NC` keys; `lse = 0` when `NC = 0`), and the block's importance for KV
//! head `g` is `S_c = Σ_h P_hc` over `g`'s query heads (`tl.sum(b_p, 0)`;
//! the naive code's `probs.mean(dim=2)` is the same order scaled by `1/G`).
//! Each head is normalised on its own before the group sum.
//!
//! **Candidates and forced blocks**: the blocks `0 ..= IC`; block `c < IC`
//! scores `S_c`; fla forces block 0 and blocks `IC − 1` and `IC` ("the 1st
//! and the last 2 blocks are always selected") by scoring each head 1.0,
//! a group sum of `G`. [`Config`] names these counts `init_blocks = 1`
//! (blocks `b < init_blocks`) and `local_blocks = 2` (blocks `IC − 2 < b
//! <= IC`); the NSA paper's "1 initial block and 2 local blocks" (§3.3.2)
//! is the same set. A non-forced block at or after `IC` is no candidate
//! (fla masks it to probability 0 and drops ids past `IC`).
//!
//! **Top-k**: the `block_counts` highest of the candidates (fla pads its
//! row to the next power of two; the attention reads the first
//! `block_counts`). kvselect writes them ascending, `-1` padded to
//! `block_counts` entries: a row holds `min(block_counts, candidates)` ids.
//!
//! **Tq ≠ Tkv**: the queries are the sequence's last `n_q` tokens, query `i`
//! at `p = seq_len − n_q + i` (the parallel kernel's `Q_OFFSET = TK − TQ`).
//! The naive code takes `p = i` (it assumes `Tq = Tkv`); the two agree only
//! when `n_q = seq_len`.
//!
//! # Decisions where the sources leave a choice
//!
//! - **One total order**: score descending, ties to the lower block id,
//!   forced blocks (`+inf` here) first. With `block_counts < 3` the forced
//!   blocks tie at `G` in fla and its bitonic sort picks one; kvselect keeps
//!   the lower ids (block 0 first, then `IC − 1`).
//! - **Exact, not float32, top-k**: fla's top-k ranks float32 probabilities
//!   against its padding, which scores 0 (`exp(−inf)`) with id `-1`. A
//!   visible block whose probability underflows to 0 ties with the padding
//!   and may lose its slot: with logits 200 apart (`exp(−200) < 2^-149`) a
//!   query with fewer candidates than `block_counts` gets a short row in
//!   fla. In exact arithmetic every visible block's probability is positive,
//!   so kvselect always fills `min(block_counts, candidates)` slots; among
//!   blocks whose float32 scores are equal (both 0) the lower id wins.
//! - Forced blocks score `+inf` rather than `G` (fla's 1.0 per head): a
//!   non-forced block's exact score is below `G` whenever a second block is
//!   visible, so the order is fla's, and no float32 rounding of a
//!   probability to 1.0 can tie with a forced block.
//! - fla scales the query before the dot (`(q * scale).to(q.dtype)`, a
//!   bf16 rounding at bf16 inputs); kvselect scales the float32 dot, as
//!   InfLLM-v2's stage 1 does.
//!
//! # Numbers: float32, one order, a stated bound
//!
//! A compressed key is the float32 sum of its `bs` rows in token order,
//! divided by `bs` (one rounding); each row is decoded from its format in
//! place ([`crate::keys`]) and, with per-token fp8 scales, multiplied by
//! its scale (one rounding). Stage 1 then runs InfLLM-v2's kernels, the same
//! operations in the same order at every SIMD level, so the bits do not
//! depend on the level or the thread count.
//!
//! **The bound** (`kvselect.reference.nsa.nsa_score_bound`): InfLLM-v2's
//! (src/infllm/mod.rs, "The bound"), with the logit error widened by the
//! pooling. Component `i` of a compressed key is within `δ_i = (γ_bs (1 +
//! u) + u) m_i` of the exact mean (the sum of `bs` terms, then the
//! division), `m_i` the mean of `|k_ti|` over the block. So the logit of
//! block `c` is off by at most `e_c = |scale| W (1 + u) Σ_i |q_i| m_i + u
//! |s_c|` with `W = γ_d + (1 + γ_d) (γ_bs (1 + u) + u)`: the chain over `d`
//! on the rounded key, the key's own error, then the product by the scale. The rest — the exponential within `EXP_REL_ERR` (docs/kernels.md),
//! the sums, the division, the group sum — is InfLLM-v2's, giving `|Ŝ_c −
//! S_c| <= R S_c + T`; two blocks whose exact scores differ by more than
//! `R (S_b + S_c) + 2T` are ranked as exact arithmetic ranks them, and the
//! reference twin treats closer pairs as tied.
//!
//! What would break it: the trailing incomplete block compressed and put in
//! the softmax (`NC = ⌈(p + 1) / bs⌉`), the group summed before the softmax
//! (one softmax over the summed logits), `p = i` when `n_q < seq_len`, a
//! forced block left to compete — each a case of `kvselect.testing`.

mod api;
#[cfg(test)]
mod tests;

pub use api::{
    block_scores_into, block_scores_packed_into, compress_into, select_into, select_packed_into,
};

/// fla's default block size (`parallel_nsa`'s `block_size = 64`).
pub const FLA_BLOCK_SIZE: usize = 64;
/// fla's default `block_counts` (16, "set to 16 in the paper").
pub const FLA_BLOCK_COUNTS: usize = 16;
/// fla's forced blocks: the first ([`FLA_INIT_BLOCKS`]) and the last two up
/// to the query's own ([`FLA_LOCAL_BLOCKS`]).
pub const FLA_INIT_BLOCKS: usize = 1;
/// See [`FLA_INIT_BLOCKS`].
pub const FLA_LOCAL_BLOCKS: usize = 2;

/// A call's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Config {
    /// Tokens a block (fla's `block_size`).
    pub block_size: usize,
    /// Blocks a row (fla's `block_counts`, an int here).
    pub block_counts: usize,
    /// Blocks `b < init_blocks` are forced.
    pub init_blocks: usize,
    /// Blocks `IC − local_blocks < b <= IC` are forced.
    pub local_blocks: usize,
    /// The logits' scale (`1/√d` by default in fla).
    pub scale: f32,
}

impl Config {
    /// fla's defaults: blocks of 64, 16 a row, blocks 0, `IC − 1`, `IC`
    /// forced, `scale = 1/√d`.
    pub fn fla(d: usize) -> Config {
        Config {
            block_size: FLA_BLOCK_SIZE,
            block_counts: FLA_BLOCK_COUNTS,
            init_blocks: FLA_INIT_BLOCKS,
            local_blocks: FLA_LOCAL_BLOCKS,
            scale: (1.0 / (d as f64).sqrt()) as f32,
        }
    }

    /// Whether block `b` is forced for the query in block `ic`.
    pub fn forced(&self, b: usize, ic: usize) -> bool {
        b < self.init_blocks || (b <= ic && ic < b + self.local_blocks)
    }

    /// Compressed keys of `seq_len` tokens: its complete blocks.
    pub fn n_compressed(&self, seq_len: usize) -> usize {
        seq_len / self.block_size
    }

    /// Blocks of `seq_len` tokens, the last one possibly incomplete.
    pub fn n_blocks(&self, seq_len: usize) -> usize {
        seq_len.div_ceil(self.block_size)
    }
}

/// The score of every block `0..out.len()` for the query at position `p`
/// from its group sums (`sums[c]` for `c < (p + 1) / bs`): forced `+inf`,
/// `c < IC` its sum, the rest `−inf` (no candidates).
pub(crate) fn block_scores(cfg: &Config, sums: &[f32], p: usize, out: &mut [f32]) {
    let ic = p / cfg.block_size;
    for (b, o) in out.iter_mut().enumerate() {
        *o = if cfg.forced(b, ic) {
            f32::INFINITY
        } else if b < ic {
            sums[b]
        } else {
            f32::NEG_INFINITY
        };
    }
}

/// The row of a query from its block scores: the candidates (scores other than
/// `−inf`) in the total order, the first `out.len()` of them ascending,
/// then `-1`. `ids` is scratch.
pub(crate) fn row(scores: &[f32], ids: &mut Vec<u32>, out: &mut [i32]) {
    ids.clear();
    ids.extend((0..scores.len() as u32).filter(|&b| scores[b as usize] != f32::NEG_INFINITY));
    let cmp = |a: &u32, b: &u32| {
        crate::infllm::select::before(
            scores[*a as usize],
            *a as usize,
            scores[*b as usize],
            *b as usize,
        )
    };
    let k = out.len().min(ids.len());
    if k > 0 && k < ids.len() {
        ids.select_nth_unstable_by(k - 1, cmp);
    }
    ids.truncate(k);
    ids.sort_unstable();
    out.fill(-1);
    for (o, &b) in out.iter_mut().zip(ids.iter()) {
        *o = b as i32;
    }
}
