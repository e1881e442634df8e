"""TransformerLens hook names served by a plain view, so recorders attach to it unchanged.

``hook_embed`` (the input embedding's output; a returned tensor replaces it),
``blocks.{l}.attn.hook_pattern`` (the attention weights the view's attention returns;
read only) and ``ln_final.hook_out`` / ``ln_final.hook_normalized`` (the input of the
unembedding; read only). :func:`attached` attaches such hooks as torch hooks and removes
them on exit.
"""

import contextlib
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from lensprobe.core.errors import LensprobeError
from lensprobe.generation.engines.view import attention_modules

__all__ = ["PLAIN_HOOKS", "attached", "supports"]


PLAIN_HOOKS = ("hook_embed", "blocks.{layer}.attn.hook_pattern", "ln_final.hook_out", "ln_final.hook_normalized")
"""TransformerLens hook names a plain view can serve (to recorders: read only but ``hook_embed``)."""


_FIXED_HOOKS = ("hook_embed", "ln_final.hook_out", "ln_final.hook_normalized")


_PATTERN = re.compile(r"blocks\.(\d+)\.attn\.hook_pattern")


def supports(hook_names: Sequence[str]) -> bool:
    """Whether every hook name is one a plain view can serve."""
    return all(name in _FIXED_HOOKS or _PATTERN.fullmatch(name) for name in hook_names)


@contextlib.contextmanager
def attached(model, view: nn.Module, hooks: Sequence[tuple[str, Callable[[torch.Tensor, Any], Any]]]) -> Iterator[nn.Module]:
    """Attach recorder hooks (TransformerLens names, ``fn(activation, hook)``) to a plain view.

    Every hook is removed on exit, also after an exception or a KeyboardInterrupt.
    """
    handles = []
    attention = attention_modules(model, view) if any(_PATTERN.fullmatch(n) for n, _ in hooks) else {}
    try:
        for name, fn in hooks:
            handles.append(_attach(view, attention, name, fn))
        yield view
    finally:
        for handle in handles:
            handle.remove()


def _attach(view: nn.Module, attention: dict[int, nn.Module], name: str, fn):
    if name == "hook_embed":
        return view.get_input_embeddings().register_forward_hook(lambda _m, _args, out: fn(out, None))
    if name in ("ln_final.hook_out", "ln_final.hook_normalized"):
        def before_unembed(_m, args):
            fn(args[0], None)

        return view.get_output_embeddings().register_forward_pre_hook(before_unembed)
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
