"""The TransformerBridge engine: every forward through TransformerLens' hook points.

Interventions need it (they attach to hook points such as ``blocks.3.attn.hook_z``); it
computes eager attention, so ``hook_pattern`` sees the full weights.
"""

import contextlib
import weakref
from collections.abc import Iterator, Sequence
from importlib.metadata import version
from typing import Any

import torch
from torch import Tensor, nn

from lensprobe.core.errors import LensprobeError
from lensprobe.core.hooks.attach import Hook, Steps, intervene
from lensprobe.core.models.devices import model_device
from lensprobe.generation.engines.view import has_user_hooks

__all__ = ["BridgeEngine", "check_cached_steps", "nonfinite_weights_text"]

_CHECKED: "weakref.WeakKeyDictionary[nn.Module, bool]" = weakref.WeakKeyDictionary()


def check_cached_steps(model) -> None:
    """Refuse a model whose KV-cached decode step differs from a forward over the whole sequence.

    A TransformerBridge hands its cache to the Hugging Face modules it wraps; when the
    installed ``transformers`` names that argument differently than the bridge expects
    (``past_key_values`` became ``cache`` in transformers 5.24), each cached step silently
    attends to its own position only. Checked once per model on a 5-token probe.

    Raises:
        LensprobeError: the cached step's logits differ, naming both library versions.
    """
    if _CHECKED.get(model) or has_user_hooks(model):  # the user's hooks could change the probe
        return
    vocab = int(model.cfg.d_vocab)
    device = model_device(model)
    probe = torch.tensor([[1, 2, 3, 5, 8]], device=device) % vocab
    with torch.inference_mode():
        full = model(probe, return_type="logits")[:, -1].float()
        _, cache = model(probe[:, :4], return_type="logits_and_cache")
        step = model(probe[:, 4:], past_key_values=cache, return_type="logits_and_cache")[0][:, -1].float()
    if not (torch.isfinite(full).all() and torch.isfinite(step).all()):
        raise LensprobeError(nonfinite_weights_text(model))
    if not (step - full).abs().max() <= 1e-3 * full.abs().max().clamp(min=1.0):
        raise LensprobeError(
            f"this TransformerLens ({version('transformer-lens')}) and transformers "
            f"({version('transformers')}) compute wrong KV-cached steps (a cached step differs "
            "from a full forward): install transformers<5.24 (pip install 'transformers<5.24')."
        )
    _CHECKED[model] = True


def nonfinite_weights_text(model) -> str:
    """Why a model without hooks computes NaN or inf logits: its weights that are not finite, by name."""
    bad = [name.replace("._original_component", "") for name, p in model.named_parameters()
           if not torch.isfinite(p).all()]
    where = (f"its weights hold NaN or inf values ({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''})" if bad
             else "every weight is finite, so a layer overflows")
    return (f"the model computes NaN or inf logits on a 5-token probe, before any generation: {where}. Check the "
            "model file (load it again, or try --dtype fp32).")


class BridgeEngine:
    """Runs a generation's forwards on the TransformerBridge ``model`` itself.

    Example:
        >>> engine = BridgeEngine(model)
        >>> with engine.attach([("blocks.0.attn.hook_pattern", fn)], [], Steps()):
        ...     logits, cache = engine.forward(tokens, mask, positions, None)
    """

    name = "bridge"

    def __init__(self, model) -> None:
        check_cached_steps(model)
        self.model = model

    @contextlib.contextmanager
    def attach(self, hooks: Sequence[Hook], interventions: Sequence, steps: Steps) -> Iterator[None]:
        # recorders first: a recorder reads an activation before an intervention edits it
        with intervene(self.model, *hooks, *interventions, steps=steps):
            yield

    def forward(self, tokens: Tensor, attention_mask: Tensor, position_ids: Tensor, past: Any) -> tuple[Tensor, Any]:
        extra = {"logits_to_keep": 1} if past is None else {"past_key_values": past}
        logits, cache = self.model(tokens, attention_mask=attention_mask, position_ids=position_ids,
                                   return_type="logits_and_cache", **extra)
        return logits.to(tokens.device), cache  # a model across GPUs (device_map) ends on its last one

    def describe(self) -> dict[str, Any]:
        return {"engine": self.name, "attention": "eager", "decode_threads": torch.get_num_threads()}
