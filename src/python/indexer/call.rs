//! The arguments every indexer form reads alike, checked and borrowed
//! ([`Call`]), and the top-k and score-matrix runs over them.
//!
//! Reads `index_q`, `weights`, `index_k`, `query_pos`, `topk`, `key_scale`,
//! the formats, `num_segments` and `compress_ratio`. The rule: `weights` is
//! `[n_queries, H]` of `index_q`'s axes, keys share `index_q`'s `d`,
//! `key_scale` is one scale or `[n_keys]`, and `query_pos` has one entry
//! per query ([`Broadcast::Refuse`]); outputs are checked against every
//! input and each other.

use numpy::PyUntypedArray;
use pyo3::prelude::*;

use crate::attention::softmax_scale;
use crate::error::ArgumentError as Error;
use crate::indexer::{
    self, Activation, IndexerInputs, IndexerOptions, IndexerShape, RowLayout, ScoreType,
};
use crate::python::args::Choice;
use crate::python::args::{
    detach, ndarrays, query_positions, Broadcast, EncodedIn, FormatArg, In, InAnyRank, Named, Obj,
    Opt, Queries, I32, I32_MAX, S,
};
use crate::python::errors::{refuse, Domain};

/// `weights`, or None: no weights, every head's weight 1 (Qwen's QSA,
/// MiniMax's MSA). `fma(1, x, acc)` rounds `acc + x` once, as a plain sum
/// of heads does: the rows are the rule's without weights, bit for bit.
pub(super) enum Weights<'py> {
    Given(In<'py, f32, 2>),
    Ones(Vec<f32>),
}

impl<'py> Weights<'py> {
    /// The weights as the core reads them.
    pub(super) fn slice(&self) -> PyResult<&[f32]> {
        match self {
            Weights::Given(w) => w.slice(),
            Weights::Ones(v) => Ok(v),
        }
    }

    /// The array given, if any (an output must not overlap it).
    pub(super) fn untyped(&self) -> Option<&Bound<'py, PyUntypedArray>> {
        match self {
            Weights::Given(w) => Some(w.untyped()),
            Weights::Ones(_) => None,
        }
    }
}

/// The family's options as typed values (`activation`, `force_first`,
/// `force_last`, `row_layout`, and the pool: `score_pool`, `score_type`,
/// `sm_scale`): parsed once, here; the budget check is the core's
/// ([`IndexerOptions`]).
pub(super) type Family<'a, 'py> = (
    Option<Named<Activation>>,
    Opt<'a, 'py>,
    Opt<'a, 'py>,
    Option<Named<RowLayout>>,
    (Opt<'a, 'py>, Option<Named<PoolScore>>, Option<f64>),
);

/// `score_type`'s spellings.
#[derive(Debug, Clone, Copy)]
pub(super) enum PoolScore {
    Max,
    Lse,
}

impl Choice for PoolScore {
    const ARG: &'static str = "score_type";
    fn from_name(name: &str) -> Option<Self> {
        match name {
            "max" => Some(PoolScore::Max),
            "lse" => Some(PoolScore::Lse),
            _ => None,
        }
    }
    fn unknown(got: &str) -> String {
        format!("score_type must be 'max' or 'lse', got {got:?}")
    }
}

/// [`Family`] read: None is today's rule (ReLU, nothing forced, rank order,
/// no pool); `d` the index dimension (`sm_scale`'s default `1 / sqrt(d)`).
pub(super) fn family(
    (activation, force_first, force_last, row_layout, pool): Family<'_, '_>,
    d: usize,
) -> PyResult<IndexerOptions> {
    let (score_pool, score_type, sm_scale) = pool;
    let score_type = match score_type.map(|t| t.get()).transpose()? {
        None | Some(PoolScore::Max) => {
            if let Some(v) = sm_scale {
                let message =
                    format!("sm_scale={v} with score_type='max': it scales the 'lse' pool only");
                return Err(refuse(Domain::Selection, "sm_scale", message));
            }
            ScoreType::Max
        }
        Some(PoolScore::Lse) => ScoreType::Lse {
            sm_scale: sm_scale.map_or_else(|| softmax_scale(d), |v| v as f32),
        },
    };
    Ok(IndexerOptions {
        score_pool: S.count_or(score_pool, "score_pool", I32_MAX, 1)?,
        activation: activation.map(|a| a.get()).transpose()?.unwrap_or_default(),
        force_first: S.count_or(force_first, "force_first", I32_MAX, 0)?,
        force_last: S.count_or(force_last, "force_last", I32_MAX, 0)?,
        layout: row_layout.map(|l| l.get()).transpose()?.unwrap_or_default(),
        score_type,
    })
}

