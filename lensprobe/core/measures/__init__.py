"""What a run measures: metrics as pure functions of tensors (:mod:`.metrics`), confidence intervals
(:mod:`.intervals`), measures bound to a prompt
(:mod:`.measure`) and over given tokens (:mod:`.forced`, with the one metric vocabulary
:func:`~lensprobe.core.measures.forced.resolve_measures`).

May import: :mod:`lensprobe.core.hooks.attach` and the core's concerns below it.
"""
