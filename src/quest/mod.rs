//! Quest's query-aware page selection: each page's element-wise key bounds,
//! the bound they put on a query's attention score, and the pages a
//! decoding query reads.
//!
//! # The rule, as the sources state it
//!
//! Quest (mit-han-lab/Quest @01c1623b) keeps, per page of 16 tokens and
//! per KV head, the element-wise minimum and maximum of the page's keys
//! (the metadata cache `quest/utils/controller.py` allocates, updated by
//! `AppendPagedKVCacheDecodeKernel` in `kernels/include/decode/decode_page.cuh`:
//! the page's first key *sets* both bounds, every later key folds in). A
//! decoding query `q` scores page `p`
//!
//! ```text
//!     s_p = Σ_i max(q_i · kmax_pi, q_i · kmin_pi)
//! ```
//!
//! (`compute_max_possible` in `kernels/include/decode/decode_attn.cuh`;
//! `_ref_cpu_estimate` in `quest/tests/test_estimate.py` writes the same
//! sum as `|q| · max(sign(q) · k)` over the page). Since `max ≥ min`, the
//! larger product is the one with the bound on `q_i`'s side, so
//! `s_p = Σ_i q_i · (q_i ≥ 0 ? kmax_pi : kmin_pi)`, which is what is
//! computed here (one fused multiply-add a dimension; SGLang writes it so
//! too). `s_p` bounds `q · k` for every key `k` of the page, which is why
//! ranking pages by it keeps the pages that could hold a large score.
//!
//! The pages read (`controller.py` `begin_forward` / `need_estimate`,
//! `quest/utils/__init__.py` `decode_topk`, `decode_sparse_attn`):
//! with `budget` pages (the last one counted; `page_budget` in Python, as
//! Quest names it), a query of `n` pages reads
//! **every page when `n <= budget`** (the dense fallback), else **the last
//! page, forced**, and the top `budget − 1` of the `n − 1` others by `s_p`.
//! The last page is never scored (the kernel scores `n − 1` pages): it is
//! partly filled and holds the query's own token.
//!
//! # Variants: where two implementations of the name disagree
//!
//! [`Variant`] names each; `docs/quest.md` says which engine uses which.
//!
//! - [`Variant::Kernel`] (Quest's kernels, per query head, the original):
//!   as above, each query head against its KV head's bounds (Quest is
//!   multi-head; a GQA query head reads its group's KV head).
//! - [`Variant::Eval`] (Quest's evaluation script,
//!   `evaluation/quest_attention.py` `local_heavy_hitter_mask`): the same
//!   page score, but `min(max(3, token_budget // 16), n)` pages with
//!   `token_budget = min(n_tokens, budget · 16)`, **no forced last page**
//!   (the budget here is in pages, so the script's token budget is `budget
//!   · page_size`).
//! - [`Variant::Sglang`] (sgl-project/sglang @00544d86
//!   `python/sglang/srt/mem_cache/sparsity/algorithms/quest_algorithm.py`
//!   and `base_algorithm.py`): one page set per request. The query heads
//!   of each KV head's group are **averaged** (in float32, then rounded to
//!   the query's own dtype: `_retrieve_page_scores` averages bfloat16
//!   queries in bfloat16), each page is scored against **every KV head and
//!   the heads summed**; the newest `num_recent_pages` (default 4) pages are
//!   forced and `max(budget − num_recent_pages, 1)` of the pages before them
//!   taken (`fixed_topk_page_cnt`), at most all of them; every page when
//!   there are no pages before the recent ones (`quest_combine_kernel`
//!   takes the recent pages alone then).
//!
//! The first two layers dense (Quest's model code, `quest/models/llama.py`
//! `_quest_skip_layer = 2`, and its evaluation script's `layer_id < 2`)
//! is a per-layer option of the eval policy, not of this module.
//!
//! # One total order
//!
//! Pages are ranked by "score descending, then page id ascending"
//! ([`select::rank`]): a tie at the threshold goes to the lower page id
//! (every source breaks it by `torch.topk` or a radix sort, neither of which
//! promises an order), NaN ranks below every number, `-0.0` is `+0.0`. With a
//! total order the chosen set does not depend on the selection algorithm.
//! Rows are written ascending, `-1` padded.
//!
//! # Numbers: exact bounds, one summation order
//!
//! - **Bounds are exact.** A key is decoded exactly (float32, float16,
//!   bfloat16, fp8 e4m3fn); an fp8 key with a per-token scale is `k ·
//!   scale` rounded to float32 (a float32 dequantisation), and a bound is
//!   a minimum or maximum of such values, so no rounding enters it. NaN
//!   keys are ignored as CUDA's `max` / `__hmax` ignore them (a dimension
//!   whose keys are all NaN is NaN); every key is canonicalised by `+ 0.0`
//!   so a bound is never `-0.0` and the comparisons never meet two zeros.
//!   Building page by page, or updating one key at a time in order
//!   ([`update_bounds`], `O(n_kv_heads · d)`), gives the same bits. A page
//!   is bounded over the keys written to it only: its first key resets it,
//!   so a partly filled last page is never bounded over stale slots.
//! - **Scores are summed in one order**, the same on every SIMD level and
//!   thread count: lane `l` of 8 accumulates dimensions `l, l + 8, …` with
//!   a fused multiply-add (a dimension past `d` as `fma(0, 0, acc)`), the
//!   lanes are added `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))`;
//!   SGLang's per-head sums are then added in head order. The selection
//!   therefore equals the exact-arithmetic one whenever page scores differ
//!   by more than that rounding (`kvselect check` decides rows exactly,
//!   re-scoring the decisive pages).
//!
//! What would break it: bounds over a page's unwritten slots (a partly
//! filled page read whole), `kmin` and `kmax` swapped, the sign of `q_i`
//! ignored (`Σ |q_i| · kmax_i`), the last page not forced, or scored pages
//! when every page fits the budget — each is a planted fault in the tests
//! and a case of `kvselect.testing`.
//!
//! # Layout
//!
//! `bounds.rs` (from dense / packed keys, from a paged cache, the decode
//! update), `score.rs` (per head, and SGLang's grouped score), `select.rs`
//! (the order and each variant's page set), `api.rs` (whole sequences,
//! packed batches), `kernels/` (the `quest.fold` and `quest.scores`
//! families: portable and AVX2; the AVX-512 level runs the AVX2 kernels,
//! since the bounds stream from memory and no AVX-512 machine was at hand
//! to test a kernel on), `tests.rs`.

