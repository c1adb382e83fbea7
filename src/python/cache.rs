//! The paged arguments both paged forms (the indexer's, block selection's)
//! take: the cache's page layout from the dtype and the layout name, its
//! pages as bytes read in place, and the block table that maps each
//! sequence onto them.

use numpy::{PyArrayDyn, PyUntypedArray};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use super::args::{
    detach, element_name, format_of, is_native_order, ndarray, numpy, positions, positions_along,
    query_positions, AsFormatArg, Broadcast, EncodedIn, FormatArg, In, KeyFormat, Named, Obj, Opt,
    Out, OutElement, PageLayoutName, Queries, QueryFormat, StridedRows, S,
};
use super::errors::refuse;
use crate::keys::{BlockTable, Encoded, Heads, PageLayout, PagedCache};
use crate::ArgumentError;

/// The paged arguments as the caller passed them.
pub(super) struct PagedArgs<'a, 'py> {
    pub kv_cache: &'a Obj<'py>,
    pub block_table: &'a Obj<'py>,
    pub seq_lens: &'a Obj<'py>,
    pub seq_ids: &'a Obj<'py>,
    pub query_pos: &'a Obj<'py>,
}

/// A paged cache and its block table, checked and borrowed: query `i`
/// belongs to sequence `seq_ids[i]` at `query_pos[i]` within it.
pub(super) struct Paged<'py> {
    pages: StridedRows<'py, u8>,
    table: In<'py, i32, 2>,
    layout: PageLayout,
    block_size: usize,
    /// Elements per key (a DSA page's scales not counted).
    pub d: usize,
    seq_lens: Vec<usize>,
    pub seq_ids: Vec<usize>,
    pub query_pos: Vec<usize>,
}

impl<'py> Paged<'py> {
    /// The arguments, in the page `layout` named, for `(n, dq)`
    /// = `index_q`'s queries and their dimension: keys of another dimension
    /// are refused (naming `index_q`) before anything else is read; every
    /// other array is checked axis by axis (`seq_ids` and `query_pos`
    /// `[n_queries]`, a scalar `query_pos` when `n` is 1; `block_table`
    /// `[n_seqs, max_blocks]` with `n_seqs = len(seq_lens)`).
    pub fn new(
        a: PagedArgs<'_, 'py>,
        layout: &Named<PageLayoutName>,
        key_format: FormatArg<'_>,
        (n, dq): (usize, usize),
    ) -> PyResult<Self> {
        let kv_cache = &S.arg(a.kv_cache, "kv_cache")?;
        let (layout, shape) = cache_layout(kv_cache, layout, key_format)?;
        let scales = 4 * (layout == PageLayout::Fp8WithScales) as usize;
        let (block_size, d) = (shape[1], shape[shape.len() - 1] - scales);
        S.same_d(dq, d, "kv_cache")?;
        let pages = pages(kv_cache)?;
        let table = S.input::<i32, 2>(a.block_table, "block_table", "[n_seqs, max_blocks]")?;
        let seq_lens = positions(S, a.seq_lens, "seq_lens")?;
        let want = [("n_seqs", seq_lens.len()), ("max_blocks", table.shape[1])];
        S.axes("block_table", &table.shape, &want)?;
        let seq_ids = positions_along(S, a.seq_ids, "seq_ids", ("n_queries", n))?;
        let query_pos = query_positions(
            S,
            a.query_pos,
            "query_pos",
            Queries::Along("n_queries", n),
            Broadcast::Refuse,
        )?;
        Ok(Paged {
            pages,
            table,
            layout,
            block_size,
            d,
            seq_lens,
            seq_ids,
            query_pos,
        })
    }

