"""Where a reference twin does not (yet) keep an input convention that its native
entry point keeps (test_conventions_inputs_rules.py): each case listed here is
marked ``xfail(strict=True)`` there, keyed by the case's pytest id, with what the
reference does instead, so that it fails loudly once fixed (then its line goes).

None at present: the native entry points never had a line here, and the 164
reference gaps the catalogue found when it was written are fixed (the
reference's argument checks now mirror the binding's). A new rule's reference
that cannot keep a convention yet gets its line here, with the reason.
"""

REFERENCE_BENT_GAPS: dict = {}  # an array transposed / reshaped: refused naming it
REFERENCE_KIND_GAPS: dict = {}  # an array of the wrong dtype kind: a TypeError naming it
REFERENCE_OUT_GAPS: dict = {}  # out= of the wrong shape, dtype or strides
REFERENCE_INPLACE_GAPS: dict = {}  # an in-place buffer swapped, misaligned, read-only, strided
REFERENCE_PAGED_GAPS: dict = {}  # a paged cache in the other byte order
REFERENCE_LAYOUT_GAPS: dict = {}  # byte order, alignment, strides, memoryviews
REFERENCE_ALIAS_GAPS: dict = {}  # out= sharing memory with an input
