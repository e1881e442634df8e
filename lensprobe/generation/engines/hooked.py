"""The HookedTransformer engine: generation on a TransformerLens 3.x ``HookedTransformer``.

A ``HookedTransformer`` runs TransformerLens' own modules, so every hook point is there and
every intervention works; its KV cache is TransformerLens' own
(``TransformerLensKeyValueCache``, which TransformerLens 2.x called
``HookedTransformerKeyValueCache``). That cache also keeps the attention mask of every
position so far: each forward passes only the new positions' mask columns, and the model
appends them. Rotary positions are not passed: the model counts them from the whole mask
(position = attended tokens before it), which for lensprobe's left-padded batches equals
the loop's per-row positions. :meth:`HookedEngine.forward` checks that on every call, so a
mask the model would read differently is refused rather than silently run.
"""

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from lensprobe.core.errors import LensprobeError
from lensprobe.core.hooks.attach import Hook, Steps, intervene
from lensprobe.core.lazy import heavy

__all__ = ["HookedEngine", "mask_positions"]


def mask_positions(attention_mask: Int[Tensor, "batch key_pos"]) -> Int[Tensor, "batch key_pos"]:
    """The position of every column as a HookedTransformer computes it: attended tokens before it.

    Padding before a row's first token gets position 0, as in TransformerLens.

    Example:
        >>> mask_positions(torch.tensor([[0, 0, 1, 1, 1]]))
        tensor([[0, 0, 0, 1, 2]])
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


class HookedEngine:
    """Runs a generation's forwards on the ``HookedTransformer`` ``model`` with its own KV cache.

    Example:
        >>> engine = HookedEngine(model)
        >>> with engine.attach([("blocks.0.attn.hook_pattern", fn)], [], Steps()):
        ...     logits, cache = engine.forward(tokens, mask, positions, None)
        ...     logits, cache = engine.forward(next_tokens, longer_mask, next_positions, cache)
    """

    name = "hooked"

    def __init__(self, model) -> None:
        self.model = model

    @contextlib.contextmanager
    def attach(self, hooks: Sequence[Hook], interventions: Sequence, steps: Steps) -> Iterator[None]:
        # recorders first: a recorder reads an activation before an intervention edits it
        with intervene(self.model, *hooks, *interventions, steps=steps):
            yield

    def forward(self, tokens: Int[Tensor, "batch pos"], attention_mask: Int[Tensor, "batch key_pos"],
                position_ids: Int[Tensor, "batch pos"], past: Any) -> tuple[Float[Tensor, "batch 1 d_vocab"], Any]:
        """Run ``tokens`` after the cache ``past`` (``None`` for the prompt); returns the last logits and the cache.

        Raises:
            LensprobeError: ``attention_mask`` does not extend the mask the cache holds, or
                ``position_ids`` differ from the positions the model counts from the mask.
        """
        n = tokens.shape[1]
        if past is None:
            cache_class = heavy("transformer_lens.cache.key_value_cache").TransformerLensKeyValueCache
            past = cache_class.init_cache(self.model.cfg, tokens.device, tokens.shape[0])
        held = past.previous_attention_mask
        if attention_mask.shape[-1] != held.shape[-1] + n or not torch.equal(
                attention_mask[:, :-n].to(held.device, held.dtype), held):
            raise LensprobeError(
                f"the attention mask ({tuple(attention_mask.shape)}) must be the cache's mask "
                f"({tuple(held.shape)}) followed by one column per new token ({n}): pass the whole mask so far."
            )
        wanted = mask_positions(attention_mask)[:, -n:]
        real = attention_mask[:, -n:].bool()
        if not torch.equal(wanted[real], position_ids.to(wanted.device)[real]):
            raise LensprobeError(
                "a HookedTransformer counts each token's position from the attention mask (attended tokens "
                "before it), and these position ids differ: pass a mask with no gaps after each row's first "
                "token, or positions that count attended tokens."
            )
        logits = self.model(tokens, attention_mask=attention_mask[:, -n:], past_kv_cache=past, return_type="logits")
        return logits[:, -1:].to(tokens.device), past  # blocks across GPUs (n_devices) end on the last one

    def describe(self) -> dict[str, Any]:
        return {"engine": self.name, "attention": "eager", "decode_threads": torch.get_num_threads()}
