//! A packed batch of sequences, checked once for every caller: the
//! indexer's, block selection's, MoBA's, NSA's and InfLLM-v2's packed entry
//! points refuse its mistakes here, with one variant and one message per
//! mistake (each naming the caller's own argument and rows).
//!
//! # The rule
//!
//! The keys of `n_seqs` sequences are concatenated (`n_keys` rows), and
//! sequence `s` owns rows `cu_seqlens[s] .. cu_seqlens[s + 1]`:
//! `cu_seqlens` has `n_seqs + 1` entries, the first 0, each at least the one
//! before and at most `n_keys`, the last `n_keys`. Query `i` belongs to
//! sequence `seq_ids[i]`, which must be `< n_seqs` (`seq_ids` has one entry
//! per query).
//!
//! # Why it holds
//!
//! It is exactly what makes every query's keys a slice of the packed keys:
//! boundaries that rise from 0 to `n_keys` partition the rows, so
//! `cu_seqlens[s] .. cu_seqlens[s + 1]` is in bounds for every `s < n_seqs`
//! and no key belongs to two sequences or to none.
//!
//! # Refusals
//!
//! | mistake | variant |
//! |---|---|
//! | `cu_seqlens` empty | `Invalid` (`cu_seqlens`) |
//! | an entry of `cu_seqlens` negative, first not 0, below the previous or past `n_keys`; the last not `n_keys` | `OutOfRange` (`cu_seqlens`, the entry's index) |
//! | `seq_ids` not one entry per query | `Length` (`seq_ids`) |
//! | an entry of `seq_ids` negative or `>= n_seqs` | `OutOfRange` (`seq_ids`, the entry's index) |
//! | `cu_seqlens_q` not one entry per boundary | `Invalid` (`cu_seqlens_q`) |
//! | `cu_seqlens_q` giving a sequence more queries than its keys / tokens, or decreasing | `OutOfRange` (`cu_seqlens_q`, the entry after the sequence) |
//! | `cu_seqlens_q` not starting at 0 or not ending at the queries | `OutOfRange` (`cu_seqlens_q`, 0) |
//!
//! A second copy of any of these, with its own variant or wording, would let
//! the same batch be refused differently by the rules that read it, so every
//! packed caller goes through this module.

use crate::block_sparse::IndexLike;
use crate::error::{check_len, ArgumentError};
use crate::keys::{CompressedBatch, Heads};

/// `cu_seqlens` as `usize` boundaries, checked against the `n_keys` packed
/// rows they split; `(noun, owner)` names those rows in the messages
/// (`("keys", "index_k")`, `("compressed keys", "ck")`: the caller's own
/// argument).
pub(crate) fn boundaries<C: IndexLike>(
    cu_seqlens: &[C],
    n_keys: usize,
    rows: (&str, &str),
) -> Result<Vec<usize>, ArgumentError> {
    boundaries_named("cu_seqlens", cu_seqlens, n_keys, rows)
}

/// [`boundaries`] of the array named `argument` (a rule taking the queries'
/// boundaries apart from the keys' names each: `cu_seqlens_q`,
/// `cu_seqlens_k`), in the same variants and words.
pub(crate) fn boundaries_named<C: IndexLike>(
    argument: &'static str,
    cu_seqlens: &[C],
    n_keys: usize,
    (noun, owner): (&str, &str),
) -> Result<Vec<usize>, ArgumentError> {
    if cu_seqlens.is_empty() {
        return Err(ArgumentError::Invalid {
            argument,
            message: format!("{argument} is empty: it needs n_seqs + 1 entries, starting at 0"),
        });
    }
    let out_of_range = |index, message| ArgumentError::OutOfRange {
        argument,
        index,
        message,
    };
    let mut bounds = Vec::with_capacity(cu_seqlens.len());
    let mut prev = 0usize;
    for (i, &c) in cu_seqlens.iter().enumerate() {
        let v = c.to_usize();
        if i == 0 && v != Some(0) {
            let message = format!("{argument}[0] = {c}, but the first sequence starts at 0");
            return Err(out_of_range(0, message));
        }
        let v = v.filter(|&v| v >= prev && v <= n_keys).ok_or_else(|| {
            let message = format!(
                "{argument}[{i}] = {c} is out of range: entries must be non-decreasing \
                     (the previous is {prev}) and at most the {n_keys} {noun} of {owner}"
            );
            out_of_range(i, message)
        })?;
        bounds.push(v);
        prev = v;
    }
    if prev != n_keys {
        let message = format!(
            "{argument} ends at {prev}, but {owner} has {n_keys} {noun}: the last entry must \
             be the total count"
        );
        return Err(out_of_range(cu_seqlens.len() - 1, message));
    }
    Ok(bounds)
}

