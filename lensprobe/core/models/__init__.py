"""Models: loading (the embedded default, hub names, folders, existing bridges: :mod:`.loading`), the
GGUF conversion (:mod:`.gguf`), devices and dtypes (:mod:`.devices`), telling model kinds apart
(:mod:`.kinds`) and the tiny random test models (:mod:`.testing`).

May import: :mod:`lensprobe.core.storage` and the core's base modules.
"""