/// The arguments both forms share, checked and borrowed.
pub(super) struct Call<'py> {
    pub(super) q: EncodedIn<'py>,
    pub(super) w: Weights<'py>,
    pub(super) k: EncodedIn<'py>,
    pub(super) scale: Option<InAnyRank<'py, f32>>,
    /// A per-tensor `key_scale` (a scalar) as the per-key vector the core
    /// reads: the scalar for every key.
    pub(super) scale_fill: Option<Vec<f32>>,
    pub(super) pos: Vec<usize>,
    /// The ndarrays among the arguments read through a copy (`query_pos`,
    /// a packed batch's offsets): an output must not share their memory either.
    pub(super) raw: Vec<Bound<'py, PyUntypedArray>>,
    pub(super) shape: IndexerShape,
    pub(super) topk: usize,
    pub(super) segs: usize,
    /// Tokens per key (`compress_ratio`; 1 for token-level keys).
    pub(super) ratio: usize,
}

/// `(index_q, weights, index_k, query_pos, topk)` and the keyword arguments
/// `(key_scale, key_format.format_arg(), query_format.format_arg(), num_segments)`.
pub(super) type Common<'a, 'py> = (
    &'a Obj<'py>,
    &'a Obj<'py>,
    &'a Obj<'py>,
    &'a Obj<'py>,
    &'a Obj<'py>,
);
pub(super) type Options<'a, 'py> = (Opt<'a, 'py>, FormatArg<'a>, FormatArg<'a>, Opt<'a, 'py>);

/// `index_q` `[n_queries, n_heads, d]` in its format and `weights`
/// float32 `[n_queries, n_heads]` (None: no weights), with `[n, h, d]`.
pub(super) fn queries<'py>(
    index_q: &Obj<'py>,
    weights: &Obj<'py>,
    query_format: FormatArg<'_>,
) -> PyResult<(EncodedIn<'py>, Weights<'py>, [usize; 3])> {
    let (q, _) = EncodedIn::new(S, index_q, "index_q", query_format)?;
    let dims = S.dims::<3>(q.untyped(), "index_q", "[n_queries, n_heads, d]")?;
    let [n, h, _] = dims;
    if weights.is_none() {
        let ones = vec![1.0f32; n.checked_mul(h).unwrap_or(0)];
        return Ok((q, Weights::Ones(ones), dims));
    }
    let w = S.input::<f32, 2>(weights, "weights", "[n_queries, n_heads]")?;
    S.axes("weights", &w.shape, &[("n_queries", n), ("H", h)])?;
    Ok((q, Weights::Given(w), dims))
}

/// The `compress_ratio` keyword: None is 1 (token-level keys); 0 the core
/// refuses.
pub(super) fn ratio(compress_ratio: Opt<'_, '_>) -> PyResult<usize> {
    S.count_or(compress_ratio, "compress_ratio", u32::MAX as u64, 1)
}

/// The `num_segments` keyword: None is 0 (off); past 64 the core refuses.
pub(super) fn segments(num_segments: Opt<'_, '_>) -> PyResult<usize> {
    num_segments.map_or(Ok(0), |s| S.count_within(s, "num_segments", u64::MAX, 64))
}

