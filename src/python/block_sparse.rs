//! Block-sparse selection (MiniMax-M3): the config, the single, batched
//! and packed selections, and the positions a selection covers (every one
//! raises `SelectionError`).

use numpy::{PyArray1, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple, PyType};

use super::args::{type_name, Args, Obj, Opt, I32};
use super::errors::{refuse, Domain};
use crate::block_sparse::{self, BlockSparseConfig};

const S: Args = Args(Domain::Selection);
/// Counts past i32 cannot be honoured by an int32 output anyway.
const I32_MAX: u64 = i32::MAX as u64;

/// ``BlockSparseConfig(block_size=128, top_blocks=32, init_blocks=1,
/// local_blocks=2)``: how many blocks a query may see, and which are free.
///
/// Immutable, compares by value, hashable. Building one refuses a config
/// that can select nothing (block_size 0, or top_blocks 0 with no forced
/// block), since an empty selection is a NaN downstream. The released
/// MiniMax-M3 checkpoint uses top_blocks=16, init_blocks=0, local_blocks=1.
#[pyclass(name = "BlockSparseConfig", module = "kvselect", frozen, eq, hash)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct PyBlockSparseConfig(BlockSparseConfig);

#[pymethods]
impl PyBlockSparseConfig {
    #[new]
    #[pyo3(
        signature = (block_size=None, top_blocks=None, init_blocks=None, local_blocks=None),
        text_signature = "(block_size=128, top_blocks=32, init_blocks=1, local_blocks=2)"
    )]
    fn new(
        block_size: Opt<'_, '_>,
        top_blocks: Opt<'_, '_>,
        init_blocks: Opt<'_, '_>,
        local_blocks: Opt<'_, '_>,
    ) -> PyResult<Self> {
        let d = BlockSparseConfig::default();
        let field = |obj: Opt, name, default| match obj {
            Some(o) if !o.is_none() => S.count(o, name, I32_MAX),
            _ => Ok(default),
        };
        Ok(PyBlockSparseConfig(BlockSparseConfig::new(
            field(block_size, "block_size", d.block_size)?,
            field(top_blocks, "top_blocks", d.top_blocks)?,
            field(init_blocks, "init_blocks", d.init_blocks)?,
            field(local_blocks, "local_blocks", d.local_blocks)?,
        )?))
    }

    /// Tokens per block (128 for a real checkpoint; also the KV page size).
    #[getter]
    fn block_size(&self) -> usize {
        self.0.block_size
    }

    /// Total blocks visible per query, forced ones counted.
    #[getter]
    fn top_blocks(&self) -> usize {
        self.0.top_blocks
    }

    /// Blocks at the start of the sequence that are always visible.
    #[getter]
    fn init_blocks(&self) -> usize {
        self.0.init_blocks
    }

    /// Blocks nearest the query that are always visible.
    #[getter]
    fn local_blocks(&self) -> usize {
        self.0.local_blocks
    }

    /// The fixed width of an output row: max(top_blocks, init_blocks + local_blocks).
    #[getter]
    fn width(&self) -> usize {
        self.0.width()
    }

    fn __repr__(&self) -> String {
        let c = self.0;
        format!(
            "BlockSparseConfig(block_size={}, top_blocks={}, init_blocks={}, local_blocks={})",
            c.block_size, c.top_blocks, c.init_blocks, c.local_blocks
        )
    }

    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> (Bound<'py, PyType>, (usize, usize, usize, usize)) {
        let c = slf.get().0;
        let fields = (c.block_size, c.top_blocks, c.init_blocks, c.local_blocks);
        (slf.get_type(), fields)
    }
}

/// The `config` argument: a `BlockSparseConfig`, or None for the defaults.
fn config(obj: Opt<'_, '_>) -> PyResult<BlockSparseConfig> {
    match obj {
        Some(c) if !c.is_none() => {
            c.cast::<PyBlockSparseConfig>()
                .map(|c| c.get().0)
                .map_err(|_| {
                    PyTypeError::new_err(format!(
                        "config must be a kvselect.BlockSparseConfig or None, got {}",
                        type_name(c)
                    ))
                })
        }
        _ => Ok(BlockSparseConfig::default()),
    }
}

