"""The core: what every other part of lensprobe builds on.

Models (loading, the embedded default, validation of layers and heads), prompts with
named segments, the one vocabulary of prompt conditions, head and position specs, hooks
(:func:`~lensprobe.core.hooks.intervene`, recorders, the generation step context), one
forward pass, metrics (pure functions of tensors) and measures.

May import: third-party libraries only (and other ``lensprobe.core`` modules).
"""
