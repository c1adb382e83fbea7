//! Option strings: `key_format`, `query_format`, `page_layout`, `filler`
//! and `duplicates`, parsed once, at the boundary, into typed values.
//!
//! Reads each option as PyO3 extracts the argument ([`FromPyObject`], as
//! safetensors' bindings read `Framework` and `Device`): a string that is
//! not one (an int, None where None is not taken) is the same `TypeError`
//! as before; a string is looked up once, and past the boundary the entry
//! point holds the value it names. The rule: a spelling that names nothing
//! is kept as it was written ([`Named`]) and refused — a `SelectionError`
//! naming the argument, with the message each option has always given —
//! where the entry point first uses it ([`Named::get`]), so a call with
//! several faults reports the same one as before, and an option a form
//! ignores (`key_format` with `page_layout='fp8_scaled'`) is ignored still.

use pyo3::prelude::*;
use pyo3::types::PyString;

use crate::attention::Repeats;
use crate::check::Filler;
use crate::keys::Format;
use crate::python::errors::{refuse, Domain};

/// The values an option string can name.
pub(in crate::python) trait Choice: Copy {
    /// The argument, as the refusal names it.
    const ARG: &'static str;
    /// The value `name` spells, or `None`.
    fn from_name(name: &str) -> Option<Self>;
    /// The refusal's message for `got`, which names nothing.
    fn unknown(got: &str) -> String;
}

/// An option string read at the boundary: the value it names, or the
/// spelling that names nothing (refused by [`Named::get`]).
#[derive(Clone)]
pub(in crate::python) struct Named<C>(Result<C, String>);

impl<C: Choice> Named<C> {
    /// The value a default spells (`page_layout="dense"`, `filler="-1"`).
    pub fn known(value: C) -> Self {
        Named(Ok(value))
    }

    /// The value, or the option's refusal (a `SelectionError` naming it).
    pub fn get(&self) -> PyResult<C> {
        self.0
            .as_ref()
            .map(|&c| c)
            .map_err(|got| refuse(Domain::Selection, C::ARG, C::unknown(got)))
    }
}

impl<'a, 'py, C: Choice> FromPyObject<'a, 'py> for Named<C> {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        // A non-string is a TypeError naming the option, as the reference's
        // ("filler must be a string, got int"), not only PyO3's note.
        let name = obj.cast::<PyString>().map_err(|_| {
            pyo3::exceptions::PyTypeError::new_err(format!(
                "{} must be a string, got {}",
                C::ARG,
                obj.get_type()
                    .name()
                    .map_or_else(|_| "?".to_string(), |n| n.to_string())
            ))
        })?;
        let name = name.to_cow()?;
        Ok(Named(C::from_name(&name).ok_or_else(|| name.into_owned())))
    }
}

/// The message for an unknown key format named by `arg`.
fn unknown_format(arg: &str, got: &str) -> String {
    format!("{arg} {got:?} is not one of float32, float16, bfloat16, float8_e4m3fn")
}

/// `key_format=`: the format of a raw uint16 / uint8 view of keys.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(in crate::python) struct KeyFormat(pub Format);

impl Choice for KeyFormat {
    const ARG: &'static str = "key_format";
    fn from_name(name: &str) -> Option<Self> {
        Format::from_name(name).map(KeyFormat)
    }
    fn unknown(got: &str) -> String {
        unknown_format(Self::ARG, got)
    }
}

/// `query_format=`: the format of a raw uint16 / uint8 view of queries.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(in crate::python) struct QueryFormat(pub Format);

impl Choice for QueryFormat {
    const ARG: &'static str = "query_format";
    fn from_name(name: &str) -> Option<Self> {
        Format::from_name(name).map(QueryFormat)
    }
    fn unknown(got: &str) -> String {
        unknown_format(Self::ARG, got)
    }
}

/// A format argument as the array readers take it: the argument's name,
/// and the format it names when given (checked when the array is read).
#[derive(Clone, Copy)]
pub(in crate::python) struct FormatArg<'a> {
    pub arg: &'static str,
    named: Option<Result<Format, &'a str>>,
}

impl FormatArg<'_> {
    /// The format asked for, `None` when the argument was None; an unknown
    /// name is refused (a `SelectionError` naming the argument).
    pub fn asked(&self) -> PyResult<Option<Format>> {
        self.named
            .map(|n| {
                n.map_err(|got| refuse(Domain::Selection, self.arg, unknown_format(self.arg, got)))
            })
            .transpose()
    }
}

/// The `key_format` / `query_format` argument as the array readers take it.
pub(in crate::python) trait AsFormatArg {
    fn format_arg(&self) -> FormatArg<'_>;
}

impl AsFormatArg for Option<Named<KeyFormat>> {
    fn format_arg(&self) -> FormatArg<'_> {
        let named = self
            .as_ref()
            .map(|n| n.0.as_ref().map(|k| k.0).map_err(String::as_str));
        FormatArg {
            arg: KeyFormat::ARG,
            named,
        }
    }
}

