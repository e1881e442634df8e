"""Interventions and recorders, and the one context manager that attaches them.

An intervention is anything with a ``hooks(model)`` method returning TransformerLens
forward hooks ``[(hook_name, fn), ...]`` where ``fn(activation, hook) -> activation | None``,
or a plain ``(hook_name, fn)`` pair. As in TransformerLens's ``hooks()``, ``hook_name`` may be a
name filter, a callable ``name -> bool``: the hook goes on every hook point it accepts, once each. :func:`intervene` attaches a list of them through
``model.hooks()`` and removes exactly those hooks on exit, also when an exception (or a
KeyboardInterrupt) is raised; hooks the user attached before are left alone.
Interventions never mutate weights; a hook that edits an activation clones it first.
"""

import contextlib
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from lensprobe.core.errors import LensprobeError, LensprobeWarning
from lensprobe.core.hooks.capabilities import Capabilities, capabilities
from lensprobe.core.hooks.hookpoint import HookSite, StepContext, Steps, bind, positions_of

__all__ = ["ActivationRecorder", "AttentionRecorder", "Capabilities", "Hook", "HookFn", "HookSite", "Intervention",
           "StepContext", "Steps", "batch_dependent", "bound_hooks", "capabilities",
           "check_positions", "intervene", "matching_hook_names", "pattern_hook_name", "positions_of", "recording_hook", "resolve_hooks",
           "rounding_sensitive_layer", "with_default_seed"]

HookFn = Callable[[torch.Tensor, Any], torch.Tensor | None]
Hook = tuple[str, HookFn]


@runtime_checkable
class Intervention(Protocol):
    """Protocol: an object that yields the TransformerLens forward hooks it needs.

    What generic code must know about an intervention beyond its hooks (whether its rows
    depend on each other, a rounding-sensitive layer, seeding, positions, binding to a prompt)
    it declares as ``capabilities``, one :class:`~lensprobe.core.hooks.capabilities.Capabilities`,
    read only by :func:`~lensprobe.core.hooks.capabilities.capabilities` (no code outside an
    intervention's own module checks its type).
    """
    def hooks(self, model) -> list[Hook]: ...


def batch_dependent(interventions) -> list:
    """The interventions whose result for a row depends on the other rows of its forward
    (declared ``batch_dependent``, see :mod:`lensprobe.core.hooks.capabilities`).

    Example:
        >>> batch_dependent([lp.ARM(c=0.1, percentile=95, per_row=False)])  # [ARM(...)]
    """
    return [i for i in interventions if capabilities(i).batch_dependent]


def rounding_sensitive_layer(interventions) -> int | None:
    """The last layer any of ``interventions`` is rounding-sensitive at (declared
    ``rounding_sensitive_layer``, see :mod:`lensprobe.core.hooks.capabilities`), or ``None``."""
    layers = [capabilities(i).rounding_sensitive_layer for i in interventions]
    return max((x for x in layers if x is not None), default=None)


def with_default_seed(interventions, seed: int | None) -> tuple:
    """``interventions`` with every unseeded one that draws random numbers given ``seed``
    (declared ``seeded``: its ``with_default_seed(seed)``); the others as they are."""
    if seed is None:
        return tuple(interventions)
    return tuple(i.with_default_seed(seed) if capabilities(i).seeded else i for i in interventions)


def _hooks_of(model, item) -> list[Hook]:
    if isinstance(item, Intervention):
        pairs = list(item.hooks(model))
    elif isinstance(item, tuple) and len(item) == 2 and (isinstance(item[0], str) or callable(item[0])) \
            and callable(item[1]):
        pairs = [item]
    else:
        raise LensprobeError(
            f"cannot attach {item!r}: pass an intervention (an object with a hooks(model) method) "
            "or a (hook_name, fn) pair (hook_name a name or a name filter, a callable name -> bool)."
        )
    return [(name, fn) for where, fn in pairs
            for name in ([where] if isinstance(where, str) else matching_hook_names(model, where))]


