"""What every hook lensprobe attaches receives: a hook point and the step it runs in.

Every hook attached through :func:`lensprobe.intervene` (user ``(name, fn)`` pairs,
interventions and lensprobe's own recorders), on every engine (the TransformerBridge, the
plain Hugging Face view, the rows-alone decode path and a TransformerLens 3.x
``HookedTransformer``), is called as ``fn(activation, hook)`` with ``hook`` a
:class:`HookSite`: TransformerLens's ``HookPoint`` surface (``hook.name``, ``hook.layer()``,
``hook.ctx``) plus ``hook.step``, the :class:`StepContext` of the forward that is running, and
``hook.hook_point``, the TransformerLens ``HookPoint`` itself where one fires. ``hook.name`` is the
name TransformerLens itself passes for that hook point (with ``model.hooks()``), however the hook
was attached: by an alias (``blocks.0.mlp.hook_post``), by the bridge's own name
(``blocks.0.mlp.out.hook_in``) or by a name filter.

The step is published by whoever runs the forward, never guessed by a hook:

- :func:`lensprobe.generate` / ``trace_generation`` publish each prompt forward and decode
  step (rows, per-row steps and absolute positions, latent inputs);
- any other forward of the model inside :func:`lensprobe.intervene` (``lp.forward``, sweeps,
  patching, attribution, or your own ``model(tokens)`` or manual KV loop) is described from
  its own inputs: the positions follow the KV cache's length and, where an
  ``attention_mask`` is passed, each row's left padding (negative positions).

A hook that needs positions calls :meth:`HookSite.positions`, which refuses (naming the fix)
an activation the published step does not describe, or a forward nothing described.
"""

from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

from lensprobe.core.errors import LensprobeError

__all__ = ["HookSite", "StepContext", "Steps", "bind", "positions_of"]


@dataclass(frozen=True)
class StepContext:
    """The forward a hook runs in: which rows, which steps, which absolute positions.

    The activations' ``batch`` axis holds the rows this forward runs. With continuous
    batching (``lp.generate(..., batch_size=B)``) those are the live rows, which may be at
    different steps: use ``positions`` (or ``steps``) rather than ``step``, and ``rows`` to
    tell which row of the generation each one is.

    Attributes:
        step: generation step (0 = the prompt forward, whose last query predicts step 0);
            under continuous batching, the largest of ``steps``. Outside the generation loop:
            0 for a forward without a KV cache, one more than the previous forward's for a
            forward that continues a cache.
        positions: ``[batch, pos]`` absolute token positions of the activations' ``pos``
            axis (counted from each row's first real token; left padding is negative).
        prompt_lengths: ``[batch]`` prompt lengths without padding (``None`` outside the
            generation loop).
        steps: ``[batch]`` generation step of each row (``None`` outside the generation loop).
        rows: ``[batch]`` each row's index in the generation's trace (``None`` likewise).
        prefill: this forward is a prompt forward (every row of it starts: its prompt
            positions, step 0); ``False`` for a decode step (one new position per row).
        inputs: latent thinking inputs of this forward, ``(batch rows, [n, d_model] vectors)``
            put in at those rows' newest input embedding (``hook_embed``), or ``None``.

    Contract: a hook that acts by position and receives an activation whose ``[batch, pos]``
    does not match ``positions`` (:meth:`fits`) must raise rather than guess;
    :meth:`HookSite.positions` does.
    """

    step: int
    positions: Int[Tensor, "batch pos"]
    prompt_lengths: Int[Tensor, " batch"] | None = None
    steps: Int[Tensor, " batch"] | None = None
    rows: Int[Tensor, " batch"] | None = None
    prefill: bool = False
    inputs: tuple[Tensor, Tensor] | None = None

    def fits(self, batch: int, count: int) -> bool:
        """Whether ``positions`` describe an activation of ``batch`` rows and ``count`` positions."""
        return self.positions.shape[-1] == count and self.positions.shape[0] in (1, batch)


