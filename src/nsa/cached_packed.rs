//! NSA on given compressed keys over a packed batch of sequences
//! ([`block_scores_compressed_packed_into`], [`select_compressed_packed_into`]):
//! InfLLM-v2's varlen form of its compressed-key call (`cu_seqlens_q`,
//! `cu_seqlens_k`, one length a sequence), for NSA's compressed keys.
//!
//! The rule: sequence `s` is queries `cu_seqlens_q[s] .. cu_seqlens_q[s +
//! 1]` of `q` (the last of its `seq_lens[s]` tokens) and compressed keys
//! `cu_seqlens_k[s] .. cu_seqlens_k[s + 1]` of `ck` (exactly the window's
//! compressed keys of its tokens); each of its rows is the dense call's
//! ([`super::select_compressed_into`]) on its own queries and keys (block
//! ids from 0), block scores NaN past its own blocks. Why it holds: every
//! sequence is checked first, then each runs the dense call on its slices
//! (the same code, so the same bits). What would break it: a sequence's
//! keys sliced off by one (its softmax would read its neighbour's).

use super::api::{
    check_block_counts, check_compressed, check_heads, check_out, check_sizes, compressed_rows,
    score_row, CompressedCall, SelectRows,
};
use super::{Config, Window};
use crate::error::{checked_size, ArgumentError};
use crate::keys::{CompressedBatch, Encoded, Heads};
use crate::packed::CompressedSeq as Seq;
use crate::simd::Isa;

/// The packed batch checked (every refusal before anything is written), in
/// InfLLM-v2's packed call's order and words: the sizes and settings, `q`
/// and `ck` whole rows, `cu_seqlens_k` rising from 0 to `ck`'s keys,
/// `seq_len` one positive length a sequence, each sequence's keys its
/// tokens' (`cu_seqlens_k`), `cu_seqlens_q` its queries (no more than its
/// tokens), `ck_scale` one a key.
fn check(
    q_len: usize,
    ck_len: usize,
    ck_scale: Option<&[f32]>,
    heads: Heads,
    seqs: &CompressedBatch<'_>,
    (cfg, window): (&Config, Window),
) -> Result<Vec<Seq>, ArgumentError> {
    check_sizes(heads.n_kv_heads, heads.d, cfg.block_size)?;
    window.check(cfg.block_size)?;
    check_heads(heads, cfg)?;
    let geo = window.geometry(cfg.block_size);
    crate::packed::compressed_batch(
        q_len,
        ck_len,
        ck_scale.map(<[f32]>::len),
        heads,
        seqs,
        |len| geo.compressed_len(len),
    )
}

/// [`super::block_scores_compressed_into`] over a packed batch (see the
/// module docs): `seqs` names `seq_lens`, `cu_seqlens_q` and `cu_seqlens_k`; `out`
/// `[total_q, n_kv_heads, max_blocks]`, `max_blocks` the most blocks of a
/// sequence, each row the dense call's on its own sequence, then NaN.
///
/// # Errors
/// As [`super::block_scores_compressed_into`] (`q`, `ck` not whole rows),
/// `cu_seqlens_k` not rising from 0 to the compressed keys or giving a
/// sequence other than its tokens' compressed keys (`cu_seqlens_k`),
/// `seq_lens` not one per sequence, 0 or past an int32 position
/// (`seq_len`), `cu_seqlens_q` not rising from 0 to the queries or giving a
/// sequence more queries than tokens (`cu_seqlens_q`). Nothing is written
/// before every check has passed.
pub fn block_scores_compressed_packed_into(
    q: Encoded<'_>,
    ck: Encoded<'_>,
    ck_scale: Option<&[f32]>,
    heads: Heads,
    seqs: &CompressedBatch<'_>,
    (cfg, window): (&Config, Window),
    out: &mut [f32],
) -> Result<(), ArgumentError> {
    let isa = Isa::best();
    let checked = check(q.len(), ck.len(), ck_scale, heads, seqs, (cfg, window))?;
    let Heads {
        n_q_heads,
        n_kv_heads,
        d,
    } = heads;
    let n_q = q.len() / (n_q_heads * d);
    let nb = checked
        .iter()
        .map(|s| cfg.n_blocks(s.len))
        .max()
        .unwrap_or(0);
    check_out(
        out.len(),
        checked_size("out", &[n_q, n_kv_heads, nb])?,
        || format!("[total_q={n_q}, n_kv_heads={n_kv_heads}, max_blocks={nb}]"),
    )?;
    let cw = (cfg, window);
    let mut part = Vec::new();
    for (s, call, qs, keys) in each_dense_call(q, (ck, ck_scale), heads, &checked, cw)? {
        let snb = cfg.n_blocks(s.len);
        part.clear();
        part.resize(s.n_q * n_kv_heads * snb, 0.0f32);
        compressed_rows(isa, &call, qs, keys, heads, cw, &mut part, snb, score_row);
        let rows = &mut out[s.q0 * n_kv_heads * nb..(s.q0 + s.n_q) * n_kv_heads * nb];
        for (o, p) in rows
            .chunks_exact_mut(nb.max(1))
            .zip(part.chunks_exact(snb.max(1)))
        {
            o[..snb].copy_from_slice(p);
            o[snb..].fill(f32::NAN);
        }
    }
    Ok(())
}

