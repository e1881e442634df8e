"""Experiment runners over the hook objects: ablation sweeps (:mod:`.sweep`), activation patching
(:mod:`.patching`), attribution (:mod:`.attribution`, with AtP and AtP* in :mod:`.atp`) and its exact
verification (:mod:`.verify`), and their configurations (:mod:`.head_settings`). Each runs many forwards,
identifies itself by content and saves into the results store.

May import: :mod:`lensprobe.core`, :mod:`lensprobe.interventions` and :mod:`lensprobe.generation`.
"""
