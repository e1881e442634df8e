"""The papers' analyses: filler tokens (attention received, filler vs a random sentence, token
classes), the layer-0 mechanism (the affine rescaling of attention by the filler, MLP
activations moving away from zero), heads (attention on one head over generation, ablation
effects) and latent thinking (the same prompts under several thinking settings). They compute and return
tables and results; figures and reports live in :mod:`lensprobe.viz` and :mod:`lensprobe.app`.

May import: :mod:`lensprobe.core`, :mod:`lensprobe.interventions`, :mod:`lensprobe.generation`.
"""
