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
//! # The paper's Eq. 9 ([`Window::Eq9`], a named variant)
//!
//! The NSA paper compresses keys over overlapping blocks (length `l = 32`,
//! stride `d = 16`) and scores selection block `j` (`l' = 64` tokens) by its
//! Eq. 9, `Σ_{m < l'/d} Σ_{n < l/d} p_cmp[(l'/d)·j − m − n]`: the keys
//! `[4j − 4, 4j]`, weighted 1, 2, 2, 2, 1. The keys that overlap block `j`
//! are `[4j − 1, 4j + 3]` (InfLLM-v2's pooling window), so the two differ;
//! fla implements neither (its keys are the block means). kvselect's Eq. 9:
//! compressed key `c` the mean of tokens `c·d .. c·d + l` (the paper's
//! learned `φ` replaced by the mean), seen once its last token is
//! ([`crate::infllm::Geometry::visible`]), InfLLM-v2's stage 1, block `j <
//! IC` scoring the float32 sum above (`m` outer, `n` inner; keys below 0 or
//! unseen add nothing), the forced blocks and candidates as fla's. Its bound
//! (`kvselect.reference.nsa.eq9_score_bound`): the one below with `γ_l` for
//! `γ_bs`, then the sum of `A = (l'/d)(l/d)` nonnegative group sums: `R' =
//! (1 + R)(1 + γ_A) − 1`, `T' = A·T·(1 + γ_A)`.
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
mod cached_packed;
mod paged;
#[cfg(test)]
mod tests;
mod top;

/// Runs NSA's kernel family (`nsa.compress`) at `isa` (the reach test's
/// probe).
#[cfg(test)]
pub(crate) fn dispatch_probe(isa: crate::simd::Isa) {
    api::probe(isa);
    top::probe(isa);
}

/// The named sizes the entry points take (`q` `[.., n_q_heads, d]`, keys
/// `[.., n_kv_heads, d]`; a packed batch's lengths and boundaries).
pub use crate::keys::{CompressedBatch, Heads};
pub use api::{
    block_scores_compressed_into, block_scores_into, block_scores_packed_into,
    block_scores_window_into, compress_into, compress_window_into, select_compressed_into,
    select_into, select_packed_into, select_window_into,
};
pub use cached_packed::{block_scores_compressed_packed_into, select_compressed_packed_into};
pub use paged::{block_scores_paged_into, select_paged_into};

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

/// Which compressed keys a block's score reads (see the module docs, "The
/// paper's Eq. 9").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Window {
    /// fla's: one compressed key per block (the block's mean); block `c`'s
    /// score is its group sum `S_c`.
    Fla,
    /// The NSA paper's Eq. 9: compressed keys of `kernel_size` tokens every
    /// `kernel_stride` (the paper's `l = 32`, `d = 16`), block `j`'s score
    /// `Σ_{m < bs/d} Σ_{n < l/d} S[(bs/d)·j − m − n]` (keys outside
    /// `0 .. n_vis` add nothing): at blocks of 64 the keys `[4j − 4, 4j]`,
    /// weighted 1, 2, 2, 2, 1.
    Eq9 {
        kernel_size: usize,
        kernel_stride: usize,
    },
}

/// The paper's compression (§3.3.1, "block length l = 32, sliding stride
/// d = 16"): [`Window::Eq9`]'s default sizes.
pub const PAPER_KERNEL_SIZE: usize = 32;
/// See [`PAPER_KERNEL_SIZE`].
pub const PAPER_KERNEL_STRIDE: usize = 16;

impl Window {
    /// The compression geometry: kernel and stride the block for fla's
    /// window (so `compressed_len(n) = n / bs` and `visible(p) = (p + 1) /
    /// bs`, fla's `NC`), the paper's sizes for Eq. 9.
    pub(crate) fn geometry(self, block_size: usize) -> crate::infllm::Geometry {
        let (kernel_size, kernel_stride) = match self {
            Window::Fla => (block_size, block_size),
            Window::Eq9 {
                kernel_size,
                kernel_stride,
            } => (kernel_size, kernel_stride),
        };
        crate::infllm::Geometry {
            block_size,
            kernel_size,
            kernel_stride,
        }
    }

