"""Interventions and recorders, and the one context manager that attaches them.

An intervention is anything with a ``hooks(model)`` method returning TransformerLens
forward hooks ``[(hook_name, fn), ...]`` where ``fn(activation, hook) -> activation | None``,
or a plain ``(hook_name, fn)`` pair. :func:`intervene` attaches a list of them through
``model.hooks()`` and removes exactly those hooks on exit, also when an exception (or a
KeyboardInterrupt) is raised; hooks the user attached before are left alone.
Interventions never mutate weights; a hook that edits an activation clones it first.
"""

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
from jaxtyping import Int
from torch import Tensor

from lensprobe.core.errors import LensprobeError

HookFn = Callable[[torch.Tensor, Any], torch.Tensor | None]
Hook = tuple[str, HookFn]


@runtime_checkable
class Intervention(Protocol):
    """Protocol: an object that yields the TransformerLens forward hooks it needs.

    Optional capabilities, read with ``getattr`` by the generation loop and the evaluation
    harness (no code outside an intervention's own module checks its type):

    - ``batch_dependent`` (bool attribute or property): one row's result depends on the other
      rows of its forward (statistics over the whole batch tensor). :func:`lensprobe.generate`
      then runs static batches (never continuous batching, whose refill schedule would decide
      which rows share a forward), and evaluations generate each problem alone.
    - ``with_default_seed(seed)``: a copy that draws from ``seed`` when the intervention has no
      seed of its own (``self`` when it has one); evaluations seed with their run's ``seed``.
    - ``rounding_sensitive_layer`` (int or ``None``): the last layer whose activations the
      intervention thresholds or ranks (ARM: its layer), so that a float-rounding difference
      there can change its result. The plain engine then computes decode steps row by row up
      to that layer (:mod:`lensprobe.generation.engines.rowwise`), so under continuous
      batching each row gets the numbers it gets alone, bit for bit.
    - ``check_positions(length, what)``: refuse token positions a run never reaches
      (:func:`check_positions`).
    """
    def hooks(self, model) -> list[Hook]: ...


def batch_dependent(interventions) -> list:
    """The interventions whose result for a row depends on the other rows of its forward
    (their ``batch_dependent`` capability, see :class:`Intervention`).

    Example:
        >>> batch_dependent([lp.ARM(c=0.1, percentile=95, per_row=False)])  # [ARM(...)]
    """
    return [i for i in interventions if getattr(i, "batch_dependent", False) is True]


def rounding_sensitive_layer(interventions) -> int | None:
    """The last layer any of ``interventions`` is rounding-sensitive at (their
    ``rounding_sensitive_layer`` capability, see :class:`Intervention`), or ``None``."""
    layers = [getattr(i, "rounding_sensitive_layer", None) for i in interventions]
    return max((int(x) for x in layers if x is not None), default=None)


def with_default_seed(interventions, seed: int | None) -> tuple:
    """``interventions`` with every unseeded one that draws random numbers given ``seed``
    (their ``with_default_seed`` capability, see :class:`Intervention`); the others as they are."""
    if seed is None:
        return tuple(interventions)
    return tuple(i.with_default_seed(seed) if callable(getattr(i, "with_default_seed", None)) else i
                 for i in interventions)


def _hooks_of(model, item) -> list[Hook]:
    if isinstance(item, Intervention):
        return list(item.hooks(model))
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str) and callable(item[1]):
        return [item]
    raise LensprobeError(
        f"cannot attach {item!r}: pass an intervention (an object with a hooks(model) method) "
        "or a (hook_name, fn) pair."
    )


def resolve_hooks(model, interventions) -> list[Hook]:
    """Flatten interventions into hooks and check every hook name exists on the model."""
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
def intervene(model, *interventions) -> Iterator[Any]:
    """Attach interventions and recorders for the duration of a ``with`` block.

    Args:
        model: a TransformerLens model.
        *interventions: interventions, recorders, or ``(hook_name, fn)`` pairs.

    Example:
        >>> rec = AttentionRecorder(layers=[0])
        >>> with intervene(model, rec):
        ...     model(prompt.tokens)
        >>> rec.patterns[0].shape  # [batch, head, query_pos, key_pos]
    """
    hooks = resolve_hooks(model, interventions)
    with model.hooks(fwd_hooks=hooks, reset_hooks_end=True):
        yield model


