"""The one place that decides which engine runs a generation."""

from collections.abc import Sequence

from lensprobe.core.errors import LensprobeError
from lensprobe.core.hooks.attach import resolve_hooks
from lensprobe.core.models.kinds import is_hooked_transformer, require_bridge
from lensprobe.generation.engines.bridge import BridgeEngine
from lensprobe.generation.engines.hooked import HookedEngine
from lensprobe.generation.engines.hooknames import editable, plain_names, servable, supports
from lensprobe.generation.engines.plain import PlainEngine
from lensprobe.generation.engines.protocol import ENGINE_NAMES, Engine
from lensprobe.generation.engines.view import has_user_hooks, plain_model

__all__ = ["choose_engine", "engine_name", "engine_to_run"]


def choose_engine(model, engine: str, *, interventions: Sequence, hook_names: Sequence[str], rows: int) -> Engine:
    """The engine for one generation.

    ``"bridge"``: always the TransformerBridge. ``"hf"``: the plain view, or an error saying
    why it cannot run. ``"auto"``: the plain view when nothing needs a TransformerLens hook
    point the view lacks (no hooks attached to the model by the user; recorder hooks the view
    serves; interventions whose hooks all sit where the view applies their edits, such as
    :class:`~lensprobe.ARM` on a gated MLP) and the view's logits match the bridge's; else the
    bridge.

    The view's attention: ``"sdpa_last"`` when attention patterns are recorded (fused sdpa
    plus the newest query's row), else ``"sdpa"``; ``"eager"`` is the fallback for both.

    A TransformerLens 3.x ``HookedTransformer`` has no Hugging Face modules to view: ``"auto"``
    and ``"bridge"`` run it through its own hook points and KV cache
    (:class:`~lensprobe.generation.engines.hooked.HookedEngine`), ``"hf"`` is an error.

    Raises:
        LensprobeError: an unknown engine name, or ``"hf"`` where the plain view cannot run.
    """
    if engine not in ENGINE_NAMES:
        raise LensprobeError(f"engine must be 'auto', 'bridge' or 'hf', got {engine!r}.")
    if is_hooked_transformer(model):
        if engine == "hf":
            require_bridge(model, "engine='hf'", "use engine='auto' (its own hook points and KV cache)")
        return HookedEngine(model)
    if engine == "bridge":
        return BridgeEngine(model)
    edits = plain_names(model, [name for name, _ in resolve_hooks(model, interventions)])
    hook_names = plain_names(model, hook_names)
    why = None
    if not editable(edits):
        why = "interventions run on TransformerLens hook points the plain model does not serve"
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
            why = ("the model is placed with a device_map (only the bridge runs it)"
                   if getattr(getattr(model, "original_model", None), "hf_device_map", None)
                   else "this model has no plain Hugging Face view with the same logits")
        elif not servable(model, view, [*hook_names, *edits]):
            view, why = None, "the plain model's MLP is not a gated MLP the interventions' hooks can reach"
    if view is not None:
        return PlainEngine(model, view, rows)
    if engine == "hf":
        raise LensprobeError(f"engine='hf' cannot run here: {why}; use engine='auto' or 'bridge'.")
    return BridgeEngine(model)


def engine_name(model, engine: str = "auto", *, interventions: Sequence = (), hook_names: Sequence[str] = ()) -> str:
    """The engine :func:`choose_engine` runs for these interventions and recorders: ``"hf"``, ``"bridge"``
    or ``"hooked"``, never ``"auto"`` (what a resumable run records: the engines' numbers differ by float
    rounding, and with ARM by more; ``docs/numerics.md``).

    Example:
        >>> engine_name(model, interventions=[lp.ARM(c=0.1, percentile=95)])
        'hf'
    """
    return choose_engine(model, engine, interventions=interventions, hook_names=hook_names, rows=1).name


def engine_to_run(recorded: str) -> str:
    """The ``engine`` setting that runs the engine ``recorded`` by :func:`engine_name` (``"hooked"`` is ``"auto"``'s
    and ``"bridge"``'s choice on a ``HookedTransformer``)."""
    return "auto" if recorded == "hooked" else recorded
