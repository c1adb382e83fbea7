//! Segment witnesses, every entry point raising `WitnessError`, one file
//! per family: the spec's API in [`spec`], the null models in [`nulls`],
//! the metrics, single and batched, in [`metrics`]. This file only
//! registers them.

mod metrics;
mod nulls;
mod spec;

use pyo3::prelude::*;

use crate::witness;

pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("MAX_TOPOLOGY_SEGMENTS", witness::MAX_TOPOLOGY_SEGMENTS)?;
    m.add_function(wrap_pyfunction!(spec::segment_of, m)?)?;
    m.add_function(wrap_pyfunction!(spec::topology_witness_indices, m)?)?;
    m.add_function(wrap_pyfunction!(spec::apply_topology_witnesses, m)?)?;
    m.add_function(wrap_pyfunction!(spec::scatter_topology_witnesses, m)?)?;
    m.add_function(wrap_pyfunction!(nulls::random_null, m)?)?;
    m.add_function(wrap_pyfunction!(nulls::locality_null, m)?)?;
    m.add_function(wrap_pyfunction!(metrics::segment_coverage, m)?)?;
    m.add_function(wrap_pyfunction!(metrics::attention_mass_recall, m)?)?;
    m.add_function(wrap_pyfunction!(metrics::segment_coverage_rows, m)?)?;
    m.add_function(wrap_pyfunction!(metrics::attention_mass_recall_rows, m)?)?;
    m.add_function(wrap_pyfunction!(metrics::slots_used_rows, m)?)?;
    Ok(())
}
