"""The plain engine: forwards through an unwrapped view of the bridge's Hugging Face model.

Same weights (the view shares the bridge's tensors, :mod:`~lensprobe.generation.engines.view`),
no hook points: faster per step, takes no interventions. Recorder hooks attach under
TransformerLens names (:mod:`~lensprobe.generation.engines.hooknames`), and small decode steps
run the decoder layers on one thread (:mod:`~lensprobe.generation.engines.threads`).
"""

import contextlib
import inspect
from collections.abc import Iterator, Sequence
from typing import Any

from torch import Tensor, nn

from lensprobe.core.errors import LensprobeError
from lensprobe.core.hooks import Hook
from lensprobe.generation.engines.attention import ATTENTIONS
from lensprobe.generation.engines.hooknames import attached
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
        # transformers 5.24 renamed the forward's past_key_values argument to cache
        self.cache_arg = "cache" if "cache" in inspect.signature(view.forward).parameters else "past_key_values"

    @contextlib.contextmanager
    def attach(self, hooks: Sequence[Hook], interventions: Sequence) -> Iterator[None]:
        if interventions:
            raise LensprobeError("the plain engine takes no interventions; run with engine='bridge'.")
        with attached(self.model, self.view, hooks), layer_threads(self.view, self.threads):
            yield

    def forward(self, tokens: Tensor, attention_mask: Tensor, position_ids: Tensor, past: Any) -> tuple[Tensor, Any]:
        out = self.view(input_ids=tokens, attention_mask=attention_mask, position_ids=position_ids,
                        use_cache=True, logits_to_keep=1, **{self.cache_arg: past})
        return out.logits, getattr(out, self.cache_arg)

    def describe(self) -> dict[str, Any]:
        implementation = self.view.config._attn_implementation
        names = {v: k for k, v in ATTENTIONS.items()}
        return {"engine": self.name, "attention": names.get(implementation, implementation),
                "decode_threads": self.threads}