    /// Every sequence of the cache read whole (one "query" per sequence, at
    /// its last token), each cache row split into `n_kv_heads` heads:
    /// the cache and each sequence's length. Refuses what [`Paged::new`]
    /// refuses, and `n_kv_heads` 0 or not dividing the rows' keys (naming
    /// `n_kv_heads`). `page_layout` is `'dense'` unless named. Quest's
    /// paged bounds and [`PagedDecode`] read so.
    pub fn whole_sequences(
        py: Python<'py>,
        (kv_cache, block_table, seq_lens): (&Obj<'py>, &Obj<'py>, &Obj<'py>),
        n_kv_heads: usize,
        layout: Option<Named<PageLayoutName>>,
        key_format: Option<Named<KeyFormat>>,
    ) -> PyResult<(Self, Vec<usize>)> {
        let layout = &layout.unwrap_or(Named::known(PageLayoutName::Dense));
        let key_format = key_format.format_arg();
        let lens = positions(S, seq_lens, "seq_lens")?;
        // The cache's row, as `new` reads it (its checks refuse a bad shape first).
        let arr = numpy(py)?.call_method1("asarray", (S.arg(kv_cache, "kv_cache")?,))?;
        let shape: Vec<usize> = arr.getattr("shape")?.extract()?;
        let scaled = matches!(layout.get()?, PageLayoutName::Fp8Scaled);
        let row = shape
            .last()
            .copied()
            .unwrap_or(0)
            .saturating_sub(4 * scaled as usize);
        let ids = pyo3::types::PyList::new(py, 0..lens.len())?;
        let last = pyo3::types::PyList::new(py, lens.iter().map(|&l| l.saturating_sub(1)))?;
        let args = PagedArgs {
            kv_cache,
            block_table,
            seq_lens,
            seq_ids: ids.as_any(),
            query_pos: last.as_any(),
        };
        let paged = Paged::new(args, layout, key_format, (lens.len(), row))?;
        let h = n_kv_heads;
        if h == 0 || !paged.d.is_multiple_of(h) {
            let msg = format!(
                "n_kv_heads = {h} does not divide the cache's rows of {} keys",
                paged.d
            );
            return Err(refuse(S, "n_kv_heads", msg));
        }
        Ok((paged, lens))
    }

    /// The decoding queries of a call over [`Paged::whole_sequences`]: one
    /// per sequence, `q` `[n_seqs, n_q_heads, d]` with `d` each KV head's
    /// share of a cache row (`n_kv_heads` of them), refused naming `q`
    /// otherwise. The queries in their format, `n_q_heads` and `d`.
    pub fn decode_queries(
        &self,
        n_seqs: usize,
        n_kv_heads: usize,
        q: &Obj<'py>,
        query_format: FormatArg<'_>,
    ) -> PyResult<(EncodedIn<'py>, usize, usize)> {
        let layout = "[n_seqs, n_q_heads, d]";
        let (qe, [nq, hq, dq]) = EncodedIn::new_3d(S, q, "q", layout, query_format)?;
        let d = self.d / n_kv_heads;
        if nq != n_seqs || dq != d {
            let msg = format!(
                "q must be [n_seqs={n_seqs}, n_q_heads, d={d}], got {:?}",
                [nq, hq, dq]
            );
            return Err(refuse(S, "q", msg));
        }
        Ok((qe, hq, d))
    }

    /// Tokens per page.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The pages as the core reads them.
    pub fn cache(&self) -> PagedCache<'_> {
        PagedCache {
            bytes: self.pages.slice(),
            n_pages: self.pages.rows,
            page_stride: self.pages.stride,
            block_size: self.block_size,
            d: self.d,
            layout: self.layout,
        }
    }

    /// The block table with the sequence lengths it serves.
    pub fn table(&self) -> PyResult<BlockTable<'_>> {
        Ok(BlockTable {
            table: self.table.slice()?,
            max_blocks: self.table.shape[1],
            seq_lens: &self.seq_lens,
        })
    }

    /// The arrays an output must not overlap.
    pub fn untyped(&self) -> [&Bound<'py, PyUntypedArray>; 2] {
        [self.pages.untyped(), self.table.untyped()]
    }

    /// Multiply-adds of scoring every token of the cache for `n` queries of
    /// `h` heads (for `detach`).
    pub fn work(&self, n: usize, h: usize) -> usize {
        let tokens = self.pages.rows.saturating_mul(self.block_size);
        [n, h, self.d]
            .iter()
            .fold(tokens, |w, &x| w.saturating_mul(x))
    }
}

/// `page_layout`, `key_format` and `query_format`, as passed.
pub(super) type Formats = (
    Option<Named<PageLayoutName>>,
    Option<Named<KeyFormat>>,
    Option<Named<QueryFormat>>,
);