impl AsFormatArg for Option<Named<QueryFormat>> {
    fn format_arg(&self) -> FormatArg<'_> {
        let named = self
            .as_ref()
            .map(|n| n.0.as_ref().map(|q| q.0).map_err(String::as_str));
        FormatArg {
            arg: QueryFormat::ARG,
            named,
        }
    }
}

/// `page_layout=`: how a paged cache's pages hold their keys (the format of
/// a dense page comes from the cache's dtype and `key_format`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(in crate::python) enum PageLayoutName {
    /// `"dense"`: `[num_blocks, block_size, d]` keys in one format.
    Dense,
    /// `"fp8_scaled"`: DeepSeek's uint8 pages of e4m3fn keys, then their
    /// float32 scales.
    Fp8Scaled,
}

impl Choice for PageLayoutName {
    const ARG: &'static str = "page_layout";
    fn from_name(name: &str) -> Option<Self> {
        match name {
            "dense" => Some(PageLayoutName::Dense),
            "fp8_scaled" => Some(PageLayoutName::Fp8Scaled),
            _ => None,
        }
    }
    fn unknown(got: &str) -> String {
        format!("page_layout must be 'dense' or 'fp8_scaled', got {got:?}")
    }
}

impl Choice for Filler {
    const ARG: &'static str = "filler";
    fn from_name(name: &str) -> Option<Self> {
        Filler::from_name(name)
    }
    fn unknown(got: &str) -> String {
        format!(
            "filler must be one of {}, got {got:?}",
            Filler::NAMES.map(|n| format!("{n:?}")).join(", ")
        )
    }
}

/// `variant=`: which implementation of Quest's page set (`crate::quest::Variant`;
/// SGLang's `num_recent_pages` is its own argument).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(in crate::python) enum QuestVariantName {
    /// `"kernel"`: Quest's kernel path, per query head.
    Kernel,
    /// `"eval"`: Quest's evaluation script.
    Eval,
    /// `"sglang"`: SGLang's, one page set per request.
    Sglang,
}

impl Choice for QuestVariantName {
    const ARG: &'static str = "variant";
    fn from_name(name: &str) -> Option<Self> {
        match name {
            "kernel" => Some(QuestVariantName::Kernel),
            "eval" => Some(QuestVariantName::Eval),
            "sglang" => Some(QuestVariantName::Sglang),
            _ => None,
        }
    }
    fn unknown(got: &str) -> String {
        format!("variant must be 'kernel', 'eval' or 'sglang', got {got:?}")
    }
}

/// The vertical-slash estimate's copies (`variant=`).
#[derive(Clone, Copy)]
pub(in crate::python) struct VslashVariantName(pub crate::vslash::Variant);

impl Choice for VslashVariantName {
    const ARG: &'static str = "variant";
    fn from_name(name: &str) -> Option<Self> {
        crate::vslash::Variant::from_name(name).map(VslashVariantName)
    }
    fn unknown(got: &str) -> String {
        format!("variant must be 'kernel' or 'search', got {got:?}")
    }
}

/// `variant=`: which of MoBA's implementations (`crate::moba::Variant`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(in crate::python) enum MobaVariantName {
    /// `"efficient"`: `moba_efficient.py`, the rule.
    Efficient,
    /// `"naive"`: `moba_naive.py`.
    Naive,
}

impl Choice for MobaVariantName {
    const ARG: &'static str = "variant";
    fn from_name(name: &str) -> Option<Self> {
        match name {
            "efficient" => Some(MobaVariantName::Efficient),
            "naive" => Some(MobaVariantName::Naive),
            _ => None,
        }
    }
    fn unknown(got: &str) -> String {
        format!("variant must be 'efficient' or 'naive', got {got:?}")
    }
}

impl Choice for Repeats {
    const ARG: &'static str = "duplicates";
    fn from_name(name: &str) -> Option<Self> {
        match name {
            "once" => Some(Repeats::Once),
            "each" => Some(Repeats::Each),
            _ => None,
        }
    }
    fn unknown(got: &str) -> String {
        format!("duplicates must be one of \"once\", \"each\", got {got:?}")
    }
}

impl Choice for crate::indexer::Activation {
    const ARG: &'static str = "activation";
    fn from_name(name: &str) -> Option<Self> {
        match name {
            "relu" => Some(crate::indexer::Activation::Relu),
            "none" => Some(crate::indexer::Activation::None),
            _ => None,
        }
    }
    fn unknown(got: &str) -> String {
        format!("activation must be 'relu' or 'none', got {got:?}")
    }
}

impl Choice for crate::indexer::RowLayout {
    const ARG: &'static str = "row_layout";
    fn from_name(name: &str) -> Option<Self> {
        match name {
            "rank" => Some(crate::indexer::RowLayout::Ranked),
            "ascending" => Some(crate::indexer::RowLayout::Ascending),
            _ => None,
        }
    }
    fn unknown(got: &str) -> String {
        format!("row_layout must be 'rank' or 'ascending' (cuDNN's compact layout), got {got:?}")
    }
}