mod api;
mod bounds;
mod kernels;
mod score;
pub mod select;
#[cfg(test)]
mod tests;

pub use api::{check_budget, grouped_scores_into, scores_into, select_into};
pub use bounds::{bounds_into, bounds_paged_into, update_bounds};
pub use score::{round_bf16, round_f16};

use crate::error::ArgumentError;

/// Runs Quest's kernel families at `isa` (the reach test's probe).
#[cfg(test)]
pub(crate) fn dispatch_probe(isa: crate::simd::Isa) {
    kernels::probe(isa)
}

/// Quest's page, in tokens (`page_size = 16` throughout its code and
/// SGLang's default for it).
pub const QUEST_PAGE_SIZE: usize = 16;

/// SGLang's default `num_recent_pages` (`base_algorithm.py`).
pub const SGLANG_RECENT_PAGES: usize = 4;

/// The shape of page bounds: `[n_pages, n_kv_heads, d]`, pages of
/// `page_size` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Layout {
    pub n_kv_heads: usize,
    pub d: usize,
    pub page_size: usize,
}

impl Layout {
    /// The layout of `n_kv_heads` heads of `d`, pages of `page_size` tokens.
    pub fn new(n_kv_heads: usize, d: usize, page_size: usize) -> Layout {
        Layout {
            n_kv_heads,
            d,
            page_size,
        }
    }

    /// Floats per page of bounds (`n_kv_heads × d`).
    pub fn row(&self) -> usize {
        self.n_kv_heads * self.d
    }

    /// Refuses a zero dimension or a row whose size overflows.
    pub(crate) fn check(&self) -> Result<(), ArgumentError> {
        for (argument, v) in [
            ("n_kv_heads", self.n_kv_heads),
            ("d", self.d),
            ("page_size", self.page_size),
        ] {
            if v == 0 {
                return Err(ArgumentError::Invalid {
                    argument,
                    message: format!("{argument} must be at least 1"),
                });
            }
        }
        crate::error::checked_size("keys", &[self.n_kv_heads, self.d]).map(|_| ())
    }
}

/// Which implementation of Quest's page set (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Variant {
    /// Quest's kernel path, per query head: the last page forced, the top
    /// `budget − 1` of the others, every page when they fit.
    Kernel,
    /// Quest's evaluation script: `min(max(3, min(n_tokens, budget · P) /
    /// P), n)` pages, none forced.
    Eval,
    /// SGLang's: one page set per request from the group-mean query summed
    /// over KV heads, the newest `num_recent_pages` forced.
    Sglang { num_recent_pages: usize },
}

/// Pages in a sequence of `n_tokens` tokens.
pub fn pages_of(n_tokens: usize, page_size: usize) -> usize {
    n_tokens.div_ceil(page_size.max(1))
}

/// The slots a row of the variant's page set needs at `budget` pages: the
/// most pages it can select (`budget`; 3 for the evaluation script's floor;
/// SGLang's `max(budget − r, 1) + r`).
pub fn width(variant: Variant, budget: usize) -> usize {
    match variant {
        Variant::Kernel => budget,
        Variant::Eval => budget.max(3),
        Variant::Sglang {
            num_recent_pages: r,
        } => budget.saturating_sub(r).max(1) + r,
    }
}