/// Checks the queries' boundaries `cu_q` against the sequences they belong
/// to (`n_seqs + 1` entries, as `other` — the keys' boundaries — has):
/// rising from 0 to the `n_q` queries, sequence `s` holding no more queries
/// than `cap[s]` (its `what`: keys or tokens; its queries are the last of
/// them). MoBA's and NSA's (`cu_seqlens`) and InfLLM-v2's (`cu_seqlens_k`,
/// the tokens of `seq_len`) packed forms refuse alike.
pub(crate) fn query_bounds(
    cu_q: &[usize],
    other: &str,
    cap: &[usize],
    what: &str,
    n_q: usize,
) -> Result<(), ArgumentError> {
    let oor = |index, message| ArgumentError::OutOfRange {
        argument: "cu_seqlens_q",
        index,
        message,
    };
    if cu_q.len() != cap.len() + 1 {
        let message = format!(
            "cu_seqlens_q has {} entries, {other} {}: one per sequence boundary each",
            cu_q.len(),
            cap.len() + 1
        );
        return Err(ArgumentError::Invalid {
            argument: "cu_seqlens_q",
            message,
        });
    }
    for (s, w) in cu_q.windows(2).enumerate() {
        if w[1] < w[0] || w[1] - w[0] > cap[s] {
            let message = format!(
                "cu_seqlens_q gives sequence {s} queries {}..{} but it has {} {what}: queries \
                 are the last of their sequence's {what}, no more than them",
                w[0], w[1], cap[s]
            );
            return Err(oor(s + 1, message));
        }
    }
    if cu_q.first() != Some(&0) || cu_q.last() != Some(&n_q) {
        let message = format!("cu_seqlens_q must rise from 0 to the {n_q} queries, got {cu_q:?}");
        return Err(oor(0, message));
    }
    Ok(())
}

/// Refuses a `seq_ids` of other than one entry per query.
pub(crate) fn check_seq_ids_len(len: usize, n_queries: usize) -> Result<(), ArgumentError> {
    check_len("seq_ids", len, n_queries, || {
        format!("[n_queries={n_queries}]")
    })
}

/// `seq_ids[i] = s` as a sequence index, refused unless it names one of the
/// `n_seqs` sequences `seqs` describes (`cu_seqlens`, or a paged cache's
/// `seq_lens`).
pub(crate) fn seq_id<I: IndexLike>(
    i: usize,
    s: I,
    n_seqs: usize,
    seqs: &str,
) -> Result<usize, ArgumentError> {
    s.to_usize()
        .filter(|&s| s < n_seqs)
        .ok_or_else(|| ArgumentError::OutOfRange {
            argument: "seq_ids",
            index: i,
            message: format!(
                "seq_ids[{i}] = {s} is out of range: {seqs} describes {n_seqs} sequence(s), so \
                 a sequence id must be in 0..{n_seqs}"
            ),
        })
}

/// Every `seq_ids` entry checked by [`seq_id`] (the length is the caller's).
pub(crate) fn check_seq_ids<I: IndexLike>(
    seq_ids: &[I],
    n_seqs: usize,
    seqs: &str,
) -> Result<(), ArgumentError> {
    for (i, &s) in seq_ids.iter().enumerate() {
        seq_id(i, s, n_seqs, seqs)?;
    }
    Ok(())
}

/// One sequence of a packed batch on given compressed keys
/// ([`compressed_batch`]): its first query and query count, its first
/// compressed key and key count, and its tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CompressedSeq {
    pub q0: usize,
    pub n_q: usize,
    pub c0: usize,
    pub n_c: usize,
    pub len: usize,
}

/// One sequence's `seq_len` on given compressed keys (NSA's and InfLLM-v2's
/// calls without `cu_seqlens_k`): at least 1, the last query's own token.
/// The bindings check it before they size an output by it, so that a
/// refused length is named as itself, not as the output's shape.
pub(crate) fn check_seq_len(seq_len: usize) -> Result<(), ArgumentError> {
    if seq_len == 0 {
        return Err(ArgumentError::Invalid {
            argument: "seq_len",
            message: "seq_len must be at least 1 (the query's own token)".into(),
        });
    }
    Ok(())
}