    /// Refuses Eq. 9 sizes of 0, or a block or kernel that is not whole
    /// strides (the formula's `l'/d` and `l/d`).
    pub(crate) fn check(self, block_size: usize) -> Result<(), crate::ArgumentError> {
        let Window::Eq9 {
            kernel_size,
            kernel_stride,
        } = self
        else {
            return Ok(());
        };
        let invalid = |argument, message| crate::ArgumentError::Invalid { argument, message };
        if kernel_stride == 0 || !block_size.is_multiple_of(kernel_stride) {
            let message = format!(
                "kernel_stride ({kernel_stride}) must divide block_size ({block_size}): Eq. 9 \
                 sums block_size / kernel_stride compressed keys a block"
            );
            return Err(invalid("kernel_stride", message));
        }
        if kernel_size == 0 || !kernel_size.is_multiple_of(kernel_stride) {
            let message = format!(
                "kernel_size ({kernel_size}) must be a positive multiple of kernel_stride \
                 ({kernel_stride})"
            );
            return Err(invalid("kernel_size", message));
        }
        Ok(())
    }
}

/// Eq. 9's score of block `j` from the group sums `sums[..n_vis]`: the
/// float32 sum over `m` (outer) and `n` (inner) in order.
fn eq9(sums: &[f32], j: usize, per_block: usize, per_kernel: usize) -> f32 {
    let mut acc = 0.0f32;
    for m in 0..per_block {
        for n in 0..per_kernel {
            if let Some(i) = (per_block * j).checked_sub(m + n) {
                acc += sums.get(i).copied().unwrap_or(0.0);
            }
        }
    }
    acc
}

/// The score of every block `0..out.len()` for the query at position `p`
/// from its group sums (`sums[c]` for the keys it sees): forced `+inf`,
/// `c < IC` its window's score, the rest `−inf` (no candidates).
pub(crate) fn block_scores(cfg: &Config, window: Window, sums: &[f32], p: usize, out: &mut [f32]) {
    let ic = p / cfg.block_size;
    if window == Window::Fla {
        // The loop below, in three passes: the group sums of the blocks
        // before the query's, `−inf` from there, then the forced blocks
        // (`b < init_blocks`, `ic + 1 − local_blocks <= b <= ic`) `+inf`.
        let m = ic.min(out.len());
        out[..m].copy_from_slice(&sums[..m]);
        out[m..].fill(f32::NEG_INFINITY);
        let local = (ic + 1).saturating_sub(cfg.local_blocks)..ic + 1;
        for b in (0..cfg.init_blocks.min(out.len())).chain(local) {
            if b < out.len() && cfg.forced(b, ic) {
                out[b] = f32::INFINITY;
            }
        }
        return;
    }
    for (b, o) in out.iter_mut().enumerate() {
        *o = if cfg.forced(b, ic) {
            f32::INFINITY
        } else if b < ic {
            match window {
                Window::Fla => sums[b],
                Window::Eq9 {
                    kernel_size,
                    kernel_stride,
                } => eq9(
                    sums,
                    b,
                    cfg.block_size / kernel_stride,
                    kernel_size / kernel_stride,
                ),
            }
        } else {
            f32::NEG_INFINITY
        };
    }
}

