//! InfLLM-v2's block selection (MiniCPM4 / MiniCPM4.1): stage 1's softmax
//! over the compressed keys, summed over each KV head's query group, max
//! pooled onto 64-token blocks; the forced blocks; the top-k.
//!
//! # The rule, as the sources state it
//!
//! **Compressed keys** (MiniCPM4's `CompressK` / `calc_chunks_with_stride`,
//! read in the MiniCPM4.1 modelling code copied at
//! ProudAurora/SparseMiniCpm @294ead4d `finetune/models/minicpm4/modeling_minicpm.py`;
//! the torch reference `compress_tensor` in OpenBMB/infllmv2_cuda_impl
//! @f908e731 `tests/test_stage1_compressed_lse.py`): compressed key `j` of
//! a KV head is the mean of its keys at tokens `16 j .. 16 j + 32` (kernel
//! 32, stride 16); a sequence of `n` tokens has `(n − 32) / 16 + 1` of them
//! (none below 32 tokens), [`compressed_len`]. kvselect takes the
//! compressed keys as an input (`ck`, `[n_c, n_kv_heads, d]`, in any key
//! format, read in place): engines keep them in a cache of their own.
//!
//! **Stage 1** (`torch_naive_softmax` in `tests/stage1/naive_softmax.py`,
//! `naive_attention` in `tests/test_stage1.py`): query head `h` at token
//! position `p` scores compressed key `j` as `s_hj = (q_h · ck_j) · scale`
//! (`scale = 1/√d`, the source's `1.0 / math.sqrt(q.size(-1))`), over the
//! keys whose last token is at or before `p` (`16 j + 31 <= p`, the
//! reference's causal mask: [`visible`]); `P_hj = softmax_j(s_hj)`; the
//! score of `j` for KV head `g` is `S_j = Σ_h P_hj` over `g`'s query heads
//! (`reshape(k_head, group_size, ..).sum(dim=1)`); a key the query cannot
//! see scores 0, and a query that sees none scores 0 everywhere (the
//! reference's `torch.where(isnan(out), 0, out)`).
//!
//! **Pooling** ([`Pooling`]; 64-token blocks, 4 compressed keys a block):
//! block `b`'s score is the maximum of `S_j` over `j ∈ [4b − 1, 4b + 4)`
//! (kernel 5, stride 4, padding 1: `max_pooling_1d.py` turns `stride = 16`
//! into `block_size // stride = 4` and `kernel_size = 5`), and blocks are
//! forced or excluded around the query's own block `qb = p / 64`.
//!
//! **Top-k** (`compressed_attention` in the modelling code): the `top_k`
//! highest block scores of the `⌈seq_len / 64⌉` blocks (`topk =
//! min(topk, n_blocks)`), sorted ascending; then the ids past the query's
//! block are dropped ([`Keep`]).
//!
//! # Variants: where the copies disagree
//!
//! - [`Pooling::Cuda`] (`csrc/max_pooling_1d.cuh`, `max_pooling_1d_kernel`
//!   and its varlen twin, what MiniCPM4.1 calls): blocks `b < init_blocks`
//!   and `qb − local_blocks <= b <= qb` (`local_blocks + 1` blocks, the
//!   current one included) score `+inf`; every other block the maximum of
//!   its taps clamped to `[0, n_c)`, `−inf` when none is left.
//! - [`Pooling::Triton`] (the older `transform_score` Triton kernel, kept in
//!   `tests/test_pooling_comparison.py` and `tests/test_pooling_varlen.py`):
//!   out-of-range taps read as 0 (`tl.load(.., other=0)`, and the three
//!   padding lanes of its 8-wide tap vector weigh 0), so a block's score is
//!   `max(0, its taps)`; the `local_blocks` blocks `qb − local_blocks < b
//!   <= qb` score `−inf` (excluded: the sliding window attends to them);
//!   then `b < init_blocks` scores `+inf` (the init mask is applied last).
//! - Neither kernel masks future blocks (`b > qb`): their taps are keys the
//!   query cannot see (0), so they score 0, or `−inf` past `n_c`.
//! - [`Keep::ThroughCurrent`]: the MiniCPM4.1 / SALA modelling code drops
//!   ids `> q_idx` after the top-k (`topk_idx[topk_idx > q_idx] = -1`).
//!   [`Keep::BeforeCurrent`]: an earlier MiniCPM4 copy (an SGLang port that
//!   calls `nsa.max_pooling_1d`) drops ids `>= q_idx`, so at decode the
//!   current block goes. `q_idx` is `p / 64` in both (`cache_lens //
//!   block_size` at decode).
//!
//! # One total order
//!
//! Blocks are ranked by score descending, ties to the lower id; NaN ranks
//! below `−inf`. The sources take `torch.topk`, which promises no order
//! among equal scores: where more blocks are forced (`+inf`) than `top_k`
//! holds, the lower ids are kept. Future blocks only enter the top-k once
//! every block at or before `qb` is in it (they score 0 or `−inf`, the
//! lowest a past block can score, and lose the tie), and are then dropped:
//! a row holds at most `min(top_k, qb + 1)` ids.
//!
//! # Numbers: float32, one order, a stated bound
//!
//! Each dot product is one FMA chain over `d` in order, times `scale`
//! (the attention pass's packed-key kernels, [`crate::attention`]); each
//! head's row goes through the attention pass's softmax kernel (the
//! project's `exp`, [`crate::exp`], its sum in 8 strided lanes and a fixed
//! tree), then `P_hj = e_hj / Z_h` (one division) and the group sum adds
//! the heads in order. Every SIMD level runs the same operations in the
//! same order, so the bits do not depend on the level or the thread count.
//!
//! **The bound** (`kvselect.reference.infllm.score_bound` computes it). With `u = 2^-24`, `γ_n = n u / (1 − n
//! u)`, `ε = EXP_REL_ERR` ([`crate::exp::EXP_REL_ERR`]; docs/kernels.md):
//! the logit of key `j` is off by at most `e_j = |scale| γ_d Σ_i |q_i
//! ck_ji| (1 + u) + u |s_j|` (the chain, then the product); its argument to
//! `exp` after the shift by the computed maximum `m̂` by `a_j <= e_j + u
//! (|s_j − m̂| + e_j)` (the shift cancels in the softmax, so only the
//! argument's own error counts). With `A_h = max_j a_j`, the exponential
//! within `ε`, the sum of `n` nonnegative terms within `γ_n` and the
//! division within `u`, every `P_hj` is within the factor `r_h = e^{2 A_h}
//! (1 + ε)(1 + u) / ((1 − ε)(1 − γ_n)) − 1` of the true one; the group sum
//! of `G` nonnegative terms adds `γ_G`: `|Ŝ_j − S_j| <= R S_j + T` with
//! `R = (1 + max_h r_h)(1 + γ_G) − 1` and `T = G · 2^-123` (what the
//! exponential's flush to 0 below [`crate::exp::EXP_LO`] and subnormal
//! quotients can lose, the row's maximum term being 1). The maximum is
//! exact and monotone, so every block score is within `R B + T` of the
//! exact one, and two blocks whose exact scores differ by more than `R (B_b
//! + B_c) + 2T` are ranked as exact arithmetic ranks them. The reference
//! twin (`kvselect.reference.infllm`) treats closer pairs as tied.
//!
//! What would break it: a pooling window off by one (`[4b, 4b + 5)`), the
//! current block not forced (`qb − local_blocks <= b < qb`), keys the
//! query cannot see scored, heads normalised together instead of each on
//! its own, the filter on the wrong side of `qb` — each is a planted fault
//! in the tests and a case of `kvselect.testing`.
//!
//! The source pools half-precision scores (`max_pooling_1d.py` asserts
//! float16 / bfloat16 inputs); kvselect decides in float32 within the bound
//! above, so blocks whose scores round to one half-precision value are
//! ordered here and tied there (a deviation named in the README).
//!
//! # Packed batches and paged decode
//!
//! The source's varlen calls (`infllmv2_attn_stage1` and
//! `max_pooling_1d_varlen` with `cu_seqlens_q`, `cu_seqlens_k`,
//! `cache_lens`; `max_pooling_1d_varlen_kernel` in
//! `csrc/max_pooling_1d.cuh`) run each sequence as the single-sequence
//! kernels do, its taps clamped to its own compressed keys.
//! [`select_packed_into`] and [`block_scores_packed_into`] therefore run the
//! dense rule on each sequence's slice (its queries the last of its
//! `seq_lens[s]` tokens, its compressed keys exactly those tokens'); the
//! source's one padded width (blocks past a short sequence, forced to `+inf`
//! only when `init_blocks` exceeds its blocks) is not reproduced.
//! [`select_paged_into`] reads a decoding query's compressed keys through a
//! block table (OpenBMB's SGLang backend keeps them in a pool with
//! per-request tables, `cache_lens = seq_lens − 1`) and runs the dense rule
//! on them ([`block_scores_paged_into`] its scores). They equal the dense call bit for bit because the decoded
//! values are exact and the same kernels run on them in the same order; a
//! sequence given another sequence's keys, or queries not at its end, would
//! break that, and is refused.
//!
//! At decode (a few queries: `api::in_place`, measured) the dense call
//! itself scores its compressed keys where they lie
//! (`paged::dense_group_sums`; for 2 to 16 queries, but float32 / bfloat16
//! keys of a group of 16 or more, `paged::dense_group_sums_queries`, each
//! key read once for all of them)
//! instead of packing every KV head's keys for the packed-key tiles: the heads-in-lanes kernels compute each logit as
//! the same chain, keep the same exact maxima and the same eight lanes of
//! `Z`, so the bits do not depend on the path (`src/infllm/heads.rs`, "why
//! the bits are `score::group_sums`'s"). A path that normalised otherwise
//! would break it; the tests run both on every call they check.
//!
//! # Layout
//!
//! `score.rs` (stage 1 and the pooling of one query and KV head),
//! `paged.rs` (stage 1 at decode over a paged cache, read in place, NSA's
//! too; and over the dense call's keys in place, a decode's few queries),
//! `profile.rs` (the phases timed, for the benchmark),
//! `select.rs` (the order and the row), `api.rs` (the checked entry
//! points), `tests.rs`.