def matching_hook_names(model, name_filter: Callable[[str], bool]) -> list[str]:
    """The hook points a name filter selects, as TransformerLens's ``hooks()`` attaches them.

    Every name of ``model.hook_dict`` (a bridge's aliases included) is offered to the filter; each
    hook point it accepts is named once, by its own name (``hook_point.name``). On a bridge, hook
    points switched off in the config (``hook_result`` without ``use_attn_result``, ...) are left
    out with a warning, as ``model.hooks()`` does, since a hook there would never fire.

    Example:
        >>> matching_hook_names(model, lambda name: name.endswith("hook_z"))
        ['blocks.0.attn.o.hook_in', 'blocks.1.attn.o.hook_in']
    """
    gated = getattr(model, "_gated_hook_reason", None)  # TransformerBridge: why a point never fires, or None
    names: list[str] = []
    seen: set[int] = set()
    skipped: list[str] = []
    for key, point in model.hook_dict.items():
        if not name_filter(key) or id(point) in seen:
            continue
        seen.add(id(point))
        name = getattr(point, "name", None) or key
        if callable(gated) and gated(name) is not None:
            skipped.append(key)
            continue
        names.append(name)
    if skipped:
        warnings.warn(f"a name filter selected hook points that never fire with this config, left out: {skipped}; "
                      "turn them on first with the model's setter (e.g. model.set_use_hook_mlp_in(True)).", LensprobeWarning,
                      stacklevel=3)
    return names


def resolve_hooks(model, interventions) -> list[Hook]:
    """Flatten interventions into hooks (name filters into the names they select) and check every
    hook name exists on the model."""
    hooks: list[Hook] = []
    for item in interventions:
        hooks.extend(_hooks_of(model, item))
    names = model.hook_dict
    for name, _ in hooks:
        if name not in names:
            near = [n for n in names if n.endswith(name.split(".")[-1])][:3]
            raise LensprobeError(
                f"hook point {name!r} does not exist on this model"
                + (f" (similar: {near})" if near else "")
                + "; use TransformerLens hook names such as 'blocks.0.attn.hook_pattern'."
            )
    return hooks


@contextlib.contextmanager
def intervene(model, *interventions, steps: Steps | None = None) -> Iterator[Any]:
    """Attach interventions and recorders for the duration of a ``with`` block.

    Every hook is called as ``fn(activation, hook)`` with ``hook`` a
    :class:`~lensprobe.core.hooks.hookpoint.HookSite` (``hook.name``, ``hook.layer()``, ``hook.ctx``,
    ``hook.hook_point`` and ``hook.step``: the :class:`~lensprobe.core.hooks.hookpoint.StepContext` of
    the forward that runs). ``hook.name`` is what TransformerLens names the hook point that fires, as
    with ``model.hooks()`` (an alias such as ``blocks.0.attn.hook_z`` gives the bridge's own name,
    ``blocks.0.attn.o.hook_in``). A ``(name_filter, fn)`` pair, ``name_filter`` a callable
    ``name -> bool``, attaches ``fn`` at every hook point the filter selects, as ``model.hooks()`` does. Each forward of ``model`` inside the block is described from its own inputs (KV
    cache length, ``attention_mask``) unless a runner publishes the steps through ``steps``.

    Args:
        model: a TransformerLens model.
        *interventions: interventions, recorders, or ``(hook_name, fn)`` pairs (``hook_name`` a name
            or a name filter).
        steps: the steps a runner publishes (the generation loop); ``None`` describes each
            forward from its inputs.

    Example:
        >>> rec = AttentionRecorder(layers=[0])
        >>> with intervene(model, rec):
        ...     model(prompt.tokens)
        >>> rec.patterns[0].shape  # [batch, head, query_pos, key_pos]
    """
    steps = Steps() if steps is None else steps
    hooks = bound_hooks(model, resolve_hooks(model, interventions), steps)
    handle = model.register_forward_pre_hook(
        lambda module, args, kwargs: steps.describe_inputs(module, args, kwargs), with_kwargs=True)
    try:
        with model.hooks(fwd_hooks=hooks, reset_hooks_end=True):
            yield model
    finally:
        handle.remove()


def bound_hooks(model, hooks: list[Hook], steps: Steps, *, fired: bool = True) -> list[Hook]:
    """``hooks`` whose functions receive a :class:`~lensprobe.core.hooks.hookpoint.HookSite` reading ``steps``,
    whatever object the engine passes, each named and attached by the name TransformerLens gives its hook
    point (``model.hook_dict[name].name``: the same ``hook.name`` as through ``model.hooks()``), with one
    ``ctx`` dict per hook point. ``fired``: the model's own hook points fire (the site's ``hook_point``);
    ``False`` when another engine runs the hooks (the plain view: ``hook_point`` is ``None``)."""
    contexts: dict[str, dict] = {}
    points = model.hook_dict
    bound: list[Hook] = []
    for name, fn in hooks:
        point = points.get(name)
        own = getattr(point, "name", None) or name
        bound.append((own, bind(fn, own, steps, contexts, point if fired else None)))
    return bound


