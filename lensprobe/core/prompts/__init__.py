"""Prompts with named segments (:mod:`.prompt`), fillers (:mod:`.fillers`, :mod:`.randomtext`), text
checks (:mod:`.text`) and the one vocabulary of prompt conditions (:mod:`.conditions`).

May import: :mod:`lensprobe.core.models.loading`, :mod:`lensprobe.core.storage` and the core's base modules.
"""
