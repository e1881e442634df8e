"""The core: what every other part of lensprobe builds on.

Models (loading, the embedded default, validation of layers and heads), prompts with
named segments, the one vocabulary of prompt conditions (:mod:`~lensprobe.core.prompts.conditions`),
head and position specs, hooks (:func:`~lensprobe.core.hooks.attach.intervene`, recorders, the
generation step context), one forward pass and the one way to turn prompts into tokens
(:mod:`~lensprobe.core.hooks.forward`), metrics (pure functions of tensors) and measures, JSON
descriptions (:mod:`~lensprobe.core.storage.jsonable`), the results store every run saves into
(:mod:`~lensprobe.core.storage.store`, :mod:`~lensprobe.core.storage.rowfiles`), sharding over processes
(:mod:`~lensprobe.core.storage.shards`), the heavy libraries imported on first use
(:mod:`~lensprobe.core.lazy`), errors and the version.

May import: third-party libraries and other ``lensprobe.core`` modules; nothing else of lensprobe.
"""
