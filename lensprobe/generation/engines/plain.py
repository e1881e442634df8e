"""The plain engine: forwards through an unwrapped view of the bridge's Hugging Face model.

Same weights (the view shares the bridge's tensors, :mod:`~lensprobe.generation.engines.view`),
no hook points: faster per step. It takes interventions whose hooks edit only ``hook_embed``
or a gated MLP's activations (such as ARM). Hooks attach under TransformerLens names (:mod:`~lensprobe.generation.engines.hooknames`), and small decode steps
run the decoder layers on one thread (:mod:`~lensprobe.generation.engines.threads`). An
intervention that names a ``rounding_sensitive_layer`` (ARM) gets decode steps computed row
by row up to that layer (:mod:`~lensprobe.generation.engines.rowwise`): each row's numbers
then equal the row alone's, bit for bit.
"""

import contextlib
import inspect
from collections.abc import Iterator, Sequence
from typing import Any

from torch import Tensor, nn

from lensprobe.core.errors import LensprobeError
from lensprobe.core.hooks.attach import Hook, Steps, bound_hooks, resolve_hooks, rounding_sensitive_layer
from lensprobe.generation.engines.attention import ATTENTIONS
from lensprobe.generation.engines.hooknames import attached, editable, plain_names
from lensprobe.generation.engines.rowwise import rows_alone
from lensprobe.generation.engines.threads import decode_threads, layer_threads

__all__ = ["PlainEngine"]


class PlainEngine:
    """Runs a generation's forwards on ``view``, a plain model sharing ``model``'s weights.

    Args:
        model: the TransformerBridge the view was built from (its hook names map onto the view).
        view: from :func:`lensprobe.generation.engines.view.plain_model`.
        rows: sequences per step (decides the decode-step thread count).
    """

    name = "hf"

    def __init__(self, model, view: nn.Module, rows: int) -> None:
        self.model = model
        self.view = view
        self.threads = decode_threads(view, rows)
        self.rows_alone: int | None = None  # decode steps compute layers 0..this one row by row
        # transformers 5.24 renamed the forward's past_key_values argument to cache
        self.cache_arg = "cache" if "cache" in inspect.signature(view.forward).parameters else "past_key_values"

    @contextlib.contextmanager
    def attach(self, hooks: Sequence[Hook], interventions: Sequence, steps: Steps) -> Iterator[None]:
        edits = resolve_hooks(self.model, interventions)
        if not editable(plain_names(self.model, [name for name, _ in edits])):
            raise LensprobeError(
                "the plain engine applies interventions only at hook_embed and a gated MLP's hook_pre, "
                "hook_pre_linear and hook_post; run with engine='bridge'."
            )
        self.rows_alone = rounding_sensitive_layer(interventions)
        # recorders first: a recorder reads an activation before an intervention edits it
        with (attached(self.model, self.view, bound_hooks(self.model, [*hooks, *edits], steps, fired=False)), layer_threads(self.view, self.threads),
              rows_alone(self.model, self.view, self.rows_alone)):
            yield

    def forward(self, tokens: Tensor, attention_mask: Tensor, position_ids: Tensor, past: Any) -> tuple[Tensor, Any]:
        out = self.view(input_ids=tokens, attention_mask=attention_mask, position_ids=position_ids,
                        use_cache=True, logits_to_keep=1, **{self.cache_arg: past})
        return out.logits, getattr(out, self.cache_arg)

    def describe(self) -> dict[str, Any]:
        hf_config: Any = self.view.config  # an HF config (torch types module attributes Tensor | Module)
        implementation = hf_config._attn_implementation
        names = {v: k for k, v in ATTENTIONS.items()}
        return {"engine": self.name, "attention": names.get(implementation, implementation),
                "decode_threads": self.threads, "rows_alone_through_layer": self.rows_alone}
