//! NSA's `window` option (fla's block means or the paper's Eq. 9), read
//! alike by every NSA entry point.

use pyo3::prelude::*;

use crate::nsa::{self, Window};
use crate::python::args::{Choice, Named, Opt, I32_MAX, S};
use crate::python::errors::refuse;

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