mod api;
pub(crate) mod heads;
pub(crate) mod paged;
pub(crate) mod panels;
#[doc(hidden)]
pub mod profile;
pub(crate) mod score;
pub mod select;
#[cfg(test)]
mod tests;

/// Runs InfLLM-v2's kernel family (`infllm.head_sums`) at `isa` (the reach
/// test's probe).
#[cfg(test)]
pub(crate) fn dispatch_probe(isa: crate::simd::Isa) {
    heads::probe(isa);
    panels::probe(isa)
}

/// Runs the split stage 1 (`infllm.staged`) at `isa` (the reach test's
/// probe).
#[cfg(test)]
pub(crate) fn staged_probe(isa: crate::simd::Isa) {
    heads::staged_probe(isa)
}

/// The named sizes the entry points take (`q` `[.., n_q_heads, d]`, keys
/// `[.., n_kv_heads, d]`; a packed batch's lengths and boundaries).
pub use crate::keys::{CompressedBatch, Heads};
pub use api::{
    block_scores_into, block_scores_packed_into, block_scores_paged_into, select_into,
    select_packed_into, select_paged_into,
};

/// The block and compression geometry: `block_size`-token blocks, compressed
/// keys of `kernel_size` tokens every `kernel_stride` (MiniCPM4's 64, 32, 16:
/// [`Geometry::MINICPM4`]). The pooling's stride is `block_size /
/// kernel_stride` keys, its kernel one more, its padding 1
/// (`max_pooling_1d.py`: `stride = block_size // stride`, `kernel_size =
/// stride + 1`, `padding = 1`); every formula here is the source's, which
/// takes these as parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Geometry {
    pub block_size: usize,
    pub kernel_size: usize,
    pub kernel_stride: usize,
}

