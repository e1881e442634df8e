"""TransformerLens hook names served by a plain view, so hooks attach to it unchanged.

Served names, as torch hooks on the view's modules:

- ``hook_embed``: the input embedding's output; a returned tensor replaces it.
- ``blocks.{l}.attn.hook_pattern``: the attention weights the view's attention returns
  (read only: the output is already computed from them).
- ``blocks.{l}.mlp.hook_pre`` (``gate_proj``'s output), ``blocks.{l}.mlp.hook_pre_linear``
  (``up_proj``'s output) and ``blocks.{l}.mlp.hook_post`` (the input of ``down_proj``,
  ``act_fn(gate) * up``) of a gated MLP; a returned tensor replaces the activation, as on
  the bridge.
- ``ln_final.hook_out`` / ``ln_final.hook_normalized``: the input of the unembedding (read only).
- ``blocks.{l}.hook_resid_pre`` and ``blocks.{l}.hook_resid_post``: the decoder layer's input and output
  hidden states (read only; what ``record=`` and the logit lens read).

:func:`editable` tells whether every name is one whose hooks may return a replacement, so interventions that
use only those run on a plain view (:func:`lensprobe.generation.engines.choose.choose_engine`).
:func:`attached` attaches hooks and removes them on exit. Torch hooks carry no hook point, so
:class:`~lensprobe.generation.engines.plain.PlainEngine` passes functions bound by
:func:`lensprobe.core.hooks.attach.bound_hooks`: each receives the same
:class:`~lensprobe.core.hooks.hookpoint.HookSite` (name, layer, ctx, step) it receives on the bridge
(``hook_point`` is ``None``: no TransformerLens hook point fires). A bridge names a hook point by its own name
and by aliases (``blocks.0.mlp.out.hook_in`` is ``blocks.0.mlp.hook_post``): :func:`plain_names` spells
each name as the view serves it.
"""

import contextlib
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from lensprobe.core.errors import LensprobeError
from lensprobe.generation.engines.view import attention_modules, block_modules, mlp_modules

__all__ = ["PLAIN_HOOKS", "attached", "editable", "plain_names", "servable", "supports"]


PLAIN_HOOKS = ("hook_embed", "blocks.{layer}.attn.hook_pattern", "blocks.{layer}.mlp.hook_pre",
               "blocks.{layer}.mlp.hook_pre_linear", "blocks.{layer}.mlp.hook_post", "ln_final.hook_out",
               "ln_final.hook_normalized", "blocks.{layer}.hook_resid_pre", "blocks.{layer}.hook_resid_post")
"""TransformerLens hook names a plain view can serve."""


_FINAL = ("ln_final.hook_out", "ln_final.hook_normalized")
_PATTERN = re.compile(r"blocks\.(\d+)\.attn\.hook_pattern")
_MLP = re.compile(r"blocks\.(\d+)\.mlp\.(hook_pre|hook_pre_linear|hook_post)")
_RESID = re.compile(r"blocks\.(\d+)\.hook_resid_(pre|post)")
_MLP_PARTS = {"hook_pre": "gate_proj", "hook_pre_linear": "up_proj", "hook_post": "down_proj"}


def plain_names(model, hook_names: Sequence[str]) -> list[str]:
    """Each name as the plain view serves it: a bridge's own name of a served hook point becomes the
    TransformerLens name above (``blocks.0.mlp.out.hook_in`` -> ``blocks.0.mlp.hook_post``); others unchanged.

    Example:
        >>> plain_names(model, ["blocks.0.mlp.out.hook_in", "blocks.0.attn.o.hook_in"])
        ['blocks.0.mlp.hook_post', 'blocks.0.attn.o.hook_in']
    """
    points = getattr(model, "hook_dict", {})
    served: dict[int, str] = {}
    for key, point in points.items():
        if supports([key]):
            served.setdefault(id(point), key)
    return [name if supports([name]) or name not in points else served.get(id(points[name]), name)
            for name in hook_names]


def supports(hook_names: Sequence[str]) -> bool:
    """Whether every hook name is one a plain view can serve (read or edit)."""
    return all(name == "hook_embed" or name in _FINAL or _PATTERN.fullmatch(name) or _MLP.fullmatch(name)
               or _RESID.fullmatch(name) for name in hook_names)


def editable(hook_names: Sequence[str]) -> bool:
    """Whether a plain view applies what hooks at every one of these names return, as the bridge does."""
    return all(name == "hook_embed" or _MLP.fullmatch(name) for name in hook_names)