def check_positions(interventions, length: int, what: str = "prompt") -> None:
    """Let each intervention that acts on token positions refuse positions a run of ``length``
    positions never reaches (its ``check_positions(length, what)`` method), before any forward.

    Example:
        >>> check_positions([lp.ablate_heads("L0H1", positions=[5000])], 39)  # raises LensprobeError
    """
    for item in interventions:
        check = getattr(item, "check_positions", None)
        if callable(check):
            check(length, what)


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
    """
    def record(act: Tensor, hook) -> None:
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


# --------------------------------------------------------------------------- step context
@dataclass(frozen=True)
class StepContext:
    """Where the forward pass running inside :func:`lensprobe.generate` is: the one way a hook
    learns it (read it with :func:`current_step`).

    The activations' ``batch`` axis holds the rows this forward runs. With continuous
    batching (``lp.generate(..., batch_size=B)``) those are the live rows, which may be at
    different steps: use ``positions`` (or ``steps``) rather than ``step``, and ``rows`` to
    tell which row of the generation each one is.

    Attributes:
        step: generation step (0 = the prompt forward, whose last query predicts step 0);
            under continuous batching, the largest of ``steps``.
        positions: ``[batch, pos]`` absolute token positions of the activations' ``pos``
            axis (counted from each row's first prompt token; left padding is negative).
        prompt_lengths: ``[batch]`` prompt lengths without padding.
        steps: ``[batch]`` generation step of each row (``None`` outside the generation loop).
        rows: ``[batch]`` each row's index in the generation's trace (``None`` likewise).
        prefill: this forward is a prompt forward (every row of it starts: its prompt
            positions, step 0); ``False`` for a decode step (one new position per row).
        inputs: latent thinking inputs of this forward, ``(batch rows, [n, d_model] vectors)``
            put in at those rows' newest input embedding (``hook_embed``), or ``None``.

    Contract: a hook that acts by position and receives an activation whose ``[batch, pos]``
    does not match ``positions`` (:meth:`fits`) must raise rather than guess; lensprobe's own
    hooks do.
    """

    step: int
    positions: Int[Tensor, "batch pos"]
    prompt_lengths: Int[Tensor, " batch"]
    steps: Int[Tensor, " batch"] | None = None
    rows: Int[Tensor, " batch"] | None = None
    prefill: bool = False
    inputs: tuple[Tensor, Tensor] | None = None

    def fits(self, batch: int, count: int) -> bool:
        """Whether ``positions`` describe an activation of ``batch`` rows and ``count`` positions."""
        return self.positions.shape[-1] == count and self.positions.shape[0] in (1, batch)


StepInfo = StepContext
"""The former name of :class:`StepContext` (kept for code that imports it)."""

_CURRENT: contextvars.ContextVar[StepContext | None] = contextvars.ContextVar("lensprobe_step", default=None)


def current_step() -> StepContext | None:
    """The :class:`StepContext` of the forward pass :func:`lensprobe.generate` is running, else ``None``.

    Hooks use it to map the ``pos`` axis of an activation to absolute positions (e.g. to act
    on prompt positions only), to tell prompt forwards from decode steps, and to find which
    generation row each batch row is.

    Example:
        >>> def hook(z, hook):
        ...     ctx = lp.current_step()
        ...     keep = ctx.positions < 10 if ctx else ...
    """
    return _CURRENT.get()


@contextlib.contextmanager
def step_context() -> Iterator[Callable[[StepContext], object]]:
    """While open, ``publish(ctx)`` makes ``ctx`` what :func:`current_step` returns.

    The generation loop publishes each forward's :class:`StepContext` through it; on exit
    (also after an exception) :func:`current_step` returns what it returned before.
    """
    token = _CURRENT.set(None)
    try:
        yield _CURRENT.set
    finally:
        _CURRENT.reset(token)


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