impl Geometry {
    /// MiniCPM4's: blocks of 64, compressed keys of 32 tokens every 16.
    pub const MINICPM4: Geometry = Geometry {
        block_size: 64,
        kernel_size: 32,
        kernel_stride: 16,
    };

    /// Compressed keys per block (`block_size / kernel_stride`), the
    /// pooling's stride; its window is one more, from one key before the
    /// block.
    pub fn keys_per_block(&self) -> usize {
        self.block_size / self.kernel_stride
    }

    /// Compressed keys of a sequence of `n_tokens` tokens: `(n − kernel_size)
    /// / kernel_stride + 1`, none below `kernel_size` tokens
    /// (`calc_chunks_with_stride`).
    pub fn compressed_len(&self, n_tokens: usize) -> usize {
        if n_tokens < self.kernel_size {
            0
        } else {
            (n_tokens - self.kernel_size) / self.kernel_stride + 1
        }
    }

    /// Compressed keys the query at position `p` sees: those whose last token
    /// is at or before `p` (`compressed_len(p + 1)`).
    pub fn visible(&self, p: usize) -> usize {
        self.compressed_len(p + 1)
    }

    /// Blocks of a sequence of `n_tokens` tokens (`⌈n / block_size⌉`).
    pub fn n_blocks(&self, n_tokens: usize) -> usize {
        n_tokens.div_ceil(self.block_size)
    }