/// [`super::select_compressed_into`] over a packed batch (see
/// [`block_scores_compressed_packed_into`]): `out` `[total_q, n_kv_heads,
/// block_counts]`, each row the dense call's on its own sequence (block
/// ids of that sequence, from 0).
///
/// # Errors
/// `block_counts` 0 (`block_counts`), and as
/// [`block_scores_compressed_packed_into`].
pub fn select_compressed_packed_into(
    q: Encoded<'_>,
    ck: Encoded<'_>,
    ck_scale: Option<&[f32]>,
    heads: Heads,
    seqs: &CompressedBatch<'_>,
    (cfg, window): (&Config, Window),
    out: &mut [i32],
) -> Result<(), ArgumentError> {
    check_block_counts(cfg)?;
    let checked = check(q.len(), ck.len(), ck_scale, heads, seqs, (cfg, window))?;
    let Heads {
        n_q_heads,
        n_kv_heads,
        d,
    } = heads;
    let n_q = q.len() / (n_q_heads * d);
    let w = cfg.block_counts;
    check_out(
        out.len(),
        checked_size("out", &[n_q, n_kv_heads, w])?,
        || format!("[total_q={n_q}, n_kv_heads={n_kv_heads}, block_counts={w}]"),
    )?;
    let (cw, isa) = ((cfg, window), Isa::best());
    for (s, call, qs, keys) in each_dense_call(q, (ck, ck_scale), heads, &checked, cw)? {
        let rows = &mut out[s.q0 * n_kv_heads * w..(s.q0 + s.n_q) * n_kv_heads * w];
        compressed_rows(isa, &call, qs, keys, heads, cw, rows, w, SelectRows);
    }
    Ok(())
}

/// One sequence's dense call on given compressed keys: the sequence, its
/// checks' result, its queries, its compressed keys and their scales.
type DenseCall<'a, 'k> = (
    &'a Seq,
    CompressedCall,
    Encoded<'k>,
    (Encoded<'k>, Option<&'k [f32]>),
);

/// Each sequence with queries, sliced out of the batch, and the dense call's
/// own checks on its slices, all run before any row is written, so that a
/// refusal, from the batch's checks or a dense call's, leaves `out`
/// untouched. The batch's checks cover the dense ones today; running them
/// here keeps that true if one is ever added to the dense call alone.
fn each_dense_call<'a, 'k>(
    q: Encoded<'k>,
    (ck, ck_scale): (Encoded<'k>, Option<&'k [f32]>),
    heads: Heads,
    checked: &'a [Seq],
    cw: (&Config, Window),
) -> Result<Vec<DenseCall<'a, 'k>>, ArgumentError> {
    let (qr, cr) = (heads.n_q_heads * heads.d, heads.n_kv_heads * heads.d);
    checked
        .iter()
        .filter(|s| s.n_q > 0)
        .map(|s| {
            let qs = q.slice(s.q0 * qr, (s.q0 + s.n_q) * qr);
            let cs = ck.slice(s.c0 * cr, (s.c0 + s.n_c) * cr);
            let sc = ck_scale.map(|x| &x[s.c0..s.c0 + s.n_c]);
            let call = check_compressed(qs.len(), cs.len(), sc, heads, s.len, cw)?;
            Ok((s, call, qs, (cs, sc)))
        })
        .collect()
}
