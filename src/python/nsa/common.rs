//! What every NSA entry point reads alike: the `window` option (fla's
//! block means or the paper's Eq. 9), the block geometry and row width, and
//! the configuration they make.

use pyo3::prelude::*;

use crate::attention::softmax_scale;
use crate::nsa::{self, Config, Window};
use crate::python::args::{Choice, Named, Opt, I32_MAX, S};
use crate::python::errors::refuse;

/// `block_size` (fla's 64 by default), at least 1.
pub(super) fn read_block_size(block_size: Opt<'_, '_>) -> PyResult<usize> {
    let bs = S.count_or(block_size, "block_size", I32_MAX, nsa::FLA_BLOCK_SIZE)?;
    if bs == 0 {
        return Err(refuse(S, "block_size", "block_size must be at least 1"));
    }
    Ok(bs)
}

/// `(block_size, init_blocks, local_blocks)` (fla's 64, 1 and 2 by
/// default), read in that order.
pub(super) fn read_geometry(
    (block_size, init_blocks, local_blocks): (Opt<'_, '_>, Opt<'_, '_>, Opt<'_, '_>),
) -> PyResult<(usize, usize, usize)> {
    let bs = read_block_size(block_size)?;
    let init = S.count_or(init_blocks, "init_blocks", I32_MAX, nsa::FLA_INIT_BLOCKS)?;
    let local = S.count_or(local_blocks, "local_blocks", I32_MAX, nsa::FLA_LOCAL_BLOCKS)?;
    Ok((bs, init, local))
}

/// `block_counts` (fla's 16 by default), at least 1 block.
pub(super) fn read_block_counts(block_counts: Opt<'_, '_>) -> PyResult<usize> {
    let n = S.count_or(block_counts, "block_counts", I32_MAX, nsa::FLA_BLOCK_COUNTS)?;
    if n == 0 {
        return Err(refuse(
            S,
            "block_counts",
            "block_counts must be at least 1 block",
        ));
    }
    Ok(n)
}

/// The selection's configuration: the geometry ([`read_geometry`]), the row
/// width and the softmax scale (`1/√d` by default).
pub(super) fn config(
    (block_size, init_blocks, local_blocks): (usize, usize, usize),
    block_counts: usize,
    scale: Option<f64>,
    d: usize,
) -> Config {
    Config {
        block_size,
        block_counts,
        init_blocks,
        local_blocks,
        scale: scale.unwrap_or_else(|| softmax_scale(d) as f64) as f32,
    }
}

/// The `window` option's names.
#[derive(Clone, Copy)]
pub(super) enum WindowName {
    Fla,
    Eq9,
}

impl Choice for WindowName {
    const ARG: &'static str = "window";
    fn from_name(name: &str) -> Option<Self> {
        match name {
            "fla" => Some(WindowName::Fla),
            "eq9" => Some(WindowName::Eq9),
            _ => None,
        }
    }
    fn unknown(got: &str) -> String {
        format!("window must be 'fla' or 'eq9', got {got:?}")
    }
}

/// The window from its name and Eq. 9's sizes (the paper's 32 and 16 by
/// default); a packed batch reads fla's window only.
pub(super) fn read_window(
    name: Option<Named<WindowName>>,
    (kernel_size, kernel_stride): (Opt<'_, '_>, Opt<'_, '_>),
    packed: bool,
) -> PyResult<Window> {
    let kz = S.count_or(kernel_size, "kernel_size", I32_MAX, nsa::PAPER_KERNEL_SIZE)?;
    let st = S.count_or(
        kernel_stride,
        "kernel_stride",
        I32_MAX,
        nsa::PAPER_KERNEL_STRIDE,
    )?;
    match name.unwrap_or(Named::known(WindowName::Fla)).get()? {
        WindowName::Fla => Ok(Window::Fla),
        WindowName::Eq9 if packed => Err(refuse(
            S,
            "window",
            "window='eq9' has no packed form (fla's kernels, which take cu_seqlens, use the fla window)",
        )),
        WindowName::Eq9 => Ok(Window::Eq9 {
            kernel_size: kz,
            kernel_stride: st,
        }),
    }
}
