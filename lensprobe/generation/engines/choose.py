"""The one place that decides which engine runs a generation."""

from collections.abc import Sequence

from lensprobe.core.errors import LensprobeError
from lensprobe.generation.engines.bridge import BridgeEngine
from lensprobe.generation.engines.hooknames import supports
from lensprobe.generation.engines.plain import PlainEngine
from lensprobe.generation.engines.protocol import ENGINE_NAMES, Engine
from lensprobe.generation.engines.view import has_user_hooks, plain_model

__all__ = ["choose_engine"]


def choose_engine(model, engine: str, *, interventions: Sequence, hook_names: Sequence[str], rows: int) -> Engine:
    """The engine for one generation.

    ``"bridge"``: always the TransformerBridge. ``"hf"``: the plain view, or an error saying
    why it cannot run. ``"auto"``: the plain view when nothing needs a TransformerLens hook
    point (no interventions, no hooks attached to the model, recorder hooks the view serves)
    and the view's logits match the bridge's; else the bridge.

    The view's attention: ``"sdpa_last"`` when attention patterns are recorded (fused sdpa
    plus the newest query's row), else ``"sdpa"``; ``"eager"`` is the fallback for both.
    """
    if engine not in ENGINE_NAMES:
        raise LensprobeError(f"engine must be 'auto', 'bridge' or 'hf', got {engine!r}.")
    if engine == "bridge":
        return BridgeEngine(model)
    why = None
    if interventions:
        why = "interventions run on the TransformerLens hook points"
    elif has_user_hooks(model):
        why = "hooks are attached to the model (they would not fire)"
    elif not supports(hook_names):
        why = f"a recorder needs hook points the plain model lacks ({list(hook_names)})"
    view = None
    if why is None:
        attention = "sdpa_last" if any(".hook_pattern" in name for name in hook_names) else "sdpa"
        view = plain_model(model, attention)
        view = plain_model(model, "eager") if view is None else view
        if view is None:
            why = "this model has no plain Hugging Face view with the same logits"
    if view is not None:
        return PlainEngine(model, view, rows)
    if engine == "hf":
        raise LensprobeError(f"engine='hf' cannot run here: {why}; use engine='auto' or 'bridge'.")
    return BridgeEngine(model)
