//! The options every InfLLM-v2 form reads alike — `init_blocks`,
//! `local_blocks`, the geometry (`block_size`, `kernel_size`,
//! `kernel_stride`), `pooling`, `keep`, `scale` — read into the core's
//! [`Config`] once, for the dense and packed forms ([`super::dense`]) and the
//! paged one ([`super::paged`]).
//!
//! The rule: a count is a Python integer up to 2**31 - 1 (`I32_MAX`), None for
//! MiniCPM4's value; `pooling` and `keep` are parsed as PyO3 extracts them
//! ([`Choice`]), an unknown one refused where it is first used; `scale` None
//! is `1/√d`. It lives beside the entry points, not in `mod.rs`, so both forms
//! use a sibling and no module uses its parent (a `use super::…` of an item
//! in `mod.rs` would make the cycle `tests/python/test_bindings_layout.py`
//! refuses).

use pyo3::prelude::*;

use crate::attention::softmax_scale;
use crate::infllm::{self, Config, Geometry, Keep, Pooling};
use crate::python::args::{Choice, Named, Opt, I32_MAX, S};

impl Choice for Pooling {
    const ARG: &'static str = "pooling";
    fn from_name(name: &str) -> Option<Self> {
        match name {
            "cuda" => Some(Pooling::Cuda),
            "triton" => Some(Pooling::Triton),
            _ => None,
        }
    }
    fn unknown(got: &str) -> String {
        format!("pooling must be 'cuda' or 'triton', got {got:?}")
    }
}

impl Choice for Keep {
    const ARG: &'static str = "keep";
    fn from_name(name: &str) -> Option<Self> {
        match name {
            "through_current" => Some(Keep::ThroughCurrent),
            "before_current" => Some(Keep::BeforeCurrent),
            _ => None,
        }
    }
    fn unknown(got: &str) -> String {
        format!("keep must be 'through_current' or 'before_current', got {got:?}")
    }
}

/// The options every form takes: the settings, the geometry, the variant.
pub(super) type Options<'a, 'py> = (
    (Opt<'a, 'py>, Opt<'a, 'py>, usize),
    (Opt<'a, 'py>, Opt<'a, 'py>, Opt<'a, 'py>),
    Option<Named<Pooling>>,
    Option<Named<Keep>>,
);

/// The call's settings from its options, `scale` `None` for `1/√d`.
pub(super) fn config(o: Options<'_, '_>, scale: Option<f64>, d: usize) -> PyResult<Config> {
    let ((init_blocks, local_blocks, topk), (block_size, kernel_size, kernel_stride), pl, kp) = o;
    let init = S.count_or(
        init_blocks,
        "init_blocks",
        I32_MAX,
        infllm::MINICPM4_INIT_BLOCKS,
    )?;
    let local = S.count_or(
        local_blocks,
        "local_blocks",
        I32_MAX,
        infllm::MINICPM4_LOCAL_BLOCKS,
    )?;
    let m = Geometry::MINICPM4;
    let geometry = Geometry {
        block_size: S.count_or(block_size, "block_size", I32_MAX, m.block_size)?,
        kernel_size: S.count_or(kernel_size, "kernel_size", I32_MAX, m.kernel_size)?,
        kernel_stride: S.count_or(kernel_stride, "kernel_stride", I32_MAX, m.kernel_stride)?,
    };
    Ok(Config {
        init_blocks: init,
        local_blocks: local,
        top_k: topk,
        pooling: pl.unwrap_or(Named::known(Pooling::Cuda)).get()?,
        keep: kp.unwrap_or(Named::known(Keep::ThroughCurrent)).get()?,
        scale: scale.unwrap_or_else(|| softmax_scale(d) as f64) as f32,
        geometry,
    })
}
