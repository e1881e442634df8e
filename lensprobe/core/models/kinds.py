"""Which kind of TransformerLens model lensprobe was given: a ``TransformerBridge`` or a ``HookedTransformer``.

TransformerLens 4 has only the ``TransformerBridge`` (a Hugging Face model wrapped in hook
points); the 3.x line also has the ``HookedTransformer`` (TransformerLens' own modules and
weights, its own KV cache). Both have the same hook names (``blocks.{l}.attn.hook_z``,
``blocks.{l}.attn.hook_pattern``, ``hook_embed``, ...), ``cfg``, ``tokenizer`` and
``hooks()``, so almost all of lensprobe treats them alike. The few places that need
something only one kind has ask here, and nowhere else.

``transformer_lens`` takes seconds to import, so it is never imported here just to look:
a model that is an instance of one of its classes can only exist once the library has been
imported, so until then every answer is ``False``.

Example:
    >>> from lensprobe.core.models.kinds import is_bridge, is_hooked_transformer, model_kind
    >>> model_kind(lp.load_model())
    'bridge'
"""

import functools
import sys
from typing import Any, Literal

from lensprobe.core.errors import LensprobeError

__all__ = ["HOOKED_INSTALL", "ModelKind", "hooked_transformer_class", "is_bridge", "is_hooked_transformer",
           "model_kind", "require_bridge"]

ModelKind = Literal["bridge", "hooked_transformer", "other"]

HOOKED_INSTALL = "pip install 'transformer-lens>=3.8,<4'"
"""How to install a TransformerLens with ``HookedTransformer`` that lensprobe supports."""


@functools.cache
def hooked_transformer_class() -> type | None:
    """TransformerLens' ``HookedTransformer`` class, or ``None`` when the installed release has none (4.x).

    Example:
        >>> hooked_transformer_class()   # with transformer-lens 3.9
        <class 'transformer_lens.HookedTransformer.HookedTransformer'>
    """
    try:
        from transformer_lens import HookedTransformer
    except ImportError:
        return None
    return HookedTransformer


@functools.cache
def _bridge_class() -> type | None:
    try:
        from transformer_lens.model_bridge import TransformerBridge
    except ImportError:
        return None
    return TransformerBridge


def _loaded() -> bool:
    return "transformer_lens" in sys.modules


def is_hooked_transformer(model: Any) -> bool:
    """Whether ``model`` is a TransformerLens ``HookedTransformer`` (TransformerLens 3.x and older).

    Example:
        >>> is_hooked_transformer(tiny_hooked_model())
        True
    """
    if not _loaded():
        return False
    cls = hooked_transformer_class()
    return cls is not None and isinstance(model, cls)


def is_bridge(model: Any) -> bool:
    """Whether ``model`` is a TransformerLens ``TransformerBridge`` (a wrapped Hugging Face model).

    Example:
        >>> is_bridge(lp.load_model())
        True
    """
    if not _loaded():
        return False
    cls = _bridge_class()
    return cls is not None and isinstance(model, cls)


def model_kind(model: Any) -> ModelKind:
    """``"bridge"``, ``"hooked_transformer"`` or ``"other"`` (a look-alike with hook points).

    Example:
        >>> model_kind(tiny_hooked_model())
        'hooked_transformer'
    """
    if is_bridge(model):
        return "bridge"
    if is_hooked_transformer(model):
        return "hooked_transformer"
    return "other"


def require_bridge(model: Any, feature: str, fix: str) -> None:
    """Refuse a ``HookedTransformer`` where ``feature`` needs a bridge's Hugging Face model.

    Args:
        model: the model given.
        feature: what needs the bridge, e.g. ``"engine='hf'"``.
        fix: what to do instead, e.g. ``"use engine='auto'"``.

    Raises:
        LensprobeError: ``model`` is a ``HookedTransformer``; the message names ``feature`` and ``fix``.

    Example:
        >>> require_bridge(model, "engine='hf'", "use engine='auto'")
    """
    if is_hooked_transformer(model):
        raise LensprobeError(
            f"{feature} needs a TransformerBridge (a Hugging Face model inside TransformerLens), but this "
            f"model is a HookedTransformer, which has no Hugging Face modules: {fix}."
        )