/// `index_k` as float32 `[n_positions, d]`, read in place when it already is.
fn index_keys<'py>(index_k: &Obj<'py>) -> PyResult<super::args::In<'py, f32, 2>> {
    S.input::<f32, 2>(index_k, "index_k", "[n_positions, d]")
}

/// The blocks each KV head may read, ascending then -1, int32. One query:
/// ``index_q [n_kv_heads, d]`` with an int ``query_pos`` gives ``[n_kv_heads,
/// width]``; a chunk of queries of one sequence: ``index_q [n_queries,
/// n_kv_heads, d]`` with ``query_pos [n_queries]`` gives ``[n_queries,
/// n_kv_heads, width]``. ``index_k`` is ``[n_positions, d]``; ``width =
/// config.width``; ``out=`` reuses a buffer.
#[pyfunction]
#[pyo3(signature = (index_q, index_k, query_pos, config=None, *, out=None))]
fn block_sparse_select<'py>(
    py: Python<'py>,
    index_q: &Obj<'py>,
    index_k: &Obj<'py>,
    query_pos: &Obj<'py>,
    config: Opt<'_, 'py>,
    out: Opt<'_, 'py>,
) -> PyResult<I32<'py>> {
    let cfg = self::config(config)?;
    let (q, q_shape) = S.input_dyn::<f32>(index_q, "index_q")?;
    let k = index_keys(index_k)?;
    let (n_queries, n_kv_heads, batched) = match q_shape[..] {
        [h, _] => (1, h, false),
        [n, h, _] => (n, h, true),
        _ => {
            let msg = format!(
                "index_q must be [n_kv_heads, d] (one query) or [n_queries, n_kv_heads, d], got {}-D",
                q_shape.len()
            );
            return Err(refuse(Domain::Selection, "index_q", msg));
        }
    };
    let positions = match batched {
        true => Some(S.input::<i64, 1>(query_pos, "query_pos", "[n_queries]")?),
        false => None,
    };
    let single = match batched {
        true => 0,
        false => single_position(query_pos)?,
    };
    let shape = match batched {
        true => vec![n_queries, n_kv_heads, cfg.width()],
        false => vec![n_kv_heads, cfg.width()],
    };
    let mut inputs: Vec<&Bound<'py, PyUntypedArray>> = vec![q.untyped(), k.untyped()];
    inputs.extend(positions.as_ref().map(|p| p.untyped()));
    let out = S.output::<i32>(py, out, &shape, &inputs)?;
    let (qs, ks, d) = (q.slice()?, k.slice()?, k.shape[1]);
    let ps: &[i64] = match &positions {
        Some(p) => p.slice()?,
        None => &[],
    };
    out.run(qs.len().saturating_add(ks.len()), |os| match batched {
        true => block_sparse::select_batch_into(qs, n_queries, n_kv_heads, ks, d, ps, &cfg, os),
        false => block_sparse::select_into(qs, n_kv_heads, ks, d, single, &cfg, os),
    })
}

/// With a 2-D `index_q` (one query), `query_pos` is one integer.
fn single_position(query_pos: &Obj) -> PyResult<usize> {
    let array_like = query_pos
        .cast::<PyUntypedArray>()
        .is_ok_and(|a| a.ndim() > 0)
        || query_pos.cast::<PyList>().is_ok()
        || query_pos.cast::<PyTuple>().is_ok();
    if array_like {
        return Err(refuse(
            Domain::Selection,
            "query_pos",
            "with a 2-D index_q (one query), query_pos must be one integer; pass a 3-D \
             index_q [n_queries, n_kv_heads, d] for a batch",
        ));
    }
    S.count(query_pos, "query_pos", i64::MAX as u64)
}