class Steps:
    """The step of the forwards of one attachment (one :func:`lensprobe.intervene` block).

    A runner that knows more than a forward's inputs (the generation loop) calls
    :meth:`publish` before each forward; otherwise :meth:`describe_inputs` describes each
    forward of the model from its own arguments.
    """

    __slots__ = ("current", "explicit")

    def __init__(self) -> None:
        self.current: StepContext | None = None
        self.explicit = False

    def publish(self, ctx: StepContext) -> None:
        """Make ``ctx`` the step every hook of this attachment sees, until the next publish."""
        self.current = ctx
        self.explicit = True

    def describe_inputs(self, model, args: tuple, kwargs: dict) -> None:
        """Describe a forward of ``model`` from its inputs (unless a runner publishes steps)."""
        if self.explicit:
            return
        value = args[0] if args else kwargs.get("input", kwargs.get("input_ids"))
        shape = _input_shape(model, value, kwargs)
        if shape is None:
            self.current = None
            return
        batch, count = shape
        past = _past_length(kwargs)
        mask = _full_mask(kwargs, past, count)
        if isinstance(mask, Tensor) and mask.ndim == 2 and mask.shape[0] == batch:
            mask = mask.bool()
            first = mask.long().argmax(-1)  # each row's first real key (left padding before it)
            width = mask.shape[-1]
            positions = (torch.arange(width, device=mask.device)[None] - first[:, None])[:, width - count:]
        else:
            device = value.device if isinstance(value, Tensor) else None  # made where the forward runs
            positions = torch.arange(past, past + count, device=device)[None]
        previous = self.current
        step = previous.step + 1 if past and previous is not None else 0
        self.current = StepContext(step, positions, prefill=past == 0)


def _full_mask(kwargs: dict, past: int, count: int) -> Tensor | None:
    """The forward's attention mask over every key (cached ones too), or ``None``."""
    mask = kwargs.get("attention_mask")
    if not isinstance(mask, Tensor) or mask.ndim != 2:
        return None
    held = getattr(kwargs.get("past_kv_cache"), "previous_attention_mask", None)  # TransformerLens 3.x
    if past and mask.shape[-1] == count and isinstance(held, Tensor) and held.shape[-1] == past:
        mask = torch.cat([held.to(mask.device, mask.dtype), mask], dim=-1)
    return mask if mask.shape[-1] == past + count else None


def _input_shape(model, value: Any, kwargs: dict) -> tuple[int, int] | None:
    """``(batch, pos)`` of a forward's input: token ids, input embeddings, or text."""
    if isinstance(value, Tensor):
        if value.ndim == 1:
            return 1, int(value.shape[0])
        return (int(value.shape[0]), int(value.shape[1])) if value.ndim >= 2 else None
    embeds = kwargs.get("inputs_embeds")
    if isinstance(embeds, Tensor) and embeds.ndim == 3:
        return int(embeds.shape[0]), int(embeds.shape[1])
    if isinstance(value, (str, list)) and callable(getattr(model, "to_tokens", None)):
        try:
            tokens = model.to_tokens(value, **{k: kwargs[k] for k in ("prepend_bos", "padding_side") if k in kwargs})
        except Exception:  # text the model's own forward will refuse, with its own message
            return None
        return int(tokens.shape[0]), int(tokens.shape[1])
    return None


def _past_length(kwargs: dict) -> int:
    """Positions already in the KV cache a forward continues (0 without one)."""
    past = next((kwargs[k] for k in ("past_key_values", "past_kv_cache", "cache") if kwargs.get(k) is not None), None)
    if past is None:
        return 0
    length = getattr(past, "get_seq_length", None)
    if callable(length):
        return int(length())
    entries = getattr(past, "entries", None)  # a TransformerLens 3.x HookedTransformerKeyValueCache
    if entries:
        return int(entries[0].past_keys.shape[1])
    if isinstance(past, (tuple, list)) and past and isinstance(past[0], (tuple, list)):
        return int(past[0][0].shape[-2])  # the legacy tuple of (key, value) per layer
    raise LensprobeError(
        f"cannot tell how many positions a {type(past).__name__} KV cache holds: pass a transformers Cache "
        "(e.g. the one the model returned), or run the generation with lp.generate."
    )