def servable(model, view: nn.Module, hook_names: Sequence[str]) -> bool:
    """Whether ``view`` serves every hook name: supported, and a gated MLP where MLP hooks are named."""
    if not supports(hook_names):
        return False
    layers = {int(m.group(1)) for m in map(_MLP.fullmatch, hook_names) if m}
    if not layers:
        return True
    try:
        mlps = mlp_modules(model, view)
    except LensprobeError:
        return False
    return all(isinstance(getattr(mlps.get(layer), part, None), nn.Module)
               for layer in layers for part in _MLP_PARTS.values())


@contextlib.contextmanager
def attached(model, view: nn.Module, hooks: Sequence[tuple[str, Callable[[torch.Tensor, Any], Any]]]) -> Iterator[nn.Module]:
    """Attach hooks (TransformerLens names, a bridge's own names included, ``fn(activation, hook)``) to a plain
    view, in order.

    ``fn`` is called with ``hook=None``: pass functions bound by :func:`lensprobe.core.hooks.attach.bound_hooks`
    so that they receive a hook point and its step.

    Every hook is removed on exit, also after an exception or a KeyboardInterrupt.
    """
    hooks = list(zip(plain_names(model, [name for name, _ in hooks]), [fn for _, fn in hooks], strict=True))
    handles = []
    attention = attention_modules(model, view) if any(_PATTERN.fullmatch(n) for n, _ in hooks) else {}
    mlps = mlp_modules(model, view) if any(_MLP.fullmatch(n) for n, _ in hooks) else {}
    blocks = block_modules(model, view) if any(_RESID.fullmatch(n) for n, _ in hooks) else {}
    try:
        for name, fn in hooks:
            handles.append(_attach(view, attention, mlps, blocks, name, fn))
        yield view
    finally:
        for handle in handles:
            handle.remove()


def _attach(view: nn.Module, attention: dict[int, nn.Module], mlps: dict[int, nn.Module],
            blocks: dict[int, nn.Module], name: str, fn):
    if name == "hook_embed":
        embed = view.get_input_embeddings()  # type: ignore[operator]  # HF method; torch: Tensor | Module
        return embed.register_forward_hook(lambda _m, _args, out: fn(out, None))
    if name in _FINAL:
        def before_unembed(_m, args):
            fn(args[0], None)

        unembed = view.get_output_embeddings()  # type: ignore[operator]  # HF method; torch: Tensor | Module
        return unembed.register_forward_pre_hook(before_unembed)
    match = _RESID.fullmatch(name)
    if match:
        return _attach_resid(blocks[int(match.group(1))], match.group(2), fn)
    match = _MLP.fullmatch(name)
    if match:
        return _attach_mlp(mlps[int(match.group(1))], match.group(2), name, fn)
    match = _PATTERN.fullmatch(name)
    if match:
        def pattern(_m, _args, out):
            weights = out[1] if isinstance(out, tuple) and len(out) > 1 else None
            if not isinstance(weights, torch.Tensor) or weights.ndim != 4:
                raise LensprobeError(
                    f"{name}: the plain model's attention returned no attention weights; "
                    "run with engine='bridge'."
                )
            fn(weights, None)

        return attention[int(match.group(1))].register_forward_hook(pattern)
    raise LensprobeError(f"hook point {name!r} cannot be served by the plain model; run with engine='bridge'.")


def _attach_mlp(mlp: nn.Module, point: str, name: str, fn):
    part = getattr(mlp, _MLP_PARTS[point], None)
    if not isinstance(part, nn.Module):
        raise LensprobeError(
            f"{name}: the plain model's MLP has no {_MLP_PARTS[point]} (not a gated MLP); run with engine='bridge'."
        )
    if point == "hook_post":
        def before_down(_m, args):
            new = fn(args[0], None)
            return None if new is None else (new, *args[1:])

        return part.register_forward_pre_hook(before_down)
    return part.register_forward_hook(lambda _m, _args, out: fn(out, None))


def _attach_resid(block: nn.Module, point: str, fn):
    """A decoder layer's input (``pre``) or output (``post``) hidden states, read only."""
    if point == "pre":
        def before(_m, args, kwargs):
            fn(args[0] if args else kwargs["hidden_states"], None)

        return block.register_forward_pre_hook(before, with_kwargs=True)

    def after(_m, _args, out):
        fn(out[0] if isinstance(out, tuple) else out, None)

    return block.register_forward_hook(after)