/// A packed serving batch: the keys of all sequences concatenated in
/// ``index_k [n_positions, d]``, sequence ``s`` owning rows ``cu_seqlens[s]
/// .. cu_seqlens[s + 1]``; query ``i`` (``index_q [n_queries, n_kv_heads,
/// d]``) belongs to sequence ``seq_ids[i]`` at position ``query_pos[i]``
/// within it, and its block ids count from the start of its sequence.
/// Returns int32 ``[n_queries, n_kv_heads, width]``; ``out=`` reuses a buffer.
#[pyfunction]
#[pyo3(signature = (index_q, index_k, cu_seqlens, seq_ids, query_pos, config=None, *, out=None))]
#[allow(clippy::too_many_arguments)]
fn block_sparse_select_packed<'py>(
    py: Python<'py>,
    index_q: &Obj<'py>,
    index_k: &Obj<'py>,
    cu_seqlens: &Obj<'py>,
    seq_ids: &Obj<'py>,
    query_pos: &Obj<'py>,
    config: Opt<'_, 'py>,
    out: Opt<'_, 'py>,
) -> PyResult<I32<'py>> {
    let cfg = self::config(config)?;
    let q = S.input::<f32, 3>(index_q, "index_q", "[n_queries, n_kv_heads, d]")?;
    let k = index_keys(index_k)?;
    let cu = S.input::<i64, 1>(cu_seqlens, "cu_seqlens", "[n_seqs + 1]")?;
    let sid = S.input::<i64, 1>(seq_ids, "seq_ids", "[n_queries]")?;
    let pos = S.input::<i64, 1>(query_pos, "query_pos", "[n_queries]")?;
    let ([n_queries, n_kv_heads, _], d) = (q.shape, k.shape[1]);
    let inputs = [
        q.untyped(),
        k.untyped(),
        cu.untyped(),
        sid.untyped(),
        pos.untyped(),
    ];
    let out = S.output::<i32>(py, out, &[n_queries, n_kv_heads, cfg.width()], &inputs)?;
    let (qs, ks) = (q.slice()?, k.slice()?);
    let (cus, sids, poss) = (cu.slice()?, sid.slice()?, pos.slice()?);
    let select = |os: &mut [i32]| {
        block_sparse::select_packed_into(
            qs, n_queries, n_kv_heads, ks, d, cus, sids, poss, &cfg, os,
        )
    };
    out.run(qs.len().saturating_add(ks.len()), select)
}

/// The positions a block selection covers, int32, ascending and causally
/// clipped: block ``b`` contributes ``b*bs .. min((b+1)*bs, n_positions,
/// query_pos + 1)``; ``blocks`` is 1-D, negative entries (padding) skipped.
#[pyfunction]
#[pyo3(signature = (blocks, query_pos, n_positions, config=None))]
fn positions_of_blocks<'py>(
    py: Python<'py>,
    blocks: &Obj<'py>,
    query_pos: &Obj<'py>,
    n_positions: &Obj<'py>,
    config: Opt<'_, 'py>,
) -> PyResult<Bound<'py, PyArray1<i32>>> {
    let cfg = self::config(config)?;
    let b = S.input::<i32, 1>(blocks, "blocks", "[width]")?;
    let query_pos = S.count(query_pos, "query_pos", u64::MAX)?;
    let n_positions = S.count(n_positions, "n_positions", u64::MAX)?;
    let v = block_sparse::positions_of_blocks_i32(b.slice()?, query_pos, n_positions, &cfg)?;
    Ok(PyArray1::from_vec(py, v))
}

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("MINIMAX_BLOCK_SIZE", block_sparse::MINIMAX_BLOCK_SIZE)?;
    m.add_class::<PyBlockSparseConfig>()?;
    m.add_function(wrap_pyfunction!(block_sparse_select, m)?)?;
    m.add_function(wrap_pyfunction!(block_sparse_select_packed, m)?)?;
    m.add_function(wrap_pyfunction!(positions_of_blocks, m)?)?;
    Ok(())
}