def check_positions(interventions, length: int, what: str = "prompt") -> None:
    """Let each intervention that acts on token positions refuse positions a run of ``length``
    positions never reaches (declared ``positions``: its ``check_positions(length, what)``), before any forward.

    Example:
        >>> check_positions([lp.ablate_heads("L0H1", positions=[5000])], 39)  # raises LensprobeError
    """
    for item in interventions:
        if capabilities(item).positions:
            item.check_positions(length, what)


def pattern_hook_name(layer: int) -> str:
    """Hook point of a layer's attention pattern, ``[batch, head, query_pos, key_pos]``."""
    return f"blocks.{layer}.attn.hook_pattern"


def recording_hook(store: dict, key: Any, *, reduce: Callable[[Tensor], Tensor] | None = None,
                   copy: bool = True) -> HookFn:
    """A hook that keeps the activation it sees in ``store[key]`` (the last one seen).

    This is how every recorder of lensprobe records: ``reduce(activation)`` when a reduction
    is given (computed inside the hook, so the full activation is never stored), else a
    copy of the activation (``copy=True``), or the model's own tensor (``copy=False``).
    The activation is detached first and never edited; a half-precision activation (bf16,
    fp16) is recorded in float32, so reductions and metrics over it accumulate in float32.

    It keeps one forward: a forward that continues a KV cache (a generation's decode step, or a manual
    loop) is refused with a pointer to ``record=`` of :func:`lensprobe.generate`, which keeps every step.
    """
    def record(act: Tensor, hook) -> None:
        step = getattr(hook, "step", None)
        if step is not None and step.step > 0:
            raise LensprobeError(
                f"a recorder keeps one forward, but {getattr(hook, 'name', key)} fired in a forward that continues a "
                f"KV cache (step {step.step}): to record every step of a generation pass record=[hook names] to "
                "lp.generate / lp.trace_generation (trace.activations_rows)."
            )
        value = act.detach()
        if value.dtype in (torch.float16, torch.bfloat16):
            value = value.float()  # recorded values accumulate in float32 whatever the model's dtype
        if reduce is not None:
            store[key] = reduce(value)
        else:
            store[key] = value.clone() if copy else value

    return record


@dataclass
class AttentionRecorder:
    """Keeps the attention patterns of the requested layers (nothing else) from a forward pass.

    ``patterns[layer]`` is ``[batch, head, query_pos, key_pos]``. A ``reduce`` function
    (pattern -> tensor) keeps a reduction instead of the full pattern, computed inside the
    hook so the full pattern is never stored.

    With ``copy=True`` (the default) the recorder stores a copy, so a hook attached after
    it that edits the pattern in place cannot change what was recorded. ``copy=False``
    keeps the model's own tensor (no extra memory or time); use it when the recorder is
    the last hook on its hook points, as :func:`lensprobe.attention_patterns` does.

    Example:
        >>> rec = AttentionRecorder(layers=[0], reduce=average_attention_received)
        >>> with intervene(model, rec):
        ...     model(prompt.tokens)
        >>> rec.patterns[0].shape  # [batch, head, key_pos]
    """

    layers: list[int]
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None
    patterns: dict[int, torch.Tensor] = field(default_factory=dict)
    copy: bool = True

    def hooks(self, model) -> list[Hook]:
        return [(pattern_hook_name(layer), recording_hook(self.patterns, layer, reduce=self.reduce, copy=self.copy))
                for layer in self.layers]


@dataclass
class ActivationRecorder:
    """Keeps a copy of each named hook point's activation from a forward pass (the last one seen).

    ``acts[name]`` holds the activation (or ``reduce(activation)``, computed inside the hook;
    with ``copy=False`` the model's own tensor instead of a copy), as for
    :class:`AttentionRecorder`.

    Example:
        >>> rec = ActivationRecorder(["blocks.0.attn.hook_z"])
        >>> with intervene(model, rec):
        ...     model(prompt.tokens)
        >>> rec.acts["blocks.0.attn.hook_z"].shape  # [batch, pos, head_index, d_head]
    """

    names: list[str]
    acts: dict[str, Tensor] = field(default_factory=dict)
    reduce: Callable[[Tensor], Tensor] | None = None
    copy: bool = True

    def hooks(self, model) -> list[Hook]:
        return [(name, recording_hook(self.acts, name, reduce=self.reduce, copy=self.copy)) for name in self.names]
