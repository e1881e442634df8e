"""The core: what every other part of lensprobe builds on, by concern, in the order they may import
each other: :mod:`~lensprobe.core.storage` (content identities, the results store, locks, sharding),
:mod:`~lensprobe.core.models` (loading, devices, the tiny test models), :mod:`~lensprobe.core.prompts`
(prompts with named segments, fillers, the one vocabulary of prompt conditions),
:mod:`~lensprobe.core.hooks` (``intervene``, the hook point every hook receives, capabilities, head and
position specs, one forward pass) and :mod:`~lensprobe.core.measures` (metrics, measures, the one metric
vocabulary). Its base modules (errors, the heavy libraries imported on first use, the version, the
settings helpers) come before all of them.

May import: third-party libraries and other ``lensprobe.core`` modules; nothing else of lensprobe.
"""