/// The row of a query from its block scores: the candidates (scores other than
/// `−inf`) in the total order, the first `out.len()` of them ascending,
/// then `-1`. `keys` is scratch.
///
/// The order is strict (ids differ), so its first `k` are one set, however
/// found. For rows of at most [`ROW_SELECT_MAX`] blocks, or `k` above
/// [`ROW_SCAN_MAX`], the `k`-th key is found by counting ([`top`], the
/// `nsa.top` kernels: a prefill's rows, a few dozen candidates each; an
/// order key a block and `select_nth_unstable` took a tenth of the call
/// before), at the level dispatch chose ([`crate::simd::Isa::best`]: the
/// callers pass no level; every level writes the same row, as the rule
/// fixes it and `src/nsa/top.rs`'s tests check). Longer rows with a small `k` (decode over long sequences) take
/// one pass that keeps the best `k` so far, sorted (a block enters only if
/// it comes before the `k`-th; few do), each block's integer key
/// ([`order_key`]) ranking it by one comparison.
pub(crate) fn row(scores: &[f32], keys: &mut Vec<u64>, out: &mut [i32]) {
    let k = out.len();
    let n = scores.len();
    if n <= ROW_SELECT_MAX || k > ROW_SCAN_MAX {
        return top::top(crate::simd::Isa::best(), scores, keys, out);
    }
    keys.clear();
    out.fill(-1);
    if k == 0 {
        return;
    }
    assert!(n <= u32::MAX as usize, "block ids fit 32 bits");
    // Once `k` are kept, block `b` (an id above every kept one) comes
    // before the `k`-th, `last`, iff its score is above `last`'s (a tie
    // goes to the lower id), or `last`'s is NaN and `b`'s is not (NaN
    // comes last): `s > t` with `t` the `k`-th's score, `−inf` for NaN.
    // A NaN `s` fails the test, as it fails the order.
    // Once full, 8 blocks none of which passes the test are skipped
    // together (the test without a branch a block).
    let mut t = f32::INFINITY;
    let mut b = 0;
    while b < n {
        if keys.len() == k && b + 8 <= n {
            let any = scores[b..b + 8].iter().fold(false, |a, &x| a | (x > t));
            if !any {
                b += 8;
                continue;
            }
        }
        let s = scores[b];
        let full = keys.len() == k;
        if s != f32::NEG_INFINITY && (!full || s > t) {
            if full {
                keys.pop();
            }
            let key = order_key(s, b);
            let at = keys.partition_point(|&x| x > key);
            keys.insert(at, key);
            if let (true, Some(&last)) = (keys.len() == k, keys.last()) {
                let sl = scores[key_id(last)];
                t = if sl.is_nan() { f32::NEG_INFINITY } else { sl };
            }
        }
        b += 1;
    }
    let mut ids: [usize; ROW_SCAN_MAX] = [0; ROW_SCAN_MAX];
    for (i, &key) in ids.iter_mut().zip(keys.iter()) {
        *i = key_id(key);
    }
    let ids = &mut ids[..keys.len()];
    ids.sort_unstable();
    for (o, &b) in out.iter_mut().zip(ids.iter()) {
        *o = b as i32;
    }
}

/// [`row`] of two rows (`scores[r]` into `out[r]`): the same ids as two
/// calls. Where both rows take the counting kernel, their searches run
/// side by side ([`top::top2`]: a prefill's rows, each search alone waiting
/// on its counts' latency); otherwise a row at a time.
pub(crate) fn row2(scores: [&[f32]; 2], keys: &mut Vec<u64>, out: [&mut [i32]; 2]) {
    let counted = |s: &[f32], o: &[i32]| s.len() <= ROW_SELECT_MAX || o.len() > ROW_SCAN_MAX;
    let [oa, ob] = out;
    if counted(scores[0], oa) && counted(scores[1], ob) {
        return top::top2(crate::simd::Isa::best(), scores, keys, [oa, ob]);
    }
    row(scores[0], keys, oa);
    row(scores[1], keys, ob);
}

/// Block `b`'s key in the total order (score descending, `+inf` first, NaN
/// after every number, ties to the lower id), `−inf` (no candidate) below
/// them all: larger keys come first. The high 32 bits are the score's bits
/// mapped to an unsigned order (negative scores' bits inverted, positive
/// ones' sign bit set, `−0` made `+0` first as `partial_cmp` makes them
/// equal; NaN 1, `−inf` 0, below every other number's); the low 32 bits
/// `u32::MAX − b`. Keys of distinct blocks differ. No branch.
#[inline(always)]
fn order_key(s: f32, b: usize) -> u64 {
    let bits = (s + 0.0).to_bits();
    let ord = bits ^ ((((bits as i32) >> 31) as u32) | 0x8000_0000);
    let ord = if s.is_nan() { 1 } else { ord };
    let ord = if s == f32::NEG_INFINITY { 0 } else { ord };
    (u64::from(ord) << 32) | u64::from(u32::MAX - b as u32)
}

/// The block id of an [`order_key`].
#[inline(always)]
fn key_id(key: u64) -> usize {
    (u32::MAX - key as u32) as usize
}

/// The widest row [`row`] fills by one insertion pass (wider: selection).
pub(crate) const ROW_SCAN_MAX: usize = 64;

/// The longest row [`row`] ranks by selection at any width (longer, with a
/// width up to [`ROW_SCAN_MAX`]: the insertion pass).
pub(crate) const ROW_SELECT_MAX: usize = 512;
