//! kvselect: which KV positions a query may attend to in sparse attention.
//!
//! The decision half of sparse attention, exact on the CPU, with the
//! baselines and metrics needed to judge a decision:
//!
//! - [`witness`]: segment witnesses on top of a learned sparse top-k
//!   (a port of the candidate policy of vLLM PR 47942);
//! - [`block_sparse`]: MiniMax-M3's rule for which 128-token KV blocks each
//!   KV head may read;
//! - [`attention`]: baseline selectors (dense, local, random, sink + window,
//!   the oracle top-k) that the null models are rows of, and a sparse causal
//!   attention pass (GQA, MLA) to judge a selection by its output;
//! - [`indexer`]: DeepSeek's lightning indexer, the learned top-k itself
//!   (exact, one total order, witnesses in the same pass);
//! - [`keys`]: the element formats engines hold keys in (float32, float16,
//!   bfloat16, float8 e4m3fn), decoded exactly, read in place;
//! - [`metrics`]: dense attention probabilities, batched coverage and
//!   recall, output relative error;
//! - [`compressed`]: DeepSeek-V4's attention sets (window + compressed
//!   entries), vLLM's combined index rows, the entry → tokens map and
//!   GLM-5-Next's pool expansion;
//! - [`check`]: is an engine's selection right? The token top-k rule (and
//!   the block rule, the witnesses, the paged and packed layouts) applied to
//!   the rows a kernel returned, with the tolerance a lower-precision engine
//!   is owed, and a report of every violation;
//! - [`quest`]: Quest's query-aware page selection (page key bounds,
//!   their score bound, the page a decoding query reads; the original and
//!   SGLang's variants);
//! - [`vslash`]: MInference's vertical-slash estimate (the last queries'
//!   column and diagonal sums, their top-k, the engines' index layout);
//! - [`pool`]: kvselect's own rayon pool (resizable, fork-safe), which every
//!   batched call runs on;
//! - [`simd`]: run-time SIMD dispatch: [`simd::Isa::best`], the one entry
//!   point to the level, and the tokens (such as [`simd::Avx2`]) without
//!   which no AVX2 or AVX-512 kernel can be called; each kernel family is
//!   dispatched once, by `simd::dispatch!`.
//!
//! A concept with parts is a folder: its `mod.rs` states the rule and
//! re-exports the public API, beside files for its checks, its batching and
//! its kernels, one per instruction set (`kernels/portable.rs`,
//! `kernels/avx2.rs`; `witness/scan/`), and its check of an engine's rows
//! (`check.rs`, re-exported from [`check`]). Errors shared between modules
//! live in `error.rs` (re-exported once, at the crate root:
//! [`ArgumentError`]), and the checks of a packed batch that the
//! indexer and block selection both take in `packed.rs`.
//!
//! The core works on flat row-major slices with explicit shapes, returns
//! `Result` for every refusal and never panics on user input. The Python
//! bindings (feature `python`, `src/python/`) are the only code that knows
//! PyO3 and NumPy: they turn arguments into checked inputs, release the GIL,
//! call the core and map its errors.

// Every `unsafe` block says why it is sound (`// SAFETY:`); CI runs clippy
// with `-D warnings`.
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod attention;
pub mod block_sparse;
pub mod check;
pub mod compressed;
mod error;
pub mod eviction;
pub mod exp;
pub mod indexer;
pub mod infllm;
pub mod keys;
pub mod metrics;
pub mod moba;
pub mod nsa;
mod packed;
pub mod pool;
pub mod quest;
mod rounding;
pub mod simd;
pub mod vslash;
pub mod witness;

#[cfg(feature = "python")]
mod python;

pub use error::ArgumentError;