/// A decode step over whole sequences of a paged cache, as InfLLM-v2's,
/// NSA's and MoBA's paged forms take it: the cache, table and lengths
/// ([`Paged::whole_sequences`]) and
/// one query a sequence ([`Paged::decode_queries`]), read and checked in
/// that order; [`PagedDecode::run`] then calls the core into a new output.
pub(super) struct PagedDecode<'py> {
    paged: Paged<'py>,
    q: EncodedIn<'py>,
    /// `seq_lens` as passed, when an array: read through a copy, but no
    /// `out=` may share its memory either (docs/conventions.md).
    seq_lens: Option<Bound<'py, PyUntypedArray>>,
    /// Tokens per sequence, the query's own included.
    pub lens: Vec<usize>,
    pub n_q_heads: usize,
    pub n_kv_heads: usize,
    /// Elements per head.
    pub d: usize,
}

impl<'py> PagedDecode<'py> {
    /// `(q, kv_cache, block_table, seq_lens)` as passed, `n_kv_heads` as
    /// the caller counted it (each rule counts its own arguments first, in
    /// its own order), the formats as passed.
    pub fn read(
        py: Python<'py>,
        (q, kv_cache, block_table, seq_lens): (&Obj<'py>, &Obj<'py>, &Obj<'py>, &Obj<'py>),
        n_kv_heads: usize,
        (page_layout, key_format, query_format): Formats,
    ) -> PyResult<Self> {
        let arrays = (kv_cache, block_table, seq_lens);
        let (paged, lens) =
            Paged::whole_sequences(py, arrays, n_kv_heads, page_layout, key_format)?;
        let (q, n_q_heads, d) =
            paged.decode_queries(lens.len(), n_kv_heads, q, query_format.format_arg())?;
        Ok(PagedDecode {
            paged,
            q,
            seq_lens: ndarray(seq_lens),
            lens,
            n_q_heads,
            n_kv_heads,
            d,
        })
    }

    /// The caller's `out` or a new `shape` output (either sharing no memory
    /// with the queries, pages, table or lengths) filled by `core(queries,
    /// cache, table, out)`, the GIL released when `work` is large (see
    /// [`detach`]); the core's refusal raised as is (every paged core
    /// refuses before it writes, so a refused `out` is untouched).
    pub fn run<T: OutElement>(
        &self,
        py: Python<'py>,
        out: Opt<'_, 'py>,
        shape: &[usize],
        work: usize,
        core: impl FnOnce(
                Encoded<'_>,
                &PagedCache<'_>,
                &BlockTable<'_>,
                &mut [T],
            ) -> Result<(), ArgumentError>
            + Send,
    ) -> PyResult<Bound<'py, PyArrayDyn<T>>> {
        let [pg, tb] = self.paged.untyped();
        let mut inputs = vec![self.q.untyped(), pg, tb];
        inputs.extend(self.seq_lens.as_ref());
        let mut out: Out<'py, T> = S.output(py, out, shape, &inputs)?;
        let (cache, table) = (self.paged.cache(), self.paged.table()?);
        let q = self.q.encoded()?;
        let o = out.slice()?;
        detach(py, work, || core(q, &cache, &table, o))?;
        Ok(out.finish())
    }

    /// The most of `f(len)` over the sequences' lengths, for an output's
    /// width (the most blocks of a sequence), once every length is checked
    /// (`1 ..= i32::MAX`, `seq_lens`): the lengths size the output, so a bad
    /// one is refused as itself, not as `out`'s shape, and no output is
    /// sized by `seq_lens = [2**40]`. Each rule asks for it after its own
    /// settings' checks, in its twin's order.
    pub fn widest(&self, f: impl Fn(usize) -> usize) -> PyResult<usize> {
        crate::keys::paged::check_decode_lens(&self.lens)?;
        Ok(self.lens.iter().map(|&l| f(l)).max().unwrap_or(0))
    }

    /// Multiply-adds of scoring every cached key once for each sequence's
    /// query heads (for [`PagedDecode::run`]'s `work`).
    pub fn work(&self) -> usize {
        self.paged.work(1, self.n_q_heads)
    }

    /// The queries' and the cache rows' heads, as the paged cores take them.
    pub fn heads(&self) -> Heads {
        Heads {
            n_q_heads: self.n_q_heads,
            n_kv_heads: self.n_kv_heads,
            d: self.d,
        }
    }
}

