"""Models: loading (the embedded default, hub names, folders, existing bridges: :mod:`.loading`), a
Hugging Face folder checked before and after it loads (:mod:`.folders`), the GGUF file check
(:mod:`.gguf`), the converted-model cache (:mod:`.cache`), a bridge booted over a loaded model (:mod:`.boot`),
devices and dtypes (:mod:`.devices`), a model placed across devices (:mod:`.placement`), telling
model kinds apart (:mod:`.kinds`), the model's facts read once per run (:mod:`.facts`), the tiny random test models (:mod:`.testing`) and the paper's model
families as tiny Hugging Face folders (:mod:`.families`, with the families' chat templates in
:mod:`.chat_templates`).

May import: :mod:`lensprobe.core.storage` and the core's base modules.
"""