impl<'py> Call<'py> {
    pub(super) fn new(
        (q, w, k, pos, topk): Common<'_, 'py>,
        (scale, kf, qf, segs): Options<'_, 'py>,
    ) -> PyResult<Self> {
        let mut call = Call::inputs((q, w, k, pos), (scale, kf, qf))?;
        call.topk = S.count(topk, "topk", I32_MAX)?;
        call.segs = segments(segs)?;
        Ok(call)
    }

    /// The scoring arguments alone (`topk` and `num_segments` left 0):
    /// `(index_q, weights, index_k, query_pos)` and `(key_scale,
    /// key_format, query_format)`.
    pub(super) fn inputs(
        (q, w, k, pos): (&Obj<'py>, &Obj<'py>, &Obj<'py>, &Obj<'py>),
        (scale, kf, qf): (Opt<'_, 'py>, FormatArg<'_>, FormatArg<'_>),
    ) -> PyResult<Self> {
        let (q, w, [n, h, dq]) = queries(q, w, qf)?;
        let (k, _) = EncodedIn::new(S, k, "index_k", kf)?;
        let [t, d] = S.dims::<2>(k.untyped(), "index_k", "[n_keys, d]")?;
        S.same_d(dq, d, "index_k")?;
        // A scalar (0-D array, Python or NumPy float) is one scale for every
        // key; else one per key.
        let mut scale_fill = None;
        let scale = scale
            .map(|c| {
                let (c, shape) = S.input_dyn::<f32>(c, "key_scale")?;
                if shape.is_empty() {
                    scale_fill = Some(vec![c.slice()?[0]; t]);
                } else {
                    S.axes("key_scale", &shape, &[("n_keys", t)])?;
                }
                Ok::<_, PyErr>(c)
            })
            .transpose()?;
        let raw = ndarrays(&[pos]);
        let pos = query_positions(
            S,
            pos,
            "query_pos",
            Queries::Along("n_queries", n),
            Broadcast::Refuse,
        )?;
        let shape = IndexerShape {
            n_queries: n,
            n_heads: h,
            d,
            n_keys: t,
        };
        Ok(Call {
            q,
            w,
            k,
            scale,
            scale_fill,
            pos,
            raw,
            shape,
            topk: 0,
            segs: 0,
            ratio: 1,
        })
    }

    /// The arrays as the core reads them.
    pub(super) fn borrowed(&self) -> PyResult<IndexerInputs<'_>> {
        Ok(IndexerInputs {
            q: self.q.encoded()?,
            weights: self.w.slice()?,
            k: self.k.encoded()?,
            key_scale: match &self.scale_fill {
                Some(v) => Some(&v[..]),
                None => self.scale.as_ref().map(|c| c.slice()).transpose()?,
            },
            query_pos: &self.pos,
            compress_ratio: self.ratio,
        })
    }

    /// Every array argument, as an output must not overlap them.
    pub(super) fn arrays(&self) -> Vec<&Bound<'py, PyUntypedArray>> {
        let mut arrays = vec![self.q.untyped(), self.k.untyped()];
        arrays.extend(self.w.untyped());
        arrays.extend(self.scale.as_ref().map(|c| c.untyped()));
        arrays.extend(&self.raw);
        arrays
    }

    /// Multiply-adds of scoring every key for every query (for `detach`).
    pub(super) fn work(&self) -> usize {
        let s = self.shape;
        s.n_queries
            .saturating_mul(s.n_keys)
            .saturating_mul(s.n_heads)
            .saturating_mul(s.d)
    }

    /// Runs `core` on the borrowed inputs (see [`run_topk`]).
    pub(super) fn run(
        self,
        py: Python<'py>,
        outs: (Opt<'_, 'py>, Opt<'_, 'py>),
        core: impl FnOnce(&IndexerInputs<'_>, &mut [i32], Option<&mut [f32]>) -> Result<(), Error>
            + Send,
    ) -> PyResult<I32<'py>> {
        let arrays = self.arrays();
        let (inputs, work) = (self.borrowed()?, self.work());
        let shape = [self.shape.n_queries, self.topk];
        run_topk(py, &arrays, shape, outs, work, |o, s| core(&inputs, o, s))
    }
}