/// A paged cache argument as bytes in place: `[num_blocks, …]`, each page
/// (every axis but the first) contiguous, the block axis with any positive
/// stride (vLLM interleaves other layers' pages); any other layout is
/// copied to C order once. Misaligned pages are read in place too (the core
/// decodes them byte by byte, little-endian), so alignment is never asked.
fn pages<'py>(cache: &Obj<'py>) -> PyResult<StridedRows<'py, u8>> {
    let np = numpy(cache.py())?;
    let (arr, uint8) = (np.call_method1("asarray", (cache,))?, np.getattr("uint8")?);
    // The last axis reinterpreted as bytes: a view when it is contiguous.
    let bytes = match arr.call_method1("view", (&uint8,)) {
        Ok(b) => b,
        Err(_) => np
            .call_method1("ascontiguousarray", (arr,))?
            .call_method1("view", (&uint8,))?,
    };
    if let Some(rows) = StridedRows::new(bytes.cast::<PyArrayDyn<u8>>()?, 1)? {
        return Ok(rows);
    }
    let copy = np.call_method1("ascontiguousarray", (bytes,))?;
    let bad = || refuse(S, "kv_cache", "kv_cache has an unusable memory layout");
    StridedRows::new(copy.cast::<PyArrayDyn<u8>>()?, 1)?.ok_or_else(bad)
}

/// The page layout and the cache's shape, from `layout` and the dtype.
fn cache_layout(
    cache: &Obj<'_>,
    layout: &Named<PageLayoutName>,
    key_format: FormatArg<'_>,
) -> PyResult<(PageLayout, Vec<usize>)> {
    let arr = numpy(cache.py())?.call_method1("asarray", (cache,))?;
    let shape: Vec<usize> = arr.getattr("shape")?.extract()?;
    // A DLPack view of bfloat16 / float8_e4m3fn pages holds raw bits, tagged.
    let dtype = element_name(Some(cache), &arr)?;
    // Pages are read in place, never converted: bytes in the other order
    // would be decoded swapped.
    if !is_native_order(&arr)? {
        let d = arr.getattr("dtype")?.str()?;
        let msg = format!(
            "kv_cache has non-native byte order ({d}): pages are read in place, never \
             converted; pass native byte order (kv_cache.astype(kv_cache.dtype.newbyteorder('=')))"
        );
        return Err(refuse(S, "kv_cache", msg));
    }
    let (page_layout, fits, want) = match layout.get()? {
        // A wrong dtype is a TypeError (the conventions' "wrong type or dtype"),
        // as the dense layout's is; a wrong shape of the right dtype a refusal.
        PageLayoutName::Fp8Scaled if dtype != "uint8" => {
            return Err(PyTypeError::new_err(format!(
                "kv_cache has dtype {dtype}: with page_layout='fp8_scaled' it must be uint8 \
                 [num_blocks, block_size, 1, d + 4] or [num_blocks, block_size, d + 4] (the \
                 e4m3fn bytes, then the float32 scales), read in place, never converted"
            )));
        }
        PageLayoutName::Fp8Scaled => (
            PageLayout::Fp8WithScales,
            matches!(shape[..], [_, _, 1, x] | [_, _, x] if x > 4),
            "with page_layout='fp8_scaled', kv_cache must be uint8 [num_blocks, block_size, 1, d + 4] \
             or [num_blocks, block_size, d + 4]",
        ),
        // Pages are read in place: float64 is not converted.
        PageLayoutName::Dense => (
            PageLayout::Dense(format_of("kv_cache", &dtype, key_format, false)?),
            shape.len() == 3,
            "kv_cache must be 3-D [num_blocks, block_size, d]",
        ),
    };
    if !fits {
        let msg = format!("{want}, got {dtype} {shape:?}");
        return Err(refuse(S, "kv_cache", msg));
    }
    Ok((page_layout, shape))
}
