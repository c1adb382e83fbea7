"""Where the reference twins of the rules do not yet keep the input conventions
that the native entry points keep (test_conventions_inputs_rules.py): each
case below is marked ``xfail(strict=True)`` there, so it fails loudly once the
reference is fixed (then delete its line). Keyed by the case's pytest id.

The native entry points have no line here: every native case passes. The
reference is the oracle of the differential tests, fed valid inputs; these
gaps are in its argument checking only (a bare ``IndexError`` /
``ValueError`` from NumPy instead of a ``ReferenceSelectionError`` naming the
argument, a bent or complex array read without complaint), not in what it
computes on valid inputs.
"""

REFERENCE_BENT_GAPS = {
}
REFERENCE_KIND_GAPS = {
    "quest_scores-kmin-reference": "the reference accepts it",
    "quest_scores-kmax-reference": "the reference accepts it",
    "quest_select-kmin-reference": "the reference accepts it",
    "quest_select-kmax-reference": "the reference accepts it",
}

# out= buffers: the reference writes through a strided out= (the native
# functions refuse it, naming out), and its attention out= contract differs
# (float32 buffers beside float64 results: twin_outs=False there).
REFERENCE_OUT_GAPS = {
    f"{name}-{out}-strided-reference": "the reference writes through a strided out= instead of refusing it"
    for name, out in [
        ("attention_probabilities", "out"),
        ("oracle_topk", "out"),
        ("window_positions", "out"),
        ("visible_entries", "out"),
        ("compressed_entry_tokens", "out"),
        ("expand_entries", "out"),
        ("combine_topk_swa_indices", "out"),
        ("combine_topk_swa_indices", "lens_out"),
        ("topology_witness_indices", "out"),
        ("apply_topology_witnesses", "out"),
        ("segment_coverage_rows", "out"),
        ("slots_used_rows", "out"),
        ("attention_mass_recall_rows", "out"),
        ("output_relative_error_rows", "out"),
    ]
}

REFERENCE_INPLACE_GAPS = {
    "scatter_topology_witnesses-topk_indices-misaligned-reference": "the reference writes a misaligned buffer",
    "scatter_topology_witnesses-topk_indices-strided-reference": "the reference writes a strided buffer",
}

# A paged cache in the other byte order: none left (refused naming kv_cache).
REFERENCE_PAGED_GAPS: dict = {}

# Byte order, alignment, strides, memoryviews: none left.
REFERENCE_LAYOUT_GAPS: dict = {}

# out= sharing memory with an input.
REFERENCE_ALIAS_GAPS: dict = {}