/// Runs a top-k `core` call into `out` (int32 `[n, topk]`) and `scores_out`
/// (float32, when given), both checked against every input array and each
/// other; returns the rows.
pub(super) fn run_topk<'py>(
    py: Python<'py>,
    arrays: &[&Bound<'py, PyUntypedArray>],
    shape: [usize; 2],
    (out, scores_out): (Opt<'_, 'py>, Opt<'_, 'py>),
    work: usize,
    core: impl FnOnce(&mut [i32], Option<&mut [f32]>) -> Result<(), Error> + Send,
) -> PyResult<I32<'py>> {
    let mut out = S.output::<i32>(py, out, &shape, arrays)?;
    let arrays = [arrays, &[out.untyped()]].concat();
    let mut scores = scores_out
        .map(|s| S.buffer::<f32>(s, "scores_out", &shape, &arrays))
        .transpose()?;
    let (o, s) = (
        out.slice()?,
        scores.as_mut().map(|s| s.slice()).transpose()?,
    );
    detach(py, work, || core(o, s))?;
    Ok(out.finish())
}

impl<'py> Call<'py> {
    /// The `[n_queries, n_keys]` scores (or their magnitudes) into `out`.
    pub(super) fn score_matrix(
        self,
        py: Python<'py>,
        out: Opt<'_, 'py>,
        activation: Activation,
        magnitudes: bool,
    ) -> PyResult<Bound<'py, numpy::PyArrayDyn<f32>>> {
        let shape = self.shape;
        let arrays = self.arrays();
        let out = S.output::<f32>(py, out, &[shape.n_queries, shape.n_keys], &arrays)?;
        let (inputs, work) = (self.borrowed()?, self.work());
        out.run(work, |o| {
            indexer::indexer_scores_with_into(&shape, &inputs, activation, magnitudes, o)
        })
    }

    /// The float64 scores of `(rows[j], positions[j])` (`indexer_rescore_into`).
    pub(super) fn rescore(
        self,
        py: Python<'py>,
        rows: &[usize],
        positions: &[usize],
    ) -> PyResult<Bound<'py, numpy::PyArrayDyn<f64>>> {
        let shape = self.shape;
        let arrays = self.arrays();
        let out = S.output::<f64>(py, None, &[rows.len()], &arrays)?;
        let (inputs, work) = (self.borrowed()?, self.work());
        out.run(work, |o| {
            indexer::indexer_rescore_into(&shape, &inputs, rows, positions, o)
        })
    }

    /// Every score and magnitude in float64, `[n_queries, 2, n_keys]`
    /// (`indexer_rescore_all_into`).
    pub(super) fn rescore_all(self, py: Python<'py>) -> PyResult<Bound<'py, numpy::PyArrayDyn<f64>>> {
        let shape = self.shape;
        let arrays = self.arrays();
        let dims = [shape.n_queries, 2, shape.n_keys];
        let out = S.output::<f64>(py, None, &dims, &arrays)?;
        let (inputs, work) = (self.borrowed()?, self.work());
        out.run(work, |o| indexer::indexer_rescore_all_into(&shape, &inputs, o))
    }

    /// Each row's verdict from every float64 score, `[n_queries, 5]`
    /// (`indexer_rescore_verdict_into`).
    pub(super) fn rescore_verdict(
        self,
        py: Python<'py>,
        positions: &[i64],
        width: usize,
        atol: f64,
        rtol: f64,
    ) -> PyResult<Bound<'py, numpy::PyArrayDyn<f64>>> {
        let shape = self.shape;
        let arrays = self.arrays();
        let out = S.output::<f64>(py, None, &[shape.n_queries, 5], &arrays)?;
        let (inputs, work) = (self.borrowed()?, self.work());
        out.run(work, |o| {
            indexer::indexer_rescore_verdict_into(&shape, &inputs, positions, width, atol, rtol, o)
        })
    }
}