    /// Refuses a zero size or a block that is not whole strides.
    pub(crate) fn check(&self) -> Result<(), crate::ArgumentError> {
        for (argument, v) in [
            ("block_size", self.block_size),
            ("kernel_size", self.kernel_size),
            ("kernel_stride", self.kernel_stride),
        ] {
            if v == 0 {
                return Err(crate::ArgumentError::Invalid {
                    argument,
                    message: format!("{argument} must be at least 1"),
                });
            }
        }
        if !self.block_size.is_multiple_of(self.kernel_stride) {
            return Err(crate::ArgumentError::Invalid {
                argument: "block_size",
                message: format!(
                    "block_size ({}) must be a multiple of kernel_stride ({})",
                    self.block_size, self.kernel_stride
                ),
            });
        }
        Ok(())
    }
}

/// MiniCPM4's `sparse_config` (OpenBMB/MiniCPM @0fcc3d08 `README.md`,
/// "Inference with Sparse Attention"): `init_blocks = 1`, `window_size =
/// 2048` (`local_blocks = 2048 / 64 = 32`), `topk = 64`.
pub const MINICPM4_INIT_BLOCKS: usize = 1;
/// See [`MINICPM4_INIT_BLOCKS`].
pub const MINICPM4_LOCAL_BLOCKS: usize = 32;
/// See [`MINICPM4_INIT_BLOCKS`].
pub const MINICPM4_TOP_K: usize = 64;

/// How block scores are pooled and which blocks are forced (see the module
/// docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pooling {
    /// `csrc/max_pooling_1d.cuh`: init and `local_blocks + 1` blocks up to
    /// the current one `+inf`, taps clamped (`−inf` when none).
    Cuda,
    /// The older Triton `transform_score`: out-of-range taps 0, the
    /// `local_blocks` blocks up to the current one `−inf`, init `+inf`.
    Triton,
}

/// Which of the top-k's ids the modelling code keeps (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Keep {
    /// Ids `<= q_idx` (MiniCPM4.1: `topk_idx > q_idx` dropped).
    ThroughCurrent,
    /// Ids `< q_idx` (an earlier MiniCPM4 copy: `topk_idx >= q_idx`
    /// dropped).
    BeforeCurrent,
}

/// A call's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Config {
    pub init_blocks: usize,
    pub local_blocks: usize,
    pub top_k: usize,
    pub pooling: Pooling,
    pub keep: Keep,
    /// The logits' scale (`1/√d` in the sources).
    pub scale: f32,
    pub geometry: Geometry,
}

impl Config {
    /// MiniCPM4's settings ([`MINICPM4_INIT_BLOCKS`] ...) with the CUDA
    /// pooling, MiniCPM4.1's filter and `scale = 1/√d`.
    pub fn minicpm4(d: usize) -> Config {
        Config {
            init_blocks: MINICPM4_INIT_BLOCKS,
            local_blocks: MINICPM4_LOCAL_BLOCKS,
            top_k: MINICPM4_TOP_K,
            pooling: Pooling::Cuda,
            keep: Keep::ThroughCurrent,
            scale: (1.0 / (d as f64).sqrt()) as f32,
            geometry: Geometry::MINICPM4,
        }
    }
}

/// [`Geometry::compressed_len`] at MiniCPM4's geometry.
pub fn compressed_len(n_tokens: usize) -> usize {
    Geometry::MINICPM4.compressed_len(n_tokens)
}

/// [`Geometry::visible`] at MiniCPM4's geometry.
pub fn visible(p: usize) -> usize {
    Geometry::MINICPM4.visible(p)
}

/// [`Geometry::n_blocks`] at MiniCPM4's geometry.
pub fn n_blocks(n_tokens: usize) -> usize {
    Geometry::MINICPM4.n_blocks(n_tokens)
}