class HookSite:
    """What a hook receives: TransformerLens's ``HookPoint`` surface and the forward's step.

    Attributes:
        name: the name TransformerLens gives the hook point that fires, the ``hook.name`` the same
            function gets when attached with ``model.hooks()``: on a TransformerBridge its own name
            for the point (``"blocks.3.mlp.out.hook_in"`` for the alias ``"blocks.3.mlp.hook_post"``,
            ``"blocks.3.attn.o.hook_in"`` for ``"blocks.3.attn.hook_z"``), on a ``HookedTransformer``
            the name you attached at; the plain engine reports the bridge's name for the same point.
        hook_point: the TransformerLens ``HookPoint`` that fires (``None`` on the plain engine, whose
            hooks are torch hooks on Hugging Face modules).
        ctx: a dict a hook may keep state in, one per hook point for the attachment (one
            :func:`lensprobe.intervene` block or one generation), on every engine; it starts empty
            in each attachment.
    """

    __slots__ = ("_steps", "ctx", "hook_point", "name")

    def __init__(self, name: str, steps: Steps, ctx: dict, hook_point: Any = None) -> None:
        self.name = name
        self._steps = steps
        self.ctx = ctx
        self.hook_point = hook_point

    def layer(self) -> int:
        """The block index in the name (``blocks.3.attn.hook_z`` -> 3), as ``HookPoint.layer()``."""
        parts = self.name.split(".")
        if len(parts) < 2 or parts[0] != "blocks" or not parts[1].isdigit():
            raise LensprobeError(f"hook point {self.name!r} is not in a block, so it has no layer.")
        return int(parts[1])

    @property
    def step(self) -> StepContext | None:
        """The :class:`StepContext` of the forward running now (``None``: nothing described it)."""
        return self._steps.current

    def positions(self, batch: int, count: int, who: str) -> tuple[Tensor, Tensor | None]:
        """``[rows, count]`` absolute positions of an activation's ``pos`` axis, and the
        ``[rows]`` prompt lengths when known; refuses what the step does not describe."""
        return positions_of(self, batch, count, who)

    def __repr__(self) -> str:
        return f"HookSite({self.name!r})"


def positions_of(hook: Any, batch: int, count: int, who: str) -> tuple[Tensor, Tensor | None]:
    """:meth:`HookSite.positions` for any hook object (a bare TransformerLens hook point has no step).

    Raises:
        LensprobeError: no step was published (hooks attached without ``lp.intervene``, or a
            forward whose input could not be read), or one that does not fit the activation.
    """
    info = getattr(hook, "step", None)
    if info is None:
        raise LensprobeError(
            f"{who}: no token positions were published for this forward, so position-dependent hooks cannot "
            "place it: attach with lp.intervene(model, ...) and call the model on token ids inside it "
            "(or use lp.forward / lp.generate)."
        )
    if not info.fits(batch, count):
        raise LensprobeError(
            f"{who}: this activation has {batch} row(s) x {count} position(s) but the forward's step describes "
            f"{tuple(info.positions.shape)}, so positions cannot be placed; run this input in a forward of its own."
        )
    return info.positions, info.prompt_lengths


def bind(fn, name: str, steps: Steps, contexts: dict[str, dict], hook_point: Any = None):
    """``fn(activation, hook)`` called with a :class:`HookSite` for ``name`` whatever the engine passes
    (``contexts``: the attachment's ``ctx`` dict per hook point name; ``hook_point``: the
    TransformerLens ``HookPoint`` that fires, or ``None``)."""
    site = HookSite(name, steps, contexts.setdefault(name, {}), hook_point)

    def call(act, hook=None):
        return fn(act, site)

    call.__wrapped__ = fn  # type: ignore[attr-defined]
    return call
