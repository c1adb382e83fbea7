//! The sizes a rule's queries and keys are read with, named.
//!
//! InfLLM-v2's, NSA's and MoBA's entry points read `q` as `[.., n_q_heads,
//! d]` and the keys as `[.., n_kv_heads, d]`; a packed batch on given
//! compressed keys (InfLLM-v2's varlen call, NSA's on the same arguments)
//! adds three arrays of lengths and boundaries. All of them are `usize`s or
//! `&[usize]`s, so as positional arguments two of them could be swapped
//! without a compile error, and a size check does not always catch it
//! (`n_q_heads` ↔ `n_kv_heads` when both divide each other's products,
//! `cu_seqlens_q` ↔ `cu_seqlens_k` when they happen to agree). These
//! structs carry them by name instead: [`Heads`] and [`CompressedBatch`].
//!
//! They hold the values as given; each rule checks them in its own order
//! and words (the refusals name `d`, `n_kv_heads`, `q`, `seq_len`,
//! `cu_seqlens_q`, `cu_seqlens_k` as before).

/// The heads of a call's queries and keys: `q` rows of `n_q_heads` heads,
/// key rows of `n_kv_heads` heads, each head `d` elements; query head `h`
/// reads KV head `h / (n_q_heads / n_kv_heads)`.
///
/// ```
/// use kvselect::keys::Heads;
/// let heads = Heads { n_q_heads: 32, n_kv_heads: 2, d: 128 };
/// assert_eq!(heads.n_q_heads / heads.n_kv_heads, 16);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Heads {
    /// Query heads per query; a positive multiple of `n_kv_heads`.
    pub n_q_heads: usize,
    /// KV heads per key row.
    pub n_kv_heads: usize,
    /// Elements per head (queries and keys alike).
    pub d: usize,
}

/// A packed batch on given compressed keys, as InfLLM-v2's varlen call
/// takes it: sequence `s` has `seq_lens[s]` tokens, queries
/// `cu_seqlens_q[s] .. cu_seqlens_q[s + 1]` (the last of its tokens) and
/// compressed keys `cu_seqlens_k[s] .. cu_seqlens_k[s + 1]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompressedBatch<'a> {
    /// Tokens per sequence, one a sequence.
    pub seq_lens: &'a [usize],
    /// The queries' boundaries: `n_seqs + 1` entries rising from 0.
    pub cu_seqlens_q: &'a [usize],
    /// The compressed keys' boundaries: `n_seqs + 1` entries rising from 0.
    pub cu_seqlens_k: &'a [usize],
}