/// The layout of a packed batch on given compressed keys (InfLLM-v2's
/// varlen compressed-key call, and NSA's on the same arguments), checked
/// in that call's order and words: `q` whole `[n_q_heads, d]` rows and `ck`
/// whole `[n_kv_heads, d]` rows (`q_len`, `ck_len` values), `cu_seqlens_k`
/// rising from 0 to `ck`'s keys, `seq_lens` one length a sequence, each in
/// `1 ..= i32::MAX` (a position is an `i32`), each sequence's keys exactly
/// `compressed_len` of its tokens (`cu_seqlens_k`), `cu_seqlens_q` rising
/// from 0 to the queries with no sequence more queries than tokens, and
/// `ck_scale_len` (when given) one a key. `n_q_heads` and `n_kv_heads` and
/// `d` are positive (the callers' own checks come first).
pub(crate) fn compressed_batch(
    q_len: usize,
    ck_len: usize,
    ck_scale_len: Option<usize>,
    heads: Heads,
    batch: &CompressedBatch<'_>,
    compressed_len: impl Fn(usize) -> usize,
) -> Result<Vec<CompressedSeq>, ArgumentError> {
    let Heads {
        n_q_heads,
        n_kv_heads,
        d,
    } = heads;
    let CompressedBatch {
        seq_lens,
        cu_seqlens_q,
        cu_seqlens_k,
    } = *batch;
    let invalid = |argument, message| ArgumentError::Invalid { argument, message };
    let per_q = crate::error::checked_size("q", &[n_q_heads, d])?;
    if !q_len.is_multiple_of(per_q) {
        let message =
            format!("q holds {q_len} values, not whole [n_q_heads={n_q_heads}, d={d}] queries");
        return Err(invalid("q", message));
    }
    let per_c = crate::error::checked_size("ck", &[n_kv_heads, d])?;
    if !ck_len.is_multiple_of(per_c) {
        let message = format!(
            "ck holds {ck_len} values, not whole [n_kv_heads={n_kv_heads}, d={d}] compressed keys"
        );
        return Err(invalid("ck", message));
    }
    let (n_q, n_c) = (q_len / per_q, ck_len / per_c);
    let cu_k = boundaries_named("cu_seqlens_k", cu_seqlens_k, n_c, ("compressed keys", "ck"))?;
    let n_seqs = cu_k.len() - 1;
    check_len("seq_len", seq_lens.len(), n_seqs, || {
        format!("[n_seqs={n_seqs}] (cu_seqlens_k)")
    })?;
    for (s, &len) in seq_lens.iter().enumerate() {
        let oor = |argument, index, message| ArgumentError::OutOfRange {
            argument,
            index,
            message,
        };
        if len == 0 {
            let message = format!("seq_len[{s}] = 0: a sequence has at least one token");
            return Err(oor("seq_len", s, message));
        }
        if len > i32::MAX as usize {
            let message = format!(
                "seq_len[{s}] = {len}: a sequence holds at most {} tokens (an int32 position)",
                i32::MAX
            );
            return Err(oor("seq_len", s, message));
        }
        let (got, want) = (cu_k[s + 1] - cu_k[s], compressed_len(len));
        if got != want {
            let message = format!(
                "cu_seqlens_k gives sequence {s} {got} compressed keys, but its seq_len[{s}] = \
                 {len} tokens have {want}"
            );
            return Err(oor("cu_seqlens_k", s + 1, message));
        }
    }
    query_bounds(cu_seqlens_q, "cu_seqlens_k", seq_lens, "tokens", n_q)?;
    if let Some(len) = ck_scale_len {
        check_len("ck_scale", len, n_c, || format!("[n_c={n_c}]"))?;
    }
    Ok((0..n_seqs)
        .map(|s| CompressedSeq {
            q0: cu_seqlens_q[s],
            n_q: cu_seqlens_q[s + 1] - cu_seqlens_q[s],
            c0: cu_k[s],
            n_c: cu_k[s + 1] - cu_k[s],
            len: seq_lens[s],
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use crate::block_sparse::{select_packed_into, BlockSparseConfig};
    use crate::indexer::{indexer_topk_packed_into, IndexerInputs, IndexerShape};
    use crate::keys::Encoded;
    use crate::ArgumentError;

    /// One packed call of each rule over 10 keys of `d = 2`, one query per
    /// `seq_ids` entry (`query_pos` 0): their refusals, which must agree.
    fn refusals(cu: &[usize], seq_ids: &[usize], n_queries: usize) -> [ArgumentError; 2] {
        let (d, n_keys) = (2, 10);
        let k = vec![1.0f32; n_keys * d];
        let q = vec![1.0f32; n_queries * d];
        let (w, pos) = (vec![1.0f32; n_queries], vec![0usize; n_queries]);
        let shape = IndexerShape {
            n_queries,
            n_heads: 1,
            d,
            n_keys,
        };
        let inputs = IndexerInputs {
            q: Encoded::F32(&q),
            weights: &w,
            k: Encoded::F32(&k),
            key_scale: None,
            query_pos: &pos,
            compress_ratio: 1,
        };
        let mut out = vec![7i32; n_queries * 2];
        let indexer = indexer_topk_packed_into(&shape, &inputs, cu, seq_ids, 2, 0, &mut out, None)
            .expect_err("the indexer refuses");
        assert!(
            out.iter().all(|&x| x == 7),
            "the indexer wrote before refusing"
        );
        let cfg = BlockSparseConfig {
            block_size: 4,
            top_blocks: 2,
            init_blocks: 0,
            local_blocks: 0,
        };
        let blocks = select_packed_into(&q, n_queries, 1, &k, d, cu, seq_ids, &pos, &cfg, &mut out)
            .expect_err("block selection refuses");
        assert!(
            out.iter().all(|&x| x == 7),
            "block selection wrote before refusing"
        );
        [indexer, blocks]
    }

    /// A refusal's variant, argument and entry index.
    fn kind(e: &ArgumentError) -> (&'static str, &'static str, Option<usize>) {
        let variant = match e {
            ArgumentError::Invalid { .. } => "Invalid",
            ArgumentError::OutOfRange { .. } => "OutOfRange",
            ArgumentError::Length { .. } => "Length",
            _ => "other",
        };
        let index = match e {
            ArgumentError::OutOfRange { index, .. } => Some(*index),
            _ => None,
        };
        (variant, e.argument(), index)
    }

    /// Every packed-batch mistake is refused by the indexer and by block
    /// selection with the same variant, argument, index and message.
    #[test]
    fn the_indexer_and_block_selection_refuse_each_mistake_alike() {
        let (cu, sid) = ("cu_seqlens", "seq_ids");
        let cases: [(&[usize], &[usize], usize, _, &str); 8] = [
            (&[], &[0], 1, ("Invalid", cu, None), "cu_seqlens is empty"),
            (
                &[1, 10],
                &[0],
                1,
                ("OutOfRange", cu, Some(0)),
                "starts at 0",
            ),
            (
                &[0, 6, 4, 10],
                &[0],
                1,
                ("OutOfRange", cu, Some(2)),
                "non-decreasing",
            ),
            (
                &[0, 12, 10],
                &[0],
                1,
                ("OutOfRange", cu, Some(1)),
                "at most the 10",
            ),
            (
                &[0, 4, 12],
                &[0],
                1,
                ("OutOfRange", cu, Some(2)),
                "at most the 10",
            ),
            (
                &[0, 4, 9],
                &[0],
                1,
                ("OutOfRange", cu, Some(2)),
                "ends at 9",
            ),
            (
                &[0, 4, 10],
                &[0, 2],
                2,
                ("OutOfRange", sid, Some(1)),
                "seq_ids[1] = 2",
            ),
            (
                &[0, 4, 10],
                &[0, 1],
                1,
                ("Length", sid, None),
                "seq_ids has 2 entries",
            ),
        ];
        for (cu, seq_ids, n_queries, want, words) in cases {
            let [indexer, blocks] = refusals(cu, seq_ids, n_queries);
            assert_eq!(kind(&indexer), want, "{cu:?} {seq_ids:?}: {indexer:?}");
            assert_eq!(indexer, blocks, "{cu:?} {seq_ids:?}");
            assert!(indexer.to_string().contains(words), "{indexer}");
        }
    }

    /// A negative boundary or sequence id (block selection reads signed
    /// integers) is an entry out of range, in the same words.
    #[test]
    fn a_negative_entry_is_out_of_range() {
        let e = super::boundaries(&[0i64, -4, 10], 10, ("keys", "k")).unwrap_err();
        assert!(
            matches!(
                e,
                ArgumentError::OutOfRange {
                    argument: "cu_seqlens",
                    index: 1,
                    ..
                }
            ),
            "{e:?}"
        );
        let e = super::boundaries(&[-1i32, 10], 10, ("keys", "k")).unwrap_err();
        assert!(
            matches!(
                e,
                ArgumentError::OutOfRange {
                    argument: "cu_seqlens",
                    index: 0,
                    ..
                }
            ),
            "{e:?}"
        );
        let e = super::seq_id(3, -1i64, 2, "cu_seqlens").unwrap_err();
        assert!(
            matches!(
                e,
                ArgumentError::OutOfRange {
                    argument: "seq_ids",
                    index: 3,
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(
            super::boundaries(&[0u32, 4, 4, 10], 10, ("keys", "k")),
            Ok(vec![0, 4, 4, 10])
        );
        assert_eq!(
            super::boundaries::<usize>(&[0], 0, ("keys", "k")),
            Ok(vec![0])
        );
    }
}
