//! The lightning indexer's top-k (raises `SelectionError`).

use pyo3::prelude::*;

use super::args::{detach, positions, Args, EncodedIn, Obj, Opt, I32};
use super::errors::{refuse, Domain};
use crate::indexer::{self, IndexerInputs, IndexerShape};

const S: Args = Args(Domain::Selection);

/// The lightning indexer's top-k (DeepSeek-V3.2/V4, GLM-5), single-sequence
/// form: for each query, the ``topk`` positions of ``[0, L)``, ``L =
/// min(query_pos + 1, T)``, with the largest ``score(t) = key_scale[t] *
/// sum_h weights[h] * max(index_q[h] . index_k[t], 0)``, in rank order
/// (score descending, ties to the lower position, -0.0 == +0.0, NaN last),
/// then -1: int32 ``[n_queries, topk]``.
///
/// ``index_q`` is ``[n_queries, H, d]``, ``weights`` float32 ``[n_queries,
/// H]`` (softmax scale, H**-0.5 and any query scale folded in), ``index_k``
/// ``[T, d]``, ``key_scale`` float32 ``[T]`` or None. Keys and queries may
/// be float32, float16, or ``ml_dtypes`` bfloat16 / float8_e4m3fn arrays,
/// read in place; a raw ``uint16`` / ``uint8`` view (``t.view(torch.uint8)
/// .numpy()``) needs ``key_format`` / ``query_format`` ("bfloat16",
/// "float16", "float8_e4m3fn"). ``num_segments=S`` (1..=64) returns the
/// reserved-tail witness row; ``out=`` reuses a buffer; ``scores_out=``
/// (float32 ``[n_queries, topk]``) receives each entry's score (NaN at -1).
#[pyfunction]
#[pyo3(
    signature = (index_q, weights, index_k, query_pos, topk, *, key_scale=None, key_format=None,
                 query_format=None, num_segments=None, out=None, scores_out=None),
    text_signature = "(index_q, weights, index_k, query_pos, topk, *, key_scale=None, \
                      key_format=None, query_format=None, num_segments=0, out=None, scores_out=None)"
)]
#[allow(clippy::too_many_arguments)]
fn indexer_topk<'py>(
    py: Python<'py>,
    index_q: &Obj<'py>,
    weights: &Obj<'py>,
    index_k: &Obj<'py>,
    query_pos: &Obj<'py>,
    topk: &Obj<'py>,
    key_scale: Opt<'_, 'py>,
    key_format: Option<&str>,
    query_format: Option<&str>,
    num_segments: Opt<'_, 'py>,
    out: Opt<'_, 'py>,
    scores_out: Opt<'_, 'py>,
) -> PyResult<I32<'py>> {
    let (q, q_shape) = EncodedIn::new(S, index_q, "index_q", query_format)?;
    let [n, h, _] = S.dims::<3>(q.untyped(), "index_q", "[n_queries, n_heads, d]")?;
    let w = S.input::<f32, 2>(weights, "weights", "[n_queries, n_heads]")?;
    let (k, _) = EncodedIn::new(S, index_k, "index_k", key_format)?;
    let [t, d] = S.dims::<2>(k.untyped(), "index_k", "[n_keys, d]")?;
    if q_shape[2] != d {
        let msg = format!("index_q has d={} but index_k has d={d}", q_shape[2]);
        return Err(refuse(Domain::Selection, "index_q", msg));
    }
    let scale = match key_scale {
        Some(c) if !c.is_none() => Some(S.input::<f32, 1>(c, "key_scale", "[n_keys]")?),
        _ => None,
    };
    let pos = positions(S, query_pos, "query_pos")?;
    let topk = S.count(topk, "topk", i32::MAX as u64)?;
    let segs = match num_segments {
        Some(s) if !s.is_none() => S.count_within(s, "num_segments", u64::MAX, 64)?,
        _ => 0,
    };
    let mut inputs = vec![q.untyped(), w.untyped(), k.untyped()];
    inputs.extend(scale.as_ref().map(|c| c.untyped()));
    let mut out = S.output::<i32>(py, out, &[n, topk], &inputs)?;
    let mut scores = match scores_out {
        Some(s) if !s.is_none() => {
            let inputs = [&inputs[..], &[out.untyped()]].concat();
            let buf = S.inplace::<f32>(s, "scores_out", 2, &inputs)?;
            if buf.shape() != [n, topk] {
                let msg = format!(
                    "scores_out must have shape [{n}, {topk}], got {:?}",
                    buf.shape()
                );
                return Err(refuse(Domain::Selection, "scores_out", msg));
            }
            Some(buf)
        }
        _ => None,
    };
    let shape = IndexerShape {
        n_queries: n,
        n_heads: h,
        d,
        n_keys: t,
    };
    let c = scale.as_ref().map(|c| c.slice()).transpose()?;
    let inputs = IndexerInputs {
        q: q.encoded()?,
        weights: w.slice()?,
        k: k.encoded()?,
        key_scale: c,
        query_pos: &pos,
    };
    let o = out.slice()?;
    let sc = scores.as_mut().map(|s| s.slice()).transpose()?;
    let work = n.saturating_mul(t).saturating_mul(h).saturating_mul(d);
    detach(py, work, || {
        indexer::indexer_topk_into(&shape, &inputs, topk, segs, o, sc)
    })?;
    Ok(out.finish())
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(indexer_topk, m)?)?;
    Ok(())
}
